/* tests/test_backends.c - the same scenarios on the CPU backend and, when a
   CUDA context can be created (EI_BACKEND_CUDA, the plugin from
   $EI_CUDA_LIBRARY or the usual names), on the GPU: both backends must
   return the same result codes and the same results (plans: identical block
   lists; keep-sets: identical; attention: within bf16 tolerance).

     test_backends                 the CPU half, and the GPU half when a GPU is there
     test_backends --require-gpu   a missing GPU is a failure

   Scenarios:
     1 decode scoring with fewer observed queries than cfg.window (20 of 32),
       then with the ring wrapped (45 observed): EI_OK, the same keep-sets
     2 NaN/Inf in the queries decode_observe keeps: EI_ERR_NONFINITE, nothing
       changed; NaN in a query it drops: EI_OK; the rings equal
     3 a plan laid out by a context with a smaller base_budget, used by a
       context whose budgets need longer rows: EI_ERR_SHAPE (profile); the
       same code on both backends for attention
     4 interleaved views (head_stride 136, head_dim 128, token_stride 264 for
       2 kv heads; bf16): accepted, the same plan, attention within tolerance,
       padding neither read nor written
     5 ei_plan_free of a device plan without its CUDA context: EI_ERR_STATE,
       the plan left as it is (the CPU half simulates one)
     6 kv_compact with a keep index that is not ascending inside the cache:
       EI_ERR_SHAPE naming [h][i], the caches unchanged; a valid one moves the
       same rows on both

     7 rankings beyond the paper: the sampled ranking (the GPU's wgmma,
       mma.sync and CUDA-core paths), top_p counts and sink/local blocks, ragged and
       per-segment budgets: the always-kept blocks identical, counts equal
       but at knife-edges of top_p, kept sets equal up to near-ties of the
       ranking score (recomputed by the test in double); the CPU's rows also
       against the ideal rows of those scores
     8 decode over a row map (rows out of position order, empty rows NaN):
       ei_decode_keep with row_pos and positions, ei_decode_score in parts
       (ith/nth, one workspace), ei_decode_select, a keep set per query head over per-kv-head
       maps, compaction and a second compression, the shared keep set of two
       layers and its compaction of every head, the misuse codes: kept
       positions equal up to near-ties, pooled scores within 1e-3

   Data move with ei_device_alloc / ei_device_copy / ei_plan_copy; no CUDA
   header or library at build time. */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The code attention returns for a plan whose rows are shorter than the
   context's budgets need (scenario 3). The header refuses such a plan in
   profiling (EI_ERR_SHAPE) but not yet in attention, where the plan's own
   rows are consistent: both backends must agree either way. */
#ifndef EI_TEST_SMALL_PLAN_ATTENTION
#define EI_TEST_SMALL_PLAN_ATTENTION EI_OK
#endif

/* ------------------------------------------------------------ data */
static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static double urand(void) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
static float nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
static uint16_t bf16(float x) { return ei__f32_to_bf16(x); }
static float bf16_f(uint16_t x) { return ei__bf16_to_f32(x); }
/* n bf16 values: normal (scale) or small integers in [-3, 3] (exact in every
   summation order, so both backends score blocks bit-identically). */
static uint16_t *bf16_normal(size_t n, float scale) {
    uint16_t *x = (uint16_t *)malloc(n * 2);
    size_t i;
    for (i = 0; i < n; ++i) x[i] = bf16(scale * nrand());
    return x;
}
static uint16_t *bf16_ints(size_t n) {
    uint16_t *x = (uint16_t *)malloc(n * 2);
    size_t i;
    for (i = 0; i < n; ++i) x[i] = bf16((float)((int)(urand() * 7.0) - 3));
    return x;
}


/* ------------------------------------------------------------ 1: decode window */
enum { S1_H = 4, S1_KV = 2, S1_D = 64, S1_Q = 45, S1_N = 225 };
/* Keys of random norms (0.5 .. 3) spread the pooled scores; with this seed
   the kept and the dropped positions of every head and stage are 1e-2 apart
   (relative) at the boundary, far above the backends' float32 differences
   (~1e-6), so the keep-sets must be identical. The CPU half checks the data
   keep at least 2e-3 ("test data"). */
#ifndef S1_SEED
#define S1_SEED 33u
#endif
static uint16_t *s1_keys(void) {
    uint16_t *k = (uint16_t *)malloc((size_t)S1_N * S1_KV * S1_D * 2);
    size_t t, i;
    for (t = 0; t < (size_t)S1_N * S1_KV; ++t) {
        float norm = 0.5f + 2.5f * (float)urand();
        for (i = 0; i < S1_D; ++i) k[t * S1_D + i] = bf16(norm * nrand());
    }
    return k;
}
static ei_config s1_config(void) {
    ei_config c = ei_config_default(); /* window 32, gap 16, avg pooling 5, per kv head */
    c.decode_budget = 64;
    return c;
}
/* One keep-set as the host sees it. */
typedef struct keep_out {
    ei_result r;
    int64_t observed, window_w, n, L;
    int32_t n_kept, compressed, cap, heads;
    int32_t *index;  /* [heads][cap] */
    uint8_t *mask;   /* [heads][n] */
    float *pooled;   /* [heads][n] (first L meaningful) */
} keep_out;
static void keep_out_free(keep_out *o) { free(o->index); free(o->mask); free(o->pooled); }

typedef struct s1_out { keep_out stage[2]; } s1_out;

static void s1_run(int gpu, const uint16_t *q, const uint16_t *k, s1_out *o) {
    ei_config c = s1_config();
    side s = side_make(gpu, c);
    ei_sizes sz = layer_sizes(s.ctx, S1_N, S1_H, S1_KV, S1_D, 0, 1);
    size_t ring_bytes = sz.decoder, ws_bytes = sz.decode_keep;
    void *ring, *dq, *dk, *ws;
    ei_decoder dec;
    ei_exec x;
    int stage, heads = S1_KV, cap = c.decode_budget;
    int64_t q_done = 0;
    ring = mem_new(&s, ring_bytes);
    CHECK_ERR(ei_decoder_init(s.ctx, &dec, S1_H, S1_KV, S1_D, ring, ring_bytes), EI_OK);
    dq = mem_up(&s, q, (size_t)S1_Q * S1_H * S1_D * 2);
    dk = mem_up(&s, k, (size_t)S1_N * S1_KV * S1_D * 2);
    ws = mem_new(&s, ws_bytes);
    x = ex(1, ws, ws_bytes);
    for (stage = 0; stage < 2; ++stage) {
        keep_out *ko = &o->stage[stage];
        int64_t observe_to = stage == 0 ? 20 : S1_Q, n = stage == 0 ? 200 : S1_N;
        ei_keep_set ks;
        ei_tensor tk = ei_tensor_make(dk, EI_BF16, n, S1_KV, S1_D);
        /* stage 0: 20 prompt queries; stage 1: 25 generated ones, 5 at a time */
        while (q_done < observe_to) {
            int64_t take = stage == 0 ? observe_to - q_done : 5;
            ei_tensor tq = ei_tensor_make((const char *)dq + (size_t)q_done * S1_H * S1_D * 2, EI_BF16, take, S1_H, S1_D);
            /* the queries of the cache's newest positions: 180 + q_done (200 rows, then 225) */
            CHECK_ERR(ei_decode_observe(s.ctx, &dec, &tq, 200 - 20 + q_done, stage), EI_OK);
            q_done += take;
        }
        memset(&ks, 0, sizeof ks);
        ks.heads_out = heads;
        ks.capacity = cap;
        ks.index = (int32_t *)mem_new(&s, (size_t)heads * cap * 4);
        ks.mask = (uint8_t *)mem_new(&s, (size_t)heads * n);
        ks.mask_capacity = n;
        ks.pooled = (float *)mem_new(&s, (size_t)heads * n * 4);
        ks.pooled_capacity = n;
        if (stage == 0) { /* the view padded past the newest position, no row map: refused on both backends */
            ei_tensor padded = tk;
            padded.n_tokens = n + 8;
            CHECK_ERR(ei_decode_keep(s.ctx, &x, &dec, &padded, &ks), EI_ERR_SHAPE);
            CHECK(ks.n_kept == 0, "1 (%s): a refused padded keep set its counts", side_name(&s));
        }
        ko->r = ei_decode_keep(s.ctx, &x, &dec, &tk, &ks);
        CHECK(ko->r == EI_OK, "1 (%s): decode_keep with %lld observed: %s", side_name(&s), (long long)dec.n_observed,
              ei_last_error());
        ko->observed = dec.n_observed;
        ko->window_w = ei__decode_window(&c, &dec);
        ko->n = n;
        ko->L = n - ko->window_w;
        ko->n_kept = ks.n_kept;
        ko->compressed = ks.compressed;
        ko->cap = cap;
        ko->heads = heads;
        ko->index = (int32_t *)mem_down(&s, ks.index, (size_t)heads * cap * 4);
        ko->mask = (uint8_t *)mem_down(&s, ks.mask, (size_t)heads * n);
        ko->pooled = (float *)mem_down(&s, ks.pooled, (size_t)heads * n * 4);
        mem_del(&s, ks.index, (size_t)heads * cap * 4);
        mem_del(&s, ks.mask, (size_t)heads * n);
        mem_del(&s, ks.pooled, (size_t)heads * n * 4);
    }
    mem_del(&s, ws, ws_bytes);
    mem_del(&s, dq, (size_t)S1_Q * S1_H * S1_D * 2);
    mem_del(&s, dk, (size_t)S1_N * S1_KV * S1_D * 2);
    mem_del(&s, ring, ring_bytes);
    side_free(&s);
}

/* The shape every keep-set must have, and (CPU) that the data separate the
   kept from the dropped positions clearly enough for an exact comparison. */
static void s1_check_one(const char *who, const keep_out *o, int data_quality) {
    int h, i;
    int64_t kk = o->n_kept - o->window_w;
    CHECK(o->compressed == 1 && o->n_kept == 64, "1 (%s): n_kept %d compressed %d", who, o->n_kept, o->compressed);
    CHECK(o->window_w == (o->observed < 32 ? o->observed : 32), "1 (%s): window of %lld queries", who,
          (long long)o->window_w);
    for (h = 0; h < o->heads && o->r == EI_OK; ++h) {
        const int32_t *idx = o->index + (size_t)h * o->cap;
        int bad = 0;
        for (i = 1; i < o->n_kept; ++i) bad += idx[i] <= idx[i - 1];
        for (i = 0; i < o->window_w; ++i) bad += idx[kk + i] != o->L + i;
        CHECK(bad == 0, "1 (%s): head %d: keep-set not ascending or window missing", who, h);
        if (data_quality) { /* the kk-th and (kk+1)-th pooled scores apart by >= 1e-3 relative */
            const float *p = o->pooled + (size_t)h * o->n;
            float kth = INFINITY, next = -INFINITY;
            int64_t j;
            for (i = 0; i < kk; ++i) kth = fminf(kth, p[idx[i]]);
            for (j = 0; j < o->L; ++j) {
                int kept = 0;
                for (i = 0; i < kk; ++i) kept |= idx[i] == j;
                if (!kept) next = fmaxf(next, p[j]);
            }
            CHECK(kth > next && (kth - next) >= 2e-3 * kth, "1: test data: head %d: kept %g vs dropped %g too close", h,
                  (double)kth, (double)next);
        }
    }
}
static void s1_compare(const s1_out *cpu, const s1_out *gpu) {
    int stage, h;
    for (stage = 0; stage < 2; ++stage) {
        const keep_out *a = &cpu->stage[stage], *b = &gpu->stage[stage];
        int64_t j;
        int idx_diff = 0, mask_diff = 0, pool_diff = 0;
        CHECK(a->r == b->r, "1: stage %d: cpu %s, gpu %s", stage, ei_result_name(a->r), ei_result_name(b->r));
        CHECK(a->n_kept == b->n_kept && a->compressed == b->compressed && a->window_w == b->window_w,
              "1: stage %d: n_kept %d/%d compressed %d/%d W %lld/%lld", stage, a->n_kept, b->n_kept, a->compressed,
              b->compressed, (long long)a->window_w, (long long)b->window_w);
        if (a->r != EI_OK || b->r != EI_OK || a->n_kept != b->n_kept) continue;
        for (h = 0; h < a->heads; ++h) {
            idx_diff += memcmp(a->index + (size_t)h * a->cap, b->index + (size_t)h * b->cap, (size_t)a->n_kept * 4) != 0;
            mask_diff += memcmp(a->mask + (size_t)h * a->n, b->mask + (size_t)h * b->n, (size_t)a->n) != 0;
            for (j = 0; j < a->L; ++j)
                if (!close_to(b->pooled[(size_t)h * b->n + j], a->pooled[(size_t)h * a->n + j], test_tols[TOL_DECODE_POOLED_GPU].abs,
                              test_tols[TOL_DECODE_POOLED_GPU].rel)) {
                    if (pool_diff++ < 3)
                        printf("  1: stage %d head %d pooled[%lld]: cpu %g gpu %g\n", stage, h, (long long)j,
                               (double)a->pooled[(size_t)h * a->n + j], (double)b->pooled[(size_t)h * b->n + j]);
                }
        }
        CHECK(idx_diff == 0 && mask_diff == 0, "1: stage %d (%lld observed): %d keep-sets, %d masks differ", stage,
              (long long)a->observed, idx_diff, mask_diff);
        CHECK(pool_diff == 0, "1: stage %d: %d pooled scores differ", stage, pool_diff);
    }
}

