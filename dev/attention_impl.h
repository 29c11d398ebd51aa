/* Block-sparse prefill attention executing a plan (plan NULL: dense causal).

   Semantics (golden/FORMAT.md, "Sparse prefill attention"): query token t of
   segment s (query head h, kv head h/G) attends
     - if ei_plan_segment_is_sparse(s): the key blocks the plan keeps for
       (h/G, s) (all before the segment start), then the segment's own keys
       s*segment_size .. t;
     - otherwise: keys 0 .. t (dense causal).
   Softmax scale attn_scale (0: 1/sqrt(head_dim)); f32 accumulation.

   Algorithm (flash-style, no n x n buffer): a tile is Mt query tokens x Gt
   query heads of one kv group (about EI__ATTN_ROWS = 256 rows; Mt is 16
   times a power of two) against key tiles of EI__ATTN_NK = 64 keys, so each
   key/value row is read once per tile for every head of the group. Rows of
   a tile are laid out r = g*Mt + token and vectorised 16 at a time, so
   S^T = K Q^T (keys x rows) is computed with key elements broadcast against
   packed Q^T columns (register block: 32 rows x 8 keys), and the online
   softmax (running max, sum, rescale) is purely vertical: no horizontal
   reductions. O += P V runs per 64-dim chunk of a packed value tile,
   register-blocked 4 rows x 64 dims. Scores are scaled by
   scale*log2(e) and exponentiated with a 1-2 ulp polynomial exp2 that maps
   -inf and very negative inputs to 0; masked keys are -inf, the running max
   starts at -FLT_MAX, scores are clamped to +-FLT_MAX (NaN from overflowing
   dot products too), so no -inf - -inf and no NaN from finite input.

   Kernels (chosen per call from the context's SIMD path and the dtypes):
     scalar       the reference, one query row at a time (libm exp2f); also
                  what the NEON path runs for now.
     avx2         AVX2+FMA, f32 arithmetic; f16/bf16 rows converted per tile.
     avx512       AVX-512F, f32 arithmetic; f16/bf16 rows converted per tile
                  (vcvtph2ps / a shift). The default for every dtype.
     avx512-bf16  q, k, v all bf16, even head_dim, a CPU with AVX512_BF16,
                  and the build defines EI_ATTN_PREFER_DPBF16: vdpbf16ps for
                  Q K^T (bf16 products exact, f32 sums) and for P V with P
                  rounded to bf16 (error ~2^-9 per weight, as GPU flash
                  attention does). Off by default because on the Sapphire
                  Rapids we measured vdpbf16ps retires 32 FLOP/cycle against
                  64 for vfmadd231ps (ei_bench --peak), so bf16 runs ~1.7x
                  faster through the f32 kernel.
   f16 inputs use vcvtph2ps + f32 FMAs: AVX512_FP16 only offers FMAs that
   accumulate in f16 (no f32-accumulating dot product before AVX10.2), which
   would put ~1e-2 errors on the logits. The f32-arithmetic kernels agree
   with each other and with a double reference within float32 summation-order
   error (tests: 1e-5 of max|v| at unit-scale inputs); not bit-identical
   across kernels. A given kernel is deterministic and independent of
   ith/nth (each query row is computed by one thread, in one order).

   Work split: items are (kv head, head subgroup, segment, query tile); each
   item's cost is estimated (rows x keys) and thread ith of nth takes the
   items whose cost midpoint falls in its 1/nth share, contiguous in
   (kv head, segment) order. No allocation, no globals.

   Numbers (ei_bench, 2 threads of a 2-core Sapphire Rapids VM, N = 8k..32k,
   8/2 heads, dim 128): dense ~240 GFLOP/s f32, ~255 bf16 = ~70% of the
   measured 2-thread f32 FMA peak (350 GFLOP/s); sparse runs at the dense
   FLOP rate (efficiency ~0.95-1.0). */

#define EI__ATTN_NK 64       /* keys per key tile (multiple of 8) */
#define EI__ATTN_MAX_GT 8    /* query heads per tile */
#ifndef EI__ATTN_ROWS
#define EI__ATTN_ROWS 256    /* target rows (query tokens x heads) per tile */
#endif
#ifndef EI__ATTN_MT_MIN
#define EI__ATTN_MT_MIN 2    /* at least 16 x this many tokens per tile */
#endif
#define EI__ATTN_MAX_THREADS 256

enum { EI__ATTN_K_SCALAR = 0, EI__ATTN_K_AVX2 = 1, EI__ATTN_K_AVX512 = 2, EI__ATTN_K_AVX512_BF16 = 3, EI__ATTN_K_AUTO = -1 };

#if defined(EI__HAVE_AVX512) && !defined(EI_NO_AVX512BF16) && \
    ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define EI__HAVE_AVX512BF16 1
#define EI__TARGET_AVX512BF16 \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")))
#endif

/* AVX512_BF16 (cpuid leaf 7 subleaf 1, EAX bit 5), on top of the AVX-512 path. */
static int ei__attn_cpu_bf16(void) {
#ifdef EI__HAVE_AVX512BF16
    unsigned a, b, c, d;
    if (!ei_cpu_supports(EI_SIMD_AVX512)) return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (int)((a >> 5) & 1u);
#else
    return 0;
#endif
}

/* One call's arguments, resolved. */
typedef struct ei__attn_job {
    const ei_context *ctx;
    const ei_tensor *q, *k, *v;
    const ei_plan *plan;
    const ei_out_tensor *out;
    int64_t q_offset, q_end;   /* absolute positions of q's first and one-past-last token */
    int32_t G, Gt, Mt, d, dpad;
    int32_t seg, bs;
    float c;                   /* softmax scale * log2(e) */
    int kernel;
} ei__attn_job;

/* Workspace of one thread. */
typedef struct ei__attn_ws {
    float *qt;          /* packed queries: f32 [d][ld] (bf16 kernel: u32 pairs [d/2][ld]) */
    float *s;           /* scores, then probabilities, [NK][ld] */
    uint32_t *pp;       /* probabilities as bf16 pairs [NK/2][ld] */
    float *o;           /* output accumulators [ld][dpad] */
    float *m, *l, *alpha; /* running max, running sum, rescale factor [ld] */
    float *kbuf;        /* converted key rows [NK][dpad] */
    float *vbuf;        /* value tile as f32, 64-dim chunk-major: (j, i) at ((i/64)*NK + j)*64 + i%64;
                           bf16 kernel: key pairs as bf16, (j, i) at (j/2)*dpad*2 + 2*i + j%2 */
    float *qrow;        /* one query row [dpad] (scalar reference) */
    const void **kp, **vp; /* row pointers of the key tile [NK] */
    int64_t *kpos;      /* key positions [NK] */
    int64_t *kpos_next; /* positions of the next key tile (prefetched) [NK] */
    int32_t *blocks;    /* a plan row's kept blocks, sorted ascending [keep_cap] */
    int32_t keep_cap;
} ei__attn_ws;

static void ei__attn_geometry(int32_t G, int32_t d, int32_t *Gt, int32_t *Mt, int32_t *dpad) {
    int32_t gt = EI__MIN(G, EI__ATTN_MAX_GT);
    *Gt = gt;
    int32_t m = EI__MAX(EI__ATTN_MT_MIN, EI__ATTN_ROWS / 16 / gt), p2 = 1;
    while (p2 * 2 <= m) p2 *= 2; /* a power of two: the vector -> token map is a mask */
    *Mt = 16 * p2;
    *dpad = (int32_t)ei__round_up(d, 16);
}

/* Room to sort a plan row's kept blocks: what a plan made with this
   configuration holds per row, at most 2^16 (longer rows run unsorted). */
static int32_t ei__attn_keep_cap(const ei_config *c) {
    double k = floor(EI__MAX(1.0, (double)c->budget_max_factor) * (double)c->base_budget / (double)c->block_size);
    return (int32_t)EI__MIN(k, 65536.0) + 1;
}

static int ei__attn_ws_layout(const ei_config *c, int32_t G, int32_t d, ei__attn_ws *w, void *mem, size_t bytes,
                              size_t *need) {
    int32_t Gt, Mt, dpad, keep_cap = ei__attn_keep_cap(c);
    size_t total = 0, ld, nk = EI__ATTN_NK;
    ei__arena a;
    ei__attn_geometry(G, d, &Gt, &Mt, &dpad);
    ld = (size_t)Gt * (size_t)Mt;
    if (!ei__reserve(&total, (size_t)dpad * ld, 4) || !ei__reserve(&total, nk * ld, 4) ||
        !ei__reserve(&total, nk / 2 * ld, 4) || !ei__reserve(&total, ld * (size_t)dpad, 4) ||
        !ei__reserve(&total, ld, 4) || !ei__reserve(&total, ld, 4) || !ei__reserve(&total, ld, 4) ||
        !ei__reserve(&total, nk * (size_t)dpad, 4) || !ei__reserve(&total, nk * (size_t)ei__round_up(dpad, 64), 4) ||
        !ei__reserve(&total, (size_t)dpad, 4) || !ei__reserve(&total, nk, sizeof(void *)) ||
        !ei__reserve(&total, nk, sizeof(void *)) || !ei__reserve(&total, nk, sizeof(int64_t)) ||
        !ei__reserve(&total, nk, sizeof(int64_t)) || !ei__reserve(&total, (size_t)keep_cap, sizeof(int32_t)) ||
        !ei__add_size(total, EI__ALIGN, &total))
        return 0;
    *need = total;
    if (!mem || bytes < total) return 1;
    ei__arena_init(&a, mem, bytes);
    w->qt = (float *)ei__arena_take(&a, (size_t)dpad * ld, 4);
    w->s = (float *)ei__arena_take(&a, nk * ld, 4);
    w->pp = (uint32_t *)ei__arena_take(&a, nk / 2 * ld, 4);
    w->o = (float *)ei__arena_take(&a, ld * (size_t)dpad, 4);
    w->m = (float *)ei__arena_take(&a, ld, 4);
    w->l = (float *)ei__arena_take(&a, ld, 4);
    w->alpha = (float *)ei__arena_take(&a, ld, 4);
    w->kbuf = (float *)ei__arena_take(&a, nk * (size_t)dpad, 4);
    w->vbuf = (float *)ei__arena_take(&a, nk * (size_t)ei__round_up(dpad, 64), 4);
    w->qrow = (float *)ei__arena_take(&a, (size_t)dpad, 4);
    w->kp = (const void **)ei__arena_take(&a, nk, sizeof(void *));
    w->vp = (const void **)ei__arena_take(&a, nk, sizeof(void *));
    w->kpos = (int64_t *)ei__arena_take(&a, nk, sizeof(int64_t));
    w->kpos_next = (int64_t *)ei__arena_take(&a, nk, sizeof(int64_t));
    w->blocks = (int32_t *)ei__arena_take(&a, (size_t)keep_cap, sizeof(int32_t));
    w->keep_cap = keep_cap;
    return 1;
}

