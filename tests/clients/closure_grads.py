"""Gradients made inside optimizer.step(closure), the closure setting them to None first, as
LBFGS and PyTorch Lightning's automatic optimization run a step; --mode picks the loop:
  plain       zero_grad(set_to_none=True), forward, backward, step (the reference loop)
  closure     step(closure), the closure: zero_grad(set_to_none=True), forward, backward
  accumulate  Lightning's accumulate_grad_batches=2: the closure zero_grads on the first batch
              of a cycle only; the first batch calls it directly, the second through step
  micro       step(closure), the closure: zero_grad(set_to_none=True), then two micro-batches
              of forward and backward (a manual closure loop accumulating gradients)
Writes the losses (float.hex) and the final weights' hash to --losses-out."""

import argparse
import hashlib
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("plain", "closure", "accumulate", "micro"), default="closure")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--losses-out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [torch.randn(32, 64, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    losses = []

    def loss_of(i: int) -> torch.Tensor:
        return model(batches[i % len(batches)]).square().mean()

    def closure_for(i: int, zero: bool = True, micro: int = 1):
        def closure():
            if zero:
                optimizer.zero_grad(set_to_none=True)
            for m in range(micro):
                loss = loss_of(i + m)
                loss.backward()
            return loss
        return closure

    batches_per_step = 2 if args.mode == "accumulate" else 1
    for step in range(args.steps * batches_per_step):
        if args.mode == "plain":
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(step)
            loss.backward()
            optimizer.step()
        elif args.mode == "closure":
            loss = optimizer.step(closure_for(step))
        elif args.mode == "micro":
            loss = optimizer.step(closure_for(step, micro=2))
        elif step % 2 == 0:   # accumulate: the first batch of a cycle, no step
            loss = closure_for(step, zero=True)()
        else:
            loss = optimizer.step(closure_for(step, zero=False))
        losses.append(loss.item().hex())
    weights = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    if args.losses_out:
        with open(args.losses_out, "w") as f:
            json.dump({"losses": losses, "weights": weights}, f)


if __name__ == "__main__":
    main()
