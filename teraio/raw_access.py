"""Reads of tensor memory that no ATen op sees, made safe under a plan.

The runtime brings a tensor back before any op uses it, but some code reads storages through
raw pointers: safetensors (transformers' default save path), torch.save on CPU tensors,
Tensor.numpy() and DLPack exports, C extensions. A storage the plan moved out has no memory
then (resized to 0: safetensors sees every such tensor at address 0, takes them for shared
tensors and refuses, or writes garbage). So:
- torch.save, safetensors' save_file and transformers' save_pretrained (TIER_SAVERS) read
  what was moved out straight from the host pool or the swap files, nothing coming back to the
  device (Note [Saving from the tiers] in teraio_run/saving.py): a state larger than the
  device saves as it does plainly;
- the savers that take a model (SAVERS below: safetensors' and accelerate's, and a scripted
  module's, which torch.jit.save calls) run inside `resident()`: everything back, nothing leaving;
- numpy and DLPack exports bring their one storage back and pin it: the pointer they hand
  out may be read at any later time, so that storage never moves again;
- a storage's clone and cpu copy (copy.deepcopy of a tensor, a module or a state_dict goes
  through clone) size the copy with nbytes() before any op runs, which reads 0 for a storage
  moved out: they bring that storage back first, and nothing leaves until the copy returns
  (it may leave again later);
- Tensor.tolist (on the CPU it reads the storage through its pointer: "tolist() shouldn't be
  called on a tensor with unallocated storage"), Tensor.__repr__ (it runs its ops with the
  dispatch modes off: the walk sees none of them, "out of bounds for storage of size 0") and
  a storage's copy_ (it compares nbytes() before any op runs) bring their storages back and
  hold them until they return (READ_HELD, Note [Raw reads]);
- a storage's element reads (tolist, iteration and bytes(), indexing, repr) bring it back,
  hold it and run outside the walk (Note [Raw reads]); a storage slice, which aliases the
  memory, and torch.to_dlpack pin it like the exports;
- torch.save of a storage itself (pickle.dumps of a tensor pickles its storage so), or of a
  checkpoint holding a storage, holds it: the file records each storage's size before its bytes;
- anything else calls `teraio.resident()` around its raw reads.

Note [Raw reads]
A storage moved out is resized to 0: its nbytes(), len() and size() read 0, so a storage's
tolist(), bytes() or repr() gave an empty list, indexing raised IndexError and copy_ failed
"size does not match". A storage's element reads also run four ATen ops per byte (empty,
set_, select, _local_scalar_dense, in C++), each through the walk's Python mode: 133k ops for
a 16 KiB storage, much slower than plain, and all of them kernels of the profiled iteration.
So a raw read brings its storages back first (BudgetKeeper.held_for_copy: nothing leaves
until it returns), and the element reads run with the dispatch modes off, in the profile
(no agent to bring anything back) as in the run, so both see the same op stream. The
wrappers act only while the walk's mode is on the dispatch stack: the runtime's own copies
(a replay's, torch.load's storages swapped) run with it off and must not be held again.
nbytes(), size() and data_ptr() themselves are left alone: the runtime and PyTorch call them
everywhere, and 0 is how a moved storage is told.
The CPU storages torch.load makes are marked as it makes them (LOADED_MARK), also those a
map_location function hands back as they are, and those over a private mapping of a file
(safetensors' loads: Note [Private file mappings]): their memory is the loader's, not the
allocator's, and the runtime moves only marked ones into storages of the allocator's before it
frees them (Note [Storages torch.load made] in teraio_run/budget.py).
The wrappers are installed as their modules are imported (the bootstrap's import hook) and
cost one list lookup when no runtime agent is active (plain runs, `teraio profile`).
"""

import functools
from contextlib import ExitStack, contextmanager, nullcontext
from types import SimpleNamespace

