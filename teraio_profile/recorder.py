"""Records the trace of a steady-state iteration while the user's script trains.

An iteration is a cycle of optimizer steps, found here unless the user gave its length
(Note [Steady state]). At least `warmup` iterations are skipped, and more until the job is
steady. The next one is the recorded window: every kernel and every storage it touches,
kept only if it ran the ops the job runs most (Note [Which iteration is recorded]). The
`iterations - 1` after it only time their kernels (the trace keeps the median) and watch
the window's tensors die (a gradient freed by the next zero_grad dies in the following
iteration).

Note [Steady state]
Steps first, then iterations. Every step leaves three cheap marks: its op count, whether it
ran a backward op, and a hash of its op signatures. Unless --steps-per-iteration gave it,
the cycle length is the shortest p (up to MAX_AUTO_STEPS_PER_ITERATION) such that the last
2p steps are one block of p steps twice over by op count, the block holds a backward pass
(a step that only applies gradients cannot be a whole iteration; jobs with no backward at
all are exempt) and p divides the steps since the job began (the runtime counts iterations
from the first step: Note [Iteration boundary] in teraio/walk.py). Op counts and not
hashes, so that a job whose shapes change every step (dynamic padding) still shows its
cycle. Two optimizers stepped in one loop give steps of 703 and 8 ops, alternating: p = 2.
A cycle of p > 1 steps must repeat by op structure too (sizes aside, so dynamic padding still
shows it): a mixture of experts that runs only the experts its tokens were routed to has op
counts that follow the data, and a chance A, B, A, B of them made a one-optimizer loop with
gradient accumulation two steps an iteration (its run then counted 8 iterations for 16 steps).
A loop that steps one optimizer after another repeats every k steps, of which only the first
runs a backward: where steps without a backward show it, p may be up to
MAX_OPTIMIZERS_PER_ITERATION (six optimizers stepped after each backward were taken for one
step an iteration, since no cycle up to 4 was found: the trace was one optimizer's step, with
no forward or backward, and a plan for half its peak held a sixth of the job). Without a
cycle after SETTLE_CYCLES times the longest, one step is one iteration. The walk then ends
an iteration every p steps. Recording starts with the next iteration once the warm-up is
over and the last two iterations ran the same ops by structural hash (op names, outputs'
dtypes and ranks: teraio/walk.py op_structure; DDP rebuilds its buckets after the first one;
AdamW makes its state in iteration 0), or after MAX_SETTLE_ITERATIONS more, whatever the job
does then. When those two differ in their exact hashes (shapes), the job's shapes vary
(Note [Shapes that vary]).

Note [Which iteration is recorded]
A job that saves a checkpoint, evaluates or logs every few iterations runs more ops in
those: recorded, such an iteration makes a trace (and a plan) that the job never runs again.
The trace must be the op sequence most iterations run. Recording several candidates in full
and keeping the majority costs the per-op bookkeeping (tensor lives, deaths across the
boundary) once per candidate; instead the hashes every iteration leaves anyway tell which
sequence is common, and only one candidate is recorded at a time: when the recorded
iteration's hash is rarer than another's among the iterations seen since the job settled
(the two that settled it count), its recording is dropped and the next iteration is
recorded instead, at most MAX_SETTLE_ITERATIONS times. The common case costs nothing more;
each atypical iteration costs one more iteration of profiling. Timed iterations that ran
other ops are left out of the kernel times.

Note [Shapes that vary]
A job with dynamic padding, a short last batch or packed sequences runs the same ops in the
same order every iteration with other sizes. The runtime follows a plan in every iteration
of the trace's structure (Note [When the plan is followed] in teraio_run/agent.py), so the
trace must be the iteration that needs the most memory: then the plan holds for the smaller
ones as it is. Such a job (settled on structure, its last two iterations unlike by shape)
records candidates one at a time, as above: a window, one more iteration that watches its
tensors die (a gradient freed by the next zero_grad), then the next window; max(iterations,
MIN_VARYING_CANDIDATES) of them. Each leaves its columns and its peak traced memory (the
trace's memory model, live_bytes_per_kernel); the trace is the one with the highest peak of
those with the job's common structure, timed by its own kernels, and stderr says which one
was kept among how many. Candidates are two iterations apart, so a job whose shapes cycle
with an even period shows only every other phase: if a larger one was missed, the runtime
still follows the plan there and its budget keeper holds the cap. Random lengths (the usual
dynamic padding) are sampled fairly; more --iterations compare more candidates. Jobs whose
shapes do not vary record exactly as before (one window, `iterations` timed).

Note [The largest op of the profile]
The trace is one iteration, and the planner's floor (teraio_plan/memory.py kernel_need_bytes)
is that iteration's largest kernel. A job whose ops follow its data (a depth or a branch
chosen per batch, an evaluation every N steps) runs other iterations that the runtime follows
unplanned, its budget keeper evicting on demand; but no keeper can evict an op's own tensors
while it runs. Six layers instead of two make the foreach optimizer step three times the
size (tests/clients/data_depth.py): a plan for 260 KiB, above the shallow trace's 228 KiB
floor, ran at up to 292 KiB in the deep iterations, and nothing had said so before the run.
So every op the profiler watches, in every iteration from the job's first op to the trace
being written (warm-up, re-recorded and timed ones, candidates not kept), adds up the bytes
of its distinct input and output storages, as the walk hands them over, and the largest is
kept with where it ran (header `largest_op`). No run can hold a budget below it, so `teraio
plan` refuses one in one line that names the iteration and op (teraio_plan/make.py
check_budget), rather than making a plan that warns: the budget is usually the device the
job will train on, the deep batch may come hours into the run, and there it would be out of
memory (or, under a cap, over it) whatever the plan says. No option overrides it, as none
overrides the traced kernel's floor.
It is a lower bound: what never moves beside the op (kind other, allocator workspaces) is
not known outside the recorded iteration, and the untracked bytes cannot be added to it (on
the CPU they are the storages the recorded iteration left untouched, perhaps this op's own).
Cost: one add per storage an op touches, a compare per op; 0.2 us per op next to the walk's
18 or more (docs/profiler.md, Profiling cost). A longer path that the profile never watched
stays unknown: profile past the batches that take it (--warmup, --iterations).
"""

