"""The planner on hand-built traces where the right plan is known."""

import json
import subprocess
import sys

import numpy as np
import pytest

from plan_helpers import GiB, MiB, T, layered_trace, make_trace
from teraio.errors import PlanError, UsageError
from teraio.formats.plan import load_plan, plan_to_json, save_plan
from teraio.formats.trace import Kind
from teraio_plan import make_plan, make_plan_outcome, planner_inputs
from teraio_plan.memory import memory_curve, min_required_bytes
from teraio_plan.periods import find_periods


def big_weight_trace(kernel_us: float = 10_000.0):
    """W (1 GiB) is used at kernels 0 and 99; X (1 GiB) lives and works over kernels 40..59."""
    tensors = [T("w", GiB, [0, 99]),
               T("x", GiB, list(range(40, 60)), Kind.activation, born=40, freed=60)]
    return make_trace([kernel_us] * 100, tensors)


def wrap_trace():
    """W (1 GiB) works in the middle; activations X and Y fill both ends of the iteration."""
    tensors = [T("w", GiB, list(range(45, 56))),
               T("x", GiB, list(range(0, 20)), Kind.activation, born=0, freed=20),
               T("y", GiB, list(range(80, 100)), Kind.activation, born=80, freed=100)]
    return make_trace([10_000.0] * 100, tensors)


def plan_for(trace, gpu_mem=int(1.5 * GiB), **kw):
    kw.setdefault("num_ssds", 1)
    return make_plan_outcome(trace, planner_inputs(trace, gpu_mem_bytes=gpu_mem, **kw))


def test_big_idle_weight_is_offloaded_and_back_in_time():
    out = plan_for(big_weight_trace())
    [entry] = out.plan.entries
    assert (entry.tensor, entry.tier, entry.offload_after, entry.needed_by, entry.wraps) == ("w", "ssd", 0, 99, False)
    assert entry.offload_by < 40 and entry.prefetch_at >= 60
    pred = out.plan.header.prediction
    assert pred.fits and pred.peak_bytes == GiB and pred.stall_ms == 0
    assert pred.ssd_write_bytes_per_iteration == GiB and pred.offload_bytes_by_tier == {"host": 0, "ssd": GiB}
    assert "idle" in entry.reason and "ssd first" in entry.reason


def test_global_idle_period_wraps_around_the_iteration_boundary():
    out = plan_for(wrap_trace())
    [entry] = out.plan.entries
    assert (entry.tensor, entry.offload_after, entry.needed_by, entry.wraps) == ("w", 55, 45, True)
    # Away over [80, 100) and [0, 20): done by 79, back from 20 on, both read cyclically.
    assert 55 < entry.offload_by < 80 and 20 <= entry.prefetch_at < 45
    assert out.plan.header.prediction.fits and out.simulation.input_stalls == 0


def test_under_ddp_gradients_are_never_planned_and_count_as_fixed_memory():
    """The runtime keeps gradients on the device under DDP (Note [DDP gradients]): a plan that
    counted on moving one would miss its budget in the live job."""
    tensors = [T("w.grad", GiB, [0, 99], Kind.gradient),
               T("x", GiB, list(range(40, 60)), Kind.activation, born=40, freed=60)]
    trace = make_trace([10_000.0] * 100, tensors)
    [entry] = plan_for(trace).plan.entries
    assert entry.kind == "gradient"
    trace.header = trace.header.model_copy(update={"gradients_stay_on_device": True})
    assert min_required_bytes(trace, 0)[0] == 2 * GiB  # the gradient is as fixed as 'other' memory
    with pytest.raises(PlanError, match="can never move"):
        plan_for(trace)


def test_budget_that_cannot_be_met_reports_where_and_by_how_much():
    # 1 ms of idle time cannot move 1 GiB without a stall (with stalls allowed it fits: test_feasibility.py)
    out = plan_for(big_weight_trace(kernel_us=10.0), allow_stalls=False)
    pred = out.plan.header.prediction
    assert out.plan.entries == []
    assert not pred.fits
    assert pred.max_excess_bytes == GiB // 2 and pred.over_budget_kernels == 20
    assert 40 <= out.simulation.worst_kernel < 60


