"""The profiler inside the training process, started by the bootstrap from TERAIO_* settings.

Note [No step]
A script that never calls optimizer.step() (nor teraio_step()) never ends an iteration: the
profile would learn that only when the whole job has run, or never for an endless loop. So
a daemon timer starts at the job's first op on the device, and if no step has ended when
--step-timeout runs out it writes the reason into its status file (which `teraio profile`
prints) and ends the process with NO_STEP_EXIT_CODE. It ends it with os._exit because
the main thread may be anywhere (inside the user's loop, in a C call, under a bare except);
nothing of the job is worth keeping then: no trace was written.
"""

import json
import os
import sys
import threading
from contextlib import nullcontext

import numpy as np
import torch

from teraio import __version__
from teraio.errors import TeraioError
from teraio.formats.common import Producer
from teraio.formats.trace import (
    DeviceInfo, KernelTable, ProfileCap, TensorTable, TraceFile, TraceHeader, _columns_to_trace,
    live_bytes_per_kernel, save_trace, signature_digest,
)
from teraio.walk import OpWalk, WalkListener, activate, deactivate, makes_uninitialized, op_signatures
from teraio_profile.machine_load import MachineLoad
from teraio_profile.recorder import TraceRecorder
from teraio.settings import Settings, rank_path, status_path

NO_STEP_EXIT_CODE = 124   # what `timeout` exits with