/* ------------------------------------------------------------ 2: NaN in observed queries */
enum { S2_H = 4, S2_KV = 2, S2_D = 64 };
typedef struct s2_out { float *ring; size_t ring_bytes; int64_t observed; } s2_out;

static void s2_run(int gpu, s2_out *o) {
    ei_config c = ei_config_default();
    side s;
    size_t ring_bytes, n40 = (size_t)40 * S2_H * S2_D;
    void *ring, *d10, *d40, *d1;
    ei_decoder dec, saved;
    uint16_t *q10, *q40, *q1;
    float *before, *after;
    int64_t i;
    c.window = 32;
    c.decode_budget = 64;
    s = side_make(gpu, c);
    g_rng = 0x51ED27u;
    q10 = bf16_normal((size_t)10 * S2_H * S2_D, 1.0f);
    q40 = bf16_normal(n40, 1.0f);
    q1 = bf16_normal((size_t)S2_H * S2_D, 1.0f);
    ring_bytes = layer_sizes(s.ctx, 40, S2_H, S2_KV, S2_D, 0, 1).decoder;
    ring = mem_new(&s, ring_bytes);
    CHECK_ERR(ei_decoder_init(s.ctx, &dec, S2_H, S2_KV, S2_D, ring, ring_bytes), EI_OK);
    d10 = mem_up(&s, q10, (size_t)10 * S2_H * S2_D * 2);
    {
        ei_tensor t = ei_tensor_make(d10, EI_BF16, 10, S2_H, S2_D);
        CHECK_ERR(ei_decode_observe(s.ctx, &dec, &t, 0, 0), EI_OK);
    }
    /* NaN in token 30 (kept: the last 32 of 40 are tokens 8..39), head 1 */
    q40[((size_t)30 * S2_H + 1) * S2_D + 5] = 0x7FC0;
    d40 = mem_up(&s, q40, n40 * 2);
    saved = dec;
    before = (float *)mem_down(&s, dec.queries, (size_t)32 * S2_H * S2_D * 4);
    {
        ei_tensor t = ei_tensor_make(d40, EI_BF16, 40, S2_H, S2_D);
        CHECK_ERR(ei_decode_observe(s.ctx, &dec, &t, dec.position_end, 0), EI_ERR_NONFINITE);
        CHECK(strstr(ei_last_error(), "NaN or Inf in observed q (head 1, tokens from 30)") != NULL,
              "2 (%s): message '%s'", side_name(&s), ei_last_error());
    }
    after = (float *)mem_down(&s, dec.queries, (size_t)32 * S2_H * S2_D * 4);
    CHECK(!memcmp(&saved, &dec, sizeof dec), "2 (%s): the decoder changed (observed %lld, generated %lld)",
          side_name(&s), (long long)dec.n_observed, (long long)dec.n_generated);
    CHECK(!memcmp(before, after, (size_t)32 * S2_H * S2_D * 4), "2 (%s): the ring changed", side_name(&s));
    free(after);
    /* a generated token with +Inf: refused, n_generated unchanged */
    q1[7] = 0x7F80;
    d1 = mem_up(&s, q1, (size_t)S2_H * S2_D * 2);
    {
        ei_tensor t = ei_tensor_make(d1, EI_BF16, 1, S2_H, S2_D);
        CHECK_ERR(ei_decode_observe(s.ctx, &dec, &t, dec.position_end, 1), EI_ERR_NONFINITE);
        CHECK(dec.n_observed == 10 && dec.n_generated == 0, "2 (%s): counts %lld/%lld after a refused generated token",
              side_name(&s), (long long)dec.n_observed, (long long)dec.n_generated);
    }
    after = (float *)mem_down(&s, dec.queries, (size_t)32 * S2_H * S2_D * 4);
    CHECK(!memcmp(before, after, (size_t)32 * S2_H * S2_D * 4), "2 (%s): the ring changed", side_name(&s));
    free(after);
    /* the NaN moved to token 2, which the decoder drops: accepted */
    q40[((size_t)30 * S2_H + 1) * S2_D + 5] = bf16(0.5f);
    q40[((size_t)2 * S2_H + 3) * S2_D + 0] = 0x7FC0;
    mem_put(&s, d40, q40, n40 * 2);
    {
        ei_tensor t = ei_tensor_make(d40, EI_BF16, 40, S2_H, S2_D);
        CHECK_ERR(ei_decode_observe(s.ctx, &dec, &t, dec.position_end, 0), EI_OK);
        CHECK(dec.n_observed == 50, "2 (%s): %lld observed", side_name(&s), (long long)dec.n_observed);
    }
    o->ring_bytes = (size_t)32 * S2_H * S2_D * 4;
    o->ring = (float *)mem_down(&s, dec.queries, o->ring_bytes);
    o->observed = dec.n_observed;
    /* the ring holds query number i in slot i % 32: numbers 18..49 are tokens 8..39 of q40 */
    {
        int bad = 0;
        for (i = 18; i < 50; ++i) {
            int64_t slot = i % 32, tok = i - 10;
            int h, d;
            for (h = 0; h < S2_H; ++h)
                for (d = 0; d < S2_D; ++d)
                    bad += o->ring[((size_t)slot * S2_H + h) * S2_D + d] != bf16_f(q40[((size_t)tok * S2_H + h) * S2_D + d]);
        }
        CHECK(bad == 0, "2 (%s): %d ring elements are not the kept queries", side_name(&s), bad);
    }
    free(before);
    mem_del(&s, d1, (size_t)S2_H * S2_D * 2);
    mem_del(&s, d10, (size_t)10 * S2_H * S2_D * 2);
    mem_del(&s, d40, n40 * 2);
    mem_del(&s, ring, ring_bytes);
    free(q10); free(q40); free(q1);
    side_free(&s);
}
static void s2_compare(const s2_out *a, const s2_out *b) {
    CHECK(a->observed == b->observed, "2: observed cpu %lld gpu %lld", (long long)a->observed, (long long)b->observed);
    CHECK(a->ring_bytes == b->ring_bytes && !memcmp(a->ring, b->ring, a->ring_bytes), "2: the rings differ");
}

/* ------------------------------------------------------------ plans of both backends */
/* Plans equal: fields, classes, counts and block lists identical, entropies
   and budgets close. */
static void plans_compare(const char *what, const ei_plan *a, const ei_plan *b) {
    int32_t h, s, i, rows = 0, ent = 0, bud = 0, lists = 0;
    CHECK(a->n_tokens == b->n_tokens && a->n_segments == b->n_segments && a->n_blocks == b->n_blocks &&
              a->final == b->final && a->max_keep == b->max_keep,
          "%s: plan fields differ (segments %d/%d, blocks %d/%d, max_keep %d/%d)", what, a->n_segments, b->n_segments,
          a->n_blocks, b->n_blocks, a->max_keep, b->max_keep);
    if (a->n_segments != b->n_segments || a->max_keep != b->max_keep) return;
    for (h = 0; h < a->n_kv_heads; ++h) {
        CHECK(a->head_class[h] == b->head_class[h], "%s: kv head %d class cpu %d gpu %d", what, h, a->head_class[h],
              b->head_class[h]);
        for (s = 0; s < a->n_segments; ++s) {
            size_t r = EI_PLAN_ROW(a, h, s), rb = EI_PLAN_ROW(b, h, s);
            const int32_t *la = EI_PLAN_BLOCKS(a, h, s), *lb = EI_PLAN_BLOCKS(b, h, s);
            ent += !close_to(b->entropy[rb], a->entropy[r], test_tols[TOL_ENTROPY].abs, test_tols[TOL_ENTROPY].rel);
            bud += !close_to(b->budget[rb], a->budget[r], test_tols[TOL_BUDGET].abs, test_tols[TOL_BUDGET].rel);
            if (a->keep_count[r] != b->keep_count[rb] || a->keep_blocks[r] != b->keep_blocks[rb]) {
                if (rows++ < 3)
                    printf("  %s: kv %d seg %d: keep %d/%d (own %d/%d)\n", what, h, s, a->keep_count[r], b->keep_count[rb],
                           a->keep_blocks[r], b->keep_blocks[rb]);
                continue;
            }
            for (i = 0; i < a->max_keep; ++i)
                if (la[i] != lb[i]) {
                    if (lists++ < 3) printf("  %s: kv %d seg %d: block_index[%d] cpu %d gpu %d\n", what, h, s, i, la[i], lb[i]);
                    break;
                }
        }
    }
    CHECK(rows == 0 && lists == 0, "%s: %d keep counts and %d block lists differ", what, rows, lists);
    CHECK(ent == 0 && bud == 0, "%s: %d entropies and %d budgets differ", what, ent, bud);
}

/* ------------------------------------------------------------ 3: plan too small for the budgets */
enum { S3_N = 512, S3_H = 4, S3_KV = 2, S3_D = 64 };
typedef struct s3_out { ei_result profile_small, profile_big, attention_big; } s3_out;
static ei_config s3_config(int32_t base) {
    ei_config c = ei_config_default();
    c.segment_size = 64;
    c.block_size = 8;
    c.threshold_len = 128;
    c.base_budget = base;
    return c;
}
static void s3_run(int gpu, const uint16_t *q, const uint16_t *k, const uint16_t *v, s3_out *o) {
    side small = side_make(gpu, s3_config(32)), big = side_make(gpu, s3_config(64));
    size_t nq = (size_t)S3_N * S3_H * S3_D * 2, nk = (size_t)S3_N * S3_KV * S3_D * 2, nout = (size_t)S3_N * S3_H * S3_D * 4;
    void *dq = mem_up(&small, q, nq), *dk = mem_up(&small, k, nk), *dv = mem_up(&small, v, nk), *dout, *ws, *aws;
    ei_sizes sz = layer_sizes(big.ctx, S3_N, S3_H, S3_KV, S3_D, 0, 1);
    size_t ws_bytes = sz.profile, aws_bytes = sz.prefill;
    ei_exec x;
    ei_tensor tq = ei_tensor_make(dq, EI_BF16, S3_N, S3_H, S3_D), tk = ei_tensor_make(dk, EI_BF16, S3_N, S3_KV, S3_D);
    ei_tensor tv = ei_tensor_make(dv, EI_BF16, S3_N, S3_KV, S3_D);
    ei_out_tensor to;
    ei_plan plan;
    dout = mem_new(&small, nout);
    to = ei_out_tensor_make(dout, EI_F32, S3_N, S3_H, S3_D);
    CHECK_ERR(ei_plan_init(small.ctx, &plan, S3_N, S3_KV, S3_D, 0, NULL, 0), EI_OK);
    CHECK(plan.max_keep == 12, "3: the small context's rows hold %d blocks, 12 expected", plan.max_keep);
    ws = mem_new(&big, ws_bytes);
    x = ex(1, ws, ws_bytes);
    /* profiling with the big context: its budgets need rows of 24 blocks */
    o->profile_big = ei_profile(big.ctx, &x, &tq, &tk, &plan);
    CHECK(o->profile_big == EI_ERR_SHAPE && strstr(ei_last_error(), "EI_ERR_SHAPE"),
          "3 (%s): profile with a plan too small for the budgets: %s (%s)", side_name(&big),
          ei_result_name(o->profile_big), ei_last_error());
    /* the context that laid it out plans it; the big one runs attention with it */
    o->profile_small = ei_profile(small.ctx, &x, &tq, &tk, &plan);
    CHECK(o->profile_small == EI_OK, "3 (%s): profile with the small context: %s", side_name(&small), ei_last_error());
    aws = mem_new(&big, aws_bytes);
    x = ex(1, aws, aws_bytes);
    o->attention_big = ei_attention_prefill(big.ctx, &x, &tq, &tk, &tv, &plan, &to, 0);
    CHECK(o->attention_big == EI_TEST_SMALL_PLAN_ATTENTION, "3 (%s): attention with the small plan: %s (%s)",
          side_name(&big), ei_result_name(o->attention_big), ei_last_error());
    mem_del(&big, aws, aws_bytes);
    mem_del(&big, ws, ws_bytes);
    ei_plan_free(small.ctx, &plan);
    mem_del(&small, dout, nout);
    mem_del(&small, dq, nq); mem_del(&small, dk, nk); mem_del(&small, dv, nk);
    side_free(&small);
    side_free(&big);
}
static void s3_compare(const s3_out *a, const s3_out *b) {
    CHECK(a->profile_big == b->profile_big && a->profile_small == b->profile_small && a->attention_big == b->attention_big,
          "3: codes differ: profile %s/%s, %s/%s, attention %s/%s", ei_result_name(a->profile_big),
          ei_result_name(b->profile_big), ei_result_name(a->profile_small), ei_result_name(b->profile_small),
          ei_result_name(a->attention_big), ei_result_name(b->attention_big));
}

/* ------------------------------------------------------------ 4: interleaved views */
/* q: 4 heads of 128 at head_stride 136, token_stride 544; k, v: 2 kv heads at
   136, token_stride 264 (8 elements of padding after each head but the last
   of a token); out: f32, head_stride 132, token_stride 528. Padding holds
   NaN: reading it would poison the results. */
