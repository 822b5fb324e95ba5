"""No silent fallback: what the runtime will not do of a plan is said once and counted, plans
do not ask for what the runtime refuses, and only steps that train are iterations.

Real jobs through the real CLI on CPU: tests/clients/late_fill.py allocates a large buffer with
torch.empty before its forward and fills it after its backward (Note [Outputs read raw later]
in teraio/walk.py) and can hand a weight out through Tensor.numpy() mid-training;
tests/clients/dcp_state.py collects its optimizer state for a checkpoint the way
torch.distributed.checkpoint does, which steps the optimizer once more.
"""

import json

import torch

from teraio.formats.plan import load_plan, save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import PYTHON, ok, teraio
from runtime_helpers import every_period_plan
from test_clients import CLIENTS, run_plain, run_planned

BUFFER = "Net/empty.0#0"   # late_fill.py's buffer, allocated without a write


def _profile(tmp_path, script: str, *args):
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / script, *args, cwd=tmp_path))
    return load_trace(tmp_path / "t.msgpack")


def _plain_losses(tmp_path, script: str, *args) -> list:
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, script, *args)
    return json.loads((plain / "l.json").read_text())


def test_the_planner_leaves_a_storage_allocated_without_a_write_until_its_first_use(tmp_path):
    """The runtime keeps such a storage in place until an op takes it; the planner planned its
    period from birth to first use anyway (the largest idle tensor of this job), and the run
    refused that entry every iteration, its saving lost."""
    trace = _profile(tmp_path, "late_fill.py", "--steps", 8)
    t = trace.tensor_id.index(BUFFER)
    born, first_use = int(trace.born[t]), int(trace.uses(t)[1])
    assert trace.op_name(born) == "empty" and first_use - born > 10
    budget = int(live_bytes_per_kernel(trace).max()) * 2 // 3
    ok(teraio("plan", tmp_path / "t.msgpack", "--gpu-mem", budget, "--ssds", 1, "--host-mem", budget,
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    plan = load_plan(tmp_path / "plan.json")
    assert plan.entries, "the budget needs some moves"
    assert not [e for e in plan.entries if e.tensor == BUFFER and e.offload_after < first_use]
    proc, report = run_planned(tmp_path, tmp_path / "plan.json", "late_fill.py", "--steps", 8, "--losses-out", "l.json")
    assert json.loads((tmp_path / "l.json").read_text()) == _plain_losses(tmp_path, "late_fill.py", "--steps", 8,
                                                                           "--losses-out", "l.json")
    assert report.refused_actions_by_reason == {} and not any(row.refused_actions for row in report.per_iteration)
    assert "refused" not in proc.stderr


def test_refused_plan_offloads_are_said_once_and_counted_by_reason(tmp_path):
    """A weight handed out through numpy at step 3 never moves again, and the buffer may not
    move before an op has written it: a plan that moves both (every idle period) has offloads
    the runtime refuses. They were skipped without a word; now stderr says the first, the
    rows and the run count them by reason, and the job still trains bit for bit."""
    args = ("--steps", 8, "--numpy-at", 3, "--losses-out", "l.json")
    trace = _profile(tmp_path, "late_fill.py", *args)
    save_plan(every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2), tmp_path / "plan.json")
    proc, report = run_planned(tmp_path, tmp_path / "plan.json", "late_fill.py", *args)
    assert json.loads((tmp_path / "l.json").read_text()) == _plain_losses(tmp_path, "late_fill.py", *args)
    by_reason = report.refused_actions_by_reason
    assert by_reason.get("pinned", 0) > 0 and by_reason.get("unwritten", 0) > 0
    assert sum(row.refused_actions for row in report.per_iteration) <= sum(by_reason.values())
    assert any(row.refused_actions for row in report.per_iteration if row.followed_plan)
    warnings = [line for line in proc.stderr.splitlines() if "was refused" in line]
    assert len(warnings) == 1 and warnings[0].startswith("teraio: warning: the plan's offload of ")
    assert report.first_refusal
    summary = " ".join(proc.stderr.split())
    assert f"{sum(by_reason.values())} plan offloads refused" in summary
    inspected = " ".join(ok(teraio("inspect", tmp_path / "run.json", cwd=tmp_path)).stdout.split())
    assert "plan offloads refused" in inspected and "pinned" in inspected


def test_a_step_a_checkpoint_writer_takes_after_training_is_no_iteration(tmp_path):
    """torch.distributed.checkpoint's get_optimizer_state_dict steps a stateless optimizer once
    more (zero gradients) to create its state: a job of 3 training steps that then saved
    reported 4 iterations. The save still holds the true values."""
    args = ("--steps", 3, "--losses-out", "l.json", "--save", "state.pt")
    trace = _profile(tmp_path, "dcp_state.py", "--steps", 8)   # the profile needs more steps
    save_plan(every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2), tmp_path / "plan.json")
    proc, report = run_planned(tmp_path, tmp_path / "plan.json", "dcp_state.py", *args)
    assert json.loads((tmp_path / "l.json").read_text()) == _plain_losses(tmp_path, "dcp_state.py", *args)
    assert report.iterations == len(report.per_iteration) == 3
    assert report.steps_without_backward == 1
    assert "3 iterations" in proc.stderr and "1 optimizer step(s) with no backward before them, not counted as iterations" in " ".join(proc.stderr.split())
    mine, theirs = torch.load(tmp_path / "state.pt"), torch.load(tmp_path / "plain" / "state.pt")
    assert all(torch.equal(mine["model"][k], theirs["model"][k]) for k in theirs["model"])
