"""The greedy planner: the paper's Algorithm 1 with ledgers, two tiers and lazy re-evaluation
(docs/paper.md says what the paper's algorithm does and where this one differs).

Note [Lazy greedy]
    Each pick wants the idle period with the largest benefit per byte. A period's benefit can
    only fall as planning goes on: memory only drops (less excess to relieve) and ledgers only
    fill (the offload finishes later, the prefetch must start earlier). So a value computed
    earlier is an upper bound of the value now, and a max-heap of stale values is enough: pop
    the top, recompute it, take it if it still beats the next stale value, else push it back.
    This picks exactly what rescanning every period would (up to the SSD/host tie rule), while
    most periods are evaluated once. Initial keys come from prefix sums for all periods at once.
"""

import gc
import heapq
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from teraio.formats.plan import PlanEntry, PlannerInputs
from teraio.formats.trace import Kind, Trace
from teraio_plan import ledger
from teraio_plan.bandwidth import IN_PATH, OUT_PATH, TIERS, rates

DIRECTIONS = (("out", OUT_PATH), ("in", IN_PATH))
from teraio_plan.memory import memory_curve
from teraio_plan.periods import Periods, find_periods, unrolled_prefix_us

# Smaller tensors are never moved: each transfer costs a fixed submission latency and runtime
# bookkeeping, and on the committed H200 trace the ones below 1 MiB were half of all entries
# but 0.02% of the bytes moved (they only made plans longer and planning slower). Tiny budgets
# (CPU rehearsals of small models) scale the floor down so their tensors stay candidates.
MIN_OFFLOAD_BYTES = 2**20
MIN_OFFLOAD_BUDGET_SHARE = 1 / 4096
# SSD first (the pinned pool is scarce and shared with the host's own work): keep the SSD
# unless it would relieve less than this share of what the host tier would.
SSD_PREFERENCE = 0.8
PROGRESS_EVERY_PICKS = 64
# Stale periods re-evaluated together (vectorized); doubled while a round finds no winner.
FIRST_BATCH = 8
MAX_BATCH = 1024
# After this many exact evaluations for one pick, take the best found (Note [Lazy greedy]).
MAX_EVALUATIONS_PER_PICK = 32
# Take a re-evaluated period when it is within this factor of the best stale bound: values
# creep down by small amounts after every pick, and insisting on the exact maximum would
# re-evaluate the whole heap over and over for differences nobody can measure.
LAZY_TOLERANCE = 0.9


@dataclass
class Choice:
    tier: str
    per_byte_us: float  # benefit per byte: us of over-budget time relieved, weighted by excess
    offload_by: int
    prefetch_at: int
    why: str


@dataclass
class PlannerResult:
    entries: list[PlanEntry]
    memory_bytes: np.ndarray      # M[k] after the plan, one per kernel (planner's claim)
    memory_before_bytes: np.ndarray
    host_pool_bytes: int
    ledgers: dict[str, np.ndarray]  # residual bytes per kernel slot, per path
    capacity: dict[str, np.ndarray]
    link_bytes: dict[str, np.ndarray]  # both tiers' traffic per kernel slot, per direction
    evaluations: int = 0            # exact period evaluations it took (for the benchmark)
    planned_stall_us: float = 0.0   # stall the fit pass accepted, estimated (Note [Fitting at any cost])


