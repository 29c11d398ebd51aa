/* bench_decode.c - the decode keep-set (KV-cache compression) next to one
   dense decode step of the same layer.

     build/bench_decode [--n 32768] [--heads 32] [--kv-heads 8] [--dim 128]
                        [--window 32] [--threads 2] [--dtype bf16|f16|f32] [--reps 3]
                        [--layout token|head]

   --layout: the cache token-major ([n][kv_heads][dim], as engines store it;
   default) or head-major ([kv_heads][n][dim], as ggml_peer --decode 1 lays
   out its K and V).

   One layer's cache of n keys (and values), the window's queries observed;
   times, best of reps (wall and process CPU time / threads):
     keep_scalar  ei_decode_keep, the scalar reference kernels, 1 thread
     keep_1t      ei_decode_keep, the CPU's fastest kernels, 1 thread
     keep_mt      ei_decode_keep, `threads` threads (query heads split)
     step         one dense decode step: ei_attention_prefill with one query
                  (at position n - 1) against the n keys and values, `threads` threads
                  (split by kv head)
     step_split   the same step through ei_attention_decode, `threads` threads (split
                  along the keys)
   Every call passes the same workspace, ei_layer_sizes' for `threads` threads.
     stream       `threads` threads reading the step's K and V bytes once (the
                  memory bandwidth a step can use: its ceiling)
   and the keep-set's scoring rate: 2 x window x heads x n x dim FLOPs
   (q.k) over its time, the steps' K/V bytes over their time against the
   stream rate, plus the ratios keep_mt / step and keep_1t / keep_mt.
   Synthetic data (random unit-scale Q/K/V). The caches are 2 x n x kv-heads
   x dim elements: at the default shape (128 MiB of bf16) they do not fit in
   the cache, so the steps are timed from memory, as in a real model whose
   other layers evict them. */
