"""TeraIO bootstrap: put on PYTHONPATH by `teraio profile` / `teraio run`.

It must stay cheap and harmless: it chain-loads any sitecustomize that was already on the
path, and when TERAIO_MODE is set it waits for the script to import torch, then arms the
agent's start at the first op on the plan's device. It never takes the user's job down on
its own account (unless TERAIO_STRICT=1).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain_load_next_sitecustomize() -> None:
    path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Runs the agent once `import torch` has finished, so processes without torch pay nothing."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_then_start(module):
            real_exec(module)
            _start_agent()

        spec.loader.exec_module = exec_then_start
        return spec


def _start_agent() -> None:
    """Arms the agent's start at the job's first op on the device (Note [Lazy start] in
    teraio/app/bootstrap/__init__.py): launchers and shells that import torch never start one."""
    try:
        from teraio.app.bootstrap import arm
        arm()
    except BaseException as err:  # the job must train even if the agent cannot
        if os.environ.get("TERAIO_STRICT", "").lower() in ("1", "true", "yes", "on"):
            # Said here because the error surfaces as a failed `import torch`, which a
            # script may catch, and a second import then fails with an unrelated message.
            print(f"teraio: the agent could not be set up ({type(err).__name__}: {err}); "
                  "stopping the job (--strict)", file=sys.stderr)
            raise
        print(f"teraio: the agent could not be set up ({type(err).__name__}: {err}); "
              "training continues without it", file=sys.stderr)


_chain_load_next_sitecustomize()
if os.environ.get("TERAIO_MODE"):
    sys.meta_path.insert(0, _AfterTorchImport())
if os.environ.get("TERAIO_MODE") in ("run", "profile"):
    # Before the job imports anything: savers that read raw memory are wrapped as they load (a
    # run and a capped profile move tensors out), in every profile too, so that the profiled op
    # stream is the run's (Note [State dicts outside the walk] in teraio/raw_access.py).
    try:
        from teraio.raw_access import install as _wrap_raw_readers
        _wrap_raw_readers()
    except Exception as _err:  # noqa: BLE001 - never take the job down: say so, train on
        print(f"teraio: could not guard raw-memory savers ({_err}); saving under a plan may fail", file=sys.stderr)
