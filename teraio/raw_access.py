"""Reads of tensor memory that no ATen op sees, made safe under a plan.

The runtime brings a tensor back before any op uses it, but some code reads storages through
raw pointers: safetensors (transformers' default save path), torch.save on CPU tensors,
Tensor.numpy() and DLPack exports, C extensions. A storage the plan moved out has no memory
then (resized to 0: safetensors sees every such tensor at address 0, takes them for shared
tensors and refuses, or writes garbage). So:
- torch.save (TIER_SAVERS) reads what was moved out straight from the host pool or the swap
  files, nothing coming back to the device (Note [Saving from the tiers] in
  teraio_run/saving.py): a state larger than the device saves as it does plainly;
- the other savers (SAVERS below) run inside `resident()`: everything back, nothing leaving;
- numpy and DLPack exports bring their one storage back and pin it: the pointer they hand
  out may be read at any later time, so that storage never moves again;
- a storage's clone and cpu copy (copy.deepcopy of a tensor, a module or a state_dict goes
  through clone) size the copy with nbytes() before any op runs, which reads 0 for a storage
  moved out: they bring that storage back first (it may leave again later);
- anything else calls `teraio.resident()` around its raw reads.
The wrappers are installed as their modules are imported (the bootstrap's import hook) and
cost one list lookup when no runtime agent is active (plain runs, `teraio profile`).
"""

import functools
from contextlib import nullcontext

# module -> attributes ("Class.method" for methods) whose calls read storages raw
TIER_SAVERS = {"torch": ("save",), "torch.serialization": ("save",)}
SAVERS = {
    "safetensors.torch": ("save_file", "save", "save_model"),
    # these look for shared storages by address before safetensors is called
    "transformers.modeling_utils": ("PreTrainedModel.save_pretrained",),
    "accelerate.utils.other": ("save",),
    "accelerate.accelerator": ("Accelerator.save_model",),
}
EXPORTS = ("numpy", "__dlpack__")   # Tensor methods that hand out a pointer
STORAGE_COPIES = ("clone", "cpu")   # UntypedStorage methods that size a copy before any op runs
WRAPPED_MARK = "__teraio_wrapped__"


def resident():
    """A context manager: inside it every tensor TeraIO moved out is back in device memory,
    and none leaves. Use it around code that reads tensor memory through raw pointers
    (a custom checkpoint writer, a C extension). Without a runtime agent it does nothing.

        with teraio.resident():
            my_extension.write(model.state_dict())
    """
    listener = _listener()
    hold = getattr(listener, "resident", None)
    return hold() if hold is not None else nullcontext()


def _listener():
    from teraio.walk import _active_walk

    walk = _active_walk()
    return walk.listener if walk is not None else None


def _held(fn):
    @functools.wraps(fn)
    def call_resident(*args, **kwargs):
        with resident():
            return fn(*args, **kwargs)

    setattr(call_resident, WRAPPED_MARK, True)
    return call_resident


def _from_tiers(fn):
    @functools.wraps(fn)
    def call_reading_tiers(*args, **kwargs):
        saving = getattr(_listener(), "save_from_tiers", None)
        with saving() if saving is not None else nullcontext():
            return fn(*args, **kwargs)

    setattr(call_reading_tiers, WRAPPED_MARK, True)
    return call_reading_tiers


def _agent_first(method: str):
    """A wrapper that lets the runtime agent's `method` see the call's first argument (a tensor
    to pin, a storage to bring back) before the call runs; nothing without an agent."""
    def wrapper(fn):
        @functools.wraps(fn)
        def call_after_agent(first, *args, **kwargs):
            act = getattr(_listener(), method, None)
            if act is not None:
                act(first)
            return fn(first, *args, **kwargs)

        setattr(call_after_agent, WRAPPED_MARK, True)
        return call_after_agent
    return wrapper


def wrap_module(module) -> None:
    """Wrap the savers of a just-imported module (TIER_SAVERS, SAVERS), and Tensor's exports with torch."""
    for savers, wrapper in ((TIER_SAVERS, _from_tiers), (SAVERS, _held)):
        for path in savers.get(module.__name__, ()):
            owner_path, _, attr = path.rpartition(".")
            owner = getattr(module, owner_path) if owner_path else module
            _wrap(owner, attr, wrapper)
    if module.__name__ == "torch":
        for attr in EXPORTS:
            _wrap(module.Tensor, attr, _agent_first("pin_for_raw_read"))
        for attr in STORAGE_COPIES:
            _wrap(module.UntypedStorage, attr, _agent_first("restore_for_read"))


def _wrap(owner, attr: str, wrapper) -> None:
    fn = getattr(owner, attr, None)
    if fn is not None and not getattr(fn, WRAPPED_MARK, False):
        setattr(owner, attr, wrapper(fn))


def install() -> None:
    """Wrap what is imported already, and the rest as it is imported (called by the
    bootstrap at interpreter start, before the job imports anything)."""
    import importlib.abc
    import importlib.util
    import sys

    wrapped = {**TIER_SAVERS, **SAVERS}
    for name in wrapped:
        module = sys.modules.get(name)
        if module is not None:
            wrap_module(module)

    class WrapOnImport(importlib.abc.MetaPathFinder):
        busy: set = set()

        def find_spec(self, name, path=None, target=None):
            if name not in wrapped or name in self.busy:
                return None
            self.busy.add(name)  # the lookup below asks every finder again, this one included
            try:
                spec = importlib.util.find_spec(name)
            finally:
                self.busy.discard(name)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                real_exec = spec.loader.exec_module

                def exec_then_wrap(module):
                    real_exec(module)
                    wrap_module(module)

                spec.loader.exec_module = exec_then_wrap
            return spec

    sys.meta_path.insert(0, WrapOnImport())
