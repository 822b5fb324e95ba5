"""The migration engine: moves storages out of device memory and back, never losing a byte.

Invariant: an op never runs on a storage that is not fully resident. `ensure_resident` is
called for every input of every op (the walk's before_op) and is the only thing correctness
rests on; plan actions are performance hints layered on top.

A storage leaves device memory by `untyped_storage().resize_(0)` after its bytes are safely
in a tier, and comes back by `resize_(nbytes)` and a copy in: every view and every
saved-for-backward reference sees the data again (docs/design.md, Moving a tensor out and back).

States: resident -> (copy out) offloading -> offloaded -> (copy in) prefetching -> resident,
and lost: a swap file that could not be read back (Note [Lost swap files]).

Note [Clean copies]
A storage brought back from a tier leaves its bytes there: the slot is kept (a `Kept`), with
the storage's write count then (Note [Writes] in teraio/walk.py). When the storage is to leave
again and no op has written it since, its device memory is released without a copy: the
tier's bytes are still its bytes. Weights are read between the optimizer steps that write
them (forward, backward, the micro-batches of gradient accumulation), frozen ones (LoRA's
base) never written: their copies out after the first cost nothing. A written storage's kept
copy is dropped at its next offload; kept copies give way, oldest first, when a tier has no
room for a new one; a storage that dies gives its kept copy back (its weak reference's
callback, as in Note [Died while out]). Only the host pool keeps copies: swap files kept too
could fill a disk whose room was checked for the plan's files only. `teraio run
--no-clean-copies` turns this off for jobs that write tensors without ATen ops.

Note [Lost swap files]
A swap file that vanished (its folder removed while the job runs) holds bytes that exist
nowhere else: training cannot go on exactly. The op that needs the tensor raises
SwapDataLost, one line naming the tensor and the file, and so does every later op that needs
it (a script that catches the error cannot train on garbage). It is raised inside the
dispatch mode, possibly in an autograd thread; autograd re-raises it in the thread that
called backward(), so it reaches the script's top level like any error of the job. There a
hook installed at the first loss prints the one line instead of a traceback through the
job's, PyTorch's and our frames (teraio_run/stops.py), and Python exits with
status 1 after the atexit handlers: the report is written and counts the loss. A script that
swallows the error still exits with status 1 (teraio_run/report.py, finish).
"""

import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

import torch

from teraio.formats.trace import Kind
from teraio_run.stops import CannotGoOnExactly, stop
from teraio_run.tiers import ComputeMark, CopyFailed, Tier, Transfer

RESIDENT, OFFLOADING, OFFLOADED, PREFETCHING = "resident", "offloading", "offloaded", "prefetching"
LOST = "lost"
MOVABLE_KINDS = (Kind.parameter, Kind.gradient, Kind.optimizer_state, Kind.activation)
TIER_NAMES = ("host", "ssd", "recompute")
# where an offload planned for a tier goes, in order, when that tier has no room
PLACEMENT = {"host": ("host", "ssd"), "ssd": ("ssd", "host"), "recompute": ("recompute",)}


@dataclass
class Moved:
    """Engine state of one storage that has left (or is leaving) device memory."""

    tier: Tier
    slot: int
    nbytes: int
    state: str
    transfer: Transfer | None
    storage: torch.UntypedStorage | None   # strong ref only while a copy reads or writes it
    watch: object = None                   # weak ref whose callback says the job freed it
    writes: int = 0                        # the storage's write count when its bytes were copied out


@dataclass
class Kept:
    """A tier's copy of a storage that is back on the device (Note [Clean copies])."""

    tier: Tier
    slot: int
    nbytes: int
    writes: int             # the storage's write count when its bytes were copied out
    copy_in: Transfer       # the copy that brought it back: the slot is read until it is done
    watch: object = None    # weak ref whose callback says the job freed it


