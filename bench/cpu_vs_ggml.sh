#!/bin/sh
# bench/cpu_vs_ggml.sh GGML_DIR [N] [THREADS]   (GGML_DIR: a ggml checkout or a llama.cpp tree)
# Issue 16's CPU comparison in one run, on this machine, side by side:
#   - the CPU, and the vdpbf16ps / f32 FMA rate ratio the library measured;
#   - dense attention (8/2 heads, dim 128, N tokens, default 16384) with the
#     DEFAULT kernel choice and with every kernel forced (avx512, avx2, and for
#     bf16 the vdpbf16ps and AMX tile kernels where the CPU has them);
#   - ggml's flash_attn_ext (f32 Q; K/V f16, bf16 and f32) on the same shapes;
#   - profiling at 32k with ONE kv head (8/1 heads): its share of dense attention;
#   - one decode step (32/8 heads, dim 128, 32768 cached keys, bf16): ours split
#     by kv head and along the keys, ggml's, and the memory bandwidth ceiling.
# GGML_DIR: a ggml checkout or a llama.cpp source tree (an unpatched one, e.g.
# the one examples/llama.cpp/fetch_llama_cpp.sh unpacks under .cache/llama.cpp/).
# Run it on a quiet machine: every figure is a best-of-reps wall time.
set -eu
GGML_DIR=${1:?usage: cpu_vs_ggml.sh GGML_DIR [N] [THREADS]}
N=${2:-16384}
T=${3:-2}
HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
make -s build/ei_bench build/bench_decode
echo "== machine"
grep -m1 'model name' /proc/cpuinfo || true
grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512f|avx512_bf16|avx512_fp16|amx_bf16|avx2)$' | tr '\n' ' '; echo
nproc
echo "== peak FLOP rates"
./build/ei_bench --peak --threads "$T"
echo "== dense/sparse attention, N=$N, 8/2 heads, dim 128, $T threads"
for dt in f32 bf16; do
    for k in auto avx512 avx2 dpbf16 amx; do
        if { [ "$k" = dpbf16 ] || [ "$k" = amx ]; } && [ "$dt" = f32 ]; then continue; fi
        echo "-- dtype $dt kernel $k"
        ./build/ei_bench --n "$N" --threads "$T" --dtype "$dt" --kernel "$k" --json 2>&1 || echo "(kernel $k not available)"
    done
done
echo "== ggml flash_attn_ext, same shapes"
for kv in f16 bf16 f32; do
    bench/run_ggml_peer.sh "$GGML_DIR" --n "$N" --threads "$T" --kv "$kv" --reps 2
done
echo "== profiling with one kv head, 32768 tokens, 8/1 heads"
./build/ei_bench --n 32768 --heads 8 --kv-heads 1 --threads "$T" --dtype bf16 --json
echo "== one decode step, 32768 keys, 32/8 heads, dim 128"
for lay in token head; do
    ./build/bench_decode --n 32768 --heads 32 --kv-heads 8 --threads "$T" --dtype bf16 --reps 5 --layout "$lay"
done
for kv in bf16 f16; do
    bench/run_ggml_peer.sh "$GGML_DIR" --n 32768 --heads 32 --kv-heads 8 --threads "$T" --kv "$kv" --reps 5 --decode 1
done
