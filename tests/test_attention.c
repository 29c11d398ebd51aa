/* test_attention.c - block-sparse prefill attention against a naive reference.

   The reference (check.h: ref_attention) materialises every softmax row in
   double with the same key set (kept blocks + causal segment keys, or dense
   causal) from the values as stored (f16/bf16 converted exactly), so it
   checks the kernel's semantics and its arithmetic at once. Every kernel this machine can run is checked:
   scalar, AVX2, AVX-512 f32, AVX-512 BF16 (vdpbf16ps), AMX, NEON f32,
   NEON-BF16 (BFDOT) and NEON-BFMMLA (BFMMLA) on all-bf16 calls, NEON-FHM
   (FMLAL) on all-f16 calls (f32 sums, so the f32 bound).

   Error bound per output element (check.h's tolerance table: TOL_ATTN_REF,
   TOL_ATTN_ROUNDS_P, tol_out_rounding): |out - ref| <= tol * max|v| of its kv head,
     f32 arithmetic (every kernel but avx512-bf16):  1e-5 (+ output rounding:
       f16 out 2^-11, bf16 out 2^-8 relative)
     avx512-bf16 (P rounded to bf16 before P V):      4e-3
   plus: output finite, guard bytes around and between output rows intact,
   calls in ith/nth parts (one shared workspace), on threads and chunked
   calls (q_offset) give the same result, bad input (bad ei_exec fields
   included) returns the documented error and leaves out untouched.

   Build: make test-attention (test-attention-all: gcc, clang, C and C++,
   ASan/UBSan variants; tests/tests.mk). */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "check.h"

static double g_worst[9][3]; /* [kernel][input dtype]: largest error / tol-unit seen (amp 1 cases) */

/* ---- deterministic data ---------------------------------------------- */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double rnd_u(void) { /* [0,1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
static double rnd_n(void) { /* ~N(0,1) */
    double s = 0; int i;
    for (i = 0; i < 4; ++i) s += rnd_u();
    return (s - 2.0) * 1.7320508;
}

/* A [n][heads][d] tensor stored in dtype dt, values exactly representable. */
typedef struct buf { void *data; ei_dtype dt; int64_t n; int32_t heads, d; } buf;
static void buf_alloc(buf *b, ei_dtype dt, int64_t n, int32_t heads, int32_t d) {
    b->dt = dt; b->n = n; b->heads = heads; b->d = d;
    b->data = calloc((size_t)(n * heads * d), dtype_size(dt));
}
static void buf_set(buf *b, int64_t i, float x) { ei__store1(b->data, b->dt, i, x); }
static ei_tensor buf_view(const buf *b) { return ei_tensor_make(b->data, b->dt, b->n, b->heads, b->d); }

/* Q/K with structure: kv head 0 has an attention sink (rigid), the others
   drift so their entropies (and budgets) differ per head and segment. */
static void make_qkv(buf *q, buf *k, buf *v, int32_t G, float amp) {
    int64_t n = q->n, t;
    int32_t hk = k->heads, d = q->d, h, i;
    for (t = 0; t < n; ++t) {
        for (h = 0; h < hk; ++h) {
            double drift = sin((double)t * 0.05 * (h + 1)) * 2.0;
            for (i = 0; i < d; ++i) {
                double x = rnd_n();
                if (h == 0 && i == 0) x = t < 4 ? 40.0 : -1.0;   /* sink keys */
                if (h > 0 && i == 1) x += drift * (double)(t % 7) * 0.3;
                buf_set(k, (t * hk + h) * d + i, (float)(x * amp));
                buf_set(v, (t * hk + h) * d + i, (float)rnd_n());
            }
            for (i = 0; i < G; ++i) {
                int32_t qh = h * G + i, j;
                for (j = 0; j < d; ++j) {
                    double x = rnd_n();
                    if (h == 0 && j == 0) x = 3.0 + 0.1 * i;
                    if (h > 0 && j == 1) x += drift;
                    buf_set(q, (t * q->heads + qh) * d + j, (float)(x * amp));
                }
            }
        }
    }
}

/* ---- outputs: guarded, PAD_ELEMS extra elements between tokens (strided) -- */
#define PAD_ELEMS 5
static guarded_out out_alloc(ei_dtype dt, int64_t n, int32_t heads, int32_t d, int strided) {
    return guarded_out_make(dt, n, heads, d, strided ? PAD_ELEMS : 0);
}

/* ---- one configuration -------------------------------------------------- */
/* A kernel is forced by choosing the context's kernel table (cfg.simd);
   avx512-bf16 runs its vdpbf16ps stages on all-bf16 calls with an even dim,
   neon-bf16 and neon-bfmmla their BFDOT / BFMMLA stages on the same, neon-fhm its FMLAL stages on
   all-f16 calls with an even dim (offered here only for those). */
typedef struct kernel_desc { const char *name; ei_simd simd; } kernel_desc;
static const kernel_desc g_kernels[] = {
    {"scalar", EI_SIMD_SCALAR},
    {"avx2", EI_SIMD_AVX2},
    {"avx512", EI_SIMD_AVX512},
    {"avx512-bf16", EI_SIMD_AVX512_BF16},
    {"amx", EI_SIMD_AMX},
    {"neon", EI_SIMD_NEON},
    {"neon-bf16", EI_SIMD_NEON_BF16},
    {"neon-fhm", EI_SIMD_NEON_FHM},
    {"neon-bfmmla", EI_SIMD_NEON_BFMMLA},
};
static int kernel_available(const kernel_desc *kd, ei_dtype qkv, int32_t d) {
    if (!ei_cpu_supports(kd->simd)) return 0;
    if (kernel_rounds_p(kd->simd) || kd->simd == EI_SIMD_NEON_BF16 || kd->simd == EI_SIMD_NEON_BFMMLA) return qkv == EI_BF16 && d % 2 == 0;
    if (kd->simd == EI_SIMD_NEON_FHM) return qkv == EI_F16 && d % 2 == 0;
    return 1;
}

static ei_config small_config(void) {
    ei_config c = ei_config_default();
    c.segment_size = 16;
    c.block_size = 4;
    c.threshold_len = 32;
    c.base_budget = 8; /* 2 blocks; dynamic heads 2..6 blocks */
    c.rigid_entropy = 1e-5;
    return c;
}

typedef struct case_desc {
    int64_t n;
    int32_t H, HK, d;
    ei_dtype in_dt, out_dt;
    int use_plan, strided, nth;
    int64_t chunk;   /* 0: one call; else queries in chunks of this many tokens */
    float amp;       /* input scale (large: peaked softmax) */
    int per_segment; /* the reference's one count per segment (max over heads) */
    int small_cap;   /* attention contexts with a smaller base_budget than the plan's:
                        rows longer than the workspace's sort buffer run unsorted */
    int decode;      /* chunks through ei_attention_decode + merge in nth parts (nth
                        slices of the keys), checked bit-identical to the call on nth threads */
} case_desc;

/* One chunk of queries through the two decode calls in nth parts (one
   shared workspace of ei_sizes.decode for nth, the parts in turn); then the
   same call on nth threads, which must agree bit for bit (and its merge does
   nothing). */
