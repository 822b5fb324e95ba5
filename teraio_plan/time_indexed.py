"""A second lower bound on the iteration time: an LP indexed by blocks of kernels (HiGHS, scipy).

Note [Time-indexed relaxation]
    The MILP of milp.py (Note [MILP relaxation]) charges each path's bytes against the whole
    iteration and orders copies only around its probe kernels, so on SSD-bound plans one
    tensor's write may overlap another's read almost everywhere. This LP keeps time instead.
    The iteration is cut into NUM_BLOCKS stretches of equal kernel time, and each stretch
    once more after its kernel most over budget, so that kernel k*_b ends its block b
    (block_edges). In the simulator's measured iteration block b lasts D_b + S_b us: its
    kernels' time D_b plus every wait before them S_b >= 0 (stalls, host issue), and the
    iteration is ideal + sum_b S_b, the objective (minimized; all in us).
    A piece is the part of an idle period (uses a < e) that can be away in the measured
    iteration: kernels a+1 .. e-1 (one kernel more on each side than a plan entry reaches,
    Note [What must stay], as a copy may finish during a wait). If its tensor is away at
    kernel k*_u, its copy-out ran between the end of kernel a and the start of k*_u (the
    wait before k*_u included), so within blocks block(a+1) .. u, and its copy-in between the
    end of k*_u and the start of e, so within blocks u+1 .. block(e): a block's own waits
    serve the writes of what must be away at its end, never the reads of the same bytes.
    (Cutting at the most-over kernel rather than elsewhere is what keeps a peak's writes and
    reads apart; the equal-time cuts keep one hump's reads apart from the next one's writes.)
    Pieces with the same two end blocks form a class; per class c, tier t and block u,
    variables in MiB:
        O[c,t,u]  copy-out done from block(a+1) through u (non-decreasing in u),
        R[c,t,u]  copy-in still to do from u through block(e) (non-increasing in u),
        z[c,t,u]  bytes away at k*_u: z <= O[u], z <= R[u+1], and sum_t z <= the class's
                  bytes whose piece covers k*_u.
    Rows, each implied by any replay that fits:
      - memory: sum of z at block b >= M[k*_b] - budget, where that is positive;
      - host pool: sum of the host tier's z at block b <= --host-mem (plans keep to the
        pool, as the planner makes them and the runtime's pool needs);
      - capacity, per block and per ledger of the simulator's Note [Bandwidth model]: each
        path (d2s, s2d, d2h, h2d), each link direction (out: d2s + d2h, in: s2d + h2d) and,
        on a shared link, all four together: the increments of O and R in block b over the
        ledger's rate (MiB/us) <= D_b + S_b. These are the replay's own caps, no tighter: an
        SSD read and write run at once on their own paths, as in the simulator.
    Why it is a lower bound: take any replay that fits and cancels no copy-out (or count a
    cancelled one as never away); set O, R from the bytes its copies moved in each block
    and z from what is away at each k*_b: every row holds, so the LP's optimum is at most
    its stalls. The LP forgets, and so only lowers the bound: that a tensor is away whole
    (z may hold part of one; the MILP's x are whole), the order of copies inside a block,
    queueing, priorities, latency, every kernel of a block but k*_b, and how a class's bytes
    split between its pieces.
    Wrapping periods (last use in iteration i, next in i + 1): the simulator measures the
    second of two iterations, so the copy-out of what is away early in it ran in the first,
    whose stalls the objective does not count. Two treatments (`steady_state`):
      - False (strict): a wrapping period is two pieces, its tail (a+1 .. N-1, copy-out only,
        the copy-in comes after the measured iteration) and its head (0 .. e-N-1, copy-in
        only, the copy-out was free). A bound on exactly what the replay measures.
      - True: one piece on the unrolled axis, its copy-out charged to the same blocks of
        this iteration, as if the iteration repeated (the planner's steady state, as the
        MILP's windows assume). Tighter, but not a bound for a replay whose first iteration
        did copies the second does not repeat.
    Units: MiB, us and MiB/us in the LP; the bound is returned in ms. Size: a class spans
    at most blocks + 1 blocks and there are at most about blocks^2 / 2 classes; at
    NUM_BLOCKS = 32 (up to 64 blocks) the 5,000-kernel traces give some 2-3 * 10^4 rows and
    10^5 nonzeros, and HiGHS's interior point solves them in seconds (a pure LP: tiers may
    split, no integrality). On the 3B bf16 trace at 1/2 of its peak 32 to 96 blocks gave the
    same bound to 0.1 ms: the blocks are not what is left loose there.
"""