enum { S4_N = 512, S4_H = 4, S4_KV = 2, S4_D = 128, S4_QHS = 136, S4_QTS = 544, S4_KHS = 136, S4_KTS = 264,
       S4_OHS = 132, S4_OTS = 528 };
typedef struct s4_out {
    ei_result r_profile, r_sparse, r_dense;
    ei_plan plan;     /* the plan on the CPU; the device plan's host copy on the GPU */
    float *sparse, *dense; /* [N][H][D] gathered from the strided outputs */
    int padding_ok;
} s4_out;
static ei_config s4_config(void) {
    ei_config c = ei_config_default();
    c.segment_size = 64;
    c.block_size = 8;
    c.threshold_len = 128;
    c.base_budget = 64;
    return c;
}
static uint16_t *s4_strided(const uint16_t *dense, int heads, int64_t hs, int64_t ts) {
    uint16_t *x = (uint16_t *)malloc((size_t)S4_N * (size_t)ts * 2);
    int64_t t;
    int h;
    for (t = 0; t < (int64_t)S4_N * ts; ++t) x[t] = 0x7FC0; /* NaN padding */
    for (t = 0; t < S4_N; ++t)
        for (h = 0; h < heads; ++h)
            memcpy(x + t * ts + h * hs, dense + ((size_t)t * heads + h) * S4_D, S4_D * 2);
    return x;
}
static void s4_run(int gpu, const uint16_t *q, const uint16_t *k, const uint16_t *v, s4_out *o) {
    ei_config c = s4_config();
    side s = side_make(gpu, c);
    ei_context *host = ctx_make(0, c); /* lays out the host plan */
    uint16_t *hq = s4_strided(q, S4_H, S4_QHS, S4_QTS), *hk = s4_strided(k, S4_KV, S4_KHS, S4_KTS);
    uint16_t *hv = s4_strided(v, S4_KV, S4_KHS, S4_KTS);
    size_t bq = (size_t)S4_N * S4_QTS * 2, bk = (size_t)S4_N * S4_KTS * 2, bo = (size_t)S4_N * S4_OTS * 4, ws_bytes, aws_bytes;
    ei_sizes sz;
    ei_exec x;
    void *dq = mem_up(&s, hq, bq), *dk = mem_up(&s, hk, bk), *dv = mem_up(&s, hv, bk), *dout, *ws, *aws;
    ei_tensor tq = ei_tensor_make(dq, EI_BF16, S4_N, S4_H, S4_D), tk = ei_tensor_make(dk, EI_BF16, S4_N, S4_KV, S4_D);
    ei_tensor tv;
    ei_out_tensor to;
    ei_plan dplan, *plan = gpu ? &dplan : &o->plan;
    int pass;
    memset(&dplan, 0, sizeof dplan);
    tq.head_stride = S4_QHS; tq.token_stride = S4_QTS;
    tk.head_stride = S4_KHS; tk.token_stride = S4_KTS;
    tv = tk;
    tv.data = dv;
    dout = mem_new(&s, bo);
    to = ei_out_tensor_make(dout, EI_F32, S4_N, S4_H, S4_D);
    to.head_stride = S4_OHS; to.token_stride = S4_OTS;
    CHECK_ERR(ei_plan_init(host, &o->plan, S4_N, S4_KV, S4_D, 0, NULL, 0), EI_OK);
    if (gpu) CHECK_ERR(ei_plan_init(s.ctx, &dplan, S4_N, S4_KV, S4_D, 0, NULL, 0), EI_OK);
    sz = layer_sizes(s.ctx, S4_N, S4_H, S4_KV, S4_D, 0, 1);
    ws_bytes = sz.profile;
    aws_bytes = sz.prefill;
    ws = mem_new(&s, ws_bytes);
    x = ex(1, ws, ws_bytes);
    o->r_profile = ei_profile(s.ctx, &x, &tq, &tk, plan);
    CHECK(o->r_profile == EI_OK, "4 (%s): profile of interleaved views: %s", side_name(&s), ei_last_error());
    if (gpu) CHECK_ERR(ei_plan_copy(s.ctx, &o->plan, &dplan, EI_COPY_DEVICE_TO_HOST), EI_OK);
    aws = mem_new(&s, aws_bytes);
    x = ex(1, aws, aws_bytes);
    o->padding_ok = 1;
    for (pass = 0; pass < 2; ++pass) {
        ei_result r = ei_attention_prefill(s.ctx, &x, &tq, &tk, &tv, pass == 0 ? plan : NULL, &to, 0);
        float *raw = (float *)mem_down(&s, dout, bo), *dst = (float *)malloc((size_t)S4_N * S4_H * S4_D * 4);
        int64_t t;
        int h, i;
        CHECK(r == EI_OK, "4 (%s): %s attention of interleaved views: %s", side_name(&s), pass ? "dense" : "sparse",
              ei_last_error());
        for (t = 0; t < S4_N; ++t)
            for (h = 0; h < S4_H; ++h) {
                memcpy(dst + ((size_t)t * S4_H + h) * S4_D, raw + t * S4_OTS + h * S4_OHS, S4_D * 4);
                for (i = S4_D; i < S4_OHS; ++i) {
                    uint32_t u;
                    memcpy(&u, raw + t * S4_OTS + h * S4_OHS + i, 4);
                    if (u != 0xFFFFFFFFu) o->padding_ok = 0;
                }
            }
        if (pass == 0) { o->r_sparse = r; o->sparse = dst; }
        else { o->r_dense = r; o->dense = dst; }
        free(raw);
    }
    CHECK(o->padding_ok, "4 (%s): attention wrote into the output's padding", side_name(&s));
    mem_del(&s, aws, aws_bytes);
    mem_del(&s, ws, ws_bytes);
    if (gpu) ei_plan_free(s.ctx, &dplan);
    ei_context_destroy(host);
    mem_del(&s, dout, bo);
    mem_del(&s, dq, bq); mem_del(&s, dk, bk); mem_del(&s, dv, bk);
    free(hq); free(hk); free(hv);
    side_free(&s);
}
static void s4_outputs_compare(const char *what, const float *a, const float *b) {
    l2_acc err = l2_of_f32(b, a, (size_t)S4_N * S4_H * S4_D);
    char who[64];
    snprintf(who, sizeof who, "4: %s attention gpu vs cpu", what);
    check_l2(who, &err, test_tols[TOL_ATTN_GPU].rel_l2, test_tols[TOL_ATTN_GPU].max_abs);
    printf("  4: %s attention gpu vs cpu: rel L2 %.2e, max abs %.2e\n", what, l2_rel(&err), err.mx);
}
static void s4_compare(const s4_out *a, const s4_out *b) {
    CHECK(a->r_profile == b->r_profile && a->r_sparse == b->r_sparse && a->r_dense == b->r_dense,
          "4: codes differ: profile %s/%s, sparse %s/%s, dense %s/%s", ei_result_name(a->r_profile),
          ei_result_name(b->r_profile), ei_result_name(a->r_sparse), ei_result_name(b->r_sparse),
          ei_result_name(a->r_dense), ei_result_name(b->r_dense));
    plans_compare("4: plan of interleaved views", &a->plan, &b->plan);
    s4_outputs_compare("sparse", a->sparse, b->sparse);
    s4_outputs_compare("dense", a->dense, b->dense);
}
static void s4_free(s4_out *o, ei_context *host_ctx) {
    ei_plan_free(host_ctx, &o->plan);
    free(o->sparse);
    free(o->dense);
}
/* CPU only: the plan has sparse segments that keep blocks (so the sparse
   path is exercised) and the CPU's sparse output matches the reference. */
static void s4_check_cpu(const s4_out *o, const uint16_t *q, const uint16_t *k, const uint16_t *v) {
    ei_config c = s4_config();
    int32_t s, h, sparse = 0, kept = 0;
    size_t n = (size_t)S4_N * S4_H * S4_D, i;
    float *fq = (float *)malloc(n * 4), *fk = (float *)malloc(n / 2 * 4), *fv = (float *)malloc(n / 2 * 4);
    double *ref = (double *)malloc(n * sizeof(double)), mx = 0;
    ei_tensor tq, tk, tv;
    for (s = 0; s < o->plan.n_segments; ++s)
        if (ei__segment_sparse(&c, s, o->plan.n_segments, o->plan.final)) {
            sparse++;
            for (h = 0; h < S4_KV; ++h) kept += o->plan.keep_count[EI_PLAN_ROW(&o->plan, h, s)] > 0;
        }
    CHECK(sparse >= 4 && kept == sparse * S4_KV, "4: %d sparse segments, %d rows keeping blocks", sparse, kept);
    for (i = 0; i < n; ++i) fq[i] = bf16_f(q[i]);
    for (i = 0; i < n / 2; ++i) { fk[i] = bf16_f(k[i]); fv[i] = bf16_f(v[i]); }
    tq = ei_tensor_make(fq, EI_F32, S4_N, S4_H, S4_D);
    tk = ei_tensor_make(fk, EI_F32, S4_N, S4_KV, S4_D);
    tv = ei_tensor_make(fv, EI_F32, S4_N, S4_KV, S4_D);
    CHECK(ref_attention(&c, &o->plan, &tq, &tk, &tv, 0, ref), "4: reference out of range");
    for (i = 0; i < n; ++i) mx = fmax(mx, fabs(ref[i] - o->sparse[i]));
    {   /* EI_SIMD_AUTO runs all-bf16 attention with vdpbf16ps where this CPU's rate favours it
           (ei_cpu_dpbf16_ratio): P is rounded to bf16 there, ~2^-9 of max|v| per weight */
        double vmax = 0, tol = test_tols[TOL_ATTN_CPU].max_abs;
        ei_context *auto_ctx;
        if (ei_context_create(&c, &auto_ctx) == EI_OK) {
            if (kernel_rounds_p(ei_context_config(auto_ctx)->simd)) {
                for (i = 0; i < n / 2; ++i) vmax = fmax(vmax, fabs(fv[i]));
                tol = test_tols[TOL_ATTN_ROUNDS_P].max_abs * (vmax > 1 ? vmax : 1.0);
            }
            ei_context_destroy(auto_ctx);
        }
        CHECK(mx < tol, "4: cpu sparse attention of interleaved views vs reference: max abs %.3g (tolerance %.3g)", mx, tol);
    }
    free(fq); free(fk); free(fv); free(ref);
}

/* ------------------------------------------------------------ 5: freeing a device plan without its context */
static void s5_cpu(void) {
    static unsigned char not_heap[256]; /* what free() must never see */
    ei_plan plan, before;
    ei_config c = ei_config_default();
    ei_context *cpu = ctx_make(0, c);
    memset(&plan, 0, sizeof plan);
    plan.on_device = 1;
    plan.owned_memory = not_heap;
    plan.entropy = (float *)(void *)(not_heap + 64);
    plan.n_kv_heads = 2;
    before = plan;
    CHECK_ERR(ei_plan_reset(NULL), EI_ERR_NULL); /* a different last error first */
    ei_plan_free(NULL, &plan);
    CHECK(!memcmp(&plan, &before, sizeof plan), "5 (cpu): the plan changed");
    CHECK(strstr(ei_last_error(), "EI_ERR_STATE") != NULL, "5 (cpu): last error '%s'", ei_last_error());
    CHECK_ERR(ei_plan_reset(NULL), EI_ERR_NULL);
    ei_plan_free(cpu, &plan); /* a CPU context cannot free device memory either */
    CHECK(!memcmp(&plan, &before, sizeof plan), "5 (cpu): the plan changed (CPU context)");
    CHECK(strstr(ei_last_error(), "EI_ERR_STATE") != NULL, "5 (cpu): last error '%s'", ei_last_error());
    ei_context_destroy(cpu);
}
static void s5_gpu(void) {
    ei_config c = ei_config_default();
    ei_context *gpu = ctx_make(1, c), *cpu = ctx_make(0, c);
    ei_plan plan, before;
    CHECK_ERR(ei_plan_init(gpu, &plan, 4096, 2, 64, 0, NULL, 0), EI_OK);
    CHECK(plan.on_device == 1 && plan.owned_memory != NULL, "5 (gpu): not a device plan");
    before = plan;
    CHECK_ERR(ei_plan_reset(NULL), EI_ERR_NULL);
    ei_plan_free(NULL, &plan);
    CHECK(!memcmp(&plan, &before, sizeof plan), "5 (gpu): the plan changed");
    CHECK(strstr(ei_last_error(), "EI_ERR_STATE") != NULL, "5 (gpu): last error '%s'", ei_last_error());
    CHECK_ERR(ei_plan_reset(NULL), EI_ERR_NULL);
    ei_plan_free(cpu, &plan);
    CHECK(!memcmp(&plan, &before, sizeof plan), "5 (gpu): the plan changed (CPU context)");
    CHECK(strstr(ei_last_error(), "EI_ERR_STATE") != NULL, "5 (gpu): last error '%s'", ei_last_error());
    ei_plan_free(gpu, &plan); /* its own context frees it */
    CHECK(plan.owned_memory == NULL && plan.entropy == NULL, "5 (gpu): the plan was not released");
    ei_context_destroy(cpu);
    ei_context_destroy(gpu);
}

/* ------------------------------------------------------------ 6: kv_compact with a bad keep index */
/* k: bf16, head-major [2][16][64]; v: f32 token-major [16][2][32] (k and v may
   differ in dtype, head size and layout). */
