/* bench_rank: time to profile one layer with the sampled ranking
   (ei_config_quality: EI_RANK_SAMPLED, top-p 0.95, sink 1, local 8) at
   rows R, its scores in f32 (with even and with spread rows,
   EI_RANK_ROWS_SPREAD) and in int8 (EI_RANK_PRECISION_INT8), on every
   x86 SIMD path this CPU has (avx2 and up) and, for int8, every x86 dot it has (vpdpbusd on
   zmm and ymm, int16 vpmaddwd), with the reference ranking's time beside
   (the part every ranking pays: entropies, head classes, budgets).
   usage: bench_rank [n_tokens=32768] [heads=4] [kv_heads=1] [dim=256] [threads=2] [reps=3] [rows=64,128] [dtype=bf16|f32]
   Prints the best of reps runs in ms, one row per (path, precision, dot,
   rows). Data: examples/synth_qk.h, as bench_profile. Every call runs on
   `threads` threads with one workspace (ei_layer_sizes' for them); a warm-up
   call first, so the workspace's pages are mapped before the timed ones. */
#define _POSIX_C_SOURCE 200809L
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "../examples/synth_qk.h"
#include "ei_bench_common.h"

/* The best of reps ei_profile calls (after one untimed) in ms; < 0: refused. */
static double time_profile(const ei_config *c, int i8dot, const ei_tensor *qt, const ei_tensor *kt, int threads, int reps) {
    ei_context *ctx;
    ei_plan plan;
    ei_shape shape;
    ei_sizes sizes;
    ei_exec x;
    double best = 1e30;
    int r;
    memset(&shape, 0, sizeof shape);
    memset(&x, 0, sizeof x);
    shape.max_tokens = qt->n_tokens;
    shape.n_heads = qt->n_heads;
    shape.n_kv_heads = kt->n_heads;
    shape.head_dim = qt->head_dim;
    shape.n_threads = threads;
    if (ei_context_create(c, &ctx) != EI_OK) return -1;
    if (i8dot >= 0) ctx->i8dot = i8dot; /* (the library's private field: force one dot) */
    if (ei_plan_init(ctx, &plan, qt->n_tokens, kt->n_heads, qt->head_dim, 0, NULL, 0) != EI_OK ||
        ei_layer_sizes(ctx, &shape, &sizes) != EI_OK) {
        fprintf(stderr, "%s\n", ei_last_error());
        exit(1);
    }
    x.n_threads = threads;
    x.workspace_bytes = sizes.profile;
    if (!(x.workspace = malloc(sizes.profile ? sizes.profile : 1))) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (r = -1; r < reps; ++r) {
        double t0 = now_ms();
        if (ei_profile(ctx, &x, qt, kt, &plan) != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); exit(1); }
        t0 = now_ms() - t0;
        if (r >= 0 && t0 < best) best = t0;
    }
    free(x.workspace);
    ei_plan_free(ctx, &plan);
    ei_context_destroy(ctx);
    return best;
}

