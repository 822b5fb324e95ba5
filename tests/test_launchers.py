"""The agent starts only in processes that train (Note [Lazy start] in teraio/app/bootstrap), and
torch.compile under TeraIO is said, counted, and refused with --strict.

Through the real CLI on CPU: accelerate's launcher (which runs torchrun's inside its own
process), a shell script that asks torch for its version before training, a compiled model.
"""

import re
import subprocess
import textwrap

import pytest

from teraio.formats.plan import save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import EXAMPLE, PYTHON, losses, ok, one_line_error, teraio
from runtime_helpers import every_period_plan
from test_clients import CLIENTS, run_plain

ARGS = ("--device", "cpu", "--steps", "6")
FOLLOWS = re.compile(r"^teraio: rank (\d+) follows ", re.MULTILINE)

COMPILED_SCRIPT = textwrap.dedent("""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    model = torch.compile(model)
    loss_fn = torch.compile(lambda out: out.pow(2).mean())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(6):
        loss = loss_fn(model(torch.randn(32, 64)))
        loss.backward()
        opt.step()
        opt.zero_grad()
""")


def half_peak_plans(trace_paths, out_dir):
    for path in trace_paths:
        trace = load_trace(path)
        name = path.name.replace("t.", "plan.").replace(".msgpack", ".json")
        save_plan(every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2), out_dir / name)


@pytest.fixture(scope="module")
def example_plan(tmp_path_factory):
    """A plan for the example run alone, at half its peak."""
    tmp = tmp_path_factory.mktemp("launchers")
    ok(teraio("profile", "-o", tmp / "t.msgpack", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp))
    half_peak_plans([tmp / "t.msgpack"], tmp)
    return tmp / "plan.json"


def test_accelerate_launch_starts_one_agent_per_rank_and_none_in_the_launcher(tmp_path):
    """accelerate's launcher imports torch (and runs torchrun's launcher in its own process):
    an agent there read the rank-less plan.json and, with --strict, stopped the job."""
    # `accelerate-launch` is `accelerate launch` (accelerate/commands/launch.py) without the
    # `accelerate` command's import of every subcommand: its estimate imports timm wherever timm
    # is installed, and a timm without torchvision stopped the launch before it began on CI
    launch = ("accelerate-launch", "--multi_gpu", "--num_processes", 2, "--num_machines", 1,
              "--mixed_precision", "no", "--dynamo_backend", "no", EXAMPLE, *ARGS)
    ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", *launch, cwd=tmp_path))
    half_peak_plans([tmp_path / "t.rank0.msgpack", tmp_path / "t.rank1.msgpack"], tmp_path)
    proc = ok(teraio("run", "--plan", tmp_path / "plan.json", "--strict", "--report", tmp_path / "run.json",
                     "--ssd-dir", tmp_path / "ssd", "--", *launch, "--losses-out", tmp_path / "l.json",
                     cwd=tmp_path))
    assert sorted(FOLLOWS.findall(proc.stderr)) == ["0", "1"], proc.stderr
    assert len(losses(tmp_path / "l.json")) == 6
    for rank in (0, 1):
        assert load_report(tmp_path / f"run.rank{rank}.json").iterations_on_plan >= 1


