/* ei_bench.c - dense vs block-sparse prefill attention, and profiling cost.

   For each N: generate Q/K/V with one "rigid" kv-head family (attention sink
   plus mild locality: the block-level entropy is ~0) and one "dynamic" family
   (topics drifting along the sequence: entropy changes segment to segment),
   profile with ei_profile on `threads` threads, then time ei_attention_prefill
   on as many, dense (plan NULL) and sparse (the plan), and compare the
   outputs. One workspace (ei_layer_sizes' for the threads) serves every call.

     build/ei_bench [--n 8192,16384,32768] [--heads 8] [--kv-heads 2] [--dim 128]
                    [--threads 2] [--dtype f32|bf16|f16] [--simd auto|scalar|avx2|avx512]
                    [--segment 512] [--block 8] [--threshold 4096] [--budget 2048]
                    [--e-t 1e-5] [--delta 0.4] [--alpha 0.5] [--per-segment]
                    [--reps 1] [--json] [--peak] [--kernel auto|scalar|avx2|avx512|dpbf16|amx]
                    [--ranking reference|sampled|antidiagonal] [--samples 64] [--top-p P] [--sink B] [--local B]
                    [--quality]   (ei_config_quality's ranking, its rows and precision, top_p, sink and
                                   local blocks, budget cap)
                    [--rank-precision f32|int8]   (EI_RANK_SAMPLED's score arithmetic)
                    [--rank-rows even|spread]     (EI_RANK_SAMPLED's rows: even, or farthest-point)
                    [--chunk C]   (plan in chunks of C queries, ei_profile_chunk, as
                                   an engine's micro-batched prefill does; 0: whole prompt)

   Columns / JSON keys: n, threads, dtype, profile_ms, dense_ms, sparse_ms,
   dense_gflops = 4*N*N*dim*heads/2 / dense time, density = sparse FLOPs /
   dense FLOPs (from the plan: kept keys + causal segment keys vs keys 0..t),
   speedup = dense_ms / sparse_ms, efficiency = speedup * density,
   rel_err = ||sparse - dense|| / ||dense||, rigid = rigid kv heads.
   On a shared machine wall times are inflated by other processes; the
   table's cpuGF/s and cpu_spd (JSON: dense_cpu_ms, sparse_cpu_ms,
   dense_gflops_cpu) use process CPU time / threads instead. prof% is this
   configuration's profile time over dense attention time (wall), refprof%
   the reference ranking's (same data, same run); cpuprof% and cpuref% the
   same in CPU time (JSON: profile_cpu_pct_of_dense,
   reference_profile_cpu_pct_of_dense).
   --peak measures the machine's FMA throughput (f32 zmm/ymm FMA and
   vdpbf16ps: 12 independent accumulator chains per thread) on 1 and
   `threads` threads and exits. --kernel forces an attention kernel
   (dpbf16: the vdpbf16ps kernel, off by default). EI_BENCH_HEAD_ERR=1 in
   the environment prints rel_err per kv head. */
#define _POSIX_C_SOURCE 200809L
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
/* CPU time of the whole process: on a shared machine, cpu_ms / threads is
   what the call would take with its threads never descheduled. */
static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static const char *ranking_name(ei_ranking r) {
    return r == EI_RANK_SAMPLED ? "sampled" : r == EI_RANK_ANTIDIAGONAL ? "antidiagonal" : "reference";
}

/* Profile the whole prompt (chunk 0: ei_profile) or in chunks of `chunk`
   queries from position 0 (ei_profile_chunk, a chunked plan), as x says. */
static ei_result profile_run(const ei_context *ctx, const ei_exec *x, const ei_tensor *tq, const ei_tensor *tk,
                             ei_plan *plan, int64_t chunk) {
    int64_t t0;
    ei_result er;
    if (chunk <= 0) return ei_profile(ctx, x, tq, tk, plan);
    if ((er = ei_plan_reset(plan)) != EI_OK) return er;
    for (t0 = 0; t0 < tq->n_tokens; t0 += chunk) {
        ei_tensor qc = *tq, kc = *tk;
        size_t es = tq->dtype == EI_F32 ? 4 : 2;
        qc.n_tokens = t0 + chunk < tq->n_tokens ? chunk : tq->n_tokens - t0;
        qc.data = (const unsigned char *)tq->data + (size_t)t0 * (size_t)tq->token_stride * es;
        kc.n_tokens = t0 + qc.n_tokens;
        if ((er = ei_profile_chunk(ctx, x, &qc, &kc, plan, t0, t0 + qc.n_tokens == tq->n_tokens)) != EI_OK)
            return er;
    }
    return EI_OK;
}

