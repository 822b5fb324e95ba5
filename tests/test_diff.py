"""diff_plans: keys, added/removed/changed, header changes."""

from plan_helpers import MiB, layered_trace
from teraio_plan import diff_plans, make_plan, planner_inputs
from teraio_plan.memory import memory_curve


def plans():
    trace = layered_trace(num_layers=6, kernels_per_layer=10, seed=4)
    budget = int(0.7 * memory_curve(trace, 0).max())
    a = make_plan(trace, planner_inputs(trace, gpu_mem_bytes=budget, num_ssds=1))
    b = make_plan(trace, planner_inputs(trace, gpu_mem_bytes=budget, num_ssds=4, host_mem_bytes=512 * MiB))
    return a, b


def test_a_plan_against_itself_is_unchanged():
    a, _ = plans()
    d = diff_plans(a, a)
    assert d.unchanged and d.same_trace


def test_retimed_period_is_one_changed_row_not_remove_and_add():
    a, _ = plans()
    first = a.entries[0]
    moved = first.model_copy(update={"offload_by": first.offload_by + 1, "tier": "host"})
    b = a.model_copy(update={"entries": [moved] + a.entries[1:]})
    d = diff_plans(a, b)
    assert not d.added and not d.removed
    [change] = d.changed
    assert change.key == (first.tensor, first.offload_after) and change.fields == ["tier", "offload_by"]


def test_added_removed_and_inputs_are_reported():
    a, b = plans()
    d = diff_plans(a, b)
    keys_a = {(e.tensor, e.offload_after) for e in a.entries}
    keys_b = {(e.tensor, e.offload_after) for e in b.entries}
    assert {(e.tensor, e.offload_after) for e in d.added} == keys_b - keys_a
    assert {(e.tensor, e.offload_after) for e in d.removed} == keys_a - keys_b
    assert d.inputs["num_ssds"] == (1, 4) and d.inputs["host_mem_bytes"] == (0, 512 * MiB)
    assert d.to_json()["inputs"]["num_ssds"] == [1, 4]
