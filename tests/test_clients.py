"""The frameworks users train with, under a plan: each job trains bit for bit like its plain
run, and everything it writes outside its ops (save_pretrained, safetensors, numpy, Trainer
checkpoints) holds the true values.

Each case profiles a client script from tests/clients/, plans every idle period of every
movable tensor through both tiers at half the traced peak (the most migration a trace
allows: runtime_helpers.every_period_plan), runs it under `teraio run` and plainly, and
compares what both wrote.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from teraio.formats.plan import load_plan, save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import Kind, live_bytes_per_kernel, load_trace
from cli_helpers import CPU_ENV, PYTHON, ok, teraio
from runtime_helpers import every_period_plan

CLIENTS = Path(__file__).parent / "clients"


def profile_and_plan(tmp_path, script: str | Path, *args) -> Path:
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / script, *args, cwd=tmp_path))
    trace = load_trace(tmp_path / "t.msgpack")
    plan = every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2)
    save_plan(plan, tmp_path / "plan.json")
    return tmp_path / "plan.json"


def run_planned(tmp_path, plan: Path, script: str, *args):
    proc = ok(teraio("run", "--plan", plan, "--report", tmp_path / "run.json", "--ssd-dir", tmp_path / "ssd",
                     "--", PYTHON, CLIENTS / script, *args, cwd=tmp_path))
    return proc, load_report(tmp_path / "run.json")


def planned_json_like_plain(tmp_path, script: str) -> tuple:
    """SCRIPT profiled, planned by `teraio plan` at half its traced peak, and run plainly and under
    the plan, each writing JSON to --out: the two files are the same. The planned run's stderr,
    report and budget."""
    from runtime_helpers import plan_at_half_peak

    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / script, cwd=tmp_path))
    plan, budget = plan_at_half_peak(tmp_path / "t.msgpack", "teraio-plan", tmp_path)
    run_plain(tmp_path, script, "--out", "plain.json")
    proc, report = run_planned(tmp_path, plan, script, "--out", "planned.json")
    assert json.loads((tmp_path / "planned.json").read_text()) == json.loads((tmp_path / "plain.json").read_text())
    return proc, report, budget


def run_plain(tmp_path, script: str, *args) -> None:
    proc = subprocess.run([sys.executable, str(CLIENTS / script), *map(str, args)], cwd=tmp_path,
                          capture_output=True, text=True, env=dict(os.environ, **CPU_ENV))
    assert proc.returncode == 0, f"the plain run exited {proc.returncode}:\n{proc.stderr[-3000:]}"


def host_plan_at_share(tmp_path, script: str, share: float):
    """SCRIPT profiled and planned on the host tier at `share` of its traced peak (untracked
    bytes in); returns the trace, the plan's path and the budget."""
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / script,
              "--out", tmp_path / "profiled.json", cwd=tmp_path))
    trace = load_trace(tmp_path / "t.msgpack")
    budget = int((live_bytes_per_kernel(trace).max() + trace.header.untracked_bytes) * share)
    ok(teraio("plan", tmp_path / "t.msgpack", "--gpu-mem", budget, "--ssds", 0, "--host-mem", "64MiB",
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    return trace, tmp_path / "plan.json", budget


def planned_and_plain_alike(tmp_path, plan: Path, script: str):
    """SCRIPT run under PLAN and plainly, each writing JSON to --out: the two files are the same.
    The planned run's report."""
    _, report = run_planned(tmp_path, plan, script, "--out", tmp_path / "planned.json")
    run_plain(tmp_path, script, "--out", tmp_path / "plain.json")
    assert json.loads((tmp_path / "planned.json").read_text()) == json.loads((tmp_path / "plain.json").read_text())
    return report


def assert_same_safetensors(a: Path, b: Path) -> None:
    mine, theirs = load_file(a), load_file(b)
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine), "saved weights differ"


def hf_llama_trains_alike(tmp_path, *args):
    """hf_llama.py with ARGS (which write l.json and sp/) profiled, planned, and run plainly and
    under the plan: the same losses and saved weights. The planned run's report."""
    plan = profile_and_plan(tmp_path, "hf_llama.py", *args)
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "hf_llama.py", *args)
    _, report = run_planned(tmp_path, plan, "hf_llama.py", *args)
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads((plain / "l.json").read_text())
    assert_same_safetensors(tmp_path / "sp" / "model.safetensors", plain / "sp" / "model.safetensors")
    return report


