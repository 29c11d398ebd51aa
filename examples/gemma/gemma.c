/* gemma.c - model loading, threads, kernels and the Gemma 3 forward pass.
   See gemma.h for the overview. */
#define _POSIX_C_SOURCE 200809L
#include "gemma.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


double gm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ================================================================ threads */
struct gm_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    gm_task fn;
    void *arg;
    long gen;
    int pending, quit;
    struct worker_arg *wargs;
};
typedef struct worker_arg { gm_pool *p; int ith; } worker_arg;

static void *worker_main(void *a) {
    worker_arg *wa = (worker_arg *)a;
    gm_pool *p = wa->p;
    long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        gm_task fn;
        void *arg;
        while (p->gen == seen && !p->quit) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        fn = p->fn;
        arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, wa->ith, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int gm_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    const char *e = getenv("GEMMA_THREADS");
    if (e && atoi(e) > 0) n = atoi(e);
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    return (int)n;
}

gm_pool *gm_pool_create(int n_threads) {
    gm_pool *p = (gm_pool *)calloc(1, sizeof(gm_pool));
    int i;
    if (!p) return NULL;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 64) n_threads = 64;
    p->n = n_threads;
    p->th = (pthread_t *)calloc((size_t)n_threads, sizeof(pthread_t));
    p->wargs = (worker_arg *)calloc((size_t)n_threads, sizeof(worker_arg));
    if (!p->th || !p->wargs) { free(p->th); free(p->wargs); free(p); return NULL; }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    for (i = 1; i < n_threads; i++) {
        worker_arg *wa = &p->wargs[i];
        wa->p = p;
        wa->ith = i;
        pthread_create(&p->th[i], NULL, worker_main, wa);
    }
    return p;
}

void gm_pool_run(gm_pool *p, gm_task fn, void *arg) {
    if (p->n == 1) { fn(arg, 0, 1); return; }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

int gm_pool_size(const gm_pool *p) { return p->n; }

void gm_pool_destroy(gm_pool *p) {
    int i;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p->th);
    free(p->wargs);
    free(p);
}

/* ================================================================ matmul
   Y[t][o] = sum_k X[t][k] * W[o][k].
   Weights are stored "packed" at load: panels of GM_PANEL output rows,
   each panel laid out [in][GM_PANEL], so the kernel reads one contiguous
   80 KB panel and broadcasts each X value against GM_PANEL outputs held in
   vector registers (no horizontal sums). Written with GCC/Clang vector
   extensions; an AVX-512 variant is picked at run time when the CPU has it
   (the file itself is built for AVX2+FMA or plain x86-64). */
#define GM_PANEL 32