def test_saturated_ssd_path_sends_the_tensor_to_host():
    trace = big_weight_trace(kernel_us=2_000.0)  # SSD round trip ~325 ms > 196 ms window
    out = plan_for(trace, host_mem_bytes=2 * GiB)
    [entry] = out.plan.entries
    assert entry.tier == "host" and "ssd path full" in entry.reason
    assert out.plan.header.prediction.host_pool_bytes == GiB and out.plan.header.prediction.fits
    assert plan_for(trace, host_mem_bytes=0, allow_stalls=False).plan.entries == []


def test_zero_host_cap_means_ssd_only():
    out = plan_for(layered_trace(), gpu_mem=int(0.8 * memory_curve(layered_trace(), 0).max()), num_ssds=4)
    assert out.plan.entries and {e.tier for e in out.plan.entries} == {"ssd"}
    assert out.plan.header.prediction.host_pool_bytes == 0


def test_host_cap_smaller_than_the_tensor_keeps_it_on_ssd():
    out = plan_for(big_weight_trace(), host_mem_bytes=GiB // 2)
    assert [e.tier for e in out.plan.entries] == ["ssd"]


def test_nothing_to_do_when_the_trace_fits():
    out = plan_for(big_weight_trace(), gpu_mem=2 * GiB)
    assert out.plan.entries == [] and out.plan.header.prediction.fits
    assert out.plan.header.prediction.share_of_ideal == 1.0


def test_same_inputs_give_identical_bytes(tmp_path):
    trace = layered_trace(num_layers=6, kernels_per_layer=8, seed=3)
    inputs = planner_inputs(trace, gpu_mem_bytes=int(0.7 * memory_curve(trace, 0).max()), num_ssds=2,
                            host_mem_bytes=256 * MiB)
    a, b = make_plan(trace, inputs), make_plan(trace, inputs)
    save_plan(a, tmp_path / "a.json")
    save_plan(b, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert plan_to_json(load_plan(tmp_path / "a.json")) == plan_to_json(a)
    lines = plan_to_json(a).splitlines()
    assert sum(1 for line in lines if line.startswith('  {"tensor"')) == len(a.entries)


def test_plan_header_refers_to_its_trace():
    trace = big_weight_trace()
    plan = plan_for(trace).plan
    assert plan.header.trace.op_digest == trace.header.op_digest
    assert plan.header.trace.num_kernels == 100 and plan.header.inputs.budget_bytes == int(1.5 * GiB)
    assert plan.header.prediction.ideal_iteration_ms == pytest.approx(1000.0)


def test_budget_below_one_kernels_working_set_is_a_plan_error():
    trace = big_weight_trace()
    with pytest.raises(PlanError, match=r"no plan can work.*at least 1073741824"):
        make_plan(trace, planner_inputs(trace, gpu_mem_bytes=GiB - 1))


def test_min_required_counts_unmovable_storages_and_untracked():
    tensors = [T("w", GiB, [0, 5]), T("rng", 100, [3], Kind.other)]
    trace = make_trace([1.0] * 10, tensors, untracked_bytes=7)
    assert min_required_bytes(trace, headroom_bytes=3) == (GiB + 100 + 10, 0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_ssds=0, host_mem_bytes=0), "nowhere to offload"),
    (dict(num_ssds=-1), "--ssds"),
    (dict(ssd_read_gbps=0), "--ssd-read-gbps"),
    (dict(pcie_gbps=-5), "--pcie-gbps"),
    (dict(link_total_gbps=-1), "--link-total-gbps"),
    (dict(gpu_mem_bytes=0), "--gpu-mem"),
])
def test_bad_inputs_are_usage_errors(kwargs, match):
    kwargs.setdefault("gpu_mem_bytes", GiB)
    with pytest.raises(UsageError, match=match):
        planner_inputs(big_weight_trace(), **kwargs)


