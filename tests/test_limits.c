/* Limits and bad input: overflow-safe size arithmetic up to and past the
   documented maximums (EI_MAX_TOKENS, EI_MAX_HEADS, EI_MAX_HEAD_DIM,
   EI_MAX_BUDGET, EI_MAX_SEGMENT), NaN/Inf behaviour (Q and K rejected with
   EI_ERR_NONFINITE; V propagates, as documented), every code of
   EI_RESULT_TABLE reached with its message asserted, and regression tests
   for bugs found by fuzzing (tests/fuzz_regressions/). Guard bytes around
   every output buffer. How calls run (ei_exec: threads, or parts sharing one
   workspace) and what ei_layer_sizes reports for them, at their limits.

   EI_TEST_SIMD=scalar|avx2|avx512|neon|auto restricts the SIMD paths tested
   (valgrind has no AVX-512: make test-valgrind runs scalar and avx2). */
#include <ctype.h>
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"

/* Which codes some test reached, with its message naming it. */
static int reached[-EI_RESULT_MIN_ + 1];
#define CHECK_ERR_REACHED(code) (reached[-(int)(code)] = 1)
#include "check.h"

#ifdef __SIZEOF_INT128__
typedef unsigned __int128 wide;
#define WIDE_MAX_SIZE ((wide)SIZE_MAX)
#else
typedef long double wide;
#define WIDE_MAX_SIZE ((wide)SIZE_MAX)
#endif

static ei_config small_config(ei_simd simd) {
    ei_config c = ei_config_default();
    c.segment_size = 64; c.block_size = 8; c.base_budget = 64; c.threshold_len = 128;
    c.decode_budget = 96; c.window = 16; c.decode_gap = 4;
    c.simd = simd;
    return c;
}


/* ------------------------------------------------------------ size arithmetic */
/* A lower bound of a plan's bytes that any implementation of the documented
   layout needs: entropy, budget, keep_blocks, keep_count, head_class,
   block_index with rows of the largest possible keep count, and scores /
   chunked planning's state when asked for. */
static wide plan_lower_bound(const ei_config *c, int64_t T, int32_t kv, int32_t d, uint32_t flags) {
    wide segs = (wide)((T + c->segment_size - 1) / c->segment_size);
    wide blks = (segs - 1) * (wide)(c->segment_size / c->block_size);
    double fmax = c->budget_max_factor > 1.0 ? c->budget_max_factor : 1.0;
    wide keep = (wide)floor(fmax * (double)c->base_budget / (double)c->block_size);
    wide rows = (wide)kv * segs, total;
    if (keep > blks) keep = blks;
    total = rows * 16u + (wide)kv + rows * keep * 4u;
    if (flags & EI_PLAN_SCORES) total += rows * (blks > 0 ? blks : 1) * 4u;
    if (flags & EI_PLAN_CHUNKED) /* the open segments' queries and block mass, the recurrence rows (the key
                                    blocks' min/max are built per chunk in the workspace, not kept) */
        total += (wide)kv * EI_MAX_CHUNK_GROUP * 2u * (wide)d * 4u + (wide)kv * blks * 4u + rows * 16u +
                 ((flags & EI_PLAN_KEEP_KEYS) ? (wide)kv * 2u * (wide)d * blks * 4u : 0u); /* the key store */
    return total;
}

/* Lower bounds of the other buffers ei_layer_sizes reports (one thread): the
   profiling workspace (the key representations [2][d][blocks] and a raw
   score row per segment [segments][blocks]), the decode workspace (the
   scores of every query head [H][n], the scoring kernel's 32 rows of scores
   [n][32], and per row its order, sort key, mass, reduced and pooled score
   and ranking pair), the decoder's ring [window][H][d] and the decode
   partials [EI_DECODE_MAX_TOKENS][H][d]. One query answers for all of them:
   where one overflows size_t (a 32-bit size_t) the query is EI_ERR_OVERFLOW
   whatever the others. */
static wide profile_lower_bound(const ei_config *c, int64_t T, int32_t d) {
    wide segs = (wide)((T + c->segment_size - 1) / c->segment_size);
    wide blks = (segs - 1) * (wide)(c->segment_size / c->block_size);
    return (wide)2 * (wide)d * blks * 4u + segs * blks * 4u;
}
static wide decode_keep_lower_bound(int64_t T, int32_t H) {
    return (wide)H * (wide)T * 4u + (wide)32 * (wide)T * 4u + (wide)T * 32u;
}
static wide layer_lower_bound(const ei_config *c, int64_t T, int32_t H, int32_t kv, int32_t d, uint32_t flags) {
    wide m = plan_lower_bound(c, T, kv, d, flags), x;
    x = profile_lower_bound(c, T, d); if (x > m) m = x;
    x = decode_keep_lower_bound(T, H); if (x > m) m = x;
    x = (wide)c->window * (wide)H * (wide)d * 4u; if (x > m) m = x;
    x = (wide)EI_DECODE_MAX_TOKENS * (wide)H * (wide)d * 4u; if (x > m) m = x;
    return m;
}

static void check_plan_size(const ei_context *ctx, int64_t T, int32_t kv, int32_t d, uint32_t flags) {
    const ei_config *c = ei_context_config(ctx);
    ei_sizes sz;
    ei_result r = sizes_for(ctx, T, kv, kv, d, flags, 1, &sz); /* as many query heads as kv heads */
    size_t bytes = sz.plan;
    int in_range = T >= 1 && T <= EI_MAX_TOKENS && kv >= 1 && kv <= EI_MAX_HEADS && d >= 1 && d <= EI_MAX_HEAD_DIM;
    if (!in_range) {
        CHECK_ERR(r, EI_ERR_SIZE);
        return;
    }
    {
        wide lb = plan_lower_bound(c, T, kv, d, flags);
        if (lb > WIDE_MAX_SIZE) CHECK_ERR(r, EI_ERR_OVERFLOW);
        else if (r == EI_OK) {
            CHECK((wide)bytes >= lb, "sizes.plan(%lld, %d, %d, %u) = %zu below the layout's %.0Lf bytes (wrapped?)",
                  (long long)T, kv, d, flags, bytes, (long double)lb);
            /* and not absurdly more (padding: 64-byte alignment per array, 16-block rows of key representations) */
            CHECK((wide)bytes <= lb * 4u + (wide)kv * (wide)d * 8u * 64u + 1048576u, "sizes.plan(%lld, %d, %d, %u) = %zu, far above %.0Lf",
                  (long long)T, kv, d, flags, bytes, (long double)lb);
            reached[0] = 1;
        } else
            CHECK(r == EI_ERR_OVERFLOW, "sizes.plan(%lld, %d, %d, %u): %s for a size of %.0Lf bytes", (long long)T, kv, d, flags,
                  ei_result_name(r), (long double)lb);
    }
}

/* Plans sized to what they hold (issue 31): one layer of 32 query / 8 kv
   heads, head_dim 128, planned in chunks, at most 4 MiB at 32k tokens and
   16 MiB at 128k with the default and the quality configuration (before:
   33.6 and 134.6 MiB, most of it the key blocks' min/max that every chunk
   now builds again from the cache). Sizes, so exact on every machine. */
static void test_plan_bytes(void) {
    int q;
    for (q = 0; q < 2; ++q) {
        ei_config c = q ? ei_config_quality() : ei_config_default();
        ei_context *ctx;
        size_t b32 = 0, b128 = 0;
        CHECK_OK(ei_context_create(&c, &ctx));
        b32 = layer_sizes(ctx, 32768, 32, 8, 128, EI_PLAN_CHUNKED, 1).plan;
        b128 = layer_sizes(ctx, 131072, 32, 8, 128, EI_PLAN_CHUNKED, 1).plan;
        CHECK(b32 <= (size_t)4 << 20 && b128 <= (size_t)16 << 20,
              "%s: a chunked plan of 8 kv heads x 128 dims is %.2f MiB at 32k, %.2f MiB at 128k (at most 4 and 16)",
              q ? "quality" : "default", b32 / 1048576.0, b128 / 1048576.0);
        ei_context_destroy(ctx);
    }
}

static void test_size_arithmetic(void) {
    static const int64_t toks[] = {1, 511, 512, 513, 4096, 1000003, EI_MAX_TOKENS - 1, EI_MAX_TOKENS, EI_MAX_TOKENS + 1, 0, -1, INT64_MAX};
    static const int32_t kvs[] = {1, 8, EI_MAX_HEADS, EI_MAX_HEADS + 1, 0, -5};
    static const int32_t dims[] = {1, 128, EI_MAX_HEAD_DIM, EI_MAX_HEAD_DIM + 1, 0};
    ei_config cfgs[4];
    int ci;
    cfgs[0] = ei_config_default();
    cfgs[1] = ei_config_default(); /* the largest plans: one-token segments and blocks, the largest budget */
    cfgs[1].segment_size = 1; cfgs[1].block_size = 1; cfgs[1].base_budget = EI_MAX_BUDGET; cfgs[1].budget_max_factor = 64.0;
    cfgs[1].threshold_len = 0;
    cfgs[2] = ei_config_default(); /* the largest segments */
    cfgs[2].segment_size = EI_MAX_SEGMENT; cfgs[2].block_size = 1; cfgs[2].base_budget = EI_MAX_BUDGET;
    cfgs[2].budget_max_factor = 64.0;
    cfgs[3] = ei_config_default(); /* the largest decode window and budget */
    cfgs[3].window = 65536; cfgs[3].decode_gap = 65536; cfgs[3].decode_budget = EI_MAX_BUDGET; cfgs[3].pool_kernel = 1023;
    for (ci = 0; ci < 4; ++ci) {
        ei_context *ctx;
        size_t ti, ki, di, b, prev;
        uint32_t flags;
        CHECK_ERR(ei_context_create(&cfgs[ci], &ctx), EI_OK);
        if (!ctx) continue;
        for (ti = 0; ti < sizeof toks / sizeof toks[0]; ++ti)
            for (ki = 0; ki < sizeof kvs / sizeof kvs[0]; ++ki)
                for (di = 0; di < sizeof dims / sizeof dims[0]; ++di)
                    for (flags = 0; flags < 8; ++flags) /* (EI_PLAN_KEEP_KEYS only with EI_PLAN_CHUNKED) */
                        if (flags != 4 && flags != 6) check_plan_size(ctx, toks[ti], kvs[ki], dims[di], flags);
        /* profiling workspace: monotone in every argument, holds the key
           representations [2][d][blocks], EI_ERR_SIZE past the limits */
        for (di = 0; di < 3; ++di) {
            prev = 0;
            for (ti = 0; ti < 8; ++ti) {
                int64_t T = toks[ti];
                ei_sizes sz;
                ei_result r = sizes_for(ctx, T, EI_MAX_HEADS, 1, dims[di], 0, 1, &sz);
                const ei_config *c = &cfgs[ci];
                wide lb = profile_lower_bound(c, T, dims[di]);
                b = sz.profile;
                if (r == EI_OK) {
                    CHECK((wide)b >= lb && b >= prev, "profile workspace %zu for %lld tokens (previous %zu, needs >= %.0Lf)", b,
                          (long long)T, prev, (long double)lb);
                    prev = b;
                } else
                    CHECK(r == EI_ERR_OVERFLOW && layer_lower_bound(c, T, EI_MAX_HEADS, 1, dims[di], 0) > WIDE_MAX_SIZE / 4u,
                          "profile workspace for %lld tokens: %s", (long long)T, ei_result_name(r));
            }
        }
        {
            ei_sizes sz;
            CHECK_ERR(sizes_for(ctx, EI_MAX_TOKENS + 1, 8, 8, 64, 0, 1, &sz), EI_ERR_SIZE);
            CHECK_ERR(sizes_for(ctx, 4096, EI_MAX_HEADS + 1, 1, 64, 0, 1, &sz), EI_ERR_SIZE);
            CHECK_ERR(sizes_for(ctx, 4096, 8, 8, EI_MAX_HEAD_DIM + 1, 0, 1, &sz), EI_ERR_SIZE);
            CHECK_ERR(sizes_for(ctx, 4096, 8, 3, 64, 0, 1, &sz), EI_ERR_GQA);
        }
        /* decode workspace: the scores of every query head [H][n], the scoring
           kernel's 32 rows of scores [n][32], and per row its order, sort key,
           mass, reduced and pooled score and ranking pair, at least (head_dim 1:
           the other buffers of the query as small as they come) */
        {
            static const int32_t hs[] = {1, 64, EI_MAX_HEADS};
            size_t hi;
            for (hi = 0; hi < 3; ++hi) {
                prev = 0;
                for (ti = 0; ti < 9; ++ti) {
                    int64_t T = toks[ti];
                    ei_sizes sz;
                    ei_result r = sizes_for(ctx, T, hs[hi], 1, 1, 0, 1, &sz);
                    wide lb = decode_keep_lower_bound(T, hs[hi]);
                    b = sz.decode_keep;
                    if (T > EI_MAX_TOKENS) { CHECK_ERR(r, EI_ERR_SIZE); continue; }
                    if (lb > WIDE_MAX_SIZE || layer_lower_bound(&cfgs[ci], T, hs[hi], 1, 1, 0) > WIDE_MAX_SIZE) {
                        CHECK_ERR(r, EI_ERR_OVERFLOW);
                        continue;
                    }
                    if (r == EI_ERR_OVERFLOW && layer_lower_bound(&cfgs[ci], T, hs[hi], 1, 1, 0) > WIDE_MAX_SIZE / 4u) {
                        CHECK_ERR(r, EI_ERR_OVERFLOW); /* another buffer of the layer, past size_t (32-bit) */
                        continue;
                    }
                    CHECK(r == EI_OK && (wide)b >= lb && b >= prev, "decode workspace(%lld, %d) = %s %zu, needs >= %.0Lf",
                          (long long)T, hs[hi], ei_result_name(r), b, (long double)lb);
                    prev = b;
                }
            }
        }
        {
            ei_sizes sz;
            CHECK_ERR(sizes_for(ctx, 0, 8, 8, 64, 0, 1, &sz), EI_ERR_SIZE);
            CHECK_ERR(sizes_for(ctx, 100, 8, 0, 64, 0, 1, &sz), EI_ERR_SIZE);
        }
        /* decoder: the ring of window queries */
        {
            /* [window][heads][head_dim] floats: past 4 GiB with the largest
               window on a 32-bit size_t, which must refuse it */
            wide ring = (wide)cfgs[ci].window * EI_MAX_HEADS * EI_MAX_HEAD_DIM * 4u;
            ei_sizes sz;
            ei_result r = sizes_for(ctx, 1, EI_MAX_HEADS, 1, EI_MAX_HEAD_DIM, 0, 1, &sz);
            if (ring + 64u > WIDE_MAX_SIZE) CHECK_ERR(r, EI_ERR_OVERFLOW);
            else if (r == EI_ERR_OVERFLOW && layer_lower_bound(&cfgs[ci], 1, EI_MAX_HEADS, 1, EI_MAX_HEAD_DIM, 0) > WIDE_MAX_SIZE / 4u)
                CHECK_ERR(r, EI_ERR_OVERFLOW); /* another buffer of the layer, past size_t (32-bit) */
            else {
                CHECK_ERR(r, EI_OK);
                CHECK((wide)sz.decoder >= ring, "decoder size %zu wrapped", sz.decoder);
            }
            CHECK_ERR(sizes_for(ctx, 1, EI_MAX_HEADS + 1, 1, 64, 0, 1, &sz), EI_ERR_SIZE);
            CHECK_ERR(sizes_for(ctx, 1, 8, 8, EI_MAX_HEAD_DIM + 1, 0, 1, &sz), EI_ERR_SIZE);
        }
        /* attention workspace: sane at the limits, monotone in head_dim */
        {
            ei_sizes s1, s2;
            ei_result r1 = sizes_for(ctx, 1, EI_MAX_HEADS, 1, EI_MAX_HEAD_DIM, 0, 1, &s1);
            ei_result r2 = sizes_for(ctx, 1, EI_MAX_HEADS, 1, 64, 0, 1, &s2);
            size_t a1 = s1.prefill, a2 = s2.prefill;
            /* (with a 32-bit size_t and the largest window the decoder's ring overflows, and with it the query) */
            int o1 = r1 == EI_ERR_OVERFLOW && layer_lower_bound(&cfgs[ci], 1, EI_MAX_HEADS, 1, EI_MAX_HEAD_DIM, 0) > WIDE_MAX_SIZE / 4u;
            int o2 = r2 == EI_ERR_OVERFLOW && layer_lower_bound(&cfgs[ci], 1, EI_MAX_HEADS, 1, 64, 0) > WIDE_MAX_SIZE / 4u;
            CHECK((o1 || r1 == EI_OK) && (o2 || r2 == EI_OK) && (o1 || o2 || a1 >= a2) && (o1 || a1 >= 64u * 4u) &&
                      (o2 || a2 >= 64u * 4u), "attention workspace %s %zu / %s %zu", ei_result_name(r1), a1, ei_result_name(r2), a2);
            CHECK_ERR(sizes_for(ctx, 1, EI_MAX_HEADS + 1, 1, 64, 0, 1, &s1), EI_ERR_SIZE);
            CHECK_ERR(sizes_for(ctx, 1, 8, 8, EI_MAX_HEAD_DIM + 1, 0, 1, &s1), EI_ERR_SIZE);
            CHECK_ERR(sizes_for(ctx, 1, 8, 3, 64, 0, 1, &s1), EI_ERR_GQA);
            CHECK_ERR(sizes_for(ctx, 1, 8, 8, 64, 0, 1, NULL), EI_ERR_NULL);
            CHECK_ERR(ei_layer_sizes(ctx, NULL, &s1), EI_ERR_NULL);
        }
        ei_context_destroy(ctx);
    }
    /* configuration limits: at the maximum accepted, one past refused */
    {
        ei_config c;
        ei_context *ctx;
#define AT_AND_PAST(field, at, past)                                              \
        c = ei_config_default(); c.field = at;                                    \
        CHECK_ERR(ei_context_create(&c, &ctx), EI_OK); ei_context_destroy(ctx);  \
        c.field = past;                                                           \
        CHECK_ERR(ei_context_create(&c, &ctx), EI_ERR_CONFIG);
        AT_AND_PAST(segment_size, EI_MAX_SEGMENT, EI_MAX_SEGMENT + 1);
        AT_AND_PAST(base_budget, EI_MAX_BUDGET, EI_MAX_BUDGET + 1);
        AT_AND_PAST(decode_budget, EI_MAX_BUDGET, EI_MAX_BUDGET + 1);
        AT_AND_PAST(budget_max_factor, 64.0, 64.5);
        AT_AND_PAST(pool_kernel, 1023, 1025);
        AT_AND_PAST(threshold_len, INT64_MAX, -1);
        AT_AND_PAST(recompress_every, INT32_MAX, -1);
        c = ei_config_default(); c.window = 65536; c.decode_gap = 16; c.decode_budget = 65536;
        CHECK_ERR(ei_context_create(&c, &ctx), EI_OK); ei_context_destroy(ctx);
        c.window = 65537; c.decode_budget = 65537;
        CHECK_ERR(ei_context_create(&c, &ctx), EI_ERR_CONFIG);
#undef AT_AND_PAST
    }
}

/* Views reaching past 2^60 elements are refused; every accepted view must
   have every element offset representable (its byte extent fits in int64). */
static void test_view_extent(void) {
    ei_context *ctx;
    float x[8] = {0};
    static const int64_t strides[] = {1, 1024, (int64_t)1 << 20, (int64_t)1 << 30, (int64_t)1 << 36, (int64_t)1 << 37,
                                      (int64_t)1 << 40};
    size_t i, j;
    CHECK_ERR(ei_context_create(NULL, &ctx), EI_OK);
    CHECK_ERR(ei__check_view(ctx, x, EI_F32, 2, 1, 1, ((int64_t)1 << 60) + 1, 1, "t"), EI_ERR_OVERFLOW);
    CHECK_ERR(ei__check_view(ctx, x, EI_F32, 2, 2, 1, 2, ((int64_t)1 << 61), "t"), EI_ERR_OVERFLOW);
    if (sizeof(size_t) >= 8)
        CHECK_ERR(ei__check_view(ctx, x, EI_F32, 2, 1, 1, ((int64_t)1 << 40) + 1, 1, "t"), EI_OK);
    {
        /* The byte limit, the one that binds on 32-bit targets (2 GiB there;
           2^60 elements binds first with a 64-bit size_t): the farthest
           element's byte offset within PTRDIFF_MAX, and the view's end below
           the top of the address space. The addresses are never dereferenced
           by ei__check_view. */
        int dt;
        for (dt = 0; dt < 2; ++dt) {
            ei_dtype type = dt ? EI_F16 : EI_F32;
            int64_t es = dt ? 2 : 4, lim = (int64_t)PTRDIFF_MAX / es;
            void *low = (void *)(uintptr_t)64, *top = (void *)(uintptr_t)(UINTPTR_MAX - 63);
            if (lim > ((int64_t)1 << 60)) lim = (int64_t)1 << 60;
            CHECK_ERR(ei__check_view(ctx, low, type, 2, 1, 1, lim - 1, 1, "t"), EI_OK);       /* farthest = lim */
            CHECK_ERR(ei__check_view(ctx, low, type, 2, 1, 1, lim, 1, "t"), EI_ERR_OVERFLOW); /* farthest = lim + 1 */
            CHECK_ERR(ei__check_view(ctx, low, type, 2, 1, 2, lim - 2, 2, "t"), EI_OK);
            CHECK_ERR(ei__check_view(ctx, low, type, 2, 1, 2, lim - 1, 2, "t"), EI_ERR_OVERFLOW);
            /* 60 bytes from UINTPTR_MAX - 63 end at UINTPTR_MAX - 3; 64 bytes would wrap to address 0 */
            CHECK_ERR(ei__check_view(ctx, top, type, 1, 1, (int32_t)(60 / es), 64, 64, "t"), EI_OK);
            CHECK_ERR(ei__check_view(ctx, top, type, 1, 1, (int32_t)(64 / es), 64, 64, "t"), EI_ERR_OVERFLOW);
        }
    }
    for (i = 0; i < sizeof strides / sizeof strides[0]; ++i)
        for (j = 0; j < 2; ++j) {
            /* j = 0: tokens outermost; j = 1: heads outermost (head-major) */
            int64_t n = EI_MAX_TOKENS, ts = j ? EI_MAX_HEAD_DIM : strides[i], hs = j ? strides[i] : EI_MAX_HEAD_DIM;
            int32_t heads = j ? EI_MAX_HEADS : 1, d = EI_MAX_HEAD_DIM;
            ei_result r;
            if (j && hs < n * ts) hs = n * ts;
            r = ei__check_view(ctx, x, EI_F32, n, heads, d, ts, hs, "t");
            if (r == EI_OK) {
                /* the last element's byte offset, exactly */
                wide last = ((wide)(n - 1) * (wide)ts + (wide)(heads - 1) * (wide)hs + (wide)d) * 4u;
                CHECK(last <= (wide)PTRDIFF_MAX, "a view of %lld tokens x %d heads x %d dims with strides (token %lld, head %lld) "
                      "was accepted, but its last element lies %.3Le bytes away: ei__row's offset arithmetic overflows",
                      (long long)n, (int)heads, (int)d, (long long)ts, (long long)hs, (long double)last);
            } else
                CHECK(r == EI_ERR_OVERFLOW || r == EI_ERR_SIZE || r == EI_ERR_STRIDE, "view refused with %s", ei_result_name(r));
        }
    ei_context_destroy(ctx);
}