from collections import defaultdict

import numpy as np

from teraio.formats.plan import PlannerInputs
from teraio.formats.trace import Trace
from teraio_plan.bandwidth import IN_PATH, OUT_PATH, TIERS, rates
from teraio_plan.memory import memory_curve
from teraio_plan.milp import MIB, Bound, SolverMissing
from teraio_plan.periods import find_periods

NUM_BLOCKS = 32  # stretches of kernels, up to twice as many blocks (Note [Time-indexed relaxation]: size grows with the square)
LP_METHOD = "highs-ipm"  # 3 s where dual simplex took 7-30 s (3B bf16 at 1/2) and 120+ s at 96 blocks


def time_indexed_bound(trace: Trace, inputs: PlannerInputs, time_limit_s: float = 60.0,
                       num_blocks: int = NUM_BLOCKS, steady_state: bool = False) -> Bound:
    """The least iteration time (ms) any fitting plan can predict, under Note [Time-indexed relaxation]."""
    try:
        from scipy import sparse
        from scipy.optimize import linprog
    except ImportError:
        raise SolverMissing("the exact solver needs scipy: pip install scipy (or teraio[test])") from None
    model = _BlockModel(trace, inputs, num_blocks, steady_state)
    ideal_ms = model.ideal_us / 1e3
    if model.infeasible:
        return Bound(np.inf, ideal_ms, True, "some block needs more than the periods there hold", len(model.pieces), 0)
    if not model.classes:  # nothing over budget
        return Bound(ideal_ms, ideal_ms, True, "nothing over budget", len(model.pieces), 0)
    c, a_ub, b_ub = model.lp(sparse)
    # Interior point with crossover: an exact optimal vertex, not an interior estimate.
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method=LP_METHOD,
                  options={"time_limit": time_limit_s, "disp": False})
    shape = (len(model.pieces), a_ub.shape[0])
    if res.status == 2:
        return Bound(np.inf, ideal_ms, True, res.message, *shape)
    if res.status != 0:  # stopped early: no certified value, only the trivial bound
        return Bound(ideal_ms, ideal_ms, False, res.message, *shape)
    return Bound(ideal_ms + max(0.0, res.fun) / 1e3, ideal_ms, True, res.message, *shape)


def block_edges(duration_us: np.ndarray, excess_bytes: np.ndarray, num_blocks: int) -> np.ndarray:
    """First kernel of each block and N at the end: num_blocks stretches of about equal kernel
    time, each cut once more after its kernel most over budget (the kernel a copy-out must
    beat and a copy-in must follow: Note [Time-indexed relaxation]); at most 2 num_blocks."""
    n = len(duration_us)
    end_us = np.cumsum(duration_us) if duration_us.sum() > 0 else np.arange(1, n + 1, dtype=np.float64)
    targets = end_us[-1] * np.arange(1, num_blocks) / num_blocks
    cuts = np.unique(np.r_[0, np.searchsorted(end_us, targets, side="left") + 1, n].clip(0, n))
    worst = [lo + int(np.argmax(excess_bytes[lo:hi])) for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]
    return np.unique(np.r_[cuts, np.asarray(worst, dtype=np.int64) + 1])


