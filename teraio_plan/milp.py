"""A lower bound on the iteration time of any plan that fits: a MILP solved by HiGHS (scipy).

Note [MILP relaxation]
    The simulator's model (kernels back to back, fluid copies on rate-limited paths, waits for
    memory and inputs) is a scheduling problem too large to solve exactly at thousands of
    kernels. This MILP is a relaxation of it: every plan whose replay fits the budget and
    cancels no copy-out gives a feasible point of equal or lower objective, so its optimum
    (or, at the time limit, HiGHS's dual bound) is a valid lower bound on what any plan
    can predict. It models copies only: a plan with replays or clean releases (which move no
    bytes) may beat it, so bounds are for plans made with --no-recompute --no-clean-copies.
    The replay's second iteration stands for the steady state, as everywhere in the
    planner: a window that reaches back into the first iteration counts its stalls as S
    (tests/test_milp.py checks the bound against the greedy's plans on random jobs).
    Variables: x[i, t] = 1 when idle period i is planned on tier t; S >= 0, the stall (us). Minimize S; the iteration is ideal + S.
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
        the copy-out is cancelled and relieves nothing): s/out + s/in <= window + S;
      - copy windows at a few kernels: what is away there went out since its last use and
        comes back before its next (Note [Copy windows]).
    What it leaves out, and so only makes the bound lower: the order of copies and their
    queueing within a window, prefetches that start early, latency.
    Rows are per stretch of kernels covered by one set of periods (the largest excess there).
    The LP relaxation is solved first: when the MILP stops at the time limit, the larger of its
    optimum and HiGHS's dual bound is the bound (at 4,000 kernels the dual bound alone was
    still 0 after a minute; the LP took 3 s).
    time_indexed.py bounds the same plans another way, by blocks of kernels in time (Note
    [Time-indexed relaxation]); neither implies the other, and bench/plan_gap.py takes the larger.

Note [Copy windows]
    The rows above charge each iteration's bytes against the whole iteration, as if a copy
    could run at any time. But a tensor away at kernel k went out after its last use a and
    comes back after k: its copy-out ran in the time from a to k, its copy-in in the time
    from k to its next use e. Where a forward pass writes its activations out and the
    backward pass reads them back, the two directions cannot overlap, and the rows above
    bounded the 1B bf16 trace's SSD-bound plan at half what it can be. At a few probe
    kernels (PROBE_KERNELS spread evenly over those over budget, and the most over) and for a
    group G of the periods covering k
    (those with at most theta us from their last use to k): the bytes away at k are at least
    need(k); those outside G can relieve at most their own bytes; so G's copy-outs carry at
    least need(k) minus those, at the rate of the variant's path, within theta plus the
    stalls before k:
        (need(k) - sum_{i not in G} s_i X_i - [other tier's part of G]) / rate - theta <= S_out
    (X_i: planned on any tier; per tier, G's bytes on the other tier are relieved too; a third
    variant holds both tiers to the link). The same after k for the copy-ins (S_in). The two
    spans are disjoint, so where together they span at most one iteration's kernels their
    stalls add to at most S: a row per pair says S_out + S_in <= S (a probe's copy-outs with
    its own or a later probe's copy-ins: the activations in tests/test_milp.py go out
    before the first over-budget kernel and come back after the last), and a row per group
    alone says each <= S. Groups are set by byte shares (WINDOW_SHARES) of the covering
    periods sorted by their time to k; only two shares are paired, as pairs grow with the
    square of the rows. Still left out, so still a relaxation: latency, the
    order of copies within a span, and copies that start early.
"""

from dataclasses import dataclass

import numpy as np

from teraio.errors import TeraioError
from teraio.formats.plan import PlannerInputs
from teraio.formats.trace import Trace
from teraio_plan.bandwidth import IN_PATH, OUT_PATH, TIERS, rates
from teraio_plan.memory import memory_curve
from teraio_plan.periods import Periods, find_periods, unrolled_prefix_us

MIB = 2**20  # bytes are solved in MiB: HiGHS is happier near 1 than near 1e9
PROBE_KERNELS = 16  # kernels given copy-window rows (Note [Copy windows])
WINDOW_SHARES = np.array([0.25, 0.5, 0.75, 1.0])  # byte shares that set each side's groups
PAIRED_SHARES = (0.5, 1.0)  # the groups paired across probes (rows grow with the square)


