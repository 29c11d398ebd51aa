/* Conformance runner: checks entropyinfer against a folder of golden cases
   (format: ../shared/golden/FORMAT.md) in every input dtype, on every SIMD
   path this CPU has, in the ragged and the reference's per-segment mode, and
   chunked planning against whole-prompt planning.

   usage: golden_runner [folder]        (default ../shared/golden)
   prints one line per case and ends with "N passed, M failed"; exit 1 on any
   failure, 2 when the folder cannot be read or holds no case (a folder of
   case folders, each with a meta.txt: an empty or mistyped folder is an
   error, not a pass). */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "check.h"

static char failure[2048];
#define FAIL(...) do { snprintf(failure, sizeof failure, __VA_ARGS__); return 0; } while (0)

/* A whole call on the calling thread with the workspace ws. */
static ei_exec one_thread(void *ws, size_t bytes) {
    ei_exec x;
    memset(&x, 0, sizeof x);
    x.workspace = ws;
    x.workspace_bytes = bytes;
    return x;
}
/* Every size of a layer of the case's shape (one thread). */
static ei_result case_sizes(const ei_context *ctx, const golden_meta *m, uint32_t plan_flags, ei_sizes *sz) {
    ei_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.max_tokens = m->n_tokens;
    sh.n_heads = (int32_t)m->n_heads;
    sh.n_kv_heads = (int32_t)m->n_kv_heads;
    sh.head_dim = (int32_t)m->head_dim;
    sh.plan_flags = plan_flags;
    return ei_layer_sizes(ctx, &sh, sz);
}

/* ------------------------------------------------------------ prefill */
typedef struct {
    float *q, *k, *scores, *entropy, *topk_w;
    uint8_t *rigid;
    int32_t *keep_blocks, *segment_topk, *topk;
} prefill_ref;

/* FORMAT.md: a keep count may differ only where the reference budget lies
   within 1e-3 tokens of a block boundary; B recomputed from entropy.f32 by
   the header's recurrence (check.h: ref_budget). */
static int knife_edge_budget(const ei_config *c, const golden_meta *m, const prefill_ref *r, long h, long s) {
    return !r->rigid[h] && ref_budget_on_edge(c, ref_budget(c, r->entropy + h * m->n_segments, (int32_t)s, 0), 1e-3);
}

/* The kept SET of one row against the reference ranking (FORMAT.md). */
static int check_topk_set(const golden_meta *m, const prefill_ref *r, long h, long s, const int32_t *ours, long count,
                          const char *what) {
    long nb = m->n_blocks, visible = s * (m->segment_size / m->block_size), i, j;
    const float *ref_scores = r->scores + ((size_t)h * m->n_segments + s) * nb;
    const float *w = r->topk_w + ((size_t)h * m->n_segments + s) * m->max_k;
    double last;
    if (count == 0) return 1;
    if (count > m->max_k) FAIL("%s: head %ld seg %ld count %ld > max_k %ld", what, h, s, count, m->max_k);
    last = w[count - 1];
    if (visible > nb) visible = nb;
    for (i = 0; i < count; ++i) {
        if (ours[i] < 0 || ours[i] >= visible) FAIL("%s: head %ld seg %ld kept block %d outside 0..%ld", what, h, s, ours[i], visible - 1);
        for (j = 0; j < i; ++j)
            if (ours[j] == ours[i]) FAIL("%s: head %ld seg %ld block %d kept twice", what, h, s, ours[i]);
        if (ref_scores[ours[i]] < last - (1e-6 + 1e-3 * last))
            FAIL("%s: head %ld seg %ld kept block %d (score %g) ranks below the reference's last kept (%g)", what, h, s,
                 ours[i], ref_scores[ours[i]], last);
    }
    for (j = 0; j < visible; ++j)
        if (ref_scores[j] > last * (1 + 1e-6) + 1e-30) {
            int found = 0;
            for (i = 0; i < count; ++i) found |= ours[i] == j;
            if (!found) FAIL("%s: head %ld seg %ld misses block %ld (score %g > last kept %g)", what, h, s, j, ref_scores[j], last);
        }
    return 1;
}

