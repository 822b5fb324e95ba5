"""torch.utils.checkpoint around each block, reentrant (--reentrant) or not: the forward of
a block runs again inside backward. Writes the losses."""

import argparse
import json

import torch
from torch.utils.checkpoint import checkpoint


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(128, 256), torch.nn.Linear(256, 128)
        self.norm = torch.nn.LayerNorm(128)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="checkpointed_blocks.json")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--reentrant", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block() for _ in range(4))
    head = torch.nn.Linear(128, 8)
    model = torch.nn.ModuleDict({"blocks": blocks, "head": head})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(32, 128, requires_grad=args.reentrant)  # reentrant needs an input that requires grad
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=args.reentrant)
        loss = torch.nn.functional.cross_entropy(head(x), torch.arange(32) % 8)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
