"""teraio inspect: any trace, plan or run report, in readable form or as JSON."""

import json

import click
from rich import box
from rich.console import Console
from rich.table import Table

from teraio.app.commands.options import json_flag
from teraio.formats.common import PLAN_FORMAT, REPORT_FORMAT, TRACE_FORMAT, detect_format, read_raw
from teraio.units import format_bytes, format_ms
from teraio.views import measured_figures, tier_label

console = Console(highlight=False)


@click.command("inspect")
@click.argument("path", type=click.Path(dir_okay=False))
@json_flag
def command(path, as_json):
    """Show what a trace, plan or run report holds.

    \b
    Examples:
      teraio inspect trace.msgpack
      teraio inspect plan.json --json | jq .predicted_iteration_ms
      teraio inspect run.json
    """
    fmt = detect_format(read_raw(path), path)
    stats = {TRACE_FORMAT: _trace_stats, PLAN_FORMAT: _plan_stats, REPORT_FORMAT: _report_stats}[fmt](path)
    if as_json:
        click.echo(json.dumps(stats, indent=2, sort_keys=True))
    else:
        {TRACE_FORMAT: print_trace_summary, PLAN_FORMAT: _print_plan, REPORT_FORMAT: _print_report}[fmt](path, console)


def _trace_stats(path):
    from teraio.formats.trace import load_trace

    return _figures(load_trace(path))


def _figures(trace) -> dict:
    """trace_stats, with the least device memory the recorded iteration's largest kernel needs
    (teraio_plan/memory.py kernel_need_bytes: the floor `teraio plan` refuses below) and the
    least any plan fits in (min_required_bytes: `teraio plan`'s "no plan fits below")."""
    from teraio.summary import trace_stats
    from teraio_plan.memory import kernel_need_bytes, min_required_bytes

    need, k = kernel_need_bytes(trace, 0)
    fit_floor, fit_k = min_required_bytes(trace, 0)
    return trace_stats(trace) | {"kernel_need_bytes": need, "kernel_need_at": k,
                                 "plan_fit_bytes": fit_floor, "plan_fit_at": fit_k}


def print_trace_summary(path, out: Console) -> None:
    from teraio.formats.trace import live_bytes_per_kernel, load_trace
    from teraio.summary import idle_histogram, largest_tensors, sparkline

    trace = load_trace(path)
    s = _figures(trace)
    device = s["device"]
    out.print(f"[bold]{path}[/]: trace of rank {s['rank']}/{s['world_size']} on {device['name']}, "
              f"{s['num_kernels']} kernels, {s['num_tensors']} tensors")
    out.print(f"  iteration {format_ms(s['iteration_ms'])} (kernels {format_ms(s['kernel_time_ms'])}), "
              f"peak {format_bytes(s['peak_bytes'])} (untracked {format_bytes(s['untracked_bytes'])}), "
              f"active fraction {s['active_fraction_mean']:.2%} (paper: 1.7%)")
    stay = " (DDP: gradients stay on the device, plans do not move them)" if s["gradients_stay_on_device"] else ""
    out.print("  tensors: " + ", ".join(f"{n} {k}" for k, n in s["tensors_by_kind"].items() if n) + stay)
    out.print(f"  memory  [cyan]{sparkline(live_bytes_per_kernel(trace))}[/]")
    _print_floors(s, out)
    out.print(f"  a plan fits from {format_bytes(s['plan_fit_bytes'])} ({s['plan_fit_bytes']} bytes, for kernel "
              f"{s['plan_fit_at']}: what no plan entry can move; `teraio plan` adds its --headroom); between the two "
              "floors `teraio run` keeps the cap by evicting on demand")
    table = Table("idle period", "count", "bytes", title="Idle periods", title_justify="left")
    for label, count, nbytes in idle_histogram(trace):
        table.add_row(label, str(count), format_bytes(nbytes))
    out.print(table)
    table = Table("tensor", "kind", "size", "shape", "uses", title="Largest tensors", title_justify="left")
    for row in largest_tensors(trace, 8):
        table.add_row(row["name"], row["kind"], format_bytes(row["nbytes"]), str(row["shape"]), str(row["uses"]))
    out.print(table)


