"""Stopping a job under `teraio run`: what docker stop, slurm, an ssh hangup and Ctrl-C send.

The signal goes to the `teraio` process (as a supervisor sends it); the job must end with it,
teraio must exit as a shell reports the job's end (128 + N), and the job's report and swap
folders must be handled. All through the real CLI on a small model that trains until stopped.
"""

import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from teraio.formats.plan import save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import CPU_ENV, PYTHON, ok, teraio
from runtime_helpers import every_period_plan

# Trains until stopped, 50 ms a step after step 3, when it writes its pid to READY; with
# --kill-self it kills itself with SIGKILL there instead (an OOM killer's end). With
# --graceful it starts a worker process (as a DataLoader does) that notes a SIGTERM in
# READY.worker, and after step 1 chains the SIGTERM handler it finds behind one that ends
# training at the step's end, as PyTorch Lightning's trainer does.
SCRIPT = """
import os, signal, subprocess, sys, time
from pathlib import Path
import torch
torch.manual_seed(0)
steps, ready = int(sys.argv[1]), sys.argv[2]
graceful = "--graceful" in sys.argv
if graceful:
    worker = subprocess.Popen([sys.executable, "-c", "import pathlib, signal, sys, time\\n"
        "signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path(sys.argv[1]).write_text('SIGTERM'), sys.exit(0)))\\n"
        "time.sleep(600)", ready + ".worker"])
stop = []
def chain_handler():
    previous = signal.getsignal(signal.SIGTERM)
    def on_sigterm(number, frame):
        stop.append(number)
        if callable(previous):
            previous(number, frame)
    signal.signal(signal.SIGTERM, on_sigterm)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(32, 64)
for step in range(steps):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    if step == 1 and graceful:
        chain_handler()
    if step == 3 and "--kill-self" in sys.argv:
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 3:
        Path(ready).write_text(str(os.getpid()))
    if stop:
        print("training stopped gracefully")
        break
    if step >= 3:
        time.sleep(0.05)
if graceful:
    worker.kill()
    worker.wait()
"""
START_TIMEOUT_S = 180
STOP_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The script and a plan that keeps swap files on the SSD tier at every step."""
    tmp = tmp_path_factory.mktemp("launch")
    (tmp / "train.py").write_text(SCRIPT)
    ok(teraio("profile", "-o", tmp / "t.msgpack", "--", PYTHON, tmp / "train.py", 8, tmp / "unused", cwd=tmp))
    trace = load_trace(tmp / "t.msgpack")
    plan = every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2)
    assert any(e.tier == "ssd" for e in plan.entries)
    save_plan(plan, tmp / "plan.json")
    return tmp


def run_args(job, tmp_path, *script_args) -> list[str]:
    return [sys.executable, "-m", "teraio", "run", "--plan", str(job / "plan.json"), "--ssd-dir",
            str(tmp_path / "ssd"), "--report", str(tmp_path / "run.json"), "--", PYTHON,
            str(job / "train.py"), "100000", str(tmp_path / "ready"), *script_args]


def wait_until_training(tmp_path, alive) -> int:
    """The job's pid, once it has trained a few planned steps."""
    ready, deadline = tmp_path / "ready", time.monotonic() + START_TIMEOUT_S
    while not ready.exists() or not ready.read_text():
        assert alive(), "teraio run ended before the job was training"
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.1)
    return int(ready.read_text())


