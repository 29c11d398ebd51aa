# bench/tp.mk - tensor-parallel attention with the CUDA backend (included by the
# top-level Makefile after cuda.mk).
#   make tp-cuda    build/libei_tp_shim.so (bench/ei_tp_shim.c: the C API for ctypes,
#                   raw device pointers and strided views), then bench/ei_tp_cuda.py:
#                   1. the shard check on one GPU: the unsharded layer, then TP_SHARDS
#                      shard counts, each shard's heads run one after the other on the
#                      same GPU, plans and concatenated outputs compared bit for bit
#                      with the unsharded run, times per shard;
#                   2. the NCCL run, one process per GPU of this machine (torch.distributed,
#                      NCCL, all-gather of the ranks' outputs; a world of 1 on one GPU):
#                      checks against the 1-GPU run, per-layer times with 1 and P GPUs,
#                      dense and sparse, the all-gather's share, scaling efficiency.
#   TP_N=32768 (or a comma list) for quick runs; TP_SHARDS=2,4,8; TP_REPS=5; TP_NPROC (GPUs).
#   NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0,
#   TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).
TP_SHIM    := $(BUILD)/libei_tp_shim.so
TP_PYTHON  ?= python3
TP_N       ?= 131072
TP_SHARDS  ?= 2,4,8
TP_REPS    ?= 5
TP_NPROC   ?= $$(nvidia-smi -L | wc -l)
TP_ENV      = NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
              EI_CUDA_LIBRARY=./$(CUDA_LIB) PYTHONUNBUFFERED=1

.PHONY: tp-cuda tp-shim

tp-shim: $(TP_SHIM)

$(TP_SHIM): bench/ei_tp_shim.c $(HDR)
	@mkdir -p $(BUILD)
	$(CC) -std=c99 -D_DEFAULT_SOURCE -O2 $(WARN) -fPIC -shared -I. $< -o $@ $(LDLIBS)

tp-cuda: $(CUDA_LIB) $(TP_SHIM)
	$(TP_ENV) $(TP_PYTHON) bench/ei_tp_cuda.py --mode shards --tokens $(TP_N) --shards $(TP_SHARDS) --reps $(TP_REPS)
	$(TP_ENV) $(TP_PYTHON) -m torch.distributed.run --standalone --nproc_per_node=$(TP_NPROC) \
	  bench/ei_tp_cuda.py --mode nccl --tokens $(TP_N) --reps $(TP_REPS)
