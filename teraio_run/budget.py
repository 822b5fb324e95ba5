"""Keeping the device within its budget: inputs back before each op, eviction on demand.

The budget keeper is what keeps a job exact and within its cap whether or not a plan is being
followed: it makes every op's inputs resident (the engine's one invariant), and when memory
grows past the budget it evicts the least recently used movable tensors, then, where that is not
enough, sends back what a plan prefetched ahead of its op (Note [Prefetches within the budget]).
The runtime uses it under a plan (teraio_run/agent.py) and the profiler uses it alone to profile
a job that does not fit its device (teraio_run/capped_profile.py).
"""

import sys
import time
from collections import OrderedDict
from itertools import compress
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import _disable_current_modes

from teraio.formats.trace import Kind
from teraio.raw_access import made_by_load
from teraio.walk import OOM_RETRIES, cuda_allocated_bytes, movable_other
from teraio_run.metrics import REFUSALS
from teraio_run.engine import MOVABLE_KINDS

_expired = torch.UntypedStorage._expired   # a storage's liveness by its weak pointer, in C
_swap_memory = getattr(torch.UntypedStorage, "_swap_data_ptr_", None)   # PyTorch 2.4 has none

MAX_CHECKS_SKIPPED = 64   # Note [Bounding the check]: an exact count at least this often
EVICT_TARGET = 0.85   # on-demand eviction frees down to this share of the budget, leaving
                      # room for the next op's outputs (on CUDA the cap is hard)


_rng_keeper = [None]   # a weak reference to the keeper whose storages set_rng_state may read


def _hold_rng_state_reads(keeper) -> None:
    """Note [RNG states are read raw]
    torch.set_rng_state(state) hands the tensor to the CPU generator, which reads its bytes
    through their pointer, no ATen op on the way: a state the keeper had moved out read as
    unallocated ("The tensor has a non-zero number of elements, but its data is not allocated
    yet"). A resumed job's torch.load'ed RNG state is kind `other`, movable as torch.load's
    (Note [Storages torch.load made]), and once the storages the job made moved too (Note
    [Storages the job made] in teraio/walk.py) the eviction order reached it before the script set it
    (tests/test_resume.py). So on the CPU (on CUDA the state is a host tensor the walk never
    records, and torch.cuda.set_rng_state clones it with an op first) the call holds its
    storage as a storage copy does (Note [Held for a copy]). Generator.set_state called
    directly cannot be wrapped (a C type) and is not held: such a state goes inside
    `teraio.resident()`. Belongs with the other raw reads in teraio/raw_access.py."""
    import functools
    import weakref

    import torch.random

    _rng_keeper[0] = weakref.ref(keeper)
    plain = torch.random.set_rng_state
    if getattr(plain, "__teraio_held__", False):
        return

    @functools.wraps(plain)
    def set_rng_state(new_state):
        holder = _rng_keeper[0]() if _rng_keeper[0] is not None else None
        if holder is None or not isinstance(new_state, torch.Tensor):
            return plain(new_state)
        with holder.held_for_copy(new_state.untyped_storage()):
            return plain(new_state)

    set_rng_state.__teraio_held__ = True
    for module in (torch, torch.random):
        if module.set_rng_state is plain:
            module.set_rng_state = set_rng_state


