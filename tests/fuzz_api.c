/* fuzz_api.c - libFuzzer target over every public entry point of entropyinfer.

   The input bytes are a small program: a configuration (every knob drawn from
   its defaults, its limits and values past them), a layer (shapes, dtypes,
   strides: contiguous, padded, head-major, zero, negative, aliasing, huge;
   values with NaN, Inf, denormals and huge magnitudes injected), then a
   sequence of operations in any order: plan init/alloc/reset/finalize, whole,
   per-head-range, threaded and chunked profiling (chunks of any size and
   offset), plan corruption (arbitrary block indices and counts), prefill
   attention with arbitrary plans and ith/nth, decoder init/observe/due/keep
   (also before anything was observed), keep sets and compaction with
   arbitrary indices, size queries with extreme arguments, the GPU-memory
   helpers on a CPU context, and swapping the context a plan was made with.

   Every buffer handed to the library has exactly the size its shape says, so
   AddressSanitizer reports any access outside it. Oracles besides the
   sanitizers: every failure's message names its code; successful calls leave
   valid plans and keep sets; compaction moves exactly the kept rows; dense
   and sparse attention match the double-precision reference of the method's
   semantics (check.h: ref_attention, FORMAT.md) when the inputs are tame;
   nothing reads padding (padding is NaN, so reading it would report a
   non-finite input).

   Build (libFuzzer):  clang -fsanitize=fuzzer,address,undefined tests/fuzz_api.c
   Build (replay):     cc -DEI_FUZZ_STANDALONE tests/fuzz_api.c   then
                       ./fuzz_replay FILE_OR_DIR...   (runs each input once) */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "check.h"
#include <sys/stat.h>

/* ------------------------------------------------------------ input bytes */
typedef struct fz { const uint8_t *p; size_t n, i; } fz;
static unsigned fz_u8(fz *f) { return f->i < f->n ? f->p[f->i++] : 0u; }
static unsigned fz_u16(fz *f) { unsigned a = fz_u8(f); return a | (fz_u8(f) << 8); }
static uint32_t fz_u32(fz *f) { uint32_t a = fz_u16(f); return a | ((uint32_t)fz_u16(f) << 16); }
static int fz_left(const fz *f) { return f->i < f->n; }
#define FZ_PICK(f, arr) ((arr)[fz_u8(f) % (sizeof(arr) / sizeof((arr)[0]))])

static void fz_fail(const char *what, long a, long b) {
    fprintf(stderr, "fuzz_api oracle failed: %s (%ld, %ld); last error: %s\n", what, a, b, ei_last_error());
    abort();
}
#define ORACLE(cond, what, a, b) do { if (!(cond)) fz_fail(what, (long)(a), (long)(b)); } while (0)

static int verbose = -1;
/* Every result is in the table, and every failure's message names its code. */
#define checked(expr) checked_((expr), #expr)
static ei_result checked_(ei_result r, const char *what) {
    if (verbose > 0) fprintf(stderr, "    %.60s -> %s %s\n", what, ei_result_name(r), r ? ei_last_error() : "");
    ORACLE(r <= 0 && r >= EI_RESULT_MIN_, "result outside EI_RESULT_TABLE", r, 0);
    if (r != EI_OK) ORACLE(strstr(ei_last_error(), ei_result_name(r)) != NULL, "message does not name its code", r, 0);
    return r;
}

/* ------------------------------------------------------------ rng for values */
static uint64_t rng_s;
static uint32_t rng_next(void) {
    rng_s ^= rng_s << 13; rng_s ^= rng_s >> 7; rng_s ^= rng_s << 17;
    return (uint32_t)(rng_s >> 32);
}
static float rng_val(void) { return ((float)(int32_t)(rng_next() % 2001u) - 1000.0f) / 500.0f; } /* [-2, 2] */

/* ------------------------------------------------------------ buffers */
/* An exact-size allocation (ASan catches any byte outside it). */
static void *xalloc(size_t n) { void *p = malloc(n ? n : 1); if (!p) abort(); return p; }
/* Memory the library writes (workspaces, outputs, plan and decoder memory,
   keep sets) starts as garbage: NaN bytes or huge values, alternately, so a
   kernel that reads what it never wrote gives wrong (or non-finite) results
   deterministically, whatever the allocator hands out. */
static unsigned poison_count;
static int poison_byte(void) {
    static int forced = -2;
    if (forced == -2) {
        const char *e = getenv("EI_FUZZ_POISON");
        forced = e && *e >= '0' && *e <= '9' ? (int)strtol(e, NULL, 0) & 255 : -1;
    }
    if (forced >= 0) return forced;
    return (poison_count++ & 1) ? 0x7f : 0xff;
}
static int poison_off(void) { /* EI_FUZZ_POISON=none: leave it uninitialised (valgrind memcheck finds reads of it) */
    static int off = -1;
    if (off < 0) { const char *e = getenv("EI_FUZZ_POISON"); off = e && !strcmp(e, "none"); }
    return off;
}
/* ... and at a varying alignment: the buffer ends exactly where the
   allocation ends (ASan catches overruns) and starts 16..64 bytes into it, so
   sizes that only suffice at one alignment fail ("any alignment" is the
   contract). The offset is kept in the byte before the buffer. */
static void *walloc_at(size_t n, int aligned) {
    static const unsigned char offsets[] = {16, 20, 24, 32, 40, 48, 60, 64};
    unsigned char off = offsets[(poison_count * 5u + 3u) % 8u];
    unsigned char *raw = (unsigned char *)xalloc(n + 64), *p;
    if (aligned) off = (unsigned char)(64 - ((uintptr_t)raw & 63u)); /* 64-byte aligned, 1..64 bytes in */
    p = raw + off; /* unaligned: the buffer ends 64 - off bytes before the allocation does */
    if (!aligned) { free(raw); raw = (unsigned char *)xalloc(n + off); p = raw + off; } /* ... or exactly at its end */
    if (!poison_off()) memset(p, poison_byte(), n ? n : 1);
    else poison_count++;
    p[-1] = off;
    return p;
}
static void *walloc(size_t n) { return walloc_at(n, 0); }
/* Profiling workspaces: misaligned like the rest (the sizing bug of
   tests/fuzz_regressions/profile_workspace_unaligned_d33.bin is fixed);
   walloc_at(n, 1) would give 64-byte aligned ones. */
static void *walloc_profile(size_t n) { return walloc_at(n, 0); }
static void wfree(void *p) { if (p) free((unsigned char *)p - ((unsigned char *)p)[-1]); }
/* A view of [n][h][d] in its own exact buffer. */
typedef struct view {
    ei_tensor t;
    void *buf;       /* owned */
    size_t elems;    /* elements in buf */
    int valid;       /* strides positive and non-aliasing (library should accept the layout) */
    int tame;        /* every element finite and |x| <= 1e3 */
} view;

static const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 1e30f, -1e30f, 1e-40f, -1e-45f,
                                 0.0f, -0.0f, 65504.0f, 70000.0f, 1e-8f, 3e38f, 1e20f, -1e20f};

static float load_el(const void *buf, ei_dtype dt, size_t i) { return ei__load1(buf, dt, (int64_t)i); }
static void store_el(void *buf, ei_dtype dt, size_t i, float v) { ei__store1(buf, dt, (int64_t)i, v); }
static size_t el_index(const ei_tensor *t, int64_t tok, int32_t h, int32_t i) {
    return (size_t)(tok * t->token_stride + (int64_t)h * t->head_stride + i);
}

/* Stride modes: 0 contiguous, 1 padded tokens, 2 head-major, 3 padded heads,
   4 zero stride, 5 negative stride, 6 aliasing, 7 arbitrary, 8 huge. */
