"""`teraio plan TRACE...`: make the migration plan for each rank's trace and summarise it."""

import json
from pathlib import Path

import click
from click.core import ParameterSource
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from teraio.app.commands.options import SIZE, json_flag
from teraio.errors import PlanError, UsageError
from teraio.formats.common import refuse_overwriting_input
from teraio.formats.plan import CALIBRATED_OPTIONS, save_plan
from teraio.formats.trace import Trace, load_trace
from teraio.units import format_bytes, format_ms
from teraio.views import measured_figures
from teraio_plan import PlanOutcome, make_plan_outcome, planner_inputs, sweep
from teraio_plan.calibrate import calibrated
from teraio_plan.memory import min_required_bytes
from teraio_plan.make import (
    DEFAULT_HOST_GBPS, DEFAULT_PCIE_GBPS, DEFAULT_SSD_READ_GBPS, DEFAULT_SSD_WRITE_GBPS,
)

console = Console(highlight=False)


def default_output(trace_path: Path) -> Path:
    """trace.msgpack -> trace.plan.json, trace.rank1.msgpack -> trace.plan.rank1.json: the
    name `teraio run --plan trace.plan.json` looks for on rank 1."""
    name = trace_path.name
    stem = name[: -len(".msgpack")] if name.endswith(".msgpack") else name
    base, dot, rank = stem.rpartition(".")
    if dot and rank.startswith("rank") and rank[4:].isdigit():
        return trace_path.with_name(f"{base}.plan.{rank}.json")
    return trace_path.with_name(stem + ".plan.json")


@click.command("plan")
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Plan file (one trace only). [default: TRACE with .plan.json; NAME.rankN.msgpack -> NAME.plan.rankN.json]")
@click.option("--gpu-mem", type=SIZE, default=None, help="Device memory budget. [default: the trace's device capacity; required for CPU traces]")
@click.option("--ssds", "num_ssds", type=int, default=1, show_default=True, help="NVMe drives to stripe over (0 = host tier only).")
@click.option("--ssd-read-gbps", type=float, default=DEFAULT_SSD_READ_GBPS, show_default=True, help="Read bandwidth of one SSD, GB/s.")
@click.option("--ssd-write-gbps", type=float, default=DEFAULT_SSD_WRITE_GBPS, show_default=True, help="Write bandwidth of one SSD, GB/s.")
@click.option("--host-mem", type=SIZE, default=0, help="Pinned host pool cap (0 = SSD only). [default: 0]")
@click.option("--host-gbps", type=float, default=DEFAULT_HOST_GBPS, show_default=True, help="Device<->host bandwidth per direction, GB/s.")
@click.option("--pcie-gbps", type=float, default=DEFAULT_PCIE_GBPS, show_default=True, help="Device link per direction, shared by SSD and host traffic, GB/s.")
@click.option("--link-total-gbps", type=float, default=0.0, help="What the device link carries in both directions together, GB/s, where that is less than --pcie-gbps each way at once (bench/link_probe.py measures it). [default: 0, full duplex]")
@click.option("--headroom", type=SIZE, default=0, help="Extra bytes to keep free beyond what the trace tracks. [default: 0]")
@click.option("--calibrate", "calibrate_from", type=click.Path(path_type=Path), default=None, help="A run report of this job (teraio run --report): take the host and SSD rates and the host time per kernel, per copy and per replay it measured; options given here still win.")
@click.option("--no-clean-copies", is_flag=True, help="Plan every offload as a copy, for runs with teraio run --no-clean-copies (by default the host pool's kept copies make unwritten re-offloads free).")
@click.option("--no-recompute", is_flag=True, help="Move idle activations only (by default one whose op can be replayed may be dropped and made again before its next use, where the prediction says that is faster).")
@click.option("--stall-free", is_flag=True, help="Only transfers that delay no kernel (the paper's planner); the budget may then be missed.")
@click.option("--require-fit", is_flag=True, help="Exit with status 5 and write no plan where it would not fit the budget at every kernel (by default it is written, and teraio run keeps the cap by evicting on demand where it does not).")
@click.option("--sweep", "do_sweep", is_flag=True, help="Print throughput against migration bandwidth (0-64 GB/s); write no plan.")
@json_flag
def command(traces, output, gpu_mem, num_ssds, ssd_read_gbps, ssd_write_gbps, host_mem, host_gbps,
            pcie_gbps, link_total_gbps, headroom, calibrate_from, no_clean_copies, no_recompute, stall_free, require_fit,
            do_sweep, as_json):
    """Plan which idle tensors leave the device, when, to SSD or host, and when they come back.

    \b
    teraio plan trace.msgpack --gpu-mem 40GiB --ssds 2 --host-mem 64GiB
    teraio plan trace.rank0.msgpack trace.rank1.msgpack --ssds 4     (one plan per rank)
    teraio plan trace.msgpack --ssds 4 --sweep
    teraio plan trace.msgpack --gpu-mem 40GiB --host-mem 64GiB --require-fit   (status 5 unless it fits)
    teraio plan trace.msgpack --gpu-mem 40GiB --host-mem 64GiB --calibrate run.json   (rates a run measured)
    teraio plan trace.msgpack --gpu-mem 40GiB --ssds 0 --host-mem 64GiB --host-gbps 54 --link-total-gbps 54
                                                  (a link that carries 54 GB/s for both directions together)
    
    Transfers that fit in the bandwidth without delaying a kernel are planned first; if
    the budget still is not met, more are planned at the price of stalls (the prediction
    says how long), unless --stall-free.
    """
    if output is not None and len(traces) > 1:
        raise UsageError("-o names one plan file, but several traces were given: drop -o to write TRACE.plan.json for each")
    options = dict(gpu_mem_bytes=gpu_mem, num_ssds=num_ssds, ssd_read_gbps=ssd_read_gbps,
                   ssd_write_gbps=ssd_write_gbps, host_mem_bytes=host_mem, host_gbps=host_gbps,
                   pcie_gbps=pcie_gbps, link_total_gbps=link_total_gbps, headroom_bytes=headroom,
                   allow_stalls=not stall_free,
                   clean_copies=not no_clean_copies, recompute=not no_recompute)
    # Every file and option is checked before any work, so a mistake writes nothing.
    if not do_sweep:
        for path in traces:
            _check_output(output or default_output(path), [*traces, *filter(None, [calibrate_from])])
    jobs = [(path, trace, _inputs(path, trace, options, calibrate_from)) for path, trace in
            ((path, load_trace(path)) for path in traces)]
    if do_sweep:
        reports = [_sweep_one(path, trace, inputs, as_json) for path, trace, inputs in jobs]
    else:
        reports = _plan_all(jobs, output, as_json, require_fit)
    if as_json:
        click.echo(json.dumps(reports if len(reports) > 1 else reports[0], indent=2, sort_keys=True))


