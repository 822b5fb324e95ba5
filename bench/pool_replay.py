"""Replay a plan's host-pool slots through the runtime's first-fit pool, on the plan's timing.

    python bench/pool_replay.py PLAN.json --pool 72GiB [--iterations 6]

Each host entry takes a slot at its `offload_after` kernel and gives it back at `needed_by`
(one iteration later for entries that wrap), iteration after iteration, as the plan assumes.
Prints the most the pool held and every allocation that found no room. If the replay fits
and a run still spilled to the other tier, the run held slots longer than the plan: its
timing, not the pool's fragmentation (docs/gpu-results.md, third round).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from teraio.formats.plan import load_plan  # noqa: E402
from teraio.units import parse_size  # noqa: E402
from teraio_run.tiers import PoolSlots  # noqa: E402


def slot_events(entries, num_kernels: int, iterations: int):
    """(kernel, order, entry index, iteration): frees sort before takes at the same kernel."""
    events = []
    for it in range(iterations):
        base = it * num_kernels
        for i, e in enumerate(entries):
            events.append((base + e.offload_after, 1, i, it))
            events.append((base + e.needed_by + (num_kernels if e.wraps else 0), 0, i, it))
    return sorted(events)


def replay(plan, pool_bytes: int, iterations: int) -> tuple[PoolSlots, list[int]]:
    entries = [e for e in plan.entries if e.tier == "host"]
    slots, held, failed = PoolSlots(pool_bytes), {}, []
    for _, take, i, it in slot_events(entries, plan.header.trace.num_kernels, iterations):
        nbytes = entries[i].nbytes
        if take:
            offset = slots.alloc(nbytes)
            if offset is None:
                failed.append(nbytes)
            else:
                held[(i, it)] = offset
        elif (i, it) in held:
            slots.release(held.pop((i, it)), nbytes)
    return slots, failed


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan")
    p.add_argument("--pool", required=True, help="host pool size, e.g. 72GiB")
    p.add_argument("--iterations", type=int, default=6)
    args = p.parse_args(argv)
    plan = load_plan(args.plan)
    slots, failed = replay(plan, parse_size(args.pool), args.iterations)
    print(f"{args.plan}: plan's pool {plan.header.prediction.host_pool_bytes / 2**30:.2f} GiB, replay held at most "
          f"{slots.peak_used / 2**30:.2f} GiB of {slots.capacity / 2**30:.2f} GiB; "
          f"{len(failed)} allocations found no room ({sum(failed) / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
