"""Options shared by several subcommands, defined once."""

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
