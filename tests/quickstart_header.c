/* The header's QUICK START, compiled and run as it stands: the makefile
   extracts the code block of entropyinfer.h's QUICK START section into
   build/quickstart_header.inc, which becomes the body of quick_start() below
   (it names q_ptr, k_ptr, v_ptr, out_ptr and n, as the manual says: the
   Q/K/V of n tokens of one layer, prefilled in micro-batches, the last 32
   decoded with the cache compressed). */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int quick_start(const void *q_ptr, const void *k_ptr, const void *v_ptr, void *out_ptr, int64_t n) {
#include "quickstart_header.inc"
    /* what the flow must have done: the whole prompt planned, the cache compressed once */
    if (r == EI_OK && rows != (int64_t)cfg.decode_budget + (n - n_prompt - cfg.decode_gap)) {
        printf("quick start: %lld cache rows in use after decode, %lld expected\n", (long long)rows,
               (long long)cfg.decode_budget + (n - n_prompt - cfg.decode_gap));
        return 1;
    }
    printf("quick start: %lld prompt tokens in micro-batches of %lld, %lld decoded, cache rows %lld at the end\n",
           (long long)n_prompt, (long long)ubatch, (long long)(n - n_prompt), (long long)rows);
    return r == EI_OK ? 0 : 1;
}

int main(void) {
    /* past threshold_len 4096 by two segments, so the plan has sparse rows; the 32 decoded
       tokens compress a cache of 5616 rows to decode_budget 1024 after decode_gap 16 */
    const int64_t n = 5632;
    size_t nq = (size_t)n * 32 * 128, nk = (size_t)n * 8 * 128, i;
    uint16_t *q = (uint16_t *)malloc(nq * 2), *k = (uint16_t *)malloc(nk * 2), *v = (uint16_t *)malloc(nk * 2);
    float *out = (float *)malloc(nq * 4);
    uint32_t s = 7;
    int rc;
    if (!q || !k || !v || !out) { puts("out of memory"); return 2; }
    for (i = 0; i < nq; ++i) { s = s * 1664525u + 1013904223u; q[i] = (uint16_t)(0x3c00u + (s >> 25)); } /* bf16 in [0.0078, 0.016) */
    for (i = 0; i < nk; ++i) { s = s * 1664525u + 1013904223u; k[i] = (uint16_t)(0x3c00u + (s >> 25)); v[i] = (uint16_t)(0xbc00u + (s >> 26)); }
    rc = quick_start(q, k, v, out, n);
    for (i = 0; rc == 0 && i < nq; ++i)
        if (!isfinite(out[i])) { printf("quick start: output %zu is not finite\n", i); rc = 1; }
    printf("quick start of entropyinfer.h: %s (%lld tokens, 32/8 heads, dim 128)\n", rc ? "FAILED" : "ran", (long long)n);
    free(q); free(k); free(v); free(out);
    return rc;
}