static int check_plan(const ei_config *c, const golden_meta *m, const prefill_ref *r, const ei_plan *p, int per_segment,
                      const char *what) {
    long h, s, b, S = m->n_segments, nb = m->n_blocks;
    if (p->n_segments != S || p->n_blocks != nb) FAIL("%s: plan has %d segments / %d blocks, reference %ld / %ld", what, p->n_segments, p->n_blocks, S, nb);
    for (h = 0; h < m->n_kv_heads; ++h) {
        const size_t row0 = (size_t)h * p->seg_capacity;
        if (S >= 2) {
            for (s = 0; s < S; ++s) {
                double a = p->entropy[row0 + s], e = r->entropy[h * S + s];
                if (!close_to(a, e, 1e-6, 1e-3)) FAIL("%s: entropy[%ld][%ld] = %.9g, reference %.9g", what, h, s, a, e);
                if (p->scores && r->scores)
                    for (b = 0; b < nb; ++b) {
                        double x = p->scores[(row0 + s) * (size_t)p->blk_capacity + b], y = r->scores[(h * S + s) * nb + b];
                        if (!close_to(x, y, 1e-6, 1e-3)) FAIL("%s: scores[%ld][%ld][%ld] = %.9g, reference %.9g", what, h, s, b, x, y);
                    }
            }
            {
                double margin = 1e30;
                for (s = 1; s < S; ++s) margin = fmin(margin, fabs(r->entropy[h * S + s] - m->rigid_entropy));
                if (margin > 1e-6 && (p->head_class[h] == EI_HEAD_RIGID) != (r->rigid[h] != 0))
                    FAIL("%s: kv head %ld class %s, reference %s", what, h, p->head_class[h] ? "rigid" : "dynamic", r->rigid[h] ? "rigid" : "dynamic");
            }
        }
        for (s = 0; s < S; ++s) {
            long ours = p->keep_blocks[row0 + s], ref = r->keep_blocks[h * S + s], applied = p->keep_count[row0 + s], i;
            const int32_t *idx = p->block_index + (row0 + s) * (size_t)p->max_keep;
            if (ours != ref && !knife_edge_budget(c, m, r, h, s))
                FAIL("%s: keep_blocks[%ld][%ld] = %ld, reference %ld", what, h, s, ours, ref);
            if (per_segment ? applied != r->segment_topk[s] : applied != ours)
                FAIL("%s: keep_count[%ld][%ld] = %ld, expected %ld", what, h, s, applied, per_segment ? (long)r->segment_topk[s] : ours);
            for (i = applied; i < p->max_keep; ++i)
                if (idx[i] != -1) FAIL("%s: block_index[%ld][%ld][%ld] = %d, padding must be -1", what, h, s, i, idx[i]);
            if (s > 0 && S >= 2 && !check_topk_set(m, r, h, s, idx, applied, what)) return 0;
        }
    }
    return 1;
}

static ei_config prefill_config(const golden_meta *m, ei_simd simd, int per_segment) {
    ei_config c = golden_config(m);
    c.simd = simd;
    c.per_segment_budget = per_segment;
    return c;
}

/* Chunked planning, one segment per call: entropies of segments >= 1 equal
   the whole-prompt ones exactly, and the plan is identical for every head
   that is rigid throughout or dynamic from segment 1. */
static int check_chunked(const golden_meta *m, ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_plan *whole,
                         const ei_exec *x, const char *what) {
    ei_plan p;
    long seg = m->segment_size, t, h, s;
    ei_result rc = ei_plan_init(ctx, &p, m->n_tokens, (int32_t)m->n_kv_heads, (int32_t)m->head_dim, EI_PLAN_CHUNKED,
                                NULL, 0);
    if (rc != EI_OK) FAIL("%s: chunked plan alloc: %s", what, ei_last_error());
    for (t = 0; t < m->n_tokens; t += seg) {
        long cnt = m->n_tokens - t < seg ? m->n_tokens - t : seg;
        ei_tensor qc = *q, kc = *k;
        qc.data = (const char *)q->data + (size_t)t * q->token_stride * (q->dtype == EI_F32 ? 4 : 2);
        qc.n_tokens = cnt;
        kc.n_tokens = t + cnt;
        rc = ei_profile_chunk(ctx, x, &qc, &kc, &p, t, t + cnt == m->n_tokens);
        if (rc != EI_OK) { ei_plan_free(ctx, &p); FAIL("%s: ei_profile_chunk at %ld: %s", what, t, ei_last_error()); }
    }
    for (h = 0; h < m->n_kv_heads; ++h) {
        size_t row0 = (size_t)h * p.seg_capacity;
        int late = whole->head_class[h] == EI_HEAD_DYNAMIC && m->n_segments > 1 &&
                   !((double)whole->entropy[row0 + 1] >= m->rigid_entropy);
        for (s = 1; s < m->n_segments; ++s)
            if (memcmp(&p.entropy[row0 + s], &whole->entropy[(size_t)h * whole->seg_capacity + s], 4)) {
                ei_plan_free(ctx, &p);
                FAIL("%s: chunked entropy[%ld][%ld] differs from whole-prompt", what, h, s);
            }
        if (late) continue;
        for (s = 0; s < m->n_segments; ++s) {
            size_t rw = (size_t)h * whole->seg_capacity + s;
            if (p.keep_count[row0 + s] != whole->keep_count[rw] ||
                memcmp(p.block_index + (row0 + s) * p.max_keep, whole->block_index + rw * whole->max_keep,
                       (size_t)whole->keep_count[rw] * 4)) {
                ei_plan_free(ctx, &p);
                FAIL("%s: chunked plan of kv head %ld segment %ld differs from whole-prompt", what, h, s);
            }
        }
    }
    ei_plan_free(ctx, &p);
    return 1;
}

