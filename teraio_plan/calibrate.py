"""`teraio plan --calibrate REPORT`: the model's figures measured by a run of the same job.

Note [Calibration]
A plan is a prediction; the rates it is made with are guesses (the defaults, or the user's
figures) until a run measures them. A run report has, for the iterations that followed the
plan (the first of them left out when more did: Note [Steady iterations] in
teraio/formats/report.py):
- the achieved rate of each copy path over the whole run (bytes moved over the time the path
  was busy, both directions running together as they do in a run; the unplanned first
  iterations' evictions count too): the host tier's rate becomes the
  bytes-weighted rate of d2h and h2d (the model has one figure for both), the SSD's the
  run's aggregate rate divided among --ssds (the run is assumed to have striped over as
  many swap folders as the plan gives drives);
- the host time of the job's thread, medians over those iterations, per action and per kernel,
  so that a plan at another budget (more or fewer copies and replays) is charged for its own
  actions (Note [Host-bound kernels] in simulator.py): host_us_per_copy, the time starting a
  copy out or in (device re-allocation included) per copy; host_us_per_replay, the time
  replaying an op per replay (on a GPU: launching it); host_us_per_kernel, the rest per
  kernel. On a GPU that rest is the walk and the agent, stalls, copies and replays taken out,
  plus the time inside the ops' calls (PyTorch's launch cost) and the job's own code between
  ops (gaps under 1 ms: Note [Time between ops] in teraio/walk.py; reports from before it was
  measured give 0). On the CPU, where
  the thread runs the kernels itself, it is everything but the time inside the ops, the
  stalls, the copies and the replays (the walk, the job's Python, the dispatch). A CPU replay
  runs the op itself, whose time the simulator already puts on the compute timeline (the
  producer's traced time times kernel_time_scale, Note [Replays] in simulator.py):
  host_us_per_replay is not measured there and replay time is left out of the rest too (on the
  example, 93 replays took 14.6 ms an iteration, ~8 ms of it the ops' own run by their share
  of the traced kernel time: the remainder, ~70 us a replay of re-allocation and bookkeeping,
  is not charged). A copy started inside a stall counts in both; the rest is floored at 0. A
  report from before copies and replays were counted (0; older reports timed replays without
  counting them) gives host_us_per_kernel alone, with the actions in it, at the calibrating
  plan's density of actions: calibrate again from a run of the plan you make;
- on the CPU, where the thread runs the kernels itself, their time too: the run's time inside
  the ops over the trace's kernel time scales the replayed kernels (kernel_time_scale; the
  profiler's kernels took ~1.6x the run's on the example, and more when the box was busier
  while profiling). A GPU run does not time its kernels: the scale stays 1 there.
A figure the user gives on the command line wins over the measured one. The plan says what
was measured (PlannerInputs.calibration) so a reader knows which numbers are the machine's,
and what the run measured where a given option won (Calibration.overridden): adding
--calibrate to a command that already names --host-gbps used to keep the guess without a word,
and on the H200's 3B at 1/4 (a 37 GB/s guess, 51.9 measured) that left the calibrated
prediction 13% slow where the measured rate gives -1% (docs/planner.md).
"""

from pathlib import Path
from statistics import median

from teraio.errors import FileFormatError, UsageError
from teraio.formats.plan import Calibration, PlannerInputs
from teraio.formats.report import RunReport, load_report, steady_iterations
from teraio.formats.trace import Trace