/* ---- peak FLOP rate -------------------------------------------------- */
typedef struct peak_job { int kind; double flops; long iters; } peak_job;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PEAK_BODY(T, ZERO, OP, n)                                                         \
    T a0 = ZERO, a1 = ZERO, a2 = ZERO, a3 = ZERO, a4 = ZERO, a5 = ZERO, a6 = ZERO, a7 = ZERO, \
      a8 = ZERO, a9 = ZERO, a10 = ZERO, a11 = ZERO;                                       \
    long i;                                                                               \
    for (i = 0; i < n; ++i) {                                                             \
        OP(a0); OP(a1); OP(a2); OP(a3); OP(a4); OP(a5);                                   \
        OP(a6); OP(a7); OP(a8); OP(a9); OP(a10); OP(a11);                                 \
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5)); \
        __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11)); \
    }
__attribute__((target("avx512f"))) static float peak_zmm(long n, float xs, float ys) {
    const __m512 x = _mm512_set1_ps(xs), y = _mm512_set1_ps(ys);
#define OPZ(a) a = _mm512_fmadd_ps(x, y, a)
    PEAK_BODY(__m512, _mm512_setzero_ps(), OPZ, n)
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                              _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)))));
}
__attribute__((target("avx2,fma"))) static float peak_ymm(long n, float xs, float ys) {
    const __m256 x = _mm256_set1_ps(xs), y = _mm256_set1_ps(ys);
#define OPY(a) a = _mm256_fmadd_ps(x, y, a)
    PEAK_BODY(__m256, _mm256_setzero_ps(), OPY, n)
    {
        float t[8];
        int k;
        float s = 0;
        _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                          _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)),
                                                        _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)))));
        for (k = 0; k < 8; ++k) s += t[k];
        return s;
    }
}
#ifdef EI__HAVE_AVX512BF16
EI__TARGET_AVX512BF16 static float peak_bf16(long n, int xs, int ys) {
    const __m512i x = _mm512_set1_epi32(xs), y = _mm512_set1_epi32(ys);
#define OPB(a) a = _mm512_dpbf16_ps(a, (__m512bh)x, (__m512bh)y)
    PEAK_BODY(__m512, _mm512_setzero_ps(), OPB, n)
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                              _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)))));
}
#endif
static volatile float g_sink;
static void *peak_worker(void *arg) {
    peak_job *j = (peak_job *)arg;
    if (j->kind == 0) { g_sink = peak_zmm(j->iters, 1.0f, 1e-9f); j->flops = 12.0 * 32 * (double)j->iters; }
    if (j->kind == 1) { g_sink = peak_ymm(j->iters, 1.0f, 1e-9f); j->flops = 12.0 * 16 * (double)j->iters; }
#ifdef EI__HAVE_AVX512BF16
    if (j->kind == 2) { g_sink = peak_bf16(j->iters, 0x3f803f80, 0x30003000); j->flops = 12.0 * 64 * (double)j->iters; }
#endif
    return NULL;
}
static double peak_run(int kind, int threads) {
    pthread_t tid[64];
    peak_job jobs[64];
    double t0, t1, fl = 0;
    int t;
    for (t = 0; t < threads; ++t) { jobs[t].kind = kind; jobs[t].iters = 20000000; jobs[t].flops = 0; }
    t0 = now_ms();
    for (t = 1; t < threads; ++t) pthread_create(&tid[t], NULL, peak_worker, &jobs[t]);
    peak_worker(&jobs[0]);
    for (t = 1; t < threads; ++t) pthread_join(tid[t], NULL);
    t1 = now_ms();
    for (t = 0; t < threads; ++t) fl += jobs[t].flops;
    return fl / ((t1 - t0) * 1e-3) * 1e-9;
}
static void peak(int threads) {
    const char *names[3] = {"f32 FMA zmm (vfmadd231ps)", "f32 FMA ymm (vfmadd231ps)", "bf16 dot (vdpbf16ps zmm)"};
    int kind, nt;
    for (kind = 0; kind < 3; ++kind) {
        if (kind == 0 && !ei_cpu_supports(EI_SIMD_AVX512)) continue;
        if (kind == 1 && !ei_cpu_supports(EI_SIMD_AVX2)) continue;
        if (kind == 2 && !ei_cpu_supports(EI_SIMD_AVX512_BF16)) continue;
        for (nt = 1; nt <= threads; nt = nt == threads ? threads + 1 : threads) {
            double best = 0, g;
            int r;
            for (r = 0; r < 3; ++r) { g = peak_run(kind, nt); if (g > best) best = g; }
            printf("%-28s %2d thread%s %8.1f GFLOP/s\n", names[kind], nt, nt > 1 ? "s" : " ", best);
        }
    }
}
#else
static void peak(int threads) { (void)threads; printf("--peak: x86-64 only\n"); }
#endif

