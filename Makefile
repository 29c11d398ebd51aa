# entropyinfer: build, test and benchmark entry points.
#   make demo      the main demo: Gemma 3 270M with entropyinfer (examples/gemma; fetches the model)
#   make test      every test (tests/tests.mk lists them): the build matrix (gcc, g++, clang,
#                  clang++ x the default, EI_STATIC and every EI_NO_* option, running test_core),
#                  unit tests, golden runner, attention kernels (compilers, languages, sanitizers),
#                  limits, threads, the CUDA plugin boundary, backends on the CPU, quickstart and
#                  the harness's self-test; -Wall -Wextra -Werror throughout
#   make test-full the CI steps (.ci/run) with their longest sets: bash .ci/run --full
#                  (docs/testing.md); run it before an issue is called resolved
#   make golden GOLDEN=<folder>   conformance runner on any folder of golden cases
#   make test-asan test-tsan test-valgrind fuzz   sanitizers, memcheck, libFuzzer (tests/hardening.mk)
#   make install [PREFIX=/usr/local]  header, CUDA plugin if built, pkg-config and CMake files (install/install.mk)
#   make test-arm64               the NEON path under qemu (tests/tests.mk)
#   make cuda test-cuda           the CUDA backend and its GPU tests (cuda.mk)
#   make llama-cpp llama-cpp-models llama-cpp-smoke llama-cpp-bookkeeping llama-cpp-soak llama-cpp-eval decode-eval
#                                 llama.cpp's own tools with entropyinfer in their attention; llama-cpp-soak:
#                                 llama-server under concurrent requests (not in CI)
#                                 (examples/llama.cpp/llama-cpp.mk)
#   make bench     benchmarks (bench/)
CC      ?= cc
# The full case set lives beside the repository; tests/golden is a subset kept in it.
GOLDEN  ?= $(firstword $(wildcard ../shared/golden) tests/golden)
BUILD   := build
WARN    := -Wall -Wextra -Werror
CFLAGS  ?= -O2 -g
LDLIBS  := -lm -lpthread -ldl
HDR     := entropyinfer.h
CLANG   := $(shell command -v clang 2>/dev/null)
CLANGXX := $(shell command -v clang++ 2>/dev/null)

.PHONY: all demo-synthetic bench bench-profile clean test-full

all: $(BUILD)/golden_runner $(BUILD)/test_core $(BUILD)/quickstart $(BUILD)/demo_synthetic

$(BUILD)/demo_synthetic: examples/demo_synthetic.c $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 $(CFLAGS) $(WARN) $< -o $@ $(LDLIBS)

$(BUILD)/bench_profile: bench/bench_profile.c bench/ei_bench_common.h $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE -O2 $(WARN) $< -o $@ $(LDLIBS)

# The sampled ranking's profile time, f32 against int8 scores (docs/quality.md, issue 35).
$(BUILD)/bench_rank: bench/bench_rank.c bench/ei_bench_common.h $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE -O2 $(WARN) $< -o $@ $(LDLIBS)

# `make demo` (examples/gemma/gemma.mk) runs the main demo: Gemma 3 270M with
# entropyinfer in its attention. The synthetic one needs no model:
demo-synthetic: $(BUILD)/demo_synthetic
	./$(BUILD)/demo_synthetic

# `make bench` (bench/attention.mk) builds build/ei_bench; this adds the profiling benchmark.
bench: $(BUILD)/bench_profile $(BUILD)/bench_rank
bench-profile: $(BUILD)/bench_profile
	./$(BUILD)/bench_profile

clean:
	rm -rf $(BUILD)

# Everything CI runs, with the longest sets (installs what it needs, like CI).
test-full:
	bash .ci/run --full

# Fragments: every test (tests/tests.mk), attention benchmark, CUDA backend,
# Gemma engine, hardening (fuzz, sanitizers, memcheck), llama.cpp with entropyinfer.
include tests/tests.mk
-include bench/attention.mk
-include cuda.mk
-include examples/gemma/gemma.mk
-include tests/hardening.mk
-include examples/llama.cpp/llama-cpp.mk
-include bench/tp.mk
-include install/install.mk
