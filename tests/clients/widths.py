"""An MLP whose hidden width is an argument: the same layers and op sequence at every width,
only the tensors' sizes differ (a plan made at one width is no plan for another). AdamW.
Writes the losses."""

import argparse
import json

import torch

LAYERS, ROWS = 4, 16


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default="widths.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.Tanh())
                                  for _ in range(LAYERS)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(ROWS, args.width)
    losses = []
    for _ in range(args.steps):
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
