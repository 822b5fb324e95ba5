"""teraio profile and inspect, through the real CLI on the bundled example (CPU)."""

import json
import os
import subprocess

import pytest

from teraio.formats.trace import Kind, Phase, load_trace
from teraio.walk import OpWalk, WalkListener, activate, deactivate, op_signatures
from teraio_profile.recorder import IMMORTAL_KINDS, NOT_FREED, TraceRecorder
from cli_helpers import EXAMPLE, PYTHON, ok, one_line_error, teraio
from test_clients import CLIENTS

EXAMPLE_ARGS = ("--device", "cpu", "--steps", "6")


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profile")
    ok(teraio("profile", "-o", tmp / "trace.msgpack", "--", PYTHON, EXAMPLE, *EXAMPLE_ARGS, cwd=tmp))
    return tmp / "trace.msgpack"


def test_kernels_never_take_longer_than_their_iteration(trace_path):
    """Note [Kernel time under the profiler]: on a busy CPU the recorded iterations' ops ran
    slower than the warm-up iterations (kernels of 1.27 s in a 60 ms iteration); the planner
    then saw 20x the time there is."""
    trace = load_trace(trace_path)
    assert trace.duration_us.sum() / 1e3 <= trace.header.iteration_ms * 1.001


def test_kinds_come_from_model_and_optimizer(trace_path):
    trace = load_trace(trace_path)
    by_id = {tid: Kind(kind) for tid, kind in zip(trace.tensor_id, trace.kind)}
    names = {name: Kind(kind) for name, kind in zip(trace.tensor_name, trace.kind)}
    assert by_id["model.layers.0.self_attn.q_proj.weight"] == Kind.parameter
    assert by_id["model.layers.1.mlp.up_proj.weight:exp_avg"] == Kind.optimizer_state
    assert by_id["model.layers.1.mlp.up_proj.weight:exp_avg_sq"] == Kind.optimizer_state
    assert names["model.layers.1.mlp.up_proj.weight.grad"] == Kind.gradient
    assert any(kind == Kind.activation and "model.layers.0" in tid for tid, kind in by_id.items())
    params = [tid for tid, kind in by_id.items() if kind == Kind.parameter]
    assert len([t for t in by_id if t.endswith(":exp_avg")]) == len(params)


def test_lifetimes_are_consistent(trace_path):
    trace = load_trace(trace_path)
    n = trace.num_kernels
    for i in range(trace.num_tensors):
        uses = trace.uses(i)
        assert len(uses) and (uses[:-1] <= uses[1:]).all()
        if trace.born[i] >= 0:  # an intermediate is used only while it lives
            assert trace.born[i] == uses[0] and uses[-1] < trace.freed[i] <= 2 * n
    assert trace.header.world_size == 1 and trace.header.num_kernels == n


def test_ids_are_stable_across_profiles(trace_path, tmp_path):
    ok(teraio("profile", "-o", tmp_path / "again.msgpack", "--", PYTHON, EXAMPLE, *EXAMPLE_ARGS, cwd=tmp_path))
    first, second = load_trace(trace_path), load_trace(tmp_path / "again.msgpack")
    assert first.header.op_digest == second.header.op_digest
    assert first.tensor_id == second.tensor_id


def test_inspect_json_has_the_figures(trace_path, tmp_path):
    stats = json.loads(ok(teraio("inspect", trace_path, "--json", cwd=tmp_path)).stdout)
    for key in ("format", "schema_version", "num_kernels", "num_tensors", "iterations_profiled", "peak_bytes",
                "device", "tensors_by_kind", "active_fraction_mean"):
        assert key in stats
    assert stats["format"] == "teraio-trace" and stats["iterations_profiled"] == 2
    assert 0 < stats["active_fraction_mean"] < 1
    assert stats["tensors_by_kind"]["parameter"] > 0
    view = ok(teraio("inspect", trace_path, cwd=tmp_path)).stdout
    assert "Largest tensors" in view and "Idle periods" in view


