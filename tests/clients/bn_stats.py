"""BatchNorm's running statistics in fp32, plain SGD: the statistics are written in place by
native_batch_norm, whose schema does not say so (UNMARKED_WRITES in teraio/walk.py). Writes
the losses and every running statistic as hex after the last step."""

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bn_stats.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Flatten(), nn.Linear(32 * 64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, labels = torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,))
    losses = []
    for _ in range(8):
        loss = nn.functional.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    stats = {name: [v.hex() for v in b.tolist()] for name, b in model.named_buffers() if "running" in name}
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "running_stats": stats}, f)


if __name__ == "__main__":
    main()
