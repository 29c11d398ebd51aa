/* Threads: several threads share one ei_context and one plan, as an engine's
   thread pool would, and their results must equal single-threaded ones bit
   for bit. Built with -fsanitize=thread by `make test-tsan`, so any data race
   inside the library is reported.

   Per SIMD path and per budget mode (ragged, per-segment max), each round:
     1. plan: threads profile disjoint kv-head ranges of one shared plan
        (ei_profile_heads), one thread finalises (ei_plan_finalize);
     2. chunked plan: per chunk, threads plan disjoint kv-head ranges of one
        shared chunked plan (ei_profile_chunk_heads);
     3. attend: threads run ei_attention_prefill with ith/nth on the shared
        plan into one shared output;
     4. mixed: at the same time, two threads profile layer 1, two attend
        layer 2 (bf16), and every thread decodes its own layer (f32, bf16,
        f16; own decoder and
        keep set, shared context), and each thread triggers a different
        error and checks that ei_last_error (thread-local) names its own code;
     5. the library's helpers ei_profile_mt / ei_attention_prefill_mt.

   EI_TEST_SIMD=scalar|avx2|avx512|neon restricts the SIMD paths;
   EI_TEST_THREADS (default 4) and EI_TEST_ROUNDS (default 2). */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include <pthread.h>

static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
#define CHECK_LOCK() pthread_mutex_lock(&report_lock)
#define CHECK_UNLOCK() pthread_mutex_unlock(&report_lock)
#include "check.h"

/* ------------------------------------------------------------ layers */
enum { N_LAYERS = 4, N = 400, HEADS = 8, KV = 4, DIM = 32, CHUNK = 128 };
typedef struct layer {
    void *q, *k, *v;
    ei_dtype dtype;
    ei_tensor tq, tk, tv;
} layer;
static layer layers[N_LAYERS];
/* Replace an f32 array by its f16/bf16 conversion. */
static void to16(void **p, size_t n, ei_dtype dt) {
    void *y = to_dtype((const float *)*p, n, dt);
    free(*p);
    *p = y;
}

static void make_layers(void) {
    int l;
    long i;
    for (l = 0; l < N_LAYERS; ++l) {
        layer *L = &layers[l];
        L->q = (float *)malloc(sizeof(float) * N * HEADS * DIM);
        L->k = (float *)malloc(sizeof(float) * N * KV * DIM);
        L->v = (float *)malloc(sizeof(float) * N * KV * DIM);
        synth_qk((float *)L->q, (float *)L->k, N, HEADS, KV, DIM, 64, 2, 100 + (uint64_t)l);
        for (i = 0; i < (long)N * KV * DIM; ++i)
            ((float *)L->v)[i] = (float)((i * 2654435761u + (unsigned)l) % 2001u) / 1000.0f - 1.0f;
        L->dtype = l == 2 ? EI_BF16 : l == 3 ? EI_F16 : EI_F32; /* layers 2, 3: 16-bit kernels */
        if (L->dtype != EI_F32) {
            to16(&L->q, (size_t)N * HEADS * DIM, L->dtype);
            to16(&L->k, (size_t)N * KV * DIM, L->dtype);
            to16(&L->v, (size_t)N * KV * DIM, L->dtype);
        }
        L->tq = ei_tensor_make(L->q, L->dtype, N, HEADS, DIM);
        L->tk = ei_tensor_make(L->k, L->dtype, N, KV, DIM);
        L->tv = ei_tensor_make(L->v, L->dtype, N, KV, DIM);
    }
}
/* Queries in the chunk starting at token t (chunked planning, CHUNK at a time). */
static long chunk_tokens(long t) { return t + CHUNK < N ? (long)CHUNK : (long)N - t; }
/* Query row t of layer l as a one-token view. */
static ei_tensor query_row(const layer *L, long t) {
    size_t es = L->dtype == EI_F32 ? 4 : 2;
    return ei_tensor_make((const unsigned char *)L->q + (size_t)t * HEADS * DIM * es, L->dtype, 1, HEADS, DIM);
}

/* ------------------------------------------------------------ per-layer results */
typedef struct results {
    ei_plan plan, chunked;
    float *out;            /* attention output [N][HEADS][DIM] */
    int32_t *keep;         /* keep set index [KV][capacity] */
    int32_t n_kept;
} results;

static size_t out_bytes(void) { return sizeof(float) * N * HEADS * DIM; }

