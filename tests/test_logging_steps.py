"""A loop that logs every few steps (tests/clients/log_every.py, as the Hugging Face Trainer
does) runs ops there that the traced iteration lacks, right after the step: those iterations
used to leave the plan at their first op and run unplanned (a fifth of a Trainer's iterations
with logging_steps=5). The plan steps over them (Note [Ops the trace lacks] in
teraio_run/agent.py)."""

from test_clients import planned_json_like_plain


def test_iterations_that_log_stay_on_plan_and_train_bit_for_bit(tmp_path):
    proc, report, budget = planned_json_like_plain(tmp_path, "log_every.py")
    logging = [row for row in report.per_iteration if row.iteration % 5 == 0 and row.iteration > 0]
    assert logging and all(row.ops_stepped_over > 0 and row.followed_plan for row in logging), report.per_iteration
    assert report.plan_pauses == 0, report.pause_reason
    assert all(row.followed_plan for row in report.per_iteration[1:])
    assert report.peak_device_bytes <= report.budget_bytes == budget
    said = " ".join(proc.stderr.split())
    assert f"were stepped over in {len(logging)} iteration(s), {len(logging)} of which then followed" in said, said
