"""Where offloaded bytes live: a pinned host pool and swap files on SSDs.

Each tier copies a storage's bytes out and back and returns a `Transfer` the engine can poll
or wait on. Device memory is released by the engine, never here.

Note [Stream ordering on CUDA]
- Copy-out runs on a side stream that first waits for an event recorded on the compute
  stream after the last kernel that wrote the tensor, so it reads finished data.
- Host tier: the device block is freed right after the copy is queued; `record_stream` tells
  the caching allocator not to hand that block out before the side stream passes the copy.
  (Tried at commit 8c1ddb7: keeping the block until the plan's offload_by and freeing it
  after making the compute stream wait for the copy. The 1B twin run stayed bit-identical,
  but the 3B run at half its peak took 2.15 s per step instead of 1.87 s: reverted.)
- Copy-in: the storage is re-allocated on the compute stream; the side stream waits for an
  event recorded after that allocation (the block may be one that queued kernels just
  released), and the compute stream waits for the copy's event before the first use.
- SSD tier (KvikIO runs in its own threads, not on a stream): the I/O thread waits for the
  compute-stream event before touching device memory, and the engine waits for the future
  before the tensor is used (a real host wait, counted as a stall when not done in time).

Note [Timing a sample of the copies]
The achieved rate per path (the run report's `achieved_gbps`, what `teraio plan --calibrate`
takes) needs each copy's duration on its stream, a pair of timing events around it. Timing
events are dearer than plain ones: on the H200, starting a copy cost 33-35 us of host time with
the pair and 23 us with one plain event (bench/copy_issue_cost.py, 2026-12-02), on ~2,000 copies
per iteration of a short-kernel job. So one stream copy in TIMED_COPY_EVERY is timed, the first
of each path among them, and the meter takes the rate of the timed ones for all (copies of one
path run one after another on one stream, at about one rate); every copy still ends in an
event, which `done` and `wait` use.

Note [One compute-stream event per group of copies]
Each stream copy waits for the compute stream's work so far: an event recorded there, and the
side stream told to wait for it. The plan starts its copies in groups, the offloads after one
kernel and the prefetches before one; no kernel is queued between the copies of a group but
a replay's, so one event serves them all, and each side stream waits on it once. Recording
the event per copy cost 9 us of host time per copy more on an idle H200 (23 us against 14,
bench/copy_issue_cost.py, 2026-12-02), on ~2,600 copies per iteration of the LoRA case. A
ComputeMark is that event: entered (`with engine.compute_mark:`), the first copy records it
and later copies share it, until the group ends or a replay queues kernels (the replay tier
forgets it: a copy after those kernels needs an event after them); outside a group each copy
gets its own. Another group's event is never reused: between two groups the job's ops run.

Note [Failed copies are values]
A swap file that cannot be written (a full disk, a folder removed) or read back comes back
from its I/O thread as a `CopyFailed`, never as a raised exception. An exception carries its
traceback, whose frames hold the tensor being copied, and each re-raise in the job's thread
adds the frames of the op being run, its outputs included. Kept alive that way, storages count
against the budget (evicted in vain: a full disk ran 35x slower, 3x over budget) and change
what autograd does: AccumulateGrad copies a gradient that something else references instead
of stealing it, one op more, and the guard took the iteration for another job's.
"""

import bisect
import ctypes
import errno
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import torch

from teraio import swap_dirs
from teraio_run.layout import STRIPE_MIN_BYTES

POOL_ALIGN_BYTES = 512
INLINE_COPY_MAX_BYTES = 256 * 2**10   # CPU copies up to this size run in the caller's thread
TIMED_COPY_EVERY = 8                   # Note [Timing a sample of the copies]


def byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A 1-D uint8 tensor over the whole storage (no copy): `set_` sizes it from the storage,
    one call fewer than giving offset, size and stride."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class CopyFailed:
    """Why a thread copy failed (Note [Failed copies are values]): plain data, no traceback."""

    __slots__ = ("path", "errno", "strerror")

    def __init__(self, path: Path, err: OSError):
        self.path, self.errno, self.strerror = path, err.errno, err.strerror or str(err)

    def __str__(self) -> str:
        return f"{self.path}: {self.strerror}"


