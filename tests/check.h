/* check.h - the test support of entropyinfer, used by every test. Include it
   after the implementation:

       #define ENTROPYINFER_IMPLEMENTATION
       #include "../entropyinfer.h"
       #include "check.h"

   checks      CHECK(cond, fmt, ...), CHECK_ERR(expr, code), check_summary()
   tolerances  test_tols[TOL_*]: every comparison's limits, per operation, in one
               table; tol_out_rounding; l2_acc / l2_add / check_l2 (relative L2
               and max-abs error of an output: the one helper)
   guards      guarded_alloc(n) / guarded_alloc_at(n, offset), guard_intact,
               guarded_free; guarded_out_* (an output view with guards and
               padding between tokens)
   data        dtype_size, dtype_name, to_dtype (a copy in f16/bf16 through the
               header's converters), round_to_dtype, close_to, env_int,
               test_simd_selected (EI_TEST_SIMD), print_simd_paths;
               synth_layer_* (examples/synth_qk.h layers with q, k, v)
   golden      golden_meta, golden_read_meta, golden_load, golden_cases,
               golden_config (the case format: golden/FORMAT.md)
   reference   ref_attention / ref_attention_token: sparse prefill attention
               in double (FORMAT.md "Sparse prefill attention", the header's
               >>attention); ref_vmax; ref_budget, ref_keep_blocks,
               ref_budget_on_edge: the budget walk on the header's own rules
               (ei__budget_next, ei__keep_of, ei__cap_blocks); ref_sampled_mass
               (and _given: the rows a chunked plan holds; _rows: spread rows
               or not, told), ref_antidiag_mass_given
               (EI_RANK_ANTIDIAGONAL), ref_ranking_mass_given (either),
               ref_check_ranked_row (the ranking options); ref_decode_scores
               (decode scoring with row maps)
   backends    side (a CPU or CUDA context), mem_new / mem_up / mem_down /
               mem_put / mem_get / mem_del (guarded host or device memory);
               plan_row_compare (a plan row of another backend against the
               CPU's, up to near-ties); keep_host, keep_new / keep_take /
               keep_check_one / keep_compare (keep sets, up to near-ties)

   Every function is static inline (and unused-tolerant): a test pays only
   for what it calls, and -Wall -Wextra -Werror stays clean as C and C++.

   Define before including, when needed:
     CHECK_LOCK() / CHECK_UNLOCK()   serialise reports (threaded tests)
     CHECK_ERR_REACHED(code)         called when an error code and a message
                                     naming it were both seen */
#ifndef EI_TEST_CHECK_H
#define EI_TEST_CHECK_H
#ifndef ENTROPYINFER_IMPLEMENTATION_DONE
#error "check.h: include it after the implementation (#define ENTROPYINFER_IMPLEMENTATION, #include entropyinfer.h)"
#endif
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../examples/synth_qk.h"

#if defined(__GNUC__) || defined(__clang__)
#define CHECK_UNUSED __attribute__((unused))
#else
#define CHECK_UNUSED
#endif
#define CHECK_FN static inline CHECK_UNUSED

/* ------------------------------------------------------------ checks */
#ifndef CHECK_LOCK
#define CHECK_LOCK() ((void)0)
#define CHECK_UNLOCK() ((void)0)
#endif
#ifndef CHECK_ERR_REACHED
#define CHECK_ERR_REACHED(code) ((void)0)
#endif

static int failures CHECK_UNUSED = 0, checks CHECK_UNUSED = 0;
#define CHECK(cond, ...)                                                           \
    do {                                                                           \
        CHECK_LOCK();                                                              \
        checks++;                                                                  \
        if (!(cond)) {                                                             \
            failures++;                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                            \
            printf(__VA_ARGS__);                                                   \
            printf("\n");                                                          \
        }                                                                          \
        CHECK_UNLOCK();                                                            \
    } while (0)
