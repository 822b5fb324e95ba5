"""The run report: what one rank of `teraio run` did, against what its plan predicted."""

from pathlib import Path
from typing import Literal

from pydantic import Field

from teraio.formats.common import (
    REPORT_FORMAT, Producer, Strict, atomic_write_bytes, check_version, read_raw, validate,
)

REPORT_SCHEMA_VERSION = 1
SUPPORTED_REPORT_VERSIONS = (1,)


class ReportHeader(Strict):
    format: Literal["teraio-report"] = REPORT_FORMAT
    schema_version: int = REPORT_SCHEMA_VERSION
    producer: Producer
    command: list[str]
    rank: int
    world_size: int
    device: str  # where the cap and the copy streams were set up: "cuda:1", "cpu"
    plan: str
    plan_op_digest: str


class IterationRow(Strict):
    """What one iteration did; `followed_plan` is whether it ran the plan's actions."""

    iteration: int
    followed_plan: bool
    kernels: int
    ms: float
    planned_offloads: int
    plan_ids_missing: int
    evictions: int
    oom_retries: int
    stall_ms: float
    offloaded_bytes: int
    walk_ms: float = Field(0.0, description="host time in the op walk and the agent, stalls included")
    op_launch_ms: float = Field(0.0, description="host time inside the ops (PyTorch's launch cost)")
    between_ops_ms: float = Field(0.0, description="host time in the job's own code between two ops, gaps "
                                  "under 1 ms (teraio/walk.py, Note [Time between ops])")
    copy_busy_ms: float = Field(0.0, description="time copies kept their paths busy (d2h, h2d, d2s, s2d "
                                "summed): near the iteration time, the iteration is bound by the links")
    other_tier_bytes: int = Field(0, description="offloads put on the other tier: the host pool had no room")
    host_pool_peak_bytes: int = Field(0, description="the most the host pool held at once")
    resident_peak_bytes: int = Field(0, description="the most device bytes the budget keeper counted resident "
                                     "in this iteration: a lower bound of its peak (counts are skipped while "
                                     "they cannot pass the budget or the run's peak so far)")
    paused_at_kernel: int = Field(-1, description="the kernel where an op unlike the trace's paused the plan "
                                  "for the rest of the iteration (-1: not paused)")
    ops_stepped_over: int = Field(0, description="ops unlike the trace's that the plan stepped over and then "
                                  "came back to it (ops that make scalars: a log line's loss.item()): Note [Ops the trace lacks] in "
                                  "teraio_run/agent.py")
    kernels_absent: int = Field(0, description="kernels of the trace this iteration lacked, the plan going on from "
                                "the next (a slice PyTorch makes no op for: Note [Ops the trace lacks])")
    replay_fallbacks: int = Field(0, description="recompute entries moved to the host pool instead: the op's call "
                                  "was not captured, or it or an input was written since (teraio_run/replay.py)")
    replay_ms: float = Field(0.0, description="host time replaying ops for recompute entries, re-allocating their "
                             "outputs included (on a GPU: launching them; on the CPU: running them)")
    replays: int = Field(0, description="ops replayed for recompute entries")
    replay_released_bytes: int = Field(0, description="of offloaded_bytes, what left without a copy to be replayed "
                                       "(recompute entries)")
    copies_issued: int = Field(0, description="copies out and in the job's thread started (replays not counted)")
    copy_issue_ms: float = Field(0.0, description="host time starting those copies, re-allocating device memory "
                                 "for copies in included (part of walk_ms)")
    restore_alloc_ms: float = Field(0.0, description="host time re-allocating device memory to bring storages "
                                    "back, replays included (part of walk_ms)")
    allocator_syncs: int = Field(0, description="times the CUDA caching allocator synchronized every stream to "
                                 "free cached blocks (the host waits for the device to drain); 0 on the CPU")
    alloc_retries: int = Field(0, description="CUDA allocations retried after freeing cached blocks; 0 on the CPU")
    refused_actions: int = Field(0, description="plan offloads the runtime did not do: the storage was pinned, "
                                 "in a collective, of a kind that never moves or not written yet (teraio_run/metrics.py, "
                                 "Note [Refused plan actions])")