enum { S6_HEADS = 2, S6_N = 16, S6_DK = 64, S6_DV = 32, S6_CAP = 8, S6_KEPT = 4, S6_CASES = 4 };
static const int32_t s6_index[S6_CASES][S6_HEADS][S6_KEPT] = {
    {{0, 3, 5, 9}, {1, 4, 4, 10}},    /* [1][2] = 4: not ascending */
    {{0, 3, 5, 16}, {1, 2, 0, 3}},    /* [0][3] = 16: outside the cache (and head 1 bad too) */
    {{2, 3, 1, 7}, {0, 1, 2, 3}},     /* [0][2] = 1: below its own position */
    {{0, 3, 5, 15}, {1, 2, 8, 11}},   /* valid */
};
static const char *const s6_message[S6_CASES] = {
    "keep index [1][2] = 4 is not ascending", "keep index [0][3] = 16 is not ascending",
    "keep index [0][2] = 1 is not ascending", NULL};
typedef struct s6_out { ei_result r[S6_CASES]; uint16_t *k; float *v; } s6_out;

static void s6_run(int gpu, s6_out *o) {
    ei_config c = ei_config_default();
    side s = side_make(gpu, c);
    size_t bk = (size_t)S6_HEADS * S6_N * S6_DK * 2, bv = (size_t)S6_N * S6_HEADS * S6_DV * 4, i;
    uint16_t *hk = (uint16_t *)malloc(bk), *back_k;
    float *hv = (float *)malloc(bv), *back_v;
    void *dk, *dv, *didx;
    int cs;
    for (i = 0; i < bk / 2; ++i) hk[i] = bf16((float)i);
    for (i = 0; i < bv / 4; ++i) hv[i] = -(float)i;
    dk = mem_up(&s, hk, bk);
    dv = mem_up(&s, hv, bv);
    didx = mem_new(&s, (size_t)S6_HEADS * S6_CAP * 4);
    for (cs = 0; cs < S6_CASES; ++cs) {
        ei_keep_set ks;
        ei_out_tensor ok = ei_out_tensor_make(dk, EI_BF16, S6_N, S6_HEADS, S6_DK), ov;
        int32_t idx[S6_HEADS * S6_CAP];
        int h, j;
        ok.token_stride = S6_DK;
        ok.head_stride = (int64_t)S6_N * S6_DK;
        ov = ei_out_tensor_make(dv, EI_F32, S6_N, S6_HEADS, S6_DV);
        for (h = 0; h < S6_HEADS; ++h)
            for (j = 0; j < S6_CAP; ++j) idx[h * S6_CAP + j] = j < S6_KEPT ? s6_index[cs][h][j] : -7;
        mem_put(&s, didx, idx, sizeof idx);
        memset(&ks, 0, sizeof ks);
        ks.heads_out = S6_HEADS;
        ks.capacity = S6_CAP;
        ks.n_kept = S6_KEPT;
        ks.compressed = 1;
        ks.n_tokens = S6_N;
        ks.index = (int32_t *)didx;
        o->r[cs] = ei_kv_compact(s.ctx, &ks, &ok, &ov);
        back_k = (uint16_t *)mem_down(&s, dk, bk);
        back_v = (float *)mem_down(&s, dv, bv);
        if (s6_message[cs]) {
            CHECK(o->r[cs] == EI_ERR_SHAPE && strstr(ei_last_error(), "EI_ERR_SHAPE") &&
                      strstr(ei_last_error(), s6_message[cs]),
                  "6 (%s) case %d: %s (%s), expected EI_ERR_SHAPE '%s'", side_name(&s), cs, ei_result_name(o->r[cs]),
                  ei_last_error(), s6_message[cs]);
            CHECK(!memcmp(back_k, hk, bk) && !memcmp(back_v, hv, bv), "6 (%s) case %d: the caches changed",
                  side_name(&s), cs);
            free(back_k);
            free(back_v);
        } else {
            int bad = 0;
            CHECK(o->r[cs] == EI_OK, "6 (%s): a valid keep-set refused: %s", side_name(&s), ei_last_error());
            for (h = 0; h < S6_HEADS; ++h)
                for (j = 0; j < S6_KEPT; ++j) {
                    int src = s6_index[cs][h][j];
                    bad += memcmp(back_k + ((size_t)h * S6_N + j) * S6_DK, hk + ((size_t)h * S6_N + src) * S6_DK, S6_DK * 2) != 0;
                    bad += memcmp(back_v + ((size_t)j * S6_HEADS + h) * S6_DV, hv + ((size_t)src * S6_HEADS + h) * S6_DV,
                                  S6_DV * 4) != 0;
                }
            CHECK(bad == 0, "6 (%s): %d compacted rows are not the kept ones", side_name(&s), bad);
            o->k = back_k;
            o->v = back_v;
        }
    }
    mem_del(&s, didx, (size_t)S6_HEADS * S6_CAP * 4);
    mem_del(&s, dk, bk);
    mem_del(&s, dv, bv);
    free(hk); free(hv);
    side_free(&s);
}
static void s6_compare(const s6_out *a, const s6_out *b) {
    int cs;
    for (cs = 0; cs < S6_CASES; ++cs)
        CHECK(a->r[cs] == b->r[cs], "6: case %d: cpu %s, gpu %s", cs, ei_result_name(a->r[cs]), ei_result_name(b->r[cs]));
    CHECK(a->k && b->k && !memcmp(a->k, b->k, (size_t)S6_HEADS * S6_N * S6_DK * 2) &&
              !memcmp(a->v, b->v, (size_t)S6_N * S6_HEADS * S6_DV * 4),
          "6: the compacted caches differ");
}

/* ------------------------------------------------------------ 7: rankings beyond the paper */
/* The sampled ranking (EI_RANK_SAMPLED), top_p counts and sink/local blocks:
   bf16 views with head_dim 64 and 128 (the GPU's tensor-core path: wgmma on
   Hopper, mma.sync through EI_CUDA_SAMPLED_MMA=1; and its CUDA-core path
   through EI_CUDA_SAMPLED_GENERIC=1) and f32 views with head_dim 40 (the
   CUDA-core path), ragged and per-segment budgets, R below, not a multiple of
   and above the 256 rows of a GPU tile, a last segment of 40 tokens (rows past
   the prompt unused) and threshold 128 (segment 1 keeps the reference
   ranking). Keys carry a per-block strength along one direction that the
   queries share, so mass varies from block to block. With
   EI_RANK_ROWS_SPREAD the rows of the 15 whole segments are picked by
   farthest point (the GPU's spread_pick_kernel against the CPU's picks,
   bit-identical by contract) and the test's mass is that of check.h's
   ref_spread_rows. With EI_RANK_PRECISION_INT8 the test's mass is check.h's
   (its own int8 rounding, exact integer dots) and every GPU path runs, the
   f32 views too.
   Backends differ in float32 rounding (~1e-6), so: the always-kept blocks lead
   both rows identically; keep counts are equal except at a knife-edge of
   top_p (the share of the CPU row's first min(k_cpu, k_gpu) blocks within
   1e-4 of top_p: counted and reported); the ranked parts of the kept sets are
   equal up to near-ties: a block kept by one backend and not the other has a
   ranking score within 1e-4 (relative) of the CPU's last kept one. Ranking
   scores are the test's own: the sampled mass recomputed in double, or the
   reference's softmaxed block score (the CPU plan's scores row). The CPU half
   also checks its rows against the ideal row of those scores (the same
   tolerance), and that the data make the ranking matter. */
enum { S7_N = 1000, S7_H = 8, S7_KV = 2, S7_SEG = 64, S7_BS = 8, S7_NSEG = (S7_N + S7_SEG - 1) / S7_SEG,
       S7_NB = (S7_NSEG - 1) * (S7_SEG / S7_BS) };
typedef struct s7_data { ei_dtype dt; int d; void *q, *k; double *qd, *kd; } s7_data;
typedef struct s7_case {
    const char *name;
    int data;            /* 0: bf16, head_dim 64; 1: f32, head_dim 40; 2: bf16, head_dim 128 */
    ei_ranking ranking;
    int R;
    double top_p;
    int sink, local, per_seg;
    int misalign;        /* q and k one element past a 16-byte boundary (the GPU's element loads) */
    ei_rank_rows rows;   /* EI_RANK_ROWS_SPREAD: farthest-point rows in segments 0..14 (whole in ei_profile's
                            call), the even rows in the last one of 40 tokens */
    ei_rank_precision precision; /* EI_RANK_PRECISION_INT8: q rows and keys in int8 (the GPU: int8 values exact in
                                    bf16 on the tensor cores, whatever the data's dtype, or f32 on CUDA cores) */
} s7_case;
static const s7_case s7_cases[] = {
    {"sampled R=24, top_p 0.9, sink 1, local 2", 0, EI_RANK_SAMPLED, 24, 0.9, 1, 2, 0, 0, EI_RANK_ROWS_EVEN, EI_RANK_PRECISION_F32},
    {"sampled R=300, sink 2, local 3, per-segment budget", 0, EI_RANK_SAMPLED, 300, 0.0, 2, 3, 1, 0, EI_RANK_ROWS_EVEN, EI_RANK_PRECISION_F32},
    {"reference ranking, top_p 0.85, sink 1, local 4", 0, EI_RANK_REFERENCE, 64, 0.85, 1, 4, 0, 0, EI_RANK_ROWS_EVEN, EI_RANK_PRECISION_F32},
    {"sampled R=64, top_p 0.95, sink 1, local 8, unaligned views", 0, EI_RANK_SAMPLED, 64, 0.95, 1, 8, 0, 1,
     EI_RANK_ROWS_EVEN, EI_RANK_PRECISION_F32},
    {"f32 d=40: sampled R=7, top_p 0.9, local 1, per-segment budget", 1, EI_RANK_SAMPLED, 7, 0.9, 0, 1, 1, 0,
     EI_RANK_ROWS_EVEN, EI_RANK_PRECISION_F32},
    {"d=128: sampled R=64, top_p 0.95, sink 1, local 8", 2, EI_RANK_SAMPLED, 64, 0.95, 1, 8, 0, 0, EI_RANK_ROWS_EVEN, EI_RANK_PRECISION_F32},
    /* EI_RANK_ROWS_SPREAD: the GPU picks the rows (spread_pick_kernel) and must pick the CPU's, bit for bit;
       a wrong row shows as a ranking that is not the ideal one of the test's mass of the CPU's rows. 256
       candidates a segment (64 tokens x G 4, stride 1): R 24 and 64 of them on the tensor cores (d 64,
       128), R 7 at d 40 in f32 on the CUDA cores */
    {"spread rows: sampled R=24, top_p 0.9, sink 1, local 2", 0, EI_RANK_SAMPLED, 24, 0.9, 1, 2, 0, 0,
     EI_RANK_ROWS_SPREAD, EI_RANK_PRECISION_F32},
    {"spread rows, d=128: sampled R=64, top_p 0.95, sink 1, local 8", 2, EI_RANK_SAMPLED, 64, 0.95, 1, 8, 0, 0,
     EI_RANK_ROWS_SPREAD, EI_RANK_PRECISION_F32},
    {"spread rows, f32 d=40: sampled R=7, top_p 0.9, local 1, per-segment budget", 1, EI_RANK_SAMPLED, 7, 0.9, 0, 1, 1,
     0, EI_RANK_ROWS_SPREAD, EI_RANK_PRECISION_F32},
    /* EI_RANK_PRECISION_INT8: exact int32 dots on every path, so the GPU's logits are the CPU's; d 64 and 128
       on the tensor cores, f32 d 40 too (rows padded with zeros to 64), and the f32 CUDA cores under
       EI_CUDA_SAMPLED_GENERIC; R 300 is two GPU row chunks */
    {"int8 scores: sampled R=24, top_p 0.9, sink 1, local 2", 0, EI_RANK_SAMPLED, 24, 0.9, 1, 2, 0, 0,
     EI_RANK_ROWS_EVEN, EI_RANK_PRECISION_INT8},
    {"int8 scores, spread rows, d=128: sampled R=64, top_p 0.95, sink 1, local 8", 2, EI_RANK_SAMPLED, 64, 0.95, 1, 8,
     0, 0, EI_RANK_ROWS_SPREAD, EI_RANK_PRECISION_INT8},
    {"int8 scores, f32 d=40: sampled R=300, top_p 0.9, local 1, per-segment budget, unaligned views", 1,
     EI_RANK_SAMPLED, 300, 0.9, 0, 1, 1, 1, EI_RANK_ROWS_EVEN, EI_RANK_PRECISION_INT8},
};
enum { S7_CASES = (int)(sizeof s7_cases / sizeof s7_cases[0]) };

