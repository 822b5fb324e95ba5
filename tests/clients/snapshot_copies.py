"""Copies of the weights taken mid-training with copy.deepcopy: the best state_dict each step
and a whole-model snapshot (an EMA model's start), both saved at the end with the losses."""

import argparse
import copy
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default="snapshots.pt")
    parser.add_argument("--losses-out", default="losses.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    losses, best, snapshot = [], None, None
    for step in range(args.steps):
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item().hex())
        best = copy.deepcopy(model.state_dict())
        if step == args.steps // 2:
            snapshot = copy.deepcopy(model)
    torch.save({"best": best, "snapshot": snapshot.state_dict()}, args.out)
    with open(args.losses_out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
