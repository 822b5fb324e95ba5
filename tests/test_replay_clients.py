"""Replays under the frameworks users train with (teraio_run/replay.py, Note [Replay]): each job
trains bit for bit like its plain run while activations leave without a copy and are made again
by replaying their op, and what it saves meanwhile holds the true values.

Each case profiles a client script from tests/clients/, plans every idle period at half the
traced peak (runtime_helpers.every_period_plan) with every activation entry that one replay
could serve made a recompute entry (as_recompute_plan: more replays than `teraio plan` chooses on
this CPU, where it rarely finds them worth the kernel time), runs it under `teraio run` and plainly.
"""

import json

import torch

from teraio.formats.plan import save_plan
from teraio.formats.trace import load_trace
from teraio_plan.recompute import replayable_op
from cli_helpers import PYTHON, ok, teraio
from runtime_helpers import as_recompute_plan, every_period_plan
from test_clients import CLIENTS, assert_same_safetensors, run_planned, run_plain
from test_run import peak_bytes


def replay_plan(tmp_path, script: str, *args) -> tuple[list[str], int]:
    """Profiles the client and saves its recompute plan; returns the replayed entries' ops and bytes."""
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / script, *args, cwd=tmp_path))
    trace = load_trace(tmp_path / "t.msgpack")
    moves = every_period_plan(trace, peak_bytes(trace) // 2)
    # attention stays a move, as the planner leaves it: the run never replays an op that may draw random numbers
    entries = [e if e.tier != "recompute" or replayable_op(trace.op_name(e.produced_at)) else m
               for e, m in zip(as_recompute_plan(trace, moves).entries, moves.entries)]
    plan = moves.model_copy(update={"entries": entries})
    save_plan(plan, tmp_path / "plan.json")
    replayed = [e for e in plan.entries if e.tier == "recompute"]
    return [trace.op_name(e.produced_at) for e in replayed], sum(e.nbytes for e in replayed)


def assert_every_replay_made(report, replayed_bytes: int) -> None:
    planned = [row for row in report.per_iteration if row.followed_plan]
    assert len(planned) >= 3 and all(row.replay_fallbacks == 0 for row in planned)
    assert report.prefetched_bytes["recompute"] == report.offloaded_bytes["recompute"] >= len(planned) * replayed_bytes
    assert report.written_bytes["recompute"] == 0


def twin_runs(tmp_path, script: str, *args):
    """The client plainly (in tmp_path/plain) and under plan.json (in tmp_path); the losses both
    wrote to l.json are the same. Returns the plain run's folder and the planned run's report."""
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, script, *args)
    _, report = run_planned(tmp_path, tmp_path / "plan.json", script, *args)
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads((plain / "l.json").read_text())
    return plain, report


def test_llama_under_bf16_autocast_replays_its_casts_and_trains_identically(tmp_path):
    """Autocast's casts of the fp32 weights (`_to_copy`) are replayed through copy_, the matmuls
    through their out= overloads; losses and save_pretrained bit for bit like the plain run."""
    ops, replayed_bytes = replay_plan(tmp_path, "hf_llama.py", "--steps", 6, "--autocast")
    assert ops.count("_to_copy") >= 10 and ops.count("mm") >= 5
    plain, report = twin_runs(tmp_path, "hf_llama.py", "--steps", 7, "--autocast", "--losses-out", "l.json",
                              "--save-pretrained", "sp")
    assert_same_safetensors(tmp_path / "sp" / "model.safetensors", plain / "sp" / "model.safetensors")
    assert_every_replay_made(report, replayed_bytes)


def test_gpt2_with_dropout_saved_between_forward_and_backward_trains_identically(tmp_path):
    """Train mode (dropout draws its masks; the ops around them are replayed), and a
    save_pretrained and torch.save while the iteration's activations are released: both see the
    true weights, the plan pauses there and the losses stay those of the plain run."""
    ops, replayed_bytes = replay_plan(tmp_path, "gpt2_dropout.py", "--steps", 6)
    assert len(ops) >= 20
    plain, report = twin_runs(tmp_path, "gpt2_dropout.py", "--steps", 8, "--save-at", 4, "mid",
                              "--losses-out", "l.json")
    assert_same_safetensors(tmp_path / "mid" / "model.safetensors", plain / "mid" / "model.safetensors")
    mine, theirs = (torch.load(d / "mid" / "state.pt") for d in (tmp_path, plain))
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert report.per_iteration[4].paused_at_kernel > 0   # the save ran inside iteration 4
    assert_every_replay_made(report, replayed_bytes)