static void view_make(view *v, fz *f, ei_dtype dt, int64_t n, int32_t h, int32_t d, int mode) {
    int64_t ts = (int64_t)h * d, hs = d;
    int backed = 0; /* the buffer covers every element the view addresses */
    uint8_t pad1 = (uint8_t)(fz_u8(f) % 9), pad2 = (uint8_t)(fz_u8(f) % 9);
    memset(v, 0, sizeof *v);
    switch (mode) {
        case 1: ts = (int64_t)h * d + pad1 + 1; break;
        case 2: ts = d + pad1; hs = n * ts + pad2; break;
        case 3: hs = d + pad1 + 1; ts = (int64_t)h * hs + pad2; break;
        case 4: if (fz_u8(f) & 1) ts = 0; else hs = 0; break;
        case 5: if (fz_u8(f) & 1) ts = -ts; else hs = -hs; break;
        case 6: ts = d; hs = d; if (h == 1 && n > 1) ts = d > 1 ? d - 1 : 0; break;
        case 7: ts = (int16_t)fz_u16(f); hs = (int16_t)fz_u16(f); break;
        case 8: /* the farthest element past 2^60 (refused), or just inside it with one token (accepted) */
            ts = n > 1 ? ((int64_t)1 << 60) / (n - 1) + 1 + (int64_t)(fz_u8(f) % 3) : ((int64_t)1 << 61);
            break;
        default: break;
    }
    v->t.dtype = dt; v->t.n_tokens = n; v->t.n_heads = h; v->t.head_dim = d;
    v->t.token_stride = ts; v->t.head_stride = hs;
    if (n <= 0 || h <= 0 || d <= 0 || ts <= 0 || hs <= 0 || (n > 1 && ts > ((int64_t)1 << 24)) || (h > 1 && hs > ((int64_t)1 << 24)) ||
        n > 4096 || h > 64 || d > 256) {
        v->elems = (size_t)(d > 0 && d <= 256 ? d : 1); /* the library must reject before reading more */
    } else {
        int64_t ext = (n - 1) * ts + (int64_t)(h - 1) * hs + d;
        if (ext > ((int64_t)1 << 22)) { /* too big for a fast input: fall back to contiguous */
            ts = (int64_t)h * d; hs = d;
            v->t.token_stride = ts; v->t.head_stride = hs;
            ext = n * ts;
        }
        v->elems = (size_t)ext;
        backed = 1;
    }
    {
        int64_t s_in = hs <= ts ? hs : ts, n_in = hs <= ts ? h : n, s_out = hs <= ts ? ts : hs, n_out = hs <= ts ? n : h;
        /* the library's rule: the farthest element (n-1)*ts + (h-1)*hs + d below 2^60 */
        double far = (double)(n > 0 ? n - 1 : 0) * (double)ts + (double)(h > 0 ? h - 1 : 0) * (double)hs + (double)d;
        v->valid = ts > 0 && hs > 0 && far <= (double)((int64_t)1 << 60) && n > 0 && h > 0 && d > 0 &&
                   !((n_in > 1 && s_in < d) || (n_out > 1 && s_out < s_in * (n_in - 1) + d)) && backed;
    }
    v->buf = xalloc(v->elems * dtype_size(dt));
    v->t.data = v->buf;
    v->tame = 1;
}
/* Padding NaN, real elements from the rng or raw bits; then specials. */
static void view_fill(view *v, fz *f) {
    unsigned mode = fz_u8(f) % 4, nspec = fz_u8(f) % 4, s;
    size_t i;
    int64_t t;
    int32_t h, j;
    for (i = 0; i < v->elems; ++i) store_el(v->buf, v->t.dtype, i, NAN); /* padding: never read */
    if (!v->valid) {
        for (i = 0; i < v->elems; ++i) store_el(v->buf, v->t.dtype, i, rng_val());
        return;
    }
    for (t = 0; t < v->t.n_tokens; ++t)
        for (h = 0; h < v->t.n_heads; ++h)
            for (j = 0; j < v->t.head_dim; ++j) {
                size_t e = el_index(&v->t, t, h, j);
                float x = rng_val();
                if (mode == 1) x *= 20.0f;                       /* peaked softmaxes */
                if (mode == 2) x = (float)(rng_next() % 3u) - 1.0f; /* many exact ties */
                if (mode == 3 && v->t.dtype != EI_F32) { ((uint16_t *)v->buf)[e] = (uint16_t)rng_next(); continue; }
                store_el(v->buf, v->t.dtype, e, x);
            }
    if (mode == 3) v->tame = 0;
    for (s = 0; s < nspec; ++s) {
        int64_t tt = (int64_t)(fz_u16(f) % (unsigned)v->t.n_tokens);
        int32_t hh = (int32_t)(fz_u8(f) % (unsigned)v->t.n_heads), jj = (int32_t)(fz_u8(f) % (unsigned)v->t.head_dim);
        float x = FZ_PICK(f, specials);
        store_el(v->buf, v->t.dtype, el_index(&v->t, tt, hh, jj), x);
        v->tame = 0;
    }
    if (v->tame) /* 16-bit conversions of [-40,40] stay finite */
        for (t = 0; t < v->t.n_tokens; ++t)
            for (h = 0; h < v->t.n_heads; ++h)
                for (j = 0; j < v->t.head_dim; ++j) {
                    float x = load_el(v->buf, v->t.dtype, el_index(&v->t, t, h, j));
                    if (!(fabsf(x) <= 1e3f)) v->tame = 0;
                }
}
static void describe(const char *name, const view *v) {
    if (!verbose) return;
    fprintf(stderr, "  %s: dtype %d, %lld tokens x %d heads x %d dims, strides token %lld head %lld, %zu elements, valid %d tame %d\n",
            name, (int)v->t.dtype, (long long)v->t.n_tokens, (int)v->t.n_heads, (int)v->t.head_dim,
            (long long)v->t.token_stride, (long long)v->t.head_stride, v->elems, v->valid, v->tame);
}
static void view_free(view *v) { free(v->buf); memset(v, 0, sizeof *v); }

/* Rows [t0, t0+cnt) of src (valid view) into a new buffer with its own layout,
   followed by `pad` NaN rows. */
static void view_rows_padded(view *dst, const view *src, int64_t t0, int64_t cnt, int64_t pad, fz *f) {
    int64_t t;
    int32_t h, j;
    view_make(dst, f, src->t.dtype, cnt + pad, src->t.n_heads, src->t.head_dim, (int)(fz_u8(f) % 4));
    for (t = 0; t < (int64_t)dst->elems; ++t) store_el(dst->buf, dst->t.dtype, (size_t)t, NAN);
    for (t = 0; t < cnt; ++t)
        for (h = 0; h < src->t.n_heads; ++h)
            for (j = 0; j < src->t.head_dim; ++j) {
                size_t se = el_index(&src->t, t0 + t, h, j), de = el_index(&dst->t, t, h, j);
                if (dtype_size(src->t.dtype) == 4) ((float *)dst->buf)[de] = ((const float *)src->buf)[se];
                else ((uint16_t *)dst->buf)[de] = ((const uint16_t *)src->buf)[se];
            }
    dst->tame = src->tame;
}
static void view_rows(view *dst, const view *src, int64_t t0, int64_t cnt, fz *f) { view_rows_padded(dst, src, t0, cnt, 0, f); }

/* ------------------------------------------------------------ configuration */
static int n_alloc_calls = 0, fail_after = -1;
static void *fz_alloc(size_t n, void *u) {
    (void)u;
    if (fail_after >= 0 && n_alloc_calls++ >= fail_after) return NULL;
    return malloc(n);
}
static void fz_free(void *p, void *u) { (void)u; free(p); }
static void fz_log(void *u, ei_result code, const char *msg) {
    (void)u;
    ORACLE(code < 0 && strstr(msg, ei_result_name(code)) != NULL, "logged message does not name its code", code, 0);
}

