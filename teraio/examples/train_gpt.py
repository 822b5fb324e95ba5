"""Train a small GPT/Llama-shaped decoder on synthetic tokens: a plain PyTorch script.

It never imports teraio, so `teraio profile` and `teraio run` see an ordinary job. The
defaults (--preset tiny) run on a CPU in seconds; --preset 1b / 3b are Llama-shaped models for
one big GPU. Launch with torchrun for DDP (gloo on CPU, nccl on CUDA).

    python examples/train_gpt.py --steps 6 --losses-out losses.json
    torchrun --nproc-per-node 2 examples/train_gpt.py
    torchrun --nproc-per-node 2 examples/train_gpt.py --fsdp2
    python examples/train_gpt.py --preset 1b --autocast bf16 --device cuda
    python examples/train_gpt.py --preset 1b --min-seq 1024     # lengths vary in 1024-2048

bench/ imports ModelConfig, build_model, SyntheticTokens, make_optimizer and make_scheduler.
"""

import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# Parameter counts (untied embeddings), printed by `--print-params`:
#   tiny  =       459,392  (2 layers, dim 128, vocab 512)
#   1b    =   953,223,168  (16 layers, dim 2048, ffn 5632, vocab 32000)
#   3b    = 2,914,667,520  (24 layers, dim 3072, ffn 8192, vocab 32000)
#   8b    = 8,835,567,616  (the Llama-3-8B shape without grouped KV heads: more than one H200 holds
#                           at batch 4 with fp32 AdamW; bench/gpu_baselines.sh big)
PRESETS = {
    "tiny": dict(layers=2, dim=128, heads=4, ffn=256, vocab=512, seq=64, batch=4, steps=6, lr=3e-3),
    "1b": dict(layers=16, dim=2048, heads=16, ffn=5632, vocab=32000, seq=2048, batch=8, steps=20, lr=3e-4),
    "3b": dict(layers=24, dim=3072, heads=24, ffn=8192, vocab=32000, seq=2048, batch=4, steps=20, lr=3e-4),
    "8b": dict(layers=32, dim=4096, heads=32, ffn=14336, vocab=128256, seq=2048, batch=4, steps=10, lr=3e-4),
}


@dataclass
class ModelConfig:
    layers: int
    dim: int
    heads: int
    ffn: int
    vocab: int
    seq: int
    tie_embeddings: bool = False


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads = cfg.heads
        self.q_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        q, k, v = (p(x).view(b, s, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, d))


