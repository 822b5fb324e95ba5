"""Note [Multi-tensor ops]: the walk runs a fused or foreach optimizer step in chunks, each its
own kernel, and the model trains exactly as without the walk."""

import pytest
import torch

from teraio import walk as walk_module
from teraio.formats.trace import Kind
from teraio.walk import OpWalk, WalkListener


class KernelLog(WalkListener):
    def __init__(self):
        self.ops = []
        self.inputs = []

    def before_op(self, k, func, inputs):
        self.ops.append(func._overloadpacket.__name__)
        self.inputs.append(sum(r.nbytes for r in inputs))


def train(steps, optimizer_kwargs, walk=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(6)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, **optimizer_kwargs)
    data = torch.randn(8, 32)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        if walk is None:
            model(data).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            continue
        with walk:
            model(data).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("optimizer_kwargs", [{"fused": True}, {"foreach": True}], ids=["fused", "foreach"])
def test_multi_tensor_ops_run_in_chunks_and_train_exactly(monkeypatch, optimizer_kwargs):
    chunk_bytes = 4 * 32 * 33 * 4  # about one Linear's weight and bias in each of 4 lists
    monkeypatch.setattr(walk_module, "MULTI_TENSOR_CHUNK_BYTES", chunk_bytes)
    log = KernelLog()
    walk = OpWalk(log, "cpu")
    walk.install_hooks()
    try:
        walked = train(3, optimizer_kwargs, walk)
    finally:
        walk.remove_hooks()
    plain = train(3, optimizer_kwargs)
    assert all(torch.equal(a, b) for a, b in zip(walked, plain))  # bit for bit
    step_op = "_fused_adamw_" if optimizer_kwargs.get("fused") else "_foreach_addcdiv_"
    per_step = log.ops.count(step_op) // 3
    assert per_step >= 6  # 12 parameters (6 weights, 6 biases): chunked, not one kernel
    step_inputs = [n for op, n in zip(log.ops, log.inputs) if op == step_op]
    assert max(step_inputs) <= 2 * chunk_bytes  # no kernel needs the whole optimizer state


class StepInputKinds(WalkListener):
    """(storage key, kind) of every input of the multi-tensor ops inside optimizer steps."""

    def __init__(self):
        self.walk = None
        self.seen = []

    def before_op(self, k, func, inputs):
        if self.walk.in_optimizer and walk_module.is_multi_tensor(func):
            self.seen += [(r.key, r.kind) for r in inputs]


@pytest.mark.parametrize("optimizer_kwargs", [{"fused": True}, {"foreach": True}], ids=["fused", "foreach"])
def test_first_step_names_optimizer_state_before_its_update_kernels(optimizer_kwargs):
    """The runtime may only evict named storages: AdamW's state, made by the first step, must
    be known as optimizer state by the time that step's update kernels read it, not only after
    the step (a budget smaller than the state could not be kept in iteration 0 otherwise)."""
    log = StepInputKinds()
    walk = log.walk = OpWalk(log, "cpu")
    walk.install_hooks()
    model = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(4)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, **optimizer_kwargs)
    try:
        with walk:
            model(torch.randn(8, 32)).square().mean().backward()
            optimizer.step()
    finally:
        walk.remove_hooks()
    state_keys = {value.untyped_storage()._cdata for state in optimizer.state.values()
                  for key, value in state.items() if key in ("exp_avg", "exp_avg_sq")}
    kinds = {kind for key, kind in log.seen if key in state_keys}
    assert len(state_keys) == 16 and kinds == {Kind.optimizer_state}
