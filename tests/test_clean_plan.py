"""Clean entries (teraio_plan/clean.py, Note [Clean entries]): the planner counts no copy for an
offload whose host pool copy is still current, and the runtime agrees.

Through the real CLI on the bundled example with gradient accumulation (CPU): weights leave
and come back once per micro-batch and are written only by the optimizer step.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from teraio.formats.plan import load_plan
from teraio.formats.report import load_report
from teraio.formats.trace import Kind, Phase, live_bytes_per_kernel, load_trace
from teraio_plan.simulator import simulate
from cli_helpers import CPU_ENV, EXAMPLE, PYTHON, example, losses, ok, teraio

ROOT = Path(__file__).resolve().parents[1]
ARGS = ("--device", "cpu", "--steps", "6", "--accum", "2")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clean")
    ok(teraio("profile", "-o", tmp / "trace.msgpack", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp))
    peak_bytes = int(live_bytes_per_kernel(load_trace(tmp / "trace.msgpack")).max())
    plan_args = (tmp / "trace.msgpack", "--gpu-mem", peak_bytes // 2, "--ssds", 0, "--host-mem", peak_bytes)
    ok(teraio("plan", *plan_args, "-o", tmp / "clean.json", cwd=tmp))
    ok(teraio("plan", *plan_args, "--no-clean-copies", "-o", tmp / "copies.json", cwd=tmp))
    return tmp, peak_bytes


def test_the_trace_says_which_uses_write_a_tensor(work):
    tmp, _ = work
    trace = load_trace(tmp / "trace.msgpack")
    assert len(trace.use_writes) == len(trace.use_kernels)
    for t in np.flatnonzero(trace.kind == Kind.parameter):
        uses = trace.uses(t)
        written = uses[trace.use_writes[trace.use_offsets[t]:trace.use_offsets[t + 1]]]
        assert len(written) and (trace.kernel_phase[written] == Phase.optimizer).all(), trace.tensor_id[t]


def test_unwritten_reoffloads_are_planned_clean_and_cost_no_copy(work):
    tmp, peak_bytes = work
    clean, copies = load_plan(tmp / "clean.json"), load_plan(tmp / "copies.json")
    marked = [e for e in clean.entries if e.clean]
    assert marked and not any(e.clean for e in copies.entries)
    # optimizer state is written every step; `other` may be clean (a storage the job made and only reads)
    assert {e.kind for e in marked} <= {"parameter", "activation", "other"}
    assert clean.header.prediction.clean_bytes_per_iteration == sum(e.nbytes for e in marked)
    assert clean.header.prediction.host_pool_bytes <= peak_bytes
    trace = load_trace(tmp / "trace.msgpack")
    as_copies = clean.model_copy(update={"entries": [e.model_copy(update={"clean": False}) for e in clean.entries]})
    moved = simulate(trace, clean).bytes_by_path["d2h"]
    assert simulate(trace, as_copies).bytes_by_path["d2h"] - moved == clean.header.prediction.clean_bytes_per_iteration
    diff = json.loads(ok(teraio("diff", tmp / "copies.json", tmp / "clean.json", "--json", cwd=tmp)).stdout)
    assert sorted(c["tensor"] for c in diff["changed"] if "clean" in c["fields"]) == sorted(e.tensor for e in marked)


def test_the_run_releases_at_least_the_planned_clean_bytes_without_a_copy(work, tmp_path):
    tmp, _ = work
    ok(teraio("run", "--plan", tmp / "clean.json", "--report", tmp_path / "run.json", "--", PYTHON, EXAMPLE, *ARGS,
              "--losses-out", tmp_path / "run.json.losses", cwd=tmp_path))
    ok(example(*ARGS[2:], "--losses-out", tmp_path / "plain.json", cwd=tmp_path))
    assert losses(tmp_path / "run.json.losses") == losses(tmp_path / "plain.json")
    report = load_report(tmp_path / "run.json")
    planned = load_plan(tmp / "clean.json").header.prediction.clean_bytes_per_iteration
    released_clean = report.offloaded_bytes["host"] - report.written_bytes["host"]
    assert report.iterations_on_plan >= 3 and released_clean >= planned * report.iterations_on_plan


def test_a_trace_without_write_information_plans_no_clean_entry(tmp_path):
    """Traces written before use_writes existed (the committed ones): writes unknown, nothing clean."""
    trace = ROOT / "traces" / "cpu-tiny.msgpack"
    assert not len(load_trace(trace).use_writes)
    ok(teraio("plan", trace, "--gpu-mem", "4MiB", "--ssds", 0, "--host-mem", "16MiB", "-o", tmp_path / "p.json",
              cwd=tmp_path))
    assert not any(e.clean for e in load_plan(tmp_path / "p.json").entries)


def test_a_lora_fine_tune_writes_at_most_half_of_what_it_releases(tmp_path):
    """Issue 15's LoRA case (peft adapters on a frozen base, accumulation 4) planned by `teraio
    plan` at half its peak: the frozen weights leave for free after their first copy, in the
    plan and in the run, which trains bit for bit like the plain one."""
    client = ROOT / "tests" / "clients" / "hf_llama.py"
    job = ("--lora", "--accum", 4, "--batch", 1, "--seq", 16)
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, client, "--steps", 6, *job, cwd=tmp_path))
    peak_bytes = int(live_bytes_per_kernel(load_trace(tmp_path / "t.msgpack")).max())
    ok(teraio("plan", tmp_path / "t.msgpack", "--gpu-mem", peak_bytes // 2, "--ssds", 0, "--host-mem", peak_bytes,
              "-o", tmp_path / "p.json", cwd=tmp_path))
    prediction = load_plan(tmp_path / "p.json").header.prediction
    assert prediction.clean_bytes_per_iteration >= prediction.offload_bytes_by_tier["host"] / 2
    ok(teraio("run", "--plan", tmp_path / "p.json", "--report", tmp_path / "r.json", "--", PYTHON, client,
              "--steps", 7, *job, "--losses-out", tmp_path / "run.losses", cwd=tmp_path))
    plain = subprocess.run([PYTHON, str(client), "--steps", "7", *map(str, job), "--losses-out", "plain.losses"],
                           cwd=tmp_path, env=dict(os.environ, **CPU_ENV), capture_output=True)
    assert plain.returncode == 0, plain.stderr
    assert losses(tmp_path / "run.losses") == losses(tmp_path / "plain.losses")
    report = load_report(tmp_path / "r.json")
    assert report.written_bytes["host"] <= report.offloaded_bytes["host"] / 2
