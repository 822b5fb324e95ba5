"""Running the real `teraio` CLI and the bundled example in subprocesses, on CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "teraio" / "examples" / "train_gpt.py"
CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
PYTHON = sys.executable   # the interpreter running the tests starts every job (not whatever `python` is on PATH)


def teraio(*args, cwd, timeout=300, preexec_fn=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **CPU_ENV)
    return subprocess.run([sys.executable, "-m", "teraio", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn)


def example(*args, cwd, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, **CPU_ENV)
    return subprocess.run([sys.executable, str(EXAMPLE), "--device", "cpu", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def one_line_error(proc: subprocess.CompletedProcess, code: int) -> str:
    """A user mistake: the given exit code, our one line last on stderr, no traceback of ours."""
    assert proc.returncode == code, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("teraio:"), proc.stderr
    assert "teraio/" not in proc.stderr.split("Traceback")[-1] or "Traceback" not in proc.stderr
    return last


def losses(path: Path) -> list[float]:
    return json.loads(Path(path).read_text())
