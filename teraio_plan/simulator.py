"""Event-driven replay of one steady-state iteration under a plan and the bandwidth model.

Kernels run back to back and take their profiled time. Transfers are fluid: whenever one is
issued or finishes, rates are handed out again in priority order, each transfer taking
min(its tier path, its direction's link) of what is left (Note [Bandwidth model]). Priority
is earliest deadline first (an offload's offload_by, a prefetch's kernel before needed_by),
and a prefetch whose kernel is waiting jumps every queue. Before each kernel:
  1. prefetches planned there start (the device buffer is allocated now); one whose offload
     is still running cancels it instead: the tensor never left;
  2. the kernel waits (stall) for any of its tensors still in flight back;
  3. while device memory is over what the plan promises for this kernel (the budget, or the
     planner's own curve where it could not reach the budget) and an offload is still
     running, it waits for it. Waiting beyond the promise would stall a plan that does not
     fit at every kernel for no gain: the runtime falls back to on-demand eviction there.
We replay two iterations and measure the second: the first one warms the wrap-around
traffic (globals offloaded at the end of iteration i come back in iteration i+1).

Note [Host-bound kernels]
The job's thread issues kernel k some host time after kernel k-1; the device runs it once it
is issued and the one before has finished. That time is PyTorch's launch and our walk
(PlannerInputs.host_us_per_kernel), plus host_us_per_copy for each copy started since kernel
k-1 (an offload after k-1 that copies, a prefetch before k; a clean or recompute release
starts none) and host_us_per_replay for each replay before k; all measured by a run (`teraio
plan --calibrate`, Note [Calibration]), so a plan with more actions than the calibrating one
costs more host time (a prefetch that cancels a running offload starts none). While
kernels are longer than that the thread runs ahead and its time is hidden; a run of short
kernels waits for it (the small-batch jobs of issue 16: 7,994 kernels, 173 ms plainly, ~1.2 s
under a plan whose link time was ~0.3 s). With 0 (uncalibrated plans) kernels never wait for
the host.

Note [Device-side waits]
Which stalls hold the thread too, as in the runtime (Note [Stream ordering on CUDA] in
teraio_run/tiers.py): a copy back from the host pool is a stream copy, and the compute stream
waits for its event on the device while the thread goes on issuing; a read from a swap file
runs in an I/O thread, whose future the job's thread waits for; a kernel short of memory waits
for copies out to finish (the allocator, at the cap, synchronizes). Before, every stall held
the thread: on the 3B at 1/4 of its peak, where the thread and the links are both nearly the
bound, the run's own plan with its own figures replayed 18.5% slow (docs/planner.md).
On the CPU the thread runs each kernel itself: nothing runs ahead, host time adds up. Kernels
take the trace's times PlannerInputs.kernel_time_scale (1 unless a CPU run calibrated it).

Note [Replays]
A recompute entry (teraio_plan/recompute.py) moves nothing: its memory is free right after
offload_after, as a clean entry's, and taken again before needed_by, where the device runs the
producing kernel once more: its (scaled) time goes on the compute timeline just before
needed_by, counted as replay time, not as a stall.
"""

import bisect
from dataclasses import dataclass, field

import numpy as np

from teraio.formats.plan import Plan, PlannerInputs
from teraio.formats.trace import Trace
from teraio_plan.bandwidth import IN_PATH, OUT_PATH, rates
from teraio_plan.memory import memory_curve

URGENT = -1  # deadline key of a prefetch that a waiting kernel needs now
_DONE_REL = 1e-9


@dataclass(eq=False)
class _Transfer:
    nbytes: float
    path: str
    link: str
    key: tuple
    outbound: bool
    remaining_bytes: float = 0.0
    bytes_per_us: float = 0.0
    owner: "_Instance | None" = None
    done: bool = False
    cancelled: bool = False

    def __post_init__(self):
        self.remaining_bytes = float(self.nbytes)


