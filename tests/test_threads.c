/* Threads: several threads share one ei_context and one plan, as an engine's
   thread pool would, and their results must equal single-threaded ones bit
   for bit. Built with -fsanitize=thread by `make test-tsan`, so any data race
   inside the library is reported.

   Every call runs as its ei_exec says: a whole call on n_threads of the
   library's threads, or part ith of nth made by each of the test's own
   threads, every part passing the SAME workspace (one buffer of
   ei_layer_sizes for nth), the engine's barrier between a call's parts and
   its second step (ei_plan_finalize, ei_attention_decode_merge) being a
   pthread barrier or a join of the test's threads. Per SIMD path and per
   budget mode (ragged, per-segment max), each round runs these phases, one
   after another, on nth threads (EI_TEST_THREADS, nth - 1, and 2):
     0. contexts: every thread creates and destroys a context of its own from
        the shared one's configuration;
     1. plan: ei_profile in nth parts (each its kv heads of one shared plan),
        one thread finalises (ei_plan_finalize);
     2. chunked plan: per chunk, ei_profile_chunk in nth parts on one shared
        chunked plan, one thread finalises;
     3. attend: ei_attention_prefill in nth parts on the shared plan into one
        shared output (disjoint parts of it);
     4. score: ei_decode_score in nth parts on ONE shared decoder per layer
        (the manual: it only reads the decoder) into one shared score array
        per layer (disjoint query-head rows), odd layers through a shared
        row map; then ei_decode_select in nth parts (part 0 selects, the
        others return) from those scores: the keep set of ei_decode_keep;
     5. decode: per layer, ei_attention_decode in nth parts (each its slice
        of the keys, partials in the one workspace), then after the barrier
        ei_attention_decode_merge in nth parts (each its share of the rows);
        even layers a step of 3 tokens, odd ones a token through the layer's
        keep set;
     6. mixed: at the same time, two threads profile layer 1 (2 parts), two
        attend layer 2 (bf16; 2 parts on a workspace of their own), and
        every thread decodes its own layer (f32, bf16, f16; own decoder and
        keep set, shared context), and each thread triggers a different
        error and checks that ei_last_error (thread-local) names its own
        code, while the context's logger (thread-safe, as THREADS asks)
        hears every thread's messages;
   then, on the main thread, the same calls on nth of the library's threads
   (ei_exec.n_threads = nth): plans, attention, scores and keep sets equal to
   the parts' and to the one-thread call's bit for bit; decode attention
   equal to the parts' bit for bit (the same key slices) and to the
   one-thread call's within float32 summation order. Then the library's
   threads on EI_TEST_THREADS against the same references, and a failure
   inside one of their workers (NaN in the last kv head's keys, in the last
   query) returned with its message to the caller (the calls run on the
   context's kept workers, call after call), in parts only by the part that
   holds it; ei_exec refusals (threads and parts at once, a part past nth,
   one thread's workspace for 2 parts, ei_decode_keep in parts); and three
   threads calling ei_profile on threads on the shared context at once (one
   has the workers, the others start threads of their own).

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
   (measured before issue 31, with two thread counts per round; there are
   three now, 48 racy phases per run in the barrier form).

   Stack use: every public entry point that does work runs, at real
   models' head shapes (prefill 16 query and 8 kv heads, decode 32 and 8,
   head_dim 128), on a thread of its own whose stack is STACK_BYTES (64 KiB)
   of memory painted with a pattern, with STACK_GUARD bytes of PROT_NONE
   below it. Each call's high-water mark (the painted bytes it overwrote,
   counted from the thread's first frame down) is printed and must stay
   within STACK_BOUND (24 KiB, the manual's LIMITS); an overflow is a SIGSEGV in the guard,
   reported as a failure of that call (the test goes on). Covered:
   ei_profile and ei_profile_chunk (reference and sampled ranking),
   ei_profile on 2 and 8 threads and in 3 parts (in turn on the thread,
   then ei_plan_finalize), ei_attention_prefill (f32, f16, bf16; on 2 and 8
   threads; in 3 parts), ei_decode_observe, ei_decode_keep (1, 2 and 8
   threads), ei_decode_score (1 and 8 threads, 3 parts), ei_decode_select,
   ei_attention_decode + merge (1 thread, 3 parts, 2 and 8 threads; through
   the keep set just selected in 2 parts and on 8 threads),
   ei_decode_shared_add, ei_decode_select_shared, ei_kv_compact and a
   refused call that formats its message for a logger, on every SIMD path
   this CPU runs; ei_context_create (EI_SIMD_AUTO, a sampled-ranking config,
   EI_BACKEND_CUDA_OR_CPU: dlopen). The library's workers run on stacks it
   creates: of a call on threads only the calling thread's share is measured. A
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

/* ------------------------------------------------------------ how calls run */
/* ei_layer_sizes of a layer (max_tokens T, H query and n_kv kv heads, head_dim d)
   for calls on n threads or in n parts; a failure ends the test (setup). */
static ei_sizes sizes_of(const ei_context *ctx, int64_t T, int32_t H, int32_t n_kv, int32_t d, int n) {
    ei_shape s;
    ei_sizes z;
    memset(&s, 0, sizeof s);
    s.max_tokens = T; s.n_heads = H; s.n_kv_heads = n_kv; s.head_dim = d; s.n_threads = n;
    if (ei_layer_sizes(ctx, &s, &z) != EI_OK) {
        printf("ei_layer_sizes: %s\n", ei_last_error());
        exit(2);
    }
    return z;
}
/* The test layers' sizes. */
static ei_sizes sizes_n(const ei_context *ctx, int n) { return sizes_of(ctx, N, HEADS, KV, DIM, n); }

