/* bench/ei_bench_common.h - what the CUDA benchmarks share: a fatal check of library calls, the
   host clock, the median, and bf16 noise from a fixed xorshift stream (the same inputs every run).
   Included after entropyinfer.h (with the implementation) by ei_bench_cuda.c and
   ei_bench_chunk_cuda.c. */
#ifndef EI_BENCH_COMMON_H
#define EI_BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void die(const char *what, ei_result r) {
    fprintf(stderr, "%s: %s: %s\n", what, ei_result_name(r), ei_last_error());
    exit(1);
}
#define OK(call) do { ei_result r_ = (call); if (r_ != EI_OK) die(#call, r_); } while (0)

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* the median of n values (sorts them) */
static double median_ms(double *v, int n) {
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

#endif