static int plans_equal(const ei_plan *a, const ei_plan *b) {
    size_t rows = (size_t)a->n_kv_heads * (size_t)a->seg_capacity;
    return a->n_segments == b->n_segments && a->n_tokens == b->n_tokens && a->final == b->final &&
           !memcmp(a->entropy, b->entropy, rows * 4) && !memcmp(a->head_class, b->head_class, (size_t)a->n_kv_heads) &&
           !memcmp(a->budget, b->budget, rows * 4) && !memcmp(a->keep_blocks, b->keep_blocks, rows * 4) &&
           !memcmp(a->keep_count, b->keep_count, rows * 4) &&
           !memcmp(a->block_index, b->block_index, rows * (size_t)a->max_keep * 4);
}

/* Decode one layer single-threaded-style (used by the reference and by each thread). */
static ei_result decode_layer(const ei_context *ctx, int l, int32_t *keep_out, int32_t *n_kept) {
    const ei_config *c = ei_context_config(ctx);
    const layer *L = &layers[l];
    ei_decoder dec;
    ei_keep_set ks;
    size_t db, wb, ib = sizeof(int32_t) * KV * (size_t)c->decode_budget, mb = (size_t)KV * N;
    void *dm, *ws;
    ei_tensor prompt = L->tq, kt = L->tk;
    long t;
    ei_result r;
    ei_decoder_size(ctx, HEADS, DIM, &db);
    ei_decode_workspace_size(ctx, N, HEADS, KV, &wb);
    dm = guarded_alloc(db);
    ws = guarded_alloc(wb);
    r = ei_decoder_init(ctx, &dec, HEADS, KV, DIM, dm, db);
    memset(&ks, 0, sizeof ks);
    ks.heads_out = KV;
    ks.capacity = c->decode_budget;
    ks.index = (int32_t *)guarded_alloc(ib);
    ks.mask = (uint8_t *)guarded_alloc(mb);
    ks.mask_capacity = N;
    prompt.n_tokens = N - c->decode_gap;
    if (r == EI_OK) r = ei_decode_observe(ctx, &dec, &prompt, 0);
    for (t = N - c->decode_gap; t < N && r == EI_OK; ++t) {
        ei_tensor one = query_row(L, t);
        r = ei_decode_observe(ctx, &dec, &one, 1);
    }
    if (r == EI_OK && !ei_decode_due(ctx, &dec)) r = EI_ERR_STATE;
    if (r == EI_OK) r = ei_decode_keep(ctx, &dec, &kt, &ks, ws, wb);
    if (r == EI_OK) {
        memcpy(keep_out, ks.index, ib);
        *n_kept = ks.n_kept;
    }
    CHECK(guard_intact(dm, db) && guard_intact(ws, wb) && guard_intact(ks.index, ib) && guard_intact(ks.mask, mb),
          "decode guard bytes (layer %d)", l);
    guarded_free(dm); guarded_free(ws); guarded_free(ks.index); guarded_free(ks.mask);
    return r;
}

/* Single-threaded reference for every layer. */
static void reference(const ei_context *ctx, results *ref) {
    const ei_config *c = ei_context_config(ctx);
    int l;
    size_t pw, aw;
    void *ws, *aws;
    ei_profile_workspace_size(ctx, N, HEADS, KV, DIM, &pw);
    ei_attention_workspace_size(ctx, HEADS, KV, DIM, &aw);
    ws = guarded_alloc(pw);
    aws = guarded_alloc(aw);
    for (l = 0; l < N_LAYERS; ++l) {
        layer *L = &layers[l];
        ei_out_tensor o;
        long t;
        CHECK_ERR(ei_plan_alloc(ctx, &ref[l].plan, N, KV, DIM, 0), EI_OK);
        CHECK_ERR(ei_plan_alloc(ctx, &ref[l].chunked, N, KV, DIM, EI_PLAN_CHUNKED), EI_OK);
        CHECK_ERR(ei_profile(ctx, &L->tq, &L->tk, &ref[l].plan, ws, pw), EI_OK);
        for (t = 0; t < N; t += CHUNK) {
            ei_tensor qc = L->tq, kc = L->tk;
            qc.data = query_row(L, t).data;
            qc.n_tokens = chunk_tokens(t);
            kc.n_tokens = t + qc.n_tokens;
            CHECK_ERR(ei_profile_chunk(ctx, &qc, &kc, &ref[l].chunked, t, t + CHUNK >= N, ws, pw), EI_OK);
        }
        ref[l].out = (float *)guarded_alloc(out_bytes());
        o = ei_out_tensor_make(ref[l].out, EI_F32, N, HEADS, DIM);
        CHECK_ERR(ei_attention_prefill(ctx, &L->tq, &L->tk, &L->tv, &ref[l].plan, &o, 0, 0, 1, aws, aw), EI_OK);
        ref[l].keep = (int32_t *)malloc(sizeof(int32_t) * KV * (size_t)c->decode_budget);
        CHECK_ERR(decode_layer(ctx, l, ref[l].keep, &ref[l].n_kept), EI_OK);
    }
    CHECK(guard_intact(ws, pw) && guard_intact(aws, aw), "reference workspace guards");
    guarded_free(ws);
    guarded_free(aws);
}
static void free_results(const ei_context *ctx, results *r) {
    int l;
    for (l = 0; l < N_LAYERS; ++l) {
        ei_plan_free(ctx, &r[l].plan);
        ei_plan_free(ctx, &r[l].chunked);
        guarded_free(r[l].out);
        free(r[l].keep);
    }
}

