"""Mistakes `teraio run`, `plan` and `profile` catch before anything starts or is written.

Each is one line and a non-zero exit, and the job never runs (its script would leave a
marker). Before these checks the job found out inside: one warning, exit 0, no report.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from teraio.formats.plan import save_plan
from teraio.formats.trace import live_bytes_per_kernel, load_trace
from cli_helpers import PYTHON, ROOT, one_line_error, teraio
from runtime_helpers import every_period_plan

TRACE = ROOT / "traces" / "cpu-tiny.msgpack"


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
