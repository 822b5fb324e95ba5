"""A small CNN with BatchNorm (running statistics updated in place every step) in
channels_last memory format, under bf16 autocast on the CPU, with SGD and momentum.
Writes the losses."""

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="batchnorm_cnn.json")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1, stride=2), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    losses = []
    for _ in range(args.steps):
        x = torch.randn(16, 3, 16, 16).to(memory_format=torch.channels_last)
        labels = torch.randint(0, 10, (16,))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.float().item().hex())
    stats = [b.float().sum().item().hex() for name, b in model.named_buffers() if "running" in name]
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "running_stats": stats}, f)


if __name__ == "__main__":
    main()
