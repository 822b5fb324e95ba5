"""How many copies the plans of the recorded traces start per iteration, and what they predict.

    python bench/plan_copies.py                            # the committed traces and the LoRA case's
    PYTHONPATH=/tmp/old python bench/plan_copies.py        # the same with another commit's planner
                                                           # (git worktree add /tmp/old <sha>)

Each trace is planned with default rates (no host time per copy: what a first plan charges)
at 1/2 and 1/4 of its peak on the host pool alone (as large as the peak), and at 1/2 with one
disk (1.7 / 2.0 GB/s, the H200 machine's) beside a host pool of 1/4 of the peak. Per plan:
copies started per iteration (teraio_plan.make.copies_per_iteration), how many of them move
less than 1 MiB, the predicted iteration and whether it fits. On the H200 each copy started
costs the job's thread ~100 us (docs/planner.md, Calibration): fewer copies is time the
default-rate prediction does not show. docs/planner.md, The fill pass's order, keeps the table.
"""

import argparse
import subprocess
from pathlib import Path

from teraio.formats.trace import live_bytes_per_kernel, load_trace
from teraio_plan import make_plan_outcome, planner_inputs
from teraio_plan.make import copies_per_iteration

ROOT = Path(__file__).resolve().parents[1]
LORA_TRACE = ROOT / "bench/results/2026-12-05-lora-calibrated-h200-ed22602/trace_lora.msgpack"
SMALL_BYTES = 2**20
# (label, share of the peak, disks, host pool as a share of the peak)
CONFIGS = (("host, 1/2", 2, 0, 1.0), ("host, 1/4", 4, 0, 1.0), ("disk + host 1/4, 1/2", 2, 1, 0.25))


def row(path: Path, label: str, share: int, ssds: int, host_share: float) -> str:
    trace = load_trace(path)
    peak_bytes = int(live_bytes_per_kernel(trace).max())
    inputs = planner_inputs(trace, gpu_mem_bytes=peak_bytes // share, num_ssds=ssds, ssd_read_gbps=1.7,
                            ssd_write_gbps=2.0, host_mem_bytes=int(peak_bytes * host_share), host_gbps=37,
                            pcie_gbps=55, headroom_bytes=0)
    plan = make_plan_outcome(trace, inputs).plan
    moves = [e for e in plan.entries if e.tier in ("host", "ssd")]
    small = sum(2 for e in moves if e.nbytes < SMALL_BYTES)   # a move is two copies
    prediction = plan.header.prediction
    return (f"| {path.name} | {label} | {copies_per_iteration(plan.entries):,} | {small:,} "
            f"| {prediction.iteration_ms:,.1f} | {'yes' if prediction.fits else 'no'} |")


def calibrated_lora_row() -> str:
    """The LoRA case as bench/gpu_lora.sh plans it (headroom 1 GiB), with and without its
    recorded run's calibration."""
    from teraio_plan.calibrate import calibrated

    trace = load_trace(LORA_TRACE)
    half_peak = int(live_bytes_per_kernel(trace).max()) // 2
    inputs = planner_inputs(trace, gpu_mem_bytes=half_peak, num_ssds=0, host_mem_bytes=64 * 2**30, host_gbps=37,
                            pcie_gbps=55, headroom_bytes=2**30)
    cells = []
    for label, these in (("guessed", inputs), ("calibrated", calibrated(inputs, trace, LORA_TRACE.parent / "run_lora.json",
                                                                          given={"host_gbps", "pcie_gbps"}))):
        plan = make_plan_outcome(trace, these).plan
        cells.append(f"{label}: {copies_per_iteration(plan.entries):,} copies, {plan.header.prediction.iteration_ms:,.1f} ms")
    return "LoRA case, host, 1/2, headroom 1 GiB: " + "; ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="*", type=Path,
                    default=[ROOT / "traces" / n for n in ("h200-1b-bf16.msgpack", "h200-3b-fp32.msgpack",
                                                           "h200-3b-bf16.msgpack")] + [LORA_TRACE])
    args = ap.parse_args()
    import teraio_plan
    where = Path(teraio_plan.__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "teraio_plan"], capture_output=True,
                           text=True).stdout.strip()
    print(f"planner from {where} at {commit}{' (teraio_plan modified)' if dirty else ''}")
    print("| trace | tiers, budget | copies per iteration | of them under 1 MiB | predicted ms | fits |")
    print("|---|---|---:|---:|---:|---|")
    for path in args.traces:
        for config in CONFIGS:
            print(row(path, *config), flush=True)
    print(calibrated_lora_row())


if __name__ == "__main__":
    main()
