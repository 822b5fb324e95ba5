"""Idle periods and the memory curve, computed from a trace with numpy (no per-record Python).

A storage allocated by an op that writes nothing (torch.empty) has no period before its first
use as an op's input: the runtime keeps it where it is until then (its bytes may be filled
outside ATen: Note [Outputs read raw later] in teraio/walk.py), so a plan entry moving it out at
its birth would be refused (Note [Refused plan actions] in teraio_run/metrics.py).

Time is measured in kernel indices of one iteration (N kernels). A period runs from the kernel
that last used a tensor (`start`) to the next kernel that uses it (`end`), both "unrolled":
0 <= start < N and start < end <= start + N, so a period that crosses the iteration boundary
(every global's last-use -> first-use gap, and an intermediate freed early in the next
iteration) simply has end >= N. Kernel k of the next iteration is index k + N.
"""

from dataclasses import dataclass

import numpy as np

from teraio.formats.trace import UNINITIALIZED_OPS, Kind, Trace

# Storages of kind 'other' move only where the trace says the runtime will let them.
CANDIDATE_KINDS = (Kind.parameter, Kind.gradient, Kind.optimizer_state, Kind.activation)


def movable_kinds(trace: Trace) -> tuple[Kind, ...]:
    """The kinds a plan may move in this job: gradients stay under DDP (the runtime keeps them)."""
    if trace.header.gradients_stay_on_device:
        return tuple(k for k in CANDIDATE_KINDS if k != Kind.gradient)
    return CANDIDATE_KINDS


def movable_tensors(trace: Trace) -> np.ndarray:
    """Per tensor, whether a plan may move it: a movable kind, or kind `other` that the runtime
    moves too (the trace's movable_other: made by an op the walk saw or by torch.load, no process
    group; Note [Storages the job made] in teraio/walk.py). The state of an optimizer that is not
    torch.optim's is such a storage: with it kept in place, a hand-written Adam's smallest plan
    that fits needed its whole state on the device (tests/test_own_optimizer.py)."""
    movable = np.isin(trace.kind, movable_kinds(trace))
    if len(trace.movable_other) and trace.header.world_size == 1:  # (a rank's trace: its buffers stay)
        movable |= (trace.kind == Kind.other) & trace.movable_other
    return movable

# Offload needs >= 1 kernel, the saved stretch >= 1, the prefetch >= 1: start + 4 <= end.
MIN_GAP_KERNELS = 4


@dataclass
class Periods:
    """One row per idle period, sorted by (tensor, start): plain arrays for the hot loop."""

    tensor: np.ndarray      # int64, index into the trace's tensor columns
    nbytes: np.ndarray      # int64
    start: np.ndarray       # int64, last use before the period, in [0, N)
    end: np.ndarray         # int64, next use, in (start + 3, start + N]
    window_us: np.ndarray   # float64, kernel time strictly between start and end
    num_kernels: int

    def __len__(self) -> int:
        return len(self.tensor)

    def wraps(self) -> np.ndarray:
        return self.end >= self.num_kernels


def iteration_slices(lo: int, hi: int, num_k: int) -> list[tuple[int, int]]:
    """Unrolled kernels [lo, hi) (hi - lo <= num_k) as at most two slices of one iteration:
    slices are views, where index arrays would copy the window."""
    if lo >= hi:
        return []
    if hi - lo >= num_k:
        return [(0, num_k)]
    a, b = lo % num_k, hi % num_k
    return [(a, b)] if a < b else [(a, num_k)] + ([(0, b)] if b else [])


def unrolled_prefix_us(duration_us: np.ndarray) -> np.ndarray:
    """prefix[k] = time of kernels 0..k-1 over two iterations, so a window is one subtraction."""
    return np.concatenate(([0.0], np.cumsum(np.tile(duration_us, 2))))


def _use_points(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(tensor, unrolled kernel) for every use of a candidate tensor, plus intermediates' births."""
    counts = np.diff(trace.use_offsets)
    tensor = np.repeat(np.arange(trace.num_tensors, dtype=np.int64), counts)
    kernel = trace.use_kernels.astype(np.int64)
    born = trace.born
    # An intermediate freed in the next iteration may be used there before its birth kernel.
    kernel = np.where((born[tensor] >= 0) & (kernel < born[tensor]), kernel + trace.num_kernels, kernel)
    inter = np.flatnonzero(born >= 0)
    tensor = np.concatenate((tensor, inter))
    kernel = np.concatenate((kernel, born[inter]))
    keep = movable_tensors(trace)[tensor] & _inside_lifetime(trace, tensor, kernel)
    keep &= ~(born_unwritten(trace)[tensor] & (kernel == born[tensor]))  # its birth is no use (module doc)
    return tensor[keep], kernel[keep]


def born_unwritten(trace: Trace) -> np.ndarray:
    """Per tensor: an intermediate made by an op that allocates without writing."""
    by_op = np.array([name in UNINITIALIZED_OPS for name in trace.op_names], dtype=bool)
    inter = trace.born >= 0
    unwritten = np.zeros(trace.num_tensors, dtype=bool)
    unwritten[inter] = by_op[trace.kernel_op[trace.born[inter]]]
    return unwritten


def _inside_lifetime(trace: Trace, tensor: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    born, freed = trace.born[tensor], trace.freed[tensor]
    return (born < 0) | ((kernel >= born) & (kernel < np.maximum(freed, born + 1)))


def _sorted_unique(tensor: np.ndarray, kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((kernel, tensor))
    tensor, kernel = tensor[order], kernel[order]
    fresh = np.ones(len(tensor), dtype=bool)
    fresh[1:] = (tensor[1:] != tensor[:-1]) | (kernel[1:] != kernel[:-1])
    return tensor[fresh], kernel[fresh]


def _gaps(tensor: np.ndarray, kernel: np.ndarray, is_global: np.ndarray, num_k: int):
    """Consecutive-use gaps of each tensor, plus the wrap-around gap of each global."""
    same = tensor[1:] == tensor[:-1]
    t_in, a_in, e_in = tensor[:-1][same], kernel[:-1][same], kernel[1:][same]
    last = np.ones(len(tensor), dtype=bool)
    last[:-1] = ~same
    first = np.ones(len(tensor), dtype=bool)
    first[1:] = ~same
    wrap_t = tensor[last]
    wrap_mask = is_global[wrap_t]
    t_wr = wrap_t[wrap_mask]
    a_wr = kernel[last][wrap_mask]
    e_wr = kernel[first][wrap_mask] + num_k
    return np.concatenate((t_in, t_wr)), np.concatenate((a_in, a_wr)), np.concatenate((e_in, e_wr))


def find_periods(trace: Trace, prefix_us: np.ndarray | None = None) -> Periods:
    num_k = trace.num_kernels
    tensor, kernel = _sorted_unique(*_use_points(trace))
    t, a, e = _gaps(tensor, kernel, trace.born < 0, num_k)
    # An intermediate whose uses all sit past the boundary starts there: fold back into [0, N).
    shift = (a // num_k) * num_k if num_k else 0
    a, e = a - shift, e - shift
    keep = (e - a) >= MIN_GAP_KERNELS
    t, a, e = t[keep], a[keep], e[keep]
    order = np.lexsort((a, t))
    t, a, e = t[order], a[order], e[order]
    prefix_us = unrolled_prefix_us(trace.duration_us) if prefix_us is None else prefix_us
    window_us = prefix_us[e] - prefix_us[a + 1]
    return Periods(t, trace.nbytes[t].astype(np.int64), a, e, window_us, num_k)