static ei_config fz_small_config(void) {
    ei_config c = ei_config_default();
    c.segment_size = 16; c.block_size = 4; c.base_budget = 16; c.threshold_len = 32;
    c.decode_budget = 24; c.window = 8; c.decode_gap = 4;
    return c;
}
static ei_config fz_config(fz *f) {
    static const int32_t seg[] = {16, 512, 1, 2, 4, 8, 32, 64, 24, 0, -1, EI_MAX_SEGMENT, EI_MAX_SEGMENT + 1, INT32_MAX, INT32_MIN};
    static const int32_t blk[] = {4, 8, 1, 2, 3, 16, 0, -1, 5, 7, 64, INT32_MAX};
    static const int64_t thr[] = {32, 4096, 0, 1, 16, -1, INT64_MAX, INT64_MIN, 48};
    static const int32_t base[] = {16, 2048, 0, 1, 4, 7, 64, 9, EI_MAX_BUDGET, EI_MAX_BUDGET + 1, -1, INT32_MAX};
    static const double ent[] = {1e-5, 0.0, 1.0, 10.0, 1e30, -1.0, NAN, INFINITY, -0.0, DBL_MIN, 0.5};
    static const double dl[] = {0.4, 0.0, 1.0, 5.0, 1e300, -0.1, NAN, INFINITY, 0.05};
    static const double fmin[] = {1.0, 0.0, 0.5, 3.0, 64.0, 65.0, -1.0, NAN};
    static const double fmax[] = {3.0, 1.0, 0.0, 64.0, 64.0001, 100.0, NAN, INFINITY, 2.0};
    static const int32_t flag[] = {1, 0, 2, -1};
    static const float scl[] = {0.0f, 0.125f, 1e-30f, 1e30f, -1.0f, NAN, INFINITY, FLT_MAX, 2.0f};
    static const int32_t dbud[] = {24, 1024, 8, 7, 1, 0, EI_MAX_BUDGET, EI_MAX_BUDGET + 1, 100, 5, 40, 12};
    static const int32_t win[] = {8, 32, 1, 2, 65536, 65537, 0, -1, 3, 5};
    static const int32_t gap[] = {4, 16, 0, 1, 8, 9, -1, 2};
    static const int32_t pool[] = {EI_POOL_AVG, EI_POOL_MAX, EI_POOL_NONE, 3, -1};
    static const int32_t kern[] = {5, 1, 3, 7, 0, 2, -1, 1023, 1025, 31};
    static const int32_t red[] = {EI_REDUCE_MEAN, EI_REDUCE_MAX, 2, -1};
    static const int32_t rec[] = {0, 1, 2, 5, -1, INT32_MAX};
    static const int32_t simd[] = {EI_SIMD_AUTO, EI_SIMD_SCALAR, EI_SIMD_AVX2, EI_SIMD_AVX512, EI_SIMD_NEON, 5, -1};
    static const int32_t rk[] = {EI_RANK_SAMPLED, EI_RANK_REFERENCE, 2, -1};
    static const int32_t smp[] = {8, 1, 3, 64, 0, -1, EI_MAX_RANK_SAMPLES, EI_MAX_RANK_SAMPLES + 1, 33};
    static const double tp[] = {0.9, 0.0, 1.0, 0.5, 1e-9, -0.1, 1.5, NAN, INFINITY};
    static const int32_t sk[] = {1, 0, 2, 8, 1000, -1, EI_MAX_BUDGET + 1};
    ei_config c = fz_small_config();
    unsigned sel = fz_u8(f); /* bit i: knob group i is fuzzed (0: the small valid configuration) */
    if (sel & 1) { c.segment_size = FZ_PICK(f, seg); c.block_size = FZ_PICK(f, blk); }
    if (sel & 2) { c.threshold_len = FZ_PICK(f, thr); c.base_budget = FZ_PICK(f, base); }
    if (sel & 4) {
        c.rigid_entropy = FZ_PICK(f, ent); c.delta_t = FZ_PICK(f, dl); c.alpha = FZ_PICK(f, dl);
        c.budget_min_factor = FZ_PICK(f, fmin); c.budget_max_factor = FZ_PICK(f, fmax);
    }
    if (sel & 8) { c.last_segment_dense = FZ_PICK(f, flag); c.per_segment_budget = FZ_PICK(f, flag); c.attn_scale = FZ_PICK(f, scl); }
    if (sel & 16) {
        c.window = FZ_PICK(f, win); c.decode_budget = FZ_PICK(f, dbud); c.decode_gap = FZ_PICK(f, gap);
        c.recompress_every = FZ_PICK(f, rec); c.decode_scale = FZ_PICK(f, scl);
    }
    if (sel & 32) {
        c.pool = (ei_pool)FZ_PICK(f, pool); c.pool_kernel = FZ_PICK(f, kern);
        c.per_kv_head = FZ_PICK(f, flag); c.gqa_reduce = (ei_reduce)FZ_PICK(f, red);
    }
    if (sel & 64) c.simd = (ei_simd)FZ_PICK(f, simd);
    if (sel & 128) {
        unsigned x = fz_u8(f);
        if (x & 1) { c.allocator.alloc = fz_alloc; c.allocator.free = fz_free; fail_after = (x & 2) ? (int)(fz_u8(f) % 4) : -1; }
        if (x & 4) c.allocator.free = NULL; /* alloc without free: refused */
        if (x & 8) c.log = fz_log;
        if (x & 16) { c.backend = EI_BACKEND_CUDA; c.cuda_library = "/nonexistent/libentropyinfer_cuda.so"; }
        if (x & 32) c.backend = (ei_backend)7;
        if (x & 64) { /* the ranking beyond the paper */
            c.ranking = (ei_ranking)FZ_PICK(f, rk); c.rank_samples = FZ_PICK(f, smp); c.top_p = FZ_PICK(f, tp);
            c.sink_blocks = FZ_PICK(f, sk); c.local_blocks = FZ_PICK(f, sk);
        }
    }
    return c;
}

static ei_context *fz_context(fz *f) {
    ei_config c = fz_config(f);
    ei_context *ctx = (ei_context *)1;
    ei_result r = checked(ei_context_create(&c, &ctx));
    if (r != EI_OK) {
        ORACLE(ctx == NULL, "context returned on failure", r, 0);
        c = fz_small_config(); /* go on with a valid one */
        fail_after = -1;
        if (checked(ei_context_create(&c, &ctx)) != EI_OK) abort();
    } else {
        ORACLE(ctx != NULL, "no context on success", 0, 0);
        ORACLE(ei_context_config(ctx)->segment_size == c.segment_size, "config not kept", 0, 0);
        ORACLE(ei_cpu_supports(ei_context_simd(ctx)), "chosen SIMD path unsupported", ei_context_simd(ctx), 0);
    }
    return ctx;
}

/* ------------------------------------------------------------ state */
typedef struct state {
    ei_context *ctx, *alt;
    view q, k, v;
    int64_t n;
    int32_t H, KV, d;
    ei_plan plan;
    void *plan_mem;
    int plan_ok, plan_owned, plan_trusted; /* trusted: produced by the library with the current ctx, not corrupted */
    ei_context *plan_ctx;
    ei_decoder dec;
    void *dec_mem;
    int dec_ok;
    ei_keep_set keep;
    int keep_ok;
} state;

static void plan_release(state *s) {
    if (s->plan_owned) ei_plan_free(s->plan_ctx, &s->plan);
    wfree(s->plan_mem);
    s->plan_mem = NULL;
    s->plan_ok = s->plan_owned = s->plan_trusted = 0;
    memset(&s->plan, 0, sizeof s->plan);
}
static void keep_release(state *s) {
    wfree(s->keep.index); wfree(s->keep.mask); wfree(s->keep.pooled);
    memset(&s->keep, 0, sizeof s->keep);
    s->keep_ok = 0;
}

static const ei_dtype dtypes[] = {EI_F32, EI_F16, EI_BF16, EI_F32, (ei_dtype)3, (ei_dtype)-1};

static void layer_new(state *s, fz *f) {
    static const int32_t dims[] = {8, 16, 1, 3, 7, 17, 32, 33, 64, 5, 24, 0, -1, EI_MAX_HEAD_DIM + 1};
    unsigned gsel = fz_u8(f);
    ei_dtype dt = FZ_PICK(f, dtypes);
    int64_t n = (int64_t)(fz_u16(f) % 200u) + 1;
    view_free(&s->q); view_free(&s->k); view_free(&s->v);
    s->plan_trusted = 0; /* the plan was made for other data */
    s->KV = (int32_t)(gsel % 4) + 1;
    s->H = s->KV * (int32_t)((gsel >> 2) % 4 + 1);
    if ((gsel >> 4) == 15) s->H = s->KV + 1;       /* not a GQA multiple */
    if ((gsel >> 4) == 14) { s->H = 0; }            /* no heads */
    s->d = FZ_PICK(f, dims);
    if ((gsel >> 4) == 13) n = 0;
    if ((gsel >> 4) == 12) n = -5;
    /* keep each input fast: dense attention costs n^2 H d */
    while (n > 8 && (double)n * (double)n * (double)(s->H > 0 ? s->H : 1) * (double)(s->d > 0 ? s->d : 1) > 4e6) n /= 2;
    s->n = n;
    rng_s = ((uint64_t)fz_u32(f) << 1) | 1u;
    view_make(&s->q, f, dt, n, s->H, s->d, (int)(fz_u8(f) % 9)); view_fill(&s->q, f);
    view_make(&s->k, f, dt, n, s->KV, s->d, (int)(fz_u8(f) % 9)); view_fill(&s->k, f);
    dt = FZ_PICK(f, dtypes); /* one read per statement: argument order is unspecified */
    view_make(&s->v, f, dt, n, s->KV, s->d, (int)(fz_u8(f) % 9)); view_fill(&s->v, f);
    describe("layer q", &s->q); describe("layer k", &s->k); describe("layer v", &s->v);
}

