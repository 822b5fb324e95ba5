"""A depth chosen per batch: most batches run the first 2 of 6 layers, every third one all 6,
so the optimizer's foreach step covers three times the parameters there (Adagrad, foreach:
the layers a batch skipped have no gradient). Each layer is applied REPEATS times (weights
tied across depth, as in ALBERT), so a shallow iteration's activations outweigh its
optimizer step. The profile records a shallow iteration and watches a deep one. Writes the
losses."""

import argparse
import json

import torch

LAYERS, WIDTH, ROWS, REPEATS = 6, 64, 64, 4
SHALLOW, DEEP = 2, LAYERS


def depth_of(step: int) -> int:
    return DEEP if step % 3 == 2 else SHALLOW


class Tower(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))

    def forward(self, x, depth: int):
        for layer in self.layers[:depth]:
            for _ in range(REPEATS):
                x = torch.tanh(layer(x))
        return x.square().mean()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="data_depth.json")
    parser.add_argument("--steps", type=int, default=9)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Tower()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=1e-2, foreach=True)
    losses = []
    for step in range(args.steps):
        loss = model(torch.randn(ROWS, WIDTH), depth_of(step))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
