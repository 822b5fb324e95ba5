"""Building the runtime from TERAIO_* settings (the agent and its engine, or the engine alone
for a profile under a cap), and removing its swap folders."""

import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from teraio.errors import PlanMismatchError, UsageError
from teraio.formats.plan import Plan, load_plan
from teraio.settings import Settings, rank_path
from teraio.swap_dirs import swap_bases
from teraio.units import format_bytes
from teraio_run.agent import RunAgent
from teraio_run.engine import MigrationEngine
from teraio_run.replay import ReplayTier
from teraio_run.tiers import HostPool, HostTier, KvikioFiles, PosixFiles, SsdTier, make_run_dirs

IO_THREADS = 8
PIN_NOTICE_BYTES = 8 << 30  # say so before pinning a pool this large: it takes seconds


@dataclass
class RunContext:
    settings: Settings
    plan_path: Path | None   # None when the profiler keeps the budget alone
    run_dirs: list
    io_backend: str
    threads: ThreadPoolExecutor
    pool_bytes: int
    pool_pin_s: float  # page-locking a large pool takes a while (24 s for 72 GiB on the H200)
    started_s: float = field(default_factory=time.time)  # wall clock (Note [A report path the job wrote])


def plan_for_rank(settings: Settings) -> tuple[Plan, Path]:
    """This rank's plan (NAME.rankN.json), or the one plan given when the job has one rank."""
    path = rank_path(settings.plan, settings.rank, settings.world_size)
    if not path.is_file():
        path = Path(settings.plan)
    plan = load_plan(path)
    ref = plan.header.trace
    if (ref.rank, ref.world_size) != (settings.rank, settings.world_size):
        raise PlanMismatchError(
            f"{path} was made for rank {ref.rank} of {ref.world_size}, but this is rank {settings.rank} "
            f"of {settings.world_size}: plan each rank's trace (teraio plan trace.rank*.msgpack)")
    return plan, path


def choose_files(backend: str, cuda: bool):
    if backend in ("auto", "kvikio") and cuda:
        try:
            return KvikioFiles()
        except ImportError:
            if backend == "kvikio":
                raise UsageError("KvikIO is not installed: pip install 'teraio[cu13]', or use --io-backend posix")
    return PosixFiles()


def build_agent(settings: Settings, plan: Plan, plan_path: Path) -> tuple[RunAgent, RunContext]:
    device_type = settings.device_type()
    cuda = device_type == "cuda"
    budget = plan.header.inputs.budget_bytes
    if cuda:
        cap_device_memory(settings.gpu_mem_bytes or budget)
    elif settings.gpu_mem_bytes and settings.gpu_mem_bytes != budget:
        print(f"teraio: --gpu-mem caps CUDA memory; on the {device_type} the plan's budget of {format_bytes(budget)} "
              "holds (plan again with --gpu-mem to rehearse another)", file=sys.stderr)
    # The pool is what the user allowed (--host-mem), not just what the plan uses: unplanned
    # stretches (iteration 0, drift) evict into it at PCIe speed instead of SSD speed.
    inputs = plan.header.inputs
    pool_bytes = max(plan.header.prediction.host_pool_bytes, inputs.host_mem_bytes)
    engine, context = build_engine(settings, pool_bytes, cuda)
    context.plan_path = plan_path
    agent = RunAgent(plan, engine, device_type, budget, strict=settings.strict)
    return agent, context


def build_engine(settings: Settings, pool_bytes: int, cuda: bool) -> tuple[MigrationEngine, RunContext]:
    """The migration engine over a host pool of pool_bytes and this rank's swap folders."""
    threads = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="teraio-io")
    ssd_dirs = swap_bases(settings.ssd_dirs)
    run_dirs = make_run_dirs(ssd_dirs, settings.rank)
    files = choose_files(settings.io_backend, cuda)
    if cuda and pool_bytes >= PIN_NOTICE_BYTES:
        print(f"teraio: page-locking the {format_bytes(pool_bytes)} host pool (about 3 GB/s: 24 s for 72 GiB "
              "on the H200 machine)...", file=sys.stderr)
    t0 = time.perf_counter()
    pool = HostPool(pool_bytes, pin=cuda)
    pool_pin_s = time.perf_counter() - t0
    host_tier = HostTier(pool, cuda, threads) if pool.capacity else None  # --host-mem 0: the disk alone
    engine = MigrationEngine(host_tier, SsdTier(run_dirs, files, threads), cuda,
                             keep_clean=settings.clean_copies, replay_tier=ReplayTier("cuda" if cuda else "cpu"))
    return engine, RunContext(settings, None, run_dirs, files.name, threads, pool.capacity, pool_pin_s)


def cap_device_memory(cap_bytes: int) -> None:
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total))


def remove_run_dirs(context: RunContext) -> None:
    for run_dir in context.run_dirs:
        shutil.rmtree(run_dir, ignore_errors=True)
