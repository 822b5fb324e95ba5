"""A tiny Hugging Face Mixtral (a mixture of experts) trained plainly: its eager experts run
only the experts its tokens were routed to, so the ops of a step follow the data. AdamW,
optional gradient accumulation, then save_pretrained, which makes per-expert copies of the
fused expert weights. It never imports teraio.

    python hf_moe.py --steps 16 --accum 1 --losses-out l.json --save-pretrained out/
"""

import argparse
import json

import torch
from transformers import MixtralConfig, MixtralForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--losses-out", required=True)
    p.add_argument("--save-pretrained", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    config = MixtralConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                           num_local_experts=8, num_experts_per_tok=2, experts_implementation="eager")
    model = MixtralForCausalLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1234)
    losses = []
    for _ in range(args.steps):
        for _ in range(args.accum):
            ids = torch.randint(0, 512, (1, 8), generator=g)   # one short sequence: few experts hit
            loss = model(input_ids=ids, labels=ids).loss
            (loss / args.accum).backward()
            losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    with open(args.losses_out, "w") as f:
        json.dump(losses, f)
    model.save_pretrained(args.save_pretrained)


if __name__ == "__main__":
    main()