static ei_simd g_s7_simd = EI_SIMD_AUTO; /* the CPU path of s7_run */
static ei_config s7_config(const s7_case *cs) {
    ei_config c = ei_config_default();
    c.simd = g_s7_simd;
    c.segment_size = S7_SEG;
    c.block_size = S7_BS;
    c.threshold_len = 128;
    c.base_budget = 64;
    c.ranking = cs->ranking;
    c.rank_samples = cs->R;
    c.top_p = cs->top_p;
    c.sink_blocks = cs->sink;
    c.local_blocks = cs->local;
    c.per_segment_budget = cs->per_seg;
    c.rank_rows = cs->rows;
    c.rank_precision = cs->precision;
    return c;
}
static s7_data s7_make(ei_dtype dt, int d, uint64_t seed) {
    s7_data D;
    size_t nq = (size_t)S7_N * S7_H * d, nk = (size_t)S7_N * S7_KV * d, i;
    double u[S7_KV][128], strength[S7_KV][S7_N / S7_BS + 1];
    int h, t, e;
    g_rng = seed;
    D.dt = dt;
    D.d = d;
    D.q = malloc(nq * (dt == EI_F32 ? 4 : 2));
    D.k = malloc(nk * (dt == EI_F32 ? 4 : 2));
    D.qd = (double *)malloc(nq * sizeof(double));
    D.kd = (double *)malloc(nk * sizeof(double));
    for (h = 0; h < S7_KV; ++h) {
        for (e = 0; e < d; ++e) u[h][e] = nrand() * sqrt(16.0 / d); /* |u|^2 ~ 16 */
        for (t = 0; t <= S7_N / S7_BS; ++t) strength[h][t] = 2.0 * urand();
    }
    for (i = 0; i < nq + nk; ++i) {
        int is_q = i < nq;
        size_t j = is_q ? i : i - nq;
        int tok = (int)(j / ((size_t)(is_q ? S7_H : S7_KV) * d)), head = (int)(j / d % (is_q ? S7_H : S7_KV));
        int kvh = is_q ? head / (S7_H / S7_KV) : head, dim = (int)(j % d);
        double x = 0.5 * nrand() + (is_q ? (0.6 + 0.8 * urand()) : strength[kvh][tok / S7_BS]) * u[kvh][dim];
        double stored;
        if (dt == EI_F32) {
            float f = (float)x;
            (is_q ? (float *)D.q : (float *)D.k)[j] = f;
            stored = f;
        } else {
            uint16_t b = bf16((float)x);
            (is_q ? (uint16_t *)D.q : (uint16_t *)D.k)[j] = b;
            stored = bf16_f(b);
        }
        (is_q ? D.qd : D.kd)[j] = stored;
    }
    return D;
}
static void s7_free_data(s7_data *D) { free(D->q); free(D->k); free(D->qd); free(D->kd); }

/* Profile the case on one backend; the plan (host memory) into *out. */
static ei_result s7_run(int gpu, const s7_case *cs, const s7_data *D, ei_plan *out) {
    ei_config c = s7_config(cs);
    side s = side_make(gpu, c);
    ei_context *host = ctx_make(0, c);
    size_t es = D->dt == EI_F32 ? 4 : 2, bq = (size_t)S7_N * S7_H * D->d * es, bk = (size_t)S7_N * S7_KV * D->d * es, wsb;
    ei_exec x;
    size_t off = cs->misalign ? es : 0;
    void *dq = mem_new(&s, bq + 16), *dk = mem_new(&s, bk + 16), *ws;
    ei_tensor tq = ei_tensor_make((char *)dq + off, D->dt, S7_N, S7_H, D->d);
    ei_tensor tk = ei_tensor_make((char *)dk + off, D->dt, S7_N, S7_KV, D->d);
    ei_plan dplan, *plan = gpu ? &dplan : out;
    ei_result r;
    mem_put(&s, (char *)dq + off, D->q, bq);
    mem_put(&s, (char *)dk + off, D->k, bk);
    CHECK_ERR(ei_plan_init(host, out, S7_N, S7_KV, D->d, EI_PLAN_SCORES, NULL, 0), EI_OK);
    if (gpu) CHECK_ERR(ei_plan_init(s.ctx, &dplan, S7_N, S7_KV, D->d, EI_PLAN_SCORES, NULL, 0), EI_OK);
    wsb = layer_sizes(s.ctx, S7_N, S7_H, S7_KV, D->d, EI_PLAN_SCORES, 1).profile;
    ws = mem_new(&s, wsb);
    x = ex(1, ws, wsb);
    r = ei_profile(s.ctx, &x, &tq, &tk, plan);
    CHECK(r == EI_OK, "7 (%s): %s: profile: %s", side_name(&s), cs->name, ei_last_error());
    if (gpu) {
        CHECK_ERR(ei_plan_copy(s.ctx, out, &dplan, EI_COPY_DEVICE_TO_HOST), EI_OK);
        ei_plan_free(s.ctx, &dplan);
    }
    mem_del(&s, ws, wsb);
    mem_del(&s, dq, bq + 16);
    mem_del(&s, dk, bk + 16);
    ei_context_destroy(host);
    side_free(&s);
    return r;
}

/* The sampled mass of (kvh, s) in double: mass[b] for b < s * blocks per segment, of the rows the plan
   used. EI_RANK_ROWS_SPREAD: check.h's reference (ref_sampled_mass_rows, on views of the data as stored,
   bf16 or f32: the rows are picked from q's own values) with the spread rows where ei_profile's one call
   holds the segment whole, (s + 1) * S7_SEG <= S7_N, the even rows in the last segment; even rows: the
   test's own sum below, as before. */
static void s7_mass_ref(const s7_data *D, const ei_config *c, int kvh, int s, double *mass) {
    int G = S7_H / S7_KV, d = D->d, i, e;
    int64_t nvis = (int64_t)s * (c->segment_size / c->block_size), j, t;
    double scale, *lg;
    if (c->rank_rows == EI_RANK_ROWS_SPREAD || c->rank_precision == EI_RANK_PRECISION_INT8) {
        ei_tensor tq = ei_tensor_make(D->q, D->dt, S7_N, S7_H, d), tk = ei_tensor_make(D->k, D->dt, S7_N, S7_KV, d);
        (void)ref_sampled_mass_rows(c, &tq, &tk, kvh, s, S7_N, NULL,
                                    c->rank_rows == EI_RANK_ROWS_SPREAD && (int64_t)(s + 1) * S7_SEG <= S7_N, mass);
        return;
    }
    scale = (double)(1.0f / sqrtf((float)d));
    lg = (double *)malloc(S7_N * sizeof(double));
    for (j = 0; j < nvis; ++j) mass[j] = 0.0;
    for (i = 0; i < c->rank_samples; ++i) {
        double mx = -1e300, z = 0.0;
        const double *q;
        t = ei__sample_token(c, s, i);
        if (t >= S7_N) continue;
        q = D->qd + ((size_t)t * S7_H + (size_t)(kvh * G + i % G)) * d;
        for (j = 0; j <= t; ++j) {
            const double *k = D->kd + ((size_t)j * S7_KV + kvh) * d;
            double acc = 0.0;
            for (e = 0; e < d; ++e) acc += q[e] * k[e];
            lg[j] = scale * acc;
            if (lg[j] > mx) mx = lg[j];
        }
        for (j = 0; j <= t; ++j) z += (lg[j] = exp(lg[j] - mx));
        for (j = 0; j < (int64_t)s * c->segment_size; ++j) mass[j / c->block_size] += lg[j] / z;
    }
    free(lg);
}
/* The ranking score and top_p weight of the visible blocks of (kvh, s). */
static void s7_scores(const s7_data *D, const ei_config *c, const ei_plan *cpu, int kvh, int s, double *sc) {
    int64_t nvis = (int64_t)s * (c->segment_size / c->block_size), b;
    if (c->ranking == EI_RANK_SAMPLED && (int64_t)s * c->segment_size >= c->threshold_len) {
        s7_mass_ref(D, c, kvh, s, sc);
        return;
    }
    for (b = 0; b < nvis; ++b) sc[b] = cpu->scores[EI_PLAN_ROW(cpu, kvh, s) * (size_t)cpu->blk_capacity + (size_t)b];
}
/* The ideal row of the scores (candidates by descending score, ties to the
   lower index; forced first) as a plan row, and with top_p its own count. */
static void s7_ideal(const ei_config *c, const ei_plan *a, int kvh, int s, const double *sc, ei_plan *ideal) {
    size_t r = EI_PLAN_ROW(a, kvh, s);
    int32_t *row = EI_PLAN_BLOCKS(ideal, kvh, s);
    int64_t nvis = (int64_t)s * (c->segment_size / c->block_size), ns, l0, cap = ei__cap_blocks(c, s, a->n_tokens, a->n_blocks);
    int nf = (int)ei__forced_blocks(c, nvis, &ns, &l0), n = 0, i, j, k;
    int32_t *cand = (int32_t *)malloc((size_t)(nvis + 1) * 4);
    for (i = 0; i < nf; ++i) cand[n++] = i < ns ? i : (int)l0 + (i - (int)ns);
    for (i = (int)ns; i < l0; ++i) cand[n++] = i;
    for (i = nf + 1; i < n; ++i) /* insertion sort of the candidates */
        for (j = i; j > nf && (sc[cand[j]] > sc[cand[j - 1]] || (sc[cand[j]] == sc[cand[j - 1]] && cand[j] < cand[j - 1])); --j) {
            int32_t t = cand[j]; cand[j] = cand[j - 1]; cand[j - 1] = t;
        }
    k = a->keep_blocks[r];
    if (c->top_p > 0) {
        double tot = 0, cum = 0;
        int64_t b, kp;
        for (b = 0; b < nvis; ++b) tot += sc[b];
        for (kp = 0; kp < n && cum < c->top_p * tot; ++kp) cum += sc[cand[kp]];
        if (kp < nf) kp = nf;
        if (cum < c->top_p * tot) kp = n + 1;
        k = ei__keep_count(c, s, 0.0, kp, nf, cap, a->max_keep);
    }
    ideal->keep_blocks[r] = k;
    ideal->keep_count[r] = c->per_segment_budget ? a->keep_count[r] : k;
    for (i = 0; i < a->max_keep; ++i) row[i] = i < (c->per_segment_budget ? a->keep_count[r] : k) && i < n ? cand[i] : -1;
    free(cand);
}

/* Every row of plan b against the CPU's plan a. */
static void s7_compare(const char *what, const s7_case *cs, const s7_data *D, const ei_plan *a, const ei_plan *b) {
    ei_config c = s7_config(cs);
    double *sc = (double *)malloc((size_t)S7_NB * sizeof(double));
    int kvh, s, bad = 0, knife = 0, shown = 0, maxbad = 0;
    CHECK(a->n_segments == S7_NSEG && b->n_segments == S7_NSEG && a->max_keep == b->max_keep && a->n_blocks == b->n_blocks,
          "7: %s: %s: plan shapes differ", cs->name, what);
    if (a->n_segments != S7_NSEG || b->n_segments != S7_NSEG || a->max_keep != b->max_keep) { free(sc); return; }
    for (kvh = 0; kvh < S7_KV; ++kvh)
        for (s = 0; s < S7_NSEG; ++s) {
            size_t r = EI_PLAN_ROW(a, kvh, s);
            if (s == 0) {
                bad += a->keep_count[r] != 0 || b->keep_count[r] != 0 || EI_PLAN_BLOCKS(b, kvh, s)[0] != -1;
                continue;
            }
            s7_scores(D, &c, a, kvh, s, sc);
            bad += plan_row_compare(what, &c, a, b, kvh, s, sc, test_tols[TOL_RANK_REFERENCE].tie, &knife, &shown);
        }
    if (c.per_segment_budget) /* every head keeps the max of the heads' own counts */
        for (s = 0; s < S7_NSEG; ++s) {
            int ma = 0, mb = 0;
            for (kvh = 0; kvh < S7_KV; ++kvh) {
                ma = a->keep_blocks[EI_PLAN_ROW(a, kvh, s)] > ma ? a->keep_blocks[EI_PLAN_ROW(a, kvh, s)] : ma;
                mb = b->keep_blocks[EI_PLAN_ROW(b, kvh, s)] > mb ? b->keep_blocks[EI_PLAN_ROW(b, kvh, s)] : mb;
            }
            for (kvh = 0; kvh < S7_KV; ++kvh)
                maxbad += a->keep_count[EI_PLAN_ROW(a, kvh, s)] != ma || b->keep_count[EI_PLAN_ROW(b, kvh, s)] != mb;
        }
    CHECK(bad == 0 && maxbad == 0, "7: %s: %s: %d rows differ beyond near-ties, %d per-segment counts are not the max (%d knife-edges of top_p)",
          cs->name, what, bad, maxbad, knife);
    CHECK(knife <= 2, "7: %s: %s: %d knife-edges of top_p", cs->name, what, knife);
    printf("  7: %s: %s: %s (%d knife-edges of top_p)\n", cs->name, what, bad || maxbad ? "DIFFER" : "the same plan", knife);
    free(sc);
}
/* CPU half: the CPU's rows against the ideal rows of the test's scores, and
   that the data make the ranking matter (rows that keep fewer blocks than
   they see; with the sampled ranking, rows whose kept set differs from the
   reference score's). */
