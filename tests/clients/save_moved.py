"""An MLP trained with AdamW that checkpoints with torch.save between steps, when a plan has
moved weights and optimizer state out: the checkpoint must hold their true values, tensors
that share a storage must still share it, and training goes on exactly. Writes the losses, the
checkpoint, and how many of the saved storages were out of device memory before and after it.
A second file saves a tensor subclass and a tensor with a Python attribute over moved storages
(fastai's Learner holds such tensors), and a sparse tensor: they must hold their true bytes too.
"""

import argparse
import json

import torch

WIDTH, DEPTH, BATCH = 256, 6, 32


class Tagged(torch.Tensor):
    """A tensor subclass with nothing of its own, as fastai's TensorBase."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--save-at", type=int, default=5)
    parser.add_argument("--out", default="save_moved.json")
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
                                  for _ in range(DEPTH)]).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, target = torch.randn(BATCH, WIDTH).to(args.device), torch.randn(BATCH, WIDTH).to(args.device)
    losses, out_at_save, out_after_save, extras_out_at_save, extras = [], None, None, None, None
    for step in range(args.steps):
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step == 0:
            extras = _subclassed_views(optimizer)
        if step == args.save_at:
            _let_copies_finish(args.device)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "weight_and_rows": [model[0][0].weight, model[0][0].weight[:3]]}  # one storage, twice
            out_at_save = _out(state)
            torch.save(state, args.checkpoint)
            out_after_save = _out(state)
            extras_out_at_save = _out(extras)
            torch.save(extras, args.checkpoint + ".extras")
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "out_at_save": out_at_save, "out_after_save": out_after_save,
                   "extras_out_at_save": extras_out_at_save}, f)


def _subclassed_views(optimizer) -> dict:
    """Views of each parameter's AdamW moments, as a subclass and with a Python attribute."""
    moments = [optimizer.state[p] for group in optimizer.param_groups for p in group["params"]]
    noted = [state["exp_avg_sq"].detach() for state in moments]
    for tensor in noted:
        tensor.note = "a Python attribute"
    return {"tagged": [state["exp_avg"].detach().as_subclass(Tagged) for state in moments], "noted": noted,
            "sparse": torch.eye(4).to_sparse()}   # no storage of its own: pickled through its parts


def _let_copies_finish(device: str) -> None:
    """On CUDA the plan's copies out run on side streams and a storage leaves the device at the
    first op after its copy is done: wait for them, then run one op, so that the save meets the
    state as a save later in a long job would (moved out), not copies still in flight."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.zeros(1, device=device)


def _out(state) -> int:
    """Storages among the state's with no device memory now (moved out by a plan)."""
    return len({t.untyped_storage()._cdata for t in _tensors(state)
                if t.layout == torch.strided and t.untyped_storage().nbytes() == 0})


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


if __name__ == "__main__":
    main()