def test_cpu_trace_needs_gpu_mem():
    with pytest.raises(UsageError, match="--gpu-mem"):
        planner_inputs(big_weight_trace())


def test_gpu_trace_budget_defaults_to_its_capacity():
    trace = make_trace([1.0] * 4, [T("w", 10, [0])], capacity_bytes=80 * GiB)
    assert planner_inputs(trace).budget_bytes == 80 * GiB


def test_periods_of_globals_wrap_and_others_are_skipped():
    tensors = [T("w", 8, [2, 10, 30]), T("rng", 8, [0, 30], Kind.other),
               T("a", 8, [12, 20], Kind.activation, born=12, freed=21)]
    p = find_periods(make_trace([1.0] * 40, tensors))
    rows = sorted(zip(p.tensor.tolist(), p.start.tolist(), p.end.tolist()))
    assert rows == [(0, 2, 10), (0, 10, 30), (0, 30, 42), (2, 12, 20)]
    assert p.window_us.tolist() == [7.0, 19.0, 11.0, 7.0]
    assert p.wraps().tolist() == [False, False, True, False]


def test_intermediate_freed_in_the_next_iteration():
    """A gradient born at 30, used by the optimizer at 38, freed by zero_grad at kernel 2 next time."""
    grad = T("g", 8, [30, 38, 2], Kind.gradient, born=30, freed=43)
    trace = make_trace([1.0] * 40, [grad])
    p = find_periods(trace)
    assert sorted(zip(p.start.tolist(), p.end.tolist())) == [(30, 38), (38, 42)]
    m = memory_curve(trace, 0)
    assert m[:3].tolist() == [8, 8, 8] and m[3:30].max() == 0 and m[30:].min() == 8


def test_memory_curve_adds_untracked_and_headroom():
    trace = make_trace([1.0] * 4, [T("w", 10, [0])], untracked_bytes=5)
    assert memory_curve(trace, 2).tolist() == [17] * 4


