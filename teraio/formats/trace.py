"""The trace: one steady-state training iteration, as kernels and per-storage tensors.

On disk it is msgpack with a header and two column tables (one list per field), so that a
250k-kernel trace decodes into numpy arrays without building an object per record. Kernel
indices are positions in one iteration's op stream (the k-th ATen op is kernel k).

Lifetimes, per tensor, in kernel indices of the recorded iteration (N kernels):
- global tensors (alive across the iteration boundary: parameters, optimizer state, gradients
  kept between steps) have born = freed = -1; their idle period wraps around the boundary;
- intermediates are born at kernel `born` (the op that made them) and freed after kernel
  `freed - 1`, i.e. they hold memory over [born, freed). `freed` may exceed N when the tensor
  dies early in the next iteration (a gradient freed by zero_grad), so memory over
  [born, N) and [0, freed - N) in steady state.
"""

import hashlib
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Literal

import msgpack
import numpy as np
from pydantic import Field

from teraio.formats.common import (
    TRACE_FORMAT, Producer, Strict, atomic_write_bytes, check_version, read_raw, validate,
)
from teraio.errors import FileFormatError

TRACE_SCHEMA_VERSION = 1
SUPPORTED_TRACE_VERSIONS = (1,)
# Ops that allocate without writing (by the kernel table's op names): the runtime keeps what they
# make in place until an op takes it as an input, and plans do not move it before (Note [Outputs
# read raw later] in teraio/walk.py; teraio_plan/periods.py)
UNINITIALIZED_OPS = frozenset({"empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like"})
# Ops that autocast passes through whose kernels run other ops under the caller's autocast state
# (by overload packet name): the walk runs them with that state (Note [Autocast inside an op] in
# teraio/walk.py), a replay cannot (it runs with autocast off), so plans never recompute them.
AUTOCAST_INSIDE_OPS = frozenset({"_transformer_encoder_layer_fwd"})


class Phase(IntEnum):
    forward = 0
    backward = 1
    optimizer = 2
    other = 3


class Kind(IntEnum):
    parameter = 0
    gradient = 1
    optimizer_state = 2
    activation = 3
    other = 4


class DeviceInfo(Strict):
    type: Literal["cpu", "cuda"]
    name: str
    capacity_bytes: int | None = None


class ProfileCap(Strict):
    """How a trace profiled under a cap was made (Note [Profiling under a cap] in
    teraio_run/capped_profile.py): its memory model is still the uncapped demand."""

    device_bytes: int = Field(gt=0)       # --gpu-mem
    host_pool_bytes: int = Field(ge=0)    # where evicted tensors went first (--host-mem)
    waited_kernels: int = Field(ge=0)     # kernels of the recorded iteration whose inputs had to come back


class LargestOp(Strict):
    """The op whose own tensors (the distinct storages of its inputs and outputs) held the most
    bytes among every op the profiler watched, in whichever iteration (Note [The largest op
    of the profile] in teraio_profile/recorder.py): no run of the job can hold a device
    budget below them, planned or not."""

    nbytes: int = Field(ge=0)
    iteration: int = Field(ge=0)      # of the job, from 0 (iteration 0 holds what ran before the first step)
    kernel: int = Field(ge=0)         # the op's index in that iteration
    op: str                           # ATen op name
    # that iteration ran the recorded one's op structure (names, dtypes, ranks): larger
    # shapes then; otherwise other ops (a depth or branch chosen per batch, an evaluation)
    traced_structure: bool
    watched_iterations: int = Field(ge=1)   # iterations the profiler saw whole, 0 .. watched - 1


