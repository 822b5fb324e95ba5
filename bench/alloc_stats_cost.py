"""What one allocator-bytes read costs: torch.cuda.memory_allocated() against the nested stats
that teraio.walk.cuda_allocated_bytes reads (docs/runtime.md).

    python bench/alloc_stats_cost.py

On CUDA it times both real calls. Without CUDA it times what memory_allocated() does in Python
on top of the C++ call: torch.cuda.memory_stats's flatten-and-sort, run on a dict of the same
shape as the allocator's stats.
"""

import timeit

import torch
from torch.cuda.memory import memory_stats

CALLS = 20000
KINDS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
         "active_bytes", "inactive_split_bytes", "requested_bytes", "oversize_allocations", "oversize_segments")


def fake_nested_stats() -> dict:
    stats = {kind: {pool: dict.fromkeys(("current", "peak", "allocated", "freed"), 1)
                    for pool in ("all", "small_pool", "large_pool")} for kind in KINDS}
    stats.update(num_alloc_retries=0, num_ooms=0, num_sync_all_streams=0, num_device_alloc=0,
                 num_device_free=0, max_split_size=-1)
    return stats


def main() -> None:
    if torch.cuda.is_available():
        torch.empty(1, device="cuda")
        full = timeit.timeit(torch.cuda.memory_allocated, number=CALLS)
        nested = timeit.timeit(lambda: torch.cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["current"],
                               number=CALLS)
        print(f"memory_allocated() {full / CALLS * 1e6:.1f} us, nested stats {nested / CALLS * 1e6:.1f} us per call")
        return
    stats = fake_nested_stats()
    original = torch.cuda.memory.memory_stats_as_nested_dict
    torch.cuda.memory.memory_stats_as_nested_dict = lambda device=None: stats
    try:
        flatten = timeit.timeit(lambda: memory_stats().get("allocated_bytes.all.current", 0), number=CALLS)
    finally:
        torch.cuda.memory.memory_stats_as_nested_dict = original
    print(f"no CUDA: memory_stats' flatten-and-sort alone {flatten / CALLS * 1e6:.1f} us per call "
          f"(the nested read skips it)")


if __name__ == "__main__":
    main()