def _sum(a: dict, b: dict) -> dict:
    """Two rows' coefficients added (sparse assembly sums repeated columns)."""
    return {t: (np.concatenate((a[t][0], b[t][0])), np.concatenate((a[t][1], b[t][1]))) for t in a}


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
        self.trace_duration_us = trace.duration_us
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
        for per_tier, b in self._window_rows(sparse):
            add(per_tier, -1.0, b)
        return vstack(blocks, format="csr"), np.concatenate(rhs)

    def _window_rows(self, sparse):
        """(per-tier coefficients, rhs) of the copy-window rows at the probe kernels (Note [Copy windows])."""
        prefix_us = unrolled_prefix_us(self.trace_duration_us)
        outs, ins = [], []  # (probe, variant, share, coefficients, rhs, kernels spanned)
        for k in self._probes():
            cover, away_out, away_in = self._cover_at(k, prefix_us)
            idx = np.flatnonzero(cover)
            if not len(idx):
                continue
            need_mib, s_mib = self.excess_bytes[k] / MIB, self.p.nbytes[idx] / MIB
            for v in self._variants():
                outs += [(k, v, *row) for row in self._side(idx, s_mib, away_out, need_mib, True, v)]
                ins += [(k, v, *row) for row in self._side(idx, s_mib, away_in, need_mib, False, v)]
        rows = [(coef, b) for *_, coef, b, _ in outs + ins]
        for k_out, v_out, share_out, o_coef, o_b, o_kernels in outs:
            for k_in, v_in, share_in, i_coef, i_b, i_kernels in ins:
                if v_out != v_in or share_out not in PAIRED_SHARES or share_in not in PAIRED_SHARES:
                    continue
                # The copy-outs' span ends at k_out, the copy-ins' starts after k_in (unrolled
                # to come later): disjoint, and their stalls add up to at most S within n kernels.
                gap = (k_in - k_out) % self.n
                if o_kernels + gap + i_kernels <= self.n:
                    rows.append((_sum(o_coef, i_coef), o_b + i_b))
        count = len(self.p)
        return [({t: sparse.csr_array((vals, (np.zeros(len(cols), dtype=np.int64), cols)), shape=(1, count))
                  for t, (cols, vals) in c.items()}, np.array([b])) for c, b in rows]

    def _probes(self) -> list[int]:
        """PROBE_KERNELS kernels spread evenly over those over budget, and the most over."""
        over = np.flatnonzero(self.excess_bytes > 0)
        if not len(over):
            return []
        picked = over[np.linspace(0, len(over) - 1, min(PROBE_KERNELS, len(over))).round().astype(np.int64)]
        return sorted(set(picked.tolist()) | {int(np.argmax(self.excess_bytes))})

    def _cover_at(self, k: int, prefix_us: np.ndarray):
        """Per period: whether it can be away at kernel k (kernels a+1 .. e-2), and, unrolled,
        (time, kernels) from its last use to k and from k to its next use."""
        a, e = self.p.start, self.p.end
        first = (a + 1 <= k) & (k <= e - 2)
        at = np.where(first, k, k + self.n)
        cover = first | ((a + 1 <= at) & (at <= e - 2))
        out = (prefix_us[at] - prefix_us[a + 1], at - a)
        into = (prefix_us[e] - prefix_us[at + 1], e - at)
        return cover, out, into

    def _variants(self) -> list[str]:
        """Which tiers a window row bounds: each alone, and both together through the link."""
        return self.tiers + (["both"] if len(self.tiers) > 1 else [])

    def _side(self, idx, s_mib, away, need_mib: float, outbound: bool, variant: str):
        """One direction's rows at a probe: for each group of the periods with the least time
        (us, kernels) on that side, (share, coefficients, rhs, kernels spanned) of
        (need - the bytes others can relieve) / rate - their time <= stall (Note [Copy windows])."""
        away_us, away_kernels = away[0][idx], away[1][idx]
        if variant == "both":
            rate = min(self.link[outbound], sum(self.rate[t][outbound] for t in self.tiers)) / MIB
        else:
            rate = self.rate[variant][outbound] / MIB
        order = np.argsort(away_us, kind="stable")
        cum_mib = np.cumsum(s_mib[order])
        rows, seen = [], set()
        cut = np.searchsorted(cum_mib, WINDOW_SHARES * cum_mib[-1]).clip(0, len(order) - 1)
        for share, theta_us in reversed(list(zip(WINDOW_SHARES.tolist(), away_us[order[cut]].tolist()))):
            if theta_us in seen:
                continue
            seen.add(theta_us)
            group = away_us <= theta_us
            coef = {}
            for t in self.tiers:
                relieves = ~group if variant in (t, "both") else np.ones(len(idx), dtype=bool)
                coef[t] = (idx[relieves], -s_mib[relieves] / rate)
            rows.append((share, coef, theta_us - need_mib / rate, int(away_kernels[group].max())))
        return rows

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
