/* test_plugin.c - the CPU/GPU boundary without a GPU: loading the CUDA
   plugin (missing library, other ABI version, no device, fallback to the
   CPU), and "validate once, then dispatch": every call is checked by the
   header, so a CPU context and a plugin context refuse bad calls with the
   same code, and the plugin never sees them (tests/fake_cuda_plugin.c counts
   its calls). Also: the result table's range, the logger hearing
   ei_kv_compact's errors, ei_plan_free of a device plan without its context.
   Usage: test_plugin DIR   (DIR holds fake_cuda.so, fake_cuda_abi1.so,
   fake_cuda_nodev.so, built by tests/tests.mk) */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "check.h"
#include <dlfcn.h>
#include <math.h>

static char g_logged[1024];
static int g_log_calls;
static void logger(void *user, ei_result code, const char *msg) {
    (void)user; (void)code;
    g_log_calls++;
    snprintf(g_logged, sizeof g_logged, "%s", msg);
}

static int *g_calls; /* fake_calls of the loaded fake plugin */
/* Calls of entries that do work: the workspace-size queries (6 profile, 8
   attention, 11 decode; fake_cuda_plugin.c's C_*WS) are pure and the header
   asks them while it validates (the workspace bytes a call uses are one of
   its memory regions, checked for overlaps). */
static int calls_total(void) {
    int i, n = 0;
    for (i = 0; i < 32; ++i) n += (i == 6 || i == 8 || i == 11) ? 0 : g_calls[i];
    return n;
}

static void test_result_table(void) {
    int r;
    for (r = EI_RESULT_MIN_; r <= 0; ++r)
        CHECK(strcmp(ei_result_name((ei_result)r), "EI_ERR_UNKNOWN") != 0, "code %d has no name", r);
    CHECK(strcmp(ei_result_name((ei_result)(EI_RESULT_MIN_ - 1)), "EI_ERR_UNKNOWN") == 0, "EI_RESULT_MIN_ is not the lowest code");
}

static ei_config cfg_with(const char *lib, ei_backend b) {
    ei_config c = ei_config_default();
    c.backend = b;
    c.cuda_library = lib;
    c.log = logger;
    c.segment_size = 16; c.block_size = 4; c.threshold_len = 16; c.base_budget = 16;
    c.window = 8; c.decode_gap = 4; c.decode_budget = 24;
    return c;
}

static void test_loading(const char *dir) {
    char good[600], abi1[600], nodev[600];
    ei_config c;
    ei_context *ctx = NULL;
    snprintf(good, sizeof good, "%s/fake_cuda.so", dir);
    snprintf(abi1, sizeof abi1, "%s/fake_cuda_abi1.so", dir);
    snprintf(nodev, sizeof nodev, "%s/fake_cuda_nodev.so", dir);

    c = cfg_with("/nonexistent/libentropyinfer_cuda.so", EI_BACKEND_CUDA);
    CHECK_ERR(ei_context_create(&c, &ctx), EI_ERR_BACKEND);
    CHECK(strstr(ei_last_error(), "/nonexistent/libentropyinfer_cuda.so") != NULL, "message lacks the path: %s", ei_last_error());

    c = cfg_with(abi1, EI_BACKEND_CUDA);
    CHECK_ERR(ei_context_create(&c, &ctx), EI_ERR_BACKEND);
    {
        char want[32];
        snprintf(want, sizeof want, "version %d", EI_CUDA_ABI_VERSION);
        CHECK(strstr(ei_last_error(), "ABI version 1") && strstr(ei_last_error(), want),
              "a version mismatch names both versions: %s", ei_last_error());
    }

    c = cfg_with(nodev, EI_BACKEND_CUDA);
    CHECK_ERR(ei_context_create(&c, &ctx), EI_ERR_BACKEND);
    CHECK(strstr(ei_last_error(), "no usable device") != NULL, "%s", ei_last_error());

    /* the fallback: a CPU context, and the logger hears why */
    g_log_calls = 0;
    c = cfg_with(nodev, EI_BACKEND_CUDA_OR_CPU);
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    CHECK(ctx && ei_context_backend(ctx) == EI_BACKEND_CPU, "CUDA_OR_CPU without a device runs on the CPU");
    CHECK(g_log_calls >= 1 && strstr(g_logged, "running on the CPU") && strstr(g_logged, "no usable device"),
          "fallback not logged: '%s'", g_logged);
    ei_context_destroy(ctx);
    c = cfg_with("/nonexistent.so", EI_BACKEND_CUDA_OR_CPU);
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    CHECK(ctx && ei_context_backend(ctx) == EI_BACKEND_CPU, "fallback when the library is missing");
    ei_context_destroy(ctx);

    c = cfg_with(good, EI_BACKEND_CUDA_OR_CPU);
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    CHECK(ctx && ei_context_backend(ctx) == EI_BACKEND_CUDA, "CUDA_OR_CPU with a device runs on it");
    ei_context_destroy(ctx);
}

