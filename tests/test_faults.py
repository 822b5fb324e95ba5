"""Faults a long run meets: a full disk, a swap folder removed before or while the job runs.

All through the real CLI on the bundled example (CPU, swap files through the POSIX backend).
A full disk or a folder that vanished before its first write must cost the run nothing but
speed: the same losses as a plain run, the budget held, one line that says what happened.
A swap file that vanished holds bytes that exist nowhere else: the job stops with one line
naming the tensor and the file, a non-zero status and a report that counts it.
"""

import shutil
import subprocess
import uuid

import pytest
import torch

from teraio.formats.plan import save_plan
from teraio.formats.report import load_report
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import EXAMPLE, PYTHON, example, losses, ok, teraio
from runtime_helpers import every_period_plan

ARGS = ("--device", "cpu", "--steps", "7", "--accum", "2", "--clip", "0.5")

# Runs the example, removing the swap folders of this run (what `rm -rf DIR/*` does to a
# running job) right after the given optimizer step (0: as the first forward begins), or with
# --fill filling their disk then (another process writing to the same drive: preflight found
# room, the run loses it). The agent starts at the job's first op, so the folders exist only
# from then on. With --swallow the script catches every error and ends as if all went well.
DRIVER = """
import glob, os, runpy, shutil, sys
import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook

ssd, at, swallow, fill = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "--swallow", sys.argv[3] == "--fill"

def fill_the_disk():
    with open(os.path.join(ssd, "filler"), "wb") as f:
        f.write(bytes(shutil.disk_usage(ssd).free - (256 << 10)))

def remove_swap_folders():
    for folder in glob.glob(os.path.join(ssd, "teraio-*")):
        while os.path.exists(folder):  # I/O threads may add a file while it goes
            shutil.rmtree(folder, ignore_errors=True)

steps = [0]
def after_step(optimizer, args, kwargs):
    steps[0] += 1
    if steps[0] == at:
        fill_the_disk() if fill else remove_swap_folders()

removed = [False]
def at_the_first_forward(module, args):
    if not removed[0]:
        removed[0] = True
        remove_swap_folders()

register_optimizer_step_post_hook(after_step)
if at == 0:
    register_module_forward_pre_hook(at_the_first_forward)
sys.argv = sys.argv[4:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except Exception:
    if not swallow:
        raise
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A profile, an SSD-only plan at half the peak, and a plain run of the example."""
    tmp = tmp_path_factory.mktemp("faults")
    ok(teraio("profile", "-o", tmp / "trace.msgpack", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp))
    trace = load_trace(tmp / "trace.msgpack")
    # every offload goes to the disk; the host pool (sized from the plan) could take them all
    save_plan(every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2, tiers=("ssd",)),
              tmp / "plan.json")
    ok(example(*ARGS[2:], "--losses-out", tmp / "plain.json", "--state-out", tmp / "plain.pt", cwd=tmp))
    (tmp / "driver.py").write_text(DRIVER)
    return tmp


def run_example(work, tmp_path, ssd_dir, remove_at=None, swallow=False, fill_at=None):
    """teraio run of the example (through the driver when swap folders are to be removed or
    their disk filled)."""
    script = [PYTHON, EXAMPLE]
    if remove_at is not None:
        script = [PYTHON, work / "driver.py", ssd_dir, remove_at, "--swallow" if swallow else "-", EXAMPLE]
    if fill_at is not None:
        script = [PYTHON, work / "driver.py", ssd_dir, fill_at, "--fill", EXAMPLE]
    report = tmp_path / "run.json"
    proc = teraio("run", "--plan", work / "plan.json", "--ssd-dir", ssd_dir, "--report", report, "--", *script,
                  *ARGS, "--losses-out", tmp_path / "losses.json", "--state-out", tmp_path / "state.pt",
                  cwd=tmp_path)
    return proc, (load_report(report) if report.exists() else None)