static ei_result decode_chunk(ei_context *ctx, const ei_tensor *tq, const ei_tensor *tk, const ei_tensor *tv,
                              ei_out_tensor *to, int64_t t0, int nth) {
    ei_sizes z;
    ei_exec x;
    void *ws, *mtws;
    guarded_out o2;
    ei_result r;
    int ith;
    memset(&z, 0, sizeof z);
    CHECK(sizes_for(ctx, tk->n_tokens, tq->n_heads, tk->n_heads, tq->head_dim, 0, nth, &z) == EI_OK,
          "decode workspace size: %s", ei_last_error());
    ws = malloc(z.decode);
    for (ith = 0; ith < nth; ++ith) {
        x = ex_part(ith, nth, ws, z.decode);
        if ((r = ei_attention_decode(ctx, &x, tq, tk, tv, NULL, to, t0)) != EI_OK) { free(ws); return r; }
    }
    for (ith = 0; ith < nth; ++ith) {
        x = ex_part(ith, nth, ws, z.decode);
        if ((r = ei_attention_decode_merge(ctx, &x, to)) != EI_OK) { free(ws); return r; }
    }
    free(ws);
    mtws = malloc(z.decode + 1);
    o2 = guarded_out_make(to->dtype, to->n_tokens, to->n_heads, to->head_dim, 0);
    x = ex(nth, (char *)mtws + 1, z.decode); /* any alignment */
    r = ei_attention_decode(ctx, &x, tq, tk, tv, NULL, &o2.t, t0);
    CHECK(r == EI_OK, "decode on %d threads: %s", nth, ei_last_error());
    if (r == EI_OK) {
        int64_t t;
        int32_t h, e, same = 1;
        CHECK(ei_attention_decode_merge(ctx, &x, &o2.t) == EI_OK, "merge after a call on threads: %s", ei_last_error());
        for (t = 0; t < to->n_tokens; ++t)
            for (h = 0; h < to->n_heads; ++h)
                for (e = 0; e < to->head_dim; ++e) {
                    size_t es = dtype_size(to->dtype);
                    const unsigned char *a = (const unsigned char *)to->data +
                                             ((size_t)(t * to->token_stride + h * to->head_stride + e)) * es;
                    const unsigned char *b = (const unsigned char *)o2.t.data +
                                             ((size_t)(t * o2.t.token_stride + h * o2.t.head_stride + e)) * es;
                    if (memcmp(a, b, es) != 0) same = 0;
                }
        CHECK(same && guarded_out_intact(&o2), "decode on %d threads differs from the call in %d parts", nth, nth);
    }
    guarded_out_free(&o2);
    free(mtws);
    return EI_OK;
}

static void run_case(const case_desc *cd) {
    ei_config cfg = small_config();
    cfg.per_segment_budget = cd->per_segment;
    ei_context *ctx_prof;
    buf q, k, v;
    ei_plan plan;
    ei_tensor tv;
    double *ref, *vmax;
    ei_sizes zp;
    ei_exec x;
    void *wsp;
    unsigned kd;
    int32_t G = cd->H / cd->HK;
    int64_t i;
    memset(&plan, 0, sizeof plan);
    CHECK(ei_context_create(&cfg, &ctx_prof) == EI_OK, "context: %s", ei_last_error());
    buf_alloc(&q, cd->in_dt, cd->n, cd->H, cd->d);
    buf_alloc(&k, cd->in_dt, cd->n, cd->HK, cd->d);
    buf_alloc(&v, cd->in_dt, cd->n, cd->HK, cd->d);
    make_qkv(&q, &k, &v, G, cd->amp);
    tv = buf_view(&v);
    vmax = (double *)calloc((size_t)cd->HK, sizeof(double));
    for (i = 0; i < cd->HK; ++i) vmax[i] = ref_vmax(&tv, (int32_t)i);
    if (cd->use_plan) {
        ei_tensor tq = buf_view(&q), tk = buf_view(&k);
        CHECK(ei_plan_init(ctx_prof, &plan, cd->n, cd->HK, cd->d, 0, NULL, 0) == EI_OK, "plan: %s", ei_last_error());
        CHECK(sizes_for(ctx_prof, cd->n, cd->H, cd->HK, cd->d, 0, 1, &zp) == EI_OK, "ws");
        wsp = malloc(zp.profile);
        x = ex(1, wsp, zp.profile);
        CHECK(ei_profile(ctx_prof, &x, &tq, &tk, &plan) == EI_OK, "profile: %s", ei_last_error());
        free(wsp);
    }
    ref = (double *)malloc((size_t)(cd->n * cd->H * cd->d) * sizeof(double));
    {
        ei_tensor tq = buf_view(&q), tk = buf_view(&k);
        ref_attention(&cfg, cd->use_plan ? &plan : NULL, &tq, &tk, &tv, 0, ref);
    }

    for (kd = 0; kd < sizeof g_kernels / sizeof g_kernels[0]; ++kd) {
        const kernel_desc *K = &g_kernels[kd];
        ei_config c2 = cfg;
        ei_context *ctx;
        guarded_out o;
        ei_sizes z;
        void *ws;
        double tol, worst = 0;
        int64_t t0, t;
        int finite = 1, ith;
        if (!kernel_available(K, cd->in_dt, cd->d)) continue;
        c2.simd = K->simd;
        if (cd->small_cap) c2.base_budget = 4;
        if (ei_context_create(&c2, &ctx) != EI_OK) { CHECK(0, "context %s: %s", K->name, ei_last_error()); continue; }
        o = out_alloc(cd->out_dt, cd->n, cd->H, cd->d, cd->strided);
        /* one workspace for the nth parts of each call */
        CHECK(sizes_for(ctx, cd->n, cd->H, cd->HK, cd->d, 0, cd->nth, &z) == EI_OK, "ws size: %s", ei_last_error());
        ws = malloc(z.prefill);
        for (t0 = 0; t0 < cd->n; t0 += cd->chunk ? cd->chunk : cd->n) {
            int64_t nt = cd->chunk ? (cd->chunk < cd->n - t0 ? cd->chunk : cd->n - t0) : cd->n;
            size_t qes = dtype_size(cd->in_dt), oes = dtype_size(cd->out_dt);
            ei_tensor tq = ei_tensor_make((unsigned char *)q.data + (size_t)(t0 * cd->H * cd->d) * qes, cd->in_dt, nt, cd->H, cd->d);
            ei_tensor tk = ei_tensor_make(k.data, cd->in_dt, t0 + nt, cd->HK, cd->d);
            ei_tensor tv = ei_tensor_make(v.data, cd->in_dt, t0 + nt, cd->HK, cd->d);
            ei_out_tensor to = o.t;
            to.data = (unsigned char *)o.t.data + (size_t)(t0 * o.t.token_stride) * oes;
            to.n_tokens = nt;
            if (cd->decode) {
                ei_result r = decode_chunk(ctx, &tq, &tk, &tv, &to, t0, cd->nth);
                CHECK(r == EI_OK, "%s decode: %s", K->name, ei_last_error());
            } else
                for (ith = 0; ith < cd->nth; ++ith) {
                    ei_exec xp = ex_part(ith, cd->nth, ws, z.prefill);
                    ei_result r = ei_attention_prefill(ctx, &xp, &tq, &tk, &tv, cd->use_plan ? &plan : NULL, &to, t0);
                    CHECK(r == EI_OK, "%s: %s", K->name, ei_last_error());
                }
        }
        /* f32 logits carry ~eps*|q||k| error: the bound scales with amp^2 */
        tol = test_tols[kernel_rounds_p(K->simd) ? TOL_ATTN_ROUNDS_P : TOL_ATTN_REF].max_abs * (cd->amp > 1 ? cd->amp * cd->amp : 1.0);
        tol += tol_out_rounding(cd->out_dt);
        for (t = 0; t < cd->n; ++t) {
            int32_t h, e;
            for (h = 0; h < cd->H; ++h)
                for (e = 0; e < cd->d; ++e) {
                    double a = guarded_out_get(&o, t, h, e), b = ref[(t * cd->H + h) * cd->d + e];
                    double err = fabs(a - b) / (vmax[h / G] > 0 ? vmax[h / G] : 1.0);
                    if (!(a - a == 0)) finite = 0;
                    if (!(err <= worst)) worst = err; /* NaN-safe */
                }
        }
        if (cd->amp <= 1 && cd->out_dt == EI_F32 && worst > g_worst[kd][cd->in_dt]) g_worst[kd][cd->in_dt] = worst;
        CHECK(finite, "%s: non-finite output", K->name);
        CHECK(worst <= tol, "%s n=%lld H=%d HK=%d d=%d in=%d out=%d plan=%d chunk=%lld nth=%d: max err %.3g > %.3g",
              K->name, (long long)cd->n, cd->H, cd->HK, cd->d, cd->in_dt, cd->out_dt, cd->use_plan, (long long)cd->chunk,
              cd->nth, worst, tol);
        CHECK(guarded_out_intact(&o), "%s: guard bytes overwritten", K->name);
        free(ws);
        guarded_out_free(&o);
        ei_context_destroy(ctx);
    }
    if (cd->use_plan) ei_plan_free(ctx_prof, &plan);
    ei_context_destroy(ctx_prof);
    free(ref); free(vmax); free(q.data); free(k.data); free(v.data);
}

