"""Planned recomputation: which idle activations are made again by one replay of their op.

Note [Choosing recomputation]
An activation t, born at kernel b (the op that made it), idle between its uses a and e
(a period as periods.py finds them, not wrapping) can leave the device after a without a
copy and be made again just before e by running the op of kernel b once more, when that
replay writes the same bytes:
  - the op draws no random numbers (dropout, rand, ...: RANDOM_OPS) and is not one whose
    GPU kernels accumulate in a nondeterministic order (index_add, scatter_add, index_put,
    whose accumulate flag the trace does not show, embedding_dense_backward); attention
    (_scaled_dot_product*, anything "attention") is denied too: on the H200 traces its
    replay costs more than its round trip over the link (docs/planner.md);
  - its kernel runs no other ops under the caller's autocast state (AUTOCAST_INSIDE_OPS: a
    replay runs with autocast off);
  - it writes nothing in place: its name is not an in-place one (ends with "_") and no use at
    kernel b is a write (the trace's use_writes);
  - no use of t between b and a wrote it (the bytes at a are still the op's output);
  - every input (a tensor used at b that b did not make) is unwritten from b up to e and
    alive at e (a global, or freed after e). The replay needs the inputs on the device at e:
    each chosen entry adds a use of every input at e (with_replays), so the move planner
    splits their idle periods there and never plans them away across the replay; an input
    that is replayed itself is made again up to e first (Note [Chains of replays]).
Traces without use_writes (written before it) have no candidates: nothing says which uses wrote.

Which candidates: a replay costs the producer's kernel time on the device; a move costs the
round trip on the link, 2 x nbytes over the fastest tier path (bandwidth.py). Only gaps that
overlap kernels over the budget can help. Candidates are ranked by link time saved per replay
time, and make.py plans a few sets (none, and those above each of RATIO_THRESHOLDS) jointly
with the moves and keeps the one the simulator predicts fastest, a tie going to the plan with
fewer copies (Note [Ties between plans] in make.py), since neither the link nor the budget
alone says how much replay time pays.

Note [Chains of replays]
A replay at e reads its inputs there; an input i chosen for replay over e (idle from a_i to
e_i > e, a matmul output a `mul` reads, say) is made again first: its gap is cut at e into
[a_i, e], a recompute entry whose needed_by is e, and [e, e_i], another one (the runtime
replays i when the replay at e asks for its inputs, and keeps i's call for as many replays as
the plan has entries for it: teraio_run/agent.py). Each piece is a replay of its own whose
inputs are read at its end, so cuts run down the chain: `chains` cuts the later-born tensors
first (a replay reads only tensors born before its own). A piece over no kernel above the
budget is not replayed: the tensor stays on the device there (the pseudo-use at e splits its
period for the moves, as any input's). The cut costs i's kernel once more, so a candidate is
taken when the link time it saves per replay time it adds with its chains (every cut it
makes, down the chain) is at or above the threshold. Every piece keeps the rules above: the
inputs were unwritten and alive up to e_i > e, and the bytes at e are those the replay made.
The simulator charges each replay's kernel before its needed_by, the chain's together before
e, and counts i on the device from e on (Note [Replays] in simulator.py).
"""

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from teraio.formats.plan import PlanEntry, PlannerInputs
from teraio.formats.trace import AUTOCAST_INSIDE_OPS, Kind, Trace
from teraio.units import format_bytes
from teraio_plan.bandwidth import path_bytes_per_us
from teraio_plan.memory import memory_curve
from teraio_plan.periods import find_periods
from teraio_plan.planner import MIN_OFFLOAD_BUDGET_SHARE, MIN_OFFLOAD_BYTES

# By name (the planner has no torch): the ops ATen tags nondeterministic_seeded, every op taking a Generator.
RANDOM_OPS = ("dropout", "native_dropout", "bernoulli", "rand", "randn", "randint", "normal", "uniform",
              "multinomial", "randperm", "poisson", "binomial", "_standard_gamma", "_sample_dirichlet",
              "exponential", "geometric", "cauchy", "rrelu", "_cudnn_rnn", "miopen_rnn", "rnn_relu", "rnn_tanh",
              "lstm", "gru")
