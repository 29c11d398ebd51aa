/* tests/test_cuda.c - the CUDA backend against the golden cases, the CPU
   implementation and plain f32 references.

     test_cuda [golden_dir]     GPU tests (needs a GPU and build/libentropyinfer_cuda.so)
     test_cuda --fallback       no-GPU machine: EI_BACKEND_CUDA must fail cleanly
                                with EI_ERR_BACKEND and the CPU path keep working
     test_cuda --quick [dir]    a smaller GPU subset (for compute-sanitizer)

   Everything goes through the public API on a context with
   EI_BACKEND_CUDA, as an engine would; device memory comes from
   ei_device_alloc/ei_device_copy: no CUDA header or library at build time.
   A golden folder that cannot be read, or holds no case, is a failure. The
   budgets the golden comparison allows come from the header's own rules
   (ei__head_rigid, ei__budget_next, ei__keep_of, ei__cap_blocks); the
   attention reference is check.h's ref_attention_token. */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "check.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>

/* ------------------------------------------------------------ small helpers */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* [0,1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
static float nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f2h(float f) { /* round to nearest even, normal range + subnormals */
    uint32_t u, sign, e;
    int32_t exp;
    uint32_t mant;
    memcpy(&u, &f, 4);
    sign = (u >> 16) & 0x8000u;
    e = (u >> 23) & 0xFF;
    mant = u & 0x7FFFFF;
    if (e == 0xFF) return (uint16_t)(sign | 0x7C00 | (mant ? 0x200 : 0));
    exp = (int32_t)e - 127 + 15;
    if (exp >= 31) return (uint16_t)(sign | 0x7C00);
    if (exp <= 0) {
        uint32_t m, shift, r, half;
        if (exp < -10) return (uint16_t)sign;
        m = mant | 0x800000;
        shift = (uint32_t)(14 - exp);
        r = m >> shift;
        half = 1u << (shift - 1);
        if ((m & ((1u << shift) - 1)) > half || ((m & ((1u << shift) - 1)) == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    {
        uint32_t r = ((uint32_t)exp << 10) | (mant >> 13);
        uint32_t rem = mant & 0x1FFF;
        if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
}
static float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF, u;
    float f;
    if (e == 0) {
        f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (e == 31) u = sign | 0x7F800000 | (m << 13);
    else u = sign | ((e - 15 + 127) << 23) | (m << 13);
    memcpy(&f, &u, 4);
    return f;
}

static void *read_file(const char *dir, const char *name, size_t *bytes) {
    char path[1024];
    FILE *f;
    long n;
    void *buf;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(n > 0 ? (size_t)n : 1);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    if (bytes) *bytes = (size_t)n;
    return buf;
}
/* f32 array from NAME.f32, or NAME.bf16 (a compact copy of exact inputs) */
static float *read_f32(const char *dir, const char *stem, size_t *count) {
    char name[256];
    size_t bytes = 0, i;
    void *raw;
    snprintf(name, sizeof name, "%s.f32", stem);
    raw = read_file(dir, name, &bytes);
    if (raw) {
        if (count) *count = bytes / 4;
        return (float *)raw;
    }
    snprintf(name, sizeof name, "%s.bf16", stem);
    raw = read_file(dir, name, &bytes);
    if (raw) {
        float *f = (float *)malloc((bytes / 2) * 4 + 4);
        for (i = 0; i < bytes / 2; i++) f[i] = bf2f(((uint16_t *)raw)[i]);
        free(raw);
        if (count) *count = bytes / 2;
        return f;
    }
    return NULL;
}

typedef struct meta { char key[64][48]; char val[64][64]; int n; } meta;
static int meta_read(const char *dir, meta *m) {
    size_t bytes;
    char *txt = (char *)read_file(dir, "meta.txt", &bytes), *line, *save = NULL;
    m->n = 0;
    if (!txt) return 0;
    txt = (char *)realloc(txt, bytes + 1);
    txt[bytes] = 0;
    for (line = strtok_r(txt, "\n", &save); line && m->n < 64; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        if (!eq) continue;
        *eq = 0;
        snprintf(m->key[m->n], sizeof m->key[0], "%s", line);
        snprintf(m->val[m->n], sizeof m->val[0], "%s", eq + 1);
        m->n++;
    }
    free(txt);
    return 1;
}
static const char *meta_s(const meta *m, const char *key) {
    int i;
    for (i = 0; i < m->n; i++)
        if (!strcmp(m->key[i], key)) return m->val[i];
    return "";
}
static double meta_f(const meta *m, const char *key) { return atof(meta_s(m, key)); }
static int64_t meta_i(const meta *m, const char *key) { return atoll(meta_s(m, key)); }

/* ------------------------------------------------------------ device helpers */
static ei_context *g_gpu, *g_cpu;
static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CHECK_OK(ei_device_alloc(g_gpu, &p, bytes));
    return p;
}
static void dev_free(void *p) { ei_device_free(g_gpu, p); }
static void dev_put(void *dst, const void *src, size_t bytes) {
    CHECK_OK(ei_device_copy(g_gpu, dst, src, bytes, EI_COPY_HOST_TO_DEVICE));
}
static void dev_get(void *dst, const void *src, size_t bytes) {
    CHECK_OK(ei_device_copy(g_gpu, dst, src, bytes, EI_COPY_DEVICE_TO_HOST));
}
static void dev_copy_d2d(void *dst, const void *src, size_t bytes) {
    CHECK_OK(ei_device_copy(g_gpu, dst, src, bytes, EI_COPY_DEVICE_TO_DEVICE));
}
/* upload f32 values as dtype; returns the device pointer */
static void *dev_upload(const float *x, size_t count, ei_dtype dt) {
    size_t es = dt == EI_F32 ? 4 : 2, i;
    void *host = malloc(count * es + 16), *d = dev_alloc(count * es + 16);
    for (i = 0; i < count; i++) {
        if (dt == EI_F32) ((float *)host)[i] = x[i];
        else if (dt == EI_BF16) ((uint16_t *)host)[i] = f2bf(x[i]);
        else ((uint16_t *)host)[i] = f2h(x[i]);
    }
    dev_put(d, host, count * es);
    free(host);
    return d;
}
static void round_to(float *x, size_t count, ei_dtype dt) {
    size_t i;
    for (i = 0; i < count; i++)
        x[i] = dt == EI_BF16 ? bf2f(f2bf(x[i])) : dt == EI_F16 ? h2f(f2h(x[i])) : x[i];
}

static ei_config base_config(void) {
    ei_config c = ei_config_default();
    c.backend = EI_BACKEND_CPU;
    return c;
}
static ei_context *make_ctx(const ei_config *c, ei_backend backend) {
    ei_config cc = *c;
    ei_context *ctx = NULL;
    cc.backend = backend;
    CHECK_OK(ei_context_create(&cc, &ctx));
    return ctx;
}


/* A device plan profiled on the GPU and its host copy. */
typedef struct gpu_plan { ei_plan dev, host; void *mem, *ws; } gpu_plan;
static void gpu_profile(ei_context *g, ei_context *c, const ei_tensor *q, const ei_tensor *k, uint32_t flags,
                        gpu_plan *gp, ei_result expect) {
    ei_result r;
    int64_t n = q->n_tokens;
    ei_sizes z = layer_sizes(g, n, q->n_heads, k->n_heads, q->head_dim, flags, 1);
    ei_exec x;
    gp->mem = dev_alloc(z.plan);
    CHECK_OK(ei_plan_init(g, &gp->dev, n, k->n_heads, q->head_dim, flags, gp->mem, z.plan));
    gp->ws = dev_alloc(z.profile);
    x = ex(1, gp->ws, z.profile);
    r = ei_profile(g, &x, q, k, &gp->dev);
    CHECK(r == expect, "gpu profile returned %s (%s), expected %s", ei_result_name(r), ei_last_error(),
          ei_result_name(expect));
    CHECK_OK(ei_plan_init(c, &gp->host, n, k->n_heads, q->head_dim, flags, NULL, 0));
    if (r == EI_OK) CHECK_OK(ei_plan_copy(g, &gp->host, &gp->dev, EI_COPY_DEVICE_TO_HOST));
}
static void gpu_plan_free(gpu_plan *gp) {
    dev_free(gp->mem);
    dev_free(gp->ws);
    ei_plan_free(g_cpu, &gp->host);
}

static int close_enough(double a, double b, double atol, double rtol) { return fabs(a - b) <= atol + rtol * fabs(b); }

/* The kept set `got` (k entries) against reference scores ref[0..len): it
   must hold every index scoring above the k-th best (+rel), only indices
   scoring at least the k-th best (-rel2), and no duplicates. */
static int check_set(const int32_t *got, int k, const float *ref, int len, double rel, double rel2, char *why,
                     size_t why_size) {
    int i, j, cnt_above = 0;
    float *sorted = (float *)malloc(sizeof(float) * (size_t)(len > 0 ? len : 1));
    unsigned char *in = (unsigned char *)calloc((size_t)(len > 0 ? len : 1), 1);
    double kth;
    int ok = 1;
    memcpy(sorted, ref, sizeof(float) * (size_t)len);
    /* k-th largest by partial selection (small sizes) */
    for (i = 0; i < k; i++) {
        int best = i;
        for (j = i + 1; j < len; j++)
            if (sorted[j] > sorted[best]) best = j;
        { float t = sorted[i]; sorted[i] = sorted[best]; sorted[best] = t; }
    }
    kth = k > 0 ? sorted[k - 1] : INFINITY;
    for (i = 0; i < k && ok; i++) {
        if (got[i] < 0 || got[i] >= len) { snprintf(why, why_size, "index %d out of 0..%d", got[i], len - 1); ok = 0; break; }
        if (in[got[i]]) { snprintf(why, why_size, "index %d twice", got[i]); ok = 0; break; }
        in[got[i]] = 1;
        if (ref[got[i]] < kth - rel2 * fabs(kth) - 1e-30) {
            snprintf(why, why_size, "index %d scores %g below the k-th best %g", got[i], ref[got[i]], kth);
            ok = 0;
        }
    }
    for (j = 0; j < len && ok; j++)
        if (ref[j] > kth + rel * fabs(kth) + 1e-30) {
            cnt_above++;
            if (!in[j]) { snprintf(why, why_size, "index %d (score %g > k-th %g) missing", j, ref[j], kth); ok = 0; }
        }
    free(sorted);
    free(in);
    return ok;
}

/* ------------------------------------------------------------ golden prefill */
/* The budget of segment s of a head from the golden entropies, by the
   header's rules: base_budget when the head is rigid, else the recurrence
   from segment 0 (ei__budget_next). */
static double golden_budget(const ei_config *c, const float *H, int s, int rigid) {
    double B = 0.0;
    int t;
    if (rigid) return (double)c->base_budget;
    for (t = 0; t <= s; t++) B = ei__budget_next(c, t, B, H[t], t > 0 ? H[t - 1] : 0.0f);
    return B;
}
/* Whether keep count got may differ from the golden one (want) for segment
   s: only when the golden budget lies within 1e-3 tokens of a block boundary,
   where float32 entropies may floor either way (FORMAT.md). */
static int keep_on_edge(const ei_config *c, int s, double B, int64_t n, int64_t nblk, int32_t got) {
    int64_t cap = ei__cap_blocks(c, s, n, nblk);
    return got == ei__keep_of(c, s, B - 1e-3, cap) || got == ei__keep_of(c, s, B + 1e-3, cap);
}

static void golden_prefill(const char *dir, const char *name, ei_dtype dt) {
    meta m;
    size_t nq, nk;
    float *q, *k, *ent, *scores;
    uint8_t *rigid;
    int32_t *keep, *topk, *segk;
    int64_t n;
    int nh, nkv, D, nseg, nblk, maxk, bps, h, s, bad_ent = 0, bad_keep = 0, bad_set = 0, bad_cnt = 0, bad_rigid = 0;
    ei_config c;
    ei_context *g, *cpu;
    ei_tensor tq, tk;
    void *dq, *dk;
    gpu_plan gp, gp2;
    char why[256];
    meta_read(dir, &m);
    n = meta_i(&m, "n_tokens"); nh = (int)meta_i(&m, "n_heads"); nkv = (int)meta_i(&m, "n_kv_heads");
    D = (int)meta_i(&m, "head_dim"); nseg = (int)meta_i(&m, "n_segments"); nblk = (int)meta_i(&m, "n_blocks");
    maxk = (int)meta_i(&m, "max_k");
    c = base_config();
    c.segment_size = (int32_t)meta_i(&m, "segment_size");
    c.block_size = (int32_t)meta_i(&m, "block_size");
    c.base_budget = (int32_t)meta_i(&m, "base_budget");
    c.rigid_entropy = (float)meta_f(&m, "rigid_entropy");
    c.delta_t = (float)meta_f(&m, "delta_t");
    c.alpha = (float)meta_f(&m, "alpha");
    bps = c.segment_size / c.block_size;
    q = read_f32(dir, "q", &nq);
    k = read_f32(dir, "k", &nk);
    ent = read_f32(dir, "entropy", NULL);
    scores = read_f32(dir, "scores", NULL);
    rigid = (uint8_t *)read_file(dir, "rigid.u8", NULL);
    keep = (int32_t *)read_file(dir, "keep_blocks.i32", NULL);
    topk = (int32_t *)read_file(dir, "topk.i32", NULL);
    segk = (int32_t *)read_file(dir, "segment_topk.i32", NULL);
    if (!q || !k || !keep) {
        CHECK(0, "golden %s: q, k or keep_blocks.i32 missing or unreadable in %s", name, dir);
        free(q); free(k); free(ent); free(scores); free(rigid); free(keep); free(topk); free(segk);
        return;
    }
    g = make_ctx(&c, EI_BACKEND_CUDA);
    cpu = make_ctx(&c, EI_BACKEND_CPU);
    dq = dev_upload(q, nq, dt);
    dk = dev_upload(k, nk, dt);
    tq = ei_tensor_make(dq, dt, n, nh, D);
    tk = ei_tensor_make(dk, dt, n, nkv, D);
    gpu_profile(g, cpu, &tq, &tk, EI_PLAN_SCORES, &gp, EI_OK);
    CHECK(gp.host.n_segments == nseg && gp.host.n_blocks == nblk, "%s: segments %d/%d blocks %d/%d", name,
          gp.host.n_segments, nseg, gp.host.n_blocks, nblk);
    for (h = 0; h < nkv; h++) {
        int head_rigid = rigid ? rigid[h] : ent ? ei__head_rigid(&c, ent + (size_t)h * nseg, nseg) : 0;
        if (rigid && nseg >= 2 && gp.host.head_class[h] != rigid[h]) bad_rigid++;
        for (s = 0; s < nseg; s++) {
            int32_t gk = gp.host.keep_blocks[h * gp.host.seg_capacity + s], rk = keep[h * nseg + s];
            if (ent && nblk > 0 && !close_enough(gp.host.entropy[h * gp.host.seg_capacity + s], ent[h * nseg + s], 1e-6, 1e-3))
                bad_ent++;
            if (gk != rk) {
                /* allowed only at a block boundary of the reference budget */
                if (!ent || !keep_on_edge(&c, s, golden_budget(&c, ent + (size_t)h * nseg, s, head_rigid), n, nblk, gk))
                    bad_keep++;
                continue;
            }
            if (s == 0 || rk == 0 || !scores) continue;
            if (!check_set(gp.host.block_index + ((size_t)h * gp.host.seg_capacity + s) * gp.host.max_keep, rk,
                           scores + ((size_t)h * nseg + s) * nblk, (int)(s * bps < nblk ? s * bps : nblk), 1e-6, 1e-3,
                           why, sizeof why)) {
                if (bad_set++ < 3) printf("  %s h%d s%d: %s\n", name, h, s, why);
            }
            {   /* the rest of the row is -1 padding */
                int j;
                for (j = rk; j < gp.host.max_keep; j++)
                    if (gp.host.block_index[((size_t)h * gp.host.seg_capacity + s) * gp.host.max_keep + j] != -1) {
                        bad_set++;
                        break;
                    }
            }
        }
    }
    CHECK(bad_ent == 0, "%s (%s): %d entropies off", name, dt == EI_F32 ? "f32" : "bf16", bad_ent);
    CHECK(bad_rigid == 0, "%s: %d head classes differ", name, bad_rigid);
    CHECK(bad_keep == 0, "%s: %d keep_blocks differ", name, bad_keep);
    CHECK(bad_set == 0, "%s: %d top-k sets differ", name, bad_set);
    (void)maxk; (void)topk;
    /* the reference's one count per segment */
    if (segk) {
        ei_config c2 = c;
        ei_context *g2;
        c2.per_segment_budget = 1;
        g2 = make_ctx(&c2, EI_BACKEND_CUDA);
        gpu_profile(g2, cpu, &tq, &tk, 0, &gp2, EI_OK);
        for (h = 0; h < nkv; h++)
            for (s = 0; s < nseg; s++)
                if (gp2.host.keep_count[h * gp2.host.seg_capacity + s] != segk[s]) bad_cnt++;
        CHECK(bad_cnt == 0, "%s: %d per-segment counts differ from segment_topk", name, bad_cnt);
        gpu_plan_free(&gp2);
        ei_context_destroy(g2);
    }
    /* GPU vs CPU on the same input (f32 CPU reference of the same values) */
    {
        ei_plan cp;
        ei_sizes z = layer_sizes(cpu, n, nh, nkv, D, EI_PLAN_SCORES, 1);
        void *ws;
        ei_exec x;
        ei_tensor hq = ei_tensor_make(q, EI_F32, n, nh, D), hk = ei_tensor_make(k, EI_F32, n, nkv, D);
        int diff_keep = 0, diff_set = 0, exact = 0, total = 0;
        if (dt != EI_F32) { round_to(q, nq, dt); round_to(k, nk, dt); }
        CHECK_OK(ei_plan_init(cpu, &cp, n, nkv, D, EI_PLAN_SCORES, NULL, 0));
        ws = malloc(z.profile);
        x = ex(1, ws, z.profile);
        CHECK_OK(ei_profile(cpu, &x, &hq, &hk, &cp));
        for (h = 0; h < nkv; h++)
            for (s = 1; s < nseg; s++) {
                size_t row = (size_t)h * cp.seg_capacity + s;
                int kc = cp.keep_count[row];
                if (kc != gp.host.keep_count[row]) { diff_keep++; continue; }
                total++;
                if (!memcmp(cp.block_index + row * cp.max_keep, gp.host.block_index + row * cp.max_keep, (size_t)kc * 4)) exact++;
                else if (!check_set(gp.host.block_index + row * cp.max_keep, kc, cp.scores + row * cp.blk_capacity,
                                    s * bps < nblk ? s * bps : nblk, 1e-3, 1e-3, why, sizeof why))
                    diff_set++;
            }
        CHECK(diff_keep == 0 && diff_set == 0, "%s: GPU vs CPU plan: %d counts, %d sets differ", name, diff_keep, diff_set);
        printf("  %-22s %-4s gpu==golden ok; gpu vs cpu: %d/%d rankings identical\n", name,
               dt == EI_F32 ? "f32" : dt == EI_BF16 ? "bf16" : "f16", exact, total);
        free(ws);
        ei_plan_free(cpu, &cp);
    }
    gpu_plan_free(&gp);
    dev_free(dq); dev_free(dk);
    ei_context_destroy(g); ei_context_destroy(cpu);
    free(q); free(k); free(ent); free(scores); free(rigid); free(keep); free(topk); free(segk);
}

/* ------------------------------------------------------------ decode */
typedef struct dev_keep { ei_keep_set ks; void *idx, *mask, *pooled, *ws, *ring; ei_decoder dec; } dev_keep;

static void run_decode_gpu(ei_context *g, const ei_config *c, const float *k, const float *obs, int64_t n, int nh,
                           int nkv, int D, ei_dtype dt, dev_keep *dk, void **dkey) {
    ei_sizes z = layer_sizes(g, n, nh, nkv, D, 0, 1);
    ei_exec x;
    int heads_out = c->per_kv_head ? nkv : nh, W = c->window;
    int64_t L = n - W > 0 ? n - W : 0;
    ei_tensor tq, tk;
    void *dq = dev_upload(obs, (size_t)W * nh * D, dt);
    *dkey = dev_upload(k, (size_t)n * nkv * D, dt);
    dk->ring = dev_alloc(z.decoder);
    CHECK_OK(ei_decoder_init(g, &dk->dec, nh, nkv, D, dk->ring, z.decoder));
    tq = ei_tensor_make(dq, dt, W, nh, D);
    CHECK_OK(ei_decode_observe(g, &dk->dec, &tq, n - W, 0));
    memset(&dk->ks, 0, sizeof dk->ks);
    dk->ks.heads_out = heads_out;
    dk->ks.capacity = c->decode_budget;
    dk->idx = dev_alloc((size_t)heads_out * c->decode_budget * 4);
    dk->mask = dev_alloc((size_t)heads_out * n);
    dk->pooled = dev_alloc((size_t)heads_out * (L > 0 ? L : 1) * 4);
    dk->ks.index = (int32_t *)dk->idx;
    dk->ks.mask = (uint8_t *)dk->mask;
    dk->ks.mask_capacity = n;
    dk->ks.pooled = (float *)dk->pooled;
    dk->ks.pooled_capacity = L > 0 ? L : 1;
    dk->ws = dev_alloc(z.decode_keep);
    tk = ei_tensor_make(*dkey, dt, n, nkv, D);
    x = ex(1, dk->ws, z.decode_keep);
    CHECK_OK(ei_decode_keep(g, &x, &dk->dec, &tk, &dk->ks));
    dev_free(dq);
}
static void dev_keep_free(dev_keep *dk) {
    dev_free(dk->idx); dev_free(dk->mask); dev_free(dk->pooled); dev_free(dk->ws); dev_free(dk->ring);
}
/* ascending, window at the end, mask consistent */
static int check_keep_shape(const int32_t *idx, const uint8_t *mask, int kept, int64_t n, int W, char *why, size_t ws) {
    int i;
    for (i = 1; i < kept; i++)
        if (idx[i] <= idx[i - 1]) { snprintf(why, ws, "not ascending at %d", i); return 0; }
    for (i = 0; i < W && i < kept; i++)
        if (idx[kept - W + i] != n - W + i) { snprintf(why, ws, "window position %d missing", i); return 0; }
    if (mask) {
        int64_t j, cnt = 0;
        for (j = 0; j < n; j++) cnt += mask[j];
        if (cnt != kept) { snprintf(why, ws, "mask has %lld ones, %d kept", (long long)cnt, kept); return 0; }
        for (i = 0; i < kept; i++)
            if (!mask[idx[i]]) { snprintf(why, ws, "mask misses %d", idx[i]); return 0; }
    }
    return 1;
}

static void golden_decode(const char *dir, const char *name) {
    meta m;
    ei_config c;
    ei_context *g;
    float *k, *obs, *pooled_ref;
    int32_t *keep_ref;
    int64_t n, L;
    int nh, nkv, D, W, budget, heads_out, h, bad_pool = 0, bad_set = 0, bad_shape = 0;
    const char *pool;
    dev_keep dk;
    void *dkey;
    int32_t *idx;
    uint8_t *mask;
    float *pooled;
    char why[256];
    meta_read(dir, &m);
    n = meta_i(&m, "n_tokens"); nh = (int)meta_i(&m, "n_heads"); nkv = (int)meta_i(&m, "n_kv_heads");
    D = (int)meta_i(&m, "head_dim"); W = (int)meta_i(&m, "window"); budget = (int)meta_i(&m, "decode_budget");
    c = base_config();
    c.decode_budget = budget;
    c.window = W;
    c.decode_gap = W < 16 ? W : 16;
    pool = meta_s(&m, "pool");
    c.pool = !strcmp(pool, "maxpool") ? EI_POOL_MAX : !strcmp(pool, "none") ? EI_POOL_NONE : EI_POOL_AVG;
    c.pool_kernel = (int32_t)meta_i(&m, "pool_kernel");
    c.per_kv_head = (int32_t)meta_i(&m, "per_kv_head");
    c.gqa_reduce = !strcmp(meta_s(&m, "gqa_reduce"), "max") ? EI_REDUCE_MAX : EI_REDUCE_MEAN;
    c.decode_scale = (float)meta_f(&m, "scale");
    heads_out = c.per_kv_head ? nkv : nh;
    L = n - W;
    k = read_f32(dir, "k", NULL);
    obs = read_f32(dir, "obs_q", NULL);
    pooled_ref = read_f32(dir, "pooled", NULL);
    keep_ref = (int32_t *)read_file(dir, "keep_idx.i32", NULL);
    if (!k || !obs) {
        CHECK(0, "golden %s: k or obs_q missing or unreadable in %s", name, dir);
        free(k); free(obs); free(pooled_ref); free(keep_ref);
        return;
    }
    g = make_ctx(&c, EI_BACKEND_CUDA);
    run_decode_gpu(g, &c, k, obs, n, nh, nkv, D, EI_BF16, &dk, &dkey);
    idx = (int32_t *)malloc((size_t)heads_out * budget * 4);
    mask = (uint8_t *)malloc((size_t)heads_out * n);
    pooled = (float *)malloc((size_t)heads_out * (L > 0 ? L : 1) * 4);
    dev_get(idx, dk.idx, (size_t)heads_out * budget * 4);
    dev_get(mask, dk.mask, (size_t)heads_out * n);
    if (dk.ks.compressed) dev_get(pooled, dk.pooled, (size_t)heads_out * L * 4);
    CHECK(dk.ks.compressed == (int)meta_i(&m, "compressed"), "%s: compressed %d", name, dk.ks.compressed);
    CHECK(dk.ks.n_kept == (n < budget ? n : budget), "%s: n_kept %d", name, dk.ks.n_kept);
    for (h = 0; h < heads_out; h++) {
        const int32_t *row = idx + (size_t)h * budget;
        if (!check_keep_shape(row, mask + (size_t)h * n, dk.ks.n_kept, n, dk.ks.compressed ? W : 0, why, sizeof why)) {
            if (bad_shape++ < 3) printf("  %s h%d: %s\n", name, h, why);
        }
        if (!dk.ks.compressed) continue;
        if (pooled_ref) {
            int64_t j;
            for (j = 0; j < L; j++)
                if (!close_enough(pooled[h * L + j], pooled_ref[h * L + j], 1e-8, 1e-3)) bad_pool++;
            if (!check_set(row, budget - W, pooled_ref + h * L, (int)L, 1e-6, 1e-3, why, sizeof why))
                if (bad_set++ < 3) printf("  %s h%d: %s\n", name, h, why);
        }
    }
    (void)keep_ref;
    CHECK(bad_shape == 0, "%s: %d keep rows malformed", name, bad_shape);
    CHECK(bad_pool == 0, "%s: %d pooled scores off", name, bad_pool);
    CHECK(bad_set == 0, "%s: %d keep sets differ", name, bad_set);
    printf("  %-22s decode gpu==golden %s\n", name, bad_pool + bad_set + bad_shape ? "FAILED" : "ok");
    dev_keep_free(&dk);
    dev_free(dkey);
    ei_context_destroy(g);
    free(idx); free(mask); free(pooled); free(k); free(obs); free(pooled_ref); free(keep_ref);
}

/* ------------------------------------------------------------ random inputs */
/* Mixed heads: even kv heads peaked (a sink block dominates: rigid), odd ones noisy. */
static void gen_qk(float *q, float *k, int64_t n, int nh, int nkv, int D, float peak) {
    int64_t t;
    int h, d, G = nh / nkv;
    for (t = 0; t < n; t++)
        for (h = 0; h < nkv; h++)
            for (d = 0; d < D; d++) {
                float u = ((h * 31 + d * 7) % 3) - 1.0f;
                float x = nrand();
                if (peak > 0 && h % 2 == 0) x = 0.1f * x + (t < 8 ? peak * u : 0.f);
                k[((size_t)t * nkv + h) * D + d] = x;
            }
    for (t = 0; t < n; t++)
        for (h = 0; h < nh; h++)
            for (d = 0; d < D; d++) {
                int kvh = h / G;
                float u = ((kvh * 31 + d * 7) % 3) - 1.0f;
                float x = nrand();
                if (peak > 0 && kvh % 2 == 0) x = 0.1f * x + 0.5f * peak * u;
                q[((size_t)t * nh + h) * D + d] = x;
            }
}

/* (The random plans of bf16 prompts of 700-9000 tokens and the random
   decode keep sets over bf16 caches of 100-3000 rows, GPU against CPU, are
   cases of tests/ops_cases.h's table: test_ops --require-gpu; compaction
   there too.) */

/* ------------------------------------------------------------ decode policies */
/* Every decode policy (CONCEPTS: decode policy) and a ratio budget on the
   GPU against the CPU, which tests/test_core.c checks against a plain
   reference: the same calls on both (observe the prompt, then generated
   tokens one by one; a keep set; more generated tokens; another keep set;
   the cache not compacted so that positions stay rows), with the rows in
   position order or scattered over more rows (a row map), a keep set per kv
   head or per query head, and the parts (ei_decode_score, ei_decode_select;
   ei_decode_shared_add, ei_decode_select_shared, layers weighed equally or
   by their entropy) after them. Keep sets are
   compared by position: the count, the tail and the positions kept by
   position alone exactly, the ranked part up to near-ties of the CPU's
   pooled scores (float32 summation order differs), the pooled outputs
   within 1e-3. */
typedef struct pol_keep { ei_keep_set ks; void *idx, *pos, *pooled; } pol_keep;
static void pol_keep_make(pol_keep *pk, int gpu, int heads_out, int cap, int64_t pooled_cap, const int32_t *row_pos) {
    memset(pk, 0, sizeof *pk);
    pk->ks.heads_out = heads_out;
    pk->ks.capacity = cap;
    pk->idx = gpu ? dev_alloc((size_t)heads_out * cap * 4) : malloc((size_t)heads_out * cap * 4);
    pk->pos = gpu ? dev_alloc((size_t)heads_out * cap * 4) : malloc((size_t)heads_out * cap * 4);
    pk->pooled = gpu ? dev_alloc((size_t)heads_out * pooled_cap * 4) : malloc((size_t)heads_out * pooled_cap * 4);
    pk->ks.index = (int32_t *)pk->idx;
    pk->ks.positions = (int32_t *)pk->pos;
    pk->ks.pooled = (float *)pk->pooled;
    pk->ks.pooled_capacity = pooled_cap;
    pk->ks.row_pos = row_pos;
}
static void pol_keep_free(pol_keep *pk, int gpu) {
    if (gpu) { dev_free(pk->idx); dev_free(pk->pos); dev_free(pk->pooled); }
    else { free(pk->idx); free(pk->pos); free(pk->pooled); }
}
/* GPU keep set (device arrays) against the CPU's (host arrays), N positions
   held (0..N-1), tail T. Returns the number of heads that differ. */
static int pol_compare(const ei_config *c, const pol_keep *gk, const pol_keep *ck, int64_t N, int64_t T, const char *what) {
    int heads_out = ck->ks.heads_out, cap = ck->ks.capacity, h, bad = 0, i;
    int64_t L = N - T, b = ck->ks.n_kept, Lr = L, kk = b - T, j;
    int32_t *gpos = (int32_t *)malloc((size_t)heads_out * cap * 4), *ranked = (int32_t *)malloc((size_t)cap * 4);
    int64_t pcap = gk->ks.pooled_capacity;
    float *gpool = (float *)malloc((size_t)heads_out * (size_t)pcap * 4);
    unsigned char *kept = (unsigned char *)malloc((size_t)N);
    char why[256];
    CHECK(gk->ks.n_kept == ck->ks.n_kept && gk->ks.compressed == ck->ks.compressed && gk->ks.n_tokens == ck->ks.n_tokens,
          "%s: GPU kept %d (compressed %d), CPU %d (%d)", what, gk->ks.n_kept, gk->ks.compressed, ck->ks.n_kept,
          ck->ks.compressed);
    if (gk->ks.n_kept != ck->ks.n_kept || !ck->ks.compressed) goto done;
    if (c->decode_policy == EI_DECODE_STREAMING) {
        int64_t sink = c->decode_sink < kk ? c->decode_sink : kk;
        Lr = L - (kk - sink); kk = sink;
    } else if (c->decode_policy == EI_DECODE_H2O) {
        int64_t R = b / 2 > T ? b / 2 : T;
        Lr = L - (R - T); kk = b - R;
    }
    dev_get(gpos, gk->pos, (size_t)heads_out * cap * 4);
    dev_get(gpool, gk->pooled, (size_t)heads_out * (size_t)pcap * 4);
    for (h = 0; h < heads_out; h++) {
        const int32_t *gp = gpos + (size_t)h * cap, *cp = (const int32_t *)ck->pos + (size_t)h * cap;
        const float *cpool = (const float *)ck->pooled + (size_t)h * ck->ks.pooled_capacity;
        int nr = 0, ok = 1;
        memset(kept, 0, (size_t)N);
        for (i = 0; i < b && ok; i++) {
            if (gp[i] < 0 || gp[i] >= N || kept[gp[i]]) ok = 0; /* (rows ascend; with a row map positions do not) */
            else kept[gp[i]] = 1;
        }
        if (!ok) { if (bad++ < 3) printf("  %s h%d: positions malformed\n", what, h); continue; }
        for (j = Lr; j < N; j++) if (!kept[j]) ok = 0;
        for (j = 0; j < Lr; j++) if (kept[j]) ranked[nr++] = (int32_t)j;
        if (!ok || nr != kk) { if (bad++ < 3) printf("  %s h%d: tail or recent positions missing (%d ranked, %lld)\n", what, h, nr, (long long)kk); continue; }
        if (c->decode_policy == EI_DECODE_STREAMING || !memcmp(gp, cp, (size_t)b * 4)) {
            if (memcmp(gp, cp, (size_t)b * 4)) { if (bad++ < 3) printf("  %s h%d: positions differ\n", what, h); continue; }
        } else if (!check_set(ranked, nr, cpool, (int)Lr, 1e-5, 1e-3, why, sizeof why)) {
            if (bad++ < 3) printf("  %s h%d: %s\n", what, h, why);
            continue;
        }
        for (j = 0; j < L; j++)
            if (!close_enough(gpool[(size_t)h * pcap + j], cpool[j], 1e-8, 1e-3)) {
                if (bad++ < 3) printf("  %s h%d: pooled[%lld] %g, CPU %g\n", what, h, (long long)j, gpool[(size_t)h * pcap + j], cpool[j]);
                break;
            }
    }
done:
    free(gpos); free(ranked); free(gpool); free(kept);
    return bad;
}

/* Every decode policy, GPU against CPU: window W, the first compression after GAP generated tokens
   (32 / 8; and 128 / 128, the window the README's decode eval measured best) */
/* W, GAP: the observation window and the gap; B: the budget, above what SnapKV keeps unscored (the
   prompt's window and every generated position: W + GAP + MORE at the second round) */
static void decode_policies_gpu(int quick, int W, int GAP, int B) {
    enum { NH = 8, NKV = 2, D = 64, NPOS = 1500, MORE = 16, EXTRA = 100, SINK = 4 };
    const int64_t rows = NPOS + MORE + EXTRA;
    const double ratios[2] = {0.0, 0.3};
    float *q = (float *)malloc(sizeof(float) * (NPOS + MORE) * NH * D), *k = (float *)malloc(sizeof(float) * (NPOS + MORE) * NKV * D);
    float *ks_host = (float *)calloc((size_t)rows * NKV * D, sizeof(float));
    int32_t *perm = (int32_t *)malloc(sizeof(int32_t) * rows), *row_pos = (int32_t *)malloc(sizeof(int32_t) * rows);
    void *dq = NULL, *dk_rows = NULL, *dk_map = NULL, *dmap = NULL;
    int pol, var, mapped, ri, round, cases = 0, total_bad = 0;
    int64_t j;
    gen_qk(q, k, NPOS + MORE, NH, NKV, D, 0.f);
    round_to(k, (size_t)(NPOS + MORE) * NKV * D, EI_BF16);
    for (j = 0; j < rows; j++) perm[j] = (int32_t)j;
    {
        uint32_t s = 4242u;
        for (j = rows - 1; j > 0; j--) {
            int64_t x;
            int32_t t;
            s = s * 1664525u + 1013904223u;
            x = (int64_t)(s >> 8) % (j + 1);
            t = perm[j]; perm[j] = perm[x]; perm[x] = t;
        }
    }
    for (j = 0; j < NPOS + MORE; j++) memcpy(ks_host + (size_t)perm[j] * NKV * D, k + (size_t)j * NKV * D, sizeof(float) * NKV * D);
    dq = dev_upload(q, (size_t)(NPOS + MORE) * NH * D, EI_F32);
    dk_rows = dev_upload(k, (size_t)(NPOS + MORE) * NKV * D, EI_BF16);
    dk_map = dev_upload(ks_host, (size_t)rows * NKV * D, EI_BF16);
    dmap = dev_alloc(sizeof(int32_t) * rows);
    for (pol = EI_DECODE_ENTROPYINFER; pol <= EI_DECODE_H2O; pol++)
        for (var = 0; var < 2; var++)
            for (mapped = 0; mapped < 2; mapped++)
                for (ri = 0; ri < 2; ri++) {
                    ei_config c = base_config();
                    ei_context *g, *cpu, *gdf; /* gdf: cuda_deferred_errors, the same kernels: the same keep sets */
                    ei_decoder gd, cd, dd;
                    void *gring, *cring, *dring, *gws, *cws, *dws;
                    ei_sizes gz, cz;
                    ei_exec gx, cx, dx;
                    int heads_out, bad = 0, df_ok = 1;
                    char what[160];
                    if (quick && (var || ri) && pol != EI_DECODE_H2O) continue;
                    c.decode_budget = B; c.window = W; c.decode_gap = GAP; c.recompress_every = MORE;
                    c.decode_policy = (ei_decode_policy)pol; c.decode_sink = SINK;
                    c.decode_budget_ratio = ratios[ri]; c.decode_budget_min = W > 64 ? W : 64;
                    c.decode_positions = NPOS + MORE;
                    c.per_kv_head = var == 0;
                    c.decode_shared_weight = var ? EI_SHARED_ENTROPY : EI_SHARED_EQUAL; /* (only shared sets read it) */
                    c.decode_recent = var && (pol == EI_DECODE_ENTROPYINFER || pol == EI_DECODE_SNAPKV) ? 0.4f : 0.0f;
                    heads_out = c.per_kv_head ? NKV : NH;
                    g = make_ctx(&c, EI_BACKEND_CUDA);
                    cpu = make_ctx(&c, EI_BACKEND_CPU);
                    c.cuda_deferred_errors = 1;
                    gdf = make_ctx(&c, EI_BACKEND_CUDA);
                    c.cuda_deferred_errors = 0;
                    gz = layer_sizes(g, rows, NH, NKV, D, 0, 1);
                    cz = layer_sizes(cpu, rows, NH, NKV, D, 0, 1);
                    gring = dev_alloc(gz.decoder);
                    dring = dev_alloc(gz.decoder);
                    cring = malloc(cz.decoder);
                    CHECK_OK(ei_decoder_init(g, &gd, NH, NKV, D, gring, gz.decoder));
                    CHECK_OK(ei_decoder_init(gdf, &dd, NH, NKV, D, dring, gz.decoder));
                    CHECK_OK(ei_decoder_init(cpu, &cd, NH, NKV, D, cring, cz.decoder));
                    gws = dev_alloc(gz.decode_keep);
                    dws = dev_alloc(gz.decode_keep);
                    cws = malloc(cz.decode_keep);
                    gx = ex(1, gws, gz.decode_keep);
                    dx = ex(1, dws, gz.decode_keep);
                    cx = ex(1, cws, cz.decode_keep);
                    for (j = 0; j < rows; j++) row_pos[j] = -1;
                    for (round = 0; round < 2; round++) {
                        const int64_t N = round ? NPOS + MORE : NPOS, from = round ? NPOS : 0;
                        int64_t t;
                        pol_keep gk, ck;
                        ei_tensor gkt, ckt;
                        for (t = from; t < N; t++) { /* the prompt (all but GAP) at once, then one token a call */
                            int64_t cnt = !round && t == 0 ? NPOS - GAP : 1;
                            ei_tensor gq = ei_tensor_make((const float *)dq + (size_t)t * NH * D, EI_F32, cnt, NH, D);
                            ei_tensor cq = ei_tensor_make(q + (size_t)t * NH * D, EI_F32, cnt, NH, D);
                            int gen = round || t >= NPOS - GAP;
                            CHECK_OK(ei_decode_observe(g, &gd, &gq, t, gen));
                            CHECK_OK(ei_decode_observe(gdf, &dd, &gq, t, gen));
                            CHECK_OK(ei_decode_observe(cpu, &cd, &cq, t, gen));
                            t += cnt - 1;
                        }
                        for (t = 0; t < N; t++) row_pos[perm[t]] = (int32_t)t;
                        dev_put(dmap, row_pos, sizeof(int32_t) * rows);
                        gkt = mapped ? ei_tensor_make(dk_map, EI_BF16, rows, NKV, D) : ei_tensor_make(dk_rows, EI_BF16, N, NKV, D);
                        ckt = mapped ? ei_tensor_make(ks_host, EI_F32, rows, NKV, D) : ei_tensor_make(k, EI_F32, N, NKV, D);
                        pol_keep_make(&gk, 1, heads_out, B, N, mapped ? (const int32_t *)dmap : NULL);
                        pol_keep_make(&ck, 0, heads_out, B, N, mapped ? row_pos : NULL);
                        snprintf(what, sizeof what, "policy %d recent %g %s %s ratio %g round %d", pol, (double)c.decode_recent,
                                 var ? "per query head" : "per kv head", mapped ? "row map" : "rows in order", ratios[ri], round);
                        CHECK_OK(ei_decode_keep(g, &gx, &gd, &gkt, &gk.ks));
                        CHECK_OK(ei_decode_keep(cpu, &cx, &cd, &ckt, &ck.ks));
                        bad += pol_compare(&c, &gk, &ck, N, ei__decode_tail(&c, &cd), what);
                        CHECK(gd.n_accumulated == cd.n_accumulated && gd.accumulated_end == cd.accumulated_end &&
                              gd.last_compress == cd.last_compress, "%s: decoder counters differ", what);
                        if (df_ok) { /* deferred errors: identical, or refused where the host cannot know the length */
                            pol_keep dk2;
                            ei_result rd;
                            pol_keep_make(&dk2, 1, heads_out, B, N, mapped ? (const int32_t *)dmap : NULL);
                            rd = ei_decode_keep(gdf, &dx, &dd, &gkt, &dk2.ks);
                            if (mapped && (ratios[ri] > 0 || pol == EI_DECODE_H2O)) {
                                CHECK(rd == EI_ERR_UNSUPPORTED, "%s, deferred: %s, EI_ERR_UNSUPPORTED expected", what, ei_result_name(rd));
                                df_ok = 0;
                            } else {
                                int32_t *p1 = (int32_t *)malloc((size_t)heads_out * B * 4), *p2 = (int32_t *)malloc((size_t)heads_out * B * 4);
                                CHECK(rd == EI_OK, "%s, deferred: %s (%s)", what, ei_result_name(rd), ei_last_error());
                                CHECK(ei_cuda_status(gdf) == EI_OK, "%s, deferred: a fault recorded (%s)", what, ei_last_error());
                                int h, same = dk2.ks.n_kept == gk.ks.n_kept && dk2.ks.compressed == gk.ks.compressed;
                                dev_get(p1, gk.pos, (size_t)heads_out * B * 4);
                                dev_get(p2, dk2.pos, (size_t)heads_out * B * 4);
                                for (h = 0; h < heads_out && same; h++) /* [heads_out][capacity B]: n_kept of each row */
                                    same = !memcmp(p1 + (size_t)h * B, p2 + (size_t)h * B, (size_t)gk.ks.n_kept * 4);
                                CHECK(same, "%s, deferred: a keep set other than the waiting call's", what);
                                free(p1); free(p2);
                            }
                            pol_keep_free(&dk2, 1);
                        }
                        pol_keep_free(&gk, 1); pol_keep_free(&ck, 0);
                        cases++;
                    }
                    if (pol != EI_DECODE_H2O) { /* the parts, on the second round's cache (H2O's would sum again) */
                        const int64_t N = NPOS + MORE, n = mapped ? rows : N;
                        float *gsc = (float *)dev_alloc(sizeof(float) * NH * n), *csc = (float *)malloc(sizeof(float) * NH * n);
                        float *gsh = (float *)dev_alloc(sizeof(float) * n), *csh = (float *)calloc((size_t)n, sizeof(float));
                        float *back = (float *)malloc(sizeof(float) * NH * n);
                        ei_tensor gkt = mapped ? ei_tensor_make(dk_map, EI_BF16, rows, NKV, D) : ei_tensor_make(dk_rows, EI_BF16, N, NKV, D);
                        ei_tensor ckt = mapped ? ei_tensor_make(ks_host, EI_F32, rows, NKV, D) : ei_tensor_make(k, EI_F32, N, NKV, D);
                        pol_keep gk, ck;
                        int bs = 0;
                        CHECK_OK(ei_decode_score(g, &gx, &gd, &gkt, mapped ? (const int32_t *)dmap : NULL, 0, gsc));
                        CHECK_OK(ei_decode_score(cpu, &cx, &cd, &ckt, mapped ? row_pos : NULL, 0, csc));
                        dev_get(back, gsc, sizeof(float) * NH * n);
                        for (j = 0; j < NH * n; j++)
                            if (!close_enough(back[j], csc[j], 1e-8, 1e-3)) bs++;
                        CHECK(bs == 0, "policy %d: %d decode scores differ", pol, bs);
                        pol_keep_make(&gk, 1, heads_out, B, N, mapped ? (const int32_t *)dmap : NULL);
                        pol_keep_make(&ck, 0, heads_out, B, N, mapped ? row_pos : NULL);
                        CHECK_OK(ei_decode_select(g, &gx, &gd, gsc, n, &gk.ks));
                        CHECK_OK(ei_decode_select(cpu, &cx, &cd, csc, n, &ck.ks));
                        snprintf(what, sizeof what, "policy %d select%s", pol, mapped ? " row map" : "");
                        bad += pol_compare(&c, &gk, &ck, N, ei__decode_tail(&c, &cd), what);
                        pol_keep_free(&gk, 1); pol_keep_free(&ck, 0);
                        CHECK_OK(ei_device_copy(g, gsh, csh, sizeof(float) * n, EI_COPY_HOST_TO_DEVICE)); /* zeros */
                        CHECK_OK(ei_decode_shared_add(g, &gx, &gd, gsc, n, mapped ? (const int32_t *)dmap : NULL, gsh));
                        CHECK_OK(ei_decode_shared_add(cpu, &cx, &cd, csc, n, mapped ? row_pos : NULL, csh));
                        pol_keep_make(&gk, 1, 1, B, N, mapped ? (const int32_t *)dmap : NULL);
                        pol_keep_make(&ck, 0, 1, B, N, mapped ? row_pos : NULL);
                        CHECK_OK(ei_decode_select_shared(g, &gx, &gd, gsh, n, &gk.ks));
                        CHECK_OK(ei_decode_select_shared(cpu, &cx, &cd, csh, n, &ck.ks));
                        snprintf(what, sizeof what, "policy %d shared%s", pol, mapped ? " row map" : "");
                        bad += pol_compare(&c, &gk, &ck, N, ei__decode_tail(&c, &cd), what);
                        pol_keep_free(&gk, 1); pol_keep_free(&ck, 0);
                        dev_free(gsc); dev_free(gsh); free(csc); free(csh); free(back);
                    }
                    CHECK(bad == 0, "decode policy %d (%s, %s, ratio %g): %d keep sets differ from the CPU", pol,
                          var ? "per query head" : "per kv head", mapped ? "row map" : "rows in order", ratios[ri], bad);
                    total_bad += bad;
                    dev_free(gring); dev_free(gws); dev_free(dring); dev_free(dws); free(cring); free(cws);
                    ei_context_destroy(g); ei_context_destroy(cpu); ei_context_destroy(gdf);
                }
    printf("  decode policies (window %d, gap %d): %d keep sets (and the parts), GPU vs CPU %s\n", W, GAP, cases,
           total_bad ? "FAILED" : "ok");
    dev_free(dq); dev_free(dk_rows); dev_free(dk_map); dev_free(dmap);
    free(q); free(k); free(ks_host); free(perm); free(row_pos);
}

/* ------------------------------------------------------------ attention */
/* The reference (check.h's ref_attention_token, in double) for every
   stride_t-th query token of q (host f32, tokens from q_offset): out[(t *
   nh + h) * D + i], t counted from q_offset. */
static void attention_ref(const ei_config *c, const ei_plan *plan, const float *q, const float *k, const float *v,
                          int64_t q_offset, int64_t nq, int64_t n, int nh, int nkv, int D, int stride_t, float *out) {
    ei_tensor tq = ei_tensor_make(q, EI_F32, nq, nh, D), tk = ei_tensor_make(k, EI_F32, n, nkv, D);
    ei_tensor tv = ei_tensor_make(v, EI_F32, n, nkv, D);
    double *row = (double *)malloc(sizeof(double) * (size_t)nh * (size_t)D);
    int64_t t;
    size_t i;
    for (t = 0; t < nq; t += stride_t) {
        CHECK(ref_attention_token(c, plan, &tq, &tk, &tv, q_offset, t, row), "attention reference out of float range");
        for (i = 0; i < (size_t)nh * (size_t)D; i++) out[(size_t)t * (size_t)nh * (size_t)D + i] = (float)row[i];
    }
    free(row);
}

/* On the GPU every way to run a call is one launch sequence: in parts, part
   0 makes the whole call and the others return EI_OK writing nothing (here
   parts 2 and 1 come first); n_threads is unused. Both give the whole
   call's output bit for bit (the same workspace: the same split-K). */
static void gpu_ways_prefill(ei_context *g, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v, const ei_plan *plan,
                             ei_out_tensor *out, int64_t q_offset, void *ws, size_t wsb, size_t out_bytes) {
    unsigned char *whole = (unsigned char *)malloc(out_bytes), *got = (unsigned char *)malloc(out_bytes);
    unsigned char *poison = (unsigned char *)malloc(out_bytes);
    ei_exec x = ex(1, ws, wsb);
    int ith, untouched = 1;
    memset(poison, 0xFF, out_bytes);
    dev_put(out->data, poison, out_bytes);
    CHECK_OK(ei_attention_prefill(g, &x, q, k, v, plan, out, q_offset));
    dev_get(whole, out->data, out_bytes);
    dev_put(out->data, poison, out_bytes);
    x.nth = 3;
    for (ith = 2; ith >= 0; ith--) {
        x.ith = ith;
        CHECK_OK(ei_attention_prefill(g, &x, q, k, v, plan, out, q_offset));
        if (ith) {
            dev_get(got, out->data, out_bytes);
            untouched &= !memcmp(got, poison, out_bytes);
        }
    }
    CHECK(untouched, "gpu prefill in parts: a part other than 0 wrote the output");
    dev_get(got, out->data, out_bytes);
    CHECK(!memcmp(got, whole, out_bytes), "gpu prefill in parts: part 0's output differs from the whole call's");
    dev_put(out->data, poison, out_bytes);
    x = ex(1, ws, wsb);
    x.n_threads = 4;
    CHECK_OK(ei_attention_prefill(g, &x, q, k, v, plan, out, q_offset));
    dev_get(got, out->data, out_bytes);
    CHECK(!memcmp(got, whole, out_bytes), "gpu prefill on 4 threads: the output differs from one thread's");
    free(whole); free(got); free(poison);
}

static void attention_case(int64_t n, int nh, int nkv, int D, int seg, int bs, int base, int64_t threshold,
                           ei_dtype dt, ei_dtype out_dt, int use_plan, int64_t q_offset, int stride_t, float peak) {
    size_t nq = (size_t)n * nh * D, nk = (size_t)n * nkv * D, i, nout;
    float *q = (float *)malloc(nq * 4), *k = (float *)malloc(nk * 4), *v = (float *)malloc(nk * 4);
    float *ref, *got;
    void *dq, *dk, *dv, *dout, *hout;
    ei_config c = base_config();
    ei_context *g, *cpu;
    ei_tensor tq, tk, tv, tq_part;
    ei_out_tensor to;
    gpu_plan gp;
    int64_t nq_tok = n - q_offset, t;
    l2_acc err;
    int h, d, unwritten = 0, shape, wsp;
    size_t oes = out_dt == EI_F32 ? 4 : 2, wsb = 0;
    void *dws = NULL;
    c.segment_size = seg; c.block_size = bs; c.base_budget = base; c.threshold_len = threshold;
    gen_qk(q, k, n, nh, nkv, D, peak);
    for (i = 0; i < nk; i++) v[i] = nrand();
    round_to(q, nq, dt); round_to(k, nk, dt); round_to(v, nk, dt);
    g = make_ctx(&c, EI_BACKEND_CUDA);
    cpu = make_ctx(&c, EI_BACKEND_CPU);
    dq = dev_upload(q, nq, dt); dk = dev_upload(k, nk, dt); dv = dev_upload(v, nk, dt);
    tq = ei_tensor_make(dq, dt, n, nh, D);
    tk = ei_tensor_make(dk, dt, n, nkv, D);
    tv = ei_tensor_make(dv, dt, n, nkv, D);
    memset(&gp, 0, sizeof gp);
    if (use_plan) gpu_profile(g, cpu, &tq, &tk, 0, &gp, EI_OK);
    nout = (size_t)nq_tok * nh * D;
    dout = dev_alloc(nout * oes);
    hout = malloc(nout * oes);
    got = (float *)malloc(nout * 4);
    ref = (float *)calloc(nout, 4);
    attention_ref(&c, use_plan ? &gp.host : NULL, q + (size_t)q_offset * nh * D, k, v, q_offset, nq_tok, n, nh, nkv, D,
                  stride_t, ref);
    tq_part = tq;
    tq_part.data = (const char *)dq + (size_t)q_offset * nh * D * (dt == EI_F32 ? 4 : 2);
    tq_part.n_tokens = nq_tok;
    to = ei_out_tensor_make(dout, out_dt, nq_tok, nh, D);
    /* the workspace of ei_sizes.prefill: split-K where the grid is small (head_dim 64/256) */
    wsb = layer_sizes(g, n, nh, nkv, D, 0, 1).prefill;
    if (wsb) dws = dev_alloc(wsb);
    /* wg*: the wgmma kernels (Hopper; elsewhere the default mma.sync shape), wgt* / wgk* / wgp*: the
       same with TMA copies of the K/V tiles (wgk: masks from key indices, wgp: also without CTA
       barriers between them); WxMxB: mma.sync; wgy128: the warp-specialised kernel with one producer warp
       (the default, wgs128, has two; head_dim 128, else wgk64). Head_dim 256: the wgmma kernel on
       cp.async tiles, on TMA slab tiles (wgk64), on TMA group-interleaved tiles (wgi64, the default on
       Hopper where split-K cuts the work items), the warp-specialised kernel (wgs64, never split),
       wgz64 (wgs64 without ping-pong: the default elsewhere on Hopper), mma.sync */
    static const char *const shapes_all[] = {"wg64", "wg128", "wgt64", "wgt128", "wgk64", "wgk128", "wgp64", "wgp128",
                                             "8x2x64", "4x1x64", "4x2x64", "8x1x64", "8x2x32", "4x2x32", "wgy128"};
    static const char *const shapes_256[] = {"wg64", "wgk64", "wgi64", "wgs64", "wgz64", "4x1x64"};
    const char *const *shapes = D == 256 ? shapes_256 : shapes_all;
    const int nshapes = D == 256 ? (int)(sizeof shapes_256 / sizeof *shapes_256) : (int)(sizeof shapes_all / sizeof *shapes_all);
    for (shape = 0; shape < nshapes; shape++)
    for (wsp = 0; wsp < (wsb ? 2 : 1); wsp++) {
        setenv("EI_CUDA_ATTN_CFG", shapes[shape], 1);
        memset(hout, 0xFF, nout * oes); /* poison: NaN in every dtype */
        dev_put(dout, hout, nout * oes);
        {
            ei_exec x = ex(1, wsp ? dws : NULL, wsp ? wsb : 0);
            CHECK_OK(ei_attention_prefill(g, &x, &tq_part, &tk, &tv, use_plan ? &gp.dev : NULL, &to, q_offset));
        }
        dev_get(hout, dout, nout * oes);
        for (i = 0; i < nout; i++)
            got[i] = out_dt == EI_F32 ? ((float *)hout)[i] : out_dt == EI_BF16 ? bf2f(((uint16_t *)hout)[i]) : h2f(((uint16_t *)hout)[i]);
        unwritten = 0;
        for (i = 0; i < nout; i++)
            if (!(got[i] == got[i]) || fabsf(got[i]) > 1e30f) unwritten++;
        err = l2_zero();
        for (t = q_offset; t < n; t += stride_t)
            for (h = 0; h < nh; h++)
                for (d = 0; d < D; d++) {
                    size_t at = ((size_t)(t - q_offset) * nh + h) * D + d;
                    l2_add(&err, got[at], ref[at]);
                }
        {
            const test_tol *tl = &test_tols[TOL_ATTN_GPU];
            const char *dn = dt == EI_BF16 ? "bf16" : "f16", *on = out_dt == EI_F32 ? "f32" : out_dt == EI_BF16 ? "bf16" : "f16";
            char who[160];
            CHECK(unwritten == 0, "attention: %d outputs unwritten or non-finite", unwritten);
            snprintf(who, sizeof who, "attention n=%lld %d/%d d=%d %s cta %s%s", (long long)n, nh, nkv, D,
                     use_plan ? "sparse" : "dense", shapes[shape], wsp ? " +ws" : "");
            check_l2(who, &err, tl->rel_l2, tl->max_abs);
            printf("  attention n=%-5lld %2d/%d heads d=%-3d %-4s->%-4s %-6s off=%-4lld cta %s%s: rel L2 err %.2e max abs %.2e %s\n",
                   (long long)n, nh, nkv, D, dn, on, use_plan ? "sparse" : "dense", (long long)q_offset, shapes[shape],
                   wsp ? " +ws (split-K where the grid is small)" : "", l2_rel(&err), err.mx,
                   unwritten == 0 && l2_within(&err, tl->rel_l2, tl->max_abs) ? "ok" : "FAILED");
        }
    }
    unsetenv("EI_CUDA_ATTN_CFG");
    gpu_ways_prefill(g, &tq_part, &tk, &tv, use_plan ? &gp.dev : NULL, &to, q_offset, dws, wsb, nout * oes);
    if (use_plan) gpu_plan_free(&gp);
    if (dws) dev_free(dws);
    dev_free(dq); dev_free(dk); dev_free(dv); dev_free(dout);
    free(hout); free(got); free(ref); free(q); free(k); free(v);
    ei_context_destroy(g); ei_context_destroy(cpu);
}

static void attention_tests(int quick) {
    /* n, heads, kv, dim, seg, blk, base, threshold, dtype, out, plan, q_offset, row stride, peak */
    attention_case(1000, 4, 1, 128, 128, 8, 128, 256, EI_BF16, EI_F32, 1, 0, 1, 2.f);
    attention_case(1500, 8, 2, 64, 256, 8, 128, 256, EI_BF16, EI_BF16, 1, 0, 3, 0.f);
    if (quick) return;
    attention_case(1500, 8, 2, 64, 256, 8, 128, 256, EI_BF16, EI_BF16, 0, 0, 3, 0.f);
    attention_case(2100, 14, 2, 128, 256, 16, 256, 512, EI_BF16, EI_F32, 1, 0, 5, 2.f);  /* G=7: padded rows */
    attention_case(2100, 14, 2, 128, 256, 16, 256, 512, EI_F16, EI_F16, 1, 0, 5, 2.f);
    attention_case(1300, 4, 4, 256, 256, 8, 256, 256, EI_BF16, EI_BF16, 1, 0, 4, 0.f);   /* d=256, MHA */
    attention_case(3000, 32, 2, 64, 512, 8, 512, 512, EI_BF16, EI_F32, 1, 0, 11, 2.f);  /* G=16 */
    attention_case(3000, 8, 2, 128, 512, 8, 512, 1024, EI_BF16, EI_BF16, 1, 1024, 5, 2.f); /* chunk: q_offset */
    attention_case(777, 2, 1, 64, 64, 8, 64, 0, EI_BF16, EI_F32, 1, 0, 1, 0.f);          /* threshold 0 */
    /* an engine's micro-batch: 512 queries at the end of 4096 keys, few heads (Gemma 3: 4/1, d=256; SmolLM2:
       9/3, d=64): 32 and 39 CTAs, so split-K with the workspace */
    attention_case(4096, 4, 1, 256, 512, 8, 512, 1024, EI_BF16, EI_F32, 1, 3584, 7, 2.f);
    attention_case(4096, 4, 1, 256, 512, 8, 512, 1024, EI_F16, EI_F32, 0, 3584, 7, 2.f);
    attention_case(4096, 9, 3, 64, 512, 8, 512, 1024, EI_BF16, EI_F32, 1, 3584, 7, 2.f);
}

/* ------------------------------------------------------------ f32 queries */
/* llama.cpp's layout: q f32, k/v bf16 or f16. The GPU rounds each q element
   to k's type as it loads a Q tile (the CPU keeps f32), so:
   (1) the GPU's output from the f32 q equals bit for bit its output from q
       rounded to k's type on the host (round to nearest even, as
       __float2bfloat16_rn / __float2half_rn) and uploaded as 16-bit: the
       conversion is the only change;
   (2) against the CPU on the same f32 q (and the same 16-bit k, v): the
       rounding adds a logit error of at most u * scale * sum|q_i k_i| (u the
       unit roundoff: 2^-8 bf16, 2^-11 f16; rms about u/sqrt(3) per element,
       so about u/sqrt(3) * sqrt(d) * scale ~ u/2 in rms for unit inputs), the
       same order as the kernels' own rounding of P to 16 bits; so the 16-bit
       attention tolerance of attention_case (rel L2 1e-2, max abs 5e-2) holds
       for bf16, and a quarter of it for f16 (u is 8x smaller: 2x margin).
       Measured on an H200 (2026-12-02): bf16 rel L2 1.2-2.2e-3, f16 1.4-1.6e-4;
   (3) plans profiled from the f32 q (reference ranking: q read in f32 on
       both) equal the CPU's (plan_diff); with the sampled
       ranking (the tensor-core path rounds q to k's type, the CUDA-core
       path keeps f32) keep counts and entropies equal the CPU's (they come
       from the reference scores, f32 q on both), and the rankings' agreement
       with the CPU's is printed for both paths. */
static void *host_as(const float *x, size_t count, ei_dtype dt) {
    size_t i, es = dt == EI_F32 ? 4 : 2;
    void *h = malloc(count * es);
    for (i = 0; i < count; i++) {
        if (dt == EI_F32) ((float *)h)[i] = x[i];
        else if (dt == EI_BF16) ((uint16_t *)h)[i] = f2bf(x[i]);
        else ((uint16_t *)h)[i] = f2h(x[i]);
    }
    return h;
}
static void rel_err(const float *got, const float *ref, size_t count, double *rel, double *maxabs, int *bad) {
    l2_acc err = l2_of_f32(got, ref, count);
    *rel = l2_rel(&err);
    *maxabs = err.mx;
    *bad = (int)err.bad;
}
/* plan rows of a (GPU, host copy) against b (CPU): returns rows that differ
   (class, counts, or a ranking that is not a valid top-k of b's scores when
   b has scores); *exact rankings identical of *total */
static int plan_diff(const ei_config *c, const ei_plan *a, const ei_plan *b, int *exact, int *total, int *bad_ent) {
    int h, s, diff = 0;
    char why[256];
    *exact = *total = *bad_ent = 0;
    for (h = 0; h < b->n_kv_heads; h++) {
        if (a->head_class[h] != b->head_class[h]) diff++;
        for (s = 0; s < b->n_segments; s++) {
            size_t row = (size_t)h * b->seg_capacity + s;
            int kc = b->keep_count[row], lim = s * (c->segment_size / c->block_size);
            if (!close_enough(a->entropy[row], b->entropy[row], test_tols[TOL_ENTROPY].abs, test_tols[TOL_ENTROPY].rel)) (*bad_ent)++;
            if (kc != a->keep_count[row] || a->keep_blocks[row] != b->keep_blocks[row]) { diff++; continue; }
            if (s == 0) continue;
            (*total)++;
            if (!memcmp(a->block_index + row * b->max_keep, b->block_index + row * b->max_keep, (size_t)b->max_keep * 4))
                (*exact)++;
            else if (b->scores && !check_set(a->block_index + row * b->max_keep, kc, b->scores + row * b->blk_capacity,
                                             lim < b->n_blocks ? lim : b->n_blocks, 1e-3, 1e-3, why, sizeof why)) {
                if (diff++ < 3) printf("    h%d s%d: %s\n", h, s, why);
            }
        }
    }
    return diff;
}
static void f32q_case(ei_dtype kdt, int64_t n, int nh, int nkv, int D, float peak) {
    size_t nq = (size_t)n * nh * D, nk = (size_t)n * nkv * D, i, cwsb;
    float *q = (float *)malloc(nq * 4), *k = (float *)malloc(nk * 4), *v = (float *)malloc(nk * 4);
    float *got = (float *)malloc(nq * 4), *got16 = (float *)malloc(nq * 4), *ref = (float *)malloc(nq * 4);
    void *hk, *hv, *dq, *dq16, *dk, *dv, *dout, *cws;
    const char *kn = kdt == EI_BF16 ? "bf16" : "f16";
    double tol_rel = test_tols[kdt == EI_BF16 ? TOL_ATTN_GPU : TOL_ATTN_GPU_F16].rel_l2, rel, mx;
    double tol_max = test_tols[kdt == EI_BF16 ? TOL_ATTN_GPU : TOL_ATTN_GPU_F16].max_abs;
    ei_config c = base_config();
    ei_context *g, *cpu;
    ei_tensor tq, tq16, tk, tv, hq, htk, htv;
    ei_out_tensor to, ho;
    gpu_plan gp;
    ei_plan cp;
    ei_exec cx;
    int mode, bad, exact, total, bad_ent, diff;
    c.segment_size = 256; c.block_size = 8; c.base_budget = 256; c.threshold_len = 512;
    gen_qk(q, k, n, nh, nkv, D, peak);
    for (i = 0; i < nk; i++) v[i] = nrand();
    round_to(k, nk, kdt); round_to(v, nk, kdt); /* q stays f32 */
    g = make_ctx(&c, EI_BACKEND_CUDA);
    cpu = make_ctx(&c, EI_BACKEND_CPU);
    dq = dev_upload(q, nq, EI_F32); dq16 = dev_upload(q, nq, kdt);
    dk = dev_upload(k, nk, kdt); dv = dev_upload(v, nk, kdt);
    dout = dev_alloc(nq * 4);
    hk = host_as(k, nk, kdt); hv = host_as(v, nk, kdt);
    tq = ei_tensor_make(dq, EI_F32, n, nh, D); tq16 = ei_tensor_make(dq16, kdt, n, nh, D);
    tk = ei_tensor_make(dk, kdt, n, nkv, D); tv = ei_tensor_make(dv, kdt, n, nkv, D);
    hq = ei_tensor_make(q, EI_F32, n, nh, D); htk = ei_tensor_make(hk, kdt, n, nkv, D); htv = ei_tensor_make(hv, kdt, n, nkv, D);
    to = ei_out_tensor_make(dout, EI_F32, n, nh, D);
    ho = ei_out_tensor_make(ref, EI_F32, n, nh, D);
    cwsb = layer_sizes(cpu, n, nh, nkv, D, EI_PLAN_SCORES, 1).workspace; /* one buffer: profile, prefill, decode */
    cws = malloc(cwsb);
    cx = ex(1, cws, cwsb);
    /* the plan from the f32 q: GPU against CPU */
    gpu_profile(g, cpu, &tq, &tk, 0, &gp, EI_OK);
    CHECK_OK(ei_plan_init(cpu, &cp, n, nkv, D, EI_PLAN_SCORES, NULL, 0));
    CHECK_OK(ei_profile(cpu, &cx, &hq, &htk, &cp));
    diff = plan_diff(&c, &gp.host, &cp, &exact, &total, &bad_ent);
    CHECK(diff == 0 && bad_ent == 0, "f32 q / %s k: plan: %d rows differ, %d entropies off", kn, diff, bad_ent);
    printf("  f32 q, %s k: plan (reference ranking) gpu vs cpu %s (%d/%d rankings identical)\n", kn,
           diff + bad_ent ? "FAILED" : "ok", exact, total);
    for (mode = 0; mode < 3; mode++) { /* dense, sparse (the GPU plan on both), decode step (last token) */
        static const char *const names[3] = {"dense", "sparse", "decode"};
        int64_t off = mode == 2 ? n - 1 : 0, nt = n - off;
        size_t no = (size_t)nt * nh * D;
        ei_tensor q1 = tq, q116 = tq16, hq1 = hq;
        ei_out_tensor o1 = to, ho1 = ho;
        const ei_plan *dplan = mode == 1 ? &gp.dev : NULL, *hplan = mode == 1 ? &gp.host : NULL;
        if (mode == 2) {
            q1.data = (const float *)dq + (size_t)off * nh * D; q1.n_tokens = 1;
            q116.data = (const uint16_t *)dq16 + (size_t)off * nh * D; q116.n_tokens = 1;
            hq1.data = q + (size_t)off * nh * D; hq1.n_tokens = 1;
            o1.n_tokens = 1; ho1.n_tokens = 1;
        }
        for (i = 0; i < no; i++) ref[i] = NAN;
        if (mode == 2) { /* (a NULL ei_exec: one thread, no workspace) */
            CHECK_OK(ei_attention_decode(cpu, &cx, &hq1, &htk, &htv, NULL, &ho1, off));
            CHECK_OK(ei_attention_decode(g, NULL, &q1, &tk, &tv, NULL, &o1, off));
        } else {
            CHECK_OK(ei_attention_prefill(cpu, &cx, &hq1, &htk, &htv, hplan, &ho1, off));
            CHECK_OK(ei_attention_prefill(g, NULL, &q1, &tk, &tv, dplan, &o1, off));
        }
        dev_get(got, dout, no * 4);
        {   /* poison, then the same call with q rounded on the host */
            float *poison = (float *)malloc(no * 4);
            for (i = 0; i < no; i++) poison[i] = NAN;
            dev_put(dout, poison, no * 4);
            free(poison);
        }
        if (mode == 2) CHECK_OK(ei_attention_decode(g, NULL, &q116, &tk, &tv, NULL, &o1, off));
        else CHECK_OK(ei_attention_prefill(g, NULL, &q116, &tk, &tv, dplan, &o1, off));
        dev_get(got16, dout, no * 4);
        rel_err(got, ref, no, &rel, &mx, &bad);
        CHECK(bad == 0, "f32 q / %s k %s: %d outputs unwritten or non-finite", kn, names[mode], bad);
        CHECK(!memcmp(got, got16, no * 4), "f32 q / %s k %s: differs from the GPU's result for q rounded to %s", kn,
              names[mode], kn);
        CHECK(rel < tol_rel && mx < tol_max, "f32 q / %s k %s vs cpu: rel L2 %.3g (limit %.3g), max abs %.3g (limit %.3g)",
              kn, names[mode], rel, tol_rel, mx, tol_max);
        printf("  f32 q, %s k/v, %-6s n=%lld %d/%d heads d=%d: vs cpu (f32 q) rel L2 %.2e max abs %.2e (limits %.1e / "
               "%.1e); = gpu with q rounded to %s: %s\n", kn, names[mode], (long long)n, nh, nkv, D, rel, mx, tol_rel,
               tol_max, kn, memcmp(got, got16, no * 4) ? "NO" : "bit-identical");
    }
    gpu_plan_free(&gp);
    ei_plan_free(cpu, &cp);
    ei_context_destroy(g); ei_context_destroy(cpu);
    {   /* sampled ranking, tensor cores (q rounded) and CUDA cores (q f32): counts and entropies = the CPU's */
        ei_config sc = c;
        int kc_diff = 0, ent_off = 0, h, s, gen_exact = 0, gen_total = 0, b2;
        gpu_plan gpg;
        sc.ranking = EI_RANK_SAMPLED;
        g = make_ctx(&sc, EI_BACKEND_CUDA);
        cpu = make_ctx(&sc, EI_BACKEND_CPU);
        gpu_profile(g, cpu, &tq, &tk, 0, &gp, EI_OK);
        setenv("EI_CUDA_SAMPLED_GENERIC", "1", 1); /* CUDA cores, q in f32 */
        gpu_profile(g, cpu, &tq, &tk, 0, &gpg, EI_OK);
        unsetenv("EI_CUDA_SAMPLED_GENERIC");
        CHECK_OK(ei_plan_init(cpu, &cp, n, nkv, D, 0, NULL, 0));
        {   /* the sampled ranking's own (larger) workspace */
            size_t swsb = layer_sizes(cpu, n, nh, nkv, D, 0, 1).profile;
            void *sws = malloc(swsb);
            ei_exec sx = ex(1, sws, swsb);
            CHECK_OK(ei_profile(cpu, &sx, &hq, &htk, &cp));
            free(sws);
        }
        for (h = 0; h < nkv; h++)
            for (s = 0; s < cp.n_segments; s++) {
                size_t row = (size_t)h * cp.seg_capacity + s;
                kc_diff += cp.keep_count[row] != gp.host.keep_count[row];
                kc_diff += cp.keep_count[row] != gpg.host.keep_count[row];
            }
        plan_diff(&sc, &gpg.host, &cp, &gen_exact, &gen_total, &b2);
        plan_diff(&sc, &gp.host, &cp, &exact, &total, &bad_ent);
        ent_off = b2 + bad_ent;
        CHECK(kc_diff == 0 && ent_off == 0, "f32 q / %s k sampled: %d keep counts differ from the CPU's, %d entropies off",
              kn, kc_diff, ent_off);
        printf("  f32 q, %s k: sampled plan: keep counts and entropies = cpu: %s; rankings identical to the cpu's: "
               "tensor cores (q rounded to %s) %d/%d, CUDA cores (q f32) %d/%d\n", kn, kc_diff + ent_off ? "NO" : "ok",
               kn, exact, total, gen_exact, gen_total);
        gpu_plan_free(&gp); gpu_plan_free(&gpg);
        ei_plan_free(cpu, &cp);
        ei_context_destroy(g); ei_context_destroy(cpu);
    }
    dev_free(dq); dev_free(dq16); dev_free(dk); dev_free(dv); dev_free(dout);
    free(hk); free(hv); free(cws);
    free(q); free(k); free(v); free(got); free(got16); free(ref);
}
static void f32q_errors(void) {
    /* what stays refused: q f16 over bf16 k/v; k and v of different 16-bit types; f32 k/v */
    ei_config c = base_config();
    ei_context *g = make_ctx(&c, EI_BACKEND_CUDA);
    int64_t n = 300;
    int nh = 4, nkv = 2, D = 64;
    float *x = (float *)calloc((size_t)n * nh * D, 4);
    void *d16 = dev_upload(x, (size_t)n * nh * D, EI_BF16), *d32 = dev_upload(x, (size_t)n * nh * D, EI_F32), *dout;
    void *dk16 = dev_upload(x, (size_t)n * nkv * D, EI_BF16), *dv16 = dev_upload(x, (size_t)n * nkv * D, EI_BF16);
    void *dk32 = dev_upload(x, (size_t)n * nkv * D, EI_F32);
    ei_tensor qh = ei_tensor_make(d16, EI_F16, n, nh, D), kb = ei_tensor_make(dk16, EI_BF16, n, nkv, D);
    ei_tensor kh = ei_tensor_make(dv16, EI_F16, n, nkv, D), q32 = ei_tensor_make(d32, EI_F32, n, nh, D);
    ei_tensor k32 = ei_tensor_make(dk32, EI_F32, n, nkv, D);
    ei_out_tensor o;
    ei_result r;
    dout = dev_alloc((size_t)n * nh * D * 4);
    o = ei_out_tensor_make(dout, EI_F32, n, nh, D);
    ei_tensor vb = ei_tensor_make(dv16, EI_BF16, n, nkv, D);
    r = ei_attention_prefill(g, NULL, &qh, &kb, &vb, NULL, &o, 0);
    CHECK(r == EI_ERR_DTYPE && strstr(ei_last_error(), "q of k's dtype"), "q f16 over bf16 k: %s", ei_result_name(r));
    printf("  q f16, k/v bf16: %s: %s\n", ei_result_name(r), ei_last_error());
    r = ei_attention_prefill(g, NULL, &q32, &kb, &kh, NULL, &o, 0);
    CHECK(r == EI_ERR_DTYPE && strstr(ei_last_error(), "k and v both"), "k bf16, v f16: %s", ei_result_name(r));
    printf("  q f32, k bf16, v f16: %s: %s\n", ei_result_name(r), ei_last_error());
    ei_tensor v32 = ei_tensor_make(dk32, EI_F32, n, nkv, D);
    r = ei_attention_prefill(g, NULL, &q32, &k32, &v32, NULL, &o, 0);
    CHECK(r == EI_ERR_DTYPE, "f32 k/v: %s", ei_result_name(r));
    printf("  q, k, v f32: %s: %s\n", ei_result_name(r), ei_last_error());
    {   /* an f32 q beyond f16's range over f16 k: refused, not served as Inf */
        float big = 70000.f;
        ei_tensor k16 = ei_tensor_make(dk16, EI_F16, n, nkv, D), v16 = ei_tensor_make(dv16, EI_F16, n, nkv, D);
        dev_put((float *)d32 + 5 * nh * D + 3, &big, 4);
        r = ei_attention_prefill(g, NULL, &q32, &k16, &v16, NULL, &o, 0);
        CHECK(r == EI_ERR_NONFINITE, "f32 q 70000 over f16 k: %s", ei_result_name(r));
        printf("  q f32 holding 70000, k/v f16: %s: %s\n", ei_result_name(r), ei_last_error());
    }
    dev_free(d16); dev_free(d32); dev_free(dk16); dev_free(dv16); dev_free(dk32); dev_free(dout);
    free(x);
    ei_context_destroy(g);
}
static void f32q_tests(int quick) {
    f32q_case(EI_BF16, quick ? 1300 : 2100, 8, 2, 128, 2.f);
    f32q_case(EI_F16, quick ? 1300 : 2100, 8, 2, 128, 2.f);
    if (!quick) f32q_case(EI_BF16, 1500, 8, 4, 64, 0.f);
    f32q_errors();
}

/* ------------------------------------------------------------ chunked planning */
/* One call of a chunked schedule: the queries of [q_pos, q_pos + m) (m 0: a
   final call without queries). */
typedef struct chunk_call { int64_t q_pos, m; int is_final; } chunk_call;
/* EI_RANK_SAMPLED: the query rows a chunked plan holds after call cc
   (given[t] = 1), as the protocol keeps them: a roll-back (q_pos below the
   plan's end) drops the segment it cuts from its start on and every later
   one; skipped positions hold none. */
static void chunk_given(unsigned char *given, int64_t cap, int64_t seg, int64_t end, const chunk_call *cc) {
    int64_t t;
    if (!cc->m) return;
    if (cc->q_pos < end)
        for (t = cc->q_pos / seg * seg; t < cap; t++) given[t] = 0;
    for (t = cc->q_pos; t < cc->q_pos + cc->m; t++) given[t] = 1;
}
/* EI_RANK_ROWS_SPREAD: the segments whose rows one call held whole after
   call cc (whole[s] = 1: the plan scored them with the spread rows; 0: the
   even rows of the tokens given), as ei_profile_chunk decides
   (ei__spread_whole: q_pos <= s * seg and q_pos + m >= (s + 1) * seg). A
   roll-back drops them from the segment it cuts on, as chunk_given drops the
   rows; the call then sets each segment it touches: 1 if it covers it
   entirely, 0 if it cuts it (its other rows come from other calls). */
static void chunk_whole(unsigned char *whole, int64_t nseg, int64_t seg, int64_t end, const chunk_call *cc) {
    int64_t s;
    if (!cc->m) return;
    if (cc->q_pos < end)
        for (s = cc->q_pos / seg; s < nseg; s++) whole[s] = 0;
    for (s = cc->q_pos / seg; s * seg < cc->q_pos + cc->m; s++)
        whole[s] = cc->q_pos <= s * seg && cc->q_pos + cc->m >= (s + 1) * seg;
}
/* What rounding an f32 q to k's bf16 on the tensor cores can move a sampled
   mass by, relative (tests/fuzz_backends.c's q_round_bound: twice the logit
   bound 2^-8 * scale * max|q| * max|k|); 0 when q is not rounded. */
static double q_round_bound(const ei_config *c, const float *q, const float *k, int64_t n, int nh, int nkv, int D,
                            int rounded) {
    double qmax = 0, kmax = 0, x2;
    int64_t t;
    int h, i;
    if (!rounded) return 0;
    for (t = 0; t < n; t++)
        for (h = 0; h < nh; h++) {
            for (x2 = 0, i = 0; i < D; i++) x2 += (double)q[((size_t)t * nh + h) * D + i] * q[((size_t)t * nh + h) * D + i];
            qmax = fmax(qmax, sqrt(x2));
        }
    for (t = 0; t < n; t++)
        for (h = 0; h < nkv; h++) {
            for (x2 = 0, i = 0; i < D; i++) x2 += (double)k[((size_t)t * nkv + h) * D + i] * k[((size_t)t * nkv + h) * D + i];
            kmax = fmax(kmax, sqrt(x2));
        }
    return 2.0 / 256 * (c->attn_scale > 0 ? c->attn_scale : 1.0 / sqrt((double)D)) * qmax * kmax;
}
/* EI_RANK_SAMPLED plans: b's rows against a's (classes equal, entropies
   within 1e-3, and every row of segments >= 1 identical or equal up to
   near-ties through check.h's plan_row_compare: counts equal but at a top_p
   knife-edge, kept sets equal up to near-ties of the ranking scores). The
   scores: the sampled mass in double of the rows the plan holds (given,
   NULL: all rows below the plan's end; tie 2e-3 + qround, the tolerance of
   tests/fuzz_backends.c), or where a segment holds no sampled row or is not
   sampled, a's softmaxed reference scores (tie 1e-3). With
   EI_RANK_ROWS_SPREAD, a segment that one call held whole (whole[s], see
   chunk_whole) is scored by the mass of its spread rows (ref_spread_rows:
   the rows both backends picked, bit-identical by contract), the others by
   their given even rows. Returns the rows that differ beyond that; *exact /
   *total rankings identical, *bad_ent. */
static int sampled_diff(const char *what, const ei_config *c, const ei_plan *a, const ei_plan *b, const float *q,
                        const float *k, int nh, int D, const unsigned char *given, const unsigned char *whole,
                        double qround, int *exact, int *total, int *bad_ent, int *knife) {
    int h, s, diff = 0, shown = 0;
    const int64_t n = a->n_tokens;
    ei_tensor hq = ei_tensor_make(q, EI_F32, n, nh, D), hk = ei_tensor_make(k, EI_F32, n, a->n_kv_heads, D);
    double *sc = (double *)malloc(sizeof(double) * (size_t)(a->n_blocks + 1));
    *exact = *total = *bad_ent = 0;
    for (h = 0; h < a->n_kv_heads; h++) {
        if (a->head_class[h] != b->head_class[h]) diff++;
        for (s = 0; s < a->n_segments; s++) {
            size_t row = EI_PLAN_ROW(a, h, s);
            int64_t nvis = (int64_t)s * (c->segment_size / c->block_size), j;
            double tie = 1e-3;
            if (!close_enough(b->entropy[EI_PLAN_ROW(b, h, s)], a->entropy[row], 1e-6, 1e-3)) (*bad_ent)++;
            if (s == 0) continue;
            (*total)++;
            if (a->keep_count[row] == b->keep_count[EI_PLAN_ROW(b, h, s)] &&
                a->keep_blocks[row] == b->keep_blocks[EI_PLAN_ROW(b, h, s)] &&
                !memcmp(EI_PLAN_BLOCKS(a, h, s), EI_PLAN_BLOCKS(b, h, s), sizeof(int32_t) * (size_t)a->max_keep)) {
                (*exact)++;
                continue;
            }
            if (nvis > a->n_blocks) nvis = a->n_blocks;
            if (!(c->ranking == EI_RANK_SAMPLED && (int64_t)s * c->segment_size >= c->threshold_len &&
                  (c->rank_rows == EI_RANK_ROWS_SPREAD && whole && whole[s]
                       ? ref_sampled_mass_rows(c, &hq, &hk, h, s, n, given, 1, sc)
                       : ref_sampled_mass_given(c, &hq, &hk, h, s, n, given, sc)) > 0)) {
                for (j = 0; j < nvis; j++) sc[j] = a->scores[row * (size_t)a->blk_capacity + (size_t)j];
            } else
                tie = 2e-3 + qround;
            diff += plan_row_compare(what, c, a, b, h, s, sc, tie, knife, &shown);
        }
    }
    free(sc);
    return diff;
}
/* The GPU's chunked plan against the CPU's after every call of a schedule:
   counts and classes exact, entropies and scores within FORMAT.md's
   tolerances, rankings identical or valid top-k sets of the CPU's scores
   (EI_RANK_SAMPLED: sampled_diff, up to near-ties of the mass of the rows
   the plan holds). q is qdt on the GPU (f32 on the CPU: the values it rounds
   to), k bf16; the K views hold cap cells (the cells past a chunk's end are
   the engine's padding, filled). EI_RANK_SAMPLED schedules that neither roll
   back nor skip end with the GPU's chunked plan against the GPU's
   whole-prompt plan of the same tokens, as tests/test_core.c's chunk_compare
   does on the CPU: entropies of segments >= 1 bit-identical, classes equal,
   and for heads that do not turn dynamic late, rows equal up to near-ties
   of the mass (the two sum a segment's rows in another order; with
   EI_RANK_ROWS_SPREAD only the segments that both plans scored with the
   same rows: whole in one call of the chunks, or cut there and short of a
   whole segment in the prompt). They also run
   on a context with cfg.cuda_deferred_errors (nothing read back): the same
   plan bit for bit, and ei_cuda_status EI_OK. */
/* 1: the GPU plan keeps the key blocks' min/max (EI_PLAN_KEEP_KEYS), the CPU's builds them per call */
static int g_keep_keys;
static void chunked_case(const char *name, const ei_config *cfg, int64_t cap, int nh, int nkv, int D, ei_dtype qdt,
                         float peak, const chunk_call *calls, int ncalls) {
    size_t nq = (size_t)cap * nh * D, nk = (size_t)cap * nkv * D, es = qdt == EI_F32 ? 4 : 2, pbytes, cwsb, gwsb;
    float *q = (float *)malloc(nq * 4), *k = (float *)malloc(nk * 4);
    ei_context *g = make_ctx(cfg, EI_BACKEND_CUDA), *cpu = make_ctx(cfg, EI_BACKEND_CPU);
    const uint32_t flags = EI_PLAN_CHUNKED | EI_PLAN_SCORES;
    ei_sizes gz = layer_sizes(g, cap, nh, nkv, D, flags | (g_keep_keys ? EI_PLAN_KEEP_KEYS : 0u), 1);
    ei_exec cx, gx, dx;
    ei_plan cp, gp, hp;
    void *dq, *dk, *pmem, *gws, *cws;
    ei_tensor tk, hk;
    int ci, diff = 0, bad_ent = 0, bad_sc = 0, exact = 0, total = 0, rows = 0, knife = 0, plain = 1;
    const int sampled = cfg->ranking == EI_RANK_SAMPLED;
    const char *gen = getenv("EI_CUDA_SAMPLED_GENERIC");
    /* the sampled rows on tensor cores (q rounded to k's bf16 when f32) or CUDA cores (f32) */
    const int mma = (qdt == EI_BF16 || qdt == EI_F32) && (D == 64 || D == 128 || D == 256) && !(gen && gen[0] == '1');
    unsigned char *given = (unsigned char *)calloc((size_t)cap, 1);
    /* EI_RANK_ROWS_SPREAD: segments one call held whole (chunk_whole) */
    const int64_t nseg = (cap + cfg->segment_size - 1) / cfg->segment_size;
    unsigned char *whole = (unsigned char *)calloc((size_t)nseg, 1);
    double qround;
    ei_context *gd = NULL; /* EI_RANK_SAMPLED: a context with deferred errors, its plan */
    ei_plan dp;
    void *dpmem = NULL, *dws = NULL;
    gen_qk(q, k, cap, nh, nkv, D, peak);
    round_to(q, nq, qdt);
    round_to(k, nk, EI_BF16);
    qround = sampled ? q_round_bound(cfg, q, k, cap, nh, nkv, D, mma && qdt == EI_F32) : 0;
    dq = dev_upload(q, nq, qdt);
    dk = dev_upload(k, nk, EI_BF16);
    tk = ei_tensor_make(dk, EI_BF16, cap, nkv, D);
    hk = ei_tensor_make(k, EI_F32, cap, nkv, D);
    CHECK_OK(ei_plan_init(cpu, &cp, cap, nkv, D, flags, NULL, 0));
    CHECK_OK(ei_plan_init(cpu, &hp, cap, nkv, D, flags, NULL, 0));
    pbytes = gz.plan;
    pmem = dev_alloc(pbytes);
    CHECK_OK(ei_plan_init(g, &gp, cap, nkv, D, flags | (g_keep_keys ? EI_PLAN_KEEP_KEYS : 0u), pmem, pbytes));
    cwsb = layer_sizes(cpu, cap, nh, nkv, D, flags, 1).profile;
    gwsb = gz.profile;
    cws = malloc(cwsb);
    gws = dev_alloc(gwsb);
    cx = ex(1, cws, cwsb);
    gx = ex(1, gws, gwsb);
    dx = ex(1, NULL, 0);
    if (sampled) {
        ei_config dc = *cfg;
        dc.cuda_deferred_errors = 1;
        gd = make_ctx(&dc, EI_BACKEND_CUDA);
        dpmem = dev_alloc(pbytes);
        dws = dev_alloc(gwsb);
        dx = ex(1, dws, gwsb);
        CHECK_OK(ei_plan_init(gd, &dp, cap, nkv, D, flags, dpmem, pbytes));
    }
    for (ci = 0; ci < ncalls; ci++) {
        const chunk_call *cc = &calls[ci];
        ei_tensor gq = ei_tensor_make((const char *)dq + (size_t)cc->q_pos * nh * D * es, qdt, cc->m, nh, D);
        ei_tensor cq = ei_tensor_make(q + (size_t)cc->q_pos * nh * D, EI_F32, cc->m, nh, D);
        ei_result rc, rg;
        int e, t, d, h, sgi;
        if (cc->m && cc->q_pos != cp.n_tokens) plain = 0; /* a roll-back or a skip */
        chunk_whole(whole, nseg, cfg->segment_size, cp.n_tokens, cc);
        chunk_given(given, cap, cfg->segment_size, cp.n_tokens, cc);
        rc = ei_profile_chunk(cpu, &cx, cc->m ? &cq : NULL, &hk, &cp, cc->q_pos, cc->is_final);
        rg = ei_profile_chunk(g, &gx, cc->m ? &gq : NULL, &tk, &gp, cc->q_pos, cc->is_final);
        if (gd) CHECK_OK(ei_profile_chunk(gd, &dx, cc->m ? &gq : NULL, &tk, &dp, cc->q_pos, cc->is_final));
        CHECK(rc == EI_OK && rg == EI_OK, "%s call %d (q_pos %lld, m %lld, final %d): cpu %s, gpu %s (%s)", name, ci,
              (long long)cc->q_pos, (long long)cc->m, cc->is_final, ei_result_name(rc), ei_result_name(rg), ei_last_error());
        if (rc != EI_OK || rg != EI_OK) break;
        CHECK_OK(ei_plan_copy(g, &hp, &gp, EI_COPY_DEVICE_TO_HOST));
        CHECK(hp.n_tokens == cp.n_tokens && hp.n_segments == cp.n_segments && hp.n_blocks == cp.n_blocks &&
                  hp.final == cp.final,
              "%s call %d: gpu plan covers %lld tokens / %d segments / final %d, cpu %lld / %d / %d", name, ci,
              (long long)hp.n_tokens, hp.n_segments, hp.final, (long long)cp.n_tokens, cp.n_segments, cp.final);
        if (sampled)
            d = sampled_diff(name, cfg, &cp, &hp, q, k, nh, D, given, whole, qround, &e, &t, &h, &knife);
        else
            d = plan_diff(cfg, &hp, &cp, &e, &t, &h);
        diff += d; bad_ent += h; exact += e; total += t;
        rows += cp.n_kv_heads * cp.n_segments;
        if (d || h) printf("    %s call %d: %d rows differ, %d entropies off\n", name, ci, d, h);
        for (h = 0; h < nkv; h++) /* the softmaxed block scores, each segment's visible blocks */
            for (sgi = 1; sgi < cp.n_segments; sgi++) {
                size_t row = EI_PLAN_ROW(&cp, h, sgi) * (size_t)cp.blk_capacity;
                int b, nvis = sgi * (cfg->segment_size / cfg->block_size);
                for (b = 0; b < nvis; b++)
                    if (!close_enough(hp.scores[row + b], cp.scores[row + b], 1e-6, 1e-3)) bad_sc++;
            }
    }
    CHECK(diff == 0 && bad_ent == 0 && bad_sc == 0, "chunked %s: %d plan rows differ, %d entropies, %d scores off", name,
          diff, bad_ent, bad_sc);
    printf("  chunked %-28s %lld cap %d/%d heads d=%d q %s%s: %d calls, %d rows: gpu vs cpu %s (%d/%d rankings identical",
           name, (long long)cap, nh, nkv, D, qdt == EI_F32 ? "f32" : qdt == EI_F16 ? "f16" : "bf16",
           sampled ? (mma ? " (sampled: tensor cores)" : " (sampled: CUDA cores)") : "", ncalls, rows,
           diff + bad_ent + bad_sc ? "FAILED" : "ok", exact, total);
    if (sampled) printf(", %d top_p knife-edges, near-tie margin %.2g", knife, 2e-3 + qround);
    printf(")\n");
    if (gd) { /* deferred errors: nothing read back, the same plan */
        ei_plan dh;
        int h, sgi, differ = 0;
        ei_result st = ei_cuda_status(gd);
        CHECK(st == EI_OK, "chunked %s, deferred errors: ei_cuda_status %s (%s)", name, ei_result_name(st), ei_last_error());
        CHECK_OK(ei_plan_init(cpu, &dh, cap, nkv, D, flags, NULL, 0));
        CHECK_OK(ei_plan_copy(gd, &dh, &dp, EI_COPY_DEVICE_TO_HOST));
        differ += dh.n_tokens != hp.n_tokens || dh.n_segments != hp.n_segments || dh.final != hp.final;
        for (h = 0; h < nkv && !differ; h++) {
            differ += dh.head_class[h] != hp.head_class[h];
            for (sgi = 0; sgi < hp.n_segments; sgi++) {
                size_t r0 = EI_PLAN_ROW(&hp, h, sgi);
                differ += memcmp(&dh.entropy[r0], &hp.entropy[r0], 4) || memcmp(&dh.budget[r0], &hp.budget[r0], 4) ||
                          dh.keep_count[r0] != hp.keep_count[r0] || dh.keep_blocks[r0] != hp.keep_blocks[r0] ||
                          memcmp(EI_PLAN_BLOCKS(&dh, h, sgi), EI_PLAN_BLOCKS(&hp, h, sgi), sizeof(int32_t) * (size_t)hp.max_keep);
            }
        }
        CHECK(differ == 0, "chunked %s, deferred errors: %d plan rows differ from the waiting calls' plan", name, differ);
        printf("  chunked %-28s with cuda_deferred_errors: ei_cuda_status %s, plan %s\n", name, ei_result_name(st),
               differ ? "DIFFERS" : "bit-identical");
        ei_plan_free(cpu, &dh);
        dev_free(dpmem); dev_free(dws);
        ei_context_destroy(gd);
    }
    if (sampled && plain && hp.final) { /* the GPU's whole-prompt plan of the same tokens */
        const int64_t n = hp.n_tokens;
        ei_tensor wq = ei_tensor_make(dq, qdt, n, nh, D), wk = ei_tensor_make(dk, EI_BF16, n, nkv, D);
        gpu_plan wp;
        int h, sgi, ent_bits = 0, cls = 0, rowbad = 0, same = 0, all = 0, shown = 0, wknife = 0, other_rows = 0;
        ei_tensor rq = ei_tensor_make(q, EI_F32, n, nh, D), rk = ei_tensor_make(k, EI_F32, n, nkv, D);
        double *sc = (double *)malloc(sizeof(double) * (size_t)(hp.n_blocks + 1));
        gpu_profile(g, cpu, &wq, &wk, EI_PLAN_SCORES, &wp, EI_OK);
        for (h = 0; h < nkv; h++) {
            size_t row0 = EI_PLAN_ROW(&wp.host, h, 0);
            int late = wp.host.head_class[h] == EI_HEAD_DYNAMIC && wp.host.n_segments > 1 &&
                       !(wp.host.entropy[row0 + 1] >= cfg->rigid_entropy);
            if (!late && wp.host.head_class[h] != hp.head_class[h]) cls++;
            for (sgi = 1; sgi < hp.n_segments; sgi++) {
                size_t rw = EI_PLAN_ROW(&wp.host, h, sgi), rc = EI_PLAN_ROW(&hp, h, sgi);
                int64_t nvis = (int64_t)sgi * (cfg->segment_size / cfg->block_size), j;
                double tie = 1e-3;
                if (memcmp(&wp.host.entropy[rw], &hp.entropy[rc], sizeof(float))) ent_bits++;
                if (late) continue;
                /* EI_RANK_ROWS_SPREAD: ei_profile's one call holds every full segment ((s + 1) S <= n: the
                   spread rows), the chunks only those that one of them held whole (whole[]); a segment cut
                   across calls took the even rows, a ranking of other rows, not comparable here (entropies
                   and classes come from the reference score and still are; so do the rows of segments
                   below threshold_len). Where both took the same rows
                   (spread, or even in the prompt's short last segment) ref_sampled_mass_given's choice
                   (given NULL) is that of both plans. */
                if (cfg->rank_rows == EI_RANK_ROWS_SPREAD && (int64_t)sgi * cfg->segment_size >= cfg->threshold_len &&
                    ((int64_t)(sgi + 1) * cfg->segment_size <= n) != (whole[sgi] != 0)) {
                    other_rows++;
                    continue;
                }
                all++;
                if (wp.host.keep_count[rw] == hp.keep_count[rc] &&
                    !memcmp(EI_PLAN_BLOCKS(&wp.host, h, sgi), EI_PLAN_BLOCKS(&hp, h, sgi), sizeof(int32_t) * (size_t)hp.max_keep)) {
                    same++;
                    continue;
                }
                if (nvis > hp.n_blocks) nvis = hp.n_blocks;
                if (!((int64_t)sgi * cfg->segment_size >= cfg->threshold_len &&
                      ref_sampled_mass_given(cfg, &rq, &rk, h, sgi, n, NULL, sc) > 0)) {
                    for (j = 0; j < nvis; j++) sc[j] = wp.host.scores[rw * (size_t)wp.host.blk_capacity + (size_t)j];
                } else
                    tie = 2e-3 + qround;
                rowbad += plan_row_compare("gpu chunked vs gpu whole", cfg, &wp.host, &hp, h, sgi, sc, tie, &wknife, &shown);
            }
        }
        CHECK(ent_bits == 0 && cls == 0 && rowbad == 0,
              "chunked %s: vs the GPU's whole-prompt plan: %d entropies not bit-identical, %d classes, %d rows differ", name,
              ent_bits, cls, rowbad);
        printf("  chunked %-28s = gpu whole-prompt: entropies bit-identical %s, classes %s, rows %s (%d/%d identical, "
               "%d knife-edges", name, ent_bits ? "NO" : "yes", cls ? "NO" : "yes", rowbad ? "FAILED" : "ok", same, all,
               wknife);
        if (cfg->rank_rows == EI_RANK_ROWS_SPREAD)
            printf("; %d rows of segments cut across calls, even rows there, spread in the whole prompt: not compared",
                   other_rows);
        printf(")\n");
        free(sc);
        gpu_plan_free(&wp);
    }
    free(cws);
    free(given);
    free(whole);
    dev_free(gws); dev_free(pmem); dev_free(dq); dev_free(dk);
    ei_plan_free(cpu, &cp); ei_plan_free(cpu, &hp);
    ei_context_destroy(g); ei_context_destroy(cpu);
    free(q); free(k);
}
/* Schedules of chunk size m over [0, n), the last call final. */
static int chunk_schedule(chunk_call *calls, int64_t q0, int64_t n, int64_t m, int final) {
    int nc = 0;
    int64_t p;
    for (p = q0; p < n; p += m) {
        calls[nc].q_pos = p;
        calls[nc].m = p + m < n ? m : n - p;
        calls[nc].is_final = final && p + m >= n;
        nc++;
    }
    return nc;
}
static void chunked_plans(int quick) {
    chunk_call calls[64];
    ei_config c = base_config();
    int nc;
    c.base_budget = 256;
    /* chunks that align with the 512-token segment, a final partial one; one kv head of 8 query heads, f32 q */
    nc = chunk_schedule(calls, 0, 3000, 512, 1);
    chunked_case("aligned 512, G 8, 1 kv head", &c, 3000, 8, 1, 64, EI_F32, 2.f, calls, nc);
    /* chunks that cut segments (300), GQA 4, f16 q, capacity past the prompt (padded K) */
    nc = chunk_schedule(calls, 0, 2100, 300, 1);
    chunked_case("cut 300, G 4", &c, 2600, 8, 2, 128, EI_F16, 2.f, calls, nc);
    /* GQA 1, bf16 q, segment 256: chunks of 200 none final, then a final call without queries */
    {
        ei_config c2 = c;
        c2.segment_size = 256; c2.base_budget = 128;
        nc = chunk_schedule(calls, 0, 1777, 200, 0);
        calls[nc].q_pos = 1777; calls[nc].m = 0; calls[nc].is_final = 1; nc++;
        chunked_case("cut 200, G 1, final no q", &c2, 1777, 4, 4, 64, EI_BF16, 3.f, calls, nc);
    }
    /* the next turn after a final call, a roll-back into a segment, skipped positions */
    nc = chunk_schedule(calls, 0, 1024, 400, 1);
    nc += chunk_schedule(calls + nc, 1024, 1200, 400, 1); /* the next turn: segment 1 planned again, inner */
    nc += chunk_schedule(calls + nc, 1200, 1700, 250, 1); /* a turn that continues the final call's segment */
    calls[nc].q_pos = 700; calls[nc].m = 500; calls[nc].is_final = 0; nc++; /* roll back into segment 1 */
    calls[nc].q_pos = 1500; calls[nc].m = 400; calls[nc].is_final = 0; nc++; /* skip 1200..1500, same segment */
    calls[nc].q_pos = 2600; calls[nc].m = 600; calls[nc].is_final = 1; nc++; /* skip segment 4: the recurrence restarts */
    chunked_case("turns, roll-back, skip, G 4", &c, 3200, 16, 4, 64, EI_BF16, 2.f, calls, nc);
    g_keep_keys = 1;
    chunked_case("the same, GPU plan with EI_PLAN_KEEP_KEYS", &c, 3200, 16, 4, 64, EI_BF16, 2.f, calls, nc);
    g_keep_keys = 0;
    {   /* EI_RANK_SAMPLED: the open segment's sampled rows summed over chunks (segments from threshold_len on) */
        ei_config cs = c;
        cs.ranking = EI_RANK_SAMPLED;
        cs.rank_samples = 16;
        cs.threshold_len = 512;
        /* chunks that cut segments (300), bf16 q on the tensor cores (d 128), K padded past the prompt;
           then the GPU's chunked plan against its whole-prompt plan */
        nc = chunk_schedule(calls, 0, 2100, 300, 1);
        chunked_case("sampled cut 300, G 4", &cs, 2600, 8, 2, 128, EI_BF16, 2.f, calls, nc);
        /* chunks smaller than a segment (200 of 512), f32 q on CUDA cores (d 96), none final, then a final
           call without queries */
        nc = chunk_schedule(calls, 0, 2300, 200, 0);
        calls[nc].q_pos = 2300; calls[nc].m = 0; calls[nc].is_final = 1; nc++;
        chunked_case("sampled 200s, d 96, final no q", &cs, 2300, 8, 2, 96, EI_F32, 2.f, calls, nc);
        /* the next turn after a final call (its last segment planned again, inner, then continued), a
           roll-back into a segment, skipped positions; top_p, sink and local blocks; f32 q on the tensor
           cores (rounded to bf16) */
        cs.top_p = 0.9; cs.sink_blocks = 1; cs.local_blocks = 2;
        nc = chunk_schedule(calls, 0, 1024, 400, 1);
        nc += chunk_schedule(calls + nc, 1024, 1300, 400, 1); /* segment 1 planned again, inner */
        nc += chunk_schedule(calls + nc, 1300, 1800, 250, 1); /* continues the final call's segment 2 */
        calls[nc].q_pos = 700; calls[nc].m = 500; calls[nc].is_final = 0; nc++; /* roll back into segment 1 */
        calls[nc].q_pos = 1400; calls[nc].m = 300; calls[nc].is_final = 0; nc++; /* skip 1200..1400, same segment */
        calls[nc].q_pos = 2600; calls[nc].m = 600; calls[nc].is_final = 1; nc++; /* skip segment 4 */
        chunked_case("sampled turns, roll-back, skip", &cs, 3200, 8, 2, 64, EI_F32, 2.f, calls, nc);
        g_keep_keys = 1;
        chunked_case("the same, GPU plan with EI_PLAN_KEEP_KEYS", &cs, 3200, 8, 2, 64, EI_F32, 2.f, calls, nc);
        g_keep_keys = 0;
        /* EI_RANK_ROWS_SPREAD (the GPU's spread_pick_kernel, whose rows must be the CPU's bit for bit): the
           farthest-point rows in the segments one call holds whole, the even rows in those cut across calls
           (sampled_diff scores each segment by the rows it took, chunk_whole); top_p, sink and local as
           above. Chunks of 1024: whole segments and a cut last one, bf16 q on the tensor cores (d 128),
           then the whole-prompt plan; chunks of 700: whole and cut segments in turn, f32 q on the CUDA cores
           (d 96), the whole-prompt plan compared where both took the same rows; G 8 of one kv head (1024
           candidates a segment, stride 4) with a roll-back to a segment's start (segments 2 and 3 whole
           again), one into segment 2 (both cut), then segment 3 cut, 4 and 5 whole, a short last one */
        cs.rank_rows = EI_RANK_ROWS_SPREAD;
        nc = chunk_schedule(calls, 0, 3000, 1024, 1);
        chunked_case("spread rows 1024s, G 4", &cs, 3000, 8, 2, 128, EI_BF16, 2.f, calls, nc);
        nc = chunk_schedule(calls, 0, 3300, 700, 1);
        chunked_case("spread rows 700s, d 96", &cs, 3300, 8, 2, 96, EI_F32, 2.f, calls, nc);
        nc = chunk_schedule(calls, 0, 2048, 1024, 0);
        calls[nc].q_pos = 1024; calls[nc].m = 1024; calls[nc].is_final = 0; nc++; /* roll back to segment 2's start */
        calls[nc].q_pos = 1300; calls[nc].m = 700; calls[nc].is_final = 0; nc++;  /* roll back into segment 2 */
        calls[nc].q_pos = 2000; calls[nc].m = 1100; calls[nc].is_final = 1; nc++; /* 3 cut, 4 and 5 whole, 6 short */
        chunked_case("spread rows roll-backs, G 8", &cs, 3100, 8, 1, 64, EI_BF16, 2.f, calls, nc);
        /* Gemma 3's heads (G 4 of one kv head, d 256: the rows in registers, 512 threads) */
        nc = chunk_schedule(calls, 0, 2600, 1024, 1);
        chunked_case("spread rows d 256, G 4", &cs, 2600, 4, 1, 256, EI_BF16, 2.f, calls, nc);
        /* EI_RANK_PRECISION_INT8 (the keys rounded once per call, the rows in the mass kernels; exact integer
           dots, so the GPU's logits are the CPU's): spread rows in chunks of 1024 (bf16, d 128); even rows in
           chunks of 700 with f32 q and k at d 96, on the tensor cores (rows padded with zeros to 128) and on
           the CUDA cores */
        cs.rank_precision = EI_RANK_PRECISION_INT8;
        nc = chunk_schedule(calls, 0, 3000, 1024, 1);
        chunked_case("int8, spread rows 1024s, G 4", &cs, 3000, 8, 2, 128, EI_BF16, 2.f, calls, nc);
        cs.rank_rows = EI_RANK_ROWS_EVEN; /* (the cases below: the even rows) */
        nc = chunk_schedule(calls, 0, 3300, 700, 1);
        chunked_case("int8 700s, f32 d 96", &cs, 3300, 8, 2, 96, EI_F32, 2.f, calls, nc);
        setenv("EI_CUDA_SAMPLED_GENERIC", "1", 1);
        chunked_case("int8 700s, f32 d 96, CUDA cores", &cs, 3300, 8, 2, 96, EI_F32, 2.f, calls, nc);
        unsetenv("EI_CUDA_SAMPLED_GENERIC");
        cs.rank_precision = EI_RANK_PRECISION_F32;
    }
    if (quick) return;
    {   /* EI_RANK_SAMPLED, more: f32 q on CUDA cores at d 128 (EI_CUDA_SAMPLED_GENERIC), G 8 of one kv head,
           chunks of 384; 300 rows per segment (two row chunks on the tensor cores) with top_p, chunks of 700;
           a segment threshold past segment 1; one whole-prompt chunk */
        ei_config cs = c;
        cs.ranking = EI_RANK_SAMPLED;
        cs.rank_samples = 16;
        cs.threshold_len = 1024;
        nc = chunk_schedule(calls, 0, 3000, 384, 1);
        setenv("EI_CUDA_SAMPLED_GENERIC", "1", 1);
        chunked_case("sampled 384s, CUDA cores, G 8", &cs, 3000, 8, 1, 128, EI_F32, 2.f, calls, nc);
        unsetenv("EI_CUDA_SAMPLED_GENERIC");
        chunked_case("sampled 384s, tensor cores, G 8", &cs, 3000, 8, 1, 128, EI_F32, 2.f, calls, nc);
        cs.rank_samples = 300;
        cs.top_p = 0.95;
        nc = chunk_schedule(calls, 0, 3300, 700, 1);
        chunked_case("sampled 300 rows, top_p, 700s", &cs, 3300, 4, 2, 64, EI_BF16, 0.f, calls, nc);
        cs.rank_samples = 64; cs.top_p = 0.0; cs.threshold_len = 0;
        nc = chunk_schedule(calls, 0, 2500, 2500, 1);
        chunked_case("sampled one chunk", &cs, 2500, 8, 2, 64, EI_BF16, 2.f, calls, nc);
        /* Gemma 3 270M's global layers in llama.cpp's micro-batches: one kv head of 4 query heads, d 256,
           f32 q, chunks of 512 with the quality preset's ranking; past 8192 keys a chunk's sampled rows
           take more than 16 key parts (chunk_parts_max: 24 at the end) */
        cs.rank_samples = 64; cs.top_p = 0.95; cs.sink_blocks = 1; cs.local_blocks = 8; cs.threshold_len = 1024;
        cs.budget_max_factor = 4.0;
        nc = chunk_schedule(calls, 0, 12288, 512, 1);
        chunked_case("sampled 512s, d 256, 1 kv head", &cs, 12288, 4, 1, 256, EI_F32, 2.f, calls, nc);
        /* the same heads with ei_config_quality()'s ranking (128 spread rows, int8 scores) */
        cs.rank_samples = 128; cs.rank_rows = EI_RANK_ROWS_SPREAD; cs.rank_precision = EI_RANK_PRECISION_INT8;
        nc = chunk_schedule(calls, 0, 6144, 512, 1);
        chunked_case("preset ranking 512s, d 256, 1 kv head", &cs, 6144, 4, 1, 256, EI_F32, 2.f, calls, nc);
    }
    /* GQA 8 with several kv heads, one call per 128 tokens, per_segment_budget */
    {
        ei_config c3 = c;
        c3.per_segment_budget = 1;
        nc = chunk_schedule(calls, 0, 4100, 128, 1);
        chunked_case("128s, G 8, per-segment budget", &c3, 4100, 32, 4, 64, EI_BF16, 2.f, calls, nc);
    }
    /* the ranking beyond the paper (top_p, sink and local blocks), chunks of 700 */
    {
        ei_config c4 = c;
        c4.top_p = 0.9; c4.sink_blocks = 2; c4.local_blocks = 4;
        nc = chunk_schedule(calls, 0, 3300, 700, 1);
        chunked_case("top_p, sink/local, G 2", &c4, 3300, 4, 2, 64, EI_F32, 2.f, calls, nc);
        c4.per_segment_budget = 1;
        chunked_case("top_p, per-segment budget", &c4, 3300, 4, 2, 64, EI_F32, 0.f, calls, nc);
    }
    /* one whole-prompt chunk: the same plan as ei_profile's (entropies, counts, rankings) */
    nc = chunk_schedule(calls, 0, 2500, 2500, 1);
    chunked_case("one chunk", &c, 2500, 8, 2, 64, EI_BF16, 2.f, calls, nc);
}
/* Bad chunked calls: the same call on a CPU plan and a GPU plan (the same
   history) gets the same code, with no crash; a group change is found on the
   device. A chunk in parts on the GPU is part 0's call (the other parts
   leave the plan as it was). With the sampled ranking
   (segments from 512 on sampled, 16 rows) the same schedule of calls. */
typedef struct chunk_pair {
    ei_context *cpu, *g;
    ei_plan cp, gp;
    const float *hq, *hk;     /* host f32 q [n][nh][D], k [n][nkv][D] */
    const void *dq, *dk;      /* the same on the device, bf16 */
    void *cws, *gws;
    size_t cwsb, gwsb;
    int nh, nkv, D;
} chunk_pair;
/* queries of rows [src, src + m) as `heads` query heads (m 0: none) at q_pos,
   k holding k_tokens keys; workspaces cut to ws_cut bytes when not 0 */
static void chunk_both(chunk_pair *P, int64_t src, int64_t m, int heads, int64_t k_tokens, int64_t q_pos, int is_final,
                       size_t ws_cut, ei_result want, const char *what) {
    const int64_t ts = (int64_t)P->nh * P->D;
    ei_tensor cq = ei_tensor_make(P->hq + src * ts, EI_F32, m, heads, P->D);
    ei_tensor gq = ei_tensor_make((const uint16_t *)P->dq + src * ts, EI_BF16, m, heads, P->D);
    ei_tensor ck = ei_tensor_make(P->hk, EI_F32, k_tokens, P->nkv, P->D);
    ei_tensor gk = ei_tensor_make(P->dk, EI_BF16, k_tokens, P->nkv, P->D);
    ei_exec cx = ex(1, P->cws, ws_cut ? ws_cut : P->cwsb), gx = ex(1, P->gws, ws_cut ? ws_cut : P->gwsb);
    ei_result rc, rg;
    char cmsg[512];
    cq.token_stride = gq.token_stride = ts;
    rc = ei_profile_chunk(P->cpu, &cx, m ? &cq : NULL, &ck, &P->cp, q_pos, is_final);
    snprintf(cmsg, sizeof cmsg, "%s", ei_last_error());
    rg = ei_profile_chunk(P->g, &gx, m ? &gq : NULL, &gk, &P->gp, q_pos, is_final);
    CHECK(rc == want && rg == want, "%s: cpu %s (%s), gpu %s (%s), expected %s", what, ei_result_name(rc), cmsg,
          ei_result_name(rg), ei_last_error(), ei_result_name(want));
    if (rg != EI_OK) printf("  %-34s cpu %s, gpu %s: %s\n", what, ei_result_name(rc), ei_result_name(rg), ei_last_error());
    CHECK(rg != EI_OK || P->gp.n_tokens == P->cp.n_tokens, "%s: the plans cover %lld (gpu) and %lld (cpu) tokens", what,
          (long long)P->gp.n_tokens, (long long)P->cp.n_tokens);
}
static void chunked_errors(int sampled) {
    ei_config c = base_config();
    int64_t n = 1500;
    chunk_pair P;
    ei_sizes gz, cz;
    float *q, *k;
    void *pm;
    ei_plan whole;
    memset(&P, 0, sizeof P);
    P.nh = 8; P.nkv = 2; P.D = 64;
    q = (float *)malloc((size_t)n * P.nh * P.D * 4);
    k = (float *)malloc((size_t)n * P.nkv * P.D * 4);
    c.base_budget = 256;
    if (sampled) {
        c.ranking = EI_RANK_SAMPLED;
        c.rank_samples = 16;
        c.threshold_len = 512;
        printf("  (the same with EI_RANK_SAMPLED)\n");
    }
    P.g = make_ctx(&c, EI_BACKEND_CUDA);
    P.cpu = make_ctx(&c, EI_BACKEND_CPU);
    gen_qk(q, k, n, P.nh, P.nkv, P.D, 0.f);
    q[(size_t)1417 * P.nh * P.D + 3] = NAN; /* a chunk from 1400 meets it */
    round_to(q, (size_t)n * P.nh * P.D, EI_BF16);
    round_to(k, (size_t)n * P.nkv * P.D, EI_BF16);
    P.hq = q; P.hk = k;
    P.dq = dev_upload(q, (size_t)n * P.nh * P.D, EI_BF16);
    P.dk = dev_upload(k, (size_t)n * P.nkv * P.D, EI_BF16);
    gz = layer_sizes(P.g, n, P.nh, P.nkv, P.D, EI_PLAN_CHUNKED, 1);
    cz = layer_sizes(P.cpu, n, P.nh, P.nkv, P.D, EI_PLAN_CHUNKED, 1);
    pm = dev_alloc(gz.plan);
    CHECK_OK(ei_plan_init(P.g, &P.gp, n, P.nkv, P.D, EI_PLAN_CHUNKED, pm, gz.plan));
    CHECK_OK(ei_plan_init(P.cpu, &P.cp, n, P.nkv, P.D, EI_PLAN_CHUNKED, NULL, 0));
    P.gwsb = gz.profile;
    P.cwsb = cz.profile;
    P.gws = dev_alloc(P.gwsb);
    P.cws = malloc(P.cwsb);
    chunk_both(&P, 0, 0, 8, n, 0, 1, 0, EI_ERR_STATE, "final call with nothing planned");
    chunk_both(&P, 0, 600, 8, n, 0, 0, 0, EI_OK, "chunk [0, 600)");
    chunk_both(&P, 0, 0, 8, n, 500, 1, 0, EI_ERR_STATE, "no queries, not at the plan's end");
    chunk_both(&P, 0, 0, 8, n, 600, 0, 0, EI_ERR_STATE, "no queries, not final");
    chunk_both(&P, 600, 300, 8, n, -3, 0, 0, EI_ERR_SIZE, "q_pos -3");
    chunk_both(&P, 600, 300, 8, 800, 600, 0, 0, EI_ERR_SHAPE, "queries past k's keys");
    chunk_both(&P, 600, 600, 8, n, 1000, 0, 0, EI_ERR_SIZE, "past the plan's capacity");
    chunk_both(&P, 600, 300, 8, n, 600, 0, 64, EI_ERR_WORKSPACE, "workspace of 64 bytes");
    chunk_both(&P, 600, 300, 4, n, 600, 0, 0, EI_ERR_SHAPE, "another query group (4 heads)");
    chunk_both(&P, 0, 600, 8, n, 0, 0, 0, EI_OK, "roll back to 0");
    chunk_both(&P, 1400, 100, 8, n, 1400, 0, 0, EI_ERR_NONFINITE, "NaN in the chunk's q");
    chunk_both(&P, 0, 600, 8, n, 0, 0, 0, EI_OK, "roll back to 0 after it");
    chunk_both(&P, 600, 800, 8, n, 600, 1, 0, EI_OK, "[600, 1400), final (before the NaN)");
    {
        ei_tensor gq = ei_tensor_make(P.dq, EI_BF16, 600, P.nh, P.D), gk = ei_tensor_make(P.dk, EI_BF16, n, P.nkv, P.D);
        ei_exec x = ex(1, P.gws, P.gwsb);
        int64_t before = P.gp.n_tokens;
        /* in parts the GPU call is part 0's: part 1 returns EI_OK and leaves the plan (a roll-back to 0 here) */
        x.nth = 2;
        x.ith = 1;
        CHECK_ERR(ei_profile_chunk(P.g, &x, &gq, &gk, &P.gp, 0, 0), EI_OK);
        CHECK(P.gp.n_tokens == before && before == 1400, "gpu chunk, part 1 of 2: the plan covers %lld tokens, not %lld",
              (long long)P.gp.n_tokens, (long long)before);
        x.ith = 0;
        CHECK_ERR(ei_profile_chunk(P.g, &x, &gq, &gk, &P.gp, 0, 0), EI_OK);
        CHECK_ERR(ei_plan_finalize(P.g, &P.gp), EI_OK);
        CHECK(P.gp.n_tokens == 600, "gpu chunk, part 0 of 2: the plan covers %lld tokens, not 600", (long long)P.gp.n_tokens);
        printf("  a chunk in parts on the GPU: part 1 of 2 did nothing, part 0 planned [0, 600)\n");
        /* a plan without the chunked state (the context allocates it on the device) */
        CHECK_OK(ei_plan_init(P.g, &whole, n, P.nkv, P.D, 0, NULL, 0));
        CHECK(whole.on_device == 1, "ei_plan_init(NULL, 0) on a GPU context: on_device %d", whole.on_device);
        x = ex(1, P.gws, P.gwsb);
        CHECK_ERR(ei_profile_chunk(P.g, &x, &gq, &gk, &whole, 0, 0), EI_ERR_STATE);
        ei_plan_free(P.g, &whole);
    }
    dev_free(P.gws); dev_free(pm); dev_free((void *)P.dq); dev_free((void *)P.dk);
    free(P.cws);
    ei_plan_free(P.cpu, &P.cp);
    ei_context_destroy(P.g); ei_context_destroy(P.cpu);
    free(q); free(k);
}

/* ------------------------------------------------------------ errors */
static void error_tests(void) {
    ei_config c = base_config();
    ei_context *g = make_ctx(&c, EI_BACKEND_CUDA), *cpu = make_ctx(&c, EI_BACKEND_CPU);
    int64_t n = 1500;
    int nh = 4, nkv = 2, D = 64;
    float *q = (float *)malloc((size_t)n * nh * D * 4), *k = (float *)malloc((size_t)n * nkv * D * 4);
    void *dq, *dk;
    ei_tensor tq, tk;
    gpu_plan gp;
    gen_qk(q, k, n, nh, nkv, D, 0.f);
    q[(size_t)777 * nh * D + 5] = NAN;
    dq = dev_upload(q, (size_t)n * nh * D, EI_BF16);
    dk = dev_upload(k, (size_t)n * nkv * D, EI_BF16);
    tq = ei_tensor_make(dq, EI_BF16, n, nh, D);
    tk = ei_tensor_make(dk, EI_BF16, n, nkv, D);
    gpu_profile(g, cpu, &tq, &tk, 0, &gp, EI_ERR_NONFINITE);
    printf("  NaN in q: %s\n", ei_last_error());
    {
        ei_tensor bad = tq;
        ei_exec big = ex(1, gp.ws, (size_t)1 << 30), small = ex(1, gp.ws, 16);
        bad.head_stride = 0;
        CHECK(ei_profile(g, &big, &bad, &tk, &gp.dev) == EI_ERR_STRIDE, "zero stride accepted");
        CHECK(ei_profile(g, &small, &tq, &tk, &gp.dev) == EI_ERR_WORKSPACE, "small workspace accepted");
    }
    gpu_plan_free(&gp);
    dev_free(dq); dev_free(dk);
    free(q); free(k);
    ei_context_destroy(g); ei_context_destroy(cpu);
}

/* ------------------------------------------------------------ ei_exec on the GPU */
/* Two plans (host copies), the same bits in every field and planned row. */
static int plans_identical(const ei_plan *a, const ei_plan *b) {
    int h, s;
    if (a->n_tokens != b->n_tokens || a->n_segments != b->n_segments || a->n_blocks != b->n_blocks || a->final != b->final ||
        a->max_keep != b->max_keep || memcmp(a->head_class, b->head_class, (size_t)a->n_kv_heads))
        return 0;
    for (h = 0; h < a->n_kv_heads; h++)
        for (s = 0; s < a->n_segments; s++) {
            size_t r = EI_PLAN_ROW(a, h, s);
            if (memcmp(&a->entropy[r], &b->entropy[r], 4) || memcmp(&a->budget[r], &b->budget[r], 4) ||
                a->keep_count[r] != b->keep_count[r] || a->keep_blocks[r] != b->keep_blocks[r] ||
                memcmp(EI_PLAN_BLOCKS(a, h, s), EI_PLAN_BLOCKS(b, h, s), sizeof(int32_t) * (size_t)a->max_keep))
                return 0;
        }
    return 1;
}
/* A call on the CUDA backend is one launch sequence however its ei_exec
   says it runs: n_threads is unused, and in parts part 0 makes the whole
   call while the others return EI_OK writing nothing (parts 2 and 1 go
   first here; ei_plan_finalize and ei_attention_decode_merge after them
   have nothing left to do). The ei_exec itself is checked as on the CPU,
   ei_layer_sizes gives one workspace whatever the thread count, and
   ei_plan_init with memory NULL allocates the plan on the device. (Prefill
   attention: attention_case's gpu_ways_prefill; every operation of the
   table: test_ops' ways.) */
static void gpu_exec_tests(void) {
    enum { NH = 8, NKV = 2, D = 64 };
    const int64_t n = 1200;
    ei_config c = base_config();
    ei_context *g;
    float *q = (float *)malloc(sizeof(float) * (size_t)n * NH * D), *k = (float *)malloc(sizeof(float) * (size_t)n * NKV * D);
    float *v = (float *)malloc(sizeof(float) * (size_t)n * NKV * D);
    void *dq, *dk, *dv, *ws, *dout, *ring, *dsc;
    unsigned char *whole, *got, *poison;
    size_t ob = (size_t)NH * D * 2, sb = sizeof(float) * (size_t)NH * (size_t)n, big = sb > ob ? sb : ob;
    ei_shape sh;
    ei_sizes z1, z8;
    ei_plan p1, p2, h1, h2;
    ei_exec x;
    ei_tensor tq, tk, tv, tq1;
    ei_out_tensor to;
    ei_decoder dec;
    ei_keep_set ks;
    int ith, untouched = 1;
    int64_t i;
    c.decode_budget = 256; c.window = 16; c.decode_gap = 4;
    g = make_ctx(&c, EI_BACKEND_CUDA);
    CHECK(ei_context_config(g)->backend == EI_BACKEND_CUDA && ei_context_config(g)->simd != EI_SIMD_AUTO,
          "ei_context_config on a CUDA context: backend %d, simd %d", (int)ei_context_config(g)->backend,
          (int)ei_context_config(g)->simd);
    {   /* EI_BACKEND_CUDA_OR_CPU finds the GPU, and the context says so */
        ei_config oc = c;
        ei_context *o = NULL;
        oc.backend = EI_BACKEND_CUDA_OR_CPU;
        CHECK_OK(ei_context_create(&oc, &o));
        CHECK(o && ei_context_config(o)->backend == EI_BACKEND_CUDA, "EI_BACKEND_CUDA_OR_CPU with a GPU: backend %d",
              o ? (int)ei_context_config(o)->backend : -1);
        ei_context_destroy(o);
    }
    gen_qk(q, k, n, NH, NKV, D, 2.f);
    for (i = 0; i < n * NKV * D; i++) v[i] = nrand();
    dq = dev_upload(q, (size_t)n * NH * D, EI_BF16);
    dk = dev_upload(k, (size_t)n * NKV * D, EI_BF16);
    dv = dev_upload(v, (size_t)n * NKV * D, EI_BF16);
    tq = ei_tensor_make(dq, EI_BF16, n, NH, D);
    tk = ei_tensor_make(dk, EI_BF16, n, NKV, D);
    tv = ei_tensor_make(dv, EI_BF16, n, NKV, D);
    /* sizes: one workspace for any thread count; a decode step is one attention launch */
    memset(&sh, 0, sizeof sh);
    sh.max_tokens = n; sh.n_heads = NH; sh.n_kv_heads = NKV; sh.head_dim = D; sh.n_threads = 1;
    CHECK_OK(ei_layer_sizes(g, &sh, &z1));
    sh.n_threads = 8;
    CHECK_OK(ei_layer_sizes(g, &sh, &z8));
    CHECK(!memcmp(&z1, &z8, sizeof z1), "gpu ei_layer_sizes: 8 threads change the sizes (profile %zu/%zu, prefill %zu/%zu, "
          "decode %zu/%zu, decode_keep %zu/%zu)", z1.profile, z8.profile, z1.prefill, z8.prefill, z1.decode, z8.decode,
          z1.decode_keep, z8.decode_keep);
    CHECK(z1.decode == z1.prefill, "gpu ei_layer_sizes: decode %zu, prefill %zu (one launch)", z1.decode, z1.prefill);
    CHECK(z1.workspace >= z1.profile && z1.workspace >= z1.prefill && z1.workspace >= z1.decode &&
              z1.workspace >= z1.decode_keep &&
              (z1.workspace == z1.profile || z1.workspace == z1.prefill || z1.workspace == z1.decode ||
               z1.workspace == z1.decode_keep),
          "gpu ei_layer_sizes: workspace %zu is not the largest of the four", z1.workspace);
    ws = dev_alloc(z1.workspace);
    /* plans in device memory the context allocates */
    CHECK_OK(ei_plan_init(g, &p1, n, NKV, D, 0, NULL, 0));
    CHECK_OK(ei_plan_init(g, &p2, n, NKV, D, 0, NULL, 0));
    CHECK(p1.on_device == 1 && p1.owned_memory != NULL, "gpu ei_plan_init(NULL, 0): on_device %d", p1.on_device);
    CHECK_OK(ei_plan_init(g_cpu, &h1, n, NKV, D, 0, NULL, 0));
    CHECK_OK(ei_plan_init(g_cpu, &h2, n, NKV, D, 0, NULL, 0));
    {
        ei_plan none;
        memset(&none, 0, sizeof none);
        CHECK_ERR(ei_plan_init(g, &none, n, NKV, D, 0, NULL, 64), EI_ERR_NULL); /* (a failed allocation of the caller's) */
    }
    /* the ei_exec is checked on the GPU as on the CPU */
    x = ex(1, ws, z1.workspace); x.nth = 2; x.ith = 2;
    CHECK_ERR(ei_profile(g, &x, &tq, &tk, &p1), EI_ERR_SIZE);
    x.ith = 0; x.n_threads = 2;
    CHECK_ERR(ei_profile(g, &x, &tq, &tk, &p1), EI_ERR_CONFIG);
    x = ex(1, ws, z1.workspace); x.nth = -1;
    CHECK_ERR(ei_attention_prefill(g, &x, &tq, &tk, &tv, NULL, NULL, 0), EI_ERR_SIZE);
    x = ex(1, NULL, 64);
    CHECK_ERR(ei_profile(g, &x, &tq, &tk, &p1), EI_ERR_NULL);
    /* profiling: whole, parts, threads: one plan */
    x = ex(1, ws, z1.workspace);
    CHECK_OK(ei_profile(g, &x, &tq, &tk, &p1));
    CHECK_OK(ei_plan_copy(g, &h1, &p1, EI_COPY_DEVICE_TO_HOST));
    x.nth = 3;
    for (ith = 2; ith >= 0; ith--) {
        x.ith = ith;
        CHECK_OK(ei_profile(g, &x, &tq, &tk, &p2));
        if (ith) untouched &= p2.n_tokens == 0 && p2.n_segments == 0;
    }
    CHECK_OK(ei_plan_finalize(g, &p2));
    CHECK(untouched, "gpu profile in parts: a part other than 0 planned");
    CHECK_OK(ei_plan_copy(g, &h2, &p2, EI_COPY_DEVICE_TO_HOST));
    CHECK(plans_identical(&h1, &h2), "gpu profile in parts: part 0's plan differs from the whole call's");
    x = ex(1, ws, z1.workspace); x.n_threads = 4;
    CHECK_OK(ei_profile(g, &x, &tq, &tk, &p2));
    CHECK_OK(ei_plan_copy(g, &h2, &p2, EI_COPY_DEVICE_TO_HOST));
    CHECK(plans_identical(&h1, &h2), "gpu profile on 4 threads: the plan differs from one thread's");
    /* a decode step: whole, parts (+ merge), threads */
    whole = (unsigned char *)malloc(big); got = (unsigned char *)malloc(big); poison = (unsigned char *)malloc(big);
    memset(poison, 0xFF, big);
    dout = dev_alloc(ob);
    tq1 = tq;
    tq1.data = (const uint16_t *)dq + (size_t)(n - 1) * NH * D;
    tq1.n_tokens = 1;
    to = ei_out_tensor_make(dout, EI_BF16, 1, NH, D);
    dev_put(dout, poison, ob);
    x = ex(1, ws, z1.decode);
    CHECK_OK(ei_attention_decode(g, &x, &tq1, &tk, &tv, NULL, &to, n - 1));
    CHECK_OK(ei_attention_decode_merge(g, &x, &to));
    dev_get(whole, dout, ob);
    dev_put(dout, poison, ob);
    x.nth = 3;
    untouched = 1;
    for (ith = 2; ith >= 0; ith--) {
        x.ith = ith;
        CHECK_OK(ei_attention_decode(g, &x, &tq1, &tk, &tv, NULL, &to, n - 1));
        if (ith) { dev_get(got, dout, ob); untouched &= !memcmp(got, poison, ob); }
    }
    for (ith = 0; ith < 3; ith++) { x.ith = ith; CHECK_OK(ei_attention_decode_merge(g, &x, &to)); }
    dev_get(got, dout, ob);
    CHECK(untouched, "gpu decode attention in parts: a part other than 0 wrote the output");
    CHECK(!memcmp(got, whole, ob), "gpu decode attention in parts: the output differs from the whole call's");
    dev_put(dout, poison, ob);
    x = ex(1, ws, z1.decode); x.n_threads = 4;
    CHECK_OK(ei_attention_decode(g, &x, &tq1, &tk, &tv, NULL, &to, n - 1));
    dev_get(got, dout, ob);
    CHECK(!memcmp(got, whole, ob), "gpu decode attention on 4 threads: the output differs from one thread's");
    /* decode scores in parts; ei_decode_keep refuses parts (score, then select, after the barrier) */
    ring = dev_alloc(z1.decoder);
    dsc = dev_alloc(sb);
    CHECK_OK(ei_decoder_init(g, &dec, NH, NKV, D, ring, z1.decoder));
    {
        ei_tensor qo = tq;
        qo.data = (const uint16_t *)dq + (size_t)(n - 16) * NH * D;
        qo.n_tokens = 16;
        CHECK_OK(ei_decode_observe(g, &dec, &qo, n - 16, 0));
    }
    dev_put(dsc, poison, sb);
    x = ex(1, ws, z1.decode_keep);
    CHECK_OK(ei_decode_score(g, &x, &dec, &tk, NULL, 0, (float *)dsc));
    dev_get(whole, dsc, sb);
    dev_put(dsc, poison, sb);
    x.nth = 2;
    x.ith = 1;
    CHECK_OK(ei_decode_score(g, &x, &dec, &tk, NULL, 0, (float *)dsc));
    dev_get(got, dsc, sb);
    CHECK(!memcmp(got, poison, sb), "gpu decode score, part 1 of 2: the scores were written");
    x.ith = 0;
    CHECK_OK(ei_decode_score(g, &x, &dec, &tk, NULL, 0, (float *)dsc));
    dev_get(got, dsc, sb);
    CHECK(!memcmp(got, whole, sb), "gpu decode score, part 0 of 2: the scores differ from the whole call's");
    memset(&ks, 0, sizeof ks);
    ks.heads_out = NKV;
    ks.capacity = c.decode_budget;
    ks.index = (int32_t *)ws; /* (refused before anything is read or written) */
    CHECK_ERR(ei_decode_keep(g, &x, &dec, &tk, &ks), EI_ERR_CONFIG);
    printf("  ei_exec on the GPU: sizes for 1 and 8 threads alike (workspace %zu bytes); profile, decode attention and "
           "decode scores in parts = the whole call bit for bit, parts other than 0 write nothing; n_threads unused\n",
           z1.workspace);
    dev_free(ring); dev_free(dsc); dev_free(dout); dev_free(ws);
    dev_free(dq); dev_free(dk); dev_free(dv);
    ei_plan_free(g, &p1); ei_plan_free(g, &p2); ei_plan_free(g_cpu, &h1); ei_plan_free(g_cpu, &h2);
    free(whole); free(got); free(poison); free(q); free(k); free(v);
    ei_context_destroy(g);
}

/* ------------------------------------------------------------ device placements */
/* Issue 36 on the device: the header's MEMORY ARGUMENTS checks compare
   address ranges, so they hold for device pointers too. Each call's device
   regions live in one arena; every region that meets a written one is
   placed inside it (at its start, middle, end, straddling its end, at
   256-byte offsets so that no alignment rule answers first) and the call
   must refuse with EI_ERR_OVERLAP, leaving every byte of the arena and the
   host structs as they were. The regions at home give EI_OK. The decode
   entries (keep sets, scores, shared sums, compaction, decode attention)
   run under a context of decode_budget 64 and window 16, so that the
   300-row cache is compressed. */
enum { DP_Q, DP_K, DP_V, DP_OUT, DP_PLAN, DP_WS, DP_DEC, DP_DWS, DP_IDX, DP_POS, DP_SCORES, DP_SHARED, DP_ROWPOS,
       DP_COUNT };
static const char *const dp_name[DP_COUNT] = {"q", "k", "v", "out", "plan memory", "workspace", "decoder memory",
                                              "decode workspace", "keep->index", "keep->positions", "scores", "shared",
                                              "row_pos"};
typedef struct dp_fix {
    int64_t n;
    int nh, nkv, D, W, C;              /* C: decode_budget (keep capacity) */
    size_t bytes[DP_COUNT], home[DP_COUNT], at[DP_COUNT], arena_bytes, pb, pcb, db, dwsb;
    unsigned char *arena;              /* device */
    void *q_host, *k_host, *v_host;    /* bf16 contents */
    ei_context *ctx;                   /* the decode configuration above */
    ei_plan plan, ref_plan;            /* ref_plan: profiled, its own memory */
    void *ref_mem, *ref_ws;
    ei_decoder dec;
    ei_keep_set keep;                  /* its arrays in the arena */
    void *q_obs, *dec_apart;           /* the observed queries; a decoder's memory (device, apart) */
    float *ref_scores, *ref_shared;    /* host: the inputs of select, shared_add and select_shared */
    int32_t *ref_index, *row_pos;      /* host: a filled per-kv-head keep set's rows (compaction); the identity map */
    int32_t ref_kept;
} dp_fix;
typedef struct dp_call {
    const char *name;
    unsigned regs, written;
    int chunked;
    ei_result (*run)(dp_fix *x);
} dp_call;
#define DPB(r) (1u << (r))
static void *dp_at(const dp_fix *x, int r) { return x->arena + x->at[r]; }
static ei_tensor dp_view(const dp_fix *x, int r, int heads) { return ei_tensor_make(dp_at(x, r), EI_BF16, x->n, heads, x->D); }
static ei_result dp_profile(dp_fix *x) {
    ei_tensor q = dp_view(x, DP_Q, x->nh), k = dp_view(x, DP_K, x->nkv);
    ei_exec e = ex(1, dp_at(x, DP_WS), x->bytes[DP_WS]);
    return ei_profile(x->ctx, &e, &q, &k, &x->plan);
}
static ei_result dp_chunk(dp_fix *x) {
    ei_tensor q = dp_view(x, DP_Q, x->nh), k = dp_view(x, DP_K, x->nkv);
    ei_exec e = ex(1, dp_at(x, DP_WS), x->bytes[DP_WS]);
    return ei_profile_chunk(x->ctx, &e, &q, &k, &x->plan, 0, 1);
}
static ei_result dp_prefill(dp_fix *x) {
    ei_tensor q = dp_view(x, DP_Q, x->nh), k = dp_view(x, DP_K, x->nkv), v = dp_view(x, DP_V, x->nkv);
    ei_out_tensor o = ei_out_tensor_make(dp_at(x, DP_OUT), EI_BF16, x->n, x->nh, x->D);
    ei_exec e = ex(1, dp_at(x, DP_WS), x->bytes[DP_WS]);
    return ei_attention_prefill(x->ctx, &e, &q, &k, &v, &x->plan, &o, 0);
}
static ei_result dp_observe(dp_fix *x) {
    ei_tensor q = dp_view(x, DP_Q, x->nh);
    return ei_decode_observe(x->ctx, &x->dec, &q, x->dec.position_end, 0);
}
static ei_result dp_copy(dp_fix *x) {
    return ei_device_copy(x->ctx, dp_at(x, DP_OUT), dp_at(x, DP_Q), x->bytes[DP_Q], EI_COPY_DEVICE_TO_DEVICE);
}
/* the decode entries: the decoder observed the last W rows and the keep set laid over its regions (setup) */
static ei_result dp_keep(dp_fix *x) {
    ei_tensor k = dp_view(x, DP_K, x->nkv);
    ei_exec e = ex(1, dp_at(x, DP_DWS), x->bytes[DP_DWS]);
    return ei_decode_keep(x->ctx, &e, &x->dec, &k, &x->keep);
}
static ei_result dp_score(dp_fix *x) {
    ei_tensor k = dp_view(x, DP_K, x->nkv);
    ei_exec e = ex(1, dp_at(x, DP_DWS), x->bytes[DP_DWS]);
    return ei_decode_score(x->ctx, &e, &x->dec, &k, (const int32_t *)dp_at(x, DP_ROWPOS), 0, (float *)dp_at(x, DP_SCORES));
}
static ei_result dp_select(dp_fix *x) {
    ei_exec e = ex(1, dp_at(x, DP_DWS), x->bytes[DP_DWS]);
    return ei_decode_select(x->ctx, &e, &x->dec, (const float *)dp_at(x, DP_SCORES), x->n, &x->keep);
}
static ei_result dp_shared_add(dp_fix *x) {
    ei_exec e = ex(1, dp_at(x, DP_DWS), x->bytes[DP_DWS]);
    return ei_decode_shared_add(x->ctx, &e, &x->dec, (const float *)dp_at(x, DP_SCORES), x->n,
                                (const int32_t *)dp_at(x, DP_ROWPOS), (float *)dp_at(x, DP_SHARED));
}
static ei_result dp_select_shared(dp_fix *x) {
    ei_exec e = ex(1, dp_at(x, DP_DWS), x->bytes[DP_DWS]);
    return ei_decode_select_shared(x->ctx, &e, &x->dec, (const float *)dp_at(x, DP_SHARED), x->n, &x->keep);
}
static ei_result dp_compact(dp_fix *x) {
    ei_out_tensor k = ei_out_tensor_make(dp_at(x, DP_K), EI_BF16, x->n, x->nkv, x->D);
    ei_out_tensor v = ei_out_tensor_make(dp_at(x, DP_V), EI_BF16, x->n, x->nkv, x->D);
    return ei_kv_compact(x->ctx, &x->keep, &k, &v);
}
static ei_result dp_decode_attn(dp_fix *x) { /* the newest query against every key */
    ei_tensor q = dp_view(x, DP_Q, x->nh), k = dp_view(x, DP_K, x->nkv), v = dp_view(x, DP_V, x->nkv);
    ei_out_tensor o = ei_out_tensor_make(dp_at(x, DP_OUT), EI_BF16, 1, x->nh, x->D);
    ei_exec e = ex(1, dp_at(x, DP_WS), x->bytes[DP_WS]);
    q.data = (const unsigned char *)q.data + (size_t)(x->n - 1) * x->nh * x->D * 2;
    q.n_tokens = 1;
    return ei_attention_decode(x->ctx, &e, &q, &k, &v, NULL, &o, x->n - 1);
}
static const dp_call dp_calls[] = {
    {"ei_profile", DPB(DP_Q) | DPB(DP_K) | DPB(DP_PLAN) | DPB(DP_WS), DPB(DP_PLAN) | DPB(DP_WS), 0, dp_profile},
    {"ei_profile_chunk", DPB(DP_Q) | DPB(DP_K) | DPB(DP_PLAN) | DPB(DP_WS), DPB(DP_PLAN) | DPB(DP_WS), 1, dp_chunk},
    {"ei_attention_prefill", DPB(DP_Q) | DPB(DP_K) | DPB(DP_V) | DPB(DP_OUT) | DPB(DP_PLAN) | DPB(DP_WS),
     DPB(DP_OUT) | DPB(DP_WS), 0, dp_prefill},
    {"ei_decode_observe", DPB(DP_Q) | DPB(DP_DEC), DPB(DP_DEC), 0, dp_observe},
    {"ei_device_copy", DPB(DP_Q) | DPB(DP_OUT), DPB(DP_OUT), 0, dp_copy},
    {"ei_decode_keep", DPB(DP_K) | DPB(DP_DEC) | DPB(DP_DWS) | DPB(DP_IDX) | DPB(DP_POS),
     DPB(DP_DWS) | DPB(DP_IDX) | DPB(DP_POS), 0, dp_keep},
    {"ei_decode_score", DPB(DP_K) | DPB(DP_DEC) | DPB(DP_DWS) | DPB(DP_ROWPOS) | DPB(DP_SCORES),
     DPB(DP_DWS) | DPB(DP_SCORES), 0, dp_score},
    {"ei_decode_select", DPB(DP_SCORES) | DPB(DP_DWS) | DPB(DP_IDX) | DPB(DP_POS), DPB(DP_DWS) | DPB(DP_IDX) | DPB(DP_POS), 0,
     dp_select},
    {"ei_decode_shared_add", DPB(DP_SCORES) | DPB(DP_ROWPOS) | DPB(DP_SHARED) | DPB(DP_DWS), DPB(DP_SHARED) | DPB(DP_DWS), 0,
     dp_shared_add},
    {"ei_decode_select_shared", DPB(DP_SHARED) | DPB(DP_ROWPOS) | DPB(DP_DWS) | DPB(DP_IDX) | DPB(DP_POS),
     DPB(DP_DWS) | DPB(DP_IDX) | DPB(DP_POS), 0, dp_select_shared},
    {"ei_kv_compact", DPB(DP_IDX) | DPB(DP_K) | DPB(DP_V), DPB(DP_K) | DPB(DP_V), 0, dp_compact},
    {"ei_attention_decode", DPB(DP_Q) | DPB(DP_K) | DPB(DP_V) | DPB(DP_OUT), DPB(DP_OUT), 0, dp_decode_attn},
};
/* The call's structs laid out over the regions where they are now, and the
   views' contents uploaded: what the call finds before it runs. */
static void dp_setup(dp_fix *x, const dp_call *c) {
    size_t qb = x->bytes[DP_Q], kb = x->bytes[DP_K];
    if (c->regs & DPB(DP_PLAN)) {
        CHECK_OK(ei_plan_init(g_gpu, &x->plan, x->n, x->nkv, x->D, c->chunked ? EI_PLAN_CHUNKED : 0u, dp_at(x, DP_PLAN),
                              c->chunked ? x->pcb : x->pb));
        if (c->run == dp_prefill) { /* the profiled plan's arrays (same layout: 256-byte aligned bases) and counts */
            dev_copy_d2d(dp_at(x, DP_PLAN), x->ref_mem, x->pb);
            x->plan.n_tokens = x->ref_plan.n_tokens; x->plan.n_segments = x->ref_plan.n_segments;
            x->plan.n_blocks = x->ref_plan.n_blocks; x->plan.final = x->ref_plan.final;
        }
    }
    if ((c->regs & DPB(DP_DEC)) || c->run == dp_select || c->run == dp_shared_add || c->run == dp_select_shared) {
        /* (select, shared_add, select_shared read only the decoder's struct: its memory apart from the arena's) */
        void *mem = c->regs & DPB(DP_DEC) ? dp_at(x, DP_DEC) : x->dec_apart;
        CHECK_OK(ei_decoder_init(x->ctx, &x->dec, x->nh, x->nkv, x->D, mem, x->db));
        if (c->run != dp_observe) { /* the last W rows' queries, from their own buffer */
            ei_tensor qo = ei_tensor_make(x->q_obs, EI_BF16, x->W, x->nh, x->D);
            CHECK_OK(ei_decode_observe(x->ctx, &x->dec, &qo, x->n - x->W, 0));
        }
    }
    if (c->regs & DPB(DP_SCORES) && c->run != dp_score) dev_put(dp_at(x, DP_SCORES), x->ref_scores, x->bytes[DP_SCORES]);
    if (c->regs & DPB(DP_SHARED))
        dev_put(dp_at(x, DP_SHARED), c->run == dp_shared_add ? x->ref_scores + (size_t)x->nh * x->n : x->ref_shared,
                x->bytes[DP_SHARED]); /* (shared_add adds into zeros: the scores array's zero tail) */
    if (c->regs & DPB(DP_ROWPOS)) dev_put(dp_at(x, DP_ROWPOS), x->row_pos, x->bytes[DP_ROWPOS]);
    /* the keep set over its regions: per kv head (select_shared: one, with the map), filled for compaction */
    memset(&x->keep, 0, sizeof x->keep);
    x->keep.heads_out = c->run == dp_select_shared ? 1 : x->nkv;
    x->keep.capacity = x->C;
    x->keep.index = (int32_t *)dp_at(x, DP_IDX);
    x->keep.positions = (int32_t *)dp_at(x, DP_POS);
    if (c->run == dp_select_shared) x->keep.row_pos = (const int32_t *)dp_at(x, DP_ROWPOS);
    if (c->run == dp_compact) {
        dev_put(dp_at(x, DP_IDX), x->ref_index, x->bytes[DP_IDX]);
        x->keep.n_kept = x->ref_kept; x->keep.compressed = 1; x->keep.n_tokens = x->n;
    }
    if (c->regs & DPB(DP_Q)) dev_put(dp_at(x, DP_Q), x->q_host, qb);
    if (c->regs & DPB(DP_K)) dev_put(dp_at(x, DP_K), x->k_host, kb);
    if (c->regs & DPB(DP_V)) dev_put(dp_at(x, DP_V), x->v_host, kb);
}
/* What the call gave: the plan's arrays, out, or the decoder's ring and
   counts, read back to the host (bytes: the buffer's size; returns the
   bytes written). */
static size_t dp_result(dp_fix *x, const dp_call *c, unsigned char *buf, size_t cap) {
    size_t n = 0;
    if (c->run == dp_profile || c->run == dp_chunk) {
        size_t rows = (size_t)x->plan.n_kv_heads * (size_t)x->plan.seg_capacity;
        const void *arr[6] = {x->plan.entropy, x->plan.head_class, x->plan.budget, x->plan.keep_blocks, x->plan.keep_count,
                              x->plan.block_index};
        size_t len[6] = {rows * 4, (size_t)x->plan.n_kv_heads, rows * 4, rows * 4, rows * 4, rows * (size_t)x->plan.max_keep * 4};
        int j;
        for (j = 0; j < 6; ++j) { if (n + len[j] <= cap) dev_get(buf + n, arr[j], len[j]); n += len[j]; }
        if (n + sizeof x->plan.n_tokens <= cap) memcpy(buf + n, &x->plan.n_tokens, sizeof x->plan.n_tokens);
        n += sizeof x->plan.n_tokens;
    } else if (c->run == dp_keep || c->run == dp_select || c->run == dp_select_shared) {
        n = x->bytes[DP_IDX] + x->bytes[DP_POS];
        if (n + sizeof x->keep.n_kept <= cap) {
            dev_get(buf, dp_at(x, DP_IDX), x->bytes[DP_IDX]);
            dev_get(buf + x->bytes[DP_IDX], dp_at(x, DP_POS), x->bytes[DP_POS]);
            memcpy(buf + n, &x->keep.n_kept, sizeof x->keep.n_kept);
        }
        n += sizeof x->keep.n_kept;
    } else if (c->run == dp_score || c->run == dp_shared_add) {
        int r = c->run == dp_score ? DP_SCORES : DP_SHARED;
        n = x->bytes[r];
        if (n <= cap) dev_get(buf, dp_at(x, r), n);
    } else if (c->run == dp_compact) {
        n = x->bytes[DP_K] + x->bytes[DP_V];
        if (n <= cap) { dev_get(buf, dp_at(x, DP_K), x->bytes[DP_K]); dev_get(buf + x->bytes[DP_K], dp_at(x, DP_V), x->bytes[DP_V]); }
    } else if (c->run == dp_observe) {
        size_t ring = (size_t)x->dec.window * (size_t)x->nh * (size_t)x->D * 4;
        if (ring <= cap) dev_get(buf, x->dec.queries, ring);
        n = ring;
        if (n + sizeof x->dec.n_observed <= cap) memcpy(buf + n, &x->dec.n_observed, sizeof x->dec.n_observed);
        n += sizeof x->dec.n_observed;
    } else {
        n = c->run == dp_copy ? x->bytes[DP_Q] : x->bytes[DP_OUT];
        if (n <= cap) dev_get(buf, dp_at(x, DP_OUT), n);
    }
    return n;
}
static void device_placements(void) {
    dp_fix x;
    int ci, a, b, k, refused = 0, accepted = 0;
    size_t o = 0, awsb, pwsb, i, cap, ref_n, got_n;
    unsigned char *before, *after, *ref, *got;
    float *qf, *kf;
    memset(&x, 0, sizeof x);
    x.n = 300; x.nh = 4; x.nkv = 2; x.D = 64; x.W = 16; x.C = 64;
    {
        ei_config dc = base_config();
        dc.decode_budget = x.C; dc.window = x.W; dc.decode_gap = 4;
        x.ctx = make_ctx(&dc, EI_BACKEND_CUDA);
    }
    qf = (float *)malloc((size_t)x.n * x.nh * x.D * 4); kf = (float *)malloc((size_t)x.n * x.nkv * x.D * 4);
    gen_qk(qf, kf, x.n, x.nh, x.nkv, x.D, 2.f);
    x.q_host = host_as(qf, (size_t)x.n * x.nh * x.D, EI_BF16);
    x.k_host = host_as(kf, (size_t)x.n * x.nkv * x.D, EI_BF16);
    x.v_host = host_as(kf, (size_t)x.n * x.nkv * x.D, EI_BF16);
    {
        ei_sizes z = layer_sizes(x.ctx, x.n, x.nh, x.nkv, x.D, 0, 1);
        x.pb = z.plan;
        x.pcb = layer_sizes(x.ctx, x.n, x.nh, x.nkv, x.D, EI_PLAN_CHUNKED, 1).plan;
        pwsb = z.profile;
        awsb = z.prefill > z.decode ? z.prefill : z.decode;
        x.db = z.decoder;
        x.dwsb = z.decode_keep;
    }
    x.bytes[DP_DWS] = x.dwsb;
    x.bytes[DP_IDX] = x.bytes[DP_POS] = (size_t)x.nkv * x.C * 4;
    x.bytes[DP_SCORES] = (size_t)x.nh * x.n * 4;
    x.bytes[DP_SHARED] = x.bytes[DP_ROWPOS] = (size_t)x.n * 4;
    /* home: every region apart, each as large as any call's */
    x.bytes[DP_Q] = x.bytes[DP_OUT] = (size_t)x.n * x.nh * x.D * 2;
    x.bytes[DP_K] = x.bytes[DP_V] = (size_t)x.n * x.nkv * x.D * 2;
    x.bytes[DP_PLAN] = x.pcb > x.pb ? x.pcb : x.pb;
    x.bytes[DP_WS] = pwsb > awsb ? pwsb : awsb;
    x.bytes[DP_DEC] = x.db;
    for (a = 0; a < DP_COUNT; ++a) { x.home[a] = o; o += (x.bytes[a] + 255) & ~(size_t)255; }
    x.arena_bytes = o + 256;
    x.arena = (unsigned char *)dev_alloc(x.arena_bytes);
    cap = x.arena_bytes;
    before = (unsigned char *)malloc(cap); after = (unsigned char *)malloc(cap);
    ref = (unsigned char *)malloc(cap); got = (unsigned char *)malloc(cap);
    { /* the plan prefill reads, profiled apart */
        ei_tensor q = ei_tensor_make(x.arena + x.home[DP_Q], EI_BF16, x.n, x.nh, x.D);
        ei_tensor kk = ei_tensor_make(x.arena + x.home[DP_K], EI_BF16, x.n, x.nkv, x.D);
        x.ref_mem = dev_alloc(x.pb); x.ref_ws = dev_alloc(pwsb);
        dev_put(x.arena + x.home[DP_Q], x.q_host, x.bytes[DP_Q]);
        dev_put(x.arena + x.home[DP_K], x.k_host, x.bytes[DP_K]);
        ei_exec e = ex(1, x.ref_ws, pwsb);
        CHECK_OK(ei_plan_init(x.ctx, &x.ref_plan, x.n, x.nkv, x.D, 0, x.ref_mem, x.pb));
        CHECK_OK(ei_profile(x.ctx, &e, &q, &kk, &x.ref_plan));
    }
    { /* the decode entries' inputs, made apart: scores, shared sums, a per-kv-head keep set; the identity map */
        int64_t j;
        ei_tensor kk = ei_tensor_make(x.arena + x.home[DP_K], EI_BF16, x.n, x.nkv, x.D);
        ei_tensor qo;
        ei_keep_set ks;
        void *dws = dev_alloc(x.dwsb), *dsc = dev_alloc(x.bytes[DP_SCORES]), *dsh = dev_alloc(x.bytes[DP_SHARED]);
        void *didx = dev_alloc(x.bytes[DP_IDX]), *dpos = dev_alloc(x.bytes[DP_POS]), *dmap = dev_alloc(x.bytes[DP_ROWPOS]);
        ei_exec e = ex(1, dws, x.dwsb);
        x.q_obs = dev_alloc((size_t)x.W * x.nh * x.D * 2);
        x.dec_apart = dev_alloc(x.db);
        dev_put(x.q_obs, (const unsigned char *)x.q_host + (size_t)(x.n - x.W) * x.nh * x.D * 2, (size_t)x.W * x.nh * x.D * 2);
        x.row_pos = (int32_t *)malloc(x.bytes[DP_ROWPOS]);
        for (j = 0; j < x.n; ++j) x.row_pos[j] = (int32_t)j;
        dev_put(dmap, x.row_pos, x.bytes[DP_ROWPOS]);
        x.ref_scores = (float *)calloc((size_t)x.nh * x.n + (size_t)x.n, 4); /* (a zero tail: shared_add's start) */
        x.ref_shared = (float *)calloc((size_t)x.n, 4);
        x.ref_index = (int32_t *)malloc(x.bytes[DP_IDX]);
        dev_put(dsh, x.ref_shared, x.bytes[DP_SHARED]);
        qo = ei_tensor_make(x.q_obs, EI_BF16, x.W, x.nh, x.D);
        CHECK_OK(ei_decoder_init(x.ctx, &x.dec, x.nh, x.nkv, x.D, x.dec_apart, x.db));
        CHECK_OK(ei_decode_observe(x.ctx, &x.dec, &qo, x.n - x.W, 0));
        CHECK_OK(ei_decode_score(x.ctx, &e, &x.dec, &kk, (const int32_t *)dmap, 0, (float *)dsc));
        CHECK_OK(ei_decode_shared_add(x.ctx, &e, &x.dec, (const float *)dsc, x.n, (const int32_t *)dmap, (float *)dsh));
        dev_get(x.ref_scores, dsc, x.bytes[DP_SCORES]);
        dev_get(x.ref_shared, dsh, x.bytes[DP_SHARED]);
        memset(&ks, 0, sizeof ks);
        ks.heads_out = x.nkv; ks.capacity = x.C; ks.index = (int32_t *)didx; ks.positions = (int32_t *)dpos;
        CHECK_OK(ei_decoder_reset(&x.dec));
        CHECK_OK(ei_decode_observe(x.ctx, &x.dec, &qo, x.n - x.W, 0));
        CHECK_OK(ei_decode_keep(x.ctx, &e, &x.dec, &kk, &ks));
        CHECK(ks.n_kept == x.C && ks.compressed == 1, "decode placements: the keep set apart kept %d of %d rows",
              (int)ks.n_kept, x.C);
        x.ref_kept = ks.n_kept;
        dev_get(x.ref_index, didx, x.bytes[DP_IDX]);
        dev_free(dws); dev_free(dsc); dev_free(dsh); dev_free(didx); dev_free(dpos); dev_free(dmap);
    }
    for (ci = 0; ci < (int)(sizeof dp_calls / sizeof dp_calls[0]); ++ci) {
        const dp_call *c = &dp_calls[ci];
        ei_result r;
        /* the bytes this call uses of the plan memory and the workspace (the GPU's attention may take none) */
        x.bytes[DP_PLAN] = c->chunked ? x.pcb : x.pb;
        x.bytes[DP_WS] = c->run == dp_prefill || c->run == dp_decode_attn ? awsb : pwsb;
        x.bytes[DP_IDX] = x.bytes[DP_POS] = (size_t)(c->run == dp_select_shared ? 1 : x.nkv) * x.C * 4;
        x.bytes[DP_OUT] = (size_t)(c->run == dp_decode_attn ? 1 : x.n) * x.nh * x.D * 2;
        memcpy(x.at, x.home, sizeof x.at);
        dp_setup(&x, c);
        r = c->run(&x);
        CHECK(r == EI_OK, "%s with every region apart: %s (%s)", c->name, ei_result_name(r), ei_last_error());
        ref_n = dp_result(&x, c, ref, cap);
        for (a = 0; a < DP_COUNT; ++a)
            for (b = 0; b < DP_COUNT; ++b) {
                size_t A = x.bytes[a], B = x.bytes[b], offs[4];
                if (a == b || !(c->regs & DPB(a)) || !(c->regs & DPB(b)) || !(c->written & (DPB(a) | DPB(b))) || !A || !B)
                    continue;
                offs[0] = 0;
                offs[1] = (B / 2) & ~(size_t)255;
                offs[2] = B >= A ? (B - A) & ~(size_t)255 : 0;
                offs[3] = B > 256 ? (B - 1) & ~(size_t)255 : 0;
                for (k = 0; k < 4; ++k) {
                    ei_plan plan_before;
                    ei_decoder dec_before;
                    ei_keep_set keep_before;
                    memcpy(x.at, x.home, sizeof x.at);
                    x.at[a] = x.home[b] + offs[k];
                    if (x.at[a] + A > x.arena_bytes) continue; /* (the last region's tail: nothing to place into) */
                    dp_setup(&x, c);
                    memcpy(&plan_before, &x.plan, sizeof x.plan); memcpy(&dec_before, &x.dec, sizeof x.dec);
                    memcpy(&keep_before, &x.keep, sizeof x.keep);
                    dev_get(before, x.arena, x.arena_bytes);
                    r = c->run(&x);
                    if (r == EI_OK) { /* the placed region lies over bytes the call does not use: the reference's result */
                        got_n = dp_result(&x, c, got, cap);
                        CHECK(got_n == ref_n && ref_n <= cap && !memcmp(got, ref, ref_n),
                              "%s: %s (%zu bytes) at byte %zu of %s (%zu bytes) accepted, and the result differs", c->name,
                              dp_name[a], A, offs[k], dp_name[b], B);
                        accepted++;
                        continue;
                    }
                    dev_get(after, x.arena, x.arena_bytes);
                    for (i = 0; i < x.arena_bytes && before[i] == after[i]; ++i) {}
                    CHECK(r == EI_ERR_OVERLAP && i == x.arena_bytes && !memcmp(&plan_before, &x.plan, sizeof x.plan) &&
                              !memcmp(&dec_before, &x.dec, sizeof x.dec) &&
                              (x.keep.n_kept == keep_before.n_kept && x.keep.compressed == keep_before.compressed),
                          "%s: %s (%zu bytes) at byte %zu of %s (%zu bytes): %s (%s)%s", c->name, dp_name[a], A, offs[k],
                          dp_name[b], B, ei_result_name(r), ei_last_error(),
                          i < x.arena_bytes ? ", device bytes written" : "");
                    refused++;
                }
            }
    }
    printf("  device placements over %d entry points (workspace: %zu bytes for profiling, %zu for attention, %zu for "
           "decode keep sets): %d refused as overlapping with nothing written, %d accepted with the reference's result\n",
           (int)(sizeof dp_calls / sizeof dp_calls[0]), pwsb, awsb, x.dwsb, refused, accepted);
    CHECK(refused > 50, "only %d device placements refused", refused);
    dev_free(x.arena); dev_free(x.ref_mem); dev_free(x.ref_ws); dev_free(x.q_obs); dev_free(x.dec_apart);
    free(before); free(after); free(ref); free(got); free(x.q_host); free(x.k_host); free(x.v_host); free(qf); free(kf);
    free(x.ref_scores); free(x.ref_shared); free(x.ref_index); free(x.row_pos);
    ei_context_destroy(x.ctx);
}

/* ------------------------------------------------------------ no GPU */
static int fallback_test(void) {
    ei_config c = base_config();
    ei_context *ctx = NULL;
    ei_result r;
    c.backend = EI_BACKEND_CUDA;
    r = ei_context_create(&c, &ctx);
    printf("  EI_BACKEND_CUDA here: %s: %s\n", ei_result_name(r), ei_last_error());
    CHECK(r == EI_ERR_BACKEND && ctx == NULL, "expected EI_ERR_BACKEND, got %s", ei_result_name(r));
    CHECK(strstr(ei_last_error(), "CUDA") != NULL, "message does not name CUDA: %s", ei_last_error());
    c.cuda_library = "/nonexistent/libentropyinfer_cuda.so";
    r = ei_context_create(&c, &ctx);
    printf("  explicit missing library: %s: %s\n", ei_result_name(r), ei_last_error());
    CHECK(r == EI_ERR_BACKEND && strstr(ei_last_error(), "/nonexistent/") != NULL, "explicit path not reported");
    c.backend = EI_BACKEND_CUDA_OR_CPU; /* the CPU instead, and the context says so */
    r = ei_context_create(&c, &ctx);
    CHECK(r == EI_OK && ctx && ei_context_config(ctx)->backend == EI_BACKEND_CPU &&
              ei_context_config(ctx)->simd != EI_SIMD_AUTO,
          "EI_BACKEND_CUDA_OR_CPU without the plugin: %s, backend %d", ei_result_name(r),
          ctx ? (int)ei_context_config(ctx)->backend : -1);
    if (ctx) printf("  EI_BACKEND_CUDA_OR_CPU: the CPU (%s)\n", ei_simd_name(ei_context_config(ctx)->simd));
    ei_context_destroy(ctx);
    ctx = NULL;
    /* the CPU keeps working */
    c.backend = EI_BACKEND_CPU;
    c.cuda_library = NULL;
    c.segment_size = 64; c.base_budget = 64;
    {
        int64_t n = 300;
        int nh = 4, nkv = 2, D = 32;
        float *q = (float *)malloc((size_t)n * nh * D * 4), *k = (float *)malloc((size_t)n * nkv * D * 4);
        ei_tensor tq = ei_tensor_make(q, EI_F32, n, nh, D), tk = ei_tensor_make(k, EI_F32, n, nkv, D);
        ei_plan plan;
        size_t wsb;
        void *ws;
        ei_exec x;
        CHECK_OK(ei_context_create(&c, &ctx));
        gen_qk(q, k, n, nh, nkv, D, 0.f);
        CHECK_OK(ei_plan_init(ctx, &plan, n, nkv, D, 0, NULL, 0));
        wsb = layer_sizes(ctx, n, nh, nkv, D, 0, 1).profile;
        ws = malloc(wsb);
        x = ex(1, ws, wsb);
        r = ei_profile(ctx, &x, &tq, &tk, &plan);
        CHECK(r == EI_OK && plan.n_segments == 5, "CPU profile after a failed CUDA context: %s", ei_result_name(r));
        printf("  CPU context after the failure: profile %s, %d segments\n", ei_result_name(r), plan.n_segments);
        free(ws);
        ei_plan_free(ctx, &plan);
        ei_context_destroy(ctx);
        free(q); free(k);
    }
    return failures;
}

int main(int argc, char **argv) {
    const char *dir = "../shared/golden";
    int quick = 0, i;
    ei_config c = base_config();
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fallback")) {
            printf("test_cuda --fallback\n");
            fallback_test();
            printf("%s: %d checks, %d failed\n", failures ? "FAILED" : "PASSED", checks, failures);
            return failures ? 1 : 0;
        }
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else dir = argv[i];
    }
    g_gpu = make_ctx(&c, EI_BACKEND_CUDA);
    g_cpu = make_ctx(&c, EI_BACKEND_CPU);
    {
        char msg[EI_CUDA_MSG_SIZE] = {0};
        const ei_cuda_api *api = g_gpu->cuda->api;
        api->device_check(msg);
        printf("test_cuda: %s; %s\n", api->build_info(), msg);
    }
    {   /* every case folder of dir, by name; kind from its meta.txt */
        struct dirent **list = NULL;
        int nlist = scandir(dir, &list, NULL, alphasort), j, np = 0, nd = 0, pass;
        char path[1024];
        CHECK(nlist >= 0, "golden: cannot read the folder %s (%s): give a folder of golden cases", dir, strerror(errno));
        for (pass = 0; pass < 2; pass++) {
            printf(pass ? "golden decode (%s):\n" : "golden prefill (%s):\n", dir);
            for (j = 0; j < nlist; j++) {
                meta m;
                const char *kind;
                if (list[j]->d_name[0] == '.') continue;
                snprintf(path, sizeof path, "%s/%s", dir, list[j]->d_name);
                if (!meta_read(path, &m)) continue;
                kind = meta_s(&m, "kind");
                if (pass == 0 && !strcmp(kind, "prefill") && (!quick || np < 3)) {
                    golden_prefill(path, list[j]->d_name, EI_BF16);
                    if (!quick) golden_prefill(path, list[j]->d_name, EI_F32);
                    np++;
                }
                if (pass == 1 && !strcmp(kind, "decode") && (!quick || nd < 2)) {
                    golden_decode(path, list[j]->d_name);
                    nd++;
                }
            }
        }
        CHECK(nlist < 0 || np + nd > 0, "golden: %s holds no case (a folder with a meta.txt of kind prefill or decode)", dir);
        for (j = 0; j < nlist; j++) free(list[j]);
        free(list);
    }
    printf("decode policies and ratio budgets, GPU vs CPU:\n");
    decode_policies_gpu(quick, 32, 8, 256);
    decode_policies_gpu(1, 128, 128, 512);
    printf("attention vs f64-accumulated reference (bf16/f16 inputs):\n");
    attention_tests(quick);
    printf("f32 queries over bf16/f16 k, v (GPU vs CPU):\n");
    f32q_tests(quick);
    printf("chunked planning, GPU vs CPU (the same schedule of ei_profile_chunk calls):\n");
    chunked_plans(quick);
    printf("errors:\n");
    error_tests();
    chunked_errors(0);
    chunked_errors(1);
    printf("ei_exec on the GPU (threads unused, parts made by part 0):\n");
    gpu_exec_tests();
    printf("device placements (MEMORY ARGUMENTS on device pointers):\n");
    device_placements();
    ei_context_destroy(g_gpu);
    ei_context_destroy(g_cpu);
    printf("%s: %d checks, %d failed\n", failures ? "FAILED" : "PASSED", checks, failures);
    return failures ? 1 : 0;
}
