"""The transfer timeline: each plan entry a bar from its offload to its prefetch, packed in lanes.

Note [Timeline lanes]
    One row per tensor would make a 250k-kernel plan thousands of rows tall, so entries are
    packed: an entry that wraps around the iteration (a global tensor away over the boundary)
    is away at both ends and gets a lane of its own, at the top; the others are packed
    greedily by start (a lane takes the next entry that starts after its last one ended).
    Above MAX_BARS entries only the largest are drawn (the title says how many).
"""

import heapq

import plotly.graph_objects as go

from teraio.formats.plan import Plan, PlanEntry
from teraio.formats.report import RunReport
from teraio.units import format_bytes
from teraio_view.style import BUDGET_COLOR, TIER_COLORS, Figure, layout

MAX_BARS = 3000


def timeline_figure(plan: Plan, num_kernels: int, report: RunReport | None = None) -> Figure:
    shown = _largest(plan.entries)
    lanes = assign_lanes(shown, num_kernels)
    fig = go.Figure()
    for tier in TIER_COLORS:
        bars = [entry_bars(e, lane, num_kernels) for e, lane in zip(shown, lanes) if e.tier == tier]
        if bars:
            fig.add_trace(_tier_trace(tier, [b for pair in bars for b in pair]))
    if report is not None and report.top_stalled_tensors:
        _stall_marks(fig, shown, lanes, report.top_stalled_tensors)
    height = min(900, max(320, 60 + 4 * (max(lanes, default=0) + 1)))
    layout(fig, height, barmode="overlay", xaxis=dict(title="kernel of one iteration", range=[0, num_kernels]),
           yaxis=dict(title="lane", autorange="reversed", showticklabels=False))
    of = f"the {len(shown)} largest of {len(plan.entries)}" if len(shown) < len(plan.entries) else f"{len(shown)}"
    caption = (f"{of} plan entries, each a bar from the kernel after which the tensor leaves to the one before "
               "which it starts back, coloured by tier; entries that wrap around the iteration are the top lanes. "
               "Hover for the tensor; crosses mark the tensors the run stalled on most.")
    return Figure("timeline", "Transfer timeline", caption, fig, height)


def _largest(entries: list[PlanEntry]) -> list[PlanEntry]:
    if len(entries) <= MAX_BARS:
        return list(entries)
    keep = sorted(range(len(entries)), key=lambda i: (-entries[i].nbytes, i))[:MAX_BARS]
    return [entries[i] for i in sorted(keep)]


def assign_lanes(entries: list[PlanEntry], num_kernels: int) -> list[int]:
    """A lane per entry such that no two bars in a lane overlap (Note [Timeline lanes])."""
    lanes = [0] * len(entries)
    wrapping = [i for i, e in enumerate(entries) if e.wraps]
    for lane, i in enumerate(wrapping):
        lanes[i] = lane
    free: list[tuple[int, int]] = []  # (first kernel free, lane)
    next_lane = len(wrapping)
    inside = sorted((i for i, e in enumerate(entries) if not e.wraps), key=lambda i: entries[i].offload_after)
    for i in inside:
        start, end = entries[i].offload_after, entries[i].prefetch_at
        if free and free[0][0] <= start:
            _, lane = heapq.heappop(free)
        else:
            lane, next_lane = next_lane, next_lane + 1
        lanes[i] = lane
        heapq.heappush(free, (end + 1, lane))
    return lanes


def entry_bars(e: PlanEntry, lane: int, num_kernels: int) -> list[tuple]:
    """(start, length, lane, hover) of the entry's one bar, or two when it wraps around."""
    hover = (f"{e.name}<br>{e.kind}, {format_bytes(e.nbytes)} to {e.tier}<br>out after kernel {e.offload_after} "
             f"(freed by {e.offload_by}), back from {e.prefetch_at} for {e.needed_by}"
             + (", next iteration" if e.wraps else ""))
    if e.wraps:
        return [(e.offload_after, max(num_kernels - e.offload_after, 1), lane, hover),
                (0, max(e.prefetch_at, 1), lane, hover)]
    return [(e.offload_after, max(e.prefetch_at - e.offload_after, 1), lane, hover)]


def _tier_trace(tier: str, bars: list[tuple]) -> go.Bar:
    start, length, lane, hover = zip(*bars)
    return go.Bar(base=list(start), x=list(length), y=list(lane), orientation="h", name=f"to {tier}",
                  width=0.8, marker=dict(color=TIER_COLORS[tier], line=dict(width=0)), customdata=list(hover),
                  hovertemplate="%{customdata}<extra></extra>")


def _stall_marks(fig, entries: list[PlanEntry], lanes: list[int], stalled_ms: dict[str, float]) -> None:
    """Where the run waited for a planned tensor: its needed_by kernel, in its lane."""
    marks = [(e.needed_by, lane, f"{e.name}: the run stalled {stalled_ms[e.tensor]:.4g} ms on it")
             for e, lane in zip(entries, lanes) if e.tensor in stalled_ms]
    if marks:
        x, y, text = zip(*marks)
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="markers", name="stalled in the run",
                                 marker=dict(symbol="x", size=9, color=BUDGET_COLOR), customdata=list(text),
                                 hovertemplate="%{customdata}<extra></extra>"))
