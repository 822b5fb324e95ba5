"""`teraio plan` and `teraio diff`: the click commands directly, and the real CLI once."""

import json

import pytest
from click.testing import CliRunner

from cli_helpers import one_line_error, teraio
from plan_helpers import GiB, MiB, T, layered_trace, make_trace
from teraio.app.cli import cli
from teraio.app.commands.plan import default_output
from teraio.formats.plan import load_plan
from teraio.formats.trace import Kind, save_trace, trace_to_file
from teraio_plan.memory import memory_curve


def write_trace(path, trace=None):
    save_trace(trace_to_file(trace or layered_trace(num_layers=6, kernels_per_layer=10, seed=5)), path)
    return path


def budget_of(trace, share=0.75):
    return str(int(share * memory_curve(trace, 0).max()))


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)


def test_default_output_names():
    assert default_output(__import__("pathlib").Path("a/trace.rank1.msgpack")).name == "trace.plan.rank1.json"
    assert default_output(__import__("pathlib").Path("t.msgpack")).name == "t.plan.json"
    assert default_output(__import__("pathlib").Path("t.bin")).name == "t.bin.plan.json"


def test_plan_writes_the_default_file_and_summarises(tmp_path):
    trace = layered_trace(num_layers=6, kernels_per_layer=10, seed=5)
    path = write_trace(tmp_path / "trace.msgpack", trace)
    res = run("plan", path, "--gpu-mem", budget_of(trace), "--ssds", "4", "--host-mem", "1GiB")
    assert res.exit_code == 0, res.output
    plan = load_plan(tmp_path / "trace.plan.json")
    assert plan.entries and "entries" in res.output and "SSD writes per iteration" in res.output
    # no figure of host time measured: the summary says the prediction leaves it out and how to measure it
    assert "host time" in res.output and "--calibrate" in res.output and "not charged" in res.output



def test_one_plan_per_rank_trace(tmp_path):
    trace = layered_trace(num_layers=4, kernels_per_layer=8, seed=1)
    paths = [write_trace(tmp_path / f"trace.rank{r}.msgpack", trace) for r in range(2)]
    res = run("plan", *paths, "--gpu-mem", budget_of(trace), "--json")
    assert res.exit_code == 0, res.output
    reports = json.loads(res.output)
    assert [r["plan"] for r in reports] == [str(tmp_path / f"trace.plan.rank{r}.json") for r in range(2)]
    assert all((tmp_path / f"trace.plan.rank{r}.json").exists() for r in range(2))


def test_json_summary_keys(tmp_path):
    trace = layered_trace(seed=2)
    path = write_trace(tmp_path / "t.msgpack", trace)
    res = run("plan", path, "--gpu-mem", budget_of(trace), "-o", tmp_path / "p.json", "--json")
    summary = json.loads(res.output)
    for key in ("num_entries", "budget_bytes", "predicted_iteration_ms", "ideal_iteration_ms", "share_of_ideal",
                "predicted_peak_bytes", "offload_bytes_by_tier", "ssd_write_bytes_per_iteration", "fits"):
        assert key in summary
    assert summary["plan"] == str(tmp_path / "p.json")


def test_not_fitting_says_where_and_by_how_much(tmp_path):
    trace = make_trace([10.0] * 100, [T("w", GiB, [0, 99]),
                                      T("x", GiB, list(range(40, 60)), Kind.activation, born=40, freed=60)])
    path = write_trace(tmp_path / "t.msgpack", trace)
    res = CliRunner().invoke(cli, ["plan", str(path), "--gpu-mem", "1.5GiB", "--stall-free"], terminal_width=200)
    assert res.exit_code == 0
    assert "does not fit" in res.output and "512 MiB" in res.output and "kernel 40" in res.output


def test_require_fit_exits_5_and_writes_no_plan_where_it_does_not_fit(tmp_path):
    """For scripts: by default a plan that misses the budget is written (the runtime keeps the
    cap by evicting on demand) and the status is 0; --require-fit makes the miss an error."""
    trace = make_trace([10.0] * 100, [T("w", GiB, [0, 99]),
                                      T("x", GiB, list(range(40, 60)), Kind.activation, born=40, freed=60)])
    path = write_trace(tmp_path / "t.msgpack", trace)
    args = ["plan", str(path), "--gpu-mem", "1.5GiB", "-o", str(tmp_path / "p.json")]
    res = CliRunner().invoke(cli, [*args, "--stall-free", "--require-fit"], terminal_width=200)
    assert res.exit_code == 5 and not (tmp_path / "p.json").exists()
    [line] = res.output.strip().splitlines()
    assert "over budget at" in line and "kernel 40" in line and "no plan written (--require-fit)" in line
    assert CliRunner().invoke(cli, [*args, "--require-fit"]).exit_code == 0  # with stalls it fits
    assert (tmp_path / "p.json").exists()
    # one rank's plan that misses leaves no rank with a plan, the fitting one included
    fits = write_trace(tmp_path / "fits.msgpack", make_trace([10.0] * 10, [T("w", MiB, [0, 9])]))
    res = CliRunner().invoke(cli, ["plan", str(fits), str(path), "--gpu-mem", "1.5GiB", "--stall-free", "--require-fit"])
    assert res.exit_code == 5 and not list(tmp_path.glob("*.plan.json"))


