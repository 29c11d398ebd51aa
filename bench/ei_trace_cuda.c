/* bench/ei_trace_cuda.c - where the time of one attention call goes: a CUPTI activity trace
   (kernels, memsets, copies, runtime and driver calls, on the device's clock) of a dense and a
   sparse ei_attention_prefill on the shapes of ei_bench_cuda (32 query / 8 kv heads, d 128, bf16,
   the default configuration and its plan, the same generated inputs), printed as a timeline from
   the call's entry; then the host clock of a waiting call against one of deferred errors
   (cuda_deferred_errors = 1: no read-back), back to back, as the median of reps.

     nvcc -O2 -I. -I bench bench/ei_trace_cuda.c -o build/ei_trace_cuda -lcupti -ldl -lpthread -lm
     EI_CUDA_LIBRARY=build/libentropyinfer_cuda.so build/ei_trace_cuda [n_tokens]   (default 32768)

   Used for issue 32 (the sparse call's 0.5 ms that is not the attention kernel). Nothing here
   changes what the library does: CUPTI watches the process. */
#define ENTROPYINFER_IMPLEMENTATION
#include "entropyinfer.h"
#include "ei_bench_common.h"

#include <cuda_runtime.h>
#include <cupti.h>

#define NH 32
#define NKV 8
#define HD 128

#define CUPTI_OK(call)                                                                              \
    do {                                                                                            \
        CUptiResult c_ = (call);                                                                    \
        if (c_ != CUPTI_SUCCESS) {                                                                  \
            const char *s_ = NULL;                                                                  \
            cuptiGetResultString(c_, &s_);                                                          \
            fprintf(stderr, "%s: %s\n", #call, s_ ? s_ : "?");                                      \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

/* ---- the activity records, kept until printed */
typedef struct {
    uint64_t t0, t1;
    char what[96];
} Rec;
static Rec recs[65536];
static int nrec;
static void add(uint64_t t0, uint64_t t1, const char *kind, const char *name) {
    if (nrec >= (int)(sizeof recs / sizeof recs[0])) return;
    recs[nrec].t0 = t0;
    recs[nrec].t1 = t1;
    snprintf(recs[nrec].what, sizeof recs[nrec].what, "%s %.80s", kind, name ? name : "");
    nrec++;
}
static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = 8u << 20;
    *buf = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}
static void CUPTIAPI buf_complete(CUcontext c, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    CUpti_Activity *r = NULL;
    (void)c; (void)stream; (void)size;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        const char *name = NULL;
        switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
            CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)r;
            char g[96];
            snprintf(g, sizeof g, "%.60s <<<%d,%d>>>", k->name, k->gridX * k->gridY * k->gridZ, k->blockX);
            add(k->start, k->end, "GPU kernel", g);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)r;
            char g[64];
            snprintf(g, sizeof g, "%llu bytes kind %d", (unsigned long long)m->bytes, (int)m->copyKind);
            add(m->start, m->end, "GPU memcpy", g);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)r;
            char g[64];
            snprintf(g, sizeof g, "%llu bytes", (unsigned long long)m->bytes);
            add(m->start, m->end, "GPU memset", g);
            break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME: {
            CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)r;
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
            add(a->start, a->end, "host rt", name);
            break;
        }
        case CUPTI_ACTIVITY_KIND_DRIVER: {
            CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)r;
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
            add(a->start, a->end, "host drv", name);
            break;
        }
        default:
            break;
        }
    }
    free(buf);
}
static int cmp_rec(const void *a, const void *b) {
    const Rec *x = (const Rec *)a, *y = (const Rec *)b;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}