/* One layer's buffers (host memory: the fake plugin's "device" memory too). */
typedef struct layer {
    float *q, *k, *v, *o;
    ei_tensor tq, tk, tv;
    ei_out_tensor to;
} layer;
static void layer_make(layer *L, int64_t n, int32_t H, int32_t KV, int32_t d) {
    int64_t i;
    L->q = (float *)malloc((size_t)(n * H * d) * 4); L->o = (float *)malloc((size_t)(n * H * d) * 4);
    L->k = (float *)malloc((size_t)(n * KV * d) * 4); L->v = (float *)malloc((size_t)(n * KV * d) * 4);
    for (i = 0; i < n * H * d; ++i) L->q[i] = (float)sin(0.37 * (double)i);
    for (i = 0; i < n * KV * d; ++i) { L->k[i] = (float)cos(0.11 * (double)i); L->v[i] = (float)sin(0.05 * (double)i); }
    L->tq = ei_tensor_make(L->q, EI_F32, n, H, d);
    L->tk = ei_tensor_make(L->k, EI_F32, n, KV, d);
    L->tv = ei_tensor_make(L->v, EI_F32, n, KV, d);
    L->to = ei_out_tensor_make(L->o, EI_F32, n, H, d);
}
static void layer_free(layer *L) { free(L->q); free(L->k); free(L->v); free(L->o); }

/* The same bad calls on a CPU and on a plugin context: same code, and the
   plugin is never called. */