/* ------------------------------------------------------------ plan checks */
/* Always-kept blocks that lead a row of a segment that sees nvis blocks. */
static int64_t fz_forced(const ei_config *c, int64_t nvis) {
    int64_t n_sink, local0;
    return ei__forced_blocks(c, nvis, &n_sink, &local0);
}
static void plan_check(const state *s, const ei_context *ctx) {
    const ei_plan *p = &s->plan;
    const ei_config *c = ei_context_config(ctx);
    int32_t h, sg, i, j, bps = c->segment_size / c->block_size;
    ORACLE(p->n_segments >= 0 && p->n_segments <= p->seg_capacity, "n_segments outside capacity", p->n_segments, p->seg_capacity);
    ORACLE(p->n_blocks >= 0 && p->n_blocks <= p->blk_capacity, "n_blocks outside capacity", p->n_blocks, p->blk_capacity);
    for (h = 0; h < p->n_kv_heads; ++h) {
        ORACLE(p->head_class[h] <= 1, "head class", p->head_class[h], h);
        for (sg = 0; sg < p->n_segments; ++sg) {
            size_t row = (size_t)h * (size_t)p->seg_capacity + (size_t)sg;
            const int32_t *idx = p->block_index + row * (size_t)p->max_keep;
            int32_t cnt = p->keep_count[row];
            ORACLE(cnt >= 0 && cnt <= p->max_keep, "keep count above the row capacity max_keep", cnt, p->max_keep);
            ORACLE(p->keep_blocks[row] >= 0 && p->keep_blocks[row] <= p->max_keep, "keep_blocks above max_keep", p->keep_blocks[row], p->max_keep);
            ORACLE((int64_t)cnt <= (int64_t)sg * bps, "keep count not causal", cnt, sg);
            for (i = 0; i < cnt && i < p->max_keep; ++i) {
                ORACLE(idx[i] >= 0 && idx[i] < sg * bps && idx[i] < p->n_blocks, "block index out of range", idx[i], sg);
                for (j = 0; j < i; ++j) ORACLE(idx[j] != idx[i], "duplicate block", idx[i], sg);
                if (i > 0 && p->scores && c->ranking == EI_RANK_REFERENCE && i > fz_forced(c, (int64_t)sg * bps))
                    ORACLE(p->scores[row * (size_t)EI__MAX(p->blk_capacity, 1) + (size_t)idx[i - 1]] >=
                               p->scores[row * (size_t)EI__MAX(p->blk_capacity, 1) + (size_t)idx[i]],
                           "ranking not descending", i, sg);
            }
            if (!c->per_segment_budget)
                for (i = cnt; i < p->max_keep; ++i) ORACLE(idx[i] == -1, "padding not -1", idx[i], i);
        }
    }
}

static void op_plan_init(state *s, fz *f) {
    unsigned m = fz_u8(f);
    ei_context *ctx = (m & 1) ? s->alt : s->ctx;
    int64_t maxt = s->n > 0 ? s->n : 1;
    int32_t kv = s->KV, d = s->d;
    uint32_t flags = m >> 1 & 3u;
    size_t bytes = 0;
    ei_result r;
    plan_release(s);
    switch (fz_u8(f) % 8) {
        case 1: maxt += fz_u8(f); break;
        case 2: maxt = fz_u8(f) % 64 + 1; break;
        case 3: maxt = (m & 64) ? EI_MAX_TOKENS + 1 : 0; break;
        case 4: kv = (int32_t)(fz_u8(f) % 6); break;
        case 5: flags = fz_u8(f); break;
        default: break;
    }
    r = checked(ei_plan_size(ctx, maxt, kv, d, flags, &bytes));
    if (r != EI_OK) return;
    ORACLE(bytes > 0, "zero plan size", 0, 0);
    if (bytes > ((size_t)64 << 20)) return; /* too big for a fast input */
    if (m & 8) {
        r = checked(ei_plan_alloc(ctx, &s->plan, maxt, kv, d, flags));
        if (r == EI_OK) { s->plan_ok = s->plan_owned = 1; s->plan_ctx = ctx; }
    } else {
        size_t give = bytes, less;
        if (m & 16) { less = 1 + fz_u8(f) % 8; give = bytes > less ? bytes - less : 1; }
        s->plan_mem = walloc(give);
        r = checked(ei_plan_init(ctx, &s->plan, maxt, kv, d, flags, (m & 32) ? NULL : s->plan_mem, give));
        if (r == EI_OK) { s->plan_ok = 1; s->plan_ctx = ctx; ORACLE(give >= bytes, "plan accepted too small memory", give, bytes); }
        else { wfree(s->plan_mem); s->plan_mem = NULL; }
    }
    s->plan_trusted = 0;
}

static void *ws_for_profile(const state *s, const ei_context *ctx, fz *f, int64_t n, size_t *bytes, int mul) {
    size_t need = 0;
    unsigned m = fz_u8(f);
    if (checked(ei_profile_workspace_size(ctx, n, s->H, s->KV, s->d, &need)) != EI_OK) need = 64;
    if (need > ((size_t)64 << 20)) need = 64;
    need *= (size_t)mul;
    if ((m & 7) == 7 && need > 8) need -= 1 + (m >> 3) % 8; /* too small */
    *bytes = need;
    return walloc_profile(need);
}

static void after_profile(state *s, ei_result r, const ei_context *ctx) {
    if (r == EI_OK && s->plan_ok) {
        /* a plan made with another context may not be used with this one
           (its rows are sized for the other configuration) */
        s->plan_trusted = ctx == s->plan_ctx;
        plan_check(s, ctx);
    }
    /* padding is NaN and real elements are tame: a non-finite report means
       the library read outside the view */
    if (r == EI_ERR_NONFINITE)
        ORACLE(!(s->q.tame && s->k.tame && s->q.valid && s->k.valid), "NaN reported for finite input (padding read?)", 0, 0);
}

static void op_profile(state *s, fz *f, int kind) {
    ei_context *ctx = s->ctx;
    size_t wb;
    void *ws;
    ei_result r;
    ei_plan *p = (fz_u8(f) % 16 == 15) ? NULL : &s->plan;
    if (!s->plan_ok && p) p = (fz_u8(f) & 1) ? NULL : &s->plan; /* zeroed, uninitialised plan */
    if (kind == 0) {
        ws = ws_for_profile(s, ctx, f, s->n, &wb, 1);
        r = checked(ei_profile(ctx, &s->q.t, &s->k.t, p, (fz_u8(f) % 32 == 31) ? NULL : ws, wb));
    } else if (kind == 1) {
        int32_t a = (int32_t)(fz_u8(f) % 6) - 1, b = (int32_t)(fz_u8(f) % 6);
        ws = ws_for_profile(s, ctx, f, s->n, &wb, 1);
        r = checked(ei_profile_heads(ctx, &s->q.t, &s->k.t, p, a, b, ws, wb));
        if (r == EI_OK && (fz_u8(f) & 1)) {
            /* the rest of the heads, so the plan is whole */
            if (a > 0) checked(ei_profile_heads(ctx, &s->q.t, &s->k.t, p, 0, a, ws, wb));
            if (b < s->KV) checked(ei_profile_heads(ctx, &s->q.t, &s->k.t, p, b, s->KV, ws, wb));
            r = checked(ei_plan_finalize(ctx, p));
        }
        if (r == EI_OK) { s->plan_trusted = 0; wfree(ws); return; } /* partial plans are not checked */
    } else {
        int nt = (int)(fz_u8(f) % 5) - 1;
        ws = ws_for_profile(s, ctx, f, s->n, &wb, nt > 0 ? nt : 1);
        r = checked(ei_profile_mt(ctx, &s->q.t, &s->k.t, p, nt, ws, wb));
    }
    after_profile(s, r, ctx);
    wfree(ws);
}

