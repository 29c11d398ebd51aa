"""PyTorch SDPA at an engine's micro-batch shape, beside bench/ei_bench_chunk_cuda.c.

python3 bench/sdpa_chunk.py [H KV D n m ...]   (default: Gemma 3 270M's global layers,
                                                4 1 256 32768 512  4 1 256 32768 4096
                                                4 1 256 131072 512  4 1 256 131072 4096)
m queries against the n keys before and including them, bf16, GQA (enable_gqa). The
causal mask inside the micro-batch is left out (SDPA's is_causal aligns the top-left
corner when m != n, and an explicit mask would leave the flash kernels): every query
sees all n keys, m/2 keys more than causal attention would (1% at 32k, m = 512).
Prints one line per shape: `sdpa H KV D n m <median ms> <TFLOP/s> <kernel>`, the
kernel being the one with the most device time in one more call (torch.profiler).
"""
import sys

import torch
import torch.nn.functional as F

from sdpa_ref import time_ms, top_kernel


def main():
    a = [int(x) for x in sys.argv[1:]] or [4, 1, 256, 32768, 512, 4, 1, 256, 32768, 4096,
                                          4, 1, 256, 131072, 512, 4, 1, 256, 131072, 4096]
    torch.manual_seed(0)
    for i in range(0, len(a) - 4, 5):
        H, KV, D, n, m = a[i:i + 5]
        q = torch.randn(1, H, m, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, KV, n, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, KV, n, D, device="cuda", dtype=torch.bfloat16)
        fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        ms = time_ms(fn, reps=9)
        flops = 4.0 * D * H * m * n
        print(f"sdpa {H} {KV} {D} {n} {m} {ms:.3f} {flops / ms / 1e9:.1f} {top_kernel(fn)}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
