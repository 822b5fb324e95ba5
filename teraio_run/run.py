"""`teraio run`: check the plan, then launch the job with the runtime injected."""

from pathlib import Path

from teraio.errors import UsageError
from teraio.formats.plan import load_plan
from teraio.launch import resolve_command, run_command
from teraio.settings import Settings

# Tensors leave and come back all the time, in sizes that fragment a segmented pool, and the
# cap counts reserved memory: growable segments keep reserved close to allocated.
RUN_ENV_DEFAULTS = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def run(argv: list[str], plan_path: str, ssd_dirs: list[str], report: str, gpu_mem_bytes: int,
        io_backend: str, strict: bool, device: str = "auto") -> int:
    """Run the job under the plan; returns the job's exit code."""
    command = resolve_command(argv)
    _check_plans(Path(plan_path))
    for ssd_dir in ssd_dirs:
        if Path(ssd_dir).exists() and not Path(ssd_dir).is_dir():
            raise UsageError(f"--ssd-dir {ssd_dir} is a file: give a folder on the SSD")
    settings = Settings(mode="run", device=device, command=list(argv), strict=strict,
                        plan=str(Path(plan_path).resolve()), ssd_dirs=[str(Path(d).resolve()) for d in ssd_dirs],
                        report=str(Path(report).resolve()) if report else "", gpu_mem_bytes=gpu_mem_bytes,
                        io_backend=io_backend)
    return run_command(command, settings, RUN_ENV_DEFAULTS)


def _check_plans(plan_path: Path) -> None:
    """Fail before launching when no plan can be read (per-rank plans: NAME.rankN.json)."""
    rank_plans = sorted(plan_path.parent.glob(f"{plan_path.stem}.rank*{plan_path.suffix}"))
    for path in rank_plans or [plan_path]:
        load_plan(path)
