"""A denoising loop as diffusers trains: a dataset drawn with torch.randn before the loop, and
each step noise drawn with torch.randn too (the same op, outside any module). Writes the losses."""

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="dataset_and_noise.json")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.SiLU(),
                                torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.SiLU(),
                                torch.nn.Conv2d(32, 3, 3, padding=1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(64, 3, 16, 16)   # 192 KiB, alive all run, used a batch a step
    losses = []
    for step in range(args.steps):
        images = data[4 * step % 64:][:4]
        noise = torch.randn(images.shape)
        loss = torch.nn.functional.mse_loss(model(images + noise), noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    json.dump(losses, open(args.out, "w"))


if __name__ == "__main__":
    main()