def test_a_shell_script_and_a_torch_import_without_ops_start_no_agent(example_plan, tmp_path):
    """A launch script that asks torch for its version before it trains: that process runs
    no op, so it gets no agent (no line, no host pool, no report of its own)."""
    ok(teraio("run", "--plan", example_plan, "--report", tmp_path / "alone.json", "--ssd-dir", tmp_path / "ssd",
              "--", PYTHON, "-c", "import torch; print(torch.__version__)", cwd=tmp_path))
    assert not (tmp_path / "alone.json").exists()
    script = (f'python -c "import torch; print(torch.__version__)" && '
              f'python {EXAMPLE} {" ".join(ARGS)} --losses-out {tmp_path / "l.json"}')
    proc = ok(teraio("run", "--plan", example_plan, "--ssd-dir", tmp_path / "ssd", "--", "bash", "-c", script,
                     cwd=tmp_path))
    assert FOLLOWS.findall(proc.stderr) == ["0"], proc.stderr
    assert proc.stderr.count("teraio: rank") == 1 and len(losses(tmp_path / "l.json")) == 6


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The compiled script, profiled: the profile says it once too."""
    tmp = tmp_path_factory.mktemp("compiled")
    (tmp / "train.py").write_text(COMPILED_SCRIPT)
    proc = ok(teraio("profile", "-o", tmp / "t.msgpack", "--", PYTHON, tmp / "train.py", cwd=tmp))
    half_peak_plans([tmp / "t.msgpack"], tmp)
    return tmp, proc


def test_torch_compile_is_said_once_and_counted(compiled, tmp_path):
    tmp, profiled = compiled
    proc = ok(teraio("run", "--plan", tmp / "plan.json", "--report", tmp_path / "run.json", "--ssd-dir",
                     tmp_path / "ssd", "--", PYTHON, tmp / "train.py", cwd=tmp_path))
    for out in (profiled.stderr, proc.stderr):
        said = [line for line in out.splitlines() if "runs eager under TeraIO" in line]
        assert len(said) == 1, out
        assert "torch.compile(Sequential)" in said[0] and "TorchDispatchMode" in said[0]
        assert "eager numerics" in said[0]
        # PyTorch's warnings about TeraIO's own hooks and frame switch are not the user's to read
        assert "global hooks on modules" not in out and "set_eval_frame" not in out, out
    assert load_report(tmp_path / "run.json").compiled_regions == 2
    assert "torch.compile: 2 compiled region(s) ran eager" in " ".join(proc.stderr.split())   # the summary says so


def test_torch_compile_fails_the_job_with_strict(compiled, tmp_path):
    tmp, _ = compiled
    proc = teraio("run", "--plan", tmp / "plan.json", "--strict", "--ssd-dir", tmp_path / "ssd", "--",
                  PYTHON, tmp / "train.py", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "runs eager under TeraIO" in line]
    assert len(said) == 1 and "torch.compile(Sequential)" in said[0] and "stopping the job (--strict)" in said[0]


@pytest.mark.parametrize("argv0, launcher", [
    ("/usr/bin/torchrun", True),
    ("/venv/lib/python3.11/site-packages/torch/distributed/run.py", True),   # python -m torch.distributed.run
    ("/venv/bin/accelerate", True),
    ("/venv/lib/python3.11/site-packages/accelerate/commands/launch.py", True),
    ("/venv/bin/deepspeed", True),
    ("/venv/lib/python3.11/site-packages/deepspeed/launcher/launch.py", True),  # deepspeed's per-node launcher
    ("train.py", False),
    ("/home/me/accelerate_train.py", False),
])
def test_launchers_are_known_by_name(argv0, launcher):
    """A launcher's own ops run on the CPU, the device of a CPU run: laziness alone would not
    keep an agent out of it there."""
    from teraio.app.bootstrap import is_launcher_process

    assert is_launcher_process(argv0) is launcher


NO_MODULE_SCRIPT = textwrap.dedent("""
    import torch

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 64))
    opt = torch.optim.SGD([w], lr=0.1)
    for step in range(8):
        loss = (torch.randn(32, 64) @ w).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"loss {loss.item():.10f}")
""")


def test_a_loop_without_modules_trains_under_teraio_as_without(tmp_path):
    """The start's trigger steps aside at the first optimizer step when no module call came
    before: removing its hook there failed the step ("OrderedDict mutated during iteration")."""
    script = tmp_path / "no_module.py"
    script.write_text(NO_MODULE_SCRIPT)
    plain = ok(subprocess.run([PYTHON, script], capture_output=True, text=True, cwd=tmp_path)).stdout
    profiled = ok(teraio("profile", "-o", tmp_path / "t.msgpack", "--", PYTHON, script, cwd=tmp_path)).stdout
    seen = [line for line in profiled.splitlines() if line.startswith("loss")]  # it stops once profiled
    assert len(seen) >= 4 and seen == plain.splitlines()[:len(seen)]
    assert load_trace(tmp_path / "t.msgpack").header.num_kernels > 0


def test_ranks_started_by_torch_multiprocessing_spawn_profile_and_follow_their_own_plans(tmp_path):
    """Note [Ranks without torchrun] in teraio/app/bootstrap/__init__.py: mp.spawn hands each
    worker its rank, not the environment: both took themselves for rank 0 of 1, wrote one trace
    and one report over each other and followed rank 0's plan. A profile ends the ranks once
    their traces are written, and the caller, reading what they would have written, failed:
    said with the option that keeps them training."""
    script = (PYTHON, CLIENTS / "spawn_ddp.py", "--out", "l.json")
    proc = teraio("profile", "-o", tmp_path / "t.msgpack", "--", *script, cwd=tmp_path)
    assert "profiles with --run-to-completion" in one_line_error(proc, 4)
    ok(teraio("profile", "--run-to-completion", "-o", tmp_path / "t.msgpack", "--", *script, cwd=tmp_path))
    traces = [tmp_path / f"t.rank{rank}.msgpack" for rank in (0, 1)]
    assert [load_trace(path).header.rank for path in traces] == [0, 1]
    half_peak_plans(traces, tmp_path)
    plain = tmp_path / "plain"
    plain.mkdir()
    run_plain(plain, "spawn_ddp.py", "--out", "l.json")
    proc = ok(teraio("run", "--plan", tmp_path / "plan.json", "--strict", "--report", tmp_path / "run.json",
                     "--ssd-dir", tmp_path / "ssd", "--", *script, cwd=tmp_path))
    assert sorted(FOLLOWS.findall(proc.stderr)) == ["0", "1"], proc.stderr
    assert losses(tmp_path / "l.json") == losses(plain / "l.json")
    for rank in (0, 1):
        assert load_report(tmp_path / f"run.rank{rank}.json").iterations_on_plan >= 1
