"""Does each fused attention backend give the same gradient bits twice, with PyTorch's
deterministic algorithms on? (The example's --deterministic falls back to math attention,
whose saved probabilities do not fit the 8B preset's budget.)

    python bench/sdpa_determinism.py            # on the GPU machine; prints one line per backend
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def grads(backend, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(4, 32, 2048, 128, device="cuda", dtype=dtype, generator=g).requires_grad_()
               for _ in range(3))
    with sdpa_kernel(backend):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum().backward()
    return [t.grad for t in (q, k, v)]


def main():
    torch.use_deterministic_algorithms(True, warn_only=True)
    for backend, dtype in ((SDPBackend.EFFICIENT_ATTENTION, torch.float32),
                           (SDPBackend.EFFICIENT_ATTENTION, torch.bfloat16),
                           (SDPBackend.FLASH_ATTENTION, torch.bfloat16),
                           (SDPBackend.CUDNN_ATTENTION, torch.bfloat16)):
        try:
            same = all(torch.equal(a, b) for _ in range(3) for a, b in zip(grads(backend, dtype), grads(backend, dtype)))
            print(f"{backend.name} {dtype}: gradients {'identical' if same else 'DIFFER'} over 3 pairs of runs")
        except RuntimeError as e:
            print(f"{backend.name} {dtype}: not available ({str(e).splitlines()[0]})")


if __name__ == "__main__":
    main()
