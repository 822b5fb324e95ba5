"""A lower bound on the iteration time of any plan that fits: a MILP solved by HiGHS (scipy).

Note [MILP relaxation]
    The simulator's model (kernels back to back, fluid copies on rate-limited paths, waits for
    memory and inputs) is a scheduling problem too large to solve exactly at thousands of
    kernels. This MILP is a relaxation of it: every plan whose replay fits the budget and
    cancels no copy-out gives a feasible point of equal or lower objective, so its optimum
    (or, at the time limit, HiGHS's dual bound) is a valid lower bound on what any plan
    can predict. Variables: x[i, t] = 1 when idle period i is planned on tier t; S >= 0, the
    stall (us). Minimize S; the iteration is ideal + S.
      - one tier per period: sum_t x[i, t] <= 1;
      - memory, each kernel k over budget: sum of s_i x[i, t] over periods that could have
        their tensor away at k >= M[k] - budget. "Could": kernels a+1 .. e-2 of a period
        between uses a and e, one more than a plan entry's reach (Note [What must stay]), since
        in the replay a copy-out may finish while kernel a+1 waits for memory;
      - host pool, each kernel: sum of s_i x[i, host] over periods held there (a+1 .. e-1)
        <= --host-mem;
      - bandwidth, per tier path and direction and per link direction: the bytes of one
        iteration at that rate take at most ideal + S;
      - per period: its copy-out and copy-in run one after the other inside its window (else
        the copy-out is cancelled and relieves nothing): s/out + s/in <= window + S.
    What it leaves out, and so only makes the bound lower: when copies run (their order,
    queueing, the kernels a copy can overlap), prefetches that start early, latency.
    Rows are per stretch of kernels covered by one set of periods (the largest excess there).
    The LP relaxation is solved first: when the MILP stops at the time limit, the larger of its
    optimum and HiGHS's dual bound is the bound (at 4,000 kernels the dual bound alone was
    still 0 after a minute; the LP took 3 s).
"""

from dataclasses import dataclass

import numpy as np

from teraio.errors import TeraioError
from teraio.formats.plan import PlannerInputs
from teraio.formats.trace import Trace
from teraio_plan.bandwidth import IN_PATH, OUT_PATH, TIERS, rates
from teraio_plan.memory import memory_curve
from teraio_plan.periods import Periods, find_periods

MIB = 2**20  # bytes are solved in MiB: HiGHS is happier near 1 than near 1e9


class SolverMissing(TeraioError):
    exit_code = 2


@dataclass
class Bound:
    lower_bound_ms: float   # no plan that fits replays faster (Note [MILP relaxation]); inf: none fits
    ideal_ms: float
    optimal: bool           # solved to optimality, not stopped by the time limit
    status: str
    num_periods: int
    num_rows: int           # constraints (memory rows are per stretch of kernels, see _stretches)


def iteration_bound(trace: Trace, inputs: PlannerInputs, time_limit_s: float = 60.0) -> Bound:
    """The least iteration time (ms) any fitting plan can predict, under Note [MILP relaxation]."""
    try:
        from scipy import sparse
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        raise SolverMissing("the exact solver needs scipy: pip install scipy (or teraio[test])") from None
    model = _Model(trace, inputs)
    a_ub, b_ub = model.rows(sparse)
    cols = a_ub.shape[1]
    c = np.zeros(cols)
    c[-1] = 1.0  # minimize S
    problem = dict(bounds=Bounds(np.zeros(cols), np.r_[np.ones(cols - 1), np.inf]),
                   constraints=[LinearConstraint(a_ub, -np.inf, b_ub)])
    ideal_ms, shape = model.ideal_us / 1e3, (len(model.p), a_ub.shape[0])
    # The LP relaxation first: seconds, and a valid bound when the MILP runs out of time.
    lp = milp(c, integrality=np.zeros(cols), options={"time_limit": time_limit_s, "disp": False}, **problem)
    if lp.status == 2:  # infeasible: no set of periods relieves enough
        return Bound(np.inf, ideal_ms, True, lp.message, *shape)
    integrality = np.r_[np.ones(cols - 1), 0]
    mip = milp(c, integrality=integrality, options={"time_limit": time_limit_s, "disp": False}, **problem)
    if mip.status == 2:
        return Bound(np.inf, ideal_ms, True, mip.message, *shape)
    if mip.status == 0:
        return Bound(ideal_ms + max(0.0, mip.fun) / 1e3, ideal_ms, True, mip.message, *shape)
    bounds_us = [lp.fun if lp.status == 0 else 0.0, getattr(mip, "mip_dual_bound", None) or 0.0]
    return Bound(ideal_ms + max(0.0, *bounds_us) / 1e3, ideal_ms, False, mip.message, *shape)