def _inputs(path: Path, trace: Trace, options: dict, calibrate_from: Path | None):
    inputs = planner_inputs(trace, **options)
    if calibrate_from is None:
        return inputs
    source = click.get_current_context().get_parameter_source
    given = {name for name in CALIBRATED_OPTIONS if source(name) is not ParameterSource.DEFAULT}
    return calibrated(inputs, trace, calibrate_from, given, trace_name=str(path))


def _check_output(path: Path, inputs: list[Path]) -> None:
    refuse_overwriting_input(path, inputs, "-o")
    if path.is_dir():
        raise UsageError(f"-o {path} is a folder: give a file name, e.g. {path / 'plan.json'}")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"cannot write {path}: folder {folder} does not exist; create it or change -o")


def _with_progress(label: str, work):
    """Run work(progress_callback) under a transient rich progress bar on stderr."""
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=1.0)
        return work(lambda fraction: bar.update(task, completed=fraction))


def _plan_all(jobs: list, output: Path | None, as_json: bool, require_fit: bool) -> list[dict]:
    """Every trace's plan is made before any is written: with --require-fit, one rank's plan
    that misses its budget leaves no rank with a plan."""
    made = []
    for path, trace, inputs in jobs:
        outcome = _with_progress(f"planning {path.name}", lambda cb: make_plan_outcome(trace, inputs, cb))
        out_path = output or default_output(path)
        made.append((outcome, out_path, plan_summary(outcome, trace, out_path)))
        if require_fit and not made[-1][2]["fits"]:
            raise PlanError(f"{path.name}: {_misfit(made[-1][2])}; no plan written (--require-fit)")
    for outcome, out_path, summary in made:
        save_plan(outcome.plan, out_path)
        if not as_json:
            _print_summary(summary)
    return [summary for *_, summary in made]


def plan_summary(outcome: PlanOutcome, trace: Trace, out_path: Path) -> dict:
    pred, sim, inputs = outcome.plan.header.prediction, outcome.simulation, outcome.plan.header.inputs
    worst = sim.worst_kernel
    return {
        "trace": trace.header.op_digest, "plan": str(out_path), "rank": trace.header.rank,
        "num_entries": len(outcome.plan.entries), "budget_bytes": outcome.plan.header.inputs.budget_bytes,
        "offload_bytes_by_tier": pred.offload_bytes_by_tier,
        "predicted_iteration_ms": pred.iteration_ms, "ideal_iteration_ms": pred.ideal_iteration_ms,
        "share_of_ideal": pred.share_of_ideal, "stall_ms": pred.stall_ms,
        "predicted_peak_bytes": pred.peak_bytes, "peak_bytes_without_plan": pred.peak_bytes_without_plan,
        "ssd_write_bytes_per_iteration": pred.ssd_write_bytes_per_iteration,
        "clean_bytes_per_iteration": pred.clean_bytes_per_iteration,
        "recompute_bytes_per_iteration": pred.recompute_bytes_per_iteration,
        "recompute_ms_per_iteration": pred.recompute_ms_per_iteration,
        "num_recompute_entries": sum(1 for e in outcome.plan.entries if e.tier == "recompute"),
        "host_pool_bytes": pred.host_pool_bytes, "fits": pred.fits,
        "over_budget_kernels": pred.over_budget_kernels, "max_excess_bytes": pred.max_excess_bytes,
        "worst_kernel": worst if not pred.fits else None,
        "worst_op": trace.op_name(worst) if not pred.fits and trace.num_kernels else None,
        "floor_bytes": None if pred.fits else min_required_bytes(trace, inputs.headroom_bytes)[0],
        "calibration": inputs.calibration.model_dump() if inputs.calibration else None,
        "host_time_charged": inputs.host_us_per_kernel + inputs.host_us_per_copy + inputs.host_us_per_replay > 0,
    }