class BudgetKeeper:
    def __init__(self, engine, walk, budget_bytes: int, cuda: bool):
        self.engine = engine
        self.walk = walk
        self.budget_bytes = budget_bytes
        self.cuda = cuda
        self.holds = 0                       # open resident() blocks: nothing leaves the device
        self.recency: OrderedDict[int, None] = OrderedDict()  # storage keys, least recently used first
        self.peak_bytes = 0
        self.iteration_peak_bytes = 0        # the same since the iteration began (take_iteration_peak)
        self.grew = False                    # a prefetch or restore since the last budget check
        self._ddp = None                     # whether the model is wrapped in DDP, known at the first gradient
        self.unwritten: set[int] = set()     # storages allocated without a write, not yet an op's input
        self.said_over_budget = False        # Note [Over the budget, said once]
        self.held_peak_bytes = 0             # Note [Over the budget while held]: the most resident in holds
        self.said_over_in_holds = False      # the same, said once apart: a mid-run save must not silence the op's
        # Note [Bounding the check]: resident bytes at the last exact count, and the running
        # totals of bytes made and brought back then
        self._resident_at_count = 0
        self._created_at_count = 0
        self._restored_at_count = 0
        self._released_at_count = 0
        self._checks_skipped = 0
        # Note [Counting resident bytes]: the storages that may still be alive, as weak references
        # (which keep their pointers valid), pointers and sizes; the sum of those sizes
        self._watched_refs, self._watched_cdata, self._watched_nbytes = [], [], []
        self._watched_bytes = 0
        if not cuda:  # on CUDA the allocator counts
            self._watch(list(walk.records.values()))
            walk.births = []   # the walk's new records, taken at each count
            _hold_rng_state_reads(self)

    # ----- per op ---------------------------------------------------------------------------
    def restore_inputs(self, inputs, cause: str) -> bool:
        """Before an op: every input resident (polling the copies in flight first). True when
        one had to come back, i.e. the op waited for data."""
        engine = self.engine
        if engine.copying_out or engine.releasing or engine.in_flight or engine.died:
            engine.poll(self.walk.records)
        waited = False
        if engine.moved:
            for record in inputs:
                if record.key in engine.moved:
                    waited = True
                    self._restore(record, inputs, cause)
        if self.unwritten:
            for record in inputs:
                self.unwritten.discard(record.key)
        recency = self.recency
        to_end = recency.move_to_end
        for record in inputs:
            try:
                to_end(record.key)
            except KeyError:  # first met as an input (made before the walk, or outside ATen)
                recency[record.key] = None
        self.grew = self.grew or waited
        return waited

    def _restore(self, record, inputs, cause: str) -> None:
        """One storage back on the device. On CUDA the cap is hard: a bring-back that finds no
        room relieves memory as an op's own allocation does (Note [Out of memory]) and retries.
        Outside an op too (a raw read, the saves inside resident()): a capped profile's clone
        of a moved tensor failed there, its 2 MiB the cap's last (H200, a69bf54)."""
        for attempt in range(OOM_RETRIES + 1):
            try:
                self.engine.ensure_resident(record, cause)
                return
            except torch.OutOfMemoryError:  # this op needs it: relieve as for an op, retry
                if attempt == OOM_RETRIES:
                    raise
                self.relieve_memory(inputs, attempt)

    def hold_unwritten(self, new) -> None:
        """Note [Outputs read raw later] in teraio/walk.py: storages allocated without a write
        stay until an op takes them as an input."""
        self.unwritten.update(record.key for record in new)

    def after_op(self, inputs, new) -> None:
        recency = self.recency
        for record in new:
            recency[record.key] = None
        if new or self.grew:  # else resident memory cannot have grown since the last check
            self.grew = False
            self._keep_budget(inputs + new)

    def movable(self, record, kind: Kind) -> bool:
        """Whether a storage may leave the device, `kind` being what the trace (for a plan
        action) or the walk (for an eviction) says it is. The walk learns that a storage is
        a gradient only at the optimizer step, after its offload was due: for plan actions
        the trace's kind is the one to trust.

        Note [DDP gradients]: DistributedDataParallel's reducer copies reduced buckets back
        into .grad from its communication threads, where no dispatch mode runs, so a
        gradient we had released would be written through a dangling pointer. Under DDP
        gradients stay on the device; everything else still moves.

        Under FSDP2 every kind moves: parameter shards, gradients and optimizer state are
        DTensors whose local shards the walk names (Note [Tensor subclasses]); a collective's
        tensors wait until it has completed (Note [Collective buffers]); only the parameters
        FSDP2 all-gathers, whose storages it frees and re-allocates itself, are pinned
        (Note [FSDP2 unsharded parameters], all in teraio/walk.py)."""
        return self.refusal(record, kind) is None

    def refusal(self, record, kind: Kind) -> str | None:
        """Why a storage may not leave the device (movable), or None: one of REFUSALS' keys."""
        if record.pinned:
            return "pinned"
        if kind not in MOVABLE_KINDS and not (kind == Kind.other and movable_other(record)):
            return "kind"   # Note [Storages the job made] in teraio/walk.py
        if record.in_collective():
            return "collective"
        if record.key in self.unwritten:
            return "unwritten"
        storage = record.storage()
        if storage is not None and not self.cuda and storage.is_shared():  # (CUDA's all say shared)
            return "shared"
        if storage is not None and not storage.resizable() and not self._own_loaded(storage):
            return "not_resizable"
        if kind == Kind.gradient and self._ddp is None:
            self._ddp = self.walk.wrapped_in_ddp()
        return "ddp_gradient" if kind == Kind.gradient and self._ddp else None

    def _own_loaded(self, storage) -> bool:
        """Note [Storages torch.load made]
        On the CPU the storages torch.load makes hold its own memory, not the allocator's: the
        bytes it read from the file, or (mmap=True) a private mapping of the file. They are not
        resizable, so resize_(0) cannot free them, and optimizer.load_state_dict keeps those very
        tensors as the optimizer state (the script's loaded dict holds them too): a resumed job's
        AdamW state never left, every plan offload of it was refused and the run passed its
        budget (tests/test_resume.py). So when the keeper is about to let one go, it gives it
        memory of the allocator's first: a fresh storage, the bytes copied in, and the two
        storages' memory swapped (UntypedStorage._swap_data_ptr_, which takes the allocator and
        the resizable flag along). The storage object stays the same, so every tensor and view
        of it (the optimizer's, the script's dict's, those saved for backward) reads the same
        bytes at the new address, and torch.load's memory goes with the stand-in. A copy of
        bytes, once, at the storage's first move: training stays bit for bit. For the length of
        the copy the storage is there twice (host memory on a CPU run, which the budget counts
        once).
        Until the job's first step the walk cannot name loaded optimizer state (it learns of an
        optimizer at its step, and of parameter names at the model's first call), and what the
        script keeps of its checkpoint (the loaded dict's weights, copied into the model) it
        never names: kind `other`, which moves only when an op the walk saw made it (Note [Storages
        the job made]; torch.load made these outside ATen), so the whole loaded state stayed from the load on (1.03
        MiB of a 592 KiB budget in tests/test_resume.py, before the first forward). A storage
        torch.load made is the job's own state, read by ops and by the savers we guard like a
        parameter, never a buffer that threads use outside ops (what keeps `other` in place:
        Note [Collective buffers] in teraio/walk.py), so it may move whatever its kind.
        Only storages torch.load made are swapped (teraio/raw_access.py marks them as it restores
        them, also before the agent starts), and those over a private mapping of a file, which is
        how safetensors loads (from_pretrained: Note [Private file mappings] in
        teraio/raw_access.py). Other CPU storages that are not resizable belong to
        something that still reads and writes that memory (torch.from_numpy's array,
        torch.frombuffer's buffer, a DLPack producer), which would stop seeing the tensor's
        writes: they stay refused (`not_resizable`), as do shared-memory storages (`shared`,
        checked before). A map_location function that hands torch.load's storage back as it is
        (`lambda storage, loc: storage`, how Lightning loads every checkpoint) leaves the
        deserializers unasked: what it hands back unchanged is marked too, through
        torch.serialization._get_restore_location (a private function: where a torch lacks it,
        such storages stay refused, `not_resizable`, as before). With mmap=True the mapping is
        private by default (MAP_PRIVATE): no one else sees those bytes either; the copy reads
        the file's pages once, and a tensor that never leaves keeps its mapping and costs
        nothing. A MAP_SHARED mapping (set_default_mmap_options) writes through to the file and
        is not marked. On CUDA there is nothing to do: torch.load's deserializer copied the
        bytes into the caching allocator's memory, and the keeper never swaps there."""
        if self.cuda or _swap_memory is None or not made_by_load(storage):
            return False
        with _disable_current_modes():   # the copy is no op of the job's
            fresh = torch.UntypedStorage(storage.nbytes())
            fresh.copy_(storage)
            _swap_memory(storage, fresh)  # fresh holds torch.load's memory now, freed as it goes
        return True

    def relieve_memory(self, inputs, attempt: int = 0) -> bool:
        """Note [Out of memory]: the cap counts memory the allocator reserves, which is more
        than what tensors hold (blocks still read by a copy, fragments), so an op can fail
        while our count is within budget. Relieve it in stages, cheapest first: (0) wait for
        the copies in flight and return cached segments; (1) also evict down to the eviction
        target; (2+) evict down to half the budget. Each stage lets the op retry once."""
        self.engine.stats.oom_retries += 1
        t0 = time.perf_counter()
        with _disable_current_modes():
            self.engine.wait_offloads(self.walk.records)
            self.engine.wait_freeing()
            if attempt >= 1 and not self.holds:  # inside resident() nothing may leave
                target = int(self.budget_bytes * (EVICT_TARGET if attempt == 1 else 0.5))
                self._evict(self.resident_bytes(), {r.key for r in inputs}, target=target)
                self.engine.wait_freeing()  # the allocator reuses those blocks only after the copies
            if self.cuda:
                torch.cuda.empty_cache()
        self.engine.stats.stall("out_of_memory", "(out of memory)", time.perf_counter() - t0)
        return True

    # ----- memory ---------------------------------------------------------------------------
    def resident_bytes(self) -> int:
        engine = self.engine
        self._created_at_count = self.walk.created_bytes
        self._restored_at_count, self._released_at_count = engine.restored_bytes, engine.released_bytes
        self._checks_skipped = 0
        if self.cuda:
            # The allocator stops counting a block as allocated when it is freed, also one a
            # side-stream copy still reads (record_stream); until that copy is done the block
            # still counts against the cap (Note [Out of memory]).
            self._resident_at_count = cuda_allocated_bytes()
            return self._resident_at_count
        self._resident_at_count = self._live_bytes() - self.engine.offloaded_now
        return self._resident_at_count

    def _live_bytes(self) -> int:
        """Note [Counting resident bytes]: the walk keeps a record of every storage it met until
        the iteration ends, also those freed since (a third to a half of an iteration's records
        by its backward pass), and summing its records looked at each through three Python
        attribute reads. The keeper watches the storages the walk made since the last count and
        those alive at it, as flat lists: one C call per storage tells which died, and their
        bytes leave the sum. A storage dead at one count stays dead (the weak reference keeps
        its pointer from being reused by another storage), so the sum is the same."""
        births = self.walk.births
        if births:
            self._watch(births)
            births.clear()
        gone = list(map(_expired, self._watched_cdata))
        if any(gone):
            alive = [not g for g in gone]
            self._watched_bytes -= sum(compress(self._watched_nbytes, gone))
            self._watched_refs = list(compress(self._watched_refs, alive))
            self._watched_cdata = list(compress(self._watched_cdata, alive))
            self._watched_nbytes = list(compress(self._watched_nbytes, alive))
        return self._watched_bytes

    def _watch(self, records) -> None:
        refs = [record.ref for record in records]
        nbytes = [record.nbytes for record in records]
        self._watched_refs += refs
        self._watched_cdata += [ref.cdata for ref in refs]
        self._watched_nbytes += nbytes
        self._watched_bytes += sum(nbytes)

    def _resident_at_most(self) -> int:
        """Note [Bounding the check]: the exact count costs a sum over every record on the CPU
        (60-69% of the walk and agent's time on a 12-layer job: bench/host_cost.py) and a call
        that builds the allocator's ~120 statistics into Python dicts on CUDA, once per op.
        Resident bytes grow only by storages made (the walk counts their bytes) and storages
        brought back (the engine counts those); deaths and releases only take bytes away. So
        the last exact count plus what was made and brought back since (less what was released,
        on the CPU) bounds them from above:
        while that bound is within the budget and the peak seen, neither can be exceeded, and
        the count is skipped. Growth the walk does not see (a storage resized in place, memory
        taken outside ATen) is caught by a count at least every MAX_CHECKS_SKIPPED ops, and on
        CUDA by the out-of-memory relief (the cap is the allocator's)."""
        made = self.walk.created_bytes - self._created_at_count
        restored = self.engine.restored_bytes - self._restored_at_count
        # On the CPU a release frees at once; on CUDA the block counts until its copy is done.
        released = 0 if self.cuda else self.engine.released_bytes - self._released_at_count
        return self._resident_at_count + made + restored - released

    def _keep_budget(self, in_use) -> None:
        if (self._checks_skipped < MAX_CHECKS_SKIPPED
                and self._resident_at_most() <= min(self.peak_bytes, self.budget_bytes or self.peak_bytes)):
            self._checks_skipped += 1
            return
        resident = self.resident_bytes()
        if resident > self.budget_bytes > 0 and self.engine.copying_out:
            resident = self._wait_for_offloads()
        if resident > self.budget_bytes > 0 and not self.holds:
            resident = self._evict(resident, {r.key for r in in_use})
        if resident > self.budget_bytes > 0 and not self.holds and not self.said_over_budget:
            self._say_over_budget(resident, in_use)
        if self.holds:
            self.held_peak_bytes = max(self.held_peak_bytes, resident)
        self.peak_bytes = max(self.peak_bytes, resident)
        self.iteration_peak_bytes = max(self.iteration_peak_bytes, resident)

    def _say_over_budget(self, resident: int, in_use) -> None:
        """Note [Over the budget, said once]: evicting what may move did not bring the device
        within its budget. Said once, at the first such op, naming what held the memory: the op's
        own inputs and outputs (the most one op needs at once: a foreach op over an EMA's every
        tensor) and what never moves, by reason (Note [Refused plan actions] in
        teraio_run/metrics.py). The report counts it in the peak it gives against the budget
        (peak_device_bytes, and resident_peak_bytes per iteration)."""
        from teraio.units import format_bytes

        self.said_over_budget = True
        moved, own, kept = self.engine.moved, {r.key for r in in_use}, {}
        own_bytes = sum(r.nbytes for r in in_use if r.key not in moved and not r.ref.expired())
        for record in self.walk.records.values():
            if record.key in own or record.key in moved or record.ref.expired():
                continue
            reason = self.refusal(record, record.kind)
            if reason is not None:
                kept[reason] = kept.get(reason, 0) + record.nbytes
        largest = max((r for r in in_use if r.key not in moved), key=lambda r: r.nbytes, default=None)
        never = ", ".join(f"{REFUSALS[why].label} {format_bytes(n)}"
                          for why, n in sorted(kept.items(), key=lambda kv: -kv[1]))
        print(f"teraio: warning: the device holds {format_bytes(resident)}, over its budget of "
              f"{format_bytes(self.budget_bytes)}, after kernel {self.walk.kernel - 1} of iteration "
              f"{self.walk.iteration}: that op's own tensors take {format_bytes(own_bytes)}"
              + (f" (the largest {largest.id}, {format_bytes(largest.nbytes)})" if largest is not None else "")
              + (f" and storages that may not move {format_bytes(sum(kept.values()))} ({never})" if kept else "")
              + "; said once, the report's peak says by how much (a larger --gpu-mem, or smaller ops)",
              file=sys.stderr)

    def take_iteration_peak(self) -> int:
        """The most resident bytes counted since the last call (the run report's per-iteration
        row). Counts are skipped while they cannot pass the budget or the run's peak (Note
        [Bounding the check]), so this is a lower bound of the iteration's own peak, exact for
        an iteration that set the run's."""
        peak, self.iteration_peak_bytes = self.iteration_peak_bytes, 0
        return peak

    def _wait_for_offloads(self) -> int:
        """Over budget while planned copies are still going out: they are what the plan
        counted on, so wait for them before evicting anything it did not plan."""
        t0 = time.perf_counter()
        self.engine.wait_offloads(self.walk.records)
        self.engine.stats.stall("memory_short", "(waiting for offloads)", time.perf_counter() - t0)
        return self.resident_bytes()

    def _evict(self, resident: int, protected: set, target: int | None = None) -> int:
        """Belady needs the future; in an unplanned stretch we only know the past, so evict
        the least recently used movable tensors, synchronously (counted as a stall). The keys
        are kept in order of use, so this walks from the least recent on and stops at the
        target, instead of sorting every record; the evicted (and the dead met on the way) leave
        the order until next used."""
        t0 = time.perf_counter()
        target = int(self.budget_bytes * EVICT_TARGET) if target is None else target
        with self.engine.compute_mark:  # one event for the copies (Note [One compute-stream event ...] in tiers.py)
            leaving = self._offload_least_recent(resident, protected, target)
        for key in leaving:
            del self.recency[key]
        self.engine.wait_offloads(self.walk.records)
        resident = self.resident_bytes()
        if resident > self.budget_bytes:
            resident = self._defer_prefetches(resident, protected)
        self.engine.stats.stall("memory_short", "(on-demand eviction)", time.perf_counter() - t0)
        return resident

    def _offload_least_recent(self, resident: int, protected: set, target: int) -> list[int]:
        """Start offloads from the least recently used on until `target`; the keys that leave
        the order (offloaded, or freed by the job)."""
        records, moved, leaving = self.walk.records, self.engine.moved, []
        for key in self.recency:
            if resident <= target:
                break
            record = records.get(key)
            if record is None or record.ref.expired():
                leaving.append(key)  # freed by the job: it leaves the order too
                continue
            if key in protected or key in moved or not self.movable(record, record.kind):
                continue
            if self.engine.offload(record, "host"):
                self.engine.stats.evictions += 1
                resident -= record.nbytes
                leaving.append(key)
        return leaving

    def _defer_prefetches(self, resident: int, protected: set) -> int:
        """Note [Prefetches within the budget]: a storage that a plan's prefetch brought back
        before the op that needs it counts as resident, but it is the engine's (prefetching)
        until that op, out of the eviction's reach. At a kernel whose own tensors fill the
        budget (the least a job needs at all, teraio_plan/memory.py kernel_need_bytes), the
        prefetches for the next kernels passed the budget that unplanned iterations keep:
        557,592 bytes of 541,968 for tests/clients/sparse_graph.py, 900 KiB of 809 KiB for
        spectral.py. So where evicting what the LRU order offers does not make room, they go
        back (their bytes are still in their slots) and come back at their op, a stall counted
        as for any prefetch not done: a plan may cost time, never the budget."""
        for key in self.engine.moved:  # deferring changes states, not keys
            if resident <= self.budget_bytes:
                break
            if key not in protected:
                resident -= self.engine.defer_prefetch(key)
        return self.resident_bytes()

    def release_dead_moved(self) -> None:
        """Storages the job freed while they were out: their slots and counts go. (Under a
        plan the agent forgets every dead record at the iteration end instead; the profiler
        keeps its records.)"""
        records = self.walk.records
        with _disable_current_modes():
            self.engine.forget_dead([key for key in self.engine.moved
                                     if key not in records or records[key].ref.expired()])

    def forget(self, dead) -> None:
        """Storages freed by the job (records the walk dropped)."""
        self.engine.forget_dead([r.key for r in dead])
        for record in dead:
            self.recency.pop(record.key, None)
            self.unwritten.discard(record.key)

    # ----- raw reads ------------------------------------------------------------------------
    @contextmanager
    def resident(self):
        """Every tensor on the device, and none leaving, until the block ends: for code that
        reads memory without an ATen op (a checkpoint writer). It needs the whole working set
        to fit the device; the budget is checked again after the block."""
        with self.holding():
            self._used_outside_ops(list(self.engine.moved))
            for record in self.engine.still_moved(self.walk.records):
                self.bring_back(record, "restore_all")
            yield

    @contextmanager
    def holding(self):
        """Note [Over the budget while held]
        While a save reads the job's tensors (resident(), torch.save from the tiers) nothing may
        leave the device: a tensor sent out mid-read would be read as whatever reuses its memory.
        What the save's own ops make stays too: transformers 5's save_pretrained of a mixture of
        experts makes per-expert copies of the fused expert weights, and at a quarter of the peak
        the device went 31% over its budget in the save alone, every iteration within it, with
        nothing said until the summary, which blamed a larger iteration. So the most the device
        held in holds is kept (the report's peak_in_saves_bytes) and said once, at the hold's end,
        naming the save as the cause."""
        self.holds += 1
        try:
            yield
        finally:
            self.holds -= 1
            if not self.holds and self.held_peak_bytes > self.budget_bytes > 0 and not self.said_over_in_holds:
                self.said_over_in_holds = True
                from teraio.units import format_bytes
                print(f"teraio: warning: the device held {format_bytes(self.held_peak_bytes)}, over its budget of "
                      f"{format_bytes(self.budget_bytes)}, while a save read the job's tensors (nothing leaves the "
                      "device during one, and what its ops made stayed); said once: to keep the budget there too, "
                      f"plan with a --gpu-mem {format_bytes(self.held_peak_bytes - self.budget_bytes)} lower",
                      file=sys.stderr)

    @contextmanager
    def held_for_copy(self, storage):
        """Note [Held for a copy]
        A copy of this storage sized by its nbytes() before any op runs (teraio/raw_access.py:
        a clone, a cpu copy, a storage's copy_): it comes back first, and it does not leave until
        the copy returns. The copy runs ops of its own (an empty storage, a set_, the copy), and
        the budget check after one of them sent the storage out again before the copy read it
        (copy.deepcopy of a state dict failed, "size of tensor a (65536) must match the size of
        tensor b (0)"). Only the held storages stay (the engine refuses to offload them, for the
        plan and for an eviction alike): the hold used to stop every eviction, and copy.deepcopy
        of a state dict runs all its ops inside holds (one per tensor, nested in the storage's
        copy_), so a snapshot of the optimizer's state grew the device by its whole size before
        the keeper could evict anything (tests/test_unnamed_copies.py). It may leave again
        afterwards."""
        record = self.walk.records.get(storage._cdata)
        if record is not None:
            self._used_outside_ops([record.key])
            self.bring_back(record)
        key = storage._cdata
        self.engine.hold(key)
        try:
            yield
        finally:
            self.engine.unhold(key)

    def bring_back(self, record, cause: str = "raw_read") -> None:
        """A storage read outside an op, back on the device (retried as an op's input would be)."""
        with _disable_current_modes():
            self._restore(record, [record], cause)

    def _used_outside_ops(self, keys) -> None:
        """Note [Brought back outside an op]
        An eviction takes its storages out of the LRU order until an op uses them again (_evict),
        and only ops put them back (restore_inputs, after_op). A raw read brings a storage back
        with no op (a tensor's repr or tolist, a clone, the saves inside resident()): it was
        resident, movable and out of the eviction's reach until its next op. A loop that logs
        its AdamW state with rich after every step brought back the state evicted the step
        before, and the backward went 10% over its budget with nothing to evict
        (tests/clients/logged_state.py). Such a storage is used now, the most recently."""
        recency = self.recency
        for key in keys:
            recency[key] = None
            recency.move_to_end(key)

    def pin_for_raw_read(self, tensor) -> None:
        """A raw pointer to this storage leaves PyTorch (Tensor.numpy, DLPack) and may be read
        at any later time: bring it back and never move it again."""
        record = self.walk.records.get(tensor.untyped_storage()._cdata)
        if record is None:
            return
        self.bring_back(record)
        record.pinned = True