/* The plans these tests make really are ragged and sparse. */
static void test_plans_are_ragged(void) {
    ei_config cfg = small_config();
    ei_context *ctx;
    buf q, k, v;
    ei_plan plan;
    ei_sizes z;
    ei_exec x;
    void *ws;
    int32_t s, h, distinct = 0, sparse = 0, rigid = 0;
    ei_tensor tq, tk;
    ei_context_create(&cfg, &ctx);
    buf_alloc(&q, EI_F32, 200, 8, 64); buf_alloc(&k, EI_F32, 200, 4, 64); buf_alloc(&v, EI_F32, 200, 4, 64);
    make_qkv(&q, &k, &v, 2, 1.0f);
    tq = buf_view(&q); tk = buf_view(&k);
    ei_plan_init(ctx, &plan, 200, 4, 64, 0, NULL, 0);
    sizes_for(ctx, 200, 8, 4, 64, 0, 1, &z);
    ws = malloc(z.profile);
    x = ex(1, ws, z.profile);
    CHECK(ei_profile(ctx, &x, &tq, &tk, &plan) == EI_OK, "profile: %s", ei_last_error());
    for (s = 0; s < plan.n_segments; ++s) {
        int32_t c0 = plan.keep_count[s];
        if (ei_plan_segment_is_sparse(ctx, &plan, s)) ++sparse;
        for (h = 1; h < 4; ++h)
            if (plan.keep_count[(size_t)h * (size_t)plan.seg_capacity + (size_t)s] != c0) { ++distinct; break; }
    }
    for (h = 0; h < 4; ++h) rigid += plan.head_class[h] == EI_HEAD_RIGID;
    printf("plan: %d segments, %d sparse, %d with per-head counts differing, %d rigid heads\n", plan.n_segments, sparse,
           distinct, rigid);
    CHECK(sparse > 3 && distinct > 0, "test plans are not ragged/sparse enough");
    free(ws); ei_plan_free(ctx, &plan); ei_context_destroy(ctx);
    free(q.data); free(k.data); free(v.data);
}

/* ---- bad input ---------------------------------------------------------- */
static void test_bad_inputs(void) {
    ei_config cfg = small_config();
    ei_context *ctx;
    buf q, k, v;
    ei_plan plan;
    guarded_out o;
    ei_tensor tq, tk, tv, bad;
    ei_out_tensor to, bo;
    ei_shape shape;
    ei_sizes z, z2;
    ei_exec x, xb;
    size_t wsb;
    void *ws, *pws, *ws2;
    int32_t saved;
    unsigned char *snap;
    ei_context_create(&cfg, &ctx);
    buf_alloc(&q, EI_F32, 100, 4, 32); buf_alloc(&k, EI_F32, 100, 2, 32); buf_alloc(&v, EI_F32, 100, 2, 32);
    make_qkv(&q, &k, &v, 2, 1.0f);
    tq = buf_view(&q); tk = buf_view(&k); tv = buf_view(&v);
    o = out_alloc(EI_F32, 100, 4, 32, 0);
    to = o.t;
    sizes_for(ctx, 100, 4, 2, 32, 0, 1, &z);
    wsb = z.prefill;
    ws = malloc(wsb);
    x = ex(1, ws, wsb);
    ei_plan_init(ctx, &plan, 100, 2, 32, 0, NULL, 0);
    pws = malloc(z.profile);
    xb = ex(1, pws, z.profile);
    ei_profile(ctx, &xb, &tq, &tk, &plan);
    snap = (unsigned char *)malloc(o.bytes);
    memcpy(snap, o.t.data, o.bytes);
#define BAD(expr, code)                                                                                      \
    do {                                                                                                     \
        ei_result r_ = (expr);                                                                               \
        CHECK(r_ == (code), "%s returned %s (%s), expected %s", #expr, ei_result_name(r_), ei_last_error(), \
              ei_result_name(code));                                                                         \
        CHECK(memcmp(snap, o.t.data, o.bytes) == 0, "%s wrote to out", #expr);                                 \
    } while (0)
/* a refused ei_exec: the code, a message that names the ei_exec, out untouched */
#define BADX(code)                                                                                           \
    do {                                                                                                     \
        ei_result r_ = ei_attention_prefill(ctx, &xb, &tq, &tk, &tv, NULL, &to, 0);                          \
        CHECK(r_ == (code) && strstr(ei_last_error(), #code) && strstr(ei_last_error(), "ei_exec"),         \
              "ei_exec n_threads %d ith %d nth %d: %s (%s), expected %s", (int)xb.n_threads, (int)xb.ith,     \
              (int)xb.nth, ei_result_name(r_), ei_last_error(), #code);                                      \
        CHECK(memcmp(snap, o.t.data, o.bytes) == 0, "ei_exec n_threads %d ith %d nth %d wrote to out",       \
              (int)xb.n_threads, (int)xb.ith, (int)xb.nth);                                                  \
    } while (0)
    BAD(ei_attention_prefill(NULL, &x, &tq, &tk, &tv, NULL, &to, 0), EI_ERR_NULL);
    BAD(ei_attention_prefill(ctx, &x, NULL, &tk, &tv, NULL, &to, 0), EI_ERR_NULL);
    BAD(ei_attention_prefill(ctx, &x, &tq, NULL, &tv, NULL, &to, 0), EI_ERR_NULL);
    BAD(ei_attention_prefill(ctx, &x, &tq, &tk, NULL, NULL, &to, 0), EI_ERR_NULL);
    BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, NULL, 0), EI_ERR_NULL);
    xb = ex(1, NULL, wsb);
    BAD(ei_attention_prefill(ctx, &xb, &tq, &tk, &tv, NULL, &to, 0), EI_ERR_NULL);
    BAD(ei_attention_prefill(ctx, NULL, &tq, &tk, &tv, NULL, &to, 0), EI_ERR_NULL); /* NULL ei_exec: no workspace */
    xb = ex(1, ws, wsb - 1);
    BAD(ei_attention_prefill(ctx, &xb, &tq, &tk, &tv, NULL, &to, 0), EI_ERR_WORKSPACE);
    xb = ex_part(1, 1, ws, wsb);
    BAD(ei_attention_prefill(ctx, &xb, &tq, &tk, &tv, NULL, &to, 0), EI_ERR_SIZE);
    xb = ex_part(-1, 2, ws, wsb);
    BAD(ei_attention_prefill(ctx, &xb, &tq, &tk, &tv, NULL, &to, 0), EI_ERR_SIZE);
    xb = ex_part(2, 2, ws, wsb);
    BAD(ei_attention_prefill(ctx, &xb, &tq, &tk, &tv, NULL, &to, 0), EI_ERR_SIZE);
    BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, &to, -1), EI_ERR_SIZE);
    BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, &to, 1), EI_ERR_SHAPE); /* keys too short */
    bad = tq; bad.dtype = (ei_dtype)3; /* in the enum's value range (C++), not a dtype */
    BAD(ei_attention_prefill(ctx, &x, &bad, &tk, &tv, NULL, &to, 0), EI_ERR_DTYPE);
    bad = tk; bad.token_stride = 16; /* aliases heads */
    BAD(ei_attention_prefill(ctx, &x, &tq, &bad, &tv, NULL, &to, 0), EI_ERR_STRIDE);
    bad = tv; bad.head_stride = 0;
    BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &bad, NULL, &to, 0), EI_ERR_STRIDE);
    bad = tv; bad.n_heads = 1; bad.token_stride = 32;
    BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &bad, NULL, &to, 0), EI_ERR_SHAPE);
    bad = tk; bad.n_heads = 3; bad.token_stride = 96;
    BAD(ei_attention_prefill(ctx, &x, &tq, &bad, &tv, NULL, &to, 0), EI_ERR_GQA);
    bo = to; bo.n_tokens = 99;
    BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, &bo, 0), EI_ERR_SHAPE);
    bo = to; bo.head_dim = 16;
    BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, &bo, 0), EI_ERR_SHAPE);
    bo = to; bo.data = k.data; bo.n_heads = 2; bo.token_stride = 64; bo.dtype = EI_F32;
    {   /* out overlapping k */
        ei_tensor q2 = tq; q2.n_heads = 2; q2.token_stride = 128;
        ei_result r = ei_attention_prefill(ctx, &x, &q2, &tk, &tv, NULL, &bo, 0);
        CHECK(r == EI_ERR_OVERLAP, "out overlapping k: %s", ei_result_name(r));
    }
    /* plans */
    {   /* edited layout fields are refused by the seal, before any array is read */
        ei_plan p2 = plan;
        p2.n_kv_heads = 3;
        BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, &p2, &to, 0), EI_ERR_STATE);
        p2 = plan; p2.n_tokens = 50;
        BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, &p2, &to, 0), EI_ERR_STATE);
        p2 = plan; p2.block_index = NULL;
        BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, &p2, &to, 0), EI_ERR_STATE);
        p2 = plan; p2.entropy = NULL;
        BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, &p2, &to, 0), EI_ERR_NULL);
    }
    {   /* a sparse segment whose plan row names a block at its own start, or -1, or too many */
        int32_t s = 4; /* tokens 64..79: sparse (threshold 32, not last) */
        size_t row = (size_t)1 * (size_t)plan.seg_capacity + (size_t)s;
        int32_t *idx = plan.block_index + row * (size_t)plan.max_keep, old = idx[0];
        CHECK(ei_plan_segment_is_sparse(ctx, &plan, s) && plan.keep_count[row] > 0, "segment 4 should be sparse");
        idx[0] = s * (16 / 4);
        BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, &plan, &to, 0), EI_ERR_SHAPE);
        idx[0] = -1;
        BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, &plan, &to, 0), EI_ERR_SHAPE);
        idx[0] = old;
        saved = plan.keep_count[row];
        plan.keep_count[row] = plan.max_keep + 1;
        BAD(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, &plan, &to, 0), EI_ERR_SHAPE);
        plan.keep_count[row] = saved;
    }
    /* the sizes */
    memset(&shape, 0, sizeof shape);
    shape.max_tokens = 100; shape.n_heads = 4; shape.n_kv_heads = 3; shape.head_dim = 32;
    BAD(ei_layer_sizes(ctx, &shape, &z2), EI_ERR_GQA);
    shape.n_kv_heads = 2; shape.head_dim = 0;
    BAD(ei_layer_sizes(ctx, &shape, &z2), EI_ERR_SIZE);
    shape.head_dim = 32;
    BAD(ei_layer_sizes(ctx, &shape, NULL), EI_ERR_NULL);
    BAD(ei_layer_sizes(ctx, NULL, &z2), EI_ERR_NULL);
    shape.n_threads = -1;
    BAD(ei_layer_sizes(ctx, &shape, &z2), EI_ERR_SIZE);
    shape.n_threads = 3;
    CHECK(ei_layer_sizes(ctx, &shape, &z2) == EI_OK && z2.prefill == 3 * z.prefill && z2.profile == 3 * z.profile &&
              z2.decode_keep == 3 * z.decode_keep && z2.decode > z.decode && z2.plan == z.plan &&
              z2.decoder == z.decoder &&
              z2.workspace == EI__MAX(EI__MAX(z2.profile, z2.prefill), EI__MAX(z2.decode, z2.decode_keep)),
          "ei_layer_sizes for 3 threads: the per-thread workspaces x 3, the rest as for one (%s)", ei_last_error());
