"""A job that rolls back to a checkpoint in the same process: it saves model, optimizer and LR
scheduler state after step --save-at and loads it back after step --load-at, then trains on.
Gradient accumulation (3 micro-batches a step), clip_grad_norm_, AdamW and LambdaLR. Plain
PyTorch (torch.save, torch.load, load_state_dict: the optimizer's state tensors are replaced
by the loaded ones) or, with --accelerate, Accelerator.save_state and load_state over a
prepared DataLoader. It never imports teraio.

    python reload_midrun.py --steps 10 --save-at 2 --load-at 4 --out losses.json [--accelerate]
"""

import argparse
import json

import torch

WIDTH, DEPTH, BATCH, ACCUMULATE = 128, 3, 16, 3


def build(steps: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())
                                  for _ in range(DEPTH)], torch.nn.Linear(WIDTH, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    g = torch.Generator().manual_seed(1)
    data = torch.randn(steps * ACCUMULATE * BATCH, WIDTH, generator=g)
    labels = torch.randint(0, 4, (len(data),), generator=g)
    return model, optimizer, scheduler, data, labels


def plain(args) -> list[float]:
    model, optimizer, scheduler, data, labels = build(args.steps)
    losses = []
    for step in range(args.steps):
        for micro in range(ACCUMULATE):
            at = (step * ACCUMULATE + micro) * BATCH
            loss = torch.nn.functional.cross_entropy(model(data[at:at + BATCH]), labels[at:at + BATCH])
            (loss / ACCUMULATE).backward()
            losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if step == args.save_at:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()}, args.checkpoint)
        if step == args.load_at:
            state = torch.load(args.checkpoint)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
    return losses


def with_accelerate(args) -> list[float]:
    from accelerate import Accelerator
    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATE, cpu=True)
    model, optimizer, scheduler, data, labels = build(args.steps)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data, labels), batch_size=BATCH)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    losses = []
    for i, (x, y) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        losses.append(loss.item())
        if i == args.save_at * ACCUMULATE + ACCUMULATE - 1:
            accelerator.save_state(args.checkpoint + ".state")
        if i == args.load_at * ACCUMULATE + ACCUMULATE - 1:
            accelerator.load_state(args.checkpoint + ".state")
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--save-at", type=int, default=2)
    parser.add_argument("--load-at", type=int, default=4)
    parser.add_argument("--checkpoint", default="ckpt.pt")
    parser.add_argument("--accelerate", action="store_true")
    parser.add_argument("--out", default="losses.json")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    losses = with_accelerate(args) if args.accelerate else plain(args)
    with open(args.out, "w") as f:
        json.dump([loss.hex() for loss in losses], f)


if __name__ == "__main__":
    main()
