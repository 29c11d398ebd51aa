/* ggml_peer.c - time ggml's CPU flash attention (ggml_flash_attn_ext) on the
   shapes of ei_bench: causal, N tokens, `heads` query heads, `kv` kv heads,
   head dim `dim`, Q f32, K/V in `kvtype` (f32, f16 or bf16), n_threads.

     ggml_peer [--n 8192,16384] [--heads 8] [--kv-heads 2] [--dim 128]
               [--threads 2] [--kv f32|f16|bf16] [--reps 1] [--decode 1]

   --decode 1: one decode step instead, one query (position N - 1) against
   the N keys and values (no mask: it sees them all), as llama.cpp runs a
   generated token; gflops = 4*N*dim*heads / time, and gbps = the K and V
   bytes read / time.

   Prints one JSON object per N with ggml_ms, gflops = 4*N*N*dim*heads/2 /
   time (the same convention as ei_bench) and cpu_ms = process CPU time /
   threads (ggml's OpenMP workers spin, so this is not contention-free).
   Built by bench/run_ggml_peer.sh against a ggml checkout; not part of the
   library build. */
#define _POSIX_C_SOURCE 200809L
#include "ggml.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
static uint64_t rng = 0x2545f4914f6cdd1dull;
static float rnd(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

int main(int argc, char **argv) {
    long long ns[16] = {8192, 16384};
    int n_ns = 2, H = 8, HK = 2, D = 128, threads = 2, reps = 1, decode = 0, a, ni;
    enum ggml_type kvt = GGML_TYPE_F16;
    const char *kvname = "f16";
    for (a = 1; a + 1 < argc; a += 2) {
        const char *o = argv[a], *v = argv[a + 1];
        if (!strcmp(o, "--n")) {
            char *s = (char *)v, *e;
            n_ns = 0;
            while (*s && n_ns < 16) { ns[n_ns++] = strtoll(s, &e, 10); s = *e ? e + 1 : e; }
        } else if (!strcmp(o, "--heads")) H = atoi(v);
        else if (!strcmp(o, "--kv-heads")) HK = atoi(v);
        else if (!strcmp(o, "--dim")) D = atoi(v);
        else if (!strcmp(o, "--threads")) threads = atoi(v);
        else if (!strcmp(o, "--reps")) reps = atoi(v);
        else if (!strcmp(o, "--decode")) decode = atoi(v);
        else if (!strcmp(o, "--kv")) {
            kvname = v;
            kvt = !strcmp(v, "f32") ? GGML_TYPE_F32 : !strcmp(v, "bf16") ? GGML_TYPE_BF16 : GGML_TYPE_F16;
        } else { fprintf(stderr, "unknown option %s\n", o); return 2; }
    }
    ggml_cpu_init();
    for (ni = 0; ni < n_ns; ++ni) {
        const int64_t N = ns[ni], NQ = decode ? 1 : N;
        size_t mem = (size_t)NQ * H * D * 4 * 2 + (size_t)N * HK * D * 4 * 2 + (size_t)N * NQ * 2 + ((size_t)64 << 20);
        struct ggml_init_params ip = {mem, NULL, false};
        struct ggml_context *ctx = ggml_init(ip);
        struct ggml_tensor *q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, NQ, H);
        struct ggml_tensor *k = ggml_new_tensor_3d(ctx, kvt, D, N, HK);
        struct ggml_tensor *v = ggml_new_tensor_3d(ctx, kvt, D, N, HK);
        struct ggml_tensor *m = decode ? NULL : ggml_new_tensor_2d(ctx, GGML_TYPE_F16, N, N);
        struct ggml_tensor *o;
        struct ggml_cgraph *gf;
        ggml_fp16_t *mk = m ? (ggml_fp16_t *)m->data : NULL;
        ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
        double best = 1e300, best_cpu = 1e300;
        int64_t i, j;
        int r;
        float *tmp = (float *)malloc((size_t)N * HK * D * sizeof(float));
        for (i = 0; i < NQ * H * D; ++i) ((float *)q->data)[i] = rnd();
        for (i = 0; i < N * HK * D; ++i) tmp[i] = rnd();
        if (kvt == GGML_TYPE_F32) memcpy(k->data, tmp, (size_t)N * HK * D * 4);
        else if (kvt == GGML_TYPE_F16) ggml_fp32_to_fp16_row(tmp, (ggml_fp16_t *)k->data, N * HK * D);
        else ggml_fp32_to_bf16_row(tmp, (ggml_bf16_t *)k->data, N * HK * D);
        for (i = 0; i < N * HK * D; ++i) tmp[i] = rnd();
        if (kvt == GGML_TYPE_F32) memcpy(v->data, tmp, (size_t)N * HK * D * 4);
        else if (kvt == GGML_TYPE_F16) ggml_fp32_to_fp16_row(tmp, (ggml_fp16_t *)v->data, N * HK * D);
        else ggml_fp32_to_bf16_row(tmp, (ggml_bf16_t *)v->data, N * HK * D);
        free(tmp);
        for (i = 0; mk && i < N; ++i)
            for (j = 0; j < N; ++j) mk[i * N + j] = j <= i ? zero : ninf;
        o = ggml_flash_attn_ext(ctx, q, k, v, m, 1.0f / sqrtf((float)D), 0.0f, 0.0f);
        ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
        gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, o);
        for (r = 0; r < reps; ++r) {
            double t = now_ms(), c = cpu_ms();
            if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); return 1; }
            t = now_ms() - t;
            c = (cpu_ms() - c) / threads;
            if (t < best) best = t;
            if (c < best_cpu) best_cpu = c;
        }
        if (decode)
            printf("{\"n\": %lld, \"decode\": 1, \"threads\": %d, \"heads\": %d, \"kv_heads\": %d, \"dim\": %d, \"q\": \"f32\", "
                   "\"kv\": \"%s\", \"ggml_ms\": %.4f, \"gflops\": %.2f, \"gbps\": %.2f, \"cpu_ms\": %.4f}\n",
                   (long long)N, threads, H, HK, D, kvname, best, 4.0 * (double)N * D * H / (best * 1e-3) * 1e-9,
                   2.0 * (double)N * HK * D * (double)ggml_type_size(kvt) / (best * 1e-3) * 1e-9, best_cpu);
        else
            printf("{\"n\": %lld, \"threads\": %d, \"heads\": %d, \"kv_heads\": %d, \"dim\": %d, \"q\": \"f32\", \"kv\": \"%s\", "
                   "\"ggml_ms\": %.3f, \"gflops\": %.2f, \"cpu_ms\": %.3f}\n",
                   (long long)N, threads, H, HK, D, kvname, best, 4.0 * (double)N * (double)N * D * H / 2.0 / (best * 1e-3) * 1e-9,
                   best_cpu);
        fflush(stdout);
        ggml_free(ctx);
    }
    return 0;
}
