"""More training code nobody wrote for TeraIO, under the most migration a trace allows: sparse
tensors, custom autograd Functions, checkpointing, complex numbers, BatchNorm in channels_last
under autocast with a GradScaler, tied weights with gradient hooks and fused or foreach AdamW,
a layer unfrozen mid-training, an averaged model, a Lightning fit. Each trains bit for bit like its plain run and keeps its budget.

The budget is half the traced peak, or the least any plan needs where that is more
(teraio_plan/memory.py, Note [What must stay]: backward intermediates never move, and in a
CNN or an FFT they are most of the peak).
"""

import json

import pytest

from teraio.formats.plan import save_plan
from teraio.formats.trace import Kind, live_bytes_per_kernel, load_trace
from teraio_plan.memory import kernel_need_bytes, min_required_bytes
from cli_helpers import PYTHON, ok, teraio
from runtime_helpers import every_period_plan
from test_clients import CLIENTS, run_planned, run_plain


def train_both_ways(tmp_path, script: str, *args, floor=min_required_bytes, profile_args=()):
    """Profile, plan every idle period at the budget above, run planned and plainly: the
    report, and what each run wrote."""
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", *profile_args, "--", PYTHON, CLIENTS / script, *args,
              "--out", tmp_path / "profiled.json", cwd=tmp_path))
    trace = load_trace(tmp_path / "t.msgpack")
    budget = max(int(live_bytes_per_kernel(trace).max()) // 2, floor(trace, 0)[0])
    save_plan(every_period_plan(trace, budget), tmp_path / "plan.json")
    proc, report = run_planned(tmp_path, tmp_path / "plan.json", script, *args, "--out", tmp_path / "planned.json")
    run_plain(tmp_path, script, *args, "--out", tmp_path / "plain.json")
    planned, plain = (json.loads((tmp_path / name).read_text()) for name in ("planned.json", "plain.json"))
    return proc, report, planned, plain


def test_sparse_embedding_gradients_with_sparse_adam_train_identically(tmp_path):
    """Note [Sparse tensors] in teraio/walk.py: naming Embedding(sparse=True)'s gradient asked a
    sparse tensor for its storage, and the profile died ("Cannot access storage of SparseTensorImpl")."""
    _, report, planned, plain = train_both_ways(tmp_path, "sparse_embedding.py")
    assert planned == plain
    assert report.iterations_on_plan >= 3 and report.peak_device_bytes <= report.budget_bytes
    assert report.offloaded_bytes_by_kind.get("optimizer_state", 0) > 0


def test_a_sparse_adjacency_built_in_the_forward_stays_readable_by_its_backward(tmp_path):
    """Note [Sparse tensors]: the values of a sparse adjacency made in the forward are
    activations that sparse.mm's backward reads through the sparse tensor, where the walk saw
    no use: moved out as idle, they crashed the run ("data is not allocated yet")."""
    _, report, planned, plain = train_both_ways(tmp_path, "sparse_graph.py")
    assert planned == plain
    assert report.iterations_on_plan >= 3 and report.peak_device_bytes <= report.budget_bytes
    assert report.offloaded_bytes_by_kind.get("activation", 0) > 0


@pytest.mark.parametrize("script, args", [
    ("custom_function.py", ()),
    ("checkpointed_blocks.py", ()),
    ("checkpointed_blocks.py", ("--reentrant",)),
    ("tied_hooks.py", ()),
    ("tied_hooks.py", ("--fused",)),
    ("batchnorm_cnn.py", ()),
])
def test_other_training_code_trains_identically_within_budget(tmp_path, script, args):
    """ctx attributes and saved intermediates, recomputation inside backward (reentrant or
    not), tied weights with a gradient hook and multi-tensor clipping and AdamW, BatchNorm's
    running statistics (written in place every step) under bf16 autocast and a GradScaler."""
    _, report, planned, plain = train_both_ways(tmp_path, script, *args)
    assert planned == plain
    assert report.iterations_on_plan >= 3 and report.peak_device_bytes <= report.budget_bytes
    assert sum(report.offloaded_bytes.values()) > 0


def test_a_layer_unfrozen_after_the_profile_trains_identically_evicting_on_demand(tmp_path):
    """Profiled while the body is frozen, the job then adds the body to its optimizer
    (add_param_group: gradients and Adam state the trace never saw): every iteration from then
    on pauses the plan, and the budget keeper keeps it exact and within the cap."""
    proc, report, planned, plain = train_both_ways(tmp_path, "unfreeze.py", "--steps", 9, "--unfreeze-at", 5)
    assert planned == plain
    assert [row.iteration for row in report.per_iteration if row.paused_at_kernel >= 0] == [5, 6, 7, 8]
    assert report.peak_device_bytes <= report.budget_bytes
    assert "never resumed from iteration 5 on" in " ".join((proc.stdout + proc.stderr).split())


def test_a_complex_valued_spectral_layer_trains_identically(tmp_path):
    """rfft, a complex parameter, irfft: complex activations, gradients and Adam state move."""
    _, report, planned, plain = train_both_ways(tmp_path, "spectral.py")
    assert planned == plain
    assert report.offloaded_bytes_by_kind.get("activation", 0) > 0


@pytest.mark.parametrize("script", ["sparse_graph.py", "spectral.py"])
def test_a_job_at_the_least_it_needs_keeps_its_budget_while_following_a_plan(tmp_path, script):
    """At the least a job needs to run at all (teraio plan's refusal: 'the job runs, evicting on
    demand'), the prefetches for the next kernels landed while a kernel's own tensors filled the
    budget, and iterations on the plan passed it (557,592 bytes of 541,968; 900 KiB of 809 KiB)
    where unplanned ones kept it (Note [Prefetches within the budget] in teraio_run/budget.py)."""
    _, report, planned, plain = train_both_ways(tmp_path, script, floor=kernel_need_bytes)
    assert planned == plain
    assert report.iterations_on_plan >= 3
    assert report.peak_device_bytes <= report.budget_bytes


def test_nested_tensors_of_an_encoders_eval_fast_path_are_walked_and_stay(tmp_path):
    """Note [Nested tensors] in teraio/walk.py: TransformerEncoder's eval with a padding mask
    makes nested tensors, which have no sizes; naming one crashed the profile and the run."""
    _, report, planned, plain = train_both_ways(tmp_path, "nested_eval.py")
    assert planned == plain
    assert report.iterations_on_plan >= 3 and report.peak_device_bytes <= report.budget_bytes
    assert report.offloaded_bytes_by_kind.get("parameter", 0) > 0


def test_an_encoders_eval_fast_path_under_autocast_gives_the_plain_values(tmp_path):
    """Note [Autocast inside an op] in teraio/walk.py: under CPU bf16 autocast the fast path's
    kernel ran its matmuls in fp32 under the walk, so profile and run evaluated to float32
    values unlike the plain job's bfloat16 ones (training itself was identical)."""
    _, report, planned, plain = train_both_ways(tmp_path, "nested_eval.py", "--autocast",
                                                 profile_args=["--run-to-completion"])
    profiled = json.loads((tmp_path / "profiled.json").read_text())
    assert "torch.bfloat16" in plain
    assert planned == plain and profiled == plain
    assert report.iterations_on_plan >= 3


def test_parameters_in_shared_memory_are_refused_with_their_reason(tmp_path):
    """Module.share_memory(): freeing a shared storage crashed the run (a segmentation fault in
    resize_). Their offloads are refused and said; the rest of the model moves."""
    proc, report, planned, plain = train_both_ways(tmp_path, "shared_memory.py")
    assert planned == plain
    assert report.refused_actions_by_reason.get("shared", 0) > 0 and "shared memory" in proc.stderr
    assert report.offloaded_bytes_by_kind.get("parameter", 0) > 0   # the layer not shared moves


def test_batches_from_dataloader_workers_follow_the_plan_every_iteration(tmp_path):
    """Note [Tensors from other processes] in teraio/walk.py: the ops that rebuild a worker's
    batch fell in a step by timing (85 to 97 ops per step): profiles failed or disagreed, and
    the run paused its plan at random."""
    _, report, planned, plain = train_both_ways(tmp_path, "loader_workers.py")
    assert planned == plain
    assert report.guard_trips == 0 and report.plan_pauses == 0
    assert report.iterations_on_plan == report.iterations - 1   # all but the first (Note [Following before learning])
    assert report.peak_device_bytes <= report.budget_bytes


def test_a_parameter_re_bound_with_data_keeps_moving(tmp_path):
    """`param.data = ...` gives the parameter a new storage: the walk names it again at the next
    optimizer step, so the plan's entries find it (before: never moved again, unsaid)."""
    _, report, planned, plain = train_both_ways(tmp_path, "rebind_data.py")
    assert planned == plain
    assert all(row.plan_ids_missing == 0 for row in report.per_iteration)
    followed = [row.planned_offloads for row in report.per_iteration if row.followed_plan]
    assert len(followed) >= 5 and len(set(followed)) == 1   # as many after the re-binding as before


def test_optimizers_stepped_inside_backward_are_named_with_the_flag_to_give(tmp_path):
    """One optimizer per parameter, stepped from gradient hooks: six steps per iteration, more
    than the profiler's cycle search; it said only to warm up longer."""
    proc = ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / "optimizer_in_backward.py",
                     "--out", tmp_path / "p.json", cwd=tmp_path))
    assert "steps 6 optimizers inside each backward pass" in proc.stderr
    assert "--steps-per-iteration 6" in proc.stderr
    proc = ok(teraio("profile", "--steps-per-iteration", 6, "-o", tmp_path / "t6.msgpack", "--", PYTHON,
                     CLIENTS / "optimizer_in_backward.py", "--out", tmp_path / "p6.json", cwd=tmp_path))
    assert "different op sequences" not in proc.stderr
    assert {"parameter", "gradient", "optimizer_state"} <= {Kind(k).name for k in load_trace(tmp_path / "t6.msgpack").kind}


