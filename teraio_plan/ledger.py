"""Per-kernel arrays over two iterations, kept mirrored so any period reads one contiguous slice.

Index k and k + N are the same kernel slot (steady state: every iteration repeats the same
traffic), so a write to one is a write to both. Periods span at most N kernels, so their
slices [lo, hi) always satisfy 0 <= lo < hi <= 2N and hi - lo <= N.
"""

import numpy as np

# Transfers are accounted in float bytes; this much slack absorbs rounding in sums.
REL_EPS = 1e-9


def mirror_add(arr: np.ndarray, lo: int, hi: int, values) -> None:
    """arr[lo:hi] += values, and the same on the mirrored slots."""
    num_k = len(arr) // 2
    arr[lo:hi] += values
    if hi <= num_k:
        arr[lo + num_k:hi + num_k] += values
    elif lo >= num_k:
        arr[lo - num_k:hi - num_k] += values
    else:
        cut = num_k - lo
        head, tail = (values[:cut], values[cut:]) if np.ndim(values) else (values, values)
        arr[lo + num_k:] += head
        arr[:hi - num_k] += tail


def mirror_set(arr: np.ndarray, lo: int, hi: int, values: np.ndarray) -> None:
    """arr[lo:hi] = values, and the same on the mirrored slots."""
    num_k = len(arr) // 2
    arr[lo:hi] = values
    if hi <= num_k:
        arr[lo + num_k:hi + num_k] = values
    elif lo >= num_k:
        arr[lo - num_k:hi - num_k] = values
    else:
        cut = num_k - lo
        arr[lo + num_k:] = values[:cut]
        arr[:hi - num_k] = values[cut:]


def reserve(residual: np.ndarray, lo: int, hi: int, nbytes: float, forward: bool) -> np.ndarray:
    """Take nbytes from the residual of kernels [lo, hi), filling from the front (or back).

    Returns what was taken per kernel (for the link's accounts).
    """
    take = residual[lo:hi].copy()
    order = take if forward else take[::-1]
    before_last = float(order[:-1].sum())
    order[-1] = min(float(order[-1]), max(0.0, nbytes - before_last))
    mirror_add(residual, lo, hi, -take)  # take <= residual, so it never goes negative
    return take


def walk_many(residual_sum: "RunningSum", lo: np.ndarray, hi: np.ndarray, nbytes: np.ndarray,
              forward: bool) -> np.ndarray:
    """Per period (one row each), walking the residual bandwidth of kernels [lo, hi):
    forward, the first kernel by whose end nbytes have been carried (the offload is done);
    backward, the last kernel from which kernels up to hi - 1 can still carry nbytes (the
    prefetch must start there). -1 where the window cannot carry it.

    A binary search in the running sum of the residual, which the planner keeps current after
    every pick: O(log N) per period however saturated the ledgers are.
    """
    need_bytes = nbytes * (1 - REL_EPS)
    if forward:
        j = residual_sum.searchsorted(residual_sum.at(lo) + need_bytes, "left") - 1
        return np.where(j < hi, j, -1)
    i = residual_sum.searchsorted(residual_sum.at(hi) - need_bytes, "right") - 1
    return np.where(i >= lo, i, -1)


class RunningSum:
    """prefix[k] = sum of values[0:k] (k = 0..len), kept in two levels so a change is cheap.

    One flat cumulative sum costs O(N) to keep current after every pick (a tail subtraction
    over the rest of the ledger), and at 250k kernels that was the largest cost per pick.
    Here the values are cut into blocks of BLOCK_KERNELS: a running sum within each block
    plus the sums up to each block start. A change to values[lo:hi] redoes the blocks it
    touches and the block starts: O(hi - lo + BLOCK_KERNELS + N / BLOCK_KERNELS) instead of
    O(N). A lookup adds one of each; a search finds the block first, then the kernel in it.
    Every number is recomputed from the values, so no rounding error piles up over picks.
    """

    BLOCK_KERNELS = 256

    def __init__(self, values: np.ndarray):
        self.values = values  # the caller's array, not a copy: refresh() after changing it
        self.size = len(values)
        self.num_blocks = max(1, -(-self.size // self.BLOCK_KERNELS))
        # within[b, j]: the sum of block b's values before its j-th. One extra row of zeros so
        # that prefix[len] (len a multiple of the block) reads starts[num_blocks] + 0.
        self.within = np.zeros((self.num_blocks + 1, self.BLOCK_KERNELS))
        self.block_totals = np.zeros(self.num_blocks)
        self.starts = np.zeros(self.num_blocks + 1)  # starts[b]: the sum of values before block b
        self.refresh(0, self.size)

    def refresh(self, lo: int, hi: int) -> None:
        """Redo the sums after values[lo:hi] changed."""
        if hi <= lo:
            return
        block = self.BLOCK_KERNELS
        first, last = lo // block, (hi - 1) // block + 1
        rows = np.zeros((last - first) * block)  # the tail of the last block is padding (0)
        span = self.values[first * block:min(last * block, self.size)]
        rows[:len(span)] = span
        sums = np.cumsum(rows.reshape(last - first, block), axis=1)
        self.within[first:last, 1:] = sums[:, :-1]
        self.block_totals[first:last] = sums[:, -1]
        self.starts[1:] = np.cumsum(self.block_totals)

    def at(self, k: np.ndarray) -> np.ndarray:
        """prefix[k] for an array of k in [0, len]."""
        b, j = np.divmod(k, self.BLOCK_KERNELS)
        return self.starts[b] + self.within[b, j]

    def searchsorted(self, target: np.ndarray, side: str) -> np.ndarray:
        """np.searchsorted(prefix, target, side), without a flat prefix: the block, then the kernel."""
        b = np.clip(np.searchsorted(self.starts, target, side) - 1, 0, self.num_blocks - 1)
        rows = self.starts[b][:, None] + self.within[b]
        below = rows < target[:, None] if side == "left" else rows <= target[:, None]
        k = b * self.BLOCK_KERNELS + np.count_nonzero(below, axis=1)
        beyond = target > self.starts[-1] if side == "left" else target >= self.starts[-1]
        return np.where(beyond, self.size + 1, np.minimum(k, self.size))

    def refresh_mirrored(self, lo: int, hi: int) -> None:
        """refresh() for kernels [lo, hi) of a mirrored array (module docstring) and their mirrors."""
        for start, stop in _mirror_spans(lo, hi, self.size // 2):
            self.refresh(start, stop)


def _mirror_spans(lo: int, hi: int, num_k: int) -> list[tuple[int, int]]:
    """[start, stop) pieces of [lo, hi) and of its mirror, in absolute positions."""
    if hi <= num_k:
        return [(lo, hi), (lo + num_k, hi + num_k)]
    if lo >= num_k:
        return [(lo, hi), (lo - num_k, hi - num_k)]
    return [(lo, hi), (lo + num_k, 2 * num_k), (0, hi - num_k)]
