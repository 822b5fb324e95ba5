"""Recomputation: a tier whose slots hold the op that made a storage instead of its bytes.

Note [Replay]
A plan entry with tier `recompute` (teraio_plan/recompute.py chose it) says: this activation
was made by the op at kernel `produced_at`; after `offload_after` let its memory go without
copying it anywhere, and before `needed_by` run that op again on the same inputs. The same
ATen op on the same input bytes and shapes runs the same kernels and writes the same bytes
(the planner leaves out ops that draw random numbers, write in place or are known to differ
from run to run on a GPU), so training stays exact; the twin-run tests are the check.
- Capture: when the producing op runs while the plan is followed, the agent hands its call
  (the ATen overload, its arguments and which output is the storage) to `capture`. The
  arguments hold the input tensors alive, which the planner required anyway (every input
  alive at needed_by); after a replay the call is kept while the plan has more replays of the
  storage in the iteration, and dropped after its last (kept longer, it held the inputs past
  their death: on the 3B at half its peak, residual-stream tensors until the iteration end,
  and the job into out-of-memory relief); captures not released yet are dropped when the plan
  pauses and at the iteration end (no release comes for them).
- Release (`copy_out`): only while neither the storage nor any input has been written since
  the capture (the walk's write counts, Note [Writes] in teraio/walk.py); otherwise the agent
  moves it to the host pool instead (`ready`), counted as a replay fallback. An op ATen tags
  `nondeterministic_seeded` (it draws random numbers: poisson, _standard_gamma, a cuDNN RNN
  with dropout) is never captured, whatever the plan says: it falls back the same way.
- Replay (`copy_in`): the engine first makes the inputs resident (`needs`: one of them may
  itself be out, or replayed: chains work the same way), re-allocates the storage, and the
  op runs outside the walk, without autograd or autocast (the captured overload is already
  what autocast chose), on the compute stream, writing into the original storage, so views
  and tensors saved for backward see the bytes again, as after a copy-in. It writes there
  through the op's `out=` overload (`mm.out` for `mm`, `pow.Tensor_Scalar_out` for
  `pow.Tensor_Scalar`: the same kernels, structured ops share them) and a cast (`_to_copy`,
  autocast's) through `copy_`, the same conversion. Only an op without such an overload makes
  a fresh output that is copied in and freed: the tensor's bytes twice for a moment. On the
  H200 that transient drove the 3B at half its peak into 6.8 s of out-of-memory relief per
  run (docs/planner.md, Recomputation).
- Writes while released: an op that is about to write an input of a released storage would
  make its replay wrong, so the agent replays every storage that depends on that input first
  (`dependents`); a write the walk cannot see (a C++ extension given a raw pointer) is the
  case `teraio run --no-clean-copies` exists for, and under it recompute entries move to the
  host pool. A replay that finds an input written anyway raises ReplayMismatch rather than
  train on wrong bytes.
"""

import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import _disable_current_modes

from teraio.walk import tensors_in
from teraio_run.stops import CannotGoOnExactly, stop
from teraio_run.tiers import ComputeMark, Transfer

REPLAY_PATH = "replay"   # a Transfer's path no link meter counts
CAST_KWARGS = {"dtype", "layout", "device", "pin_memory", "non_blocking", "memory_format"}


class ReplayMismatch(CannotGoOnExactly):
    """A replay would not make the bytes it replaces (Note [Replay]): training cannot go on exactly."""


@dataclass
class Call:
    """One captured op call that can make a storage again."""

    record: object          # the walk's record of the storage it made
    func: object            # the ATen overload
    args: tuple
    kwargs: dict
    out_index: int          # which of the op's output tensors (tensors_in order) is the storage
    out_layout: tuple       # that tensor's (dtype, size, stride, storage offset)
    writes: int             # the storage's write count at the capture
    inputs: list            # [(record, write count at the capture)] of its input storages
    replays_left: int       # replays the plan has for it in this iteration

    def unwritten(self) -> bool:
        return self.record.writes == self.writes and all(r.writes == w for r, w in self.inputs)