# module -> {attribute ("Class.method" for methods): where its tensors are} for savers that
# read moved tensors from the tiers: pickled (torch.save), the first argument (a dict of
# tensors), or the model's state dict (save_pretrained: it looks for shared storages by address)
TIER_SAVERS = {
    "torch": {"save": "pickled"},
    "torch.serialization": {"save": "pickled"},
    "safetensors.torch": {"save_file": "dict", "save": "dict"},
    "transformers.modeling_utils": {"PreTrainedModel.save_pretrained": "state_dict"},
}
# module -> attributes whose calls read storages raw inside resident(): they take a model and
# look for shared storages by address before safetensors is called, or write its storages in
# C++ with no ATen op (torch.jit.save goes through a scripted module's save or save_to_buffer)
SAVERS = {
    "safetensors.torch": ("save_model",),
    "accelerate.utils.other": ("save",),
    "accelerate.accelerator": ("Accelerator.save_model",),
    # a scripted module's class and a traced one's base each hold their own reference
    "torch.jit._script": ("RecursiveScriptModule.save", "RecursiveScriptModule.save_to_buffer",
                          "ScriptModule.save", "ScriptModule.save_to_buffer"),
}
EXPORTS = ("numpy", "__dlpack__")   # Tensor methods that hand out a pointer
STORAGE_COPIES = ("clone", "cpu")   # UntypedStorage methods that size a copy before any op runs
# Tensor methods that read their storage through its pointer once, no pointer kept: held.
# __repr__ (str, format, print) runs its ops with the dispatch modes off (torch/_tensor_str.py):
# the walk sees none of them, and its tolist() met the storage moved out
READ_HELD = ("tolist", "__repr__")
# storage methods that read it element by element (four ATen ops per byte): held, outside the walk
ELEMENT_READS = ("tolist", "__getitem__", "__repr__", "__str__")
# storage methods that return a lazy iterator of element reads: read at once, held, outside the walk
ELEMENT_ITERATORS = ("__iter__",)
POINTER_EXPORTS = ("to_dlpack",)   # torch and torch.utils.dlpack functions that hand out a pointer
WRAPPED_MARK = "__teraio_wrapped__"
# on the CPU storages torch.load made (Note [Storages torch.load made] in teraio_run/budget.py):
# an attribute of the storage's Python object, which PyTorch keeps as long as the storage lives
LOADED_MARK = "_teraio_loaded"
LOAD_PRIORITY = -1000   # torch.load asks its deserializers in this order: ahead of every device's (CPU's is 10)


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


def _from_tiers(where: str):
    """A saver wrapper: moved tensors read from their tiers (TIER_SAVERS), nothing without an agent."""
    def wrapper(fn):
        @functools.wraps(fn)
        def call_reading_tiers(*args, **kwargs):
            saving = getattr(_listener(), "save_from_tiers", None)
            if where == "state_dict" and len(args) <= 2 and kwargs.get("state_dict") is None:
                # the same ops in the profile and the run: Note [State dicts outside the walk]
                kwargs["state_dict"] = state_dict_outside_walk(args[0])
            # no agent: nothing to do; a capped profile, or a state dict given by position (not
            # ours to replace): everything back, as for the other savers
            if saving is None or (where == "state_dict" and len(args) > 2):
                with resident():
                    return fn(*args, **kwargs)
            # storages saved as themselves, not as a tensor's (pickle.dumps of a tensor pickles its
            # storage: the storage's __reduce__ calls torch.save on it): their sizes are read
            # before their bytes, and no stand-in replaces them
            storages = _bare_storages(args[0] if args else kwargs.get("obj")) if where == "pickled" else ()
            with _held_for_read(*storages), saving() as reads:
                if where == "dict" and args:
                    args = (reads.stand_ins(args[0]), *args[1:])
                elif where == "dict" and "tensors" in kwargs:
                    kwargs["tensors"] = reads.stand_ins(kwargs["tensors"])
                elif where == "state_dict":
                    kwargs["state_dict"] = reads.stand_ins(kwargs["state_dict"])
                return fn(*args, **kwargs)

        setattr(call_reading_tiers, WRAPPED_MARK, True)
        return call_reading_tiers
    return wrapper


