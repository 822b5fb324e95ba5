"""Does each fused attention backend give the same gradient bits twice, with PyTorch's
deterministic algorithms on in warn-only and in strict mode? The answer (2026-12-01, H200:
flash and memory-efficient only in strict mode, cuDNN never) decided the example's
--deterministic, which once fell back to math attention, whose saved probabilities do not fit
the large presets' budgets.

    python bench/sdpa_determinism.py            # on the GPU machine; prints one line per backend
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def grads(backend, dtype, seq, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(4, 32, seq, 128, device="cuda", dtype=dtype, generator=g).requires_grad_()
               for _ in range(3))
    with sdpa_kernel(backend):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum().backward()
    return [t.grad for t in (q, k, v)]


def main():
    for warn_only in (True, False):
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        for backend, dtype in ((SDPBackend.EFFICIENT_ATTENTION, torch.float32),
                               (SDPBackend.EFFICIENT_ATTENTION, torch.bfloat16),
                               (SDPBackend.FLASH_ATTENTION, torch.bfloat16),
                               (SDPBackend.CUDNN_ATTENTION, torch.bfloat16)):
            for seq in (1300, 2048):
                print(f"warn_only={warn_only} {backend.name} {dtype} seq {seq}: {same_twice(backend, dtype, seq)}")


def same_twice(backend, dtype, seq):
    try:
        same = all(torch.equal(a, b) for _ in range(3)
                   for a, b in zip(grads(backend, dtype, seq), grads(backend, dtype, seq)))
    except RuntimeError as e:
        return f"refused ({str(e).splitlines()[0][:120]})"
    return f"gradients {'identical' if same else 'DIFFER'} over 3 pairs of runs"


if __name__ == "__main__":
    main()
