"""FSDP2 (`fully_shard` per block and on the root, gloo on CPU) under per-rank plans trains
bit for bit like plain FSDP2, and its parameters, gradients and optimizer state really move.

FSDP2's sharded tensors are DTensors, whose own storage is an empty placeholder (Note [Tensor
subclasses] in teraio/walk.py); its all-gathered parameters are storages FSDP2 frees and
re-allocates itself (Note [FSDP2 unsharded parameters]); its gradients are views of a
reduce-scatter's output (Note [Collective buffers]). Before these were handled, rank 0 died
of a segmentation fault under any plan.
"""

import os
import subprocess
from pathlib import Path

import pytest
import torch

from teraio.formats.plan import load_plan, save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import CPU_ENV, losses, ok, teraio
from runtime_helpers import every_period_plan

SCRIPT = Path(__file__).parent / "clients" / "fsdp2_train.py"
TORCHRUN = ("torchrun", "--nproc-per-node", "2", str(SCRIPT))
KINDS = ("parameter", "gradient", "optimizer_state")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One profile (a trace per rank) and one plain FSDP2 run, shared by the tests here."""
    tmp = tmp_path_factory.mktemp("fsdp2")
    ok(teraio("profile", "-o", tmp / "t.msgpack", "--", *TORCHRUN, cwd=tmp))
    # --standalone: a free port, not 29500, which the profile's torchrun used a moment before.
    # (The plain run's rare exit 1 was gloo's teardown, not the port: see the client's barrier.)
    plain = ("torchrun", "--standalone", *TORCHRUN[1:])
    proc = subprocess.run([*plain, "--losses-out", "plain.json", "--state-out", "plain.pt"], cwd=tmp,
                          capture_output=True, text=True, env=dict(os.environ, **CPU_ENV), timeout=300)
    assert proc.returncode == 0, f"the plain run exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return tmp


def peak_bytes(trace) -> int:
    return int(live_bytes_per_kernel(trace).max())


def run_planned(work, tmp_path, plan):
    ok(teraio("run", "--plan", plan, "--ssd-dir", tmp_path / "ssd", "--report", tmp_path / "run.json", "--",
              *TORCHRUN, "--losses-out", tmp_path / "losses.json", "--state-out", tmp_path / "state.pt",
              cwd=tmp_path))
    assert losses(tmp_path / "losses.json") == losses(work / "plain.json")
    mine, plain = torch.load(tmp_path / "state.pt"), torch.load(work / "plain.pt")
    assert mine.keys() == plain.keys() and all(torch.equal(mine[k], plain[k]) for k in mine)
    return [load_report(tmp_path / f"run.rank{rank}.json") for rank in (0, 1)]


def test_every_idle_period_moved_trains_like_plain_fsdp2(work, tmp_path):
    for rank in (0, 1):
        trace = load_trace(work / f"t.rank{rank}.msgpack")
        assert not trace.header.gradients_stay_on_device  # not DDP: FSDP2's gradients may move
        save_plan(every_period_plan(trace, peak_bytes(trace) // 2), tmp_path / f"plan.rank{rank}.json")
    assert {e.kind for e in load_plan(tmp_path / "plan.rank0.json").entries} >= set(KINDS)
    for report in run_planned(work, tmp_path, tmp_path / "plan.json"):
        assert report.iterations_on_plan >= 3
        assert all(report.offloaded_bytes_by_kind.get(kind, 0) > 0 for kind in KINDS), report.offloaded_bytes_by_kind
        assert report.offloaded_bytes["host"] > 0 and report.offloaded_bytes["ssd"] > 0


def test_planner_plans_at_half_the_peak_train_like_plain_fsdp2_within_budget(work, tmp_path):
    traces = [work / f"t.rank{rank}.msgpack" for rank in (0, 1)]
    budget = max(peak_bytes(load_trace(t)) for t in traces) // 2
    ok(teraio("plan", *traces, "--gpu-mem", budget, "--ssds", 1, "--host-mem", budget, cwd=tmp_path))
    for report in run_planned(work, tmp_path, work / "t.plan.json"):  # t.plan.rankN.json beside the traces
        assert report.iterations_on_plan >= 3 and report.peak_device_bytes <= report.budget_bytes == budget
        assert report.offloaded_bytes_by_kind.get("parameter", 0) > 0
