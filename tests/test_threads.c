/* Threads: several threads share one ei_context and one plan, as an engine's
   thread pool would, and their results must equal single-threaded ones bit
   for bit. Built with -fsanitize=thread by `make test-tsan`, so any data race
   inside the library is reported.

   Per SIMD path and per budget mode (ragged, per-segment max), each round
   runs these phases, one after another:
     0. contexts: every thread creates and destroys a context of its own from
        the shared one's configuration;
     1. plan: threads profile disjoint kv-head ranges of one shared plan
        (ei_profile_heads), one thread finalises (ei_plan_finalize);
     2. chunked plan: per chunk, threads plan disjoint kv-head ranges of one
        shared chunked plan (ei_profile_chunk_heads), one thread finalises;
     3. attend: threads run ei_attention_prefill with ith/nth on the shared
        plan into one shared output (disjoint parts of it);
     4. score: threads run ei_decode_score with ith/nth on ONE shared decoder
        per layer (the manual: it only reads the decoder) into one shared
        score array per layer (disjoint query-head rows), odd layers through
        a shared row map;
     5. mixed: at the same time, two threads profile layer 1, two attend
        layer 2 (bf16), and every thread decodes its own layer (f32, bf16,
        f16; own decoder and keep set, shared context), and each thread
        triggers a different error and checks that ei_last_error
        (thread-local) names its own code, while the context's logger
        (thread-safe, as THREADS asks) hears every thread's messages;
   then, on the main thread, the library's helpers ei_profile_mt /
   ei_profile_chunk_mt /
   ei_attention_prefill_mt against the same references, and a failure
   inside one of their workers (NaN in the last kv head's keys, in the last
   query) returned with its message to the caller (the helpers run on the
   context's kept workers, call after call); and three threads calling
   ei_profile_mt on the shared context at once (one has the workers, the
   others start threads of their own).

   Two forms of the phase boundaries (EI_TEST_SYNC=barrier|join|both,
   default both):
     barrier  nth threads run every phase, a pthread barrier between phases
              (an engine's persistent pool);
     join     every phase starts its threads and joins them: pthread_create
              and pthread_join are the only synchronisation, and TSan sees
              every happens-before edge exactly.
   TSan turns pthread_barrier_wait into a release on the barrier before the
   wait and an acquire after it, one sync clock for every round: a thread
   slow to return from round r acquires what a fast thread already released
   on entering round r + 1, the writes of the phase between them included,
   so a race inside a phase mostly goes unseen in the barrier form.
   EI_TEST_SELFTEST_RACE=1 (not run by default) adds a phase, after the
   attention, in which threads 0 and 1 both write one shared int: under
   TSan the run must stop on it. Measured with the clang 14 TSan build
   (build/hardening/test_threads_tsan, TSAN_OPTIONS=halt_on_error=1, a
   2-core Intel Xeon with AVX-512 BF16), default threads and rounds:
     EI_TEST_SYNC=join    EI_TEST_SELFTEST_RACE=1  reported, 5 runs of 5 (exit 66)
     EI_TEST_SYNC=barrier EI_TEST_SELFTEST_RACE=1  reported in 1 run of 10
                                                    (32 racy phases per run)

   Stack use: every public entry point that does work runs, at real
   models' head shapes (prefill 16 query and 8 kv heads, decode 32 and 8,
   head_dim 128), on a thread of its own whose stack is STACK_BYTES (64 KiB)
   of memory painted with a pattern, with STACK_GUARD bytes of PROT_NONE
   below it. Each call's high-water mark (the painted bytes it overwrote,
   counted from the thread's first frame down) is printed and must stay
   within STACK_BOUND (24 KiB, the manual's LIMITS); an overflow is a SIGSEGV in the guard,
   reported as a failure of that call (the test goes on). Covered:
   ei_profile and ei_profile_chunk (reference and sampled ranking),
   ei_profile_mt (2 and 8 threads), ei_attention_prefill (f32, f16, bf16),
   ei_attention_prefill_mt (2 and 8), ei_decode_observe, ei_decode_keep,
   ei_decode_keep_mt (2 and 8), ei_decode_score, ei_decode_select,
   ei_attention_decode + merge (1 and 3 slices), ei_attention_decode_mt (2
   and 8), ei_attention_decode_keep(_mt) through the keep set just selected,
   ei_decode_shared_add, ei_decode_select_shared, ei_kv_compact and a
   refused call that formats its message for a logger, on every SIMD path
   this CPU runs; ei_context_create (EI_SIMD_AUTO, a sampled-ranking config,
   EI_BACKEND_CUDA_OR_CPU: dlopen). The *_mt helpers' workers run on stacks
   the library creates: only the calling thread's share is measured. A
   call's first use of a libc function includes the dynamic linker's lazy
   binding (up to about 3 KB more; LD_BIND_NOW=1 measures without it).
   Not measured under a sanitizer (other frames, fake stacks) or valgrind
   (memcheck forbids reading a dead stack).

   EI_TEST_SIMD=scalar|avx2|avx512|neon restricts the SIMD paths;
   EI_TEST_THREADS (default 4) and EI_TEST_ROUNDS (default 2). */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

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

/* Row map of the odd layers' scoring (row j holds position j, as a map). */
static int32_t identity_pos[N];

/* ------------------------------------------------------------ per-layer results */
typedef struct results {
    ei_plan plan, chunked;
    float *out;            /* attention output [N][HEADS][DIM] */
    int32_t *keep;         /* keep set index [KV][capacity] */
    int32_t n_kept;
    float *scores;         /* ei_decode_score of dec [HEADS][N] */
    ei_decoder dec;        /* reference only: observed, then shared read-only by the score phase */
    void *dec_mem;
} results;

/* The contexts' logger, called from several threads at once (THREADS). */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static long log_messages;
static void count_logger(void *user, ei_result code, const char *message) {
    pthread_mutex_lock(&log_lock);
    log_messages += code != EI_OK && message && message[0];
    pthread_mutex_unlock(&log_lock);
    (void)user;
}
static long logged(void) {
    long n;
    pthread_mutex_lock(&log_lock);
    n = log_messages;
    pthread_mutex_unlock(&log_lock);
    return n;
}

static size_t out_bytes(void) { return sizeof(float) * N * HEADS * DIM; }
static size_t score_bytes(void) { return sizeof(float) * HEADS * N; }
static const int32_t *score_map(int l) { return l & 1 ? identity_pos : NULL; }

static int plans_equal(const ei_plan *a, const ei_plan *b) {
    size_t rows = (size_t)a->n_kv_heads * (size_t)a->seg_capacity;
    return a->n_segments == b->n_segments && a->n_tokens == b->n_tokens && a->final == b->final &&
           !memcmp(a->entropy, b->entropy, rows * 4) && !memcmp(a->head_class, b->head_class, (size_t)a->n_kv_heads) &&
           !memcmp(a->budget, b->budget, rows * 4) && !memcmp(a->keep_blocks, b->keep_blocks, rows * 4) &&
           !memcmp(a->keep_count, b->keep_count, rows * 4) &&
           !memcmp(a->block_index, b->block_index, rows * (size_t)a->max_keep * 4);
}

