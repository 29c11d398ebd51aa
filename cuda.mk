# cuda.mk - the CUDA backend (included by the top-level Makefile). Its variables start with
# CUDA_; it reads the shared BUILD, CC, CFLAGS, WARN, LDLIBS, HDR, GOLDEN and T_PROGS.
#   make cuda                 build/libentropyinfer_cuda.so (nvcc; sm_80, sm_90a (wgmma) + PTX)
#   make test-ops-cuda        tests/test_ops.c with --require-gpu: every case of the operations' table on
#                             the CPU paths and the GPU, compared (also part of make test-cuda)
#   make test-cuda            GPU tests: golden cases, GPU vs CPU (whole-prompt and chunked plans:
#                             ei_profile_chunk schedules, both rankings; a --quick pass with the
#                             block scores on score_kernel), attention, the backend
#                             equivalence scenarios (test_backends --require-gpu), a layer and a
#                             chunk captured in CUDA graphs (test_cuda_graph: cuda_deferred_errors),
#                             compute-sanitizer
#   (make test-backends, in tests/tests.mk, runs test_backends without --require-gpu: the CPU
#   half, and the GPU half when the plugin loads and finds a GPU, else "GPU half skipped")
#   make test-gpu-fuzz        tests/fuzz_backends.c: random configs, shapes, dtypes, layouts and
#                             protocols on the CPU and the GPU, compared (CUDA_FUZZ_SEED, CUDA_FUZZ_ITERS,
#                             CUDA_FUZZ_SECONDS: a time limit, 0 none; CUDA_FUZZ_JOBS processes, seeds
#                             CUDA_FUZZ_SEED.. ; replay one iteration: fuzz_backends --seed S --first I --iters 1)
#   make test-gpu-fuzz-sanitize  the same under compute-sanitizer: memcheck (CUDA_FUZZ_MEMCHECK_ITERS)
#                             and racecheck (CUDA_FUZZ_RACECHECK_ITERS: slow, few)
#   make test-cuda-fallback   no-GPU machine: EI_BACKEND_CUDA fails cleanly, the CPU keeps working;
#                             fuzz_backends builds, says "no GPU", and 5 draws run CPU vs CPU (--cpu-twin; the fifth a case of the table)
#   make bench-chunk-cuda     an engine's micro-batch on the GPU (Gemma 3's and SmolLM2's head shapes, 512 and
#                             4096 queries after 8k-128k keys): split-K against one CTA per work item
#   make trace-plan-cuda      bench/ei_trace_cuda.c's plan mode (nvcc, CUPTI): chunked planning as llama.cpp's
#                             glue runs it at the same shapes, host time per call and GPU time per kernel
#                             (CUDA_TRACE_SHAPES: groups of H KV D n m; m 0: ei_profile of the whole prompt)
#   make bench-cuda           32k/64k/128k tokens, 32/8 heads, d=128, bf16, vs PyTorch SDPA; profile time
#                             of the reference ranking and of ei_config_quality() (sampled rows, top_p, sink/local)
#                             ; plans at real densities (30% / 50% of the dense keys: profile + sparse vs SDPA)
#                             and f32 queries (dense attention, profiling) against bf16 q
CUDA_NVCC ?= nvcc
CUDA_ARCHS  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a \
               -gencode arch=compute_90,code=compute_90
CUDA_NVCCFLAGS   ?= -O3 -std=c++17 -lineinfo --threads 0
CUDA_LIB    := $(BUILD)/libentropyinfer_cuda.so
CUDA_GOLDEN ?= $(GOLDEN)

.PHONY: cuda test-cuda test-ops-cuda test-cuda-fallback bench-cuda bench-chunk-cuda trace-plan-cuda test-gpu-fuzz test-gpu-fuzz-sanitize

cuda: $(CUDA_LIB)

$(CUDA_LIB): entropyinfer_cuda.cu entropyinfer.h
	@mkdir -p $(BUILD)
	$(CUDA_NVCC) $(CUDA_NVCCFLAGS) $(CUDA_ARCHS) -I. -shared -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror \
	  -o $@ $<

$(BUILD)/test_cuda: tests/test_cuda.c $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE $(CFLAGS) $(WARN) -I. $< -o $@ $(LDLIBS)