@dataclass
class Stats:
    offloaded_bytes: dict = field(default_factory=lambda: dict.fromkeys(TIER_NAMES, 0))   # device bytes released
    written_bytes: dict = field(default_factory=lambda: dict.fromkeys(TIER_NAMES, 0))     # copied into the tier
    prefetched_bytes: dict = field(default_factory=lambda: dict.fromkeys(TIER_NAMES, 0))  # brought back (replayed)
    stall_count: int = 0
    stall_ms: dict = field(default_factory=dict)       # cause -> ms
    stalls_by_tensor: dict = field(default_factory=dict)
    deadline_misses: int = 0
    cancelled_offloads: int = 0
    io_errors: int = 0        # copies that failed: writes to a closed folder, reads of a lost file
    lost_tensors: dict = field(default_factory=dict)  # tensor id -> the swap file it could not be read from
    closed_dirs: dict = field(default_factory=dict)   # swap folder -> why it takes no more writes
    ssd_to_host_bytes: int = 0  # offloads planned for the SSD that went to the host pool: no folder took writes
    skipped: int = 0
    evictions: int = 0
    oom_retries: int = 0
    other_tier_bytes: int = 0  # offloads placed on the SSD tier: the host pool had no room
    offloaded_bytes_by_kind: dict = field(default_factory=dict)  # parameter, gradient, ... -> bytes
    copies_issued: int = 0       # copies out and in started on the job's thread (replays not counted)
    copy_issue_ms: float = 0.0   # host time starting them, re-allocations for copies in included
    replays: int = 0             # ops replayed for recompute entries (teraio_run/replay.py)
    replay_ms: float = 0.0       # host time replaying them, re-allocating their outputs included
    restore_alloc_ms: float = 0.0  # host time re-allocating device memory to bring storages back (replays too)

    def stall(self, cause: str, tensor_id: str, seconds: float) -> None:
        self.stall_count += 1
        self.stall_ms[cause] = self.stall_ms.get(cause, 0.0) + seconds * 1e3
        self.stalls_by_tensor[tensor_id] = self.stalls_by_tensor.get(tensor_id, 0.0) + seconds * 1e3


class PathMeter:
    """Bytes moved and time busy per path (d2h, h2d, d2s, s2d), for the achieved bandwidth.
    Stream copies on one path run one after another, so their durations add up; only a sample
    of them is timed (Note [Timing a sample of the copies] in teraio_run/tiers.py), and a
    path's busy time is its bytes at the timed copies' rate. Thread copies overlap, so their
    busy time is the union of their intervals (taken in the order they finish, close enough to
    the order they start)."""

    def __init__(self):
        self.nbytes = dict.fromkeys(("d2h", "h2d", "d2s", "s2d"), 0)
        self._thread_busy_s = dict.fromkeys(self.nbytes, 0.0)
        self._busy_until = dict.fromkeys(self.nbytes, 0.0)
        self._timed_nbytes = dict.fromkeys(self.nbytes, 0)     # stream copies that were timed
        self._timed_s = dict.fromkeys(self.nbytes, 0.0)
        self._stream_nbytes = dict.fromkeys(self.nbytes, 0)    # every stream copy

    def add(self, transfer: Transfer) -> None:
        path = transfer.path
        if path not in self.nbytes:
            return  # a replay (teraio_run/replay.py): no link carried it
        if transfer.event is not None:  # a stream copy: it cannot fail
            self.nbytes[path] += transfer.nbytes
            self._stream_nbytes[path] += transfer.nbytes
            interval = transfer.interval_s()
            if interval is not None:
                self._timed_nbytes[path] += transfer.nbytes
                self._timed_s[path] += interval[1] - interval[0]
            return
        interval = transfer.interval_s()
        if interval is None:
            return  # failed: nothing was moved
        start, end = interval
        self.nbytes[path] += transfer.nbytes
        self._thread_busy_s[path] += max(0.0, end - max(start, self._busy_until[path]))
        self._busy_until[path] = max(self._busy_until[path], end)

    @property
    def busy_s(self) -> dict[str, float]:
        busy = dict(self._thread_busy_s)
        for path, timed in self._timed_nbytes.items():
            if timed:
                busy[path] += self._stream_nbytes[path] * self._timed_s[path] / timed
        return busy

    def achieved_gbps(self) -> dict[str, float]:
        busy = self.busy_s
        return {path: round(self.nbytes[path] / busy[path] / 1e9, 3) for path in self.nbytes if busy[path] > 0}