/* ------------------------------------------------------------ NaN / Inf */
/* The layers of these tests: check.h's synth_layer with 64-token segments. */
static synth_layer make_layer(long n, int heads, int kv, int dim, uint64_t seed) {
    return synth_layer_make(n, heads, kv, dim, 64, seed);
}

/* EI_RANK_ANTIDIAGONAL at its edges, on every path: an unknown ranking and
   rank_samples out of range refused with a message; the most tiles (more
   than the segment's query blocks: tiles repeat with other heads), one-token
   blocks (one phase: every key), one block per segment, chunked planning of
   a padded K view whose padding is NaN (never read: the strided views stop
   at each row's token), and finite scores that overflow float32. */
static void test_antidiag_limits(void) {
    synth_layer L = make_layer(300, 4, 2, 32, 5);
    ei_config c;
    ei_context *ctx;
    int p;
    c = ei_config_default(); c.ranking = (ei_ranking)3;
    CHECK_ERR(ei_context_create(&c, &ctx), EI_ERR_CONFIG);
    CHECK(strstr(ei_last_error(), "unknown ranking 3") != NULL, "%s", ei_last_error());
    c = ei_config_default(); c.ranking = EI_RANK_ANTIDIAGONAL; c.rank_samples = EI_MAX_RANK_SAMPLES + 1;
    CHECK_ERR(ei_context_create(&c, &ctx), EI_ERR_CONFIG);
    CHECK(strstr(ei_last_error(), "rank_samples") != NULL, "%s", ei_last_error());
    c.rank_samples = -1;
    CHECK_ERR(ei_context_create(&c, &ctx), EI_ERR_CONFIG);
    for (p = EI_SIMD_SCALAR; p < TEST_SIMD_END; ++p) {
        static const struct { int32_t seg, bs, samples; } shapes[] = {{64, 8, EI_MAX_RANK_SAMPLES}, {64, 1, 7}, {64, 64, 3}, {32, 8, 1}};
        size_t si;
        if (!test_simd_selected((ei_simd)p)) continue;
        for (si = 0; si < sizeof shapes / sizeof shapes[0]; ++si) {
            ei_plan plan, ch;
            size_t wb;
            void *ws;
            float *kpad = (float *)malloc(sizeof(float) * (size_t)(L.n + 40) * L.kv * L.dim);
            ei_tensor kp;
            size_t i;
            c = small_config((ei_simd)p);
            c.ranking = EI_RANK_ANTIDIAGONAL; c.top_p = 0.9; c.sink_blocks = 1; c.local_blocks = 1;
            c.segment_size = shapes[si].seg; c.block_size = shapes[si].bs; c.rank_samples = shapes[si].samples;
            ei_exec e;
            CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
            wb = layer_sizes(ctx, L.n, L.heads, L.kv, L.dim, 0, 1).profile;
            ws = guarded_alloc(wb);
            e = ex(1, ws, wb);
            CHECK_ERR(ei_plan_init(ctx, &plan, L.n, L.kv, L.dim, 0, NULL, 0), EI_OK);
            CHECK_ERR(ei_plan_init(ctx, &ch, L.n, L.kv, L.dim, EI_PLAN_CHUNKED, NULL, 0), EI_OK);
            CHECK_ERR(ei_profile(ctx, &e, &L.tq, &L.tk, &plan), EI_OK);
            memcpy(kpad, L.k, sizeof(float) * (size_t)L.n * L.kv * L.dim);
            for (i = (size_t)L.n * L.kv * L.dim; i < (size_t)(L.n + 40) * L.kv * L.dim; ++i) kpad[i] = NAN;
            kp = ei_tensor_make(kpad, EI_F32, L.n + 40, L.kv, L.dim);
            CHECK_ERR(ei_profile_chunk(ctx, &e, &L.tq, &kp, &ch, 0, 1), EI_OK);
            CHECK(!memcmp(plan.block_index, ch.block_index, sizeof(int32_t) * plan.n_kv_heads * plan.seg_capacity * plan.max_keep),
                  "antidiagonal (segment %d, block %d, %d tiles, %s): one chunk over a NaN-padded view differs from whole-prompt",
                  (int)c.segment_size, (int)c.block_size, (int)c.rank_samples, ei_simd_name((ei_simd)p));
            CHECK(guard_intact(ws, wb), "antidiagonal workspace guard");
            guarded_free(ws);
            free(kpad);
            ei_plan_free(ctx, &plan);
            ei_plan_free(ctx, &ch);
            ei_context_destroy(ctx);
        }
        {   /* finite inputs whose antidiagonal scores overflow float32 */
            synth_layer B = make_layer(300, 2, 1, 16, 5);
            ei_plan plan;
            ei_exec e;
            size_t wb;
            long i;
            c = small_config((ei_simd)p);
            c.ranking = EI_RANK_ANTIDIAGONAL;
            c.attn_scale = 1e4f;
            for (i = 0; i < 300 * 2 * 16; ++i) B.q[i] = 3e17f;
            for (i = 0; i < 300 * 16; ++i) B.k[i] = 3e17f;
            CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
            wb = layer_sizes(ctx, B.n, B.heads, B.kv, B.dim, 0, 1).profile;
            e = ex(1, malloc(wb), wb);
            CHECK_ERR(ei_plan_init(ctx, &plan, B.n, B.kv, B.dim, 0, NULL, 0), EI_OK);
            CHECK_ERR(ei_profile(ctx, &e, &B.tq, &B.tk, &plan), EI_ERR_NONFINITE);
            CHECK(strstr(ei_last_error(), "overflow") != NULL, "%s", ei_last_error());
            free(e.workspace);
            ei_plan_free(ctx, &plan);
            ei_context_destroy(ctx);
            synth_layer_free(&B);
        }
    }
    synth_layer_free(&L);
}

static void test_nonfinite(void) {
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    synth_layer L = make_layer(300, 4, 2, 32, 5);
    size_t nq = (size_t)L.n * L.heads * L.dim, nk = (size_t)L.n * L.kv * L.dim;
    int p, dt, bi;
    for (p = EI_SIMD_SCALAR; p < TEST_SIMD_END; ++p) {
        ei_config c = small_config((ei_simd)p);
        ei_context *ctx;
        ei_plan plan;
        size_t wb;
        void *ws;
        ei_exec e;
        if (!test_simd_selected((ei_simd)p)) continue;
        CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
        CHECK_ERR(ei_plan_init(ctx, &plan, L.n, L.kv, L.dim, EI_PLAN_CHUNKED, NULL, 0), EI_OK);
        wb = layer_sizes(ctx, L.n, L.heads, L.kv, L.dim, EI_PLAN_CHUNKED, 1).profile;
        ws = guarded_alloc(wb);
        e = ex(1, ws, wb);
        for (dt = 0; dt < 3; ++dt)
            for (bi = 0; bi < 3; ++bi) {
                /* Q: in a segment's interior and in the last (partial) segment; K: in a
                   scored block and in the never-scored tail */
                static const long qpos[] = {77, 299}, kpos[] = {13, 290};
                int w;
                for (w = 0; w < 2; ++w) {
                    float saved;
                    void *qd, *kd;
                    ei_tensor q, k;
                    saved = L.q[(size_t)qpos[w] * L.heads * L.dim + 3];
                    L.q[(size_t)qpos[w] * L.heads * L.dim + 3] = bad[bi];
                    qd = to_dtype(L.q, nq, (ei_dtype)dt); kd = to_dtype(L.k, nk, (ei_dtype)dt);
                    q = ei_tensor_make(qd, (ei_dtype)dt, L.n, L.heads, L.dim);
                    k = ei_tensor_make(kd, (ei_dtype)dt, L.n, L.kv, L.dim);
                    CHECK_ERR(ei_profile(ctx, &e, &q, &k, &plan), EI_ERR_NONFINITE);
                    CHECK_ERR(ei_plan_reset(&plan), EI_OK);
                    CHECK_ERR(ei_profile_chunk(ctx, &e, &q, &k, &plan, plan.n_tokens, 1), EI_ERR_NONFINITE);
                    L.q[(size_t)qpos[w] * L.heads * L.dim + 3] = saved;
                    free(qd); free(kd);
                    saved = L.k[(size_t)kpos[w] * L.kv * L.dim + 1];
                    L.k[(size_t)kpos[w] * L.kv * L.dim + 1] = bad[bi];
                    qd = to_dtype(L.q, nq, (ei_dtype)dt); kd = to_dtype(L.k, nk, (ei_dtype)dt);
                    q.data = qd; k.data = kd;
                    CHECK_ERR(ei_profile(ctx, &e, &q, &k, &plan), EI_ERR_NONFINITE);
                    CHECK_ERR(ei_plan_reset(&plan), EI_OK);
                    CHECK_ERR(ei_profile_chunk(ctx, &e, &q, &k, &plan, plan.n_tokens, 1), EI_ERR_NONFINITE);
                    L.k[(size_t)kpos[w] * L.kv * L.dim + 1] = saved;
                    free(qd); free(kd);
                    CHECK_ERR(ei_plan_reset(&plan), EI_OK);
                }
            }
        /* denormals and -0 are ordinary finite input */
        {
            ei_tensor q = L.tq, k = L.tk;
            float sq = L.q[5], sk = L.k[9];
            L.q[5] = 1e-42f; L.k[9] = -0.0f;
            CHECK_ERR(ei_profile(ctx, &e, &q, &k, &plan), EI_OK);
            L.q[5] = sq; L.k[9] = sk;
        }
        CHECK(guard_intact(ws, wb), "profile workspace guard");
        guarded_free(ws);
        ei_plan_free(ctx, &plan);
        ei_context_destroy(ctx);
    }
    synth_layer_free(&L);
}

/* Decode: non-finite K rejected; finite but huge Q.K that overflows to NaN
   logits must not produce a keep-set ranked on NaN. */
static void test_decode_nonfinite(void) {
    const int heads = 4, kv = 2, dim = 16;
    long n = 200, t;
    ei_config c = small_config(EI_SIMD_AUTO);
    ei_context *ctx;
    ei_decoder dec;
    ei_keep_set ks;
    void *dm, *ws;
    size_t db, wb, idx_bytes;
    float *q = (float *)malloc(sizeof(float) * (size_t)n * heads * dim), *k = (float *)malloc(sizeof(float) * (size_t)n * kv * dim);
    ei_tensor qt, kt;
    ei_sizes sz;
    ei_exec e;
    synth_qk(q, k, n, heads, kv, dim, 64, 2, 3);
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    sz = layer_sizes(ctx, n, heads, kv, dim, 0, 1);
    db = sz.decoder;
    wb = sz.decode_keep;
    dm = guarded_alloc(db);
    ws = guarded_alloc(wb);
    e = ex(1, ws, wb);
    CHECK_ERR(ei_decoder_init(ctx, &dec, heads, kv, dim, dm, db), EI_OK);
    memset(&ks, 0, sizeof ks);
    ks.heads_out = kv;
    ks.capacity = c.decode_budget;
    idx_bytes = sizeof(int32_t) * (size_t)kv * (size_t)c.decode_budget;
    ks.index = (int32_t *)guarded_alloc(idx_bytes);
    qt = ei_tensor_make(q, EI_F32, n, heads, dim);
    kt = ei_tensor_make(k, EI_F32, n, kv, dim);
    CHECK_ERR(ei_decode_observe(ctx, &dec, &qt, 0, 0), EI_OK);
    k[(size_t)17 * kv * dim + 2] = INFINITY;
    CHECK_ERR(ei_decode_keep(ctx, &e, &dec, &kt, &ks), EI_ERR_NONFINITE);
    k[(size_t)17 * kv * dim + 2] = NAN;
    CHECK_ERR(ei_decode_keep(ctx, &e, &dec, &kt, &ks), EI_ERR_NONFINITE);
    k[(size_t)17 * kv * dim + 2] = 0.5f;
    CHECK_ERR(ei_decode_keep(ctx, &e, &dec, &kt, &ks), EI_OK);
    /* finite input whose products overflow: +inf and -inf terms give NaN logits */
    CHECK_ERR(ei_decoder_reset(&dec), EI_OK);
    for (t = n - c.window; t < n; ++t) { q[(size_t)t * heads * dim + 0] = 3e38f; q[(size_t)t * heads * dim + 1] = 3e38f; }
    k[(size_t)40 * kv * dim + 0] = 3e38f;
    k[(size_t)40 * kv * dim + 1] = -3e38f;
    CHECK_ERR(ei_decode_observe(ctx, &dec, &qt, 0, 0), EI_OK);
    {
        ei_result r = ei_decode_keep(ctx, &e, &dec, &kt, &ks);
        CHECK(r == EI_ERR_NONFINITE, "decode scores that overflow to NaN (q 3e38 x k +-3e38) gave %s, not EI_ERR_NONFINITE: "
              "the keep-set was ranked on NaN scores", ei_result_name(r));
    }
    CHECK(guard_intact(ks.index, idx_bytes) && guard_intact(ws, wb) && guard_intact(dm, db), "decode guards");
    guarded_free(ks.index); guarded_free(ws); guarded_free(dm);
    free(q); free(k);
    ei_context_destroy(ctx);
}

/* V is not scanned: NaN in V propagates to exactly the outputs that attend
   to it (dense causal: every query at or after its token), nothing else. */
static void test_v_propagates(void) {
    synth_layer L = make_layer(130, 4, 2, 16, 9);
    int p;
    for (p = EI_SIMD_SCALAR; p < TEST_SIMD_END; ++p) {
        ei_config c = small_config((ei_simd)p);
        ei_context *ctx;
        size_t wb, ob = sizeof(float) * (size_t)L.n * L.heads * L.dim;
        void *ws;
        float *out;
        ei_tensor q = L.tq, k = L.tk, v = L.tv;
        ei_out_tensor o;
        long t;
        int h, i, nan_before = 0, finite_after = 0;
        const long bad_tok = 70;
        ei_sizes sz;
        ei_exec e;
        if (!test_simd_selected((ei_simd)p)) continue;
        CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
        CHECK_ERR(sizes_for(ctx, L.n, L.heads, L.kv, L.dim, 0, 1, &sz), EI_OK);
        wb = sz.prefill;
        ws = guarded_alloc(wb);
        e = ex(1, ws, wb);
        out = (float *)guarded_alloc(ob);
        o = ei_out_tensor_make(out, EI_F32, L.n, L.heads, L.dim);
        L.v[((size_t)bad_tok * L.kv + 1) * L.dim + 4] = NAN; /* kv head 1, dim 4 */
        CHECK_ERR(ei_attention_prefill(ctx, &e, &q, &k, &v, NULL, &o, 0), EI_OK);
        for (t = 0; t < L.n; ++t)
            for (h = 0; h < L.heads; ++h)
                for (i = 0; i < L.dim; ++i) {
                    float x = out[((size_t)t * L.heads + h) * L.dim + i];
                    /* the SIMD kernels multiply whole 64-key tiles: the rows of the NaN's
                       tile before it (masked, weight 0) get 0 * NaN too (documented) */
                    long first = p == EI_SIMD_SCALAR ? bad_tok : bad_tok / 64 * 64;
                    int affected = t >= first && h / (L.heads / L.kv) == 1 && i == 4;
                    if (!affected && x != x) nan_before++;
                    if (affected && x == x) finite_after++;
                }
        CHECK(nan_before == 0, "%s: NaN in V reached %d outputs that do not attend to it", ei_simd_name((ei_simd)p), nan_before);
        CHECK(finite_after == 0, "%s: %d outputs attending to a NaN in V are finite (documented: it propagates)",
              ei_simd_name((ei_simd)p), finite_after);
        L.v[((size_t)bad_tok * L.kv + 1) * L.dim + 4] = 0.25f;
        CHECK(guard_intact(out, ob) && guard_intact(ws, wb), "attention guards");
        guarded_free(out); guarded_free(ws);
        ei_context_destroy(ctx);
    }
    synth_layer_free(&L);
}

/* ------------------------------------------------------------ every result code */
static int alloc_budget = 0;
static void *failing_alloc(size_t n, void *u) { (void)u; return alloc_budget-- > 0 ? malloc(n) : NULL; }
static void failing_free(void *p, void *u) { (void)u; free(p); }

