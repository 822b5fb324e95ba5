"""A loop that logs as the Hugging Face Trainer does: a running loss summed on the device every
step, and every --log-every steps its mean read with .item() and the sum zeroed, ops the other
steps do not run. Writes the losses (float.hex) and the logged means to --out."""

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--out", default="log_every.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(96, 192), torch.nn.GELU(),
                                                      torch.nn.Linear(192, 96)) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(args.steps, 24, 96)
    running, losses, logged = torch.zeros(()), [], []
    for step in range(args.steps):
        loss = model(data[step]).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        running += loss.detach()
        losses.append(loss.detach())
        if (step + 1) % args.log_every == 0:   # after the step: the next iteration's first ops
            logged.append((running / args.log_every).mean().item().hex())
            running -= running
    json.dump({"losses": [loss.item().hex() for loss in losses], "logged": logged}, open(args.out, "w"))


if __name__ == "__main__":
    main()
