"""A plan fits whenever one can: Note [Fitting at any cost] (fit.py), Note [What must stay] (memory.py)."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plan_helpers import GiB, MiB, T, make_trace
from teraio.formats.trace import Kind
from teraio_plan import make_plan_outcome, planner_inputs
from teraio_plan.memory import memory_curve, min_required_bytes


@st.composite
def traces(draw):
    """Small random jobs: weights used here and there, activations born, used and freed."""
    num_k = draw(st.integers(8, 40))
    durations = draw(st.lists(st.sampled_from([5.0, 50.0, 500.0, 5000.0]), min_size=num_k, max_size=num_k))
    tensors = []
    for i in range(draw(st.integers(1, 6))):
        uses = draw(st.lists(st.integers(0, num_k - 1), min_size=1, max_size=5, unique=True))
        tensors.append(T(f"w{i}", draw(st.integers(1, 256)) * MiB, uses))
    for i in range(draw(st.integers(0, 6))):
        born = draw(st.integers(0, num_k - 2))
        freed = draw(st.integers(born + 1, born + num_k - 1))  # past num_k: freed in the next iteration
        uses = [u % num_k for u in draw(st.lists(st.integers(born, freed - 1), min_size=1, max_size=4))]
        tensors.append(T(f"a{i}", draw(st.integers(1, 256)) * MiB, [born % num_k] + uses, Kind.activation,
                         born=born, freed=freed))
    return make_trace(durations, tensors)


def what_must_stay_bytes(trace) -> int:
    """The largest working set, kernel by kernel in plain Python: all that is live, less each
    movable tensor over kernels a+2 .. e-2 between two of its uses a < e (Note [What must stay])."""
    n = trace.num_kernels
    live = memory_curve(trace, 0).astype(np.int64)
    for t in range(trace.num_tensors):
        uses = {int(u) for u in trace.uses(t)}
        born, freed = int(trace.born[t]), int(trace.freed[t])
        if born >= 0:  # uses before the birth kernel are in the next iteration; none after the free
            points = sorted(p for p in {u + n if u < born else u for u in uses} | {born} if p < freed)
            gaps = list(zip(points, points[1:]))
        else:  # a global's last use of one iteration and first use of the next are a gap too
            points = sorted(uses)
            gaps = list(zip(points, points[1:])) + [(points[-1], points[0] + n)]
        for a, e in gaps:
            for k in range(a + 2, e - 1):
                live[k % n] -= trace.nbytes[t]
    return int(live.max())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), share=st.floats(0.0, 1.0), num_ssds=st.integers(1, 2),
       host_mem=st.sampled_from([0, 64 * MiB, 4 * GiB]), pcie_gbps=st.sampled_from([2.0, 25.0]))
def test_a_budget_above_every_working_set_gets_a_plan_that_fits(trace, share, num_ssds, host_mem, pcie_gbps):
    need_bytes = what_must_stay_bytes(trace)
    assert min_required_bytes(trace, 0)[0] == need_bytes
    peak_bytes = int(memory_curve(trace, 0).max())
    budget_bytes = need_bytes + int(share * (peak_bytes - need_bytes))
    inputs = planner_inputs(trace, gpu_mem_bytes=max(budget_bytes, 1), num_ssds=num_ssds,
                            host_mem_bytes=host_mem, pcie_gbps=pcie_gbps)
    out = make_plan_outcome(trace, inputs)
    assert out.simulation.peak_bytes <= inputs.budget_bytes
    assert out.plan.header.prediction.fits
    if host_mem:
        assert out.plan.header.prediction.host_pool_bytes <= host_mem


def test_a_weight_too_slow_to_hide_is_moved_with_a_stall_the_plan_states():
    """1 GiB idle for 1 ms at 6.5 GB/s cannot hide; the plan still fits, and says what it costs."""
    tensors = [T("w", GiB, [0, 99]), T("x", GiB, list(range(40, 60)), Kind.activation, born=40, freed=60)]
    trace = make_trace([10.0] * 100, tensors)
    out = make_plan_outcome(trace, planner_inputs(trace, gpu_mem_bytes=int(1.5 * GiB), num_ssds=1))
    [entry] = out.plan.entries
    assert entry.tensor == "w" and out.plan.header.prediction.fits
    assert out.simulation.peak_bytes <= int(1.5 * GiB)
    assert "planned stall to fit kernel" in entry.reason and "cannot be hidden" in entry.reason
    # both copies at full rate, less the 1 ms they overlap kernels: about 320 ms
    assert 250 < out.plan.header.prediction.stall_ms < 400
    assert 250 < out.planner.planned_stall_us / 1e3 < 400
