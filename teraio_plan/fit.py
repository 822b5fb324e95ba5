"""The fit pass: the budget holds at every kernel whenever some plan can make it hold.

Note [Fitting at any cost]
The greedy (planner.py) takes only transfers that hide behind kernels; the fill pass
(fill.py) adds more, but only periods long enough for both copies at full rate, in one fixed
order, and then starts some prefetches late. On the 1B trace at 1/4 of its peak that still
left 1,705 kernels over budget by up to 22 GiB: the tensors in the way had idle periods,
just too short (or their paths too busy) for a copy that hides. So plans said fits: false
although each kernel's working set fit, and the runtime evicted on demand instead.

This pass goes over the kernels still over budget in order. At kernel k, every tensor that a
plan entry could have away there (Note [What must stay] in memory.py) and that is not away
yet is a candidate, in one of two ways:
  - a period no entry takes yet: offload after its last use, prefetch before its next use,
    as early and as late as a full-rate copy needs, then stretched to cover k;
  - an entry already planned whose period covers k but whose away window does not: its
    offload_by moves earlier, or its prefetch_at later, to cover k.
Each costs the copy time it can no longer hide, estimated at the path's full rate:
    stall_us = max(0, s / out_rate - time(a+1 .. offload_by))
             + max(0, s / in_rate  - time(prefetch_at .. e-1))
(minus what the entry cost before, for a stretched one). Cheapest per byte first, until k is
within the budget. Claims only fall, so one pass in kernel order is enough, and since every
byte above the floor is some candidate's, the claimed curve ends within the budget whenever
the floor is (a host-only plan can still run out of pool). The simulator waits for the copy-out
wherever the claim needs a tensor gone (a memory stall) and for the copy-in where it arrives
late (an input stall); its stall_ms is the real cost, the estimate only orders candidates and
goes into each entry's reason. The estimate ignores queueing behind other copies.
"""

import numpy as np

from teraio.formats.plan import PlanEntry, PlannerInputs
from teraio.formats.trace import Kind, Trace
from teraio.units import format_bytes
from teraio_plan.bandwidth import path_bytes_per_us
from teraio_plan.memory import REACH_KERNELS
from teraio_plan.periods import Periods, find_periods, iteration_slices, unrolled_prefix_us
from teraio_plan.planner import PlannerResult
from teraio_plan.simulator import unroll_entry


def fit_budget(trace: Trace, inputs: PlannerInputs, result: PlannerResult) -> PlannerResult:
    """`result` plus stall-costing transfers until the claimed curve is within the budget."""
    if len(result.memory_bytes) == 0 or result.memory_bytes.max() <= inputs.budget_bytes:
        return result
    fit = _Fit(trace, inputs, result)
    fit.run()
    return PlannerResult(
        entries=fit.entries(), memory_bytes=fit.claim_bytes, memory_before_bytes=result.memory_before_bytes,
        host_pool_bytes=max(result.host_pool_bytes, int(fit.host_bytes.max(initial=0))),
        ledgers=result.ledgers, capacity=result.capacity, link_bytes=result.link_bytes,
        evaluations=result.evaluations, planned_stall_us=result.planned_stall_us + fit.stall_us)