import gc
import time
from collections import deque
import weakref
from collections import Counter
from types import SimpleNamespace

import numpy as np
import torch

from teraio.formats.trace import Kind, live_bytes_per_kernel
from teraio.walk import StorageRecord, WalkListener, cuda_allocated_bytes, movable_other

NOT_FREED = -1
MAX_SETTLE_ITERATIONS = 4
MAX_AUTO_STEPS_PER_ITERATION = 4   # longer cycles: --steps-per-iteration, or steps without a backward (below)
MAX_OPTIMIZERS_PER_ITERATION = 16  # Note [Steady state]: a cycle whose other steps only apply gradients
SETTLE_CYCLES = 3                  # cycles without one before a step is an iteration: one differs, two alike
MIN_VARYING_CANDIDATES = 3        # Note [Shapes that vary]: iterations compared at least
IMMORTAL_KINDS = (Kind.parameter, Kind.optimizer_state)  # owned for the whole run: never watched for death


class _TensorLife:
    """Lifetime of one storage relative to the window iteration."""

    __slots__ = ("record", "uses", "writes", "born", "freed", "watch")

    def __init__(self, record: StorageRecord, born: int):
        self.record = record
        self.uses: list[int] = []
        self.writes: list[bool] = []   # per use: the op wrote it in place (Note [Writes] in teraio/walk.py)
        self.born = born          # kernel in the window; -1 if born before it
        self.freed = NOT_FREED    # absolute kernel count from window start; -1 if alive at end
        self.watch = None         # weak reference to its storage (Note [Deaths])