static int run_prefill(const golden_meta *m, char *summary) {
    prefill_ref r;
    size_t nq, nk;
    int ok = 1, d, p, per, configs = 0;
    memset(&r, 0, sizeof r);
    r.q = (float *)golden_load(m, "q.f32", 4, &nq);
    r.k = (float *)golden_load(m, "k.f32", 4, &nk);
    r.scores = (float *)golden_load(m, "scores.f32", 4, NULL);
    r.entropy = (float *)golden_load(m, "entropy.f32", 4, NULL);
    r.rigid = (uint8_t *)golden_load(m, "rigid.u8", 1, NULL);
    r.keep_blocks = (int32_t *)golden_load(m, "keep_blocks.i32", 4, NULL);
    r.segment_topk = (int32_t *)golden_load(m, "segment_topk.i32", 4, NULL);
    r.topk = (int32_t *)golden_load(m, "topk.i32", 4, NULL);
    r.topk_w = (float *)golden_load(m, "topk_w.f32", 4, NULL);
    if (!r.q || !r.k || !r.keep_blocks || !r.segment_topk || nq != (size_t)(m->n_tokens * m->n_heads * m->head_dim) ||
        nk != (size_t)(m->n_tokens * m->n_kv_heads * m->head_dim) ||
        (m->n_segments >= 2 && (!r.scores || !r.entropy || !r.rigid || !r.topk || !r.topk_w))) {
        snprintf(failure, sizeof failure, "missing or mis-sized case files");
        ok = 0;
    }
    for (d = 0; ok && d < 3; ++d) {
        ei_dtype dt = (ei_dtype)d;
        void *qd = to_dtype(r.q, nq, dt), *kd = to_dtype(r.k, nk, dt);
        ei_tensor q = ei_tensor_make(qd, dt, m->n_tokens, (int32_t)m->n_heads, (int32_t)m->head_dim);
        ei_tensor k = ei_tensor_make(kd, dt, m->n_tokens, (int32_t)m->n_kv_heads, (int32_t)m->head_dim);
        for (p = EI_SIMD_SCALAR; ok && p < TEST_SIMD_END; ++p) {
            if (!ei_cpu_supports((ei_simd)p)) continue;
            for (per = 0; ok && per < 2; ++per) {
                char what[256];
                ei_config c = prefill_config(m, (ei_simd)p, per);
                ei_context *ctx = NULL;
                ei_plan plan;
                ei_sizes sz;
                ei_exec x;
                void *ws = NULL;
                snprintf(what, sizeof what, "%s/%s/%s", dtype_name(dt), ei_simd_name((ei_simd)p), per ? "segment_topk" : "keep_blocks");
                if (ei_context_create(&c, &ctx) != EI_OK ||
                    ei_plan_init(ctx, &plan, m->n_tokens, (int32_t)m->n_kv_heads, (int32_t)m->head_dim, EI_PLAN_SCORES, NULL, 0) != EI_OK ||
                    case_sizes(ctx, m, EI_PLAN_SCORES | EI_PLAN_CHUNKED, &sz) != EI_OK) {
                    snprintf(failure, sizeof failure, "%s: setup: %s", what, ei_last_error());
                    ok = 0;
                    ei_context_destroy(ctx);
                    break;
                }
                ws = malloc(sz.profile);
                x = one_thread(ws, sz.profile);
                if (ei_profile(ctx, &x, &q, &k, &plan) != EI_OK) {
                    snprintf(failure, sizeof failure, "%s: ei_profile: %s", what, ei_last_error());
                    ok = 0;
                } else {
                    /* f16 inputs below the normal range lose precision: scores hold within tolerance (FORMAT.md) */
                    ok = check_plan(&c, m, &r, &plan, per, what);
                    if (ok) ok = check_chunked(m, ctx, &q, &k, &plan, &x, what);
                    configs++;
                }
                free(ws);
                ei_plan_free(ctx, &plan);
                ei_context_destroy(ctx);
            }
        }
        free(qd);
        free(kd);
    }
    sprintf(summary, "%d configurations (dtype x simd x mode), chunked vs whole", configs);
    free(r.q); free(r.k); free(r.scores); free(r.entropy); free(r.rigid); free(r.keep_blocks);
    free(r.segment_topk); free(r.topk); free(r.topk_w);
    return ok;
}

