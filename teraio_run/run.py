"""`teraio run`: check the plan, then launch the job with the runtime injected."""

import json
import os
import shutil
import tempfile
from pathlib import Path

from teraio.errors import UsageError
from teraio.formats.common import refuse_overwriting_input
from teraio.formats.plan import Plan, load_plan
from teraio.launch import CAPPED_JOB_ENV, mem_available_bytes, resolve_command, run_command
from teraio.settings import Settings, rank_path
from teraio.swap_dirs import DEFAULT_SWAP_DIR, swap_bases
from teraio.units import format_bytes
from teraio_run.layout import STRIPE_MIN_BYTES


def run(argv: list[str], plan_path: str, ssd_dirs: list[str], report: str, gpu_mem_bytes: int,
        io_backend: str, strict: bool, device: str = "auto", clean_copies: bool = True) -> int:
    """Run the job under the plan; returns the job's exit code."""
    command = resolve_command(argv)
    plan_paths = _plan_paths(Path(plan_path))
    plans = [load_plan(path) for path in plan_paths]
    # Preflight: what the job would find out only inside (one warning, exit 0, no report).
    _check_report_path(report, plans, [*plan_paths, *argv])
    acting = [plan for plan in plans if plan.entries or not plan.header.prediction.fits]
    swap_dirs = swap_bases(ssd_dirs)
    if acting:  # a plan that moves nothing leaves the job untouched: no pool, no swap files
        _check_ssd_dirs(swap_dirs, acting)
        _check_host_memory(acting)
    with tempfile.TemporaryDirectory(prefix="teraio-run-") as status_dir:
        settings = Settings(mode="run", device=device, command=list(argv), strict=strict, status_dir=status_dir,
                            plan=str(Path(plan_path).resolve()), ssd_dirs=[str(Path(d).resolve()) for d in ssd_dirs],
                            report=str(Path(report).resolve()) if report else "", gpu_mem_bytes=gpu_mem_bytes,
                            io_backend=io_backend, clean_copies=clean_copies)
        return job_status(run_command(command, settings, CAPPED_JOB_ENV).status, Path(status_dir))


def job_status(status: int, status_dir: Path) -> int:
    """The job's own status where it failed or a signal ended it; where it ended with 0, the
    failure a rank's runtime said at its exit (teraio_run/report.py, _fail_status), if any."""
    if status != 0:
        return status
    said = [json.loads(path.read_text())["exit_status"] for path in status_dir.glob("status.*.json")]
    return max(said, default=0)


def _plan_paths(plan_path: Path) -> list[Path]:
    """Every plan the job's ranks will read (per-rank plans: NAME.rankN.json)."""
    return sorted(plan_path.parent.glob(f"{plan_path.stem}.rank*{plan_path.suffix}")) or [plan_path]


def _check_report_path(report: str, plans: list[Plan], inputs: list) -> None:
    """Each rank's report path can be written, and is none of the run's inputs (the plans, the
    script and the files its arguments name): the report at the job's end would replace it."""
    if not report:
        return
    world_size = max(plan.header.trace.world_size for plan in plans)
    for rank in range(world_size):
        path = rank_path(report, rank, world_size)
        refuse_overwriting_input(path, inputs, "--report")
        _check_output_file(path, "--report")


def _check_output_file(path: Path, option: str) -> None:
    if path.is_dir():
        raise UsageError(f"{option} {path} is a folder: give a file name, e.g. {path / 'run.json'}")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"cannot write {path}: folder {folder} does not exist; create it or change {option}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {path}: folder {folder} is not writable; change {option}")


