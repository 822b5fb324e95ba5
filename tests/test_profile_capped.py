"""Profiling a job under a cap (Note [Profiling under a cap] in teraio_run/capped_profile.py).

A trace profiled at a third of the job's peak must describe the same job as the uncapped
one: same ops, tensors, sizes, lifetimes and uses, and the same plan (kernel times aside:
those are measured, so they differ from run to run). The job itself trains exactly while
it is profiled under the cap.
"""

import dataclasses
import json

import pytest

from teraio.formats.trace import live_bytes_per_kernel, load_trace
from teraio_plan.make import make_plan, planner_inputs
from cli_helpers import EXAMPLE, PYTHON, ok, one_line_error, teraio
from test_clients import CLIENTS, run_plain

JOBS = {
    "example": (EXAMPLE, "--device", "cpu", "--preset", "tiny", "--steps", 6),
    "hf_llama": (CLIENTS / "hf_llama.py", "--steps", 6, "--accum", 2),
}


def _profile(work, name, *options):
    return ok(teraio("profile", "-o", work / f"{name}.msgpack", *options, "--", PYTHON, *JOBS[name], cwd=work))


@pytest.fixture(scope="module", params=sorted(JOBS))
def profiled(request, tmp_path_factory):
    """The job profiled uncapped, then at a third of its traced peak."""
    name, work = request.param, tmp_path_factory.mktemp(request.param)
    _profile(work, name)
    full = load_trace(work / f"{name}.msgpack")
    cap_bytes = int(live_bytes_per_kernel(full).max()) // 3
    proc = ok(teraio("profile", "-o", work / "capped.msgpack", "--gpu-mem", cap_bytes, "--host-mem", "64MiB",
                     "--ssd-dir", work / "ssd", "--", PYTHON, *JOBS[name], cwd=work))
    return full, load_trace(work / "capped.msgpack"), cap_bytes, proc.stderr


def test_a_trace_profiled_at_a_third_of_the_peak_records_the_same_job(profiled):
    full, capped, cap_bytes, _ = profiled
    assert capped.header.op_digest == full.header.op_digest
    assert capped.header.structure_digest == full.header.structure_digest
    assert capped.columns_unlike(full) == []
    assert live_bytes_per_kernel(capped).max() == live_bytes_per_kernel(full).max() > 3 * cap_bytes - 3


def test_the_header_says_the_trace_was_profiled_under_a_cap_and_how_many_kernels_waited(profiled):
    full, capped, cap_bytes, stderr = profiled
    assert full.header.profiled_under_cap is None
    cap = capped.header.profiled_under_cap
    assert cap.device_bytes == cap_bytes and cap.host_pool_bytes == 64 << 20
    assert 0 < cap.waited_kernels < capped.header.num_kernels
    line = next(line for line in stderr.splitlines() if "evictions" in line)
    assert f"{cap.waited_kernels} of the recorded iteration's" in line


def test_the_planner_makes_the_same_entries_from_both_traces_kernel_times_aside(profiled):
    full, capped, _, _ = profiled
    timed_alike = dataclasses.replace(capped, duration_us=full.duration_us)
    budget = int(live_bytes_per_kernel(full).max()) // 2
    plans = [make_plan(t, planner_inputs(t, budget, host_mem_bytes=8 << 20)) for t in (full, timed_alike)]
    assert plans[0].entries and plans[0].entries == plans[1].entries


@pytest.mark.parametrize("copies", [(), ("--no-clean-copies",)], ids=["clean-copies", "every-copy"])
def test_the_job_trains_exactly_while_profiled_under_a_cap(tmp_path, copies):
    cap_args = ("--gpu-mem", "2MiB", "--host-mem", "64MiB", "--ssd-dir", tmp_path / "ssd", "--run-to-completion",
                *copies)
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", *cap_args, "--", PYTHON, *JOBS["hf_llama"],
              "--losses-out", "capped.json", cwd=tmp_path))
    run_plain(tmp_path, "hf_llama.py", "--steps", 6, "--accum", 2, "--losses-out", "plain.json")
    assert json.loads((tmp_path / "capped.json").read_text()) == json.loads((tmp_path / "plain.json").read_text())
    assert (tmp_path / "ssd").is_dir() and not any((tmp_path / "ssd").iterdir())  # swap folder made, then removed


def test_pool_options_without_a_cap_are_refused_with_one_line(tmp_path):
    proc = teraio("profile", "--host-mem", "1GiB", "--", PYTHON, *JOBS["example"], cwd=tmp_path)
    assert "give --gpu-mem too" in one_line_error(proc, 2)


def test_a_cap_no_kernel_fits_under_is_said_not_claimed(tmp_path):
    """At a cap below one kernel's own tensors the keeper cannot hold it; the profile said it
    had profiled under that cap all the same."""
    proc = ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--gpu-mem", "10KiB", "--host-mem", "64MiB",
                     "--ssd-dir", tmp_path / "ssd", "--", PYTHON, *JOBS["example"], cwd=tmp_path))
    said = " ".join(proc.stderr.split())
    assert "profiled under a 10 KiB cap" in said and "the cap could not be held" in said
