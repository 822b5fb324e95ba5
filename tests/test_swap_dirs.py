"""Note [Whose swap folder is alive] in teraio/swap_dirs.py: a sweep removes the swap folders no
live process holds, and keeps one whose owner's PID means nothing here (another PID namespace on
the same disk) as long as the owner holds its lock."""

import fcntl
import os
import subprocess
import sys

import pytest

from teraio.errors import UsageError
from teraio.swap_dirs import LOCK_NAME, make_run_dir, remove_dead_run_dirs


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_a_folder_held_by_a_live_owner_is_kept_whatever_its_pid(tmp_path):
    held = tmp_path / f"teraio-{dead_pid()}-r0"   # a PID nobody has here, as from another namespace
    held.mkdir()
    fd = os.open(held / LOCK_NAME, os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    released = tmp_path / f"teraio-{dead_pid()}-r1"   # its owner died: the lock went with it
    released.mkdir()
    (released / LOCK_NAME).touch()
    unlocked_dead = tmp_path / f"teraio-{dead_pid()}-r2"   # made before folders had locks
    unlocked_dead.mkdir()
    try:
        remove_dead_run_dirs([tmp_path])
        assert sorted(p.name for p in tmp_path.iterdir()) == [held.name]
    finally:
        os.close(fd)
    remove_dead_run_dirs([tmp_path])
    assert not held.exists()


def test_this_processs_own_folder_survives_a_sweep_and_may_be_given_twice(tmp_path):
    own = make_run_dir(tmp_path, rank=3)
    remove_dead_run_dirs([tmp_path])
    assert own.is_dir() and own.name == f"teraio-{os.getpid()}-r3"
    assert make_run_dir(tmp_path, rank=3) == own   # --ssd-dir given twice: its own lock, not another job's


def test_a_folder_of_this_pid_held_by_another_live_job_is_refused_not_shared(tmp_path):
    """Two containers on one disk, one PID: sharing the folder, each would overwrite the other's
    swap files."""
    other = tmp_path / f"teraio-{os.getpid()}-r0"
    other.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
                               "os.O_WRONLY | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); print(flush=True); "
                               "time.sleep(60)", str(other / LOCK_NAME)], stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()   # it holds the lock now
        with pytest.raises(UsageError, match="held by another live job"):
            make_run_dir(tmp_path, rank=0)
    finally:
        holder.kill()
        holder.wait()