class _Model:
    def __init__(self, trace: Trace, inputs: PlannerInputs):
        self.n, self.inputs = trace.num_kernels, inputs
        self.p: Periods = find_periods(trace)
        self.ideal_us = float(trace.duration_us.sum())
        self.excess_bytes = memory_curve(trace, inputs.headroom_bytes) - inputs.budget_bytes
        r = rates(inputs)
        link = {True: r.out, False: r.into}
        self.rate = {t: {d: min(r.path(OUT_PATH[t] if d else IN_PATH[t]), link[d]) for d in (True, False)}
                     for t in TIERS}
        self.tiers = [t for t in TIERS if min(self.rate[t].values()) > 0]
        self.link = link

    def rows(self, sparse):
        """(A, b) of A [x; S] <= b, x tier-major."""
        count, s_mib = len(self.p), self.p.nbytes / MIB
        csr_array, hstack, vstack = sparse.csr_array, sparse.hstack, sparse.vstack
        blocks, rhs = [], []

        def add(per_tier: dict, stall_coef: float, b: np.ndarray) -> None:
            parts = [per_tier.get(t, csr_array((len(b), count))) for t in self.tiers]
            parts.append(csr_array(np.full((len(b), 1), stall_coef)))
            blocks.append(hstack(parts, format="csr"))
            rhs.append(b)

        one = sparse.identity(count, format="csr")
        add({t: one for t in self.tiers}, 0.0, np.ones(count))
        cover, need = self._stretches(self.p.start + 1, self.p.end - 1, self.excess_bytes)
        keep = need > 0
        cover_mib = csr_array(cover[keep] * s_mib)
        add({t: -cover_mib for t in self.tiers}, 0.0, -need[keep] / MIB)
        if "host" in self.tiers and s_mib.sum() * MIB > self.inputs.host_mem_bytes:
            held, _ = self._stretches(self.p.start + 1, self.p.end, np.zeros(self.n))
            add({"host": csr_array(held * s_mib)}, 0.0, np.full(held.shape[0], self.inputs.host_mem_bytes / MIB))
        for outbound in (True, False):
            for t in self.tiers:
                add({t: csr_array((s_mib * MIB / self.rate[t][outbound])[None, :])}, -1.0, np.array([self.ideal_us]))
            link_row = csr_array((s_mib * MIB / self.link[outbound])[None, :])
            add({t: link_row for t in self.tiers}, -1.0, np.array([self.ideal_us]))
        for t in self.tiers:
            copy_us = self.p.nbytes / self.rate[t][True] + self.p.nbytes / self.rate[t][False] - self.p.window_us
            add({t: sparse.diags_array(np.maximum(copy_us, 0.0), format="csr")}, -1.0, np.zeros(count))
        return vstack(blocks, format="csr"), np.concatenate(rhs)

    def _stretches(self, lo: np.ndarray, hi: np.ndarray, value: np.ndarray):
        """(cover, value): one row per stretch of kernels where the same periods cover [lo, hi)
        (unrolled, folded into one iteration): which periods cover it, and the largest value."""
        n = self.n
        cover_k = np.zeros((n, len(lo)), dtype=bool)
        for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist())):
            if b <= a:
                continue
            k = np.arange(a, b) % n
            cover_k[k, i] = True
        rows, inverse = np.unique(cover_k, axis=0, return_inverse=True)
        best = np.full(len(rows), -np.inf)
        np.maximum.at(best, inverse.ravel(), value.astype(np.float64))
        return rows.astype(np.float64), best
