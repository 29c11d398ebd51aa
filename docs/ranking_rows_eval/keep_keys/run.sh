#!/bin/bash
B=/tmp/ci-check/build/llama.cpp/bin/llama-perplexity
T=/work/main/.cache/corpus/debian-handbook.txt
run() { # model ctx keep
  start=$(date +%s.%N)
  $B -m $1 -f $T -c $2 --chunks 1 -b $2 -ub 512 -t 2 -fa on --entropyinfer --entropyinfer-opt preset=quality --entropyinfer-opt keep_keys=$3 > /tmp/kk-$(basename $1)-$2-$3.log 2>&1
  echo "$(basename $1) $2 keep_keys=$3 rc $? wall $(echo "$(date +%s.%N) - $start" | bc) s: $(grep -o 'entropyinfer: mode sparse.*' /tmp/kk-$(basename $1)-$2-$3.log) $(grep -o 'Final estimate: PPL = [0-9.]*' /tmp/kk-$(basename $1)-$2-$3.log)"
}
G=/tmp/ci-check/.cache/model/gemma-3-270m-q4_k_m.gguf
S=/tmp/ci-check/.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf
run $G 32768 0; run $G 32768 1; run $S 8192 0; run $S 8192 1; run $G 32768 1; run $G 32768 0
