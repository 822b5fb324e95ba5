"""`teraio view FILES -o report.html`: the trace, plan and run (or two plans) as one HTML page."""

from pathlib import Path

import click
from rich.console import Console

from teraio.errors import UsageError
from teraio.formats.common import atomic_write_bytes, refuse_overwriting_input
from teraio.units import format_bytes

console = Console(highlight=False)


@click.command("view")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default="teraio-report.html", show_default=True,
              help="HTML file to write; it opens offline, with everything inside.")
@click.option("--sweep/--no-sweep", default=None,
              help="Draw throughput against bandwidth (plans the trace 7 times). [default: for traces of up "
                   "to 50k kernels]")
def command(files, output, sweep):
    """Draw a trace, its plan and a run report (or two plans) as one self-contained HTML page.

    \b
    teraio view trace.msgpack plan.json run.json -o teraio-report.html
    teraio view trace.msgpack                     (the trace alone)
    teraio view old.plan.json new.plan.json       (what moved between two plans)
    """
    from teraio_view import render_view

    refuse_overwriting_input(output, files, "-o")
    if output.is_dir():
        raise UsageError(f"-o {output} is a folder: give a file name, e.g. {output / 'teraio-report.html'}")
    page = render_view(list(files), sweep=sweep).encode()
    atomic_write_bytes(output, page)
    console.print(f"wrote {output} ({format_bytes(len(page))}): open it in a browser, no network needed",
                  soft_wrap=True)