static void test_validate_once(const char *dir) {
    char good[600];
    ei_context *ctx[2], *small[2];
    ei_config c;
    int b;
    snprintf(good, sizeof good, "%s/fake_cuda.so", dir);
    for (b = 0; b < 2; ++b) {
        c = cfg_with(good, b ? EI_BACKEND_CUDA : EI_BACKEND_CPU);
        CHECK_ERR(ei_context_create(&c, &ctx[b]), EI_OK);
        c.base_budget = 4; /* plans laid out for smaller budgets */
        CHECK_ERR(ei_context_create(&c, &small[b]), EI_OK);
    }
    if (!ctx[1] || !small[1]) return;
    for (b = 0; b < 2; ++b) {
        ei_context *x = ctx[b];
        const char *name = b ? "plugin" : "cpu";
        layer L;
        ei_plan plan, plan_small;
        ei_decoder dec;
        ei_keep_set ks;
        int32_t idx[2 * 64];
        void *dmem, *ws;
        size_t dbytes, wsb;
        int before;
        ei_tensor bad;
        ei_out_tensor out_over;
        layer_make(&L, 64, 4, 2, 8);
        CHECK_ERR(ei_plan_alloc(x, &plan, 64, 2, 8, 0), EI_OK);
        CHECK_ERR(ei_plan_alloc(small[b], &plan_small, 64, 2, 8, 0), EI_OK);
        CHECK_ERR(ei_profile_workspace_size(x, 64, 4, 2, 8, &wsb), EI_OK);
        ws = malloc(wsb > 4096 ? wsb : 4096);
        CHECK_ERR(ei_decoder_size(x, 4, 8, &dbytes), EI_OK);
        dmem = malloc(dbytes);
        CHECK_ERR(ei_decoder_init(x, &dec, 4, 2, 8, dmem, dbytes), EI_OK);
        if (b) memset(g_calls, 0, 32 * sizeof(int));
        before = b ? calls_total() : 0;

        /* bad calls: the header's codes on both backends, nothing reaches the plugin */
        CHECK_ERR(ei_profile(x, NULL, &L.tk, &plan, ws, wsb), EI_ERR_NULL);
        bad = L.tq; bad.head_dim = 4; bad.head_stride = 4; bad.token_stride = 16;
        CHECK_ERR(ei_profile(x, &bad, &L.tk, &plan, ws, wsb), EI_ERR_SHAPE);
        bad = L.tq; bad.n_heads = 3; bad.token_stride = 24;
        CHECK_ERR(ei_profile(x, &bad, &L.tk, &plan, ws, wsb), EI_ERR_GQA);
        bad = L.tq; bad.n_tokens = 32;
        CHECK_ERR(ei_profile(x, &bad, &L.tk, &plan, ws, wsb), EI_ERR_SHAPE);
        CHECK_ERR(ei_profile(x, &L.tq, &L.tk, &plan_small, ws, wsb), EI_ERR_SHAPE); /* rows too short for the budgets */
        CHECK_ERR(ei_attention_prefill(x, &L.tq, &L.tk, &L.tv, &plan_small, &L.to, 0, 0, 1, ws, wsb), EI_ERR_STATE);
        bad = L.tk; bad.token_stride = 4; /* tokens alias heads */
        CHECK_ERR(ei_attention_prefill(x, &L.tq, &bad, &L.tv, NULL, &L.to, 0, 0, 1, ws, wsb), EI_ERR_STRIDE);
        out_over = ei_out_tensor_make(L.q, EI_F32, 64, 4, 8); /* out over q */
        CHECK_ERR(ei_attention_prefill(x, &L.tq, &L.tk, &L.tv, NULL, &out_over, 0, 0, 1, ws, wsb), EI_ERR_OVERLAP);
        CHECK_ERR(ei_attention_prefill(x, &L.tq, &L.tk, &L.tv, NULL, &L.to, 1, 0, 1, ws, wsb), EI_ERR_SHAPE);
        CHECK_ERR(ei_profile_workspace_size(x, 64, 4, 3, 8, &wsb), EI_ERR_GQA);
        CHECK_ERR(ei_attention_workspace_size(x, 4, 2, EI_MAX_HEAD_DIM + 1, &wsb), EI_ERR_SIZE);
        CHECK_ERR(ei_decode_workspace_size(x, 0, 4, 2, &wsb), EI_ERR_SIZE);
        CHECK_ERR(ei_decode_keep(x, &dec, &L.tk, NULL, ws, 4096), EI_ERR_NULL);
        memset(&ks, 0, sizeof ks);
        ks.heads_out = 2; ks.capacity = 64; ks.index = idx; ks.n_kept = 3; ks.n_tokens = 64; ks.compressed = 1;
        idx[0] = 0; idx[1] = 5; idx[2] = 9; idx[64] = 1; idx[65] = 2; idx[66] = 3;
        CHECK_ERR(ei_decode_keep(x, &dec, &L.tk, &ks, ws, 4096), EI_ERR_STATE); /* nothing observed */
        {
            ei_out_tensor kc = ei_out_tensor_make(L.k, EI_F32, 64, 2, 8);
            ei_out_tensor vc = ei_out_tensor_make(L.v, EI_F32, 64, 2, 8);
            ei_out_tensor k3 = ei_out_tensor_make(L.k, EI_F32, 64, 3, 8);
            ks.n_kept = 70; /* more than the capacity */
            CHECK_ERR(ei_kv_compact(x, &ks, &kc, &vc), EI_ERR_SHAPE);
            ks.n_kept = 3;
            CHECK_ERR(ei_kv_compact(x, &ks, &kc, &kc), EI_ERR_OVERLAP); /* one cache twice */
            CHECK_ERR(ei_kv_compact(x, &ks, &k3, NULL), EI_ERR_SHAPE);
        }
        if (b) CHECK(calls_total() == before, "%s: the plugin was called %d times by calls the header refuses", name,
                     calls_total() - before);

        /* good calls reach the plugin once each (and run on the CPU) */
        if (b) memset(g_calls, 0, 32 * sizeof(int));
        CHECK_ERR(ei_profile(x, &L.tq, &L.tk, &plan, ws, wsb), EI_OK);
        {   /* an interleaved view: 2 kv heads of 8 dims, head stride 10, token stride 22 */
            float *kk = (float *)calloc(64 * 22, 4), *vv = (float *)calloc(64 * 22, 4);
            ei_tensor ki = ei_tensor_make(kk, EI_F32, 64, 2, 8), vi = ei_tensor_make(vv, EI_F32, 64, 2, 8);
            size_t aws;
            void *aw;
            ki.head_stride = vi.head_stride = 10; ki.token_stride = vi.token_stride = 22;
            CHECK_ERR(ei_attention_workspace_size(x, 4, 2, 8, &aws), EI_OK);
            aw = malloc(aws ? aws : 1);
            CHECK_ERR(ei_attention_prefill(x, &L.tq, &ki, &vi, &plan, &L.to, 0, 0, 1, aw, aws), EI_OK);
            free(aw); free(kk); free(vv);
        }
        {   /* fewer observed queries than the window: accepted */
            ei_tensor q5 = L.tq;
            q5.n_tokens = 5;
            CHECK_ERR(ei_decode_observe(x, &dec, &q5, 0, 0), EI_OK);
        }
        if (b) CHECK(g_calls[7] == 1 && g_calls[9] == 1 && g_calls[10] == 1,
                     "plugin calls: profile %d, attention %d, observe %d (1 each expected)", g_calls[7], g_calls[9],
                     g_calls[10]);

        /* a device plan freed without its context stays as it is */
        if (b) {
            ei_plan keep_copy = plan;
            int frees = g_calls[1];
            ei_plan_free(NULL, &plan);
            CHECK(g_calls[1] == frees && plan.owned_memory == keep_copy.owned_memory && plan.entropy == keep_copy.entropy,
                  "ei_plan_free(NULL, device plan) must leave it alone");
            CHECK(strstr(ei_last_error(), "EI_ERR_STATE") != NULL, "%s", ei_last_error());
            ei_plan_free(x, &plan);
            CHECK(g_calls[1] == frees + 1 && plan.owned_memory == NULL, "ei_plan_free(ctx, device plan) frees it once");
            { /* chunked planning: every kv head in one call reaches the plugin (profile_chunk, ABI 7); kv-head
                 ranges stay on the CPU and say what to call instead */
                ei_plan chunked;
                void *pm = malloc(1 << 20);
                int before = g_calls[18];
                CHECK_ERR(ei_plan_init(x, &chunked, 64, 2, 8, EI_PLAN_CHUNKED, pm, 1 << 20), EI_OK);
                CHECK_ERR(ei_profile_chunk_heads(x, &L.tq, &L.tk, &chunked, 0, 1, 0, 1, ws, wsb), EI_ERR_UNSUPPORTED);
                CHECK(strstr(ei_last_error(), "call ei_profile_chunk") != NULL, "%s", ei_last_error());
                CHECK_ERR(ei_profile_chunk(x, &L.tq, &L.tk, &chunked, 0, 1, ws, wsb), EI_OK);
                CHECK(g_calls[18] == before + 1 && chunked.n_tokens == 64 && chunked.final == 1,
                      "profile_chunk calls %d (1 expected), plan covers %lld tokens, final %d", g_calls[18] - before,
                      (long long)chunked.n_tokens, (int)chunked.final);
                CHECK_ERR(ei_profile_chunk(x, NULL, &L.tk, &chunked, 32, 1, ws, wsb), EI_ERR_STATE);
                CHECK(g_calls[18] == before + 1, "a refused call reached the plugin");
                free(pm);
            }
        } else {
            ei_plan_free(x, &plan);
        }
        ei_plan_free(small[b], &plan_small);
        free(dmem); free(ws);
        layer_free(&L);
    }
    for (b = 0; b < 2; ++b) { ei_context_destroy(ctx[b]); ei_context_destroy(small[b]); }
}