EIDEF ei_result ei_attention_workspace_size(const ei_context *ctx, int32_t n_heads, int32_t n_kv_heads,
                                            int32_t head_dim, size_t *bytes) {
    ei__attn_ws w;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (!bytes) return ei__fail(ctx, EI_ERR_NULL, "bytes is NULL");
    if (n_heads <= 0 || n_heads > EI_MAX_HEADS || n_kv_heads <= 0 || n_kv_heads > EI_MAX_HEADS)
        return ei__fail(ctx, EI_ERR_SIZE, "heads %d / kv heads %d not in 1..%d", (int)n_heads, (int)n_kv_heads, EI_MAX_HEADS);
    if (n_heads % n_kv_heads)
        return ei__fail(ctx, EI_ERR_GQA, "n_heads %d is not a multiple of n_kv_heads %d", (int)n_heads, (int)n_kv_heads);
    if (head_dim <= 0 || head_dim > EI_MAX_HEAD_DIM)
        return ei__fail(ctx, EI_ERR_SIZE, "head_dim %d not in 1..%d", (int)head_dim, EI_MAX_HEAD_DIM);
    if (!ei__attn_ws_layout(&ctx->cfg, n_heads / n_kv_heads, head_dim, &w, NULL, 0, bytes))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "attention workspace overflows size_t");
    return EI_OK;
}

/* ---- the key sequence of one query tile: kept blocks, then a causal run -- */
typedef struct ei__attn_keys {
    const int32_t *blocks; /* kept block indices (sparse) or NULL */
    int64_t n_block_keys;  /* n_blocks * block_size */
    int32_t bs;
    int64_t run0, run1;    /* the contiguous run [run0, run1) */
} ei__attn_keys;

static int64_t ei__attn_keys_total(const ei__attn_keys *ks) { return ks->n_block_keys + (ks->run1 - ks->run0); }
/* Positions of keys e0 .. e0+n-1 of the sequence; returns the largest. */
static int64_t ei__attn_key_positions(const ei__attn_keys *ks, int64_t e0, int32_t n, int64_t *pos) {
    int32_t j = 0;
    int64_t e = e0, last = -1;
    while (j < n && e < ks->n_block_keys) {
        int64_t b = e / ks->bs, off = e - b * ks->bs, p0 = (int64_t)ks->blocks[b] * ks->bs;
        for (; j < n && off < ks->bs; ++j, ++off, ++e) pos[j] = p0 + off;
        if (pos[j - 1] > last) last = pos[j - 1];
    }
    for (; j < n; ++j, ++e) { pos[j] = ks->run0 + (e - ks->n_block_keys); last = pos[j]; }
    return last;
}

/* ---- scalar reference ------------------------------------------------- */
static void ei__attn_row_to_f32(const void *row, ei_dtype dt, int32_t d, float *dst) {
    int32_t i;
    if (dt == EI_F32) { memcpy(dst, row, (size_t)d * 4u); return; }
    for (i = 0; i < d; ++i) dst[i] = ei__load1(row, dt, i);
}
static float ei__attn_clamp(float x) {
    if (!(x >= -FLT_MAX)) return -FLT_MAX; /* -inf and NaN */
    return x > FLT_MAX ? FLT_MAX : x;
}

static void ei__attn_qtile_scalar(const ei__attn_job *J, ei__attn_ws *w, int32_t kvh, int32_t h0, int32_t gt, int64_t t0,
                                  int32_t nt, const ei__attn_keys *tile_keys) {
    int32_t d = J->d, g, tok, i, j;
    float *qv = w->qrow, *o = w->o, *sc = w->s, *kv = w->kbuf, *vv = w->vbuf;
    for (g = 0; g < gt; ++g)
        for (tok = 0; tok < nt; ++tok) {
            int64_t t = t0 + tok, e0, total;
            ei__attn_keys ks = *tile_keys;
            float m = -FLT_MAX, l = 0.0f, inv;
            void *orow;
            ks.run1 = t + 1;
            total = ei__attn_keys_total(&ks);
            ei__attn_row_to_f32(ei__row(J->q, t - J->q_offset, h0 + g), J->q->dtype, d, qv);
            for (i = 0; i < d; ++i) o[i] = 0.0f;
            for (e0 = 0; e0 < total; e0 += EI__ATTN_NK) {
                int32_t nk = (int32_t)EI__MIN((int64_t)EI__ATTN_NK, total - e0);
                float mx = m, al, sum = 0.0f;
                ei__attn_key_positions(&ks, e0, nk, w->kpos);
                for (j = 0; j < nk; ++j) {
                    float acc = 0.0f;
                    ei__attn_row_to_f32(ei__row(J->k, w->kpos[j], kvh), J->k->dtype, d, kv);
                    for (i = 0; i < d; ++i) acc += qv[i] * kv[i];
                    sc[j] = ei__attn_clamp(acc * J->c);
                    if (sc[j] > mx) mx = sc[j];
                }
                al = exp2f(m - mx);
                for (i = 0; i < d; ++i) o[i] *= al;
                for (j = 0; j < nk; ++j) {
                    float p = exp2f(sc[j] - mx);
                    sum += p;
                    ei__attn_row_to_f32(ei__row(J->v, w->kpos[j], kvh), J->v->dtype, d, vv);
                    for (i = 0; i < d; ++i) o[i] += p * vv[i];
                }
                l = l * al + sum;
                m = mx;
            }
            inv = 1.0f / l;
            orow = ei__row_out(J->out, t - J->q_offset, h0 + g);
            for (i = 0; i < d; ++i) ei__store1(orow, J->out->dtype, i, o[i] * inv);
        }
}

/* ---- vector kernels: tile stages ---------------------------------------- */
/* Stages of one query tile, per ISA:
     pack_q   the tile's queries into w->qt (zero rows past nt)
     prep_kv  key/value row pointers of the key tile (converted rows if needed)
     scores   w->s[j][r] = clamp(c * q_r.k_j), -inf where key j > token of r
     softmax  online softmax over the tile: m, l, alpha; w->s becomes P
     pv       O[r] = alpha[r] * O[r] + sum_j P[j][r] v_j
     store    out = O / l for the valid rows */
typedef struct ei__attn_tile {
    int32_t ld, nvec, vps;  /* rows (multiple of 16), 16-row vectors, vectors per head */
    int32_t nt, gt, h0, kvh;
    int64_t t0;
} ei__attn_tile;

/* Visible lanes of a 16-row vector whose first token is tb, for key position p. */
EI__MAYBE_UNUSED static uint32_t ei__attn_mask16(int64_t p, int64_t tb) {
    int64_t diff = p - tb;
    if (diff <= 0) return 0xffffu;
    if (diff >= 16) return 0u;
    return (0xffffu << diff) & 0xffffu;
}

EI__MAYBE_UNUSED static void ei__attn_pack_q_f32(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T) {
    int32_t g, tok, i, d = J->d;
    for (g = 0; g < T->gt; ++g)
        for (tok = 0; tok < J->Mt; ++tok) {
            int32_t r = g * J->Mt + tok;
            if (tok < T->nt) ei__attn_row_to_f32(ei__row(J->q, T->t0 + tok - J->q_offset, T->h0 + g), J->q->dtype, d, w->qrow);
            else for (i = 0; i < d; ++i) w->qrow[i] = 0.0f;
            for (i = 0; i < d; ++i) w->qt[(size_t)i * (size_t)T->ld + (size_t)r] = w->qrow[i];
        }
}

#ifdef EI__HAVE_AVX512
/* 2^x; -inf, NaN and x < -126 give 0 (no subnormal weights: they would cost
   microcode assists in the FMAs and weigh < 2^-126 anyway). Cephes exp2f
   polynomial on [-0.5, 0.5], ~1 ulp. */
EI__TARGET_AVX512 static __m512 ei__attn_exp2_avx512(__m512 x) {
    __m512 n, f, p;
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
    n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    f = _mm512_sub_ps(x, n);
    p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}
EI__TARGET_AVX512 static void ei__attn_row_f32_avx512(const void *row, ei_dtype dt, int32_t d, int32_t dpad, float *dst) {
    size_t es = ei__dtype_size(dt);
    int32_t c0;
    for (c0 = 0; c0 < dpad; c0 += 16) {
        int32_t rem = d - c0;
        __mmask16 m = rem >= 16 ? (__mmask16)0xffff : rem > 0 ? (__mmask16)((1u << rem) - 1u) : (__mmask16)0;
        _mm512_storeu_ps(dst + c0, m ? ei__avx512_load((const unsigned char *)row + (size_t)c0 * es, dt, m)
                                     : _mm512_setzero_ps());
    }
}
/* Key rows: in place (f32) or converted into kbuf. Value rows: always copied
   into the chunk-major vbuf (a contiguous 16 KB block per 64 dims, so the
   P V sweep stays in L1 whatever the cache's token stride). */
EI__TARGET_AVX512 static void ei__attn_prep_kv_avx512(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                      int32_t nk) {
    const int32_t d = J->d, dpad = J->dpad;
    const size_t es = ei__dtype_size(J->v->dtype);
    int32_t j, c0;
    for (j = 0; j < nk; ++j) {
        const void *kr = ei__row(J->k, w->kpos[j], T->kvh);
        const unsigned char *vr = (const unsigned char *)ei__row(J->v, w->kpos[j], T->kvh);
        if (J->k->dtype != EI_F32) {
            float *dst = w->kbuf + (size_t)j * (size_t)dpad;
            ei__attn_row_f32_avx512(kr, J->k->dtype, d, dpad, dst);
            kr = dst;
        }
        w->kp[j] = kr;
        for (c0 = 0; c0 < dpad; c0 += 16) {
            int32_t rem = d - c0;
            __mmask16 m = rem >= 16 ? (__mmask16)0xffff : rem > 0 ? (__mmask16)((1u << rem) - 1u) : (__mmask16)0;
            float *dst = w->vbuf + ((size_t)(c0 / 64) * EI__ATTN_NK + (size_t)j) * 64u + (size_t)(c0 % 64);
            _mm512_store_ps(dst, m ? ei__avx512_load(vr + (size_t)c0 * es, J->v->dtype, m) : _mm512_setzero_ps());
        }
    }
    for (; j < ((nk + 7) & ~7); ++j) w->kp[j] = w->kp[nk - 1];
}

/* Store 16 scores of 16-row vector vi for key j: scale, clamp, mask. */
#define EI__ATTN_STORE512(acc, j, vi)                                                                        \
    do {                                                                                                     \
        __m512 x_ = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(acc, cv), lo), hi);                           \
        if (need_mask)                                                                                       \
            x_ = _mm512_mask_blend_ps((__mmask16)ei__attn_mask16(w->kpos[j], T->t0 + 16 * ((vi) & (T->vps - 1))), \
                                      ninf, x_);                                                             \
        _mm512_store_ps(w->s + (size_t)(j) * (size_t)ld + (size_t)(vi) * 16u, x_);                           \
    } while (0)