class _Clock:
    """Per-kernel durations, the walk starting and stopping it around each op's call (OpWalk.
    op_clock): CUDA events on GPU (queued, read at iteration end), else monotonic.

    Note [Kernel time on a held stream]
    Two CUDA events around an op's call time what the stream did between them. When the GPU
    has nothing queued (a job of short kernels, slower still under the profiler's walk) the
    start event runs at once and the interval holds the host's launch time too: a 1B job of
    2,682 kernels stepping in 48.7 ms plainly on the H200 traced 95.3 ms of "kernels". So before
    the start event the clock holds the stream with a spin kernel (torch.cuda._sleep) longer than
    any of the last SPIN_WINDOW ops' calls took on the host: the op's kernels are all queued when
    the start event runs, and the interval is the GPU's own time in them. (Two times the last
    op's call alone was too short: a view's call before a matmul's left 75-91 ms traced for that
    job, and two profiles disagreed by 20%.) The spins add GPU time to the
    recorded iterations only (the warm-up ones that scale kernel times, Note [Kernel time under
    the profiler], run without them); where the queue is full anyway (long kernels) they hide
    behind it. An op that waits for the GPU inside its call (a copy to the host, .item()) still
    times the wait, as before.
    """

    SPIN_OVER_CALL = 3.0      # the spin lasts this many times the longest of the last calls ...
    SPIN_WINDOW = 64          # ... of this many ops ...
    MIN_SPIN_US = 50.0        # ... and at least this long (a launch is ~5-10 us) ...
    MAX_SPIN_US = 3000.0      # ... and at most this (calls that waited for the GPU count as this)

    def __init__(self, device_type: str):
        self.cuda = device_type == "cuda"
        self._pending: list[tuple] = []
        self._start = None
        self.last_us: float | None = None   # the last op's duration (CPU only)
        self._call_t0 = 0
        self._calls_us: deque[float] = deque(maxlen=self.SPIN_WINDOW)  # the last ops' host calls (CUDA)
        self._cycles_per_us: float | None = None

    def start(self) -> None:
        if self.cuda:
            torch.cuda._sleep(self._spin_cycles())  # Note [Kernel time on a held stream]
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        self._call_t0 = time.perf_counter_ns()

    def stop(self) -> None:
        call_us = (time.perf_counter_ns() - self._call_t0) / 1e3
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._start, end))
            self._calls_us.append(min(call_us, self.MAX_SPIN_US))
        else:
            self.last_us = call_us

    def _spin_cycles(self) -> int:
        longest_us = max(self._calls_us, default=0.0)
        spin_us = min(max(self.SPIN_OVER_CALL * longest_us, self.MIN_SPIN_US), self.MAX_SPIN_US)
        if self._cycles_per_us is None:
            self._cycles_per_us = _spin_cycles_per_us()
        return int(spin_us * self._cycles_per_us)

    def collect_us(self) -> list[float]:
        """Durations of the CUDA kernels queued since the last call (waits for them)."""
        if not self._pending:
            return []
        self._pending[-1][1].synchronize()
        durations = [start.elapsed_time(end) * 1e3 for start, end in self._pending]
        self._pending = []
        return durations


def _spin_cycles_per_us() -> float:
    """How many cycles of torch.cuda._sleep the GPU spins per microsecond (timed once)."""
    cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end) * 1e3, 1.0)