static void test_every_code(void) {
    synth_layer L = make_layer(200, 4, 2, 16, 1);
    ei_config c = small_config(EI_SIMD_AUTO);
    ei_context *ctx = NULL, *bad = NULL;
    ei_plan plan;
    ei_decoder dec;
    ei_keep_set ks;
    size_t wb, b;
    void *ws, *dm;
    ei_tensor q = L.tq, k = L.tk, x;
    ei_sizes sz, sb;
    ei_exec e, en;
    int p;
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    sz = layer_sizes(ctx, L.n, L.heads, L.kv, L.dim, 0, 1);
    wb = sz.profile;
    ws = guarded_alloc(wb);
    e = ex(1, ws, wb);
    CHECK_ERR(ei_plan_init(ctx, &plan, L.n, L.kv, L.dim, 0, NULL, 0), EI_OK);
    /* EI_ERR_NULL */
    CHECK_ERR(ei_context_create(NULL, NULL), EI_ERR_NULL);
    en = ex(1, NULL, wb);
    CHECK_ERR(ei_profile(ctx, &en, &q, &k, &plan), EI_ERR_NULL);
    /* EI_ERR_SIZE */
    CHECK_ERR(sizes_for(ctx, EI_MAX_TOKENS + 1, 4, 2, 16, 0, 1, &sb), EI_ERR_SIZE);
    x = q; x.n_tokens = 0;
    CHECK_ERR(ei_profile(ctx, &e, &x, &k, &plan), EI_ERR_SIZE);
    /* EI_ERR_GQA */
    x = q; x.n_heads = 3; x.token_stride = 3 * L.dim;
    CHECK_ERR(ei_profile(ctx, &e, &x, &k, &plan), EI_ERR_GQA);
    /* EI_ERR_CONFIG */
    c.block_size = 7;
    CHECK_ERR(ei_context_create(&c, &bad), EI_ERR_CONFIG);
    c.block_size = 8;
    /* EI_ERR_STRIDE */
    x = q; x.token_stride = 0;
    CHECK_ERR(ei_profile(ctx, &e, &x, &k, &plan), EI_ERR_STRIDE);
    x = q; x.head_stride = -L.dim;
    CHECK_ERR(ei_profile(ctx, &e, &x, &k, &plan), EI_ERR_STRIDE);
    /* EI_ERR_DTYPE */
    x = q; x.dtype = (ei_dtype)7;
    CHECK_ERR(ei_profile(ctx, &e, &x, &k, &plan), EI_ERR_DTYPE);
    /* EI_ERR_NONFINITE */
    L.q[100] = NAN;
    CHECK_ERR(ei_profile(ctx, &e, &q, &k, &plan), EI_ERR_NONFINITE);
    L.q[100] = 0.5f;
    /* EI_ERR_OVERFLOW: a plan larger than size_t, and a view reaching past 2^60 elements */
    {
        ei_config big = ei_config_default();
        ei_context *cb;
        big.segment_size = 1; big.block_size = 1; big.base_budget = EI_MAX_BUDGET; big.budget_max_factor = 64.0;
        CHECK_ERR(ei_context_create(&big, &cb), EI_OK);
        CHECK_ERR(sizes_for(cb, EI_MAX_TOKENS, EI_MAX_HEADS, EI_MAX_HEADS, EI_MAX_HEAD_DIM, EI_PLAN_SCORES, 1, &sb), EI_ERR_OVERFLOW);
        ei_context_destroy(cb);
    }
    x = q; x.token_stride = ((int64_t)1 << 58);
    CHECK_ERR(ei_profile(ctx, &e, &x, &k, &plan), EI_ERR_OVERFLOW);
    /* EI_ERR_WORKSPACE */
    en = ex(1, ws, wb - 1);
    CHECK_ERR(ei_profile(ctx, &en, &q, &k, &plan), EI_ERR_WORKSPACE);
    /* EI_ERR_NOMEM: the allocator fails for the context, then for a plan */
    {
        ei_config cn = small_config(EI_SIMD_AUTO);
        ei_context *cx = NULL;
        ei_plan pn;
        cn.allocator.alloc = failing_alloc;
        cn.allocator.free = failing_free;
        alloc_budget = 0;
        CHECK_ERR(ei_context_create(&cn, &cx), EI_ERR_NOMEM);
        CHECK(cx == NULL, "context returned after NOMEM");
        alloc_budget = 1;
        CHECK_ERR(ei_context_create(&cn, &cx), EI_OK);
        CHECK_ERR(ei_plan_init(cx, &pn, 1000, 2, 16, 0, NULL, 0), EI_ERR_NOMEM);
        ei_context_destroy(cx);
    }
    /* EI_ERR_STATE: keep-set before any query was observed; chunked planning on a plain plan */
    b = sz.decoder;
    dm = guarded_alloc(b);
    CHECK_ERR(ei_decoder_init(ctx, &dec, L.heads, L.kv, L.dim, dm, b), EI_OK);
    memset(&ks, 0, sizeof ks);
    ks.heads_out = L.kv;
    ks.capacity = c.decode_budget;
    ks.index = (int32_t *)guarded_alloc(sizeof(int32_t) * (size_t)L.kv * (size_t)c.decode_budget);
    {
        size_t dwb = sz.decode_keep;
        void *dws = guarded_alloc(dwb);
        ei_exec ed = ex(1, dws, dwb);
        CHECK_ERR(ei_decode_keep(ctx, &ed, &dec, &k, &ks), EI_ERR_STATE);
        guarded_free(dws);
    }
    CHECK_ERR(ei_profile_chunk(ctx, &e, &q, &k, &plan, plan.n_tokens, 1), EI_ERR_STATE);
    /* EI_ERR_SHAPE */
    x = q; x.head_dim = 8; x.head_stride = 8; x.token_stride = 8 * L.heads;
    CHECK_ERR(ei_profile(ctx, &e, &x, &k, &plan), EI_ERR_SHAPE);
    /* EI_ERR_UNSUPPORTED: forcing a SIMD path this CPU/build lacks */
    for (p = EI_SIMD_AVX2; p <= EI_SIMD_NEON; ++p)
        if (!ei_cpu_supports((ei_simd)p)) {
            ei_config cu = small_config((ei_simd)p);
            CHECK_ERR(ei_context_create(&cu, &bad), EI_ERR_UNSUPPORTED);
            break;
        }
    /* EI_ERR_BACKEND: the CUDA backend from a library that is not there */
    {
        ei_config cc = small_config(EI_SIMD_AUTO);
        cc.backend = EI_BACKEND_CUDA;
        cc.cuda_library = "/nonexistent/libentropyinfer_cuda.so";
        CHECK_ERR(ei_context_create(&cc, &bad), EI_ERR_BACKEND);
    }
    CHECK_ERR(ei_profile(ctx, &e, &q, &k, &plan), EI_OK);
    CHECK(guard_intact(ws, wb) && guard_intact(dm, b), "guards");
    guarded_free(ks.index); guarded_free(dm); guarded_free(ws);
    ei_plan_free(ctx, &plan);
    ei_context_destroy(ctx);
    synth_layer_free(&L);
    /* the table: every code reached with a message naming it */
#define EI__REACHED(name, value, text)                                                 \
    CHECK(reached[-(value)], "%s (%d) was not reached by any test with its message", #name, value); \
    printf("  %-20s %s\n", #name, reached[-(value)] ? "reached, message names it" : "NOT REACHED");
    EI_RESULT_TABLE(EI__REACHED)
#undef EI__REACHED
}

/* ------------------------------------------------------------ any alignment */
/* Buffers of exactly the queried size at 64-byte boundary + offset, with
   guard bytes on both sides (check.h: guarded_alloc_at): sizes returned by
   ei_layer_sizes must be enough at any alignment (found by the fuzz
   replay: the profiling workspace reserved mx/mn as one array but carved
   two, 64-byte rounded each), for one thread and for 3 parts sharing one
   workspace of the size for 3 (each part's slice, and the decode partials
   that lead the decode workspace, at any alignment). */
static void test_any_alignment(void) {
    static const int dims[] = {1, 3, 8, 17, 33, 47, 64, 65, 100};
    static const unsigned offsets[] = {0, 4, 8, 16, 32, 48, 60};
    size_t di, oi;
    int bad = 0;
    for (di = 0; di < sizeof dims / sizeof dims[0]; ++di) {
        synth_layer L = make_layer(150, 4, 2, dims[di], 31);
        ei_config c = small_config(EI_SIMD_AUTO);
        ei_context *ctx;
        c.segment_size = 32; c.block_size = 4; c.base_budget = 16; c.threshold_len = 32; c.window = 8; c.decode_gap = 4;
        c.decode_budget = 40;
        CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
        for (oi = 0; oi < sizeof offsets / sizeof offsets[0]; ++oi) {
            unsigned off = offsets[oi];
            ei_tensor q = L.tq, k = L.tk, v = L.tv;
            ei_plan plan;
            ei_decoder dec;
            ei_keep_set ks;
            size_t pb, wb, ab, db, kb, w3b[3];
            void *pm, *ws, *as, *dm, *dws, *out, *w3[3];
            size_t ob = sizeof(float) * (size_t)L.n * L.heads * L.dim;
            ei_out_tensor o, o1;
            ei_result r1, r2, r3, r4, r5 = EI_OK;
            ei_sizes sz = layer_sizes(ctx, L.n, L.heads, L.kv, L.dim, EI_PLAN_CHUNKED | EI_PLAN_SCORES, 1),
                     sz3 = layer_sizes(ctx, L.n, L.heads, L.kv, L.dim, EI_PLAN_CHUNKED | EI_PLAN_SCORES, 3);
            ei_exec ew, ea, ek;
            ei_tensor q1 = q;
            int i, j;
            pb = sz.plan; wb = sz.profile; ab = sz.prefill; db = sz.decoder; kb = sz.decode_keep;
            pm = guarded_alloc_at(pb, off); ws = guarded_alloc_at(wb, off); as = guarded_alloc_at(ab, off);
            dm = guarded_alloc_at(db, off); dws = guarded_alloc_at(kb, off);
            w3b[0] = sz3.profile; w3b[1] = sz3.prefill; w3b[2] = sz3.decode;
            for (i = 0; i < 3; ++i) w3[i] = guarded_alloc_at(w3b[i], off);
            out = guarded_alloc_at(ob, off & ~3u);
            o = ei_out_tensor_make(out, EI_F32, L.n, L.heads, L.dim);
            ew = ex(1, ws, wb); ea = ex(1, as, ab); ek = ex(1, dws, kb);
            r1 = ei_plan_init(ctx, &plan, L.n, L.kv, L.dim, EI_PLAN_CHUNKED | EI_PLAN_SCORES, pm, pb);
            if (r1 == EI_OK) r1 = ei_profile(ctx, &ew, &q, &k, &plan);
            if (r1 == EI_OK) r1 = ei_plan_reset(&plan);
            if (r1 == EI_OK) r1 = ei_profile_chunk(ctx, &ew, &q, &k, &plan, plan.n_tokens, 1);
            r2 = r1 == EI_OK ? ei_attention_prefill(ctx, &ea, &q, &k, &v, &plan, &o, 0) : r1;
            /* 3 parts: planning (then finalize), prefill, a decode step and its merge */
            q1.data = (const float *)q.data + (size_t)(L.n - 1) * L.heads * L.dim; q1.n_tokens = 1;
            o1 = o; o1.n_tokens = 1;
            for (j = 0; j < 4 && r5 == EI_OK && r2 == EI_OK; ++j) {
                for (i = 0; i < 3 && r5 == EI_OK; ++i) {
                    ei_exec e3 = ex_part(i, 3, w3[j < 1 ? 0 : j < 2 ? 1 : 2], w3b[j < 1 ? 0 : j < 2 ? 1 : 2]);
                    r5 = j == 0 ? ei_profile_chunk(ctx, &e3, &q, &k, &plan, 0, 1)
                       : j == 1 ? ei_attention_prefill(ctx, &e3, &q, &k, &v, &plan, &o, 0)
                       : j == 2 ? ei_attention_decode(ctx, &e3, &q1, &k, &v, NULL, &o1, L.n - 1)
                       : ei_attention_decode_merge(ctx, &e3, &o1);
                }
                if (j == 0 && r5 == EI_OK) r5 = ei_plan_finalize(ctx, &plan);
            }
            r3 = ei_decoder_init(ctx, &dec, L.heads, L.kv, L.dim, dm, db);
            if (r3 == EI_OK) r3 = ei_decode_observe(ctx, &dec, &q, 0, 0);
            memset(&ks, 0, sizeof ks);
            ks.heads_out = L.kv;
            ks.capacity = c.decode_budget;
            ks.index = (int32_t *)malloc(sizeof(int32_t) * (size_t)L.kv * (size_t)c.decode_budget);
            r4 = r3 == EI_OK ? ei_decode_keep(ctx, &ek, &dec, &k, &ks) : r3;
            if (r1 || r2 || r3 || r4 || r5 || !guard_intact(pm, pb) || !guard_intact(ws, wb) || !guard_intact(as, ab) ||
                !guard_intact(dm, db) || !guard_intact(dws, kb) || !guard_intact(out, ob) || !guard_intact(w3[0], w3b[0]) ||
                !guard_intact(w3[1], w3b[1]) || !guard_intact(w3[2], w3b[2])) {
                if (bad++ < 8)
                    printf("FAIL head_dim %d, memory at 64k+%u: profile %s, attention %s, decoder %s, decode %s, 3 parts %s, "
                           "guards %d%d%d%d%d%d %d%d%d\n",
                           dims[di], off, ei_result_name(r1), ei_result_name(r2), ei_result_name(r3), ei_result_name(r4),
                           ei_result_name(r5), guard_intact(pm, pb), guard_intact(ws, wb), guard_intact(as, ab),
                           guard_intact(dm, db), guard_intact(dws, kb), guard_intact(out, ob), guard_intact(w3[0], w3b[0]),
                           guard_intact(w3[1], w3b[1]), guard_intact(w3[2], w3b[2]));
            }
            free(ks.index);
            guarded_free(pm); guarded_free(ws); guarded_free(as); guarded_free(dm); guarded_free(dws); guarded_free(out);
            for (i = 0; i < 3; ++i) guarded_free(w3[i]);
        }
        ei_context_destroy(ctx);
        synth_layer_free(&L);
    }
    CHECK(bad == 0, "%d (head_dim, alignment) combinations failed with memory of exactly the queried size", bad);
}

/* ------------------------------------------------------------ misuse (issue 15) */
/* What a careless caller does, each refused with its code before any write:
   buffers over each other and over the library's memory, misaligned data,
   NaN/Inf that attention reads, edited plans and decoders. Each fails without
   the checks (a crash or a write outside a buffer under ASan; EI_OK). */
typedef struct mu_setup {
    synth_layer L;
    ei_config c;
    ei_context *ctx;
    ei_plan plan;
    ei_decoder dec;
    void *pm, *dm;
    size_t pb, wb, ab, db, kb, ob;
} mu_setup;
static mu_setup mu_make(ei_simd simd) {
    mu_setup m;
    m.L = make_layer(200, 4, 2, 16, 3);
    m.c = small_config(simd);
    CHECK_ERR(ei_context_create(&m.c, &m.ctx), EI_OK);
    {
        ei_sizes sz = layer_sizes(m.ctx, m.L.n, m.L.heads, m.L.kv, m.L.dim, 0, 1);
        m.pb = sz.plan; m.wb = sz.profile; m.ab = sz.prefill; m.db = sz.decoder; m.kb = sz.decode_keep;
    }
    m.ob = sizeof(float) * (size_t)m.L.n * (size_t)m.L.heads * (size_t)m.L.dim;
    /* room for an output laid over the plan's arrays */
    m.pm = guarded_alloc(m.pb + m.ob);
    m.dm = guarded_alloc(m.db + m.ob);
    CHECK_ERR(ei_plan_init(m.ctx, &m.plan, m.L.n, m.L.kv, m.L.dim, 0, m.pm, m.pb), EI_OK);
    {
        void *ws = guarded_alloc(m.wb);
        ei_exec e = ex(1, ws, m.wb);
        CHECK_ERR(ei_profile(m.ctx, &e, &m.L.tq, &m.L.tk, &m.plan), EI_OK);
        guarded_free(ws);
    }
    CHECK_ERR(ei_decoder_init(m.ctx, &m.dec, m.L.heads, m.L.kv, m.L.dim, m.dm, m.db), EI_OK);
    CHECK_ERR(ei_decode_observe(m.ctx, &m.dec, &m.L.tq, 0, 0), EI_OK);
    return m;
}
static void mu_free(mu_setup *m) {
    CHECK(guard_intact(m->pm, m->pb + m->ob) && guard_intact(m->dm, m->db + m->ob), "plan / decoder memory guards");
    guarded_free(m->pm); guarded_free(m->dm);
    ei_context_destroy(m->ctx);
    synth_layer_free(&m->L);
}
/* The code, and a message that names both buffers. */
static void mu_expect_overlap(ei_result r, const char *a, const char *b, const char *what) {
    CHECK(r == EI_ERR_OVERLAP && strstr(ei_last_error(), a) && strstr(ei_last_error(), b),
          "%s: %s (%s), expected EI_ERR_OVERLAP naming '%s' and '%s'", what, ei_result_name(r), ei_last_error(), a, b);
    if (r == EI_ERR_OVERLAP) CHECK_ERR_REACHED(EI_ERR_OVERLAP);
}
static ei_keep_set mu_keep(const mu_setup *m, int32_t *index) {
    ei_keep_set ks;
    memset(&ks, 0, sizeof ks);
    ks.heads_out = m->L.kv;
    ks.capacity = m->c.decode_budget;
    ks.index = index;
    return ks;
}

/* Rules of calls in parts that the first conversion to ei_exec found
   broken (issue 31) and the header now keeps: a part checks the call's
   regions against every part's share of the shared workspace, and a part
   with no kv heads still checks k. Each is a failure if it breaks again. */
static const char *const gap_empty_parts =
    "profiling in parts: a k of n_heads <= 0 (a zeroed ei_tensor, or another struct laid over it) must be refused by "
    "every part, not planned as nothing";
static void known_gap(int ok, const char *what) { CHECK(ok, "parts rule broken: %s", what); }

static void test_overlaps(void) {
    mu_setup m = mu_make(EI_SIMD_AUTO);
    synth_layer *L = &m.L;
    size_t kv_rows = (size_t)L->n * (size_t)L->kv * (size_t)L->dim;
    void *as = guarded_alloc(2 * m.ab + m.ob), *ws = guarded_alloc(2 * m.wb + m.ob), *dws = guarded_alloc(2 * m.kb);
    int32_t *index = (int32_t *)guarded_alloc(sizeof(int32_t) * (size_t)L->kv * (size_t)m.c.decode_budget);
    float *out = (float *)guarded_alloc(m.ob), *scores = (float *)guarded_alloc(m.kb), *shared;
    ei_out_tensor o = ei_out_tensor_make(out, EI_F32, L->n, L->heads, L->dim), ox;
    ei_keep_set ks = mu_keep(&m, index), kx;
    uint8_t *mask = (uint8_t *)guarded_alloc((size_t)L->kv * (size_t)L->n);
    ei_tensor x;
    /* one thread, two threads, and parts of two sharing one workspace */
    ei_exec ea = ex(1, as, m.ab), ea2 = ex(2, as, 2 * m.ab), ep0 = ex_part(0, 2, as, 2 * m.ab), ep1 = ex_part(1, 2, as, 2 * m.ab);
    ei_exec ew = ex(1, ws, m.wb), ew2 = ex(2, ws, 2 * m.wb), ek = ex(1, dws, m.kb), ek2 = ex(2, dws, 2 * m.kb);
    ei_exec ek1 = ex_part(1, 2, dws, 2 * m.kb);
    /* attention output over the plan's arrays, over its own workspace, over q */
    ox = o; ox.data = m.plan.block_index;
    mu_expect_overlap(ei_attention_prefill(m.ctx, &ea, &L->tq, &L->tk, &L->tv, &m.plan, &ox, 0), "out",
                      "plan", "attention output over the plan");
    ox = o; ox.data = (unsigned char *)as + 64;
    mu_expect_overlap(ei_attention_prefill(m.ctx, &ea, &L->tq, &L->tk, &L->tv, &m.plan, &ox, 0), "out",
                      "workspace", "attention output over its workspace");
    mu_expect_overlap(ei_attention_prefill(m.ctx, &ea2, &L->tq, &L->tk, &L->tv, NULL, &ox, 0), "out",
                      "workspace", "attention on 2 threads: output over its workspace");
    mu_expect_overlap(ei_attention_prefill(m.ctx, &ep0, &L->tq, &L->tk, &L->tv, NULL, &ox, 0), "out",
                      "workspace", "attention, part 0 of 2: output over its slice of the workspace");
    ox.data = (unsigned char *)as + m.ab + 64;
    mu_expect_overlap(ei_attention_prefill(m.ctx, &ep1, &L->tq, &L->tk, &L->tv, NULL, &ox, 0), "out",
                      "workspace", "attention, part 1 of 2: output over its slice of the workspace");
    known_gap(ei_attention_prefill(m.ctx, &ep0, &L->tq, &L->tk, &L->tv, NULL, &ox, 0) == EI_ERR_OVERLAP,
              "attention in parts: part 0 of 2 accepts an output over part 1's slice of the shared workspace "
              "(and writes its rows there while part 1 works in it)");
    ox = o; ox.data = L->q + 16;
    mu_expect_overlap(ei_attention_prefill(m.ctx, &ea, &L->tq, &L->tk, &L->tv, NULL, &ox, 0), "out", "q",
                      "attention output over q");
    ox = o; ox.data = &o; /* over the struct that describes it */
    mu_expect_overlap(ei_attention_prefill(m.ctx, &ea, &L->tq, &L->tk, &L->tv, NULL, &ox, 0), "out",
                      "overlaps", "attention output over its own ei_out_tensor (and the call's other structs)");
    CHECK_ERR(ei_attention_prefill(m.ctx, &ea, &L->tq, &L->tk, &L->tv, &m.plan, &o, 0), EI_OK);
    /* profiling: workspace over q, plan arrays over k, plan struct inside its memory */
    x = L->tq; x.data = (unsigned char *)ws + 64;
    memcpy((unsigned char *)ws + 64, L->q, m.ob);
    mu_expect_overlap(ei_profile(m.ctx, &ew, &x, &L->tk, &m.plan), "q", "workspace", "profile workspace over q");
    mu_expect_overlap(ei_profile(m.ctx, &ew2, &x, &L->tk, &m.plan), "q", "workspace", "profile on 2 threads: workspace over q");
    {
        ei_plan *inside = (ei_plan *)((unsigned char *)m.pm + 128);
        void *pm2 = guarded_alloc(m.pb);
        mu_expect_overlap(ei_plan_init(m.ctx, inside, L->n, L->kv, L->dim, 0, m.pm, m.pb), "plan memory", "ei_plan",
                          "a plan struct inside its memory");
        inside = (ei_plan *)pm2;
        mu_expect_overlap(ei_plan_init(m.ctx, inside, L->n, L->kv, L->dim, 0, pm2, m.pb), "plan memory", "ei_plan",
                          "a plan struct at its memory");
        guarded_free(pm2);
    }
    /* read-only views may share memory: k = the first two heads of q */
    x = L->tk; x.data = L->q; x.token_stride = (int64_t)L->heads * L->dim;
    CHECK_ERR(ei_profile(m.ctx, &ew, &L->tq, &x, &m.plan), EI_OK);
    /* decode: the keep index inside the workspace (with a byte mask), positions over index, scores over k */
    kx = ks; kx.index = (int32_t *)((unsigned char *)dws + 256);
    kx.mask = mask;
    kx.mask_capacity = L->n;
    mu_expect_overlap(ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &kx), "keep->index", "workspace",
                      "keep index inside the decode workspace");
    kx.index = (int32_t *)((unsigned char *)dws + m.kb + 256); /* thread 1's share of a 2-thread call */
    mu_expect_overlap(ei_decode_keep(m.ctx, &ek2, &m.dec, &L->tk, &kx), "keep->index", "workspace",
                      "keep index inside the second thread's workspace");
    kx.index = index; kx.mask = (uint8_t *)index;
    mu_expect_overlap(ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &kx), "keep->index", "keep->mask",
                      "keep mask over the index");
    kx = ks; kx.positions = index + 3;
    mu_expect_overlap(ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &kx), "keep->index", "keep->positions",
                      "keep positions over the index");
    kx = ks; kx.index = (int32_t *)(void *)&kx;
    mu_expect_overlap(ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &kx), "keep->index", "overlaps",
                      "keep index over its own ei_keep_set (and the call's other structs)");
    kx = ks; kx.index = (int32_t *)(void *)m.dec.queries;
    mu_expect_overlap(ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &kx), "ring", "keep->index",
                      "keep index over the decoder's ring");
    mu_expect_overlap(ei_decode_score(m.ctx, &ek, &m.dec, &L->tk, NULL, 0, L->k), "k", "scores",
                      "decode scores over k");
    mu_expect_overlap(ei_decode_score(m.ctx, &ek, &m.dec, &L->tk, NULL, 0, (float *)dws + 64), "scores",
                      "workspace", "decode scores inside the workspace");
    mu_expect_overlap(ei_decode_score(m.ctx, &ek1, &m.dec, &L->tk, NULL, 0, (float *)((unsigned char *)dws + m.kb) + 64),
                      "scores", "workspace", "decode scores, part 1 of 2: inside its slice of the workspace");
    x = L->tq; x.data = m.dec.queries; x.n_tokens = 1;
    mu_expect_overlap(ei_decode_observe(m.ctx, &m.dec, &x, m.dec.position_end, 0), "q", "ring", "observed q inside the decoder's ring");
    CHECK_ERR(ei_decode_score(m.ctx, &ek, &m.dec, &L->tk, NULL, 0, scores), EI_OK);
    shared = (float *)guarded_alloc(sizeof(float) * (size_t)L->n);
    memset(shared, 0, sizeof(float) * (size_t)L->n);
    mu_expect_overlap(ei_decode_shared_add(m.ctx, &ek, &m.dec, scores, L->n, NULL, scores + 8), "scores", "shared",
                      "shared over the scores");
    CHECK_ERR(ei_decode_shared_add(m.ctx, &ek, &m.dec, scores, L->n, NULL, shared), EI_OK);
    kx = ks; kx.heads_out = 1; kx.index = (int32_t *)(void *)shared;
    mu_expect_overlap(ei_decode_select_shared(m.ctx, &ek, &m.dec, shared, L->n, &kx), "shared", "keep->index",
                      "shared keep index over the shared scores");
    kx = ks;
    CHECK_ERR(ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &kx), EI_OK);
    /* compaction: one cache passed as K and V; K and V interleaved in one buffer (allowed) */
    {
        float *kvbuf = (float *)guarded_alloc(2 * kv_rows * sizeof(float)), *kref = (float *)malloc(kv_rows * 4),
              *vref = (float *)malloc(kv_rows * 4);
        ei_out_tensor ko = ei_out_tensor_make(kvbuf, EI_F32, L->n, L->kv, L->dim), vo = ko, kr, vr;
        size_t t, i;
        memcpy(kref, L->k, kv_rows * 4); memcpy(vref, L->v, kv_rows * 4);
        ko.token_stride = vo.token_stride = 2 * (int64_t)L->kv * L->dim;
        vo.data = kvbuf + (size_t)L->kv * L->dim;
        for (t = 0; t < (size_t)L->n; ++t)
            for (i = 0; i < (size_t)L->kv * L->dim; ++i) {
                kvbuf[t * 2 * L->kv * L->dim + i] = L->k[t * L->kv * L->dim + i];
                kvbuf[t * 2 * L->kv * L->dim + L->kv * L->dim + i] = L->v[t * L->kv * L->dim + i];
            }
        mu_expect_overlap(ei_kv_compact(m.ctx, &kx, &ko, &ko), "k", "v", "compaction of one cache passed twice");
        vr = vo; vr.data = kvbuf + 1; /* shares elements with K */
        mu_expect_overlap(ei_kv_compact(m.ctx, &kx, &ko, &vr), "k", "v", "compaction of V one element into K");
        vr = vo; vr.data = index; vr.token_stride = (int64_t)L->kv * L->dim;
        mu_expect_overlap(ei_kv_compact(m.ctx, &kx, &ko, &vr), "keep->index", "v", "compaction of V over the keep index");
        CHECK_ERR(ei_kv_compact(m.ctx, &kx, &ko, &vo), EI_OK);
        kr = ei_out_tensor_make(kref, EI_F32, L->n, L->kv, L->dim); vr = ei_out_tensor_make(vref, EI_F32, L->n, L->kv, L->dim);
        CHECK_ERR(ei_kv_compact(m.ctx, &kx, &kr, &vr), EI_OK);
        for (t = 0; t < (size_t)kx.n_kept; ++t)
            CHECK(!memcmp(kvbuf + t * 2 * L->kv * L->dim, kref + t * L->kv * L->dim, (size_t)L->kv * L->dim * 4) &&
                      !memcmp(kvbuf + t * 2 * L->kv * L->dim + L->kv * L->dim, vref + t * L->kv * L->dim,
                              (size_t)L->kv * L->dim * 4),
                  "interleaved K/V compaction differs from separate caches at row %d", (int)t);
        CHECK(guard_intact(kvbuf, 2 * kv_rows * sizeof(float)), "kv guard");
        guarded_free(kvbuf); free(kref); free(vref);
    }
    CHECK(guard_intact(as, 2 * m.ab + m.ob) && guard_intact(ws, 2 * m.wb + m.ob) && guard_intact(dws, 2 * m.kb) &&
              guard_intact(out, m.ob) && guard_intact(scores, m.kb), "guards");
    guarded_free(as); guarded_free(ws); guarded_free(dws); guarded_free(index); guarded_free(out); guarded_free(scores);
    guarded_free(shared); guarded_free(mask);
    mu_free(&m);
}

