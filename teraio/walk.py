"""The op walk that profile and run share: it numbers kernels and names tensors.

Both stages watch the same stream of ATen ops with one TorchDispatchMode, so kernel k and
tensor id X mean the same thing in the profiled process and in the planned one. The walk
only observes; what to do at each op is a `WalkListener`'s business (the profiler records,
the runtime executes a plan).

Note [Tensor identity]
A tensor is a storage (views share it; its size is the storage's nbytes). Its id must be
stable across iterations and processes and readable in a plan diff:
- parameters and buffers: their module path (`model.layers.3.mlp.up_proj.weight`), from the
  root module's named_parameters() (the root is the first module called with none running);
- gradients kept across steps: `<param>.grad`; optimizer state: `<param>:<state key>`, both
  resolved through the optimizer object at its step hooks, not by order of first use;
- everything else: the module scope, the op and the output index where it was born, and an
  occurrence counter that restarts every iteration: `model.layers.3.mlp/mm.0#1`. Ops of the
  backward pass run outside any module call, so their scope is `bwd`; what the job makes
  outside any module before its first optimizer step ends is `setup` (Note [Birth names across
  iterations]).
Tensors first met as an op input (made before the walk started, or outside ATen) are named
like births with `in` instead of the output index.

Note [Tensor subclasses]
A wrapper subclass (DTensor: FSDP2's sharded parameters, their gradients and optimizer state)
holds no memory of its own: its untyped_storage() is a placeholder the size of the *global*
tensor with no data behind it, and copying it out reads address 0 (FSDP2 runs died of a
segmentation fault so). Its inner tensors (`__tensor_flatten__`: a DTensor's local shard) hold
the bytes, so the walk names and moves those, under the wrapper's id. Dispatch modes run
before subclasses, so the walk meets the wrapper at the op and makes its local shard resident
before DTensor's own dispatch runs the local ops (which no mode sees).

Note [FSDP2 unsharded parameters]
FSDP2 (`fully_shard`) all-gathers a module's parameters into storages of its own before the
module runs and frees them again after it with `untyped_storage().resize_(0)`, re-allocating
with `resize_(nbytes)` at the next all-gather, all outside any ATen op. Those storages are
FSDP2's to free: had we moved one out, FSDP2's resize would free the memory under our copy
(a crash) or hand the module garbage. They are the plain tensors registered as parameters of
an FSDP module while it runs (its sharded parameters are DTensors), so the walk pins them
when such a module's forward returns, before FSDP2's own post-forward hook frees them. The
sharded parameters, gradients and optimizer state, which FSDP2 never resizes, still move.

Note [Outputs read raw later]
Some backward functions are composite: they run as smaller ops below autograd, and read a
tensor the forward made through a raw pointer, never passing it to an ATen op the walk sees.
`_pack_padded_sequence`'s batch sizes (output 1) are read so by its backward: the trace saw
their last use in the forward, a plan or an eviction moved them out, and the backward read
unallocated memory (on the CPU; on CUDA they live on the host and are never tracked). Such
outputs (RAW_READ_OUTPUTS) are kind `other` and pinned, like FSDP2's unsharded parameters.
The same functions also allocate with `empty` and fill the memory through a raw pointer after
other ops have run (`_pad_packed_sequence`'s lengths): a storage made by an allocation that
writes nothing (UNINITIALIZED_OPS) stays put until an op the walk sees has taken it as an
input (teraio_run/budget.py, BudgetKeeper.movable). Moved out right after its birth, as the
plan said, its memory was freed under the writes: glibc aborted with a corrupted heap.

Note [Sparse tensors]
A sparse tensor (a COO adjacency built in the forward, Embedding(sparse=True)'s gradient) has
no storage: its bytes are in dense parts (indices and values) that ops read without the walk
seeing them as inputs. So an op's sparse argument stands for its parts: they are named, kept
resident and counted as used at every op that takes the sparse tensor. Moved out between two
uses the trace did not see, a sparse.mm's backward read unallocated memory. A sparse gradient
is not named as a gradient (it has no storage to key): its parts keep their birth names.

Note [Nested tensors]
A nested tensor (nn.TransformerEncoder's fast path in eval, with a padding mask) keeps its
bytes in one flat buffer, a storage like any, but has no sizes: `shape` raises. Its record
gives the buffer's element count as its shape, the guard's signatures its rank and buffer
size, and it never moves (kind `other`, pinned): its size and offset metadata are host
tensors that the walk never sees, and it lives within one pass of inference.

Note [Tensors from other processes]
A tensor a DataLoader worker sends is rebuilt in the job's process by unpickling it, with
ATen ops on the CPU (`empty` then `set_` per tensor: torch.multiprocessing.reductions), when
its batch arrives. Batches arrive when the workers are done, ahead of their turn and out of
order, so those ops fall in a step by timing: the profile of one job saw 85 to 97 ops per
step, could not find two alike, and its run paused the plan at random. The walk sees none of
them (the rebuilds run with the dispatch modes off: `hide_rebuilds`); a rebuilt tensor is met
as an input of the job's first op that uses it, at the same kernel in every run.

Note [Iteration boundary]
A step ends when an optimizer step finishes (the global step post-hook), so an unmodified
script needs nothing; loops without a torch optimizer call `teraio_step()`. An iteration is
`steps_per_iteration` steps counted from the job's first: a loop that steps two optimizers
(one for the body, one for the head) or several times per cycle repeats only as a whole,
and a plan keyed by kernel index holds only over whole cycles. The profiler finds the
cycle (Note [Steady state] in teraio_profile/recorder.py) and writes it into the trace; the
plan carries it to the runtime. Counting from the first step is what lines profile and run
up: both see the same steps in the same order.

Note [Writes]
Each record counts the ops that wrote its storage in place: the arguments an op's schema marks
`Tensor(a!)` (in-place ops, `out=`, the optimizers' fused and foreach steps, collectives),
counted after the op ran, views included (they share the storage). The runtime keeps a tier's
copy of a storage it brought back and releases the storage again without copying while the
count has not moved (Note [Clean copies] in teraio_run/engine.py). A write that no ATen op makes
(a C++ extension handed a data pointer, a library writing through DLPack) is not counted:
`teraio run --no-clean-copies` is for such jobs.

Note [Storage arguments]
A few ops take a storage, not a tensor: set_ with a source storage, which PyTorch itself calls to
view a storage as a tensor (copy.copy of a tensor rebuilds it so; a TypedStorage's casts, its
`.double()`, view it so). A storage the plan moved out reads 0 bytes, so set_ built an empty
tensor, or refused the sizes it was given, and a cast read nothing. The walk counts such a storage
as an input of the op, through an empty view of it made with no dispatch mode: it is brought back
before the op runs, in the run as for any input, and the profile sees the same op stream. A
storage the walk has not met yet (copy.deepcopy's new one) stays the op's output, as before.

Note [Multi-tensor ops]
A fused or foreach optimizer step (`_fused_adamw_`, `_foreach_mul_`, ...) is one ATen op over
every parameter, gradient and state tensor: as one kernel it needs all of them on the device
at once (the 3B example's AdamW step: 44.5 GiB), and no plan can make room for it under a
smaller budget. These ops treat each position of their tensor lists on its own, so the walk
runs them in chunks of at most MULTI_TENSOR_CHUNK_BYTES, each chunk a kernel of its own: the
arithmetic is the same bit for bit, profile and run split alike (the walk is shared, the
chunking depends only on tensor sizes), and a plan can bring one chunk's states in while the
previous chunk runs.

Note [Autocast inside an op]
A dispatch mode runs below autocast: inside __torch_dispatch__ every dispatch key above
Python is excluded, autocast's among them, so an op the walk runs sees autocast off. For
almost every op that is what the plain job does too: autocast has already cast its inputs
(an op with an autocast kernel runs with autocast off below it), or the op computes alone.
An op that autocast passes through but whose kernel calls other ops (AUTOCAST_INSIDE_OPS:
nn.TransformerEncoderLayer's fast path, taken in eval under CPU autocast) runs those inner
ops under the caller's autocast state in the plain job: under the walk its matmuls ran in
fp32, and an eval under bf16 autocast returned float32 values unlike the plain job's bfloat16.
The walk runs such an op with the autocast state of its caller (the thread state the
dispatcher saved when the op was called: _RestorePythonTLSSnapshot).
"""

