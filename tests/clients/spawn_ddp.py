"""DDP started as the PyTorch tutorial starts it: torch.multiprocessing.spawn of two workers,
each handed its rank as an argument (no RANK or LOCAL_RANK in the environment): gloo on the
CPU, or with --device cuda NCCL, each rank moving its model and batches with `.to(rank)` and
never calling torch.cuda.set_device (the tutorial's way). The caller then gathers what the
ranks wrote: the losses (float.hex) per rank, in --out."""

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def worker(rank: int, steps: int, out: str, cuda: bool) -> None:
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    device = rank if cuda else "cpu"
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 64, generator=batches).to(device)
        loss = (model(x) - x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(losses, f)
    # Every rank reaches the end before any tears gloo down (why: tests/clients/fsdp2_train.py);
    # this job's plain run also exited non-zero now and then in CI, why not recorded.
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="spawn_ddp.json")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    mp.spawn(worker, args=(args.steps, args.out, args.device == "cuda"), nprocs=WORLD)
    ranks = []
    for rank in range(WORLD):
        with open(f"{args.out}.rank{rank}") as f:
            ranks.append(json.load(f))
    with open(args.out, "w") as f:
        json.dump(ranks, f)


if __name__ == "__main__":
    main()