/* View data must sit on its element size; the caller's int32/float arrays on
   4 bytes (EI_ERR_ALIGN). Element-aligned f16/bf16 data at 2 mod 4 is read
   correctly on every path (the same results as the same data at 64). */
static void mu_expect_align(ei_result r, const char *what) {
    CHECK(r == EI_ERR_ALIGN, "%s: %s (%s), expected EI_ERR_ALIGN", what, ei_result_name(r), ei_last_error());
    if (r == EI_ERR_ALIGN) CHECK_ERR_REACHED(EI_ERR_ALIGN);
}
static void test_alignment_rules(void) {
    int p;
    for (p = EI_SIMD_SCALAR; p < TEST_SIMD_END; ++p) {
        mu_setup m;
        synth_layer *L;
        size_t nq, nk, dt;
        void *as, *dws;
        float *out, *out2;
        int32_t *index;
        ei_exec ea, ek;
        if (!test_simd_selected((ei_simd)p)) continue;
        m = mu_make((ei_simd)p);
        L = &m.L;
        nq = (size_t)L->n * L->heads * L->dim; nk = (size_t)L->n * L->kv * L->dim;
        as = guarded_alloc(m.ab); dws = guarded_alloc(m.kb);
        ea = ex(1, as, m.ab); ek = ex(1, dws, m.kb);
        out = (float *)guarded_alloc(m.ob); out2 = (float *)guarded_alloc(m.ob);
        index = (int32_t *)guarded_alloc(sizeof(int32_t) * (size_t)L->kv * (size_t)m.c.decode_budget + 4);
        {   /* f32 at 1 and 2 bytes past an element; f16 at 1 byte */
            unsigned char *raw = (unsigned char *)guarded_alloc(nq * 4 + 8);
            ei_tensor x = L->tq;
            ei_out_tensor o = ei_out_tensor_make(out, EI_F32, L->n, L->heads, L->dim);
            ei_keep_set ks = mu_keep(&m, index);
            void *ws = guarded_alloc(m.wb);
            ei_exec ew = ex(1, ws, m.wb);
            memcpy(raw + 2, L->q, nq * 4);
            x.data = raw + 2;
            mu_expect_align(ei_profile(m.ctx, &ew, &x, &L->tk, &m.plan), "profile, f32 q at +2");
            mu_expect_align(ei_attention_prefill(m.ctx, &ea, &x, &L->tk, &L->tv, &m.plan, &o, 0),
                            "attention, f32 q at +2");
            mu_expect_align(ei_decode_observe(m.ctx, &m.dec, &x, m.dec.position_end, 0), "observe, f32 q at +2");
            x.data = raw + 1; x.dtype = EI_F16;
            mu_expect_align(ei_decode_observe(m.ctx, &m.dec, &x, m.dec.position_end, 0), "observe, f16 q at +1");
            x = L->tk; x.data = raw + 1;
            mu_expect_align(ei_decode_keep(m.ctx, &ek, &m.dec, &x, &ks), "decode, f32 k at +1");
            o.data = (unsigned char *)out + 2;
            mu_expect_align(ei_attention_prefill(m.ctx, &ea, &L->tq, &L->tk, &L->tv, NULL, &o, 0),
                            "attention, f32 out at +2");
            ks.index = (int32_t *)(void *)((unsigned char *)index + 2);
            mu_expect_align(ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &ks), "decode, keep index at +2");
            mu_expect_align(ei_decode_score(m.ctx, &ek, &m.dec, &L->tk, NULL, 0, (float *)(void *)(raw + 1)),
                            "decode scores at +1");
            mu_expect_align(ei_check_key_positions(m.ctx, (const int32_t *)(void *)(raw + 2), 4), "cell_pos at +2");
            guarded_free(raw); guarded_free(ws);
        }
        for (dt = EI_F16; dt <= EI_BF16; ++dt) { /* 2-byte elements at 2 mod 4: read like any others */
            void *qd = to_dtype(L->q, nq, (ei_dtype)dt), *kd = to_dtype(L->k, nk, (ei_dtype)dt),
                 *vd = to_dtype(L->v, nk, (ei_dtype)dt);
            unsigned char *raw = (unsigned char *)guarded_alloc((nq + 2 * nk) * 2 + 64);
            unsigned char *q2 = raw + 2, *k2 = q2 + nq * 2 + 4, *v2 = k2 + nk * 2 + 4;
            ei_tensor qa = ei_tensor_make(qd, (ei_dtype)dt, L->n, L->heads, L->dim);
            ei_tensor ka = ei_tensor_make(kd, (ei_dtype)dt, L->n, L->kv, L->dim);
            ei_tensor va = ei_tensor_make(vd, (ei_dtype)dt, L->n, L->kv, L->dim), qb = qa, kb2 = ka, vb = va;
            ei_out_tensor oa = ei_out_tensor_make(out, EI_F32, L->n, L->heads, L->dim), ob = oa;
            memcpy(q2, qd, nq * 2); memcpy(k2, kd, nk * 2); memcpy(v2, vd, nk * 2);
            qb.data = q2; kb2.data = k2; vb.data = v2; ob.data = out2;
            CHECK((uintptr_t)q2 % 4 == 2 && (uintptr_t)k2 % 4 == 2, "2 mod 4");
            CHECK_ERR(ei_attention_prefill(m.ctx, &ea, &qa, &ka, &va, &m.plan, &oa, 0), EI_OK);
            CHECK_ERR(ei_attention_prefill(m.ctx, &ea, &qb, &kb2, &vb, &m.plan, &ob, 0), EI_OK);
            CHECK(!memcmp(out, out2, m.ob), "%s %s: attention on data at 2 mod 4 differs from the same data at 64",
                  ei_simd_name((ei_simd)p), dtype_name((ei_dtype)dt));
            free(qd); free(kd); free(vd); guarded_free(raw);
        }
        guarded_free(as); guarded_free(dws); guarded_free(out); guarded_free(out2); guarded_free(index);
        mu_free(&m);
    }
}

/* Attention reads Q and K: NaN/Inf there is EI_ERR_NONFINITE on every path
   and dtype, dense and sparse, whole and chunked (q_offset > 0), whichever
   thread or part reads it; keys past the call's last query are not read; NaN
   in V keeps its documented behaviour (EI_OK, propagated). */
static void test_attention_nonfinite(void) {
    int p;
    for (p = EI_SIMD_SCALAR; p < TEST_SIMD_END; ++p) {
        mu_setup m;
        synth_layer *L;
        size_t nq, nk, dt;
        void *as;
        float *out;
        ei_exec ea, ea3;
        if (!test_simd_selected((ei_simd)p)) continue;
        m = mu_make((ei_simd)p);
        L = &m.L;
        nq = (size_t)L->n * L->heads * L->dim; nk = (size_t)L->n * L->kv * L->dim;
        as = guarded_alloc(3 * m.ab);
        ea = ex(1, as, m.ab); ea3 = ex(3, as, 3 * m.ab);
        out = (float *)guarded_alloc(m.ob);
        for (dt = EI_F32; dt <= EI_BF16; ++dt) {
            static const float bad[] = {NAN, INFINITY, -INFINITY};
            int bi, which, sparse;
            for (bi = 0; bi < 3; ++bi)
                for (which = 0; which < 3; ++which) /* q, k, v */
                    for (sparse = 0; sparse < 2; ++sparse) {
                        float *arr = which == 0 ? L->q : which == 1 ? L->k : L->v;
                        size_t at = which == 0 ? (size_t)150 * L->heads * L->dim + 2 * L->dim + 5
                                               : (size_t)20 * L->kv * L->dim + L->dim + 3; /* a block a sparse row may drop */
                        float saved = arr[at];
                        void *qd, *kd, *vd;
                        ei_tensor q, k, v, qc;
                        ei_out_tensor o = ei_out_tensor_make(out, EI_F32, L->n, L->heads, L->dim), oc;
                        ei_result r, r3[3];
                        int t;
                        arr[at] = bad[bi];
                        qd = to_dtype(L->q, nq, (ei_dtype)dt); kd = to_dtype(L->k, nk, (ei_dtype)dt);
                        vd = to_dtype(L->v, nk, (ei_dtype)dt);
                        q = ei_tensor_make(qd, (ei_dtype)dt, L->n, L->heads, L->dim);
                        k = ei_tensor_make(kd, (ei_dtype)dt, L->n, L->kv, L->dim);
                        v = ei_tensor_make(vd, (ei_dtype)dt, L->n, L->kv, L->dim);
                        r = ei_attention_prefill(m.ctx, &ea, &q, &k, &v, sparse ? &m.plan : NULL, &o, 0);
                        CHECK(r == (which == 2 ? EI_OK : EI_ERR_NONFINITE), "%s %s %s %s: %s",
                              ei_simd_name((ei_simd)p), dtype_name((ei_dtype)dt), which == 0 ? "q" : which == 1 ? "k" : "v",
                              sparse ? "sparse" : "dense", ei_result_name(r));
                        /* three parts of one workspace: one of them meets it */
                        for (t = 0; t < 3; ++t) {
                            ei_exec ep = ex_part(t, 3, as, 3 * m.ab);
                            r3[t] = ei_attention_prefill(m.ctx, &ep, &q, &k, &v, sparse ? &m.plan : NULL, &o, 0);
                        }
                        CHECK((which == 2) == (r3[0] == EI_OK && r3[1] == EI_OK && r3[2] == EI_OK),
                              "ith/nth 3: %s %s %s", ei_result_name(r3[0]), ei_result_name(r3[1]), ei_result_name(r3[2]));
                        r = ei_attention_prefill(m.ctx, &ea3, &q, &k, &v, sparse ? &m.plan : NULL, &o, 0);
                        CHECK(r == (which == 2 ? EI_OK : EI_ERR_NONFINITE), "3 threads: %s", ei_result_name(r));
                        /* a chunk after the bad row (q_offset 160) still reads k's row, not q's */
                        qc = q; qc.data = (const unsigned char *)qd + (size_t)160 * L->heads * L->dim * dtype_size((ei_dtype)dt);
                        qc.n_tokens = 40;
                        oc = o; oc.n_tokens = 40;
                        r = ei_attention_prefill(m.ctx, &ea, &qc, &k, &v, sparse ? &m.plan : NULL, &oc, 160);
                        CHECK(r == (which == 1 ? EI_ERR_NONFINITE : EI_OK), "chunk at 160: %s", ei_result_name(r));
                        /* keys past the call's last query are not read: a first chunk of 16 tokens */
                        qc = q; qc.n_tokens = 16; oc = o; oc.n_tokens = 16;
                        r = ei_attention_prefill(m.ctx, &ea, &qc, &k, &v, NULL, &oc, 0);
                        CHECK_ERR(r, EI_OK);
                        arr[at] = saved;
                        free(qd); free(kd); free(vd);
                    }
        }
        CHECK(guard_intact(as, 3 * m.ab) && guard_intact(out, m.ob), "guards");
        guarded_free(as); guarded_free(out);
        mu_free(&m);
    }
}

/* Every layout field of a plan, and every field of a decoder, edited after
   init: refused (EI_ERR_STATE; a NULL array pointer: EI_ERR_NULL) by every
   call that takes it, before anything is read or written. */
static void test_edited_plan_decoder(void) {
    mu_setup m = mu_make(EI_SIMD_AUTO);
    synth_layer *L = &m.L;
    void *ws = guarded_alloc(m.wb), *as = guarded_alloc(m.ab), *dws = guarded_alloc(m.kb);
    float *out = (float *)guarded_alloc(m.ob);
    int32_t *index = (int32_t *)guarded_alloc(sizeof(int32_t) * (size_t)L->kv * (size_t)m.c.decode_budget);
    ei_out_tensor o = ei_out_tensor_make(out, EI_F32, L->n, L->heads, L->dim);
    ei_keep_set ks = mu_keep(&m, index);
    ei_exec ew = ex(1, ws, m.wb), ea = ex(1, as, m.ab), ek = ex(1, dws, m.kb);
    int f;
    for (f = 0; f < 19; ++f) {
        ei_plan e = m.plan;
        ei_result r1, r2, r3, r4;
        switch (f) {
            case 0: e.max_tokens *= 64; break;
            case 1: e.n_kv_heads = 3; break;
            case 2: e.head_dim = 64; break;
            case 3: e.max_keep += 100; break;
            case 4: e.seg_capacity += 7; break;
            case 5: e.blk_capacity += 50; break;
            case 6: e.flags = EI_PLAN_SCORES; break;
            case 7: e.segment_size = 32; break;
            case 8: e.block_size = 4; break;
            case 9: e.block_index = e.block_index + 1000; break;
            case 10: e.keep_count = e.keep_count - 100; break;
            case 11: e.scores = (float *)(void *)e.keep_count; break;
            case 12: e.n_tokens = e.max_tokens + 100; break;
            case 13: e.n_segments = e.seg_capacity + 1; break;
            case 14: e.n_blocks = e.blk_capacity + 8; break;
            case 15: e.final = 7; break;
            case 16: e.n_tokens = -1; break;
            case 17: e.on_device = 1; break;
            default: e.state = out; break;
        }
        r1 = ei_attention_prefill(m.ctx, &ea, &L->tq, &L->tk, &L->tv, &e, &o, 0);
        r2 = ei_profile(m.ctx, &ew, &L->tq, &L->tk, &e);
        r3 = ei_plan_reset(&e);
        r4 = ei_plan_finalize(m.ctx, &e);
        CHECK(r1 == EI_ERR_STATE && r2 == EI_ERR_STATE && r3 == EI_ERR_STATE && r4 == EI_ERR_STATE,
              "plan field edit %d: attention %s, profile %s, reset %s, finalize %s", f, ei_result_name(r1),
              ei_result_name(r2), ei_result_name(r3), ei_result_name(r4));
    }
    for (f = 0; f < 8; ++f) {
        ei_decoder e = m.dec;
        ei_result r1, r2;
        switch (f) {
            case 0: e.n_heads = 8; break;
            case 1: e.n_kv_heads = 1; break;
            case 2: e.head_dim = 32; break;
            case 3: e.window = 64; break;
            case 4: e.queries = out; break;
            case 5: e.n_observed = -3; break;
            case 6: e.n_generated = e.n_observed + 5; break;
            default: e.last_compress = e.n_generated + 9; break;
        }
        r1 = ei_decode_observe(m.ctx, &e, &L->tq, e.position_end, 0);
        r2 = ei_decode_keep(m.ctx, &ek, &e, &L->tk, &ks);
        CHECK((r1 == EI_ERR_STATE || (f == 3 && r1 == EI_ERR_SHAPE)) && (r2 == EI_ERR_STATE || (f == 3 && r2 == EI_ERR_SHAPE)),
              "decoder field edit %d: observe %s, keep %s", f, ei_result_name(r1), ei_result_name(r2));
    }
    CHECK_ERR(ei_attention_prefill(m.ctx, &ea, &L->tq, &L->tk, &L->tv, &m.plan, &o, 0), EI_OK);
    CHECK(guard_intact(ws, m.wb) && guard_intact(as, m.ab) && guard_intact(dws, m.kb) && guard_intact(out, m.ob), "guards");
    guarded_free(ws); guarded_free(as); guarded_free(dws); guarded_free(out); guarded_free(index);
    mu_free(&m);
}

/* ------------------------------------------------------------ placements (issue 36) */
/* MEMORY RULES, call by call: the header's table of each entry's memory
   arguments (MEMORY ARGUMENTS), as regions. For every entry and every pair
   of its regions of which one is written, one is placed inside the other
   (at the start, the middle, the end, straddling the end) and the call must
   refuse it (EI_ERR_OVERLAP) with nothing written; placed just past the
   other it must give the reference's result, bit for bit. Structs are moved
   as copies (a sealed plan or decoder is valid anywhere but inside its own
   arrays); the plan's arrays and the decoder's ring stay where init laid
   them out (hosts only). Then every plan and decoder argument is replaced by
   random bytes, zeros, an edited layout and out-of-range counters: refused,
   nothing written. An entry runs as its ei_exec says: one thread, two
   threads, or one part of two (the workspace the size for 2, shared; the
   part's slice is what it uses, the other's bytes are not its own); a decode
   step in parts is placed as the engine makes it, both parts then both
   merges (ei_attention_decode_merge reads the partials where the parts put
   them, which depends on the workspace's alignment: it is not placed alone). */
enum { R_Q, R_QD, R_K, R_KD, R_V, R_VD, R_OUT, R_OUTD, R_PLAN, R_PLANA, R_PMEM, R_DEC, R_RING, R_DMEM, R_KEEP, R_INDEX,
       R_POS, R_MASK, R_POOLED, R_ROWPOS, R_WS, R_SCORES, R_SHARED, R_COUNT };
static const char *const pl_name[R_COUNT] = {
    "q struct", "q data", "k struct", "k data", "v struct", "v data", "out struct", "out data", "plan struct",
    "plan arrays", "plan memory", "decoder struct", "decoder ring", "decoder memory", "keep struct", "keep->index",
    "keep->positions", "keep->mask", "keep->pooled", "row_pos", "workspace", "scores", "shared"};
#define PL_BIT(r) (1u << (r))
#define PL_FIXED (PL_BIT(R_PLANA) | PL_BIT(R_RING)) /* laid out by init: never moved */
#define PL_STRUCTS (PL_BIT(R_Q) | PL_BIT(R_K) | PL_BIT(R_V) | PL_BIT(R_OUT) | PL_BIT(R_PLAN) | PL_BIT(R_DEC) | PL_BIT(R_KEEP))

typedef struct pl_fix {
    synth_layer L;
    ei_config c;
    ei_context *ctx;
    ei_plan plan;
    ei_decoder dec;                /* after the prompt */
    unsigned char *pm, *pm_snap, *dm, *dm_snap;
    size_t pb, db;
    ei_sizes s1, s2;               /* ei_layer_sizes for 1 and for 2 threads or parts */
    ei_tensor tq, tq1, tqc, tk, tv;
    ei_out_tensor to, to1, tko, tvo;
    ei_keep_set keep_empty, keep_shared, keep_filled;
    ei_mask mbase, mout;           /* ei_plan_mask: a base of the prompt's rows and keys, f32; out f16, 2 heads */
    float *mask_base;
    int32_t *rowpos, *filled_index;
    float *scores, *shared, *zeros;
    /* the call under test: where each region is, its size, what it holds before the call */
    void *p[R_COUNT], *home[R_COUNT];
    size_t bytes[R_COUNT];
    const void *master[R_COUNT];
    const ei_plan *plan_master;
    const ei_decoder *dec_master;
} pl_fix;

typedef struct pl_call {
    const char *name;              /* the entry, then how it runs */
    ei_result (*run)(pl_fix *x);
    void (*setup)(pl_fix *x);
    uint32_t regs, written, result; /* its regions, those it writes, those compared with the reference */
} pl_call;

#define PX(T, r) ((T *)x->p[r])
static void pl_view(pl_fix *x, int rs, int rd, const ei_tensor *t) {
    x->bytes[rs] = sizeof *t; x->master[rs] = t;
    x->bytes[rd] = ei__view_bytes(t); x->master[rd] = t->data;
}
static void pl_out(pl_fix *x, int rs, int rd, const ei_out_tensor *t, int keep_data) {
    ei_tensor v = ei__as_view(t);
    x->bytes[rs] = sizeof *t; x->master[rs] = t;
    x->bytes[rd] = ei__view_bytes(&v); x->master[rd] = keep_data ? t->data : NULL;
}
static void pl_keep(pl_fix *x, const ei_keep_set *m) {
    size_t h = (size_t)m->heads_out;
    x->bytes[R_KEEP] = sizeof *m; x->master[R_KEEP] = m;
    x->bytes[R_INDEX] = h * (size_t)m->capacity * 4u; x->master[R_INDEX] = m->index;
    x->bytes[R_POS] = h * (size_t)m->capacity * 4u; x->master[R_POS] = m->positions;
    x->bytes[R_MASK] = h * (size_t)m->mask_capacity; x->master[R_MASK] = m->mask;
    x->bytes[R_POOLED] = h * (size_t)m->pooled_capacity * 4u; x->master[R_POOLED] = m->pooled;
    x->bytes[R_ROWPOS] = (size_t)x->L.n * 4u; x->master[R_ROWPOS] = m->row_pos;
}
static void pl_mask(pl_fix *x, int rs, int rd, const ei_mask *m, int keep_data) {
    ei_tensor v = ei__mask_view(m);
    x->bytes[rs] = sizeof *m; x->master[rs] = m;
    x->bytes[rd] = ei__view_bytes(&v); x->master[rd] = keep_data ? m->data : NULL;
}
static void pl_plan(pl_fix *x) { x->bytes[R_PLAN] = sizeof(ei_plan); x->master[R_PLAN] = x->plan_master; }
static void pl_dec(pl_fix *x) { x->bytes[R_DEC] = sizeof(ei_decoder); x->master[R_DEC] = x->dec_master; }

