/* plan_digest: one FNV-1a digest per case of chunked and whole-prompt plans
   (every array the plan holds, and its counts), over configurations, GQA
   shapes, dtypes and chunk protocols (cuts inside segments, roll-backs,
   skipped positions, a final call without queries, a second turn). Built
   against two versions of the header, equal output means the plans are
   bit-identical: how an internal change to planning shows it changed
   nothing (issue 31's plan layout did so).

     cc -O2 -I<dir of entropyinfer.h> tests/plan_digest.c -lm -lpthread -ldl
     ./a.out > digests.txt                       (then diff two builds)

   Every SIMD path this CPU supports runs every case. */
#define ENTROPYINFER_IMPLEMENTATION
#include "entropyinfer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
/* The plan's arrays and counts (not its chunked state: that is internal). */
static uint64_t plan_digest(const ei_plan *p) {
    size_t rows = (size_t)p->n_kv_heads * (size_t)p->seg_capacity;
    uint64_t h = 14695981039346656037ull;
    h = fnv(h, &p->n_tokens, sizeof p->n_tokens);
    h = fnv(h, &p->n_segments, sizeof p->n_segments);
    h = fnv(h, &p->n_blocks, sizeof p->n_blocks);
    h = fnv(h, &p->final, sizeof p->final);
    h = fnv(h, p->entropy, rows * 4);
    h = fnv(h, p->head_class, (size_t)p->n_kv_heads);
    h = fnv(h, p->budget, rows * 4);
    h = fnv(h, p->keep_blocks, rows * 4);
    h = fnv(h, p->keep_count, rows * 4);
    h = fnv(h, p->block_index, rows * (size_t)p->max_keep * 4);
    if (p->scores) h = fnv(h, p->scores, rows * (size_t)(p->blk_capacity > 0 ? p->blk_capacity : 1) * 4);
    return h;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}
static uint16_t to_bf16(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); }
static uint16_t to_f16(float f) { /* via the library's own view: values here are small and normal */
    uint32_t u, s, e, m;
    memcpy(&u, &f, 4);
    s = (u >> 16) & 0x8000u; e = (u >> 23) & 0xff; m = u & 0x7fffffu;
    if (e < 113) return (uint16_t)s; /* tiny: zero */
    return (uint16_t)(s | ((e - 112) << 10) | ((m + 0x1000u) >> 13));
}
/* Q and K with structure: a per-head direction plus noise, and keys that
   drift, so blocks rank unevenly and entropies differ per segment. */
static void *make(int64_t n, int heads, int d, ei_dtype dt, float drift) {
    size_t i, cnt = (size_t)n * (size_t)heads * (size_t)d, es = dt == EI_F32 ? 4 : 2;
    unsigned char *m = (unsigned char *)malloc(cnt * es);
    for (i = 0; i < cnt; ++i) {
        size_t t = i / ((size_t)heads * (size_t)d), j = i % (size_t)d;
        float v = frand() + drift * (float)((t / 97 + j) % 5) * 0.3f;
        if (dt == EI_F32) memcpy(m + i * 4, &v, 4);
        else { uint16_t x = dt == EI_BF16 ? to_bf16(v) : to_f16(v); memcpy(m + i * 2, &x, 2); }
    }
    return m;
}

/* A protocol: calls of (first position, end, is_final); end -1: a final call
   without queries where the plan ends. */
typedef struct { const char *name; int64_t call[8][3]; int n; } protocol;

