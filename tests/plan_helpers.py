"""Hand-built traces for planner and simulator tests: kernels by duration, tensors by uses."""

from dataclasses import dataclass, field

import numpy as np

from teraio.formats.common import Producer
from teraio.formats.trace import DeviceInfo, Kind, Trace, TraceHeader

MiB = 2**20
GiB = 2**30


@dataclass
class T:
    """One tensor: uses are kernel indices; born/freed -1 means global."""

    name: str
    nbytes: int
    uses: list[int]
    kind: Kind = Kind.parameter
    born: int = -1
    freed: int = -1
    shape: list[int] = field(default_factory=lambda: [1])


def make_trace(durations_us, tensors: list[T], capacity_bytes: int | None = None,
               untracked_bytes: int = 0, ops: list[str] | None = None) -> Trace:
    num_k = len(durations_us)
    ops = ops or [f"aten::op{k % 7}" for k in range(num_k)]
    op_names = sorted(set(ops))
    uses = [np.unique(np.asarray(t.uses, dtype=np.int64)) for t in tensors]
    header = TraceHeader(
        producer=Producer(teraio="test"), command=["test"], device=_device(capacity_bytes),
        warmup_iterations=1, profiled_iterations=1, num_kernels=num_k, num_tensors=len(tensors),
        op_digest=f"test-{num_k}-{len(tensors)}", iteration_ms=float(np.sum(durations_us)) / 1e3,
        untracked_bytes=untracked_bytes, timing="monotonic_clock",
    )
    return Trace(
        header=header, op_names=op_names,
        kernel_op=np.asarray([op_names.index(o) for o in ops], dtype=np.int32),
        kernel_phase=np.zeros(num_k, dtype=np.int8),
        duration_us=np.asarray(durations_us, dtype=np.float64),
        device_bytes=np.full(num_k, -1, dtype=np.int64),
        signature=np.zeros(num_k, dtype=np.uint32),
        tensor_id=[t.name for t in tensors], tensor_name=[t.name for t in tensors],
        kind=np.asarray([int(t.kind) for t in tensors], dtype=np.int8),
        nbytes=np.asarray([t.nbytes for t in tensors], dtype=np.int64),
        dtype=["float32"] * len(tensors), shape=[t.shape for t in tensors],
        born=np.asarray([t.born for t in tensors], dtype=np.int64),
        freed=np.asarray([t.freed for t in tensors], dtype=np.int64),
        use_offsets=np.concatenate(([0], np.cumsum([len(u) for u in uses]))).astype(np.int64),
        use_kernels=np.concatenate(uses + [np.zeros(0, dtype=np.int64)]).astype(np.int64),
    )


def _device(capacity_bytes):
    if capacity_bytes is None:
        return DeviceInfo(type="cpu", name="cpu")
    return DeviceInfo(type="cuda", name="Test GPU", capacity_bytes=capacity_bytes)


def layered_trace(num_layers: int = 4, kernels_per_layer: int = 10, weight_nbytes: int = 64 * MiB,
                  act_nbytes: int = 32 * MiB, kernel_us: float = 1000.0, seed: int | None = None) -> Trace:
    """A toy model: forward over layers, backward in reverse, one optimizer kernel per layer.

    Each layer's weight is used once in forward and once in backward, and its activation is
    born in forward and freed after its backward use: the shape of a real training step.
    """
    rng = np.random.default_rng(seed)
    half = num_layers * kernels_per_layer
    num_k = 2 * half + num_layers
    durations = np.full(num_k, kernel_us) if seed is None else rng.uniform(0.2, 2.0, num_k) * kernel_us
    tensors = []
    for layer in range(num_layers):
        fwd = layer * kernels_per_layer
        bwd = 2 * half - (layer + 1) * kernels_per_layer
        opt = 2 * half + layer
        tensors.append(T(f"model.layers.{layer}.weight", weight_nbytes, [fwd, bwd, opt]))
        tensors.append(T(f"model.layers.{layer}.weight:exp_avg", weight_nbytes, [opt], Kind.optimizer_state))
        tensors.append(T(f"model.layers.{layer}.act", act_nbytes, [fwd, bwd], Kind.activation,
                         born=fwd, freed=bwd + 1))
    return make_trace(durations.tolist(), tensors)
