"""torch.compile under TeraIO: detected, said once per process, counted; an error with --strict.

Note [Compile under the walk]
TorchDynamo does not compile a frame while a TorchDispatchMode is on the dispatch stack
unless the mode says it ignores compile internals (torch/_dynamo/convert_frame.py,
ConvertFrame.__call__, skip reason "non-infra torch dispatch mode present, this is not
supported today in torch.compile"): such a mode was promised every ATen op that eager code
runs, and a fused kernel runs none of them. The walk must see every op (it numbers kernels
and moves their inputs in and out), so it keeps that promise, and Dynamo runs each compiled
region op by op, eager, and marks its frames skipped for good. The job then trains with
eager numerics and speed, not those of the user's compiled run without TeraIO: the user must
know. Running compiled code under a plan is a later step.
"""

import functools
import sys
import warnings

import torch

from teraio.errors import UsageError, stop_job

_compiled: list[str] = []      # what this process compiled, in order: "torch.compile(Net)"
_state = {"strict": False, "said": False, "inner": False}


# What PyTorch warns of because of TeraIO's own machinery, not the job's: the walk's global
# module hooks (they fire for the OptimizedModule too, in pairs: the walk's scopes stay whole),
# and Dynamo meeting the walk's own switch of the frame hook (Note [Dynamo off in the walk] in
# teraio/walk.py). Said once by us instead (_say_if_eager); the job's other warnings stay.
OUR_WARNINGS = (r"Using `torch\.compile\(module\)` when there are global hooks on modules",
                r"Dynamo does not know how to trace the builtin `torch\._C\._dynamo\.eval_frame\.set_eval_frame")


def install(strict: bool) -> None:
    """Wrap torch.compile and nn.Module.compile (they stay what they were, plus a note)."""
    _state["strict"] = strict
    torch.compile = _noting_compile(torch.compile)
    torch.nn.Module.compile = _noting_module_compile(torch.nn.Module.compile)
    for message in OUR_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)


def count() -> int:
    """torch.compile and Module.compile calls in this process (the run report counts them)."""
    return len(_compiled)


def walk_started() -> None:
    """The bootstrap calls this once an agent's walk is active in this process."""
    _say_if_eager()


def _noting_compile(real):
    @functools.wraps(real)
    def compile(model=None, *args, **kwargs):
        if model is None:  # @torch.compile(mode=...): the decorator it returns compiles
            decorator = real(*args, **kwargs)
            return lambda fn: _note(f"torch.compile({_name(fn)})") or decorator(fn)
        if not _state["inner"]:
            _note(f"torch.compile({_name(model)})")
        return real(model, *args, **kwargs)

    return compile


def _noting_module_compile(real):
    @functools.wraps(real)
    def compile(self, *args, **kwargs):
        _note(f"{type(self).__name__}.compile()")
        _state["inner"] = True  # it calls torch.compile(self._call_impl): one region, said once
        try:
            return real(self, *args, **kwargs)
        finally:
            _state["inner"] = False

    return compile


def _name(obj) -> str:
    owner = getattr(obj, "__self__", None)  # a bound method: name its module or object
    if isinstance(owner, torch.nn.Module):
        return type(owner).__name__
    if isinstance(obj, torch.nn.Module):
        return type(obj).__name__
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def _note(what: str) -> None:
    _compiled.append(what)
    _say_if_eager()


def _say_if_eager() -> None:
    walk = sys.modules.get("teraio.walk")
    if not _compiled or _state["said"] or walk is None or walk._active_walk() is None:
        return
    _state["said"] = True
    what = ", ".join(dict.fromkeys(_compiled))
    # Note [Compile under the walk]: why Dynamo runs these regions eager.
    message = (f"{what} runs eager under TeraIO: TorchDynamo does not compile while TeraIO's op walk "
               "(a TorchDispatchMode) watches every op, so the compiled regions run op by op and the "
               "results follow eager numerics, not those of your compiled run")
    if _state["strict"]:
        stop_job(UsageError(f"{message}: remove torch.compile for this job or run it without --strict"))
    print(f"teraio: warning: {message}", file=sys.stderr)
