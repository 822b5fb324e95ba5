"""Training resumed in a fresh model and optimizer in the same process: the first pair is
dropped (weights copied over) and must be freed; writes the losses and whether it was freed."""

import argparse
import gc
import json
import weakref

import torch


def make():
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model, optimizer, x, steps: int, losses: list) -> None:
    for _ in range(steps):
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item().hex())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="fresh.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    x, losses = torch.randn(32, 64), []
    model, optimizer = make()
    train(model, optimizer, x, 5, losses)
    fresh, fresh_optimizer = make()
    fresh.load_state_dict(model.state_dict())
    dropped = [weakref.ref(model), weakref.ref(optimizer), weakref.ref(next(model.parameters()))]
    del model, optimizer
    gc.collect()
    freed = all(ref() is None for ref in dropped)
    train(fresh, fresh_optimizer, x, 5, losses)
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "freed": freed}, f)


if __name__ == "__main__":
    main()
