"""A plan made for a model of another width (Note [When the plan is followed], Sizes, in
teraio_run/agent.py): the same layers and ops, so the guard's digests match, but other tensor
sizes. The run says so once, naming a tensor, and does not follow the plan; training stays
exact and within the budget; --strict stops the job. A plan that moves nothing still keeps
the budget. Through the real CLI on CPU (tests/clients/widths.py)."""

import json
import re

import pytest

from teraio.errors import PlanMismatchError
from teraio.formats.plan import load_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import PYTHON, ok, teraio
from test_clients import CLIENTS, run_plain

TRACED_WIDTH, OTHER_WIDTH = 64, 80   # 80: 1.56x the weights, still above what one op needs at half the peak
CAUSE = "the plan was made for tensors of other sizes"


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The job profiled at the traced width, and run plainly at both widths."""
    work = tmp_path_factory.mktemp("sizes")
    ok(teraio("profile", "-o", work / "t.msgpack", "--", PYTHON, CLIENTS / "widths.py", "--width", TRACED_WIDTH,
              cwd=work))
    for width in (TRACED_WIDTH, OTHER_WIDTH):
        run_plain(work, "widths.py", "--width", width, "--out", f"plain{width}.json")
    return work, int(live_bytes_per_kernel(load_trace(work / "t.msgpack")).max())


def plan_for(work, tmp_path, budget_bytes: int):
    path = tmp_path / "plan.json"
    ok(teraio("plan", work / "t.msgpack", "--gpu-mem", budget_bytes, "--host-mem", "1MiB", "-o", path, cwd=tmp_path))
    return path


def run_at(tmp_path, plan, width: int, *extra):
    out, report = tmp_path / f"losses{width}.json", tmp_path / f"run{width}.json"
    proc = teraio("run", "--plan", plan, "--report", report, "--ssd-dir", tmp_path / "ssd", *extra, "--",
                  PYTHON, CLIENTS / "widths.py", "--width", width, "--out", out, cwd=tmp_path)
    return proc, out, report


def same_losses(work, out, width: int) -> bool:
    return json.loads(out.read_text()) == json.loads((work / f"plain{width}.json").read_text())


def test_a_plan_for_another_width_is_said_once_and_not_followed(traced, tmp_path):
    work, peak = traced
    plan = plan_for(work, tmp_path, peak // 2)
    assert load_plan(plan).entries
    # at the traced width the sizes match: the plan is followed, no trip
    proc, out, report = run_at(tmp_path, plan, TRACED_WIDTH)
    ok(proc)
    assert CAUSE not in proc.stderr and load_report(report).guard_trips == 0
    assert load_report(report).iterations_on_plan >= 2 and same_losses(work, out, TRACED_WIDTH)
    # at another width: one line naming a tensor and both sizes, then unplanned, exact, within budget
    proc, out, report = run_at(tmp_path, plan, OTHER_WIDTH)
    ok(proc)
    said = [line for line in proc.stderr.splitlines() if CAUSE in line]
    # one of the weights or their AdamW moments (which one depends on the plan's order)
    assert len(said) == 1 and re.search(r"\d\.0\.weight\S* is 25 KiB here, 16 KiB in the plan's trace", said[0]), \
        proc.stderr
    assert "profile this job again" in said[0]
    run = load_report(report)
    assert run.guard_trips == 1 and run.guard_reason.startswith(CAUSE)
    assert run.iterations_on_plan == 0 and not any(row.followed_plan for row in run.per_iteration)
    assert run.peak_device_bytes <= run.budget_bytes == peak // 2
    assert same_losses(work, out, OTHER_WIDTH)


def test_strict_stops_a_run_of_another_width_in_one_line(traced, tmp_path):
    work, peak = traced
    proc, _, _ = run_at(tmp_path, plan_for(work, tmp_path, peak // 2), OTHER_WIDTH, "--strict")
    assert proc.returncode == PlanMismatchError.exit_code and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if CAUSE in line]
    assert len(said) == 1 and said[0].startswith("teraio: error:") and "stopping the job (--strict)" in said[0]


def test_a_plan_that_moves_nothing_still_keeps_the_budget(traced, tmp_path):
    """The traced width fits the budget, so the plan has no entries; the wider job does not fit
    it, and only the budget keeper holds it there (before, the run stayed out entirely: no cap,
    no report)."""
    work, peak = traced
    budget = peak * 5 // 4
    plan = plan_for(work, tmp_path, budget)
    assert not load_plan(plan).entries and load_plan(plan).header.prediction.fits
    proc, out, report = run_at(tmp_path, plan, OTHER_WIDTH)
    ok(proc)
    assert "moves nothing" in proc.stderr
    run = load_report(report)
    assert run.on_demand_evictions > 0 and run.peak_device_bytes <= run.budget_bytes == budget
    assert same_losses(work, out, OTHER_WIDTH)