def _print_summary(s: dict) -> None:
    table = Table(title=f"plan {s['plan']}", show_header=False, title_justify="left")
    tiers = s["offload_bytes_by_tier"]
    rows = [
        ("entries", str(s["num_entries"])),
        ("offloaded per iteration", f"ssd {format_bytes(tiers['ssd'])}, host {format_bytes(tiers['host'])}"),
        ("iteration", f"{format_ms(s['predicted_iteration_ms'])} predicted, {format_ms(s['ideal_iteration_ms'])} ideal "
                      f"({s['share_of_ideal']:.1%}), stalls {format_ms(s['stall_ms'])}"),
        ("peak", f"{format_bytes(s['predicted_peak_bytes'])} of budget {format_bytes(s['budget_bytes'])} "
                 f"(without plan {format_bytes(s['peak_bytes_without_plan'])})"),
        ("clean per iteration", format_bytes(s["clean_bytes_per_iteration"])),
        ("recomputed per iteration", f"{format_bytes(s['recompute_bytes_per_iteration'])} in "
                                     f"{s['num_recompute_entries']} replays, {format_ms(s['recompute_ms_per_iteration'])}"),
        ("SSD writes per iteration", format_bytes(s["ssd_write_bytes_per_iteration"])),
        ("host pool", format_bytes(s["host_pool_bytes"])),
    ]
    if s["calibration"]:
        rows.append(("measured", measured_figures(s["calibration"])))
    if not s["host_time_charged"]:
        rows.append(("host time", UNCHARGED_HOST_TIME))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if not s["fits"]:
        console.print(f"[bold yellow]does not fit:[/] {_misfit(s)}", soft_wrap=True)


def _misfit(s: dict) -> str:
    kernels = s['over_budget_kernels']
    return (f"over budget at {kernels} kernel{'s' if kernels != 1 else ''}, worst at kernel {s['worst_kernel']} "
            f"({s['worst_op']}) by {format_bytes(s['max_excess_bytes'])}; {_fit_advice(s)}")


# Say it where the prediction is read: uncalibrated plans of short kernels predicted 31-43% fast
# on the H200 (docs/planner.md, Predicted against measured), calibrated ones within 2-13%
UNCHARGED_HOST_TIME = ("not charged: the prediction assumes the job's thread never holds the device up (short "
                       "kernels and many copies make it); to measure it, `teraio run --report run.json`, then "
                       "plan again with --calibrate run.json")


def _fit_advice(s: dict) -> str:
    if s["budget_bytes"] < s["floor_bytes"]:  # Note [What must stay] in teraio_plan/memory.py
        return (f"no plan fits below --gpu-mem {s['floor_bytes']} ({format_bytes(s['floor_bytes'])}: what no "
                "entry can move); under this one teraio run keeps the cap by evicting on demand")
    return "add SSDs, a host pool (--host-mem) or a larger --gpu-mem"


def _sweep_one(path: Path, trace: Trace, inputs, as_json: bool) -> dict:
    points = _with_progress(f"sweeping {path.name}", lambda cb: sweep(trace, inputs, progress=cb))
    rows = [{"bw_gbps": p.bw_gbps, "share_of_ideal": p.share_of_ideal, "iteration_ms": p.iteration_ms,
             "stall_ms": p.stall_ms, "peak_bytes": p.peak_bytes, "fits": p.fits} for p in points]
    if not as_json:
        table = Table(title=f"roofline for {path.name} (budget {format_bytes(inputs.budget_bytes)})")
        for col in ("GB/s per GPU", "share of ideal", "iteration", "stalls", "peak", "fits"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(f"{r['bw_gbps']:g}", f"{r['share_of_ideal']:.1%}", format_ms(r["iteration_ms"]),
                          format_ms(r["stall_ms"]), format_bytes(r["peak_bytes"]), "yes" if r["fits"] else "no")
        console.print(table)
        if not any(r["fits"] for r in rows):
            console.print("no bandwidth here fits the budget (0% = the job would not run); the peak column "
                          "shows how close each comes", soft_wrap=True)
    return {"trace": str(path), "budget_bytes": inputs.budget_bytes, "sweep": rows}