def test_two_rank_torchrun_writes_a_trace_per_rank(tmp_path):
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", "torchrun", "--nproc-per-node", "2",
              EXAMPLE, *EXAMPLE_ARGS, cwd=tmp_path))
    ranks = [load_trace(tmp_path / f"t.rank{r}.msgpack") for r in (0, 1)]
    assert [t.header.rank for t in ranks] == [0, 1]
    assert all(t.header.world_size == 2 for t in ranks)
    assert any(name.startswith("all") or "c10d" in name for name in ranks[0].op_names), ranks[0].op_names


# ----- bad input: one line, an exit code, no traceback, nothing half-written -------------------

def test_backward_ops_after_a_checkpoints_recompute_are_named_as_backward(tmp_path):
    """Note [Scopes left by an exception] in teraio/walk.py: a non-reentrant checkpoint stops its
    recompute by raising, past the module hooks that close a scope, and a T5 trial read the loss's
    gradient as `encoder.block.0.layer.1.dropout/nll_loss_backward.0#0`; the loss's own ops were
    taken for forward ones (their outputs activations)."""
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, CLIENTS / "checkpointed_blocks.py",
              cwd=tmp_path))
    trace = load_trace(tmp_path / "t.msgpack")
    made_by_backward = [trace.tensor_id[t] for t in range(trace.num_tensors)
                        if trace.born[t] >= 0 and "backward" in trace.op_name(int(trace.born[t]))]
    assert made_by_backward and all(name.startswith("bwd/") for name in made_by_backward), made_by_backward
    loss = [k for k in range(trace.num_kernels) if trace.op_name(k) == "nll_loss_forward"]
    assert loss and all(trace.kernel_phase[k] == Phase.other for k in loss)


def test_missing_script(tmp_path):
    assert "does not exist" in one_line_error(teraio("profile", "nope.py", cwd=tmp_path), 2)


def test_not_a_python_script(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert "not a Python script" in one_line_error(teraio("profile", "notes.txt", cwd=tmp_path), 2)


def test_a_command_on_no_path_exits_as_the_shell_would(tmp_path):
    """127, the shell's status for a command it cannot find, for wrappers that test for it."""
    for stage in (("profile",), ("run", "--plan", "plan.json")):
        assert "not found" in one_line_error(teraio(*stage, "--", "trainn", "x.py", cwd=tmp_path), 127)


def test_a_mistyped_option_is_named_not_taken_for_the_command(tmp_path):
    """Unknown options start the job's command (`teraio profile train.py --lr 3e-4`), so a
    typo of ours was reported as a command not found, exit 127."""
    for stage, typo, meant in ((("profile",), "--warmpu", "--warmup"),
                               (("run", "--plan", "plan.json"), "--ssd-dirr", "--ssd-dir")):
        line = one_line_error(teraio(*stage, typo, "2", "--", PYTHON, "x.py", cwd=tmp_path), 2)
        assert f"no such option: {typo} (did you mean {meant}?)" in line


def test_crashing_script_shows_its_traceback_then_our_line(tmp_path):
    (tmp_path / "boom.py").write_text("import torch\nraise ValueError('broken data')\n")
    proc = teraio("profile", "boom.py", cwd=tmp_path)
    assert "ValueError: broken data" in proc.stderr
    assert "exited with code 1" in one_line_error(proc, 4)


def test_an_error_in_the_jobs_own_op_shows_the_jobs_traceback_not_ours(tmp_path):
    """Note [The job's errors, not ours] in teraio/walk.py: a shape mismatch raised inside the
    walk, and its traceback ran through teraio/walk.py: users read it as a crash of ours."""
    (tmp_path / "bad.py").write_text("import torch\nm = torch.nn.Linear(4, 4)\nm(torch.randn(2, 5))\n")
    proc = teraio("profile", "bad.py", cwd=tmp_path)
    traceback = proc.stderr.split("Traceback (most recent call last):")[1]
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in traceback
    assert 'bad.py", line 3' in traceback and "teraio" not in traceback.split("RuntimeError")[0]
    assert "_ops.py" not in traceback


def test_script_without_optimizer_step(tmp_path):
    (tmp_path / "idle.py").write_text("import torch\nprint(torch.ones(3).sum())\n")
    assert "without a step of a torch.optim optimizer" in one_line_error(teraio("profile", "idle.py", cwd=tmp_path), 4)


HAND_WRITTEN_SGD = """import torch
{import_}
model = torch.nn.Linear(8, 8)
for _ in range(12):
    model(torch.randn(4, 8)).square().mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
            p.grad = None
    {mark}
"""


def test_a_loop_with_its_own_optimizer_is_told_to_mark_its_steps_and_profiles_once_it_does(tmp_path):
    """fastai's own optimizers step no torch.optim optimizer: the profile said "profile a script
    that trains" to a script that trained."""
    (tmp_path / "sgd.py").write_text(HAND_WRITTEN_SGD.format(import_="", mark=""))
    line = one_line_error(teraio("profile", "sgd.py", cwd=tmp_path), 4)
    assert "an optimizer of its own" in line and "teraio.walk.teraio_step()" in line
    (tmp_path / "sgd.py").write_text(HAND_WRITTEN_SGD.format(import_="from teraio.walk import teraio_step",
                                                             mark="teraio_step()"))
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "sgd.py", cwd=tmp_path))
    assert len(load_trace(tmp_path / "t.msgpack").kernel_op) > 0