int main(void) {
    static const protocol protos[] = {
        {"whole (one final chunk)", {{0, 1900, 1}}, 1},
        {"chunks of 256", {{0, 256, 0}, {256, 512, 0}, {512, 768, 0}, {768, 1024, 0}, {1024, 1280, 0}, {1280, 1536, 0}, {1536, 1792, 0}, {1792, 1900, 1}}, 8},
        {"ragged chunks", {{0, 333, 0}, {333, 700, 0}, {700, 701, 0}, {701, 1290, 0}, {1290, 1700, 0}, {1700, 1900, 1}}, 6},
        {"roll back to 600, then on", {{0, 900, 0}, {600, 1200, 0}, {1200, 1600, 0}, {1600, 1900, 1}}, 4},
        {"skip 1000..1100", {{0, 500, 0}, {500, 1000, 0}, {1100, 1500, 0}, {1500, 1900, 1}}, 4},
        {"final without queries", {{0, 512, 0}, {512, 1100, 0}, {1100, 1900, 0}, {1900, -1, 1}}, 4},
        {"two turns", {{0, 800, 0}, {800, 1200, 1}, {1200, 1500, 0}, {1500, 1900, 1}}, 4},
    };
    static const ei_dtype dts[3] = {EI_F32, EI_BF16, EI_F16};
    const int64_t N = 1900;
    int cfgi, shape, di, pi, n_cases = 0, sm;
    for (sm = EI_SIMD_SCALAR; sm <= EI_SIMD_NEON_BF16; ++sm)
    for (cfgi = 0; cfgi < 4; ++cfgi) {
        ei_config c = cfgi == 1 ? ei_config_quality() : ei_config_default();
        ei_context *ctx;
        if (!ei_cpu_supports((ei_simd)sm)) break;
        c.simd = (ei_simd)sm;
        c.segment_size = 128; c.block_size = 8;
        if (cfgi == 1) c.rank_samples = 16;
        if (cfgi == 3) c.sink_blocks = 1, c.local_blocks = 2;
        if (cfgi == 2) c.per_segment_budget = 1;
        if (cfgi == 3) c.top_p = 0.9f;
        if (ei_context_create(&c, &ctx) != EI_OK) { printf("context: %s\n", ei_last_error()); return 1; }
        for (shape = 0; shape < 3; ++shape) {
            static const int heads[3] = {4, 8, 6}, kvs[3] = {4, 2, 1}, dims[3] = {16, 64, 40};
            int H = heads[shape], KV = kvs[shape], D = dims[shape];
            for (di = 0; di < 3; ++di) {
                void *qm = make(N, H, D, dts[di], 1.0f), *km = make(N, KV, D, dts[di], 2.0f);
                ei_tensor kt = ei_tensor_make(km, dts[di], N, KV, D);
                size_t pb, wb;
                void *pm, *ws;
                ei_plan plan;
                uint32_t flags = EI_PLAN_CHUNKED | (cfgi == 0 ? EI_PLAN_SCORES : 0u);
#if EI_VERSION_MINOR >= 2 /* the 0.2 API (issue 31): one size query, calls take an ei_exec */
                ei_shape sh;
                ei_sizes sz;
                ei_exec x;
                memset(&sh, 0, sizeof sh);
                sh.max_tokens = N; sh.n_heads = H; sh.n_kv_heads = KV; sh.head_dim = D; sh.plan_flags = flags;
                if (ei_layer_sizes(ctx, &sh, &sz) != EI_OK) { printf("size: %s\n", ei_last_error()); return 1; }
                pb = sz.plan; wb = sz.profile;
#else
                if (ei_plan_size(ctx, N, KV, D, flags, &pb) != EI_OK ||
                    ei_profile_workspace_size(ctx, N, H, KV, D, &wb) != EI_OK) { printf("size: %s\n", ei_last_error()); return 1; }
#endif
                pm = malloc(pb); ws = malloc(wb);
#if EI_VERSION_MINOR >= 2
                memset(&x, 0, sizeof x);
                x.workspace = ws; x.workspace_bytes = wb;
#endif
                if (ei_plan_init(ctx, &plan, N, KV, D, flags, pm, pb) != EI_OK) { printf("init: %s\n", ei_last_error()); return 1; }
                for (pi = 0; pi < (int)(sizeof protos / sizeof protos[0]); ++pi) {
                    const protocol *p = &protos[pi];
                    int i;
                    ei_result r = EI_OK;
                    for (i = 0; i < p->n && r == EI_OK; ++i) {
                        int64_t start = p->call[i][0], end = p->call[i][1];
                        size_t es = dts[di] == EI_F32 ? 4 : 2;
                        ei_tensor qt = ei_tensor_make((const unsigned char *)qm + (size_t)start * (size_t)H * (size_t)D * es,
                                                      dts[di], end - start, H, D);
#if EI_VERSION_MINOR >= 2
                        r = ei_profile_chunk(ctx, &x, end < 0 ? NULL : &qt, &kt, &plan, start, (int)p->call[i][2]);
#else
                        r = ei_profile_chunk(ctx, end < 0 ? NULL : &qt, &kt, &plan, start, (int)p->call[i][2], ws, wb);
#endif
                    }
                    printf("%-11s cfg %d  %d/%d heads d%-3d %-4s  %-26s  %s %016llx\n", ei_simd_name((ei_simd)sm), cfgi, H, KV, D,
                           dts[di] == EI_F32 ? "f32" : dts[di] == EI_BF16 ? "bf16" : "f16", p->name,
                           r == EI_OK ? "ok " : ei_result_name(r), (unsigned long long)plan_digest(&plan));
                    ++n_cases;
                }
                free(pm); free(ws); free(qm); free(km);
            }
        }
        ei_context_destroy(ctx);
    }
    fprintf(stderr, "%d cases\n", n_cases);
    return 0;
}
