"""The run report: written and summarised when the training process exits."""

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

from teraio import __version__, compile_guard
from teraio.errors import PlanMismatchError
from teraio.formats.common import Producer
from teraio.formats.report import ReportHeader, RunReport, save_report, steady_iterations
from teraio.settings import rank_path, status_path
from teraio.units import format_ms
from teraio_run.setup import remove_run_dirs

UNPLANNED_SKIP = 2   # a run that never followed its plan: iteration 0 creates optimizer state


def build_report(agent, context) -> RunReport:
    stats, plan, s = agent.engine.stats, agent.plan, context.settings
    measured = np.median(_steady_seconds(agent.log)) * 1e3
    predicted = plan.header.prediction.iteration_ms
    return RunReport(
        header=ReportHeader(
            producer=Producer(teraio=__version__, torch=torch.__version__, cuda=torch.version.cuda),
            command=s.command, rank=s.rank, world_size=s.world_size,
            device=agent.device_name, plan=str(context.plan_path),
            plan_op_digest=plan.header.trace.op_digest),
        iterations=len(agent.log.iteration_s),
        iterations_on_plan=agent.iterations_on_plan,
        steps_without_backward=agent.log.steps_without_backward,
        io_backend=context.io_backend,
        offloaded_bytes=stats.offloaded_bytes,
        written_bytes=stats.written_bytes,
        offloaded_bytes_by_kind=dict(sorted(stats.offloaded_bytes_by_kind.items())),
        prefetched_bytes=stats.prefetched_bytes,
        achieved_gbps=_achieved_gbps(agent),
        stall_count=stats.stall_count,
        stall_ms=round(sum(stats.stall_ms.values()), 3),
        stall_ms_by_cause={k: round(v, 3) for k, v in sorted(stats.stall_ms.items())},
        top_stalled_tensors=_top(stats.stalls_by_tensor, 10),
        deadline_misses=stats.deadline_misses,
        cancelled_offloads=stats.cancelled_offloads,
        io_errors=stats.io_errors,
        lost_tensors=stats.lost_tensors,
        closed_swap_dirs=stats.closed_dirs,
        ssd_to_host_bytes=stats.ssd_to_host_bytes,
        skipped_actions=stats.skipped,
        refused_actions_by_reason=dict(sorted(agent.log.refused_by_reason.items())),
        first_refusal=agent.log.first_refusal,
        first_missing=agent.log.first_missing,
        on_demand_evictions=stats.evictions,
        oom_retries=stats.oom_retries,
        peak_device_bytes=_peak_bytes(agent),
        peak_in_saves_bytes=int(agent.keeper.held_peak_bytes),
        budget_bytes=agent.budget_bytes,
        guard_trips=agent.guard_trips,
        guard_reason=agent.guard_reason,
        plan_pauses=agent.plan_pauses,
        pause_reason=agent.pause_reason,
        compiled_regions=compile_guard.count(),
        plan_fits=agent.plan.header.prediction.fits,
        predicted_iteration_ms=predicted,
        measured_iteration_ms=round(float(measured), 3),
        kernel_time_drift=round(float(measured / predicted - 1), 4) if predicted > 0 else None,
        per_iteration=[{**row, **{key: round(row[key], 3)
                                  for key in ("ms", "stall_ms", "walk_ms", "op_launch_ms", "copy_busy_ms",
                                                              "replay_ms")}}
                       for row in agent.log.rows],
    )


def _steady_seconds(log) -> list[float]:
    """Note [Steady iterations] (teraio/formats/report.py); a run that never followed its plan
    is measured after its first iterations."""
    steady = steady_iterations([row["followed_plan"] for row in log.rows])
    return [log.iteration_s[i] for i in steady] or log.iteration_s[UNPLANNED_SKIP:] or log.iteration_s or [0.0]


def _achieved_gbps(agent) -> dict:
    if agent.cuda:
        torch.cuda.synchronize()  # the last stream copies' events must be complete to be read
    for transfer in agent.engine.in_flight:
        if transfer.future is not None:
            _ = transfer.future.exception()  # wait for the thread copies
    agent.engine.measure()
    return agent.engine.meter.achieved_gbps()


def _top(by_tensor: dict, count: int) -> dict:
    ranked = sorted(by_tensor.items(), key=lambda kv: -kv[1])[:count]
    return {name: round(ms, 3) for name, ms in ranked}


def _peak_bytes(agent) -> int:
    return torch.cuda.max_memory_allocated() if agent.cuda else int(agent.keeper.peak_bytes)


