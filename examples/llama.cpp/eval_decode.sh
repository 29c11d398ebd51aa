#!/bin/sh
# examples/llama.cpp/eval_decode.sh - decode KV-cache compression inside llama.cpp (issue 37):
# every decode policy of the library (entropyinfer, the default; snapkv; streaming; h2o) at equal
# budgets, against dense, with build/llama.cpp/bin/llama-ei-decode (ei_decode_eval.cpp).
# `make decode-eval` runs it, then decode_report.py (JSON, markdown, SVG). Not in CI.
#
#   sh examples/llama.cpp/eval_decode.sh
#   DECODE_EVAL_RUNS=smollm2-8192 DECODE_EVAL_TEXTS=handbook sh examples/llama.cpp/eval_decode.sh
#
# For each text of DECODE_EVAL_TEXTS (handbook: the Debian Administrator's Handbook,
# examples/gemma/fetch_corpus.sh; perlfaq: the Perl FAQ of perl-doc, fetch_corpus2.sh) and each
# MODEL-CONTEXT of DECODE_EVAL_RUNS (smollm2-8192, gemma-16384, gemma-32768):
#   cont         the first CONTEXT - 256 tokens as the prompt, then 256 tokens fed one llama_decode
#                call each (as generated tokens are); compression fires after decode_gap (16) of
#                them and again every recompress_every (32) with a ratio budget, so the cache stays
#                near the kept fraction of the positions as generation goes on; perplexity and
#                top-1 agreement with dense over the tokens after the first compression
#   passkey-D    (handbook only) a pass key at depth D (0.1, 0.5, 0.9) of CONTEXT tokens; the
#                prompt's last DECODE_EVAL_FED (48) tokens fed one by one, so that compression
#                (after decode_gap, 16) fires before the question (its last ~11 tokens) is computed;
#                8 tokens generated greedily; dense and every policy at 1/4. A run that did not
#                compress before the question shows "?" in the report (set DECODE_EVAL_FED to at
#                least decode_gap + 12 for runs with a larger decode_gap)
# One llama-ei-decode process per (text, model-context, cont|passkey-D): ONE dense prefill, its KV
# cache saved and restored into a fresh context for each run (--run; see ei_decode_eval.cpp), so
# a 32k prefill is paid once, not 14 times. The prefill is dense for every policy: the runs then
# differ only in what decode compression keeps (sparse prefill's own cost is eval.sh's table).
# Runs whose output is complete are kept (delete a file to redo it); a process is started only
# for the runs missing. Every process's command, stdout and stderr are kept beside its runs.
# Environment: DECODE_EVAL_THREADS (nproc; the prefill), DECODE_EVAL_DECODE_THREADS (1; decode steps), SMOL_MODEL, GEMMA_MODEL, DECODE_EVAL_LOGS
# (build/decode_eval), DECODE_EVAL_KINDS (cont,passkey), DECODE_EVAL_OPTS (more options for
# every policy run, e.g. window=64).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

BIN=${LLAMA_EI_DECODE:-build/llama.cpp/bin/llama-ei-decode}
SMOL=${SMOL_MODEL:-.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf}
GEMMA=${GEMMA_MODEL:-.cache/model/gemma-3-270m-q4_k_m.gguf}
RUNS=${DECODE_EVAL_RUNS:-smollm2-8192,gemma-16384,gemma-32768}
TEXTS=${DECODE_EVAL_TEXTS:-handbook,perlfaq}
KINDS=${DECODE_EVAL_KINDS:-cont,passkey}
THREADS=${DECODE_EVAL_THREADS:-$(nproc 2>/dev/null || echo 2)}
DTHREADS=${DECODE_EVAL_DECODE_THREADS:-1} # single-token steps: 1 on a shared machine (see ei_decode_eval.cpp)
LOGS=${DECODE_EVAL_LOGS:-build/decode_eval}
OPTS=${DECODE_EVAL_OPTS:-}
CONT=256

die() { echo "eval_decode: $*" >&2; exit 1; }
[ -x "$BIN" ] || die "$BIN missing (make llama-cpp)"

