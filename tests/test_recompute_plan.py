"""Planned recomputation (teraio_plan/recompute.py, Note [Choosing recomputation]): where the link
is the bottleneck the plan drops activations whose op can be replayed and makes them again just
before their next use, and the simulator charges the replay instead of the copies.

Through the real CLI on a trace profiled from the bundled example (CPU), at a third of its peak
with a slow host link (0.05 GB/s: moves alone stall there).
"""

import json

import numpy as np
import pytest

from teraio.formats.plan import PlanEntry, load_plan
from teraio.formats.trace import Kind, live_bytes_per_kernel, load_trace
from teraio_plan import make_plan, planner_inputs, sweep
from teraio_plan.simulator import simulate
from cli_helpers import EXAMPLE, PYTHON, ok, teraio
from plan_helpers import MiB, T, make_trace

ARGS = ("--device", "cpu", "--steps", "6")
DENIED = ("dropout", "rand", "bernoulli", "normal", "uniform", "index_add", "scatter_add", "index_put",
          "embedding_dense_backward", "_scaled_dot_product", "attention")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recompute")
    ok(teraio("profile", "-o", tmp / "trace.msgpack", "--", PYTHON, EXAMPLE, *ARGS, cwd=tmp))
    peak_bytes = int(live_bytes_per_kernel(load_trace(tmp / "trace.msgpack")).max())
    plan_args = (tmp / "trace.msgpack", "--gpu-mem", peak_bytes // 3, "--ssds", 0, "--host-mem", peak_bytes,
                 "--host-gbps", 0.05, "--json")
    summary = json.loads(ok(teraio("plan", *plan_args, "-o", tmp / "replay.json", cwd=tmp)).stdout)
    moves = json.loads(ok(teraio("plan", *plan_args, "--no-recompute", "-o", tmp / "moves.json", cwd=tmp)).stdout)
    return tmp, summary, moves


def _uses(trace, t):
    s = slice(trace.use_offsets[t], trace.use_offsets[t + 1])
    return trace.use_kernels[s], trace.use_writes[s]


def _inputs(trace, t):
    """The tensors t's producing op read: used at its kernel, not made there."""
    b = trace.born[t]
    return [x for x in range(trace.num_tensors) if x != t and trace.born[x] != b and b in _uses(trace, x)[0]]


def _check_replayable(trace, t, entry, read_at=frozenset()):
    """The candidate rule, read off the trace on its own; read_at: the kernels where other
    replays read t (a chained piece of t ends at one of them, not at a use of its own)."""
    b, a, e = entry.produced_at, entry.offload_after, entry.needed_by
    op = trace.op_name(b)
    assert trace.kind[t] == Kind.activation and trace.born[t] == b and not entry.wraps
    assert not op.split(".")[0].endswith("_") and not any(word in op for word in DENIED), op
    uses, writes = _uses(trace, t)
    assert not ((uses > a) & (uses < e)).any() and (e in uses or e in read_at)    # idle over the gap
    assert a in uses or a in read_at
    assert not writes[(uses > b) & (uses <= a)].any()                  # still the op's bytes at a
    inputs = _inputs(trace, t)
    for x in range(trace.num_tensors):
        x_uses, x_writes = _uses(trace, x)
        assert not x_writes[x_uses == b].any()                        # the op writes nothing in place
    for x in inputs:
        x_uses, x_writes = _uses(trace, x)
        assert not x_writes[(x_uses > b) & (x_uses < e)].any()         # inputs unwritten until the replay
        assert trace.born[x] < 0 or (trace.born[x] <= b and trace.freed[x] > e)   # and alive then
    return inputs


def _read_at(trace, replays, index):
    """Tensor -> the kernels where a planned replay reads it."""
    read_at = {}
    for entry in replays:
        for x in _inputs(trace, index[entry.tensor]):
            read_at.setdefault(x, set()).add(entry.needed_by)
    return read_at


