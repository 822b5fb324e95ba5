"""The `teraio` command: a thin click shell over the stage libraries.

Each subcommand lives in teraio/app/commands/<name>.py, parses, calls one library function,
prints with rich, and lets TeraioError become one red line and an exit code here.
"""

import sys

import click
from rich.console import Console
from rich.markup import escape

from teraio import __version__
from teraio.errors import TeraioError

err_console = Console(stderr=True, highlight=False)


class TeraioGroup(click.Group):
    """Turns a TeraioError from any subcommand into one line and its exit code, and click's own
    usage errors too (a bad unit, a missing argument, a folder given for a file): click printed
    three lines, its usage, a hint and the error, where every other mistake is one."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False   # click's exceptions come here, not to its printer
        try:
            code = super().main(*args, **kwargs)   # without standalone mode, an Exit's code is returned
        except click.exceptions.NoArgsIsHelpError as err:   # `teraio` alone: the help, as click shows it
            click.echo(err.ctx.get_help(), err=True)
            sys.exit(err.exit_code)
        except click.UsageError as err:
            _say(f"{err.format_message()} (see {self._help_for(err.ctx)} --help)")
            sys.exit(err.exit_code)
        except click.ClickException as err:
            _say(err.format_message())
            sys.exit(err.exit_code)
        except click.Abort:   # Ctrl-C or end of input at one of click's prompts
            _say("interrupted")
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)

    def _help_for(self, ctx) -> str:
        """The command whose --help answers a usage error: an option's missing value is found
        before the subcommand's context exists, so its name is read from the arguments."""
        if ctx is not None and ctx.command is not self:
            return ctx.command_path
        given = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
        return f"teraio {given}" if given in self.commands else "teraio"

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TeraioError as err:
            _say(str(err))
            sys.exit(err.exit_code)
        except KeyboardInterrupt:
            _say("interrupted")
            sys.exit(130)


def _say(message: str) -> None:
    err_console.print(f"[bold red]teraio:[/] {escape(message)}", soft_wrap=True)  # "[view]" is no markup


@click.group(cls=TeraioGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="teraio")
def cli():
    """Train PyTorch models bigger than the GPU.

    \b
    Three stages, two files:
      teraio profile train.py           -> trace.msgpack
      teraio plan trace.msgpack --ssds 8 -> plan.json
      teraio run --plan plan.json -- python train.py
    \b
    `teraio demo` runs all three on the bundled example; `teraio inspect FILE` reads any
    file they write.
    """


def _register() -> None:
    from teraio.app.commands import demo, diff, inspect, plan, profile, run, view

    for module in (profile, plan, diff, run, inspect, view, demo):
        cli.add_command(module.command)


_register()


def main() -> None:
    cli(prog_name="teraio")