def finish(agent, context) -> None:
    """At exit: print the report's summary, write the report, remove the swap folders."""
    never_learned = agent.never_learned()
    if never_learned:
        said = "error: {}; failing the job (--strict)" if context.settings.strict else "warning: {}"
        print("teraio: " + said.format(never_learned), file=sys.stderr)
    try:
        if agent.log.iteration_s or agent.engine.stats.io_errors:  # a failure is worth a report at any time
            report = build_report(agent, context)
            # each apart: a report file that cannot be written (a full disk) still leaves the summary,
            # and a summary that cannot be printed (stderr closed, a broken pipe) still leaves the file
            header = agent.plan.header
            hints = [calibrate_hint(header.inputs, report, context.settings.report),
                     slow_trace_hint(header.prediction, report)]
            _print_summary(report, [hint for hint in hints if hint])
            if context.settings.report:
                save_report(report, report_path(context))
    except Exception as err:  # the job has finished training; a report failure must not hide that
        print(f"teraio: no run report: {err}", file=sys.stderr)
    finally:
        context.threads.shutdown(wait=True)
        remove_run_dirs(context)
    if getattr(sys, "last_value", None) is not None:
        return   # the job failed on its own: its status stands
    if agent.engine.stats.lost_tensors:
        _fail_status(context, 1)
    elif never_learned and context.settings.strict:
        _fail_status(context, PlanMismatchError.exit_code)


def report_path(context) -> Path:
    """Note [A report path the job wrote]
    `--report run.json` on a job that writes its own run.json (its metrics, its losses): the
    report replaced the job's file at exit, without a word, and the job's output was lost. A
    file at the report's path written since the runtime started is not a report of ours (a
    report is only written here, at exit), so the report goes beside it, said once."""
    settings = context.settings
    path = Path(rank_path(settings.report, settings.rank, settings.world_size))
    try:
        written_during_run = path.stat().st_mtime >= context.started_s
    except OSError:   # none there (or unreadable: saving says why)
        return path
    if not written_during_run:
        return path   # an earlier run's report, or a file the user meant to replace
    beside = path.with_name(f"{path.stem}.teraio{path.suffix or '.json'}")
    print(f"teraio: {path} was written during the run, not by teraio (the job's own file?): "
          f"the run report is in {beside} instead", file=sys.stderr)
    return beside


CALIBRATE_HINT_OVER = 1.1   # measured past the prediction by this factor: say how to predict better


def calibrate_hint(inputs, report, report_path: str) -> str:
    """A plan made with default rates charges the job's thread nothing (Calibration in
    docs/planner.md), so a job of short kernels runs well past its prediction: the summary
    says how to get one that holds, once the run measured what it needs. `inputs` is the
    plan header's planner inputs."""
    if inputs.host_us_per_kernel or not report.iterations_on_plan or not report.predicted_iteration_ms:
        return ""
    if report.measured_iteration_ms <= CALIBRATE_HINT_OVER * report.predicted_iteration_ms:
        return ""
    source = report_path or "REPORT (this run again with --report REPORT)"
    return ("the prediction charges no host time (the job's thread per kernel and per copy), which this run "
            f"measured: plan again with `teraio plan TRACE ... --calibrate {source}` for one that does")


SLOW_TRACE_UNDER = 0.5   # iterations under this share of the trace's kernel time: its times are off


def slow_trace_hint(prediction, report) -> str:
    """Note [A trace slower than the run]: a trace taken while the machine was busy (another
    job, a profiler's own load) times every kernel too long. A plan from it predicted 1.66 s an
    iteration where the run took 0.12-0.54 s, and its prefetches start by those times, so they
    come late: nothing said why. An iteration cannot be shorter than its kernels, so one well
    under the trace's kernel time alone says the trace is wrong, not the plan. Under half: the
    example's own trace, profiled on the 2-core box while tests ran beside it, put 62.8 ms of
    kernels in a 41.1 ms iteration, a CPU profile's usual noise, not what the hint is for."""
    ideal_ms = prediction.ideal_iteration_ms
    if not report.iterations_on_plan or ideal_ms <= 0 or report.measured_iteration_ms >= SLOW_TRACE_UNDER * ideal_ms:
        return ""
    return (f"the trace's kernels alone take {format_ms(ideal_ms)} an iteration, this run's whole iterations "
            f"{format_ms(report.measured_iteration_ms)}: the profile timed them on a busier or slower machine "
            "than this one now; profile again here, with the machine otherwise idle, for a plan whose "
            "prefetch times and prediction hold")


def _print_summary(report, hints: list[str]) -> None:
    from rich.console import Console

    from teraio.views import print_report

    try:
        print_report(report, Console(stderr=True, highlight=False), title=f"teraio run, rank {report.header.rank}",
                     hints=hints)
    except Exception:   # noqa: BLE001 (nowhere to say it: stderr is what failed)
        pass


def _fail_status(context, code: int) -> None:
    """Note [Lost swap files] (teraio_run/engine.py): the script caught the error and ended
    normally, but trained on after losing bytes; its status must not say success (nor, under
    --strict, that of a job that never followed its plan). Python sets sys.last_value for an
    uncaught error, which exits with 1 by itself. A job that ended with a status of its own
    (`sys.exit(3)`) keeps it: at exit nothing here can tell it from success, and os._exit(6)
    made a --strict job's 3 a 6. So the status goes to `teraio run`, which sets it where the
    job's own is 0 (teraio_run/run.py, job_status); started some other way, os._exit sets it."""
    path = status_path(context.settings.status_dir)
    if path is not None:
        path.write_text(json.dumps({"exit_status": code}))
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
