"""`teraio profile`: run the command with the profiler injected and collect the traces."""

import json
import os
import signal
import tempfile
from pathlib import Path

from teraio.errors import JobStopped, ScriptError, UsageError
from teraio.launch import resolve_command, run_command
from teraio.settings import Settings


def profile(argv: list[str], trace_out: str | Path, warmup: int, iterations: int,
            run_to_completion: bool = False, device: str = "auto", steps_per_iteration: int = 0,
            step_timeout_s: int = 300) -> list[Path]:
    """Profile the job; returns the trace paths written (one per rank). steps_per_iteration
    0 finds the cycle of optimizer steps; step_timeout_s 0 waits for the first step forever."""
    if warmup < 0 or iterations < 1:
        raise UsageError("--warmup must be 0 or more and --iterations at least 1")
    if steps_per_iteration < 0 or step_timeout_s < 0:
        raise UsageError("--steps-per-iteration and --step-timeout must be 0 or more (0: find the cycle; no limit)")
    command = resolve_command(argv)
    trace_out = Path(trace_out).resolve()
    _check_writable(trace_out)
    with tempfile.TemporaryDirectory(prefix="teraio-profile-") as status_dir:
        settings = Settings(mode="profile", device=device, command=list(argv), status_dir=status_dir,
                            trace_out=str(trace_out), warmup=warmup, iterations=iterations,
                            run_to_completion=run_to_completion, steps_per_iteration=steps_per_iteration,
                            step_timeout_s=step_timeout_s)
        job = run_command(command, settings)
        statuses = _read_statuses(Path(status_dir))
    if job.forwarded is not None and job.status != 0:
        written = "" if any(s.get("trace") for s in statuses) else "; no trace was written"
        raise JobStopped(f"stopped by {signal.Signals(job.forwarded).name}: the job exited with {job.status}{written}",
                         job.status)
    return _traces_or_error(argv, job.status, statuses, warmup + iterations)


def _check_writable(path: Path) -> None:
    if path.is_dir():
        raise UsageError(f"-o {path} is a folder: give a file name, e.g. {path / 'trace.msgpack'}")
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: folder {path.parent} does not exist; create it or change -o")
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"cannot write {path}: folder {path.parent} is not writable; change -o")


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
    if returncode != 0:
        raise ScriptError(f"{script} exited with code {returncode} before the profile was complete; "
                          "fix the error shown above and profile again")
    steps = max((s.get("steps", s["iterations"]) for s in statuses), default=0)
    iterations = max((s["iterations"] for s in statuses), default=0)
    needed = max([s["needed"] for s in statuses if s.get("needed")] + [needed])
    if steps == 0:
        raise ScriptError(f"{script} finished without an optimizer step: profile a script that trains, "
                          "or mark each iteration with teraio.walk.teraio_step()")
    raise ScriptError(f"{script} finished after {iterations} iteration(s), but the profile needs at least {needed} "
                      "(warm-up + profiled, plus the iterations until two in a row run the same ops): "
                      "train for more steps or lower --warmup/--iterations")
