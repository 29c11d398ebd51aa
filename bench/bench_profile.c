/* bench_profile: time to profile (plan) one layer with entropyinfer.
   usage: bench_profile [n_tokens=32768] [heads=32] [kv_heads=8] [dim=128] [threads=2] [reps=3] [chunk=0] [keep_keys=0]
   Prints, per dtype (f32, bf16) and SIMD path, the best of reps runs in ms.
   chunk > 0: the prompt planned as an engine's micro-batches of chunk tokens
   (ei_profile_chunk over a chunked plan, the cache holding every key),
   instead of one ei_profile call; keep_keys = 1: the plan with
   EI_PLAN_KEEP_KEYS (each call reads only the new keys). Every call runs on
   `threads` threads with one workspace (ei_layer_sizes' for them). */
#define _POSIX_C_SOURCE 200809L
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "../examples/synth_qk.h"
#include "ei_bench_common.h"

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 32768;
    int heads = argc > 2 ? atoi(argv[2]) : 32, kv = argc > 3 ? atoi(argv[3]) : 8, dim = argc > 4 ? atoi(argv[4]) : 128;
    int threads = argc > 5 ? atoi(argv[5]) : 2, reps = argc > 6 ? atoi(argv[6]) : 3;
    long chunk = argc > 7 ? atol(argv[7]) : 0;
    int keep_keys = argc > 8 ? atoi(argv[8]) : 0;
    size_t nq = (size_t)n * heads * dim, nk = (size_t)n * kv * dim, i;
    float *q = (float *)malloc(nq * 4), *k = (float *)malloc(nk * 4);
    uint16_t *q16 = (uint16_t *)malloc(nq * 2), *k16 = (uint16_t *)malloc(nk * 2);
    int d, p, r;
    if (!q || !k || !q16 || !k16 || heads % kv || threads < 1 || reps < 1 || chunk < 0) { fprintf(stderr, "bad arguments or out of memory\n"); return 1; }
    synth_qk(q, k, n, heads, kv, dim, 512, 3, 42);
    for (i = 0; i < nq; ++i) q16[i] = synth_bf16(q[i]);
    for (i = 0; i < nk; ++i) k16[i] = synth_bf16(k[i]);
    printf("profile one layer: %ld tokens, %d heads, %d kv heads, dim %d, %d threads, best of %d", n, heads, kv, dim, threads, reps);
    if (chunk > 0) printf(", chunks of %ld tokens%s", chunk, keep_keys ? ", EI_PLAN_KEEP_KEYS" : "");
    printf("\n");
    printf("%-6s %-8s %10s\n", "dtype", "simd", "ms");
    for (d = 0; d < 2; ++d)
        for (p = EI_SIMD_AVX512; p >= EI_SIMD_SCALAR; --p) {
            ei_config c = ei_config_default();
            ei_context *ctx;
            ei_plan plan;
            ei_shape shape = {0, 0, 0, 0, 0, 0};
            ei_sizes sizes;
            ei_exec x = {0, 0, 0, NULL, 0};
            double best = 1e30;
            ei_tensor qt = ei_tensor_make(d ? (const void *)q16 : (const void *)q, d ? EI_BF16 : EI_F32, n, heads, dim);
            ei_tensor kt = ei_tensor_make(d ? (const void *)k16 : (const void *)k, d ? EI_BF16 : EI_F32, n, kv, dim);
            if (!ei_cpu_supports((ei_simd)p)) continue;
            c.simd = (ei_simd)p;
            shape.max_tokens = n;
            shape.n_heads = heads;
            shape.n_kv_heads = kv;
            shape.head_dim = dim;
            shape.plan_flags = chunk > 0 ? EI_PLAN_CHUNKED | (keep_keys ? EI_PLAN_KEEP_KEYS : 0u) : 0u;
            shape.n_threads = threads;
            if (ei_context_create(&c, &ctx) != EI_OK ||
                ei_plan_init(ctx, &plan, n, kv, dim, shape.plan_flags, NULL, 0) != EI_OK ||
                ei_layer_sizes(ctx, &shape, &sizes) != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); return 1; }
            x.n_threads = threads;
            x.workspace_bytes = sizes.profile;
            if (!(x.workspace = malloc(sizes.profile ? sizes.profile : 1))) { fprintf(stderr, "out of memory\n"); return 1; }
            for (r = 0; r < reps; ++r) {
                double t0 = now_ms();
                long s;
                ei_result res = EI_OK;
                if (chunk == 0) res = ei_profile(ctx, &x, &qt, &kt, &plan);
                for (s = 0; chunk > 0 && s < n && res == EI_OK; s += chunk) { /* micro-batches [s, e) */
                    long e = s + chunk < n ? s + chunk : n;
                    size_t es = d ? 2 : 4;
                    ei_tensor qc = ei_tensor_make((const char *)qt.data + (size_t)s * (size_t)heads * (size_t)dim * es, qt.dtype,
                                                  e - s, heads, dim);
                    res = ei_profile_chunk(ctx, &x, &qc, &kt, &plan, s, e == n);
                }
                if (res != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); return 1; }
                t0 = now_ms() - t0;
                if (t0 < best) best = t0;
            }
            printf("%-6s %-8s %10.1f\n", d ? "bf16" : "f32", ei_simd_name((ei_simd)p), best);
            free(x.workspace);
            ei_plan_free(ctx, &plan);
            ei_context_destroy(ctx);
            if (p == EI_SIMD_SCALAR) break;
        }
    free(q); free(k); free(q16); free(k16);
    return 0;
}