#ifndef EI_NO_PTHREADS /* without threads one share of workspace is enough */
    xb = ex(2, ws, wsb);
    BAD(ei_attention_prefill(ctx, &xb, &tq, &tk, &tv, NULL, &to, 0), EI_ERR_WORKSPACE);
#endif
    /* ei_exec fields out of range, or threads and parts at once */
    xb = ex(-1, ws, wsb); BADX(EI_ERR_SIZE);
    xb = ex(EI__MAX_THREADS + 1, ws, wsb); BADX(EI_ERR_SIZE);
    xb = ex_part(0, EI__MAX_THREADS + 1, ws, wsb); BADX(EI_ERR_SIZE);
    xb = ex_part(0, -1, ws, wsb); BADX(EI_ERR_SIZE);
    xb = ex_part(0, 2, ws, wsb); xb.n_threads = 2; BADX(EI_ERR_CONFIG);
    /* parts share ONE workspace: one thread's is too small for 2 parts, a
       workspace for 2 serves both, and so does one for 3 (any alignment) */
    xb = ex_part(0, 2, ws, wsb);
    BAD(ei_attention_prefill(ctx, &xb, &tq, &tk, &tv, NULL, &to, 0), EI_ERR_WORKSPACE);
    xb = ex_part(1, 2, ws, wsb);
    BAD(ei_attention_prefill(ctx, &xb, &tq, &tk, &tv, NULL, &to, 0), EI_ERR_WORKSPACE);
    ws2 = malloc(z2.prefill + 1);
    {
        int ith, ok = 1;
        for (ith = 0; ith < 2; ++ith) {
            xb = ex_part(ith, 2, (char *)ws2 + 1, z2.prefill);
            ok &= ei_attention_prefill(ctx, &xb, &tq, &tk, &tv, &plan, &to, 0) == EI_OK;
        }
        CHECK(ok, "2 parts on a workspace for 3: %s", ei_last_error());
    }
    free(ws2);
    /* and a good call still works */
    CHECK(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, &plan, &to, 0) == EI_OK, "good call: %s", ei_last_error());
    CHECK(guarded_out_intact(&o), "guards");
#undef BADX
#undef BAD
    free(snap); free(ws); free(pws); guarded_out_free(&o);
    ei_plan_free(ctx, &plan);
    ei_context_destroy(ctx);
    free(q.data); free(k.data); free(v.data);
}

/* Extreme magnitudes: peaked softmax, overflowing dot products: never NaN/Inf. */
static void test_extremes(void) {
    ei_config cfg = small_config();
    unsigned kd;
    float amps[3] = {30.0f, 1e4f, 1e19f};
    int a;
    for (a = 0; a < 3; ++a)
        for (kd = 0; kd < sizeof g_kernels / sizeof g_kernels[0]; ++kd) {
            const kernel_desc *K = &g_kernels[kd];
            ei_dtype dt = kernel_rounds_p(K->simd) || K->simd == EI_SIMD_NEON_BF16 || K->simd == EI_SIMD_NEON_BFMMLA ? EI_BF16
                          : K->simd == EI_SIMD_NEON_FHM ? EI_F16 : EI_F32;
            ei_config c2 = cfg;
            ei_context *ctx;
            buf q, k, v;
            ei_tensor tq, tk, tv;
            guarded_out o;
            ei_sizes z;
            ei_exec x;
            void *ws;
            int64_t i;
            int finite = 1;
            if (!kernel_available(K, dt, 64)) continue;
            if (dt == EI_F16 && amps[a] * 40.0f > 65504.0f) continue; /* the sink keys (40 amp) past f16's range */
            c2.simd = K->simd;
            ei_context_create(&c2, &ctx);
            buf_alloc(&q, dt, 90, 2, 64); buf_alloc(&k, dt, 90, 1, 64); buf_alloc(&v, dt, 90, 1, 64);
            make_qkv(&q, &k, &v, 2, amps[a]);
            tq = buf_view(&q); tk = buf_view(&k); tv = buf_view(&v);
            o = out_alloc(EI_F32, 90, 2, 64, 0);
            sizes_for(ctx, 90, 2, 1, 64, 0, 2, &z); /* for 2 threads (the decode below); more than 1 needs */
            ws = malloc(z.prefill);
            x = ex(1, ws, z.prefill);
            CHECK(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, &o.t, 0) == EI_OK, "extreme");
            for (i = 0; i < 90 * 2 * 64; ++i) {
                float x = ((float *)o.t.data)[i];
                if (!(x - x == 0)) finite = 0;
                if (fabsf(x) > 10.0f) finite = 0; /* a convex combination of |v| < ~7 */
            }
            CHECK(finite, "%s amp %g: non-finite or out-of-hull output", K->name, (double)amps[a]);
            CHECK(guarded_out_intact(&o), "guards");
            { /* the same as decode steps: the last 1 and 5 tokens against the keys before them, split in 2 */
                int64_t nt;
                for (nt = 1; nt <= 5; nt += 4) {
                    ei_tensor q1 = tq;
                    guarded_out o1 = out_alloc(EI_F32, nt, 2, 64, 0);
                    void *dws;
                    ei_exec xd;
                    q1.data = (char *)q.data + (size_t)(90 - nt) * (size_t)tq.token_stride * (dt == EI_F32 ? 4u : 2u);
                    q1.n_tokens = nt;
                    dws = malloc(z.decode);
                    xd = ex(2, dws, z.decode);
                    CHECK(ei_attention_decode(ctx, &xd, &q1, &tk, &tv, NULL, &o1.t, 90 - nt) == EI_OK, "extreme decode: %s",
                          ei_last_error());
                    for (i = 0, finite = 1; i < nt * 2 * 64; ++i) {
                        float x = ((float *)o1.t.data)[i];
                        if (!(x - x == 0) || fabsf(x) > 10.0f) finite = 0;
                    }
                    CHECK(finite, "%s amp %g: decode of %d tokens non-finite or out of the hull", K->name, (double)amps[a], (int)nt);
                    CHECK(guarded_out_intact(&o1), "decode guards");
                    free(dws); guarded_out_free(&o1);
                }
            }
            free(ws); guarded_out_free(&o); ei_context_destroy(ctx);
            free(q.data); free(k.data); free(v.data);
        }
}

