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
     queries, captured and replayed, equal the same calls without the mode;
   - decode keep sets: ei_decode_observe + ei_decode_keep (no row map, a row
     map per kv head, one map for every head: rows out of position order and
     empty rows), ei_decode_score + ei_decode_select (with and without maps),
     a shared set (score + shared_add of two layers, select_shared) and
     select_shared alone, captured (kernel and memset nodes only) and
     replayed with new k and q: keep sets (index, positions, mask, pooled,
     n_kept, compressed, n_tokens), scores and shared scores equal the
     waiting calls' bit for bit;
   - their deferred faults (a row_pos value < -1, two rows of one position,
     fewer positions than the window, a window not consecutive, maps of
     different counts, NaN/Inf in k, a non-finite shared score): the replay
     records, ei_cuda_status returns the waiting call's code and message
     (after "(deferred): ") naming the entry, once, and the next clean replay
     equals the waiting call again; a row map of fewer positions than
     decode_budget (the waiting call keeps them all) is EI_ERR_UNSUPPORTED
     there, and fewer rows than decode_budget is refused at call time. */
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
    {
        ei_sizes z = layer_sizes(ctx, n, nh, nkv, D, 0, 1);
        L->plan_bytes = z.plan;
        L->pws_bytes = z.profile;
        L->aws_bytes = z.prefill;
    }
    CU(cudaMalloc(&L->plan_mem, L->plan_bytes));
    CHECK_OK(ei_plan_init(ctx, &L->plan, n, nkv, D, 0, L->plan_mem, L->plan_bytes));
    CU(cudaMalloc(&L->pws, L->pws_bytes));
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
    ei_exec px = ex(1, L->pws, L->pws_bytes), ax = ex(1, L->aws, L->aws_bytes);
    ei_result r = ei_profile(ctx, &px, &L->tq, &L->tk, &L->plan);
    if (r != EI_OK) return r;
    return ei_attention_prefill(ctx, &ax, &L->tq, &L->tk, &L->tv, &L->plan, &L->to, 0);
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
        r = ei_attention_prefill(capt, NULL, &G.tq, &G.tk, &G.tv, &G.plan, &G.to, 0);
        CHECK(r == EI_ERR_NULL, "deferred attention without its workspace: %s", ei_result_name(r));
    }
    { /* attention's own report (dense, eager, deferred): NaN in q, nothing written */
        unsigned char *o = (unsigned char *)malloc(nq * 2);
        int untouched = 1;
        q[(size_t)2500 * nh * D + 3 * D + 17] = 0x7FC0;
        layer_put(&G, q, k, v);
        CU(cudaMemset(G.out, 0x5A, nq * 2));
        ei_exec ax = ex(1, G.aws, G.aws_bytes);
        CHECK_OK(ei_attention_prefill(capt, &ax, &G.tq, &G.tk, &G.tv, NULL, &G.to, 0));
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
    return ei_decode_observe(a->ctx, a->dec, a->q, a->dec->position_end, 1);
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
    dec_bytes = layer_sizes(ctx, n, nh, nkv, D, 0, 1).decoder;
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
    ei_exec x = ex(1, a->ws, a->wsb);
    return ei_profile_chunk(a->ctx, &x, a->q, a->k, a->plan, a->q_pos, a->is_final);
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
    ei_exec xe, xg;
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
    {
        ei_sizes z = layer_sizes(eager, n, nh, nkv, D, EI_PLAN_CHUNKED, 1);
        pbytes = z.plan;
        wsb = z.profile;
    }
    CU(cudaMalloc(&pm_e, pbytes)); CU(cudaMalloc(&pm_g, pbytes));
    CU(cudaMalloc(&ws_e, wsb)); CU(cudaMalloc(&ws_g, wsb));
    CHECK_OK(ei_plan_init(eager, &pe, n, nkv, D, EI_PLAN_CHUNKED, pm_e, pbytes));
    CHECK_OK(ei_plan_init(capt, &pg, n, nkv, D, EI_PLAN_CHUNKED, pm_g, pbytes));
    /* the first chunk eagerly on both (the mode outside a graph) */
    xe = ex(1, ws_e, wsb);
    xg = ex(1, ws_g, wsb);
    CHECK_OK(ei_profile_chunk(eager, &xe, &q0, &tk, &pe, 0, 0));
    CHECK_OK(ei_profile_chunk(capt, &xg, &q0, &tk, &pg, 0, 0));
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
        CHECK_OK(ei_profile_chunk(eager, &xe, step ? NULL : &q1, &tk, &pe, a.q_pos, step));
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

/* ------------------------------------------------------------ decode keep sets in graphs
   The decode calls that fill keep sets (ei_decode_keep, score + select, a
   shared set over layers), captured with cuda_deferred_errors and replayed,
   against the same calls on a context without the mode (same stream); row
   maps with empty rows (-1) and rows out of position order. */
#define DG_NH 8
#define DG_NKV 2
#define DG_D 64
#define DG_N 256    /* cache rows */
#define DG_P 40     /* prompt queries observed */
#define DG_W 16     /* cfg.window */
#define DG_BUDGET 96

/* D2D on st (a plain cudaMemcpy D2D is not ordered with a non-blocking stream) */
static void d2d(void *dst, const void *src, size_t bytes, cudaStream_t st) {
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
    CU(cudaStreamSynchronize(st));
}
static void h2d(void *dst, const void *src, size_t bytes, cudaStream_t st) {
    CU(cudaStreamSynchronize(st));
    CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

/* the kernels, memsets and other nodes of a graph */
static void graph_count(cudaGraph_t graph, int *kernels, int *memsets, int *others) {
    size_t n_nodes = 0, i;
    cudaGraphNode_t *nodes;
    *kernels = *memsets = *others = 0;
    CU(cudaGraphGetNodes(graph, NULL, &n_nodes));
    nodes = (cudaGraphNode_t *)malloc((n_nodes ? n_nodes : 1) * sizeof *nodes);
    CU(cudaGraphGetNodes(graph, nodes, &n_nodes));
    for (i = 0; i < n_nodes; i++) {
        enum cudaGraphNodeType t;
        CU(cudaGraphNodeGetType(nodes[i], &t));
        if (t == cudaGraphNodeTypeKernel) (*kernels)++;
        else if (t == cudaGraphNodeTypeMemset) (*memsets)++;
        else (*others)++;
    }
    free(nodes);
}

/* A keep set in device memory with every optional output (index, positions,
   mask, pooled), cleared before each call so that both runs write the same. */
typedef struct dkeep {
    ei_keep_set ks;
    int heads, cap;
} dkeep;
static void dkeep_make(dkeep *d, int heads, int cap, const int32_t *row_pos, int64_t stride) {
    memset(d, 0, sizeof *d);
    d->heads = heads; d->cap = cap;
    CU(cudaMalloc((void **)&d->ks.index, (size_t)heads * cap * 4));
    CU(cudaMalloc((void **)&d->ks.positions, (size_t)heads * cap * 4));
    CU(cudaMalloc((void **)&d->ks.mask, (size_t)heads * DG_N));
    CU(cudaMalloc((void **)&d->ks.pooled, (size_t)heads * DG_N * 4));
    d->ks.heads_out = heads; d->ks.capacity = cap;
    d->ks.mask_capacity = DG_N; d->ks.pooled_capacity = DG_N;
    d->ks.row_pos = row_pos; d->ks.row_pos_stride = stride;
}
static void dkeep_clear(dkeep *d, cudaStream_t st) {
    CU(cudaStreamSynchronize(st));
    CU(cudaMemset(d->ks.index, 0, (size_t)d->heads * d->cap * 4));
    CU(cudaMemset(d->ks.positions, 0, (size_t)d->heads * d->cap * 4));
    CU(cudaMemset(d->ks.mask, 0, (size_t)d->heads * DG_N));
    CU(cudaMemset(d->ks.pooled, 0, (size_t)d->heads * DG_N * 4));
    CU(cudaDeviceSynchronize());
    d->ks.n_kept = -1; d->ks.compressed = -1; d->ks.n_tokens = -1;
}
static void dkeep_free(dkeep *d) {
    cudaFree(d->ks.index); cudaFree(d->ks.positions); cudaFree(d->ks.mask); cudaFree(d->ks.pooled);
}
static int dev_same(const void *a, const void *b, size_t bytes) {
    unsigned char *ha = (unsigned char *)malloc(bytes), *hb = (unsigned char *)malloc(bytes);
    int same;
    CU(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost));
    same = !memcmp(ha, hb, bytes);
    free(ha); free(hb);
    return same;
}
/* every array and host field of two keep sets, bit for bit */
static int dkeep_same(const dkeep *a, const dkeep *b) {
    size_t hc = (size_t)a->heads * a->cap;
    return a->ks.n_kept == b->ks.n_kept && a->ks.compressed == b->ks.compressed && a->ks.n_tokens == b->ks.n_tokens &&
           dev_same(a->ks.index, b->ks.index, hc * 4) && dev_same(a->ks.positions, b->ks.positions, hc * 4) &&
           dev_same(a->ks.mask, b->ks.mask, (size_t)a->heads * DG_N) &&
           dev_same(a->ks.pooled, b->ks.pooled, (size_t)a->heads * DG_N * 4);
}

/* rows 0..n-1 of a map: np positions first_pos.. on rows in random order, the others -1 */
static void map_make(int32_t *rp, int64_t n, int64_t np, int32_t first_pos) {
    int32_t perm[DG_N];
    int64_t i;
    for (i = 0; i < n; i++) perm[i] = (int32_t)i;
    for (i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)((urand_pm() + 1.f) * 0.5f * (float)(i + 1));
        int32_t t;
        if (j > i) j = i;
        t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    for (i = 0; i < n; i++) rp[i] = -1;
    for (i = 0; i < np; i++) rp[perm[i]] = first_pos + (int32_t)i;
}

/* After a replay: ei_cuda_status says what the waiting call said (want, its
   message want_msg), naming the entry; then it is cleared. */
static void expect_status(ei_context *capt, ei_result want, const char *want_msg, const char *entry, const char *what) {
    char msg[600];
    const char *dt, *et;
    ei_result r = ei_cuda_status(capt);
    int same;
    snprintf(msg, sizeof msg, "%s", r == EI_OK ? "" : ei_last_error());
    dt = strstr(msg, "(deferred): ");
    et = strstr(want_msg, entry); /* "EI_ERR_...: CUDA <entry>: <what>" */
    et = et ? strchr(et, ':') : NULL;
    same = dt && et && !strcmp(dt + 12, et + 2);
    CHECK(r == want && same && strstr(msg, entry), "%s: ei_cuda_status %s (%s); the waiting call %s (%s)", what,
          ei_result_name(r), msg, ei_result_name(want), want_msg);
    printf("  %s: ei_cuda_status %s: %s\n", what, ei_result_name(r), msg);
    r = ei_cuda_status(capt);
    CHECK(r == EI_OK, "%s: the status was not cleared (%s)", what, ei_result_name(r));
}

/* the shared state of a decode scenario: an eager context and one in the mode, one stream */
typedef struct dscene {
    cudaStream_t st;
    ei_context *eager, *capt;
    size_t dec_bytes, ws_bytes;
} dscene;
static void dscene_make(dscene *s, int per_kv_head) {
    ei_config c = ei_config_default();
    memset(s, 0, sizeof *s);
    CU(cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking));
    c.backend = EI_BACKEND_CUDA;
    c.cuda_stream = s->st;
    c.window = DG_W;
    c.decode_budget = DG_BUDGET;
    c.per_kv_head = per_kv_head;
    CHECK_OK(ei_context_create(&c, &s->eager));
    c.cuda_deferred_errors = 1;
    CHECK_OK(ei_context_create(&c, &s->capt));
    {
        ei_sizes z = layer_sizes(s->eager, DG_N, DG_NH, DG_NKV, DG_D, 0, 1);
        s->dec_bytes = z.decoder;
        s->ws_bytes = z.decode_keep;
    }
}
static void dscene_free(dscene *s) {
    ei_context_destroy(s->eager); ei_context_destroy(s->capt);
    CU(cudaStreamDestroy(s->st));
}
static void dec_make(const dscene *s, ei_context *ctx, ei_decoder *dec, void **mem) {
    CU(cudaMalloc(mem, s->dec_bytes));
    CHECK_OK(ei_decoder_init(ctx, dec, DG_NH, DG_NKV, DG_D, *mem, s->dec_bytes));
}
/* eager's decoder := the graph's ring and counters (before its replay) */
static void dec_sync(ei_decoder *eager, const ei_decoder *graph, const void *ring, int64_t observed, cudaStream_t st) {
    size_t ring_bytes = (size_t)DG_W * DG_NH * DG_D * 4;
    d2d(eager->queries, ring, ring_bytes, st);
    eager->n_observed = observed;
    eager->position_end = DG_N - DG_P - 1 + observed; /* the prompt observed from position DG_N - DG_P - 1 */
    eager->n_generated = 0;
    eager->last_compress = -1;
    (void)graph;
}