def calibrated(inputs: PlannerInputs, trace: Trace, report_path: Path, given: set[str],
               trace_name: str = "this trace") -> PlannerInputs:
    """`inputs` with the figures the report measured, except those in `given` (input names)."""
    try:
        report = load_report(report_path)
    except FileFormatError as err:
        raise FileFormatError(f"--calibrate: {err}") from None
    _check_same_job(trace, report, report_path, trace_name)
    rows = [report.per_iteration[i] for i in steady_iterations([row.followed_plan for row in report.per_iteration])]
    if not rows:
        raise UsageError(f"--calibrate: {report_path} has no iteration that followed its plan "
                         f"({report.iterations} ran): {_why_unplanned(report)}")
    measured = _measured_rates(report, inputs.num_ssds)
    on_cpu = report.header.device == "cpu"
    measured.update(_host_us(rows, on_cpu))
    if on_cpu and trace.duration_us.sum() > 0:  # the kernels' own time, measured where the thread runs them
        measured["kernel_time_scale"] = median(row.op_launch_ms for row in rows) * 1e3 / float(trace.duration_us.sum())
    if measured.get("host_gbps", 0) > inputs.pcie_gbps:
        measured["pcie_gbps"] = measured["host_gbps"]  # the link carried it: it is at least that fast
    measured = {name: round(value, 3) for name, value in measured.items()}
    overridden = {name: value for name, value in measured.items() if name in given}
    measured = {name: value for name, value in measured.items() if name not in given}
    calibration = Calibration(report=str(report_path), measured=measured, planned_iterations=len(rows),
                              overridden=overridden)
    return inputs.model_copy(update={**measured, "calibration": calibration})


def _check_same_job(trace: Trace, report: RunReport, report_path: Path, trace_name: str) -> None:
    if report.header.plan_op_digest != trace.header.op_digest:
        raise UsageError(f"--calibrate: {report_path} is a run of another job (its plan's trace has op digest "
                         f"{report.header.plan_op_digest}, {trace_name} {trace.header.op_digest}): calibrate "
                         "with the report of a run of a plan made from this trace")


def _why_unplanned(report: RunReport) -> str:
    """What the run said about it, and what to do."""
    if report.guard_reason:
        return f"{report.guard_reason}; calibrate from a run of this job whose iterations matched"
    if report.pause_reason:
        return f"the plan paused ({report.pause_reason}); calibrate from a run whose iterations follow it"
    return "run the job for more steps (at least 3) under the plan, then calibrate again"


def _host_us(rows: list, on_cpu: bool) -> dict[str, float]:
    """Note [Calibration]: the thread's time per kernel, per copy and per replay."""
    host_us = {"host_us_per_kernel": median(_per_kernel_us(row, on_cpu) for row in rows)}
    per_copy_us = [row.copy_issue_ms * 1e3 / row.copies_issued for row in rows if row.copies_issued]
    if per_copy_us:
        host_us["host_us_per_copy"] = median(per_copy_us)
    per_replay_us = [row.replay_ms * 1e3 / row.replays for row in rows if row.replays]
    if per_replay_us and not on_cpu:  # on the CPU a replay is mostly the op's run: the device's time
        host_us["host_us_per_replay"] = median(per_replay_us)
    return host_us


def _per_kernel_us(row, on_cpu: bool) -> float:
    """The thread's time per kernel but for stalls, copies and replays (charged per action).
    A report from before they were counted (copies_issued, replays 0) keeps them in here."""
    replay_ms = row.replay_ms if row.replays else 0.0   # older reports timed replays without counting them
    actions_ms = row.stall_ms + row.copy_issue_ms + replay_ms
    if on_cpu:  # all of the iteration but the kernels (inside the ops)
        return max(0.0, row.ms - row.op_launch_ms - actions_ms) * 1e3 / row.kernels
    return max(0.0, row.walk_ms - actions_ms + row.op_launch_ms + row.between_ops_ms) * 1e3 / row.kernels


def _measured_rates(report: RunReport, num_ssds: int) -> dict[str, float]:
    achieved = report.achieved_gbps
    measured = {}
    host_bytes = {"d2h": report.written_bytes.get("host", 0), "h2d": report.prefetched_bytes.get("host", 0)}
    busy_s = sum(nbytes / (achieved[path] * 1e9) for path, nbytes in host_bytes.items() if achieved.get(path))
    if busy_s > 0:
        measured["host_gbps"] = sum(n for p, n in host_bytes.items() if achieved.get(p)) / busy_s / 1e9
    if num_ssds > 0:
        for path, name in (("d2s", "ssd_write_gbps"), ("s2d", "ssd_read_gbps")):
            if achieved.get(path):
                measured[name] = achieved[path] / num_ssds
    return measured
