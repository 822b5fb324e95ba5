"""Optimizer in backward: an AdamW per parameter, stepped and zeroed from the parameter's
post-accumulate-grad hook as its gradient is ready (a recipe that keeps no full set of
gradients alive). An iteration is one backward pass, six optimizer steps. Writes the losses."""

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="optimizer_in_backward.json")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizers = {param: torch.optim.AdamW([param], lr=1e-3) for param in model.parameters()}

    def step(param):
        optimizers[param].step()
        optimizers[param].zero_grad()

    for param in model.parameters():
        param.register_post_accumulate_grad_hook(step)
    inputs, labels = torch.randn(32, 32), torch.randint(0, 4, (32,))
    losses = []
    for _ in range(args.steps):
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
