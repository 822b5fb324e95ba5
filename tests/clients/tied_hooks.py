"""A language model whose output layer shares the input embedding's weight, a gradient hook
that scales the embedding's gradient (tensor.register_hook), clip_grad_norm_(foreach=True)
and AdamW with --fused or foreach. Writes the losses."""

import argparse
import json

import torch

VOCAB, EMBED = 200, 64


class TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, EMBED)
        self.body = torch.nn.Sequential(torch.nn.Linear(EMBED, 128), torch.nn.GELU(), torch.nn.Linear(128, EMBED))
        self.out = torch.nn.Linear(EMBED, VOCAB, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(self.body(self.embed(tokens)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="tied_hooks.json")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fused", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TiedLM()
    model.embed.weight.register_hook(lambda grad: grad * 0.5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **({"fused": True} if args.fused else {"foreach": True}))
    losses = []
    for _ in range(args.steps):
        tokens = torch.randint(0, VOCAB, (8, 16))
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1, foreach=True)
        optimizer.step()
        losses.append(loss.item().hex())
    with open(args.out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
