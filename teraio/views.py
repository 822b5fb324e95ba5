"""Rich renderings shared by the CLI and the agents' exit summaries (no torch)."""

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from teraio.formats.plan import CALIBRATED_OPTIONS
from teraio.formats.report import RunReport
from teraio.units import format_bytes, format_ms


def print_report(report: RunReport, out: Console, title: str, hints: Sequence[str] = ()) -> None:
    """The run's summary; `hints`: lines on predicting better (the runtime's, which knows the
    plan)."""
    r = report
    excess = r.peak_device_bytes - r.budget_bytes
    # by how much, in bytes: "peak 17.5 MiB of 17.5 MiB budget (over budget)" read as a contradiction
    over = f"[red]over budget by {format_bytes(excess)}[/]" if r.budget_bytes and excess > 0 else "within budget"
    stray = (f", and {r.steps_without_backward} optimizer step(s) with no backward before them, not counted "
             "as iterations" if r.steps_without_backward else "")
    out.print(f"[bold]{title}[/]: {r.iterations} iterations ({r.iterations_on_plan} on plan){stray}, "
              f"I/O {r.io_backend}")
    # Note [Steady iterations] in teraio/formats/report.py
    which = "median of the planned iterations after the first" if r.iterations_on_plan > 1 else \
        ("the one planned iteration" if r.iterations_on_plan else "median of the unplanned ones after the first two")
    predicted = "predicted" if r.iterations_on_plan else "predicted for the plan, which no iteration followed"
    out.print(f"  iteration {format_ms(r.measured_iteration_ms)} measured ({which}) vs "
              f"{format_ms(r.predicted_iteration_ms)} {predicted}; peak {format_bytes(r.peak_device_bytes)} "
              f"of {format_bytes(r.budget_bytes)} budget ({over})")
    for hint in hints:
        out.print(f"  {hint}")
    in_iterations = max((row.resident_peak_bytes for row in r.per_iteration), default=0)
    if r.budget_bytes and r.peak_in_saves_bytes > r.budget_bytes >= in_iterations:
        out.print(f"  [red]over the budget only while a save read the job's tensors[/] ("
                  f"{format_bytes(r.peak_in_saves_bytes)}; nothing leaves the device during a save, and what its "
                  f"ops made stayed): to keep it there too, plan with a --gpu-mem "
                  f"{format_bytes(r.peak_in_saves_bytes - r.budget_bytes)} lower")
    elif r.budget_bytes and r.peak_device_bytes > r.budget_bytes:
        refused = sum(r.refused_actions_by_reason.values())
        why = (f"here {refused} plan offloads were refused (below)" if refused else
               "most often in an iteration larger than the profiled one (a longer batch, another path)")
        out.print("  [red]the budget keeper could not hold the budget[/]: an op's own tensors, with those that "
                  f"may not move (pinned, shared, refused, or kind other under torch.distributed), needed more; {why}: plan with a larger --gpu-mem, "
                  "or profile the job's largest iteration")
    table = Table("tier", "offloaded", "written", "prefetched", title_justify="left")
    for tier in sorted(r.offloaded_bytes):
        written = format_bytes(r.written_bytes[tier]) if tier in r.written_bytes else "–"
        table.add_row(tier, format_bytes(r.offloaded_bytes[tier]), written, format_bytes(r.prefetched_bytes.get(tier, 0)))
    out.print(table)
    if r.achieved_gbps:
        out.print("  achieved: " + ", ".join(f"{path} {gbps:.3g} GB/s" for path, gbps in r.achieved_gbps.items()))
    planned = [row for row in r.per_iteration if row.followed_plan]
    if planned:
        last = planned[-1]
        out.print(f"  last planned iteration: {format_ms(last.ms)}, of which host time in the walk and agent "
                  f"{format_ms(last.walk_ms)} (stalls {format_ms(last.stall_ms)}), inside ops "
                  f"{format_ms(last.op_launch_ms)}, the job's own code between ops {format_ms(last.between_ops_ms)}; "
                  f"copies kept the links busy {format_ms(last.copy_busy_ms)}")
        out.print(f"    starting its {last.copies_issued} copies took {format_ms(last.copy_issue_ms)} of that host "
                  f"time, re-allocating device memory {format_ms(last.restore_alloc_ms)}"
                  + (f"; the allocator synchronized {last.allocator_syncs} times to stay under the cap"
                     if last.allocator_syncs else ""))
    spilled = sum(row.other_tier_bytes for row in r.per_iteration)
    if spilled:
        peak = max(row.host_pool_peak_bytes for row in r.per_iteration)
        out.print(f"  [yellow]{format_bytes(spilled)} went to the other tier[/]{_planned_part(r, 'other_tier_bytes', ' (', ')')}: "
                  f"the host pool (peak {format_bytes(peak)}) had no room; plan with a larger --host-mem")
    for folder, reason in r.closed_swap_dirs.items():
        moved = f"; {format_bytes(r.ssd_to_host_bytes)} planned for the SSD went to the host pool" \
            if r.ssd_to_host_bytes else ""
        out.print(f"  [yellow]{reason}[/]: no more swap files went to {folder}{moved}")
    for tensor, failure in r.lost_tensors.items():
        out.print(f"  [red]data lost[/]: {tensor}, its swap file could not be read back ({failure})")
    _print_replays(r, out)
    causes = ", ".join(f"{cause} {format_ms(ms)}" for cause, ms in r.stall_ms_by_cause.items()) or "none"
    # time first: the count is near the kernel count in a CPU run of waits that cost nothing, and read as alarming
    out.print(f"  stalls: {format_ms(r.stall_ms)}{_planned_part(r, 'stall_ms', ' (', ')')} over {r.stall_count} "
              f"waits for a copy: {causes}")
    if r.compiled_regions:
        out.print(f"  [yellow]torch.compile: {r.compiled_regions} compiled region(s) ran eager[/] (eager numerics)")
    out.print(f"  guard trips {r.guard_trips}, cancelled offloads {r.cancelled_offloads}, "
              f"on-demand evictions {r.on_demand_evictions}{_planned_part(r, 'evictions', ' (', ')')}, I/O errors {r.io_errors}"
              + _late_and_skipped(r))
    planned_evictions = sum(row.evictions for row in r.per_iteration if row.followed_plan)
    if planned_evictions and not r.plan_fits:
        out.print(f"  [yellow]{planned_evictions} on-demand evictions in planned iterations[/]: the plan itself did "
                  "not fit the budget (teraio plan said so, and what would make one fit), and the runtime kept the cap "
                  "by evicting")
    elif planned_evictions:
        out.print(f"  [yellow]{planned_evictions} on-demand evictions in planned iterations[/]: they held more than "
                  "the plan allowed for (a batch longer than any profiled one, a plan at the budget's edge); "
                  "profile with the job's longest batch, or plan with more --headroom")
    missing = sum(row.plan_ids_missing for row in r.per_iteration)
    if missing:
        # a module's parameters are named at its first call: an averaged model evaluated every few
        # steps, updated from the first, was unnamed in the iterations before its first evaluation
        out.print(f"  [yellow]{missing} plan actions found no tensor of their name[/] (the parameters of a module "
                  "not yet called in this run, such as an averaged model evaluated every few steps, or a tensor "
                  "the job replaced where neither its model nor its optimizer shows it, or one made only in "
                  "some iterations): those tensors stayed where they were"
                  + (f"; first: {r.first_missing}" if r.first_missing else ""))
    if r.refused_actions_by_reason:
        why = ", ".join(f"{reason} {count}" for reason, count in r.refused_actions_by_reason.items())
        out.print(f"  [yellow]{sum(r.refused_actions_by_reason.values())} plan offloads refused[/] ({why}): those "
                  f"storages stayed on the device; first: {r.first_refusal}")
    realigned = [row for row in r.per_iteration if row.ops_stepped_over or row.kernels_absent]
    if realigned:
        parts = ([f"{sum(row.ops_stepped_over for row in realigned)} ops the trace lacks (a log line's loss.item(), "
                  "a logger's mean, a collator's slice) were stepped over"] if any(row.ops_stepped_over for row in realigned) else []) + \
                ([f"{sum(row.kernels_absent for row in realigned)} of its kernels were absent (a slice of a whole "
                  "dimension makes no op)"] if any(row.kernels_absent for row in realigned) else [])
        out.print(f"  {' and '.join(parts)} in {len(realigned)} iteration(s), "
                  f"{sum(row.followed_plan for row in realigned)} of which then followed the plan to their end")
    if r.plan_pauses:
        # the job's tail after its last step (a final save or evaluation) pauses too, in no iteration's row
        tail = r.plan_pauses - sum(row.paused_at_kernel >= 0 for row in r.per_iteration)
        where = f" ({tail} of them after the last step)" if tail > 0 else ""
        since = _paused_to_the_end(r)
        resumed = "and resumed at the next" if since is None else \
            (f"[yellow]and never resumed from iteration {since} on[/]: if the job changed there (a layer unfrozen, "
             "a new phase), profile it past that point and plan again; if its ops follow its data (a depth or a "
             "branch chosen per batch, a mixture of experts running only the experts it routed to: transformers' "
             "experts_implementation=\"grouped_mm\" runs the same ops every step), iterations unlike the traced "
             "one run unplanned, exact and within the budget where it can be kept")
        out.print(f"  plan paused in {r.plan_pauses} iteration(s){where} at ops unlike the trace's (evaluation, "
                  f"saving, another batch shape, an optimizer step a GradScaler skipped, ops that follow the data) {resumed}; first: {r.pause_reason}")