def test_sweep_prints_the_roofline_and_writes_nothing(tmp_path):
    trace = layered_trace(seed=3)
    path = write_trace(tmp_path / "t.msgpack", trace)
    res = run("plan", path, "--gpu-mem", budget_of(trace), "--sweep", "--json")
    rows = json.loads(res.output)["sweep"]
    assert [r["bw_gbps"] for r in rows] == [0, 4, 8, 16, 32, 48, 64]
    assert not list(tmp_path.glob("*.plan.json"))


@pytest.mark.parametrize("args, code, words", [
    (["--gpu-mem", "1GiB", "--ssds", "0"], 2, "nowhere to offload"),
    (["--gpu-mem", "-5GiB"], 2, "size"),
    (["--gpu-mem", "lots"], 2, "cannot read size"),
    (["--ssds", "1"], 2, "--gpu-mem"),
    (["--gpu-mem", "1MiB"], 5, "no plan can work"),
])
def test_bad_input_is_one_line_and_no_plan_file(tmp_path, args, code, words):
    path = write_trace(tmp_path / "t.msgpack")
    res = CliRunner().invoke(cli, ["plan", str(path), *args], terminal_width=300)
    assert res.exit_code == code and words in res.output and "Traceback" not in res.output
    assert not (tmp_path / "t.plan.json").exists()


@pytest.mark.parametrize("args, words", [
    (["plan", "{trace}", "--gpu-mem", "6XB"], "cannot read size '6XB'"),
    (["plan"], "Missing argument"),
    (["inspect", "{folder}"], "is a directory"),
    (["plan", "{trace}", "--no-such-option"], "No such option"),
    (["frobnicate"], "No such command"),
    (["run", "--plan"], "requires an argument. (see teraio run --help)"),
])
def test_click_usage_errors_are_one_line_too(tmp_path, args, words):
    """click printed its usage, a hint and the error on three lines; every other mistake is one."""
    path = write_trace(tmp_path / "t.msgpack")
    proc = teraio(*[a.format(trace=path, folder=tmp_path) for a in args], cwd=tmp_path)
    last = one_line_error(proc, 2)
    assert words in last and "--help" in last and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_teraio_alone_shows_its_help(tmp_path):
    proc = teraio(cwd=tmp_path)
    assert proc.returncode == 2 and "teraio: " not in proc.stderr and "Commands:" in proc.stderr


def test_a_size_typed_with_a_space_says_to_drop_the_space(tmp_path):
    path = write_trace(tmp_path / "t.msgpack")
    last = one_line_error(teraio("plan", path, "--gpu-mem", "6", "MiB", cwd=tmp_path), 3)
    assert "write the two together: --gpu-mem 24MiB, not 24 MiB" in last
    last = one_line_error(teraio("profile", "--gpu-mem", "6", "MiB", "train.py", cwd=tmp_path), 2)
    assert "command 'MiB' not found" in last and "write the two together" in last


def test_a_budget_below_any_kernel_names_the_least_that_runs_and_the_least_that_fits(tmp_path):
    """Two floors (teraio_plan/memory.py): the refusal names both, so the number it gives for a
    plan that fits is not answered by a second complaint (`fits: false` below it)."""
    path = write_trace(tmp_path / "t.msgpack")
    res = CliRunner().invoke(cli, ["plan", str(path), "--gpu-mem", "1MiB", "--ssds", "1"], terminal_width=400)
    words = res.output.split()
    runs, fits = int(words[words.index("least") + 1]), int(words[len(words) - 1 - words[::-1].index("least") + 1])
    assert res.exit_code == 5 and runs <= fits
    assert run("plan", path, "--gpu-mem", runs, "--ssds", "1", "-o", tmp_path / "runs.json").exit_code == 0
    assert run("plan", path, "--gpu-mem", fits, "--ssds", "1", "-o", tmp_path / "fits.json").exit_code == 0
    assert load_plan(tmp_path / "fits.json").header.prediction.fits


def test_truncated_trace_is_a_format_error(tmp_path):
    path = write_trace(tmp_path / "t.msgpack")
    path.write_bytes(path.read_bytes()[:100])
    res = run("plan", path, "--gpu-mem", "1GiB")
    assert res.exit_code == 3 and not (tmp_path / "t.plan.json").exists()