def test_too_few_steps_says_how_many(tmp_path):
    proc = teraio("profile", "--iterations", "5", "--", PYTHON, EXAMPLE, *EXAMPLE_ARGS,
                  cwd=tmp_path)
    assert "after 6 iteration(s), but the profile needs at least 8" in one_line_error(proc, 4)


def test_ops_that_change_every_iteration_are_named_not_miscounted(tmp_path):
    """Eight iterations, each one layer deeper: enough of them, but never two alike. The line
    says so instead of asking for a count of iterations the job already ran."""
    (tmp_path / "grow.py").write_text(
        "import torch\n"
        "layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(12))\n"
        "opt = torch.optim.SGD(layers.parameters(), lr=0.1)\n"
        "for step in range(8):\n"
        "    x = torch.randn(4, 8)\n"
        "    for layer in layers[:step + 1]:\n"
        "        x = torch.tanh(layer(x))\n"
        "    x.sum().backward()\n"
        "    opt.step(); opt.zero_grad()\n")
    line = one_line_error(teraio("profile", "--", PYTHON, "grow.py", cwd=tmp_path), 4)
    assert "after 8 iteration(s), but no two in a row after the warm-up ran the same ops" in line
    assert "needs at least" not in line


def test_failed_profile_keeps_the_previous_trace(trace_path, tmp_path):
    good = tmp_path / "trace.msgpack"
    good.write_bytes(trace_path.read_bytes())
    (tmp_path / "boom.py").write_text("import torch\nraise SystemExit(3)\n")
    one_line_error(teraio("profile", "-o", good, "boom.py", cwd=tmp_path), 4)
    assert good.read_bytes() == trace_path.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_unwritable_output_folder(tmp_path):
    proc = teraio("profile", "-o", tmp_path / "missing" / "t.msgpack", "--", PYTHON, EXAMPLE, cwd=tmp_path)
    assert "does not exist" in one_line_error(proc, 2)


def test_inspect_rejects_truncated_foreign_and_future_files(trace_path, tmp_path):
    (tmp_path / "cut.msgpack").write_bytes(trace_path.read_bytes()[:1000])
    assert "is damaged or truncated" in one_line_error(teraio("inspect", "cut.msgpack", cwd=tmp_path), 3)
    (tmp_path / "x.json").write_text('{"header": {"format": "other"}}')
    assert "not a TeraIO file" in one_line_error(teraio("inspect", "x.json", cwd=tmp_path), 3)
    import msgpack
    raw = msgpack.unpackb(trace_path.read_bytes())
    raw["header"]["schema_version"] = 99
    (tmp_path / "future.msgpack").write_bytes(msgpack.packb(raw))
    assert "upgrade teraio" in one_line_error(teraio("inspect", "future.msgpack", cwd=tmp_path), 3)


# ----- Note [Deaths]: deaths come from the storages, not from a scan after every op ----------