static void s7_check_cpu(const s7_case *cs, const s7_data *D, const ei_plan *a) {
    ei_config c = s7_config(cs);
    ei_context *host = ctx_make(0, c);
    ei_plan ideal;
    double *sc = (double *)malloc((size_t)S7_NB * sizeof(double)), *ref = (double *)malloc((size_t)S7_NB * sizeof(double));
    int kvh, s, i, bad = 0, knife = 0, shown = 0, selective = 0, differs = 0, kmin = 1 << 30, kmax = 0;
    CHECK_ERR(ei_plan_init(host, &ideal, S7_N, S7_KV, D->d, 0, NULL, 0), EI_OK);
    for (kvh = 0; kvh < S7_KV; ++kvh)
        for (s = 1; s < S7_NSEG; ++s) {
            size_t r = EI_PLAN_ROW(a, kvh, s);
            int64_t nvis = (int64_t)s * (S7_SEG / S7_BS), ns, l0, nf = ei__forced_blocks(&c, nvis, &ns, &l0);
            int k = a->keep_count[r];
            kmin = a->keep_blocks[r] < kmin ? a->keep_blocks[r] : kmin;
            kmax = a->keep_blocks[r] > kmax ? a->keep_blocks[r] : kmax;
            s7_scores(D, &c, a, kvh, s, sc);
            s7_ideal(&c, a, kvh, s, sc, &ideal);
            bad += plan_row_compare("cpu vs ideal", &c, a, &ideal, kvh, s, sc, test_tols[TOL_RANK_REFERENCE].tie, &knife, &shown);
            if (k < nvis) selective++;
            if (c.ranking == EI_RANK_SAMPLED && (int64_t)s * S7_SEG >= c.threshold_len && k > nf) {
                /* kept by mass, not among the reference's top k - nf candidates */
                const float *p = a->scores + r * (size_t)a->blk_capacity;
                const int32_t *row = EI_PLAN_BLOCKS(a, kvh, s);
                for (i = (int)nf; i < k; ++i) {
                    int64_t b2, better = 0;
                    for (b2 = ns; b2 < l0; ++b2) better += p[b2] > p[row[i]];
                    if (better >= k - nf) { differs++; break; }
                }
            }
        }
    CHECK(bad == 0, "7: %s: cpu vs ideal rows: %d differences beyond near-ties", cs->name, bad);
    CHECK(knife <= 2, "7: %s: cpu vs ideal rows: %d knife-edges of top_p", cs->name, knife);
    CHECK(selective >= S7_KV * (S7_NSEG - 1) / 2, "7: test data: %s: only %d rows keep fewer blocks than they see", cs->name,
          selective);
    if (c.ranking == EI_RANK_SAMPLED)
        CHECK(differs >= 4, "7: test data: %s: the sampled ranking changes only %d rows", cs->name, differs);
    printf("  7: %s: cpu rows = ideal rows of the test's scores (%d knife-edges); own counts %d..%d, %d selective "
           "rows, %d ranked otherwise than by the reference score\n", cs->name, knife, kmin, kmax, selective, differs);
    ei_plan_free(host, &ideal);
    free(sc);
    free(ref);
    ei_context_destroy(host);
}

/* ------------------------------------------------------------ 8: decode over a row map */
/* A cache whose rows are not in position order: positions 0..299 scattered
   over 337 rows (the 37 empty rows NaN, never read), f32, 8 query heads on 2
   kv heads, window 16, budget 96. On each backend: ei_decode_keep with
   row_pos (positions, mask, pooled); ei_decode_score in 3 parts (ith/nth,
   one shared workspace; the same scores as one whole call); ei_decode_select
   of those scores; a keep set per query head
   (per_kv_head 0, max pooling) over per-kv-head maps; compaction per kv
   head, 8 new positions into rows in reverse order and a second
   compression over per-kv-head maps; the shared keep set of two layers
   (ei_decode_shared_add, ei_decode_select_shared) and its compaction of a
   2-head cache; the misuse codes. The GPU against the CPU: kept positions
   identical up to near-ties of the CPU's pooled scores (1e-3 relative),
   pooled scores within 1e-3, the same codes. */
enum { S8_H = 8, S8_KV = 2, S8_D = 32, S8_GAP = 4, S8_WIN = 16, S8_BUDGET = 96, S8_NPOS = 300, S8_EXTRA = 37,
       S8_MORE = 8, S8_ROWS = S8_NPOS + S8_EXTRA, S8_L = S8_NPOS - S8_WIN, S8_ROWS2 = S8_BUDGET + S8_MORE,
       S8_MISUSE = 13 };
typedef struct s8_out {
    keep_host keep, sel, perq, second, shared_set;
    float *scores;     /* [H][ROWS] of layer 1 */
    float *shared;     /* [ROWS] */
    float *shared_max; /* [ROWS] the same with gqa_reduce max (the layers' maximum) */
    int32_t *map2;     /* [KV][ROWS2]: the second compression's map */
    ei_result misuse[S8_MISUSE];
} s8_out;
typedef struct s8_data {
    float *q, *q2, *k; /* [NPOS + MORE][H or KV][D] */
    float *kB;         /* [ROWS][KV][D]: the scattered cache */
    int32_t *row_pos;  /* [ROWS] */
    int32_t *row_pos2; /* [2][ROWS]: the same map for each kv head */
} s8_data;

/* misuse cases of s8_run, in order: a value -2 in the map (decode_keep,
   decode_select), two rows holding one position (decode_keep,
   decode_shared_add), a window position missing (decode_score), NaN in a
   row holding a position (decode_keep, decode_score of the second kv head's
   query heads), row_pos_stride < rows (decode_score), Inf in a shared score
   (decode_select_shared); then ei_exec misuse, refused alike by both
   backends before anything else: part ith 2 of nth 2 (decode_score),
   n_threads with nth (decode_select), a NULL workspace with
   workspace_bytes (decode_keep), ei_decode_keep in parts */
static const ei_result s8_misuse_codes[S8_MISUSE] = {EI_ERR_SHAPE, EI_ERR_SHAPE, EI_ERR_SHAPE, EI_ERR_SHAPE, EI_ERR_SHAPE,
                                                     EI_ERR_NONFINITE, EI_ERR_NONFINITE, EI_ERR_STRIDE, EI_ERR_NONFINITE,
                                                     EI_ERR_SIZE, EI_ERR_CONFIG, EI_ERR_NULL, EI_ERR_CONFIG};
static ei_config s8_config(void) {
    ei_config c = ei_config_default();
    c.decode_budget = S8_BUDGET; c.window = S8_WIN; c.decode_gap = S8_GAP; c.recompress_every = S8_MORE;
    return c;
}
static s8_data s8_make(void) {
    s8_data d;
    int32_t perm[S8_ROWS];
    long j, t;
    uint32_t s = 12345u;
    d.q = (float *)malloc(sizeof(float) * (S8_NPOS + S8_MORE) * S8_H * S8_D);
    d.q2 = (float *)malloc(sizeof(float) * (S8_NPOS + S8_MORE) * S8_H * S8_D);
    d.k = (float *)malloc(sizeof(float) * (S8_NPOS + S8_MORE) * S8_KV * S8_D);
    d.kB = (float *)malloc(sizeof(float) * S8_ROWS * S8_KV * S8_D);
    d.row_pos = (int32_t *)malloc(sizeof(int32_t) * S8_ROWS);
    d.row_pos2 = (int32_t *)malloc(sizeof(int32_t) * 2 * S8_ROWS);
    {
        float *k2 = (float *)malloc(sizeof(float) * (S8_NPOS + S8_MORE) * S8_KV * S8_D);
        synth_qk(d.q, d.k, S8_NPOS + S8_MORE, S8_H, S8_KV, S8_D, 64, 2, 23);
        synth_qk(d.q2, k2, S8_NPOS + S8_MORE, S8_H, S8_KV, S8_D, 64, 2, 29);
        free(k2);
    }
    for (j = 0; j < S8_ROWS; ++j) { perm[j] = (int32_t)j; d.row_pos[j] = -1; }
    for (j = S8_ROWS - 1; j > 0; --j) {
        long x;
        int32_t tmp;
        s = s * 1664525u + 1013904223u;
        x = (long)(s >> 8) % (j + 1);
        tmp = perm[j]; perm[j] = perm[x]; perm[x] = tmp;
    }
    for (j = 0; j < S8_ROWS * S8_KV * S8_D; ++j) d.kB[j] = NAN;
    for (t = 0; t < S8_NPOS; ++t) {
        d.row_pos[perm[t]] = (int32_t)t;
        memcpy(d.kB + (size_t)perm[t] * S8_KV * S8_D, d.k + (size_t)t * S8_KV * S8_D, sizeof(float) * S8_KV * S8_D);
    }
    memcpy(d.row_pos2, d.row_pos, sizeof(int32_t) * S8_ROWS);
    memcpy(d.row_pos2 + S8_ROWS, d.row_pos, sizeof(int32_t) * S8_ROWS);
    return d;
}
static void s8_free_data(s8_data *d) { free(d->q); free(d->q2); free(d->k); free(d->kB); free(d->row_pos); free(d->row_pos2); }

/* The shape of a keep set (check.h's keep_check_one, window S8_WIN). */
static void s8_check_one(const char *who, const char *what, const keep_host *o, const int32_t *map, int64_t stride,
                         int32_t div) {
    keep_check_one(who, what, o, map, stride, div, S8_WIN);
}
/* b against a (the CPU's), up to near-ties (check.h's keep_compare). */
static void s8_compare_keep(const char *what, const keep_host *a, const keep_host *b, const int32_t *map, int64_t stride,
                            int32_t div) {
    int f = failures, ties = keep_compare(what, a, b, map, stride, div, S8_WIN);
    if (failures != f) printf("  8: %s: FAILED\n", what);
    else printf("  8: %s: the same kept positions (%d near-tie swaps), pooled scores within 1e-3\n", what, ties);
}

static void s8_observe(const side *s, ei_decoder *dec, void *dq, long from, long to, int generated) {
    long t;
    if (!generated) {
        ei_tensor tq = ei_tensor_make((const char *)dq + (size_t)from * S8_H * S8_D * 4, EI_F32, to - from, S8_H, S8_D);
        CHECK_ERR(ei_decode_observe(s->ctx, dec, &tq, from, 0), EI_OK);
        return;
    }
    for (t = from; t < to; ++t) {
        ei_tensor one = ei_tensor_make((const char *)dq + (size_t)t * S8_H * S8_D * 4, EI_F32, 1, S8_H, S8_D);
        CHECK_ERR(ei_decode_observe(s->ctx, dec, &one, t, 1), EI_OK);
    }
}
static void s8_observe_all(const side *s, ei_decoder *dec, void *dq) {
    CHECK_ERR(ei_decoder_reset(dec), EI_OK);
    s8_observe(s, dec, dq, 0, S8_NPOS - S8_GAP, 0);
    s8_observe(s, dec, dq, S8_NPOS - S8_GAP, S8_NPOS, 1);
}

