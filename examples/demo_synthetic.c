#define _POSIX_C_SOURCE 200809L
/* demo_synthetic: plan one attention layer of a generated long context with
   entropyinfer and show what the method sees: entropy per kv head and
   segment, which heads are rigid and which dynamic, the budgets, and how many
   key blocks each head keeps.

   usage: demo_synthetic [n_tokens] [threads]     (default 16384, 2) */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "synth_qk.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 16384;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    const int heads = 32, kv_heads = 8, dim = 128;
    ei_config cfg = ei_config_default(); /* the paper's configuration */
    ei_context *ctx;
    ei_plan plan;
    ei_shape shape = {0, 0, 0, 0, 0, 0};
    ei_sizes sizes;
    ei_exec x = {0, 0, 0, NULL, 0};
    float *q, *k;
    ei_tensor qt, kt;
    double t0, t1;
    int h, s;

    if (n < 1024 || threads < 1) { fprintf(stderr, "usage: demo_synthetic [n_tokens >= 1024] [threads]\n"); return 2; }
    q = (float *)malloc(sizeof(float) * (size_t)n * heads * dim);
    k = (float *)malloc(sizeof(float) * (size_t)n * kv_heads * dim);
    if (!q || !k) { fprintf(stderr, "out of memory\n"); return 1; }
    synth_qk(q, k, n, heads, kv_heads, dim, cfg.segment_size, 3, 42);

    /* the layer's shape and the threads its calls run on: one workspace for them */
    shape.max_tokens = n;
    shape.n_heads = heads;
    shape.n_kv_heads = kv_heads;
    shape.head_dim = dim;
    shape.n_threads = threads;
    if (ei_context_create(&cfg, &ctx) != EI_OK ||
        ei_plan_init(ctx, &plan, n, kv_heads, dim, 0, NULL, 0) != EI_OK ||
        ei_layer_sizes(ctx, &shape, &sizes) != EI_OK) {
        fprintf(stderr, "setup failed: %s\n", ei_last_error());
        return 1;
    }
    x.n_threads = threads;
    x.workspace_bytes = sizes.profile;
    x.workspace = malloc(sizes.profile ? sizes.profile : 1);
    if (!x.workspace) { fprintf(stderr, "out of memory\n"); return 1; }
    qt = ei_tensor_make(q, EI_F32, n, heads, dim);
    kt = ei_tensor_make(k, EI_F32, n, kv_heads, dim);
    t0 = now_ms();
    if (ei_profile(ctx, &x, &qt, &kt, &plan) != EI_OK) {
        fprintf(stderr, "profiling failed: %s\n", ei_last_error());
        return 1;
    }
    t1 = now_ms();

    printf("entropyinfer %s demo: one layer, %ld tokens, %d query heads, %d kv heads, dim %d, f32, SIMD %s\n",
           EI_VERSION_STRING, n, heads, kv_heads, dim, ei_simd_name(ei_context_config(ctx)->simd));
    printf("paper configuration: segment %d, block %d, threshold %lld, base budget %d, e_t %g, delta_t %g, alpha %g\n",
           cfg.segment_size, cfg.block_size, (long long)cfg.threshold_len, cfg.base_budget, cfg.rigid_entropy,
           cfg.delta_t, cfg.alpha);
    printf("profiled in %.1f ms with %d threads: %d segments x %d scored key blocks\n\n", t1 - t0, threads,
           plan.n_segments, plan.n_blocks);

    printf("entropy of the block-level attention (rows: kv heads, columns: segments 1..%d)\n", plan.n_segments - 1);
    for (h = 0; h < kv_heads; ++h) {
        printf("kv%-2d %-7s", h, plan.head_class[h] == EI_HEAD_RIGID ? "rigid" : "dynamic");
        for (s = 1; s < plan.n_segments; ++s) printf(" %5.2f", plan.entropy[EI_PLAN_ROW(&plan, h, s)]);
        printf("\n");
    }
    printf("\nbudget in tokens (kept key blocks x %d); '-' marks dense segments (before threshold or last)\n", cfg.block_size);
    for (h = 0; h < kv_heads; ++h) {
        long kept = 0, visible = 0;
        printf("kv%-2d %-7s", h, plan.head_class[h] == EI_HEAD_RIGID ? "rigid" : "dynamic");
        for (s = 1; s < plan.n_segments; ++s) {
            size_t idx = EI_PLAN_ROW(&plan, h, s);
            if (!ei_plan_segment_is_sparse(ctx, &plan, s)) { printf("     -"); continue; }
            printf(" %5.0f", plan.budget[idx]);
            kept += plan.keep_count[idx];
            visible += (long)s * (cfg.segment_size / cfg.block_size);
        }
        printf("   keeps %5.1f%% of visible blocks\n", visible ? 100.0 * kept / visible : 0.0);
    }
    printf("\nrigid heads keep the base budget in every segment; dynamic heads move with the entropy's relative\n"
           "change (1x..3x base). The plan feeds ei_attention_prefill (block-sparse attention).\n");
    free(x.workspace);
    ei_plan_free(ctx, &plan);
    ei_context_destroy(ctx);
    free(q);
    free(k);
    return 0;
}
