/* bench/ei_bench_cuda.c - the CUDA backend on long prompts.

     ei_bench_cuda [n_tokens ...]        (default 32768 65536 131072)

   32 query heads, 8 kv heads, head_dim 128, bf16, the default configuration
   (segment 512, block 8, threshold 4096, base budget 2048, last segment dense).
   Generated inputs: even kv heads are peaked (a sink block dominates: rigid
   heads), odd kv heads are noise (dynamic heads). Per size it times, as the
   median of 5 runs after a warm-up (host clock around call + stream sync):
     profile_ms  ei_profile on the GPU (min/max, scores, softmax+entropy,
                 budgets, top-k; includes its non-finite check's sync)
     prof_q_ms   the same with ei_config_quality()'s ranking: the sampled
                 ranking (its rows per kv head and segment scored exactly),
                 top_p 0.95, sink 1, local 8 blocks (a second line per size
                 gives its density and sparse time, first CTA shape;
                 EI_BENCH_QUALITY_R=R samples R rows, 0 keeps the reference
                 ranking with the same top_p, sink and local;
                 EI_BENCH_QUALITY_ROWS=spread|even sets its rank_rows,
                 EI_BENCH_QUALITY_PRECISION=int8|f32 its rank_precision)
     dense_ms    our kernel in dense causal mode (plan NULL)
     sparse_ms   our kernel executing the plan
   (EI_BENCH_PROFILE_ONLY=1: only profile_ms and prof_q_ms, e.g. to run
   under ncu, and the quality configuration's chunked planning of the same
   prompt: ei_profile_chunk over chunks of 512 and of 8192 queries, the last
   final, each call waited for, summed over the prompt) and reads PyTorch SDPA's time for the same shapes from $EI_SDPA_TIMES
   (bench/sdpa_ref.py). Dense TFLOP/s count 4*d*heads*n(n+1)/2; sparse useful
   TFLOP/s count 4*d per (query, key) pair the plan attends; density = useful
   pairs / dense causal pairs; efficiency = sparse useful TFLOP/s over dense
   TFLOP/s (1.0 = time exactly proportional to the work kept). Each attention
   variant runs with several CTA shapes (EI_CUDA_ATTN_CFG: wg64 / wg128 = the
   wgmma kernel with 64 / 128 keys per step, Hopper only, K/V tiles by
   cp.async; wgk64 / wgt64 / wgp64 (and 128) the same with TMA copies of the
   K/V tiles (wgk64 the library's default on Hopper for head_dim 64);
   wgs128 (and wgy128, wgw128, wgx128, ...: entropyinfer_cuda.cu, >>cuda-tuning)
   the warp-specialised kernel, the default for head_dim 128; WxMxB = the mma.sync
   kernel, warps x m-tiles per warp x keys per step; EI_BENCH_SHAPES=wg64,8x2x64
   picks them, "default" the library's own choice; default wgs128,wgy128,wgk64,wg64); the table shows the best, the
   line below it each shape.

   Measured (2026-11-29, one H200, CUDA 13.0, driver 580.159.04; SDPA = torch
   2.11 scaled_dot_product_attention, is_causal, enable_gqa), best = wg64:
         n  profile_ms  dense_ms  sdpa_ms  sparse_ms  dense_TF  density  eff  ours/sdpa
     32768        0.59     21.04    14.76       4.62     418.0   0.1675 0.76       0.70
     65536        1.54     85.04    58.16       9.23     413.7   0.0849 0.78       0.68
    131072        4.63    343.07   247.08      18.45     410.2   0.0427 0.79       0.72
   dense ms by shape at 131072: wg64 343.1, wg128 401.1, mma.sync 8x2x64 399.2.
   The quality configuration's profile (prof_q_ms; same H200, 2026-12-01):
   1.62 / 5.21 / 18.53 ms at 32k / 64k / 128k (7.8 / 6.2 / 5.4% of dense;
   the reference ranking's 0.58 / 1.57 / 4.79 ms); at 128k the sampled rows'
   two passes take 6.1 + 7.4 ms (wgmma; 20.5 ms in all with mma.sync), the
   ranking with top_p 0.55 ms.
   Two lines more per size, "real density 30% / 50%": base_budget bisected
   (reference ranking, the plan read back) until the plan keeps that share of
   the dense causal pairs, as the real model does (Gemma 3 270M: 37-63%);
   profile and sparse ms (first CTA shape), profile + sparse against SDPA's
   dense time. Then a table of f32 queries: the same Q values as f32, dense
   attention (first CTA shape) and both profiles, beside the bf16 q; the
   sampled rows on CUDA cores (EI_CUDA_SAMPLED_GENERIC=1) at the first size.
   Measured 2026-12-02 (one H200, CUDA 13.0, driver 580.159.04, torch 2.11):
   profile + sparse vs SDPA dense at 30% density 1.44x / 1.65x / 1.80x at
   32k / 64k / 128k, at 50% 0.89x / 1.00x / 1.08x; dense with f32 q 21.17 /
   86.73 / 338.06 ms against 21.07 / 83.70 / 336.73 with bf16 q (docs/performance.md,
   GPU). */
