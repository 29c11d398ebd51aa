#!/bin/sh
# examples/llama.cpp/soak.sh - `make llama-cpp-soak`: llama-server with --entropyinfer under
# concurrent requests (issue 34): soak_server.py on SmolLM2-135M, prompts cut from the licence texts
# of /usr/share/common-licenses; a phase of 4 slots (--no-kv-unified, decode compression per slot), the same
# in the default unified cache (4 slots, one KV stream)
# and a phase of one slot. About 10 minutes on 2 cores idle (2026-12-06: 629 s); SOAK_BASELINE=1: the
# same load without --entropyinfer (throughput to compare).
# Fails when a check fails.
# Logs: build/llama_cpp_soak/{soak.log,parallel.err,unified.err,queued.err} (SOAK_OUT).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

BIN=${LLAMA_CPP_BIN:-build/llama.cpp/bin}
SMOL=${SMOKE_MODEL:-.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${SOAK_OUT:-build/llama_cpp_soak}

die() { echo "llama-cpp-soak: FAIL: $*" >&2; exit 1; }

[ -x "$BIN/llama-server" ] || die "$BIN/llama-server missing (make llama-cpp)"
[ -s "$SMOL" ] || sh examples/llama.cpp/fetch_models.sh >/dev/null
mkdir -p "$OUT"
TEXT=$OUT/licences.txt
# the regular files only (GPL, LGPL, GFDL are links to versioned texts), in name order
find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort | xargs cat > "$TEXT"

echo "llama-cpp-soak: llama-server (SmolLM2), $(nproc) cores" >&2
if ! python3 examples/llama.cpp/soak_server.py "$BIN/llama-server" "$SMOL" "$TEXT" "$OUT" > "$OUT/soak.log"; then
    cat "$OUT/soak.log" >&2
    for f in "$OUT"/*.err; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
    die "see $OUT/soak.log and the server logs $OUT/*.err"
fi
sed 's/^/  /' "$OUT/soak.log" >&2
echo "llama-cpp-soak: ok" >&2
