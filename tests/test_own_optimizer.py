"""A loop with an optimizer of its own (fastai's kind: tests/clients/own_optimizer.py, Adam by
hand, its state in lists, steps marked with teraio_step). The walk cannot name that state (kind
`other`), and plans used to leave it in place: the smallest plan that fit needed 82% of the
traced peak. The runtime moves such storages, made by ops it saw (Note [Storages the job made]
in teraio/walk.py); the trace now says which (movable_other), and the planner moves them too.
"""

import torch

from cli_helpers import PYTHON, ok, teraio
from runtime_helpers import assert_mostly_on_plan_within_budget, plan_at_half_peak
from teraio.formats.trace import Kind, live_bytes_per_kernel, load_trace
from teraio_plan.memory import min_required_bytes
from test_clients import CLIENTS, run_planned, run_plain

SCRIPT = "own_optimizer.py"


def test_a_hand_written_optimizers_state_is_planned_and_trains_bit_for_bit(tmp_path):
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / SCRIPT, cwd=tmp_path))
    trace = load_trace(tmp_path / "t.msgpack")
    state = (trace.kind == Kind.other) & (trace.born < 0) & (trace.nbytes > 0)
    assert state.sum() >= 28 and trace.movable_other[state].all()   # exp_avg and exp_avg_sq of 14 tensors
    need, _ = min_required_bytes(trace, 0)
    assert need < int(live_bytes_per_kernel(trace).max()) // 2, "the optimizer's state stays in every plan"

    plan, budget = plan_at_half_peak(tmp_path / "t.msgpack", "teraio-plan", tmp_path)
    run_plain(tmp_path, SCRIPT, "--out", "plain.pt")
    _, report = run_planned(tmp_path, plan, SCRIPT, "--out", "planned.pt")
    plain, planned = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "planned.pt")
    assert planned["losses"] == plain["losses"]
    for key in ("exp_avg", "exp_avg_sq"):
        assert all(torch.equal(a, b) for a, b in zip(planned[key], plain[key]))
    assert all(torch.equal(planned["model"][k], v) for k, v in plain["model"].items())
    assert_mostly_on_plan_within_budget(report, budget)
    assert report.offloaded_bytes_by_kind.get("other", 0) > 0, "the state never left"
    assert not report.refused_actions_by_reason, report.first_refusal
    assert report.plan_fits