class ScanAlongside(WalkListener):
    """The recorder, and beside it the scan it replaced: after every recorded op, every
    window tensor not yet seen freed is checked, and its first freed op noted."""

    def __init__(self, recorder, expired_calls):
        self.recorder, self.scanned_deaths, self.expired_calls = recorder, {}, expired_calls

    def before_op(self, k, func, inputs):
        self.recorder.before_op(k, func, inputs)

    def after_op(self, k, func, inputs, new, signature):
        self.expired_calls["on"] = True
        try:
            self.recorder.after_op(k, func, inputs, new, signature)
        finally:
            self.expired_calls["on"] = False
        rec = self.recorder
        if not rec.recording:
            return
        offset = (rec.iteration - rec.window) * rec.kernels_in_window
        for life in rec.lives.values():
            if life.record.kind not in IMMORTAL_KINDS and life not in self.scanned_deaths and life.record.ref.expired():
                self.scanned_deaths[life] = offset + k

    def on_step_end(self):
        self.recorder.on_step_end()

    def on_iteration_end(self, iteration, num_kernels):
        self.recorder.on_iteration_end(iteration, num_kernels)


def test_deaths_equal_a_scan_after_every_op_and_cost_no_scan(monkeypatch):
    """The example's window tensors die at the very op a scan of every live tensor finds,
    while the recorder itself checks a storage only when it has been freed (the scan made
    profiling quadratic in the live set: 36 minutes for an 800-layer model)."""
    from teraio.examples import train_gpt
    from teraio.walk import WeakStorage

    calls = {"on": False, "n": 0}
    expired = WeakStorage.expired

    def counted(self):
        calls["n"] += calls["on"]
        return expired(self)

    monkeypatch.setattr(WeakStorage, "expired", counted)
    recorder = TraceRecorder("cpu", warmup=1, iterations=2)
    listener = ScanAlongside(recorder, calls)
    walk = recorder.walk = OpWalk(listener, "cpu")
    walk.signature_of = op_signatures  # as the profiler's agent sets it
    activate(walk)
    try:
        train_gpt.main(["--device", "cpu", "--steps", "7", "--log-every", "0"])
    finally:
        deactivate(walk)
    assert recorder.finished
    mortal = [life for life in recorder.lives.values() if life.record.kind not in IMMORTAL_KINDS]
    recorded = {life: life.freed for life in mortal if life.freed != NOT_FREED}
    assert recorded == listener.scanned_deaths
    num_k = recorder.kernels_in_window
    assert len(recorded) > 200 and any(freed >= num_k for freed in recorded.values())  # some die in the next iteration
    assert calls["n"] <= 2 * len(mortal), f"{calls['n']} liveness checks for {len(mortal)} tensors"  # watch, death


def test_a_rank_that_died_before_saying_anything_is_named_not_taken_for_done():
    """A spawned job's caller fails after its ranks ran: only if every rank of the world wrote its
    trace is that the profile ending them; a rank with no status at all crashed."""
    from teraio_profile.profile import _ranks_without_trace

    statuses = [{"rank": 0, "world_size": 3, "trace": "t.rank0.msgpack"},
                {"rank": 2, "world_size": 3, "trace": "t.rank2.msgpack"}]
    assert _ranks_without_trace(statuses) == [1]
    assert _ranks_without_trace([{"rank": 0, "trace": "t.msgpack"}]) == []


def test_a_profile_beside_processes_that_hold_the_cores_says_its_kernel_times_are_inflated(tmp_path):
    """Note [A busy machine under the profiler]: a profile on a loaded CPU box took the waits
    for a core as kernel time, and nothing said so; its plans expected time the job never has.
    The job computes on every core, and as many busy loops want them too."""
    cores = os.cpu_count()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=str(cores))
    hogs = [subprocess.Popen([PYTHON, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        proc = ok(subprocess.run([PYTHON, "-m", "teraio", "profile", "-o", tmp_path / "trace.msgpack", "--", PYTHON,
                                  EXAMPLE, *EXAMPLE_ARGS], env=env, capture_output=True, text=True, timeout=300))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    warning = [line for line in proc.stderr.splitlines() if "other processes kept" in line]
    assert len(warning) == 1 and warning[0].startswith("teraio: warning:"), proc.stderr
    assert load_trace(tmp_path / "trace.msgpack").num_kernels > 0   # the trace is still written
