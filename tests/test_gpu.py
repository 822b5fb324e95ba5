"""On a CUDA GPU (skipped elsewhere): the parts the CPU tests cannot reach. Run them on the GPU
machine with `python -m pytest -m gpu tests/test_gpu.py`."""

import json
import os
import subprocess
import sys

import pytest
import torch

from teraio.formats.plan import save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import Kind, live_bytes_per_kernel, load_trace
from cli_helpers import EXAMPLE, losses
from test_clients import CLIENTS
from runtime_helpers import every_period_plan

pytestmark = pytest.mark.gpu
ARGS = ("--device", "cuda", "--deterministic", "--steps", "6", "--clip", "0.5")


def run(*args, cwd, env=None):
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_host_pool_is_pinned_at_exactly_the_requested_size():
    from teraio_run.tiers import HostPool

    nbytes = 2**31 + 4096 + 1  # pin_memory=True would round this up to 4 GiB
    pool = HostPool(nbytes, pin=True)
    assert pool.buffer.is_pinned() and pool.buffer.numel() == nbytes


def test_allocated_bytes_is_the_allocators_count():
    from teraio.walk import cuda_allocated_bytes

    keep = [torch.empty(n, device="cuda") for n in (1000, 123457, 2**20)]
    assert cuda_allocated_bytes() == torch.cuda.memory_allocated()
    del keep


def test_every_idle_period_through_both_tiers_trains_identically_on_cuda(tmp_path):
    """Stream copies, record_stream, KvikIO (or POSIX) swap files and the cap, bit for bit."""
    run(EXAMPLE, *ARGS, "--losses-out", tmp_path / "plain.json", cwd=tmp_path)
    run("-m", "teraio", "profile", "-o", tmp_path / "trace.msgpack", "--", sys.executable, EXAMPLE, *ARGS,
        cwd=tmp_path)
    trace = load_trace(tmp_path / "trace.msgpack")
    budget = int(live_bytes_per_kernel(trace).max()) // 2
    save_plan(every_period_plan(trace, budget_bytes=budget), tmp_path / "plan.json")
    # The tiny model's half peak is a few MiB, less than cuBLAS's workspace: the device cap is
    # set well above it, the plan's budget still drives every offload and eviction.
    run("-m", "teraio", "run", "--plan", tmp_path / "plan.json", "--gpu-mem", "8GiB", "--ssd-dir", tmp_path / "ssd",
        "--report", tmp_path / "run.json", "--", sys.executable, EXAMPLE, *ARGS, "--losses-out",
        tmp_path / "run_losses.json", cwd=tmp_path)
    assert losses(tmp_path / "run_losses.json") == losses(tmp_path / "plain.json")
    report = load_report(tmp_path / "run.json")
    assert report.iterations_on_plan >= 2 and report.io_errors == 0
    assert report.offloaded_bytes["host"] > 0 and report.offloaded_bytes["ssd"] > 0


def test_save_pretrained_after_training_under_a_plan_on_cuda(tmp_path):
    """transformers' save_pretrained checks storages by address before safetensors copies them
    to the host: every weight the plan moved out is at address 0 there. The saved weights and
    the losses must equal the plain run's."""
    from safetensors.torch import load_file

    client = os.path.join(os.path.dirname(__file__), "clients", "hf_llama.py")
    args = (client, "--device", "cuda", "--steps", "6")
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    run(*args, "--losses-out", tmp_path / "plain.json", "--save-pretrained", tmp_path / "plain", cwd=tmp_path, env=env)
    run("-m", "teraio", "profile", "-o", tmp_path / "t.msgpack", "--", sys.executable, *args, cwd=tmp_path, env=env)
    trace = load_trace(tmp_path / "t.msgpack")
    save_plan(every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2), tmp_path / "plan.json")
    run("-m", "teraio", "run", "--plan", tmp_path / "plan.json", "--gpu-mem", "8GiB", "--ssd-dir", tmp_path / "ssd",
        "--report", tmp_path / "run.json", "--", sys.executable, *args, "--losses-out", tmp_path / "run_losses.json",
        "--save-pretrained", tmp_path / "saved", cwd=tmp_path, env=env)
    assert losses(tmp_path / "run_losses.json") == losses(tmp_path / "plain.json")
    mine, plain = load_file(tmp_path / "saved" / "model.safetensors"), load_file(tmp_path / "plain" / "model.safetensors")
    assert mine.keys() == plain.keys() and all(torch.equal(mine[k], plain[k]) for k in plain)
    out_before, out_after = json.loads((tmp_path / "saved.out.json").read_text())
    assert out_after == out_before > 0   # save_pretrained read them from the tiers: none came back
    assert load_report(tmp_path / "run.json").iterations_on_plan >= 3


