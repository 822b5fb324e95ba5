"""Per-op cost of the op walk that profile and run share, on small CPU ops.

    python bench/walk_overhead.py

Times 5000 additions of two 16-element tensors (each makes a new storage, so the walk names
and records one per op) with and without the walk, best of 5 rounds, and prints us per op.
"""

import time

import torch

from teraio.walk import OpWalk, WalkListener, activate, deactivate

OPS_PER_ROUND = 5000
ROUNDS = 5


def us_per_op(x: torch.Tensor, y: torch.Tensor) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(OPS_PER_ROUND):
            x + y
        best = min(best, (time.perf_counter() - t0) / OPS_PER_ROUND * 1e6)
    return best


def main() -> None:
    torch.set_num_threads(1)
    x, y = torch.randn(16), torch.randn(16)
    plain = us_per_op(x, y)
    walk = OpWalk(WalkListener(), "cpu")
    activate(walk)
    try:
        us_per_op(x, y)  # first ops pay one-time imports
        walked = us_per_op(x, y)
    finally:
        deactivate(walk)
    print(f"plain {plain:.1f} us/op, with the walk {walked:.1f} us/op: {walked - plain:.1f} us/op added")


if __name__ == "__main__":
    main()
