"""Iterations that are not one optimizer step: loops that step several optimizers, a checkpoint
saved inside a profiled iteration, and scripts that never step. Through the real CLI on CPU."""

import os
import subprocess
import sys
import time

import msgpack
import pytest

from teraio.formats.plan import load_plan
from teraio.formats.report import load_report
from teraio.formats.trace import Phase, live_bytes_per_kernel, load_trace
from teraio_profile.recorder import cycle_length
from cli_helpers import CPU_ENV, PYTHON, ROOT, losses, ok, one_line_error, teraio

TRAIN = '''
import argparse, json, torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--save-at", type=int, default=-1, help="the loop that saves a checkpoint mid-iteration")
parser.add_argument("--one-optimizer", action="store_true")
parser.add_argument("--losses-out", default="")
args = parser.parse_args()

torch.manual_seed(0)
body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU())
head = torch.nn.Linear(256, 8)
model = torch.nn.Sequential(body, head)
if args.one_optimizer:
    optimizers = [torch.optim.AdamW(model.parameters(), lr=1e-3)]
else:  # the body and the head learn at their own rates, each with its own optimizer
    optimizers = [torch.optim.AdamW(body.parameters(), lr=1e-3), torch.optim.AdamW(head.parameters(), lr=1e-2)]
data = [(torch.randn(32, 64), torch.randint(0, 8, (32,))) for _ in range(4)]
losses = []
for step in range(args.steps):
    x, y = data[step % len(data)]
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if step == args.save_at:
        torch.save(model.state_dict(), "checkpoint.pt")
    for optimizer in optimizers:
        optimizer.step()
    for optimizer in optimizers:
        optimizer.zero_grad()
    losses.append(loss.item())
if args.losses_out:
    with open(args.losses_out, "w") as f:
        json.dump(losses, f)
'''

FORWARD_ONLY = '''
import time, torch

model = torch.nn.Linear(32, 32)
started = time.monotonic()
while time.monotonic() - started < 240:  # evaluates forever (bounded for the test): never a step
    model(torch.randn(8, 32)).sum()
    time.sleep(0.01)
'''