def _late_and_skipped(r: RunReport) -> str:
    """Prefetches that were not back in time, and those that found no room (they came back when
    an op needed them): both stall, and the stall causes alone did not tell them apart."""
    parts = ([f"prefetches late {r.deadline_misses}"] if r.deadline_misses else []) + \
        ([f"prefetches with no room until an op needed them {r.skipped_actions}"] if r.skipped_actions else [])
    return "".join(", " + part for part in parts)


def _planned_part(r: RunReport, column: str, before: str, after: str) -> str:
    """How much of a run's total the iterations on plan had, where others had some: the first
    iteration runs unplanned and may hold most of a run's stalls and evictions."""
    planned = [row for row in r.per_iteration if row.followed_plan]
    if not planned or len(planned) == len(r.per_iteration):
        return ""
    part = sum(getattr(row, column) for row in planned)
    shown = {"stall_ms": format_ms, "other_tier_bytes": format_bytes}.get(column, str)(part)
    return f"{before}{shown} in the {len(planned)} planned iterations{after}"


def _paused_to_the_end(r: RunReport) -> int | None:
    """The iteration from which every one paused the plan, when that is the last two or more."""
    rows = r.per_iteration
    first = len(rows)
    while first > 0 and rows[first - 1].paused_at_kernel >= 0:
        first -= 1
    return rows[first].iteration if len(rows) - first >= 2 else None