@dataclass
class SimResult:
    iteration_ms: float
    ideal_iteration_ms: float
    stall_ms: float
    input_stalls: int           # kernels that waited for a tensor still coming back
    memory_stalls: int          # kernels that waited for an offload to free memory
    peak_bytes: int
    budget_bytes: int
    memory_bytes: np.ndarray    # per kernel, at its start, in the measured iteration
    bytes_by_path: dict[str, int]
    cancelled_offloads: int
    replay_ms: float = 0.0      # kernel time spent replaying recompute entries (Note [Replays])
    host_ms: float = 0.0        # the job's thread's charged time (Note [Host-bound kernels]), hidden or not

    @property
    def share_of_ideal(self) -> float:
        return self.ideal_iteration_ms / self.iteration_ms if self.iteration_ms > 0 else 1.0

    @property
    def over_budget_kernels(self) -> int:
        return int((self.memory_bytes > self.budget_bytes).sum())

    @property
    def max_excess_bytes(self) -> int:
        return max(0, self.peak_bytes - self.budget_bytes)

    @property
    def worst_kernel(self) -> int:
        return int(np.argmax(self.memory_bytes)) if len(self.memory_bytes) else 0


@dataclass
class _Instance:
    """One entry in one iteration: its offload and prefetch transfers."""

    nbytes: int
    tier: str
    clean: bool = False  # leaves without a copy (Note [Clean entries] in clean.py)
    replay_us: float | None = None  # a recompute entry's replay (Note [Replays]); None: a move
    offload: _Transfer | None = None
    prefetch: _Transfer | None = None
    away: bool = False  # the device copy is freed


@dataclass
class _Events:
    before: dict = field(default_factory=dict)   # kernel -> [("prefetch"|"need", inst, deadline)]
    after: dict = field(default_factory=dict)    # kernel -> [(inst, deadline)]


def unroll_entry(entry, num_k: int) -> tuple[int, int, int, int]:
    """(offload_after, offload_by, prefetch_at, needed_by) on one axis from offload_after on:
    the kernels of an entry that wraps past the iteration's end count from the next one."""
    a = entry.offload_after

    def up(x: int) -> int:
        return x + num_k if x <= a else x
    # offload_by == offload_after only in a recompute entry: freed right after a, not a lap later
    offload_by = entry.offload_by if entry.offload_by == a else up(entry.offload_by)
    return a, offload_by, up(entry.prefetch_at), up(entry.needed_by)


def planned_memory(demand_bytes: np.ndarray, plan: Plan) -> np.ndarray:
    """The planner's claim: M[k] minus every tensor planned away over (offload_by, prefetch_at)."""
    num_k = len(demand_bytes)
    diff = np.zeros(2 * num_k + 1, dtype=np.int64)
    for entry in plan.entries:
        _, o, p, _ = unroll_entry(entry, num_k)
        diff[o + 1] -= entry.nbytes
        diff[p] += entry.nbytes
    away = np.cumsum(diff[:2 * num_k])
    return demand_bytes + away[:num_k] + away[num_k:]


