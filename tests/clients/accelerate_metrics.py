"""A loop as accelerate users write it: prepare, accumulate over 2 micro-batches, and the loss
gathered for logging with gather_for_metrics. Its last batch of an epoch is short (6 samples in
batches of 4), so accelerate trims the gathered loss, a 0-dim tensor: the slice raises an
IndexError, which accelerate catches, once in every iteration (TRL's SFTTrainer logs so).
Writes the losses."""

import argparse
import json

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="accelerate_metrics.json")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randn(6, 64), torch.randn(6, 1)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _ in range(args.epochs):
        for inputs, targets in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(accelerator.gather_for_metrics(loss.detach()).item().hex())
    json.dump(losses, open(args.out, "w"))


if __name__ == "__main__":
    main()
