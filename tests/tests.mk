# tests/tests.mk - every test's build and run rules; the top-level Makefile
# includes it (on its own: make -f tests/tests.mk <target>). The GPU tests are
# in cuda.mk, fuzzing, sanitizers and memcheck in tests/hardening.mk.
#
#   make test                  every test below, in this order; ends "make test: all passed"
#   make test-harness-selftest the harness fails when it should: the golden runner on
#                              an empty, a missing and a non-case folder; the test
#                              builds depend on files that exist (no wildcard); no
#                              switch is set that no test reads, or that cannot act; each
#                              make fragment sets only variables of its own prefix, none
#                              is set twice, documented defaults hold (tests/check_make_vars.py)
#   make test-compilers        the build matrix: every option (default, EI_STATIC, every
#                              EI_NO_* option of the header's BUILD OPTIONS table) with gcc
#                              (C) and clang++ (C++), default and EI_STATIC with g++ and clang,
#                              each running test_core; quickstart per compiler
#   make test-compilers-full   every compiler x every option (make test-full)
#   make test-core             build/test_core: conversions, views, config, profiling on
#                              every SIMD path, chunked planning, decode, compaction
#   make golden [GOLDEN=dir]   build/golden_runner on a folder of golden cases
#   make test-attention        build/test_attention: every kernel against check.h's
#                              double-precision reference
#   make test-attention-all    the same, then gcc/clang as C and C++, the kernel
#                              opt-outs and ASan/UBSan builds (--quick)
#   make test-limits           limits, NaN/Inf, every result code, fuzz regressions
#   make test-threads          one context, plan and decoder shared by threads, phases
#                              split by barriers, then by thread create/join (EI_TEST_SYNC,
#                              EI_TEST_THREADS, EI_TEST_ROUNDS, EI_TEST_SIMD); then every
#                              call's stack high-water mark on a 64 KiB thread stack
#   make test-plugin           the CUDA plugin boundary with a fake plugin (no GPU needed)
#   make test-backends         build/test_backends on the CPU
#   make test-ops              build/test_ops: every case of tests/ops_cases.h's table (each
#                              operation x shapes, dtypes, layouts, protocols) on the scalar
#                              reference, every SIMD path and CUDA when present (make test-cuda
#                              runs it with --require-gpu); --perf: times per case and path
#   make quickstart            examples/quickstart.c
#   make test-quickstart-header the code block of entropyinfer.h's QUICK START, extracted
#                              as it stands, compiled as C and C++ and run
#   make plan-digest [T_DIGEST_REF=main]  tests/plan_digest.c built against entropyinfer.h
#                              here and at git revision T_DIGEST_REF: the plans of 250+ cases
#                              per SIMD path, equal digests (bit-identical plans) or the diff
#                              (for changes inside planning; not part of make test)
#   make test-arm64            the NEON path (test_core, golden, test_limits, every ARM
#                              attention kernel in test_attention --quick) and an
#                              EI_NO_NEON test_core, cross-compiled for aarch64, under
#                              qemu-user -cpu max (not part of make test)
#   make insn-count-arm64      instructions per attention tile of the scalar and NEON
#                              kernels, counted under qemu-aarch64 (tests/insn_count.sh;
#                              a measurement, not a test; several minutes)
#   make test-i386             32-bit x86 (size_t of 32 bits): test_core, test_limits,
#                              golden_runner and test_attention --quick built with
#                              i686-linux-gnu-gcc, run natively (not part of make test)
#   make test-armhf            32-bit ARMv7 hard-float with NEON: the same four programs
#                              built with arm-linux-gnueabihf-gcc, run under qemu-arm
#                              (not part of make test)
# Every test includes tests/check.h (checks, guards, golden reader, references).
# Builds of several programs run T_JOBS at a time (default: the CPU count).