NONDETERMINISTIC_OPS = ("index_add", "scatter_add", "index_put", "embedding_dense_backward", "_scaled_dot_product",
                        "attention")
# Ops that write running statistics their schema does not mark (UNMARKED_WRITES in teraio/walk.py):
# a replay would update them twice. Traces since the walk counts those writes exclude them anyway.
STATEFUL_OPS = ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "_batch_norm_impl_index",
                "batch_norm_update_stats")
# Link time saved per replay time: the sets make.py plans and compares (Note [Choosing recomputation]).
RATIO_THRESHOLDS = (20.0, 5.0, 2.0)


@dataclass(frozen=True)
class Candidate:
    tensor: int                # index into the trace's tensor columns
    offload_after: int         # a: last use before the gap
    needed_by: int             # e: next use, < num_kernels
    produced_at: int           # b: the kernel that made it
    inputs: tuple[int, ...]    # tensors used at b that b did not make
    nbytes: int
    replay_us: float
    link_us: float             # the round trip a replay saves

    @property
    def ratio(self) -> float:
        return self.link_us / max(self.replay_us, 1e-3)


def replayable_op(op: str) -> bool:
    """The op can run again and give the same bytes, as far as its name tells."""
    base = op.removeprefix("aten.").split(".")[0]
    if base.endswith("_") or base in STATEFUL_OPS or base in AUTOCAST_INSIDE_OPS:   # in place, state written,
        return False                                                                # or autocast inside
    return not any(word in op for word in RANDOM_OPS + NONDETERMINISTIC_OPS)


def find_candidates(trace: Trace, inputs: PlannerInputs) -> list[Candidate]:
    """Every gap Note [Choosing recomputation] allows, over the budget somewhere, best ratio first."""
    if not inputs.recompute or not len(trace.use_writes) or not trace.num_kernels:
        return []
    link_bytes_per_us = _link_bytes_per_us(inputs)
    if link_bytes_per_us <= 0:
        return []
    over_prefix = _over_prefix(trace, inputs)
    floor = min(MIN_OFFLOAD_BYTES, inputs.budget_bytes * MIN_OFFLOAD_BUDGET_SHARE)
    p = find_periods(trace)
    keep = ((trace.kind[p.tensor] == Kind.activation) & (trace.born[p.tensor] >= 0) & (p.end < trace.num_kernels)
            & (p.nbytes >= floor))
    made_by = _inputs_by_kernel(trace)
    found = []
    for i in np.flatnonzero(keep):
        t, a, e = int(p.tensor[i]), int(p.start[i]), int(p.end[i])
        if over_prefix[e] - over_prefix[a + 1] == 0:
            continue  # nothing over the budget while it would be away
        b = int(trace.born[t])
        ins = made_by.get(b)
        if ins is None or not replayable_op(trace.op_name(b)) or _written(trace, t, b, a + 1):
            continue
        if all(_input_ok(trace, x, b, e) for x in ins):
            replay_us = float(trace.duration_us[b]) * inputs.kernel_time_scale
            found.append(Candidate(t, a, e, b, ins, int(p.nbytes[i]), replay_us,
                                   2 * int(p.nbytes[i]) / link_bytes_per_us))
    return sorted(found, key=lambda c: (-c.ratio, c.offload_after, c.tensor))


def _over_prefix(trace: Trace, inputs: PlannerInputs) -> np.ndarray:
    """[k]: how many kernels before k the job's own curve has over the budget."""
    over = memory_curve(trace, inputs.headroom_bytes) > inputs.budget_bytes
    return np.concatenate(([0], np.cumsum(over)))


def _link_bytes_per_us(inputs: PlannerInputs) -> float:
    """The fastest tier path a move would take, one direction (bandwidth.py)."""
    on = [t for t, used in (("host", inputs.host_mem_bytes > 0), ("ssd", inputs.num_ssds > 0)) if used]
    return max((min(path_bytes_per_us(inputs, t)) for t in on), default=0.0)