/* The CPU's model name (Linux: /proc/cpuinfo), for the record. */
static const char *cpu_model(void) {
    static char name[160] = "unknown";
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return name;
    while (fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (c && (!strncmp(line, "model name", 10) || !strncmp(line, "Model", 5))) {
            size_t n;
            c += 2;
            n = strcspn(c, "\n");
            if (n >= sizeof name) n = sizeof name - 1;
            memcpy(name, c, n);
            name[n] = 0;
            break;
        }
    }
    fclose(f);
    return name;
}

/* ---- data ------------------------------------------------------------- */
static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static double rnd_n(void) {
    double s = 0;
    int i;
    for (i = 0; i < 4; ++i) {
        g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
        s += (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
    }
    return (s - 2.0) * 1.7320508;
}
/* kv heads with even index: rigid (sink at tokens 0..7, mild locality);
   odd index: dynamic (16 topics; keys follow a topic that changes every
   ~700 tokens, queries look back to a recent or an older topic). */
static void make_data(float *q, float *k, float *v, int64_t n, int32_t H, int32_t HK, int32_t d) {
    int32_t G = H / HK, h, g, i, z;
    int64_t t;
    float *topics = (float *)malloc((size_t)16 * (size_t)d * sizeof(float));
    for (z = 0; z < 16; ++z) {
        double nrm = 0;
        for (i = 0; i < d; ++i) { topics[z * d + i] = (float)rnd_n(); nrm += topics[z * d + i] * topics[z * d + i]; }
        for (i = 0; i < d; ++i) topics[z * d + i] /= (float)sqrt(nrm);
    }
    for (t = 0; t < n; ++t)
        for (h = 0; h < HK; ++h) {
            float *kr = k + ((size_t)t * (size_t)HK + (size_t)h) * (size_t)d, *vr = v + ((size_t)t * (size_t)HK + (size_t)h) * (size_t)d;
            int zk = (int)((t / 700 + (t / 2900) * 3) % 16);
            for (i = 0; i < d; ++i) { kr[i] = (float)(0.3 * rnd_n()); vr[i] = (float)rnd_n(); }
            if (h % 2 == 0) {
                if (t < 8) kr[0] += 20.0f; /* one sink block */
                kr[1] += 3.0f * (float)cos((double)t / 64.0);
                kr[2] += 3.0f * (float)sin((double)t / 64.0);
            } else
                for (i = 0; i < d; ++i) kr[i] += 9.0f * topics[zk * d + i];
            for (g = 0; g < G; ++g) {
                float *qr = q + ((size_t)t * (size_t)H + (size_t)(h * G + g)) * (size_t)d;
                for (i = 0; i < d; ++i) qr[i] = (float)(0.3 * rnd_n());
                if (h % 2 == 0) {
                    qr[0] += 8.0f;
                    qr[1] += 3.0f * (float)cos((double)t / 64.0);
                    qr[2] += 3.0f * (float)sin((double)t / 64.0);
                } else {
                    int64_t back = (t / 512) % 3 == 2 ? 3000 : 50 * g;
                    int64_t tz = t > back ? t - back : 0;
                    int zq = (int)((tz / 700 + (tz / 2900) * 3) % 16);
                    for (i = 0; i < d; ++i) qr[i] += 9.0f * topics[zq * d + i];
                }
            }
        }
    free(topics);
}
static void convert(const float *src, size_t n, ei_dtype dt, void *dst) {
    size_t i;
    if (dt == EI_F32) { memcpy(dst, src, n * 4); return; }
    for (i = 0; i < n; ++i) ei__store1(dst, dt, (int64_t)i, src[i]);
}

/* FLOPs (4 d per query row and key) of the attention a plan runs. */
static double plan_flops(const ei_context *ctx, const ei_plan *plan, int64_t n, int32_t H, int32_t HK, int32_t d) {
    int32_t seg = ctx->cfg.segment_size, bs = ctx->cfg.block_size, G = H / HK, h, s;
    double keys = 0;
    for (h = 0; h < HK; ++h)
        for (s = 0; s * (int64_t)seg < n; ++s) {
            int64_t t0 = (int64_t)s * seg, t1 = t0 + seg < n ? t0 + seg : n, rows = t1 - t0;
            if (plan && ei_plan_segment_is_sparse(ctx, plan, s))
                keys += (double)rows * (double)plan->keep_count[(size_t)h * (size_t)plan->seg_capacity + (size_t)s] * bs +
                        (double)rows * (double)(rows + 1) / 2;
            else
                keys += (double)rows * (double)t0 + (double)rows * (double)(rows + 1) / 2;
        }
    return keys * G * 4.0 * d;
}

static void usage(void) {
    puts("usage: ei_bench [--n 8192,16384,32768] [--heads 8] [--kv-heads 2] [--dim 128] [--threads 2]\n"
         "                [--dtype f32|bf16|f16] [--simd auto|scalar|avx2|avx512] [--segment 512] [--block 8]\n"
         "                [--threshold 4096] [--budget 2048] [--e-t 1e-5] [--delta 0.4] [--alpha 0.5]\n"
         "                [--per-segment] [--reps 1] [--json] [--peak] [--kernel auto|scalar|avx2|avx512|dpbf16|amx]\n"
         "                [--ranking reference|sampled|antidiagonal] [--samples 64] [--top-p P] [--sink B] [--local B] [--quality]\n"
         "                [--rank-precision f32|int8] [--rank-rows even|spread] [--chunk C]");
}

int main(int argc, char **argv) {
    int64_t ns[16] = {8192, 16384, 32768};
    int n_ns = 3, json = 0, threads = 2, reps = 1, a, ni;
    int64_t chunk = 0; /* --chunk: queries per planning call, 0 = whole prompt */
    int32_t H = 8, HK = 2, d = 128;
    ei_dtype dt = EI_F32;
    ei_config cfg = ei_config_default();
    for (a = 1; a < argc; ++a) {
        const char *o = argv[a], *val = a + 1 < argc ? argv[a + 1] : NULL;
#define TAKE (val ? (++a, val) : (usage(), exit(2), ""))
        if (!strcmp(o, "--json")) json = 1;
        else if (!strcmp(o, "--peak")) { peak(threads); return 0; }
        else if (!strcmp(o, "--per-segment")) cfg.per_segment_budget = 1;
        else if (!strcmp(o, "--n")) {
            char *s = (char *)TAKE, *e;
            n_ns = 0;
            while (*s && n_ns < 16) { ns[n_ns++] = strtoll(s, &e, 10); s = *e ? e + 1 : e; }
        } else if (!strcmp(o, "--heads")) H = atoi(TAKE);
        else if (!strcmp(o, "--kv-heads")) HK = atoi(TAKE);
        else if (!strcmp(o, "--dim")) d = atoi(TAKE);
        else if (!strcmp(o, "--threads")) threads = atoi(TAKE);
        else if (!strcmp(o, "--reps")) reps = atoi(TAKE);
        else if (!strcmp(o, "--dtype")) {
            const char *s = TAKE;
            dt = !strcmp(s, "bf16") ? EI_BF16 : !strcmp(s, "f16") ? EI_F16 : EI_F32;
        } else if (!strcmp(o, "--simd") || !strcmp(o, "--kernel")) { /* default: what EI_SIMD_AUTO picks */
            const char *s = TAKE;
            if (!strcmp(s, "auto")) cfg.simd = EI_SIMD_AUTO;
            else if (!strcmp(s, "scalar")) cfg.simd = EI_SIMD_SCALAR;
            else if (!strcmp(s, "avx2")) cfg.simd = EI_SIMD_AVX2;
            else if (!strcmp(s, "avx512")) cfg.simd = EI_SIMD_AVX512;
            else if (!strcmp(s, "dpbf16") || !strcmp(s, "avx512-bf16")) cfg.simd = EI_SIMD_AVX512_BF16;
            else if (!strcmp(s, "amx")) cfg.simd = EI_SIMD_AMX;
            else if (!strcmp(s, "neon")) cfg.simd = EI_SIMD_NEON;
            else if (!strcmp(s, "neon-bf16")) cfg.simd = EI_SIMD_NEON_BF16;
            else if (!strcmp(s, "neon-bfmmla")) cfg.simd = EI_SIMD_NEON_BFMMLA;
            else if (!strcmp(s, "neon-fhm")) cfg.simd = EI_SIMD_NEON_FHM;
            else {
                fprintf(stderr, "ei_bench: unknown kernel '%s' (auto, scalar, avx2, avx512, dpbf16, amx, neon, neon-bf16, "
                        "neon-bfmmla, neon-fhm)\n", s);
                return 2;
            }
            if (!ei_cpu_supports(cfg.simd)) {
                fprintf(stderr, "ei_bench: kernel '%s' is not available on this CPU, OS or build\n", s);
                return 2;
            }
        } else if (!strcmp(o, "--segment")) cfg.segment_size = atoi(TAKE);
        else if (!strcmp(o, "--block")) cfg.block_size = atoi(TAKE);
        else if (!strcmp(o, "--threshold")) cfg.threshold_len = atoll(TAKE);
        else if (!strcmp(o, "--budget")) cfg.base_budget = atoi(TAKE);
        else if (!strcmp(o, "--e-t")) cfg.rigid_entropy = atof(TAKE);
        else if (!strcmp(o, "--delta")) cfg.delta_t = atof(TAKE);
        else if (!strcmp(o, "--alpha")) cfg.alpha = atof(TAKE);
        else if (!strcmp(o, "--quality")) { /* the preset, keeping the shape options given before it */
            ei_config qc = ei_config_quality();
            cfg.ranking = qc.ranking; cfg.rank_samples = qc.rank_samples; cfg.top_p = qc.top_p;
            cfg.sink_blocks = qc.sink_blocks; cfg.local_blocks = qc.local_blocks;
            cfg.rank_rows = qc.rank_rows; cfg.rank_precision = qc.rank_precision;
            cfg.budget_max_factor = qc.budget_max_factor;
        } else if (!strcmp(o, "--ranking")) {
            const char *v = TAKE;
            cfg.ranking = !strcmp(v, "sampled") ? EI_RANK_SAMPLED : !strcmp(v, "antidiagonal") ? EI_RANK_ANTIDIAGONAL : EI_RANK_REFERENCE;
        } else if (!strcmp(o, "--samples") || !strcmp(o, "--rank-samples")) cfg.rank_samples = atoi(TAKE);
        else if (!strcmp(o, "--rank-precision")) {
            const char *v = TAKE;
            if (!strcmp(v, "int8")) cfg.rank_precision = EI_RANK_PRECISION_INT8;
            else if (!strcmp(v, "f32")) cfg.rank_precision = EI_RANK_PRECISION_F32;
            else { fprintf(stderr, "ei_bench: unknown rank precision '%s' (f32, int8)\n", v); return 2; }
        } else if (!strcmp(o, "--rank-rows")) {
            const char *v = TAKE;
            if (!strcmp(v, "spread")) cfg.rank_rows = EI_RANK_ROWS_SPREAD;
            else if (!strcmp(v, "even")) cfg.rank_rows = EI_RANK_ROWS_EVEN;
            else { fprintf(stderr, "ei_bench: unknown rank rows '%s' (even, spread)\n", v); return 2; }
        }
        else if (!strcmp(o, "--top-p")) cfg.top_p = atof(TAKE);
        else if (!strcmp(o, "--sink")) cfg.sink_blocks = atoi(TAKE);
        else if (!strcmp(o, "--local")) cfg.local_blocks = atoi(TAKE);
        else if (!strcmp(o, "--chunk")) chunk = atoll(TAKE);
        else { usage(); return 2; }
#undef TAKE
    }
    if (threads < 1 || H <= 0 || HK <= 0 || H % HK || d <= 0 || reps < 1 || chunk < 0) { usage(); return 2; }
    if (!json) {
        ei_context *c0;
        if (ei_context_create(&cfg, &c0) != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); return 1; }
        printf("cpu: %s; vdpbf16ps / f32 FMA FLOP rate %.2f (measured at context creation; >= 1.25: AUTO runs bf16 "
               "attention with vdpbf16ps)\n", cpu_model(), ei_cpu_dpbf16_ratio());
        printf("entropyinfer %s  simd %s%s  heads %d/%d  dim %d  threads %d  dtype %s  segment %d block %d threshold %lld budget %d"
               "  ranking %s samples %d (%s%s) top_p %g sink %d local %d\n",
               EI_VERSION_STRING, ei_simd_name(ei_context_config(c0)->simd), ei_cpu_supports(EI_SIMD_AVX512_BF16) ? "+bf16" : "", H, HK, d, threads,
               dt == EI_F32 ? "f32" : dt == EI_BF16 ? "bf16" : "f16", cfg.segment_size, cfg.block_size,
               (long long)cfg.threshold_len, cfg.base_budget, ranking_name(cfg.ranking),
               cfg.rank_samples, cfg.rank_precision == EI_RANK_PRECISION_INT8 ? "int8" : "f32",
               cfg.rank_rows == EI_RANK_ROWS_SPREAD ? ", spread rows" : "", cfg.top_p,
               cfg.sink_blocks, cfg.local_blocks);
        printf("%7s %4s %5s %10s %10s %10s %9s %8s %8s %7s %10s %6s %6s %9s %8s %9s %9s %9s\n", "N", "thr", "dtype", "profile_ms", "dense_ms",
               "sparse_ms", "dense_GF/s", "density", "speedup", "effic", "rel_err", "prof%", "rigid", "cpuGF/s", "cpu_spd",
               "refprof%", "cpuprof%", "cpuref%");
        ei_context_destroy(c0);
    }
    for (ni = 0; ni < n_ns; ++ni) {
        int64_t n = ns[ni];
        size_t nq = (size_t)n * (size_t)H * (size_t)d, nk = (size_t)n * (size_t)HK * (size_t)d, es = dt == EI_F32 ? 4 : 2;
        float *qf = (float *)malloc(nq * 4), *kf = (float *)malloc(nk * 4), *vf = (float *)malloc(nk * 4);
        void *qd = malloc(nq * es), *kd = malloc(nk * es), *vd = malloc(nk * es);
        float *od = (float *)malloc(nq * 4), *os = (float *)malloc(nq * 4);
        ei_context *ctx;
        ei_plan plan;
        ei_tensor tq, tk, tv;
        ei_out_tensor to_d, to_s;
        ei_shape shape;
        ei_sizes sizes;
        ei_exec x; /* every call: `threads` threads, one workspace */
        double t_prof = 1e300, t_ref_prof = 1e300, c_prof = 1e300, c_ref_prof = 1e300, t_dense = 1e300, t_sparse = 1e300, t, c, num = 0, den = 0, dense_fl, sparse_fl;
        double c_dense = 1e300, c_sparse = 1e300;
        int r, rigid = 0, h;
        ei_result er;
        if (!qf || !kf || !vf || !qd || !kd || !vd || !od || !os) { fprintf(stderr, "out of memory\n"); return 1; }
        if (ei_context_create(&cfg, &ctx) != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); return 1; }
        make_data(qf, kf, vf, n, H, HK, d);
        convert(qf, nq, dt, qd); convert(kf, nk, dt, kd); convert(vf, nk, dt, vd);
        free(qf); free(kf); free(vf);
        tq = ei_tensor_make(qd, dt, n, H, d);
        tk = ei_tensor_make(kd, dt, n, HK, d);
        tv = ei_tensor_make(vd, dt, n, HK, d);
        to_d = ei_out_tensor_make(od, EI_F32, n, H, d);
        to_s = ei_out_tensor_make(os, EI_F32, n, H, d);
        memset(&shape, 0, sizeof shape);
        shape.max_tokens = n;
        shape.n_heads = H;
        shape.n_kv_heads = HK;
        shape.head_dim = d;
        shape.plan_flags = chunk > 0 ? EI_PLAN_CHUNKED : 0;
        shape.n_threads = threads;
        if (ei_plan_init(ctx, &plan, n, HK, d, shape.plan_flags, NULL, 0) != EI_OK ||
            ei_layer_sizes(ctx, &shape, &sizes) != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); return 1; }
        memset(&x, 0, sizeof x);
        x.n_threads = threads;
        x.workspace_bytes = sizes.workspace;
        if (!(x.workspace = malloc(sizes.workspace ? sizes.workspace : 1))) { fprintf(stderr, "out of memory\n"); return 1; }
        for (r = 0; r < reps; ++r) {
            c = cpu_ms();
            t = now_ms();
            er = profile_run(ctx, &x, &tq, &tk, &plan, chunk);
            t = now_ms() - t;
            c = (cpu_ms() - c) / threads;
            if (er != EI_OK) { fprintf(stderr, "profile: %s\n", ei_last_error()); return 1; }
            if (t < t_prof) t_prof = t;
            if (c < c_prof) c_prof = c;
        }
        { /* the reference ranking's profile, same data, for its cost beside this configuration's */
            ei_config rc = cfg;
            ei_context *rctx;
            ei_plan rplan;
            rc.ranking = EI_RANK_REFERENCE; rc.top_p = 0.0; rc.sink_blocks = rc.local_blocks = 0;
            if (ei_context_create(&rc, &rctx) != EI_OK || ei_plan_init(rctx, &rplan, n, HK, d, shape.plan_flags, NULL, 0) != EI_OK) {
                fprintf(stderr, "%s\n", ei_last_error());
                return 1;
            }
            for (r = 0; r < reps; ++r) {
                c = cpu_ms();
                t = now_ms();
                er = profile_run(rctx, &x, &tq, &tk, &rplan, chunk);
                t = now_ms() - t;
                c = (cpu_ms() - c) / threads;
                if (er != EI_OK) { fprintf(stderr, "reference profile: %s\n", ei_last_error()); return 1; }
                if (t < t_ref_prof) t_ref_prof = t;
                if (c < c_ref_prof) c_ref_prof = c;
            }
            ei_plan_free(rctx, &rplan);
            ei_context_destroy(rctx);
        }
        for (r = 0; r < reps; ++r) {
            c = cpu_ms();
            t = now_ms();
            er = ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, &to_d, 0);
            t = now_ms() - t;
            c = (cpu_ms() - c) / threads;
            if (er != EI_OK) { fprintf(stderr, "dense: %s\n", ei_last_error()); return 1; }
            if (t < t_dense) t_dense = t;
            if (c < c_dense) c_dense = c;
            c = cpu_ms();
            t = now_ms();
            er = ei_attention_prefill(ctx, &x, &tq, &tk, &tv, &plan, &to_s, 0);
            t = now_ms() - t;
            c = (cpu_ms() - c) / threads;
            if (er != EI_OK) { fprintf(stderr, "sparse: %s\n", ei_last_error()); return 1; }
            if (t < t_sparse) t_sparse = t;
            if (c < c_sparse) c_sparse = c;
        }
        {
            size_t i;
            for (i = 0; i < nq; ++i) {
                double e = (double)os[i] - (double)od[i];
                num += e * e;
                den += (double)od[i] * (double)od[i];
            }
        }
        for (h = 0; h < HK; ++h) rigid += plan.head_class[h] == EI_HEAD_RIGID;
        if (getenv("EI_BENCH_HEAD_ERR")) { /* per kv head: class and rel_err (diagnostics) */
            for (h = 0; h < HK; ++h) {
                double nu = 0, de = 0;
                size_t tk2, g2, i2;
                for (tk2 = 0; tk2 < (size_t)n; ++tk2)
                    for (g2 = 0; g2 < (size_t)(H / HK); ++g2)
                        for (i2 = 0; i2 < (size_t)d; ++i2) {
                            size_t ix = (tk2 * (size_t)H + (size_t)h * (size_t)(H / HK) + g2) * (size_t)d + i2;
                            nu += ((double)os[ix] - od[ix]) * ((double)os[ix] - od[ix]);
                            de += (double)od[ix] * od[ix];
                        }
                fprintf(stderr, "kv head %d: %s rel_err %.3e\n", h, plan.head_class[h] == EI_HEAD_RIGID ? "rigid" : "dynamic",
                        sqrt(nu / de));
            }
        }
        dense_fl = plan_flops(ctx, NULL, n, H, HK, d);
        sparse_fl = plan_flops(ctx, &plan, n, H, HK, d);
        {
            double gflops = 4.0 * (double)n * (double)n * d * H / 2.0 / (t_dense * 1e-3) * 1e-9;
            double density = sparse_fl / dense_fl, speedup = t_dense / t_sparse, rel = sqrt(num / (den > 0 ? den : 1));
            const char *dts = dt == EI_F32 ? "f32" : dt == EI_BF16 ? "bf16" : "f16";
            if (json)
                printf("{\"n\": %lld, \"threads\": %d, \"dtype\": \"%s\", \"heads\": %d, \"kv_heads\": %d, \"dim\": %d, "
                       "\"profile_ms\": %.3f, \"dense_ms\": %.3f, \"sparse_ms\": %.3f, \"dense_gflops\": %.2f, "
                       "\"density\": %.4f, \"speedup\": %.3f, \"efficiency\": %.3f, \"rel_err\": %.3e, "
                       "\"profile_pct_of_dense\": %.3f, \"rigid_kv_heads\": %d, \"simd\": \"%s%s\", "
                       "\"dense_cpu_ms\": %.3f, \"sparse_cpu_ms\": %.3f, \"dense_gflops_cpu\": %.2f, "
                       "\"ranking\": \"%s\", \"reference_profile_ms\": %.3f, \"reference_profile_pct_of_dense\": %.3f, "
                       "\"profile_cpu_pct_of_dense\": %.3f, \"reference_profile_cpu_pct_of_dense\": %.3f}\n",
                       (long long)n, threads, dts, H, HK, d, t_prof, t_dense, t_sparse, gflops, density, speedup,
                       speedup * density, rel, 100.0 * t_prof / t_dense, rigid, ei_simd_name(ei_context_config(ctx)->simd),
                       ei_context_config(ctx)->simd == EI_SIMD_AVX512_BF16 ? "+dpbf16" : "",
                       c_dense, c_sparse, gflops * t_dense / c_dense, ranking_name(cfg.ranking),
                       t_ref_prof, 100.0 * t_ref_prof / t_dense, 100.0 * c_prof / c_dense, 100.0 * c_ref_prof / c_dense);
            else
                printf("%7lld %4d %5s %10.1f %10.1f %10.1f %9.1f %8.4f %8.2f %7.3f %10.2e %6.2f %3d/%d %9.1f %8.1f %9.2f %9.2f %9.2f\n",
                       (long long)n, threads, dts, t_prof, t_dense, t_sparse, gflops, density, speedup, speedup * density,
                       rel, 100.0 * t_prof / t_dense, rigid, HK, gflops * t_dense / c_dense, c_dense / c_sparse,
                       100.0 * t_ref_prof / t_dense, 100.0 * c_prof / c_dense, 100.0 * c_ref_prof / c_dense);
            fflush(stdout);
        }
        free(x.workspace); free(qd); free(kd); free(vd); free(od); free(os);
        ei_plan_free(ctx, &plan);
        ei_context_destroy(ctx);
    }
    return 0;
}
