# bench/attention.mk - make fragment for the prefill attention kernels.
# Included by the top-level Makefile, or used alone from the repository root:
#     make -f bench/attention.mk test-attention
#
# Targets
#   bench                  build/ei_bench (dense vs sparse attention, profiling cost)
#   bench-run              the reference runs: N = 8k,16k,32k, 2 threads, f32 and bf16, JSON
#   test-attention         build/test_attention, run (kernels vs a naive double reference)
#   test-attention-all     the same test with gcc and clang, as C and C++, and under
#                          -fsanitize=address,undefined (what CI should run)
#   ggml-peer              build/ggml_peer against a ggml checkout (GGML_DIR=/path/to/ggml)
#
# Variables the includer may set: CC, CXX, CFLAGS (added to ours).
# No -march: the header compiles its AVX2/AVX-512 kernels with per-function
# target attributes and picks one at run time.

ATTN_BUILD   ?= build
CC           ?= cc
CXX          ?= c++
ATTN_CFLAGS   = -O2 -Wall -Wextra -Werror $(CFLAGS)
ATTN_LIBS     = -lm -lpthread -ldl
ATTN_DEPS     = entropyinfer.h
ATTN_SAN      = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined

.PHONY: bench bench-run test-attention test-attention-all ggml-peer

bench: $(ATTN_BUILD)/ei_bench

$(ATTN_BUILD)/ei_bench: bench/ei_bench.c $(ATTN_DEPS)
	@mkdir -p $(ATTN_BUILD)
	$(CC) -std=c99 $(ATTN_CFLAGS) -o $@ bench/ei_bench.c $(ATTN_LIBS)

bench-run: $(ATTN_BUILD)/ei_bench
	$(ATTN_BUILD)/ei_bench --peak --threads 2
	$(ATTN_BUILD)/ei_bench --n 8192,16384,32768 --threads 2 --dtype f32 --json
	$(ATTN_BUILD)/ei_bench --n 8192,16384,32768 --threads 2 --dtype bf16 --json

$(ATTN_BUILD)/test_attention: tests/test_attention.c $(ATTN_DEPS)
	@mkdir -p $(ATTN_BUILD)
	$(CC) -std=c99 $(ATTN_CFLAGS) -o $@ tests/test_attention.c $(ATTN_LIBS)

test-attention: $(ATTN_BUILD)/test_attention
	$(ATTN_BUILD)/test_attention

# every compiler x language, then the sanitizers (quick matrix: --quick)
test-attention-all: $(ATTN_BUILD)/test_attention
	$(ATTN_BUILD)/test_attention
	@mkdir -p $(ATTN_BUILD)/attn
	gcc -std=c99 $(ATTN_CFLAGS) -o $(ATTN_BUILD)/attn/t_gcc tests/test_attention.c $(ATTN_LIBS) && $(ATTN_BUILD)/attn/t_gcc --quick
	clang -std=c99 $(ATTN_CFLAGS) -o $(ATTN_BUILD)/attn/t_clang tests/test_attention.c $(ATTN_LIBS) && $(ATTN_BUILD)/attn/t_clang --quick
	g++ -x c++ -std=c++11 $(ATTN_CFLAGS) -o $(ATTN_BUILD)/attn/t_gxx tests/test_attention.c $(ATTN_LIBS) && $(ATTN_BUILD)/attn/t_gxx --quick
	clang++ -x c++ -std=c++11 $(ATTN_CFLAGS) -o $(ATTN_BUILD)/attn/t_clangxx tests/test_attention.c $(ATTN_LIBS) && $(ATTN_BUILD)/attn/t_clangxx --quick
	gcc -std=c99 -DEI_NO_PTHREADS -DEI_NO_AVX512 $(ATTN_CFLAGS) -o $(ATTN_BUILD)/attn/t_noavx512 tests/test_attention.c -lm -ldl && $(ATTN_BUILD)/attn/t_noavx512 --quick
	gcc -std=c99 -DEI_ATTN_PREFER_DPBF16 $(ATTN_CFLAGS) -o $(ATTN_BUILD)/attn/t_dpbf16 tests/test_attention.c $(ATTN_LIBS) && $(ATTN_BUILD)/attn/t_dpbf16 --quick
	gcc -std=c99 -DEI_NO_SIMD $(ATTN_CFLAGS) -o $(ATTN_BUILD)/attn/t_nosimd tests/test_attention.c $(ATTN_LIBS) && $(ATTN_BUILD)/attn/t_nosimd --quick
	gcc -std=c99 $(ATTN_SAN) -Wall -Wextra -Werror -o $(ATTN_BUILD)/attn/t_asan_gcc tests/test_attention.c $(ATTN_LIBS) && $(ATTN_BUILD)/attn/t_asan_gcc
	clang -std=c99 $(ATTN_SAN) -Wall -Wextra -Werror -o $(ATTN_BUILD)/attn/t_asan_clang tests/test_attention.c $(ATTN_LIBS) && $(ATTN_BUILD)/attn/t_asan_clang --quick
	clang++ -x c++ -std=c++11 $(ATTN_SAN) -Wall -Wextra -Werror -o $(ATTN_BUILD)/attn/t_asan_clangxx tests/test_attention.c $(ATTN_LIBS) && $(ATTN_BUILD)/attn/t_asan_clangxx --quick

# ggml's CPU flash attention on the same shapes (see bench/run_ggml_peer.sh).
GGML_DIR ?=
ggml-peer:
	@test -n "$(GGML_DIR)" || { echo "set GGML_DIR to a ggml checkout (bench/run_ggml_peer.sh)"; exit 2; }
	bench/run_ggml_peer.sh "$(GGML_DIR)"