class RunReport(Strict):
    header: ReportHeader
    iterations: int
    iterations_on_plan: int
    steps_without_backward: int = Field(0, description="optimizer steps that ended no iteration: no gradient was "
                                        "accumulated since the last one (a checkpoint writer creating optimizer "
                                        "state), counted apart from iterations (teraio_run/metrics.py)")
    io_backend: Literal["gds", "compat", "posix", "none"]
    offloaded_bytes: dict[str, int]
    written_bytes: dict[str, int] = Field(
        default_factory=dict, description="bytes copied into each tier; less than offloaded_bytes (released from "
        "the device) by what left without a copy, its tier's copy being current (clean copies)")
    offloaded_bytes_by_kind: dict[str, int] = Field(
        default_factory=dict, description="bytes released from the device per tensor kind (parameter, "
        "gradient, optimizer_state, activation): what kinds of tensors really moved")
    prefetched_bytes: dict[str, int]
    achieved_gbps: dict[str, float] = Field(
        default_factory=dict, description="bytes moved / time busy, per path (d2h, h2d, d2s, s2d), GB/s")
    stall_count: int
    stall_ms: float
    stall_ms_by_cause: dict[str, float] = Field(description="late_prefetch (a copy-in the plan started was not back "
                                                "in time), not_prefetched (an input was out and no copy-in had "
                                                "started), unplanned (a copy-in started outside the plan was not back), "
                                                "memory_short (waiting for copy-outs, or evicting, over the budget), "
                                                "out_of_memory (relief after an allocation failed), pool_full (a "
                                                "copy-out waited for a copy-in to free host pool room), raw_read and "
                                                "restore_all (everything brought back for a read outside ATen), "
                                                "replay_input (an input of a replay brought back first), "
                                                "replay_before_write (a replay run early: an op was about to "
                                                "write one of its inputs)")
    top_stalled_tensors: dict[str, float]
    deadline_misses: int
    cancelled_offloads: int
    io_errors: int = Field(description="copies that failed: writes to a full or vanished swap folder, reads of "
                           "a swap file that vanished")
    lost_tensors: dict[str, str] = Field(
        default_factory=dict, description="tensors whose swap file could not be read back (id -> file and why): "
        "their bytes are lost and the job stopped")
    closed_swap_dirs: dict[str, str] = Field(
        default_factory=dict, description="swap folders that took no more writes after one failed (folder -> why: "
        "disk full, gone, not writable)")
    ssd_to_host_bytes: int = Field(0, description="offloads planned for the SSD tier that went to the host pool: "
                                   "no swap folder took writes")
    skipped_actions: int
    refused_actions_by_reason: dict[str, int] = Field(
        default_factory=dict, description="plan offloads the runtime did not do, by why: pinned (handed out "
        "through a raw pointer), unwritten (allocated without a write, no op has taken it yet), collective, kind "
        "(a kind that never moves), ddp_gradient; the storage stayed on the device")
    first_missing: str = Field("", description="the first plan action that found no tensor of its name: when, "
                               "which tensor")
    first_refusal: str = Field("", description="the first refused plan offload: when, which tensor, why")
    on_demand_evictions: int
    oom_retries: int
    peak_device_bytes: int
    peak_in_saves_bytes: int = Field(0, description="the most the device held while a save read the job's tensors "
                                     "(nothing leaves the device then): where it passes the budget, the save is why")
    budget_bytes: int
    guard_trips: int = Field(description="the profiled iteration did not match the plan's trace: a plan "
                             "made for another job")
    guard_reason: str
    plan_pauses: int = Field(0, description="iterations where the plan paused at an op unlike the trace's "
                             "(evaluation, logging, saving, a short last batch) and resumed at the next one")
    pause_reason: str = Field("", description="the first pause: where, and which op")
    compiled_regions: int = Field(0, description="torch.compile calls in this job: under TeraIO they run "
                                  "eager, with eager numerics (Note [Compile under the walk])")
    plan_fits: bool = Field(True, description="the plan's own prediction kept the budget (teraio plan's "
                            "fits); where it did not, the runtime kept the cap by evicting on demand")
    predicted_iteration_ms: float
    measured_iteration_ms: float
    kernel_time_drift: float | None
    per_iteration: list[IterationRow] = []


def steady_iterations(followed_plan: list[bool]) -> list[int]:
    """The iterations a plan's prediction is about (indices into the rows).

    Note [Steady iterations]
    A plan predicts an iteration that starts where the last one left off. The first iteration
    that follows it starts from what the unplanned ones left (their evictions on demand, the
    host pool as they filled it): on the H200 it started ~1,500 copies where the next ones
    started ~1,000, and ran 1.1-1.2 s where they ran 0.64-0.73 (the 1B bf16 example at 1/2,
    docs/gpu-results.md, 2026-12-03). The measured iteration of a report and the figures
    `--calibrate` reads come from the planned iterations after that first one; with a single
    planned iteration, from it; with none, from none (callers say what then)."""
    planned = [i for i, followed in enumerate(followed_plan) if followed]
    return planned[1:] if len(planned) > 1 else planned


def save_report(report: RunReport, path: str | Path) -> None:
    atomic_write_bytes(path, (report.model_dump_json(indent=2) + "\n").encode())


def load_report(path: str | Path) -> RunReport:
    raw = read_raw(path)
    check_version(raw, path, REPORT_FORMAT, SUPPORTED_REPORT_VERSIONS)
    return validate(RunReport, raw, path)


def report_stats(report: RunReport) -> dict:
    stats = report.model_dump(mode="json")
    stats.update(format=report.header.format, schema_version=report.header.schema_version,
                 rank=report.header.rank)
    del stats["header"]
    return stats
