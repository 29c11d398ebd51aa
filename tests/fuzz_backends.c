/* tests/fuzz_backends.c - a seeded randomised differential test of the CUDA
   backend against the CPU: every iteration draws a configuration, shapes,
   dtypes, layouts and a protocol, runs it on a CPU context (host memory) and
   on a CUDA context (device memory through ei_device_alloc / ei_device_copy /
   ei_plan_copy), and compares what comes back.

     fuzz_backends [--seed S] [--iters N] [--seconds T] [--first I] [--max-n N] [--require-gpu] [--cpu-twin] [-v]

   Iteration i draws everything from (S, i) alone: `--seed S --first i
   --iters 1` replays it. --seconds stops after T seconds (whichever of N and
   T comes first). Without a GPU (the plugin does not load or finds none) it
   says so and exits 0, or 1 with --require-gpu. --cpu-twin runs the same
   draws with a second CPU context on another SIMD path in place of the GPU
   (the fuzzer's own checks, on any machine). --max-n caps prompts and caches
   (runs under compute-sanitizer). The last line: iterations,
   checks, failures, seed.

   Scenarios (one per iteration):
     prefill  config (segment/block sizes, budgets and factors, threshold,
              ranking reference/sampled with R rows, rank_precision (int8
              for 40% of sampled configs and 10% of reference ones, where
              it changes nothing; from a stream of its own: the other draws
              stay as they were), rank_rows (EI_RANK_ROWS_SPREAD for 30%
              of sampled configs, never another ranking's, from a stream of
              its own too), top_p, sink/local blocks,
              per-segment budgets, last segment dense, attn_scale),
              GQA shapes, head_dim (odd ones for planning), f32/f16/bf16
              views (mixed for planning), layouts (contiguous, padded,
              head-major, odd strides, data one or more elements past an
              aligned address). ei_profile on both: codes equal; entropies
              within 1e-3 (1e-5 absolute), head classes equal but at a
              knife-edge of e_t, each side's budgets the recurrence of its
              own entropies, keep counts equal (or, at a budget or top_p
              knife-edge, each consistent with its own budget), kept sets
              equal up to near-ties (check.h's plan_row_compare). Then
              attention, dense or with the GPU's plan (the CPU runs the same
              plan, copied down), the whole prompt or a chunk at q_offset,
              in parts ith/nth (one workspace for nth) or on 4 threads
              (ei_exec n_threads), outputs of
              any dtype and layout: codes equal, outputs within tolerance,
              nothing written outside the output's elements. Where the GPU
              has no kernel (f32 k/v, k and v of two types, q 16-bit of
              another type than k, head_dim not 64/128/256) it must say
              EI_ERR_DTYPE / EI_ERR_UNSUPPORTED. An f32 q over 16-bit k runs
              rounded to k's type on the GPU: the output tolerance and the
              sampled ranking's near-tie margin grow by q_round_bound.
              EI_RANK_PRECISION_INT8 with the sampled ranking: the plans
              are compared as above on both backends and with --cpu-twin
              (its scores are bit-identical on every path and backend,
              masses within 1e-3; near-ties from the int8 reference
              mass). EI_RANK_ROWS_SPREAD is compared
              as the f32 sampled ranking on both backends (the GPU picks
              the CPU's rows bit for bit); the
              reference's rows: farthest point for a segment that one call
              held whole (ei_profile: every whole segment of the prompt; a
              chunked schedule: a call with every token of the segment),
              the even rows elsewhere.
     decode   config (window, gap, budget, pooling, per kv head, gqa_reduce,
              recompress_every, decode_scale), the prompt's and generated
              queries observed (fewer than the window too), a cache whose
              rows map to positions (identity, or scattered with -1 rows
              holding NaN, older positions evicted; one map or one per kv
              head): ei_decode_keep, ei_decode_score in parts (ith/nth, one
              workspace for nth) + ei_decode_select, the shared keep set of two layers
              (ei_decode_shared_add, ei_decode_select_shared): codes equal,
              scores within 1e-3, keep sets equal up to near-ties
              (check.h's keep_compare), then ei_kv_compact of K and V caches
              (any dtype and layout) with the CPU's keep set: bit-identical.
     table    (every fifth iteration) a case of tests/ops_cases.h's table (the one test_ops runs on every
              path), varied: tokens, layout, dtypes, thread split and data;
              the reference run on the CPU's scalar path, the other on the GPU
              (--cpu-twin: the CPU's default path), compared as test_ops
              compares (ops_compare: check.h's tolerance table); a case the
              GPU has no kernel for must be refused (EI_ERR_DTYPE /
              EI_ERR_UNSUPPORTED).
     misuse   in both scenarios, at random: NaN/Inf in a Q or K row that the
              call reads (EI_ERR_NONFINITE) or does not read (EI_OK), a
              workspace one byte short, a row map with -2 or a repeated
              position, a missing window position, data one byte off its
              element alignment, keep indices out of order: the same code on
              both backends (and the documented one). */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "check.h"
