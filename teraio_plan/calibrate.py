"""`teraio plan --calibrate REPORT`: the model's figures measured by a run of the same job.

Note [Calibration]
A plan is a prediction; the rates it is made with are guesses (the defaults, or the user's
figures) until a run measures them. A run report has, for the iterations that followed the
plan:
- the achieved rate of each copy path over the whole run (bytes moved over the time the path
  was busy, both directions running together as they do in a run; the unplanned first
  iterations' evictions count too): the host tier's rate becomes the
  bytes-weighted rate of d2h and h2d (the model has one figure for both), the SSD's the
  run's aggregate rate divided among --ssds (the run is assumed to have striped over as
  many swap folders as the plan gives drives);
- the host time of the job's thread per kernel, median over those iterations: on a GPU the
  walk and the agent (stalls taken out) plus the time inside the ops' calls (PyTorch's launch
  cost); the job's own Python between ops is not separable from waiting for the device there
  and is left out. On the CPU, where the thread runs the kernels itself, everything but the
  time inside the ops and the stalls (the walk, the job's Python, the dispatch). The simulator makes the device wait for a thread slower than its kernels
  (Note [Host-bound kernels] in simulator.py). It is a cost per kernel at the calibrating
  plan's density of actions: a plan at another budget moves more or fewer tensors, so
  calibrate again from a run of it when the prediction must hold closely;
- on the CPU, where the thread runs the kernels itself, their time too: the run's time inside
  the ops over the trace's kernel time scales the replayed kernels (kernel_time_scale; the
  profiler's kernels took ~1.6x the run's on the example, and more when the box was busier
  while profiling). A GPU run does not time its kernels: the scale stays 1 there.
A figure the user gives on the command line wins over the measured one. The plan says what
was measured (PlannerInputs.calibration) so a reader knows which numbers are the machine's.
"""

from pathlib import Path
from statistics import median

from teraio.errors import FileFormatError, UsageError
from teraio.formats.plan import Calibration, PlannerInputs
from teraio.formats.report import RunReport, load_report
from teraio.formats.trace import Trace

# planner input -> the command-line option that sets it (a given option is never overridden)
OPTION_OF = {"host_gbps": "--host-gbps", "pcie_gbps": "--pcie-gbps", "ssd_read_gbps": "--ssd-read-gbps",
             "ssd_write_gbps": "--ssd-write-gbps"}


def calibrated(inputs: PlannerInputs, trace: Trace, report_path: Path, given: set[str],
               trace_name: str = "this trace") -> PlannerInputs:
    """`inputs` with the figures the report measured, except those in `given` (input names)."""
    try:
        report = load_report(report_path)
    except FileFormatError as err:
        raise FileFormatError(f"--calibrate: {err}") from None
    _check_same_job(trace, report, report_path, trace_name)
    rows = [row for row in report.per_iteration if row.followed_plan]
    if not rows:
        raise UsageError(f"--calibrate: {report_path} has no iteration that followed its plan "
                         f"({report.iterations} ran): {_why_unplanned(report)}")
    measured = _measured_rates(report, inputs.num_ssds)
    on_cpu = report.header.device == "cpu"
    measured["host_us_per_kernel"] = _host_us_per_kernel(rows, on_cpu)
    if on_cpu and trace.duration_us.sum() > 0:  # the kernels' own time, measured where the thread runs them
        measured["kernel_time_scale"] = median(row.op_launch_ms for row in rows) * 1e3 / float(trace.duration_us.sum())
    if measured.get("host_gbps", 0) > inputs.pcie_gbps:
        measured["pcie_gbps"] = measured["host_gbps"]  # the link carried it: it is at least that fast
    measured = {name: round(value, 3) for name, value in measured.items() if name not in given}
    calibration = Calibration(report=str(report_path), measured=measured, planned_iterations=len(rows))
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


def _host_us_per_kernel(rows: list, on_cpu: bool) -> float:
    """Note [Calibration]: the thread's time per kernel, stalls out."""
    def per_kernel_us(row) -> float:
        if on_cpu:  # all of the iteration but the kernels (inside the ops) and the stalls
            return (row.ms - row.op_launch_ms - row.stall_ms) * 1e3 / row.kernels
        return (row.walk_ms - row.stall_ms + row.op_launch_ms) * 1e3 / row.kernels
    return median(per_kernel_us(row) for row in rows)


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