def test_save_pretrained_safetensors_numpy_and_dlpack_after_training_see_true_values(tmp_path):
    """The job ends with the plan's wrap-around offloads done: every weight is out. Its
    saves read raw memory (no ATen op): save_pretrained and accelerate's save_model refused
    (offloaded storages all at address 0 look shared), save_file wrote garbage or failed.
    save_pretrained reads them from the tiers (Note [Saving from the tiers])."""
    saves = ("--save-pretrained", "sp", "--safetensors-out", "w.safetensors", "--numpy-out", "w.npz",
             "--accelerate-save", "acc")
    plan = profile_and_plan(tmp_path, "hf_llama.py", "--steps", 6)
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "hf_llama.py", "--steps", 6, "--losses-out", "l.json", *saves)
    proc, report = run_planned(tmp_path, plan, "hf_llama.py", "--steps", 6, "--losses-out", "l.json", *saves)
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads((plain / "l.json").read_text())
    assert_same_safetensors(tmp_path / "sp" / "model.safetensors", plain / "sp" / "model.safetensors")
    out_before, out_after = json.loads((tmp_path / "sp.out.json").read_text())
    assert out_after == out_before > 0   # save_pretrained read them from the tiers: none came back
    assert_same_safetensors(tmp_path / "w.safetensors", plain / "w.safetensors")
    assert_same_safetensors(tmp_path / "acc" / "model.safetensors", plain / "acc" / "model.safetensors")
    mine, theirs = np.load(tmp_path / "w.npz"), np.load(plain / "w.npz")
    assert all(np.array_equal(mine[k], theirs[k]) for k in theirs.files)
    assert report.iterations_on_plan >= 3 and report.offloaded_bytes["ssd"] > 0
    # the saves ran after the last step: the plan paused at their first op and said where
    assert report.plan_pauses == 1 and "not the traced op" in report.pause_reason
    assert report.per_iteration[-1].paused_at_kernel == -1  # the last training iteration was whole
    assert "paused in 1 iteration(s) (1 of them after the last step)" in " ".join(proc.stderr.split())


def test_a_model_from_pretrained_moves_its_weights_and_its_file_stays_as_it_was(tmp_path):
    """Note [Private file mappings] in teraio/raw_access.py: on the CPU from_pretrained leaves
    the weights in safetensors' private mapping of the file, not resizable, and every plan
    offload of them was refused (626 per run of a sentence-transformers fine-tune)."""
    base = tmp_path / "base"
    run_plain(tmp_path, "hf_llama.py", "--steps", 0, "--save-pretrained", base)
    weights = (base / "model.safetensors").read_bytes()
    args = ("--steps", 6, "--from-pretrained", base, "--losses-out", "l.json", "--save-pretrained", "sp")
    report = hf_llama_trains_alike(tmp_path, *args)
    assert report.refused_actions_by_reason == {}
    assert report.offloaded_bytes_by_kind["parameter"] > 0
    assert (base / "model.safetensors").read_bytes() == weights   # a private mapping: the file is untouched


def test_evaluation_passes_pause_the_plan_which_resumes_and_training_stays_identical(tmp_path):
    """Profiled without evaluation, run with an eval forward under no_grad after every third
    step: the plan pauses at each eval's first op, resumes at the next iteration, and the
    train and eval losses stay bit-identical."""
    plan = profile_and_plan(tmp_path, "hf_llama.py", "--steps", 6)
    plain = tmp_path / "plain"
    plain.mkdir()
    args = ("--steps", 10, "--eval-every", 3, "--losses-out", "l.json")
    run_plain(plain, "hf_llama.py", *args)
    _, report = run_planned(tmp_path, plan, "hf_llama.py", *args)
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads((plain / "l.json").read_text())
    paused = [row.iteration for row in report.per_iteration if row.paused_at_kernel >= 0]
    assert paused == [3, 6, 9] and report.plan_pauses == 3 and report.guard_trips == 0
    # iteration 1 ran the traced ops and followed the plan as it did (Note [Following before learning])
    assert [row.iteration for row in report.per_iteration if row.followed_plan] == [1, 2, 4, 5, 7, 8]