class _Fit:
    def __init__(self, trace: Trace, inputs: PlannerInputs, result: PlannerResult):
        self.trace, self.inputs, self.num_k = trace, inputs, trace.num_kernels
        self.prefix_us = unrolled_prefix_us(trace.duration_us.astype(np.float64))
        self.p: Periods = find_periods(trace, self.prefix_us)
        self.claim_bytes = result.memory_bytes.astype(np.int64).copy()
        self.old = list(result.entries)
        usable = {"ssd": inputs.num_ssds > 0, "host": inputs.host_mem_bytes > 0}
        rates = {t: path_bytes_per_us(inputs, t) for t in ("ssd", "host") if usable[t]}
        self.rates = {t: r for t, r in rates.items() if min(r) > 0}  # (out, in) bytes per us
        count = len(self.p)
        self.entry_of = np.full(count, -1)          # index into self.old, -1: not planned
        self.tier = np.full(count, "", dtype=object)
        self.offload_by = np.zeros(count, dtype=np.int64)  # unrolled, valid where planned
        self.prefetch_at = np.zeros(count, dtype=np.int64)
        self.host_bytes = np.zeros(self.num_k, dtype=np.int64)
        # Periods the pool had no room for on their only tier: it only fills, so never again.
        self.no_room = np.zeros(count, dtype=bool)
        self.period_of_old = self._index_old()
        self.fresh_tier: dict[int, str] = {}  # period -> tier, for the periods this pass takes
        self.added_us = np.zeros(count)
        self.fitted_at: dict[int, int] = {}  # period -> first kernel it was stretched or taken for
        self.stall_us = 0.0

    def _index_old(self) -> list[int]:
        """The period of each entry planned before this pass (by tensor and last use), with its
        window and tier; the pool it holds is taken."""
        where = {(self.trace.tensor_id[t], int(a)): i for i, (t, a) in enumerate(zip(self.p.tensor, self.p.start))}
        period_of = []
        for j, e in enumerate(self.old):
            i = where[(e.tensor, e.offload_after)]
            _, o, pre, _ = unroll_entry(e, self.num_k)
            self.entry_of[i], self.tier[i], self.offload_by[i], self.prefetch_at[i] = j, e.tier, o, pre
            if e.tier == "host":
                self._occupy(i, e.nbytes)
            period_of.append(i)
        return period_of

    def run(self) -> None:
        budget_bytes = self.inputs.budget_bytes
        for k in np.flatnonzero(self.claim_bytes > budget_bytes):
            excess_bytes = int(self.claim_bytes[k]) - budget_bytes
            if excess_bytes > 0:
                self._relieve(int(k), excess_bytes)

    def _relieve(self, k: int, excess_bytes: int) -> None:
        """Take the cheapest candidates (estimated stall per byte) until kernel k fits."""
        ids, kk = self._candidates(k)
        options = [self._option(ids, kk, tier) for tier in self.rates]
        if not options:
            return
        cost_us = np.min([c for c, _, _ in options], axis=0)
        nbytes = self.p.nbytes[ids]
        order = np.lexsort((ids, -nbytes, cost_us / nbytes))
        for row in order:
            if excess_bytes <= 0:
                break
            if self._take(int(ids[row]), int(kk[row]), k):
                excess_bytes -= int(nbytes[row])

    def _candidates(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Periods whose reach covers kernel k and that are not away there yet, with k unrolled."""
        p = self.p
        kk = np.where(p.start + REACH_KERNELS <= k, k, k + self.num_k)
        reach = (p.start + REACH_KERNELS <= kk) & (kk <= p.end - REACH_KERNELS)
        planned = self.entry_of >= 0
        away = planned & (self.offload_by < kk) & (kk < self.prefetch_at)
        ids = np.flatnonzero(reach & ~away & ~self.no_room)
        return ids, kk[ids]

    def _option(self, ids: np.ndarray, kk: np.ndarray, tier: str):
        """(added stall us, offload_by, prefetch_at) per candidate on `tier` (inf: not this tier)."""
        planned = self.entry_of[ids] >= 0
        natural_o, natural_p = self._natural(ids, tier)
        o = np.where(planned, self.offload_by[ids], natural_o)
        pre = np.where(planned, self.prefetch_at[ids], natural_p)
        new_o, new_p = np.minimum(o, kk - 1), np.maximum(pre, kk + 1)
        cost = self._stall_us(ids, new_o, new_p, tier) - np.where(planned, self._stall_us(ids, o, pre, tier), 0.0)
        cost = np.where(planned & (self.tier[ids] != tier), np.inf, cost)  # a planned entry keeps its tier
        return cost, new_o, new_p

    def _natural(self, ids: np.ndarray, tier: str) -> tuple[np.ndarray, np.ndarray]:
        """Offload done and prefetch start of a lone full-rate copy, within the period."""
        out_rate, in_rate = self.rates[tier]
        s, a, e = self.p.nbytes[ids], self.p.start[ids], self.p.end[ids]
        done = np.searchsorted(self.prefix_us, self.prefix_us[a + 1] + s / out_rate, side="left") - 1
        start = np.searchsorted(self.prefix_us, self.prefix_us[e] - s / in_rate, side="right") - 1
        return np.clip(done, a + 1, e - 1), np.clip(start, a + 1, e - 1)

    def _stall_us(self, ids: np.ndarray, o: np.ndarray, pre: np.ndarray, tier: str) -> np.ndarray:
        out_rate, in_rate = self.rates[tier]
        s, a, e = self.p.nbytes[ids], self.p.start[ids], self.p.end[ids]
        out_hidden_us = self.prefix_us[o + 1] - self.prefix_us[a + 1]
        in_hidden_us = self.prefix_us[e] - self.prefix_us[pre]
        return np.maximum(0.0, s / out_rate - out_hidden_us) + np.maximum(0.0, s / in_rate - in_hidden_us)

    def _take(self, i: int, kk: int, k: int) -> bool:
        """Take or stretch period i to cover kk on its cheapest tier with room; False if none."""
        planned = self.entry_of[i] >= 0
        tiers = [self.tier[i]] if planned else sorted(self.rates, key=lambda t: self._one(i, kk, t)[0])
        for tier in tiers:
            cost_us, o, pre = self._one(i, kk, tier)
            if not np.isfinite(cost_us) or (not planned and tier == "host" and not self._room(i)):
                continue
            self._lower(i, o + 1, pre)
            if not planned:
                self.entry_of[i], self.tier[i] = len(self.old) + len(self.fresh_tier), tier
                self.fresh_tier[i] = tier
                if tier == "host":
                    self._occupy(i, int(self.p.nbytes[i]))
            self.offload_by[i], self.prefetch_at[i] = o, pre
            self.added_us[i] += cost_us
            self.fitted_at.setdefault(i, k)
            self.stall_us += cost_us
            return True
        self.no_room[i] = not planned and tiers == ["host"]
        return False

    def _one(self, i: int, kk: int, tier: str) -> tuple[float, int, int]:
        cost, o, pre = self._option(np.asarray([i]), np.asarray([kk]), tier)
        return float(cost[0]), int(o[0]), int(pre[0])

    def _lower(self, i: int, lo: int, hi: int) -> None:
        """Claim minus the tensor over unrolled kernels [lo, hi), skipping where it is away already."""
        nbytes = int(self.p.nbytes[i])
        if self.entry_of[i] >= 0:
            spans = [(lo, min(hi, self.offload_by[i] + 1)), (max(lo, self.prefetch_at[i]), hi)]
        else:
            spans = [(lo, hi)]
        for a, b in spans:
            for x, y in iteration_slices(int(a), int(b), self.num_k):
                self.claim_bytes[x:y] -= nbytes

    def _room(self, i: int) -> bool:
        held = max((int(self.host_bytes[x:y].max()) for x, y in self._held(i)), default=0)
        return held + int(self.p.nbytes[i]) <= self.inputs.host_mem_bytes

    def _occupy(self, i: int, nbytes: int) -> None:
        for x, y in self._held(i):
            self.host_bytes[x:y] += nbytes

    def _held(self, i: int) -> list[tuple[int, int]]:
        """The pool holds a host entry from the start of its copy-out to its use."""
        return iteration_slices(int(self.p.start[i]) + 1, int(self.p.end[i]), self.num_k)

    # --- the plan's entries

    def entries(self) -> list[PlanEntry]:
        out = [self._stretched(j, e) for j, e in enumerate(self.old)]
        out += [self._fresh(i) for i in self.fresh_tier]
        return out

    def _stretched(self, j: int, e: PlanEntry) -> PlanEntry:
        i = self.period_of_old[j]
        if i not in self.fitted_at:
            return e
        n = self.num_k
        return e.model_copy(update={
            "offload_by": int(self.offload_by[i]) % n, "prefetch_at": int(self.prefetch_at[i]) % n,
            "reason": e.reason + f"; stretched to fit kernel {self.fitted_at[i]}: "
                                 f"about {self.added_us[i] / 1e3:.3g} ms more planned stall"})

    def _fresh(self, i: int) -> PlanEntry:
        p, n, tier = self.p, self.num_k, self.fresh_tier[i]
        t, a, e = int(p.tensor[i]), int(p.start[i]), int(p.end[i])
        k = self.fitted_at[i]
        return PlanEntry(
            tensor=self.trace.tensor_id[t], name=self.trace.tensor_name[t], kind=Kind(int(self.trace.kind[t])).name,
            nbytes=int(p.nbytes[i]), tier=tier, offload_after=a, offload_by=int(self.offload_by[i]) % n,
            prefetch_at=int(self.prefetch_at[i]) % n, needed_by=e % n, wraps=e >= n,
            reason=(f"idle {p.window_us[i] / 1e3:.3g} ms; planned stall to fit kernel {k} "
                    f"({self.trace.op_name(k)}): {format_bytes(p.nbytes[i])} to {tier}, about "
                    f"{self.added_us[i] / 1e3:.3g} ms of its copies cannot be hidden"))
