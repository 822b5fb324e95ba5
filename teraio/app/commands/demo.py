"""teraio demo."""

import sys
from pathlib import Path

import click
from rich.console import Console

from teraio.app.commands.inspect import print_trace_summary
from teraio.units import format_ms

console = Console(highlight=False)


@click.command("demo", context_settings={"ignore_unknown_options": True})
@click.option("--workdir", default="teraio-demo", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the trace, plan, report and losses.")
@click.argument("example_args", nargs=-1, type=click.UNPROCESSED)
def command(workdir, example_args):
    """Profile, plan and run the bundled example on CPU, and check the losses bit for bit.

    \b
    The plan is made for half of the example's peak memory, so weights, gradients,
    optimizer state and activations all move out to swap files and a host pool and back.
    Extra arguments go to the example (python -m teraio.examples.train_gpt --help).
    \b
    Examples:
      teraio demo
      teraio demo --workdir /tmp/tio -- --layers 4 --steps 8
    """
    from teraio.app.commands.inspect import _print_plan
    from teraio.app.demo import run_demo

    result = run_demo(Path(workdir), list(example_args), lambda msg: console.print(f"[bold cyan]demo:[/] {msg}"))
    print_trace_summary(result.trace, console)
    _print_plan(result.plan, console, max_rows=8)
    if result.calibrated_ms is not None:
        console.print(f"predicted {format_ms(result.predicted_ms)} per iteration with default rates; with the "
                      f"rates and host time this run measured, {format_ms(result.calibrated_ms)}; measured "
                      f"{format_ms(result.measured_ms)} (teraio plan --calibrate {result.report} plans with them)",
                      soft_wrap=True)
    if result.identical:
        console.print(f"[bold green]losses identical[/] with and without the plan over "
                      f"{len(result.losses_plain)} steps; files in {result.workdir}/")
    else:
        console.print("[bold red]losses differ[/] between the plain and the planned run: please report this")
        sys.exit(1)
