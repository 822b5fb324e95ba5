"""On a CUDA GPU (skipped elsewhere): the parts the CPU tests cannot reach. Run them on the GPU
machine with `python -m pytest -m gpu tests/test_gpu.py`."""

import os
import subprocess
import sys

import pytest
import torch

from teraio.formats.plan import save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import EXAMPLE, losses
from runtime_helpers import every_period_plan

pytestmark = pytest.mark.gpu
ARGS = ("--device", "cuda", "--deterministic", "--steps", "6", "--clip", "0.5")


def run(*args, cwd):
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_host_pool_is_pinned_at_exactly_the_requested_size():
    from teraio_run.tiers import HostPool

    nbytes = 2**31 + 4096 + 1  # pin_memory=True would round this up to 4 GiB
    pool = HostPool(nbytes, pin=True)
    assert pool.buffer.is_pinned() and pool.buffer.numel() == nbytes


def test_allocated_bytes_is_the_allocators_count():
    from teraio.walk import cuda_allocated_bytes

    keep = [torch.empty(n, device="cuda") for n in (1000, 123457, 2**20)]
    assert cuda_allocated_bytes() == torch.cuda.memory_allocated()
    del keep


def test_every_idle_period_through_both_tiers_trains_identically_on_cuda(tmp_path):
    """Stream copies, record_stream, KvikIO (or POSIX) swap files and the cap, bit for bit."""
    run(EXAMPLE, *ARGS, "--losses-out", tmp_path / "plain.json", cwd=tmp_path)
    run("-m", "teraio", "profile", "-o", tmp_path / "trace.msgpack", "--", sys.executable, EXAMPLE, *ARGS,
        cwd=tmp_path)
    trace = load_trace(tmp_path / "trace.msgpack")
    budget = int(live_bytes_per_kernel(trace).max()) // 2
    save_plan(every_period_plan(trace, budget_bytes=budget), tmp_path / "plan.json")
    # The tiny model's half peak is a few MiB, less than cuBLAS's workspace: the device cap is
    # set well above it, the plan's budget still drives every offload and eviction.
    run("-m", "teraio", "run", "--plan", tmp_path / "plan.json", "--gpu-mem", "8GiB", "--ssd-dir", tmp_path / "ssd",
        "--report", tmp_path / "run.json", "--", sys.executable, EXAMPLE, *ARGS, "--losses-out",
        tmp_path / "run_losses.json", cwd=tmp_path)
    assert losses(tmp_path / "run_losses.json") == losses(tmp_path / "plain.json")
    report = load_report(tmp_path / "run.json")
    assert report.iterations_on_plan >= 2 and report.io_errors == 0
    assert report.offloaded_bytes["host"] > 0 and report.offloaded_bytes["ssd"] > 0
