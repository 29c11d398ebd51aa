/* bench/ei_bench_chunk_cuda.c - an engine's micro-batch on the GPU: the attention of m queries near
   the end of n keys (llama.cpp's ubatch of a long prompt; the chunk ends one segment before the
   prompt's end, whose last segment the plan keeps dense), with few heads, timed with
   split-K (the workspace of ei_layer_sizes' prefill entry) and without it (no workspace: one CTA per
   work item). Dense (plan NULL) and sparse (a plan of ei_config_quality() profiled on the GPU over
   the whole prompt, then the chunk's rows of it).

     ei_bench_chunk_cuda [H KV D n m ...]      (default: 4 1 256 32768 512  4 1 256 32768 4096
                                                 4 1 256 131072 512  4 1 256 131072 4096
                                                 9 3 64 8192 512)

   The defaults are Gemma 3 270M's global layers (4 query / 1 kv head, head_dim 256) and SmolLM2-135M
   (9 / 3, head_dim 64). bf16 q/k/v of unit-variance noise with a sink block in even kv heads; f32
   output as llama.cpp's. Each time is the median of 9 calls after a warm-up, host clock around the
   call and a stream synchronisation. Prints ms per call, the split's speedup and its TFLOP/s (4 x head_dim
   flops per query head and attended key: the causal keys, times the plan's density). */
#define ENTROPYINFER_IMPLEMENTATION
#include "entropyinfer.h"
#include "ei_bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* median ms of one call (synchronised by a 4-byte read back) */
static double time_call(const ei_context *g, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v, const ei_plan *plan,
                        ei_out_tensor *o, int64_t q_offset, void *ws, size_t ws_bytes, void *probe) {
    double t[9];
    int i;
    uint32_t tmp;
    ei_exec x;
    memset(&x, 0, sizeof x);
    x.workspace = ws;
    x.workspace_bytes = ws_bytes;
    OK(ei_attention_prefill(g, &x, q, k, v, plan, o, q_offset));
    OK(ei_device_copy(g, &tmp, probe, 4, EI_COPY_DEVICE_TO_HOST));
    for (i = 0; i < 9; i++) {
        double t0 = now_ms();
        OK(ei_attention_prefill(g, &x, q, k, v, plan, o, q_offset));
        OK(ei_device_copy(g, &tmp, probe, 4, EI_COPY_DEVICE_TO_HOST));
        t[i] = now_ms() - t0;
    }
    return median_ms(t, 9);
}