/* the records that start in [t0, t1], from t0, in microseconds; GPU busy time summed */
static void timeline(const char *title, uint64_t t0, uint64_t tret, uint64_t t1) {
    int i;
    double busy = 0;
    uint64_t gpu_first = 0, gpu_last = 0;
    printf("\n== %s: call returned at %.1f us, synchronised at %.1f us (host clock)\n", title, (tret - t0) / 1e3,
           (t1 - t0) / 1e3);
    for (i = 0; i < nrec; i++) {
        const Rec *r = &recs[i];
        if (r->t0 < t0 || r->t0 > t1) continue;
        printf("  %9.1f .. %9.1f us  %8.1f us  %s\n", (r->t0 - t0) / 1e3, (r->t1 - t0) / 1e3, (r->t1 - r->t0) / 1e3,
               r->what);
        if (!strncmp(r->what, "GPU", 3)) {
            busy += (r->t1 - r->t0) / 1e3;
            if (!gpu_first) gpu_first = r->t0;
            gpu_last = r->t1;
        }
    }
    printf("  GPU busy %.1f us; first GPU work starts at %.1f us, last ends at %.1f us\n", busy,
           gpu_first ? (gpu_first - t0) / 1e3 : 0., gpu_last ? (gpu_last - t0) / 1e3 : 0.);
}

/* the generator of ei_bench_cuda (same inputs, same plan) */
static uint16_t noise_table[65536];
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
                if (kvh % 2 == 0 && is_q >= 0) {
                    float noise = 0.1f * ((float)(r & 0xFFFF) / 65535.f * 3.46f - 1.73f);
                    float sink = is_q ? 1.0f * u : (t < 8 ? 2.0f * u : 0.f);
                    row[d] = bf16_of(sink + noise);
                } else {
                    row[d] = noise_table[r & 0xFFFF];
                }
            }
        }
}
static ei_sizes layer_sizes(const ei_context *ctx, int64_t n) {
    ei_shape sh;
    ei_sizes z;
    memset(&sh, 0, sizeof sh);
    sh.max_tokens = n;
    sh.n_heads = NH;
    sh.n_kv_heads = NKV;
    sh.head_dim = HD;
    OK(ei_layer_sizes(ctx, &sh, &z));
    return z;
}
static ei_exec ex(void *ws, size_t bytes) {
    ei_exec x;
    memset(&x, 0, sizeof x);
    x.workspace = ws;
    x.workspace_bytes = bytes;
    return x;
}

