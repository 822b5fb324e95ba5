"""Host time to start one copy between the device and the host pool, by part (issue 14).

    python3 bench/copy_issue_cost.py --out $OUT/copy_issue.json          # on the H200
    python3 bench/copy_issue_cost.py --cpp --out $OUT/copy_issue.json    # and the C++ floor

A plan-following kernel on the H200 costs 50-70 us more host time than an unplanned one, and
the calibrated figures put most of it in the copies (docs/planner.md, `host_us_per_copy`: 134
us on the small-batch 1B, 267-315 us on the 3B with re-allocation). This measures, on an idle
device (no full launch queue to wait behind), what starting a copy costs in each part:
- `engine`: the whole plan action through the real MigrationEngine and HostTier: offload
  (pool slot, copy out, release) and prefetch (re-allocate, copy in) then ensure_resident;
- `tier`: HostTier.copy_out / copy_in alone (streams, events, the copy), each copy after an
  event of its own on the compute stream; `tier_group`: the same copies as one group, after one
  event (Note [One compute-stream event per group of copies] in teraio_run/tiers.py);
- `resize`: the storage's re-allocation and release alone (the caching allocator, no cap);
- `lean`: the stream work the tier does written with one event recorded on the compute
  stream for the whole batch and no timing events (a candidate, same copies); `lean_each`:
  the same with the compute stream's event recorded per copy;
- `cpp` (with --cpp, needs a compiler and CUDA headers): the same stream work in one C++
  call, built with torch.utils.cpp_extension: the floor a compiled copy issue would reach.
Each is the median over rounds of the per-copy mean, in microseconds.
"""

import argparse
import contextlib
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from run_baseline import git_commit  # noqa: E402
from teraio.formats.trace import Kind  # noqa: E402
from teraio.walk import StorageRecord  # noqa: E402
from teraio_run.engine import MigrationEngine  # noqa: E402
from teraio_run.tiers import ComputeMark, HostPool, HostTier, byte_view, compute_stream  # noqa: E402

CPP_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

// dst.copy_(src) on `side` after the compute stream's work so far; `keep`'s block is not
// reused before the copy has run; returns the event recorded after it.
int64_t stream_copy(at::Tensor dst, at::Tensor src, int64_t side_ptr, at::Tensor keep) {
  auto device = keep.device().is_cuda() ? keep.device().index() : dst.device().index();
  auto compute = c10::cuda::getCurrentCUDAStream(device);
  auto side = c10::cuda::getStreamFromExternal(reinterpret_cast<cudaStream_t>(side_ptr), device);
  cudaEvent_t ready, done;
  cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  cudaEventRecord(ready, compute.stream());
  cudaStreamWaitEvent(side.stream(), ready, 0);
  cudaEventDestroy(ready);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    dst.copy_(src, true);
  }
  c10::cuda::CUDACachingAllocator::recordStream(keep.storage().data_ptr(), side);
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  cudaEventRecord(done, side.stream());
  return reinterpret_cast<int64_t>(done);
}