/* EI_RANK_ANTIDIAGONAL has no CUDA kernels: on the plugin's backend every
   profiling entry refuses it (EI_ERR_UNSUPPORTED, naming the ranking) before
   the plugin is called, rather than plan with another ranking; the same
   context still runs attention on the GPU. */
static void test_antidiag_refused(const char *dir) {
    char good[600];
    ei_context *x = NULL;
    ei_config c;
    layer L;
    ei_plan plan, chunked;
    void *ws, *pm = malloc(1 << 20);
    size_t wsb = 1 << 16;
    int before;
    snprintf(good, sizeof good, "%s/fake_cuda.so", dir);
    c = cfg_with(good, EI_BACKEND_CUDA);
    c.ranking = EI_RANK_ANTIDIAGONAL;
    CHECK_ERR(ei_context_create(&c, &x), EI_OK);
    if (!x) { free(pm); return; }
    layer_make(&L, 64, 4, 2, 8);
    ws = malloc(wsb);
    CHECK_ERR(ei_plan_alloc(x, &plan, 64, 2, 8, 0), EI_OK);
    CHECK_ERR(ei_plan_init(x, &chunked, 64, 2, 8, EI_PLAN_CHUNKED, pm, 1 << 20), EI_OK);
    memset(g_calls, 0, 32 * sizeof(int));
    before = calls_total();
    CHECK_ERR(ei_profile_workspace_size(x, 64, 4, 2, 8, &wsb), EI_ERR_UNSUPPORTED);
    CHECK(strstr(ei_last_error(), "EI_RANK_ANTIDIAGONAL") != NULL, "%s", ei_last_error());
    wsb = 1 << 16;
    CHECK_ERR(ei_profile(x, &L.tq, &L.tk, &plan, ws, wsb), EI_ERR_UNSUPPORTED);
    CHECK(strstr(ei_last_error(), "EI_RANK_ANTIDIAGONAL") != NULL, "%s", ei_last_error());
    CHECK_ERR(ei_profile_mt(x, &L.tq, &L.tk, &plan, 2, ws, wsb), EI_ERR_UNSUPPORTED);
    CHECK_ERR(ei_profile_chunk(x, &L.tq, &L.tk, &chunked, 0, 1, ws, wsb), EI_ERR_UNSUPPORTED);
    CHECK_ERR(ei_profile_chunk_mt(x, &L.tq, &L.tk, &chunked, 0, 1, 2, ws, wsb), EI_ERR_UNSUPPORTED);
    CHECK(calls_total() == before && plan.n_tokens == 0 && chunked.n_tokens == 0,
          "a refused EI_RANK_ANTIDIAGONAL call reached the plugin (%d calls) or moved a plan", calls_total() - before);
    CHECK_ERR(ei_attention_prefill(x, &L.tq, &L.tk, &L.tv, NULL, &L.to, 0, 0, 1, ws, wsb), EI_OK);
    ei_plan_free(x, &plan);
    free(pm);
    free(ws);
    layer_free(&L);
    ei_context_destroy(x);
}

