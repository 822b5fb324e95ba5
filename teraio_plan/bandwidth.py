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
    A shared link (link_total_gbps = T > 0): the two directions together carry at most T, as
    on the H200 machine, where a copy one way alone ran at ~54 GB/s and a run moving both ways
    at once reached ~54 GB/s for both together, not 54 each (docs/design.md). Giving each
    direction its own figure there made link-bound plans look up to 1.5x faster than they ran.
    The SSD tier keeps its shares of each direction (scaled down if they alone pass T); the
    host tier gets one ledger for both directions:
        host = min(host_out, host_in, T - ssd_out - ssd_in)
    which an offload fills from its start and a prefetch from its end (their kernels never
    overlap, so one sum serves both). That is exact where the shared link is the narrower
    figure (a lone direction fills it too, as on the H200: --host-gbps 54 --link-total-gbps 54)
    and conservative where the host path is (both directions at once could carry up to T). The
    simulator holds the two directions together to T, shared fairly between them when both
    want more (max-min: each at least T/2 or what it asks), SSD first as above.
    Each transfer also pays `latency_us` once (submission, completion); the planner only
    keeps periods whose window exceeds both transfers at full rate plus two latencies.
    Kernels take their profiled time whatever the traffic (copies run on side streams).
"""

import math
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
    if inputs.link_total_gbps > 0:  # one direction alone is held to the shared link too
        cap_gbps = min(cap_gbps, inputs.link_total_gbps)
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
    both: float = math.inf  # both directions together (a shared link); inf: full duplex

    @property
    def shared(self) -> bool:
        """Whether the directions take from one figure (Note [Bandwidth model])."""
        return self.both < self.out + self.into

    def path(self, name: str) -> float:
        return getattr(self, "into" if name == "in" else name)

    def peak(self, tier: str, outbound: bool) -> float:
        """The tier's share of the link in this direction; on a shared link the host's is its
        share of both directions together (see Note [Bandwidth model])."""
        ssd_out, ssd_in = self._ssd_shares()
        if tier == "ssd":
            return ssd_out if outbound else ssd_in
        host_out = max(0.0, min(self.d2h, self.out - ssd_out))
        host_in = max(0.0, min(self.h2d, self.into - ssd_in))
        if self.shared:
            return max(0.0, min(host_out, host_in, self.both - ssd_out - ssd_in))
        return host_out if outbound else host_in

    def _ssd_shares(self) -> tuple[float, float]:
        ssd_out, ssd_in = min(self.d2s, self.out), min(self.s2d, self.into)
        if ssd_out + ssd_in > self.both:  # the SSDs alone would fill a shared link
            scale = self.both / (ssd_out + ssd_in)
            ssd_out, ssd_in = ssd_out * scale, ssd_in * scale
        return ssd_out, ssd_in


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
        both=inputs.link_total_gbps * scale if inputs.link_total_gbps > 0 else math.inf,
    )