#include "ops_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ random draws */
typedef struct fz_rng { uint64_t s; } fz_rng;
static uint64_t fz_next(fz_rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double fz_unit(fz_rng *r) { return (double)(fz_next(r) >> 11) * (1.0 / 9007199254740992.0); }
static int fz_int(fz_rng *r, int lo, int hi) { return lo + (int)(fz_next(r) % (uint64_t)(hi - lo + 1)); } /* [lo, hi] */
static int fz_chance(fz_rng *r, double p) { return fz_unit(r) < p; }
static float fz_normal(fz_rng *r) {
    double u = fz_unit(r) + 1e-12, v = fz_unit(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
#define FZ_PICK(r, arr) ((arr)[fz_int((r), 0, (int)(sizeof(arr) / sizeof((arr)[0])) - 1)])

/* ------------------------------------------------------------ run state */
static int g_verbose = 0;
static int g_twin = 0;
static int64_t g_max_n = 1 << 30; /* --max-n: tokens / cache rows at most (sanitizer runs) */     /* --cpu-twin: the second backend is the CPU on another SIMD path (no GPU needed) */
#define K_KINDS 14
static long g_counts[K_KINDS];   /* scenarios run, by kind */
enum { K_PREFILL, K_DECODE, K_CFG_REFUSED, K_GPU_UNSUPPORTED, K_NONFINITE, K_MISUSE, K_KNIFE, K_ATTN, K_CHUNK, K_TABLE,
       K_INT8, K_INT8_PLANS, K_SPREAD, K_SPREAD_PLANS };
/* gpu-unsupported: attention calls and table cases the GPU has no kernel
   for, all refused there; int8-ranked: prefill configs of EI_RANK_SAMPLED
   with EI_RANK_PRECISION_INT8, of which int8 plans compared were planned on
   both sides and compared (both backends since ABI 17); spread-rows and
   spread plans compared: the same for EI_RANK_ROWS_SPREAD */
static const char *const g_count_names[K_KINDS] = {"prefill", "decode", "configs refused", "gpu-unsupported",
                                                   "non-finite cases", "misuse cases", "knife-edges", "attention calls",
                                                   "chunked plans", "table cases", "int8-ranked", "int8 plans compared",
                                                   "spread-rows", "spread plans compared"};
static char g_desc[512];   /* the iteration's draw, printed when it fails */
#define DESC(...) do { size_t l_ = strlen(g_desc); snprintf(g_desc + l_, sizeof g_desc - l_, __VA_ARGS__); } while (0)

/* Both contexts of a configuration, or the code both refused it with. */
typedef struct fz_pair { side s[2]; ei_result r; } fz_pair;
static fz_pair pair_make(ei_config c) {
    fz_pair p;
    int i;
    memset(&p, 0, sizeof p);
    for (i = 0; i < 2; ++i) {
        ei_result r;
        c.backend = i && !g_twin ? EI_BACKEND_CUDA : EI_BACKEND_CPU;
        if (i && g_twin) c.simd = c.simd == EI_SIMD_SCALAR ? EI_SIMD_AUTO : EI_SIMD_SCALAR;
        p.s[i].gpu = i && !g_twin;
        r = ei_context_create(&c, &p.s[i].ctx);
        if (i == 0) p.r = r;
        else CHECK(r == p.r, "config: cpu %s, gpu %s (%s)", ei_result_name(p.r), ei_result_name(r), ei_last_error());
    }
    return p;
}
static void pair_free(fz_pair *p) { side_free(&p->s[0]); side_free(&p->s[1]); }


/* ------------------------------------------------------------ views */
/* [n][H][d] values (f32, logical) stored as dtype dt at data = base + off
   elements, strides ts / hs; bytes past the elements hold 0xFF (NaN in
   every dtype): a backend that reads them fails or returns NaN, one that
   writes them shows in the padding check. */
typedef struct fz_view {
    ei_dtype dt;
    int64_t n, ts, hs, off, extent; /* extent: elements from base to the end of the farthest */
    int32_t H, d;
    unsigned char *host;            /* the stored bytes */
    void *mem[2];                   /* each side's copy (base) */
} fz_view;
static size_t view_bytes(const fz_view *v) { return (size_t)v->extent * dtype_size(v->dt); }
/* A layout: contiguous, padded, head-major or odd strides; data 0 or a few
   elements past an aligned address. */
static void view_layout(fz_rng *r, fz_view *v, ei_dtype dt, int64_t n, int32_t H, int32_t d, int misalign) {
    int kind = fz_int(r, 0, 3);
    v->dt = dt; v->n = n; v->H = H; v->d = d;
    v->off = misalign ? fz_int(r, 1, 7) : 0;
    if (kind == 0) { v->hs = d; v->ts = (int64_t)H * d; }
    else if (kind == 1) { v->hs = d + fz_int(r, 0, 9); v->ts = (int64_t)H * v->hs + fz_int(r, 0, 13); }
    else if (kind == 2) { v->ts = d + fz_int(r, 0, 5); v->hs = n * v->ts + fz_int(r, 0, 7); }
    else { v->hs = d + 2 * fz_int(r, 0, 3) + 1; v->ts = (int64_t)H * v->hs + 2 * fz_int(r, 0, 4) + 1; }
    v->extent = v->off + (n - 1) * v->ts + (int64_t)(H - 1) * v->hs + d;
    v->host = (unsigned char *)malloc(view_bytes(v));
    if (!v->host) { printf("out of memory\n"); exit(2); }
    memset(v->host, 0xFF, view_bytes(v));
    v->mem[0] = v->mem[1] = NULL;
}
static int64_t view_at(const fz_view *v, int64_t t, int32_t h, int32_t i) { return v->off + t * v->ts + (int64_t)h * v->hs + i; }
static void view_set(fz_view *v, int64_t t, int32_t h, int32_t i, float x) {
    int64_t e = view_at(v, t, h, i);
    if (v->dt == EI_F32) memcpy(v->host + e * 4, &x, 4);
    else {
        uint16_t b = v->dt == EI_F16 ? ei__f32_to_f16(x) : ei__f32_to_bf16(x);
        memcpy(v->host + e * 2, &b, 2);
    }
}
static double view_get(const fz_view *v, const unsigned char *bytes, int64_t t, int32_t h, int32_t i) {
    return ei__load1(bytes, v->dt, view_at(v, t, h, i));
}
/* Each side's copy of the stored bytes. */
static void view_upload(fz_view *v, const fz_pair *p) {
    int i;
    for (i = 0; i < 2; ++i) {
        if (!v->mem[i]) v->mem[i] = mem_new(&p->s[i], view_bytes(v));
        mem_put(&p->s[i], v->mem[i], v->host, view_bytes(v));
    }
}
static void *view_data(const fz_view *v, int side_i, int64_t first_token) {
    return (char *)v->mem[side_i] + (size_t)(v->off + first_token * v->ts) * dtype_size(v->dt);
}
/* The view of tokens [first, first + n) on side i. */
static ei_tensor view_tensor(const fz_view *v, int side_i, int64_t first, int64_t n) {
    ei_tensor t = ei_tensor_make(view_data(v, side_i, first), v->dt, n, v->H, v->d);
    t.token_stride = v->ts;
    t.head_stride = v->hs;
    return t;
}
static ei_out_tensor view_out(const fz_view *v, int side_i) {
    ei_out_tensor t = ei_out_tensor_make(view_data(v, side_i, 0), v->dt, v->n, v->H, v->d);
    t.token_stride = v->ts;
    t.head_stride = v->hs;
    return t;
}
/* The host view (for references read through check.h's ref_at). */
static ei_tensor view_host(const fz_view *v) {
    ei_tensor t = ei_tensor_make(v->host + (size_t)v->off * dtype_size(v->dt), v->dt, v->n, v->H, v->d);
    t.token_stride = v->ts;
    t.head_stride = v->hs;
    return t;
}
static void view_free(fz_view *v, const fz_pair *p) {
    int i;
    for (i = 0; i < 2; ++i) mem_del(&p->s[i], v->mem[i], view_bytes(v));
    free(v->host);
    memset(v, 0, sizeof *v);
}
/* 1 if every byte of `bytes` outside the view's elements is still 0xFF. */
static int view_padding_intact(const fz_view *v, const unsigned char *bytes) {
    size_t es = dtype_size(v->dt), nb = view_bytes(v), b;
    unsigned char *mark = (unsigned char *)calloc(nb, 1);
    int64_t t;
    int32_t h;
    int ok = 1;
    for (t = 0; t < v->n; ++t)
        for (h = 0; h < v->H; ++h) memset(mark + (size_t)view_at(v, t, h, 0) * es, 1, (size_t)v->d * es);
    for (b = 0; b < nb && ok; ++b) ok = mark[b] || bytes[b] == 0xFF;
    free(mark);
    return ok;
}

/* Q/K with structure that planning can see: per kv head a direction u; a
   query's share of it follows its segment (constant: a rigid-like head),
   a key's its block (block 0 sometimes a sink); Gaussian noise around. */
static void fill_qk(fz_rng *r, fz_view *q, fz_view *k, int32_t seg, int32_t bs) {
    int32_t KV = k->H, G = q->H / k->H, d = q->d, h, i;
    float *u = (float *)malloc(sizeof(float) * (size_t)KV * d), noise = (float)(0.3 + fz_unit(r));
    int64_t t;
    for (h = 0; h < KV; ++h) {
        float len = (float)sqrt((1.0 + 15.0 * fz_unit(r)) / d);
        for (i = 0; i < d; ++i) u[(size_t)h * d + i] = len * fz_normal(r);
    }
    for (t = 0; t < q->n; ++t)
        for (h = 0; h < q->H; ++h) {
            fz_rng sr;
            float f;
            sr.s = (uint64_t)(h / G) * 7919u + (uint64_t)(t / seg) * 104729u + 17u;
            f = (h / G) % 2 ? 2.0f : (float)(3.0 * fz_unit(&sr));
            for (i = 0; i < d; ++i) view_set(q, t, h, i, noise * fz_normal(r) + f * u[(size_t)(h / G) * d + i]);
        }
    for (t = 0; t < k->n; ++t)
        for (h = 0; h < KV; ++h) {
            fz_rng sr;
            float f;
            sr.s = (uint64_t)h * 31u + (uint64_t)(t / bs) * 6151u + 5u;
            f = (float)(2.0 * fz_unit(&sr)) + (t < bs && h % 2 == 0 ? 4.0f : 0.0f);
            for (i = 0; i < d; ++i) view_set(k, t, h, i, noise * fz_normal(r) + f * u[(size_t)h * d + i]);
        }
    free(u);
}
static void fill_normal(fz_rng *r, fz_view *v, float scale) {
    int64_t t;
    int32_t h, i;
    for (t = 0; t < v->n; ++t)
        for (h = 0; h < v->H; ++h)
            for (i = 0; i < v->d; ++i) view_set(v, t, h, i, scale * fz_normal(r));
}
static ei_dtype draw_dtype(fz_rng *r) { return (ei_dtype)fz_int(r, 0, 2); }
static ei_simd draw_simd(fz_rng *r) {
    int p;
    for (p = fz_int(r, 0, TEST_SIMD_END - 1); p > 0; --p)
        if (ei_cpu_supports((ei_simd)p)) return (ei_simd)p;
    return EI_SIMD_AUTO;
}

/* A buffer of n bytes on each side (host: guarded), and the workspace a
   call wants on side i, sometimes one byte short (misuse). */
typedef struct fz_buf { void *p[2]; size_t n[2]; } fz_buf;
static void buf_new(fz_buf *b, const fz_pair *p, size_t n0, size_t n1) {
    b->n[0] = n0; b->n[1] = n1;
    b->p[0] = mem_new(&p->s[0], n0);
    b->p[1] = mem_new(&p->s[1], n1);
}
static void buf_free(fz_buf *b, const fz_pair *p) { mem_del(&p->s[0], b->p[0], b->n[0]); mem_del(&p->s[1], b->p[1], b->n[1]); }

/* ============================================================ prefill */
typedef struct fz_prefill {
    ei_config c;
    fz_pair P;
    fz_view q, k, v;
    int32_t H, KV, d;
    int64_t n;
    ei_plan plan[2];  /* host plans: the CPU's, the GPU's copied down */
    ei_plan dplan;    /* the GPU's device plan (--cpu-twin: plan[1] itself) */
    ei_context *host; /* lays out host plans */
    int chunked;      /* planned by a schedule of ei_profile_chunk calls (EI_PLAN_CHUNKED plans) */
    unsigned char *given; /* chunked: given[t] = 1 where the plans hold token t's query (the sampled rows they sum) */
    unsigned char *whole; /* chunked: whole[s] = 1 where one call of the schedule held segment s's every token
                             (EI_RANK_ROWS_SPREAD picks its rows by farthest point there, else the even rows) */
} fz_prefill;

static ei_config draw_prefill_config(fz_rng *r) {
    static const int segs[] = {16, 32, 48, 64, 64, 96, 128, 256};
    ei_config c = ei_config_default();
    int bsv[32], nb = 0, b;
    c.segment_size = FZ_PICK(r, segs);
    for (b = 1; b <= 32; ++b) /* the block sizes that divide the segment (1 rarely) */
        if (c.segment_size % b == 0 && (b > 1 || fz_chance(r, 0.2))) bsv[nb++] = b;
    c.block_size = bsv[fz_int(r, 0, nb - 1)];
    c.threshold_len = fz_chance(r, 0.3) ? 0 : (int64_t)c.segment_size * fz_int(r, 1, 4) + (fz_chance(r, 0.2) ? fz_int(r, 1, 9) : 0);
    c.base_budget = c.block_size * fz_int(r, 0, 3 * c.segment_size / c.block_size);
    c.rigid_entropy = fz_chance(r, 0.5) ? 1e-5 : fz_unit(r) * 2.0;
    c.delta_t = fz_unit(r);
    c.alpha = fz_unit(r);
    c.budget_min_factor = fz_chance(r, 0.7) ? 1.0 : fz_unit(r);
    c.budget_max_factor = c.budget_min_factor + (fz_chance(r, 0.7) ? 2.0 : 4.0 * fz_unit(r));
    c.last_segment_dense = fz_int(r, 0, 1);
    c.per_segment_budget = fz_chance(r, 0.3);
    c.ranking = fz_chance(r, 0.5) ? EI_RANK_SAMPLED : EI_RANK_REFERENCE;
    c.rank_samples = fz_chance(r, 0.5) ? fz_int(r, 1, 64) : fz_int(r, 65, 600);
    c.top_p = fz_chance(r, 0.5) ? 0.0 : 0.5 + 0.5 * fz_unit(r);
    c.sink_blocks = fz_chance(r, 0.5) ? 0 : fz_int(r, 1, 3);
    c.local_blocks = fz_chance(r, 0.5) ? 0 : fz_int(r, 1, 9);
    c.attn_scale = fz_chance(r, 0.7) ? 0.0f : (float)(0.02 + 0.2 * fz_unit(r));
    c.simd = draw_simd(r);
    { /* the sampled ranking's score precision: int8 for 40% of EI_RANK_SAMPLED configs (10% of reference ones,
         where it must change nothing), drawn from a stream of its own seeded by r's state here, r not
         advanced: every other draw of the iteration stays as before */
        fz_rng pr;
        pr.s = r->s ^ 0x5851F42D4C957F2Dull;
        c.rank_precision = fz_chance(&pr, c.ranking == EI_RANK_SAMPLED ? 0.4 : 0.1) ? EI_RANK_PRECISION_INT8
                                                                                     : EI_RANK_PRECISION_F32;
    }
    { /* the sampled ranking's rows: spread for 30% of EI_RANK_SAMPLED configs (10% of the others, which
         ignore it: it must change nothing there), from a stream of its own as above (another constant), r
         not advanced */
        fz_rng sr;
        sr.s = r->s ^ 0x2545F4914F6CDD1Dull;
        c.rank_rows = fz_chance(&sr, c.ranking == EI_RANK_SAMPLED ? 0.3 : 0.1) ? EI_RANK_ROWS_SPREAD : EI_RANK_ROWS_EVEN;
    }
    return c;
}
/* EI_RANK_SAMPLED in int8 (both backends: the same integer dots). */
static int config_int8_ranked(const ei_config *c) {
    return c->ranking == EI_RANK_SAMPLED && c->rank_precision == EI_RANK_PRECISION_INT8;
}
/* EI_RANK_SAMPLED with EI_RANK_ROWS_SPREAD (both backends: the same rows bit for bit). */
static int config_spread_rows(const ei_config *c) {
    return c->ranking == EI_RANK_SAMPLED && c->rank_rows == EI_RANK_ROWS_SPREAD;
}

/* The ranking scores of the visible blocks of row (kvh, s) of the CPU plan
   a: the sampled mass in double (returns 1; a chunked plan's: the rows of
   the queries it holds, spread rows where one call held the segment whole),
   or, where the segment is not sampled or holds no sampled row, the
   softmaxed reference scores (0). */
static int row_scores(const fz_prefill *F, const ei_plan *a, int kvh, int s, double *sc) {
    const ei_config *c = &F->c;
    int64_t nvis = (int64_t)s * (c->segment_size / c->block_size), b;
    if (nvis > a->n_blocks) nvis = a->n_blocks;
    if (c->ranking == EI_RANK_SAMPLED && s > 0 && (int64_t)s * c->segment_size >= c->threshold_len &&
        ei__sample_token(c, s, 0) < F->n) {
        ei_tensor tq = view_host(&F->q), tk = view_host(&F->k);
        if (F->chunked ? ref_sampled_mass_rows(c, &tq, &tk, kvh, s, F->n, F->given,
                                               config_spread_rows(c) && F->whole[s], sc) > 0
                       : ref_sampled_mass_given(c, &tq, &tk, kvh, s, F->n, NULL, sc) > 0)
            return 1;
    }
    for (b = 0; b < nvis; ++b) sc[b] = a->scores[EI_PLAN_ROW(a, kvh, s) * (size_t)a->blk_capacity + (size_t)b];
    return 0;
}
/* Whether an entropy row lies within tol of e_t somewhere (segments 1..):
   the rigid test may go either way. */
static int near_rigid_edge(const ei_config *c, const float *H, int nseg, double tol) {
    int s;
    for (s = 1; s < nseg; ++s)
        if (fabs((double)H[s] - c->rigid_entropy) <= tol * (c->rigid_entropy + 1e-6)) return 1;
    return 0;
}

/* What rounding an f32 q to k's 16-bit type (the GPU's attention and its
   tensor-core sampled ranking do that; the CPU keeps f32) can move a logit:
   u * scale * sum|q_i k_i| <= u * scale * max|q| * max|k| (u: 2^-8 bf16,
   2^-11 f16); a softmax weight or a sampled mass then moves by at most twice
   that, relative. 0 where q is not f32 over 16-bit k, or both sides are CPUs. */
static double q_round_bound(const fz_prefill *F) {
    double u, qmax = 0, kmax = 0, scale;
    int64_t t;
    int32_t h, i;
    if (g_twin || F->q.dt != EI_F32 || F->k.dt == EI_F32) return 0;
    u = F->k.dt == EI_BF16 ? 1.0 / 256 : 1.0 / 2048;
    for (t = 0; t < F->n; ++t)
        for (h = 0; h < F->H; ++h) {
            double x2 = 0;
            for (i = 0; i < F->d; ++i) x2 += view_get(&F->q, F->q.host, t, h, i) * view_get(&F->q, F->q.host, t, h, i);
            qmax = fmax(qmax, sqrt(x2));
        }
    for (t = 0; t < F->n; ++t)
        for (h = 0; h < F->KV; ++h) {
            double x2 = 0;
            for (i = 0; i < F->d; ++i) x2 += view_get(&F->k, F->k.host, t, h, i) * view_get(&F->k, F->k.host, t, h, i);
            kmax = fmax(kmax, sqrt(x2));
        }
    scale = F->c.attn_scale > 0 ? F->c.attn_scale : 1.0 / sqrt((double)F->d);
    return 2 * u * scale * qmax * kmax;
}

/* The GPU's plan b against the CPU's a. Chunked plans: budgets follow the
   chunked recurrence (rigid so far) and rows a schedule skipped hold none,
   so each side's budgets are compared with the other's, not re-derived. */
static void plans_check(fz_prefill *F) {
    const ei_config *c = &F->c;
    const ei_plan *a = &F->plan[0], *b = &F->plan[1];
    int kvh, s, shown = 0, knife = 0, bad = 0, ent = 0, bud = 0, own = 0;
    double tie, qround = c->ranking == EI_RANK_SAMPLED ? q_round_bound(F) : 0; /* the GPU's sampled masses from a rounded q */
    int64_t bps = c->segment_size / c->block_size;
    double *sc = (double *)malloc(sizeof(double) * (size_t)(a->n_blocks + 1));
    unsigned char *seg_free = (unsigned char *)calloc((size_t)a->n_segments + 1, 1); /* counts may differ */
    CHECK(a->n_tokens == b->n_tokens && a->n_segments == b->n_segments && a->n_blocks == b->n_blocks &&
              a->final == b->final && a->max_keep == b->max_keep,
          "plan fields differ (segments %d/%d, blocks %d/%d)", a->n_segments, b->n_segments, a->n_blocks, b->n_blocks);
    if (a->n_segments != b->n_segments || a->max_keep != b->max_keep) { free(sc); free(seg_free); return; }
    /* entropies; each side's budgets and own counts from its own entropies */
    for (kvh = 0; kvh < a->n_kv_heads; ++kvh) {
        const float *Ha = a->entropy + EI_PLAN_ROW(a, kvh, 0), *Hb = b->entropy + EI_PLAN_ROW(b, kvh, 0);
        int edge = a->head_class[kvh] != b->head_class[kvh];
        if (edge) {
            CHECK(near_rigid_edge(c, Ha, a->n_segments, 1e-3) || near_rigid_edge(c, Hb, b->n_segments, 1e-3),
                  "kv head %d: class cpu %d gpu %d, entropies not near e_t", kvh, a->head_class[kvh], b->head_class[kvh]);
            knife++;
        }
        for (s = 0; s < a->n_segments; ++s) {
            int side_i;
            if (!close_to(Hb[s], Ha[s], test_tols[TOL_ENTROPY].abs, test_tols[TOL_ENTROPY].rel) && ent++ < 3)
                printf("  kv %d seg %d: entropy cpu %.9g gpu %.9g\n", kvh, s, (double)Ha[s], (double)Hb[s]);
            for (side_i = 0; side_i < 2; ++side_i) {
                const ei_plan *p = side_i ? b : a;
                size_t row = EI_PLAN_ROW(p, kvh, s);
                double B = ref_budget(c, p->entropy + EI_PLAN_ROW(p, kvh, 0), s, p->head_class[kvh] == EI_HEAD_RIGID);
                if (F->chunked) {
                    const ei_plan *o = side_i ? a : b;
                    if (!close_to(p->budget[row], o->budget[EI_PLAN_ROW(o, kvh, s)], test_tols[TOL_BUDGET].abs,
                                  test_tols[TOL_BUDGET].rel) && bud++ < 3)
                        printf("  kv %d seg %d: chunked budget cpu %.6g gpu %.6g\n", kvh, s,
                               (double)a->budget[EI_PLAN_ROW(a, kvh, s)], (double)b->budget[EI_PLAN_ROW(b, kvh, s)]);
                    continue;
                }
                int64_t nvis = EI__MIN((int64_t)s * bps, (int64_t)p->n_blocks), ns, l0;
                int64_t nf = ei__forced_blocks(c, nvis, &ns, &l0), cap = ei__cap_blocks(c, s, p->n_tokens, p->n_blocks);
                if (!close_to(p->budget[row], B, test_tols[TOL_BUDGET].abs, test_tols[TOL_BUDGET].rel) && bud++ < 3)
                    printf("  %s kv %d seg %d: budget %.6g, its entropies give %.6g\n", side_i ? "gpu" : "cpu", kvh, s,
                           (double)p->budget[row], B);
                if (c->top_p == 0.0 && s > 0 && p->keep_blocks[row] != ei__keep_count(c, s, B, -1, nf, cap, p->max_keep) &&
                    !ref_budget_on_edge(c, B, 1e-3) && own++ < 3)
                    printf("  %s kv %d seg %d: own count %d, its budget %.6g gives %d\n", side_i ? "gpu" : "cpu", kvh, s,
                           p->keep_blocks[row], B, (int)ei__keep_count(c, s, B, -1, nf, cap, p->max_keep));
            }
            /* budgets apart (a rigid knife-edge, entropies a rounding apart): counts may differ */
            if (c->top_p == 0.0 && a->keep_blocks[EI_PLAN_ROW(a, kvh, s)] != b->keep_blocks[EI_PLAN_ROW(b, kvh, s)] &&
                a->budget[EI_PLAN_ROW(a, kvh, s)] != b->budget[EI_PLAN_ROW(b, kvh, s)]) {
                seg_free[s] = 1;
                knife++;
            }
        }
    }
    CHECK(ent == 0 && bud == 0 && own == 0, "%d entropies differ, %d budgets and %d own counts off their recurrence", ent,
          bud, own);
    /* rows: identical, else within near-ties (scores computed only then) */
    for (kvh = 0; kvh < a->n_kv_heads; ++kvh)
        for (s = 1; s < a->n_segments; ++s) {
            size_t ra = EI_PLAN_ROW(a, kvh, s), rb = EI_PLAN_ROW(b, kvh, s);
            if (a->keep_count[ra] == b->keep_count[rb] && a->keep_blocks[ra] == b->keep_blocks[rb] &&
                !memcmp(EI_PLAN_BLOCKS(a, kvh, s), EI_PLAN_BLOCKS(b, kvh, s), sizeof(int32_t) * (size_t)a->max_keep))
                continue;
            if (seg_free[s] && (a->keep_count[ra] != b->keep_count[rb] || a->keep_blocks[ra] != b->keep_blocks[rb]))
                continue; /* the budgets drifted apart (checked above): these counts may differ */
            /* the sampled mass agrees across paths within 1e-3 (ACCURACY ACROSS PATHS) */
            tie = row_scores(F, a, kvh, s, sc) ? test_tols[TOL_RANK_SAMPLED].tie + qround : test_tols[TOL_RANK_REFERENCE].tie;
            bad += plan_row_compare("plan row", c, a, b, kvh, s, sc, tie, &knife, &shown);
        }
    CHECK(bad == 0, "%d plan rows differ beyond near-ties", bad);
    g_counts[K_KNIFE] += knife;
    free(sc);
    free(seg_free);
}

/* The K rows the attention call reads for kv head kvh (CPU semantics:
   every Q row of the call; keys 0..t of dense segments' queries t; kept
   blocks and own keys up to t of sparse ones): read[key] = 1. */
static void keys_read(const fz_prefill *F, const ei_plan *plan, int32_t kvh, int64_t q0, int64_t q1, unsigned char *read) {
    const ei_config *c = &F->c;
    int64_t s, j, end;
    memset(read, 0, (size_t)F->n);
    for (s = q0 / c->segment_size; s * c->segment_size < q1; ++s) {
        end = EI__MIN((s + 1) * c->segment_size, q1);
        if (plan && ref_segment_sparse(c, plan, s)) {
            const int32_t *idx = EI_PLAN_BLOCKS(plan, kvh, s);
            int32_t kc = plan->keep_count[EI_PLAN_ROW(plan, kvh, s)], i, e;
            for (i = 0; i < kc && i < plan->max_keep; ++i)
                for (e = 0; e < c->block_size; ++e) read[(int64_t)idx[i] * c->block_size + e] = 1;
            for (j = s * c->segment_size; j < end; ++j) read[j] = 1;
        } else
            for (j = 0; j < end; ++j) read[j] = 1;
    }
}

/* The plan the second backend planned into and runs. */
static ei_plan *plan_of_side1(fz_prefill *F) { return g_twin ? &F->plan[1] : &F->dplan; }

/* Whether the GPU has an attention kernel for these views. */
static int gpu_attention_supported(const fz_prefill *F) {
    return g_twin || (F->k.dt == F->v.dt && F->k.dt != EI_F32 && (F->q.dt == F->k.dt || F->q.dt == EI_F32) &&
                      (F->d == 64 || F->d == 128 || F->d == 256));
}

/* One attention call of the scenario on both sides. */
static void attention_case(fz_rng *r, fz_prefill *F) {
    int use_plan = F->plan[1].n_tokens > 0 && fz_chance(r, 0.7), mode = fz_int(r, 0, 2), nth = 1, i, side_i;
    int64_t q0 = 0, m = F->n;
    fz_view o;
    fz_buf ws;
    size_t wsb[2] = {0, 0};
    ei_result res[2];
    int poison = fz_chance(r, 0.2), expect_bad = -1; /* -1: no poison; 0/1: the code expected */
    int64_t pt = 0;
    int32_t ph = 0, pi = 0;
    int pk = 0;
    float saved_bits = 0;
    fz_view *pv = NULL;
    if (fz_chance(r, 0.3) && F->n > 1) { /* a chunk: tokens [q0, q0 + m) */
        q0 = fz_int(r, 0, (int)F->n - 1);
        m = fz_int(r, 1, (int)(F->n - q0));
    }
    view_layout(r, &o, draw_dtype(r), m, F->H, F->d, fz_chance(r, 0.2));
    view_upload(&o, &F->P);
    if (mode == 1) nth = fz_int(r, 2, 5);
    DESC(" | attention %s q[%lld..%lld) out %s ts %lld hs %lld off %lld %s", use_plan ? "plan" : "dense", (long long)q0,
         (long long)(q0 + m), dtype_name(o.dt), (long long)o.ts, (long long)o.hs, (long long)o.off,
         mode == 2 ? "4 threads" : nth > 1 ? "ith/nth" : "");
    if (poison) { /* NaN/Inf in one element of Q (of the call) or K */
        const ei_plan *pl = use_plan ? &F->plan[1] : NULL;
        unsigned char *read = (unsigned char *)malloc((size_t)F->n);
        pk = fz_chance(r, 0.6);
        pv = pk ? &F->k : &F->q;
        pt = pk ? fz_int(r, 0, (int)F->n - 1) : q0 + fz_int(r, 0, (int)m - 1);
        ph = fz_int(r, 0, pv->H - 1);
        pi = fz_int(r, 0, pv->d - 1);
        if (pk) keys_read(F, pl, ph, q0, q0 + m, read);
        expect_bad = !pk || read[pt];
        free(read);
        saved_bits = (float)view_get(pv, pv->host, pt, ph, pi);
        view_set(pv, pt, ph, pi, fz_chance(r, 0.5) ? NAN : (fz_chance(r, 0.5) ? INFINITY : -INFINITY));
        view_upload(pv, &F->P);
        DESC(" | poison %s[%lld][%d][%d] %s", pk ? "k" : "q", (long long)pt, ph, pi, expect_bad ? "read" : "unread");
    }
    for (side_i = 0; side_i < 2; ++side_i) /* one workspace for the 4 threads or the nth parts */
        wsb[side_i] = layer_sizes(F->P.s[side_i].ctx, F->n, F->H, F->KV, F->d, 0, mode == 2 ? 4 : nth).prefill;
    buf_new(&ws, &F->P, wsb[0], wsb[1]);
    for (side_i = 0; side_i < 2; ++side_i) {
        const side *s = &F->P.s[side_i];
        ei_tensor tq = view_tensor(&F->q, side_i, q0, m), tk = view_tensor(&F->k, side_i, 0, F->n), tv = view_tensor(&F->v, side_i, 0, F->n);
        ei_out_tensor to = view_out(&o, side_i);
        const ei_plan *pl = !use_plan ? NULL : side_i ? plan_of_side1(F) : &F->plan[1];
        if (mode == 2) {
            ei_exec x = ex(4, ws.p[side_i], ws.n[side_i]);
            res[side_i] = ei_attention_prefill(s->ctx, &x, &tq, &tk, &tv, pl, &to, q0);
        } else {
            res[side_i] = EI_OK;
            for (i = 0; i < nth; ++i) { /* the parts in turn; the first failure is the call's */
                ei_exec x = ex_part(i, nth, ws.p[side_i], ws.n[side_i]);
                ei_result ri = ei_attention_prefill(s->ctx, &x, &tq, &tk, &tv, pl, &to, q0);
                if (res[side_i] == EI_OK) res[side_i] = ri;
            }
        }
        g_counts[K_ATTN]++;
    }
    if (!gpu_attention_supported(F)) {
        CHECK(res[0] == (expect_bad == 1 ? EI_ERR_NONFINITE : EI_OK), "attention (cpu): %s", ei_result_name(res[0]));
        CHECK(res[1] == EI_ERR_DTYPE || res[1] == EI_ERR_UNSUPPORTED, "attention the GPU has no kernel for: %s",
              ei_result_name(res[1]));
        g_counts[K_GPU_UNSUPPORTED]++;
    } else {
        CHECK(res[0] == res[1], "attention: cpu %s, gpu %s (%s)", ei_result_name(res[0]), ei_result_name(res[1]),
              ei_last_error());
        if (expect_bad >= 0) {
            CHECK(res[0] == (expect_bad ? EI_ERR_NONFINITE : EI_OK) && res[1] == res[0],
                  "attention with NaN/Inf in a %s row it %s: cpu %s, gpu %s", pk ? "k" : "q", expect_bad ? "reads" : "does not read",
                  ei_result_name(res[0]), ei_result_name(res[1]));
            g_counts[K_NONFINITE]++;
        }
        if (res[0] == EI_OK && res[1] == EI_OK) { /* the outputs */
            unsigned char *b0 = (unsigned char *)mem_down(&F->P.s[0], o.mem[0], view_bytes(&o));
            unsigned char *b1 = (unsigned char *)mem_down(&F->P.s[1], o.mem[1], view_bytes(&o));
            /* an f32 q over 16-bit k is rounded to k's type on the GPU: its logit error on top */
            double vmax = 0, tol = test_tols[o.dt == EI_BF16 ? TOL_ATTN_GPU_BF16OUT : TOL_ATTN_GPU].rel_l2 + q_round_bound(F);
            l2_acc err = l2_zero();
            int64_t t;
            int32_t h, e;
            for (t = 0; t < F->n; ++t)
                for (h = 0; h < F->KV; ++h)
                    for (e = 0; e < F->d; ++e) vmax = fmax(vmax, fabs(view_get(&F->v, F->v.host, t, h, e)));
            for (t = 0; t < m; ++t)
                for (h = 0; h < F->H; ++h)
                    for (e = 0; e < F->d; ++e) l2_add(&err, view_get(&o, b1, t, h, e), view_get(&o, b0, t, h, e));
            check_l2("attention gpu vs cpu", &err, tol, 5 * tol * (vmax > 0 ? vmax : 1));
            CHECK(view_padding_intact(&o, b0) && view_padding_intact(&o, b1), "attention wrote outside the output's elements "
                  "(cpu %d, gpu %d)", view_padding_intact(&o, b0), view_padding_intact(&o, b1));
            if (g_verbose) printf("    attention: rel L2 %.2e max abs %.2e\n", l2_rel(&err), err.mx);
            free(b0);
            free(b1);
        }
    }
    if (pv) { view_set(pv, pt, ph, pi, saved_bits); view_upload(pv, &F->P); }
    buf_free(&ws, &F->P);
    view_free(&o, &F->P);
}

/* Misuse of attention: data one byte off its alignment, or a plan of the
   other side; both must return the same code. */
static void attention_misuse(fz_rng *r, fz_prefill *F) {
    int which = g_twin || F->plan[1].n_tokens == 0 ? 0 : fz_int(r, 0, 1), side_i;
    ei_result res[2];
    fz_view o;
    fz_buf ws;
    size_t wsb[2];
    view_layout(r, &o, EI_F32, F->n, F->H, F->d, 0);
    view_upload(&o, &F->P);
    for (side_i = 0; side_i < 2; ++side_i) wsb[side_i] = layer_sizes(F->P.s[side_i].ctx, F->n, F->H, F->KV, F->d, 0, 1).prefill;
    buf_new(&ws, &F->P, wsb[0], wsb[1]);
    for (side_i = 0; side_i < 2; ++side_i) {
        const side *s = &F->P.s[side_i];
        ei_tensor tq = view_tensor(&F->q, side_i, 0, F->n), tk = view_tensor(&F->k, side_i, 0, F->n), tv = view_tensor(&F->v, side_i, 0, F->n);
        ei_out_tensor to = view_out(&o, side_i);
        const ei_plan *pl = F->plan[1].n_tokens > 0 ? (side_i ? plan_of_side1(F) : &F->plan[1]) : NULL;
        ei_exec x;
        if (which == 0) tk.data = (const char *)tk.data + 1; /* odd byte address */
        else if (pl) pl = side_i ? &F->plan[1] : &F->dplan; /* a plan of the other kind of memory */
        x = ex(1, ws.p[side_i], ws.n[side_i]);
        res[side_i] = ei_attention_prefill(s->ctx, &x, &tq, &tk, &tv, pl, &to, 0);
    }
    CHECK(res[0] == res[1], "attention misuse %d: cpu %s, gpu %s", which, ei_result_name(res[0]), ei_result_name(res[1]));
    CHECK(res[0] == (which ? EI_ERR_STATE : EI_ERR_ALIGN), "attention misuse %d: %s", which, ei_result_name(res[0]));
    g_counts[K_MISUSE]++;
    buf_free(&ws, &F->P);
    view_free(&o, &F->P);
}

/* Chunked planning on both sides: random chunks (any start and count),
   some final, roll-backs and skipped positions now and then, ending final
   at n (a final call without queries when the last chunk was not): the codes
   of every call equal; the first data error (NaN) ends the schedule (the
   plans are then unspecified). F->given follows the queries the plans hold
   (a roll-back drops the segment it cuts from its start on and every later
   one; skipped positions hold none), F->whole the segments a call of the
   schedule held whole (the call's tokens [q_pos, q_pos + m) cover [s S,
   (s + 1) S)), dropped with them. Returns the last code. */
static void chunk_given(fz_prefill *F, int64_t q_pos, int64_t m) {
    int64_t t, s, seg = F->c.segment_size;
    if (q_pos < F->plan[0].n_tokens) {
        for (t = q_pos / seg * seg; t < F->n; ++t) F->given[t] = 0;
        for (s = q_pos / seg; s * seg < F->n; ++s) F->whole[s] = 0;
    }
    for (t = q_pos; t < q_pos + m; ++t) F->given[t] = 1;
    for (s = (q_pos + seg - 1) / seg; (s + 1) * seg <= q_pos + m; ++s) F->whole[s] = 1;
}
static ei_result chunk_schedule_run(fz_rng *r, fz_prefill *F, const fz_buf *ws, int poison) {
    int64_t pos = 0, seg = F->c.segment_size;
    int calls = 0, side_i;
    ei_result res[2] = {EI_OK, EI_OK};
    g_counts[K_CHUNK]++;
    DESC(" | chunked:");
    while (calls < 40) {
        int64_t q_pos = pos, m;
        int is_final;
        if (pos > 0 && fz_chance(r, 0.12)) q_pos = fz_int(r, 0, (int)pos);                        /* roll back */
        else if (!poison && pos < F->n - 1 && fz_chance(r, 0.1)) /* skip (with NaN input every query is given) */
            q_pos = pos + fz_int(r, 1, (int)EI__MIN(F->n - 1 - pos, 2 * seg));
        if (q_pos >= F->n) break;
        m = fz_chance(r, 0.3) ? EI__MIN(seg - q_pos % seg, F->n - q_pos) : fz_int(r, 1, (int)EI__MIN(F->n - q_pos, 3 * seg));
        is_final = q_pos + m == F->n ? fz_chance(r, 0.85) : fz_chance(r, 0.08);
        DESC(" %lld+%lld%s", (long long)q_pos, (long long)m, is_final ? "f" : "");
        chunk_given(F, q_pos, m);
        for (side_i = 0; side_i < 2; ++side_i) {
            ei_tensor tq = view_tensor(&F->q, side_i, q_pos, m), tk = view_tensor(&F->k, side_i, 0, F->n);
            ei_exec x = ex(1, ws->p[side_i], ws->n[side_i]);
            res[side_i] = ei_profile_chunk(F->P.s[side_i].ctx, &x, &tq, &tk, side_i ? plan_of_side1(F) : &F->plan[0],
                                           q_pos, is_final);
        }
        calls++;
        CHECK(res[0] == res[1], "profile_chunk at %lld (+%lld, final %d): cpu %s, gpu %s (%s)", (long long)q_pos,
              (long long)m, is_final, ei_result_name(res[0]), ei_result_name(res[1]), ei_last_error());
        if (res[0] != EI_OK || res[1] != EI_OK) {
            if (!poison) CHECK(0, "profile_chunk: %s (%s)", ei_result_name(res[0]), ei_last_error());
            return res[0] != EI_OK ? res[0] : res[1];
        }
        pos = q_pos + m;
        if (pos == F->n && (is_final || fz_chance(r, 0.5))) break;
    }
    if (!F->plan[0].final || F->plan[0].n_tokens != F->n) { /* end the prompt at n: the rest, or no queries */
        int with_q = pos != F->n || fz_chance(r, 0.5);
        int64_t q_pos = with_q && pos != F->n ? pos : with_q ? F->n - 1 : F->n;
        DESC(" end %lld%s", (long long)q_pos, with_q ? "+f" : ":final");
        if (with_q) chunk_given(F, q_pos, F->n - q_pos);
        for (side_i = 0; side_i < 2; ++side_i) {
            ei_tensor tq = view_tensor(&F->q, side_i, q_pos, F->n - q_pos), tk = view_tensor(&F->k, side_i, 0, F->n);
            ei_exec x = ex(1, ws->p[side_i], ws->n[side_i]);
            res[side_i] = ei_profile_chunk(F->P.s[side_i].ctx, &x, with_q ? &tq : NULL, &tk,
                                           side_i ? plan_of_side1(F) : &F->plan[0], q_pos, 1);
        }
        CHECK(res[0] == res[1], "final profile_chunk: cpu %s, gpu %s (%s)", ei_result_name(res[0]),
              ei_result_name(res[1]), ei_last_error());
        if (!poison) CHECK(res[0] == EI_OK, "final profile_chunk: %s (%s)", ei_result_name(res[0]), ei_last_error());
        if (res[0] != EI_OK) return res[0];
        if (res[1] != EI_OK) return res[1];
    }
    if (poison) /* the schedule read every query and key by its end */
        CHECK(0, "chunked planning of NaN input returned EI_OK");
    return EI_OK;
}

static void prefill_run(fz_rng *r) {
    fz_prefill F;
    static const int dims_gpu[] = {64, 64, 128, 128, 128, 256};
    static const int dims_any[] = {1, 7, 8, 16, 24, 33, 40, 63, 96, 100, 130};
    static const int groups[] = {1, 1, 2, 3, 4, 5, 8};
    int attn = fz_chance(r, 0.75), side_i, poison;
    size_t wsb[2];
    fz_buf ws;
    ei_result res[2];
    ei_dtype dt;
    double cost;
    memset(&F, 0, sizeof F);
    F.c = draw_prefill_config(r);
    F.P = pair_make(F.c);
    DESC("prefill seg %d bs %d thr %lld base %d rank %s%s%s R %d top_p %.3f sink %d local %d pseg %d lsd %d factors %.2f..%.2f e_t %.3g",
         F.c.segment_size, F.c.block_size, (long long)F.c.threshold_len, F.c.base_budget,
         F.c.ranking == EI_RANK_SAMPLED ? "sampled" : "ref",
         F.c.rank_precision == EI_RANK_PRECISION_INT8 ? "/int8" : "", F.c.rank_rows == EI_RANK_ROWS_SPREAD ? "/spread" : "",
         F.c.rank_samples, F.c.top_p, F.c.sink_blocks,
         F.c.local_blocks, F.c.per_segment_budget, F.c.last_segment_dense, F.c.budget_min_factor, F.c.budget_max_factor,
         F.c.rigid_entropy);
    if (F.P.r != EI_OK) { g_counts[K_CFG_REFUSED]++; if (F.P.s[0].ctx) pair_free(&F.P); return; }
    g_counts[K_PREFILL]++;
    if (config_int8_ranked(&F.c)) g_counts[K_INT8]++;
    if (config_spread_rows(&F.c)) g_counts[K_SPREAD]++;
    F.KV = fz_int(r, 1, 4);
    F.H = F.KV * FZ_PICK(r, groups);
    F.d = attn ? FZ_PICK(r, dims_gpu) : FZ_PICK(r, dims_any);
    F.n = fz_chance(r, 0.5) ? fz_int(r, 1, 4 * F.c.segment_size) : fz_int(r, 1, 2600);
    /* the CPU's attention runs on one thread: keep a call under ~6 GFLOP */
    cost = 2.0 * (double)F.n * (double)F.n * F.H * F.d;
    if (attn && cost > 6e9) F.n = (int64_t)sqrt(6e9 / (2.0 * F.H * F.d));
    if (F.n > g_max_n) F.n = g_max_n;
    if (F.n < 1) F.n = 1;
    dt = attn && fz_chance(r, 0.85) ? (fz_chance(r, 0.5) ? EI_BF16 : EI_F16) : draw_dtype(r);
    view_layout(r, &F.q, dt, F.n, F.H, F.d, fz_chance(r, 0.15));
    view_layout(r, &F.k, fz_chance(r, 0.9) ? dt : draw_dtype(r), F.n, F.KV, F.d, fz_chance(r, 0.15));
    view_layout(r, &F.v, fz_chance(r, 0.95) ? dt : draw_dtype(r), F.n, F.KV, F.d, fz_chance(r, 0.15));
    fill_qk(r, &F.q, &F.k, F.c.segment_size, F.c.block_size);
    fill_normal(r, &F.v, (float)(0.2 + 2 * fz_unit(r)));
    DESC(" | n %lld H %d KV %d d %d q %s/%lld/%lld+%lld k %s/%lld/%lld+%lld v %s", (long long)F.n, F.H, F.KV, F.d,
         dtype_name(F.q.dt), (long long)F.q.ts, (long long)F.q.hs, (long long)F.q.off, dtype_name(F.k.dt),
         (long long)F.k.ts, (long long)F.k.hs, (long long)F.k.off, dtype_name(F.v.dt));
    poison = fz_chance(r, 0.08);
    if (poison) { /* profiling reads every Q and K element */
        fz_view *pv = fz_chance(r, 0.5) ? &F.q : &F.k;
        view_set(pv, fz_int(r, 0, (int)F.n - 1), fz_int(r, 0, pv->H - 1), fz_int(r, 0, pv->d - 1), NAN);
        DESC(" | poison %s", pv == &F.q ? "q" : "k");
    }
    view_upload(&F.q, &F.P);
    view_upload(&F.k, &F.P);
    view_upload(&F.v, &F.P);
    F.host = ctx_make(0, F.c);
    /* the protocol axis: a schedule of chunks (either ranking, on both backends) */
    F.chunked = fz_chance(r, 0.3) && F.H / F.KV <= EI_MAX_CHUNK_GROUP;
    if (F.chunked && (!(F.given = (unsigned char *)calloc((size_t)F.n, 1)) ||
                      !(F.whole = (unsigned char *)calloc((size_t)(F.n / F.c.segment_size + 1), 1)))) {
        printf("out of memory\n");
        exit(2);
    }
    {
        uint32_t fl = EI_PLAN_SCORES | (F.chunked ? EI_PLAN_CHUNKED : 0u);
        CHECK_ERR(ei_plan_init(F.host, &F.plan[0], F.n, F.KV, F.d, fl, NULL, 0), EI_OK);
        CHECK_ERR(ei_plan_init(F.host, &F.plan[1], F.n, F.KV, F.d, fl, NULL, 0), EI_OK);
        if (!g_twin) CHECK_ERR(ei_plan_init(F.P.s[1].ctx, &F.dplan, F.n, F.KV, F.d, fl, NULL, 0), EI_OK);
        for (side_i = 0; side_i < 2; ++side_i) wsb[side_i] = layer_sizes(F.P.s[side_i].ctx, F.n, F.H, F.KV, F.d, fl, 1).profile;
    }
    buf_new(&ws, &F.P, wsb[0], wsb[1]);
    if (F.chunked) {
        res[0] = res[1] = chunk_schedule_run(r, &F, &ws, poison);
        if (poison) {
            CHECK(res[0] == EI_ERR_NONFINITE, "chunked planning of NaN input: %s", ei_result_name(res[0]));
            g_counts[K_NONFINITE]++;
        }
    } else {
        int short_ws = !poison && fz_chance(r, 0.05);
        for (side_i = 0; side_i < 2; ++side_i) {
            ei_tensor tq = view_tensor(&F.q, side_i, 0, F.n), tk = view_tensor(&F.k, side_i, 0, F.n);
            ei_exec x = ex(1, ws.p[side_i], ws.n[side_i] - (size_t)short_ws);
            res[side_i] = ei_profile(F.P.s[side_i].ctx, &x, &tq, &tk, side_i ? plan_of_side1(&F) : &F.plan[0]);
        }
        CHECK(res[0] == res[1], "profile: cpu %s, gpu %s (%s)", ei_result_name(res[0]), ei_result_name(res[1]),
              ei_last_error());
        if (poison) CHECK(res[0] == EI_ERR_NONFINITE, "profile of NaN input: %s", ei_result_name(res[0]));
        if (short_ws) CHECK(res[0] == EI_ERR_WORKSPACE, "profile with a short workspace: %s", ei_result_name(res[0]));
        if (poison || short_ws) g_counts[poison ? K_NONFINITE : K_MISUSE]++;
        else CHECK(res[0] == EI_OK, "profile: %s (%s)", ei_result_name(res[0]), ei_last_error());
    }
    if (res[0] == EI_OK && res[1] == EI_OK) {
        if (!g_twin) CHECK_ERR(ei_plan_copy(F.P.s[1].ctx, &F.plan[1], &F.dplan, EI_COPY_DEVICE_TO_HOST), EI_OK);
        plans_check(&F);
        if (config_int8_ranked(&F.c)) g_counts[K_INT8_PLANS]++;
        if (config_spread_rows(&F.c)) g_counts[K_SPREAD_PLANS]++;
    }
    if (attn && !poison) {
        int calls = fz_int(r, 1, 2), i;
        for (i = 0; i < calls; ++i) attention_case(r, &F);
        if (fz_chance(r, 0.2)) attention_misuse(r, &F);
    }
    buf_free(&ws, &F.P);
    free(F.given);
    free(F.whole);
    ei_plan_free(F.host, &F.plan[0]);
    ei_plan_free(F.host, &F.plan[1]);
    if (!g_twin) ei_plan_free(F.P.s[1].ctx, &F.dplan);
    ei_context_destroy(F.host);
    view_free(&F.q, &F.P);
    view_free(&F.k, &F.P);
    view_free(&F.v, &F.P);
    pair_free(&F.P);
}

/* ============================================================ decode */
typedef struct fz_decode {
    ei_config c;
    fz_pair P;
    int32_t H, KV, d;
    int64_t npos, n;           /* positions 0..npos-1 written; rows of the cache */
    fz_view q[2], k[2];        /* two layers: queries [npos][H][d], caches [n][KV][d] */
    int32_t *row_pos;          /* [maps][n], NULL: row j holds position j */
    int maps;                  /* 0, 1 or KV */
    void *drp[2];              /* each side's copy */
    ei_decoder dec[2][2];      /* [side][layer] */
    void *ring[2][2];
    size_t ring_bytes;
} fz_decode;

static ei_config draw_decode_config(fz_rng *r) {
    ei_config c = ei_config_default();
    c.window = fz_chance(r, 0.2) ? 1 : fz_int(r, 2, 48);
    c.decode_gap = fz_int(r, 0, c.window);
    c.decode_budget = c.window + fz_int(r, 0, 400);
    c.pool = (ei_pool)fz_int(r, 0, 2);
    c.pool_kernel = 2 * fz_int(r, 0, 4) + 1;
    c.per_kv_head = fz_int(r, 0, 1);
    c.gqa_reduce = fz_chance(r, 0.5) ? EI_REDUCE_MAX : EI_REDUCE_MEAN;
    c.recompress_every = fz_chance(r, 0.5) ? 0 : fz_int(r, 1, 8);
    c.decode_scale = fz_chance(r, 0.7) ? 0.0f : (float)(0.02 + 0.3 * fz_unit(r));
    c.simd = draw_simd(r);
    return c;
}

/* The rows: identity, or the positions a cache still holds (the window's
   always, as many older ones in every map, chosen at random) scattered over
   n rows with -1 rows between; one map, or one per kv head (stride n; the
   maps hold one count of positions: a keep set has one n_kept). */
static void draw_maps(fz_rng *r, fz_decode *D, int64_t W) {
    int m, maps;
    int64_t j, older = D->npos - W, held;
    D->maps = fz_chance(r, 0.3) ? 0 : fz_chance(r, 0.6) ? 1 : D->KV;
    maps = D->maps ? D->maps : 1;
    if (!D->maps) { D->n = D->npos; D->row_pos = NULL; return; }
    held = fz_chance(r, 0.5) ? older : (int64_t)((double)older * (0.3 + 0.7 * fz_unit(r)));
    D->n = D->npos + fz_int(r, 0, 40);
    D->row_pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)maps * (size_t)D->n);
    for (m = 0; m < maps; ++m) {
        int32_t *map = D->row_pos + (size_t)m * (size_t)D->n;
        int64_t used = 0, p;
        for (j = 0; j < D->n; ++j) map[j] = -1;
        for (p = 0; p < older; ++p) /* `held` of the older positions (selection sampling) */
            if ((int64_t)(fz_unit(r) * (double)(older - p)) < held - used) map[used++] = (int32_t)p;
        for (p = older; p < D->npos; ++p) map[used++] = (int32_t)p;
        for (j = D->n - 1; j > 0; --j) { /* scatter */
            int64_t x = (int64_t)(fz_next(r) % (uint64_t)(j + 1));
            int32_t t = map[j]; map[j] = map[x]; map[x] = t;
        }
    }
}

/* Cache layer L's rows: the key of the position the row holds (f32 values
   from keys [npos][KV][d]); empty rows NaN. */
static void fill_cache(fz_decode *D, int L, const float *keys) {
    int64_t j;
    int32_t h, i;
    for (j = 0; j < D->n; ++j)
        for (h = 0; h < D->KV; ++h) {
            const int32_t *map = D->row_pos ? D->row_pos + (size_t)(D->maps > 1 ? h : 0) * (size_t)D->n : NULL;
            int64_t p = map ? map[j] : j;
            for (i = 0; i < D->d; ++i)
                view_set(&D->k[L], j, h, i, p < 0 ? NAN : keys[((size_t)p * D->KV + h) * D->d + i]);
        }
}

static void decode_observe_all(fz_rng *r, fz_decode *D, int L, int64_t prompt) {
    int side_i;
    for (side_i = 0; side_i < 2; ++side_i) {
        const side *s = &D->P.s[side_i];
        ei_decoder *dec = &D->dec[side_i][L];
        int64_t t = 0;
        fz_rng rr = *r; /* the same batches on both sides */
        CHECK_ERR(ei_decoder_reset(dec), EI_OK);
        while (t < D->npos) {
            int gen = t >= prompt, part = fz_int(&rr, 1, 3);
            int64_t take = gen ? part : (prompt - t) / part;
            ei_tensor tq;
            if (take < 1) take = 1;
            if (gen && take > D->npos - t) take = D->npos - t;
            if (!gen && take > prompt - t) take = prompt - t;
            tq = view_tensor(&D->q[L], side_i, t, take);
            CHECK_ERR(ei_decode_observe(s->ctx, dec, &tq, t, gen), EI_OK);
            t += take;
        }
    }
    for (side_i = 0; side_i < 4; ++side_i) (void)fz_next(r); /* moves on either way */
}

/* Scores [H][n] of both sides within 1e-3 (rows holding no position: 0). */
static void scores_check(const char *what, const float *a, const float *b, size_t count) {
    size_t j;
    int bad = 0;
    for (j = 0; j < count; ++j)
        if (!close_to(b[j], a[j], test_tols[TOL_DECODE_SCORE].abs, test_tols[TOL_DECODE_SCORE].rel) ||
            ((a[j] == 0.0f) != (b[j] == 0.0f) && fabs(a[j] - b[j]) > 1e-12))
            if (bad++ < 3) printf("  %s[%zu]: cpu %g gpu %g\n", what, j, (double)a[j], (double)b[j]);
    CHECK(bad == 0, "%s: %d scores differ", what, bad);
}

/* kv_compact of a K and a V cache with keep set ks (host copy) on both
   sides: codes equal, caches bit-identical after. */
static void compact_case(fz_rng *r, fz_decode *D, const keep_host *ks, int bad_index) {
    fz_view kc, vc;
    int side_i, with_v, i;
    ei_result res[2];
    int32_t heads = ks->heads, H = ks->heads == 1 ? fz_int(r, 1, 3) : ks->heads;
    int64_t n = ks->n_tokens;
    int32_t *idx = (int32_t *)malloc(sizeof(int32_t) * (size_t)ks->heads * ks->cap);
    memcpy(idx, ks->index, sizeof(int32_t) * (size_t)ks->heads * ks->cap);
    if (bad_index && ks->n_kept > 1) { /* a repeat: not ascending */
        int32_t h = fz_int(r, 0, heads - 1), i = fz_int(r, 1, ks->n_kept - 1);
        idx[(size_t)h * ks->cap + i] = idx[(size_t)h * ks->cap + i - 1];
    }
    view_layout(r, &kc, draw_dtype(r), n, H, fz_int(r, 1, 80), 0);
    view_layout(r, &vc, draw_dtype(r), n, H, fz_int(r, 1, 80), fz_chance(r, 0.3));
    fill_normal(r, &kc, 1.0f);
    fill_normal(r, &vc, 1.0f);
    view_upload(&kc, &D->P);
    view_upload(&vc, &D->P);
    with_v = fz_chance(r, 0.8);
    for (side_i = 0; side_i < 2; ++side_i) {
        const side *s = &D->P.s[side_i];
        ei_keep_set k2;
        ei_out_tensor ok = view_out(&kc, side_i), ov = view_out(&vc, side_i);
        memset(&k2, 0, sizeof k2);
        k2.heads_out = heads; k2.capacity = ks->cap; k2.n_kept = ks->n_kept; k2.compressed = ks->compressed;
        k2.n_tokens = n;
        k2.index = (int32_t *)mem_up(s, idx, sizeof(int32_t) * (size_t)heads * ks->cap);
        res[side_i] = ei_kv_compact(s->ctx, &k2, &ok, with_v ? &ov : NULL);
        mem_del(s, k2.index, sizeof(int32_t) * (size_t)heads * ks->cap);
    }
    CHECK(res[0] == res[1], "kv_compact: cpu %s, gpu %s (%s)", ei_result_name(res[0]), ei_result_name(res[1]), ei_last_error());
    if (bad_index && ks->n_kept > 1) {
        CHECK(res[0] == EI_ERR_SHAPE, "kv_compact with a repeated index: %s", ei_result_name(res[0]));
        g_counts[K_MISUSE]++;
    }
    for (i = 0; i < 1 + with_v; ++i) {
        const fz_view *x = i ? &vc : &kc;
        unsigned char *a = (unsigned char *)mem_down(&D->P.s[0], x->mem[0], view_bytes(x));
        unsigned char *b = (unsigned char *)mem_down(&D->P.s[1], x->mem[1], view_bytes(x));
        CHECK(!memcmp(a, b, view_bytes(x)), "kv_compact: the %s caches differ (%s)", i ? "V" : "K", ei_result_name(res[0]));
        if (res[0] != EI_OK) CHECK(!memcmp(a, x->host, view_bytes(x)), "kv_compact refused but changed the %s cache", i ? "V" : "K");
        free(a);
        free(b);
    }
    free(idx);
    view_free(&kc, &D->P);
    view_free(&vc, &D->P);
}

static void decode_run(fz_rng *r) {
    static const int dims[] = {1, 3, 8, 16, 32, 40, 64, 64, 100, 128, 160};
    static const int groups[] = {1, 2, 3, 4, 8};
    fz_decode D;
    int side_i, L, nth, i;
    int64_t prompt, gen, W, maps1;
    float *keys[2];
    size_t wsb[2], sc_bytes;
    fz_buf ws, wsp;
    keep_host kh[2], sel[2], shared_set[2];
    float *sc[2][2], *sh[2];
    void *dsc[2][2], *dsh[2];
    ei_result res[2];
    memset(&D, 0, sizeof D);
    memset(kh, 0, sizeof kh); memset(sel, 0, sizeof sel); memset(shared_set, 0, sizeof shared_set);
    shared_set[0].r = shared_set[1].r = EI_ERR_STATE; /* not run (per-kv-head maps) */
    D.c = draw_decode_config(r);
    D.P = pair_make(D.c);
    DESC("decode window %d gap %d budget %d pool %d/%d per_kv %d reduce %s recompress %d scale %.3f", D.c.window,
         D.c.decode_gap, D.c.decode_budget, (int)D.c.pool, D.c.pool_kernel, D.c.per_kv_head,
         D.c.gqa_reduce == EI_REDUCE_MAX ? "max" : "mean", D.c.recompress_every, (double)D.c.decode_scale);
    if (D.P.r != EI_OK) { g_counts[K_CFG_REFUSED]++; if (D.P.s[0].ctx) pair_free(&D.P); return; }
    g_counts[K_DECODE]++;
    D.KV = fz_int(r, 1, 4);
    D.H = D.KV * FZ_PICK(r, groups);
    D.d = FZ_PICK(r, dims);
    gen = fz_int(r, 0, 24);
    prompt = fz_chance(r, 0.15) ? fz_int(r, 1, D.c.window) : fz_int(r, 1, 1200);
    if (prompt + gen > g_max_n) prompt = EI__MAX((int64_t)1, g_max_n - gen);
    D.npos = prompt + gen;
    W = EI__MIN(D.npos, (int64_t)D.c.window);
    draw_maps(r, &D, W);
    DESC(" | H %d KV %d d %d prompt %lld gen %lld rows %lld maps %d", D.H, D.KV, D.d, (long long)prompt, (long long)gen,
         (long long)D.n, D.maps);
    for (L = 0; L < 2; ++L) {
        ei_dtype kd = draw_dtype(r);
        view_layout(r, &D.q[L], draw_dtype(r), D.npos, D.H, D.d, fz_chance(r, 0.15));
        fill_normal(r, &D.q[L], (float)(0.5 + fz_unit(r)));
        keys[L] = (float *)malloc(sizeof(float) * (size_t)D.npos * D.KV * D.d);
        for (i = 0; i < (int)((size_t)D.npos * D.KV * D.d); ++i) {
            float x = (float)(0.3 + 2.5 * fz_unit(r)) * fz_normal(r);
            keys[L][i] = kd == EI_F16 ? ei__f16_to_f32(ei__f32_to_f16(x)) : x;
        }
        view_layout(r, &D.k[L], kd, D.n, D.KV, D.d, fz_chance(r, 0.15));
        fill_cache(&D, L, keys[L]);
        view_upload(&D.q[L], &D.P);
        view_upload(&D.k[L], &D.P);
    }
    maps1 = D.maps ? D.maps : 0;
    for (side_i = 0; side_i < 2; ++side_i) {
        const side *s = &D.P.s[side_i];
        D.drp[side_i] = D.row_pos ? mem_up(s, D.row_pos, sizeof(int32_t) * (size_t)maps1 * (size_t)D.n) : NULL;
        ei_sizes sz = layer_sizes(s->ctx, D.n, D.H, D.KV, D.d, 0, 1);
        D.ring_bytes = sz.decoder;
        wsb[side_i] = sz.decode_keep;
        for (L = 0; L < 2; ++L) {
            D.ring[side_i][L] = mem_new(s, D.ring_bytes);
            CHECK_ERR(ei_decoder_init(s->ctx, &D.dec[side_i][L], D.H, D.KV, D.d, D.ring[side_i][L], D.ring_bytes), EI_OK);
        }
    }
    buf_new(&ws, &D.P, wsb[0], wsb[1]);
    for (L = 0; L < 2; ++L) decode_observe_all(r, &D, L, prompt);

    /* 1. decode_keep (with a NaN in a row holding a position, sometimes) */
    {
        int poison = fz_chance(r, 0.1), short_ws = !poison && fz_chance(r, 0.05);
        int64_t prow = -1;
        int32_t ph = 0;
        if (poison) {
            ph = fz_int(r, 0, D.KV - 1);
            do prow = fz_int(r, 0, (int)D.n - 1);
            while (D.row_pos && D.row_pos[(size_t)(D.maps > 1 ? ph : 0) * (size_t)D.n + (size_t)prow] < 0);
            view_set(&D.k[0], prow, ph, fz_int(r, 0, D.d - 1), INFINITY);
            view_upload(&D.k[0], &D.P);
            DESC(" | poison k row %lld", (long long)prow);
        }
        for (side_i = 0; side_i < 2; ++side_i) {
            const side *s = &D.P.s[side_i];
            int32_t heads = D.c.per_kv_head ? D.KV : D.H;
            ei_keep_set ks = keep_new(s, heads, (int32_t)EI__MIN(D.n, (int64_t)D.c.decode_budget), D.n, D.n);
            ei_tensor tk = view_tensor(&D.k[0], side_i, 0, D.n);
            ei_exec x = ex(1, ws.p[side_i], ws.n[side_i] - (size_t)short_ws);
            ks.row_pos = (const int32_t *)D.drp[side_i];
            ks.row_pos_stride = D.maps > 1 ? D.n : 0;
            keep_take(s, &ks, ei_decode_keep(s->ctx, &x, &D.dec[side_i][0], &tk, &ks), &kh[side_i]);
        }
        CHECK(kh[0].r == kh[1].r, "decode_keep: cpu %s, gpu %s (%s)", ei_result_name(kh[0].r), ei_result_name(kh[1].r),
              ei_last_error());
        if (poison) { CHECK(kh[0].r == EI_ERR_NONFINITE, "decode_keep over a NaN key: %s", ei_result_name(kh[0].r)); g_counts[K_NONFINITE]++; }
        else if (short_ws) { CHECK(kh[0].r == EI_ERR_WORKSPACE, "decode_keep, short workspace: %s", ei_result_name(kh[0].r)); g_counts[K_MISUSE]++; }
        else {
            CHECK(kh[0].r == EI_OK, "decode_keep: %s (%s)", ei_result_name(kh[0].r), ei_last_error());
            keep_check_one("cpu", "decode_keep", &kh[0], D.row_pos, D.maps > 1 ? D.n : 0, D.c.per_kv_head ? 1 : D.H / D.KV, W);
            keep_check_one("gpu", "decode_keep", &kh[1], D.row_pos, D.maps > 1 ? D.n : 0, D.c.per_kv_head ? 1 : D.H / D.KV, W);
            keep_compare("decode_keep, gpu vs cpu", &kh[0], &kh[1], D.row_pos, D.maps > 1 ? D.n : 0, D.c.per_kv_head ? 1 : D.H / D.KV, W);
        }
        if (poison) { fill_cache(&D, 0, keys[0]); view_upload(&D.k[0], &D.P); }
    }

    /* 2. decode_score in nth parts (one workspace for nth), then decode_select */
    nth = fz_int(r, 1, 4);
    {
        size_t wpb[2];
        for (side_i = 0; side_i < 2; ++side_i) wpb[side_i] = layer_sizes(D.P.s[side_i].ctx, D.n, D.H, D.KV, D.d, 0, nth).decode_keep;
        buf_new(&wsp, &D.P, wpb[0], wpb[1]);
    }
    sc_bytes = sizeof(float) * (size_t)D.H * (size_t)D.n;
    for (side_i = 0; side_i < 2; ++side_i)
        for (L = 0; L < 2; ++L) dsc[side_i][L] = mem_new(&D.P.s[side_i], sc_bytes);
    for (L = 0; L < 2; ++L) {
        int misuse = L == 0 && D.row_pos && fz_chance(r, 0.15) ? fz_int(r, 1, W > 1 ? 3 : 2) : 0;
        int32_t *bad_map = NULL;
        if (misuse) { /* -2, a repeated position, or a window position missing */
            int64_t j0 = 0, j1 = 0;
            bad_map = (int32_t *)malloc(sizeof(int32_t) * (size_t)maps1 * (size_t)D.n);
            memcpy(bad_map, D.row_pos, sizeof(int32_t) * (size_t)maps1 * (size_t)D.n);
            while (bad_map[j0] < 0) j0++;
            for (j1 = j0 + 1; j1 < D.n && bad_map[j1] < 0; ++j1) {}
            if (misuse == 1) bad_map[j0] = -2;
            else if (misuse == 2 && j1 < D.n) bad_map[j1] = bad_map[j0];
            else {
                int64_t j;
                for (j = 0; j < D.n; ++j)
                    if (bad_map[j] == D.npos - 2) bad_map[j] = -1; /* the newest W are not consecutive */
            }
            for (side_i = 0; side_i < 2; ++side_i) mem_put(&D.P.s[side_i], D.drp[side_i], bad_map, sizeof(int32_t) * (size_t)maps1 * (size_t)D.n);
            DESC(" | bad map %d", misuse);
        }
        for (side_i = 0; side_i < 2; ++side_i) {
            const side *s = &D.P.s[side_i];
            ei_tensor tk = view_tensor(&D.k[L], side_i, 0, D.n);
            res[side_i] = EI_OK;
            for (i = 0; i < nth; ++i) { /* the parts in turn; the first failure is the call's */
                ei_exec x = ex_part(i, nth, wsp.p[side_i], wsp.n[side_i]);
                ei_result ri = ei_decode_score(s->ctx, &x, &D.dec[side_i][L], &tk, (const int32_t *)D.drp[side_i],
                                               D.maps > 1 ? D.n : 0, (float *)dsc[side_i][L]);
                if (res[side_i] == EI_OK) res[side_i] = ri;
            }
        }
        CHECK(res[0] == res[1], "decode_score (layer %d): cpu %s, gpu %s (%s)", L, ei_result_name(res[0]),
              ei_result_name(res[1]), ei_last_error());
        if (misuse) {
            CHECK(res[0] == EI_ERR_SHAPE || (misuse == 2 && res[0] == EI_OK), "decode_score over bad map %d: %s", misuse,
                  ei_result_name(res[0]));
            g_counts[K_MISUSE]++;
            for (side_i = 0; side_i < 2; ++side_i) mem_put(&D.P.s[side_i], D.drp[side_i], D.row_pos, sizeof(int32_t) * (size_t)maps1 * (size_t)D.n);
            free(bad_map);
            L--; /* again with the good map */
            continue;
        }
        for (side_i = 0; side_i < 2; ++side_i) sc[side_i][L] = (float *)mem_down(&D.P.s[side_i], dsc[side_i][L], sc_bytes);
        if (res[0] == EI_OK) scores_check(L ? "decode_score layer 1" : "decode_score layer 0", sc[0][L], sc[1][L], (size_t)D.H * D.n);
    }
    buf_free(&wsp, &D.P);
    for (side_i = 0; side_i < 2; ++side_i) { /* select from each side's own scores */
        const side *s = &D.P.s[side_i];
        int32_t heads = D.c.per_kv_head ? D.KV : D.H;
        ei_keep_set ks = keep_new(s, heads, (int32_t)EI__MIN(D.n, (int64_t)D.c.decode_budget), D.n, D.n);
        ei_exec x = ex(1, ws.p[side_i], ws.n[side_i]);
        ks.row_pos = (const int32_t *)D.drp[side_i];
        ks.row_pos_stride = D.maps > 1 ? D.n : 0;
        keep_take(s, &ks, ei_decode_select(s->ctx, &x, &D.dec[side_i][0], (const float *)dsc[side_i][0], D.n, &ks),
                  &sel[side_i]);
    }
    keep_compare("decode_select, gpu vs cpu", &sel[0], &sel[1], D.row_pos, D.maps > 1 ? D.n : 0, D.c.per_kv_head ? 1 : D.H / D.KV, W);

    /* 3. the shared keep set of both layers (one map for every head) */
    if (D.maps <= 1) {
        for (side_i = 0; side_i < 2; ++side_i) {
            const side *s = &D.P.s[side_i];
            float *zero = (float *)calloc((size_t)D.n, sizeof(float));
            ei_keep_set ks;
            ei_exec x = ex(1, ws.p[side_i], ws.n[side_i]);
            dsh[side_i] = mem_up(s, zero, sizeof(float) * (size_t)D.n);
            free(zero);
            res[side_i] = EI_OK;
            for (L = 0; L < 2 && res[side_i] == EI_OK; ++L)
                res[side_i] = ei_decode_shared_add(s->ctx, &x, &D.dec[side_i][L], (const float *)dsc[side_i][L], D.n,
                                                   (const int32_t *)D.drp[side_i], (float *)dsh[side_i]);
            sh[side_i] = (float *)mem_down(s, dsh[side_i], sizeof(float) * (size_t)D.n);
            ks = keep_new(s, 1, (int32_t)EI__MIN(D.n, (int64_t)D.c.decode_budget), D.n, D.n);
            ks.row_pos = (const int32_t *)D.drp[side_i];
            keep_take(s, &ks, res[side_i] != EI_OK ? res[side_i]
                              : ei_decode_select_shared(s->ctx, &x, &D.dec[side_i][0], (const float *)dsh[side_i], D.n, &ks),
                      &shared_set[side_i]);
            mem_del(s, dsh[side_i], sizeof(float) * (size_t)D.n);
        }
        CHECK(res[0] == res[1], "decode_shared_add: cpu %s, gpu %s", ei_result_name(res[0]), ei_result_name(res[1]));
        scores_check("shared scores", sh[0], sh[1], (size_t)D.n);
        keep_compare("shared keep set, gpu vs cpu", &shared_set[0], &shared_set[1], D.row_pos, 0, 1, W);
        free(sh[0]);
        free(sh[1]);
    }

    /* 4. compaction with the CPU's keep set (per head or shared) */
    if (kh[0].r == EI_OK) compact_case(r, &D, fz_chance(r, 0.5) || shared_set[0].r != EI_OK ? &kh[0] : &shared_set[0], fz_chance(r, 0.15));

    for (side_i = 0; side_i < 2; ++side_i) {
        for (L = 0; L < 2; ++L) {
            mem_del(&D.P.s[side_i], dsc[side_i][L], sc_bytes);
            free(sc[side_i][L]);
            mem_del(&D.P.s[side_i], D.ring[side_i][L], D.ring_bytes);
        }
        if (D.drp[side_i]) mem_del(&D.P.s[side_i], D.drp[side_i], sizeof(int32_t) * (size_t)maps1 * (size_t)D.n);
        keep_free(&kh[side_i]);
        keep_free(&sel[side_i]);
        keep_free(&shared_set[side_i]);
    }
    buf_free(&ws, &D.P);
    for (L = 0; L < 2; ++L) {
        view_free(&D.q[L], &D.P);
        view_free(&D.k[L], &D.P);
        free(keys[L]);
    }
    free(D.row_pos);
    pair_free(&D.P);
}

/* ============================================================ table */
/* A case of the operations' table (tests/ops_cases.h), varied, on the
   CPU's scalar path (the reference) and the GPU (or, --cpu-twin, the CPU's
   default path). */
static void table_run(fz_rng *r) {
    ops_case cs = ops_cases[fz_int(r, 0, OPS_CASES - 1)];
    ops_data D;
    ops_result res[2];
    side s[2];
    ei_config c;
    char name[256];
    int side_i;
    double scale = 0.3 + fz_unit(r);
    cs.n = (int32_t)EI__MAX(100.0, EI__MIN((double)g_max_n, cs.n * scale));
    if (fz_chance(r, 0.5)) cs.layout = fz_int(r, 0, LAY_COUNT - 1);
    if (fz_chance(r, 0.3)) cs.kv = draw_dtype(r);
    if (fz_chance(r, 0.3)) cs.q = fz_chance(r, 0.5) ? EI_F32 : cs.kv;
    if (fz_chance(r, 0.3)) cs.out = draw_dtype(r);
    cs.nth = fz_int(r, 1, 4);
    ops_case_name(&cs, name, sizeof name);
    DESC("table %s", name);
    g_counts[K_TABLE]++;
    ops_data_make(&D, &cs, fz_next(r));
    for (side_i = 0; side_i < 2; ++side_i) {
        c = D.c;
        c.simd = side_i ? EI_SIMD_AUTO : EI_SIMD_SCALAR;
        s[side_i] = side_make(side_i && !g_twin, c);
        ops_run(&D, &s[side_i], &res[side_i]);
    }
    CHECK(res[0].r == EI_OK, "table %s: the reference: %s (%s)", name, ei_result_name(res[0].r), ei_last_error());
    if (g_twin || ops_gpu_runs(&cs))
        g_counts[K_KNIFE] += ops_compare(g_twin ? "table, cpu twin" : "table, gpu", &D, &res[0], &res[1], !g_twin,
                                         ei_context_config(s[1].ctx)->simd);
    else {
        CHECK(res[1].r == EI_ERR_DTYPE || res[1].r == EI_ERR_UNSUPPORTED, "table %s: a case the GPU has no kernel for: %s",
              name, ei_result_name(res[1].r));
        g_counts[K_GPU_UNSUPPORTED]++;
    }
    for (side_i = 0; side_i < 2; ++side_i) {
        ops_result_free(&res[side_i]);
        side_free(&s[side_i]);
    }
    ops_data_free(&D);
}

/* ============================================================ main */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    unsigned long long seed = 1;
    long iters = 100, first = 0, it, done = 0;
    double seconds = 0, t0 = now_s();
    int require_gpu = 0, i;
    ei_config probe_cfg = ei_config_default();
    ei_context *probe = NULL;
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atol(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--first") && i + 1 < argc) first = atol(argv[++i]);
        else if (!strcmp(argv[i], "--require-gpu")) require_gpu = 1;
        else if (!strcmp(argv[i], "-v")) g_verbose = 1;
        else if (!strcmp(argv[i], "--cpu-twin")) g_twin = 1;
        else if (!strcmp(argv[i], "--max-n") && i + 1 < argc) g_max_n = atol(argv[++i]);
        else {
            printf("usage: %s [--seed S] [--iters N] [--seconds T] [--first I] [--max-n N] [--require-gpu] [--cpu-twin] [-v]\n",
                   argv[0]);
            return 2;
        }
    }
    probe_cfg.backend = EI_BACKEND_CUDA;
    if (g_twin)
        printf("fuzz_backends: the CPU against the CPU on another SIMD path (--cpu-twin), seed %llu\n", seed);
    else if (ei_context_create(&probe_cfg, &probe) != EI_OK) {
        printf("CUDA backend not available: nothing to compare (%s)\n", ei_last_error());
        printf("fuzz_backends: 0 iterations, 0 checks, 0 failed, seed %llu (no GPU)\n", seed);
        return require_gpu ? 1 : 0;
    }
    else {
        printf("fuzz_backends: CPU and GPU (%s), seed %llu, iterations %ld..%ld%s\n", probe->cuda->api->build_info(),
               seed, first, first + iters - 1, seconds > 0 ? " (or a time limit)" : "");
        ei_context_destroy(probe);
    }
    for (it = first; it < first + iters; ++it) {
        fz_rng r;
        int f0 = failures;
        if (seconds > 0 && now_s() - t0 > seconds) break;
        r.s = seed * 0x9E3779B97F4A7C15ull ^ ((unsigned long long)it * 0xD1B54A32D192ED03ull);
        (void)fz_next(&r);
        g_desc[0] = 0;
        if (it % 5 == 4) table_run(&r); /* every fifth iteration; the others draw as before */
        else if (fz_chance(&r, 0.6)) prefill_run(&r);
        else decode_run(&r);
        done++;
        if (g_verbose) printf("  iteration %ld: %s\n", it, g_desc);
        if (failures != f0)
            printf("FAILED iteration %ld (replay: --seed %llu --first %ld --iters 1): %s\n", it, seed, it, g_desc);
        fflush(stdout);
    }
    printf("counts:");
    for (i = 0; i < K_KINDS; ++i) printf(" %s %ld%s", g_count_names[i], g_counts[i], i < K_KINDS - 1 ? "," : "\n");
    printf("fuzz_backends: %ld iterations, %d checks, %d failed, seed %llu (%.1f s)\n", done, checks, failures, seed,
           now_s() - t0);
    return failures ? 1 : 0;
}