/* ------------------------------------------------------------ the threaded round */
typedef struct shared {
    const ei_context *ctx;
    int nth;
    pthread_barrier_t barrier;
    results got[N_LAYERS];
    size_t pw, aw;
} shared;
typedef struct worker { shared *S; int ith; } worker;

static void kv_range(int ith, int nth, int32_t *a, int32_t *b) {
    *a = (int32_t)((int64_t)KV * ith / nth);
    *b = (int32_t)((int64_t)KV * (ith + 1) / nth);
}

static void *worker_main(void *arg) {
    worker *W = (worker *)arg;
    shared *S = W->S;
    const ei_context *ctx = S->ctx;
    const ei_config *c = ei_context_config(ctx);
    int ith = W->ith, nth = S->nth, l;
    int32_t a, b;
    void *ws = guarded_alloc(S->pw), *aws = guarded_alloc(S->aw);
    long t;
    kv_range(ith, nth, &a, &b);
    /* 1. plan layer 0: disjoint kv-head ranges of one plan, then one finalize */
    if (a < b) CHECK_ERR(ei_profile_heads(ctx, &layers[0].tq, &layers[0].tk, &S->got[0].plan, a, b, ws, S->pw), EI_OK);
    pthread_barrier_wait(&S->barrier);
    if (ith == 0) CHECK_ERR(ei_plan_finalize(ctx, &S->got[0].plan), EI_OK);
    pthread_barrier_wait(&S->barrier);
    /* 2. chunked plan of layer 0, chunk by chunk, head ranges in parallel */
    for (t = 0; t < N; t += CHUNK) {
        ei_tensor qc = layers[0].tq, kc = layers[0].tk;
        qc.data = query_row(&layers[0], t).data;
        qc.n_tokens = chunk_tokens(t);
        kc.n_tokens = t + qc.n_tokens;
        if (a < b)
            CHECK_ERR(ei_profile_chunk_heads(ctx, &qc, &kc, &S->got[0].chunked, t, t + CHUNK >= N, a, b, ws, S->pw), EI_OK);
        pthread_barrier_wait(&S->barrier);
        if (ith == 0) CHECK_ERR(ei_plan_finalize(ctx, &S->got[0].chunked), EI_OK);
        pthread_barrier_wait(&S->barrier);
    }
    /* 3. attention of layer 0 on the shared plan, ith of nth, one shared output */
    {
        ei_out_tensor o = ei_out_tensor_make(S->got[0].out, EI_F32, N, HEADS, DIM);
        CHECK_ERR(ei_attention_prefill(ctx, &layers[0].tq, &layers[0].tk, &layers[0].tv, &S->got[0].plan, &o, 0, ith, nth,
                                       aws, S->aw), EI_OK);
    }
    pthread_barrier_wait(&S->barrier);
    /* 4. mixed, all at once: threads 0-1 profile layer 1, threads 2-3 attend
       layer 2 densely, then every thread decodes a layer of its own */
    if (nth >= 4) {
        if (ith < 2) {
            int32_t h0 = ith == 0 ? 0 : KV / 2, h1 = ith == 0 ? KV / 2 : KV;
            CHECK_ERR(ei_profile_heads(ctx, &layers[1].tq, &layers[1].tk, &S->got[1].plan, h0, h1, ws, S->pw), EI_OK);
        } else if (ith < 4) {
            ei_out_tensor o = ei_out_tensor_make(S->got[2].out, EI_F32, N, HEADS, DIM);
            /* layer 2 attends densely (plan NULL) in two parts while layer 1 is planned */
            CHECK_ERR(ei_attention_prefill(ctx, &layers[2].tq, &layers[2].tk, &layers[2].tv, NULL, &o, 0, ith - 2, 2, aws,
                                           S->aw), EI_OK);
        }
    }
    /* every thread decodes a layer of its own, all at once */
    if (ith < N_LAYERS) {
        CHECK_ERR(decode_layer(ctx, ith, S->got[ith].keep, &S->got[ith].n_kept), EI_OK);
    }
    /* thread-local error messages: each thread its own code */
    for (l = 0; l < 50; ++l) {
        size_t bytes;
        ei_result r;
        const char *want;
        switch ((ith + l) % 4) {
            case 0: r = ei_plan_size(ctx, 100, 2, 16, 0, NULL); want = "EI_ERR_NULL"; break;
            case 1: r = ei_plan_size(ctx, -1, 2, 16, 0, &bytes); want = "EI_ERR_SIZE"; break;
            case 2: r = ei_profile_workspace_size(ctx, 100, 6, 4, 16, &bytes); want = "EI_ERR_GQA"; break;
            default: r = ei_plan_size(ctx, 100, 2, 16, 0x40, &bytes); want = "EI_ERR_CONFIG"; break;
        }
        CHECK(r != EI_OK && !strcmp(ei_result_name(r), want) && strstr(ei_last_error(), want) == ei_last_error(),
              "thread %d: %s gave message '%s'", ith, want, ei_last_error());
    }
    CHECK(guard_intact(ws, S->pw) && guard_intact(aws, S->aw), "thread %d workspace guards", ith);
    guarded_free(ws);
    guarded_free(aws);
    (void)c;
    return NULL;
}

