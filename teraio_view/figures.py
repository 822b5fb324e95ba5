"""The pictures of one trace, its plan and a run of it: each a function that returns a Figure.

Everything drawn is computed by the libraries that own it (teraio.summary for the trace's
statistics, teraio_plan for the plan's memory curve, replay and sweep); this module only
chooses what to show and thins it (curves.py).
"""

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from teraio.summary import idle_gaps_ms, largest_tensors
from teraio.units import format_bytes, format_ms
from teraio_view.curves import demand_by_kind, extreme_kernels, plan_curves
from teraio_view.inputs import RunFiles
from teraio_view.style import (
    BUDGET_COLOR, KIND_COLORS, KIND_LABELS, PLAN_COLOR, REPLAY_COLOR, RUN_COLOR, Figure,
    byte_unit, layout,
)
from teraio_view.timeline import timeline_figure

KERNEL_AXIS = "kernel of one iteration (the k-th op)"


def run_figures(f: RunFiles, sweep_points=None) -> list[Figure]:
    """Every picture the files allow, in reading order; sweep_points: teraio_plan.sweep's, or None."""
    curves = plan_curves(f.trace, f.plan) if f.plan is not None else None
    figures = [memory_figure(f, curves)]
    if f.plan is not None:
        figures.append(timeline_figure(f.plan, f.trace.num_kernels, f.report))
    if f.report is not None and f.report.per_iteration:
        figures.append(iterations_figure(f))
    figures.append(idle_figure(f))
    if sweep_points:
        figures.append(sweep_figure(f, sweep_points))
    if f.plan is not None or f.report is not None:
        figures += [stalls_figure(f), bytes_figure(f)]
    figures.append(largest_figure(f))
    return figures


# --- memory over one iteration

def memory_figure(f: RunFiles, curves: dict | None) -> Figure:
    layers = demand_by_kind(f.trace)
    total = sum(layers.values())
    budget = _budget_bytes(f)
    scale, unit = byte_unit(max(int(total.max(initial=0)), budget or 0))
    picks = extreme_kernels(total)
    ops = [f.trace.op_name(int(k)) for k in picks]
    fig = go.Figure()
    for name, values in layers.items():
        if values.any():
            fig.add_trace(go.Scatter(
                x=picks, y=values[picks] / scale, name=KIND_LABELS[name], stackgroup="demand", customdata=ops,
                line=dict(width=0.5, color=KIND_COLORS[name]), hovertemplate=f"%{{y:.4g}} {unit}<br>%{{customdata}}"))
    for name, values in (curves or {}).items():
        _plan_line(fig, name, values, scale, unit)
    n = f.trace.num_kernels
    if budget:
        _hline(fig, budget / scale, n, "budget", BUDGET_COLOR, "dash", unit)
    if f.report is not None:
        _hline(fig, f.report.peak_device_bytes / scale, n, "measured peak of the run", RUN_COLOR, "dot", unit)
        _iteration_peaks(fig, f.report, n, scale, unit)
    layout(fig, 460, hovermode="x unified", xaxis_title=KERNEL_AXIS, yaxis_title=unit)
    caption = ("Traced demand stacked by kind of tensor (nothing moved), the plan's memory (as the planner "
               "promised it, and as the simulator replays it), the budget, the run's measured peak, and at the "
               "right edge each iteration's peak as the budget keeper counted it (a lower bound). "
               f"{n} kernels; curves keep each bucket's highest and lowest kernel, so peaks are exact.")
    return Figure("memory", "Memory over one iteration", caption, fig, 460)


def _plan_line(fig, name: str, values: np.ndarray, scale: float, unit: str) -> None:
    picks = extreme_kernels(values)
    label, color, dash = {"planned": ("plan: planner's curve", PLAN_COLOR, "solid"),
                          "replayed": ("plan: simulator's replay", REPLAY_COLOR, "dot")}[name]
    fig.add_trace(go.Scatter(x=picks, y=values[picks] / scale, name=label, mode="lines",
                             line=dict(color=color, width=1.5, dash=dash), hovertemplate=f"%{{y:.4g}} {unit}"))


