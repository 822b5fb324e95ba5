"""Per-kernel arrays over two iterations, kept mirrored so any period reads one contiguous slice.

Index k and k + N are the same kernel slot (steady state: every iteration repeats the same
traffic), so a write to one is a write to both. Periods span at most N kernels, so their
slices [lo, hi) always satisfy 0 <= lo < hi <= 2N and hi - lo <= N.
"""

import numpy as np

# Transfers are accounted in float bytes; this much slack absorbs rounding in sums.
REL_EPS = 1e-9
FIRST_CHUNK_KERNELS = 256


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


def walk_forward(tier: np.ndarray, link: np.ndarray, lo: int, hi: int, nbytes: float) -> int:
    """First kernel j in [lo, hi) by whose end the residual bandwidth has carried nbytes; -1 if none."""
    pos, carried, chunk = lo, 0.0, FIRST_CHUNK_KERNELS
    need = nbytes * (1 - REL_EPS)
    while pos < hi:
        end = min(hi, pos + chunk)
        cum = np.cumsum(np.minimum(tier[pos:end], link[pos:end])) + carried
        j = int(np.searchsorted(cum, need))
        if j < len(cum):
            return pos + j
        carried, pos, chunk = float(cum[-1]), end, chunk * 4
    return -1


def walk_backward(tier: np.ndarray, link: np.ndarray, lo: int, hi: int, nbytes: float) -> int:
    """Last kernel i in [lo, hi) such that kernels i..hi-1 can carry nbytes; -1 if none."""
    end, carried, chunk = hi, 0.0, FIRST_CHUNK_KERNELS
    need = nbytes * (1 - REL_EPS)
    while end > lo:
        start = max(lo, end - chunk)
        cum = np.cumsum(np.minimum(tier[start:end], link[start:end])[::-1]) + carried
        j = int(np.searchsorted(cum, need))
        if j < len(cum):
            return end - 1 - j
        carried, end, chunk = float(cum[-1]), start, chunk * 4
    return -1


def reserve(tier: np.ndarray, link: np.ndarray, lo: int, hi: int, nbytes: float, forward: bool) -> None:
    """Take nbytes from the residuals of kernels [lo, hi), filling from the front (or back)."""
    take = np.minimum(tier[lo:hi], link[lo:hi])
    order = take if forward else take[::-1]
    before_last = float(order[:-1].sum())
    order[-1] = min(float(order[-1]), max(0.0, nbytes - before_last))
    mirror_add(tier, lo, hi, -take)
    mirror_add(link, lo, hi, -take)  # take <= both residuals, so neither goes negative


def walk_many(tier: np.ndarray, link: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              nbytes: np.ndarray, forward: bool, prefix=None) -> np.ndarray:
    """walk_forward / walk_backward for many periods at once (one row each); -1 where none.

    Short walks (the common case: a transfer spans a few kernels) gather the next kernels of
    every row into one 2-D block, so they cost the transfers' lengths, not the windows'.
    Rows still unresolved after that (saturated ledgers, long transfers) search a prefix sum
    of the residual, `prefix()`, built once per ledger state by the caller.
    """
    found, todo = _walk_short(tier, link, lo, hi, nbytes, forward)
    if len(todo):
        found[todo] = _walk_prefix(prefix(), lo[todo], hi[todo], nbytes[todo], forward)
    return found


def residual_prefix(tier: np.ndarray, link: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(np.minimum(tier, link))))


def _walk_prefix(prefix: np.ndarray, lo: np.ndarray, hi: np.ndarray, nbytes: np.ndarray,
                 forward: bool) -> np.ndarray:
    need = nbytes * (1 - REL_EPS)
    if forward:
        j = np.searchsorted(prefix, prefix[lo] + need, side="left") - 1
        return np.where(j < hi, j, -1)
    i = np.searchsorted(prefix, prefix[hi] - need, side="right") - 1
    return np.where(i >= lo, i, -1)


def _walk_short(tier, link, lo, hi, nbytes, forward, rounds: int = 2):
    """Up to `rounds` gathered rounds (64 then 256 kernels); returns (found, unresolved rows)."""
    found = np.full(len(lo), -1, dtype=np.int64)
    carried = np.zeros(len(lo))
    done = np.zeros(len(lo), dtype=np.int64)       # kernels already walked per row
    todo = np.arange(len(lo))
    need = nbytes * (1 - REL_EPS)
    chunk = FIRST_CHUNK_KERNELS // 4
    for _ in range(rounds):
        if not len(todo):
            break
        steps = done[todo, None] + np.arange(chunk)
        pos = (lo[todo, None] + steps) if forward else (hi[todo, None] - 1 - steps)
        inside = steps < (hi - lo)[todo, None]
        pos = np.clip(pos, 0, len(tier) - 1)
        avail = np.where(inside, np.minimum(tier[pos], link[pos]), 0.0)
        cum = np.cumsum(avail, axis=1) + carried[todo, None]
        hit = cum >= need[todo, None]
        got = hit.any(axis=1)
        first = np.argmax(hit, axis=1)
        found[todo[got]] = pos[got, first[got]]
        carried[todo], done[todo] = cum[:, -1], done[todo] + chunk
        todo = todo[~got & (done[todo] < (hi - lo)[todo])]
        chunk *= 4
    return found, todo