def test_fsdp2_moves_gradients_on_cuda(tmp_path):
    """NCCL's reduce-scatter returns a Work that torch 2.11 does not unbox: FSDP2's gradients
    were then pinned for good (traced as `other`, never planned). One rank is enough to see it."""
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", EXAMPLE, "--fsdp2", *ARGS)
    run(*torchrun, "--losses-out", tmp_path / "plain.json", cwd=tmp_path)
    run("-m", "teraio", "profile", "-o", tmp_path / "t.msgpack", "--", sys.executable, *torchrun, cwd=tmp_path)
    trace = load_trace(tmp_path / "t.msgpack")
    save_plan(every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2), tmp_path / "plan.json")
    run("-m", "teraio", "run", "--plan", tmp_path / "plan.json", "--gpu-mem", "8GiB", "--report", tmp_path / "run.json",
        "--ssd-dir", tmp_path / "ssd", "--", sys.executable, *torchrun, "--losses-out", tmp_path / "run_losses.json",
        cwd=tmp_path)
    assert losses(tmp_path / "run_losses.json") == losses(tmp_path / "plain.json")
    moved = load_report(tmp_path / "run.json").offloaded_bytes_by_kind
    assert {"parameter", "gradient", "optimizer_state"} <= {kind for kind, nbytes in moved.items() if nbytes > 0}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_each_rank_is_capped_and_copies_on_its_own_gpu(tmp_path, monkeypatch):
    """torchrun starts every worker on cuda:0 and the script moves to its GPU later: rank 1 must
    still be capped on cuda:1 and time its copies there (they read 10,000 GB/s when timed on cuda:0)."""
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", EXAMPLE, *ARGS)
    for multicast_off in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        monkeypatch.setenv(multicast_off, "0" if multicast_off == "NCCL_NVLS_ENABLE" else "1")
    run(*torchrun, "--losses-out", tmp_path / "plain.json", cwd=tmp_path)
    run("-m", "teraio", "profile", "-o", tmp_path / "t.msgpack", "--", sys.executable, *torchrun, cwd=tmp_path)
    for rank in (0, 1):
        trace = load_trace(tmp_path / f"t.rank{rank}.msgpack")
        budget = int(live_bytes_per_kernel(trace).max()) // 2
        save_plan(every_period_plan(trace, budget_bytes=budget, tiers=("host",)), tmp_path / f"plan.rank{rank}.json")
    run("-m", "teraio", "run", "--plan", tmp_path / "plan.json", "--gpu-mem", "8GiB", "--report", tmp_path / "run.json",
        "--ssd-dir", tmp_path / "ssd", "--", sys.executable, *torchrun, "--losses-out", tmp_path / "run_losses.json",
        cwd=tmp_path)
    assert losses(tmp_path / "run_losses.json") == losses(tmp_path / "plain.json")
    for rank in (0, 1):
        report = load_report(tmp_path / f"run.rank{rank}.json")
        assert report.header.device == f"cuda:{rank}"
        assert 0 < report.achieved_gbps["d2h"] < 200  # PCIe Gen5 x16 is 64 GB/s


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_ranks_spawned_without_set_device_are_capped_and_copy_on_their_own_gpu(tmp_path):
    """Note in teraio/app/bootstrap/__init__.py use_job_gpu: torch.multiprocessing.spawn's ranks
    move with .to(rank) and leave cuda:0 current; rank 1's agent capped cuda:0 and ordered its
    copies after cuda:0's work while the job computed on cuda:1."""
    script = (sys.executable, CLIENTS / "spawn_ddp.py", "--device", "cuda", "--steps", "8")
    run(*script[1:], "--out", tmp_path / "plain.json", cwd=tmp_path)
    run("-m", "teraio", "profile", "--run-to-completion", "-o", tmp_path / "t.msgpack", "--", *script,
        "--out", tmp_path / "p.json", cwd=tmp_path)
    for rank in (0, 1):
        trace = load_trace(tmp_path / f"t.rank{rank}.msgpack")
        budget = int(live_bytes_per_kernel(trace).max()) // 2
        save_plan(every_period_plan(trace, budget_bytes=budget, tiers=("host",)), tmp_path / f"plan.rank{rank}.json")
    proc = run("-m", "teraio", "run", "--plan", tmp_path / "plan.json", "--gpu-mem", "8GiB", "--report",
               tmp_path / "run.json", "--ssd-dir", tmp_path / "ssd", "--", *script, "--out", tmp_path / "l.json",
               cwd=tmp_path)
    assert "teraio makes cuda:1 current" in proc.stderr, proc.stderr
    assert losses(tmp_path / "l.json") == losses(tmp_path / "plain.json")
    for rank in (0, 1):
        report = load_report(tmp_path / f"run.rank{rank}.json")
        assert report.header.device == f"cuda:{rank}" and report.iterations_on_plan >= 1