@pytest.mark.parametrize("variant", ["--lora", "--grad-ckpt", "--dynamic", "--autocast"])
def test_peft_checkpointing_dynamic_padding_and_autocast_train_identically(tmp_path, variant):
    """peft LoRA on a frozen base, transformers' gradient checkpointing, a sequence length
    per batch (profiled over several iterations, the largest kept; every length follows the
    plan: tests/test_varying_shapes.py), bf16 autocast: each bit for bit like its plain run."""
    steps = 10 if variant == "--dynamic" else 6  # a varying job compares iterations (Note [Shapes that vary])
    plan = profile_and_plan(tmp_path, "hf_llama.py", "--steps", steps, variant)
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "hf_llama.py", "--steps", 7, variant, "--losses-out", "l.json", "--save-pretrained", "sp")
    _, report = run_planned(tmp_path, plan, "hf_llama.py", "--steps", 7, variant, "--losses-out", "l.json",
                            "--save-pretrained", "sp")
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads((plain / "l.json").read_text())
    saved = "adapter_model.safetensors" if variant == "--lora" else "model.safetensors"
    assert_same_safetensors(tmp_path / "sp" / saved, plain / "sp" / saved)
    assert sum(report.offloaded_bytes.values()) > 0
    if variant == "--lora":  # the frozen base leaves without a copy after its first (Note [Clean copies])
        assert report.written_bytes["host"] < report.offloaded_bytes["host"]


def test_hf_trainer_checkpoints_and_final_save_hold_true_values(tmp_path):
    """Trainer with save_steps and save_model at the end (safetensors, optimizer.pt)."""
    shutil.copy(CLIENTS / "hf_llama.py", tmp_path)  # the Trainer script imports the model from it
    plan = profile_and_plan(tmp_path, "hf_trainer.py", "prof", "--steps", 10, "--save-steps", 4)
    run_plain(tmp_path, "hf_trainer.py", "plain", "--steps", 10, "--save-steps", 4)
    _, report = run_planned(tmp_path, plan, "hf_trainer.py", "run", "--steps", 10, "--save-steps", 4)
    assert json.loads((tmp_path / "run/losses.json").read_text()) == \
        json.loads((tmp_path / "plain/losses.json").read_text())
    for saved in ("final", "checkpoint-4", "checkpoint-8"):
        assert_same_safetensors(tmp_path / "run" / saved / "model.safetensors",
                                tmp_path / "plain" / saved / "model.safetensors")
    mine, theirs = (torch.load(tmp_path / d / "checkpoint-8" / "optimizer.pt") for d in ("run", "plain"))
    assert all(torch.equal(mine["state"][i][k], theirs["state"][i][k]) for i in theirs["state"]
               for k in theirs["state"][i])
    assert report.iterations_on_plan >= 2


def test_resident_block_gives_raw_readers_the_true_bytes(tmp_path):
    """`teraio.resident()` around a reader that uses only raw pointers (here ctypes)."""
    script = tmp_path / "raw.py"
    script.write_text(RAW_READER)
    plan = profile_and_plan(tmp_path, script)
    ok(teraio("run", "--plan", plan, "--ssd-dir", tmp_path / "ssd", "--", PYTHON, script, cwd=tmp_path))
    digests = json.loads((tmp_path / "digests.json").read_text())
    assert digests["resident"] == digests["by_ops"]


RAW_READER = '''
import ctypes, hashlib, json
import torch
import teraio

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
opt = torch.optim.AdamW(model.parameters())
for _ in range(6):
    model(torch.randn(8, 64)).square().mean().backward()
    opt.step()
    opt.zero_grad()

def raw_digest():  # reads memory the way a C extension would: no ATen op
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(ctypes.string_at(p.untyped_storage().data_ptr(), p.untyped_storage().nbytes()))
    return h.hexdigest()

with teraio.resident():
    resident = raw_digest()
by_ops = hashlib.sha256(b"".join(p.detach().clone().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                                 for p in model.parameters())).hexdigest()
json.dump({"resident": resident, "by_ops": by_ops}, open("digests.json", "w"))
'''