/* An expected result code, and (for errors) a message that names it. */
#define CHECK_ERR(expr, code)                                                      \
    do {                                                                           \
        ei_result r_ = (expr);                                                     \
        CHECK(r_ == (code), "%s returned %s, expected %s (%s)", #expr, ei_result_name(r_), #code, ei_last_error()); \
        if (r_ == (code) && r_ != EI_OK) {                                         \
            CHECK(strstr(ei_last_error(), #code) != NULL, "message '%s' lacks %s", ei_last_error(), #code); \
            if (strstr(ei_last_error(), #code)) CHECK_ERR_REACHED(r_);             \
        }                                                                          \
        if (r_ == EI_OK && (code) == EI_OK) CHECK_ERR_REACHED(EI_OK);              \
    } while (0)

/* The last line of every test ("N checks, M failed") and its exit status. */
CHECK_FN int check_summary(void) {
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}

/* ------------------------------------------------------------ tolerances: the one table */
/* How far two runs of one operation may differ, per operation, for every
   test that compares (test_ops, test_backends, test_cuda, fuzz_backends,
   test_attention): a path or backend against the scalar reference or a
   double-precision one. rel_l2: ||got - ref|| / ||ref|| over an output;
   max_abs: the largest |got - ref| in units of max|v| (attention) or of 1;
   rel / abs: per element, |got - ref| <= abs + rel |ref|; tie: the relative
   margin within which two ranking scores are a near-tie (plans, keep sets).
   0 everywhere: bit-identical. Why each value is what it is: `why`. */
typedef enum test_tol_op {
    TOL_ENTROPY,          /* plan entropies, a path or backend against another */
    TOL_BUDGET,           /* plan budgets in tokens (the recurrence of entropies TOL_ENTROPY apart) */
    TOL_RANK_REFERENCE,   /* near-ties of the reference ranking's softmaxed block scores */
    TOL_RANK_SAMPLED,     /* near-ties of the sampled ranking's masses (ACCURACY ACROSS PATHS: 1e-3, twice) */
    TOL_ATTN_CPU,         /* attention (prefill, decode, keep), one CPU path against another, f32 out */
    TOL_ATTN_ROUNDS_P,    /* CPU kernels that round P to bf16 before P V (kernel_rounds_p) */
    TOL_ATTN_REF,         /* attention, a CPU path against check.h's double reference, per element of max|v| */
    TOL_ATTN_GPU,         /* attention, the GPU against the CPU or a reference: 16-bit k/v, f32 or f16 out */
    TOL_ATTN_GPU_BF16OUT, /* the same, bf16 out (its rounding, 2^-9 relative, on top) */
    TOL_ATTN_GPU_F16,     /* f32 q over f16 k/v on the GPU against the CPU (u 2^-11: a quarter of bf16's) */
    TOL_DECODE_SCORE,     /* decode scores, shared scores, pooled scores: a path or backend against another */
    TOL_DECODE_POOLED_GPU,/* test_backends scenario 1's pooled scores (data with wide gaps) */
    TOL_EXACT,            /* decoder rings, compaction, keep sets without near-ties: bit-identical */
    TOL_COUNT
} test_tol_op;
typedef struct test_tol { double rel_l2, max_abs, rel, abs, tie; const char *name, *why; } test_tol;
static const test_tol test_tols[TOL_COUNT] CHECK_UNUSED = {
    /* rel_l2  max_abs  rel    abs    tie */
    {0,        0,       1e-3,  1e-5,  0,    "entropy",     "float32 block scores summed in another order"},
    {0,        0,       1e-5,  1e-2,  0,    "budget",      "the recurrence of entropies TOL_ENTROPY apart"},
    {0,        0,       0,     0,     1e-4, "rank-ref",    "softmaxed block scores: float32 summation order"},
    {0,        0,       0,     0,     2e-3, "rank-sampled","polynomial 2^x (SIMD) vs expf (scalar): masses within 1e-3"},
    {1e-4,     1e-4,    0,     0,     0,    "attn-cpu",    "float32 accumulation in another order"},
    {4e-3,     4e-3,    0,     0,     0,    "attn-rounds-p","P rounded to bf16 before P V: ~2^-9 of max|v| per weight"},
    {0,        1e-5,    0,     0,     0,    "attn-ref",    "float32 kernels against double (test_attention)"},
    {1e-2,     5e-2,    0,     0,     0,    "attn-gpu",    "tensor cores: P in 16 bits, as flash attention"},
    {2e-2,     5e-2,    0,     0,     0,    "attn-gpu-bf16out", "attn-gpu, and the bf16 output's rounding"},
    {2.5e-3,   1.25e-2, 0,     0,     0,    "attn-gpu-f16","f16's unit roundoff is 8x bf16's: a quarter of attn-gpu (2x margin)"},
    {0,        0,       1e-3,  1e-9,  1e-3, "decode-score","the sampled kernels' 2^x: 1e-3 relative (ACCURACY ACROSS PATHS)"},
    {0,        0,       1e-4,  1e-9,  0,    "decode-pooled-gpu", "test_backends 1: pooled scores 1e-2 apart at the boundary"},
    {0,        0,       0,     0,     0,    "exact",       "copies and integer work: bit-identical"},
};
/* An output's bound for a dtype: the attention tolerance plus the output's
   own rounding (f16 2^-11, bf16 2^-8 relative) where the output is 16-bit. */
CHECK_FN double tol_out_rounding(ei_dtype out) { return out == EI_F16 ? 1.0 / 2048 : out == EI_BF16 ? 1.0 / 256 : 0.0; }

/* Relative L2 and max-abs error of an output against a reference, element
   by element (l2_add), then one check (check_l2). Non-finite elements of
   either side are counted apart (bad), never summed. */
typedef struct l2_acc { double e2, r2, mx; long long bad, n; } l2_acc;
CHECK_FN l2_acc l2_zero(void) { l2_acc a; memset(&a, 0, sizeof a); return a; }
CHECK_FN void l2_add(l2_acc *a, double got, double ref) {
    double e = got - ref;
    a->n++;
    if (!(got == got) || !(ref == ref) || fabs(got) > 1e30 || fabs(ref) > 1e30) { a->bad++; return; }
    a->e2 += e * e;
    a->r2 += ref * ref;
    if (fabs(e) > a->mx) a->mx = fabs(e);
}
CHECK_FN double l2_rel(const l2_acc *a) { return sqrt(a->e2 / (a->r2 > 0 ? a->r2 : 1)); }
/* Within rel_l2 and max_abs (both 0: identical)? */
CHECK_FN int l2_within(const l2_acc *a, double rel_l2, double max_abs) {
    return a->bad == 0 && (rel_l2 <= 0 ? a->e2 == 0 : l2_rel(a) < rel_l2) && a->mx <= max_abs;
}

/* One check: the errors a holds within rel_l2 and max_abs (the message
   names `what`, the errors and the limits). Returns 1 if it held. */
CHECK_FN int check_l2(const char *what, const l2_acc *a, double rel_l2, double max_abs) {
    int ok = l2_within(a, rel_l2, max_abs);
    CHECK(ok, "%s: %lld of %lld elements non-finite, rel L2 %.3g (limit %.3g), max abs %.3g (limit %.3g)", what, a->bad,
          a->n, l2_rel(a), rel_l2, a->mx, max_abs);
    return ok;
}
/* The same over two float arrays of n elements. */
CHECK_FN l2_acc l2_of_f32(const float *got, const float *ref, size_t n) {
    l2_acc a = l2_zero();
    size_t i;
    for (i = 0; i < n; ++i) l2_add(&a, got[i], ref[i]);
    return a;
}

/* ------------------------------------------------------------ ei_exec and ei_layer_sizes */
/* A whole call on n_threads threads (0 or 1: the calling thread alone), with
   the one workspace ws of bytes bytes. */
CHECK_FN ei_exec ex(int32_t n_threads, void *ws, size_t bytes) {
    ei_exec x;
    memset(&x, 0, sizeof x);
    x.n_threads = n_threads;
    x.workspace = ws;
    x.workspace_bytes = bytes;
    return x;
}
/* Part ith of nth: every part passes the same workspace. */
CHECK_FN ei_exec ex_part(int32_t ith, int32_t nth, void *ws, size_t bytes) {
    ei_exec x = ex(0, ws, bytes);
    x.ith = ith;
    x.nth = nth;
    return x;
}
/* ei_layer_sizes of a layer of T tokens, H / kv heads of d, plans of flags,
   calls on n threads or parts. */
CHECK_FN ei_result sizes_for(const ei_context *ctx, int64_t T, int32_t H, int32_t kv, int32_t d, uint32_t flags, int32_t n,
                             ei_sizes *sz) {
    ei_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.max_tokens = T; sh.n_heads = H; sh.n_kv_heads = kv; sh.head_dim = d; sh.plan_flags = flags; sh.n_threads = n;
    return ei_layer_sizes(ctx, &sh, sz);
}

/* ------------------------------------------------------------ guarded buffers */
/* n bytes with GUARD canary bytes (0xA5) on each side; the inside starts as
   garbage (0xFF: NaN in every dtype) so that reading what the library did not
   write shows up. guarded_alloc_at puts the buffer `offset` bytes past a
   64-byte boundary (sizes must suffice at any alignment); guarded_alloc uses
   16, as malloc usually gives. */
/* A call that must succeed in a test's set-up: on failure, say where and
   what, and stop the program. */
#define CHECK_OK(call)                                                                         \
    do {                                                                                       \
        ei_result r_ = (call);                                                                 \
        if (r_ != EI_OK) {                                                                     \
            printf("  FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, ei_result_name(r_), \
                   ei_last_error());                                                           \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
/* ei_layer_sizes where a test's set-up needs them (stops the program on failure). */
CHECK_FN ei_sizes layer_sizes(const ei_context *ctx, int64_t T, int32_t H, int32_t kv, int32_t d, uint32_t flags,
                              int32_t n) {
    ei_sizes sz;
    CHECK_OK(sizes_for(ctx, T, H, kv, d, flags, n, &sz));
    return sz;
}
#define GUARD 256
typedef struct guard_head { unsigned char *raw; size_t n; } guard_head;
CHECK_FN void *guarded_alloc_at(size_t n, unsigned offset) {
    size_t pre = sizeof(guard_head) + GUARD;
    unsigned char *raw = (unsigned char *)malloc(pre + 128 + n + GUARD), *p;
    guard_head h;
    if (!raw) { printf("out of memory\n"); exit(2); }
    p = (unsigned char *)(((uintptr_t)raw + pre + 63) & ~(uintptr_t)63) + offset % 64u;
    h.raw = raw;
    h.n = n;
    memcpy(p - GUARD - sizeof h, &h, sizeof h);
    memset(p - GUARD, 0xA5, GUARD);
    memset(p, 0xFF, n);
    memset(p + n, 0xA5, GUARD);
    return p;
}
CHECK_FN void *guarded_alloc(size_t n) { return guarded_alloc_at(n, 16); }
CHECK_FN guard_head guard_head_of(const void *mem) {
    guard_head h;
    memcpy(&h, (const unsigned char *)mem - GUARD - sizeof h, sizeof h);
    return h;
}
/* 1 if both guards are intact (and mem holds n bytes). */
CHECK_FN int guard_intact(const void *mem, size_t n) {
    const unsigned char *p = (const unsigned char *)mem;
    size_t i;
    if (guard_head_of(mem).n != n) return 0;
    for (i = 0; i < GUARD; ++i)
        if (p[-1 - (ptrdiff_t)i] != 0xA5 || p[n + i] != 0xA5) return 0;
    return 1;
}
CHECK_FN void guarded_free(void *mem) { if (mem) free(guard_head_of(mem).raw); }

CHECK_FN size_t dtype_size(ei_dtype dt) { return dt == EI_F16 || dt == EI_BF16 ? 2 : 4; } /* others: stored as f32 */
CHECK_FN const char *dtype_name(ei_dtype dt) { return dt == EI_F32 ? "f32" : dt == EI_F16 ? "f16" : dt == EI_BF16 ? "bf16" : "?"; }

/* An output view [n][heads][d] in guarded memory, pad elements after each
   token's heads (strided rows); guarded_out_intact: the guards and every
   padding byte still as allocated. */
typedef struct guarded_out { ei_out_tensor t; size_t bytes; } guarded_out;
CHECK_FN guarded_out guarded_out_make(ei_dtype dt, int64_t n, int32_t heads, int32_t d, int32_t pad) {
    guarded_out o;
    o.t = ei_out_tensor_make(NULL, dt, n, heads, d);
    o.t.token_stride = (int64_t)heads * d + pad;
    o.bytes = (size_t)(n * o.t.token_stride) * dtype_size(dt);
    o.t.data = guarded_alloc(o.bytes);
    return o;
}
CHECK_FN int guarded_out_intact(const guarded_out *o) {
    size_t es = dtype_size(o->t.dtype), row = (size_t)o->t.n_heads * (size_t)o->t.head_dim * es, b;
    int64_t t;
    if (!guard_intact(o->t.data, o->bytes)) return 0;
    for (t = 0; t < o->t.n_tokens; ++t) {
        const unsigned char *pad = (const unsigned char *)o->t.data + (size_t)(t * o->t.token_stride) * es + row;
        for (b = 0; b < (size_t)o->t.token_stride * es - row; ++b)
            if (pad[b] != 0xFF) return 0;
    }
    return 1;
}
CHECK_FN double guarded_out_get(const guarded_out *o, int64_t t, int32_t h, int32_t i) {
    return ei__load1(o->t.data, o->t.dtype, t * o->t.token_stride + (int64_t)h * o->t.head_stride + i);
}
CHECK_FN void guarded_out_free(guarded_out *o) { guarded_free(o->t.data); o->t.data = NULL; }

/* ------------------------------------------------------------ data */
/* A malloc'ed copy of n floats stored in dtype dt (f16/bf16 through the
   header's converters: the values the library sees). */
CHECK_FN void *to_dtype(const float *src, size_t n, ei_dtype dt) {
    void *out = malloc(n * dtype_size(dt) + 4);
    size_t i;
    if (!out) { printf("out of memory\n"); exit(2); }
    if (dt != EI_F16 && dt != EI_BF16) memcpy(out, src, n * 4);
    else
        for (i = 0; i < n; ++i) ((uint16_t *)out)[i] = dt == EI_F16 ? ei__f32_to_f16(src[i]) : ei__f32_to_bf16(src[i]);
    return out;
}
/* x[i] = x[i] rounded through dtype dt (what a tensor of that dtype holds). */
CHECK_FN void round_to_dtype(float *x, size_t n, ei_dtype dt) {
    size_t i;
    for (i = 0; i < n; ++i)
        x[i] = dt == EI_F16 ? ei__f16_to_f32(ei__f32_to_f16(x[i])) : dt == EI_BF16 ? ei__bf16_to_f32(ei__f32_to_bf16(x[i])) : x[i];
}
/* Kernels whose all-bf16 attention rounds P to bf16 before P V
   (vdpbf16ps, AMX tiles): ~2^-9 of max|v| per weight, as GPU flash
   attention does; the others keep f32 and meet f32 tolerances. */
CHECK_FN int kernel_rounds_p(ei_simd p) { return p == EI_SIMD_AVX512_BF16 || p == EI_SIMD_AMX; }
CHECK_FN int close_to(double a, double b, double abs_tol, double rel_tol) { return fabs(a - b) <= abs_tol + rel_tol * fabs(b); }
CHECK_FN int env_int(const char *name, int def) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : def;
}
/* Loops over the SIMD paths: for (p = EI_SIMD_SCALAR; p < TEST_SIMD_END; ++p)
   with ei_cpu_supports((ei_simd)p) as the filter (the enum is not in order
   of width: EI_SIMD_AVX512_BF16 comes after EI_SIMD_NEON). */
#define TEST_SIMD_END 10
/* SIMD paths to test: every one this CPU and build support, or the one
   EI_TEST_SIMD names (scalar|avx2|avx512|avx512-bf16|amx|neon|neon-bf16|neon-fhm|neon-bfmmla; auto: the one a
   default context picks; all). */
CHECK_FN int test_simd_selected(ei_simd p) {
    const char *e = getenv("EI_TEST_SIMD");
    if (p == EI_SIMD_AUTO || !ei_cpu_supports(p)) return 0;
    if (!e || !*e || !strcmp(e, "all")) return 1;
    if (!strcmp(e, "auto")) {
        ei_context *ctx = NULL;
        ei_simd chosen = EI_SIMD_SCALAR;
        if (ei_context_create(NULL, &ctx) == EI_OK) chosen = ei_context_config(ctx)->simd;
        ei_context_destroy(ctx);
        return p == chosen;
    }
    return !strcmp(e, ei_simd_name(p));
}
CHECK_FN void print_simd_paths(void) {
    int p;
    for (p = EI_SIMD_SCALAR; p < TEST_SIMD_END; ++p)
        if (ei_cpu_supports((ei_simd)p)) printf(" %s", ei_simd_name((ei_simd)p));
}

/* A generated layer (examples/synth_qk.h: rigid and dynamic kv heads), f32,
   contiguous, with values v in [-0.5, 0.5). */
typedef struct synth_layer {
    long n;
    int heads, kv, dim;
    float *q, *k, *v;
    ei_tensor tq, tk, tv;
} synth_layer;
CHECK_FN synth_layer synth_layer_make(long n, int heads, int kv, int dim, int segment, uint64_t seed) {
    synth_layer L;
    long i;
    L.n = n; L.heads = heads; L.kv = kv; L.dim = dim;
    L.q = (float *)malloc(sizeof(float) * (size_t)n * (size_t)heads * (size_t)dim);
    L.k = (float *)malloc(sizeof(float) * (size_t)n * (size_t)kv * (size_t)dim);
    L.v = (float *)malloc(sizeof(float) * (size_t)n * (size_t)kv * (size_t)dim);
    if (!L.q || !L.k || !L.v) { printf("out of memory\n"); exit(2); }
    synth_qk(L.q, L.k, n, heads, kv, dim, segment, 2, seed);
    for (i = 0; i < n * kv * dim; ++i) L.v[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    L.tq = ei_tensor_make(L.q, EI_F32, n, heads, dim);
    L.tk = ei_tensor_make(L.k, EI_F32, n, kv, dim);
    L.tv = ei_tensor_make(L.v, EI_F32, n, kv, dim);
    return L;
}
CHECK_FN void synth_layer_free(synth_layer *L) { free(L->q); free(L->k); free(L->v); L->q = L->k = L->v = NULL; }

/* ------------------------------------------------------------ golden cases */
/* One case folder (golden/FORMAT.md): meta.txt and binary arrays. */
typedef struct golden_meta {
    char dir[1024];
    char kind[32];
    long n_tokens, n_heads, n_kv_heads, head_dim, segment_size, block_size, base_budget, n_segments, n_blocks, max_k;
    long decode_budget, window, pool_kernel, per_kv_head, heads_out, compressed;
    double rigid_entropy, delta_t, alpha, scale;
    char pool[32], gqa_reduce[32];
} golden_meta;

/* out = a + "/" + b (b NULL: a), truncated safely to cap bytes. */
CHECK_FN void golden_join(char *out, size_t cap, const char *a, const char *b) {
    size_t la = strlen(a), lb = b ? strlen(b) : 0;
    if (la > cap - 2) la = cap - 2;
    memcpy(out, a, la);
    out[la] = 0;
    if (!b) return;
    out[la] = '/';
    if (lb > cap - la - 2) lb = cap - la - 2;
    memcpy(out + la + 1, b, lb);
    out[la + 1 + lb] = 0;
}

/* Reads dir/meta.txt; 0 when it is missing or names no kind. */
CHECK_FN int golden_read_meta(const char *dir, golden_meta *m) {
    char path[1200], line[512];
    FILE *f;
    memset(m, 0, sizeof *m);
    golden_join(m->dir, sizeof m->dir, dir, NULL);
    golden_join(path, sizeof path, dir, "meta.txt");
    if (!(f = fopen(path, "r"))) return 0;
    while (fgets(line, sizeof line, f)) {
        char *eq = strchr(line, '='), *key = line, *val;
        if (!eq) continue;
        *eq = 0;
        val = eq + 1;
        val[strcspn(val, "\r\n")] = 0;
#define GOLDEN_INT(k) else if (!strcmp(key, #k)) m->k = atol(val);
#define GOLDEN_DBL(k) else if (!strcmp(key, #k)) m->k = atof(val);
#define GOLDEN_STR(k) else if (!strcmp(key, #k)) snprintf(m->k, sizeof m->k, "%s", val);
        if (0) {}
        GOLDEN_STR(kind) GOLDEN_INT(n_tokens) GOLDEN_INT(n_heads) GOLDEN_INT(n_kv_heads) GOLDEN_INT(head_dim)
        GOLDEN_INT(segment_size) GOLDEN_INT(block_size) GOLDEN_INT(base_budget) GOLDEN_INT(n_segments) GOLDEN_INT(n_blocks)
        GOLDEN_INT(max_k) GOLDEN_INT(decode_budget) GOLDEN_INT(window) GOLDEN_INT(pool_kernel) GOLDEN_INT(per_kv_head)
        GOLDEN_INT(heads_out) GOLDEN_INT(compressed) GOLDEN_DBL(rigid_entropy) GOLDEN_DBL(delta_t) GOLDEN_DBL(alpha)
        GOLDEN_DBL(scale) GOLDEN_STR(pool) GOLDEN_STR(gqa_reduce)
#undef GOLDEN_INT
#undef GOLDEN_DBL
#undef GOLDEN_STR
    }
    fclose(f);
    return m->kind[0] != 0;
}

/* Loads the case's file `name` (malloc'ed; NULL if absent); *count =
   elements of elem bytes. */
CHECK_FN void *golden_load(const golden_meta *m, const char *name, size_t elem, size_t *count) {
    char path[1200];
    FILE *f;
    long len;
    void *buf;
    if (count) *count = 0;
    golden_join(path, sizeof path, m->dir, name);
    if (!(f = fopen(path, "rb"))) return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (buf && len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len) { free(buf); buf = NULL; }
    fclose(f);
    if (buf && count) *count = (size_t)len / elem;
    return buf;
}

/* The case folders of root, sorted: those holding a meta.txt. Returns their
   number (names malloc'ed into names[0..max)), or -1 when root cannot be
   opened; *skipped counts the other subfolders (no meta.txt). */
CHECK_FN int golden_cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
CHECK_FN int golden_cases(const char *root, char **names, int max, int *skipped) {
    DIR *dir = opendir(root);
    struct dirent *e;
    int n = 0;
    *skipped = 0;
    if (!dir) return -1;
    while ((e = readdir(dir)) && n < max) {
        char path[1200], meta[1300];
        FILE *f;
        DIR *sub;
        if (e->d_name[0] == '.') continue;
        golden_join(path, sizeof path, root, e->d_name);
        if (!(sub = opendir(path))) continue; /* a file (FORMAT.md, README.md) */
        closedir(sub);
        golden_join(meta, sizeof meta, path, "meta.txt");
        if (!(f = fopen(meta, "r"))) { ++*skipped; continue; }
        fclose(f);
        names[n] = (char *)malloc(strlen(e->d_name) + 1);
        if (!names[n]) { printf("out of memory\n"); exit(2); }
        memcpy(names[n++], e->d_name, strlen(e->d_name) + 1);
    }
    closedir(dir);
    qsort(names, (size_t)n, sizeof *names, golden_cmp_names);
    return n;
}

/* The configuration a case was made with (the other knobs: defaults). */
CHECK_FN ei_config golden_config(const golden_meta *m) {
    ei_config c = ei_config_default();
    if (!strcmp(m->kind, "prefill")) {
        c.segment_size = (int32_t)m->segment_size;
        c.block_size = (int32_t)m->block_size;
        c.base_budget = (int32_t)m->base_budget;
        c.rigid_entropy = m->rigid_entropy;
        c.delta_t = m->delta_t;
        c.alpha = m->alpha;
    } else {
        c.decode_budget = (int32_t)m->decode_budget;
        c.window = (int32_t)m->window;
        c.decode_gap = c.decode_gap > c.window ? c.window : c.decode_gap;
        c.pool = !strcmp(m->pool, "maxpool") ? EI_POOL_MAX : !strcmp(m->pool, "none") ? EI_POOL_NONE : EI_POOL_AVG;
        c.pool_kernel = (int32_t)m->pool_kernel;
        c.per_kv_head = (int32_t)m->per_kv_head;
        c.gqa_reduce = !strcmp(m->gqa_reduce, "max") ? EI_REDUCE_MAX : EI_REDUCE_MEAN;
        c.decode_scale = (float)m->scale;
    }
    return c;
}

/* ------------------------------------------------------------ reference attention */
/* Element (token, head, i) of a view, as the library reads it. */
CHECK_FN double ref_at(const ei_tensor *x, int64_t tok, int32_t h, int32_t i) {
    return ei__load1(x->data, x->dtype, tok * x->token_stride + (int64_t)h * x->head_stride + i);
}
/* Segment s of plan attends sparsely (the header's rule; NULL plan: dense). */
CHECK_FN int ref_segment_sparse(const ei_config *c, const ei_plan *plan, int64_t s) {
    return plan && s >= 0 && s < plan->n_segments && ei__segment_sparse(c, (int32_t)s, plan->n_segments, plan->final);
}
/* max |v| over the tokens of v, of one kv head (kv_head < 0: of all). */
CHECK_FN double ref_vmax(const ei_tensor *v, int32_t kv_head) {
    double m = 0;
    int64_t t;
    int32_t h, i;
    for (t = 0; t < v->n_tokens; ++t)
        for (h = 0; h < v->n_heads; ++h)
            if (kv_head < 0 || h == kv_head)
                for (i = 0; i < v->head_dim; ++i) m = fmax(m, fabs(ref_at(v, t, h, i)));
    return m;
}

/* The scale of attention logits: attn_scale, or 1 / sqrt(d) when it is 0. */
CHECK_FN double ref_attn_scale(const ei_config *c, int32_t d) {
    return c->attn_scale > 0 ? (double)c->attn_scale : 1.0 / sqrt((double)d);
}
/* How many keys query position p may attend to (the size of ref_token_keys's pos). */
CHECK_FN int64_t ref_token_key_cap(const ei_config *c, const ei_plan *plan, int sparse, int64_t p) {
    int64_t start = p / c->segment_size * c->segment_size, cap = p + 1;
    if (sparse && (int64_t)plan->max_keep * c->block_size + (p - start + 1) > cap)
        cap = (int64_t)plan->max_keep * c->block_size + (p - start + 1);
    return cap;
}
/* The keys query position p of kv head kvh attends to, in pos[0..np):
   the plan's kept blocks and the segment's own keys when its segment is
   sparse, else 0..p. Returns np. */
CHECK_FN int64_t ref_token_keys(const ei_config *c, const ei_plan *plan, int sparse, int64_t p, int32_t kvh, int64_t *pos) {
    int64_t s = p / c->segment_size, start = s * c->segment_size, np = 0, j;
    if (sparse) {
        const int32_t *idx = EI_PLAN_BLOCKS(plan, kvh, s);
        int32_t kc = plan->keep_count[EI_PLAN_ROW(plan, kvh, s)], b, e;
        if (kc > plan->max_keep) kc = plan->max_keep;
        for (b = 0; b < kc; ++b)
            for (e = 0; e < c->block_size; ++e) {
                int64_t key = (int64_t)idx[b] * c->block_size + e;
                if (idx[b] >= 0 && key < start) pos[np++] = key; /* a trusted plan's blocks lie before the segment */
            }
        for (j = start; j <= p; ++j) pos[np++] = j;
    } else
        for (j = 0; j <= p; ++j) pos[np++] = j;
    return np;
}
/* Logits w[0..np) -> exp(w - max) in place; returns their sum. Clears
   *in_range when a logit leaves float range (|x| > 1e37). */
CHECK_FN double ref_softmax_weights(double *w, int64_t np, int *in_range) {
    double mx = -INFINITY, z = 0;
    int64_t j;
    for (j = 0; j < np; ++j) {
        if (!(fabs(w[j]) <= 1e37)) *in_range = 0;
        if (w[j] > mx) mx = w[j];
    }
    for (j = 0; j < np; ++j) { w[j] = exp(w[j] - mx); z += w[j]; }
    return z;
}
/* Query head h of token t of q over the keys pos[0..np) of its kv head:
   out[0..d), in double; w holds np doubles. Returns 0 when a logit leaves
   float range (see ref_attention_token). */
CHECK_FN int ref_attend_keys(const ei_tensor *q, const ei_tensor *k, const ei_tensor *v, int64_t t, int32_t h,
                             const int64_t *pos, int64_t np, double scale, double *w, double *out) {
    int32_t kvh = h / (q->n_heads / k->n_heads), d = q->head_dim, i;
    int64_t j;
    int in_range = 1;
    double z;
    for (j = 0; j < np; ++j) {
        double dot = 0;
        for (i = 0; i < d; ++i) dot += ref_at(q, t, h, i) * ref_at(k, pos[j], kvh, i);
        w[j] = dot * scale;
    }
    z = ref_softmax_weights(w, np, &in_range);
    for (i = 0; i < d; ++i) {
        double o = 0;
        for (j = 0; j < np; ++j) o += w[j] * ref_at(v, pos[j], kvh, i);
        out[i] = o / z;
    }
    return in_range;
}
/* Query token t of q (absolute position q_offset + t), every query head:
   out[h * d + i], in double. The semantics (golden/FORMAT.md "Sparse
   prefill attention", >>attention in the header): position p of segment s,
   query head h, kv head h / G attends, if segment s is sparse
   (ei__segment_sparse), to the blocks the plan keeps for (h / G, s), then the
   segment's own keys s * segment_size .. p; otherwise to keys 0 .. p. Scale
   attn_scale, or 1 / sqrt(head_dim) when it is 0. Keys and values are read
   from k and v as stored (any dtype, any strides).
   Returns 0 when a logit leaves float range (|x| > 1e37: the kernels clamp
   those to +-FLT_MAX by design, so the reference does not apply), else 1. */
CHECK_FN int ref_attention_token(const ei_config *c, const ei_plan *plan, const ei_tensor *q, const ei_tensor *k,
                                 const ei_tensor *v, int64_t q_offset, int64_t t, double *out) {
    int32_t H = q->n_heads, G = H / k->n_heads, d = q->head_dim, h;
    int64_t p = q_offset + t;
    int sparse = ref_segment_sparse(c, plan, p / c->segment_size), in_range = 1;
    double scale = ref_attn_scale(c, d);
    int64_t *pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)ref_token_key_cap(c, plan, sparse, p));
    double *w = (double *)malloc(sizeof(double) * (size_t)ref_token_key_cap(c, plan, sparse, p));
    if (!pos || !w) { printf("out of memory\n"); exit(2); }
    for (h = 0; h < H; ++h) {
        int64_t np = ref_token_keys(c, plan, sparse, p, h / G, pos);
        in_range &= ref_attend_keys(q, k, v, t, h, pos, np, scale, w, out + (size_t)h * (size_t)d);
    }
    free(pos);
    free(w);
    return in_range;
}

/* Query token t of q through a keep set (ei_attention_decode with a keep set): head h
   attends to its set's kept rows (keep->index row: 0 for a shared set, h /
   G per kv head, h per query head), then to rows keep->n_tokens ..
   q_offset + t. out[h * d + i]. Returns 0 when a logit left float range. */
CHECK_FN int ref_attention_keep(const ei_config *c, const ei_keep_set *keep, const ei_tensor *q, const ei_tensor *k,
                                const ei_tensor *v, int64_t q_offset, int64_t t, double *out) {
    int32_t H = q->n_heads, G = H / k->n_heads, d = q->head_dim, h, i;
    int64_t cap = keep->n_kept + (q_offset + t + 1 - keep->n_tokens), np, j;
    int64_t *pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(cap > 0 ? cap : 1));
    double *w = (double *)malloc(sizeof(double) * (size_t)(cap > 0 ? cap : 1));
    int in_range = 1;
    if (!pos || !w) { printf("out of memory\n"); exit(2); }
    for (h = 0; h < H; ++h) {
        int32_t set = keep->heads_out == 1 ? 0 : keep->heads_out == H ? h : h / G;
        for (np = 0, i = 0; i < keep->n_kept; ++i) pos[np++] = keep->index[(size_t)set * (size_t)keep->capacity + (size_t)i];
        for (j = keep->n_tokens; j <= q_offset + t; ++j) pos[np++] = j;
        in_range &= ref_attend_keys(q, k, v, t, h, pos, np, ref_attn_scale(c, d), w, out + (size_t)h * (size_t)d);
    }
    free(pos);
    free(w);
    return in_range;
}
/* Every query token of q: out[(t * H + h) * d + i]. Returns 0 when a logit
   left float range (see ref_attention_token). */
CHECK_FN int ref_attention(const ei_config *c, const ei_plan *plan, const ei_tensor *q, const ei_tensor *k,
                           const ei_tensor *v, int64_t q_offset, double *out) {
    int64_t t;
    int in_range = 1;
    for (t = 0; t < q->n_tokens; ++t)
        in_range &= ref_attention_token(c, plan, q, k, v, q_offset, t,
                                        out + (size_t)t * (size_t)q->n_heads * (size_t)q->head_dim);
    return in_range;
}

/* ------------------------------------------------------------ reference budgets */
/* B[s] of one kv head from its entropy row (segments 0..s): base_budget
   when the head is rigid, else the recurrence from segment 0, one
   ei__budget_next step per segment (the header's rule, not a copy). */
CHECK_FN double ref_budget(const ei_config *c, const float *entropy_row, int32_t s, int rigid) {
    double b = 0.0;
    int32_t t;
    if (rigid) return (double)c->base_budget;
    for (t = 0; t <= s; ++t) b = ei__budget_next(c, t, b, entropy_row[t], t > 0 ? entropy_row[t - 1] : 0.0f);
    return b;
}
/* Blocks a budget keeps in segment s of a plan of n_tokens (n_blocks
   scored): floor to blocks, then the cap (ei__keep_of, ei__cap_blocks). */
CHECK_FN int32_t ref_keep_blocks(const ei_config *c, int32_t s, double budget, int64_t n_tokens, int64_t n_blocks) {
    return ei__keep_of(c, s, budget, ei__cap_blocks(c, s, n_tokens, n_blocks));
}
/* 1 when a budget lies within tol tokens of a block boundary: there two
   implementations may floor to different counts (FORMAT.md). */
CHECK_FN int ref_budget_on_edge(const ei_config *c, double budget, double tol) {
    double blocks = budget / (double)c->block_size, frac = blocks - floor(blocks);
    return frac * c->block_size < tol || (1.0 - frac) * c->block_size < tol;
}
/* ------------------------------------------------------------ reference ranking (beyond the paper) */
/* EI_RANK_PRECISION_INT8's rounding of a row (entropyinfer.h CONCEPTS:
   ranking), the test's own: s = max|x| / 127 in float32, lroundf(x / s)
   (half away from zero) clamped to +-127, all zero where s is 0; returns s. */
CHECK_FN float ref_quant_i8(const float *x, int32_t d, int32_t *out) {
    float m = 0.0f, s;
    int32_t i;
    for (i = 0; i < d; ++i) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    s = m / 127.0f;
    {   /* s as a float (volatile: x87 keeps excess precision) */
        volatile float sv = s;
        s = sv;
    }
    for (i = 0; i < d; ++i) {
        long v = s > 0.0f ? lroundf(x[i] / s) : 0; /* (the argument rounds to float) */
        out[i] = (int32_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    return s;
}
/* EI_RANK_ROWS_SPREAD in plain code (entropyinfer.h CONCEPTS: ranking):
   the rows of segment s of kv head kvh (G query heads per kv head; q holds
   every query of the segment) picked by farthest point, into tok / head in
   token order, then head; returns their count. */
CHECK_FN int32_t ref_spread_rows(const ei_config *c, const ei_tensor *q, int32_t G, int32_t kvh, int32_t s, int64_t *tok,
                                 int32_t *head) {
    /* candidates: at most 1024, and at most 128 KiB of int8 rows of head_dim rounded up to 4 */
    const int32_t d = q->head_dim, R = c->rank_samples;
    const int64_t cap = 131072 / ((d + 3) / 4 * 4) < 1024 ? 131072 / ((d + 3) / 4 * 4) : 1024;
    const int64_t per = cap / G > 0 ? cap / G : 1, S = c->segment_size, t0 = (int64_t)s * S, st = (S + per - 1) / per;
    const int64_t C = (S + st - 1) / st * G;
    int32_t *x8 = (int32_t *)malloc(sizeof(int32_t) * (size_t)C * (size_t)d);
    double *r = (double *)malloc(sizeof(double) * (size_t)C), *best = (double *)malloc(sizeof(double) * (size_t)C);
    unsigned char *taken = (unsigned char *)calloc((size_t)C, 1);
    float *xf = (float *)malloc(sizeof(float) * (size_t)d);
    int64_t x, p, *pick = (int64_t *)malloc(sizeof(int64_t) * (size_t)R);
    int32_t n = 0, i, e;
    if (!x8 || !r || !best || !taken || !xf || !pick) { printf("out of memory\n"); exit(2); }
    for (x = 0; x < C; ++x) {
        int64_t nn = 0;
        for (e = 0; e < d; ++e) xf[e] = (float)ref_at(q, t0 + (x / G) * st, kvh * G + (int32_t)(x % G), e);
        (void)ref_quant_i8(xf, d, x8 + (size_t)x * (size_t)d);
        for (e = 0; e < d; ++e) nn += (int64_t)x8[(size_t)x * (size_t)d + (size_t)e] * x8[(size_t)x * (size_t)d + (size_t)e];
        r[x] = nn > 0 ? 1.0 / sqrt((double)nn) : 0.0;
        best[x] = -2.0;
    }
    p = (S / (2 * (int64_t)R)) / st * G; /* the even rows' first */
    if (p >= C) p = 0;
    for (;;) {
        int64_t next = -1;
        pick[n++] = p;
        taken[p] = 1;
        if (n == R || n == C) break;
        for (x = 0; x < C; ++x) {
            int64_t dot = 0;
            double cs;
            if (taken[x]) continue;
            for (e = 0; e < d; ++e) dot += (int64_t)x8[(size_t)x * (size_t)d + (size_t)e] * x8[(size_t)p * (size_t)d + (size_t)e];
            cs = (double)dot * r[x] * r[p];
            if (cs > best[x]) best[x] = cs;
            if (next < 0 || best[x] < best[next]) next = x;
        }
        p = next;
    }
    for (i = 0; i < n; ++i) { /* candidate order */
        int32_t j, m = i;
        for (j = i + 1; j < n; ++j) m = pick[j] < pick[m] ? j : m;
        x = pick[i]; pick[i] = pick[m]; pick[m] = x;
        tok[i] = t0 + (pick[i] / G) * st;
        head[i] = kvh * G + (int32_t)(pick[i] % G);
    }
    free(x8); free(r); free(best); free(taken); free(xf); free(pick);
    return n;
}
/* EI_RANK_SAMPLED in double: the block mass of segment s of kv head kvh over
   the first n tokens (entropyinfer.h CONCEPTS: ranking), into mass[0..nvis);
   with given (chunked planning: given[t] = 1 where the plan holds the query
   of token t) only the rows of given tokens. With EI_RANK_PRECISION_INT8
   the logits are scale s_q s_k (q8 . k8), the rows and keys rounded by
   ref_quant_i8 and the sums exact. spread (0/1): the rows are
   ref_spread_rows' (EI_RANK_ROWS_SPREAD where one profiling call held the
   whole segment; the caller knows which calls did), else the even rows.
   Returns the rows summed. */
CHECK_FN int ref_sampled_mass_rows(const ei_config *c, const ei_tensor *q, const ei_tensor *k, int32_t kvh, int32_t s,
                                   int64_t n, const unsigned char *given, int spread, double *mass) {
    const int32_t G = q->n_heads / k->n_heads, d = q->head_dim, bs = c->block_size;
    const int64_t t0 = (int64_t)s * c->segment_size, nvis = t0 / bs;
    const double scale = c->attn_scale > 0.0f ? (double)c->attn_scale : 1.0 / sqrt((double)d);
    const int i8 = c->rank_precision == EI_RANK_PRECISION_INT8;
    double *lg = (double *)malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    float *xf = (float *)malloc(sizeof(float) * (size_t)d), *sk = NULL, sq = 0.0f;
    int32_t *k8 = NULL, *q8 = (int32_t *)malloc(sizeof(int32_t) * (size_t)d);
    int64_t b, j, *sp_tok = NULL;
    int32_t i, e, n_rows = c->rank_samples, *sp_head = NULL;
    int rows = 0;
    if (!lg || !xf || !q8) { printf("out of memory\n"); exit(2); }
    if (spread) {
        sp_tok = (int64_t *)malloc(sizeof(int64_t) * (size_t)c->rank_samples);
        sp_head = (int32_t *)malloc(sizeof(int32_t) * (size_t)c->rank_samples);
        if (!sp_tok || !sp_head) { printf("out of memory\n"); exit(2); }
        n_rows = ref_spread_rows(c, q, G, kvh, s, sp_tok, sp_head);
    }
    if (i8) { /* every key of the first n, rounded */
        k8 = (int32_t *)malloc(sizeof(int32_t) * (size_t)d * (size_t)(n > 0 ? n : 1));
        sk = (float *)malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
        if (!k8 || !sk) { printf("out of memory\n"); exit(2); }
        for (j = 0; j < n; ++j) {
            for (e = 0; e < d; ++e) xf[e] = (float)ref_at(k, j, kvh, e);
            sk[j] = ref_quant_i8(xf, d, k8 + (size_t)j * (size_t)d);
        }
    }
    for (b = 0; b < nvis; ++b) mass[b] = 0.0;
    for (i = 0; i < n_rows; ++i) {
        int64_t t = sp_tok ? sp_tok[i] : ei__sample_token(c, s, i);
        int32_t h = sp_head ? sp_head[i] : kvh * G + i % G;
        double m = -HUGE_VAL, z = 0.0;
        if (t >= n || (given && !given[t])) continue;
        rows++;
        if (i8) {
            for (e = 0; e < d; ++e) xf[e] = (float)ref_at(q, t, h, e);
            sq = ref_quant_i8(xf, d, q8);
        }
        for (j = 0; j <= t; ++j) {
            double acc = 0.0;
            if (i8) {
                int64_t acc8 = 0;
                for (e = 0; e < d; ++e) acc8 += (int64_t)q8[e] * k8[(size_t)j * (size_t)d + (size_t)e];
                acc = (double)sq * (double)sk[j] * (double)acc8;
            } else
                for (e = 0; e < d; ++e) acc += ref_at(q, t, h, e) * ref_at(k, j, kvh, e);
            lg[j] = scale * acc;
            if (lg[j] > m) m = lg[j];
        }
        for (j = 0; j <= t; ++j) z += (lg[j] = exp(lg[j] - m));
        for (j = 0; j < nvis * bs; ++j) mass[j / bs] += lg[j] / z;
    }
    free(lg);
    free(xf);
    free(q8);
    free(k8);
    free(sk);
    free(sp_tok);
    free(sp_head);
    return rows;
}
/* ref_sampled_mass_rows with the spread rows where EI_RANK_ROWS_SPREAD
   applies to a segment that the first n tokens hold whole and given is NULL
   (whole-prompt planning: ei_profile's one call holds it); with given
   (chunked planning) the even rows: a caller that knows which chunk calls
   held a segment whole calls ref_sampled_mass_rows. */
CHECK_FN int ref_sampled_mass_given(const ei_config *c, const ei_tensor *q, const ei_tensor *k, int32_t kvh, int32_t s,
                                    int64_t n, const unsigned char *given, double *mass) {
    return ref_sampled_mass_rows(c, q, k, kvh, s, n, given,
                                 c->rank_rows == EI_RANK_ROWS_SPREAD && !given &&
                                     (int64_t)s * c->segment_size + c->segment_size <= n,
                                 mass);
}
CHECK_FN void ref_sampled_mass(const ei_config *c, const ei_tensor *q, const ei_tensor *k, int32_t kvh, int32_t s, int64_t n,
                               double *mass) {
    (void)ref_sampled_mass_given(c, q, k, kvh, s, n, NULL, mass);
}
/* EI_RANK_ANTIDIAGONAL in double, the same contract: query tile i of segment
   s (ei__antidiag_tile_token, query head kvh * G + i % G), its row r (token
   u, phase p = bs - 1 - r) scores every key of the first min(sink_blocks,
   nvis) blocks and the keys j <= u with j % bs == p after them, each of
   those weighing bs; softmaxed with those weights, the weight on each block
   added to mass[b]. Returns the rows summed. */
CHECK_FN int ref_antidiag_mass_given(const ei_config *c, const ei_tensor *q, const ei_tensor *k, int32_t kvh, int32_t s,
                                     int64_t n, const unsigned char *given, double *mass) {
    const int32_t G = q->n_heads / k->n_heads, d = q->head_dim, bs = c->block_size;
    const int64_t t0 = (int64_t)s * c->segment_size, nvis = t0 / bs, ns = c->sink_blocks < nvis ? c->sink_blocks : nvis;
    const double scale = c->attn_scale > 0.0f ? (double)c->attn_scale : 1.0 / sqrt((double)d);
    double *lg = (double *)malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    unsigned char *use = (unsigned char *)malloc((size_t)(n > 0 ? n : 1));
    int64_t b, j;
    int32_t i, e, r;
    int rows = 0;
    if (!lg || !use) { printf("out of memory\n"); exit(2); }
    for (b = 0; b < nvis; ++b) mass[b] = 0.0;
    for (i = 0; i < c->rank_samples; ++i)
        for (r = 0; r < bs; ++r) {
            int64_t u = ei__antidiag_tile_token(c, s, i) + r, p = bs - 1 - r;
            int32_t h = kvh * G + i % G;
            double m = -HUGE_VAL, z = 0.0;
            if (u >= n || (given && !given[u])) continue;
            rows++;
            for (j = 0; j <= u; ++j) {
                double acc = 0.0;
                use[j] = j < ns * bs || j % bs == p;
                if (!use[j]) continue;
                for (e = 0; e < d; ++e) acc += ref_at(q, u, h, e) * ref_at(k, j, kvh, e);
                lg[j] = scale * acc;
                if (lg[j] > m) m = lg[j];
            }
            for (j = 0; j <= u; ++j)
                if (use[j]) z += (lg[j] = exp(lg[j] - m) * (j < ns * bs ? 1.0 : (double)bs));
            for (j = 0; j < nvis * bs; ++j)
                if (use[j]) mass[j / bs] += lg[j] / z;
        }
    free(lg);
    free(use);
    return rows;
}
/* The mass of the context's ranking by mass (EI_RANK_SAMPLED or EI_RANK_ANTIDIAGONAL). */
CHECK_FN int ref_ranking_mass_given(const ei_config *c, const ei_tensor *q, const ei_tensor *k, int32_t kvh, int32_t s,
                                    int64_t n, const unsigned char *given, double *mass) {
    return c->ranking == EI_RANK_ANTIDIAGONAL ? ref_antidiag_mass_given(c, q, k, kvh, s, n, given, mass)
                                              : ref_sampled_mass_given(c, q, k, kvh, s, n, given, mass);
}

/* Decode scores in double (ei_decode_score): out[h][row] = the mean over
   the W window queries q_win [W][H][d] of query head h of their softmax
   weight (scale = decode_scale, else 1/sqrt(d)) on the row, 0 for rows
   holding no position. row_pos (NULL: row j holds position j; per kv head
   + kvh * stride) maps rows to positions; window query i has the position
   W - 1 - i before the newest, and attends rows up to its own position. */
CHECK_FN void ref_decode_scores(const ei_config *c, const float *q_win, int64_t W, int32_t H, const ei_tensor *k,
                                const int32_t *row_pos, int64_t stride, double *out) {
    const int32_t KV = k->n_heads, G = H / KV, d = k->head_dim;
    const int64_t n = k->n_tokens;
    const double scale = c->decode_scale > 0.0f ? (double)c->decode_scale : 1.0 / sqrt((double)d);
    double *lg = (double *)malloc(sizeof(double) * (size_t)n);
    int64_t j, i, last;
    int32_t h, e;
    if (!lg) { printf("out of memory\n"); exit(2); }
    for (h = 0; h < H; ++h) {
        const int32_t *map = row_pos ? row_pos + (size_t)(h / G) * (size_t)stride : NULL;
        for (j = 0, last = -1; j < n; ++j) {
            int64_t pj = map ? map[j] : j;
            if (pj > last) last = pj;
            out[(size_t)h * (size_t)n + (size_t)j] = 0.0;
        }
        for (i = 0; i < W; ++i) {
            const float *qv = q_win + ((size_t)i * (size_t)H + (size_t)h) * (size_t)d;
            int64_t pi = last - (W - 1 - i);
            double m = -HUGE_VAL, z = 0.0;
            for (j = 0; j < n; ++j) {
                int64_t pj = map ? map[j] : j;
                double acc = 0.0;
                if (pj < 0 || pj > pi) { lg[j] = -HUGE_VAL; continue; }
                for (e = 0; e < d; ++e) acc += (double)qv[e] * ref_at(k, j, h / G, e);
                lg[j] = scale * acc;
                if (lg[j] > m) m = lg[j];
            }
            for (j = 0; j < n; ++j) z += (lg[j] = lg[j] == -HUGE_VAL ? 0.0 : exp(lg[j] - m));
            for (j = 0; j < n; ++j) out[(size_t)h * (size_t)n + (size_t)j] += lg[j] / z / (double)W;
        }
    }
    free(lg);
}

/* Row (kvh, s) of a whole-prompt plan against the ranking rules (CONCEPTS:
   ranking, top_p, sink, local): w[0..nvis) the reference's weights (sampled
   mass, or the softmaxed block scores), budget the recurrence's, cap the
   segment's. The always-kept blocks lead the row; the count is the one
   ei__keep_count gives for a top-p count that the weights allow within tol
   (relative: sums in another order may cross top_p elsewhere); the other
   kept blocks are the heaviest, up to ties within tol. Returns 1 if it holds. */
CHECK_FN int ref_check_ranked_row(const ei_config *c, const ei_plan *p, int32_t kvh, int32_t s, const double *w, int64_t nvis,
                                  int64_t cap, double budget, double tol, char *why, size_t why_len) {
    size_t row = EI_PLAN_ROW(p, kvh, s);
    const int32_t *idx = EI_PLAN_BLOCKS(p, kvh, s);
    int32_t cnt = p->keep_blocks[row], i;
    int64_t n_sink, local0, nf = ei__forced_blocks(c, nvis, &n_sink, &local0), b, np = 0, f = 0, kp;
    int32_t *order = (int32_t *)malloc(sizeof(int32_t) * (size_t)(nvis > 0 ? nvis : 1));
    unsigned char *kept = (unsigned char *)calloc((size_t)(nvis > 0 ? nvis : 1), 1);
    double wmin = HUGE_VAL, total = 0.0, cum = 0.0;
    int ok = 0, count_ok = 0;
    if (!order || !kept) { printf("out of memory\n"); exit(2); }
    why[0] = 0;
    /* always-kept blocks first, in order */
    for (b = 0; b < n_sink && f < cnt; ++b, ++f)
        if (idx[f] != b) { snprintf(why, why_len, "entry %lld is %d, sink block %lld expected", (long long)f, idx[f], (long long)b); goto done; }
    for (b = local0; b < nvis && f < cnt; ++b, ++f)
        if (idx[f] != b) { snprintf(why, why_len, "entry %lld is %d, local block %lld expected", (long long)f, idx[f], (long long)b); goto done; }
    /* the count */
    for (b = n_sink; b < local0; ++b) order[np++] = (int32_t)b;
    for (b = 1; b < np; ++b) { /* insertion sort by weight, descending, ties to the lower index */
        int32_t x = order[b];
        int64_t a = b - 1;
        while (a >= 0 && (w[order[a]] < w[x] || (w[order[a]] == w[x] && order[a] > x))) { order[a + 1] = order[a]; --a; }
        order[a + 1] = x;
    }
    if (c->top_p > 0.0) {
        for (b = 0; b < nvis; ++b) total += w[b];
        for (b = 0; b < nvis; ++b) if (b < n_sink || b >= local0) cum += w[b];
        for (kp = nf; kp <= nf + np + 1 && !count_ok; ++kp) {
            double before = cum; /* weight of the first kp - 1 entries */
            if (kp > nf && kp - nf - 1 < np) cum += w[order[kp - nf - 1]];
            if (!(total > 0.0)) count_ok = cnt == ei__keep_count(c, s, budget, 0, nf, cap, p->max_keep);
            else if ((kp == nf || before < c->top_p * total * (1.0 + tol)) && (cum >= c->top_p * total * (1.0 - tol) || kp > nf + np))
                count_ok = cnt == ei__keep_count(c, s, budget, kp, nf, cap, p->max_keep);
            (void)before;
        }
    } else
        count_ok = cnt == ei__keep_count(c, s, budget, -1, nf, cap, p->max_keep);
    if (!count_ok) { snprintf(why, why_len, "keep count %d is not one the weights allow", cnt); goto done; }
    /* the ranked part: distinct visible blocks, the heaviest up to ties */
    for (i = 0; i < cnt; ++i) {
        if (idx[i] < 0 || idx[i] >= nvis || kept[idx[i]]) { snprintf(why, why_len, "entry %d is %d", i, idx[i]); goto done; }
        kept[idx[i]] = 1;
        if (i >= f && w[idx[i]] < wmin) wmin = w[idx[i]];
    }
    for (i = cnt; i < p->max_keep; ++i)
        if (idx[i] != -1 && !c->per_segment_budget) { snprintf(why, why_len, "padding entry %d is %d", i, idx[i]); goto done; }
    if (cnt > f)
        for (b = n_sink; b < local0; ++b)
            if (!kept[b] && w[b] > wmin * (1.0 + tol) + 1e-12) {
                snprintf(why, why_len, "block %lld (weight %.6g) dropped for one of weight %.6g", (long long)b, w[b], wmin);
                goto done;
            }
    ok = 1;
done:
    free(order);
    free(kept);
    return ok;
}


/* ------------------------------------------------------------ backends (test_backends, fuzz_backends) */
/* A backend of a comparison: a CPU context with guarded host memory, or a
   CUDA context with device memory (ei_device_alloc / ei_device_copy; no CUDA
   header or library at build time). */
typedef struct side {
    int gpu;          /* 0: CPU context, host memory; 1: CUDA context, device memory */
    ei_context *ctx;
} side;

CHECK_FN const char *side_name(const side *s) { return s->gpu ? "gpu" : "cpu"; }

CHECK_FN ei_context *ctx_make(int gpu, ei_config c) {
    ei_context *ctx = NULL;
    ei_result r;
    c.backend = gpu ? EI_BACKEND_CUDA : EI_BACKEND_CPU;
    r = ei_context_create(&c, &ctx);
    if (r != EI_OK) {
        printf("FAIL: ei_context_create (%s): %s\n", gpu ? "gpu" : "cpu", ei_last_error());
        exit(1);
    }
    return ctx;
}
CHECK_FN side side_make(int gpu, ei_config c) {
    side s;
    s.gpu = gpu;
    s.ctx = ctx_make(gpu, c);
    return s;
}
CHECK_FN void side_free(side *s) {
    ei_context_destroy(s->ctx);
    s->ctx = NULL;
}

/* Memory of a backend: guarded host buffers (garbage 0xFF inside) or device
   buffers (filled with 0xFF too, so unwritten output reads back alike). */
CHECK_FN void *mem_new(const side *s, size_t n) {
    void *p = NULL, *garbage;
    if (!s->gpu) return guarded_alloc(n);
    if (ei_device_alloc(s->ctx, &p, n ? n : 1) != EI_OK) {
        printf("FAIL: ei_device_alloc(%zu): %s\n", n, ei_last_error());
        exit(1);
    }
    if (n) {
        garbage = malloc(n);
        if (!garbage) { printf("out of memory\n"); exit(2); }
        memset(garbage, 0xFF, n);
        if (ei_device_copy(s->ctx, p, garbage, n, EI_COPY_HOST_TO_DEVICE) != EI_OK) {
            printf("FAIL: ei_device_copy: %s\n", ei_last_error());
            exit(1);
        }
        free(garbage);
    }
    return p;
}
/* Copy n bytes host->side (kind EI_COPY_HOST_TO_DEVICE) or side->host. */
CHECK_FN void mem_move(const side *s, void *dst, const void *src, size_t n, int kind) {
    if (!n) return;
    if (!s->gpu) memcpy(dst, src, n);
    else if (ei_device_copy(s->ctx, dst, src, n, kind) != EI_OK) {
        printf("FAIL: ei_device_copy (%s): %s\n", kind == EI_COPY_HOST_TO_DEVICE ? "to the device" : "to the host",
               ei_last_error());
        exit(1);
    }
}
CHECK_FN void mem_put(const side *s, void *dst, const void *src, size_t n) { mem_move(s, dst, src, n, EI_COPY_HOST_TO_DEVICE); }
CHECK_FN void mem_get(const side *s, void *dst, const void *src, size_t n) { mem_move(s, dst, src, n, EI_COPY_DEVICE_TO_HOST); }
CHECK_FN void *mem_up(const side *s, const void *src, size_t n) {
    void *p = mem_new(s, n);
    mem_put(s, p, src, n);
    return p;
}
/* A host copy of n bytes of backend memory (malloc'ed). */
CHECK_FN void *mem_down(const side *s, const void *src, size_t n) {
    void *h = malloc(n ? n : 1);
    if (!h) { printf("out of memory\n"); exit(2); }
    mem_get(s, h, src, n);
    return h;
}
CHECK_FN void mem_del(const side *s, void *p, size_t n) {
    if (!p) return;
    if (s->gpu) { ei_device_free(s->ctx, p); return; }
    CHECK(guard_intact(p, n), "cpu: a guard of a %zu-byte buffer was overwritten", n);
    guarded_free(p);
}

/* ------------------------------------------------------------ comparing plans of two backends */
/* Share of the total weight w[0..nvis) in the first L entries of a row. */
CHECK_FN double plan_share(const int32_t *row, int L, const double *w, int64_t nvis) {
    double cum = 0.0, tot = 0.0;
    int64_t b;
    int i;
    for (b = 0; b < nvis; ++b) tot += w[b];
    for (i = 0; i < L; ++i) cum += w[row[i]];
    return tot > 0 ? cum / tot : 0.0;
}
/* Two ranking scores are a near-tie (tol: relative): backends that round
   differently may order them either way. */
CHECK_FN int plan_near_tie(double x, double last, double tol) { return fabs(x - last) <= tol * fabs(last) + 1e-30; }

/* Row (kvh, s) of plan b against plan a (the CPU's): sc[0..nvis) the
   ranking scores of the visible blocks (the sampled mass recomputed in
   double, or the reference's softmaxed block scores), tol the relative
   difference of scores the backends may round apart (1e-4; the sampled
   mass of the SIMD paths: 1e-3, ACCURACY ACROSS PATHS). The always-kept
   blocks lead both rows identically; keep counts are equal except at a
   knife-edge of top_p (the share of a's first min(own counts) blocks within
   tol of top_p: counted in *knife); entries past a row's count are -1; the
   ranked parts of the kept sets are equal up to near-ties of a's last kept
   score.
   Returns the failures (the first few printed, *shown counts them). */
CHECK_FN int plan_row_compare(const char *what, const ei_config *c, const ei_plan *a, const ei_plan *b, int kvh, int s,
                              const double *sc, double tol, int *knife, int *shown) {
    size_t r = EI_PLAN_ROW(a, kvh, s), rb = EI_PLAN_ROW(b, kvh, s);
    const int32_t *la = EI_PLAN_BLOCKS(a, kvh, s), *lb = EI_PLAN_BLOCKS(b, kvh, s);
    int64_t nvis = (int64_t)s * (c->segment_size / c->block_size), ns, l0;
    int nf, ka = a->keep_count[r], kb = b->keep_count[rb], oa = a->keep_blocks[r], ob = b->keep_blocks[rb];
    int kmin = ka < kb ? ka : kb, bad = 0, i, j, edge = 0;
    double last;
    if (nvis > a->n_blocks) nvis = a->n_blocks;
    nf = (int)ei__forced_blocks(c, nvis, &ns, &l0);
#define PLAN_FAIL(...) do { bad++; if ((*shown)++ < 6) { printf("  %s: kv %d seg %d: ", what, kvh, s); printf(__VA_ARGS__); printf("\n"); } } while (0)
    if (oa != ob || ka != kb) {
        int lo = oa < ob ? oa : ob;
        edge = c->top_p > 0 && abs(oa - ob) <= 1 && lo <= (c->per_segment_budget ? a->max_keep : ka) &&
               fabs(plan_share(la, lo, sc, nvis) - c->top_p) < tol;
        if (edge) (*knife)++;
        else if (oa != ob) PLAN_FAIL("own keep count cpu %d other %d", oa, ob);
    }
    if (ka != kb && !edge && !c->per_segment_budget) PLAN_FAIL("keep count cpu %d other %d", ka, kb);
    for (i = 0; i < a->max_keep; ++i) {
        if (i >= ka && la[i] != -1) { PLAN_FAIL("cpu entry %d = %d past the count %d", i, la[i], ka); break; }
        if (i >= kb && lb[i] != -1) { PLAN_FAIL("entry %d = %d past the count %d", i, lb[i], kb); break; }
    }
    for (i = 0; i < kmin && i < nf; ++i) {
        int want = i < ns ? i : (int)l0 + (i - (int)ns);
        if (la[i] != want || lb[i] != want) { PLAN_FAIL("always-kept entry %d: cpu %d other %d, %d expected", i, la[i], lb[i], want); break; }
    }
    if (kmin <= nf) return bad;
    for (i = nf; i < kb; ++i)
        if (lb[i] < ns || lb[i] >= l0) { PLAN_FAIL("entry %d = %d is not a ranked candidate [%d, %d)", i, lb[i], (int)ns, (int)l0); return bad; }
    for (i = nf; i < ka; ++i)
        if (la[i] < ns || la[i] >= l0) { PLAN_FAIL("cpu entry %d = %d is not a ranked candidate [%d, %d)", i, la[i], (int)ns, (int)l0); return bad; }
    last = sc[la[kmin - 1]];
    for (i = nf; i < kmin; ++i) {
        int in_b = 0, in_a = 0;
        for (j = nf; j < kmin; ++j) { in_b |= lb[j] == la[i]; in_a |= la[j] == lb[i]; }
        if (!in_b && !plan_near_tie(sc[la[i]], last, tol))
            PLAN_FAIL("block %d (score %.9g) kept by the cpu only; last kept %.9g", la[i], sc[la[i]], last);
        if (!in_a && !plan_near_tie(sc[lb[i]], last, tol))
            PLAN_FAIL("block %d (score %.9g) kept by the other only; last kept %.9g", lb[i], sc[lb[i]], last);
    }
#undef PLAN_FAIL
    return bad;
}

/* ------------------------------------------------------------ comparing keep sets of two backends */
/* A keep set as the host sees it (a backend's arrays copied down). */
typedef struct keep_host {
    ei_result r;
    int32_t heads, cap, n_kept, compressed;
    int64_t n_tokens, n, pcap;
    int32_t *index, *positions; /* [heads][cap] */
    uint8_t *mask;              /* [heads][n] */
    float *pooled;              /* [heads][pcap] */
} keep_host;
CHECK_FN int keep_int32_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}
/* A keep set with every output array in the side's memory. */
CHECK_FN ei_keep_set keep_new(const side *s, int32_t heads, int32_t cap, int64_t n, int64_t pcap) {
    ei_keep_set ks;
    memset(&ks, 0, sizeof ks);
    ks.heads_out = heads;
    ks.capacity = cap;
    ks.index = (int32_t *)mem_new(s, (size_t)heads * cap * 4);
    ks.positions = (int32_t *)mem_new(s, (size_t)heads * cap * 4);
    ks.mask = (uint8_t *)mem_new(s, (size_t)heads * n);
    ks.mask_capacity = n;
    ks.pooled = (float *)mem_new(s, (size_t)heads * pcap * 4);
    ks.pooled_capacity = pcap;
    return ks;
}
/* The side's arrays of a keep set, not read. */
CHECK_FN void keep_del(const side *s, ei_keep_set *ks) {
    size_t ib = (size_t)ks->heads_out * ks->capacity * 4;
    mem_del(s, ks->index, ib);
    mem_del(s, ks->positions, ib);
    mem_del(s, ks->mask, (size_t)ks->heads_out * ks->mask_capacity);
    mem_del(s, ks->pooled, (size_t)ks->heads_out * ks->pooled_capacity * 4);
}
/* Its host copy (o), the side's arrays freed. */
CHECK_FN void keep_take(const side *s, ei_keep_set *ks, ei_result r, keep_host *o) {
    size_t ib = (size_t)ks->heads_out * ks->capacity * 4;
    o->r = r;
    o->heads = ks->heads_out; o->cap = ks->capacity; o->n_kept = ks->n_kept; o->compressed = ks->compressed;
    o->n_tokens = ks->n_tokens; o->n = ks->mask_capacity; o->pcap = ks->pooled_capacity;
    o->index = (int32_t *)mem_down(s, ks->index, ib);
    o->positions = (int32_t *)mem_down(s, ks->positions, ib);
    o->mask = (uint8_t *)mem_down(s, ks->mask, (size_t)ks->heads_out * ks->mask_capacity);
    o->pooled = (float *)mem_down(s, ks->pooled, (size_t)ks->heads_out * ks->pooled_capacity * 4);
    keep_del(s, ks);
}
CHECK_FN void keep_free(keep_host *o) {
    free(o->index); free(o->positions); free(o->mask); free(o->pooled);
    o->index = o->positions = NULL; o->mask = NULL; o->pooled = NULL;
}
/* The map of keep-set head h (map NULL: row j holds position j). */
CHECK_FN const int32_t *keep_map(const int32_t *map, int64_t stride, int32_t h, int32_t div) {
    return map ? map + (size_t)(h / div) * (size_t)stride : NULL;
}
/* The positions a map holds (n rows), ascending, into held; returns how many. */
CHECK_FN int64_t keep_held(const int32_t *map, int64_t n, int32_t *held) {
    int64_t j, np = 0;
    for (j = 0; j < n; ++j)
        if (!map || map[j] >= 0) held[np++] = map ? map[j] : (int32_t)j;
    qsort(held, (size_t)np, sizeof *held, keep_int32_cmp);
    return np;
}
/* A keep set as the CPU documents it (rows ascending, holding the positions
   given, mask over exactly those rows, the W window positions kept); head h
   on map h / div (stride apart). */
CHECK_FN void keep_check_one(const char *who, const char *what, const keep_host *o, const int32_t *map, int64_t stride,
                             int32_t div, int64_t W) {
    int32_t h, i, *held;
    if (o->r != EI_OK) return;
    held = (int32_t *)malloc(sizeof(int32_t) * (size_t)(o->n_tokens + 1));
    if (!held) { printf("out of memory\n"); exit(2); }
    for (h = 0; h < o->heads; ++h) {
        const int32_t *m = keep_map(map, stride, h, div), *idx = o->index + (size_t)h * o->cap;
        const int32_t *pos = o->positions + (size_t)h * o->cap;
        int64_t np = keep_held(m, o->n_tokens, held), j, w = W < np ? W : np;
        int bad = 0, window = 0, masked = 0;
        for (i = 0; i < o->n_kept; ++i) {
            bad += idx[i] < 0 || idx[i] >= o->n_tokens || (i > 0 && idx[i] <= idx[i - 1]);
            if (idx[i] >= 0 && idx[i] < o->n_tokens) {
                bad += pos[i] != (m ? m[idx[i]] : idx[i]);
                bad += o->mask[(size_t)h * o->n + idx[i]] != 1;
                window += w > 0 && pos[i] >= held[np - w];
            }
        }
        for (j = 0; j < o->n_tokens; ++j) masked += o->mask[(size_t)h * o->n + j] == 1;
        CHECK(bad == 0 && window == w && masked == o->n_kept, "%s: %s head %d: %d bad rows, %d window rows, "
              "%d masked of %d kept", who, what, h, bad, window, masked, o->n_kept);
    }
    free(held);
}
/* b against a (the CPU's): the same kept positions but at near-ties of a's
   pooled scores (1e-3 relative), pooled scores within 1e-3. Returns the
   near-tie swaps. */
CHECK_FN int keep_compare(const char *what, const keep_host *a, const keep_host *b, const int32_t *map, int64_t stride,
                          int32_t div, int64_t W) {
    int32_t h, i, *held, *sa, *sb;
    int ties = 0, bad_set = 0, bad_pool = 0;
    CHECK(a->r == b->r, "%s: %s against %s", what, ei_result_name(b->r), ei_result_name(a->r));
    if (a->r != EI_OK || b->r != EI_OK) return 0;
    CHECK(a->n_kept == b->n_kept && a->compressed == b->compressed && a->n_tokens == b->n_tokens,
          "%s: n_kept %d/%d compressed %d/%d n_tokens %lld/%lld", what, a->n_kept, b->n_kept, a->compressed,
          b->compressed, (long long)a->n_tokens, (long long)b->n_tokens);
    if (a->n_kept != b->n_kept) return 0;
    held = (int32_t *)malloc(sizeof(int32_t) * (size_t)(a->n_tokens + 1));
    sa = (int32_t *)malloc(sizeof(int32_t) * (size_t)(a->n_kept + 1));
    sb = (int32_t *)malloc(sizeof(int32_t) * (size_t)(a->n_kept + 1));
    if (!held || !sa || !sb) { printf("out of memory\n"); exit(2); }
    for (h = 0; h < a->heads; ++h) {
        const int32_t *m = keep_map(map, stride, h, div);
        int64_t np = keep_held(m, a->n_tokens, held), L = np - W, j, x = 0, y = 0;
        const float *pa = a->pooled + (size_t)h * a->pcap, *pb = b->pooled + (size_t)h * b->pcap;
        double thr = HUGE_VAL;
        memcpy(sa, a->positions + (size_t)h * a->cap, sizeof(int32_t) * a->n_kept);
        memcpy(sb, b->positions + (size_t)h * b->cap, sizeof(int32_t) * b->n_kept);
        qsort(sa, (size_t)a->n_kept, sizeof *sa, keep_int32_cmp);
        qsort(sb, (size_t)b->n_kept, sizeof *sb, keep_int32_cmp);
        if (!a->compressed) {
            bad_set += memcmp(sa, sb, sizeof(int32_t) * a->n_kept) != 0;
            continue;
        }
        for (i = 0; i < a->n_kept; ++i) { /* the CPU's threshold: its lowest kept candidate */
            int32_t *at = (int32_t *)bsearch(&sa[i], held, (size_t)np, sizeof *held, keep_int32_cmp);
            if (at && at - held < L && pa[at - held] < thr) thr = pa[at - held];
        }
        while (x < a->n_kept || y < b->n_kept) { /* the symmetric difference, each at a near-tie */
            int32_t p;
            int32_t *at;
            if (x < a->n_kept && y < b->n_kept && sa[x] == sb[y]) { x++; y++; continue; }
            p = (y >= b->n_kept || (x < a->n_kept && sa[x] < sb[y])) ? sa[x++] : sb[y++];
            at = (int32_t *)bsearch(&p, held, (size_t)np, sizeof *held, keep_int32_cmp);
            if (!at || at - held >= L || !(fabs(pa[at - held] - thr) <= test_tols[TOL_DECODE_SCORE].tie * thr + 1e-9)) {
                if (bad_set++ < 3)
                    printf("  %s head %d: position %d kept by one backend only (cpu pooled %g, threshold %g)\n", what, h,
                           (int)p, at && at - held < L ? (double)pa[at - held] : -1.0, thr);
            } else
                ties++;
        }
        for (j = 0; j < L && j < a->pcap; ++j)
            if (!close_to(pb[j], pa[j], test_tols[TOL_DECODE_SCORE].abs, test_tols[TOL_DECODE_SCORE].rel) && bad_pool++ < 3)
                printf("  %s head %d pooled[%lld]: cpu %g gpu %g\n", what, h, (long long)j, (double)pa[j], (double)pb[j]);
    }
    CHECK(bad_set == 0, "%s: %d kept positions differ beyond near-ties", what, bad_set);
    CHECK(bad_pool == 0, "%s: pooled scores differ", what);
    free(held); free(sa); free(sb);
    return ties / 2;
}

#endif
