# bench/attention.mk - make fragment for the prefill attention benchmarks.
# Included by the top-level Makefile, or used alone from the repository root:
#     make -f bench/attention.mk bench
# (the attention tests, test-attention and test-attention-all, are in tests/tests.mk)
#
# Targets
#   bench                  build/ei_bench (dense vs sparse attention, profiling cost) and
#                          build/bench_decode (the decode keep-set next to one dense decode step)
#   bench-run              the reference runs: N = 8k,16k,32k, 2 threads, f32 and bf16, JSON
#   ggml-peer              build/ggml_peer against a ggml checkout (ATTN_GGML_DIR=/path/to/ggml)
#
# Its variables start with ATTN_; it reads CC and CFLAGS (added to ours).
# No -march: the header compiles its AVX2/AVX-512 kernels with per-function
# target attributes and picks one at run time.

ATTN_BUILD   ?= build
ATTN_CFLAGS   = -O2 -Wall -Wextra -Werror $(CFLAGS)
ATTN_LIBS     = -lm -lpthread -ldl
ATTN_DEPS     = entropyinfer.h

.PHONY: bench bench-run ggml-peer

bench: $(ATTN_BUILD)/ei_bench $(ATTN_BUILD)/bench_decode

$(ATTN_BUILD)/bench_decode: bench/bench_decode.c $(ATTN_DEPS)
	@mkdir -p $(ATTN_BUILD)
	$(CC) -std=c99 $(ATTN_CFLAGS) -o $@ bench/bench_decode.c $(ATTN_LIBS)

$(ATTN_BUILD)/ei_bench: bench/ei_bench.c $(ATTN_DEPS)
	@mkdir -p $(ATTN_BUILD)
	$(CC) -std=c99 $(ATTN_CFLAGS) -o $@ bench/ei_bench.c $(ATTN_LIBS)

bench-run: $(ATTN_BUILD)/ei_bench
	$(ATTN_BUILD)/ei_bench --peak --threads 2
	$(ATTN_BUILD)/ei_bench --n 8192,16384,32768 --threads 2 --dtype f32 --json
	$(ATTN_BUILD)/ei_bench --n 8192,16384,32768 --threads 2 --dtype bf16 --json

# ggml's CPU flash attention on the same shapes (see bench/run_ggml_peer.sh).
ATTN_GGML_DIR ?=
ggml-peer:
	@test -n "$(ATTN_GGML_DIR)" || { echo "set ATTN_GGML_DIR to a ggml checkout (bench/run_ggml_peer.sh)"; exit 2; }
	bench/run_ggml_peer.sh "$(ATTN_GGML_DIR)"
