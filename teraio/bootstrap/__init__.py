"""Starts the agent for TERAIO_MODE in this process (called once torch is imported)."""

import os
import sys
from pathlib import Path

from teraio.settings import Settings

LAUNCHER_MODULES = ("torch/distributed/run.py", "torch/distributed/launch.py")


def is_launcher_process() -> bool:
    """torchrun's own process imports torch too, but trains nothing: leave it alone."""
    launcher = Path(sys.argv[0]).name == "torchrun" or sys.argv[0].endswith(LAUNCHER_MODULES)
    return launcher and "LOCAL_RANK" not in os.environ


def start():
    settings = Settings.from_env()
    if is_launcher_process():
        return None
    if settings.mode == "profile":
        from teraio_profile.agent import start as start_profile
        return start_profile(settings)
    if settings.mode == "run":
        from teraio_run.agent import start as start_run
        return start_run(settings)
    return None
