"""PyTorch SDPA reference timings for bench/ei_bench_cuda.c.

python3 bench/sdpa_ref.py 32768 65536 131072
prints one line per size: `sdpa <n_tokens> <median ms> <TFLOP/s>` for causal
attention with 32 query heads, 8 kv heads (enable_gqa), head_dim 128, bf16, the
shapes the C benchmark uses (random values: SDPA's time does not depend on them).
"""
import sys

import torch
import torch.nn.functional as F

H, KV, D = 32, 8, 128


def time_ms(fn, reps=5, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    sizes = [int(x) for x in sys.argv[1:]] or [32768, 65536, 131072]
    torch.manual_seed(0)
    for n in sizes:
        q = torch.randn(1, H, n, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, KV, n, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, KV, n, D, device="cuda", dtype=torch.bfloat16)
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
        flops = 4.0 * D * H * n * (n + 1) / 2
        print(f"sdpa {n} {ms:.3f} {flops / ms / 1e9:.1f}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
