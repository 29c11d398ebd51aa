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
    CHECK(ctx && ei_context_config(ctx)->backend == EI_BACKEND_CPU, "CUDA_OR_CPU without a device runs on the CPU");
    CHECK(g_log_calls >= 1 && strstr(g_logged, "running on the CPU") && strstr(g_logged, "no usable device"),
          "fallback not logged: '%s'", g_logged);
    ei_context_destroy(ctx);
    c = cfg_with("/nonexistent.so", EI_BACKEND_CUDA_OR_CPU);
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    CHECK(ctx && ei_context_config(ctx)->backend == EI_BACKEND_CPU, "fallback when the library is missing");
    ei_context_destroy(ctx);

    c = cfg_with(good, EI_BACKEND_CUDA_OR_CPU);
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    CHECK(ctx && ei_context_config(ctx)->backend == EI_BACKEND_CUDA, "CUDA_OR_CPU with a device runs on it");
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
        size_t wsb;
        int before;
        ei_tensor bad;
        ei_out_tensor out_over;
        ei_sizes sz;
        ei_exec e, e4k, eb;
        layer_make(&L, 64, 4, 2, 8);
        CHECK_ERR(ei_plan_init(x, &plan, 64, 2, 8, 0, NULL, 0), EI_OK);
        CHECK_ERR(ei_plan_init(small[b], &plan_small, 64, 2, 8, 0, NULL, 0), EI_OK);
        CHECK_ERR(sizes_for(x, 64, 4, 2, 8, 0, 1, &sz), EI_OK);
        wsb = sz.profile;
        ws = malloc(wsb > 4096 ? wsb : 4096);
        e = ex(1, ws, wsb);
        e4k = ex(1, ws, 4096);
        dmem = malloc(sz.decoder);
        CHECK_ERR(ei_decoder_init(x, &dec, 4, 2, 8, dmem, sz.decoder), EI_OK);
        if (b) memset(g_calls, 0, 32 * sizeof(int));
        before = b ? calls_total() : 0;

        /* bad calls: the header's codes on both backends, nothing reaches the plugin */
        CHECK_ERR(ei_profile(x, &e, NULL, &L.tk, &plan), EI_ERR_NULL);
        bad = L.tq; bad.head_dim = 4; bad.head_stride = 4; bad.token_stride = 16;
        CHECK_ERR(ei_profile(x, &e, &bad, &L.tk, &plan), EI_ERR_SHAPE);
        bad = L.tq; bad.n_heads = 3; bad.token_stride = 24;
        CHECK_ERR(ei_profile(x, &e, &bad, &L.tk, &plan), EI_ERR_GQA);
        bad = L.tq; bad.n_tokens = 32;
        CHECK_ERR(ei_profile(x, &e, &bad, &L.tk, &plan), EI_ERR_SHAPE);
        CHECK_ERR(ei_profile(x, &e, &L.tq, &L.tk, &plan_small), EI_ERR_SHAPE); /* rows too short for the budgets */
        CHECK_ERR(ei_attention_prefill(x, &e, &L.tq, &L.tk, &L.tv, &plan_small, &L.to, 0), EI_ERR_STATE);
        bad = L.tk; bad.token_stride = 4; /* tokens alias heads */
        CHECK_ERR(ei_attention_prefill(x, &e, &L.tq, &bad, &L.tv, NULL, &L.to, 0), EI_ERR_STRIDE);
        out_over = ei_out_tensor_make(L.q, EI_F32, 64, 4, 8); /* out over q */
        CHECK_ERR(ei_attention_prefill(x, &e, &L.tq, &L.tk, &L.tv, NULL, &out_over, 0), EI_ERR_OVERLAP);
        CHECK_ERR(ei_attention_prefill(x, &e, &L.tq, &L.tk, &L.tv, NULL, &L.to, 1), EI_ERR_SHAPE);
        CHECK_ERR(sizes_for(x, 64, 4, 3, 8, 0, 1, &sz), EI_ERR_GQA);
        CHECK_ERR(sizes_for(x, 64, 4, 2, EI_MAX_HEAD_DIM + 1, 0, 1, &sz), EI_ERR_SIZE);
        CHECK_ERR(sizes_for(x, 0, 4, 2, 8, 0, 1, &sz), EI_ERR_SIZE);
        CHECK_ERR(ei_decode_keep(x, &e4k, &dec, &L.tk, NULL), EI_ERR_NULL);
        /* how a call runs (ei_exec): the header's codes too */
        eb = ex_part(2, 2, ws, wsb); /* ith past nth */
        CHECK_ERR(ei_profile(x, &eb, &L.tq, &L.tk, &plan), EI_ERR_SIZE);
        eb = ex_part(0, 2, ws, wsb); eb.n_threads = 2; /* threads and parts at once */
        CHECK_ERR(ei_attention_prefill(x, &eb, &L.tq, &L.tk, &L.tv, NULL, &L.to, 0), EI_ERR_CONFIG);
        eb = ex(-1, ws, wsb);
        CHECK_ERR(ei_profile_chunk(x, &eb, &L.tq, &L.tk, &plan, 0, 1), EI_ERR_SIZE);
        eb = ex(1, NULL, wsb); /* no workspace, but bytes */
        CHECK_ERR(ei_profile(x, &eb, &L.tq, &L.tk, &plan), EI_ERR_NULL);
        eb = ex_part(1, 2, ws, 4096); /* decode keep sets run on threads; parts make score, then select */
        CHECK_ERR(ei_decode_keep(x, &eb, &dec, &L.tk, NULL), EI_ERR_CONFIG);
        CHECK(strstr(ei_last_error(), "ei_decode_score") != NULL, "%s", ei_last_error());
        CHECK_ERR(ei_plan_init(x, &plan_small, 64, 2, 8, 0, NULL, 1024), EI_ERR_NULL); /* a failed allocation of the caller's */
        /* part 0 of a bad call in parts: the same code on both backends */
        bad = L.tq; bad.n_tokens = 32;
        eb = ex_part(0, 2, ws, wsb);
        CHECK_ERR(ei_profile(x, &eb, &bad, &L.tk, &plan), EI_ERR_SHAPE);
        memset(&ks, 0, sizeof ks);
        ks.heads_out = 2; ks.capacity = 64; ks.index = idx; ks.n_kept = 3; ks.n_tokens = 64; ks.compressed = 1;
        idx[0] = 0; idx[1] = 5; idx[2] = 9; idx[64] = 1; idx[65] = 2; idx[66] = 3;
        CHECK_ERR(ei_decode_keep(x, &e4k, &dec, &L.tk, &ks), EI_ERR_STATE); /* nothing observed */
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
        CHECK_ERR(ei_profile(x, &e, &L.tq, &L.tk, &plan), EI_OK);
        {   /* an interleaved view: 2 kv heads of 8 dims, head stride 10, token stride 22 */
            float *kk = (float *)calloc(64 * 22, 4), *vv = (float *)calloc(64 * 22, 4);
            ei_tensor ki = ei_tensor_make(kk, EI_F32, 64, 2, 8), vi = ei_tensor_make(vv, EI_F32, 64, 2, 8);
            ei_exec ea;
            ki.head_stride = vi.head_stride = 10; ki.token_stride = vi.token_stride = 22;
            CHECK_ERR(sizes_for(x, 64, 4, 2, 8, 0, 1, &sz), EI_OK);
            ea = ex(1, malloc(sz.prefill ? sz.prefill : 1), sz.prefill);
            CHECK_ERR(ei_attention_prefill(x, &ea, &L.tq, &ki, &vi, &plan, &L.to, 0), EI_OK);
            free(ea.workspace); free(kk); free(vv);
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
            { /* chunked planning: every kv head in one call reaches the plugin (profile_chunk, ABI 7); in parts,
                 part 0 makes that call and the others return EI_OK, and a call on threads is the same one call */
                ei_plan chunked;
                void *pm = malloc(1 << 20);
                int before = g_calls[18];
                ei_exec p0 = ex_part(0, 2, ws, wsb), p1 = ex_part(1, 2, ws, wsb), t2 = ex(2, ws, wsb);
                CHECK_ERR(ei_plan_init(x, &chunked, 64, 2, 8, EI_PLAN_CHUNKED, pm, 1 << 20), EI_OK);
                CHECK_ERR(ei_profile_chunk(x, &p1, &L.tq, &L.tk, &chunked, 0, 1), EI_OK);
                CHECK(g_calls[18] == before && chunked.n_tokens == 0, "part 1 of 2 reached the plugin (%d calls) or "
                      "moved the plan (%lld tokens)", g_calls[18] - before, (long long)chunked.n_tokens);
                CHECK_ERR(ei_profile_chunk(x, &p0, &L.tq, &L.tk, &chunked, 0, 1), EI_OK);
                CHECK_ERR(ei_plan_finalize(x, &chunked), EI_OK);
                CHECK(g_calls[18] == before + 1 && chunked.n_tokens == 64 && chunked.final == 1,
                      "profile_chunk calls %d (1 expected), plan covers %lld tokens, final %d", g_calls[18] - before,
                      (long long)chunked.n_tokens, (int)chunked.final);
                CHECK_ERR(ei_profile_chunk(x, &t2, &L.tq, &L.tk, &chunked, 0, 1), EI_OK);
                CHECK(g_calls[18] == before + 2, "a call on 2 threads: %d plugin calls (1 expected)", g_calls[18] - before - 1);
                CHECK_ERR(ei_profile_chunk(x, &e, NULL, &L.tk, &chunked, 32, 1), EI_ERR_STATE);
                CHECK(g_calls[18] == before + 2, "a refused call reached the plugin");
                free(pm);
            }
            { /* prefill and decode attention in parts: part 0 launches, once; the merge launches nothing */
                ei_exec p[2];
                ei_out_tensor o1 = L.to;
                ei_tensor q1 = L.tq;
                int i, attn = g_calls[9];
                CHECK_ERR(sizes_for(x, 64, 4, 2, 8, 0, 2, &sz), EI_OK);
                p[0] = ex_part(0, 2, malloc(sz.workspace ? sz.workspace : 1), sz.workspace);
                p[1] = ex_part(1, 2, p[0].workspace, sz.workspace);
                for (i = 0; i < 2; ++i) CHECK_ERR(ei_attention_prefill(x, &p[i], &L.tq, &L.tk, &L.tv, NULL, &L.to, 0), EI_OK);
                CHECK(g_calls[9] == attn + 1, "prefill in 2 parts: %d plugin calls (1 expected)", g_calls[9] - attn);
                q1.n_tokens = 1; o1.n_tokens = 1;
                for (i = 0; i < 2; ++i) CHECK_ERR(ei_attention_decode(x, &p[i], &q1, &L.tk, &L.tv, NULL, &o1, 63), EI_OK);
                for (i = 0; i < 2; ++i) CHECK_ERR(ei_attention_decode_merge(x, &p[i], &o1), EI_OK);
                CHECK(g_calls[9] == attn + 2, "decode in 2 parts and its merge: %d plugin calls (1 expected)",
                      g_calls[9] - attn - 1);
                free(p[0].workspace);
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

/* EI_RANK_ANTIDIAGONAL (named by `name`) has no CUDA kernels: on the
   plugin's backend every profiling entry refuses it (EI_ERR_UNSUPPORTED,
   naming the ranking) before the plugin is called, rather than plan with
   another ranking; the same context still runs attention on the GPU
   (EI_RANK_PRECISION_INT8 was refused so until ABI 17). */
static void test_cpu_ranking_refused(const char *dir, ei_ranking ranking, ei_rank_precision precision, ei_rank_rows rows,
                                     const char *name) {
    char good[600];
    ei_context *x = NULL;
    ei_config c;
    layer L;
    ei_plan plan, chunked;
    void *ws, *pm = malloc(1 << 20);
    size_t wsb = 1 << 16;
    int before;
    ei_sizes sz;
    ei_exec e, e2, p0;
    snprintf(good, sizeof good, "%s/fake_cuda.so", dir);
    c = cfg_with(good, EI_BACKEND_CUDA);
    c.ranking = ranking;
    c.rank_precision = precision;
    c.rank_rows = rows;
    CHECK_ERR(ei_context_create(&c, &x), EI_OK);
    if (!x) { free(pm); return; }
    layer_make(&L, 64, 4, 2, 8);
    ws = malloc(wsb);
    e = ex(1, ws, wsb); e2 = ex(2, ws, wsb); p0 = ex_part(0, 2, ws, wsb);
    CHECK_ERR(ei_plan_init(x, &plan, 64, 2, 8, 0, NULL, 0), EI_OK);
    CHECK_ERR(ei_plan_init(x, &chunked, 64, 2, 8, EI_PLAN_CHUNKED, pm, 1 << 20), EI_OK);
    memset(g_calls, 0, 32 * sizeof(int));
    /* every size but planning's, which this context cannot run (0; ei_profile says why) */
    CHECK_ERR(sizes_for(x, 64, 4, 2, 8, 0, 1, &sz), EI_OK);
    CHECK(sz.profile == 0 && sz.plan > 0 && sz.decoder > 0 && sz.decode_keep > 0, /* (the fake's attention needs none) */
          "sizes of a context that cannot plan: plan %zu decoder %zu profile %zu prefill %zu decode %zu keep %zu", sz.plan,
          sz.decoder, sz.profile, sz.prefill, sz.decode, sz.decode_keep);
    before = calls_total();
    CHECK_ERR(ei_profile(x, &e, &L.tq, &L.tk, &plan), EI_ERR_UNSUPPORTED);
    CHECK(strstr(ei_last_error(), name) != NULL && strstr(ei_last_error(), "CPU") != NULL, "%s", ei_last_error());
    CHECK_ERR(ei_profile(x, &e2, &L.tq, &L.tk, &plan), EI_ERR_UNSUPPORTED);
    CHECK_ERR(ei_profile(x, &p0, &L.tq, &L.tk, &plan), EI_ERR_UNSUPPORTED);
    CHECK_ERR(ei_profile_chunk(x, &e, &L.tq, &L.tk, &chunked, 0, 1), EI_ERR_UNSUPPORTED);
    CHECK_ERR(ei_profile_chunk(x, &e2, &L.tq, &L.tk, &chunked, 0, 1), EI_ERR_UNSUPPORTED);
    CHECK_ERR(ei_profile_chunk(x, &p0, &L.tq, &L.tk, &chunked, 0, 1), EI_ERR_UNSUPPORTED);
    CHECK(calls_total() == before && plan.n_tokens == 0 && chunked.n_tokens == 0,
          "a refused %s call reached the plugin (%d calls) or moved a plan", name, calls_total() - before);
    CHECK_ERR(ei_attention_prefill(x, &e, &L.tq, &L.tk, &L.tv, NULL, &L.to, 0), EI_OK);
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
    test_cpu_ranking_refused(dir, EI_RANK_ANTIDIAGONAL, EI_RANK_PRECISION_F32, EI_RANK_ROWS_EVEN, "EI_RANK_ANTIDIAGONAL");
    dlclose(h);
    printf("test_plugin: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