int main(int argc, char **argv) {
    long long args[60];
    const int na = shape_groups(argc - 1, argv + 1, args);
    int i;
    ei_config cfg = ei_config_quality();
    ei_context *g;
    cfg.backend = EI_BACKEND_CUDA;
    OK(ei_context_create(&cfg, &g));
    printf("%5s %3s %4s %7s %5s | %-6s %8s %10s %8s %7s | %-7s\n", "H", "KV", "D", "n", "m", "plan", "one_ms", "split_ms",
           "speedup", "TFLOP/s", "density");
    for (i = 0; i < na; i += 5) {
        const int H = (int)args[i], KV = (int)args[i + 1], D = (int)args[i + 2];
        /* the chunk ends one segment before the prompt's end: the plan's last segment is dense */
        const int64_t n = args[i + 3], m = args[i + 4], off = n - m - cfg.segment_size > 0 ? n - m - cfg.segment_size : 0;
        uint16_t *hq = noise_heads(n, H, D, H / KV, 1), *hk = noise_heads(n, KV, D, 1, 0), *hv = noise_heads(n, KV, D, 1, 0);
        void *dq = upload(g, hq, (size_t)n * H * D * 2), *dk = upload(g, hk, (size_t)n * KV * D * 2),
             *dv = upload(g, hv, (size_t)n * KV * D * 2), *dout = NULL, *ws = NULL, *pws = NULL;
        size_t wsb = 0, pwsb = 0;
        ei_tensor tq = ei_tensor_make(dq, EI_BF16, n, H, D), tk = ei_tensor_make(dk, EI_BF16, n, KV, D);
        ei_tensor tv = ei_tensor_make(dv, EI_BF16, n, KV, D), tqc = tq;
        ei_out_tensor to;
        ei_plan plan;
        ei_sizes z = shape_sizes(g, n, H, KV, D, 0);
        ei_exec px;
        int pass;
        OK(ei_device_alloc(g, &dout, (size_t)m * H * D * 4));
        to = ei_out_tensor_make(dout, EI_F32, m, H, D);
        tqc.data = (const char *)dq + (size_t)off * H * D * 2;
        tqc.n_tokens = m;
        wsb = z.prefill;
        if (wsb) OK(ei_device_alloc(g, &ws, wsb));
        memset(&plan, 0, sizeof plan);
        OK(ei_plan_init(g, &plan, n, KV, D, 0, NULL, 0));
        pwsb = z.profile;
        OK(ei_device_alloc(g, &pws, pwsb));
        memset(&px, 0, sizeof px);
        px.workspace = pws;
        px.workspace_bytes = pwsb;
        OK(ei_profile(g, &px, &tq, &tk, &plan));
        for (pass = 0; pass < 2; pass++) {
            const ei_plan *pl = pass ? &plan : NULL;
            double one = time_call(g, &tqc, &tk, &tv, pl, &to, off, NULL, 0, dout);
            double split = wsb ? time_call(g, &tqc, &tk, &tv, pl, &to, off, ws, wsb, dout) : one;
            double dens = 1.0;
            if (pl) { /* kept keys of the chunk's (sparse) segments over the causal keys, from the host copy */
                ei_context *cpu = NULL;
                ei_config cc = cfg;
                ei_plan hp;
                size_t b = 0;
                void *mem;
                int32_t s, h;
                double kept = 0, all = 0;
                cc.backend = EI_BACKEND_CPU;
                OK(ei_context_create(&cc, &cpu));
                b = shape_sizes(cpu, n, H, KV, D, 0).plan;
                mem = malloc(b);
                OK(ei_plan_init(cpu, &hp, n, KV, D, 0, mem, b));
                OK(ei_plan_copy(g, &hp, &plan, EI_COPY_DEVICE_TO_HOST));
                for (s = (int32_t)(off / cfg.segment_size); (int64_t)s * cfg.segment_size < off + m; s++)
                    for (h = 0; h < KV; h++) {
                        const int64_t S0 = (int64_t)s * cfg.segment_size, a = S0 > off ? S0 : off;
                        const int64_t e = S0 + cfg.segment_size < off + m ? S0 + cfg.segment_size : off + m;
                        const double cnt = (double)(e - a), causal = 0.5 * cnt * (double)((a + 1) + e);
                        const double own = 0.5 * cnt * (double)((a - S0 + 1) + (e - S0));
                        all += causal;
                        kept += ei_plan_segment_is_sparse(cpu, &hp, s)
                                    ? cnt * hp.keep_count[EI_PLAN_ROW(&hp, h, s)] * hp.block_size + own
                                    : causal;
                    }
                dens = kept / all;
                free(mem);
                ei_context_destroy(cpu);
            }
            { /* the products' useful work: 4 D flops per (query head, attended key), causal keys x density */
                const double flops = 4.0 * D * H * (double)m * (0.5 * (double)(2 * off + m + 1)) * dens;
                printf("%5d %3d %4d %7lld %5lld | %-6s %8.3f %10.3f %7.2fx %7.1f | %.4f\n", H, KV, D, (long long)n,
                       (long long)m, pl ? "sparse" : "dense", one, split, one / split, flops / (split * 1e9), dens);
            }
        }
        ei_plan_free(g, &plan);
        ei_device_free(g, pws);
        if (ws) ei_device_free(g, ws);
        ei_device_free(g, dq); ei_device_free(g, dk); ei_device_free(g, dv); ei_device_free(g, dout);
        free(hq); free(hk); free(hv);
    }
    ei_context_destroy(g);
    return 0;
}