int main(int argc, char **argv) {
    static const struct { int bit; const char *name; } dots[] = {
        {2, "vpdpbusd zmm"}, {1, "vpdpbusd ymm"}, {0, "vpmaddwd"}};
    long n = argc > 1 ? atol(argv[1]) : 32768;
    int heads = argc > 2 ? atoi(argv[2]) : 4, kv = argc > 3 ? atoi(argv[3]) : 1, dim = argc > 4 ? atoi(argv[4]) : 256;
    int threads = argc > 5 ? atoi(argv[5]) : 2, reps = argc > 6 ? atoi(argv[6]) : 3;
    const char *rows_arg = argc > 7 ? argv[7] : "64,128";
    int bf16 = argc > 8 ? strcmp(argv[8], "f32") != 0 : 1;
    size_t nq = (size_t)n * heads * dim, nk = (size_t)n * kv * dim, i;
    float *q = (float *)malloc(nq * 4), *k = (float *)malloc(nk * 4);
    uint16_t *q16 = (uint16_t *)malloc(nq * 2), *k16 = (uint16_t *)malloc(nk * 2);
    int rows[8], n_rows = 0, p, ri, di, have = 0;
    ei_tensor qt, kt;
    const char *s = rows_arg;
    if (!q || !k || !q16 || !k16 || heads % kv || threads < 1 || reps < 1) { fprintf(stderr, "bad arguments or out of memory\n"); return 1; }
    while (*s && n_rows < 8) {
        char *e;
        rows[n_rows++] = (int)strtol(s, &e, 10);
        s = *e ? e + 1 : e;
    }
    synth_qk(q, k, n, heads, kv, dim, 512, 3, 42);
    for (i = 0; i < nq; ++i) q16[i] = synth_bf16(q[i]);
    for (i = 0; i < nk; ++i) k16[i] = synth_bf16(k[i]);
    qt = ei_tensor_make(bf16 ? (const void *)q16 : (const void *)q, bf16 ? EI_BF16 : EI_F32, n, heads, dim);
    kt = ei_tensor_make(bf16 ? (const void *)k16 : (const void *)k, bf16 ? EI_BF16 : EI_F32, n, kv, dim);
#if defined(EI__HAVE_AVX512VNNI) || defined(EI__HAVE_AVXVNNI)
    have = ei__cpu_i8dot();
#endif
    printf("profile one layer, sampled ranking (ei_config_quality): %ld tokens, %d heads, %d kv heads, dim %d, %s, %d threads, "
           "best of %d; int8 dots here:%s%s vpmaddwd\n",
           n, heads, kv, dim, bf16 ? "bf16" : "f32", threads, reps, have & 2 ? " vpdpbusd-zmm" : "", have & 1 ? " vpdpbusd-ymm" : "");
    printf("%-12s %-5s %-13s %5s %10s %12s\n", "simd", "prec", "dot", "rows", "ms", "reference_ms");
    for (p = EI_SIMD_AVX512_BF16; p >= EI_SIMD_AVX2; --p) { /* (the scalar path takes minutes at 32k) */
        ei_config c = ei_config_quality();
        double ref;
        if (p == EI_SIMD_NEON || !ei_cpu_supports((ei_simd)p)) continue;
        c.simd = (ei_simd)p;
        c.ranking = EI_RANK_REFERENCE;
        ref = time_profile(&c, -1, &qt, &kt, threads, reps);
        for (ri = 0; ri < n_rows; ++ri) {
            c = ei_config_quality();
            c.simd = (ei_simd)p;
            c.rank_samples = rows[ri];
            printf("%-12s %-5s %-13s %5d %10.2f %12.2f\n", ei_simd_name((ei_simd)p), "f32", "-", rows[ri],
                   time_profile(&c, -1, &qt, &kt, threads, reps), ref);
            c.rank_rows = EI_RANK_ROWS_SPREAD; /* the same with farthest-point rows */
            printf("%-12s %-5s %-13s %5d %10.2f %12.2f\n", ei_simd_name((ei_simd)p), "f32", "spread rows", rows[ri],
                   time_profile(&c, -1, &qt, &kt, threads, reps), ref);
            c.rank_rows = EI_RANK_ROWS_EVEN;
            c.rank_precision = EI_RANK_PRECISION_INT8;
            for (di = 0; di < 3; ++di) {
                if (dots[di].bit && !(have & dots[di].bit)) continue;
                if (p == EI_SIMD_AVX2 && dots[di].bit == 2) continue;              /* zmm: the AVX-512 paths only */
                printf("%-12s %-5s %-13s %5d %10.2f %12.2f\n", ei_simd_name((ei_simd)p), "int8",
                       dots[di].name, rows[ri],
                       time_profile(&c, dots[di].bit | (dots[di].bit == 2 ? have & 1 : 0), &qt, &kt, threads, reps), ref);
            }
        }
    }
    free(q); free(k); free(q16); free(k16);
    return 0;
}