# This fragment's variables start with T_ (t_ for its functions); it reads the
# top-level Makefile's shared ones (BUILD, CC, CFLAGS, WARN, LDLIBS, CLANG,
# CLANGXX, GOLDEN) and has its own defaults when used alone.
T_BUILD  := $(or $(T_BUILD),build)
T_CFLAGS := $(or $(T_CFLAGS),-O2 -g)
T_WARN   := $(or $(T_WARN),-Wall -Wextra -Werror)
T_LDLIBS := $(or $(T_LDLIBS),-lm -lpthread -ldl)
T_CLANG  := $(or $(T_CLANG),$(shell command -v clang 2>/dev/null))
T_CLANGXX:= $(or $(T_CLANGXX),$(shell command -v clang++ 2>/dev/null))
T_GOLDEN := $(or $(T_GOLDEN),$(firstword $(wildcard ../shared/golden) tests/golden))
T_JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
# What every test build depends on (files that exist: no wildcard, see the self-test).
T_DEPS   := entropyinfer.h tests/check.h examples/synth_qk.h
T_C      := -std=c99 -D_DEFAULT_SOURCE
T_CXX    := -x c++ -std=c++11
T_LOGS   := $(T_BUILD)/logs
# A sub-make with the same makefiles, building several programs at once
# (unless the caller's make already runs jobs: then its jobserver decides).
T_TOP    := $(firstword $(MAKEFILE_LIST))
T_BUILDJ  = $(MAKE) --no-print-directory -f $(T_TOP) $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(T_JOBS))

# t-run-LABEL runs t_cmd_LABEL as a target of its own, so that t_runj runs a
# list of them T_JOBS at a time (test programs, and those under qemu, run on
# one core each): one line per program (its last line), its whole output on
# failure; with -k every program runs and the list fails at the end.
t-run-%:
	@mkdir -p $(T_LOGS); if $(t_cmd_$*) > $(T_LOGS)/$*.log 2>&1; then printf '  %-34s %s\n' "$*" "$$(tail -1 $(T_LOGS)/$*.log)"; \
	else cat $(T_LOGS)/$*.log; echo "FAIL $*: $(t_cmd_$*)"; exit 1; fi
t_runj   = $(T_BUILDJ) -k $(addprefix t-run-,$(1))
.PHONY: test test-harness-selftest test-compilers test-compilers-full test-core plan-digest golden test-attention test-attention-all test-limits \
        test-threads test-plugin test-backends test-ops quickstart test-quickstart-header test-arm64 test-i386 test-armhf insn-count-arm64

test: test-harness-selftest test-compilers test-core golden test-attention-all test-limits test-threads test-plugin \
      test-backends test-ops quickstart test-quickstart-header
	@echo "make test: all passed"

# ---------------------------------------------------------------- the test programs
T_PROGS := test_core golden_runner test_attention test_limits test_threads test_plugin test_ops \
           $(if $(wildcard tests/test_backends.c),test_backends)
$(addprefix $(T_BUILD)/,$(T_PROGS)): $(T_BUILD)/%: tests/%.c $(T_DEPS)
	@mkdir -p $(@D)
	$(CC) $(T_C) $(T_CFLAGS) $(T_WARN) -I. $< -o $@ $(T_LDLIBS)
# The case table test_ops and fuzz_backends share.
$(T_BUILD)/test_ops: tests/ops_cases.h

$(T_BUILD)/quickstart: examples/quickstart.c entropyinfer.h
	@mkdir -p $(@D)
	$(CC) $(T_C) $(T_CFLAGS) $(T_WARN) $< -o $@ $(T_LDLIBS)

test-core: $(T_BUILD)/test_core
	$(T_BUILD)/test_core