bool query_and_free(int64_t event) {
  auto e = reinterpret_cast<cudaEvent_t>(event);
  cudaEventSynchronize(e);
  cudaEventDestroy(e);
  return true;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("stream_copy", &stream_copy);
  m.def("query_and_free", &query_and_free);
}
"""


def make_records(count: int, nbytes: int, device: str) -> list:
    tensors = [torch.full((nbytes // 4,), float(i), device=device) for i in range(count)]
    return tensors, [StorageRecord(i + 1, f"t{i}", Kind.activation, t, t.untyped_storage(), 0)
                     for i, t in enumerate(tensors)]


def per_copy_us(fn, count: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / count * 1e6


def measure(args) -> dict:
    count, nbytes = args.copies, args.nbytes
    pool = HostPool(2 * count * nbytes, pin=True)  # the engine's slots and the tier's own
    tier = HostTier(pool, True, ThreadPoolExecutor(max_workers=1))
    engine = MigrationEngine(tier, None, True, keep_clean=False)
    tensors, records = make_records(count, nbytes, "cuda")
    by_key = {r.key: r for r in records}
    slots = [pool.alloc(nbytes) for _ in records]
    scratch = [torch.empty(nbytes, dtype=torch.uint8, device="cuda").untyped_storage() for _ in records]
    cpp = build_cpp() if args.cpp else None
    rows = {name: [] for name in ("engine_out", "engine_in", "tier_out", "tier_in", "tier_group_out", "tier_group_in",
                                  "resize", "lean_out", "lean_in", "lean_each_out")
            + (("cpp_out", "cpp_in") if cpp else ())}
    for _ in range(args.rounds):
        rows["engine_out"].append(per_copy_us(lambda: [engine.offload(r, "host") for r in records], count))
        engine.poll(by_key)

        def bring_back():
            for r in records:
                engine.prefetch(r)
            for r in records:
                engine.ensure_resident(r, "bench")
        rows["engine_in"].append(per_copy_us(bring_back, count))
        engine.poll(by_key)
        storages = [t.untyped_storage() for t in tensors]
        for grouped in (False, True):  # Note [One compute-stream event per group of copies]
            name = "tier_group" if grouped else "tier"
            rows[f"{name}_out"].append(per_copy_us(lambda: tier_copies(tier, storages, slots, True, grouped), count))
            rows[f"{name}_in"].append(per_copy_us(lambda: tier_copies(tier, storages, slots, False, grouped), count))
        rows["resize"].append(per_copy_us(lambda: [(s.resize_(0), s.resize_(nbytes)) for s in scratch], count))
        rows["lean_out"].append(per_copy_us(lambda: lean(tier.d2h_stream, storages, slots, pool, out=True), count))
        rows["lean_in"].append(per_copy_us(lambda: lean(tier.h2d_stream, storages, slots, pool, out=False), count))
        rows["lean_each_out"].append(per_copy_us(
            lambda: [lean(tier.d2h_stream, [s], [slot], pool, out=True) for s, slot in zip(storages, slots)], count))
        if cpp:
            for name, stream, out in (("cpp_out", tier.d2h_stream, True), ("cpp_in", tier.h2d_stream, False)):
                events = []
                rows[name].append(per_copy_us(lambda: events.extend(cpp_copies(cpp, stream, storages, slots, pool, out)),
                                              count))
                for event in events:
                    cpp.query_and_free(event)
    assert all(torch.equal(t, torch.full_like(t, float(i))) for i, t in enumerate(tensors)), "a copy lost bytes"
    return {name: round(statistics.median(values), 1) for name, values in rows.items()}


def tier_copies(tier, storages, slots, out: bool, grouped: bool) -> None:
    """HostTier's copies of every storage, each with its own compute-stream event or, grouped,
    all after one (as the plan's offloads after one kernel are)."""
    mark = ComputeMark(cuda=True)
    with mark if grouped else contextlib.nullcontext():
        for storage, slot in zip(storages, slots):
            tier.copy_out(storage, slot, mark) if out else tier.copy_in(storage, slot, None, mark)


def lean(stream, storages, slots, pool, out: bool) -> None:
    """The tier's stream work with one untimed event per copy and the compute stream's event
    recorded once for the batch."""
    compute = compute_stream()
    ready = torch.cuda.Event()
    ready.record(compute)
    stream.wait_event(ready)
    torch.cuda.set_stream(stream)
    try:
        for storage, slot in zip(storages, slots):
            view, host = byte_view(storage), pool.slice(slot, storage.nbytes())
            (host.copy_(view, non_blocking=True) if out else view.copy_(host, non_blocking=True))
            view.record_stream(stream)
            torch.cuda.Event().record(stream)
    finally:
        torch.cuda.set_stream(compute)


def cpp_copies(cpp, stream, storages, slots, pool, out: bool) -> list:
    events = []
    for storage, slot in zip(storages, slots):
        view, host = byte_view(storage), pool.slice(slot, storage.nbytes())
        dst, src = (host, view) if out else (view, host)
        events.append(cpp.stream_copy(dst, src, stream.cuda_stream, view))
    return events


def build_cpp():
    from torch.utils.cpp_extension import load_inline

    t0 = time.perf_counter()
    module = load_inline("teraio_copy_bench", CPP_SOURCE, with_cuda=True, verbose=False)
    print(f"built the C++ copy in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=1000)
    parser.add_argument("--nbytes", type=int, default=1 << 20, help="bytes per storage")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cpp", action="store_true", help="also the C++ floor (builds an extension)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("copy_issue_cost.py measures CUDA stream copies: run it on a GPU machine")
    result = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "copies": args.copies, "nbytes": args.nbytes,
              "us_per_copy": measure(args)}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
