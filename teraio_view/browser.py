"""Headless Chromium for the report: its DOM after the scripts ran, its console, a screenshot.

For the tests (does every figure draw, with no console error?) and for the screenshots in
docs/. Chromium logs every console message and uncaught exception to stderr with
`--enable-logging=stderr --v=0` as `...:CONSOLE:<line>] "<text>", source: <url>` (older
builds: `CONSOLE(<line>)`); the page itself logs nothing, so any such line is a failure.

    python -m teraio_view.browser report.html shot.png [WIDTH HEIGHT]
"""

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from teraio.errors import TeraioError

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CONSOLE_LINE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)")
# Headless in a container: no GPU, no sandbox (we run as root in CI), no first-run chores.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--hide-scrollbars", "--mute-audio")
BUDGET_MS = 20_000  # virtual time the page gets to inflate its data and draw


@dataclass
class Rendered:
    dom: str
    console: list[str]   # every console message and uncaught error, as Chromium logged it


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, BINARIES) if path), None)


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    binary = find_chromium()
    if binary is None:
        raise TeraioError("no Chromium found: install it (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="teraio-chromium-") as profile:
        return subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout_s)


def render(html_path: Path, timeout_s: float = 120) -> Rendered:
    """The page's DOM once its scripts ran, and what it said on the console."""
    url = Path(html_path).resolve().as_uri()
    done = _run(["--enable-logging=stderr", "--v=0", f"--virtual-time-budget={BUDGET_MS}",
                 "--window-size=1400,1000", "--dump-dom", url], timeout_s)
    if done.returncode != 0 or "<html" not in done.stdout:
        raise TeraioError(f"Chromium could not render {html_path} (exit {done.returncode}): "
                          + done.stderr.strip()[-300:])
    return Rendered(done.stdout, [m.group(1) for m in CONSOLE_LINE.finditer(done.stderr)])


def screenshot(html_path: Path, png_path: Path, width_px: int = 1400, height_px: int = 2600,
               timeout_s: float = 120) -> None:
    url = Path(html_path).resolve().as_uri()
    _run([f"--virtual-time-budget={BUDGET_MS}", f"--window-size={width_px},{height_px}",
          f"--screenshot={Path(png_path).resolve()}", url], timeout_s)
    if not Path(png_path).exists():
        raise TeraioError(f"Chromium wrote no screenshot of {html_path}")
    _shrink(Path(png_path))


def _shrink(png_path: Path) -> None:
    """256 colours: a screenshot of flat plots loses nothing visible and a third of its bytes."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png_path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(png_path, optimize=True)


if __name__ == "__main__":
    sizes = [int(v) for v in sys.argv[3:5]]
    screenshot(Path(sys.argv[1]), Path(sys.argv[2]), *sizes)