class _BlockModel:
    def __init__(self, trace: Trace, inputs: PlannerInputs, num_blocks: int, steady_state: bool):
        self.n, self.inputs = trace.num_kernels, inputs
        duration_us = trace.duration_us.astype(np.float64) * inputs.kernel_time_scale  # as the simulator runs them
        self.ideal_us = float(duration_us.sum())
        excess = memory_curve(trace, inputs.headroom_bytes) - inputs.budget_bytes
        self.edges = block_edges(duration_us, excess, num_blocks)
        self.num_blocks = len(self.edges) - 1
        self.block_us = np.add.reduceat(duration_us, self.edges[:-1])
        self.block_of = np.repeat(np.arange(self.num_blocks), np.diff(self.edges))
        self.rep = self.edges[1:] - 1  # each block's memory row is at its last kernel
        self.need_mib = np.maximum(excess[self.rep], 0) / MIB
        r = rates(inputs)
        self.path_rate = {p: r.path(p) / MIB for p in ("d2s", "s2d", "d2h", "h2d")}  # MiB/us
        self.link_rate = {True: r.out / MIB, False: r.into / MIB, None: r.both / MIB}
        self.tiers = [t for t in TIERS if min(self.path_rate[OUT_PATH[t]], self.path_rate[IN_PATH[t]]) > 0]
        self.pieces = self._pieces(find_periods(trace), steady_state)
        self.classes = self._classes()
        covered = np.zeros(self.num_blocks)
        for cover in self.classes.values():
            for u, mib in cover.items():
                covered[u % self.num_blocks] += mib
        self.infeasible = bool(self.need_mib.sum() > 0 and (not self.tiers or (self.need_mib > covered * (1 + 1e-9)).any()))

    def _ublock(self, k: np.ndarray) -> np.ndarray:
        """Block of an unrolled kernel: iteration i + 1's blocks count on from num_blocks."""
        return self.block_of[k % self.n] + self.num_blocks * (k // self.n)

    def _pieces(self, p, steady_state: bool) -> list[tuple]:
        """(first and last kernel it can be away, copy-out's first block or -1, copy-in's last
        block or -1, MiB), unrolled (Note [Time-indexed relaxation])."""
        a, e, mib = p.start, p.end, p.nbytes / MIB
        keep = e - 1 >= a + 1
        a, e, mib = a[keep], e[keep], mib[keep]
        out_first, in_last = self._ublock(a + 1), self._ublock(e)
        # e >= N: the next use is in the next iteration, whose copy-in the replay never runs
        wraps = e >= self.n
        whole = ~wraps | steady_state
        pieces = list(zip(a[whole] + 1, e[whole] - 1, out_first[whole], in_last[whole], mib[whole]))
        if not steady_state:
            n, w = self.n, wraps
            pieces += list(zip(a[w] + 1, np.full(w.sum(), n - 1), out_first[w], np.full(w.sum(), -1), mib[w]))
            pieces += list(zip(np.zeros(w.sum(), dtype=np.int64), e[w] - n - 1, np.full(w.sum(), -1),
                               in_last[w] - self.num_blocks, mib[w]))
        return pieces

    def _classes(self) -> dict:
        """(copy-out's first block, copy-in's last block) -> {unrolled block: MiB covering its
        representative kernel}, over blocks that are over budget only."""
        classes = defaultdict(lambda: defaultdict(float))
        nb, n = self.num_blocks, self.n
        for first_k, last_k, out_first, in_last, mib in self.pieces:
            if last_k < first_k:
                continue
            for u in range(int(self._ublock(np.int64(first_k))), int(self._ublock(np.int64(last_k))) + 1):
                b, rep_k = u % nb, self.rep[u % nb] + n * (u // nb)
                if self.need_mib[b] > 0 and first_k <= rep_k <= last_k:
                    classes[(int(out_first), int(in_last))][u] += mib
        return {key: dict(cover) for key, cover in classes.items() if cover}

    def lp(self, sparse):
        """(c, A, b) of min c x s.t. A x <= b, x >= 0; x is the blocks' stalls S, then each
        class's O, R, z per tier."""
        lp = _Rows(self.num_blocks)
        z_at = defaultdict(list)  # block -> [(column, tier)]
        for (out_first, in_last), cover in self.classes.items():
            useful = sorted(cover)
            z_cols = {}
            for t in self.tiers:
                z = lp.columns(len(useful))
                z_cols[t] = z
                for u, col in zip(useful, z):
                    z_at[u % self.num_blocks].append((col, t))
                if out_first >= 0:
                    self._copy_side(lp, t, True, range(out_first, useful[-1] + 1), useful, z)
                if in_last >= 0:  # after the kernel: from the next block on
                    self._copy_side(lp, t, False, range(useful[0] + 1, in_last + 1), [u + 1 for u in useful], z)
            for j, u in enumerate(useful):  # a tensor is away on one tier at a time
                lp.row([z_cols[t][j] for t in self.tiers], [1.0] * len(self.tiers), cover[u])
        for b, cols in z_at.items():
            lp.row([c for c, _ in cols], [-1.0] * len(cols), -self.need_mib[b])
            host = [c for c, t in cols if t == "host"]
            if host:
                lp.row(host, [1.0] * len(host), self.inputs.host_mem_bytes / MIB)
        lp.capacity(self.block_us)
        return lp.build(sparse)

    def _copy_side(self, lp: "_Rows", tier: str, outbound: bool, blocks: range, bound_at: list, z: np.ndarray) -> None:
        """One direction's cumulative variables over `blocks`: monotone, each z at most the one
        at its block in bound_at, and their increments charged to each block's ledgers."""
        cum = lp.columns(len(blocks))
        ledgers = self._ledgers(tier, outbound)
        step = 1 if outbound else -1  # O grows with u; R shrinks with u
        for j in range(len(blocks)):
            prev = j - step  # the neighbour whose value this increment is taken from
            if 0 <= prev < len(blocks):
                lp.row([cum[prev], cum[j]], [1.0, -1.0], 0.0)
            phys = blocks[j] % self.num_blocks
            for ledger, rate in ledgers:
                lp.charge(phys, ledger, cum[j], 1.0 / rate)
                if 0 <= prev < len(blocks):
                    lp.charge(phys, ledger, cum[prev], -1.0 / rate)
        for u, col in zip(bound_at, z):
            lp.row([col, cum[u - blocks.start]], [1.0, -1.0], 0.0)

    def _ledgers(self, tier: str, outbound: bool) -> list[tuple]:
        """The simulator's caps a copy takes from (Note [Bandwidth model]): its path, its link
        direction, and both directions together where the link is shared."""
        path = OUT_PATH[tier] if outbound else IN_PATH[tier]
        out = [(path, self.path_rate[path]), ("out" if outbound else "in", self.link_rate[outbound])]
        if np.isfinite(self.link_rate[None]):
            out.append(("both", self.link_rate[None]))
        return out


class _Rows:
    """Sparse rows assembled as coordinates; capacity rows kept apart until the end."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.num_cols = num_blocks  # the stalls S_b come first
        self.r, self.c, self.v, self.b = [], [], [], []
        self.cap = defaultdict(lambda: ([], []))  # (block, ledger) -> (columns, us per MiB)

    def columns(self, count: int) -> np.ndarray:
        cols = np.arange(self.num_cols, self.num_cols + count)
        self.num_cols += count
        return cols

    def row(self, cols, vals, rhs: float) -> None:
        i = len(self.b)
        self.r += [i] * len(cols)
        self.c += list(cols)
        self.v += list(vals)
        self.b.append(rhs)

    def charge(self, block: int, ledger: str, col: int, us_per_mib: float) -> None:
        cols, vals = self.cap[(block, ledger)]
        cols.append(col)
        vals.append(us_per_mib)

    def capacity(self, block_us: np.ndarray) -> None:
        """Per block and ledger: its copies' time at the ledger's rate <= D_b + S_b."""
        for (block, _), (cols, vals) in sorted(self.cap.items()):
            self.row(list(cols) + [block], list(vals) + [-1.0], float(block_us[block]))

    def build(self, sparse):
        a = sparse.csr_array((self.v, (self.r, self.c)), shape=(len(self.b), self.num_cols))
        a.sum_duplicates()
        c = np.zeros(self.num_cols)
        c[:self.num_blocks] = 1.0  # minimize the stalls
        return c, a, np.asarray(self.b, dtype=np.float64)