class Transfer:
    """A copy in flight on one path (d2h, h2d, d2s, s2d): a future from a thread (its result
    is the copy's (start, end) on the monotonic clock, or a CopyFailed) or a pair of CUDA
    events around a stream copy."""

    __slots__ = ("future", "event", "start", "path", "nbytes", "interval")

    def __init__(self, path: str, nbytes: int, future: Future | None = None, event=None, start=None,
                 interval: tuple[float, float] | None = None):
        self.path, self.nbytes = path, nbytes
        self.future, self.event, self.start = future, event, start
        self.interval = interval  # of a copy made in the caller's thread: done already

    def done(self) -> bool:
        if self.future is not None and not self.future.done():
            return False
        return self.event is None or self.event.query()

    def wait(self) -> CopyFailed | None:
        """Blocks until done (a stream copy: the compute stream waits); returns its failure."""
        if self.future is not None:
            return self.error_when_done()
        if self.event is not None:
            compute_stream().wait_event(self.event)  # device-side: no host sync
        return None

    def error_when_done(self) -> CopyFailed | None:
        result = self.future.result()
        return result if isinstance(result, CopyFailed) else None

    def wait_host(self) -> None:
        """Blocks the host until the copy has finished (its source or target may be reused)."""
        if self.future is not None:
            self.future.exception()
        if self.event is not None:
            self.event.synchronize()

    def error(self) -> CopyFailed | None:
        return self.error_when_done() if self.future is not None and self.future.done() else None

    def interval_s(self) -> tuple[float, float] | None:
        """(start, end) of a finished thread copy, or (0, duration) of a timed stream copy;
        None for an untimed stream copy (Note [Timing a sample of the copies]) or a failed one."""
        if self.event is not None:
            return None if self.start is None else (0.0, self.start.elapsed_time(self.event) / 1e3)
        if self.interval is not None:
            return self.interval
        if self.error() is not None:
            return None
        return self.future.result()


def cpu_copy(threads: ThreadPoolExecutor, path: str, dst: torch.Tensor, src: torch.Tensor) -> Transfer:
    """A copy between CPU byte tensors: in an I/O thread so it overlaps the job's ops, except a
    small one, made here: handing it to a thread and reaping its future cost ~50-100 us on the
    CPU box, more than copying INLINE_COPY_MAX_BYTES does (docs/runtime.md, host cost).
    Note [CPU copies by memmove]: not Tensor.copy_, which splits a copy above 32K elements over
    the OpenMP threads: where another process holds a core (a 2-core box), each such copy waited
    for a time slice, 520 us for 1 MiB against 12 us alone; memmove is one thread, and ctypes
    lets the GIL go while it runs."""
    nbytes = src.numel()
    if nbytes <= INLINE_COPY_MAX_BYTES:
        return Transfer(path, nbytes, interval=timed_memmove(dst, src))
    return Transfer(path, nbytes, future=threads.submit(timed_memmove, dst, src))


def timed_memmove(dst: torch.Tensor, src: torch.Tensor) -> tuple[float, float]:
    """Copy src's bytes over dst's (contiguous, the same size; both held until it returns) and
    say when it ran (for the achieved bandwidth)."""
    # byte views over whole storages and pool slices, both made here: copy_ checked what memmove cannot
    assert dst.dtype == src.dtype == torch.uint8 and dst.is_contiguous() and src.is_contiguous()
    assert dst.numel() == src.numel() and dst.device.type == src.device.type == "cpu"
    t0 = time.perf_counter()
    ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel())
    return t0, time.perf_counter()


def compute_stream() -> torch.cuda.Stream:
    """The stream the job's ops run on now. Not torch.cuda.current_stream() without a device:
    that finds the current device through is_available() and environment lookups every time,
    and with the `with torch.cuda.stream()` and `Event.record()` that call it too, it was the
    largest share of a planned op's host time on the H200 (docs/runtime.md, host cost)."""
    return torch.cuda.current_stream(torch.cuda.current_device())