/* The decode protocol's observations of layer l: the prompt but its last
   decode_gap queries, then those one at a time as generated tokens. */
static ei_result observe_layer(const ei_context *ctx, int l, ei_decoder *dec) {
    const ei_config *c = ei_context_config(ctx);
    const layer *L = &layers[l];
    ei_tensor prompt = L->tq;
    long t;
    ei_result r;
    prompt.n_tokens = N - c->decode_gap;
    r = ei_decode_observe(ctx, dec, &prompt, 0, 0);
    for (t = N - c->decode_gap; t < N && r == EI_OK; ++t) {
        ei_tensor one = query_row(L, t);
        r = ei_decode_observe(ctx, dec, &one, t, 1);
    }
    return r;
}

/* Decode one layer single-threaded-style (used by the reference and by each thread). */
static ei_result decode_layer(const ei_context *ctx, int l, int32_t *keep_out, int32_t *n_kept) {
    const ei_config *c = ei_context_config(ctx);
    const layer *L = &layers[l];
    ei_decoder dec;
    ei_keep_set ks;
    size_t db, wb, ib = sizeof(int32_t) * KV * (size_t)c->decode_budget, mb = (size_t)KV * N;
    void *dm, *ws;
    ei_tensor kt = L->tk;
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
    if (r == EI_OK) r = observe_layer(ctx, l, &dec);
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
    size_t pw, aw, dw, db;
    void *ws, *aws, *dws;
    ei_profile_workspace_size(ctx, N, HEADS, KV, DIM, &pw);
    ei_attention_workspace_size(ctx, HEADS, KV, DIM, &aw);
    ei_decode_workspace_size(ctx, N, HEADS, KV, &dw);
    ei_decoder_size(ctx, HEADS, DIM, &db);
    ws = guarded_alloc(pw);
    aws = guarded_alloc(aw);
    dws = guarded_alloc(dw);
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
        /* the decoder the score phase shares, and its scores from one call */
        ref[l].dec_mem = guarded_alloc(db);
        CHECK_ERR(ei_decoder_init(ctx, &ref[l].dec, HEADS, KV, DIM, ref[l].dec_mem, db), EI_OK);
        CHECK_ERR(observe_layer(ctx, l, &ref[l].dec), EI_OK);
        ref[l].scores = (float *)guarded_alloc(score_bytes());
        CHECK_ERR(ei_decode_score(ctx, &ref[l].dec, &L->tk, score_map(l), 0, ref[l].scores, 0, 1, dws, dw), EI_OK);
    }
    CHECK(guard_intact(ws, pw) && guard_intact(aws, aw) && guard_intact(dws, dw), "reference workspace guards");
    guarded_free(ws);
    guarded_free(aws);
    guarded_free(dws);
}
static void free_results(const ei_context *ctx, results *r) {
    int l;
    for (l = 0; l < N_LAYERS; ++l) {
        ei_plan_free(ctx, &r[l].plan);
        ei_plan_free(ctx, &r[l].chunked);
        guarded_free(r[l].out);
        guarded_free(r[l].scores);
        guarded_free(r[l].dec_mem);
        free(r[l].keep);
    }
}

/* ------------------------------------------------------------ the threaded round */
enum { MAX_THREADS = 64, MAX_PHASES = 32 };
typedef struct shared shared;
/* A phase: fn(S, ith, arg) on every thread (only0: on thread 0 alone). */
typedef void (*phase_fn)(shared *S, int ith, long arg);
typedef struct phase { const char *name; phase_fn fn; long arg; int only0; } phase;
struct shared {
    const ei_context *ctx;
    const results *ref;       /* its decoders are shared, read-only, by the score phase */
    int nth;
    pthread_barrier_t barrier;
    results got[N_LAYERS];
    size_t pw, aw, dw;
    void *ws[MAX_THREADS], *aws[MAX_THREADS], *dws[MAX_THREADS]; /* per-thread workspaces */
    phase phases[MAX_PHASES];
    int n_phases;
    int racy;                 /* EI_TEST_SELFTEST_RACE: written by threads 0 and 1 in one phase */
};
typedef struct worker { shared *S; int ith, phase; } worker;

static void kv_range(int ith, int nth, int32_t *a, int32_t *b) {
    *a = (int32_t)((int64_t)KV * ith / nth);
    *b = (int32_t)((int64_t)KV * (ith + 1) / nth);
}

/* 0. a context per thread, from the shared one's configuration */
static void ph_contexts(shared *S, int ith, long arg) {
    ei_context *own = NULL;
    CHECK_ERR(ei_context_create(ei_context_config(S->ctx), &own), EI_OK);
    CHECK(own && ei_context_simd(own) == ei_context_simd(S->ctx), "thread %d: its own context has another SIMD path", ith);
    ei_context_destroy(own);
    (void)arg;
}
/* 1. plan layer 0: disjoint kv-head ranges of one plan */
static void ph_profile(shared *S, int ith, long arg) {
    int32_t a, b;
    kv_range(ith, S->nth, &a, &b);
    if (a < b)
        CHECK_ERR(ei_profile_heads(S->ctx, &layers[0].tq, &layers[0].tk, &S->got[0].plan, a, b, S->ws[ith], S->pw), EI_OK);
    (void)arg;
}
/* 1, 2. one thread finalises (arg 0: the plan, 1: the chunked plan) */
static void ph_finalize(shared *S, int ith, long arg) {
    CHECK_ERR(ei_plan_finalize(S->ctx, arg ? &S->got[0].chunked : &S->got[0].plan), EI_OK);
    (void)ith;
}
/* 2. the chunk of layer 0 that starts at token arg, kv-head ranges in parallel */
static void ph_chunk(shared *S, int ith, long t) {
    ei_tensor qc = layers[0].tq, kc = layers[0].tk;
    int32_t a, b;
    kv_range(ith, S->nth, &a, &b);
    qc.data = query_row(&layers[0], t).data;
    qc.n_tokens = chunk_tokens(t);
    kc.n_tokens = t + qc.n_tokens;
    if (a < b)
        CHECK_ERR(ei_profile_chunk_heads(S->ctx, &qc, &kc, &S->got[0].chunked, t, t + CHUNK >= N, a, b, S->ws[ith], S->pw),
                  EI_OK);
}
/* 3. attention of layer 0 on the shared plan, ith of nth, one shared output */
static void ph_attend(shared *S, int ith, long arg) {
    ei_out_tensor o = ei_out_tensor_make(S->got[0].out, EI_F32, N, HEADS, DIM);
    CHECK_ERR(ei_attention_prefill(S->ctx, &layers[0].tq, &layers[0].tk, &layers[0].tv, &S->got[0].plan, &o, 0, ith, S->nth,
                                   S->aws[ith], S->aw), EI_OK);
    (void)arg;
}
/* 4. every layer's scores, ith of nth, from one decoder shared by all threads */
static void ph_score(shared *S, int ith, long arg) {
    int l;
    for (l = 0; l < N_LAYERS; ++l)
        CHECK_ERR(ei_decode_score(S->ctx, &S->ref[l].dec, &layers[l].tk, score_map(l), 0, S->got[l].scores, ith, S->nth,
                                  S->dws[ith], S->dw), EI_OK);
    (void)arg;
}
/* EI_TEST_SELFTEST_RACE: a plain data race, which TSan must report */
static void ph_race(shared *S, int ith, long arg) {
    if (ith < 2) S->racy += ith + 1;
    (void)arg;
}
/* 5. mixed, all at once: threads 0-1 profile layer 1, threads 2-3 attend
   layer 2 densely, then every thread decodes a layer of its own, then each
   thread's errors */
