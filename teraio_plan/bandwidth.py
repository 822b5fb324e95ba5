"""The bandwidth model shared by the planner and the simulator.

Note [Bandwidth model]
    Six paths, each a constant rate in bytes per microsecond (1 GB/s = 1e9 B/s = 1e3 B/us):
        d2s = num_ssds * ssd_write_gbps * 1e3     device -> SSD
        s2d = num_ssds * ssd_read_gbps  * 1e3     SSD -> device
        d2h = h2d = host_gbps * 1e3               device <-> pinned host pool
        out = in = pcie_gbps * 1e3                the device's link, one per direction,
                                                  shared by SSD and host traffic
    The link is split between the tiers, SSD first (it is the scarcer path):
        ssd_out  = min(d2s, out)            host_out = min(d2h, out - ssd_out)
        ssd_in   = min(s2d, in)             host_in  = min(h2d, in - ssd_in)
    so each tier has its own rate and both together never exceed the link. During kernel k
    (tau[k] us) a tier can carry rate * tau[k] bytes each way: the planner's per-kernel
    ledgers start there. The simulator lets host traffic also use whatever share of the
    link SSD traffic leaves idle, so the planner's split is what the replay can count on.
    (A split rather than one shared ledger: with a shared one, the replay's queues cannot
    keep both tiers to the planner's per-kernel shares, and prefetches would come back late.)
    Each transfer also pays `latency_us` once (submission, completion); the planner only
    keeps periods whose window exceeds both transfers at full rate plus two latencies.
    Kernels take their profiled time whatever the traffic (copies run on side streams).
"""

from dataclasses import dataclass

from teraio.formats.plan import PlannerInputs

BYTES_PER_US_PER_GBPS = 1e3


def path_bytes_per_us(inputs: PlannerInputs, tier: str) -> tuple[float, float]:
    """(out, in) bytes per us of a tier's path at full rate, capped by the device link."""
    if tier == "host":
        out_gbps = in_gbps = inputs.host_gbps
    else:
        out_gbps, in_gbps = inputs.num_ssds * inputs.ssd_write_gbps, inputs.num_ssds * inputs.ssd_read_gbps
    cap_gbps = inputs.pcie_gbps
    return min(out_gbps, cap_gbps) * BYTES_PER_US_PER_GBPS, min(in_gbps, cap_gbps) * BYTES_PER_US_PER_GBPS


# Directions and tiers as the ledgers name them.
TIERS = ("ssd", "host")
OUT_PATH = {"ssd": "d2s", "host": "d2h"}
IN_PATH = {"ssd": "s2d", "host": "h2d"}


@dataclass(frozen=True)
class Rates:
    """Bytes per microsecond of each path (see Note [Bandwidth model])."""

    d2s: float
    s2d: float
    d2h: float
    h2d: float
    out: float
    into: float

    def path(self, name: str) -> float:
        return getattr(self, "into" if name == "in" else name)

    def peak(self, tier: str, outbound: bool) -> float:
        """The tier's share of the link in this direction (see Note [Bandwidth model])."""
        link = self.out if outbound else self.into
        ssd = min(self.d2s if outbound else self.s2d, link)
        if tier == "ssd":
            return ssd
        return max(0.0, min(self.d2h if outbound else self.h2d, link - ssd))


def rates(inputs: PlannerInputs) -> Rates:
    ssd_on = inputs.num_ssds > 0
    host_on = inputs.host_mem_bytes > 0
    scale = BYTES_PER_US_PER_GBPS
    return Rates(
        d2s=inputs.num_ssds * inputs.ssd_write_gbps * scale if ssd_on else 0.0,
        s2d=inputs.num_ssds * inputs.ssd_read_gbps * scale if ssd_on else 0.0,
        d2h=inputs.host_gbps * scale if host_on else 0.0,
        h2d=inputs.host_gbps * scale if host_on else 0.0,
        out=inputs.pcie_gbps * scale,
        into=inputs.pcie_gbps * scale,
    )