class ReplayTier:
    """Tier `recompute` (the Tier protocol in teraio_run/tiers.py): nothing is copied out, the
    copy in is the replay."""

    name = "recompute"
    frees_at_once = True    # no copy reads the device memory: it may go at once
    keeps_copies = False

    def __init__(self, device_type: str):
        self.device_type = device_type
        self.pending: dict[int, Call] = {}     # storage key -> call captured, not released yet
        self.slots: dict[int, Call] = {}       # slot -> call of a released storage
        self._slot_of_key: dict[int, int] = {}
        self.dependents: dict[int, set[int]] = {}   # input storage key -> keys of released storages
        self._next_slot = 0

    # ----- capture, by the agent -----------------------------------------------------------
    def capture(self, record, func, args, kwargs, out_tensors: list, input_records: list, replays: int) -> None:
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            return  # draws random numbers: a replay would draw others and move the generator on
        out_index = next((i for i, t in enumerate(out_tensors) if t.untyped_storage()._cdata == record.key), None)
        if out_index is None:
            return  # a wrapper subclass's inner storage: not replayable as one output
        inputs = [(r, r.writes) for r in input_records if r.key != record.key]
        out = out_tensors[out_index]
        layout = (out.dtype, out.size(), out.stride(), out.storage_offset())
        self.pending[record.key] = Call(record, func, args, kwargs, out_index, layout, record.writes, inputs,
                                        replays)

    def ready(self, record) -> bool:
        """Whether a captured call can still make this storage's bytes (Note [Replay])."""
        call = self.pending.get(record.key)
        return call is not None and call.record is record and call.unwritten()

    def drop_pending(self) -> None:
        """The iteration ended or left the plan: captures never released let their inputs go."""
        self.pending.clear()

    def released_depending_on(self, input_keys) -> list:
        """Records of released storages whose replay reads one of these storages."""
        return [self.slots[self._slot_of_key[key]].record
                for input_key in input_keys for key in self.dependents.get(input_key, ())]

    # ----- the Tier protocol ---------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        self._next_slot += 1
        return self._next_slot

    def copy_out(self, storage, slot: int, mark: ComputeMark) -> Transfer:
        key = storage._cdata
        call = self.pending.pop(key)
        self.slots[slot] = call
        self._slot_of_key[key] = slot
        for record, _ in call.inputs:
            self.dependents.setdefault(record.key, set()).add(key)
        now = time.perf_counter()
        return Transfer(REPLAY_PATH, 0, interval=(now, now))

    def needs(self, slot: int) -> list:
        """Records that must be resident before copy_in: the replay's inputs."""
        return [record for record, _ in self.slots[slot].inputs]

    def copy_in(self, storage, slot: int, after_out: Transfer | None, mark: ComputeMark) -> Transfer:
        call = self.slots[slot]
        if not call.unwritten():
            raise stop(ReplayMismatch(f"an input of {call.record.id} was written while it was released: its replay "
                                      "would differ; run with --no-clean-copies if the job writes tensors outside "
                                      "ATen ops"))
        t0 = time.perf_counter()
        with _disable_current_modes(), torch.no_grad(), torch.autocast(self.device_type, enabled=False):
            _replay_into(call, storage)
        mark.forget()  # its kernels are queued: copies after them wait for them (tiers.py, Note [One
        # compute-stream event per group of copies])
        call.replays_left -= 1
        if call.replays_left > 0:
            self.pending[call.record.key] = call   # its next idle period replays it again
        return Transfer(REPLAY_PATH, storage.nbytes(), interval=(t0, time.perf_counter()))

    def release(self, slot: int, nbytes: int) -> None:
        call = self.slots.pop(slot, None)
        if call is None:
            return
        key = call.record.key
        self._slot_of_key.pop(key, None)
        for record, _ in call.inputs:
            keys = self.dependents.get(record.key)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.dependents[record.key]

    def read_host(self, slot: int, nbytes: int) -> None:
        """No bytes are kept: only the replay makes them."""
        return None

    def wait_device_frees(self) -> None:
        """Nothing copies out of device memory: nothing to wait for."""


def _replay_into(call: Call, storage) -> None:
    """Run the call again, its output landing in `storage` (Note [Replay])."""
    dtype, size, stride, offset = call.out_layout
    target = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)
    if call.func is torch.ops.aten._to_copy.default and set(call.kwargs) <= CAST_KWARGS:
        target.copy_(call.args[0])
        return
    out_overload = out_variant(call.func)
    if out_overload is not None:
        out_overload(*call.args, **call.kwargs, out=target)
        return
    made = tensors_in(call.func(*call.args, **call.kwargs), [])[call.out_index].untyped_storage()
    if made.nbytes() != storage.nbytes():
        raise stop(ReplayMismatch(f"replaying {call.func} made {made.nbytes()} bytes for {call.record.id}, "
                                  f"which has {storage.nbytes()}"))
    storage.copy_(made)


_out_variants: dict = {}


def out_variant(func):
    """The op's `out=` overload taking the same arguments plus one `out`, or None."""
    if func in _out_variants:
        return _out_variants[func]
    packet, name = func.overloadpacket, func._overloadname
    found = None
    for candidate in ("out",) if name == "default" else (f"{name}_out", "out"):
        overload = getattr(packet, candidate, None)
        if overload is None:
            continue
        schema = overload._schema
        args = [a.name for a in schema.arguments if not a.is_out]
        outs = [a for a in schema.arguments if a.is_out]
        if args == [a.name for a in func._schema.arguments] and len(outs) == 1 and len(schema.returns) == 1:
            found = overload
            break
    _out_variants[func] = found
    return found
