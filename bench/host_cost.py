"""Host time per kernel in the op walk and the agent, in the three regimes of a run (issue 14).

    python bench/host_cost.py                                        # CPU: the tiny example with 12 layers
    python bench/host_cost.py --out bench/results/DATE-host-cost-cpu.json -- --layers 24
    python bench/host_cost.py --device cuda --preset 1b --steps 8    # on the H200

Everything goes through the real CLI on the bundled example (teraio/examples/train_gpt.py;
arguments after `--` go to it): `teraio profile`, `teraio plan` at half the traced peak
(host tier only, a pool as large as the peak), then `teraio run --report` three times:
- planned: that plan; its iterations whose report row says followed_plan;
- unplanned: the same plan with a trace digest no iteration has (the guard never learns, so
  every iteration runs unplanned) and a budget far above the peak: no eviction;
- eviction-heavy: that unplanned plan at half the peak: the budget keeper evicts on demand.
Iteration 0 (first ops, optimizer state) is shown on its own and kept out of the regimes.
Per regime: kernels per iteration, walk + agent host time per kernel (the report's walk_ms,
stalls included; the stall share on its own), iteration ms and its ratio to a plain run's
median step (the example without teraio), each for the best and the median iteration; the
issue's targets are checked against the best. docs/runtime.md, "Host cost per kernel", keeps
the results.
"""

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from run_baseline import git_commit  # noqa: E402  (this folder: TERAIO_COMMIT first, then git)
from teraio.formats.plan import load_plan, save_plan  # noqa: E402
from teraio.formats.report import load_report  # noqa: E402
from teraio.formats.trace import live_bytes_per_kernel, load_trace  # noqa: E402

EXAMPLE = ROOT / "teraio" / "examples" / "train_gpt.py"
NO_DIGEST = "0" * 16          # matches no iteration: the guard never learns, the plan is never followed
LARGE_BUDGET_FACTOR = 1000    # the unplanned run's budget, times the traced peak: never over it
TARGET_US = {"cpu": {"planned": 25, "unplanned": 50}, "cuda": {"planned": 15, "unplanned": 50}}


def run_checked(cmd: list[str], cwd: Path, stderr: bool = False) -> str:
    """The command's stdout (its stderr with `stderr`); exits with its error if it failed."""
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stderr if stderr else proc.stdout


def teraio(*args) -> list[str]:
    return [sys.executable, "-m", "teraio", *map(str, args)]


def job_command(args) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--device", args.device, "--preset", args.preset,
            "--steps", str(args.steps), "--log-every", "0", *args.model_args]


def plain_step_ms(job: list[str], tmp: Path) -> float:
    """The example's own median step (it leaves out step 1, which builds optimizer state)."""
    match = re.search(r"median_step_ms ([0-9.]+)", run_checked(job, tmp))
    return float(match.group(1))


def half_peak_plan(job: list[str], args, tmp: Path) -> tuple[Path, int]:
    trace_path, plan_path = tmp / "trace.msgpack", tmp / "half.json"
    run_checked(teraio("profile", "-o", trace_path, "--device", args.device, "--warmup", 1,
                       "--iterations", 1, "--", *job), tmp)
    peak_bytes = int(live_bytes_per_kernel(load_trace(trace_path)).max())
    run_checked(teraio("plan", trace_path, "--gpu-mem", peak_bytes // 2, "--ssds", 0, "--host-mem", peak_bytes,
                       "-o", plan_path), tmp)
    return plan_path, peak_bytes


def unplanned_copy(plan_path: Path, budget_bytes: int, out: Path) -> Path:
    """The plan with a digest no iteration has and another budget: the agent runs (the plan
    has entries) but only ever keeps the budget, as in iteration 0 or after a guard trip."""
    plan = load_plan(plan_path)
    header = plan.header
    structure = NO_DIGEST if header.trace.structure_digest else ""
    # no chunk digests either: nothing is followed on trust (Note [Following before learning])
    trace = header.trace.model_copy(update={"op_digest": NO_DIGEST, "structure_digest": structure,
                                            "chunk_digests": ""})
    inputs = header.inputs.model_copy(update={"budget_bytes": budget_bytes})
    save_plan(plan.model_copy(update={"header": header.model_copy(update={"trace": trace, "inputs": inputs})}), out)
    return out


def run_rows(job: list[str], plan_path: Path, tmp: Path) -> list:
    report_path = tmp / f"{plan_path.stem}.report.json"
    run_checked(teraio("run", "--plan", plan_path, "--ssd-dir", tmp / "swap", "--report", report_path,
                       "--", *job), tmp)
    return load_report(report_path).per_iteration


def per_kernel_us(rows: list, field: str) -> list[float]:
    return [getattr(r, field) * 1e3 / r.kernels for r in rows]


def summarize(name: str, rows: list, plain_ms: float) -> dict:
    """Best and median iteration: on a shared box other jobs inflate some iterations' wall
    time, and the best one is the closest to what the code costs (bench/walk_overhead.py
    takes the best of its rounds for the same reason)."""
    if not rows:
        return {"regime": name, "iterations": 0}
    walk_us, step_ms = per_kernel_us(rows, "walk_ms"), [r.ms for r in rows]
    return {
        "regime": name, "iterations": len(rows), "iteration_indices": [r.iteration for r in rows],
        "kernels_per_iteration": round(statistics.median(r.kernels for r in rows)),
        "walk_us_per_kernel": round(min(walk_us), 1),
        "walk_us_per_kernel_median": round(statistics.median(walk_us), 1),
        "stall_us_per_kernel_median": round(statistics.median(per_kernel_us(rows, "stall_ms")), 1),
        "op_launch_us_per_kernel_median": round(statistics.median(per_kernel_us(rows, "op_launch_ms")), 1),
        "evictions_per_iteration": round(statistics.mean(r.evictions for r in rows), 1),
        "planned_offloads_per_iteration": round(statistics.mean(r.planned_offloads for r in rows), 1),
        "step_ms": round(min(step_ms), 1), "step_ms_median": round(statistics.median(step_ms), 1),
        "ratio_to_plain": round(min(step_ms) / plain_ms, 2),
        "ratio_to_plain_median": round(statistics.median(step_ms) / plain_ms, 2),
    }


