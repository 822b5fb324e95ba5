"""Batches padded as torchvision's detection transform pads its images: each sample copied into
a zero batch through a slice, `pad[i, :n].copy_(x)`, for which PyTorch makes no slice op when n
is the whole width: those steps run one op fewer per full-width sample. Writes the losses."""

import argparse
import json

import torch

WIDTH = 128


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=18)
    parser.add_argument("--out", default="padded_batches.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(),
                                                      torch.nn.Linear(2 * WIDTH, WIDTH)) for _ in range(3)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(args.steps):
        widths = [WIDTH if step % 3 == 2 else WIDTH - 8 - step % 5, WIDTH - 16]   # a full one every third step
        batch = torch.zeros(len(widths), WIDTH)
        for i, n in enumerate(widths):
            batch[i, :n].copy_(torch.randn(n))
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item().hex())
    json.dump(losses, open(args.out, "w"))


if __name__ == "__main__":
    main()
