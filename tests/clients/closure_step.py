"""Forward and backward inside optimizer.step(closure), as PyTorch Lightning's automatic
optimization and LBFGS run them; writes the losses (float.hex) to --losses-out."""

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--losses-out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    losses = []

    def closure():
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    for _ in range(args.steps):
        losses.append(optimizer.step(closure).item().hex())
    if args.losses_out:
        with open(args.losses_out, "w") as f:
            json.dump(losses, f)


if __name__ == "__main__":
    main()