static void s8_run(int gpu, const s8_data *D, s8_out *o) {
    ei_config c = s8_config(), cq = s8_config();
    side s = side_make(gpu, c), sq;
    ei_exec x1;
    size_t ring_bytes, wb, kb_bytes = sizeof(float) * S8_ROWS * S8_KV * S8_D, sc_bytes = sizeof(float) * S8_H * S8_ROWS;
    void *ring, *ring2, *ws, *dq, *dq2, *dk;
    int32_t *drp, *drp2, *dmap2;
    float *dsc, *dsc2, *dshared;
    ei_decoder dec, dec2;
    ei_keep_set ks;
    ei_tensor kB = ei_tensor_make(NULL, EI_F32, S8_ROWS, S8_KV, S8_D);
    ei_out_tensor ko;
    int i, h, mi = 0;
    const char *who = side_name(&s);
    cq.per_kv_head = 0; cq.pool = EI_POOL_MAX; cq.pool_kernel = 3;
    sq = side_make(gpu, cq);
    ring_bytes = layer_sizes(s.ctx, S8_ROWS, S8_H, S8_KV, S8_D, 0, 1).decoder;
    ring = mem_new(&s, ring_bytes);
    ring2 = mem_new(&s, ring_bytes);
    CHECK_ERR(ei_decoder_init(s.ctx, &dec, S8_H, S8_KV, S8_D, ring, ring_bytes), EI_OK);
    CHECK_ERR(ei_decoder_init(s.ctx, &dec2, S8_H, S8_KV, S8_D, ring2, ring_bytes), EI_OK);
    /* per query head: the larger; for 3 parts (ei_decode_score below), whole calls take it too */
    wb = layer_sizes(sq.ctx, S8_ROWS, S8_H, S8_KV, S8_D, 0, 3).decode_keep;
    ws = mem_new(&s, wb);
    x1 = ex(1, ws, wb);
    dq = mem_up(&s, D->q, sizeof(float) * (S8_NPOS + S8_MORE) * S8_H * S8_D);
    dq2 = mem_up(&s, D->q2, sizeof(float) * (S8_NPOS + S8_MORE) * S8_H * S8_D);
    dk = mem_up(&s, D->kB, kb_bytes);
    drp = (int32_t *)mem_up(&s, D->row_pos, sizeof(int32_t) * S8_ROWS);
    drp2 = (int32_t *)mem_up(&s, D->row_pos2, sizeof(int32_t) * 2 * S8_ROWS);
    dsc = (float *)mem_new(&s, sc_bytes);
    dsc2 = (float *)mem_new(&s, sc_bytes);
    kB.data = dk;
    s8_observe_all(&s, &dec, dq);

    /* decode_keep over the scattered rows */
    ks = keep_new(&s, S8_KV, S8_BUDGET, S8_ROWS, S8_ROWS);
    ks.row_pos = drp;
    keep_take(&s, &ks, ei_decode_keep(s.ctx, &x1, &dec, &kB, &ks), &o->keep);
    CHECK(o->keep.r == EI_OK && o->keep.n_kept == S8_BUDGET && o->keep.compressed == 1 && o->keep.n_tokens == S8_ROWS,
          "8 (%s): decode_keep with row_pos: %s, kept %d", who, ei_result_name(o->keep.r), o->keep.n_kept);
    s8_check_one(who, "decode_keep", &o->keep, D->row_pos, 0, 1);

    /* decode_score in 3 parts (one workspace) = one whole call; select from those scores */
    for (i = 0; i < 3; ++i) {
        ei_exec xp = ex_part(i, 3, ws, wb);
        CHECK_ERR(ei_decode_score(s.ctx, &xp, &dec, &kB, drp, 0, dsc), EI_OK);
    }
    CHECK_ERR(ei_decode_score(s.ctx, &x1, &dec, &kB, drp, 0, dsc2), EI_OK);
    o->scores = (float *)mem_down(&s, dsc, sc_bytes);
    {
        float *one = (float *)mem_down(&s, dsc2, sc_bytes);
        CHECK(!memcmp(one, o->scores, sc_bytes), "8 (%s): decode_score in 3 parts differs from one call", who);
        free(one);
    }
    ks = keep_new(&s, S8_KV, S8_BUDGET, S8_ROWS, S8_ROWS);
    ks.row_pos = drp;
    keep_take(&s, &ks, ei_decode_select(s.ctx, &x1, &dec, dsc, S8_ROWS, &ks), &o->sel);
    s8_check_one(who, "decode_select", &o->sel, D->row_pos, 0, 1);

    /* a keep set per query head (max pooling), per-kv-head maps */
    {
        ei_decoder decq;
        void *ringq = mem_new(&sq, ring_bytes);
        CHECK_ERR(ei_decoder_init(sq.ctx, &decq, S8_H, S8_KV, S8_D, ringq, ring_bytes), EI_OK);
        s8_observe_all(&sq, &decq, dq);
        ks = keep_new(&sq, S8_H, S8_BUDGET, S8_ROWS, S8_ROWS);
        ks.row_pos = drp2;
        ks.row_pos_stride = S8_ROWS;
        keep_take(&sq, &ks, ei_decode_keep(sq.ctx, &x1, &decq, &kB, &ks), &o->perq);
        CHECK(o->perq.r == EI_OK, "8 (%s): per query head: %s", who, ei_last_error());
        s8_check_one(who, "per query head", &o->perq, D->row_pos2, S8_ROWS, S8_H / S8_KV);
        mem_del(&sq, ringq, ring_bytes);
    }

    /* compaction per kv head, then 8 new positions into rows 96..103 (newest
       first) and a second compression over per-kv-head maps */
    ks = keep_new(&s, S8_KV, S8_BUDGET, S8_ROWS, S8_ROWS);
    ks.row_pos = drp;
    CHECK_ERR(ei_decode_keep(s.ctx, &x1, &dec, &kB, &ks), EI_OK);
    ko = ei_out_tensor_make(dk, EI_F32, S8_ROWS, S8_KV, S8_D);
    CHECK_ERR(ei_kv_compact(s.ctx, &ks, &ko, NULL), EI_OK);
    o->map2 = (int32_t *)malloc(sizeof(int32_t) * S8_KV * S8_ROWS2);
    {
        float *kc = (float *)mem_down(&s, dk, kb_bytes);
        int32_t *pos = (int32_t *)mem_down(&s, ks.positions, sizeof(int32_t) * S8_KV * S8_BUDGET);
        int bad = 0;
        for (h = 0; h < S8_KV; ++h) {
            for (i = 0; i < S8_BUDGET; ++i) {
                bad += memcmp(kc + ((size_t)i * S8_KV + h) * S8_D, D->k + ((size_t)pos[h * S8_BUDGET + i] * S8_KV + h) * S8_D,
                              sizeof(float) * S8_D) != 0;
                o->map2[h * S8_ROWS2 + i] = pos[h * S8_BUDGET + i];
            }
            for (i = 0; i < S8_MORE; ++i) {
                int32_t p = S8_NPOS + S8_MORE - 1 - i;
                o->map2[h * S8_ROWS2 + S8_BUDGET + i] = p;
                memcpy(kc + ((size_t)(S8_BUDGET + i) * S8_KV + h) * S8_D, D->k + ((size_t)p * S8_KV + h) * S8_D,
                       sizeof(float) * S8_D);
            }
        }
        CHECK(bad == 0, "8 (%s): kv_compact per kv head: %d rows are not the kept positions' keys", who, bad);
        mem_put(&s, dk, kc, sizeof(float) * S8_ROWS2 * S8_KV * S8_D);
        free(kc);
        free(pos);
    }
    keep_del(&s, &ks);
    s8_observe(&s, &dec, dq, S8_NPOS, S8_NPOS + S8_MORE, 1);
    CHECK(ei_decode_due(s.ctx, &dec), "8 (%s): due after recompress_every tokens", who);
    dmap2 = (int32_t *)mem_up(&s, o->map2, sizeof(int32_t) * S8_KV * S8_ROWS2);
    {
        ei_tensor kC = ei_tensor_make(dk, EI_F32, S8_ROWS2, S8_KV, S8_D);
        ks = keep_new(&s, S8_KV, S8_BUDGET, S8_ROWS2, S8_ROWS2);
        ks.row_pos = dmap2;
        ks.row_pos_stride = S8_ROWS2;
        keep_take(&s, &ks, ei_decode_keep(s.ctx, &x1, &dec, &kC, &ks), &o->second);
        CHECK(o->second.r == EI_OK && o->second.n_kept == S8_BUDGET, "8 (%s): second compression: %s", who,
              ei_result_name(o->second.r));
        s8_check_one(who, "second compression", &o->second, o->map2, S8_ROWS2, 1);
    }

    /* the shared keep set of two layers over the scattered cache */
    mem_put(&s, dk, D->kB, kb_bytes);
    s8_observe_all(&s, &dec, dq);
    s8_observe_all(&s, &dec2, dq2);
    dshared = (float *)mem_new(&s, sizeof(float) * S8_ROWS);
    {
        float zeros[S8_ROWS];
        memset(zeros, 0, sizeof zeros);
        mem_put(&s, dshared, zeros, sizeof zeros);
    }
    CHECK_ERR(ei_decode_score(s.ctx, &x1, &dec, &kB, drp, 0, dsc), EI_OK);
    CHECK_ERR(ei_decode_score(s.ctx, &x1, &dec2, &kB, drp, 0, dsc2), EI_OK);
    CHECK_ERR(ei_decode_shared_add(s.ctx, &x1, &dec, dsc, S8_ROWS, drp, dshared), EI_OK);
    CHECK(!ei_decode_due(s.ctx, &dec) && ei_decode_due(s.ctx, &dec2), "8 (%s): shared_add marks its decoder", who);
    CHECK_ERR(ei_decode_shared_add(s.ctx, &x1, &dec2, dsc2, S8_ROWS, drp, dshared), EI_OK);
    o->shared = (float *)mem_down(&s, dshared, sizeof(float) * S8_ROWS);
    { /* gqa_reduce max: the heads' and the layers' maximum */
        ei_config cm = s8_config();
        side sm;
        float zeros[S8_ROWS];
        cm.gqa_reduce = EI_REDUCE_MAX;
        sm = side_make(gpu, cm);
        memset(zeros, 0, sizeof zeros);
        mem_put(&s, dshared, zeros, sizeof zeros);
        CHECK_ERR(ei_decode_shared_add(sm.ctx, &x1, &dec, dsc, S8_ROWS, drp, dshared), EI_OK);
        CHECK_ERR(ei_decode_shared_add(sm.ctx, &x1, &dec2, dsc2, S8_ROWS, drp, dshared), EI_OK);
        o->shared_max = (float *)mem_down(&s, dshared, sizeof(float) * S8_ROWS);
        mem_put(&s, dshared, o->shared, sizeof(float) * S8_ROWS);
        side_free(&sm);
    }
    ks = keep_new(&s, 1, S8_BUDGET, S8_ROWS, S8_ROWS);
    ks.row_pos = drp;
    keep_take(&s, &ks, ei_decode_select_shared(s.ctx, &x1, &dec, dshared, S8_ROWS, &ks), &o->shared_set);
    CHECK(o->shared_set.r == EI_OK && o->shared_set.n_kept == S8_BUDGET, "8 (%s): select_shared: %s", who,
          ei_result_name(o->shared_set.r));
    s8_check_one(who, "shared keep set", &o->shared_set, D->row_pos, 0, 1);
    if (o->shared_set.r == EI_OK) { /* one shared set compacts both heads of the cache */
        float *kc;
        int bad = 0;
        int32_t *didx = (int32_t *)mem_up(&s, o->shared_set.index, sizeof(int32_t) * S8_BUDGET);
        ei_keep_set sh;
        memset(&sh, 0, sizeof sh);
        sh.heads_out = 1; sh.capacity = S8_BUDGET; sh.n_kept = o->shared_set.n_kept; sh.n_tokens = S8_ROWS;
        sh.compressed = 1; sh.index = didx;
        ko = ei_out_tensor_make(dk, EI_F32, S8_ROWS, S8_KV, S8_D);
        CHECK_ERR(ei_kv_compact(s.ctx, &sh, &ko, NULL), EI_OK);
        kc = (float *)mem_down(&s, dk, kb_bytes);
        for (i = 0; i < S8_BUDGET; ++i)
            for (h = 0; h < S8_KV; ++h)
                bad += memcmp(kc + ((size_t)i * S8_KV + h) * S8_D,
                              D->k + ((size_t)o->shared_set.positions[i] * S8_KV + h) * S8_D, sizeof(float) * S8_D) != 0;
        CHECK(bad == 0, "8 (%s): shared compaction: %d rows differ", who, bad);
        free(kc);
        mem_del(&s, didx, sizeof(int32_t) * S8_BUDGET);
    }

    /* misuse: the same codes on both backends */
    mem_put(&s, dk, D->kB, kb_bytes);
    {
        int32_t rp[S8_ROWS];
        int32_t r5 = -1, r6 = -1, rw = -1;
        float nan_row[S8_KV * S8_D], shared_bad[S8_ROWS];
        for (i = 0; i < S8_ROWS; ++i) {
            if (D->row_pos[i] == 5) r5 = i;
            if (D->row_pos[i] == 6) r6 = i;
            if (D->row_pos[i] == S8_NPOS - 3) rw = i;
        }
        ks = keep_new(&s, S8_KV, S8_BUDGET, S8_ROWS, S8_ROWS);
        ks.row_pos = drp;
        memcpy(rp, D->row_pos, sizeof rp);
        rp[r5] = -2; /* not a position */
        mem_put(&s, drp, rp, sizeof rp);
        o->misuse[mi++] = ei_decode_keep(s.ctx, &x1, &dec, &kB, &ks);
        o->misuse[mi++] = ei_decode_select(s.ctx, &x1, &dec, dsc, S8_ROWS, &ks);
        rp[r5] = 6; /* two rows hold position 6 */
        mem_put(&s, drp, rp, sizeof rp);
        o->misuse[mi++] = ei_decode_keep(s.ctx, &x1, &dec, &kB, &ks);
        o->misuse[mi++] = ei_decode_shared_add(s.ctx, &x1, &dec, dsc, S8_ROWS, drp, dshared);
        rp[r5] = 5;
        rp[rw] = -1; /* a window position missing: the newest 16 are not consecutive */
        mem_put(&s, drp, rp, sizeof rp);
        o->misuse[mi++] = ei_decode_score(s.ctx, &x1, &dec, &kB, drp, 0, dsc);
        rp[rw] = S8_NPOS - 3;
        mem_put(&s, drp, rp, sizeof rp);
        for (i = 0; i < S8_KV * S8_D; ++i) nan_row[i] = NAN; /* NaN in a row holding position 6 */
        mem_put(&s, (float *)dk + (size_t)r6 * S8_KV * S8_D, nan_row, sizeof nan_row);
        o->misuse[mi++] = ei_decode_keep(s.ctx, &x1, &dec, &kB, &ks);
        { /* in 2 parts, part 1 first (the second kv head's query heads): the first part that fails says it (on
             the GPU part 0 makes the whole call and part 1 returns EI_OK) */
            ei_exec xp = ex_part(1, 2, ws, wb);
            ei_result r = ei_decode_score(s.ctx, &xp, &dec, &kB, drp, 0, dsc);
            if (!gpu) CHECK(r == EI_ERR_NONFINITE, "8 (cpu): part 1 of 2 with NaN in its heads' rows: %s", ei_result_name(r));
            xp.ith = 0;
            if (r == EI_OK) r = ei_decode_score(s.ctx, &xp, &dec, &kB, drp, 0, dsc);
            o->misuse[mi++] = r;
        }
        o->misuse[mi++] = ei_decode_score(s.ctx, &x1, &dec, &kB, drp, 1, dsc); /* stride < rows */
        for (i = 0; i < S8_ROWS; ++i) shared_bad[i] = 1.0f;
        shared_bad[r5] = INFINITY;
        mem_put(&s, dshared, shared_bad, sizeof shared_bad);
        ks.heads_out = 1;
        o->misuse[mi++] = ei_decode_select_shared(s.ctx, &x1, &dec, dshared, S8_ROWS, &ks);
        ks.heads_out = S8_KV;
        {
            ei_exec bad = ex_part(2, 2, ws, wb);
            o->misuse[mi++] = ei_decode_score(s.ctx, &bad, &dec, &kB, drp, 0, dsc);
            bad = ex_part(0, 2, ws, wb);
            bad.n_threads = 2;
            o->misuse[mi++] = ei_decode_select(s.ctx, &bad, &dec, dsc, S8_ROWS, &ks);
            bad = ex(1, NULL, wb);
            o->misuse[mi++] = ei_decode_keep(s.ctx, &bad, &dec, &kB, &ks);
            bad = ex_part(0, 2, ws, wb);
            o->misuse[mi++] = ei_decode_keep(s.ctx, &bad, &dec, &kB, &ks);
        }
        keep_del(&s, &ks);
    }
    for (i = 0; i < S8_MISUSE; ++i)
        CHECK(o->misuse[i] == s8_misuse_codes[i], "8 (%s): misuse %d returned %s, expected %s", who, i,
              ei_result_name(o->misuse[i]), ei_result_name(s8_misuse_codes[i]));
    CHECK(mi == S8_MISUSE, "8: %d misuse cases run", mi);
    mem_del(&s, dshared, sizeof(float) * S8_ROWS);
    mem_del(&s, dmap2, sizeof(int32_t) * S8_KV * S8_ROWS2);
    mem_del(&s, dsc, sc_bytes);
    mem_del(&s, dsc2, sc_bytes);
    mem_del(&s, drp, sizeof(int32_t) * S8_ROWS);
    mem_del(&s, drp2, sizeof(int32_t) * 2 * S8_ROWS);
    mem_del(&s, dk, kb_bytes);
    mem_del(&s, dq, sizeof(float) * (S8_NPOS + S8_MORE) * S8_H * S8_D);
    mem_del(&s, dq2, sizeof(float) * (S8_NPOS + S8_MORE) * S8_H * S8_D);
    mem_del(&s, ws, wb);
    mem_del(&s, ring, ring_bytes);
    mem_del(&s, ring2, ring_bytes);
    side_free(&sq);
    side_free(&s);
}