def _period_covers(entry, k: int) -> bool:
    if entry.wraps:
        return k > entry.offload_after or k < entry.needed_by
    return entry.offload_after < k < entry.needed_by


def test_replays_are_planned_where_moves_stall_and_each_one_is_safe(work):
    tmp, summary, _ = work
    trace, plan = load_trace(tmp / "trace.msgpack"), load_plan(tmp / "replay.json")
    replays = [e for e in plan.entries if e.tier == "recompute"]
    assert replays and summary["num_recompute_entries"] == len(replays)
    index = {tensor_id: i for i, tensor_id in enumerate(trace.tensor_id)}
    read_at = _read_at(trace, replays, index)
    for entry in replays:
        assert entry.offload_by == entry.offload_after and entry.prefetch_at == entry.needed_by
        t = index[entry.tensor]
        for x in _check_replayable(trace, t, entry, read_at.get(t, set())):
            # the replay reads its inputs at needed_by: no move or replay has one away then
            assert not any(_period_covers(m, entry.needed_by) for m in plan.entries if m.tensor == trace.tensor_id[x])
    assert plan.header.prediction.recompute_bytes_per_iteration == sum(e.nbytes for e in replays)
    assert plan.header.prediction.recompute_ms_per_iteration > 0


def test_a_replayed_input_of_a_replay_is_replayed_up_to_that_replay(work):
    """Chains (Note [Chains of replays]): the example at a third of its peak replays inputs of
    replays too, each one up to the kernel of the replay that reads it, pieces of one tensor's
    gap never overlapping."""
    tmp, _, _ = work
    trace, plan = load_trace(tmp / "trace.msgpack"), load_plan(tmp / "replay.json")
    replays = [e for e in plan.entries if e.tier == "recompute"]
    index = {tensor_id: i for i, tensor_id in enumerate(trace.tensor_id)}
    by_tensor = {}
    for entry in replays:
        by_tensor.setdefault(index[entry.tensor], []).append(entry)
    chained = [(entry, x) for entry in replays for x in _inputs(trace, index[entry.tensor])
               if any(r.needed_by == entry.needed_by for r in by_tensor.get(x, ()))]
    assert chained
    for pieces in by_tensor.values():
        spans = sorted((e.offload_after, e.needed_by) for e in pieces)
        assert all(e0 <= a1 for (_, e0), (a1, _) in zip(spans, spans[1:]))
    # a piece that ends at no use of its own ends where a replay reads it: made again for that one
    uses = {t: set(_uses(trace, t)[0].tolist()) for t in by_tensor}
    read_at = _read_at(trace, replays, index)
    ends_at_a_read = [e for t, es in by_tensor.items() for e in es if e.needed_by not in uses[t]]
    assert ends_at_a_read
    assert all(e.reason.endswith(f"for the replay that reads it at kernel {e.needed_by}") for e in ends_at_a_read)
    assert all(e.needed_by in uses[t] | read_at.get(t, set()) for t, es in by_tensor.items() for e in es)


def test_replaying_is_predicted_no_slower_and_no_recompute_gives_moves_only(work):
    tmp, summary, moves = work
    assert not any(e.tier == "recompute" for e in load_plan(tmp / "moves.json").entries)
    assert moves["recompute_bytes_per_iteration"] == 0 and not load_plan(tmp / "moves.json").header.inputs.recompute
    assert summary["fits"] and summary["predicted_iteration_ms"] <= moves["predicted_iteration_ms"]
    assert summary["predicted_iteration_ms"] < moves["predicted_iteration_ms"]   # at 0.05 GB/s replays pay


