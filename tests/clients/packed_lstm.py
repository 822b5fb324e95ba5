"""An LSTM language model over padded batches packed with pack_padded_sequence inside its
forward (the same lengths every step, so each step runs the same ops), Adam and gradient
clipping. Writes the losses."""

import argparse
import json

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

VOCAB, EMBED, HIDDEN, BATCH, LENGTH = 50, 32, 64, 8, 12


class PackedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, EMBED)
        self.lstm = torch.nn.LSTM(EMBED, HIDDEN, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        return self.head(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="packed_lstm.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = PackedLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    lengths = torch.tensor([12, 11, 9, 9, 7, 5, 4, 3])
    mask = torch.arange(LENGTH)[None, :] < lengths[:, None]
    losses = []
    for _ in range(6):
        tokens = torch.randint(1, VOCAB, (BATCH, LENGTH)) * mask
        logits = model(tokens[:, :-1], lengths - 1)
        target = tokens[:, 1:].masked_fill(~mask[:, 1:], -100)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