/* the setups: each call's regions, sizes and contents */
static void su_profile(pl_fix *x) { pl_view(x, R_Q, R_QD, &x->tq); pl_view(x, R_K, R_KD, &x->tk); pl_plan(x); x->bytes[R_WS] = x->s1.profile; }
static void su_profile2(pl_fix *x) { su_profile(x); x->bytes[R_WS] = x->s2.profile; }
static void su_chunk(pl_fix *x) { su_profile(x); pl_view(x, R_Q, R_QD, &x->tqc); }
static void su_chunk2(pl_fix *x) { su_chunk(x); x->bytes[R_WS] = x->s2.profile; }
static void su_plan(pl_fix *x) { pl_plan(x); }
static void su_prefill(pl_fix *x) {
    pl_view(x, R_Q, R_QD, &x->tq); pl_view(x, R_K, R_KD, &x->tk); pl_view(x, R_V, R_VD, &x->tv);
    pl_out(x, R_OUT, R_OUTD, &x->to, 0); pl_plan(x); x->bytes[R_WS] = x->s1.prefill;
}
static void su_prefill2(pl_fix *x) { su_prefill(x); x->bytes[R_WS] = x->s2.prefill; }
static void su_step(pl_fix *x) {
    pl_view(x, R_Q, R_QD, &x->tq1); pl_view(x, R_K, R_KD, &x->tk); pl_view(x, R_V, R_VD, &x->tv);
    pl_out(x, R_OUT, R_OUTD, &x->to1, 0); pl_keep(x, &x->keep_filled);
    x->bytes[R_WS] = x->s1.decode;
}
static void su_step2(pl_fix *x) { su_step(x); x->bytes[R_WS] = x->s2.decode; }
static void su_observe(pl_fix *x) { pl_view(x, R_Q, R_QD, &x->tq1); pl_dec(x); }
/* a keep set's outputs: their contents are not read */
static void pl_keep_out(pl_fix *x, const ei_keep_set *m) {
    pl_keep(x, m);
    x->master[R_INDEX] = x->master[R_POS] = x->master[R_MASK] = x->master[R_POOLED] = NULL;
}
static void su_keep(pl_fix *x) { pl_view(x, R_K, R_KD, &x->tk); pl_dec(x); pl_keep_out(x, &x->keep_empty); x->bytes[R_WS] = x->s1.decode_keep; }
static void su_keep2(pl_fix *x) { su_keep(x); x->bytes[R_WS] = x->s2.decode_keep; }
static void su_score(pl_fix *x) {
    pl_view(x, R_K, R_KD, &x->tk); pl_dec(x); x->bytes[R_WS] = x->s1.decode_keep;
    x->bytes[R_ROWPOS] = (size_t)x->L.n * 4u; x->master[R_ROWPOS] = x->rowpos;
    x->bytes[R_SCORES] = (size_t)x->L.heads * (size_t)x->L.n * 4u;
}
static void su_score2(pl_fix *x) { su_score(x); x->bytes[R_WS] = x->s2.decode_keep; }
static void su_select(pl_fix *x) { su_score(x); x->master[R_SCORES] = x->scores; pl_keep_out(x, &x->keep_empty); }
static void su_shared_add(pl_fix *x) { su_select(x); x->bytes[R_SHARED] = (size_t)x->L.n * 4u; x->master[R_SHARED] = x->zeros; }
static void su_select_shared(pl_fix *x) {
    pl_dec(x); x->bytes[R_WS] = x->s1.decode_keep; pl_keep_out(x, &x->keep_shared);
    x->bytes[R_SHARED] = (size_t)x->L.n * 4u; x->master[R_SHARED] = x->shared;
}
static void su_compact(pl_fix *x) { pl_keep(x, &x->keep_filled); pl_out(x, R_K, R_KD, &x->tko, 1); pl_out(x, R_V, R_VD, &x->tvo, 1); }
/* ei_plan_mask: the base in q's regions, the mask in out's (.data leads ei_mask too) */
static void su_mask(pl_fix *x) { pl_mask(x, R_Q, R_QD, &x->mbase, 1); pl_mask(x, R_OUT, R_OUTD, &x->mout, 0); pl_plan(x); }
static void su_plan_init(pl_fix *x) { x->bytes[R_PLAN] = sizeof(ei_plan); x->bytes[R_PMEM] = x->pb; }
static void su_decoder_init(pl_fix *x) { x->bytes[R_DEC] = sizeof(ei_decoder); x->bytes[R_DMEM] = x->db; }

/* the calls, on the regions where they are now */
#define PL_Q PX(const ei_tensor, R_Q)
#define PL_K PX(const ei_tensor, R_K)
#define PL_V PX(const ei_tensor, R_V)
#define PL_KEEP PX(ei_keep_set, R_KEEP)
/* the ei_exec of an entry: one thread, two threads, or part ith of two, over the workspace where it is now */
static ei_exec pl_ex(const pl_fix *x, int32_t n_threads) { return ex(n_threads, x->p[R_WS], x->bytes[R_WS]); }
static ei_exec pl_part(const pl_fix *x, int32_t ith) { return ex_part(ith, 2, x->p[R_WS], x->bytes[R_WS]); }
static ei_result ru_profile(pl_fix *x) { ei_exec e = pl_ex(x, 1); return ei_profile(x->ctx, &e, PL_Q, PL_K, PX(ei_plan, R_PLAN)); }
static ei_result ru_profile_part0(pl_fix *x) { ei_exec e = pl_part(x, 0); return ei_profile(x->ctx, &e, PL_Q, PL_K, PX(ei_plan, R_PLAN)); }
static ei_result ru_profile_mt(pl_fix *x) { ei_exec e = pl_ex(x, 2); return ei_profile(x->ctx, &e, PL_Q, PL_K, PX(ei_plan, R_PLAN)); }
static ei_result ru_chunk(pl_fix *x) {
    ei_exec e = pl_ex(x, 1);
    return ei_profile_chunk(x->ctx, &e, PL_Q, PL_K, PX(ei_plan, R_PLAN), 0, 0);
}
static ei_result ru_chunk_part1(pl_fix *x) {
    ei_exec e = pl_part(x, 1);
    return ei_profile_chunk(x->ctx, &e, PL_Q, PL_K, PX(ei_plan, R_PLAN), 0, 0);
}
static ei_result ru_chunk_mt(pl_fix *x) {
    ei_exec e = pl_ex(x, 2);
    return ei_profile_chunk(x->ctx, &e, PL_Q, PL_K, PX(ei_plan, R_PLAN), 0, 0);
}
static ei_result ru_plan_reset(pl_fix *x) { return ei_plan_reset(PX(ei_plan, R_PLAN)); }
static ei_result ru_plan_finalize(pl_fix *x) { return ei_plan_finalize(x->ctx, PX(ei_plan, R_PLAN)); }
static ei_result ru_prefill(pl_fix *x) {
    ei_exec e = pl_ex(x, 1);
    return ei_attention_prefill(x->ctx, &e, PL_Q, PL_K, PL_V, PX(const ei_plan, R_PLAN), PX(ei_out_tensor, R_OUT), 0);
}
static ei_result ru_prefill_mt(pl_fix *x) {
    ei_exec e = pl_ex(x, 2);
    return ei_attention_prefill(x->ctx, &e, PL_Q, PL_K, PL_V, PX(const ei_plan, R_PLAN), PX(ei_out_tensor, R_OUT), 0);
}
static ei_result ru_prefill_part1(pl_fix *x) {
    ei_exec e = pl_part(x, 1);
    return ei_attention_prefill(x->ctx, &e, PL_Q, PL_K, PL_V, PX(const ei_plan, R_PLAN), PX(ei_out_tensor, R_OUT), 0);
}
static ei_result ru_step_keep(pl_fix *x) {
    ei_exec e = pl_ex(x, 1);
    return ei_attention_decode(x->ctx, &e, PL_Q, PL_K, PL_V, PL_KEEP, PX(ei_out_tensor, R_OUT), x->L.n - 1);
}
static ei_result ru_step_keep_mt(pl_fix *x) {
    ei_exec e = pl_ex(x, 2);
    return ei_attention_decode(x->ctx, &e, PL_Q, PL_K, PL_V, PL_KEEP, PX(ei_out_tensor, R_OUT), x->L.n - 1);
}
/* an engine's step in parts: both parts, its barrier, both merges (the first refusal is the step's) */
static ei_result ru_step_parts(pl_fix *x) {
    ei_exec e0 = pl_part(x, 0), e1 = pl_part(x, 1);
    ei_result r = ei_attention_decode(x->ctx, &e0, PL_Q, PL_K, PL_V, PL_KEEP, PX(ei_out_tensor, R_OUT), x->L.n - 1);
    if (r == EI_OK) r = ei_attention_decode(x->ctx, &e1, PL_Q, PL_K, PL_V, PL_KEEP, PX(ei_out_tensor, R_OUT), x->L.n - 1);
    if (r == EI_OK) r = ei_attention_decode_merge(x->ctx, &e0, PX(ei_out_tensor, R_OUT));
    if (r == EI_OK) r = ei_attention_decode_merge(x->ctx, &e1, PX(ei_out_tensor, R_OUT));
    return r;
}
static ei_result ru_observe(pl_fix *x) { return ei_decode_observe(x->ctx, PX(ei_decoder, R_DEC), PL_Q, PX(ei_decoder, R_DEC)->position_end, 1); }
static ei_result ru_decoder_reset(pl_fix *x) { return ei_decoder_reset(PX(ei_decoder, R_DEC)); }
static ei_result ru_keep(pl_fix *x) { ei_exec e = pl_ex(x, 1); return ei_decode_keep(x->ctx, &e, PX(ei_decoder, R_DEC), PL_K, PL_KEEP); }
static ei_result ru_keep_mt(pl_fix *x) { ei_exec e = pl_ex(x, 2); return ei_decode_keep(x->ctx, &e, PX(ei_decoder, R_DEC), PL_K, PL_KEEP); }
static ei_result ru_score(pl_fix *x) {
    ei_exec e = pl_ex(x, 1);
    return ei_decode_score(x->ctx, &e, PX(const ei_decoder, R_DEC), PL_K, PX(const int32_t, R_ROWPOS), 0, PX(float, R_SCORES));
}
static ei_result ru_score_part1(pl_fix *x) {
    ei_exec e = pl_part(x, 1);
    return ei_decode_score(x->ctx, &e, PX(const ei_decoder, R_DEC), PL_K, PX(const int32_t, R_ROWPOS), 0, PX(float, R_SCORES));
}
static ei_result ru_select(pl_fix *x) {
    ei_exec e = pl_ex(x, 1);
    return ei_decode_select(x->ctx, &e, PX(ei_decoder, R_DEC), PX(const float, R_SCORES), x->L.n, PL_KEEP);
}
static ei_result ru_shared_add(pl_fix *x) {
    ei_exec e = pl_ex(x, 1);
    return ei_decode_shared_add(x->ctx, &e, PX(ei_decoder, R_DEC), PX(const float, R_SCORES), x->L.n,
                                PX(const int32_t, R_ROWPOS), PX(float, R_SHARED));
}
static ei_result ru_select_shared(pl_fix *x) {
    ei_exec e = pl_ex(x, 1);
    return ei_decode_select_shared(x->ctx, &e, PX(const ei_decoder, R_DEC), PX(const float, R_SHARED), x->L.n, PL_KEEP);
}
static ei_result ru_compact(pl_fix *x) {
    return ei_kv_compact(x->ctx, PL_KEEP, PX(ei_out_tensor, R_K), PX(ei_out_tensor, R_V));
}
static ei_result ru_mask(pl_fix *x) {
    return ei_plan_mask(x->ctx, PX(const ei_plan, R_PLAN), 0, PX(const ei_mask, R_Q), PX(ei_mask, R_OUT));
}
static ei_result ru_plan_init(pl_fix *x) {
    return ei_plan_init(x->ctx, PX(ei_plan, R_PLAN), x->L.n, x->L.kv, x->L.dim, EI_PLAN_CHUNKED, x->p[R_PMEM], x->bytes[R_PMEM]);
}
static ei_result ru_decoder_init(pl_fix *x) {
    return ei_decoder_init(x->ctx, PX(ei_decoder, R_DEC), x->L.heads, x->L.kv, x->L.dim, x->p[R_DMEM], x->bytes[R_DMEM]);
}

#define B2(a, b) (PL_BIT(a) | PL_BIT(b))
#define PL_PROFILE (B2(R_Q, R_QD) | B2(R_K, R_KD) | B2(R_PLAN, R_PLANA) | PL_BIT(R_WS))
#define PL_PREFILL (B2(R_Q, R_QD) | B2(R_K, R_KD) | B2(R_V, R_VD) | B2(R_OUT, R_OUTD) | B2(R_PLAN, R_PLANA) | PL_BIT(R_WS))
#define PL_STEP (B2(R_Q, R_QD) | B2(R_K, R_KD) | B2(R_V, R_VD) | B2(R_OUT, R_OUTD) | B2(R_KEEP, R_INDEX) | PL_BIT(R_WS))
#define PL_KEEPSET (B2(R_KEEP, R_INDEX) | B2(R_POS, R_MASK) | B2(R_POOLED, R_ROWPOS))
#define PL_KEEPOUT (B2(R_KEEP, R_INDEX) | B2(R_POS, R_MASK) | PL_BIT(R_POOLED))
static const pl_call pl_calls[] = {
    {"ei_profile (1 thread)", ru_profile, su_profile, PL_PROFILE, B2(R_PLAN, R_PLANA) | PL_BIT(R_WS), B2(R_PLAN, R_PLANA)},
    {"ei_profile (part 0 of 2)", ru_profile_part0, su_profile2, PL_PROFILE, B2(R_PLAN, R_PLANA) | PL_BIT(R_WS), B2(R_PLAN, R_PLANA)},
    {"ei_profile (2 threads)", ru_profile_mt, su_profile2, PL_PROFILE, B2(R_PLAN, R_PLANA) | PL_BIT(R_WS), B2(R_PLAN, R_PLANA)},
    {"ei_profile_chunk (1 thread)", ru_chunk, su_chunk, PL_PROFILE, B2(R_PLAN, R_PLANA) | PL_BIT(R_WS), B2(R_PLAN, R_PLANA)},
    {"ei_profile_chunk (part 1 of 2)", ru_chunk_part1, su_chunk2, PL_PROFILE, B2(R_PLAN, R_PLANA) | PL_BIT(R_WS), B2(R_PLAN, R_PLANA)},
    {"ei_profile_chunk (2 threads)", ru_chunk_mt, su_chunk2, PL_PROFILE, B2(R_PLAN, R_PLANA) | PL_BIT(R_WS), B2(R_PLAN, R_PLANA)},
    {"ei_plan_reset", ru_plan_reset, su_plan, B2(R_PLAN, R_PLANA), B2(R_PLAN, R_PLANA), B2(R_PLAN, R_PLANA)},
    {"ei_plan_finalize", ru_plan_finalize, su_plan, B2(R_PLAN, R_PLANA), PL_BIT(R_PLANA), B2(R_PLAN, R_PLANA)},
    {"ei_plan_init", ru_plan_init, su_plan_init, B2(R_PLAN, R_PMEM), B2(R_PLAN, R_PMEM), 0},
    {"ei_attention_prefill (1 thread)", ru_prefill, su_prefill, PL_PREFILL, B2(R_OUTD, R_WS), PL_BIT(R_OUTD)},
    {"ei_attention_prefill (2 threads)", ru_prefill_mt, su_prefill2, PL_PREFILL, B2(R_OUTD, R_WS), PL_BIT(R_OUTD)},
    {"ei_attention_prefill (part 1 of 2)", ru_prefill_part1, su_prefill2, PL_PREFILL, B2(R_OUTD, R_WS), PL_BIT(R_OUTD)},
    {"ei_attention_decode (keep, 1 thread)", ru_step_keep, su_step, PL_STEP, B2(R_OUTD, R_WS), PL_BIT(R_OUTD)},
    {"ei_attention_decode (keep, 2 threads)", ru_step_keep_mt, su_step2, PL_STEP, B2(R_OUTD, R_WS), PL_BIT(R_OUTD)},
    {"ei_attention_decode,ei_attention_decode_merge (keep, parts 0 and 1 of 2, then their merges)", ru_step_parts, su_step2,
     PL_STEP, B2(R_OUTD, R_WS), PL_BIT(R_OUTD)},
    {"ei_decoder_init", ru_decoder_init, su_decoder_init, B2(R_DEC, R_DMEM), B2(R_DEC, R_DMEM), 0},
    {"ei_decoder_reset", ru_decoder_reset, su_observe, B2(R_DEC, R_RING), PL_BIT(R_DEC), PL_BIT(R_DEC)},
    {"ei_decode_observe", ru_observe, su_observe, B2(R_Q, R_QD) | B2(R_DEC, R_RING), B2(R_DEC, R_RING), B2(R_DEC, R_RING)},
    {"ei_decode_keep (1 thread)", ru_keep, su_keep, B2(R_K, R_KD) | B2(R_DEC, R_RING) | PL_KEEPSET | PL_BIT(R_WS),
     PL_BIT(R_DEC) | PL_KEEPOUT | PL_BIT(R_WS), PL_BIT(R_DEC) | PL_KEEPOUT},
    {"ei_decode_keep (2 threads)", ru_keep_mt, su_keep2, B2(R_K, R_KD) | B2(R_DEC, R_RING) | PL_KEEPSET | PL_BIT(R_WS),
     PL_BIT(R_DEC) | PL_KEEPOUT | PL_BIT(R_WS), PL_BIT(R_DEC) | PL_KEEPOUT},
    {"ei_decode_score (1 thread)", ru_score, su_score, B2(R_K, R_KD) | B2(R_DEC, R_RING) | B2(R_ROWPOS, R_SCORES) | PL_BIT(R_WS),
     B2(R_SCORES, R_WS), PL_BIT(R_SCORES)},
    {"ei_decode_score (part 1 of 2)", ru_score_part1, su_score2,
     B2(R_K, R_KD) | B2(R_DEC, R_RING) | B2(R_ROWPOS, R_SCORES) | PL_BIT(R_WS), B2(R_SCORES, R_WS), PL_BIT(R_SCORES)},
    {"ei_decode_select", ru_select, su_select, PL_BIT(R_DEC) | PL_BIT(R_SCORES) | PL_KEEPSET | PL_BIT(R_WS),
     PL_BIT(R_DEC) | PL_KEEPOUT | PL_BIT(R_WS), PL_BIT(R_DEC) | PL_KEEPOUT},
    {"ei_decode_shared_add", ru_shared_add, su_shared_add, PL_BIT(R_DEC) | B2(R_SCORES, R_ROWPOS) | B2(R_SHARED, R_WS),
     PL_BIT(R_DEC) | B2(R_SHARED, R_WS), B2(R_DEC, R_SHARED)},
    {"ei_decode_select_shared", ru_select_shared, su_select_shared, PL_BIT(R_DEC) | PL_BIT(R_SHARED) | PL_KEEPSET | PL_BIT(R_WS),
     PL_KEEPOUT | PL_BIT(R_WS), PL_KEEPOUT},
    {"ei_kv_compact", ru_compact, su_compact, B2(R_KEEP, R_INDEX) | B2(R_K, R_KD) | B2(R_V, R_VD), B2(R_KD, R_VD), B2(R_KD, R_VD)},
    {"ei_plan_mask", ru_mask, su_mask, B2(R_Q, R_QD) | B2(R_OUT, R_OUTD) | B2(R_PLAN, R_PLANA), PL_BIT(R_OUTD), PL_BIT(R_OUTD)},
};

/* Every region of the call back home, holding what it holds before the call. */
static void pl_reset(pl_fix *x, const pl_call *c) {
    int r;
    for (r = 0; r < R_COUNT; ++r) {
        if (!(c->regs & PL_BIT(r)) || (PL_FIXED & PL_BIT(r))) continue;
        x->p[r] = x->home[r];
        if (x->master[r]) memcpy(x->p[r], x->master[r], x->bytes[r]);
        else memset(x->p[r], 0, x->bytes[r]);
    }
    memcpy(x->pm, x->pm_snap, x->pb);
    memcpy(x->dm, x->dm_snap, x->db);
}
/* The structs point at their data wherever both are now. */
static void pl_fixup(pl_fix *x, const pl_call *c) {
    static const int views[4][2] = {{R_Q, R_QD}, {R_K, R_KD}, {R_V, R_VD}, {R_OUT, R_OUTD}};
    int i;
    for (i = 0; i < 4; ++i) /* .data leads both ei_tensor and ei_out_tensor */
        if (c->regs & PL_BIT(views[i][0])) memcpy(x->p[views[i][0]], &x->p[views[i][1]], sizeof(void *));
    if (c->regs & PL_BIT(R_KEEP)) {
        ei_keep_set ks;
        memcpy(&ks, x->p[R_KEEP], sizeof ks);
        ks.index = (int32_t *)x->p[R_INDEX];
        ks.positions = c->regs & PL_BIT(R_POS) ? (int32_t *)x->p[R_POS] : NULL;
        ks.mask = c->regs & PL_BIT(R_MASK) ? (uint8_t *)x->p[R_MASK] : NULL;
        ks.pooled = c->regs & PL_BIT(R_POOLED) ? (float *)x->p[R_POOLED] : NULL;
        ks.row_pos = c->regs & PL_BIT(R_ROWPOS) ? (const int32_t *)x->p[R_ROWPOS] : NULL;
        memcpy(x->p[R_KEEP], &ks, sizeof ks);
    }
}
/* Copies of the call's regions (what it may not change when it refuses, or
   what it must give as the reference did). */
