"""transformers' GPT-2 in train mode, as users run it: dropout on (GPT2Config's 0.1 in the
embeddings, attention and residuals), AdamW, and a save in the middle of an iteration (between
forward and backward, its activations still waiting for backward). It never imports teraio.

    python gpt2_dropout.py --steps 8 --save-at 4 DIR --losses-out l.json
"""

import argparse
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-at", nargs=2, metavar=("STEP", "DIR"),
                   help="save_pretrained(DIR) and torch.save(state_dict, DIR/state.pt) after that step's forward")
    p.add_argument("--losses-out")
    args = p.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(args.steps):
        ids = torch.randint(0, 256, (4, 32), generator=g)
        loss = model(input_ids=ids, labels=ids).loss
        if args.save_at and step == int(args.save_at[0]):
            model.save_pretrained(args.save_at[1])
            torch.save(model.state_dict(), f"{args.save_at[1]}/state.pt")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    if args.losses_out:
        with open(args.losses_out, "w") as f:
            json.dump(losses, f)


if __name__ == "__main__":
    main()