def test_a_step_with_a_closure_moves_its_activations_and_trains_identically(tmp_path):
    """Note [Steps with a closure] in teraio/walk.py: Lightning's automatic optimization runs
    forward and backward inside optimizer.step(closure); their activations were all traced as
    the step's own tensors, which no plan may move, so a budget at half the peak was refused."""
    plan = profile_and_plan(tmp_path, "closure_step.py")
    trace = load_trace(tmp_path / "t.msgpack")
    assert (trace.kind == int(Kind.activation)).sum() > 0
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "closure_step.py", "--losses-out", "l.json")
    _, report = run_planned(tmp_path, plan, "closure_step.py", "--losses-out", "l.json")
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads((plain / "l.json").read_text())
    assert report.iterations_on_plan >= 3 and report.offloaded_bytes_by_kind.get("activation", 0) > 0


def test_deepcopies_of_moved_weights_mid_training_hold_true_values(tmp_path):
    """copy.deepcopy of a state_dict or a module (the best weights, an EMA model's start) sizes
    each storage's copy with nbytes() before any op runs: a weight the plan had moved out read
    as 0 bytes and the job failed ("The size of tensor a (N) must match the size of tensor b (0)")."""
    plan = profile_and_plan(tmp_path, "snapshot_copies.py")
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "snapshot_copies.py")
    _, report = run_planned(tmp_path, plan, "snapshot_copies.py")
    assert json.loads((tmp_path / "losses.json").read_text()) == json.loads((plain / "losses.json").read_text())
    mine, theirs = torch.load(tmp_path / "snapshots.pt"), torch.load(plain / "snapshots.pt")
    assert all(torch.equal(mine[part][k], theirs[part][k]) for part in theirs for k in theirs[part])
    assert report.iterations_on_plan >= 3 and report.offloaded_bytes_by_kind.get("parameter", 0) > 0


def test_a_model_and_optimizer_the_job_drops_are_freed_as_in_the_plain_run(tmp_path):
    """Note [Weak holds] in teraio/walk.py: the walk held every model and optimizer it had met,
    so one dropped to resume in a fresh pair stayed alive, its memory with it (over budget)."""
    plan = profile_and_plan(tmp_path, "fresh_model.py")
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "fresh_model.py")
    _, report = run_planned(tmp_path, plan, "fresh_model.py")
    mine, theirs = (json.loads((folder / "fresh.json").read_text()) for folder in (tmp_path, plain))
    assert theirs["freed"] and mine == theirs
    assert report.peak_device_bytes <= report.budget_bytes


def test_per_sample_gradients_with_torch_func_train_identically(tmp_path):
    """torch.func.functional_call under vmap(grad) as the model's first forward: naming its
    parameters met the transforms' wrappers, which have no storage, and the job crashed."""
    plan = profile_and_plan(tmp_path, "func_grad.py", "--out", tmp_path / "profiled.json")
    _, report = run_planned(tmp_path, plan, "func_grad.py", "--out", tmp_path / "planned.json")
    run_plain(tmp_path, "func_grad.py", "--out", tmp_path / "plain.json")
    assert sum(report.offloaded_bytes.values()) > 0
    assert json.loads((tmp_path / "planned.json").read_text()) == json.loads((tmp_path / "plain.json").read_text())


def test_an_lstm_over_packed_sequences_trains_identically(tmp_path):
    """Note [Outputs read raw later]: the backward of pack_padded_sequence reads the batch sizes
    through a raw pointer; moved out as an idle activation, they crashed the job."""
    plan = profile_and_plan(tmp_path, "packed_lstm.py", "--out", tmp_path / "profiled.json")
    _, report = run_planned(tmp_path, plan, "packed_lstm.py", "--out", tmp_path / "planned.json")
    run_plain(tmp_path, "packed_lstm.py", "--out", tmp_path / "plain.json")
    assert json.loads((tmp_path / "planned.json").read_text()) == json.loads((tmp_path / "plain.json").read_text())
    assert sum(report.offloaded_bytes.values()) > 0