/* ei_kv_compact's errors reach the context's logger. */
static void test_compact_logs(void) {
    ei_config c = cfg_with(NULL, EI_BACKEND_CPU);
    ei_context *ctx;
    ei_keep_set ks;
    int32_t idx[4] = {2, 1, 0, 0};
    float kbuf[4 * 8];
    ei_out_tensor k = ei_out_tensor_make(kbuf, EI_F32, 4, 1, 8);
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    memset(&ks, 0, sizeof ks);
    ks.heads_out = 1; ks.capacity = 4; ks.n_kept = 2; ks.n_tokens = 4; ks.index = idx; ks.compressed = 1;
    g_log_calls = 0;
    g_logged[0] = 0;
    CHECK_ERR(ei_kv_compact(ctx, &ks, &k, NULL), EI_ERR_SHAPE);
    CHECK(g_log_calls == 1 && strstr(g_logged, "EI_ERR_SHAPE"), "the logger did not hear kv_compact's error ('%s')", g_logged);
    ei_context_destroy(ctx);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "build";
    char good[600];
    void *h;
    test_result_table();
    test_compact_logs();
    snprintf(good, sizeof good, "%s/fake_cuda.so", dir);
    h = dlopen(good, RTLD_NOW | RTLD_LOCAL);
    if (!h || !(g_calls = (int *)dlsym(h, "fake_calls"))) {
        printf("FAIL: cannot load %s (%s)\n", good, dlerror());
        return 1;
    }
    test_loading(dir);
    test_validate_once(dir);
    test_antidiag_refused(dir);
    dlclose(h);
    printf("test_plugin: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