class MigrationEngine:
    def __init__(self, host_tier: Tier | None, ssd_tier: Tier | None, cuda: bool, keep_clean: bool = True,
                 replay_tier: Tier | None = None):
        self.tiers = {"host": host_tier, "ssd": ssd_tier, "recompute": replay_tier}
        self.cuda = cuda
        self.keep_clean = keep_clean
        self.kept: dict[int, Kept] = {}     # storage key -> its tier copy, oldest first (Note [Clean copies])
        self.moved: dict[int, Moved] = {}   # storage key -> state, for storages not plainly resident
        self.stats = Stats()
        self.offloaded_now = 0              # device bytes currently released by us
        self.restored_bytes = 0             # device bytes re-allocated to bring storages back, ever
        self.released_bytes = 0             # device bytes released by copies out, ever
        self.releasing: deque[Moved] = deque()  # back on the device, slot still read by a stream copy
        self.copying_out: dict[int, Moved] = {}  # OFFLOADING: copied out, device memory not yet released
        # Keys of copying_out per tier in issue order: copies of one tier finish about in
        # order, so poll() looks only at the oldest of each (O(1) per op, not O(copies)).
        self._out_order: dict[str, deque[int]] = {"host": deque(), "ssd": deque()}
        self.in_flight: deque[Transfer] = deque()  # every copy, until measured (oldest first)
        self.died: list[tuple[int, weakref.ref]] = []  # freed by the job while out (Note [Died while out])
        self.held: dict[int, int] = {}  # storage key -> open raw reads of it: it does not leave (Note [Held for a copy])
        self.meter = PathMeter()
        # `with engine.compute_mark:` around a group of copies: Note [One compute-stream event per group of copies]
        self.compute_mark = ComputeMark(cuda)

    # ----- the correctness path ------------------------------------------------------------
    def ensure_resident(self, record, cause: str) -> None:
        moved = self.moved.get(record.key)
        if moved is None:
            return
        if moved.state == LOST:
            raise SwapDataLost(lost_message(record.id, self.stats.lost_tensors[record.id]))
        t0 = time.perf_counter()
        if moved.state == OFFLOADING:
            self._cancel_offload(record, moved)
        else:
            if moved.state == PREFETCHING and not moved.transfer.done():
                self.stats.deadline_misses += 1  # started, but not back by the kernel that needs it
            if moved.state == OFFLOADED:
                self._start_prefetch(record, moved)
                cause = cause if cause.startswith("replay") else "not_prefetched"
            self._finish_prefetch(record, moved)
        waited = time.perf_counter() - t0
        self.stats.stall(cause, record.id, waited)

    def hold(self, key: int) -> None:
        """Note [Held for a copy] in teraio_run/budget.py: this storage stays until unhold."""
        self.held[key] = self.held.get(key, 0) + 1

    def unhold(self, key: int) -> None:
        left = self.held.pop(key) - 1
        if left:
            self.held[key] = left

    def _cancel_offload(self, record, moved: Moved) -> None:
        """The op stream touched a tensor we were copying out (the plan did not foresee it):
        keep it on the device and drop the copy; the data was never released. A write that
        failed closed its folder all the same: said here too, or a copy that fails after the
        keeper's last poll and is cancelled before the next hides it."""
        if moved.transfer is not None and moved.transfer.wait() is not None:
            self.stats.io_errors += 1
            self._say_closed_dirs(moved.tier)
        self._release_slot(moved)
        del self.moved[record.key]
        self.copying_out.pop(record.key, None)
        self.stats.cancelled_offloads += 1

    # ----- plan actions --------------------------------------------------------------------
    def offload(self, record, tier_name: str) -> bool:
        """Start moving a storage out (the caller decided it may move); False if it cannot."""
        if record.key in self.moved or record.key in self.held:
            return False
        storage = record.storage()
        if storage is None or storage.nbytes() == 0 or not storage.resizable():
            self.stats.skipped += 1
            return False
        kept = self.kept.pop(record.key, None)
        if kept is not None:
            current = kept.writes == record.writes and kept.watch() is storage and kept.nbytes == storage.nbytes()
            if current and tier_name != "recompute":  # a planned replay needs no link: the copy goes
                self._release_clean(record, kept, storage)
                return True
            self._release_kept(kept)  # written since (a stale copy), or replayed instead
        placed = self._place(tier_name, storage.nbytes())
        if placed is None:
            self.stats.skipped += 1
            return False
        tier, slot = placed
        moved = Moved(tier, slot, storage.nbytes(), OFFLOADING, None, storage)
        t0 = time.perf_counter()
        moved.transfer = self._track(tier.copy_out(storage, slot, self.compute_mark))
        if tier.name != "recompute":  # a release for a replay starts no copy
            self._count_issue(tier, time.perf_counter() - t0)
        moved.writes = record.writes
        self.stats.written_bytes[tier.name] += moved.transfer.nbytes   # none for a replay
        self.moved[record.key] = moved
        self._watch(record.key, moved, storage)
        if tier.frees_at_once:
            self._release_device(record, moved)
        else:
            self.copying_out[record.key] = moved
            self._out_order[tier.name].append(record.key)
        return True

    def _release_clean(self, record, kept: Kept, storage) -> None:
        """Note [Clean copies]: the tier holds these bytes already; only the device lets go."""
        moved = Moved(kept.tier, kept.slot, kept.nbytes, OFFLOADING, None, storage)
        moved.writes = kept.writes
        self.moved[record.key] = moved
        self._watch(record.key, moved, storage)
        self._release_device(record, moved)

    def _watch(self, key: int, moved: Moved, storage) -> None:
        """Note [Died while out]: a storage the job frees while it is out (a gradient that
        zero_grad drops after the plan moved it) gives its slot back at the next op, not at
        the iteration end: until then it held host pool room (spilling later offloads to the
        disk) and counted as device bytes released. The callback may run in an autograd
        thread or the garbage collector, so it only appends."""
        died = self.died
        # The callback names the key and its own weak ref, never `moved`: a Moved reachable from
        # its own callback is a reference cycle, and one still holding a storage (a cancelled
        # copy-out) kept that storage alive until the garbage collector ran.
        moved.watch = weakref.ref(storage, lambda ref: died.append((key, ref)))

    def _forget_died(self) -> None:
        n = len(self.died)
        pending = self.died[:n]
        del self.died[:n]
        for key, ref in pending:
            kept = self.kept.get(key)
            if kept is not None and kept.watch is ref:
                del self.kept[key]
                self._release_kept(kept)
        self.forget_dead([key for key, ref in pending
                          if key in self.moved and self.moved[key].watch is ref])

    def finish_offload(self, key: int, records_by_key, done: bool = False) -> None:
        """Release the device memory of a copy-out once its bytes are in the tier (waiting
        for them unless `done`); on an I/O error keep the tensor."""
        moved = self.copying_out.pop(key)
        error = moved.transfer.error() if done else moved.transfer.wait()
        record = records_by_key.get(key)
        if error is not None or record is None:
            if error is not None:
                self.stats.io_errors += 1  # disk full, folder gone: the tensor stays put
                self._say_closed_dirs(moved.tier)
            self._release_slot(moved)
            del self.moved[key]
            return
        self._release_device(record, moved)

    def _say_closed_dirs(self, tier) -> None:
        """Once per folder, the moment a failed write closes it (Note [Closed swap folders])."""
        for run_dir, reason in list(getattr(tier, "closed", {}).items()):
            if str(run_dir) not in self.stats.closed_dirs:
                self.stats.closed_dirs[str(run_dir)] = reason
                left = "the other swap folders and the host pool" if len(tier.closed) < len(tier.run_dirs) \
                    else "the host pool (or they stay on the device)"
                print(f"teraio: warning: {reason}: it takes no more swap files; offloads go to {left}",
                      file=sys.stderr)

    def _place(self, tier_name: str, nbytes: int):
        """(tier, slot): the planned tier, or the other one when it has no room. Only a tier the
        run has and that was full counts as a spill: an eviction asks for the host pool, and a
        plan without one sends it to the disk as planned."""
        wanted = self.tiers[tier_name]
        for tier in (self.tiers[name] for name in PLACEMENT[tier_name]):
            if tier is None:
                continue
            slot = self._alloc(tier, nbytes)
            if slot is None:
                continue
            if tier is not wanted and wanted is not None:  # spilled: the planned tier had no room
                if tier.name == "ssd":
                    self.stats.other_tier_bytes += nbytes
                else:
                    self.stats.ssd_to_host_bytes += nbytes
            return tier, slot
        return None

    def _alloc(self, tier, nbytes: int) -> int | None:
        """A slot, waiting for copy-ins that still read released slots before giving up:
        their slots free within milliseconds, a spill to the other tier costs a slow round trip
        (the 3B at 1/4 of its peak put 12 GB per run on the disk while copy-ins held the pool)."""
        slot = tier.alloc(nbytes)
        while slot is None and (self._wait_oldest_releasing(tier) or self._drop_oldest_kept(tier)):
            slot = tier.alloc(nbytes)
        return slot

    def _wait_oldest_releasing(self, tier) -> bool:
        """Free the oldest slot of this tier that a copy-in still reads, waiting for that copy."""
        if not (self.releasing and self.releasing[0].tier is tier):
            return False
        oldest = self.releasing.popleft()
        if not oldest.transfer.done():  # a wait the job's thread sits through: a stall like the others
            t0 = time.perf_counter()
            oldest.transfer.wait_host()
            self.stats.stall("pool_full", "(host pool full: waiting for a copy-in)", time.perf_counter() - t0)
        self._release_slot(oldest)
        return True

    def _drop_oldest_kept(self, tier) -> bool:
        """Give back the oldest clean copy in this tier (Note [Clean copies]); False if none."""
        key = next((k for k, kept in self.kept.items() if kept.tier is tier), None)
        if key is None:
            return False
        self._release_kept(self.kept.pop(key))
        return True

    def _release_kept(self, kept: Kept) -> None:
        """A kept slot may still be read by the copy-in that brought its storage back: the
        slot is reused only once that copy is done, which the slots freed after copy-ins wait
        for (`releasing`). Not waiting here: a copy-in queued behind the stream's others took
        8 ms on average to finish, and the host sat through 314 such waits in four planned
        iterations of the 1B example on the H200 (500 us per kernel, from 85)."""
        if kept.copy_in.done():
            kept.tier.release(kept.slot, kept.nbytes)
        else:
            self.releasing.append(Moved(kept.tier, kept.slot, kept.nbytes, RESIDENT, kept.copy_in, None))

    def prefetch(self, record) -> None:
        moved = self.moved.get(record.key)
        if moved is None or moved.state != OFFLOADED:
            return
        if record.ref.expired():
            self.forget_dead([record.key])  # the program dropped it while it was out
        else:
            self._start_prefetch(record, moved)

    def defer_prefetch(self, key: int) -> int:
        """Send a storage that a prefetch brought back ahead of its op out again, its bytes
        still in the tier's slot: the op that needs it brings it back, a stall as for any
        prefetch that was not done (Note [Prefetches within the budget] in
        teraio_run/budget.py). The device bytes freed, 0 where it cannot go."""
        moved = self.moved.get(key)
        # a replay counts the replays its call has left: it runs once per use, not twice
        if moved is None or moved.state != PREFETCHING or moved.tier.name == "recompute":
            return 0
        moved.transfer.wait_host()  # the copy still writes into the memory about to go
        if moved.transfer.error() is not None:
            return 0  # its bytes are lost: the op that needs it says so (_finish_prefetch)
        moved.storage.resize_(0)
        moved.storage, moved.state = None, OFFLOADED
        self.offloaded_now += moved.nbytes
        self.released_bytes += moved.nbytes
        self.stats.skipped += 1
        return moved.nbytes

    def _start_prefetch(self, record, moved: Moved) -> None:
        for needed in moved.tier.needs(moved.slot):  # a replay's inputs (Note [Replay] in teraio_run/replay.py)
            self.ensure_resident(needed, "replay_input")
        storage = record.storage()
        assert storage is not None, "an offloaded storage that is still referenced must be alive"
        t0 = time.perf_counter()
        storage.resize_(moved.nbytes)
        t1 = time.perf_counter()
        self.stats.restore_alloc_ms += (t1 - t0) * 1e3
        try:
            transfer = moved.tier.copy_in(storage, moved.slot, moved.transfer, self.compute_mark)
        except torch.OutOfMemoryError:  # a replay's own output found no room: still out, as before
            storage.resize_(0)
            raise
        self._count_issue(moved.tier, time.perf_counter() - t0)
        self.offloaded_now -= moved.nbytes
        self.restored_bytes += moved.nbytes
        moved.storage = storage
        moved.transfer = self._track(transfer)
        moved.state = PREFETCHING

    def _finish_prefetch(self, record, moved: Moved) -> None:
        failed = moved.transfer.wait()
        if failed is not None:
            self._lose(record, moved, failed)
        self.stats.prefetched_bytes[moved.tier.name] += moved.nbytes
        del self.moved[record.key]
        # The copy no longer needs the storage object: on CUDA record_stream keeps its block
        # from reuse, a thread copy holds its own view. Holding it until the copy is reaped
        # kept a tensor the job had dropped alive (its memory too) for as long as the host
        # ran ahead of the device: up to ~100 ops late in the 3B's backward.
        moved.storage = None
        if self.keep_clean and moved.tier.keeps_copies:
            self._keep(record, moved)
        elif moved.transfer.done():
            self._release_slot(moved)
        else:
            self.releasing.append(moved)  # a stream copy still reads the pool slice

    def _keep(self, record, moved: Moved) -> None:
        """Note [Clean copies]: the slot stays with the storage, as long as it is not written."""
        kept = Kept(moved.tier, moved.slot, moved.nbytes, moved.writes, moved.transfer)
        storage = record.storage()
        if storage is None:  # dropped while it came back: nothing to keep a copy of
            self._release_kept(kept)
            return
        died = self.died
        key = record.key
        kept.watch = weakref.ref(storage, lambda ref: died.append((key, ref)))
        self.kept[key] = kept

    def _lose(self, record, moved: Moved, failed: CopyFailed) -> None:
        """Note [Lost swap files]: free the garbage, keep the tensor marked, raise."""
        moved.storage.resize_(0)
        moved.storage, moved.state = None, LOST
        self.offloaded_now += moved.nbytes
        self._release_slot(moved)
        self.stats.io_errors += 1
        self.stats.lost_tensors[record.id] = str(failed)
        raise stop(SwapDataLost(lost_message(record.id, str(failed))))

    def _reap_released(self) -> None:
        """Free the pool slots of finished copy-ins, oldest first (one stream: in order)."""
        while self.releasing and self.releasing[0].transfer.done():
            self._release_slot(self.releasing.popleft())

    def _count_issue(self, tier, seconds: float) -> None:
        """Host time starting a copy or a replay, for the report."""
        if tier.name == "recompute":
            self.stats.replays += 1
            self.stats.replay_ms += seconds * 1e3
        else:
            self.stats.copies_issued += 1
            self.stats.copy_issue_ms += seconds * 1e3

    def _track(self, transfer: Transfer) -> Transfer:
        self.in_flight.append(transfer)
        return transfer

    def measure(self) -> None:
        """Account the copies that have finished, oldest first (cheap: stops at the first
        one still running)."""
        while self.in_flight and self.in_flight[0].done():
            self.meter.add(self.in_flight.popleft())

    def wait_freeing(self) -> None:
        """Block until blocks released under record_stream can really be reused: the
        allocator takes them back only once their copies are done (out of memory: no choice)."""
        for tier in self.tiers.values():
            if tier is not None:
                tier.wait_device_frees()

    # ----- progress, polled between ops ------------------------------------------------------
    def poll(self, records_by_key) -> None:
        """Finish copy-outs that are done: release device memory, or keep the tensor on error;
        forget storages the job freed while they were out."""
        if self.died:
            self._forget_died()
        if self.releasing:
            self._reap_released()
        self.measure()
        for order in self._out_order.values():
            while order:
                moved = self.copying_out.get(order[0])
                if moved is not None and not moved.transfer.done():
                    break
                key = order.popleft()
                if moved is not None:  # else released already (cancelled, waited for)
                    self.finish_offload(key, records_by_key, done=True)

    def _release_device(self, record, moved: Moved) -> None:
        moved.storage.resize_(0)
        moved.storage = None
        moved.state = OFFLOADED
        self.offloaded_now += moved.nbytes
        self.released_bytes += moved.nbytes
        self.stats.offloaded_bytes[moved.tier.name] += moved.nbytes
        by_kind = self.stats.offloaded_bytes_by_kind
        by_kind[record.kind.name] = by_kind.get(record.kind.name, 0) + moved.nbytes

    def _release_slot(self, moved: Moved) -> None:
        moved.tier.release(moved.slot, moved.nbytes)

    def wait_offloads(self, records_by_key) -> None:
        """Wait for every copy-out in flight and release it (memory is short, or shutdown)."""
        for key in list(self.copying_out):
            self.finish_offload(key, records_by_key)
        self.poll(records_by_key)

    def forget_dead(self, dead_keys) -> None:
        """Storages freed by the program while offloaded: their copies are garbage now."""
        for key in dead_keys:
            kept = self.kept.pop(key, None)
            if kept is not None:
                self._release_kept(kept)
            moved = self.moved.pop(key, None)
            self.copying_out.pop(key, None)
            if moved is not None:
                if moved.state in (OFFLOADED, LOST):
                    self.offloaded_now -= moved.nbytes
                _wait_quietly(moved.transfer)
                if moved.state != LOST:  # its slot went with the loss
                    self._release_slot(moved)

    def host_bytes(self, record) -> torch.Tensor | None:
        """A CPU copy of a moved-out storage's bytes, read from its tier (Note [Saving from the
        tiers] in teraio_run/saving.py); None when it is not out, or no tier holds its bytes."""
        moved = self.moved.get(record.key)
        if moved is None or moved.state not in (OFFLOADING, OFFLOADED):
            return None
        transfer = moved.transfer   # None: a clean copy, in its tier already (Note [Clean copies])
        if transfer is not None:
            transfer.wait_host()
            if transfer.error() is not None:
                return None   # the copy out failed: ensure_resident says what was lost
        return moved.tier.read_host(moved.slot, moved.nbytes)

    def restore_all(self, records_by_key) -> None:
        """Bring every tensor back (shutdown, a plan we stopped following)."""
        for record in self.still_moved(records_by_key):
            self.ensure_resident(record, "restore_all")

    def still_moved(self, records_by_key) -> list:
        """The records of the live storages not plainly resident; the dead are tidied away."""
        alive = []
        for key in list(self.moved):
            record = records_by_key.get(key)
            if record is None:
                continue
            if record.ref.expired():  # dropped by the program while out, not yet tidied away
                self.forget_dead([key])
            else:
                alive.append(record)
        return alive


def _wait_quietly(transfer: Transfer | None) -> None:
    """Wait for a copy whose outcome no longer matters (the caller keeps or discards the tensor)."""
    if transfer is not None:
        transfer.wait()


class SwapDataLost(CannotGoOnExactly):
    """A swap file could not be read back: the tensor's bytes are gone (Note [Lost swap files])."""


def lost_message(tensor_id: str, failure: str) -> str:
    return (f"the bytes of {tensor_id} are lost: its swap file could not be read back ({failure}); "
            "training cannot go on exactly. Keep every --ssd-dir in place while the job runs, "
            "and restart from the last checkpoint")