# cfg.cuda_deferred_errors: a layer captured in a CUDA graph and replayed; it
# drives the stream and the graph itself, so nvcc builds it against the CUDA
# runtime (only here: test-cuda-fallback builds nothing that needs CUDA).
$(BUILD)/test_cuda_graph: tests/test_cuda_graph.c tests/check.h $(HDR)
	@mkdir -p $(BUILD)
	$(CUDA_NVCC) -O2 -I. -Xcompiler -Wall,-Wextra,-Werror $< -o $@ -ldl -lpthread -lm

# The same scenarios on a CPU and a CUDA context (no CUDA header or library at
# build time); tests/tests.mk builds it with the other test programs when it
# lists it, this rule otherwise.
ifeq ($(filter test_backends,$(T_PROGS)),)
$(BUILD)/test_backends: tests/test_backends.c tests/check.h examples/synth_qk.h $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE $(CFLAGS) $(WARN) -I. $< -o $@ $(LDLIBS)
endif

# The differential fuzzer (tests/fuzz_backends.c), against the plugin.
$(BUILD)/fuzz_backends: tests/fuzz_backends.c tests/check.h tests/ops_cases.h examples/synth_qk.h $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE $(CFLAGS) $(WARN) -I. $< -o $@ $(LDLIBS)

CUDA_FUZZ_SEED            ?= 1
CUDA_FUZZ_ITERS           ?= 300
CUDA_FUZZ_SECONDS         ?= 0
CUDA_FUZZ_JOBS            ?= 1
CUDA_FUZZ_MEMCHECK_ITERS  ?= 25
CUDA_FUZZ_RACECHECK_ITERS ?= 4
CUDA_FUZZ_RUN = EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/fuzz_backends --require-gpu
# CUDA_FUZZ_JOBS processes on one GPU (the CPU side is single-threaded), seeds
# CUDA_FUZZ_SEED, CUDA_FUZZ_SEED+1, ...; each writes build/fuzz.<seed>.log, the
# failures and summaries are printed, and any failure fails the target.
test-gpu-fuzz: $(CUDA_LIB) $(BUILD)/fuzz_backends
	@fail=0; pids=""; for j in $$(seq 0 $$(($(CUDA_FUZZ_JOBS) - 1))); do s=$$(($(CUDA_FUZZ_SEED) + j)); \
	  $(CUDA_FUZZ_RUN) --seed $$s --iters $(CUDA_FUZZ_ITERS) --seconds $(CUDA_FUZZ_SECONDS) > $(BUILD)/fuzz.$$s.log 2>&1 & pids="$$pids $$!"; done; \
	for p in $$pids; do wait $$p || fail=1; done; \
	for j in $$(seq 0 $$(($(CUDA_FUZZ_JOBS) - 1))); do s=$$(($(CUDA_FUZZ_SEED) + j)); \
	  grep -E '^(FAIL|counts|fuzz_backends: [0-9])' $(BUILD)/fuzz.$$s.log | tail -30; done; \
	test $$fail = 0 || { echo "test-gpu-fuzz: FAILED (logs: $(BUILD)/fuzz.*.log)"; exit 1; }
# compute-sanitizer on the same draws (kernels run 10-100x slower under it).
test-gpu-fuzz-sanitize: $(CUDA_LIB) $(BUILD)/fuzz_backends
	@for tool in memcheck racecheck; do \
	  n=$$(test $$tool = memcheck && echo $(CUDA_FUZZ_MEMCHECK_ITERS) || echo $(CUDA_FUZZ_RACECHECK_ITERS)); \
	  EI_CUDA_LIBRARY=./$(CUDA_LIB) compute-sanitizer --tool $$tool --error-exitcode 9 \
	    ./$(BUILD)/fuzz_backends --require-gpu --seed $(CUDA_FUZZ_SEED) --iters $$n --max-n 600 > $(BUILD)/fuzz.$$tool.log 2>&1; rc=$$?; \
	  grep -E '^(FAIL|fuzz_backends: [0-9])|ERROR SUMMARY|RACECHECK SUMMARY|Error' $(BUILD)/fuzz.$$tool.log | head -20; \
	  test $$rc = 0 || { echo "compute-sanitizer $$tool: FAILED (rc $$rc, $(BUILD)/fuzz.$$tool.log)"; exit 1; }; \
	  echo "compute-sanitizer $$tool: clean ($$n iterations)"; done