def stopped(pid: int) -> bool:
    """Gone, or a zombie: a job orphaned by its wrapper exits to init, which may reap it a
    moment after teraio saw it end (a busy 2-core box, once); either way it trains no more."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return True
    return state == "Z"


def assert_stopped_cleanly(tmp_path, job_pid: int) -> None:
    assert stopped(job_pid)  # teraio waited for its job: nothing trains on
    assert list((tmp_path / "ssd").iterdir()) == []  # the job's swap folder is gone
    assert load_report(tmp_path / "run.json").iterations >= 4


def signal_teraio(command: list[str], tmp_path, signum: int) -> tuple[int, int, str]:
    """Start `teraio run` as a supervisor does, signal it once the job trains: (teraio's exit
    status, the job's pid, what it printed)."""
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen(command, env=dict(os.environ, **CPU_ENV), stdout=out, stderr=subprocess.STDOUT)
        try:
            job_pid = wait_until_training(tmp_path, lambda: proc.poll() is None)
            proc.send_signal(signum)
            status = proc.wait(timeout=STOP_TIMEOUT_S)
        finally:
            proc.kill()
            _kill_job(tmp_path)
    return status, job_pid, (tmp_path / "out.txt").read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_teraio_stops_the_job_which_writes_its_report(job, tmp_path, signum):
    status, job_pid, output = signal_teraio(run_args(job, tmp_path), tmp_path, signum)
    assert status == 128 + signum, output
    assert_stopped_cleanly(tmp_path, job_pid)


def test_sigterm_reaches_the_jobs_own_handler_and_not_its_workers_as_in_a_plain_run(job, tmp_path):
    """`kill PID` (docker stop, Kubernetes) signals the one process: a job that chains the
    handler it finds behind its own (PyTorch Lightning) stops gracefully and exits 0 as it does
    plainly, and its DataLoader-like worker never sees the signal."""
    status, job_pid, output = signal_teraio(run_args(job, tmp_path, "--graceful"), tmp_path, signal.SIGTERM)
    assert status == 0 and "training stopped gracefully" in output, output
    assert not (tmp_path / "ready.worker").exists()  # the worker was not signalled
    assert_stopped_cleanly(tmp_path, job_pid)


def test_sigterm_also_stops_what_a_shell_wrapper_leaves_behind(job, tmp_path):
    """A shell does not pass SIGTERM on to the command it waits for: the job's python, left
    behind when the wrapper ends, gets it from teraio then, writes its report and is waited for."""
    args = run_args(job, tmp_path)
    script = " ".join(args[args.index("--") + 1:])
    command = [*args[:args.index("--") + 1], "sh", "-c", f"{script}; true"]  # a compound: sh stays
    status, job_pid, output = signal_teraio(command, tmp_path, signal.SIGTERM)
    assert status == 128 + signal.SIGTERM, output
    assert_stopped_cleanly(tmp_path, job_pid)


def test_a_run_given_no_ssd_dir_leaves_no_folder_in_the_temp_dir(job, tmp_path):
    """The default swap folder (teraio-swap in the temp dir) is made by the run: an empty one
    left behind after every job is litter the user never asked for."""
    temp = tmp_path / "temp"
    temp.mkdir()
    env = dict(os.environ, **CPU_ENV, TMPDIR=str(temp))
    args = [sys.executable, "-m", "teraio", "run", "--plan", str(job / "plan.json"), "--report",
            str(tmp_path / "run.json"), "--", PYTHON, str(job / "train.py"), "6", str(tmp_path / "ready")]
    ok(subprocess.run(args, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S))
    assert load_report(tmp_path / "run.json").offloaded_bytes["ssd"] > 0   # it did swap there
    assert not (temp / "teraio-swap").exists()   # (torch itself leaves its torchinductor_USER there)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_a_profile_under_a_cap_leaves_no_swap_folder(job, tmp_path, signum):
    """`teraio profile --gpu-mem` evicts to swap files as `teraio run` does; stopped by a
    supervisor, its job left its swap folder behind (the signal killed it past atexit)."""
    cap = int(live_bytes_per_kernel(load_trace(job / "t.msgpack")).max()) // 2
    command = [sys.executable, "-m", "teraio", "profile", "--run-to-completion", "--gpu-mem", str(cap),
               "--ssd-dir", str(tmp_path / "ssd"), "-o", str(tmp_path / "capped.msgpack"), "--", PYTHON,
               str(job / "train.py"), "100000", str(tmp_path / "ready")]
    status, job_pid, output = signal_teraio(command, tmp_path, signum)
    assert status == 128 + signum and "profiling under a" in output, output
    assert stopped(job_pid)
    assert list((tmp_path / "ssd").iterdir()) == []


def test_ctrl_c_at_a_terminal_stops_the_job_once_and_exits_130(job, tmp_path):
    """The terminal sends SIGINT to its foreground process group: teraio's. The job, in a
    session of its own, gets it once, from teraio."""
    pid, master = pty.fork()
    if pid == 0:  # the child: teraio run as a shell starts it, on the terminal
        os.chdir(tmp_path)
        os.execvpe(sys.executable, run_args(job, tmp_path), dict(os.environ, **CPU_ENV))
    output = bytearray()
    reader = threading.Thread(target=_drain, args=(master, output), daemon=True)
    reader.start()  # a terminal nobody reads blocks the job's writes
    try:
        job_pid = wait_until_training(tmp_path, lambda: os.waitpid(pid, os.WNOHANG) == (0, 0))
        os.write(master, b"\x03")
        status = _wait_status(pid, STOP_TIMEOUT_S)
    finally:
        _kill_if_alive(pid)
        _kill_job(tmp_path)
    reader.join(timeout=10)
    assert status == 130, output.decode(errors="replace")
    assert output.count(b"KeyboardInterrupt") == 1  # one Ctrl-C, one interrupt in the job
    assert_stopped_cleanly(tmp_path, job_pid)


def test_a_job_killed_by_sigkill_makes_teraio_exit_137(job, tmp_path):
    """The job dies past its exit handlers: teraio removes its swap folder (it stayed until
    the next run on the same --ssd-dir), and keeps one of a run still alive."""
    alive = tmp_path / "ssd" / f"teraio-{os.getpid()}-r0"
    alive.mkdir(parents=True)
    proc = teraio(*run_args(job, tmp_path, "--kill-self")[3:], cwd=tmp_path, timeout=START_TIMEOUT_S)
    assert proc.returncode == 137, proc.stderr  # 128 + 9, as a shell says it (not 247)
    assert list((tmp_path / "ssd").iterdir()) == [alive]


def _drain(fd: int, sink: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the terminal's last user is gone
            return
        if not chunk:
            return
        sink.extend(chunk)


def _wait_status(pid: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.1)
    raise AssertionError(f"teraio run did not end within {timeout_s} s of Ctrl-C")


def _kill_job(tmp_path) -> None:
    """A job that outlived a failed test must not train on forever."""
    ready = tmp_path / "ready"
    if ready.exists() and ready.read_text():
        try:
            os.kill(int(ready.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _kill_if_alive(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def test_a_profile_under_a_cap_whose_job_is_killed_by_sigkill_leaves_no_swap_folder(job, tmp_path):
    """teraio/swap_dirs.py: the profile's launcher sweeps the swap folders of dead jobs as the
    run's does (it kept teraio-PID-r0 until a later run on the same folder)."""
    cap = int(live_bytes_per_kernel(load_trace(job / "t.msgpack")).max()) // 2
    proc = teraio("profile", "--run-to-completion", "--gpu-mem", cap, "--ssd-dir", tmp_path / "ssd",
                  "-o", tmp_path / "capped.msgpack", "--", PYTHON, job / "train.py", "100000",
                  tmp_path / "ready", "--kill-self", cwd=tmp_path, timeout=START_TIMEOUT_S)
    # a job that dies before its profile is complete is the script's error (exit 4), its code said
    assert proc.returncode == 4 and "exited with code 137" in proc.stderr, proc.stderr
    assert "profiling under a" in proc.stderr and (tmp_path / "ssd").is_dir() and list((tmp_path / "ssd").iterdir()) == []