def _inputs_by_kernel(trace: Trace) -> dict[int, tuple[int, ...]]:
    """Kernel -> the tensors it used that it did not make; absent where some use there wrote."""
    owner = np.repeat(np.arange(trace.num_tensors), np.diff(trace.use_offsets))
    kernel = trace.use_kernels
    by_kernel: dict[int, list[int]] = defaultdict(list)
    wrote = set(kernel[trace.use_writes].tolist())
    made = trace.born[owner] == kernel
    for t, k in zip(owner[~made].tolist(), kernel[~made].tolist()):
        by_kernel[k].append(t)
    births = set(trace.born[trace.born >= 0].tolist())
    return {k: tuple(sorted(set(by_kernel.get(k, ())))) for k in births if k not in wrote}


def _written(trace: Trace, t: int, lo: int, hi: int) -> bool:
    """Whether a use of t at kernels (lo, hi) wrote it."""
    s = slice(trace.use_offsets[t], trace.use_offsets[t + 1])
    uses = trace.use_kernels[s]
    return bool(trace.use_writes[s][(uses > lo) & (uses < hi)].any())


def _input_ok(trace: Trace, x: int, b: int, e: int) -> bool:
    # an intermediate used at b before its own birth is last iteration's storage: not the same bytes at e
    alive = trace.born[x] < 0 or (trace.born[x] <= b and trace.freed[x] > e)
    return bool(alive) and not _written(trace, x, b, e)


def choose(candidates: list[Candidate], min_ratio: float, over_prefix: np.ndarray) -> list[Candidate]:
    """The candidates at or above min_ratio, best first, as the replays they take with their
    chains (Note [Chains of replays]); one whose chain costs more than the ratio allows is left out."""
    chosen: list[Candidate] = []
    replay_us = 0.0
    for c in candidates:
        if c.ratio < min_ratio:
            break
        trial_us = sum(p.replay_us for p, _, _ in _cut(chosen + [c], over_prefix))
        if trial_us <= replay_us or c.link_us / (trial_us - replay_us) >= min_ratio:
            chosen.append(c)
            replay_us = trial_us
    return chains(chosen, over_prefix)


def chains(chosen: list[Candidate], over_prefix: np.ndarray) -> list[Candidate]:
    """The replays the chosen gaps take: one per piece (Note [Chains of replays])."""
    pieces = [replace(c, offload_after=a, needed_by=e) for c, a, e in _cut(chosen, over_prefix)]
    return sorted(pieces, key=lambda p: (p.offload_after, p.tensor))


def _cut(chosen: list[Candidate], over_prefix: np.ndarray) -> list[tuple[Candidate, int, int]]:
    """Each chosen gap cut at every kernel where a replay reads its tensor, as (candidate, a, e);
    the pieces over no kernel above the budget left out (the tensor stays there)."""
    by_tensor: dict[int, list[Candidate]] = defaultdict(list)
    for c in chosen:
        by_tensor[c.tensor].append(c)
    read_at: dict[int, set[int]] = defaultdict(set)
    pieces = []
    # A replay reads tensors born before its own: the later-born first, each tensor's readers known.
    for t in sorted(by_tensor, key=lambda t: -by_tensor[t][0].produced_at):
        for c in by_tensor[t]:
            cuts = sorted(k for k in read_at[t] if c.offload_after < k < c.needed_by)
            bounds = [c.offload_after, *cuts, c.needed_by]
            for a, e in zip(bounds, bounds[1:]):
                if over_prefix[e] - over_prefix[a + 1] == 0:
                    continue
                pieces.append((c, a, e))
                for x in c.inputs:
                    read_at[x].add(e)
    return pieces


def candidate_sets(trace: Trace, inputs: PlannerInputs) -> list[list[Candidate]]:
    """No replay, then the chosen sets of each threshold, each set once."""
    candidates = find_candidates(trace, inputs)
    sets, seen = [[]], {()}
    if not candidates:
        return sets
    over_prefix = _over_prefix(trace, inputs)
    for threshold in RATIO_THRESHOLDS:
        chosen = choose(candidates, threshold, over_prefix)
        key = tuple((c.tensor, c.offload_after) for c in chosen)
        if key not in seen:
            seen.add(key)
            sets.append(chosen)
    return sets


