"""What the device link carries one way alone and both ways at once (Note [Bandwidth model]).

    python bench/link_probe.py --gib 8 --chunk-mib 64 --out link.json

Pinned host buffers, one copy stream per direction as the runtime has (teraio_run/tiers.py),
copies of --chunk-mib each: device -> host alone, host -> device alone, then both at once
(each direction on its own stream, started together). Prints GB/s (1e9 B/s) per direction and
for both together, the medians of --rounds; with --out, the same as JSON. The figures are what
`teraio plan --host-gbps` (one way alone) and `--link-total-gbps` (both together, where it is
less than twice one way) take.
"""

import argparse
import json
import statistics
import time

import torch


def _copies(streams_and_pairs) -> float:
    """Seconds for every (stream, [(dst, src), ...]) to finish, all started at once."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for stream, pairs in streams_and_pairs:
        with torch.cuda.stream(stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def probe(total_bytes: int, chunk_bytes: int, rounds: int) -> dict:
    count = max(1, total_bytes // chunk_bytes)
    n = chunk_bytes // 4
    dev_out = [torch.empty(n, device="cuda") for _ in range(count)]
    dev_in = [torch.empty(n, device="cuda") for _ in range(count)]
    host_out = [torch.empty(n, pin_memory=True) for _ in range(count)]
    host_in = [torch.empty(n, pin_memory=True) for _ in range(count)]
    d2h, h2d = torch.cuda.Stream(), torch.cuda.Stream()
    out_pairs, in_pairs = list(zip(host_out, dev_out)), list(zip(dev_in, host_in))
    moved = count * chunk_bytes
    runs = {"d2h_alone": [], "h2d_alone": [], "both_total": []}
    _copies([(d2h, out_pairs[:2]), (h2d, in_pairs[:2])])  # warm up
    for _ in range(rounds):
        runs["d2h_alone"].append(moved / _copies([(d2h, out_pairs)]) / 1e9)
        runs["h2d_alone"].append(moved / _copies([(h2d, in_pairs)]) / 1e9)
        runs["both_total"].append(2 * moved / _copies([(d2h, out_pairs), (h2d, in_pairs)]) / 1e9)
    return {"chunk_bytes": chunk_bytes, "bytes_each_way": moved, "rounds": rounds,
            "gbps_median": {k: round(statistics.median(v), 2) for k, v in runs.items()},
            "gbps_all": {k: [round(x, 2) for x in v] for k, v in runs.items()},
            "device": torch.cuda.get_device_name(), "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="bytes each way per round, GiB")
    parser.add_argument("--chunk-mib", type=int, nargs="+", default=[64], help="bytes per copy, MiB (several: one probe each)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/link_probe.py needs a CUDA device: run it on the GPU machine")
    results = [probe(int(args.gib * 2**30), mib * 2**20, args.rounds) for mib in args.chunk_mib]
    for r in results:
        print(f"{r['chunk_bytes'] // 2**20} MiB copies: " + ", ".join(f"{k} {v} GB/s" for k, v in r["gbps_median"].items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