def python(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=dict(os.environ, **CPU_ENV),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """The two-optimizer script profiled once and run plainly once."""
    tmp = tmp_path_factory.mktemp("two_optimizers")
    (tmp / "train.py").write_text(TRAIN)
    ok(teraio("profile", "-o", tmp / "trace.msgpack", "--", PYTHON, "train.py", "--steps", 10, cwd=tmp))
    ok(python("train.py", "--steps", 6, "--losses-out", tmp / "plain.json", cwd=tmp))
    return tmp


def test_two_optimizers_stepped_each_loop_are_one_iteration_and_the_plan_is_followed(two, tmp_path):
    trace = load_trace(two / "trace.msgpack")
    assert trace.header.steps_per_iteration == 2
    # the whole loop: forward, backward and both optimizers' steps
    phases = set(trace.kernel_phase.tolist())
    assert {int(Phase.forward), int(Phase.backward), int(Phase.optimizer)} <= phases
    assert {"0.0.weight:exp_avg", "1.weight:exp_avg"} <= set(trace.tensor_id)
    budget = int(live_bytes_per_kernel(trace).max()) // 2
    ok(teraio("plan", two / "trace.msgpack", "--gpu-mem", budget, "--ssds", 1, "--host-mem", budget,
              "-o", tmp_path / "plan.json", cwd=tmp_path))
    ok(teraio("run", "--plan", tmp_path / "plan.json", "--ssd-dir", tmp_path / "ssd", "--report",
              tmp_path / "run.json", "--", PYTHON, two / "train.py", "--steps", 6, "--losses-out",
              tmp_path / "losses.json", cwd=tmp_path))
    report = load_report(tmp_path / "run.json")
    assert report.iterations == 6  # one per loop of two steps
    assert report.iterations_on_plan >= 2
    assert report.peak_device_bytes <= report.budget_bytes == budget
    assert losses(tmp_path / "losses.json") == losses(two / "plain.json")


def test_steps_per_iteration_by_hand(two, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    ok(teraio("profile", "--steps-per-iteration", 2, "-o", tmp_path / "t.msgpack", "--", PYTHON, "train.py",
              "--steps", 10, cwd=tmp_path))
    by_hand, found = load_trace(tmp_path / "t.msgpack"), load_trace(two / "trace.msgpack")
    assert by_hand.header.steps_per_iteration == 2
    assert (by_hand.header.op_digest, by_hand.num_kernels) == (found.header.op_digest, found.num_kernels)


def test_a_checkpoint_saved_in_the_profiled_iteration_does_not_become_the_trace(tmp_path):
    """Loop 3 is the first one the profiler records; it saves a checkpoint between backward and step."""
    (tmp_path / "train.py").write_text(TRAIN)
    for name, extra in (("plain", ()), ("saving", ("--save-at", 3))):
        ok(teraio("profile", "-o", tmp_path / f"{name}.msgpack", "--", PYTHON, "train.py", "--one-optimizer",
                  "--steps", 10, *extra, cwd=tmp_path))
    assert (tmp_path / "checkpoint.pt").exists()
    plain, saving = load_trace(tmp_path / "plain.msgpack"), load_trace(tmp_path / "saving.msgpack")
    assert saving.num_kernels == plain.num_kernels
    assert saving.header.op_digest == plain.header.op_digest


def test_a_script_that_never_steps_is_stopped_after_the_step_timeout(tmp_path):
    (tmp_path / "evaluate.py").write_text(FORWARD_ONLY)
    started = time.monotonic()
    proc = teraio("profile", "--step-timeout", 5, "--", PYTHON, "evaluate.py", cwd=tmp_path, timeout=400)
    elapsed_s = time.monotonic() - started
    line = one_line_error(proc, 4)
    assert "no optimizer step was seen in 5 s" in line and "teraio_step()" in line and "--step-timeout" in line
    assert elapsed_s < 120  # the script alone runs for 240 s
    assert not (tmp_path / "trace.msgpack").exists()


@pytest.mark.parametrize("steps, expected", [
    # one optimizer: AdamW's first step makes its state, then every step is alike
    ([("fwd", 40), ("fwd", 30), ("fwd", 30)], 1),
    # a body and a head optimizer: 703 and 8 ops, alternating
    ([("fwd", 710), ("opt", 12), ("fwd", 703), ("opt", 8), ("fwd", 703), ("opt", 8)], 2),
    # three optimizers, the last two alike: two steps in a row that only apply gradients are not a cycle
    ([("fwd", 710), ("opt", 12), ("opt", 12), ("fwd", 703), ("opt", 8), ("opt", 8),
      ("fwd", 703), ("opt", 8), ("opt", 8)], 3),
    # a loop marked with teraio_step() that never runs backward
    ([("eval", 5), ("eval", 5)], 1),
    # a mixture of experts routed by the data: op counts alternate by chance, structures do not repeat
    ([("fwd", 5033), ("fwd", 5040), ("fwd", 5033), ("fwd", 5040)], None),
])
def test_the_cycle_of_steps_is_found(steps, expected):
    ops = [n for _, n in steps]
    backward = [kind == "fwd" for kind, _ in steps]  # "fwd" steps run forward and backward
    # one structure per step kind and count, except the routed steps, each its own
    structures = [hash((kind, n)) if n < 5000 else i for i, (kind, n) in enumerate(steps)]
    assert cycle_length(ops, backward, 4, structures) == expected


def test_traces_and_plans_from_before_steps_per_iteration_still_load(tmp_path):
    """Files written before the field existed: one step per iteration, read as such."""
    raw = msgpack.unpackb((ROOT / "traces" / "cpu-tiny.msgpack").read_bytes())
    raw["header"].pop("steps_per_iteration", None)
    (tmp_path / "old.msgpack").write_bytes(msgpack.packb(raw))
    assert load_trace(tmp_path / "old.msgpack").header.steps_per_iteration == 1
    text = (ROOT / "tests" / "golden" / "cpu-tiny.ssd.plan.json").read_text()
    old = text.replace('"steady_from_iteration": 3,\n    "steps_per_iteration": 1', '"steady_from_iteration": 3')
    assert old != text
    (tmp_path / "old.plan.json").write_text(old)
    assert load_plan(tmp_path / "old.plan.json").header.trace.steps_per_iteration == 1
