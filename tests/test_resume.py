"""Jobs stopped and resumed from a checkpoint, under a plan: a plain PyTorch loop that saves
model, optimizer, scheduler and RNG state with torch.save and a second process that loads
them and trains on (tests/clients/resume_loop.py). The checkpoint written under a plan loads
equal to the plain run's, and the resumed process trains bit for bit like a plain resume,
under the plan of the uninterrupted job and under one profiled from the resumed process.
"""

import json
import shutil

import pytest
import torch

from teraio.formats.plan import load_plan
from teraio.formats.trace import Kind, load_trace
from test_clients import profile_and_plan, run_plain, run_planned

FRESH = ("--steps", 6, "--save-at", 2)


def _losses(path) -> list[float]:
    return json.loads(path.read_text())


def _assert_same_checkpoint(a, b) -> None:
    mine, theirs = torch.load(a), torch.load(b)
    assert mine["model"].keys() == theirs["model"].keys()
    assert all(torch.equal(mine["model"][k], theirs["model"][k]) for k in theirs["model"])
    state, plain_state = mine["optimizer"]["state"], theirs["optimizer"]["state"]
    assert state.keys() == plain_state.keys()
    assert all(torch.equal(state[i][k], plain_state[i][k]) for i in plain_state for k in plain_state[i])
    assert torch.equal(mine["rng"], theirs["rng"]) and mine["scheduler"] == theirs["scheduler"]


def test_checkpoint_written_under_a_plan_resumes_like_the_plain_one(tmp_path):
    """The uninterrupted job's plan serves both processes: the one that saves (weights and
    AdamW state moved out when torch.save reads them) and the one that loads and trains on."""
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "resume_loop.py", *FRESH, "--losses-out", "a.json")  # its tail is what a plain resume gives
    plan = profile_and_plan(tmp_path, "resume_loop.py", *FRESH)
    _, report = run_planned(tmp_path, plan, "resume_loop.py", *FRESH, "--losses-out", "a.json")
    assert _losses(tmp_path / "a.json") == _losses(plain / "a.json")
    assert report.offloaded_bytes_by_kind["optimizer_state"] > 0
    _assert_same_checkpoint(tmp_path / "ckpt.pt", plain / "ckpt.pt")
    _, report = run_planned(tmp_path, plan, "resume_loop.py", "--steps", 6, "--resume", "ckpt.pt",
                            "--losses-out", "b.json")
    assert _losses(tmp_path / "b.json") == _losses(plain / "a.json")[3:]
    assert report.guard_trips == 0 and report.iterations_on_plan >= 1


def _resumed_profile_and_run(tmp_path, *load):
    """Profile and run the resumed process itself (its state loaded, not made by a first step)."""
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "resume_loop.py", "--steps", 8, "--save-at", 1, "--losses-out", "a.json")
    run_plain(plain, "resume_loop.py", "--steps", 8, "--resume", "ckpt.pt", "--losses-out", "b.json", *load)
    shutil.copy(plain / "ckpt.pt", tmp_path)
    resumed = ("--steps", 8, "--resume", "ckpt.pt", "--losses-out", "b.json", *load)
    plan = profile_and_plan(tmp_path, "resume_loop.py", *resumed)
    _, report = run_planned(tmp_path, plan, "resume_loop.py", *resumed)
    return plain, plan, report


def test_resumed_process_names_loaded_optimizer_state_and_trains_identically(tmp_path):
    """AdamW state that load_state_dict made (no first step) is named by parameter and key."""
    plain, plan, report = _resumed_profile_and_run(tmp_path)
    trace = load_trace(tmp_path / "t.msgpack")
    state = {trace.tensor_name[i] for i in range(trace.num_tensors) if Kind(trace.kind[i]) == Kind.optimizer_state}
    assert {"0.0.weight:exp_avg", "0.0.weight:exp_avg_sq", "3.0.bias:exp_avg"} <= state
    assert any(entry.kind == "optimizer_state" for entry in load_plan(plan).entries)
    assert _losses(tmp_path / "b.json") == _losses(plain / "b.json") == _losses(plain / "a.json")[2:]
    assert report.guard_trips == 0 and report.iterations_on_plan >= 3
    # torch.load's CPU storages get the allocator's memory before they leave (Note [Storages
    # torch.load made]): no plan offload of the loaded state is refused
    assert report.refused_actions_by_reason.get("not_resizable", 0) == 0


@pytest.mark.parametrize("load", [(), ("--mmap",), ("--map-location-fn",)], ids=["read", "mmap", "map-location-fn"])
def test_resumed_process_moves_its_loaded_optimizer_state_within_budget(tmp_path, load):
    """On the CPU, optimizer.load_state_dict keeps the very tensors torch.load made, whose
    storages are not resizable (the bytes it read, or with mmap=True a mapping of the file):
    they are given storages of the allocator's as they first leave, so the plan moves them,
    the run stays within its budget from the load on, and it trains like the plain resume.
    Also where a map_location function hands torch.load's storages back as they are, as
    Lightning's checkpoint loading does."""
    plain, _, report = _resumed_profile_and_run(tmp_path, *load)
    assert _losses(tmp_path / "b.json") == _losses(plain / "b.json") == _losses(plain / "a.json")[2:]
    assert report.offloaded_bytes_by_kind.get("optimizer_state", 0) > 0
    assert report.peak_device_bytes <= report.budget_bytes
    assert report.refused_actions_by_reason == {}


def test_torch_load_marks_only_the_storages_it_owns(tmp_path):
    """Note [Storages torch.load made]: the runtime gives only marked storages the allocator's
    memory; a tensor made from a numpy array shares the array's memory, and a MAP_SHARED
    mapping the file's: they stay unmarked."""
    import mmap

    import numpy as np

    from teraio.raw_access import _mark_loads, made_by_load

    _mark_loads(torch.serialization)
    torch.save({"w": torch.arange(6.0)}, tmp_path / "w.pt")
    read, mapped = torch.load(tmp_path / "w.pt")["w"], torch.load(tmp_path / "w.pt", mmap=True)["w"]
    assert made_by_load(read.untyped_storage()) and made_by_load(mapped.untyped_storage())
    assert not made_by_load(torch.from_numpy(np.zeros(3)).untyped_storage())
    assert not made_by_load(torch.arange(6.0).untyped_storage())
    torch.serialization.set_default_mmap_options(mmap.MAP_SHARED)
    try:
        assert not made_by_load(torch.load(tmp_path / "w.pt", mmap=True)["w"].untyped_storage())
    finally:
        torch.serialization.set_default_mmap_options(mmap.MAP_PRIVATE)
