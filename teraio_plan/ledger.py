"""Per-kernel arrays over two iterations, kept mirrored so any period reads one contiguous slice.

Index k and k + N are the same kernel slot (steady state: every iteration repeats the same
traffic), so a write to one is a write to both. Periods span at most N kernels, so their
slices [lo, hi) always satisfy 0 <= lo < hi <= 2N and hi - lo <= N.

Two structures keep each pick from costing O(N): RunningSum (the residual ledgers, searched
by the walks) and Excess (the memory over the budget, Note [Blocked excess]).
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


def reserve(residual_sum: "RunningSum", lo: int, hi: int, nbytes: float, forward: bool,
            offset: int, mirrored_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Take nbytes from the residual of kernels [lo, hi), filling from the front (or back).

    The ledger is the mirrored array of `mirrored_size` slots from `offset` in the running sum.
    Returns (slots, bytes taken there), both mirrors, only where something was taken: on
    saturated ledgers a walk crosses long stretches that earlier picks already emptied, and
    nothing there changes (the running sum's empty blocks are skipped without reading them).
    """
    residual = residual_sum.values[offset:offset + mirrored_size]
    slots = residual_sum.nonzero_slots(offset + lo, offset + hi) - offset
    take = residual[slots]
    order = take if forward else take[::-1]
    before_last = float(order[:-1].sum())
    order[-1] = min(float(order[-1]), max(0.0, nbytes - before_last))
    slots, take = with_mirrors(slots, mirrored_size // 2), np.concatenate((take, take))
    residual[slots] -= take  # take <= residual, so it never goes negative; slots are distinct
    residual_sum.refresh_slots(offset + slots)
    return slots, take


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

    BLOCK_KERNELS = 64  # a search reads one block; a change redoes num_blocks start sums

    @classmethod
    def padded_size(cls, size: int) -> int:
        """size rounded up to whole blocks (arrays placed back to back start on a block)."""
        return -(-size // cls.BLOCK_KERNELS) * cls.BLOCK_KERNELS

    def __init__(self, values: np.ndarray):
        self.size = len(values)
        self.num_blocks = max(1, -(-self.size // self.BLOCK_KERNELS))
        # A copy padded with zeros to whole blocks, so blocks are rows of one array. `values` is
        # the unpadded view: the caller changes it in place, then calls refresh*().
        self.rows = _blocks(values, self.num_blocks, self.BLOCK_KERNELS)
        self.values = self.rows.ravel()[:self.size]
        # within[b, j]: the sum of block b's values before its j-th. One extra row of zeros so
        # that prefix[len] (len a multiple of the block) reads starts[num_blocks] + 0.
        self.within = np.zeros((self.num_blocks + 1, self.BLOCK_KERNELS))
        self.block_totals = np.zeros(self.num_blocks)
        self.starts = np.zeros(self.num_blocks + 1)  # starts[b]: the sum of values before block b
        self.refresh(0, self.size)

    def refresh(self, lo: int, hi: int) -> None:
        """Redo the sums after values[lo:hi] changed."""
        self._redo_blocks(lo, hi)
        self.starts[1:] = np.cumsum(self.block_totals)

    def nonzero_slots(self, lo: int, hi: int) -> np.ndarray:
        """Sorted slots in [lo, hi) whose value is not 0, reading only blocks with a total."""
        block = self.BLOCK_KERNELS
        first = lo // block
        blocks = first + np.flatnonzero(self.block_totals[first:(hi - 1) // block + 1])
        slots = (blocks[:, None] * block + np.arange(block))[self.rows[blocks] != 0]
        return slots[(slots >= lo) & (slots < hi)]

    def refresh_slots(self, slots: np.ndarray) -> None:
        """Redo the sums after values changed at `slots` (and only there)."""
        touched = np.zeros(self.num_blocks, dtype=bool)  # cheaper than np.unique for a few slots
        touched[slots // self.BLOCK_KERNELS] = True
        blocks = np.flatnonzero(touched)
        sums = np.cumsum(self.rows[blocks], axis=1)
        self.within[blocks, 1:] = sums[:, :-1]
        self.block_totals[blocks] = sums[:, -1]
        self.starts[1:] = np.cumsum(self.block_totals)

    def _redo_blocks(self, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        block = self.BLOCK_KERNELS
        first, last = lo // block, (hi - 1) // block + 1
        sums = np.cumsum(self.rows[first:last], axis=1)
        self.within[first:last, 1:] = sums[:, :-1]
        self.block_totals[first:last] = sums[:, -1]

    def at(self, k: np.ndarray) -> np.ndarray:
        """prefix[k] for an array of k in [0, len]."""
        return self.starts[k // self.BLOCK_KERNELS] + self.within.ravel()[k]  # row b, column j = k - b * block

    def searchsorted(self, target: np.ndarray, side: str) -> np.ndarray:
        """np.searchsorted(prefix, target, side), without a flat prefix: the block, then the kernel."""
        # (Called for every evaluation: a few cheap numpy calls, no np.clip / np.where.)
        b = np.minimum(np.maximum(np.searchsorted(self.starts, target, side) - 1, 0), self.num_blocks - 1)
        rows = self.within[b]
        rows += self.starts[b][:, None]
        below = rows < target[:, None] if side == "left" else rows <= target[:, None]
        k = below.sum(axis=1) + b * self.BLOCK_KERNELS
        beyond = target > self.starts[-1] if side == "left" else target >= self.starts[-1]
        return np.minimum(k, self.size) + beyond  # past everything: len + 1, as np.searchsorted says


def _mirror_spans(lo: int, hi: int, num_k: int) -> list[tuple[int, int]]:
    """[start, stop) pieces of [lo, hi) and of its mirror, in absolute positions."""
    if hi <= num_k:
        return [(lo, hi), (lo + num_k, hi + num_k)]
    if lo >= num_k:
        return [(lo, hi), (lo - num_k, hi - num_k)]
    return [(lo, hi), (lo + num_k, 2 * num_k), (0, hi - num_k)]


class Excess:
    """Memory over the budget per kernel slot (mirrored), in blocks that are lowered lazily.

    Note [Blocked excess]
        The planner asks two things, over and over: lower the excess by s over kernels
        [lo, hi) (a pick), and the relief of keeping s bytes away over [lo, hi), the sum of
        min(s, excess[k]) * tau[k] (an evaluation; 20 of them per pick on the H200 traces).
        Windows are long (half an iteration on average), so doing either kernel by kernel costs
        O(N) and at 250k kernels that was most of the planning time.
        Here the slots are cut into blocks of BLOCK_KERNELS, each with its over-budget time,
        its excess mass (excess * tau), its largest and its smallest positive excess. A pick
        lowers a whole block by adding to its `pending` cut when every over-budget kernel in
        it stays over (nothing else about the block changes shape), and only redoes kernel by
        kernel the blocks where some kernel reaches the budget, plus the two ends. A relief
        adds s * (over-budget time) for a whole block whose smallest excess is at least s,
        its excess mass when its largest is at most s, and goes kernel by kernel only in the
        other blocks and the two ends. Blocks with no kernel over budget are skipped outright.
        Excess values stay exact integers (bytes in float64): the lazy cut only postpones a
        subtraction of whole bytes. Only the tau-weighted sums see a different rounding.
    """

    BLOCK_KERNELS = 256

    def __init__(self, excess_bytes: np.ndarray, duration_us: np.ndarray):
        block = self.BLOCK_KERNELS
        self.size = len(excess_bytes)
        self.num_blocks = max(1, -(-self.size // block))
        self.excess_bytes = _blocks(excess_bytes, self.num_blocks, block)  # true = stored - pending where > 0
        self.duration_us = _blocks(duration_us, self.num_blocks, block)
        self.pending_bytes = np.zeros(self.num_blocks)  # bytes still to take from every kernel over budget
        self.over_us = np.zeros(self.num_blocks)        # time of the block's kernels over budget
        self.stored_byte_us = np.zeros(self.num_blocks)    # sum of stored excess * tau (byte*us)
        self.stored_top_bytes = np.zeros(self.num_blocks)     # largest stored excess
        self.stored_floor_bytes = np.zeros(self.num_blocks)   # smallest positive stored excess (inf: none)
        self.over_count = np.zeros(self.num_blocks, dtype=np.int64)
        # First and last slot over budget in each block: a window that covers both covers the
        # block as far as excess goes, whatever it misses of the kernels under budget. So two
        # windows over the same over-budget kernels get the same sums, to the last bit, and
        # ties between periods stay ties.
        self.over_first = np.zeros(self.num_blocks, dtype=np.int64)
        self.over_last = np.zeros(self.num_blocks, dtype=np.int64)
        self._restat(np.arange(self.num_blocks))

    # --- what the planner reads (both mirrors count, hence the halves)

    def over_kernels(self) -> int:
        return int(self.over_count.sum()) // 2

    def mass(self) -> float:
        """Sum over one iteration of excess * tau (byte*us): no period can relieve more."""
        return float((self.stored_byte_us - self.pending_bytes * self.over_us).sum()) / 2

    def max_excess(self) -> float:
        return float((self.stored_top_bytes - self.pending_bytes).max(initial=0.0))

    def values(self) -> np.ndarray:
        """The true excess of every slot (for tests and checks)."""
        over = self.excess_bytes > 0
        return np.where(over, self.excess_bytes - self.pending_bytes[:, None], 0.0).ravel()[:self.size]

    # --- a pick

    def lower_mirrored(self, lo: int, hi: int, nbytes: float) -> None:
        """excess -= nbytes (not below 0) over kernels [lo, hi) and their mirrors."""
        for start, stop in _mirror_spans(lo, hi, self.size // 2):
            self._lower(start, stop, nbytes)

    def _lower(self, lo: int, hi: int, nbytes: float) -> None:
        block = self.BLOCK_KERNELS
        touched = np.arange(lo // block, (hi - 1) // block + 1)
        touched = touched[self.over_count[touched] > 0]  # nothing over budget: nothing to lower
        whole = self._covers(touched, lo, hi)
        stays_over = whole & (self.stored_floor_bytes[touched] - self.pending_bytes[touched] > nbytes)
        self.pending_bytes[touched[stays_over]] += nbytes
        redo = touched[~stays_over]
        if len(redo):
            position = redo[:, None] * block + np.arange(block)
            cut = self.pending_bytes[redo][:, None] + nbytes * ((position >= lo) & (position < hi))
            self.excess_bytes[redo] = np.maximum(self.excess_bytes[redo] - cut, 0.0)  # 0 stays 0
            self.pending_bytes[redo] = 0.0
            self._restat(redo)

    def _restat(self, blocks: np.ndarray) -> None:
        excess_bytes, duration_us = self.excess_bytes[blocks], self.duration_us[blocks]
        over = excess_bytes > 0
        self.over_us[blocks] = (duration_us * over).sum(axis=1)
        self.stored_byte_us[blocks] = (excess_bytes * duration_us).sum(axis=1)
        self.stored_top_bytes[blocks] = excess_bytes.max(axis=1)
        self.stored_floor_bytes[blocks] = np.where(over, excess_bytes, np.inf).min(axis=1)
        self.over_count[blocks] = over.sum(axis=1)
        position = blocks[:, None] * self.BLOCK_KERNELS + np.arange(self.BLOCK_KERNELS)
        self.over_first[blocks] = np.where(over, position, self.size).min(axis=1)
        self.over_last[blocks] = np.where(over, position, -1).max(axis=1)
        self.over_blocks = np.flatnonzero(self.over_count)

    def _covers(self, blocks: np.ndarray, lo, hi) -> np.ndarray:
        """Whether [lo, hi) holds every slot over budget of each block."""
        return (self.over_first[blocks] >= lo) & (self.over_last[blocks] < hi)

    # --- evaluations

    def relief(self, lo: np.ndarray, hi: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Per row, the sum over kernels [lo, hi) of min(nbytes, excess) * tau (byte*us)."""
        row, blk = self._over_blocks_of(lo, hi)
        s, pending, over_us = nbytes[row], self.pending_bytes[blk], self.over_us[blk]
        whole = self._covers(blk, lo[row], hi[row])
        below = s <= self.stored_floor_bytes[blk] - pending  # s from every kernel over budget
        above = s >= self.stored_top_bytes[blk] - pending    # all of the excess
        part = np.where(below, s * over_us, self.stored_byte_us[blk] - pending * over_us)
        mixed = np.flatnonzero(~(whole & (below | above)))
        part[mixed] = self._relief_by_kernel(blk[mixed], lo[row[mixed]], hi[row[mixed]], s[mixed])
        return np.bincount(row, weights=part, minlength=len(lo))

    def _over_blocks_of(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, block) for every block with kernels over budget that meets a row's [lo, hi)."""
        block = self.BLOCK_KERNELS
        first = np.searchsorted(self.over_blocks, lo // block, "left")
        stop = np.searchsorted(self.over_blocks, (hi - 1) // block, "right")
        count = np.maximum(stop - first, 0)
        row = np.repeat(np.arange(len(lo)), count)
        offset = np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)
        return row, self.over_blocks[np.repeat(first, count) + offset]

    def _relief_by_kernel(self, blk: np.ndarray, lo: np.ndarray, hi: np.ndarray, s: np.ndarray) -> np.ndarray:
        start = blk * self.BLOCK_KERNELS  # [lo, hi) in columns of each block row
        column = np.arange(self.BLOCK_KERNELS)
        inside = (column >= (lo - start)[:, None]) & (column < (hi - start)[:, None])
        excess_bytes = np.maximum(self.excess_bytes[blk] - self.pending_bytes[blk][:, None], 0.0)
        return (np.minimum(excess_bytes, s[:, None]) * self.duration_us[blk] * inside).sum(axis=1)


def _blocks(values: np.ndarray, num_blocks: int, block: int) -> np.ndarray:
    """values as rows of `block`, the last one padded with zeros."""
    rows = np.zeros(num_blocks * block)
    rows[:len(values)] = values
    return rows.reshape(num_blocks, block)


def with_mirrors(slots: np.ndarray, num_k: int) -> np.ndarray:
    """slots and their mirrored slots."""
    return np.concatenate((slots, (slots + num_k) % (2 * num_k)))


def padded(values: np.ndarray, size: int) -> np.ndarray:
    """values followed by zeros up to size."""
    out = np.zeros(size)
    out[:len(values)] = values
    return out
