#!/bin/sh
# examples/llama.cpp/bookkeeping.sh - `make llama-cpp-bookkeeping`: positions after decode
# compression (issue 34), llama-ei-bookkeeping (ei_bookkeeping_test.cpp) on SmolLM2-135M and
# Gemma 3 270M (iSWA: the base cache compressed, the sliding-window cache not), a prompt of 1200
# tokens of the licence texts of /usr/share/common-licenses; then llama-server's prompt-cache reuse
# after a compression and its "entropyinfer" request field (bookkeeping_server.py, SmolLM2).
# About half a minute on 2 cores. Fails when a check fails. Logs: build/llama_cpp_bookkeeping/*.log.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

BIN=${LLAMA_CPP_BIN:-build/llama.cpp/bin}
SMOL=${SMOKE_MODEL:-.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf}
GEMMA=${SMOKE_GEMMA_MODEL:-.cache/model/gemma-3-270m-q4_k_m.gguf}
OUT=${BOOKKEEPING_OUT:-build/llama_cpp_bookkeeping}
THREADS=${BOOKKEEPING_THREADS:-2}

die() { echo "llama-cpp-bookkeeping: FAIL: $*" >&2; exit 1; }

[ -x "$BIN/llama-ei-bookkeeping" ] || die "$BIN/llama-ei-bookkeeping missing (make llama-cpp)"
if [ ! -s "$SMOL" ] || [ ! -s "$GEMMA" ]; then
    sh examples/llama.cpp/fetch_models.sh >/dev/null
fi
mkdir -p "$OUT"
TEXT=$OUT/licences.txt
# the regular files only (GPL, LGPL, GFDL are links to versioned texts), in name order
find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort | xargs cat > "$TEXT"

for m in smollm2:"$SMOL" gemma3:"$GEMMA"; do
    name=${m%%:*}
    echo "llama-cpp-bookkeeping: $name" >&2
    if ! "$BIN/llama-ei-bookkeeping" -m "${m#*:}" -f "$TEXT" -t "$THREADS" > "$OUT/$name.log" 2> "$OUT/$name.err"; then
        cat "$OUT/$name.log" >&2
        tail -20 "$OUT/$name.err" >&2
        die "$name (log $OUT/$name.log)"
    fi
    sed 's/^/  /' "$OUT/$name.log" >&2
done
# llama-server: prompt-cache reuse after a compression, the request field "entropyinfer"
if [ -x "$BIN/llama-server" ]; then
    echo "llama-cpp-bookkeeping: llama-server (SmolLM2)" >&2
    if ! python3 examples/llama.cpp/bookkeeping_server.py "$BIN/llama-server" "$SMOL" "$TEXT" "$OUT/server.err" > "$OUT/server.log"; then
        cat "$OUT/server.log" >&2
        tail -20 "$OUT/server.err" >&2
        die "llama-server (log $OUT/server.log, server log $OUT/server.err)"
    fi
    sed 's/^/  /' "$OUT/server.log" >&2
else
    die "$BIN/llama-server missing (make llama-cpp)"
fi
echo "llama-cpp-bookkeeping: ok" >&2
