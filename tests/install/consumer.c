/* consumer.c - a program that uses an INSTALLED entropyinfer, built by the two
   consumer projects of `make test-install` (cmake/ with find_package, pkgconfig/
   with pkg-config). It includes <entropyinfer.h> from the install prefix only.
     consumer                  one layer of 1,024 tokens (below the sparse threshold:
                               every key attended), checked against a plain softmax
     consumer --plugin found   the CUDA backend loads libentropyinfer_cuda.so by name
                               (the loader's search path or beside the executable)
     consumer --plugin absent  no plugin anywhere it may look: a clean EI_ERR_BACKEND */
#define ENTROPYINFER_IMPLEMENTATION
#include <entropyinfer.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 1024
#define HEADS 4
#define KV_HEADS 2
#define DIM 64

static float frand(unsigned *s) { *s = *s * 1664525u + 1013904223u; return (float)(*s >> 8) / 16777216.0f - 0.5f; }

/* Causal softmax attention of query row t, head h, in double. */
static void reference_row(const float *q, const float *k, const float *v, long t, int h, double *o) {
    const int g = h / (HEADS / KV_HEADS);
    double m = -1e300, l = 0, *p = (double *)malloc(sizeof(double) * (size_t)(t + 1));
    long j;
    int d;
    for (j = 0; j <= t; ++j) {
        double s = 0;
        for (d = 0; d < DIM; ++d) s += (double)q[(t * HEADS + h) * DIM + d] * k[(j * KV_HEADS + g) * DIM + d];
        p[j] = s / sqrt((double)DIM);
        if (p[j] > m) m = p[j];
    }
    for (d = 0; d < DIM; ++d) o[d] = 0;
    for (j = 0; j <= t; ++j) {
        double w = exp(p[j] - m);
        l += w;
        for (d = 0; d < DIM; ++d) o[d] += w * v[(j * KV_HEADS + g) * DIM + d];
    }
    for (d = 0; d < DIM; ++d) o[d] /= l;
    free(p);
}

static int check_plugin(const char *expect) {
    ei_config cfg = ei_config_default();
    ei_context *ctx = NULL;
    ei_result r;
    cfg.backend = EI_BACKEND_CUDA;
    r = ei_context_create(&cfg, &ctx);
    if (!strcmp(expect, "found")) {
        if (r != EI_OK) { fprintf(stderr, "consumer: plugin not loaded by name: %s\n", ei_last_error()); return 1; }
        ei_context_destroy(ctx);
        printf("consumer: the CUDA plugin was found by name\n");
        return 0;
    }
    if (r != EI_ERR_BACKEND || !strstr(ei_last_error(), "not found")) {
        fprintf(stderr, "consumer: expected EI_ERR_BACKEND 'not found', got %d: %s\n", (int)r, ei_last_error());
        if (r == EI_OK) ei_context_destroy(ctx);
        return 1;
    }
    printf("consumer: no plugin where the header may look: refused cleanly\n");
    return 0;
}

int main(int argc, char **argv) {
    float *q, *k, *v, *out;
    ei_shape shape;
    ei_sizes sizes;
    ei_exec x; /* one thread, one workspace for every call */
    void *plan_mem;
    ei_config cfg = ei_config_default();
    ei_context *ctx;
    ei_plan plan;
    unsigned seed = 7;
    long i, t;
    double worst = 0;
    if (argc == 3 && !strcmp(argv[1], "--plugin")) return check_plugin(argv[2]);
    printf("consumer: entropyinfer %s\n", EI_VERSION_STRING);
    q = (float *)malloc(sizeof(float) * N * HEADS * DIM);
    k = (float *)malloc(sizeof(float) * N * KV_HEADS * DIM);
    v = (float *)malloc(sizeof(float) * N * KV_HEADS * DIM);
    out = (float *)malloc(sizeof(float) * N * HEADS * DIM);
    for (i = 0; i < N * HEADS * DIM; ++i) q[i] = frand(&seed);
    for (i = 0; i < N * KV_HEADS * DIM; ++i) { k[i] = frand(&seed); v[i] = frand(&seed); }
    if (ei_context_create(&cfg, &ctx) != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); return 1; }
    memset(&shape, 0, sizeof shape);
    shape.max_tokens = N; shape.n_heads = HEADS; shape.n_kv_heads = KV_HEADS; shape.head_dim = DIM; shape.n_threads = 1;
    if (ei_layer_sizes(ctx, &shape, &sizes) != EI_OK) {
        fprintf(stderr, "sizes: %s\n", ei_last_error());
        return 1;
    }
    plan_mem = malloc(sizes.plan);
    memset(&x, 0, sizeof x);
    x.workspace = malloc(sizes.workspace);
    x.workspace_bytes = sizes.workspace;
    {
        ei_tensor qt = ei_tensor_make(q, EI_F32, N, HEADS, DIM);
        ei_tensor kt = ei_tensor_make(k, EI_F32, N, KV_HEADS, DIM);
        ei_tensor vt = ei_tensor_make(v, EI_F32, N, KV_HEADS, DIM);
        ei_out_tensor ot = ei_out_tensor_make(out, EI_F32, N, HEADS, DIM);
        if (ei_plan_init(ctx, &plan, N, KV_HEADS, DIM, 0, plan_mem, sizes.plan) != EI_OK ||
            ei_profile(ctx, &x, &qt, &kt, &plan) != EI_OK ||
            ei_attention_prefill(ctx, &x, &qt, &kt, &vt, &plan, &ot, 0) != EI_OK) {
            fprintf(stderr, "prefill: %s\n", ei_last_error());
            return 1;
        }
    }
    for (t = 0; t < N; t += 97) { /* rows across the prompt, every head */
        int h, d;
        for (h = 0; h < HEADS; ++h) {
            double o[DIM];
            reference_row(q, k, v, t, h, o);
            for (d = 0; d < DIM; ++d) {
                double e = fabs(o[d] - out[(t * HEADS + h) * DIM + d]);
                if (!(e <= worst)) worst = e;
            }
        }
    }
    ei_context_destroy(ctx);
    free(q); free(k); free(v); free(out); free(plan_mem); free(x.workspace);
    if (!(worst < 1e-4)) { fprintf(stderr, "consumer: attention differs from the reference by %g\n", worst); return 1; }
    printf("consumer: %d tokens, %d/%d heads: attention equals a plain softmax (max error %.2g)\n", N, HEADS, KV_HEADS,
           worst);
    return 0;
}
