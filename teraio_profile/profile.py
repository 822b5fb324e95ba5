"""`teraio profile`: run the command with the profiler injected and collect the traces."""

import json
import os
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from teraio.errors import JobStopped, ScriptError, UsageError
from teraio.formats.common import refuse_overwriting_input
from teraio.launch import CAPPED_JOB_ENV, mem_available_bytes, resolve_command, run_command
from teraio.settings import Settings
from teraio.units import format_bytes


@dataclass
class Cap:
    """Profile under a device memory cap (Note [Profiling under a cap] in teraio_run/capped_profile.py):
    evicted tensors go to a host pool of host_mem_bytes per process (None: decided in the job,
    teraio_run/capped_profile.py default_pool_bytes), then to swap files in ssd_dirs (none: the
    temp folder)."""

    gpu_mem_bytes: int = 0               # 0: no cap, the job runs as it is
    host_mem_bytes: int | None = None
    ssd_dirs: list[str] = field(default_factory=list)
    io_backend: str = "auto"
    clean_copies: bool = True            # evictions release unwritten storages without copying (run's Note [Clean copies])


def profile(argv: list[str], trace_out: str | Path, warmup: int, iterations: int,
            run_to_completion: bool = False, device: str = "auto", steps_per_iteration: int = 0,
            step_timeout_s: int = 300, cap: Cap | None = None) -> list[Path]:
    """Profile the job; returns the trace paths written (one per rank). steps_per_iteration
    0 finds the cycle of optimizer steps; step_timeout_s 0 waits for the first step forever."""
    cap = _checked_cap(cap or Cap())
    if warmup < 0 or iterations < 1:
        raise UsageError("--warmup must be 0 or more and --iterations at least 1")
    if steps_per_iteration < 0 or step_timeout_s < 0:
        raise UsageError("--steps-per-iteration and --step-timeout must be 0 or more (0: find the cycle; no limit)")
    command = resolve_command(argv)
    trace_out = Path(trace_out).resolve()
    refuse_overwriting_input(trace_out, argv, "-o")  # the script, or a file its arguments name
    _check_writable(trace_out)
    with tempfile.TemporaryDirectory(prefix="teraio-profile-") as status_dir:
        settings = Settings(mode="profile", device=device, command=list(argv), status_dir=status_dir,
                            trace_out=str(trace_out), warmup=warmup, iterations=iterations,
                            run_to_completion=run_to_completion, steps_per_iteration=steps_per_iteration,
                            step_timeout_s=step_timeout_s, gpu_mem_bytes=cap.gpu_mem_bytes,
                            host_mem_bytes=cap.host_mem_bytes or 0, io_backend=cap.io_backend,
                            ssd_dirs=[str(Path(d).resolve()) for d in cap.ssd_dirs], clean_copies=cap.clean_copies)
        job = run_command(command, settings, CAPPED_JOB_ENV if cap.gpu_mem_bytes else None)
        statuses = _read_statuses(Path(status_dir))
    if job.forwarded is not None and job.status != 0:
        written = "" if any(s.get("trace") for s in statuses) else "; no trace was written"
        raise JobStopped(f"stopped by {signal.Signals(job.forwarded).name}: the job exited with {job.status}{written}",
                         job.status)
    return _traces_or_error(argv, job.status, statuses, warmup + iterations)


def _checked_cap(cap: Cap) -> Cap:
    """The cap with its host pool decided, or a usage error before anything starts."""
    if not cap.gpu_mem_bytes:
        if cap.host_mem_bytes or cap.ssd_dirs:
            raise UsageError("--host-mem and --ssd-dir only apply to a profile under a cap: give --gpu-mem too")
        return cap
    available_bytes = mem_available_bytes()
    host_mem_bytes = cap.host_mem_bytes
    if host_mem_bytes is not None and available_bytes is not None and host_mem_bytes > available_bytes:
        raise UsageError(f"--host-mem {format_bytes(host_mem_bytes)} is more than the {format_bytes(available_bytes)} "
                         "of memory this machine has available: give a smaller --host-mem")
    for ssd_dir in cap.ssd_dirs:
        path = Path(ssd_dir)
        if path.exists() and not path.is_dir():
            raise UsageError(f"--ssd-dir {ssd_dir} is a file: give a folder on the SSD")
    return cap