T_DIGEST_REF ?= main
plan-digest:
	@mkdir -p $(T_BUILD)/digest
	git show $(T_DIGEST_REF):entropyinfer.h > $(T_BUILD)/digest/entropyinfer.h
	$(CC) $(T_C) $(T_CFLAGS) $(T_WARN) -I. tests/plan_digest.c -o $(T_BUILD)/plan_digest $(T_LDLIBS)
	$(CC) $(T_C) $(T_CFLAGS) $(T_WARN) -I$(T_BUILD)/digest tests/plan_digest.c -o $(T_BUILD)/digest/plan_digest $(T_LDLIBS)
	$(T_BUILD)/plan_digest > $(T_BUILD)/digest/here.txt
	$(T_BUILD)/digest/plan_digest > $(T_BUILD)/digest/ref.txt
	@diff $(T_BUILD)/digest/ref.txt $(T_BUILD)/digest/here.txt && \
	  echo "plan-digest: $$(wc -l < $(T_BUILD)/digest/here.txt) plans bit-identical to $(T_DIGEST_REF)'s"

golden: $(T_BUILD)/golden_runner
	$(T_BUILD)/golden_runner $(T_GOLDEN)

test-attention: $(T_BUILD)/test_attention
	$(T_BUILD)/test_attention

test-limits: $(T_BUILD)/test_limits
	$(T_BUILD)/test_limits

test-threads: $(T_BUILD)/test_threads
	$(T_BUILD)/test_threads

quickstart: $(T_BUILD)/quickstart
	$(T_BUILD)/quickstart

# The QUICK START section's indented code lines (not its #define/#include
# lines, which the wrapper holds) become the body of a function.
$(T_BUILD)/quickstart_header.inc: entropyinfer.h
	@mkdir -p $(@D)
	awk '/^   QUICK START/ {on=1; next} /^   BUILD OPTIONS/ {on=0} on && /^       / && !/^ *#/' $< > $@
	@test -s $@ || { echo "no code found in entropyinfer.h's QUICK START"; exit 1; }
$(T_BUILD)/quickstart_header $(T_BUILD)/quickstart_header_cxx: tests/quickstart_header.c $(T_BUILD)/quickstart_header.inc entropyinfer.h
$(T_BUILD)/quickstart_header:
	$(CC) $(T_C) $(T_CFLAGS) $(T_WARN) -I$(T_BUILD) $< -o $@ $(T_LDLIBS)
$(T_BUILD)/quickstart_header_cxx:
	$(if $(T_CLANGXX),$(T_CLANGXX),g++) $(T_CXX) $(T_CFLAGS) $(T_WARN) -I$(T_BUILD) $< -o $@ $(T_LDLIBS)
test-quickstart-header: $(T_BUILD)/quickstart_header $(T_BUILD)/quickstart_header_cxx
	$(T_BUILD)/quickstart_header
	$(T_BUILD)/quickstart_header_cxx

# tests/test_plugin.c with three builds of tests/fake_cuda_plugin.c: a working
# table, one of ABI version 1, one without a device.
T_FAKES := $(T_BUILD)/fake_cuda.so $(T_BUILD)/fake_cuda_abi1.so $(T_BUILD)/fake_cuda_nodev.so
$(T_BUILD)/fake_cuda.so: T_FAKE_FLAGS :=
$(T_BUILD)/fake_cuda_abi1.so: T_FAKE_FLAGS := -DFAKE_ABI_VERSION=1
$(T_BUILD)/fake_cuda_nodev.so: T_FAKE_FLAGS := -DFAKE_NO_DEVICE
$(T_FAKES): tests/fake_cuda_plugin.c entropyinfer.h
	@mkdir -p $(@D)
	$(CC) $(T_C) -O1 $(T_WARN) -fPIC -shared -fvisibility=hidden -I. $(T_FAKE_FLAGS) $< -o $@

test-plugin: $(T_BUILD)/test_plugin $(T_FAKES)
	$(T_BUILD)/test_plugin $(T_BUILD)