def _print_floors(s: dict, out: Console) -> None:
    """The least budget: the recorded iteration's largest kernel, and the largest op of every
    iteration the profile watched (Note [The largest op of the profile] in teraio_profile/recorder.py)."""
    # the floor of any run, evicting on demand; the floor of a plan that fits is the next line's
    recorded = (f"  least budget to run at all: {format_bytes(s['kernel_need_bytes'])} ({s['kernel_need_bytes']} "
                f"bytes) for the recorded iteration's largest kernel ({s['kernel_need_at']})")
    largest = s["largest_op"]
    if largest is None:
        out.print(recorded + "; the other iterations' ops are not known (a trace written before they were watched)")
        return
    watched = f"of the {largest['watched_iterations']} iterations watched"
    if largest["nbytes"] <= s["kernel_need_bytes"]:
        out.print(recorded + f", enough for every op {watched}")
        return
    how = "the traced ops at larger sizes" if largest["traced_structure"] else "other ops than the recorded iteration's"
    out.print(recorded + f"; [yellow]iteration {largest['iteration']} ({how}) needs more[/]: its {largest['op']} "
              f"(kernel {largest['kernel']}) holds {format_bytes(largest['nbytes'])} ({largest['nbytes']} bytes) "
              f"of its own tensors, the most {watched}: plan with at least that")


def _plan_stats(path):
    from teraio.formats.plan import load_plan

    plan = load_plan(path)
    h, p = plan.header, plan.header.prediction
    return {
        "format": h.format, "schema_version": h.schema_version, "num_entries": len(plan.entries),
        "budget_bytes": h.inputs.budget_bytes, "predicted_iteration_ms": p.iteration_ms,
        "ideal_iteration_ms": p.ideal_iteration_ms, "share_of_ideal": p.share_of_ideal,
        "predicted_peak_bytes": p.peak_bytes, "predicted_stall_ms": p.stall_ms, "fits": p.fits,
        "offload_bytes_by_tier": p.offload_bytes_by_tier,
        "ssd_write_bytes_per_iteration": p.ssd_write_bytes_per_iteration,
        "clean_bytes_per_iteration": p.clean_bytes_per_iteration, "host_pool_bytes": p.host_pool_bytes,
        "recompute_bytes_per_iteration": p.recompute_bytes_per_iteration,
        "recompute_ms_per_iteration": p.recompute_ms_per_iteration,
        "calibration": h.inputs.calibration.model_dump() if h.inputs.calibration else None,
        "trace_op_digest": h.trace.op_digest,
    }


def _print_plan(path, out: Console, max_rows: int = 20) -> None:
    from teraio.formats.plan import load_plan

    plan = load_plan(path)
    s = _plan_stats(path)
    out.print(f"[bold]{path}[/]: {s['num_entries']} entries, budget {format_bytes(s['budget_bytes'])}, "
              f"predicted peak {format_bytes(s['predicted_peak_bytes'])} "
              f"({'fits' if s['fits'] else '[red]does not fit[/]'})")
    out.print(f"  predicted {format_ms(s['predicted_iteration_ms'])} per iteration vs ideal "
              f"{format_ms(s['ideal_iteration_ms'])} ({s['share_of_ideal']:.1%}); "
              + ", ".join(f"{tier} {format_bytes(n)}" for tier, n in s["offload_bytes_by_tier"].items()))
    if s["calibration"]:
        out.print(f"  calibrated: {measured_figures(s['calibration'])}")
    if plan.header.prediction.clean_bytes_per_iteration:
        out.print(f"  {format_bytes(plan.header.prediction.clean_bytes_per_iteration)} per iteration leave without "
                  "a copy (clean: the host pool holds a current one)")
    if s["recompute_bytes_per_iteration"]:
        replays = sum(1 for entry in plan.entries if entry.tier == "recompute")
        out.print(f"  {format_bytes(s['recompute_bytes_per_iteration'])} per iteration made again by replaying "
                  f"their op in {replays} replays ({format_ms(s['recompute_ms_per_iteration'])} of kernels) "
                  "instead of moved")
    table = Table("tensor", "tier", "size", "out after", "back at", "needed by",
                  title=f"Largest of {len(plan.entries)} entries (each one's reason is in the file)",
                  caption="(next): a kernel of the next iteration", caption_justify="left", title_justify="left")
    table.columns[0].overflow = "fold"
    for column in table.columns[3:]:
        column.no_wrap = True   # a kernel and its "(next)" on one line; a long name folds instead
    largest = sorted(plan.entries, key=lambda e: (-e.nbytes, e.offload_after))[:max_rows]
    for entry in largest:
        table.add_row(entry.name, tier_label(entry), format_bytes(entry.nbytes),
                      str(entry.offload_after), *_back(entry))
    out.print(table)
    if len(plan.entries) > max_rows:
        out.print(f"  ... and {len(plan.entries) - max_rows} more (the file has one entry per line)")


