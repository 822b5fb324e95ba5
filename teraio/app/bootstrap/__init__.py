"""Starts the agent for TERAIO_MODE in the processes that train (called once torch is imported).

Note [Lazy start]
`import torch` is no sign of training: torchrun's, accelerate's and deepspeed's launchers
import it too, and an agent there allocated its own host pool (on CUDA it would pin it twice)
and, with per-rank plans under --strict, stopped the job before it trained. So once torch is
imported the bootstrap only arms a start (`arm`): StartOnFirstOp, a small TorchDispatchMode,
waits for the first ATen op that touches the plan's device and starts the agent right before
that op, which the walk then sees as its first. In a CUDA job nothing on the device ran
earlier, so the walk misses nothing; on CPU (CI) the first op is usually a parameter's
initialisation. Launchers run few ops, but some on the CPU, so they are also refused by
name (`is_launcher_process`), and DataLoader workers by their worker info.

Note [Imports out of the collector]
Once torch is imported, before the job has made anything, the bootstrap moves every object
that exists to the collector's permanent generation (gc.freeze): modules, functions and
classes, which are never garbage, so full collections stop walking them. The job's own
objects are collected as usual; what the imports left as garbage in cycles is never freed (a
little host memory). `python bench/gc_cost.py` (the 12-layer CPU example, 8 steps, planned at
half its peak): collection time over the run 1,243 ms (982 of it full collections) without,
682 ms (398) with; the plain job 887-1,122 ms, nearly all before its first step. In the
steps, a full collection comes every several iterations either way (the walk's records, two
small objects per storage an iteration makes, outlive the young generations): 127-175 ms
each with the freeze, 317 ms without, in runs of the same job.

Modes nest: a mode's __torch_dispatch__ runs with that mode popped, and it is pushed back on
top when the handler returns, so the walk that the agent pushes from inside the trigger ends
up below it. The trigger then only forwards (one Python call per op) until the next module
call or optimizer step, whose global pre-hooks take it off the stack and remove themselves:
from the first forward on the walk is alone. Modules already running when the agent started
are replayed into the walk, so it finds its root and scopes as if it had been there first.
"""

import dataclasses
import gc
import os
import sys
import threading
from pathlib import Path

from teraio.errors import TeraioError, stop_job
from teraio.settings import Settings

# What sys.argv[0] is in a launcher: its console script, or the module run with `python -m`.
LAUNCHER_PROGRAMS = ("torchrun", "accelerate", "accelerate-launch", "deepspeed", "ds")
LAUNCHER_MODULES = ("torch/distributed/run.py", "torch/distributed/launch.py",
                    "accelerate/commands/launch.py", "accelerate/commands/accelerate_cli.py",
                    "deepspeed/launcher/runner.py", "deepspeed/launcher/launch.py")


def is_launcher_process(argv0: str | None = None) -> bool:
    """torchrun, accelerate and deepspeed import torch in their own process but train in the
    processes they start (accelerate even runs torchrun's launcher inside its own)."""
    argv0 = (sys.argv[0] if argv0 is None else argv0).replace(os.sep, "/")
    return Path(argv0).name in LAUNCHER_PROGRAMS or argv0.endswith(LAUNCHER_MODULES)


def is_dataloader_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def use_job_gpu(settings: Settings, first_op_gpu: int | None) -> None:
    """torchrun starts every worker on cuda:0 and a DDP script moves to cuda:LOCAL_RANK only
    once it runs, after the agent has capped the current device's memory and made its copy
    streams there. Rank 1 then had no cap on its own GPU and its copies ran on its compute
    stream, timed by events on GPU 0. Move first; the script's own set_device is a no-op.
    Without LOCAL_RANK (torch.multiprocessing.spawn's ranks, which the DDP tutorial moves with
    `.to(rank)` and never makes current) the GPU is the one the job's first op on a GPU used:
    with cuda:0 current, the agent capped cuda:0 and ordered its copies after cuda:0's work
    while the job computed on cuda:1, so a copy could read a tensor still being written. That
    GPU is made current, as set_device(rank) would, and said once."""
    if settings.device_type() != "cuda":
        return
    import torch

    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None:
        if 0 < int(local_rank) < torch.cuda.device_count():  # one visible GPU per rank: nothing to pick
            torch.cuda.set_device(int(local_rank))
        return
    if first_op_gpu is not None and first_op_gpu != torch.cuda.current_device():
        print(f"teraio: rank {settings.rank} computes on cuda:{first_op_gpu} with cuda:{torch.cuda.current_device()} "
              f"current (no LOCAL_RANK, no torch.cuda.set_device): teraio makes cuda:{first_op_gpu} current, "
              "where it caps memory and orders its copies", file=sys.stderr)
        torch.cuda.set_device(first_op_gpu)


