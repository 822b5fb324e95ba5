"""Colours, units and the figure record shared by every picture."""

from dataclasses import dataclass
from typing import Any

KIND_COLORS = {
    "parameter": "#4C78A8", "gradient": "#F58518", "optimizer_state": "#54A24B",
    "activation": "#E45756", "other": "#9D9D9D", "untracked": "#D3D3D3",
}
KIND_LABELS = {"optimizer_state": "optimizer state", "parameter": "parameters", "gradient": "gradients",
               "activation": "activations", "other": "other", "untracked": "untracked (allocator, workspace)"}
TIER_COLORS = {"ssd": "#7B3FBF", "host": "#1F9E89", "recompute": "#E69F00"}
PLAN_COLOR, REPLAY_COLOR, BUDGET_COLOR, RUN_COLOR = "#222222", "#0072B2", "#D62728", "#FF7F0E"
ADDED, REMOVED, CHANGED, UNCHANGED = "#2CA02C", "#D62728", "#FF7F0E", "#BBBBBB"

BASE_LAYOUT = dict(
    template="plotly_white", margin=dict(l=60, r=20, t=30, b=50), font=dict(size=12),
    legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0),
    modebar=dict(orientation="v"),  # down the right edge, clear of the legend above the plot
)


@dataclass
class Figure:
    """One picture of the page: a heading, a sentence on how to read it, and the Plotly figure."""

    key: str
    title: str
    caption: str
    figure: Any          # plotly.graph_objects.Figure
    height_px: int = 420
    wide: bool = True    # full width; narrow figures go two to a row


def byte_unit(max_bytes: float) -> tuple[float, str]:
    """The largest binary unit in which max_bytes is at least 1, for axis labels."""
    for scale, label in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= scale:
            return float(scale), label
    return 1.0, "bytes"


def layout(fig, height_px: int, **extra) -> None:
    fig.update_layout(**{**BASE_LAYOUT, "height": height_px, **extra})
