"""The page: Plotly's offline bundle once, the figures as gzip+base64 JSON, a few lines of script.

Note [One file, offline]
    The report must open from a mail attachment or a CI artifact with no network: no CDN,
    no second file. Plotly's bundle (plotly.offline.get_plotlyjs, ~4.8 MB) is inlined once;
    the figures' JSON (numpy arrays already packed as base64 typed arrays by plotly.io) is
    gzipped and base64'd into a script tag, and the browser's DecompressionStream inflates
    it. gzip with mtime 0 keeps the same inputs giving the same bytes.
"""

import base64
import gzip
import html
from pathlib import Path

from teraio.errors import TeraioError
from teraio_view.inputs import RunFiles, TwoPlans, load_inputs
from teraio_view.style import Figure

SWEEP_AUTO_MAX_KERNELS = 50_000  # the sweep plans the trace 7 times: seconds here, minutes at 250k kernels
PLOTLY_MISSING = "teraio view draws with plotly, which is not installed: pip install 'teraio[view]'"


def _plotly():
    try:
        import plotly.io
        import plotly.offline
    except ImportError:
        raise TeraioError(PLOTLY_MISSING) from None
    return plotly


def render_view(paths: list[Path], sweep: bool | None = None) -> str:
    """The whole HTML page for these files. sweep: draw the bandwidth sweep (None: when the trace
    has at most SWEEP_AUTO_MAX_KERNELS kernels)."""
    plotly = _plotly()
    files = load_inputs([Path(p) for p in paths])
    if isinstance(files, TwoPlans):
        figures, title, facts = _two_plans(files)
    else:
        figures, title, facts = _run_files(files, sweep)
    return page_html(title, facts, figures, plotly)


def _run_files(files: RunFiles, sweep: bool | None):
    from teraio_view.figures import plan_facts, run_figures

    if sweep is None:
        sweep = files.trace.num_kernels <= SWEEP_AUTO_MAX_KERNELS
    points = None
    if sweep and files.plan is not None:
        from teraio_plan import sweep as sweep_bandwidths

        points = sweep_bandwidths(files.trace, files.plan.header.inputs)
    names = [p for p in (files.trace_path, files.plan_path, files.report_path) if p is not None]
    facts = plan_facts(files)
    if files.plan is not None and points is None:
        facts.append(("sweep", "not drawn: pass --sweep (it plans the trace 7 times)"))
    return run_figures(files, points), " + ".join(p.name for p in names), facts


def _two_plans(p: TwoPlans):
    from teraio_view.diff_figures import diff_figures

    figures, d = diff_figures(p)
    facts = [("old", str(p.old_path)), ("new", str(p.new_path)),
             ("entries", f"+{len(d.added)} added, -{len(d.removed)} removed, ~{len(d.changed)} changed"
                         + ("" if d.same_trace else "; made from different traces"))]
    return figures, f"{p.old_path.name} → {p.new_path.name}", facts


def figures_payload(figures: list[Figure], plotly) -> str:
    """gzip+base64 of the figures' JSON list (Note [One file, offline])."""
    body = "[" + ",".join(plotly.io.to_json(f.figure, validate=False) for f in figures) + "]"
    return base64.b64encode(gzip.compress(body.encode(), compresslevel=9, mtime=0)).decode()


def page_html(title: str, facts: list[tuple[str, str]], figures: list[Figure], plotly) -> str:
    cards = "\n".join(_card(i, f) for i, f in enumerate(figures))
    rows = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return (TEMPLATE.replace("{{title}}", html.escape(title)).replace("{{facts}}", rows)
            .replace("{{cards}}", cards).replace("{{data}}", figures_payload(figures, plotly))
            .replace("{{plotly}}", plotly.offline.get_plotlyjs()))


def _card(i: int, f: Figure) -> str:
    cls = "card wide" if f.wide else "card"
    return (f'<section class="{cls}" id="{f.key}"><h2>{html.escape(f.title)}</h2>'
            f'<p>{html.escape(f.caption)}</p><div class="tio-figure" id="tio-fig-{i}" '
            f'style="height:{f.height_px}px"></div></section>')


# {{plotly}} is replaced last, so the other markers are never searched for inside 4.8 MB of script.
TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>TeraIO: {{title}}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 0; padding: 16px 24px; background: #F6F6F6; color: #222; }
h1 { font-size: 20px; margin: 0 0 8px; } h2 { font-size: 15px; margin: 0 0 4px; }
p { font-size: 12px; color: #555; margin: 0 0 6px; }
table.facts { font-size: 13px; border-collapse: collapse; margin-bottom: 12px; }
table.facts th { text-align: left; padding: 1px 12px 1px 0; color: #555; font-weight: 600; }
.grid { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 12px; }
.card { background: white; border-radius: 6px; padding: 10px 12px; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
.wide { grid-column: 1 / -1; }
#tio-status { color: #B00; }
</style>
<script>{{plotly}}</script>
</head><body>
<h1>TeraIO report: {{title}}</h1>
<table class="facts">{{facts}}</table>
<div id="tio-status">drawing…</div>
<div class="grid">
{{cards}}
</div>
<script id="tio-data" type="application/octet-stream">{{data}}</script>
<script>
(async function () {
  const status = document.getElementById("tio-status");
  try {
    const packed = document.getElementById("tio-data").textContent.trim();
    const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    const figures = JSON.parse(await new Response(stream).text());
    for (let i = 0; i < figures.length; i++) {
      await Plotly.newPlot("tio-fig-" + i, figures[i].data, figures[i].layout,
                           {responsive: true, displaylogo: false});
    }
    document.body.dataset.drawn = String(figures.length);
    status.remove();
  } catch (err) {
    status.textContent = "could not draw the figures: " + err;
    throw err;
  }
})();
</script>
</body></html>
"""
