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
from pathlib import Path

from teraio.errors import UsageError
from teraio.settings import Settings

BOOTSTRAP_DIR = Path(__file__).parent / "bootstrap" / "pythonpath"


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
    if shutil.which(first) is None:
        raise UsageError(f"command {first!r} not found: check the spelling or give a script path")
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


def run_command(command: list[str], settings: Settings, defaults: dict[str, str] | None = None) -> int:
    """Run to completion; Ctrl-C reaches the job first, which then decides how to end."""
    proc = subprocess.Popen(command, env=child_env(settings, defaults))
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