class ComputeMark:
    """The compute stream's work so far, as an event side streams and I/O threads wait on:
    one per group of copies (Note [One compute-stream event per group of copies])."""

    __slots__ = ("cuda", "depth", "event", "waited")

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.depth = 0        # open groups (a group may start inside another)
        self.event = None     # the group's event, once its first copy recorded it
        self.waited = []      # side streams already waiting on it

    def __enter__(self) -> "ComputeMark":
        self.depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.forget()

    def forget(self) -> None:
        """Kernels were queued since the event: copies from here wait for a new one."""
        self.event, self.waited = None, []

    def now(self):
        """An event after the compute stream's work so far (None on the CPU)."""
        if self.event is not None or not self.cuda:
            return self.event
        event = torch.cuda.Event()
        event.record(compute_stream())
        if self.depth:
            self.event = event
        return event

    def make_wait(self, stream) -> None:
        """`stream`'s later work runs after the compute stream's work so far."""
        event = self.now()
        if any(waiting is stream for waiting in self.waited):
            return
        stream.wait_event(event)
        if self.depth:
            self.waited.append(stream)


def _stream_copy(stream, mark: ComputeMark, dst: torch.Tensor, src: torch.Tensor, keep_alive: torch.Tensor,
                 timed: bool):
    """dst.copy_(src) on `stream` once it has passed the compute stream's work so far (`mark`),
    ending in an event (between two timing events when `timed`); `keep_alive`'s block is not
    reused by the allocator before the copy has passed (record_stream). The stream is set and
    restored by hand for the reason in compute_stream; the compute stream's event is the mark's
    rather than `wait_stream`'s, which adds two Python calls and an event per copy."""
    compute = compute_stream()
    start, end = torch.cuda.Event(enable_timing=timed), torch.cuda.Event(enable_timing=timed)
    mark.make_wait(stream)
    torch.cuda.set_stream(stream)
    try:
        if timed:
            start.record(stream)
        dst.copy_(src, non_blocking=True)
        keep_alive.record_stream(stream)
        end.record(stream)
    finally:
        torch.cuda.set_stream(compute)
    return (start if timed else None), end


def _pin_exactly(buffer: torch.Tensor) -> None:
    """Page-lock this buffer where it is. Not `pin_memory=True`: PyTorch's caching host
    allocator rounds a request up to a power of two, so a 72 GiB pool would pin 128 GiB
    (more than the H200 machine has) and fail."""
    nbytes = buffer.numel() * buffer.element_size()
    err = int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), nbytes, 0))
    if err != 0:
        raise RuntimeError(f"could not pin {nbytes / 2**30:.1f} GiB of host memory for the host tier "
                           f"(cudaHostRegister error {err}): lower --host-mem when planning")


