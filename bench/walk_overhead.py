"""Per-op cost of the op walk that profile and run share, on small CPU ops.

    python bench/walk_overhead.py

Times 5000 small CPU ops (two 16-element tensors) plainly, under an empty TorchDispatchMode
(what any dispatch mode costs), and under the walk with a listener that does nothing: an
in-place addition (makes no storage: the walk only looks its inputs up) and an addition that
makes a storage (the walk names and records it), and that last one again with the wrapper
PyTorch would put around the walk's __torch_dispatch__ (torch._dynamo.disable; Note [Dynamo
off in the walk] in teraio/walk.py), which the walk turns off. Best of 5 rounds, in us per op; the walk
forgets the records of freed storages after each round, as the runtime does at each
iteration end. docs/runtime.md, "Host cost per kernel", keeps the results.
"""

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from teraio.walk import OpWalk, WalkListener, activate, deactivate

OPS_PER_ROUND = 5000
ROUNDS = 5


class EmptyMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def us_per_op(op, x: torch.Tensor, y: torch.Tensor, walk: OpWalk | None = None) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(OPS_PER_ROUND):
            op(x, y)
        best = min(best, (time.perf_counter() - t0) / OPS_PER_ROUND * 1e6)
        if walk is not None:
            walk.forget_expired()
    return best


class WalkInDynamoWrapper(OpWalk):
    """The walk as PyTorch would wrap it by default (plus one delegating call)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return OpWalk.__torch_dispatch__(self, func, types, args, kwargs)


def under_walk(op, x, y, walk_class=OpWalk) -> float:
    walk = walk_class(WalkListener(), "cpu")
    activate(walk)
    try:
        us_per_op(op, x, y, walk)  # first ops pay one-time imports and memos
        return us_per_op(op, x, y, walk)
    finally:
        deactivate(walk)


def main() -> None:
    torch.set_num_threads(1)
    x, y = torch.randn(16), torch.randn(16)
    makes, in_place = torch.add, torch.Tensor.add_
    plain = us_per_op(makes, x, y)
    with EmptyMode():
        us_per_op(makes, x, y)
        empty = us_per_op(makes, x, y)
    no_storage = under_walk(in_place, x, y)
    storage = under_walk(makes, x, y)
    wrapped = under_walk(makes, x, y, WalkInDynamoWrapper)
    print(f"plain {plain:.1f} us/op; empty dispatch mode {empty:.1f} (+{empty - plain:.1f}); "
          f"walk, op that makes no storage {no_storage:.1f} (+{no_storage - plain:.1f}); "
          f"walk, op that makes one {storage:.1f} (+{storage - plain:.1f}); "
          f"the same in torch's dynamo wrapper {wrapped:.1f} (+{wrapped - plain:.1f})")


if __name__ == "__main__":
    main()
