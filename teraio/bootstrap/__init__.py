"""Starts the agent for TERAIO_MODE in this process (called once torch is imported)."""

import os

from teraio.settings import Settings


def is_launcher_process() -> bool:
    """torchrun's own process imports torch too, but trains nothing: leave it alone."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" not in os.environ


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