#define ENTROPYINFER_IMPLEMENTATION
#include "entropyinfer.h"
#include "ei_bench_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NH 32
#define NKV 8
#define HD 128
#include "ei_bench_inputs.h"



#define MAXCFG 8
static const char *cta_shapes[MAXCFG] = {"wgs128", "wgy128", "wgk64", "wg64"};
static int NCFG = 4;


/* One untimed call of the layer's attention (warm-up), then the median of
   reps timed calls, each waited for on the stream; v holds reps doubles. */
/* EI_CUDA_ATTN_CFG for a CTA shape of EI_BENCH_SHAPES; "default": unset (the
   library's choice, with its kernel for sparse segments, if another) */
static void set_shape(const char *shape) {
    if (!strcmp(shape, "default")) unsetenv("EI_CUDA_ATTN_CFG");
    else setenv("EI_CUDA_ATTN_CFG", shape, 1);
}
static double time_prefill(const ei_context *ctx, const ei_cuda_api *api, void *stream, const ei_tensor *q,
                           const ei_tensor *k, const ei_tensor *vt, const ei_plan *plan, ei_out_tensor *o, double *v,
                           int reps) {
    char msg[EI_CUDA_MSG_SIZE];
    int rep;
    OK(ei_attention_prefill(ctx, NULL, q, k, vt, plan, o, 0));
    OK(api->synchronize(stream, msg) == EI_OK ? EI_OK : EI_ERR_BACKEND);
    for (rep = 0; rep < reps; rep++) {
        double t0 = now_ms();
        OK(ei_attention_prefill(ctx, NULL, q, k, vt, plan, o, 0));
        api->synchronize(stream, msg);
        v[rep] = now_ms() - t0;
    }
    return median_ms(v, reps);
}

/* One profile (GPU) with base_budget `base`: the plan on the device (*mem,
   reallocated) and its density; *ctx_out keeps the context. */