def _check_writable(path: Path) -> None:
    if path.is_dir():
        raise UsageError(f"-o {path} is a folder: give a file name, e.g. {path / 'trace.msgpack'}")
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: folder {path.parent} does not exist; create it or change -o")
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"cannot write {path}: folder {path.parent} is not writable; change -o")


def _ranks_without_trace(statuses: list[dict]) -> list[int]:
    """The ranks of the job (by the world size its processes saw) that wrote no trace: a rank that
    died before it told anything leaves no status at all."""
    world_size = max((s.get("world_size", 1) for s in statuses), default=1)
    traced = {s["rank"] for s in statuses if s.get("trace")}
    return [rank for rank in range(world_size) if rank not in traced]


def _read_statuses(status_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(status_dir.glob("status.*.json"))]


def _traces_or_error(argv, returncode: int, statuses: list[dict], needed: int) -> list[Path]:
    traces = sorted(Path(s["trace"]) for s in statuses if s.get("trace"))
    if traces and returncode == 0:
        return traces
    errors = [s["error"] for s in statuses if s.get("error")]
    if errors:  # the job's agent stopped it and said why (Note [No step] in teraio_profile/agent.py)
        raise ScriptError(errors[0])
    script = Path(argv[0]).name
    missing = _ranks_without_trace(statuses)
    if traces and missing:
        raise ScriptError(f"{script} exited with code {returncode}, and rank(s) {', '.join(map(str, missing))} of "
                          f"{statuses[0].get('world_size', len(statuses))} wrote no trace: fix the error shown "
                          "above and profile again")
    if traces:
        # every process that trained wrote its trace and ended there; the one that started them
        # went on and failed (torch.multiprocessing.spawn's caller reading what its ranks write)
        raise ScriptError(f"{script} exited with code {returncode} after its training processes had written "
                          f"their traces ({', '.join(p.name for p in traces)}) and ended, as a profile ends them: "
                          "a script that goes on once they return profiles with --run-to-completion")
    if returncode != 0:
        raise ScriptError(f"{script} exited with code {returncode} before the profile was complete; "
                          "fix the error shown above and profile again")
    steps = max((s.get("steps", s["iterations"]) for s in statuses), default=0)
    iterations = max((s["iterations"] for s in statuses), default=0)
    needed = max([s["needed"] for s in statuses if s.get("needed")] + [needed])
    if steps == 0:
        raise ScriptError(f"{script} finished without a step of a torch.optim optimizer, which marks its "
                          "iterations: a script that trains with an optimizer of its own (fastai's, a hand-written "
                          "update) calls teraio.walk.teraio_step() where it steps; otherwise profile a script that trains")
    per_iteration = max((s.get("steps_per_iteration", 1) for s in statuses), default=1)
    cycle = (f" (its ops repeat every {per_iteration} optimizer steps, so an iteration is {per_iteration} steps: "
             f"it ran {steps} steps; --steps-per-iteration 1 profiles each step on its own)") if per_iteration > 1 else ""
    hint = next((s["hint"] for s in statuses if s.get("hint")), "")  # optimizers stepped inside backward
    if iterations >= needed:  # enough of them, but the last ones never ran the same ops twice in a row
        raise ScriptError(f"{script} finished after {iterations} iteration(s){cycle}, but no two in a row after "
                          f"the warm-up ran the same ops, which the profile waits for (its ops change from one "
                          f"iteration to the next: train for more steps, or profile with --warmup past the "
                          f"changes){hint}")
    raise ScriptError(f"{script} finished after {iterations} iteration(s){cycle}, but the profile needs at least "
                      f"{needed} (warm-up + profiled, plus the iterations until two in a row run the same ops): "
                      f"train for more steps or lower --warmup/--iterations{hint}")