int main(int argc, char **argv) {
    int64_t n = argc > 1 ? atoll(argv[1]) : 32768;
    const int reps = 7;
    ei_config cfg = ei_config_default(), dcfg;
    ei_context *g, *gd;
    uint16_t *hq, *hk, *hv;
    void *dq, *dk, *dv, *dout, *ws, *plan_mem, *aws;
    cudaStream_t st;
    ei_plan plan;
    ei_exec x, xa;
    ei_sizes z;
    uint64_t t0, tret, t1;
    double v[16];
    int i, k, rep;
    CUPTI_OK(cuptiActivityRegisterCallbacks(buf_request, buf_complete));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER));
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return 1;
    cfg.backend = EI_BACKEND_CUDA;
    cfg.cuda_stream = st;
    OK(ei_context_create(&cfg, &g));
    dcfg = cfg;
    dcfg.cuda_deferred_errors = 1;
    OK(ei_context_create(&dcfg, &gd));
    for (i = 0; i < 65536; i++) noise_table[(i * 40503u) & 0xFFFF] = bf16_of(((float)i / 65535.f) * 3.46f - 1.73f);
    hq = (uint16_t *)malloc((size_t)n * NH * HD * 2);
    hk = (uint16_t *)malloc((size_t)n * NKV * HD * 2);
    hv = (uint16_t *)malloc((size_t)n * NKV * HD * 2);
    fill(hq, n, NH, 1);
    fill(hk, n, NKV, 0);
    fill(hv, n, NKV, -1);
    OK(ei_device_alloc(g, &dq, (size_t)n * NH * HD * 2));
    OK(ei_device_alloc(g, &dk, (size_t)n * NKV * HD * 2));
    OK(ei_device_alloc(g, &dv, (size_t)n * NKV * HD * 2));
    OK(ei_device_alloc(g, &dout, (size_t)n * NH * HD * 2));
    OK(ei_device_copy(g, dq, hq, (size_t)n * NH * HD * 2, EI_COPY_HOST_TO_DEVICE));
    OK(ei_device_copy(g, dk, hk, (size_t)n * NKV * HD * 2, EI_COPY_HOST_TO_DEVICE));
    OK(ei_device_copy(g, dv, hv, (size_t)n * NKV * HD * 2, EI_COPY_HOST_TO_DEVICE));
    z = layer_sizes(g, n);
    OK(ei_device_alloc(g, &ws, z.profile));
    OK(ei_device_alloc(g, &plan_mem, z.plan));
    OK(ei_device_alloc(g, &aws, layer_sizes(gd, n).prefill + 1));
    OK(ei_plan_init(g, &plan, n, NKV, HD, 0, plan_mem, z.plan));
    x = ex(ws, z.profile);
    xa = ex(aws, layer_sizes(gd, n).prefill);
    {
        ei_tensor tq = ei_tensor_make(dq, EI_BF16, n, NH, HD), tk = ei_tensor_make(dk, EI_BF16, n, NKV, HD);
        ei_tensor tv = ei_tensor_make(dv, EI_BF16, n, NKV, HD);
        ei_out_tensor to = ei_out_tensor_make(dout, EI_BF16, n, NH, HD);
        const ei_plan *plans[2] = {NULL, &plan};
        OK(ei_profile(g, &x, &tq, &tk, &plan));
        cudaStreamSynchronize(st);
        printf("ei_trace_cuda: n %lld, 32/8 heads, d 128, bf16, default config and plan\n", (long long)n);
        /* host clock, as ei_bench_cuda: waiting calls, then deferred-errors calls one by one and
           back to back (one wait for `reps` calls) */
        for (k = 0; k < 2; k++) {
            double wait_ms, defer_ms, b2b_ms;
            OK(ei_attention_prefill(g, NULL, &tq, &tk, &tv, plans[k], &to, 0));
            for (rep = 0; rep < reps; rep++) {
                double a = now_ms();
                OK(ei_attention_prefill(g, NULL, &tq, &tk, &tv, plans[k], &to, 0));
                cudaStreamSynchronize(st);
                v[rep] = now_ms() - a;
            }
            wait_ms = median_ms(v, reps);
            OK(ei_attention_prefill(gd, &xa, &tq, &tk, &tv, plans[k], &to, 0));
            for (rep = 0; rep < reps; rep++) {
                double a = now_ms();
                OK(ei_attention_prefill(gd, &xa, &tq, &tk, &tv, plans[k], &to, 0));
                cudaStreamSynchronize(st);
                v[rep] = now_ms() - a;
            }
            defer_ms = median_ms(v, reps);
            {
                double a = now_ms();
                for (rep = 0; rep < reps; rep++) OK(ei_attention_prefill(gd, &xa, &tq, &tk, &tv, plans[k], &to, 0));
                cudaStreamSynchronize(st);
                b2b_ms = (now_ms() - a) / reps;
            }
            OK(ei_cuda_status(gd));
            printf("%s: waiting call %.3f ms, deferred-errors call %.3f ms, deferred back to back %.3f ms per call "
                   "(median of %d / mean of %d)\n", k ? "sparse" : "dense", wait_ms, defer_ms, b2b_ms, reps, reps);
        }
        /* the traced calls: dense, sparse, sparse again */
        cuptiActivityFlushAll(1);
        nrec = 0;
        {
            uint64_t marks[3][3];
            const char *titles[3] = {"dense call (waiting)", "sparse call (waiting)", "sparse call (waiting), again"};
            for (k = 0; k < 3; k++) {
                cuptiGetTimestamp(&marks[k][0]);
                OK(ei_attention_prefill(g, NULL, &tq, &tk, &tv, plans[k ? 1 : 0], &to, 0));
                cuptiGetTimestamp(&marks[k][1]);
                cudaStreamSynchronize(st);
                cuptiGetTimestamp(&marks[k][2]);
            }
            cuptiActivityFlushAll(1);
            qsort(recs, (size_t)nrec, sizeof recs[0], cmp_rec);
            for (k = 0; k < 3; k++) {
                t0 = marks[k][0]; tret = marks[k][1]; t1 = marks[k][2];
                timeline(titles[k], t0, tret, t1);
            }
        }
    }
    ei_context_destroy(gd);
    ei_context_destroy(g);
    return 0;
}
