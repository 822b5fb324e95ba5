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
Without a cycle after MAX_SETTLE_STEPS steps, one step is one iteration. The walk then ends
an iteration every p steps. Recording starts with the next iteration once the warm-up is
over and the last two iterations ran the same ops by hash (DDP rebuilds its buckets after
the first one; AdamW makes its state in iteration 0), or after MAX_SETTLE_ITERATIONS more,
whatever the job does then.

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
"""

import time
from collections import Counter

import numpy as np
import torch

from teraio.formats.trace import Kind
from teraio.walk import StorageRecord, WalkListener, cuda_allocated_bytes

NOT_FREED = -1
MAX_SETTLE_ITERATIONS = 4
MAX_AUTO_STEPS_PER_ITERATION = 4   # longer cycles: --steps-per-iteration
MAX_SETTLE_STEPS = 3 * MAX_AUTO_STEPS_PER_ITERATION  # a first cycle that differs, then two alike
IMMORTAL_KINDS = (Kind.parameter, Kind.optimizer_state)  # owned for the whole run: never scanned for death


class _TensorLife:
    """Lifetime of one storage relative to the window iteration."""

    __slots__ = ("record", "uses", "born", "freed")

    def __init__(self, record: StorageRecord, born: int):
        self.record = record
        self.uses: list[int] = []
        self.born = born          # kernel in the window; -1 if born before it
        self.freed = NOT_FREED    # absolute kernel count from window start; -1 if alive at end


class _Clock:
    """Per-kernel durations: CUDA events on GPU (queued, read at iteration end), else monotonic."""

    def __init__(self, device_type: str):
        self.cuda = device_type == "cuda"
        self._pending: list[tuple] = []
        self._t0 = 0

    def start(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        self._t0 = time.perf_counter_ns()
        return None

    def stop(self, start_event) -> float | None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((start_event, end))
            return None
        return (time.perf_counter_ns() - self._t0) / 1e3

    def collect_us(self) -> list[float]:
        """Durations of the CUDA kernels queued since the last call (waits for them)."""
        if not self._pending:
            return []
        self._pending[-1][1].synchronize()
        durations = [start.elapsed_time(end) * 1e3 for start, end in self._pending]
        self._pending = []
        return durations


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
        self._cur_us: list[float] = []
        self._event = None
        self._iteration_t0 = self._step_t0 = time.perf_counter()
        self.finished = False
        self._last_allocated = 0
        # Note [Steady state]: per step since the job began
        self.cycle_known = steps_per_iteration > 0   # else found by cycle_length
        self.step_ops: list[int] = []
        self.step_backward: list[bool] = []
        self.step_hashes: list[int] = []
        self.warm_step_ms: list[float] = []          # synchronized wall time of steps before the window
        self._step_start = 0                         # where the current step's ops begin in _cur_sig
        self._backward = False                       # the current step ran a backward op
        self.window: int | None = None               # the recorded iteration (walk numbering), once settled
        self.steps_before_window = 0
        self.cycle_counts: Counter = Counter()       # Note [Which iteration is recorded]
        self.rerecorded = 0
        self._reset_window()

    def _reset_window(self) -> None:
        self.lives: dict[int, _TensorLife] = {}  # storage key -> life, window tensors only
        self.mortal: list[_TensorLife] = []      # not yet seen freed
        self.window_ops: list = []
        self.window_phase: list[int] = []
        self.signatures: list[list[int]] = []    # per profiled iteration
        self.durations_us: list[list[float]] = []
        self.device_bytes: list[int] = []
        self.iteration_ms: list[float] = []
        self.kernels_in_window = 0

    @property
    def recording(self) -> bool:
        return self.window is not None and self.window <= self.iteration < self.window + self.iterations

    def before_op(self, k, func, inputs):
        if self.recording:
            self._event = self.clock.start()

    def after_op(self, k, func, inputs, new, signature):
        self._cur_sig.append(signature)
        if not (self.cycle_known or self._backward):
            self._backward = torch._C._current_autograd_node() is not None
        if not self.recording:
            return
        duration = self.clock.stop(self._event)
        if duration is not None:
            self._cur_us.append(duration)
        if self.iteration == self.window:
            self._record_window_op(k, func, inputs, new)
        self._note_deaths(k)

    def _record_window_op(self, k, func, inputs, new):
        self.window_ops.append(func.overloadpacket.__name__)
        self.window_phase.append(int(self.walk.phase()))
        if self.device_type == "cuda":
            self.device_bytes.append(cuda_allocated_bytes())
        for record in inputs + new:
            life = self.lives.get(record.key)
            if life is None:
                born = k if record.born_iteration == self.iteration else -1
                life = self.lives[record.key] = _TensorLife(record, born)
                if record.kind not in IMMORTAL_KINDS:
                    self.mortal.append(life)
            life.uses.append(k)

    def _note_deaths(self, k):
        if not self.mortal or not self._maybe_freed():
            return
        offset = (self.iteration - self.window) * self.kernels_in_window
        still = []
        for life in self.mortal:
            if life.record.ref.expired():
                life.freed = offset + k
            else:
                still.append(life)
        self.mortal = still

    def on_step_end(self):
        signatures = self._cur_sig[self._step_start:]
        self.step_ops.append(len(signatures))
        self.step_hashes.append(hash(tuple(signatures)))
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
        if self.window is None:
            self._settle(iteration)
        else:
            self._count_cycle(iteration)
        self._cur_sig, self._cur_us, self._step_start = [], [], 0
        if self.clock.cuda:
            torch.cuda.synchronize()
        self._iteration_t0 = self._step_t0 = time.perf_counter()
        self.iteration = iteration + 1
        self.finished = self.window is not None and self.iteration >= self.window + self.iterations

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
        repeated = s >= 2 * p and hashes[s - 2 * p:s - p] == hashes[s - p:]
        if repeated or s // p >= self.warmup + MAX_SETTLE_ITERATIONS:
            self.window, self.steps_before_window = iteration + 1, s
            self.cycle_counts[hash(tuple(hashes[s - p:]))] = 2 if repeated else 1

    def _find_cycle(self) -> bool:
        p = cycle_length(self.step_ops, self.step_backward, MAX_AUTO_STEPS_PER_ITERATION)
        if p is None and len(self.step_ops) >= self.warmup + MAX_SETTLE_STEPS:
            p = 1  # no cycle: every step is an iteration, whatever the job does then
        if p is None:
            return False
        self.walk.steps_per_iteration = p  # the walk is at a step that p divides (cycle_length)
        self.cycle_known = True
        return True

    def _count_cycle(self, iteration: int) -> None:
        """Note [Which iteration is recorded]: re-record when the window ran uncommon ops."""
        cycle = hash(tuple(self.step_hashes[-self.steps_per_iteration:]))
        self.cycle_counts[cycle] += 1
        if iteration != self.window or self.rerecorded >= MAX_SETTLE_ITERATIONS:
            return
        if self.cycle_counts[cycle] < max(self.cycle_counts.values()):
            self.rerecorded += 1
            self._reset_window()
            self.window, self.steps_before_window = iteration + 1, len(self.step_hashes)

    def _maybe_freed(self) -> bool:
        """On CUDA a storage can only have died if the allocator's count went down; checking
        every live tensor after every op is what makes profiling slow."""
        if self.device_type != "cuda":
            return True
        allocated = cuda_allocated_bytes()
        dropped = allocated < self._last_allocated
        self._last_allocated = allocated
        return dropped

    # ----- assembling the tables -----------------------------------------------------------
    def steady(self) -> bool:
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
        """Note [Kernel time under the profiler]: an interval between two CUDA events also
        holds the GPU's idle time while the recording CPU prepares the next op, so the
        recorded iteration is slower than a real one. When a warm-up iteration (after
        iteration 0, which makes optimizer state) was timed, scale kernel times down so that
        they add up to it, spreading the idle time over kernels in proportion."""
        warm_ms = self.warm_iteration_ms()
        if not self.clock.cuda or not warm_ms or event_sum_ms <= 0:
            return 1.0
        return min(1.0, min(warm_ms) / event_sum_ms)

    def kernel_columns(self) -> dict:
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
        }

    def tensor_columns(self) -> dict:
        num_k = self.kernels_in_window
        lives = sorted(self._kept_lives(), key=lambda life: (life.uses[0], life.record.id))
        cols = {key: [] for key in ("id", "name", "kind", "nbytes", "dtype", "shape", "born", "freed")}
        offsets, uses = [0], []
        for life in lives:
            record = life.record
            born, freed = self._lifetime(life, num_k)
            for key, value in (("id", record.id), ("name", record.name), ("kind", int(record.kind)),
                               ("nbytes", record.nbytes), ("dtype", record.dtype), ("shape", record.shape),
                               ("born", born), ("freed", freed)):
                cols[key].append(value)
            uses.extend(life.uses)
            offsets.append(len(uses))
        cols["use_offsets"], cols["use_kernels"] = offsets, uses
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


def cycle_length(step_ops: list[int], step_backward: list[bool], longest: int) -> int | None:
    """Note [Steady state]: the shortest number of steps p <= longest such that the last 2p
    steps are one block of p twice over (by op count), the block runs a backward op (unless
    no step has) and p divides the steps so far; None while there is none."""
    s = len(step_ops)
    trains = any(step_backward)
    for p in range(1, min(longest, s // 2) + 1):
        if s % p or step_ops[s - 2 * p:s - p] != step_ops[s - p:]:
            continue
        if not trains or any(step_backward[s - p:]):
            return p
    return None