def test_teraio_plan_imports_no_torch():
    code = ("import sys, teraio_plan, teraio.formats.trace, teraio.formats.plan, teraio.app.commands.plan, "
            "teraio.app.commands.diff; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'kvikio'))))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


@pytest.mark.parametrize("size", [3, 255, 256, 1000, 1024])
def test_running_sum_matches_a_flat_cumulative_sum(size):
    from teraio_plan.ledger import RunningSum
    rng = np.random.default_rng(size)
    sums = RunningSum(rng.random(size) * (rng.random(size) > 0.3))  # runs of zeros: flat stretches
    values = sums.values  # changed in place, then refreshed
    for _ in range(5):
        lo = int(rng.integers(0, size))
        hi = int(rng.integers(lo, size)) + 1
        values[lo:hi] *= rng.random(hi - lo)
        sums.refresh(lo, hi)
    flat = np.concatenate(([0.0], np.cumsum(values)))
    assert np.allclose(sums.at(np.arange(size + 1)), flat, rtol=0, atol=1e-9)
    # Away from exact hits (where rounding picks a side of a flat stretch) the searches agree.
    targets = rng.random(300) * flat[-1] * 1.2 - 0.1
    for side in ("left", "right"):
        assert (sums.searchsorted(targets, side) == np.searchsorted(flat, targets, side)).all()


@pytest.mark.parametrize("num_k", [5, 300, 1000])
def test_blocked_excess_matches_kernel_by_kernel(num_k):
    from teraio_plan.ledger import Excess
    rng = np.random.default_rng(num_k)
    want = np.tile(np.maximum(rng.integers(-50, 100, num_k), 0).astype(float), 2)  # mirrored
    tau = np.tile(rng.random(num_k), 2)
    excess = Excess(want.copy(), tau)
    for _ in range(30):
        lo = int(rng.integers(0, num_k))
        hi = min(lo + int(rng.integers(1, num_k + 1)), 2 * num_k)
        nbytes = float(rng.integers(1, 30))
        excess.lower_mirrored(lo, hi, nbytes)
        for k in range(lo, hi):
            for slot in (k, (k + num_k) % (2 * num_k)):
                want[slot] = max(want[slot] - nbytes, 0.0)
        assert (excess.values() == want).all()
        assert excess.over_kernels() == np.count_nonzero(want[:num_k])
        assert excess.max_excess() == want.max()
        assert excess.mass() == pytest.approx(want[:num_k] @ tau[:num_k], rel=1e-12)
        los = rng.integers(0, 2 * num_k, 40)
        his = np.minimum(los + rng.integers(1, num_k + 1, 40), 2 * num_k)
        sizes = rng.integers(1, 60, 40).astype(float)
        brute = [np.minimum(want[a:b], s) @ tau[a:b] for a, b, s in zip(los, his, sizes)]
        assert excess.relief(los, his, sizes) == pytest.approx(brute, rel=1e-12, abs=1e-9)


def test_the_fill_pass_moves_few_large_tensors_before_many_small_ones():
    """Note [Fill order] in teraio_plan/fill.py, on the LoRA case recorded on the H200: at half
    its peak the pass used to take hundreds of adapter gradients, optimizer states and other
    tensors of under 1 MiB (2,578 copies per iteration in all, `bench/plan_copies.py` with the
    planner of 0f5e54f); ranked by relief per microsecond of copying it makes the budget with
    large tensors alone."""
    from pathlib import Path

    from teraio.formats.trace import load_trace
    from teraio_plan.make import copies_per_iteration

    recorded = Path(__file__).resolve().parents[1] / "bench/results/2026-12-05-lora-calibrated-h200-ed22602"
    trace = load_trace(recorded / "trace_lora.msgpack")
    half_peak = json.loads((recorded / "trace_stats_lora.json").read_text())["peak_bytes"] // 2
    inputs = planner_inputs(trace, gpu_mem_bytes=half_peak, num_ssds=0, host_mem_bytes=64 * GiB, host_gbps=37,
                            pcie_gbps=55, headroom_bytes=GiB)
    plan = make_plan_outcome(trace, inputs).plan
    assert plan.header.prediction.fits
    assert not [e for e in plan.entries if e.tier == "host" and e.nbytes < MiB]
    assert copies_per_iteration(plan.entries) < 1400   # 1,316 at the commit that ranked them so


def test_fill_entries_the_replay_does_not_need_are_dropped(monkeypatch):
    """Note [Pruning the fill] in teraio_plan/make.py, on the 3B fp32 trace at 1/4 of its peak
    (host tier, chained replays: docs/planner.md): the fill pass took entries for its own,
    more cautious curve, 3,135 copies per iteration in all. The smallest of them are dropped
    where the replay still fits: far fewer copies, the budget kept, no slower."""
    from pathlib import Path

    from teraio.formats.trace import load_trace
    from teraio_plan import make
    from teraio_plan.make import copies_per_iteration

    trace = load_trace(Path(__file__).resolve().parents[1] / "traces/h200-3b-fp32-writes.msgpack")
    inputs = planner_inputs(trace, gpu_mem_bytes=20878062208, num_ssds=0, host_mem_bytes=64 * GiB,
                            host_gbps=37, pcie_gbps=55, headroom_bytes=GiB)
    pruned = make_plan_outcome(trace, inputs)
    monkeypatch.setattr(make, "_prune_fill", lambda *args: args[-1])
    whole = make_plan_outcome(trace, inputs)
    assert pruned.plan.header.prediction.fits and pruned.simulation.peak_bytes <= inputs.budget_bytes
    assert copies_per_iteration(pruned.plan.entries) < copies_per_iteration(whole.plan.entries) - 1000
    assert pruned.plan.header.prediction.iteration_ms <= whole.plan.header.prediction.iteration_ms