class _Planner:
    def __init__(self, trace: Trace, inputs: PlannerInputs):
        self.trace, self.inputs, self.rates = trace, inputs, rates(inputs)
        self.num_k = trace.num_kernels
        self.budget_bytes = inputs.budget_bytes
        self.duration_us_twice = np.tile(trace.duration_us.astype(np.float64), 2)
        self.prefix_us = unrolled_prefix_us(trace.duration_us)
        self.periods = find_periods(trace, self.prefix_us)
        # A Python copy for the cheap bounds in _refresh() (read one item at a time).
        self.period_bytes_float = self.periods.nbytes.astype(np.float64)
        self.period_bytes = self.period_bytes_float.tolist()
        self.demand_bytes = memory_curve(trace, inputs.headroom_bytes)
        # float64 holds byte counts exactly up to 2**53 (8 PiB). Only the excess over the budget
        # is kept during planning (Note [Blocked excess]); M itself is rebuilt from the picks.
        excess_bytes = np.maximum(self.demand_bytes - self.budget_bytes, 0)
        self.excess = ledger.Excess(np.tile(excess_bytes, 2).astype(np.float64), self.duration_us_twice)
        self._recount()
        self.host_bytes_twice = np.zeros(2 * self.num_k, dtype=np.int64)
        self.capacity = {OUT_PATH[t]: self.duration_us_twice * self.rates.peak(t, True) for t in TIERS}
        self.capacity |= {IN_PATH[t]: self.duration_us_twice * self.rates.peak(t, False) for t in TIERS}
        # Residual bytes per path, in one running sum: a walk is a binary search in it. Every
        # path's ledger lies back to back there (each from a block start), so one search walks
        # the rows of every tier: numpy's cost per call dominates. On a shared link the host's
        # two directions are one ledger (Note [Bandwidth model]).
        self.offset, self.residual = self._residual_ledgers()
        self.ledgers = {path[t]: self.residual.values[self.offset[d, t]:self.offset[d, t] + 2 * self.num_k]
                        for d, path in DIRECTIONS for t in TIERS}
        # What both tiers together put on the link each kernel (never above pcie rate * duration).
        self.link_bytes = {"out": np.zeros_like(self.duration_us_twice), "in": np.zeros_like(self.duration_us_twice)}
        self.tiers = [t for t in TIERS if self._tier_on(t)]
        self.latency_ok = {t: self._fits_latency(t, self.periods) for t in self.tiers}
        self.host_peak_bytes = 0
        self.away: list[tuple[int, int, int]] = []  # (lo, hi, nbytes): kernels a pick is away over
        self.version = 0

    def _residual_ledgers(self) -> tuple[dict[tuple[str, str], int], ledger.RunningSum]:
        """(where each (direction, tier) ledger starts, the running sum holding them all)."""
        segment = ledger.RunningSum.padded_size(2 * self.num_k)
        offset, parts = {}, []
        for d, path in DIRECTIONS:
            for t in TIERS:
                if d == "in" and t == "host" and self.rates.shared:
                    offset[d, t] = offset["out", t]
                    continue
                offset[d, t] = len(parts) * segment
                parts.append(ledger.padded(self.capacity[path[t]], segment))
        return offset, ledger.RunningSum(np.concatenate(parts))

    def _recount(self) -> None:
        """What run() reads after every pick: kernels still over budget, and the excess mass
        (sum of duration * excess over one iteration, byte*us): no period can relieve more, so
        mass / nbytes bounds any period's benefit per byte at O(1) (see _refresh())."""
        self.over_kernels = self.excess.over_kernels()
        self.excess_byte_us = max(0.0, self.excess.mass())

    def _tier_on(self, tier: str) -> bool:
        return self.rates.peak(tier, True) > 0 and self.rates.peak(tier, False) > 0

    # --- the candidates that could ever help, and their first upper bounds (vectorized)

    def initial_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """(period indices, upper bound of benefit per byte) for every period some tier can carry."""
        over = np.tile(self.demand_bytes > self.budget_bytes, 2)
        over_prefix_us = np.concatenate(([0.0], np.cumsum(self.duration_us_twice * over)))
        best = np.zeros(len(self.periods))
        for tier in self.tiers:
            best = np.maximum(best, self._tier_bound(tier, over_prefix_us))
        floor = min(MIN_OFFLOAD_BYTES, self.budget_bytes * MIN_OFFLOAD_BUDGET_SHARE)
        keep = np.flatnonzero((best > 0) & (self.periods.nbytes >= floor))
        return keep, best[keep]

    def _tier_bound(self, tier: str, over_prefix_us: np.ndarray) -> np.ndarray:
        p = self.periods
        t_off = _first_done(self._cap_prefix(tier, True), p.start + 1, p.nbytes)
        t_pre = _last_start(self._cap_prefix(tier, False), p.end, p.nbytes)
        ok = (t_pre - t_off >= 2) & self._fits_latency(tier, p)
        if tier == "host":
            ok &= p.nbytes <= self.inputs.host_mem_bytes
        lo, hi = np.clip(t_off + 1, 0, 2 * self.num_k), np.clip(t_pre, 0, 2 * self.num_k)
        return np.where(ok, over_prefix_us[np.maximum(hi, lo)] - over_prefix_us[lo], 0.0)

    def _cap_prefix(self, tier: str, outbound: bool) -> np.ndarray:
        path = OUT_PATH[tier] if outbound else IN_PATH[tier]
        return np.concatenate(([0.0], np.cumsum(self.capacity[path])))

    def _fits_latency(self, tier: str, p: Periods) -> np.ndarray:
        """Windows shorter than both copies at full rate plus two latencies are never candidates."""
        round_trip_us = p.nbytes / self.rates.peak(tier, True) + p.nbytes / self.rates.peak(tier, False)
        return p.window_us > round_trip_us + 2 * self.inputs.latency_us

    # --- exact evaluation of many periods at once against the current ledgers and memory

    def evaluate(self, i: int) -> Choice | None:
        return self.evaluate_many(np.asarray([i]))[0]

    def evaluate_many(self, ids: np.ndarray) -> list[Choice | None]:
        ok, t_off, t_pre = self._walk_tiers(ids)  # rows tier by tier
        # One relief pass for the viable rows of both tiers.
        lo, hi = t_off[ok] + 1, t_pre[ok]
        nbytes = _stacked(self.period_bytes_float[ids], len(self.tiers))[ok]
        # Only memory actually above the budget counts: at a kernel that is 1 MiB over, taking
        # away 1 GiB relieves 1 MiB, not 1 GiB. The paper's s * time counts the whole size,
        # which favours big tensors over long stretches where little is over budget.
        values = np.full(len(ok), -1.0)  # -1: this tier cannot carry the period
        values[ok] = self.excess.relief(lo, hi, nbytes) / nbytes
        n = len(ids)
        rows = {t: slice(k * n, (k + 1) * n) for k, t in enumerate(self.tiers)}
        return self._choose(n, {t: values[r] for t, r in rows.items()},
                            {t: (t_off[r], t_pre[r]) for t, r in rows.items()})

    def _choose(self, rows: int, value: dict, walks: dict) -> list[Choice | None]:
        """Per row, SSD first unless the host would relieve clearly more (SSD_PREFERENCE)."""
        none = [-1.0] * rows  # a tier that is off carries nothing
        ssd, host = (value[t].tolist() if t in value else none for t in TIERS)
        walk = {t: (t_off.tolist(), t_pre.tolist()) for t, (t_off, t_pre) in walks.items()}
        choices: list[Choice | None] = []
        for row, (on_ssd, on_host) in enumerate(zip(ssd, host)):
            if on_ssd > 0 and (on_host <= 0 or on_ssd >= SSD_PREFERENCE * on_host):
                why = "ssd first" if on_host <= 0 else "ssd first (host would gain little more)"
                choices.append(_choice("ssd", on_ssd, walk["ssd"], row, why))
            elif on_host > 0:
                why = "host: ssd path full in this window" if on_ssd <= 0 else (
                    f"host: ssd would relieve only {on_ssd / on_host:.0%} as much")
                choices.append(_choice("host", on_host, walk["host"], row, why))
            else:
                choices.append(None)
        return choices

    def _walk_tiers(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(viable, offload_by, prefetch_at) per period and tier (rows tier by tier), walking
        each tier's residual ledgers.

        Walks every row, viable or not (the walks of the others are just not read): cheaper than
        selecting rows for each step, since the per-call cost of numpy dominates at these sizes.
        """
        p, tiers = self.periods, self.tiers
        out_at, in_at = (np.repeat([self.offset[d, t] for t in tiers], len(ids)) for d in ("out", "in"))
        start, end = _stacked(p.start[ids], len(tiers)), _stacked(p.end[ids], len(tiers))
        nbytes = _stacked(self.period_bytes_float[ids], len(tiers))
        t_off = ledger.walk_many(self.residual, start + out_at + 1, end + out_at, nbytes, True) - out_at
        t_pre = ledger.walk_many(self.residual, t_off + in_at + 1, end + in_at, nbytes, False) - in_at
        ok = (t_off >= start) & (t_pre - t_off >= 2)  # then t_pre >= 0 too
        ok &= np.concatenate([self.latency_ok[t][ids] for t in tiers])
        if "host" in tiers:
            ok[tiers.index("host") * len(ids):][:len(ids)] &= self._host_room(ids)
        return ok, t_off, t_pre

    def _host_room(self, ids: np.ndarray) -> np.ndarray:
        """Whether the pinned pool can hold each tensor over its whole period."""
        nbytes, pool_bytes = self.periods.nbytes[ids], self.inputs.host_mem_bytes
        room = nbytes + self.host_peak_bytes <= pool_bytes  # the common case: the pool is nowhere near full
        for row in np.flatnonzero(~room & (nbytes <= pool_bytes)):
            i = ids[row]
            a, e = int(self.periods.start[i]), int(self.periods.end[i])
            room[row] = self.host_bytes_twice[a + 1:e].max() + nbytes[row] <= pool_bytes
        return room

    # --- taking a period

    def accept(self, i: int, choice: Choice) -> PlanEntry:
        p, nbytes = self.periods, int(self.periods.nbytes[i])
        a, e, tier = int(p.start[i]), int(p.end[i]), choice.tier
        link = self.link_bytes
        for path, direction, lo, hi, forward in ((OUT_PATH[tier], "out", a + 1, choice.offload_by + 1, True),
                                                 (IN_PATH[tier], "in", choice.prefetch_at, e, False)):
            slots, taken = ledger.reserve(self.residual, lo, hi, nbytes, forward,
                                          self.offset[direction, tier], 2 * self.num_k)
            link[direction][slots] += taken  # slots and taken hold both mirrors
        lo, hi = choice.offload_by + 1, choice.prefetch_at
        self.away.append((lo, hi, nbytes))
        self.excess.lower_mirrored(lo, hi, nbytes)
        self._recount()
        if tier == "host":
            # The pool holds the bytes from the start of the copy-out to the end of the copy-in.
            ledger.mirror_add(self.host_bytes_twice, a + 1, e, nbytes)
            self.host_peak_bytes = max(self.host_peak_bytes, int(self.host_bytes_twice[a + 1:e].max()))
        return self._entry(i, choice)

    def claimed_memory(self) -> np.ndarray:
        """M[k] after the picks so far, exact: the curve without a plan minus what is away."""
        diff = np.zeros(2 * self.num_k + 1)
        for lo, hi, nbytes in self.away:
            diff[lo] -= nbytes
            diff[hi] += nbytes
        away = np.cumsum(diff[:2 * self.num_k])
        return self.demand_bytes + np.rint(away[:self.num_k] + away[self.num_k:]).astype(np.int64)

    def _entry(self, i: int, c: Choice) -> PlanEntry:
        p, t, n = self.periods, int(self.periods.tensor[i]), self.num_k
        a, e = int(p.start[i]), int(p.end[i])
        benefit_gib_ms = c.per_byte_us * int(p.nbytes[i]) / 2**30 / 1e3
        reason = (f"idle {p.window_us[i] / 1e3:.3g} ms, away {self._away_ms(c):.3g} ms, "
                  f"relieves {benefit_gib_ms:.3g} GiB*ms over budget; {c.why}")
        return PlanEntry(
            tensor=self.trace.tensor_id[t], name=self.trace.tensor_name[t],
            kind=Kind(int(self.trace.kind[t])).name, nbytes=int(p.nbytes[i]), tier=c.tier,
            offload_after=a % n, offload_by=c.offload_by % n, prefetch_at=c.prefetch_at % n,
            needed_by=e % n, wraps=e >= n, reason=reason,
        )

    def _away_ms(self, c: Choice) -> float:
        return float(self.prefix_us[c.prefetch_at] - self.prefix_us[c.offload_by + 1]) / 1e3

    def peak(self) -> int:
        """The highest M now (from the excess: M is only kept exact where it is over budget)."""
        if self.over_kernels > 0:
            return self.budget_bytes + int(round(self.excess.max_excess()))
        return int(self.claimed_memory().max()) if self.num_k else 0

    def run(self, progress: Callable[[float], None] | None) -> list[PlanEntry]:
        """Pick periods until the budget holds or nothing viable is left (Note [Lazy greedy])."""
        self.evaluations, self.version = 0, 0
        entries: list[PlanEntry] = []
        first_excess_bytes = self.peak() - self.budget_bytes
        if first_excess_bytes <= 0:
            return entries
        idx, keys = self.initial_keys()
        self.heap = [(-float(k), int(i), -1) for k, i in zip(keys, idx)]  # (-bound, period, version)
        heapq.heapify(self.heap)
        self.taken = [False] * len(self.periods)  # a list: read one item at a time
        self.fresh: dict[int, Choice] = {}
        batch, spent = FIRST_BATCH, 0
        while self.over_kernels > 0 and self._drop_taken():
            pick = self._fresh_pick(spent >= MAX_EVALUATIONS_PER_PICK)
            if pick is None:
                before = self.evaluations
                batch = min(MAX_BATCH, batch * 2) if self._refresh(batch) else batch
                spent += self.evaluations - before
                continue
            spent = 0
            entries.append(self.accept(pick, self.fresh[pick]))
            self.taken[pick], self.version, self.fresh, batch = True, self.version + 1, {}, FIRST_BATCH
            if progress is not None and len(entries) % PROGRESS_EVERY_PICKS == 0:
                progress(min(1.0, 1 - (self.peak() - self.budget_bytes) / first_excess_bytes))
        return entries

    def _drop_taken(self) -> bool:
        while self.heap and self.taken[self.heap[0][1]]:
            heapq.heappop(self.heap)
        return bool(self.heap)

    def _fresh_pick(self, settle: bool) -> int | None:
        """A period evaluated since the last pick that (nearly) beats every stale bound.

        With `settle`, the best evaluated so far: enough work has gone into this pick.
        """
        _, top, stamp = self.heap[0]
        if stamp == self.version:
            return top  # exact now, and at least every other upper bound
        if not self.fresh:
            return None
        best = max(self.fresh, key=lambda i: (self.fresh[i].per_byte_us, -i))
        good = self.fresh[best].per_byte_us >= LAZY_TOLERANCE * -self.heap[0][0]
        return best if good or settle else None

    def _refresh(self, size: int) -> bool:
        """Re-evaluate up to `size` stale periods from the top; True if that was not enough."""
        ids, heap, taken, version, nbytes = [], self.heap, self.taken, self.version, self.period_bytes
        while len(ids) < size and heap and heap[0][2] != version:
            neg, i, _ = heap[0]
            if taken[i]:
                heapq.heappop(heap)
                continue
            # The best other bound, read without popping: one of the root's two children.
            threshold = LAZY_TOLERANCE * -min(heap[1:3])[0] if len(heap) > 1 else -np.inf
            # A cheap bound first: no period relieves more than all the excess mass. (Bounds from
            # block sums over each window were tried: they saved evaluations but sent many more
            # bounds back into the heap, pick after pick, and cost more than they saved.)
            bound = min(-neg, self.excess_byte_us / nbytes[i])
            if bound < threshold:
                heapq.heapreplace(heap, (-bound, i, -1))  # one sift instead of a pop and a push
                continue
            heapq.heappop(heap)
            ids.append(i)
        self.evaluations += len(ids)
        for i, choice in zip(ids, self.evaluate_many(np.asarray(ids, dtype=np.int64))):
            if choice is not None and choice.per_byte_us > 0:  # else it never helps again
                self.fresh[i] = choice
                heapq.heappush(self.heap, (-choice.per_byte_us, i, self.version))
        return bool(self.heap) and self.heap[0][2] != self.version

    def result(self, entries: list[PlanEntry]) -> PlannerResult:
        n = self.num_k
        return PlannerResult(
            entries=entries, memory_bytes=self.claimed_memory(), memory_before_bytes=self.demand_bytes,
            host_pool_bytes=int(self.host_bytes_twice[:n].max()) if n else 0,
            ledgers={k: v[:n].copy() for k, v in self.ledgers.items()},
            capacity={k: v[:n].copy() for k, v in self.capacity.items()},
            link_bytes={k: v[:n].copy() for k, v in self.link_bytes.items()},
        )


def _choice(tier: str, per_byte_us: float, walk: tuple[list[int], list[int]], row: int, why: str) -> Choice:
    t_off, t_pre = walk
    return Choice(tier, per_byte_us, t_off[row], t_pre[row], why)


def _stacked(values: np.ndarray, times: int) -> np.ndarray:
    """values repeated `times` times end to end (np.tile, without its overhead on small arrays)."""
    return np.concatenate([values] * times)


def _first_done(cap_prefix: np.ndarray, lo: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """ledger.walk_many forward on untouched ledgers: first j with cap[lo..j] >= nbytes."""
    need = cap_prefix[lo] + nbytes * (1 - ledger.REL_EPS)
    return np.searchsorted(cap_prefix, need, side="left") - 1


def _last_start(cap_prefix: np.ndarray, hi: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """ledger.walk_many backward on untouched ledgers: last i with cap[i..hi-1] >= nbytes."""
    limit = cap_prefix[hi] - nbytes * (1 - ledger.REL_EPS)
    return np.searchsorted(cap_prefix, limit, side="right") - 1


def plan_entries(trace: Trace, inputs: PlannerInputs,
                 progress: Callable[[float], None] | None = None) -> PlannerResult:
    """Run the greedy planner; the caller checks inputs and wraps the result in a Plan."""
    planner = _Planner(trace, inputs)
    with _collector_paused():
        entries = planner.run(progress)
    result = planner.result(entries)
    result.evaluations = planner.evaluations
    return result


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the greedy runs.

    The greedy makes heap entries and choices by the hundred thousand, none of them in reference
    cycles, and the collector kept rescanning the live ones: about 10% of planning time at 50k
    kernels. Whatever the run leaves is collected as usual once it is back on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