def state_dict_outside_walk(model) -> dict:
    """Note [State dicts outside the walk]: the model's state dict for a saver that takes the
    model (save_pretrained), taken with no dispatch mode, whose view ops (a detach per entry)
    would bring every moved tensor back in a run, and would be kernels of the iteration in a
    profile but not in the run (a job saving within its repeating cycle then never followed its
    plan). Unless a module has state-dict hooks: their code may read tensor data, so they run
    under the walk (what they touch comes back, as for any op), in the profile and the run alike."""
    from torch.utils._python_dispatch import _disable_current_modes

    hooked = any(m._state_dict_hooks or m._state_dict_pre_hooks for m in model.modules())
    with nullcontext() if hooked else _disable_current_modes():
        return model.state_dict()


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


def _agent_around(method: str):
    """A wrapper that runs the call inside the runtime agent's context `method`, given the
    call's first argument (a storage to hold back while it is copied); nothing without an agent."""
    def wrapper(fn):
        @functools.wraps(fn)
        def call_inside_agent(first, *args, **kwargs):
            around = getattr(_listener(), method, None)
            with around(first) if around is not None else nullcontext():
                return fn(first, *args, **kwargs)

        setattr(call_inside_agent, WRAPPED_MARK, True)
        return call_inside_agent
    return wrapper


def _walk_mode_on() -> bool:
    """Whether the job's code is running under the walk's mode (Note [Raw reads]): the runtime's
    own work runs with the modes off and is no raw read of the job's."""
    import torch

    from teraio.walk import _active_walk

    return _active_walk() is not None and torch._C._len_torch_dispatch_stack() > 0


class _Discard:
    def write(self, data) -> int:
        return len(data)


def _bare_storages(obj) -> list:
    """The storages torch.save(obj) writes as themselves, not as a tensor's (obj is one, or a
    checkpoint holds one): found by pickling obj once into nothing, every tensor a token (the
    cost: one pass over what is not a tensor; an object whose __reduce__ acts runs it twice). An
    object that does not pickle is left to torch.save, which says why."""
    import pickle

    import torch

    if isinstance(obj, torch.Tensor):
        return []
    if _untyped(obj) is not None:
        return [_untyped(obj)]
    found = []

    class StorageFinder(pickle.Pickler):
        def persistent_id(self, value):
            if isinstance(value, torch.Tensor):
                return 0
            storage = _untyped(value)
            if storage is not None:
                found.append(storage)
                return 0
            return None

    try:
        # protocol 5, buffers out of band: a numpy array's bytes are handed over, not copied
        StorageFinder(_Discard(), protocol=5, buffer_callback=lambda buffer: None).dump(obj)
    except Exception:   # noqa: BLE001 (torch.save pickles it next and raises what is wrong)
        return []
    return found


def _untyped(obj):
    """The UntypedStorage behind a storage (a TypedStorage's), or None for anything else."""
    import torch

    if isinstance(obj, torch.TypedStorage):
        return obj._untyped_storage
    return obj if isinstance(obj, torch.UntypedStorage) else None


@contextmanager
def _held_for_read(*storages):
    """Note [Raw reads]: these storages back on the device and none leaving until the block
    ends (BudgetKeeper.held_for_copy); nothing without an agent or outside the walk's mode."""
    hold = getattr(_listener(), "held_for_copy", None)
    with ExitStack() as stack:
        if hold is not None and _walk_mode_on():
            for storage in storages:
                if storage is not None:
                    stack.enter_context(hold(storage))
        yield


def _tensor_read(fn):
    """Tensor.tolist or __repr__: its storage held while it reads it (Note [Raw reads])."""
    @functools.wraps(fn)
    def call_held(tensor, *args, **kwargs):
        with _held_for_read(tensor.untyped_storage()):
            return fn(tensor, *args, **kwargs)

    setattr(call_held, WRAPPED_MARK, True)
    return call_held