def _hline(fig, y: float, num_kernels: int, name: str, color: str, dash: str, unit: str) -> None:
    fig.add_trace(go.Scatter(x=[0, max(num_kernels - 1, 1)], y=[y, y], name=name, mode="lines",
                             line=dict(color=color, width=1.5, dash=dash), hovertemplate=f"%{{y:.4g}} {unit}"))


def _budget_bytes(f: RunFiles) -> int | None:
    if f.plan is not None:
        return f.plan.header.inputs.budget_bytes
    return f.report.budget_bytes if f.report is not None else None


def _iteration_peaks(fig, report, num_kernels: int, scale: float, unit: str) -> None:
    """Each iteration's counted peak as a marker at the right edge (reports written before the
    field have zeros there: nothing is drawn)."""
    rows = [r for r in report.per_iteration if r.resident_peak_bytes]
    if not rows:
        return
    fig.add_trace(go.Scatter(
        x=[num_kernels] * len(rows), y=[r.resident_peak_bytes / scale for r in rows], mode="markers",
        name="peak of each iteration (run)", marker=dict(color=RUN_COLOR, symbol="line-ew-open", size=14),
        customdata=[r.iteration for r in rows], hovertemplate=f"iteration %{{customdata}}: %{{y:.4g}} {unit}"))


# --- the run, iteration by iteration

def iterations_figure(f: RunFiles) -> Figure:
    rows = f.report.per_iteration
    state = ["on plan" if r.followed_plan else f"paused at kernel {r.paused_at_kernel}"
             if r.paused_at_kernel >= 0 else "unplanned" for r in rows]
    colors = [RUN_COLOR if r.followed_plan else "#BBBBBB" for r in rows]
    its = [r.iteration for r in rows]
    fig = go.Figure(go.Bar(x=its, y=[r.ms for r in rows], name="iteration time", marker_color=colors,
                           customdata=state, hovertemplate="%{y:.4g} ms<br>%{customdata}"))
    fig.add_trace(go.Scatter(x=its, y=[r.stall_ms for r in rows], name="of which stalls", mode="lines+markers",
                             line=dict(color=BUDGET_COLOR), hovertemplate="%{y:.4g} ms"))
    if f.plan is not None:
        pred = f.plan.header.prediction
        fig.add_trace(go.Scatter(x=[its[0], its[-1]], y=[pred.iteration_ms] * 2, mode="lines",
                                 name="predicted by the plan", line=dict(color=REPLAY_COLOR, dash="dash")))
    layout(fig, 360, xaxis_title="iteration of the run", yaxis_title="ms", bargap=0.2)
    caption = (f"{f.report.iterations} iterations, {f.report.iterations_on_plan} on plan (orange; grey: the "
               "job's first iterations or ones unlike the trace, run without the plan). Each iteration's "
               "peak is drawn on the memory figure.")
    return Figure("iterations", "The run, iteration by iteration", caption, fig, 360, wide=False)


# --- idle periods (the paper's Figure 2)

def idle_figure(f: RunFiles) -> Figure:
    gaps_ms, sizes = idle_gaps_ms(f.trace)
    floor_ms = 1e-3  # back-to-back uses: drawn in the first bucket, a log axis has no zero
    gaps_ms = np.maximum(gaps_ms, floor_ms)
    edges = np.logspace(np.log10(floor_ms), np.log10(max(gaps_ms.max(initial=floor_ms), 2 * floor_ms)), 41)
    counts, _ = np.histogram(gaps_ms, edges)
    nbytes, _ = np.histogram(gaps_ms, edges, weights=sizes)
    scale, unit = byte_unit(nbytes.max(initial=0))
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(_steps(edges, counts, "idle periods", "#4C78A8", "%{y} periods"), secondary_y=False)
    fig.add_trace(_steps(edges, nbytes / scale, f"their bytes ({unit})", "#F58518", f"%{{y:.4g}} {unit}"),
                  secondary_y=True)
    if f.plan is not None:
        planned = _planned_gaps(f)
        fig.add_trace(_steps(edges, np.histogram(planned[0], edges, weights=planned[1])[0] / scale,
                             f"planned away ({unit})", PLAN_COLOR, f"%{{y:.4g}} {unit}"), secondary_y=True)
    layout(fig, 380, xaxis=dict(type="log", title="idle period between two uses (ms, log)"))
    fig.update_yaxes(title_text="periods", secondary_y=False)
    fig.update_yaxes(title_text=unit, secondary_y=True, rangemode="tozero")
    caption = (f"{len(gaps_ms)} idle periods of the trace's tensors (global tensors' periods wrap around the "
               "iteration) by length, and the bytes idle that long; the plan moves the long ones away.")
    return Figure("idle", "Idle periods", caption, fig, 380, wide=False)