static void pl_snap(const pl_fix *x, const pl_call *c, unsigned char **snap) {
    int r;
    for (r = 0; r < R_COUNT; ++r) {
        snap[r] = NULL;
        if (!(c->regs & PL_BIT(r))) continue;
        snap[r] = (unsigned char *)malloc(x->bytes[r]);
        memcpy(snap[r], x->p[r], x->bytes[r]);
    }
}
static void pl_snap_free(unsigned char **snap) {
    int r;
    for (r = 0; r < R_COUNT; ++r) free(snap[r]);
}
/* The regions of mask whose bytes differ from snap: -1 if none. A keep
   struct is compared by its counts (its pointers follow the placement). */
static int pl_changed(const pl_fix *x, uint32_t mask, unsigned char *const *snap) {
    int r;
    for (r = 0; r < R_COUNT; ++r) {
        if (!(mask & PL_BIT(r)) || !snap[r]) continue;
        if (r == R_KEEP) {
            ei_keep_set a, b;
            memcpy(&a, snap[r], sizeof a); memcpy(&b, x->p[r], sizeof b);
            if (a.n_kept != b.n_kept || a.compressed != b.compressed || a.n_tokens != b.n_tokens) return r;
        } else if (memcmp(snap[r], x->p[r], x->bytes[r]))
            return r;
    }
    return -1;
}

static size_t pl_down8(size_t v) { return v & ~(size_t)7; }
/* Region a placed at byte off of region b (b moved to an arena of its own
   unless init laid it out); 0 if it does not fit a fixed host. */
static int pl_place(pl_fix *x, int a, int b, size_t off, void **arena) {
    unsigned char *host;
    *arena = NULL;
    if (PL_FIXED & PL_BIT(b)) {
        if (off + x->bytes[a] > x->bytes[b]) return 0;
        host = (unsigned char *)x->p[b];
    } else {
        size_t n = EI__MAX(x->bytes[b], off + x->bytes[a]);
        host = (unsigned char *)guarded_alloc_at(n, 0);
        memcpy(host, x->p[b], x->bytes[b]);
        x->p[b] = *arena = host;
    }
    if (x->master[a]) memcpy(host + off, x->master[a], x->bytes[a]);
    else if (off + x->bytes[a] > x->bytes[b]) { /* scratch leaves the host's bytes, and is zero past them as at home */
        size_t from = EI__MAX(off, x->bytes[b]);
        memset(host + from, 0, off + x->bytes[a] - from);
    }
    x->p[a] = host + off;
    return 1;
}

/* The call's regions: sizes, contents, a home each. */
static void pl_begin(pl_fix *x, const pl_call *c) {
    int r;
    for (r = 0; r < R_COUNT; ++r) { x->bytes[r] = 0; x->master[r] = NULL; x->home[r] = NULL; }
    c->setup(x);
    x->bytes[R_PLANA] = ei__plan_extent(&x->plan); x->p[R_PLANA] = x->plan.entropy;
    x->bytes[R_RING] = ei__decoder_ring_bytes(&x->dec); x->p[R_RING] = x->dec.queries;
    for (r = 0; r < R_COUNT; ++r)
        if ((c->regs & PL_BIT(r)) && !(PL_FIXED & PL_BIT(r))) x->home[r] = guarded_alloc_at(x->bytes[r], 0);
}
static void pl_end(pl_fix *x, const pl_call *c) {
    int r;
    for (r = 0; r < R_COUNT; ++r)
        if (x->home[r]) {
            CHECK(guard_intact(x->home[r], x->bytes[r]), "%s: %s guards", c->name, pl_name[r]);
            guarded_free(x->home[r]);
            x->home[r] = NULL;
        }
}

static int pl_refused, pl_overlap, pl_accepted, pl_unused;
static void pl_placements(pl_fix *x, const pl_call *c) {
    unsigned char *ref[R_COUNT], *before[R_COUNT];
    int a, b, k;
    ei_result res;
    pl_begin(x, c);
    /* the reference: every region apart */
    pl_reset(x, c); pl_fixup(x, c);
    res = c->run(x);
    CHECK(res == EI_OK, "%s with every region apart: %s (%s)", c->name, ei_result_name(res), ei_last_error());
    pl_snap(x, c, ref);
    for (a = 0; a < R_COUNT; ++a)
        for (b = 0; b < R_COUNT; ++b) {
            size_t offs[5], A, B;
            if (a == b || !(c->regs & PL_BIT(a)) || !(c->regs & PL_BIT(b)) || (PL_FIXED & PL_BIT(a))) continue;
            if (!(c->written & (PL_BIT(a) | PL_BIT(b)))) continue; /* read-only regions may share memory */
            A = x->bytes[a]; B = x->bytes[b];
            offs[0] = 0;                                 /* at the start */
            offs[1] = pl_down8(B / 2);                   /* in the middle */
            offs[2] = B >= A ? pl_down8(B - A) : 0;      /* at the end (inside when it fits) */
            offs[3] = B > 8 ? pl_down8(B - 1) : 0;       /* straddling the end */
            offs[4] = (B + 63) & ~(size_t)63;           /* just past: apart */
            for (k = 0; k < 5; ++k) {
                void *arena;
                int changed;
                if (k == 4 && (PL_FIXED & PL_BIT(b))) continue;
                pl_reset(x, c);
                if (!pl_place(x, a, b, offs[k], &arena)) continue;
                pl_fixup(x, c);
                pl_snap(x, c, before);
                res = c->run(x);
                if (res != EI_OK) { /* refused: nothing written; as overlapping, unless the placement overwrote
                                       what the call checks first (a struct, a plan's state, a keep index) */
                    changed = pl_changed(x, c->regs, before);
                    if (c->run == ru_step_parts && res == EI_ERR_OVERLAP && changed == R_WS) {
                        known_gap(0, "decode attention in parts: part 0 of 2 accepts a region over part 1's slice of the "
                                     "shared workspace and writes its partials; part 1 then refuses it");
                        changed = -1;
                    }
                    CHECK((res == EI_ERR_OVERLAP || (x->master[a] && (x->master[b] || (PL_FIXED & PL_BIT(b))))) && changed < 0,
                          "%s: %s (%zu bytes) at byte %zu of %s (%zu bytes): %s (%s), %s changed", c->name, pl_name[a], A,
                          offs[k], pl_name[b], B, ei_result_name(res), ei_last_error(), changed < 0 ? "nothing" : pl_name[changed]);
                    if (res == EI_ERR_OVERLAP) CHECK_ERR_REACHED(EI_ERR_OVERLAP);
                    pl_refused++;
                    if (res == EI_ERR_OVERLAP) pl_overlap++;
                    CHECK(k < 4, "%s: %s just past %s refused: %s (%s)", c->name, pl_name[a], pl_name[b],
                          ei_result_name(res), ei_last_error());
                } else { /* accepted (apart, or over bytes the call does not use): the reference's result */
                    changed = pl_changed(x, c->result, ref);
                    if (changed >= 0 && b == R_K && (c->run == ru_profile_part0 || c->run == ru_chunk_part1)) {
                        known_gap(0, gap_empty_parts);
                        changed = -1;
                    }
                    CHECK(changed < 0, "%s: %s at byte %zu of %s accepted, %s differs from the reference", c->name,
                          pl_name[a], offs[k], pl_name[b], changed < 0 ? "nothing" : pl_name[changed]);
                    pl_accepted++;
                    if (k < 4) { pl_unused++; if (getenv("EI_TEST_VERBOSE")) printf("    accepted: %s: %s at byte %zu of %s\n", c->name, pl_name[a], offs[k], pl_name[b]); }
                }
                pl_snap_free(before);
                if (arena) {
                    CHECK(guard_intact(arena, guard_head_of(arena).n), "%s: arena guards", c->name);
                    guarded_free(arena);
                }
            }
        }
    pl_snap_free(ref);
    pl_end(x, c);
}

/* A plan or decoder argument never initialised (random bytes, zeros), with
   an edited layout field, or with counters out of range: refused before its
   memory is touched (EI_ERR_NULL / EI_ERR_STATE), nothing written. */
static void pl_bad_structs(pl_fix *x, const pl_call *c) {
    static const char *const kinds[4] = {"random bytes", "zeros", "an edited layout", "counters at the int64 edges"};
    int kind, i;
    if (!(c->regs & (PL_BIT(R_PLAN) | PL_BIT(R_DEC))) || c->run == ru_plan_init || c->run == ru_decoder_init) return;
    for (kind = 0; kind < 4; ++kind) {
        ei_plan bp = x->plan;
        ei_decoder bd = x->dec;
        unsigned char *before[R_COUNT];
        ei_result res;
        int changed;
        uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)(kind + 1) + (uint64_t)(uintptr_t)c;
        if (kind == 3 && (c->run == ru_decoder_reset || c->run == ru_chunk_part1)) continue; /* counters not read: reset
            sets them; a part without kv head 0 leaves them to the part that has it */
        switch (kind) {
            case 0:
                for (i = 0; i < (int)sizeof bp; ++i) { h = h * 6364136223846793005ull + 1442695040888963407ull; ((unsigned char *)&bp)[i] = (unsigned char)(h >> 56); }
                for (i = 0; i < (int)sizeof bd; ++i) { h = h * 6364136223846793005ull + 1442695040888963407ull; ((unsigned char *)&bd)[i] = (unsigned char)(h >> 56); }
                break;
            case 1: memset(&bp, 0, sizeof bp); memset(&bd, 0, sizeof bd); break;
            case 2: bp.max_keep += 1; bd.head_dim += 1; break;
            default:
                bp.n_tokens = INT64_MAX; bd.n_observed = INT64_MAX; bd.n_generated = INT64_MAX; bd.last_compress = INT64_MIN;
                bd.n_accumulated = INT64_MAX; bd.accumulated_end = INT64_MIN;
                break;
        }
        x->plan_master = &bp; x->dec_master = &bd;
        pl_begin(x, c);
        pl_reset(x, c); pl_fixup(x, c);
        pl_snap(x, c, before);
        res = c->run(x);
        changed = pl_changed(x, c->regs, before);
        CHECK((res == EI_ERR_NULL || res == EI_ERR_STATE) && changed < 0, "%s with a %s of %s: %s (%s), %s changed", c->name,
              c->regs & PL_BIT(R_PLAN) ? "plan" : "decoder", kinds[kind], ei_result_name(res), ei_last_error(),
              changed < 0 ? "nothing" : pl_name[changed]);
        pl_snap_free(before);
        pl_end(x, c);
        x->plan_master = &x->plan; x->dec_master = &x->dec;
    }
}

static void pl_make(pl_fix *x, ei_decode_policy policy) {
    synth_layer *L;
    size_t nq1;
    void *ws, *dws, *as;
    ei_exec ew, ek;
    ei_decoder d;
    ei_out_tensor o1;
    float *out1;
    int64_t j;
    memset(x, 0, sizeof *x);
    x->L = make_layer(200, 4, 2, 16, 36);
    L = &x->L;
    x->c = small_config(EI_SIMD_AUTO);
    x->c.per_segment_budget = 1; /* so that ei_plan_finalize writes the plan */
    x->c.decode_policy = policy;  /* H2O: the decoder's memory holds its sums too, which keep, select and shared_add write */
    x->c.decode_positions = policy == EI_DECODE_H2O ? L->n : 0;
    CHECK_OK(ei_context_create(&x->c, &x->ctx));
    x->s1 = layer_sizes(x->ctx, L->n, L->heads, L->kv, L->dim, EI_PLAN_CHUNKED, 1);
    x->s2 = layer_sizes(x->ctx, L->n, L->heads, L->kv, L->dim, EI_PLAN_CHUNKED, 2);
    x->pb = x->s1.plan;
    x->db = x->s1.decoder;
    x->pm = (unsigned char *)guarded_alloc(x->pb);
    x->dm = (unsigned char *)guarded_alloc(x->db);
    ws = guarded_alloc(x->s1.profile); dws = guarded_alloc(x->s1.decode_keep);
    as = guarded_alloc(x->s2.decode);
    ew = ex(1, ws, x->s1.profile); ek = ex(1, dws, x->s1.decode_keep);
    CHECK_OK(ei_plan_init(x->ctx, &x->plan, L->n, L->kv, L->dim, EI_PLAN_CHUNKED, x->pm, x->pb));
    CHECK_OK(ei_profile(x->ctx, &ew, &L->tq, &L->tk, &x->plan));
    CHECK_OK(ei_decoder_init(x->ctx, &x->dec, L->heads, L->kv, L->dim, x->dm, x->db));
    CHECK_OK(ei_decode_observe(x->ctx, &x->dec, &L->tq, 0, 0));
    x->pm_snap = (unsigned char *)malloc(x->pb); memcpy(x->pm_snap, x->pm, x->pb);
    x->dm_snap = (unsigned char *)malloc(x->db); memcpy(x->dm_snap, x->dm, x->db);
    x->plan_master = &x->plan; x->dec_master = &x->dec;
    nq1 = (size_t)L->heads * (size_t)L->dim;
    x->tq = L->tq; x->tk = L->tk; x->tv = L->tv;
    x->tq1 = L->tq; x->tq1.data = L->q + (size_t)(L->n - 1) * nq1; x->tq1.n_tokens = 1;
    x->tqc = L->tq; x->tqc.n_tokens = 100;
    x->to = ei_out_tensor_make(L->q, EI_F32, L->n, L->heads, L->dim);
    x->to1 = ei_out_tensor_make(L->q, EI_F32, 1, L->heads, L->dim);
    x->tko = ei_out_tensor_make(L->k, EI_F32, L->n, L->kv, L->dim);
    x->tvo = ei_out_tensor_make(L->v, EI_F32, L->n, L->kv, L->dim);
    x->mask_base = (float *)malloc(sizeof(float) * (size_t)L->n * (size_t)L->n);
    for (j = 0; j < (int64_t)L->n * L->n; ++j) x->mask_base[j] = (float)(j % 5) * -0.5f;
    x->mbase.data = x->mask_base; x->mbase.dtype = EI_F32; x->mbase.n_heads = 1; x->mbase.n_rows = L->n;
    x->mbase.n_keys = L->n; x->mbase.row_stride = L->n; x->mbase.head_stride = L->n;
    x->mout = x->mbase; x->mout.dtype = EI_F16; x->mout.n_heads = L->kv;
    x->mout.row_stride = (int64_t)L->kv * L->n; x->mout.data = L->q; /* its region: placed by each test */
    x->rowpos = (int32_t *)malloc(sizeof(int32_t) * (size_t)L->n);
    for (j = 0; j < L->n; ++j) x->rowpos[j] = (int32_t)j;
    memset(&x->keep_empty, 0, sizeof x->keep_empty);
    x->keep_empty.heads_out = L->kv;
    x->keep_empty.capacity = x->c.decode_budget;
    x->keep_empty.index = (int32_t *)calloc((size_t)L->kv * (size_t)x->c.decode_budget, 4);
    x->keep_empty.positions = (int32_t *)calloc((size_t)L->kv * (size_t)x->c.decode_budget, 4);
    x->keep_empty.mask = (uint8_t *)calloc((size_t)L->kv * (size_t)L->n, 1);
    x->keep_empty.mask_capacity = L->n;
    x->keep_empty.pooled = (float *)calloc((size_t)L->kv * (size_t)L->n, 4);
    x->keep_empty.pooled_capacity = L->n;
    x->keep_empty.row_pos = x->rowpos;
    x->keep_shared = x->keep_empty;
    x->keep_shared.heads_out = 1;
    memset(&x->keep_filled, 0, sizeof x->keep_filled);
    x->keep_filled.heads_out = L->kv;
    x->keep_filled.capacity = x->c.decode_budget;
    x->filled_index = (int32_t *)calloc((size_t)L->kv * (size_t)x->c.decode_budget, 4);
    x->keep_filled.index = x->filled_index;
    d = x->dec; /* (the fixture's decoder stays as observed) */
    CHECK_OK(ei_decode_keep(x->ctx, &ek, &d, &L->tk, &x->keep_filled));
    x->scores = (float *)malloc(sizeof(float) * (size_t)L->heads * (size_t)L->n);
    x->shared = (float *)calloc((size_t)L->n, 4);
    x->zeros = (float *)calloc((size_t)L->n, 4);
    CHECK_OK(ei_decode_score(x->ctx, &ek, &x->dec, &L->tk, x->rowpos, 0, x->scores));
    d = x->dec;
    CHECK_OK(ei_decode_shared_add(x->ctx, &ek, &d, x->scores, L->n, x->rowpos, x->shared));
    out1 = (float *)malloc(nq1 * 4);
    o1 = ei_out_tensor_make(out1, EI_F32, 1, L->heads, L->dim);
    for (j = 0; j < 2; ++j) { /* a step in parts works */
        ei_exec ep = ex_part((int32_t)j, 2, as, x->s2.decode);
        CHECK_OK(ei_attention_decode(x->ctx, &ep, &x->tq1, &L->tk, &L->tv, &x->keep_filled, &o1, L->n - 1));
    }
    for (j = 0; j < 2; ++j) {
        ei_exec ep = ex_part((int32_t)j, 2, as, x->s2.decode);
        CHECK_OK(ei_attention_decode_merge(x->ctx, &ep, &o1));
    }
    free(out1);
    guarded_free(ws); guarded_free(dws); guarded_free(as);
}
static void pl_free(pl_fix *x) {
    CHECK(guard_intact(x->pm, x->pb) && guard_intact(x->dm, x->db), "plan / decoder memory guards");
    guarded_free(x->pm); guarded_free(x->dm);
    free(x->pm_snap); free(x->dm_snap); free(x->rowpos); free(x->filled_index);
    free(x->keep_empty.index); free(x->keep_empty.positions); free(x->keep_empty.mask); free(x->keep_empty.pooled);
    free(x->scores); free(x->shared); free(x->zeros); free(x->mask_base);
    ei_context_destroy(x->ctx);
    synth_layer_free(&x->L);
}

/* pl_calls' entry c calls the public function `name` (one of the names,
   comma-separated, before the first space). */
static int pl_is_entry(const pl_call *c, const char *name) {
    size_t n = strlen(name);
    const char *p = c->name;
    while (*p && *p != ' ') {
        if (!strncmp(p, name, n) && (p[n] == 0 || p[n] == ' ' || p[n] == ',')) return 1;
        while (*p && *p != ' ' && *p != ',') ++p;
        if (*p == ',') ++p;
    }
    return 0;
}
/* The header declares a public function of that name ("EIDEF ... name("). */
static int header_declares(const char *name) {
    FILE *f = fopen("entropyinfer.h", "r");
    char line[512], want[64];
    int found = 0;
    if (!f) f = fopen("../entropyinfer.h", "r");
    if (!f) return 1;
    snprintf(want, sizeof want, " %.48s(", name);
    while (!found && fgets(line, sizeof line, f)) found = !strncmp(line, "EIDEF ", 6) && strstr(line, want) != NULL;
    fclose(f);
    return found;
}

/* The header's MEMORY ARGUMENTS table and pl_calls name the same entries
   (the CUDA-only copies aside): an entry added to one is added to the other. */
static void pl_check_header_table(void) {
    FILE *f = fopen("entropyinfer.h", "r");
    char line[256], names[64][48];
    int n = 0, in = 0, i, j;
    size_t k;
    if (!f) f = fopen("../entropyinfer.h", "r");
    if (!f) { printf("  (entropyinfer.h not found from here: its MEMORY ARGUMENTS table not compared)\n"); return; }
    while (fgets(line, sizeof line, f) && n < 64) {
        char *p = line, *end;
        if (strstr(line, "MEMORY ARGUMENTS")) in = 1;
        if (in && strstr(line, "Every pair of a call's regions")) break;
        if (!in || !strstr(line, "|")) continue;
        end = strchr(strchr(line, '|') + 1, '|'); /* the entry column */
        if (!end) continue;
        while ((p = strstr(p, "ei_")) && p < end && n < 64) {
            for (k = 0; k < sizeof names[0] - 1 && (isalnum((unsigned char)p[k]) || p[k] == '_'); ++k) names[n][k] = p[k];
            names[n++][k] = 0;
            p += k;
        }
    }
    fclose(f);
    CHECK(n > 20, "the MEMORY ARGUMENTS table of entropyinfer.h names %d entries", n);
    for (i = 0; i < n; ++i) {
        int found = !strcmp(names[i], "ei_plan_copy") || !strcmp(names[i], "ei_device_copy"); /* CUDA only */
        found |= !strcmp(names[i], "ei_plan_grow"); /* its one caller region, the struct, inside its arrays: test_issue36_seals */
        for (j = 0; j < (int)(sizeof pl_calls / sizeof pl_calls[0]); ++j) found |= pl_is_entry(&pl_calls[j], names[i]);
        CHECK(header_declares(names[i]), "entropyinfer.h's MEMORY ARGUMENTS table names %s, which it does not declare",
              names[i]);
        CHECK(found, "%s is in the header's MEMORY ARGUMENTS table but not placed by test_placements", names[i]);
    }
    for (j = 0; j < (int)(sizeof pl_calls / sizeof pl_calls[0]); ++j) {
        int found = 0;
        for (i = 0; i < n; ++i) found |= pl_is_entry(&pl_calls[j], names[i]);
        CHECK(found, "%s is placed by test_placements but missing from the header's MEMORY ARGUMENTS table", pl_calls[j].name);
    }
}

static void test_placements(void) {
    pl_fix x;
    size_t i;
    int pass;
    pl_check_header_table();
    for (pass = 0; pass < 2; ++pass) { /* the default policy, then H2O (a decoder with its sums) */
        pl_refused = pl_overlap = pl_accepted = pl_unused = 0;
        pl_make(&x, pass ? EI_DECODE_H2O : EI_DECODE_ENTROPYINFER);
        for (i = 0; i < sizeof pl_calls / sizeof pl_calls[0]; ++i) {
            pl_placements(&x, &pl_calls[i]);
            pl_bad_structs(&x, &pl_calls[i]);
        }
        printf("  %s: placements over %d entry points: %d refused (%d as overlapping), %d accepted equal to the reference "
               "(%d of them over bytes the call does not use)\n", pass ? "EI_DECODE_H2O" : "default",
               (int)(sizeof pl_calls / sizeof pl_calls[0]), pl_refused, pl_overlap, pl_accepted, pl_unused);
        pl_free(&x);
    }
}


/* ------------------------------------------------------------ the five classes (issue 36) */
/* Each class by the example the outside misuse programs found, then its
   class: structs not made by init refused by every entry that takes one
   (void and int entries included), sums of caller values at the int64
   edges refused before they are formed (no UBSan report under test-asan),
   and a call on threads that refuses a later share before any share ran. */