# tests/test_backends.c (the same scenarios on every backend): here on the CPU.
# Until the file exists the target says so and passes.
test-backends: $(if $(wildcard tests/test_backends.c),$(T_BUILD)/test_backends)
	$(if $(wildcard tests/test_backends.c),$(T_BUILD)/test_backends,@echo "test-backends: tests/test_backends.c does not exist yet: skipped")

# tests/test_ops.c: the table's cases on every CPU path here (CUDA: cuda.mk's test-cuda).
test-ops: $(T_BUILD)/test_ops
	$(T_BUILD)/test_ops

# ---------------------------------------------------------------- the build matrix
# Every compiler and language x every build option the header documents
# (BUILD OPTIONS table: EI_NO_*), plus EI_STATIC and the default; each build
# runs test_core (a failed build names its target: build/matrix/test_core.<compiler>.<option>).
# EI_NO_PTHREADS links without -lpthread, EI_NO_CUDA_LOADER without -ldl.
T_COMPILERS := gcc g++ $(if $(T_CLANG),clang) $(if $(T_CLANGXX),clang++)
T_OPTIONS   := default EI_STATIC $(sort $(shell sed -n '/BUILD OPTIONS/,/CONCEPTS/p' entropyinfer.h | grep -o 'EI_NO_[A-Z0-9_]*'))
T_MATRIX_FULL := $(foreach c,$(T_COMPILERS),$(foreach o,$(T_OPTIONS),$(T_BUILD)/matrix/test_core.$(c).$(o))) \
               $(foreach c,$(T_COMPILERS),$(T_BUILD)/matrix/quickstart.$(c).default)
# make test's set: each option in each language and each compiler family once
# (gcc for C, clang++ for C++, or g++ where there is no clang++).
T_MATRIX_CXX := $(if $(T_CLANGXX),clang++,g++)
T_MATRIX    := $(filter $(foreach o,$(T_OPTIONS),%.gcc.$(o) %.$(T_MATRIX_CXX).$(o)) %.default %.EI_STATIC,$(T_MATRIX_FULL))
t_cc   = $(word 1,$(subst ., ,$*))
t_opt  = $(filter-out default,$(word 2,$(subst ., ,$*)))
t_lang = $(if $(filter %++,$(t_cc)),$(T_CXX),$(T_C))
t_libs = -lm $(if $(filter EI_NO_PTHREADS,$(t_opt)),,-lpthread) $(if $(filter EI_NO_CUDA_LOADER,$(t_opt)),,-ldl)
$(T_BUILD)/matrix/test_core.%: tests/test_core.c $(T_DEPS)
	@mkdir -p $(@D)
	@$(t_cc) $(t_lang) -O1 $(T_WARN) $(addprefix -D,$(t_opt)) $< -o $@ $(t_libs)
$(T_BUILD)/matrix/quickstart.%: examples/quickstart.c entropyinfer.h
	@mkdir -p $(@D)
	@$(t_cc) $(t_lang) -O1 $(T_WARN) $< -o $@ $(t_libs)

$(foreach t,$(T_MATRIX_FULL),$(eval t_cmd_$(notdir $(t)) = $(t)))
test-compilers test-compilers-full:
	@$(T_BUILDJ) $(if $(filter %-full,$@),$(T_MATRIX_FULL),$(T_MATRIX))
	@$(call t_runj,$(notdir $(if $(filter %-full,$@),$(T_MATRIX_FULL),$(T_MATRIX)))) || { echo "$@: FAILED"; exit 1; }; \
	echo "$@: $(words $(if $(filter %-full,$@),$(T_MATRIX_FULL),$(T_MATRIX))) builds of test_core and quickstart built and passed"

# ---------------------------------------------------------------- attention kernels
# build/test_attention (full), then each build below with --quick (t_asan_gcc: full).
T_SAN := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
T_ATTN_BINS := $(addprefix $(T_BUILD)/attn/,t_gcc t_gxx t_noavx512 t_noavx2 t_nobf16 t_noamx t_dpbf16 t_nosimd t_asan_gcc \
                 $(if $(T_CLANG),t_clang t_asan_clang) $(if $(T_CLANGXX),t_clangxx t_asan_clangxx))
