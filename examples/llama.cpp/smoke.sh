#!/bin/sh
# examples/llama.cpp/smoke.sh - `make llama-cpp-smoke`: llama.cpp's own llama-perplexity
# with entropyinfer in its attention, on SmolLM2-135M-Instruct (Q4_1) and Gemma 3 270M
# (Q4_K_M; iSWA: 3 global layers of 18) and the licence texts of /usr/share/common-licenses
# (2 chunks of 2048 tokens; about 3 minutes on 2 cores).
#
# Fails unless
#   - the patched tool without --entropyinfer prints a perplexity (and, when
#     build/llama.cpp-vanilla exists, the unpatched tool's to the last digit);
#   - mode=time-dense (llama.cpp's attention, timed) prints the dense perplexity
#     to the last digit and its entropyinfer line times served layers;
#   - --entropyinfer with segments scaled down (segment_size=128, threshold_len=512,
#     base_budget=384) serves layers, keeps a sparse density < 1 and stays within
#     SMOKE_TOLERANCE (5%) of the dense perplexity: with ubatches of 512 in one
#     decode call, and with decode calls of 600 tokens in ubatches of 200 (chunks
#     that start inside a segment, final chunks continued by later ones);
#   - Gemma 3: --entropyinfer serves its global layers only (sliding-window layers are
#     reported and left to llama.cpp), density < 1, perplexity within SMOKE_TOLERANCE;
#   - decode compression: llama-completion generates 48 tokens with decode_budget 512; the
#     closing line reports a compression and cells=<before>->512, and generation went on;
#   - an unknown --entropyinfer-opt name is refused at start-up.
# Logs: build/llama_cpp_smoke/*.log.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

BIN=${LLAMA_CPP_BIN:-build/llama.cpp/bin}
VANILLA_BIN=${LLAMA_CPP_VANILLA_BIN:-build/llama.cpp-vanilla/bin}
SMOL=${SMOKE_MODEL:-.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf}
GEMMA=${SMOKE_GEMMA_MODEL:-.cache/model/gemma-3-270m-q4_k_m.gguf}
OUT=${SMOKE_OUT:-build/llama_cpp_smoke}
TOL=${SMOKE_TOLERANCE:-0.05}
THREADS=${SMOKE_THREADS:-$(nproc 2>/dev/null || echo 2)}

die() { echo "llama-cpp-smoke: FAIL: $*" >&2; exit 1; }

[ -x "$BIN/llama-perplexity" ] || die "$BIN/llama-perplexity missing (make llama-cpp)"
if [ ! -s "$SMOL" ] || [ ! -s "$GEMMA" ]; then
    sh examples/llama.cpp/fetch_models.sh >/dev/null
fi
for m in "$SMOL" "$GEMMA"; do
    [ -s "$m" ] || die "model $m missing (sh examples/llama.cpp/fetch_models.sh)"
done
MODEL=$SMOL

mkdir -p "$OUT"
TEXT=$OUT/licences.txt
# the regular files only (GPL, LGPL, GFDL are links to versioned texts), in name order
find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort | xargs cat > "$TEXT"
[ "$(wc -c < "$TEXT")" -gt 100000 ] || die "$TEXT: too little text in /usr/share/common-licenses"

EI="--entropyinfer --entropyinfer-opt segment_size=128 --entropyinfer-opt threshold_len=512 --entropyinfer-opt base_budget=384"

# run NAME BINDIR ARGS...: llama-perplexity, log in $OUT/NAME.log; sets PPL and EILINE
run() {
    name=$1 bindir=$2
    shift 2
    log=$OUT/$name.log
    echo "llama-cpp-smoke: $name: llama-perplexity $*" >&2
    if ! "$bindir/llama-perplexity" -m "$MODEL" -f "$TEXT" -c 2048 --chunks 2 -t "$THREADS" -fa on "$@" > "$log" 2>&1; then
        tail -20 "$log" >&2
        die "$name: llama-perplexity failed (log $log)"
    fi
    PPL=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$log" | tail -1)
    [ -n "$PPL" ] || die "$name: no final perplexity in $log"
    EILINE=$(grep '^entropyinfer: mode ' "$log" | tail -1 || true)
    printf '  %-14s PPL %s   %s\n' "$name" "$PPL" "$EILINE" >&2
}

# field NAME LINE: the value after "NAME " in the entropyinfer line
field() { echo "$2" | sed -n "s/.*[ ,]$1 \([^ ,]*\).*/\1/p"; }

within() { # within A B TOL: |A/B - 1| <= TOL
    awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { r = a / b - 1; if (r < 0) r = -r; exit !(r <= t) }'
}