def entries(trace: Trace, chosen: list[Candidate]) -> list[PlanEntry]:
    return [PlanEntry(
        tensor=trace.tensor_id[c.tensor], name=trace.tensor_name[c.tensor], kind=Kind.activation.name,
        nbytes=c.nbytes, tier="recompute", offload_after=c.offload_after, offload_by=c.offload_after,
        prefetch_at=c.needed_by, needed_by=c.needed_by, wraps=False, produced_at=c.produced_at,
        reason=(f"recompute: replay {trace.op_name(c.produced_at)} at kernel {c.produced_at} "
                f"({c.replay_us / 1e3:.3g} ms) instead of 2 x {format_bytes(c.nbytes)} over the link "
                f"({c.link_us / 1e3:.3g} ms){_chained(trace, c)}")) for c in chosen]


def _chained(trace: Trace, c: Candidate) -> str:
    """Where a piece ends at no use of its own, the replay there reads it (Note [Chains of replays])."""
    return "" if c.needed_by in trace.uses(c.tensor) else f", for the replay that reads it at kernel {c.needed_by}"


def with_replays(trace: Trace, chosen: list[Candidate]) -> Trace:
    """The trace as the move planner must see it under these replays: each input used again at
    its replay's kernel, and each recomputed tensor two storages, one that dies after a and one
    born at e (same id), so nothing is live or movable over the gap."""
    if not chosen:
        return trace
    owner = np.repeat(np.arange(trace.num_tensors), np.diff(trace.use_offsets))
    added = [(x, c.needed_by) for c in chosen for x in c.inputs]
    owner = np.concatenate((owner, np.asarray([x for x, _ in added], dtype=np.int64)))
    kernel = np.concatenate((trace.use_kernels, np.asarray([k for _, k in added], dtype=np.int64)))
    writes = np.concatenate((trace.use_writes, np.zeros(len(added), dtype=bool)))
    columns = {name: list(getattr(trace, name)) for name in ("tensor_id", "tensor_name", "dtype", "shape")}
    arrays = {name: getattr(trace, name).tolist() for name in ("kind", "nbytes", "born", "freed", "movable_other")}
    gaps: dict[int, list[Candidate]] = defaultdict(list)
    for c in chosen:
        gaps[c.tensor].append(c)
    num_k = trace.num_kernels
    for t, cs in gaps.items():
        cs.sort(key=lambda c: c.offload_after)
        rows = np.flatnonzero(owner == t)
        unrolled = np.where(kernel[rows] < trace.born[t], kernel[rows] + num_k, kernel[rows])
        piece = np.searchsorted([c.needed_by for c in cs], unrolled, side="right")
        last_freed = arrays["freed"][t]
        arrays["freed"][t] = cs[0].offload_after + 1
        for j, c in enumerate(cs, start=1):
            new = len(arrays["nbytes"])
            for name in columns:
                columns[name].append(columns[name][t])
            for name in ("kind", "nbytes") + (("movable_other",) if arrays["movable_other"] else ()):
                arrays[name].append(arrays[name][t])
            arrays["born"].append(c.needed_by)
            arrays["freed"].append(cs[j].offload_after + 1 if j < len(cs) else last_freed)
            owner[rows[piece == j]] = new
    order = np.lexsort((kernel, owner))
    counts = np.bincount(owner, minlength=len(arrays["nbytes"]))
    return replace(trace, **columns, kind=np.asarray(arrays["kind"], dtype=trace.kind.dtype),
                   nbytes=np.asarray(arrays["nbytes"], dtype=np.int64),
                   born=np.asarray(arrays["born"], dtype=np.int64), freed=np.asarray(arrays["freed"], dtype=np.int64),
                   movable_other=np.asarray(arrays["movable_other"], dtype=bool),
                   use_offsets=np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
                   use_kernels=kernel[order], use_writes=writes[order])
