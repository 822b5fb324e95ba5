"""Note [Time between ops]: the walk adds up the job's own code between two ops, the short gaps
only, so a calibrated plan charges a job of short kernels for its Python and not for its waits."""

import time

import torch

from teraio.walk import BETWEEN_OPS_LIMIT_S, OpWalk, WalkListener


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_short_gaps_between_ops_count_and_long_waits_do_not():
    x = torch.ones(4)
    walk = OpWalk(WalkListener(), "cpu")
    gap_s, ops = 200e-6, 50
    with walk:
        for _ in range(ops):
            x = x + 1
            busy(gap_s)                           # the job's own Python between two ops
        time.sleep(20 * BETWEEN_OPS_LIMIT_S)      # a wait: data loading, a synchronize outside ATen
        x = x + 1
    between_s = walk.host_s["between"]
    assert (ops - 1) * gap_s <= between_s < (ops + 5) * gap_s + 5e-3
