"""Launching the user's command with the bootstrap injected (shared by profile and run).

The command after `--` runs untouched (python, torchrun, accelerate launch, a shell
wrapper); a bare `train.py` gets the current interpreter in front. TERAIO_* settings and a
PYTHONPATH entry reach every process it starts, torchrun's workers included.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from teraio.errors import CommandNotFound, UsageError
from teraio.settings import Settings
from teraio.swap_dirs import swap_bases, sweep_after_job
from teraio.units import SIZE_WITH_A_SPACE, is_size_unit

# The app's sitecustomize, found by path: the launcher (used by the profile and run stages)
# names the folder but never imports the app (Layers in docs/runtime.md).
BOOTSTRAP_DIR = Path(__file__).parent / "app" / "bootstrap" / "pythonpath"


def resolve_command(argv: list[str]) -> list[str]:
    """The command to run; checks a script path before anything starts."""
    if not argv:
        raise UsageError("no command given: write e.g. `teraio profile train.py` or `-- torchrun ... train.py`")
    first = argv[0]
    if first.endswith(".py") or Path(first).is_file() and not os.access(first, os.X_OK):
        script = Path(first)
        if not script.is_file():
            raise UsageError(f"script {first} does not exist: check the path")
        if script.suffix != ".py":
            raise UsageError(f"{first} is not a Python script: give a .py file or a command after --")
        return [sys.executable, *argv]
    if shutil.which(first) is None and is_size_unit(first):   # `--gpu-mem 24 MiB`: our option, mistyped
        raise UsageError(f"command {first!r} not found ({SIZE_WITH_A_SPACE.format(unit=first)})")
    if shutil.which(first) is None:
        raise CommandNotFound(f"command {first!r} not found: check the spelling or give a script path")
    return list(argv)


def child_env(settings: Settings, defaults: dict[str, str] | None = None) -> dict[str, str]:
    """The job's environment: ours, `defaults` where the user set nothing, TERAIO_* settings."""
    env = dict(defaults or {})
    env.update(os.environ)
    env.update(settings.to_env())
    extra = [str(BOOTSTRAP_DIR)]
    package_root = Path(__file__).resolve().parent.parent
    if package_root.name != "site-packages":
        extra.append(str(package_root))  # a source checkout: make teraio importable in the job
    env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


# Note [The job's own session]
# `teraio run` and `teraio profile` stand between a supervisor and the job: docker stop, slurm
# and systemd send SIGTERM to the launcher's pid, an ssh hangup sends SIGHUP, Ctrl-C sends
# SIGINT to the terminal's foreground process group. The job is started in a session (and so
# a process group) of its own. SIGINT and SIGHUP reaching the launcher are passed on to that
# whole group (torchrun and its workers, a shell wrapper and its python), as a terminal sends
# them to its foreground group; SIGTERM to the job's first process only, as `kill PID`, docker
# stop and Kubernetes send it: a job's DataLoader workers killed by a SIGTERM their plain run
# never sees made it fail ("DataLoader worker is killed by signal") where it stopped
# gracefully plainly (PyTorch Lightning), and torchrun passes it on to its workers itself.
# What the first process leaves behind when it ends (the python of a `sh -c` wrapper, which a
# shell does not pass SIGTERM on to) gets it then, and the launcher waits for them a while:
# nothing of the job outlives it untold.
# - One copy per signal. Sharing our group, a Ctrl-C would reach the job from the terminal and
#   again from us, and a second KeyboardInterrupt can cut the job's exit handlers short (no
#   report, swap files left). Apart, the terminal's copy reaches us only, we forward it once.
# - Signalling the job's group never signals ours: under pytest, a supervisor or `sh -c`,
#   our group holds the parent too.
# - A session rather than only a process group: a background group that reads the terminal
#   (input(), a pdb breakpoint) is stopped by SIGTTIN and the job would hang unseen; the
#   terminal is not the controlling one of another session, so such reads just work.
# - Ctrl-Z (SIGTSTP) stops the launcher only; the job trains on.
# A signal the launcher ignores (nohup ignores SIGHUP) is not forwarded, and the job keeps
# ignoring it as well (an ignored disposition survives exec).
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STRAGGLERS_WAIT_S = 60.0


@dataclass
class JobExit:
    status: int                  # as a shell reports it: 128 + N when signal N ended the job
    forwarded: int | None = None  # the last signal passed on to the job, if any


# Under a cap, tensors leave and come back all the time, in sizes that fragment a segmented
# pool, and the cap counts reserved memory: growable segments keep reserved close to allocated
# (without them a capped profile of a 0.5 GB model on the H200 failed with 137 MiB reserved
# but unallocated beside a 64 MiB request, out-of-memory relief and all). The user's own
# setting wins.
CAPPED_JOB_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def run_command(command: list[str], settings: Settings, defaults: dict[str, str] | None = None) -> JobExit:
    """Run to completion, forwarding stop signals to the job's process group (Note [The job's
    own session]); returns how the job ended."""
    forwarder = _SignalForwarder()
    with forwarder.installed():
        proc = _start(command, child_env(settings, defaults))
        forwarder.attach(proc)
        returncode = proc.wait()
        forwarder.stop_stragglers()
    if settings.mode == "run" or settings.gpu_mem_bytes:  # the job may have made swap folders
        sweep_after_job(swap_bases(settings.ssd_dirs))   # teraio/swap_dirs.py
    return JobExit(shell_status(returncode), forwarder.forwarded)


def _start(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """The job in a session of its own; one that cannot be executed (a script whose #! names no
    interpreter, more arguments than the system takes) is one line, as a shell says it."""
    try:
        return subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as err:
        raise UsageError(f"cannot start {command[0]}: {err.strerror}; check the command (a script's "
                         "#! line, the number of arguments)") from None


def shell_status(returncode: int) -> int:
    """Popen's -N for a job killed by signal N becomes 128 + N (sys.exit(-9) would exit 247)."""
    return 128 - returncode if returncode < 0 else returncode


class _SignalForwarder:
    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.forwarded: int | None = None
        self._pending: list[int] = []

    @contextmanager
    def installed(self):
        previous = {sig: signal.getsignal(sig) for sig in FORWARDED_SIGNALS}
        for sig, handler in previous.items():
            if handler != signal.SIG_IGN:
                signal.signal(sig, self._on_signal)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def attach(self, proc: subprocess.Popen) -> None:
        """A signal that came while the job was being started is passed on now."""
        self.proc = proc
        for signum in self._pending:
            self._forward(signum)

    def _on_signal(self, signum, frame) -> None:
        if self.proc is None:
            self._pending.append(signum)
        else:
            self._forward(signum)

    def stop_stragglers(self) -> None:
        """After a SIGTERM, what the job's first process left behind gets it too (Note [The
        job's own session]); waited for up to STRAGGLERS_WAIT_S."""
        if self.forwarded != signal.SIGTERM:
            return
        deadline = time.monotonic() + STRAGGLERS_WAIT_S
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            while time.monotonic() < deadline:
                time.sleep(0.05)
                os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            pass  # none left

    def _forward(self, signum: int) -> None:
        self.forwarded = signum
        if self.proc.returncode is not None:
            return  # reaped: its pid (the group's id) may belong to someone else by now
        try:
            if signum == signal.SIGTERM:
                os.kill(self.proc.pid, signum)
            else:
                os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass  # the whole group has exited already


def mem_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None: nothing to check against."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024  # the kernel writes kB (KiB)
    return None