def _steps(edges, values, name: str, color: str, hover: str):
    return go.Scatter(x=edges, y=np.append(values, values[-1] if len(values) else 0), name=name,
                      mode="lines", line=dict(shape="hv", color=color, width=1.5), hovertemplate=hover)


def _planned_gaps(f: RunFiles) -> tuple[np.ndarray, np.ndarray]:
    """(idle ms, nbytes) of the periods the plan moves away, timed as idle_gaps_ms times them."""
    start_us = np.concatenate([[0.0], np.cumsum(f.trace.duration_us)])
    total_us = start_us[-1]
    ms, sizes = [], []
    for e in f.plan.entries:
        gap_us = start_us[e.needed_by] - start_us[e.offload_after + 1]
        ms.append((gap_us + total_us if e.wraps else gap_us) / 1e3)
        sizes.append(e.nbytes)
    return np.maximum(np.asarray(ms, dtype=float), 1e-3), np.asarray(sizes, dtype=float)


# --- the bandwidth sweep (the paper's Figure 3)

def sweep_figure(f: RunFiles, points) -> Figure:
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    bw = [p.bw_gbps for p in points]
    fig.add_trace(go.Scatter(
        x=bw, y=[100 * p.share_of_ideal for p in points], name="share of ideal throughput", mode="lines+markers",
        marker=dict(symbol=["circle" if p.fits else "circle-open" for p in points], size=9), line=dict(color=PLAN_COLOR),
        customdata=["fits" if p.fits else "over budget: would not run" for p in points],
        hovertemplate="%{x} GB/s: %{y:.3g}% of ideal<br>%{customdata}"), secondary_y=False)
    scale, unit = byte_unit(max(p.peak_bytes for p in points))
    fig.add_trace(go.Scatter(x=bw, y=[p.peak_bytes / scale for p in points], name=f"predicted peak ({unit})",
                             mode="lines", line=dict(color=REPLAY_COLOR, dash="dot"),
                             hovertemplate=f"%{{y:.4g}} {unit}"), secondary_y=True)
    budget = f.plan.header.inputs.budget_bytes / scale
    fig.add_trace(go.Scatter(x=[bw[0], bw[-1]], y=[budget, budget], name=f"budget ({unit})", mode="lines",
                             line=dict(color=BUDGET_COLOR, dash="dash")), secondary_y=True)
    _sweep_points(fig, f)
    layout(fig, 400, xaxis_title="migration bandwidth per direction (GB/s)")
    fig.update_yaxes(title_text="% of ideal throughput", range=[0, 105], secondary_y=False)
    fig.update_yaxes(title_text=unit, secondary_y=True, rangemode="tozero")
    caption = ("The planner and simulator run at each bandwidth through one path (teraio plan --sweep); open "
               "circles do not fit the budget (0%: the job would run out of memory). The star is this plan, "
               "the diamond what the run achieved.")
    return Figure("sweep", "Throughput against bandwidth", caption, fig, 400, wide=False)


def _sweep_points(fig, f: RunFiles) -> None:
    from teraio_plan.bandwidth import rates

    pred, r = f.plan.header.prediction, rates(f.plan.header.inputs)
    plan_gbps = min(r.peak("ssd", True) + r.peak("host", True), r.peak("ssd", False) + r.peak("host", False)) / 1e3
    fig.add_trace(go.Scatter(x=[plan_gbps], y=[100 * pred.share_of_ideal if pred.fits else 0.0], name="this plan",
                             mode="markers", marker=dict(symbol="star", size=16, color=PLAN_COLOR),
                             hovertemplate="plan: %{x:.3g} GB/s, %{y:.3g}% of ideal"), secondary_y=False)
    measured = f.report.achieved_gbps if f.report is not None else {}
    if measured and f.report.measured_iteration_ms > 0:
        gbps = min(measured.get("d2h", 0) + measured.get("d2s", 0), measured.get("h2d", 0) + measured.get("s2d", 0))
        share = min(1.0, pred.ideal_iteration_ms / f.report.measured_iteration_ms)
        fig.add_trace(go.Scatter(x=[gbps], y=[100 * share], name="the run", mode="markers",
                                 marker=dict(symbol="diamond", size=13, color=RUN_COLOR),
                                 hovertemplate="run: %{x:.3g} GB/s achieved, %{y:.3g}% of ideal"),
                      secondary_y=False)


