"""The fill pass: make the budget when stall-free transfers cannot.

Note [Planned stalls]
The greedy planner (planner.py) only takes idle periods whose copies fit in the bandwidth
ledgers without delaying a kernel, and stops when none is left. When the budget is still
exceeded, the runtime would have to keep the cap on its own by evicting tensors it knows
nothing about, which on the H200 thrashed at about 60 GB per iteration. A plan that costs
stalls beats that: this pass keeps picking idle periods regardless of the ledgers, offloading
right after the last use and prefetching as late as the path's raw bandwidth allows, and
lowers the memory curve over each window until the budget holds everywhere. The copies then
queue behind each other; the simulator replays the plan and predicts the stall time, and on
CUDA the caching allocator waits for the copies that free the memory it needs.

Which periods first: the most over-budget time relieved per microsecond of copying (Note [Fill
order]), computed from prefix sums (an upper bound, O(1) per period), checked against the
current curve at pick time.
Which tier: the faster path that still has room (on machines like the H200 the host link
is 30x the disk; on real NVMe arrays the SSDs may be faster).

Note [Fill order]
A period relieves the budget by its bytes times the over-budget time in its window. Its price
is its two copies: each pays `latency_us` and the thread's `host_us_per_copy` (calibrated; 0
unless measured) once, plus its bytes at the path's rate. Ranked by relief per byte alone, the
longest windows came first whatever their size: on the LoRA case recorded on the H200
(bench/results/2026-12-05-lora-calibrated-h200-ed22602, at 1/2 of its peak) the plan started
2,578 copies, about half of them for tensors of under 1 MiB such as a LoRA adapter's 32 KiB
gradient or optimizer state, each ~100 us of the job's thread there; now 1,317. Ranked by
relief per microsecond of copying, large tensors come first and a small one is taken only
while the large ones have not made the budget. The price: where large tensors with shorter
windows stand in for medium ones with longer windows, more bytes move (the mixed 1B golden plan:
fewer copies, a default-rate prediction 4.8% slower). Figures for the committed traces, before
and after, and the command that makes them: docs/planner.md, The fill pass's order.

Note [Late prefetches]
When no idle period is left to take and the curve is still over budget, the excess is often
made of prefetches the greedy pass started early: the stall-free ledger has them queue back
in well before their use (the 3B trace at 1/4 of its peak: 33 GiB of weights and optimizer
state must come back for a short optimizer phase, so they start arriving during gradient
clipping, where every gradient is live). Starting such a prefetch after the over-budget
kernel instead frees its bytes there; the copy then arrives late and the kernel that needs
it waits, a stall the simulator predicts. At each over-budget kernel, in order, the
prefetches with the most time left before their use are pushed back first.
"""

import numpy as np

from teraio.formats.plan import PlanEntry, PlannerInputs
from teraio.formats.trace import Kind, Trace
from teraio.units import format_bytes
from teraio_plan.bandwidth import path_bytes_per_us
from teraio_plan.periods import find_periods, iteration_slices, unrolled_prefix_us
from teraio_plan.planner import PlannerResult



def fill_with_stalls(trace: Trace, inputs: PlannerInputs, result: PlannerResult) -> PlannerResult:
    """`result` plus entries that make the budget at the price of stalls (unchanged if it fits)."""
    memory = result.memory_bytes.astype(np.int64).copy()
    budget_bytes = inputs.budget_bytes
    if len(memory) == 0 or memory.max() <= budget_bytes:
        return result
    pass_ = _Fill(trace, inputs, memory, result)
    entries = pass_.delay_prefetches(result.entries + pass_.run())
    return PlannerResult(
        entries=entries, memory_bytes=pass_.memory_bytes,
        memory_before_bytes=result.memory_before_bytes,
        host_pool_bytes=max(result.host_pool_bytes, int(pass_.host_occupancy.max(initial=0))),
        ledgers=result.ledgers, capacity=result.capacity, link_bytes=result.link_bytes,
        evaluations=result.evaluations)