static void threaded_round(const ei_context *ctx, const results *ref, int nth, const char *what) {
    shared S;
    worker W[64];
    pthread_t tid[64];
    int i, l;
    const ei_config *c = ei_context_config(ctx);
    memset(&S, 0, sizeof S);
    S.ctx = ctx;
    S.nth = nth;
    ei_profile_workspace_size(ctx, N, HEADS, KV, DIM, &S.pw);
    ei_attention_workspace_size(ctx, HEADS, KV, DIM, &S.aw);
    pthread_barrier_init(&S.barrier, NULL, (unsigned)nth);
    for (l = 0; l < N_LAYERS; ++l) {
        CHECK_ERR(ei_plan_alloc(ctx, &S.got[l].plan, N, KV, DIM, 0), EI_OK);
        CHECK_ERR(ei_plan_alloc(ctx, &S.got[l].chunked, N, KV, DIM, EI_PLAN_CHUNKED), EI_OK);
        S.got[l].out = (float *)guarded_alloc(out_bytes());
        S.got[l].keep = (int32_t *)malloc(sizeof(int32_t) * KV * (size_t)c->decode_budget);
        memset(S.got[l].keep, 0xff, sizeof(int32_t) * KV * (size_t)c->decode_budget);
    }
    for (i = 0; i < nth; ++i) {
        W[i].S = &S;
        W[i].ith = i;
        if (pthread_create(&tid[i], NULL, worker_main, &W[i]) != 0) { printf("pthread_create failed\n"); exit(2); }
    }
    for (i = 0; i < nth; ++i) pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&S.barrier);
    /* layer 1's plan was profiled in two halves by threads 0 and 1 */
    if (nth >= 4) CHECK_ERR(ei_plan_finalize(ctx, &S.got[1].plan), EI_OK);
    CHECK(plans_equal(&S.got[0].plan, &ref[0].plan), "%s: plan from %d threads differs from single-threaded", what, nth);
    CHECK(plans_equal(&S.got[0].chunked, &ref[0].chunked), "%s: chunked plan from %d threads differs", what, nth);
    CHECK(guard_intact(S.got[0].out, out_bytes()) && !memcmp(S.got[0].out, ref[0].out, out_bytes()),
          "%s: attention with ith/nth (%d threads) differs from nth = 1", what, nth);
    if (nth >= 4) {
        CHECK(plans_equal(&S.got[1].plan, &ref[1].plan), "%s: layer 1 plan (profiled during attention) differs", what);
        {
            /* dense reference of layer 2 */
            size_t aw;
            void *aws;
            float *dense = (float *)guarded_alloc(out_bytes());
            ei_out_tensor o = ei_out_tensor_make(dense, EI_F32, N, HEADS, DIM);
            ei_attention_workspace_size(ctx, HEADS, KV, DIM, &aw);
            aws = guarded_alloc(aw);
            CHECK_ERR(ei_attention_prefill(ctx, &layers[2].tq, &layers[2].tk, &layers[2].tv, NULL, &o, 0, 0, 1, aws, aw), EI_OK);
            CHECK(!memcmp(dense, S.got[2].out, out_bytes()), "%s: dense attention of layer 2 in 2 parts differs", what);
            guarded_free(aws);
            guarded_free(dense);
        }
    }
    for (l = 0; l < N_LAYERS && l < nth; ++l)
        CHECK(S.got[l].n_kept == ref[l].n_kept &&
                  !memcmp(S.got[l].keep, ref[l].keep, sizeof(int32_t) * KV * (size_t)ref[l].n_kept),
              "%s: keep set of layer %d decoded concurrently differs", what, l);
    free_results(ctx, S.got);
}

