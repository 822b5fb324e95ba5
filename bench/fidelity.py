"""Predicted against measured iteration time, before and after calibration (issue 16).

    python bench/fidelity.py                                           # CPU: the tiny example, 12 layers
    python bench/fidelity.py --device cuda --share 0.5 -- --preset 1b --autocast bf16
    python bench/fidelity.py --device cuda --share 0.5 --label small-batch -- --preset 1b --batch 4 --seq 64

Through the real CLI on the bundled example (arguments after `--` go to it): `teraio
profile`, `teraio plan` at --share of the traced peak (host tier only unless --ssd-dir), a
`teraio run --report` under it, `teraio plan --calibrate` from that report, and a second
run under the calibrated plan. Per plan: its predicted iteration and the run's measured one
(the report's median over iterations on plan), and the error; and the first plan replayed with
the figures its own run measured (the model against the run it learned from, apart from how
well those figures carry to the calibrated plan). Results are appended to --out
(JSON lines); docs/planner.md keeps the table with commands and commits.
"""

import argparse
import datetime
import json
import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_cost import EXAMPLE, machine, run_checked, teraio  # noqa: E402
from run_baseline import git_commit  # noqa: E402
from teraio.formats.plan import load_plan  # noqa: E402
from teraio.formats.report import load_report  # noqa: E402
from teraio.formats.trace import live_bytes_per_kernel, load_trace  # noqa: E402
from teraio_plan.simulator import simulate  # noqa: E402


def measured_ms(report_path: Path) -> tuple[float, int]:
    """The median iteration on plan (the report's own figure) and how many there were."""
    report = load_report(report_path)
    return report.measured_iteration_ms, report.iterations_on_plan


def run_plan(job: list[str], plan: Path, tmp: Path, ssd_args: list) -> dict:
    report = plan.with_suffix(".report.json")
    run_checked(teraio("run", "--plan", plan, *ssd_args, "--report", report, "--", *job), tmp)
    header = load_plan(plan).header
    predicted = header.prediction.iteration_ms
    measured, on_plan = measured_ms(report)
    return {"plan": plan.name, "predicted_ms": round(predicted, 1), "measured_ms": round(measured, 1),
            "error": round(predicted / measured - 1, 3) if measured else None, "iterations_on_plan": on_plan,
            "measured": header.inputs.calibration.measured if header.inputs.calibration else {}, "report": str(report)}


def replayed_ms(trace, plan_path: Path, calibrated_path: Path) -> float:
    """The first plan replayed with the figures its own run measured: the model against the run
    it learned from, apart from how well those figures carry to another plan."""
    return simulate(trace, load_plan(plan_path), load_plan(calibrated_path).header.inputs).iteration_ms


def measure(args) -> dict:
    job = [sys.executable, str(EXAMPLE), "--device", args.device, "--steps", str(args.steps), "--log-every", "0",
           *args.model_args]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        trace = tmp / "trace.msgpack"
        run_checked(teraio("profile", "-o", trace, "--device", args.device, "--warmup", 2, "--iterations", 2,
                           "--", *job), tmp)
        loaded = load_trace(trace)
        peak_bytes = int(live_bytes_per_kernel(loaded).max())
        tiers = ["--ssds", 1] if args.ssd_dir else ["--ssds", 0]
        plan_args = [trace, "--gpu-mem", int(peak_bytes * args.share), *tiers, "--host-mem", args.host_mem or peak_bytes]
        ssd_args = ["--ssd-dir", args.ssd_dir] if args.ssd_dir else []
        run_checked(teraio("plan", *plan_args, "-o", tmp / "guessed.json"), tmp)
        guessed = run_plan(job, tmp / "guessed.json", tmp, ssd_args)
        run_checked(teraio("plan", *plan_args, "--calibrate", guessed["report"], "-o", tmp / "calibrated.json"), tmp)
        guessed["replayed_ms"] = round(replayed_ms(loaded, tmp / "guessed.json", tmp / "calibrated.json"), 1)
        calibrated = run_plan(job, tmp / "calibrated.json", tmp, ssd_args)
        if args.keep:  # for a look at the replay afterwards (trace, plans, reports)
            args.keep.mkdir(parents=True, exist_ok=True)
            for name in ("guessed.json", "guessed.report.json", "calibrated.json"):
                shutil.copy(tmp / name, args.keep / f"{args.label}.{name}")
            shutil.copy(trace, args.keep / f"{args.label}.trace.msgpack")
    return {"label": args.label, "job": job[1:], "share": args.share, "peak_bytes": peak_bytes,
            "kernels": loaded.num_kernels, "trace_kernel_ms": round(float(loaded.duration_us.sum()) / 1e3, 1),
            "trace_iteration_ms": round(loaded.header.iteration_ms, 1), "guessed": guessed, "calibrated": calibrated}


def print_table(result: dict, console: Console) -> None:
    table = Table(title=f"{result['label']}: {result['kernels']} kernels, traced kernel time "
                        f"{result['trace_kernel_ms']} ms, plan at {result['share']:.0%} of the peak")
    for col in ("plan", "predicted ms", "measured ms", "error", "iterations on plan", "measured figures"):
        table.add_column(col)
    for key in ("guessed", "calibrated"):
        r = result[key]
        table.add_row(key, f"{r['predicted_ms']:.0f}", f"{r['measured_ms']:.0f}", f"{r['error']:+.1%}",
                      str(r["iterations_on_plan"]), ", ".join(f"{k} {v:.3g}" for k, v in r["measured"].items()))
    r = result["guessed"]
    table.add_row("guessed, replayed with what its run measured", f"{r['replayed_ms']:.0f}", f"{r['measured_ms']:.0f}",
                  f"{r['replayed_ms'] / r['measured_ms'] - 1:+.1%}", "", "")
    console.print(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--share", type=float, default=0.5, help="the plan's budget, as a share of the traced peak")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--host-mem", help="host pool (default: the traced peak)")
    p.add_argument("--ssd-dir", help="plan one SSD and put its swap files here (default: host tier only)")
    p.add_argument("--label", default="example")
    p.add_argument("--out", type=Path, help="append the result here (JSON lines)")
    p.add_argument("--keep", type=Path, help="copy the trace, both plans and the first report into this folder")
    p.add_argument("model_args", nargs=argparse.REMAINDER, help="-- then the example's arguments")
    args = p.parse_args()
    args.model_args = [a for a in args.model_args if a != "--"] or (["--preset", "tiny", "--layers", "12"]
                                                                      if args.device == "cpu" else ["--preset", "1b"])
    result = measure(args)
    result.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  commit=git_commit(), machine=machine(args.device))
    print_table(result, Console())
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(json.dumps(result, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