/* Chunked planning: a chunk of queries in its own buffer at any position
   (continuing, rolling back or skipping), the keys so far in theirs with
   padding cells after them, or a final call without queries. */
static void op_chunk(state *s, fz *f) {
    ei_context *ctx = s->ctx;
    const ei_config *c = ei_context_config(ctx);
    int64_t off = s->plan_ok ? s->plan.n_tokens : 0, cnt;
    unsigned m = fz_u8(f);
    int is_final, no_queries;
    int64_t pad;
    view qc, kc;
    size_t wb = 0;
    void *ws;
    ei_result r;
    if (!s->q.valid || !s->k.valid || s->n <= 0 || s->q.t.n_tokens != s->k.t.n_tokens) return;
    if (m & 1) off = (int64_t)(fz_u8(f) % (unsigned)s->n);
    if (off >= s->n) return;
    cnt = (m & 2) ? (int64_t)c->segment_size * (1 + fz_u8(f) % 3) : (int64_t)(fz_u8(f) % 64) + 1;
    if (m & 4) cnt = s->n - off;
    if (off + cnt > s->n) cnt = s->n - off;
    is_final = off + cnt == s->n ? !(m & 8) : (m & 16) != 0;
    pad = (m & 32) ? (int64_t)(fz_u8(f) % (unsigned)(s->n - off - cnt + 1)) : 0;
    no_queries = (m & 72) == 72 && s->plan_ok; /* finalise where the plan ends */
    if (no_queries) { off = s->plan.n_tokens; cnt = 0; is_final = 1; pad = s->n - off; }
    if (!no_queries) view_rows(&qc, &s->q, off, cnt, f);
    view_rows_padded(&kc, &s->k, 0, off + cnt, pad, f); /* padding cells are NaN: never read */
    if (checked(ei_profile_workspace_size(ctx, s->plan_ok ? s->plan.max_tokens : s->n, s->H, s->KV, s->d, &wb)) != EI_OK ||
        wb > ((size_t)64 << 20))
        wb = 64;
    if ((m & 96) == 96 && wb > 8) wb -= 8;
    ws = walloc_profile(wb);
    if (m & 128) {
        int32_t a = (int32_t)(fz_u8(f) % 5), b = (int32_t)(fz_u8(f) % 5);
        r = checked(ei_profile_chunk_heads(ctx, no_queries ? NULL : &qc.t, &kc.t, s->plan_ok ? &s->plan : NULL, off, is_final,
                                           a, b, ws, wb));
        if (r == EI_OK) s->plan_trusted = 0;
    } else {
        r = checked(ei_profile_chunk(ctx, no_queries ? NULL : &qc.t, &kc.t, s->plan_ok ? &s->plan : NULL, off, is_final,
                                     ws, wb));
        /* a chunk rewrites only its own segments: a plan corrupted earlier stays
           untrusted unless this chunk started it (offset 0 rewrites every row) */
        if (r == EI_OK) {
            s->plan_trusted = (s->plan_trusted || (off == 0 && !no_queries)) && ctx == s->plan_ctx;
            if (s->plan_trusted) plan_check(s, ctx);
        }
    }
    wfree(ws);
    if (!no_queries) view_free(&qc);
    view_free(&kc);
}

static void op_corrupt(state *s, fz *f) {
    ei_plan *p = &s->plan;
    static const int32_t vals[] = {-1, -2, INT32_MIN, INT32_MAX, 0, 1, 1 << 20, 65535, 7};
    size_t rows, i;
    unsigned which = fz_u8(f) % 5;
    int32_t x;
    if (!s->plan_ok) return;
    rows = (size_t)p->n_kv_heads * (size_t)p->seg_capacity;
    x = (fz_u8(f) & 1) ? FZ_PICK(f, vals) : (int32_t)(fz_u8(f) % 64) - 8;
    if (fz_u8(f) % 4 == 0) x = (int32_t)((uint32_t)x + (uint32_t)p->n_blocks);
    switch (which) {
        case 0: if (p->max_keep > 0) p->block_index[fz_u32(f) % (rows * (size_t)p->max_keep)] = x; break;
        case 1: p->keep_count[fz_u32(f) % rows] = x; break;
        case 2: p->keep_blocks[fz_u32(f) % rows] = x; break;
        case 3: p->head_class[fz_u32(f) % (size_t)p->n_kv_heads] = (uint8_t)x; break;
        default: /* every row of one head points at one block */
            for (i = 0; i < rows * (size_t)p->max_keep; ++i) p->block_index[i] = x;
            break;
    }
    s->plan_trusted = 0;
}

/* ------------------------------------------------------------ attention */
/* The output against check.h's double-precision reference (FORMAT.md
   semantics), token by token, up to the first token with a logit beyond
   float range: the kernels clamp those to +-FLT_MAX by design, so the
   reference does not apply from there on. */
static int attention_matches(const ei_context *ctx, const ei_plan *plan, const view *q, const view *k, const view *v,
                             const ei_out_tensor *o, int64_t q_off) {
    int32_t H = q->t.n_heads, d = q->t.head_dim, h, i;
    int64_t t;
    /* f32 arithmetic: summation order only; the AVX-512 BF16 kernel
       (q, k, v all bf16) rounds the weights to bf16 (~2^-9) */
    int all_bf16 = q->t.dtype == EI_BF16 && k->t.dtype == EI_BF16 && v->t.dtype == EI_BF16, ok = 1;
    double tol = (o->dtype != EI_F32 ? 1e-2 : all_bf16 ? 4e-3 : 2e-4) * (1.0 + ref_vmax(&v->t, -1));
    double *ref = (double *)xalloc(sizeof(double) * (size_t)H * (size_t)d);
    for (t = 0; t < q->t.n_tokens && ok; ++t) {
        if (!ref_attention_token(ei_context_config(ctx), plan, &q->t, &k->t, &v->t, q_off, t, ref)) break;
        for (h = 0; h < H && ok; ++h)
            for (i = 0; i < d; ++i) {
                double want = ref[(size_t)h * (size_t)d + (size_t)i];
                float got = load_el(o->data, o->dtype, (size_t)(t * o->token_stride + (int64_t)h * o->head_stride + i));
                if (!(fabs((double)got - want) <= tol)) {
                    fprintf(stderr, "attention mismatch at token %lld head %d dim %d: %g vs reference %g\n",
                            (long long)(q_off + t), (int)h, (int)i, (double)got, want);
                    ok = 0;
                    break;
                }
            }
    }
    free(ref);
    return ok;
}