def _storage_copy(fn):
    """UntypedStorage.copy_: both storages held, their sizes compared before any op runs."""
    @functools.wraps(fn)
    def call_held(storage, source, *args, **kwargs):
        with _held_for_read(storage, _untyped(source)):
            return fn(storage, source, *args, **kwargs)

    setattr(call_held, WRAPPED_MARK, True)
    return call_held


def _element_read(materialize: bool):
    """A storage's element reads: held and outside the walk (Note [Raw reads]). With
    `materialize` the call returns a lazy iterator, read to its end inside the hold (a storage's
    bytes as they are when the iteration starts: plainly they are read as it goes)."""
    def wrapper(fn):
        @functools.wraps(fn)
        def call_outside_walk(storage, *args, **kwargs):
            if not _walk_mode_on():   # no walk, or nested in one of ours (the modes are off)
                return fn(storage, *args, **kwargs)
            from torch.utils._python_dispatch import _disable_current_modes

            untyped = _untyped(storage)
            with _held_for_read(untyped), _disable_current_modes():
                if args and isinstance(args[0], slice):
                    _pin(untyped)   # the slice aliases this storage's memory for as long as it lives
                result = fn(storage, *args, **kwargs)
                return iter(list(result)) if materialize else result

        setattr(call_outside_walk, WRAPPED_MARK, True)
        return call_outside_walk
    return wrapper


def _pin(storage) -> None:
    """The storage back and never moved again (pin_for_raw_read takes what untyped_storage() gives)."""
    pin = getattr(_listener(), "pin_for_raw_read", None)
    if pin is not None:
        pin(SimpleNamespace(untyped_storage=lambda: storage))


def _wrap_raw_reads(torch) -> None:
    """Tensor's and the storages' raw reads (Note [Raw reads]) and the pointer exports."""
    for attr in EXPORTS:
        _wrap(torch.Tensor, attr, _agent_first("pin_for_raw_read"))
    for module in (torch, torch.utils.dlpack):
        for attr in POINTER_EXPORTS:   # torch._C._to_dlpack: no Tensor method on the way
            _wrap(module, attr, _agent_first("pin_for_raw_read"))
    for attr in READ_HELD:
        _wrap(torch.Tensor, attr, _tensor_read)
    for attr in STORAGE_COPIES:
        _wrap(torch.UntypedStorage, attr, _agent_around("held_for_copy"))
    _wrap(torch.UntypedStorage, "copy_", _storage_copy)
    if not getattr(torch.UntypedStorage.from_file, WRAPPED_MARK, False):   # Note [Private file mappings]
        torch.UntypedStorage.from_file = _noting_private_maps(torch.UntypedStorage.from_file)
    for owner in (torch.UntypedStorage, torch.TypedStorage):
        for attr in ELEMENT_READS:
            _wrap(owner, attr, _element_read(materialize=False))
        for attr in ELEMENT_ITERATORS:
            _wrap(owner, attr, _element_read(materialize=True))


_marking_loads = False


def made_by_load(storage) -> bool:
    """Whether a loader made this CPU storage: torch.load (Note [Storages torch.load made]), or
    a private mapping of a file holds its bytes (Note [Private file mappings])."""
    if getattr(storage, LOADED_MARK, False):
        return True
    if _private_mappings and _in_private_mapping(storage):
        setattr(storage, LOADED_MARK, True)
        return True
    return False


# Note [Private file mappings]
# safetensors (load_file, safe_open: how transformers', diffusers' and sentence-transformers'
# from_pretrained load weights on the CPU) maps the whole file once with
# UntypedStorage.from_file(shared=False) and hands out each tensor as a storage over its part
# of that mapping, not resizable: every plan offload of such a model's weights was refused
# (`not_resizable`, 626 per run of a sentence-transformers fine-tune; 8,119 on-demand
# evictions and 1.35 s of stalls for a diffusers UNet), as torch.load's were before Note
# [Storages torch.load made]. A private mapping (MAP_PRIVATE) is seen by no one but the
# storages over it: those bytes are the loader's as torch.load's are, and move the same way.
# So from_file's private mappings are noted as they are made, with a weak reference to the
# mapping's storage: while it lives (the storages over its parts hold it) its address range
# is the mapping's, and a non-resizable CPU storage inside it is a loader's. A dead mapping's
# range is dropped, since other memory may take its addresses. shared=True mappings write
# through to the file and are not noted.
_private_mappings: list = []   # [start, end, WeakStorage of the mapping], a few per job