def test_diff_shows_changes_and_exits_zero(tmp_path):
    trace = layered_trace(num_layers=6, kernels_per_layer=10, seed=5)
    path = write_trace(tmp_path / "t.msgpack", trace)
    budget = budget_of(trace, 0.7)
    assert run("plan", path, "--gpu-mem", budget, "--ssds", "1", "-o", tmp_path / "a.json").exit_code == 0
    assert run("plan", path, "--gpu-mem", budget, "--ssds", "4", "--host-mem", "2GiB",
               "-o", tmp_path / "b.json").exit_code == 0
    res = run("diff", tmp_path / "a.json", tmp_path / "b.json")
    assert res.exit_code == 0 and "num_ssds" in res.output
    data = json.loads(run("diff", tmp_path / "a.json", tmp_path / "b.json", "--json").output)
    assert data["inputs"]["num_ssds"] == [1, 4] and data["same_trace"]
    assert data["added"] or data["removed"] or data["changed"]
    same = run("diff", tmp_path / "a.json", tmp_path / "a.json")
    assert same.exit_code == 0 and "plan the same" in same.output


def test_real_cli_plans_the_committed_cpu_trace(tmp_path):
    from cli_helpers import ROOT
    proc = teraio("plan", ROOT / "traces" / "cpu-tiny.msgpack", "--gpu-mem", "6MiB", "-o", tmp_path / "p.json",
                  "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["num_entries"] == len(load_plan(tmp_path / "p.json").entries)


def test_a_budget_below_what_must_stay_names_the_least_that_fits(tmp_path):
    """Between one kernel's own need (the refusal) and what no entry can move (Note [What must
    stay]) a plan cannot fit: the summary names the least --gpu-mem that can, and that the
    runtime still keeps this one by evicting (it used to advise a host pool the plan had)."""
    trace = make_trace([10.0] * 100, [T("w", GiB, [0, 99]),
                                      T("y", GiB, [1, 2, 3], Kind.activation, born=1, freed=4)])
    path = write_trace(tmp_path / "t.msgpack", trace)
    res = CliRunner().invoke(cli, ["plan", str(path), "--gpu-mem", "1.5GiB", "--ssds", 1], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "does not fit" in res.output and f"no plan fits below --gpu-mem {2 * GiB}" in res.output
    assert "evicting on demand" in res.output and "add SSDs" not in res.output
    shown = CliRunner().invoke(cli, ["inspect", str(path)], terminal_width=200)   # the same floor, before planning
    assert f"a plan fits from 2 GiB ({2 * GiB} bytes" in " ".join(shown.output.split()), shown.output


def test_inspect_marks_the_kernels_of_an_entry_away_across_the_iteration_boundary(tmp_path):
    """A weight used at kernels 40 and 60 is idle longest from 60 to the next iteration's 40:
    the entry's table row read "out after 60, back at 3x" as a mistake."""
    trace = make_trace([10.0] * 100, [T("w", GiB, [40, 60]),
                                      T("x", GiB, list(range(0, 20)), Kind.activation, born=0, freed=20)])
    path = write_trace(tmp_path / "t.msgpack", trace)
    assert run("plan", path, "--gpu-mem", "1.5GiB", "--ssds", 0, "--host-mem", "4GiB", "-o", tmp_path / "p.json").exit_code == 0
    entry = next(e for e in load_plan(tmp_path / "p.json").entries if e.name == "w")
    assert entry.wraps and entry.prefetch_at < entry.offload_after
    shown = CliRunner().invoke(cli, ["inspect", str(tmp_path / "p.json")], terminal_width=200).output
    row = next(line for line in shown.splitlines() if "│" in line and line.split("│")[1].strip() == "w")
    assert f"{entry.prefetch_at} (next)" in row and f"{entry.needed_by} (next)" in row, shown
    assert "(next): a kernel of the next iteration" in shown


def test_inspect_at_80_columns_folds_long_names_in_pieces_that_read(tmp_path):
    """Piped, a Faster R-CNN's entries read three letters a line: the kernel columns, each with
    its "(next iteration)", took the width."""
    name = "backbone.body.features.12.block.1.0.weight"
    trace = make_trace([10.0] * 100, [T(name, GiB, [40, 60]),
                                      T("x", GiB, list(range(0, 20)), Kind.activation, born=0, freed=20)])
    path = write_trace(tmp_path / "t.msgpack", trace)
    assert run("plan", path, "--gpu-mem", "1.5GiB", "--ssds", 0, "--host-mem", "4GiB", "-o", tmp_path / "p.json").exit_code == 0
    shown = CliRunner().invoke(cli, ["inspect", str(tmp_path / "p.json")], terminal_width=80).output
    first = next(line for line in shown.splitlines() if "│" in line and name.startswith(line.split("│")[1].strip() or "-"))
    assert len(first.split("│")[1].strip()) >= 16, shown
