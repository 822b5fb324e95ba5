"""An MLP whose parameters live in shared memory (`Module.share_memory()`, as Hogwild-style
trainers and some data-parallel setups do), trained with SGD: shared storages cannot be freed
(other processes may map them), so the plan's offloads of them are refused, and every other
tensor moves. Writes the losses."""

import argparse
import json

import torch

WIDTH = 256


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="shared_memory.json")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, WIDTH))
    model[0].share_memory()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(args.steps):
        loss = model(torch.ones(16, WIDTH)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