static void ph_mixed(shared *S, int ith, long arg) {
    const ei_context *ctx = S->ctx;
    int nth = S->nth, l;
    if (nth >= 4) {
        if (ith < 2) {
            int32_t h0 = ith == 0 ? 0 : KV / 2, h1 = ith == 0 ? KV / 2 : KV;
            CHECK_ERR(ei_profile_heads(ctx, &layers[1].tq, &layers[1].tk, &S->got[1].plan, h0, h1, S->ws[ith], S->pw), EI_OK);
        } else if (ith < 4) {
            ei_out_tensor o = ei_out_tensor_make(S->got[2].out, EI_F32, N, HEADS, DIM);
            /* layer 2 attends densely (plan NULL) in two parts while layer 1 is planned */
            CHECK_ERR(ei_attention_prefill(ctx, &layers[2].tq, &layers[2].tk, &layers[2].tv, NULL, &o, 0, ith - 2, 2,
                                           S->aws[ith], S->aw), EI_OK);
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
    (void)arg;
}

static void add_phase(shared *S, const char *name, phase_fn fn, long arg, int only0) {
    phase *P = &S->phases[S->n_phases++];
    if (S->n_phases > MAX_PHASES) { printf("too many phases\n"); exit(2); }
    P->name = name; P->fn = fn; P->arg = arg; P->only0 = only0;
}
static void build_phases(shared *S, int race) {
    long t;
    add_phase(S, "contexts", ph_contexts, 0, 0);
    add_phase(S, "profile", ph_profile, 0, 0);
    add_phase(S, "finalize", ph_finalize, 0, 1);
    for (t = 0; t < N; t += CHUNK) {
        add_phase(S, "chunk", ph_chunk, t, 0);
        add_phase(S, "finalize chunked", ph_finalize, 1, 1);
    }
    add_phase(S, "attend", ph_attend, 0, 0);
    if (race) add_phase(S, "race", ph_race, 0, 0);
    add_phase(S, "score", ph_score, 0, 0);
    add_phase(S, "mixed", ph_mixed, 0, 0);
}

/* barrier form: each thread runs every phase, a barrier after each */
static void *barrier_worker(void *arg) {
    worker *W = (worker *)arg;
    shared *S = W->S;
    int i;
    for (i = 0; i < S->n_phases; ++i) {
        const phase *P = &S->phases[i];
        if (!P->only0 || W->ith == 0) P->fn(S, W->ith, P->arg);
        pthread_barrier_wait(&S->barrier);
    }
    return NULL;
}
/* join form: a thread runs one phase */
static void *phase_worker(void *arg) {
    worker *W = (worker *)arg;
    const phase *P = &W->S->phases[W->phase];
    P->fn(W->S, W->ith, P->arg);
    return NULL;
}
static void start(pthread_t *tid, void *(*fn)(void *), worker *W) {
    if (pthread_create(tid, NULL, fn, W) != 0) { printf("pthread_create failed\n"); exit(2); }
}

enum { FORM_BARRIER = 1, FORM_JOIN = 2 };
static const char *form_name(int form) { return form == FORM_JOIN ? "join" : "barrier"; }

static void threaded_round(const ei_context *ctx, const results *ref, int nth, int form, int race, const char *what) {
    shared S;
    worker W[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int i, l, ph;
    const ei_config *c = ei_context_config(ctx);
    long logged0 = logged();
    memset(&S, 0, sizeof S);
    S.ctx = ctx;
    S.ref = ref;
    S.nth = nth;
    ei_profile_workspace_size(ctx, N, HEADS, KV, DIM, &S.pw);
    ei_attention_workspace_size(ctx, HEADS, KV, DIM, &S.aw);
    ei_decode_workspace_size(ctx, N, HEADS, KV, &S.dw);
    build_phases(&S, race);
    for (l = 0; l < N_LAYERS; ++l) {
        CHECK_ERR(ei_plan_alloc(ctx, &S.got[l].plan, N, KV, DIM, 0), EI_OK);
        CHECK_ERR(ei_plan_alloc(ctx, &S.got[l].chunked, N, KV, DIM, EI_PLAN_CHUNKED), EI_OK);
        S.got[l].out = (float *)guarded_alloc(out_bytes());
        S.got[l].scores = (float *)guarded_alloc(score_bytes());
        S.got[l].keep = (int32_t *)malloc(sizeof(int32_t) * KV * (size_t)c->decode_budget);
        memset(S.got[l].keep, 0xff, sizeof(int32_t) * KV * (size_t)c->decode_budget);
    }
    for (i = 0; i < nth; ++i) {
        S.ws[i] = guarded_alloc(S.pw);
        S.aws[i] = guarded_alloc(S.aw);
        S.dws[i] = guarded_alloc(S.dw);
        W[i].S = &S;
        W[i].ith = i;
        W[i].phase = 0;
    }
    if (form == FORM_BARRIER) {
        pthread_barrier_init(&S.barrier, NULL, (unsigned)nth);
        for (i = 0; i < nth; ++i) start(&tid[i], barrier_worker, &W[i]);
        for (i = 0; i < nth; ++i) pthread_join(tid[i], NULL);
        pthread_barrier_destroy(&S.barrier);
    } else
        for (ph = 0; ph < S.n_phases; ++ph) {
            int n = S.phases[ph].only0 ? 1 : nth;
            for (i = 0; i < n; ++i) {
                W[i].phase = ph;
                start(&tid[i], phase_worker, &W[i]);
            }
            for (i = 0; i < n; ++i) pthread_join(tid[i], NULL);
        }
    for (i = 0; i < nth; ++i) {
        CHECK(guard_intact(S.ws[i], S.pw) && guard_intact(S.aws[i], S.aw) && guard_intact(S.dws[i], S.dw),
              "%s: thread %d workspace guards", what, i);
        guarded_free(S.ws[i]);
        guarded_free(S.aws[i]);
        guarded_free(S.dws[i]);
    }
    CHECK(logged() - logged0 >= 50L * nth, "%s: the logger heard %ld messages from %d threads, %ld expected", what,
          logged() - logged0, nth, 50L * nth);
    /* layer 1's plan was profiled in two halves by threads 0 and 1 */
    if (nth >= 4) CHECK_ERR(ei_plan_finalize(ctx, &S.got[1].plan), EI_OK);
    CHECK(plans_equal(&S.got[0].plan, &ref[0].plan), "%s: plan from %d threads differs from single-threaded", what, nth);
    CHECK(plans_equal(&S.got[0].chunked, &ref[0].chunked), "%s: chunked plan from %d threads differs", what, nth);
    CHECK(guard_intact(S.got[0].out, out_bytes()) && !memcmp(S.got[0].out, ref[0].out, out_bytes()),
          "%s: attention with ith/nth (%d threads) differs from nth = 1", what, nth);
    for (l = 0; l < N_LAYERS; ++l)
        CHECK(guard_intact(S.got[l].scores, score_bytes()) && !memcmp(S.got[l].scores, ref[l].scores, score_bytes()),
              "%s: layer %d scores of %d threads on one decoder differ from one call", what, l, nth);
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
    for (l = 0; l < N_LAYERS; ++l) {
        ei_plan_free(ctx, &S.got[l].plan);
        ei_plan_free(ctx, &S.got[l].chunked);
        guarded_free(S.got[l].out);
        guarded_free(S.got[l].scores);
        free(S.got[l].keep);
    }
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
    {   /* the chunked helper, chunk by chunk (kv-head ranges over its workers) */
        ei_plan pc;
        long t;
        CHECK_ERR(ei_plan_alloc(ctx, &pc, N, KV, DIM, EI_PLAN_CHUNKED), EI_OK);
        for (t = 0; t < N; t += CHUNK) {
            ei_tensor qc = layers[0].tq, kc = layers[0].tk;
            qc.data = query_row(&layers[0], t).data;
            qc.n_tokens = chunk_tokens(t);
            kc.n_tokens = t + qc.n_tokens;
            CHECK_ERR(ei_profile_chunk_mt(ctx, &qc, &kc, &pc, t, t + CHUNK >= N, nth, ws, pw * (size_t)nth), EI_OK);
        }
        CHECK(plans_equal(&pc, &ref[0].chunked), "%s: ei_profile_chunk_mt(%d) differs", what, nth);
        ei_plan_free(ctx, &pc);
    }
    CHECK_ERR(ei_attention_prefill_mt(ctx, &layers[0].tq, &layers[0].tk, &layers[0].tv, &p, &o, 0, nth, aws, aw * (size_t)nth),
              EI_OK);
    CHECK(!memcmp(out, ref[0].out, out_bytes()), "%s: ei_attention_prefill_mt(%d) differs", what, nth);
    CHECK(guard_intact(ws, pw * (size_t)nth) && guard_intact(aws, aw * (size_t)nth) && guard_intact(out, out_bytes()),
          "%s: helper guards", what);
    if (nth > 1) {
        /* a failure inside a worker comes back, with its message, to the caller:
           NaN in the keys of the last kv head (the last worker's range), in
           the last query of the last head */
        size_t kn = (size_t)N * KV * DIM, qn = (size_t)N * HEADS * DIM;
        float *kbad = (float *)malloc(sizeof(float) * kn), *qbad = (float *)malloc(sizeof(float) * qn);
        ei_tensor kb = ei_tensor_make(kbad, EI_F32, N, KV, DIM), qb = ei_tensor_make(qbad, EI_F32, N, HEADS, DIM);
        if (!kbad || !qbad) { printf("out of memory\n"); exit(2); }
        memcpy(kbad, layers[0].k, sizeof(float) * kn);
        memcpy(qbad, layers[0].q, sizeof(float) * qn);
        kbad[((size_t)(N / 2) * KV + KV - 1) * DIM + 3] = NAN;
        qbad[qn - 1] = NAN;
        CHECK_ERR(ei_profile_mt(ctx, &layers[0].tq, &kb, &p, nth, ws, pw * (size_t)nth), EI_ERR_NONFINITE);
        CHECK_ERR(ei_attention_prefill_mt(ctx, &qb, &layers[0].tk, &layers[0].tv, &ref[0].plan, &o, 0, nth, aws,
                                          aw * (size_t)nth), EI_ERR_NONFINITE);
        free(kbad);
        free(qbad);
    }
    ei_plan_free(ctx, &p);
    guarded_free(ws);
    guarded_free(aws);
    guarded_free(out);
}

/* The *_mt helpers called from several threads at once on one context: one
   call at a time has the context's workers (ei__pool), the others start
   threads of their own; every plan must still equal the reference. */
typedef struct concurrent_arg {
    const ei_context *ctx;
    const results *ref;
    int nth, ok;
} concurrent_arg;
static void *concurrent_helper(void *a) {
    concurrent_arg *c = (concurrent_arg *)a;
    ei_plan p;
    size_t pw;
    void *ws;
    int i;
    c->ok = 1;
    ei_profile_workspace_size(c->ctx, N, HEADS, KV, DIM, &pw);
    ws = guarded_alloc(pw * (size_t)c->nth);
    if (ei_plan_alloc(c->ctx, &p, N, KV, DIM, 0) != EI_OK) { c->ok = 0; guarded_free(ws); return NULL; }
    for (i = 0; i < 3; ++i) {
        if (ei_plan_reset(&p) != EI_OK ||
            ei_profile_mt(c->ctx, &layers[0].tq, &layers[0].tk, &p, c->nth, ws, pw * (size_t)c->nth) != EI_OK ||
            !plans_equal(&p, &c->ref[0].plan))
            c->ok = 0;
    }
    ei_plan_free(c->ctx, &p);
    guarded_free(ws);
    return NULL;
}
static void concurrent_helpers(const ei_context *ctx, const results *ref, int nth, const char *what) {
    enum { CALLERS = 3 };
    pthread_t t[CALLERS];
    concurrent_arg a[CALLERS];
    int i, started[CALLERS];
    for (i = 0; i < CALLERS; ++i) {
        a[i].ctx = ctx; a[i].ref = ref; a[i].nth = nth; a[i].ok = 0;
        started[i] = pthread_create(&t[i], NULL, concurrent_helper, &a[i]) == 0;
    }
    for (i = 0; i < CALLERS; ++i) {
        if (started[i]) pthread_join(t[i], NULL);
        CHECK(started[i] && a[i].ok, "%s: ei_profile_mt(%d) from caller %d of %d at once", what, nth, i, CALLERS);
    }
}

/* ------------------------------------------------------------ stack use */
#ifndef STACK_BOUND
#define STACK_BOUND (24 * 1024) /* bytes a call may touch below its caller (manual: LIMITS) */
#endif
#define STACK_BYTES (64 * 1024)   /* the thread's whole stack (glibc puts its TLS and descriptor at the top) */
#define STACK_GUARD (4 << 20)     /* PROT_NONE below it: past any single frame */
#define STACK_ALT (64 * 1024)     /* the SIGSEGV handler's own stack */
#define STACK_PAINT 0xC5u
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define STACK_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define STACK_SANITIZED 1
#endif
#endif
#ifndef STACK_SANITIZED
#define STACK_SANITIZED 0
#endif

/* Real models' head shapes (prefill: 16 query heads, 8 kv heads; decode: 32
   and 8; head_dim 128), with token counts that reach dense and sparse
   segments yet keep the scalar path quick: the library's frames are all of
   fixed size (no VLA, no alloca), so they do not depend on the counts. */
enum { ST_N = 256, ST_PH = 16, ST_PKV = 8, ST_HEADS = 32, ST_KV = 8, ST_DIM = 128, ST_AQ = 128, ST_CHUNK = 100, ST_DN = 1024,
       ST_MT = 8 };

typedef struct stack_env {
    ei_context *ctx, *sampled;      /* this SIMD path: reference ranking (with a logger), sampled ranking */
    synth_layer P;                  /* prefill layer, f32 */
    void *q16[2], *k16[2], *v16[2]; /* its f16 and bf16 copies */
    ei_tensor q[3], k[3], v[3];     /* by dtype: EI_F32, EI_F16, EI_BF16 */
    ei_plan plan, splan, chunked, schunked;
    float *out;
    void *pws, *aws, *dws;          /* ST_MT threads' worth each */
    size_t pw, aw, dw;
    synth_layer D;                  /* decode cache of ST_DN rows, f32 */
    ei_decoder dec;
    void *dec_mem;
    size_t db;
    ei_keep_set ks, ks1;            /* per kv head; shared (heads_out 1) */
    float *scores, *shared, *kc, *vc;
    void *daws, *dmt;               /* decode attention: ST_MT workspaces for the decode layer; the _mt helper's */
    float *dpart;                   /* decode attention partials of ST_MT threads */
    size_t daw, dmtw, dpw;
    int logged;
} stack_env;
typedef ei_result (*stack_fn)(stack_env *E, long arg);

/* A thread's call on the small stack. */
typedef struct stack_call {
    stack_fn fn;
    stack_env *E;
    long arg;
    ei_result result;
    int overflow;
    uintptr_t entry;                /* the thread's first frame */
} stack_call;
static unsigned char *stack_map, *stack_alt_mem;
static long stack_above;            /* bytes above the first frame: glibc's TLS and descriptor, thread start */
static sigjmp_buf stack_jump;
static __thread int stack_thread;   /* 1 on the thread under test */

static void stack_segv(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr, g = (uintptr_t)stack_map;
    static const char msg[] = "test_threads: a library worker thread touched the overflowed test stack\n";
    (void)uc;
    if (stack_map && a >= g && a < g + STACK_GUARD + STACK_BYTES) {
        if (stack_thread) siglongjmp(stack_jump, 1);
        if (write(2, msg, sizeof msg - 1) < 0) _exit(3);
        _exit(3);
    }
    signal(sig, SIG_DFL); /* any other fault: crash as usual */
}
static void *stack_tramp(void *arg) {
    stack_call *sc = (stack_call *)arg;
    volatile char here = 0;
    stack_t alt;
    memset(&alt, 0, sizeof alt);
    alt.ss_sp = stack_alt_mem;
    alt.ss_size = STACK_ALT;
    sigaltstack(&alt, NULL);
    stack_thread = 1;
    sc->entry = (uintptr_t)&here;
    if (!sigsetjmp(stack_jump, 1)) sc->result = sc->fn(sc->E, sc->arg);
    else sc->overflow = 1;
    stack_thread = 0;
    alt.ss_flags = SS_DISABLE;
    sigaltstack(&alt, NULL);
    return NULL;
}
static void stack_map_new(void) {
    void *m = mmap(NULL, STACK_GUARD + STACK_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED || mprotect((unsigned char *)m + STACK_GUARD, STACK_BYTES, PROT_READ | PROT_WRITE) != 0) {
        printf("mmap of the test stack failed\n");
        exit(2);
    }
    stack_map = (unsigned char *)m;
}
/* Runs fn(E, arg) on a fresh thread with the painted 64 KiB stack; returns
   the bytes it touched below the thread's first frame (-1: overflow). */
static long stack_run(stack_fn fn, stack_env *E, long arg, ei_result *result) {
    unsigned char *lo = stack_map + STACK_GUARD, *p;
    stack_call sc;
    pthread_attr_t at;
    pthread_t t;
    memset(&sc, 0, sizeof sc);
    sc.fn = fn; sc.E = E; sc.arg = arg; sc.result = EI_OK;
    memset(lo, STACK_PAINT, STACK_BYTES);
    pthread_attr_init(&at);
    if (pthread_attr_setstack(&at, lo, STACK_BYTES) != 0 || pthread_create(&t, &at, stack_tramp, &sc) != 0) {
        printf("cannot start a thread on a %d-byte stack\n", STACK_BYTES);
        exit(2);
    }
    pthread_join(t, NULL);
    pthread_attr_destroy(&at);
    *result = sc.result;
    if (sc.overflow) {
        /* the library's workers may still hold the old stack: leave it mapped */
        stack_map_new();
        return -1;
    }
    for (p = lo; p < lo + STACK_BYTES && *p == STACK_PAINT; ++p) {}
    stack_above = (long)((uintptr_t)(lo + STACK_BYTES) - sc.entry);
    return sc.entry > (uintptr_t)p ? (long)(sc.entry - (uintptr_t)p) : 0;
}

/* ---- the calls */
static void stack_logger(void *user, ei_result code, const char *message) {
    ++((stack_env *)user)->logged;
    (void)code; (void)message;
}
static ei_result sc_profile(stack_env *E, long sampled) {
    return ei_profile(sampled ? E->sampled : E->ctx, &E->q[0], &E->k[0], sampled ? &E->splan : &E->plan, E->pws, E->pw);
}
static ei_result sc_profile_mt(stack_env *E, long nth) {
    return ei_profile_mt(E->ctx, &E->q[0], &E->k[0], &E->plan, (int)nth, E->pws, E->pw * ST_MT);
}
static ei_result sc_profile_chunk(stack_env *E, long sampled) {
    ei_result r = EI_OK;
    long t;
    for (t = 0; t < ST_N && r == EI_OK; t += ST_CHUNK) {
        ei_tensor qc = E->q[0], kc = E->k[0];
        qc.data = E->P.q + (size_t)t * ST_PH * ST_DIM;
        qc.n_tokens = t + ST_CHUNK < ST_N ? (long)ST_CHUNK : (long)ST_N - t;
        kc.n_tokens = t + qc.n_tokens;
        r = ei_profile_chunk(sampled ? E->sampled : E->ctx, &qc, &kc, sampled ? &E->schunked : &E->chunked, t,
                             t + ST_CHUNK >= ST_N, E->pws, E->pw);
    }
    return r;
}
/* Attention of the last ST_AQ queries (a sparse segment, then the last one,
   dense), q_offset ST_N - ST_AQ. */
static ei_tensor stack_last_queries(const ei_tensor *q) {
    ei_tensor x = *q;
    x.data = (const unsigned char *)q->data + (size_t)(ST_N - ST_AQ) * ST_PH * ST_DIM * (q->dtype == EI_F32 ? 4 : 2);
    x.n_tokens = ST_AQ;
    return x;
}
static ei_result sc_attention(stack_env *E, long dt) {
    ei_out_tensor o = ei_out_tensor_make(E->out, EI_F32, ST_AQ, ST_PH, ST_DIM);
    ei_tensor q = stack_last_queries(&E->q[dt]);
    return ei_attention_prefill(E->ctx, &q, &E->k[dt], &E->v[dt], &E->plan, &o, ST_N - ST_AQ, 0, 1, E->aws, E->aw);
}
static ei_result sc_attention_mt(stack_env *E, long nth) {
    ei_out_tensor o = ei_out_tensor_make(E->out, EI_F32, ST_AQ, ST_PH, ST_DIM);
    ei_tensor q = stack_last_queries(&E->q[0]);
    return ei_attention_prefill_mt(E->ctx, &q, &E->k[0], &E->v[0], &E->plan, &o, ST_N - ST_AQ, (int)nth, E->aws,
                                   E->aw * ST_MT);
}
/* The decode protocol: the prompt but its last decode_gap queries, then those. */
static ei_result sc_observe(stack_env *E, long arg) {
    const ei_config *c = ei_context_config(E->ctx);
    ei_tensor prompt = E->D.tq;
    ei_result r;
    long t;
    (void)arg;
    prompt.n_tokens = ST_DN - c->decode_gap;
    r = ei_decode_observe(E->ctx, &E->dec, &prompt, 0, 0);
    for (t = ST_DN - c->decode_gap; t < ST_DN && r == EI_OK; ++t) {
        ei_tensor one = ei_tensor_make(E->D.q + (size_t)t * ST_HEADS * ST_DIM, EI_F32, 1, ST_HEADS, ST_DIM);
        r = ei_decode_observe(E->ctx, &E->dec, &one, t, 1);
    }
    return r;
}
static ei_result sc_keep(stack_env *E, long nth) {
    return nth ? ei_decode_keep_mt(E->ctx, &E->dec, &E->D.tk, &E->ks, (int)nth, E->dws, E->dw * ST_MT)
               : ei_decode_keep(E->ctx, &E->dec, &E->D.tk, &E->ks, E->dws, E->dw);
}
/* Decode attention of the decode layer's last query against its cache
   (through the keep set E->ks when keep is set): both phases of nth
   threads in turn on this thread, or the _mt helper with nth threads. */
static ei_result sc_attn_decode_run(stack_env *E, long nth, int mt, const ei_keep_set *keep) {
    ei_tensor q = ei_tensor_make(E->D.q + (size_t)(ST_DN - 1) * ST_HEADS * ST_DIM, EI_F32, 1, ST_HEADS, ST_DIM);
    ei_out_tensor o = ei_out_tensor_make(E->out, EI_F32, 1, ST_HEADS, ST_DIM);
    ei_result r = EI_OK;
    int ith;
    if (mt) return ei_attention_decode_keep_mt(E->ctx, &q, &E->D.tk, &E->D.tv, keep, &o, ST_DN - 1, (int)nth, E->dmt, E->dmtw);
    for (ith = 0; ith < nth && r == EI_OK; ++ith)
        r = ei_attention_decode_keep(E->ctx, &q, &E->D.tk, &E->D.tv, keep, &o, ST_DN - 1, ith, (int)nth, E->dpart, E->dpw,
                                     (unsigned char *)E->daws + E->daw * (size_t)ith, E->daw);
    for (ith = 0; ith < nth && r == EI_OK; ++ith) r = ei_attention_decode_merge(E->ctx, &o, E->dpart, E->dpw, ith, (int)nth);
    return r;
}
static ei_result sc_attn_decode(stack_env *E, long nth) { return sc_attn_decode_run(E, nth, 0, NULL); }
static ei_result sc_attn_decode_mt(stack_env *E, long nth) { return sc_attn_decode_run(E, nth, 1, NULL); }
static ei_result sc_attn_decode_keep(stack_env *E, long nth) { return sc_attn_decode_run(E, nth, 0, &E->ks); }
static ei_result sc_attn_decode_keep_mt(stack_env *E, long nth) { return sc_attn_decode_run(E, nth, 1, &E->ks); }
static ei_result sc_score(stack_env *E, long arg) {
    (void)arg;
    return ei_decode_score(E->ctx, &E->dec, &E->D.tk, NULL, 0, E->scores, 0, 1, E->dws, E->dw);
}
static ei_result sc_select(stack_env *E, long arg) {
    (void)arg;
    return ei_decode_select(E->ctx, &E->dec, E->scores, ST_DN, &E->ks, E->dws, E->dw);
}
static ei_result sc_shared_add(stack_env *E, long arg) {
    (void)arg;
    return ei_decode_shared_add(E->ctx, &E->dec, E->scores, ST_DN, NULL, E->shared, E->dws, E->dw);
}
static ei_result sc_select_shared(stack_env *E, long arg) {
    (void)arg;
    return ei_decode_select_shared(E->ctx, &E->dec, E->shared, ST_DN, &E->ks1, E->dws, E->dw);
}
static ei_result sc_compact(stack_env *E, long arg) {
    ei_out_tensor ko = ei_out_tensor_make(E->kc, EI_F32, ST_DN, ST_KV, ST_DIM);
    ei_out_tensor vo = ei_out_tensor_make(E->vc, EI_F32, ST_DN, ST_KV, ST_DIM);
    (void)arg;
    return ei_kv_compact(E->ctx, &E->ks, &ko, &vo);
}
/* A refused call: the message formatted and given to the logger. */
static ei_result sc_error(stack_env *E, long arg) {
    ei_result r = ei_profile(E->ctx, &E->q[0], &E->k[0], &E->plan, E->pws, 1);
    (void)arg;
    return r == EI_ERR_WORKSPACE && strstr(ei_last_error(), "EI_ERR_WORKSPACE") ? EI_OK : EI_ERR_STATE;
}
static ei_result sc_create(stack_env *E, long which) {
    ei_config c = ei_config_default();
    ei_context *ctx = NULL;
    ei_result r;
    c.simd = EI_SIMD_AUTO;
    if (which == 1) c.ranking = EI_RANK_SAMPLED;
    if (which == 2) c.backend = EI_BACKEND_CUDA_OR_CPU;
    r = ei_context_create(&c, &ctx);
    ei_context_destroy(ctx);
    (void)E;
    return r;
}

/* ---- setup on the main thread */
static void stack_env_make(stack_env *E, ei_simd p) {
    ei_config c = ei_config_default(), s;
    size_t pw2, bytes;
    int i;
    memset(E, 0, sizeof *E);
    c.segment_size = 64; c.block_size = 8; c.base_budget = 64; c.threshold_len = 128;
    c.decode_budget = 256; c.window = 32; c.decode_gap = 16;
    c.simd = p;
    c.log = stack_logger;
    c.log_user_data = E;
    s = ei_config_quality(); /* sampled ranking, top_p, sink and local blocks */
    s.segment_size = c.segment_size; s.block_size = c.block_size; s.base_budget = c.base_budget;
    s.threshold_len = c.threshold_len;
    s.ranking = EI_RANK_SAMPLED;
    s.simd = p;
    CHECK_ERR(ei_context_create(&c, &E->ctx), EI_OK);
    CHECK_ERR(ei_context_create(&s, &E->sampled), EI_OK);
    E->P = synth_layer_make(ST_N, ST_PH, ST_PKV, ST_DIM, 64, 7);
    E->q[0] = E->P.tq; E->k[0] = E->P.tk; E->v[0] = E->P.tv;
    for (i = 0; i < 2; ++i) {
        ei_dtype dt = i ? EI_BF16 : EI_F16;
        E->q16[i] = to_dtype(E->P.q, (size_t)ST_N * ST_PH * ST_DIM, dt);
        E->k16[i] = to_dtype(E->P.k, (size_t)ST_N * ST_PKV * ST_DIM, dt);
        E->v16[i] = to_dtype(E->P.v, (size_t)ST_N * ST_PKV * ST_DIM, dt);
        E->q[1 + i] = ei_tensor_make(E->q16[i], dt, ST_N, ST_PH, ST_DIM);
        E->k[1 + i] = ei_tensor_make(E->k16[i], dt, ST_N, ST_PKV, ST_DIM);
        E->v[1 + i] = ei_tensor_make(E->v16[i], dt, ST_N, ST_PKV, ST_DIM);
    }
    CHECK_ERR(ei_plan_alloc(E->ctx, &E->plan, ST_N, ST_PKV, ST_DIM, 0), EI_OK);
    CHECK_ERR(ei_plan_alloc(E->sampled, &E->splan, ST_N, ST_PKV, ST_DIM, 0), EI_OK);
    CHECK_ERR(ei_plan_alloc(E->ctx, &E->chunked, ST_N, ST_PKV, ST_DIM, EI_PLAN_CHUNKED), EI_OK);
    CHECK_ERR(ei_plan_alloc(E->sampled, &E->schunked, ST_N, ST_PKV, ST_DIM, EI_PLAN_CHUNKED), EI_OK);
    ei_profile_workspace_size(E->ctx, ST_N, ST_PH, ST_PKV, ST_DIM, &E->pw);
    ei_profile_workspace_size(E->sampled, ST_N, ST_PH, ST_PKV, ST_DIM, &pw2);
    if (pw2 > E->pw) E->pw = pw2;
    ei_attention_workspace_size(E->ctx, ST_PH, ST_PKV, ST_DIM, &E->aw);
    ei_decode_workspace_size(E->ctx, ST_DN, ST_HEADS, ST_KV, &E->dw);
    E->pws = malloc(E->pw * ST_MT);
    E->aws = malloc(E->aw * ST_MT);
    E->dws = malloc(E->dw * ST_MT);
    E->out = (float *)malloc(sizeof(float) * ST_N * ST_PH * ST_DIM);
    E->D = synth_layer_make(ST_DN, ST_HEADS, ST_KV, ST_DIM, 64, 8);
    ei_attention_workspace_size(E->ctx, ST_HEADS, ST_KV, ST_DIM, &E->daw);
    ei_attention_decode_partials_size(E->ctx, 1, ST_HEADS, ST_DIM, ST_MT, &E->dpw);
    ei_attention_decode_workspace_size(E->ctx, 1, ST_HEADS, ST_KV, ST_DIM, ST_MT, &E->dmtw);
    E->daws = malloc(E->daw * ST_MT);
    E->dmt = malloc(E->dmtw);
    E->dpart = (float *)malloc(E->dpw);
    if (!E->daws || !E->dmt || !E->dpart) { printf("out of memory\n"); exit(2); }
    ei_decoder_size(E->ctx, ST_HEADS, ST_DIM, &E->db);
    E->dec_mem = malloc(E->db);
    CHECK_ERR(ei_decoder_init(E->ctx, &E->dec, ST_HEADS, ST_KV, ST_DIM, E->dec_mem, E->db), EI_OK);
    E->ks.heads_out = ST_KV;
    E->ks.capacity = c.decode_budget;
    E->ks.index = (int32_t *)malloc(sizeof(int32_t) * ST_KV * (size_t)c.decode_budget);
    E->ks.positions = (int32_t *)malloc(sizeof(int32_t) * ST_KV * (size_t)c.decode_budget);
    E->ks.mask = (uint8_t *)malloc((size_t)ST_KV * ST_DN);
    E->ks.mask_capacity = ST_DN;
    E->ks.pooled = (float *)malloc(sizeof(float) * ST_KV * ST_DN);
    E->ks.pooled_capacity = ST_DN;
    E->ks1.heads_out = 1;
    E->ks1.capacity = c.decode_budget;
    E->ks1.index = (int32_t *)malloc(sizeof(int32_t) * (size_t)c.decode_budget);
    E->ks1.positions = (int32_t *)malloc(sizeof(int32_t) * (size_t)c.decode_budget);
    E->scores = (float *)malloc(sizeof(float) * ST_HEADS * ST_DN);
    E->shared = (float *)calloc(ST_DN, sizeof(float));
    bytes = sizeof(float) * ST_DN * ST_KV * ST_DIM;
    E->kc = (float *)malloc(bytes);
    E->vc = (float *)malloc(bytes);
    if (!E->pws || !E->aws || !E->dws || !E->out || !E->dec_mem || !E->ks.index || !E->ks.positions || !E->ks.mask ||
        !E->ks.pooled || !E->ks1.index || !E->ks1.positions || !E->scores || !E->shared || !E->kc || !E->vc) {
        printf("out of memory\n");
        exit(2);
    }
    memcpy(E->kc, E->D.k, bytes);
    memcpy(E->vc, E->D.v, bytes);
}
static void stack_env_free(stack_env *E) {
    int i;
    ei_plan_free(E->ctx, &E->plan);
    ei_plan_free(E->sampled, &E->splan);
    ei_plan_free(E->ctx, &E->chunked);
    ei_plan_free(E->sampled, &E->schunked);
    ei_context_destroy(E->ctx);
    ei_context_destroy(E->sampled);
    synth_layer_free(&E->P);
    synth_layer_free(&E->D);
    for (i = 0; i < 2; ++i) { free(E->q16[i]); free(E->k16[i]); free(E->v16[i]); }
    free(E->pws); free(E->aws); free(E->dws); free(E->out); free(E->dec_mem);
    free(E->ks.index); free(E->ks.positions); free(E->ks.mask); free(E->ks.pooled);
    free(E->ks1.index); free(E->ks1.positions);
    free(E->scores); free(E->shared); free(E->kc); free(E->vc);
    free(E->daws); free(E->dmt); free(E->dpart);
}
/* Before a decode call: the decoder observed afresh (prep 1) or reset (prep 2). */
static void stack_prep(stack_env *E, int prep) {
    if (!prep) return;
    CHECK_ERR(ei_decoder_reset(&E->dec), EI_OK);
    if (prep == 1) CHECK_ERR(sc_observe(E, 0), EI_OK);
}

typedef struct stack_case { const char *name; stack_fn fn; long arg; int prep; } stack_case;
static const stack_case stack_cases[] = {
    {"ei_profile", sc_profile, 0, 0},
    {"ei_profile (sampled ranking)", sc_profile, 1, 0},
    {"ei_profile_mt 2", sc_profile_mt, 2, 0},
    {"ei_profile_mt 8", sc_profile_mt, 8, 0},
    {"ei_profile_chunk (3 chunks)", sc_profile_chunk, 0, 0},
    {"ei_profile_chunk (sampled)", sc_profile_chunk, 1, 0},
    {"ei_attention_prefill f32", sc_attention, 0, 0},
    {"ei_attention_prefill f16", sc_attention, 1, 0},
    {"ei_attention_prefill bf16", sc_attention, 2, 0},
    {"ei_attention_prefill_mt 2", sc_attention_mt, 2, 0},
    {"ei_attention_prefill_mt 8", sc_attention_mt, 8, 0},
    {"ei_decode_observe", sc_observe, 0, 2},
    {"ei_decode_keep", sc_keep, 0, 1},
    {"ei_decode_keep_mt 2", sc_keep, 2, 1},
    {"ei_decode_keep_mt 8", sc_keep, 8, 1},
    {"ei_decode_score", sc_score, 0, 1},
    {"ei_decode_select", sc_select, 0, 0},
    {"ei_attention_decode + merge 1", sc_attn_decode, 1, 0},
    {"ei_attention_decode + merge 3", sc_attn_decode, 3, 0},
    {"ei_attention_decode_mt 2", sc_attn_decode_mt, 2, 0},
    {"ei_attention_decode_mt 8", sc_attn_decode_mt, 8, 0},
    {"ei_attention_decode_keep 2", sc_attn_decode_keep, 2, 0},
    {"ei_attention_decode_keep_mt 8", sc_attn_decode_keep_mt, 8, 0},
    {"ei_decode_shared_add", sc_shared_add, 0, 0},
    {"ei_decode_select_shared", sc_select_shared, 0, 0},
    {"ei_kv_compact", sc_compact, 0, 0},
    {"a refused call, logged", sc_error, 0, 0},
};
static const stack_case stack_create_cases[] = {
    {"ei_context_create AUTO", sc_create, 0, 0},
    {"ei_context_create sampled", sc_create, 1, 0},
    {"ei_context_create CUDA_OR_CPU", sc_create, 2, 0},
};

static long stack_case_run(const stack_case *k, stack_env *E, const char *path) {
    ei_result r;
    long used;
    stack_prep(E, k->prep);
    used = stack_run(k->fn, E, k->arg, &r);
    if (used < 0) {
        CHECK(0, "%s %s: overflowed the %d-byte stack (a SIGSEGV in the guard below it)", path, k->name, STACK_BYTES);
        printf("  %-12s %-32s overflow\n", path, k->name);
        return STACK_BYTES;
    }
    CHECK(r == EI_OK, "%s %s on the small stack: %s (%s)", path, k->name, ei_result_name(r), ei_last_error());
    CHECK(used <= STACK_BOUND, "%s %s: %ld bytes of stack, bound %d", path, k->name, used, STACK_BOUND);
    printf("  %-12s %-32s %6ld bytes\n", path, k->name, used);
    return used;
}

static void stack_test(void) {
    const char *pre = getenv("LD_PRELOAD");
    struct sigaction sa, old_segv, old_bus;
    stack_env E;
    long worst = 0, u;
    const char *worst_name = "";
    int p;
    size_t i;
    if (STACK_SANITIZED || (pre && strstr(pre, "vgpreload"))) {
        printf("stack use: not measured under a sanitizer or valgrind\n");
        return;
    }
    stack_map_new();
    stack_alt_mem = (unsigned char *)malloc(STACK_ALT);
    if (!stack_alt_mem) { printf("out of memory\n"); exit(2); }
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = stack_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    memset(&E, 0, sizeof E);
    printf("stack use: bytes each call touched below its thread's first frame, on a %d-byte stack (bound %d)\n",
           STACK_BYTES, STACK_BOUND);
    for (i = 0; i < sizeof stack_create_cases / sizeof *stack_create_cases; ++i) {
        u = stack_case_run(&stack_create_cases[i], &E, "-");
        if (u > worst) { worst = u; worst_name = stack_create_cases[i].name; }
    }
    for (p = EI_SIMD_SCALAR; p < TEST_SIMD_END; ++p) {
        if (!test_simd_selected((ei_simd)p)) continue;
        stack_env_make(&E, (ei_simd)p);
        for (i = 0; i < sizeof stack_cases / sizeof *stack_cases; ++i) {
            u = stack_case_run(&stack_cases[i], &E, ei_simd_name((ei_simd)p));
            if (u > worst) { worst = u; worst_name = stack_cases[i].name; }
        }
        CHECK(E.logged >= 1, "%s: the logger heard the refused call", ei_simd_name((ei_simd)p));
        stack_env_free(&E);
    }
    printf("stack use: at most %ld bytes (%s), bound %d; above the first frame (TLS, thread start) %ld\n", worst,
           worst_name, STACK_BOUND, stack_above);
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
}

/* ------------------------------------------------------------ main */
int main(void) {
    int p, per, round, form, forms, nth = env_int("EI_TEST_THREADS", 4), rounds = env_int("EI_TEST_ROUNDS", 2),
        race = env_int("EI_TEST_SELFTEST_RACE", 0);
    const char *sync = getenv("EI_TEST_SYNC");
    long t;
    if (nth < 1) nth = 1;
    if (nth > MAX_THREADS) nth = MAX_THREADS;
    forms = !sync || !*sync || !strcmp(sync, "both") ? FORM_BARRIER | FORM_JOIN
            : !strcmp(sync, "barrier")                 ? FORM_BARRIER
            : !strcmp(sync, "join")                    ? FORM_JOIN
                                                       : 0;
    if (!forms) {
        printf("EI_TEST_SYNC=%s: barrier, join or both\n", sync);
        return 2;
    }
    if (race && nth < 2) nth = 2;
    printf("entropyinfer %s thread tests: %d threads, %d rounds, phases separated by %s%s\n", EI_VERSION_STRING, nth, rounds,
           forms == FORM_BARRIER ? "barriers" : forms == FORM_JOIN ? "create/join" : "barriers, then by create/join",
           race ? "; SELF-TEST: a deliberate data race (TSan must report it)" : "");
    make_layers();
    for (t = 0; t < N; ++t) identity_pos[t] = (int32_t)t;
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
            c.log = count_logger;
            CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
            memset(ref, 0, sizeof ref);
            reference(ctx, ref);
            for (round = 0; round < rounds; ++round) {
                for (form = FORM_BARRIER; form <= FORM_JOIN; form <<= 1) {
                    if (!(forms & form)) continue;
                    snprintf(what, sizeof what, "%s/%s/%s", ei_simd_name((ei_simd)p), per ? "per-segment" : "ragged",
                             form_name(form));
                    threaded_round(ctx, ref, nth, form, race, what);
                    if (nth > 1) threaded_round(ctx, ref, nth - 1, form, race, what); /* uneven head ranges */
                }
                snprintf(what, sizeof what, "%s/%s", ei_simd_name((ei_simd)p), per ? "per-segment" : "ragged");
                helpers_round(ctx, ref, nth, what);
                concurrent_helpers(ctx, ref, nth, what);
            }
            free_results(ctx, ref);
            ei_context_destroy(ctx);
            printf("  %s/%s: done\n", ei_simd_name((ei_simd)p), per ? "per-segment" : "ragged");
        }
    {
        int l;
        for (l = 0; l < N_LAYERS; ++l) { free(layers[l].q); free(layers[l].k); free(layers[l].v); }
    }
    stack_test();
    return check_summary();
}
