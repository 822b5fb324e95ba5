"""An aggressive plan for runtime tests: every idle period of every movable tensor is offloaded.

This is not the planner (teraio_plan decides what is worth moving); it exercises the runtime
on the most migration a trace allows, alternating host and SSD tiers, to test correctness.
"""

from pathlib import Path

from teraio import __version__
from teraio.formats.common import Producer
from teraio.formats.plan import Plan, PlanEntry, PlanHeader, PlannerInputs, Prediction, TraceRef, save_plan
from teraio.formats.trace import Kind, Trace, chunk_digests, live_bytes_per_kernel, load_trace

MOVABLE = (Kind.parameter, Kind.gradient, Kind.optimizer_state, Kind.activation)


def every_period_plan(trace: Trace, budget_bytes: int, tiers=("host", "ssd"), min_gap: int = 2) -> Plan:
    entries = []
    for i in range(trace.num_tensors):
        if Kind(trace.kind[i]) not in MOVABLE or trace.nbytes[i] == 0:  # nothing to move (a plan refuses it)
            continue
        uses = sorted(set(int(u) for u in trace.uses(i)))
        periods = [(a, b, False) for a, b in zip(uses, uses[1:]) if b - a >= min_gap]
        if trace.born[i] < 0 and uses and uses[0] > 0:
            periods.append((uses[-1], uses[0], True))
        for after, needed, wraps in periods:
            tier = tiers[len(entries) % len(tiers)]
            entries.append(PlanEntry(
                tensor=trace.tensor_id[i], name=trace.tensor_name[i], kind=Kind(trace.kind[i]).name,
                nbytes=int(trace.nbytes[i]), tier=tier, offload_after=after, offload_by=after,
                prefetch_at=needed - 1, needed_by=needed, wraps=wraps, reason="test: every idle period"))
    return Plan(header=_header(trace, budget_bytes, sum(e.nbytes for e in entries)), entries=entries)


def _header(trace: Trace, budget_bytes: int, pool_bytes: int) -> PlanHeader:
    h = trace.header
    return PlanHeader(
        producer=Producer(teraio=__version__),
        trace=TraceRef(op_digest=h.op_digest, num_kernels=h.num_kernels, rank=h.rank,
                       world_size=h.world_size, device=h.device.name,
                       steady_from_iteration=h.warmup_iterations, structure_digest=h.structure_digest,
                       steps_per_iteration=h.steps_per_iteration, chunk_digests=chunk_digests(trace)),
        inputs=PlannerInputs(budget_bytes=budget_bytes, num_ssds=1, ssd_read_gbps=1.0, ssd_write_gbps=1.0,
                             host_mem_bytes=pool_bytes, host_gbps=1.0, pcie_gbps=1.0, headroom_bytes=0,
                             latency_us=0.0),
        prediction=Prediction(iteration_ms=1.0, ideal_iteration_ms=1.0, share_of_ideal=1.0, stall_ms=0.0,
                              peak_bytes=0, peak_bytes_without_plan=0, fits=True, over_budget_kernels=0,
                              max_excess_bytes=0, ssd_write_bytes_per_iteration=0, host_pool_bytes=pool_bytes,
                              offload_bytes_by_tier={}),
    )


def plan_at_half_peak(trace_path: Path, planner: str, work: Path) -> tuple[Path, int]:
    """A plan for half the trace's peak, made by `teraio plan` ("teraio-plan") or by
    every_period_plan ("every-period"); returns its path and budget."""
    from cli_helpers import ok, teraio

    trace = load_trace(trace_path)
    budget = int(live_bytes_per_kernel(trace).max()) // 2
    plan = work / "plan.json"
    if planner == "teraio-plan":
        ok(teraio("plan", trace_path, "--gpu-mem", budget, "--ssds", 1, "--host-mem", budget // 2, "-o", plan,
                  cwd=work))
    else:
        save_plan(every_period_plan(trace, budget), plan)
    return plan, budget


def assert_mostly_on_plan_within_budget(report, budget: int) -> None:
    """Iterations after the first two (optimizer state, the first planned one) follow the plan
    at least 3 times in 4, the cap holds, and bytes did move."""
    after_warmup = report.per_iteration[2:]
    on_plan = sum(row.followed_plan for row in after_warmup)
    assert on_plan >= 0.75 * len(after_warmup), report.pause_reason or report.guard_reason
    assert report.peak_device_bytes <= report.budget_bytes == budget
    assert sum(report.offloaded_bytes.values()) > 0


RANDOM_WORDS = ("dropout", "bernoulli", "rand", "normal", "uniform", "multinomial", "poisson", "attention")  # attention: seeded


def as_recompute_plan(trace: Trace, plan: Plan) -> Plan:
    """The plan with every activation entry that one replay of its producer could serve made a
    recompute entry (teraio_run/replay.py, Note [Replay]): its producer draws no random numbers
    and writes nothing in place, and no input is written between the producer and the use. The
    runtime itself checks writes and falls back to the host pool; this only picks what to try."""
    index = {tensor_id: t for t, tensor_id in enumerate(trace.tensor_id)}
    used_at: dict[int, list[int]] = {}
    for t in range(trace.num_tensors):
        for k in trace.uses(t):
            used_at.setdefault(int(k), []).append(t)
    entries = []
    for entry in plan.entries:
        t = index[entry.tensor]
        born = int(trace.born[t])
        op = trace.op_name(born) if born >= 0 else ""
        if (entry.kind == "activation" and not entry.wraps and born >= 0 and not op.endswith("_")
                and not any(word in op for word in RANDOM_WORDS)
                and not any(_written_between(trace, i, born, entry.needed_by) for i in used_at[born])):
            entry = entry.model_copy(update={"tier": "recompute", "produced_at": born, "clean": False,
                                             "offload_by": entry.offload_after, "prefetch_at": entry.needed_by})
        entries.append(entry)
    return plan.model_copy(update={"entries": entries})


def _written_between(trace: Trace, t: int, after: int, until: int) -> bool:
    lo, hi = trace.use_offsets[t], trace.use_offsets[t + 1]
    uses = trace.use_kernels[lo:hi]
    return bool(trace.use_writes[lo:hi][(uses >= after) & (uses <= until)].any())
