"""Two custom autograd Functions: one keeps its input as a ctx attribute (ctx.x = x, not
save_for_backward), the other saves an intermediate it computed (not an input) with
ctx.save_for_backward. Writes the losses."""

import argparse
import json

import torch


class AttributeSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        return x * x

    @staticmethod
    def backward(ctx, grad):
        return 2 * ctx.x * grad


class SavedTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(128, 128) for _ in range(4))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = (AttributeSquare.apply if i % 2 else SavedTanh.apply)(layer(x))
        return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="custom_function.json")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(64, 128)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