class ProfileAgent(WalkListener):
    """`keeper`, when the job is profiled under a cap, is the runtime's budget keeper (Note
    [Profiling under a cap] in teraio_run/capped_profile.py), built by the bootstrap from the
    walk: it makes inputs resident before the clock starts and evicts after it stops."""

    def __init__(self, settings: Settings, make_keeper=None):
        self.settings = settings
        self.device_type = settings.device_type()
        self.recorder = TraceRecorder(self.device_type, settings.warmup, settings.iterations,
                                      settings.steps_per_iteration)
        self.walk = OpWalk(self, self.device_type, settings.steps_per_iteration or 1)
        self.walk.signature_of = op_signatures   # exact and structural (Note [Shapes that vary])
        self.recorder.walk = self.walk
        self.keeper = make_keeper(settings, self.walk) if make_keeper else None
        if self.keeper is not None:
            self.recorder.released_bytes = self.keeper.released_bytes
            self.recorder.rescale_kernel_times = False  # warm-up iterations include the waits
        self.written = None
        self.error: str | None = None   # the one line the launcher says (its status file)
        self._watchdog: threading.Timer | bool = False   # Note [No step]; False until the first op
        # Note [A busy machine under the profiler] in teraio_profile/machine_load.py
        self.machine_load = MachineLoad() if self.device_type == "cpu" else None

    # The agent is the walk's listener and forwards to the recorder, so it can act at the end.
    def before_op(self, k, func, inputs):
        if self.keeper is not None:
            self.recorder.op_waited = self.keeper.before_op(inputs)

    def after_op(self, k, func, inputs, new, signature):
        if self._watchdog is False and (inputs or new):  # the first op that touched the device
            self._watchdog = self._start_watchdog()
        self.recorder.after_op(k, func, inputs, new, signature)
        if self.keeper is not None:
            if new and makes_uninitialized(func):
                self.keeper.hold_unwritten(new)  # Note [Outputs read raw later] in teraio/walk.py
            self.keeper.after_op(inputs, new)

    def relieve_memory(self, inputs, attempt):
        if self.keeper is None:
            return False
        relieved = self.keeper.relieve_memory(inputs, attempt)
        self.recorder.restart_clock()  # the relief is no part of the kernel's time
        return relieved

    def resident(self):
        """`teraio.resident()` while profiling: a no-op unless tensors are moved out (a cap)."""
        return self.keeper.resident() if self.keeper is not None else nullcontext()

    def pin_for_raw_read(self, tensor) -> None:
        if self.keeper is not None:
            self.keeper.pin_for_raw_read(tensor)

    def on_step_end(self):
        self.recorder.on_step_end()

    def _start_watchdog(self) -> threading.Timer | None:
        timeout_s = self.settings.step_timeout_s
        if timeout_s <= 0:
            return None
        timer = threading.Timer(timeout_s, self._no_step_seen, args=(timeout_s,))
        timer.daemon = True   # never keeps a finished job alive
        timer.start()
        return timer

    def _no_step_seen(self, timeout_s: int) -> None:
        """Note [No step]: the timer ran out; stop the job unless a step has ended since."""
        if self.walk.steps:
            return
        reason = (f"no optimizer step was seen in {timeout_s} s after the job's first op on the device: "
                  "profile a script that trains, call teraio.walk.teraio_step() at the end of each "
                  "iteration of a loop without a torch optimizer, or raise --step-timeout (0 = no limit)")
        if not self.write_status(error=reason):
            print(f"teraio: error: {reason}", file=sys.stderr)  # no launcher will say it
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(NO_STEP_EXIT_CODE)

    def on_iteration_end(self, iteration, num_kernels):
        self.recorder.on_iteration_end(iteration, num_kernels)
        if self.machine_load is not None and self.recorder.recording and not self.machine_load.started:
            self.machine_load.start()   # the recorded iterations start now
        if self.keeper is not None:
            self.keeper.on_iteration_end()
        if self.recorder.finished and self.written is None and self.error is None:
            self.written = self._write_or_stop()
            if not self.settings.run_to_completion:
                if self.keeper is None:  # else tensors are out: the walk must bring them back
                    deactivate(self.walk)
                raise SystemExit(0)  # the profile is complete: end the script cleanly

    def steps_in_backward_hint(self) -> str:
        """When the job steps optimizers from inside its backward (one per parameter, from
        gradient hooks), an iteration is that many steps, more than the profiler looks for."""
        steps = max(self.walk.steps_in_backward.values(), default=0)
        if steps <= self.recorder.steps_per_iteration:
            return ""
        return (f"; the job steps {steps} optimizers inside each backward pass (an optimizer per parameter?): "
                f"profile with --steps-per-iteration {steps}")

    def _write_or_stop(self) -> str | None:
        """The trace's path. One that cannot be written (a full disk) ends the job as a
        complete profile does, its reason left in the status file for the launcher's one line:
        raised, it came out of the job's optimizer step with the job's stack above it, and the
        launcher blamed the script. With --run-to-completion training goes on without it."""
        try:
            return self.write()
        except TeraioError as err:
            self.error = f"the trace could not be written: {err}"
        if not self.settings.run_to_completion:
            raise SystemExit(1)
        print(f"teraio: error: {self.error}; training goes on (--run-to-completion)", file=sys.stderr)
        return None

    def write(self) -> str:
        rec = self.recorder
        if not rec.steady():
            counts = [len(sig) for sig in rec.signatures]
            lengths = (f"{counts[0]} ops each" if len(set(counts)) == 1 else   # other ops, as many of them
                       ", ".join(map(str, counts)) + " ops")
            print(f"teraio: warning: profiled iterations ran different op sequences ({lengths}); the "
                  "trace keeps the one most iterations ran, timed over those that ran it (use more "
                  f"--warmup if the job settles later){self.steps_in_backward_hint()}", file=sys.stderr)
        if rec.choice:
            print(f"teraio: {rec.choice}", file=sys.stderr)
        if self.machine_load is not None and (busy := self.machine_load.busy_warning()):
            print(f"teraio: warning: {busy}", file=sys.stderr)
        if self.keeper is not None:
            print(f"teraio: {self.keeper.summary()}; {rec.waited_kernels} of the recorded iteration's "
                  f"{rec.kernels_in_window} kernels waited for data (their times exclude the wait)", file=sys.stderr)
        kernels = rec.kernel_columns()
        tensors = rec.tensor_columns()
        header = self._header(kernels, tensors)
        trace = _columns_to_trace(header, kernels, tensors)
        header = self._with_memory_model(header, trace)
        path = rank_path(self.settings.trace_out, self.settings.rank, self.settings.world_size)
        save_trace(TraceFile(header=header, kernels=KernelTable(**kernels), tensors=TensorTable(**tensors)), path)
        return str(path)

    def _header(self, kernels, tensors) -> TraceHeader:
        s, rec = self.settings, self.recorder
        digest, structure = (signature_digest(kernels[col]) for col in ("signature", "structure"))
        return TraceHeader(
            producer=Producer(teraio=__version__, torch=torch.__version__, cuda=torch.version.cuda),
            command=s.command, world_size=s.world_size, rank=s.rank, device=self._device_info(),
            warmup_iterations=rec.steps_before_window // rec.steps_per_iteration,
            profiled_iterations=s.iterations, steps_per_iteration=rec.steps_per_iteration,
            num_kernels=rec.kernels_in_window, num_tensors=len(tensors["id"]), op_digest=digest,
            structure_digest=structure, compared_iterations=max(1, len(rec.candidates)),
            iteration_ms=round(float(min(rec.warm_iteration_ms() or [np.median(rec.iteration_ms)])), 3),
            kernel_time_scale=round(rec.time_scale, 4),
            gradients_stay_on_device=self.walk.wrapped_in_ddp(),
            timing="cuda_events" if self.device_type == "cuda" else "monotonic_clock",
            profiled_under_cap=self._cap(), largest_op=rec.largest_op(),
        )

    def _cap(self) -> ProfileCap | None:
        if self.keeper is None:
            return None
        return ProfileCap(device_bytes=self.keeper.cap_bytes, host_pool_bytes=self.keeper.host_pool_bytes,
                          waited_kernels=self.recorder.waited_kernels)

    def _device_info(self) -> DeviceInfo:
        if self.device_type != "cuda":
            return DeviceInfo(type="cpu", name="cpu")
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return DeviceInfo(type="cuda", name=props.name, capacity_bytes=props.total_memory)

    def _with_memory_model(self, header: TraceHeader, trace) -> TraceHeader:
        """Untracked bytes (CUDA context aside: workspaces, allocator rounding) and how far the
        traced memory curve is from the allocator's, after subtracting that constant. Under
        a cap the allocator's count is off by positive amounts only (blocks a copy still
        reads, storages that died while out until the iteration ends), so the constant is
        its low end there (measured on the 3B at 1/2: the median said 2.35 GiB against the
        uncapped 66 MiB, and the plan moved 15% more bytes)."""
        if header.device.type != "cuda":
            return header.model_copy(update={"untracked_bytes": self._untraced_live_bytes(trace)})
        gap = trace.device_bytes - live_bytes_per_kernel(trace)
        low_end = header.profiled_under_cap is not None
        untracked = max(0, int(np.percentile(gap, 5) if low_end else np.median(gap)))
        error = float(np.max(np.abs(gap - untracked)) / max(1, int(trace.device_bytes.max())))
        return header.model_copy(update={"untracked_bytes": untracked, "memory_model_max_error": round(error, 4)})

    def _untraced_live_bytes(self, trace) -> int:
        """On the CPU no allocator counts what the trace leaves out: the storages the job holds
        that no op of the recorded iteration touched (batches made before the loop, a list of
        earlier outputs). Alive now, at the iteration's end, they were alive through it; their
        bytes are the CPU's untracked bytes (a plan that said it fit ran 3.6x over its budget
        without them)."""
        traced = set(trace.tensor_id)
        return sum(record.nbytes for record in self.walk.records.values()
                   if record.id not in traced and not record.ref.expired())

    def write_status(self, error: str | None = None) -> bool:
        """Tell the launcher how far this process got (read when no trace appears), in
        iterations of steps_per_iteration steps; `error` is the one line to show. False when
        there is no launcher to tell."""
        walk, rec = self.walk, self.recorder
        path = status_path(self.settings.status_dir)
        error = error or self.error
        if path is None or not (walk.roots or walk.steps or error):
            return False
        p = walk.steps_per_iteration
        needed = rec.needed_iterations
        status = {"iterations": walk.steps // p, "steps": walk.steps, "steps_per_iteration": p, "trace": self.written,
                  "rank": self.settings.rank, "world_size": self.settings.world_size, "needed": needed,
                  "hint": self.steps_in_backward_hint()}
        path.write_text(json.dumps(status | ({"error": error} if error else {})))
        return True


def start(settings: Settings, make_keeper=None) -> ProfileAgent:
    import atexit

    agent = ProfileAgent(settings, make_keeper)
    activate(agent.walk)
    atexit.register(agent.write_status)
    return agent
