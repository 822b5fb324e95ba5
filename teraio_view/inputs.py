"""Which files `teraio view` was given: a trace with its plan and run report, or two plans."""

from dataclasses import dataclass
from pathlib import Path

from teraio.errors import UsageError
from teraio.formats.common import PLAN_FORMAT, REPORT_FORMAT, TRACE_FORMAT, detect_format, read_raw
from teraio.formats.plan import Plan, load_plan
from teraio.formats.report import RunReport, load_report
from teraio.formats.trace import Trace, load_trace

USAGE = "give a trace with its plan and run report (teraio view trace.msgpack plan.json run.json) or two plans"


@dataclass
class RunFiles:
    """A trace and, where given, the plan made from it and a run report of that plan."""

    trace_path: Path
    trace: Trace
    plan_path: Path | None = None
    plan: Plan | None = None
    report_path: Path | None = None
    report: RunReport | None = None


@dataclass
class TwoPlans:
    old_path: Path
    old: Plan
    new_path: Path
    new: Plan


def load_inputs(paths: list[Path]) -> RunFiles | TwoPlans:
    """Sort the files by what they are (their header says), load them, and check they belong together."""
    kinds = [(detect_format(read_raw(p), p), Path(p)) for p in paths]
    formats = [fmt for fmt, _ in kinds]
    if formats == [PLAN_FORMAT, PLAN_FORMAT]:
        return TwoPlans(kinds[0][1], load_plan(kinds[0][1]), kinds[1][1], load_plan(kinds[1][1]))
    by_format = {}
    for fmt, path in kinds:
        if fmt in by_format:
            raise UsageError(f"{by_format[fmt]} and {path} are both {fmt} files: {USAGE}")
        by_format[fmt] = path
    if TRACE_FORMAT not in by_format:
        raise UsageError(f"no trace among {', '.join(map(str, paths))}: {USAGE}")
    files = RunFiles(by_format[TRACE_FORMAT], load_trace(by_format[TRACE_FORMAT]))
    if PLAN_FORMAT in by_format:
        files.plan_path, files.plan = by_format[PLAN_FORMAT], load_plan(by_format[PLAN_FORMAT])
    if REPORT_FORMAT in by_format:
        files.report_path, files.report = by_format[REPORT_FORMAT], load_report(by_format[REPORT_FORMAT])
    _check_together(files)
    return files


def _check_together(f: RunFiles) -> None:
    """A plan drawn over another job's trace would put its bars at kernels that mean nothing."""
    digest = f.trace.header.op_digest
    if f.plan is not None and f.plan.header.trace.op_digest != digest:
        raise UsageError(f"{f.plan_path} was made from another trace than {f.trace_path} (op digest "
                         f"{f.plan.header.trace.op_digest} vs {digest}): give the plan made from this trace")
    if f.report is not None and f.report.header.plan_op_digest != digest:
        raise UsageError(f"{f.report_path} is a run of a plan made from another trace than {f.trace_path}: "
                         "give the report of a run of this trace's plan")
