#!/bin/sh
# examples/llama.cpp/eval_decode.sh - decode KV-cache compression inside llama.cpp,
# dense vs entropyinfer, with build/llama.cpp/bin/llama-ei-decode (ei_decode_eval.cpp).
# Part of `make llama-cpp-eval` (not in CI). Writes build/llama_cpp_decode_eval.md; every
# run's output and exact command are kept in build/llama_cpp_decode_eval/ (a run whose
# output is complete is not redone: delete the folder, or a file, to redo).
#
#   sh examples/llama.cpp/eval_decode.sh
#   DECODE_EVAL_RUNS=smollm2-8192 sh examples/llama.cpp/eval_decode.sh
#
# For each MODEL-CONTEXT of DECODE_EVAL_RUNS (default smollm2-8192,gemma-16384,gemma-32768;
# the text: the Debian Administrator's Handbook, examples/gemma/fetch_corpus.sh):
#   continuation  the first CONTEXT - 256 tokens as the prompt, then 256 tokens fed one
#                 llama_decode call each (as generated tokens are): compression fires after
#                 decode_gap (16) of them; perplexity and top-1 agreement with dense over the
#                 tokens after it, KV cells/bytes before and after, ms per decode step after it
#   passkey       a pass key at 10/50/90% depth of CONTEXT tokens of the text; the question's
#                 last 16 tokens fed one by one (compression fires before the answer), then 8
#                 tokens generated greedily
# in two modes: dense (the patched tool, no flag: llama.cpp unchanged) and entropyinfer
# (--entropyinfer: sparse prefill and decode compression, the paper's configuration:
# decode_budget 1024, window 32, decode_gap 16, avgpool 5; DECODE_EVAL_OPTS=name=value,...
# adds options).
# Environment: DECODE_EVAL_THREADS (nproc), DECODE_EVAL_TEXT, SMOL_MODEL, GEMMA_MODEL,
# DECODE_EVAL_OUT (build/llama_cpp_decode_eval.md), DECODE_EVAL_LOGS (build/llama_cpp_decode_eval).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

BIN=${LLAMA_EI_DECODE:-build/llama.cpp/bin/llama-ei-decode}
TEXT=${DECODE_EVAL_TEXT:-.cache/corpus/debian-handbook.txt}
SMOL=${SMOL_MODEL:-.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf}
GEMMA=${GEMMA_MODEL:-.cache/model/gemma-3-270m-q4_k_m.gguf}
RUNS=${DECODE_EVAL_RUNS:-smollm2-8192,gemma-16384,gemma-32768}
THREADS=${DECODE_EVAL_THREADS:-$(nproc 2>/dev/null || echo 2)}
LOGS=${DECODE_EVAL_LOGS:-build/llama_cpp_decode_eval}
OUT=${DECODE_EVAL_OUT:-build/llama_cpp_decode_eval.md}
OPTS=${DECODE_EVAL_OPTS:-}
CONT=256

die() { echo "eval_decode: $*" >&2; exit 1; }
[ -x "$BIN" ] || die "$BIN missing (make llama-cpp)"
[ -s "$TEXT" ] || die "$TEXT missing (sh examples/gemma/fetch_corpus.sh)"
mkdir -p "$LOGS"

# one NAME ARGS...: llama-ei-decode ARGS into $LOGS/NAME.out (stdout), .err, .cmd; kept when complete
one() {
    name=$1
    shift
    if [ -s "$LOGS/$name.out" ] && grep -q '^compress_s ' "$LOGS/$name.out"; then
        return 0
    fi
    echo "$BIN $*" > "$LOGS/$name.cmd"
    echo "eval_decode: $name: $BIN $*" >&2
    t0=$(date +%s)
    if ! "$BIN" "$@" > "$LOGS/$name.out" 2> "$LOGS/$name.err"; then
        tail -5 "$LOGS/$name.err" >&2
        die "$name failed (log $LOGS/$name.err)"
    fi
    echo "wall_s $(( $(date +%s) - t0 ))" >> "$LOGS/$name.out"
}

for run in $(echo "$RUNS" | tr ',' ' '); do
    model=${run%-*}
    ctx=${run##*-}
    case $model in
        smollm2) M=$SMOL ;;
        gemma)   M=$GEMMA ;;
        *) die "unknown model in $run (smollm2 or gemma)" ;;
    esac
    [ -s "$M" ] || die "model $M missing (sh examples/llama.cpp/fetch_models.sh)"
    for mode in dense entropyinfer; do
        if [ $mode = dense ]; then set -- ; else set -- --entropyinfer; [ -n "$OPTS" ] && set -- "$@" --entropyinfer-opt "$OPTS"; fi
        one "$run-$mode-cont" -m "$M" -f "$TEXT" -c "$ctx" -t "$THREADS" --cont $CONT "$@"
        for dk in 0.1,52817 0.5,30491 0.9,77264; do
            one "$run-$mode-passkey-${dk%,*}" -m "$M" -f "$TEXT" -c "$ctx" -t "$THREADS" --passkey "$dk" "$@"
        done
    done