/* S^T = K Q^T for the tile: 2 row vectors (32 rows) x 8 keys per register
   block (16 accumulators; per dim 2 loads of Q^T + 8 broadcasts from key
   rows). Row vectors outside, keys inside: the 32 rows' Q^T (16 KB at
   d = 128) stays in L1 while the key tile streams past. */
EI__TARGET_AVX512 static void ei__attn_scores_f32_avx512(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                         int32_t nk, int need_mask) {
    const int32_t ld = T->ld, d = J->d;
    const __m512 cv = _mm512_set1_ps(J->c), lo = _mm512_set1_ps(-FLT_MAX), hi = _mm512_set1_ps(FLT_MAX),
                 ninf = _mm512_set1_ps(-INFINITY);
    int32_t vb, j, i;
    for (vb = 0; vb + 2 <= T->nvec; vb += 2)
        for (j = 0; j < nk; j += 8) {
            const float *k0 = (const float *)w->kp[j], *k1 = (const float *)w->kp[j + 1];
            const float *k2 = (const float *)w->kp[j + 2], *k3 = (const float *)w->kp[j + 3];
            const float *k4 = (const float *)w->kp[j + 4], *k5 = (const float *)w->kp[j + 5];
            const float *k6 = (const float *)w->kp[j + 6], *k7 = (const float *)w->kp[j + 7];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
                   a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00, a60 = a00, a61 = a00, a70 = a00, a71 = a00;
            for (i = 0; i < d; ++i, qp += ld) {
                __m512 q0 = _mm512_load_ps(qp), q1 = _mm512_load_ps(qp + 16), b;
                b = _mm512_set1_ps(k0[i]); a00 = _mm512_fmadd_ps(b, q0, a00); a01 = _mm512_fmadd_ps(b, q1, a01);
                b = _mm512_set1_ps(k1[i]); a10 = _mm512_fmadd_ps(b, q0, a10); a11 = _mm512_fmadd_ps(b, q1, a11);
                b = _mm512_set1_ps(k2[i]); a20 = _mm512_fmadd_ps(b, q0, a20); a21 = _mm512_fmadd_ps(b, q1, a21);
                b = _mm512_set1_ps(k3[i]); a30 = _mm512_fmadd_ps(b, q0, a30); a31 = _mm512_fmadd_ps(b, q1, a31);
                b = _mm512_set1_ps(k4[i]); a40 = _mm512_fmadd_ps(b, q0, a40); a41 = _mm512_fmadd_ps(b, q1, a41);
                b = _mm512_set1_ps(k5[i]); a50 = _mm512_fmadd_ps(b, q0, a50); a51 = _mm512_fmadd_ps(b, q1, a51);
                b = _mm512_set1_ps(k6[i]); a60 = _mm512_fmadd_ps(b, q0, a60); a61 = _mm512_fmadd_ps(b, q1, a61);
                b = _mm512_set1_ps(k7[i]); a70 = _mm512_fmadd_ps(b, q0, a70); a71 = _mm512_fmadd_ps(b, q1, a71);
            }
            EI__ATTN_STORE512(a00, j, vb); EI__ATTN_STORE512(a01, j, vb + 1);
            EI__ATTN_STORE512(a10, j + 1, vb); EI__ATTN_STORE512(a11, j + 1, vb + 1);
            EI__ATTN_STORE512(a20, j + 2, vb); EI__ATTN_STORE512(a21, j + 2, vb + 1);
            EI__ATTN_STORE512(a30, j + 3, vb); EI__ATTN_STORE512(a31, j + 3, vb + 1);
            EI__ATTN_STORE512(a40, j + 4, vb); EI__ATTN_STORE512(a41, j + 4, vb + 1);
            EI__ATTN_STORE512(a50, j + 5, vb); EI__ATTN_STORE512(a51, j + 5, vb + 1);
            EI__ATTN_STORE512(a60, j + 6, vb); EI__ATTN_STORE512(a61, j + 6, vb + 1);
            EI__ATTN_STORE512(a70, j + 7, vb); EI__ATTN_STORE512(a71, j + 7, vb + 1);
        }
    for (; vb < T->nvec; ++vb) /* a leftover vector (G = 3, 5, 7): one vector x 8 keys */
        for (j = 0; j < nk; j += 8) {
            const float *k0 = (const float *)w->kp[j], *k1 = (const float *)w->kp[j + 1];
            const float *k2 = (const float *)w->kp[j + 2], *k3 = (const float *)w->kp[j + 3];
            const float *k4 = (const float *)w->kp[j + 4], *k5 = (const float *)w->kp[j + 5];
            const float *k6 = (const float *)w->kp[j + 6], *k7 = (const float *)w->kp[j + 7];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (i = 0; i < d; ++i, qp += ld) {
                __m512 q0 = _mm512_load_ps(qp);
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(k0[i]), q0, a0);
                a1 = _mm512_fmadd_ps(_mm512_set1_ps(k1[i]), q0, a1);
                a2 = _mm512_fmadd_ps(_mm512_set1_ps(k2[i]), q0, a2);
                a3 = _mm512_fmadd_ps(_mm512_set1_ps(k3[i]), q0, a3);
                a4 = _mm512_fmadd_ps(_mm512_set1_ps(k4[i]), q0, a4);
                a5 = _mm512_fmadd_ps(_mm512_set1_ps(k5[i]), q0, a5);
                a6 = _mm512_fmadd_ps(_mm512_set1_ps(k6[i]), q0, a6);
                a7 = _mm512_fmadd_ps(_mm512_set1_ps(k7[i]), q0, a7);
            }
            EI__ATTN_STORE512(a0, j, vb); EI__ATTN_STORE512(a1, j + 1, vb);
            EI__ATTN_STORE512(a2, j + 2, vb); EI__ATTN_STORE512(a3, j + 3, vb);
            EI__ATTN_STORE512(a4, j + 4, vb); EI__ATTN_STORE512(a5, j + 5, vb);
            EI__ATTN_STORE512(a6, j + 6, vb); EI__ATTN_STORE512(a7, j + 7, vb);
        }
}

EI__TARGET_AVX512 static void ei__attn_softmax_avx512(ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {
    const int32_t ld = T->ld;
    int32_t vi, j;
    for (vi = 0; vi < T->nvec; ++vi) {
        float *col = w->s + (size_t)vi * 16u;
        __m512 mo = _mm512_load_ps(w->m + vi * 16), mx = mo, al, sum = _mm512_setzero_ps();
        for (j = 0; j < nk; ++j) mx = _mm512_max_ps(mx, _mm512_load_ps(col + (size_t)j * (size_t)ld));
        al = ei__attn_exp2_avx512(_mm512_sub_ps(mo, mx));
        for (j = 0; j < nk; ++j) {
            float *p = col + (size_t)j * (size_t)ld;
            __m512 e = ei__attn_exp2_avx512(_mm512_sub_ps(_mm512_load_ps(p), mx));
            _mm512_store_ps(p, e);
            sum = _mm512_add_ps(sum, e);
        }
        _mm512_store_ps(w->l + vi * 16, _mm512_fmadd_ps(_mm512_load_ps(w->l + vi * 16), al, sum));
        _mm512_store_ps(w->m + vi * 16, mx);
        _mm512_store_ps(w->alpha + vi * 16, al);
    }
}

/* O[r][c0..c0+63] = alpha[r] O[r][..] + sum_j P[j][r] V[j][..]: 64-dim chunks
   outside (its 16 KB value block stays in L1), 4 rows x 64 dims inside. */
EI__TARGET_AVX512 static void ei__attn_pv_f32_avx512(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                     int32_t nk) {
    const int32_t ld = T->ld, dpad = J->dpad;
    int32_t r, c0, j;
    for (c0 = 0; c0 < dpad; c0 += 64) {
        const float *vc = w->vbuf + (size_t)(c0 / 64) * EI__ATTN_NK * 64u;
        for (r = 0; r < ld; r += 4) {
            const __m512 al0 = _mm512_set1_ps(w->alpha[r]), al1 = _mm512_set1_ps(w->alpha[r + 1]),
                         al2 = _mm512_set1_ps(w->alpha[r + 2]), al3 = _mm512_set1_ps(w->alpha[r + 3]);
            float *o0 = w->o + (size_t)r * (size_t)dpad + c0, *o1 = o0 + dpad, *o2 = o1 + dpad, *o3 = o2 + dpad;
            const float *pj = w->s + r, *vr = vc;
            if (c0 + 64 <= dpad) {
                __m512 x00 = _mm512_mul_ps(al0, _mm512_load_ps(o0)), x01 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + 16)),
                       x02 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + 32)), x03 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + 48)),
                       x10 = _mm512_mul_ps(al1, _mm512_load_ps(o1)), x11 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + 16)),
                       x12 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + 32)), x13 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + 48)),
                       x20 = _mm512_mul_ps(al2, _mm512_load_ps(o2)), x21 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + 16)),
                       x22 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + 32)), x23 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + 48)),
                       x30 = _mm512_mul_ps(al3, _mm512_load_ps(o3)), x31 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + 16)),
                       x32 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + 32)), x33 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + 48));
                for (j = 0; j < nk; ++j, pj += ld, vr += 64) {
                    __m512 v0 = _mm512_load_ps(vr), v1 = _mm512_load_ps(vr + 16), v2 = _mm512_load_ps(vr + 32),
                           v3 = _mm512_load_ps(vr + 48), p;
                    p = _mm512_set1_ps(pj[0]);
                    x00 = _mm512_fmadd_ps(p, v0, x00); x01 = _mm512_fmadd_ps(p, v1, x01);
                    x02 = _mm512_fmadd_ps(p, v2, x02); x03 = _mm512_fmadd_ps(p, v3, x03);
                    p = _mm512_set1_ps(pj[1]);
                    x10 = _mm512_fmadd_ps(p, v0, x10); x11 = _mm512_fmadd_ps(p, v1, x11);
                    x12 = _mm512_fmadd_ps(p, v2, x12); x13 = _mm512_fmadd_ps(p, v3, x13);
                    p = _mm512_set1_ps(pj[2]);
                    x20 = _mm512_fmadd_ps(p, v0, x20); x21 = _mm512_fmadd_ps(p, v1, x21);
                    x22 = _mm512_fmadd_ps(p, v2, x22); x23 = _mm512_fmadd_ps(p, v3, x23);
                    p = _mm512_set1_ps(pj[3]);
                    x30 = _mm512_fmadd_ps(p, v0, x30); x31 = _mm512_fmadd_ps(p, v1, x31);
                    x32 = _mm512_fmadd_ps(p, v2, x32); x33 = _mm512_fmadd_ps(p, v3, x33);
                }
                _mm512_store_ps(o0, x00); _mm512_store_ps(o0 + 16, x01); _mm512_store_ps(o0 + 32, x02); _mm512_store_ps(o0 + 48, x03);
                _mm512_store_ps(o1, x10); _mm512_store_ps(o1 + 16, x11); _mm512_store_ps(o1 + 32, x12); _mm512_store_ps(o1 + 48, x13);
                _mm512_store_ps(o2, x20); _mm512_store_ps(o2 + 16, x21); _mm512_store_ps(o2 + 32, x22); _mm512_store_ps(o2 + 48, x23);
                _mm512_store_ps(o3, x30); _mm512_store_ps(o3 + 16, x31); _mm512_store_ps(o3 + 32, x32); _mm512_store_ps(o3 + 48, x33);
            } else {
                int32_t c1;
                for (c1 = 0; c0 + c1 < dpad; c1 += 16) { /* 16-dim pieces of a partial chunk */
                    __m512 x0 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c1)), x1 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c1)),
                           x2 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c1)), x3 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c1));
                    const float *pq = w->s + r, *vq = vc + c1;
                    for (j = 0; j < nk; ++j, pq += ld, vq += 64) {
                        __m512 v0 = _mm512_load_ps(vq);
                        x0 = _mm512_fmadd_ps(_mm512_set1_ps(pq[0]), v0, x0);
                        x1 = _mm512_fmadd_ps(_mm512_set1_ps(pq[1]), v0, x1);
                        x2 = _mm512_fmadd_ps(_mm512_set1_ps(pq[2]), v0, x2);
                        x3 = _mm512_fmadd_ps(_mm512_set1_ps(pq[3]), v0, x3);
                    }
                    _mm512_store_ps(o0 + c1, x0); _mm512_store_ps(o1 + c1, x1);
                    _mm512_store_ps(o2 + c1, x2); _mm512_store_ps(o3 + c1, x3);
                }
            }
        }
    }
}