/* The GPU's results against the CPU's (and each side's select against its keep). */
static void s8_compare(const s8_out *a, const s8_out *b, const s8_data *D) {
    int64_t j;
    int bad = 0, zero = 0;
    int32_t i;
    s8_compare_keep("decode_keep over row_pos, gpu vs cpu", &a->keep, &b->keep, D->row_pos, 0, 1);
    s8_compare_keep("decode_select, gpu vs cpu", &a->sel, &b->sel, D->row_pos, 0, 1);
    s8_compare_keep("gpu decode_select vs gpu decode_keep", &b->keep, &b->sel, D->row_pos, 0, 1);
    s8_compare_keep("per query head (max pooling, per-kv-head maps), gpu vs cpu", &a->perq, &b->perq, D->row_pos2,
                    S8_ROWS, S8_H / S8_KV);
    if (!memcmp(a->map2, b->map2, sizeof(int32_t) * S8_KV * S8_ROWS2))
        s8_compare_keep("second compression (per-kv-head maps, rows out of order), gpu vs cpu", &a->second, &b->second,
                        a->map2, S8_ROWS2, 1);
    else
        printf("  8: second compression: the first kept other positions (near-ties): compared on each side only\n");
    s8_compare_keep("shared keep set of two layers, gpu vs cpu", &a->shared_set, &b->shared_set, D->row_pos, 0, 1);
    for (j = 0; j < (int64_t)S8_H * S8_ROWS; ++j) {
        if (a->scores[j] == 0.0f) zero += b->scores[j] != 0.0f;
        if (!close_to(b->scores[j], a->scores[j], test_tols[TOL_DECODE_SCORE].abs, test_tols[TOL_DECODE_SCORE].rel) && bad++ < 3)
            printf("  8: scores[%lld]: cpu %g gpu %g\n", (long long)j, (double)a->scores[j], (double)b->scores[j]);
    }
    CHECK(bad == 0 && zero == 0, "8: decode_score: %d scores differ beyond 1e-3, %d empty rows not 0", bad, zero);
    for (bad = 0, j = 0; j < S8_ROWS; ++j)
        if (!close_to(b->shared[j], a->shared[j], test_tols[TOL_DECODE_SCORE].abs, test_tols[TOL_DECODE_SCORE].rel) && bad++ < 3)
            printf("  8: shared[%lld]: cpu %g gpu %g\n", (long long)j, (double)a->shared[j], (double)b->shared[j]);
    CHECK(bad == 0, "8: shared scores differ");
    for (bad = 0, j = 0; j < S8_ROWS; ++j)
        if (!close_to(b->shared_max[j], a->shared_max[j], test_tols[TOL_DECODE_SCORE].abs, test_tols[TOL_DECODE_SCORE].rel) && bad++ < 3)
            printf("  8: shared (max)[%lld]: cpu %g gpu %g\n", (long long)j, (double)a->shared_max[j], (double)b->shared_max[j]);
    CHECK(bad == 0, "8: shared scores (gqa_reduce max) differ");
    for (i = 0; i < S8_MISUSE; ++i)
        CHECK(a->misuse[i] == b->misuse[i], "8: misuse %d: cpu %s, gpu %s", i, ei_result_name(a->misuse[i]),
              ei_result_name(b->misuse[i]));
    printf("  8: decode_score (3 threads) within 1e-3 of the cpu, shared scores within 1e-3, misuse codes equal\n");
}
static void s8_out_free(s8_out *o) {
    keep_free(&o->keep); keep_free(&o->sel); keep_free(&o->perq); keep_free(&o->second);
    keep_free(&o->shared_set);
    free(o->scores); free(o->shared); free(o->shared_max); free(o->map2);
}

/* ------------------------------------------------------------ main */
int main(int argc, char **argv) {
    int require_gpu = 0, have_gpu, i;
    ei_config c = ei_config_default();
    ei_context *probe = NULL, *host_ctx;
    uint16_t *q1, *k1, *q3, *k3, *v3, *q4, *k4, *v4;
    s1_out o1[2];
    s2_out o2[2];
    s3_out o3[2];
    s4_out o4[2];
    s6_out o6[2];
    s8_out o8[2];
    s8_data d8;
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--require-gpu")) require_gpu = 1;
        else {
            printf("usage: %s [--require-gpu]\n", argv[0]);
            return 2;
        }
    }
    c.backend = EI_BACKEND_CUDA;
    have_gpu = ei_context_create(&c, &probe) == EI_OK;
    if (have_gpu) {
        printf("test_backends: CPU and GPU (%s)\n", probe->cuda->api->build_info());
        ei_context_destroy(probe);
    } else {
        printf("CUDA backend not available: GPU half skipped (%s)\n", ei_last_error());
        CHECK(!require_gpu, "--require-gpu: no CUDA backend");
    }
    memset(o1, 0, sizeof o1); memset(o2, 0, sizeof o2); memset(o3, 0, sizeof o3);
    memset(o4, 0, sizeof o4); memset(o6, 0, sizeof o6); memset(o8, 0, sizeof o8);
    host_ctx = ctx_make(0, ei_config_default());

    /* the inputs, the same for both backends */
    g_rng = S1_SEED;
    q1 = bf16_normal((size_t)S1_Q * S1_H * S1_D, 1.0f);
    k1 = s1_keys();
    g_rng = 0x1234567u;
    q3 = bf16_normal((size_t)S3_N * S3_H * S3_D, 1.0f);
    k3 = bf16_normal((size_t)S3_N * S3_KV * S3_D, 1.0f);
    v3 = bf16_normal((size_t)S3_N * S3_KV * S3_D, 1.0f);
    q4 = bf16_ints((size_t)S4_N * S4_H * S4_D);
    k4 = bf16_ints((size_t)S4_N * S4_KV * S4_D);
    v4 = bf16_normal((size_t)S4_N * S4_KV * S4_D, 1.0f);
    d8 = s8_make();

    for (i = 0; i < 1 + have_gpu; ++i) {
        printf("%s:\n", i ? "gpu" : "cpu");
        s1_run(i, q1, k1, &o1[i]);
        s1_check_one(i ? "gpu" : "cpu", &o1[i].stage[0], i == 0);
        s1_check_one(i ? "gpu" : "cpu", &o1[i].stage[1], i == 0);
        printf("  1: decode keep with 20 and 45 observed queries (window 32): %s, %s\n", ei_result_name(o1[i].stage[0].r),
               ei_result_name(o1[i].stage[1].r));
        s2_run(i, &o2[i]);
        printf("  2: NaN/Inf in kept observed queries refused, in a dropped one accepted\n");
        s3_run(i, q3, k3, v3, &o3[i]);
        printf("  3: plan too small for the budgets: profile %s, attention %s\n", ei_result_name(o3[i].profile_big),
               ei_result_name(o3[i].attention_big));
        s4_run(i, q4, k4, v4, &o4[i]);
        if (i == 0) s4_check_cpu(&o4[0], q4, k4, v4);
        printf("  4: interleaved views: profile %s, sparse %s, dense %s\n", ei_result_name(o4[i].r_profile),
               ei_result_name(o4[i].r_sparse), ei_result_name(o4[i].r_dense));
        if (i == 0) s5_cpu();
        else s5_gpu();
        printf("  5: ei_plan_free of a device plan without its context: refused, plan intact\n");
        s6_run(i, &o6[i]);
        printf("  6: kv_compact: bad keep indices %s/%s/%s, valid %s\n", ei_result_name(o6[i].r[0]),
               ei_result_name(o6[i].r[1]), ei_result_name(o6[i].r[2]), ei_result_name(o6[i].r[3]));
        s8_run(i, &d8, &o8[i]);
        printf("  8: decode over a row map: keep %s, select %s, per query head %s, second %s, shared %s\n",
               ei_result_name(o8[i].keep.r), ei_result_name(o8[i].sel.r), ei_result_name(o8[i].perq.r),
               ei_result_name(o8[i].second.r), ei_result_name(o8[i].shared_set.r));
        if (i == 0) s8_compare_keep("cpu decode_select vs cpu decode_keep", &o8[0].keep, &o8[0].sel, d8.row_pos, 0, 1);
    }
    if (have_gpu) {
        printf("cpu vs gpu:\n");
        s1_compare(&o1[0], &o1[1]);
        s2_compare(&o2[0], &o2[1]);
        s3_compare(&o3[0], &o3[1]);
        s4_compare(&o4[0], &o4[1]);
        s6_compare(&o6[0], &o6[1]);
        s8_compare(&o8[0], &o8[1], &d8);
    }
    {   /* 7: both halves in one place (plans are compared row by row with tolerances) */
        s7_data d7[3];
        d7[0] = s7_make(EI_BF16, 64, 0x7A11u);
        d7[1] = s7_make(EI_F32, 40, 0x7B22u);
        d7[2] = s7_make(EI_BF16, 128, 0x7C33u);
        printf("7: rankings beyond the paper (sampled mass, top_p, sink/local):\n");
        for (i = 0; i < S7_CASES; ++i) {
            const s7_case *cs = &s7_cases[i];
            const s7_data *D = &d7[cs->data];
            ei_plan pc, pg;
            s7_run(0, cs, D, &pc);
            s7_check_cpu(cs, D, &pc);
            g_s7_simd = EI_SIMD_SCALAR; /* the plain reference path of the CPU: the same plan up to rounding */
            s7_run(0, cs, D, &pg);
            g_s7_simd = EI_SIMD_AUTO;
            s7_compare("cpu scalar vs cpu", cs, D, &pc, &pg);
            ei_plan_free(host_ctx, &pg);
            if (have_gpu) {
                s7_run(1, cs, D, &pg);
                s7_compare("gpu vs cpu", cs, D, &pc, &pg);
                ei_plan_free(host_ctx, &pg);
                if ((D->dt != EI_F32 || cs->precision == EI_RANK_PRECISION_INT8) && cs->ranking == EI_RANK_SAMPLED) {
                    /* the other GPU paths on the same data: mma.sync where wgmma runs, and CUDA cores */
                    setenv("EI_CUDA_SAMPLED_MMA", "1", 1);
                    s7_run(1, cs, D, &pg);
                    unsetenv("EI_CUDA_SAMPLED_MMA");
                    s7_compare("gpu (mma.sync) vs cpu", cs, D, &pc, &pg);
                    ei_plan_free(host_ctx, &pg);
                    setenv("EI_CUDA_SAMPLED_GENERIC", "1", 1);
                    s7_run(1, cs, D, &pg);
                    unsetenv("EI_CUDA_SAMPLED_GENERIC");
                    s7_compare("gpu (cuda cores) vs cpu", cs, D, &pc, &pg);
                    ei_plan_free(host_ctx, &pg);
                }
            }
            ei_plan_free(host_ctx, &pc);
        }
        s7_free_data(&d7[0]);
        s7_free_data(&d7[1]);
        s7_free_data(&d7[2]);
    }
    for (i = 0; i < 2; ++i) {
        keep_out_free(&o1[i].stage[0]);
        keep_out_free(&o1[i].stage[1]);
        free(o2[i].ring);
        if (i <= have_gpu) s4_free(&o4[i], host_ctx);
        free(o6[i].k);
        free(o6[i].v);
        s8_out_free(&o8[i]);
    }
    s8_free_data(&d8);
    free(q1); free(k1); free(q3); free(k3); free(v3); free(q4); free(k4); free(v4);
    ei_context_destroy(host_ctx);
    printf("test_backends: %s\n", failures ? "FAILED" : "passed");
    return check_summary();
}
