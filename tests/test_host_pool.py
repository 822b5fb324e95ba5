"""The host tier's pool: slices never overlap, freed slices coalesce back into one, and a full
pool waits for queued copy-ins before an offload spills to the other tier."""

import random

from teraio_run.tiers import POOL_ALIGN_BYTES, HostPool


def aligned(nbytes: int) -> int:
    return -(-nbytes // POOL_ALIGN_BYTES) * POOL_ALIGN_BYTES


def first_fit(free: list[tuple[int, int]], nbytes: int) -> int | None:
    """The lowest offset whose free slice holds `nbytes`: what the pool's index must find."""
    return next((offset for offset, size in free if size >= aligned(nbytes)), None)


def test_random_alloc_and_release_never_overlap_and_coalesce_and_fit_first():
    rng = random.Random(1)
    pool = HostPool(1 << 22, pin=False)
    live = []
    for _ in range(3000):
        if live and rng.random() < 0.5:
            pool.release(*live.pop(rng.randrange(len(live))))
        else:
            nbytes = rng.randint(1, 100_000)
            expected = first_fit(pool.free_slices(), nbytes)
            offset = pool.alloc(nbytes)
            assert offset == expected  # first-fit: the plans' pool sizes assume its fragmentation
            if offset is not None:
                live.append((offset, nbytes))
        spans = sorted([(offset, aligned(n)) for offset, n in live] + pool.free_slices())
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))  # nothing handed out twice
        assert spans[-1][0] + spans[-1][1] <= pool.capacity
        assert sum(n for _, n in pool.free_slices()) == pool.capacity - pool.used
    for offset, nbytes in live:
        pool.release(offset, nbytes)
    assert pool.free_slices() == [(0, pool.capacity)] and pool.used == 0  # one slice again: no fragments lost


def test_a_full_pool_waits_for_slots_that_copy_ins_still_read_instead_of_spilling(tmp_path):
    """The host runs ahead of the copies: a slot whose copy-in is still queued frees a few ms
    later, so the engine waits for it rather than send the next offload to the disk."""
    import threading
    from concurrent.futures import Future, ThreadPoolExecutor

    from teraio_run.engine import PREFETCHING, MigrationEngine, Moved
    from teraio_run.tiers import HostTier, PosixFiles, SsdTier, Transfer

    threads = ThreadPoolExecutor(max_workers=1)
    pool = HostPool(4 * POOL_ALIGN_BYTES, pin=False)
    host, ssd = HostTier(pool, False, threads), SsdTier([tmp_path], PosixFiles(), threads)
    engine = MigrationEngine(host, ssd, False)
    copy_in = Future()
    slot = pool.alloc(pool.capacity)
    engine.releasing.append(Moved(host, slot, pool.capacity, PREFETCHING, Transfer("h2d", pool.capacity, copy_in), None))
    threading.Timer(0.05, copy_in.set_result, [(0.0, 0.05)]).start()
    tier, placed = engine._place("host", pool.capacity)
    assert (tier.name, placed, engine.stats.other_tier_bytes) == ("host", slot, 0)
    # with nothing left to wait for, a full pool does spill to the other tier
    tier, _ = engine._place("host", POOL_ALIGN_BYTES)
    assert tier.name == "ssd" and engine.stats.other_tier_bytes == POOL_ALIGN_BYTES


def test_bringing_everything_back_skips_a_tensor_the_program_dropped_while_it_was_out(tmp_path):
    """A save right after an iteration (teraio.resident(), save_pretrained) brings every moved
    tensor back; one the program freed while it was out (not tidied until the iteration ends)
    is forgotten and its slot freed, not re-allocated (it crashed save_pretrained on CUDA)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from teraio.formats.trace import Kind
    from teraio.walk import StorageRecord
    from teraio_run.engine import MigrationEngine
    from teraio_run.tiers import HostTier, PosixFiles, SsdTier

    threads = ThreadPoolExecutor(max_workers=1)
    pool = HostPool(1 << 20, pin=False)
    engine = MigrationEngine(HostTier(pool, False, threads), SsdTier([tmp_path], PosixFiles(), threads), False)
    kept, dropped = torch.arange(1000.0), torch.ones(1000)
    records = {}
    for tensor in (kept, dropped):
        storage = tensor.untyped_storage()
        records[storage._cdata] = StorageRecord(storage._cdata, "t", Kind.activation, tensor, storage, 0)
        assert engine.offload(records[storage._cdata], "host")
    engine.wait_offloads(records)
    del dropped, tensor, storage  # the program's last references
    engine.restore_all(records)
    assert torch.equal(kept, torch.arange(1000.0)) and not engine.moved
    # the dropped tensor's slot is free; the restored one's stays as its clean copy (Note [Clean copies])
    assert list(engine.kept) == [kept.untyped_storage()._cdata] and pool.used == aligned(kept.nbytes)


def test_a_failed_write_cancelled_before_any_poll_is_said_and_counted(tmp_path, capfd):
    """An op touches a tensor whose copy to the disk failed (its folder removed) before the
    keeper polled that copy: the tensor stays on the device with its values, the folder is said
    closed once with the reason, and the error is counted as a finished failure would be."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from teraio.formats.trace import Kind
    from teraio.walk import StorageRecord
    from teraio_run.engine import MigrationEngine
    from teraio_run.tiers import HostTier, PosixFiles, SsdTier

    swap = tmp_path / "swap"
    swap.mkdir()
    threads = ThreadPoolExecutor(max_workers=1)
    engine = MigrationEngine(HostTier(HostPool(1 << 20, pin=False), False, threads),
                             SsdTier([swap], PosixFiles(), threads), False)
    tensor = torch.arange(1000.0)
    storage = tensor.untyped_storage()
    record = StorageRecord(storage._cdata, "t", Kind.activation, tensor, storage, 0)
    shutil.rmtree(swap)
    assert engine.offload(record, "ssd")  # the write fails in its thread
    engine.ensure_resident(record, "unplanned")  # no poll between: the cancel finds the failure
    assert torch.equal(tensor, torch.arange(1000.0)) and not engine.moved
    assert engine.stats.io_errors == 1 and engine.stats.cancelled_offloads == 1
    assert list(engine.stats.closed_dirs) == [str(swap)]
    warnings = [line for line in capfd.readouterr().err.splitlines() if "takes no more swap files" in line]
    assert len(warnings) == 1 and str(swap) in warnings[0]
