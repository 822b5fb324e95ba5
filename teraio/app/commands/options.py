"""Options shared by several subcommands, defined once."""

import difflib

import click

from teraio.errors import UsageError
from teraio.units import parse_size


class SizeType(click.ParamType):
    """A size in bytes, written 40GiB / 40GB / 42949672960."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except UsageError as err:
            self.fail(str(err), param, ctx)


SIZE = SizeType()

json_flag = click.option("--json", "as_json", is_flag=True, help="Print one JSON object for scripts.")


def no_stray_option(ctx: click.Context, command: tuple[str, ...]) -> None:
    """The commands that run a job take unknown options as the job's own (`teraio profile
    train.py --lr 3e-4`), so a mistyped option of ours (`--ssd-dirr`) began the job's command
    and was reported as a command not found (exit 127). No command starts with a dash: say
    which option is unknown, as click does for the other subcommands."""
    if not command or not command[0].startswith("-"):
        return
    name = command[0].split("=", 1)[0]
    known = [opt for param in ctx.command.params for opt in getattr(param, "opts", ()) if opt.startswith("-")]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise UsageError(f"no such option: {name}{hint}; `teraio {ctx.info_name} --help` lists them, and the "
                     "training command goes after --")