import functools
import itertools
import operator
import sys
import weakref
import zlib
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import NamedTuple

import torch
from torch._C._dynamo.eval_frame import set_eval_frame
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from teraio.formats.trace import AUTOCAST_INSIDE_OPS, UNINITIALIZED_OPS, Kind, Phase

_graph_task_id = torch._C._current_graph_task_id
_current_node = torch._C._current_autograd_node

BACKWARD_SCOPE = "bwd"
SETUP_SCOPE = "setup"   # Note [Birth names across iterations]
OOM_RETRIES = 3
MULTI_TENSOR_PREFIXES = ("_foreach_", "_fused_adam", "_fused_sgd", "_fused_adagrad")
MULTI_TENSOR_CHUNK_BYTES = 512 * 2**20   # Note [Multi-tensor ops]: ~100 launches for a 3B AdamW step
BETWEEN_OPS_LIMIT_S = 1e-3   # Note [Time between ops]
RAW_READ_OUTPUTS = {"_pack_padded_sequence": (1,)}   # Note [Outputs read raw later]: packet -> output indices


# Note [Time between ops]
# The job's thread also spends time in its own code between two ops: nn.Module calls, the
# autograd engine, the optimizer's Python. On a GPU that time is what a job of short kernels
# waits for, and it cannot be told from a wait for the device from outside (the iteration's
# time less the walk and the ops is both). So the walk adds up the gaps between the end of one
# op and the start of the next that are shorter than BETWEEN_OPS_LIMIT_S: a job's Python
# between two ops takes microseconds, while a wait for the device (a synchronize outside ATen,
# data loading) takes milliseconds. Time the job spends in longer stretches of its own is not
# counted. The run report says it per iteration (`between_ops_ms`); calibration charges it per
# kernel (teraio_plan/calibrate.py).


class WeakStorage:
    """A weak reference to a storage (what StorageWeakRef does, at a tenth of its cost: that
    class looks its C functions up through TypedStorage on every creation). Holding it keeps
    the storage's address from being reused by a new storage, so a key stays one storage's."""

    __slots__ = ("cdata",)

    def __init__(self, storage):
        self.cdata = storage._weak_ref()

    def expired(self) -> bool:
        return _expired(self.cdata)

    # bound at definition: the torch module may be torn down first at interpreter exit
    def __del__(self, _free=torch.UntypedStorage._free_weak_ref):
        _free(self.cdata)


