"""Batches drawn with Python's `random` after the script seeds it (as many loaders and
accelerate.set_seed do): each step shuffles 100 sample indices (not a power of two: a draw
taken before shifts every shuffle) and trains on the first 16; numpy's global generator adds
noise. Writes the losses and the generators' next draws."""

import argparse
import json
import random

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="python_shuffle.json")
    args = parser.parse_args()
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(128, 64), torch.randint(0, 4, (128,))
    order = list(range(100))
    losses = []
    for _ in range(6):
        random.shuffle(order)
        batch = torch.tensor(order[:16])
        noise = torch.from_numpy(np.random.standard_normal((16, 64)).astype(np.float32))
        loss = torch.nn.functional.cross_entropy(model(x[batch] + 0.01 * noise), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "next_random": random.random(), "next_numpy": float(np.random.random())}, f)


if __name__ == "__main__":
    main()