class _Fill:
    def __init__(self, trace: Trace, inputs: PlannerInputs, memory: np.ndarray, result: PlannerResult):
        self.trace, self.inputs, self.memory_bytes = trace, inputs, memory
        self.num_k = trace.num_kernels
        self.prefix_us = unrolled_prefix_us(trace.duration_us)
        self.duration_us_twice = np.tile(trace.duration_us, 2)
        self.host_occupancy = np.zeros(self.num_k, dtype=np.int64)
        for entry in result.entries:
            if entry.tier == "host":
                self._occupy(entry.offload_after, entry.needed_by + (self.num_k if entry.wraps else 0), entry.nbytes)
        self.taken = {(e.tensor, e.offload_after) for e in result.entries}

    def run(self) -> list[PlanEntry]:
        periods = find_periods(self.trace, self.prefix_us)
        order = self._candidates(periods)
        entries = []
        # Kept up to date by _try over each pick's window, not by a max() over the whole
        # curve per candidate.
        self.over_kernels = int((self.memory_bytes > self.inputs.budget_bytes).sum())
        for i in order:
            if self.over_kernels == 0:
                break
            entry = self._try(periods, int(i))
            if entry is not None:
                entries.append(entry)
        return entries

    def delay_prefetches(self, entries: list[PlanEntry]) -> list[PlanEntry]:
        """`entries` with prefetches started after the kernels still over budget (Note [Late prefetches])."""
        budget_bytes, n = self.inputs.budget_bytes, self.num_k
        if not entries or self.memory_bytes.max() <= budget_bytes:
            return entries
        nbytes = np.array([e.nbytes for e in entries], dtype=np.int64)
        need = np.array([e.needed_by for e in entries], dtype=np.int64)
        prefetch = np.array([e.prefetch_at for e in entries], dtype=np.int64)
        lead = (need - prefetch) % n  # kernels from the prefetch to the use (1 .. n-1)
        late = np.zeros(len(entries), dtype=bool)
        # A prefetch pushed at kernel k frees its bytes over [its old start, k]. Kernels before k
        # are decided already, so that part waits in a difference array; only a range that wraps
        # the iteration reaches kernels still ahead, and those are lowered at once.
        freed_bytes = np.zeros(n + 1, dtype=np.int64)
        for k in np.flatnonzero(self.memory_bytes > budget_bytes):
            excess_bytes = int(self.memory_bytes[k]) - budget_bytes
            if excess_bytes <= 0:
                continue
            into = (k - prefetch) % n  # k's place in each prefetch's lead; present at k if < lead - 1
            candidates = np.flatnonzero(into < lead - 1)
            order = candidates[np.argsort(into[candidates] - lead[candidates], kind="stable")]
            pushed = order[:int(np.searchsorted(np.cumsum(nbytes[order]), excess_bytes)) + 1]  # most lead left first
            self.memory_bytes[k] -= nbytes[pushed].sum()
            for j in pushed[prefetch[pushed] > k]:  # wraps: [old start, n) is still ahead
                self.memory_bytes[prefetch[j]:] -= nbytes[j]
            np.add.at(freed_bytes, np.where(prefetch[pushed] > k, 0, prefetch[pushed]), nbytes[pushed])
            freed_bytes[k] -= nbytes[pushed].sum()
            prefetch[pushed], lead[pushed], late[pushed] = (k + 1) % n, lead[pushed] - into[pushed] - 1, True
        self.memory_bytes -= np.cumsum(freed_bytes)[:n]
        return [e.model_copy(update={"prefetch_at": int(prefetch[j]),
                                     "reason": e.reason + "; prefetch started late to make the budget"})
                if late[j] else e for j, e in enumerate(entries)]

    def _candidates(self, periods) -> np.ndarray:
        """Periods not planned yet that have over-budget time in their window, by relief per
        microsecond of copying (descending; Note [Fill order])."""
        budget_bytes = self.inputs.budget_bytes
        over = np.tile(self.memory_bytes > budget_bytes, 2)
        over_prefix_us = np.concatenate(([0.0], np.cumsum(self.duration_us_twice * over)))
        ids = self.trace.tensor_id
        fresh = np.array([(ids[t], int(a)) not in self.taken for t, a in zip(periods.tensor, periods.start)],
                         dtype=bool)
        over_us = over_prefix_us[periods.end] - over_prefix_us[periods.start + 1]
        nbytes = periods.nbytes.astype(np.float64)
        score = np.where(fresh & (over_us > 0), over_us * nbytes / self._copies_us(nbytes), -1.0)
        order = np.lexsort((periods.start, periods.tensor, -score))
        return order[score[order] > 0]

    def _copies_us(self, nbytes: np.ndarray) -> np.ndarray:
        """What a period's two copies cost on the faster path (Note [Fill order])."""
        inputs = self.inputs
        out_bytes_per_us, in_bytes_per_us = path_bytes_per_us(inputs, "host" if self._host_first() else "ssd")
        fixed_us = 2 * (inputs.latency_us + inputs.host_us_per_copy)
        return fixed_us + nbytes / out_bytes_per_us + nbytes / in_bytes_per_us

    def _try(self, periods, i: int) -> PlanEntry | None:
        nbytes, start, end = int(periods.nbytes[i]), int(periods.start[i]), int(periods.end[i])
        tier = self._tier(nbytes, start, end)
        if tier is None:
            return None
        out_bytes_per_us, in_bytes_per_us = path_bytes_per_us(self.inputs, tier)
        offload_by = max(start + 1, self._first_kernel_after(start, nbytes / out_bytes_per_us))
        prefetch_at = min(end - 1, self._last_kernel_before(end, nbytes / in_bytes_per_us))
        if offload_by >= prefetch_at - 1:
            return None  # too short even at full bandwidth
        budget_bytes = self.inputs.budget_bytes
        window = iteration_slices(offload_by + 1, prefetch_at, self.num_k)
        saved = [self.memory_bytes[a:b] for a, b in window]  # views
        over_before = sum(int((view > budget_bytes).sum()) for view in saved)
        if not over_before:
            return None
        for view in saved:
            view -= nbytes
        self.over_kernels -= over_before - sum(int((view > budget_bytes).sum()) for view in saved)
        if tier == "host":
            self._occupy(start, end, nbytes)
        return self._entry(periods, i, tier, offload_by, prefetch_at)

    def _tier(self, nbytes: int, start: int, end: int) -> str | None:
        """The faster path that has room; the host pool is bounded by --host-mem."""
        if self._host_first() and self._host_room(start, end, nbytes):
            return "host"
        return "ssd" if self.inputs.num_ssds > 0 else None

    def _host_first(self) -> bool:
        """Whether the host pool is the path to try first: there is one, and no faster disks."""
        inputs = self.inputs
        ssd_gbps = inputs.num_ssds * min(inputs.ssd_read_gbps, inputs.ssd_write_gbps)
        return inputs.host_mem_bytes > 0 and (inputs.num_ssds == 0 or inputs.host_gbps >= ssd_gbps)

    def _first_kernel_after(self, start: int, copy_us: float) -> int:
        """The kernel (unrolled) during which a copy started after `start` completes."""
        target = self.prefix_us[start + 1] + copy_us
        return int(min(np.searchsorted(self.prefix_us, target, side="left"), 2 * self.num_k) - 1)

    def _last_kernel_before(self, end: int, copy_us: float) -> int:
        """The latest kernel (unrolled) at which a copy must start to land before `end`."""
        target = self.prefix_us[end] - copy_us
        return int(max(np.searchsorted(self.prefix_us, target, side="right") - 1, 0))

    def _host_room(self, start: int, end: int, nbytes: int) -> bool:
        """A pool slot is held from the copy-out after `start` until the use at `end`."""
        held = iteration_slices(start + 1, end, self.num_k)
        held_bytes = max((int(self.host_occupancy[a:b].max()) for a, b in held), default=0)
        return held_bytes + nbytes <= self.inputs.host_mem_bytes

    def _occupy(self, start: int, end: int, nbytes: int) -> None:
        for a, b in iteration_slices(start + 1, end, self.num_k):
            self.host_occupancy[a:b] += nbytes

    def _entry(self, periods, i: int, tier: str, offload_by: int, prefetch_at: int) -> PlanEntry:
        t, start, end = int(periods.tensor[i]), int(periods.start[i]), int(periods.end[i])
        n = self.num_k
        window_ms = float(periods.window_us[i]) / 1e3
        return PlanEntry(
            tensor=self.trace.tensor_id[t], name=self.trace.tensor_name[t], kind=Kind(self.trace.kind[t]).name,
            nbytes=int(periods.nbytes[i]), tier=tier, offload_after=start, offload_by=offload_by % n,
            prefetch_at=prefetch_at % n, needed_by=end % n, wraps=end >= n,
            reason=(f"idle {window_ms:.3g} ms; planned stall: the budget cannot be met stall-free, "
                    f"{format_bytes(periods.nbytes[i])} to {tier}, the faster path with room"))
