"""Gradients made inside optimizer.step(closure) whose closure sets them to None first (LBFGS,
PyTorch Lightning's automatic optimization): the profile names them by owner (`0.weight.grad`),
the run met them only by their birth names, and every gradient entry of the plan found no
tensor (plan_ids_missing 4-8 per iteration in a user's trial). Note [When the plan is
followed], Gradients of a step with a closure, in teraio_run/agent.py.

Each case profiles tests/clients/closure_grads.py, plans it, runs it under the plan and
plainly: the planned iterations find every entry's tensor and do every offload, the gradient
entries' bytes move, and the losses and final weights are the plain run's bit for bit."""

import json

import pytest

from teraio.formats.plan import load_plan, save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import PYTHON, ok, teraio
from runtime_helpers import every_period_plan
from test_clients import CLIENTS, run_plain

SCRIPT = CLIENTS / "closure_grads.py"


def _profile(tmp_path, mode: str):
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, SCRIPT, "--mode", mode, cwd=tmp_path))
    trace = load_trace(tmp_path / "t.msgpack")
    return trace, int(live_bytes_per_kernel(trace).max())


def _run_both_ways(tmp_path, plan_path, mode: str):
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, SCRIPT, "--mode", mode, "--losses-out", "l.json")
    ok(teraio("run", "--plan", plan_path, "--report", tmp_path / "run.json", "--ssd-dir", tmp_path / "ssd",
              "--", PYTHON, SCRIPT, "--mode", mode, "--losses-out", "l.json", cwd=tmp_path))
    planned = json.loads((tmp_path / "l.json").read_text())
    assert planned == json.loads((plain / "l.json").read_text())   # losses and final weights, bit for bit
    return load_report(tmp_path / "run.json")


def _assert_every_entry_followed(report, plan) -> None:
    """Every planned iteration finds each entry's tensor and moves it out (planned_offloads counts
    the offloads the engine did), as in the plain loop. The batches, made before the loop and
    used in turn, are kind `other` and planned too: an entry names the one the traced iteration
    used, which in another iteration is still back from the plan's prefetch for its next use
    (unused, so not offloaded again)."""
    planned = [row for row in report.per_iteration if row.followed_plan]
    assert len(planned) >= 5, report.pause_reason or report.guard_reason
    assert [row.plan_ids_missing for row in planned] == [0] * len(planned)
    named = sum(entry.kind != "other" for entry in plan.entries)
    assert all(named <= row.planned_offloads <= len(plan.entries) for row in planned), \
        [(row.planned_offloads, len(plan.entries)) for row in planned]


@pytest.mark.parametrize("mode", ["closure", "micro"])
def test_gradients_made_inside_a_closure_step_follow_every_period_plan(tmp_path, mode):
    """The most migration a trace allows (every idle period of every movable tensor, both tiers,
    half the peak): `closure` zero_grads and runs forward and backward inside the step; `micro`
    (a manual closure loop with gradient accumulation) runs two micro-batches inside it."""
    trace, peak = _profile(tmp_path, mode)
    plan = every_period_plan(trace, peak // 2)
    grads = [entry for entry in plan.entries if entry.kind == "gradient"]
    assert grads and all(entry.tensor.endswith(".grad") for entry in grads)   # named by owner in the trace
    save_plan(plan, tmp_path / "plan.json")
    report = _run_both_ways(tmp_path, tmp_path / "plan.json", mode)
    _assert_every_entry_followed(report, plan)
    # (an entry's offload before autograd's accumulation hook names the storage a gradient is
    # counted as `other`, in the plain loop too: the count by kind is a lower bound)
    assert report.offloaded_bytes_by_kind.get("gradient", 0) > 0


def test_a_closure_step_follows_the_gradient_entries_of_a_teraio_plan(tmp_path):
    """The planner's own plan at 70% of the peak moves some gradients: all its entries are followed."""
    trace, peak = _profile(tmp_path, "closure")
    ok(teraio("plan", tmp_path / "t.msgpack", "--gpu-mem", int(peak * 0.7), "--ssds", 0, "--host-mem", peak,
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    plan = load_plan(tmp_path / "plan.json")
    assert any(entry.kind == "gradient" for entry in plan.entries)
    report = _run_both_ways(tmp_path, tmp_path / "plan.json", "closure")
    _assert_every_entry_followed(report, plan)
    assert report.peak_device_bytes <= report.budget_bytes
