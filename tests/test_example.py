"""The bundled example is a plain PyTorch script: it runs on CPU, learns, is deterministic, and
runs under a two-rank torchrun (gloo)."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_gpt.py"
PACKAGED = ROOT / "teraio" / "examples" / "train_gpt.py"


def run(args, tmp_path, launcher=(sys.executable,)):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run([*launcher, str(SCRIPT), "--device", "cpu", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def losses_of(tmp_path, name, extra=(), launcher=(sys.executable,)):
    out = run(["--losses-out", name, *extra], tmp_path, launcher)
    return json.loads((tmp_path / name).read_text()), out


def test_defaults_finish_and_learn(tmp_path):
    losses, out = losses_of(tmp_path, "a.json")
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.2
    assert sum(losses[3:]) < sum(losses[:3])
    assert "step 6 loss" in out
    assert out.strip().splitlines()[-1].startswith("done steps 6 median_step_ms")


def test_same_seed_same_losses_bit_for_bit(tmp_path):
    a, _ = losses_of(tmp_path, "a.json")
    b, _ = losses_of(tmp_path, "b.json")
    c, _ = losses_of(tmp_path, "c.json", ["--seed", "1"])
    assert a == b
    assert a != c


def test_checkpoint_and_state_out(tmp_path):
    import torch

    run(["--steps", "3", "--accum", "2", "--checkpoint-at", "2", "--checkpoint-out", "ck.pt",
         "--state-out", "final.pt"], tmp_path)
    ck = torch.load(tmp_path / "ck.pt", weights_only=True)
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert ck["step"] == 2 and ck["optimizer"]["state"]
    assert "model.layers.1.mlp.up_proj.weight" in final and "lm_head.weight" in final
    assert not torch.equal(ck["model"]["lm_head.weight"], final["lm_head.weight"])


def test_example_does_not_import_teraio():
    source = PACKAGED.read_text() + SCRIPT.read_text()
    assert "import teraio" not in source and "from teraio" not in source


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_two_rank_torchrun_gloo(tmp_path):
    launcher = ("torchrun", "--standalone", "--nproc-per-node", "2")
    losses, out = losses_of(tmp_path, "ddp.json", ["--accum", "2"], launcher)
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert out.count("done steps 6") == 1  # only rank 0 reports
