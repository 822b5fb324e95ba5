"""`teraio diff A B`: what changed between two plans, as a review table."""

import json

import click
from rich.console import Console
from rich.table import Table

from teraio.app.commands.options import json_flag
from teraio.formats.plan import PlanEntry, load_plan
from teraio.units import format_bytes
from teraio.views import tier_label
from teraio_plan import diff_plans
from teraio_plan.diff import PlanDiff

console = Console(highlight=False)


@click.command("diff")
@click.argument("old", type=click.Path())
@click.argument("new", type=click.Path())
@json_flag
def command(old, new, as_json):
    """Show entries added, removed and changed from plan OLD to plan NEW, and the new prediction."""
    result = diff_plans(load_plan(old), load_plan(new))
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, sort_keys=True))
        return
    _print_diff(result, old, new)


def _timing(e: PlanEntry) -> str:
    return f"{e.offload_after}->{e.offload_by} .. {e.prefetch_at}->{e.needed_by}" + (" (wraps)" if e.wraps else "")


def _print_diff(d: PlanDiff, old: str, new: str) -> None:
    if not d.same_trace:
        console.print("[yellow]the plans were made from different traces: kernel numbers may not line up[/]",
                      soft_wrap=True)
    if d.unchanged:
        console.print(f"{old} and {new} plan the same", soft_wrap=True)
        return
    table = Table(title=f"{old} -> {new}: +{len(d.added)} -{len(d.removed)} ~{len(d.changed)}", title_justify="left")
    for col in ("", "tensor", "size", "tier", "off after->by .. pre at->needed"):
        table.add_column(col)
    for e in d.removed:
        table.add_row("[red]-[/]", e.tensor, format_bytes(e.nbytes), tier_label(e), _timing(e))
    for e in d.added:
        table.add_row("[green]+[/]", e.tensor, format_bytes(e.nbytes), tier_label(e), _timing(e))
    for c in d.changed:
        old_tier, new_tier = tier_label(c.old), tier_label(c.new)
        tier = new_tier if old_tier == new_tier else f"{old_tier}->{new_tier}"
        table.add_row("[yellow]~[/]", c.new.tensor, format_bytes(c.new.nbytes), tier,
                      f"{_timing(c.old)}  =>  {_timing(c.new)}")
    console.print(table)
    _print_changes("inputs", d.inputs)
    _print_changes("prediction", d.prediction)


def _print_changes(title: str, changes: dict) -> None:
    if not changes:
        return
    table = Table(title=title, title_justify="left")
    for col in ("field", "old", "new"):
        table.add_column(col)
    for name, (a, b) in changes.items():
        old, new = _show(name, a), _show(name, b)
        if old == new:  # a change the rounding hides: the exact values
            old, new = str(a), str(b)
        table.add_row(name, old, new)
    console.print(table)


def _show(name: str, value) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and "_bytes" in f"{name}_":
        return format_bytes(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
