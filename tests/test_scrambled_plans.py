"""Plans that are wrong about the job they are run with: the runtime must still train exactly.

A plan is a file users edit, diff and carry from run to run; it may name the right tensors at
the wrong kernels. Here the bundled example's own trace is planned by hand with every kind of
mistake a plan can make while passing its schema, drawn from a seeded generator: periods over
the tensor's own uses (an offload just before the op that reads it, a prefetch after the use),
kernels out of order, overlapping entries for one tensor, wrap-around flags on periods that do
not wrap, recompute entries naming an op that did not make the tensor, or the one that did with
periods over its uses. (Sizes that are not the tensor's make the runtime refuse the whole plan:
tests/test_plan_sizes.py.) The run must end with the plain run's losses, final weights and checkpoint bit for
bit, its exit status 0, and the device within its budget; what it refused is its business.
"""

import random

import pytest

from teraio.formats.plan import PlanEntry, save_plan, sort_entries
from teraio.formats.trace import Kind, live_bytes_per_kernel, load_trace
from runtime_helpers import MOVABLE, every_period_plan
from test_run import assert_twin, run_example, work  # noqa: F401 (the shared profile and plain run)

ENTRIES_PER_PLAN = 400


def scrambled_entry(trace, rng: random.Random, t: int) -> PlanEntry:
    """One entry for tensor t with kernels, tier and flags drawn at random."""
    last = trace.num_kernels - 1
    kernels = [rng.randint(0, last) for _ in range(4)]
    if rng.random() < 0.7:   # most in order, some not
        kernels.sort()
    tier = rng.choice(("host", "ssd", "recompute"))
    born = int(trace.born[t])
    produced_at = None
    if tier == "recompute" and born >= 0 and rng.random() < 0.5:   # the right op, at the wrong kernels
        produced_at, kernels[0] = born, rng.randint(born, last)
    elif tier == "recompute":
        produced_at = rng.randint(0, kernels[0])
    return PlanEntry(tensor=trace.tensor_id[t], name=trace.tensor_name[t], kind=Kind(trace.kind[t]).name,
                     nbytes=int(trace.nbytes[t]), tier=tier, offload_after=kernels[0], offload_by=kernels[1],
                     prefetch_at=kernels[2], needed_by=kernels[3],
                     wraps=tier != "recompute" and rng.random() < 0.3, clean=tier == "host" and rng.random() < 0.2,
                     produced_at=produced_at, reason="test: scrambled")


def scrambled_plan(trace, budget_bytes: int, seed: int):
    rng = random.Random(seed)
    movable = [t for t in range(trace.num_tensors) if Kind(trace.kind[t]) in MOVABLE and trace.nbytes[t] > 0]
    plan = every_period_plan(trace, budget_bytes)
    entries = [scrambled_entry(trace, rng, rng.choice(movable)) for _ in range(ENTRIES_PER_PLAN)]
    return plan.model_copy(update={"entries": sort_entries(entries)})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_plan_wrong_about_every_kernel_still_trains_exactly_within_budget(work, tmp_path, seed):  # noqa: F811
    trace = load_trace(work / "trace.msgpack")
    budget = int(live_bytes_per_kernel(trace).max()) // 2
    save_plan(scrambled_plan(trace, budget, seed), tmp_path / "plan.json")
    proc, report = run_example(work, tmp_path, tmp_path / "plan.json")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert_twin(work, tmp_path)
    assert report.peak_device_bytes <= report.budget_bytes == budget