# (CI runs this target: it also builds the fuzzer, which without a GPU says so
# and passes, and runs a few of its draws CPU against CPU on another SIMD path.)
test-cuda-fallback: $(BUILD)/test_cuda $(BUILD)/fuzz_backends
	EI_CUDA_LIBRARY= ./$(BUILD)/test_cuda --fallback
	EI_CUDA_LIBRARY= ./$(BUILD)/fuzz_backends
	./$(BUILD)/fuzz_backends --cpu-twin --seed $(CUDA_FUZZ_SEED) --iters 5

# The operations' table (tests/ops_cases.h) on the CPU paths and the GPU (tests/tests.mk builds test_ops).
test-ops-cuda: $(CUDA_LIB) $(BUILD)/test_ops
	EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/test_ops --require-gpu

test-cuda: $(CUDA_LIB) $(BUILD)/test_cuda $(BUILD)/test_backends $(BUILD)/test_cuda_graph $(BUILD)/test_ops
	EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/test_cuda $(CUDA_GOLDEN)
	EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/test_ops --require-gpu
	EI_CUDA_SCORE_KERNEL=pairs EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/test_cuda --quick $(CUDA_GOLDEN)
	EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/test_backends --require-gpu
	EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/test_cuda_graph
	@if command -v compute-sanitizer >/dev/null; then \
	  EI_CUDA_LIBRARY=./$(CUDA_LIB) compute-sanitizer --tool memcheck --error-exitcode 9 \
	    ./$(BUILD)/test_cuda --quick $(CUDA_GOLDEN) > $(BUILD)/sanitizer.log 2>&1 \
	    && EI_CUDA_LIBRARY=./$(CUDA_LIB) compute-sanitizer --tool memcheck --error-exitcode 9 \
	    ./$(BUILD)/test_cuda_graph >> $(BUILD)/sanitizer.log 2>&1 \
	    && echo "compute-sanitizer memcheck: clean (test_cuda --quick, test_cuda_graph)" \
	    || { tail -40 $(BUILD)/sanitizer.log; echo "compute-sanitizer memcheck: FAILED"; exit 1; }; \
	else echo "compute-sanitizer not found: skipped"; fi

$(BUILD)/ei_bench_cuda: bench/ei_bench_cuda.c bench/ei_bench_common.h bench/ei_bench_inputs.h $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE -O2 $(WARN) -I. $< -o $@ $(LDLIBS)

$(BUILD)/ei_bench_chunk_cuda: bench/ei_bench_chunk_cuda.c bench/ei_bench_common.h $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE -O2 $(WARN) -I. $< -o $@ $(LDLIBS)

# an engine's micro-batch (m queries after n keys, few heads): split-K against one CTA per work item
bench-chunk-cuda: $(CUDA_LIB) $(BUILD)/ei_bench_chunk_cuda
	EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/ei_bench_chunk_cuda

$(BUILD)/ei_trace_cuda: bench/ei_trace_cuda.c bench/ei_bench_common.h bench/ei_bench_inputs.h $(HDR)
	@mkdir -p $(BUILD)
	$(CUDA_NVCC) -O2 -I. -I bench -Xcompiler -Wall,-Wextra,-Werror $< -o $@ -lcupti -ldl -lpthread -lm

# chunked planning as llama.cpp's glue runs it (issue 33): host time per call, GPU time per kernel
CUDA_TRACE_SHAPES ?=
trace-plan-cuda: $(CUDA_LIB) $(BUILD)/ei_trace_cuda
	EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/ei_trace_cuda plan $(CUDA_TRACE_SHAPES)

CUDA_BENCH_SIZES ?= 32768 65536 131072
bench-cuda: $(CUDA_LIB) $(BUILD)/ei_bench_cuda
	-python3 bench/sdpa_ref.py $(CUDA_BENCH_SIZES) > $(BUILD)/sdpa_times.txt
	EI_CUDA_LIBRARY=./$(CUDA_LIB) EI_SDPA_TIMES=$(BUILD)/sdpa_times.txt ./$(BUILD)/ei_bench_cuda $(CUDA_BENCH_SIZES)
