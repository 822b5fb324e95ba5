"""Note [A busy machine under the profiler]
On the CPU a kernel's time is wall time (the clock around the op's call), so where other
processes hold the cores the job's ops wait for time slices and the trace takes the waits as
kernel time: a plan made from it then expects more time for its copies than the job will have
on a quiet machine, and two profiles of one job disagree (a profile on the 2-core box beside the
project's test suite). The waits cannot be told apart from the work afterwards, so the profiler
says so: over the recorded iterations it takes the CPU time the machine spent outside this
process and its live children (a DataLoader's workers are the job's own), from /proc/stat, and
warns, once, when the machine had no core to spare (less than IDLE_CORES idle on average), other
processes held at least BUSY_OTHERS_CORES of it, and the job used less than its intra-op threads
(by STARVED_CORES): its threads waited for cores the others had. (A fair share does not say it:
beside 8 busy loops on 2 cores the job of one thread still got 0.75 of a core; a job of one
thread beside one busy process on 2 cores waited for nothing.) Linux only (no /proc: no check). On CUDA the kernel times come from the device's events and are not checked."""

import os
import time

import torch

BUSY_OTHERS_CORES = 0.25   # other processes' average use, in cores, that the job could have had ...
IDLE_CORES = 0.25          # ... had the machine not been busy (less than this idle) all the while
STARVED_CORES = 0.1        # and the job's own use fell this short of its threads
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy_ticks() -> int | None:
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal


def _process_ticks(pid: str) -> int:
    """utime + stime of a process and of its children it has waited for; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return sum(int(v) for v in fields[11:15])   # utime, stime, cutime, cstime


def _own_ticks() -> int:
    """This process's CPU time and its live children's (one level: a DataLoader's workers)."""
    children = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as listed:
                children.update(listed.read().split())
    except OSError:
        pass
    return _process_ticks("self") + sum(_process_ticks(pid) for pid in children)


class MachineLoad:
    """The other processes' CPU time between start() and busy_warning()."""

    def __init__(self):
        self._start: tuple[float, int, int] | None = None

    def start(self) -> None:
        busy = _machine_busy_ticks()
        if busy is not None:
            self._start = (time.monotonic(), busy, _own_ticks())

    @property
    def started(self) -> bool:
        return self._start is not None

    def busy_warning(self) -> str | None:
        """The warning's words if other processes competed for the cores, else None."""
        busy = _machine_busy_ticks()
        if self._start is None or busy is None:
            return None
        t0, busy0, own0 = self._start
        wall_s = time.monotonic() - t0
        if wall_s <= 0:
            return None
        cores = os.cpu_count() or 1   # /proc/stat counts the machine's, whatever this process may use
        own_cores = (_own_ticks() - own0) / _TICKS_PER_S / wall_s
        others_cores = (busy - busy0) / _TICKS_PER_S / wall_s - own_cores
        idle_cores = cores - own_cores - others_cores
        threads = min(cores, torch.get_num_threads())
        if others_cores < BUSY_OTHERS_CORES or idle_cores > IDLE_CORES or own_cores > threads - STARVED_CORES:
            return None
        return (f"other processes kept {others_cores:.1f} of this machine's {cores} cores busy while the "
                f"iterations were timed, none idle (the job computes on {torch.get_num_threads()} threads): on "
                "the CPU kernel times are wall times, so this trace's are inflated by the waits for a core, and "
                "plans made from it expect more time than the job has on a quiet machine; profile again when "
                "the machine is quiet")