/* ------------------------------------------------------------ per-layer results */
enum { DSTEP = 3 }; /* query tokens of the even layers' decode step */
typedef struct results {
    ei_plan plan, chunked;
    float *out;            /* attention output [N][HEADS][DIM] */
    int32_t *keep;         /* keep set index [KV][capacity] */
    int32_t n_kept;
    int64_t keep_rows;     /* its n_tokens (rows scored) */
    float *scores;         /* ei_decode_score of dec [HEADS][N] */
    ei_decoder dec;        /* reference: observed, then shared read-only by the score phase;
                              threaded rounds: their own, for ei_decode_select in parts */
    void *dec_mem;
    float *dout;           /* the decode step's attention [DSTEP][HEADS][DIM] */
    int32_t *sel;          /* threaded rounds: the keep set ei_decode_select made in parts */
    int32_t n_sel;
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
static size_t dout_bytes(void) { return sizeof(float) * DSTEP * HEADS * DIM; }
static size_t keep_bytes(const ei_context *ctx) { return sizeof(int32_t) * KV * (size_t)ei_context_config(ctx)->decode_budget; }
static const int32_t *score_map(int l) { return l & 1 ? identity_pos : NULL; }

static int plans_equal(const ei_plan *a, const ei_plan *b) {
    size_t rows = (size_t)a->n_kv_heads * (size_t)a->seg_capacity;
    return a->n_segments == b->n_segments && a->n_tokens == b->n_tokens && a->final == b->final &&
           !memcmp(a->entropy, b->entropy, rows * 4) && !memcmp(a->head_class, b->head_class, (size_t)a->n_kv_heads) &&
           !memcmp(a->budget, b->budget, rows * 4) && !memcmp(a->keep_blocks, b->keep_blocks, rows * 4) &&
           !memcmp(a->keep_count, b->keep_count, rows * 4) &&
           !memcmp(a->block_index, b->block_index, rows * (size_t)a->max_keep * 4);
}

/* The chunk of layer l's queries that starts at token t, and the keys so far. */
static void chunk_views(int l, long t, ei_tensor *qc, ei_tensor *kc) {
    *qc = layers[l].tq;
    *kc = layers[l].tk;
    qc->data = query_row(&layers[l], t).data;
    qc->n_tokens = chunk_tokens(t);
    kc->n_tokens = t + qc->n_tokens;
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

/* Decode one layer's keep set with ei_decode_keep on n_threads (used by the
   reference, by each thread, and on the library's threads). */
static ei_result decode_layer(const ei_context *ctx, int l, int n_threads, int32_t *keep_out, int32_t *n_kept,
                              int64_t *rows) {
    const ei_config *c = ei_context_config(ctx);
    const layer *L = &layers[l];
    const ei_sizes z = sizes_n(ctx, n_threads);
    ei_decoder dec;
    ei_keep_set ks;
    ei_exec x;
    size_t ib = keep_bytes(ctx), mb = (size_t)KV * N;
    void *dm, *ws;
    ei_tensor kt = L->tk;
    ei_result r;
    dm = guarded_alloc(z.decoder);
    ws = guarded_alloc(z.decode_keep);
    x = ex(n_threads, ws, z.decode_keep);
    r = ei_decoder_init(ctx, &dec, HEADS, KV, DIM, dm, z.decoder);
    memset(&ks, 0, sizeof ks);
    ks.heads_out = KV;
    ks.capacity = c->decode_budget;
    ks.index = (int32_t *)guarded_alloc(ib);
    ks.mask = (uint8_t *)guarded_alloc(mb);
    ks.mask_capacity = N;
    if (r == EI_OK) r = observe_layer(ctx, l, &dec);
    if (r == EI_OK && !ei_decode_due(ctx, &dec)) r = EI_ERR_STATE;
    if (r == EI_OK) r = ei_decode_keep(ctx, &x, &dec, &kt, &ks);
    if (r == EI_OK) {
        memcpy(keep_out, ks.index, ib);
        *n_kept = ks.n_kept;
        if (rows) *rows = ks.n_tokens;
    }
    CHECK(guard_intact(dm, z.decoder) && guard_intact(ws, z.decode_keep) && guard_intact(ks.index, ib) &&
              guard_intact(ks.mask, mb),
          "decode guard bytes (layer %d)", l);
    guarded_free(dm); guarded_free(ws); guarded_free(ks.index); guarded_free(ks.mask);
    return r;
}

/* Layer l's decode step: even layers the last DSTEP queries against the
   whole cache, odd layers the last query through the layer's keep set (the
   reference's); keep is filled for odd layers, NULL returned otherwise. */
static const ei_keep_set *decode_step(const ei_context *ctx, int l, const results *ref, ei_tensor *q, ei_keep_set *keep,
                                      int64_t *q_offset) {
    const int64_t nt = l & 1 ? 1 : DSTEP;
    *q = layers[l].tq;
    q->data = query_row(&layers[l], N - nt).data;
    q->n_tokens = nt;
    *q_offset = N - nt;
    if (!(l & 1)) return NULL;
    memset(keep, 0, sizeof *keep);
    keep->heads_out = KV;
    keep->capacity = ei_context_config(ctx)->decode_budget;
    keep->n_kept = ref[l].n_kept;
    keep->n_tokens = ref[l].keep_rows;
    keep->index = ref[l].keep;
    return keep;
}
static ei_out_tensor dout_tensor(float *dout, int l) {
    return ei_out_tensor_make(dout, EI_F32, l & 1 ? 1 : DSTEP, HEADS, DIM);
}
/* Layer l's decode step as one call (n_threads, ws: the call's workspace). */
static ei_result decode_step_call(const ei_context *ctx, const results *ref, int l, const ei_exec *x, float *dout) {
    ei_tensor q;
    ei_keep_set ks;
    int64_t off;
    const ei_keep_set *keep = decode_step(ctx, l, ref, &q, &ks, &off);
    ei_out_tensor o = dout_tensor(dout, l);
    ei_result r = ei_attention_decode(ctx, x, &q, &layers[l].tk, &layers[l].tv, keep, &o, off);
    if (r == EI_OK) r = ei_attention_decode_merge(ctx, x, &o); /* after a whole call: nothing to do */
    return r;
}

/* Single-threaded reference for every layer. */
static void reference(const ei_context *ctx, results *ref) {
    const ei_sizes z = sizes_n(ctx, 1);
    int l;
    void *ws, *aws, *dws, *decws;
    ei_exec xp, xa, xd, xdec;
    ws = guarded_alloc(z.profile);
    aws = guarded_alloc(z.prefill);
    dws = guarded_alloc(z.decode_keep);
    decws = guarded_alloc(z.decode);
    xp = ex(1, ws, z.profile);
    xa = ex(1, aws, z.prefill);
    xd = ex(1, dws, z.decode_keep);
    xdec = ex(1, decws, z.decode);
    for (l = 0; l < N_LAYERS; ++l) {
        layer *L = &layers[l];
        ei_out_tensor o;
        long t;
        CHECK_ERR(ei_plan_init(ctx, &ref[l].plan, N, KV, DIM, 0, NULL, 0), EI_OK);
        CHECK_ERR(ei_plan_init(ctx, &ref[l].chunked, N, KV, DIM, EI_PLAN_CHUNKED, NULL, 0), EI_OK);
        CHECK_ERR(ei_profile(ctx, &xp, &L->tq, &L->tk, &ref[l].plan), EI_OK);
        for (t = 0; t < N; t += CHUNK) {
            ei_tensor qc, kc;
            chunk_views(l, t, &qc, &kc);
            CHECK_ERR(ei_profile_chunk(ctx, &xp, &qc, &kc, &ref[l].chunked, t, t + CHUNK >= N), EI_OK);
        }
        ref[l].out = (float *)guarded_alloc(out_bytes());
        o = ei_out_tensor_make(ref[l].out, EI_F32, N, HEADS, DIM);
        CHECK_ERR(ei_attention_prefill(ctx, &xa, &L->tq, &L->tk, &L->tv, &ref[l].plan, &o, 0), EI_OK);
        ref[l].keep = (int32_t *)malloc(keep_bytes(ctx));
        CHECK_ERR(decode_layer(ctx, l, 1, ref[l].keep, &ref[l].n_kept, &ref[l].keep_rows), EI_OK);
        /* the decoder the score phase shares, and its scores from one call */
        ref[l].dec_mem = guarded_alloc(z.decoder);
        CHECK_ERR(ei_decoder_init(ctx, &ref[l].dec, HEADS, KV, DIM, ref[l].dec_mem, z.decoder), EI_OK);
        CHECK_ERR(observe_layer(ctx, l, &ref[l].dec), EI_OK);
        ref[l].scores = (float *)guarded_alloc(score_bytes());
        CHECK_ERR(ei_decode_score(ctx, &xd, &ref[l].dec, &L->tk, score_map(l), 0, ref[l].scores), EI_OK);
        /* the decode step on one thread (the keep set of odd layers: just made) */
        ref[l].dout = (float *)guarded_alloc(dout_bytes());
        CHECK_ERR(decode_step_call(ctx, ref, l, &xdec, ref[l].dout), EI_OK);
    }
    CHECK(guard_intact(ws, z.profile) && guard_intact(aws, z.prefill) && guard_intact(dws, z.decode_keep) &&
              guard_intact(decws, z.decode),
          "reference workspace guards");
    guarded_free(ws);
    guarded_free(aws);
    guarded_free(dws);
    guarded_free(decws);
}
static void free_results(const ei_context *ctx, results *r) {
    int l;
    for (l = 0; l < N_LAYERS; ++l) {
        ei_plan_free(ctx, &r[l].plan);
        ei_plan_free(ctx, &r[l].chunked);
        guarded_free(r[l].out);
        guarded_free(r[l].scores);
        guarded_free(r[l].dec_mem);
        guarded_free(r[l].dout);
        free(r[l].keep);
        free(r[l].sel);
    }
}

/* ------------------------------------------------------------ the threaded round */
enum { MAX_THREADS = 64, MAX_PHASES = 40 };
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
    ei_sizes z;               /* for nth parts */
    void *ws, *aws, *dws, *decws; /* ONE workspace of each kind, shared by the nth parts:
                                     profiling, prefill, decode keep sets, decode attention */
    void *aws2;               /* the mixed phase's second pair of parts (prefill, 2 parts) */
    size_t aw2;
    phase phases[MAX_PHASES];
    int n_phases;
    int racy;                 /* EI_TEST_SELFTEST_RACE: written by threads 0 and 1 in one phase */
};
typedef struct worker { shared *S; int ith, phase; } worker;

/* 0. a context per thread, from the shared one's configuration */
static void ph_contexts(shared *S, int ith, long arg) {
    ei_context *own = NULL;
    CHECK_ERR(ei_context_create(ei_context_config(S->ctx), &own), EI_OK);
    CHECK(own && ei_context_config(own)->simd == ei_context_config(S->ctx)->simd,
          "thread %d: its own context has another SIMD path", ith);
    ei_context_destroy(own);
    (void)arg;
}
/* 1. plan layer 0 in parts: each thread its kv heads of one plan, one workspace */
static void ph_profile(shared *S, int ith, long arg) {
    ei_exec x = ex_part(ith, S->nth, S->ws, S->z.profile);
    CHECK_ERR(ei_profile(S->ctx, &x, &layers[0].tq, &layers[0].tk, &S->got[0].plan), EI_OK);
    (void)arg;
}
/* 1, 2. one thread finalises (arg 0: the plan, 1: the chunked plan) */
static void ph_finalize(shared *S, int ith, long arg) {
    CHECK_ERR(ei_plan_finalize(S->ctx, arg ? &S->got[0].chunked : &S->got[0].plan), EI_OK);
    (void)ith;
}
/* 2. the chunk of layer 0 that starts at token arg, in parts */
static void ph_chunk(shared *S, int ith, long t) {
    ei_exec x = ex_part(ith, S->nth, S->ws, S->z.profile);
    ei_tensor qc, kc;
    chunk_views(0, t, &qc, &kc);
    CHECK_ERR(ei_profile_chunk(S->ctx, &x, &qc, &kc, &S->got[0].chunked, t, t + CHUNK >= N), EI_OK);
}
/* 3. attention of layer 0 on the shared plan, ith of nth, one shared output */
static void ph_attend(shared *S, int ith, long arg) {
    ei_exec x = ex_part(ith, S->nth, S->aws, S->z.prefill);
    ei_out_tensor o = ei_out_tensor_make(S->got[0].out, EI_F32, N, HEADS, DIM);
    CHECK_ERR(ei_attention_prefill(S->ctx, &x, &layers[0].tq, &layers[0].tk, &layers[0].tv, &S->got[0].plan, &o, 0), EI_OK);
    (void)arg;
}
/* 4. every layer's scores, ith of nth, from one decoder shared by all threads */
static void ph_score(shared *S, int ith, long arg) {
    ei_exec x = ex_part(ith, S->nth, S->dws, S->z.decode_keep);
    int l;
    for (l = 0; l < N_LAYERS; ++l)
        CHECK_ERR(ei_decode_score(S->ctx, &x, &S->ref[l].dec, &layers[l].tk, score_map(l), 0, S->got[l].scores), EI_OK);
    (void)arg;
}
/* 4. every layer's keep set from those scores, in parts (part 0 selects,
   the others return at once), each layer on the round's own decoder */
static void ph_select(shared *S, int ith, long arg) {
    const ei_config *c = ei_context_config(S->ctx);
    ei_exec x = ex_part(ith, S->nth, S->dws, S->z.decode_keep);
    int l;
    for (l = 0; l < N_LAYERS; ++l) {
        ei_keep_set ks;
        memset(&ks, 0, sizeof ks);
        ks.heads_out = KV;
        ks.capacity = c->decode_budget;
        ks.index = S->got[l].sel;
        CHECK_ERR(ei_decode_select(S->ctx, &x, &S->got[l].dec, S->got[l].scores, N, &ks), EI_OK);
        if (ith == 0) S->got[l].n_sel = ks.n_kept;
    }
    (void)arg;
}
/* 5. layer arg's decode step, part ith of nth: each part its slice of the
   keys into the partials in the one workspace ... */
static void ph_decode(shared *S, int ith, long l) {
    ei_exec x = ex_part(ith, S->nth, S->decws, S->z.decode);
    ei_tensor q;
    ei_keep_set ks;
    int64_t off;
    const ei_keep_set *keep = decode_step(S->ctx, (int)l, S->ref, &q, &ks, &off);
    ei_out_tensor o = dout_tensor(S->got[l].dout, (int)l);
    CHECK_ERR(ei_attention_decode(S->ctx, &x, &q, &layers[l].tk, &layers[l].tv, keep, &o, off), EI_OK);
}
/* ... then, after the barrier, each part its share of the output rows */
static void ph_merge(shared *S, int ith, long l) {
    ei_exec x = ex_part(ith, S->nth, S->decws, S->z.decode);
    ei_out_tensor o = dout_tensor(S->got[l].dout, (int)l);
    CHECK_ERR(ei_attention_decode_merge(S->ctx, &x, &o), EI_OK);
}
/* EI_TEST_SELFTEST_RACE: a plain data race, which TSan must report */
static void ph_race(shared *S, int ith, long arg) {
    if (ith < 2) S->racy += ith + 1;
    (void)arg;
}
/* 6. mixed, all at once: threads 0-1 profile layer 1 (2 parts on the
   profiling workspace), threads 2-3 attend layer 2 densely (2 parts on a
   workspace of their own), then every thread decodes a layer of its own,
   then each thread's errors */
static void ph_mixed(shared *S, int ith, long arg) {
    const ei_context *ctx = S->ctx;
    int nth = S->nth, l;
    if (nth >= 4) {
        if (ith < 2) {
            ei_exec x = ex_part(ith, 2, S->ws, S->z.profile);
            CHECK_ERR(ei_profile(ctx, &x, &layers[1].tq, &layers[1].tk, &S->got[1].plan), EI_OK);
        } else if (ith < 4) {
            ei_exec x = ex_part(ith - 2, 2, S->aws2, S->aw2);
            ei_out_tensor o = ei_out_tensor_make(S->got[2].out, EI_F32, N, HEADS, DIM);
            /* layer 2 attends densely (plan NULL) in two parts while layer 1 is planned */
            CHECK_ERR(ei_attention_prefill(ctx, &x, &layers[2].tq, &layers[2].tk, &layers[2].tv, NULL, &o, 0), EI_OK);
        }
    }
    /* every thread decodes a layer of its own, all at once */
    if (ith < N_LAYERS) {
        CHECK_ERR(decode_layer(ctx, ith, 1, S->got[ith].keep, &S->got[ith].n_kept, NULL), EI_OK);
    }
    /* thread-local error messages: each thread its own code */
    for (l = 0; l < 50; ++l) {
        ei_shape sh;
        ei_sizes z;
        ei_result r;
        const char *want;
        memset(&sh, 0, sizeof sh);
        sh.max_tokens = 100; sh.n_heads = 2; sh.n_kv_heads = 2; sh.head_dim = 16;
        switch ((ith + l) % 4) {
            case 0: r = ei_layer_sizes(ctx, &sh, NULL); want = "EI_ERR_NULL"; break;
            case 1: sh.max_tokens = -1; r = ei_layer_sizes(ctx, &sh, &z); want = "EI_ERR_SIZE"; break;
            case 2: sh.n_heads = 6; sh.n_kv_heads = 4; r = ei_layer_sizes(ctx, &sh, &z); want = "EI_ERR_GQA"; break;
            default: sh.plan_flags = 0x40; r = ei_layer_sizes(ctx, &sh, &z); want = "EI_ERR_CONFIG"; break;
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
    long t, l;
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
    add_phase(S, "select", ph_select, 0, 0);
    for (l = 0; l < N_LAYERS; ++l) {
        add_phase(S, "decode", ph_decode, l, 0);
        add_phase(S, "merge", ph_merge, l, 0);
    }
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

/* Each decode output of the parts against the one-thread call (a key split
   of its own: within float32 summation order, the bf16 P of the kernels
   that round it on 16-bit layers) and, bit for bit, against the call on as
   many threads. */
static float max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0.0f;
    size_t i;
    for (i = 0; i < n; ++i) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN-safe */
    }
    return m;
}

/* The same calls as the parts made, on nth of the library's threads (the
   caller and nth - 1 workers): every result must equal the parts' (and the
   single-threaded reference's) bit for bit. */
static void threads_vs_parts(const ei_context *ctx, const results *ref, const shared *S, const char *what) {
    const int nth = S->nth;
    const ei_sizes z = sizes_n(ctx, nth);
    void *ws = guarded_alloc(z.workspace);
    ei_exec x = ex(nth, ws, z.workspace);
    ei_plan p, pc;
    float *out = (float *)guarded_alloc(out_bytes()), *scores = (float *)guarded_alloc(score_bytes()),
          *dout = (float *)guarded_alloc(dout_bytes());
    ei_out_tensor o = ei_out_tensor_make(out, EI_F32, N, HEADS, DIM);
    int32_t *keep = (int32_t *)malloc(keep_bytes(ctx)), n_kept = -1;
    long t;
    int l;
    CHECK_ERR(ei_plan_init(ctx, &p, N, KV, DIM, 0, NULL, 0), EI_OK);
    CHECK_ERR(ei_plan_init(ctx, &pc, N, KV, DIM, EI_PLAN_CHUNKED, NULL, 0), EI_OK);
    CHECK_ERR(ei_profile(ctx, &x, &layers[0].tq, &layers[0].tk, &p), EI_OK);
    CHECK(plans_equal(&p, &S->got[0].plan) && plans_equal(&p, &ref[0].plan),
          "%s: ei_profile on %d threads differs from %d parts or from one thread", what, nth, nth);
    for (t = 0; t < N; t += CHUNK) {
        ei_tensor qc, kc;
        chunk_views(0, t, &qc, &kc);
        CHECK_ERR(ei_profile_chunk(ctx, &x, &qc, &kc, &pc, t, t + CHUNK >= N), EI_OK);
    }
    CHECK(plans_equal(&pc, &S->got[0].chunked) && plans_equal(&pc, &ref[0].chunked),
          "%s: ei_profile_chunk on %d threads differs from %d parts or from one thread", what, nth, nth);
    CHECK_ERR(ei_attention_prefill(ctx, &x, &layers[0].tq, &layers[0].tk, &layers[0].tv, &p, &o, 0), EI_OK);
    CHECK(!memcmp(out, S->got[0].out, out_bytes()) && !memcmp(out, ref[0].out, out_bytes()),
          "%s: ei_attention_prefill on %d threads differs from %d parts or from one thread", what, nth, nth);
    for (l = 0; l < N_LAYERS; ++l) {
        const float tol = 2.0f * (float)test_tols[layers[l].dtype != EI_F32 && kernel_rounds_p(ei_context_config(ctx)->simd)
                                                      ? TOL_ATTN_ROUNDS_P
                                                      : TOL_ATTN_REF].max_abs; /* |v| <= 1 */
        const size_t nd = (size_t)(l & 1 ? 1 : DSTEP) * HEADS * DIM;
        float diff;
        CHECK_ERR(ei_decode_score(ctx, &x, &ref[l].dec, &layers[l].tk, score_map(l), 0, scores), EI_OK);
        CHECK(!memcmp(scores, S->got[l].scores, score_bytes()) && !memcmp(scores, ref[l].scores, score_bytes()),
              "%s: layer %d ei_decode_score on %d threads differs from %d parts or from one thread", what, l, nth, nth);
        CHECK_ERR(decode_step_call(ctx, ref, l, &x, dout), EI_OK);
        diff = max_abs_diff(S->got[l].dout, ref[l].dout, nd);
        CHECK(!memcmp(dout, S->got[l].dout, nd * sizeof(float)) && diff <= tol,
              "%s: layer %d decode step (%s) on %d threads differs from %d parts, or the parts from one thread by %g "
              "(bound %g)", what, l, l & 1 ? "keep set" : "dense", nth, nth, (double)diff, (double)tol);
        CHECK_ERR(decode_layer(ctx, l, nth, keep, &n_kept, NULL), EI_OK);
        CHECK(n_kept == ref[l].n_kept && !memcmp(keep, ref[l].keep, sizeof(int32_t) * KV * (size_t)n_kept),
              "%s: layer %d ei_decode_keep on %d threads differs from one thread", what, l, nth);
    }
    CHECK(guard_intact(ws, z.workspace) && guard_intact(out, out_bytes()) && guard_intact(scores, score_bytes()) &&
              guard_intact(dout, dout_bytes()),
          "%s: threads guards", what);
    ei_plan_free(ctx, &p);
    ei_plan_free(ctx, &pc);
    guarded_free(ws); guarded_free(out); guarded_free(scores); guarded_free(dout);
    free(keep);
}

static void threaded_round(const ei_context *ctx, const results *ref, int nth, int form, int race, const char *what) {
    shared S;
    worker W[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int i, l, ph;
    long logged0 = logged();
    memset(&S, 0, sizeof S);
    S.ctx = ctx;
    S.ref = ref;
    S.nth = nth;
    S.z = sizes_n(ctx, nth);
    S.aw2 = sizes_n(ctx, 2).prefill;
    build_phases(&S, race);
    for (l = 0; l < N_LAYERS; ++l) {
        CHECK_ERR(ei_plan_init(ctx, &S.got[l].plan, N, KV, DIM, 0, NULL, 0), EI_OK);
        CHECK_ERR(ei_plan_init(ctx, &S.got[l].chunked, N, KV, DIM, EI_PLAN_CHUNKED, NULL, 0), EI_OK);
        S.got[l].out = (float *)guarded_alloc(out_bytes());
        S.got[l].scores = (float *)guarded_alloc(score_bytes());
        S.got[l].dout = (float *)guarded_alloc(dout_bytes());
        S.got[l].keep = (int32_t *)malloc(keep_bytes(ctx));
        S.got[l].sel = (int32_t *)malloc(keep_bytes(ctx));
        memset(S.got[l].keep, 0xff, keep_bytes(ctx));
        memset(S.got[l].sel, 0xff, keep_bytes(ctx));
        S.got[l].n_sel = -1;
        /* the select phase's decoder: observed as the reference's */
        S.got[l].dec_mem = guarded_alloc(S.z.decoder);
        CHECK_ERR(ei_decoder_init(ctx, &S.got[l].dec, HEADS, KV, DIM, S.got[l].dec_mem, S.z.decoder), EI_OK);
        CHECK_ERR(observe_layer(ctx, l, &S.got[l].dec), EI_OK);
    }
    S.ws = guarded_alloc(S.z.profile);
    S.aws = guarded_alloc(S.z.prefill);
    S.dws = guarded_alloc(S.z.decode_keep);
    S.decws = guarded_alloc(S.z.decode);
    S.aws2 = guarded_alloc(S.aw2);
    for (i = 0; i < nth; ++i) {
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
    CHECK(guard_intact(S.ws, S.z.profile) && guard_intact(S.aws, S.z.prefill) && guard_intact(S.dws, S.z.decode_keep) &&
              guard_intact(S.decws, S.z.decode) && guard_intact(S.aws2, S.aw2),
          "%s: the %d parts' workspace guards", what, nth);
    guarded_free(S.ws);
    guarded_free(S.aws);
    guarded_free(S.dws);
    guarded_free(S.decws);
    guarded_free(S.aws2);
    CHECK(logged() - logged0 >= 50L * nth, "%s: the logger heard %ld messages from %d threads, %ld expected", what,
          logged() - logged0, nth, 50L * nth);
    /* layer 1's plan was profiled in two halves by threads 0 and 1 */
    if (nth >= 4) CHECK_ERR(ei_plan_finalize(ctx, &S.got[1].plan), EI_OK);
    CHECK(plans_equal(&S.got[0].plan, &ref[0].plan), "%s: plan from %d parts differs from single-threaded", what, nth);
    CHECK(plans_equal(&S.got[0].chunked, &ref[0].chunked), "%s: chunked plan from %d parts differs", what, nth);
    CHECK(guard_intact(S.got[0].out, out_bytes()) && !memcmp(S.got[0].out, ref[0].out, out_bytes()),
          "%s: attention in %d parts differs from one thread", what, nth);
    for (l = 0; l < N_LAYERS; ++l) {
        CHECK(guard_intact(S.got[l].scores, score_bytes()) && !memcmp(S.got[l].scores, ref[l].scores, score_bytes()),
              "%s: layer %d scores of %d parts on one decoder differ from one call", what, l, nth);
        CHECK(S.got[l].n_sel == ref[l].n_kept &&
                  !memcmp(S.got[l].sel, ref[l].keep, sizeof(int32_t) * KV * (size_t)ref[l].n_kept),
              "%s: layer %d keep set selected in %d parts differs from ei_decode_keep on one thread", what, l, nth);
        CHECK(guard_intact(S.got[l].dout, dout_bytes()), "%s: layer %d decode output guards", what, l);
    }
    if (nth >= 4) {
        CHECK(plans_equal(&S.got[1].plan, &ref[1].plan), "%s: layer 1 plan (profiled during attention) differs", what);
        {
            /* dense reference of layer 2 */
            const ei_sizes z1 = sizes_n(ctx, 1);
            void *aws = guarded_alloc(z1.prefill);
            ei_exec x = ex(1, aws, z1.prefill);
            float *dense = (float *)guarded_alloc(out_bytes());
            ei_out_tensor o = ei_out_tensor_make(dense, EI_F32, N, HEADS, DIM);
            CHECK_ERR(ei_attention_prefill(ctx, &x, &layers[2].tq, &layers[2].tk, &layers[2].tv, NULL, &o, 0), EI_OK);
            CHECK(!memcmp(dense, S.got[2].out, out_bytes()), "%s: dense attention of layer 2 in 2 parts differs", what);
            guarded_free(aws);
            guarded_free(dense);
        }
    }
    for (l = 0; l < N_LAYERS && l < nth; ++l)
        CHECK(S.got[l].n_kept == ref[l].n_kept &&
                  !memcmp(S.got[l].keep, ref[l].keep, sizeof(int32_t) * KV * (size_t)ref[l].n_kept),
              "%s: keep set of layer %d decoded concurrently differs", what, l);
    threads_vs_parts(ctx, ref, &S, what);
    for (l = 0; l < N_LAYERS; ++l) {
        ei_plan_free(ctx, &S.got[l].plan);
        ei_plan_free(ctx, &S.got[l].chunked);
        guarded_free(S.got[l].out);
        guarded_free(S.got[l].scores);
        guarded_free(S.got[l].dout);
        guarded_free(S.got[l].dec_mem);
        free(S.got[l].keep);
        free(S.got[l].sel);
    }
}

/* A call's ei_exec refused: the code, and a message that names it. */
#define CHECK_EXEC(expr, code)                                                                                   \
    do {                                                                                                         \
        ei_result r_ = (expr);                                                                                   \
        CHECK(r_ == (code) && strstr(ei_last_error(), #code) != NULL,                                            \
              "%s: %s returned %s (%s), expected %s", what, #expr, ei_result_name(r_), ei_last_error(), #code); \
    } while (0)

/* The library's own threads against the reference, the refusals of an
   ei_exec a call cannot run on, and failures inside a thread or a part. */
static void helpers_round(const ei_context *ctx, const results *ref, int nth, const char *what) {
    const ei_sizes z = sizes_n(ctx, nth), z1 = sizes_n(ctx, 1);
    ei_plan p;
    void *ws, *aws;
    ei_exec x, xa;
    float *out = (float *)guarded_alloc(out_bytes());
    ei_out_tensor o = ei_out_tensor_make(out, EI_F32, N, HEADS, DIM);
    ws = guarded_alloc(z.profile);
    aws = guarded_alloc(z.prefill);
    x = ex(nth, ws, z.profile);
    xa = ex(nth, aws, z.prefill);
    CHECK_ERR(ei_plan_init(ctx, &p, N, KV, DIM, 0, NULL, 0), EI_OK);
    CHECK_ERR(ei_profile(ctx, &x, &layers[0].tq, &layers[0].tk, &p), EI_OK);
    CHECK(plans_equal(&p, &ref[0].plan), "%s: ei_profile on %d threads differs", what, nth);
    {   /* chunked planning on threads, chunk by chunk (kv-head ranges over its workers) */
        ei_plan pc;
        long t;
        CHECK_ERR(ei_plan_init(ctx, &pc, N, KV, DIM, EI_PLAN_CHUNKED, NULL, 0), EI_OK);
        for (t = 0; t < N; t += CHUNK) {
            ei_tensor qc, kc;
            chunk_views(0, t, &qc, &kc);
            CHECK_ERR(ei_profile_chunk(ctx, &x, &qc, &kc, &pc, t, t + CHUNK >= N), EI_OK);
        }
        CHECK(plans_equal(&pc, &ref[0].chunked), "%s: ei_profile_chunk on %d threads differs", what, nth);
        ei_plan_free(ctx, &pc);
    }
    CHECK_ERR(ei_attention_prefill(ctx, &xa, &layers[0].tq, &layers[0].tk, &layers[0].tv, &p, &o, 0), EI_OK);
    CHECK(!memcmp(out, ref[0].out, out_bytes()), "%s: ei_attention_prefill on %d threads differs", what, nth);
    CHECK(guard_intact(ws, z.profile) && guard_intact(aws, z.prefill) && guard_intact(out, out_bytes()),
          "%s: helper guards", what);
    if (nth > 1) {
        /* a failure inside a worker comes back, with its message, to the caller:
           NaN in the keys of the last kv head (the last worker's range), in
           the last query of the last head */
        size_t kn = (size_t)N * KV * DIM, qn = (size_t)N * HEADS * DIM;
        float *kbad = (float *)malloc(sizeof(float) * kn), *qbad = (float *)malloc(sizeof(float) * qn);
        ei_tensor kb = ei_tensor_make(kbad, EI_F32, N, KV, DIM), qb = ei_tensor_make(qbad, EI_F32, N, HEADS, DIM);
        ei_exec xp;
        if (!kbad || !qbad) { printf("out of memory\n"); exit(2); }
        memcpy(kbad, layers[0].k, sizeof(float) * kn);
        memcpy(qbad, layers[0].q, sizeof(float) * qn);
        kbad[((size_t)(N / 2) * KV + KV - 1) * DIM + 3] = NAN;
        qbad[qn - 1] = NAN;
        CHECK_ERR(ei_profile(ctx, &x, &layers[0].tq, &kb, &p), EI_ERR_NONFINITE);
        CHECK_ERR(ei_attention_prefill(ctx, &xa, &qb, &layers[0].tk, &layers[0].tv, &ref[0].plan, &o, 0), EI_ERR_NONFINITE);
        /* in parts: only the part whose kv heads hold the NaN sees it */
        xp = ex_part(0, nth, ws, z.profile);
        CHECK_ERR(ei_profile(ctx, &xp, &layers[0].tq, &kb, &p), EI_OK);
        xp = ex_part(nth - 1, nth, ws, z.profile);
        CHECK_ERR(ei_profile(ctx, &xp, &layers[0].tq, &kb, &p), EI_ERR_NONFINITE);
        /* refused: threads and parts at once, a part past nth, a workspace of
           one thread shared by 2 parts, ei_decode_keep in parts. (Part 0: the
           library checks overlaps with the workspace a part needs before its
           size, so a later part's short slice reaches past the buffer and may
           be refused as overlapping whatever lies there: EI_ERR_OVERLAP.) */
        xp = ex_part(0, nth, ws, z.profile);
        xp.n_threads = nth;
        CHECK_EXEC(ei_profile(ctx, &xp, &layers[0].tq, &layers[0].tk, &p), EI_ERR_CONFIG);
        xp = ex_part(nth, nth, ws, z.profile);
        CHECK_EXEC(ei_profile_chunk(ctx, &xp, &layers[0].tq, &layers[0].tk, &p, 0, 1), EI_ERR_SIZE);
        xp = ex_part(0, 2, ws, z1.profile);
        CHECK_EXEC(ei_profile(ctx, &xp, &layers[0].tq, &layers[0].tk, &p), EI_ERR_WORKSPACE);
        xp = ex_part(0, 2, aws, z1.prefill);
        CHECK_EXEC(ei_attention_prefill(ctx, &xp, &layers[0].tq, &layers[0].tk, &layers[0].tv, &ref[0].plan, &o, 0),
                   EI_ERR_WORKSPACE);
        {
            void *dws = guarded_alloc(z1.decode_keep);
            xp = ex_part(0, 2, dws, z1.decode_keep);
            CHECK_EXEC(ei_decode_score(ctx, &xp, &ref[0].dec, &layers[0].tk, NULL, 0, out), EI_ERR_WORKSPACE);
            guarded_free(dws);
        }
        {
            ei_decoder dec = ref[0].dec; /* refused before it is read */
            ei_keep_set ks;
            memset(&ks, 0, sizeof ks);
            xp = ex_part(0, nth, ws, z.profile);
            CHECK_EXEC(ei_decode_keep(ctx, &xp, &dec, &layers[0].tk, &ks), EI_ERR_CONFIG);
        }
        free(kbad);
        free(qbad);
    }
    ei_plan_free(ctx, &p);
    guarded_free(ws);
    guarded_free(aws);
    guarded_free(out);
}

/* The library's threads asked for by several callers at once on one
   context: one call at a time has the context's workers (ei__pool), the
   others start threads of their own; every plan must still equal the
   reference. */
typedef struct concurrent_arg {
    const ei_context *ctx;
    const results *ref;
    int nth, ok;
} concurrent_arg;
static void *concurrent_helper(void *a) {
    concurrent_arg *c = (concurrent_arg *)a;
    const ei_sizes z = sizes_n(c->ctx, c->nth);
    ei_plan p;
    void *ws;
    ei_exec x;
    int i;
    c->ok = 1;
    ws = guarded_alloc(z.profile);
    x = ex(c->nth, ws, z.profile);
    if (ei_plan_init(c->ctx, &p, N, KV, DIM, 0, NULL, 0) != EI_OK) { c->ok = 0; guarded_free(ws); return NULL; }
    for (i = 0; i < 3; ++i) {
        if (ei_plan_reset(&p) != EI_OK || ei_profile(c->ctx, &x, &layers[0].tq, &layers[0].tk, &p) != EI_OK ||
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
        CHECK(started[i] && a[i].ok, "%s: ei_profile on %d threads from caller %d of %d at once", what, nth, i, CALLERS);
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
    void *pws, *aws, *dws, *decws;  /* one workspace of each kind, for ST_MT threads or parts:
                                       profiling, prefill, decode keep sets, decode attention */
    size_t pw, aw, dw, decw;
    synth_layer D;                  /* decode cache of ST_DN rows, f32 */
    ei_decoder dec;
    void *dec_mem;
    size_t db;
    ei_keep_set ks, ks1;            /* per kv head; shared (heads_out 1) */
    float *scores, *shared, *kc, *vc;
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
    ei_exec x = ex(1, E->pws, E->pw);
    return ei_profile(sampled ? E->sampled : E->ctx, &x, &E->q[0], &E->k[0], sampled ? &E->splan : &E->plan);
}
static ei_result sc_profile_threads(stack_env *E, long nth) {
    ei_exec x = ex((int)nth, E->pws, E->pw);
    return ei_profile(E->ctx, &x, &E->q[0], &E->k[0], &E->plan);
}
/* The nth parts of one call in turn on this thread, then ei_plan_finalize. */
static ei_result sc_profile_parts(stack_env *E, long nth) {
    ei_result r = EI_OK;
    int ith;
    for (ith = 0; ith < nth && r == EI_OK; ++ith) {
        ei_exec x = ex_part(ith, (int)nth, E->pws, E->pw);
        r = ei_profile(E->ctx, &x, &E->q[0], &E->k[0], &E->plan);
    }
    return r == EI_OK ? ei_plan_finalize(E->ctx, &E->plan) : r;
}
static ei_result sc_profile_chunk(stack_env *E, long sampled) {
    ei_exec x = ex(1, E->pws, E->pw);
    ei_result r = EI_OK;
    long t;
    for (t = 0; t < ST_N && r == EI_OK; t += ST_CHUNK) {
        ei_tensor qc = E->q[0], kc = E->k[0];
        qc.data = E->P.q + (size_t)t * ST_PH * ST_DIM;
        qc.n_tokens = t + ST_CHUNK < ST_N ? (long)ST_CHUNK : (long)ST_N - t;
        kc.n_tokens = t + qc.n_tokens;
        r = ei_profile_chunk(sampled ? E->sampled : E->ctx, &x, &qc, &kc, sampled ? &E->schunked : &E->chunked, t,
                             t + ST_CHUNK >= ST_N);
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
    ei_exec x = ex(1, E->aws, E->aw);
    return ei_attention_prefill(E->ctx, &x, &q, &E->k[dt], &E->v[dt], &E->plan, &o, ST_N - ST_AQ);
}
static ei_result sc_attention_threads(stack_env *E, long nth) {
    ei_out_tensor o = ei_out_tensor_make(E->out, EI_F32, ST_AQ, ST_PH, ST_DIM);
    ei_tensor q = stack_last_queries(&E->q[0]);
    ei_exec x = ex((int)nth, E->aws, E->aw);
    return ei_attention_prefill(E->ctx, &x, &q, &E->k[0], &E->v[0], &E->plan, &o, ST_N - ST_AQ);
}
static ei_result sc_attention_parts(stack_env *E, long nth) {
    ei_out_tensor o = ei_out_tensor_make(E->out, EI_F32, ST_AQ, ST_PH, ST_DIM);
    ei_tensor q = stack_last_queries(&E->q[0]);
    ei_result r = EI_OK;
    int ith;
    for (ith = 0; ith < nth && r == EI_OK; ++ith) {
        ei_exec x = ex_part(ith, (int)nth, E->aws, E->aw);
        r = ei_attention_prefill(E->ctx, &x, &q, &E->k[0], &E->v[0], &E->plan, &o, ST_N - ST_AQ);
    }
    return r;
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
    ei_exec x = ex((int)nth, E->dws, E->dw);
    return ei_decode_keep(E->ctx, &x, &E->dec, &E->D.tk, &E->ks);
}
/* Decode attention of the decode layer's last query against its cache
   (through the keep set E->ks when keep is set): in nth parts, the calls
   and then the merges in turn on this thread, or on nth threads. */
static ei_result sc_attn_decode_run(stack_env *E, long nth, int mt, const ei_keep_set *keep) {
    ei_tensor q = ei_tensor_make(E->D.q + (size_t)(ST_DN - 1) * ST_HEADS * ST_DIM, EI_F32, 1, ST_HEADS, ST_DIM);
    ei_out_tensor o = ei_out_tensor_make(E->out, EI_F32, 1, ST_HEADS, ST_DIM);
    ei_exec x;
    ei_result r = EI_OK;
    int ith;
    if (mt) {
        x = ex((int)nth, E->decws, E->decw);
        return ei_attention_decode(E->ctx, &x, &q, &E->D.tk, &E->D.tv, keep, &o, ST_DN - 1);
    }
    for (ith = 0; ith < nth && r == EI_OK; ++ith) {
        x = ex_part(ith, (int)nth, E->decws, E->decw);
        r = ei_attention_decode(E->ctx, &x, &q, &E->D.tk, &E->D.tv, keep, &o, ST_DN - 1);
    }
    for (ith = 0; ith < nth && r == EI_OK; ++ith) {
        x = ex_part(ith, (int)nth, E->decws, E->decw);
        r = ei_attention_decode_merge(E->ctx, &x, &o);
    }
    return r;
}
static ei_result sc_attn_decode(stack_env *E, long nth) { return sc_attn_decode_run(E, nth, 0, NULL); }
static ei_result sc_attn_decode_threads(stack_env *E, long nth) { return sc_attn_decode_run(E, nth, 1, NULL); }
static ei_result sc_attn_decode_keep(stack_env *E, long nth) { return sc_attn_decode_run(E, nth, 0, &E->ks); }
static ei_result sc_attn_decode_keep_threads(stack_env *E, long nth) { return sc_attn_decode_run(E, nth, 1, &E->ks); }
static ei_result sc_score(stack_env *E, long arg) {
    ei_exec x = ex(1, E->dws, E->dw);
    (void)arg;
    return ei_decode_score(E->ctx, &x, &E->dec, &E->D.tk, NULL, 0, E->scores);
}
/* ei_decode_score on nth threads (mt), or in nth parts in turn */
static ei_result sc_score_run(stack_env *E, long nth, int mt) {
    ei_exec x;
    ei_result r = EI_OK;
    int ith;
    if (mt) {
        x = ex((int)nth, E->dws, E->dw);
        return ei_decode_score(E->ctx, &x, &E->dec, &E->D.tk, NULL, 0, E->scores);
    }
    for (ith = 0; ith < nth && r == EI_OK; ++ith) {
        x = ex_part(ith, (int)nth, E->dws, E->dw);
        r = ei_decode_score(E->ctx, &x, &E->dec, &E->D.tk, NULL, 0, E->scores);
    }
    return r;
}
static ei_result sc_score_threads(stack_env *E, long nth) { return sc_score_run(E, nth, 1); }
static ei_result sc_score_parts(stack_env *E, long nth) { return sc_score_run(E, nth, 0); }
static ei_result sc_select(stack_env *E, long arg) {
    ei_exec x = ex(1, E->dws, E->dw);
    (void)arg;
    return ei_decode_select(E->ctx, &x, &E->dec, E->scores, ST_DN, &E->ks);
}
static ei_result sc_shared_add(stack_env *E, long arg) {
    ei_exec x = ex(1, E->dws, E->dw);
    (void)arg;
    return ei_decode_shared_add(E->ctx, &x, &E->dec, E->scores, ST_DN, NULL, E->shared);
}
static ei_result sc_select_shared(stack_env *E, long arg) {
    ei_exec x = ex(1, E->dws, E->dw);
    (void)arg;
    return ei_decode_select_shared(E->ctx, &x, &E->dec, E->shared, ST_DN, &E->ks1);
}
static ei_result sc_compact(stack_env *E, long arg) {
    ei_out_tensor ko = ei_out_tensor_make(E->kc, EI_F32, ST_DN, ST_KV, ST_DIM);
    ei_out_tensor vo = ei_out_tensor_make(E->vc, EI_F32, ST_DN, ST_KV, ST_DIM);
    (void)arg;
    return ei_kv_compact(E->ctx, &E->ks, &ko, &vo);
}
/* A refused call: the message formatted and given to the logger. */
static ei_result sc_error(stack_env *E, long arg) {
    ei_exec x = ex(1, E->pws, 1);
    ei_result r = ei_profile(E->ctx, &x, &E->q[0], &E->k[0], &E->plan);
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
    ei_sizes zp, zs, zd;
    size_t bytes;
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
    CHECK_ERR(ei_plan_init(E->ctx, &E->plan, ST_N, ST_PKV, ST_DIM, 0, NULL, 0), EI_OK);
    CHECK_ERR(ei_plan_init(E->sampled, &E->splan, ST_N, ST_PKV, ST_DIM, 0, NULL, 0), EI_OK);
    CHECK_ERR(ei_plan_init(E->ctx, &E->chunked, ST_N, ST_PKV, ST_DIM, EI_PLAN_CHUNKED, NULL, 0), EI_OK);
    CHECK_ERR(ei_plan_init(E->sampled, &E->schunked, ST_N, ST_PKV, ST_DIM, EI_PLAN_CHUNKED, NULL, 0), EI_OK);
    /* one workspace of each kind for ST_MT threads or parts (and fewer) */
    zp = sizes_of(E->ctx, ST_N, ST_PH, ST_PKV, ST_DIM, ST_MT);
    zs = sizes_of(E->sampled, ST_N, ST_PH, ST_PKV, ST_DIM, ST_MT);
    zd = sizes_of(E->ctx, ST_DN, ST_HEADS, ST_KV, ST_DIM, ST_MT);
    E->pw = zp.profile > zs.profile ? zp.profile : zs.profile;
    E->aw = zp.prefill;
    E->dw = zd.decode_keep;
    E->decw = zd.decode;
    E->pws = malloc(E->pw);
    E->aws = malloc(E->aw);
    E->dws = malloc(E->dw);
    E->decws = malloc(E->decw);
    E->out = (float *)malloc(sizeof(float) * ST_N * ST_PH * ST_DIM);
    E->D = synth_layer_make(ST_DN, ST_HEADS, ST_KV, ST_DIM, 64, 8);
    if (!E->decws) { printf("out of memory\n"); exit(2); }
    E->db = zd.decoder;
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
    free(E->decws);
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
    {"ei_profile 2 threads", sc_profile_threads, 2, 0},
    {"ei_profile 8 threads", sc_profile_threads, 8, 0},
    {"ei_profile 3 parts + finalize", sc_profile_parts, 3, 0},
    {"ei_profile_chunk (3 chunks)", sc_profile_chunk, 0, 0},
    {"ei_profile_chunk (sampled)", sc_profile_chunk, 1, 0},
    {"ei_attention_prefill f32", sc_attention, 0, 0},
    {"ei_attention_prefill f16", sc_attention, 1, 0},
    {"ei_attention_prefill bf16", sc_attention, 2, 0},
    {"ei_attention_prefill 2 threads", sc_attention_threads, 2, 0},
    {"ei_attention_prefill 8 threads", sc_attention_threads, 8, 0},
    {"ei_attention_prefill 3 parts", sc_attention_parts, 3, 0},
    {"ei_decode_observe", sc_observe, 0, 2},
    {"ei_decode_keep", sc_keep, 0, 1},
    {"ei_decode_keep 2 threads", sc_keep, 2, 1},
    {"ei_decode_keep 8 threads", sc_keep, 8, 1},
    {"ei_decode_score", sc_score, 0, 1},
    {"ei_decode_score 8 threads", sc_score_threads, 8, 0},
    {"ei_decode_score 3 parts", sc_score_parts, 3, 0},
    {"ei_decode_select", sc_select, 0, 0},
    {"ei_attention_decode + merge 1", sc_attn_decode, 1, 0},
    {"ei_attention_decode + merge 3 parts", sc_attn_decode, 3, 0},
    {"ei_attention_decode 2 threads", sc_attn_decode_threads, 2, 0},
    {"ei_attention_decode 8 threads", sc_attn_decode_threads, 8, 0},
    {"ei_attention_decode keep, 2 parts", sc_attn_decode_keep, 2, 0},
    {"ei_attention_decode keep, 8 threads", sc_attn_decode_keep_threads, 8, 0},
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
                    if (nth > 3) threaded_round(ctx, ref, 2, form, race, what);       /* and 2 parts */
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
