"""The plan: which tensor leaves device memory when, to which tier, and when it comes back.

JSON written for review: stable key order, entries sorted by (offload_after, tensor), one
entry per line, rounded floats, no timestamps or hostnames. Kernel indices refer to the
trace the plan was made from (header.trace.op_digest must match the live job).

An entry is one idle period of one tensor:
- offload_after: the last kernel that uses the tensor before the period; the copy-out
  starts when it finishes;
- offload_by: the kernel by which the copy is planned to be done and the memory freed;
- prefetch_at: the kernel before which the copy-in starts;
- needed_by: the next kernel that uses the tensor; it must be back before this one runs.
When `wraps` is true the period crosses the iteration boundary: offload in iteration i,
prefetch and use in iteration i+1 (so prefetch_at and needed_by are smaller numbers).
An entry with tier `recompute` moves no bytes: the tensor's memory is released after
offload_after (offload_by is the same kernel) and the op that made it, at kernel produced_at,
runs again on the same inputs just before needed_by (prefetch_at is the same kernel), writing
the same bytes into the same storage (Note [Replay] in teraio_run/replay.py).
"""

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from teraio.formats.common import (
    PLAN_FORMAT, Producer, Strict, atomic_write_bytes, check_version, read_raw, validate,
)

PLAN_SCHEMA_VERSION = 1
SUPPORTED_PLAN_VERSIONS = (1,)


class TraceRef(Strict):
    """What the plan was made from: the runtime refuses a plan whose op_digest differs."""

    op_digest: str
    num_kernels: int = Field(gt=0)
    rank: int
    world_size: int
    device: str
    steady_from_iteration: int = Field(1, description="the profiled iteration: the job is steady from here on")
    steps_per_iteration: int = Field(1, ge=1, description="optimizer steps per iteration, counted from the job's first")
    structure_digest: str = Field("", description="the trace's structure digest: iterations with this op "
                                  "structure follow the plan whatever their sizes; \"\" (older plans): exact shapes")
    chunk_digests: str = Field("", description="the digest (16 hex digits) of each run of 64 kernels' signatures "
                               "(structural where structure_digest is set), concatenated: the runtime follows the plan "
                               "from the job's first iteration and checks each run as it ends; \"\" (older plans): "
                               "the plan is followed from the iteration after one that ran the traced ops")


# planner input -> the `teraio plan` option that sets it; a given option is never overridden by
# --calibrate (Note [Calibration] in teraio_plan/calibrate.py)
CALIBRATED_OPTIONS = {"host_gbps": "--host-gbps", "pcie_gbps": "--pcie-gbps", "ssd_read_gbps": "--ssd-read-gbps",
                      "ssd_write_gbps": "--ssd-write-gbps"}


class Calibration(Strict):
    """Figures of the bandwidth model taken from a run of this job (`teraio plan --calibrate`)."""

    report: str = Field(description="the run report they were read from, as given")
    measured: dict[str, float] = Field(description="planner input -> the measured value it took "
                                       "(host_gbps, ssd_read_gbps, ssd_write_gbps, host_us_per_kernel, "
                                       "host_us_per_copy, host_us_per_replay, kernel_time_scale)")
    planned_iterations: int = Field(ge=1, description="the report's iterations on plan they come from")
    overridden: dict[str, float] = Field(default_factory=dict, description="planner input -> what the run "
                                         "measured for it, where an option given on the command line was "
                                         "taken instead (its value is the plan's input)")


class PlannerInputs(Strict):
    budget_bytes: int = Field(gt=0)
    num_ssds: int
    ssd_read_gbps: float
    ssd_write_gbps: float
    host_mem_bytes: int
    host_gbps: float
    pcie_gbps: float
    link_total_gbps: float = Field(0.0, ge=0, description="what the device link carries in both directions "
                                   "together, GB/s (Note [Bandwidth model] in teraio_plan/bandwidth.py); "
                                   "0: each direction its own pcie_gbps at once (full duplex)")
    headroom_bytes: int
    latency_us: float
    allow_stalls: bool = Field(True, description="plan transfers that delay kernels when the budget needs them")
    clean_copies: bool = Field(True, description="the run keeps host copies of storages it brought back and "
                               "releases them again without a copy while unwritten (teraio run's default)")
    host_us_per_kernel: float = Field(0.0, ge=0, description="host time the job's thread spends per kernel "
                                      "under the runtime (launch, walk, the plan's actions but for those "
                                      "host_us_per_copy and host_us_per_replay charge): the device waits for "
                                      "a host that is slower than its kernels; 0: it never does")
    host_us_per_copy: float = Field(0.0, ge=0, description="host time the job's thread spends starting one copy "
                                    "out or in (device re-allocation included), on top of host_us_per_kernel: "
                                    "the device waits for a host that is slower than its kernels; 0: free")
    host_us_per_replay: float = Field(0.0, ge=0, description="host time the job's thread spends replaying one op "
                                      "for a recompute entry (re-allocation included; the op's own kernel time is "
                                      "charged on the device), on top of host_us_per_kernel; 0: free")
    kernel_time_scale: float = Field(1.0, gt=0, description="the trace's kernel times are replayed times this: "
                                     "a CPU run's time inside its ops over the trace's (the profiler's walk slows "
                                     "the ops it times); 1 on a GPU and uncalibrated")
    calibration: Calibration | None = Field(None, description="which inputs were measured by a run (None: all "
                                            "were given or defaults)")
    recompute: bool = Field(True, description="drop idle activations whose op can be replayed and run it again "
                            "before their next use, where the simulator predicts that beats moving them "
                            "(teraio_plan/recompute.py, Note [Choosing recomputation]); false: moves only")