/* (a)/(b): ei_decode_observe of a generated query + ei_decode_keep, captured */
typedef struct keep_call {
    ei_context *ctx;
    ei_decoder *dec;
    const ei_tensor *q, *k;
    ei_keep_set *keep;
    void *ws;
    size_t wsb;
} keep_call;
static ei_result keep_call_run(void *arg) {
    keep_call *a = (keep_call *)arg;
    ei_exec x = ex(1, a->ws, a->wsb);
    ei_result r = ei_decode_observe(a->ctx, a->dec, a->q, a->dec->position_end, 1);
    if (r != EI_OK) return r;
    return ei_decode_keep(a->ctx, &x, a->dec, a->k, a->keep);
}

/* maps: 0 none, 1 one per kv head (stride DG_N), 2 one for every kv head */
static void keep_graph(int maps) {
    const char *name = maps == 0 ? "observe + keep, no row map" : maps == 1 ? "observe + keep, a row map per kv head"
                                                                            : "observe + keep, one row map";
    dscene s;
    ei_decoder dE, dG;
    void *mE, *mG, *ring, *wsE, *wsG, *dk, *dqp, *dqg;
    ei_exec xE, xG;
    int32_t *rp_h = (int32_t *)malloc((size_t)DG_NKV * DG_N * 4), *rp_d = NULL;
    size_t nk = (size_t)DG_N * DG_NKV * DG_D, nqp = (size_t)DG_P * DG_NH * DG_D, nqg = (size_t)DG_NH * DG_D;
    uint16_t *k = (uint16_t *)malloc(nk * 2), *qp = (uint16_t *)malloc(nqp * 2), *qg = (uint16_t *)malloc(nqg * 2);
    ei_tensor tk, tqp, tqg;
    dkeep kE, kG;
    keep_call kc;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int kernels, memsets, others, rep, m;
    int32_t cap_n_kept, cap_compressed;
    int64_t n0, cap_n_tokens;
    ei_result r;

    dscene_make(&s, 1);
    dec_make(&s, s.eager, &dE, &mE);
    dec_make(&s, s.capt, &dG, &mG);
    CU(cudaMalloc(&ring, (size_t)DG_W * DG_NH * DG_D * 4));
    CU(cudaMalloc(&wsE, s.ws_bytes)); CU(cudaMalloc(&wsG, s.ws_bytes));
    xE = ex(1, wsE, s.ws_bytes);
    xG = ex(1, wsG, s.ws_bytes);
    CU(cudaMalloc(&dk, nk * 2)); CU(cudaMalloc(&dqp, nqp * 2)); CU(cudaMalloc(&dqg, nqg * 2));
    tk = ei_tensor_make(dk, EI_BF16, DG_N, DG_NKV, DG_D);
    tqp = ei_tensor_make(dqp, EI_BF16, DG_P, DG_NH, DG_D);
    tqg = ei_tensor_make(dqg, EI_BF16, 1, DG_NH, DG_D);
    if (maps) {
        CU(cudaMalloc((void **)&rp_d, (size_t)DG_NKV * DG_N * 4));
        for (m = 0; m < DG_NKV; m++) map_make(rp_h + m * DG_N, DG_N, 220, 0);
        h2d(rp_d, rp_h, (size_t)DG_NKV * DG_N * 4, s.st);
    }
    dkeep_make(&kE, DG_NKV, DG_BUDGET, rp_d, maps == 1 ? DG_N : 0);
    dkeep_make(&kG, DG_NKV, DG_BUDGET, rp_d, maps == 1 ? DG_N : 0);

    /* the prompt, observed eagerly in the mode; its ring kept for every replay */
    fill_bf16(qp, nqp, 1.f);
    h2d(dqp, qp, nqp * 2, s.st);
    CHECK_OK(ei_decode_observe(s.capt, &dG, &tqp, DG_N - DG_P - 1, 0));
    d2d(ring, dG.queries, (size_t)DG_W * DG_NH * DG_D * 4, s.st);
    fill_bf16(k, nk, 1.f); fill_bf16(qg, nqg, 1.f);
    h2d(dk, k, nk * 2, s.st); h2d(dqg, qg, nqg * 2, s.st);

    kc.ctx = s.capt; kc.dec = &dG; kc.q = &tqg; kc.k = &tk; kc.keep = &kG.ks; kc.ws = wsG; kc.wsb = s.ws_bytes;
    capture(s.st, keep_call_run, &kc, name, &graph);
    graph_count(graph, &kernels, &memsets, &others);
    printf("  %s: captured, %d kernels, %d memsets, %d other nodes; keep set n_kept %d, compressed %d\n", name, kernels,
           memsets, others, (int)kG.ks.n_kept, (int)kG.ks.compressed);
    CHECK(others == 0 && kernels > 0, "%s: %d nodes that are neither kernels nor memsets", name, others);
    CU(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    n0 = dG.n_observed - 1; /* the observed count the captured calls saw */
    cap_n_kept = kG.ks.n_kept; cap_compressed = kG.ks.compressed; cap_n_tokens = kG.ks.n_tokens;
    CHECK(cap_n_kept == DG_BUDGET && cap_compressed == 1 && cap_n_tokens == DG_N,
          "%s: the captured call's counts: n_kept %d, compressed %d, n_tokens %lld", name, (int)cap_n_kept,
          (int)cap_compressed, (long long)cap_n_tokens);

    /* replays: clean ones with new k and q, each after a bad one (maps == 1:
       every row-map fault; else NaN in k), compared with the waiting calls */
    for (rep = 0; rep < (maps == 1 ? 14 : maps == 0 ? 4 : 2); rep++) {
        int fault = rep % 2 == 1 ? (maps == 1 ? 1 + rep / 2 : maps == 0 ? 7 : 0) : 0;
        const char *fname = "";
        int32_t *rp = (int32_t *)malloc((size_t)DG_NKV * DG_N * 4);
        ei_result re;
        char emsg[600];
        fill_bf16(k, nk, 1.f); fill_bf16(qg, nqg, 1.f + 0.25f * (float)rep);
        if (maps) memcpy(rp, rp_h, (size_t)DG_NKV * DG_N * 4);
        switch (fault) {
        case 1: { /* a value < -1 in map 1 */
            rp[DG_N + 7] = -5; fname = "row_pos value -5"; break; }
        case 2: { /* a row without a position of map 1 takes one another row holds */
            int j = 0;
            while (rp[DG_N + j] != -1) j++;
            rp[DG_N + j] = 50; fname = "two rows of one position"; break; }
        case 3: { /* map 1 holds 10 positions, fewer than the window */
            map_make(rp + DG_N, DG_N, 10, 0); fname = "fewer positions than the window"; break; }
        case 4: { /* map 1 lacks position 216: the newest 16 are not consecutive */
            int j;
            for (j = 0; j < DG_N; j++) if (rp[DG_N + j] == 216) rp[DG_N + j] = -1;
            fname = "window positions not consecutive"; break; }
        case 5: { /* map 1 holds 200 positions, map 0 220 */
            map_make(rp + DG_N, DG_N, 200, 0); fname = "maps of different counts"; break; }
        case 6: { /* both maps hold 60 positions: fewer than decode_budget (the waiting call keeps them all) */
            map_make(rp, DG_N, 60, 0); map_make(rp + DG_N, DG_N, 60, 0); fname = "fewer positions than decode_budget"; break; }
        case 7: { /* NaN in k: kv head 1, row 100 (or the first row of map 1 that holds a position) */
            int j = 100;
            if (maps) for (j = 0; rp[DG_N + j] < 0; j++) {}
            k[((size_t)j * DG_NKV + 1) * DG_D + 9] = 0x7FC0; fname = "NaN in k"; break; }
        default: break;
        }
        if (maps) h2d(rp_d, rp, (size_t)DG_NKV * DG_N * 4, s.st);
        h2d(dk, k, nk * 2, s.st); h2d(dqg, qg, nqg * 2, s.st);
        /* the replay, from the prompt's ring */
        d2d(dG.queries, ring, (size_t)DG_W * DG_NH * DG_D * 4, s.st);
        dkeep_clear(&kG, s.st);
        CU(cudaGraphLaunch(exec, s.st));
        CU(cudaStreamSynchronize(s.st));
        /* the waiting calls on the same inputs */
        dec_sync(&dE, &dG, ring, n0, s.st);
        dkeep_clear(&kE, s.st);
        re = ei_decode_observe(s.eager, &dE, &tqg, dE.position_end, 1);
        if (re == EI_OK) re = ei_decode_keep(s.eager, &xE, &dE, &tk, &kE.ks);
        snprintf(emsg, sizeof emsg, "%s", re == EI_OK ? "" : ei_last_error());
        if (!fault) {
            int same;
            r = ei_cuda_status(s.capt);
            CHECK(r == EI_OK, "%s, replay %d: status %s (%s)", name, rep, ei_result_name(r), ei_last_error());
            CHECK(re == EI_OK, "%s, replay %d: the waiting call: %s (%s)", name, rep, ei_result_name(re), emsg);
            kG.ks.n_kept = cap_n_kept; kG.ks.compressed = cap_compressed; kG.ks.n_tokens = cap_n_tokens;
            same = dkeep_same(&kG, &kE);
            CHECK(same, "%s, replay %d: the keep set differs from the waiting call's", name, rep);
            printf("  %s, replay %d: keep set (n_kept %d) %s the waiting call's\n", name, rep, (int)kE.ks.n_kept,
                   same ? "equals bit for bit" : "DIFFERS from");
        } else if (fault == 6) { /* the waiting call keeps every position; the mode cannot tell the host */
            char what[600];
            r = ei_cuda_status(s.capt);
            snprintf(what, sizeof what, "%s", r == EI_OK ? "" : ei_last_error());
            CHECK(re == EI_OK && kE.ks.n_kept == 60 && kE.ks.compressed == 0, "%s: the waiting call %s, n_kept %d",
                  fname, ei_result_name(re), (int)kE.ks.n_kept);
            CHECK(r == EI_ERR_UNSUPPORTED && strstr(what, "decode_budget") && strstr(what, "holds 60"),
                  "%s: ei_cuda_status %s (%s)", fname, ei_result_name(r), what);
            printf("  %s: the waiting call keeps all 60; ei_cuda_status %s: %s\n", fname, ei_result_name(r), what);
            CHECK(ei_cuda_status(s.capt) == EI_OK, "%s: the status was not cleared", fname);
        } else {
            char what[600];
            snprintf(what, sizeof what, "%s, replay %d, %s", name, rep, fname);
            CHECK(re != EI_OK, "%s: the waiting call returned EI_OK", what);
            expect_status(s.capt, re, emsg, "decode_keep", what);
        }
        free(rp);
    }
    if (maps) { /* fewer rows than decode_budget with a row map: refused at call time in the mode */
        ei_tensor tk80 = ei_tensor_make(dk, EI_BF16, 80, DG_NKV, DG_D);
        r = ei_decode_keep(s.capt, &xG, &dG, &tk80, &kG.ks);
        CHECK(r == EI_ERR_UNSUPPORTED && strstr(ei_last_error(), "decode_budget"),
              "keep with a row map over 80 < decode_budget rows in the mode: %s (%s)", ei_result_name(r), ei_last_error());
        printf("  %s, 80 rows < decode_budget: %s at call time: %s\n", name, ei_result_name(r), ei_last_error());
        CHECK(ei_cuda_status(s.capt) == EI_OK, "a call-time refusal recorded a report");
    }
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    dkeep_free(&kE); dkeep_free(&kG);
    cudaFree(mE); cudaFree(mG); cudaFree(ring); cudaFree(wsE); cudaFree(wsG); cudaFree(dk); cudaFree(dqp); cudaFree(dqg);
    if (rp_d) cudaFree(rp_d);
    dscene_free(&s);
    free(rp_h); free(k); free(qp); free(qg);
}

/* (c): ei_decode_score + ei_decode_select, captured */
typedef struct select_call {
    ei_context *ctx;
    ei_decoder *dec;
    const ei_tensor *k;
    const int32_t *rp;
    int64_t stride;
    float *scores;
    ei_keep_set *keep;
    void *ws;
    size_t wsb;
} select_call;
static ei_result select_call_run(void *arg) {
    select_call *a = (select_call *)arg;
    ei_exec x = ex(1, a->ws, a->wsb);
    ei_result r = ei_decode_score(a->ctx, &x, a->dec, a->k, a->rp, a->stride, a->scores);
    if (r != EI_OK) return r;
    return ei_decode_select(a->ctx, &x, a->dec, a->scores, a->k->n_tokens, a->keep);
}
static void score_select_graph(int maps) {
    const char *name = maps ? "score + select, a row map per kv head" : "score + select, no row map";
    dscene s;
    ei_decoder dE, dG;
    void *mE, *mG, *wsE, *wsG, *dk, *dqp;
    ei_exec xE;
    float *scE, *scG;
    int32_t *rp_h = (int32_t *)malloc((size_t)DG_NKV * DG_N * 4), *rp = (int32_t *)malloc((size_t)DG_NKV * DG_N * 4),
            *rp_d = NULL;
    size_t nk = (size_t)DG_N * DG_NKV * DG_D, nqp = (size_t)DG_P * DG_NH * DG_D, nsc = (size_t)DG_NH * DG_N;
    uint16_t *k = (uint16_t *)malloc(nk * 2), *qp = (uint16_t *)malloc(nqp * 2);
    ei_tensor tk, tqp;
    dkeep kE, kG;
    select_call sc;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int kernels, memsets, others, rep, m;
    int32_t cap_n_kept, cap_compressed;
    int64_t cap_n_tokens;
    ei_result r;

    dscene_make(&s, 1);
    dec_make(&s, s.eager, &dE, &mE);
    dec_make(&s, s.capt, &dG, &mG);
    CU(cudaMalloc(&wsE, s.ws_bytes)); CU(cudaMalloc(&wsG, s.ws_bytes));
    xE = ex(1, wsE, s.ws_bytes);
    CU(cudaMalloc(&dk, nk * 2)); CU(cudaMalloc(&dqp, nqp * 2));
    CU(cudaMalloc((void **)&scE, nsc * 4)); CU(cudaMalloc((void **)&scG, nsc * 4));
    tk = ei_tensor_make(dk, EI_BF16, DG_N, DG_NKV, DG_D);
    tqp = ei_tensor_make(dqp, EI_BF16, DG_P, DG_NH, DG_D);
    if (maps) {
        CU(cudaMalloc((void **)&rp_d, (size_t)DG_NKV * DG_N * 4));
        for (m = 0; m < DG_NKV; m++) map_make(rp_h + m * DG_N, DG_N, 230, 0);
        h2d(rp_d, rp_h, (size_t)DG_NKV * DG_N * 4, s.st);
    }
    dkeep_make(&kE, DG_NKV, DG_BUDGET, rp_d, maps ? DG_N : 0);
    dkeep_make(&kG, DG_NKV, DG_BUDGET, rp_d, maps ? DG_N : 0);
    fill_bf16(qp, nqp, 1.f);
    h2d(dqp, qp, nqp * 2, s.st);
    CHECK_OK(ei_decode_observe(s.eager, &dE, &tqp, DG_N - DG_P, 0));
    CHECK_OK(ei_decode_observe(s.capt, &dG, &tqp, DG_N - DG_P, 0));
    fill_bf16(k, nk, 1.f);
    h2d(dk, k, nk * 2, s.st);

    sc.ctx = s.capt; sc.dec = &dG; sc.k = &tk; sc.rp = rp_d; sc.stride = maps ? DG_N : 0; sc.scores = scG;
    sc.keep = &kG.ks; sc.ws = wsG; sc.wsb = s.ws_bytes;
    capture(s.st, select_call_run, &sc, name, &graph);
    graph_count(graph, &kernels, &memsets, &others);
    printf("  %s: captured, %d kernels, %d memsets, %d other nodes\n", name, kernels, memsets, others);
    CHECK(others == 0 && kernels > 0, "%s: %d nodes that are neither kernels nor memsets", name, others);
    CU(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    cap_n_kept = kG.ks.n_kept; cap_compressed = kG.ks.compressed; cap_n_tokens = kG.ks.n_tokens;

    for (rep = 0; rep < 6; rep++) { /* faults: NaN in k; a duplicate position; maps of different counts */
        int fault = rep % 2 ? 1 + rep / 2 : 0;
        const char *fname = "", *entry = "decode_score";
        ei_result re;
        char emsg[600];
        if (!maps && fault > 1) continue;
        fill_bf16(k, nk, 1.f + 0.25f * (float)rep);
        memcpy(rp, rp_h, (size_t)DG_NKV * DG_N * 4);
        if (fault == 1) {
            int j = 77;
            if (maps) for (j = 0; rp[j] < 0; j++) {}
            k[((size_t)j * DG_NKV + 0) * DG_D + 3] = 0x7F80; /* +Inf, kv head 0 */
            fname = "Inf in k";
        } else if (fault == 2) {
            int j = 0;
            while (rp[j] != -1) j++;
            rp[j] = 3;
            fname = "two rows of one position";
        } else if (fault == 3) {
            map_make(rp + DG_N, DG_N, 210, 0);
            fname = "maps of different counts";
            entry = "decode_select";
        }
        h2d(dk, k, nk * 2, s.st);
        if (maps) h2d(rp_d, rp, (size_t)DG_NKV * DG_N * 4, s.st);
        dkeep_clear(&kG, s.st);
        CU(cudaMemset(scG, 0x5A, nsc * 4));
        CU(cudaGraphLaunch(exec, s.st));
        CU(cudaStreamSynchronize(s.st));
        dkeep_clear(&kE, s.st);
        CU(cudaMemset(scE, 0x33, nsc * 4));
        dE.last_compress = -1;
        re = ei_decode_score(s.eager, &xE, &dE, &tk, rp_d, maps ? DG_N : 0, scE);
        if (re == EI_OK) re = ei_decode_select(s.eager, &xE, &dE, scE, DG_N, &kE.ks);
        snprintf(emsg, sizeof emsg, "%s", re == EI_OK ? "" : ei_last_error());
        if (!fault) {
            int same_scores, same_keep;
            r = ei_cuda_status(s.capt);
            CHECK(r == EI_OK, "%s, replay %d: status %s (%s)", name, rep, ei_result_name(r), ei_last_error());
            CHECK(re == EI_OK, "%s, replay %d: the waiting calls: %s (%s)", name, rep, ei_result_name(re), emsg);
            kG.ks.n_kept = cap_n_kept; kG.ks.compressed = cap_compressed; kG.ks.n_tokens = cap_n_tokens;
            same_scores = dev_same(scG, scE, nsc * 4);
            same_keep = dkeep_same(&kG, &kE);
            CHECK(same_scores && same_keep, "%s, replay %d: scores %s, keep set %s", name, rep,
                  same_scores ? "equal" : "DIFFER", same_keep ? "equal" : "DIFFERS");
            printf("  %s, replay %d: scores and keep set (n_kept %d) %s the waiting calls'\n", name, rep,
                   (int)kE.ks.n_kept, same_scores && same_keep ? "equal bit for bit" : "DIFFER from");
        } else {
            char what[600];
            snprintf(what, sizeof what, "%s, replay %d, %s", name, rep, fname);
            CHECK(re != EI_OK, "%s: the waiting calls returned EI_OK", what);
            expect_status(s.capt, re, emsg, entry, what);
        }
    }
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    dkeep_free(&kE); dkeep_free(&kG);
    cudaFree(mE); cudaFree(mG); cudaFree(wsE); cudaFree(wsG); cudaFree(dk); cudaFree(dqp); cudaFree(scE); cudaFree(scG);
    if (rp_d) cudaFree(rp_d);
    dscene_free(&s);
    free(rp_h); free(rp); free(k); free(qp);
}

/* (d): a shared keep set: score + shared_add of two layers, select_shared, captured */
typedef struct shared_call {
    ei_context *ctx;
    ei_decoder *dec[2];
    const ei_tensor *k[2];
    const int32_t *rp;
    float *scores, *shared;
    ei_keep_set *keep;
    void *ws;
    size_t wsb;
    cudaStream_t st;
} shared_call;
static ei_result shared_call_run(void *arg) {
    shared_call *a = (shared_call *)arg;
    ei_exec x = ex(1, a->ws, a->wsb);
    ei_result r;
    int layer;
    if (cudaMemsetAsync(a->shared, 0, (size_t)DG_N * 4, a->st) != cudaSuccess) return EI_ERR_BACKEND;
    for (layer = 0; layer < 2; layer++) {
        r = ei_decode_score(a->ctx, &x, a->dec[layer], a->k[layer], a->rp, 0, a->scores);
        if (r == EI_OK) r = ei_decode_shared_add(a->ctx, &x, a->dec[layer], a->scores, DG_N, a->rp, a->shared);
        if (r != EI_OK) return r;
    }
    return ei_decode_select_shared(a->ctx, &x, a->dec[1], a->shared, DG_N, a->keep);
}
typedef struct select_shared_call {
    ei_context *ctx;
    const ei_decoder *dec;
    const float *shared;
    ei_keep_set *keep;
    void *ws;
    size_t wsb;
} select_shared_call;
static ei_result select_shared_call_run(void *arg) {
    select_shared_call *a = (select_shared_call *)arg;
    ei_exec x = ex(1, a->ws, a->wsb);
    return ei_decode_select_shared(a->ctx, &x, a->dec, a->shared, DG_N, a->keep);
}
static void shared_graph(void) {
    const char *name = "shared keep set over two layers, one row map";
    dscene s;
    ei_decoder dE[2], dG[2];
    void *mE[2], *mG[2], *wsE, *wsG, *dk[2], *dqp;
    ei_exec xE;
    float *scE, *scG, *shE, *shG, *shX;
    int32_t *rp_h = (int32_t *)malloc((size_t)DG_N * 4), *rp = (int32_t *)malloc((size_t)DG_N * 4), *rp_d;
    size_t nk = (size_t)DG_N * DG_NKV * DG_D, nqp = (size_t)DG_P * DG_NH * DG_D, nsc = (size_t)DG_NH * DG_N;
    uint16_t *k = (uint16_t *)malloc(nk * 2), *qp = (uint16_t *)malloc(nqp * 2);
    float *shx_h = (float *)malloc((size_t)DG_N * 4);
    ei_tensor tk[2], tqp;
    dkeep kE, kG;
    shared_call sc;
    select_shared_call ssc;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int kernels, memsets, others, rep, layer, j;
    int32_t cap_n_kept, cap_compressed;
    int64_t cap_n_tokens;
    ei_result r;

    dscene_make(&s, 1);
    CU(cudaMalloc(&wsE, s.ws_bytes)); CU(cudaMalloc(&wsG, s.ws_bytes));
    xE = ex(1, wsE, s.ws_bytes);
    CU(cudaMalloc(&dqp, nqp * 2));
    CU(cudaMalloc((void **)&scE, nsc * 4)); CU(cudaMalloc((void **)&scG, nsc * 4));
    CU(cudaMalloc((void **)&shE, DG_N * 4)); CU(cudaMalloc((void **)&shG, DG_N * 4)); CU(cudaMalloc((void **)&shX, DG_N * 4));
    CU(cudaMalloc((void **)&rp_d, DG_N * 4));
    tqp = ei_tensor_make(dqp, EI_BF16, DG_P, DG_NH, DG_D);
    map_make(rp_h, DG_N, 200, 0);
    h2d(rp_d, rp_h, DG_N * 4, s.st);
    for (layer = 0; layer < 2; layer++) {
        dec_make(&s, s.eager, &dE[layer], &mE[layer]);
        dec_make(&s, s.capt, &dG[layer], &mG[layer]);
        CU(cudaMalloc(&dk[layer], nk * 2));
        tk[layer] = ei_tensor_make(dk[layer], EI_BF16, DG_N, DG_NKV, DG_D);
        fill_bf16(qp, nqp, 1.f);
        h2d(dqp, qp, nqp * 2, s.st);
        CHECK_OK(ei_decode_observe(s.eager, &dE[layer], &tqp, DG_N - DG_P, 0));
        CHECK_OK(ei_decode_observe(s.capt, &dG[layer], &tqp, DG_N - DG_P, 0));
        fill_bf16(k, nk, 1.f);
        h2d(dk[layer], k, nk * 2, s.st);
    }
    dkeep_make(&kE, 1, DG_BUDGET, rp_d, 0);
    dkeep_make(&kG, 1, DG_BUDGET, rp_d, 0);

    sc.ctx = s.capt; sc.dec[0] = &dG[0]; sc.dec[1] = &dG[1]; sc.k[0] = &tk[0]; sc.k[1] = &tk[1]; sc.rp = rp_d;
    sc.scores = scG; sc.shared = shG; sc.keep = &kG.ks; sc.ws = wsG; sc.wsb = s.ws_bytes; sc.st = s.st;
    capture(s.st, shared_call_run, &sc, name, &graph);
    graph_count(graph, &kernels, &memsets, &others);
    printf("  %s: captured, %d kernels, %d memsets, %d other nodes\n", name, kernels, memsets, others);
    CHECK(others == 0 && kernels > 0, "%s: %d nodes that are neither kernels nor memsets", name, others);
    CU(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    cap_n_kept = kG.ks.n_kept; cap_compressed = kG.ks.compressed; cap_n_tokens = kG.ks.n_tokens;
    CHECK(cap_n_kept == DG_BUDGET && cap_compressed == 1 && cap_n_tokens == DG_N, "%s: captured counts %d %d %lld", name,
          (int)cap_n_kept, (int)cap_compressed, (long long)cap_n_tokens);

    for (rep = 0; rep < 6; rep++) { /* faults: NaN in layer 1's k; a duplicate position */
        int fault = rep % 2 ? 1 + rep / 2 : 0;
        const char *fname = "";
        ei_result re;
        char emsg[600];
        if (fault > 2) continue;
        memcpy(rp, rp_h, DG_N * 4);
        for (layer = 0; layer < 2; layer++) {
            fill_bf16(k, nk, 1.f + 0.25f * (float)rep);
            if (fault == 1 && layer == 1) {
                for (j = 0; rp[j] < 0; j++) {}
                k[((size_t)j * DG_NKV + 1) * DG_D + 60] = 0x7FC0;
                fname = "NaN in layer 1's k";
            }
            h2d(dk[layer], k, nk * 2, s.st);
        }
        if (fault == 2) {
            for (j = 0; rp[j] != -1; j++) {}
            rp[j] = 150;
            fname = "two rows of one position";
        }
        h2d(rp_d, rp, DG_N * 4, s.st);
        dkeep_clear(&kG, s.st);
        CU(cudaGraphLaunch(exec, s.st));
        CU(cudaStreamSynchronize(s.st));
        dkeep_clear(&kE, s.st);
        CU(cudaMemset(shE, 0, DG_N * 4));
        re = EI_OK;
        for (layer = 0; layer < 2 && re == EI_OK; layer++) {
            dE[layer].last_compress = -1;
            re = ei_decode_score(s.eager, &xE, &dE[layer], &tk[layer], rp_d, 0, scE);
            if (re == EI_OK) re = ei_decode_shared_add(s.eager, &xE, &dE[layer], scE, DG_N, rp_d, shE);
        }
        if (re == EI_OK) re = ei_decode_select_shared(s.eager, &xE, &dE[1], shE, DG_N, &kE.ks);
        snprintf(emsg, sizeof emsg, "%s", re == EI_OK ? "" : ei_last_error());
        if (!fault) {
            int same_shared, same_keep;
            r = ei_cuda_status(s.capt);
            CHECK(r == EI_OK, "%s, replay %d: status %s (%s)", name, rep, ei_result_name(r), ei_last_error());
            CHECK(re == EI_OK, "%s, replay %d: the waiting calls: %s (%s)", name, rep, ei_result_name(re), emsg);
            kG.ks.n_kept = cap_n_kept; kG.ks.compressed = cap_compressed; kG.ks.n_tokens = cap_n_tokens;
            same_shared = dev_same(shG, shE, DG_N * 4) && dev_same(scG, scE, nsc * 4);
            same_keep = dkeep_same(&kG, &kE);
            CHECK(same_shared && same_keep, "%s, replay %d: shared scores %s, keep set %s", name, rep,
                  same_shared ? "equal" : "DIFFER", same_keep ? "equal" : "DIFFERS");
            printf("  %s, replay %d: shared scores and keep set (n_kept %d) %s the waiting calls'\n", name, rep,
                   (int)kE.ks.n_kept, same_shared && same_keep ? "equal bit for bit" : "DIFFER from");
        } else {
            char what[600];
            snprintf(what, sizeof what, "%s, replay %d, %s", name, rep, fname);
            CHECK(re != EI_OK, "%s: the waiting calls returned EI_OK", what);
            expect_status(s.capt, re, emsg, "decode_score", what);
        }
    }
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));

    /* select_shared alone over given shared scores: a non-finite one (a candidate's) is reported */
    h2d(rp_d, rp_h, DG_N * 4, s.st);
    for (j = 0; j < DG_N; j++) shx_h[j] = 0.5f + 0.5f * urand_pm();
    h2d(shX, shx_h, DG_N * 4, s.st);
    ssc.ctx = s.capt; ssc.dec = &dG[1]; ssc.shared = shX; ssc.keep = &kG.ks; ssc.ws = wsG; ssc.wsb = s.ws_bytes;
    capture(s.st, select_shared_call_run, &ssc, "select_shared", &graph);
    CU(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    cap_n_kept = kG.ks.n_kept; cap_compressed = kG.ks.compressed; cap_n_tokens = kG.ks.n_tokens;
    for (rep = 0; rep < 3; rep++) {
        ei_result re;
        char emsg[600];
        for (j = 0; j < DG_N; j++) shx_h[j] = 0.5f + 0.5f * urand_pm();
        if (rep == 1) {
            for (j = 0; rp_h[j] != 5; j++) {} /* the row of position 5, a candidate */
            shx_h[j] = NAN;
        }
        h2d(shX, shx_h, DG_N * 4, s.st);
        dkeep_clear(&kG, s.st);
        CU(cudaGraphLaunch(exec, s.st));
        CU(cudaStreamSynchronize(s.st));
        dkeep_clear(&kE, s.st);
        re = ei_decode_select_shared(s.eager, &xE, &dE[1], shX, DG_N, &kE.ks);
        snprintf(emsg, sizeof emsg, "%s", re == EI_OK ? "" : ei_last_error());
        if (rep != 1) {
            int same;
            r = ei_cuda_status(s.capt);
            CHECK(r == EI_OK && re == EI_OK, "select_shared replay %d: status %s, waiting call %s", rep,
                  ei_result_name(r), ei_result_name(re));
            kG.ks.n_kept = cap_n_kept; kG.ks.compressed = cap_compressed; kG.ks.n_tokens = cap_n_tokens;
            same = dkeep_same(&kG, &kE);
            CHECK(same, "select_shared replay %d: the keep set differs", rep);
            printf("  select_shared alone, replay %d: keep set %s the waiting call's\n", rep,
                   same ? "equals bit for bit" : "DIFFERS from");
        } else {
            CHECK(re == EI_ERR_NONFINITE, "select_shared with NaN: the waiting call %s", ei_result_name(re));
            expect_status(s.capt, re, emsg, "decode_select_shared", "select_shared alone, NaN shared score");
        }
    }
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    dkeep_free(&kE); dkeep_free(&kG);
    for (layer = 0; layer < 2; layer++) { cudaFree(mE[layer]); cudaFree(mG[layer]); cudaFree(dk[layer]); }
    cudaFree(wsE); cudaFree(wsG); cudaFree(dqp); cudaFree(scE); cudaFree(scG); cudaFree(shE); cudaFree(shG);
    cudaFree(shX); cudaFree(rp_d);
    dscene_free(&s);
    free(rp_h); free(rp); free(k); free(qp); free(shx_h);
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
    printf("decode keep sets in CUDA graphs:\n");
    keep_graph(0);
    keep_graph(1);
    keep_graph(2);
    score_select_graph(0);
    score_select_graph(1);
    shared_graph();
    printf("%s: %d checks, %d failed\n", failures ? "FAILED" : "PASSED", checks, failures);
    return failures ? 1 : 0;
}
