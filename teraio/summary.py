"""Readable statistics of trace, plan and report files (no torch): what `teraio inspect` shows."""

import numpy as np

from teraio.formats.trace import Kind, Trace, live_bytes_per_kernel

IDLE_BUCKETS_MS = (1.0, 10.0, 100.0)


def active_bytes_per_kernel(trace: Trace) -> np.ndarray:
    """Bytes of the tensors each kernel touches (inputs and outputs)."""
    counts = np.diff(trace.use_offsets)
    active = np.zeros(trace.num_kernels, dtype=np.int64)
    np.add.at(active, trace.use_kernels, np.repeat(trace.nbytes, counts))
    return active


def idle_gaps_ms(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(idle ms, nbytes) of every gap between two consecutive uses of a tensor, with the
    wrap-around gap of global tensors (last use to first use of the next iteration)."""
    end_us = np.concatenate([[0.0], np.cumsum(trace.duration_us)])  # end_us[k] = start of kernel k
    counts = np.diff(trace.use_offsets)
    owner = np.repeat(np.arange(trace.num_tensors), counts)
    uses = trace.use_kernels
    same = owner[1:] == owner[:-1]
    gaps = (end_us[uses[1:]] - end_us[uses[:-1] + 1])[same]
    sizes = trace.nbytes[owner[1:][same]]
    first, last = trace.use_offsets[:-1], trace.use_offsets[1:] - 1
    glob = np.flatnonzero((trace.born < 0) & (counts > 0))
    wrap = end_us[-1] - end_us[uses[last[glob]] + 1] + end_us[uses[first[glob]]]
    return np.concatenate([gaps, wrap]) / 1e3, np.concatenate([sizes, trace.nbytes[glob]])


def trace_stats(trace: Trace) -> dict:
    h = trace.header
    live = live_bytes_per_kernel(trace)
    active = active_bytes_per_kernel(trace)
    kinds = {kind.name: int(np.count_nonzero(trace.kind == kind)) for kind in Kind}
    return {
        "format": h.format,
        "schema_version": h.schema_version,
        "num_kernels": trace.num_kernels,
        "num_tensors": trace.num_tensors,
        "iterations_profiled": h.profiled_iterations,
        "warmup_iterations": h.warmup_iterations,
        "peak_bytes": int(live.max(initial=0)) + h.untracked_bytes,
        "tracked_peak_bytes": int(live.max(initial=0)),
        "untracked_bytes": h.untracked_bytes,
        "memory_model_max_error": h.memory_model_max_error,
        "device": h.device.model_dump(),
        "rank": h.rank,
        "world_size": h.world_size,
        "iteration_ms": h.iteration_ms,
        "kernel_time_ms": round(float(trace.duration_us.sum()) / 1e3, 3),
        "op_digest": h.op_digest,
        "tensors_by_kind": kinds,
        "gradients_stay_on_device": h.gradients_stay_on_device,
        "active_fraction_mean": round(float(np.mean(active / np.maximum(live, 1))), 5) if len(live) else 0.0,
        # Note [The largest op of the profile] in teraio_profile/recorder.py; None in older traces
        "largest_op": h.largest_op.model_dump() if h.largest_op is not None else None,
    }


def idle_histogram(trace: Trace) -> list[tuple[str, int, int]]:
    """(bucket label, number of idle periods, their bytes) for the rich view."""
    gaps, sizes = idle_gaps_ms(trace)
    edges = (0.0, *IDLE_BUCKETS_MS, np.inf)
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        mask = (gaps >= lo) & (gaps < hi)
        label = f">= {lo:g} ms" if hi == np.inf else f"{lo:g}-{hi:g} ms"
        rows.append((label, int(mask.sum()), int(sizes[mask].sum())))
    return rows


def largest_tensors(trace: Trace, count: int = 10) -> list[dict]:
    order = np.argsort(-trace.nbytes, kind="stable")[:count]
    return [{"name": trace.tensor_name[i], "kind": Kind(trace.kind[i]).name, "nbytes": int(trace.nbytes[i]),
             "shape": trace.shape[i], "uses": int(trace.use_offsets[i + 1] - trace.use_offsets[i])}
            for i in order]


def sparkline(values: np.ndarray, width: int = 60) -> str:
    if len(values) == 0:
        return ""
    bars = "▁▂▃▄▅▆▇█"
    chunks = np.array_split(values.astype(np.float64), min(width, len(values)))
    peaks = np.array([c.max() for c in chunks])
    lo, hi = peaks.min(), peaks.max()
    scaled = np.zeros_like(peaks) if hi == lo else (peaks - lo) / (hi - lo)
    return "".join(bars[int(v * (len(bars) - 1))] for v in scaled)


def plan_following(report) -> str:
    """How many iterations of a run followed the plan and why the others did not (Note
    [When the plan is followed] in teraio_run/agent.py), in one line."""
    rows = report.per_iteration
    followed = sum(1 for row in rows if row.followed_plan)
    paused = sum(1 for row in rows if row.paused_at_kernel >= 0)
    unplanned = len(rows) - followed - paused
    parts = [f"plan followed in {followed} of {len(rows)} iterations"]
    if paused:
        parts.append(f"{paused} paused at an op unlike the trace's (first: {report.pause_reason})")
    if unplanned:
        why = (f"a guard trip: {report.guard_reason}" if report.guard_trips else
               "the job's first iterations, before one ran the traced ops")
        parts.append(f"{unplanned} ran unplanned ({why})")
    return "; ".join(parts)
