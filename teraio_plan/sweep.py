"""The roofline: predicted throughput against migration bandwidth (the paper's Figure 3, docs/paper.md)."""

from collections.abc import Callable
from dataclasses import dataclass

from teraio.formats.plan import PlannerInputs
from teraio.formats.trace import Trace
from teraio_plan.make import check_budget, make_plan_outcome

SWEEP_GBPS = (0, 4, 8, 16, 32, 48, 64)


@dataclass(frozen=True)
class SweepPoint:
    bw_gbps: float
    iteration_ms: float
    ideal_iteration_ms: float
    stall_ms: float
    peak_bytes: int
    fits: bool

    @property
    def share_of_ideal(self) -> float:
        """Throughput over ideal; 0 where the plan does not fit (the job would run out of memory)."""
        if not self.fits or self.iteration_ms <= 0:
            return 0.0 if not self.fits else 1.0
        return self.ideal_iteration_ms / self.iteration_ms


def _one_path(inputs: PlannerInputs, bw_gbps: float) -> PlannerInputs:
    """All migration through one path of bw_gbps each way at once (the per-GPU bandwidth of Figure 3);
    without a link no transfer can be bought with a stall either."""
    return inputs.model_copy(update=dict(
        num_ssds=1, ssd_read_gbps=float(bw_gbps), ssd_write_gbps=float(bw_gbps),
        pcie_gbps=float(bw_gbps), link_total_gbps=0.0, host_mem_bytes=0, allow_stalls=inputs.allow_stalls and bw_gbps > 0))


def sweep(trace: Trace, inputs: PlannerInputs, bandwidths_gbps=SWEEP_GBPS,
          progress: Callable[[float], None] | None = None) -> list[SweepPoint]:
    """For each bandwidth: plan with it as `teraio plan` would (replays chosen with the moves, the
    fit pass, clean entries), replay, and report the share of ideal throughput. Inputs a
    calibration measured of the job itself (host time per kernel, kernel time scale) stay; the
    link rates are what the sweep varies."""
    check_budget(trace, inputs)
    points = []
    for i, bw in enumerate(bandwidths_gbps):
        sim = make_plan_outcome(trace, _one_path(inputs, bw)).simulation
        points.append(SweepPoint(float(bw), sim.iteration_ms, sim.ideal_iteration_ms, sim.stall_ms,
                                 sim.peak_bytes, sim.max_excess_bytes == 0))
        if progress is not None:
            progress((i + 1) / len(bandwidths_gbps))
    return points
