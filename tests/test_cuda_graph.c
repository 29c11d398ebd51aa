/* tests/test_cuda_graph.c - cfg.cuda_deferred_errors: one layer's ei_profile +
   sparse ei_attention_prefill captured in a CUDA graph and replayed, and the
   deferred data errors of profile, attention, decode_observe and kv_compact.

     test_cuda_graph            needs a GPU and build/libentropyinfer_cuda.so

   Built by cuda.mk (make test-cuda) with nvcc, linking the CUDA runtime: the
   test drives the stream and the graph itself, as an engine would. Checks:
   - the capture succeeds (a call that synchronised, read back or allocated
     would invalidate it: cudaStreamCaptureModeGlobal), and the graph holds
     only kernel and memset nodes;
   - each replay, with new q/k/v written into the same device buffers, gives
     the plan and output of the eager run (a context without the mode) bit
     for bit, and ei_cuda_status says EI_OK;
   - NaN in q during a replay is reported by ei_cuda_status (EI_ERR_NONFINITE,
     a message naming q), once: the next call finds it cleared, and the next
     good replay again equals the eager run;
   - deferred decode_observe (NaN) and kv_compact (a bad keep index, the cache
     left as it was) report through ei_cuda_status, captured in a graph too;
   - a chunk of chunked planning (ei_profile_chunk) and a final call without
     queries, captured and replayed, equal the same calls without the mode. */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "check.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU(call)                                                                                       \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                       \
            printf("  FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static float urand_pm(void) { /* [-1, 1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
/* bf16 values with some structure (a few dominant key directions) so that
   plans differ between draws */
static void fill_bf16(uint16_t *x, size_t count, float scale) {
    size_t i;
    for (i = 0; i < count; i++) x[i] = f2bf(scale * urand_pm() + (i % 7 == 0 ? scale * urand_pm() * 4.f : 0.f));
}

typedef struct layer {
    int64_t n;
    int nh, nkv, D;
    void *q, *k, *v, *out, *plan_mem, *pws, *aws;
    size_t nq, nk, plan_bytes, pws_bytes, aws_bytes;
    ei_plan plan;
    ei_tensor tq, tk, tv;
    ei_out_tensor to;
} layer;

static void layer_make(ei_context *ctx, layer *L, int64_t n, int nh, int nkv, int D) {
    memset(L, 0, sizeof *L);
    L->n = n; L->nh = nh; L->nkv = nkv; L->D = D;
    L->nq = (size_t)n * nh * D;
    L->nk = (size_t)n * nkv * D;
    CU(cudaMalloc(&L->q, L->nq * 2));
    CU(cudaMalloc(&L->k, L->nk * 2));
    CU(cudaMalloc(&L->v, L->nk * 2));
    CU(cudaMalloc(&L->out, L->nq * 2));
    CU(cudaMemset(L->out, 0, L->nq * 2));
    CHECK_OK(ei_plan_size(ctx, n, nkv, D, 0, &L->plan_bytes));
    CU(cudaMalloc(&L->plan_mem, L->plan_bytes));
    CHECK_OK(ei_plan_init(ctx, &L->plan, n, nkv, D, 0, L->plan_mem, L->plan_bytes));
    CHECK_OK(ei_profile_workspace_size(ctx, n, nh, nkv, D, &L->pws_bytes));
    CU(cudaMalloc(&L->pws, L->pws_bytes));
    CHECK_OK(ei_attention_workspace_size(ctx, nh, nkv, D, &L->aws_bytes));
    if (L->aws_bytes) CU(cudaMalloc(&L->aws, L->aws_bytes));
    L->tq = ei_tensor_make(L->q, EI_BF16, n, nh, D);
    L->tk = ei_tensor_make(L->k, EI_BF16, n, nkv, D);
    L->tv = ei_tensor_make(L->v, EI_BF16, n, nkv, D);
    L->to = ei_out_tensor_make(L->out, EI_BF16, n, nh, D);
}
static void layer_free(layer *L) {
    cudaFree(L->q); cudaFree(L->k); cudaFree(L->v); cudaFree(L->out);
    cudaFree(L->plan_mem); cudaFree(L->pws);
    if (L->aws) cudaFree(L->aws);
}
static void layer_put(layer *L, const uint16_t *q, const uint16_t *k, const uint16_t *v) {
    CU(cudaMemcpy(L->q, q, L->nq * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(L->k, k, L->nk * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(L->v, v, L->nk * 2, cudaMemcpyHostToDevice));
}
/* the layer's calls as an engine makes them */
static ei_result layer_run(ei_context *ctx, layer *L) {
    ei_result r = ei_profile(ctx, &L->tq, &L->tk, &L->plan, L->pws, L->pws_bytes);
    if (r != EI_OK) return r;
    return ei_attention_prefill(ctx, &L->tq, &L->tk, &L->tv, &L->plan, &L->to, 0, 0, 1, L->aws, L->aws_bytes);
}
/* plan memory (every array) and output, bit for bit; 1 if equal */
static int layer_same(const layer *a, const layer *b) {
    unsigned char *pa = (unsigned char *)malloc(a->plan_bytes), *pb = (unsigned char *)malloc(b->plan_bytes);
    unsigned char *oa = (unsigned char *)malloc(a->nq * 2), *ob = (unsigned char *)malloc(b->nq * 2);
    int same;
    CU(cudaMemcpy(pa, a->plan_mem, a->plan_bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(pb, b->plan_mem, b->plan_bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(oa, a->out, a->nq * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(ob, b->out, b->nq * 2, cudaMemcpyDeviceToHost));
    same = a->plan_bytes == b->plan_bytes && !memcmp(pa, pb, a->plan_bytes) && !memcmp(oa, ob, a->nq * 2) &&
           a->plan.n_segments == b->plan.n_segments && a->plan.n_tokens == b->plan.n_tokens &&
           a->plan.final == b->plan.final;
    free(pa); free(pb); free(oa); free(ob);
    return same;
}

/* Capture call(arg) on st into *graph. A capture made before the plugin's
   kernels ever ran (cold: lazy module loading) is tried first; if it fails it
   is reported and tried again after one eager call, as engines warm up. */
typedef ei_result (*capture_fn)(void *arg);
static void capture(cudaStream_t st, capture_fn call, void *arg, const char *what, cudaGraph_t *graph) {
    int attempt;
    for (attempt = 0; attempt < 2; attempt++) {
        ei_result r;
        cudaError_t e;
        CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        r = call(arg);
        e = cudaStreamEndCapture(st, graph);
        if (r == EI_OK && e == cudaSuccess) {
            if (attempt) printf("  %s: captured after one eager call\n", what);
            return;
        }
        printf("  %s: %s capture failed: %s (%s), %s\n", what, attempt ? "warm" : "cold", ei_result_name(r),
               r == EI_OK ? "" : ei_last_error(), cudaGetErrorString(e));
        (void)cudaGetLastError();
        if (e == cudaSuccess) CU(cudaGraphDestroy(*graph));
        if (attempt == 0) { /* warm up */
            r = call(arg);
            CU(cudaStreamSynchronize(st));
            printf("  %s: eager call %s\n", what, ei_result_name(r));
        }
    }
    CHECK(0, "%s: no capture", what);
    exit(1);
}
typedef struct layer_call { ei_context *ctx; layer *L; } layer_call;
static ei_result layer_call_run(void *arg) {
    layer_call *a = (layer_call *)arg;
    return layer_run(a->ctx, a->L);
}

static void prefill_graph(void) {
    const int64_t n = 3000;
    const int nh = 8, nkv = 2, D = 128;
    ei_config c = ei_config_default();
    ei_context *eager = NULL, *capt = NULL;
    cudaStream_t st;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    layer E, G;
    size_t nq = (size_t)n * nh * D, nk = (size_t)n * nkv * D, n_nodes = 0, i;
    uint16_t *q = (uint16_t *)malloc(nq * 2), *k = (uint16_t *)malloc(nk * 2), *v = (uint16_t *)malloc(nk * 2);
    int rep, kernels = 0, memsets = 0, others = 0;
    ei_result r;

    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    c.backend = EI_BACKEND_CUDA;
    c.cuda_stream = st;
    c.threshold_len = 1024; /* sparse segments from token 1024 */
    c.base_budget = 256;
    CHECK_OK(ei_context_create(&c, &eager));
    c.cuda_deferred_errors = 1;
    CHECK_OK(ei_context_create(&c, &capt));
    layer_make(eager, &E, n, nh, nkv, D);
    layer_make(capt, &G, n, nh, nkv, D);
    CHECK(E.aws_bytes == 0 && G.aws_bytes > 0, "attention workspace: %zu bytes eager, %zu deferred", E.aws_bytes,
          G.aws_bytes);

    /* capture the layer: no call may synchronise, read back or allocate */
    fill_bf16(q, nq, 1.f); fill_bf16(k, nk, 1.f); fill_bf16(v, nk, 1.f);
    layer_put(&G, q, k, v);
    {
        layer_call lc;
        lc.ctx = capt; lc.L = &G;
        capture(st, layer_call_run, &lc, "profile + attention", &graph);
    }
    CU(cudaGraphGetNodes(graph, NULL, &n_nodes));
    {
        cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(n_nodes * sizeof *nodes);
        CU(cudaGraphGetNodes(graph, nodes, &n_nodes));
        for (i = 0; i < n_nodes; i++) {
            enum cudaGraphNodeType t;
            CU(cudaGraphNodeGetType(nodes[i], &t));
            if (t == cudaGraphNodeTypeKernel) kernels++;
            else if (t == cudaGraphNodeTypeMemset) memsets++;
            else others++;
        }
        free(nodes);
    }
    printf("  captured profile + sparse attention (n=%lld, %d/%d heads, d=%d, bf16): %d kernels, %d memsets, %d other "
           "nodes\n", (long long)n, nh, nkv, D, kernels, memsets, others);
    CHECK(others == 0 && kernels > 0, "the graph holds %d nodes that are neither kernels nor memsets", others);
    CU(cudaGraphInstantiateWithFlags(&exec, graph, 0));

    for (rep = 0; rep < 4; rep++) {
        int nan_rep = rep == 2; /* replay 2: NaN in q */
        int same;
        fill_bf16(q, nq, 1.f + 0.5f * (float)rep); fill_bf16(k, nk, 1.f); fill_bf16(v, nk, 1.f);
        if (nan_rep) q[(size_t)2500 * nh * D + 3 * D + 17] = 0x7FC0; /* bf16 NaN, token 2500 head 3 */
        layer_put(&G, q, k, v);
        layer_put(&E, q, k, v);
        CU(cudaGraphLaunch(exec, st));
        CU(cudaStreamSynchronize(st));
        r = ei_cuda_status(capt);
        if (nan_rep) {
            ei_result r2;
            char msg[512];
            snprintf(msg, sizeof msg, "%s", ei_last_error());
            CHECK(r == EI_ERR_NONFINITE && strstr(msg, "in q"), "replay with NaN in q: status %s (%s)",
                  ei_result_name(r), msg);
            printf("  replay %d, NaN in q: ei_cuda_status %s: %s\n", rep, ei_result_name(r), msg);
            r2 = ei_cuda_status(capt);
            CHECK(r2 == EI_OK, "the status was not cleared: %s", ei_result_name(r2));
            r2 = layer_run(eager, &E);
            CHECK(r2 == EI_ERR_NONFINITE, "eager run with NaN in q: %s", ei_result_name(r2));
            continue;
        }
        CHECK(r == EI_OK, "replay %d: status %s (%s)", rep, ei_result_name(r), ei_last_error());
        CHECK_OK(layer_run(eager, &E));
        same = layer_same(&G, &E);
        CHECK(same, "replay %d: plan or output differs from the eager run", rep);
        printf("  replay %d: plan (%lld bytes) and output (%lld bytes) %s the eager run's\n", rep,
               (long long)G.plan_bytes, (long long)(nq * 2), same ? "equal bit for bit" : "DIFFER from");
    }
    { /* the mode outside a graph: the same calls, eager, equal too */
        CHECK_OK(layer_run(capt, &G));
        CU(cudaStreamSynchronize(st));
        CHECK_OK(ei_cuda_status(capt));
        CHECK(layer_same(&G, &E), "deferred eager run differs from the synchronous one");
        r = ei_attention_prefill(capt, &G.tq, &G.tk, &G.tv, &G.plan, &G.to, 0, 0, 1, NULL, 0);
        CHECK(r == EI_ERR_NULL, "deferred attention without its workspace: %s", ei_result_name(r));
    }
    { /* attention's own report (dense, eager, deferred): NaN in q, nothing written */
        unsigned char *o = (unsigned char *)malloc(nq * 2);
        int untouched = 1;
        q[(size_t)2500 * nh * D + 3 * D + 17] = 0x7FC0;
        layer_put(&G, q, k, v);
        CU(cudaMemset(G.out, 0x5A, nq * 2));
        CHECK_OK(ei_attention_prefill(capt, &G.tq, &G.tk, &G.tv, NULL, &G.to, 0, 0, 1, G.aws, G.aws_bytes));
        CU(cudaStreamSynchronize(st));
        r = ei_cuda_status(capt);
        CHECK(r == EI_ERR_NONFINITE && strstr(ei_last_error(), "attention") && strstr(ei_last_error(), "token 2500"),
              "deferred attention with NaN in q: %s (%s)", ei_result_name(r), ei_last_error());
        printf("  deferred attention with NaN in q: ei_cuda_status %s: %s\n", ei_result_name(r), ei_last_error());
        CU(cudaMemcpy(o, G.out, nq * 2, cudaMemcpyDeviceToHost));
        for (i = 0; i < nq * 2 && untouched; i++) untouched = o[i] == 0x5A;
        CHECK(untouched, "deferred attention with NaN in q wrote its output");
        CHECK(ei_cuda_status(capt) == EI_OK, "the status was not cleared");
        free(o);
    }
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    layer_free(&E); layer_free(&G);
    ei_context_destroy(eager); ei_context_destroy(capt);
    CU(cudaStreamDestroy(st));
    free(q); free(k); free(v);
}

typedef struct observe_call { ei_context *ctx; ei_decoder *dec; const ei_tensor *q; } observe_call;
static ei_result observe_call_run(void *arg) {
    observe_call *a = (observe_call *)arg;
    return ei_decode_observe(a->ctx, a->dec, a->q, 1);
}
typedef struct compact_call { ei_context *ctx; const ei_keep_set *keep; ei_out_tensor *k; } compact_call;
static ei_result compact_call_run(void *arg) {
    compact_call *a = (compact_call *)arg;
    return ei_kv_compact(a->ctx, a->keep, a->k, NULL);
}

/* decode_observe and kv_compact with deferred errors, captured */
static void decode_graph(void) {
    const int nh = 4, nkv = 2, D = 64, n = 200, kept = 100;
    ei_config c = ei_config_default();
    ei_context *ctx = NULL;
    cudaStream_t st;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ei_decoder dec;
    ei_keep_set keep;
    size_t dec_bytes, nq = (size_t)1 * nh * D, nk = (size_t)n * nkv * D, i;
    void *dec_mem, *dq, *dk;
    int32_t *index_h = (int32_t *)malloc((size_t)nkv * kept * 4), *index_d;
    uint16_t *q = (uint16_t *)malloc(nq * 2), *kc = (uint16_t *)malloc(nk * 2), *kc2 = (uint16_t *)malloc(nk * 2);
    ei_tensor tq;
    ei_out_tensor tk;
    ei_result r;
    int h, j;

    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    c.backend = EI_BACKEND_CUDA;
    c.cuda_stream = st;
    c.cuda_deferred_errors = 1;
    CHECK_OK(ei_context_create(&c, &ctx));
    CHECK_OK(ei_decoder_size(ctx, nh, D, &dec_bytes));
    CU(cudaMalloc(&dec_mem, dec_bytes));
    CHECK_OK(ei_decoder_init(ctx, &dec, nh, nkv, D, dec_mem, dec_bytes));
    CU(cudaMalloc(&dq, nq * 2));
    tq = ei_tensor_make(dq, EI_BF16, 1, nh, D);

    /* observe, captured: a good query, then a NaN one replayed */
    fill_bf16(q, nq, 1.f);
    CU(cudaMemcpy(dq, q, nq * 2, cudaMemcpyHostToDevice));
    {
        observe_call oc;
        oc.ctx = ctx; oc.dec = &dec; oc.q = &tq;
        capture(st, observe_call_run, &oc, "decode_observe", &graph);
    }
    CU(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    CU(cudaGraphLaunch(exec, st));
    CU(cudaStreamSynchronize(st));
    r = ei_cuda_status(ctx);
    CHECK(r == EI_OK, "observe replay: %s (%s)", ei_result_name(r), ei_last_error());
    q[2 * D + 5] = 0x7FC0;
    CU(cudaMemcpy(dq, q, nq * 2, cudaMemcpyHostToDevice));
    CU(cudaGraphLaunch(exec, st));
    CU(cudaStreamSynchronize(st));
    r = ei_cuda_status(ctx);
    CHECK(r == EI_ERR_NONFINITE && strstr(ei_last_error(), "decode_observe"), "observe replay with NaN: %s (%s)",
          ei_result_name(r), ei_last_error());
    printf("  observe replay with NaN in q: ei_cuda_status %s: %s\n", ei_result_name(r), ei_last_error());
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));

    /* kv_compact, captured: a good keep set moves rows; a bad one moves nothing */
    for (i = 0; i < nk; i++) kc[i] = f2bf((float)i);
    CU(cudaMalloc(&dk, nk * 2));
    CU(cudaMalloc((void **)&index_d, (size_t)nkv * kept * 4));
    for (h = 0; h < nkv; h++)
        for (j = 0; j < kept; j++) index_h[h * kept + j] = 2 * j;
    CU(cudaMemcpy(index_d, index_h, (size_t)nkv * kept * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dk, kc, nk * 2, cudaMemcpyHostToDevice));
    memset(&keep, 0, sizeof keep);
    keep.heads_out = nkv; keep.capacity = kept; keep.n_kept = kept; keep.n_tokens = n; keep.index = index_d;
    tk = ei_out_tensor_make(dk, EI_BF16, n, nkv, D);
    {
        compact_call cc;
        cc.ctx = ctx; cc.keep = &keep; cc.k = &tk;
        capture(st, compact_call_run, &cc, "kv_compact", &graph);
        CU(cudaMemcpy(dk, kc, nk * 2, cudaMemcpyHostToDevice)); /* a warm-up may have compacted it */
    }
    CU(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    CU(cudaGraphLaunch(exec, st));
    CU(cudaStreamSynchronize(st));
    r = ei_cuda_status(ctx);
    CHECK(r == EI_OK, "compact replay: %s (%s)", ei_result_name(r), ei_last_error());
    CU(cudaMemcpy(kc2, dk, nk * 2, cudaMemcpyDeviceToHost));
    {
        int moved = 1;
        for (j = 0; j < kept && moved; j++)
            for (h = 0; h < nkv; h++)
                if (memcmp(kc2 + ((size_t)j * nkv + h) * D, kc + ((size_t)(2 * j) * nkv + h) * D, (size_t)D * 2)) moved = 0;
        CHECK(moved, "compact replay: rows not where the keep set puts them");
    }
    /* a bad index (not ascending) at [1][40]: nothing moves, the status says so */
    CU(cudaMemcpy(dk, kc, nk * 2, cudaMemcpyHostToDevice));
    index_h[1 * kept + 40] = index_h[1 * kept + 39];
    CU(cudaMemcpy(index_d, index_h, (size_t)nkv * kept * 4, cudaMemcpyHostToDevice));
    CU(cudaGraphLaunch(exec, st));
    CU(cudaStreamSynchronize(st));
    r = ei_cuda_status(ctx);
    CHECK(r == EI_ERR_SHAPE && strstr(ei_last_error(), "[1][40]"), "compact replay with a bad index: %s (%s)",
          ei_result_name(r), ei_last_error());
    printf("  compact replay with a bad keep index: ei_cuda_status %s: %s\n", ei_result_name(r), ei_last_error());
    CU(cudaMemcpy(kc2, dk, nk * 2, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(kc, kc2, nk * 2), "a bad keep set moved rows");
    CHECK(ei_cuda_status(ctx) == EI_OK, "the status was not cleared");
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));

    cudaFree(dec_mem); cudaFree(dq); cudaFree(dk); cudaFree(index_d);
    ei_context_destroy(ctx);
    CU(cudaStreamDestroy(st));
    free(index_h); free(q); free(kc); free(kc2);
}

/* Chunked planning (ei_profile_chunk) in the mode: a chunk captured in a
   graph (it may not synchronise, read back or allocate) and replayed gives
   the plan of the same call on a context without the mode; a final call
   without queries too. The replayed call continues the plan where the
   capture left its host fields (an engine captures each micro-batch's
   position: replaying one chunk of a sequence once, as here). */
typedef struct chunk_arg {
    ei_context *ctx;
    const ei_tensor *q, *k;
    ei_plan *plan;
    int64_t q_pos;
    int is_final;
    void *ws;
    size_t wsb;
} chunk_arg;
static ei_result chunk_call_run(void *arg) {
    chunk_arg *a = (chunk_arg *)arg;
    return ei_profile_chunk(a->ctx, a->q, a->k, a->plan, a->q_pos, a->is_final, a->ws, a->wsb);
}
/* the plan arrays (not the state region: its unused parts are not cleared) and fields, bit for bit */
static int chunk_plans_same(const ei_plan *a, const ei_plan *b) {
    size_t bytes = (size_t)((const char *)a->state - (const char *)a->entropy);
    unsigned char *pa = (unsigned char *)malloc(bytes), *pb = (unsigned char *)malloc(bytes);
    int same;
    CU(cudaMemcpy(pa, a->entropy, bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(pb, b->entropy, bytes, cudaMemcpyDeviceToHost));
    same = !memcmp(pa, pb, bytes) && a->n_tokens == b->n_tokens && a->n_segments == b->n_segments &&
           a->final == b->final;
    free(pa); free(pb);
    return same;
}
static void chunk_graph(void) {
    const int64_t n = 2000;
    const int nh = 8, nkv = 2, D = 64;
    ei_config c = ei_config_default();
    ei_context *eager = NULL, *capt = NULL;
    cudaStream_t st;
    size_t nq = (size_t)n * nh * D, nk = (size_t)n * nkv * D, pbytes, wsb;
    uint16_t *q = (uint16_t *)malloc(nq * 2), *k = (uint16_t *)malloc(nk * 2);
    void *dq, *dk, *pm_e, *pm_g, *ws_e, *ws_g;
    ei_plan pe, pg;
    ei_tensor tk, q0, q1;
    int step;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    c.backend = EI_BACKEND_CUDA;
    c.cuda_stream = st;
    c.base_budget = 256;
    CHECK_OK(ei_context_create(&c, &eager));
    c.cuda_deferred_errors = 1;
    CHECK_OK(ei_context_create(&c, &capt));
    fill_bf16(q, nq, 1.f); fill_bf16(k, nk, 1.f);
    CU(cudaMalloc(&dq, nq * 2)); CU(cudaMalloc(&dk, nk * 2));
    CU(cudaMemcpy(dq, q, nq * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dk, k, nk * 2, cudaMemcpyHostToDevice));
    tk = ei_tensor_make(dk, EI_BF16, n, nkv, D);
    q0 = ei_tensor_make(dq, EI_BF16, 700, nh, D);
    q1 = ei_tensor_make((const uint16_t *)dq + (size_t)700 * nh * D, EI_BF16, 600, nh, D);
    CHECK_OK(ei_plan_size(eager, n, nkv, D, EI_PLAN_CHUNKED, &pbytes));
    CHECK_OK(ei_profile_workspace_size(eager, n, nh, nkv, D, &wsb));
    CU(cudaMalloc(&pm_e, pbytes)); CU(cudaMalloc(&pm_g, pbytes));
    CU(cudaMalloc(&ws_e, wsb)); CU(cudaMalloc(&ws_g, wsb));
    CHECK_OK(ei_plan_init(eager, &pe, n, nkv, D, EI_PLAN_CHUNKED, pm_e, pbytes));
    CHECK_OK(ei_plan_init(capt, &pg, n, nkv, D, EI_PLAN_CHUNKED, pm_g, pbytes));
    /* the first chunk eagerly on both (the mode outside a graph) */
    CHECK_OK(ei_profile_chunk(eager, &q0, &tk, &pe, 0, 0, ws_e, wsb));
    CHECK_OK(ei_profile_chunk(capt, &q0, &tk, &pg, 0, 0, ws_g, wsb));
    CU(cudaStreamSynchronize(st));
    CHECK_OK(ei_cuda_status(capt));
    for (step = 0; step < 2; step++) { /* the next chunk, then a final call without queries, captured */
        chunk_arg a;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        size_t n_nodes = 0;
        ei_result r;
        int same;
        a.ctx = capt; a.q = step ? NULL : &q1; a.k = &tk; a.plan = &pg; a.q_pos = step ? 1300 : 700;
        a.is_final = step; a.ws = ws_g; a.wsb = wsb;
        capture(st, chunk_call_run, &a, step ? "final chunk call without queries" : "chunk [700, 1300)", &graph);
        CU(cudaGraphGetNodes(graph, NULL, &n_nodes));
        CU(cudaGraphInstantiateWithFlags(&exec, graph, 0));
        CU(cudaGraphLaunch(exec, st));
        CU(cudaStreamSynchronize(st));
        r = ei_cuda_status(capt);
        CHECK(r == EI_OK, "chunk replay %d: status %s (%s)", step, ei_result_name(r), ei_last_error());
        CHECK_OK(ei_profile_chunk(eager, step ? NULL : &q1, &tk, &pe, a.q_pos, step, ws_e, wsb));
        same = chunk_plans_same(&pg, &pe);
        CHECK(same, "chunk replay %d: the plan differs from the eager call's", step);
        printf("  captured %s (%d nodes), replayed: plan %s the eager call's\n",
               step ? "a final call without queries" : "a chunk of 600 queries", (int)n_nodes,
               same ? "equals bit for bit" : "DIFFERS from");
        CU(cudaGraphExecDestroy(exec));
        CU(cudaGraphDestroy(graph));
    }
    cudaFree(dq); cudaFree(dk); cudaFree(pm_e); cudaFree(pm_g); cudaFree(ws_e); cudaFree(ws_g);
    ei_context_destroy(eager); ei_context_destroy(capt);
    CU(cudaStreamDestroy(st));
    free(q); free(k);
}

int main(void) {
    ei_config c = ei_config_default();
    ei_context *cpu = NULL, *bad = NULL;
    printf("test_cuda_graph\n");
    CHECK_OK(ei_context_create(&c, &cpu));
    CHECK(ei_cuda_status(cpu) == EI_OK, "ei_cuda_status on the CPU");
    ei_context_destroy(cpu);
    c.cuda_deferred_errors = 2;
    CHECK(ei_context_create(&c, &bad) == EI_ERR_CONFIG && !bad, "cuda_deferred_errors 2 accepted");
    printf("prefill layer in a CUDA graph (cuda_deferred_errors):\n");
    prefill_graph();
    printf("decode observe + compaction in CUDA graphs:\n");
    decode_graph();
    printf("chunked planning in CUDA graphs:\n");
    chunk_graph();
    printf("%s: %d checks, %d failed\n", failures ? "FAILED" : "PASSED", checks, failures);
    return failures ? 1 : 0;
}
