/* bench/ei_bench_inputs.h - the generated bf16 Q/K/V of the CUDA benches (ei_bench_cuda,
   ei_trace_cuda: the same inputs, so the same plans), and their layer's buffers. Include after
   ei_bench_common.h with NH, NKV and HD (query heads, kv heads, head_dim) defined. */
#ifndef EI_BENCH_INPUTS_H
#define EI_BENCH_INPUTS_H

/* uniform noise in [-1.73, 1.73] (unit variance) as bf16, from a table (noise_init) */
static uint16_t noise_table[65536];
static void noise_init(void) {
    uint32_t i;
    for (i = 0; i < 65536; i++) noise_table[(i * 40503u) & 0xFFFF] = bf16_of(((float)i / 65535.f) * 3.46f - 1.73f);
}
/* n_tokens x heads rows of HD: even kv heads rigid (a sink block at the start plus a little noise),
   odd ones noise; is_q 1 for queries (kv head of h: h / (NH / NKV)), 0 for keys, -1 for values */
static void fill(uint16_t *x, int64_t n_tokens, int heads, int is_q) {
    int64_t t;
    int h, d;
    for (t = 0; t < n_tokens; t++)
        for (h = 0; h < heads; h++) {
            int kvh = is_q ? h / (NH / NKV) : h;
            uint16_t *row = x + ((size_t)t * heads + h) * HD;
            for (d = 0; d < HD; d++) {
                uint32_t r = next32();
                float u = (float)((kvh * 31 + d * 7) % 3) - 1.0f;
                if (kvh % 2 == 0 && is_q >= 0) { /* rigid: a sink block at the start */
                    float noise = 0.1f * ((float)(r & 0xFFFF) / 65535.f * 3.46f - 1.73f);
                    float sink = is_q ? 1.0f * u : (t < 8 ? 2.0f * u : 0.f);
                    row[d] = bf16_of(sink + noise);
                } else {
                    row[d] = noise_table[r & 0xFFFF];
                }
            }
        }
}
/* The generated Q, K and V of n tokens (noise_init, fill) on the host (*hq, *hk, *hv: the caller
   frees them) and copied into device memory of g (*dq, *dk, *dv), with an output the size of Q
   (*dout). Exits on a failure. */
static void device_inputs(ei_context *g, int64_t n, uint16_t **hq, uint16_t **hk, uint16_t **hv, void **dq, void **dk,
                          void **dv, void **dout) {
    const size_t qb = (size_t)n * NH * HD * 2, kb = (size_t)n * NKV * HD * 2;
    noise_init();
    *hq = (uint16_t *)malloc(qb);
    *hk = (uint16_t *)malloc(kb);
    *hv = (uint16_t *)malloc(kb);
    if (!*hq || !*hk || !*hv) die("out of host memory", EI_ERR_NOMEM);
    fill(*hq, n, NH, 1);
    fill(*hk, n, NKV, 0);
    fill(*hv, n, NKV, -1);
    OK(ei_device_alloc(g, dq, qb));
    OK(ei_device_alloc(g, dk, kb));
    OK(ei_device_alloc(g, dv, kb));
    OK(ei_device_alloc(g, dout, qb));
    OK(ei_device_copy(g, *dq, *hq, qb, EI_COPY_HOST_TO_DEVICE));
    OK(ei_device_copy(g, *dk, *hk, kb, EI_COPY_HOST_TO_DEVICE));
    OK(ei_device_copy(g, *dv, *hv, kb, EI_COPY_HOST_TO_DEVICE));
}
/* Share of the dense causal (query, key) pairs a host plan attends. */
static double plan_density(const ei_context *cpu, const ei_plan *hp, const ei_config *c, int64_t n) {
    double useful = 0;
    int64_t t;
    int i;
    for (t = 0; t < n; t++) {
        int s = (int)(t / c->segment_size);
        int64_t start = (int64_t)s * c->segment_size;
        if (ei_plan_segment_is_sparse(cpu, hp, s))
            for (i = 0; i < NKV; i++)
                useful += (NH / NKV) * ((double)hp->keep_count[(size_t)i * hp->seg_capacity + s] * c->block_size +
                                        (double)(t - start + 1));
        else
            useful += (double)NH * (double)(t + 1);
    }
    return useful / ((double)NH * (double)n * (double)(n + 1) / 2.0);
}
/* The layer's buffers on ctx for n tokens (the GPU: one workspace a call). */
static ei_sizes layer_sizes(const ei_context *ctx, int64_t n, uint32_t flags) {
    return shape_sizes(ctx, n, NH, NKV, HD, flags);
}
/* A whole call with this workspace. */
static ei_exec ex(void *ws, size_t bytes) {
    ei_exec x;
    memset(&x, 0, sizeof x);
    x.workspace = ws;
    x.workspace_bytes = bytes;
    return x;
}

#endif
