/* bench/ei_tp_shim.c - a thin C ABI over entropyinfer.h for bench/ei_tp_cuda.py.

   Built into build/libei_tp_shim.so (bench/tp.mk) with ENTROPYINFER_IMPLEMENTATION;
   loaded from Python with ctypes. Every pointer it takes for tensors, plans and
   workspaces is a raw device pointer (torch's data_ptr()); the views (eitp_view,
   laid out exactly as ei_tensor: the driver checks eitp_view_size()) carry the
   token and head strides, so a shard of heads is a view with fewer heads and an
   offset pointer, never a copy. Nothing here knows about torch, NCCL or ranks:
   what an engine does under its own tensor parallelism is what the driver does
   with this: one context, plan and workspace per rank, views of its own heads.
   Functions return an ei_result (0 = EI_OK); eitp_error() gives the message. */
#define ENTROPYINFER_IMPLEMENTATION
#include "entropyinfer.h"

#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define EITP __attribute__((visibility("default")))
#else
#define EITP
#endif

/* A GPU context on the caller's stream, and a CPU twin for host plans (reading
   a device plan back for comparison). */
typedef struct eitp_ctx {
    ei_context *gpu, *cpu;
} eitp_ctx;

EITP int eitp_view_size(void) { return (int)sizeof(ei_tensor); }
EITP const char *eitp_error(void) { return ei_last_error(); }
EITP const char *eitp_result_name(int r) { return ei_result_name((ei_result)r); }

/* stream: the caller's cudaStream_t (torch.cuda.current_stream().cuda_stream),
   so the library's kernels are ordered with torch's; cuda_library: NULL or a
   path (else $EI_CUDA_LIBRARY, then the usual names). cpu = 1: the CPU backend
   instead (host pointers; for checking the shim on a machine without a GPU). */
EITP int eitp_create(void *stream, const char *cuda_library, int cpu, void **out) {
    ei_config cfg = ei_config_default(), ccfg;
    eitp_ctx *c;
    ei_result r;
    if (!out) return EI_ERR_NULL;
    *out = NULL;
    c = (eitp_ctx *)calloc(1, sizeof *c);
    if (!c) return EI_ERR_NOMEM;
    cfg.backend = cpu ? EI_BACKEND_CPU : EI_BACKEND_CUDA;
    cfg.cuda_stream = stream;
    cfg.cuda_library = cuda_library && cuda_library[0] ? cuda_library : NULL;
    if ((r = ei_context_create(&cfg, &c->gpu)) != EI_OK) { free(c); return r; }
    ccfg = cfg;
    ccfg.backend = EI_BACKEND_CPU;
    if ((r = ei_context_create(&ccfg, &c->cpu)) != EI_OK) {
        ei_context_destroy(c->gpu);
        free(c);
        return r;
    }
    *out = c;
    return EI_OK;
}

EITP void eitp_destroy(void *h) {
    eitp_ctx *c = (eitp_ctx *)h;
    if (!c) return;
    ei_context_destroy(c->gpu);
    ei_context_destroy(c->cpu);
    free(c);
}

/* sizes[0]: plan bytes, [1]: profiling workspace, [2]: attention workspace
   (device memory, for n tokens of nh query / nkv kv heads of head_dim hd) */
EITP int eitp_sizes(void *h, int64_t n, int32_t nh, int32_t nkv, int32_t hd, size_t *sizes) {
    eitp_ctx *c = (eitp_ctx *)h;
    ei_shape sh;
    ei_sizes z;
    ei_result r;
    if (!c || !sizes) return EI_ERR_NULL;
    memset(&sh, 0, sizeof sh);
    sh.max_tokens = n;
    sh.n_heads = nh;
    sh.n_kv_heads = nkv;
    sh.head_dim = hd;
    if ((r = ei_layer_sizes(c->gpu, &sh, &z)) != EI_OK) return r;
    sizes[0] = z.plan;
    sizes[1] = z.profile;
    sizes[2] = z.prefill;
    return EI_OK;
}

/* A plan (host struct, arrays in the caller's device memory of `bytes`). */
EITP int eitp_plan_create(void *h, int64_t n, int32_t nkv, int32_t hd, void *device_memory, size_t bytes,
                          void **out) {
    eitp_ctx *c = (eitp_ctx *)h;
    ei_plan *p;
    ei_result r;
    if (!c || !out) return EI_ERR_NULL;
    *out = NULL;
    p = (ei_plan *)calloc(1, sizeof *p);
    if (!p) return EI_ERR_NOMEM;
    if ((r = ei_plan_init(c->gpu, p, n, nkv, hd, 0, device_memory, bytes)) != EI_OK) { free(p); return r; }
    *out = p;
    return EI_OK;
}
EITP void eitp_plan_destroy(void *plan) { free(plan); }

