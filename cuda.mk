# cuda.mk - the CUDA backend (included by the top-level Makefile).
#   make cuda                 build/libentropyinfer_cuda.so (nvcc; sm_80, sm_90a (wgmma) + PTX)
#   make test-cuda            GPU tests: golden cases, GPU vs CPU, attention, the backend
#                             equivalence scenarios (test_backends --require-gpu), compute-sanitizer
#   (make test-backends, in tests/tests.mk, runs test_backends without --require-gpu: the CPU
#   half, and the GPU half when the plugin loads and finds a GPU, else "GPU half skipped")
#   make test-cuda-fallback   no-GPU machine: EI_BACKEND_CUDA fails cleanly, the CPU keeps working
#   make bench-cuda           32k/64k/128k tokens, 32/8 heads, d=128, bf16, vs PyTorch SDPA; profile time
#                             of the reference ranking and of ei_config_quality() (sampled rows, top_p, sink/local)
NVCC        ?= nvcc
CUDA_ARCHS  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a \
               -gencode arch=compute_90,code=compute_90
NVCCFLAGS   ?= -O3 -std=c++17 -lineinfo
CUDA_LIB    := $(BUILD)/libentropyinfer_cuda.so
GOLDEN_CUDA ?= $(GOLDEN)

.PHONY: cuda test-cuda test-cuda-fallback bench-cuda

cuda: $(CUDA_LIB)

$(CUDA_LIB): entropyinfer_cuda.cu entropyinfer.h
	@mkdir -p $(BUILD)
	$(NVCC) $(NVCCFLAGS) $(CUDA_ARCHS) -I. -shared -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror \
	  -o $@ $<

$(BUILD)/test_cuda: tests/test_cuda.c $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE $(CFLAGS) $(WARN) -I. $< -o $@ $(LDLIBS)

# The same scenarios on a CPU and a CUDA context (no CUDA header or library at
# build time); tests/tests.mk builds it with the other test programs when it
# lists it, this rule otherwise.
ifeq ($(filter test_backends,$(T_PROGS)),)
$(BUILD)/test_backends: tests/test_backends.c tests/check.h examples/synth_qk.h $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE $(CFLAGS) $(WARN) -I. $< -o $@ $(LDLIBS)
endif

test-cuda-fallback: $(BUILD)/test_cuda
	EI_CUDA_LIBRARY= ./$(BUILD)/test_cuda --fallback

test-cuda: $(CUDA_LIB) $(BUILD)/test_cuda $(BUILD)/test_backends
	EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/test_cuda $(GOLDEN_CUDA)
	EI_CUDA_LIBRARY=./$(CUDA_LIB) ./$(BUILD)/test_backends --require-gpu
	@if command -v compute-sanitizer >/dev/null; then \
	  EI_CUDA_LIBRARY=./$(CUDA_LIB) compute-sanitizer --tool memcheck --error-exitcode 9 \
	    ./$(BUILD)/test_cuda --quick $(GOLDEN_CUDA) > $(BUILD)/sanitizer.log 2>&1 \
	    && echo "compute-sanitizer memcheck: clean" \
	    || { tail -40 $(BUILD)/sanitizer.log; echo "compute-sanitizer memcheck: FAILED"; exit 1; }; \
	else echo "compute-sanitizer not found: skipped"; fi

$(BUILD)/ei_bench_cuda: bench/ei_bench_cuda.c $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE -O2 $(WARN) -I. $< -o $@ $(LDLIBS)

BENCH_CUDA_SIZES ?= 32768 65536 131072
bench-cuda: $(CUDA_LIB) $(BUILD)/ei_bench_cuda
	-python3 bench/sdpa_ref.py $(BENCH_CUDA_SIZES) > $(BUILD)/sdpa_times.txt
	EI_CUDA_LIBRARY=./$(CUDA_LIB) EI_SDPA_TIMES=$(BUILD)/sdpa_times.txt ./$(BUILD)/ei_bench_cuda $(BENCH_CUDA_SIZES)