class Prediction(Strict):
    """The simulator's replay of trace + plan under the bandwidth model (one iteration)."""

    iteration_ms: float
    ideal_iteration_ms: float
    share_of_ideal: float
    stall_ms: float
    peak_bytes: int
    peak_bytes_without_plan: int
    fits: bool
    over_budget_kernels: int
    max_excess_bytes: int
    ssd_write_bytes_per_iteration: int
    host_pool_bytes: int
    offload_bytes_by_tier: dict[str, int]
    clean_bytes_per_iteration: int = Field(0, description="bytes released without a copy (clean entries): "
                                           "offload_bytes_by_tier less these is what crosses the link out")
    recompute_bytes_per_iteration: int = Field(0, description="bytes dropped and made again by replaying their "
                                               "op (recompute entries): they cross no link and are not in "
                                               "offload_bytes_by_tier")
    recompute_ms_per_iteration: float = Field(0.0, description="device time the replays take, part of "
                                              "iteration_ms (not of stall_ms)")


class PlanHeader(Strict):
    format: Literal["teraio-plan"] = PLAN_FORMAT
    schema_version: int = PLAN_SCHEMA_VERSION
    producer: Producer
    trace: TraceRef
    inputs: PlannerInputs
    prediction: Prediction


class PlanEntry(Strict):
    tensor: str = Field(description="stable tensor id from the trace")
    name: str
    kind: str
    nbytes: int = Field(gt=0)
    tier: Literal["ssd", "host", "recompute"]
    offload_after: int = Field(ge=0)
    offload_by: int = Field(ge=0)
    prefetch_at: int = Field(ge=0)
    needed_by: int = Field(ge=0)
    wraps: bool
    reason: str
    clean: bool = Field(False, description="leaves without a copy: the host pool still holds a current one "
                        "(teraio_plan/clean.py, Note [Clean entries])")
    produced_at: int | None = Field(None, ge=0, description="tier recompute only: the kernel that made the "
                                    "tensor, run again before needed_by")


KERNEL_FIELDS = ("offload_after", "offload_by", "prefetch_at", "needed_by")


def _check_recompute(i: int, entry: PlanEntry) -> None:
    """A recompute entry names the op to replay, made before the period within one iteration."""
    if (entry.tier == "recompute") != (entry.produced_at is not None):
        raise PydanticCustomError("recompute_fields", "entry {i} ({tensor}): produced_at is given exactly for "
                                  "tier recompute", {"i": i, "tensor": entry.tensor})
    if entry.tier == "recompute" and (entry.wraps or entry.clean or entry.produced_at > entry.offload_after):
        raise PydanticCustomError("recompute_period", "entry {i} ({tensor}): a recompute entry is made at or "
                                  "before offload_after, does not wrap and is not clean",
                                  {"i": i, "tensor": entry.tensor})


class Plan(Strict):
    header: PlanHeader
    entries: list[PlanEntry]

    @field_validator("entries")
    @classmethod
    def _kernels_in_trace(cls, entries: list[PlanEntry], info: ValidationInfo) -> list[PlanEntry]:
        """A hand-edited index past the trace's end would name a kernel that never runs."""
        header = info.data.get("header")
        if header is None:
            return entries  # the header's own error is reported
        num_kernels = header.trace.num_kernels
        for i, entry in enumerate(entries):
            _check_recompute(i, entry)
            for name in KERNEL_FIELDS:
                if getattr(entry, name) >= num_kernels:
                    raise PydanticCustomError(
                        "kernel_out_of_range",
                        "entry {i} ({tensor}) has {name} {value}, past the trace's last kernel {last}",
                        {"i": i, "tensor": entry.tensor, "name": name, "value": getattr(entry, name),
                         "last": num_kernels - 1})
        return entries


def sort_entries(entries: list[PlanEntry]) -> list[PlanEntry]:
    return sorted(entries, key=lambda e: (e.offload_after, e.tensor, e.needed_by))


def _round_floats(obj, digits: int = 3):
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: _round_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_round_floats(v, digits) for v in obj]
    return obj


def plan_to_json(plan: Plan) -> str:
    """Deterministic text: the header indented, then one entry per line."""
    header = _round_floats(plan.header.model_dump(mode="json"))
    lines = ["{", '"header": ' + json.dumps(header, indent=2) + ",", '"entries": [']
    entries = sort_entries(plan.entries)
    for i, entry in enumerate(entries):
        comma = "," if i + 1 < len(entries) else ""
        # `clean` only where true: entries read (and diff) as they did before it existed
        lines.append("  " + json.dumps(_round_floats(entry.model_dump(mode="json", exclude_defaults=True))) + comma)
    lines += ["]", "}", ""]
    return "\n".join(lines)


def save_plan(plan: Plan, path: str | Path) -> None:
    atomic_write_bytes(path, plan_to_json(plan).encode())


def load_plan(path: str | Path) -> Plan:
    raw = read_raw(path)
    check_version(raw, path, PLAN_FORMAT, SUPPORTED_PLAN_VERSIONS)
    return validate(Plan, raw, path)