def _flat_shape(tensor: torch.Tensor) -> tuple:
    """A nested tensor's buffer as a flat tensor (Note [Nested tensors]): it has no sizes."""
    return (tensor.untyped_storage().nbytes() // tensor.element_size(),)


def _signature_shape(tensor: torch.Tensor) -> tuple:
    """What stands for an output's shape in its op's signature: a nested tensor's rank and
    buffer size (Note [Nested tensors])."""
    return tensor.shape if not tensor.is_nested else ("nested", tensor.dim(), *_flat_shape(tensor))


_expired = torch.UntypedStorage._expired
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


class StorageRecord:
    """What the walk knows of one live storage."""

    __slots__ = ("key", "id", "name", "kind", "nbytes", "_dtype", "_shape", "ref", "born_iteration", "pinned",
                 "collective", "writes", "made_by_op")

    def __init__(self, key, tensor_id, kind, tensor, storage, iteration, made_by_op=False):
        self.key = key
        self.id = tensor_id
        self.name = tensor_id
        self.kind = kind
        self.nbytes = storage.nbytes()
        # kept as torch gives them: only the profiler reads them as text (dtype, shape)
        self._dtype = tensor.dtype
        self._shape = () if not self.nbytes else _flat_shape(tensor) if tensor.is_nested else tensor.shape
        self.ref = WeakStorage(storage)
        self.born_iteration = iteration
        self.pinned = False   # never moved (Note [Collective buffers], Note [FSDP2 unsharded parameters])
        self.collective = None  # the c10d Work of the last collective on it (Note [Collective buffers])
        self.writes = 0         # ops that wrote it in place since the walk met it (Note [Writes])
        # first met as an op's output, so made by this thread under the walk (movable_other);
        # False for one first met as an input
        self.made_by_op = made_by_op

    @property
    def dtype(self) -> str:
        return str(self._dtype)[len("torch."):]

    @property
    def shape(self) -> list[int]:
        return list(self._shape)

    def in_collective(self) -> bool:
        """Whether a collective may still read or write it (Note [Collective buffers])."""
        if self.collective is None:
            return False
        if self.collective.is_completed():
            self.collective = None  # a Work holds its tensors: keeping it would keep them alive
            return False
        return True

    def storage(self):
        """A strong reference to the storage, or None if it has been freed."""
        if self.ref.expired():
            return None
        return torch.UntypedStorage._new_with_weak_ptr(self.ref.cdata)


def movable_other(record: StorageRecord) -> bool:
    """Note [Storages the job made]
    Kind `other` is what the walk cannot name: a copy the script keeps (copy.deepcopy of the
    optimizer's state_dict as an in-memory checkpoint, an EMA of the weights that no module of
    the model holds, timm's ModelEmaV3 before its first forward), the state of an optimizer that
    is not torch.optim's (fastai's, a hand-written update marked with teraio_step), module
    buffers, the step's and the backward's temporaries, and communication buffers. It used to
    stay on the device whatever the budget: a job keeping two snapshots of its AdamW state went
    41% over its budget, one with an EMA 14% over, and the keeper had nothing to evict. What
    kept `other` in place is the communication buffers (Note [Collective buffers]): DDP's
    buckets and FSDP2's all-gather and reduce-scatter buffers are read and written by
    communication threads, where no dispatch mode runs, so a bucket moved out would be written
    through a dangling pointer; those that a collective took without a Work to wait for are
    pinned, the others only marked `other`. Everything else the walk leaves unnamed is reached
    by ops alone, like an activation, and the runtime's invariant (every input back before its
    op; raw reads brought back by teraio/raw_access.py) makes moving it exact.
    So a storage of kind `other` may move when (1) the walk met it first as an op's output
    (`made_by_op`): it was made by this thread under the walk, by the op itself or just before
    it (a deepcopy's storage, met at its set_), never one made by another thread or outside ATen
    and met first as an input (a DataLoader pin thread's batch, a background checkpoint's
    staging copy, whose thread may still read it without the walk seeing), or torch.load made it
    (Note [Storages torch.load made] in teraio_run/budget.py), and (2) no process group is
    initialized: under torch.distributed the buffers above are `other` too and cannot be told
    apart, so every `other` stays there (a known limit: an EMA or a snapshot under DDP or FSDP2
    stays on the device). Pinned, shared, not resizable, unwritten and in-collective storages
    are refused before this is asked (teraio_run/budget.py, BudgetKeeper.refusal), whatever
    their kind. The profiler asks the same of each `other` storage of the trace (its column
    `movable_other`), so that the planner moves what the runtime will (teraio_plan/periods.py):
    an optimizer of the job's own whose state would otherwise never leave."""
    from teraio.raw_access import made_by_load

    if not record.made_by_op:
        storage = record.storage()
        if storage is None or not made_by_load(storage):
            return False
    return not (torch.distributed.is_available() and torch.distributed.is_initialized())


class WalkListener:
    """Hooks the walk calls. Records are deduplicated per op; `new` are storages born by it."""

    def before_op(self, k: int, func, inputs: list[StorageRecord]) -> None: ...

    def after_op(self, k: int, func, inputs: list[StorageRecord], new: list[StorageRecord],
                 signature: int) -> None: ...

    def on_step_end(self) -> None:
        """An optimizer step (or teraio_step) ended; on_iteration_end follows when it ends one."""

    def on_iteration_end(self, iteration: int, num_kernels: int) -> None: ...

    def relieve_memory(self, inputs: list[StorageRecord], attempt: int) -> bool:
        """An op ran out of device memory (attempt 0, 1, ...); True lets it retry."""
        return False


@dataclass
class _Owners:
    """What the model and optimizers own, by storage key."""

    # storage key -> (id, kind, weak ref). The weak ref keeps a dead owner's key from being
    # reused by an unrelated new storage (which would inherit its name) until the entry is
    # dropped, which refresh_owners does for dead ones.
    by_key: dict = field(default_factory=dict)
    param_names: dict = field(default_factory=dict)  # id(param) -> (module path, weak ref to it)

    def param_name(self, param) -> str | None:
        """Its module path, while the parameter named so lives (a dead one's id may be reused)."""
        entry = self.param_names.get(id(param))
        return entry[0] if entry is not None and entry[1]() is param else None

    def name_param(self, param, name: str) -> None:
        if self.param_name(param) is None:  # the first name a shared (tied) parameter meets stays
            self.param_names[id(param)] = (name, _weak(param))


def _weak(obj):
    """A weak reference (Note [Weak holds]), or a strong one for a class without them (__slots__)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def cuda_allocated_bytes() -> int:
    """What torch.cuda.memory_allocated() returns, at a fraction of its cost: that call
    flattens and sorts all ~120 allocator statistics into a new dict every time (140-160 us
    in Python alone on the development box: bench/alloc_stats_cost.py), and both agents ask
    once per op (4094 times per iteration of the 3B benchmark). The nested dict is built in C++."""
    return torch.cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["current"]


_op_names: dict = {}


def _op_name(func) -> str:
    """str(func), once per op overload: OpOverload.__str__ costs ~7 us, paid twice per op."""
    name = _op_names.get(func)
    if name is None:
        name = _op_names[func] = str(func)
    return name


SIGNATURE_MEMO_ENTRIES = 1 << 16   # distinct (op, output shapes) kept; shapes that vary can make many

_signatures: dict = {}
_structures: dict = {}


def op_signature(func, out_tensors: list) -> int:
    """crc32 of the op name and its output shapes: what the guard compares per kernel.
    Memoized by (op, shapes): formatting and hashing the text cost ~5 us, once per op."""
    try:
        key = (id(func), *[t.shape for t in out_tensors])  # Note [Op memos]
    except RuntimeError:  # a nested tensor has no sizes (Note [Nested tensors]); rare, off the fast path
        key = (id(func), *[_signature_shape(t) for t in out_tensors])
    crc = _signatures.get(key)
    if crc is None:
        shapes = [tuple(shape) for shape in key[1:]]
        crc = zlib.crc32(f"{_op_name(func)}|{shapes}".encode())
        if len(_signatures) >= SIGNATURE_MEMO_ENTRIES:
            _signatures.clear()
        _signatures[key] = crc
    return crc


def op_structure(func, out_tensors: list) -> int:
    """crc32 of the op name and its outputs' count, dtypes and ranks, sizes aside: what the
    guard compares when shapes vary (Note [When the plan is followed] in teraio_run/agent.py).
    Rank and dtype tell a different code path (a broadcast, a cast) from another batch size."""
    if len(out_tensors) == 1:  # most ops: no list of pairs (a 3-tuple of dtype and rank is no other key)
        out = out_tensors[0]
        key = (id(func), out.dtype, out.dim())   # Note [Op memos]
    else:
        key = (id(func), *[(t.dtype, t.dim()) for t in out_tensors])
    crc = _structures.get(key)
    if crc is None:
        outs = [(t.dtype, t.dim()) for t in out_tensors]
        crc = _structures[key] = zlib.crc32(f"{_op_name(func)}|{outs}".encode())
    return crc


def op_signatures(func, out_tensors: list) -> tuple[int, int]:
    """Both, for the profiler, which records exact signatures and settles on structure."""
    return op_signature(func, out_tensors), op_structure(func, out_tensors)


_written: dict = {}
# Ops that write arguments their schema does not mark `Tensor(a!)`: the batch norms update the
# running statistics in place when training (native_batch_norm is what BatchNorm2d runs on the
# CPU and, as cudnn_batch_norm, on CUDA). Unmarked, a clean release dropped the update (the
# statistics of a checkpoint and of evaluation were a step-0 copy's) and a replay of the op
# would have updated them twice. Counted as written whether training or not: a copy too many
# costs bytes, a write missed costs values.
UNMARKED_WRITES = {
    name: ("running_mean", "running_var")
    for name in ("aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm",
                 "aten::_batch_norm_impl_index", "aten::batch_norm_update_stats")
}


def written_arguments(func) -> tuple[tuple[int, str], ...]:
    """(position, name) of each argument the op writes in place, `Tensor(a!)` in its schema
    (`out=` arguments too) or in UNMARKED_WRITES: Note [Writes]."""
    found = _written.get(func)
    if found is None:
        unmarked = UNMARKED_WRITES.get(func._schema.name, ())
        found = _written[func] = tuple((i, arg.name) for i, arg in enumerate(func._schema.arguments)
                                       if (arg.alias_info is not None and arg.alias_info.is_write)
                                       or arg.name in unmarked)
    return found


_multi_tensor: dict = {}

# Note [Op memos]
# What the walk needs of an op overload is memoized per overload, keyed by id(func): the
# overload's own __hash__ is a Python function (~0.3 us, several lookups per op). An id is
# reused only once its object is gone, and these memos hold the overload (_op_names holds
# every one the signature memos saw), so an id keeps naming the overload it was taken from.
_op_infos: dict = {}


class OpInfo(NamedTuple):
    """What the walk needs of an op overload (Note [Op memos])."""

    func: object                     # the overload itself, held so that its id names it
    written: tuple                   # (position, name) of the arguments it writes (Note [Writes])
    collective: bool                 # a c10d op (Note [Collective buffers])
    multi_tensor: bool               # Note [Multi-tensor ops]
    packet: str                      # the overload packet's name (mm, add, ...)
    storage_args: tuple[int, ...]    # positions of its Storage arguments (Note [Storage arguments])
    autocast_inside: bool            # Note [Autocast inside an op]


def _op_info(func) -> OpInfo:
    storage_args = tuple(i for i, arg in enumerate(func._schema.arguments) if arg.type.kind() == "StorageType")
    packet = func.overloadpacket.__name__
    info = _op_infos[id(func)] = OpInfo(func, written_arguments(func), func.namespace == "c10d",
                                        is_multi_tensor(func), packet, storage_args,
                                        packet in AUTOCAST_INSIDE_OPS)
    return info


def caller_autocast(tensors: list):
    """Note [Autocast inside an op]: the autocast state the op's caller had for the device of
    its first tensor, to run the op under (a null context when autocast was off there)."""
    device_type = tensors[0].device.type if tensors else "cpu"
    with torch._C._RestorePythonTLSSnapshot():
        if not torch.is_autocast_enabled(device_type):
            return nullcontext()
        return torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type),
                              cache_enabled=torch.is_autocast_cache_enabled())


def storage_views(positions: tuple, args) -> list:
    """Note [Storage arguments]: an empty uint8 view of each storage an op takes as a storage
    (set_ with a source storage), made with no dispatch mode, so its record is an input."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return [torch.empty(0, dtype=torch.uint8, device=args[i].device).set_(args[i])
                for i in positions if i < len(args) and isinstance(args[i], torch.UntypedStorage)]