static double profile_at(const ei_config *base_cfg, int base, int64_t n, void *dq, void *dk, void *ws, size_t ws_bytes,
                         ei_context **gctx, ei_context **cctx, void **mem, ei_plan *plan) {
    ei_config c = *base_cfg, h;
    ei_tensor tq = ei_tensor_make(dq, EI_BF16, n, NH, HD), tk = ei_tensor_make(dk, EI_BF16, n, NKV, HD);
    ei_plan hp;
    ei_sizes z;
    ei_exec x;
    double d;
    c.base_budget = base;
    if (*gctx) { ei_device_free(*gctx, *mem); ei_context_destroy(*gctx); ei_context_destroy(*cctx); }
    OK(ei_context_create(&c, gctx));
    h = c;
    h.backend = EI_BACKEND_CPU;
    OK(ei_context_create(&h, cctx));
    z = layer_sizes(*gctx, n, 0);
    OK(ei_device_alloc(*gctx, mem, z.plan));
    OK(ei_plan_init(*gctx, plan, n, NKV, HD, 0, *mem, z.plan));
    if (z.profile > ws_bytes) { fprintf(stderr, "profile workspace too small\n"); exit(1); }
    x = ex(ws, z.profile);
    OK(ei_profile(*gctx, &x, &tq, &tk, plan));
    OK(ei_plan_init(*cctx, &hp, n, NKV, HD, 0, NULL, 0));
    OK(ei_plan_copy(*gctx, &hp, plan, EI_COPY_DEVICE_TO_HOST));
    d = plan_density(*cctx, &hp, &c, n);
    ei_plan_free(*cctx, &hp);
    return d;
}

