"""Where the CUDA allocator maps and unmaps memory in one step (issue 14: re-allocation at the cap).

    python bench/run_baseline.py --system teraio_host ... --memory-history step.pickle --out r.jsonl
    python bench/alloc_trace.py step.pickle [--json summary.json]

Reads the snapshot `run_baseline.py --memory-history` writes (torch.cuda.memory._snapshot with
the trace of one step) and says, for that step: how many allocations there were and how many
of them had to map new pages (expandable segments) or a new segment, who asked for those (the
innermost teraio frame of the allocation's Python stack: a copy in, a replay; else the job's own
op), at what point of the step, and how often the allocator flushed (a run of unmaps: it
released every free page because a request did not fit under the cap), with the time each
flush took until the next event.
"""

import argparse
import collections
import json
import pickle
from pathlib import Path

MIB = 1 << 20
STEP_TENTHS = 10


def caller(entry: dict) -> str:
    """The teraio function that asked for this block, or 'job op'."""
    for frame in entry.get("frames") or ():
        name = frame.get("filename", "")
        if "teraio_run/" in name or "teraio/raw_access" in name:
            return f"teraio {Path(name).stem}.{frame.get('name')}"
    return "job op"


def flushes(trace: list[dict]) -> list[dict]:
    """Each release of every free page: a run of unmaps, with the run of completed frees before
    it (the allocator first waits for every block freed under record_stream, freeing each as
    its event passes), its bytes, and how long it took: `ms` from the last event before those
    waits to the first event after the unmaps, `unmap_ms` the unmaps alone (each one waits
    for the segment's stream first)."""
    runs, i = [], 0
    while i < len(trace):
        if trace[i]["action"] != "segment_unmap":
            i += 1
            continue
        j = i
        while j < len(trace) and trace[j]["action"] == "segment_unmap":
            j += 1
        w = i
        while w > 0 and trace[w - 1]["action"] == "free_completed":
            w -= 1
        before = trace[max(0, w - 1)].get("time_us", 0)
        unmaps_from = trace[i - 1].get("time_us", before) if i else before
        after = trace[min(j, len(trace) - 1)].get("time_us", unmaps_from)
        runs.append({"unmaps": j - i, "frees_waited": i - w, "bytes": sum(e["size"] for e in trace[i:j]),
                     "ms": (after - before) / 1e3, "unmap_ms": (after - unmaps_from) / 1e3})
        i = j
    return runs


def mapped_allocs(trace: list[dict]) -> list[tuple[dict, int, float]]:
    """Each allocation that needed new pages or a new segment first: (alloc, bytes mapped, ms
    from the event before the mapping to the allocation)."""
    found, pending, since = [], 0, None
    for k, e in enumerate(trace):
        if e["action"] in ("segment_map", "segment_alloc"):
            if not pending and k:
                since = trace[k - 1].get("time_us")
            pending += e["size"]
        elif e["action"] == "alloc" and pending:
            ms = (e.get("time_us", 0) - since) / 1e3 if since is not None else 0.0
            found.append((e, pending, ms))
            pending = 0
    return found


def summarize(snapshot: dict) -> dict:
    trace = [e for device in snapshot["device_traces"] for e in device]
    if not trace:
        raise SystemExit("the snapshot has no trace: was it recorded with --memory-history?")
    t_first, t_last = trace[0].get("time_us", 0), trace[-1].get("time_us", 0)
    span = max(1, t_last - t_first)
    actions = collections.Counter(e["action"] for e in trace)
    action_bytes = collections.Counter()
    for e in trace:
        action_bytes[e["action"]] += e["size"]
    by_caller = collections.defaultdict(lambda: {"allocs": 0, "alloc_mib": 0.0, "mapping": 0, "mapped_mib": 0.0,
                                                 "mapping_ms": 0.0})
    for e in trace:
        if e["action"] == "alloc":
            row = by_caller[caller(e)]
            row["allocs"] += 1
            row["alloc_mib"] += e["size"] / MIB
    tenths = [0] * STEP_TENTHS
    for e, mapped, ms in mapped_allocs(trace):
        row = by_caller[caller(e)]
        row["mapping"] += 1
        row["mapped_mib"] += mapped / MIB
        row["mapping_ms"] += ms
        tenths[min(STEP_TENTHS - 1, (e.get("time_us", t_first) - t_first) * STEP_TENTHS // span)] += 1
    runs = flushes(trace)
    return {"step_ms": span / 1e3, "actions": dict(actions),
            "action_mib": {k: round(v / MIB, 1) for k, v in action_bytes.items()},
            "by_caller": {k: {f: round(v, 1) if isinstance(v, float) else v for f, v in row.items()}
                          for k, row in sorted(by_caller.items(), key=lambda kv: -kv[1]["mapping_ms"])},
            "mapping_allocs_per_tenth_of_step": tenths,
            "flushes": len(runs), "flush_ms": round(sum(r["ms"] for r in runs), 1),
            "flush_unmap_ms": round(sum(r["unmap_ms"] for r in runs), 1),
            "flush_unmapped_mib": round(sum(r["bytes"] for r in runs) / MIB, 1), "flush_runs": runs[:20]}


def print_summary(s: dict) -> None:
    print(f"one step, {s['step_ms']:.0f} ms of allocator events")
    for action, n in sorted(s["actions"].items()):
        print(f"  {action:<16} {n:>7}  {s['action_mib'].get(action, 0):>10.1f} MiB")
    print(f"  flushes (runs of unmaps): {s['flushes']}, {s['flush_ms']} ms ({s['flush_unmap_ms']} ms unmapping, "
          f"the rest waiting for record_stream frees), {s['flush_unmapped_mib']} MiB unmapped")
    for run in s["flush_runs"]:
        print(f"    {run['frees_waited']:>4} frees waited, {run['unmaps']:>4} unmaps, {run['bytes'] / MIB:>8.0f} MiB, "
              f"{run['ms']:>7.1f} ms ({run['unmap_ms']:.1f} unmapping)")
    print("  allocations that mapped memory first, by tenth of the step:", s["mapping_allocs_per_tenth_of_step"])
    print(f"  {'who asked':<44} {'allocs':>7} {'MiB':>9} {'mapping':>8} {'mapped MiB':>11} {'ms':>8}")
    for name, row in s["by_caller"].items():
        print(f"  {name:<44} {row['allocs']:>7} {row['alloc_mib']:>9.0f} {row['mapping']:>8} "
              f"{row['mapped_mib']:>11.0f} {row['mapping_ms']:>8.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("snapshot", type=Path, help="the pickle from run_baseline.py --memory-history")
    p.add_argument("--json", type=Path, help="also write the summary here")
    args = p.parse_args()
    with args.snapshot.open("rb") as f:
        summary = summarize(pickle.load(f))
    print_summary(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