def makes_uninitialized(func) -> bool:
    """Whether the op allocates without writing (Note [Outputs read raw later])."""
    info = _op_infos.get(id(func)) or _op_info(func)
    return info.packet in UNINITIALIZED_OPS


def is_multi_tensor(func) -> bool:
    found = _multi_tensor.get(func)
    if found is None:
        name = func._overloadpacket.__name__ if func.namespace == "aten" else ""
        found = _multi_tensor[func] = name.startswith(MULTI_TENSOR_PREFIXES)
    return found


def multi_tensor_chunks(func, args, kwargs):
    """[(args, kwargs)] for each chunk of a multi-tensor op (Note [Multi-tensor ops]), or None
    when it is small enough to run whole. Every list argument as long as the first tensor
    list (tensors or scalars, position by position) is sliced; everything else is shared."""
    lists = [a for a in (*args, *kwargs.values()) if isinstance(a, (list, tuple)) and a
             and isinstance(a[0], torch.Tensor)]
    if not lists:
        return None
    n = len(lists[0])
    per_position = [sum(t.nbytes for t in column if isinstance(t, torch.Tensor))
                    for column in zip(*(a for a in lists if len(a) == n))]
    bounds, total = [0], 0
    for i, nbytes in enumerate(per_position):
        if total and total + nbytes > MULTI_TENSOR_CHUNK_BYTES:
            bounds.append(i)
            total = 0
        total += nbytes
    if len(bounds) == 1:
        return None
    bounds.append(n)

    def cut(value, lo, hi):
        return value[lo:hi] if isinstance(value, (list, tuple)) and len(value) == n else value

    return [([cut(a, lo, hi) for a in args], {key: cut(v, lo, hi) for key, v in kwargs.items()})
            for lo, hi in zip(bounds, bounds[1:])]


def join_outputs(outs: list):
    """The chunks' results as the whole op would have returned them: nothing (in-place ops),
    one list, or a tuple of lists."""
    first = outs[0]
    if first is None:
        return None
    if isinstance(first, list):
        return [t for out in outs for t in out]
    return tuple(join_outputs([out[i] for out in outs]) for i in range(len(first)))


def op_tensors(args, kwargs) -> list:
    """tensors_in(args) then tensors_in(kwargs), the first level unrolled: most arguments
    are tensors or scalars, and a call per argument was a third of the cost."""
    found = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            found.append(arg)
        elif isinstance(arg, (list, tuple, dict)):
            tensors_in(arg, found)
    if kwargs:
        for arg in kwargs.values():
            if isinstance(arg, torch.Tensor):
                found.append(arg)
            elif isinstance(arg, (list, tuple, dict)):
                tensors_in(arg, found)
    return found