def _unpin(address: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(address)


class PoolSlots:
    """Offsets into `capacity` bytes, handed out first-fit in POOL_ALIGN_BYTES units (the host
    pool's bookkeeping, apart from its buffer so bench/pool_replay.py can replay a plan).

    Free slices are indexed by offset (to merge a released slice with its neighbours) and by
    size class (bit length of the size), each class sorted by offset: the lowest-offset slice
    that fits is the lowest head among the classes above the request's, or the first fitting
    one in its own class. Scanning the whole free list cost ~78 us per offload on the CPU box
    once a plan had fragmented it (docs/runtime.md). First-fit, not best-fit: replaying the 3B
    plans at 1/2 and 1/4 of its peak and the 8B's in pools the plans' size
    (bench/pool_replay.py), best-fit found no room 20, 57 and 5 times, first-fit 0, 57 and 0."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._size_at: dict[int, int] = {}         # free offset -> its size
        self._offsets: list[int] = []              # free offsets, sorted
        self._classes: dict[int, list[int]] = {}   # size.bit_length() -> its free offsets, sorted
        if capacity:
            self._add(0, capacity)
        self.used = 0
        self.peak_used = 0  # the most held at once since the run report's last look

    def alloc(self, nbytes: int) -> int | None:
        need = -(-nbytes // POOL_ALIGN_BYTES) * POOL_ALIGN_BYTES
        offset = self._first_fit(need)
        if offset is None:
            return None
        size = self._remove(offset)
        if size > need:
            self._add(offset + need, size - need)
        self.used += need
        self.peak_used = max(self.peak_used, self.used)
        return offset

    def _first_fit(self, need: int) -> int | None:
        own = need.bit_length()
        best = None
        for size_class, offsets in self._classes.items():
            if size_class > own and offsets and (best is None or offsets[0] < best):
                best = offsets[0]  # every slice of a higher class fits
        for offset in self._classes.get(own, ()):
            if best is not None and offset > best:
                break
            if self._size_at[offset] >= need:
                return offset
        return best

    def release(self, offset: int, nbytes: int) -> None:
        """Return a slice, merged with free neighbours."""
        need = -(-nbytes // POOL_ALIGN_BYTES) * POOL_ALIGN_BYTES
        self.used -= need
        end = offset + need
        if end in self._size_at:  # merge with the next free slice
            end += self._remove(end)
        i = bisect.bisect_left(self._offsets, offset)
        if i > 0:
            before = self._offsets[i - 1]
            if before + self._size_at[before] == offset:  # and with the previous one
                self._remove(before)
                offset = before
        self._add(offset, end - offset)

    def free_slices(self) -> list[tuple[int, int]]:
        """(offset, size) of every free slice, by offset."""
        return [(offset, self._size_at[offset]) for offset in self._offsets]

    def _add(self, offset: int, size: int) -> None:
        self._size_at[offset] = size
        bisect.insort(self._offsets, offset)
        bisect.insort(self._classes.setdefault(size.bit_length(), []), offset)

    def _remove(self, offset: int) -> int:
        size = self._size_at.pop(offset)
        del self._offsets[bisect.bisect_left(self._offsets, offset)]
        same_class = self._classes[size.bit_length()]
        del same_class[bisect.bisect_left(same_class, offset)]
        return size


class HostPool(PoolSlots):
    """One pinned buffer allocated at start (per-tensor cudaHostAlloc is slow and fragments),
    carved first-fit. On CPU-only machines it is plain memory."""

    def __init__(self, nbytes: int, pin: bool):
        super().__init__(nbytes)
        self.buffer = torch.empty(nbytes, dtype=torch.uint8)
        if pin and nbytes > 0:
            _pin_exactly(self.buffer)
            # The registration outlives the buffer otherwise: a later buffer at the same address
            # (the next pool in this process) fails to register (cudaErrorHostMemoryAlreadyRegistered).
            weakref.finalize(self.buffer, _unpin, self.buffer.data_ptr())

    def slice(self, offset: int, nbytes: int) -> torch.Tensor:
        return self.buffer[offset:offset + nbytes]


class Tier(Protocol):
    """Where a storage's bytes can go; the host pool, the swap files and the replay of the op
    that made it (teraio_run/replay.py) each are one.

    A slot is the tier's handle for one storage's bytes: `alloc` gives one (None when the
    tier has no room), `copy_out` and `copy_in` move a storage's bytes into and out of it
    and return the copy in flight, `release` gives it back. `frees_at_once`: whether device
    memory may be released as soon as the copy out is queued (stream-ordered copies, Note
    [Stream ordering on CUDA]) or only once it has finished (thread copies)."""

    name: str
    frees_at_once: bool
    keeps_copies: bool   # whether a restored storage's slot may stay as its clean copy (engine Note [Clean copies])

    def alloc(self, nbytes: int) -> int | None: ...

    def copy_out(self, storage, slot: int, mark: ComputeMark) -> Transfer: ...

    def copy_in(self, storage, slot: int, after_out: Transfer | None, mark: ComputeMark) -> Transfer: ...

    def read_host(self, slot: int, nbytes: int) -> torch.Tensor | None:
        """A CPU copy of the slot's bytes (uint8), None when the tier holds none (a replay)."""

    def needs(self, slot: int) -> list:
        """Storages (walk records) that must be resident before copy_in: a replay's inputs."""

    def release(self, slot: int, nbytes: int) -> None: ...

    def wait_device_frees(self) -> None:
        """Block until device blocks freed under its copies may be reused."""


class HostTier:
    name = "host"
    keeps_copies = True   # the pool's room is known: kept slots give way when it is short

    def __init__(self, pool: HostPool, cuda: bool, threads: ThreadPoolExecutor):
        self.pool, self.cuda, self.threads = pool, cuda, threads
        self.frees_at_once = cuda  # see Note [Stream ordering on CUDA]
        self._copies = {"d2h": 0, "h2d": 0}   # stream copies started per path
        if cuda:
            self.d2h_stream, self.h2d_stream = torch.cuda.Stream(), torch.cuda.Stream()

    def alloc(self, nbytes: int) -> int | None:
        return self.pool.alloc(nbytes)

    def needs(self, slot: int) -> list:
        return []

    def release(self, slot: int, nbytes: int) -> None:
        self.pool.release(slot, nbytes)

    def wait_device_frees(self) -> None:
        if self.cuda:
            self.d2h_stream.synchronize()  # blocks freed under record_stream are reusable after

    def read_host(self, slot: int, nbytes: int) -> torch.Tensor:
        return self.pool.slice(slot, nbytes).clone()

    def take_peak_bytes(self) -> int:
        """The most the pool held since the last call (the run report's per-iteration row)."""
        peak, self.pool.peak_used = self.pool.peak_used, self.pool.used
        return peak

    def copy_out(self, storage, slot, mark: ComputeMark) -> Transfer:
        nbytes = storage.nbytes()
        dst, src = self.pool.slice(slot, nbytes), byte_view(storage)
        if not self.cuda:
            return cpu_copy(self.threads, "d2h", dst, src)
        # after the compute stream's work so far: it reads finished data
        start, end = _stream_copy(self.d2h_stream, mark, dst, src, keep_alive=src, timed=self._time_next("d2h"))
        return Transfer("d2h", nbytes, event=end, start=start)

    def copy_in(self, storage, slot, after_out: Transfer | None, mark: ComputeMark) -> Transfer:
        nbytes = storage.nbytes()
        dst, src = byte_view(storage), self.pool.slice(slot, nbytes)
        if not self.cuda:
            return cpu_copy(self.threads, "h2d", dst, src)
        if after_out is not None and after_out.event is not None:
            self.h2d_stream.wait_event(after_out.event)  # the pool slice holds the bytes
        # after the compute stream's work so far: the new block is free to write; keep_alive=dst:
        # if the tensor is freed before its use, the block is not reused under the copy
        start, end = _stream_copy(self.h2d_stream, mark, dst, src, keep_alive=dst, timed=self._time_next("h2d"))
        return Transfer("h2d", nbytes, event=end, start=start)

    def _time_next(self, path: str) -> bool:
        """Note [Timing a sample of the copies]: a path's first stream copy and every
        TIMED_COPY_EVERY-th after it are timed."""
        self._copies[path] += 1
        return self._copies[path] % TIMED_COPY_EVERY == 1


def host_memoryview(data: torch.Tensor) -> memoryview:
    """Raw bytes of a contiguous CPU uint8 tensor. Not `.numpy()`: that marks the storage
    non-resizable for good, and we must be able to resize_(0) it afterwards."""
    return memoryview((ctypes.c_char * data.numel()).from_address(data.data_ptr())).cast("B")


class PosixFiles:
    """Swap files through plain POSIX I/O from host memory (CPU-only machines)."""

    name = "posix"

    def write(self, path: Path, data: torch.Tensor) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = host_memoryview(data)
            written = 0
            while written < len(view):
                written += os.pwrite(fd, view[written:], written)
        finally:
            os.close(fd)

    def read(self, path: Path, data: torch.Tensor) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            view = host_memoryview(data)
            done = 0
            while done < len(view):
                got = os.preadv(fd, [view[done:]], done)
                if got == 0:
                    raise OSError(f"swap file {path} is shorter than expected")
                done += got
        finally:
            os.close(fd)


class KvikioFiles:
    """Swap files through KvikIO: GPUDirect Storage where available, its compat mode else."""

    def __init__(self):
        import kvikio
        import kvikio.defaults

        self.kvikio = kvikio
        preferred = getattr(kvikio.defaults, "is_compat_mode_preferred", None)
        compat = preferred() if preferred else bool(getattr(kvikio.defaults, "compat_mode", lambda: True)())
        self.name = "compat" if compat else "gds"

    def write(self, path: Path, data: torch.Tensor) -> None:
        with self.kvikio.CuFile(path, "w") as f:
            written = f.write(data)
        if written != data.numel():
            raise OSError(f"short write to {path}: {written} of {data.numel()} bytes")

    def read(self, path: Path, data: torch.Tensor) -> None:
        with self.kvikio.CuFile(path, "r") as f:
            got = f.read(data)
        if got != data.numel():
            raise OSError(f"swap file {path} is shorter than expected")


class SsdTier:
    """One swap file per tensor per SSD folder; large tensors are striped over all folders.

    Note [Closed swap folders]: a folder whose write fails (the disk is full, the folder was
    removed, it became read-only) takes no more writes for the rest of the run: retrying would
    fail again at the cost of a copy each time, and on-demand eviction would keep choosing it.
    Files already there are still read back. With every folder closed the tier has no slot to
    give, so offloads go to the host pool or stay on the device."""

    name = "ssd"
    frees_at_once = False  # device memory is released once the I/O thread has read it
    keeps_copies = False   # the disk's room was checked for the plan's files only; kept ones could fill it

    def __init__(self, run_dirs: list[Path], files, threads: ThreadPoolExecutor):
        self.run_dirs, self.files, self.threads = run_dirs, files, threads
        self.closed: dict[Path, str] = {}  # run folder -> why it takes no more writes (I/O threads add)
        self._chunks_of: dict[int, list] = {}  # slot -> [(path, lo, hi)] as written
        self._next = 0
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> int | None:
        """A slot for the next copy-out, or None when no folder takes writes."""
        if len(self.closed) >= len(self.run_dirs):
            return None
        with self._lock:
            self._next += 1
            return self._next

    def wait_device_frees(self) -> None:
        """Its copies finish before device memory is released: nothing to wait for."""

    def needs(self, slot: int) -> list:
        return []

    def _place_chunks(self, slot: int, nbytes: int) -> list:
        open_dirs = [d for d in self.run_dirs if d not in self.closed] or self.run_dirs
        dirs = open_dirs if nbytes >= STRIPE_MIN_BYTES else [open_dirs[slot % len(open_dirs)]]
        step = -(-nbytes // len(dirs))
        chunks = [(d / f"{slot}.bin", i * step, min(nbytes, (i + 1) * step)) for i, d in enumerate(dirs)]
        self._chunks_of[slot] = chunks  # read back from where it was written, whatever closes later
        return chunks

    def copy_out(self, storage, slot, mark: ComputeMark) -> Transfer:
        data = byte_view(storage)
        chunks = self._place_chunks(slot, data.numel())
        future = self.threads.submit(self._io, self.files.write, chunks, data, mark.now())
        return Transfer("d2s", data.numel(), future=future)

    def copy_in(self, storage, slot, after_out: Transfer | None, mark: ComputeMark) -> Transfer:
        data = byte_view(storage)
        future = self.threads.submit(self._io, self.files.read, self._chunks_of[slot], data, mark.now())
        return Transfer("s2d", data.numel(), future=future)

    def read_host(self, slot: int, nbytes: int) -> torch.Tensor | None:
        """Read with plain POSIX I/O whatever wrote them (KvikIO's files are plain files)."""
        data = torch.empty(nbytes, dtype=torch.uint8)
        try:
            for path, lo, hi in self._chunks_of[slot]:
                PosixFiles().read(path, data[lo:hi])
        except OSError:
            return None   # ensure_resident reads it again and says what was lost
        return data

    def _io(self, op, chunks, data, ready) -> tuple[float, float] | CopyFailed:
        if ready is not None:
            ready.synchronize()  # the compute stream has finished with (or allocated) this memory
        t0 = time.perf_counter()
        for path, lo, hi in chunks:
            try:
                op(path, data[lo:hi])
            except OSError as err:  # Note [Failed copies are values]: no traceback leaves this frame
                failed = CopyFailed(path, err)
                if op == self.files.write:
                    self.closed.setdefault(path.parent, closed_reason(path.parent, failed))
                return failed
        return t0, time.perf_counter()

    def release(self, slot: int, nbytes: int) -> None:
        for path, _, _ in self._chunks_of.pop(slot, ()):
            path.unlink(missing_ok=True)


def closed_reason(run_dir: Path, failed: CopyFailed) -> str:
    """Why a swap folder takes no more writes, in the words a user searches for."""
    if failed.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full on {run_dir.parent}"
    if failed.errno == errno.ENOENT:
        return f"the swap folder {run_dir} is gone"
    return f"cannot write swap files to {run_dir} ({failed.strerror})"


def make_run_dirs(ssd_dirs: list[str], rank: int) -> list[Path]:
    """A fresh per-run folder in each SSD folder; stale ones of dead runs are removed first."""
    run_dirs = []
    for base in ssd_dirs:
        base_path = Path(base)
        base_path.mkdir(parents=True, exist_ok=True)
        swap_dirs.remove_dead_run_dirs([base_path])
        run_dirs.append(swap_dirs.make_run_dir(base_path, rank))
    return run_dirs