# --- stalls, bytes, tensors

def stalls_figure(f: RunFiles) -> Figure:
    panels = ("by cause", "most stalled tensors") if f.report is not None else ("predicted",)
    wide = dict(column_widths=[0.4, 0.6], horizontal_spacing=0.32) if f.report is not None else {}
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=panels, **wide)
    if f.report is not None:
        causes = f.report.stall_ms_by_cause or {"none": 0.0}
        fig.add_trace(go.Bar(x=list(causes), y=list(causes.values()), name="run", marker_color=RUN_COLOR,
                             hovertemplate="%{x}: %{y:.4g} ms"), row=1, col=1)
        top = f.report.top_stalled_tensors or {"none": 0.0}
        fig.add_trace(go.Bar(y=[_short(t, 32) for t in top], x=list(top.values()), orientation="h",
                             customdata=list(top), marker_color=BUDGET_COLOR, showlegend=False,
                             hovertemplate="%{customdata}: %{x:.4g} ms<extra></extra>"), row=1, col=2)
    if f.plan is not None:
        pred = f.plan.header.prediction
        runs = f.report.iterations_on_plan if f.report is not None else 1
        fig.add_trace(go.Bar(x=["predicted"], y=[pred.stall_ms * runs], name="plan's prediction",
                             marker_color=REPLAY_COLOR, hovertemplate=f"%{{y:.4g}} ms over {runs} planned iteration(s)"),
                      row=1, col=1)
    layout(fig, 380, yaxis_title="ms", margin=dict(l=60, r=30, t=80, b=50), legend=dict(orientation="h", y=1.2, x=0))
    whole = f"the whole run ({f.report.iterations} iterations)" if f.report is not None else "one iteration"
    caption = (f"Stall time over {whole}: kernels that waited for a tensor still coming back or for memory; "
               "the plan's predicted stall is scaled to the iterations that ran on plan.")
    return Figure("stalls", "Stalls", caption, fig, 380, wide=False)


def bytes_figure(f: RunFiles) -> Figure:
    series = []  # (name, colour, bytes by tier, bytes by kind)
    if f.plan is not None:
        series.append(("planned, per iteration", PLAN_COLOR, *_plan_bytes(f.plan)))
    if f.report is not None:
        its = max(f.report.iterations, 1)
        per = lambda d: {k: v / its for k, v in d.items()}  # noqa: E731
        series += [("run: out, mean per iteration", RUN_COLOR, per(_run_out_bytes(f.report)),
                    per(f.report.offloaded_bytes_by_kind)),
                   ("run: back, mean per iteration", "#FFBB78", per(f.report.prefetched_bytes), {})]
    scale, unit = byte_unit(max((v for s in series for d in s[2:] for v in d.values()), default=0))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("by tier", "by kind of tensor"))
    for name, color, by_tier, by_kind in series:
        _grouped(fig, name, color, by_tier, 1, scale)
        _grouped(fig, name, color, {KIND_LABELS.get(k, k): v for k, v in by_kind.items()}, 2, scale)
    layout(fig, 380, barmode="group", yaxis_title=unit, margin=dict(l=60, r=30, t=80, b=80),
           legend=dict(orientation="h", y=1.2, x=0))
    return Figure("bytes", "Bytes moved", "Bytes leaving the device per iteration, by tier and by kind: the "
                  "plan's, and the run's mean over all its iterations. Of those, the bytes that left without a "
                  "copy (the host pool held a current one: clean) did not cross the link.", fig, 380, wide=False)


CLEAN = "of which clean (no copy)"