def test_a_full_pool_waits_on_the_copy_in_event_not_the_disk(tmp_path):
    """The CUDA side of the pool wait: a slot still read by a queued copy-in is free once its
    event has passed, and the next offload lands in the host pool, not on the disk."""
    from concurrent.futures import ThreadPoolExecutor

    from teraio_run.engine import PREFETCHING, MigrationEngine, Moved
    from teraio_run.tiers import HostPool, HostTier, PosixFiles, SsdTier

    threads = ThreadPoolExecutor(max_workers=1)
    pool = HostPool(256 * 2**20, pin=True)
    host, ssd = HostTier(pool, True, threads), SsdTier([tmp_path], PosixFiles(), threads)
    engine = MigrationEngine(host, ssd, True)
    target = torch.empty(pool.capacity, dtype=torch.uint8, device="cuda")
    slot = pool.alloc(pool.capacity)
    copy_in = host.copy_in(target.untyped_storage(), slot, None, engine.compute_mark)  # 256 MiB: queued yet
    engine.releasing.append(Moved(host, slot, pool.capacity, PREFETCHING, copy_in, None))
    tier, placed = engine._place("host", pool.capacity)
    assert (tier.name, placed, engine.stats.other_tier_bytes) == ("host", slot, 0) and copy_in.done()


def test_copies_started_as_one_group_read_what_the_ops_before_them_wrote(tmp_path):
    """Note [One compute-stream event per group of copies]: offloads started together after
    slow kernels still queued wait for all of them (through both tiers), and come back as the
    ops made them; prefetches of one group land whole."""
    from concurrent.futures import ThreadPoolExecutor

    from teraio.walk import StorageRecord
    from teraio_run.engine import MigrationEngine
    from teraio_run.tiers import HostPool, HostTier, PosixFiles, SsdTier

    threads = ThreadPoolExecutor(max_workers=2)
    host, ssd = HostTier(HostPool(64 * 2**20, pin=True), True, threads), SsdTier([tmp_path], PosixFiles(), threads)
    engine = MigrationEngine(host, ssd, True)
    seed = torch.randn(2048, 2048, device="cuda")
    made = [seed]
    for _ in range(6):  # each waits for the last: ~tens of ms queued before the copies start
        made.append(made[-1] @ seed / 45)
    records = [StorageRecord(i + 1, f"t{i}", Kind.activation, t, t.untyped_storage(), 0) for i, t in enumerate(made)]
    with engine.compute_mark:
        assert all(engine.offload(r, "host" if i % 2 else "ssd") for i, r in enumerate(records))
    engine.wait_offloads({r.key: r for r in records})
    with engine.compute_mark:
        for r in records:
            engine.prefetch(r)
    for r in records:
        engine.ensure_resident(r, "test")
    again = [seed]
    for _ in range(6):
        again.append(again[-1] @ seed / 45)
    assert all(torch.equal(a, b) for a, b in zip(made, again))