def _print_replays(r: RunReport, out: Console) -> None:
    """What the recompute tier did (teraio_run/replay.py), and what it could not."""
    fallbacks = sum(row.replay_fallbacks for row in r.per_iteration)
    replayed = r.prefetched_bytes.get("recompute", 0)
    if replayed:
        replay_ms = sum(row.replay_ms for row in r.per_iteration)
        out.print(f"  replays made {format_bytes(replayed)} again ({format_ms(replay_ms)} of host time)")
    if fallbacks:
        out.print(f"  [yellow]{fallbacks} recompute entries moved to the host pool instead[/]: the op's call was not "
                  "kept (--no-clean-copies, or the op draws random numbers) or the tensor or an input was written "
                  "since it ran")


def tier_label(entry) -> str:
    """A plan entry's tier as the commands show it: "host (clean)" when it leaves without a copy,
    "recompute (kernel 812)" naming the kernel whose op is replayed."""
    if entry.tier == "recompute":
        return f"recompute (kernel {entry.produced_at})"
    return f"{entry.tier} (clean)" if entry.clean else entry.tier


MEASURED_UNITS = {"host_us_per_kernel": " us host time per kernel", "host_us_per_copy": " us per copy started",
                  "host_us_per_replay": " us per replay", "host_gbps": " GB/s host", "pcie_gbps": " GB/s link",
                  "ssd_read_gbps": " GB/s per SSD read", "ssd_write_gbps": " GB/s per SSD write",
                  "kernel_time_scale": "x the trace's kernel times"}


def measured_figures(calibration: dict) -> str:
    """A plan's calibration (PlannerInputs.calibration, dumped) in one line."""
    figures = ", ".join(f"{value:.3g}{MEASURED_UNITS.get(name, ' ' + name)}"
                        for name, value in calibration["measured"].items())
    kept = "; ".join(f"{CALIBRATED_OPTIONS.get(name, name)} as given, where the run measured {value:.3g}"
                     f"{MEASURED_UNITS.get(name, ' ' + name)} (leave it out to plan with that)"
                     for name, value in calibration.get("overridden", {}).items())
    return f"{figures or 'nothing (every figure was given)'} (from {calibration['report']})" + (f"; {kept}" if kept else "")