check_sparse() { # NAME: served layers, density < 1, perplexity near dense
    layers=$(field layers "$EILINE")
    density=$(field density "$EILINE")
    [ -n "$EILINE" ] || die "$1: no 'entropyinfer: mode' line"
    [ "${layers%%/*}" -gt 0 ] 2>/dev/null || die "$1: no layer served ($EILINE)"
    awk -v d="$density" 'BEGIN { exit !(d > 0 && d < 1) }' || die "$1: sparse density '$density' not in (0, 1) ($EILINE)"
    within "$PPL" "$DENSE" "$TOL" || die "$1: perplexity $PPL not within $TOL of dense $DENSE"
}

run dense "$BIN" -b 2048 -ub 512
DENSE=$PPL
grep -q '^entropyinfer:' "$OUT/dense.log" && die "dense: an entropyinfer line without --entropyinfer"

if [ -x "$VANILLA_BIN/llama-perplexity" ]; then
    run vanilla "$VANILLA_BIN" -b 2048 -ub 512
    [ "$PPL" = "$DENSE" ] || die "the patched tool without --entropyinfer gives $DENSE, unpatched llama.cpp $PPL"
fi

run time-dense "$BIN" $EI --entropyinfer-opt mode=time-dense -b 2048 -ub 512
[ "$PPL" = "$DENSE" ] || die "time-dense: perplexity $PPL, dense $DENSE (must be equal)"
[ -n "$(field dense-attention "$EILINE")" ] || die "time-dense: no dense-attention time ($EILINE)"

run sparse "$BIN" $EI -b 2048 -ub 512
check_sparse sparse

run sparse-ub200 "$BIN" $EI -b 600 -ub 200
check_sparse sparse-ub200

MODEL=$GEMMA
run gemma-dense "$BIN" -b 2048 -ub 512
DENSE=$PPL
run gemma-sparse "$BIN" $EI -b 2048 -ub 512
check_sparse gemma-sparse
[ "${layers%%/*}" -lt "${layers##*/}" ] || die "gemma-sparse: its sliding-window layers were served ($EILINE)"
grep -q '^entropyinfer: sliding-window layers' "$OUT/gemma-sparse.log" || die "gemma-sparse: no report of the sliding-window layers"
MODEL=$SMOL

# decode compression in llama.cpp's own generation tool: SmolLM2, a prompt of about 1200 tokens, 48
# tokens generated greedily with decode_budget 512: after decode_gap (16) generated tokens the glue
# computes one keep-set for the sequence, evicts the other cells and compacts the rest
echo "llama-cpp-smoke: decode: llama-completion --entropyinfer --entropyinfer-opt decode_budget=512 -n 48" >&2
head -c 6000 "$TEXT" > "$OUT/prompt.txt"
if ! "$BIN/llama-completion" -m "$SMOL" -f "$OUT/prompt.txt" -n 48 -c 2048 -t "$THREADS" -fa on --temp 0 -no-cnv \
        --ignore-eos --entropyinfer --entropyinfer-opt decode_budget=512 > "$OUT/decode.out" 2> "$OUT/decode.log"; then
    tail -20 "$OUT/decode.log" >&2
    die "decode: llama-completion failed (log $OUT/decode.log)"
fi
EILINE=$(grep '^entropyinfer: mode ' "$OUT/decode.log" | tail -1 || true)
printf '  %-14s %s\n' decode "$EILINE" >&2
comp=$(field compressions "$EILINE")
before=$(echo "$EILINE" | sed -n 's/.*cells=\([0-9]*\)->\([0-9]*\).*/\1/p')
after=$(echo "$EILINE" | sed -n 's/.*cells=\([0-9]*\)->\([0-9]*\).*/\2/p')
runs=$(sed -n 's/.* eval time = .*\/ *\([0-9]*\) runs.*/\1/p' "$OUT/decode.log" | tail -1)
[ "${comp:-0}" -ge 1 ] 2>/dev/null || die "decode: no compression reported ($EILINE)"
[ "$after" = 512 ] && [ "$before" -gt 512 ] 2>/dev/null || die "decode: cells in use $before->$after, expected ->512 ($EILINE)"
[ "$runs" = 47 ] || die "decode: $runs generation steps after the first token, 47 expected (log $OUT/decode.log)"

echo "llama-cpp-smoke: bad-option: llama-perplexity --entropyinfer-opt no_such_option=1" >&2
if "$BIN/llama-perplexity" -m "$MODEL" -f "$TEXT" --entropyinfer-opt no_such_option=1 > "$OUT/bad-option.log" 2>&1; then
    die "an unknown --entropyinfer-opt was accepted"
fi
grep -q "unknown option 'no_such_option'" "$OUT/bad-option.log" || die "no clear message for an unknown option ($OUT/bad-option.log)"

echo "llama-cpp-smoke: OK" >&2
