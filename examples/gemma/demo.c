/* demo.c - Gemma 3 270M with entropyinfer in its global layers, side by side
   with the same engine attending densely.

     build/gemma-demo MODEL.gguf [n_prompt [base_budget [threshold_len [decode_budget]]]]   (make demo)

   The document is Debian's licence texts (every file in /usr/share/common-licenses),
   n_prompt tokens (default 16384) of prompt and 256 tokens of continuation.
   Defaults: ei_config_quality() with the paper's threshold_len (4096) and base
   budget (2048), decode_budget a quarter of the prompt. About two minutes on
   two cores; the prompt length is where the global layers' share of the
   prefill is large enough for the whole prefill to change visibly.
   For each mode (dense: ei_attention_prefill with plan NULL; entropyinfer:
   ei_profile_chunk + sparse ei_attention_prefill, then decode compression)
   it reports prefill time, global-layer attention time, perplexity and
   top-1 agreement on the tokens of the segments that attend sparsely, the
   same on the continuation fed after the decode-time KV compression, KV
   bytes before/after compression, decode speed and a few greedy tokens.
   It writes an entropy heatmap of the global layers to build/gemma_entropy.svg.

   Gemma 3 270M has 18 layers, of which 3 are global (5, 11, 17); the 15
   local layers use a 512-token sliding window and stay dense.

   Configuration: ei_config_quality() (the sampled block ranking, top-p keep
   counts, sink and local blocks); GEMMA_DEMO_PAPER=1 runs the paper's
   ei_config_default() instead. Decode compression: one keep set per layer
   (and kv head) by default; GEMMA_EI_SHARED=1 one shared keep set for the
   three global layers (ei_decode_shared_add, as an engine with shared KV
   cells must); GEMMA_DEMO_REDUCE=max: gqa_reduce max (heads, and layers of
   a shared set, by their maximum) instead of the mean; GEMMA_DEMO_POLICY=
   streaming|snapkv|h2o: that decode policy instead of the paper's
   (entropyinfer), at the same budget (issue 37's baselines);
   GEMMA_DEMO_TEXT=path: that text file instead of the licences;
   GEMMA_DEMO_RECENT=r: decode_recent r (the newest r x budget positions kept
   by recency; 0, the default, is the paper's).

   Consistency check: GEMMA_DEMO_OWN=1 makes the second run use the engine's
   own dense attention instead of entropyinfer (expected: identical
   perplexity, 100% agreement with the library's dense attention). A
   decode_budget above the prompt length likewise must give 100% on the
   continuation (nothing evicted). */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#ifndef GEMMA_WITH_EI
#error "built with -DGEMMA_WITH_EI (examples/gemma/gemma.mk): this program runs entropyinfer"
#endif

#define N_CONT 256
#define N_GEN 24
/* positions a run holds at most: the prompt, the continuation and the generated tokens */
#define MAX_CTX(n_prompt) ((n_prompt) + N_CONT + N_GEN + 8)
/* Prompt rows scored for perplexity and agreement, evenly spaced over the
   sparse segments: one row's logits (262,144 x 640) cost about a third of a
   token's whole forward pass, so scoring every row of a 16k prompt would take
   as long as its prefill. */
#define N_SCORED 1024

typedef struct run_result {
    double t_prefill, t_attn_global, t_profile, t_attn_local, t_matmul;
    score_acc prompt_acc, cont_acc;
    int32_t *prompt_argmax, cont_argmax[N_CONT];
    int64_t n_scored;
    int64_t kv_global_before, kv_global_after, kv_all_before, kv_all_after;
    double t_compress, decode_tps;
    int32_t gen[N_GEN];
    int n_gen;
} run_result;

static int64_t kv_global_bytes(const gm_state *s) {
    int64_t b = 0;
    int l;
    for (l = 0; l < s->m->hp.n_layer; l++)
        if (s->m->layers[l].is_global) b += s->cache_len[l];
    return b * s->m->hp.n_kv_head * s->m->hp.head_dim * 2 * (int64_t)sizeof(float);
}