def _plan_bytes(plan) -> tuple[dict, dict]:
    by_tier, by_kind = {"ssd": 0, "host": 0, CLEAN: 0}, {}
    for e in plan.entries:
        by_tier[e.tier] = by_tier.get(e.tier, 0) + e.nbytes   # "recompute" only where a plan has it
        by_tier[CLEAN] += e.nbytes if e.clean else 0
        by_kind[e.kind] = by_kind.get(e.kind, 0) + e.nbytes
    return by_tier, by_kind


def _run_out_bytes(report) -> dict:
    """Released per tier, and of it what left without a copy (reports without written_bytes: nothing known)."""
    out = dict(report.offloaded_bytes)
    if report.written_bytes:
        out[CLEAN] = sum(n - report.written_bytes.get(tier, n) for tier, n in report.offloaded_bytes.items())
    return out


def _grouped(fig, name: str, color: str, values: dict, col: int, scale: float) -> None:
    if not values:
        return
    fig.add_trace(go.Bar(x=list(values), y=[v / scale for v in values.values()], name=name, marker_color=color,
                         customdata=[format_bytes(v) for v in values.values()], legendgroup=name,
                         showlegend=col == 1, hovertemplate="%{x}: %{customdata}"), row=1, col=col)


def largest_figure(f: RunFiles, count: int = 20) -> Figure:
    rows = largest_tensors(f.trace, count)[::-1]  # largest on top
    planned = _planned_tiers(f.plan) if f.plan is not None else {}
    notes = [f"{r['name']}<br>{r['kind']}, {format_bytes(r['nbytes'])}, shape {r['shape']}, {r['uses']} uses"
             f"<br>{planned.get(r['name'], 'not moved by the plan' if f.plan is not None else '')}" for r in rows]
    scale, unit = byte_unit(max((r["nbytes"] for r in rows), default=0))
    fig = go.Figure(go.Bar(
        y=[_short(r["name"]) for r in rows], x=[r["nbytes"] / scale for r in rows], orientation="h",
        marker_color=[KIND_COLORS.get(r["kind"], "#999999") for r in rows], customdata=notes,
        hovertemplate="%{customdata}<extra></extra>"))
    layout(fig, 30 + 22 * max(len(rows), 4), xaxis_title=unit, margin=dict(l=260, r=20, t=20, b=50))
    caption = "The trace's largest storages, coloured by kind; hover for shape, uses and what the plan does with each."
    return Figure("largest", f"Largest {len(rows)} tensors", caption, fig, 30 + 22 * max(len(rows), 4))


def _planned_tiers(plan) -> dict[str, str]:
    periods: dict[str, list[str]] = {}
    for e in plan.entries:
        periods.setdefault(e.name, []).append(e.tier)
    return {name: f"planned away {len(tiers)}x: " + ", ".join(sorted(set(tiers))) for name, tiers in periods.items()}


def _short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


def plan_facts(f: RunFiles) -> list[tuple[str, str]]:
    """The headline numbers above the pictures."""
    h = f.trace.header
    facts = [("trace", f"{f.trace.num_kernels} kernels, {f.trace.num_tensors} tensors, {h.device.name}, "
                       f"iteration {format_ms(h.iteration_ms)}")]
    if f.plan is not None:
        p, i = f.plan.header.prediction, f.plan.header.inputs
        facts += [("plan", f"{len(f.plan.entries)} entries; budget {format_bytes(i.budget_bytes)}, predicted peak "
                           f"{format_bytes(p.peak_bytes)} ({'fits' if p.fits else 'does not fit'})"),
                  ("predicted", f"{format_ms(p.iteration_ms)} per iteration vs {format_ms(p.ideal_iteration_ms)} "
                                f"ideal ({p.share_of_ideal:.1%}), stalls {format_ms(p.stall_ms)}")]
    if f.report is not None:
        r = f.report
        facts.append(("run", f"{r.iterations} iterations ({r.iterations_on_plan} on plan), "
                             f"{format_ms(r.measured_iteration_ms)} per iteration, peak "
                             f"{format_bytes(r.peak_device_bytes)} of {format_bytes(r.budget_bytes)}, "
                             f"{r.stall_count} stalls ({format_ms(r.stall_ms)}), I/O {r.io_backend}"))
    return facts