def _noting_private_maps(from_file):
    @functools.wraps(from_file)
    def wrapper(*args, **kwargs):
        storage = from_file(*args, **kwargs)
        shared = kwargs.get("shared", args[1] if len(args) > 1 else False)
        if not shared and storage.nbytes():
            from teraio.walk import WeakStorage

            start = storage.data_ptr()
            _private_mappings.append((start, start + storage.nbytes(), WeakStorage(storage)))
        return storage
    setattr(wrapper, WRAPPED_MARK, True)
    return staticmethod(wrapper)   # from_file is called on the class


def _in_private_mapping(storage) -> bool:
    if storage.device.type != "cpu" or storage.resizable():
        return False
    _private_mappings[:] = [m for m in _private_mappings if not m[2].expired()]
    start = storage.data_ptr()
    end = start + storage.nbytes()
    return any(lo <= start and end <= hi for lo, hi, _ in _private_mappings)


def _mark_loaded(storage, location: str):
    """A deserializer of torch.load's, asked first for every storage it restores: it marks
    those whose memory is torch.load's own (the CPU ones not resizable: read from the file, or
    mapped from it privately with mmap=True) and leaves the restoring to the next one (None).
    None while mmap is set to MAP_SHARED (torch.serialization.set_default_mmap_options): such
    a mapping writes through to the file, which must go on seeing the tensor's writes."""
    device = getattr(storage, "device", None)
    if getattr(device, "type", None) == "cpu" and not storage.resizable() and not _maps_shared():
        setattr(storage, LOADED_MARK, True)
    return None


def _maps_shared() -> bool:
    import mmap

    from torch import serialization

    options = getattr(serialization, "get_default_mmap_options", None)
    return options is not None and options() == getattr(mmap, "MAP_SHARED", None)


def _no_tag(storage) -> None:
    return None  # torch.save tags storages by device: not ours to say


def _mark_loads(serialization) -> None:
    """Note [Storages torch.load made]: torch.load's storages marked as they are made, also
    before the agent starts (a job may load its checkpoint before its first op)."""
    global _marking_loads
    if not _marking_loads:  # torch keeps every package registered: once per process
        serialization.register_package(LOAD_PRIORITY, _no_tag, _mark_loaded)
        _wrap(serialization, "_get_restore_location", _marking_returned)
        _marking_loads = True


def _marking_returned(get_restore_location):
    """A map_location function is asked before the deserializers, and one that hands back the
    storage it was given (`lambda storage, loc: storage`, as Lightning's checkpoint loading
    does) leaves them unasked: mark what it hands back unchanged, as _mark_loaded would."""
    @functools.wraps(get_restore_location)
    def wrapper(map_location):
        restore = get_restore_location(map_location)
        if not callable(map_location):
            return restore

        def restore_marking(storage, location):
            restored = restore(storage, location)
            if restored is storage:
                _mark_loaded(storage, location)
            return restored
        return restore_marking
    setattr(wrapper, WRAPPED_MARK, True)
    return wrapper


def wrap_module(module) -> None:
    """Wrap the savers of a just-imported module (TIER_SAVERS, SAVERS), and with torch the raw
    reads of tensors and storages (Note [Raw reads]) and torch.load's storages (marked)."""
    savers = {path: _from_tiers(where) for path, where in TIER_SAVERS.get(module.__name__, {}).items()}
    savers.update((path, _held) for path in SAVERS.get(module.__name__, ()))
    for path, wrapper in savers.items():
        owner_path, _, attr = path.rpartition(".")
        owner = getattr(module, owner_path) if owner_path else module
        _wrap(owner, attr, wrapper)
    if module.__name__ == "torch":
        _wrap_raw_reads(module)
        _mark_loads(module.serialization)


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
