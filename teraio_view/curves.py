"""Curves over one iteration, thinned for the page: what the eye cannot see goes, peaks stay.

Note [Keeping peaks exact]
    A 250k-kernel trace has 250k points per curve; a page draws a few thousand at most.
    The kernels are cut into buckets and each bucket keeps its highest and its lowest kernel
    (of the total, for stacked layers: each layer takes its value at those kernels, so the
    stack's top is the exact total there). The peak kernel is therefore always drawn, at its
    true position and height, and so is every dip as deep as a bucket.
"""

import numpy as np

from teraio.formats.plan import Plan
from teraio.formats.trace import Kind, Trace, live_bytes_per_kernel
from teraio_plan.memory import memory_curve
from teraio_plan.simulator import planned_memory, simulate

MAX_BUCKETS = 2000  # two points each: a curve is at most 4000 points, whatever the trace


def extreme_kernels(values: np.ndarray, max_buckets: int = MAX_BUCKETS) -> np.ndarray:
    """Indices of the highest and lowest value in each bucket, in order (Note [Keeping peaks exact])."""
    n = len(values)
    if n <= 2 * max_buckets:
        return np.arange(n)
    size = -(-n // max_buckets)
    padded = np.full(size * max_buckets, values[-1], dtype=values.dtype)
    padded[:n] = values
    rows = padded.reshape(max_buckets, size)
    starts = np.arange(max_buckets) * size
    picks = np.concatenate([starts + rows.argmax(axis=1), starts + rows.argmin(axis=1)])
    return np.unique(np.minimum(picks, n - 1))


def demand_by_kind(trace: Trace) -> dict[str, np.ndarray]:
    """Traced bytes per kernel for each kind of tensor, plus what the profiler could not attribute."""
    layers = {kind.name: live_bytes_per_kernel(trace, trace.kind == kind) for kind in Kind}
    if trace.header.untracked_bytes:
        layers["untracked"] = np.full(trace.num_kernels, int(trace.header.untracked_bytes), dtype=np.int64)
    return layers


def plan_curves(trace: Trace, plan: Plan) -> dict[str, np.ndarray]:
    """The plan's memory per kernel: what the planner promised, and what the simulator's replay
    predicts (its peak is the plan header's predicted peak)."""
    claim = planned_memory(memory_curve(trace, plan.header.inputs.headroom_bytes), plan)
    return {"planned": claim, "replayed": simulate(trace, plan).memory_bytes}
