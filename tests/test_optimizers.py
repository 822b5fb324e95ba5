"""torch.optim under plans: every optimizer class (SparseAdam: tests/clients/sparse_embedding.py),
foreach and fused steps, and LR schedulers that read the loss or change the rate every step,
each bit for bit like its plain run and within its budget.

A sweep by hand of each optimizer alone and of its options (SGD momentum, nesterov, weight
decay; Adam and AdamW amsgrad, maximize, foreach on and off, fused; NAdam and RAdam decoupled
weight decay; RMSprop centered with momentum; ASGD past t0; Adafactor; LBFGS with and without
strong Wolfe; tensor learning rates; param groups; bf16 and float64 models) trained bit for
bit under both plans. Kept here is a job per shape of loop: two loops that step six
optimizers, one per layer group, after each backward (an iteration of six steps, which the
profile took for one: its trace was one optimizer's step alone), which hold every other class
between them; AdamW's defaults with a param group per layer; LBFGS, whose step runs forward
and backward. Each job runs plainly and is profiled once (tests/clients/optimizers.py), is
planned at half its traced peak by `teraio plan` and by every idle period of every tensor
(runtime_helpers.every_period_plan), and runs under each plan: the losses and the final state
dicts (model, optimizers, schedulers) are the plain run's, and the peak is within the budget.
"""

import re

import pytest
import torch

from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import PYTHON, ok, one_line_error, teraio
from runtime_helpers import plan_at_half_peak
from test_clients import CLIENTS, run_plain, run_planned

SCRIPT = "optimizers.py"
JOBS = {
    # six optimizers in one loop: an iteration is six steps, of which only the first runs the
    # backward (profiled as one step an iteration, the trace was one optimizer's step alone)
    "six-foreach-fused": ("--opt", "sgd:momentum=0.9,nesterov=True,weight_decay=1e-4,foreach=True",
                          "--opt", "adamw:amsgrad=True,foreach=True",
                          "--opt", "nadam:decoupled_weight_decay=True,weight_decay=1e-2,foreach=True",
                          "--opt", "radam:foreach=True", "--opt", "adagrad:fused=True", "--opt", "adadelta",
                          "--sched", "plateau", "--sched", "onecycle", "--sched", "sequential", "--clip"),
    "six-single-tensor": ("--opt", "adamax", "--opt", "asgd", "--opt", "rmsprop:centered=True,momentum=0.9",
                          "--opt", "rprop", "--opt", "adafactor", "--opt", "adam:fused=True", "--keep-grads"),
    "adamw-groups": ("--opt", "adamw", "--groups"),   # the defaults (no foreach on the CPU), a group per layer
    "lbfgs": ("--opt", "lbfgs:max_iter=2,history_size=2", "--sched", "plateau"),
}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """Each job profiled once and run plainly once, on first use."""
    done = {}

    def get(job: str):
        if job not in done:
            work = tmp_path_factory.mktemp(job)
            ok(teraio("profile", "-o", work / "t.msgpack", "--", PYTHON, CLIENTS / SCRIPT, *JOBS[job],
                      "--out", "profiled.pt", cwd=work))
            run_plain(work, SCRIPT, *JOBS[job], "--out", "plain.pt")
            done[job] = work
        return done[job]
    return get


def _plan(trace_path, planner: str, job: str, work) -> tuple:
    """The plan for half the traced peak and its budget. LBFGS keeps tensors alive over stretches
    too short to move anything (its line search's): at half its peak `teraio plan --require-fit`
    says so and names the least budget of a plan that fits, and that plan is followed instead."""
    if job != "lbfgs" or planner == "every-period":
        return plan_at_half_peak(trace_path, planner, work)
    budget = int(live_bytes_per_kernel(load_trace(trace_path)).max()) // 2
    args = ("--ssds", 1, "--host-mem", budget // 2, "--require-fit", "-o", work / "plan.json")
    refused = one_line_error(teraio("plan", trace_path, "--gpu-mem", budget, *args, cwd=work), 5)
    budget = int(re.search(r"no plan fits below --gpu-mem (\d+)", refused)[1])
    ok(teraio("plan", trace_path, "--gpu-mem", budget, *args, cwd=work))
    return work / "plan.json", budget


def assert_same(mine, theirs, where: str = "") -> None:
    """Bit for bit: tensors by dtype, shape and value; containers by keys and items."""
    if isinstance(theirs, torch.Tensor):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs), where
    elif isinstance(theirs, dict):
        assert mine.keys() == theirs.keys(), where
        for key in theirs:
            assert_same(mine[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, (list, tuple)):
        assert len(mine) == len(theirs), where
        for i, (a, b) in enumerate(zip(mine, theirs)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert mine == theirs, where


@pytest.mark.parametrize("planner", ["teraio-plan", "every-period"])
@pytest.mark.parametrize("job", list(JOBS))
def test_optimizers_train_bit_for_bit_under_plans_within_budget(profiled, tmp_path, job, planner):
    work = profiled(job)
    trace = load_trace(work / "t.msgpack")
    assert trace.header.steps_per_iteration == JOBS[job].count("--opt")
    plan, budget = _plan(work / "t.msgpack", planner, job, tmp_path)
    _, report = run_planned(tmp_path, plan, SCRIPT, *JOBS[job], "--out", "run.pt")
    assert_same(torch.load(tmp_path / "run.pt", weights_only=False), torch.load(work / "plain.pt", weights_only=False))
    assert report.peak_device_bytes <= report.budget_bytes == budget
    assert sum(report.offloaded_bytes.values()) > 0
    assert report.plan_fits   # LBFGS's history (lists in its state, kind other) moves too
    # LBFGS's ops vary from step to step (its line search, its history filling): the plan
    # pauses where they leave the traced ones; the loops of six follow it after the first
    assert report.iterations_on_plan >= (2 if job == "lbfgs" else len(report.per_iteration) - 2)
