#!/bin/sh
# entropyinfer in llama.cpp on the GPU (`make llama-cpp-cuda`), measured with llama.cpp's own tools
# on the device machine. Writes $EVAL_CUDA_OUT (default build/llama_cpp_cuda_eval/): perplexity.md
# (eval.sh's report of the GPU runs), bench.txt (llama-bench), and every log.
#
#   sh examples/llama.cpp/eval_cuda.sh
#
# 1. Perplexity (eval.sh with the CUDA build, every layer offloaded, -fa on, the same text, contexts,
#    batch and ubatch as the CPU eval): SmolLM2-135M at 8k and Gemma 3 270M at 16k/32k, modes
#    entropyinfer (the paper's configuration), quality (preset=quality), quality-mask (the same plans
#    run by llama.cpp's flash attention through the plan's mask: executor=mask) and time-dense (llama.cpp's
#    flash attention, the dense perplexity); gpu_timing=1 times our ops and llama.cpp's attention in
#    the served layers with a synchronisation around each (the same way for both).
#    Then one run with CUDA graphs off (GGML_CUDA_DISABLE_GRAPHS=1): the same perplexity.
# 2. Speed (llama-bench, one prompt of P tokens, -ub EVAL_CUDA_UBATCH): prefill tokens/s dense and
#    with entropyinfer (preset=quality; mask: executor=mask), Gemma 3 270M at 16k..128k (beyond 32k:
#    past its trained context, speed only).
# Variables: EVAL_CUDA_ONLY (ppl,bench: the parts), EVAL_CUDA_PROMPTS (16384,32768,65536,131072),
# EVAL_CUDA_UBATCH (512; a comma list: each), EVAL_CUDA_BENCH_MODES (dense,quality,mask,time-quality,
# time-mask,time-ei-dense,time-dense), EVAL_CUDA_SMOL_MODES / EVAL_CUDA_GEMMA_MODES (eval.sh's modes),
# LLAMA_CPP_CUDA_BIN (build/llama.cpp-cuda/bin).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${LLAMA_CPP_CUDA_BIN:-build/llama.cpp-cuda/bin}
OUT=${EVAL_CUDA_OUT:-build/llama_cpp_cuda_eval}
ONLY=${EVAL_CUDA_ONLY:-ppl,bench}
PROMPTS=${EVAL_CUDA_PROMPTS:-16384,32768,65536,131072}
UB=${EVAL_CUDA_UBATCH:-512}
BENCH_MODES=$(echo "${EVAL_CUDA_BENCH_MODES:-dense,quality,mask,time-quality,time-mask,time-ei-dense,time-dense}" | tr ',' ' ')
GEMMA=${GEMMA_MODEL:-.cache/model/gemma-3-270m-q4_k_m.gguf}
mkdir -p "$OUT"
say() { echo "eval_cuda: $*" >&2; }

case ",$ONLY," in *,ppl,*)
    only=""
    [ -s .cache/model/SmolLM2-135M-Instruct.Q4_1.gguf ] && only="smollm2"
    [ -s "$GEMMA" ] && only="${only:+$only,}gemma"
    say "perplexity: $only"
    LLAMA_PERPLEXITY=$BIN/llama-perplexity EVAL_ONLY=$only EVAL_LOGS=$OUT/ppl EVAL_OUT=$OUT/perplexity.md \
        SMOL_MODES=${EVAL_CUDA_SMOL_MODES:-entropyinfer,quality,quality-mask,time-dense} \
        GEMMA_MODES=${EVAL_CUDA_GEMMA_MODES:-entropyinfer,quality,quality-mask,time-dense} \
        EVAL_EXTRA_ARGS="-ngl 99 --entropyinfer-opt gpu_timing=1" sh examples/llama.cpp/eval.sh || say "eval.sh failed"
    if [ -s .cache/model/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
        say "CUDA graphs off: SmolLM2 8k quality"
        GGML_CUDA_DISABLE_GRAPHS=1 "$BIN/llama-perplexity" -m .cache/model/SmolLM2-135M-Instruct.Q4_1.gguf \
            -f .cache/corpus/debian-handbook.txt -c 8192 --chunks 1 -b 8192 -ub 512 -fa on -ngl 99 \
            --entropyinfer --entropyinfer-opt preset=quality > "$OUT/smollm2-8192-quality-nographs.log" 2>&1 ||
            say "the graphs-off run failed"
        grep -h "Final estimate\|entropyinfer: mode" "$OUT/smollm2-8192-quality-nographs.log" >&2 || true
    fi
;; esac

case ",$ONLY," in *,bench,*)
    [ -s "$GEMMA" ] || { say "no $GEMMA: no bench"; exit 0; }
    for ub in $(echo "$UB" | tr ',' ' '); do
    for p in $(echo "$PROMPTS" | tr ',' ' '); do
        # dense and quality: tokens/s; the others time the served layers' attention (a synchronisation
        # around each op): ours with plans (quality), ours dense (ei-dense), llama.cpp's (time-dense)
        for mode in $BENCH_MODES; do
            case $mode in
                dense)         args="";;
                quality)       args="--entropyinfer --entropyinfer-opt preset=quality";;
                mask)          args="--entropyinfer --entropyinfer-opt preset=quality,executor=mask";;
                time-mask)     args="--entropyinfer --entropyinfer-opt preset=quality,executor=mask,gpu_timing=1";;
                time-quality)  args="--entropyinfer --entropyinfer-opt preset=quality,gpu_timing=1";;
                time-ei-dense) args="--entropyinfer --entropyinfer-opt mode=ei-dense,gpu_timing=1";;
                time-dense)    args="--entropyinfer --entropyinfer-opt mode=time-dense,gpu_timing=1";;
            esac
            log=$OUT/bench-gemma-$p-ub$ub-$mode.log
            # shellcheck disable=SC2086
            "$BIN/llama-bench" -m "$GEMMA" -p "$p" -n 0 -b "$p" -ub "$ub" -fa 1 -ngl 99 -r 2 $args > "$log" 2>&1 ||
                say "llama-bench $p $ub $mode failed (see $log)"
            { echo "## gemma -p $p -ub $ub $mode"; grep -E '^\|' "$log" | tail -n 1; grep 'entropyinfer: mode' "$log" | tail -n 1; } >> "$OUT/bench.txt"
        done
    done
    done
    cat "$OUT/bench.txt" >&2
;; esac