def test_a_trace_profiled_under_a_cap_on_cuda_records_the_same_job(tmp_path):
    """Note [Profiling under a cap]: stream copies and the allocator's hard cap change nothing the
    trace says about the job (deaths were stamped late on CUDA once: the engine held storages),
    and the memory model's untracked bytes stay those of the uncapped trace. The model is made
    large enough (~0.5 GB) that cuBLAS workspaces are small beside the cap. The cap is half the
    peak, or what one kernel needs with what never moves (plus room for workspaces) where that
    is more: at half the peak this model's logits and their gradients (not movable: kind
    'other') left no room to bring a 16 MiB input back (H200, dccf8bf)."""
    from teraio_plan.memory import kernel_need_bytes

    job = (sys.executable, EXAMPLE, *ARGS, "--dim", 512, "--ffn", 2048, "--vocab", 8192, "--seq", 256, "--batch", 8)
    run("-m", "teraio", "profile", "-o", tmp_path / "full.msgpack", "--", *job, cwd=tmp_path)
    full = load_trace(tmp_path / "full.msgpack")
    peak_bytes = int(live_bytes_per_kernel(full).max() + full.header.untracked_bytes)
    cap_bytes = max(peak_bytes // 2, kernel_need_bytes(full, 0)[0] + (64 << 20))
    assert cap_bytes < peak_bytes, "the job needs its whole peak on the device: make it larger"
    run("-m", "teraio", "profile", "-o", tmp_path / "capped.msgpack", "--gpu-mem", cap_bytes, "--host-mem", "4GiB",
        "--ssd-dir", tmp_path / "ssd", "--", *job, cwd=tmp_path)
    capped = load_trace(tmp_path / "capped.msgpack")
    assert capped.columns_unlike(full) == []
    assert capped.header.profiled_under_cap.waited_kernels > 0
    assert abs(capped.header.untracked_bytes - full.header.untracked_bytes) < 64 << 20


def test_torch_save_of_a_state_partly_moved_out_holds_true_values_on_its_device(tmp_path):
    """Note [Saving from the tiers]: moved tensors pickle from host copies tagged with their
    device; torch.load puts them back there, equal to the plain run's, nothing brought back."""
    client = [sys.executable, CLIENTS / "save_moved.py", "--device", "cuda"]
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    run(*client[1:], "--out", tmp_path / "plain.json", "--checkpoint", tmp_path / "plain.pt", cwd=tmp_path, env=env)
    run("-m", "teraio", "profile", "-o", tmp_path / "t.msgpack", "--", *client, "--out", tmp_path / "p.json",
        "--checkpoint", tmp_path / "p.pt", cwd=tmp_path, env=env)
    trace = load_trace(tmp_path / "t.msgpack")
    save_plan(every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2), tmp_path / "plan.json")
    run("-m", "teraio", "run", "--plan", tmp_path / "plan.json", "--gpu-mem", "8GiB", "--ssd-dir", tmp_path / "ssd",
        "--report", tmp_path / "report.json", "--", *client, "--out", tmp_path / "run.json", "--checkpoint",
        tmp_path / "run.pt", cwd=tmp_path, env=env)
    planned, plain = (json.loads((tmp_path / name).read_text()) for name in ("run.json", "plain.json"))
    assert planned["losses"] == plain["losses"]
    report = load_report(tmp_path / "report.json")
    # these say what the plan did when nothing was out at the save
    assert planned["out_after_save"] == planned["out_at_save"] > 0, (
        report.iterations_on_plan, report.per_iteration[-1].model_dump(), report.offloaded_bytes_by_kind)
    mine, theirs = (torch.load(tmp_path / name, weights_only=True) for name in ("run.pt", "plain.pt"))
    weight, rows = mine["weight_and_rows"]
    assert weight.device.type == "cuda" and torch.equal(weight, theirs["weight_and_rows"][0])
    assert rows.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(mine["model"].values(), theirs["model"].values()))
    assert all(a.device.type == "cuda" for a in mine["model"].values())


