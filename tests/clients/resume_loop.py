"""A plain PyTorch loop that is stopped and resumed, as users do: the first process trains and
saves model, optimizer, LR scheduler and RNG state with torch.save after step --save-at; a
second process builds everything afresh, loads that checkpoint (torch.load, load_state_dict)
and trains on. Dropout draws from the saved RNG state, so a resumed run matches the
uninterrupted one only if every piece of state came back. It never imports teraio.

    python resume_loop.py --steps 8 --save-at 3 --checkpoint ckpt.pt --losses-out a.json
    python resume_loop.py --steps 8 --resume ckpt.pt --losses-out b.json [--mmap]
"""

import argparse
import json

import torch

WIDTH, DEPTH, BATCH = 128, 4, 16


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
                                                      torch.nn.Dropout(0.1)) for _ in range(DEPTH)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def batch(step: int):
    g = torch.Generator().manual_seed(100 + step)  # the data a step sees does not depend on where it started
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--save-at", type=int, default=-1)
    parser.add_argument("--checkpoint", default="ckpt.pt")
    parser.add_argument("--resume", default=None)
    parser.add_argument("--losses-out", default="losses.json")
    parser.add_argument("--mmap", action="store_true", help="torch.load the checkpoint with mmap=True")
    parser.add_argument("--map-location-fn", action="store_true",
                        help="torch.load with map_location=lambda storage, loc: storage (as Lightning loads)")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    model, optimizer, scheduler = build()
    start = 0
    if args.resume:
        where = (lambda storage, loc: storage) if args.map_location_fn else None
        state = torch.load(args.resume, mmap=args.mmap, map_location=where)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        start = state["step"] + 1
    losses = []
    for step in range(start, args.steps):
        inputs, target = batch(step)
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(loss.item())
        if step == args.save_at:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "step": step},
                       args.checkpoint)
    with open(args.losses_out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