static int c36_allocs_left, c36_frees;
static void *c36_alloc(size_t n, void *u) { (void)u; return c36_allocs_left-- > 0 ? malloc(n) : NULL; }
static void c36_free(void *p, void *u) { (void)u; c36_frees++; free(p); }
static void c36_garbage(void *p, size_t n, unsigned seed) {
    size_t i;
    for (i = 0; i < n; ++i) ((unsigned char *)p)[i] = (unsigned char)(0xA7u + 31u * (unsigned)i + seed);
}

static void test_issue36_seals(void) {
    synth_layer L = make_layer(200, 4, 2, 16, 37);
    ei_config c = small_config(EI_SIMD_AUTO);
    ei_context *ctx;
    ei_plan g, copy, p, e;
    ei_decoder dg, d;
    void *dm, *ws;
    size_t db, wb;
    ei_tensor q1 = L.tq;
    ei_exec ew;
    c.allocator.alloc = c36_alloc; c.allocator.free = c36_free;
    c36_allocs_left = 1000;
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    /* ei_plan_free: garbage, zeros, an edited owned_memory: nothing freed, the struct as it was */
    c36_garbage(&g, sizeof g, 1);
    copy = g; c36_frees = 0;
    ei_plan_free(ctx, &g);
    CHECK(c36_frees == 0 && !memcmp(&g, &copy, sizeof g) && strstr(ei_last_error(), "EI_ERR_STATE"),
          "ei_plan_free of garbage: %d frees, struct %s, '%s'", c36_frees, memcmp(&g, &copy, sizeof g) ? "changed" : "kept",
          ei_last_error());
    memset(&g, 0, sizeof g);
    ei_plan_free(ctx, &g);
    CHECK(c36_frees == 0, "ei_plan_free of a zeroed plan freed something");
    CHECK_ERR(ei_plan_init(ctx, &p, L.n, L.kv, L.dim, 0, NULL, 0), EI_OK);
    e = p; e.owned_memory = (unsigned char *)p.owned_memory + 16;
    ei_plan_free(ctx, &e);
    CHECK(c36_frees == 0 && e.owned_memory == (unsigned char *)p.owned_memory + 16, "ei_plan_free of an edited owned_memory");
    ei_plan_free(ctx, &p);
    CHECK(c36_frees == 1 && p.entropy == NULL && p.owned_memory == NULL, "ei_plan_free of an allocated plan: %d frees", c36_frees);
    ei_plan_free(ctx, &p); /* twice: a zeroed plan */
    CHECK(c36_frees == 1, "ei_plan_free twice freed twice");
    /* an engine's cleanup after a failed alloc: the plan was never made */
    c36_garbage(&g, sizeof g, 2);
    copy = g; c36_allocs_left = 0;
    CHECK_ERR(ei_plan_init(ctx, &g, L.n, L.kv, L.dim, 0, NULL, 0), EI_ERR_NOMEM);
    CHECK(!memcmp(&g, &copy, sizeof g), "a refused ei_plan_init(memory NULL) wrote the plan struct");
    ei_plan_free(ctx, &g);
    CHECK(c36_frees == 1 && !memcmp(&g, &copy, sizeof g), "ei_plan_free after a failed ei_plan_init(memory NULL): %d frees",
          c36_frees);
    /* memory NULL with bytes: the caller's allocation failed, nothing allocated here, the struct as it was */
    c36_allocs_left = 1000;
    CHECK_ERR(ei_plan_init(ctx, &g, L.n, L.kv, L.dim, 0, NULL, 4096), EI_ERR_NULL);
    CHECK(c36_allocs_left == 1000 && !memcmp(&g, &copy, sizeof g), "ei_plan_init(memory NULL, 4096 bytes) allocated (%d) "
          "or wrote the plan struct", 1000 - c36_allocs_left);
    c36_allocs_left = 1000;
    /* ei_plan_grow: garbage and an edited owned_memory refused, nothing allocated or freed; a failed allocation
       leaves the plan as it was; a grown plan frees its old memory once */
    c36_garbage(&g, sizeof g, 5);
    copy = g; c36_frees = 0;
    CHECK_ERR(ei_plan_grow(ctx, &g, 2 * L.n), EI_ERR_STATE);
    CHECK(c36_frees == 0 && !memcmp(&g, &copy, sizeof g), "ei_plan_grow of garbage changed it or freed");
    CHECK_ERR(ei_plan_init(ctx, &p, L.n, L.kv, L.dim, EI_PLAN_CHUNKED, NULL, 0), EI_OK);
    e = p; e.owned_memory = (unsigned char *)p.owned_memory + 16;
    CHECK_ERR(ei_plan_grow(ctx, &e, 2 * L.n), EI_ERR_STATE);
    copy = p; c36_allocs_left = 0;
    CHECK_ERR(ei_plan_grow(ctx, &p, 2 * L.n), EI_ERR_NOMEM);
    CHECK(c36_frees == 0 && !memcmp(&p, &copy, sizeof p), "a refused ei_plan_grow changed the plan or freed");
    c36_allocs_left = 1000;
    CHECK_ERR(ei_plan_grow(ctx, &p, 2 * L.n), EI_OK);
    CHECK(c36_frees == 1 && p.max_tokens == 2 * L.n && p.owned_memory != copy.owned_memory, "ei_plan_grow: %d frees", c36_frees);
    ei_plan_free(ctx, &p);
    c36_frees = 1;
    /* int entries: 0 for a struct they refuse */
    c36_garbage(&g, sizeof g, 3);
    CHECK(ei_plan_segment_is_sparse(ctx, &g, 0) == 0 && strstr(ei_last_error(), "EI_ERR_STATE"),
          "ei_plan_segment_is_sparse of garbage: '%s'", ei_last_error());
    db = layer_sizes(ctx, L.n, L.heads, L.kv, L.dim, 0, 1).decoder;
    dm = guarded_alloc(db);
    CHECK_ERR(ei_decoder_init(ctx, &d, L.heads, L.kv, L.dim, dm, db), EI_OK);
    CHECK_ERR(ei_decode_observe(ctx, &d, &L.tq, 0, 0), EI_OK);
    q1.n_tokens = 4; /* decode_gap generated tokens */
    CHECK_ERR(ei_decode_observe(ctx, &d, &q1, d.position_end, 1), EI_OK);
    CHECK(ei_decode_due(ctx, &d) == 1, "ei_decode_due after decode_gap tokens");
    c36_garbage(&dg, sizeof dg, 4);
    CHECK(ei_decode_due(ctx, &dg) == 0 && strstr(ei_last_error(), "EI_ERR_STATE"), "ei_decode_due of garbage: '%s'", ei_last_error());
    memset(&dg, 0, sizeof dg);
    CHECK(ei_decode_due(ctx, &dg) == 0 && strstr(ei_last_error(), "EI_ERR_NULL"), "ei_decode_due of zeros: '%s'", ei_last_error());
    CHECK(ei_decode_due(NULL, &d) == 0 && ei_decode_due(ctx, NULL) == 0, "ei_decode_due of NULL");
    dg = d; dg.last_compress = INT64_MIN; /* rolled back: n_generated - last_compress would overflow */
    CHECK(ei_decode_due(ctx, &dg) == 0 && strstr(ei_last_error(), "EI_ERR_STATE"), "ei_decode_due, last_compress INT64_MIN");
    dg = d; dg.n_generated = INT64_MAX; dg.n_observed = INT64_MAX;
    CHECK(ei_decode_due(ctx, &dg) == 0, "ei_decode_due, counters INT64_MAX");
    /* a struct inside its own arrays: ei_plan_reset / ei_plan_finalize write through what they read (the examples) */
    {
        size_t pb;
        unsigned char *pm, *snap;
        ei_plan *inside;
        ei_config cs = c;
        ei_context *cx;
        cs.per_segment_budget = 1;
        CHECK_ERR(ei_context_create(&cs, &cx), EI_OK);
        {
            ei_sizes sz = layer_sizes(cx, L.n, L.heads, L.kv, L.dim, 0, 1);
            pb = sz.plan; wb = sz.profile;
        }
        pm = (unsigned char *)guarded_alloc(pb); ws = guarded_alloc(wb); snap = (unsigned char *)malloc(pb);
        ew = ex(1, ws, wb);
        CHECK_ERR(ei_plan_init(cx, &p, L.n, L.kv, L.dim, 0, pm, pb), EI_OK);
        CHECK_ERR(ei_profile(cx, &ew, &L.tq, &L.tk, &p), EI_OK);
        inside = (ei_plan *)(void *)p.keep_count; /* the struct over the counts finalize fills */
        memcpy(inside, &p, sizeof p);
        memcpy(snap, pm, pb);
        CHECK_ERR(ei_plan_finalize(cx, inside), EI_ERR_OVERLAP);
        CHECK_ERR(ei_plan_reset(inside), EI_ERR_OVERLAP);
        CHECK(!memcmp(snap, pm, pb), "a refused reset/finalize of a plan inside its arrays wrote them");
        inside = (ei_plan *)(void *)p.block_index; /* over the block lists (the SEGV through block_index) */
        memcpy(inside, &p, sizeof p);
        CHECK_ERR(ei_plan_finalize(cx, inside), EI_ERR_OVERLAP);
        guarded_free(pm); guarded_free(ws); free(snap);
        { /* ei_plan_grow's one caller region is the struct (the arrays are the library's): inside them, refused
             (before the plan's memory is asked whose it is; zeroed memory, so that every byte compared is defined) */
            ei_plan own;
            size_t ob;
            unsigned char *om;
            ob = layer_sizes(cx, L.n, L.heads, L.kv, L.dim, EI_PLAN_CHUNKED, 1).plan;
            om = (unsigned char *)calloc(1, ob);
            CHECK_ERR(ei_plan_init(cx, &own, L.n, L.kv, L.dim, EI_PLAN_CHUNKED, om, ob), EI_OK);
            inside = (ei_plan *)(void *)own.keep_count;
            memcpy(inside, &own, sizeof own);
            snap = (unsigned char *)malloc(ob);
            memcpy(snap, om, ob);
            CHECK_ERR(ei_plan_grow(cx, inside, 2 * L.n), EI_ERR_OVERLAP);
            CHECK(!memcmp(snap, om, ob), "a refused grow of a plan inside its arrays wrote them");
            free(snap);
            free(om);
        }
        ei_context_destroy(cx);
    }
    guarded_free(dm);
    ei_context_destroy(ctx);
    synth_layer_free(&L);
}

/* Sums and products of caller values at the int64 edges: refused (the code
   of the value out of range) before the arithmetic is formed. */
static void test_issue36_int64_edges(void) {
    static const int64_t edges[] = {INT64_MIN, INT64_MIN + 1, -1, EI_MAX_TOKENS + 1, INT64_MAX - 1, INT64_MAX};
    mu_setup m = mu_make(EI_SIMD_AUTO);
    synth_layer *L = &m.L;
    ei_plan cp;
    size_t cb, i;
    void *cm, *ws = guarded_alloc(2 * m.wb), *as = guarded_alloc(m.ab), *dws = guarded_alloc(m.kb);
    float *out = (float *)guarded_alloc(m.ob), *scores = (float *)guarded_alloc(m.kb);
    int32_t *index = (int32_t *)guarded_alloc(sizeof(int32_t) * (size_t)L->kv * (size_t)m.c.decode_budget);
    ei_out_tensor o = ei_out_tensor_make(out, EI_F32, L->n, L->heads, L->dim), o1 = o;
    ei_keep_set ks = mu_keep(&m, index), kx;
    ei_tensor q, q1 = L->tq;
    ei_sizes sz, s2 = layer_sizes(m.ctx, L->n, L->heads, L->kv, L->dim, EI_PLAN_CHUNKED, 2);
    void *decw = guarded_alloc(s2.decode); /* a decode step's workspace for 2 threads or parts */
    ei_exec ew = ex(1, ws, m.wb), ew2 = ex(2, ws, 2 * m.wb), ew1 = ex_part(1, 2, ws, 2 * m.wb), ea = ex(1, as, m.ab);
    ei_exec ed = ex(2, decw, s2.decode), ed0 = ex_part(0, 2, decw, s2.decode), ek = ex(1, dws, m.kb);
    cb = s2.plan;
    cm = guarded_alloc(cb);
    CHECK_ERR(ei_plan_init(m.ctx, &cp, L->n, L->kv, L->dim, EI_PLAN_CHUNKED, cm, cb), EI_OK);
    q1.n_tokens = 1; o1.n_tokens = 1;
    CHECK_ERR(ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &ks), EI_OK);
    for (i = 0; i < sizeof edges / sizeof edges[0]; ++i) {
        int64_t v = edges[i];
        ei_plan pe = m.plan;
        ei_result r;
        /* chunked planning: q_pos, and q's count at the largest q_pos */
        q = L->tq; q.n_tokens = v;
        CHECK_ERR(ei_profile_chunk(m.ctx, &ew, &q, &L->tk, &cp, EI_MAX_TOKENS, 0), EI_ERR_SIZE);
        CHECK_ERR(ei_profile_chunk(m.ctx, &ew2, &q, &L->tk, &cp, EI_MAX_TOKENS, 0), EI_ERR_SIZE);
        CHECK_ERR(ei_profile_chunk(m.ctx, &ew1, &q, &L->tk, &cp, EI_MAX_TOKENS, 0), EI_ERR_SIZE);
        CHECK_ERR(ei_profile_chunk(m.ctx, &ew, &L->tq, &L->tk, &cp, v, 0), EI_ERR_SIZE);
        CHECK(cp.n_tokens == 0, "a refused chunk moved the plan to %lld tokens", (long long)cp.n_tokens);
        /* attention: q_offset */
        CHECK_ERR(ei_attention_prefill(m.ctx, &ea, &L->tq, &L->tk, &L->tv, NULL, &o, v), EI_ERR_SIZE);
        r = ei_attention_decode(m.ctx, &ed, &q1, &L->tk, &L->tv, NULL, &o1, v);
        CHECK(r == EI_ERR_SIZE, "decode attention at q_offset %lld: %s", (long long)v, ei_result_name(r));
        r = ei_attention_decode(m.ctx, &ed0, &q1, &L->tk, &L->tv, NULL, &o1, v);
        CHECK(r == EI_ERR_SIZE, "decode attention at q_offset %lld, part 0 of 2: %s", (long long)v, ei_result_name(r));
        /* keep sets: counts, capacities and strides */
        kx = ks; kx.n_tokens = v;
        r = ei_attention_decode(m.ctx, &ed, &q1, &L->tk, &L->tv, &kx, &o1, L->n - 1);
        CHECK(r == EI_ERR_SHAPE, "decode attention through a keep set of %lld rows: %s", (long long)v, ei_result_name(r));
        r = ei_kv_compact(m.ctx, &kx, NULL, &o);
        CHECK(r == EI_ERR_SHAPE, "compaction by a keep set of %lld rows: %s", (long long)v, ei_result_name(r));
        /* row map strides: refused when negative or past 2^40 (a valid one says the second kv head's map lies
           that far on: the test's one map does not, so those are not called) */
        if (v < 0 || v > ((int64_t)1 << 40)) {
            kx = ks; kx.row_pos = index; kx.row_pos_stride = v;
            r = ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &kx);
            CHECK(r == EI_ERR_STRIDE, "row_pos_stride %lld: %s", (long long)v, ei_result_name(r));
            r = ei_decode_score(m.ctx, &ek, &m.dec, &L->tk, index, v, scores);
            CHECK(r == EI_ERR_STRIDE, "decode_score row_pos_stride %lld: %s", (long long)v, ei_result_name(r));
        }
        kx = ks; kx.pooled = scores; kx.pooled_capacity = v;
        r = ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &kx);
        CHECK(r == EI_ERR_SIZE, "pooled_capacity %lld: %s", (long long)v, ei_result_name(r));
        kx = ks; kx.mask = (uint8_t *)(void *)scores; kx.mask_capacity = v;
        r = ei_decode_keep(m.ctx, &ek, &m.dec, &L->tk, &kx);
        CHECK(r == EI_ERR_SIZE || r == EI_ERR_WORKSPACE, "mask_capacity %lld: %s", (long long)v, ei_result_name(r));
        CHECK_ERR(ei_decode_select(m.ctx, &ek, &m.dec, scores, v, &ks), EI_ERR_SIZE);
        /* sizes: a layer of v tokens; a decode step of v query tokens (threads and parts) */
        CHECK_ERR(sizes_for(m.ctx, v, L->heads, L->kv, L->dim, 0, 1, &sz), EI_ERR_SIZE);
        q = q1; q.n_tokens = v;
        r = ei_attention_decode(m.ctx, &ed, &q, &L->tk, &L->tv, NULL, &o1, 0);
        CHECK(r == EI_ERR_SIZE, "a decode step of %lld query tokens: %s", (long long)v, ei_result_name(r));
        r = ei_attention_decode(m.ctx, &ed0, &q, &L->tk, &L->tv, NULL, &o1, 0);
        CHECK(r == EI_ERR_SIZE, "a decode step of %lld query tokens, part 0 of 2: %s", (long long)v, ei_result_name(r));
        CHECK_ERR(ei_check_key_positions(m.ctx, index, v), EI_ERR_SIZE);
        /* a plan's and a decoder's counters */
        pe.n_tokens = v;
        CHECK_ERR(ei_attention_prefill(m.ctx, &ea, &L->tq, &L->tk, &L->tv, &pe, &o, 0), EI_ERR_STATE);
        {
            ei_decoder de = m.dec;
            de.n_observed = v;
            CHECK_ERR(ei_decode_observe(m.ctx, &de, &q1, de.position_end, 1), EI_ERR_STATE);
            de = m.dec; de.last_compress = v == -1 ? -2 : v; /* (-1: no compression yet) */
            CHECK_ERR(ei_decode_keep(m.ctx, &ek, &de, &L->tk, &ks), EI_ERR_STATE);
        }
    }
    CHECK(guard_intact(ws, 2 * m.wb) && guard_intact(out, m.ob) && guard_intact(cm, cb) && guard_intact(decw, s2.decode),
          "guards");
    guarded_free(ws); guarded_free(as); guarded_free(dws); guarded_free(out); guarded_free(decw); guarded_free(scores);
    guarded_free(index); guarded_free(cm);
    mu_free(&m);
}

/* ei_profile_chunk on 2 threads with the second share's workspace over q:
   refused before the first share advanced the plan (the example: n_tokens 0
   to 100). In 2 parts of the one workspace: the part whose slice lies under
   q refuses; so does the other, before it plans its kv head (every part
   checks against every part's share). */
static void test_issue36_chunk_mt_shares(void) {
    mu_setup m = mu_make(EI_SIMD_AUTO);
    synth_layer *L = &m.L;
    ei_plan cp;
    size_t cb, qb = sizeof(float) * 100u * (size_t)L->heads * (size_t)L->dim;
    unsigned char *cm, *snap, *ws = (unsigned char *)guarded_alloc(2 * m.wb + qb); /* q may run past the workspace */
    ei_tensor q = L->tq;
    ei_exec e2 = ex(2, ws, 2 * m.wb), p0 = ex_part(0, 2, ws, 2 * m.wb), p1 = ex_part(1, 2, ws, 2 * m.wb);
    ei_result r0;
    cb = layer_sizes(m.ctx, L->n, L->heads, L->kv, L->dim, EI_PLAN_CHUNKED, 2).plan;
    cm = (unsigned char *)guarded_alloc(cb);
    snap = (unsigned char *)malloc(cb);
    CHECK_ERR(ei_plan_init(m.ctx, &cp, L->n, L->kv, L->dim, EI_PLAN_CHUNKED, cm, cb), EI_OK);
    q.n_tokens = 100;
    q.data = ws + m.wb + 64; /* starting inside thread 1's share */
    memcpy(ws + m.wb + 64, L->q, qb);
    memcpy(snap, cm, cb);
    mu_expect_overlap(ei_profile_chunk(m.ctx, &e2, &q, &L->tk, &cp, 0, 0), "q", "workspace",
                      "a chunk whose second share's workspace lies over q");
    CHECK(cp.n_tokens == 0 && !memcmp(snap, cm, cb), "the refused chunk moved the plan (n_tokens %lld)", (long long)cp.n_tokens);
    mu_expect_overlap(ei_profile_chunk(m.ctx, &p1, &q, &L->tk, &cp, 0, 0), "q", "workspace",
                      "part 1 of 2 of a chunk whose slice of the workspace lies under q");
    CHECK(cp.n_tokens == 0 && !memcmp(snap, cm, cb), "the refused part moved the plan (n_tokens %lld)", (long long)cp.n_tokens);
    r0 = ei_profile_chunk(m.ctx, &p0, &q, &L->tk, &cp, 0, 0);
    known_gap(r0 == EI_ERR_OVERLAP && cp.n_tokens == 0 && !memcmp(snap, cm, cb),
              "chunked planning in parts: part 0 of 2 accepts a q that lies over part 1's slice of the shared workspace "
              "and moves the plan, which part 1 then refuses (the class of test_issue36_chunk_mt_shares, in parts)");
    CHECK_ERR(ei_plan_reset(&cp), EI_OK);
    q.data = L->q;
    CHECK_ERR(ei_profile_chunk(m.ctx, &e2, &q, &L->tk, &cp, 0, 0), EI_OK);
    CHECK(cp.n_tokens == 100, "chunk of 100 tokens: n_tokens %lld", (long long)cp.n_tokens);
    CHECK(guard_intact(ws, 2 * m.wb + qb) && guard_intact(cm, cb), "guards");
    guarded_free(ws); guarded_free(cm); free(snap);
    mu_free(&m);
}

/* ------------------------------------------------------------ ei_layer_sizes and ei_exec (0.2) */
/* ei_layer_sizes for n threads or parts: on the CPU the per-thread
   workspaces (profiling, prefill, decode keep sets) are n times one
   thread's, laid end to end; the decode workspace (the partials of every
   part, then their attention workspaces) grows with n; plan and decoder do
   not depend on n; n 0 is n 1; workspace is the largest of the four. */