def test_a_model_built_on_the_cpu_and_moved_to_the_gpu_is_traced_whole(tmp_path):
    """Note [Modes pushed again] in teraio/app/bootstrap/trigger.py: `model.to("cuda")` starts
    the walk; before, the trace held only the backward's gradient detaches of such a job."""
    client = [sys.executable, CLIENTS / "save_moved.py", "--device", "cuda", "--save-at", "-1"]
    run("-m", "teraio", "profile", "-o", tmp_path / "t.msgpack", "--", *client, "--out", tmp_path / "p.json",
        cwd=tmp_path)
    trace = load_trace(tmp_path / "t.msgpack")
    kinds = {Kind(k).name for k in trace.kind}
    assert {"parameter", "gradient", "optimizer_state", "activation"} <= kinds, kinds
    assert {"addmm", "gelu"} <= {trace.op_names[i] for i in trace.kernel_op}


def test_batches_from_dataloader_workers_follow_the_plan_on_cuda(tmp_path):
    """Note [Tensors from other processes] in teraio/walk.py: the CPU ops that rebuild a
    worker's batch are the job thread's on CUDA too; their count per step went by timing."""
    client = [sys.executable, CLIENTS / "loader_workers.py", "--device", "cuda", "--steps", "12"]
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    run("-m", "teraio", "profile", "-o", tmp_path / "t.msgpack", "--", *client, "--out", tmp_path / "p.json",
        cwd=tmp_path, env=env)
    trace = load_trace(tmp_path / "t.msgpack")
    save_plan(every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2), tmp_path / "plan.json")
    # the cap well above the plan's budget of a few hundred KiB: the CUDA allocator maps 2 MiB at a time
    run("-m", "teraio", "run", "--plan", tmp_path / "plan.json", "--gpu-mem", "8GiB", "--ssd-dir", tmp_path / "ssd",
        "--report", tmp_path / "run.json", "--", *client, "--out", tmp_path / "run.json.losses", cwd=tmp_path, env=env)
    report = load_report(tmp_path / "run.json")
    assert report.guard_trips == 0 and report.plan_pauses == 0
    assert report.iterations_on_plan >= report.iterations - 2   # the learning one may follow it too


def test_a_short_kernel_jobs_trace_holds_the_gpus_time_not_the_launches(tmp_path):
    """Note [Kernel time on a held stream] in teraio_profile/recorder.py: the example's small
    default model runs kernels of a few us, so its plain step is mostly launches; the trace's
    kernel times must not add the profiled run's launch time (before: ~2x the plain step)."""
    plain = run(EXAMPLE, *ARGS, "--steps", "8", cwd=tmp_path).stdout
    step_ms = float(plain.split("median_step_ms ")[1].split()[0])
    run("-m", "teraio", "profile", "-o", tmp_path / "t.msgpack", "--", sys.executable, EXAMPLE, *ARGS, cwd=tmp_path)
    kernel_ms = float(load_trace(tmp_path / "t.msgpack").duration_us.sum()) / 1e3
    assert 0 < kernel_ms <= 1.1 * step_ms, (kernel_ms, step_ms)
