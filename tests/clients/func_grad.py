"""Per-sample gradients with torch.func (DP-SGD style): vmap(grad) over functional_call, each
sample's gradient clipped, their sum applied by SGD. The model's first forward runs inside the
transforms, where its parameters are the transforms' wrappers. Writes the losses."""

import argparse
import json

import torch
from torch.func import functional_call, grad, vmap


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="func_grad.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(16, 32), torch.randn(16, 8)

    def sample_loss(params, xi, yi):
        return (functional_call(model, params, (xi.unsqueeze(0),)) - yi).square().mean()

    losses = []
    for _ in range(6):
        params = {name: p.detach() for name, p in model.named_parameters()}
        per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))(params, x, y)
        norms = torch.sqrt(sum(g.flatten(1).square().sum(1) for g in per_sample.values()))
        scale = (1.0 / norms).clamp(max=1.0)
        for name, p in model.named_parameters():
            p.grad = (per_sample[name] * scale.view(-1, *[1] * (p.dim()))).sum(0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(sum(sample_loss(params, xi, yi) for xi, yi in zip(x, y)).item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