EI__TARGET_AVX512 static void ei__attn_store_avx512(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T) {
    int32_t g, tok, c0, d = J->d;
    ei_dtype dt = J->out->dtype;
    for (g = 0; g < T->gt; ++g)
        for (tok = 0; tok < T->nt; ++tok) {
            int32_t r = g * J->Mt + tok;
            const float *o = w->o + (size_t)r * (size_t)J->dpad;
            __m512 inv = _mm512_set1_ps(1.0f / w->l[r]);
            unsigned char *dst = (unsigned char *)ei__row_out(J->out, T->t0 + tok - J->q_offset, T->h0 + g);
            for (c0 = 0; c0 < d; c0 += 16) {
                int32_t rem = d - c0;
                __mmask16 m = rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1u);
                __m512 x = _mm512_mul_ps(_mm512_load_ps(o + c0), inv);
                if (dt == EI_F32) _mm512_mask_storeu_ps(dst + (size_t)c0 * 4u, m, x);
                else if (dt == EI_F16)
                    _mm256_mask_storeu_epi16(dst + (size_t)c0 * 2u, m, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                else { /* bf16, round to nearest even (values are finite) */
                    __m512i u = _mm512_castps_si512(x);
                    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                             _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
                    _mm256_mask_storeu_epi16(dst + (size_t)c0 * 2u, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
                }
            }
        }
}
#endif /* EI__HAVE_AVX512 */

#ifdef EI__HAVE_AVX512BF16
/* bf16 kernel: queries as u32 pairs (q[2i], q[2i+1]) [d/2][ld]; keys read in place. */
EI__TARGET_AVX512BF16 static void ei__attn_pack_q_bf16(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T) {
    int32_t g, tok, i2, d2 = J->d / 2;
    uint32_t *qp = (uint32_t *)w->qt;
    for (g = 0; g < T->gt; ++g)
        for (tok = 0; tok < J->Mt; ++tok) {
            int32_t r = g * J->Mt + tok;
            if (tok < T->nt) {
                const unsigned char *row = (const unsigned char *)ei__row(J->q, T->t0 + tok - J->q_offset, T->h0 + g);
                for (i2 = 0; i2 < d2; ++i2) memcpy(&qp[(size_t)i2 * (size_t)T->ld + (size_t)r], row + 4 * i2, 4);
            } else
                for (i2 = 0; i2 < d2; ++i2) qp[(size_t)i2 * (size_t)T->ld + (size_t)r] = 0u;
        }
}
/* Values as key pairs: vbuf[j2][i] = (v[2 j2][i], v[2 j2 + 1][i]) as two bf16. */
EI__TARGET_AVX512BF16 static void ei__attn_prep_kv_bf16(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                       int32_t nk) {
    static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i ilo = _mm512_loadu_si512(lo_idx), ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
    const int32_t d = J->d, dpad = J->dpad;
    uint16_t *vb = (uint16_t *)w->vbuf;
    int32_t j, c0;
    for (j = 0; j < nk; ++j) w->kp[j] = ei__row(J->k, w->kpos[j], T->kvh);
    for (; j < ((nk + 7) & ~7); ++j) w->kp[j] = w->kp[nk - 1];
    for (j = 0; j < nk; j += 2) {
        const uint16_t *va = (const uint16_t *)ei__row(J->v, w->kpos[j], T->kvh);
        const uint16_t *vbr = j + 1 < nk ? (const uint16_t *)ei__row(J->v, w->kpos[j + 1], T->kvh) : NULL;
        uint16_t *dst = vb + (size_t)(j / 2) * (size_t)dpad * 2u;
        for (c0 = 0; c0 < dpad; c0 += 32) {
            int32_t rem = d - c0;
            __mmask32 m = rem >= 32 ? (__mmask32)0xffffffffu : rem > 0 ? (__mmask32)((1u << rem) - 1u) : (__mmask32)0;
            __m512i a = _mm512_maskz_loadu_epi16(m, va + c0);
            __m512i b = vbr ? _mm512_maskz_loadu_epi16(m, vbr + c0) : _mm512_setzero_si512();
            _mm512_storeu_si512(dst + 2 * c0, _mm512_permutex2var_epi16(a, ilo, b));
            if (c0 + 16 < dpad) _mm512_storeu_si512(dst + 2 * c0 + 32, _mm512_permutex2var_epi16(a, ihi, b));
        }
    }
}
static uint32_t ei__attn_u32(const void *p) { uint32_t u; memcpy(&u, p, 4); return u; }
#define EI__ATTN_BCAST(ptr, i2) _mm512_set1_epi32((int)ei__attn_u32((const unsigned char *)(ptr) + 4 * (i2)))
#define EI__ATTN_DP(acc, a, b) acc = _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))

EI__TARGET_AVX512BF16 static void ei__attn_scores_bf16(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                      int32_t nk, int need_mask) {
    const int32_t ld = T->ld, d2 = J->d / 2;
    const __m512 cv = _mm512_set1_ps(J->c), lo = _mm512_set1_ps(-FLT_MAX), hi = _mm512_set1_ps(FLT_MAX),
                 ninf = _mm512_set1_ps(-INFINITY);
    int32_t vb, j, i;
    for (vb = 0; vb + 4 <= T->nvec; vb += 4)
        for (j = 0; j < nk; j += 4) {
            const void *k0 = w->kp[j], *k1 = w->kp[j + 1], *k2 = w->kp[j + 2], *k3 = w->kp[j + 3];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
                   a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
            for (i = 0; i < d2; ++i, qp += ld) {
                __m512i q0 = _mm512_load_si512(qp), q1 = _mm512_load_si512(qp + 16), q2 = _mm512_load_si512(qp + 32),
                        q3 = _mm512_load_si512(qp + 48), b;
                b = EI__ATTN_BCAST(k0, i);
                EI__ATTN_DP(a00, b, q0); EI__ATTN_DP(a01, b, q1); EI__ATTN_DP(a02, b, q2); EI__ATTN_DP(a03, b, q3);
                b = EI__ATTN_BCAST(k1, i);
                EI__ATTN_DP(a10, b, q0); EI__ATTN_DP(a11, b, q1); EI__ATTN_DP(a12, b, q2); EI__ATTN_DP(a13, b, q3);
                b = EI__ATTN_BCAST(k2, i);
                EI__ATTN_DP(a20, b, q0); EI__ATTN_DP(a21, b, q1); EI__ATTN_DP(a22, b, q2); EI__ATTN_DP(a23, b, q3);
                b = EI__ATTN_BCAST(k3, i);
                EI__ATTN_DP(a30, b, q0); EI__ATTN_DP(a31, b, q1); EI__ATTN_DP(a32, b, q2); EI__ATTN_DP(a33, b, q3);
            }
            EI__ATTN_STORE512(a00, j, vb); EI__ATTN_STORE512(a01, j, vb + 1);
            EI__ATTN_STORE512(a02, j, vb + 2); EI__ATTN_STORE512(a03, j, vb + 3);
            EI__ATTN_STORE512(a10, j + 1, vb); EI__ATTN_STORE512(a11, j + 1, vb + 1);
            EI__ATTN_STORE512(a12, j + 1, vb + 2); EI__ATTN_STORE512(a13, j + 1, vb + 3);
            EI__ATTN_STORE512(a20, j + 2, vb); EI__ATTN_STORE512(a21, j + 2, vb + 1);
            EI__ATTN_STORE512(a22, j + 2, vb + 2); EI__ATTN_STORE512(a23, j + 2, vb + 3);
            EI__ATTN_STORE512(a30, j + 3, vb); EI__ATTN_STORE512(a31, j + 3, vb + 1);
            EI__ATTN_STORE512(a32, j + 3, vb + 2); EI__ATTN_STORE512(a33, j + 3, vb + 3);
        }
    for (; vb < T->nvec; ++vb)
        for (j = 0; j < nk; j += 4) {
            const void *k0 = w->kp[j], *k1 = w->kp[j + 1], *k2 = w->kp[j + 2], *k3 = w->kp[j + 3];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (i = 0; i < d2; ++i, qp += ld) {
                __m512i q0 = _mm512_load_si512(qp), b;
                b = EI__ATTN_BCAST(k0, i); EI__ATTN_DP(a0, b, q0);
                b = EI__ATTN_BCAST(k1, i); EI__ATTN_DP(a1, b, q0);
                b = EI__ATTN_BCAST(k2, i); EI__ATTN_DP(a2, b, q0);
                b = EI__ATTN_BCAST(k3, i); EI__ATTN_DP(a3, b, q0);
            }
            EI__ATTN_STORE512(a0, j, vb); EI__ATTN_STORE512(a1, j + 1, vb);
            EI__ATTN_STORE512(a2, j + 2, vb); EI__ATTN_STORE512(a3, j + 3, vb);
        }
}

/* P (f32 [j][r]) -> bf16 pairs pp[j2][r] = (P[2 j2][r], P[2 j2 + 1][r]). */
EI__TARGET_AVX512BF16 static void ei__attn_pack_p_bf16(ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {
    static const uint16_t il_idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i il = _mm512_loadu_si512(il_idx);
    const int32_t ld = T->ld;
    int32_t j, vi;
    for (j = 0; j < nk; j += 2)
        for (vi = 0; vi < T->nvec; ++vi) {
            __m512 a = _mm512_load_ps(w->s + (size_t)j * (size_t)ld + (size_t)vi * 16u);
            __m512 b = j + 1 < nk ? _mm512_load_ps(w->s + (size_t)(j + 1) * (size_t)ld + (size_t)vi * 16u) : _mm512_setzero_ps();
            __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* low 16: a, high 16: b */
            _mm512_store_si512(w->pp + (size_t)(j / 2) * (size_t)ld + (size_t)vi * 16u, _mm512_permutexvar_epi16(il, ab));
        }
}

EI__TARGET_AVX512BF16 static void ei__attn_pv_bf16(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                  int32_t nk) {
    const int32_t ld = T->ld, dpad = J->dpad, n2 = (nk + 1) / 2;
    const uint16_t *vb = (const uint16_t *)w->vbuf;
    int32_t r, c0, j;
    for (r = 0; r < ld; r += 4) {
        const __m512 al0 = _mm512_set1_ps(w->alpha[r]), al1 = _mm512_set1_ps(w->alpha[r + 1]),
                     al2 = _mm512_set1_ps(w->alpha[r + 2]), al3 = _mm512_set1_ps(w->alpha[r + 3]);
        float *o0 = w->o + (size_t)r * (size_t)dpad, *o1 = o0 + dpad, *o2 = o1 + dpad, *o3 = o2 + dpad;
        for (c0 = 0; c0 + 64 <= dpad; c0 += 64) {
            __m512 x00 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c0)), x01 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c0 + 16)),
                   x02 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c0 + 32)), x03 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c0 + 48)),
                   x10 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c0)), x11 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c0 + 16)),
                   x12 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c0 + 32)), x13 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c0 + 48)),
                   x20 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c0)), x21 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c0 + 16)),
                   x22 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c0 + 32)), x23 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c0 + 48)),
                   x30 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c0)), x31 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c0 + 16)),
                   x32 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c0 + 32)), x33 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c0 + 48));
            const uint32_t *pj = w->pp + r;
            for (j = 0; j < n2; ++j, pj += ld) {
                const uint16_t *vr = vb + ((size_t)j * (size_t)dpad + (size_t)c0) * 2u;
                __m512i v0 = _mm512_loadu_si512(vr), v1 = _mm512_loadu_si512(vr + 32), v2 = _mm512_loadu_si512(vr + 64),
                        v3 = _mm512_loadu_si512(vr + 96), p;
                p = _mm512_set1_epi32((int)pj[0]);
                EI__ATTN_DP(x00, p, v0); EI__ATTN_DP(x01, p, v1); EI__ATTN_DP(x02, p, v2); EI__ATTN_DP(x03, p, v3);
                p = _mm512_set1_epi32((int)pj[1]);
                EI__ATTN_DP(x10, p, v0); EI__ATTN_DP(x11, p, v1); EI__ATTN_DP(x12, p, v2); EI__ATTN_DP(x13, p, v3);
                p = _mm512_set1_epi32((int)pj[2]);
                EI__ATTN_DP(x20, p, v0); EI__ATTN_DP(x21, p, v1); EI__ATTN_DP(x22, p, v2); EI__ATTN_DP(x23, p, v3);
                p = _mm512_set1_epi32((int)pj[3]);
                EI__ATTN_DP(x30, p, v0); EI__ATTN_DP(x31, p, v1); EI__ATTN_DP(x32, p, v2); EI__ATTN_DP(x33, p, v3);
            }
            _mm512_store_ps(o0 + c0, x00); _mm512_store_ps(o0 + c0 + 16, x01);
            _mm512_store_ps(o0 + c0 + 32, x02); _mm512_store_ps(o0 + c0 + 48, x03);
            _mm512_store_ps(o1 + c0, x10); _mm512_store_ps(o1 + c0 + 16, x11);
            _mm512_store_ps(o1 + c0 + 32, x12); _mm512_store_ps(o1 + c0 + 48, x13);
            _mm512_store_ps(o2 + c0, x20); _mm512_store_ps(o2 + c0 + 16, x21);
            _mm512_store_ps(o2 + c0 + 32, x22); _mm512_store_ps(o2 + c0 + 48, x23);
            _mm512_store_ps(o3 + c0, x30); _mm512_store_ps(o3 + c0 + 16, x31);
            _mm512_store_ps(o3 + c0 + 32, x32); _mm512_store_ps(o3 + c0 + 48, x33);
        }
        for (; c0 < dpad; c0 += 16) {
            __m512 x0 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c0)), x1 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c0)),
                   x2 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c0)), x3 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c0));
            const uint32_t *pj = w->pp + r;
            for (j = 0; j < n2; ++j, pj += ld) {
                __m512i v0 = _mm512_loadu_si512(vb + ((size_t)j * (size_t)dpad + (size_t)c0) * 2u), p;
                p = _mm512_set1_epi32((int)pj[0]); EI__ATTN_DP(x0, p, v0);
                p = _mm512_set1_epi32((int)pj[1]); EI__ATTN_DP(x1, p, v0);
                p = _mm512_set1_epi32((int)pj[2]); EI__ATTN_DP(x2, p, v0);
                p = _mm512_set1_epi32((int)pj[3]); EI__ATTN_DP(x3, p, v0);
            }
            _mm512_store_ps(o0 + c0, x0); _mm512_store_ps(o1 + c0, x1);
            _mm512_store_ps(o2 + c0, x2); _mm512_store_ps(o3 + c0, x3);
        }
    }
}
#endif /* EI__HAVE_AVX512BF16 */

