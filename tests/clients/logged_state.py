"""A loop that logs its optimizer's state with rich after every step (rich prints each tensor
through its repr, which reads the storage raw); writes the losses and the logged text."""

import argparse
import io
import json

import torch
from rich.console import Console


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="logged_state.json")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 64), torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64), torch.nn.Linear(64, 50, bias=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    log = Console(file=io.StringIO(), width=200)
    losses = []
    for _ in range(args.steps):
        x = torch.randint(0, 50, (16, 12))
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.roll(1, 1).flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
        log.print(optimizer.state_dict())
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "log": log.file.getvalue()}, f)


if __name__ == "__main__":
    main()