# The policy runs: NAME:OPTIONS. Every policy at 1/8 and 1/4 of the positions; the default also at
# 1/16 and 1/2, with the entropy weighting of layers (decode_shared_weight=entropy) at 1/8, 1/4, and with
# half of the budget given to the newest positions (decode_recent=0.5) at 1/8, 1/4 (passkey: 1/4).
# The default's runs name decode_recent=0 (the paper's policy) so that they keep their meaning whatever
# the glue's default is.
# recompress_every 32 (= window): each window of generated queries scores once (H2O sums each
# generated query once), and the cache returns to the fraction every 32 tokens.
COMMON="recompress_every=32${OPTS:+,$OPTS}"
PAPER="decode_recent=0"
policy_runs() { # KIND
    echo "dense:dense"
    if [ "$1" = cont ]; then
        for r in 0.0625 0.125 0.25 0.5; do echo "entropyinfer-$r:decode_budget_ratio=$r,$PAPER,$COMMON"; done
        for r in 0.125 0.25; do
            echo "entropyinfer_entropyw-$r:decode_budget_ratio=$r,decode_shared_weight=entropy,$PAPER,$COMMON"
            echo "entropyinfer_recent-$r:decode_budget_ratio=$r,decode_recent=0.5,$COMMON"
            for p in snapkv streaming h2o; do echo "$p-$r:decode_policy=$p,decode_budget_ratio=$r,$COMMON"; done
        done
    else
        r=0.25
        for p in entropyinfer snapkv streaming h2o; do echo "$p-$r:decode_policy=$p,decode_budget_ratio=$r,$PAPER,$COMMON"; done
        echo "entropyinfer_recent-$r:decode_budget_ratio=$r,decode_recent=0.5,$COMMON"
    fi
}

for text in $(echo "$TEXTS" | tr ',' ' '); do
    case $text in
        handbook) T=$(sh examples/gemma/fetch_corpus.sh) ;;
        perlfaq)  T=$(sh examples/llama.cpp/fetch_corpus2.sh) ;;
        *) die "unknown text $text (handbook or perlfaq)" ;;
    esac
    for run in $(echo "$RUNS" | tr ',' ' '); do
        model=${run%-*}
        ctx=${run##*-}
        case $model in
            smollm2) M=$SMOL ;;
            gemma)   M=$GEMMA ;;
            *) die "unknown model in $run (smollm2 or gemma)" ;;
        esac
        [ -s "$M" ] || die "model $M missing (sh examples/llama.cpp/fetch_models.sh)"
        for kind in $(echo "$KINDS" | tr ',' ' '); do
            if [ "$kind" = cont ]; then
                set -- cont
            else
                [ "$text" = handbook ] || continue
                set -- passkey-0.1,52817 passkey-0.5,30491 passkey-0.9,77264
            fi
            for job in "$@"; do
                name=${job%%,*}
                dir=$LOGS/$text/$run/$name
                mkdir -p "$dir"
                set -- -m "$M" -f "$T" -c "$ctx" -t "$THREADS" -td "$DTHREADS" --out-dir "$dir"
                case $job in
                    passkey-*) set -- "$@" --passkey "${name#passkey-},${job#*,}" --fed "${DECODE_EVAL_FED:-48}" ;;
                    *) set -- "$@" --cont $CONT ;;
                esac
                missing=0
                for pr in $(policy_runs "${name%%-*}"); do
                    [ -s "$dir/${pr%%:*}.out" ] && continue
                    set -- "$@" --run "$pr"
                    missing=$((missing + 1))
                done
                [ $missing -gt 0 ] || continue
                stamp=$(date -u +%Y%m%dT%H%M%SZ)
                echo "$BIN $*" > "$dir/$stamp.cmd"
                echo "eval_decode: $text $run $name: $missing runs ($dir/$stamp.cmd)" >&2
                t0=$(date +%s)
                if ! "$BIN" "$@" > "$dir/$stamp.stdout" 2> "$dir/$stamp.stderr"; then
                    tail -5 "$dir/$stamp.stderr" >&2
                    die "$text $run $name failed (log $dir/$stamp.stderr)"
                fi
                echo "wall_s $(( $(date +%s) - t0 ))" >> "$dir/$stamp.stdout"
            done
        done
    done
done
echo "eval_decode: done; the report: python3 examples/llama.cpp/decode_report.py $LOGS" >&2
