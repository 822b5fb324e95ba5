"""How long loading a big trace takes (issue target: a 250k-kernel trace in under 2 s).

    python bench/trace_load_speed.py            # builds ~250k kernels from traces/h200-1b-bf16

The big trace is the committed H200 trace made deeper the way bench/plan_speed.py does it
(its `deeper`), written with save_trace, then loaded with load_trace: msgpack decode, header
validation, columns into numpy. Prints the best of three loads.
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plan_speed import deeper  # noqa: E402
from teraio.formats.trace import load_trace, save_trace, trace_to_file  # noqa: E402

TRACE = Path(__file__).resolve().parents[1] / "traces" / "h200-1b-bf16.msgpack"
TARGET_KERNELS = 250_000


def main() -> None:
    base = load_trace(TRACE)
    big = deeper(base, max(1, round(TARGET_KERNELS / base.num_kernels)))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.msgpack"
        save_trace(trace_to_file(big), path)
        size_mb = path.stat().st_size / 1e6
        best = min(_timed_load(path) for _ in range(3))
    print(f"{big.num_kernels} kernels, {big.num_tensors} tensors, {size_mb:.1f} MB: load {best:.2f} s")


def _timed_load(path: Path) -> float:
    t0 = time.perf_counter()
    load_trace(path)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