static void op_attention(state *s, fz *f, int threaded) {
    ei_context *ctx = s->ctx;
    unsigned m = fz_u8(f);
    int64_t q_off = 0, cnt = s->n;
    view qc, kc, vc;
    view ov;
    ei_out_tensor out;
    size_t wb = 0, per = 0;
    void *ws;
    const ei_plan *plan = (m & 1) && s->plan_ok ? &s->plan : NULL;
    int ith, nth, all_ok = 1;
    ei_result r = EI_OK;
    static const int nths[] = {1, 2, 3, 1, 0, -1, 4};
    if (!s->q.valid || !s->k.valid || !s->v.valid || s->n <= 0) {
        /* invalid views: the library must refuse them without reading */
        ei_out_tensor o0 = ei_out_tensor_make(NULL, EI_F32, 1, 1, 1);
        float one = 0;
        o0.data = &one;
        r = checked(ei_attention_workspace_size(ctx, s->H, s->KV, s->d, &wb));
        ws = walloc(r == EI_OK && wb < ((size_t)64 << 20) ? wb : 64);
        checked(ei_attention_prefill(ctx, &s->q.t, &s->k.t, &s->v.t, NULL, &o0, 0, 0, 1, ws, r == EI_OK ? wb : 64));
        wfree(ws);
        return;
    }
    if (m & 2) { /* a chunk of queries at an offset */
        q_off = (int64_t)(fz_u8(f) % (unsigned)s->n);
        if (m & 4) q_off -= q_off % ei_context_config(ctx)->segment_size;
        cnt = (int64_t)(fz_u8(f) % (unsigned)(s->n - q_off)) + 1;
    }
    view_rows(&qc, &s->q, q_off, cnt, f);
    {
        int64_t nk = q_off + cnt;
        if ((m & 24) == 24) nk = (m & 32) ? nk - 1 : nk + (nk < s->n); /* disagreeing shapes */
        if (nk <= 0) nk = 1;
        view_rows(&kc, &s->k, 0, nk, f);
        view_rows(&vc, &s->v, 0, nk, f);
    }
    if ((m & 24) == 24 && (m & 64)) q_off = -q_off - 1;
    {
        ei_dtype odt = FZ_PICK(f, dtypes);
        view_make(&ov, f, odt, cnt, s->H, s->d, (int)(fz_u8(f) % 9));
    }
    if (!poison_off()) memset(ov.buf, poison_byte(), ov.elems * dtype_size(ov.t.dtype)); /* garbage until written */
    memcpy(&out, &ov.t, sizeof out); /* same layout, writable */
    out.data = ov.buf;
    if (verbose > 0) {
        fprintf(stderr, "  attention: q_offset %lld, plan %s\n", (long long)q_off, plan ? "yes" : "NULL");
        describe("q", &qc); describe("k", &kc); describe("v", &vc); describe("out", &ov);
    }
    r = checked(ei_attention_workspace_size(ctx, s->H, s->KV, s->d, &per));
    if (r != EI_OK || per > ((size_t)64 << 20)) per = 64;
    if (threaded) {
        int nt = (int)(fz_u8(f) % 4);
        wb = per * (size_t)(nt > 0 ? nt : 1);
        if (fz_u8(f) % 8 == 7 && wb > 0) wb--;
        ws = walloc(wb);
        r = checked(ei_attention_prefill_mt(ctx, &qc.t, &kc.t, &vc.t, plan, &out, q_off, nt, ws, wb));
        all_ok = r == EI_OK;
    } else {
        nth = FZ_PICK(f, nths);
        if (verbose > 0) fprintf(stderr, "  nth %d\n", nth);
        wb = per;
        if (fz_u8(f) % 8 == 7 && wb > 0) wb--;
        ws = walloc(wb);
        if (fz_u8(f) % 8 == 7) { /* a single odd call */
            ith = (int)(fz_u8(f) % 6) - 1;
            r = checked(ei_attention_prefill(ctx, &qc.t, &kc.t, &vc.t, plan, &out, q_off, ith, nth, ws, wb));
            all_ok = 0;
        } else
            for (ith = 0; ith < (nth > 0 ? nth : 1); ++ith) {
                r = checked(ei_attention_prefill(ctx, &qc.t, &kc.t, &vc.t, plan, &out, q_off, ith, nth, ws, wb));
                if (r != EI_OK) { all_ok = 0; break; }
            }
    }
    if (all_ok && r == EI_OK && qc.tame && kc.tame && vc.tame && ov.valid && (!plan || (s->plan_trusted && s->plan_ctx == ctx && plan->n_kv_heads == s->KV)) &&
        ei_context_backend(ctx) == EI_BACKEND_CPU) {
        if (!attention_matches(ctx, plan, &qc, &kc, &vc, &out, q_off)) fz_fail("attention differs from the reference", q_off, cnt);
    }
    wfree(ws);
    view_free(&qc); view_free(&kc); view_free(&vc); view_free(&ov);
}

/* ------------------------------------------------------------ decode */
static void op_decoder_init(state *s, fz *f) {
    unsigned m = fz_u8(f);
    int32_t H = s->H, KV = s->KV, d = s->d;
    size_t need = 0, give;
    memset(&s->dec, 0, sizeof s->dec);
    wfree(s->dec_mem);
    s->dec_mem = NULL;
    s->dec_ok = 0;
    if (m & 1) H = (int32_t)(fz_u8(f) % 10) - 1;
    if (m & 2) KV = (int32_t)(fz_u8(f) % 10) - 1;
    if (checked(ei_decoder_size(s->ctx, H, d, &need)) != EI_OK || need > ((size_t)64 << 20)) need = 64;
    give = (m & 4) ? need - 1 : need;
    s->dec_mem = walloc(give);
    if (checked(ei_decoder_init(s->ctx, &s->dec, H, KV, d, (m & 8) ? NULL : s->dec_mem, give)) == EI_OK) s->dec_ok = 1;
}

static void op_observe(state *s, fz *f) {
    unsigned m = fz_u8(f);
    int64_t t0, cnt;
    view qc;
    if (!s->q.valid || s->n <= 0) {
        checked(ei_decode_observe(s->ctx, s->dec_ok ? &s->dec : NULL, &s->q.t, (int)(m & 1)));
        return;
    }
    t0 = (int64_t)(fz_u8(f) % (unsigned)s->n);
    cnt = (m & 2) ? 1 : (int64_t)(fz_u8(f) % (unsigned)(s->n - t0)) + 1;
    if (t0 + cnt > s->n) cnt = s->n - t0;
    view_rows(&qc, &s->q, t0, cnt, f);
    checked(ei_decode_observe(s->ctx, (m & 4) && !s->dec_ok ? NULL : &s->dec, &qc.t, (int)(m & 1)));
    (void)ei_decode_due(s->ctx, &s->dec);
    view_free(&qc);
}

/* Decode keep sets over a row map (positions shuffled over the rows, an empty
   row, a garbage entry), scoring split over threads, per-head or shared. */
static void op_decode_rows(state *s, fz *f) {
    ei_context *ctx = s->ctx;
    const ei_config *c = ei_context_config(ctx);
    unsigned m = fz_u8(f);
    int64_t n = s->n, j;
    int32_t *map, h, i;
    int nth, ith;
    float *scores, *shared;
    size_t wb = 0;
    void *ws;
    ei_keep_set ks;
    ei_result r = EI_OK;
    if (!s->k.valid || n <= 0 || !s->dec_ok || (size_t)n * (size_t)s->H > ((size_t)16 << 20)) return;
    map = (int32_t *)walloc(sizeof(int32_t) * (size_t)n);
    for (j = 0; j < n; ++j) map[j] = (int32_t)j;
    for (j = n - 1; j > 0; --j) {
        int64_t x = (int64_t)(fz_u16(f) % (unsigned)(j + 1));
        int32_t t = map[j];
        map[j] = map[x]; map[x] = t;
    }
    if (m & 1) map[fz_u16(f) % (unsigned)n] = -1;
    if (m & 2) map[fz_u16(f) % (unsigned)n] = (int32_t)fz_u32(f);
    if (checked(ei_decode_workspace_size(ctx, n, s->H, s->KV, &wb)) != EI_OK || wb > ((size_t)256 << 20)) wb = 64;
    ws = walloc(wb);
    scores = (float *)walloc(sizeof(float) * (size_t)s->H * (size_t)n);
    shared = (float *)walloc(sizeof(float) * (size_t)n);
    memset(shared, 0, sizeof(float) * (size_t)n);
    nth = 1 + (int)(fz_u8(f) % 4u);
    for (ith = 0; ith < nth && r == EI_OK; ++ith)
        r = checked(ei_decode_score(ctx, &s->dec, &s->k.t, map, 0, scores, ith, nth, ws, wb));
    memset(&ks, 0, sizeof ks);
    ks.heads_out = (m & 4) ? 1 : c->per_kv_head ? s->KV : s->H;
    ks.capacity = (int32_t)EI__MIN(n, (int64_t)c->decode_budget);
    ks.index = (int32_t *)walloc(sizeof(int32_t) * (size_t)ks.heads_out * (size_t)ks.capacity);
    ks.positions = (int32_t *)walloc(sizeof(int32_t) * (size_t)ks.heads_out * (size_t)ks.capacity);
    ks.row_pos = map;
    if (r == EI_OK) {
        if (m & 4) {
            r = checked(ei_decode_shared_add(ctx, &s->dec, scores, n, map, shared, ws, wb));
            if (r == EI_OK) r = checked(ei_decode_select_shared(ctx, &s->dec, shared, n, &ks, ws, wb));
        } else {
            r = checked(ei_decode_select(ctx, &s->dec, scores, n, &ks, ws, wb));
        }
    }
    if (r == EI_OK)
        for (h = 0; h < ks.heads_out; ++h)
            for (i = 0; i < ks.n_kept; ++i) {
                int32_t row = ks.index[(size_t)h * (size_t)ks.capacity + (size_t)i];
                ORACLE(row >= 0 && row < n && (i == 0 || row > ks.index[(size_t)h * (size_t)ks.capacity + (size_t)i - 1]),
                       "kept rows not ascending in range", row, i);
                ORACLE(map[row] >= 0 && ks.positions[(size_t)h * (size_t)ks.capacity + (size_t)i] == map[row],
                       "kept row's position is not its map entry", row, map[row]);
            }
    wfree(ks.index); wfree(ks.positions); wfree(scores); wfree(shared); wfree(ws); wfree(map);
}

