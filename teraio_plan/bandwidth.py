"""The bandwidth model shared by the planner and the simulator.

Note [Bandwidth model]
    Six paths, each a constant rate in bytes per microsecond (1 GB/s = 1e9 B/s = 1e3 B/us):
        d2s = num_ssds * ssd_write_gbps * 1e3     device -> SSD
        s2d = num_ssds * ssd_read_gbps  * 1e3     SSD -> device
        d2h = h2d = host_gbps * 1e3               device <-> pinned host pool
        out = in = pcie_gbps * 1e3                the device's link, one per direction,
                                                  shared by SSD and host traffic
    A transfer of s bytes on tier path p moves at most min(p, link) bytes/us, and all
    transfers in one direction together never exceed the link. During kernel k (tau[k] us)
    path p can carry at most p * tau[k] bytes: the planner's per-kernel ledgers start there.
    Each transfer also pays `latency_us` once (submission, completion); the planner only
    keeps periods whose window exceeds both transfers at full rate plus two latencies.
    Kernels take their profiled time whatever the traffic (copies run on side streams).
"""

from dataclasses import dataclass

from teraio.formats.plan import PlannerInputs

BYTES_PER_US_PER_GBPS = 1e3

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
        """The fastest one transfer can move on this tier and direction."""
        if outbound:
            return min(self.path(OUT_PATH[tier]), self.out)
        return min(self.path(IN_PATH[tier]), self.into)


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
