"""A job whose batch shapes vary follows its plan (Note [Shapes that vary] in
teraio_profile/recorder.py, Note [When the plan is followed] in teraio_run/agent.py).

The client is an HF Llama loop with dynamic padding and gradient accumulation: every
micro-batch has its own sequence length (32, 24, 16, cycling), two per optimizer step, so no
two iterations in a row have the same shapes. Profiled, the trace is the largest iteration
of the job's op structure; planned at half its traced peak (by the planner, and by every
idle period through both tiers), the run follows the plan in most iterations, trains bit for
bit like the plain run and stays within the budget.
"""

import json

import pytest

from teraio.formats.trace import load_trace
from cli_helpers import PYTHON, ok, teraio
from runtime_helpers import assert_mostly_on_plan_within_budget, plan_at_half_peak
from test_clients import CLIENTS, run_plain, run_planned

ARGS = ("--dynamic", "--accum", 2)
STEPS = 10


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    work = tmp_path_factory.mktemp("varying")
    proc = ok(teraio("profile", "-o", work / "t.msgpack", "--", PYTHON, CLIENTS / "hf_llama.py",
                     "--steps", STEPS, *ARGS, cwd=work))
    run_plain(work, "hf_llama.py", "--steps", STEPS, *ARGS, "--losses-out", "plain.json")
    return work, proc.stderr


def test_profile_keeps_the_largest_iteration_of_the_common_structure_and_says_so(profiled):
    work, stderr = profiled
    trace = load_trace(work / "t.msgpack")
    assert trace.header.structure_digest and trace.header.compared_iterations >= 3
    line = next(line for line in stderr.splitlines() if "shapes vary" in line)
    assert "compared 3 iterations" in line and "the largest" in line


@pytest.mark.parametrize("planner", ["teraio-plan", "every-period"])
def test_varying_shapes_follow_the_plan_bit_identically_within_budget(profiled, tmp_path, planner):
    work, _ = profiled
    plan, budget = plan_at_half_peak(work / "t.msgpack", planner, tmp_path)
    _, report = run_planned(tmp_path, plan, "hf_llama.py", "--steps", STEPS, *ARGS, "--losses-out", "l.json")
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads((work / "plain.json").read_text())
    assert_mostly_on_plan_within_budget(report, budget)
    # `teraio inspect` says how many iterations followed the plan and why the others did not
    view = ok(teraio("inspect", tmp_path / "run.json", cwd=tmp_path)).stdout
    assert f"plan followed in {report.iterations_on_plan} of {len(report.per_iteration)} iterations" in view


def test_batches_longer_than_any_profiled_one_are_kept_in_budget_and_the_summary_says_why_it_evicted(tmp_path):
    """A user's dynamic padding reached 42 tokens where the profile's longest batch had 41:
    ~90 on-demand evictions per iteration, and nothing said why or what to do."""
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / "hf_llama.py", "--steps", 6,
              "--seq", 24, cwd=tmp_path))
    plan, budget = plan_at_half_peak(tmp_path / "t.msgpack", "teraio-plan", tmp_path)
    run_plain(tmp_path, "hf_llama.py", "--steps", 6, "--seq", 32, "--losses-out", "plain.json")
    proc, report = run_planned(tmp_path, plan, "hf_llama.py", "--steps", 6, "--seq", 32, "--losses-out", "l.json")
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads((tmp_path / "plain.json").read_text())
    assert report.iterations_on_plan >= 3 and report.peak_device_bytes <= budget
    evicted = sum(row.evictions for row in report.per_iteration if row.followed_plan)
    summary = " ".join(proc.stderr.split())
    assert evicted > 0 and f"{evicted} on-demand evictions in planned iterations" in summary
    assert "profile with the job's longest batch" in summary
    # the prefetches the longer batches left no room for, or that came back late, are counted
    assert f"prefetches late {report.deadline_misses}" in summary if report.deadline_misses else "prefetches late" not in summary
    assert ("no room until an op needed them" in summary) == (report.skipped_actions > 0)