def _check_ssd_dirs(ssd_dirs: list[str], plans: list[Plan]) -> None:
    need_bytes = max(_ssd_bytes_per_dir(plan, len(ssd_dirs)) for plan in plans)
    for ssd_dir in ssd_dirs:
        path = Path(ssd_dir)
        if path.exists() and not path.is_dir():
            raise UsageError(f"--ssd-dir {ssd_dir} is a file: give a folder on the SSD")
        _check_ssd_parent(ssd_dir, path)
        existing = _nearest_existing(path)  # the default's parents may be made
        if not os.access(existing, os.W_OK | os.X_OK):
            why = "a read-only file system" if os.statvfs(existing).f_flag & os.ST_RDONLY else "no write permission"
            raise UsageError(f"--ssd-dir {ssd_dir} cannot be written ({why} at {existing}): "
                             "give a writable folder on the SSD")
        free_bytes = shutil.disk_usage(existing).free
        if free_bytes < need_bytes:
            raise UsageError(f"--ssd-dir {ssd_dir} has {format_bytes(free_bytes)} free, but the plan keeps up to "
                             f"{format_bytes(need_bytes)} of swap files there: free space, add an --ssd-dir on "
                             "another SSD, or re-plan with fewer SSD bytes (a larger --host-mem or --gpu-mem)")


def _check_ssd_parent(ssd_dir: str, path: Path) -> None:
    """The run makes an --ssd-dir's last folder, not its parents: a mistyped path or an SSD not
    mounted would otherwise put the swap files on whatever disk holds the nearest folder that
    exists (the root disk), unsaid. The default folder (in the temp dir) is made whole."""
    parent = path.absolute().parent
    if path.exists() or parent.is_dir() or path.absolute() == DEFAULT_SWAP_DIR.absolute():
        return
    if parent.exists():
        raise UsageError(f"--ssd-dir {ssd_dir}: {parent} is a file, not a folder: give a folder on the SSD")
    raise UsageError(f"--ssd-dir {ssd_dir}: its folder {parent} does not exist (a typo, or an SSD not mounted?): "
                     "give a folder on the SSD, or create its parent first")


def _ssd_bytes_per_dir(plan: Plan, num_dirs: int) -> int:
    """Room a folder needs for this plan's swap files: a bound, not a simulation.
    A tensor has one swap file (slot) while it is out and is on the SSD at most once at a time,
    so the plan never holds more than the sum over its SSD-tier tensors of their largest size.
    Files of STRIPE_MIN_BYTES or more are split evenly over the folders; smaller ones go whole
    to one folder, in the worst case all to the same one. Per rank: ranks of other machines
    may be planned here too, so summing every rank's plan could refuse a job that fits, and the
    largest rank is what must fit in any case. (Unplanned evictions and host-pool spills also
    write swap files; the run says so if a folder fills.)"""
    largest_bytes: dict[str, int] = {}
    for entry in plan.entries:
        if entry.tier == "ssd":
            largest_bytes[entry.tensor] = max(entry.nbytes, largest_bytes.get(entry.tensor, 0))
    striped = sum(n for n in largest_bytes.values() if n >= STRIPE_MIN_BYTES)
    whole = sum(n for n in largest_bytes.values() if n < STRIPE_MIN_BYTES)
    return -(-striped // num_dirs) + whole


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _check_host_memory(plans: list[Plan]) -> None:
    """The pool is allocated (and on CUDA page-locked) whole at start: one larger than the
    memory this machine has free fails or swaps. The largest rank's pool, as for the SSD."""
    available_bytes = mem_available_bytes()
    if available_bytes is None:
        return
    pool_bytes = max(host_pool_bytes(plan) for plan in plans)
    if pool_bytes > available_bytes:
        raise UsageError(f"the plan's host pool is {format_bytes(pool_bytes)}, but this machine has "
                         f"{format_bytes(available_bytes)} of memory available: re-plan with a smaller --host-mem "
                         "or free memory first")


def host_pool_bytes(plan: Plan) -> int:
    """What build_agent allocates (teraio_run/setup.py): the plan's pool or the user's cap."""
    return max(plan.header.prediction.host_pool_bytes, plan.header.inputs.host_mem_bytes)
