"""The simulator, and properties every emitted plan must have (hypothesis)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plan_helpers import GiB, MiB, T, layered_trace, make_trace
from teraio.formats.plan import Plan, PlanEntry
from teraio.formats.trace import Kind
from teraio_plan import make_plan_outcome, planner_inputs, simulate, sweep
from teraio_plan.memory import memory_curve, min_required_bytes
from teraio_plan.make import _plan_with
from teraio_plan.simulator import planned_memory


def test_empty_plan_replays_at_ideal_speed():
    trace = layered_trace(seed=1)
    out = make_plan_outcome(trace, planner_inputs(trace, gpu_mem_bytes=10 * GiB))
    sim = out.simulation
    assert sim.iteration_ms == pytest.approx(trace.duration_us.sum() / 1e3)
    assert sim.stall_ms == 0 and sim.peak_bytes == memory_curve(trace, 0).max()
    assert sim.bytes_by_path == {"d2s": 0, "s2d": 0, "d2h": 0, "h2d": 0}


def test_slower_disk_than_planned_stalls_the_kernel_that_needs_the_tensor():
    trace = make_trace([10_000.0] * 100, [T("w", GiB, [0, 99]),
                                          T("x", GiB, list(range(40, 60)), Kind.activation, born=40, freed=60)])
    out = make_plan_outcome(trace, planner_inputs(trace, gpu_mem_bytes=int(1.5 * GiB)))
    slow = out.plan.header.inputs.model_copy(update={"ssd_read_gbps": 0.5})
    sim = simulate(trace, out.plan, slow)
    assert sim.input_stalls == 1 and sim.stall_ms > 100
    assert sim.bytes_by_path["d2s"] == GiB and sim.bytes_by_path["s2d"] == GiB


def test_a_thread_slower_than_the_kernels_sets_the_pace_and_a_faster_one_hides():
    """Note [Host-bound kernels]: on a GPU the thread runs ahead of long kernels and the device
    waits on short ones; on the CPU the thread runs the kernels, so its time adds up."""
    durations = [1000.0] * 10 + [10.0] * 90          # 10 long kernels, then 90 short ones
    gpu = make_trace(durations, [T("w", MiB, [0, 99])], capacity_bytes=10 * GiB)
    plan = make_plan_outcome(gpu, planner_inputs(gpu)).plan
    def replay_ms(trace, host_us):
        inputs = plan.header.inputs.model_copy(update={"host_us_per_kernel": host_us})
        return simulate(trace, plan, inputs).iteration_ms
    assert replay_ms(gpu, 0.0) == pytest.approx(10.9)
    assert replay_ms(gpu, 5.0) == pytest.approx(10.9)         # hidden behind the kernels
    assert replay_ms(gpu, 200.0) == pytest.approx(20.0)       # 100 issues of 200 us: the thread's pace
    cpu = make_trace(durations, [T("w", MiB, [0, 99])])
    assert replay_ms(cpu, 5.0) == pytest.approx(10.9 + 0.5)   # the thread runs them: it adds up
    scaled = plan.header.inputs.model_copy(update={"kernel_time_scale": 0.5})
    assert simulate(gpu, plan, scaled).iteration_ms == pytest.approx(10.9 / 2)


def _one_of_each_action_plan(trace):
    """A copy out and in (host), a clean release and its copy in, a replay: 3 copies, 1 replay."""
    plan = make_plan_outcome(trace, planner_inputs(trace, gpu_mem_bytes=10 * GiB, num_ssds=0,
                                                         host_mem_bytes=GiB)).plan
    assert not plan.entries
    def entry(name, tier, after, by, at, needed, **extra):
        return PlanEntry(tensor=name, name=name, kind="activation", nbytes=MiB, tier=tier, offload_after=after,
                         offload_by=by, prefetch_at=at, needed_by=needed, wraps=False, reason="test", **extra)
    return plan.model_copy(update={"entries": [
        entry("moved", "host", 2, 5, 25, 30), entry("clean", "host", 3, 5, 26, 32, clean=True),
        entry("replayed", "recompute", 4, 4, 34, 34, produced_at=4)]})


def _action_trace(kernel_us, device_capacity_bytes):
    tensors = [T(name, MiB, [born, needed], Kind.activation, born=born, freed=needed + 1)
               for name, born, needed in (("moved", 2, 30), ("clean", 3, 32), ("replayed", 4, 34))]
    return make_trace([kernel_us] * 40, tensors, capacity_bytes=device_capacity_bytes)


def test_each_copy_and_replay_costs_the_thread_where_it_is_the_bound_and_hides_behind_long_kernels():
    """Note [Host-bound kernels]: 3 copies at 1 ms and 1 replay at 0.5 ms on top of the thread's
    time per kernel: 3.5 ms more where the thread sets the pace (short kernels, or the CPU),
    nothing where each gap between long kernels still covers it."""
    def replay(trace, per_kernel_us, per_copy_us, per_replay_us):
        plan = _one_of_each_action_plan(trace)
        inputs = plan.header.inputs.model_copy(update={
            "host_us_per_kernel": per_kernel_us, "host_us_per_copy": per_copy_us, "host_us_per_replay": per_replay_us})
        return simulate(trace, plan, inputs)
    short = _action_trace(10.0, 10 * GiB)
    free, charged = replay(short, 20.0, 0.0, 0.0), replay(short, 20.0, 1000.0, 500.0)
    assert charged.iteration_ms - free.iteration_ms == pytest.approx(3.5)
    assert charged.host_ms == pytest.approx(40 * 0.02 + 3.5) and charged.stall_ms == free.stall_ms
    long = _action_trace(5000.0, 10 * GiB)
    free, charged = replay(long, 20.0, 0.0, 0.0), replay(long, 20.0, 1000.0, 500.0)
    assert charged.iteration_ms == pytest.approx(free.iteration_ms)          # hidden behind the kernels
    assert charged.host_ms - free.host_ms == pytest.approx(3.5)
    cpu = _action_trace(5000.0, None)
    assert replay(cpu, 20.0, 1000.0, 500.0).iteration_ms - replay(cpu, 20.0, 0.0, 0.0).iteration_ms \
        == pytest.approx(3.5)                                                 # the thread runs them: it adds up


def test_a_shared_link_carries_both_directions_in_the_time_of_their_sum():
    """Note [Bandwidth model]: on a link of T GB/s for both directions together a lone copy runs
    at T and two at once share it; a full-duplex link of T each way overlaps them. 400 MB
    tensors over 1 ms kernels: "early" comes back over kernels 20..27 while "late" leaves."""
    mb = 10**6
    tensors = [T("early", 400 * mb, [0, 28], Kind.activation, born=0, freed=29),
               T("late", 400 * mb, [20, 38], Kind.activation, born=20, freed=39)]
    trace = make_trace([1000.0] * 40, tensors, capacity_bytes=10**12)
    plan = make_plan_outcome(trace, planner_inputs(trace, num_ssds=0, host_mem_bytes=GiB)).plan

    def entry(name, after, by, at, needed):
        return PlanEntry(tensor=name, name=name, kind="activation", nbytes=400 * mb, tier="host", offload_after=after,
                         offload_by=by, prefetch_at=at, needed_by=needed, wraps=False, reason="test")
    lone = plan.model_copy(update={"entries": [entry("early", 0, 1, 20, 28)]})
    both = plan.model_copy(update={"entries": [entry("early", 0, 1, 20, 28), entry("late", 20, 21, 30, 38)]})
    duplex = planner_inputs(trace, num_ssds=0, host_mem_bytes=GiB, host_gbps=50, pcie_gbps=50)
    shared = duplex.model_copy(update={"link_total_gbps": 50.0})
    # alone, early's copy in takes 8 ms at 50 GB/s: just in time for kernel 28 on either link
    assert simulate(trace, lone, duplex).stall_ms == simulate(trace, lone, shared).stall_ms == 0
    # with late leaving after kernel 20: in time on the full-duplex link; sharing 50, early
    # runs 1 ms alone (50 MB), then at 25 GB/s beside late (350 MB: 14 ms), done 7 ms late
    assert simulate(trace, both, duplex).stall_ms == 0
    assert simulate(trace, both, shared).stall_ms == pytest.approx(7.0, rel=0.02)


def test_sweep_rises_with_bandwidth_and_fits_at_zero_only_if_no_plan_needed():
    trace = layered_trace(num_layers=6, kernels_per_layer=12, seed=2)
    budget = int(0.75 * memory_curve(trace, 0).max())
    points = sweep(trace, planner_inputs(trace, gpu_mem_bytes=budget))
    assert [p.bw_gbps for p in points] == [0, 4, 8, 16, 32, 48, 64]
    assert not points[0].fits and points[0].share_of_ideal == 0.0
    shares = [p.share_of_ideal for p in points]
    assert shares[-1] > 0


# --- properties over random traces and machines

@st.composite
def scenarios(draw):
    layers = draw(st.integers(2, 6))
    per_layer = draw(st.integers(4, 12))
    seed = draw(st.integers(0, 10_000))
    trace = layered_trace(num_layers=layers, kernels_per_layer=per_layer, seed=seed,
                          weight_nbytes=draw(st.sampled_from([8, 32, 64])) * MiB,
                          act_nbytes=draw(st.sampled_from([4, 16, 48])) * MiB,
                          kernel_us=draw(st.sampled_from([200.0, 1000.0, 5000.0])))
    need, _ = min_required_bytes(trace, 0)
    peak = int(memory_curve(trace, 0).max())
    budget = need + int(draw(st.floats(0.0, 1.0)) * (peak - need))
    num_ssds = draw(st.integers(0, 4))
    host_mem = draw(st.sampled_from([64 * MiB, 512 * MiB, 4 * GiB] + ([0] if num_ssds else [])))
    inputs = planner_inputs(trace, gpu_mem_bytes=budget, num_ssds=num_ssds, host_mem_bytes=host_mem,
                            pcie_gbps=draw(st.sampled_from([8.0, 25.0, 55.0])),
                            link_total_gbps=draw(st.sampled_from([0.0, 0.0, 10.0, 40.0])))
    return trace, inputs


def _uses(trace, name):
    i = trace.tensor_id.index(name)
    return set(trace.uses(i).tolist())


def _check_causal(trace, plan: Plan):
    n = trace.num_kernels
    for e in plan.entries:
        uses = _uses(trace, e.tensor)
        i = trace.tensor_id.index(e.tensor)
        if trace.born[i] >= 0:
            uses.add(int(trace.born[i]))
        assert e.offload_after in uses and e.needed_by in uses
        a = e.offload_after
        span = [(x - a) % n or n for x in (e.offload_by, e.prefetch_at, e.needed_by)]
        assert 0 < span[0] < span[1] < span[2] <= n, e  # offload, then away, then back in time
        assert not any(0 < (u - a) % n < span[2] for u in uses), e  # no use while away
        assert e.wraps == (e.needed_by <= a)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_plan_is_causal_and_the_replay_keeps_its_promises(data):
    trace, inputs = data.draw(scenarios())
    inputs = inputs.model_copy(update={"allow_stalls": False})  # the paper's stall-free planner
    out = make_plan_outcome(trace, inputs)
    _check_causal(trace, out.plan)
    for path, residual in out.planner.ledgers.items():
        cap = out.planner.capacity[path]
        assert (residual >= -1e-6 * (cap + 1)).all() and (residual <= cap + 1e-6).all(), path
    link_cap = trace.duration_us * inputs.pcie_gbps * 1e3
    for direction, used in out.planner.link_bytes.items():
        assert (used <= link_cap * (1 + 1e-9) + 1e-3).all(), direction
    if inputs.link_total_gbps:  # a shared link: both directions together within it, every kernel
        both_cap = trace.duration_us * inputs.link_total_gbps * 1e3
        both = out.planner.link_bytes["out"] + out.planner.link_bytes["in"]
        assert (both <= both_cap * (1 + 1e-9) + 1e-3).all()
    claimed = out.planner.memory_bytes
    assert (planned_memory(memory_curve(trace, inputs.headroom_bytes), out.plan) == claimed).all()
    sim = out.simulation
    assert sim.input_stalls == 0  # every prefetch is back before its kernel at planned bandwidth
    assert sim.peak_bytes <= claimed.max()
    if inputs.host_mem_bytes:
        assert out.plan.header.prediction.host_pool_bytes <= inputs.host_mem_bytes
    else:
        assert all(e.tier == "ssd" for e in out.plan.entries)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_planned_stalls_make_the_budget_and_the_replay_agrees(data):
    """With stalls allowed, entries stay causal, and wherever the stall-free plan left the
    budget exceeded the fill pass only lowers the claimed curve; the replay never peaks above it.
    (The plan kept may come from one tier alone, Note [One tier when two do not fit]: the
    fill pass is compared on the same tiers.)"""
    trace, inputs = data.draw(scenarios())
    no_stalls = inputs.model_copy(update={"allow_stalls": False})
    stall_free, filled = _plan_with(trace, no_stalls, no_stalls), _plan_with(trace, inputs, inputs)
    assert (filled.planner.memory_bytes <= stall_free.planner.memory_bytes).all()
    out = make_plan_outcome(trace, inputs)
    _check_causal(trace, out.plan)
    claimed = out.planner.memory_bytes
    assert (planned_memory(memory_curve(trace, inputs.headroom_bytes), out.plan) == claimed).all()
    assert out.simulation.peak_bytes <= max(claimed.max(), inputs.budget_bytes)
    if inputs.host_mem_bytes:
        assert out.plan.header.prediction.host_pool_bytes <= inputs.host_mem_bytes
