"""Batches made before the loop and held in a list, one used per step: in the recorded
iteration most of them are touched by no op. Writes the losses."""

import argparse
import json

import torch

BATCHES = 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="held_batches.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)   # state to move: 8 MiB beside 1 MiB of batches
    batches = [torch.randn(128, 256) for _ in range(BATCHES)]   # 128 KiB each
    losses = []
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    json.dump(losses, open(args.out, "w"))


if __name__ == "__main__":
    main()