done

# ---- report
val() { sed -n "s/^$2 //p" "$1" | head -1; }
ppl_from() { # perplexity over steps FROM.. of a run's nll line
    awk -v from="$2" '$1 == "nll" { for (i = 2; i <= NF; i++) if (i - 2 >= from) { n++; s += $i } }
        END { if (n) printf "%.4f", exp(s / n); else printf "-" }' "$1"
}
agree() { # top-1 agreement of two argmax lines over steps FROM.. (the tokens after compression)
    awk -v from="$3" 'NR == FNR { if ($1 == "argmax") for (i = 2; i <= NF; i++) a[i] = $i; next }
        $1 == "argmax" { for (i = 2; i <= NF; i++) if (i - 2 >= from) { n++; s += ($i == a[i]) } }
        END { if (n) printf "%.2f %%", 100 * s / n; else printf "-" }' "$1" "$2"
}
{
    echo "# Decode KV-cache compression inside llama.cpp"
    echo
    echo "llama-ei-decode (examples/llama.cpp/ei_decode_eval.cpp), $THREADS threads, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //'),"
    echo "text $(basename "$TEXT"); entropyinfer: --entropyinfer${OPTS:+ --entropyinfer-opt $OPTS} (sparse prefill, then one"
    echo "keep-set per sequence after decode_gap fed tokens, the other KV cells evicted with llama_memory's seq_rm and the"
    echo "rest moved to the front). Continuation: $CONT tokens fed one by one after a prompt of the context minus $CONT;"
    echo "perplexity, agreement and ms per step over the tokens after the compression (dense: from step 16, where"
    echo "compression fires with the default decode_gap). Commands and outputs: $LOGS/."
    echo
    echo "| model, context | mode | KV cells before -> after | KV bytes before -> after | compress s | decode ms/token (tok/s) | continuation perplexity | vs dense | top-1 agreement | passkey 10/50/90 % |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for run in $(echo "$RUNS" | tr ',' ' '); do
        d=$LOGS/$run-dense-cont.out
        for mode in dense entropyinfer; do
            f=$LOGS/$run-$mode-cont.out
            [ -s "$f" ] || continue
            from=$(val "$f" after_from)
            [ "$from" -ge 0 ] 2>/dev/null || from=0
            ms=$(val "$f" step_ms_after)
            pk=""
            for dep in 0.1 0.5 0.9; do
                p=$LOGS/$run-$mode-passkey-$dep.out
                if [ -s "$p" ]; then pk="$pk$(val "$p" passkey_ok)"; else pk="$pk-"; fi
                [ $dep = 0.9 ] || pk="$pk/"
            done
            if [ $mode = dense ]; then
                cells="$(val "$f" prompt_tokens) + $CONT (no eviction)"
                bytes="-"
                cs="-"
                vs="(reference)"
                ag="-"
                pplo=$(ppl_from "$f" 16)
            else
                cells="$(val "$f" cells_before) -> $(val "$f" cells_after)"
                bytes="$(awk '$1 == "kv_bytes_before" { b = $2 } $1 == "kv_bytes_after" { a = $2 } END { printf "%.1f -> %.1f MiB", b / 1048576, a / 1048576 }' "$f")"
                cs=$(val "$f" compress_s)
                pplo=$(ppl_from "$f" "$from")
                ag=$(agree "$d" "$f" "$from")
                vs=$(awk -v a="$pplo" -v b="$(ppl_from "$d" "$from")" 'BEGIN { if (b > 0) printf "%+.2f %% (dense %.4f)", 100 * (a / b - 1), b }')
            fi
            tps=$(awk -v m="$ms" 'BEGIN { if (m > 0) printf "%.1f (%.1f)", m, 1000 / m; else print "-" }')
            echo "| $run | $mode | $cells | $bytes | $cs | $tps | $pplo | $vs | $ag | $pk |"
        done
    done
    echo
    echo "llama.cpp's KV caches as allocated (llama_kv_cache: size lines of each dense run; the cells and bytes above"
    echo "are the compressed cache's: with iSWA models the base cache of the global layers, the sliding-window cache"
    echo "keeping its own cells):"
    echo
    for run in $(echo "$RUNS" | tr ',' ' '); do
        [ -s "$LOGS/$run-dense-cont.err" ] || continue
        grep 'llama_kv_cache: size' "$LOGS/$run-dense-cont.err" | sed "s/^/    $run: /"
    done
} > "$OUT"
cat "$OUT"
