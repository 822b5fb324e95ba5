"""Device memory per kernel with nothing offloaded, and the least any plan needs."""

import numpy as np

from teraio.formats.trace import Trace, live_bytes_per_kernel
from teraio_plan.periods import movable_kinds


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


def min_required_bytes(trace: Trace, headroom_bytes: int) -> tuple[int, int]:
    """(bytes, kernel): the least device memory any plan needs, and the kernel that needs it.

    Kernel k needs every tensor it touches, every storage we never move ('other') that is
    live at k, and the untracked bytes plus headroom. No plan can go below the largest.
    """
    if trace.num_kernels == 0:
        return int(trace.header.untracked_bytes) + int(headroom_bytes), 0
    movable = np.isin(trace.kind, movable_kinds(trace))
    need = used_bytes(trace, movable) + live_bytes_per_kernel(trace, ~movable)
    k = int(np.argmax(need))
    return int(need[k]) + int(trace.header.untracked_bytes) + int(headroom_bytes), k