/* local layers only need their window; count what a ring buffer would hold */
static int64_t kv_needed_bytes(const gm_state *s) {
    int64_t b = 0;
    int l;
    for (l = 0; l < s->m->hp.n_layer; l++)
        b += s->m->layers[l].is_global ? s->cache_len[l]
                                       : (s->cache_len[l] < s->m->hp.sliding_window ? s->cache_len[l] : s->m->hp.sliding_window);
    return b * s->m->hp.n_kv_head * s->m->hp.head_dim * 2 * (int64_t)sizeof(float);
}

static void write_heatmap(const char *path, const gm_state *s, const ei_config *cfg) {
    const gm_model *m = s->m;
    FILE *f = fopen(path, "w");
    int l, h, seg, row = 0, n_rows = 0, n_seg = 0;
    const int cw = 84, ch = 34, x0 = 160, y0 = 60;
    float emax = 1e-9f;
    if (!f) return;
    for (l = 0; l < m->hp.n_layer; l++)
        if (m->layers[l].is_global) {
            const ei_plan *p = &s->plans[l];
            n_rows += p->n_kv_heads;
            n_seg = p->n_segments;
            for (h = 0; h < p->n_kv_heads; h++)
                for (seg = 1; seg < p->n_segments; seg++)
                    if (p->entropy[(size_t)h * p->seg_capacity + seg] > emax) emax = p->entropy[(size_t)h * p->seg_capacity + seg];
        }
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' font-size='12'>\n",
            x0 + cw * n_seg + 40 > 960 ? x0 + cw * n_seg + 40 : 960, y0 + ch * n_rows + 90);
    fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
    fprintf(f, "<text x='10' y='22' font-size='15'>Gemma 3 270M, global layers: profiling entropy per kv head x query segment</text>\n");
    fprintf(f, "<text x='10' y='42'>segment %d tokens, block %d, threshold_len %lld, base_budget %d; cell: entropy (nats) / kept blocks of 8 keys; thick border: sparse segment</text>\n",
            cfg->segment_size, cfg->block_size, (long long)cfg->threshold_len, cfg->base_budget);
    for (l = 0; l < m->hp.n_layer; l++) {
        const ei_plan *p;
        if (!m->layers[l].is_global) continue;
        p = &s->plans[l];
        for (h = 0; h < p->n_kv_heads; h++, row++) {
            int rigid = p->head_class[h] == EI_HEAD_RIGID;
            int y = y0 + row * ch;
            fprintf(f, "<text x='10' y='%d'>layer %d kv %d: %s</text>\n", y + ch / 2 + 4, l, h, rigid ? "RIGID" : "dynamic");
            for (seg = 0; seg < p->n_segments; seg++) {
                size_t r = (size_t)h * p->seg_capacity + seg;
                float e = p->entropy[r], t = seg == 0 ? 0.0f : e / emax;
                int R = (int)(255 - 200 * t), G = (int)(255 - 120 * t), B = 255;
                int sparse = ei_plan_segment_is_sparse(s->ei, p, seg);
                fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='rgb(%d,%d,%d)' stroke='%s' stroke-width='%d'/>\n",
                        x0 + seg * cw, y, cw - 2, ch - 2, R, G, B, sparse ? "black" : "#bbb", sparse ? 3 : 1);
                if (seg == 0)
                    fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>(%.2f)</text>\n", x0 + seg * cw + cw / 2, y + ch / 2 + 4, e);
                else if (sparse)
                    fprintf(f, "<text x='%d' y='%d' text-anchor='middle' font-size='11'>%.2g/%d</text>\n", x0 + seg * cw + cw / 2, y + ch / 2 + 4, e,
                            p->keep_count[r]);
                else
                    fprintf(f, "<text x='%d' y='%d' text-anchor='middle' font-size='11'>%.2g/dense</text>\n", x0 + seg * cw + cw / 2, y + ch / 2 + 4, e);
            }
        }
    }
    for (seg = 0; seg < n_seg; seg++)
        fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>seg %d</text>\n", x0 + seg * cw + cw / 2, y0 + row * ch + 16, seg);
    fprintf(f, "<text x='10' y='%d'>RIGID: every entropy of segments 1.. below e_t = %g (fixed base budget); dynamic: budget follows the entropy's relative change.</text>\n",
            y0 + row * ch + 44, (double)cfg->rigid_entropy);
    fprintf(f, "<text x='10' y='%d'>Segment 0 has no earlier blocks (uniform, shown in parentheses); darker = higher entropy (flatter attention).</text>\n",
            y0 + row * ch + 64);
    fprintf(f, "</svg>\n");
    fclose(f);
}