def test_batchnorm_statistics_leave_clean_only_while_unwritten(tmp_path):
    """native_batch_norm writes the running statistics without a `Tensor(a!)` in its schema:
    planned by `teraio plan` as clean entries, their updates were dropped from step 1 on (a
    checkpoint's and evaluation's statistics were the first step's), the losses still equal."""
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / "bn_stats.py",
              "--out", tmp_path / "profiled.json", cwd=tmp_path))
    peak = int(live_bytes_per_kernel(load_trace(tmp_path / "t.msgpack")).max())
    ok(teraio("plan", tmp_path / "t.msgpack", "--gpu-mem", int(peak * 0.6), "--ssds", 0, "--host-mem", "1GiB",
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    _, report = run_planned(tmp_path, tmp_path / "plan.json", "bn_stats.py", "--out", tmp_path / "planned.json")
    run_plain(tmp_path, "bn_stats.py", "--out", tmp_path / "plain.json")
    planned, plain = (json.loads((tmp_path / name).read_text()) for name in ("planned.json", "plain.json"))
    assert planned == plain
    assert report.iterations_on_plan >= 3 and sum(report.offloaded_bytes.values()) > 0


def test_state_logged_with_rich_every_step_is_true_and_keeps_the_budget(tmp_path):
    """Note [Brought back outside an op] in teraio_run/budget.py: rich's repr of each AdamW
    state tensor brought back what the budget keeper had evicted, out of its LRU order until the
    next step: the backward went over budget (665 KiB of 607 KiB) with nothing left to evict."""
    proc, report, planned, plain = train_both_ways(tmp_path, "logged_state.py")
    assert planned == plain
    assert "over its budget" not in proc.stderr
    assert report.iterations_on_plan >= 3 and report.peak_device_bytes <= report.budget_bytes


def test_an_averaged_model_updated_every_step_and_evaluated_every_third_holds_true_values(tmp_path):
    """swa_utils.AveragedModel: its copy of the weights is named by the walk only once it has run
    (its first evaluation), so the plan's actions for it found nothing in the iteration before;
    the run said they were tensors the job had replaced. The EMA's evaluations under
    inference_mode, its update_bn and its saves (state dict, whole module) are the plain run's."""
    proc, report, planned, plain = train_both_ways(tmp_path, "averaged_model.py")
    assert planned == plain
    assert report.iterations_on_plan >= 3 and report.offloaded_bytes_by_kind.get("parameter", 0) > 0
    # the first planned iteration, before the EMA's first evaluation, misses its weights: said so
    assert any(row.plan_ids_missing for row in report.per_iteration)
    summary = " ".join(proc.stderr.split())
    assert "a module not yet called in this run" in summary
    # and names the first of them: a fastai trial could not tell which tensors it meant
    assert report.first_missing.startswith("iteration ") and f"first: {report.first_missing}" in summary
    assert "module." in report.first_missing, report.first_missing   # the AveragedModel's copy of a weight


def test_a_lightning_fit_with_bf16_clipping_accumulation_and_checkpoints_trains_identically(tmp_path):
    """Lightning's automatic optimization runs forward and backward inside optimizer.step(closure)
    on every second batch and outside it on the others; a validation loop under inference_mode
    and a checkpoint end each epoch. The losses and every checkpoint are the plain run's."""
    _, report, planned, plain = train_both_ways(tmp_path, "lightning_fit.py")
    assert planned == plain and len(plain["saved"]) == 3
    assert report.iterations_on_plan >= 6 and report.peak_device_bytes <= report.budget_bytes
    assert report.offloaded_bytes_by_kind.get("activation", 0) > 0


def test_a_scripted_model_saved_with_torch_jit_save_loads_back_its_true_weights(tmp_path):
    """torch.jit.save writes a scripted module's storages in C++ (no ATen op): a weight the plan
    had moved out was written as 0 bytes, the save said nothing and torch.jit.load refused the
    file. The scripted module's savers run inside resident() now (teraio/raw_access.py, SAVERS)."""
    _, report, planned, plain = train_both_ways(tmp_path, "jit_saved.py")
    assert planned == plain
    assert report.iterations_on_plan >= 3 and sum(report.offloaded_bytes.values()) > 0
