"""How a job under the runtime stops: errors after which training cannot go on exactly, said as
one line at the job's top level, and signals that end it through its exit handlers.

A swap file that could not be read back (engine.SwapDataLost) or a replay that would not make
the bytes it replaces (replay.ReplayMismatch) stops the job: the op that needs the tensor
raises, possibly in an autograd thread, and the error reaches the script's top level like any
of the job's. There the hook installed when the first one is raised prints its one line instead
of a traceback through the job's, PyTorch's and our frames (ours say nothing the line does
not), also when the script wrapped it in an error of its own (Note [Lost swap files] in
teraio_run/engine.py).
"""

import signal
import sys
import threading

from teraio.errors import TeraioError


class CannotGoOnExactly(TeraioError):
    """The job's bytes are gone or would be wrong: training stops, in one line."""


def stop(err: CannotGoOnExactly) -> CannotGoOnExactly:
    """The error to raise, with the one-line hook installed first."""
    install_one_line_errors()
    return err


def install_one_line_errors() -> None:
    if getattr(sys.excepthook, "teraio_one_line", False):
        return
    previous, previous_thread = sys.excepthook, threading.excepthook

    def hook(kind, err, tb):
        found = _stop_in_chain(err)
        if found is None:
            return previous(kind, err, tb)
        print(f"teraio: error: {found}", file=sys.stderr)

    def thread_hook(args):
        found = _stop_in_chain(args.exc_value)
        if found is None:
            return previous_thread(args)
        print(f"teraio: error: {found}", file=sys.stderr)

    hook.teraio_one_line = True
    sys.excepthook, threading.excepthook = hook, thread_hook


def _stop_in_chain(err: BaseException | None) -> CannotGoOnExactly | None:
    """The CannotGoOnExactly behind an error, also one the script wrapped in its own."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, CannotGoOnExactly):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def exit_cleanly_on(*signums: int) -> None:
    """SIGTERM and SIGHUP kill a process without running atexit, so the report would be lost and
    the swap folders left behind (by `teraio run`, and by a profile under a cap): turn them into
    SystemExit(128 + N), the status a shell shows for a death by signal N. SIGINT already raises
    KeyboardInterrupt, which unwinds the same way. A handler the script set (or SIG_IGN, as
    nohup sets for SIGHUP) is left alone, and so is one it sets later that calls ours in turn
    (PyTorch Lightning chains the handler it finds to its own, which stops training
    gracefully): in the plain run it found none to call."""
    def exit_by_signal(number, frame):
        if signal.getsignal(number) is exit_by_signal:
            sys.exit(128 + number)

    for signum in signums:
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, exit_by_signal)
