"""A TransformerEncoder trained on padded batches and evaluated every other step in eval mode
with a padding mask, where PyTorch takes its nested-tensor fast path (Note [Nested tensors]
in teraio/walk.py). With --autocast, it also evaluates unmasked under CPU bf16 autocast, where
the fast path's kernel runs its matmuls under the caller's autocast (Note [Autocast inside an
op]). Writes the training and evaluation losses (and the autocast evaluation's dtype)."""

import argparse
import json

import torch

VOCAB, WIDTH, LENGTH, BATCH = 100, 64, 16, 8


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        layer = torch.nn.TransformerEncoderLayer(WIDTH, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens, padding):
        return self.head(self.encoder(self.embed(tokens), src_key_padding_mask=padding))


def batch(generator):
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=generator)
    lengths = torch.randint(LENGTH // 2, LENGTH + 1, (BATCH,), generator=generator)
    return tokens, torch.arange(LENGTH)[None, :] >= lengths[:, None]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="nested_eval.json")
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--autocast", action="store_true", help="evaluate under CPU bf16 autocast")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Encoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    losses = []
    for step in range(args.steps):
        model.train()
        tokens, padding = batch(generator)
        loss = torch.nn.functional.cross_entropy(model(tokens, padding)[~padding], tokens[~padding])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
        if step % 2:
            model.eval()
            with torch.no_grad():
                out = model(tokens, padding)
            losses.append(out[~padding].sum().item().hex())
            if args.autocast:  # PyTorch's masked fast path refuses CPU autocast: unmasked only
                with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
                    out = model(tokens, None)
                losses += [out.float().sum().item().hex(), str(out.dtype)]
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
