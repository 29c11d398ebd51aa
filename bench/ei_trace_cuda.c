/* bench/ei_trace_cuda.c - where the time of one attention call goes: a CUPTI activity trace
   (kernels, memsets, copies, runtime and driver calls, on the device's clock) of a dense and a
   sparse ei_attention_prefill on the shapes of ei_bench_cuda (32 query / 8 kv heads, d 128, bf16,
   the default configuration and its plan, the same generated inputs), printed as a timeline from
   the call's entry; then the host clock of a waiting call against one of deferred errors
   (cuda_deferred_errors = 1: no read-back), back to back, as the median of reps.

     nvcc -O2 -I. -I bench bench/ei_trace_cuda.c -o build/ei_trace_cuda -lcupti -ldl -lpthread -lm
     EI_CUDA_LIBRARY=build/libentropyinfer_cuda.so build/ei_trace_cuda [n_tokens]   (default 32768)

     build/ei_trace_cuda n_tokens LIB_A LIB_B

   A/B mode: two builds of the plugin in one process (a context each, cfg.cuda_library), their
   calls interleaved (dense, sparse with the default plan, plans of 30% and 50% density; each
   round in turn A first or B first, after one untimed round), so that the GPU's clock and
   temperature drift reach both alike: per build and plan the median host time of a waiting call
   and the medians of its attention kernel and scan kernels (CUPTI), and the efficiencies
   density x dense / sparse of calls and of kernels.

   Plan mode: chunked planning as llama.cpp's glue runs it on the GPU (issue 33: planning at -ub 512
   cost more than the attention it plans), per group of H KV D n m on the command line:

     build/ei_trace_cuda plan [H KV D n m ...]   (default: shape_groups' engine shapes)
     make trace-plan-cuda [CUDA_TRACE_SHAPES="H KV D n m ..."]

   ei_config_quality(), f32 queries over an f16 cache (llama.cpp's types), deferred errors, the
   prompt planned in chunks of m: the host time of the schedule with a synchronisation after each
   chunk (the glue's gpu_timing=1) and back to back, the GPU time per kernel summed over a traced
   schedule, and the timeline of one chunk near the end. m 0: the whole prompt by ei_profile;
   EI_TRACE_BF16=1: bf16 q and k (ei_bench_cuda's types).

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
#include "ei_bench_inputs.h"

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
    *buf = (uint8_t *)malloc(*size); /* CUPTI needs 8-byte alignment: malloc gives 16 */
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