def test_inspect_diff_and_view_show_the_replays(work):
    tmp, _, _ = work
    entry = next(e for e in load_plan(tmp / "replay.json").entries if e.tier == "recompute")
    assert entry.reason.startswith("recompute: replay ") and f"at kernel {entry.produced_at}" in entry.reason
    shown = ok(teraio("inspect", tmp / "replay.json", cwd=tmp)).stdout
    replays = sum(1 for e in load_plan(tmp / "replay.json").entries if e.tier == "recompute")
    assert "made again by replaying" in shown and f"in {replays} replays" in " ".join(shown.split())
    assert "recompute (kernel" in ok(teraio("diff", tmp / "moves.json", tmp / "replay.json", cwd=tmp)).stdout
    diff = json.loads(ok(teraio("diff", tmp / "moves.json", tmp / "replay.json", "--json", cwd=tmp)).stdout)
    added = [e for e in diff["added"] if e["tier"] == "recompute"]
    assert {(e["tensor"], e["produced_at"]) for e in added} >= {(entry.tensor, entry.produced_at)}
    ok(teraio("view", tmp / "trace.msgpack", tmp / "replay.json", "-o", tmp / "view.html", cwd=tmp))
    assert "recompute" in (tmp / "view.html").read_text()   # the timeline draws replays as their own tier


def _one_replay_plan():
    """A weight w used at kernels 1 and 8; x = op(w) made at kernel 1 (300 us), used again at 8;
    y lives over kernels 3-5."""
    durations = [100.0] * 10
    durations[1] = 300.0
    trace = make_trace(durations, [T("w", 64 * MiB, [1, 8]),
                                   T("x", 256 * MiB, [1, 8], Kind.activation, born=1, freed=9),
                                   T("y", 128 * MiB, [3, 5], Kind.activation, born=3, freed=6)],
                       ops=["aten::op"] * 10)
    trace.use_writes = np.zeros(len(trace.use_kernels), dtype=bool)
    inputs = planner_inputs(trace, gpu_mem_bytes=2**40, num_ssds=0, host_mem_bytes=2**30)
    plan = make_plan(trace, inputs)
    return trace, plan


def test_the_simulator_frees_a_replayed_tensor_and_charges_its_kernel():
    trace, plan = _one_replay_plan()
    assert not plan.entries  # nothing over budget: nothing planned
    entry = {"tensor": "x", "name": "x", "kind": "activation", "nbytes": 256 * MiB, "tier": "recompute",
             "offload_after": 1, "offload_by": 1, "prefetch_at": 8, "needed_by": 8, "wraps": False,
             "produced_at": 1, "reason": "test"}
    replayed = plan.model_copy(update={"entries": [PlanEntry(**entry)]})
    plain, sim = simulate(trace, plan), simulate(trace, replayed)
    assert sim.iteration_ms == pytest.approx(plain.iteration_ms + 0.3)
    assert sim.replay_ms == pytest.approx(0.3) and sim.stall_ms == pytest.approx(0.0)
    assert not any(sim.bytes_by_path.values())
    assert (plain.memory_bytes - sim.memory_bytes).tolist() == [0, 0] + [256 * MiB] * 6 + [0, 0]


def test_a_trace_without_write_information_plans_no_replay():
    """Traces written before use_writes existed (the committed ones): writes unknown, no replay."""
    trace, _ = _one_replay_plan()
    trace.use_writes = np.zeros(0, dtype=bool)
    inputs = planner_inputs(trace, gpu_mem_bytes=320 * MiB, num_ssds=0, host_mem_bytes=2**30, host_gbps=0.01)
    assert not any(e.tier == "recompute" for e in make_plan(trace, inputs).entries)
    trace.use_writes = np.zeros(len(trace.use_kernels), dtype=bool)
    assert any(e.tier == "recompute" for e in make_plan(trace, inputs).entries)