def _back(entry) -> tuple[str, str]:
    """Its "back at" and "needed by" kernels, marked where they are the next iteration's (an
    entry away across the iteration boundary: out after 304, back at 300 read as a typo)."""
    nxt = " (next)" if entry.wraps else ""
    return f"{entry.prefetch_at}{nxt}", f"{entry.needed_by}{nxt}"


def _report_stats(path):
    from teraio.formats.report import load_report, report_stats

    return report_stats(load_report(path))


def _print_report(path, out: Console) -> None:
    from teraio.formats.report import load_report
    from teraio.summary import plan_following
    from teraio.views import print_report

    report = load_report(path)
    print_report(report, out, title=str(path))
    out.print("  " + plan_following(report))
    out.print(_iteration_table(report.per_iteration))


def _iteration_table(rows, head: int = 3, tail: int = 9) -> Table:
    """One line per iteration (the first `head` and last `tail` of long runs): where a slow one
    lost its time, and whether the host pool was full."""
    skipped = max(0, len(rows) - head - tail)
    which = f" (first {head}, last {tail} of {len(rows)})" if skipped else ""
    unit, unit_bytes = _size_unit(max((max(r.offloaded_bytes, r.host_pool_peak_bytes) for r in rows), default=0))
    table = Table("iter", "plan", "time", "stall", "evict", "walk", "ops", "copy", "out", "spill", "pool",
                  box=box.SIMPLE, pad_edge=False, title=f"Iterations{which}: times in ms, sizes in {unit}",
                  title_justify="left", caption_justify="left",
                  caption="iteration 0 counts from the runtime's start: the job's imports, model building and "
                          "first batch are in its time; "
                          "plan: followed, kNNN: paused at kernel NNN, no: unplanned; walk: host time in the walk and agent; ops: inside PyTorch's ops; copy: time the copies "
                          "kept their paths busy; out: moved off the device; spill: put on the other tier, the "
                          "host pool being full; pool: the most the host pool held")
    for row in (rows[:head] + [None] + rows[-tail:] if skipped else rows):
        if row is None:
            table.add_row("...", *[""] * 10)
            continue
        plan = "yes" if row.followed_plan else f"k{row.paused_at_kernel}" if row.paused_at_kernel >= 0 else "no"
        table.add_row(str(row.iteration), plan,
                      *(f"{v:.0f}" for v in (row.ms, row.stall_ms)), str(row.evictions),
                      *(f"{v:.0f}" for v in (row.walk_ms, row.op_launch_ms, row.copy_busy_ms)),
                      *(_size_cell(n / unit_bytes) for n in (row.offloaded_bytes, row.other_tier_bytes,
                                                            row.host_pool_peak_bytes)))
    return table


def _size_cell(value: float) -> str:
    """Three significant digits at most, no exponent: 80 columns cut "102.35" to "102.…"."""
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _size_unit(largest_bytes: int) -> tuple[str, int]:
    """The largest binary unit in which the table's biggest size is at least 1 (a CPU test job
    moves KiB: in GiB every cell read 0.00)."""
    for unit, unit_bytes in (("GiB", 2**30), ("MiB", 2**20)):
        if largest_bytes >= unit_bytes:
            return unit, unit_bytes
    return "KiB", 2**10
