"""How many activation bytes one op replay could bring back instead of the link (issue 15).

    python bench/recompute_candidates.py                       # the committed H200 traces
    python bench/recompute_candidates.py traces/h200-3b-fp32.msgpack --link-gbps 55
    python bench/recompute_candidates.py trace.msgpack --plan plan.json     # what a finished plan leaves replayable

For every activation of a trace: the op that made it (the kernel it was born at), that op's
other tensors (its inputs: the tensors the kernel used that it did not make), and its first
idle gap (from its last forward use to its next use). An activation is replayable when its
op is free of random numbers and writes no input in place, and every input is still alive
at the next use (it has not died by then: a replay there needs no chain of replays). For
each producing op: the bytes, the bytes replayable, those whose inputs are all globals
(weights: resident or brought back anyway), and the replay's cost (the producer's kernel
time) against the link time a round trip of those bytes takes. Replayable bytes whose
inputs are activations are an upper bound: those inputs must be on the device at the
replay (kept, brought back, or replayed first). This reads traces
only: what a planner choosing recomputation could gain, before one exists.
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from teraio.formats.plan import load_plan  # noqa: E402
from teraio.formats.trace import Kind, Trace, load_trace  # noqa: E402

TRACES = ["h200-1b-bf16.msgpack", "h200-3b-fp32.msgpack", "h200-3b-bf16.msgpack"]
RANDOM_OPS = ("dropout", "native_dropout", "bernoulli", "rand", "randn", "randint", "normal", "uniform",
              "multinomial", "randperm")
MIN_GAP_KERNELS = 4   # as the planner's periods (teraio_plan/periods.py)


def inputs_of(trace: Trace) -> dict[int, list[int]]:
    """Kernel -> tensors it used that it did not make."""
    used = defaultdict(list)
    for t in range(trace.num_tensors):
        for k in trace.uses(t):
            if k != trace.born[t]:
                used[int(k)].append(t)
    return used


def replayable(trace: Trace, t: int, inputs: list[int], next_use: int) -> bool:
    op = trace.op_name(int(trace.born[t]))
    if op.endswith("_") or any(word in op for word in RANDOM_OPS):
        return False
    return all(trace.born[i] < 0 or trace.freed[i] < 0 or trace.freed[i] > next_use for i in inputs)


def analyse(trace: Trace) -> dict[str, dict]:
    used = inputs_of(trace)
    by_op: dict[str, dict] = defaultdict(lambda: {"count": 0, "bytes": 0, "replayable_bytes": 0, "replay_us": 0.0,
                                                  "from_globals_bytes": 0})
    for t in np.flatnonzero((trace.kind == Kind.activation) & (trace.born >= 0)):
        uses = trace.uses(t)
        gaps = np.diff(uses)
        long = np.flatnonzero(gaps >= MIN_GAP_KERNELS)
        if not len(long):
            continue
        next_use = int(uses[long[0] + 1])
        born = int(trace.born[t])
        row = by_op[trace.op_name(born)]
        row["count"] += 1
        row["bytes"] += int(trace.nbytes[t])
        inputs = used.get(born, [])
        if replayable(trace, t, inputs, next_use):
            row["replayable_bytes"] += int(trace.nbytes[t])
            row["replay_us"] += float(trace.duration_us[born])
            if all(trace.born[i] < 0 for i in inputs):
                row["from_globals_bytes"] += int(trace.nbytes[t])
    return dict(by_op)


def against_plan(trace: Trace, plan) -> dict[str, int]:
    """A plan's activation entries (not wrapping) by what a replay at the entry's next use
    would meet: "replayable", or the first reason it cannot (an input dead by then, written
    since the producer ran, or sent away by this same plan at that kernel)."""
    used = inputs_of(trace)
    index = {tensor_id: t for t, tensor_id in enumerate(trace.tensor_id)}
    away = defaultdict(list)
    for e in plan.entries:
        away[e.tensor].append(e)
    outcome: dict[str, int] = defaultdict(int)
    for entry in plan.entries:
        if entry.kind == "activation" and not entry.wraps:
            t = index[entry.tensor]
            outcome[_replay_blocker(trace, t, used.get(int(trace.born[t]), []), entry.needed_by, away)] += 1
    return dict(outcome)


def _replay_blocker(trace: Trace, t: int, inputs: list[int], next_use: int, away: dict) -> str:
    born = int(trace.born[t])
    if not replayable(trace, t, inputs, next_use):
        return "op or an input dead by then"
    for i in inputs:
        lo, hi = trace.use_offsets[i], trace.use_offsets[i + 1]
        written = trace.use_writes[lo:hi] if len(trace.use_writes) else np.ones(hi - lo, dtype=bool)
        uses = trace.use_kernels[lo:hi]
        if written[(uses > born) & (uses <= next_use)].any():
            return "an input written since"
        if any(_away_at(e, next_use) for e in away.get(trace.tensor_id[i], ())):
            return "an input planned away then"
    return "replayable"


def _away_at(entry, k: int) -> bool:
    if entry.wraps:
        return k > entry.offload_after or k < entry.needed_by
    return entry.offload_after < k < entry.needed_by


def print_table(name: str, trace: Trace, by_op: dict, link_gbps: float, console: Console) -> None:
    table = Table(title=f"{name}: {trace.num_kernels} kernels, {sum(trace.duration_us) / 1e3:.0f} ms of kernels")
    for col in ("producer op", "activations", "GiB idle", "GiB replayable", "of which from globals alone",
                "replay ms", "link ms (out + in)"):
        table.add_column(col, justify="left" if col == "producer op" else "right")
    totals = [0, 0, 0, 0.0, 0]
    for op, row in sorted(by_op.items(), key=lambda item: -item[1]["bytes"]):
        link_ms = 2 * row["replayable_bytes"] / (link_gbps * 1e6)
        table.add_row(op, str(row["count"]), f"{row['bytes'] / 2**30:.2f}", f"{row['replayable_bytes'] / 2**30:.2f}",
                      f"{row['from_globals_bytes'] / 2**30:.2f}", f"{row['replay_us'] / 1e3:.1f}", f"{link_ms:.0f}")
        totals = [totals[0] + row["count"], totals[1] + row["bytes"], totals[2] + row["replayable_bytes"],
                  totals[3] + row["replay_us"], totals[4] + row["from_globals_bytes"]]
    table.add_row("all", str(totals[0]), f"{totals[1] / 2**30:.2f}", f"{totals[2] / 2**30:.2f}",
                  f"{totals[4] / 2**30:.2f}", f"{totals[3] / 1e3:.1f}", f"{2 * totals[2] / (link_gbps * 1e6):.0f}",
                  style="bold")
    console.print(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="*", type=Path, default=[ROOT / "traces" / name for name in TRACES])
    p.add_argument("--link-gbps", type=float, default=55.0, help="one direction of the device link, GB/s")
    p.add_argument("--plan", type=Path, help="with one trace: its plan's activation entries, replayable at their "
                                             "next use or what stops it")
    args = p.parse_args()
    console = Console()
    for path in args.traces:
        trace = load_trace(path)
        print_table(path.name, trace, analyse(trace), args.link_gbps, console)
        if args.plan:
            console.print(f"{args.plan.name}: activation entries by what a replay at their next use meets: "
                          f"{against_plan(trace, load_plan(args.plan))}")


if __name__ == "__main__":
    main()
