"""bench/: a CPU run of run_baseline.py writes a valid result, failures become result rows, and
report.py renders them (failed and missing rows flagged)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TINY = ["--preset", "tiny", "--device", "cpu", "--warmup", "1", "--steps", "3"]


def bench(args, out):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(BENCH / "run_baseline.py"), *args, "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("results")
    out = folder / "cpu.jsonl"
    for system in ("ideal", "checkpointing", "save_on_cpu"):
        bench(["--system", system, *TINY], out)
    bench(["--system", "plain_capped", "--gpu-mem", "1GiB", *TINY], out)  # a cap needs CUDA: fails
    bench(["--system", "ideal", *TINY, "--timeout-s", "0.2"], folder / "timeout.json")
    by_system = {}
    for line in out.read_text().splitlines():
        r = json.loads(line)
        by_system[r["system"]] = r
    return folder, by_system, json.loads((folder / "timeout.json").read_text())


def test_result_is_complete(results):
    _, by_system, _ = results
    r = by_system["ideal"]
    assert (r["format"], r["schema_version"], r["status"], r["error"]) == ("teraio-bench-result", 1, "ok", None)
    m, c = r["metrics"], r["config"]
    assert len(m["step_ms"]) == 3 and len(m["losses"]) == 4
    assert m["step_ms_p10"] <= m["step_ms_median"] <= m["step_ms_p90"]
    assert m["tokens_per_s"] == pytest.approx(4 * 64 / (m["step_ms_median"] / 1e3))
    assert m["host_rss_peak_bytes"] > 0 and m["peak_device_bytes"] is None
    assert (c["layers"], c["dim"], c["seq"], c["batch"], c["params"]) == (2, 128, 64, 4, 459392)
    assert c["gpu_mem_cap_bytes"] is None and c["measured_steps"] == 3 and c["deterministic"] is False
    for key in ("date", "git_commit", "code_sha256", "device_name", "torch"):
        assert r["env"][key]


def test_systems_train_the_same_model(results):
    """Recomputation and saving on CPU change where activations live, not the arithmetic."""
    _, by_system, _ = results
    ideal = by_system["ideal"]["metrics"]["losses"]
    assert by_system["checkpointing"]["config"]["act_ckpt"] is True
    for system in ("checkpointing", "save_on_cpu"):
        assert by_system[system]["status"] == "ok"
        assert by_system[system]["metrics"]["losses"] == pytest.approx(ideal, rel=1e-6)


def test_failures_are_results(results):
    _, by_system, timed_out = results
    failed = by_system["plain_capped"]
    assert failed["status"] == "failed" and failed["failed_at"] == "setup"
    assert "needs a CUDA device" in failed["error"]
    assert failed["config"]["gpu_mem_cap_bytes"] == 2**30
    assert timed_out["status"] == "failed" and timed_out["failed_at"] == "timeout"


def test_report_flags_failed_and_missing(results, tmp_path):
    folder, _, _ = results
    (folder / "junk.json").write_text('{"format": "something-else"}')
    md, png = tmp_path / "BENCHMARKS.md", tmp_path / "bench.png"
    proc = subprocess.run([sys.executable, str(BENCH / "report.py"), "--results", str(folder), "--md", str(md),
                           "--png", str(png)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = md.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]

    def row(system, cap):
        (line,) = [r for r in rows if r.split("|")[1].strip() == system and r.split("|")[6].strip().endswith(cap)]
        return line

    assert "100.0%" in row("ideal", "none") and row("checkpointing", "none").endswith("| ok |")
    # a failure says at which commit: it may have been fixed since
    assert re.search(r"\*\*failed\*\* \(setup\) at \w{7}: RuntimeError: --gpu-mem needs a CUDA device",
                     row("plain_capped", "1.0"))
    # systems with no result in a table at all are flagged as not run there, never left out
    assert "**not run**: in this configuration" in row("zero_offload", "1.0")
    assert "**not run**: in this configuration" in row("teraio_mixed", "1.0")
    assert "junk.json: not a teraio-bench-result object" in text
    assert "**failed** (timeout)" not in text  # an ok run of the same configuration wins
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no plot" in text
    else:
        assert png.stat().st_size > 0 and f"]({png.name})" in text


@pytest.mark.slow
def test_zero_offload_on_cpu_trains_the_same_model(results, tmp_path):
    """Where DeepSpeed is installed, ZeRO-Offload (CPU accelerator, cpu_adam) matches the ideal run."""
    pytest.importorskip("deepspeed")
    _, by_system, _ = results
    out = tmp_path / "zero.json"
    bench(["--system", "zero_offload", *TINY], out)
    r = json.loads(out.read_text())
    assert r["status"] == "ok", r["error"]
    assert r["config"]["system_config"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert r["metrics"]["losses"] == pytest.approx(by_system["ideal"]["metrics"]["losses"], rel=1e-5)


def test_teraio_row_trains_exactly_and_reports_its_io(results, tmp_path):
    """The teraio rows run the ideal's own loop: profiled, planned and run through the harness,
    the losses are the ideal's bit for bit, and the row carries bytes moved, stalls and the plan's
    prediction."""
    _, by_system, _ = results
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    trace, plan, out = tmp_path / "t.msgpack", tmp_path / "plan.json", tmp_path / "teraio.json"
    proc = subprocess.run([sys.executable, str(BENCH / "run_baseline.py"), "--system", "ideal", *TINY,
                           "--warmup", "2", "--profile-trace", str(trace)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0 and trace.exists(), proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "teraio", "plan", str(trace), "--gpu-mem", "6MiB", "--ssds", "1",
                           "--host-mem", "1GiB", "-o", str(plan)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    bench(["--system", "teraio_mixed", *TINY, "--warmup", "2", "--plan", str(plan), "--gpu-mem", "6MiB",
           "--ssd-dir", str(tmp_path / "swap")], out)
    r = json.loads(out.read_text())
    assert r["status"] == "ok", r["error"]
    m = r["metrics"]
    assert m["losses"][:4] == by_system["ideal"]["metrics"]["losses"]
    assert m["teraio"]["iterations_on_plan"] >= 1 and m["teraio"]["peak_device_bytes"] <= 6 * 2**20
    assert m["bytes_moved"]["out_host"] + m["bytes_moved"]["out_ssd"] > 0 and m["stall_ms"] is not None
    assert m["predicted_step_ms"] > 0 and r["config"]["system_config"]["budget_bytes"] == 6 * 2**20
    assert not any((tmp_path / "swap").iterdir())  # the run's swap folder is gone


def import_report():
    sys.path.insert(0, str(BENCH))
    try:
        import report
    finally:
        sys.path.remove(str(BENCH))
    return report


def test_report_states_what_the_host_link_allows():
    """At each ratio the report says how much must cross the host link per step (the ideal's
    peak above the cap, out and back) and what share of ideal that leaves at the measured rate."""
    report = import_report()
    ideal = {"status": "ok", "metrics": {"peak_device_bytes": 100e9, "step_ms_median": 500.0}}
    teraio = {"status": "ok", "metrics": {"teraio": {"achieved_gbps": {"d2h": 50.0, "h2d": 40.0, "d2s": 1.0}}}}
    chosen = {("ideal", None): ideal, ("teraio_host", 50e9): teraio}
    lines = report.link_bounds(chosen, [50e9, 25e9], ideal)
    assert "at least 100.0 GB" in lines[0] and "2000 ms at the 50.0 GB/s" in lines[0] and "about 25% " in lines[0]
    assert "at least 150.0 GB" in lines[1] and "about 17% " in lines[1]
    assert report.link_bounds({("ideal", None): ideal}, [50e9], ideal) == []  # no measured rate: no claim


def test_report_compares_with_every_zero_variant_and_explains_runs_not_made():
    """Speed-ups cover every ZeRO variant that ran (with checkpointing too); a system out of
    memory at a looser cap is marked not run at a tighter one, with the reason, not missing."""
    report = import_report()
    ok = lambda tok_s: {"status": "ok", "metrics": {"tokens_per_s": tok_s}}  # noqa: E731
    oom = {"status": "failed", "env": {"git_commit": "abcdef123"},
           "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. 9.00 GiB allowed"}
    chosen = {("ideal", None): ok(1000.0), ("teraio_host", 50): ok(400.0), ("zero_offload+ckpt", 50): ok(200.0),
              ("zero_infinity+ckpt", 50): ok(10.0), ("zero_offload", 50): oom, ("teraio_host", 25): ok(100.0)}
    at_2x, at_4x = report.speedups(chosen, [50, 25], 100)[:2]
    assert "2.00x zero_offload+ckpt" in at_2x and "40.00x zero_infinity+ckpt" in at_2x
    assert "zero_infinity, zero_offload did not run" in at_2x
    assert "no ZeRO variant did" in at_4x
    reason = report.not_run_reason("zero_offload", 25, chosen, [50, 25])
    row = report.row_for("zero_offload", 25, None, chosen[("ideal", None)], reason)
    assert "**not run**: out of device memory at a larger cap already (at abcdef1)" in row
    assert "in this configuration" in report.not_run_reason("save_on_cpu", 25, chosen, [50, 25])
    assert report.not_run_reason("zero_offload+ckpt", 25, chosen, [50, 25]) is None  # ran at 2x: missing here
    assert "**missing**" in report.row_for("zero_offload+ckpt", 25, None, chosen[("ideal", None)])


def test_pool_replay_of_the_recorded_quarter_plan_fits_its_pool_and_only_its_pool():
    """The claim docs/gpu-results.md makes about the 1/4 spill: on the plan's own timing the
    72 GiB pool never runs out; a smaller pool does."""
    sys.path.insert(0, str(BENCH))
    try:
        import pool_replay
    finally:
        sys.path.remove(str(BENCH))
    from teraio.formats.plan import load_plan

    plan = load_plan(ROOT / "bench/results/2026-11-29-teraio-quarter-3b-fp32-a293898-plans/plan_host_4x.json")
    slots, failed = pool_replay.replay(plan, 72 * 2**30, iterations=3)
    assert failed == [] and slots.peak_used == pytest.approx(plan.header.prediction.host_pool_bytes, rel=1e-3)
    _, failed = pool_replay.replay(plan, 60 * 2**30, iterations=3)
    assert failed


@pytest.mark.slow
def test_host_cost_measures_each_regime_through_the_cli(tmp_path):
    """bench/host_cost.py (issue 14's per-kernel host cost): its planned iterations really ran
    the plan, its unplanned ones kept the budget without evicting, its eviction-heavy ones
    evicted, and the result names the command, the commit and the targets it was held to."""
    out = tmp_path / "host_cost.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", TERAIO_COMMIT="abc1234")
    proc = subprocess.run([sys.executable, str(BENCH / "host_cost.py"), "--steps", "5", "--out", str(out),
                           "--", "--layers", "2"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    by_regime = {row["regime"]: row for row in r["regimes"]}
    planned, unplanned, evicting = by_regime["planned"], by_regime["unplanned"], by_regime["eviction-heavy"]
    assert planned["iterations"] >= 2 and planned["planned_offloads_per_iteration"] > 0
    assert unplanned["planned_offloads_per_iteration"] == 0 and unplanned["evictions_per_iteration"] == 0
    assert evicting["planned_offloads_per_iteration"] == 0 and evicting["evictions_per_iteration"] > 0
    for row in (planned, unplanned, evicting):
        assert row["kernels_per_iteration"] > 0 and row["walk_us_per_kernel"] > 0 and row["ratio_to_plain"] > 0
    assert r["git_commit"] == "abc1234" and r["command"][1].endswith("host_cost.py") and r["plain_step_ms"] > 0
    assert r["targets"]["planned"]["target_us_per_kernel"] == 25
    assert r["targets"]["unplanned"]["target_us_per_kernel"] == 50
    assert "host cost per kernel" in proc.stdout


def test_recompute_candidates_find_the_autocast_weight_casts_replayable_from_weights_alone():
    """bench/recompute_candidates.py on the committed 3B bf16 trace: the bf16 copies autocast makes
    of fp32 weights need nothing but the weights to be made again; matmul outputs need their
    activation input too."""
    from teraio.formats.trace import load_trace

    sys.path.insert(0, str(BENCH))
    from recompute_candidates import analyse

    by_op = analyse(load_trace(ROOT / "traces" / "h200-3b-bf16.msgpack"))
    assert by_op["_to_copy"]["from_globals_bytes"] > 5 * 2**30
    assert by_op["mm"]["replayable_bytes"] > 0 == by_op["mm"]["from_globals_bytes"]


def test_calibrated_predictions_of_recorded_h200_runs_hold_within_ten_percent():
    """Issue 16's fidelity on recorded data (H200): the 3B chained-replay plans at 1/2 with 1 and
    2 GiB of headroom, and a plan at 1/4 predicted from a run at 1/2 (another budget), each
    calibrated from its call's first run, predict every run within 10% (the planner's code is
    this checkout's: a change to the model that loses it fails here). Reports from before the
    time between ops was measured (aa86907's) leave part of the thread out: docs/planner.md."""
    sys.path.insert(0, str(BENCH))
    from recorded_fidelity import fidelity_rows
    rows = [row for name in ("fidelity-between-ops-37908a7", "cross-budget-bea3c95")
            for row in fidelity_rows(ROOT / "traces/h200-3b-fp32-writes.msgpack",
                                     BENCH / f"results/2026-12-01-{name}/chained_3b.jsonl")]
    assert len(rows) == 4
    assert all(abs(row["ran_plan_calibrated_ms"] / row["measured_ms"] - 1) < 0.10 for row in rows), rows
    assert all(abs(row["calibrated_ms"] / row["measured_ms"] - 1) < 0.10 for row in rows), rows