#define GM_DEFINE_MATMUL(NAME, ATTR, VW, TT)                                                           \
    typedef float NAME##_v __attribute__((vector_size(VW * 4)));                                      \
    enum { NAME##_NV = GM_PANEL / VW };                                                               \
    ATTR static NAME##_v NAME##_ld(const float *p) { NAME##_v v; memcpy(&v, p, sizeof v); return v; } \
    ATTR static void NAME##_st(float *p, NAME##_v v) { memcpy(p, &v, sizeof v); }                     \
    /* panels [p0, p1) of WP for all n rows of X */                                                   \
    ATTR static void NAME(const float *X, int64_t ldx, int n, int in, const float *WP, int64_t pstr,   \
                          int64_t kstr, int p0, int p1, float *Y, int64_t ldy) {                      \
        int p, t, k, a, b;                                                                             \
        for (p = p0; p < p1; p++) {                                                                    \
            const float *panel = WP + (int64_t)p * pstr;                                               \
            for (t = 0; t + TT <= n; t += TT) {                                                        \
                NAME##_v acc[TT][NAME##_NV];                                                           \
                const float *xr = X + (int64_t)t * ldx;                                                \
                _Pragma("GCC unroll 16") for (a = 0; a < TT; a++)                                      \
                _Pragma("GCC unroll 16") for (b = 0; b < NAME##_NV; b++) acc[a][b] = (NAME##_v){0};    \
                for (k = 0; k < in; k++) {                                                             \
                    NAME##_v w[NAME##_NV];                                                             \
                    _Pragma("GCC unroll 16") for (b = 0; b < NAME##_NV; b++)                           \
                        w[b] = NAME##_ld(panel + (int64_t)k * kstr + b * VW);                          \
                    _Pragma("GCC unroll 16") for (a = 0; a < TT; a++) {                                \
                        float xv = xr[a * ldx + k];                                                    \
                        _Pragma("GCC unroll 16") for (b = 0; b < NAME##_NV; b++) acc[a][b] += xv * w[b]; \
                    }                                                                                  \
                }                                                                                      \
                _Pragma("GCC unroll 16") for (a = 0; a < TT; a++)                                      \
                _Pragma("GCC unroll 16") for (b = 0; b < NAME##_NV; b++)                               \
                    NAME##_st(Y + (int64_t)(t + a) * ldy + (int64_t)p * GM_PANEL + b * VW, acc[a][b]);  \
            }                                                                                          \
            for (; t < n; t++) { /* leftover rows, one at a time */                                    \
                NAME##_v acc[NAME##_NV];                                                               \
                const float *xr = X + (int64_t)t * ldx;                                                \
                _Pragma("GCC unroll 16") for (b = 0; b < NAME##_NV; b++) acc[b] = (NAME##_v){0};        \
                for (k = 0; k < in; k++) {                                                             \
                    float xv = xr[k];                                                                  \
                    _Pragma("GCC unroll 16") for (b = 0; b < NAME##_NV; b++)                           \
                        acc[b] += xv * NAME##_ld(panel + (int64_t)k * kstr + b * VW);                  \
                }                                                                                      \
                _Pragma("GCC unroll 16") for (b = 0; b < NAME##_NV; b++)                               \
                    NAME##_st(Y + (int64_t)t * ldy + (int64_t)p * GM_PANEL + b * VW, acc[b]);           \
            }                                                                                          \
        }                                                                                              \
    }

#if defined(__AVX__)
GM_DEFINE_MATMUL(mm_v8, , 8, 3)  /* 12 accumulators of 8 floats */
#else
GM_DEFINE_MATMUL(mm_v8, , 4, 1)  /* portable build: 16-byte vectors (SSE, NEON) */
#endif
#if (defined(__x86_64__) || defined(__i386__)) && !defined(GEMMA_NO_AVX512)
#define GM_HAVE_AVX512_PATH 1
GM_DEFINE_MATMUL(mm_v16, __attribute__((target("avx512f,fma"))), 16, 8)
#endif

static int g_use_avx512 = -1;
/* Panel p of WP starts at WP + p*pstr; its row k (GM_PANEL floats) at + k*kstr.
   Packed weights: pstr = in*GM_PANEL, kstr = GM_PANEL. A row-major matrix
   [in][cols] used as-is (attention values): pstr = GM_PANEL, kstr = cols. */
static void mm_dispatch(const float *X, int64_t ldx, int n, int in, const float *WP, int64_t pstr, int64_t kstr,
                        int p0, int p1, float *Y, int64_t ldy) {
    if (g_use_avx512 < 0) {
        g_use_avx512 = 0;
#ifdef GM_HAVE_AVX512_PATH
        __builtin_cpu_init();
        g_use_avx512 = __builtin_cpu_supports("avx512f") && !getenv("GEMMA_NO_AVX512");
#endif
    }
#ifdef GM_HAVE_AVX512_PATH
    if (g_use_avx512) { mm_v16(X, ldx, n, in, WP, pstr, kstr, p0, p1, Y, ldy); return; }
#endif
    mm_v8(X, ldx, n, in, WP, pstr, kstr, p0, p1, Y, ldy);
}

/* Pack W [out][in] (row-major, out % GM_PANEL == 0) into panels. */
static void pack_panels(const float *W, int out, int in, float *WP) {
    int p, k, c;
    for (p = 0; p < out / GM_PANEL; p++)
        for (k = 0; k < in; k++)
            for (c = 0; c < GM_PANEL; c++)
                WP[((int64_t)p * in + k) * GM_PANEL + c] = W[((int64_t)p * GM_PANEL + c) * in + k];
}

/* Up to 3 matmuls sharing the same input, split by panels over threads. */
typedef struct mm_job {
    const float *X;
    int64_t ldx;
    int n, in, nw;
    const float *W[3];
    int out[3];
    float *Y[3];
    int64_t ldy[3];
} mm_job;

static void mm_task(void *arg, int ith, int nth) {
    const mm_job *j = (const mm_job *)arg;
    int total = 0, i, begin, end, acc = 0;
    for (i = 0; i < j->nw; i++) total += j->out[i] / GM_PANEL;
    begin = (int)((int64_t)total * ith / nth);
    end = (int)((int64_t)total * (ith + 1) / nth);
    for (i = 0; i < j->nw; i++) {
        int np = j->out[i] / GM_PANEL, lo = begin - acc, hi = end - acc;
        if (lo < 0) lo = 0;
        if (hi > np) hi = np;
        if (lo < hi)
            mm_dispatch(j->X, j->ldx, j->n, j->in, j->W[i], (int64_t)j->in * GM_PANEL, GM_PANEL, lo, hi, j->Y[i],
                        j->ldy[i] ? j->ldy[i] : j->out[i]);
        acc += np;
    }
}

static void matmul(gm_pool *p, const float *X, int n, int in, const float *W, int out, float *Y) {
    mm_job j;
    memset(&j, 0, sizeof j);
    j.X = X; j.ldx = in; j.n = n; j.in = in; j.nw = 1;
    j.W[0] = W; j.out[0] = out; j.Y[0] = Y;
    gm_pool_run(p, mm_task, &j);
}

/* ================================================================ small kernels */
static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    float sc;
    int i;
    for (i = 0; i < n; i++) ss += (double)x[i] * x[i];
    sc = (float)(1.0 / sqrt(ss / n + eps));
    for (i = 0; i < n; i++) y[i] = x[i] * sc * w[i];
}

/* round to the nearest bfloat16 (ties to even), kept in f32 storage */
static void round_bf16(float *x, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        memcpy(&x[i], &u, 4);
    }
}

static float gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

/* NEOX-style rotary embedding (pairs i and i + d/2), Gemma's layout. */
static void rope(float *x, int d, const float *cs, const float *sn) {
    int i, h = d / 2;
    for (i = 0; i < h; i++) {
        float a = x[i], b = x[i + h];
        x[i] = a * cs[i] - b * sn[i];
        x[i + h] = a * sn[i] + b * cs[i];
    }
}

/* ================================================================ model loading */
static const gguf_tensor *need_tensor(const gguf_file *f, const char *name, int64_t ne0, int64_t ne1,
                                      char *err, size_t errlen) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) { gguf_fail(err, errlen, "model: tensor '%s' missing", name); return NULL; }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
        gguf_fail(err, errlen, "model: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
             (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], (long long)ne0, (long long)ne1);
        return NULL;
    }
    if (!gguf_can_dequantize(t->type)) {
        gguf_fail(err, errlen, "model: tensor '%s' has type %s, which this engine cannot dequantize", name, gguf_type_name(t->type));
        return NULL;
    }
    return t;
}

static int get_hp_int(const gguf_file *f, const char *key, int64_t lo, int64_t hi, int required, int64_t def, int *out,
                      char *err, size_t errlen) {
    int64_t v;
    if (gguf_get_int(f, key, &v) != 0) {
        if (required) return gguf_fail(err, errlen, "model: metadata '%s' missing", key);
        v = def;
    }
    if (v < lo || v > hi) return gguf_fail(err, errlen, "model: metadata '%s' = %lld out of range [%lld, %lld]", key, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

/* Dequantize a tensor; matrices are packed into GM_PANEL panels on the way
   (one panel of rows at a time through a small buffer). Threads take
   every nth panel of every tensor. */
typedef struct load_item { const gguf_tensor *t; float *dst; int packed; } load_item;
typedef struct load_job { load_item *items; int n; int bad; float *tmp; size_t tmp_per_thread; } load_job;
static void load_task(void *arg, int ith, int nth) {
    load_job *j = (load_job *)arg;
    float *tmp = j->tmp + j->tmp_per_thread * (size_t)ith;
    int i;
    for (i = 0; i < j->n; i++) {
        const gguf_tensor *t = j->items[i].t;
        int be, bb;
        int64_t in = t->ne[0], out = t->n_elems / t->ne[0], p;
        size_t row_bytes;
        gguf_type_info(t->type, &be, &bb);
        row_bytes = (size_t)(in / be) * (size_t)bb;
        if (!j->items[i].packed) {
            if (ith == 0 && gguf_dequantize(t->type, t->data, j->items[i].dst, t->n_elems)) j->bad = 1;
            continue;
        }
        for (p = ith; p < out / GM_PANEL; p += nth) {
            const uint8_t *src = (const uint8_t *)t->data + (size_t)p * GM_PANEL * row_bytes;
            if (gguf_dequantize(t->type, src, tmp, in * GM_PANEL)) { j->bad = 1; return; }
            pack_panels(tmp, GM_PANEL, (int)in, j->items[i].dst + (size_t)p * GM_PANEL * (size_t)in);
        }
    }
}

int gm_model_load(gm_model *m, const char *path, char *err, size_t errlen) {
    gm_hparams *hp = &m->hp;
    gguf_file *f = &m->file;
    gguf_str arch;
    double dv;
    int l, ni = 0, i;
    size_t total = 0;
    load_item *items = NULL;
    char name[96];
    memset(m, 0, sizeof(*m));
    if (gguf_open(path, f, err, errlen)) return -1;
    if (gguf_get_str(f, "general.architecture", &arch) || !gguf_str_eq(arch, "gemma3")) {
        gguf_fail(err, errlen, "model: general.architecture is not \"gemma3\"");
        goto bad;
    }
    if (get_hp_int(f, "gemma3.block_count", 1, 512, 1, 0, &hp->n_layer, err, errlen) ||
        get_hp_int(f, "gemma3.embedding_length", 8, 65536, 1, 0, &hp->d_model, err, errlen) ||
        get_hp_int(f, "gemma3.attention.head_count", 1, 1024, 1, 0, &hp->n_head, err, errlen) ||
        get_hp_int(f, "gemma3.attention.head_count_kv", 1, 1024, 0, hp->n_head, &hp->n_kv_head, err, errlen) ||
        get_hp_int(f, "gemma3.feed_forward_length", 8, 1 << 20, 1, 0, &hp->d_ff, err, errlen) ||
        get_hp_int(f, "gemma3.context_length", 1, 1 << 24, 0, 8192, &hp->n_ctx, err, errlen) ||
        get_hp_int(f, "gemma3.attention.sliding_window", 1, 1 << 24, 0, 512, &hp->sliding_window, err, errlen) ||
        get_hp_int(f, "gemma3.attention.sliding_window_pattern", 1, 512, 0, 6, &hp->swa_pattern, err, errlen))
        goto bad;
    if (get_hp_int(f, "gemma3.attention.key_length", 8, 4096, 0, hp->d_model / hp->n_head, &hp->head_dim, err, errlen)) goto bad;
    {
        int vl = 0;
        if (get_hp_int(f, "gemma3.attention.value_length", 8, 4096, 0, hp->head_dim, &vl, err, errlen)) goto bad;
        if (vl != hp->head_dim) { gguf_fail(err, errlen, "model: key_length %d != value_length %d", hp->head_dim, vl); goto bad; }
    }
    if (hp->n_head % hp->n_kv_head || hp->head_dim % 2) { gguf_fail(err, errlen, "model: bad head counts"); goto bad; }
    hp->eps = gguf_get_float(f, "gemma3.attention.layer_norm_rms_epsilon", &dv) == 0 ? (float)dv : 1e-6f;
    hp->rope_base_global = gguf_get_float(f, "gemma3.rope.freq_base", &dv) == 0 ? (float)dv : 1e6f;
    /* Gemma 3 local layers: rope base 10k (llama.cpp hard-codes it; newer files may carry it) */
    hp->rope_base_local = gguf_get_float(f, "gemma3.rope.freq_base_swa", &dv) == 0 ? (float)dv : 1e4f;
    /* query_pre_attn_scalar = head_dim for the 270M/1B/4B/12B models */
    hp->attn_scale = gguf_get_float(f, "gemma3.attention.scale", &dv) == 0 ? (float)dv : 1.0f / sqrtf((float)hp->head_dim);
    hp->final_softcap = gguf_get_float(f, "gemma3.final_logit_softcapping", &dv) == 0 ? (float)dv : 0.0f;
    hp->embed_scale = sqrtf((float)hp->d_model);

    if (gm_tokenizer_init(&m->tok, f, err, errlen)) goto bad;
    hp->n_vocab = m->tok.n_vocab;

    /* shapes, then one arena for every dequantized tensor */
    m->layers = (gm_layer *)calloc((size_t)hp->n_layer, sizeof(gm_layer));
    items = (load_item *)calloc((size_t)hp->n_layer * 13 + 2, sizeof(load_item));
    if (!m->layers || !items) { gguf_fail(err, errlen, "model: out of memory"); goto bad; }
    {
        const int D = hp->d_model, Q = hp->n_head * hp->head_dim, K = hp->n_kv_head * hp->head_dim, F = hp->d_ff, H = hp->head_dim;
        struct { const char *fmt; int64_t ne0, ne1; } spec[13];
        spec[0].fmt = "blk.%d.attn_norm.weight"; spec[0].ne0 = D; spec[0].ne1 = 1;
        spec[1].fmt = "blk.%d.attn_q.weight"; spec[1].ne0 = D; spec[1].ne1 = Q;
        spec[2].fmt = "blk.%d.attn_k.weight"; spec[2].ne0 = D; spec[2].ne1 = K;
        spec[3].fmt = "blk.%d.attn_v.weight"; spec[3].ne0 = D; spec[3].ne1 = K;
        spec[4].fmt = "blk.%d.attn_q_norm.weight"; spec[4].ne0 = H; spec[4].ne1 = 1;
        spec[5].fmt = "blk.%d.attn_k_norm.weight"; spec[5].ne0 = H; spec[5].ne1 = 1;
        spec[6].fmt = "blk.%d.attn_output.weight"; spec[6].ne0 = Q; spec[6].ne1 = D;
        spec[7].fmt = "blk.%d.post_attention_norm.weight"; spec[7].ne0 = D; spec[7].ne1 = 1;
        spec[8].fmt = "blk.%d.ffn_norm.weight"; spec[8].ne0 = D; spec[8].ne1 = 1;
        spec[9].fmt = "blk.%d.ffn_gate.weight"; spec[9].ne0 = D; spec[9].ne1 = F;
        spec[10].fmt = "blk.%d.ffn_up.weight"; spec[10].ne0 = D; spec[10].ne1 = F;
        spec[11].fmt = "blk.%d.ffn_down.weight"; spec[11].ne0 = F; spec[11].ne1 = D;
        spec[12].fmt = "blk.%d.post_ffw_norm.weight"; spec[12].ne0 = D; spec[12].ne1 = 1;
        if (!(items[ni++].t = need_tensor(f, "token_embd.weight", D, hp->n_vocab, err, errlen))) goto bad;
        if (!(items[ni++].t = need_tensor(f, "output_norm.weight", D, 1, err, errlen))) goto bad;
        for (l = 0; l < hp->n_layer; l++)
            for (i = 0; i < 13; i++) {
                snprintf(name, sizeof name, spec[i].fmt, l);
                if (!(items[ni++].t = need_tensor(f, name, spec[i].ne0, spec[i].ne1, err, errlen))) goto bad;
            }
        if (gguf_find_tensor(f, "output.weight")) {
            gguf_fail(err, errlen, "model: separate output.weight is not supported (Gemma 3 ties embeddings)");
            goto bad;
        }
    }
    for (i = 0; i < ni; i++) {
        const gguf_tensor *t = items[i].t;
        items[i].packed = t->ne[1] > 1;
        if (items[i].packed && ((t->ne[1] % GM_PANEL) || t->ne[0] > (1 << 20))) {
            gguf_fail(err, errlen, "model: tensor '%.*s' has %lld rows, not a multiple of %d", (int)t->name.n, t->name.p,
                 (long long)t->ne[1], GM_PANEL);
            goto bad;
        }
        total += (size_t)((t->n_elems + 15) & ~(int64_t)15);
    }
    if (hp->head_dim % GM_PANEL) { gguf_fail(err, errlen, "model: head_dim %d not a multiple of %d", hp->head_dim, GM_PANEL); goto bad; }
    m->arena = (float *)malloc(total * sizeof(float));
    if (!m->arena) { gguf_fail(err, errlen, "model: cannot allocate %zu MB for weights", total * 4 >> 20); goto bad; }
    m->arena_floats = total;
    {
        size_t off = 0;
        for (i = 0; i < ni; i++) {
            items[i].dst = m->arena + off;
            off += (size_t)((items[i].t->n_elems + 15) & ~(int64_t)15);
        }
    }
    {
        load_job j;
        gm_pool *p = gm_pool_create(gm_default_threads());
        int64_t maxin = 0;
        for (i = 0; i < ni; i++) if (items[i].t->ne[0] > maxin) maxin = items[i].t->ne[0];
        j.items = items; j.n = ni; j.bad = 0;
        j.tmp_per_thread = (size_t)maxin * GM_PANEL;
        j.tmp = (float *)malloc(j.tmp_per_thread * (size_t)gm_pool_size(p) * sizeof(float));
        if (!j.tmp) { gm_pool_destroy(p); gguf_fail(err, errlen, "model: out of memory"); goto bad; }
        gm_pool_run(p, load_task, &j);
        gm_pool_destroy(p);
        free(j.tmp);
        if (j.bad) { gguf_fail(err, errlen, "model: dequantization failed"); goto bad; }
    }
    m->out_proj = items[0].dst;
    m->embd = items[0].t;
    m->out_norm = items[1].dst;
    for (l = 0; l < hp->n_layer; l++) {
        gm_layer *L = &m->layers[l];
        load_item *it = items + 2 + 13 * l;
        L->attn_norm = it[0].dst; L->wq = it[1].dst; L->wk = it[2].dst; L->wv = it[3].dst;
        L->q_norm = it[4].dst; L->k_norm = it[5].dst; L->wo = it[6].dst; L->post_attn_norm = it[7].dst;
        L->ffn_norm = it[8].dst; L->w_gate = it[9].dst; L->w_up = it[10].dst; L->w_down = it[11].dst;
        L->post_ffn_norm = it[12].dst;
        /* llama.cpp's convention: layer il uses the sliding window unless il % pattern == pattern - 1 */
        L->is_global = (l % hp->swa_pattern) == hp->swa_pattern - 1;
        L->rope_base = L->is_global ? hp->rope_base_global : hp->rope_base_local;
    }
    free(items);
    return 0;
bad:
    free(items);
    gm_model_free(m);
    return -1;
}

void gm_model_free(gm_model *m) {
    free(m->arena);
    free(m->layers);
    gm_tokenizer_free(&m->tok);
    gguf_close(&m->file);
    memset(m, 0, sizeof(*m));
}

/* ================================================================ attention (own, dense)
   Causal attention of n queries (cache rows q0.., absolute positions p0..)
   against cache rows 0..q0+i, optionally restricted to a sliding window
   (local layers: rows == positions). Work is tiled by GM_PANEL query rows
   (tokens x query heads of one kv group) and both products run on the
   matmul kernel:  S^T = K . Qtile^T  (Qtile packed as one panel), softmax
   per query row, then O = P . V (V's rows used in place as panels). */
typedef struct attn_job {
    const gm_state *s;
    const float *q;        /* [n][n_head][hd] */
    const float *kc, *vc;  /* cache [rows][n_kv][hd] */
    float *out;            /* [n][n_head][hd] */
    int n;
    int64_t q0;            /* cache row of the first query */
    int window;            /* 0: none */
    float scale;
    float *scratch;        /* per thread */
    size_t scratch_per_thread;
} attn_job;

static size_t attn_scratch_floats(int64_t max_keys, int head_dim) {
    /* QP [hd][P] + ST [keys][P] + P [P][keys] + O [P][hd] */
    return (size_t)head_dim * GM_PANEL * 2 + (size_t)(max_keys + 16) * GM_PANEL * 2;
}

static void attn_task(void *arg, int ith, int nth) {
    const attn_job *j = (const attn_job *)arg;
    const gm_hparams *hp = &j->s->m->hp;
    const int H = hp->n_head, G = hp->n_kv_head, D = hp->head_dim, R = H / G;
    const int TQ = GM_PANEL / R > 0 ? GM_PANEL / R : 1; /* tokens per tile */
    const int64_t ldk = (int64_t)G * D;
    const int64_t max_keys = j->s->max_ctx + TQ;
    float *QP = j->scratch + j->scratch_per_thread * (size_t)ith;
    float *O = QP + (size_t)D * GM_PANEL;
    float *ST = O + (size_t)D * GM_PANEL;
    float *P = ST + (size_t)(max_keys + 16) * GM_PANEL;
    int ntiles = (j->n + TQ - 1) / TQ, tile;
    /* interleave tiles and kv groups over threads (later tiles are longer) */
    for (tile = ith; tile < ntiles * G; tile += nth) {
        int g = tile % G, t0 = (tile / G) * TQ, tn = j->n - t0 < TQ ? j->n - t0 : TQ, rows = tn * R, c, d;
        int64_t last = j->q0 + t0 + tn - 1, first = 0, nk, kk;
        if (R > GM_PANEL) return; /* groups wider than a panel: not needed for Gemma */
        if (j->window > 0) {
            first = j->q0 + t0 - j->window + 1;
            if (first < 0) first = 0;
        }
        nk = last - first + 1;
        /* pack the tile's query rows (token a, head r -> column a*R + r) */
        memset(QP, 0, (size_t)D * GM_PANEL * sizeof(float));
        for (c = 0; c < rows; c++) {
            const float *qr = j->q + ((int64_t)(t0 + c / R) * H + g * R + c % R) * D;
            for (d = 0; d < D; d++) QP[(size_t)d * GM_PANEL + c] = qr[d];
        }
        mm_dispatch(j->kc + first * ldk + (int64_t)g * D, ldk, (int)nk, D, QP, 0, GM_PANEL, 0, 1, ST, GM_PANEL);
        /* masked softmax per query row -> P [rows][nk] */
        for (c = 0; c < rows; c++) {
            int64_t qrow = j->q0 + t0 + c / R, lo = first, hi = qrow;
            float mx = -INFINITY, *pr = P + (size_t)c * (size_t)nk;
            double sum = 0;
            if (j->window > 0 && qrow - j->window + 1 > lo) lo = qrow - j->window + 1;
            for (kk = lo; kk <= hi; kk++) {
                float v = ST[(size_t)(kk - first) * GM_PANEL + c] * j->scale;
                if (v > mx) mx = v;
            }
            for (kk = first; kk <= last; kk++) {
                float e = 0.0f;
                if (kk >= lo && kk <= hi) e = expf(ST[(size_t)(kk - first) * GM_PANEL + c] * j->scale - mx);
                pr[kk - first] = e;
                sum += e;
            }
            for (kk = 0; kk < nk; kk++) pr[kk] = (float)(pr[kk] / sum);
        }
        mm_dispatch(P, nk, rows, (int)nk, j->vc + first * ldk + (int64_t)g * D, GM_PANEL, ldk, 0, D / GM_PANEL, O, D);
        for (c = 0; c < rows; c++)
            memcpy(j->out + ((int64_t)(t0 + c / R) * H + g * R + c % R) * D, O + (size_t)c * D, (size_t)D * sizeof(float));
    }
}

/* ================================================================ state */
uint32_t gm_plan_extra_flags = 0;
int gm_ei_shared_env(void) { return getenv("GEMMA_EI_SHARED") && atoi(getenv("GEMMA_EI_SHARED")) != 0; }

int gm_state_init(gm_state *s, const gm_model *m, gm_pool *pool, int64_t max_ctx, int max_batch,
                  gm_attn_mode mode, const void *ei_cfg, char *err, size_t errlen) {
    const gm_hparams *hp = &m->hp;
    const int H = hp->n_head, D = hp->head_dim, KV = hp->n_kv_head * hp->head_dim;
    int l, nth = gm_pool_size(pool), i;
    int64_t p;
    memset(s, 0, sizeof(*s));
    s->m = m;
    s->pool = pool;
    s->max_ctx = max_ctx;
    s->max_batch = max_batch;
    s->mode = mode;
    (void)ei_cfg;
#ifndef GEMMA_WITH_EI
    if (mode != GM_ATTN_DENSE_OWN) return gguf_fail(err, errlen, "state: built without entropyinfer (GEMMA_WITH_EI)");
#endif
    if (max_ctx < 1 || max_batch < 1 || max_batch > max_ctx) {
        gguf_fail(err, errlen, "state: bad sizes (max_ctx %lld, max_batch %d)", (long long)max_ctx, max_batch);
        goto bad;
    }
    s->k_cache = (float **)calloc((size_t)hp->n_layer, sizeof(float *));
    s->v_cache = (float **)calloc((size_t)hp->n_layer, sizeof(float *));
    s->cache_len = (int64_t *)calloc((size_t)hp->n_layer, sizeof(int64_t));
    if (!s->k_cache || !s->v_cache || !s->cache_len) goto oom;
    for (l = 0; l < hp->n_layer; l++) {
        s->k_cache[l] = (float *)malloc((size_t)max_ctx * KV * sizeof(float));
        s->v_cache[l] = (float *)malloc((size_t)max_ctx * KV * sizeof(float));
        if (!s->k_cache[l] || !s->v_cache[l]) goto oom;
    }
#define ALLOC(ptr, count) if (!((ptr) = (float *)malloc((size_t)(count) * sizeof(float)))) goto oom
    ALLOC(s->x, (size_t)max_batch * hp->d_model);
    ALLOC(s->xn, (size_t)max_batch * hp->d_model);
    ALLOC(s->q, (size_t)max_batch * H * D);
    ALLOC(s->k, (size_t)max_batch * KV);
    ALLOC(s->v, (size_t)max_batch * KV);
    ALLOC(s->ao, (size_t)max_batch * H * D);
    ALLOC(s->gate, (size_t)max_batch * hp->d_ff);
    ALLOC(s->up, (size_t)max_batch * hp->d_ff);
    ALLOC(s->tmp, (size_t)max_batch * hp->d_model);
    /* attention scratch per thread */
    ALLOC(s->att, (size_t)nth * attn_scratch_floats(max_ctx + GM_PANEL, D));
    /* rotary tables for every position (cos, sin) x (local, global) */
    ALLOC(s->rope_cos_l, (size_t)max_ctx * D / 2);
    ALLOC(s->rope_sin_l, (size_t)max_ctx * D / 2);
    ALLOC(s->rope_cos_g, (size_t)max_ctx * D / 2);
    ALLOC(s->rope_sin_g, (size_t)max_ctx * D / 2);
#undef ALLOC
    for (p = 0; p < max_ctx; p++)
        for (i = 0; i < D / 2; i++) {
            double fl = pow((double)hp->rope_base_local, -2.0 * i / D), fg = pow((double)hp->rope_base_global, -2.0 * i / D);
            s->rope_cos_l[p * D / 2 + i] = (float)cos((double)p * fl);
            s->rope_sin_l[p * D / 2 + i] = (float)sin((double)p * fl);
            s->rope_cos_g[p * D / 2 + i] = (float)cos((double)p * fg);
            s->rope_sin_g[p * D / 2 + i] = (float)sin((double)p * fg);
        }
#ifdef GEMMA_WITH_EI
    if (mode != GM_ATTN_DENSE_OWN) {
        ei_result r;
        ei_shape shape;
        ei_sizes sizes;
        s->ei_cfg = ei_cfg ? *(const ei_config *)ei_cfg : ei_config_default();
        s->ei_cfg.attn_scale = hp->attn_scale;
        if (s->ei_cfg.decode_scale == 0) s->ei_cfg.decode_scale = hp->attn_scale;
        if ((r = ei_context_create(&s->ei_cfg, &s->ei)) != EI_OK)
            { gguf_fail(err, errlen, "entropyinfer: ei_context_create: %s (%s)", ei_result_name(r), ei_last_error()); goto bad; }
        if (max_batch % s->ei_cfg.segment_size)
            { gguf_fail(err, errlen, "state: max_batch %d must be a multiple of segment_size %d", max_batch, s->ei_cfg.segment_size); goto bad; }
        /* one workspace for every call of every global layer (they run one
           after another): the pool's nth threads, max_ctx rows; and the
           decoder's memory */
        shape.max_tokens = max_ctx;
        shape.n_heads = H;
        shape.n_kv_heads = hp->n_kv_head;
        shape.head_dim = D;
        shape.plan_flags = EI_PLAN_CHUNKED;
        shape.n_threads = nth;
        if ((r = ei_layer_sizes(s->ei, &shape, &sizes)) != EI_OK)
            { gguf_fail(err, errlen, "entropyinfer: ei_layer_sizes: %s (%s)", ei_result_name(r), ei_last_error()); goto bad; }
        s->ei_ws_bytes = sizes.workspace;
        s->ei_ws = malloc(s->ei_ws_bytes ? s->ei_ws_bytes : 1);
        s->plans = (ei_plan *)calloc((size_t)hp->n_layer, sizeof(ei_plan));
        s->decs = (ei_decoder *)calloc((size_t)hp->n_layer, sizeof(ei_decoder));
        s->dec_mem = (void **)calloc((size_t)hp->n_layer, sizeof(void *));
        if (!s->plans || !s->decs || !s->dec_mem) goto oom;
        for (l = 0; l < hp->n_layer; l++) {
            if (!m->layers[l].is_global) continue;
            if (mode == GM_ATTN_EI_SPARSE) {
                if ((r = ei_plan_init(s->ei, &s->plans[l], max_ctx, hp->n_kv_head, D, EI_PLAN_CHUNKED | gm_plan_extra_flags, NULL, 0)) != EI_OK)
                    { gguf_fail(err, errlen, "entropyinfer: ei_plan_init: %s (%s)", ei_result_name(r), ei_last_error()); goto bad; }
                if (!(s->dec_mem[l] = malloc(sizes.decoder))) goto oom;
                if ((r = ei_decoder_init(s->ei, &s->decs[l], H, hp->n_kv_head, D, s->dec_mem[l], sizes.decoder)) != EI_OK)
                    { gguf_fail(err, errlen, "entropyinfer: ei_decoder_init: %s (%s)", ei_result_name(r), ei_last_error()); goto bad; }
            }
        }
        s->keep_index = (int32_t *)malloc((size_t)hp->n_kv_head * (size_t)max_ctx * sizeof(int32_t));
        s->ei_shared = gm_ei_shared_env();
        s->shared_scores = (float *)malloc((size_t)(H + 1) * (size_t)max_ctx * sizeof(float));
        s->row_pos = (int32_t *)malloc((size_t)max_ctx * sizeof(int32_t));
        s->shared_pos = (int32_t *)malloc((size_t)max_ctx * sizeof(int32_t));
        if (!s->ei_ws || !s->keep_index || !s->shared_scores || !s->row_pos || !s->shared_pos)
            goto oom;
    }
#endif
    return 0;
oom:
    gguf_fail(err, errlen, "state: out of memory (max_ctx %lld)", (long long)max_ctx);
bad:
    gm_state_free(s);
    return -1;
}

void gm_state_free(gm_state *s) {
    int l;
    if (!s->m) return;
    for (l = 0; s->k_cache && l < s->m->hp.n_layer; l++) { free(s->k_cache[l]); free(s->v_cache[l]); }
    free(s->k_cache); free(s->v_cache); free(s->cache_len);
    free(s->x); free(s->xn); free(s->q); free(s->k); free(s->v); free(s->att); free(s->ao);
    free(s->gate); free(s->up); free(s->tmp);
    free(s->rope_cos_l); free(s->rope_sin_l); free(s->rope_cos_g); free(s->rope_sin_g);
#ifdef GEMMA_WITH_EI
    if (s->ei) {
        for (l = 0; s->plans && l < s->m->hp.n_layer; l++)
            if (s->plans[l].max_tokens) ei_plan_free(s->ei, &s->plans[l]);
        for (l = 0; s->dec_mem && l < s->m->hp.n_layer; l++) free(s->dec_mem[l]);
        ei_context_destroy(s->ei);
    }
    free(s->plans); free(s->decs); free(s->dec_mem);
    free(s->ei_ws); free(s->keep_index);
    free(s->shared_scores); free(s->row_pos); free(s->shared_pos);
#endif
    memset(s, 0, sizeof(*s));
}

void gm_state_reset(gm_state *s) {
    int l;
    s->n_past = 0;
    for (l = 0; l < s->m->hp.n_layer; l++) s->cache_len[l] = 0;
    memset(&s->stats, 0, sizeof(s->stats));
#ifdef GEMMA_WITH_EI
    if (s->ei && s->mode == GM_ATTN_EI_SPARSE)
        for (l = 0; l < s->m->hp.n_layer; l++)
            if (s->m->layers[l].is_global) {
                ei_plan_reset(&s->plans[l]);
                ei_decoder_reset(&s->decs[l]);
            }
    s->prompt_done = 0;
    s->shared_rows = 0;
    s->kv_bytes_before = s->kv_bytes_after = 0;
    s->ei_err = 0;
#endif
}

int64_t gm_kv_bytes(const gm_state *s) {
    int64_t b = 0;
    int l;
    for (l = 0; l < s->m->hp.n_layer; l++) b += s->cache_len[l];
    return b * s->m->hp.n_kv_head * s->m->hp.head_dim * 2 * (int64_t)sizeof(float);
}

/* ================================================================ entropyinfer glue */
#ifdef GEMMA_WITH_EI
typedef struct ei_attn_job {
    gm_state *s;
    ei_tensor q, k, v;
    ei_out_tensor out;
    const ei_plan *plan;
    int64_t q_offset;
    ei_result r[64];
} ei_attn_job;

/* How a call runs: part ith of nth on the pool's threads (nth >= 2), or a
   whole call on n_threads threads; every call passes the state's one
   workspace. */
static ei_exec ei_run(const gm_state *s, int n_threads, int ith, int nth) {
    ei_exec x;
    memset(&x, 0, sizeof x);
    x.n_threads = n_threads;
    x.ith = ith;
    x.nth = nth;
    x.workspace = s->ei_ws;
    x.workspace_bytes = s->ei_ws_bytes;
    return x;
}

static void ei_attn_task(void *arg, int ith, int nth) {
    ei_attn_job *j = (ei_attn_job *)arg;
    gm_state *s = j->s;
    ei_exec x = ei_run(s, 0, ith, nth);
    j->r[ith] = ei_attention_prefill(s->ei, &x, &j->q, &j->k, &j->v, j->plan, &j->out, j->q_offset);
}

/* A decode step: the keys split over the pool's threads (every thread works
   though the model has one kv head), then the slices merged, after the
   pool's join; the partials live in the shared workspace. */
static void ei_decode_task(void *arg, int ith, int nth) {
    ei_attn_job *j = (ei_attn_job *)arg;
    gm_state *s = j->s;
    ei_exec x = ei_run(s, 0, ith, nth);
    j->r[ith] = ei_attention_decode(s->ei, &x, &j->q, &j->k, &j->v, NULL, &j->out, j->q_offset);
}
static void ei_merge_task(void *arg, int ith, int nth) {
    ei_attn_job *j = (ei_attn_job *)arg;
    ei_exec x = ei_run(j->s, 0, ith, nth);
    j->r[ith] = ei_attention_decode_merge(j->s->ei, &x, &j->out);
}

static int ei_check(gm_state *s, ei_result r, const char *what, char *err, size_t errlen) {
    if (r == EI_OK) return 0;
    s->ei_err = 1;
    snprintf(s->ei_msg, sizeof s->ei_msg, "%s: %s (%s)", what, ei_result_name(r), ei_last_error());
    return gguf_fail(err, errlen, "entropyinfer: %s", s->ei_msg);
}

/* Does global layer l run entropyinfer (plan, decode compression)? */
static int ei_layer_sparse(const gm_state *s, int l) {
    return s->mode == GM_ATTN_EI_SPARSE && !(l < 64 && (s->dense_layers >> l & 1));
}

/* Global-layer attention through the library. phase: 0 prefill chunk, 1 decode. */
static int ei_global_attention(gm_state *s, int l, int n, int64_t row0, int is_final, int decode,
                               char *err, size_t errlen) {
    const gm_hparams *hp = &s->m->hp;
    const int H = hp->n_head, G = hp->n_kv_head, D = hp->head_dim;
    ei_attn_job j;
    const ei_plan *plan = NULL;
    double t0 = gm_now();
    int i;
    memset(&j, 0, sizeof j);
    j.s = s;
    j.q = ei_tensor_make(s->q, EI_F32, n, H, D);
    j.k = ei_tensor_make(s->k_cache[l], EI_F32, row0 + n, G, D);
    j.v = ei_tensor_make(s->v_cache[l], EI_F32, row0 + n, G, D);
    j.out = ei_out_tensor_make(s->ao, EI_F32, n, H, D);
    j.q_offset = row0;
    if (ei_layer_sparse(s, l) && !decode) {
        double tp = gm_now();
        /* every thread of the pool: with Gemma's one kv head, each segment's
           query min/max split by head and its block scores by block range */
        ei_exec x = ei_run(s, gm_pool_size(s->pool), 0, 1);
        if (ei_check(s, ei_profile_chunk(s->ei, &x, &j.q, &j.k, &s->plans[l], row0, is_final), "ei_profile_chunk", err,
                     errlen))
            return -1;
        s->stats.t_profile += gm_now() - tp;
        plan = &s->plans[l];
        if (s->plan_hook && s->plan_hook(s, l, n, row0))
            return gguf_fail(err, errlen, "plan_hook failed at layer %d, rows %lld..%lld", l, (long long)row0, (long long)(row0 + n - 1));
    }
    j.plan = plan;
    if (decode && n == 1) { /* a generated token (teacher-forced batches: prefill attention) */
        gm_pool_run(s->pool, ei_decode_task, &j);
        for (i = 0; i < gm_pool_size(s->pool); i++)
            if (ei_check(s, j.r[i], "ei_attention_decode", err, errlen)) return -1;
        gm_pool_run(s->pool, ei_merge_task, &j);
        for (i = 0; i < gm_pool_size(s->pool); i++)
            if (ei_check(s, j.r[i], "ei_attention_decode_merge", err, errlen)) return -1;
    } else {
        gm_pool_run(s->pool, ei_attn_task, &j);
        for (i = 0; i < gm_pool_size(s->pool); i++)
            if (ei_check(s, j.r[i], "ei_attention_prefill", err, errlen)) return -1;
    }
    s->stats.t_attn_global += gm_now() - t0;
    if (ei_layer_sparse(s, l)) {
        /* the decoder keeps the last `window` queries: feed only those of a prompt chunk */
        int64_t keep = decode ? n : (n < s->ei_cfg.window ? n : s->ei_cfg.window);
        ei_tensor qv = ei_tensor_make(s->q + (size_t)(n - keep) * H * D, EI_F32, keep, H, D);
        /* (s->n_past: the position of this call's first query) */
        if (ei_check(s, ei_decode_observe(s->ei, &s->decs[l], &qv, s->n_past + (n - keep), decode), "ei_decode_observe", err,
                     errlen))
            return -1;
    }
    return 0;
}

/* After a decode step: compress the layer's cache when the library says so. */
static int ei_maybe_compress(gm_state *s, int l, char *err, size_t errlen) {
    const gm_hparams *hp = &s->m->hp;
    ei_keep_set keep;
    ei_tensor kt;
    ei_out_tensor ko, vo;
    ei_exec x;
    double t0;
    if (!ei_layer_sparse(s, l) || !ei_decode_due(s->ei, &s->decs[l])) return 0;
    t0 = gm_now();
    memset(&keep, 0, sizeof keep);
    keep.heads_out = s->ei_cfg.per_kv_head ? hp->n_kv_head : hp->n_head;
    if (keep.heads_out != hp->n_kv_head)
        return gguf_fail(err, errlen, "engine: per-query-head keep sets need a per-query-head cache (use per_kv_head=1)");
    keep.capacity = (int32_t)s->max_ctx;
    keep.index = s->keep_index;
    kt = ei_tensor_make(s->k_cache[l], EI_F32, s->cache_len[l], hp->n_kv_head, hp->head_dim);
    x = ei_run(s, 1, 0, 1);
    if (ei_check(s, ei_decode_keep(s->ei, &x, &s->decs[l], &kt, &keep), "ei_decode_keep", err, errlen))
        return -1;
    ko = ei_out_tensor_make(s->k_cache[l], EI_F32, s->cache_len[l], hp->n_kv_head, hp->head_dim);
    vo = ei_out_tensor_make(s->v_cache[l], EI_F32, s->cache_len[l], hp->n_kv_head, hp->head_dim);
    if (ei_check(s, ei_kv_compact(s->ei, &keep, &ko, &vo), "ei_kv_compact", err, errlen)) return -1;
    s->cache_len[l] = keep.n_kept;
    s->stats.t_compress += gm_now() - t0;
    s->stats.n_compress++;
    return 0;
}

/* After a decode step, shared keep set (ei_shared): one set of rows for every
   global layer, scored by all of them; rows map to positions through
   row_pos (the kept positions of the last compaction, then the new tokens). */
static int ei_maybe_compress_shared(gm_state *s, char *err, size_t errlen) {
    const gm_hparams *hp = &s->m->hp;
    const int H = hp->n_head;
    float *scores = s->shared_scores, *shared = s->shared_scores + (size_t)H * (size_t)s->max_ctx;
    ei_keep_set keep;
    const ei_exec x = ei_run(s, 1, 0, 1); /* the caller's thread alone */
    int64_t n = -1, j;
    int l;
    double t0;
    for (l = 0; l < hp->n_layer; l++)
        if ((s->m->layers[l].is_global && ei_layer_sparse(s, l))) { n = s->cache_len[l]; break; }
    if (n < 0 || !ei_decode_due(s->ei, &s->decs[l])) return 0;
    t0 = gm_now();
    for (j = 0; j < n; j++)
        s->row_pos[j] = (int32_t)(j < s->shared_rows ? s->shared_pos[j]
                                  : s->shared_rows ? s->shared_pos[s->shared_rows - 1] + 1 + (j - s->shared_rows) : j);
    memset(shared, 0, (size_t)n * sizeof(float));
    for (l = 0; l < hp->n_layer; l++) {
        ei_tensor kt;
        if (!(s->m->layers[l].is_global && ei_layer_sparse(s, l))) continue;
        if (s->cache_len[l] != n) return gguf_fail(err, errlen, "engine: global layers hold %lld and %lld rows", (long long)n, (long long)s->cache_len[l]);
        kt = ei_tensor_make(s->k_cache[l], EI_F32, n, hp->n_kv_head, hp->head_dim);
        if (ei_check(s, ei_decode_score(s->ei, &x, &s->decs[l], &kt, s->row_pos, 0, scores), "ei_decode_score", err,
                     errlen) ||
            ei_check(s, ei_decode_shared_add(s->ei, &x, &s->decs[l], scores, n, s->row_pos, shared),
                     "ei_decode_shared_add", err, errlen))
            return -1;
    }
    memset(&keep, 0, sizeof keep);
    keep.heads_out = 1;
    keep.capacity = (int32_t)s->max_ctx;
    keep.index = s->keep_index;
    keep.positions = s->shared_pos;
    keep.row_pos = s->row_pos;
    for (l = 0; l < hp->n_layer && !(s->m->layers[l].is_global && ei_layer_sparse(s, l)); l++) {}
    if (ei_check(s, ei_decode_select_shared(s->ei, &x, &s->decs[l], shared, n, &keep), "ei_decode_select_shared", err,
                 errlen))
        return -1;
    for (l = 0; l < hp->n_layer; l++) {
        ei_out_tensor ko, vo;
        if (!(s->m->layers[l].is_global && ei_layer_sparse(s, l))) continue;
        ko = ei_out_tensor_make(s->k_cache[l], EI_F32, n, hp->n_kv_head, hp->head_dim);
        vo = ei_out_tensor_make(s->v_cache[l], EI_F32, n, hp->n_kv_head, hp->head_dim);
        if (ei_check(s, ei_kv_compact(s->ei, &keep, &ko, &vo), "ei_kv_compact", err, errlen)) return -1;
        s->cache_len[l] = keep.n_kept;
    }
    s->shared_rows = keep.n_kept;
    s->stats.t_compress += gm_now() - t0;
    s->stats.n_compress++;
    return 0;
}
#endif

/* ================================================================ forward */
static int forward(gm_state *s, const int32_t *tok, int n, int decode, int is_final, float *hidden,
                   char *err, size_t errlen) {
    const gm_model *m = s->m;
    const gm_hparams *hp = &m->hp;
    const int Dm = hp->d_model, H = hp->n_head, G = hp->n_kv_head, D = hp->head_dim, F = hp->d_ff;
    const int QD = H * D, KD = G * D;
    int i, l, h;
    double t0;
    if (n < 1 || n > s->max_batch) return gguf_fail(err, errlen, "forward: batch of %d tokens (1..%d allowed)", n, s->max_batch);
    if (s->n_past + n > s->max_ctx) return gguf_fail(err, errlen, "forward: context full (%lld + %d > %lld)", (long long)s->n_past, n, (long long)s->max_ctx);
    for (i = 0; i < n; i++) {
        if (tok[i] < 0 || tok[i] >= hp->n_vocab) return gguf_fail(err, errlen, "forward: token id %d out of range", tok[i]);
        {
            /* the embedding row is dequantized straight from the file (the f32
               copy is packed for the output projection) */
            const gguf_tensor *e = m->embd;
            int be, bb, d;
            float *x = s->x + (size_t)i * Dm;
            gguf_type_info(e->type, &be, &bb);
            gguf_dequantize(e->type, (const uint8_t *)e->data + (size_t)tok[i] * (size_t)(Dm / be) * (size_t)bb, x, Dm);
            for (d = 0; d < Dm; d++) x[d] *= hp->embed_scale;
        }
    }
    for (l = 0; l < hp->n_layer; l++) {
        const gm_layer *L = &m->layers[l];
        const float *rc = L->is_global ? s->rope_cos_g : s->rope_cos_l;
        const float *rs = L->is_global ? s->rope_sin_g : s->rope_sin_l;
        int64_t row0 = s->cache_len[l];
        mm_job j;
        for (i = 0; i < n; i++) rmsnorm(s->xn + (size_t)i * Dm, s->x + (size_t)i * Dm, L->attn_norm, Dm, hp->eps);
        t0 = gm_now();
        memset(&j, 0, sizeof j);
        j.X = s->xn; j.ldx = Dm; j.n = n; j.in = Dm; j.nw = 3;
        j.W[0] = L->wq; j.out[0] = QD; j.Y[0] = s->q;
        j.W[1] = L->wk; j.out[1] = KD; j.Y[1] = s->k;
        j.W[2] = L->wv; j.out[2] = KD; j.Y[2] = s->v;
        gm_pool_run(s->pool, mm_task, &j);
        s->stats.t_matmul += gm_now() - t0;
        for (i = 0; i < n; i++) {
            int64_t pos = s->n_past + i;
            for (h = 0; h < H; h++) {
                float *q = s->q + ((size_t)i * H + h) * D;
                rmsnorm(q, q, L->q_norm, D, hp->eps);
                rope(q, D, rc + pos * D / 2, rs + pos * D / 2);
            }
            for (h = 0; h < G; h++) {
                float *k = s->k + ((size_t)i * G + h) * D;
                rmsnorm(k, k, L->k_norm, D, hp->eps);
                rope(k, D, rc + pos * D / 2, rs + pos * D / 2);
            }
        }
        memcpy(s->k_cache[l] + row0 * KD, s->k, (size_t)n * KD * sizeof(float));
        memcpy(s->v_cache[l] + row0 * KD, s->v, (size_t)n * KD * sizeof(float));
        if (s->kv_bf16) {
            round_bf16(s->k_cache[l] + row0 * KD, (size_t)n * KD);
            round_bf16(s->v_cache[l] + row0 * KD, (size_t)n * KD);
        }
        s->cache_len[l] = row0 + n;
        t0 = gm_now();
#ifdef GEMMA_WITH_EI
        if (L->is_global && s->mode != GM_ATTN_DENSE_OWN) {
            if (ei_global_attention(s, l, n, row0, is_final, decode, err, errlen)) return -1;
            if (decode && !s->ei_shared && ei_maybe_compress(s, l, err, errlen)) return -1;
        } else
#endif
        {
            attn_job aj;
            aj.s = s; aj.q = s->q; aj.kc = s->k_cache[l]; aj.vc = s->v_cache[l]; aj.out = s->ao;
            aj.n = n; aj.q0 = row0; aj.window = L->is_global ? 0 : hp->sliding_window; aj.scale = hp->attn_scale;
            aj.scratch = s->att;
            aj.scratch_per_thread = attn_scratch_floats(s->max_ctx + GM_PANEL, D);
            gm_pool_run(s->pool, attn_task, &aj);
            if (L->is_global) s->stats.t_attn_global += gm_now() - t0;
            else s->stats.t_attn_local += gm_now() - t0;
        }
        (void)is_final;
        (void)decode;
        t0 = gm_now();
        matmul(s->pool, s->ao, n, QD, L->wo, Dm, s->tmp);
        s->stats.t_matmul += gm_now() - t0;
        for (i = 0; i < n; i++) {
            float *t = s->tmp + (size_t)i * Dm, *x = s->x + (size_t)i * Dm;
            int d;
            rmsnorm(t, t, L->post_attn_norm, Dm, hp->eps);
            for (d = 0; d < Dm; d++) x[d] += t[d];
            rmsnorm(s->xn + (size_t)i * Dm, x, L->ffn_norm, Dm, hp->eps);
        }
        t0 = gm_now();
        memset(&j, 0, sizeof j);
        j.X = s->xn; j.ldx = Dm; j.n = n; j.in = Dm; j.nw = 2;
        j.W[0] = L->w_gate; j.out[0] = F; j.Y[0] = s->gate;
        j.W[1] = L->w_up; j.out[1] = F; j.Y[1] = s->up;
        gm_pool_run(s->pool, mm_task, &j);
        for (i = 0; i < n * F; i++) s->gate[i] = gelu_tanh(s->gate[i]) * s->up[i];
        matmul(s->pool, s->gate, n, F, L->w_down, Dm, s->tmp);
        s->stats.t_matmul += gm_now() - t0;
        for (i = 0; i < n; i++) {
            float *t = s->tmp + (size_t)i * Dm, *x = s->x + (size_t)i * Dm;
            int d;
            rmsnorm(t, t, L->post_ffn_norm, Dm, hp->eps);
            for (d = 0; d < Dm; d++) x[d] += t[d];
        }
    }
    s->n_past += n;
    if (hidden)
        for (i = 0; i < n; i++) rmsnorm(hidden + (size_t)i * Dm, s->x + (size_t)i * Dm, m->out_norm, Dm, hp->eps);
    return 0;
}

int gm_prefill(gm_state *s, const int32_t *tokens, int64_t n, float *hidden, char *err, size_t errlen) {
    int64_t done = 0;
    while (done < n) {
        int b = n - done < s->max_batch ? (int)(n - done) : s->max_batch;
        int is_final = done + b == n;
        if (forward(s, tokens + done, b, 0, is_final, hidden ? hidden + (size_t)done * s->m->hp.d_model : NULL, err, errlen))
            return -1;
        done += b;
    }
#ifdef GEMMA_WITH_EI
    s->prompt_done = 1;
#endif
    return 0;
}

int gm_decode(gm_state *s, const int32_t *tokens, int n, float *hidden, char *err, size_t errlen) {
    if (forward(s, tokens, n, 1, 0, hidden, err, errlen)) return -1;
#ifdef GEMMA_WITH_EI
    if (s->ei && s->ei_shared && s->mode == GM_ATTN_EI_SPARSE && ei_maybe_compress_shared(s, err, errlen)) return -1;
#endif
    return 0;
}

void gm_logits(gm_state *s, const float *hidden, int n, float *logits) {
    const float cap = s->m->hp.final_softcap;
    matmul(s->pool, hidden, n, s->m->hp.d_model, s->m->out_proj, s->m->hp.n_vocab, logits);
    if (cap > 0) {
        size_t i, N = (size_t)n * s->m->hp.n_vocab;
        for (i = 0; i < N; i++) logits[i] = cap * tanhf(logits[i] / cap);
    }
}
