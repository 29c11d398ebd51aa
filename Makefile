# entropyinfer: build, test and benchmark entry points.
#   make demo      the main demo: Gemma 3 270M with entropyinfer (examples/gemma; fetches the model)
#   make test      every test: C and C++, gcc and clang, -Wall -Wextra -Werror, golden runner
#   make golden GOLDEN=<folder>   conformance runner on any folder of golden cases
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

.PHONY: all test golden demo demo-synthetic bench bench-profile clean test-core test-compilers quickstart test-arm64

all: $(BUILD)/golden_runner $(BUILD)/test_core $(BUILD)/quickstart $(BUILD)/demo_synthetic

$(BUILD)/golden_runner: tests/golden_runner.c $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE $(CFLAGS) $(WARN) $< -o $@ $(LDLIBS)

$(BUILD)/test_core: tests/test_core.c $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE $(CFLAGS) $(WARN) $< -o $@ $(LDLIBS)

$(BUILD)/quickstart: examples/quickstart.c $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 $(CFLAGS) $(WARN) $< -o $@ $(LDLIBS)

$(BUILD)/demo_synthetic: examples/demo_synthetic.c $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 $(CFLAGS) $(WARN) $< -o $@ $(LDLIBS)

$(BUILD)/bench_profile: bench/bench_profile.c $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE -O2 $(WARN) $< -o $@ $(LDLIBS)

golden: $(BUILD)/golden_runner
	./$(BUILD)/golden_runner $(GOLDEN)

test-core: $(BUILD)/test_core
	./$(BUILD)/test_core

quickstart: $(BUILD)/quickstart
	./$(BUILD)/quickstart

# The header must build warning-free as C99 and C++ with gcc and clang, in
# static mode and with every opt-out; each variant runs the unit tests.
COMPILERS := gcc:c g++:c++ $(if $(CLANG),clang:c) $(if $(CLANGXX),clang++:c++)
test-compilers:
	@mkdir -p $(BUILD); set -e; for pair in $(COMPILERS); do \
	  cc=$${pair%%:*}; lang=$${pair##*:}; \
	  if [ $$lang = c ]; then std="-std=c99 -D_DEFAULT_SOURCE"; else std="-x c++ -std=c++11"; fi; \
	  for opts in "" "-DEI_STATIC" "-DEI_NO_SIMD" "-DEI_NO_AVX512" "-DEI_NO_PTHREADS -DEI_NO_CUDA_LOADER"; do \
	    echo "  $$cc $$lang $$opts"; \
	    $$cc $$std -O1 $(WARN) $$opts tests/test_core.c -o $(BUILD)/test_core_variant $(LDLIBS); \
	    ./$(BUILD)/test_core_variant > /dev/null; \
	  done; \
	  $$cc $$std -O1 $(WARN) examples/quickstart.c -o $(BUILD)/quickstart_variant $(LDLIBS); \
	  ./$(BUILD)/quickstart_variant > /dev/null; \
	done; echo "compilers: all variants built and passed"

test: test-compilers test-core golden quickstart test-attention-all
	@echo "make test: all passed"

# NEON path: cross-compiled for aarch64 and run under qemu-user (Debian:
# gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user).
ARM_CC ?= aarch64-linux-gnu-gcc
test-arm64:
	@mkdir -p $(BUILD)
	$(ARM_CC) -std=c99 -D_DEFAULT_SOURCE -O2 $(WARN) tests/test_core.c -o $(BUILD)/test_core_arm64 -lm -lpthread
	$(ARM_CC) -std=c99 -D_DEFAULT_SOURCE -O2 $(WARN) tests/golden_runner.c -o $(BUILD)/golden_runner_arm64 -lm -lpthread
	QEMU_LD_PREFIX=/usr/aarch64-linux-gnu qemu-aarch64 ./$(BUILD)/test_core_arm64
	QEMU_LD_PREFIX=/usr/aarch64-linux-gnu qemu-aarch64 ./$(BUILD)/golden_runner_arm64 $(GOLDEN)

# `make demo` (examples/gemma/gemma.mk) runs the main demo: Gemma 3 270M with
# entropyinfer in its attention. The synthetic one needs no model:
demo-synthetic: $(BUILD)/demo_synthetic
	./$(BUILD)/demo_synthetic

# `make bench` (bench/attention.mk) builds build/ei_bench; this adds the profiling benchmark.
bench: $(BUILD)/bench_profile
bench-profile: $(BUILD)/bench_profile
	./$(BUILD)/bench_profile

clean:
	rm -rf $(BUILD)

# Fragments: attention tests and benchmark, CUDA backend, Gemma engine,
# hardening (fuzz, sanitizers, threads, limits).
-include bench/attention.mk
-include cuda.mk
-include examples/gemma/gemma.mk
-include tests/hardening.mk