/* ei_attention_prefill on 3 threads, and in 3 parts (one shared
   workspace), equals the single-threaded result bit for bit (each query row
   is computed by one thread in the same order). */
static void test_mt(void) {
    ei_config cfg = small_config();
    ei_context *ctx;
    buf q, k, v;
    ei_tensor tq, tk, tv;
    guarded_out o1, o2, o3;
    ei_sizes z;
    ei_exec x;
    void *ws;
    int ith, ok = 1;
    ei_context_create(&cfg, &ctx);
    buf_alloc(&q, EI_F32, 300, 8, 128); buf_alloc(&k, EI_F32, 300, 2, 128); buf_alloc(&v, EI_F32, 300, 2, 128);
    make_qkv(&q, &k, &v, 4, 1.0f);
    tq = buf_view(&q); tk = buf_view(&k); tv = buf_view(&v);
    o1 = out_alloc(EI_F32, 300, 8, 128, 0);
    o2 = out_alloc(EI_F32, 300, 8, 128, 0);
    o3 = out_alloc(EI_F32, 300, 8, 128, 0);
    sizes_for(ctx, 300, 8, 2, 128, 0, 3, &z);
    ws = malloc(z.prefill);
    x = ex(1, ws, z.prefill);
    CHECK(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, &o1.t, 0) == EI_OK, "st");
    x = ex(3, ws, z.prefill);
    CHECK(ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, &o2.t, 0) == EI_OK, "mt: %s", ei_last_error());
    CHECK(memcmp(o1.t.data, o2.t.data, o1.bytes) == 0 && guarded_out_intact(&o1) && guarded_out_intact(&o2),
          "mt result differs from single-threaded");
    for (ith = 2; ith >= 0; --ith) { /* any order */
        x = ex_part(ith, 3, ws, z.prefill);
        ok &= ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, &o3.t, 0) == EI_OK;
    }
    CHECK(ok && memcmp(o1.t.data, o3.t.data, o1.bytes) == 0 && guarded_out_intact(&o3),
          "3 parts on one workspace differ from single-threaded (%s)", ei_last_error());
    free(ws); guarded_out_free(&o1); guarded_out_free(&o2); guarded_out_free(&o3); ei_context_destroy(ctx);
    free(q.data); free(k.data); free(v.data);
}

/* ei_attention_decode and its merge refuse what they cannot serve, with a
   code, before writing anything; NaN in a key is reported by the part whose
   slice holds it. In parts the partials live in the one workspace
   (ei_sizes.decode for nth): nth x n_tokens x n_heads rows of head_dim + 2
   floats from its first 64-byte boundary, then the parts' attention
   workspaces (the layout the exact-size checks below rely on). */
static void test_decode_bad_inputs(void) {
    ei_config cfg = small_config();
    ei_context *ctx;
    buf q, k, v;
    ei_tensor tq, tk, tv, q17;
    guarded_out o;
    ei_sizes z, z1;
    ei_shape shape;
    ei_exec x;
    size_t pb, need;
    unsigned char *raw, *ws;
    ei_result r0, r1;
    ei_context_create(&cfg, &ctx);
    buf_alloc(&q, EI_F32, 300, 8, 64); buf_alloc(&k, EI_F32, 300, 2, 64); buf_alloc(&v, EI_F32, 300, 2, 64);
    make_qkv(&q, &k, &v, 4, 1.0f);
    tq = buf_view(&q); tk = buf_view(&k); tv = buf_view(&v);
    tq.n_tokens = 1;
    o = out_alloc(EI_F32, 1, 8, 64, 0);
    sizes_for(ctx, 300, 8, 2, 64, 0, 1, &z1);
    pb = 2 * 8 * 66 * 4; /* the partials of 2 parts of a one-token step */
    need = pb + 2 * z1.prefill;
    CHECK(sizes_for(ctx, 300, 8, 2, 64, 0, 2, &z) == EI_OK && z.decode >= 16 * pb + 2 * z1.prefill,
          "decode workspace %zu for 2 parts: short of 16 tokens' partials and 2 attention workspaces", z.decode);
    raw = (unsigned char *)malloc(z.decode + 64);
    ws = raw + (64 - (uintptr_t)raw % 64) % 64; /* 64-byte aligned: the partials start at ws */
    memset(&shape, 0, sizeof shape);
    shape.max_tokens = 300; shape.n_heads = 8; shape.n_kv_heads = 2; shape.head_dim = 64; shape.n_threads = -1;
    CHECK(ei_layer_sizes(ctx, &shape, &z1) == EI_ERR_SIZE, "n_threads -1 accepted");
    sizes_for(ctx, 300, 8, 2, 64, 0, 1, &z1);
    q17 = buf_view(&q); q17.n_tokens = 17;
    x = ex_part(0, 2, ws, z.decode);
    CHECK(ei_attention_decode(ctx, &x, &q17, &tk, &tv, NULL, &o.t, 0) == EI_ERR_SIZE, "q of 17 tokens");
    x = ex_part(2, 2, ws, z.decode);
    CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &o.t, 299) == EI_ERR_SIZE, "ith == nth");
    x = ex_part(0, 2, NULL, 0);
    CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &o.t, 299) == EI_ERR_NULL, "workspace NULL");
    x = ex_part(0, 2, ws, pb - 4);
    CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &o.t, 299) == EI_ERR_WORKSPACE, "no room for the partials");
    x = ex_part(0, 2, raw + 1, z.decode);
    CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &o.t, 299) == EI_OK, "a misaligned workspace: %s",
          ei_last_error());
    x = ex_part(1, 2, ws, need - 1);
    CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &o.t, 299) == EI_ERR_WORKSPACE,
          "workspace a byte short of 2 parts");
    x = ex_part(1, 2, ws, need);
    CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &o.t, 299) == EI_OK, "workspace of exactly 2 parts: %s",
          ei_last_error());
    x = ex_part(0, 2, ws, z.decode);
    CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &o.t, 300) == EI_ERR_SHAPE, "a query past the keys");
    x = ex_part(0, 2, ws, pb - 4);
    CHECK(ei_attention_decode_merge(ctx, &x, &o.t) == EI_ERR_WORKSPACE, "merge: no room for the partials");
    x = ex_part(0, 2, NULL, 0);
    CHECK(ei_attention_decode_merge(ctx, &x, &o.t) == EI_ERR_NULL, "merge: workspace NULL");
    {
        ei_out_tensor over = o.t;
        over.data = ws;
        x = ex_part(0, 2, ws, z.decode);
        CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &over, 299) == EI_ERR_OVERLAP, "out over the partials");
        CHECK(ei_attention_decode_merge(ctx, &x, &over) == EI_ERR_OVERLAP, "merge: out over partials");
    }
    CHECK(guarded_out_intact(&o), "guard bytes overwritten");
    /* NaN in key 200: the slice of part 1 of 2 (keys 128..299) */
    ((float *)k.data)[(200 * 2 + 1) * 64 + 3] = NAN;
    tq.data = (float *)q.data + 299 * 8 * 64;
    x = ex_part(0, 2, ws, z.decode);
    r0 = ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &o.t, 299);
    x = ex_part(1, 2, ws, z.decode);
    r1 = ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &o.t, 299);
    CHECK(r0 == EI_OK && r1 == EI_ERR_NONFINITE, "NaN key: part results %d %d", (int)r0, (int)r1);
    free(raw); guarded_out_free(&o); ei_context_destroy(ctx);
    free(q.data); free(k.data); free(v.data);
}

