"""Golden plans for the committed traces: a planner change that moves them must be on purpose.

    TERAIO_UPDATE_GOLDEN=1 python -m pytest tests/test_plan_golden.py    # rewrite tests/golden/
Review the diff of the rewritten files (`teraio diff` reads them) before committing.
"""

import os
from pathlib import Path

import pytest

from teraio.formats.plan import plan_to_json
from teraio.formats.trace import load_trace
from teraio_plan import make_plan, planner_inputs

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden"
MiB, GiB = 2**20, 2**30

# name -> (trace, planner options). The H200 ones use that machine's measured disk (compat
# KvikIO, ~1.7 GB/s read, ~2.0 GB/s write) with and without its host pool.
CASES = {
    "cpu-tiny.ssd": ("cpu-tiny.msgpack", dict(gpu_mem_bytes=6 * MiB, num_ssds=1)),
    "cpu-tiny.mixed": ("cpu-tiny.msgpack", dict(gpu_mem_bytes=4 * MiB, num_ssds=1, host_mem_bytes=4 * MiB)),
    "h200-1b-bf16.mixed": ("h200-1b-bf16.msgpack", dict(gpu_mem_bytes=60 * GiB, num_ssds=1, ssd_read_gbps=1.7,
                                                        ssd_write_gbps=2.0, host_mem_bytes=64 * GiB)),
    "h200-1b-bf16.ssd-stall-free": ("h200-1b-bf16.msgpack", dict(gpu_mem_bytes=70 * GiB, num_ssds=4,
                                                                 allow_stalls=False)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_plan(name):
    trace_file, options = CASES[name]
    trace_path = ROOT / "traces" / trace_file
    trace = load_trace(trace_path)  # a committed trace: a missing one fails the test
    text = plan_to_json(make_plan(trace, planner_inputs(trace, **options)))
    golden = GOLDEN / f"{name}.plan.json"
    if os.environ.get("TERAIO_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"no golden plan {golden}: run with TERAIO_UPDATE_GOLDEN=1 and review it"
    assert text == golden.read_text(), f"{name} changed: rerun with TERAIO_UPDATE_GOLDEN=1 if on purpose"


def test_two_tier_plan_that_needs_planned_stalls_is_compared_with_each_tier_alone():
    """Note [One tier when two do not fit], on the recorded 3B trace at 1/4 of its peak: the
    plan made with both tiers makes the budget only through the fit pass; the plan kept is the
    best of it and each tier alone (it fits), and still states the user's inputs."""
    from teraio_plan.make import TIE_SHARE, _plan_with, copies_per_iteration, make_plan_outcome

    trace = load_trace(Path(__file__).resolve().parents[1] / "traces" / "h200-3b-fp32.msgpack")
    inputs = planner_inputs(trace, gpu_mem_bytes=20878062208, num_ssds=1, ssd_read_gbps=1.7, ssd_write_gbps=2.0,
                            host_mem_bytes=24 * 2**30, host_gbps=37, pcie_gbps=55, headroom_bytes=2**30)
    both = _plan_with(trace, inputs, inputs)
    kept = make_plan_outcome(trace, inputs)
    assert both.planner.planned_stall_us > 0 and both.plan.header.prediction.fits
    tiers = [_plan_with(trace, inputs.model_copy(update=one), inputs) for one in ({"num_ssds": 0}, {"host_mem_bytes": 0})]
    fitting = [o for o in [both] + tiers if o.plan.header.prediction.fits]
    fastest_ms = min(o.plan.header.prediction.iteration_ms for o in fitting)
    assert kept.plan.header.prediction.iteration_ms <= fastest_ms * (1 + TIE_SHARE)
    tied = [o for o in fitting if o.plan.header.prediction.iteration_ms <= fastest_ms * (1 + TIE_SHARE)]
    assert copies_per_iteration(kept.plan.entries) == min(copies_per_iteration(o.plan.entries) for o in tied)
    assert kept.plan.header.prediction.fits and kept.simulation.peak_bytes <= inputs.budget_bytes
    assert kept.plan.header.inputs == inputs


def test_late_prefetches_make_the_budget_where_early_ones_miss_it():
    """Note [Late prefetches], on the recorded 3B trace at 1/4 of its peak, host pool only:
    the weights and optimizer state queued back in during gradient clipping left the plan
    444 MiB over there. Started later, the plan fits, the replay stays within the cap, and
    each moved prefetch still comes after its offload and before its use."""
    from teraio_plan.make import make_plan_outcome
    from teraio_plan.memory import memory_curve
    from teraio_plan.simulator import unroll_entry, planned_memory

    trace = load_trace(ROOT / "traces" / "h200-3b-fp32.msgpack")
    inputs = planner_inputs(trace, gpu_mem_bytes=20878062208, num_ssds=0, host_mem_bytes=72 * GiB,
                            host_gbps=37, pcie_gbps=55, headroom_bytes=GiB)
    outcome = make_plan_outcome(trace, inputs)
    assert outcome.plan.header.prediction.fits
    assert outcome.simulation.peak_bytes <= inputs.budget_bytes
    late = [e for e in outcome.plan.entries if "prefetch started late" in e.reason]
    assert late
    # the curve the planner claims is exactly what its entries imply
    implied = planned_memory(memory_curve(trace, inputs.headroom_bytes), outcome.plan)
    assert (implied == outcome.planner.memory_bytes).all()
    for entry in late:
        _, offload_by, prefetch_at, needed_by = unroll_entry(entry, trace.num_kernels)
        assert offload_by < prefetch_at < needed_by, entry