static void op_decode_keep(state *s, fz *f) {
    ei_context *ctx = s->ctx;
    const ei_config *c = ei_context_config(ctx);
    unsigned m = fz_u8(f);
    int64_t n = s->n;
    view kc;
    size_t wb = 0;
    void *ws;
    ei_keep_set *ks = &s->keep;
    ei_result r;
    int32_t heads_out;
    if (!s->k.valid || s->n <= 0) {
        checked(ei_decode_keep(ctx, &s->dec, &s->k.t, &s->keep, NULL, 0));
        return;
    }
    keep_release(s);
    if (m & 1) n = (int64_t)(fz_u8(f) % (unsigned)s->n) + 1;
    view_rows(&kc, &s->k, 0, n, f);
    heads_out = c->per_kv_head ? s->KV : s->H;
    if (m & 2) heads_out = (int32_t)(fz_u8(f) % 9);
    ks->heads_out = heads_out;
    ks->capacity = (int32_t)EI__MIN(n, (int64_t)c->decode_budget);
    if (m & 4) ks->capacity += (int32_t)(fz_u8(f) % 5) - 2;
    if (heads_out > 0 && ks->capacity > 0 && ks->capacity < (1 << 20)) {
        ks->index = (int32_t *)walloc(sizeof(int32_t) * (size_t)heads_out * (size_t)ks->capacity);
        if (m & 8) {
            ks->mask_capacity = n - ((m & 16) ? 1 : 0);
            if (ks->mask_capacity > 0) ks->mask = (uint8_t *)walloc((size_t)heads_out * (size_t)ks->mask_capacity);
        }
        if (m & 32) {
            ks->pooled_capacity = n - EI__MIN((int64_t)c->window, n) - ((m & 64) ? 1 : 0);
            if (ks->pooled_capacity > 0) ks->pooled = (float *)walloc(sizeof(float) * (size_t)heads_out * (size_t)ks->pooled_capacity);
        }
    }
    if (checked(ei_decode_workspace_size(ctx, n, s->H, s->KV, &wb)) != EI_OK || wb > ((size_t)256 << 20)) wb = 64;
    if ((m & 128) && wb > 0) wb -= 1;
    ws = walloc(wb);
    r = checked(ei_decode_keep(ctx, s->dec_ok ? &s->dec : NULL, &kc.t, ks, ws, wb));
    if (r == EI_OK) {
        int32_t h, i;
        ORACLE(ks->n_kept >= 0 && ks->n_kept <= ks->capacity, "n_kept outside capacity", ks->n_kept, ks->capacity);
        ORACLE(ks->n_kept == (int32_t)EI__MIN(n, (int64_t)c->decode_budget), "n_kept is not min(n, budget)", ks->n_kept, n);
        for (h = 0; h < ks->heads_out; ++h) {
            const int32_t *idx = ks->index + (size_t)h * (size_t)ks->capacity;
            for (i = 0; i < ks->n_kept; ++i) {
                ORACLE(idx[i] >= 0 && idx[i] < n && (i == 0 || idx[i] > idx[i - 1]), "keep index not ascending in range", idx[i], i);
                if (ks->mask) ORACLE(ks->mask[(size_t)h * (size_t)ks->mask_capacity + (size_t)idx[i]] == 1, "mask disagrees", h, i);
            }
        }
        if (ks->compressed) { /* the observation window's positions are always kept, last */
            int64_t W = EI__MIN((int64_t)c->window, s->dec.n_observed);
            for (h = 0; h < ks->heads_out; ++h)
                for (i = 0; i < W; ++i)
                    ORACLE(ks->index[(size_t)h * (size_t)ks->capacity + (size_t)(ks->n_kept - W + i)] == n - W + i,
                           "window position not kept", h, i);
        }
        s->keep_ok = 1;
    }
    wfree(ws);
    view_free(&kc);
}

/* Compaction with the last keep set or an arbitrary one, on K/V caches in exact buffers. */
static void op_compact(state *s, fz *f) {
    unsigned m = fz_u8(f);
    ei_keep_set ks;
    int32_t *index = NULL;
    view kv[2];
    ei_out_tensor o[2];
    void *orig[2] = {NULL, NULL};
    int w, use[2];
    int32_t h, i, heads;
    int64_t n;
    ei_result r;
    memset(&ks, 0, sizeof ks);
    if (s->keep_ok && (m & 1)) {
        ks = s->keep;
        ks.mask = NULL; ks.pooled = NULL;
    } else {
        ks.heads_out = (int32_t)(fz_u8(f) % 5);
        ks.capacity = (int32_t)(fz_u8(f) % 40);
        ks.n_kept = (int32_t)(fz_u8(f) % 44) - 2;
        ks.n_tokens = (int64_t)(fz_u8(f) % 60) - 2;
        if (ks.heads_out > 0 && ks.capacity > 0) {
            index = (int32_t *)xalloc(sizeof(int32_t) * (size_t)ks.heads_out * (size_t)ks.capacity);
            for (h = 0; h < ks.heads_out; ++h) {
                int32_t pos = 0;
                for (i = 0; i < ks.capacity; ++i) {
                    unsigned b = fz_u8(f);
                    pos = (int32_t)((uint32_t)pos + b % 4u);
                    if (b >= 250) pos = (int32_t)fz_u32(f); /* arbitrary */
                    index[(size_t)h * (size_t)ks.capacity + (size_t)i] = (int32_t)((uint32_t)pos + (uint32_t)i);
                }
            }
        }
        ks.index = (m & 2) ? NULL : index;
    }
    heads = ks.heads_out > 0 ? ks.heads_out : 1;
    n = ks.n_tokens > 0 ? ks.n_tokens : 1;
    if (m & 4) n += (int64_t)(fz_u8(f) % 4) - 1;
    if (n <= 0) n = 1;
    for (w = 0; w < 2; ++w) {
        use[w] = !((m >> (3 + w)) & 1);
        ei_dtype cdt = FZ_PICK(f, dtypes);
        view_make(&kv[w], f, cdt, n, (m & 32) ? heads + 1 : heads, s->d > 0 ? s->d : 4, (int)(fz_u8(f) % 9));
        rng_s = rng_s ? rng_s : 1;
        view_fill(&kv[w], f);
        memcpy(&o[w], &kv[w].t, sizeof o[w]);
        o[w].data = kv[w].buf;
        orig[w] = xalloc(kv[w].elems * dtype_size(kv[w].t.dtype));
        memcpy(orig[w], kv[w].buf, kv[w].elems * dtype_size(kv[w].t.dtype));
    }
    r = checked(ei_kv_compact((m & 64) ? NULL : s->ctx, (m & 128) ? NULL : &ks, use[0] ? &o[0] : NULL, use[1] ? &o[1] : NULL));
    if (r == EI_OK && !(m & 128))
        for (w = 0; w < 2; ++w) {
            size_t rb;
            if (!use[w]) continue;
            rb = (size_t)o[w].head_dim * dtype_size(o[w].dtype);
            for (h = 0; h < ks.heads_out; ++h)
                for (i = 0; i < ks.n_kept; ++i) {
                    int32_t src = ks.index[(size_t)h * (size_t)ks.capacity + (size_t)i];
                    ORACLE(src >= i && src < n, "compaction accepted a bad index", src, i);
                    ORACLE(!memcmp((char *)kv[w].buf + el_index(&kv[w].t, i, h, 0) * dtype_size(o[w].dtype),
                                   (char *)orig[w] + el_index(&kv[w].t, src, h, 0) * dtype_size(o[w].dtype), rb),
                           "compaction moved the wrong row", h, i);
                }
        }
    for (w = 0; w < 2; ++w) { view_free(&kv[w]); free(orig[w]); }
    free(index);
}