/* ei_attention_decode with a keep set: a step through it equals the double
   reference over the set's kept rows and the rows appended since (every
   kernel; sets shared, per kv head and per query head; made well before the
   step and at its first query; 1 and 3 tokens; in 1 and 3 parts on one
   workspace, the call on as many threads bit-identical to the parts), and a
   set it cannot serve is refused with a code before anything is written. */
static void test_decode_keep(void) {
    ei_config cfg = small_config();
    enum { N = 400, H = 8, HK = 2, D = 72, KEPT = 120, CAP = 130 };
    int32_t *index = (int32_t *)malloc(sizeof(int32_t) * H * CAP + 8);
    unsigned kd;
    int di;
    for (di = 0; di < 2; ++di) {
        ei_dtype dt = di ? EI_BF16 : EI_F32;
        buf q, k, v;
        buf_alloc(&q, dt, N, H, D); buf_alloc(&k, dt, N, HK, D); buf_alloc(&v, dt, N, HK, D);
        make_qkv(&q, &k, &v, H / HK, 1.0f);
        for (kd = 0; kd < sizeof g_kernels / sizeof g_kernels[0]; ++kd) {
            const kernel_desc *K = &g_kernels[kd];
            ei_config c2 = cfg;
            ei_context *ctx;
            int ho, nt, nth, mi;
            if (!kernel_available(K, dt, D)) continue;
            c2.simd = K->simd;
            ei_context_create(&c2, &ctx);
            for (ho = 0; ho < 3; ++ho)
                for (nt = 1; nt <= 3; nt += 2)
                    for (mi = 0; mi < 2; ++mi)
                        for (nth = 1; nth <= 3; nth += 2) {
                            const int32_t heads_out = ho == 0 ? 1 : ho == 1 ? HK : H;
                            const int64_t q_offset = N - nt, made = mi ? q_offset + 1 : 333;
                            ei_keep_set keep;
                            ei_tensor tq = buf_view(&q), tk = buf_view(&k), tv = buf_view(&v);
                            guarded_out o = out_alloc(EI_F32, nt, H, D, 0), o2 = out_alloc(EI_F32, nt, H, D, 0);
                            double *ref = (double *)malloc(sizeof(double) * (size_t)nt * H * D), worst = 0, tol;
                            ei_sizes z;
                            ei_exec x;
                            void *ws, *mtws;
                            int32_t s, i, row, h, e;
                            int64_t t;
                            memset(&keep, 0, sizeof keep);
                            keep.heads_out = heads_out; keep.capacity = CAP; keep.n_kept = KEPT; keep.n_tokens = made;
                            keep.index = index;
                            for (s = 0; s < heads_out; ++s) /* KEPT ascending rows of 0 .. made - 1, a different pattern per set */
                                for (i = 0, row = 0; i < KEPT; ++row)
                                    if ((row * 7 + s * 3) % 5 < 2 || row >= made - (KEPT - i)) index[s * CAP + i++] = row;
                            tq.data = (unsigned char *)q.data + (size_t)q_offset * H * D * dtype_size(dt);
                            tq.n_tokens = nt;
                            sizes_for(ctx, N, H, HK, D, 0, nth, &z);
                            ws = malloc(z.decode); mtws = malloc(z.decode);
                            for (i = 0; i < nth; ++i) {
                                x = ex_part(i, nth, ws, z.decode);
                                CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, &keep, &o.t, q_offset) == EI_OK,
                                      "%s decode with a keep set, part %d of %d: %s", K->name, i, nth, ei_last_error());
                            }
                            for (i = 0; i < nth; ++i) {
                                x = ex_part(i, nth, ws, z.decode);
                                CHECK(ei_attention_decode_merge(ctx, &x, &o.t) == EI_OK, "merge");
                            }
                            x = ex(nth, mtws, z.decode);
                            CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, &keep, &o2.t, q_offset) == EI_OK,
                                  "%s decode with a keep set on %d threads: %s", K->name, nth, ei_last_error());
                            CHECK(memcmp(o.t.data, o2.t.data, o.bytes) == 0, "%s decode with a keep set on %d threads differs "
                                  "from the call in %d parts", K->name, nth, nth);
                            for (t = 0; t < nt; ++t)
                                ref_attention_keep(&c2, &keep, &tq, &tk, &tv, q_offset, t, ref + (size_t)t * H * D);
                            for (t = 0; t < nt; ++t)
                                for (h = 0; h < H; ++h)
                                    for (e = 0; e < D; ++e) {
                                        double a = guarded_out_get(&o, t, h, e), b = ref[((size_t)t * H + h) * D + e];
                                        if (!(fabs(a - b) <= worst)) worst = fabs(a - b);
                                    }
                            tol = test_tols[kernel_rounds_p(K->simd) ? TOL_ATTN_ROUNDS_P : TOL_ATTN_REF].max_abs;
                            CHECK(worst <= tol * 8, "%s %s heads_out %d nt %d made %lld nth %d: max err %.3g", K->name,
                                  dt == EI_F32 ? "f32" : "bf16", heads_out, nt, (long long)made, nth, worst);
                            CHECK(guarded_out_intact(&o) && guarded_out_intact(&o2), "guards");
                            free(ref); free(ws); free(mtws); guarded_out_free(&o); guarded_out_free(&o2);
                        }
            ei_context_destroy(ctx);
        }
        if (dt == EI_F32) { /* what is refused */
            ei_context *ctx;
            ei_keep_set keep;
            ei_tensor tq = buf_view(&q), tk = buf_view(&k), tv = buf_view(&v);
            guarded_out o = out_alloc(EI_F32, 1, H, D, 0);
            ei_sizes z;
            ei_exec x;
            unsigned char *raw, *ws;
            int32_t i;
            ei_context_create(&cfg, &ctx);
            tq.data = (float *)q.data + (size_t)(N - 1) * H * D;
            tq.n_tokens = 1;
            sizes_for(ctx, N, H, HK, D, 0, 1, &z);
            raw = (unsigned char *)malloc(z.decode + 64);
            ws = raw + (64 - (uintptr_t)raw % 64) % 64; /* the partials start at ws */
            x = ex(1, ws, z.decode);
            memset(&keep, 0, sizeof keep);
            keep.heads_out = HK; keep.capacity = CAP; keep.n_kept = KEPT; keep.n_tokens = 300; keep.index = index;
            for (i = 0; i < HK * CAP; ++i) index[i] = (i % CAP) * 2;
#define DK(code, what) CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, &keep, &o.t, N - 1) == (code), \
                             "decode_keep: %s: %s", what, ei_last_error())
            DK(EI_OK, "a good set");
            keep.heads_out = 3; DK(EI_ERR_SHAPE, "3 rows for 2 kv / 8 query heads"); keep.heads_out = HK;
            keep.n_tokens = N + 1; DK(EI_ERR_SHAPE, "a set made after the step's first query"); keep.n_tokens = 300;
            keep.n_kept = CAP + 1; DK(EI_ERR_SHAPE, "n_kept over capacity"); keep.n_kept = KEPT;
            keep.n_tokens = KEPT - 1; DK(EI_ERR_SHAPE, "n_kept over the rows scored"); keep.n_tokens = 300;
            index[CAP + 5] = index[CAP + 4]; DK(EI_ERR_SHAPE, "rows not ascending"); index[CAP + 5] = 10;
            index[CAP + KEPT - 1] = 300; DK(EI_ERR_SHAPE, "a row past the rows scored"); index[CAP + KEPT - 1] = 2 * (KEPT - 1);
            keep.index = NULL; DK(EI_ERR_NULL, "index NULL");
            keep.index = (int32_t *)(void *)((char *)index + 2); DK(EI_ERR_ALIGN, "index misaligned"); keep.index = index;
            CHECK(ei_attention_decode(ctx, &x, &tq, &tk, &tv, NULL, &o.t, N - 1) == EI_OK,
                  "decode_keep: keep NULL is dense decode");
            keep.index = (int32_t *)(void *)ws; /* the set inside what the call writes */
            DK(EI_ERR_OVERLAP, "index inside the partials");
            keep.index = index;
            DK(EI_OK, "the good set again");
