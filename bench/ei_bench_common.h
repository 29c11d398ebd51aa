/* bench/ei_bench_common.h - what the benchmarks share: a fatal check of library calls, the
   host clock, the median, and bf16 noise from a fixed xorshift stream (the same inputs every run).
   Included after entropyinfer.h (with the implementation) by ei_bench_cuda.c,
   ei_bench_chunk_cuda.c, ei_trace_cuda.c, bench_profile.c and bench_rank.c (every function
   static inline: a program takes what it uses); noise_heads and upload are the inputs of any shape
   (ei_bench_chunk_cuda, ei_trace_cuda's plan mode), shape_sizes their layer's buffers and
   shape_groups the shapes an engine's micro-batches have. */
#ifndef EI_BENCH_COMMON_H
#define EI_BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline void die(const char *what, ei_result r) {
    fprintf(stderr, "%s: %s: %s\n", what, ei_result_name(r), ei_last_error());
    exit(1);
}
#define OK(call) do { ei_result r_ = (call); if (r_ != EI_OK) die(#call, r_); } while (0)

static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* the median of n values (sorts them) */
static inline double median_ms(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static inline uint32_t next32(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static inline uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* [n][heads][d] bf16: noise, and in even kv heads a sink (the first 8 keys large, q aligned with them) */
static inline uint16_t *noise_heads(int64_t n, int heads, int d, int group, int is_q) {
    uint16_t *x = (uint16_t *)malloc((size_t)n * heads * d * 2);
    int64_t t;
    int h, i;
    for (t = 0; t < n; t++)
        for (h = 0; h < heads; h++)
            for (i = 0; i < d; i++) {
                float noise = ((float)(next32() & 0xFFFF) / 65535.f * 3.46f - 1.73f);
                float u = (float)(((h / group) * 31 + i * 7) % 3) - 1.0f;
                float sink = (h / group) % 2 ? 0.f : is_q ? u : (t < 8 ? 2.f * u : 0.f);
                x[((size_t)t * heads + h) * d + i] = bf16_of(sink + 0.3f * noise);
            }
    return x;
}
static inline void *upload(const ei_context *g, const void *h, size_t bytes) {
    void *d = NULL;
    OK(ei_device_alloc(g, &d, bytes));
    OK(ei_device_copy(g, d, h, bytes, EI_COPY_HOST_TO_DEVICE));
    return d;
}

/* The buffers of one layer of this shape on g (ei_layer_sizes; the GPU: one workspace a call). */
static inline ei_sizes shape_sizes(const ei_context *g, int64_t n, int H, int KV, int D, uint32_t plan_flags) {
    ei_shape sh;
    ei_sizes z;
    memset(&sh, 0, sizeof sh);
    sh.max_tokens = n;
    sh.n_heads = H;
    sh.n_kv_heads = KV;
    sh.head_dim = D;
    sh.plan_flags = plan_flags;
    OK(ei_layer_sizes(g, &sh, &z));
    return z;
}
/* Groups of five numbers H KV D n m from the command line (argv[0 .. argc)) into args (60 at most);
   without any, an engine's micro-batches: Gemma 3 270M's global layers (4 query / 1 kv head,
   head_dim 256) at 32k and 128k in micro-batches of 512 and 4096, and SmolLM2-135M (9 / 3, head_dim
   64) at 8k in 512. Returns the count of numbers (a multiple of 5). */
static inline int shape_groups(int argc, char **argv, long long args[60]) {
    static const long long engine[25] = {4, 1, 256, 32768, 512,  4, 1, 256, 32768, 4096, 4, 1, 256, 131072, 512,
                                         4, 1, 256, 131072, 4096, 9, 3, 64, 8192, 512};
    int na = 0, i;
    if (argc <= 0) {
        memcpy(args, engine, sizeof engine);
        return 25;
    }
    for (i = 0; i < argc && na < 60; i++) args[na++] = atoll(argv[i]);
    return na - na % 5;
}

#endif
