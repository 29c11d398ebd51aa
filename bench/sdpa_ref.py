"""PyTorch SDPA reference timings for bench/ei_bench_cuda.c.

python3 bench/sdpa_ref.py 32768 65536 131072
prints one line per size: `sdpa <n_tokens> <median ms> <TFLOP/s>` for causal
attention with 32 query heads, 8 kv heads (enable_gqa), head_dim 128, bf16, the
shapes the C benchmark uses (random values: SDPA's time does not depend on them),
then `kernel <n_tokens> <name>`: the GPU kernel that took the most time in one
more call under torch.profiler (which SDPA backend ran: cuDNN's
`cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma...` on an H200, or
FlashAttention-2's `pytorch_flash::flash_fwd_kernel`), so that the ratio keeps
its meaning.
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


def top_kernel(fn):
    """The name of the GPU kernel with the most device time in one call of fn."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0]
    if not events:
        return "?"
    return max(events, key=lambda e: e.device_time_total).key.replace(" ", "_")


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
        print(f"kernel {n} {top_kernel(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))}",
              flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
