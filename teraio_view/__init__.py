"""teraio_view: one self-contained HTML report of a trace, its plan and a run, or of two plans.

    render_view(paths, sweep=None) -> str      the whole page (Plotly's bundle and the data inside)

Reads the stage files through teraio.formats and draws what teraio_plan computes (memory
curves, the simulator's replay, the bandwidth sweep, the diff); it never imports torch,
teraio_run or teraio_profile, so a report can be made on any laptop.
"""

from teraio_view.page import render_view

__all__ = ["render_view"]
