"""torch.save of a state the plan has partly moved out (Note [Saving from the tiers] in
teraio_run/saving.py): the file holds the true values, as a plain run's, and nothing is brought
back to the device for it."""

import json

import torch

from teraio.formats.plan import save_plan
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import PYTHON, ok, teraio
from runtime_helpers import every_period_plan
from test_clients import CLIENTS, run_planned, run_plain


def test_torch_save_reads_moved_tensors_from_their_tiers_and_the_file_is_the_plain_runs(tmp_path):
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / "save_moved.py",
              "--out", tmp_path / "profiled.json", "--checkpoint", tmp_path / "profiled.pt", cwd=tmp_path))
    trace = load_trace(tmp_path / "t.msgpack")
    save_plan(every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2), tmp_path / "plan.json")
    for name in ("planned", "plain"):  # one file name: torch.save's archive holds it
        (tmp_path / name).mkdir()
    run_planned(tmp_path, tmp_path / "plan.json", "save_moved.py", "--out", tmp_path / "planned.json",
                            "--checkpoint", tmp_path / "planned" / "checkpoint.pt")
    run_plain(tmp_path, "save_moved.py", "--out", tmp_path / "plain.json", "--checkpoint", tmp_path / "plain" / "checkpoint.pt")
    planned, plain = (json.loads((tmp_path / name).read_text()) for name in ("planned.json", "plain.json"))
    assert planned["losses"] == plain["losses"]
    assert planned["out_at_save"] > 0   # the save met tensors with no memory on the device
    assert planned["out_after_save"] == planned["out_at_save"]   # and brought none of them back
    # byte for byte: the device tags pickle as the plain run's (one object, written once, on the CPU)
    assert (tmp_path / "planned" / "checkpoint.pt").read_bytes() == (tmp_path / "plain" / "checkpoint.pt").read_bytes()
    mine, theirs = (torch.load(tmp_path / name / "checkpoint.pt", weights_only=True) for name in ("planned", "plain"))
    assert _flat(mine).keys() == _flat(theirs).keys()
    assert all(torch.equal(a, _flat(theirs)[key]) for key, a in _flat(mine).items())
    weight, rows = mine["weight_and_rows"]
    assert rows.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()   # still one storage
    # a subclass and a tensor with attributes over moved storages: their bytes, not 0 of them
    assert planned["extras_out_at_save"] > 0
    extras = {name: (tmp_path / name / "checkpoint.pt.extras").read_bytes() for name in ("planned", "plain")}
    assert extras["planned"] == extras["plain"]


def _flat(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {key: value for k, v in items for key, value in _flat(v, f"{prefix}/{k}").items()}
