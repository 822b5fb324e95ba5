"""Checkpoints of tensors the plan moved out, read from where their bytes are.

Note [Saving from the tiers]
torch.save pickles each storage's size and device first and writes its bytes after. Under
`teraio.resident()` (the model-taking savers' way: teraio/raw_access.py) every moved storage
comes back to the device first: for a job whose state does not fit the device, the whole point
of TeraIO, that is an out-of-memory error in the middle of a checkpoint. So torch.save goes
another way: while it runs, a tensor whose storage is out (in the host pool or a swap file, its
copy done or waited for) pickles as a CPU tensor over a copy of those bytes read straight from
the tier, viewed with the same offset, size and stride, and tagged with the device it belongs
to (`location_tag`, through a tagger registered first), so the file is the one a plain run
writes and torch.load puts it back on the device. safetensors' save_file and transformers'
save_pretrained get such stand-ins in their dict of tensors or state dict (the format has no
device). One copy per storage per save: tensors that share a storage still share it in the
file. Storages on the device are saved as usual. Nothing comes back to the device but what no
tier holds the bytes of (a replayed activation: it is made again, as for an op), and nothing
leaves while the save runs (its sizes are read before its bytes). Tensor subclasses (DTensor)
and tensors with Python attributes (fastai's TensorBase, say: a Learner's smoothed loss) are
saved as usual, their storage brought back first: pickled with no bytes on the device, it was
a storage of 0 bytes in the file, which torch.load refused ("not resizable").
"""

from contextlib import contextmanager

import torch
import torch.serialization
from torch.utils._python_dispatch import _disable_current_modes

TAG_PRIORITY = 1   # before PyTorch's own taggers (cpu 10, cuda 20)


class TierReads:
    """The state of one save: CPU copies by storage key, device tags by CPU storage."""

    def __init__(self, engine, records, bring_back):
        self.engine, self.records, self.bring_back = engine, records, bring_back
        self.copies: dict[int, torch.UntypedStorage] = {}
        self.tags: dict[int, str] = {}

    def stand_in(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """A CPU tensor with `tensor`'s bytes read from its tier, or None to pickle it as it is."""
        if not torch._C._has_storage(tensor):
            return None   # sparse tensors: their parts are pickled as tensors of their own
        storage = tensor.untyped_storage()
        record = self.records.get(storage._cdata)
        if record is None or storage._cdata not in self.engine.moved:
            return None
        if type(tensor) is not torch.Tensor or torch._utils._get_obj_state(tensor):
            self.bring_back(record)   # a subclass, or Python attributes the stand-in would not carry
            return None
        copy = self.copies.get(record.key)
        if copy is None:
            host_bytes = self.engine.host_bytes(record)
            if host_bytes is None:   # no tier holds it (a replay), or its copy failed: bring it back
                self.bring_back(record)
                return None
            copy = self.copies[record.key] = host_bytes.untyped_storage()
            # PyTorch's own tag of the moved storage: the same string object where the plain run's is
            # one (pickle writes each new object again, a constant once), so the file is byte for byte its
            self.tags[copy._cdata] = torch.serialization.location_tag(storage)
        view = torch.empty(0, dtype=tensor.dtype).set_(copy, tensor.storage_offset(), tensor.size(), tensor.stride())
        return view.requires_grad_(tensor.requires_grad) if tensor.is_leaf else view

    def stand_ins(self, tensors: dict) -> dict:
        """A dict of tensors (a state dict) with a stand-in for each moved one."""
        with _disable_current_modes():
            return {name: self._or_itself(value) for name, value in tensors.items()}

    def _or_itself(self, value):
        stand_in = self.stand_in(value) if isinstance(value, torch.Tensor) else None
        return value if stand_in is None else stand_in


_active: list[TierReads] = []
_registered = False


def _tag(storage) -> str | None:
    """The device of a stand-in's copy, from any save running (save_pretrained runs save_file)."""
    key = getattr(storage, "_untyped_storage", storage)._cdata
    return next((reads.tags[key] for reads in reversed(_active) if key in reads.tags), None)


def _no_restore(storage, location):
    return None   # loading is PyTorch's own (the tag names a real device)


@contextmanager
def save_from_tiers(engine, records, bring_back):
    """Inside it, torch.save reads moved tensors from their tiers (Note [Saving from the tiers]);
    bring_back(record) brings one back that no tier holds (BudgetKeeper.bring_back)."""
    global _registered
    if not _registered:
        torch.serialization.register_package(TAG_PRIORITY, _tag, _no_restore)
        _registered = True
    reads, reduce = TierReads(engine, records, bring_back), torch.Tensor.__reduce_ex__

    def reduce_from_tier(tensor, protocol):
        with _disable_current_modes():   # our reads and views are no ops of the job
            stand_in = reads.stand_in(tensor)
        return reduce(tensor if stand_in is None else stand_in, protocol)

    torch.Tensor.__reduce_ex__ = reduce_from_tier
    _active.append(reads)
    try:
        yield reads
    finally:
        torch.Tensor.__reduce_ex__ = reduce
        _active.remove(reads)