#undef DK
            CHECK(guarded_out_intact(&o), "guards");
            free(raw); guarded_out_free(&o); ei_context_destroy(ctx);
        }
        free(q.data); free(k.data); free(v.data);
    }
    free(index);
}

/* The vector exp2 of the kernels: <= 2 ulp-ish (3e-7 relative) on [-126, 0],
   exactly 0 below -126, for -inf and for NaN. */
#ifdef EI__HAVE_AVX512
EI__TARGET_AVX512 static void exp2_avx512_16(const float *x, float *y) {
    _mm512_storeu_ps(y, ei__attn_exp2_avx512(_mm512_loadu_ps(x)));
}
#endif
#ifdef EI__HAVE_AVX2
EI__TARGET_AVX2 static void exp2_avx2_8(const float *x, float *y) {
    _mm256_storeu_ps(y, ei__attn_exp2_avx2(_mm256_loadu_ps(x)));
}
#endif
#ifdef EI__HAVE_NEON
static void exp2_neon_4(const float *x, float *y) { vst1q_f32(y, ei__attn_exp2_neon(vld1q_f32(x))); }
#endif
/* y[0..15] = exp2(x[0..15]) through the kernel of isa 0 (AVX-512), 1 (AVX2) or 2 (NEON) */
static const char *const exp2_isa[3] = {"avx512", "avx2", "neon"};
static void exp2_16(int isa, const float *x, float *y) {
    int i;
    for (i = 0; i < 16; ++i) y[i] = -1.0f; /* an isa this build lacks: fails the checks */
#ifdef EI__HAVE_NEON
    if (isa == 2) for (i = 0; i < 16; i += 4) exp2_neon_4(x + i, y + i);
#endif
#ifdef EI__HAVE_AVX512
    if (isa == 0) exp2_avx512_16(x, y);
#endif
#ifdef EI__HAVE_AVX2
    if (isa == 1) { exp2_avx2_8(x, y); exp2_avx2_8(x + 8, y + 8); }
#endif
    (void)isa; (void)x; (void)y;
}
static void test_exp2(void) {
    float x[16], y[16];
    double worst[3] = {0, 0, 0};
    int i, j, isa;
    for (isa = 0; isa < 3; ++isa) {
        if (!ei_cpu_supports(isa == 0 ? EI_SIMD_AVX512 : isa == 1 ? EI_SIMD_AVX2 : EI_SIMD_NEON)) continue;
        for (i = 0; i < 200000; ++i) {
            for (j = 0; j < 16; ++j) x[j] = (float)(-126.0 * rnd_u());
            if (i == 0) { x[0] = 0.0f; x[1] = -126.0f; x[2] = -0.5f; x[3] = -1e-30f; }
            exp2_16(isa, x, y);
            for (j = 0; j < 16; ++j) {
                double r = exp2((double)x[j]), e = fabs((double)y[j] - r) / r;
                if (!(e <= worst[isa])) worst[isa] = e;
            }
        }
        x[0] = -126.5f; x[1] = -200.0f; x[2] = -INFINITY; x[3] = NAN; x[4] = -FLT_MAX; x[5] = -1e30f;
        for (j = 6; j < 16; ++j) x[j] = -127.0f - (float)j;
        exp2_16(isa, x, y);
        for (j = 0; j < 16; ++j) CHECK(y[j] == 0.0f, "exp2 %s(%g) = %g, expected 0", exp2_isa[isa], (double)x[j], (double)y[j]);
        CHECK(worst[isa] <= 3e-7, "exp2 %s: max relative error %.3g", exp2_isa[isa], worst[isa]);
    }
    printf("vector exp2 max relative error on [-126, 0]: avx512 %.2e, avx2 %.2e, neon %.2e\n", worst[0], worst[1], worst[2]);
}

/* The engine's flow: chunked planning (ei_profile_chunk) and attention of
   each chunk with q_offset, against the reference on the plan as it stands
   after that chunk. Chunks of uneven sizes that start and end inside
   segments; K and V are the whole cache with 32 NaN cells after the prompt
   (an engine's padded view): no cell past the chunk's queries is read. */
static void test_chunked_planning(void) {
    ei_config cfg = small_config();
    ei_context *ctx;
    buf q, k, v;
    ei_plan plan;
    guarded_out o;
    ei_sizes z;
    ei_exec xp, xa;
    void *pws, *aws;
    int64_t n = 200, pad = 32, t0, i, nt;
    static const int64_t sizes[] = {48, 5, 29, 1, 64, 20};
    int ci = 0;
    int32_t H = 8, HK = 2, d = 64;
    double worst = 0, *ref = (double *)malloc((size_t)(n * H * d) * sizeof(double)), vmax;
    ei_tensor tkall, tvall;
    ei_context_create(&cfg, &ctx);
    buf_alloc(&q, EI_F32, n, H, d); buf_alloc(&k, EI_F32, n + pad, HK, d); buf_alloc(&v, EI_F32, n + pad, HK, d);
    k.n = v.n = n;
    make_qkv(&q, &k, &v, H / HK, 1.0f);
    tkall = buf_view(&k);
    tvall = buf_view(&v);
    for (i = n * HK * d; i < (n + pad) * HK * d; ++i) { buf_set(&k, i, NAN); buf_set(&v, i, NAN); }
    vmax = ref_vmax(&tvall, -1);
    CHECK(ei_plan_init(ctx, &plan, n, HK, d, EI_PLAN_CHUNKED, NULL, 0) == EI_OK, "plan: %s", ei_last_error());
    sizes_for(ctx, n, H, HK, d, 0, 2, &z); /* for attention on 2 threads (profiling on 1 takes less) */
    pws = malloc(z.profile);
    aws = malloc(z.prefill);
    xp = ex(1, pws, z.profile);
    xa = ex(2, aws, z.prefill);
    o = out_alloc(EI_F32, n, H, d, 1);
    for (t0 = 0; t0 < n; t0 += nt) {
        int is_final;
        ei_tensor tq, tk = ei_tensor_make(k.data, EI_F32, n + pad, HK, d), tv = ei_tensor_make(v.data, EI_F32, n + pad, HK, d);
        nt = sizes[ci++ % 6];
        nt = nt < n - t0 ? nt : n - t0;
        is_final = t0 + nt == n;
        tq = ei_tensor_make((float *)q.data + t0 * H * d, EI_F32, nt, H, d);
        ei_out_tensor to = o.t;
        to.data = (float *)o.t.data + t0 * o.t.token_stride;
        to.n_tokens = nt;
        CHECK(ei_profile_chunk(ctx, &xp, &tq, &tk, &plan, t0, is_final) == EI_OK, "profile_chunk: %s", ei_last_error());
        CHECK(ei_attention_prefill(ctx, &xa, &tq, &tk, &tv, &plan, &to, t0) == EI_OK, "attention: %s", ei_last_error());
        ref_attention(&cfg, &plan, &tq, &tkall, &tvall, t0, ref + t0 * H * d);
    }
    for (i = 0; i < n; ++i) {
        int32_t h, e;
        for (h = 0; h < H; ++h)
            for (e = 0; e < d; ++e) {
                double err = fabs(guarded_out_get(&o, i, h, e) - ref[(i * H + h) * d + e]) / vmax;
                if (!(err <= worst)) worst = err;
            }
    }
    CHECK(worst <= test_tols[TOL_ATTN_REF].max_abs, "chunked planning + attention: max err %.3g", worst);
    CHECK(guarded_out_intact(&o), "guards");
    free(ref); free(pws); free(aws); guarded_out_free(&o);
    ei_plan_free(ctx, &plan); ei_context_destroy(ctx);
    free(q.data); free(k.data); free(v.data);
}

