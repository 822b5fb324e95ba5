"""transformers' Trainer as users run it: a tiny Llama on a synthetic causal-LM dataset,
checkpoints every few steps (save_steps), and save_pretrained at the end. It never imports teraio.

    python hf_trainer.py OUT_DIR --steps 6
"""

import argparse
import json

import torch
from transformers import Trainer, TrainingArguments

from hf_llama import build


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int, seq: int):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 256, (count, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-steps", type=int, default=3)
    args = p.parse_args()
    model = build(0)
    training = TrainingArguments(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=4, learning_rate=1e-3,
        logging_steps=1, save_steps=args.save_steps, save_strategy="steps", report_to=[], use_cpu=True,
        dataloader_num_workers=0, seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(4 * args.steps, 32))
    trainer.train()
    trainer.save_model(f"{args.out}/final")
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    with open(f"{args.out}/losses.json", "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
