"""Device tensors the job makes and holds outside any model or optimizer the walk names: an
in-memory checkpoint (copy.deepcopy of the optimizer's state_dict every few steps, the latest
kept) and a hand-written EMA of the weights (clones updated with torch._foreach_lerp_ each step,
no module of the model). Writes the losses, the last snapshot and the EMA weights."""

import argparse
import copy
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--snapshot-every", type=int, default=0, help="deepcopy the optimizer state every N steps")
    parser.add_argument("--ema", action="store_true", help="keep an EMA of the weights, updated each step")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--out", default="copies.pt")
    parser.add_argument("--losses-out", default="losses.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    w = args.width
    model = torch.nn.Sequential(torch.nn.Linear(64, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                torch.nn.Linear(w, 64))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    params = list(model.parameters())
    ema = [p.detach().clone() for p in params] if args.ema else None
    x, y = torch.randn(16, 64), torch.randn(16, 64)
    losses, snapshot = [], None
    for step in range(args.steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item().hex())
        if ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in params], 0.1)
        if args.snapshot_every and step % args.snapshot_every == args.snapshot_every - 1:
            snapshot = copy.deepcopy(optimizer.state_dict())   # the latest kept, the one before dropped
    out = {}
    if snapshot is not None:
        # loaded back: a fresh optimizer takes the snapshot as its state
        fresh = torch.optim.Adam(model.parameters(), lr=1e-3)
        fresh.load_state_dict(snapshot)
        out["snapshot"] = {f"{i}:{k}": v for i, s in snapshot["state"].items() for k, v in s.items()}
        out["loaded"] = {f"{i}:{k}": v for i, s in enumerate(fresh.state[p] for p in params) for k, v in s.items()}
    if ema is not None:
        out["ema"] = {str(i): t for i, t in enumerate(ema)}
    torch.save(out, args.out)
    with open(args.losses_out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