class TraceHeader(Strict):
    format: Literal["teraio-trace"] = TRACE_FORMAT
    schema_version: int = TRACE_SCHEMA_VERSION
    producer: Producer
    command: list[str]
    world_size: int = 1
    rank: int = 0
    device: DeviceInfo
    warmup_iterations: int
    profiled_iterations: int
    num_kernels: int
    num_tensors: int
    op_digest: str
    iteration_ms: float
    kernel_time_scale: float = 1.0
    untracked_bytes: int = 0
    memory_model_max_error: float | None = None
    # Under DistributedDataParallel the runtime keeps gradients on the device (Note [DDP
    # gradients] in teraio_run/budget.py), so plans must not count on moving them.
    gradients_stay_on_device: bool = False
    timing: Literal["cuda_events", "monotonic_clock"]
    # Optimizer steps per iteration, counted from the job's first step (Note [Iteration
    # boundary] in teraio/walk.py): 2 for a loop that steps two optimizers. Traces written
    # before the field existed had one step per iteration.
    steps_per_iteration: int = Field(1, ge=1)
    # sha256 of the per-kernel structural signatures (teraio/walk.py op_structure), and how
    # many iterations the profiler compared to pick the recorded one (Note [Which iteration
    # is recorded] in teraio_profile/recorder.py). Older traces have neither: "" and 1.
    structure_digest: str = ""
    compared_iterations: int = Field(1, ge=1)
    profiled_under_cap: ProfileCap | None = None   # None: the job ran uncapped
    largest_op: LargestOp | None = None   # None in traces written before it existed


class KernelTable(Strict):
    """Columns, one entry per kernel. `op` indexes `op_names`."""

    op_names: list[str]
    op: list[int]
    phase: list[int]
    duration_us: list[float]
    device_bytes: list[int]
    signature: list[int]
    structure: list[int] = Field(default_factory=list)   # empty in traces written before it


class TensorTable(Strict):
    """Columns, one entry per storage. Uses are CSR: kernels use_kernels[use_offsets[i]:use_offsets[i+1]]."""

    id: list[str]
    name: list[str]
    kind: list[int]
    nbytes: list[int]
    dtype: list[str]
    shape: list[list[int]]
    born: list[int]
    freed: list[int]
    use_offsets: list[int]
    use_kernels: list[int]
    use_writes: list[int] = Field(default_factory=list, description="1 where the use wrote the storage in "
                                  "place (the op's schema marks it written), aligned with use_kernels; empty "
                                  "in traces written before it (writes unknown)")
    movable_other: list[int] = Field(default_factory=list, description="1 where a storage of kind other may "
                                     "move (an op the walk saw made it, or torch.load did, in a job with no "
                                     "process group: Note [Storages the job made] in teraio/walk.py), one "
                                     "per tensor; empty in traces written before it (none may)")


class TraceFile(Strict):
    """The whole file; used for the JSON Schema and for writing, never per record on load."""

    header: TraceHeader
    kernels: KernelTable
    tensors: TensorTable


@dataclass
class Trace:
    """A loaded trace: validated header, numpy columns."""

    header: TraceHeader
    op_names: list[str]
    kernel_op: np.ndarray        # int32, index into op_names
    kernel_phase: np.ndarray     # int8, Phase
    duration_us: np.ndarray      # float64
    device_bytes: np.ndarray     # int64, allocator bytes after the kernel (-1 on CPU)
    signature: np.ndarray        # uint32, op name + output shapes
    tensor_id: list[str]
    tensor_name: list[str]
    kind: np.ndarray             # int8, Kind
    nbytes: np.ndarray           # int64
    dtype: list[str]
    shape: list[list[int]]
    born: np.ndarray             # int64, -1 for global
    freed: np.ndarray            # int64, -1 for global
    use_offsets: np.ndarray      # int64, len num_tensors + 1
    use_kernels: np.ndarray      # int64, sorted within each tensor
    # bool per use: the op wrote the storage in place; empty in traces written before it
    use_writes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # bool per tensor: kind other that may move anyway; empty in traces written before it
    movable_other: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # uint32 per kernel, op name + output dtypes and ranks (teraio/walk.py op_structure);
    # empty in traces written before it
    structure: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))

    @property
    def num_kernels(self) -> int:
        return len(self.duration_us)

    @property
    def num_tensors(self) -> int:
        return len(self.nbytes)

    def uses(self, i: int) -> np.ndarray:
        return self.use_kernels[self.use_offsets[i]:self.use_offsets[i + 1]]

    def is_global(self) -> np.ndarray:
        return self.born < 0

    def op_name(self, k: int) -> str:
        return self.op_names[self.kernel_op[k]]

    def columns_unlike(self, other: "Trace") -> list[str]:
        """Columns that say what the job does (ops, tensors, sizes, lifetimes, uses) in which the
        two traces differ; measured ones (kernel times, allocator bytes) aside. Empty: the same job."""
        unlike = []
        for name in JOB_COLUMNS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(mine, np.ndarray):
                same = mine.shape == theirs.shape and bool(np.array_equal(mine, theirs))
            else:
                same = mine == theirs
            if not same:
                unlike.append(name)
        return unlike