int main(int argc, char **argv) {
    int64_t sizes[8] = {32768, 65536, 131072}, nmax = 0;
    int nsizes = 3, i, si, rep;
    const int reps = 5;
    ei_config cfg = ei_config_default(), ccfg, qcfg;
    ei_context *g, *cpu, *gq, *cpuq;
    uint16_t *hq, *hk, *hv;
    void *dq, *dk, *dv, *dout, *ws, *plan_mem, *qplan_mem;
    size_t bytes, qbytes, wsmax;
    void *dq32;
    double dense_bf16[8] = {0}, dense_f32q[8] = {0}, prof_f32q[8] = {0}, profq_f32q[8] = {0}, profq_bf16[8] = {0},
           profq_gen_f32q[8] = {0}, prof_bf16[8] = {0};
    double sdpa_ms[8] = {0};
    const ei_cuda_api *api;
    char msg[EI_CUDA_MSG_SIZE];
    const char *po = getenv("EI_BENCH_PROFILE_ONLY");
    const int profile_only = po && po[0] == '1';
    if (argc > 1) {
        nsizes = 0;
        for (i = 1; i < argc && nsizes < 8; i++) sizes[nsizes++] = atoll(argv[i]);
    }
    for (i = 0; i < nsizes; i++) if (sizes[i] > nmax) nmax = sizes[i];
    {   /* EI_BENCH_SHAPES=8x2x64,4x2x64: only these CTA shapes */
        static char shapes_buf[256];
        const char *e = getenv("EI_BENCH_SHAPES");
        if (e && e[0]) {
            char *tok, *save = NULL;
            snprintf(shapes_buf, sizeof shapes_buf, "%s", e);
            NCFG = 0;
            for (tok = strtok_r(shapes_buf, ",", &save); tok && NCFG < MAXCFG; tok = strtok_r(NULL, ",", &save))
                cta_shapes[NCFG++] = tok;
        }
    }
    {   /* SDPA times from bench/sdpa_ref.py */
        const char *path = getenv("EI_SDPA_TIMES");
        FILE *f = path && path[0] ? fopen(path, "r") : NULL;
        char line[256];
        while (f && fgets(line, sizeof line, f)) {
            long long n;
            double ms;
            if (sscanf(line, "sdpa %lld %lf", &n, &ms) == 2)
                for (i = 0; i < nsizes; i++) if (sizes[i] == n) sdpa_ms[i] = ms;
        }
        if (f) fclose(f);
    }
    cfg.backend = EI_BACKEND_CUDA;
    OK(ei_context_create(&cfg, &g));
    ccfg = cfg;
    ccfg.backend = EI_BACKEND_CPU;
    OK(ei_context_create(&ccfg, &cpu));
    qcfg = ei_config_quality();
    qcfg.backend = EI_BACKEND_CUDA;
    {   /* EI_BENCH_QUALITY_R=R: R sampled rows; 0: the reference ranking with the same top_p, sink and local */
        const char *e = getenv("EI_BENCH_QUALITY_R");
        if (e && e[0]) {
            int r = atoi(e);
            if (r > 0) qcfg.rank_samples = r;
            else qcfg.ranking = EI_RANK_REFERENCE;
        }
    }
    {   /* EI_BENCH_QUALITY_ROWS=spread|even: the sampled rows (rank_rows) */
        const char *e = getenv("EI_BENCH_QUALITY_ROWS");
        if (e && !strcmp(e, "spread")) qcfg.rank_rows = EI_RANK_ROWS_SPREAD;
        else if (e && !strcmp(e, "even")) qcfg.rank_rows = EI_RANK_ROWS_EVEN;
    }
    {   /* EI_BENCH_QUALITY_PRECISION=int8|f32: the sampled ranking's scores (rank_precision) */
        const char *e = getenv("EI_BENCH_QUALITY_PRECISION");
        if (e && !strcmp(e, "int8")) qcfg.rank_precision = EI_RANK_PRECISION_INT8;
        else if (e && !strcmp(e, "f32")) qcfg.rank_precision = EI_RANK_PRECISION_F32;
    }
    OK(ei_context_create(&qcfg, &gq));
    {   /* the quality plan read back needs host rows of its own budgets */
        ei_config hq = qcfg;
        hq.backend = EI_BACKEND_CPU;
        OK(ei_context_create(&hq, &cpuq));
    }
    api = g->cuda->api;
    msg[0] = 0;
    api->device_check(msg);
    printf("ei_bench_cuda: %s; %s\n", api->build_info(), msg);
    printf("shape: %d q heads, %d kv heads, d=%d, bf16; config: segment %d, block %d, threshold %lld, base %d\n", NH,
           NKV, HD, cfg.segment_size, cfg.block_size, (long long)cfg.threshold_len, cfg.base_budget);

    {
        double t0 = now_ms();
        device_inputs(g, nmax, &hq, &hk, &hv, &dq, &dk, &dv, &dout);
        printf("generated %lld tokens in %.0f ms\n", (long long)nmax, now_ms() - t0);
    }
    bytes = layer_sizes(g, nmax, 0).profile;
    qbytes = layer_sizes(gq, nmax, 0).profile;
    {   /* the CUDA-core sampled path at the first size (below): int8 keys as f32 rows, twice the bytes */
        size_t gb;
        setenv("EI_CUDA_SAMPLED_GENERIC", "1", 1);
        gb = layer_sizes(gq, sizes[0], 0).profile;
        unsetenv("EI_CUDA_SAMPLED_GENERIC");
        if (gb > qbytes) qbytes = gb;
    }
    {   /* the real-density rows profile with base budgets up to nmax: size the workspace for that too */
        ei_config bc = cfg;
        ei_context *gb;
        size_t bb;
        bc.base_budget = (int)(nmax < (1 << 30) ? nmax : (1 << 30));
        OK(ei_context_create(&bc, &gb));
        bb = layer_sizes(gb, nmax, 0).profile;
        ei_context_destroy(gb);
        if (bb > bytes) bytes = bb;
    }
    wsmax = bytes > qbytes ? bytes : qbytes;
    OK(ei_device_alloc(g, &ws, wsmax));
    OK(ei_device_alloc(g, &dq32, (size_t)nmax * NH * HD * 4));
    {   /* the same queries as f32 (exact: bf16 values), for the f32-query rows */
        float *h32 = (float *)malloc((size_t)nmax * NH * HD * 4);
        size_t e;
        if (!h32) { fprintf(stderr, "out of host memory\n"); return 1; }
        for (e = 0; e < (size_t)nmax * NH * HD; e++) {
            uint32_t u = (uint32_t)hq[e] << 16;
            memcpy(&h32[e], &u, 4);
        }
        OK(ei_device_copy(g, dq32, h32, (size_t)nmax * NH * HD * 4, EI_COPY_HOST_TO_DEVICE));
        free(h32);
    }
    {
        OK(ei_device_alloc(g, &plan_mem, layer_sizes(g, nmax, 0).plan));
        OK(ei_device_alloc(g, &qplan_mem, layer_sizes(gq, nmax, 0).plan));
    }

    printf("\n%7s %10s %9s %9s %9s %9s %8s %8s %9s %8s %6s %6s %7s %8s %8s %9s\n", "n", "profile_ms", "prof_q_ms",
           "dense_ms", "sdpa_ms", "sparse_ms", "dense_TF", "sdpa_TF", "sparse_TF", "density", "eff", "prof%", "prof_q%",
           "xdense", "xsdpa", "ours/sdpa");
    for (si = 0; si < nsizes; si++) {
        int64_t n = sizes[si], t;
        ei_tensor tq = ei_tensor_make(dq, EI_BF16, n, NH, HD), tk = ei_tensor_make(dk, EI_BF16, n, NKV, HD);
        ei_tensor tv = ei_tensor_make(dv, EI_BF16, n, NKV, HD);
        ei_out_tensor to = ei_out_tensor_make(dout, EI_BF16, n, NH, HD);
        ei_plan plan, hplan, qplan;
        size_t pb, wsb;
        ei_exec x;
        double v[16], useful = 0, qdensity, dense_pairs, prof, profq, spq, dn[MAXCFG], sp[MAXCFG], best_dense, best_sparse,
               flops_dense;
        int w, nrigid = 0;
        pb = layer_sizes(g, n, 0).plan;
        OK(ei_plan_init(g, &plan, n, NKV, HD, 0, plan_mem, pb));
        wsb = layer_sizes(g, n, 0).profile;
        x = ex(ws, wsb);
        OK(ei_profile(g, &x, &tq, &tk, &plan)); /* warm-up */
        for (rep = 0; rep < reps; rep++) {
            double t0 = now_ms();
            OK(ei_profile(g, &x, &tq, &tk, &plan));
            v[rep] = now_ms() - t0;
        }
        prof = median_ms(v, reps);
        /* the quality configuration: sampled ranking, top_p, sink/local */
        pb = layer_sizes(gq, n, 0).plan;
        OK(ei_plan_init(gq, &qplan, n, NKV, HD, 0, qplan_mem, pb));
        wsb = layer_sizes(gq, n, 0).profile;
        x = ex(ws, wsb);
        OK(ei_profile(gq, &x, &tq, &tk, &qplan)); /* warm-up */
        for (rep = 0; rep < reps; rep++) {
            double t0 = now_ms();
            OK(ei_profile(gq, &x, &tq, &tk, &qplan));
            v[rep] = now_ms() - t0;
        }
        profq = median_ms(v, reps);
        if (profile_only) { /* EI_BENCH_PROFILE_ONLY=1: the two profiles and chunked planning, nothing else */
            static const int64_t chunk_sizes[2] = {512, 8192};
            double chq[2];
            void *cmem;
            ei_plan cpl;
            size_t cpb;
            int cs;
            cpb = layer_sizes(gq, n, EI_PLAN_CHUNKED).plan;
            OK(ei_device_alloc(gq, &cmem, cpb));
            OK(ei_plan_init(gq, &cpl, n, NKV, HD, EI_PLAN_CHUNKED, cmem, cpb));
            for (cs = 0; cs < 2; cs++)
                for (rep = -1; rep < reps; rep++) { /* a warm-up, then reps schedules (each from q_pos 0: a roll-back) */
                    double t0 = now_ms();
                    for (t = 0; t < n; t += chunk_sizes[cs]) {
                        int64_t m = n - t < chunk_sizes[cs] ? n - t : chunk_sizes[cs];
                        ei_tensor cqv = ei_tensor_make((const uint16_t *)dq + (size_t)t * NH * HD, EI_BF16, m, NH, HD);
                        OK(ei_profile_chunk(gq, &x, &cqv, &tk, &cpl, t, t + m == n));
                    }
                    if (rep >= 0) v[rep] = now_ms() - t0;
                    if (rep == reps - 1) chq[cs] = median_ms(v, reps);
                }
            ei_device_free(gq, cmem);
            printf("%7lld %10.3f %9.3f   (EI_BENCH_PROFILE_ONLY: profiles only; quality config chunked: %.3f ms in "
                   "chunks of 512, %.3f ms in chunks of 8192)\n",
                   (long long)n, prof, profq, chq[0], chq[1]);
            continue;
        }
        for (w = 0; w < NCFG; w++) {
            set_shape(cta_shapes[w]);
            dn[w] = time_prefill(g, api, cfg.cuda_stream, &tq, &tk, &tv, NULL, &to, v, reps);
            sp[w] = time_prefill(g, api, cfg.cuda_stream, &tq, &tk, &tv, &plan, &to, v, reps);
        }
        /* the quality plan: density and sparse time (first CTA shape) */
        set_shape(cta_shapes[0]);
        spq = time_prefill(gq, api, cfg.cuda_stream, &tq, &tk, &tv, &qplan, &to, v, reps);
        OK(ei_plan_init(cpuq, &hplan, n, NKV, HD, 0, NULL, 0));
        OK(ei_plan_copy(gq, &hplan, &qplan, EI_COPY_DEVICE_TO_HOST));
        qdensity = 0;
        for (t = 0; t < n; t++) {
            int s = (int)(t / cfg.segment_size);
            int64_t start = (int64_t)s * cfg.segment_size;
            if (ei_plan_segment_is_sparse(cpu, &hplan, s)) {
                for (i = 0; i < NKV; i++)
                    qdensity += (NH / NKV) * ((double)hplan.keep_count[(size_t)i * hplan.seg_capacity + s] * cfg.block_size +
                                              (double)(t - start + 1));
            } else {
                qdensity += (double)NH * (double)(t + 1);
            }
        }
        ei_plan_free(cpuq, &hplan);
        /* density from the plan */
        OK(ei_plan_init(cpu, &hplan, n, NKV, HD, 0, NULL, 0));
        OK(ei_plan_copy(g, &hplan, &plan, EI_COPY_DEVICE_TO_HOST));
        for (i = 0; i < NKV; i++) nrigid += hplan.head_class[i] == EI_HEAD_RIGID;
        for (t = 0; t < n; t++) {
            int s = (int)(t / cfg.segment_size);
            int64_t start = (int64_t)s * cfg.segment_size;
            if (ei_plan_segment_is_sparse(cpu, &hplan, s)) {
                for (i = 0; i < NKV; i++)
                    useful += (NH / NKV) * ((double)hplan.keep_count[(size_t)i * hplan.seg_capacity + s] * cfg.block_size +
                                            (double)(t - start + 1));
            } else {
                useful += (double)NH * (double)(t + 1);
            }
        }
        dense_pairs = (double)NH * (double)n * (double)(n + 1) / 2.0;
        flops_dense = 4.0 * HD * dense_pairs;
        best_dense = dn[0];
        best_sparse = sp[0];
        for (w = 1; w < NCFG; w++) {
            if (dn[w] < best_dense) best_dense = dn[w];
            if (sp[w] < best_sparse) best_sparse = sp[w];
        }
        {
            double dtf = flops_dense / best_dense / 1e9, stf = 4.0 * HD * useful / best_sparse / 1e9;
            double sdtf = sdpa_ms[si] > 0 ? flops_dense / sdpa_ms[si] / 1e9 : 0;
            printf("%7lld %10.2f %9.2f %9.2f %9.2f %9.2f %8.1f %8.1f %9.1f %8.4f %6.2f %6.2f %7.2f %8.2f %8.2f %9.2f\n",
                   (long long)n, prof, profq, best_dense, sdpa_ms[si], best_sparse, dtf, sdtf, stf, useful / dense_pairs,
                   stf / dtf, 100.0 * prof / best_dense, 100.0 * profq / best_dense, best_dense / best_sparse,
                   sdpa_ms[si] > 0 ? sdpa_ms[si] / best_sparse : 0, sdpa_ms[si] > 0 ? sdpa_ms[si] / best_dense : 0);
            printf("        dense/sparse ms by CTA shape:");
            for (w = 0; w < NCFG; w++) printf(" %s %.2f/%.2f;", cta_shapes[w], dn[w], sp[w]);
            printf(" rigid kv heads %d/%d\n", nrigid, NKV);
            printf("        quality config (%s R=%d, top_p %.2f, sink %d, local %d): profile %.2f ms (%.2f%% of dense, "
                   "reference ranking %.2f ms), density %.4f, sparse %.2f ms (%s)\n",
                   qcfg.ranking == EI_RANK_SAMPLED ? "sampled" : "reference ranking,", qcfg.rank_samples, qcfg.top_p,
                   qcfg.sink_blocks, qcfg.local_blocks, profq, 100.0 * profq / best_dense, prof, qdensity / dense_pairs,
                   spq, cta_shapes[0]);
        }
        fflush(stdout);
        ei_plan_free(cpu, &hplan);
        prof_bf16[si] = prof;
        profq_bf16[si] = profq;
        {   /* f32 queries (bf16 k/v): dense attention, first CTA shape; profile, both rankings */
            ei_tensor tq32 = ei_tensor_make(dq32, EI_F32, n, NH, HD);
            set_shape(cta_shapes[0]);
            for (w = 0; w < 2; w++) {
                const ei_tensor *qq = w ? &tq32 : &tq;
                if (w) dense_f32q[si] = time_prefill(g, api, cfg.cuda_stream, qq, &tk, &tv, NULL, &to, v, reps);
                else dense_bf16[si] = time_prefill(g, api, cfg.cuda_stream, qq, &tk, &tv, NULL, &to, v, reps);
            }
            x = ex(ws, layer_sizes(g, n, 0).profile);
            OK(ei_profile(g, &x, &tq32, &tk, &plan));
            for (rep = 0; rep < reps; rep++) {
                double t0 = now_ms();
                OK(ei_profile(g, &x, &tq32, &tk, &plan));
                v[rep] = now_ms() - t0;
            }
            prof_f32q[si] = median_ms(v, reps);
            x = ex(ws, layer_sizes(gq, n, 0).profile);
            OK(ei_profile(gq, &x, &tq32, &tk, &qplan));
            for (rep = 0; rep < reps; rep++) {
                double t0 = now_ms();
                OK(ei_profile(gq, &x, &tq32, &tk, &qplan));
                v[rep] = now_ms() - t0;
            }
            profq_f32q[si] = median_ms(v, reps);
            if (si == 0) { /* the CUDA-core sampled path (f32 q read as f32), smallest size only: slow */
                setenv("EI_CUDA_SAMPLED_GENERIC", "1", 1);
                x = ex(ws, layer_sizes(gq, n, 0).profile); /* its own size (allocated above) */
                OK(ei_profile(gq, &x, &tq32, &tk, &qplan));
                for (rep = 0; rep < 3; rep++) {
                    double t0 = now_ms();
                    OK(ei_profile(gq, &x, &tq32, &tk, &qplan));
                    v[rep] = now_ms() - t0;
                }
                profq_gen_f32q[si] = median_ms(v, 3);
                unsetenv("EI_CUDA_SAMPLED_GENERIC");
            }
        }
        {   /* real densities: base_budget found by bisection so that the plan keeps ~30% / ~50% of the dense
               causal pairs (the Gemma 3 270M measurements: 37-63%); profile ms, sparse ms (first CTA shape),
               profile + sparse against SDPA's dense time */
            static const double targets[2] = {0.30, 0.50};
            int ti;
            for (ti = 0; ti < 2; ti++) {
                int lo = cfg.block_size, hi = (int)(n < (1 << 30) ? n : (1 << 30)), base = lo, it;
                double dens = 0, pms, sms;
                ei_context *gc = NULL, *cc = NULL;
                void *pmem = NULL;
                ei_plan pl;
                for (it = 0; it < 18 && hi - lo > cfg.block_size; it++) { /* density rises with the budget */
                    int mid = (lo + hi) / 2 / cfg.block_size * cfg.block_size;
                    double d = profile_at(&cfg, mid, n, dq, dk, ws, wsmax, &gc, &cc, &pmem, &pl);
                    if (d < targets[ti]) lo = mid; else hi = mid;
                }
                base = hi;
                dens = profile_at(&cfg, base, n, dq, dk, ws, wsmax, &gc, &cc, &pmem, &pl);
                x = ex(ws, layer_sizes(gc, n, 0).profile);
                for (rep = 0; rep < reps; rep++) {
                    double t0 = now_ms();
                    OK(ei_profile(gc, &x, &tq, &tk, &pl));
                    v[rep] = now_ms() - t0;
                }
                pms = median_ms(v, reps);
                set_shape(cta_shapes[0]);
                sms = time_prefill(gc, api, cfg.cuda_stream, &tq, &tk, &tv, &pl, &to, v, reps);
                printf("        real density %.0f%%: base_budget %d -> density %.4f: profile %.2f ms, sparse %.2f ms (%s), "
                       "profile+sparse %.2f ms vs SDPA dense %.2f ms: %.2fx (vs our dense %.2f ms: %.2fx)\n",
                       100 * targets[ti], base, dens, pms, sms, cta_shapes[0], pms + sms, sdpa_ms[si],
                       sdpa_ms[si] > 0 ? sdpa_ms[si] / (pms + sms) : 0, best_dense, best_dense / (pms + sms));
                fflush(stdout);
                ei_device_free(gc, pmem);
                ei_context_destroy(gc);
                ei_context_destroy(cc);
            }
        }
    }
    if (!profile_only) {
        printf("\nf32 queries (bf16 k/v; q rounded to bf16 as each Q tile loads), %s:\n", cta_shapes[0]);
        printf("%7s %12s %12s %7s %12s %12s %14s %14s %16s\n", "n", "dense_bf16q", "dense_f32q", "cost", "prof_bf16q",
               "prof_f32q", "prof_q_bf16q", "prof_q_f32q", "prof_q_f32q_gen");
        for (si = 0; si < nsizes; si++)
            printf("%7lld %12.2f %12.2f %6.1f%% %12.2f %12.2f %14.2f %14.2f %16.2f\n", (long long)sizes[si], dense_bf16[si],
                   dense_f32q[si], 100.0 * (dense_f32q[si] / dense_bf16[si] - 1), prof_bf16[si], prof_f32q[si],
                   profq_bf16[si], profq_f32q[si], profq_gen_f32q[si]);
        printf("columns: dense ms with bf16 / f32 q (cost: the f32 q's extra time); profile ms (reference ranking) and "
               "prof_q ms (quality configuration, sampled rows on the tensor cores) with bf16 / f32 q; prof_q_f32q_gen: "
               "the sampled rows on CUDA cores with q read as f32 (EI_CUDA_SAMPLED_GENERIC=1; first size only, 0 = not run)\n");
        printf("\ncolumns: prof%% / prof_q%% = profile time (reference / quality configuration) over our dense time; "
               "xdense = our dense / our sparse; xsdpa = SDPA / our sparse; ours/sdpa = SDPA time / our dense time\n");
    }
    ei_device_free(g, dq); ei_device_free(g, dk); ei_device_free(g, dv); ei_device_free(g, dout);
    ei_device_free(g, ws); ei_device_free(g, plan_mem); ei_device_free(g, dq32); ei_device_free(g, qplan_mem);
    free(hq); free(hk); free(hv);
    ei_context_destroy(gq);
    ei_context_destroy(g);
    ei_context_destroy(cpu);
    ei_context_destroy(cpuq);
    return 0;
}
