"""The swap folders on disk: each job's process makes `teraio-PID-rRANK` in every --ssd-dir (the
runtime: teraio_run/tiers.py make_run_dirs) and removes it at exit; what a job killed past its
exit handlers left (SIGKILL, the OOM killer) is removed by the launcher when the job ends, for
`teraio run` and a profile under a cap alike, and by the next run on the folder. No torch here:
the launchers must not import it."""

import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_SWAP_DIR = Path(tempfile.gettempdir()) / "teraio-swap"   # when no --ssd-dir is given


def run_dir(base: Path, rank: int) -> Path:
    """This process's swap folder in `base`."""
    return base / f"teraio-{os.getpid()}-r{rank}"


def remove_dead_run_dirs(bases: list[str | Path]) -> None:
    """Remove the swap folders of processes no longer alive (another job on the same folder keeps its own)."""
    for base in map(Path, bases):
        for old in base.glob("teraio-*-r*") if base.is_dir() else ():
            try:
                pid = int(old.name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if not _pid_alive(pid):
                shutil.rmtree(old, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