class TraceRecorder(WalkListener):
    """Collects kernels and tensor lifetimes; `finished` turns true after the last iteration."""

    def __init__(self, walk_device_type: str, warmup: int, iterations: int, steps_per_iteration: int = 0):
        self.device_type = walk_device_type
        self.warmup = warmup
        self.iterations = iterations
        self.clock = _Clock(walk_device_type)
        self.iteration = 0
        self.walk = None                         # set by the agent
        self._cur_sig: list[int] = []
        self._cur_struct: list[int] = []             # structural signatures (Note [Shapes that vary])
        self._cur_us: list[float] = []
        self._iteration_t0 = self._step_t0 = time.perf_counter()
        self.finished = False
        # Note [Steady state]: per step since the job began
        self.cycle_known = steps_per_iteration > 0   # else found by cycle_length
        self.step_ops: list[int] = []
        self.step_backward: list[bool] = []
        self.step_hashes: list[int] = []
        self.step_structures: list[int] = []
        self.varying = False                         # Note [Shapes that vary]
        self.candidates: list[dict] = []             # their recorded windows, summed up
        self.choice = ""                             # which was kept and why, for stderr
        self.warm_step_ms: list[float] = []          # synchronized wall time of steps before the window
        self._step_start = 0                         # where the current step's ops begin in _cur_sig
        self._backward = False                       # the current step ran a backward op
        self.window: int | None = None               # the recorded iteration (walk numbering), once settled
        self.steps_before_window = 0
        self.cycle_counts: Counter = Counter()       # Note [Which iteration is recorded]
        self.rerecorded = 0
        self.kept: dict | None = None                # the candidate written (Note [Shapes that vary])
        # Note [Profiling under a cap] (teraio_run/capped_profile.py), set by the agent
        self.released_bytes = lambda: 0              # device bytes moved out now
        self.rescale_kernel_times = True             # Note [Kernel time under the profiler]
        self._paused_gc = False                      # Note [Deaths in reference cycles]
        self.op_waited = False                       # the current op waited for an input to come back
        # Note [The largest op of the profile]: its own bytes, and (steps before it, ops of its step before it, func)
        self.largest_op_bytes = 0
        self.largest_op_at: tuple | None = None
        self._reset_window()

    def _reset_window(self) -> None:
        self.lives: dict[int, _TensorLife] = {}  # storage key -> life, window tensors only
        self._freed: list[_TensorLife] = []      # Note [Deaths]: freed since the last op
        self.window_ops: list = []
        self.window_phase: list[int] = []
        self.signatures: list[list[int]] = []    # per profiled iteration
        self.structures: list[int] = []          # the window's structural signatures
        self.durations_us: list[list[float]] = []
        self.device_bytes: list[int] = []
        self.iteration_ms: list[float] = []
        self.kernels_in_window = 0
        self.waited_kernels = 0                  # the window's ops that waited for data

    @property
    def recording(self) -> bool:
        return self.window is not None and self.window <= self.iteration < self.window + self.span

    @property
    def span(self) -> int:
        """Iterations from the window's start until its recording is complete: a varying job
        records the window and watches its tensors die for one more (Note [Shapes that vary])."""
        return 2 if self.varying else self.iterations

    @property
    def needed_iterations(self) -> int | None:
        """Iterations the job must run for the profile to finish, once the window is known."""
        if self.window is None:
            return None
        more = max(0, self.candidates_wanted - len(self.candidates) - 1) if self.varying else 0
        return self.window + self.span * (1 + more)

    @property
    def candidates_wanted(self) -> int:
        return max(self.iterations, MIN_VARYING_CANDIDATES)

    def restart_clock(self) -> None:
        """The op ran out of memory and is retried after memory was relieved: time the retry only."""
        if self.recording:
            self.clock.start()

    def after_op(self, k, func, inputs, new, signature):
        exact, structure = signature   # the walk gives both (teraio.walk.op_signatures)
        self._cur_sig.append(exact)
        self._cur_struct.append(structure)
        if not (self.cycle_known or self._backward):
            self._backward = torch._C._current_autograd_node() is not None
        own_bytes = 0   # Note [The largest op of the profile]; records are distinct, `new` excludes inputs
        for record in inputs:
            own_bytes += record.nbytes
        for record in new:
            own_bytes += record.nbytes
        if own_bytes > self.largest_op_bytes:  # where: in steps, as the cycle may not be known yet
            at = (len(self.step_ops), len(self._cur_sig) - 1 - self._step_start, func)
            self.largest_op_bytes, self.largest_op_at = own_bytes, at
        if not self.recording:
            return
        if not self.clock.cuda:
            self._cur_us.append(self.clock.last_us)
        if self.iteration == self.window:
            self._record_window_op(k, func, inputs, new)
        self._note_deaths(k)

    def _record_window_op(self, k, func, inputs, new):
        self.window_ops.append(func.overloadpacket.__name__)
        self.window_phase.append(int(self.walk.phase()))
        self.waited_kernels += self.op_waited
        if self.device_type == "cuda":  # what the job would hold uncapped (Note [Profiling under a cap])
            self.device_bytes.append(cuda_allocated_bytes() + self.released_bytes())
        wrote = {record.key for record in self.walk.op_written}
        for record in inputs + new:
            life = self.lives.get(record.key)
            if life is None:
                born = k if record.born_iteration == self.iteration else -1
                life = self.lives[record.key] = _TensorLife(record, born)
                if record.kind not in IMMORTAL_KINDS:
                    self._watch(life)
            life.uses.append(k)
            life.writes.append(record.key in wrote)

    def _watch(self, life: _TensorLife) -> None:
        """Note [Deaths]: a window tensor dies at the op after which its storage is first seen
        freed. Scanning every live storage after every op made profiling quadratic in the live
        set (1.8 ms per op for an 800-layer model); instead a weak reference to the storage's
        Python object, which PyTorch keeps for as long as the storage lives, calls back when
        it is freed. That may happen in an autograd thread or inside the garbage collector, so
        the callback only appends; the next op stamps the death."""
        storage = life.record.storage()
        freed = self._freed
        if storage is None:
            freed.append(life)
            return
        life.watch = weakref.ref(storage, lambda _ref: freed.append(life))

    def _note_deaths(self, k):
        freed = self._freed
        if not freed:
            return
        offset = (self.iteration - self.window) * self.kernels_in_window
        n = len(freed)   # callbacks may append meanwhile: they wait for the next op
        pending = freed[:n]
        del freed[:n]
        for life in pending:
            if life.record.ref.expired():
                life.freed = offset + k
            else:  # its Python object died before the storage: watch a new one
                self._watch(life)

    def on_step_end(self):
        signatures = self._cur_sig[self._step_start:]
        self.step_ops.append(len(signatures))
        self.step_hashes.append(hash(tuple(signatures)))
        self.step_structures.append(hash(tuple(self._cur_struct[self._step_start:])))
        self.step_backward.append(self._backward)
        self._step_start, self._backward = len(self._cur_sig), False
        if self.window is None:  # warm-up steps are timed one by one: iterations are not known yet
            self.warm_step_ms.append(self._synchronized_ms(self._step_t0))
            self._step_t0 = time.perf_counter()

    def on_iteration_end(self, iteration, num_kernels):
        if self.recording:
            self._cur_us.extend(self.clock.collect_us())
            self.signatures.append(self._cur_sig)
            self.durations_us.append(self._cur_us)
            now = time.perf_counter()
            self.iteration_ms.append((now - self._iteration_t0) * 1e3)
            if iteration == self.window:
                self.kernels_in_window = num_kernels
                self.structures = self._cur_struct
        if self.window is None:
            self._settle(iteration)
        else:
            self._count_cycle(iteration)
            if self.varying and iteration == self.window + 1:
                self._end_candidate(iteration)
        self._cur_sig, self._cur_struct, self._cur_us, self._step_start = [], [], [], 0
        if self.clock.cuda:
            torch.cuda.synchronize()
        self._iteration_t0 = self._step_t0 = time.perf_counter()
        self.iteration = iteration + 1
        self.walk.op_clock = self.clock if self.recording else None
        self.finished = self.window is not None and self.iteration >= self.window + self.span
        self._collect_cycles_at_boundaries()
        if self.finished and self.varying:
            self._keep_largest()

    def _collect_cycles_at_boundaries(self) -> None:
        """Note [Deaths in reference cycles]: a storage held only by a reference cycle dies when
        the garbage collector runs, and when it runs depends on how many Python objects the
        process made: anything else in the job (the budget keeper of a capped profile, a
        logger) moves those deaths to other ops. While iterations are recorded the collector
        runs at iteration boundaries only, so such deaths land at the same op in every run
        (the next iteration's first); the automatic collector is back once recording ends."""
        if self.recording and not self.finished:
            if gc.isenabled():
                gc.disable()
                self._paused_gc = True
            gc.collect()
        elif self._paused_gc:  # never turns on a collector the job turned off itself
            gc.collect()
            gc.enable()
            self._paused_gc = False

    @property
    def steps_per_iteration(self) -> int:
        return self.walk.steps_per_iteration

    def _settle(self, iteration: int) -> None:
        """Note [Steady state]: find the cycle, then wait for two iterations alike."""
        if not self.cycle_known and not self._find_cycle():
            return
        p, hashes = self.steps_per_iteration, self.step_hashes
        s = len(hashes)
        if s // p < self.warmup:
            return
        structures = self.step_structures
        repeated = s >= 2 * p and structures[s - 2 * p:s - p] == structures[s - p:]
        if repeated or s // p >= self.warmup + MAX_SETTLE_ITERATIONS:
            self.varying = repeated and hashes[s - 2 * p:s - p] != hashes[s - p:]
            self.window, self.steps_before_window = iteration + 1, s
            self.cycle_counts[self._cycle_key()] = 2 if repeated else 1

    def _find_cycle(self) -> bool:
        longest = self._longest_cycle()
        p = cycle_length(self.step_ops, self.step_backward, longest, self.step_structures)
        if p is None and len(self.step_ops) >= self.warmup + SETTLE_CYCLES * longest:
            p = 1  # no cycle: every step is an iteration, whatever the job does then
        if p is None:
            return False
        self.walk.steps_per_iteration = p  # the walk is at a step that p divides (cycle_length)
        self.cycle_known = True
        return True

    def _longest_cycle(self) -> int:
        """Note [Steady state]: a job that trains but has steps without a backward (they only
        apply gradients: several optimizers a loop) may repeat over more steps."""
        recent = self.step_backward[-MAX_OPTIMIZERS_PER_ITERATION:]
        # steps without a backward that recur, not one odd step (a warm-up step on zero gradients),
        # which would stretch the wait for the one-step fallback to SETTLE_CYCLES x 16 steps
        several = any(recent) and recent.count(False) >= 2
        return MAX_OPTIMIZERS_PER_ITERATION if several else MAX_AUTO_STEPS_PER_ITERATION

    def _count_cycle(self, iteration: int) -> None:
        """Note [Which iteration is recorded]: re-record when the window ran uncommon ops."""
        cycle = self._cycle_key()
        self.cycle_counts[cycle] += 1
        if iteration != self.window or self.rerecorded >= MAX_SETTLE_ITERATIONS:
            return
        if self.cycle_counts[cycle] < max(self.cycle_counts.values()):
            self.rerecorded += 1
            self._reset_window()
            self.window, self.steps_before_window = iteration + 1, len(self.step_hashes)

    def _cycle_key(self) -> int:
        """The last iteration's op sequence: exact, or its structure when shapes vary."""
        steps = self.step_structures if self.varying else self.step_hashes
        return hash(tuple(steps[-self.steps_per_iteration:]))

    def _end_candidate(self, iteration: int) -> None:
        """Note [Shapes that vary]: the window has been watched for one more iteration; keep
        what the trace needs of it and record the iteration after next."""
        kernels, tensors = self.kernel_columns(), self.tensor_columns()
        self.candidates.append({
            "window": self.window, "structure": hash(tuple(self.step_structures[
                self.steps_before_window:self.steps_before_window + self.steps_per_iteration])),
            "peak_bytes": _peak_traced_bytes(tensors, self.kernels_in_window),
            "kernels": kernels, "tensors": tensors, "steps_before_window": self.steps_before_window,
            "kernels_in_window": self.kernels_in_window, "iteration_ms": self.iteration_ms[:1],
            "time_scale": self.time_scale, "signatures": self.signatures[:1],
            "waited_kernels": self.waited_kernels})
        if len(self.candidates) < self.candidates_wanted:
            self._reset_window()
            self.window, self.steps_before_window = iteration + 1, len(self.step_hashes)

    def _keep_largest(self) -> None:
        """Of the candidates with the job's common structure, the one with the highest traced
        peak: a plan that fits it fits the smaller ones (the runtime follows those too)."""
        common = self.cycle_counts.most_common(1)[0][0]
        alike = [c for c in self.candidates if c["structure"] == common]
        kept = max(alike or self.candidates, key=lambda c: (c["peak_bytes"], -c["window"]))
        for name in ("steps_before_window", "kernels_in_window", "iteration_ms", "time_scale", "signatures",
                     "waited_kernels"):
            setattr(self, name, kept[name])
        self.kept = kept
        others = ", ".join(f"{c['window']}: {c['peak_bytes'] / 2**20:.1f}" for c in self.candidates if c is not kept)
        # none alike: the ops themselves follow the data (a mixture of experts running the experts it routed to)
        alike_s = f"{len(alike)} with the common op structure" if alike else "each with an op structure of its own"
        self.choice = (f"shapes vary from iteration to iteration: compared {len(self.candidates)} iterations, "
                       f"{alike_s}; kept iteration {kept['window']}, the largest "
                       f"({kept['peak_bytes'] / 2**20:.1f} MiB traced peak; others {others} MiB)")

    def largest_op(self) -> dict | None:
        """Note [The largest op of the profile], for the trace header: None when no op touched the device."""
        if self.largest_op_at is None:
            return None
        steps, in_step, func = self.largest_op_at
        p = self.steps_per_iteration
        iteration, recorded = steps // p, self.steps_before_window // p
        return {"nbytes": self.largest_op_bytes, "iteration": iteration,
                "kernel": sum(self.step_ops[iteration * p:steps]) + in_step, "op": func.overloadpacket.__name__,
                "traced_structure": self._iteration_structure(iteration) == self._iteration_structure(recorded),
                "watched_iterations": len(self.step_ops) // p}

    def _iteration_structure(self, iteration: int) -> int:
        """Hash of the iteration's structural signatures (Note [Shapes that vary]), by its steps."""
        p = self.steps_per_iteration
        return hash(tuple(self.step_structures[iteration * p:(iteration + 1) * p]))

    # ----- assembling the tables -----------------------------------------------------------
    def steady(self) -> bool:
        if self.kept is not None:  # shapes vary by design: the choice is said apart
            return True
        return all(sig == self.signatures[0] for sig in self.signatures)

    def _synchronized_ms(self, t0: float) -> float:
        if self.clock.cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    def warm_iteration_ms(self) -> list[float]:
        """Synchronized wall time of whole warm-up iterations but the first (which makes
        optimizer state), from their steps' times."""
        p, ms = self.steps_per_iteration, self.warm_step_ms
        return [sum(ms[c * p:(c + 1) * p]) for c in range(1, len(ms) // p)]

    def kernel_time_scale(self, event_sum_ms: float) -> float:
        """Note [Kernel time under the profiler]: the walk starts the clock just before an
        op's call and stops it just after (OpWalk.op_clock), so the walk's and the recorder's
        own bookkeeping is no part of a kernel's time. An interval between two CUDA events still
        holds the GPU's idle time while an op's call launches its kernels, which a plain run
        has too, and whatever else the GPU waited for inside the call. On the CPU the ops
        themselves may run slower in the recorded iterations than in the warm-up ones (a busy
        box; on a 2-core machine an LSTM's kernels added up to 1.27 s in a 60 ms iteration), and
        `teraio plan --calibrate` scales them further from a run (PlannerInputs.kernel_time_scale).
        Either way, when a warm-up iteration (after iteration 0, which makes optimizer state) was
        timed and kernel times add up to more, scale them down to it, spreading the excess over
        kernels in proportion: kernels never take longer than the iteration they are in."""
        warm_ms = self.warm_iteration_ms()
        if not warm_ms or event_sum_ms <= 0 or not self.rescale_kernel_times:
            return 1.0
        return min(1.0, min(warm_ms) / event_sum_ms)

    def kernel_columns(self) -> dict:
        if self.kept is not None:
            return self.kept["kernels"]
        op_names = sorted(set(self.window_ops))
        index = {name: i for i, name in enumerate(op_names)}
        num_k = self.kernels_in_window
        # Only iterations that ran the window's op sequence have comparable kernel times.
        same = [d for d, sig in zip(self.durations_us, self.signatures) if sig == self.signatures[0]]
        durations = np.median(np.asarray(same, dtype=np.float64), axis=0)
        self.time_scale = self.kernel_time_scale(float(durations.sum()) / 1e3)
        durations = durations * self.time_scale
        return {
            "op_names": op_names,
            "op": [index[name] for name in self.window_ops],
            "phase": self.window_phase,
            "duration_us": [round(float(d), 3) for d in durations],
            "device_bytes": self.device_bytes or [-1] * num_k,
            "signature": self.signatures[0],
            "structure": self.structures,
        }

    def tensor_columns(self) -> dict:
        if self.kept is not None:
            return self.kept["tensors"]
        num_k = self.kernels_in_window
        lives = sorted(self._kept_lives(), key=lambda life: (life.uses[0], life.record.id))
        cols = {key: [] for key in ("id", "name", "kind", "nbytes", "dtype", "shape", "born", "freed")}
        offsets, uses, writes, movable = [0], [], [], []
        for life in lives:
            record = life.record
            born, freed = self._lifetime(life, num_k)
            for key, value in (("id", record.id), ("name", record.name), ("kind", int(record.kind)),
                               ("nbytes", record.nbytes), ("dtype", record.dtype), ("shape", record.shape),
                               ("born", born), ("freed", freed)):
                cols[key].append(value)
            # what the runtime's keeper will move of what the walk could not name
            movable.append(int(record.kind == Kind.other and not record.pinned and movable_other(record)))
            uses.extend(life.uses)
            writes.extend(int(w) for w in life.writes)
            offsets.append(len(uses))
        cols["use_offsets"], cols["use_kernels"], cols["use_writes"] = offsets, uses, writes
        cols["movable_other"] = movable
        return cols

    def _kept_lives(self):
        """Window tensors, minus carry-ins from warm-up that die inside the window: their
        steady-state twin is the same tensor born in the window and dying after it."""
        return [life for life in self.lives.values() if not (life.born < 0 and life.freed != NOT_FREED)]

    @staticmethod
    def _lifetime(life: _TensorLife, num_k: int) -> tuple[int, int]:
        if life.born < 0:
            return -1, -1
        if life.freed == NOT_FREED:
            return life.born, life.born + num_k  # outlived the profile: assume its twin replaces it
        return life.born, max(life.freed, life.born + 1)


def _peak_traced_bytes(tensors: dict, num_kernels: int) -> int:
    """The most bytes the window's tensors hold at once (the trace's memory model)."""
    columns = SimpleNamespace(num_kernels=num_kernels, num_tensors=len(tensors["nbytes"]),
                              born=np.asarray(tensors["born"], dtype=np.int64),
                              freed=np.asarray(tensors["freed"], dtype=np.int64),
                              nbytes=np.asarray(tensors["nbytes"], dtype=np.int64))
    return int(live_bytes_per_kernel(columns).max(initial=0))


def cycle_length(step_ops: list[int], step_backward: list[bool], longest: int,
                 step_structures: list[int]) -> int | None:
    """Note [Steady state]: the shortest number of steps p <= longest such that the last 2p
    steps are one block of p twice over (by op count, and by op structure where p > 1), the
    block runs a backward op (unless no step has) and p divides the steps so far; None while
    there is none."""
    s = len(step_ops)
    trains = any(step_backward)
    for p in range(1, min(longest, s // 2) + 1):
        if s % p or step_ops[s - 2 * p:s - p] != step_ops[s - p:]:
            continue
        if p > 1 and step_structures[s - 2 * p:s - p] != step_structures[s - p:]:
            continue
        if not trains or any(step_backward[s - p:]):
            return p
    return None
