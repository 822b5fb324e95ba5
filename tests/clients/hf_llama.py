"""A plain transformers training loop, as users write it: a tiny LlamaForCausalLM, AdamW,
optionally dynamic padding (another sequence length per batch) and gradient accumulation
(--accum N micro-batches per optimizer step, each with its own length), then the usual ways
a job writes its result. It never imports teraio.

    python hf_llama.py --steps 6 --losses-out l.json --save-pretrained out/ --safetensors-out w.safetensors
"""

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build(seed: int, hidden: int = 64, layers: int = 2, vocab: int = 256, seq: int = 128) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden if hidden <= 64 else
                         (8 * hidden // 3 + 255) // 256 * 256, num_hidden_layers=layers,
                         num_attention_heads=max(4, hidden // 128), num_key_value_heads=max(4, hidden // 128),
                         max_position_embeddings=max(128, seq), tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def batches(steps: int, batch: int, seq: int, dynamic: bool, accum: int = 1, vocab: int = 256):
    """Per step, its `accum` micro-batches."""
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        micro = []
        for m in range(step * accum, (step + 1) * accum):
            length = seq - 8 * (m % 3) if dynamic else seq  # dynamic padding: the batch's own length
            micro.append(torch.randint(0, vocab, (batch, length), generator=g))
        yield micro


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--dynamic", action="store_true", help="vary the sequence length per batch")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step (gradient accumulation)")
    p.add_argument("--losses-out")
    p.add_argument("--step-ms-out", help="each optimizer step's wall time in ms (the device synchronized at its end)")
    p.add_argument("--save-pretrained", help="model.save_pretrained(DIR) after training (safetensors)")
    p.add_argument("--from-pretrained", help="LlamaForCausalLM.from_pretrained(DIR) instead of a fresh model, as a "
                                             "fine-tune starts (on the CPU its weights stay in safetensors' mapping)")
    p.add_argument("--safetensors-out", help="safetensors.torch.save_file of the parameters")
    p.add_argument("--numpy-out", help="np.savez of the parameters through Tensor.numpy() and DLPack")
    p.add_argument("--accelerate-save", help="accelerate's Accelerator().save_model(model, DIR)")
    p.add_argument("--save-every", type=int, default=0, help="save_pretrained(DIR) after every N steps (with --save-pretrained)")
    p.add_argument("--eval-every", type=int, default=0, help="an evaluation pass under no_grad after every N steps")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (peft) on a frozen base")
    p.add_argument("--grad-ckpt", action="store_true", help="transformers' gradient checkpointing")
    p.add_argument("--autocast", action="store_true", help="bf16 autocast")
    p.add_argument("--device", default="cpu")
    p.add_argument("--hidden", type=int, default=64, help="model width (2048 with --layers 16 --vocab 32000: ~1B)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    args = p.parse_args()
    if args.device == "cuda":  # the twin run compares bit for bit: no nondeterministic kernels
        torch.use_deterministic_algorithms(True)

    model = (LlamaForCausalLM.from_pretrained(args.from_pretrained) if args.from_pretrained else
             build(0, args.hidden, args.layers, args.vocab, args.seq)).to(args.device)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.autocast)
    losses, step_ms = [], []
    for step, micro in enumerate(batches(args.steps, args.batch, args.seq, args.dynamic, args.accum, args.vocab)):
        started = time.perf_counter()
        for ids in micro:
            ids = ids.to(args.device)
            with autocast:
                loss = model(input_ids=ids, labels=ids).loss
            (loss / args.accum if args.accum > 1 else loss).backward()
            if args.accum > 1:
                losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.accum == 1:
            losses.append(loss.item())
        if args.step_ms_out:
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            step_ms.append((time.perf_counter() - started) * 1e3)
        if args.save_every and (step + 1) % args.save_every == 0:
            model.save_pretrained(args.save_pretrained)
        if args.eval_every and (step + 1) % args.eval_every == 0:
            with torch.no_grad():
                losses.append(model(input_ids=ids[:, :16], labels=ids[:, :16]).loss.item())
    if args.losses_out:
        with open(args.losses_out, "w") as f:
            json.dump(losses, f)
    if args.step_ms_out:
        with open(args.step_ms_out, "w") as f:
            json.dump(step_ms, f)
    if args.save_pretrained:
        if args.device.startswith("cuda"):  # the plan's copies out done and seen: the save meets moved weights
            torch.cuda.synchronize()
            torch.zeros(1, device=args.device)
        out_before = _out_of_memory(model)
        model.save_pretrained(args.save_pretrained)
        with open(f"{args.save_pretrained}.out.json", "w") as f:   # moved out around the save
            json.dump([out_before, _out_of_memory(model)], f)
    if args.safetensors_out:
        from safetensors.torch import save_file
        save_file({n: p.detach() for n, p in model.named_parameters()}, args.safetensors_out)
    if args.accelerate_save:
        from accelerate import Accelerator
        Accelerator(cpu=args.device == "cpu").save_model(model, args.accelerate_save)
    if args.numpy_out:
        import numpy as np
        # every other parameter through DLPack: both hand out a raw pointer to the storage
        np.savez(args.numpy_out, **{n: np.from_dlpack(p.detach().cpu()) if i % 2 else p.detach().cpu().numpy()
                                    for i, (n, p) in enumerate(model.named_parameters())})


def _out_of_memory(model) -> int:
    """Parameters whose storage has no memory now (a plan moved them out)."""
    return sum(p.untyped_storage().nbytes() == 0 for p in model.parameters())


if __name__ == "__main__":
    main()