#ifdef EI__HAVE_AVX2
/* 2^x; NaN and x < -126 give 0. */
EI__TARGET_AVX2 static __m256 ei__attn_exp2_avx2(__m256 x) {
    __m256 n, f, p, keep;
    __m256i e;
    x = _mm256_max_ps(x, _mm256_set1_ps(-127.0f));
    keep = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ);
    n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    f = _mm256_sub_ps(x, n);
    p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
EI__TARGET_AVX2 static void ei__attn_row_f32_avx2(const void *row, ei_dtype dt, int32_t d, int32_t dpad, float *dst) {
    size_t es = ei__dtype_size(dt);
    int32_t c0;
    for (c0 = 0; c0 < dpad; c0 += 8) {
        int32_t rem = d - c0;
        _mm256_storeu_ps(dst + c0, rem > 0 ? ei__avx2_load((const unsigned char *)row + (size_t)c0 * es, dt, EI__MIN(rem, 8))
                                           : _mm256_setzero_ps());
    }
}
/* As the AVX-512 version: keys in place (f32) or converted, values copied
   into the chunk-major vbuf. */
EI__TARGET_AVX2 static void ei__attn_prep_kv_avx2(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                  int32_t nk) {
    const int32_t d = J->d, dpad = J->dpad;
    const size_t es = ei__dtype_size(J->v->dtype);
    int32_t j, c0;
    for (j = 0; j < nk; ++j) {
        const void *kr = ei__row(J->k, w->kpos[j], T->kvh);
        const unsigned char *vr = (const unsigned char *)ei__row(J->v, w->kpos[j], T->kvh);
        if (J->k->dtype != EI_F32) {
            float *dst = w->kbuf + (size_t)j * (size_t)dpad;
            ei__attn_row_f32_avx2(kr, J->k->dtype, d, dpad, dst);
            kr = dst;
        }
        w->kp[j] = kr;
        for (c0 = 0; c0 < dpad; c0 += 8) {
            int32_t rem = d - c0;
            float *dst = w->vbuf + ((size_t)(c0 / 64) * EI__ATTN_NK + (size_t)j) * 64u + (size_t)(c0 % 64);
            _mm256_store_ps(dst, rem > 0 ? ei__avx2_load(vr + (size_t)c0 * es, J->v->dtype, EI__MIN(rem, 8)) : _mm256_setzero_ps());
        }
    }
    for (; j < ((nk + 7) & ~7); ++j) w->kp[j] = w->kp[nk - 1];
}
/* 8 scores of rows r0..r0+7 (ymm half `half` of 16-row vector vi) for key j. */
#define EI__ATTN_STORE256(acc, j, vi, half)                                                                    \
    do {                                                                                                       \
        __m256 x_ = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(acc, cv), lo), hi);                             \
        if (need_mask) {                                                                                       \
            int64_t df_ = w->kpos[j] - (T->t0 + 16 * ((vi) & (T->vps - 1)) + 8 * (half));                           \
            int32_t dc_ = df_ <= 0 ? 0 : df_ >= 8 ? 8 : (int32_t)df_;                                         \
            x_ = _mm256_blendv_ps(x_, ninf, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(dc_), iota))); \
        }                                                                                                      \
        _mm256_store_ps(w->s + (size_t)(j) * (size_t)ld + (size_t)(vi) * 16u + 8u * (half), x_);            \
    } while (0)

