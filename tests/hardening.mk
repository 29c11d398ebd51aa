# tests/hardening.mk: fuzzing, sanitizers and memcheck (issue 6); the plain
# test builds and runs (test_limits, test_threads, ...) are in tests/tests.mk.
# The top-level Makefile includes both.
#
#   make fuzz [H_FUZZ_SECONDS=60] libFuzzer (clang, ASan+UBSan) over every public entry
#        [H_FUZZ_FLAGS=...]        point, seeded from tests/fuzz_corpus; the growing corpus
#                                lives in build/hardening/fuzz_work. A crash leaves
#                                build/hardening/crash-*: copy it to tests/fuzz_regressions/
#                                (replayed by test-asan) and report it. H_FUZZ_FLAGS adds
#                                libFuzzer flags, e.g. the long run (two cores, 1e7 runs):
#                                make fuzz H_FUZZ_SECONDS=0 H_FUZZ_FLAGS='-jobs=2 -workers=2 -runs=5000000'
#   make fuzz-merge              tests/fuzz_corpus := the seeds (tests/fuzz_seeds.py) + the
#                                fewest inputs of tests/fuzz_corpus and fuzz_work that cover
#                                the same edges (libFuzzer -merge=1 -use_counters=0)
#   make fuzz-replay             corpus + regressions once each, ASan+UBSan (no libFuzzer)
#   make test-asan               ASan+UBSan: test_core, golden runner, test_limits,
#                                test_threads, test_plugin, test_ops --quick, fuzz replay
#   make test-asan-full          the same and test_attention (make test runs it under
#                                ASan+UBSan already: gcc whole, clang and clang++ --quick)
#   make test-tsan               ThreadSanitizer: test_threads (phases split by barriers,
#                                then by thread create/join: EI_TEST_SYNC), test_core
#   make test-valgrind           memcheck --error-exitcode=1 --leak-check=full: test_limits
#                                on the scalar and AVX2 paths (valgrind has no AVX-512),
#                                test_ops --quick (the scalar reference and AVX2) and the
#                                fuzz corpus
#   make test-valgrind-full      the same, test_core, test_attention --quick and
#                                test_threads on both paths
# Builds and runs go H_JOBS at a time (default: the CPU count).
#   make test-hardening          test-asan + test-tsan + test-limits (tests/tests.mk)
# clang with its runtime: tests/install_clang_rt.sh (--valgrind also installs valgrind).

# This fragment's variables start with H_; it reads the top-level Makefile's
# shared ones (BUILD, CC, CLANG, GOLDEN) and has its own defaults when used alone.
H_OUT        := $(or $(BUILD),build)
H_BUILD      := $(H_OUT)/hardening
H_CLANG      := $(or $(CLANG),$(shell command -v clang 2>/dev/null))
# Sanitizer builds prefer clang; gcc also has ASan, UBSan and TSan.
H_SAN_CC     ?= $(if $(H_CLANG),$(H_CLANG),$(CC))
H_GOLDEN     := $(or $(GOLDEN),$(firstword $(wildcard ../shared/golden) tests/golden))
H_FUZZ_SECONDS ?= 60
H_VALGRIND   ?= valgrind
H_LDLIBS     := -lm -lpthread -ldl
H_HDR        := entropyinfer.h tests/check.h tests/ops_cases.h examples/synth_qk.h
H_STD        := -std=c99 -D_DEFAULT_SOURCE
H_WARN       := -Wall -Wextra
H_SAN_FLAGS  := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
H_TSAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=thread
# Recursive make with the same makefiles, whether the top-level Makefile
# includes this fragment or it was named with -f.
H_INCLUDED   := $(shell grep -l 'tests/hardening.mk' Makefile 2>/dev/null)
H_SUBMAKE     = $(MAKE) --no-print-directory $(if $(H_INCLUDED),,$(addprefix -f ,$(sort $(firstword $(MAKEFILE_LIST)) tests/hardening.mk)))
# Sanitizer options for our runs only (not exported to the rest of the build).
H_SAN_ENV    := ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
                UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
H_TSAN_ENV   := TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

.PHONY: fuzz fuzz-merge fuzz-replay test-asan test-asan-full test-tsan test-valgrind test-valgrind-full test-hardening

$(H_BUILD):
	mkdir -p $(H_BUILD)

# ---------------------------------------------------------------- fuzzing
$(H_BUILD)/fuzz_api: tests/fuzz_api.c $(H_HDR) | $(H_BUILD)
	@$(H_CLANG) --version >/dev/null 2>&1 || { echo "make fuzz needs clang (tests/install_clang_rt.sh)"; exit 1; }
	$(H_CLANG) $(H_STD) $(H_WARN) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $< -o $@ $(H_LDLIBS) || \
	  { echo "clang cannot link libFuzzer: run tests/install_clang_rt.sh"; exit 1; }

