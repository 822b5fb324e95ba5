"""A small MLP trained with Adam whose every step allocates a large buffer with torch.empty
before its forward and fills it only after its backward (a storage allocated without a
write: Note [Outputs read raw later] in teraio/walk.py). Writes the losses and the buffers'
sums; optionally hands a weight's memory out through Tensor.numpy() at one step (a raw
pointer: that storage may never move again) and saves the state dict after the last step.
"""

import argparse
import json

import torch

WIDTH, DEPTH, BATCH, BUFFER_WIDTH = 256, 4, 64, 8192


class Net(torch.nn.Module):
    """Allocates the buffer inside its forward, so that it is an activation (a movable kind)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())
                                          for _ in range(DEPTH)])

    def forward(self, x):
        buffer = torch.empty(BATCH, BUFFER_WIDTH)   # filled after the backward
        return self.body(x), buffer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--losses-out", default="late_fill.json")
    parser.add_argument("--numpy-at", type=int, default=-1, help="step at which a weight goes out through numpy")
    parser.add_argument("--save", default="", help="torch.save the state dict here after training")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs, target = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    losses, exported = [], None
    for step in range(args.steps):
        out, buffer = model(inputs)
        loss = torch.nn.functional.mse_loss(out, target)
        optimizer.zero_grad()
        loss.backward()
        buffer.copy_(out.detach().repeat(1, BUFFER_WIDTH // WIDTH))
        optimizer.step()
        if step == args.numpy_at:
            exported = model.body[0][0].weight.detach().numpy()   # the job may read it at any time from now on
        losses.append([loss.item().hex(), buffer.sum().item().hex()])
    if exported is not None:
        losses.append(float(exported.sum()).hex())
    with open(args.losses_out, "w") as f:
        json.dump(losses, f)
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