/* A whole call with the caller's workspace (one launch sequence on the GPU). */
static ei_exec eitp_exec(void *ws, size_t ws_bytes) {
    ei_exec x;
    memset(&x, 0, sizeof x);
    x.workspace = ws;
    x.workspace_bytes = ws_bytes;
    return x;
}

EITP int eitp_profile(void *h, void *plan, const ei_tensor *q, const ei_tensor *k, void *ws, size_t ws_bytes) {
    eitp_ctx *c = (eitp_ctx *)h;
    ei_exec x = eitp_exec(ws, ws_bytes);
    if (!c) return EI_ERR_NULL;
    return ei_profile(c->gpu, &x, q, k, (ei_plan *)plan);
}

/* plan NULL: dense causal attention. out: an ei_tensor-shaped view of a
   buffer the library writes (eitp_view in Python; ei_out_tensor has the same
   layout with a non-const pointer). */
EITP int eitp_attention(void *h, const void *plan, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                        const ei_tensor *out, void *ws, size_t ws_bytes) {
    eitp_ctx *c = (eitp_ctx *)h;
    ei_exec x = eitp_exec(ws, ws_bytes);
    ei_out_tensor o;
    if (!c || !out) return EI_ERR_NULL;
    o.data = (void *)(uintptr_t)out->data;
    o.dtype = out->dtype;
    o.n_heads = out->n_heads;
    o.head_dim = out->head_dim;
    o.n_tokens = out->n_tokens;
    o.token_stride = out->token_stride;
    o.head_stride = out->head_stride;
    return ei_attention_prefill(c->gpu, &x, q, k, v, (const ei_plan *)plan, &o, 0);
}

/* info: n_tokens, n_kv_heads, n_segments, n_blocks, max_keep, seg_capacity */
EITP int eitp_plan_info(const void *plan, int64_t *info) {
    const ei_plan *p = (const ei_plan *)plan;
    if (!p || !info) return EI_ERR_NULL;
    info[0] = p->n_tokens;
    info[1] = p->n_kv_heads;
    info[2] = p->n_segments;
    info[3] = p->n_blocks;
    info[4] = p->max_keep;
    info[5] = p->seg_capacity;
    return EI_OK;
}

/* A device plan read back (ei_plan_copy into a host plan) and written densely
   into the caller's host arrays (a host plan is read in place): entropy, budget f32[nkv][nseg], head_class
   u8[nkv], keep_blocks, keep_count i32[nkv][nseg], block_index
   i32[nkv][nseg][max_keep] (nseg = n_segments, max_keep as eitp_plan_info). */
EITP int eitp_plan_export(void *h, const void *plan, float *entropy, uint8_t *head_class, float *budget,
                          int32_t *keep_blocks, int32_t *keep_count, int32_t *block_index) {
    eitp_ctx *c = (eitp_ctx *)h;
    const ei_plan *p = (const ei_plan *)plan;
    ei_plan hp;
    ei_result r;
    int32_t kv, s;
    size_t mk;
    if (!c || !p || !entropy || !head_class || !budget || !keep_blocks || !keep_count || !block_index)
        return EI_ERR_NULL;
    if (!p->on_device) {
        hp = *p; /* a host plan (CPU backend): read in place */
    } else {
        if ((r = ei_plan_init(c->cpu, &hp, p->max_tokens, p->n_kv_heads, p->head_dim, 0, NULL, 0)) != EI_OK) return r;
        if ((r = ei_plan_copy(c->gpu, &hp, p, EI_COPY_DEVICE_TO_HOST)) != EI_OK) {
            ei_plan_free(c->cpu, &hp);
            return r;
        }
    }
    mk = (size_t)hp.max_keep;
    for (kv = 0; kv < hp.n_kv_heads; kv++) {
        head_class[kv] = hp.head_class[kv];
        for (s = 0; s < hp.n_segments; s++) {
            size_t i = (size_t)kv * (size_t)hp.n_segments + (size_t)s, row = EI_PLAN_ROW(&hp, kv, s);
            entropy[i] = hp.entropy[row];
            budget[i] = hp.budget[row];
            keep_blocks[i] = hp.keep_blocks[row];
            keep_count[i] = hp.keep_count[row];
            memcpy(block_index + i * mk, EI_PLAN_BLOCKS(&hp, kv, s), mk * sizeof(int32_t));
        }
    }
    if (p->on_device) ei_plan_free(c->cpu, &hp);
    return EI_OK;
}

/* 1 if segment s of the plan attends sparsely (for densities). */
EITP int eitp_segment_is_sparse(void *h, const void *plan, int32_t s) {
    eitp_ctx *c = (eitp_ctx *)h;
    return c && plan ? ei_plan_segment_is_sparse(c->gpu, (const ei_plan *)plan, s) : 0;
}