static double median_of(const double *v, int n) {
    double w[64];
    memcpy(w, v, sizeof(double) * (size_t)n);
    return median_ms(w, n);
}
/* A/B: the two plugins, interleaved (see the top of the file) */
#define AB_ROUNDS 12
static int ab_mode(int64_t n, const char *lib[2]) {
    static const int budgets[3][3] = {{4584, 9944, 20648}, {8832, 18432, 37624}, {0, 0, 0}}; /* 30% / 50% at 32k/64k/128k */
    const char *cases[4] = {"dense", "sparse (default plan)", "30% density", "50% density"};
    ei_context *g[2][3], *cpu[3];
    ei_plan plan[3];
    void *dq, *dk, *dv, *dout, *ws, *pm[3];
    uint16_t *hq, *hk, *hv;
    cudaStream_t st;
    double dens[4] = {1, 0, 0, 0}, call[2][4][AB_ROUNDS], kern[2][4][AB_ROUNDS], scan[2][4][AB_ROUNDS];
    uint64_t mark[2][4][AB_ROUNDS][2];
    int si = n == 32768 ? 0 : n == 65536 ? 1 : n == 131072 ? 2 : -1, b, l, c, r, i;
    size_t wsb = 0;
    CUPTI_OK(cuptiActivityRegisterCallbacks(buf_request, buf_complete));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    if (si < 0) { fprintf(stderr, "A/B mode: n is 32768, 65536 or 131072 (the plans of 30%% / 50%% density)\n"); return 1; }
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return 1;
    for (b = 0; b < 3; b++) {
        ei_config cfg = ei_config_default(), h;
        if (b) cfg.base_budget = budgets[b - 1][si];
        cfg.backend = EI_BACKEND_CUDA;
        cfg.cuda_stream = st;
        for (l = 0; l < 2; l++) {
            cfg.cuda_library = lib[l];
            OK(ei_context_create(&cfg, &g[l][b]));
        }
        h = cfg;
        h.backend = EI_BACKEND_CPU;
        h.cuda_library = NULL;
        OK(ei_context_create(&h, &cpu[b]));
        if (layer_sizes(g[0][b], n, 0).profile > wsb) wsb = layer_sizes(g[0][b], n, 0).profile;
    }
    device_inputs(g[0][0], n, &hq, &hk, &hv, &dq, &dk, &dv, &dout);
    OK(ei_device_alloc(g[0][0], &ws, wsb));
    {
        ei_tensor tq = ei_tensor_make(dq, EI_BF16, n, NH, HD), tk = ei_tensor_make(dk, EI_BF16, n, NKV, HD);
        ei_tensor tv = ei_tensor_make(dv, EI_BF16, n, NKV, HD);
        ei_out_tensor to = ei_out_tensor_make(dout, EI_BF16, n, NH, HD);
        for (b = 0; b < 3; b++) { /* the plans (build A profiles them; both builds plan bit for bit alike) */
            ei_plan hp;
            ei_exec x = ex(ws, layer_sizes(g[0][b], n, 0).profile);
            OK(ei_device_alloc(g[0][b], &pm[b], layer_sizes(g[0][b], n, 0).plan));
            OK(ei_plan_init(g[0][b], &plan[b], n, NKV, HD, 0, pm[b], layer_sizes(g[0][b], n, 0).plan));
            OK(ei_profile(g[0][b], &x, &tq, &tk, &plan[b]));
            OK(ei_plan_init(cpu[b], &hp, n, NKV, HD, 0, NULL, 0));
            OK(ei_plan_copy(g[0][b], &hp, &plan[b], EI_COPY_DEVICE_TO_HOST));
            dens[b + 1] = plan_density(cpu[b], &hp, &g[0][b]->cfg, n);
            ei_plan_free(cpu[b], &hp);
        }
        for (r = -1; r < AB_ROUNDS; r++)
            for (c = 0; c < 4; c++)
                for (i = 0; i < 2; i++) {
                    int L = (r & 1) ? 1 - i : i, B = c ? c - 1 : 0;
                    uint64_t t0, t1;
                    double a = now_ms();
                    cuptiGetTimestamp(&t0);
                    OK(ei_attention_prefill(g[L][B], NULL, &tq, &tk, &tv, c ? &plan[c - 1] : NULL, &to, 0));
                    cudaStreamSynchronize(st);
                    cuptiGetTimestamp(&t1);
                    if (r < 0) continue;
                    call[L][c][r] = now_ms() - a;
                    mark[L][c][r][0] = t0;
                    mark[L][c][r][1] = t1;
                }
    }
    cuptiActivityFlushAll(1);
    for (l = 0; l < 2; l++)
        for (c = 0; c < 4; c++)
            for (r = 0; r < AB_ROUNDS; r++) {
                kern[l][c][r] = scan[l][c][r] = 0;
                for (i = 0; i < nrec; i++) {
                    const Rec *q = &recs[i];
                    if (q->t0 < mark[l][c][r][0] || q->t0 > mark[l][c][r][1]) continue;
                    if (strstr(q->what, "attention")) kern[l][c][r] += (q->t1 - q->t0) / 1e6;
                    else if (strstr(q->what, "scan")) scan[l][c][r] += (q->t1 - q->t0) / 1e3;
                }
            }
    printf("A/B n %lld, %d rounds (A: %s, B: %s); densities %.4f / %.4f / %.4f\n", (long long)n, AB_ROUNDS, lib[0], lib[1],
           dens[1], dens[2], dens[3]);
    printf("%-22s %-2s %10s %10s %10s %9s %9s\n", "case", "", "call ms", "kernel ms", "scans us", "call eff", "kern eff");
    for (c = 0; c < 4; c++)
        for (l = 0; l < 2; l++) {
            double cm = median_of(call[l][c], AB_ROUNDS), km = median_of(kern[l][c], AB_ROUNDS);
            double cd = median_of(call[l][0], AB_ROUNDS), kd = median_of(kern[l][0], AB_ROUNDS);
            printf("%-22s %-2s %10.3f %10.3f %10.1f %9.3f %9.3f\n", cases[c], l ? "B" : "A", cm, km,
                   median_of(scan[l][c], AB_ROUNDS), dens[c] * cd / cm, dens[c] * kd / km);
        }
    return 0;
}