class _Sim:
    def __init__(self, trace: Trace, plan: Plan, inputs: PlannerInputs):
        self.num_k = trace.num_kernels
        self.duration_us = trace.duration_us.astype(np.float64) * inputs.kernel_time_scale
        self.host_us_per_kernel = inputs.host_us_per_kernel
        self.host_us_per_copy, self.host_us_per_replay = inputs.host_us_per_copy, inputs.host_us_per_replay
        self.actions_host_us = 0.0  # the plan's actions since the last kernel was issued
        self.host_us = 0.0          # the thread's charged time, for SimResult.host_ms
        self.synchronous = trace.header.device.type == "cpu"   # Note [Host-bound kernels]
        self.demand_bytes = memory_curve(trace, inputs.headroom_bytes)
        self.budget_bytes = inputs.budget_bytes
        self.allowed_bytes = np.maximum(planned_memory(self.demand_bytes, plan), self.budget_bytes)
        r = rates(inputs)
        self.path_bytes_per_us = {p: r.path(p) for p in ("d2s", "s2d", "d2h", "h2d", "out", "in")}
        self.path_bytes_per_us["both"] = r.both  # inf unless the link is shared
        self.clock_us = self.settled_at_us = 0.0
        # One queue per path, sorted by priority. All transfers on a path share its caps, so
        # only each queue's head moves at any time: rates are handed out to four heads.
        self.queues: dict[str, list[tuple]] = {p: [] for p in ("d2s", "s2d", "d2h", "h2d")}
        self.running: list[_Transfer] = []
        self.next_done = (np.inf, None)
        self.offloaded_bytes = 0
        self.seq = 0
        self.events = self._schedule(plan)

    # --- building the event lists

    def _schedule(self, plan: Plan) -> _Events:
        ev, n = _Events(), self.num_k
        for entry in plan.entries:
            a, o, p, e = unroll_entry(entry, n)
            for it in (-1, 0, 1):
                self._schedule_instance(ev, entry, (a, o, p, e), it * n)
        return ev

    def _schedule_instance(self, ev: _Events, entry, times, shift: int) -> None:
        a, o, p, e = (t + shift for t in times)
        end = 2 * self.num_k
        if e < 0 or a >= end:
            return
        inst = _Instance(entry.nbytes, entry.tier, entry.clean)
        if entry.tier == "recompute":
            inst.replay_us = float(self.duration_us[entry.produced_at])  # its producer's time
        if a < 0:  # offloaded in an iteration before the replay: assume it went as planned
            if p < 0:
                return
            inst.away = True
            self.offloaded_bytes += entry.nbytes
        else:
            ev.after.setdefault(a, []).append((inst, o))
        if p < end:
            ev.before.setdefault(p, []).append(("prefetch", inst, e - 1))
        if e < end:
            ev.before.setdefault(e, []).append(("need", inst, e - 1))

    # --- transfers

    def _issue(self, inst: "_Instance", outbound: bool, deadline: int) -> _Transfer:
        path = OUT_PATH[inst.tier] if outbound else IN_PATH[inst.tier]
        # EDF; at equal deadlines prefetches first, then issue order (deterministic).
        self.seq += 1
        key = (deadline, int(outbound), self.seq)
        tr = _Transfer(inst.nbytes, path, "out" if outbound else "in", key, outbound, owner=inst)
        self.actions_host_us += self.host_us_per_copy  # Note [Host-bound kernels]
        self._settle(self.clock_us)
        self._insert(tr)
        self._assign_rates()
        return tr

    def _insert(self, tr: _Transfer) -> None:
        bisect.insort(self.queues[tr.path], (tr.key, tr), key=lambda x: x[0])

    def _remove(self, tr: _Transfer) -> None:
        queue = self.queues[tr.path]
        i = bisect.bisect_left(queue, tr.key, key=lambda x: x[0])
        assert queue[i][1] is tr
        del queue[i]

    def _assign_rates(self) -> None:
        """SSD transfers take the link first, host ones what is left (Note [Bandwidth model])."""
        left_bytes_per_us = dict(self.path_bytes_per_us)
        self.running = []
        for tier_paths in (("d2s", "s2d"), ("d2h", "h2d")):
            heads = [self.queues[p][0][1] for p in tier_paths if self.queues[p]]
            wants = [min(left_bytes_per_us[tr.path], left_bytes_per_us[tr.link]) for tr in heads]
            for tr, rate in zip(heads, _fair_shares(wants, left_bytes_per_us["both"])):
                tr.bytes_per_us = rate
                if rate > 0:
                    for ledger in (tr.path, tr.link, "both"):
                        left_bytes_per_us[ledger] -= rate
                    self.running.append(tr)
        self._next_completion()

    def _next_completion(self) -> None:
        best = (np.inf, None)
        for tr in self.running:
            t_us = self.settled_at_us + tr.remaining_bytes / tr.bytes_per_us
            if t_us < best[0]:
                best = (t_us, tr)
        self.next_done = best

    def _settle(self, t_us: float) -> None:
        dt_us = t_us - self.settled_at_us
        if dt_us > 0:
            for tr in self.running:
                tr.remaining_bytes -= tr.bytes_per_us * dt_us
        self.settled_at_us = max(self.settled_at_us, t_us)

    def _complete_due(self) -> None:
        """Finish every transfer whose bytes are all moved at settled_at."""
        finished = [tr for tr in self.running if tr.remaining_bytes <= _DONE_REL * tr.nbytes + 1e-6]
        if not finished:
            finished = [self.next_done[1]]  # rounding: it was due now
        for tr in finished:
            tr.done, tr.remaining_bytes = True, 0.0
            self._remove(tr)
            if tr.outbound:
                tr.owner.away = True
                self.offloaded_bytes += int(tr.nbytes)
        self._assign_rates()

    def _advance(self, target_us: float) -> None:
        """Move the clock to target, finishing every transfer due on the way."""
        while self.next_done[0] <= target_us:
            self._settle(self.next_done[0])
            self._complete_due()
        self.clock_us = max(self.clock_us, target_us)

    def _advance_one(self) -> bool:
        """Jump to the next completion (a stall); False when nothing is moving."""
        if self.next_done[1] is None:
            return False
        self.clock_us = max(self.clock_us, self.next_done[0])
        self._advance(self.clock_us)
        return True

    # --- the kernel loop

    def _replay(self, inst: _Instance) -> None:
        """Note [Replays]: the memory comes back and the device runs the producer again."""
        if inst.away:
            inst.away = False
            self.offloaded_bytes -= inst.nbytes
            self.replayed_us += inst.replay_us
            self.actions_host_us += self.host_us_per_replay  # Note [Host-bound kernels]
            self._advance(self.clock_us + inst.replay_us)

    def _prefetch(self, inst: _Instance, deadline: int) -> None:
        if inst.replay_us is not None:
            self._replay(inst)
            return
        off = inst.offload
        if off is not None and not off.done:
            # Still copying out: stop, the device copy is intact, nothing to bring back.
            self._settle(self.clock_us)
            self._remove(off)
            off.cancelled = True
            self.cancelled += 1
            self._assign_rates()
            return
        if inst.away:
            inst.away = False
            self.offloaded_bytes -= inst.nbytes
            inst.prefetch = self._issue(inst, False, deadline)
            self._count(inst.prefetch)

    def _wait_for(self, tr: _Transfer) -> bool:
        """Stall until tr is back; it jumps every queue. True when the kernel had to wait."""
        if tr.done:
            return False
        self._settle(self.clock_us)
        self._remove(tr)
        tr.key = (URGENT,) + tr.key[1:]
        self._insert(tr)
        self._assign_rates()
        while not tr.done and self._advance_one():
            pass
        return True

    def _wait_for_memory(self, g: int) -> bool:
        waited = False
        k = g % self.num_k
        while self.demand_bytes[k] - self.offloaded_bytes > self.allowed_bytes[k]:
            if not (self.queues["d2s"] or self.queues["d2h"]) or not self._advance_one():
                break
            waited = True
        return waited

    def _count(self, tr: _Transfer) -> None:
        if self.measuring:
            self.bytes_by_path[tr.path] += int(tr.nbytes)

    def _before_kernel(self, g: int) -> tuple[bool, bool, bool]:
        """(input stall, memory stall, whether the thread waited too: Note [Device-side waits])."""
        self._advance(self.clock_us)
        todo = self.events.before.get(g, ())
        for what, inst, deadline in todo:
            if what == "prefetch":
                self._prefetch(inst, deadline)
        input_stall = thread_waited = False
        for what, inst, _ in todo:
            if what == "need" and inst.prefetch is not None:
                waited = self._wait_for(inst.prefetch)
                input_stall |= waited
                thread_waited |= waited and inst.prefetch.path == "s2d"
        memory_stall = self._wait_for_memory(g)
        return input_stall, memory_stall, thread_waited or memory_stall

    def _after_kernel(self, g: int) -> None:
        for inst, deadline in self.events.after.get(g, ()):
            if inst.clean or inst.replay_us is not None:  # nothing to copy: the device lets go at once
                inst.away = True
                self.offloaded_bytes += inst.nbytes
                continue
            inst.offload = self._issue(inst, True, deadline)
            self._count(inst.offload)

    def _issue_kernel(self, issued_us: float, waited: bool) -> float:
        """Note [Host-bound kernels]: when the thread issues the next kernel; the device
        clock waits for it."""
        host_us, self.actions_host_us = self.host_us_per_kernel + self.actions_host_us, 0.0
        if self.measuring:
            self.host_us += host_us
        if not host_us:
            return issued_us
        waited = waited or self.synchronous
        issued_us = (max(issued_us, self.clock_us) if waited else issued_us) + host_us
        if issued_us > self.clock_us:
            self._advance(issued_us)
        return issued_us

    def run(self) -> SimResult:
        n = self.num_k
        self.cancelled, self.measuring = 0, False
        self.replayed_us = measured_from_us = 0.0
        self.bytes_by_path = {p: 0 for p in ("d2s", "s2d", "d2h", "h2d")}
        memory_bytes = np.zeros(n, dtype=np.int64)
        stalls = [0, 0]
        start_us = stall_us = issued_us = 0.0
        for g in range(2 * n):
            if g == n:
                self.measuring, self.cancelled, start_us = True, 0, self.clock_us
                measured_from_us = self.replayed_us
            ready_us, replayed_before_us = self.clock_us, self.replayed_us
            input_stall, memory_stall, thread_waited = self._before_kernel(g)
            if self.measuring:
                stall_us += self.clock_us - ready_us - (self.replayed_us - replayed_before_us)
                stalls[0] += input_stall
                stalls[1] += memory_stall
                memory_bytes[g - n] = self.demand_bytes[g - n] - self.offloaded_bytes
            issued_us = self._issue_kernel(issued_us, waited=thread_waited)
            self._advance(self.clock_us + self.duration_us[g % n])
            self._after_kernel(g)
        return SimResult(
            iteration_ms=(self.clock_us - start_us) / 1e3, ideal_iteration_ms=float(self.duration_us.sum()) / 1e3,
            stall_ms=stall_us / 1e3, input_stalls=stalls[0], memory_stalls=stalls[1],
            peak_bytes=int(memory_bytes.max()) if n else 0, budget_bytes=self.budget_bytes, memory_bytes=memory_bytes,
            bytes_by_path=self.bytes_by_path, cancelled_offloads=self.cancelled,
            replay_ms=(self.replayed_us - measured_from_us) / 1e3, host_ms=self.host_us / 1e3,
        )


def simulate(trace: Trace, plan: Plan, inputs: PlannerInputs | None = None) -> SimResult:
    """Replay trace + plan; inputs (bandwidths, budget) default to those the plan was made with."""
    return _Sim(trace, plan, inputs or plan.header.inputs).run()


def _fair_shares(wants: list[float], both: float) -> list[float]:
    """Max-min shares of `both` between a tier's directions (at most two), each at most what it
    wants (Note [Bandwidth model]: a shared link); with both = inf, what each wants."""
    if sum(wants) <= both:
        return wants
    if len(wants) == 1:
        return [max(0.0, both)]
    low = min(wants[0], wants[1], both / 2)
    return [low, max(0.0, both - low)] if wants[0] <= wants[1] else [max(0.0, both - low), low]