def rotate(x, cos, sin):
    """Rotary position embedding, the half-split (Llama/HF) layout."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.dim, eps=1e-5)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.dim, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=1e-5)
        head_dim = cfg.dim // cfg.heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(cfg.seq, dtype=torch.float32), inv_freq).repeat(1, 2)
        # Not persistent: derived from the config, so state_dicts hold only learned tensors.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens):
        s = tokens.shape[1]
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, self.cos[:s], self.sin[:s])
        return self.norm(x)


class GPT(nn.Module):
    """Root module: parameter names read model.layers.3.mlp.up_proj.weight, lm_head.weight."""

    def __init__(self, cfg):
        super().__init__()
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens, targets):
        logits = self.lm_head(self.model(tokens))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def build_model(cfg, device):
    """The model with its weights made directly on `device` (a 3B model never visits host RAM)."""
    with torch.device(device):
        return GPT(cfg)


def count_params(cfg):
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(cfg).parameters())


class SyntheticTokens:
    """Learnable, deterministic batches: walks along a fixed random cycle of the vocabulary with
    10% noise tokens, so next-token loss falls fast. Each rank draws its own stream.

    With `min_seq`, each batch has its own length, uniform in [min_seq, seq] (dynamic padding to
    a batch's longest sample). The lengths come from a generator of their own seeded by `seed`
    alone: every rank and every rerun sees the same length at the same micro-step, and the
    token stream of a run without `min_seq` is unchanged."""

    def __init__(self, vocab, seq, batch, seed, rank=0, min_seq=None):
        self.order = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
        self.gen = torch.Generator().manual_seed(seed * 1009 + 1 + rank)
        self.length_gen = torch.Generator().manual_seed(seed * 1009) if min_seq is not None else None
        self.vocab, self.seq, self.batch, self.min_seq = vocab, seq, batch, min_seq

    def next_length(self):
        if self.length_gen is None:
            return self.seq
        return int(torch.randint(self.min_seq, self.seq + 1, (), generator=self.length_gen))

    def next(self, device):
        seq = self.next_length()
        start = torch.randint(self.vocab, (self.batch, 1), generator=self.gen)
        tokens = self.order[(start + torch.arange(seq + 1)) % self.vocab]
        noise = torch.rand(tokens.shape, generator=self.gen) < 0.1
        tokens = torch.where(noise, torch.randint(self.vocab, tokens.shape, generator=self.gen), tokens)
        return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def make_optimizer(model, lr, device):
    # fused AdamW is one kernel per step on CUDA; CPU keeps the default (foreach) path.
    fused = torch.device(device).type == "cuda"
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=fused or None)


def make_scheduler(optimizer, steps, warmup):
    def factor(step):  # linear warm-up, then cosine down to 10%
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    for name in ("layers", "dim", "heads", "ffn", "vocab", "seq", "batch", "steps"):
        p.add_argument(f"--{name}", type=int, help=f"overrides the preset's {name}")
    p.add_argument("--lr", type=float, help="peak learning rate (preset's by default)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps of the LR schedule")
    p.add_argument("--tie-embeddings", action="store_true")
    p.add_argument("--fsdp2", action="store_true",
                   help="under torchrun, shard with FSDP2 (fully_shard per layer and on the root) instead of DDP")
    p.add_argument("--accum", type=int, default=1, help="gradient accumulation micro-steps")
    p.add_argument("--min-seq", type=int,
                   help="vary each micro-batch's length uniformly in [MIN_SEQ, seq] (dynamic padding); "
                        "by default every batch has the full --seq")
    p.add_argument("--clip", type=float, default=1.0, help="max grad norm (0 disables)")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic CUDA kernels, for bit-exact twin runs on a GPU")
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--losses-out", help="write the per-step losses as a JSON list (rank 0)")
    p.add_argument("--checkpoint-at", type=int, help="save model+optimizer after this step")
    p.add_argument("--checkpoint-out", default="checkpoint.pt")
    p.add_argument("--state-out", help="save the final model state_dict here (rank 0)")
    p.add_argument("--print-params", action="store_true", help="print the parameter count and exit")
    args = p.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.min_seq is not None and not 1 <= args.min_seq <= args.seq:
        p.error(f"--min-seq must be between 1 and --seq ({args.seq}), got {args.min_seq}")
    return args


def shard_fsdp2(model) -> None:
    """FSDP2 as torchtitan applies it: each decoder layer is a unit, the root holds the rest."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


def full_state(model, fsdp2: bool):
    """The model's state_dict; under FSDP2 with whole tensors (a collective: every rank calls it)."""
    state = model.state_dict()
    return {name: value.full_tensor() for name, value in state.items()} if fsdp2 else state


def setup_device(choice):
    """Device and (rank, world); joins the torchrun process group when WORLD_SIZE > 1."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if choice == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device, (dist.get_rank() if world > 1 else 0), world


def peak_memory_text(device):
    if device.type == "cuda":
        return f"peak_device_mem_gib {torch.cuda.max_memory_allocated(device) / 2**30:.2f}"
    return f"peak_host_rss_gib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f}"


def make_deterministic() -> None:
    """Kernels that give the same bits run after run, so two runs can be compared exactly.

    Strict mode, not warn_only: PyTorch's fused attention backward passes (flash, memory-efficient)
    accumulate with atomics unless determinism is enforced, then they do not; cuDNN attention has
    no deterministic kernel (bench/sdpa_determinism.py on the H200, 2026-12-01). The math path,
    deterministic either way, saves every attention probability: too much memory for large presets."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.enable_cudnn_sdp(False)


def main(argv=None):
    args = parse_args(argv)
    cfg = ModelConfig(args.layers, args.dim, args.heads, args.ffn, args.vocab, args.seq, args.tie_embeddings)
    if args.print_params:
        print(f"{count_params(cfg):,}")
        return
    if args.deterministic:
        make_deterministic()
    device, rank, world = setup_device(args.device)
    torch.manual_seed(args.seed)
    model = build_model(cfg, device)
    ddp = DDP(model) if world > 1 and not args.fsdp2 else None
    if args.fsdp2:
        shard_fsdp2(model)
    net = ddp or model
    optimizer = make_optimizer(model, args.lr, device)
    scheduler = make_scheduler(optimizer, args.steps, args.warmup)
    data = SyntheticTokens(args.vocab, args.seq, args.batch, args.seed, rank, args.min_seq)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast == "bf16")
    losses, step_ms = [], []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        tokens = 0  # this rank's; every rank has the same lengths
        for micro in range(args.accum):
            x, y = data.next(device)
            tokens += x.numel()
            # DDP all-reduces gradients only on the last micro-step.
            sync = ddp is None or micro == args.accum - 1
            if args.fsdp2:  # FSDP2 reduce-scatters gradients only on the last micro-step
                model.set_requires_gradient_sync(micro == args.accum - 1)
            with (contextlib.nullcontext() if sync else ddp.no_sync()):
                with autocast:
                    loss = net(x, y) / args.accum
                loss.backward()
            total += loss.detach()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        scheduler.step()
        losses.append(total.item())  # .item() waits for the whole step, so the timing is honest
        step_ms.append((time.perf_counter() - t0) * 1e3)
        if rank == 0 and args.log_every > 0 and step % args.log_every == 0:
            tok_s = tokens * world / (step_ms[-1] / 1e3)
            print(f"step {step} loss {losses[-1]:.4f} tok/s {tok_s:.0f}", flush=True)
        if step == args.checkpoint_at and (rank == 0 or args.fsdp2):
            checkpoint = {"step": step, "model": full_state(model, args.fsdp2), "optimizer": optimizer.state_dict()}
            if rank == 0:
                torch.save(checkpoint, args.checkpoint_out)
    final_state = full_state(model, args.fsdp2) if args.state_out and (rank == 0 or args.fsdp2) else None
    if rank == 0:
        if args.losses_out:
            with open(args.losses_out, "w") as f:
                json.dump(losses, f)
        if args.state_out:
            torch.save(final_state, args.state_out)
        measured = step_ms[1:] or step_ms  # the first step builds optimizer state and warms up
        print(f"done steps {args.steps} median_step_ms {statistics.median(measured):.1f} "
              f"{peak_memory_text(device)}", flush=True)
    if world > 1:
        dist.barrier()  # no rank tears gloo down while another still writes (tests/clients/fsdp2_train.py)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