def test_batches_the_script_holds_count_in_the_plan_and_the_run_keeps_its_budget(tmp_path):
    """On the CPU nothing counted the storages no op of the recorded iteration touches (batches
    made before the loop): a plan said it fit and the run went 3.6x over its budget. They are
    the trace's untracked bytes now."""
    trace, plan, budget = host_plan_at_share(tmp_path, "held_batches.py", 0.75)
    assert trace.header.untracked_bytes >= 6 * 128 * 256 * 4    # the batches the iteration left alone
    report = planned_and_plain_alike(tmp_path, plan, "held_batches.py")
    assert report.peak_device_bytes <= budget


def test_a_job_that_saves_within_its_cycle_follows_its_plan(tmp_path):
    """Note [State dicts outside the walk] in teraio/raw_access.py: save_pretrained after every
    step took its state dict under the walk when profiled (a detach per entry, kernels of the
    iteration) and outside it when run, so no iteration matched the plan (0 on plan)."""
    args = ("--steps", 8, "--save-every", 1, "--save-pretrained", "sp", "--losses-out", "l.json")
    report = hf_llama_trains_alike(tmp_path, *args)
    assert report.guard_trips == 0 and report.iterations_on_plan >= 3


def test_batches_drawn_with_pythons_random_after_the_seed_are_the_plain_runs(tmp_path):
    """Note [The job's random draws] in teraio/app/bootstrap/trigger.py: the agent's start
    drew from Python's generator (an import inside the job), so every shuffle differed."""
    plan = profile_and_plan(tmp_path, "python_shuffle.py", "--out", tmp_path / "profiled.json")
    _, report = run_planned(tmp_path, plan, "python_shuffle.py", "--out", tmp_path / "planned.json")
    run_plain(tmp_path, "python_shuffle.py", "--out", tmp_path / "plain.json")
    assert sum(report.offloaded_bytes.values()) > 0
    assert json.loads((tmp_path / "planned.json").read_text()) == json.loads((tmp_path / "plain.json").read_text())


def test_a_dataset_and_the_noise_drawn_by_the_same_op_are_two_tensors_and_the_plan_moves_both(tmp_path):
    """Note [Birth names across iterations] in teraio/walk.py: a dataset drawn with torch.randn
    before the loop and the noise each step draws were one name in the trace; the runtime took
    the noise for the dataset's entry, the dataset never moved, and a diffusers UNet's plan at a
    quarter of its peak went over its budget at the same op of every planned iteration."""
    # 60% of the peak: the smallest budget a plan fits is 57% (what no entry can move)
    trace, plan, _ = host_plan_at_share(tmp_path, "dataset_and_noise.py", 0.6)
    ids = list(trace.tensor_id)
    assert len(set(ids)) == len(ids), sorted(i for i in ids if ids.count(i) > 1)
    sizes = {}
    for entry in load_plan(plan).entries:
        sizes.setdefault(entry.tensor, set()).add(entry.nbytes)
    assert all(len(nbytes) == 1 for nbytes in sizes.values()), {t: n for t, n in sizes.items() if len(n) > 1}
    assert {64 * 3 * 16 * 16 * 4} in sizes.values()   # the dataset moves, under a name of its own
    report = planned_and_plain_alike(tmp_path, plan, "dataset_and_noise.py")
    assert report.iterations_on_plan >= 3 and report.plan_fits
    # the plan fits: the runtime keeps the budget without evicting anything it did not plan to
    assert sum(it.evictions for it in report.per_iteration if it.followed_plan) == 0


def test_an_op_the_job_catches_an_error_of_is_a_kernel_and_the_plan_is_followed_past_it(tmp_path):
    """Note [Ops that raise] in teraio/walk.py: accelerate's gather_for_metrics slices the 0-dim
    loss at an epoch's short last batch and catches the IndexError (once per iteration here, as
    under TRL's SFTTrainer): the profiler's ops fell behind its kernel count and the profile died
    in our own ValueError ("kernel columns disagree with header.num_kernels")."""
    # 70% of the peak: the smallest budget a plan fits is 60% (what no entry can move)
    _, plan, _ = host_plan_at_share(tmp_path, "accelerate_metrics.py", 0.7)
    report = planned_and_plain_alike(tmp_path, plan, "accelerate_metrics.py")
    assert report.iterations_on_plan == report.iterations - 1 and report.plan_pauses == 0 and report.plan_fits
    assert sum(it.evictions for it in report.per_iteration if it.followed_plan) == 0
