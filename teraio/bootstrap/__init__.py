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


def use_local_rank_gpu(settings: Settings) -> None:
    """torchrun starts every worker on cuda:0 and a DDP script moves to cuda:LOCAL_RANK only
    once it runs, after the agent has capped the current device's memory and made its copy
    streams there. Rank 1 then had no cap on its own GPU and its copies ran on its compute
    stream, timed by events on GPU 0. Move first; the script's own set_device is a no-op."""
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None or settings.device_type() != "cuda":
        return
    import torch

    if 0 < int(local_rank) < torch.cuda.device_count():  # one visible GPU per rank: nothing to pick
        torch.cuda.set_device(int(local_rank))


def start():
    settings = Settings.from_env()
    if is_launcher_process():
        return None
    use_local_rank_gpu(settings)
    if settings.mode == "profile":
        from teraio_profile.agent import start as start_profile
        return start_profile(settings)
    if settings.mode == "run":
        from teraio_run.agent import start as start_run
        return start_run(settings)
    return None
