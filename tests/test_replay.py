"""Recomputation in the run (teraio_run/replay.py, Note [Replay]): a storage released without a
copy and made again by replaying the op that made it trains exactly like a plain run.

Through the real CLI on the bundled example (CPU), with the twin-run oracle of test_run.py.
"""

import subprocess


from teraio.formats.plan import PlanEntry, load_plan, save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import Kind, load_trace
from cli_helpers import PYTHON, ok, teraio
from runtime_helpers import as_recompute_plan, every_period_plan
from test_run import assert_twin, peak_bytes, run_example, work  # noqa: F401  (work: the shared profile and plain run)


def test_replayed_activations_train_identically_and_cross_no_link(work, tmp_path):
    trace = load_trace(work / "trace.msgpack")
    plan = as_recompute_plan(trace, every_period_plan(trace, budget_bytes=peak_bytes(trace) // 2))
    replayed = [e for e in plan.entries if e.tier == "recompute"]
    assert len(replayed) >= 10
    save_plan(plan, tmp_path / "plan.json")
    _, report = run_example(work, tmp_path, tmp_path / "plan.json")
    assert_twin(work, tmp_path)
    planned = [row for row in report.per_iteration if row.followed_plan]
    assert len(planned) >= 3
    released = report.offloaded_bytes["recompute"]
    assert released >= len(planned) * sum(e.nbytes for e in replayed) * 0.9
    assert report.written_bytes["recompute"] == 0 and report.prefetched_bytes["recompute"] > 0


TRAIN_LOOP = """
torch.manual_seed(0)
model = {model}()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(32, 64))
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"loss {{loss.item():.10f}}")
"""


def run_one_replay(tmp_path, module_text: str, model: str, op_word: str, period):
    """Profiles a small job (module_text's `model`, trained by TRAIN_LOOP), plans one recompute
    entry for the output of the op named op_word over period(trace, tensor) = (offload_after,
    needed_by), runs it under teraio and plainly; returns (report, losses under teraio, plain losses)."""
    script = tmp_path / "job.py"
    script.write_text(module_text + TRAIN_LOOP.format(model=model))
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, script, cwd=tmp_path))
    trace = load_trace(tmp_path / "t.msgpack")
    t = next(t for t, name in enumerate(trace.tensor_id) if op_word in name)
    assert Kind(trace.kind[t]) == Kind.activation
    after, needed = period(trace, t)
    entry = PlanEntry(tensor=trace.tensor_id[t], name=trace.tensor_name[t], kind="activation",
                      nbytes=int(trace.nbytes[t]), tier="recompute", produced_at=int(trace.born[t]),
                      offload_after=after, offload_by=after, prefetch_at=needed, needed_by=needed,
                      wraps=False, reason=f"test: a replay of {op_word}")
    plan = every_period_plan(trace, budget_bytes=10 * peak_bytes(trace))
    save_plan(plan.model_copy(update={"entries": [entry]}), tmp_path / "plan.json")
    run = ok(teraio("run", "--plan", tmp_path / "plan.json", "--report", tmp_path / "r.json", "--", PYTHON, script,
                    cwd=tmp_path))
    plain = ok(subprocess.run([PYTHON, script], capture_output=True, text=True, cwd=tmp_path))
    losses = [line for line in run.stdout.splitlines() if line.startswith("loss")]
    return load_report(tmp_path / "r.json"), losses, plain.stdout.splitlines()


WRITES_AN_INPUT = """
import torch


class WritesAnInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 64))

    def forward(self, x):
        h = x @ self.w
        g = torch.sigmoid(h)         # released after its first use, replayed from h
        z = (g * 2).sum()
        h.add_(1.0)                  # writes h while g is out: g must be replayed before this
        return (g * h).sum() + z

"""


def _across_the_write(trace, t):
    """The use of t before the job's add_ and the one after it."""
    uses = sorted(set(int(k) for k in trace.uses(t)))
    write = next(k for k in range(int(trace.born[t]), trace.num_kernels) if trace.op_name(k).endswith("add_"))
    return max(k for k in uses if k < write), min(k for k in uses if k > write)


