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


def walk_many(residual: np.ndarray, lo: np.ndarray, hi: np.ndarray, nbytes: np.ndarray,
              forward: bool, prefix) -> np.ndarray:
    """Per period (one row each), walking the residual bandwidth of kernels [lo, hi):
    forward, the first kernel by whose end nbytes have been carried (the offload is done);
    backward, the last kernel from which kernels up to hi - 1 can still carry nbytes (the
    prefetch must start there). -1 where the window cannot carry it.

    A binary search in `prefix()`, the running sum of the residual, which the planner keeps
    current after every pick: O(log N) per period however saturated the ledgers are.
    """
    return _walk_prefix(prefix(), lo, hi, nbytes, forward)


def residual_prefix(residual: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(residual)))


def prefix_sub(prefix: np.ndarray, lo: int, hi: int, taken: np.ndarray) -> None:
    """Keep residual_prefix current after `taken` left kernels [lo, hi) and their mirrors.

    Two tail subtractions instead of a new cumulative sum over the whole ledger.
    """
    num_k = (len(prefix) - 1) // 2
    for start, part in _mirror_parts(lo, hi, taken, num_k):
        prefix[start + 1:start + 1 + len(part)] -= np.cumsum(part)
        prefix[start + 1 + len(part):] -= float(part.sum())


def _mirror_parts(lo: int, hi: int, values: np.ndarray, num_k: int):
    """(start, values) pieces of [lo, hi) and of its mirror, in absolute positions."""
    yield lo, values
    if hi <= num_k:
        yield lo + num_k, values
    elif lo >= num_k:
        yield lo - num_k, values
    else:
        cut = num_k - lo
        yield lo + num_k, values[:cut]
        yield 0, values[cut:]


def _walk_prefix(prefix: np.ndarray, lo: np.ndarray, hi: np.ndarray, nbytes: np.ndarray,
                 forward: bool) -> np.ndarray:
    need = nbytes * (1 - REL_EPS)
    if forward:
        j = np.searchsorted(prefix, prefix[lo] + need, side="left") - 1
        return np.where(j < hi, j, -1)
    i = np.searchsorted(prefix, prefix[hi] - need, side="right") - 1
    return np.where(i >= lo, i, -1)
