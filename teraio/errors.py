"""One error family for everything a user can get wrong; the CLI maps each to an exit code.

Messages are one sentence that says what to do. Library code raises these and never prints
or exits; `assert` is kept for our own invariants. The one exception is `stop_job`, for the
agents inside the job's process under --strict (below).
"""

import sys


class TeraioError(Exception):
    """A user-facing failure. `exit_code` is what the CLI returns."""

    exit_code = 1


class UsageError(TeraioError):
    """Bad options or arguments."""

    exit_code = 2


class CommandNotFound(UsageError):
    """The command after -- is on no PATH: 127, the shell's status for it, so a wrapper script
    that checks for it sees the same as without teraio."""

    exit_code = 127


class FileFormatError(TeraioError):
    """A file that is missing, truncated, foreign, or of an unknown schema version."""

    exit_code = 3


class ScriptError(TeraioError):
    """The user's training script failed or never reached an iteration boundary."""

    exit_code = 4


class PlanError(TeraioError):
    """No plan can satisfy the request (e.g. a budget below what one kernel needs)."""

    exit_code = 5


class PlanMismatchError(TeraioError):
    """A plan that was made for a different trace than the job being run."""

    exit_code = 6


class JobStopped(TeraioError):
    """The launcher passed a stop signal on to the job; it exits with the job's own status."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def stop_job(error: TeraioError):
    """--strict, inside the job's process: say the error in one line and exit with its code.
    Raised as an exception, it would surface from inside the job's own calls (an optimizer
    step's hook, a torch.compile, the first op) with the job's whole stack printed above it;
    SystemExit unwinds the same way (atexit writes the report) but prints nothing, and no
    `except Exception` of the job's swallows it. (An error after which training cannot go on
    exactly, teraio_run/stops.py, stays an exception instead: the job's own handlers may save
    what they can, and a hook prints it in one line at the top.)"""
    print(f"teraio: error: {error}; stopping the job (--strict)", file=sys.stderr, flush=True)
    raise SystemExit(error.exit_code)