static int run(const gm_model *m, gm_pool *pool, gm_attn_mode mode, const ei_config *cfg, const int32_t *ids,
               int64_t n_prompt, int64_t lo, int64_t hi, run_result *res, char *err, size_t errlen) {
    gm_state s;
    const int Dm = m->hp.d_model, V = m->hp.n_vocab;
    float *hidden = NULL, *logits = NULL;
    double t0;
    int i, gap = cfg->decode_gap;
    int32_t next;
    memset(res, 0, sizeof(*res));
    if (gm_state_init(&s, m, pool, MAX_CTX(n_prompt), cfg->segment_size, mode, cfg, err, errlen)) return -1;
    hidden = (float *)malloc((size_t)n_prompt * Dm * sizeof(float));
    logits = (float *)malloc((size_t)64 * V * sizeof(float));
    res->prompt_argmax = (int32_t *)malloc((size_t)N_SCORED * sizeof(int32_t));
    if (!hidden || !logits || !res->prompt_argmax) { snprintf(err, errlen, "out of memory"); return -1; }

    t0 = gm_now();
    if (gm_prefill(&s, ids, n_prompt, hidden, err, errlen)) return -1;
    res->t_prefill = gm_now() - t0;
    res->t_attn_global = s.stats.t_attn_global;
    res->t_profile = s.stats.t_profile;
    res->t_attn_local = s.stats.t_attn_local;
    res->t_matmul = s.stats.t_matmul;
    /* quality over N_SCORED tokens of the sparse segments: position i predicts
       i+1; the rows are gathered to the front of hidden (the prefill is done) */
    {
        const int64_t stride = (hi - lo + N_SCORED - 1) / N_SCORED;
        int32_t targets[N_SCORED];
        int64_t r;
        for (r = 0; lo + r * stride < hi; r++) {
            memmove(hidden + (size_t)r * Dm, hidden + (size_t)(lo + r * stride) * Dm, (size_t)Dm * sizeof(float));
            targets[r] = ids[lo + r * stride + 1];
        }
        res->n_scored = r;
        score_rows(&s, hidden, r, targets, res->prompt_argmax, logits, 64, &res->prompt_acc);
    }
    res->kv_global_before = kv_global_bytes(&s);
    res->kv_all_before = kv_needed_bytes(&s);

    /* continuation: teacher-forced through the decode path in batches of
       decode_gap tokens; compression fires after the first batch */
    {
        const int32_t *cont = ids + n_prompt;
        int done = 0, last_b = 1;
        gm_logits(&s, hidden + (size_t)(n_prompt - 1) * Dm, 1, logits);
        while (done < N_CONT) {
            int b = N_CONT - done < gap ? N_CONT - done : gap;
            if (gm_decode(&s, cont + done, b, hidden, err, errlen)) return -1;
            if (done == 0) {
                res->kv_global_after = kv_global_bytes(&s);
                res->kv_all_after = kv_needed_bytes(&s);
            }
            /* rows predict cont[done+1 ..]; score only what is fed after the compression */
            if (done >= gap || done + b > gap) {
                int first = done >= gap ? 0 : gap - done, nr = b - first; /* ids go on past the continuation */
                if (nr > 0)
                    score_rows(&s, hidden + (size_t)first * Dm, nr, cont + done + first + 1, res->cont_argmax + done + first, logits,
                               64, &res->cont_acc);
            }
            done += b;
            last_b = b;
        }
        res->t_compress = s.stats.t_compress;
        /* greedy decoding after everything above */
        gm_logits(&s, hidden + (size_t)(last_b - 1) * Dm, 1, logits);
    }
    next = argmax_row(logits, V);
    t0 = gm_now();
    for (i = 0; i < N_GEN; i++) {
        res->gen[i] = next;
        if (gm_decode(&s, &next, 1, hidden, err, errlen)) return -1;
        gm_logits(&s, hidden, 1, logits);
        next = argmax_row(logits, V);
    }
    res->n_gen = N_GEN;
    res->decode_tps = N_GEN / (gm_now() - t0);
    if (mode == GM_ATTN_EI_SPARSE) {
        int l;
        write_heatmap("build/gemma_entropy.svg", &s, cfg);
        printf("\nentropyinfer plan of the global layers (kv head 0; budget in tokens / keys attended per sparse segment):\n");
        for (l = 0; l < m->hp.n_layer; l++) {
            const ei_plan *p = &s.plans[l];
            int seg;
            double dens = 0;
            int nsp = 0;
            if (!m->layers[l].is_global) continue;
            printf("  layer %2d  %-7s  entropy:", l, p->head_class[0] == EI_HEAD_RIGID ? "RIGID" : "dynamic");
            for (seg = 1; seg < p->n_segments; seg++) printf(" %.2g", p->entropy[seg]);
            printf("\n                     kept:   ");
            for (seg = 1; seg < p->n_segments; seg++) {
                int sp = ei_plan_segment_is_sparse(s.ei, p, seg);
                int kept = p->keep_count[seg] * p->block_size;
                printf(" %s%d", sp ? "" : "(dense)", sp ? kept : seg * p->segment_size);
                if (sp) { dens += (double)(kept + p->segment_size / 2) / (double)(seg * p->segment_size + p->segment_size / 2); nsp++; }
            }
            if (nsp) printf("   -> mean density of sparse segments %.1f%%", 100.0 * dens / nsp);
            printf("\n");
        }
    }
    free(hidden);
    free(logits);
    gm_state_free(&s);
    return 0;
}

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : ".cache/model/gemma-3-270m-q4_k_m.gguf";
    int64_t n_prompt = argc > 2 ? atoll(argv[2]) : 16384, n_all, lo, hi, i, agree = 0, cagree = 0, ncont = 0;
    gm_model m;
    gm_pool *pool;
    char err[512], buf[4096];
    size_t len;
    char *text;
    int32_t *ids;
    /* the library's best measured configuration (the paper's, with the sampled
       block ranking, top-p counts, sink and local blocks); GEMMA_DEMO_PAPER=1:
       the paper's own ranking and budgets */
    ei_config cfg = getenv("GEMMA_DEMO_PAPER") ? ei_config_default() : ei_config_quality();
    const char *policy = getenv("GEMMA_DEMO_POLICY") ? getenv("GEMMA_DEMO_POLICY") : "entropyinfer";
    const char *doc = getenv("GEMMA_DEMO_TEXT") && *getenv("GEMMA_DEMO_TEXT") ? getenv("GEMMA_DEMO_TEXT") : NULL;
    run_result rd, rs;
    if (getenv("GEMMA_DEMO_REDUCE") && !strcmp(getenv("GEMMA_DEMO_REDUCE"), "max")) cfg.gqa_reduce = EI_REDUCE_MAX;
    if (getenv("GEMMA_DEMO_RECENT")) cfg.decode_recent = (float)atof(getenv("GEMMA_DEMO_RECENT"));
    if (!strcmp(policy, "streaming")) cfg.decode_policy = EI_DECODE_STREAMING;
    else if (!strcmp(policy, "snapkv")) cfg.decode_policy = EI_DECODE_SNAPKV;
    else if (!strcmp(policy, "h2o")) cfg.decode_policy = EI_DECODE_H2O;
    else if (strcmp(policy, "entropyinfer")) {
        fprintf(stderr, "gemma-demo: GEMMA_DEMO_POLICY %s: expected entropyinfer, streaming, snapkv or h2o\n", policy);
        return 2;
    }
    double t_start = gm_now();

    if (gm_model_load(&m, model, err, sizeof err)) { fprintf(stderr, "gemma-demo: %s\n", err); return 1; }
    text = doc ? load_text_file(doc, &len) : load_licences(&len);
    if (!text) { fprintf(stderr, "gemma-demo: cannot read %s\n", doc ? doc : "/usr/share/common-licenses"); return 1; }
    ids = tokenize_all(&m.tok, text, len, 1, &n_all);
    if (!ids || n_all < n_prompt + N_CONT + 1) { fprintf(stderr, "gemma-demo: document too short\n"); return 1; }
    pool = gm_pool_create(gm_default_threads());

    /* Prefill: the preset's threshold_len and base budget (the paper's 4096
       and 2048). Decode: a budget of a quarter of the prompt, since a fixed
       1024 positions loses more the longer the prompt (docs/quality.md). */
    if (argc > 4) cfg.threshold_len = atoll(argv[4]);
    if (argc > 3) cfg.base_budget = atoi(argv[3]);
    cfg.decode_budget = argc > 5 ? atoi(argv[5]) : (int32_t)(n_prompt / 4);
    if (cfg.decode_policy == EI_DECODE_H2O) cfg.decode_positions = MAX_CTX(n_prompt); /* its sums' rows */
    lo = (cfg.threshold_len + cfg.segment_size - 1) / cfg.segment_size * cfg.segment_size;
    hi = (n_prompt + cfg.segment_size - 1) / cfg.segment_size * cfg.segment_size - cfg.segment_size; /* last segment dense */
    if (hi > n_prompt - 1) hi = n_prompt - 1;
    if (hi <= lo) { fprintf(stderr, "gemma-demo: prompt too short for sparse segments\n"); return 1; }

    printf("Gemma 3 270M (%s), %d threads, entropyinfer %s (SIMD: %s)\n", model, gm_pool_size(pool), EI_VERSION_STRING,
           ei_simd_name(EI_SIMD_AUTO));
    printf("document: %s (%zu bytes, %lld tokens); prompt %lld tokens + %d continuation + %d generated\n",
           doc ? doc : "/usr/share/common-licenses/*", len, (long long)n_all, (long long)n_prompt, N_CONT, N_GEN);
    printf("config: segment %d, block %d, threshold_len %lld, base_budget %d (x%.0f..x%.0f), e_t %g, delta_t %.2f, alpha %.2f,\n"
           "        decode_budget %d, window %d, decode_gap %d, decode policy %s (decode_recent %g), %s keep sets, %s plans,\n"
           "        ranking %s (%d sampled rows%s%s), top_p %g, sink blocks %d, local blocks %d%s\n",
           cfg.segment_size, cfg.block_size, (long long)cfg.threshold_len, cfg.base_budget, (double)cfg.budget_min_factor,
           (double)cfg.budget_max_factor, (double)cfg.rigid_entropy, (double)cfg.delta_t, (double)cfg.alpha, cfg.decode_budget,
           cfg.window, cfg.decode_gap, policy, (double)cfg.decode_recent, gm_ei_shared_env() ? "shared" : "per-layer",
           cfg.per_segment_budget ? "per-segment" : "ragged",
           cfg.ranking == EI_RANK_SAMPLED ? "sampled attention mass" : "reference block score", cfg.rank_samples,
           cfg.rank_rows == EI_RANK_ROWS_SPREAD ? ", farthest-point" : "",
           cfg.rank_precision == EI_RANK_PRECISION_INT8 ? ", int8 scores" : "", cfg.top_p,
           cfg.sink_blocks, cfg.local_blocks,
           cfg.ranking == EI_RANK_SAMPLED ? " (ei_config_quality; GEMMA_DEMO_PAPER=1: the paper's)" : " (the paper's)");
    printf("NOTE: only the 3 global layers (5, 11, 17) use entropyinfer; the 15 sliding-window layers and the matmuls\n"
           "      stay as they are, so the whole prefill gains at most the global layers' share of it.\n");
    printf("sparse segments cover prompt tokens [%lld, %lld) = %lld tokens; quality scored on %d of them, evenly spaced\n",
           (long long)lo, (long long)hi, (long long)(hi - lo),
           (int)((hi - lo + (hi - lo + N_SCORED - 1) / N_SCORED - 1) / ((hi - lo + N_SCORED - 1) / N_SCORED)));
    fflush(stdout);

    if (run(&m, pool, GM_ATTN_EI_DENSE, &cfg, ids, n_prompt, lo, hi, &rd, err, sizeof err)) { fprintf(stderr, "dense: %s\n", err); return 1; }
    if (run(&m, pool, getenv("GEMMA_DEMO_OWN") ? GM_ATTN_DENSE_OWN : GM_ATTN_EI_SPARSE, &cfg, ids, n_prompt, lo, hi, &rs, err, sizeof err)) { fprintf(stderr, "entropyinfer: %s\n", err); return 1; }

    for (i = 0; i < rd.n_scored; i++) agree += rd.prompt_argmax[i] == rs.prompt_argmax[i];
    for (i = cfg.decode_gap; i < N_CONT; i++, ncont++) cagree += rd.cont_argmax[i] == rs.cont_argmax[i];

    printf("\n%-52s %16s %16s %9s\n", "", "dense", "entropyinfer", "gain");
    printf("%-52s %15.2fs %15.2fs %8.2fx\n", "prefill (whole model)", rd.t_prefill, rs.t_prefill, rd.t_prefill / rs.t_prefill);
    printf("%-52s %15.3fs %15.3fs %8.2fx\n", "  global-layer attention (profiling included)", rd.t_attn_global, rs.t_attn_global,
           rd.t_attn_global / rs.t_attn_global);
    printf("%-52s %15s %15.3fs\n", "    of which profiling", "-", rs.t_profile);
    printf("%-52s %15.3fs %15.3fs\n", "  local-layer attention (dense in both)", rd.t_attn_local, rs.t_attn_local);
    printf("%-52s %15.2fs %15.2fs\n", "  matmuls", rd.t_matmul, rs.t_matmul);
    printf("%-52s %16.4f %16.4f\n", "perplexity, sparse-segment tokens", exp(rd.prompt_acc.nll / rd.prompt_acc.n),
           exp(rs.prompt_acc.nll / rs.prompt_acc.n));
    printf("%-52s %16s %15.2f%%\n", "top-1 agreement with dense, sparse-segment tokens", "-", 100.0 * agree / (double)rd.n_scored);
    printf("%-52s %16.4f %16.4f\n", "perplexity, continuation after compression", exp(rd.cont_acc.nll / rd.cont_acc.n),
           exp(rs.cont_acc.nll / rs.cont_acc.n));
    printf("%-52s %16s %15.2f%%\n", "top-1 agreement with dense, continuation", "-", 100.0 * cagree / (double)ncont);
    printf("%-52s %13.2f MB %13.2f MB\n", "KV cache of global layers before compression", rd.kv_global_before / 1048576.0,
           rs.kv_global_before / 1048576.0);
    printf("%-52s %13.2f MB %13.2f MB %8.2fx\n", "KV cache of global layers after compression", rd.kv_global_after / 1048576.0,
           rs.kv_global_after / 1048576.0, (double)rd.kv_global_after / (double)rs.kv_global_after);
    printf("%-52s %13.2f MB %13.2f MB %8.2fx\n", "KV cache all layers (local: 512-token window) after", rd.kv_all_after / 1048576.0,
           rs.kv_all_after / 1048576.0, (double)rd.kv_all_after / (double)rs.kv_all_after);
    printf("%-52s %15s %15.4fs\n", "compression time (keep-set + compaction, 3 layers)", "-", rs.t_compress);
    printf("%-52s %11.2f tok/s %11.2f tok/s\n", "greedy decode speed", rd.decode_tps, rs.decode_tps);
    detok(&m.tok, rd.gen, rd.n_gen, buf, sizeof buf);
    printf("\ngreedy, dense:        \"%s\"\n", buf);
    detok(&m.tok, rs.gen, rs.n_gen, buf, sizeof buf);
    printf("greedy, entropyinfer: \"%s\"\n", buf);
    printf("\nentropy heatmap: build/gemma_entropy.svg; total demo time %.1f s\n", gm_now() - t_start);

    free(rd.prompt_argmax);
    free(rs.prompt_argmax);
    free(ids);
    free(text);
    gm_pool_destroy(pool);
    gm_model_free(&m);
    return 0;
}
