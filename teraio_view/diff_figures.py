"""The pictures of two plans: what `teraio diff` says, drawn (teraio_plan.diff computes it)."""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from teraio.units import format_bytes
from teraio_plan.diff import COMPARED_FIELDS, PlanDiff, diff_plans
from teraio_view.inputs import TwoPlans
from teraio_view.style import ADDED, CHANGED, REMOVED, TIER_COLORS, UNCHANGED, Figure, byte_unit, layout
from teraio_view.timeline import MAX_BARS, entry_bars

PREDICTION_SHOWN = ("iteration_ms", "share_of_ideal", "stall_ms", "peak_bytes", "fits", "host_pool_bytes",
                    "ssd_write_bytes_per_iteration")


def diff_figures(p: TwoPlans) -> tuple[list[Figure], PlanDiff]:
    d = diff_plans(p.old, p.new)
    figures = [summary_figure(d), header_figure(p, d)]
    if d.added or d.removed or d.changed:
        figures.insert(1, diff_timeline(d, p.new.header.trace.num_kernels))
    return figures, d


def summary_figure(d: PlanDiff) -> Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bytes per iteration, by tier", "changed entries: what changed"))
    groups = {"added": d.added, "removed": d.removed, "changed": [c.new for c in d.changed]}
    scale, unit = byte_unit(max((sum(e.nbytes for e in g) for g in groups.values()), default=0))
    for tier in TIER_COLORS:
        sums = {name: [e for e in g if e.tier == tier] for name, g in groups.items()}
        fig.add_trace(go.Bar(x=list(sums), y=[sum(e.nbytes for e in es) / scale for es in sums.values()],
                             name=f"{tier} (new tier)", marker_color=TIER_COLORS[tier],
                             customdata=[f"{len(es)} entries, {format_bytes(sum(e.nbytes for e in es))}"
                                         for es in sums.values()],
                             hovertemplate="%{x}: %{customdata}"), row=1, col=1)
    counts = {f: sum(1 for c in d.changed if f in c.fields) for f in COMPARED_FIELDS}
    fig.add_trace(go.Bar(x=list(counts), y=list(counts.values()), marker_color=CHANGED, showlegend=False,
                         hovertemplate="%{x}: %{y} entries"), row=1, col=2)
    layout(fig, 380, barmode="stack")
    fig.update_yaxes(title_text=unit, row=1, col=1)
    fig.update_yaxes(title_text="entries", row=1, col=2)
    caption = (f"+{len(d.added)} added, -{len(d.removed)} removed, ~{len(d.changed)} changed entries (an entry is "
               "one idle period of one tensor, keyed by tensor and the kernel it leaves after).")
    return Figure("diff-summary", "What moved between the plans", caption, fig, 380)


def diff_timeline(d: PlanDiff, num_kernels: int) -> Figure:
    rows = ([("removed", e, None) for e in d.removed] + [("added", e, None) for e in d.added]
            + [("changed", c.new, c.old) for c in d.changed])
    rows.sort(key=lambda r: (r[1].offload_after, r[1].tensor))
    shown = rows[:MAX_BARS]
    fig = go.Figure()
    olds = [(i, old) for i, (_, _, old) in enumerate(shown) if old is not None]
    if olds:
        fig.add_trace(_bar_trace("changed: old timing", UNCHANGED, [entry_bars(e, i, num_kernels) for i, e in olds], 0.9))
    for what, color in (("removed", REMOVED), ("added", ADDED), ("changed", CHANGED)):
        bars = [entry_bars(e, i, num_kernels) for i, (w, e, _) in enumerate(shown) if w == what]
        if bars:
            fig.add_trace(_bar_trace(what if what != "changed" else "changed: new timing", color, bars, 0.45))
    height = min(900, max(300, 60 + 6 * len(shown)))
    layout(fig, height, barmode="overlay", xaxis=dict(title="kernel of one iteration", range=[0, num_kernels]),
           yaxis=dict(autorange="reversed", showticklabels=False, title="entry"))
    of = f"the first {len(shown)} of {len(rows)}" if len(shown) < len(rows) else f"all {len(rows)}"
    caption = (f"{of} entries that differ, by the kernel they leave after: each bar runs from offload to "
               "prefetch; a changed entry shows its old timing in grey behind the new one.")
    return Figure("diff-timeline", "Entries that differ, on the iteration", caption, fig, height)


def _bar_trace(name: str, color: str, bars: list[list[tuple]], width: float) -> go.Bar:
    start, length, row, hover = zip(*(b for pair in bars for b in pair))
    return go.Bar(base=list(start), x=list(length), y=list(row), orientation="h", name=name, width=width,
                  marker=dict(color=color, line=dict(width=0)), customdata=list(hover),
                  hovertemplate="%{customdata}<extra></extra>")


def header_figure(p: TwoPlans, d: PlanDiff) -> Figure:
    rows = [(f"inputs.{k}", *v) for k, v in d.inputs.items()]
    rows += [(f"prediction.{k}", getattr(p.old.header.prediction, k), getattr(p.new.header.prediction, k))
             for k in PREDICTION_SHOWN]
    fields, old, new = zip(*[(name, _show(name, a), _show(name, b)) for name, a, b in rows])
    changed = ["#FFF3E0" if a != b else "white" for a, b in zip(old, new)]
    fig = go.Figure(go.Table(
        header=dict(values=["field", str(p.old_path), str(p.new_path)], fill_color="#EEEEEE", align="left"),
        cells=dict(values=[list(fields), list(old), list(new)], fill_color=[changed] * 3, align="left")))
    height = 80 + 28 * len(rows)
    layout(fig, height, margin=dict(l=10, r=10, t=10, b=10))
    note = "" if d.same_trace else " The plans were made from different traces: kernel numbers may not line up."
    return Figure("diff-header", "Inputs and prediction", "The planner inputs that differ and the two "
                  "predictions (changed rows shaded)." + note, fig, height)


def _show(name: str, value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int) and name.endswith("bytes"):
        return format_bytes(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
