"""teraio view: one offline HTML page of a trace, its plan and a run, drawn in a real browser.

The example is profiled, planned and run through the real CLI on CPU, its report is opened
in headless Chromium (Debian's `chromium`, which .ci/run installs), and every figure must
draw with nothing on the console. Where no Chromium exists those tests skip and say why.
"""

import base64
import gzip
import json
import re
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import pytest

from cli_helpers import CPU_ENV, EXAMPLE, PYTHON, ROOT, ok, one_line_error, teraio
from teraio.formats.trace import live_bytes_per_kernel, load_trace

pytest.importorskip("plotly", reason="teraio view needs plotly: pip install 'teraio[view]'")

from teraio_view.browser import find_chromium, render  # noqa: E402
from teraio_view.curves import extreme_kernels  # noqa: E402

ARGS = ("--device", "cpu", "--steps", "5", "--layers", "1")
TINY_TRACE = ROOT / "traces" / "cpu-tiny.msgpack"
needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="no Chromium here: apt-get install chromium "
                                    "(.ci/run does) to check that the report draws")


@pytest.fixture(scope="module")
def example_files(tmp_path_factory):
    """The bundled example's trace, a plan for half its peak over both tiers, and a run of it."""
    tmp = tmp_path_factory.mktemp("view")
    ok(teraio("profile", "-o", tmp / "trace.msgpack", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp))
    trace = load_trace(tmp / "trace.msgpack")
    peak = int(live_bytes_per_kernel(trace).max()) + trace.header.untracked_bytes
    ok(teraio("plan", tmp / "trace.msgpack", "-o", tmp / "plan.json", "--gpu-mem", peak // 2, "--ssds", 1,
              "--host-mem", peak // 4, cwd=tmp))
    ok(teraio("run", "--plan", tmp / "plan.json", "--ssd-dir", tmp / "ssd", "--report", tmp / "run.json", "--",
              PYTHON, EXAMPLE, *ARGS, cwd=tmp))
    return tmp


class FigureScan(HTMLParser):
    """Per figure div: how many Plotly SVGs it holds and how many drawn marks (non-empty paths,
    table cells) sit inside its traces."""

    def __init__(self):
        super().__init__()
        self.stack: list[tuple[str, str | None, bool]] = []  # (tag, figure id, inside a trace)
        self.svgs: dict[str, int] = {}
        self.marks: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        fig, in_trace = self.stack[-1][1:] if self.stack else (None, False)
        if tag == "div" and (a.get("id") or "").startswith("tio-fig-"):
            fig = a["id"]
            self.svgs.setdefault(fig, 0)
            self.marks.setdefault(fig, 0)
        cls = a.get("class") or ""
        in_trace = in_trace or bool(re.search(r"\btrace\b|\btable\b", cls))
        if fig and tag == "svg" and "main-svg" in cls:
            self.svgs[fig] += 1
        if fig and in_trace and tag == "path" and len(a.get("d") or "") > 4:
            self.marks[fig] += 1
        if fig and in_trace and tag == "text" and "cell-text" in cls:
            self.marks[fig] += 1
        if tag not in ("br", "hr", "img", "input", "meta", "link"):  # HTML's void elements never close
            self.stack.append((tag, fig, in_trace))

    def handle_endtag(self, tag):
        if any(t == tag for t, _, _ in self.stack):
            while self.stack.pop()[0] != tag:
                pass


def drawn_in_chromium(html_path) -> dict[str, int]:
    """Marks drawn per figure; fails on any console message or error."""
    page = render(html_path)
    assert page.console == [], page.console
    scan = FigureScan()
    scan.feed(page.dom)
    assert scan.svgs and all(n > 0 for n in scan.svgs.values()), scan.svgs
    return scan.marks


def sections(html: str) -> list[str]:
    return re.findall(r'<section class="card[^"]*" id="([^"]+)"', html)


def payload(html: str) -> list[dict]:
    packed = re.search(r'<script id="tio-data" type="application/octet-stream">([^<]*)</script>', html).group(1)
    return json.loads(gzip.decompress(base64.b64decode(packed)))


@needs_chromium
def test_the_examples_report_draws_every_figure_in_chromium(example_files):
    out = example_files / "report.html"
    ok(teraio("view", "trace.msgpack", "plan.json", "run.json", "-o", out, cwd=example_files))
    html = out.read_text()
    assert sections(html) == ["memory", "timeline", "iterations", "idle", "sweep", "stalls", "bytes", "largest"]
    # offline: nothing fetched from anywhere, Plotly's bundle inside exactly once
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=", html)
    assert html.count("* plotly.js v") == 1 and html.count('<script id="tio-data"') == 1
    marks = drawn_in_chromium(out)
    assert len(marks) == 8 and all(n > 0 for n in marks.values()), marks
    # the bytes that left without a copy, planned and run, beside the tiers
    bars = [t for fig in payload(html) for t in fig.get("data", []) if t.get("type") == "bar"]
    clean = [t["name"] for t in bars if "of which clean (no copy)" in (t.get("x") or [])]
    assert "planned, per iteration" in clean and "run: out, mean per iteration" in clean


@needs_chromium
def test_the_console_check_sees_an_error(tmp_path):
    # the guard of the test above: a page that errs must be caught, whatever this Chromium logs
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>console.error('boom'); null.x();</script></body></html>")
    said = render(page).console
    assert any("boom" in line for line in said) and any("Uncaught" in line for line in said), said


def test_two_plans_show_what_the_diff_says(tmp_path):
    for name, ssds in (("a.json", 1), ("b.json", 2)):
        ok(teraio("plan", TINY_TRACE, "-o", tmp_path / name, "--gpu-mem", "2MiB", "--ssds", ssds,
                  "--host-mem", "1MiB", cwd=tmp_path))
    diff = json.loads(ok(teraio("diff", "a.json", "b.json", "--json", cwd=tmp_path)).stdout)
    assert diff["added"] or diff["removed"] or diff["changed"]
    ok(teraio("view", "a.json", "b.json", "-o", "diff.html", cwd=tmp_path))
    html = (tmp_path / "diff.html").read_text()
    assert sections(html) == ["diff-summary", "diff-timeline", "diff-header"]
    counts = f"+{len(diff['added'])} added, -{len(diff['removed'])} removed, ~{len(diff['changed'])} changed"
    assert counts in html
    changed = payload(html)[0]["data"][-1]  # changed entries per field, as the diff counts them
    assert sum(changed["y"]) == sum(len(c["fields"]) for c in diff["changed"])
    if find_chromium() is not None:
        assert all(n > 0 for n in drawn_in_chromium(tmp_path / "diff.html").values())


def test_bad_input_is_one_line(tmp_path):
    ok(teraio("plan", TINY_TRACE, "-o", tmp_path / "plan.json", "--gpu-mem", "2MiB", "--ssds", 1, cwd=tmp_path))
    (tmp_path / "notes.txt").write_text("not a teraio file\n")
    cases = [(("missing.msgpack",), 3, "does not exist"),
             (("notes.txt",), 3, "not a TeraIO file"),
             (("plan.json",), 2, "no trace among"),
             ((TINY_TRACE, TINY_TRACE), 2, "are both teraio-trace files")]
    for args, code, says in cases:
        line = one_line_error(teraio("view", *args, "-o", "out.html", cwd=tmp_path), code)
        assert says in line, line
    assert not (tmp_path / "out.html").exists()


def test_without_plotly_it_says_what_to_install(tmp_path):
    # a real process in which `import plotly` fails, as it does where the extra is not installed
    code = "import sys; sys.modules['plotly'] = None; from teraio.app.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "view", str(TINY_TRACE)], cwd=tmp_path, capture_output=True,
                          text=True, env={**__import__("os").environ, **CPU_ENV})
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].endswith("pip install 'teraio[view]'"), proc.stderr


def test_thinned_curves_keep_every_peak_exact():
    rng = np.random.default_rng(0)
    curve = np.cumsum(rng.integers(-1000, 1000, 250_000))
    picks = extreme_kernels(curve)
    assert len(picks) <= 4000 and np.all(np.diff(picks) > 0)
    assert curve[picks].max() == curve.max() and curve.argmax() in picks
    assert curve[picks].min() == curve.min()
    buckets = np.array_split(curve, 2000)  # each bucket's own highest point is among the picks
    assert set(int(b.max()) for b in buckets) <= set(curve[picks].tolist())


def test_the_view_imports_no_runtime_and_no_profiler():
    from test_layers import imported_modules

    files = sorted((ROOT / "teraio_view").rglob("*.py"))
    bad = [f"{f.name}:{line} {m}" for f in files for line, m in imported_modules(f)
           if m.split(".")[0] in ("teraio_run", "teraio_profile", "torch") or m.startswith("teraio.app")]
    assert files and bad == []
