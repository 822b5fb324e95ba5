"""The bundled example with dynamic padding follows its plan (issue: shapes that vary).

`--min-seq` gives every micro-batch its own sequence length, drawn from the seed, between
--min-seq and --seq; with gradient accumulation no two iterations have the same shapes.
Profiled, planned at half the traced peak and run under the plan, the example trains bit for
bit like its plain run, follows the plan in most iterations and stays within the budget. The
same invocation with `--preset 1b --min-seq 1024` is the H200 case.
"""

import pytest

from teraio.formats.report import load_report
from cli_helpers import EXAMPLE, PYTHON, example, losses, ok, teraio
from runtime_helpers import assert_mostly_on_plan_within_budget, plan_at_half_peak

ARGS = ("--device", "cpu", "--steps", 10, "--accum", 2, "--seq", 64, "--min-seq", 32)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    work = tmp_path_factory.mktemp("example_varying")
    proc = ok(teraio("profile", "-o", work / "t.msgpack", "--", PYTHON, EXAMPLE, *ARGS, cwd=work))
    ok(example(*ARGS[2:], "--losses-out", work / "plain.json", cwd=work))
    return work, proc.stderr


def test_min_seq_draws_the_same_varying_lengths_in_every_run(profiled, tmp_path):
    work, _ = profiled
    ok(example(*ARGS[2:], "--losses-out", tmp_path / "again.json", cwd=tmp_path))
    assert losses(tmp_path / "again.json") == losses(work / "plain.json")
    ok(example(*ARGS[2:-2], "--losses-out", tmp_path / "full.json", cwd=tmp_path))  # without --min-seq
    assert losses(tmp_path / "full.json") != losses(work / "plain.json")


@pytest.mark.parametrize("planner", ["teraio-plan", "every-period"])
def test_example_with_varying_lengths_follows_the_plan_bit_identically_within_budget(profiled, tmp_path,
                                                                                      planner):
    work, stderr = profiled
    assert any("shapes vary" in line for line in stderr.splitlines()), stderr  # the lengths did vary
    plan, budget = plan_at_half_peak(work / "t.msgpack", planner, tmp_path)
    ok(teraio("run", "--plan", plan, "--report", tmp_path / "run.json", "--ssd-dir", tmp_path / "ssd", "--",
              PYTHON, EXAMPLE, *ARGS, "--losses-out", tmp_path / "l.json", cwd=tmp_path))
    report = load_report(tmp_path / "run.json")
    assert losses(tmp_path / "l.json") == losses(work / "plain.json")
    assert_mostly_on_plan_within_budget(report, budget)