def with_job_rank(settings: Settings) -> Settings:
    """Note [Ranks without torchrun]
    torch.multiprocessing.spawn starts a DDP job's ranks itself (the PyTorch tutorial's way)
    and the script hands each its rank: no RANK in the environment when torch was imported
    (the settings were read then), so every rank took itself for rank 0 of 1, the two wrote
    one trace file and one report over each other and both followed rank 0's plan. At the
    job's first op the environment is read again (a worker may set RANK itself), and where it
    still says nothing, an initialized process group's rank and size are the process's (the
    tutorial's workers init it before making their model). A spawned worker that makes
    tensors before init_process_group sets RANK and WORLD_SIZE first."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():   # what the job itself says, when it says it
        return dataclasses.replace(settings, rank=dist.get_rank(), world_size=dist.get_world_size())
    if "RANK" in os.environ:
        return dataclasses.replace(settings, rank=int(os.environ["RANK"]),
                                   world_size=int(os.environ.get("WORLD_SIZE", settings.world_size)))
    return settings


def start(settings: Settings, first_op_gpu: int | None = None):
    """Start the agent for settings.mode now; returns it (None when it stays out of the way).
    first_op_gpu: the index of the GPU the job's first op there used (None: not given)."""
    settings = with_job_rank(settings)
    use_job_gpu(settings, first_op_gpu)
    if settings.mode == "profile":
        from teraio_profile.agent import start as start_profile
        make_keeper = None
        if settings.gpu_mem_bytes:  # the bootstrap joins the two stages (Note [Profiling under a cap])
            from teraio_run.capped_profile import start_capped as make_keeper
        return start_profile(settings, make_keeper)
    if settings.mode == "run":
        from teraio_run.start import start as start_run
        return start_run(settings)
    return None


def start_guarded(settings: Settings, first_op_gpu: int | None = None):
    """The job must train even if the agent cannot start, unless --strict."""
    try:
        return start(settings, first_op_gpu)
    except SystemExit:
        raise
    except TeraioError as err:
        if settings.strict:  # one line, not the job's stack from its first tensor op
            stop_job(err)
        print(f"teraio: the agent could not start: {err}; training continues without it", file=sys.stderr)
        return None
    except BaseException as err:
        if settings.strict:
            # Said here because the error surfaces from the job's first tensor op, which a
            # script may catch, and a later op then fails with an unrelated message.
            print(f"teraio: the agent could not start ({type(err).__name__}: {err}); "
                  "stopping the job (--strict)", file=sys.stderr)
            raise
        print(f"teraio: the agent could not start ({type(err).__name__}: {err}); "
              "training continues without it", file=sys.stderr)
        return None


def arm() -> None:
    """Called once torch is imported: arm the start on the first op (Note [Lazy start])."""
    settings = Settings.from_env()
    if settings.mode not in ("profile", "run") or is_launcher_process():
        return
    from teraio import compile_guard
    from teraio.app.bootstrap.trigger import StartOnFirstOp

    compile_guard.install(settings.strict)
    from teraio.walk import hide_rebuilds

    hide_rebuilds()   # Note [Tensors from other processes] in teraio/walk.py
    StartOnFirstOp(settings, threading.get_ident()).push()
    gc.freeze()  # Note [Imports out of the collector]
