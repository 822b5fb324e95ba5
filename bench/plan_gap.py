"""How far the greedy's predicted iteration is from the exact solver's bound (teraio_plan/milp.py).

    python bench/plan_gap.py                      # every recorded trace up to 6,000 kernels, 1/2 and 1/4
    python bench/plan_gap.py --traces traces/cpu-tiny.msgpack --time-limit 30 --no-write

Each trace is planned as `teraio plan TRACE --gpu-mem SHARE*peak --ssds 1 --host-mem 16GiB
--no-recompute --no-clean-copies` would (default rates) and bounded with the same inputs. Two
bounds, both relaxations of the simulator's model for plans that move copies (they model no
replays and no clean releases, hence the two flags): the MILP (Note [MILP relaxation]) and the
time-indexed LP (Note [Time-indexed relaxation]). No such plan that fits can predict less than
either, so the gap to the larger is an upper bound on how far the greedy is from the best one. Writes the table into
docs/planner.md between its plan_gap markers, with the command and the commit.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run_baseline import git_commit  # noqa: E402  (TERAIO_COMMIT first, then git)
from teraio.formats.trace import load_trace  # noqa: E402
from teraio_plan import make_plan_outcome, planner_inputs  # noqa: E402
from teraio_plan.memory import memory_curve, min_required_bytes  # noqa: E402
from teraio_plan.milp import iteration_bound  # noqa: E402
from teraio_plan.time_indexed import time_indexed_bound  # noqa: E402

BEGIN, END = "<!-- plan_gap:begin -->", "<!-- plan_gap:end -->"
MAX_KERNELS = 6000
HOST_MEM_BYTES = 16 * 2**30


def rows_for(path: Path, shares: list[float], time_limit_s: float) -> list[str]:
    trace = load_trace(path)
    peak_bytes = int(memory_curve(trace, 0).max())
    floor_bytes, _ = min_required_bytes(trace, 0)
    rows = []
    for share in shares:
        budget_bytes = int(peak_bytes * share)
        if budget_bytes < floor_bytes:
            rows.append(f"| {path.name} | {trace.num_kernels:,} | {share:g} | below what must stay | | | | | |")
            continue
        inputs = planner_inputs(trace, gpu_mem_bytes=budget_bytes, num_ssds=1, host_mem_bytes=HOST_MEM_BYTES,
                                recompute=False, clean_copies=False)
        start = time.perf_counter()
        prediction = make_plan_outcome(trace, inputs).plan.header.prediction
        plan_s = time.perf_counter() - start
        old, old_s = _timed(iteration_bound, trace, inputs, time_limit_s)
        new, new_s = _timed(time_indexed_bound, trace, inputs, time_limit_s)
        best_ms = max(old.lower_bound_ms, new.lower_bound_ms)
        gap = prediction.iteration_ms / best_ms - 1
        rows.append(f"| {path.name} | {trace.num_kernels:,} | {share:g} | {'yes' if prediction.fits else 'no'} "
                    f"| {prediction.iteration_ms:.1f} | {_cell(old)} | {_cell(new)} "
                    f"| {gap:+.1%} ({'time-indexed' if new.lower_bound_ms > old.lower_bound_ms else 'MILP'}) "
                    f"| {plan_s:.1f} s / {old_s:.1f} s / {new_s:.1f} s |")
        print(rows[-1], flush=True)
    return rows


def _timed(bound_fn, trace, inputs, time_limit_s: float):
    start = time.perf_counter()
    bound = bound_fn(trace, inputs, time_limit_s)
    return bound, time.perf_counter() - start


def _cell(bound) -> str:
    return f"{bound.lower_bound_ms:.1f}{'' if bound.optimal else ' (time limit)'}"


def table(rows: list[str], command: str) -> str:
    head = ("| trace | kernels | budget (share of peak) | greedy fits | greedy ms | MILP bound ms "
            "| time-indexed bound ms | gap to the larger (which) | plan / MILP / time-indexed |\n"
            "|---|---:|---:|---|---:|---:|---:|---:|---|")
    return f"`{command}`, commit {git_commit()[:12]}, {time.strftime('%Y-%m-%d')}:\n\n{head}\n" + "\n".join(rows)


def write_into_docs(text: str) -> None:
    doc = ROOT / "docs" / "planner.md"
    body = doc.read_text()
    before, rest = body.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    doc.write_text(f"{before}{BEGIN}\n{text}\n{END}{after}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="*", type=Path)
    ap.add_argument("--shares", nargs="*", type=float, default=[0.5, 0.25])
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per MILP")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/planner.md alone")
    args = ap.parse_args()
    paths = args.traces or sorted((ROOT / "traces").glob("*.msgpack"))
    rows = []
    for path in paths:
        trace = load_trace(path)
        if trace.num_kernels > MAX_KERNELS:
            print(f"{path.name}: {trace.num_kernels} kernels, over {MAX_KERNELS}: skipped")
            continue
        rows += rows_for(path, args.shares, args.time_limit)
    text = table(rows, "python bench/plan_gap.py " + " ".join(sys.argv[1:]))
    print(text)
    if not args.no_write:
        write_into_docs(text)


if __name__ == "__main__":
    main()