def assert_survived(work, tmp_path, proc, report):
    """Trained exactly like the plain run, within the budget, and no advice to re-plan."""
    ok(proc)
    assert losses(tmp_path / "losses.json") == losses(work / "plain.json")
    mine, plain = torch.load(tmp_path / "state.pt"), torch.load(work / "plain.pt")
    assert mine.keys() == plain.keys() and all(torch.equal(mine[k], plain[k]) for k in mine)
    assert report.peak_device_bytes <= report.budget_bytes
    assert "re-profile" not in proc.stderr and report.guard_trips == 0
    assert report.iterations_on_plan >= 3  # the plan was still followed, its offloads in the host pool
    assert report.ssd_to_host_bytes > 0 and report.offloaded_bytes["host"] > 0


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 MiB tmpfs: room enough for the plan at the start (preflight checks it)."""
    folder = tmp_path / f"tiny-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here to make a small tmpfs")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root or CAP_SYS_ADMIN): {made.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_disk_that_fills_up_is_said_once_and_the_run_goes_on_in_the_host_pool(work, tmp_path, tiny_disk):
    proc, report = run_example(work, tmp_path, tiny_disk, fill_at=1)  # before the first planned iteration
    assert_survived(work, tmp_path, proc, report)
    assert proc.stderr.count(f"teraio: warning: disk full on {tiny_disk}") == 1
    assert [reason for reason in report.closed_swap_dirs.values()] == [f"disk full on {tiny_disk}"]
    assert report.io_errors >= 1 and not report.lost_tensors  # failed writes: nothing was lost


def test_a_swap_folder_removed_before_the_first_write_is_said_once_and_closed(work, tmp_path):
    ssd = tmp_path / "ssd"
    # iteration 0 follows the plan from its second forward kernels on: the folder goes before that
    proc, report = run_example(work, tmp_path, ssd, remove_at=0)
    assert_survived(work, tmp_path, proc, report)
    assert report.offloaded_bytes["ssd"] == 0  # the folder was gone before its first write
    (folder, reason), = report.closed_swap_dirs.items()
    assert folder.startswith(str(ssd / "teraio-")) and reason == f"the swap folder {folder} is gone"
    assert proc.stderr.count(f"teraio: warning: {reason}") == 1


@pytest.mark.parametrize("swallow", [False, True], ids=["uncaught", "caught-by-the-script"])
def test_a_swap_file_that_vanished_stops_the_job_with_one_line_and_a_report(work, tmp_path, swallow):
    ssd = tmp_path / "ssd"
    proc, report = run_example(work, tmp_path, ssd, remove_at=3, swallow=swallow)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("teraio: error:")]
    assert len(errors) == (0 if swallow else 1)  # caught: the script chose to say nothing
    (tensor, failure), = report.lost_tensors.items()
    assert failure.startswith(str(ssd / "teraio-")) and ".bin" in failure
    if errors:
        assert f"the bytes of {tensor} are lost" in errors[0] and failure in errors[0]
    assert report.io_errors >= 1 and report.iterations == 3  # stopped in the first iteration that needed it
    assert not list(ssd.iterdir())  # the swap folder is cleaned up all the same


STOPPED_IN_A_THREAD = """
import threading
from teraio_run.replay import ReplayMismatch
from teraio_run.stops import stop

def backward():  # autograd re-raises in the caller; a job's own thread may not
    raise stop(ReplayMismatch("replaying aten.mm.default made 8 bytes for t1, which has 16"))

thread = threading.Thread(target=backward)
thread.start(); thread.join()
try:
    backward()
except Exception as err:
    raise RuntimeError("the script's own wrapper") from err
"""


def test_a_replay_that_would_not_be_exact_stops_the_job_with_one_line():
    """A ReplayMismatch is said like a lost swap file: one line, in any thread, no traceback."""
    proc = subprocess.run([PYTHON, "-c", STOPPED_IN_A_THREAD], capture_output=True, text=True)
    line = "teraio: error: replaying aten.mm.default made 8 bytes for t1, which has 16\n"
    assert (proc.returncode, proc.stderr) == (1, line * 2)
