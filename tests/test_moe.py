"""A mixture of experts whose ops follow its routing (tests/clients/hf_moe.py, transformers'
eager Mixtral experts), as a user tried it: exact under a plan, its steps counted as steps,
and a save that holds the device over its budget said so, naming the save."""

import json

from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import PYTHON, ok, teraio
from test_clients import CLIENTS, assert_same_safetensors, run_plain

ARGS = ("--steps", "16", "--losses-out", "l.json", "--save-pretrained", "sp")


def test_a_routed_mixture_of_experts_trains_exactly_and_its_save_over_budget_is_said(tmp_path):
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / "hf_moe.py", *ARGS, cwd=tmp_path))
    peak = int(live_bytes_per_kernel(load_trace(tmp_path / "t.msgpack")).max())
    ok(teraio("plan", tmp_path / "t.msgpack", "--gpu-mem", peak // 4, "--ssds", 0, "--host-mem", "1GiB",
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "hf_moe.py", *ARGS)
    proc = ok(teraio("run", "--plan", tmp_path / "plan.json", "--report", tmp_path / "run.json", "--", PYTHON,
                     CLIENTS / "hf_moe.py", *ARGS, cwd=tmp_path))
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads((plain / "l.json").read_text())
    assert_same_safetensors(tmp_path / "sp" / "model.safetensors", plain / "sp" / "model.safetensors")
    report = load_report(tmp_path / "run.json")
    assert all(row.resident_peak_bytes <= report.budget_bytes for row in report.per_iteration)
    # save_pretrained's per-expert copies stay on the device while it reads them: said once, as the save's
    assert report.peak_in_saves_bytes > report.budget_bytes, "the case this test is for did not happen"
    said = [line for line in proc.stderr.splitlines() if line.startswith("teraio: ") and "while a save read" in line]
    assert len(said) == 1 and said[0].startswith("teraio: warning:")
    summary = " ".join(proc.stderr.split())
    assert "over the budget only while a save read" in summary and "could not hold the budget" not in summary


def test_routed_steps_with_accumulation_are_one_step_an_iteration(tmp_path):
    """Op counts that follow the data alternated by chance (A, B, A, B): two steps were taken for
    one iteration of a one-optimizer loop."""
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / "hf_moe.py", *ARGS,
              "--accum", "2", cwd=tmp_path))
    assert load_trace(tmp_path / "t.msgpack").header.steps_per_iteration == 1
