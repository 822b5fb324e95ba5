"""The swap folders on disk: each job's process makes `teraio-PID-rRANK` in every --ssd-dir (the
runtime: teraio_run/tiers.py make_run_dirs) and removes it at exit; what a job killed past its
exit handlers left (SIGKILL, the OOM killer) is removed by the launcher when the job ends, for
`teraio run` and a profile under a cap alike, and by the next run on the folder. The default
folder (DEFAULT_SWAP_DIR, in the temp dir) is made by the run and removed by the launcher's sweep
once no job's folder is left in it: a job that was given no --ssd-dir leaves nothing behind. A
given --ssd-dir is the user's and stays. No torch here: the launchers must not import it.

Note [Whose swap folder is alive]
A folder's PID says little where the disk is shared between PID namespaces (containers on one
host's NVMe): another namespace's live job may have a PID that is nobody here, and removing its
folder would lose the bytes it swapped out. So the process that makes a folder holds an flock on
the folder's `.lock` for as long as it lives (the kernel lets it go at any death, SIGKILL too,
and across namespaces the lock is the same), and a sweep removes only folders whose lock it can
take; a folder without one (made before the lock existed) goes by its PID, as before."""

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from teraio.errors import UsageError

DEFAULT_SWAP_DIR = Path(tempfile.gettempdir()) / "teraio-swap"   # when no --ssd-dir is given
LOCK_NAME = ".lock"
_held_locks: dict[Path, int] = {}   # this process's folders -> their lock descriptors, open until it exits


def swap_bases(ssd_dirs: list[str]) -> list[str]:
    """The folders swap files go to: the given ones, else the default."""
    return list(ssd_dirs) or [str(DEFAULT_SWAP_DIR)]


def make_run_dir(base: Path, rank: int) -> Path:
    """This process's swap folder in `base`, made and held (Note [Whose swap folder is alive])."""
    own = base / f"teraio-{os.getpid()}-r{rank}"
    if own.resolve() in _held_locks:   # the same folder given twice (--ssd-dir /a --ssd-dir /a)
        return own
    own.mkdir(parents=True, exist_ok=True)   # parents: another job's sweep may have removed the default base
    fd = os.open(own / LOCK_NAME, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:   # a live job of the same PID in another PID namespace: its swap files
        os.close(fd)
        raise UsageError(f"swap folder {own} is held by another live job (one with this PID in another "
                         "container?): give this job a --ssd-dir of its own") from None
    _held_locks[own.resolve()] = fd
    return own


def remove_dead_run_dirs(bases: list[str | Path]) -> None:
    """Remove the swap folders no live process holds (another job on the same folder keeps its own)."""
    for base in map(Path, bases):
        for old in base.glob("teraio-*-r*") if base.is_dir() else ():
            if not _held(old):
                shutil.rmtree(old, ignore_errors=True)


def sweep_after_job(bases: list[str]) -> None:
    """At a job's end (the launcher): the swap folders no live process holds, and the default
    base if that left it empty (another live job's folder keeps it)."""
    remove_dead_run_dirs(bases)
    if str(DEFAULT_SWAP_DIR) in bases:
        try:
            DEFAULT_SWAP_DIR.rmdir()
        except OSError:
            pass


def _held(folder: Path) -> bool:
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:   # no lock: an older folder, or one made this instant
        return _pid_alive(folder)
    except OSError:
        return True   # unreadable: not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)   # closing lets go of the lock taken, if it was
    return False


def _pid_alive(folder: Path) -> bool:
    try:
        pid = int(folder.name.split("-")[1])
    except (IndexError, ValueError):
        return True   # not a name we make: leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