/* The library's own helpers against the reference. */
static void helpers_round(const ei_context *ctx, const results *ref, int nth, const char *what) {
    ei_plan p;
    size_t pw, aw;
    void *ws, *aws;
    float *out = (float *)guarded_alloc(out_bytes());
    ei_out_tensor o = ei_out_tensor_make(out, EI_F32, N, HEADS, DIM);
    ei_profile_workspace_size(ctx, N, HEADS, KV, DIM, &pw);
    ei_attention_workspace_size(ctx, HEADS, KV, DIM, &aw);
    ws = guarded_alloc(pw * (size_t)nth);
    aws = guarded_alloc(aw * (size_t)nth);
    CHECK_ERR(ei_plan_alloc(ctx, &p, N, KV, DIM, 0), EI_OK);
    CHECK_ERR(ei_profile_mt(ctx, &layers[0].tq, &layers[0].tk, &p, nth, ws, pw * (size_t)nth), EI_OK);
    CHECK(plans_equal(&p, &ref[0].plan), "%s: ei_profile_mt(%d) differs", what, nth);
    CHECK_ERR(ei_attention_prefill_mt(ctx, &layers[0].tq, &layers[0].tk, &layers[0].tv, &p, &o, 0, nth, aws, aw * (size_t)nth),
              EI_OK);
    CHECK(!memcmp(out, ref[0].out, out_bytes()), "%s: ei_attention_prefill_mt(%d) differs", what, nth);
    CHECK(guard_intact(ws, pw * (size_t)nth) && guard_intact(aws, aw * (size_t)nth) && guard_intact(out, out_bytes()),
          "%s: helper guards", what);
    ei_plan_free(ctx, &p);
    guarded_free(ws);
    guarded_free(aws);
    guarded_free(out);
}

int main(void) {
    int p, per, round, nth = env_int("EI_TEST_THREADS", 4), rounds = env_int("EI_TEST_ROUNDS", 2);
    if (nth < 1) nth = 1;
    if (nth > 64) nth = 64;
    printf("entropyinfer %s thread tests: %d threads, %d rounds\n", EI_VERSION_STRING, nth, rounds);
    make_layers();
    for (p = EI_SIMD_SCALAR; p < TEST_SIMD_END; ++p)
        for (per = 0; per < 2; ++per) {
            ei_config c = ei_config_default();
            ei_context *ctx;
            results ref[N_LAYERS];
            char what[64];
            if (!test_simd_selected((ei_simd)p)) continue;
            c.segment_size = 64; c.block_size = 8; c.base_budget = 64; c.threshold_len = 128;
            c.decode_budget = 96; c.window = 16; c.decode_gap = 4;
            c.per_segment_budget = per;
            c.simd = (ei_simd)p;
            snprintf(what, sizeof what, "%s/%s", ei_simd_name((ei_simd)p), per ? "per-segment" : "ragged");
            CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
            memset(ref, 0, sizeof ref);
            reference(ctx, ref);
            for (round = 0; round < rounds; ++round) {
                threaded_round(ctx, ref, nth, what);
                if (nth > 1) threaded_round(ctx, ref, nth - 1, what); /* uneven head ranges */
                helpers_round(ctx, ref, nth, what);
            }
            free_results(ctx, ref);
            ei_context_destroy(ctx);
            printf("  %s: done\n", what);
        }
    {
        int l;
        for (l = 0; l < N_LAYERS; ++l) { free(layers[l].q); free(layers[l].k); free(layers[l].v); }
    }
    return check_summary();
}