H_FUZZ_FLAGS   ?=
# With -jobs=N libFuzzer writes fuzz-<job>.log files into the current directory:
# they go to $(H_BUILD)/fuzz_jobs (each job's last line gives its exec/s).
fuzz: $(H_BUILD)/fuzz_api
	mkdir -p $(H_BUILD)/fuzz_work $(H_BUILD)/fuzz_jobs
	rm -f $(H_BUILD)/fuzz_jobs/fuzz-*.log
	cp tests/fuzz_corpus/*.bin $(H_BUILD)/fuzz_work/
	@echo "fuzzing for $(H_FUZZ_SECONDS) s $(H_FUZZ_FLAGS) (log: $(H_BUILD)/fuzz.log)"
	@cd $(H_BUILD)/fuzz_jobs && $(abspath $(H_BUILD))/fuzz_api -max_total_time=$(H_FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	  -max_len=2048 -artifact_prefix=$(abspath $(H_BUILD))/ -print_final_stats=1 $(H_FUZZ_FLAGS) $(abspath $(H_BUILD))/fuzz_work \
	  > $(abspath $(H_BUILD))/fuzz.log 2>&1; \
	  status=$$?; cd $(CURDIR); grep -v '^#[0-9]*[[:space:]]*\(NEW\|REDUCE\|pulse\)' $(H_BUILD)/fuzz.log | tail -60; \
	  grep '^#[0-9]' $(H_BUILD)/fuzz.log | tail -1; \
	  for j in $(H_BUILD)/fuzz_jobs/fuzz-*.log; do [ -e "$$j" ] && { echo "$$j:"; grep -h 'DONE\|SUMMARY' "$$j" | tail -2; }; done; \
	  if [ $$status -ne 0 ]; then echo "fuzz: crash (see $(H_BUILD)/crash-*); copy it to tests/fuzz_regressions/"; fi; \
	  exit $$status

fuzz-merge: $(H_BUILD)/fuzz_api
	rm -rf $(H_BUILD)/fuzz_merged && mkdir -p $(H_BUILD)/fuzz_merged $(H_BUILD)/fuzz_work
	python3 tests/fuzz_seeds.py $(H_BUILD)/fuzz_merged
	$(H_BUILD)/fuzz_api -merge=1 -use_counters=0 -max_len=2048 -timeout=10 -rss_limit_mb=2048 \
	  $(H_BUILD)/fuzz_merged tests/fuzz_corpus $(H_BUILD)/fuzz_work > $(H_BUILD)/fuzz_merge.log 2>&1 || { tail -20 $(H_BUILD)/fuzz_merge.log; exit 1; }
	rm -f tests/fuzz_corpus/*.bin
	for f in $(H_BUILD)/fuzz_merged/*; do b=$$(basename $$f .bin); cp $$f tests/fuzz_corpus/$$b.bin; done
	@echo "tests/fuzz_corpus: $$(ls tests/fuzz_corpus | wc -l) files, $$(cat tests/fuzz_corpus/*.bin | wc -c) bytes"

$(H_BUILD)/fuzz_replay_asan: tests/fuzz_api.c $(H_HDR) | $(H_BUILD)
	$(H_SAN_CC) $(H_STD) $(H_WARN) $(H_SAN_FLAGS) -DEI_FUZZ_STANDALONE $< -o $@ $(H_LDLIBS)

fuzz-replay: $(H_BUILD)/fuzz_replay_asan
	$(H_SAN_ENV) $(H_BUILD)/fuzz_replay_asan tests/fuzz_corpus
	@fail=""; for f in tests/fuzz_regressions/*.bin; do \
	  [ -e "$$f" ] || continue; \
	  if $(H_SAN_ENV) $(H_BUILD)/fuzz_replay_asan "$$f" > $(H_BUILD)/regression.log 2>&1; then echo "  pass $$f"; \
	  else echo "  FAIL $$f:"; grep -m4 "ERROR\|SUMMARY\|oracle" $(H_BUILD)/regression.log | sed 's/^/      /'; fail="$$fail $$f"; fi; \
	done; if [ -n "$$fail" ]; then echo "fuzz-replay: regressions fail:$$fail"; exit 1; fi

# ---------------------------------------------------------------- ASan + UBSan
$(H_BUILD)/%_asan: tests/%.c $(H_HDR) | $(H_BUILD)
	$(H_SAN_CC) $(H_STD) $(H_WARN) $(H_SAN_FLAGS) $< -o $@ $(H_LDLIBS)

H_ASAN_BINS := $(H_BUILD)/test_core_asan $(H_BUILD)/golden_runner_asan $(H_BUILD)/test_limits_asan $(H_BUILD)/test_threads_asan \
             $(H_BUILD)/test_plugin_asan $(H_BUILD)/test_ops_asan $(H_BUILD)/fuzz_replay_asan
H_ASAN_BINS_FULL := $(H_ASAN_BINS) $(H_BUILD)/test_attention_asan

# The sanitizer and memcheck builds are made H_JOBS at a time (unless the
# caller's make already runs jobs: then its jobserver decides), and each run
# is a target of its own (h-run-<label>), so `make -jN` runs them side by side;
# each writes $(H_BUILD)/<kind>-<label>.log, prints its last line, or its
# findings and fails.
H_JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
H_J           = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(H_JOBS))
# h_run KIND LABEL CMD: one run, its log, its verdict
h_run = echo "== $(1): $(2)"; $(3) > $(H_BUILD)/$(1)-$(2).log 2>&1 || \
	{ grep -v '^    \#[0-9]\|^==[0-9]*== \( \|$$\)' $(H_BUILD)/$(1)-$(2).log | \
	  grep -m40 'FAIL\|ERROR\|SUMMARY\|oracle\|runtime error\|==[0-9]*=='; echo "$(1): $(2) FAILED"; exit 1; }; \
	tail -1 $(H_BUILD)/$(1)-$(2).log

# ASan + UBSan runs: test-asan the fast set, without test_attention (`make
# test` runs it under ASan+UBSan in three builds: gcc whole, clang and clang++
# --quick), test-asan-full everything at full size.
h_asan_test_core      = $(H_BUILD)/test_core_asan
h_asan_golden         = $(H_BUILD)/golden_runner_asan $(H_GOLDEN)
h_asan_test_limits    = $(H_BUILD)/test_limits_asan
h_asan_test_threads   = $(H_BUILD)/test_threads_asan
h_asan_test_attention = $(H_BUILD)/test_attention_asan
h_asan_test_plugin    = $(H_BUILD)/test_plugin_asan $(H_OUT)
h_asan_test_ops       = $(H_BUILD)/test_ops_asan --quick
h_asan_fuzz_replay    = $(H_SUBMAKE) fuzz-replay
H_ASAN_RUNS      := test_core golden test_limits test_threads test_plugin test_ops fuzz_replay
H_ASAN_RUNS_FULL := $(H_ASAN_RUNS) test_attention
h-run-asan-%:
	@$(call h_run,asan,$*,env $(H_SAN_ENV) $(h_asan_$*))
test-asan test-asan-full:
	@$(H_SUBMAKE) $(H_J) $(if $(filter %-full,$@),$(H_ASAN_BINS_FULL),$(H_ASAN_BINS)) $(T_FAKES)
	@$(H_SUBMAKE) -k $(H_J) $(addprefix h-run-asan-,$(if $(filter %-full,$@),$(H_ASAN_RUNS_FULL),$(H_ASAN_RUNS))) \
	  || { echo "$@: FAILED"; exit 1; }; echo "$@: all passed"

# ---------------------------------------------------------------- ThreadSanitizer
$(H_BUILD)/%_tsan: tests/%.c $(H_HDR) | $(H_BUILD)
	$(H_SAN_CC) $(H_STD) $(H_WARN) $(H_TSAN_FLAGS) $< -o $@ $(H_LDLIBS)

h_tsan_threads_barrier = env $(H_TSAN_ENV) EI_TEST_SYNC=barrier $(H_BUILD)/test_threads_tsan
h_tsan_threads_join    = env $(H_TSAN_ENV) EI_TEST_SYNC=join $(H_BUILD)/test_threads_tsan
h_tsan_test_core       = env $(H_TSAN_ENV) $(H_BUILD)/test_core_tsan
h-run-tsan-%:
	@$(call h_run,tsan,$*,$(h_tsan_$*))
test-tsan:
	@$(H_SUBMAKE) $(H_J) $(H_BUILD)/test_threads_tsan $(H_BUILD)/test_core_tsan
	@$(H_SUBMAKE) -k $(H_J) h-run-tsan-threads_barrier h-run-tsan-threads_join h-run-tsan-test_core \
	  || { echo "test-tsan: FAILED"; exit 1; }; echo "test-tsan: no data race"

# ---------------------------------------------------------------- valgrind memcheck
$(H_BUILD)/%_plain: tests/%.c $(H_HDR) | $(H_BUILD)
	$(CC) $(H_STD) $(H_WARN) -O1 -g $< -o $@ $(H_LDLIBS)

H_VG := $(H_VALGRIND) -q --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect
H_VG_BINS := $(H_BUILD)/test_core_plain $(H_BUILD)/test_limits_plain $(H_BUILD)/test_threads_plain $(H_BUILD)/fuzz_replay_plain \
           $(H_BUILD)/test_attention_plain $(H_BUILD)/test_ops_plain

$(H_BUILD)/fuzz_replay_plain: tests/fuzz_api.c $(H_HDR) | $(H_BUILD)
	$(CC) $(H_STD) $(H_WARN) -O1 -g -DEI_FUZZ_STANDALONE $< -o $@ $(H_LDLIBS)

# test_core loops over the paths cpuid reports (under valgrind: no AVX-512);
# our tests take EI_TEST_SIMD. The fuzz replay leaves library-written memory
# uninitialised (EI_FUZZ_POISON=none) so memcheck sees any read of it.
# test-valgrind: the bad-input programs, test_limits on both paths and the
# fuzz corpus (a few minutes); test-valgrind-full adds test_core, test_attention
# --quick and test_threads on both paths (6-8 minutes each under memcheck, which
# runs a process's threads one at a time; CI runs them under ASan+UBSan, and
# test_threads under TSan).
h_vg_test_core          = $(H_VG) $(H_BUILD)/test_core_plain
h_vg_test_limits.scalar = env EI_TEST_SIMD=scalar $(H_VG) $(H_BUILD)/test_limits_plain
h_vg_test_limits.avx2   = env EI_TEST_SIMD=avx2 $(H_VG) $(H_BUILD)/test_limits_plain
h_vg_test_threads.scalar = env EI_TEST_SIMD=scalar EI_TEST_THREADS=2 EI_TEST_ROUNDS=1 $(H_VG) $(H_BUILD)/test_threads_plain
h_vg_test_threads.avx2  = env EI_TEST_SIMD=avx2 EI_TEST_THREADS=2 EI_TEST_ROUNDS=1 $(H_VG) $(H_BUILD)/test_threads_plain
h_vg_fuzz_corpus        = env EI_FUZZ_POISON=none $(H_VG) $(H_BUILD)/fuzz_replay_plain tests/fuzz_corpus
h_vg_test_attention     = $(H_VG) $(H_BUILD)/test_attention_plain --quick
h_vg_test_ops           = env EI_TEST_SIMD=avx2 $(H_VG) $(H_BUILD)/test_ops_plain --quick
# the same corpus natively, without memcheck: valgrind's CPU has no AVX-512 or
# AMX, so only a native run reaches those paths of the plain gcc -O1 build
# (gcc 12 dropped half of ldtilecfg's config as dead stores there: a fault on
# AMX machines that no sanitizer build showed)
h_vg_fuzz_corpus_native = env EI_FUZZ_POISON=none $(H_BUILD)/fuzz_replay_plain tests/fuzz_corpus
H_VG_RUNS      := test_limits.scalar test_limits.avx2 test_ops fuzz_corpus fuzz_corpus_native
H_VG_RUNS_FULL := $(H_VG_RUNS) test_core test_attention test_threads.scalar test_threads.avx2
h-run-vg-%:
	@$(call h_run,valgrind,$*,$(h_vg_$*))
test-valgrind test-valgrind-full:
	@command -v $(H_VALGRIND) >/dev/null || { echo "$@ needs valgrind (tests/install_clang_rt.sh --valgrind)"; exit 1; }
	@$(H_SUBMAKE) $(H_J) $(if $(filter %-full,$@),$(H_VG_BINS),$(H_BUILD)/test_limits_plain $(H_BUILD)/test_ops_plain $(H_BUILD)/fuzz_replay_plain)
	@$(H_SUBMAKE) -k $(H_J) $(addprefix h-run-vg-,$(if $(filter %-full,$@),$(H_VG_RUNS_FULL),$(H_VG_RUNS))) \
	  || { echo "$@: FAILED"; exit 1; }; echo "$@: memcheck clean"

# ---------------------------------------------------------------- all three
test-hardening:
	@fail=""; \
	for t in test-asan test-tsan test-limits; do \
	  $(H_SUBMAKE) $$t || fail="$$fail $$t"; \
	done; \
	if [ -n "$$fail" ]; then echo "test-hardening: FAILED:$$fail"; exit 1; fi; echo "test-hardening: all passed"