@pytest.mark.parametrize("op", ["poisson", "_standard_gamma", "binomial", "exponential", "_cudnn_rnn"])
def test_an_op_that_draws_random_numbers_is_never_replayed(op):
    """Replayed, it would draw other numbers (the plan chose torch.poisson's output before):
    training would part from the plain run. A deterministic op in its place is replayed."""
    durations = [100.0] * 10
    durations[1] = 300.0
    tensors = [T("w", 64 * MiB, [1, 8]), T("x", 256 * MiB, [1, 8], Kind.activation, born=1, freed=9),
               T("y", 128 * MiB, [3, 5], Kind.activation, born=3, freed=6)]
    for name, replayed in ((op, False), ("sigmoid", True)):
        trace = make_trace(durations, tensors, ops=["mm", name] + ["mm"] * 8)
        trace.use_writes = np.zeros(len(trace.use_kernels), dtype=bool)
        inputs = planner_inputs(trace, gpu_mem_bytes=320 * MiB, num_ssds=0, host_mem_bytes=2**30, host_gbps=0.01)
        assert any(e.tier == "recompute" for e in make_plan(trace, inputs).entries) == replayed, name


def _chain_trace():
    """A weight w; h = op(w) at kernel 1 (300 us), used at 2 and 10; g = op(h) at kernel 2
    (200 us), used again at 8; y over kernels 3-6 takes the job over 600 MiB there."""
    durations = [100.0] * 12
    durations[1], durations[2] = 300.0, 200.0
    trace = make_trace(durations, [T("w", 64 * MiB, [1, 10]),
                                   T("h", 256 * MiB, [1, 2, 10], Kind.activation, born=1, freed=11),
                                   T("g", 256 * MiB, [2, 8], Kind.activation, born=2, freed=9),
                                   T("y", 128 * MiB, [3, 6], Kind.activation, born=3, freed=7)],
                       ops=["aten::op"] * 12)
    trace.use_writes = np.zeros(len(trace.use_kernels), dtype=bool)
    return trace


def test_an_input_of_a_replay_is_replayed_just_before_it_and_counted_back_from_there():
    """g's replay at 8 reads h, idle from 2 to 10: h is replayed up to 8 (a chain), both
    replays are charged before kernel 8, and h is on the device again from 8 on."""
    trace = _chain_trace()
    inputs = planner_inputs(trace, gpu_mem_bytes=600 * MiB, num_ssds=0, host_mem_bytes=2**30, host_gbps=0.01)
    plan = make_plan(trace, inputs)
    replays = {(e.tensor, e.offload_after, e.needed_by) for e in plan.entries if e.tier == "recompute"}
    assert replays == {("g", 2, 8), ("h", 2, 8)}   # h's piece 8-10 is over nothing: it stays
    sim, plain = simulate(trace, plan), simulate(trace, plan.model_copy(update={"entries": []}))
    assert plan.header.prediction.fits and sim.replay_ms == pytest.approx(0.5) and sim.stall_ms == pytest.approx(0.0)
    assert (plain.memory_bytes - sim.memory_bytes).tolist() == [0, 0, 0] + [512 * MiB] * 5 + [0] * 4


def test_the_roofline_sweep_plans_replays_as_teraio_plan_does(work):
    """The sweep (`teraio plan --sweep`) plans each bandwidth as `teraio plan` would: over slow
    links, where replays pay, its predicted share of ideal is above a moves-only sweep's, and
    never below it by more than a tie (Note [Ties between plans]: a plan within TIE_SHARE of
    the fastest with fewer copies is kept)."""
    from teraio_plan.make import TIE_SHARE

    tmp, _, _ = work
    trace = load_trace(tmp / "trace.msgpack")
    budget = int(live_bytes_per_kernel(trace).max()) // 3
    slow_gbps = (0.02, 0.05, 0.1, 1.0)
    with_replays = sweep(trace, planner_inputs(trace, gpu_mem_bytes=budget), slow_gbps)
    moves_only = sweep(trace, planner_inputs(trace, gpu_mem_bytes=budget, recompute=False), slow_gbps)
    pairs = [(a.share_of_ideal, b.share_of_ideal) for a, b in zip(with_replays, moves_only) if a.fits]
    assert pairs and all(a >= b / (1 + TIE_SHARE) - 1e-9 for a, b in pairs) and any(a > b for a, b in pairs)