JOB_COLUMNS = ("op_names", "kernel_op", "kernel_phase", "signature", "structure", "tensor_id", "tensor_name",
               "kind", "nbytes", "dtype", "shape", "born", "freed", "use_offsets", "use_kernels", "use_writes",
               "movable_other")


def signature_digest(signatures) -> str:
    """The 16-hex-digit sha256 of per-kernel uint32 signatures (exact or structural): the
    trace header's op_digest and structure_digest, which the runtime compares an iteration
    with."""
    return hashlib.sha256(np.asarray(signatures, dtype=np.uint32).tobytes()).hexdigest()[:16]


# Note [Following before learning] in teraio_run/trust.py: the signatures of a plan's iteration
# in runs of this many kernels (the last one shorter), one signature_digest each
CHUNK_KERNELS = 64


def chunk_digests(trace: Trace) -> str:
    """signature_digest of each run of CHUNK_KERNELS of the trace's signatures (structural
    where it has a structure digest, as the runtime compares), concatenated (16 hex digits each)."""
    signatures = trace.structure if trace.header.structure_digest else trace.signature
    return "".join(signature_digest(signatures[lo:lo + CHUNK_KERNELS])
                   for lo in range(0, len(signatures), CHUNK_KERNELS))


def save_trace(trace_file: TraceFile, path: str | Path) -> None:
    raw = trace_file.model_dump(mode="python")
    for optional in ("profiled_under_cap", "largest_op"):  # absent, as in traces written before they existed
        if raw["header"][optional] is None:
            del raw["header"][optional]
    if not raw["tensors"]["use_writes"] and raw["tensors"]["use_kernels"]:  # likewise
        del raw["tensors"]["use_writes"]
    if not raw["tensors"]["movable_other"]:  # likewise
        del raw["tensors"]["movable_other"]
    data = msgpack.packb(raw, use_bin_type=True)
    atomic_write_bytes(path, data)


def load_trace(path: str | Path) -> Trace:
    raw = read_raw(path)
    check_version(raw, path, TRACE_FORMAT, SUPPORTED_TRACE_VERSIONS)
    header = validate(TraceHeader, raw["header"], path)
    try:
        return _columns_to_trace(header, raw["kernels"], raw["tensors"])
    except (KeyError, TypeError, ValueError) as err:
        raise FileFormatError(f"{path} is damaged ({err}): re-profile to regenerate it") from None


def _columns_to_trace(header: TraceHeader, kernels: dict, tensors: dict) -> Trace:
    num_k, num_t = header.num_kernels, header.num_tensors
    trace = Trace(
        header=header,
        op_names=list(kernels["op_names"]),
        kernel_op=np.asarray(kernels["op"], dtype=np.int32),
        kernel_phase=np.asarray(kernels["phase"], dtype=np.int8),
        duration_us=np.asarray(kernels["duration_us"], dtype=np.float64),
        device_bytes=np.asarray(kernels["device_bytes"], dtype=np.int64),
        signature=np.asarray(kernels["signature"], dtype=np.uint32),
        structure=np.asarray(kernels.get("structure", []), dtype=np.uint32),
        tensor_id=list(tensors["id"]),
        tensor_name=list(tensors["name"]),
        kind=np.asarray(tensors["kind"], dtype=np.int8),
        nbytes=np.asarray(tensors["nbytes"], dtype=np.int64),
        dtype=list(tensors["dtype"]),
        shape=list(tensors["shape"]),
        born=np.asarray(tensors["born"], dtype=np.int64),
        freed=np.asarray(tensors["freed"], dtype=np.int64),
        use_offsets=np.asarray(tensors["use_offsets"], dtype=np.int64),
        use_kernels=np.asarray(tensors["use_kernels"], dtype=np.int64),
        use_writes=np.asarray(tensors.get("use_writes", []), dtype=bool),
        movable_other=np.asarray(tensors.get("movable_other", []), dtype=bool),
    )
    _check_shapes(trace, num_k, num_t)
    return trace