/* ------------------------------------------------------------ size queries */
#ifdef __SIZEOF_INT128__
typedef unsigned __int128 u128;
#else
typedef unsigned long long u128;
#endif
static void op_sizes(state *s, fz *f) {
    static const int64_t toks[] = {1, 2, 511, 512, 513, 4096, EI_MAX_TOKENS, EI_MAX_TOKENS + 1, 0, -1, INT64_MAX, INT64_MIN};
    static const int32_t heads[] = {1, 2, 8, 64, EI_MAX_HEADS, EI_MAX_HEADS + 1, 0, -1, INT32_MAX, 3};
    static const int32_t dims[] = {1, 64, 128, EI_MAX_HEAD_DIM, EI_MAX_HEAD_DIM + 1, 0, -1, INT32_MAX};
    ei_context *ctx = (fz_u8(f) & 1) ? s->alt : s->ctx;
    const ei_config *c = ei_context_config(ctx);
    int64_t n = FZ_PICK(f, toks);
    int32_t H = FZ_PICK(f, heads), KV = FZ_PICK(f, heads), d = FZ_PICK(f, dims);
    size_t b = 0;
    uint32_t flags = fz_u8(f) % 4;
    if (checked(ei_plan_size(ctx, n, KV, d, flags, &b)) == EI_OK) {
        u128 segs = (u128)((n + c->segment_size - 1) / c->segment_size);
        ORACLE((u128)b >= segs * (u128)KV * 16u, "plan size wrapped", (long)b, n);
    }
    if (checked(ei_profile_workspace_size(ctx, n, H, KV, d, &b)) == EI_OK)
        ORACLE((u128)b >= (u128)d * 8u, "profile workspace too small", (long)b, d);
    if (checked(ei_decode_workspace_size(ctx, n, H, KV, &b)) == EI_OK)
        ORACLE((u128)b >= (u128)H * (u128)n * 4u + (u128)32 * (u128)n * 4u + (u128)n * 32u, "decode workspace wrapped", (long)b, n);
    if (checked(ei_decoder_size(ctx, H, d, &b)) == EI_OK)
        ORACLE((u128)b >= (u128)c->window * (u128)H * (u128)d * 4u, "decoder size wrapped", (long)b, H);
    if (checked(ei_attention_workspace_size(ctx, H, KV, d, &b)) == EI_OK) ORACLE(b > 0, "zero attention workspace", 0, 0);
    checked(ei_plan_size(ctx, n, KV, d, flags, NULL));
    checked(ei_plan_size(NULL, n, KV, d, flags, &b));
    { /* GPU-memory helpers: on a CPU context a clear EI_ERR_UNSUPPORTED (or EI_ERR_NULL) */
        void *dp = NULL;
        char buf[16] = {0};
        ei_plan dst;
        unsigned m = fz_u8(f);
        memset(&dst, 0, sizeof dst);
        checked(ei_device_alloc(ctx, (m & 1) ? &dp : NULL, (size_t)fz_u16(f)));
        ei_device_free(ctx, dp);
        checked(ei_device_copy(ctx, (m & 2) ? buf : NULL, buf + 8, 8, (int)(m >> 4) - 1));
        checked(ei_plan_copy((m & 4) ? ctx : NULL, &dst, s->plan_ok ? &s->plan : NULL, (int)(m >> 5) - 1));
        ORACLE(dst.entropy == NULL, "ei_plan_copy wrote a plan on a CPU context", 0, 0);
    }
    (void)ei_plan_segment_is_sparse(ctx, s->plan_ok ? &s->plan : NULL, (int32_t)fz_u32(f));
    (void)ei_simd_name((ei_simd)(int32_t)fz_u32(f));
    (void)ei_cpu_supports((ei_simd)(int32_t)fz_u8(f));
    (void)ei_result_string((ei_result)(int8_t)fz_u8(f));
}

/* ------------------------------------------------------------ driver */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f;
    state s;
    int ops = 0;
    f.p = data; f.n = size; f.i = 0;
    if (verbose < 0) verbose = getenv("EI_FUZZ_VERBOSE") != NULL;
    memset(&s, 0, sizeof s);
    n_alloc_calls = 0; fail_after = -1; poison_count = 0;
    s.ctx = fz_context(&f);
    if (verbose) {
        const ei_config *c = ei_context_config(s.ctx);
        fprintf(stderr, "ctx: segment %d block %d threshold %lld base %d factors %g..%g per_segment %d decode %d window %d gap %d simd %s\n",
                (int)c->segment_size, (int)c->block_size, (long long)c->threshold_len, (int)c->base_budget, c->budget_min_factor,
                c->budget_max_factor, (int)c->per_segment_budget, (int)c->decode_budget, (int)c->window, (int)c->decode_gap,
                ei_simd_name(ei_context_simd(s.ctx)));
    }
    fail_after = -1;
    s.alt = fz_context(&f);
    fail_after = -1;
    layer_new(&s, &f);
    while (fz_left(&f) && ops++ < 48) {
        unsigned op = fz_u8(&f) % 20;
        if (verbose) fprintf(stderr, "op %u at byte %zu\n", op, f.i - 1);
        switch (op) {
            case 0: op_plan_init(&s, &f); break;
            case 1: case 2: op_profile(&s, &f, 0); break;
            case 3: op_profile(&s, &f, 1); break;
            case 4: op_profile(&s, &f, 2); break;
            case 5: op_chunk(&s, &f); break;
            case 6:
                if (s.plan_ok && (fz_u8(&f) & 1)) { checked(ei_plan_reset(&s.plan)); s.plan_trusted = 0; }
                else checked(ei_plan_finalize(s.ctx, s.plan_ok ? &s.plan : NULL));
                break;
            case 7: op_corrupt(&s, &f); break;
            case 8: case 9: op_attention(&s, &f, 0); break;
            case 10: op_attention(&s, &f, 1); break;
            case 11: op_decoder_init(&s, &f); break;
            case 12: case 13: op_observe(&s, &f); break;
            case 14: if (fz_u8(&f) < 64) op_decode_rows(&s, &f); else op_decode_keep(&s, &f); break;
            case 15: op_compact(&s, &f); break;
            case 16: if (s.dec_ok) checked(ei_decoder_reset(&s.dec)); else checked(ei_decoder_reset(NULL)); break;
            case 17: op_sizes(&s, &f); break;
            case 18: layer_new(&s, &f); break;
            default: { ei_context *t = s.ctx; s.ctx = s.alt; s.alt = t; break; } /* plans meet the other context */
        }
    }
    plan_release(&s);
    keep_release(&s);
    wfree(s.dec_mem);
    view_free(&s.q); view_free(&s.k); view_free(&s.v);
    ei_context_destroy(s.ctx);
    ei_context_destroy(s.alt);
    return 0;
}

#ifdef EI_FUZZ_STANDALONE
/* Replay: every file named, or every file in every folder named, once. */
static int replay_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    uint8_t *buf;
    long len;
    if (!fp) { fprintf(stderr, "cannot open %s\n", path); return 1; }
    fseek(fp, 0, SEEK_END);
    len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    buf = (uint8_t *)xalloc((size_t)(len > 0 ? len : 1));
    if (len > 0 && fread(buf, 1, (size_t)len, fp) != (size_t)len) { fclose(fp); free(buf); return 1; }
    fclose(fp);
    LLVMFuzzerTestOneInput(buf, (size_t)(len > 0 ? len : 0));
    free(buf);
    return 0;
}
int main(int argc, char **argv) {
    int i, files = 0, bad = 0;
    for (i = 1; i < argc; ++i) {
        struct stat st;
        if (stat(argv[i], &st) != 0) { fprintf(stderr, "no such input: %s\n", argv[i]); bad++; continue; }
        if (S_ISDIR(st.st_mode)) {
            DIR *dir = opendir(argv[i]);
            struct dirent *e;
            char path[4096];
            while (dir && (e = readdir(dir)) != NULL) {
                if (e->d_name[0] == '.') continue;
                snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
                if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) { bad += replay_file(path); files++; }
            }
            if (dir) closedir(dir);
        } else { bad += replay_file(argv[i]); files++; }
    }
    printf("fuzz replay: %d inputs, %d unreadable\n", files, bad);
    return bad ? 1 : 0;
}
#endif