/* ---- plan mode: chunked planning as llama.cpp's glue runs it (see the top of the file) */
typedef struct {
    char name[96];
    double us;
    int count;
} KernSum;
static int cmp_kern(const void *a, const void *b) {
    const KernSum *x = (const KernSum *)a, *y = (const KernSum *)b;
    return x->us < y->us ? 1 : x->us > y->us ? -1 : 0;
}
/* GPU time per kernel (grid stripped: a chunk's grids vary) of the records in [t0, t1], largest first */
static void kernel_sums(uint64_t t0, uint64_t t1, double host_ms) {
    static KernSum ks[256];
    int nk = 0, i, j;
    double all = 0;
    for (i = 0; i < nrec; i++) {
        const Rec *r = &recs[i];
        char name[96];
        char *cut;
        if (r->t0 < t0 || r->t0 > t1 || strncmp(r->what, "GPU", 3)) continue;
        snprintf(name, sizeof name, "%s", r->what);
        if ((cut = strstr(name, " <<<")) != NULL) *cut = 0;
        if (!strncmp(name, "GPU memset", 10) || !strncmp(name, "GPU memcpy", 10)) name[10] = 0;
        for (j = 0; j < nk && strcmp(ks[j].name, name); j++) {}
        if (j == nk) {
            if (nk == 256) continue;
            snprintf(ks[nk].name, sizeof ks[nk].name, "%s", name);
            ks[nk].us = 0;
            ks[nk++].count = 0;
        }
        ks[j].us += (r->t1 - r->t0) / 1e3;
        ks[j].count++;
        all += (r->t1 - r->t0) / 1e3;
    }
    qsort(ks, (size_t)nk, sizeof ks[0], cmp_kern);
    printf("  GPU busy %.3f ms of %.3f ms on the host clock; per kernel (total ms, count, mean us, share of busy):\n",
           all / 1e3, host_ms);
    for (j = 0; j < nk; j++)
        printf("    %9.3f ms %6d %9.1f us %5.1f%%  %s\n", ks[j].us / 1e3, ks[j].count, ks[j].us / ks[j].count,
               100.0 * ks[j].us / (all > 0 ? all : 1), ks[j].name);
}
/* One schedule: ei_profile_chunk over chunks of m queries from position 0 (a roll-back of the
   plan), a stream synchronisation after each chunk when sync (llama.cpp's gpu_timing=1) or only at
   the end; the CUPTI time of each chunk's start in marks (may be NULL). Returns host ms. */
static double plan_schedule(const ei_context *g, const ei_exec *x, const ei_tensor *tq, const ei_tensor *tk,
                            ei_plan *plan, int64_t m, int sync, cudaStream_t st, uint64_t *marks) {
    const int64_t n = tq->n_tokens;
    const size_t row = (size_t)tq->token_stride * (tq->dtype == EI_F32 ? 4 : 2);
    double a = now_ms();
    int64_t t;
    int c = 0;
    if (m <= 0) { /* the whole prompt at once: ei_profile */
        if (marks) cuptiGetTimestamp(&marks[0]);
        OK(ei_profile(g, x, tq, tk, plan));
        cudaStreamSynchronize(st);
        if (marks) cuptiGetTimestamp(&marks[1]);
        return now_ms() - a;
    }
    for (t = 0; t < n; t += m, c++) {
        ei_tensor qc = *tq;
        qc.data = (const char *)tq->data + (size_t)t * row;
        qc.n_tokens = n - t < m ? n - t : m;
        if (marks) cuptiGetTimestamp(&marks[c]);
        OK(ei_profile_chunk(g, x, &qc, tk, plan, t, t + qc.n_tokens == n));
        if (sync) cudaStreamSynchronize(st);
    }
    cudaStreamSynchronize(st);
    if (marks) cuptiGetTimestamp(&marks[c]);
    return now_ms() - a;
}
/* plan mode: groups of H KV D n m on the command line (default: Gemma 3 270M's global layers at 32k
   and 128k in chunks of 512 and 4096, SmolLM2-135M at 8k in chunks of 512) */
