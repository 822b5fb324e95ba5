"""An EMA of the weights kept by torch.optim.swa_utils.AveragedModel, updated after every step
and evaluated every third step under inference_mode; at the end its BatchNorm statistics are
recomputed (update_bn) and it is saved, as a state dict and as a whole module. Writes the
losses, the evaluations and what the saves hold (float.hex)."""

import argparse
import json

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn, update_bn


def hexes(state: dict) -> dict:
    return {name: [v.hex() for v in t.float().flatten().tolist()] for name, t in state.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="averaged_model.json")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.BatchNorm1d(256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    probe = torch.randn(32, 64)
    losses, evals = [], []
    for step in range(args.steps):
        x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema.update_parameters(model)
        losses.append(loss.item().hex())
        if step % 3 == 2:
            ema.eval()
            with torch.inference_mode():
                evals.append(ema(probe).square().mean().item().hex())
    update_bn([torch.randn(16, 64) for _ in range(3)], ema)
    torch.save(ema.state_dict(), "ema.pt")
    torch.save(ema.module, "ema_module.pt")
    saved = {"state_dict": hexes(torch.load("ema.pt")),
             "module": hexes(torch.load("ema_module.pt", weights_only=False).state_dict())}
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "evals": evals, "saved": saved}, f)


if __name__ == "__main__":
    main()
