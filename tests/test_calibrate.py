"""teraio plan --calibrate: a plan made with what a run of the job measured predicts that run.

Through the real CLI on the bundled example (CPU): profile, plan at half the peak, run with a
report, plan again from the report (Note [Calibration] in teraio_plan/calibrate.py).
"""

import json
import re
from statistics import median

import msgpack
import pytest

from teraio.formats.plan import load_plan
from teraio.formats.report import IterationRow, load_report, save_report, steady_iterations
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from teraio.views import measured_figures
from teraio_plan import planner_inputs, simulate
from teraio_plan.calibrate import calibrated
from teraio_run.report import calibrate_hint, slow_trace_hint
from cli_helpers import EXAMPLE, PYTHON, ROOT, ok, one_line_error, teraio

ARGS = ("--device", "cpu", "--steps", "6")
GiB = 2**30


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A trace, a host-only plan at half its peak, and the report of a run under it."""
    tmp = tmp_path_factory.mktemp("calibrate")
    ok(teraio("profile", "-o", tmp / "trace.msgpack", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp))
    budget = int(live_bytes_per_kernel(load_trace(tmp / "trace.msgpack")).max()) // 2
    plan_args = ("--gpu-mem", budget, "--ssds", 0, "--host-mem", 2 * budget)
    ok(teraio("plan", tmp / "trace.msgpack", *plan_args, "-o", tmp / "plan.json", cwd=tmp))
    proc = ok(teraio("run", "--plan", tmp / "plan.json", "--report", tmp / "run.json", "--", PYTHON, EXAMPLE,
                     *ARGS, cwd=tmp))
    (tmp / "run.stderr").write_text(proc.stderr)
    assert load_report(tmp / "run.json").iterations_on_plan >= 2
    return tmp, plan_args


def test_a_calibrated_plan_predicts_the_measured_iteration_within_ten_percent(work):
    tmp, plan_args = work
    proc = ok(teraio("plan", tmp / "trace.msgpack", *plan_args, "--calibrate", tmp / "run.json",
                     "-o", tmp / "calibrated.json", "--json", cwd=tmp))
    summary = json.loads(proc.stdout)
    assert summary["calibration"]["report"] == str(tmp / "run.json") and summary["host_time_charged"]
    calibrated, guessed = load_plan(tmp / "calibrated.json"), load_plan(tmp / "plan.json")
    calibration = calibrated.header.inputs.calibration
    assert {"host_gbps", "host_us_per_kernel"} <= calibration.measured.keys()
    assert calibrated.header.inputs.host_us_per_kernel == calibration.measured["host_us_per_kernel"] > 0
    assert guessed.header.inputs.calibration is None
    measured_ms = load_report(tmp / "run.json").measured_iteration_ms
    error = {name: abs(plan.header.prediction.iteration_ms - measured_ms) / measured_ms
             for name, plan in (("calibrated", calibrated), ("guessed", guessed))}
    # the guess is 27-76% off on this box (no host time charged); the calibrated plan predicts its
    # own run within 0.3-0.6% (issue 16 asks 10%). "Closer than the guess" failed once (its numbers
    # not kept): a box busy while profiling can make the guess land near by chance
    assert error["calibrated"] < 0.10, error


def test_the_run_summary_says_how_to_calibrate_a_plan_that_charged_no_host_time(work):
    """On the CPU the job's thread is most of a planned step and default rates charge none of
    it: the summary compared 264 ms measured with 99.8 predicted and said nothing more."""
    tmp, plan_args = work
    summary = " ".join((tmp / "run.stderr").read_text().split())
    report, inputs = load_report(tmp / "run.json"), load_plan(tmp / "plan.json").header.inputs
    # whether this run went past its prediction depends on the machine: the summary says what the hint says
    assert (calibrate_hint(inputs, report, str(tmp / "run.json")) != "") == ("charges no host time" in summary)
    slow = report.model_copy(update={"measured_iteration_ms": 2 * report.predicted_iteration_ms})
    hint = calibrate_hint(inputs, slow, str(tmp / "run.json"))
    assert "the prediction charges no host time" in hint and f"--calibrate {tmp / 'run.json'}" in hint
    on_time = report.model_copy(update={"measured_iteration_ms": report.predicted_iteration_ms})
    assert calibrate_hint(inputs, on_time, str(tmp / "run.json")) == ""
    # the first iteration runs unplanned: the summary tells its stalls from the planned ones'
    assert re.search(r"stalls: [^(]+ \([^)]+ in the \d+ planned iterations\) over \d+ waits", summary), summary
    ok(teraio("plan", tmp / "trace.msgpack", *plan_args, "--calibrate", tmp / "run.json", "-o",
              tmp / "hinted.json", cwd=tmp))
    proc = ok(teraio("run", "--plan", tmp / "hinted.json", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp))
    assert "charges no host time" not in " ".join(proc.stderr.split())


def test_a_run_far_quicker_than_its_traces_kernels_says_to_profile_again(work):
    """Note [A trace slower than the run] in teraio_run/report.py: a diffusers UNet profiled
    while the machine was busy predicted 1.66 s an iteration against 0.12-0.54 s measured, and
    nothing said the trace was off. A trace whose kernel times are 20 times this machine's (as
    one taken on a machine that busy) must make the summary say so; a run as quick as its trace not."""
    tmp, plan_args = work
    raw = msgpack.unpackb((tmp / "trace.msgpack").read_bytes(), raw=False)
    raw["kernels"]["duration_us"] = [20 * us for us in raw["kernels"]["duration_us"]]
    (tmp / "slow.msgpack").write_bytes(msgpack.packb(raw, use_bin_type=True))
    ok(teraio("plan", tmp / "slow.msgpack", *plan_args, "-o", tmp / "slow.json", cwd=tmp))
    proc = ok(teraio("run", "--plan", tmp / "slow.json", "--report", tmp / "slow-run.json", "--", PYTHON, EXAMPLE,
                     *ARGS, cwd=tmp))
    summary = " ".join(proc.stderr.split())
    assert "the profile timed them on a busier or slower machine" in summary, summary
    prediction, report = load_plan(tmp / "slow.json").header.prediction, load_report(tmp / "slow-run.json")
    assert report.measured_iteration_ms < prediction.ideal_iteration_ms / 2
    own = load_plan(tmp / "plan.json").header.prediction
    as_traced = load_report(tmp / "run.json").model_copy(update={"measured_iteration_ms": own.ideal_iteration_ms})
    assert slow_trace_hint(own, as_traced) == ""


def test_a_figure_given_on_the_command_line_wins_over_the_measured_one_and_the_plan_says_what_was_measured(work):
    """A plan command that names --host-gbps and adds --calibrate kept the guess without a word
    (on the H200's 3B at 1/4: 37 GB/s given, 51.9 measured, the prediction 13% slow)."""
    tmp, plan_args = work
    ok(teraio("plan", tmp / "trace.msgpack", *plan_args, "--host-gbps", 12.5, "--calibrate", tmp / "run.json",
              "-o", tmp / "given.json", cwd=tmp))
    inputs = load_plan(tmp / "given.json").header.inputs
    assert inputs.host_gbps == 12.5 and "host_gbps" not in inputs.calibration.measured
    assert "host_us_per_kernel" in inputs.calibration.measured
    measured_gbps = inputs.calibration.overridden["host_gbps"]
    assert measured_gbps > 0 and measured_gbps != 12.5
    said = measured_figures(inputs.calibration.model_dump())  # the plan summary's "measured" row
    assert f"--host-gbps as given, where the run measured {measured_gbps:.3g} GB/s host (leave it out" in said, said


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


def _calibrated_plan(tmp, plan_args, budget_bytes, report, name):
    args = ("--gpu-mem", budget_bytes, *plan_args[2:])
    ok(teraio("plan", tmp / "trace.msgpack", *args, "--calibrate", tmp / report, "-o", tmp / name, cwd=tmp))
    return load_plan(tmp / name)


def _copies(plan) -> int:
    """Copies a plan starts per iteration: out and in for a move, in only for a clean entry."""
    return sum(1 if e.clean else 2 for e in plan.entries if e.tier != "recompute")


def test_a_plan_with_more_copies_than_the_calibrating_one_is_charged_for_them(work):
    """Note [Host-bound kernels]: the thread's time is per kernel plus per copy, so a plan at a
    lower budget than the calibrating run's is charged for the copies it adds."""
    tmp, plan_args = work
    trace = load_trace(tmp / "trace.msgpack")
    budget_bytes = int(plan_args[1])
    same = _calibrated_plan(tmp, plan_args, budget_bytes, "run.json", "same.json")
    lower = _calibrated_plan(tmp, plan_args, budget_bytes * 2 // 3, "run.json", "lower.json")
    inputs = same.header.inputs
    assert inputs.host_us_per_copy == inputs.calibration.measured["host_us_per_copy"] > 0
    assert _copies(lower) > _copies(same)
    for plan in (same, lower):
        expected_ms = (trace.num_kernels * inputs.host_us_per_kernel + _copies(plan) * inputs.host_us_per_copy) / 1e3
        assert simulate(trace, plan).host_ms == pytest.approx(expected_ms)
    assert simulate(trace, lower).host_ms > simulate(trace, same).host_ms


def _old_report(tmp):
    """run.json as a runtime from before copies and replays were counted wrote it."""
    raw = json.loads((tmp / "run.json").read_text())
    for row in raw["per_iteration"]:
        for key in ("copies_issued", "copy_issue_ms", "replays", "replay_ms", "restore_alloc_ms",
                    "allocator_syncs", "alloc_retries"):
            row.pop(key, None)
    (tmp / "old.json").write_text(json.dumps(raw))
    return load_report(tmp / "old.json")


def test_a_report_from_before_copies_were_counted_gives_one_figure_per_kernel_as_before(work):
    tmp, plan_args = work
    old = _old_report(tmp)
    old_inputs = _calibrated_plan(tmp, plan_args, int(plan_args[1]), "old.json", "old_plan.json").header.inputs
    assert not {"host_us_per_copy", "host_us_per_replay"} & old_inputs.calibration.measured.keys()
    assert old_inputs.host_us_per_copy == 0 and old_inputs.host_us_per_replay == 0
    rows = [old.per_iteration[i] for i in steady_iterations([row.followed_plan for row in old.per_iteration])]
    per_kernel_us = median((row.ms - row.op_launch_ms - row.stall_ms) * 1e3 / row.kernels for row in rows)
    assert old_inputs.host_us_per_kernel == round(per_kernel_us, 3)    # copies stay in the figure per kernel
    new_inputs = _calibrated_plan(tmp, plan_args, int(plan_args[1]), "run.json", "new_plan.json").header.inputs
    assert new_inputs.host_us_per_kernel < old_inputs.host_us_per_kernel  # copies taken out, charged per copy


def _report_with_rows(tmp, device: str, rows: list[dict]):
    """run.json's header (this job) on `device`, with planned iterations of the given host times."""
    report = load_report(tmp / "run.json")
    base = dict(followed_plan=True, kernels=1000, planned_offloads=0, plan_ids_missing=0, evictions=0,
                oom_retries=0, offloaded_bytes=0)
    per_iteration = [IterationRow(**{"iteration": i, **base, **row}) for i, row in enumerate(rows)]
    header = report.header.model_copy(update={"device": device})
    path = tmp / f"rows-{device.replace(':', '')}.json"
    save_report(report.model_copy(update={"header": header, "per_iteration": per_iteration}), path)
    return path


FIRST_PLANNED = dict(ms=2000.0, walk_ms=1500.0, op_launch_ms=300.0, stall_ms=100.0, copies_issued=300,
                     copy_issue_ms=600.0, replays=50, replay_ms=300.0)   # starts from the unplanned state
ROWS = [FIRST_PLANNED,
        dict(ms=300.0, walk_ms=150.0, op_launch_ms=20.0, stall_ms=10.0, copies_issued=100, copy_issue_ms=40.0,
             replays=50, replay_ms=30.0),
        dict(ms=310.0, walk_ms=160.0, op_launch_ms=20.0, stall_ms=10.0, copies_issued=100, copy_issue_ms=50.0,
             replays=50, replay_ms=30.0),
        dict(ms=900.0, walk_ms=700.0, op_launch_ms=20.0, stall_ms=400.0, copies_issued=200, copy_issue_ms=60.0,
             replays=0, replay_ms=0.0)]


def test_host_time_is_measured_per_copy_per_replay_and_per_kernel_on_a_gpu(work):
    tmp, plan_args = work
    trace = load_trace(tmp / "trace.msgpack")
    inputs = planner_inputs(trace, gpu_mem_bytes=int(plan_args[1]), num_ssds=0, host_mem_bytes=GiB)
    measured = calibrated(inputs, trace, _report_with_rows(tmp, "cuda:0", ROWS), set()).calibration.measured
    assert measured["host_us_per_copy"] == 400.0       # median of 400, 500 and 300 us (not the first's 2,000)
    assert measured["host_us_per_replay"] == 600.0     # the iterations that replayed
    assert measured["host_us_per_kernel"] == 90.0      # median of walk - stall - copies - replays + launch: 90, 90, 260


def test_on_a_gpu_the_jobs_own_code_between_ops_is_charged_per_kernel(work):
    """Note [Time between ops]: a job of short kernels waits for its own Python too; a report that
    measured it (between_ops_ms) adds it to the figure per kernel."""
    tmp, plan_args = work
    trace = load_trace(tmp / "trace.msgpack")
    inputs = planner_inputs(trace, gpu_mem_bytes=int(plan_args[1]), num_ssds=0, host_mem_bytes=GiB)
    rows = [{**row, "between_ops_ms": 30.0} for row in ROWS]
    measured = calibrated(inputs, trace, _report_with_rows(tmp, "cuda:0", rows), set()).calibration.measured
    assert measured["host_us_per_kernel"] == 120.0     # 90 as above, plus 30 ms over 1000 kernels


def test_on_the_cpu_a_replay_is_the_ops_run_not_host_time(work):
    """Note [Calibration]: the simulator puts a replayed op's time on the compute timeline, so a
    CPU run's replay time is charged neither per replay nor per kernel."""
    tmp, plan_args = work
    trace = load_trace(tmp / "trace.msgpack")
    inputs = planner_inputs(trace, gpu_mem_bytes=int(plan_args[1]), num_ssds=0, host_mem_bytes=GiB)
    measured = calibrated(inputs, trace, _report_with_rows(tmp, "cpu", ROWS), set()).calibration.measured
    assert "host_us_per_replay" not in measured and measured["host_us_per_copy"] == 400.0
    assert measured["host_us_per_kernel"] == 200.0     # median of ms - launch - stall - copies - replays: 200, 200, 420


def test_a_recorded_run_that_timed_replays_without_counting_them_calibrates_as_before(work):
    """The 3B chained-replay run on the H200 (0f93f70) has replay_ms but no replays nor copies:
    its replay time stays in the figure per kernel, as when it was recorded."""
    tmp, plan_args = work
    line = (ROOT / "bench/results/2026-12-01-recompute-chains-0f93f70/chains.jsonl").read_text().splitlines()[0]
    rows = [row for row in json.loads(line)["metrics"]["teraio"]["per_iteration"] if row["followed_plan"]]
    assert rows and all(row["replay_ms"] > 0 and "replays" not in row for row in rows)
    trace = load_trace(tmp / "trace.msgpack")
    inputs = planner_inputs(trace, gpu_mem_bytes=int(plan_args[1]), num_ssds=0, host_mem_bytes=GiB)
    measured = calibrated(inputs, trace, _report_with_rows(tmp, "cuda:0", rows), set()).calibration.measured
    per_kernel_us = median((r["walk_ms"] - r["stall_ms"] + r["op_launch_ms"]) * 1e3 / r["kernels"] for r in rows[1:])
    assert measured["host_us_per_kernel"] == round(per_kernel_us, 3)
    assert not {"host_us_per_copy", "host_us_per_replay"} & measured.keys()


def test_the_first_planned_iteration_moves_neither_the_measured_iteration_nor_the_calibration(work):
    """Note [Steady iterations]: the first iteration on plan starts from what the unplanned ones
    left (more copies, evictions), which the plan does not predict."""
    tmp, plan_args = work
    report = load_report(tmp / "run.json")
    planned = [row for row in report.per_iteration if row.followed_plan]
    assert report.measured_iteration_ms == pytest.approx(median(row.ms for row in planned[1:]), abs=1e-3)
    trace = load_trace(tmp / "trace.msgpack")
    inputs = planner_inputs(trace, gpu_mem_bytes=int(plan_args[1]), num_ssds=0, host_mem_bytes=GiB)
    calibration = calibrated(inputs, trace, _report_with_rows(tmp, "cuda:0", ROWS), set()).calibration
    assert calibration.planned_iterations == 3    # of 4 on plan; with the first: 450 us per copy, not 400
    assert calibration.measured["host_us_per_copy"] == 400.0
    single = calibrated(inputs, trace, _report_with_rows(tmp, "cuda:0", ROWS[:1]), set()).calibration
    assert single.planned_iterations == 1 and single.measured["host_us_per_copy"] == 2000.0  # the only one there is


def test_a_tie_within_the_models_error_keeps_the_plan_with_fewer_copies():
    """Note [Ties between plans], on the LoRA case recorded on the H200 (ed22602): calibrated from
    its run, the plan with replays and the moves-only one predict within 0.3% of each other;
    the one kept starts fewer copies per iteration, the plan that measured 5% faster."""
    from teraio_plan.make import TIE_SHARE, copies_per_iteration, make_plan_outcome

    recorded = ROOT / "bench/results/2026-12-05-lora-calibrated-h200-ed22602"
    trace = load_trace(recorded / "trace_lora.msgpack")
    half_peak = json.loads((recorded / "trace_stats_lora.json").read_text())["peak_bytes"] // 2
    inputs = planner_inputs(trace, gpu_mem_bytes=half_peak, num_ssds=0, host_mem_bytes=64 * GiB, host_gbps=37,
                            pcie_gbps=55, headroom_bytes=GiB)
    inputs = calibrated(inputs, trace, recorded / "run_lora.json", given={"host_gbps", "pcie_gbps"})
    kept = make_plan_outcome(trace, inputs).plan
    moves_only = make_plan_outcome(trace, inputs.model_copy(update={"recompute": False})).plan
    assert kept.header.prediction.fits and moves_only.header.prediction.fits
    assert kept.header.prediction.iteration_ms > moves_only.header.prediction.iteration_ms   # slower, by a tie
    assert kept.header.prediction.iteration_ms <= moves_only.header.prediction.iteration_ms * (1 + TIE_SHARE)
    assert any(e.tier == "recompute" for e in kept.entries)
    assert copies_per_iteration(kept.entries) < copies_per_iteration(moves_only.entries)
