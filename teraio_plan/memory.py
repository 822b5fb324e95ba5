"""Device memory per kernel with nothing offloaded, and the least any plan needs."""

import numpy as np

from teraio.formats.trace import Trace, live_bytes_per_kernel
from teraio_plan.periods import find_periods, movable_tensors

# A period's tensor can be away from this many kernels after its start to as many before its end.
REACH_KERNELS = 2


def memory_curve(trace: Trace, headroom_bytes: int) -> np.ndarray:
    """M[k]: everything live at kernel k, plus what the trace could not track, plus headroom."""
    return live_bytes_per_kernel(trace) + int(trace.header.untracked_bytes) + int(headroom_bytes)


def used_bytes(trace: Trace, mask: np.ndarray) -> np.ndarray:
    """Bytes of the distinct masked tensors each kernel touches (they must be on the device)."""
    counts = np.diff(trace.use_offsets)
    tensor = np.repeat(np.arange(trace.num_tensors), counts)
    kernel = trace.use_kernels
    pair = np.unique(tensor * max(trace.num_kernels, 1) + kernel)
    tensor, kernel = pair // max(trace.num_kernels, 1), pair % max(trace.num_kernels, 1)
    keep = mask[tensor]
    return np.bincount(kernel[keep], weights=trace.nbytes[tensor[keep]], minlength=trace.num_kernels)


def kernel_need_bytes(trace: Trace, headroom_bytes: int) -> tuple[int, int]:
    """(bytes, kernel): the most one kernel needs on the device, its own tensors and every
    storage we never move live then, untracked bytes and headroom: below it the job cannot
    run at all, planned or not (the planner's one refusal). Between it and min_required_bytes
    a plan cannot fit, but the runtime's budget keeper still can (it evicts what plan entries
    cannot name: intermediates past their last use), so the planner says `fits: false`."""
    if trace.num_kernels == 0:
        return int(trace.header.untracked_bytes) + int(headroom_bytes), 0
    movable = movable_tensors(trace)
    need = used_bytes(trace, movable) + live_bytes_per_kernel(trace, ~movable)
    k = int(np.argmax(need))
    return int(need[k]) + int(trace.header.untracked_bytes) + int(headroom_bytes), k


def min_required_bytes(trace: Trace, headroom_bytes: int) -> tuple[int, int]:
    """(bytes, kernel): the least device memory any plan needs, and the kernel that needs it.

    Note [What must stay]
        A plan entry has a tensor away over kernels start + 2 .. end - 2 of one idle period
        (start and end are uses): the copy-out runs beside the kernel after the last use and
        the copy-in lands during the kernel before the next one. Everything else live at k
        stays: what k touches, storages we never move ('other', gradients under DDP), the
        neighbours' tensors, intermediates past their last use (no period ends in a free),
        and the untracked bytes plus headroom. No plan can go below the largest; every plan
        can reach it at the price of stalls (Note [Fitting at any cost] in fit.py). Below it
        the planner still plans (fits: false) down to kernel_need_bytes.
    """
    if trace.num_kernels == 0:
        return int(trace.header.untracked_bytes) + int(headroom_bytes), 0
    floor_bytes = memory_curve(trace, headroom_bytes) - movable_bytes(trace)
    k = int(np.argmax(floor_bytes))
    return int(floor_bytes[k]), k


def movable_bytes(trace: Trace) -> np.ndarray:
    """Per kernel, the bytes some plan entry could have away there (Note [What must stay])."""
    num_k = trace.num_kernels
    periods = find_periods(trace)
    lo, hi = periods.start + REACH_KERNELS, periods.end - REACH_KERNELS + 1
    keep = hi > lo
    diff = np.zeros(2 * num_k + 1, dtype=np.int64)
    np.add.at(diff, lo[keep], periods.nbytes[keep])
    np.add.at(diff, hi[keep], -periods.nbytes[keep])
    away = np.cumsum(diff[:2 * num_k])
    return away[:num_k] + away[num_k:]
