"""Which plan entries leave without a copy: the host pool still holds a current one.

Note [Clean entries]
The runtime keeps a storage's host pool slot after bringing it back, and releases the
storage again without copying while no op has written it since (engine Note [Clean copies]
in teraio_run/engine.py; the SSD tier keeps nothing). The planner models that: entry j of a
tensor is clean when the tensor's previous entry i went to the host pool and none of the
tensor's uses after i's copy-out, up to and including j's last use, wrote it (the trace's
use_writes: the ops' schemas). For a tensor that lives across iterations "previous" goes
round the cycle (one with one entry per iteration follows itself); one born in the iteration
is a new storage each time, so its first entry follows none. A clean entry moves no bytes
on the link: the device memory is free at once. The price is pool room: the slot stays held
while the tensor is back on the device, from i's next use until j's copy-out would have
started. Entries are marked largest first while the pool, with what the plan's entries hold
and the slots held so far, stays within --host-mem at every kernel; the runtime gives kept
slots back when its pool is short anyway, and the copy is then written as it would be
without `clean`. A frozen weight (LoRA's base) whose every entry is clean holds its slot for
the whole run and never crosses the link out again. Traces without use_writes (written
before it) and `--no-clean-copies` mark nothing.
"""

import numpy as np

from teraio.formats.plan import PlanEntry, PlannerInputs
from teraio.formats.trace import Trace
from teraio_plan.simulator import unroll_entry


def mark_clean(trace: Trace, inputs: PlannerInputs, entries: list[PlanEntry]) -> tuple[list[PlanEntry], int]:
    """(entries with `clean` set where Note [Clean entries] allows, host pool bytes needed)."""
    num_k = trace.num_kernels
    held_bytes = _pool_occupancy(entries, num_k)
    clean = set()
    if inputs.clean_copies and len(trace.use_writes) and num_k:
        index = {tensor_id: i for i, tensor_id in enumerate(trace.tensor_id)}
        for j, hold in sorted(_candidates(trace, index, entries, num_k), key=lambda c: -entries[c[0]].nbytes):
            nbytes = entries[j].nbytes
            if held_bytes[hold].max(initial=0) + nbytes <= inputs.host_mem_bytes:
                held_bytes[hold] += nbytes
                clean.add(j)
    marked = [e if e.clean == (j in clean) else e.model_copy(update={"clean": j in clean})
              for j, e in enumerate(entries)]
    return marked, int(held_bytes.max(initial=0))


def _pool_occupancy(entries: list[PlanEntry], num_k: int) -> np.ndarray:
    """Bytes each kernel's host pool holds for the entries: from the copy-out's start to the
    copy-in's end (the planner's count)."""
    unrolled = np.zeros(2 * num_k + 1, dtype=np.int64)
    for entry in entries:
        if entry.tier == "host":
            a, _, _, e = unroll_entry(entry, num_k)
            unrolled[a + 1] += entry.nbytes
            unrolled[e] -= entry.nbytes
    held = np.cumsum(unrolled[:2 * num_k])
    return held[:num_k] + held[num_k:]


def _candidates(trace: Trace, index: dict, entries: list[PlanEntry], num_k: int):
    """(entry index, kernels its slot stays held while the tensor is back) for every entry
    whose previous entry of the same tensor left a current copy in the pool."""
    by_tensor: dict[str, list[int]] = {}
    for j, entry in enumerate(entries):
        by_tensor.setdefault(entry.tensor, []).append(j)
    for tensor_id, rows in by_tensor.items():
        t = index.get(tensor_id)
        if t is None:
            continue
        lo, hi = trace.use_offsets[t], trace.use_offsets[t + 1]
        uses, writes = trace.use_kernels[lo:hi], trace.use_writes[lo:hi]
        rows.sort(key=lambda j: entries[j].offload_after)
        # A tensor born in the iteration is a new storage each time: its first entry follows none.
        previous_rows = [rows[-1], *rows[:-1]] if trace.born[t] < 0 else [None, *rows[:-1]]
        for before, j in zip(previous_rows, rows):
            if before is None:
                continue
            previous = entries[before]
            # A recompute entry moves nothing, and one after it finds no current copy in the pool.
            if previous.tier == "host" and entries[j].tier != "recompute" and not _written_between(uses, writes, previous.offload_after,
                                                               entries[j].offload_after, before == j):
                yield j, _held_kernels(previous, entries[j], num_k)


def _written_between(uses: np.ndarray, writes: np.ndarray, after: int, through: int, whole_cycle: bool) -> bool:
    """Whether a use in (after, through], going round the iteration, wrote the tensor."""
    if whole_cycle:
        return bool(writes.any())
    inside = (uses > after) & (uses <= through) if after < through else (uses > after) | (uses <= through)
    return bool(writes[inside].any())


def _held_kernels(previous: PlanEntry, entry: PlanEntry, num_k: int) -> np.ndarray:
    """Kernels from the previous entry's next use up to this entry's copy-out, round the iteration."""
    start = previous.needed_by % num_k
    end = entry.offload_after + 1
    if end <= start:
        end += num_k
    return np.arange(start, end) % num_k
