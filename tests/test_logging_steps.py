"""A loop that logs every few steps (tests/clients/log_every.py, as the Hugging Face Trainer
does) runs ops there that the traced iteration lacks, right after the step: those iterations
used to leave the plan at their first op and run unplanned (a fifth of a Trainer's iterations
with logging_steps=5). The plan steps over them (Note [Ops the trace lacks] in
teraio_run/agent.py)."""

import json

from cli_helpers import PYTHON, ok, teraio
from runtime_helpers import plan_at_half_peak
from test_clients import CLIENTS, run_plain, run_planned

SCRIPT = "log_every.py"


def test_iterations_that_log_stay_on_plan_and_train_bit_for_bit(tmp_path):
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / SCRIPT, cwd=tmp_path))
    plan, budget = plan_at_half_peak(tmp_path / "t.msgpack", "teraio-plan", tmp_path)
    run_plain(tmp_path, SCRIPT, "--out", "plain.json")
    proc, report = run_planned(tmp_path, plan, SCRIPT, "--out", "planned.json")
    assert json.load(open(tmp_path / "planned.json")) == json.load(open(tmp_path / "plain.json"))
    logging = [row for row in report.per_iteration if row.iteration % 5 == 0 and row.iteration > 0]
    assert logging and all(row.ops_stepped_over > 0 and row.followed_plan for row in logging), report.per_iteration
    assert report.plan_pauses == 0, report.pause_reason
    assert all(row.followed_plan for row in report.per_iteration[1:])
    assert report.peak_device_bytes <= report.budget_bytes == budget
    said = " ".join(proc.stderr.split())
    assert f"were stepped over in {len(logging)} iteration(s), {len(logging)} of which then followed" in said, said