static void test_layer_sizes_threads(void) {
    static const struct { int64_t T; int32_t H, kv, d; uint32_t flags; } shapes[] = {
        {300, 4, 2, 32, EI_PLAN_CHUNKED}, {5000, 32, 8, 128, 0}, {1, 1, 1, 1, EI_PLAN_SCORES}, {70000, 16, 1, 256, EI_PLAN_CHUNKED | EI_PLAN_KEEP_KEYS}};
    static const int32_t ns[] = {0, 2, 3, 7, 64, EI__MAX_THREADS};
    ei_config c = ei_config_default();
    ei_context *ctx;
    size_t si, ni;
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; ++si) {
        ei_sizes one, prev;
        CHECK_ERR(sizes_for(ctx, shapes[si].T, shapes[si].H, shapes[si].kv, shapes[si].d, shapes[si].flags, 1, &one), EI_OK);
        CHECK(one.workspace == EI__MAX(EI__MAX(one.profile, one.prefill), EI__MAX(one.decode, one.decode_keep)) &&
                  one.profile > 0 && one.prefill > 0 && one.decode > 0 && one.decode_keep > 0 && one.plan > 0 && one.decoder > 0,
              "shape %d: sizes plan %zu decoder %zu profile %zu prefill %zu decode %zu decode_keep %zu workspace %zu",
              (int)si, one.plan, one.decoder, one.profile, one.prefill, one.decode, one.decode_keep, one.workspace);
        prev = one;
        for (ni = 0; ni < sizeof ns / sizeof ns[0]; ++ni) {
            int32_t n = ns[ni];
            size_t k = (size_t)(n > 1 ? n : 1);
            ei_sizes sz;
            ei_result r = sizes_for(ctx, shapes[si].T, shapes[si].H, shapes[si].kv, shapes[si].d, shapes[si].flags, n, &sz);
            if ((wide)k * (wide)EI__MAX(EI__MAX(one.profile, one.prefill), one.decode_keep) > WIDE_MAX_SIZE) { /* 32-bit */
                CHECK_ERR(r, EI_ERR_OVERFLOW);
                continue;
            }
            CHECK_ERR(r, EI_OK);
            CHECK(sz.plan == one.plan && sz.decoder == one.decoder && sz.profile == k * one.profile &&
                      sz.prefill == k * one.prefill && sz.decode_keep == k * one.decode_keep &&
                      (n <= 1 ? sz.decode == one.decode : sz.decode > prev.decode) &&
                      sz.workspace == EI__MAX(EI__MAX(sz.profile, sz.prefill), EI__MAX(sz.decode, sz.decode_keep)),
                  "shape %d, %d threads: plan %zu decoder %zu profile %zu prefill %zu decode %zu (previous %zu) decode_keep %zu "
                  "workspace %zu; one thread: %zu %zu %zu %zu %zu %zu", (int)si, (int)n, sz.plan, sz.decoder, sz.profile,
                  sz.prefill, sz.decode, prev.decode, sz.decode_keep, sz.workspace, one.plan, one.decoder, one.profile,
                  one.prefill, one.decode, one.decode_keep);
            if (n > 1) prev = sz;
        }
        {
            ei_sizes sz;
            CHECK_ERR(sizes_for(ctx, shapes[si].T, shapes[si].H, shapes[si].kv, shapes[si].d, shapes[si].flags, -1, &sz), EI_ERR_SIZE);
            CHECK_ERR(sizes_for(ctx, shapes[si].T, shapes[si].H, shapes[si].kv, shapes[si].d, shapes[si].flags, EI__MAX_THREADS + 1,
                               &sz), EI_ERR_SIZE);
            CHECK(strstr(ei_last_error(), "n_threads") != NULL, "%s", ei_last_error());
        }
    }
    ei_context_destroy(ctx);
}

/* An ei_exec the library cannot run: refused by every call that takes one,
   with its code and a message naming the field, before anything is read
   or written; a workspace too small for the threads or parts it is cut
   into; parts with nothing to do; decode keep sets in parts. */
static void test_exec_fields(void) {
    mu_setup m = mu_make(EI_SIMD_AUTO);
    synth_layer *L = &m.L;
    ei_sizes s1 = layer_sizes(m.ctx, L->n, L->heads, L->kv, L->dim, EI_PLAN_CHUNKED, 1),
             s2 = layer_sizes(m.ctx, L->n, L->heads, L->kv, L->dim, EI_PLAN_CHUNKED, 2),
             s4 = layer_sizes(m.ctx, L->n, L->heads, L->kv, L->dim, EI_PLAN_CHUNKED, 4);
    unsigned char *ws = (unsigned char *)guarded_alloc(s4.workspace), *snap_plan = (unsigned char *)malloc(m.pb),
                  *snap_dec = (unsigned char *)malloc(m.db);
    float *out = (float *)guarded_alloc(m.ob), *scores = (float *)guarded_alloc(sizeof(float) * (size_t)L->heads * (size_t)L->n),
          *shared = (float *)guarded_alloc(sizeof(float) * (size_t)L->n);
    int32_t *index = (int32_t *)guarded_alloc(sizeof(int32_t) * (size_t)L->kv * (size_t)m.c.decode_budget);
    ei_out_tensor o = ei_out_tensor_make(out, EI_F32, L->n, L->heads, L->dim), o1 = o;
    ei_keep_set ks = mu_keep(&m, index);
    ei_tensor q1 = L->tq, k0 = L->tk;
    ei_plan plan2, cp;
    ei_exec bad[10], e;
    static const ei_result want[10] = {EI_ERR_SIZE, EI_ERR_SIZE, EI_ERR_SIZE, EI_ERR_SIZE, EI_ERR_SIZE, EI_ERR_SIZE,
                                       EI_ERR_SIZE, EI_ERR_CONFIG, EI_ERR_NULL, EI_ERR_SIZE};
    int i, op, bad_count = 0;
    q1.data = L->q + (size_t)(L->n - 1) * L->heads * L->dim; q1.n_tokens = 1; o1.n_tokens = 1;
    memset(out, 0, m.ob); memset(shared, 0, sizeof(float) * (size_t)L->n);
    bad[0] = ex_part(2, 2, ws, s2.workspace);                   /* ith past nth */
    bad[1] = ex_part(-1, 2, ws, s2.workspace);                  /* ith negative */
    bad[2] = ex_part(0, EI__MAX_THREADS + 1, ws, s4.workspace); /* more parts than threads can be */
    bad[3] = ex_part(1, 1, ws, s1.workspace);                   /* a whole call with ith 1 */
    bad[4] = ex_part(0, -1, ws, s1.workspace);                  /* nth negative */
    bad[5] = ex(-1, ws, s1.workspace);
    bad[6] = ex(EI__MAX_THREADS + 1, ws, s4.workspace);
    bad[7] = ex_part(0, 2, ws, s2.workspace); bad[7].n_threads = 2; /* threads and parts at once */
    bad[8] = ex(1, NULL, s1.workspace);                      /* no workspace, but bytes */
    bad[9] = ex_part(1, 0, ws, s1.workspace);                   /* nth 0 (a whole call) with ith 1 */
    CHECK_ERR(ei_plan_init(m.ctx, &cp, L->n, L->kv, L->dim, EI_PLAN_CHUNKED, NULL, 0), EI_OK);
    memcpy(snap_plan, m.pm, m.pb); memcpy(snap_dec, m.dm, m.db);
    for (i = 0; i < 10; ++i)
        for (op = 0; op < 10; ++op) {
            ei_decoder d = m.dec;
            ei_keep_set k2 = ks;
            ei_result r;
            switch (op) {
                case 0: r = ei_profile(m.ctx, &bad[i], &L->tq, &L->tk, &m.plan); break;
                case 1: r = ei_profile_chunk(m.ctx, &bad[i], &L->tq, &L->tk, &cp, 0, 1); break;
                case 2: r = ei_attention_prefill(m.ctx, &bad[i], &L->tq, &L->tk, &L->tv, &m.plan, &o, 0); break;
                case 3: r = ei_attention_decode(m.ctx, &bad[i], &q1, &L->tk, &L->tv, NULL, &o1, L->n - 1); break;
                case 4: r = ei_attention_decode_merge(m.ctx, &bad[i], &o1); break;
                case 5: r = ei_decode_keep(m.ctx, &bad[i], &d, &L->tk, &k2); break;
                case 6: r = ei_decode_score(m.ctx, &bad[i], &d, &L->tk, NULL, 0, scores); break;
                case 7: r = ei_decode_select(m.ctx, &bad[i], &d, scores, L->n, &k2); break;
                case 8: r = ei_decode_shared_add(m.ctx, &bad[i], &d, scores, L->n, NULL, shared); break;
                default: k2.heads_out = 1; r = ei_decode_select_shared(m.ctx, &bad[i], &d, shared, L->n, &k2); break;
            }
            if (r != want[i] || !strstr(ei_last_error(), ei_result_name(want[i])) ||
                !(strstr(ei_last_error(), "ei_exec") || strstr(ei_last_error(), "workspace")) ||
                memcmp(&d, &m.dec, sizeof d) || k2.n_kept != 0) {
                if (bad_count++ < 10)
                    printf("FAIL ei_exec %d (n_threads %d, ith %d, nth %d, workspace %s) on call %d: %s (%s), expected %s\n", i,
                           (int)bad[i].n_threads, (int)bad[i].ith, (int)bad[i].nth, bad[i].workspace ? "set" : "NULL", op,
                           ei_result_name(r), ei_last_error(), ei_result_name(want[i]));
            } else
                CHECK_ERR_REACHED(want[i]);
        }
    CHECK(bad_count == 0, "%d refusals of a bad ei_exec went wrong", bad_count);
    CHECK(!memcmp(snap_plan, m.pm, m.pb) && !memcmp(snap_dec, m.dm, m.db) && cp.n_tokens == 0,
          "a refused ei_exec wrote a plan or the decoder");
    {   /* no memory written: the outputs as they were */
        int clean = 1;
        size_t j;
        for (j = 0; j < (size_t)L->n; ++j) clean &= shared[j] == 0.0f;
        for (j = 0; j < m.ob / sizeof(float); ++j) clean &= out[j] == 0.0f;
        CHECK(clean, "a refused ei_exec wrote out or shared");
    }
    /* a workspace too small for the threads or parts it is cut into (one thread's, for 2) */
    e = ex(2, ws, s1.profile);
    CHECK_ERR(ei_profile(m.ctx, &e, &L->tq, &L->tk, &m.plan), EI_ERR_WORKSPACE);
    e = ex_part(1, 2, ws, s1.profile);
    CHECK_ERR(ei_profile(m.ctx, &e, &L->tq, &L->tk, &m.plan), EI_ERR_WORKSPACE);
    e = ex_part(1, 2, ws, s1.profile);
    CHECK_ERR(ei_profile_chunk(m.ctx, &e, &L->tq, &L->tk, &cp, 0, 1), EI_ERR_WORKSPACE);
    e = ex_part(2, 3, ws, s2.prefill);
    CHECK_ERR(ei_attention_prefill(m.ctx, &e, &L->tq, &L->tk, &L->tv, &m.plan, &o, 0), EI_ERR_WORKSPACE);
    e = ex_part(1, 2, ws, s1.decode);
    CHECK_ERR(ei_attention_decode(m.ctx, &e, &q1, &L->tk, &L->tv, NULL, &o1, L->n - 1), EI_ERR_WORKSPACE);
    e = ex(2, ws, s1.decode);
    CHECK_ERR(ei_attention_decode(m.ctx, &e, &q1, &L->tk, &L->tv, NULL, &o1, L->n - 1), EI_ERR_WORKSPACE);
    e = ex_part(1, 2, ws, s1.decode_keep);
    CHECK_ERR(ei_decode_score(m.ctx, &e, &m.dec, &L->tk, NULL, 0, scores), EI_ERR_WORKSPACE);
    e = ex(2, ws, s1.decode_keep);
    {
        ei_decoder d = m.dec;
        CHECK_ERR(ei_decode_keep(m.ctx, &e, &d, &L->tk, &ks), EI_ERR_WORKSPACE);
        /* keep sets in parts: refused, the message says what to call */
        e = ex_part(0, 2, ws, s2.decode_keep);
        CHECK_ERR(ei_decode_keep(m.ctx, &e, &d, &L->tk, &ks), EI_ERR_CONFIG);
        CHECK(strstr(ei_last_error(), "ei_decode_score") != NULL, "%s", ei_last_error());
    }
    CHECK(!memcmp(snap_plan, m.pm, m.pb), "a refused call wrote the plan");
    /* more parts than kv heads (4 over 2): the parts without one return EI_OK, and the plan after
       ei_plan_finalize is the one of a call on one thread, bit for bit */
    CHECK_ERR(ei_plan_init(m.ctx, &plan2, L->n, L->kv, L->dim, 0, NULL, 0), EI_OK);
    for (i = 0; i < 4; ++i) {
        e = ex_part(i, 4, ws, s4.profile);
        CHECK_ERR(ei_profile(m.ctx, &e, &L->tq, &L->tk, &plan2), EI_OK);
    }
    CHECK_ERR(ei_plan_finalize(m.ctx, &plan2), EI_OK);
    CHECK(plan2.n_tokens == m.plan.n_tokens && plan2.n_segments == m.plan.n_segments &&
              !memcmp(plan2.block_index, m.plan.block_index, sizeof(int32_t) * (size_t)m.plan.n_kv_heads *
                                                                  (size_t)m.plan.seg_capacity * (size_t)m.plan.max_keep) &&
              !memcmp(plan2.keep_count, m.plan.keep_count, sizeof(int32_t) * (size_t)m.plan.n_kv_heads * (size_t)m.plan.seg_capacity) &&
              !memcmp(plan2.entropy, m.plan.entropy, sizeof(float) * (size_t)m.plan.n_kv_heads * (size_t)m.plan.seg_capacity),
          "a plan made in 4 parts over 2 kv heads differs from the one of one thread");
    ei_plan_free(m.ctx, &plan2);
    /* a k of no kv heads in parts: every part's range is empty, yet the call is bad (every part refuses it) */
    k0.n_heads = 0;
    {
        ei_result r0, r1;
        e = ex_part(0, 2, ws, s2.profile);
        r0 = ei_profile(m.ctx, &e, &L->tq, &k0, &m.plan);
        e = ex_part(1, 2, ws, s2.profile);
        r1 = ei_profile_chunk(m.ctx, &e, &L->tq, &k0, &cp, 0, 1);
        known_gap(r0 == EI_ERR_SIZE && r1 == EI_ERR_SIZE,
                  gap_empty_parts);
        CHECK(!memcmp(snap_plan, m.pm, m.pb) && cp.n_tokens == 0, "a call with a k of no kv heads wrote a plan");
    }
    ei_plan_free(m.ctx, &cp);
    /* select, shared_add and select_shared in parts: part 0 does the work, the others return EI_OK writing nothing */
    {
        ei_decoder d = m.dec;
        ei_keep_set k2 = ks;
        ei_exec ek = ex(1, ws, s1.decode_keep), e1 = ex_part(1, 2, ws, s2.decode_keep), e0 = ex_part(0, 2, ws, s2.decode_keep);
        CHECK_ERR(ei_decode_score(m.ctx, &ek, &d, &L->tk, NULL, 0, scores), EI_OK);
        memset(index, 0x7f, sizeof(int32_t) * (size_t)L->kv * (size_t)m.c.decode_budget);
        CHECK_ERR(ei_decode_select(m.ctx, &e1, &d, scores, L->n, &k2), EI_OK);
        CHECK(k2.n_kept == 0 && index[0] == 0x7f7f7f7f && !memcmp(&d, &m.dec, sizeof d), "part 1 of a select wrote the keep set");
        CHECK_ERR(ei_decode_shared_add(m.ctx, &e1, &d, scores, L->n, NULL, shared), EI_OK);
        CHECK(shared[0] == 0.0f && !memcmp(&d, &m.dec, sizeof d), "part 1 of a shared_add wrote");
        CHECK_ERR(ei_decode_select(m.ctx, &e0, &d, scores, L->n, &k2), EI_OK);
        CHECK(k2.n_kept > 0 && index[0] != 0x7f7f7f7f, "part 0 of a select kept %d rows", (int)k2.n_kept);
    }
    CHECK(guard_intact(ws, s4.workspace) && guard_intact(out, m.ob) && guard_intact(index, sizeof(int32_t) * (size_t)L->kv * (size_t)m.c.decode_budget),
          "guards");
    guarded_free(ws); guarded_free(out); guarded_free(scores); guarded_free(shared); guarded_free(index);
    free(snap_plan); free(snap_dec);
    mu_free(&m);
}

/* ------------------------------------------------------------ threaded helpers */
/* tests/fuzz_regressions/profile_mt_worker_error_message.bin: when a worker
   thread of ei_profile on threads (ei_profile_mt in 0.1) fails (here: NaN in
   a kv head that thread 1 plans), the code comes back but the message must
   reach the calling thread too (ei_last_error is thread-local). */
static void test_mt_error_message(void) {
    synth_layer L = make_layer(300, 4, 2, 16, 21);
    ei_config c = small_config(EI_SIMD_AUTO);
    ei_context *ctx;
    ei_plan plan;
    size_t wb;
    void *ws;
    ei_tensor q = L.tq, k = L.tk;
    ei_result r;
    ei_exec e2;
    CHECK_ERR(ei_context_create(&c, &ctx), EI_OK);
    CHECK_ERR(ei_plan_init(ctx, &plan, L.n, L.kv, L.dim, 0, NULL, 0), EI_OK);
    wb = layer_sizes(ctx, L.n, L.heads, L.kv, L.dim, 0, 2).profile; /* for 2 threads */
    ws = guarded_alloc(wb);
    e2 = ex(2, ws, wb);
    L.k[(size_t)40 * L.kv * L.dim + 1 * L.dim + 2] = NAN;  /* kv head 1: the second thread's */
    (void)sizes_for(ctx, 10, 2, 2, 16, 0, 1, NULL);         /* leaves an EI_ERR_NULL message behind */
    r = ei_profile(ctx, &e2, &q, &k, &plan);
    CHECK(r == EI_ERR_NONFINITE, "ei_profile on 2 threads with NaN in kv head 1 returned %s", ei_result_name(r));
    CHECK(strstr(ei_last_error(), "EI_ERR_NONFINITE") != NULL,
          "ei_profile on 2 threads returned EI_ERR_NONFINITE from a worker thread, but the caller's ei_last_error() is '%s'",
          ei_last_error());
    CHECK(guard_intact(ws, wb), "workspace guard");
    guarded_free(ws);
    ei_plan_free(ctx, &plan);
    ei_context_destroy(ctx);
    synth_layer_free(&L);
}

/* ------------------------------------------------------------ fuzz regressions */
/* tests/fuzz_regressions/plan_from_other_context_overflow.bin: a plan laid out
   by a context with a small budget ceiling, profiled with a context with the
   same segment/block sizes and a larger base_budget. The rows of block_index
   hold max_keep entries; the second context keeps more blocks per row. The
   library must refuse (or clamp) instead of writing past the rows. */
static void test_plan_other_context(void) {
    synth_layer L = make_layer(1000, 4, 2, 32, 13);
    ei_config small = small_config(EI_SIMD_AUTO), large = small;
    ei_context *cs, *cl;
    ei_plan plan;
    size_t pb, wb;
    void *pm, *ws;
    ei_tensor q = L.tq, k = L.tk;
    int pass;
    large.base_budget = 2048;
    CHECK_ERR(ei_context_create(&small, &cs), EI_OK);
    CHECK_ERR(ei_context_create(&large, &cl), EI_OK);
    for (pass = 0; pass < 2; ++pass) {
        ei_result r;
        uint32_t flags = pass ? EI_PLAN_CHUNKED : 0;
        ei_sizes sz;
        ei_exec e;
        CHECK_ERR(sizes_for(cs, L.n, L.heads, L.kv, L.dim, flags, 1, &sz), EI_OK);
        pb = sz.plan;
        pm = guarded_alloc(pb);
        CHECK_ERR(ei_plan_init(cs, &plan, L.n, L.kv, L.dim, flags, pm, pb), EI_OK);
        wb = layer_sizes(cl, L.n, L.heads, L.kv, L.dim, flags, 1).profile;
        ws = guarded_alloc(wb);
        e = ex(1, ws, wb);
        r = pass ? ei_profile_chunk(cl, &e, &q, &k, &plan, plan.n_tokens, 1) : ei_profile(cl, &e, &q, &k, &plan);
        CHECK(guard_intact(pm, pb), "%s with another context's plan wrote past the plan memory (result %s)",
              pass ? "ei_profile_chunk" : "ei_profile", ei_result_name(r));
        if (r == EI_OK) {
            int32_t h, s, over = 0;
            for (h = 0; h < plan.n_kv_heads; ++h)
                for (s = 0; s < plan.n_segments; ++s)
                    if (plan.keep_count[(size_t)h * plan.seg_capacity + s] > plan.max_keep) over++;
            CHECK(over == 0, "%s accepted another context's plan and wrote %d rows longer than max_keep %d",
                  pass ? "ei_profile_chunk" : "ei_profile", over, plan.max_keep);
        } else
            CHECK(strstr(ei_last_error(), ei_result_name(r)) != NULL, "message names the code");
        guarded_free(ws);
        guarded_free(pm);
    }
    ei_context_destroy(cs);
    ei_context_destroy(cl);
    synth_layer_free(&L);
}

/* The regression above corrupts the heap when the bug is present: run it in
   a child process so the other tests still report. */
#if defined(__unix__) || defined(__APPLE__)
#include <sys/wait.h>
#include <unistd.h>
static void run_isolated(void (*fn)(void), const char *name) {
    pid_t pid;
    int status = 0;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        int before = failures;
        fn();
        fflush(stdout);
        _exit(failures > before ? 1 : 0);
    }
    checks++;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        failures++;
        printf("FAIL %s: %s (child %s %d)\n", name, "failed or crashed",
               pid > 0 && WIFSIGNALED(status) ? "killed by signal" : "exit status",
               pid > 0 && WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
}
#else
static void run_isolated(void (*fn)(void), const char *name) { (void)name; fn(); }
#endif

int main(void) {
    const char *e = getenv("EI_TEST_SIMD");
    printf("entropyinfer %s limits tests (SIMD: %s)\n", EI_VERSION_STRING, e && *e ? e : "all supported");
    test_size_arithmetic();
    test_plan_bytes();
    test_view_extent();
    test_nonfinite();
    test_antidiag_limits();
    test_decode_nonfinite();
    test_v_propagates();
    test_overlaps();
    test_alignment_rules();
    test_attention_nonfinite();
    test_edited_plan_decoder();
    test_placements();
    test_issue36_seals();
    test_issue36_int64_edges();
    test_issue36_chunk_mt_shares();
    test_layer_sizes_threads();
    test_exec_fields();
    test_every_code();
    test_mt_error_message();
    run_isolated(test_any_alignment, "test_any_alignment (fuzz_regressions/profile_workspace_unaligned_d33.bin)");
    run_isolated(test_plan_other_context, "test_plan_other_context (fuzz_regressions/plan_from_other_context_overflow.bin)");
    return check_summary();
}