static int plan_mode(int argc, char **argv) {
    long long args[60];
    const int na = shape_groups(argc, argv, args);
    int i, rep;
    cudaStream_t st;
    CUPTI_OK(cuptiActivityRegisterCallbacks(buf_request, buf_complete));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return 1;
    for (i = 0; i < na; i += 5) {
        const int H = (int)args[i], KV = (int)args[i + 1], D = (int)args[i + 2];
        const int64_t n = args[i + 3], m = args[i + 4], nchunks = m > 0 ? (n + m - 1) / m : 1;
        const uint32_t pflags = m > 0 ? EI_PLAN_CHUNKED : 0;
        const int bf = getenv("EI_TRACE_BF16") && getenv("EI_TRACE_BF16")[0] == '1';
        ei_config cfg = ei_config_quality();
        ei_context *g;
        ei_plan plan;
        ei_sizes z;
        ei_exec x;
        void *dq, *dk, *ws;
        uint16_t *hq, *hk;
        float *fq;
        uint64_t *marks = (uint64_t *)calloc((size_t)nchunks + 1, sizeof *marks);
        double v[3], synced, b2b, traced;
        int64_t j, c;
        cfg.backend = EI_BACKEND_CUDA;
        cfg.cuda_stream = st;
        cfg.cuda_deferred_errors = 1; /* as the glue's layer ops: no read-back */
        OK(ei_context_create(&cfg, &g));
        /* llama.cpp's types: f32 queries, an f16 cache */
        hq = noise_heads(n, H, D, H / KV, 1);
        hk = noise_heads(n, KV, D, 1, 0);
        fq = bf ? NULL : (float *)malloc((size_t)n * H * D * 4); /* EI_TRACE_BF16: q stays bf16 */
        if ((!bf && !fq) || !marks) die("out of host memory", EI_ERR_NOMEM);
        for (j = 0; j < n * H * D && !bf; j++) {
            uint32_t u = (uint32_t)hq[j] << 16;
            memcpy(&fq[j], &u, 4);
        }
        for (j = 0; j < n * KV * D && !bf; j++) {
            float f;
            uint32_t u = (uint32_t)hk[j] << 16;
            memcpy(&f, &u, 4);
            hk[j] = ei__f32_to_f16(f);
        }
        dq = bf ? upload(g, hq, (size_t)n * H * D * 2) : upload(g, fq, (size_t)n * H * D * 4);
        dk = upload(g, hk, (size_t)n * KV * D * 2);
        z = shape_sizes(g, n, H, KV, D, pflags);
        OK(ei_device_alloc(g, &ws, z.profile));
        x = ex(ws, z.profile);
        memset(&plan, 0, sizeof plan);
        OK(ei_plan_init(g, &plan, n, KV, D, pflags, NULL, 0));
        {
            ei_tensor tq = ei_tensor_make(dq, bf ? EI_BF16 : EI_F32, n, H, D);
            ei_tensor tk = ei_tensor_make(dk, bf ? EI_BF16 : EI_F16, n, KV, D);
            plan_schedule(g, &x, &tq, &tk, &plan, m, 1, st, NULL); /* warm-up */
            for (rep = 0; rep < 3; rep++) v[rep] = plan_schedule(g, &x, &tq, &tk, &plan, m, 1, st, NULL);
            synced = median_ms(v, 3);
            for (rep = 0; rep < 3; rep++) v[rep] = plan_schedule(g, &x, &tq, &tk, &plan, m, 0, st, NULL);
            b2b = median_ms(v, 3);
            OK(ei_cuda_status(g));
            cuptiActivityFlushAll(1);
            nrec = 0;
            traced = plan_schedule(g, &x, &tq, &tk, &plan, m, 1, st, marks);
            cuptiActivityFlushAll(1);
            qsort(recs, (size_t)nrec, sizeof recs[0], cmp_rec);
        }
        printf("\n== plan: %d/%d heads, d %d, n %lld in chunks of %lld (%lld calls; 0: ei_profile), quality config, %s\n",
               H, KV, D, (long long)n, (long long)m, (long long)nchunks, bf ? "bf16 q, bf16 k" : "f32 q, f16 k");
        printf("  schedule: %.3f ms synchronised per chunk (%.1f us a call), %.3f ms back to back (%.1f us a call)\n",
               synced, 1e3 * synced / nchunks, b2b, 1e3 * b2b / nchunks);
        kernel_sums(marks[0], marks[nchunks], traced);
        c = nchunks >= 3 ? nchunks - 2 : 0; /* a chunk near the end: the longest key prefix but not final */
        {
            char title[64];
            snprintf(title, sizeof title, "chunk %lld of %lld", (long long)c, (long long)nchunks);
            timeline(title, marks[c], marks[c + 1], marks[c + 1]);
        }
        ei_plan_free(g, &plan);
        ei_device_free(g, ws);
        ei_device_free(g, dq);
        ei_device_free(g, dk);
        ei_context_destroy(g);
        free(hq); free(hk); free(fq); free(marks);
    }
    return 0;
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
    int k, rep;
    if (argc > 1 && !strcmp(argv[1], "plan")) return plan_mode(argc - 2, argv + 2);
    if (argc > 3) {
        const char *libs[2] = {argv[2], argv[3]};
        return ab_mode(n, libs);
    }
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
    device_inputs(g, n, &hq, &hk, &hv, &dq, &dk, &dv, &dout);
    z = layer_sizes(g, n, 0);
    OK(ei_device_alloc(g, &ws, z.profile));
    OK(ei_device_alloc(g, &plan_mem, z.plan));
    OK(ei_device_alloc(g, &aws, layer_sizes(gd, n, 0).prefill + 1));
    OK(ei_plan_init(g, &plan, n, NKV, HD, 0, plan_mem, z.plan));
    x = ex(ws, z.profile);
    xa = ex(aws, layer_sizes(gd, n, 0).prefill);
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
