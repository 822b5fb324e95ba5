"""Profiling a job that does not fit its device: the runtime's budget keeper without a plan.

Note [Profiling under a cap]
`teraio profile --gpu-mem SIZE` runs the job as `teraio run` runs an unplanned stretch:
before each op its inputs are brought back, and after an op that took memory past the cap
the least recently used movable tensors go to the host pool (--host-mem), and to swap files
(--ssd-dir) once it is full. On CUDA the cap is the allocator's, as for `teraio run`. What the
trace records does not depend on where a tensor is: names, kinds, sizes, births, deaths and
uses come from the walk, and an evicted storage is resized, not freed, so it neither dies nor
is born again (the CPU tests compare a capped trace with an uncapped one column by column).
What does depend on it is made to not:
- kernel times: the profiler's clock starts after this keeper has made the inputs resident
  (on CUDA the start event is queued after the copy's stream wait, so it fires once the data
  is in), restarts when an op that ran out of memory is retried after memory was relieved,
  and stops before anything is evicted; the trace counts the kernels that waited. Copies
  running beside a kernel can still slow it a little (they share HBM and the host link).
  Kernel times are not rescaled to the warm-up iterations as uncapped ones are (Note
  [Kernel time under the profiler] in teraio_profile/recorder.py): those include the waits.
  Measured on the 3B fp32 benchmark at 1/2 of its peak: the kernels summed to 888 ms, the
  uncapped trace's to 884 ms before its rescale (824 ms after);
- the memory model: the allocator's bytes after each kernel plus the bytes this keeper has
  moved out, i.e. what the job would hold uncapped, which is what the planner must see;
  the constant of untracked bytes comes from the low end of the gap to the traced tensors
  (ProfileAgent._with_memory_model).
The trace header names the cap (profiled_under_cap) so that nobody reads its timings as an
uncapped run's. Storages the walk cannot move (kind `other`: communication buffers,
backward intermediates with no owner) still have to fit: an op that runs out of memory
anyway fails as it would without teraio.

The profiler is a stage of its own and never imports the runtime: the bootstrap builds this
keeper and hands it to the profile agent (teraio/app/bootstrap/__init__.py).
"""

import atexit
import os
import signal
import sys

from teraio.launch import mem_available_bytes
from teraio.settings import Settings
from teraio.units import format_bytes
from teraio_run.budget import BudgetKeeper
from teraio_run.setup import build_engine, cap_device_memory, remove_run_dirs
from teraio_run.stops import exit_cleanly_on


class CappedProfile:
    """Keeps a profiled job within --gpu-mem; the profile agent calls it around each op."""

    def __init__(self, settings: Settings, walk):
        self.cuda = walk.device_type == "cuda"
        self.cap_bytes = settings.gpu_mem_bytes
        if self.cuda:
            cap_device_memory(self.cap_bytes)
        pool_bytes = settings.host_mem_bytes or default_pool_bytes()
        self.engine, self.context = build_engine(settings, pool_bytes, self.cuda)
        self.keeper = BudgetKeeper(self.engine, walk, self.cap_bytes, self.cuda)
        atexit.register(self.close)
        exit_cleanly_on(signal.SIGTERM, signal.SIGHUP)  # a stopped profile leaves no swap folder

    @property
    def host_pool_bytes(self) -> int:
        return self.context.pool_bytes

    def before_op(self, inputs) -> bool:
        """True when the op had to wait for one of its inputs to come back."""
        return self.keeper.restore_inputs(inputs, "unplanned")

    def hold_unwritten(self, new) -> None:
        self.keeper.hold_unwritten(new)

    def after_op(self, inputs, new) -> None:
        self.keeper.after_op(inputs, new)

    def relieve_memory(self, inputs, attempt: int) -> bool:
        return self.keeper.relieve_memory(inputs, attempt)

    def on_iteration_end(self) -> None:
        self.keeper.release_dead_moved()

    def released_bytes(self) -> int:
        """Device bytes moved out now: added to the allocator's count for the memory model."""
        return self.engine.offloaded_now

    def resident(self):
        return self.keeper.resident()

    def held_for_copy(self, storage):
        return self.keeper.held_for_copy(storage)

    def pin_for_raw_read(self, tensor) -> None:
        self.keeper.pin_for_raw_read(tensor)

    def summary(self) -> str:
        stats = self.engine.stats
        return (f"profiled under a {format_bytes(self.cap_bytes)} cap: {stats.evictions} evictions, "
                f"{format_bytes(stats.offloaded_bytes['host'])} to the host pool "
                f"({format_bytes(self.host_pool_bytes)}), {format_bytes(stats.offloaded_bytes['ssd'])} to swap files, "
                f"{sum(stats.stall_ms.values()) / 1e3:.1f} s waiting for memory{self._over_cap()}")

    def _over_cap(self) -> str:
        """Said when the cap could not be held: some kernel's own tensors needed more (the trace
        still records the job uncapped; `teraio plan` names the least budget any plan needs)."""
        peak = self.keeper.peak_bytes
        if peak <= self.cap_bytes:
            return ""
        return (f"; the cap could not be held (up to {format_bytes(peak)} on the device: a kernel's own tensors "
                "need more), so this profile rehearsed no smaller device: raise --gpu-mem to rehearse one")

    def close(self) -> None:
        self.context.threads.shutdown(wait=True)
        remove_run_dirs(self.context)


def default_pool_bytes() -> int:
    """Without --host-mem: half the memory available, shared by the processes of this machine
    (torchrun's LOCAL_WORLD_SIZE), each pinning its own pool."""
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return (mem_available_bytes() or 0) // 2 // max(1, local_processes)


def start_capped(settings: Settings, walk) -> CappedProfile:
    keeper = CappedProfile(settings, walk)
    print(f"teraio: profiling under a {format_bytes(keeper.cap_bytes)} cap on {walk.device_type}, host pool "
          f"{format_bytes(keeper.host_pool_bytes)}, swap files in {len(keeper.context.run_dirs)} folder(s)",
          file=sys.stderr)
    return keeper
