"""The profiler inside the training process, started by the bootstrap from TERAIO_* settings."""

import hashlib
import json
import sys

import numpy as np
import torch

from teraio import __version__
from teraio.formats.common import Producer
from teraio.formats.trace import (
    DeviceInfo, KernelTable, TensorTable, TraceFile, TraceHeader, _columns_to_trace,
    live_bytes_per_kernel, save_trace,
)
from teraio.walk import OpWalk, WalkListener, activate, deactivate
from teraio_profile.recorder import TraceRecorder
from teraio.settings import Settings, rank_path, status_path


class ProfileAgent(WalkListener):
    def __init__(self, settings: Settings):
        self.settings = settings
        self.device_type = settings.device_type()
        self.recorder = TraceRecorder(self.device_type, settings.warmup, settings.iterations)
        self.walk = OpWalk(self, self.device_type)
        self.recorder.walk = self.walk
        self.written = None

    # The agent is the walk's listener and forwards to the recorder, so it can act at the end.
    def before_op(self, k, func, inputs):
        self.recorder.before_op(k, func, inputs)

    def after_op(self, k, func, inputs, new, signature):
        self.recorder.after_op(k, func, inputs, new, signature)

    def on_iteration_end(self, iteration, num_kernels):
        self.recorder.on_iteration_end(iteration, num_kernels)
        if self.recorder.finished and self.written is None:
            self.written = self.write()
            if not self.settings.run_to_completion:
                deactivate(self.walk)
                raise SystemExit(0)  # the profile is complete: end the script cleanly

    def write(self) -> str:
        rec = self.recorder
        if not rec.steady():
            lengths = ", ".join(str(len(sig)) for sig in rec.signatures)
            print(f"teraio: warning: profiled iterations ran different op sequences ({lengths} ops); the "
                  "trace keeps the first one (use more --warmup if the job settles later)", file=sys.stderr)
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
        digest = hashlib.sha256(np.asarray(kernels["signature"], dtype=np.uint32).tobytes()).hexdigest()[:16]
        return TraceHeader(
            producer=Producer(teraio=__version__, torch=torch.__version__, cuda=torch.version.cuda),
            command=s.command, world_size=s.world_size, rank=s.rank, device=self._device_info(),
            warmup_iterations=rec.window, profiled_iterations=s.iterations,
            num_kernels=rec.kernels_in_window, num_tensors=len(tensors["id"]), op_digest=digest,
            iteration_ms=round(float(min(rec.warm_iteration_ms or [np.median(rec.iteration_ms)])), 3),
            kernel_time_scale=round(rec.time_scale, 4),
            gradients_stay_on_device=self.walk.wrapped_in_ddp(),
            timing="cuda_events" if self.device_type == "cuda" else "monotonic_clock",
        )

    def _device_info(self) -> DeviceInfo:
        if self.device_type != "cuda":
            return DeviceInfo(type="cpu", name="cpu")
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return DeviceInfo(type="cuda", name=props.name, capacity_bytes=props.total_memory)

    @staticmethod
    def _with_memory_model(header: TraceHeader, trace) -> TraceHeader:
        """Untracked bytes (CUDA context aside: workspaces, allocator rounding) and how far the
        traced memory curve is from the allocator's, after subtracting that constant."""
        if header.device.type != "cuda":
            return header
        gap = trace.device_bytes - live_bytes_per_kernel(trace)
        untracked = max(0, int(np.median(gap)))
        error = float(np.max(np.abs(gap - untracked)) / max(1, int(trace.device_bytes.max())))
        return header.model_copy(update={"untracked_bytes": untracked, "memory_model_max_error": round(error, 4)})

    def write_status(self) -> None:
        """Tell the launcher how far this process got (read when no trace appears)."""
        if self.walk.roots or self.walk.iteration:
            path = status_path(self.settings.status_dir)
            if path is not None:
                window = self.recorder.window
                needed = window + self.settings.iterations if window is not None else None
                path.write_text(json.dumps({"iterations": self.walk.iteration, "trace": self.written,
                                            "rank": self.settings.rank, "needed": needed}))


def start(settings: Settings) -> ProfileAgent:
    import atexit

    agent = ProfileAgent(settings)
    activate(agent.walk)
    atexit.register(agent.write_status)
    return agent