$(T_BUILD)/attn/t_gcc:          T_A = gcc $(T_C) -O2
$(T_BUILD)/attn/t_gxx:          T_A = g++ $(T_CXX) -O2
$(T_BUILD)/attn/t_noavx512:     T_A = gcc $(T_C) -O2 -DEI_NO_PTHREADS -DEI_NO_AVX512
$(T_BUILD)/attn/t_noavx2:       T_A = gcc $(T_C) -O2 -DEI_NO_AVX2
$(T_BUILD)/attn/t_nobf16:       T_A = gcc $(T_C) -O2 -DEI_NO_AVX512BF16
$(T_BUILD)/attn/t_noamx:        T_A = gcc $(T_C) -O2 -DEI_NO_AMX
$(T_BUILD)/attn/t_dpbf16:       T_A = gcc $(T_C) -O2 -DEI_ATTN_PREFER_DPBF16
$(T_BUILD)/attn/t_nosimd:       T_A = gcc $(T_C) -O2 -DEI_NO_SIMD
$(T_BUILD)/attn/t_asan_gcc:     T_A = gcc $(T_C) $(T_SAN) -include assert.h -DEI_ASSERT=assert
$(T_BUILD)/attn/t_clang:        T_A = clang $(T_C) -O2
$(T_BUILD)/attn/t_asan_clang:   T_A = clang $(T_C) $(T_SAN)
$(T_BUILD)/attn/t_clangxx:      T_A = clang++ $(T_CXX) -O2
$(T_BUILD)/attn/t_asan_clangxx: T_A = clang++ $(T_CXX) $(T_SAN)
$(T_BUILD)/attn/t_noavx512:     T_A_LIBS = -lm -ldl
$(T_ATTN_BINS): $(T_BUILD)/attn/%: tests/test_attention.c $(T_DEPS)
	@mkdir -p $(@D)
	$(T_A) -g $(T_WARN) $< -o $@ $(or $(T_A_LIBS),$(T_LDLIBS))

t_cmd_attn_test_attention = $(T_BUILD)/test_attention
$(foreach b,$(T_ATTN_BINS),$(eval t_cmd_attn_$(notdir $(b)) = $(b)$(if $(filter t_asan_gcc,$(notdir $(b))),, --quick)))
test-attention-all:
	@$(T_BUILDJ) $(T_BUILD)/test_attention $(T_ATTN_BINS)
	@$(call t_runj,attn_test_attention $(addprefix attn_,$(notdir $(T_ATTN_BINS)))) || { echo "test-attention-all: FAILED"; exit 1; }; \
	echo "attention: $(words $(T_BUILD)/test_attention $(T_ATTN_BINS)) builds passed"

