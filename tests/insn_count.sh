#!/usr/bin/env bash
# tests/insn_count.sh PROGRAM RUNNER...: instructions of one attention tile
# (tests/insn_tile.c) per kernel and dtype, counted under qemu-user: with
# -singlestep every translation block is one guest instruction and
# -d exec,nochain logs every block executed, so the log's line count is the
# number of guest instructions retired. One tile = count(2 calls) - count(1
# call) (setup, first-call lazy binding and exit excluded). Counts, not time:
# ARM speed has not been measured on hardware.
set -euo pipefail
prog=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
count() { # count SIMD CALLS DTYPE
  mkfifo "$tmp/log"; wc -l < "$tmp/log" > "$tmp/n" & local wpid=$!
  "$@" -singlestep -d exec,nochain -D "$tmp/log" "$prog" "${args[@]}" > /dev/null
  wait $wpid; rm -f "$tmp/log"; cat "$tmp/n"
}
runner=("$@")
printf '%-8s %-5s %14s\n' kernel dtype "insns/tile"
for dt in ${DTYPES:-f32 f16 bf16}; do
  for k in ${KERNELS:-scalar neon $([ "$dt" = bf16 ] && echo neon-bf16 neon-bfmmla) $([ "$dt" = f16 ] && echo neon-fhm)}; do
    args=("$k" 1 "$dt"); n1=$(count "${runner[@]}")
    args=("$k" 2 "$dt"); n2=$(count "${runner[@]}")
    printf '%-8s %-5s %14d\n' "$k" "$dt" $((n2 - n1))
  done
done