def _check_shapes(trace: Trace, num_k: int, num_t: int) -> None:
    kernel_cols = (trace.kernel_op, trace.kernel_phase, trace.duration_us, trace.device_bytes, trace.signature)
    tensor_cols = (trace.tensor_id, trace.tensor_name, trace.kind, trace.nbytes, trace.dtype,
                   trace.shape, trace.born, trace.freed)
    if any(len(c) != num_k for c in kernel_cols) or len(trace.structure) not in (0, num_k):
        raise ValueError("kernel columns disagree with header.num_kernels")
    if any(len(c) != num_t for c in tensor_cols) or len(trace.use_offsets) != num_t + 1:
        raise ValueError("tensor columns disagree with header.num_tensors")
    if trace.use_offsets[-1] != len(trace.use_kernels):
        raise ValueError("use_offsets does not cover use_kernels")
    if len(trace.use_writes) not in (0, len(trace.use_kernels)):
        raise ValueError("use_writes does not match use_kernels")
    if len(trace.movable_other) not in (0, num_t):
        raise ValueError("movable_other disagrees with header.num_tensors")
    if len(trace.use_kernels) and (trace.use_kernels.min() < 0 or trace.use_kernels.max() >= num_k):
        raise ValueError("a tensor use points outside the kernel list")
    if len(trace.kernel_op) and (trace.kernel_op.min() < 0 or trace.kernel_op.max() >= len(trace.op_names)):
        raise ValueError("a kernel op points outside op_names")
    if not np.all(np.isfinite(trace.duration_us)) or (len(trace.duration_us) and trace.duration_us.min() < 0):
        raise ValueError("a kernel time is not a finite number of microseconds >= 0")
    if len(trace.nbytes) and trace.nbytes.min() < 0:
        raise ValueError("a tensor has a negative size")


def trace_to_file(trace: Trace) -> TraceFile:
    """The inverse of loading: for writing a trace built or transformed in memory."""
    return TraceFile(
        header=trace.header,
        kernels=KernelTable(
            op_names=trace.op_names, op=trace.kernel_op.tolist(), phase=trace.kernel_phase.tolist(),
            duration_us=trace.duration_us.tolist(), device_bytes=trace.device_bytes.tolist(),
            signature=trace.signature.tolist(), structure=trace.structure.tolist(),
        ),
        tensors=TensorTable(
            id=trace.tensor_id, name=trace.tensor_name, kind=trace.kind.tolist(),
            nbytes=trace.nbytes.tolist(), dtype=trace.dtype, shape=trace.shape,
            born=trace.born.tolist(), freed=trace.freed.tolist(),
            use_offsets=trace.use_offsets.tolist(), use_kernels=trace.use_kernels.tolist(),
            use_writes=trace.use_writes.astype(int).tolist(), movable_other=trace.movable_other.astype(int).tolist(),
        ),
    )


def live_bytes_per_kernel(trace: Trace, mask: np.ndarray | None = None) -> np.ndarray:
    """Tracked bytes held at each kernel with nothing offloaded (int64, one per kernel),
    of all tensors or of those where `mask` is true.

    Globals count everywhere; an intermediate counts over [born, freed), and the part of
    that range past the iteration end wraps to its start (steady state: the previous
    iteration's copy is still alive there). A difference array: O(kernels + tensors).
    """
    num_k = trace.num_kernels
    mask = np.ones(trace.num_tensors, dtype=bool) if mask is None else mask
    is_global = (trace.born < 0) & mask
    inter = (trace.born >= 0) & mask
    born, freed, size = trace.born[inter], trace.freed[inter], trace.nbytes[inter]
    diff = np.zeros(num_k + 1, dtype=np.int64)
    np.add.at(diff, np.minimum(born, num_k), size)
    np.add.at(diff, np.clip(freed, born, num_k), -size)
    wraps = freed > num_k
    np.add.at(diff, np.zeros(int(wraps.sum()), dtype=np.int64), size[wraps])
    np.add.at(diff, np.minimum(freed[wraps] - num_k, num_k), -size[wraps])
    return int(trace.nbytes[is_global].sum()) + np.cumsum(diff[:num_k])
