"""Batches collated as TRL's SFTTrainer pads them (trl.trainer.utils.pad: `output[i][slices] =
t`): each row copied into a zero batch through a slice, for which PyTorch makes no op at the
batch's longest row, and the longest row sits at another position in each batch. Writes the
losses."""

import argparse
import json

import torch

VOCAB, WIDTH, ROWS = 64, 128, 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--out", default="collated_rows.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, WIDTH), torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(4 * WIDTH, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(args.steps):
        lengths = [24 + 4 * ((row + step) % ROWS) for row in range(ROWS)]   # the longest at row 3 - step % 4
        rows = [torch.randint(1, VOCAB, (n,)) for n in lengths]
        ids = torch.zeros(ROWS, max(lengths), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i][: len(row)] = row
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1),
                                                 ignore_index=0)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item().hex())
    json.dump(losses, open(args.out, "w"))


if __name__ == "__main__":
    main()
