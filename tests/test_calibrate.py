"""teraio plan --calibrate: a plan made with what a run of the job measured predicts that run.

Through the real CLI on the bundled example (CPU): profile, plan at half the peak, run with a
report, plan again from the report (Note [Calibration] in teraio_plan/calibrate.py).
"""

import json

import pytest

from teraio.formats.plan import load_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import EXAMPLE, PYTHON, ok, one_line_error, teraio

ARGS = ("--device", "cpu", "--steps", "6")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A trace, a host-only plan at half its peak, and the report of a run under it."""
    tmp = tmp_path_factory.mktemp("calibrate")
    ok(teraio("profile", "-o", tmp / "trace.msgpack", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp))
    budget = int(live_bytes_per_kernel(load_trace(tmp / "trace.msgpack")).max()) // 2
    plan_args = ("--gpu-mem", budget, "--ssds", 0, "--host-mem", 2 * budget)
    ok(teraio("plan", tmp / "trace.msgpack", *plan_args, "-o", tmp / "plan.json", cwd=tmp))
    ok(teraio("run", "--plan", tmp / "plan.json", "--report", tmp / "run.json", "--", PYTHON, EXAMPLE, *ARGS,
              cwd=tmp))
    assert load_report(tmp / "run.json").iterations_on_plan >= 2
    return tmp, plan_args


def test_a_calibrated_plan_predicts_the_measured_iteration_closer(work):
    tmp, plan_args = work
    proc = ok(teraio("plan", tmp / "trace.msgpack", *plan_args, "--calibrate", tmp / "run.json",
                     "-o", tmp / "calibrated.json", "--json", cwd=tmp))
    assert json.loads(proc.stdout)["calibration"]["report"] == str(tmp / "run.json")
    calibrated, guessed = load_plan(tmp / "calibrated.json"), load_plan(tmp / "plan.json")
    calibration = calibrated.header.inputs.calibration
    assert {"host_gbps", "host_us_per_kernel"} <= calibration.measured.keys()
    assert calibrated.header.inputs.host_us_per_kernel == calibration.measured["host_us_per_kernel"] > 0
    assert guessed.header.inputs.calibration is None
    measured_ms = load_report(tmp / "run.json").measured_iteration_ms
    error = {name: abs(plan.header.prediction.iteration_ms - measured_ms) / measured_ms
             for name, plan in (("calibrated", calibrated), ("guessed", guessed))}
    assert error["calibrated"] < error["guessed"], error


def test_a_figure_given_on_the_command_line_wins_over_the_measured_one(work):
    tmp, plan_args = work
    ok(teraio("plan", tmp / "trace.msgpack", *plan_args, "--host-gbps", 12.5, "--calibrate", tmp / "run.json",
              "-o", tmp / "given.json", cwd=tmp))
    inputs = load_plan(tmp / "given.json").header.inputs
    assert inputs.host_gbps == 12.5 and "host_gbps" not in inputs.calibration.measured
    assert "host_us_per_kernel" in inputs.calibration.measured


def test_a_report_of_another_job_is_refused_in_one_line(work):
    tmp, plan_args = work
    raw = json.loads((tmp / "run.json").read_text())
    raw["header"]["plan_op_digest"] = "0" * 16
    (tmp / "other.json").write_text(json.dumps(raw))
    line = one_line_error(teraio("plan", tmp / "trace.msgpack", *plan_args, "--calibrate", tmp / "other.json",
                                 "-o", tmp / "no.json", cwd=tmp), 2)
    assert "run of another job" in line and not (tmp / "no.json").exists()


def test_a_report_without_planned_iterations_says_to_run_longer(work):
    tmp, plan_args = work
    raw = json.loads((tmp / "run.json").read_text())
    for row in raw["per_iteration"]:
        row["followed_plan"] = False
    (tmp / "unplanned.json").write_text(json.dumps(raw))
    line = one_line_error(teraio("plan", tmp / "trace.msgpack", *plan_args, "--calibrate",
                                 tmp / "unplanned.json", "-o", tmp / "no.json", cwd=tmp), 2)
    assert "no iteration that followed its plan" in line and "more steps" in line
