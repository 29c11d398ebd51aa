/* entropyinfer_cuda.cu - the CUDA backend of entropyinfer.h, built into
   libentropyinfer_cuda.so (`make cuda`) and loaded by the header with dlopen
   only when a context asks for EI_BACKEND_CUDA. Its only export is
   ei_cuda_get_api(abi_version), which returns the function table declared in
   entropyinfer.h (struct ei_cuda_api, EI_CUDA_ABI_VERSION).

   The contract (entropyinfer.h, "CUDA plugin ABI"): the header validates
   every argument of a public call (views, shapes, GQA, plan layout and
   capacities, protocol state, budgets) before it calls an entry here, lays
   plans and the decoder ring out itself and clears them with mem_set. An
   entry checks only what the device adds: dtypes and head sizes the kernels
   support, alignment, grid and shared-memory limits, and the contents of
   device memory the host cannot read (NaN/Inf in Q/K, keep-set indices).
   The method's rules (caps, sparsity of a segment, rigid test, budget
   recurrence, decode window) come from the header's host/device block
   ("the method's rules, once"): nothing here re-derives them.

   Stages (each one pass over the layer, no host loop over segments):
   profile   >>cuda-minmax    min/max features of query segments (whole token
                              rows, 16-byte loads) and key blocks
             >>cuda-scores    segment x block scores (f32, four dot products
                              each, in the CPU's order: bit-identical), a
                              register tile over a kv group's query heads
             >>cuda-softmax   masked softmax + entropy per (kv head, segment)
             >>cuda-sampled   EI_RANK_SAMPLED: block mass of the sampled query
                              rows (exact softmax; tensor cores for bf16/f16 k
                              with q of k's type or f32, rounded to it on load:
                              wgmma on Hopper, else mma.sync; CUDA cores else)
             >>cuda-budgets   ei__head_rigid / ei__budget_next / ei__keep_count /
                              ei__cap_blocks; only the recurrence's additions
                              run in series (a thread per kv head)
             >>cuda-topk      per (kv head, segment) top-k: radix select on
                              (score, index) keys, then a bitonic sort
             >>cuda-rank      the same beyond the paper: always-kept blocks
                              first, sampled mass or reference score, top_p
                              counts (ei__keep_count)
             >>cuda-chunked   chunked planning (ei_profile_chunk): the stages
                              above on the segments a chunk touches, the
                              per-head state in the plan's device memory (the
                              open segment's query min/max merged, its raw
                              scores kept, or with EI_RANK_SAMPLED its mass
                              once it holds sampled rows (summed over chunks,
                              by the kernels of >>cuda-sampled on the chunk's
                              rows), the key-block store, the budget
                              recurrence of ei__chunk_recurrence)
   attention >>cuda-attention block-sparse / dense causal prefill, tensor
                              cores (wgmma on Hopper, its K/V tiles copied by
                              TMA where the keys allow; mma.sync elsewhere)
                              bf16/f16, f32 accumulation, online softmax, the
                              query heads of a kv group packed in one CTA so a
                              gathered K/V tile is read once for the group;
                              ragged per-head budgets; one launch per layer;
                              views of any element-aligned layout; NaN/Inf in
                              the Q and K rows read: EI_ERR_NONFINITE.
                              q may be f32 over bf16/f16 k and v (llama.cpp):
                              each element is rounded to k's type (nearest
                              even) as the Q tile is loaded into shared memory
                              (no copy of Q; the MMAs take 16-bit operands), so
                              logits carry up to 2^-8 (bf16; ~2^-9 rms) /
                              2^-11 (f16) of scale * sum |q_i k_i| (the unit
                              roundoff of the 16-bit type) that the
                              CPU, which keeps q in f32, does not; the scan
                              reads q as f32 and checks the rounded values (an
                              f16 Inf from |x| >= 65520 is refused too)
   decode    >>cuda-decode    observation ring (NaN/Inf scan first); row maps
                              (row_pos: checked, each sorted by position with
                              CUB's radix sort); scoring of the decode
                              policy's queries (ei__decode_scored) over the
                              rows in position order (ei_decode_score: raw
                              per row); reduction over a group, pooling, keep
                              sets by the policy (rows ascending, tail
                              included, positions; budget ei__decode_budget);
                              H2O's sums in the decoder; shared keep sets
                              (shared_add, select_shared)
             >>cuda-compact   keep-set index check, then in-place KV compaction
                              (per head, or one shared set for every head)
   mask      >>cuda-mask      ei_plan_mask: the plan as an additive attention
                              mask for an engine's own kernel
   knobs     >>cuda-tuning    the environment variables that pick kernel
                              variants for benchmarks and tests, read in one
                              place (measurements: docs/performance.md)

   Every view is read as element (t, h, i) = data[t*token_stride +
   h*head_stride + i]; no kernel assumes another layout. Plans have the CPU
   layout (ei__plan_geometry), their arrays in device memory; rows of the
   [kv][segment] arrays are seg_capacity apart, block_index rows max_keep
   apart, score rows blk_capacity apart. */

#include <cuda.h> /* CUtensorMap and its encoder's type only: the encoder comes from the runtime (cudaGetDriverEntryPointByVersion) */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <atomic>
#include <float.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <type_traits>
#include <vector>
#include <cub/device/device_radix_sort.cuh>

#define EI_CUDA_ABI_DECLS /* the function table and the shared rules of entropyinfer.h */
#include "entropyinfer.h"

#define EI_EXPORT extern "C" __attribute__((visibility("default")))

/* ============================================================ >>cuda-tuning */
/* Tuning knobs: environment variables for benchmarks, ablations and tests,
   never needed in production (every default below is what the library
   runs). They are read here and nowhere else: each entry that uses one
   takes a snapshot with tuning_read() once at its start and hands the
   struct down, so one call sees one consistent setting, and the launch
   code reads the struct, not the environment. A snapshot per call rather
   than per process, because the tests and bench/ei_bench_cuda.c change
   EI_CUDA_ATTN_CFG, EI_CUDA_SAMPLED_GENERIC and EI_CUDA_SAMPLED_MMA with
   setenv between calls on one context to run every kernel; the plugin
   keeps no state of its own, so the snapshot is thread-safe as getenv is
   (no thread calling setenv meanwhile). Listed for users in README.md's
   GPU section; what each variant measured: docs/performance.md.

   EI_CUDA_ATTN_CFG (attn_cfg): the attention kernel of every segment.
     Default (unset or ""): on Hopper wgs128 for head_dim 128, wgk64 for
     head_dim 64, wgz64 for 256 (ATTN_D256_DEFAULT: attention_ws_kernel at 64
     keys per step; wgi64 where split-K would cut the call's work items, see
     api_attention; 256 knows only wg64, wgk64, wgi64: wgk64 on
     group-interleaved tiles, wgs64, wgz64: wgs64 without ping-pong, and
     "4x1x64"); other GPUs mma.sync
     8x2x64, head_dim 256 mma.sync 4x1x64.
     wgmma kernels (Hopper, attention_kernel): "wg64" / "wg128" (cp.async
     tiles, 64 / 128 keys per step), "wgt64" / "wgt128" (TMA tiles),
     "wgk64" / "wgk128" (TMA, masks from key indices), "wgp64" / "wgp128"
     (wgk without a CTA barrier per TMA tile), "wgo64" / "wgo128" (three
     stages, S(j+1) issued before P V(j)), "wgq128" (wgo, warpgroup 0's
     products first). attention_ws_kernel (head_dim 128 and block sizes
     that are multiples of 8; other calls run wgk64): "wgw128" (ping-pong,
     2 stages, slab tiles), "wgv128" (wgw without ping-pong), "wgx128" /
     "wgu128" (3 stages, with / without ping-pong), "wgg128" (wgx, every
     tile as 8-key boxes), "wgy128" (wgx on group-interleaved tiles),
     "wgh128" (wgy, every tile as group boxes), "wgz128" (wgy without
     ping-pong), "wgs128" (wgy with two producer warps, one for K and one
     for V: the default). mma.sync: "WxMxB", W in {4,8} warps, M in {1,2} m-tiles
     per warp, B in {64,32} keys per step (32 with M = 2 and head_dim 128
     only). Parsed by attention_shape. Used by test_cuda (every shape),
     ei_bench_cuda (EI_BENCH_SHAPES) and bench/cuda_session.sh (CFG=).
   EI_CUDA_ATTN_SPARSE_CFG (attn_sparse_cfg): a plan's sparse segments on
     another kernel (EI_CUDA_ATTN_CFG's values) when it has as many rows
     per CTA: two launches. Default ATTN_SPARSE_DEFAULT (NULL: the dense
     segments' kernel). Used by bench/cuda_session.sh (SPCFG=).
   EI_CUDA_ATTN_SPLIT (attn_split): N caps split-K's splits (head_dim 64
     and 256; atoi, so 1, 0 or text: off). Default (unset or ""): no cap.
     In entropyinfer.h's manual (ei_attention_prefill).
   EI_CUDA_SCORE_KERNEL (score_pairs): "pairs" runs the block scores on
     score_kernel where score_group_kernel would run. Used by make
     test-cuda (both score kernels against the CPU).
   EI_CUDA_SAMPLED_GENERIC (sampled_generic): first character '1': the
     sampled ranking's rows on CUDA cores (mass_generic_kernel, q read as
     f32) where the tensor cores would run. Used by test_cuda,
     test_backends and ei_bench_cuda (the f32-query table).
   EI_CUDA_SAMPLED_MMA (sampled_mma): first character '1': mma.sync where
     wgmma would run (mass_mma_kernel). Used by test_backends.
   EI_CUDA_SAMPLED_CTAS (sampled_ctas): N > 0 (atoi): the CTA count the
     sampled rows aim at (their key parts, mass_geometry; it also sizes
     ei_profile's workspace). Default 2048. Ablations.
   EI_CUDA_SAMPLED_CHUNK_PARTS (sampled_chunk_parts): N > 0 (atoi): key
     parts at most in a chunk's sampled rows (ei_profile_chunk). Default:
     chunk_parts_max's rule (16, more for chunks that fill few CTAs).
     Ablations. */
struct CudaTuning {
    const char *attn_cfg, *attn_sparse_cfg; /* as in the environment (NULL: unset) */
    int attn_split;                         /* INT_MAX: unset or empty */
    bool score_pairs, sampled_generic, sampled_mma;
    int sampled_ctas, sampled_chunk_parts;
};
static CudaTuning tuning_read(void) {
    CudaTuning t;
    const char *e;
    t.attn_cfg = getenv("EI_CUDA_ATTN_CFG");
    t.attn_sparse_cfg = getenv("EI_CUDA_ATTN_SPARSE_CFG");
    e = getenv("EI_CUDA_ATTN_SPLIT");
    t.attn_split = e && e[0] ? atoi(e) : INT_MAX;
    e = getenv("EI_CUDA_SCORE_KERNEL");
    t.score_pairs = e && strcmp(e, "pairs") == 0;
    e = getenv("EI_CUDA_SAMPLED_GENERIC");
    t.sampled_generic = e && e[0] == '1';
    e = getenv("EI_CUDA_SAMPLED_MMA");
    t.sampled_mma = e && e[0] == '1';
    e = getenv("EI_CUDA_SAMPLED_CTAS");
    t.sampled_ctas = e && atoi(e) > 0 ? atoi(e) : 2048;
    e = getenv("EI_CUDA_SAMPLED_CHUNK_PARTS");
    t.sampled_chunk_parts = e && atoi(e) > 0 ? atoi(e) : 0; /* 0: chunk_parts_max's rule */
    return t;
}

/* ------------------------------------------------------------ host helpers */
static ei_result fail(char *msg, ei_result code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ei_result fail(char *msg, ei_result code, const char *fmt, ...) {
    if (msg) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, EI_CUDA_MSG_SIZE, fmt, ap);
        va_end(ap);
    }
    return code;
}

#define CUDA_TRY(call)                                                                        \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess)                                                                \
            return fail(msg, EI_ERR_BACKEND, "%s: %s (%s:%d)", #call, cudaGetErrorString(e_), \
                        __FILE__, __LINE__);                                                  \
    } while (0)
#define LAUNCH_CHECK(what)                                                                    \
    do {                                                                                      \
        cudaError_t e_ = cudaGetLastError();                                                  \
        if (e_ != cudaSuccess)                                                                \
            return fail(msg, EI_ERR_BACKEND, "launch of %s: %s", what, cudaGetErrorString(e_)); \
    } while (0)

static inline cudaStream_t stream_of(const ei_config *cfg) { return (cudaStream_t)cfg->cuda_stream; }
static const char *dtype_str(int dt) { return dt == EI_F32 ? "f32" : dt == EI_F16 ? "f16" : dt == EI_BF16 ? "bf16" : "?"; }

/* a*b with overflow check into *out (size_t) */
static bool mul_ok(size_t a, size_t b, size_t *out) {
    if (a && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}
static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }
/* the 256-byte aligned start of a workspace */
static char *ws_base(void *ws) { return (char *)(((uintptr_t)ws + 255) & ~(uintptr_t)255); }

/* Opt-in shared memory per block of the current device (bytes). */
static ei_result smem_limit(int *bytes, char *msg) {
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    CUDA_TRY(cudaDeviceGetAttribute(bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return EI_OK;
}
/* A launch grid within the hardware's limits (x < 2^31, y and z < 2^16). */
static ei_result grid_fits(const char *what, int64_t x, int64_t y, int64_t z, char *msg) {
    if (x <= 0x7fffffffLL && y <= 65535 && z <= 65535) return EI_OK;
    return fail(msg, EI_ERR_UNSUPPORTED, "%s: the launch grid (%lld x %lld x %lld) exceeds the device's limits",
                what, (long long)x, (long long)y, (long long)z);
}
/* Blocks of 256 threads for a grid-stride loop over n elements. */
static unsigned stride_blocks(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* Entries without a workspace that must read a device result back
   (decode_observe, kv_compact) record "the first bad element" in a slot of
   this array: atomicMin of a 64-bit key, ~0 when none. Every call takes its
   own slot (round robin) and holds it only until it returns (the readback
   synchronises), so concurrent calls from the threads sharing a context do
   not meet unless thousands are in flight at once. With deferred errors
   (no readback) a call holds its slot until its kernels have run: a graph
   that captured decode_observe or kv_compact replays its slot, which the
   4095 calls taken after it may meet again (attention keeps its reports in
   its workspace instead). */
#define EI_CUDA_SLOTS 4096
__device__ unsigned long long g_first_bad[EI_CUDA_SLOTS];
static std::atomic<unsigned> g_next_slot(0);
static ei_result slot_take(cudaStream_t st, unsigned long long **slot, char *msg) {
    void *base = NULL;
    CUDA_TRY(cudaGetSymbolAddress(&base, g_first_bad));
    *slot = (unsigned long long *)base + g_next_slot.fetch_add(1u) % EI_CUDA_SLOTS;
    CUDA_TRY(cudaMemsetAsync(*slot, 0xFF, sizeof(unsigned long long), st));
    return EI_OK;
}
static ei_result slot_read(cudaStream_t st, const unsigned long long *slot, unsigned long long *value, char *msg) {
    CUDA_TRY(cudaMemcpyAsync(value, slot, sizeof *value, cudaMemcpyDeviceToHost, st));
    CUDA_TRY(cudaStreamSynchronize(st));
    return EI_OK;
}

/* Deferred errors (cfg->cuda_deferred_errors, for CUDA graph capture): the
   per-layer entries then never synchronise or read back; a one-thread kernel
   queued after a call's checks moves its report (a profile flag, a first-bad
   slot) into g_deferred: word 0 = DE_* source | detail bits << 8, word 1 =
   the report, the first report since api_deferred_status cleared them (one
   record per process and device: the contexts of the mode share it). The
   decode entries (DE_DECODE) check on the device what the waiting calls
   read back (decode_check_kernel): detail = the entry (DEC_E_*) | the fault
   (DK_*) << 4, words 1..3 the values its message names. */
enum { DE_PROFILE = 1, DE_ATTENTION = 2, DE_OBSERVE = 3, DE_COMPACT = 4, DE_DECODE = 5 };
enum { DE_Q_F32 = 1, DE_BF16 = 2 }; /* detail bits of DE_ATTENTION */
__device__ unsigned long long g_deferred[4];
static inline bool deferred(const ei_config *cfg) { return cfg->cuda_deferred_errors != 0; }
/* report: an int flag (DE_PROFILE, 0 = none) or a first-bad key (~0 = none) */
__global__ void deferred_record_kernel(const void *report, int source, int detail) {
    unsigned long long value = source == DE_PROFILE ? (unsigned long long)(unsigned)*(const int *)report
                                                    : *(const unsigned long long *)report;
    if (source == DE_PROFILE ? value == 0 : value == ~0ull) return;
    if (atomicCAS(&g_deferred[0], 0ull, (unsigned long long)source | ((unsigned long long)detail << 8)) == 0ull)
        atomicExch(&g_deferred[1], value);
}
static ei_result deferred_record(const void *report, int source, int detail, cudaStream_t st, char *msg) {
    deferred_record_kernel<<<1, 1, 0, st>>>(report, source, detail);
    LAUNCH_CHECK("deferred_record_kernel");
    return EI_OK;
}

/* ------------------------------------------------------------ device helpers */
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}
/* 16 bytes, or zeros where !valid (src is then not read) */
__device__ __forceinline__ void cp_async16_zfill(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ float load_f32(const void *p, int dtype, int64_t i) {
    if (dtype == EI_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dtype == EI_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ double warp_sum_d(double x) {
    for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
/* block-wide reductions; red must hold 32 values; all threads get the result */
__device__ float block_max(float x, float *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) red[w] = x;
    __syncthreads();
    x = lane < nw ? red[lane] : -INFINITY;
    return warp_max(x);
}
__device__ double block_sum_d(double x, double *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    x = warp_sum_d(x);
    __syncthreads();
    if (lane == 0) red[w] = x;
    __syncthreads();
    x = lane < nw ? red[lane] : 0.0;
    return warp_sum_d(x);
}

/* Order-preserving key of a float (larger float -> larger key; -0 and +0
   are one value, as in the CPU's comparisons; NaN never reaches here). 64-bit
   keys append ~index so that equal scores rank the lower index first (the
   CPU's order: descending score, ties to the lower index) and every key is
   unique. */
__device__ __forceinline__ uint32_t float_key(float f) {
    uint32_t u = __float_as_uint(f);
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ uint64_t rank_key(float f, int64_t j) {
    return ((uint64_t)float_key(f) << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)j);
}

/* The key of the k-th largest candidate of row[0..len) (1 <= k <= the
   candidates): elements [ns, l0) are candidates, the others (the always-kept
   blocks of a ranked row) take key 0, below every real key. An 8-bit radix
   select over the 64-bit rank keys; all threads return it; exactly k
   candidates have a key >= the result. hist: 256 ints of shared.
   The high bytes of similar scores (sign and exponent) fall in one or two
   bins, and 256 threads adding to one shared word one at a time made most of
   the top-k kernel's time: a warp whose counted keys share a bin adds them in
   one atomic (__match_any_sync for every add was slower still). The bin of
   the k-th key is found by a warp (a suffix scan over 8 bins per lane),
   not by one thread walking 256 bins. Once the four float bytes are decided, the
   index bytes are needed only when the k-th score ties with a score that is
   not kept: when every candidate of that score is kept (the usual case), the
   threshold is the one of them with the highest index, found in one pass. */
__device__ uint64_t block_select_kth_range(const float *row, int64_t len, int64_t k, int64_t ns, int64_t l0, int *hist) {
    __shared__ uint64_t s_prefix;
    __shared__ int64_t s_k;
    __shared__ int s_take_all;
    __shared__ unsigned s_last;
    const int lane = (int)threadIdx.x & 31;
    uint64_t prefix = 0, mask = 0;
    if (threadIdx.x == 0) s_k = k;
    for (int pass = 0; pass < 8; pass++) {
        int shift = 56 - 8 * pass;
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
#pragma unroll 4 /* loads of the row in flight together (the row is read once per pass) */
        for (int64_t j0 = 0; j0 < len; j0 += blockDim.x) { /* whole warps in step, for the warp votes */
            const int64_t j = j0 + threadIdx.x;
            const uint64_t key = (j < len && j >= ns && j < l0) ? rank_key(row[j], j) : 0;
            const bool in = j < len && (key & mask) == prefix;
            const unsigned bin = (unsigned)(key >> shift) & 255u, inmask = __ballot_sync(0xffffffffu, in);
            if (!inmask) continue;
            const unsigned lead = __shfl_sync(0xffffffffu, bin, __ffs(inmask) - 1);
            if (__all_sync(0xffffffffu, !in || bin == lead)) {
                if (lane == 0) atomicAdd(&hist[lead], __popc(inmask));
            } else if (in) {
                atomicAdd(&hist[bin], 1);
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) { /* lane l holds bins 255 - 8l down to 248 - 8l */
            int own = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) own += hist[255 - 8 * lane - i];
            int incl = own; /* keys in bins above and in this lane's */
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const int64_t need = s_k;
            const unsigned hit = __ballot_sync(0xffffffffu, incl >= need);
            const int l = hit ? __ffs(hit) - 1 : 31; /* the lane whose bins reach the k-th key */
            if (lane == l) {
                int64_t cum = incl - own;
                int bin = 255 - 8 * l;
                for (int i = 0; i < 7; i++, bin--) {
                    if (cum + hist[bin] >= need) break;
                    cum += hist[bin];
                }
                s_k = need - cum;
                s_prefix = prefix | ((uint64_t)bin << shift);
                s_take_all = pass == 3 && s_k == hist[bin];
                s_last = 0u;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        mask |= (uint64_t)255 << shift;
        if (s_take_all) { /* the score is decided and all its candidates are kept: the lowest key among them */
            const uint32_t fk = (uint32_t)(prefix >> 32);
            unsigned low = 0u; /* the largest ~index: the smallest key */
#pragma unroll 4
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                if (j >= ns && j < l0 && float_key(row[j]) == fk) low = max(low, (unsigned)j + 1u);
            if (low) atomicMax(&s_last, low);
            __syncthreads();
            return ((uint64_t)fk << 32) | (uint64_t)(0xFFFFFFFFu - (s_last - 1u));
        }
        __syncthreads();
    }
    return prefix;
}
/* Bitonic sort of keys[0..n2) (n2 a power of two, shared memory), descending;
   ends with a barrier. */
__device__ void block_sort_desc(uint64_t *keys, int n2) {
    for (int size = 2; size <= n2; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n2; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    bool desc = (i & size) == 0;
                    uint64_t a = keys[i], b = keys[j];
                    if (desc ? (a < b) : (a > b)) {
                        keys[i] = b;
                        keys[j] = a;
                    }
                }
            }
            __syncthreads();
        }
}
/* The k-th largest element of the whole row (1 <= k <= len). */
__device__ uint64_t block_select_kth(const float *row, int64_t len, int64_t k, int *hist) {
    return block_select_kth_range(row, len, k, 0, len, hist);
}

/* ============================================================ >>cuda-minmax */
/* Profiling flags (one int in the workspace, read back at the end). */
enum { PF_NAN_Q = 1, PF_OVERFLOW = 2, PF_NAN_K = 4, PF_KEEP = 8, PF_SAMPLED = 16,
       PF_Q_RANGE = 32, /* an f32 query beyond the 16-bit type the sampled rows round it to */
       PF_GROUP = 64 /* chunked: q has another query-head group than the stored open segment */ };

/* qfeat[(h*nseg + s)*2 + {0 max, 1 min}][D]: over the queries of segment
   s_first + s given so far (positions [q_pos, n): q row t - q_pos holds
   position t; the whole prompt has q_pos = s_first = 0). */
__global__ void __launch_bounds__(256) qfeat_kernel(const void *q, int dtype, int64_t ts, int64_t hs, int64_t n,
                                                    int D, int seg, int nseg, float *qfeat, int *flag, int64_t q_pos,
                                                    int s_first) {
    __shared__ float smax[4][64], smin[4][64];
    int s = blockIdx.x, h = blockIdx.y;
    int64_t t0 = max((int64_t)(s_first + s) * seg, q_pos) - q_pos, t1 = min(n, (int64_t)(s_first + s + 1) * seg) - q_pos;
    int lane = threadIdx.x & 63, r = threadIdx.x >> 6;
    bool bad = false;
    for (int d0 = 0; d0 < D; d0 += 64) {
        int d = d0 + lane;
        float mx = -INFINITY, mn = INFINITY;
        if (d < D)
#pragma unroll 8 /* eight loads in flight per thread: one at a time left the kernel latency-bound */
            for (int64_t t = t0 + r; t < t1; t += 4) {
                float x = load_f32(q, dtype, t * ts + (int64_t)h * hs + d);
                bad |= !isfinite(x);
                mx = fmaxf(mx, x);
                mn = fminf(mn, x);
            }
        smax[r][lane] = mx;
        smin[r][lane] = mn;
        __syncthreads();
        if (r == 0 && d < D) {
            for (int i = 1; i < 4; i++) {
                mx = fmaxf(mx, smax[i][lane]);
                mn = fminf(mn, smin[i][lane]);
            }
            float *o = qfeat + ((int64_t)h * nseg + s) * 2 * D;
            o[d] = mx;
            o[D + d] = mn;
        }
        __syncthreads();
    }
    if (bad) atomicOr(flag, PF_NAN_Q);
}

/* qfeat_kernel's result from whole token rows: a CTA takes segment s and HB
   heads whose rows of D elements are 64 16-byte chunks per token (HB = 64 /
   (D / V), V elements of 16 bytes), 4 tokens at a time, and the phases meet
   in shared memory. A warp reads 512 contiguous bytes per load (qfeat_kernel:
   64 bytes, 2 bytes a lane), for views whose data is 16-byte aligned with
   strides multiples of V. The same maxima and minima. */
template <typename T, int P>
__global__ void __launch_bounds__(64 * P) qfeat_rows_kernel(const T *q, int64_t ts, int64_t hs, int64_t n, int D, int seg,
                                                            int nseg, int HB, float *qfeat, int *flag, int64_t q_pos,
                                                            int s_first) {
    constexpr int V = 16 / (int)sizeof(T);
    __shared__ float smax[32 * P * V], smin[32 * P * V]; /* the upper half of the phases, halved each round */
    const int s = blockIdx.x, cph = D / V, c = threadIdx.x % 64, ph = threadIdx.x / 64;
    const int h = blockIdx.y * HB + c / cph, d = (c % cph) * V;
    const int64_t t0 = max((int64_t)(s_first + s) * seg, q_pos) - q_pos,
                  t1 = min(n, (int64_t)(s_first + s + 1) * seg) - q_pos;
    float mx[V], mn[V];
#pragma unroll
    for (int i = 0; i < V; i++) mx[i] = -INFINITY, mn[i] = INFINITY;
    bool bad = false;
    const T *row = q + (int64_t)h * hs + d;
#pragma unroll 4
    for (int64_t t = t0 + ph; t < t1; t += P) {
        union { uint4 v; T e[V]; } u;
        u.v = *(const uint4 *)(row + t * ts);
#pragma unroll
        for (int i = 0; i < V; i++) {
            const float x = to_f32(u.e[i]);
            bad |= !isfinite(x);
            mx[i] = fmaxf(mx[i], x);
            mn[i] = fminf(mn[i], x);
        }
    }
    /* phases [half, 2 half) hand their extremes to phases [0, half) (max and min: any order gives
       the same result) */
    for (int half = P / 2; half >= 1; half /= 2) {
        if (ph >= half && ph < 2 * half)
#pragma unroll
            for (int i = 0; i < V; i++)
                smax[((ph - half) * 64 + c) * V + i] = mx[i], smin[((ph - half) * 64 + c) * V + i] = mn[i];
        __syncthreads();
        if (ph < half)
#pragma unroll
            for (int i = 0; i < V; i++) {
                mx[i] = fmaxf(mx[i], smax[(ph * 64 + c) * V + i]);
                mn[i] = fminf(mn[i], smin[(ph * 64 + c) * V + i]);
            }
        __syncthreads();
    }
    if (ph == 0) {
        float *o = qfeat + ((int64_t)h * nseg + s) * 2 * D + d;
#pragma unroll
        for (int i = 0; i < V; i++) o[i] = mx[i], o[D + i] = mn[i];
    }
    if (bad) atomicOr(flag, PF_NAN_Q);
}
/* qfeat_rows_kernel with P phases of rows per CTA (64 P threads), of q's dtype. */
template <int P>
static ei_result qfeat_rows_launch(const ei_tensor *q, int64_t n, int D, int seg, int nrows, int HB, dim3 grid, float *qfeat,
                                   int *flag, int64_t q_pos, int s_first, cudaStream_t st, char *msg) {
    if (q->dtype == EI_BF16)
        qfeat_rows_kernel<__nv_bfloat16, P><<<grid, 64 * P, 0, st>>>((const __nv_bfloat16 *)q->data, q->token_stride,
                                                                     q->head_stride, n, D, seg, nrows, HB, qfeat, flag,
                                                                     q_pos, s_first);
    else if (q->dtype == EI_F16)
        qfeat_rows_kernel<__half, P><<<grid, 64 * P, 0, st>>>((const __half *)q->data, q->token_stride, q->head_stride, n,
                                                              D, seg, nrows, HB, qfeat, flag, q_pos, s_first);
    else
        qfeat_rows_kernel<float, P><<<grid, 64 * P, 0, st>>>((const float *)q->data, q->token_stride, q->head_stride, n, D,
                                                             seg, nrows, HB, qfeat, flag, q_pos, s_first);
    LAUNCH_CHECK("qfeat_rows_kernel");
    return EI_OK;
}
/* The query min/max of nrows segments from s_first (queries from position
   q_pos): qfeat_rows_kernel where the view allows it, else qfeat_kernel. */
static ei_result qfeat_run(const ei_tensor *q, int64_t n, int seg, int nrows, float *qfeat, int *flag, int64_t q_pos,
                           int s_first, cudaStream_t st, char *msg) {
    const int D = q->head_dim, nh = q->n_heads, V = q->dtype == EI_F32 ? 4 : 8, cph = D / V;
    const bool rows = D % V == 0 && cph <= 64 && 64 % cph == 0 && nh % (64 / cph) == 0 &&
                      (uintptr_t)q->data % 16 == 0 && q->token_stride % V == 0 && q->head_stride % V == 0;
    if (!rows) {
        qfeat_kernel<<<dim3((unsigned)nrows, nh), 256, 0, st>>>(q->data, q->dtype, q->token_stride, q->head_stride, n, D,
                                                               seg, nrows, qfeat, flag, q_pos, s_first);
        LAUNCH_CHECK("qfeat_kernel");
        return EI_OK;
    }
    const int HB = 64 / cph;
    const dim3 grid((unsigned)nrows, (unsigned)(nh / HB));
    /* a chunk's few CTAs (llama.cpp's micro-batch: one segment, Gemma 3 270M's 4 heads: 4 CTAs) each
       walk 512 rows: 16 phases of rows per CTA instead of 4 (40 -> ~10 us a call, H100) */
    if (grid.x * grid.y < 128) return qfeat_rows_launch<16>(q, n, D, seg, nrows, HB, grid, qfeat, flag, q_pos, s_first, st, msg);
    return qfeat_rows_launch<4>(q, n, D, seg, nrows, HB, grid, qfeat, flag, q_pos, s_first, st, msg);
}

/* kfeat[(kvh*stride + b)*2 + {max,min}][D] for b_first <= b < nblk; the keys
   of blocks [b_first, nb_all) are scanned for non-finite values (the whole
   prompt: every key, the last segment's too; chunks: the blocks they add).
   The block's loads are unrolled so that they are in flight together: one
   at a time, the kernel was latency-bound (16-byte loads of 8 dimensions
   per thread, with an eighth of the threads, were slower still; times:
   docs/performance.md, H200 dated log, "kernel comments"). */
__global__ void __launch_bounds__(256) kfeat_kernel(const void *k, int dtype, int64_t ts, int64_t hs, int64_t n,
                                                    int D, int bs, int nblk, int64_t nb_all, float *kfeat, int *flag,
                                                    int64_t b_first, int64_t stride) {
    int kvh = blockIdx.y;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (nb_all - b_first) * D) return;
    int64_t b = b_first + idx / D;
    int d = (int)(idx % D);
    int64_t t0 = b * bs, t1 = min(n, t0 + bs);
    float mx = -INFINITY, mn = INFINITY;
    bool bad = false;
#pragma unroll 8
    for (int64_t t = t0; t < t1; t++) {
        float x = load_f32(k, dtype, t * ts + (int64_t)kvh * hs + d);
        bad |= !isfinite(x);
        mx = fmaxf(mx, x);
        mn = fminf(mn, x);
    }
    if (b < nblk) {
        float *o = kfeat + ((int64_t)kvh * stride + b) * 2 * D;
        o[d] = mx;
        o[D + d] = mn;
    }
    if (bad) atomicOr(flag, PF_NAN_K);
}
/* kfeat_kernel over blocks [b_first, nb_all) of every kv head of k. */
static ei_result kfeat_run(const ei_tensor *k, int64_t n, int bs, int nblk, int64_t nb_all, float *kfeat, int *flag,
                           int64_t b_first, int64_t stride, cudaStream_t st, char *msg) {
    const int D = k->head_dim;
    const dim3 grid((unsigned)(((nb_all - b_first) * D + 255) / 256), (unsigned)k->n_heads);
    kfeat_kernel<<<grid, 256, 0, st>>>(k->data, k->dtype, k->token_stride, k->head_stride, n, D, bs, nblk, nb_all, kfeat,
                                       flag, b_first, stride);
    LAUNCH_CHECK("kfeat_kernel");
    return EI_OK;
}

/* ============================================================ >>cuda-scores */
/* raw[(kvh*nseg + s)*nblk + b] = mean over the group's query heads of
   max((qmax.kmax + qmin.kmax)/2, (qmax.kmin + qmin.kmin)/2), for b < s*bps.
   Tile: 32 segments x 64 blocks per CTA, 2 x 4 per thread, dims in chunks of
   32 read from shared memory 4 at a time (float4; rows padded to 36 floats so
   that 8 consecutive rows hit distinct banks): 12 shared loads per 128 FMAs,
   which keeps the kernel FMA-bound (one float per load was load-bound).
   The (head, chunk) steps are software-pipelined: a thread loads the next
   step's 24 floats of q and k features into registers before computing the
   current one, so their latency (L2) hides behind its 1024 FMAs instead of
   stalling the CTA at every chunk (unpipelined, ncu found the FMA pipe
   waiting on those loads: docs/performance.md, H200 dated log, third
   session).
   Per accumulator the FMAs run in dimension order, as on the CPU, so the
   scores are bit-identical to the CPU's. 119 registers (2 CTAs per SM;
   unrolling the dimension loop twice would spill). Grid: x = block tiles x kv heads
   (kv head major), y = segment tiles. Row s of qfeat and raw is segment
   s_first + s (chunks score the segments they touch; kfeat rows nblk apart,
   raw rows raw_stride apart). */
#define SC_ST 32
#define SC_BT 64
#define SC_DC 32
#define SC_PITCH (SC_DC + 4)
#define SC_QN (2 * SC_ST * SC_DC / 256) /* q features a thread stages per step */
#define SC_KN (2 * SC_BT * SC_DC / 256) /* k features */
/* Step it = (head g, dims dc) of the tile's walk: its q and k features into
   registers. Thread t stages dimension dc + t % 32 of rows t / 32 + 8 j:
   q element j is (max/min m = j / 4, segment row 8 (j % 4) + t / 32), k
   element j (m = j / 8, block row 8 (j % 8) + t / 32); the addresses are
   affine in j, so nothing per element stays in a register. */
__device__ __forceinline__ void score_stage(const float *qfeat, const float *kfeat, int nseg, int nblk, int D, int G,
                                            int kvh, int s0, int b0, int nchunk, int it, float *qv, float *kv) {
    const int g = it / nchunk, dc = (it % nchunk) * SC_DC, lane = (int)threadIdx.x & 31, row = (int)threadIdx.x >> 5;
    const bool dok = dc + lane < D;
    const float *qb = qfeat + ((int64_t)(kvh * G + g) * nseg + s0 + row) * 2 * D + dc + lane;
    const float *kb = kfeat + ((int64_t)kvh * nblk + b0 + row) * 2 * D + dc + lane;
#pragma unroll
    for (int j = 0; j < SC_QN; j++) {
        const int m = j / 4, r = 8 * (j % 4);
        qv[j] = dok && s0 + row + r < nseg ? qb[(int64_t)(2 * r + m) * D] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < SC_KN; j++) {
        const int m = j / 8, r = 8 * (j % 8);
        kv[j] = dok && b0 + row + r < nblk ? kb[(int64_t)(2 * r + m) * D] : 0.f;
    }
}
__global__ void __launch_bounds__(256, 2) score_kernel(const float *qfeat, const float *kfeat, float *raw, int nseg,
                                                    int nblk, int D, int G, int bps, int blk_tiles, int s_first,
                                                    int64_t raw_stride) {
    __shared__ __align__(16) float qs[2][SC_ST][SC_PITCH];
    __shared__ __align__(16) float ks[2][SC_BT][SC_PITCH];
    int kvh = blockIdx.x / blk_tiles, s0 = blockIdx.y * SC_ST, b0 = (blockIdx.x % blk_tiles) * SC_BT;
    int smax = s_first + min(s0 + SC_ST, nseg) - 1;
    if ((int64_t)b0 >= (int64_t)smax * bps) return; /* all masked */
    int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    int nchunk = (D + SC_DC - 1) / SC_DC, steps = G * nchunk;
    float res[2][4], acc[2][4][4], qv[SC_QN], kv[SC_KN];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int c = 0; c < 4; c++) res[a][c] = 0.f;
    score_stage(qfeat, kfeat, nseg, nblk, D, G, kvh, s0, b0, nchunk, 0, qv, kv);
    for (int it = 0; it < steps; it++) {
        if (it % nchunk == 0) { /* a new head of the group */
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int c = 0; c < 4; c++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[a][c][e] = 0.f;
        }
        __syncthreads(); /* the previous step's reads of qs/ks are done */
#pragma unroll
        for (int j = 0; j < SC_QN; j++) qs[j / 4][8 * (j % 4) + (tid >> 5)][tid & 31] = qv[j];
#pragma unroll
        for (int j = 0; j < SC_KN; j++) ks[j / 8][8 * (j % 8) + (tid >> 5)][tid & 31] = kv[j];
        __syncthreads();
        if (it + 1 < steps) score_stage(qfeat, kfeat, nseg, nblk, D, G, kvh, s0, b0, nchunk, it + 1, qv, kv);
#pragma unroll 1
        for (int dd = 0; dd < SC_DC; dd += 4) {
            float4 qa[2], qi[2], ka[4], ki[4];
#pragma unroll
            for (int a = 0; a < 2; a++) {
                qa[a] = *(const float4 *)&qs[0][ty * 2 + a][dd];
                qi[a] = *(const float4 *)&qs[1][ty * 2 + a][dd];
            }
#pragma unroll
            for (int c = 0; c < 4; c++) {
                ka[c] = *(const float4 *)&ks[0][tx + 16 * c][dd];
                ki[c] = *(const float4 *)&ks[1][tx + 16 * c][dd];
            }
            /* the same per-dimension FMA order as one float at a time */
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    float *r = acc[a][c];
                    r[0] = fmaf(qa[a].x, ka[c].x, r[0]); r[1] = fmaf(qi[a].x, ka[c].x, r[1]);
                    r[2] = fmaf(qa[a].x, ki[c].x, r[2]); r[3] = fmaf(qi[a].x, ki[c].x, r[3]);
                    r[0] = fmaf(qa[a].y, ka[c].y, r[0]); r[1] = fmaf(qi[a].y, ka[c].y, r[1]);
                    r[2] = fmaf(qa[a].y, ki[c].y, r[2]); r[3] = fmaf(qi[a].y, ki[c].y, r[3]);
                    r[0] = fmaf(qa[a].z, ka[c].z, r[0]); r[1] = fmaf(qi[a].z, ka[c].z, r[1]);
                    r[2] = fmaf(qa[a].z, ki[c].z, r[2]); r[3] = fmaf(qi[a].z, ki[c].z, r[3]);
                    r[0] = fmaf(qa[a].w, ka[c].w, r[0]); r[1] = fmaf(qi[a].w, ka[c].w, r[1]);
                    r[2] = fmaf(qa[a].w, ki[c].w, r[2]); r[3] = fmaf(qi[a].w, ki[c].w, r[3]);
                }
        }
        if (it % nchunk == nchunk - 1) { /* the head's last chunk: its scores into the group mean */
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    res[a][c] += fmaxf((acc[a][c][0] + acc[a][c][1]) * 0.5f, (acc[a][c][2] + acc[a][c][3]) * 0.5f);
        }
    }
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int s = s0 + ty * 2 + a, b = b0 + tx + 16 * c;
            if (s < nseg && b < nblk && (int64_t)b < (int64_t)(s_first + s) * bps)
                raw[((int64_t)kvh * nseg + s) * raw_stride + b] = res[a][c] / (float)G;
        }
}

/* The same scores on a larger register tile (the default where head_dim is a
   multiple of 4 and the features 16-byte aligned; EI_CUDA_SCORE_KERNEL=pairs
   selects score_kernel above, which tests compare with it). A thread holds 8
   rows (HP query heads of the group x SP = 4 / HP segments x {max, min} of
   q) against 8 columns (4 blocks x {max, min} of k): 64 accumulators, every
   product of a kv group's heads formed in one pass over the dimensions, so k
   is staged once per group of HP heads instead of once per head. In a warp
   the 4 row lanes share each k float4 and the 8 column lanes each q float4:
   12 shared-memory wavefronts per 64 FMA cycles (score_kernel: 17 per 32).
   Stages of 32 dimensions, k [2][128 blocks] and q [HP][2][8 SP segments]
   rows padded to 36 floats, are double-buffered with cp.async (zero fill
   past the rows and dimensions; the copies' addresses are affine in the
   copy: unrolled once, the kernel went from 248 to 155 registers). One CTA of 8 warps
   per SM, the dimension loop unrolled 4 times: two CTAs per SM (128
   registers, q rows in two halves) and 64-dimension stages were not faster
   (times and ncu: docs/performance.md, H200 dated log, fifth session).
   HP = 4 when 4 divides G, else 2 when 2 does, else 1; G / HP passes, the
   group mean summed in head order. Each accumulator's FMAs run in dimension
   order from 0, as on the CPU: the scores are bit-identical to the CPU's and
   to score_kernel's. Grid: x = block tiles x kv heads (kv head major),
   y = segment tiles; row s of qfeat and raw is segment s_first + s. */
#define SG_BT 128 /* blocks per CTA */
#define SG_DC 32  /* dimensions per stage */
/* floats of a stage of DC dimensions: k [2][SG_BT], q [HP][2][8 SP] rows (HP * SP = 4), padded by 4 */
template <int DC> struct ScoreStage {
    static constexpr int pitch = DC + 4, kfloats = 2 * SG_BT * pitch, qfloats = 8 * 8 * pitch,
                         bytes = 2 * (kfloats + qfloats) * (int)sizeof(float);
};
/* Step it = (pass, dims dc) into stage buffers kbuf / qbuf. */
template <int HP, int DC>
__device__ __forceinline__ void score_group_stage(const float *qfeat, const float *kfeat, int nseg, int nblk, int D,
                                                  int G, int kvh, int s0, int b0, int nchunk, int it, float *kbuf,
                                                  float *qbuf) {
    constexpr int SP = 4 / HP, ST = 8 * SP, F4 = DC / 4, PITCH = ScoreStage<DC>::pitch;
    const int pass = it / nchunk, dc = (it % nchunk) * DC, tid = (int)threadIdx.x;
    { /* k: rows (block, m); thread tid copies float4 f4 of blocks blk0 + BI * i (affine in i, so that
         nothing per copy stays in a register) */
        constexpr int BI = 256 / F4 / 2;
        const int f4 = tid % F4, m = (tid / F4) & 1, blk0 = tid / F4 / 2;
        const bool dok = dc + 4 * f4 < D;
        const float *src = kfeat + ((int64_t)(kvh * (int64_t)nblk + b0 + blk0) * 2 + m) * D + dc + 4 * f4;
        float *dst = kbuf + (m * SG_BT + blk0) * PITCH + 4 * f4;
#pragma unroll
        for (int i = 0; i < 2 * SG_BT * F4 / 256; i++) {
            const bool ok = dok && b0 + blk0 + BI * i < nblk;
            cp_async16_zfill(dst + BI * i * PITCH, ok ? src + (int64_t)BI * i * 2 * D : kfeat, ok);
        }
    }
#pragma unroll
    for (int i = 0; i < HP * 2 * ST * F4 / 256; i++) { /* q: rows (head, segment, m) */
        const int idx = tid + 256 * i, f4 = idx % F4, row = idx / F4, m = row & 1, sl = (row >> 1) % ST,
                  gl = (row >> 1) / ST;
        const bool ok = s0 + sl < nseg && dc + 4 * f4 < D;
        const float *src =
            ok ? qfeat + (((int64_t)(kvh * G + pass * HP + gl) * nseg + s0 + sl) * 2 + m) * D + dc + 4 * f4 : qfeat;
        cp_async16_zfill(qbuf + ((gl * 2 + m) * ST + sl) * PITCH + 4 * f4, src, ok);
    }
}
template <int HP>
__global__ void __launch_bounds__(256, 1) score_group_kernel(const float *qfeat, const float *kfeat, float *raw,
                                                             int nseg, int nblk, int D, int G, int bps, int blk_tiles,
                                                             int s_first, int64_t raw_stride) {
    constexpr int DC = SG_DC, SP = 4 / HP, ST = 8 * SP, PITCH = ScoreStage<DC>::pitch, KF = ScoreStage<DC>::kfloats,
                  QF = ScoreStage<DC>::qfloats;
    extern __shared__ __align__(16) float sg_smem[];
    const int kvh = blockIdx.x / blk_tiles, s0 = blockIdx.y * ST, b0 = (blockIdx.x % blk_tiles) * SG_BT;
    const int smax = s_first + min(s0 + ST, nseg) - 1;
    if ((int64_t)b0 >= (int64_t)smax * bps) return; /* all masked */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rg = (warp >> 2) * 4 + (lane >> 3); /* row group: segments s0 + sp * 8 + rg */
    const int cg = (warp & 3) * 8 + (lane & 7);   /* column group: blocks b0 + cg + 32 j */
    const int nchunk = (D + DC - 1) / DC, steps = (G / HP) * nchunk;
    float acc[8][8], res[SP][4];
#pragma unroll
    for (int a = 0; a < SP; a++)
#pragma unroll
        for (int j = 0; j < 4; j++) res[a][j] = 0.f;
#pragma unroll
    for (int r = 0; r < 8; r++)
#pragma unroll
        for (int c = 0; c < 8; c++) acc[r][c] = 0.f;
    score_group_stage<HP, DC>(qfeat, kfeat, nseg, nblk, D, G, kvh, s0, b0, nchunk, 0, sg_smem, sg_smem + KF);
    cp_async_commit();
    for (int it = 0; it < steps; it++) {
        float *kb = sg_smem + (it & 1) * (KF + QF), *qb = kb + KF;
        if (it + 1 < steps) {
            float *nk = sg_smem + ((it + 1) & 1) * (KF + QF);
            score_group_stage<HP, DC>(qfeat, kfeat, nseg, nblk, D, G, kvh, s0, b0, nchunk, it + 1, nk, nk + KF);
            cp_async_commit();
            cp_async_wait_one();
        } else {
            cp_async_wait_all();
        }
        __syncthreads();
#pragma unroll 4
        for (int dd = 0; dd < DC; dd += 4) {
            float4 qv[8];
#pragma unroll
            for (int r = 0; r < 8; r++) { /* row r: pair r / 2 = (segment sp, head gl), m = r % 2 */
                const int sp = (r >> 1) / HP, gl = (r >> 1) % HP, m = r & 1;
                qv[r] = *(const float4 *)&qb[((gl * 2 + m) * ST + sp * 8 + rg) * PITCH + dd];
            }
#pragma unroll
            for (int c = 0; c < 8; c++) { /* column c: block cg + 32 (c / 2), m = c % 2 */
                const float4 kv = *(const float4 *)&kb[((c & 1) * SG_BT + cg + 32 * (c >> 1)) * PITCH + dd];
#pragma unroll
                for (int r = 0; r < 8; r++) acc[r][c] = fmaf(qv[r].x, kv.x, acc[r][c]);
#pragma unroll
                for (int r = 0; r < 8; r++) acc[r][c] = fmaf(qv[r].y, kv.y, acc[r][c]);
#pragma unroll
                for (int r = 0; r < 8; r++) acc[r][c] = fmaf(qv[r].z, kv.z, acc[r][c]);
#pragma unroll
                for (int r = 0; r < 8; r++) acc[r][c] = fmaf(qv[r].w, kv.w, acc[r][c]);
            }
        }
        if (it % nchunk == nchunk - 1) { /* a pass's last stage: its heads' scores into the group mean, in order */
#pragma unroll
            for (int sp = 0; sp < SP; sp++)
#pragma unroll
                for (int gl = 0; gl < HP; gl++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const int r = (sp * HP + gl) * 2;
                        res[sp][j] += fmaxf((acc[r][2 * j] + acc[r + 1][2 * j]) * 0.5f,
                                            (acc[r][2 * j + 1] + acc[r + 1][2 * j + 1]) * 0.5f);
                    }
#pragma unroll
            for (int r = 0; r < 8; r++)
#pragma unroll
                for (int c = 0; c < 8; c++) acc[r][c] = 0.f;
        }
        __syncthreads(); /* the next step's stage overwrites this buffer */
    }
#pragma unroll
    for (int sp = 0; sp < SP; sp++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int s = s0 + sp * 8 + rg, b = b0 + cg + 32 * j;
            if (s < nseg && b < nblk && (int64_t)b < (int64_t)(s_first + s) * bps)
                raw[((int64_t)kvh * nseg + s) * raw_stride + b] = res[sp][j] / (float)G;
        }
}
/* Which score kernel a call runs and its grid: score_group_kernel where it
   applies (head_dim a multiple of 4, features 16-byte aligned, the shared
   memory of two stages), else score_kernel; pairs (the knob
   EI_CUDA_SCORE_KERNEL=pairs, >>cuda-tuning) forces score_kernel (tests
   run both). nrows segments x nblk blocks (the
   kfeat row stride), every kv head. */
struct ScoreLaunch {
    int hp; /* score_group_kernel's heads per pass, 0: score_kernel */
    int64_t blk_tiles, seg_tiles;
};
static ei_result score_grid(const float *qfeat, const float *kfeat, int64_t nrows, int64_t nblk, int nkv, int D, int G,
                            bool pairs, ScoreLaunch *sl, char *msg) {
    int smem_max = 0;
    ei_result r = smem_limit(&smem_max, msg);
    if (r) return r;
    bool group = !pairs && D % 4 == 0 && (uintptr_t)qfeat % 16 == 0 &&
                 (uintptr_t)kfeat % 16 == 0 && smem_max >= ScoreStage<SG_DC>::bytes;
    sl->hp = group ? (G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1) : 0;
    const int64_t bt = group ? SG_BT : SC_BT, st = group ? 8 * (4 / sl->hp) : SC_ST;
    sl->blk_tiles = (nblk + bt - 1) / bt;
    sl->seg_tiles = (nrows + st - 1) / st;
    return grid_fits("profile (block scores)", sl->blk_tiles * nkv, sl->seg_tiles, 1, msg);
}
static ei_result score_run(const ScoreLaunch &sl, const float *qfeat, const float *kfeat, float *raw, int nrows, int nblk,
                           int nkv, int D, int G, int bps, int s_first, int64_t raw_stride, cudaStream_t st, char *msg) {
    const dim3 grid((unsigned)(sl.blk_tiles * nkv), (unsigned)sl.seg_tiles);
    const int bt = (int)sl.blk_tiles;
#define EI__SG(HP)                                                                                                  \
    do {                                                                                                            \
        CUDA_TRY(cudaFuncSetAttribute(score_group_kernel<HP>, cudaFuncAttributeMaxDynamicSharedMemorySize,          \
                                      ScoreStage<SG_DC>::bytes));                                                   \
        score_group_kernel<HP><<<grid, 256, ScoreStage<SG_DC>::bytes, st>>>(qfeat, kfeat, raw, nrows, nblk, D, G,   \
                                                                            bps, bt, s_first, raw_stride);          \
    } while (0)
    if (sl.hp == 4) EI__SG(4);
    else if (sl.hp == 2) EI__SG(2);
    else if (sl.hp == 1) EI__SG(1);
    else score_kernel<<<grid, 256, 0, st>>>(qfeat, kfeat, raw, nrows, nblk, D, G, bps, bt, s_first, raw_stride);
#undef EI__SG
    LAUNCH_CHECK("score_kernel");
    return EI_OK;
}

/* ============================================================ >>cuda-softmax */
/* entropy[kvh*seg_cap + s] and the optional softmaxed scores rows (blk_cap
   apart), computed as the CPU's ei__softmax_entropy / ei__uniform_entropy:
   f32 exponentials and probabilities, sums in double; segment 0 (no visible
   block) is the uniform row. A non-finite raw score (float32 overflow of the
   block scores) sets PF_OVERFLOW, as the CPU refuses it. */
/* The uniform row over nb blocks (ei__uniform_entropy): srow[0..nb) = 1/nb. */
__device__ void uniform_row(int64_t nb, float *srow, float *entropy) {
    if (nb <= 0) {
        if (threadIdx.x == 0) *entropy = 0.f;
        return;
    }
    float p = 1.0f / (float)nb;
    if (srow)
        for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) srow[b] = p;
    if (threadIdx.x == 0) *entropy = (float)(-(double)nb * (double)p * (double)logf(p + 1e-9f));
}
/* Softmax of row[0..valid) (valid >= 1) and its entropy; srow[0..nout)
   gets the probabilities, 0 past valid. */
__device__ void softmax_entropy_row(const float *row, int valid, int64_t nout, float *entropy, float *srow, int *flag) {
    __shared__ float red[32];
    __shared__ double redd[32];
    float m = -FLT_MAX;
    int bad = 0;
#pragma unroll 4 /* the row's loads in flight together */
    for (int b = threadIdx.x; b < valid; b += blockDim.x) {
        float x = row[b];
        bad |= !isfinite(x);
        m = fmaxf(m, x);
    }
    if (__syncthreads_or(bad)) {
        if (threadIdx.x == 0) atomicOr(flag, PF_OVERFLOW);
        return;
    }
    m = block_max(m, red);
    double z = 0.0;
#pragma unroll 4
    for (int b = threadIdx.x; b < valid; b += blockDim.x) z += (double)expf(row[b] - m);
    float zf = (float)block_sum_d(z, redd);
    double h = 0.0;
#pragma unroll 4
    for (int64_t b = threadIdx.x; b < nout; b += blockDim.x) {
        float p = b < valid ? expf(row[b] - m) / zf : 0.f;
        if (b < valid) h += (double)p * (double)logf(p + 1e-9f);
        if (srow) srow[b] = p;
    }
    h = block_sum_d(h, redd);
    if (threadIdx.x == 0) *entropy = (float)(-h);
}
__global__ void __launch_bounds__(256) softmax_entropy_kernel(const float *raw, int nseg, int nblk, int bps,
                                                              float *entropy, int seg_cap, float *scores,
                                                              int blk_cap, int *flag) {
    int s = blockIdx.x, kvh = blockIdx.y;
    const float *row = raw + ((int64_t)kvh * nseg + s) * nblk;
    float *srow = scores ? scores + ((int64_t)kvh * seg_cap + s) * blk_cap : NULL;
    float *ent = entropy + (int64_t)kvh * seg_cap + s;
    int valid = (int)min((int64_t)s * bps, (int64_t)nblk);
    if (valid == 0) /* segment 0, or one segment (nblk 0: no scores row, as on the CPU) */
        uniform_row(nblk, srow, ent);
    else
        softmax_entropy_row(row, valid, nblk, ent, srow, flag);
}
/* Chunked planning (the CPU's ei__chunk_plan_segment): segment s_first + i
   from raw row i (raw_stride apart, nrows per kv head) over its s * bps
   visible blocks, the scores row cleared past them; segment 0 sees none:
   entropy 0 and a zero row until a final call sets its uniform row
   (chunk_final_kernel). mass_held (EI_RANK_SAMPLED, the open segment planned
   again from its stored row, NULL else): a kv head whose open segment holds
   sampled rows stored their mass, not the raw scores; its entropy and
   scores row stay as planned (the same values). */
__global__ void __launch_bounds__(256) chunk_softmax_kernel(const float *raw, int nrows, int64_t raw_stride, int s_first,
                                                            int bps, float *entropy, int seg_cap, float *scores,
                                                            int blk_cap, int *flag, const ei__head_state *mass_held) {
    int s = s_first + (int)blockIdx.x, kvh = blockIdx.y;
    if (mass_held && mass_held[kvh].open_rows > 0) return;
    float *srow = scores ? scores + ((int64_t)kvh * seg_cap + s) * blk_cap : NULL;
    float *ent = entropy + (int64_t)kvh * seg_cap + s;
    if (s == 0) {
        if (srow)
            for (int b = threadIdx.x; b < blk_cap; b += blockDim.x) srow[b] = 0.f;
        if (threadIdx.x == 0) *ent = 0.f;
        return;
    }
    softmax_entropy_row(raw + ((int64_t)kvh * nrows + blockIdx.x) * raw_stride, s * bps, blk_cap, ent, srow, flag);
}
/* A final chunk: segment 0's uniform row over the nb blocks scored. */
__global__ void chunk_final_kernel(int64_t nb, float *entropy, int seg_cap, float *scores, int blk_cap) {
    int kvh = blockIdx.x;
    uniform_row(nb, scores ? scores + (int64_t)kvh * seg_cap * blk_cap : NULL, entropy + (int64_t)kvh * seg_cap);
}

/* ============================================================ >>cuda-budgets */
/* One CTA: a thread per kv head runs the header's rules (ei__head_rigid,
   ei__budget_next, ei__keep_count with ei__cap_blocks and the always-kept
   blocks of ei__forced_blocks) exactly as the CPU's profile does; then
   keep_count per segment: each head's own count, or with per_segment_budget
   the max over heads (the CPU's ei_plan_finalize). With top_p the counts
   follow the ranking: rank_kernel writes them (and seg_max_kernel takes the
   max), this kernel only the budgets. */
/* keep_count of segments [s0, s1) from keep_blocks: each head's own, or with
   per_segment_budget the max over heads (the CPU's ei_plan_finalize). */
__device__ void segment_counts(const ei_config *c, int nkv, int s0, int s1, int seg_cap, const int *keep_blocks,
                               int *keep_count) {
    for (int s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
        int mx = 0;
        if (c->per_segment_budget)
            for (int h = 0; h < nkv; h++) mx = max(mx, keep_blocks[(int64_t)h * seg_cap + s]);
        for (int h = 0; h < nkv; h++)
            keep_count[(int64_t)h * seg_cap + s] = c->per_segment_budget ? mx : keep_blocks[(int64_t)h * seg_cap + s];
    }
}
/* Only the additions of the recurrence run in series. The class test
   (ei__head_rigid), every segment's step (ei__budget_step: the entropy's
   relative change, a double division) and the keep counts run on all
   threads over (head, segment) pairs of a tile of segments staged in shared
   memory; a thread per head then adds the steps (ei__budget_add), which
   is all that runs in series (the whole recurrence on one thread per head
   was slower: docs/performance.md, H200 dated log, fifth session). */
#define BUDGET_TILE 1024
__global__ void budget_kernel(const ei_config cfg, int nkv, int nseg, int seg_cap, int64_t n, int64_t nblk,
                              int max_keep, const float *entropy, uint8_t *head_class, float *budget,
                              int *keep_blocks, int *keep_count) {
    __shared__ float Hs[BUDGET_TILE];
    __shared__ double Bs[BUDGET_TILE]; /* a tile's steps, then its budgets */
    const ei_config *c = &cfg;
    const int64_t bps = c->segment_size / c->block_size;
    const bool counts = !(c->top_p > 0.0);
    for (int h = threadIdx.x; h < nkv; h += blockDim.x) head_class[h] = (uint8_t)EI_HEAD_RIGID;
    __syncthreads();
    for (int64_t e = threadIdx.x; e < (int64_t)nkv * nseg; e += blockDim.x) { /* ei__head_rigid, every pair */
        const int h = (int)(e / nseg), s = (int)(e % nseg);
        if (s > 0 && !ei__entropy_rigid(c, entropy[(int64_t)h * seg_cap + s])) head_class[h] = (uint8_t)EI_HEAD_DYNAMIC;
    }
    __syncthreads();
    for (int hb = 0; hb < nkv; hb += blockDim.x) {
        const int hn = min(nkv - hb, (int)blockDim.x), h = hb + (int)threadIdx.x, ts = max(1, BUDGET_TILE / hn);
        const bool rigid = h < nkv && head_class[h] == EI_HEAD_RIGID;
        double B = 0.0;
        for (int s0 = 0; s0 < nseg; s0 += ts) {
            const int w = min(nseg - s0, ts);
            __syncthreads(); /* the last tile's reads are done */
            for (int e = threadIdx.x; e < hn * w; e += blockDim.x) Hs[e] = entropy[(int64_t)(hb + e / w) * seg_cap + s0 + e % w];
            __syncthreads();
            for (int e = threadIdx.x; e < hn * w; e += blockDim.x) { /* the steps */
                const int s = s0 + e % w;
                const float H = Hs[e], H_prev = s == 0 ? 0.0f : e % w ? Hs[e - 1] : entropy[(int64_t)(hb + e / w) * seg_cap + s - 1];
                Bs[e] = s == 0 ? 0.0 : ei__budget_step(c, s, H, H_prev);
            }
            __syncthreads();
            if (h < nkv) /* the additions, as ei__budget_next */
                for (int i = 0; i < w; i++) {
                    const int s = s0 + i;
                    B = rigid || s == 0 ? (double)c->base_budget : ei__budget_add(c, B, Bs[(h - hb) * w + i]);
                    Bs[(h - hb) * w + i] = B;
                }
            __syncthreads();
            for (int e = threadIdx.x; e < hn * w; e += blockDim.x) { /* budgets and counts */
                const int hh = hb + e / w, s = s0 + e % w;
                int64_t cap = ei__cap_blocks(c, s, n, nblk), n_sink, local0;
                int64_t nf = ei__forced_blocks(c, min((int64_t)s * bps, nblk), &n_sink, &local0);
                budget[(int64_t)hh * seg_cap + s] = (float)Bs[e];
                if (counts) keep_blocks[(int64_t)hh * seg_cap + s] = ei__keep_count(c, s, Bs[e], -1, nf, cap, max_keep);
            }
        }
    }
    if (!counts) return;
    __syncthreads();
    segment_counts(c, nkv, 0, nseg, seg_cap, keep_blocks, keep_count);
}

/* The segments a ranking launch covers (grid x: one per row) and where their
   raw block scores are: segment s_first + i reads raw row i of kv head h at
   raw + (h * nrows + i) * stride and sees min(s * bps, nblk) blocks; its cap
   (ei__cap_blocks) is the visible blocks, except segment s_tail (the last one
   of a finished prompt, -1 none), capped by ei__cap_blocks(c, s, n, nblk).
   (The whole prompt: every segment, s_tail its last one; ei__cap_blocks of
   an earlier segment is its visible blocks.) EI_RANK_SAMPLED: a sampled
   segment is ranked by its mass when it holds a sampled row: with rows
   (chunked planning), row i of kv head h holds rows[h * rows_stride + i] of
   them; without, the rows of tokens below n (the whole prompt). */
struct SegRows {
    const float *raw;
    int64_t stride, nblk, n;
    int nrows, s_first, s_tail;
    const int *rows;
    int64_t rows_stride;
};
__device__ __forceinline__ int64_t seg_visible(const SegRows &r, int s, int bps) {
    return min((int64_t)s * bps, r.nblk);
}
__device__ __forceinline__ int64_t seg_cap_blocks(const ei_config *c, const SegRows &r, int s) {
    return s == r.s_tail ? ei__cap_blocks(c, s, r.n, r.nblk) : seg_visible(r, s, c->segment_size / c->block_size);
}

/* Chunked planning's budgets (the CPU's ei__chunk_plan_segment), a thread
   per kv head over the launch's segments in order: the recurrence row of
   each (ei__chunk_recurrence, from the row before it), the head's class
   while it is rigid so far, the budget and, without top_p, the keep counts
   (ei__keep_count within the cap and the always-kept blocks). */
__global__ void chunk_budget_kernel(const ei_config cfg, int nkv, const SegRows r, int seg_cap, int max_keep,
                                    const float *entropy, ei__seg_state *seg_state, uint8_t *head_class, float *budget,
                                    int *keep_blocks, int *keep_count) {
    const ei_config *c = &cfg;
    const int bps = c->segment_size / c->block_size;
    const bool counts = !(c->top_p > 0.0);
    for (int h = threadIdx.x; h < nkv; h += blockDim.x)
        for (int s = r.s_first; s < r.s_first + r.nrows; s++) {
            int64_t row = (int64_t)h * seg_cap + s, n_sink, local0;
            ei__seg_state *cur = seg_state + row;
            ei__chunk_recurrence(c, s, s > 0 ? cur - 1 : NULL, s > 0 ? entropy[row] : 0.f, cur);
            double B = ei__chunk_budget(c, cur);
            head_class[h] = (uint8_t)(cur->rigid_so_far ? EI_HEAD_RIGID : EI_HEAD_DYNAMIC);
            budget[row] = (float)B;
            int64_t nf = ei__forced_blocks(c, seg_visible(r, s, bps), &n_sink, &local0);
            if (counts) keep_blocks[row] = ei__keep_count(c, s, B, -1, nf, s == 0 ? 0 : seg_cap_blocks(c, r, s), max_keep);
        }
    if (!counts) return;
    __syncthreads();
    segment_counts(c, nkv, r.s_first, r.s_first + r.nrows, seg_cap, keep_blocks, keep_count);
}

/* ============================================================ >>cuda-topk */
/* block_index row (kvh, s): the keep_count highest-scoring visible blocks by
   descending raw score, ties to the lower index; -1 up to max_keep.
   Dynamic shared memory: sort_n (power of two >= max_keep) 64-bit keys. The
   budgets never keep more blocks than a row holds or than are visible (the
   header checked the plan's rows against this configuration's budgets);
   PF_KEEP reports the impossible. */
__global__ void __launch_bounds__(256) topk_kernel(const SegRows r, int bps, const int *keep_count, int seg_cap,
                                                   int *block_index, int max_keep, int *flag) {
    extern __shared__ uint64_t keys[];
    __shared__ int hist[256];
    __shared__ int count;
    int s = r.s_first + (int)blockIdx.x, kvh = blockIdx.y;
    int *out = block_index + ((int64_t)kvh * seg_cap + s) * max_keep;
    int len = (int)seg_visible(r, s, bps);
    int k = keep_count[(int64_t)kvh * seg_cap + s];
    if (k > len || k > max_keep || k < 0) {
        if (threadIdx.x == 0) atomicOr(flag, PF_KEEP);
        k = 0;
    }
    if (k == 0) {
        for (int i = threadIdx.x; i < max_keep; i += blockDim.x) out[i] = -1;
        return;
    }
    const float *row = r.raw + ((int64_t)kvh * r.nrows + blockIdx.x) * r.stride;
    uint64_t thr = block_select_kth(row, len, k, hist);
    int n2 = 1;
    while (n2 < k) n2 <<= 1;
    for (int i = threadIdx.x; i < n2; i += blockDim.x) keys[i] = 0;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        uint64_t key = rank_key(row[j], j);
        if (key >= thr) keys[atomicAdd(&count, 1)] = key;
    }
    __syncthreads();
    block_sort_desc(keys, n2);
    for (int i = threadIdx.x; i < max_keep; i += blockDim.x)
        out[i] = i < k ? (int)(0xFFFFFFFFu - (uint32_t)keys[i]) : -1;
}

/* ============================================================ >>cuda-rank */
/* The ranked rows beyond the paper (CONCEPTS: ranking, top_p, sink/local),
   as the CPU's ei__plan_rank_row: the always-kept blocks of
   ei__forced_blocks lead the row (sink ascending, then local ascending),
   then the other visible blocks by descending ranking score, ties to the
   lower index. The score is the sampled mass (EI_RANK_SAMPLED, segments at or
   past threshold_len: ei__rank_sampled) or the reference's raw block score.
   Without top_p the row ranks the keep_count the budgets gave; with top_p it
   ranks min(candidates, max_keep) blocks, walks them (forced first) until
   their weight reaches top_p of the visible blocks' (weights: the mass, or
   the reference's softmax numerators expf(raw - max); sums in double, the
   walk in the CPU's order), and ei__keep_count turns that into the count.
   per_segment_budget rows then hold every block they could keep and
   seg_max_kernel applies the max over heads. Dynamic shared memory: sort_n
   (power of two >= max_keep) 64-bit keys, with top_p as many doubles after
   the ranked ones (their weights). */
__global__ void __launch_bounds__(1024) rank_kernel(const ei_config cfg, const SegRows r, const float *mass,
                                                   int *keep_blocks, int *keep_count, int seg_cap, int *block_index,
                                                   int max_keep, int *flag) {
    extern __shared__ uint64_t keys[];
    __shared__ int hist[256];
    __shared__ int count, s_kout;
    __shared__ float red[32];
    __shared__ double redd[32];
    const ei_config *c = &cfg;
    const bool topp = c->top_p > 0.0;
    int s = r.s_first + (int)blockIdx.x, kvh = blockIdx.y;
    int64_t row = (int64_t)kvh * seg_cap + s;
    int *out = block_index + row * max_keep;
    int nvis = (int)seg_visible(r, s, c->segment_size / c->block_size);
    if (s == 0 || nvis == 0) { /* nothing visible: keeps none */
        if (topp && threadIdx.x == 0) {
            keep_blocks[row] = 0;
            if (!c->per_segment_budget) keep_count[row] = 0;
        }
        for (int i = threadIdx.x; i < max_keep; i += blockDim.x) out[i] = -1;
        return;
    }
    /* a segment without any sampled row (the last one too short, a chunk's open one before its rows) keeps the
       reference ranking (as on the CPU) */
    const bool sampled = mass && ei__rank_sampled(c, s) &&
                         (r.rows ? r.rows[(int64_t)kvh * r.rows_stride + blockIdx.x] > 0 : ei__sample_token(c, s, 0) < r.n);
    const float *sc = (sampled ? mass : r.raw) + ((int64_t)kvh * r.nrows + blockIdx.x) * r.stride;
    int64_t ns64, l064;
    const int nf = (int)ei__forced_blocks(c, nvis, &ns64, &l064), ns = (int)ns64, l0 = (int)l064;
    const int np = nvis - nf; /* candidates: blocks [ns, l0) */
    int k = 0, ranked;
    if (topp)
        ranked = min(np, max_keep);
    else {
        k = keep_count[row];
        if (k > nvis || k > max_keep || k < 0) {
            if (threadIdx.x == 0) atomicOr(flag, PF_KEEP);
            k = 0;
        }
        ranked = k - min(nf, k);
    }
    if (ranked > 0) {
        uint64_t thr = block_select_kth_range(sc, nvis, ranked, ns, l0, hist);
        int n2 = 1;
        while (n2 < ranked) n2 <<= 1;
        for (int i = threadIdx.x; i < n2; i += blockDim.x) keys[i] = 0;
        if (threadIdx.x == 0) count = 0;
        __syncthreads();
        for (int j = ns + threadIdx.x; j < l0; j += blockDim.x) {
            uint64_t key = rank_key(sc[j], j);
            if (key >= thr) keys[atomicAdd(&count, 1)] = key;
        }
        __syncthreads();
        block_sort_desc(keys, n2);
    }
    int kout = k;
    if (topp) {
        float m = -FLT_MAX;
        if (!sampled) {
            for (int b = threadIdx.x; b < nvis; b += blockDim.x) m = fmaxf(m, sc[b]);
            m = block_max(m, red);
        }
#define EI__W(b) (sampled ? (double)sc[b] : (double)expf(sc[b] - m))
        double total = 0.0, *wts = (double *)(keys + max(ranked, 1)); /* the ranked entries' weights */
        for (int b = threadIdx.x; b < nvis; b += blockDim.x) total += EI__W(b);
        for (int i = threadIdx.x; i < ranked; i += blockDim.x) wts[i] = EI__W((int)(0xFFFFFFFFu - (uint32_t)keys[i]));
        total = block_sum_d(total, redd); /* (synchronises: wts is complete) */
        if (threadIdx.x == 0) {
            double target = c->top_p * total, cum = 0.0;
            int64_t k_p = nf, cap = seg_cap_blocks(c, r, s);
            for (int b = 0; b < ns; b++) cum += EI__W(b);
            for (int b = l0; b < nvis; b++) cum += EI__W(b);
            /* the ranked weights in the CPU's order, one at a time until the target; read 8 ahead, so
               that the shared loads overlap the chain of double adds (one thread walks up to max_keep
               entries: a load per add made this walk most of a chunk's rank_kernel) */
            for (int i = 0; cum < target && i < ranked; i += 8) {
                double w8[8];
#pragma unroll
                for (int u = 0; u < 8; u++) w8[u] = i + u < ranked ? wts[i + u] : 0.0;
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (cum < target && i + u < ranked) {
                        cum += w8[u];
                        ++k_p;
                    }
            }
            if (cum < target) ++k_p; /* not reached within the row's capacity */
            if (!(total > 0.0)) k_p = 0;
            int kk = ei__keep_count(c, s, 0.0, k_p, nf, cap, max_keep); /* top_p: the budget is not used */
            keep_blocks[row] = kk;
            if (!c->per_segment_budget) keep_count[row] = kk;
            s_kout = c->per_segment_budget ? (int)min((int64_t)max_keep, cap) : kk;
        }
#undef EI__W
        __syncthreads();
        kout = s_kout;
    }
    for (int i = threadIdx.x; i < max_keep; i += blockDim.x) {
        int b = -1;
        if (i < kout) b = i < nf ? (i < ns ? i : l0 + (i - ns)) : (int)(0xFFFFFFFFu - (uint32_t)keys[i - nf]);
        out[i] = b;
    }
}
/* per_segment_budget with top_p: every head of segment s keeps the max of
   their counts (the CPU's ei_plan_finalize); rows padded with -1 past it. */
__global__ void seg_max_kernel(int nkv, int seg_cap, const int *keep_blocks, int *keep_count, int *block_index,
                               int max_keep, int s_first) {
    __shared__ int kmax;
    int s = s_first + (int)blockIdx.x;
    if (threadIdx.x == 0) {
        int mx = 0;
        for (int h = 0; h < nkv; h++) mx = max(mx, keep_blocks[(int64_t)h * seg_cap + s]);
        kmax = mx;
    }
    __syncthreads();
    for (int h = threadIdx.x; h < nkv; h += blockDim.x) keep_count[(int64_t)h * seg_cap + s] = kmax;
    for (int64_t x = threadIdx.x; x < (int64_t)nkv * max_keep; x += blockDim.x) {
        int h = (int)(x / max_keep), i = (int)(x % max_keep);
        if (i >= kmax) block_index[((int64_t)h * seg_cap + s) * max_keep + i] = -1;
    }
}

/* ============================================================ >>cuda-chunked */
/* Chunked planning (ei_profile_chunk) runs the profile stages above on the
   segments a chunk touches; what the CPU keeps per kv head in the plan's
   state region stays there, in device memory, in the CPU's layout
   (ei__chunk_geometry): the head states (the GPU uses group), the
   recurrence rows, the open segment's query min/max ([64][2][d] per head),
   the key-block min/max store (here in kfeat's layout, rows of the padded
   block count) and, in the open-mass row, the open segment's raw block
   scores (planned again from them when a final call or the next turn
   changes its cap), or with EI_RANK_SAMPLED, once the open segment holds
   sampled rows (the head state's open_rows, as on the CPU), their block
   mass: a chunk's sampled rows (those of its tokens) go through
   launch_sample_mass, a continued segment adds the stored mass
   (chunk_rows_kernel), and the last segment's row is kept
   (chunk_keep_kernel). The protocol's decisions (roll-back, continuation,
   the segments to plan) follow from the plan's host fields:
   api_profile_chunk. */

/* A roll-back forgets segments [s0, s1) of every kv head (ei__chunk_clear_rows):
   plan rows cleared, block lists -1, recurrence rows unknown; the recurrence
   rows of segments [s1, s0 + gridDim.x) (the capacity) too, which only a call
   that failed on the device (its rows past the plan's end) may have set. */
__global__ void chunk_clear_kernel(const ei_plan p, ei__seg_state *seg_state, int s0, int s1) {
    int s = s0 + (int)blockIdx.x, kvh = blockIdx.y;
    int64_t row = (int64_t)kvh * p.seg_capacity + s, blk_cap = p.blk_capacity > 0 ? p.blk_capacity : 1;
    if (threadIdx.x == 0) memset(&seg_state[row], 0, sizeof(ei__seg_state));
    if (s >= s1) return;
    if (threadIdx.x == 0) {
        p.entropy[row] = p.budget[row] = 0.f;
        p.keep_blocks[row] = p.keep_count[row] = 0;
    }
    for (int i = threadIdx.x; i < p.max_keep; i += blockDim.x) p.block_index[row * p.max_keep + i] = -1;
    if (p.scores)
        for (int64_t b = threadIdx.x; b < blk_cap; b += blockDim.x) p.scores[row * blk_cap + b] = 0.f;
}
/* The open segment's query min/max, per kv head (a CTA each): a chunk that
   continues it merges the stored min/max into its first row of qfeat (min/max
   are exact: the whole-prompt representation once all its queries are in);
   the chunk's last row becomes the stored one. A group other than the stored
   one (while a segment is open) is PF_GROUP, as the CPU's check. */
__global__ void chunk_open_kernel(float *qfeat, int nrows, int G, int D, float *open_reps, ei__head_state *heads,
                                  int continues, int check_group, int *flag) {
    int kvh = blockIdx.x;
    if (threadIdx.x == 0) {
        ei__head_state *st = &heads[kvh];
        if (check_group && st->group && st->group != G) atomicOr(flag, PF_GROUP);
        else st->group = G;
    }
    for (int x = threadIdx.x; x < G * 2 * D; x += blockDim.x) {
        int g = x / (2 * D), i = x % (2 * D);
        float *first = qfeat + (int64_t)(kvh * G + g) * nrows * 2 * D + i;
        float *open = open_reps + ((int64_t)kvh * EI_MAX_CHUNK_GROUP + g) * 2 * D + i;
        if (continues) *first = i < D ? fmaxf(*first, *open) : fminf(*first, *open);
        *open = first[(int64_t)(nrows - 1) * 2 * D];
    }
}

/* EI_RANK_SAMPLED (the CPU's open_rows and open-segment mass): the sampled
   rows of each segment the chunk plans (segment sq + i, row i), those of
   its tokens in [q_pos, n) and, for a chunk that continues the open
   segment, the rows stored before; a continued segment's mass (mass_zero
   and the mass kernels wrote the chunk's rows) gets the stored mass added,
   when the open segment held rows. One CTA per kv head. */
__global__ void chunk_rows_kernel(const ei_config cfg, int nrows, int sq, int64_t q_pos, int64_t n, int continues,
                                  const ei__head_state *heads, int *seg_rows, float *mass, int64_t mass_stride,
                                  const float *open_mass, int64_t pad) {
    const ei_config *c = &cfg;
    const int kvh = blockIdx.x, stored = continues ? heads[kvh].open_rows : 0;
    for (int i = threadIdx.x; i < nrows; i += blockDim.x) {
        int s = sq + i, rows = i == 0 ? stored : 0;
        if (ei__rank_sampled(c, s))
            for (int r = 0; r < c->rank_samples; r++) {
                int64_t t = ei__sample_token(c, s, r);
                rows += t >= q_pos && t < n;
            }
        seg_rows[(int64_t)kvh * nrows + i] = rows;
    }
    if (mass && stored > 0 && ei__rank_sampled(c, sq)) {
        float *row = mass + (int64_t)kvh * nrows * mass_stride;
        const float *held = open_mass + (int64_t)kvh * pad;
        for (int64_t b = threadIdx.x, nvis = (int64_t)sq * (c->segment_size / c->block_size); b < nvis; b += blockDim.x)
            row[b] += held[b];
    }
}
/* EI_RANK_SAMPLED: the chunk's last segment becomes the open one: its
   stored row (nblk floats per kv head, pad apart) holds its mass when it is
   sampled and holds a row, else its raw scores (as the reference ranking's
   chunks keep them); the head state counts its rows. */
__global__ void chunk_keep_kernel(const ei_config cfg, int s_last, const float *raw, const float *mass, int nrows,
                                  int64_t stride, int64_t nblk, const int *seg_rows, float *open_row, int64_t pad,
                                  ei__head_state *heads) {
    const int kvh = blockIdx.x, rows = seg_rows[(int64_t)kvh * nrows + nrows - 1];
    const float *src = (ei__rank_sampled(&cfg, s_last) && rows > 0 ? mass : raw) + ((int64_t)kvh * nrows + nrows - 1) * stride;
    for (int64_t b = threadIdx.x; b < nblk; b += blockDim.x) open_row[(int64_t)kvh * pad + b] = src[b];
    if (threadIdx.x == 0) heads[kvh].open_rows = rows;
}

/* ============================================================ plans (host) */
/* The header checked that dst can hold src (same kv heads, segment and block
   size, enough segments, rows and score columns). Rows of dst longer than
   src's are padded with -1 first. */
static ei_result api_plan_copy(const ei_config *cfg, ei_plan *dst, const ei_plan *src, int direction,
                               char *msg) {
    cudaMemcpyKind kind = direction == EI_COPY_DEVICE_TO_HOST   ? cudaMemcpyDeviceToHost
                          : direction == EI_COPY_HOST_TO_DEVICE ? cudaMemcpyHostToDevice
                                                                : cudaMemcpyDeviceToDevice;
    cudaStream_t st = stream_of(cfg);
    int nkv = src->n_kv_heads, nseg = src->n_segments;
    if (nseg > 0) {
        size_t w = (size_t)nseg * 4, dp = (size_t)dst->seg_capacity * 4, sp = (size_t)src->seg_capacity * 4;
        CUDA_TRY(cudaMemcpy2DAsync(dst->entropy, dp, src->entropy, sp, w, nkv, kind, st));
        CUDA_TRY(cudaMemcpy2DAsync(dst->budget, dp, src->budget, sp, w, nkv, kind, st));
        CUDA_TRY(cudaMemcpy2DAsync(dst->keep_blocks, dp, src->keep_blocks, sp, w, nkv, kind, st));
        CUDA_TRY(cudaMemcpy2DAsync(dst->keep_count, dp, src->keep_count, sp, w, nkv, kind, st));
        CUDA_TRY(cudaMemcpyAsync(dst->head_class, src->head_class, (size_t)nkv, kind, st));
        if (dst->max_keep > src->max_keep) {
            size_t all = (size_t)nkv * (size_t)dst->seg_capacity * (size_t)dst->max_keep * 4;
            if (direction == EI_COPY_DEVICE_TO_HOST) {
                CUDA_TRY(cudaStreamSynchronize(st)); /* nothing queued writes dst: plain memset */
                memset(dst->block_index, 0xFF, all);
            } else
                CUDA_TRY(cudaMemsetAsync(dst->block_index, 0xFF, all, st));
        }
        if (src->max_keep > 0)
            for (int h = 0; h < nkv; h++) /* rows of max_keep ints, nseg rows per head */
                CUDA_TRY(cudaMemcpy2DAsync(dst->block_index + (size_t)h * dst->seg_capacity * dst->max_keep,
                                           (size_t)dst->max_keep * 4,
                                           src->block_index + (size_t)h * src->seg_capacity * src->max_keep,
                                           (size_t)src->max_keep * 4, (size_t)src->max_keep * 4, nseg, kind, st));
        if (src->scores && dst->scores && src->n_blocks > 0)
            for (int h = 0; h < nkv; h++)
                CUDA_TRY(cudaMemcpy2DAsync(dst->scores + (size_t)h * dst->seg_capacity * (dst->blk_capacity > 0 ? dst->blk_capacity : 1),
                                           (size_t)(dst->blk_capacity > 0 ? dst->blk_capacity : 1) * 4,
                                           src->scores + (size_t)h * src->seg_capacity * (src->blk_capacity > 0 ? src->blk_capacity : 1),
                                           (size_t)(src->blk_capacity > 0 ? src->blk_capacity : 1) * 4,
                                           (size_t)src->n_blocks * 4, nseg, kind, st));
    }
    CUDA_TRY(cudaStreamSynchronize(st));
    dst->n_tokens = src->n_tokens;
    dst->n_segments = src->n_segments;
    dst->n_blocks = src->n_blocks;
    dst->final = src->final;
    return EI_OK;
}

/* ============================================================ profile (host) */
struct ProfileWs {
    size_t qfeat, kfeat, raw, mass, stats, rows, spread, k8s, k8, flag, total;
};
/* EI_RANK_PRECISION_INT8 on the GPU (CONCEPTS: ranking): each key is rounded
   once per call (rank_keys_i8_kernel) into the workspace, its scale, then
   its int8 values held exactly in a 16-bit or f32 row, so that the sampled
   ranking's kernels, unchanged in their arithmetic, form the exact int32
   dot: every product of two int8 values and every partial sum of up to 1024
   of them is an integer below 2^24, exact in f32 whatever the order (the
   tensor cores' f32 accumulation included). The tensor-core kernel takes
   head_dim up to 256, its rows padded with zeros to 64 / 128 / 256 (a zero
   adds nothing to an integer sum), in bf16 (any dtype of q and k: the
   rounding reads them as f32); larger head_dim or EI_CUDA_SAMPLED_GENERIC:
   the f32 kernel over f32 rows of head_dim. */
static bool rank_int8(const ei_config *cfg) {
    return cfg->ranking == EI_RANK_SAMPLED && cfg->rank_precision == EI_RANK_PRECISION_INT8;
}
static bool i8_mma(int D, const CudaTuning &tn) { return D <= 256 && !tn.sampled_generic; }
static int i8_width(int D, const CudaTuning &tn) { return !i8_mma(D, tn) ? D : D <= 64 ? 64 : D <= 128 ? 128 : 256; }
/* Bytes of the rounded keys of n tokens: nkv x n scales, and the rows (false on overflow). */
static bool i8_key_bytes(int64_t n, int32_t nkv, int D, const CudaTuning &tn, size_t *scales, size_t *rows) {
    size_t keys;
    if (!mul_ok((size_t)nkv, (size_t)n, &keys) || !mul_ok(keys, (size_t)i8_width(D, tn) * (i8_mma(D, tn) ? 2u : 4u), rows) ||
        keys > SIZE_MAX / 8 || *rows > SIZE_MAX / 4)
        return false;
    *scales = align256(keys * 4);
    *rows = align256(*rows);
    return true;
}
/* The plan's rows need the ranking stage beyond the paper (rank_kernel):
   sampled mass, top_p counts or always-kept blocks; else topk_kernel as in
   the reference (bit-identical plans for the default configuration). */
static bool profile_extended(const ei_config *cfg) {
    return cfg->ranking == EI_RANK_SAMPLED || cfg->top_p > 0.0 || cfg->sink_blocks > 0 || cfg->local_blocks > 0;
}
static ei_result launch_sample_mass(const ei_config *cfg, const ei_tensor *q, const ei_tensor *k, int64_t q_lo, int64_t n,
                                    int s_lo, int nseg, int mseg0, int mrows, int nblk, int parts_max, float *mass,
                                    float2 *stats, size_t stats_bytes, int *spread, float *k8s, char *k8, int *flag,
                                    const CudaTuning &tn, cudaStream_t st, char *msg);
static size_t mass_stats_bytes(const ei_config *cfg, int64_t n, int32_t nkv, const CudaTuning &tn);
static int chunk_parts_max(const ei_config *cfg, int64_t s_lo, int64_t nseg, int32_t nkv, int64_t n, const CudaTuning &tn);
static ei_result profile_ws(const ei_config *cfg, int64_t n, int32_t nh, int32_t nkv, int32_t D, const CudaTuning &tn,
                            ProfileWs *w, char *msg) {
    size_t nseg = (size_t)((n + cfg->segment_size - 1) / cfg->segment_size);
    size_t nblk = (nseg - 1) * (size_t)(cfg->segment_size / cfg->block_size);
    size_t blks_pad = (std::max(nblk, (size_t)1) + 15) / 16 * 16; /* chunked planning's key min/max [kv][2][D][blks_pad] */
    size_t a, b, c;
    if (!mul_ok((size_t)nh * nseg, (size_t)D * 8, &a) || !mul_ok((size_t)nkv * blks_pad, (size_t)D * 8, &b) ||
        !mul_ok((size_t)nkv * nseg, nblk * 4, &c) || a > SIZE_MAX / 4 || b > SIZE_MAX / 4 || c > SIZE_MAX / 4)
        return fail(msg, EI_ERR_OVERFLOW, "profiling workspace for %lld tokens overflows size_t", (long long)n);
    w->qfeat = 0;
    w->kfeat = align256(a);
    w->raw = w->kfeat + align256(b);
    w->mass = w->raw + align256(c); /* EI_RANK_SAMPLED: block mass, laid out as raw, and part statistics */
    w->stats = w->mass + (cfg->ranking == EI_RANK_SAMPLED ? align256(c) : 0);
    /* chunked planning with EI_RANK_SAMPLED: the sampled rows of each segment a chunk plans, [kv][segment] */
    w->rows = w->stats + align256(mass_stats_bytes(cfg, n, nkv, tn));
    w->spread = w->rows + (cfg->ranking == EI_RANK_SAMPLED ? align256((size_t)nkv * nseg * 4) : 0);
    /* EI_RANK_ROWS_SPREAD: the rows spread_pick_kernel picks, [kv][segment][rank_samples] */
    w->k8s = w->spread + (ei__rank_spread(cfg) ? align256((size_t)nkv * nseg * (size_t)cfg->rank_samples * 4) : 0);
    {   /* EI_RANK_PRECISION_INT8: the rounded keys' scales [kv][token], then their rows */
        size_t sc = 0, kb = 0;
        if (rank_int8(cfg) && !i8_key_bytes(n, nkv, D, tn, &sc, &kb))
            return fail(msg, EI_ERR_OVERFLOW, "profiling workspace for %lld tokens overflows size_t", (long long)n);
        w->k8 = w->k8s + sc;
        w->flag = w->k8 + kb;
    }
    w->total = w->flag + 256 + 256; /* the flag, and slack to align the base */
    return EI_OK;
}
static ei_result api_profile_workspace_size(const ei_config *cfg, int64_t n, int32_t nh, int32_t nkv, int32_t D,
                                            size_t *bytes, char *msg) {
    ProfileWs w = {};
    const CudaTuning tn = tuning_read();
    ei_result r = profile_ws(cfg, n, nh, nkv, D, tn, &w, msg);
    if (r) return r;
    *bytes = w.total;
    return EI_OK;
}

/* A profile's flag as the call's code and message (EI_OK for 0). */
static ei_result profile_flag_fail(int flag, int max_keep, char *msg) {
    if (flag & PF_NAN_K) return fail(msg, EI_ERR_NONFINITE, "NaN or Inf in k");
    if (flag & PF_NAN_Q) return fail(msg, EI_ERR_NONFINITE, "NaN or Inf in q");
    if (flag & PF_Q_RANGE)
        return fail(msg, EI_ERR_NONFINITE, "f32 q rounds to Inf in k's 16-bit type (|x| >= 65520 for f16) in a sampled "
                    "row (the GPU's tensor-core sampled ranking rounds q to k's dtype)");
    if (flag & PF_OVERFLOW) return fail(msg, EI_ERR_NONFINITE, "block scores overflow float32");
    if (flag & PF_SAMPLED) return fail(msg, EI_ERR_NONFINITE, "sampled scores overflow float32");
    if (flag & PF_GROUP)
        return fail(msg, EI_ERR_SHAPE, "q's query heads per kv head differ from those the plan's open segment was "
                    "planned with (chunked planning; the plan is then unspecified: roll it back with q_pos 0)");
    if (flag & PF_KEEP)
        return fail(msg, EI_ERR_BACKEND, "internal error: a keep count exceeds its row (%d blocks) or the visible blocks",
                    max_keep);
    return EI_OK;
}

/* Shared memory of the top-k sort: sort_n (a power of two >= max_keep)
   64-bit keys; the ranking beyond the paper with top_p keeps as many doubles. */
static ei_result ranking_smem(const ei_config *cfg, const ei_plan *plan, size_t *sort_bytes, size_t *rank_bytes,
                              char *msg) {
    int sort_n = 1, smem_max = 0;
    ei_result r = smem_limit(&smem_max, msg);
    if (r) return r;
    while (sort_n < plan->max_keep) sort_n <<= 1;
    *sort_bytes = (size_t)sort_n * 8;
    *rank_bytes = cfg->top_p > 0.0 ? 2 * *sort_bytes : *sort_bytes;
    if (plan->max_keep > 0 && *sort_bytes + 2048 > (size_t)smem_max)
        return fail(msg, EI_ERR_UNSUPPORTED,
                    "plan rows of %d blocks need %zu bytes of shared memory for the GPU top-k, the device has %d",
                    (int)plan->max_keep, *sort_bytes, smem_max);
    if (profile_extended(cfg) && *rank_bytes + 2048 > (size_t)smem_max)
        return fail(msg, EI_ERR_UNSUPPORTED,
                    "plan rows of %d blocks need %zu bytes of shared memory for the GPU ranking, the device has %d",
                    (int)plan->max_keep, *rank_bytes, smem_max);
    return EI_OK;
}
/* The ranked rows of the segments r covers, after their keep counts (the
   budget stage): the reference top-k, or the ranking beyond the paper
   (rank_kernel, then per_segment_budget's max with top_p). */
static ei_result launch_ranking(const ei_config *cfg, ei_plan *plan, const SegRows &r, const float *mass, int *flag,
                                cudaStream_t st, char *msg) {
    size_t sort_bytes = 0, rank_bytes = 0;
    int nkv = plan->n_kv_heads, bps = cfg->segment_size / cfg->block_size;
    ei_result e = ranking_smem(cfg, plan, &sort_bytes, &rank_bytes, msg);
    if (e) return e;
    if (profile_extended(cfg)) {
        /* rows of 0 blocks still get their counts (and -1 padding, of nothing) */
        CUDA_TRY(cudaFuncSetAttribute(rank_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)rank_bytes));
        /* a chunk's one or two rows per kv head: 1024 threads each (the selection and the sort of up to
           max_keep blocks run in the CTA: 33-59 us a call with 256, H100, issue 33) */
        const int threads = (int64_t)r.nrows * nkv < 64 ? 1024 : 256;
        rank_kernel<<<dim3(r.nrows, nkv), threads, rank_bytes, st>>>(*cfg, r, mass, plan->keep_blocks, plan->keep_count,
                                                                     plan->seg_capacity, plan->block_index, plan->max_keep,
                                                                     flag);
        LAUNCH_CHECK("rank_kernel");
        if (cfg->top_p > 0.0 && cfg->per_segment_budget) {
            seg_max_kernel<<<r.nrows, 256, 0, st>>>(nkv, plan->seg_capacity, plan->keep_blocks, plan->keep_count,
                                                    plan->block_index, plan->max_keep, r.s_first);
            LAUNCH_CHECK("seg_max_kernel");
        }
    } else if (plan->max_keep > 0) {
        CUDA_TRY(cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sort_bytes));
        topk_kernel<<<dim3(r.nrows, nkv), 256, sort_bytes, st>>>(r, bps, plan->keep_count, plan->seg_capacity,
                                                                 plan->block_index, plan->max_keep, flag);
        LAUNCH_CHECK("topk_kernel");
    }
    return EI_OK;
}
/* The end of a profiling call: its flag to the deferred status, or read back
   as the call's code. */
static ei_result profile_report(const ei_config *cfg, const ei_plan *plan, const int *flag, cudaStream_t st, char *msg) {
    if (deferred(cfg)) return deferred_record(flag, DE_PROFILE, (int)plan->max_keep, st, msg);
    int host_flag = 0;
    CUDA_TRY(cudaMemcpyAsync(&host_flag, flag, sizeof(int), cudaMemcpyDeviceToHost, st));
    CUDA_TRY(cudaStreamSynchronize(st));
    return profile_flag_fail(host_flag, (int)plan->max_keep, msg);
}

static ei_result api_profile(const ei_config *cfg, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                             void *ws, size_t ws_bytes, char *msg) {
    ProfileWs w = {};
    int64_t n = q->n_tokens;
    int nh = q->n_heads, nkv = k->n_heads, D = q->head_dim, G = nh / nkv;
    const CudaTuning tn = tuning_read();
    ei_result r = profile_ws(cfg, n, nh, nkv, D, tn, &w, msg);
    if (r) return r;
    if (!ws) return fail(msg, EI_ERR_NULL, "workspace is NULL (%zu bytes needed)", w.total);
    if (ws_bytes < w.total) return fail(msg, EI_ERR_WORKSPACE, "workspace of %zu bytes, %zu needed", ws_bytes, w.total);
    char *base = ws_base(ws);
    float *qfeat = (float *)(base + w.qfeat), *kfeat = (float *)(base + w.kfeat), *raw = (float *)(base + w.raw);
    float *mass = cfg->ranking == EI_RANK_SAMPLED ? (float *)(base + w.mass) : NULL;
    int *flag = (int *)(base + w.flag);
    int seg = cfg->segment_size, bs = cfg->block_size, bps = seg / bs;
    int nseg = (int)((n + seg - 1) / seg);
    int nblk = (nseg - 1) * bps;
    int64_t nb_all = (n + bs - 1) / bs, kblocks = (nb_all * D + 255) / 256;
    ScoreLaunch sl;
    size_t sort_bytes = 0, rank_bytes = 0;
    if ((r = grid_fits("profile (query segments)", nseg, nh, 1, msg)) ||
        (r = grid_fits("profile (key blocks)", kblocks, nkv, 1, msg)) ||
        (r = score_grid(qfeat, kfeat, nseg, nblk, nkv, D, G, tn.score_pairs, &sl, msg)) ||
        (r = grid_fits("profile (segments)", nseg, nkv, 1, msg)) ||
        (r = ranking_smem(cfg, plan, &sort_bytes, &rank_bytes, msg)))
        return r;
    cudaStream_t st = stream_of(cfg);

    CUDA_TRY(cudaMemsetAsync(flag, 0, sizeof(int), st));
    if ((r = qfeat_run(q, n, seg, nseg, qfeat, flag, 0, 0, st, msg))) return r;
    if ((r = kfeat_run(k, n, bs, nblk, nb_all, kfeat, flag, 0, nblk, st, msg))) return r;
    if (nblk > 0 && (r = score_run(sl, qfeat, kfeat, raw, nseg, nblk, nkv, D, G, bps, 0, nblk, st, msg))) return r;
    softmax_entropy_kernel<<<dim3(nseg, nkv), 256, 0, st>>>(raw, nseg, nblk, bps, plan->entropy, plan->seg_capacity,
                                                            plan->scores, plan->blk_capacity > 0 ? plan->blk_capacity : 1,
                                                            flag);
    LAUNCH_CHECK("softmax_entropy_kernel");
    if (cfg->ranking == EI_RANK_SAMPLED && nblk > 0 &&
        (r = launch_sample_mass(cfg, q, k, 0, n, 0, nseg, 0, nseg, nblk, 16, mass, (float2 *)(base + w.stats),
                                w.rows - w.stats, (int *)(base + w.spread), (float *)(base + w.k8s), base + w.k8, flag, tn, st, msg)) != EI_OK)
        return r;
    budget_kernel<<<1, 256, 0, st>>>(*cfg, nkv, nseg, plan->seg_capacity, n, nblk, plan->max_keep, plan->entropy,
                                     plan->head_class, plan->budget, plan->keep_blocks, plan->keep_count);
    LAUNCH_CHECK("budget_kernel");
    SegRows rows = {raw, nblk, nblk, n, nseg, 0, nseg - 1, NULL, 0};
    if ((r = launch_ranking(cfg, plan, rows, mass, flag, st, msg)) || (r = profile_report(cfg, plan, flag, st, msg)))
        return r;
    plan->n_tokens = n;
    plan->n_segments = nseg;
    plan->n_blocks = nblk;
    plan->final = 1;
    return EI_OK;
}

/* Chunked planning (ABI 7; EI_RANK_SAMPLED since ABI 8): the queries of positions [q_pos, n) (q NULL: a
   final call without queries), every kv head. Where the CPU decides per kv
   head from its state, the plan's host fields decide here (the header checked
   the protocol): T = plan->n_tokens is where every head's chunk ended. */
static ei_result api_profile_chunk(const ei_config *cfg, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                                   int64_t q_pos, int is_final, void *ws, size_t ws_bytes, char *msg) {
    const int nkv = k->n_heads, D = k->head_dim, nh = q ? q->n_heads : nkv, G = nh / nkv;
    const int seg = cfg->segment_size, bs = cfg->block_size, bps = seg / bs;
    const int64_t T = plan->n_tokens, n = q_pos + (q ? q->n_tokens : 0), s_end = (n + seg - 1) / seg;
    const int64_t sq = q_pos / seg, nrows = q ? s_end - sq : 0;
    const int64_t nblk = (s_end - 1) * bps; /* blocks the chunk's last segment sees (the tail cap's count) */
    const int64_t open_seg = T > 0 ? (T - 1) / seg : -1;
    /* ei__chunk_seek: a chunk below the end rolls back (the stored segment is forgotten) */
    const bool rollback = q && q_pos < T, open_valid = T > 0 && !rollback;
    const bool continues = q && open_valid && open_seg == sq;
    /* the open segment, last of a final call, planned again: as an inner one before the next turn's segments,
       or with the final cap by a final call without queries */
    const bool replan = q ? (plan->final && open_valid && open_seg < sq) : true;
    const int64_t blk_cap = plan->blk_capacity > 0 ? plan->blk_capacity : 1, pad = (blk_cap + 15) / 16 * 16;
    /* EI_PLAN_KEEP_KEYS: the plan stores the key blocks' min/max; those stored for sure are the blocks the
       last call's last segment sees, and a roll-back builds them all again (ei__chunk_seek: the cache may
       have changed below the cut); the chunk builds [kb0, nblk). Without the store (smaller plans) it
       builds [0, nblk) in the workspace. Either way it scans its keys (a final one: to n) */
    const bool store = (plan->flags & EI_PLAN_KEEP_KEYS) != 0;
    const int64_t stored = store && T > 0 ? ((T + seg - 1) / seg - 1) * bps : 0;
    const int64_t kb0 = std::min(rollback ? (int64_t)0 : stored, nblk);
    const int64_t scan_end = is_final ? (n + bs - 1) / bs : nblk, kblocks = ((scan_end - kb0) * D + 255) / 256;
    const int64_t raw_stride = nblk > 0 ? nblk : 1;
    ProfileWs w = {};
    ei__chunk_geom cg;
    const CudaTuning tn = tuning_read();
    ei_result r = profile_ws(cfg, plan->max_tokens, nh, nkv, D, tn, &w, msg);
    if (r) return r;
    if (!ws) return fail(msg, EI_ERR_NULL, "workspace is NULL (%zu bytes needed)", w.total);
    if (ws_bytes < w.total)
        return fail(msg, EI_ERR_WORKSPACE, "workspace of %zu bytes, %zu needed (size it with the plan's max_tokens)",
                    ws_bytes, w.total);
    if (q && G > EI_MAX_CHUNK_GROUP)
        return fail(msg, EI_ERR_UNSUPPORTED, "chunked planning keeps up to %d query heads per kv head", EI_MAX_CHUNK_GROUP);
    ei__chunk_geometry(plan->seg_capacity, pad, nkv, D, store, &cg);
    char *base = ws_base(ws), *state = (char *)plan->state;
    float *qfeat = (float *)(base + w.qfeat), *raw = (float *)(base + w.raw);
    int *flag = (int *)(base + w.flag);
    /* EI_RANK_SAMPLED: the chunk's mass rows (laid out as raw) and sampled-row counts */
    const bool sampled = cfg->ranking == EI_RANK_SAMPLED;
    float *mass = sampled ? (float *)(base + w.mass) : NULL;
    int *seg_rows = sampled ? (int *)(base + w.rows) : NULL;
    ei__head_state *heads = (ei__head_state *)state;
    ei__seg_state *rec = (ei__seg_state *)(state + cg.seg_rows);
    float *open_reps = (float *)(state + cg.open_reps), *open_raw = (float *)(state + cg.open_mass);
    float *keys = store ? (float *)(state + cg.key_reps) : (float *)(base + w.kfeat); /* [kv][2][D][pad] */
    ScoreLaunch sl;
    if ((r = grid_fits("chunk (query segments)", nrows, nh, 1, msg)) ||
        (r = grid_fits("chunk (key blocks)", kblocks, nkv, 1, msg)) ||
        (r = score_grid(qfeat, keys, nrows, pad, nkv, D, G, tn.score_pairs, &sl, msg)) ||
        (r = grid_fits("chunk (segments)", std::max(nrows, (int64_t)plan->seg_capacity), nkv, 1, msg)))
        return r;
    const int seg_cap = plan->seg_capacity;
    cudaStream_t st = stream_of(cfg);

    CUDA_TRY(cudaMemsetAsync(flag, 0, sizeof(int), st));
    if (rollback) {
        int64_t c0 = q_pos % seg ? sq + 1 : sq, c1 = std::min((T + seg - 1) / seg, (int64_t)seg_cap);
        if (seg_cap > c0) {
            chunk_clear_kernel<<<dim3((unsigned)(seg_cap - c0), nkv), 256, 0, st>>>(*plan, rec, (int)c0, (int)c1);
            LAUNCH_CHECK("chunk_clear_kernel");
        }
    }
    if (scan_end > kb0 && (r = kfeat_run(k, n, bs, (int)nblk, scan_end, keys, flag, kb0, pad, st, msg))) return r;
    if (q) { /* the segments the chunk touches: features (the open one merged), scores, entropies */
        if ((r = qfeat_run(q, n, seg, (int)nrows, qfeat, flag, q_pos, (int)sq, st, msg))) return r;
        chunk_open_kernel<<<nkv, 256, 0, st>>>(qfeat, (int)nrows, G, D, open_reps, heads, continues, T > 0, flag);
        LAUNCH_CHECK("chunk_open_kernel");
        if (nblk > 0 && (r = score_run(sl, qfeat, keys, raw, (int)nrows, (int)pad, nkv, D, G, bps, (int)sq, raw_stride,
                                       st, msg)))
            return r;
        chunk_softmax_kernel<<<dim3((unsigned)nrows, nkv), 256, 0, st>>>(raw, (int)nrows, raw_stride, (int)sq, bps,
                                                                         plan->entropy, seg_cap, plan->scores,
                                                                         (int)blk_cap, flag, NULL);
        LAUNCH_CHECK("chunk_softmax_kernel");
        if (sampled) { /* the sampled rows of the chunk's tokens, then the stored ones of a continued segment */
            const int parts_max = chunk_parts_max(cfg, sq, s_end, nkv, n, tn); /* key parts at most (mass_geometry) */
            if (nblk > 0 &&
                (r = launch_sample_mass(cfg, q, k, q_pos, n, (int)sq, (int)s_end, (int)sq, (int)nrows, (int)raw_stride,
                                        parts_max, mass, (float2 *)(base + w.stats), w.rows - w.stats,
                                        (int *)(base + w.spread), (float *)(base + w.k8s), base + w.k8, flag, tn, st, msg)))
                return r;
            chunk_rows_kernel<<<nkv, 256, 0, st>>>(*cfg, (int)nrows, (int)sq, q_pos, n, continues, heads, seg_rows,
                                                   nblk > 0 ? mass : NULL, raw_stride, open_raw, pad);
            LAUNCH_CHECK("chunk_rows_kernel");
        }
    }
    if (replan) { /* from its stored row: the same scores, entropy and recurrence, another cap. EI_RANK_SAMPLED:
                     the row holds the segment's mass once a sampled row of it is in (the head state counts them) */
        const bool held = sampled && ei__rank_sampled(cfg, (int)open_seg);
        SegRows o = {open_raw, pad, nblk, n, 1, (int)open_seg, q ? -1 : (int)open_seg,
                     sampled ? &heads->open_rows : NULL, (int64_t)(sizeof(ei__head_state) / sizeof(int32_t))};
        chunk_softmax_kernel<<<dim3(1, nkv), 256, 0, st>>>(open_raw, 1, pad, (int)open_seg, bps, plan->entropy, seg_cap,
                                                           plan->scores, (int)blk_cap, flag, held ? heads : NULL);
        LAUNCH_CHECK("chunk_softmax_kernel");
        chunk_budget_kernel<<<1, 256, 0, st>>>(*cfg, nkv, o, seg_cap, plan->max_keep, plan->entropy, rec,
                                               plan->head_class, plan->budget, plan->keep_blocks, plan->keep_count);
        LAUNCH_CHECK("chunk_budget_kernel");
        if ((r = launch_ranking(cfg, plan, o, held ? open_raw : NULL, flag, st, msg))) return r;
    }
    if (q) { /* budgets and ranked rows in segment order; the last row is the new open segment's */
        SegRows c = {raw, raw_stride, nblk, n, (int)nrows, (int)sq, is_final ? (int)(s_end - 1) : -1, seg_rows, nrows};
        chunk_budget_kernel<<<1, 256, 0, st>>>(*cfg, nkv, c, seg_cap, plan->max_keep, plan->entropy, rec,
                                               plan->head_class, plan->budget, plan->keep_blocks, plan->keep_count);
        LAUNCH_CHECK("chunk_budget_kernel");
        if ((r = launch_ranking(cfg, plan, c, mass, flag, st, msg))) return r;
        if (sampled) {
            chunk_keep_kernel<<<nkv, 256, 0, st>>>(*cfg, (int)(s_end - 1), raw, mass, (int)nrows, raw_stride, nblk,
                                                   seg_rows, open_raw, pad, heads);
            LAUNCH_CHECK("chunk_keep_kernel");
        } else if (nblk > 0)
            CUDA_TRY(cudaMemcpy2DAsync(open_raw, (size_t)pad * 4, raw + (nrows - 1) * raw_stride,
                                       (size_t)(nrows * raw_stride) * 4, (size_t)nblk * 4, nkv,
                                       cudaMemcpyDeviceToDevice, st));
    }
    if (is_final) { /* segment 0: the uniform row over the blocks scored */
        chunk_final_kernel<<<nkv, 256, 0, st>>>(nblk, plan->entropy, seg_cap, plan->scores, (int)blk_cap);
        LAUNCH_CHECK("chunk_final_kernel");
    }
    return profile_report(cfg, plan, flag, st, msg);
}

/* ============================================================ >>cuda-attention */
struct AttnParams {
    const void *q, *k, *v;
    void *out;
    int64_t q_ts, q_hs, k_ts, k_hs, v_ts, v_hs, o_ts, o_hs;
    int out_dtype;
    int n_kv, G, HC, T, chunks;
    int64_t q_offset, nq;
    int seg, bs;
    /* which segments attend sparsely: ei__segment_sparse(&cfg, s, plan_nseg,
       plan_final) for s < plan_nseg; plan_nseg 0 (no plan): dense causal */
    ei_config cfg;
    int plan_nseg, plan_final;
    /* 0: every segment; 1: the dense ones only; 2: the sparse ones only (a
       call with two kernels, one per kind of segment: attention_shape) */
    int seg_mode;
    const int *keep_count, *block_index;
    int seg_stride, max_keep;
    int s_last, tiles_per_seg;
    int nwork; /* work items of the launch (attention_ws_kernel: a persistent grid strides over them) */
    float scale_log2;
    const unsigned long long *bad; /* the scan's report: the kernel does nothing unless it is ~0 */
    int q_f32; /* q is f32: each element rounded to T (k's dtype) as the Q tile is loaded */
    /* split-K (attention_kernel; small grids, head_dim 64/256): blockIdx.y of nsplit takes its share
       of each work item's key tiles and writes its rows' unnormalised O and (max, sum) to part
       ([split][token][head][D] floats, then [split][token][head] float2); attn_split_combine_kernel
       merges them into out. nsplit 1: out directly. */
    int nsplit, D;
    float *part;
};
/* The order of the reports: q before k, then by token (key position) and head. */
__device__ __forceinline__ unsigned long long attn_bad_key(int is_k, int64_t tok, int head) {
    return ((unsigned long long)is_k << 62) | ((unsigned long long)tok << 12) | (unsigned long long)head;
}

#define POS_INVALID 0x7fffffff

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
/* 16 bytes (8 elements) of a row into shared memory: cp.async where the
   view allows it (vec: data 16-byte aligned, strides multiples of 8
   elements), else element by element (views need only be aligned to their
   2-byte elements, with any strides). */
template <typename T> __device__ __forceinline__ void load16(uint4 *dst, const T *src, int vec) {
    if (vec) {
        cp_async16(dst, src);
        return;
    }
    union { uint4 v; unsigned short h[8]; } u;
#pragma unroll
    for (int e = 0; e < 8; e++) u.h[e] = ((const unsigned short *)src)[e];
    *dst = u.v;
}
/* 8 floats rounded to T, as 16 bytes */
template <typename T> __device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
    union { uint4 v; T h[8]; } u;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        if constexpr (std::is_same<T, __half>::value) u.h[e] = __float2half_rn(x[e]);
        else u.h[e] = __float2bfloat16_rn(x[e]);
    }
    return u.v;
}
/* 8 f32 elements of a query row, rounded to T (round to nearest even) into
   16 bytes of shared memory: how an f32 Q (llama.cpp's) meets 16-bit K/V.
   vec: two 16-byte loads (data 16-byte aligned, strides multiples of 8
   elements), else element loads. Synchronous: the Q tile is loaded once per
   CTA, beside the cp.async K/V tiles. */
template <typename T> __device__ __forceinline__ uint4 round8_of_f32(const float *src, int vec) {
    float x[8];
    if (vec) {
        float4 a = *(const float4 *)src, b = *(const float4 *)(src + 4);
        x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = src[e];
    }
    return pack8<T>(x);
}
/* A Q row chunk (8 elements) into shared memory as T: load16 for a T view,
   rounded from f32 for an f32 view (q_f32) */
template <typename T> __device__ __forceinline__ void load16_q(uint4 *dst, const void *src, int64_t off, int q_f32, int vec) {
    if (q_f32) *dst = round8_of_f32<T>((const float *)src + off, vec);
    else load16<T>(dst, (const T *)src + off, vec);
}
/* Non-zero when one of the 8 bf16/f16 elements of v is NaN or Inf (its
   exponent field all ones): adding the exponent's lowest bit to the masked
   field carries into the 16-bit half's top bit only then. Integer work that
   runs beside the matrix units. */
template <typename T> __device__ __forceinline__ uint32_t nonfinite8(const uint4 &v) {
    const uint32_t m = std::is_same<T, __half>::value ? 0x7C007C00u : 0x7F807F80u;
    const uint32_t one = std::is_same<T, __half>::value ? 0x04000400u : 0x00800080u;
    return (((v.x & m) + one) | ((v.y & m) + one) | ((v.z & m) + one) | ((v.w & m) + one)) & 0x80008000u;
}
template <typename T>
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* 2^x for the attention softmax (flush-to-zero is harmless there; the
   profiling and decode paths use accurate expf/logf without it). -inf -> 0. */
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
/* Online softmax of one 16-row tile of scores in place (attention_kernel and
   attention_ws_kernel): s in the mma.sync / wgmma accumulator layout (this
   thread's s[nt][0..1] in row 0, s[nt][2..3] in row 1; a quad of lanes
   shares a row), m0 / m1 and l0 / l1 the two rows' running maxima (raw
   scores) and sums. p = 2^(x*sl - m*sl); the row maxima in two chains
   (short dependency chains). Returns true (warp-uniform) when a row maximum
   moved: O must then be scaled by al0 / al1 (the sums already are);
   rescaling on every tile instead was slower (more spills). */
template <int NB>
__device__ __forceinline__ bool online_softmax(float (&s)[NB][4], float &m0, float &m1, float &l0, float &l1, float sl,
                                               float &al0, float &al1) {
    float ma0 = m0, ma1 = m1, mb0 = -INFINITY, mb1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NB; nt += 2) {
        ma0 = fmaxf(ma0, fmaxf(s[nt][0], s[nt][1]));
        ma1 = fmaxf(ma1, fmaxf(s[nt][2], s[nt][3]));
        mb0 = fmaxf(mb0, fmaxf(s[nt + 1][0], s[nt + 1][1]));
        mb1 = fmaxf(mb1, fmaxf(s[nt + 1][2], s[nt + 1][3]));
    }
    float mx0 = fmaxf(ma0, mb0), mx1 = fmaxf(ma1, mb1);
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    float mu0 = mx0 == -INFINITY ? 0.f : mx0 * sl, mu1 = mx1 == -INFINITY ? 0.f : mx1 * sl;
    bool moved = __any_sync(0xffffffffu, mx0 != m0 || mx1 != m1);
    if (moved) {
        al0 = fast_exp2(m0 * sl - mu0);
        al1 = fast_exp2(m1 * sl - mu1);
        l0 *= al0;
        l1 *= al1;
    }
    m0 = mx0;
    m1 = mx1;
#pragma unroll
    for (int nt = 0; nt < NB; nt++) {
        s[nt][0] = fast_exp2(fmaf(s[nt][0], sl, -mu0));
        s[nt][1] = fast_exp2(fmaf(s[nt][1], sl, -mu0));
        s[nt][2] = fast_exp2(fmaf(s[nt][2], sl, -mu1));
        s[nt][3] = fast_exp2(fmaf(s[nt][3], sl, -mu1));
        l0 += s[nt][0] + s[nt][1];
        l1 += s[nt][2] + s[nt][3];
    }
    return moved;
}
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* ---- Hopper warpgroup MMA (sm_90a only; the other targets never launch it).
   wgmma reads its shared-memory operands through 64-bit descriptors: start
   address, leading/stride byte offsets (LBO/SBO) and the swizzle mode. Our
   tiles use the 128-byte swizzle: a [rows][64 elements] slab per 64 columns
   of the head dimension, 16-byte chunk c of row r stored at chunk c ^ (r & 7),
   slabs 1024-byte aligned. As a K-major operand (Q and K: rows = M or N, the
   head dimension = K) SBO is the 1024 bytes between 8-row groups and LBO is
   unused; as an N-major operand (V: rows = keys = K, head dimension = N) LBO
   is the distance between 64-column slabs and SBO the 1024 bytes between
   8-key groups (PTX ISA, "Shared Memory Matrix Layout"). */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define EI_WGMMA 1
#endif
__device__ __forceinline__ uint64_t wgmma_desc(const void *p, uint32_t lbo, uint32_t sbo) {
    uint64_t a = smem_u32(p);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}
/* Group-interleaved K/V tiles ([8-key group][ns 64-column slabs][8 keys][128 bytes], attn_map_gl):
   K as S = Q K^T's K-major operand at k-step kk (16 columns; 8-key groups ns KiB apart), and V as
   O += P V's N-major operand at key step t (16 keys: two groups) from slab s0 (slabs 1 KiB apart). */
__device__ __forceinline__ uint64_t gl_k_desc(const char *k0, int kk, int ns) {
    return wgmma_desc(k0 + (kk >> 2) * 1024 + (kk & 3) * 32, 16, ns * 1024);
}
__device__ __forceinline__ uint64_t gl_v_desc(const char *v0, int t, int s0, int ns) {
    return wgmma_desc(v0 + (t * 2 * ns + s0) * 1024, 1024, ns * 1024);
}
__device__ __forceinline__ void wgmma_fence() {
#ifdef EI_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef EI_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
/* waits until every committed group of this warpgroup has finished */
__device__ __forceinline__ void wgmma_wait_all() {
#ifdef EI_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
/* waits until at most N committed groups of this warpgroup are still in
   flight: with S(j) committed before P(j-1) V(j-1), N = 1 waits for S alone */
template <int N> __device__ __forceinline__ void wgmma_wait() {
#ifdef EI_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* Named barrier id among n threads (multiples of 32): arrive-only (does not
   wait) and sync (waits for the arrivals); id 0 is __syncthreads'. */
__device__ __forceinline__ void named_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
/* An empty asm that reads and writes each accumulator register: the compiler
   may not move its own reads or writes of them across it (CUTLASS's
   warpgroup_fence_operand). Placed after a wgmma_wait, it keeps the softmax
   from reading S (or the rescale from touching O) before the wait. */
template <int R> __device__ __forceinline__ void acc_fence(float (&d)[R][4]) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
}
/* cp.async and plain stores write shared memory through the generic proxy;
   wgmma reads it through the async proxy */
__device__ __forceinline__ void fence_proxy_async() {
#ifdef EI_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/* keeps registers that an in-flight wgmma reads alive until it has finished */
__device__ __forceinline__ void reg_keep(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }

/* ---- the bulk tensor copy engine (TMA) and its mbarriers (sm_90; only the
   sm_90a kernels that run wgmma use them, the other targets never launch
   them). A copy writes a box of a tensor map into shared memory through the
   async proxy, 128-byte swizzled as wgmma reads it, and completes on an
   mbarrier as a transaction count of bytes (expect_tx). */
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
#ifdef EI_WGMMA
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
    (void)bar; (void)count;
#endif
}
/* this thread's arrival, announcing tx bytes that copies will bring */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, unsigned tx) {
#ifdef EI_WGMMA
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(tx) : "memory");
#else
    (void)bar; (void)tx;
#endif
}
/* this thread's arrival */
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
#ifdef EI_WGMMA
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#else
    (void)bar;
#endif
}
/* waits until the phase of the given parity has completed */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
#ifdef EI_WGMMA
    asm volatile("{\n.reg .pred done;\nWAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
#else
    (void)bar; (void)parity;
#endif
}
/* box at coordinates (c0: column, c1: head, c2: token) of a rank-3 tensor map into shared memory */
__device__ __forceinline__ void tma_load3(void *dst, const void *map, int c0, int c1, int c2, uint64_t *bar) {
#ifdef EI_WGMMA
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar)) : "memory");
#else
    (void)dst; (void)map; (void)c0; (void)c1; (void)c2; (void)bar;
    __trap();
#endif
}
/* rank 4 / 5 boxes (attention_ws_kernel's group-interleaved tiles: attn_maps_gl) */
__device__ __forceinline__ void tma_load4(void *dst, const void *map, int c0, int c1, int c2, int c3, uint64_t *bar) {
#ifdef EI_WGMMA
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar)) : "memory");
#else
    (void)dst; (void)map; (void)c0; (void)c1; (void)c2; (void)c3; (void)bar;
    __trap();
#endif
}
__device__ __forceinline__ void tma_load5(void *dst, const void *map, int c0, int c1, int c2, int c3, int c4, uint64_t *bar) {
#ifdef EI_WGMMA
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(bar)) : "memory");
#else
    (void)dst; (void)map; (void)c0; (void)c1; (void)c2; (void)c3; (void)c4; (void)bar;
    __trap();
#endif
}
/* The tensor maps of a call's K and V (dims: head_dim, kv heads, tokens):
   boxes of BC keys (contiguous tiles) and of 8 keys (gathered blocks: one
   1024-byte swizzle unit per 64 columns). */
struct AttnMaps {
    CUtensorMap k_tile, v_tile, k_8, v_8;
    /* attention_ws_kernel's group-interleaved tiles (attn_maps_gl): one 8-key group, every
       64-column slab (rank 4), and 16 groups of 8 keys (rank 5) over the run_groups whole
       groups of the tensor */
    CUtensorMap k_g, v_g, k_run, v_run;
    int run_groups;
};
struct AttnNoMaps {
    int unused;
};

/* D[64 x N] (+)= A[64 x 16] (shared, K-major) * B[16 x N] (shared, K-major) */
template <int N, typename T> __device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db, int acc);
/* D[64 x N] += A[64 x 16] (registers) * B[16 x N] (shared, N-major) */
template <int N, typename T> __device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db);

/* The instructions, generated for N = 64 / 128 and bf16 / f16 from one
   pattern: the accumulator list (N/2 registers) comes first, so the operands
   after it are numbered from N/2 on (passed as strings: A0.. = "32".. or "64"..). */
#define EI__WG_REGS_64 \
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" "}"
#define EI__WG_OPS_64 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define EI__WG_REGS_128 \
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" "}"
#define EI__WG_OPS_128 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
    "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
    "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
    "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
/* N = 256 (wgmma_rs only: attention_ws_kernel's O for head_dim 256 in one product, no halves
   that ptxas would copy between) */
#define EI__WG_REGS_256 \
    "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" "}"
#define EI__WG_OPS_256 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
    "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
    "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
    "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), \
    "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), \
    "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), \
    "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), \
    "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), \
    "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), \
    "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), \
    "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), \
    "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
#ifdef EI_WGMMA
#define EI__WG_SS(N, T, TY, A0, A1, A2)                                                               \
    template <>                                                                                     \
    __device__ __forceinline__ void wgmma_ss<N, T>(float(&d)[N / 8][4], uint64_t da, uint64_t db, int acc) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" A2 ", 0;\n"                                \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " EI__WG_REGS_##N  \
                     ", %" A0 ", %" A1 ", p, 1, 1, 0, 0;\n}\n"                                       \
                     : EI__WG_OPS_##N                                                               \
                     : "l"(da), "l"(db), "r"(acc));                                                 \
    }
#define EI__WG_RS(N, T, TY, A0, A1, A2, A3, B, P)                                                     \
    template <>                                                                                     \
    __device__ __forceinline__ void wgmma_rs<N, T>(float(&d)[N / 8][4], const uint32_t(&a)[4], uint64_t db) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                                 \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " EI__WG_REGS_##N  \
                     ", {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" B ", p, 1, 1, 1;\n}\n"               \
                     : EI__WG_OPS_##N                                                               \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                \
    }
#else /* other targets compile the kernels' wgmma branch but never launch it */
#define EI__WG_SS(N, T, TY, A0, A1, A2)                                                               \
    template <>                                                                                     \
    __device__ __forceinline__ void wgmma_ss<N, T>(float(&d)[N / 8][4], uint64_t da, uint64_t db, int acc) { \
        (void)d; (void)da; (void)db; (void)acc;                                                     \
        __trap();                                                                                   \
    }
#define EI__WG_RS(N, T, TY, A0, A1, A2, A3, B, P)                                                     \
    template <>                                                                                     \
    __device__ __forceinline__ void wgmma_rs<N, T>(float(&d)[N / 8][4], const uint32_t(&a)[4], uint64_t db) { \
        (void)d; (void)a; (void)db;                                                                 \
        __trap();                                                                                   \
    }
#endif
EI__WG_SS(64, __nv_bfloat16, "bf16", "32", "33", "34")
EI__WG_SS(64, __half, "f16", "32", "33", "34")
EI__WG_SS(128, __nv_bfloat16, "bf16", "64", "65", "66")
EI__WG_SS(128, __half, "f16", "64", "65", "66")
EI__WG_RS(64, __nv_bfloat16, "bf16", "32", "33", "34", "35", "36", "37")
EI__WG_RS(64, __half, "f16", "32", "33", "34", "35", "36", "37")
EI__WG_RS(128, __nv_bfloat16, "bf16", "64", "65", "66", "67", "68", "69")
EI__WG_RS(128, __half, "f16", "64", "65", "66", "67", "68", "69")
EI__WG_RS(256, __nv_bfloat16, "bf16", "128", "129", "130", "131", "132", "133")
EI__WG_RS(256, __half, "f16", "128", "129", "130", "131", "132", "133")
#undef EI__WG_SS
#undef EI__WG_RS
#undef EI__WG_OPS_64
#undef EI__WG_OPS_128
#undef EI__WG_OPS_256
#undef EI__WG_REGS_64
#undef EI__WG_REGS_128
#undef EI__WG_REGS_256

/* The key list a CTA attends to: kept blocks (ranked; all before the
   segment), then keys base_pos .. base_pos + own_len - 1 (causal). */
struct KeyList {
    const int *brow;
    int kept_len, own_len, base_pos, bs, seg_first_block;
    __device__ __forceinline__ int pos(int i) const {
        if (i < kept_len) {
            int b = brow[i / bs];
            if (b < 0 || b >= seg_first_block) return POS_INVALID;
            return b * bs + i % bs;
        }
        i -= kept_len;
        return i < own_len ? base_pos + i : POS_INVALID;
    }
};

/* One CTA: NW warps x MT m-tiles of 16 rows; rows are (query head of the
   group, token) pairs sharing one kv head and one segment, so each gathered
   K/V tile serves the whole group; BC keys per step, double-buffered with
   cp.async (VEC; else element loads and stores, for views that are not
   16-byte aligned). Shared memory: Q [ROWS][D], K and V [2][BC][D], rows padded by
   16 bytes (XOR-swizzled 16-byte chunks for D = 256). MT = 2 reuses every K/V fragment for two m-tiles (half
   the shared-memory traffic per mma); Q then stays in shared memory.
   WG (sm_90a, NW = 8, MT = 1): the two matrix products run as warpgroup MMAs
   (wgmma) instead: each warpgroup of 4 warps owns 64 rows, S = Q K^T reads Q
   and K straight from shared memory, O += P V takes P from registers (the
   accumulator layout of S is the A-fragment layout) and V from shared memory;
   tiles use the 128-byte-swizzled layout wgmma reads (see wgmma_desc).
   Why 64 keys per step and 2 CTAs per SM: the two CTAs' softmax and
   products interleave, which beat 128 keys with one CTA per SM and a
   software-pipelined variant (ptxas serialised its wgmmas for lack of
   registers).
   TMA (TM > 0, wgk64 the default on Hopper for head_dim 64; wg64 the
   cp.async kernel above): when every 8-key group of a tile is 8
   consecutive valid keys (a kept block of a block size divisible by 8, or
   own keys below the segment's end), lane 0 of warp 0 announces the tile's
   bytes on the buffer's mbarrier and warp 0 copies it with the bulk tensor
   copy engine: one BC x 64 box per 64 columns of K and of V for a run of
   consecutive keys (dense tiles), else one 8 x 64 box (one 1024-byte swizzle
   unit) per group; the boxes land 128-byte swizzled where the cp.async
   tiles would. Tiles with padding or a partial group (the causal end, other
   block sizes) stay on cp.async. The tensor maps (rank 3: head_dim, kv
   heads, tokens) are encoded per call with cuTensorMapEncodeTiled from the
   runtime's driver entry point (no libcuda link); views they cannot describe
   run wg64. TM 3 (wgk) also takes the mask and its flag of a TMA tile from
   the key indices (no kpos writes); TM 2 (wgp) moreover drops the CTA
   barrier between TMA tiles (empty mbarriers per buffer, one arrival per
   warp and tile; the warpgroups drift up to a tile apart).
   Overlap (TM 4, wgo; TM 5, wgq): inside each warpgroup S(j) = Q K_j^T is
   issued before O += P(j-1) V(j-1) and the softmax of S(j) runs while that
   P V is in the tensor cores (the loop below); three K/V stages, so one CTA
   per SM at 128 keys per step; TM 5 also orders the two warpgroups'
   products within a step. Both are ablations: with a CTA barrier per step
   one CTA of two warpgroups does no better than two CTAs of wgk64, which
   is why attention_ws_kernel below (a producer warp, mbarriers only) took
   over head_dim 128. This kernel stays the default for head_dim 64 and 256
   (wgk64; for 256 two N = 128 products per P V step, one CTA per SM:
   docs/performance.md, "Current for head_dim 256"), block sizes that are
   not a multiple of 8, and (TM 0 / mma.sync) views TMA cannot describe and
   other GPUs.
   Measurements of every variant (ms, ncu, spills), and FlashAttention-3's
   scheme on cp.async loads that lost to it (issue 17): docs/performance.md,
   "NVIDIA H200" and its dated log. The variants' names: >>cuda-tuning. */
/* K/V stages of attention_kernel's TM variant: three for the overlapped ones (4, 5), else two */
__host__ __device__ constexpr int attn_kv_stages(int tm) { return tm == 4 || tm == 5 ? 3 : 2; }
template <int D, int NW, int MT, int BC, typename T, bool WG, bool VEC, int TM = 0>
__global__ void __launch_bounds__(NW * 32, (WG && BC == 64 && attn_kv_stages(TM) == 2 && D <= 128) ? 2 : 1)
    attention_kernel(const AttnParams p, const __grid_constant__ typename std::conditional<(TM > 0), AttnMaps, AttnNoMaps>::type tm) {
    /* TM 1: TMA tiles (kpos and the mask as for cp.async tiles), one CTA barrier per tile; 3: the same, the
       TMA tiles' masks from key indices (no kpos); 2: as 3, TMA tiles handed over by mbarriers only;
       4: as 3, three K/V stages and S(j) = Q K_j^T issued before O += P(j-1) V(j-1) (overlap, below);
       5: as 4, and warpgroup 0 issues its products of a step before warpgroup 1 (named barrier 1);
       6: as 3 on group-interleaved K/V tiles (GL: [8-key group][64-column slab][8 keys], attn_map_gl), so
       that a gathered tile is one TMA box per 8-key group of K and of V, a run of keys one box each */
    constexpr int NSTG = attn_kv_stages(TM); /* K/V stages */
    constexpr bool TMA = TM > 0, OVL = NSTG == 3, GL = TM == 6;
    constexpr int ROWS = 16 * NW * MT, NT = 32 * NW, CH = D / 8, NB = BC / 8; /* NB key n-tiles */
    constexpr bool QREG = !WG && MT == 1 && D <= 128;
    static_assert(!WG || (NW == 8 && MT == 1 && (D <= 128 || (BC == 64 && !OVL))),
                  "wgmma tiles: 2 warpgroups of 64 rows, head_dim 64/128, or 256 with 64 keys per step and two stages");
    static_assert(!TMA || (WG && VEC), "TMA tiles: the wgmma kernel's swizzled layout, 16-byte-aligned views");
    /* shared layout of a [rows][D] tile in 16-byte chunks: rows padded by one
       chunk (constant offsets for ldmatrix, conflict-free) for D <= 128; for
       D = 256 (shared memory is tight) XOR-swizzled instead; for WG, 64-column
       slabs of [R rows][128 bytes], 128-byte swizzle (R = rows of the tile) */
    constexpr int RS = (D <= 128 && !WG) ? CH + 1 : CH; /* row stride in chunks */
    auto at = [](int row, int ch, int R) -> int {
        if (WG) return (ch >> 3) * R * 8 + row * 8 + ((ch & 7) ^ (row & 7));
        (void)R;
        return D <= 128 ? row * RS + ch : row * RS + (ch ^ (row & 7));
    };
    /* K/V tiles: at's layout, or GL's [row / 8][slab][row % 8] (the same 128-byte swizzle) */
    auto at_kv = [&](int row, int ch) -> int {
        if (GL) return ((row >> 3) * (D / 64) + (ch >> 3)) * 64 + (row & 7) * 8 + ((ch & 7) ^ (row & 7));
        return at(row, ch, BC);
    };
    extern __shared__ uint4 smem_raw[];
    /* wgmma's swizzle pattern repeats every 1024 bytes: align the tiles to it
       (the launch adds 1024 bytes of slack) */
    uint4 *smem = WG ? smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u) / 16 : smem_raw;
    uint4 *sQ = smem, *sK = smem + ROWS * RS, *sV = sK + NSTG * BC * RS;
    __shared__ int kpos[NSTG][BC];
    __shared__ uint64_t tbar[NSTG]; /* TMA: buffer b's copies complete on tbar[b] */
    __shared__ uint64_t ebar[2];    /* TM 2: every warp has read buffer b (one arrival per warp and tile) */

    if (*p.bad != ~0ull) return; /* NaN/Inf in q or k: EI_ERR_NONFINITE, nothing written */
    /* ---- work item: segments from the last (heaviest) down */
    int bid = blockIdx.x;
    int tile = p.tiles_per_seg - 1 - bid % p.tiles_per_seg;
    bid /= p.tiles_per_seg;
    int chunk = bid % p.chunks;
    bid /= p.chunks;
    int kvh = bid % p.n_kv;
    int s = p.s_last - bid / p.n_kv;
    int64_t seg_lo = max((int64_t)s * p.seg, p.q_offset), seg_hi = min((int64_t)(s + 1) * p.seg, p.q_offset + p.nq);
    int t0 = (int)(seg_lo + (int64_t)tile * p.T);
    if (t0 >= seg_hi) return;
    int t1 = (int)min((int64_t)t0 + p.T, seg_hi);
    int h0 = kvh * p.G + chunk * p.HC, hc = min(p.HC, p.G - chunk * p.HC);

    bool sparse = s < p.plan_nseg && ei__segment_sparse(&p.cfg, s, p.plan_nseg, p.plan_final);
    if (p.seg_mode && (p.seg_mode == 2) != sparse) return; /* the other kernel's segment */
    KeyList kl;
    kl.bs = p.bs;
    kl.seg_first_block = (int)(((int64_t)s * p.seg) / p.bs);
    if (sparse) {
        /* the header checked host plans' rows; a corrupt device plan must
           still not make the kernel read outside its rows (KeyList::pos
           likewise masks block numbers that are not before the segment) */
        int kc = p.keep_count[(int64_t)kvh * p.seg_stride + s];
        kc = max(0, min(kc, p.max_keep));
        kl.brow = p.block_index + ((int64_t)kvh * p.seg_stride + s) * p.max_keep;
        kl.kept_len = kc * p.bs;
        kl.base_pos = s * p.seg;
    } else {
        kl.brow = p.block_index;
        kl.kept_len = 0;
        kl.base_pos = 0;
    }
    kl.own_len = t1 - kl.base_pos;
    int total = kl.kept_len + kl.own_len;
    int ntiles = (total + BC - 1) / BC;
    if (p.nsplit > 1) { /* split-K: tiles [a, b) of the list, as a list of their own */
        const int a = (int)((int64_t)ntiles * blockIdx.y / p.nsplit), b = (int)((int64_t)ntiles * (blockIdx.y + 1) / p.nsplit);
        const int lo = a * BC, hi = min(b * BC, total);
        if (lo < kl.kept_len) { /* lo is a multiple of the block size (api_attention) */
            kl.brow += lo / kl.bs;
            kl.kept_len -= lo;
        } else {
            kl.base_pos += lo - kl.kept_len;
            kl.own_len -= lo - kl.kept_len;
            kl.kept_len = 0;
        }
        total = max(hi - lo, 0);
        if (kl.kept_len >= total) {
            kl.kept_len = total;
            kl.own_len = 0;
        } else {
            kl.own_len = min(kl.own_len, total - kl.kept_len);
        }
        ntiles = b - a;
        if (ntiles <= 0) { /* no keys: every row's (max, sum) is (-inf, 0), its O is never read */
            const int nh = p.n_kv * p.G;
            float2 *ml = (float2 *)(p.part + (size_t)p.nsplit * (size_t)p.nq * nh * p.D);
            for (int r = threadIdx.x; r < ROWS; r += NT) {
                int hr = r / p.T, tok = t0 + r % p.T;
                if (hr < hc && tok < t1)
                    ml[((size_t)blockIdx.y * p.nq + (tok - p.q_offset)) * nh + h0 + hr] = make_float2(-INFINITY, 0.f);
            }
            return;
        }
    }

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const T *K = (const T *)p.k + (int64_t)kvh * p.k_hs;
    const T *V = (const T *)p.v + (int64_t)kvh * p.v_hs;

    /* ---- Q tile */
    for (int c = tid; c < ROWS * CH; c += NT) {
        int row = c / CH, ch = c % CH;
        int hr = row / p.T, tok = t0 + row % p.T;
        uint4 *dst = &sQ[at(row, ch, ROWS)];
        if (hr < hc && tok < t1)
            load16_q<T>(dst, p.q, (tok - p.q_offset) * p.q_ts + (int64_t)(h0 + hr) * p.q_hs + ch * 8, p.q_f32, VEC);
        else
            *dst = make_uint4(0, 0, 0, 0);
    }
    /* the token of this thread's row (m-tile mt, half hf: lane/4 + 8*hf), or -1 for padding;
       recomputed where needed rather than held in registers */
    auto row_token = [&](int mt, int hf) -> int {
        int r = (warp * MT + mt) * 16 + (lane >> 2) + 8 * hf;
        return (r / p.T < hc && t0 + r % p.T < t1) ? t0 + r % p.T : -1;
    };

    /* gathers key tile j (keys j*BC ..) into buffer buf: K and V rows, and the
       tile's key positions (for the mask); returns whether the tile needs the
       causal/padding mask (a key beyond the first row's token, or padding) */
    /* TMA: per buffer, whether copies are in flight, and the parity of the phase they complete */
    uint32_t tma_pend = 0, tma_par = 0;
    if (TMA) {
        if (tid == 0) {
#pragma unroll
            for (int b = 0; b < NSTG; b++) mbar_init(&tbar[b], 1);
            mbar_init(&ebar[0], NW);
            mbar_init(&ebar[1], NW);
        }
        __syncthreads();
    }
    /* Whether tile j can come by TMA (warp-uniform, the same in every warp;
       j past the last tile: true): each lane looks at one 8-key group g of the
       tile; its keys are consecutive and valid when it lies in one kept block
       (block size a multiple of 8) or in the own keys; pos: the group's first key. */
    auto tma_ok = [&](int j, int &pos) -> bool {
        constexpr int NG = BC / 8;
        int g = lane % NG, i = j * BC + 8 * g;
        bool ok;
        pos = 0;
        if (j >= ntiles) return true;
        if (i + 8 <= kl.kept_len) {
            int b = kl.brow[i / kl.bs];
            pos = b * kl.bs + i % kl.bs;
            ok = (kl.bs & 7) == 0 && b >= 0 && b < kl.seg_first_block;
        } else {
            pos = kl.base_pos + (i - kl.kept_len);
            ok = i >= kl.kept_len && i - kl.kept_len + 8 <= kl.own_len;
        }
        return __all_sync(0xffffffffu, ok);
    };
    auto issue = [&](int j, int buf) -> int {
        uint4 *bK = sK + buf * BC * RS, *bV = sV + buf * BC * RS;
        bool tma_done = false;
        if constexpr (TMA) {
            /* When every 8-key group of the tile allows it (tma_ok), warp 0 copies
               the tile with TMA: one box of BC keys per 64 columns of K and of V
               when the groups follow on (dense tiles), else one 8-key box per
               group (gathered blocks); any other tile (padding, the causal end,
               other block sizes) takes the cp.async path. */
            constexpr int NG = BC / 8, NS = D / 64;
            int g = lane % NG, pos;
            if (tma_ok(j, pos)) {
                int pos0 = __shfl_sync(0xffffffffu, pos, 0);
                bool contig = __all_sync(0xffffffffu, pos == pos0 + 8 * g);
                if (warp == 0) {
                    /* TM 2: the buffer's last tile (j - 2) read by every warp */
                    if (TM == 2 && j >= 2) mbar_wait(&ebar[buf], ((j >> 1) - 1) & 1);
                    if (lane == 0) mbar_arrive_expect_tx(&tbar[buf], 2u * BC * D * (unsigned)sizeof(T));
                    __syncwarp();
                    if (GL) { /* a run of BC / 8 whole groups as one box, else a box per group (every slab) */
                        if (contig && !(pos0 & 7) && pos0 / 8 + NG <= tm.run_groups) {
                            if (lane < 2)
                                tma_load5(lane ? bV : bK, lane ? (const void *)&tm.v_run : (const void *)&tm.k_run, 0, 0, 0,
                                          pos0 / 8, kvh, &tbar[buf]);
                        } else if (lane < 2 * NG) {
                            tma_load4((lane >= NG ? bV : bK) + g * NS * 64,
                                      lane >= NG ? (const void *)&tm.v_g : (const void *)&tm.k_g, 0, pos, 0, kvh, &tbar[buf]);
                        }
                    } else if (contig) {
                        if (lane < 2 * NS) {
                            int sl = lane % NS;
                            bool isv = lane >= NS;
                            tma_load3((isv ? bV : bK) + sl * BC * 8, isv ? (const void *)&tm.v_tile : (const void *)&tm.k_tile,
                                      sl * 64, kvh, pos0, &tbar[buf]);
                        }
                    } else {
#pragma unroll
                        for (int op = lane; op < 2 * NS * NG; op += 32) {
                            int r = op / NG, sl = r % NS; /* op % NG == g: NG divides 32 */
                            bool isv = r >= NS;
                            tma_load3((isv ? bV : bK) + sl * BC * 8 + g * 64, isv ? (const void *)&tm.v_8 : (const void *)&tm.k_8,
                                      sl * 64, kvh, pos, &tbar[buf]);
                        }
                    }
                }
                tma_pend |= 1u << buf;
                tma_done = true;
                if (TM >= 2) {
                    /* no kpos (TM 2: warps may still read the buffer's last tile): the
                       mask of a TMA tile follows from the key index (tma_masked); it needs
                       one when its last key is an own key past the first row's token */
                    int last = j * BC + BC - 1 - kl.kept_len;
                    return last >= 0 && kl.base_pos + last > t0;
                }
            }
        }
        for (int c = tma_done ? BC * CH : tid; c < BC * CH; c += NT) {
            int row = c / CH, ch = c % CH;
            int pos = kl.pos(j * BC + row);
            int sw = at_kv(row, ch);
            if (pos != POS_INVALID) {
                load16<T>(&bK[sw], K + (int64_t)pos * p.k_ts + ch * 8, VEC);
                load16<T>(&bV[sw], V + (int64_t)pos * p.v_ts + ch * 8, VEC);
            } else {
                bK[sw] = make_uint4(0, 0, 0, 0);
                bV[sw] = make_uint4(0, 0, 0, 0);
            }
        }
        int need = 0;
        if (tid < BC) {
            int pos = kl.pos(j * BC + tid);
            kpos[buf][tid] = pos;
            need = pos > t0;
        }
        return need;
    };
    int need_cur = issue(0, 0);
    cp_async_commit();
    cp_async_wait_all();
    if (WG) fence_proxy_async();
    need_cur = __syncthreads_or(need_cur);

    uint32_t qa[QREG ? D / 16 : 1][4];
    if (QREG) {
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            int row = warp * 16 + (lane & 15), ch = kk * 2 + (lane >> 4);
            ldmatrix_x4(qa[QREG ? kk : 0], &sQ[at(row, ch, ROWS)]);
        }
    }

    float o[MT][D / 8][4];
    float m_[MT][2], l_[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < D / 8; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
        m_[mt][0] = m_[mt][1] = -INFINITY;
        l_[mt][0] = l_[mt][1] = 0.f;
    }

    /* ---- the steps of one key tile, shared by the loops below */
    /* causal / padding mask: keys past a row's token score -inf */
    auto mask_scores = [&](float (&s)[NB][4], int mt, int buf) {
        int tk0 = row_token(mt, 0), tk1 = row_token(mt, 1);
#pragma unroll
        for (int nt = 0; nt < NB; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = nt * 8 + (lane & 3) * 2 + (e & 1);
                if (kpos[buf][key] > (e < 2 ? tk0 : tk1)) s[nt][e] = -INFINITY;
            }
    };
    /* TM 2 / 3, a TMA tile (every key valid; kept keys lie before every row's
       token): own key i of tile j sits at base_pos + j*BC + key - kept_len */
    auto tma_masked = [&](float (&s)[NB][4], int mt, int j) {
        int tk0 = row_token(mt, 0), tk1 = row_token(mt, 1);
        int first = j * BC - kl.kept_len; /* own-key index of the tile's key 0 */
#pragma unroll
        for (int nt = 0; nt < NB; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = first + nt * 8 + (lane & 3) * 2 + (e & 1);
                if (i >= 0 && kl.base_pos + i > (e < 2 ? tk0 : tk1)) s[nt][e] = -INFINITY;
            }
    };
    /* online softmax of m-tile mt in place (online_softmax) */
    auto softmax_tile = [&](float (&s)[NB][4], int mt, float &al0, float &al1) -> bool {
        return online_softmax(s, m_[mt][0], m_[mt][1], l_[mt][0], l_[mt][1], p.scale_log2, al0, al1);
    };
    auto rescale_o = [&](int mt, float al0, float al1) {
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            o[mt][i][0] *= al0; o[mt][i][1] *= al0;
            o[mt][i][2] *= al1; o[mt][i][3] *= al1;
        }
    };
    /* P of 16 keys (n-tiles 2t, 2t+1) as an A fragment (mma.sync and wgmma alike) */
    auto pack_p = [&](const float (&s)[NB][4], int t, uint32_t (&a)[4]) {
        a[0] = pack2<T>(s[2 * t][0], s[2 * t][1]);
        a[1] = pack2<T>(s[2 * t][2], s[2 * t][3]);
        a[2] = pack2<T>(s[2 * t + 1][0], s[2 * t + 1][1]);
        a[3] = pack2<T>(s[2 * t + 1][2], s[2 * t + 1][3]);
    };
    /* wgmma products: S = Q K^T over D/16 k-steps of 16 columns (32 bytes) inside
       the 128-byte rows; O += P V over BC/16 k-steps of 16 keys */
    auto wg_qk = [&](float (&s)[NB][4], const uint4 *bK) {
        if constexpr (WG) {
            const char *q0 = (const char *)sQ + (warp >> 2) * 64 * 128, *k0 = (const char *)bK;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                wgmma_ss<BC, T>(s, wgmma_desc(q0 + (kk >> 2) * ROWS * 128 + (kk & 3) * 32, 16, 1024),
                                GL ? gl_k_desc(k0, kk, D / 64)
                                   : wgmma_desc(k0 + (kk >> 2) * BC * 128 + (kk & 3) * 32, 16, 1024), kk > 0);
        }
    };
    auto wg_pv = [&](uint32_t (&pa)[NB / 2][4], const uint4 *bV) {
        if constexpr (WG) {
            /* at most 128 output columns per wgmma: head_dim 256 issues two, on slabs 0-1 and 2-3 of V
               (their accumulators: o's n-tiles 0-15 and 16-31) */
            constexpr int NN = D < 128 ? D : 128, NH = D / NN;
#pragma unroll
            for (int t = 0; t < NB / 2; t++)
#pragma unroll
                for (int h = 0; h < NH; h++)
                    wgmma_rs<NN, T>(*reinterpret_cast<float(*)[NN / 8][4]>(&o[0][h * (NN / 8)]), pa[t],
                                    GL ? gl_v_desc((const char *)bV, t, h * (NN / 64), D / 64)
                                       : wgmma_desc((const char *)bV + (h * (NN / 64) * BC + t * 16) * 128, BC * 128, 1024));
        }
    };

    /* TM 4 / 5: the key loop pipelined inside each warpgroup (FlashAttention-3's
       two-stage pipelining). Step j issues S(j) = Q K_j^T and then
       O += P(j-1) V(j-1) as two asynchronous wgmma groups, waits for S(j)
       alone (wgmma_wait<1>) and runs the mask and softmax of S(j) while the
       tensor cores still compute P(j-1) V(j-1); then it waits for that
       product, rescales O (the new row maxima) and packs P(j). The first
       S and the last P V are peeled out of the loop, so that no branch
       surrounds a wgmma (ptxas serialises them otherwise, C7514). Tile j+1
       loads while step j runs, into the stage of tile j-2 (three stages: K_j
       and V_(j-1) are both read during step j); the CTA barrier at the end of
       a step hands the stages over (cp.async tiles, and the buffer of tile
       j-2 whose P V every warp has waited for). */
    if constexpr (OVL) {
        float sc[NB][4];
        uint32_t pa[NB / 2][4];
        /* waits for the TMA copies of buffer buf, if any; true when the tile came by TMA */
        auto tma_wait = [&](int buf) -> bool {
            if (!((tma_pend >> buf) & 1)) return false;
            mbar_wait(&tbar[buf], (tma_par >> buf) & 1);
            tma_par ^= 1u << buf;
            tma_pend &= ~(1u << buf);
            return true;
        };
        auto mask_and_softmax = [&](int j, int buf, bool is_tma, bool need, float &al0, float &al1) -> bool {
            if (need) {
                if (is_tma) tma_masked(sc, 0, j);
                else mask_scores(sc, 0, buf);
            }
            return softmax_tile(sc, 0, al0, al1);
        };
        int need_next = ntiles > 1 ? issue(1, 1) : 0;
        cp_async_commit();
        {   /* tile 0: S, softmax (O is still zero: nothing to rescale), P */
            bool is_tma = tma_wait(0);
            wgmma_fence();
            wg_qk(sc, sK);
            wgmma_commit();
            wgmma_wait<0>();
            acc_fence(sc);
            float al0, al1;
            mask_and_softmax(0, 0, is_tma, need_cur, al0, al1);
#pragma unroll
            for (int t = 0; t < NB / 2; t++) pack_p(sc, t, pa[t]);
        }
        cp_async_wait_all();
        fence_proxy_async();
        need_cur = __syncthreads_or(need_next);
        for (int j = 1; j < ntiles; j++) {
            int buf = j % NSTG, pbuf = (j - 1) % NSTG;
            need_next = j + 1 < ntiles ? issue(j + 1, (j + 1) % NSTG) : 0;
            cp_async_commit();
            bool is_tma = tma_wait(buf);
            acc_fence(o[0]);
            if (TM == 5 && warp >= 4) named_sync(1, NT); /* TM 5: after warpgroup 0's products */
            wgmma_fence();
            wg_qk(sc, sK + buf * BC * RS);
            wgmma_commit();
            wg_pv(pa, sV + pbuf * BC * RS);
            wgmma_commit();
            if (TM == 5 && warp < 4) named_arrive(1, NT);
            wgmma_wait<1>(); /* S(j) done; P(j-1) V(j-1) may still run */
            acc_fence(sc);
            float al0, al1;
            bool moved = mask_and_softmax(j, buf, is_tma, need_cur, al0, al1);
            wgmma_wait<0>();
            acc_fence(o[0]);
#pragma unroll
            for (int t = 0; t < NB / 2; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) reg_keep(pa[t][e]); /* read by the P V just waited for */
            if (moved) rescale_o(0, al0, al1);
#pragma unroll
            for (int t = 0; t < NB / 2; t++) pack_p(sc, t, pa[t]);
            cp_async_wait_all();
            fence_proxy_async();
            need_cur = __syncthreads_or(need_next);
        }
        /* the last tile's P V */
        acc_fence(o[0]);
        wgmma_fence();
        wg_pv(pa, sV + ((ntiles - 1) % NSTG) * BC * RS);
        wgmma_commit();
        wgmma_wait<0>();
        acc_fence(o[0]);
#pragma unroll
        for (int t = 0; t < NB / 2; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) reg_keep(pa[t][e]);
    } else {
        for (int j = 0; j < ntiles; j++) {
            int buf = j & 1;
            int need_next = 0;
            if (j + 1 < ntiles) need_next = issue(j + 1, buf ^ 1);
            cp_async_commit();
            const uint4 *bK = sK + buf * BC * RS, *bV = sV + buf * BC * RS;
            bool cur_tma = false;
            if (TMA && ((tma_pend >> buf) & 1)) { /* this tile came by TMA: wait for its bytes */
                mbar_wait(&tbar[buf], (tma_par >> buf) & 1);
                tma_par ^= 1u << buf;
                tma_pend &= ~(1u << buf);
                cur_tma = true;
            }

            /* one key tile; masked = true only on tiles that reach past the first row's
               token (the diagonal) or hold padding: the rest runs branch-free */
            auto tile = [&](auto masked) {
                float sc[MT][NB][4];
    #pragma unroll
                for (int mt = 0; mt < MT; mt++)
    #pragma unroll
                    for (int i = 0; i < NB; i++) sc[mt][i][0] = sc[mt][i][1] = sc[mt][i][2] = sc[mt][i][3] = 0.f;
                if constexpr (WG) {
                    wgmma_fence();
                    wg_qk(sc[0], bK);
                    wgmma_commit();
                    wgmma_wait_all();
                } else {
    #pragma unroll
                    for (int kk = 0; kk < D / 16; kk++) {
                        uint32_t a[MT][4];
    #pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            if (QREG) {
    #pragma unroll
                                for (int e = 0; e < 4; e++) a[mt][e] = qa[QREG ? kk : 0][e];
                            } else {
                                int row = (warp * MT + mt) * 16 + (lane & 15), ch = kk * 2 + (lane >> 4);
                                ldmatrix_x4(a[mt], &sQ[at(row, ch, ROWS)]);
                            }
                        }
    #pragma unroll
                        for (int np = 0; np < NB / 2; np++) {
                            uint32_t b[4];
                            int key = np * 16 + (lane & 7) + ((lane >> 4) << 3), ch = kk * 2 + ((lane >> 3) & 1);
                            ldmatrix_x4(b, &bK[at(key, ch, BC)]);
    #pragma unroll
                            for (int mt = 0; mt < MT; mt++) {
                                mma16816<T>(sc[mt][2 * np], a[mt], b[0], b[1]);
                                mma16816<T>(sc[mt][2 * np + 1], a[mt], b[2], b[3]);
                            }
                        }
                    }
                }
    #pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    float al0, al1;
                    if constexpr (decltype(masked)::value) {
                        if (TM >= 2 && cur_tma) tma_masked(sc[mt], mt, j);
                        else mask_scores(sc[mt], mt, buf);
                    }
                    if (softmax_tile(sc[mt], mt, al0, al1)) rescale_o(mt, al0, al1);
                }
                /* O += P V */
                if constexpr (WG) {
                    /* P (bf16/f16) in the A-fragment layout, one 16-key k-step per 4 registers;
                       the registers stay live until the asynchronous MMAs are done */
                    uint32_t pa[NB / 2][4];
    #pragma unroll
                    for (int t = 0; t < NB / 2; t++) pack_p(sc[0], t, pa[t]);
                    wgmma_fence();
                    wg_pv(pa, bV);
                    wgmma_commit();
                    wgmma_wait_all();
                    if (TM == 2) { /* this warp is done with the buffer */
                        __syncwarp();
                        if (lane == 0) mbar_arrive(&ebar[buf]);
                    }
    #pragma unroll
                    for (int t = 0; t < NB / 2; t++)
    #pragma unroll
                        for (int e = 0; e < 4; e++) reg_keep(pa[t][e]);
                } else {
    #pragma unroll
                    for (int t = 0; t < NB / 2; t++) {
                        uint32_t a[MT][4];
    #pragma unroll
                        for (int mt = 0; mt < MT; mt++) pack_p(sc[mt], t, a[mt]);
    #pragma unroll
                        for (int np = 0; np < D / 16; np++) {
                            uint32_t b[4];
                            int key = t * 16 + (lane & 15), ch = np * 2 + (lane >> 4);
                            ldmatrix_x4_trans(b, &bV[at(key, ch, BC)]);
    #pragma unroll
                            for (int mt = 0; mt < MT; mt++) {
                                mma16816<T>(o[mt][2 * np], a[mt], b[0], b[1]);
                                mma16816<T>(o[mt][2 * np + 1], a[mt], b[2], b[3]);
                            }
                        }
                    }
                }
            };
            if (need_cur) tile(std::true_type{});
            else tile(std::false_type{});
            /* TM 2: no CTA barrier while the next two tiles come by TMA (the
               buffers change hands through tbar / ebar, masks need no kpos) */
            int pos_unused;
            if (TM == 2 && (j + 1 >= ntiles || ((tma_pend >> (buf ^ 1)) & 1)) && tma_ok(j + 2, pos_unused)) {
                need_cur = need_next;
            } else {
                cp_async_wait_all();
                if (WG) fence_proxy_async();
                need_cur = __syncthreads_or(need_next);
            }
        }
    }
    /* ---- normalise and write */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = l_[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            int r = (warp * MT + mt) * 16 + (lane >> 2) + 8 * hf, tk = row_token(mt, hf);
            if (tk < 0) continue;
            if (p.nsplit > 1) { /* this split's share: O unnormalised, and the row's (max, sum) */
                const int nh = p.n_kv * p.G;
                const size_t row = ((size_t)blockIdx.y * p.nq + (tk - p.q_offset)) * nh + h0 + r / p.T;
                float *po = p.part + row * D;
#pragma unroll
                for (int nt = 0; nt < D / 8; nt++)
                    *(float2 *)(po + nt * 8 + (lane & 3) * 2) = make_float2(o[mt][nt][2 * hf], o[mt][nt][2 * hf + 1]);
                if ((lane & 3) == 0)
                    ((float2 *)(p.part + (size_t)p.nsplit * (size_t)p.nq * nh * D))[row] = make_float2(m_[mt][hf], l);
                continue;
            }
            float inv = l > 0.f ? 1.f / l : 0.f;
            int64_t base = (int64_t)(tk - p.q_offset) * p.o_ts + (int64_t)(h0 + r / p.T) * p.o_hs;
#pragma unroll
            for (int nt = 0; nt < D / 8; nt++) {
                int d = nt * 8 + (lane & 3) * 2;
                float x = o[mt][nt][2 * hf] * inv, y = o[mt][nt][2 * hf + 1] * inv;
                if (!VEC) { /* element-aligned output, odd strides */
                    if (p.out_dtype == EI_F32) {
                        ((float *)p.out)[base + d] = x;
                        ((float *)p.out)[base + d + 1] = y;
                    } else if (p.out_dtype == EI_BF16) {
                        ((__nv_bfloat16 *)p.out)[base + d] = __float2bfloat16_rn(x);
                        ((__nv_bfloat16 *)p.out)[base + d + 1] = __float2bfloat16_rn(y);
                    } else {
                        ((__half *)p.out)[base + d] = __float2half_rn(x);
                        ((__half *)p.out)[base + d + 1] = __float2half_rn(y);
                    }
                } else if (p.out_dtype == EI_F32) {
                    *(float2 *)((float *)p.out + base + d) = make_float2(x, y);
                } else if (p.out_dtype == EI_BF16) {
                    *(__nv_bfloat162 *)((__nv_bfloat16 *)p.out + base + d) = __floats2bfloat162_rn(x, y);
                } else {
                    *(__half2 *)((__half *)p.out + base + d) = __floats2half2_rn(x, y);
                }
            }
        }
}

/* ---- The warp-specialised Hopper kernel (the default for head_dim 128,
   wgs128, and 256, wgz64; its variants: EI_CUDA_ATTN_CFG in >>cuda-tuning).
   FlashAttention-3's layout on our tiles: a persistent grid (one CTA per SM,
   the work items of attention_kernel's order dealt out round by round, every
   other round in reverse so that the heavy items spread evenly), three
   warpgroups per CTA, 128 query rows x 128 keys per step. Warpgroup 0 is the
   producer: setmaxnreg down to 40 registers, one warp issues every K tile
   and another every V tile by TMA (SPLIT; one warp both without it: a
   gathered tile's 32 boxes are issued lane by lane, and two warps issue them
   in half the time, which made the sparse segments 4-6% faster with dense
   unchanged), NST stages each for K and V with full (expect_tx) and empty
   (one arrival per consumer warp) mbarriers, running ahead into the next work
   item; it reads a tile's block numbers while it waits for the previous tile's
   V stage. Tiles (GL, the default): [16 groups][D/64 slabs][8 keys][128
   bytes], so that one rank-4 box brings an 8-key group with both slabs (a
   gathered tile: 16 boxes for K, 16 for V) and one rank-5 box a run of 16
   whole groups (a dense tile); without GL the tiles are [slab][128 keys] (one
   box per slab for a run, one per group and slab for a gathered tile: 64 boxes
   per K and V tile). Warpgroups 1 and 2 are consumers of 64 rows each
   (setmaxnreg up to 232): Q by cp.async, then inside each one S(j) = Q K_j^T
   is issued with O += P(j-1) V(j-1) and the softmax of S(j) runs while P V is
   in the tensor cores (first S and last P V peeled, as in attention_kernel's
   TM 4); with PP the two consumers take turns issuing their products (named
   barriers 1 and 2), so that one's softmax overlaps the other's matrix
   products. Every tile comes by TMA: the causal end and keys past it are
   masked by key index (boxes past the tensor's end are zero-filled), kept
   blocks that are not before their segment (a corrupt device plan) are loaded
   from key 0 and masked (kmask). Needs block_size % 8 == 0 and head_dim 128
   (wgs128) or 256 (wgz64 / wgs64: 64 keys per step, two stages, O += P V as
   one m64n256k16, setmaxnreg 24 / 240; the default, wgz64, without
   ping-pong, which gained nothing there); other calls run wgk64 (head_dim
   256: wgi64).
   Why this shape: a producer warp with full/empty mbarriers lets the two
   consumers run without a CTA barrier per step, so their products can
   ping-pong; TMA box count is what limits gathered tiles (many small boxes
   cost), hence the group layout: one box per kept 8-token block and slab
   pair. Measurements (dense and sparse against SDPA, the ablation of each
   choice): docs/performance.md, "NVIDIA H200", the current table. */
#ifdef EI_WGMMA
/* registers a thread: the producer warpgroup's and the consumers' (128 x P + 256 x C <= 64 Ki); head_dim
   256's consumers hold O as 128 registers and need FlashAttention-3's 24 / 240 split */
template <int D> __device__ __forceinline__ void setmaxnreg_producer() {
    if constexpr (D == 256) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    else asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
}
template <int D> __device__ __forceinline__ void setmaxnreg_consumer() {
    if constexpr (D == 256) asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
}
#else
template <int D> __device__ __forceinline__ void setmaxnreg_producer() {}
template <int D> __device__ __forceinline__ void setmaxnreg_consumer() {}
#endif
/* One work item of an attention launch: rows (query heads h0 .. h0+hc-1 x
   tokens t0 .. t1-1) of kv head kvh, their key list and its tiles. */
struct AttnItem {
    KeyList kl;
    int t0, t1, h0, hc, kvh, ntiles;
};
/* Work item w in attention_kernel's order (segments from the last down);
   false when it holds no rows or belongs to the other kernel (seg_mode). */
__device__ __forceinline__ bool attn_item(const AttnParams &p, int w, int BC, AttnItem &it) {
    int tile = p.tiles_per_seg - 1 - w % p.tiles_per_seg;
    w /= p.tiles_per_seg;
    int chunk = w % p.chunks;
    w /= p.chunks;
    it.kvh = w % p.n_kv;
    int s = p.s_last - w / p.n_kv;
    int64_t seg_lo = max((int64_t)s * p.seg, p.q_offset), seg_hi = min((int64_t)(s + 1) * p.seg, p.q_offset + p.nq);
    it.t0 = (int)(seg_lo + (int64_t)tile * p.T);
    if (it.t0 >= seg_hi) return false;
    it.t1 = (int)min((int64_t)it.t0 + p.T, seg_hi);
    it.h0 = it.kvh * p.G + chunk * p.HC;
    it.hc = min(p.HC, p.G - chunk * p.HC);
    bool sparse = s < p.plan_nseg && ei__segment_sparse(&p.cfg, s, p.plan_nseg, p.plan_final);
    if (p.seg_mode && (p.seg_mode == 2) != sparse) return false;
    it.kl.bs = p.bs;
    it.kl.seg_first_block = (int)(((int64_t)s * p.seg) / p.bs);
    if (sparse) {
        int kc = p.keep_count[(int64_t)it.kvh * p.seg_stride + s];
        kc = max(0, min(kc, p.max_keep));
        it.kl.brow = p.block_index + ((int64_t)it.kvh * p.seg_stride + s) * p.max_keep;
        it.kl.kept_len = kc * p.bs;
        it.kl.base_pos = s * p.seg;
    } else {
        it.kl.brow = p.block_index;
        it.kl.kept_len = 0;
        it.kl.base_pos = 0;
    }
    it.kl.own_len = it.t1 - it.kl.base_pos;
    it.ntiles = (it.kl.kept_len + it.kl.own_len + BC - 1) / BC;
    return true;
}
/* this warp's arrival on an mbarrier (lane 0, after the whole warp got here) */
__device__ __forceinline__ void warp_arrive(uint64_t *bar) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
}
/* Keys per step of attention_ws_kernel: 128, and 64 for head_dim 256, whose consumers hold O as 64 x 256
   f32 (128 registers a thread of their 240) and whose Q rows and two K/V stages fill 193 KiB. */
__host__ __device__ constexpr int attn_ws_bc(int D) { return D == 256 ? 64 : 128; }
template <int D, typename T, bool PP, int NST, bool GALL, bool GL, bool SPLIT>
__global__ void __launch_bounds__(384, 1) attention_ws_kernel(const AttnParams p, const __grid_constant__ AttnMaps tm) {
    constexpr int BC = attn_ws_bc(D), ROWS = 128, CH = D / 8, NB = BC / 8, NS = D / 64;
    static_assert(D == 64 || D == 128 || (D == 256 && GL), "head_dim 64 / 128, or 256 on group-interleaved tiles");
    extern __shared__ uint4 smem_raw[];
    uint4 *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u) / 16;
    uint4 *sQ = smem, *sK = smem + ROWS * CH, *sV = sK + NST * BC * CH; /* [stage][slab][BC rows][8 chunks] */
    __shared__ uint64_t kfull[NST], vfull[NST], kempty[NST], vempty[NST];
    __shared__ uint32_t kmask[NST]; /* per K stage: the 8-key groups to mask (kept blocks not before the segment) */
    if (*p.bad != ~0ull) return; /* NaN/Inf in q or k: EI_ERR_NONFINITE, nothing written */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
#pragma unroll
        for (int b = 0; b < NST; b++) {
            mbar_init(&kfull[b], 1);
            mbar_init(&vfull[b], 1);
            mbar_init(&kempty[b], 8);
            mbar_init(&vempty[b], 8);
        }
    }
    __syncthreads();
    /* this CTA's r-th work item: round r, reversed on odd rounds */
    auto work = [&](int r) -> int {
        int g = (int)gridDim.x, b = (int)blockIdx.x;
        return r * g + ((r & 1) ? g - 1 - b : b);
    };
    if (warp < 4) {
        /* ---- producer: warp 0 copies every tile (SPLIT: warp 0 the K tiles, warp 1 the
           V tiles), the other warps leave */
        setmaxnreg_producer<D>();
        if (warp > (SPLIT ? 1 : 0)) return;
        const bool do_k = !SPLIT || warp == 0, do_v = !SPLIT || warp == 1;
        uint32_t it = 0;
        const int g = lane % NB; /* this lane's 8-key group of a tile (lanes NB..31 repeat 0..NB-1) */
        for (int r = 0; work(r) < p.nwork; r++) {
            AttnItem w;
            if (!attn_item(p, work(r), BC, w)) continue;
            /* the block number of group g of tile j (read a tile ahead: its latency
               overlaps the wait for a free V stage), then the tile's boxes */
            auto block_of = [&](int j) -> int {
                int i = j * BC + 8 * g;
                return i < w.kl.kept_len ? w.kl.brow[i / w.kl.bs] : 0;
            };
            int blk = block_of(0);
            for (int j = 0; j < w.ntiles; j++, it++) {
                int i = j * BC + 8 * g, pos;
                bool ok = true;
                if (i < w.kl.kept_len) {
                    ok = blk >= 0 && blk < w.kl.seg_first_block;
                    pos = ok ? blk * w.kl.bs + i % w.kl.bs : 0;
                } else
                    pos = w.kl.base_pos + (i - w.kl.kept_len);
                int pos0 = __shfl_sync(0xffffffffu, pos, 0);
                bool contig = !GALL && __all_sync(0xffffffffu, pos == pos0 + 8 * g);
                uint32_t bad = __ballot_sync(0xffffffffu, !ok) & ((1u << NB) - 1u);
                int st = it % NST;
                uint32_t ph = (it / NST) & 1;
                auto load = [&](uint4 *dst, const CUtensorMap *mt, const CUtensorMap *m8, uint64_t *full, uint64_t *empty,
                                bool isk) {
                    mbar_wait(empty, ph ^ 1);
                    if (lane == 0) {
                        if (isk) kmask[st] = bad;
                        mbar_arrive_expect_tx(full, (unsigned)(BC * D * sizeof(T)));
                    }
                    __syncwarp();
                    if (GL) { /* [group][slab][8 keys]: a run of NB whole groups, else a box per group */
                        if (contig && !(pos0 & 7) && pos0 / 8 + NB <= tm.run_groups) {
                            if (lane == 0) tma_load5(dst, mt, 0, 0, 0, pos0 / 8, w.kvh, full);
                        } else if (lane < NB) {
                            tma_load4(dst + g * NS * 64, m8, 0, pos, 0, w.kvh, full);
                        }
                    } else if (contig) { /* [slab][BC keys] */
                        if (lane < NS) tma_load3(dst + lane * BC * 8, mt, lane * 64, w.kvh, pos0, full);
                    } else if (lane < NS * 16) {
                        tma_load3(dst + (lane >> 4) * BC * 8 + g * 64, m8, (lane >> 4) * 64, w.kvh, pos, full);
                    }
                };
                if (do_k)
                    load(sK + st * BC * CH, GL ? &tm.k_run : &tm.k_tile, GL ? &tm.k_g : &tm.k_8, &kfull[st], &kempty[st], true);
                if (j + 1 < w.ntiles) blk = block_of(j + 1);
                if (do_v)
                    load(sV + st * BC * CH, GL ? &tm.v_run : &tm.v_tile, GL ? &tm.v_g : &tm.v_8, &vfull[st], &vempty[st], false);
            }
        }
        return;
    }
    /* ---- consumers: warpgroup cw owns rows cw*64 .. cw*64+63 */
    setmaxnreg_consumer<D>();
    const int cw = (warp >> 2) - 1, ltid = tid & 127;
    if (PP && cw == 1) named_arrive(1, 256); /* warpgroup 0 issues first */
    float o[D / 8][4], sc[NB][4];
    uint32_t pa[NB / 2][4];
    const float sl = p.scale_log2;
    uint32_t it = 0;
    for (int r = 0; work(r) < p.nwork; r++) {
        AttnItem w;
        if (!attn_item(p, work(r), BC, w)) continue;
        /* Q rows of this warpgroup (padding rows zero) */
        for (int c = ltid; c < 64 * CH; c += 128) {
            int row = cw * 64 + c / CH, ch = c % CH;
            int hr = row / p.T, tok = w.t0 + row % p.T;
            uint4 *dst = &sQ[(ch >> 3) * ROWS * 8 + row * 8 + ((ch & 7) ^ (row & 7))];
            if (hr < w.hc && tok < w.t1)
                load16_q<T>(dst, p.q, (tok - p.q_offset) * p.q_ts + (int64_t)(w.h0 + hr) * p.q_hs + ch * 8, p.q_f32, 1);
            else
                *dst = make_uint4(0, 0, 0, 0);
        }
        cp_async_commit();
        cp_async_wait_all();
        fence_proxy_async();
        named_sync(3 + cw, 128);
        int tk[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            int rr = cw * 64 + (warp & 3) * 16 + (lane >> 2) + 8 * hf;
            tk[hf] = (rr / p.T < w.hc && w.t0 + rr % p.T < w.t1) ? w.t0 + rr % p.T : -1;
        }
#pragma unroll
        for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
        /* the products: S = Q K^T (D/16 k-steps), O += P V (BC/16 k-steps) */
        auto qk = [&](int st) {
            const char *q0 = (const char *)sQ + cw * 64 * 128, *k0 = (const char *)(sK + st * BC * CH);
            if constexpr (D == 256) {
                /* head_dim 256: each k-step's descriptors as the stage's base plus the step's offset
                   (16-byte units in the address field), the base hidden from the optimiser, so that
                   the 32 descriptors are not hoisted out of the key loop into 64 registers: with O
                   that left too few for the products (ptxas: serialised wgmma, spills) */
                uint64_t qd = wgmma_desc(q0, 16, 1024), kd = gl_k_desc(k0, 0, NS);
                asm volatile("" : "+l"(qd), "+l"(kd));
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++)
                    wgmma_ss<BC, T>(sc, qd + (uint64_t)(((kk >> 2) * ROWS * 128 + (kk & 3) * 32) >> 4),
                                    kd + (uint64_t)(((kk >> 2) * 1024 + (kk & 3) * 32) >> 4), kk > 0);
            } else {
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++)
                    wgmma_ss<BC, T>(sc, wgmma_desc(q0 + (kk >> 2) * ROWS * 128 + (kk & 3) * 32, 16, 1024),
                                    GL ? gl_k_desc(k0, kk, NS)
                                       : wgmma_desc(k0 + (kk >> 2) * BC * 128 + (kk & 3) * 32, 16, 1024), kk > 0);
            }
        };
        auto pv = [&](int st) {
            const char *v0 = (const char *)(sV + st * BC * CH);
            if constexpr (D == 256) {
                /* one m64n256k16 per 16 keys over V's four slabs, descriptors from a hidden base as in
                   qk: two m64n128k16 on halves of O (attention_kernel's wg_pv) made ptxas copy 64
                   accumulator registers between them every step and serialise the products */
                uint64_t vd = gl_v_desc(v0, 0, 0, NS);
                asm volatile("" : "+l"(vd));
#pragma unroll
                for (int t = 0; t < NB / 2; t++) wgmma_rs<256, T>(o, pa[t], vd + (uint64_t)((t * 2 * NS * 1024) >> 4));
            } else {
#pragma unroll
                for (int t = 0; t < NB / 2; t++)
                    wgmma_rs<D, T>(o, pa[t], GL ? gl_v_desc(v0, t, 0, NS) : wgmma_desc(v0 + t * 16 * 128, BC * 128, 1024));
            }
        };
        /* mask: own keys past a row's token, and the groups kmask names */
        auto mask = [&](int j, uint32_t km) {
            int last = j * BC + BC - 1 - w.kl.kept_len;
            if (!km && !(last >= 0 && w.kl.base_pos + last > w.t0)) return;
            int first = j * BC - w.kl.kept_len;
#pragma unroll
            for (int nt = 0; nt < NB; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int i = first + nt * 8 + (lane & 3) * 2 + (e & 1);
                    if (((km >> nt) & 1) || (i >= 0 && w.kl.base_pos + i > tk[e >> 1])) sc[nt][e] = -INFINITY;
                }
        };
        /* online softmax of sc in place (online_softmax) */
        auto softmax = [&](float &al0, float &al1) -> bool { return online_softmax(sc, m0, m1, l0, l1, sl, al0, al1); };
        auto pack = [&]() {
#pragma unroll
            for (int t = 0; t < NB / 2; t++) {
                pa[t][0] = pack2<T>(sc[2 * t][0], sc[2 * t][1]);
                pa[t][1] = pack2<T>(sc[2 * t][2], sc[2 * t][3]);
                pa[t][2] = pack2<T>(sc[2 * t + 1][0], sc[2 * t + 1][1]);
                pa[t][3] = pack2<T>(sc[2 * t + 1][2], sc[2 * t + 1][3]);
            }
        };
        auto keep_pa = [&]() {
#pragma unroll
            for (int t = 0; t < NB / 2; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) reg_keep(pa[t][e]);
        };
        /* tile 0: S, mask, softmax (O is zero: nothing to rescale), P */
        int st = it % NST;
        uint32_t ph = (it / NST) & 1;
        {
            mbar_wait(&kfull[st], ph);
            uint32_t km = kmask[st];
            if (PP) named_sync(1 + cw, 256);
            wgmma_fence();
            qk(st);
            wgmma_commit();
            if (PP) named_arrive(2 - cw, 256);
            wgmma_wait<0>();
            acc_fence(sc);
            warp_arrive(&kempty[st]);
            mask(0, km);
            float al0, al1;
            softmax(al0, al1);
            pack();
        }
        for (int j = 1; j < w.ntiles; j++) {
            int ps = st;
            uint32_t pph = ph;
            st = (it + j) % NST;
            ph = ((it + j) / NST) & 1;
            mbar_wait(&kfull[st], ph);
            uint32_t km = kmask[st];
            mbar_wait(&vfull[ps], pph);
            acc_fence(o);
            if (PP) named_sync(1 + cw, 256);
            wgmma_fence();
            qk(st);
            wgmma_commit();
            pv(ps);
            wgmma_commit();
            if (PP) named_arrive(2 - cw, 256);
            wgmma_wait<1>(); /* S(j) done; P(j-1) V(j-1) may still run */
            acc_fence(sc);
            warp_arrive(&kempty[st]);
            mask(j, km);
            float al0 = 1.f, al1 = 1.f;
            bool moved = softmax(al0, al1);
            wgmma_wait<0>();
            acc_fence(o);
            keep_pa();
            warp_arrive(&vempty[ps]);
            if (moved) {
#pragma unroll
                for (int i = 0; i < D / 8; i++) {
                    o[i][0] *= al0; o[i][1] *= al0;
                    o[i][2] *= al1; o[i][3] *= al1;
                }
            }
            pack();
        }
        /* the last tile's P V */
        mbar_wait(&vfull[st], ph);
        acc_fence(o);
        if (PP) named_sync(1 + cw, 256);
        wgmma_fence();
        pv(st);
        wgmma_commit();
        if (PP) named_arrive(2 - cw, 256);
        wgmma_wait<0>();
        acc_fence(o);
        keep_pa();
        warp_arrive(&vempty[st]);
        it += w.ntiles;
        /* ---- normalise and write */
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = hf ? l1 : l0;
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            int rr = cw * 64 + (warp & 3) * 16 + (lane >> 2) + 8 * hf;
            if (tk[hf] < 0) continue;
            float inv = l > 0.f ? 1.f / l : 0.f;
            int64_t base = (int64_t)(tk[hf] - p.q_offset) * p.o_ts + (int64_t)(w.h0 + rr / p.T) * p.o_hs;
#pragma unroll
            for (int nt = 0; nt < D / 8; nt++) {
                int d = nt * 8 + (lane & 3) * 2;
                float x = o[nt][2 * hf] * inv, y = o[nt][2 * hf + 1] * inv;
                if (p.out_dtype == EI_F32) *(float2 *)((float *)p.out + base + d) = make_float2(x, y);
                else if (p.out_dtype == EI_BF16)
                    *(__nv_bfloat162 *)((__nv_bfloat16 *)p.out + base + d) = __floats2bfloat162_rn(x, y);
                else
                    *(__half2 *)((__half *)p.out + base + d) = __floats2half2_rn(x, y);
            }
        }
    }
    if (PP && cw == 0) named_sync(1, 256); /* warpgroup 1's last turn handed over */
}
/* Split-K's merge: one CTA per (token, head) row of the call. The splits' (max, sum) give each
   split's weight 2^((m_s - M) * scale_log2) (M the largest max); O = sum of w_s O_s / sum of
   w_s l_s, in split order (reproducible); a row no key reached is 0, as without the split. */
__global__ void __launch_bounds__(128) attn_split_combine_kernel(const AttnParams p) {
    if (*p.bad != ~0ull) return; /* the attention kernels did nothing: neither does the merge */
    const int nh = p.n_kv * p.G, D = p.D;
    const size_t rows = (size_t)p.nq * nh, row = blockIdx.x;
    const float2 *ml = (const float2 *)(p.part + (size_t)p.nsplit * rows * D);
    float M = -INFINITY;
    for (int s = 0; s < p.nsplit; s++) {
        float2 x = ml[s * rows + row];
        if (x.y > 0.f) M = fmaxf(M, x.x);
    }
    float L = 0.f;
    for (int s = 0; s < p.nsplit; s++) {
        float2 x = ml[s * rows + row];
        if (x.y > 0.f) L += exp2f((x.x - M) * p.scale_log2) * x.y;
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
    const int64_t tok = (int64_t)(row / nh), h = (int64_t)(row % nh);
    const int64_t base = tok * p.o_ts + h * p.o_hs;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        for (int s = 0; s < p.nsplit; s++) {
            float2 x = ml[s * rows + row];
            if (x.y > 0.f) acc += exp2f((x.x - M) * p.scale_log2) * p.part[(s * rows + row) * D + d];
        }
        const float y = acc * inv;
        if (p.out_dtype == EI_F32) ((float *)p.out)[base + d] = y;
        else if (p.out_dtype == EI_BF16) ((__nv_bfloat16 *)p.out)[base + d] = __float2bfloat16_rn(y);
        else ((__half *)p.out)[base + d] = __float2half_rn(y);
    }
}
static int sm_count(void) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        n <= 0)
        n = 132;
    return n;
}
template <int D, typename T, bool PP, int NST, bool GALL, bool GL, bool SPLIT>
static ei_result launch_attention_ws(const AttnParams &p, const AttnMaps *maps, unsigned grid, cudaStream_t st, char *msg) {
    size_t smem = (size_t)(128 + 2 * NST * attn_ws_bc(D)) * D * 2 + 1024;
    CUDA_TRY(cudaFuncSetAttribute(attention_ws_kernel<D, T, PP, NST, GALL, GL, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
    AttnParams q = p;
    q.nwork = (int)grid;
    unsigned ctas = std::min(grid, (unsigned)sm_count());
    attention_ws_kernel<D, T, PP, NST, GALL, GL, SPLIT><<<ctas, 384, smem, st>>>(q, *maps);
    LAUNCH_CHECK("attention_ws_kernel");
    return EI_OK;
}

template <int D, int NW, int MT, int BC, typename T, bool WG = false, bool VEC = true, int TM = 0>
static ei_result launch_attention(const AttnParams &p, const AttnMaps *maps, unsigned grid, cudaStream_t st, char *msg) {
    size_t smem = WG ? (size_t)(16 * NW * MT + 2 * attn_kv_stages(TM) * BC) * D * 2 + 1024
                     : (size_t)(16 * NW * MT + 4 * BC) * (D <= 128 ? D + 8 : D) * 2;
    CUDA_TRY(cudaFuncSetAttribute(attention_kernel<D, NW, MT, BC, T, WG, VEC, TM>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    typename std::conditional<(TM > 0), AttnMaps, AttnNoMaps>::type tm;
    if constexpr (TM > 0) tm = *maps;
    else {
        (void)maps;
        tm.unused = 0;
    }
    attention_kernel<D, NW, MT, BC, T, WG, VEC, TM><<<dim3(grid, (unsigned)std::max(p.nsplit, 1)), NW * 32, smem, st>>>(p, tm);
    LAUNCH_CHECK("attention_kernel");
    return EI_OK;
}

/* The TMA kernels' tensor maps of K and V (attention_kernel, TMA): rank 3
   (head_dim, kv heads, tokens), 64-column boxes of bc and of 8 keys, 128-byte
   swizzle. The encoder comes from the driver through the runtime (no link
   against libcuda). False when the views do not allow it (alignment,
   strides) or the encoder is missing: the call then runs the cp.async kernel. */
typedef CUresult (*ei_encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                       const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                       CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static ei_encode_tiled_fn encode_tiled(void) {
    static std::atomic<int> state{0}; /* 0 unknown, 1 missing, 2 found */
    static std::atomic<ei_encode_tiled_fn> fn{nullptr};
    int s = state.load();
    if (s == 0) {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = NULL;
        (void)cudaGetLastError();
        fn.store((ei_encode_tiled_fn)f);
        state.store(f ? 2 : 1);
        s = f ? 2 : 1;
    }
    return s == 2 ? fn.load() : nullptr;
}
static bool attn_map_one(ei_encode_tiled_fn enc, CUtensorMap *m, const ei_tensor *t, int D, bool bf, int rows) {
    int64_t ts = t->token_stride * 2, hs = t->head_stride * 2;
    if (t->n_heads == 1) hs = ts; /* a dimension of 1: never stepped */
    if (((uintptr_t)t->data & 15) || ts <= 0 || (ts & 15) || hs <= 0 || (hs & 15) || ts >= (1ll << 40) ||
        hs >= (1ll << 40) || t->n_tokens <= 0 || t->n_tokens >= (1ll << 31))
        return false;
    cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)t->n_heads, (cuuint64_t)t->n_tokens};
    cuuint64_t strides[2] = {(cuuint64_t)hs, (cuuint64_t)ts};
    cuuint32_t box[3] = {64, 1, (cuuint32_t)rows}, estr[3] = {1, 1, 1};
    return enc(m, bf ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, (void *)t->data, dims,
               strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
/* The group-interleaved tiles (GL: attention_ws_kernel, and attention_kernel's TM 6): a tile is [run
   groups][D/64 slabs][8 keys][128 bytes], so that one box brings an 8-key group with every slab: rank 4
   (64 columns, tokens, slabs 128 bytes apart, heads), box (64, 8, D/64, 1); and a run of `run` whole
   groups (a tile's keys per step / 8): rank 5 (64 columns, 8 keys, slabs, groups of 8 keys, heads), box
   (64, 8, D/64, run, 1), over the tensor's whole groups only (a partial last group would read past its
   end: those tiles take the rank-4 boxes). */
static bool attn_map_gl(ei_encode_tiled_fn enc, CUtensorMap *g, CUtensorMap *run, const ei_tensor *t, int D, bool bf,
                        int run_len, int *run_groups) {
    int64_t ts = t->token_stride * 2, hs = t->head_stride * 2, ns = D / 64;
    if (t->n_heads == 1) hs = ts;
    if (((uintptr_t)t->data & 15) || ts <= 0 || (ts & 15) || hs <= 0 || (hs & 15) || ts * 8 >= (1ll << 40) ||
        hs >= (1ll << 40) || t->n_tokens <= 0 || t->n_tokens >= (1ll << 31))
        return false;
    CUtensorMapDataType dt = bf ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    cuuint64_t d4[4] = {64, (cuuint64_t)t->n_tokens, (cuuint64_t)ns, (cuuint64_t)t->n_heads};
    cuuint64_t s4[3] = {(cuuint64_t)ts, 128, (cuuint64_t)hs};
    cuuint32_t b4[4] = {64, 8, (cuuint32_t)ns, 1}, e4[4] = {1, 1, 1, 1};
    if (enc(g, dt, 4, (void *)t->data, d4, s4, b4, e4, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return false;
    int64_t groups = t->n_tokens / 8;
    *run_groups = (int)groups;
    if (groups < 1) return true; /* no whole group: every tile by rank-4 boxes */
    cuuint64_t d5[5] = {64, 8, (cuuint64_t)ns, (cuuint64_t)groups, (cuuint64_t)t->n_heads};
    cuuint64_t s5[4] = {(cuuint64_t)ts, 128, (cuuint64_t)ts * 8, (cuuint64_t)hs};
    cuuint32_t b5[5] = {64, 8, (cuuint32_t)ns, (cuuint32_t)run_len, 1}, e5[5] = {1, 1, 1, 1, 1};
    if (enc(run, dt, 5, (void *)t->data, d5, s5, b5, e5, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        *run_groups = 0; /* rank-4 boxes only */
    return true;
}
static bool attn_maps_gl(const ei_tensor *k, const ei_tensor *v, int D, bool bf, int run_len, AttnMaps *m) {
    ei_encode_tiled_fn enc = encode_tiled();
    int rk = 0, rv = 0;
    if (!enc || !attn_map_gl(enc, &m->k_g, &m->k_run, k, D, bf, run_len, &rk) ||
        !attn_map_gl(enc, &m->v_g, &m->v_run, v, D, bf, run_len, &rv))
        return false;
    m->run_groups = std::min(rk, rv);
    return true;
}
static bool attn_maps(const ei_tensor *k, const ei_tensor *v, int D, int bc, bool bf, AttnMaps *m) {
    ei_encode_tiled_fn enc = encode_tiled();
    return enc && attn_map_one(enc, &m->k_tile, k, D, bf, bc) && attn_map_one(enc, &m->v_tile, v, D, bf, bc) &&
           attn_map_one(enc, &m->k_8, k, D, bf, 8) && attn_map_one(enc, &m->v_8, v, D, bf, 8);
}

/* The tensor maps of the kernel of shape code wgk (attention_shape's *wg; keys per step bc), or NULL for
   the cp.async kernels or views the maps cannot describe. The group-interleaved kernels (wgk 12..15,
   and 16: head_dim 256's wgi64) need attn_maps_gl's too: without them the call runs the same kernel on
   slab tiles (*e = "wgx128" / "wgk64"). */
static const AttnMaps *attn_maps_for(int wgk, const ei_tensor *k, const ei_tensor *v, int D, int bc, bool bf, AttnMaps *m,
                                     const char **e) {
    if (wgk < 2 || !attn_maps(k, v, D, bc, bf, m)) return NULL;
    if (wgk >= 12 && !attn_maps_gl(k, v, D, bf, bc / 8, m)) *e = wgk == 16 || D == 256 ? "wgk64" : "wgx128";
    return m;
}

/* Whether the wgmma kernels can run on the current device: a Hopper GPU
   (sm_90) running this library's sm_90a code (not PTX compiled for it at load
   time, which has no wgmma). Cached per device ordinal; racing callers store
   the same answer. */
static bool wgmma_available(void) {
    static int known[64]; /* 0 unknown, 1 no, 2 yes */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return false;
    if (dev < 64 && known[dev]) return known[dev] == 2;
    cudaDeviceProp prop;
    cudaFuncAttributes fa;
    bool ok = cudaGetDeviceProperties(&prop, dev) == cudaSuccess && prop.major == 9 && prop.minor == 0 &&
              cudaFuncGetAttributes(&fa, attention_kernel<128, 8, 1, 128, __nv_bfloat16, true, true, 0>) == cudaSuccess &&
              fa.binaryVersion == 90;
    if (dev < 64) known[dev] = ok ? 2 : 1;
    return ok;
}

/* CTA shape: warps x m-tiles per warp (rows = 16 x both) x keys per step,
   and whether the products run as wgmma (*wg).
   Default on Hopper for head_dim 128: attention_ws_kernel (wgs128: TMA
   producer warps for K and for V, two consumer warpgroups of 64 rows with
   ping-pong, 128 keys per step, three K/V stages, group-interleaved tiles, a
   persistent grid; *wg = 15); api_attention runs wgk64 instead when the block size is
   not a multiple of 8, and wgx128 when the group maps cannot be encoded.
   For head_dim 64: wgmma, 8 warps (2 warpgroups of 64
   rows) x 64 keys, 2 CTAs per SM, K/V tiles by TMA (wgk64; *wg = 4; wg64
   where the tensor maps cannot describe the views); for 256 the same at one
   CTA per SM. Elsewhere mma.sync, 8x2x64 for head_dim <= 128 (fastest on an
   H200 before wgmma), 4x1x64 for 256.
   e: the knob EI_CUDA_ATTN_CFG (its names and what each variant is:
   >>cuda-tuning); *wg by name: wg 1, wgt 2, wgp 3, wgk 4, wgo 5, wgq 6
   (attention_kernel with TM = *wg - 1), wgw 7, wgv 8, wgx 9, wgu 10, wgg 11, wgy 12,
   wgh 13, wgz 14, wgs 15 (attention_ws_kernel); "WxMxB": mma.sync (*wg 0). */
/* Whether shape code wgk is attention_ws_kernel's (7 .. 15; 16, wgi64, is attention_kernel's). Until
   2026-12-07 the checks below read wgk >= 7, which sent wgi64 to wgk64 (and off split-K): every
   "wgi64" measurement before then ran wgk64. */
static inline bool attn_is_ws(int wgk) { return wgk >= 7 && wgk <= 15; }
/* Head_dim 256's default shape code on Hopper: wgz64 (14: wgs64, 15, without ping-pong; api_attention
   runs wgi64, 16, where split-K would cut the work items). Against wgk64 (4, the default until
   2026-12-07) on an H100: dense 1.2-1.3x and sparse 1.5-3.1x faster; against wgs64 the same or up to
   11% faster (docs/performance.md, "head_dim 256 on the warp-specialised kernel"). */
#define ATTN_D256_DEFAULT 14
/* The sparse segments' kernel when no variable names one (NULL: the dense one's). */
#define ATTN_SPARSE_DEFAULT NULL
static void attention_shape(int D, const char *e, int *nw, int *mt, int *bc, int *wg) {
    *nw = 8;
    *mt = 2;
    *bc = 64;
    *wg = 0;
    const bool wgmma = wgmma_available() && !(e && e[0] && e[1] == 'x'); /* "WxMxB" names mma.sync */
    if (D == 256) {
        /* mma.sync 4x1x64; on Hopper wgmma, 2 warpgroups x 64 keys, one CTA per SM (shared memory:
           128 Q rows and two K/V stages of 64 keys are 193 KiB): wgz64 (attention_ws_kernel: a
           producer warpgroup, two consumer warpgroups, group-interleaved tiles, *wg = 14: the
           default, ATTN_D256_DEFAULT; api_attention runs wgi64 instead when split-K would cut the
           work items), wgs64 (the same with ping-pong, *wg = 15), wgi64 (attention_kernel, TMA,
           group-interleaved tiles, *wg = 16), wgk64 (TMA, slab tiles, *wg = 4) or wg64 (cp.async,
           *wg = 1) */
        *nw = wgmma ? 8 : 4;
        *mt = 1;
        if (wgmma)
            *wg = !e || !e[0] ? ATTN_D256_DEFAULT : !strcmp(e, "wg64") ? 1 : !strcmp(e, "wgi64") ? 16
                : !strcmp(e, "wgs64") ? 15 : !strcmp(e, "wgz64") ? 14 : !strcmp(e, "wgk64") ? 4 : ATTN_D256_DEFAULT;
        return;
    }
    if (wgmma) {
        /* default: wgk64 (TMA); "wg64" / "wg128": cp.async only */
        size_t n = e ? strlen(e) : 0;
        bool w = n >= 2 && e[0] == 'w' && e[1] == 'g';
        *wg = !w ? (D == 128 ? 15 : 4) : e[2] == 't' ? 2 : e[2] == 'p' ? 3 : e[2] == 'k' ? 4 : e[2] == 'o' ? 5 : e[2] == 'q' ? 6
            : e[2] == 'w' ? 7 : e[2] == 'v' ? 8 : e[2] == 'x' ? 9 : e[2] == 'u' ? 10 : e[2] == 'g' ? 11
            : e[2] == 'y' ? 12 : e[2] == 'h' ? 13 : e[2] == 'z' ? 14 : e[2] == 's' ? 15 : 1;
        *mt = 1;
        *bc = (w && n >= 3 && !strcmp(e + n - 3, "128")) || *wg == 15 ? 128 : 64;
        if (*wg >= 5 && D == 64) *bc = 128; /* wgo / wgq: built with 128 keys per step for head_dim 64 */
        if (*wg >= 6) *bc = 128; /* wgq / wgw / wgv: 128 keys per step */
        return;
    }
    if (e && e[0] && e[1] == 'x') {
        *nw = e[0] == '4' ? 4 : 8;
        *mt = e[2] == '2' ? 2 : 1;
        *bc = (e[3] == 'x' && e[4] == '3' && *mt == 2 && D == 128) ? 32 : 64;
    }
}


/* With deferred errors the call's two scan reports live in the workspace (a
   graph replays its own, never another call's slot). For head_dim 64 and 256
   the workspace also holds split-K's partial rows (attn_split_plan): a call
   whose work items fill fewer than half the SMs splits each item's key tiles
   over up to ATTN_SPLIT_MAX CTAs (llama.cpp's micro-batches of 512 queries
   and 4 heads: 32 CTAs on 132 SMs), about 2 CTAs per SM, so the partials of
   a call never exceed 2.5 x SMs x (rows per CTA) x (D + 2) floats (head_dim
   256 on Hopper: 128 rows per CTA, but one CTA per SM: SMs x 128 rows). A
   smaller workspace (0: none) is still accepted: the call then splits less,
   or not at all (the same outputs up to float32 summation order). */
#define ATTN_DEFERRED_WS 512
#define ATTN_SPLIT_MAX 16
static size_t attn_split_bound(int D) { /* rows per CTA and SM: at most 160 for head_dim 256, 256 for 64 */
    return (D == 64 || D == 256) ? (size_t)5 * sm_count() / 2 * (D == 256 ? 64 : 256) * (size_t)(D + 2) * sizeof(float) : 0;
}
static ei_result api_attention_workspace_size(const ei_config *cfg, int32_t nh, int32_t nkv, int32_t D,
                                              size_t *bytes, char *msg) {
    (void)nh; (void)nkv; (void)msg; (void)cfg;
    const size_t split = attn_split_bound(D);
    *bytes = split ? ATTN_DEFERRED_WS + split : deferred(cfg) ? ATTN_DEFERRED_WS : 0;
    return EI_OK;
}
/* Split-K for a launch of `grid` work items (attention_kernel only: not the persistent
   warp-specialised kernel, and block sizes that divide the keys per step, so that a split starts
   on a block): how many splits (1: none; EI_CUDA_ATTN_SPLIT=N caps it, 1 turns it off) and where
   the partial rows go (the workspace past its first 256 aligned bytes). */
static int attn_split_plan(const AttnParams &p, int D, int bc, bool ws_kernel, bool one_per_sm, unsigned grid,
                           void *ws, size_t ws_bytes, int split_cap, float **part) {
    *part = NULL;
    if (!ws || ws_kernel || (D != 64 && D != 256) || bc % p.bs) return 1;
    const int sms = sm_count();
    if ((int64_t)grid * 2 > sms) return 1;
    /* about 2 CTAs per SM; a kernel that holds a whole SM (head_dim 256's wgmma kernel: 193 KiB of
       shared memory) gets one wave, no ragged second one */
    int n = (int)std::min<int64_t>(one_per_sm ? sms / grid : (2 * (int64_t)sms + grid - 1) / grid, ATTN_SPLIT_MAX);
    const int64_t keys = p.q_offset + p.nq; /* a work item's longest key list */
    n = (int)std::min<int64_t>(n, keys / (4 * bc)); /* at least about 4 tiles a split */
    n = std::min(n, split_cap); /* EI_CUDA_ATTN_SPLIT (INT_MAX: unset) */
    char *base = ws_base(ws) + 256;
    if ((size_t)(base - (char *)ws) >= ws_bytes) return 1;
    const size_t avail = ws_bytes - (size_t)(base - (char *)ws);
    const size_t per = (size_t)p.nq * (size_t)(p.n_kv * p.G) * (size_t)(D + 2) * sizeof(float);
    n = (int)std::min<size_t>((size_t)std::max(n, 1), avail / per);
    if (n < 2) return 1;
    *part = (float *)base;
    return n;
}

/* ---- NaN/Inf in the rows a call reads (the CPU's EI_ERR_NONFINITE), before
   the attention kernel (which then does nothing): a memory-bound pass that
   leaves the tuned kernels' registers alone. The rows: every Q row of the
   call; the K rows of keys 0 .. dense_hi - 1 (the dense segments' keys up to
   their last query, which cover those of earlier dense segments); for each
   sparse segment, its kept blocks (as KeyList reads them) and its own keys
   up to its last query. The first pass reads every Q row and every K row up
   to the call's last query once; a bad K row past dense_hi only raises
   `suspect`, and only then does the second pass read the sparse segments'
   rows (every segment reads the blocks it keeps again), so that the scan
   costs dense calls nothing measurable and sparse ones a few percent (the
   times: docs/performance.md, H200 dated log, "kernel comments").
   Rows are read in 8-element chunks (16-byte loads where the view allows,
   vec). The first bad element goes to bad as attn_bad_key (q before k, then
   by token and head). */
struct ScanParams {
    const void *q, *k;
    int64_t q_ts, q_hs, k_ts, k_hs, q_offset, nq, dense_hi;
    int nh, nkv, D, vec_q, vec_k;
    int flat_q, flat_k; /* the rows are packed (token stride = heads x D, head stride = D): chunk u at u * 8 */
    int q_f32; /* q is f32: its chunks are rounded to T first (what the kernel reads) */
    ei_config cfg;
    int plan_nseg, plan_final, s_first;
    const int *keep_count, *block_index;
    int seg_stride, max_keep;
    unsigned long long *bad, *suspect; /* suspect: a bad K row the first pass cannot place (~0: none) */
};
template <typename T> __device__ __forceinline__ uint32_t scan_chunk(const T *src, int vec) {
    uint4 v;
    if (vec) v = *(const uint4 *)src;
    else {
        union { uint4 v; unsigned short h[8]; } u;
#pragma unroll
        for (int e = 0; e < 8; e++) u.h[e] = ((const unsigned short *)src)[e];
        v = u.v;
    }
    return nonfinite8<T>(v);
}
/* every Q row of the call, then the K rows of keys 0 .. q_end - 1: bad below
   dense_hi (read by a dense segment), suspect past it */
template <typename T> __global__ void __launch_bounds__(256) attn_scan_rows_kernel(const ScanParams p) {
    const int cpr = p.D / 8; /* chunks per row */
    const int64_t nq_chunks = p.nq * p.nh * cpr, total = nq_chunks + (p.q_offset + p.nq) * p.nkv * cpr;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int is_k = e >= nq_chunks;
        int64_t u = is_k ? e - nq_chunks : e;
        int nheads = is_k ? p.nkv : p.nh;
        /* chunk u's element offset: u * 8 where the rows are packed (flat: no divisions, which
           cost more than the load on the common layout), else from its token, head and chunk */
        auto offset = [&](int64_t ts, int64_t hs) -> int64_t {
            int64_t row = u / cpr;
            return (row / nheads) * ts + (row % nheads) * hs + (u % cpr) * 8;
        };
        uint32_t nonfinite;
        if (is_k)
            nonfinite = scan_chunk<T>((const T *)p.k + (p.flat_k ? u * 8 : offset(p.k_ts, p.k_hs)), p.vec_k);
        else if (p.q_f32) /* NaN/Inf in f32, or beyond T's range (f16: |x| >= 65520 rounds to Inf) */
            nonfinite = nonfinite8<T>(round8_of_f32<T>((const float *)p.q + (p.flat_q ? u * 8 : offset(p.q_ts, p.q_hs)), p.vec_q));
        else
            nonfinite = scan_chunk<T>((const T *)p.q + (p.flat_q ? u * 8 : offset(p.q_ts, p.q_hs)), p.vec_q);
        if (nonfinite) { /* rare: where it is */
            int64_t row = u / cpr, t = row / nheads;
            int h = (int)(row % nheads);
            if (is_k && t >= p.dense_hi) *p.suspect = 0; /* the second pass decides */
            else atomicMin(p.bad, attn_bad_key(is_k, is_k ? t : p.q_offset + t, h));
        }
    }
}
/* sparse segment s_first + blockIdx.x of kv head blockIdx.y: its kept
   blocks, then its own keys up to its last query */
template <typename T> __global__ void __launch_bounds__(256) attn_scan_sparse_kernel(const ScanParams p) {
    int s = p.s_first + (int)blockIdx.x, kvh = (int)blockIdx.y, bs = p.cfg.block_size, cpr = p.D / 8;
    if (*p.suspect == ~0ull) return; /* no bad K row past the dense segments' keys */
    if (!(s < p.plan_nseg && ei__segment_sparse(&p.cfg, s, p.plan_nseg, p.plan_final))) return;
    int64_t row = (int64_t)kvh * p.seg_stride + s, start = (int64_t)s * p.cfg.segment_size;
    int64_t own = min(start + p.cfg.segment_size, p.q_offset + p.nq) - start;
    int kc = max(0, min(p.keep_count[row], p.max_keep)), first_blocked = (int)(start / bs);
    const int *brow = p.block_index + row * p.max_keep;
    int64_t total = ((int64_t)kc * bs + own) * cpr;
    for (int64_t e = threadIdx.x; e < total; e += blockDim.x) {
        int64_t i = e / cpr, key;
        if (i < (int64_t)kc * bs) {
            int b = brow[i / bs];
            if (b < 0 || b >= first_blocked) continue; /* the attention kernel skips these too */
            key = (int64_t)b * bs + i % bs;
        } else
            key = start + (i - (int64_t)kc * bs);
        if (scan_chunk<T>((const T *)p.k + key * p.k_ts + (int64_t)kvh * p.k_hs + (e % cpr) * 8, p.vec_k))
            atomicMin(p.bad, attn_bad_key(1, key, kvh));
    }
}
/* Queues both passes of a call (bad and suspect already ~0). */
template <typename T>
static ei_result attn_scan(const ScanParams &p, int s_last, cudaStream_t st, char *msg) {
    int64_t total = (p.nq * p.nh + (p.q_offset + p.nq) * p.nkv) * (p.D / 8);
    attn_scan_rows_kernel<T><<<stride_blocks(total), 256, 0, st>>>(p);
    LAUNCH_CHECK("attn_scan_rows_kernel");
    if (p.plan_nseg > 0) {
        ei_result r = grid_fits("attention (scan of the kept blocks)", s_last - p.s_first + 1, p.nkv, 1, msg);
        if (r) return r;
        attn_scan_sparse_kernel<T><<<dim3(s_last - p.s_first + 1, p.nkv), 256, 0, st>>>(p);
        LAUNCH_CHECK("attn_scan_sparse_kernel");
    }
    return EI_OK;
}

/* The loads a view allows: 16-byte copies of 8-element row chunks when its
   data is 16-byte aligned and both strides are multiples of 8 elements (the
   layouts engines use); else element loads (views need only be aligned to
   their elements, the header's EI_ERR_ALIGN, with any strides). */
static int attn_vec_rows(const void *data, int64_t ts, int64_t hs) {
    return !((uintptr_t)data & 15) && !(ts & 7) && !(hs & 7);
}
/* Pair stores (float2, bf162, half2) when the output allows them. */
static int attn_vec_out(const ei_out_tensor *o) {
    return !((uintptr_t)o->data & (o->dtype == EI_F32 ? 7 : 3)) && !(o->token_stride & 1) && !(o->head_stride & 1);
}

/* The CTA shape of a call: attention_shape's, or for views that 16-byte
   copies cannot read (vec 0) the one shape built with element loads
   (mma.sync, 4 warps x 1 m-tile x 64 keys): a slower path kept out of the
   tuned kernels, whose registers it would crowd. The launch's rows per CTA
   (p.T, p.HC) follow from it. */
static void attention_pick(int D, bool vec, const char *e, int *nw, int *mt, int *bc, int *wg) {
    if (vec) {
        attention_shape(D, e, nw, mt, bc, wg);
        return;
    }
    *nw = 4; *mt = 1; *bc = 64; *wg = 0;
}
/* The kernel of the shape attention_pick picks, for p's dtype. */
static ei_result attention_launch(const AttnParams &p, const AttnMaps *maps, int D, bool bf, bool vec, const char *e,
                                  unsigned grid, cudaStream_t st, char *msg) {
    int NW, MT, BCK, WGK;
    attention_pick(D, vec, e, &NW, &MT, &BCK, &WGK);
#define EI__ATT_ELEM(DD)                                                                          \
    return bf ? launch_attention<DD, 4, 1, 64, __nv_bfloat16, false, false>(p, maps, grid, st, msg) \
              : launch_attention<DD, 4, 1, 64, __half, false, false>(p, maps, grid, st, msg)
    if (!vec) {
        if (D == 64) EI__ATT_ELEM(64);
        if (D == 128) EI__ATT_ELEM(128);
        EI__ATT_ELEM(256);
    }
#undef EI__ATT_ELEM
#define EI__ATT(DD, NN, MM, BB)                                                                   \
    return bf ? launch_attention<DD, NN, MM, BB, __nv_bfloat16>(p, maps, grid, st, msg)           \
              : launch_attention<DD, NN, MM, BB, __half>(p, maps, grid, st, msg)
#define EI__ATT_D(DD)                                                                             \
    do {                                                                                          \
        if (NW == 8 && MT == 2) EI__ATT(DD, 8, 2, 64);                                            \
        if (NW == 8) EI__ATT(DD, 8, 1, 64);                                                       \
        if (MT == 2) EI__ATT(DD, 4, 2, 64);                                                       \
        EI__ATT(DD, 4, 1, 64);                                                                    \
    } while (0)
#define EI__ATT_WG(DD, BB, WW)                                                                    \
    return bf ? launch_attention<DD, 8, 1, BB, __nv_bfloat16, WW>(p, maps, grid, st, msg)         \
              : launch_attention<DD, 8, 1, BB, __half, WW>(p, maps, grid, st, msg)
#define EI__ATT_TMA(DD, BB, TT)                                                                   \
    return bf ? launch_attention<DD, 8, 1, BB, __nv_bfloat16, true, true, TT>(p, maps, grid, st, msg) \
              : launch_attention<DD, 8, 1, BB, __half, true, true, TT>(p, maps, grid, st, msg)
    if (WGK == 2 && maps) {
        if (D == 64 && BCK == 64) EI__ATT_TMA(64, 64, 1);
        if (D == 64) EI__ATT_TMA(64, 128, 1);
        if (BCK == 64) EI__ATT_TMA(128, 64, 1);
        EI__ATT_TMA(128, 128, 1);
    }
    if (WGK == 3 && maps) {
        if (D == 64 && BCK == 64) EI__ATT_TMA(64, 64, 2);
        if (D == 64) EI__ATT_TMA(64, 128, 2);
        if (BCK == 64) EI__ATT_TMA(128, 64, 2);
        EI__ATT_TMA(128, 128, 2);
    }
    if (WGK == 15 && maps && D == 256) /* warp-specialised, persistent, 64 keys per step (wgs64) */
        return bf ? launch_attention_ws<256, __nv_bfloat16, true, 2, false, true, true>(p, maps, grid, st, msg)
                  : launch_attention_ws<256, __half, true, 2, false, true, true>(p, maps, grid, st, msg);
    if (WGK == 14 && maps && D == 256) /* wgs64 without ping-pong (wgz64: the default) */
        return bf ? launch_attention_ws<256, __nv_bfloat16, false, 2, false, true, true>(p, maps, grid, st, msg)
                  : launch_attention_ws<256, __half, false, 2, false, true, true>(p, maps, grid, st, msg);
    if (WGK >= 7 && maps && D == 128) { /* warp-specialised, persistent (api_attention checked the block size) */
#define EI__ATT_WS(PP, NST, GALL, GL, SPLIT)                                                                    \
    return bf ? launch_attention_ws<128, __nv_bfloat16, PP, NST, GALL, GL, SPLIT>(p, maps, grid, st, msg)       \
              : launch_attention_ws<128, __half, PP, NST, GALL, GL, SPLIT>(p, maps, grid, st, msg)
        if (WGK == 7) EI__ATT_WS(true, 2, false, false, false);
        if (WGK == 8) EI__ATT_WS(false, 2, false, false, false);
        if (WGK == 9) EI__ATT_WS(true, 3, false, false, false);
        if (WGK == 10) EI__ATT_WS(false, 3, false, false, false);
        if (WGK == 11) EI__ATT_WS(true, 3, true, false, false);
        if (WGK == 12) EI__ATT_WS(true, 3, false, true, false);
        if (WGK == 13) EI__ATT_WS(true, 3, true, true, false);
        if (WGK == 15) EI__ATT_WS(true, 3, false, true, true);
        EI__ATT_WS(false, 3, false, true, false);
#undef EI__ATT_WS
    }
    if (WGK == 6 && maps) { /* overlap, warpgroup 0 first: 128 keys per step */
        if (D == 64) EI__ATT_TMA(64, 128, 5);
        EI__ATT_TMA(128, 128, 5);
    }
    if (WGK == 5 && maps) { /* overlap: 128 keys per step (D 64 always) */
        if (D == 64) EI__ATT_TMA(64, 128, 4);
        if (BCK == 64) EI__ATT_TMA(128, 64, 4);
        EI__ATT_TMA(128, 128, 4);
    }
    if (WGK == 16 && maps && D == 256) EI__ATT_TMA(256, 64, 6); /* group-interleaved tiles */
    if (WGK == 4 && maps) {
        if (D == 256) EI__ATT_TMA(256, 64, 3);
        if (D == 64 && BCK == 64) EI__ATT_TMA(64, 64, 3);
        if (D == 64) EI__ATT_TMA(64, 128, 3);
        if (BCK == 64) EI__ATT_TMA(128, 64, 3);
        EI__ATT_TMA(128, 128, 3);
    }
#undef EI__ATT_TMA
    if (WGK && D == 256) EI__ATT_WG(256, 64, true);
    if (WGK && D == 64 && BCK == 64) EI__ATT_WG(64, 64, true);
    if (WGK && D == 64) EI__ATT_WG(64, 128, true);
    if (WGK && BCK == 64) EI__ATT_WG(128, 64, true);
    if (WGK) EI__ATT_WG(128, 128, true);
    if (D == 64) EI__ATT_D(64);
    if (D == 128) {
        if (BCK == 32 && NW == 8) EI__ATT(128, 8, 2, 32);
        if (BCK == 32) EI__ATT(128, 4, 2, 32);
        EI__ATT_D(128);
    }
    EI__ATT(256, 4, 1, 64);
#undef EI__ATT_WG
#undef EI__ATT_D
#undef EI__ATT
}

/* The scan of the rows the call reads, one launch for the layer, then the
   scan's report read back: the call waits for the kernel, as profiling
   does, so that it can return EI_ERR_NONFINITE as the CPU does (the output
   is then not written). */
/* The scan's first bad row (~0: none) as the call's code and message. */
static ei_result attention_bad_fail(unsigned long long bad, bool q_f32, bool bf, char *msg) {
    if (bad == ~0ull) return EI_OK;
    return fail(msg, EI_ERR_NONFINITE, "NaN or Inf in %s%s (%s %d, %s %lld)", bad >> 62 ? "k" : "q",
                !(bad >> 62) && q_f32 ? (bf ? " (f32, rounded to bf16)" : " (f32 rounded to f16: NaN, Inf or |x| >= 65520)") : "",
                bad >> 62 ? "kv head" : "head", (int)(bad & 4095u), bad >> 62 ? "key" : "token",
                (long long)((bad >> 12) & ((1ull << 50) - 1)));
}
static ei_result api_attention(const ei_config *cfg, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                               const ei_plan *plan, ei_out_tensor *out, int64_t q_offset, void *ws, size_t ws_bytes,
                               char *msg) {
    ei_result r;
    int D = q->head_dim, nh = q->n_heads, nkv = k->n_heads;
    if (deferred(cfg) && !ws) return fail(msg, EI_ERR_NULL, "workspace is NULL (%d bytes needed)", ATTN_DEFERRED_WS);
    if (deferred(cfg) && ws_bytes < ATTN_DEFERRED_WS)
        return fail(msg, EI_ERR_WORKSPACE, "workspace of %zu bytes, %d needed", ws_bytes, ATTN_DEFERRED_WS);
    if (k->dtype != v->dtype || k->dtype == EI_F32)
        return fail(msg, EI_ERR_DTYPE, "CUDA attention needs k and v both bf16 or both f16 (got k %s, v %s; q may be "
                    "k's dtype or f32, the output any dtype)", dtype_str(k->dtype), dtype_str(v->dtype));
    if (q->dtype != k->dtype && q->dtype != EI_F32)
        return fail(msg, EI_ERR_DTYPE, "CUDA attention needs q of k's dtype (%s) or f32 (rounded to %s on the GPU); "
                    "got q %s", dtype_str(k->dtype), dtype_str(k->dtype), dtype_str(q->dtype));
    const int q_f32 = q->dtype == EI_F32;
    if (D != 64 && D != 128 && D != 256)
        return fail(msg, EI_ERR_UNSUPPORTED, "CUDA attention supports head_dim 64, 128 and 256 (got %d)", D);
    bool vec = attn_vec_rows(q->data, q->token_stride, q->head_stride) &&
               attn_vec_rows(k->data, k->token_stride, k->head_stride) &&
               attn_vec_rows(v->data, v->token_stride, v->head_stride) && attn_vec_out(out);
    /* the kernels: EI_CUDA_ATTN_CFG's (every segment), and EI_CUDA_ATTN_SPARSE_CFG's
       for the sparse segments of a plan, when it names another shape of as many rows
       (neither set: attention_shape's defaults, ATTN_SPARSE_DEFAULT for the sparse ones) */
    const CudaTuning tn = tuning_read();
    const char *e_all = tn.attn_cfg, *e_sp = tn.attn_sparse_cfg;
    if (!(e_sp && e_sp[0]) && !(e_all && e_all[0])) e_sp = ATTN_SPARSE_DEFAULT;
    int NW, MT, BCK, WGK, NW2, MT2, BCK2, WGK2;
    attention_pick(D, vec, e_all, &NW, &MT, &BCK, &WGK);
    attention_pick(D, vec, e_sp && e_sp[0] ? e_sp : e_all, &NW2, &MT2, &BCK2, &WGK2);
    /* the warp-specialised kernel copies every tile by TMA in 8-key groups: other calls run wgk64
       (head_dim 256: wgi64, attention_kernel on the same tiles) */
    const bool ws_ok = (D == 128 || D == 256) && cfg->block_size % 8 == 0;
    const char *ws_alt = D == 256 ? "wgi64" : "wgk64";
    if (attn_is_ws(WGK) && !ws_ok) { WGK = D == 256 ? 16 : 4; BCK = 64; e_all = ws_alt; }
    if (attn_is_ws(WGK2) && !ws_ok) { WGK2 = D == 256 ? 16 : 4; BCK2 = 64; e_sp = ws_alt; }
    int rows = 16 * NW * MT, G = nh / nkv;
    AttnMaps maps;
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.q = q->data; p.k = k->data; p.v = v->data; p.out = out->data;
    p.q_ts = q->token_stride; p.q_hs = q->head_stride; p.k_ts = k->token_stride; p.k_hs = k->head_stride;
    p.v_ts = v->token_stride; p.v_hs = v->head_stride; p.o_ts = out->token_stride; p.o_hs = out->head_stride;
    p.out_dtype = out->dtype;
    p.q_f32 = q_f32;
    p.n_kv = nkv; p.G = G;
    p.HC = G < rows ? G : rows;
    p.T = rows / p.HC;
    p.chunks = (G + p.HC - 1) / p.HC;
    p.q_offset = q_offset; p.nq = q->n_tokens;
    p.seg = cfg->segment_size; p.bs = cfg->block_size;
    p.cfg = *cfg;
    p.plan_nseg = plan ? plan->n_segments : 0;
    p.plan_final = plan ? plan->final : 0;
    p.keep_count = plan ? plan->keep_count : NULL;
    p.block_index = plan ? plan->block_index : NULL;
    p.seg_stride = plan ? plan->seg_capacity : 0;
    p.max_keep = plan ? plan->max_keep : 0;
    int s_first = (int)(q_offset / p.seg);
    p.s_last = (int)((q_offset + q->n_tokens - 1) / p.seg);
    p.tiles_per_seg = (p.seg + p.T - 1) / p.T;
    float scale = cfg->attn_scale > 0.f ? cfg->attn_scale : 1.f / sqrtf((float)D);
    p.scale_log2 = scale * 1.4426950408889634f;
    int64_t grid = (int64_t)(p.s_last - s_first + 1) * nkv * p.chunks * p.tiles_per_seg;
    if ((r = grid_fits("attention", grid, 1, 1, msg))) return r;
    /* head_dim 256's default: the persistent warp-specialised kernel cannot split a work item's keys,
       so a call of fewer work items than half the SMs (an engine's micro-batch: split-K's case) runs
       wgi64 with split-K instead (a kernel named by EI_CUDA_ATTN_CFG runs as named) */
    if (D == 256 && grid * 2 <= sm_count()) {
        if (attn_is_ws(WGK) && !(e_all && e_all[0])) { WGK = 16; e_all = "wgi64"; }
        if (attn_is_ws(WGK2) && !(e_sp && e_sp[0])) { WGK2 = 16; e_sp = "wgi64"; }
    }
    const bool split = plan && NW2 * MT2 == NW * MT && (NW2 != NW || MT2 != MT || BCK2 != BCK || WGK2 != WGK);
    cudaStream_t st = stream_of(cfg);
    bool bf = k->dtype == EI_BF16; /* the kernels' type: k's (an f32 q is rounded to it) */
    ScanParams sp;
    memset(&sp, 0, sizeof sp);
    sp.q = q->data; sp.k = k->data;
    sp.q_ts = q->token_stride; sp.q_hs = q->head_stride; sp.k_ts = k->token_stride; sp.k_hs = k->head_stride;
    sp.q_offset = q_offset; sp.nq = q->n_tokens;
    sp.nh = nh; sp.nkv = nkv; sp.D = D; sp.q_f32 = q_f32;
    sp.vec_q = attn_vec_rows(q->data, q->token_stride, q->head_stride);
    sp.vec_k = attn_vec_rows(k->data, k->token_stride, k->head_stride);
    sp.flat_q = q->head_stride == D && q->token_stride == (int64_t)nh * D;
    sp.flat_k = k->head_stride == D && k->token_stride == (int64_t)nkv * D;
    sp.cfg = *cfg;
    sp.plan_nseg = p.plan_nseg; sp.plan_final = p.plan_final; sp.s_first = s_first;
    sp.keep_count = p.keep_count; sp.block_index = p.block_index; sp.seg_stride = p.seg_stride; sp.max_keep = p.max_keep;
    for (int s = p.s_last; s >= s_first && !sp.dense_hi; s--) /* the last dense segment's end */
        if (!(s < p.plan_nseg && ei__segment_sparse(cfg, s, p.plan_nseg, p.plan_final)))
            sp.dense_hi = std::min((int64_t)(s + 1) * p.seg, q_offset + q->n_tokens);
    unsigned long long *slot = NULL, *suspect = NULL, bad = 0;
    if (deferred(cfg)) { /* the reports in the workspace, cleared on the stream */
        slot = (unsigned long long *)ws_base(ws);
        suspect = slot + 1;
        CUDA_TRY(cudaMemsetAsync(slot, 0xFF, 2 * sizeof(unsigned long long), st));
    } else if ((r = slot_take(st, &slot, msg)) || (r = slot_take(st, &suspect, msg)))
        return r;
    sp.bad = slot;
    sp.suspect = suspect;
    p.bad = slot;
    if ((r = bf ? attn_scan<__nv_bfloat16>(sp, p.s_last, st, msg) : attn_scan<__half>(sp, p.s_last, st, msg)))
        return r;
    p.seg_mode = split ? 1 : 0;
    p.D = D;
    p.nsplit = attn_split_plan(p, D, std::max(BCK, split ? BCK2 : BCK), attn_is_ws(WGK) || (split && attn_is_ws(WGK2)),
                               D == 256 && WGK > 0, (unsigned)grid, ws, ws_bytes, tn.attn_split, &p.part);
    if (p.nsplit > 1 && (BCK % p.bs || (split && BCK2 % p.bs))) p.nsplit = 1;
    const AttnMaps *mp = attn_maps_for(WGK, k, v, D, BCK, bf, &maps, &e_all);
    if ((r = attention_launch(p, mp, D, bf, vec, e_all, (unsigned)grid, st, msg))) return r;
    if (split) { /* the sparse segments: the second kernel (its own tensor maps: boxes of its keys per step) */
        AttnMaps maps2;
        p.seg_mode = 2;
        mp = attn_maps_for(WGK2, k, v, D, BCK2, bf, &maps2, &e_sp);
        if ((r = attention_launch(p, mp, D, bf, vec, e_sp, (unsigned)grid, st, msg))) return r;
    }
    if (p.nsplit > 1) { /* split-K: merge the partial rows into out */
        attn_split_combine_kernel<<<(unsigned)(q->n_tokens * nh), 128, 0, st>>>(p);
        LAUNCH_CHECK("attn_split_combine_kernel");
    }
    if (deferred(cfg)) return deferred_record(slot, DE_ATTENTION, (q_f32 ? DE_Q_F32 : 0) | (bf ? DE_BF16 : 0), st, msg);
    if ((r = slot_read(st, slot, &bad, msg))) return r;
    return attention_bad_fail(bad, q_f32, bf, msg);
}

/* ============================================================ >>cuda-sampled */
/* EI_RANK_SAMPLED (CONCEPTS: ranking): the block mass of R sampled query
   rows per (kv head, segment s >= 1 at or past threshold_len). Row i of
   segment s is token t = ei__sample_token(cfg, s, i) of query head
   kvh*G + i%G, used when t < n; its softmax of scale * q.k_j over keys
   0..t (f32, max-subtracted) is summed per block over keys j < s*segment
   into mass[(kvh*nseg + s)*nblk + b], over the used rows. The mass rows are
   zeroed first; every block is written by one CTA in a fixed order, so plans
   are reproducible bit for bit.
   mass_mma_kernel (bf16/f16 q and k of one dtype, head_dim 64/128/256):
   CTAs of 8 warps x 2 m-tiles = 256 rows from consecutive segments of one
   kv head (256 / R rounded up to 16 segments per CTA; R > 256: one segment,
   its rows in chunks of 256), so that every K tile read serves all of them;
   64 keys per step, double-buffered with cp.async (element loads where a
   view is not 16-byte aligned), S = Q K^T with f32 accumulation: warpgroup
   MMAs (wgmma, WG: Hopper's sm_90a code; tiles in the 128-byte-swizzled
   layout, Q rows placed so that the accumulator rows are the mma.sync
   layout's) or mma.sync (elsewhere, or EI_CUDA_SAMPLED_MMA=1); exp2 with the
   scale folded in, tiles below every row's token or segment unmasked. The keys are cut into ns parts (one CTA
   each, for balance: the last segments see the most keys) and the kernel
   runs twice: PHASE 1 writes each part's row max and sum (online softmax),
   PHASE 2 combines them in part order and sums its part's normalised
   probabilities over the rows of each segment per key (a fixed shuffle tree,
   then m-tiles in order) and per block. Work items go from the heaviest
   (last) segments down. mass_generic_kernel (any dtype and head_dim): f32
   CUDA-core tiles, one CTA per (kv head, segment), rows 32 at a time, both
   passes in one CTA. */
#define MS_NW 8
#define MS_MT 2
#define MS_ROWS (16 * MS_NW * MS_MT)
#define MS_BC 64
struct MassParams {
    const void *q, *k;
    int64_t q_ts, q_hs, k_ts, k_hs, n;
    int64_t q_lo;   /* q holds the queries of tokens q_lo..n-1 (a chunk); rows of earlier tokens are not used */
    int mrows, mseg0; /* the mass rows: segment s of kv head h at mass + ((h * mrows + s - mseg0) * nblk) */
    int q_dtype, k_dtype, D;
    int nseg, nblk, nkv, G, R, seg, bs;
    int s_first, spc, rpad, rchunks, ngroups, ns, align, vec;
    float scale, scale_log2;
    float *mass;
    float2 *stats; /* [kvh][group][chunk][part][MS_ROWS]: each part's row max and sum */
    int *flag;
    int *spread;       /* EI_RANK_ROWS_SPREAD: the rows spread_pick_kernel chose, laid out as the mass rows
                          ([kvh][mrows][R] candidate numbers, -1 past the last); NULL: the even rows */
    int sp_st;         /* the candidates' token stride (ei__spread_stride) */
    const float *k_scale; /* EI_RANK_PRECISION_INT8: the keys' scales [kvh][n] (k then holds the rounded keys,
                             rank_keys_i8_kernel); NULL: f32 scores */
    ei_config cfg;
};
/* EI_RANK_PRECISION_INT8 (CONCEPTS: ranking): the scale of a row of D
   elements at x + base, max|x_i| / 127 as ei__quant_i8 divides, by one warp
   (every lane gets it); NaN or Inf sets bad_bit in *flag and gives 0 (a
   zero row, as the CPU's). */
__device__ float warp_i8_scale(const void *x, int dtype, int64_t base, int D, int *flag, int bad_bit) {
    const int lane = threadIdx.x & 31;
    float m = 0.f;
    bool bad = false;
    for (int e = lane; e < D; e += 32) {
        float v = load_f32(x, dtype, base + e);
        bad |= !isfinite(v);
        m = fmaxf(m, fabsf(v));
    }
    m = warp_max(m);
    if (__any_sync(0xffffffffu, bad)) {
        if (lane == 0) atomicOr(flag, bad_bit);
        return 0.f;
    }
    return __fdiv_rn(m, 127.0f);
}
/* The same rounding by a group of L consecutive lanes (L a power of two
   up to 32, groups aligned in the warp, every lane of the warp calling):
   lane c of the group takes elements 8c..8c+7 of the row at x + base (zeros
   from D on) and gets them rounded in v, as floats; returns the row's scale
   (0 for a zero row, and for NaN or Inf, which sets bad_bit in *flag). The
   row's loads are issued together, not element after element as a warp a
   row does: one memory latency a row group instead of two a row. */
__device__ float group_i8_round8(const void *x, int dtype, int64_t base, int D, int c, int L, float (&v)[8], int *flag,
                                 int bad_bit) {
    float m = 0.f;
    int bad = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int e = c * 8 + i;
        v[i] = e < D ? load_f32(x, dtype, base + e) : 0.f;
        bad |= !isfinite(v[i]);
        m = fmaxf(m, fabsf(v[i]));
    }
    for (int o = L >> 1; o > 0; o >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    if (bad && c == 0) atomicOr(flag, bad_bit);
    const float s = bad ? 0.f : __fdiv_rn(m, 127.0f);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = s > 0.f ? (float)ei__round_i8(__fdiv_rn(v[i], s)) : 0.f;
    return s;
}
/* Element e of that row rounded to int8 (ei__round_i8 of x / s), as a float. */
__device__ __forceinline__ float i8_of(const void *x, int dtype, int64_t i, float s) {
    return s > 0.f ? (float)ei__round_i8(__fdiv_rn(load_f32(x, dtype, i), s)) : 0.f;
}
/* Key j of kv head h rounded: its int8 values, exact in T, in row h n + j
   of W elements (zeros from D on), its scale at scale[h n + j]; NaN or Inf:
   PF_NAN_K. bf16 rows (the tensor cores'): W / 8 lanes a key
   (group_i8_round8); f32 rows: a warp a key. */
template <typename T>
__global__ void __launch_bounds__(256) rank_keys_i8_kernel(const void *k, int dtype, int64_t ts, int64_t hs, int64_t n,
                                                           int nkv, int D, int W, T *out, float *scale, int *flag) {
    const int lane = threadIdx.x & 31;
    if constexpr (std::is_same<T, float>::value) { /* f32 rows (CUDA cores), any width: a warp a key */
        const int64_t key = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
        if (key >= n * nkv) return; /* whole warps */
        const int64_t base = (key % n) * ts + (key / n) * hs;
        const float s = warp_i8_scale(k, dtype, base, D, flag, PF_NAN_K);
        T *row = out + key * W;
        for (int e = lane; e < W; e += 32) row[e] = i8_of(k, dtype, base + e, s);
        if (lane == 0) scale[key] = s;
    } else { /* tensor-core rows, W 64/128/256: W / 8 lanes a key, 16 bytes each */
        const int L = W / 8;
        const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, key = i / L;
        const int c = (int)(i % L);
        if ((i - lane) / L >= n * nkv) return; /* whole warps: a warp's first key is past the last */
        const bool in = key < n * nkv;
        float v[8];
        const float s = group_i8_round8(k, dtype, in ? (key % n) * ts + (key / n) * hs : 0, in ? D : 0, c, L, v, flag,
                                        PF_NAN_K);
        if (!in) return;
        ((uint4 *)(out + key * W))[c] = pack8<T>(v);
        if (c == 0) scale[key] = s;
    }
}
/* How the tensor-core path splits the work: the first sampled segment,
   segments per CTA (spc), rows per segment slot (rpad), row chunks, CTA
   groups of segments, and key parts per group (ns: about 2048 CTAs in all,
   at most parts_max / chunks; a function of the shapes alone, so plans do
   not depend on the device; the part statistics combine in another order
   for another ns, a float32 rounding difference). The segments are [s_lo,
   nseg) (a chunk's; 0 for the whole prompt). parts_max: 16; a chunk's
   (api_profile_chunk) is chunk_parts_max's (or the tuning knob
   EI_CUDA_SAMPLED_CHUNK_PARTS, >>cuda-tuning): a micro-batch in one segment
   is one group of CTAs per kv head, and more parts spread its long key
   prefix over more CTAs. 64 parts everywhere won only on small chunks at
   128k with 8 kv heads (docs/performance.md, H200 dated log, chunked
   planning); with one kv head, 16 parts were 16 CTAs (H100 dated log,
   2026-12-06). The
   CTA count aimed at is the knob EI_CUDA_SAMPLED_CTAS (tn). Returns 0 when
   no segment is sampled. */
static int mass_geometry(const ei_config *cfg, int64_t s_lo, int64_t nseg, int32_t nkv, int parts_max, const CudaTuning &tn,
                         int *s_first, int *spc, int *rpad, int *rchunks, int *ngroups, int *ns) {
    int64_t seg = cfg->segment_size, sf = (cfg->threshold_len + seg - 1) / seg, per;
    int R = cfg->rank_samples, rp = (R + 15) / 16 * 16;
    if (sf < 1) sf = 1;
    if (sf < s_lo) sf = s_lo;
    if (cfg->ranking != EI_RANK_SAMPLED || sf >= nseg) return 0;
    *s_first = (int)sf;
    if (rp <= MS_ROWS) { *rpad = rp; *spc = MS_ROWS / rp; *rchunks = 1; }
    else { *rpad = MS_ROWS; *spc = 1; *rchunks = (R + MS_ROWS - 1) / MS_ROWS; }
    *ngroups = (int)((nseg - sf + *spc - 1) / *spc);
    per = (int64_t)*ngroups * nkv;
    {   /* tuning knob EI_CUDA_SAMPLED_CTAS: the CTA count aimed at (default 2048) */
        int64_t target = tn.sampled_ctas;
        *ns = (int)((target + per - 1) / per);
    }
    if (*ns > parts_max / *rchunks) *ns = parts_max / *rchunks;
    if (*ns < 1) *ns = 1;
    return 1;
}
/* Bytes of the part statistics (0 when no segment is sampled). */
static size_t mass_stats_bytes(const ei_config *cfg, int64_t n, int32_t nkv, const CudaTuning &tn) {
    int sf, spc, rpad, rchunks, ngroups, ns;
    if (!mass_geometry(cfg, 0, (n + cfg->segment_size - 1) / cfg->segment_size, nkv, 16, tn, &sf, &spc, &rpad, &rchunks,
                       &ngroups, &ns))
        return 0;
    return (size_t)nkv * (size_t)ngroups * (size_t)rchunks * (size_t)ns * MS_ROWS * sizeof(float2);
}
/* Key parts at most for a chunk's sampled rows (ei_profile_chunk over the
   segments [s_lo, nseg), keys up to n): 16, as for the whole prompt, unless
   the chunk's groups of segments and kv heads fill fewer than 256 CTAs at 16
   parts. Then as many parts as bring it to 256 CTAs, each part at least 256
   keys, at most 128 parts. Why: llama.cpp's micro-batch of 512 queries is one
   segment; with Gemma 3 270M's one kv head that was 16 CTAs on 132 SMs, and
   the sampled rows took 43-61% of a chunk's planning on an H100 (issue 33,
   `ei_trace_cuda plan`). Parts of 512 keys still left a 32k chunk 63 CTAs;
   parts of 256 make 32k planning 8-9% faster at 512-2048 queries (H100,
   docs/performance.md, "more key parts for small chunks"). A function of the
   shapes alone, as mass_geometry is; EI_CUDA_SAMPLED_CHUNK_PARTS overrides it. */
static int chunk_parts_max(const ei_config *cfg, int64_t s_lo, int64_t nseg, int32_t nkv, int64_t n, const CudaTuning &tn) {
    int sf, spc, rpad, rchunks, ngroups, ns;
    if (tn.sampled_chunk_parts > 0) return tn.sampled_chunk_parts;
    if (!mass_geometry(cfg, s_lo, nseg, nkv, 16, tn, &sf, &spc, &rpad, &rchunks, &ngroups, &ns)) return 16;
    int64_t per = (int64_t)ngroups * nkv, want = (256 + per - 1) / per * rchunks, by_keys = n / 256;
    if ((int64_t)ns * per >= 256) return 16;
    want = std::min(want, std::min(by_keys, (int64_t)128));
    return (int)std::max(want, (int64_t)16);
}
/* Sampled row i of segment s of kv head kvh: its token (-1: the call does
   not hold it) and query head (0 then). The spread rows where the call holds
   the whole segment (EI_RANK_ROWS_SPREAD: spread_pick_kernel's table, as the
   CPU's ei__sample_rows_pick), else the even rows. */
__device__ __forceinline__ int sample_row(const MassParams &p, int s, int i, int kvh, int *head) {
    int64_t t;
    int g;
    *head = 0;
    if (p.spread && ei__spread_whole(&p.cfg, s, p.q_lo, p.q_lo, p.n)) {
        const int c = p.spread[((int64_t)kvh * p.mrows + s - p.mseg0) * p.R + i];
        if (c < 0) return -1;
        t = (int64_t)s * p.seg + (int64_t)(c / p.G) * p.sp_st;
        g = c % p.G;
    } else {
        t = ei__sample_token(&p.cfg, s, i);
        if (t >= p.n || t < p.q_lo) return -1;
        g = i % p.G;
    }
    *head = kvh * p.G + g;
    return (int)t;
}
/* Row r (0 .. MS_ROWS) of row chunk `chunk` of the CTA whose first segment
   is s_lo: its token (-1: unused) and query head; *seg its segment. */
__device__ __forceinline__ int mass_row(const MassParams &p, int s_lo, int chunk, int r, int kvh, int *head, int *seg) {
    int a = r / p.rpad, il = r - a * p.rpad, s = s_lo + a, i = chunk * p.rpad + il;
    *seg = s;
    *head = 0;
    if (a >= p.spc || s >= p.nseg || i >= p.R) return -1;
    return sample_row(p, s, i, kvh, head);
}
/* Sum of the 16 values c[nt*2 + col] (n-tile nt, column col of this lane's
   columns 2*(lane&3) + col) over the 8 lanes that share lane & 3: a
   reduce-scatter over lane bits 4, 3, 2 (14 shuffles). Lane L returns the sums
   of the tile's keys 2L and 2L+1, each formed in one lane in a fixed order. */
__device__ __forceinline__ float2 colsum_scatter(const float (&c)[16], int lane) {
    float d8[8], d4[4], d2[2];
    bool hi = lane & 16;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float send = hi ? c[k] : c[k + 8], keep = hi ? c[k + 8] : c[k];
        d8[k] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
    }
    hi = lane & 8;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float send = hi ? d8[k] : d8[k + 4], keep = hi ? d8[k + 4] : d8[k];
        d4[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
    }
    hi = lane & 4;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        float send = hi ? d4[k] : d4[k + 2], keep = hi ? d4[k + 2] : d4[k];
        d2[k] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
    }
    return make_float2(d2[0], d2[1]);
}

/* Key range [*lo, *hi) (tiles of MS_BC keys) of part `split` of NS of the
   keys [0, kend): part boundaries are multiples of `align` keys (a multiple
   of MS_BC and of the block size, so no block straddles two parts). */
__device__ __forceinline__ void mass_part(int kend, int split, int ns, int align, int *lo, int *hi) {
    *lo = (int)((int64_t)kend * split / ns / align * align);
    *hi = split == ns - 1 ? kend : (int)((int64_t)kend * (split + 1) / ns / align * align);
}

/* PHASE 1: the rows' max and sum (online softmax) over one part of the keys
   0..t, into p.stats. PHASE 2: the parts' stats combined (in part order),
   then the normalised probabilities of one part of the keys before each
   row's segment, summed over the rows of a segment and per block into
   p.mass (each block in one part: one CTA writes it). */
template <int D, typename T, int PHASE, bool WG>
__global__ void __launch_bounds__(MS_NW * 32, D <= 128 ? 2 : 1) mass_mma_kernel(const MassParams p) {
    constexpr int CH = D / 8, RS = WG ? CH : CH + 1, NB = MS_BC / 8, MT = MS_MT, NMT = MS_ROWS / 16;
    static_assert(!WG || D % 64 == 0, "wgmma tiles: 64-column slabs");
    /* shared layout of a [R rows][D] tile in 16-byte chunks: rows padded by one chunk
       (ldmatrix, conflict-free), or for WG 64-column slabs of [R][128 bytes] with the
       128-byte swizzle wgmma reads (chunk c of row r at c ^ (r & 7)) */
    auto at = [](int row, int ch, int R) -> int {
        if (WG) return (ch >> 3) * R * 8 + row * 8 + ((ch & 7) ^ (row & 7));
        (void)R;
        return row * RS + ch;
    };
    extern __shared__ uint4 smem_raw[];
    /* wgmma's swizzle repeats every 1024 bytes: align the tiles to it (the launch adds the slack) */
    uint4 *smem = WG ? smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u) / 16 : smem_raw;
    uint4 *sQ = smem, *sK = smem + MS_ROWS * RS;
    __shared__ int r_tok[MS_ROWS], r_head[MS_ROWS], r_lim[MS_ROWS], mt_tmax[NMT], mt_lim[NMT];
    __shared__ float colsum[NMT][MS_BC];
    __shared__ float r_rf[MS_ROWS], k_sc[2][MS_BC]; /* EI_RANK_PRECISION_INT8: scale_log2 s_q per row, s_k per key */
    __shared__ int kend1_s, kend2_s;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int split = blockIdx.x % p.ns, rest = blockIdx.x / p.ns;
    const int kvh = rest % p.nkv, g = p.ngroups - 1 - rest / p.nkv;
    const int s_lo = p.s_first + g * p.spc;
    const T *K = (const T *)p.k + (int64_t)kvh * p.k_hs;
    const bool i8 = p.k_scale != NULL;
    const float sl = i8 ? 1.0f : p.scale_log2; /* int8 logits carry the scale (log2 units) already */

    auto issue = [&](int j, int buf) {
        uint4 *bK = sK + buf * MS_BC * RS;
        for (int c = tid; c < MS_BC * CH; c += MS_NW * 32) {
            int row = c / CH, ch = c % CH;
            int64_t key = (int64_t)j * MS_BC + row;
            if (key < p.n) load16<T>(&bK[at(row, ch, MS_BC)], K + key * p.k_ts + ch * 8, p.vec);
            else bK[at(row, ch, MS_BC)] = make_uint4(0, 0, 0, 0);
        }
        if (i8 && tid < MS_BC) { /* read after the loop's barrier, as the tile */
            int64_t key = (int64_t)j * MS_BC + tid;
            k_sc[buf][tid] = key < p.n ? p.k_scale[(int64_t)kvh * p.n + key] : 0.f;
        }
    };
    /* EI_RANK_PRECISION_INT8: the exact integer dots to logits, ((scale_log2 s_q) s_k) dot in that order
       (the CPU's ei__rank_scores_i8_scalar) */
    auto logits_i8 = [&](float (&sc)[MT][NB][4], int buf) {
        float rf[MT][2]; /* (from shared memory: registers are short in PHASE 1) */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) rf[mt][hf] = r_rf[(warp * MT + mt) * 16 + (lane >> 2) + 8 * hf];
#pragma unroll
        for (int nt = 0; nt < NB; nt++)
#pragma unroll
            for (int col = 0; col < 2; col++) {
                const float ks = k_sc[buf][nt * 8 + (lane & 3) * 2 + col];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++)
                        sc[mt][nt][2 * hf + col] = __fmul_rn(__fmul_rn(rf[mt][hf], ks), sc[mt][nt][2 * hf + col]);
            }
    };
    auto qk = [&](float (&sc)[MT][NB][4], const uint4 *bK) {
        if constexpr (WG) {
            /* warpgroup wg owns rows wg*128 .. +127 as two 64-row blocks (the rows were laid out so
               that the accumulator rows are this warp's logical m-tiles, see the Q load) */
            wgmma_fence();
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const char *q0 = (const char *)sQ + ((warp >> 2) * 128 + mt * 64) * 128, *k0 = (const char *)bK;
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++)
                    wgmma_ss<MS_BC, T>(sc[mt], wgmma_desc(q0 + (kk >> 2) * MS_ROWS * 128 + (kk & 3) * 32, 16, 1024),
                                       wgmma_desc(k0 + (kk >> 2) * MS_BC * 128 + (kk & 3) * 32, 16, 1024), kk > 0);
            }
            wgmma_commit();
            wgmma_wait_all();
        } else {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int i = 0; i < NB; i++) sc[mt][i][0] = sc[mt][i][1] = sc[mt][i][2] = sc[mt][i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    int row = (warp * MT + mt) * 16 + (lane & 15), ch = kk * 2 + (lane >> 4);
                    ldmatrix_x4(a[mt], &sQ[at(row, ch, MS_ROWS)]);
                }
#pragma unroll
                for (int np = 0; np < NB / 2; np++) {
                    uint32_t b[4];
                    int key = np * 16 + (lane & 7) + ((lane >> 4) << 3), ch = kk * 2 + ((lane >> 3) & 1);
                    ldmatrix_x4(b, &bK[at(key, ch, MS_BC)]);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816<T>(sc[mt][2 * np], a[mt], b[0], b[1]);
                        mma16816<T>(sc[mt][2 * np + 1], a[mt], b[2], b[3]);
                    }
                }
            }
        }
    };

    for (int chunk = 0; chunk < p.rchunks; chunk++) {
        __syncthreads(); /* the previous chunk is done with shared memory */
        if (tid == 0) kend1_s = kend2_s = 0;
        __syncthreads();
        {   /* one row per thread: its token, query head and mass limit */
            int r = tid, head, s;
            int t = mass_row(p, s_lo, chunk, r, kvh, &head, &s);
            r_tok[r] = t;
            r_head[r] = head;
            r_lim[r] = t >= 0 ? s * p.seg : 0;
            if (t >= 0) {
                atomicMax(&kend1_s, t + 1);
                atomicMax(&kend2_s, s * p.seg);
            }
        }
        __syncthreads();
        {   /* the query rows, 16 bytes of shared memory per thread and step, consecutive threads on
               consecutive chunks of a row (a row per thread was uncoalesced, and a chunk's 64 used rows
               of 256 left three quarters of the threads idle: a fixed cost per CTA that more key parts
               multiply). WG: logical m-tile L (warp L/2, m-tile L%2) sits where that warp's wgmma
               accumulator rows are: warpgroup (L/2)/4, 64-row block L%2, 16 rows (L/2)%4 */
            uint32_t bad = 0;
            auto phys = [](int r) { /* the row's place in sQ */
                const int L = r >> 4;
                return WG ? ((L >> 3) * 128 + (L & 1) * 64 + ((L >> 1) & 3) * 16 + (r & 15)) : r;
            };
            if (i8) /* EI_RANK_PRECISION_INT8: each row rounded to int8, held exactly in T, zeros from p.D; the
                       CH lanes of a row's chunks together (CH divides 32; the bound is a multiple of the CTA) */
                for (int i = tid; i < MS_ROWS * CH; i += MS_NW * 32) {
                    const int r = i / CH, ch = i % CH, t = r_tok[r];
                    const int64_t src = t >= 0 ? (int64_t)(t - p.q_lo) * p.q_ts + (int64_t)r_head[r] * p.q_hs : 0;
                    float v[8];
                    const float sq = group_i8_round8(p.q, p.q_dtype, src, t >= 0 ? p.D : 0, ch, CH, v, p.flag, PF_NAN_Q);
                    sQ[at(phys(r), ch, MS_ROWS)] = pack8<T>(v);
                    if (ch == 0) r_rf[r] = __fmul_rn(p.scale_log2, sq);
                }
#pragma unroll 4
            for (int i = i8 ? MS_ROWS * CH : tid; i < MS_ROWS * CH; i += MS_NW * 32) {
                const int r = i / CH, ch = i % CH, t = r_tok[r], pr = phys(r);
                uint4 *dst = &sQ[at(pr, ch, MS_ROWS)];
                if (t < 0) {
                    *dst = make_uint4(0, 0, 0, 0);
                    continue;
                }
                const int64_t src = (int64_t)(t - p.q_lo) * p.q_ts + (int64_t)r_head[r] * p.q_hs + ch * 8;
                if (p.q_dtype == EI_F32) { /* rounded to T, as attention does; beyond T's range: refused */
                    const uint4 v = round8_of_f32<T>((const float *)p.q + src, p.vec);
                    bad |= nonfinite8<T>(v);
                    *dst = v;
                } else
                    load16<T>(dst, (const T *)p.q + src, p.vec);
            }
            if (bad) atomicOr(p.flag, PF_Q_RANGE);
        }
        cp_async_commit();
        cp_async_wait_all();
        if (WG) fence_proxy_async();
        __syncthreads();
        if (tid < NMT) {
            int mx = -1, lm = 0;
            for (int r = tid * 16; r < tid * 16 + 16; r++) {
                mx = max(mx, r_tok[r]);
                lm = max(lm, r_lim[r]);
            }
            mt_tmax[tid] = mx;
            mt_lim[tid] = lm;
        }
        int trow[MT][2], tlim[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                int r = (warp * MT + mt) * 16 + (lane >> 2) + 8 * hf;
                trow[mt][hf] = r_tok[r];
                tlim[mt][hf] = r_lim[r];
            }
        __syncthreads();
        const int kend1 = kend1_s, kend2 = kend2_s;
        if (kend1 == 0) continue; /* no row of this chunk is used */
        int wt1 = -1, wl2 = 0, wmin_t = INT_MAX, wmin_lim = INT_MAX;
        if (WG) /* a warpgroup computes its tiles together: its 8 m-tiles decide */
            for (int m = (warp >> 2) * 8; m < (warp >> 2) * 8 + 8; m++) {
                wt1 = max(wt1, mt_tmax[m]);
                wl2 = max(wl2, mt_lim[m]);
            }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            wt1 = max(wt1, mt_tmax[warp * MT + mt]);
            wl2 = max(wl2, mt_lim[warp * MT + mt]);
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                if (trow[mt][hf] >= 0) {
                    wmin_t = min(wmin_t, trow[mt][hf]);
                    wmin_lim = min(wmin_lim, tlim[mt][hf]);
                }
        }
        /* the warp's smallest token and mass limit over its used rows: tiles below them need no
           mask (unused rows score a zero query and are dropped by their statistics) */
        for (int o = 16; o; o >>= 1) {
            wmin_t = min(wmin_t, __shfl_xor_sync(0xffffffffu, wmin_t, o));
            wmin_lim = min(wmin_lim, __shfl_xor_sync(0xffffffffu, wmin_lim, o));
        }
        float2 *stats = p.stats + ((((int64_t)kvh * p.ngroups + g) * p.rchunks + chunk) * p.ns) * MS_ROWS;

        if constexpr (PHASE == 1) {
            /* ---- the rows' max and sum over this part of the keys 0..t */
            float m_[MT][2], l_[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) m_[mt][0] = m_[mt][1] = -INFINITY, l_[mt][0] = l_[mt][1] = 0.f;
            /* the scores of one tile: masked = the tile reaches past a used row's token */
            auto tile1 = [&](auto masked, float (&sc)[MT][NB][4], int ts) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                    for (int nt = 0; nt < NB; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            if constexpr (decltype(masked)::value) {
                                int key = ts + nt * 8 + (lane & 3) * 2 + (e & 1);
                                if (key > trow[mt][e >> 1]) sc[mt][nt][e] = -INFINITY;
                            }
                            mx[e >> 1] = fmaxf(mx[e >> 1], sc[mt][nt][e]);
                        }
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        float x = mx[hf];
                        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
                        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
                        float mnew = fmaxf(m_[mt][hf], x), mu = mnew == -INFINITY ? 0.f : mnew * sl;
                        if (mnew != m_[mt][hf]) l_[mt][hf] *= fast_exp2(m_[mt][hf] * sl - mu);
                        m_[mt][hf] = mnew;
                        float a0 = 0.f, a1 = 0.f;
#pragma unroll
                        for (int nt = 0; nt < NB; nt += 2) {
                            a0 += fast_exp2(fmaf(sc[mt][nt][2 * hf], sl, -mu)) + fast_exp2(fmaf(sc[mt][nt][2 * hf + 1], sl, -mu));
                            a1 += fast_exp2(fmaf(sc[mt][nt + 1][2 * hf], sl, -mu)) +
                                  fast_exp2(fmaf(sc[mt][nt + 1][2 * hf + 1], sl, -mu));
                        }
                        l_[mt][hf] += a0 + a1;
                    }
                }
            };
            int lo, hi;
            mass_part(kend1, split, p.ns, p.align, &lo, &hi);
            const int j0 = lo / MS_BC, j1 = (hi + MS_BC - 1) / MS_BC;
            if (j0 < j1) {
                issue(j0, 0);
                cp_async_commit();
                cp_async_wait_all();
                if (WG) fence_proxy_async();
                __syncthreads();
            }
            for (int j = j0; j < j1; j++) {
                int buf = (j - j0) & 1, ts = j * MS_BC;
                if (j + 1 < j1) issue(j + 1, buf ^ 1);
                cp_async_commit();
                if (ts <= wt1) { /* (warpgroup-uniform for WG: wgmma runs in all four warps) */
                    float sc[MT][NB][4];
                    qk(sc, sK + buf * MS_BC * RS);
                    if (i8) logits_i8(sc, buf);
                    if (ts + MS_BC - 1 > wmin_t) tile1(std::true_type{}, sc, ts);
                    else tile1(std::false_type{}, sc, ts);
                }
                cp_async_wait_all();
                if (WG) fence_proxy_async();
                __syncthreads();
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    float l = l_[mt][hf];
                    l += __shfl_xor_sync(0xffffffffu, l, 1);
                    l += __shfl_xor_sync(0xffffffffu, l, 2);
                    if ((lane & 3) == 0)
                        stats[(int64_t)split * MS_ROWS + (warp * MT + mt) * 16 + (lane >> 2) + 8 * hf] =
                            make_float2(m_[mt][hf], l);
                }
        } else {
            /* ---- the parts' stats, then this part of the keys before each row's segment:
               p = 2^(x * scale log2 e - (max * scale log2 e + log2 sum)) */
            float mu[MT][2];
            bool bad = false;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    int r = (warp * MT + mt) * 16 + (lane >> 2) + 8 * hf;
                    float m = -INFINITY, l = 0.f;
                    for (int j = 0; j < p.ns; j++) m = fmaxf(m, stats[(int64_t)j * MS_ROWS + r].x);
                    bool ok = m > -INFINITY && m < INFINITY;
                    if (ok)
                        for (int j = 0; j < p.ns; j++) {
                            float2 st = stats[(int64_t)j * MS_ROWS + r];
                            if (st.x > -INFINITY) l += st.y * fast_exp2((st.x - m) * sl);
                        }
                    ok = ok && l > 0.f && l < INFINITY; /* also catches NaN */
                    if (trow[mt][hf] >= 0 && !ok) bad = true;
                    /* an unused or refused row adds nothing: 2^-inf */
                    mu[mt][hf] = (ok && trow[mt][hf] >= 0) ? fmaf(m, sl, log2f(l)) : INFINITY;
                }
            if (bad && split == 0) atomicOr(p.flag, PF_SAMPLED);
            /* the scores of one tile: masked = the tile reaches a used row's segment */
            auto tile2 = [&](auto masked, float (&sc)[MT][NB][4], int ts) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    float c[16];
#pragma unroll
                    for (int nt = 0; nt < NB; nt++)
#pragma unroll
                        for (int col = 0; col < 2; col++) {
                            float p0 = fast_exp2(fmaf(sc[mt][nt][col], sl, -mu[mt][0]));
                            float p1 = fast_exp2(fmaf(sc[mt][nt][2 + col], sl, -mu[mt][1]));
                            if constexpr (decltype(masked)::value) {
                                int key = ts + nt * 8 + (lane & 3) * 2 + col;
                                p0 = key < tlim[mt][0] ? p0 : 0.f;
                                p1 = key < tlim[mt][1] ? p1 : 0.f;
                            }
                            c[nt * 2 + col] = p0 + p1;
                        }
                    float2 cs = colsum_scatter(c, lane);
                    colsum[warp * MT + mt][2 * lane] = cs.x;
                    colsum[warp * MT + mt][2 * lane + 1] = cs.y;
                }
            };
            int lo, hi;
            mass_part(kend2, split, p.ns, p.align, &lo, &hi);
            const int j0 = lo / MS_BC, j1 = (hi + MS_BC - 1) / MS_BC;
            const int nbt = (MS_BC + p.bs - 1) / p.bs + 1; /* blocks a tile can touch (general path) */
            if (j0 < j1) {
                issue(j0, 0);
                cp_async_commit();
                cp_async_wait_all();
                if (WG) fence_proxy_async();
                __syncthreads();
            }
            for (int j = j0; j < j1; j++) {
                int buf = (j - j0) & 1, ts = j * MS_BC;
                if (j + 1 < j1) issue(j + 1, buf ^ 1);
                cp_async_commit();
                if (ts < wl2) { /* (warpgroup-uniform for WG) */
                    float sc[MT][NB][4];
                    qk(sc, sK + buf * MS_BC * RS);
                    if (i8) logits_i8(sc, buf);
                    if (ts + MS_BC > wmin_lim) tile2(std::true_type{}, sc, ts);
                    else tile2(std::false_type{}, sc, ts);
                }
                __syncthreads();
                if (p.bs <= 32 && !(p.bs & (p.bs - 1))) {
                    /* one (segment, key) per thread: m-tiles in order, then the block's keys by a
                       shuffle tree (a block is bs consecutive lanes); one store per block */
                    for (int x = tid; x < p.spc * MS_BC; x += MS_NW * 32) {
                        int a = x / MS_BC, key = x % MS_BC, s = s_lo + a; /* a is the same across the warp */
                        if (s >= p.nseg) continue;
                        int mt0 = a * p.rpad / 16, mt1 = min(NMT, (a + 1) * p.rpad / 16), lim = 0;
                        float v = 0.f;
                        for (int mt = mt0; mt < mt1; mt++) {
                            int L = mt_lim[mt];
                            lim = max(lim, L);
                            if (L > ts) v += colsum[mt][key];
                        }
                        if (ts >= lim) continue;
                        for (int o = 1; o < p.bs; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                        if (!(key & (p.bs - 1)) && ts + key < lim) {
                            float *dst = p.mass + ((int64_t)kvh * p.mrows + s - p.mseg0) * p.nblk + (ts + key) / p.bs;
                            if (p.rchunks > 1) *dst += v;
                            else *dst = v;
                        }
                    }
                } else {
                    /* (segment, block) pairs this tile touches, keys in order */
                    for (int x = tid; x < p.spc * nbt; x += MS_NW * 32) {
                        int a = x / nbt, s = s_lo + a;
                        if (s >= p.nseg) continue;
                        int mt0 = a * p.rpad / 16, mt1 = min(NMT, (a + 1) * p.rpad / 16), lim = 0;
                        for (int mt = mt0; mt < mt1; mt++) lim = max(lim, mt_lim[mt]);
                        int kend = min(ts + MS_BC, lim);
                        int b = ts / p.bs + x % nbt;
                        int k0 = max(b * p.bs, ts), k1 = min((b + 1) * p.bs, kend);
                        if (k0 >= k1) continue;
                        float acc = 0.f;
                        for (int key = k0; key < k1; key++) {
                            float csum = 0.f;
                            for (int mt = mt0; mt < mt1; mt++)
                                if (mt_lim[mt] > ts) csum += colsum[mt][key - ts];
                            acc += csum;
                        }
                        p.mass[((int64_t)kvh * p.mrows + s - p.mseg0) * p.nblk + b] += acc;
                    }
                }
                cp_async_wait_all();
                if (WG) fence_proxy_async();
                __syncthreads();
            }
        }
    }
}

#define MG_RT 32
#define MG_TK 32
#define MG_DC 32
__global__ void __launch_bounds__(256) mass_generic_kernel(const MassParams p) {
    __shared__ float qs[MG_RT][MG_DC + 1], ks[MG_TK][MG_DC + 1], P[MG_RT][MG_TK + 1], colsum[MG_TK];
    __shared__ int r_tok[MG_RT], r_head[MG_RT], kend1_s;
    __shared__ float r_sq[MG_RT]; /* EI_RANK_PRECISION_INT8: each row's scale s_q */
    const int tid = threadIdx.x, tr = tid >> 3, tk = tid & 7, warp = tid >> 5;
    const int kvh = blockIdx.x % p.nkv, s = p.s_first + (p.ngroups - 1 - blockIdx.x / p.nkv);
    const int lim = s * p.seg;
    /* logits: scale q.k (natural units, expf), or with EI_RANK_PRECISION_INT8 (p.k the rounded keys, the
       dot exact) ((scale_log2 s_q) s_k) dot in that order (log2 units, exp2f) */
    const bool i8 = p.k_scale != NULL;
    auto logit = [&](float acc, int key) {
        return i8 ? __fmul_rn(__fmul_rn(__fmul_rn(p.scale_log2, r_sq[tr]), p.k_scale[(int64_t)kvh * p.n + key]), acc)
                  : acc * p.scale;
    };
    auto ex = [&](float x) { return i8 ? exp2f(x) : expf(x); };
    /* acc[u] = q_row(tr) . k(j0 + tk + 8u) over the head dimension */
    auto dots = [&](int j0, float (&acc)[4]) {
        for (int u = 0; u < 4; u++) acc[u] = 0.f;
        for (int d0 = 0; d0 < p.D; d0 += MG_DC) {
            __syncthreads();
            for (int x = tid; x < MG_RT * MG_DC; x += 256) {
                int r = x / MG_DC, dd = x % MG_DC, d = d0 + dd;
                const int64_t qi = (int64_t)(r_tok[r] - p.q_lo) * p.q_ts + (int64_t)r_head[r] * p.q_hs + d;
                qs[r][dd] = (r_tok[r] >= 0 && d < p.D) ? (i8 ? i8_of(p.q, p.q_dtype, qi, r_sq[r]) : load_f32(p.q, p.q_dtype, qi))
                                                       : 0.f;
                int64_t key = (int64_t)j0 + r;
                ks[r][dd] = (key < p.n && d < p.D) ? load_f32(p.k, p.k_dtype, key * p.k_ts + (int64_t)kvh * p.k_hs + d) : 0.f;
            }
            __syncthreads();
            for (int dd = 0; dd < MG_DC; dd++) {
                float qv = qs[tr][dd];
                for (int u = 0; u < 4; u++) acc[u] = fmaf(qv, ks[tk + 8 * u][dd], acc[u]);
            }
        }
    };
    for (int i0 = 0; i0 < p.R; i0 += MG_RT) {
        __syncthreads();
        if (tid == 0) kend1_s = 0;
        __syncthreads();
        if (tid < MG_RT) {
            int i = i0 + tid, t = -1, hh = 0;
            if (i < p.R) t = sample_row(p, s, i, kvh, &hh);
            r_tok[tid] = t;
            r_head[tid] = hh;
            if (t >= 0) atomicMax(&kend1_s, t + 1);
        }
        __syncthreads();
        if (i8) { /* the rows' int8 scales, a warp a row */
            for (int r = warp; r < MG_RT; r += 8) {
                const int64_t src = (int64_t)(r_tok[r] - p.q_lo) * p.q_ts + (int64_t)r_head[r] * p.q_hs;
                const float sq = r_tok[r] >= 0 ? warp_i8_scale(p.q, p.q_dtype, src, p.D, p.flag, PF_NAN_Q) : 0.f;
                if ((tid & 31) == 0) r_sq[r] = sq;
            }
            __syncthreads();
        }
        const int kend1 = kend1_s, tok = r_tok[tr];
        if (kend1 == 0) continue;
        /* pass 1: this thread's keys, then the row over its 8 lanes */
        float m = -INFINITY, l = 0.f;
        bool bad = false;
        for (int j0 = 0; j0 < kend1; j0 += MG_TK) {
            float acc[4];
            dots(j0, acc);
            for (int u = 0; u < 4; u++) {
                int key = j0 + tk + 8 * u;
                if (key > tok) continue;
                float x = logit(acc[u], key);
                if (!isfinite(x)) { bad = true; continue; }
                if (x > m) { l = l * ex(m - x) + 1.0f; m = x; }
                else l += ex(x - m);
            }
        }
        for (int o = 1; o < 8; o <<= 1) {
            float mo = __shfl_xor_sync(0xffffffffu, m, o), lo = __shfl_xor_sync(0xffffffffu, l, o);
            float M = fmaxf(m, mo);
            l = (m == -INFINITY ? 0.f : l * ex(m - M)) + (mo == -INFINITY ? 0.f : lo * ex(mo - M));
            m = M;
        }
        if (bad) atomicOr(p.flag, PF_SAMPLED);
        const float inv = (tok >= 0 && l > 0.f && isfinite(l)) ? 1.0f / l : 0.f;
        /* pass 2: probabilities of keys before the segment, summed over rows, then per block */
        for (int j0 = 0; j0 < lim; j0 += MG_TK) {
            float acc[4];
            dots(j0, acc);
            for (int u = 0; u < 4; u++) {
                int key = j0 + tk + 8 * u;
                P[tr][tk + 8 * u] = (inv > 0.f && key < lim) ? ex(logit(acc[u], key) - m) * inv : 0.f;
            }
            __syncthreads();
            if (tid < MG_TK) {
                float cs = 0.f;
                for (int r = 0; r < MG_RT; r++) cs += P[r][tid];
                colsum[tid] = cs;
            }
            __syncthreads();
            int kend = min(j0 + MG_TK, lim), b0 = j0 / p.bs, b1 = (kend - 1) / p.bs;
            for (int b = b0 + tid; b <= b1; b += 256) {
                int k0 = max(b * p.bs, j0), k1 = min((b + 1) * p.bs, kend);
                float a = 0.f;
                for (int key = k0; key < k1; key++) a += colsum[key - j0];
                p.mass[((int64_t)kvh * p.mrows + s - p.mseg0) * p.nblk + b] += a;
            }
        }
    }
}

/* mass rows of segments s_first..nseg-1 of every kv head = 0 (p's layout) */
__global__ void mass_zero_kernel(const MassParams p) {
    int64_t per = (int64_t)(p.nseg - p.s_first) * p.nblk, all = per * p.nkv;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < all; e += (int64_t)gridDim.x * blockDim.x)
        p.mass[((e / per) * p.mrows + p.s_first - p.mseg0) * p.nblk + e % per] = 0.f;
}
/* EI_RANK_ROWS_SPREAD (CONCEPTS: ranking): the farthest-point rows of each
   sampled segment the call holds whole, as the CPU's ei__spread_rows, into
   p.spread (candidate numbers in ascending order, -1 past the last). One
   CTA per (segment, kv head), one thread per candidate (ei__spread_stride
   caps a segment's candidates at 128 KiB of int8 rows: 1024 at d 128, 512
   at d 256, when G allows; the launch refuses more than its threads).
   Picks are sequential, so their latency is the kernel's time (a chunk of
   512 tokens launches only n_kv_heads CTAs): each thread keeps its
   candidate's row (NC 16-byte chunks, NC 4 / 8 / 16: head_dim 64 / 128 /
   256; NC 0, other sizes: read from shared memory each pick), 1 / sqrt(norm)
   and largest cosine so far in registers, so a pick reads only the picked
   row (a broadcast), then one warp reduction (spread_warp_min), one
   barrier, and every warp reduces the warps' minima itself (two buffers: a
   warp cannot be a pick ahead of a warp still reading). The rows are the CPU's bit for bit: the
   rounding is ei__quant_i8's (correctly rounded f32 divisions), the dots
   are exact int32, the cosines the same double products, and the
   reductions pick the smallest (cosine, candidate) pair, the earliest
   candidate on ties, whatever order they combine them in. Shared memory:
   C rows of spread_row_chunks 16-byte chunks, C doubles r, min(R, C)
   picks. */
#define SP_THREADS 1024 /* one CTA an SM: every warp it can hold */
/* A candidate's row in 16-byte chunks: (D + 15) / 16 read, the stride made
   odd, so that the 8 threads of a quarter warp reading chunk c of 8
   consecutive rows hit 8 distinct bank groups (NC 0). */
static __host__ __device__ int spread_row_chunks(int D) { return (D + 15) / 16 | 1; }
static size_t spread_smem_bytes(int64_t C, int D, int R) {
    return (size_t)C * (size_t)spread_row_chunks(D) * 16 + (size_t)C * 8 + (size_t)std::min((int64_t)R, C) * 4;
}
/* threads of spread_pick_kernel<NC>: 512 at 16 chunks (64 registers of row) */
static __host__ __device__ constexpr int spread_threads(int NC) { return NC == 16 ? 512 : SP_THREADS; }
/* A largest cosine as an unsigned key of the same order: the cosines are
   finite, never -0 (a zero dot gives +0: its factors are >= 0), so the
   order of the keys is that of the doubles, ties included. */
__device__ __forceinline__ unsigned long long spread_key(double v) {
    const unsigned long long b = (unsigned long long)__double_as_longlong(v);
    return (b >> 63) ? ~b : b | 0x8000000000000000ull;
}
/* The smallest (key, candidate) pair of the warp, the earliest candidate on
   ties, in every lane: three redux.sync (the key's halves, then the
   candidate among the lanes that hold the key) instead of a butterfly of
   double compares, so that a pick waits on few dependent steps. */
__device__ __forceinline__ void spread_warp_min(unsigned long long &k, int &i) {
    const unsigned hi = (unsigned)(k >> 32), lo = (unsigned)k;
    const unsigned mh = __reduce_min_sync(0xffffffffu, hi);
    const unsigned ml = __reduce_min_sync(0xffffffffu, hi == mh ? lo : 0xffffffffu);
    i = (int)__reduce_min_sync(0xffffffffu, hi == mh && lo == ml ? (unsigned)i : 0xffffffffu);
    k = (unsigned long long)mh << 32 | ml;
}
__device__ __forceinline__ void spread_dot4(int4 a, int4 y, int (&d)[4]) { /* four chains: the exact sum either way */
    d[0] = __dp4a(a.x, y.x, d[0]);
    d[1] = __dp4a(a.y, y.y, d[1]);
    d[2] = __dp4a(a.z, y.z, d[2]);
    d[3] = __dp4a(a.w, y.w, d[3]);
}
/* Candidate b (= j G + g) of segment s: its int8 row (zeros past D: the dots read whole chunks) and
   1 / sqrt(norm), by one warp; NaN / Inf in q flag PF_NAN_Q. */
__device__ void spread_candidate(const MassParams &p, int s, int kvh, int b, int nc, signed char *row, double *r) {
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)s * p.seg + (int64_t)(b / p.G) * p.sp_st;
    const int64_t base = (t - p.q_lo) * p.q_ts + (int64_t)(kvh * p.G + b % p.G) * p.q_hs;
    const float sc = warp_i8_scale(p.q, p.q_dtype, base, p.D, p.flag, PF_NAN_Q);
    int nn = 0;
    for (int e = lane; e < nc * 16; e += 32) {
        const int8_t v = (int8_t)(e < p.D ? i8_of(p.q, p.q_dtype, base + e, sc) : 0.f);
        row[e] = v;
        nn += (int)v * v;
    }
    for (int o = 16; o; o >>= 1) nn += __shfl_xor_sync(0xffffffffu, nn, o);
    if (lane == 0) *r = nn > 0 ? __ddiv_rn(1.0, __dsqrt_rn((double)nn)) : 0.0;
}
template <int NC>
__global__ void __launch_bounds__(spread_threads(NC)) spread_pick_kernel(const MassParams p, int C) {
    extern __shared__ __align__(16) unsigned char sp_smem[];
    constexpr int NT = spread_threads(NC), NW = NT / 32;
    const int s = p.s_first + (int)blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int R = p.R, nmax = min(R, C), nc = NC ? NC : (p.D + 15) / 16, rc = spread_row_chunks(p.D);
    int4 *cand = (int4 *)sp_smem;
    double *r = (double *)(cand + (int64_t)C * rc);
    int *picks = (int *)(r + C);
    __shared__ unsigned long long red_k[2][NW];
    __shared__ int red_i[2][NW];
    if (!ei__spread_whole(&p.cfg, s, p.q_lo, p.q_lo, p.n)) return; /* the even rows: the table is not read */
    for (int b = warp; b < C; b += NW) spread_candidate(p, s, kvh, b, nc, (signed char *)(cand + (int64_t)b * rc), r + b);
    __syncthreads();
    const bool mine = tid < C; /* this thread's candidate: tid */
    const int4 *x = cand + (int64_t)(mine ? tid : 0) * rc;
    int4 own[NC ? NC : 1];
    if (NC) {
#pragma unroll
        for (int c = 0; c < (NC ? NC : 1); c++) own[c] = x[c];
    }
    const double rb = mine ? r[tid] : 0.0;
    double best = -2.0; /* the largest cosine to the rows so far; 3 once taken: above every cosine */
    int pick = (int)ei__spread_first(&p.cfg, p.G, p.D), n = 0;
    for (;;) {
        if (tid == 0) picks[n] = pick;
        if (++n == nmax) break;
        unsigned long long key = ~0ull; /* no candidate: above every candidate */
        int bi = 0x7fffffff;
        if (mine) {
            const int4 *pr = cand + (int64_t)pick * rc;
            int d[4] = {0, 0, 0, 0};
            if (NC) {
#pragma unroll
                for (int c = 0; c < (NC ? NC : 1); c++) spread_dot4(own[c], pr[c], d);
            } else
                for (int c = 0; c < nc; c++) spread_dot4(x[c], pr[c], d);
            const double cs = __dmul_rn(__dmul_rn((double)((d[0] + d[1]) + (d[2] + d[3])), rb), r[pick]);
            if (tid == pick) best = 3.0;
            else if (cs > best) best = cs;
            key = spread_key(best);
            bi = tid;
        }
        spread_warp_min(key, bi);
        if (lane == 0) { red_k[n & 1][warp] = key; red_i[n & 1][warp] = bi; }
        __syncthreads();
        key = ~0ull; bi = 0x7fffffff;
        if (lane < NW) { key = red_k[n & 1][lane]; bi = red_i[n & 1][lane]; }
        spread_warp_min(key, bi);
        pick = bi; /* every lane of every warp: redux.sync leaves the minimum in all */
    }
    if (tid == 0) /* candidate order */
        for (int i = 1; i < n; i++) {
            int v = picks[i], k = i;
            for (; k > 0 && picks[k - 1] > v; --k) picks[k] = picks[k - 1];
            picks[k] = v;
        }
    __syncthreads();
    int *out = p.spread + ((int64_t)kvh * p.mrows + s - p.mseg0) * R;
    for (int i = tid; i < R; i += NT) out[i] = i < n ? picks[i] : -1;
}
template <int NC>
static ei_result launch_spread_pick(const MassParams &p, int64_t C, size_t smem, int nseg, cudaStream_t st, char *msg) {
    CUDA_TRY(cudaFuncSetAttribute(spread_pick_kernel<NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    spread_pick_kernel<NC><<<dim3((unsigned)(nseg - p.s_first), (unsigned)p.nkv), spread_threads(NC), smem, st>>>(p, (int)C);
    return EI_OK;
}

/* Zeroes the mass rows of the sampled segments and launches the kernels
   (stats: the part statistics, MS_ROWS float2 per row chunk and part, at
   most stats_bytes of them; key parts at most parts_max, see
   mass_geometry). The rows are those of tokens q_lo..n-1 (q
   holds them from q_lo) of segments [s_lo, nseg); the mass of segment s of
   kv head h at mass + (h * mrows + s - mseg0) * nblk. The whole prompt: q_lo
   0, s_lo 0, mseg0 0, mrows nseg. tn: the call's tuning knobs (the kernel
   choice, the CTA count). */
static ei_result launch_sample_mass(const ei_config *cfg, const ei_tensor *q, const ei_tensor *k, int64_t q_lo, int64_t n,
                                    int s_lo, int nseg, int mseg0, int mrows, int nblk, int parts_max, float *mass,
                                    float2 *stats, size_t stats_bytes, int *spread, float *k8s, char *k8, int *flag,
                                    const CudaTuning &tn, cudaStream_t st, char *msg) {
    MassParams p;
    memset(&p, 0, sizeof p);
    int D = q->head_dim;
    if (!mass_geometry(cfg, s_lo, nseg, k->n_heads, parts_max, tn, &p.s_first, &p.spc, &p.rpad, &p.rchunks, &p.ngroups,
                       &p.ns))
        return EI_OK; /* no segment is ranked by sampled mass */
    {   /* a chunk's segments in the whole prompt's statistics (sized for the plan's capacity): fewer parts if need be
           (the capacity's geometry has at least as many groups, so one part fits) */
        size_t per_part = (size_t)k->n_heads * (size_t)p.ngroups * (size_t)p.rchunks * MS_ROWS * sizeof(float2);
        if ((size_t)p.ns * per_part > stats_bytes) p.ns = (int)std::max((size_t)1, stats_bytes / per_part);
    }
    p.q = q->data; p.k = k->data;
    p.q_ts = q->token_stride; p.q_hs = q->head_stride; p.k_ts = k->token_stride; p.k_hs = k->head_stride;
    p.n = n; p.q_lo = q_lo; p.mrows = mrows; p.mseg0 = mseg0;
    p.q_dtype = q->dtype; p.k_dtype = k->dtype; p.D = D;
    p.nseg = nseg; p.nblk = nblk; p.nkv = k->n_heads; p.G = q->n_heads / k->n_heads; p.R = cfg->rank_samples;
    p.seg = cfg->segment_size; p.bs = cfg->block_size;
    p.align = (p.bs <= 32 && !(p.bs & (p.bs - 1))) ? MS_BC : MS_BC * p.bs;
    p.scale = cfg->attn_scale > 0.f ? cfg->attn_scale : 1.0f / sqrtf((float)D);
    p.scale_log2 = p.scale * 1.4426950408889634f;
    p.mass = mass; p.stats = stats; p.flag = flag; p.cfg = *cfg;
    {
        int64_t per = (int64_t)(nseg - p.s_first) * nblk;
        mass_zero_kernel<<<stride_blocks(per * p.nkv), 256, 0, st>>>(p);
        LAUNCH_CHECK("mass_zero_kernel");
    }
    if (ei__rank_spread(cfg)) { /* the spread rows of the segments the call holds whole, first */
        const int64_t C = ei__spread_candidates(cfg, p.G, D);
        const size_t smem = spread_smem_bytes(C, D, p.R);
        int smem_max = 0;
        ei_result e;
        if ((e = smem_limit(&smem_max, msg)) || (e = grid_fits("profile (spread rows)", nseg - p.s_first, p.nkv, 1, msg)))
            return e;
        /* the candidates' rows in registers at head_dim 64 / 128 / 256 (16 chunks: 512 threads) */
        const int nc = (D + 15) / 16, NC = (nc == 4 || nc == 8 || (nc == 16 && C <= spread_threads(16))) ? nc : 0;
        if (C > spread_threads(NC) || smem > (size_t)smem_max)
            return fail(msg, EI_ERR_UNSUPPORTED,
                        "EI_RANK_ROWS_SPREAD: a segment's %lld candidates (%d query heads per kv head) need %zu bytes of "
                        "shared memory and %lld threads; the device has %d bytes, the kernel %d threads",
                        (long long)C, (int)p.G, smem, (long long)C, smem_max, spread_threads(NC));
        p.spread = spread;
        p.sp_st = (int)ei__spread_stride(cfg, p.G, D);
        e = NC == 4 ? launch_spread_pick<4>(p, C, smem, nseg, st, msg) : NC == 8 ? launch_spread_pick<8>(p, C, smem, nseg, st, msg)
            : NC == 16 ? launch_spread_pick<16>(p, C, smem, nseg, st, msg) : launch_spread_pick<0>(p, C, smem, nseg, st, msg);
        if (e) return e;
        LAUNCH_CHECK("spread_pick_kernel");
    }
    /* tensor cores for 16-bit k with q of k's dtype or f32 (rounded to k's dtype as the Q rows are loaded),
       unless EI_CUDA_SAMPLED_GENERIC; EI_RANK_PRECISION_INT8: for every dtype up to head_dim 256 (i8_mma) */
    const bool i8 = rank_int8(cfg);
    bool mma = i8 ? i8_mma(D, tn)
                  : k->dtype != EI_F32 && (q->dtype == k->dtype || q->dtype == EI_F32) && (D == 64 || D == 128 || D == 256) &&
                        !tn.sampled_generic;
    ei_result r;
    if (i8) { /* the keys 0..n-1 rounded once, every kv head; the kernels read them in k's place */
        /* (the workspace holds the call's capacity of keys, profile_ws: n of them, indexed [kv][n]) */
        const int W = i8_width(D, tn);
        const int64_t keys = n * p.nkv;
        const int64_t per = mma ? 256 / (W / 8) : 8; /* keys a block of 256 threads rounds */
        if ((r = grid_fits("profile (int8 keys)", (keys + per - 1) / per, 1, 1, msg))) return r;
        const unsigned blocks = (unsigned)((keys + per - 1) / per);
        if (mma)
            rank_keys_i8_kernel<__nv_bfloat16><<<blocks, 256, 0, st>>>(k->data, k->dtype, k->token_stride, k->head_stride, n,
                                                                      p.nkv, D, W, (__nv_bfloat16 *)k8, k8s, flag);
        else
            rank_keys_i8_kernel<float><<<blocks, 256, 0, st>>>(k->data, k->dtype, k->token_stride, k->head_stride, n, p.nkv, D,
                                                              W, (float *)k8, k8s, flag);
        LAUNCH_CHECK("rank_keys_i8_kernel");
        p.k = k8;
        p.k_dtype = mma ? EI_BF16 : EI_F32;
        p.k_ts = W;
        p.k_hs = n * W;
        p.k_scale = k8s;
        D = W; /* the tensor-core kernel's row width */
    }
    if (!mma) { /* one CTA per (kv head, segment) */
        p.spc = 1; p.rpad = MG_RT; p.rchunks = 1; p.ns = 1;
        p.ngroups = nseg - p.s_first;
        if ((r = grid_fits("profile (sampled rows)", (int64_t)p.ngroups * p.nkv, 1, 1, msg))) return r;
        mass_generic_kernel<<<(unsigned)((int64_t)p.ngroups * p.nkv), 256, 0, st>>>(p);
        LAUNCH_CHECK("mass_generic_kernel");
        return EI_OK;
    }
    p.vec = i8 || /* int8: the rounded keys are aligned rows; q is read element by element */
            (!((uintptr_t)q->data & 15) && !((uintptr_t)k->data & 15) && !(q->token_stride & 7) &&
             !(q->head_stride & 7) && !(k->token_stride & 7) && !(k->head_stride & 7));
    if ((r = grid_fits("profile (sampled rows)", (int64_t)p.ngroups * p.nkv * p.ns, 1, 1, msg))) return r;
    unsigned grid = (unsigned)((int64_t)p.ngroups * p.nkv * p.ns);
    bool bf = p.k_dtype == EI_BF16;
    bool wg = wgmma_available() && !tn.sampled_mma; /* EI_CUDA_SAMPLED_MMA: mma.sync even where wgmma runs */
#define EI__MASS_K(DD, TT, WW)                                                                            \
    do {                                                                                                  \
        size_t smem = WW ? (size_t)(MS_ROWS + 2 * MS_BC) * DD * 2 + 1024                                  \
                         : (size_t)(MS_ROWS + 2 * MS_BC) * (DD / 8 + 1) * 16;                             \
        CUDA_TRY(cudaFuncSetAttribute(mass_mma_kernel<DD, TT, 1, WW>,                                     \
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));           \
        CUDA_TRY(cudaFuncSetAttribute(mass_mma_kernel<DD, TT, 2, WW>,                                     \
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));           \
        mass_mma_kernel<DD, TT, 1, WW><<<grid, MS_NW * 32, smem, st>>>(p);                                \
        LAUNCH_CHECK("mass_mma_kernel (statistics)");                                                     \
        mass_mma_kernel<DD, TT, 2, WW><<<grid, MS_NW * 32, smem, st>>>(p);                                \
        LAUNCH_CHECK("mass_mma_kernel (mass)");                                                           \
        return EI_OK;                                                                                     \
    } while (0)
#define EI__MASS(DD, TT)                                                                                  \
    do {                                                                                                  \
        if (wg) EI__MASS_K(DD, TT, true);                                                                 \
        EI__MASS_K(DD, TT, false);                                                                        \
    } while (0)
    if (D == 64) { if (bf) EI__MASS(64, __nv_bfloat16); EI__MASS(64, __half); }
    if (D == 128) { if (bf) EI__MASS(128, __nv_bfloat16); EI__MASS(128, __half); }
    if (bf) EI__MASS(256, __nv_bfloat16);
    EI__MASS(256, __half);
#undef EI__MASS
#undef EI__MASS_K
}

/* ============================================================ >>cuda-decode */
/* The queries decode_observe keeps (tokens first_tok .. first_tok+count-1 of
   q): the first non-finite element as the key (token << 12 | head), the
   order of the CPU's scan (token, then head; heads < 4096). */
__global__ void observe_scan_kernel(const void *q, int dtype, int64_t ts, int64_t hs, int64_t first_tok, int64_t count,
                                    int nh, int D, unsigned long long *first_bad) {
    int64_t total = count * nh * D;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(e % D);
        int h = (int)((e / D) % nh);
        int64_t t = first_tok + e / ((int64_t)D * nh);
        if (!isfinite(load_f32(q, dtype, t * ts + (int64_t)h * hs + d)))
            atomicMin(first_bad, ((unsigned long long)t << 12) | (unsigned long long)h);
    }
}
/* query number first_number + i goes to ring slot (first_number + i) % window
   (gate: with deferred errors, the scan's report: nothing written unless ~0) */
__global__ void observe_kernel(const void *q, int dtype, int64_t ts, int64_t hs, int64_t first_tok, int64_t count,
                               int64_t first_number, int window, int nh, int D, float *ring,
                               const unsigned long long *gate) {
    if (gate && *gate != ~0ull) return;
    int64_t total = count * nh * D;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(e % D);
        int h = (int)((e / D) % nh);
        int64_t i = e / ((int64_t)D * nh);
        int64_t slot = (first_number + i) % window;
        ring[(slot * nh + h) * D + d] = load_f32(q, dtype, (first_tok + i) * ts + (int64_t)h * hs + d);
    }
}

/* ------------------------------------------------------------ row maps
   A cache of n rows whose row j holds position row_pos[j] (-1: none, an
   empty row: never read). The rows holding positions, oldest first, come
   from a radix sort (CUB, stable) of the keys row_pos[j] + 1 with the rows as
   values, so the empty rows (key 0) lead and are skipped; map m (one per kv
   head, or one for every head) is sorted on its own. info[m][4] (device):
   the positions the map holds (np), the first row whose value is < -1, the
   first sorted index whose position repeats the one before it (~0: none),
   and the span between the newest and the W-th newest position (W - 1 when
   consecutive); the host reads it back and reports the CPU's errors. After
   the maps' info, lens[m]: the newest position + 1 (what a ratio budget
   follows, H2O's sums end at). W here is the call's tail (ei__decode_tail). */
struct MapRef {
    const int *order;               /* [maps][n] sorted rows; NULL: row j holds position j (np = n) */
    const unsigned long long *info; /* [maps][4] */
    int64_t n;
    int maps;                       /* 0 (identity), 1 (one for every kv head) or n_kv_heads */
};
__device__ __forceinline__ int64_t map_np(const MapRef &r, int m) { return r.order ? (int64_t)r.info[4 * m] : r.n; }
/* the row of the j-th oldest position of map m (np: map_np) */
__device__ __forceinline__ int64_t map_row(const MapRef &r, int m, int64_t np, int64_t j) {
    return r.order ? (int64_t)r.order[(int64_t)m * r.n + (r.n - np) + j] : j;
}
__global__ void map_init_kernel(unsigned long long *info, int m0, int m1) {
    for (int m = m0 + (int)threadIdx.x; m < m1; m += blockDim.x) {
        info[4 * m] = 0;
        info[4 * m + 1] = ~0ull;
        info[4 * m + 2] = ~0ull;
        info[4 * m + 3] = 0;
    }
}
__global__ void map_prep_kernel(const int *row_pos, int64_t stride, int m0, int m1, int64_t n, unsigned *keys, int *vals,
                                unsigned long long *info) {
    int64_t total = (int64_t)(m1 - m0) * n;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int m = m0 + (int)(e / n);
        int64_t j = e % n, at = (int64_t)m * n + j;
        int p = row_pos[(int64_t)m * stride + j];
        if (p < -1) atomicMin(&info[4 * m + 1], (unsigned long long)j);
        keys[at] = (unsigned)p + 1u; /* a value < -1 wraps: reported before any use */
        vals[at] = (int)j;
    }
}
__global__ void map_post_kernel(const unsigned *keys, int m0, int m1, int64_t n, int64_t W, unsigned long long *info,
                                unsigned long long *lens) {
    int64_t total = (int64_t)(m1 - m0) * n;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int m = m0 + (int)(e / n);
        int64_t i = e % n, at = (int64_t)m * n + i;
        unsigned k = keys[at], prev = i > 0 ? keys[at - 1] : 0u;
        if (k != 0u && prev == 0u) info[4 * m] = (unsigned long long)(n - i);
        if (k != 0u && prev == k) atomicMin(&info[4 * m + 2], (unsigned long long)i);
        if (i == n - 1 && W > 0 && n >= W) info[4 * m + 3] = (unsigned long long)(k - keys[at - (W - 1)]);
        if (i == n - 1) lens[m] = k; /* the newest position + 1: the sequence's length (a ratio budget's) */
    }
}

struct DecodeParams {
    const void *k;
    int dtype;
    int64_t k_ts, k_hs;
    const float *ring;
    int64_t first_slot; /* ring slot of the first scored query: q0 % window (ei__decode_scored) */
    int window;         /* ring length (dec->window) */
    int W, nh, nkv, G, D; /* W: queries scored (ei__decode_scored: m <= window) */
    int64_t T;          /* the tail (ei__decode_tail): candidates are keys j < np - T */
    int64_t lag;        /* positions after the last scored query's key (SnapKV: the generated ones) */
    int64_t n;          /* cache rows */
    int nchunks;
    float scale;
    float *stats;  /* [nh][W][nchunks][2] */
    float *mz;     /* [nh][W][2] */
    float *score;  /* decode_keep: [heads_out][n], candidate j (position order) of each head, j < L */
    float *raw;    /* decode_score: [nh][n] by row, rows holding positions (else NULL) */
    int per_kv, reduce_max;
    int h0, h1, kv0; /* query heads [h0, h1) scored; blockIdx.y is kv head kv0 + y */
    MapRef map;      /* the rows of kv head kvh in position order: map kvh (maps > 1) or 0 */
    unsigned long long *bad_k;   /* first non-finite key: kv head << 32 | row */
    unsigned long long *bad_row; /* first query head whose logits overflow */
    const unsigned long long *gate; /* deferred errors: the call's report (pass 2 writes nothing unless 0) */
};
#define DEC_KC 64
#define DEC_RC 32

/* Keys are taken in position order: key j (0 <= j < np, np the positions
   kv head kvh's map holds, L = np - T the candidates) is the row
   map_row(j). Query i (0 <= i < W) of the scored queries is query number
   q0 + i (ei__decode_scored), in ring slot (first_slot + i) % window; it
   lines up with key np - lag - W + i and sees keys 0 .. that one (causal
   inside the window, by position; the default: lag 0, T = W).
   Pass 1 (FINAL = 0): per chunk of DEC_KC keys and window query, the max and
   sum of exp of the logits; non-finite keys and overflowing logits are
   recorded. Pass 2 (FINAL = 1): the softmax weights, mean over the window,
   then either the scores of the candidates (reduced over the group when
   per_kv) or the raw per-row scores of every query head; one thread per key.
   Shared: the key chunk in f32 [DEC_KC][D+1] and logits [DEC_RC][DEC_KC+1]. */
template <int FINAL>
__global__ void __launch_bounds__(DEC_KC) decode_score_kernel(DecodeParams p) {
    extern __shared__ float dsm[];
    if (FINAL && p.gate && *p.gate != 0ull) return; /* a recorded fault: no scores */
    float *kt = dsm, *lg = dsm + DEC_KC * (p.D + 1);
    int c = blockIdx.x, kvh = p.kv0 + (int)blockIdx.y, tid = threadIdx.x;
    int m = p.map.maps > 1 ? kvh : 0;
    int64_t np = map_np(p.map, m), L = np - p.T, qbase = np - p.lag - p.W;
    int64_t j0 = (int64_t)c * DEC_KC, j = j0 + tid;
    int g_lo = max(p.h0 - kvh * p.G, 0), g_hi = min(p.h1 - kvh * p.G, p.G);
    for (int i = tid; i < DEC_KC * p.D; i += DEC_KC) {
        int r = i / p.D, d = i % p.D;
        int64_t jj = j0 + r;
        float x = 0.f;
        if (jj < np) {
            int64_t row = map_row(p.map, m, np, jj);
            x = load_f32(p.k, p.dtype, row * p.k_ts + (int64_t)kvh * p.k_hs + d);
            if (!FINAL && !isfinite(x)) atomicMin(p.bad_k, ((unsigned long long)kvh << 32) | (unsigned long long)row);
        }
        kt[r * (p.D + 1) + d] = x;
    }
    __syncthreads();
    const float *kr = kt + tid * (p.D + 1);
    int R = (g_hi - g_lo) * p.W;
    float red = 0.f; /* sum of one query head's window weights */
    for (int r0 = 0; r0 < R; r0 += DEC_RC) {
        int rc = min(DEC_RC, R - r0);
        for (int rr = 0; rr < rc; rr++) {
            int r = r0 + rr, g = g_lo + r / p.W, i = r % p.W, h = kvh * p.G + g;
            const float *qv = p.ring + (((p.first_slot + i) % p.window) * p.nh + h) * p.D;
            float acc = 0.f;
            for (int d = 0; d < p.D; d++) acc = fmaf(qv[d], kr[d], acc);
            float x = acc * p.scale;
            bool visible = j < np && j <= qbase + i;
            if (!FINAL) {
                if (visible && !(x < INFINITY)) atomicMin(p.bad_row, (unsigned long long)h); /* +inf or NaN */
                lg[rr * (DEC_KC + 1) + tid] = visible ? x : -INFINITY;
            } else {
                const float *s = p.mz + ((int64_t)h * p.W + i) * 2;
                float w = visible ? expf(x - s[0]) / s[1] : 0.f;
                lg[rr * (DEC_KC + 1) + tid] = w;
            }
        }
        __syncthreads();
        if (!FINAL) {
            /* warp w reduces rows w, w+2, ... over the chunk's keys */
            for (int rr = tid >> 5; rr < rc; rr += DEC_KC / 32) {
                int lane = tid & 31;
                float a = lg[rr * (DEC_KC + 1) + lane], b = lg[rr * (DEC_KC + 1) + lane + 32];
                float mx = warp_max(fmaxf(a, b));
                float z = mx == -INFINITY ? 0.f : warp_sum(expf(a - mx) + expf(b - mx));
                if (lane == 0) {
                    int r = r0 + rr, g = g_lo + r / p.W, i = r % p.W, h = kvh * p.G + g;
                    float *st = p.stats + (((int64_t)h * p.W + i) * p.nchunks + c) * 2;
                    st[0] = mx;
                    st[1] = z;
                }
            }
        } else if (j < np) {
            /* rows of one query head are consecutive: sum them per head */
            for (int rr = 0; rr < rc; rr++) {
                int r = r0 + rr, g = g_lo + r / p.W, i = r % p.W;
                red += lg[rr * (DEC_KC + 1) + tid];
                if (i == p.W - 1) { /* head g complete */
                    float mean = red / (float)p.W;
                    if (p.raw)
                        p.raw[(int64_t)(kvh * p.G + g) * p.n + map_row(p.map, m, np, j)] = mean;
                    else if (j < L) {
                        if (!p.per_kv)
                            p.score[(int64_t)(kvh * p.G + g) * p.n + j] = mean;
                        else { /* the CPU's ei__reduce_heads: in head order, then / G */
                            float *o = p.score + (int64_t)kvh * p.n + j;
                            if (g == g_lo) *o = mean;
                            else *o = p.reduce_max ? fmaxf(*o, mean) : *o + mean;
                            if (g == g_hi - 1 && !p.reduce_max) *o = *o / (float)(g_hi - g_lo);
                        }
                    }
                    red = 0.f;
                }
            }
        }
        __syncthreads();
    }
}

/* per (query head h in [h0, h1), window query i): max and sum over the chunks */
__global__ void decode_combine_kernel(DecodeParams p) {
    int r = p.h0 * p.W + (int)(blockIdx.x * blockDim.x + threadIdx.x); /* (h, i) */
    if (r >= p.h1 * p.W) return;
    const float *st = p.stats + (int64_t)r * p.nchunks * 2;
    float m = -INFINITY;
    for (int c = 0; c < p.nchunks; c++) m = fmaxf(m, st[2 * c]);
    float z = 0.f;
    for (int c = 0; c < p.nchunks; c++)
        if (st[2 * c] != -INFINITY) z += st[2 * c + 1] * expf(st[2 * c] - m);
    p.mz[2 * r] = m;
    p.mz[2 * r + 1] = z;
}

/* red[h][j] = the scores of query heads first = h * per .. + per (rows of
   n) of candidate j of head h's map (position order, j < L), reduced as the
   CPU's ei__reduce_heads (in head order; mean: then / per). */
__global__ void reduce_heads_kernel(const float *scores, int64_t n, int heads, int per, int reduce_max, MapRef mr,
                                    int div, int64_t W, float *red) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < (int64_t)heads * n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int h = (int)(idx / n);
        int64_t j = idx % n;
        int m = mr.maps > 1 ? h / div : 0;
        int64_t np = map_np(mr, m), L = np - W;
        if (j >= L) continue;
        const float *s = scores + (int64_t)h * per * n + map_row(mr, m, np, j);
        float v = s[0];
        for (int i = 1; i < per; i++) {
            float x = s[(int64_t)i * n];
            v = reduce_max ? (x > v ? x : v) : v + x;
        }
        red[(int64_t)h * n + j] = reduce_max ? v : v / (float)per;
    }
}

/* pooled[h][j], j < L of head h's map (rows of n), as the CPU's
   ei__pool_scores: avg (candidates outside 0..L-1 count as zero, divided by
   the kernel width), max (over those inside), none. Heads that compress
   (np >= budget) also write pooled_out (gate: deferred errors, the call's
   report: nothing written unless 0). */
__global__ void pool_kernel(const float *score, float *pooled, float *pooled_out, int64_t pooled_cap, int64_t n, int heads,
                            MapRef mr, int div, int64_t W, int64_t budget, int pool, int kernel,
                            const unsigned long long *gate) {
    if (gate && *gate != 0ull) return;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < (int64_t)heads * n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int h = (int)(idx / n);
        int64_t j = idx % n;
        int m = mr.maps > 1 ? h / div : 0;
        int64_t np = map_np(mr, m), L = np - W;
        if (j >= L) continue;
        const float *row = score + (int64_t)h * n;
        float x;
        if (pool == EI_POOL_NONE || kernel <= 1) {
            x = row[j];
        } else {
            int64_t r = kernel / 2;
            float acc = pool == EI_POOL_MAX ? -FLT_MAX : 0.f;
            for (int64_t t = j - r; t <= j + r; t++) {
                if (t < 0 || t >= L) continue;
                acc = pool == EI_POOL_MAX ? (row[t] > acc ? row[t] : acc) : acc + row[t];
            }
            x = pool == EI_POOL_MAX ? acc : acc / (float)kernel;
        }
        pooled[(int64_t)h * n + j] = x;
        if (pooled_out && np >= budget) pooled_out[(int64_t)h * pooled_cap + j] = x;
    }
}

struct KeepParams {
    const float *pooled; /* [heads][n]: pooled scores of the candidates, position order */
    MapRef map;
    int div;             /* head h uses map h / div (maps > 1) */
    int64_t n, W, budget; /* W: the tail (ei__decode_tail); budget: b (ei__decode_budget) */
    int policy, sink;    /* cfg->decode_policy, cfg->decode_sink */
    int64_t recent;      /* ei__decode_recent(cfg, budget): H2O's b / 2, decode_recent's share */
    float *pooled_out;   /* STREAMING: keep->pooled, 1 for a kept candidate, 0 else (NULL: none) */
    int64_t pooled_cap;
    const int *row_pos;  /* the maps (positions out); NULL: row j holds position j */
    int64_t rp_stride;
    uint8_t *flag;       /* [heads][n] scratch */
    int *index;
    int capacity;
    int *positions;
    uint8_t *mask;
    int64_t mask_cap;
    const unsigned long long *gate; /* deferred errors: the call's report (nothing written unless 0) */
};
/* One CTA per head: every row holding a position when fewer than budget do;
   else the tail's W rows and, by the policy (the CPU's ei__keep_policy),
   the kk = budget - W best candidates (ties to the older position);
   STREAMING: the first min(sink, kk) candidates and the newest others; H2O:
   the newest R = max(budget / 2, W) positions and the best budget - R of
   the older candidates; ENTROPYINFER / SNAPKV with decode_recent: likewise,
   R = max(ei__decode_recent, W). Then the kept rows ascending, their positions, the
   byte mask over 0..n-1. */
__global__ void __launch_bounds__(256) keep_finish_kernel(KeepParams p) {
    __shared__ int hist[256];
    __shared__ int warp_tot[8];
    if (p.gate && *p.gate != 0ull) return; /* a recorded fault: the keep set is not touched */
    int h = blockIdx.x;
    int m = p.map.maps > 1 ? h / p.div : 0;
    int64_t np = map_np(p.map, m), L = np - p.W;
    bool all = np < p.budget;
    int64_t kk = all ? 0 : p.budget - p.W, Lr = L; /* candidates 0..Lr-1 ranked (the rest kept) */
    if (kk > L) kk = L;
    if (kk < 0) kk = 0;
    bool by_position = p.policy == EI_DECODE_STREAMING;
    if (!all && by_position) {
        int64_t sink = p.sink < kk ? (int64_t)p.sink : kk;
        Lr = L - (kk - sink);
        kk = sink;
    } else if (!all && p.recent > 0) { /* H2O, or decode_recent: a recent window, then the ranked */
        int64_t R = p.recent > p.W ? p.recent : p.W;
        Lr = L - (R - p.W);
        kk = p.budget - R;
    }
    const float *row = p.pooled + (int64_t)h * p.n;
    uint64_t thr = kk > 0 && !by_position ? block_select_kth(row, Lr, kk, hist) : ~(uint64_t)0;
    uint8_t *f = p.flag + (int64_t)h * p.n;
    for (int64_t j = threadIdx.x; j < p.n; j += blockDim.x) f[j] = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < np; j += blockDim.x) {
        bool kept = all || j >= Lr || (by_position ? j < kk : kk > 0 && rank_key(row[j], j) >= thr);
        if (kept) f[map_row(p.map, m, np, j)] = 1;
        if (by_position && !all && p.pooled_out && j < L) p.pooled_out[(int64_t)h * p.pooled_cap + j] = kept ? 1.f : 0.f;
    }
    __syncthreads();
    const int *map = p.row_pos ? p.row_pos + (int64_t)m * p.rp_stride : NULL;
    int *out = p.index + (int64_t)h * p.capacity;
    int *pos = p.positions ? p.positions + (int64_t)h * p.capacity : NULL;
    uint8_t *mrow = p.mask ? p.mask + (int64_t)h * p.mask_cap : NULL;
    int64_t base = 0;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int64_t j0 = 0; j0 < p.n; j0 += blockDim.x) {
        int64_t j = j0 + threadIdx.x;
        bool keep = j < p.n && f[j] != 0;
        unsigned bal = __ballot_sync(0xffffffffu, keep);
        if (lane == 0) warp_tot[w] = __popc(bal);
        __syncthreads();
        int64_t before = base;
        for (int i = 0; i < w; i++) before += warp_tot[i];
        before += __popc(bal & ((1u << lane) - 1));
        if (keep) {
            out[before] = (int)j;
            if (pos) pos[before] = map ? map[j] : (int)j;
        }
        if (mrow && j < p.n) mrow[j] = keep;
        int tot = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) tot += warp_tot[i];
        __syncthreads();
        base += tot;
    }
}

/* shared keep sets: the candidates' shared scores in position order (the
   first non-finite one as j << 32 | row), their sum, and a layer's share */
__global__ void shared_gather_kernel(const float *shared, MapRef mr, int64_t W, float *pooled, unsigned long long *bad) {
    int64_t np = map_np(mr, 0), L = np - W;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < L; j += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = map_row(mr, 0, np, j);
        float v = shared[row];
        if (!isfinite(v)) atomicMin(bad, ((unsigned long long)j << 32) | (unsigned long long)row);
        pooled[j] = v;
    }
}
/* the sum of the candidates' scores and (xlx not NULL: EI_SHARED_ENTROPY)
   the sum of x ln x over those > 0 */
__global__ void shared_sum_kernel(const float *pooled, MapRef mr, int64_t W, double *sum, double *xlx) {
    __shared__ double red[32];
    int64_t L = map_np(mr, 0) - W;
    double acc = 0.0, acc2 = 0.0;
    for (int64_t j = threadIdx.x; j < L; j += blockDim.x) {
        acc += (double)pooled[j];
        if (xlx && pooled[j] > 0.f) acc2 += (double)pooled[j] * log((double)pooled[j]);
    }
    acc = block_sum_d(acc, red);
    if (threadIdx.x == 0) *sum = acc;
    if (xlx) {
        __syncthreads(); /* (red reused) */
        acc2 = block_sum_d(acc2, red);
        if (threadIdx.x == 0) *xlx = acc2;
    }
}
/* a layer's share: pooled / sum, times exp(H) = exp(ln sum - xlx / sum)
   with EI_SHARED_ENTROPY (xlx not NULL), as the CPU's ei_decode_shared_add */
__global__ void shared_add_kernel(const float *pooled, MapRef mr, int64_t W, const double *sum, const double *xlx,
                                  int use_max, float *shared, const unsigned long long *gate) {
    if (gate && *gate != 0ull) return; /* a recorded fault: the layer adds nothing */
    double s = *sum;
    int64_t np = map_np(mr, 0), L = np - W;
    if (!(s > 0.0)) return;
    double weight = xlx ? exp(log(s) - *xlx / s) : 1.0;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < L; j += (int64_t)gridDim.x * blockDim.x) {
        float v = (float)((double)pooled[j] / s * weight), *x = shared + map_row(mr, 0, np, j);
        *x = use_max ? fmaxf(*x, v) : *x + v; /* gqa_reduce max: the layers' maximum */
    }
}

/* select_shared with deferred errors: the candidates' shared scores into
   keep->pooled when the set compresses (np >= budget; np known only here) */
__global__ void pooled_copy_kernel(const float *pooled, float *out, MapRef mr, int64_t W, int64_t budget,
                                   const unsigned long long *gate) {
    if (gate && *gate != 0ull) return;
    int64_t np = map_np(mr, 0), L = np - W;
    if (np < budget) return;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < L; j += (int64_t)gridDim.x * blockDim.x)
        out[j] = pooled[j];
}

/* ------------------------------------------------------------ decode faults
   What the waiting decode entries find in device data (the row maps' info,
   the scoring flags, the shared scores, the counts that follow from them),
   one code and message each (decode_fault_fail), so that the waiting call
   and ei_cuda_status (deferred errors) say the same. Values a, b, c: */
enum {
    DK_ROW_POS = 1,     /* row_pos[a] = (int)b < -1 */
    DK_DUPLICATE,       /* rows a and b both hold position c */
    DK_TOO_FEW,         /* a positions, fewer than the b observed queries */
    DK_NOT_CONSECUTIVE, /* the newest a positions (b..c) are not consecutive */
    DK_BAD_K,           /* NaN/Inf in k: a = kv head << 32 | row */
    DK_OVERFLOW,        /* the logits of query head a overflow */
    DK_MAPS_DIFFER,     /* two kv heads' maps hold a and b positions */
    DK_CAPACITY,        /* keep capacity a < b positions */
    DK_POOLED,          /* pooled capacity a < b candidates */
    DK_SHARED,          /* the shared score of row a is not finite */
    DK_BUDGET           /* deferred errors with a row map: b positions, fewer than decode_budget a */
};
/* the entry of a DE_DECODE report */
enum { DEC_E_KEEP = 1, DEC_E_SCORE, DEC_E_SELECT, DEC_E_SHARED_ADD, DEC_E_SELECT_SHARED };
static const char *decode_entry_name(int e) {
    return e == DEC_E_KEEP ? "decode_keep" : e == DEC_E_SCORE ? "decode_score" : e == DEC_E_SELECT ? "decode_select"
         : e == DEC_E_SHARED_ADD ? "decode_shared_add" : e == DEC_E_SELECT_SHARED ? "decode_select_shared" : "decode";
}
static ei_result decode_fault_fail(int kind, unsigned long long a, unsigned long long b, unsigned long long c, char *msg) {
    switch (kind) {
    case DK_ROW_POS:
        return fail(msg, EI_ERR_SHAPE, "row_pos[%lld] = %d (a position >= 0, or -1 for a row without one)", (long long)a,
                    (int)(unsigned)b);
    case DK_DUPLICATE:
        return fail(msg, EI_ERR_SHAPE, "rows %d and %d both hold position %d", (int)(unsigned)a, (int)(unsigned)b,
                    (int)(unsigned)c);
    case DK_TOO_FEW:
        return fail(msg, EI_ERR_SHAPE, "the cache holds %lld positions, fewer than the %lld observed queries",
                    (long long)a, (long long)b);
    case DK_NOT_CONSECUTIVE:
        return fail(msg, EI_ERR_SHAPE,
                    "the newest %lld positions (%d..%d) are not consecutive: the window's keys must all be in the cache",
                    (long long)a, (int)(unsigned)b, (int)(unsigned)c);
    case DK_BAD_K:
        return fail(msg, EI_ERR_NONFINITE, "NaN or Inf in k (head %d, row %lld)", (int)(a >> 32),
                    (long long)(a & 0xFFFFFFFFu));
    case DK_OVERFLOW: return fail(msg, EI_ERR_NONFINITE, "decode scores of head %d overflow float32", (int)a);
    case DK_MAPS_DIFFER:
        return fail(msg, EI_ERR_SHAPE, "the row maps of kv heads hold %lld and %lld positions (one count per keep set)",
                    (long long)a, (long long)b);
    case DK_CAPACITY:
        return fail(msg, EI_ERR_WORKSPACE, "keep capacity %d < %lld positions", (int)a, (long long)b);
    case DK_POOLED: return fail(msg, EI_ERR_WORKSPACE, "pooled capacity %lld < %lld", (long long)a, (long long)b);
    case DK_SHARED: return fail(msg, EI_ERR_NONFINITE, "shared score of row %d is not finite", (int)a);
    case DK_BUDGET:
        return fail(msg, EI_ERR_UNSUPPORTED,
                    "with cuda_deferred_errors and a row map the cache must hold at least decode_budget (%lld) "
                    "positions (it holds %lld): call without deferred errors", (long long)a, (long long)b);
    default: return fail(msg, EI_ERR_BACKEND, "unknown decode fault %d", kind);
    }
}

/* The checks of a decode entry with deferred errors, in the waiting call's
   order: maps [a0, a1) (map_check), the scoring flags, select_shared's
   pooled capacity and shared scores (when the set compresses), then per
   keep-set head its map, the maps' counts, the capacities and, with a row
   map, np >= budget (keep_counts). info NULL: no row map (np = n, checked on
   the host). */
struct DecodeCheck {
    int entry;
    const unsigned long long *info; /* [maps][4] (maps_build), NULL: no row map */
    int maps, a0, a1;
    const int *row_pos;
    int64_t stride, n, W, budget;
    const unsigned *keys; /* the sorted maps (position + 1) */
    const int *vals;      /* their rows */
    const unsigned long long *score_flags; /* bad_k, bad_row of decode_score_run, or NULL */
    const unsigned long long *shared_bad;  /* select_shared's gather flag, or NULL */
    int heads, div;                        /* keep-set heads (0: none), head h on map h / div */
    int64_t capacity, pooled_cap;
    int pooled, need_budget;
    unsigned long long *report;            /* [4] in the workspace: word 0 = 0 (none) or the DE word */
};
__device__ int map_fault(const DecodeCheck &c, int m, unsigned long long *v) {
    const unsigned long long *in = c.info + 4 * m;
    int64_t at = (int64_t)m * c.n, W = c.W;
    if (in[1] != ~0ull) {
        v[0] = in[1];
        v[1] = (unsigned)c.row_pos[(int64_t)m * c.stride + (int64_t)in[1]];
        return DK_ROW_POS;
    }
    if (in[2] != ~0ull) {
        int64_t i = (int64_t)in[2];
        v[0] = (unsigned)c.vals[at + i - 1];
        v[1] = (unsigned)c.vals[at + i];
        v[2] = (unsigned)(c.keys[at + i] - 1u);
        return DK_DUPLICATE;
    }
    if ((int64_t)in[0] < W) {
        v[0] = in[0];
        v[1] = (unsigned long long)W;
        return DK_TOO_FEW;
    }
    if (W > 0 && in[3] != (unsigned long long)(W - 1)) {
        v[0] = (unsigned long long)W;
        v[1] = (unsigned)(c.keys[at + c.n - W] - 1u);
        v[2] = (unsigned)(c.keys[at + c.n - 1] - 1u);
        return DK_NOT_CONSECUTIVE;
    }
    return 0;
}
__device__ int decode_faults(const DecodeCheck &c, unsigned long long *v) {
    int kind = 0;
    for (int m = c.a0; c.info && m < c.a1; m++)
        if ((kind = map_fault(c, m, v))) return kind;
    if (c.score_flags) {
        if (c.score_flags[0] != ~0ull) { v[0] = c.score_flags[0]; return DK_BAD_K; }
        if (c.score_flags[1] != ~0ull) { v[0] = c.score_flags[1]; return DK_OVERFLOW; }
    }
    if (c.shared_bad) {
        int64_t np = c.info ? (int64_t)c.info[0] : c.n, L = np - c.W;
        if (np >= c.budget) {
            if (c.pooled && c.pooled_cap < L) { v[0] = (unsigned long long)c.pooled_cap; v[1] = (unsigned long long)L; return DK_POOLED; }
            if (*c.shared_bad != ~0ull) { v[0] = *c.shared_bad & 0xFFFFFFFFu; return DK_SHARED; }
        }
    }
    int64_t np0 = -1;
    int last_m = -1;
    for (int h = 0; h < c.heads; h++) {
        int m = c.maps > 1 ? h / c.div : 0;
        if (c.info && m != last_m && (kind = map_fault(c, m, v))) return kind;
        last_m = m;
        int64_t np = c.info ? (int64_t)c.info[4 * m] : c.n;
        if (np0 >= 0 && np != np0) { v[0] = (unsigned long long)np0; v[1] = (unsigned long long)np; return DK_MAPS_DIFFER; }
        np0 = np;
        if (np > c.capacity && np < c.budget) { v[0] = (unsigned long long)c.capacity; v[1] = (unsigned long long)np; return DK_CAPACITY; }
        if (np < c.budget) {
            if (c.need_budget) { v[0] = (unsigned long long)c.budget; v[1] = (unsigned long long)np; return DK_BUDGET; }
            continue;
        }
        int64_t L = np - c.W;
        if (c.pooled && c.pooled_cap < L) { v[0] = (unsigned long long)c.pooled_cap; v[1] = (unsigned long long)L; return DK_POOLED; }
    }
    return 0;
}
/* one thread: the call's first fault into its report (the gate of the
   kernels after it) and, the first since the last deferred_status, g_deferred */
__global__ void decode_check_kernel(DecodeCheck c) {
    unsigned long long v[3] = {0, 0, 0};
    int kind = decode_faults(c, v);
    unsigned long long w0 = kind ? (unsigned long long)DE_DECODE | ((unsigned long long)(c.entry | kind << 4) << 8) : 0ull;
    c.report[1] = v[0];
    c.report[2] = v[1];
    c.report[3] = v[2];
    c.report[0] = w0;
    if (kind && atomicCAS(&g_deferred[0], 0ull, w0) == 0ull) {
        atomicExch(&g_deferred[1], v[0]);
        atomicExch(&g_deferred[2], v[1]);
        atomicExch(&g_deferred[3], v[2]);
    }
}

/* The header checked q against the decoder and the protocol. The kept queries
   (the last min(n_tokens, window)) are scanned for NaN/Inf before the ring or
   the counts change. */
static ei_result observe_bad_fail(unsigned long long bad, char *msg) {
    if (bad == ~0ull) return EI_OK;
    return fail(msg, EI_ERR_NONFINITE, "NaN or Inf in observed q (head %d, tokens from %lld)", (int)(bad & 4095u),
                (long long)(bad >> 12));
}
static ei_result api_decode_observe(const ei_config *cfg, ei_decoder *dec, const ei_tensor *q, int generated,
                                    char *msg) {
    cudaStream_t st = stream_of(cfg);
    int64_t W = dec->window;
    int64_t count = q->n_tokens < W ? q->n_tokens : W, first_tok = q->n_tokens - count;
    int64_t total = count * dec->n_heads * dec->head_dim;
    unsigned long long *slot = NULL, bad = 0;
    ei_result r;
    if ((r = slot_take(st, &slot, msg))) return r;
    observe_scan_kernel<<<stride_blocks(total), 256, 0, st>>>(q->data, q->dtype, q->token_stride, q->head_stride,
                                                              first_tok, count, dec->n_heads, dec->head_dim, slot);
    LAUNCH_CHECK("observe_scan_kernel");
    if (deferred(cfg)) {
        if ((r = deferred_record(slot, DE_OBSERVE, 0, st, msg))) return r;
    } else {
        if ((r = slot_read(st, slot, &bad, msg))) return r;
        if ((r = observe_bad_fail(bad, msg))) return r;
    }
    observe_kernel<<<stride_blocks(total), 256, 0, st>>>(q->data, q->dtype, q->token_stride, q->head_stride, first_tok,
                                                         count, dec->n_observed + first_tok, dec->window, dec->n_heads,
                                                         dec->head_dim, dec->queries, deferred(cfg) ? slot : NULL);
    LAUNCH_CHECK("observe_kernel");
    dec->n_observed += q->n_tokens;
    if (generated) dec->n_generated += q->n_tokens;
    return EI_OK;
}

/* Sized for the configuration's window (the most queries a call scores),
   n rows, one row map per kv head and the row sort's temporary storage: any
   W <= window, any map fits. */
struct DecodeWs {
    size_t stats, mz, score, pooled, flags, keys_in, keys_out, vals_in, vals_out, info, sort, rowflag, raw, total;
    size_t sort_bytes;
};
static ei_result decode_ws(const ei_config *cfg, int64_t n, int32_t nh, int32_t nkv, DecodeWs *w, char *msg) {
    size_t W = (size_t)cfg->window, nch = (size_t)((n + DEC_KC - 1) / DEC_KC);
    size_t heads_out = cfg->per_kv_head ? (size_t)nkv : (size_t)nh, a, b, c, mk, rf, inf, raw = 0, sort_bytes = 0;
    if (n <= 0 || n > INT_MAX || !mul_ok((size_t)nh * W, nch * 8, &a) || !mul_ok((size_t)nh * W, 8, &b) ||
        !mul_ok(heads_out, (size_t)n * 4, &c) || !mul_ok((size_t)nkv, (size_t)n * 4, &mk) ||
        !mul_ok(heads_out, (size_t)n, &rf) || !mul_ok((size_t)nkv, 40, &inf) || a > SIZE_MAX / 16 ||
        c > SIZE_MAX / 16 || mk > SIZE_MAX / 16 ||
        (cfg->decode_policy == EI_DECODE_H2O && /* decode_keep's per-query-head scores by row, summed into the decoder */
         (!mul_ok((size_t)nh, (size_t)n * 4, &raw) || raw > SIZE_MAX / 16)))
        return fail(msg, EI_ERR_OVERFLOW, "decode workspace for %lld tokens overflows size_t", (long long)n);
    cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const unsigned *)NULL, (unsigned *)NULL,
                                                    (const int *)NULL, (int *)NULL, (int)n, 0, 32);
    if (e != cudaSuccess) return fail(msg, EI_ERR_BACKEND, "sizing the row sort: %s", cudaGetErrorString(e));
    w->sort_bytes = sort_bytes;
    w->stats = 0;
    w->mz = align256(a);
    w->score = w->mz + align256(b);
    w->pooled = w->score + align256(c);
    w->flags = w->pooled + align256(c); /* bad key, bad logits, bad shared score, (double) shared sum, then
                                           the deferred-error report [4] of decode_check_kernel */
    w->keys_in = w->flags + 256;
    w->keys_out = w->keys_in + align256(mk);
    w->vals_in = w->keys_out + align256(mk);
    w->vals_out = w->vals_in + align256(mk);
    w->info = w->vals_out + align256(mk);
    w->sort = w->info + align256(inf);
    w->rowflag = w->sort + align256(sort_bytes);
    w->raw = w->rowflag + align256(rf);
    w->total = w->raw + align256(raw) + 256; /* and slack to align the base */
    return EI_OK;
}
static ei_result api_decode_workspace_size(const ei_config *cfg, int64_t n, int32_t nh, int32_t nkv, size_t *bytes,
                                           char *msg) {
    DecodeWs w;
    memset(&w, 0, sizeof w);
    ei_result r = decode_ws(cfg, n, nh, nkv, &w, msg);
    if (r) return r;
    *bytes = w.total;
    return EI_OK;
}
/* The workspace of a decode call for n rows: its aligned base. */
static ei_result decode_ws_take(const ei_config *cfg, int64_t n, const ei_decoder *dec, void *ws, size_t ws_bytes,
                                DecodeWs *w, char **base, char *msg) {
    memset(w, 0, sizeof *w);
    ei_result r = decode_ws(cfg, n, dec->n_heads, dec->n_kv_heads, w, msg);
    if (r) return r;
    if (!ws) return fail(msg, EI_ERR_NULL, "workspace is NULL (%zu bytes needed)", w->total);
    if (ws_bytes < w->total) return fail(msg, EI_ERR_WORKSPACE, "workspace of %zu bytes, %zu needed", ws_bytes, w->total);
    *base = ws_base(ws);
    return EI_OK;
}

/* The row maps of a call, sorted on the device; their info read back (the
   waiting calls), or left on the device with deferred errors (on_device:
   decode_check_kernel reads it, the host never learns np). */
struct Maps {
    MapRef ref;
    std::vector<unsigned long long> info; /* host copy [maps][4] (identity: one map); empty when on_device */
    const int32_t *row_pos;
    int64_t stride, n, W;
    const unsigned *keys; /* sorted keys (position + 1) [maps][n] */
    const int *vals;      /* sorted rows [maps][n] */
    bool on_device;       /* row maps under deferred errors: info only on the device */
    std::vector<unsigned long long> lens; /* host copy [maps]: the newest position + 1 (identity: n) */
    const unsigned long long *dlens;      /* the same on the device (NULL: identity) */
    int64_t np(int m) const { return (int64_t)info[ref.maps ? 4 * m : 0]; }
    int64_t len(int m) const { return (int64_t)lens[ref.maps ? m : 0]; }
};
/* Maps m0..m1-1 of row_pos (map m at row_pos + m * stride); maps 0: row j
   holds position j. readback: synchronises the stream (the host reads the
   counts); else (deferred errors) only queues the kernels and the sorts. */
static ei_result maps_build(const int32_t *row_pos, int64_t stride, int maps, int m0, int m1, int64_t n, int64_t W,
                            bool readback, char *base, const DecodeWs &w, cudaStream_t st, Maps *mp, char *msg) {
    mp->row_pos = row_pos;
    mp->stride = stride;
    mp->n = n;
    mp->W = W;
    mp->ref.order = NULL;
    mp->ref.info = NULL;
    mp->ref.n = n;
    mp->ref.maps = maps;
    mp->keys = (const unsigned *)(base + w.keys_out);
    mp->vals = (const int *)(base + w.vals_out);
    mp->on_device = false;
    mp->dlens = NULL;
    if (!maps) {
        mp->lens.assign(1, (unsigned long long)n);
        mp->info.assign(4, 0);
        mp->info[0] = (unsigned long long)n;
        mp->info[1] = mp->info[2] = ~0ull;
        mp->info[3] = W > 0 ? (unsigned long long)(W - 1) : 0;
        return EI_OK;
    }
    unsigned long long *dinfo = (unsigned long long *)(base + w.info);
    unsigned *kin = (unsigned *)(base + w.keys_in), *kout = (unsigned *)(base + w.keys_out);
    int *vin = (int *)(base + w.vals_in), *vout = (int *)(base + w.vals_out);
    int64_t total = (int64_t)(m1 - m0) * n;
    map_init_kernel<<<1, 256, 0, st>>>(dinfo, m0, m1);
    LAUNCH_CHECK("map_init_kernel");
    map_prep_kernel<<<stride_blocks(total), 256, 0, st>>>(row_pos, stride, m0, m1, n, kin, vin, dinfo);
    LAUNCH_CHECK("map_prep_kernel");
    for (int m = m0; m < m1; m++) { /* CUB with the workspace's temporary storage: kernels only */
        size_t tb = w.sort_bytes;
        int64_t at = (int64_t)m * n;
        CUDA_TRY(cub::DeviceRadixSort::SortPairs((void *)(base + w.sort), tb, kin + at, kout + at, vin + at, vout + at,
                                                 (int)n, 0, 32, st));
    }
    unsigned long long *dlens = dinfo + 4 * (int64_t)maps;
    map_post_kernel<<<stride_blocks(total), 256, 0, st>>>(kout, m0, m1, n, W, dinfo, dlens);
    LAUNCH_CHECK("map_post_kernel");
    mp->ref.order = vout;
    mp->ref.info = dinfo;
    mp->dlens = dlens;
    if (!readback) {
        mp->info.clear();
        mp->lens.clear();
        mp->on_device = true;
        return EI_OK;
    }
    mp->info.assign((size_t)maps * 4, 0);
    mp->lens.assign((size_t)maps, 0);
    CUDA_TRY(cudaMemcpyAsync(mp->info.data() + 4 * m0, dinfo + 4 * m0, sizeof(unsigned long long) * 4 * (m1 - m0),
                             cudaMemcpyDeviceToHost, st));
    CUDA_TRY(cudaMemcpyAsync(mp->lens.data() + m0, dlens + m0, sizeof(unsigned long long) * (m1 - m0),
                             cudaMemcpyDeviceToHost, st));
    CUDA_TRY(cudaStreamSynchronize(st));
    return EI_OK;
}
/* Map m as the CPU's ei__decode_order checks it, in its order (host info:
   a waiting call, or no row map). */
static ei_result map_check(const Maps &mp, int m, char *msg) {
    const unsigned long long *in = &mp.info[mp.ref.maps ? 4 * m : 0];
    int64_t n = mp.n, W = mp.W, at = (int64_t)m * n;
    if (in[1] != ~0ull) {
        int v = 0;
        int64_t j = (int64_t)in[1];
        CUDA_TRY(cudaMemcpy(&v, mp.row_pos + (int64_t)m * mp.stride + j, sizeof v, cudaMemcpyDeviceToHost));
        return decode_fault_fail(DK_ROW_POS, (unsigned long long)j, (unsigned)v, 0, msg);
    }
    if (in[2] != ~0ull) {
        int64_t i = (int64_t)in[2];
        int rows[2] = {0, 0};
        unsigned key = 0;
        CUDA_TRY(cudaMemcpy(rows, mp.vals + at + i - 1, sizeof rows, cudaMemcpyDeviceToHost));
        CUDA_TRY(cudaMemcpy(&key, mp.keys + at + i, sizeof key, cudaMemcpyDeviceToHost));
        return decode_fault_fail(DK_DUPLICATE, (unsigned)rows[0], (unsigned)rows[1], key - 1u, msg);
    }
    if ((int64_t)in[0] < W) return decode_fault_fail(DK_TOO_FEW, in[0], (unsigned long long)W, 0, msg);
    if (W > 0 && in[3] != (unsigned long long)(W - 1)) {
        unsigned keys[2] = {0, 0};
        CUDA_TRY(cudaMemcpy(&keys[0], mp.keys + at + n - W, sizeof keys[0], cudaMemcpyDeviceToHost));
        CUDA_TRY(cudaMemcpy(&keys[1], mp.keys + at + n - 1, sizeof keys[1], cudaMemcpyDeviceToHost));
        return decode_fault_fail(DK_NOT_CONSECUTIVE, (unsigned long long)W, keys[0] - 1u, keys[1] - 1u, msg);
    }
    return EI_OK;
}

/* Deferred errors: a decode entry's DecodeCheck over the maps of mp (row
   maps on the device; none: np = n, checked on the host), its report in the
   workspace's flag block. */
static void check_init(DecodeCheck *c, int entry, const Maps &mp, int64_t budget, char *base, const DecodeWs &w) {
    memset(c, 0, sizeof *c);
    c->entry = entry;
    if (mp.on_device) {
        c->info = mp.ref.info;
        c->maps = mp.ref.maps;
        c->row_pos = mp.row_pos;
        c->stride = mp.stride;
        c->keys = mp.keys;
        c->vals = mp.vals;
    }
    c->n = mp.n;
    c->W = mp.W;
    c->budget = budget;
    c->report = (unsigned long long *)(base + w.flags) + 4;
}
/* the keep-set checks of keep_counts, on the device (need_budget: np >=
   decode_budget, the counts the host assumed) */
static void check_keep(DecodeCheck *c, const ei_keep_set *keep, int heads, int div, bool need_budget) {
    c->heads = heads;
    c->div = div;
    c->capacity = keep->capacity;
    c->pooled = keep->pooled != NULL;
    c->pooled_cap = keep->pooled_capacity;
    c->need_budget = need_budget;
}
static ei_result check_launch(const DecodeCheck &c, cudaStream_t st, char *msg) {
    decode_check_kernel<<<1, 1, 0, st>>>(c);
    LAUNCH_CHECK("decode_check_kernel");
    return EI_OK;
}
/* Deferred errors with a row map: the keep set's counts are set on the host
   for a cache of >= decode_budget positions (checked on the device), which a
   cache of fewer rows cannot hold. */
static ei_result deferred_rows_refuse(const ei_config *cfg, int64_t n, char *msg) {
    return fail(msg, EI_ERR_UNSUPPORTED,
                "with cuda_deferred_errors and a row map the cache must hold at least decode_budget (%d) positions, "
                "and %lld rows cannot: call without deferred errors", (int)cfg->decode_budget, (long long)n);
}

/* The window scores of query heads [h0, h1) against k in each kv head's
   position order: into score (decode_keep's candidates) or raw (per row).
   chk NULL: the flags are read back (NaN/Inf in k, overflow) before the
   scores are written; else (deferred errors) chk is launched after the first
   pass with the flags and gates the second. */
static ei_result decode_score_run(const ei_config *cfg, const ei_decoder *dec, const ei_tensor *k, const MapRef &mr,
                                  int h0, int h1, float *score, float *raw, char *base, const DecodeWs &w,
                                  DecodeCheck *chk, cudaStream_t st, char *msg) {
    ei_result r;
    int nh = dec->n_heads, nkv = dec->n_kv_heads, D = dec->head_dim, G = nh / nkv;
    int64_t n = k->n_tokens, q0 = 0, W = ei__decode_scored(cfg, dec, &q0);
    if (W == 0) { /* H2O with every query summed already: no scores (the CPU's zeros; raw was cleared) */
        if (chk && (r = check_launch(*chk, st, msg))) return r;
        return EI_OK;
    }
    int smem_max = 0;
    size_t smem = ((size_t)DEC_KC * (D + 1) + (size_t)DEC_RC * (DEC_KC + 1)) * 4;
    if ((r = smem_limit(&smem_max, msg))) return r;
    if (smem > (size_t)smem_max)
        return fail(msg, EI_ERR_UNSUPPORTED, "head_dim %d needs %zu bytes of shared memory for CUDA decode scoring, the "
                    "device has %d", D, smem, smem_max);
    DecodeParams p;
    memset(&p, 0, sizeof p);
    p.k = k->data; p.dtype = k->dtype; p.k_ts = k->token_stride; p.k_hs = k->head_stride;
    p.ring = dec->queries;
    p.window = dec->window;
    p.first_slot = q0 % dec->window;
    p.T = ei__decode_tail(cfg, dec);
    p.lag = dec->n_observed - (q0 + W);
    p.W = (int)W; p.nh = nh; p.nkv = nkv; p.G = G; p.D = D; p.n = n;
    p.nchunks = (int)((n + DEC_KC - 1) / DEC_KC);
    p.scale = cfg->decode_scale > 0.f ? cfg->decode_scale : 1.f / sqrtf((float)D);
    p.stats = (float *)(base + w.stats); p.mz = (float *)(base + w.mz);
    p.score = score; p.raw = raw;
    p.per_kv = cfg->per_kv_head != 0; p.reduce_max = cfg->gqa_reduce == EI_REDUCE_MAX;
    p.h0 = h0; p.h1 = h1; p.kv0 = h0 / G;
    p.map = mr;
    p.bad_k = (unsigned long long *)(base + w.flags);
    p.bad_row = p.bad_k + 1;
    int kv_count = (h1 - 1) / G - p.kv0 + 1;
    if ((r = grid_fits("decode scoring", p.nchunks, kv_count, 1, msg))) return r;
    CUDA_TRY(cudaFuncSetAttribute(decode_score_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_TRY(cudaFuncSetAttribute(decode_score_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_TRY(cudaMemsetAsync(p.bad_k, 0xFF, 2 * sizeof(unsigned long long), st));
    decode_score_kernel<0><<<dim3(p.nchunks, kv_count), DEC_KC, smem, st>>>(p);
    LAUNCH_CHECK("decode_score_kernel<0>");
    if (chk) { /* deferred errors: the maps, the flags (and a keep set's counts) checked on the device */
        chk->score_flags = p.bad_k;
        if ((r = check_launch(*chk, st, msg))) return r;
        p.gate = chk->report;
    } else { /* K and the logits are checked before anything of the results is written */
        unsigned long long bad[2] = {0, 0};
        CUDA_TRY(cudaMemcpyAsync(bad, p.bad_k, sizeof bad, cudaMemcpyDeviceToHost, st));
        CUDA_TRY(cudaStreamSynchronize(st));
        if (bad[0] != ~0ull) return decode_fault_fail(DK_BAD_K, bad[0], 0, 0, msg);
        if (bad[1] != ~0ull) return decode_fault_fail(DK_OVERFLOW, bad[1], 0, 0, msg);
    }
    decode_combine_kernel<<<(unsigned)(((int64_t)(h1 - h0) * W + 127) / 128), 128, 0, st>>>(p);
    LAUNCH_CHECK("decode_combine_kernel");
    decode_score_kernel<1><<<dim3(p.nchunks, kv_count), DEC_KC, smem, st>>>(p);
    LAUNCH_CHECK("decode_score_kernel<1>");
    return EI_OK;
}

/* The counts of a keep set of `heads` heads (head h on map h / div) and the
   host checks, per head in the CPU's order (its map, the maps' counts and
   lengths, the capacities, the tail against the budget). The budget b
   follows the sequence's length with decode_budget_ratio (ei__decode_budget);
   the tail T is mp.W (ei__decode_tail). Row maps on the device (deferred
   errors; no ratio there): the cache is taken to hold >= decode_budget
   positions, so every head keeps decode_budget rows (decode_budget >=
   window >= W) and compresses; decode_check_kernel checks it (DK_BUDGET)
   with the rest. */
struct KeepCounts {
    int32_t n_kept;
    int compressed;
    int64_t b; /* the budget of the call */
};
/* The CPU's ei__decode_tail_fits: only SnapKV's tail can exceed b. */
static ei_result tail_fits(int64_t T, int64_t b, char *msg) {
    if (T <= b) return EI_OK;
    return fail(msg, EI_ERR_STATE, "EI_DECODE_SNAPKV keeps its %lld newest positions (the prompt's window and every "
                "generated one), more than the budget of %lld: compress sooner (decode_gap) or keep more",
                (long long)T, (long long)b);
}
static ei_result keep_counts(const ei_config *cfg, const ei_keep_set *keep, const Maps &mp, int heads, int div,
                             KeepCounts *kc, char *msg) {
    ei_result r;
    int64_t b = cfg->decode_budget, W = mp.W, np = 0, np0 = -1, P = 0, P0 = -1;
    int last_m = -1;
    kc->n_kept = 0;
    kc->compressed = 0;
    kc->b = b;
    if (mp.on_device) {
        kc->n_kept = (int32_t)b;
        kc->compressed = 1;
        return tail_fits(W, b, msg);
    }
    for (int h = 0; h < heads; h++) {
        int m = mp.ref.maps > 1 ? h / div : 0;
        if (m != last_m && (r = map_check(mp, m, msg))) return r;
        last_m = m;
        np = mp.np(m);
        P = mp.len(m);
        if (np0 >= 0 && (np != np0 || P != P0))
            return np != np0 ? decode_fault_fail(DK_MAPS_DIFFER, (unsigned long long)np0, (unsigned long long)np, 0, msg)
                             : fail(msg, EI_ERR_SHAPE, "the row maps of kv heads hold %lld and %lld positions, of sequences "
                                    "of %lld and %lld (one count per keep set)", (long long)np0, (long long)np,
                                    (long long)P0, (long long)P);
        np0 = np;
        P0 = P;
        b = ei__decode_budget(cfg, P);
        kc->b = b;
        if (np > (int64_t)keep->capacity && np < b)
            return decode_fault_fail(DK_CAPACITY, (unsigned long long)keep->capacity, (unsigned long long)np, 0, msg);
        if (np < b) {
            kc->n_kept = (int32_t)np;
            continue;
        }
        if ((r = tail_fits(W, b, msg))) return r;
        int64_t L = np - W, kk = b - W;
        if (kk > L) kk = L;
        if (kk < 0) kk = 0;
        if (keep->pooled && keep->pooled_capacity < L)
            return decode_fault_fail(DK_POOLED, (unsigned long long)keep->pooled_capacity, (unsigned long long)L, 0, msg);
        kc->n_kept = (int32_t)(kk + W);
    }
    kc->compressed = np >= b; /* the last head's, as the CPU */
    return EI_OK;
}
/* The keep set from the reduced candidate scores red [heads][n] (pooled here
   with `pool` when pool_it, else red is already pooled and keep->pooled
   written by the caller), with the counts of keep_counts. gate: deferred
   errors, the call's report (nothing of the keep set written unless 0). */
static ei_result keep_launch(const ei_config *cfg, ei_decoder *dec, ei_keep_set *keep, const Maps &mp, int heads,
                             int div, float *red, bool pool_it, int pool, char *base, const DecodeWs &w,
                             const KeepCounts &kc, const unsigned long long *gate, cudaStream_t st, char *msg) {
    ei_result r;
    int64_t budget = kc.b, n = mp.n, W = mp.W;
    if ((r = grid_fits("decode keep", heads, 1, 1, msg))) return r;
    float *pooled = red;
    if (pool_it && cfg->decode_policy != EI_DECODE_STREAMING) { /* (STREAMING keeps by position: nothing ranked) */
        pooled = (float *)(base + w.pooled);
        pool_kernel<<<stride_blocks((int64_t)heads * n), 256, 0, st>>>(red, pooled, keep->pooled, keep->pooled_capacity, n,
                                                                      heads, mp.ref, div, W, budget, pool,
                                                                      cfg->pool_kernel, gate);
        LAUNCH_CHECK("pool_kernel");
    }
    KeepParams kp;
    memset(&kp, 0, sizeof kp);
    kp.pooled = pooled;
    kp.map = mp.ref;
    kp.div = div;
    kp.n = n; kp.W = W; kp.budget = budget;
    kp.policy = (int)cfg->decode_policy;
    kp.sink = cfg->decode_sink;
    kp.recent = ei__decode_recent(cfg, budget);
    kp.pooled_out = keep->pooled;
    kp.pooled_cap = keep->pooled_capacity;
    kp.row_pos = mp.ref.maps ? mp.row_pos : NULL;
    kp.rp_stride = mp.stride;
    kp.flag = (uint8_t *)(base + w.rowflag);
    kp.index = keep->index; kp.capacity = keep->capacity; kp.positions = keep->positions;
    kp.mask = keep->mask; kp.mask_cap = keep->mask_capacity;
    kp.gate = gate;
    keep_finish_kernel<<<heads, 256, 0, st>>>(kp);
    LAUNCH_CHECK("keep_finish_kernel");
    keep->n_tokens = n;
    keep->n_kept = kc.n_kept;
    keep->compressed = kc.compressed;
    if (dec) dec->last_compress = dec->n_generated;
    return EI_OK;
}
/* keep_counts, then keep_launch: a waiting call */
static ei_result keep_finish_run(const ei_config *cfg, ei_decoder *dec, ei_keep_set *keep, const Maps &mp, int heads,
                                 int div, float *red, bool pool_it, int pool, char *base, const DecodeWs &w,
                                 cudaStream_t st, char *msg) {
    KeepCounts kc;
    ei_result r = keep_counts(cfg, keep, mp, heads, div, &kc, msg);
    if (r) return r;
    return keep_launch(cfg, dec, keep, mp, heads, div, red, pool_it, pool, base, w, kc, NULL, st, msg);
}

/* ------------------------------------------------------------ decode policies
   H2O (the CPU's ei__decode_accumulate, ei__reduce_acc): the decoder's sums
   acc [nh][npos] by position. acc_update adds m x the fresh queries' mean
   weight of every row holding a position (raw [nh][n] by row, query head h
   on map h / G) to its position's sum (positions from end on start at 0);
   separate multiply and add, as the CPU (no contraction into an fma).
   reduce_acc: red[h][j], candidate j < np - T of head h's map (position
   order), the sums of query heads h * per .. + per at its position (0 from
   end on), reduced as ei__reduce_acc (in head order; mean: then / per). */
__device__ __forceinline__ int64_t map_pos(const MapRef &mr, const int *row_pos, int64_t rp_stride, int m, int64_t row) {
    return mr.maps ? (int64_t)row_pos[(int64_t)m * rp_stride + row] : row;
}
__global__ void acc_update_kernel(const float *raw, int64_t n, int nh, int G, MapRef mr, const int *row_pos,
                                  int64_t rp_stride, float *acc, int64_t npos, int64_t end, float m,
                                  const unsigned long long *gate) {
    if (gate && *gate != 0ull) return; /* a recorded fault: the sums stay */
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < (int64_t)nh * n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int h = (int)(idx / n);
        int64_t j = idx % n;
        int mi = mr.maps > 1 ? h / G : 0;
        int64_t np = map_np(mr, mi);
        if (j >= np) continue;
        int64_t row = map_row(mr, mi, np, j), p = map_pos(mr, row_pos, rp_stride, mi, row);
        float *a = acc + (int64_t)h * npos + p;
        *a = __fadd_rn(p < end ? *a : 0.f, __fmul_rn(m, raw[(int64_t)h * n + row]));
    }
}
__global__ void reduce_acc_kernel(const float *acc, int64_t npos, int64_t end, int64_t n, int heads, int per,
                                  int reduce_max, MapRef mr, const int *row_pos, int64_t rp_stride, int div, int64_t T,
                                  float *red) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < (int64_t)heads * n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int h = (int)(idx / n);
        int64_t j = idx % n;
        int mi = mr.maps > 1 ? h / div : 0;
        int64_t np = map_np(mr, mi), L = np - T;
        if (j >= L) continue;
        int64_t p = map_pos(mr, row_pos, rp_stride, mi, map_row(mr, mi, np, j));
        float v = 0.f;
        for (int i = 0; i < per; i++) {
            float x = p < end ? acc[(int64_t)(h * per + i) * npos + p] : 0.f;
            v = i == 0 ? x : reduce_max ? (x > v ? x : v) : __fadd_rn(v, x);
        }
        red[(int64_t)h * n + j] = reduce_max ? v : __fdiv_rn(v, (float)per);
    }
}
/* H2O, host side: every map's sequence inside the decoder's positions (the
   CPU's EI_ERR_SIZE; host info: a waiting call, or no row map). */
static ei_result h2o_check(const ei_decoder *dec, const Maps &mp, char *msg) {
    for (int m = 0; m < (mp.ref.maps ? mp.ref.maps : 1); m++)
        if (mp.len(m) > dec->n_positions)
            return fail(msg, EI_ERR_SIZE, "the cache holds position %lld, past the %lld positions whose attention the decoder "
                        "sums (decode_positions)", (long long)(mp.len(m) - 1), (long long)dec->n_positions);
    return EI_OK;
}
/* H2O: the fresh queries' scores raw [nh][n] by row summed into the decoder
   (none when every query is summed already), then its sums reduced into
   red for `heads` heads of `per` query heads each (head h on map h / div). */
static void h2o_sum(const ei_config *cfg, ei_decoder *dec, const float *raw, const Maps &mp, int heads, int per, int div,
                    float *red, const unsigned long long *gate, cudaStream_t st) {
    int64_t q0 = 0, m = ei__decode_scored(cfg, dec, &q0), n = mp.n;
    int nh = dec->n_heads, G = nh / dec->n_kv_heads;
    if (m > 0) {
        acc_update_kernel<<<stride_blocks((int64_t)nh * n), 256, 0, st>>>(raw, n, nh, G, mp.ref, mp.row_pos, mp.stride,
                                                                          dec->accumulated, dec->n_positions,
                                                                          dec->accumulated_end, (float)m, gate);
        dec->accumulated_end = mp.len(0); /* (every map's length, checked) */
        dec->n_accumulated = dec->n_observed;
    }
    reduce_acc_kernel<<<stride_blocks((int64_t)heads * n), 256, 0, st>>>(dec->accumulated, dec->n_positions,
                                                                         dec->accumulated_end, n, heads, per,
                                                                         cfg->gqa_reduce == EI_REDUCE_MAX, mp.ref,
                                                                         mp.row_pos, mp.stride, div, mp.W, red);
}
/* Deferred errors with row maps: the host never learns the sequence's
   length, which a ratio budget follows and H2O's sums end at. */
static ei_result deferred_maps_policy(const ei_config *cfg, bool budget, bool sums, char *msg) {
    if ((budget && cfg->decode_budget_ratio > 0) || (sums && cfg->decode_policy == EI_DECODE_H2O))
        return fail(msg, EI_ERR_UNSUPPORTED, "with cuda_deferred_errors and a row map, decode_budget_ratio and "
                    "EI_DECODE_H2O need the sequence's length on the host: call without deferred errors");
    return EI_OK;
}

/* The header checked k against the decoder, the keep set's heads and
   capacities and the protocol (and, without a row map, the cache against
   the tail). The policy's queries are scored (ei__decode_scored; none for
   STREAMING), as the CPU: score, then select; with keep->row_pos the maps
   are checked and sorted first. Deferred errors: the host checks (no row
   map) first, then only kernels. */
static ei_result api_decode_keep(const ei_config *cfg, ei_decoder *dec, const ei_tensor *k, ei_keep_set *keep,
                                 void *ws, size_t ws_bytes, char *msg) {
    ei_result r;
    int nh = dec->n_heads, nkv = dec->n_kv_heads, G = nh / nkv;
    int64_t T = ei__decode_tail(cfg, dec), n = k->n_tokens;
    int heads_out = cfg->per_kv_head ? nkv : nh, div = cfg->per_kv_head ? 1 : G, per = cfg->per_kv_head ? G : 1;
    bool dfr = deferred(cfg), h2o = cfg->decode_policy == EI_DECODE_H2O, scored = cfg->decode_policy != EI_DECODE_STREAMING;
    int pool = h2o ? (int)EI_POOL_NONE : (int)cfg->pool; /* H2O ranks its sums unpooled */
    cudaStream_t st = stream_of(cfg);
    DecodeWs w;
    char *base = NULL;
    Maps mp;
    KeepCounts kc;
    DecodeCheck chk;
    if ((r = decode_ws_take(cfg, n, dec, ws, ws_bytes, &w, &base, msg))) return r;
    int maps = keep->row_pos ? (keep->row_pos_stride ? nkv : 1) : 0;
    if (dfr && maps && n < cfg->decode_budget) return deferred_rows_refuse(cfg, n, msg);
    if (dfr && maps && (r = deferred_maps_policy(cfg, true, true, msg))) return r;
    if ((r = maps_build(keep->row_pos, keep->row_pos_stride, maps, 0, maps, n, T, !dfr, base, w, st, &mp, msg))) return r;
    if (!mp.on_device)
        for (int m = 0; m < (maps ? maps : 1); m++)
            if ((r = map_check(mp, m, msg))) return r;
    float *score = (float *)(base + w.score), *raw = h2o ? (float *)(base + w.raw) : NULL;
    if (!dfr) {
        if (scored && (r = decode_score_run(cfg, dec, k, mp.ref, 0, nh, h2o ? NULL : score, raw, base, w, NULL, st, msg)))
            return r;
        if (!h2o) return keep_finish_run(cfg, dec, keep, mp, heads_out, div, score, true, pool, base, w, st, msg);
        if ((r = h2o_check(dec, mp, msg)) || (r = keep_counts(cfg, keep, mp, heads_out, div, &kc, msg))) return r;
        h2o_sum(cfg, dec, raw, mp, heads_out, per, div, score, NULL, st);
        LAUNCH_CHECK("h2o_sum");
        return keep_launch(cfg, dec, keep, mp, heads_out, div, score, true, pool, base, w, kc, NULL, st, msg);
    }
    if ((r = keep_counts(cfg, keep, mp, heads_out, div, &kc, msg))) return r;
    if (h2o && (r = h2o_check(dec, mp, msg))) return r; /* (no row map here: the cache's rows) */
    check_init(&chk, DEC_E_KEEP, mp, kc.b, base, w);
    chk.a1 = mp.on_device ? maps : 0;
    check_keep(&chk, keep, heads_out, div, mp.on_device);
    if (!scored) {
        if ((r = check_launch(chk, st, msg))) return r;
    } else if ((r = decode_score_run(cfg, dec, k, mp.ref, 0, nh, h2o ? NULL : score, raw, base, w, &chk, st, msg)))
        return r;
    if (h2o) {
        h2o_sum(cfg, dec, raw, mp, heads_out, per, div, score, chk.report, st);
        LAUNCH_CHECK("h2o_sum");
    }
    return keep_launch(cfg, dec, keep, mp, heads_out, div, score, true, pool, base, w, kc, chk.report, st, msg);
}

/* ei_decode_score: query heads [h0, h1) (the header's split of ith/nth),
   scores [nh][n] by row, 0 for rows holding no position (every row when the
   policy has no query to score: H2O with every one summed). */
static ei_result api_decode_score(const ei_config *cfg, const ei_decoder *dec, const ei_tensor *k, const int32_t *row_pos,
                                  int64_t row_pos_stride, float *scores, int32_t h0, int32_t h1, void *ws,
                                  size_t ws_bytes, char *msg) {
    ei_result r;
    int nkv = dec->n_kv_heads, G = dec->n_heads / nkv;
    int64_t T = ei__decode_tail(cfg, dec), n = k->n_tokens;
    bool dfr = deferred(cfg);
    cudaStream_t st = stream_of(cfg);
    DecodeWs w;
    char *base = NULL;
    Maps mp;
    DecodeCheck chk;
    if ((r = decode_ws_take(cfg, n, dec, ws, ws_bytes, &w, &base, msg))) return r;
    if (h0 >= h1) return EI_OK; /* more threads than heads */
    int maps = row_pos ? (row_pos_stride ? nkv : 1) : 0;
    int m0 = maps > 1 ? h0 / G : 0, m1 = maps > 1 ? (h1 - 1) / G + 1 : maps;
    if ((r = maps_build(row_pos, row_pos_stride, maps, m0, m1, n, T, !dfr, base, w, st, &mp, msg))) return r;
    if (!mp.on_device)
        for (int m = m0; m < (m1 > m0 ? m1 : m0 + 1); m++)
            if ((r = map_check(mp, m, msg))) return r;
    CUDA_TRY(cudaMemsetAsync(scores + (int64_t)h0 * n, 0, sizeof(float) * (size_t)(h1 - h0) * (size_t)n, st));
    if (!dfr) return decode_score_run(cfg, dec, k, mp.ref, h0, h1, NULL, scores, base, w, NULL, st, msg);
    check_init(&chk, DEC_E_SCORE, mp, cfg->decode_budget, base, w);
    chk.a0 = m0;
    chk.a1 = mp.on_device ? m1 : m0;
    return decode_score_run(cfg, dec, k, mp.ref, h0, h1, NULL, scores, base, w, &chk, st, msg);
}

/* ei_decode_select: scores [nh][n_rows] by row (ei_decode_score's) reduced
   per head of the keep set over its map's candidates, then pooled and kept
   (H2O: summed into the decoder first, its sums reduced, not pooled;
   STREAMING: kept by position). */
static ei_result api_decode_select(const ei_config *cfg, ei_decoder *dec, const float *scores, int64_t n_rows,
                                   ei_keep_set *keep, void *ws, size_t ws_bytes, char *msg) {
    ei_result r;
    int nh = dec->n_heads, nkv = dec->n_kv_heads, G = nh / nkv;
    int64_t T = ei__decode_tail(cfg, dec), n = n_rows;
    int heads_out = cfg->per_kv_head ? nkv : nh, per = cfg->per_kv_head ? G : 1, div = cfg->per_kv_head ? 1 : G;
    bool dfr = deferred(cfg), h2o = cfg->decode_policy == EI_DECODE_H2O;
    int pool = h2o ? (int)EI_POOL_NONE : (int)cfg->pool;
    cudaStream_t st = stream_of(cfg);
    DecodeWs w;
    char *base = NULL;
    Maps mp;
    KeepCounts kc;
    DecodeCheck chk;
    const unsigned long long *gate = NULL;
    if ((r = decode_ws_take(cfg, n, dec, ws, ws_bytes, &w, &base, msg))) return r;
    int maps = keep->row_pos ? (keep->row_pos_stride ? nkv : 1) : 0;
    if (dfr && maps && n < cfg->decode_budget) return deferred_rows_refuse(cfg, n, msg);
    if (dfr && maps && (r = deferred_maps_policy(cfg, true, true, msg))) return r;
    if ((r = maps_build(keep->row_pos, keep->row_pos_stride, maps, 0, maps, n, T, !dfr, base, w, st, &mp, msg))) return r;
    float *red = (float *)(base + w.score);
    if (h2o) { /* the host checks before the decoder's sums change */
        if ((r = keep_counts(cfg, keep, mp, heads_out, div, &kc, msg)) || (!mp.on_device && (r = h2o_check(dec, mp, msg))))
            return r;
        if (dfr) { /* (no row map: checked on the host) */
            check_init(&chk, DEC_E_SELECT, mp, kc.b, base, w);
            check_keep(&chk, keep, heads_out, div, false);
            if ((r = check_launch(chk, st, msg))) return r;
            gate = chk.report;
        }
        h2o_sum(cfg, dec, scores, mp, heads_out, per, div, red, gate, st);
        LAUNCH_CHECK("h2o_sum");
        return keep_launch(cfg, dec, keep, mp, heads_out, div, red, true, pool, base, w, kc, gate, st, msg);
    }
    if (dfr && (r = keep_counts(cfg, keep, mp, heads_out, div, &kc, msg))) return r;
    reduce_heads_kernel<<<stride_blocks((int64_t)heads_out * n), 256, 0, st>>>(
        scores, n, heads_out, per, cfg->gqa_reduce == EI_REDUCE_MAX, mp.ref, div, T, red);
    LAUNCH_CHECK("reduce_heads_kernel");
    if (!dfr) return keep_finish_run(cfg, dec, keep, mp, heads_out, div, red, true, pool, base, w, st, msg);
    if (mp.on_device) { /* the maps and the counts on the device */
        check_init(&chk, DEC_E_SELECT, mp, kc.b, base, w);
        check_keep(&chk, keep, heads_out, div, true);
        if ((r = check_launch(chk, st, msg))) return r;
        gate = chk.report;
    }
    return keep_launch(cfg, dec, keep, mp, heads_out, div, red, true, pool, base, w, kc, gate, st, msg);
}

/* ei_decode_shared_add: every query head of the layer reduced, pooled over
   the candidates in position order (H2O: the decoder's sums after the
   layer's fresh queries, not pooled), divided by their sum, added into
   shared[row] (gqa_reduce max: the maximum kept); STREAMING adds nothing. */
static ei_result api_decode_shared_add(const ei_config *cfg, ei_decoder *dec, const float *scores, int64_t n_rows,
                                       const int32_t *row_pos, float *shared, void *ws, size_t ws_bytes, char *msg) {
    ei_result r;
    int nh = dec->n_heads;
    int64_t T = ei__decode_tail(cfg, dec), n = n_rows;
    bool dfr = deferred(cfg), h2o = cfg->decode_policy == EI_DECODE_H2O;
    cudaStream_t st = stream_of(cfg);
    DecodeWs w;
    char *base = NULL;
    Maps mp;
    DecodeCheck chk;
    const unsigned long long *gate = NULL;
    if ((r = decode_ws_take(cfg, n, dec, ws, ws_bytes, &w, &base, msg))) return r;
    if (dfr && row_pos && (r = deferred_maps_policy(cfg, false, true, msg))) return r;
    if ((r = maps_build(row_pos, 0, row_pos ? 1 : 0, 0, row_pos ? 1 : 0, n, T, !dfr, base, w, st, &mp, msg))) return r;
    if (!mp.on_device && (r = map_check(mp, 0, msg))) return r;
    if (h2o && !mp.on_device && (r = h2o_check(dec, mp, msg))) return r;
    if (mp.on_device || (dfr && h2o)) { /* deferred errors: the map checked on the device, the layer added only if good */
        check_init(&chk, DEC_E_SHARED_ADD, mp, cfg->decode_budget, base, w);
        chk.a1 = mp.on_device ? 1 : 0;
        if ((r = check_launch(chk, st, msg))) return r;
        gate = chk.report;
    }
    if (cfg->decode_policy == EI_DECODE_STREAMING) { /* keeps by position: nothing to add */
        dec->last_compress = dec->n_generated;
        return EI_OK;
    }
    float *red = (float *)(base + w.score), *pooled = (float *)(base + w.pooled);
    double *sum = (double *)(base + w.flags + 3 * sizeof(unsigned long long));
    double *xlx = cfg->decode_shared_weight == EI_SHARED_ENTROPY ? /* (after the report's 4 words) */
                      (double *)(base + w.flags + 8 * sizeof(unsigned long long)) : NULL;
    if (h2o) {
        h2o_sum(cfg, dec, scores, mp, 1, nh, 1, pooled, gate, st);
        LAUNCH_CHECK("h2o_sum");
    } else {
        reduce_heads_kernel<<<stride_blocks(n), 256, 0, st>>>(scores, n, 1, nh, cfg->gqa_reduce == EI_REDUCE_MAX, mp.ref,
                                                              1, T, red);
        LAUNCH_CHECK("reduce_heads_kernel");
        pool_kernel<<<stride_blocks(n), 256, 0, st>>>(red, pooled, NULL, 0, n, 1, mp.ref, 1, T, cfg->decode_budget,
                                                      cfg->pool, cfg->pool_kernel, NULL);
        LAUNCH_CHECK("pool_kernel");
    }
    shared_sum_kernel<<<1, 256, 0, st>>>(pooled, mp.ref, T, sum, xlx);
    LAUNCH_CHECK("shared_sum_kernel");
    shared_add_kernel<<<stride_blocks(n), 256, 0, st>>>(pooled, mp.ref, T, sum, xlx, cfg->gqa_reduce == EI_REDUCE_MAX,
                                                        shared, gate);
    LAUNCH_CHECK("shared_add_kernel");
    dec->last_compress = dec->n_generated;
    return EI_OK;
}

/* ei_decode_select_shared: one keep set (heads_out 1) from the summed
   shared scores, kept by the policy; non-finite ones refused before
   anything is written. */
static ei_result api_decode_select_shared(const ei_config *cfg, const ei_decoder *dec, const float *shared,
                                          int64_t n_rows, ei_keep_set *keep, void *ws, size_t ws_bytes, char *msg) {
    ei_result r;
    int64_t T = ei__decode_tail(cfg, dec), n = n_rows, budget = cfg->decode_budget;
    bool dfr = deferred(cfg);
    cudaStream_t st = stream_of(cfg);
    DecodeWs w;
    char *base = NULL;
    Maps mp;
    if ((r = decode_ws_take(cfg, n, dec, ws, ws_bytes, &w, &base, msg))) return r;
    int maps = keep->row_pos ? 1 : 0;
    if (dfr && maps && n < budget) return deferred_rows_refuse(cfg, n, msg);
    if (dfr && maps && (r = deferred_maps_policy(cfg, true, false, msg))) return r;
    if ((r = maps_build(keep->row_pos, 0, maps, 0, maps, n, T, !dfr, base, w, st, &mp, msg))) return r;
    if (!mp.on_device && (r = map_check(mp, 0, msg))) return r;
    float *pooled = (float *)(base + w.pooled);
    unsigned long long *bad = (unsigned long long *)(base + w.flags) + 2;
    if (dfr) { /* the host checks (no row map), then kernels only: the candidates whatever np, checked on the device */
        KeepCounts kc;
        DecodeCheck chk;
        if ((r = keep_counts(cfg, keep, mp, 1, 1, &kc, msg))) return r;
        CUDA_TRY(cudaMemsetAsync(bad, 0xFF, sizeof *bad, st));
        shared_gather_kernel<<<stride_blocks(n), 256, 0, st>>>(shared, mp.ref, T, pooled, bad);
        LAUNCH_CHECK("shared_gather_kernel");
        check_init(&chk, DEC_E_SELECT_SHARED, mp, kc.b, base, w);
        chk.a1 = mp.on_device ? 1 : 0;
        chk.shared_bad = bad;
        check_keep(&chk, keep, 1, 1, mp.on_device);
        if ((r = check_launch(chk, st, msg))) return r;
        if (keep->pooled) {
            pooled_copy_kernel<<<stride_blocks(n), 256, 0, st>>>(pooled, keep->pooled, mp.ref, T, kc.b, chk.report);
            LAUNCH_CHECK("pooled_copy_kernel");
        }
        return keep_launch(cfg, NULL, keep, mp, 1, 1, pooled, false, (int)cfg->pool, base, w, kc, chk.report, st, msg);
    }
    int64_t np = mp.np(0), L = np - T;
    budget = ei__decode_budget(cfg, mp.len(0));
    if (np >= budget) {
        unsigned long long b = 0;
        if ((r = tail_fits(T, budget, msg))) return r;
        if (keep->pooled && keep->pooled_capacity < L)
            return decode_fault_fail(DK_POOLED, (unsigned long long)keep->pooled_capacity, (unsigned long long)L, 0, msg);
        CUDA_TRY(cudaMemsetAsync(bad, 0xFF, sizeof *bad, st));
        shared_gather_kernel<<<stride_blocks(n), 256, 0, st>>>(shared, mp.ref, T, pooled, bad);
        LAUNCH_CHECK("shared_gather_kernel");
        CUDA_TRY(cudaMemcpyAsync(&b, bad, sizeof b, cudaMemcpyDeviceToHost, st));
        CUDA_TRY(cudaStreamSynchronize(st));
        if (b != ~0ull) return decode_fault_fail(DK_SHARED, b & 0xFFFFFFFFu, 0, 0, msg);
        if (keep->pooled && L > 0) /* (STREAMING: then what it kept, by keep_finish_kernel) */
            CUDA_TRY(cudaMemcpyAsync(keep->pooled, pooled, sizeof(float) * (size_t)L, cudaMemcpyDeviceToDevice, st));
    }
    return keep_finish_run(cfg, NULL, keep, mp, 1, 1, pooled, false, (int)cfg->pool, base, w, st, msg);
}

/* ============================================================ >>cuda-compact */
/* The keep set's indices, checked as the CPU does before anything moves: for
   every head h and i < n_kept, i <= index[h][i] < n_tokens, ascending. The
   first bad (h, i) in the CPU's order goes to first_bad as h << 32 | i. */
__global__ void keep_check_kernel(const int *index, int capacity, int heads, int n_kept, int64_t n_tokens,
                                  unsigned long long *first_bad) {
    int64_t total = (int64_t)heads * n_kept;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int h = (int)(e / n_kept), i = (int)(e % n_kept);
        const int *idx = index + (int64_t)h * capacity;
        int x = idx[i];
        if (x < i || x >= n_tokens || (i > 0 && x <= idx[i - 1]))
            atomicMin(first_bad, ((unsigned long long)h << 32) | (unsigned long long)i);
    }
}

/* One CTA per head: row i of head h becomes row index[h][i], the rows moved
   in chunks through shared memory in units of U (16, 8, 4 or 2 bytes), all
   reads of a chunk before its writes. Safe in place: the index is ascending
   with index[i] >= i, so a chunk's sources are never rows an earlier chunk
   wrote. Rows already in place (index[i] == i) are left alone. */
#define CMP_BYTES 16384
template <typename U>
__global__ void __launch_bounds__(256) compact_kernel(const int *index, int64_t idx_stride, int n_kept, char *data,
                                                      int64_t ts_bytes, int64_t hs_bytes, int row_bytes,
                                                      const unsigned long long *gate) {
    __shared__ U stage[CMP_BYTES / sizeof(U)];
    if (gate && *gate != ~0ull) return; /* deferred errors: a bad keep set moves nothing */
    int h = blockIdx.x;
    const int *idx = index + (int64_t)h * idx_stride; /* idx_stride 0: a shared set */
    int units = row_bytes / (int)sizeof(U);
    int rows = (int)(CMP_BYTES / sizeof(U)) / units;
    char *head = data + (int64_t)h * hs_bytes;
    for (int i0 = 0; i0 < n_kept; i0 += rows) {
        int rc = min(rows, n_kept - i0);
        for (int e = threadIdx.x; e < rc * units; e += blockDim.x) {
            int r = e / units, u = e % units, src = idx[i0 + r];
            if (src != i0 + r) stage[e] = *(const U *)(head + (int64_t)src * ts_bytes + (int64_t)u * sizeof(U));
        }
        __syncthreads();
        for (int e = threadIdx.x; e < rc * units; e += blockDim.x) {
            int r = e / units, u = e % units;
            if (idx[i0 + r] != i0 + r) *(U *)(head + (int64_t)(i0 + r) * ts_bytes + (int64_t)u * sizeof(U)) = stage[e];
        }
        __syncthreads();
    }
}

static ei_result compact_one(const ei_keep_set *keep, ei_out_tensor *x, const unsigned long long *gate, cudaStream_t st,
                             char *msg) {
    int64_t es = x->dtype == EI_F32 ? 4 : 2, ts = x->token_stride * es, hs = x->head_stride * es;
    int row = (int)(x->head_dim * es);
    uintptr_t a = (uintptr_t)x->data | (uintptr_t)ts | (uintptr_t)hs | (uintptr_t)row;
    char *d = (char *)x->data;
    /* one CTA per head of the cache; a shared set (heads_out 1) serves every head */
    int64_t is = keep->heads_out == 1 ? 0 : (int64_t)keep->capacity;
    unsigned heads = (unsigned)x->n_heads;
    if (a & 1) return fail(msg, EI_ERR_UNSUPPORTED, "CUDA compaction needs a 2-byte aligned cache (got %p)", x->data);
    if (!(a & 15)) compact_kernel<uint4><<<heads, 256, 0, st>>>(keep->index, is, keep->n_kept, d, ts, hs, row, gate);
    else if (!(a & 7)) compact_kernel<uint2><<<heads, 256, 0, st>>>(keep->index, is, keep->n_kept, d, ts, hs, row, gate);
    else if (!(a & 3)) compact_kernel<uint32_t><<<heads, 256, 0, st>>>(keep->index, is, keep->n_kept, d, ts, hs, row, gate);
    else compact_kernel<uint16_t><<<heads, 256, 0, st>>>(keep->index, is, keep->n_kept, d, ts, hs, row, gate);
    LAUNCH_CHECK("compact_kernel");
    return EI_OK;
}

/* The header checked the keep set's shape, k and v (either may be NULL) and
   that they do not overlap; k and v may differ in dtype and head_dim. */
static ei_result api_kv_compact(const ei_config *cfg, const ei_keep_set *keep, ei_out_tensor *k, ei_out_tensor *v,
                                char *msg) {
    cudaStream_t st = stream_of(cfg);
    unsigned long long *slot = NULL, bad = 0;
    int64_t total = (int64_t)keep->heads_out * keep->n_kept;
    ei_result r;
    if (keep->n_kept == 0) return EI_OK; /* nothing kept, nothing to check or move */
    if ((r = slot_take(st, &slot, msg))) return r;
    keep_check_kernel<<<stride_blocks(total), 256, 0, st>>>(keep->index, keep->capacity, keep->heads_out, keep->n_kept,
                                                            keep->n_tokens, slot);
    LAUNCH_CHECK("keep_check_kernel");
    if (deferred(cfg)) {
        if ((r = deferred_record(slot, DE_COMPACT, 0, st, msg)) || (k && (r = compact_one(keep, k, slot, st, msg))) ||
            (v && (r = compact_one(keep, v, slot, st, msg))))
            return r;
        return EI_OK;
    }
    if ((r = slot_read(st, slot, &bad, msg))) return r;
    if (bad != ~0ull) {
        int h = (int)(bad >> 32), i = (int)(bad & 0xFFFFFFFFu), x = 0;
        CUDA_TRY(cudaMemcpy(&x, keep->index + (size_t)h * (size_t)keep->capacity + (size_t)i, sizeof x,
                            cudaMemcpyDeviceToHost));
        return fail(msg, EI_ERR_SHAPE, "keep index [%d][%d] = %d is not ascending inside the cache", h, i, x);
    }
    if (k && (r = compact_one(keep, k, NULL, st, msg))) return r;
    if (v && (r = compact_one(keep, v, NULL, st, msg))) return r;
    return EI_OK;
}

/* ============================================================ >>cuda-mask */
/* ei_plan_mask: one CTA per (query row, mask head), the header's rule
   (entropyinfer.h, >>mask): the row's keys -inf, or base's values (0) where
   visible: every key up to the query in a dense segment; in a sparse one
   the segment's own keys in the first pass, then the kept blocks (the
   count clamped to max_keep, block numbers outside the blocks before the
   segment skipped, as attention_kernel's key lists do), the two passes
   ordered by the CTA barrier. */
struct MaskView {
    char *data;
    int dtype, n_heads;
    int64_t n_keys, rs, hs;
};
static MaskView mask_view(const ei_mask *m) {
    MaskView v = {(char *)m->data, (int)m->dtype, (int)m->n_heads, m->n_keys, m->row_stride, m->head_stride};
    return v;
}
__device__ __forceinline__ float mask_load(const MaskView &m, int64_t e) {
    if (m.dtype == EI_F32) return ((const float *)m.data)[e];
    if (m.dtype == EI_F16) return __half2float(((const __half *)m.data)[e]);
    return __bfloat162float(((const __nv_bfloat16 *)m.data)[e]);
}
/* element j of row i, head h: -inf, or base's value (bits copied when the
   dtypes match; 0 without a base) */
__device__ __forceinline__ void mask_put(const MaskView &o, const MaskView &b, bool has_base, int h, int64_t i,
                                         int64_t j, bool visible) {
    int64_t oe = i * o.rs + (int64_t)h * o.hs + j, be = i * b.rs + (int64_t)(b.n_heads == 1 ? 0 : h) * b.hs + j;
    if (o.dtype == EI_F32) {
        ((float *)o.data)[oe] = !visible ? -INFINITY : !has_base ? 0.f : mask_load(b, be);
    } else if (!visible || !has_base || b.dtype != o.dtype) {
        float x = !visible ? -INFINITY : !has_base ? 0.f : mask_load(b, be);
        if (o.dtype == EI_F16) ((__half *)o.data)[oe] = __float2half_rn(x);
        else ((__nv_bfloat16 *)o.data)[oe] = __float2bfloat16_rn(x);
    } else {
        ((uint16_t *)o.data)[oe] = ((const uint16_t *)b.data)[be];
    }
}
__global__ void __launch_bounds__(256) mask_kernel(const ei_config cfg, const ei_plan p, int has_plan, int64_t q_offset,
                                                   MaskView base, int has_base, MaskView out, int G) {
    const int64_t i = blockIdx.x, t = q_offset + i, seg = cfg.segment_size, bs = cfg.block_size;
    const int h = blockIdx.y, s = (int)(t / seg);
    const int64_t end = min(t + 1, out.n_keys), S0 = (int64_t)s * seg;
    const bool sparse = has_plan && ei__segment_sparse(&cfg, s, p.n_segments, p.final);
    const int64_t vis0 = sparse ? min(S0, end) : 0;
    for (int64_t j = threadIdx.x; j < out.n_keys; j += blockDim.x)
        mask_put(out, base, has_base, h, i, j, j >= vis0 && j < end);
    if (!sparse) return; /* (the same for the whole CTA) */
    __syncthreads();
    const int kv0 = out.n_heads == 1 ? 0 : h / G, kv1 = out.n_heads == 1 ? p.n_kv_heads : kv0 + 1;
    const int64_t first_blocked = (int64_t)s * (seg / bs);
    for (int kvh = kv0; kvh < kv1; kvh++) {
        const size_t row = (size_t)kvh * (size_t)p.seg_capacity + (size_t)s;
        const int cnt = max(0, min(p.keep_count[row], p.max_keep));
        const int *blocks = p.block_index + row * (size_t)p.max_keep;
        for (int64_t e = threadIdx.x; e < (int64_t)cnt * bs; e += blockDim.x) {
            const int b = blocks[e / bs];
            const int64_t j = (int64_t)b * bs + e % bs;
            if (b >= 0 && b < first_blocked && j < end) mask_put(out, base, has_base, h, i, j, true);
        }
    }
}

/* The header checked the views (element-aligned, inside their buffers, not
   overlapping), out's heads against the plan's, and that the plan covers
   the rows. */
static ei_result api_plan_mask(const ei_config *cfg, const ei_plan *plan, int64_t q_offset, const ei_mask *base,
                               ei_mask *out, char *msg) {
    cudaStream_t st = stream_of(cfg);
    ei_plan p;
    memset(&p, 0, sizeof p);
    if (plan) p = *plan;
    MaskView o = mask_view(out), b = base ? mask_view(base) : o;
    int G = plan && out->n_heads > 1 ? out->n_heads / plan->n_kv_heads : 1;
    dim3 grid((unsigned)out->n_rows, (unsigned)out->n_heads); /* n_rows <= EI_MAX_TOKENS, heads <= EI_MAX_HEADS */
    mask_kernel<<<grid, 256, 0, st>>>(*cfg, p, plan != NULL, q_offset, b, base != NULL, o, G);
    LAUNCH_CHECK("mask_kernel");
    return EI_OK;
}

/* ============================================================ table */
static const char *api_build_info(void) {
#define EI__STR2(x) #x
#define EI__STR(x) EI__STR2(x)
    return "entropyinfer_cuda " EI_VERSION_STRING " (ABI " EI__STR(EI_CUDA_ABI_VERSION) ", built with CUDA "
        EI__STR(__CUDACC_VER_MAJOR__) "." EI__STR(__CUDACC_VER_MINOR__) ")";
}
static ei_result api_device_check(char *msg) {
    int n = 0, dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
        return fail(msg, EI_ERR_BACKEND, "no NVIDIA driver or GPU here (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
    if (e != cudaSuccess) return fail(msg, EI_ERR_BACKEND, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
    if (n <= 0) return fail(msg, EI_ERR_BACKEND, "no CUDA device");
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        return fail(msg, EI_ERR_BACKEND, "cannot query the current device");
    if (prop.major < 8)
        return fail(msg, EI_ERR_BACKEND, "device %d (%s) is sm_%d%d; sm_80 or newer needed", dev, prop.name, prop.major,
                    prop.minor);
    fail(msg, EI_OK, "device %d: %s, sm_%d%d, %d SMs", dev, prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    return EI_OK;
}
static ei_result api_mem_alloc(void **ptr, size_t bytes, char *msg) {
    *ptr = NULL;
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) return fail(msg, EI_ERR_NOMEM, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    return EI_OK;
}
static void api_mem_free(void *ptr) {
    if (ptr) cudaFree(ptr);
}
static ei_result api_mem_copy(void *dst, const void *src, size_t bytes, int kind, void *stream, char *msg) {
    cudaMemcpyKind k = kind == EI_COPY_DEVICE_TO_HOST   ? cudaMemcpyDeviceToHost
                       : kind == EI_COPY_HOST_TO_DEVICE ? cudaMemcpyHostToDevice
                                                        : cudaMemcpyDeviceToDevice;
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, k, (cudaStream_t)stream));
    CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return EI_OK;
}
/* cudaMemsetAsync on the stream (asynchronous, like the kernels) */
static ei_result api_mem_set(void *dst, int byte, size_t bytes, void *stream, char *msg) {
    CUDA_TRY(cudaMemsetAsync(dst, byte, bytes, (cudaStream_t)stream));
    return EI_OK;
}
static ei_result api_synchronize(void *stream, char *msg) {
    CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return EI_OK;
}

/* The first deferred report since the last call, as the code and message the
   synchronous call would have returned, then cleared; waits for the stream. */
static ei_result api_deferred_status(void *stream, char *msg) {
    cudaStream_t st = (cudaStream_t)stream;
    unsigned long long word[4] = {0, 0, 0, 0};
    static const unsigned long long zero[4] = {0, 0, 0, 0};
    CUDA_TRY(cudaMemcpyFromSymbolAsync(word, g_deferred, sizeof word, 0, cudaMemcpyDeviceToHost, st));
    CUDA_TRY(cudaStreamSynchronize(st));
    if (!word[0]) return EI_OK;
    CUDA_TRY(cudaMemcpyToSymbolAsync(g_deferred, zero, sizeof zero, 0, cudaMemcpyHostToDevice, st));
    CUDA_TRY(cudaStreamSynchronize(st));
    int source = (int)(word[0] & 255u), detail = (int)(word[0] >> 8);
    ei_result r = EI_ERR_BACKEND;
    const char *entry = source == DE_PROFILE ? "profile" : source == DE_ATTENTION ? "attention"
                      : source == DE_OBSERVE ? "decode_observe" : source == DE_COMPACT ? "kv_compact"
                      : source == DE_DECODE ? decode_entry_name(detail & 15) : "?";
    char what[EI_CUDA_MSG_SIZE];
    what[0] = 0;
    if (source == DE_PROFILE) r = profile_flag_fail((int)word[1], detail, what);
    else if (source == DE_ATTENTION) r = attention_bad_fail(word[1], (detail & DE_Q_F32) != 0, (detail & DE_BF16) != 0, what);
    else if (source == DE_OBSERVE) r = observe_bad_fail(word[1], what);
    else if (source == DE_COMPACT)
        r = fail(what, EI_ERR_SHAPE, "keep index [%d][%d] is not ascending inside the cache", (int)(word[1] >> 32),
                 (int)(word[1] & 0xFFFFFFFFu));
    else if (source == DE_DECODE) r = decode_fault_fail(detail >> 4, word[1], word[2], word[3], what);
    else snprintf(what, sizeof what, "unknown report %llu", word[0]);
    return fail(msg, r, "%s (deferred): %s", entry, what);
}

static const ei_cuda_api ei__cuda_table = {
    EI_CUDA_ABI_VERSION,
    (int32_t)sizeof(ei_cuda_api),
    api_build_info,
    api_device_check,
    api_mem_alloc,
    api_mem_free,
    api_mem_copy,
    api_mem_set,
    api_synchronize,
    api_plan_copy,
    api_profile_workspace_size,
    api_profile,
    api_attention_workspace_size,
    api_attention,
    api_decode_observe,
    api_decode_workspace_size,
    api_decode_keep,
    api_kv_compact,
    api_decode_score,
    api_decode_select,
    api_decode_shared_add,
    api_decode_select_shared,
    api_deferred_status,
    api_profile_chunk,
    api_plan_mask,
};

/* The table whatever version is asked for: the header compares abi_version
   and struct_size and names both in its error. */
EI_EXPORT const ei_cuda_api *ei_cuda_get_api(int abi_version) {
    (void)abi_version;
    return &ei__cuda_table;
}