def test_an_op_that_writes_an_input_of_a_released_tensor_replays_it_first(tmp_path):
    report, losses, plain = run_one_replay(tmp_path, WRITES_AN_INPUT, "WritesAnInput", "sigmoid", _across_the_write)
    assert losses == plain
    assert report.iterations_on_plan >= 3
    assert report.prefetched_bytes["recompute"] == report.offloaded_bytes["recompute"] > 0
    assert report.stall_ms_by_cause.get("replay_before_write", 0) > 0


def test_the_planners_replays_train_identically_and_run_as_planned(work, tmp_path):
    """`teraio plan` chooses replays where the link is slow (0.05 GB/s here); the run makes
    every planned replay, moves none of those bytes, and trains bit for bit as without."""
    trace = load_trace(work / "trace.msgpack")
    plan_path = tmp_path / "plan.json"
    ok(teraio("plan", work / "trace.msgpack", "--gpu-mem", peak_bytes(trace) // 3, "--ssds", 0, "--host-mem",
              peak_bytes(trace), "--host-gbps", 0.05, "-o", plan_path, cwd=tmp_path))
    plan = load_plan(plan_path)
    replayed_bytes = plan.header.prediction.recompute_bytes_per_iteration
    assert replayed_bytes > 0
    _, report = run_example(work, tmp_path, plan_path)
    assert_twin(work, tmp_path)
    planned = [row for row in report.per_iteration if row.followed_plan]
    assert len(planned) >= 3 and all(row.replay_fallbacks == 0 for row in planned)
    replays = sum(entry.tier == "recompute" for entry in plan.entries)  # each replayed once per iteration here
    assert all(row.replays == replays and row.replay_ms > 0 for row in planned)
    assert all(row.replay_released_bytes >= replayed_bytes for row in planned)  # apart from the moves
    assert report.offloaded_bytes["recompute"] >= len(planned) * replayed_bytes
    assert report.written_bytes["recompute"] == 0


def test_without_clean_copies_replays_move_to_the_host_pool_and_say_so(work, tmp_path):
    """--no-clean-copies says the walk may miss writes: no replay is trusted, each recompute
    entry moves its bytes instead, said once, counted, and training stays exact."""
    trace = load_trace(work / "trace.msgpack")
    plan = as_recompute_plan(trace, every_period_plan(trace, budget_bytes=peak_bytes(trace) // 2))
    save_plan(plan, tmp_path / "plan.json")
    proc, report = run_example(work, tmp_path, tmp_path / "plan.json", "--no-clean-copies")
    assert_twin(work, tmp_path)
    assert proc.stderr.count("recompute entries move to the host pool") == 1
    assert report.offloaded_bytes["recompute"] == 0
    assert sum(row.replay_fallbacks for row in report.per_iteration) >= 3 * sum(
        e.tier == "recompute" for e in plan.entries)
    assert "recompute entries moved to the host pool instead" in proc.stderr


DRAWS_RANDOM_NUMBERS = """
import torch


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 64) / 8)

    def forward(self, x):
        h = x @ self.w
        r = torch.sigmoid(h)      # kept for sigmoid's backward: alive when n would be replayed
        n = torch.poisson(r)      # random: a replay draws other numbers and moves the generator on
        return ((h * n) + r).square().mean()   # n is saved for mul's backward: idle until then

"""


def _first_and_last_use(trace, t):
    uses = sorted(set(int(k) for k in trace.uses(t)) - {int(trace.born[t])})
    return uses[0], uses[-1]


def test_a_plan_that_replays_a_random_op_moves_it_to_the_host_pool_instead(tmp_path):
    """`teraio plan` once chose to replay torch.poisson's output here (0.05 GB/s, half the peak):
    the replay drew other numbers and the losses parted from the plain run's at the fourth step.
    Whatever a plan says, an op that draws random numbers is not replayed."""
    report, losses, plain = run_one_replay(tmp_path, DRAWS_RANDOM_NUMBERS, "Noisy", "poisson", _first_and_last_use)
    assert losses == plain
    planned = [row for row in report.per_iteration if row.followed_plan]
    assert len(planned) >= 3 and all(row.replay_fallbacks == 1 for row in planned)
    assert report.prefetched_bytes["recompute"] == 0 and report.offloaded_bytes["host"] > 0