int main(int argc, char **argv) {
    static const int32_t dims[3] = {64, 128, 256};
    static const int32_t gqa[3][2] = {{2, 2}, {8, 2}, {8, 1}}; /* ratios 1, 4, 8 */
    static const ei_dtype dts[3] = {EI_F32, EI_F16, EI_BF16};
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int di, gi, ti;
    unsigned kd;
    printf("kernels on this machine:");
    for (kd = 0; kd < sizeof g_kernels / sizeof g_kernels[0]; ++kd)
        if (ei_cpu_supports(g_kernels[kd].simd)) printf(" %s", g_kernels[kd].name);
    printf("\n");
    {   /* EI_SIMD_AUTO's bf16 attention follows the measured vdpbf16ps / FMA rate ratio */
        ei_context *ctx;
        double ratio = ei_cpu_dpbf16_ratio();
        ei_simd expect = ei_cpu_supports(EI_SIMD_AMX) ? EI_SIMD_AMX
                         : ei_cpu_supports(EI_SIMD_AVX512_BF16) && ratio >= 1.25 ? EI_SIMD_AVX512_BF16
                         : ei_cpu_supports(EI_SIMD_AVX512) ? EI_SIMD_AVX512 : ei_cpu_supports(EI_SIMD_AVX2) ? EI_SIMD_AVX2
                         : ei_cpu_supports(EI_SIMD_NEON) ? EI_SIMD_NEON : EI_SIMD_SCALAR;
        CHECK(ei_context_create(NULL, &ctx) == EI_OK, "default context");
        printf("vdpbf16ps / f32 FMA FLOP rate: %.2f; EI_SIMD_AUTO chose %s\n", ratio, ei_simd_name(ei_context_config(ctx)->simd));
        CHECK(ei_cpu_supports(EI_SIMD_AVX512_BF16) ? ratio > 0.1 && ratio < 10 : ratio == 0.0, "ratio %g", ratio);
#ifndef EI_ATTN_PREFER_DPBF16
        CHECK(ei_context_config(ctx)->simd == expect, "AUTO chose %s, expected %s", ei_simd_name(ei_context_config(ctx)->simd),
              ei_simd_name(expect));
#else
        (void)expect;
#endif
        ei_context_destroy(ctx);
    }
    test_exp2();
    test_plans_are_ragged();
    test_bad_inputs();
    test_extremes();
    test_mt();
    test_decode_bad_inputs();
    test_decode_keep();
    test_chunked_planning();
    for (di = 0; di < 3; ++di)
        for (gi = 0; gi < 3; ++gi)
            for (ti = 0; ti < 3; ++ti) {
                case_desc c;
                memset(&c, 0, sizeof c);
                c.n = 150; /* 10 segments, the last one partial (6 tokens) */
                c.H = gqa[gi][0]; c.HK = gqa[gi][1]; c.d = dims[di];
                c.in_dt = dts[ti]; c.out_dt = EI_F32;
                c.use_plan = 1; c.strided = 1; c.nth = 1; c.amp = 1.0f;
                if (quick && (di + gi + ti) % 3) continue;
                run_case(&c);
            }
    {   /* variations: dense, chunked, thread split, f16/bf16 out, odd head_dim, peaked */
        case_desc c;
        memset(&c, 0, sizeof c);
        c.n = 150; c.H = 8; c.HK = 2; c.d = 128; c.in_dt = EI_F32; c.out_dt = EI_F32;
        c.use_plan = 0; c.strided = 1; c.nth = 1; c.amp = 1.0f;
        run_case(&c);                                  /* dense causal */
        c.use_plan = 1; c.chunk = 48; run_case(&c);    /* chunked at segment boundaries */
        c.chunk = 37; run_case(&c);                    /* chunked mid-segment */
        c.chunk = 0; c.nth = 3; run_case(&c);          /* ith/nth split */
        c.nth = 1; c.out_dt = EI_F16; run_case(&c);
        c.out_dt = EI_BF16; c.in_dt = EI_BF16; run_case(&c);
        c.out_dt = EI_F32; c.in_dt = EI_F32; c.d = 40; c.H = 3; c.HK = 1; run_case(&c); /* d % 16 != 0, G = 3 */
        c.d = 18; c.H = 6; c.HK = 2; c.in_dt = EI_BF16; run_case(&c);                  /* G = 3, d % 16 != 0 */
        c.in_dt = EI_F16; run_case(&c);       /* d = 4n + 2: neon-fhm's and neon-bfmmla's last dimension pair */
        c.d = 7; c.H = 5; c.HK = 1; c.in_dt = EI_F16; run_case(&c);                    /* odd d, G = 5 */
        c.d = 64; c.H = 16; c.HK = 1; c.in_dt = EI_F32; c.n = 333; run_case(&c);        /* G = 16: two head subgroups */
        c.H = 4; c.HK = 4; c.n = 150; c.amp = 3.0f; run_case(&c);                      /* peaked */
        c.amp = 1.0f; c.per_segment = 1; c.chunk = 64; run_case(&c);                   /* one count per segment */
        c.per_segment = 0; c.chunk = 0; c.small_cap = 1; run_case(&c);                 /* unsorted kept blocks */
        /* calls with few tokens (decode steps): tiles of 1..8 tokens with the heads
           packed into 16-row vectors, causal masks inside the call's own tokens */
        c.small_cap = 0; c.chunk = 1; run_case(&c);        /* one token per call, 4 heads per vector */
        c.chunk = 3; c.H = 8; c.HK = 2; run_case(&c);      /* 4-token tiles: 4 heads x 4 tokens in one vector */
        c.in_dt = EI_F16; run_case(&c);                    /* the same through the f16 and bf16 kernels */
        c.in_dt = EI_BF16; run_case(&c);
        c.in_dt = EI_F32;
        c.chunk = 6; c.H = 3; c.HK = 1; run_case(&c);      /* 8-token tiles, G = 3: 24 rows in 2 vectors */
        c.chunk = 2; c.H = 16; c.HK = 1; run_case(&c);     /* 2-token tiles, G = 16: two head subgroups */
        c.chunk = 17; c.H = 8; c.HK = 2; run_case(&c);     /* 17 tokens per call: a 32-token tile */
        c.use_plan = 0; c.chunk = 1; run_case(&c);         /* dense decode steps */
        c.chunk = 5; run_case(&c);
        /* ei_attention_decode: key slices per thread, merged (empty slices when
           the keys are fewer than 64 x threads) */
        c.decode = 1; c.chunk = 1; c.nth = 3; run_case(&c);
        c.n = 700; c.H = 4; c.HK = 1; c.nth = 2; c.in_dt = EI_BF16; run_case(&c);       /* one kv head (Gemma 3 270M) */
        if (!quick) { c.nth = 5; c.chunk = 16; c.H = 8; c.HK = 2; c.in_dt = EI_F16; c.out_dt = EI_BF16; run_case(&c); }
        c.n = 300; c.nth = 4; c.chunk = 3; c.H = 16; c.HK = 1; c.d = 40; c.in_dt = EI_F32; c.out_dt = EI_F32;
        run_case(&c);                                                                  /* two head subgroups, d % 16 */
        c.nth = 1; c.chunk = 7; c.H = 6; c.HK = 2; c.d = 18; c.in_dt = EI_BF16; run_case(&c);
        /* more query rows than the workspace packs at once (the vector decode
           walk then takes the head groups in several units) */
        c.n = 200; c.nth = 2; c.chunk = 16; c.H = 24; c.HK = 3; c.d = 64; c.in_dt = EI_F16; run_case(&c); /* G = 8 */
        c.H = 32; c.HK = 2; c.chunk = 13; c.in_dt = EI_F32; run_case(&c);                                 /* G = 16 */
        c.decode = 0;
    }
    printf("largest error / max|v| (f32 out, unit-scale inputs):\n");
    for (kd = 0; kd < sizeof g_kernels / sizeof g_kernels[0]; ++kd)
        printf("  %-12s f32 %.2e  f16 %.2e  bf16 %.2e\n", g_kernels[kd].name, g_worst[kd][EI_F32], g_worst[kd][EI_F16],
               g_worst[kd][EI_BF16]);
    return check_summary();
}
