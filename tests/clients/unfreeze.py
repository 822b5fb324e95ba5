"""Fine-tuning that unfreezes a layer mid-training: the head trains alone for --unfreeze-at
steps, then the body's parameters join the optimizer with add_param_group (their Adam state
made then). Writes the losses."""

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="unfreeze.json")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--unfreeze-at", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64), torch.nn.ReLU())
    head = torch.nn.Linear(64, 8)
    model = torch.nn.Sequential(body, head)
    body.requires_grad_(False)
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    losses = []
    for step in range(args.steps):
        if step == args.unfreeze_at:
            body.requires_grad_(True)
            optimizer.add_param_group({"params": list(body.parameters()), "lr": 1e-3})
        x, labels = torch.randn(32, 64), torch.randint(0, 8, (32,))
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
