"""How fast `teraio plan` is on big traces built from a committed real one.

    python bench/plan_speed.py                       # 50k and 250k kernels from traces/h200-1b-bf16
    python bench/plan_speed.py --trace traces/cpu-tiny.msgpack --kernels 50000

A bigger trace is the real one with its model made deeper: every contiguous run of kernels of
one phase (forward, backward, optimizer, other) is repeated R times, the backward runs in
reverse copy order as a deeper model's backward would, and every tensor gets R copies, copy r
used where run copy r uses it. Lifetimes, sizes and kernel times stay the real ones. The
budget is a share of the deeper trace's peak; tiers are 4 SSDs plus a host pool.
Prints one line per size; docs/planner.md records the numbers.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from teraio.formats.trace import Trace, load_trace  # noqa: E402
from teraio_plan import planner_inputs, simulate  # noqa: E402
from teraio_plan.make import assemble_plan, check_budget, make_plan_outcome  # noqa: E402
from teraio_plan.memory import memory_curve  # noqa: E402
from teraio_plan.planner import plan_entries  # noqa: E402
from teraio_plan.periods import find_periods  # noqa: E402

DEFAULT_TRACE = "traces/h200-1b-bf16.msgpack"
BACKWARD = 1


def phase_runs(trace: Trace) -> list[tuple[int, int, int]]:
    """(start, end, phase) of each contiguous run of one phase."""
    phase = trace.kernel_phase
    cuts = np.flatnonzero(np.diff(phase)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(phase)]))
    return [(int(s), int(e), int(phase[s])) for s, e in zip(starts, ends)]


def kernel_map(trace: Trace, times: int) -> np.ndarray:
    """new_index[r, k]: where copy r of kernel k lands in the deeper trace."""
    new_index = np.zeros((times, trace.num_kernels), dtype=np.int64)
    base = 0
    for start, end, phase in phase_runs(trace):
        length = end - start
        for r in range(times):
            slot = times - 1 - r if phase == BACKWARD else r
            new_index[r, start:end] = base + slot * length + np.arange(length)
        base += times * length
    return new_index


def deeper(trace: Trace, times: int) -> Trace:
    n, new_n = trace.num_kernels, trace.num_kernels * times
    where = kernel_map(trace, times)
    order = np.argsort(where.ravel())  # old kernel of each new position
    old_k = np.tile(np.arange(n), times)[order]
    copies = [_tensor_copy(trace, where[r], n, new_n) for r in range(times)]
    counts = np.concatenate([np.diff(trace.use_offsets)] * times)
    header = trace.header.model_copy(update=dict(
        num_kernels=new_n, num_tensors=trace.num_tensors * times, op_digest=f"{trace.header.op_digest}-x{times}",
        iteration_ms=trace.header.iteration_ms * times))
    return Trace(
        header=header, op_names=trace.op_names, kernel_op=trace.kernel_op[old_k],
        kernel_phase=trace.kernel_phase[old_k], duration_us=trace.duration_us[old_k],
        device_bytes=trace.device_bytes[old_k], signature=trace.signature[old_k],
        tensor_id=[f"{t}#{r}" for r in range(times) for t in trace.tensor_id],
        tensor_name=[f"{t}#{r}" for r in range(times) for t in trace.tensor_name],
        kind=np.tile(trace.kind, times), nbytes=np.tile(trace.nbytes, times),
        dtype=trace.dtype * times, shape=trace.shape * times,
        born=np.concatenate([c[0] for c in copies]), freed=np.concatenate([c[1] for c in copies]),
        use_offsets=np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
        use_kernels=np.concatenate([c[2] for c in copies]),
    )


def _tensor_copy(trace: Trace, where: np.ndarray, n: int, new_n: int):
    """born, freed and per-tensor sorted uses of one copy of every tensor."""
    born = np.where(trace.born >= 0, where[np.clip(trace.born, 0, n - 1)], -1)
    last = trace.freed - 1
    wraps = last >= n
    freed = where[np.clip(np.where(wraps, last - n, last), 0, n - 1)] + 1 + np.where(wraps, new_n, 0)
    freed = np.where(trace.born >= 0, np.maximum(freed, born + 1), -1)
    uses = where[trace.use_kernels]
    tensor = np.repeat(np.arange(trace.num_tensors), np.diff(trace.use_offsets))
    uses = uses[np.lexsort((uses, tensor))]
    return born, freed, uses


def bench(trace: Trace, budget_share: float, host_share: float, full: bool) -> dict:
    peak = int(memory_curve(trace, 0).max())
    inputs = planner_inputs(trace, gpu_mem_bytes=int(budget_share * peak), num_ssds=4,
                            host_mem_bytes=int(host_share * peak))
    check_budget(trace, inputs)
    t0 = time.perf_counter()
    result = plan_entries(trace, inputs)
    t1 = time.perf_counter()
    plan = assemble_plan(trace, inputs, result, None)
    sim = simulate(trace, plan)
    t2 = time.perf_counter()
    if full:  # what `teraio plan` runs: greedy, fill pass, tier fallback, replay
        make_plan_outcome(trace, inputs)
    t3 = time.perf_counter()
    return dict(kernels=trace.num_kernels, tensors=trace.num_tensors, periods=len(find_periods(trace)),
                entries=len(plan.entries), evaluations=result.evaluations, plan_s=t1 - t0, simulate_s=t2 - t1,
                full_s=t3 - t2 if full else None,
                peak_gib=peak / 2**30, planned_peak_gib=result.memory_bytes.max() / 2**30,
                budget_gib=inputs.budget_bytes / 2**30, share_of_ideal=sim.share_of_ideal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE)
    parser.add_argument("--kernels", type=int, nargs="+", default=[50_000, 250_000])
    parser.add_argument("--budget-share", type=float, default=0.8, help="budget as a share of the peak")
    parser.add_argument("--host-share", type=float, default=0.1, help="host pool as a share of the peak")
    parser.add_argument("--full", action="store_true",
                        help="also time the whole of `teraio plan` (fill pass for budgets the greedy cannot make, "
                             "one-tier fallback, replay)")
    args = parser.parse_args()
    base = load_trace(args.trace)
    print(f"base {args.trace}: {base.num_kernels} kernels, {base.num_tensors} tensors")
    for target in args.kernels:
        times = max(1, round(target / base.num_kernels))
        r = bench(deeper(base, times), args.budget_share, args.host_share, args.full)
        print(f"x{times}: {r['kernels']} kernels, {r['tensors']} tensors, {r['periods']} periods -> "
              f"{r['entries']} entries ({r['evaluations']} evaluations); plan {r['plan_s']:.2f} s, "
              f"simulate {r['simulate_s']:.2f} s; peak {r['peak_gib']:.1f} GiB -> {r['planned_peak_gib']:.1f} "
              f"GiB for budget {r['budget_gib']:.1f} GiB; {r['share_of_ideal']:.1%} of ideal"
              + (f"; whole plan command {r['full_s']:.1f} s" if args.full else ""), flush=True)


if __name__ == "__main__":
    main()