/* ------------------------------------------------------------ decode */
static int check_decode(const golden_meta *m, const ei_keep_set *ks, const float *ref_pooled, const int32_t *ref_keep,
                        const char *what) {
    long n = m->n_tokens, W = m->window, L = n - W, h, i, j, kk = m->decode_budget - m->window;
    if (!m->compressed) {
        if (ks->compressed) FAIL("%s: compressed although n_tokens < decode_budget", what);
        for (h = 0; h < m->heads_out; ++h)
            for (i = 0; i < n; ++i)
                if (ks->n_kept != n || ks->index[h * ks->capacity + i] != i) FAIL("%s: uncompressed keep set is not every position", what);
        return 1;
    }
    if (!ks->compressed) FAIL("%s: not compressed", what);
    if (ks->n_kept != m->decode_budget) FAIL("%s: kept %d, expected %ld", what, ks->n_kept, m->decode_budget);
    for (h = 0; h < m->heads_out; ++h) {
        const int32_t *idx = ks->index + h * ks->capacity;
        const float *pooled = ks->pooled + h * ks->pooled_capacity, *rp = ref_pooled + h * L;
        double last = kk > 0 ? rp[ref_keep[h * kk + kk - 1]] : 0;
        for (j = 0; j < L; ++j)
            if (!close_to(pooled[j], rp[j], 1e-8, 1e-3)) FAIL("%s: pooled[%ld][%ld] = %.9g, reference %.9g", what, h, j, pooled[j], rp[j]);
        for (i = 0; i < ks->n_kept; ++i) {
            if (idx[i] < 0 || idx[i] >= n || (i > 0 && idx[i] <= idx[i - 1])) FAIL("%s: head %ld keep index not ascending/in range", what, h);
            if (i >= ks->n_kept - W && idx[i] != n - (ks->n_kept - i)) FAIL("%s: head %ld keep set lacks window position", what, h);
            if (idx[i] < L && rp[idx[i]] < last - (1e-8 + 1e-3 * last))
                FAIL("%s: head %ld keeps %d (score %g) below the reference's last kept (%g)", what, h, idx[i], rp[idx[i]], last);
        }
        for (j = 0; j < L; ++j)
            if (rp[j] > last * (1 + 1e-6) + 1e-30) {
                int found = 0;
                for (i = 0; i < ks->n_kept; ++i) found |= idx[i] == j;
                if (!found) FAIL("%s: head %ld misses position %ld (score %g > last kept %g)", what, h, j, rp[j], last);
            }
    }
    return 1;
}