#define _POSIX_C_SOURCE 200809L
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(int cpu) {
    struct timespec ts;
    clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static uint32_t rng = 2463534242u;
static float frand(void) { /* xorshift32, uniform in [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5;
    return (float)((double)rng / 2147483648.0 - 1.0);
}

static void fill(void *p, ei_dtype dt, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) {
        float x = frand();
        if (dt == EI_F32) ((float *)p)[i] = x;
        else if (dt == EI_F16) ((uint16_t *)p)[i] = ei__f32_to_f16(x);
        else ((uint16_t *)p)[i] = ei__f32_to_bf16(x);
    }
}

static void die(const char *what) {
    fprintf(stderr, "bench_decode: %s: %s\n", what, ei_last_error());
    exit(1);
}

typedef struct timing { double wall, cpu; } timing;

/* The memory bandwidth threads can use: each sums its share of a buffer
   with 8 independent 64-bit accumulators (no SIMD needed to saturate DRAM). */
typedef struct stream_arg { const uint64_t *p; size_t n; uint64_t sum; } stream_arg;
static void *stream_run(void *arg) {
    stream_arg *a = (stream_arg *)arg;
    uint64_t s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i, j;
    for (i = 0; i + 8 <= a->n; i += 8)
        for (j = 0; j < 8; ++j) s[j] += a->p[i + j];
    for (j = 0; j < 8; ++j) a->sum += s[j];
    return NULL;
}
static uint64_t stream_read(const void *buf, size_t bytes, int threads) {
    pthread_t tid[64];
    stream_arg arg[64];
    size_t words = bytes / 8;
    uint64_t sum = 0;
    int t;
    if (threads > 64) threads = 64;
    for (t = 0; t < threads; ++t) {
        arg[t].p = (const uint64_t *)buf + words * (size_t)t / (size_t)threads;
        arg[t].n = words * (size_t)(t + 1) / (size_t)threads - words * (size_t)t / (size_t)threads;
        arg[t].sum = 0;
        if (t > 0 && pthread_create(&tid[t], NULL, stream_run, &arg[t]) != 0) stream_run(&arg[t]), tid[t] = 0;
    }
    stream_run(&arg[0]);
    for (t = 1; t < threads; ++t) if (tid[t]) pthread_join(tid[t], NULL);
    for (t = 0; t < threads; ++t) sum += arg[t].sum;
    return sum;
}

int main(int argc, char **argv) {
    int64_t n = 32768;
    int H = 32, KV = 8, d = 128, W = 32, threads = 2, reps = 3, head_major = 0, a, r, path;
    ei_dtype dt = EI_BF16;
    ei_config cfg = ei_config_default();
    ei_context *ctx[2];
    ei_decoder dec[2];
    ei_keep_set keep;
    void *kbuf, *vbuf, *dmem[2];
    float *q, *out;
    size_t esz;
    ei_shape shape;
    ei_sizes sizes;
    ei_exec x1, xt; /* one thread; `threads` threads: the same workspace */
    timing t_keep_scalar = {1e30, 1e30}, t_keep_1t = {1e30, 1e30}, t_keep_mt = {1e30, 1e30}, t_step = {1e30, 1e30};
    timing t_split = {1e30, 1e30}, t_stream = {1e30, 1e30};
    double flops, kv_bytes;
    uint64_t sink = 0;
    for (a = 1; a < argc; a += 2) { /* --option value */
        const char *o = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!v) { fprintf(stderr, "bench_decode: %s needs a value\n", o); return 2; }
        if (!strcmp(o, "--n")) n = atoll(v);
        else if (!strcmp(o, "--heads")) H = atoi(v);
        else if (!strcmp(o, "--kv-heads")) KV = atoi(v);
        else if (!strcmp(o, "--dim")) d = atoi(v);
        else if (!strcmp(o, "--window")) W = atoi(v);
        else if (!strcmp(o, "--threads")) threads = atoi(v);
        else if (!strcmp(o, "--reps")) reps = atoi(v);
        else if (!strcmp(o, "--layout")) head_major = !strcmp(v, "head");
        else if (!strcmp(o, "--dtype")) dt = !strcmp(v, "f32") ? EI_F32 : !strcmp(v, "f16") ? EI_F16 : EI_BF16;
        else { fprintf(stderr, "bench_decode: unknown option %s\n", o); return 2; }
    }
    if (n < 2 * W || H < 1 || KV < 1 || H % KV || d < 1 || W < 1 || threads < 1 || reps < 1) {
        fprintf(stderr, "bench_decode: bad sizes\n");
        return 2;
    }
    cfg.window = W;
    cfg.decode_gap = W / 2;
    cfg.decode_budget = 1024 > W ? 1024 : W;
    for (path = 0; path < 2; ++path) { /* 0: the scalar reference kernels, 1: automatic */
        ei_config c = cfg;
        c.simd = path ? EI_SIMD_AUTO : EI_SIMD_SCALAR;
        if (ei_context_create(&c, &ctx[path]) != EI_OK) die("ei_context_create");
    }
    esz = dt == EI_F32 ? 4 : 2;
    kbuf = malloc((size_t)n * KV * d * esz);
    vbuf = malloc((size_t)n * KV * d * esz);
    q = (float *)malloc(sizeof(float) * (size_t)W * H * d);
    out = (float *)malloc(sizeof(float) * (size_t)H * d);
    if (!kbuf || !vbuf || !q || !out) { fprintf(stderr, "bench_decode: out of memory\n"); return 1; }
    fill(kbuf, dt, (size_t)n * KV * d);
    fill(vbuf, dt, (size_t)n * KV * d);
    fill(q, EI_F32, (size_t)W * H * d);
    memset(&shape, 0, sizeof shape);
    shape.max_tokens = n;
    shape.n_heads = H;
    shape.n_kv_heads = KV;
    shape.head_dim = d;
    shape.n_threads = threads;
    if (ei_layer_sizes(ctx[1], &shape, &sizes) != EI_OK) die("ei_layer_sizes");
    for (path = 0; path < 2; ++path) {
        ei_tensor qt = ei_tensor_make(q, EI_F32, W, H, d);
        if (!(dmem[path] = malloc(sizes.decoder))) { fprintf(stderr, "bench_decode: out of memory\n"); return 1; }
        if (ei_decoder_init(ctx[path], &dec[path], H, KV, d, dmem[path], sizes.decoder) != EI_OK) die("ei_decoder_init");
        if (ei_decode_observe(ctx[path], &dec[path], &qt, n - W, 1) != EI_OK) die("ei_decode_observe"); /* the newest W positions */
    }
    memset(&x1, 0, sizeof x1);
    x1.n_threads = 1;
    x1.workspace_bytes = sizes.workspace;
    x1.workspace = malloc(sizes.workspace ? sizes.workspace : 1);
    xt = x1;
    xt.n_threads = threads;
    memset(&keep, 0, sizeof keep);
    keep.heads_out = KV;
    keep.capacity = cfg.decode_budget;
    keep.index = (int32_t *)malloc(sizeof(int32_t) * (size_t)KV * (size_t)keep.capacity);
    if (!x1.workspace || !keep.index) { fprintf(stderr, "bench_decode: out of memory\n"); return 1; }
    {
        ei_tensor kt = ei_tensor_make(kbuf, dt, n, KV, d), vt = ei_tensor_make(vbuf, dt, n, KV, d);
        if (head_major) {
            kt.token_stride = vt.token_stride = d;
            kt.head_stride = vt.head_stride = n * d;
        }
        ei_tensor qt = ei_tensor_make(q + (size_t)(W - 1) * H * d, EI_F32, 1, H, d);
        ei_out_tensor ot = ei_out_tensor_make(out, EI_F32, 1, H, d);
        for (r = 0; r < reps; ++r) {
            double w0, c0;
#define TIME(slot, call)                                                              \
            w0 = now_ms(0); c0 = now_ms(1);                                           \
            if ((call) != EI_OK) die(#call);                                          \
            if (now_ms(0) - w0 < slot.wall) slot.wall = now_ms(0) - w0;              \
            if (now_ms(1) - c0 < slot.cpu) slot.cpu = now_ms(1) - c0;
            if (r == 0) { TIME(t_keep_scalar, ei_decode_keep(ctx[0], &x1, &dec[0], &kt, &keep)) }
            TIME(t_keep_1t, ei_decode_keep(ctx[1], &x1, &dec[1], &kt, &keep))
            TIME(t_keep_mt, ei_decode_keep(ctx[1], &xt, &dec[1], &kt, &keep))
            TIME(t_step, ei_attention_prefill(ctx[1], &xt, &qt, &kt, &vt, NULL, &ot, n - 1))
            TIME(t_split, ei_attention_decode(ctx[1], &xt, &qt, &kt, &vt, NULL, &ot, n - 1))
            w0 = now_ms(0); c0 = now_ms(1);
            sink += stream_read(kbuf, (size_t)n * KV * d * esz, threads) + stream_read(vbuf, (size_t)n * KV * d * esz, threads);
            if (now_ms(0) - w0 < t_stream.wall) t_stream.wall = now_ms(0) - w0;
            if (now_ms(1) - c0 < t_stream.cpu) t_stream.cpu = now_ms(1) - c0;
#undef TIME
        }
    }
    flops = 2.0 * W * H * (double)n * d;
    printf("decode keep-set vs one dense decode step: n %lld, %d/%d heads, dim %d, window %d, %s cache (%s-major), %d threads, "
           "kernels %s (best of %d; cpu = process CPU time / threads)\n",
           (long long)n, H, KV, d, W, dt == EI_F32 ? "f32" : dt == EI_F16 ? "f16" : "bf16", head_major ? "head" : "token", threads,
           ei_simd_name(ei_context_config(ctx[1])->simd), reps);
    printf("%-14s %10s %10s %10s\n", "", "wall ms", "cpu ms", "GFLOP/s");
    printf("%-14s %10.2f %10.2f %10.1f\n", "keep_scalar", t_keep_scalar.wall, t_keep_scalar.cpu, flops / t_keep_scalar.wall * 1e-6);
    printf("%-14s %10.2f %10.2f %10.1f\n", "keep_1t", t_keep_1t.wall, t_keep_1t.cpu, flops / t_keep_1t.wall * 1e-6);
    printf("%-14s %10.2f %10.2f %10.1f\n", "keep_mt", t_keep_mt.wall, t_keep_mt.cpu / threads, flops / t_keep_mt.wall * 1e-6);
    kv_bytes = 2.0 * (double)n * KV * d * (double)esz;
    printf("%-14s %10.2f %10.2f %10s %8.1f GB/s (%.0f%% of stream)\n", "step", t_step.wall, t_step.cpu / threads, "",
           kv_bytes / t_step.wall * 1e-6, 100.0 * t_stream.wall / t_step.wall);
    printf("%-14s %10.2f %10.2f %10s %8.1f GB/s (%.0f%% of stream)\n", "step_split", t_split.wall, t_split.cpu / threads, "",
           kv_bytes / t_split.wall * 1e-6, 100.0 * t_stream.wall / t_split.wall);
    printf("%-14s %10.2f %10.2f %10s %8.1f GB/s (K and V read once; checksum %llu)\n", "stream", t_stream.wall,
           t_stream.cpu / threads, "", kv_bytes / t_stream.wall * 1e-6, (unsigned long long)(sink & 0xff));
    printf("keep_mt / step %.1f (wall), %.1f (cpu); keep_1t / keep_mt %.2f; keep_scalar / keep_1t %.1f\n",
           t_keep_mt.wall / t_step.wall, t_keep_mt.cpu / t_step.cpu, t_keep_1t.wall / t_keep_mt.wall,
           t_keep_scalar.wall / t_keep_1t.wall);
    for (path = 0; path < 2; ++path) { ei_context_destroy(ctx[path]); free(dmem[path]); }
    free(kbuf); free(vbuf); free(q); free(out); free(x1.workspace); free(keep.index);
    return 0;
}