# ---------------------------------------------------------------- the harness itself
# Each check fails on the defect it is named after (and passed before it was fixed).
test-harness-selftest: $(T_BUILD)/golden_runner
	@tmp=$$(mktemp -d); fail=""; mkdir -p $$tmp/empty $$tmp/not_cases/p01_tiny_gauss; \
	for dir in $$tmp/empty $$tmp/missing $$tmp/not_cases; do \
	  $(T_BUILD)/golden_runner $$dir > $$tmp/log 2>&1; rc=$$?; \
	  if [ $$rc -eq 0 ] || ! grep -q "$$dir" $$tmp/log; then \
	    echo "FAIL: golden_runner on the $${dir#$$tmp/} folder (no case) exited $$rc:"; cat $$tmp/log; fail=1; fi; \
	done; rm -rf $$tmp; \
	if grep -n '^[A-Z_]*\(HDR\|DEPS\)[[:space:]]*[:?+]*=.*\(wildcard\|\*\)' Makefile tests/*.mk bench/attention.mk; then \
	  echo "FAIL: a test build depends on a wildcard: one that matches nothing hides a wrong path"; fail=1; fi; \
	for dep in $(T_DEPS) $(H_HDR); do [ -f "$$dep" ] || { echo "FAIL: test builds depend on $$dep, which does not exist"; fail=1; }; done; \
	for var in $$(grep -ho '\(^\|[[:space:]]\)EI_[A-Z0-9_]*=' Makefile tests/*.mk bench/attention.mk | tr -d '= \t' | sort -u); do \
	  grep -q "\"$$var\"" tests/*.c tests/check.h || { echo "FAIL: the makefiles set $$var, which no test reads"; fail=1; }; \
	done; \
	if grep -n '&& 0\b\|&& 0;' tests/*.c tests/check.h; then echo "FAIL: a condition that can never hold (a stub switch)"; fail=1; fi; \
	python3 tests/check_make_vars.py > $$tmp.vars 2>&1 || { cat $$tmp.vars; fail=1; }; rm -f $$tmp.vars; \
	if [ -n "$$fail" ]; then echo "test-harness-selftest: FAILED"; exit 1; fi; \
	echo "harness self-test: golden runner fails on zero cases; test dependencies exist; no dead switch; make variables prefixed per fragment"

# ---------------------------------------------------------------- NEON (aarch64 under qemu)
# Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user (.ci/run installs them).
# -cpu max: qemu's CPU with every optional extension (FP16 arithmetic, BF16...),
# so each ARM kernel the CPU may have is available and test_attention forces
# every one in turn against the reference (same tolerances as on x86).
# test_attention gets -fno-tree-loop-vectorize: aarch64 gcc 12.2 dies with an
# internal compiler error (vect_transform_reduction) vectorising a loop of
# the test's own test_chunked_planning; the library's code is not affected.
T_ARM64_CC ?= aarch64-linux-gnu-gcc
T_ARM64_RUN = env QEMU_LD_PREFIX=/usr/aarch64-linux-gnu qemu-aarch64 -cpu max
$(T_BUILD)/arm64/%: tests/%.c $(T_DEPS)
	@mkdir -p $(@D)
	$(T_ARM64_CC) $(T_C) -O2 $(T_ARM64_FLAGS) $(T_WARN) -I. $< -o $@ -lm -lpthread
$(T_BUILD)/arm64/test_attention: T_ARM64_FLAGS := -fno-tree-loop-vectorize
$(T_BUILD)/arm64/test_core_noneon: tests/test_core.c $(T_DEPS)
	@mkdir -p $(@D)
	$(T_ARM64_CC) $(T_C) -O2 -DEI_NO_NEON $(T_WARN) -I. $< -o $@ -lm -lpthread
T_ARM64_PROGS := test_core test_core_noneon golden_runner test_limits test_attention
t_cmd_arm64_test_core        = $(T_ARM64_RUN) $(T_BUILD)/arm64/test_core
t_cmd_arm64_test_core_noneon = $(T_ARM64_RUN) $(T_BUILD)/arm64/test_core_noneon
t_cmd_arm64_golden           = $(T_ARM64_RUN) $(T_BUILD)/arm64/golden_runner $(T_GOLDEN)
t_cmd_arm64_test_limits      = $(T_ARM64_RUN) $(T_BUILD)/arm64/test_limits
t_cmd_arm64_test_attention   = $(T_ARM64_RUN) $(T_BUILD)/arm64/test_attention --quick
test-arm64:
	@$(T_BUILDJ) $(addprefix $(T_BUILD)/arm64/,$(T_ARM64_PROGS))
	@$(call t_runj,arm64_test_core arm64_test_core_noneon arm64_golden arm64_test_limits arm64_test_attention) \
	  || { echo "test-arm64: FAILED"; exit 1; }; echo "test-arm64: 5 programs passed"
# One tile (tests/insn_tile.c) per kernel and dtype; the counting: tests/insn_count.sh.
insn-count-arm64:
	@mkdir -p $(T_BUILD)
	$(T_ARM64_CC) $(T_C) -O2 $(T_WARN) -I. tests/insn_tile.c -o $(T_BUILD)/insn_tile_arm64 -lm
	QEMU_LD_PREFIX=/usr/aarch64-linux-gnu tests/insn_count.sh $(T_BUILD)/insn_tile_arm64 qemu-aarch64 -cpu max

# ---------------------------------------------------------------- 32-bit targets (size_t of 32 bits)
# Debian: gcc-i686-linux-gnu libc6-dev-i386-cross (runs natively on an x86-64
# kernel with libc6-i386; T_I386_RUN=qemu-i386 where it does not), and
# gcc-arm-linux-gnueabihf libc6-dev-armhf-cross qemu-user (.ci/run installs them).
# The programs of each are built in parallel (T_BUILDJ), then run T_JOBS at a time.
# _FILE_OFFSET_BITS=64: the golden runner's readdir fails (EOVERFLOW) on file
# systems with 64-bit inode numbers otherwise (seen under qemu-arm); the
# library itself does no file I/O.
T_X32_PROGS := test_core test_limits golden_runner test_attention
T_X32_C     := $(T_C) -D_FILE_OFFSET_BITS=64
T_I386_CC  ?= i686-linux-gnu-gcc
T_I386_RUN ?= $(if $(wildcard /lib/ld-linux.so.2),,env QEMU_LD_PREFIX=/usr/i686-linux-gnu qemu-i386)
T_ARMHF_CC ?= arm-linux-gnueabihf-gcc
T_ARMHF_RUN = env QEMU_LD_PREFIX=/usr/arm-linux-gnueabihf qemu-arm
$(T_BUILD)/i386/%: tests/%.c $(T_DEPS)
	@mkdir -p $(@D)
	$(T_I386_CC) $(T_X32_C) -O2 $(T_WARN) -I. $< -o $@ $(T_LDLIBS)
$(T_BUILD)/armhf/%: tests/%.c $(T_DEPS)
	@mkdir -p $(@D)
	$(T_ARMHF_CC) $(T_X32_C) -O2 -march=armv7-a -mfpu=neon -mfloat-abi=hard $(T_WARN) -I. $< -o $@ $(T_LDLIBS)
# The four programs of each, test_attention on --quick (CI's time budget).
$(foreach a,i386 armhf,$(eval t_cmd_$(a)_test_core = $$(T_$(shell echo $(a) | tr a-z A-Z)_RUN) $$(T_BUILD)/$(a)/test_core) \
  $(eval t_cmd_$(a)_test_limits = $$(T_$(shell echo $(a) | tr a-z A-Z)_RUN) $$(T_BUILD)/$(a)/test_limits) \
  $(eval t_cmd_$(a)_golden = $$(T_$(shell echo $(a) | tr a-z A-Z)_RUN) $$(T_BUILD)/$(a)/golden_runner $$(T_GOLDEN)) \
  $(eval t_cmd_$(a)_test_attention = $$(T_$(shell echo $(a) | tr a-z A-Z)_RUN) $$(T_BUILD)/$(a)/test_attention --quick))
t_x32_run = $(call t_runj,$(1)_test_core $(1)_test_limits $(1)_golden $(1)_test_attention) \
	|| { echo "test-$(1): FAILED"; exit 1; }; echo "test-$(1): 4 programs passed"
test-i386:
	@$(T_BUILDJ) $(addprefix $(T_BUILD)/i386/,$(T_X32_PROGS))
	@$(call t_x32_run,i386)
test-armhf:
	@$(T_BUILDJ) $(addprefix $(T_BUILD)/armhf/,$(T_X32_PROGS))
	@$(call t_x32_run,armhf)
