"""Mistakes `teraio run`, `plan` and `profile` catch before anything starts or is written.

Each is one line and a non-zero exit, and the job never runs (its script would leave a
marker). Before these checks the job found out inside: one warning, exit 0, no report.
"""

import json
import os
import resource
import subprocess
from pathlib import Path

import pytest

from teraio.formats.plan import save_plan
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import PYTHON, ROOT, ok, one_line_error, teraio
from runtime_helpers import every_period_plan

TRACE = ROOT / "traces" / "cpu-tiny.msgpack"
STEPPING_SCRIPT = """
import torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(8):
    model(torch.randn(8, 64)).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture()
def job(tmp_path):
    """A plan with SSD and host entries for the committed CPU trace, and a script that only
    leaves a marker: any test that sees the marker launched a job it should have refused."""
    trace = load_trace(TRACE)
    plan = every_period_plan(trace, int(live_bytes_per_kernel(trace).max()) // 2)
    save_plan(plan, tmp_path / "plan.json")
    (tmp_path / "train.py").write_text("from pathlib import Path\nPath('ran').write_text('yes')\n")
    return tmp_path


def run_job(job, *options):
    return teraio("run", "--plan", job / "plan.json", *options, "--", PYTHON, job / "train.py", cwd=job)


def refused(proc, code: int, job) -> str:
    line = one_line_error(proc, code)
    assert not (job / "ran").exists(), "the job was launched"
    return line


@pytest.fixture()
def mounted(tmp_path):
    """mount(options) -> a fresh tmpfs folder; skips where mount is not allowed (not root)."""
    points = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(points)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        points.append(point)
        return point

    yield mount
    for point in points:
        subprocess.run(["umount", str(point)], check=False)


def test_read_only_ssd_dir(job, mounted):
    if os.geteuid() == 0:
        ssd = mounted("ro,size=1m") / "swap"  # root writes through chmod: take a read-only mount
    else:
        ssd = job / "ro"
        ssd.mkdir(mode=0o555)
    line = refused(run_job(job, "--ssd-dir", ssd), 2, job)
    assert "cannot be written" in line and str(ssd) in line


def test_ssd_dir_under_a_missing_folder_is_refused_not_made(job):
    """A mistyped path or an SSD not mounted: the swap files went to the root disk, unsaid."""
    line = refused(run_job(job, "--ssd-dir", job / "nvme9" / "tio"), 2, job)
    assert f"{job / 'nvme9'} does not exist" in line and "not mounted" in line
    assert not (job / "nvme9").exists()
    (job / "afile").write_text("")
    line = refused(run_job(job, "--ssd-dir", job / "afile" / "tio"), 2, job)
    assert "is a file" in line


def test_ssd_dir_without_room_for_the_plan(job, mounted):
    ssd = mounted("size=64k")
    line = refused(run_job(job, "--ssd-dir", ssd), 2, job)
    assert "64 KiB free" in line and "--ssd-dir" in line
    assert list(ssd.iterdir()) == []


def test_host_pool_larger_than_the_memory_available(job):
    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo")
    plan = json.loads((job / "plan.json").read_text())
    plan["header"]["inputs"]["host_mem_bytes"] = 1 << 50  # 1 PiB
    (job / "plan.json").write_text(json.dumps(plan))
    line = refused(run_job(job), 2, job)
    assert "host pool" in line and "--host-mem" in line


@pytest.mark.parametrize("field, value, said", [
    ("nbytes", -4096, "nbytes"),
    ("offload_after", -1, "offload_after"),
    ("needed_by", 10**9, "past the trace's last kernel"),
])
def test_hand_edited_plan_with_impossible_values(job, field, value, said):
    plan = json.loads((job / "plan.json").read_text())
    plan["entries"][1][field] = value
    (job / "plan.json").write_text(json.dumps(plan))
    line = refused(run_job(job), 3, job)
    assert said in line and "entries" in line


def test_output_paths_that_are_folders(job):
    folder = job / "out"
    folder.mkdir()
    assert "is a folder" in refused(run_job(job, "--report", folder), 2, job)
    assert "is a folder" in one_line_error(teraio("plan", TRACE, "--gpu-mem", "1MiB", "-o", folder, cwd=job), 2)
    line = refused(teraio("profile", "-o", folder, "--", PYTHON, job / "train.py", cwd=job), 2, job)
    assert "is a folder" in line
    assert list(folder.iterdir()) == []


def test_an_output_that_names_an_input_is_refused_and_the_input_kept(job):
    """`-o` or `--report` given an input's name replaced it: the trace by its plan, the plan by
    the run's report, and `teraio profile -o train.py` the script by its trace."""
    (job / "t.msgpack").write_bytes(TRACE.read_bytes())
    kept = {name: (job / name).read_bytes() for name in ("plan.json", "train.py", "t.msgpack")}
    for option, name in (("--report", "plan.json"), ("--report", "train.py")):
        assert "is also an input" in refused(run_job(job, option, job / name), 2, job)
    line = refused(teraio("profile", "-o", "train.py", "--", PYTHON, "train.py", cwd=job), 2, job)
    assert "-o" in line and "is also an input" in line
    for args in (["plan", "t.msgpack", "--gpu-mem", "2MiB", "-o", "t.msgpack"],
                 ["view", "t.msgpack", "plan.json", "-o", "plan.json"]):
        assert "is also an input" in one_line_error(teraio(*args, cwd=job), 2)
    assert kept == {name: (job / name).read_bytes() for name in kept}


def small_files() -> None:
    """In the child: files of 2 KiB at most (the trace of STEPPING_SCRIPT is larger, the job's
    status file smaller)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.RLIM_INFINITY))


def test_a_full_disk_at_the_write_is_one_line_and_keeps_the_old_file(job):
    """A file-size limit fails the write as a full disk does (EFBIG where ENOSPC): the command
    says so in one line (it printed OSError's traceback), the plan already there is kept whole
    and no temporary file is left. The trace's write inside the job is said the same way, by
    the launcher, not blamed on the script."""
    def limited(*args):
        return teraio(*args, cwd=job, preexec_fn=small_files)

    before = sorted(job.iterdir())
    old = (job / "plan.json").read_bytes()
    line = one_line_error(limited("plan", TRACE, "--gpu-mem", "2MiB", "-o", "plan.json"), 2)
    assert "cannot write plan.json" in line and "nothing was written" in line
    assert (job / "plan.json").read_bytes() == old and sorted(job.iterdir()) == before
    (job / "train.py").write_text(STEPPING_SCRIPT)
    line = one_line_error(limited("profile", "-o", "t.msgpack", "--", PYTHON, "train.py"), 4)
    assert "the trace could not be written" in line and "cannot write" in line
    assert not (job / "t.msgpack").exists()


def test_files_written_are_readable_as_the_umask_allows(job, tmp_path):
    old = os.umask(0o022)
    try:
        ok(teraio("plan", TRACE, "--gpu-mem", "2MiB", "-o", tmp_path / "p.json", cwd=job))
    finally:
        os.umask(old)
    assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o644  # mkstemp made it 0600


def test_a_command_that_cannot_be_executed_is_one_line(job):
    (job / "train.sh").write_text("#!/nonexistent/python\nprint('ran')\n")
    (job / "train.sh").chmod(0o755)
    proc = teraio("run", "--plan", job / "plan.json", "--", "./train.sh", cwd=job)
    assert "cannot start ./train.sh" in refused(proc, 2, job)  # Popen's FileNotFoundError, traceback and all