def measure(args, progress: Progress) -> dict:
    job = job_command(args)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        task = progress.add_task("plain run", total=None)
        plain_ms = plain_step_ms(job, tmp)
        progress.update(task, description="teraio profile + plan at half the peak")
        half, peak_bytes = half_peak_plan(job, args, tmp)
        progress.update(task, description="teraio run: planned")
        planned = run_rows(job, half, tmp)
        progress.update(task, description="teraio run: unplanned, large budget")
        free = run_rows(job, unplanned_copy(half, LARGE_BUDGET_FACTOR * peak_bytes, tmp / "unplanned.json"), tmp)
        progress.update(task, description="teraio run: unplanned at half the peak")
        tight = run_rows(job, unplanned_copy(half, peak_bytes // 2, tmp / "evicting.json"), tmp)
        entries = len(load_plan(half).entries)
    regimes = [
        summarize("planned", [r for r in planned if r.followed_plan], plain_ms),
        summarize("unplanned", [r for r in free if r.iteration > 0], plain_ms),
        summarize("eviction-heavy", [r for r in tight if r.iteration > 0], plain_ms),
        summarize("iteration 0", [r for r in free if r.iteration == 0], plain_ms),
    ]
    return {"job": job[1:], "peak_bytes": peak_bytes, "budget_bytes": peak_bytes // 2, "plan_entries": entries,
            "plain_step_ms": plain_ms, "regimes": regimes}


def verdicts(regimes: list[dict], device: str) -> dict:
    """The issue's targets: planned iterations, and unplanned stretches (with or without evictions)."""
    target = TARGET_US[device]
    out = {}
    for r in regimes:
        limit = target["planned"] if r["regime"] == "planned" else target["unplanned"]
        if r["regime"] != "iteration 0" and r["iterations"]:
            out[r["regime"]] = {"target_us_per_kernel": limit, "met": r["walk_us_per_kernel"] <= limit}
    return out


def machine(device: str) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    info = {"host_cores": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "torch": importlib.metadata.version("torch")}
    if device == "cuda":
        import torch
        info["gpu"] = torch.cuda.get_device_name()
    return info


def print_table(result: dict, console: Console) -> None:
    table = Table(title=f"host cost per kernel, {result['config']['device']} (plain step "
                        f"{result['plain_step_ms']:.1f} ms; best / median iteration)")
    for col in ("regime", "iters", "kernels", "walk+agent us/kernel", "stalls us/kernel", "target",
                "evictions/iter", "step ms", "x plain"):
        table.add_column(col, justify="left" if col == "regime" else "right")
    for r in result["regimes"]:
        if not r["iterations"]:
            table.add_row(r["regime"], "0", *["-"] * 7)
            continue
        verdict = result["targets"].get(r["regime"])
        target = f"<= {verdict['target_us_per_kernel']} {'met' if verdict['met'] else 'NOT met'}" if verdict else ""
        table.add_row(r["regime"], str(r["iterations"]), str(r["kernels_per_iteration"]),
                      f"{r['walk_us_per_kernel']:.0f} / {r['walk_us_per_kernel_median']:.0f}",
                      f"{r['stall_us_per_kernel_median']:.1f}", target, f"{r['evictions_per_iteration']:.0f}",
                      f"{r['step_ms']:.0f} / {r['step_ms_median']:.0f}",
                      f"{r['ratio_to_plain']:.2f} / {r['ratio_to_plain_median']:.2f}")
    console.print(table)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--preset", choices=["tiny", "1b", "3b"], default="tiny")
    p.add_argument("--steps", type=int, default=8, help="iterations per run: 0 and 1 are never planned")
    p.add_argument("--out", type=Path, help="write the results here (JSON)")
    p.add_argument("model_args", nargs=argparse.REMAINDER,
                   help="after --: arguments for the example (default on CPU: --layers 12)")
    args = p.parse_args()
    args.model_args = [a for a in args.model_args if a != "--"]
    if not args.model_args and args.device == "cpu" and args.preset == "tiny":
        args.model_args = ["--layers", "12"]  # about 3,500 kernels per iteration: many ops, little math
    return args


def main() -> None:
    args = parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # plain and teraio runs alike, steadier on a shared box
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    console = Console(stderr=True, highlight=False)
    load_before = os.getloadavg()[0]  # a shared box: other jobs inflate every wall time here
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as progress:
        measured = measure(args, progress)
    result = {"format": "teraio-host-cost", "schema_version": 1, "command": ["python", *sys.argv],
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "git_commit": git_commit(),
              "machine": {**machine(args.device), "load_avg_1min": [load_before, os.getloadavg()[0]]},
              "config": {"device": args.device, "preset": args.preset, "steps": args.steps,
                         "model_args": args.model_args, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
              **measured}
    result["targets"] = verdicts(result["regimes"], args.device)
    print_table(result, Console(highlight=False, width=132))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
