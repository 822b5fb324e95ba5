"""A bag-of-words model whose embedding has sparse gradients (nn.Embedding(sparse=True)),
trained by SparseAdam for the table and Adam for the rest (two optimizers: an iteration is
two steps). Each batch draws distinct tokens, so every sparse gradient has the same number of
rows and every iteration the same shapes. Writes the losses."""

import argparse
import json

import torch

VOCAB, EMBED, BATCH, LENGTH = 500, 64, 16, 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="sparse_embedding.json")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)
    embed = torch.nn.Embedding(VOCAB, EMBED, sparse=True)
    head = torch.nn.Sequential(torch.nn.Linear(EMBED, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    sparse_opt = torch.optim.SparseAdam(list(embed.parameters()), lr=1e-2)
    dense_opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    losses = []
    for _ in range(args.steps):
        tokens = torch.randperm(VOCAB)[:BATCH * LENGTH].view(BATCH, LENGTH)
        labels = torch.randint(0, 4, (BATCH,))
        loss = torch.nn.functional.cross_entropy(head(embed(tokens).mean(1)), labels)
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