def tensors_in(obj, found: list) -> list:
    """The tensors in an op's arguments or results, in pytree order. ATen passes only
    tuples, lists and dicts, so this beats torch's general pytree walk on the hot path."""
    if isinstance(obj, torch.Tensor):
        found.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            tensors_in(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            tensors_in(item, found)
    return found


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def storage_holders(tensor: torch.Tensor) -> list:
    """The tensors that hold `tensor`'s bytes: itself, or a wrapper subclass's inner tensors
    (Note [Tensor subclasses])."""
    if type(tensor) in _PLAIN_TENSORS or not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    inners = [getattr(tensor, name) for name in names]  # DTensor lists its DeviceMesh too
    return [held for inner in inners if isinstance(inner, torch.Tensor) for held in storage_holders(inner)]


def sparse_parts(tensor: torch.Tensor) -> list:
    """The dense tensors that hold a sparse tensor's bytes, none for other layouts (Note
    [Sparse tensors]). Called inside the dispatch mode, where these accessors are not ops we see."""
    layout = tensor.layout
    if layout == torch.sparse_coo:
        return [tensor._indices(), tensor._values()]
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return [tensor.crow_indices(), tensor.col_indices(), tensor.values()]
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return [tensor.ccol_indices(), tensor.row_indices(), tensor.values()]
    return []


def _fsdp_module_class():
    """FSDP2's module class, once the job has imported FSDP (no import cost otherwise)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return getattr(fsdp, "FSDPModule", None)


def _waited_by_caller(func, args, kwargs) -> bool:
    """Whether a c10d op was called with async_op=False: its Python caller waits for it before
    anything else runs (gloo's Work of a waited reduce-scatter never says it completed)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "async_op":
            return not kwargs.get("async_op", args[i] if i < len(args) else arg.default_value)
    return False


class _StreamMark:
    """Completes like a c10d Work once a CUDA stream has passed the point where it was made."""

    __slots__ = ("event",)

    def __init__(self, stream):
        self.event = stream.record_event()

    def is_completed(self) -> bool:
        return self.event.query()


class _UntilWaited:
    """A collective without a Work whose caller waits for it: _collective_waited replaces
    this with a mark on its stream at the next op."""

    @staticmethod
    def is_completed() -> bool:
        return False


_UNTIL_WAITED = _UntilWaited()


def _work_of(out):
    """The c10d Work a collective returned (alone or last in a tuple), or None."""
    last = out[-1] if isinstance(out, tuple) and out else out
    if not isinstance(last, torch.ScriptObject):
        return None
    try:
        return torch.distributed.distributed_c10d.Work.unbox(last)
    except (AttributeError, RuntimeError):
        return None


# Note [The job's errors, not ours]
# An op the job calls wrongly (a shape mismatch, an out-of-memory past every retry) raises
# inside the walk, so its traceback showed the walk's frames and PyTorch's OpOverload.__call__
# between the job's line and the error, where the plain run shows none: a user reads it as a
# crash of TeraIO's. An error the op raised (marked by _call), and a Ctrl-C wherever it lands,
# leave the walk with those frames taken out; an error of the walk's or the runtime's own
# keeps its whole traceback, to be reported.
OP_ERROR_MARK = "__teraio_op_error__"
_OUR_FOLDERS = tuple(str(Path(__file__).resolve().parents[1] / name) for name in
                     ("teraio", "teraio_run", "teraio_profile"))
_OPS_FILE = str(Path(torch._ops.__file__).resolve())


def _op_error(err: BaseException) -> BaseException:
    setattr(err, OP_ERROR_MARK, True)
    return err


def _without_our_frames(tb):
    """The traceback without the walk's frames and the OpOverload call they made."""
    kept = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if not (code.co_filename.startswith(_OUR_FOLDERS) or
                (code.co_filename == _OPS_FILE and code.co_name == "__call__")):
            kept.append(tb)
        tb = tb.tb_next
    for first, second in zip(kept, kept[1:]):
        first.tb_next = second
    if kept:
        kept[-1].tb_next = None
    return kept[0] if kept else None


class OpWalk(TorchDispatchMode):
    """Numbers every ATen op on the watched device and names every storage it touches."""

    def __init__(self, listener: WalkListener, device_type: str, steps_per_iteration: int = 1):
        super().__init__()
        self.listener = listener
        # what after_op gets as `signature`: op_signature, or what the listener compares instead
        self.signature_of = op_signature
        self.device_type = device_type
        self.steps_per_iteration = steps_per_iteration  # Note [Iteration boundary]
        self.steps = 0                # optimizer steps (or teraio_step calls) since the job started
        self.iteration = 0
        self.kernel = 0               # index of the next op within the current iteration
        # Host seconds spent in the walk and listener around ops, inside the ops themselves
        # (PyTorch's own launch cost), and in the job's own code between two ops (Note [Time
        # between ops]): when they add up to the iteration, the CPU is the bottleneck.
        self.host_s = {"walk": 0.0, "ops": 0.0, "between": 0.0}
        self._last_op_end = 0.0
        # Started just before and stopped just after each op's call, when set (the profiler's
        # kernel clock): a kernel's time is the op's, not the bookkeeping around it.
        self.op_clock = None
        self.op_written: list[StorageRecord] | tuple = ()   # what the last op wrote in place (Note [Writes])
        # the last op's arguments and output tensors, for after_op (the runtime keeps the call of an
        # op it may replay: Note [Replay] in teraio_run/replay.py)
        # (held only during after_op: a reference kept longer changes what autograd does, as in
        # Note [Failed copies are values] in teraio_run/tiers.py)
        self.last_call: tuple | None = None
        self.records: dict[int, StorageRecord] = {}
        self.created_bytes = 0   # bytes of every record made so far (a bound for the CPU budget check)
        self.births: list[StorageRecord] | None = None   # records made, for whoever set a list (and empties it)
        self.owners = _Owners()
        # Note [Weak holds]: the models and optimizers the job has used, held weakly, as the
        # module and parameter names: a model the job drops (a fresh one built to resume, a
        # discarded candidate) is freed as in the plain run, memory and all.
        self.roots: list = []       # weak references (_weak)
        self.optimizers: list = []
        self.scope: list[str] = []
        self.module_names: dict[int, tuple] = {}  # id(module) -> (path, weak reference)
        self.occurrences: dict[tuple, int] = {}
        self.in_optimizer = False
        self.backward_ran = False   # a gradient was accumulated since the flag was last reset (teraio_run/metrics.py)
        self._step_scope_depth, self._step_graph_task = 0, -1  # Note [Steps with a closure]
        # optimizer steps run from inside a backward pass (an optimizer per parameter stepped from
        # gradient hooks), by graph task: the profiler's hint for --steps-per-iteration
        self.steps_in_backward: dict[int, int] = {}
        # id(optimizer) -> (state entries, tensors in the newest) at the last look
        self._state_marks: dict[int, tuple[int, int]] = {}
        self._handles = []
        self._in_collective: list[StorageRecord] = []  # records holding a Work (Note [Collective buffers])
        self._waited: list[StorageRecord] = []  # those of the last collective its caller waits for
        self._waited_on = None                  # and the CUDA stream it was called on
        # Tensor.is_cuda / is_cpu are cheaper than building a torch.device per tensor per op.
        self._on_device = operator.attrgetter("is_cuda" if device_type == "cuda" else "is_cpu")

    # ----- hooks that give ops their context -----------------------------------------------
    def install_hooks(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [
            register_module_forward_pre_hook(self._module_enter),
            register_module_forward_hook(self._module_exit, always_call=True),   # Note [Scopes left by an exception]
            register_optimizer_step_pre_hook(self._optimizer_enter),
            register_optimizer_step_post_hook(self._optimizer_exit),
        ]

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _module_enter(self, module, args):
        name = self._module_name(module)
        if name is None and not self.scope:
            self._add_root(module)
            name = self._module_name(module)
        self.scope.append(name or type(module).__name__)

    def _module_name(self, module) -> str | None:
        entry = self.module_names.get(id(module))
        return entry[0] if entry is not None and entry[1]() is module else None

    def _module_exit(self, module, args, output):
        """Note [Scopes left by an exception]: called also when the module's forward raised
        (always_call). A non-reentrant torch.utils.checkpoint stops its recompute inside the
        backward by raising once it has made what the backward needs, out of the modules it was
        in: their scopes stayed open, and the ops after them were named and phased as that
        module's forward (a T5's loss gradient `...layer.1.dropout/nll_loss_backward.0#0`, the
        next step's loss ops taken for forward ones, their outputs activations)."""
        if self.scope:
            self.scope.pop()
        fsdp_module = _fsdp_module_class()
        if fsdp_module is not None and isinstance(module, fsdp_module):
            self._pin_unsharded(module)

    def _pin_unsharded(self, module) -> None:
        """Note [FSDP2 unsharded parameters]: called as an FSDP module's forward returns, while
        its all-gathered parameters are still registered (its sharded ones are DTensors)."""
        for param in module.parameters():
            if type(param) not in _PLAIN_TENSORS or not self._on_device(param):
                continue
            record = self.records.get(param.untyped_storage()._cdata)
            if record is not None and not record.pinned:
                record.kind, record.pinned = Kind.other, True

    def _pin_raw_read(self, out_tensors, indices) -> None:
        """Note [Outputs read raw later]."""
        for index in indices:
            record = self.records.get(out_tensors[index].untyped_storage()._cdata)
            if record is not None:
                record.kind, record.pinned = Kind.other, True

    def wrapped_in_ddp(self) -> bool:
        """Whether the model is wrapped in DistributedDataParallel (known once it has run)."""
        return any(type(root()).__name__ == "DistributedDataParallel" for root in self.roots if root() is not None)

    def _add_root(self, module) -> None:
        prefix = "" if not self.roots else type(module).__name__
        self.roots.append(_weak(module))
        for name, sub in module.named_modules(prefix=prefix):
            if self._module_name(sub) is None:
                self.module_names[id(sub)] = (name or type(module).__name__, _weak(sub))
        for name, param in module.named_parameters(prefix=prefix, remove_duplicate=False):
            self.owners.name_param(param, name)
            self._own(param, name, Kind.parameter)
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(self._grad_ready))
        for name, buf in module.named_buffers(prefix=prefix, remove_duplicate=False):
            self._own(buf, name, Kind.other)

    def _grad_ready(self, param) -> None:
        """A gradient is named as soon as backward has accumulated it, not only at the next
        optimizer step: before the first step it would otherwise be an unknown storage the
        runtime may not evict (10.9 GiB of them for the 3B example)."""
        self.backward_ran = True
        name = self.owners.param_name(param)
        if name is not None and param.grad is not None:
            self._own(param.grad, f"{name}.grad", Kind.gradient)

    def _optimizer_enter(self, optimizer, args, kwargs):
        if all(ref() is not optimizer for ref in self.optimizers):
            self.optimizers.append(_weak(optimizer))
        self.refresh_owners()
        self.in_optimizer = True
        self._step_scope_depth, self._step_graph_task = len(self.scope), _graph_task_id()
        if self._step_graph_task != -1:
            if len(self.steps_in_backward) > 8:  # the last few backward passes are enough
                self.steps_in_backward.clear()
            self.steps_in_backward[self._step_graph_task] = self.steps_in_backward.get(self._step_graph_task, 0) + 1

    def _optimizer_exit(self, optimizer, args, kwargs):
        self.in_optimizer = False
        self.refresh_owners()
        self.end_step()

    def _name_new_optimizer_state(self) -> None:
        """Inside a step: name optimizer state as the step creates it. The first step of
        AdamW makes two tensors per parameter (21.7 GiB for the 3B example) before its update
        kernels run; unnamed until the step ends, they would be storages the runtime may not
        evict, and a budget below them could not be kept. State entries are added in order,
        each just before its tensors: a new entry, or new tensors in the newest, are what need
        naming (from the newest entry seen before on)."""
        for optimizer in self._live_optimizers():
            state = optimizer.state
            newest = next(reversed(state.values())) if state else {}
            mark = (len(state), len(newest) if isinstance(newest, dict) else 0)
            seen = self._state_marks.get(id(optimizer), (0, 0))
            if mark == seen:
                continue
            self._state_marks[id(optimizer)] = mark
            start = max(seen[0] - 1, 0) if mark[0] >= seen[0] else 0  # fewer: the state was replaced
            for param, entry in itertools.islice(state.items(), start, None):
                self._own_state(param, entry)

    def _live_optimizers(self) -> list:
        """The optimizers the job still holds; those it dropped are forgotten, with their marks
        (a new optimizer may get a dropped one's id)."""
        live = [optimizer for ref in self.optimizers if (optimizer := ref()) is not None]
        if len(live) < len(self.optimizers):
            self.optimizers = [_weak(optimizer) for optimizer in live]
            self._state_marks = {id(o): self._state_marks[id(o)] for o in live if id(o) in self._state_marks}
        return live

    def refresh_owners(self) -> None:
        """Name gradients and optimizer state through the optimizers (Note [Tensor identity])."""
        by_key = self.owners.by_key
        for key in [key for key, (_, _, ref) in by_key.items() if ref.expired()]:
            del by_key[key]  # a gradient freed by zero_grad: its key may now be reused
        for optimizer in self._live_optimizers():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    name = self.owners.param_name(param)
                    if name is not None:
                        self._own_if_rebound(param, name)
                        if param.grad is not None:
                            self._own(param.grad, f"{name}.grad", Kind.gradient)
                    self._own_state(param, optimizer.state.get(param, {}))

    def _own_if_rebound(self, param, name: str) -> None:
        """A parameter re-bound with `param.data = ...` has a new storage nobody owns yet: name it,
        or the plan's entries for the parameter find nothing from then on."""
        if type(param) in _PLAIN_TENSORS and param.untyped_storage()._cdata not in self.owners.by_key:
            self._own(param, name, Kind.parameter)

    def _own_state(self, param, state) -> None:
        name = self.owners.param_name(param)
        if name is None or not isinstance(state, dict):  # a custom optimizer's own layout
            return
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                self._own(value, f"{name}:{key}", Kind.optimizer_state)

    def _own(self, tensor: torch.Tensor, tensor_id: str, kind: Kind) -> None:
        if _functorch_wrapped(tensor):
            # torch.func.functional_call under grad or vmap puts its transform's wrappers where the
            # module's parameters were (no storage of their own): the real tensors get their
            # names through the optimizer or a later plain forward, or keep their birth names
            return
        # Note [Tensor subclasses]: a DTensor's bytes are its local shard's, named as the DTensor
        holders = (tensor,) if type(tensor) in _PLAIN_TENSORS else storage_holders(tensor)
        for holder in holders:
            self._own_storage(holder, tensor_id, kind)

    def _own_storage(self, tensor: torch.Tensor, tensor_id: str, kind: Kind) -> None:
        # a sparse gradient (Embedding(sparse=True)) has no storage: its indices and values
        # are met, and named by birth, as the ops that make them run (like _records_of)
        if tensor.device.type != self.device_type or tensor.layout != torch.strided:
            return
        key = tensor.untyped_storage()._cdata
        self.owners.by_key[key] = (tensor_id, kind, WeakStorage(tensor.untyped_storage()))
        record = self.records.get(key)
        if record is None:
            return
        record.name = tensor_id
        record.kind = Kind.other if record.pinned else kind
        # A gradient born in this iteration keeps its birth id: the runtime meets it at its
        # birth op. Anything the owners hold across a boundary is resolved by owner name.
        if kind != Kind.gradient or record.born_iteration < self.iteration:
            record.id = tensor_id

    def end_step(self) -> None:
        """Note [Iteration boundary]: every steps_per_iteration-th step ends an iteration."""
        self.steps += 1
        self.listener.on_step_end()
        if self.steps % self.steps_per_iteration == 0:
            self.end_iteration()

    def end_iteration(self) -> None:
        num_kernels = self.kernel
        self.listener.on_iteration_end(self.iteration, num_kernels)
        self.iteration += 1
        self.kernel = 0
        self.occurrences.clear()

    # ----- the op stream --------------------------------------------------------------------
    def phase(self) -> Phase:
        """Note [Steps with a closure]: `optimizer.step(closure)` (LBFGS, Lightning's automatic
        optimization) runs the forward and backward inside the step; their ops are forward and
        backward, and their activations movable, like those of a step without one. What tells
        them from the step's own ops: a module entered, or a graph task begun, since the step
        began (a step run by a hook inside backward keeps the graph task it began in)."""
        # Only the autograd engine runs a node, always inside a graph task; asking for the
        # node builds a Python object for it, the task id is an int.
        task = _graph_task_id()
        if self.in_optimizer:
            if len(self.scope) > self._step_scope_depth:
                return Phase.forward
            if task == self._step_graph_task or task == -1:
                return Phase.optimizer
        if task != -1 and _current_node() is not None:
            return Phase.backward
        return Phase.forward if self.scope else Phase.other

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Note [Dynamo off in the walk]: PyTorch would wrap __torch_dispatch__ in
        torch._dynamo.disable, which costs ~2.5 us per op on the CPU box (six Python calls and
        four switches of the frame hook); __torch_dispatch__ switches the hook off itself."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Note [Dynamo off in the walk]: no frame of the walk, the listener or the op's own
        # Python may be compiled by a torch.compile running around it (what the wrapper that
        # _should_skip_dynamo turns off would do), so the frame hook is off while it runs.
        prior = set_eval_frame(None)
        try:
            kwargs = kwargs or {}
            info = _op_infos.get(id(func)) or _op_info(func)
            chunks = multi_tensor_chunks(func, args, kwargs) if info.multi_tensor else None
            if chunks is None:
                return self._walk_op(func, args, kwargs, info)
            return join_outputs([self._walk_op(func, *chunk, info) for chunk in chunks])
        except BaseException as err:
            if isinstance(err, KeyboardInterrupt) or getattr(err, OP_ERROR_MARK, False):
                err.__traceback__ = _without_our_frames(err.__traceback__)
            raise   # a bare raise adds no frame of this one
        finally:
            set_eval_frame(prior)

    def _walk_op(self, func, args, kwargs, info):
        """One kernel: name its storages, let the listener act around it, run it."""
        t0 = perf_counter()
        host_s = self.host_s
        if t0 - self._last_op_end < BETWEEN_OPS_LIMIT_S:
            host_s["between"] += t0 - self._last_op_end
        k = self.kernel
        self.kernel = k + 1
        if self.in_optimizer:
            self._name_new_optimizer_state()
        if self._waited:
            self._collective_waited()
        inputs = self._records_of(op_tensors(args, kwargs), func, "in")
        if info.storage_args:
            views = storage_views(info.storage_args, args)
            inputs += _not_among(self._records_of(views, func, "in", create=False), inputs)
        listener = self.listener
        listener.before_op(k, func, inputs)
        clock = self.op_clock
        if clock is not None:
            clock.start()
        t1 = perf_counter()
        try:
            if info.autocast_inside:
                with caller_autocast(op_tensors(args, kwargs)):
                    out = self._call(func, args, kwargs, inputs)
            else:
                out = self._call(func, args, kwargs, inputs)
        except Exception:
            self._op_raised(k, func, args, kwargs, inputs, clock)
            raise
        t2 = perf_counter()
        if clock is not None:
            clock.stop()
        written, collective = info.written, info.collective
        self.op_written = self._count_writes(written, args, kwargs) if written else ()
        if collective:
            self._pin(inputs, _work_of(out), _waited_by_caller(func, args, kwargs))
        out_tensors = [out] if isinstance(out, torch.Tensor) else tensors_in(out, [])
        new = self._records_of(out_tensors, func, None) if out_tensors else []
        if new and inputs:  # an output that aliases an input is not new
            new = _not_among(new, inputs)
        if new and info.packet in RAW_READ_OUTPUTS:
            self._pin_raw_read(out_tensors, RAW_READ_OUTPUTS[info.packet])
        self.last_call = (args, kwargs, out_tensors)
        listener.after_op(k, func, inputs, new, self.signature_of(func, out_tensors))
        self.last_call = None
        host_s["ops"] += t2 - t1
        self._last_op_end = end = perf_counter()
        host_s["walk"] += end - t2 + t1 - t0
        return out

    def _op_raised(self, k, func, args, kwargs, inputs, clock) -> None:
        """Note [Ops that raise]
        An op that raises is still a kernel of the iteration: it was numbered and the listener
        acted before it, and a job that catches the error runs it in every iteration alike
        (accelerate's gather_for_metrics slices a 0-dim tensor and catches the IndexError, once
        per step under TRL's SFTTrainer). The listener was never told it ended, so the
        profiler's recorded ops fell behind the kernel count (4,911 against 4,915: the trace
        could not be written, the profile ended in a ValueError from our own frames), its
        clock's start had no stop, and the runtime, which learns an iteration's signatures in
        the same hook, lost one. It ends here as an op with no outputs, with the same
        signature in the profile and the run."""
        if clock is not None:
            clock.stop()
        self.op_written = ()
        self.last_call = (args, kwargs, [])
        self.listener.after_op(k, func, inputs, [], self.signature_of(func, []))
        self.last_call = None

    def _count_writes(self, written, args, kwargs) -> list[StorageRecord]:
        """Note [Writes]: every storage an op wrote in place counts one more write; returns them."""
        records = []
        for position, name in written:
            value = args[position] if position < len(args) else kwargs.get(name)
            for record in self._records_of(tensors_in(value, []), None, None, create=False):
                record.writes += 1
                records.append(record)
        return records

    def _call(self, func, args, kwargs, inputs):
        """Run the op; when it runs out of device memory, let the listener relieve memory in
        stages (an op that fails to allocate has not written its outputs: a retry is safe)."""
        try:
            return func(*args, **kwargs)
        except torch.OutOfMemoryError as err:
            if not self.listener.relieve_memory(inputs, 0):
                raise _op_error(err)
        except BaseException as err:
            raise _op_error(err)
        for attempt in range(1, OOM_RETRIES + 1):
            try:
                return func(*args, **kwargs)
            except torch.OutOfMemoryError as err:
                if attempt == OOM_RETRIES or not self.listener.relieve_memory(inputs, attempt):
                    raise _op_error(err)
            except BaseException as err:
                raise _op_error(err)
        raise AssertionError("unreachable")

    def _pin(self, records, work, waited: bool) -> None:
        """Note [Collective buffers]: a collective returns before its transfer is done (gloo
        threads, NCCL streams), so whatever a c10d op touches stays on the device until the
        Work it returned has completed (StorageRecord.in_collective), or, called with
        async_op=False, until the next op (its caller waits for it first: on CUDA the compute
        stream waits, and our copies wait for the compute stream); after a collective without
        a Work that its caller does not wait for, for good. Communication buffers (DDP's buckets, FSDP2's all-gather
        and reduce-scatter inputs) are reused or read by communication threads where no
        dispatch mode runs: nobody owns them, so they become kind `other` and never move.
        What the model or optimizer owns moves again once the collective has completed: FSDP2's
        gradients are views of a reduce-scatter's output, owned (named) right after it."""
        owned = self.owners.by_key
        self._in_collective = [r for r in self._in_collective if r.in_collective()]
        # No Work to ask (NCCL's under torch 2.11 does not unbox), but the caller waits: held
        # until the next op marks its stream (FSDP2's reduce-scatters on CUDA: its gradients).
        work = work if work is not None or not waited else _UNTIL_WAITED
        for record in records:
            record.collective = work
            if work is None:
                record.pinned = True
            else:
                self._in_collective.append(record)
            if work is None or record.key not in owned:
                record.kind = Kind.other
        if waited:
            self._waited = records
            cuda = self.device_type == "cuda"
            self._waited_on = torch.cuda.current_stream(torch.cuda.current_device()) if cuda else None

    def _collective_waited(self) -> None:
        """The next op after a collective called with async_op=False: its caller has waited.
        On the CPU it is done; on CUDA the stream it ran on waits for it, so it is done once
        that stream gets past this point (our copies may run on other streams)."""
        mark = None if self._waited_on is None else _StreamMark(self._waited_on)
        for record in self._waited:
            record.collective = mark
        self._waited = []

    def _records_of(self, leaves, func, label, create: bool = True, held: bool = False) -> list[StorageRecord]:
        """The records of the storages these tensors hold, deduplicated, in order; made for
        storages met for the first time unless `create` is False. A subclass among them (rare,
        so found on the way) restarts with the tensors that hold their bytes (`held`: Note
        [Tensor subclasses])."""
        records, seen = [], set()
        index = 0
        on_device, by_key = self._on_device, self.records
        for leaf in leaves:
            plain = type(leaf) in _PLAIN_TENSORS
            if not plain and not held:
                holders = [inner for leaf in leaves for inner in storage_holders(leaf)]
                return self._records_of(holders, func, label, create, held=True)
            if not on_device(leaf):
                continue
            index += 1
            try:
                storage = leaf.untyped_storage()
                if not plain:
                    storage.data_ptr()  # a wrapper subclass that owns no memory raises here
            except (RuntimeError, NotImplementedError):
                # storage-less: a sparse tensor's bytes are its dense parts' (Note [Sparse tensors])
                for record in self._records_of(sparse_parts(leaf), func, label, create, held):
                    if record.key not in seen:
                        seen.add(record.key)
                        records.append(record)
                continue
            key = storage._cdata
            if key in seen:
                continue
            seen.add(key)
            record = by_key.get(key)
            if record is None:
                if not create:
                    continue
                record = self._new_record(key, leaf, storage, func, label or str(index - 1), label is None)
            records.append(record)
        return records

    def _new_record(self, key, tensor, storage, func, label, made_by_op: bool) -> StorageRecord:
        """A record for a storage met for the first time, as one of the op's outputs
        (`made_by_op`) or as its input."""
        owned = self.owners.by_key.get(key)
        if owned is not None:
            tensor_id, kind, _ = owned
        else:
            phase = self.phase()
            tensor_id = self._birth_name(func, label, phase)
            kind = Kind.activation if phase == Phase.forward else Kind.other
        record = StorageRecord(key, tensor_id, kind, tensor, storage, self.iteration, made_by_op)
        if tensor.is_nested:  # Note [Nested tensors]
            record.kind, record.pinned = Kind.other, True
        self.records[key] = record
        self.created_bytes += record.nbytes
        if self.births is not None:
            self.births.append(record)
        return record

    def _birth_name(self, func, label, phase: Phase) -> str:
        """Note [Birth names across iterations]
        A storage is named by its birth: scope, op, output and how many times the iteration has
        made that name; the count starts again each iteration, so the same op of every iteration
        gets the same name. A storage the job makes before its loop and keeps (a dataset drawn
        with `torch.randn`) was named like the first one of each later iteration (the noise a
        diffusers step draws with `torch.randn`): `/randn.0#0` twice in the trace and the plan.
        The runtime took the step's noise for the dataset's entry, never moved the dataset, and
        a plan that fitted went over its budget at the same op of every iteration (408
        evictions each, a UNet at a quarter of its peak). So what the job makes outside any
        module, the backward pass and the optimizer before its first optimizer step ends (its
        setup, its first step's data) is scoped `setup`, a name no later iteration makes. By
        step, not iteration: the profiler counts each step an iteration until it has found the
        job's cycle, the run counts the plan's cycle from the start. Skipping names still held
        at a boundary instead gave a per-step buffer alive across the boundary a name that
        alternated between iterations (tests/clients/late_fill.py), and the plan no longer matched."""
        if self.scope:
            scope = self.scope[-1]
        elif phase == Phase.backward:
            scope = BACKWARD_SCOPE
        else:
            scope = SETUP_SCOPE if self.steps == 0 and phase != Phase.optimizer else ""
        base = f"{scope}/{(_op_infos.get(id(func)) or _op_info(func)).packet}.{label}"
        occurrence = self.occurrences.get(base, 0)
        self.occurrences[base] = occurrence + 1
        return f"{base}#{occurrence}"

    def forget_expired(self) -> list[StorageRecord]:
        """Drop records of freed storages; returns them (the profiler timestamps their death)."""
        self._in_collective = [r for r in self._in_collective if r.in_collective()]  # let their Works go
        dead = [r for r in self.records.values() if r.ref.expired()]
        for record in dead:
            del self.records[record.key]
        return dead


def _not_among(records: list, inputs: list) -> list:
    """The records that are not inputs (records are one per storage: identity is the key)."""
    if len(inputs) > 16:  # a multi-tensor op's hundreds: a set, not a scan per output
        keys = {r.key for r in inputs}
        return [r for r in records if r.key not in keys]
    return [r for r in records if r not in inputs]


def teraio_step() -> None:
    """Explicit step marker for loops that have no torch optimizer: call it where the loop
    would call optimizer.step() (Note [Iteration boundary])."""
    walk = _active_walk()
    if walk is not None:
        walk.end_step()


# Note [Tensors from other processes]: what unpickling calls to rebuild a sent tensor
REBUILDS = ("rebuild_tensor", "rebuild_cuda_tensor", "rebuild_nested_tensor", "rebuild_sparse_coo_tensor",
            "rebuild_sparse_compressed_tensor")


def hide_rebuilds() -> None:
    """Rebuild tensors sent by other processes with no dispatch mode on (Note [Tensors from
    other processes]); once per process, after torch is imported, in the profile and the run."""
    from torch.multiprocessing import reductions
    from torch.utils._python_dispatch import _disable_current_modes

    for name in REBUILDS:
        rebuild = getattr(reductions, name, None)
        if rebuild is None or getattr(rebuild, "__teraio_unwalked__", False):
            continue

        @functools.wraps(rebuild)
        def unwalked(*args, _rebuild=rebuild, **kwargs):
            with _disable_current_modes():
                return _rebuild(*args, **kwargs)

        unwalked.__teraio_unwalked__ = True
        setattr(reductions, name, unwalked)


_ACTIVE: list[OpWalk] = []


def _active_walk() -> OpWalk | None:
    return _ACTIVE[-1] if _ACTIVE else None


def activate(walk: OpWalk) -> None:
    """Install the hooks and push the mode for the rest of the process (or until deactivate)."""
    walk.install_hooks()
    walk.__enter__()
    _ACTIVE.append(walk)


def deactivate(walk: OpWalk) -> None:
    if walk in _ACTIVE:
        _ACTIVE.remove(walk)
        walk.__exit__(None, None, None)
        walk.remove_hooks()