static int run_decode(const golden_meta *m, char *summary) {
    size_t nk, nq;
    float *k = (float *)golden_load(m, "k.f32", 4, &nk), *oq = (float *)golden_load(m, "obs_q.f32", 4, &nq);
    float *ref_pooled = (float *)golden_load(m, "pooled.f32", 4, NULL);
    int32_t *ref_keep = (int32_t *)golden_load(m, "keep_idx.i32", 4, NULL);
    int ok = 1, d, p, configs = 0;
    if (!k || !oq || nk != (size_t)(m->n_tokens * m->n_kv_heads * m->head_dim) ||
        nq != (size_t)(m->window * m->n_heads * m->head_dim) || (m->compressed && (!ref_pooled || !ref_keep))) {
        snprintf(failure, sizeof failure, "missing or mis-sized case files");
        ok = 0;
    }
    for (d = 0; ok && d < 3; ++d) {
        ei_dtype dt = (ei_dtype)d;
        void *kd = to_dtype(k, nk, dt), *qd = to_dtype(oq, nq, dt);
        ei_tensor kt = ei_tensor_make(kd, dt, m->n_tokens, (int32_t)m->n_kv_heads, (int32_t)m->head_dim);
        ei_tensor qt = ei_tensor_make(qd, dt, m->window, (int32_t)m->n_heads, (int32_t)m->head_dim);
        for (p = EI_SIMD_SCALAR; ok && p < TEST_SIMD_END; ++p) {
            char what[128];
            ei_config c = golden_config(m);
            ei_context *ctx = NULL;
            ei_decoder dec;
            ei_keep_set ks;
            ei_sizes sz;
            ei_exec x;
            void *dmem, *ws;
            if (!ei_cpu_supports((ei_simd)p)) continue;
            snprintf(what, sizeof what, "%s/%s", dtype_name(dt), ei_simd_name((ei_simd)p));
            c.simd = (ei_simd)p;
            if (ei_context_create(&c, &ctx) != EI_OK || case_sizes(ctx, m, 0, &sz) != EI_OK) {
                snprintf(failure, sizeof failure, "%s: setup: %s", what, ei_last_error());
                ok = 0;
                ei_context_destroy(ctx);
                break;
            }
            dmem = malloc(sz.decoder);
            ws = malloc(sz.decode_keep);
            x = one_thread(ws, sz.decode_keep);
            memset(&ks, 0, sizeof ks);
            ks.heads_out = (int32_t)m->heads_out;
            ks.capacity = (int32_t)m->decode_budget;
            ks.index = (int32_t *)malloc(sizeof(int32_t) * ks.heads_out * ks.capacity);
            ks.pooled_capacity = m->n_tokens;
            ks.pooled = (float *)malloc(sizeof(float) * ks.heads_out * m->n_tokens);
            if (ei_decoder_init(ctx, &dec, (int32_t)m->n_heads, (int32_t)m->n_kv_heads, (int32_t)m->head_dim, dmem, sz.decoder) != EI_OK ||
                ei_decode_observe(ctx, &dec, &qt, kt.n_tokens - qt.n_tokens, 0) != EI_OK || /* the last window positions */
                ei_decode_keep(ctx, &x, &dec, &kt, &ks) != EI_OK) {
                snprintf(failure, sizeof failure, "%s: %s", what, ei_last_error());
                ok = 0;
            } else {
                ok = check_decode(m, &ks, ref_pooled, ref_keep, what);
                configs++;
            }
            free(ks.index); free(ks.pooled); free(dmem); free(ws);
            ei_context_destroy(ctx);
        }
        free(kd);
        free(qd);
    }
    sprintf(summary, "%d configurations (dtype x simd)", configs);
    free(k); free(oq); free(ref_pooled); free(ref_keep);
    return ok;
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "../shared/golden";
    char *names[4096];
    int n, i, passed = 0, failed = 0, skipped = 0;
    n = golden_cases(root, names, 4096, &skipped);
    if (n < 0) { printf("golden_runner: FAIL: cannot open the folder %s\n", root); return 2; }
    if (n == 0) {
        printf("golden_runner: FAIL: no golden cases in %s (%d subfolders without meta.txt): a case is a folder with a "
               "meta.txt (FORMAT.md); is the folder right?\n", root, skipped);
        return 2;
    }
    printf("golden cases in %s: %d", root, n);
    if (skipped) printf(" (%d subfolders without meta.txt skipped)", skipped);
    printf("; SIMD paths here:");
    print_simd_paths();
    printf("\n");
    for (i = 0; i < n; ++i) {
        golden_meta m;
        char path[1200], summary[256] = "";
        int ok;
        golden_join(path, sizeof path, root, names[i]);
        failure[0] = 0;
        if (!golden_read_meta(path, &m)) { ok = 0; snprintf(failure, sizeof failure, "unreadable meta.txt"); }
        else if (!strcmp(m.kind, "prefill")) ok = run_prefill(&m, summary);
        else if (!strcmp(m.kind, "decode")) ok = run_decode(&m, summary);
        else { ok = 0; snprintf(failure, sizeof failure, "unknown kind '%s'", m.kind); }
        if (ok) { passed++; printf("PASS %-28s %s %s\n", names[i], m.kind, summary); }
        else { failed++; printf("FAIL %-28s %s\n", names[i], failure); }
        free(names[i]);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
