"""An MLP whose middle weight is re-bound mid-training (`weight.data = weight.data * 0.5`, a
rescale or re-initialisation as some recipes do): the parameter gets a new storage, which the
plan must go on moving. Writes the losses."""

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="rebind_data.json")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 8))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs, labels = torch.randn(32, 64), torch.randint(0, 8, (32,))
    losses = []
    for step in range(args.steps):
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item().hex())
        if step == 4:
            model[2].weight.data = model[2].weight.data * 0.5
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
