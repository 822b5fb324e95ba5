"""Starting the runtime in a training process and tearing it down at its exit (the bootstrap's
entry point: teraio/app/bootstrap/__init__.py). Building it is teraio_run/setup.py's; the report
at exit is teraio_run/report.py's."""

import atexit
import signal
import sys

from teraio.settings import Settings
from teraio.units import format_bytes
from teraio.walk import activate
from teraio_run.agent import RunAgent
from teraio_run.report import finish
from teraio_run.setup import RunContext, build_agent, plan_for_rank
from teraio_run.stops import exit_cleanly_on


def start(settings: Settings) -> RunAgent:
    """Called by the bootstrap at the job's first op on the plan's device (Note [Lazy start])."""
    plan, plan_path = plan_for_rank(settings)
    # A plan that moves nothing still gets the walk and the budget keeper: the trace fitted the
    # budget, but this job may not (larger tensors than profiled, another model run under the
    # plan), and only the keeper holds it to the budget then.
    agent, context = build_agent(settings, plan, plan_path)
    activate(agent.walk)
    install_exit_handlers(agent, context)
    pinned = f" (pinned in {context.pool_pin_s:.1f} s)" if agent.cuda and context.pool_bytes else ""
    follows = (f"follows {plan_path.name} ({len(plan.entries)} entries)" if plan.entries else
               f"keeps the budget of {plan_path.name}, which moves nothing (the traced job fitted it)")
    print(f"teraio: rank {settings.rank} {follows} on "
          f"{agent.device_name}, budget {format_bytes(agent.budget_bytes)}, host pool "
          f"{format_bytes(context.pool_bytes)}{pinned}, swap I/O {context.io_backend} in {len(context.run_dirs)} folder(s)",
          file=sys.stderr)
    return agent


def install_exit_handlers(agent, context: RunContext) -> None:
    """Report and clean up at exit, Ctrl-C included; checkpoints see true values."""
    # Imported now, not at exit: CPython 3.11 forgets that a KeyboardInterrupt ended the script
    # once any eval()/exec() of a string runs (a namedtuple or dataclass made by a module
    # imported at exit), and exits 1 instead of dying by SIGINT (130). Measured: rich's imports
    # at exit turned a Ctrl-C'd job's 130 into 1.
    import teraio.views  # noqa: F401

    atexit.register(finish, agent, context)
    exit_cleanly_on(signal.SIGTERM, signal.SIGHUP)
