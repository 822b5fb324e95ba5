"""The host tier's pool: slices never overlap, and freed slices coalesce back into one."""

import random

from teraio_run.tiers import POOL_ALIGN_BYTES, HostPool


def aligned(nbytes: int) -> int:
    return -(-nbytes // POOL_ALIGN_BYTES) * POOL_ALIGN_BYTES


def test_random_alloc_and_release_never_overlap_and_coalesce():
    rng = random.Random(1)
    pool = HostPool(1 << 22, pin=False)
    live = []
    for _ in range(3000):
        if live and rng.random() < 0.5:
            pool.release(*live.pop(rng.randrange(len(live))))
        else:
            nbytes = rng.randint(1, 100_000)
            offset = pool.alloc(nbytes)
            if offset is not None:
                live.append((offset, nbytes))
        spans = sorted([(offset, aligned(n)) for offset, n in live] + pool._free)
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))  # nothing handed out twice
        assert spans[-1][0] + spans[-1][1] <= pool.capacity
        assert sum(n for _, n in pool._free) == pool.capacity - pool.used
    for offset, nbytes in live:
        pool.release(offset, nbytes)
    assert pool._free == [(0, pool.capacity)] and pool.used == 0  # one slice again: no fragments lost
