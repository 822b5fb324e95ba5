"""teraio run: a run under any plan trains exactly like a plain run (the twin-run oracle).

All through the real CLI on the bundled example (CPU): swap files through the POSIX backend,
a host pool in plain memory, gradient accumulation, clipping and an LR scheduler on.
"""

import os
import subprocess

import pytest
import torch

from teraio.formats.plan import load_plan, save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import CPU_ENV, EXAMPLE, PYTHON, example, losses, ok, one_line_error, teraio
from runtime_helpers import every_period_plan

ARGS = ("--device", "cpu", "--steps", "7", "--accum", "2", "--clip", "0.5")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One profile and one plain run of the example, shared by the tests here."""
    tmp = tmp_path_factory.mktemp("run")
    ok(teraio("profile", "-o", tmp / "trace.msgpack", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp))
    ok(example(*ARGS[2:], "--losses-out", tmp / "plain.json", "--state-out", tmp / "plain.pt",
               "--checkpoint-at", 4, "--checkpoint-out", tmp / "plain_ckpt.pt", cwd=tmp))
    return tmp


def peak_bytes(trace) -> int:
    return int(live_bytes_per_kernel(trace).max())


def run_example(work, tmp_path, plan, *extra):
    report = tmp_path / "run.json"
    proc = teraio("run", "--plan", plan, "--ssd-dir", tmp_path / "ssd", "--report", report, *extra, "--",
                  PYTHON, EXAMPLE, *ARGS, "--losses-out", tmp_path / "losses.json", "--state-out",
                  tmp_path / "state.pt", "--checkpoint-at", 4, "--checkpoint-out", tmp_path / "ckpt.pt",
                  cwd=tmp_path)
    ok(proc)
    return proc, (load_report(report) if report.exists() else None)


def assert_twin(work, tmp_path):
    """Same losses bit for bit, same final weights and same mid-run checkpoint."""
    assert losses(tmp_path / "losses.json") == losses(work / "plain.json")
    for name, plain in (("state.pt", "plain.pt"), ("ckpt.pt", "plain_ckpt.pt")):
        mine, theirs = torch.load(tmp_path / name), torch.load(work / plain)
        _assert_same(mine, theirs)


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_every_idle_period_through_both_tiers_trains_identically(work, tmp_path):
    trace = load_trace(work / "trace.msgpack")
    plan = every_period_plan(trace, budget_bytes=peak_bytes(trace) // 2)
    assert {e.kind for e in plan.entries} == {"parameter", "gradient", "optimizer_state", "activation"}
    save_plan(plan, tmp_path / "plan.json")
    proc, report = run_example(work, tmp_path, tmp_path / "plan.json")
    assert_twin(work, tmp_path)
    assert "copies kept the links busy" in proc.stderr  # the summary says what bounds an iteration
    assert report.iterations == 7 and report.iterations_on_plan >= 3
    assert report.offloaded_bytes["host"] > 0 and report.offloaded_bytes["ssd"] > 0
    assert report.prefetched_bytes["ssd"] > 0 and report.io_backend == "posix"
    assert all(report.achieved_gbps.get(path, 0) > 0 for path in ("d2h", "h2d", "d2s", "s2d"))
    planned = [row for row in report.per_iteration if row.followed_plan]
    assert all(0 < row.copy_busy_ms for row in planned)  # what tells a link-bound iteration
    # what tells a thread busy starting copies: every planned offload starts one, and that time is
    # part of the walk's; on the CPU no caching allocator synchronizes
    assert all(row.copies_issued >= row.planned_offloads > 0 for row in planned)
    assert all(0 < row.restore_alloc_ms <= row.copy_issue_ms < row.walk_ms for row in planned)
    assert all(row.allocator_syncs == 0 for row in report.per_iteration)
    # each iteration's peak (teraio view draws them): counted, within the budget, the run's the highest
    peaks = [row.resident_peak_bytes for row in report.per_iteration]
    assert all(0 < peak <= report.budget_bytes for peak in peaks) and max(peaks) == report.peak_device_bytes
    assert report.guard_trips <= 1  # the checkpoint at step 4 adds ops to one iteration
    # Note [Clean copies]: weights go out several times between the optimizer steps that write
    # them; after the first, their tier copy is current and they leave without a copy
    assert 0 < report.written_bytes["host"] < report.offloaded_bytes["host"]


def test_without_clean_copies_every_release_is_a_copy_and_training_is_the_same(work, tmp_path):
    trace = load_trace(work / "trace.msgpack")
    save_plan(every_period_plan(trace, budget_bytes=peak_bytes(trace) // 2), tmp_path / "plan.json")
    _, report = run_example(work, tmp_path, tmp_path / "plan.json", "--no-clean-copies")
    assert_twin(work, tmp_path)
    # every release had its copy (copies whose offload was cancelled add writes without a release)
    assert all(report.written_bytes[tier] >= report.offloaded_bytes[tier] > 0 for tier in ("host", "ssd"))


def test_host_pool_too_small_for_the_plan_spills_to_the_disk_and_says_so(work, tmp_path):
    """Offloads the pool has no room for go to the SSD tier: training is unchanged, and the
    report counts the spilled bytes per iteration and the pool's peak."""
    trace = load_trace(work / "trace.msgpack")
    plan = every_period_plan(trace, peak_bytes(trace) // 2, tiers=("host",))
    pool_bytes = max(e.nbytes for e in plan.entries) * 2
    header = plan.header.model_copy(update={
        "inputs": plan.header.inputs.model_copy(update={"host_mem_bytes": pool_bytes}),
        "prediction": plan.header.prediction.model_copy(update={"host_pool_bytes": pool_bytes})})
    save_plan(plan.model_copy(update={"header": header}), tmp_path / "plan.json")
    proc, report = run_example(work, tmp_path, tmp_path / "plan.json")
    assert_twin(work, tmp_path)
    spilled = sum(row.other_tier_bytes for row in report.per_iteration)
    assert spilled > 0 and report.offloaded_bytes["ssd"] > 0  # the plan names the host tier only
    assert 0 < max(row.host_pool_peak_bytes for row in report.per_iteration) <= pool_bytes
    assert "went to the other tier" in proc.stderr
    # `teraio inspect` shows it per iteration: which iterations spilled, how full the pool was
    view = ok(teraio("inspect", tmp_path / "run.json", cwd=tmp_path)).stdout
    table = view[view.index("Iterations"):].splitlines()
    header = next(line.split() for line in table if line.split()[:2] == ["iter", "plan"])
    rows = [line.split() for line in table if line.split() and line.split()[0].isdigit()]
    spill, out = header.index("spill"), header.index("out")
    assert rows and any(float(row[spill]) > 0 for row in rows)
    # in a unit that shows this small job's bytes (in GiB every cell read 0.00)
    assert all(float(row[out]) >= 1 for row in rows if row[1] == "yes")


def test_planner_plan_at_half_the_peak_trains_identically_within_budget(work, tmp_path):
    trace = load_trace(work / "trace.msgpack")
    budget = peak_bytes(trace) // 2
    ok(teraio("plan", work / "trace.msgpack", "--gpu-mem", budget, "--ssds", 1, "--host-mem", budget // 2,
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    assert load_plan(tmp_path / "plan.json").entries
    _, report = run_example(work, tmp_path, tmp_path / "plan.json")
    assert_twin(work, tmp_path)
    assert report.peak_device_bytes <= report.budget_bytes == budget


def test_a_plan_without_a_host_pool_evicts_to_the_disk_without_calling_it_a_spill(work, tmp_path):
    """The unplanned first iterations evict to the host pool when there is one; a plan without
    one (--host-mem 0) sends them to the disk as planned, and the run must not advise a pool."""
    trace = load_trace(work / "trace.msgpack")
    ok(teraio("plan", work / "trace.msgpack", "--gpu-mem", peak_bytes(trace) // 2, "--ssds", 1, "--host-mem", 0,
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    proc, report = run_example(work, tmp_path, tmp_path / "plan.json")
    assert report.on_demand_evictions > 0 and report.offloaded_bytes["ssd"] > 0
    assert all(row.other_tier_bytes == 0 for row in report.per_iteration)
    assert "--host-mem" not in proc.stderr


def test_empty_plan_keeps_the_budget_and_trains_identically(work, tmp_path):
    trace = load_trace(work / "trace.msgpack")
    ok(teraio("plan", work / "trace.msgpack", "--gpu-mem", 2 * peak_bytes(trace), "--ssds", 1,
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    proc, report = run_example(work, tmp_path, tmp_path / "plan.json")
    assert "moves nothing" in proc.stderr
    # the budget keeper still watches (a job larger than its trace would be held to the budget)
    assert report is not None and report.guard_trips == 0 and report.peak_device_bytes <= report.budget_bytes
    assert_twin(work, tmp_path)


def test_plan_of_another_job_is_refused_and_training_stays_correct(work, tmp_path):
    other = tmp_path / "other.msgpack"
    ok(teraio("profile", "-o", other, "--", PYTHON, EXAMPLE, "--device", "cpu", "--layers", 3, cwd=tmp_path))
    plan = every_period_plan(load_trace(other), budget_bytes=peak_bytes(load_trace(other)) // 2)
    save_plan(plan, tmp_path / "plan.json")
    proc, report = run_example(work, tmp_path, tmp_path / "plan.json")
    assert "do not match the plan's trace" in proc.stderr
    assert report.iterations_on_plan == 0 and report.guard_trips == 1
    assert_twin(work, tmp_path)
    # --strict stops it in one line, with the mismatch's exit code and no traceback
    proc = teraio("run", "--plan", tmp_path / "plan.json", "--strict", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp_path)
    assert proc.returncode == 6 and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "do not match the plan's trace" in line]
    assert len(said) == 1 and "stopping the job (--strict)" in said[0]


def test_a_job_that_ends_before_the_traced_iteration_is_told_the_plan_was_never_followed(work, tmp_path):
    """The guard checks a plan at the trace's iteration index; a job that ends sooner is told
    at its end, once, and --strict fails it (after its report is written)."""
    trace = load_trace(work / "trace.msgpack")
    save_plan(every_period_plan(trace, peak_bytes(trace) // 2), tmp_path / "plan.json")
    short = ("--device", "cpu", "--steps", "1", "--accum", "2", "--clip", "0.5")   # iteration 0: setup too
    for strict, code in (((), 0), (("--strict",), 6)):
        report = tmp_path / f"run{code}.json"
        proc = teraio("run", "--plan", tmp_path / "plan.json", "--report", report, *strict, "--", PYTHON, EXAMPLE,
                      *short, cwd=tmp_path)
        assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr
        said = [line for line in proc.stderr.splitlines() if line.startswith("teraio: ") and "never followed" in line]
        assert len(said) == 1 and f"profiled at iteration {trace.header.warmup_iterations}" in said[0], proc.stderr
        assert said[0].startswith("teraio: error" if strict else "teraio: warning")
        run = load_report(report)
        assert run.iterations_on_plan == 0 and run.guard_trips == 1 and "never followed" in run.guard_reason
    # a job that ends with a status of its own keeps it under --strict: the runtime's 6 replaced its 3
    own_exit = (f"import runpy, sys; sys.argv = {[str(EXAMPLE), *short]!r}; "
                f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__'); sys.exit(3)")
    proc = teraio("run", "--plan", tmp_path / "plan.json", "--strict", "--", PYTHON, "-c", own_exit, cwd=tmp_path)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert sum("never followed" in line for line in proc.stderr.splitlines()) == 1, proc.stderr


def test_swap_folders_are_removed_and_stale_ones_cleaned(work, tmp_path):
    stale = tmp_path / "ssd" / "teraio-999999-r0"  # a run killed earlier: its pid is gone
    stale.mkdir(parents=True)
    (stale / "1.bin").write_bytes(b"x")
    trace = load_trace(work / "trace.msgpack")
    save_plan(every_period_plan(trace, peak_bytes(trace) // 2, tiers=("ssd",)), tmp_path / "plan.json")
    run_example(work, tmp_path, tmp_path / "plan.json")
    assert list((tmp_path / "ssd").iterdir()) == []


def test_two_rank_torchrun_with_per_rank_plans(tmp_path):
    args = ("--device", "cpu", "--steps", "6")
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", "torchrun", "--nproc-per-node", 2, EXAMPLE, *args,
              cwd=tmp_path))
    for rank in (0, 1):
        trace = load_trace(tmp_path / f"t.rank{rank}.msgpack")
        assert trace.header.gradients_stay_on_device  # DDP: Note [DDP gradients]
        save_plan(every_period_plan(trace, peak_bytes(trace) // 2), tmp_path / f"plan.rank{rank}.json")
    # the planner knows: its plans never count on moving a gradient the runtime keeps
    ok(teraio("plan", tmp_path / "t.rank0.msgpack", "--gpu-mem", str(peak_bytes(trace) * 3 // 4), "-o",
              tmp_path / "planned.json", cwd=tmp_path))
    entries = load_plan(tmp_path / "planned.json").entries
    assert entries and not [e for e in entries if e.kind == "gradient"]
    ok(teraio("run", "--plan", tmp_path / "plan.json", "--report", tmp_path / "run.json", "--ssd-dir",
              tmp_path / "ssd", "--", "torchrun", "--nproc-per-node", 2, EXAMPLE, *args, "--losses-out",
              tmp_path / "planned.json", cwd=tmp_path))
    ok(teraio("profile", "--run-to-completion", "-o", tmp_path / "ignored.msgpack", "--", "torchrun",
              "--nproc-per-node", 2, EXAMPLE, *args, "--losses-out", tmp_path / "profiled.json", cwd=tmp_path))
    plain = tmp_path / "plain"
    plain.mkdir()
    # --standalone: a free rendezvous port, not the default 29500 the runs above just released
    plain_cmd = ("torchrun", "--standalone", "--nproc-per-node", "2", str(EXAMPLE), *args, "--losses-out",
                 str(plain / "l.json"))
    proc = subprocess.run(plain_cmd, cwd=plain, capture_output=True, text=True,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert losses(tmp_path / "planned.json") == losses(plain / "l.json") == losses(tmp_path / "profiled.json")
    for rank in (0, 1):
        report = load_report(tmp_path / f"run.rank{rank}.json")
        assert report.header.rank == rank and report.iterations_on_plan >= 1


def test_missing_plan_is_one_clear_line(tmp_path):
    proc = teraio("run", "--plan", tmp_path / "nope.json", "--", PYTHON, EXAMPLE, cwd=tmp_path)
    assert "does not exist" in one_line_error(proc, 3)


def test_plan_for_another_rank_is_refused(work, tmp_path):
    trace = load_trace(work / "trace.msgpack")
    plan = every_period_plan(trace, peak_bytes(trace) // 2)
    plan = plan.model_copy(update={"header": plan.header.model_copy(
        update={"trace": plan.header.trace.model_copy(update={"rank": 1, "world_size": 2})})})
    save_plan(plan, tmp_path / "plan.json")
    proc = teraio("run", "--plan", tmp_path / "plan.json", "--strict", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp_path)
    assert proc.returncode != 0 and "made for rank 1 of 2" in proc.stderr


def test_planned_iterations_run_the_plan_without_evicting(work, tmp_path):
    """With a plan that fits, every planned iteration does its planned offloads and never
    needs the on-demand eviction (the first one included: it catches up the wrap-around
    offloads that the unplanned iterations skipped)."""
    trace = load_trace(work / "trace.msgpack")
    ok(teraio("plan", work / "trace.msgpack", "--gpu-mem", int(peak_bytes(trace) * 0.9), "--ssds", 1,
              "--host-mem", peak_bytes(trace), "-o", tmp_path / "plan.json", cwd=tmp_path))
    ok(teraio("run", "--plan", tmp_path / "plan.json", "--report", tmp_path / "run.json", "--ssd-dir",
              tmp_path / "ssd", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp_path))
    rows = load_report(tmp_path / "run.json").per_iteration
    planned = [row for row in rows[:-1] if row.followed_plan]  # the last one ends in the job's tail
    assert len(planned) >= 3
    assert all(row.evictions == 0 and row.oom_retries == 0 for row in planned), rows
    assert all(row.planned_offloads > 0 and row.plan_ids_missing == 0 for row in planned), rows


def test_rank_plans_written_by_teraio_plan_are_found_by_teraio_run(tmp_path):
    """The documented multi-GPU flow with default names: profile -o t.msgpack, plan
    t.rank*.msgpack, run --plan t.plan.json."""
    args = ("--device", "cpu", "--steps", "6")
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", "torchrun", "--nproc-per-node", 2, EXAMPLE, *args,
              cwd=tmp_path))
    budget = peak_bytes(load_trace(tmp_path / "t.rank0.msgpack")) * 3 // 4
    ok(teraio("plan", tmp_path / "t.rank0.msgpack", tmp_path / "t.rank1.msgpack", "--gpu-mem", budget,
              "--ssds", 1, "--host-mem", budget, cwd=tmp_path))
    ok(teraio("run", "--plan", tmp_path / "t.plan.json", "--report", tmp_path / "run.json", "--ssd-dir",
              tmp_path / "ssd", "--", "torchrun", "--nproc-per-node", 2, EXAMPLE, *args, cwd=tmp_path))
    for rank in (0, 1):
        report = load_report(tmp_path / f"run.rank{rank}.json")
        assert report.header.plan.endswith(f"t.plan.rank{rank}.json") and report.iterations_on_plan >= 1


def test_an_argument_list_that_runs_plainly_runs_under_teraio(tmp_path):
    """The command is recorded for the headers through one environment string, which Linux
    caps at 128 KiB: 20k arguments ran plainly and failed to start under teraio (E2BIG). The
    header keeps the first ones and counts the rest."""
    script = tmp_path / "train.py"
    script.write_text("import sys, torch\nmodel = torch.nn.Linear(8, 8)\nopt = torch.optim.SGD(model.parameters())\n"
                      "for _ in range(6):\n    model(torch.randn(2, 8)).sum().backward()\n    opt.step()\n"
                      "print(len(sys.argv) - 1, 'arguments')\n")
    args = [str(n) for n in range(20000)]
    ok(teraio("profile", "--run-to-completion", "-o", tmp_path / "t.msgpack", "--", PYTHON, script, *args,
              cwd=tmp_path))
    command = load_trace(tmp_path / "t.msgpack").header.command
    assert command[:3] == [PYTHON, str(script), "0"] and command[-1].endswith("more arguments)")
    save_plan(every_period_plan(load_trace(tmp_path / "t.msgpack"), 1 << 30), tmp_path / "plan.json")
    proc = ok(teraio("run", "--plan", tmp_path / "plan.json", "--", PYTHON, script, *args, cwd=tmp_path))
    assert "20000 arguments" in proc.stdout


def test_the_iteration_that_proves_the_plan_follows_it_too(work, tmp_path):
    """Note [Following before learning]: a plan from `teraio plan` is followed from the job's
    second iteration (the first makes the optimizer state), without the on-demand evictions
    of an unplanned one, and in the first from where its traced ops begin, after the job's
    setup, with fewer; a plan without chunk digests (older plans) learns from the second
    iteration and follows from the next. Both train exactly like the plain run."""
    trace = load_trace(work / "trace.msgpack")
    peak = peak_bytes(trace)
    ok(teraio("plan", work / "trace.msgpack", "--gpu-mem", peak // 2, "--ssds", 0, "--host-mem", peak,
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    _, report = run_example(work, tmp_path, tmp_path / "plan.json")
    assert_twin(work, tmp_path)
    first, second = report.per_iteration[:2]
    assert not first.followed_plan and first.paused_at_kernel == -1   # unplanned, not a pause
    assert second.followed_plan and second.evictions == 0 and second.planned_offloads > 0, second
    assert not report.pause_reason.startswith("iteration 0")

    plan = load_plan(tmp_path / "plan.json")
    trace_ref = plan.header.trace.model_copy(update={"chunk_digests": ""})
    save_plan(plan.model_copy(update={"header": plan.header.model_copy(update={"trace": trace_ref})}),
              tmp_path / "older.json")
    _, report = run_example(work, tmp_path, tmp_path / "older.json")
    assert_twin(work, tmp_path)
    assert [row.followed_plan for row in report.per_iteration[:3]] == [False, False, True]
    # Finding the trace's start: the first iteration, the job's setup ahead of it, follows the
    # plan from the start it found until the first step makes the optimizer state
    older_first = report.per_iteration[0]
    assert first.planned_offloads > 0 and older_first.planned_offloads == 0
    assert first.evictions < older_first.evictions, (first, older_first)


def test_a_plan_that_did_not_fit_runs_exactly_and_the_summary_says_the_plan_is_why_it_evicted(work, tmp_path):
    """Planned with no room to move to (a host pool of 1 MiB, no SSD), the plan says it does
    not fit; the run kept the cap by evicting, and its summary blamed longer batches."""
    peak = peak_bytes(load_trace(work / "trace.msgpack"))
    ok(teraio("plan", work / "trace.msgpack", "--gpu-mem", peak // 2, "--ssds", 0, "--host-mem", "1MiB",
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    assert not load_plan(tmp_path / "plan.json").header.prediction.fits
    proc, report = run_example(work, tmp_path, tmp_path / "plan.json")
    assert_twin(work, tmp_path)
    assert not report.plan_fits and report.peak_device_bytes <= report.budget_bytes
    evicted = sum(row.evictions for row in report.per_iteration if row.followed_plan)
    summary = " ".join(proc.stderr.split())
    assert evicted > 0 and "the plan itself did not fit the budget" in summary, summary
    assert "longest batch" not in summary



JOB_WRITING_METRICS = """
import json, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
optimizer = torch.optim.AdamW(model.parameters())
losses = []
for _ in range(12):
    loss = model(torch.randn(32, 64)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item().hex())
json.dump(losses, open("metrics.json", "w"))   # a name of its own, on no command line
"""


def test_a_report_path_the_job_writes_keeps_the_jobs_file_and_the_report_goes_beside_it(tmp_path):
    """Note [A report path the job wrote] in teraio_run/report.py: `--report metrics.json` on a
    job that writes its own metrics.json replaced the job's file with the report, without a
    word (a diffusers user's trial; a path on the job's command line is refused up front)."""
    (tmp_path / "job.py").write_text(JOB_WRITING_METRICS)
    subprocess.run([PYTHON, "job.py"], cwd=tmp_path, check=True, env=dict(os.environ, **CPU_ENV))
    plain = (tmp_path / "metrics.json").read_text()
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, "job.py", cwd=tmp_path))
    trace = load_trace(tmp_path / "t.msgpack")
    ok(teraio("plan", tmp_path / "t.msgpack", "--gpu-mem", peak_bytes(trace) // 2, "--ssds", 0,
              "--host-mem", "64MiB", "-o", tmp_path / "plan.json", cwd=tmp_path))
    proc = ok(teraio("run", "--plan", "plan.json", "--report", "metrics.json", "--", PYTHON, "job.py", cwd=tmp_path))
    assert (tmp_path / "metrics.json").read_text() == plain   # the job's file, the plain run's losses
    assert load_report(tmp_path / "metrics.teraio.json").iterations_on_plan >= 1
    said = " ".join(proc.stderr.split())
    assert "metrics.json was written during the run, not by teraio" in said, said
    assert f"the run report is in {tmp_path / 'metrics.teraio.json'} instead" in said
    (tmp_path / "metrics.teraio.json").unlink()   # a report from an earlier run is replaced as asked
    ok(teraio("run", "--plan", "plan.json", "--report", "metrics.teraio.json", "--", PYTHON, "job.py", cwd=tmp_path))
    ok(teraio("run", "--plan", "plan.json", "--report", "metrics.teraio.json", "--", PYTHON, "job.py", cwd=tmp_path))
    assert not (tmp_path / "metrics.teraio.teraio.json").exists()