EI__TARGET_AVX2 static void ei__attn_scores_avx2(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                 int32_t nk, int need_mask) {
    const int32_t ld = T->ld, d = J->d;
    const __m256 cv = _mm256_set1_ps(J->c), lo = _mm256_set1_ps(-FLT_MAX), hi = _mm256_set1_ps(FLT_MAX),
                 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int32_t vb, j, i;
    /* 2 vectors (4 ymm of rows) x 2 keys: 8 accumulators */
    for (vb = 0; vb + 2 <= T->nvec; vb += 2)
        for (j = 0; j < nk; j += 2) {
            const float *k0 = (const float *)w->kp[j], *k1 = (const float *)w->kp[j + 1];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            for (i = 0; i < d; ++i, qp += ld) {
                __m256 q0 = _mm256_load_ps(qp), q1 = _mm256_load_ps(qp + 8), q2 = _mm256_load_ps(qp + 16),
                       q3 = _mm256_load_ps(qp + 24), b;
                /* keep the 4 loads in registers: folded into each FMA they would be
                   loaded twice and the loop would be load-bound */
                __asm__("" : "+x"(q0), "+x"(q1), "+x"(q2), "+x"(q3));
                b = _mm256_broadcast_ss(k0 + i);
                a00 = _mm256_fmadd_ps(b, q0, a00); a01 = _mm256_fmadd_ps(b, q1, a01);
                a02 = _mm256_fmadd_ps(b, q2, a02); a03 = _mm256_fmadd_ps(b, q3, a03);
                b = _mm256_broadcast_ss(k1 + i);
                a10 = _mm256_fmadd_ps(b, q0, a10); a11 = _mm256_fmadd_ps(b, q1, a11);
                a12 = _mm256_fmadd_ps(b, q2, a12); a13 = _mm256_fmadd_ps(b, q3, a13);
            }
            EI__ATTN_STORE256(a00, j, vb, 0); EI__ATTN_STORE256(a01, j, vb, 1);
            EI__ATTN_STORE256(a02, j, vb + 1, 0); EI__ATTN_STORE256(a03, j, vb + 1, 1);
            EI__ATTN_STORE256(a10, j + 1, vb, 0); EI__ATTN_STORE256(a11, j + 1, vb, 1);
            EI__ATTN_STORE256(a12, j + 1, vb + 1, 0); EI__ATTN_STORE256(a13, j + 1, vb + 1, 1);
        }
    for (; vb < T->nvec; ++vb)
        for (j = 0; j < nk; j += 4) {
            const float *k0 = (const float *)w->kp[j], *k1 = (const float *)w->kp[j + 1];
            const float *k2 = (const float *)w->kp[j + 2], *k3 = (const float *)w->kp[j + 3];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            for (i = 0; i < d; ++i, qp += ld) {
                __m256 q0 = _mm256_load_ps(qp), q1 = _mm256_load_ps(qp + 8), b;
                b = _mm256_broadcast_ss(k0 + i); a00 = _mm256_fmadd_ps(b, q0, a00); a01 = _mm256_fmadd_ps(b, q1, a01);
                b = _mm256_broadcast_ss(k1 + i); a10 = _mm256_fmadd_ps(b, q0, a10); a11 = _mm256_fmadd_ps(b, q1, a11);
                b = _mm256_broadcast_ss(k2 + i); a20 = _mm256_fmadd_ps(b, q0, a20); a21 = _mm256_fmadd_ps(b, q1, a21);
                b = _mm256_broadcast_ss(k3 + i); a30 = _mm256_fmadd_ps(b, q0, a30); a31 = _mm256_fmadd_ps(b, q1, a31);
            }
            EI__ATTN_STORE256(a00, j, vb, 0); EI__ATTN_STORE256(a01, j, vb, 1);
            EI__ATTN_STORE256(a10, j + 1, vb, 0); EI__ATTN_STORE256(a11, j + 1, vb, 1);
            EI__ATTN_STORE256(a20, j + 2, vb, 0); EI__ATTN_STORE256(a21, j + 2, vb, 1);
            EI__ATTN_STORE256(a30, j + 3, vb, 0); EI__ATTN_STORE256(a31, j + 3, vb, 1);
        }
}
EI__TARGET_AVX2 static void ei__attn_softmax_avx2(ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {
    const int32_t ld = T->ld;
    int32_t vi, j;
    for (vi = 0; vi < 2 * T->nvec; ++vi) {
        float *col = w->s + (size_t)vi * 8u;
        __m256 mo = _mm256_load_ps(w->m + vi * 8), mx = mo, al, sum = _mm256_setzero_ps();
        for (j = 0; j < nk; ++j) mx = _mm256_max_ps(mx, _mm256_load_ps(col + (size_t)j * (size_t)ld));
        al = ei__attn_exp2_avx2(_mm256_sub_ps(mo, mx));
        for (j = 0; j < nk; ++j) {
            float *p = col + (size_t)j * (size_t)ld;
            __m256 e = ei__attn_exp2_avx2(_mm256_sub_ps(_mm256_load_ps(p), mx));
            _mm256_store_ps(p, e);
            sum = _mm256_add_ps(sum, e);
        }
        _mm256_store_ps(w->l + vi * 8, _mm256_fmadd_ps(_mm256_load_ps(w->l + vi * 8), al, sum));
        _mm256_store_ps(w->m + vi * 8, mx);
        _mm256_store_ps(w->alpha + vi * 8, al);
    }
}
EI__TARGET_AVX2 static void ei__attn_pv_avx2(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {
    const int32_t ld = T->ld, dpad = J->dpad;
    int32_t r, c0, c1, j;
    for (c0 = 0; c0 < dpad; c0 += 64) /* 64-dim chunks of the value tile, 16 dims x 4 rows inside */
        for (c1 = c0; c1 < dpad && c1 < c0 + 64; c1 += 16) {
            const float *vc = w->vbuf + (size_t)(c0 / 64) * EI__ATTN_NK * 64u + (size_t)(c1 - c0);
            for (r = 0; r < ld; r += 4) {
                const __m256 al0 = _mm256_set1_ps(w->alpha[r]), al1 = _mm256_set1_ps(w->alpha[r + 1]),
                             al2 = _mm256_set1_ps(w->alpha[r + 2]), al3 = _mm256_set1_ps(w->alpha[r + 3]);
                float *o0 = w->o + (size_t)r * (size_t)dpad + c1, *o1 = o0 + dpad, *o2 = o1 + dpad, *o3 = o2 + dpad;
                __m256 x00 = _mm256_mul_ps(al0, _mm256_load_ps(o0)), x01 = _mm256_mul_ps(al0, _mm256_load_ps(o0 + 8)),
                       x10 = _mm256_mul_ps(al1, _mm256_load_ps(o1)), x11 = _mm256_mul_ps(al1, _mm256_load_ps(o1 + 8)),
                       x20 = _mm256_mul_ps(al2, _mm256_load_ps(o2)), x21 = _mm256_mul_ps(al2, _mm256_load_ps(o2 + 8)),
                       x30 = _mm256_mul_ps(al3, _mm256_load_ps(o3)), x31 = _mm256_mul_ps(al3, _mm256_load_ps(o3 + 8));
                const float *pj = w->s + r, *vr = vc;
                for (j = 0; j < nk; ++j, pj += ld, vr += 64) {
                    __m256 v0 = _mm256_load_ps(vr), v1 = _mm256_load_ps(vr + 8), p;
                    p = _mm256_broadcast_ss(pj); x00 = _mm256_fmadd_ps(p, v0, x00); x01 = _mm256_fmadd_ps(p, v1, x01);
                    p = _mm256_broadcast_ss(pj + 1); x10 = _mm256_fmadd_ps(p, v0, x10); x11 = _mm256_fmadd_ps(p, v1, x11);
                    p = _mm256_broadcast_ss(pj + 2); x20 = _mm256_fmadd_ps(p, v0, x20); x21 = _mm256_fmadd_ps(p, v1, x21);
                    p = _mm256_broadcast_ss(pj + 3); x30 = _mm256_fmadd_ps(p, v0, x30); x31 = _mm256_fmadd_ps(p, v1, x31);
                }
                _mm256_store_ps(o0, x00); _mm256_store_ps(o0 + 8, x01);
                _mm256_store_ps(o1, x10); _mm256_store_ps(o1 + 8, x11);
                _mm256_store_ps(o2, x20); _mm256_store_ps(o2 + 8, x21);
                _mm256_store_ps(o3, x30); _mm256_store_ps(o3 + 8, x31);
            }
        }
}
EI__TARGET_AVX2 static void ei__attn_store_avx2(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T) {
    int32_t g, tok, c0, i, d = J->d;
    ei_dtype dt = J->out->dtype;
    for (g = 0; g < T->gt; ++g)
        for (tok = 0; tok < T->nt; ++tok) {
            int32_t r = g * J->Mt + tok;
            const float *o = w->o + (size_t)r * (size_t)J->dpad;
            __m256 inv = _mm256_set1_ps(1.0f / w->l[r]);
            void *dst = ei__row_out(J->out, T->t0 + tok - J->q_offset, T->h0 + g);
            for (c0 = 0; c0 < d; c0 += 8) {
                float tmp[8];
                __m256 x = _mm256_mul_ps(_mm256_load_ps(o + c0), inv);
                if (dt == EI_F32 && c0 + 8 <= d) { _mm256_storeu_ps((float *)dst + c0, x); continue; }
                if (dt == EI_F16 && c0 + 8 <= d) {
                    _mm_storeu_si128((__m128i *)((uint16_t *)dst + c0), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                    continue;
                }
                _mm256_storeu_ps(tmp, x);
                for (i = 0; i < 8 && c0 + i < d; ++i) ei__store1(dst, dt, c0 + i, tmp[i]);
            }
        }
}
#endif /* EI__HAVE_AVX2 */

/* Prefetch the key and value rows at positions pos[0..n) into the cache. */
static void ei__attn_prefetch_rows(const ei__attn_job *J, int32_t kvh, const int64_t *pos, int32_t n) {
#if defined(__GNUC__) || defined(__clang__)
    size_t kbytes = (size_t)J->d * ei__dtype_size(J->k->dtype), vbytes = (size_t)J->d * ei__dtype_size(J->v->dtype), o;
    int32_t j;
    for (j = 0; j < n; ++j) {
        const char *kr = (const char *)ei__row(J->k, pos[j], kvh), *vr = (const char *)ei__row(J->v, pos[j], kvh);
        for (o = 0; o < kbytes; o += 64) __builtin_prefetch(kr + o, 0, 3);
        for (o = 0; o < vbytes; o += 64) __builtin_prefetch(vr + o, 0, 3);
    }
#else
    (void)J; (void)kvh; (void)pos; (void)n;
#endif
}

/* In-place heapsort (no allocation): kept blocks visited in ascending
   position order read the cache front to back. */
static void ei__attn_sort_i32(int32_t *v, int32_t n) {
    int32_t i, end;
    for (i = n / 2 - 1; i >= 0; --i)
        for (int32_t r = i;;) {
            int32_t c = 2 * r + 1, t;
            if (c >= n) break;
            if (c + 1 < n && v[c + 1] > v[c]) ++c;
            if (v[r] >= v[c]) break;
            t = v[r]; v[r] = v[c]; v[c] = t; r = c;
        }
    for (end = n - 1; end > 0; --end) {
        int32_t t = v[0];
        v[0] = v[end]; v[end] = t;
        for (int32_t r = 0;;) {
            int32_t c = 2 * r + 1;
            if (c >= end) break;
            if (c + 1 < end && v[c + 1] > v[c]) ++c;
            if (v[r] >= v[c]) break;
            t = v[r]; v[r] = v[c]; v[c] = t; r = c;
        }
    }
}

/* One query tile through the vector stages of `kernel`. */
static void ei__attn_qtile_vec(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T, const ei__attn_keys *ks) {
    int64_t total = ei__attn_keys_total(ks), e0;
    size_t i, rows = (size_t)T->ld;
    for (i = 0; i < rows; ++i) { w->m[i] = -FLT_MAX; w->l[i] = 0.0f; }
    memset(w->o, 0, rows * (size_t)J->dpad * sizeof(float));
    switch (J->kernel) {
#ifdef EI__HAVE_AVX512BF16
        case EI__ATTN_K_AVX512_BF16: ei__attn_pack_q_bf16(J, w, T); break;
#endif
        default: ei__attn_pack_q_f32(J, w, T); break;
    }
    for (e0 = 0; e0 < total; e0 += EI__ATTN_NK) {
        int32_t nk = (int32_t)EI__MIN((int64_t)EI__ATTN_NK, total - e0);
        int64_t last = ei__attn_key_positions(ks, e0, nk, w->kpos);
        int need_mask = last > T->t0;
        if (e0 + EI__ATTN_NK < total) { /* the next tile's rows: kept blocks are scattered */
            int32_t nn = (int32_t)EI__MIN((int64_t)EI__ATTN_NK, total - e0 - EI__ATTN_NK);
            ei__attn_key_positions(ks, e0 + EI__ATTN_NK, nn, w->kpos_next);
            ei__attn_prefetch_rows(J, T->kvh, w->kpos_next, nn);
        }
        (void)need_mask; /* unused when no vector kernel is compiled in */
        switch (J->kernel) {
#ifdef EI__HAVE_AVX512BF16
            case EI__ATTN_K_AVX512_BF16:
                ei__attn_prep_kv_bf16(J, w, T, nk);
                ei__attn_scores_bf16(J, w, T, nk, need_mask);
                ei__attn_softmax_avx512(w, T, nk);
                ei__attn_pack_p_bf16(w, T, nk);
                ei__attn_pv_bf16(J, w, T, nk);
                break;
#endif
#ifdef EI__HAVE_AVX512
            case EI__ATTN_K_AVX512:
                ei__attn_prep_kv_avx512(J, w, T, nk);
                ei__attn_scores_f32_avx512(J, w, T, nk, need_mask);
                ei__attn_softmax_avx512(w, T, nk);
                ei__attn_pv_f32_avx512(J, w, T, nk);
                break;
#endif
#ifdef EI__HAVE_AVX2
            case EI__ATTN_K_AVX2:
                ei__attn_prep_kv_avx2(J, w, T, nk);
                ei__attn_scores_avx2(J, w, T, nk, need_mask);
                ei__attn_softmax_avx2(w, T, nk);
                ei__attn_pv_avx2(J, w, T, nk);
                break;
#endif
            default: break;
        }
    }
    switch (J->kernel) {
#ifdef EI__HAVE_AVX512
        case EI__ATTN_K_AVX512_BF16:
        case EI__ATTN_K_AVX512: ei__attn_store_avx512(J, w, T); break;
#endif
#ifdef EI__HAVE_AVX2
        case EI__ATTN_K_AVX2: ei__attn_store_avx2(J, w, T); break;
#endif
        default: break;
    }
}

/* ---- work items, costs, split ------------------------------------------ */
static int ei__attn_sparse(const ei__attn_job *J, int32_t s) {
    return J->plan && ei_plan_segment_is_sparse(J->ctx, J->plan, s);
}
/* Walk every item of the call in (kv head, head subgroup, segment, tile)
   order. mode 0: return the total cost. mode 1: run the items of thread ith. */
static int64_t ei__attn_walk(const ei__attn_job *J, int mode, int64_t total_cost, int ith, int nth, ei__attn_ws *w) {
    int32_t kvh, hs, n_kv = J->k->n_heads, n_hs = (J->G + J->Gt - 1) / J->Gt;
    int64_t cum = 0;
    int32_t s_first = (int32_t)(J->q_offset / J->seg), s_last = (int32_t)((J->q_end - 1) / J->seg), s;
    for (kvh = 0; kvh < n_kv; ++kvh)
        for (hs = 0; hs < n_hs; ++hs) {
            int32_t h0 = kvh * J->G + hs * J->Gt, gt = EI__MIN(J->Gt, J->G - hs * J->Gt);
            for (s = s_first; s <= s_last; ++s) {
                int64_t S0 = (int64_t)s * J->seg, S1 = S0 + J->seg;
                int64_t a = EI__MAX(S0, J->q_offset), b = EI__MIN(S1, J->q_end), t0;
                ei__attn_keys ks;
                ks.blocks = NULL;
                ks.n_block_keys = 0;
                ks.bs = J->bs;
                ks.run0 = 0;
                if (ei__attn_sparse(J, s)) {
                    size_t row = (size_t)kvh * (size_t)J->plan->seg_capacity + (size_t)s;
                    ks.blocks = J->plan->block_index + row * (size_t)J->plan->max_keep;
                    ks.n_block_keys = (int64_t)J->plan->keep_count[row] * J->bs;
                    ks.run0 = S0;
                }
                for (t0 = a; t0 < b; t0 += J->Mt) {
                    int32_t nt = (int32_t)EI__MIN((int64_t)J->Mt, b - t0);
                    int64_t keys = ks.n_block_keys + (t0 + nt - ks.run0);
                    int64_t cost = (keys + 64) * (int64_t)gt * J->Mt;
                    if (mode == 1) {
                        /* owner: the thread whose share holds the item's cost midpoint */
                        int64_t mid = cum + cost / 2;
                        int owner = (int)((double)mid * (double)nth / (double)total_cost);
                        if (owner >= nth) owner = nth - 1;
                        if (owner == ith) {
                            ks.run1 = t0 + nt;
                            if (ks.blocks && ks.blocks != w->blocks && ks.n_block_keys / J->bs <= w->keep_cap) {
                                int32_t nb = (int32_t)(ks.n_block_keys / J->bs);
                                memcpy(w->blocks, ks.blocks, (size_t)nb * sizeof(int32_t));
                                ei__attn_sort_i32(w->blocks, nb);
                                ks.blocks = w->blocks; /* for the segment's later tiles too */
                            }
                            if (J->kernel == EI__ATTN_K_SCALAR) ei__attn_qtile_scalar(J, w, kvh, h0, gt, t0, nt, &ks);
                            else {
                                ei__attn_tile T;
                                T.ld = gt * J->Mt; T.nvec = T.ld / 16; T.vps = J->Mt / 16;
                                T.nt = nt; T.gt = gt; T.h0 = h0; T.kvh = kvh; T.t0 = t0;
                                ei__attn_qtile_vec(J, w, &T, &ks);
                            }
                        }
                    }
                    cum += cost;
                }
            }
        }
    return cum;
}

/* ---- validation --------------------------------------------------------- */
static void ei__attn_extent(const void *data, ei_dtype dt, int64_t n, int32_t heads, int32_t d, int64_t ts, int64_t hs,
                            uintptr_t *lo, uintptr_t *hi) {
    int64_t last = (n - 1) * ts + (int64_t)(heads - 1) * hs + d;
    *lo = (uintptr_t)data;
    *hi = *lo + (uintptr_t)last * (uintptr_t)ei__dtype_size(dt);
}
static int ei__attn_overlap(const ei_out_tensor *o, const ei_tensor *t) {
    uintptr_t a0, a1, b0, b1;
    ei__attn_extent(o->data, o->dtype, o->n_tokens, o->n_heads, o->head_dim, o->token_stride, o->head_stride, &a0, &a1);
    ei__attn_extent(t->data, t->dtype, t->n_tokens, t->n_heads, t->head_dim, t->token_stride, t->head_stride, &b0, &b1);
    return a0 < b1 && b0 < a1;
}

static ei_result ei__attn_prepare(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                                  const ei_plan *plan, ei_out_tensor *out, int64_t q_offset, int kernel, ei__attn_job *J) {
    ei_result r;
    int64_t need;
    double scale;
    if ((r = ei__check_qk(ctx, q, k)) != EI_OK) return r;
    if ((r = ei__check_tensor(ctx, v, "v")) != EI_OK) return r;
    if ((r = ei__check_out_tensor(ctx, out, "out")) != EI_OK) return r;
    if (v->n_heads != k->n_heads || v->head_dim != k->head_dim)
        return ei__fail(ctx, EI_ERR_SHAPE, "v has %d heads x %d dims, k has %d x %d", (int)v->n_heads, (int)v->head_dim,
                        (int)k->n_heads, (int)k->head_dim);
    if (out->n_heads != q->n_heads || out->head_dim != q->head_dim || out->n_tokens != q->n_tokens)
        return ei__fail(ctx, EI_ERR_SHAPE, "out is %lld x %d x %d, q is %lld x %d x %d", (long long)out->n_tokens,
                        (int)out->n_heads, (int)out->head_dim, (long long)q->n_tokens, (int)q->n_heads, (int)q->head_dim);
    if (q_offset < 0 || q_offset > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "q_offset %lld not in 0..%lld", (long long)q_offset, (long long)EI_MAX_TOKENS);
    need = q_offset + q->n_tokens;
    if (need > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "q_offset + n_tokens = %lld exceeds %lld", (long long)need, (long long)EI_MAX_TOKENS);
    if (k->n_tokens < need || v->n_tokens < need)
        return ei__fail(ctx, EI_ERR_SHAPE, "queries reach token %lld but k holds %lld and v %lld keys", (long long)need - 1,
                        (long long)k->n_tokens, (long long)v->n_tokens);
    if (ei__attn_overlap(out, q) || ei__attn_overlap(out, k) || ei__attn_overlap(out, v))
        return ei__fail(ctx, EI_ERR_STRIDE, "out overlaps q, k or v (attention is not in place)");
    if (plan) {
        int32_t kvh, s, s_first = (int32_t)(q_offset / ctx->cfg.segment_size), s_last;
        if (!plan->keep_count || !plan->block_index) return ei__fail(ctx, EI_ERR_NULL, "plan is not initialised");
        if (plan->n_kv_heads != k->n_heads)
            return ei__fail(ctx, EI_ERR_SHAPE, "plan has %d kv heads, k has %d", (int)plan->n_kv_heads, (int)k->n_heads);
        if (plan->segment_size != ctx->cfg.segment_size || plan->block_size != ctx->cfg.block_size)
            return ei__fail(ctx, EI_ERR_SHAPE, "plan was laid out for segment %d / block %d, context has %d / %d",
                            (int)plan->segment_size, (int)plan->block_size, (int)ctx->cfg.segment_size, (int)ctx->cfg.block_size);
        if (plan->n_tokens < need)
            return ei__fail(ctx, EI_ERR_STATE, "plan covers %lld tokens, queries reach %lld: profile them first",
                            (long long)plan->n_tokens, (long long)need);
        if (plan->n_segments > plan->seg_capacity || plan->max_keep < 0)
            return ei__fail(ctx, EI_ERR_STATE, "plan is corrupt (%d segments, capacity %d)", (int)plan->n_segments,
                            (int)plan->seg_capacity);
        s_last = (int32_t)((need - 1) / ctx->cfg.segment_size);
        for (kvh = 0; kvh < k->n_heads; ++kvh)
            for (s = s_first; s <= s_last; ++s) {
                size_t row = (size_t)kvh * (size_t)plan->seg_capacity + (size_t)s;
                int64_t first_blocked = (int64_t)s * (ctx->cfg.segment_size / ctx->cfg.block_size);
                int32_t cnt, i;
                const int32_t *idx;
                if (!ei_plan_segment_is_sparse(ctx, plan, s)) continue;
                cnt = plan->keep_count[row];
                if (cnt < 0 || cnt > plan->max_keep)
                    return ei__fail(ctx, EI_ERR_SHAPE, "plan keep_count %d of kv head %d segment %d not in 0..%d", (int)cnt,
                                    (int)kvh, (int)s, (int)plan->max_keep);
                idx = plan->block_index + row * (size_t)plan->max_keep;
                for (i = 0; i < cnt; ++i)
                    if (idx[i] < 0 || idx[i] >= first_blocked)
                        return ei__fail(ctx, EI_ERR_SHAPE,
                                        "plan block_index[%d][%d][%d] = %d is not a block before the segment (0..%lld)",
                                        (int)kvh, (int)s, (int)i, (int)idx[i], (long long)first_blocked - 1);
            }
    }
    memset(J, 0, sizeof *J);
    J->ctx = ctx; J->q = q; J->k = k; J->v = v; J->plan = plan; J->out = out;
    J->q_offset = q_offset; J->q_end = need;
    J->G = q->n_heads / k->n_heads;
    J->d = q->head_dim;
    ei__attn_geometry(J->G, J->d, &J->Gt, &J->Mt, &J->dpad);
    J->seg = ctx->cfg.segment_size;
    J->bs = ctx->cfg.block_size;
    scale = ctx->cfg.attn_scale > 0.0f ? (double)ctx->cfg.attn_scale : 1.0 / sqrt((double)J->d);
    J->c = (float)(scale * 1.4426950408889634);
    if (kernel == EI__ATTN_K_AUTO) {
        kernel = EI__ATTN_K_SCALAR;
#ifdef EI__HAVE_AVX2
        if (ctx->simd == EI_SIMD_AVX2) kernel = EI__ATTN_K_AVX2;
#endif
#ifdef EI__HAVE_AVX512
        if (ctx->simd == EI_SIMD_AVX512) {
            kernel = EI__ATTN_K_AVX512;
#ifdef EI_ATTN_PREFER_DPBF16
            /* Off by default: on the Sapphire Rapids we measured, vdpbf16ps
               retires 0.5 per cycle (64 FLOP) against 2 vfmadd231ps (64 FLOP),
               so bf16 runs faster through the f32 kernel (bf16 -> f32 is a
               shift). Define EI_ATTN_PREFER_DPBF16 where the dot product is
               the faster instruction. */
            if (q->dtype == EI_BF16 && k->dtype == EI_BF16 && v->dtype == EI_BF16 && J->d % 2 == 0 && ei__attn_cpu_bf16())
                kernel = EI__ATTN_K_AVX512_BF16;
#endif
        }
#endif
    }
    J->kernel = kernel;
    return EI_OK;
}

static ei_result ei__attn_run(const ei__attn_job *J, int ith, int nth, void *workspace, size_t ws_bytes) {
    ei__attn_ws w;
    size_t need;
    int64_t total;
    if (!ei__attn_ws_layout(&J->ctx->cfg, J->G, J->d, &w, workspace, ws_bytes, &need))
        return ei__fail(J->ctx, EI_ERR_OVERFLOW, "attention workspace overflows size_t");
    if (!workspace) return ei__fail(J->ctx, EI_ERR_NULL, "workspace is NULL (%zu bytes needed)", need);
    if (ws_bytes < need) return ei__fail(J->ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %zu needed", ws_bytes, need);
    total = ei__attn_walk(J, 0, 0, ith, nth, NULL);
    if (total > 0) ei__attn_walk(J, 1, total, ith, nth, &w);
    return EI_OK;
}

static ei_result ei__attn_kernel_ok(const ei_context *ctx, const ei__attn_job *J) {
    int kernel = J->kernel, ok = 1;
    if (kernel == EI__ATTN_K_AVX2) ok = ei_cpu_supports(EI_SIMD_AVX2);
    else if (kernel == EI__ATTN_K_AVX512) ok = ei_cpu_supports(EI_SIMD_AVX512);
    else if (kernel == EI__ATTN_K_AVX512_BF16)
        ok = ei__attn_cpu_bf16() && J->q->dtype == EI_BF16 && J->k->dtype == EI_BF16 && J->v->dtype == EI_BF16 && J->d % 2 == 0;
    else if (kernel != EI__ATTN_K_SCALAR) ok = 0;
    if (!ok) return ei__fail(ctx, EI_ERR_UNSUPPORTED, "attention kernel %d cannot run on this CPU / these dtypes", kernel);
    return EI_OK;
}

/* Internal entry with a forced kernel (EI__ATTN_K_*; tests use it to run
   every kernel this CPU has, e.g. the f32 AVX-512 kernel on bf16 data). */
static ei_result ei__attention_prefill_kernel(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                              const ei_tensor *v, const ei_plan *plan, ei_out_tensor *out,
                                              int64_t q_offset, int ith, int nth, void *workspace,
                                              size_t workspace_bytes, int kernel) {
    ei__attn_job J;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (ctx->cfg.backend == EI_BACKEND_CUDA)
        return ei__fail(ctx, EI_ERR_UNSUPPORTED, "CPU attention called on a CUDA context");
    if (nth <= 0 || nth > EI__ATTN_MAX_THREADS || ith < 0 || ith >= nth)
        return ei__fail(ctx, EI_ERR_SIZE, "ith %d / nth %d: need 0 <= ith < nth <= %d", ith, nth, EI__ATTN_MAX_THREADS);
    if ((r = ei__attn_prepare(ctx, q, k, v, plan, out, q_offset, kernel, &J)) != EI_OK) return r;
    if (kernel != EI__ATTN_K_AUTO && (r = ei__attn_kernel_ok(ctx, &J)) != EI_OK) return r; /* forced kernels only */
    return ei__attn_run(&J, ith, nth, workspace, workspace_bytes);
}

EIDEF ei_result ei_attention_prefill(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                                     const ei_plan *plan, ei_out_tensor *out, int64_t q_offset, int ith, int nth,
                                     void *workspace, size_t workspace_bytes) {
    return ei__attention_prefill_kernel(ctx, q, k, v, plan, out, q_offset, ith, nth, workspace, workspace_bytes,
                                        EI__ATTN_K_AUTO);
}

#ifndef EI_NO_PTHREADS
#include <pthread.h>
typedef struct ei__attn_thread {
    const ei__attn_job *job;
    int ith, nth;
    void *ws;
    size_t ws_bytes;
    ei_result result;
} ei__attn_thread;
static void *ei__attn_worker(void *arg) {
    ei__attn_thread *t = (ei__attn_thread *)arg;
    t->result = ei__attn_run(t->job, t->ith, t->nth, t->ws, t->ws_bytes);
    return NULL;
}
#endif

/* The pthread helper with a forced kernel (EI__ATTN_K_*, or EI__ATTN_K_AUTO). */
static ei_result ei__attention_prefill_mt_kernel(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                                 const ei_tensor *v, const ei_plan *plan, ei_out_tensor *out,
                                                 int64_t q_offset, int n_threads, void *workspace, size_t workspace_bytes,
                                                 int kernel) {
#ifndef EI_NO_PTHREADS
    ei__attn_thread th[EI__ATTN_MAX_THREADS];
    pthread_t tid[EI__ATTN_MAX_THREADS];
    int started[EI__ATTN_MAX_THREADS];
    ei__attn_job J;
    size_t per;
    int t;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (ctx->cfg.backend == EI_BACKEND_CUDA)
        return ei__fail(ctx, EI_ERR_UNSUPPORTED, "CPU attention called on a CUDA context");
    if (n_threads <= 0 || n_threads > EI__ATTN_MAX_THREADS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_threads %d not in 1..%d", n_threads, EI__ATTN_MAX_THREADS);
    if (n_threads == 1)
        return ei__attention_prefill_kernel(ctx, q, k, v, plan, out, q_offset, 0, 1, workspace, workspace_bytes, kernel);
    if ((r = ei__attn_prepare(ctx, q, k, v, plan, out, q_offset, kernel, &J)) != EI_OK) return r;
    if (kernel != EI__ATTN_K_AUTO && (r = ei__attn_kernel_ok(ctx, &J)) != EI_OK) return r; /* forced kernels only */
    if ((r = ei_attention_workspace_size(ctx, q->n_heads, k->n_heads, q->head_dim, &per)) != EI_OK) return r;
    if (!workspace) return ei__fail(ctx, EI_ERR_NULL, "workspace is NULL (%d threads x %zu bytes needed)", n_threads, per);
    if (workspace_bytes / (size_t)n_threads < per)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %d threads x %zu needed", workspace_bytes, n_threads, per);
    for (t = 0; t < n_threads; ++t) {
        th[t].job = &J; th[t].ith = t; th[t].nth = n_threads;
        th[t].ws = (unsigned char *)workspace + per * (size_t)t;
        th[t].ws_bytes = per;
        th[t].result = EI_OK;
        started[t] = 0;
    }
    for (t = 1; t < n_threads; ++t) started[t] = pthread_create(&tid[t], NULL, ei__attn_worker, &th[t]) == 0;
    ei__attn_worker(&th[0]);
    for (t = 1; t < n_threads; ++t) {
        if (started[t]) pthread_join(tid[t], NULL);
        else ei__attn_worker(&th[t]); /* no thread: run its share here */
    }
    for (t = 0; t < n_threads; ++t)
        if (th[t].result != EI_OK) return th[t].result;
    return EI_OK;
#else
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (n_threads <= 0 || n_threads > EI__ATTN_MAX_THREADS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_threads %d not in 1..%d", n_threads, EI__ATTN_MAX_THREADS);
    /* no threads: one call does all the work; the workspace must hold one share */
    return ei__attention_prefill_kernel(ctx, q, k, v, plan, out, q_offset, 0, 1, workspace, workspace_bytes, kernel);
#endif
}

/* Built-in pthread helper: n_threads workers (the calling thread is one of
   them), workspace = n_threads x ei_attention_workspace_size. Under
   EI_NO_PTHREADS it runs everything on the calling thread. */
EIDEF ei_result ei_attention_prefill_mt(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                                        const ei_plan *plan, ei_out_tensor *out, int64_t q_offset, int n_threads,
                                        void *workspace, size_t workspace_bytes) {
    return ei__attention_prefill_mt_kernel(ctx, q, k, v, plan, out, q_offset, n_threads, workspace, workspace_bytes,
                                           EI__ATTN_K_AUTO);
}
