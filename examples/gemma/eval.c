/* eval.c - long-context quality of entropyinfer on Gemma 3 270M (not in CI).

     build/gemma-eval MODEL.gguf build/eval.md [contexts] [passkey_contexts] [text] [name=value ...]
         contexts          comma list, default 8192,16384,32768
         passkey_contexts  comma list, default 8192,16384 ("" for none)
         text              a UTF-8 text file, or "licences" (default): the
                           regular files of /usr/share/common-licenses
       Options for sweeps (the sparse modes; default: the paper's values):
         base_budget=N     base key budget (tokens), paper 2048
         segment=N         query segment (tokens, a divisor of 512, the prefill micro-batch), paper 512
         block=N           key block (tokens), paper 8
         ranking=reference|sampled|antidiagonal
                           block ranking (entropyinfer.h CONCEPTS: ranking). reference
                           (default): the paper's configuration; sampled: the library's
                           preset ei_config_quality() (sampled attention mass, top-p
                           budgets, sink and local blocks). The options below override
                           either.
         samples=N         rank_samples: query rows (sampled) or query tiles (antidiagonal) per segment and kv head
         precision=f32|int8  rank_precision: the sampled ranking's score arithmetic
         rows=even|spread  rank_rows: which query rows the sampled ranking scores
         top_p=P           top-p keep counts, P in (0, 1]; 0: counts from the budget recurrence
         max_factor=F      budget_max_factor: budgets (and top-p counts) up to F x base (paper 3)
         sink=N            sink_blocks: key blocks from position 0 always kept
         local=N           local_blocks: key blocks just before the segment always kept
         dense_layers=L,.. global layers kept dense (the engine's dense_layers)
         oracle=0          skip the oracle row (below)
         estimate=NAME     (with oracle=1) the oracle row ranks by an estimator instead of
                           the true mass, at the plan's counts, and only dense and that row
                           run: even | strat | rand | fps | fpsw | sfps | sfpsh (the row
                           choices compared in docs/quality.md, "Rows where the queries
                           differ"; described above est_pick); estimate_rows=N (64),
                           estimate_seed=S; shortlist=F: the estimator's rows see only
                           the F x cap blocks a cheap score rates highest (with the sink
                           and local blocks), shortlist_by=ref|mean|bound,
                           shortlist_rows=N, shortlist_norm=full (described above
                           est_shortlist)
         mass=1            also measure the attention mass that the ragged (and
                           per-segment) plans keep, as the oracle row does (costs a
                           dense softmax pass per sparse segment)
         no_reference=1    skip the bf16 K/V reference row
         dense_cache=DIR   reuse the dense mode's results (perplexity row, arg-maxes,
                           passkey answers) stored in DIR by an earlier run on the
                           same model file size, tokens and positions (sweeps)

   Modes (global layers; the 15 sliding-window layers are dense in all):
     dense        ei_attention_prefill with plan NULL
     ragged       the paper's configuration (threshold 4096, base budget 2048,
                  segment 512, block 8), each kv head its own budget
     per-segment  the same with per_segment_budget = 1 (the reference's max
                  over heads applied to every head); not run on a model with
                  one kv head per layer, where it is the ragged plan
     oracle       (perplexity table only, a diagnostic) the ragged plan's
                  counts, its blocks re-ranked by the attention mass that dense
                  softmax puts on them: the best any block selector could do at
                  the same budget. It separates what the budget costs from what
                  the reference's block score costs (it costs a dense pass).
     bf16 K/V     dense with K/V rounded to bf16: a common precision change,
                  for scale
   1. Perplexity and top-1 agreement with dense over the prompt tokens of the
      segments that attend sparsely ([4096, start of the last segment)) of
      the first L tokens of the text. Above 4096 scored
      positions the positions are subsampled with a fixed stride (the same
      positions in every mode).
   2. Passkey retrieval: a 5-digit key at 10/50/90% depth of filler text,
      then a question; greedy decoding must reproduce the key.
   Writes a markdown report to the given path and, beside it, the same results
   as JSON (the path with ".md" replaced by ".json", or ".json" appended):
     {"model", "text", "tokens_in_text", "threads", "complete" (false while the
      run is under way: the file is rewritten after every row),
      "config": {ranking, rank_samples, rank_precision, top_p, sink_blocks, local_blocks,
                 base_budget, segment_size, block_size, threshold_len, ...},
      "rows": one per (context, mode) of the perplexity table: context, mode
              (dense | ragged | per_segment | oracle | bf16kv), ranking
              ("reference" | "sampled" | "oracle"; null for the dense modes),
              perplexity, ppl_vs_dense_pct, agreement_pct, density (a fraction,
              0..1), attention_s (global layers), prefill_s (both without the
              oracle's and mass=1's dense passes), mass_kept_pct (null
              where not measured; the oracle row: the oracle's), on the oracle row
              (and with mass=1 the ragged rows) mass_kept_plan_pct and
              mass_kept_oracle_pct, and the config fields,
      "passkey": null, or {"contexts", "results": [{mode, hits, total}],
                 "trials": [{context, tokens, depth, key, <mode>: {ok, answer}}]},
      "total_s"}
   Numbers that are not finite are written as null. examples/gemma/plot_curves.py
   draws quality-vs-density curves from any number of these files (`make eval`). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>

#include "common.h"

#ifndef GEMMA_WITH_EI
#error "built with -DGEMMA_WITH_EI (examples/gemma/gemma.mk): this program runs entropyinfer"
#endif

enum { M_DENSE, M_RAGGED, M_PERSEG, M_ORACLE, M_BF16KV, N_MODES };
static const char *mode_name[N_MODES] = {"dense", "entropyinfer ragged", "entropyinfer per-segment",
                                         "ragged counts, oracle block ranking (diagnostic)",
                                         "dense, bf16 K/V cache (reference)"};

/* name=value on the command line: the configuration of the sparse modes, for
   sweeps (0 or -1: not given, the base configuration's value) */
static struct {
    int32_t base_budget, segment, block, oracle, no_reference, mass;
    int32_t ranking;      /* -1: not given (the paper's configuration); EI_RANK_* */
    int32_t samples;      /* 0: not given */
    int32_t precision;    /* -1: not given; EI_RANK_PRECISION_* (rank_precision) */
    int32_t rows;         /* -1: not given; EI_RANK_ROWS_* (rank_rows) */
    int32_t sink, local;  /* -1: not given */
    double top_p;         /* -1: not given */
    double max_factor;    /* -1: not given (budget_max_factor) */
    uint64_t dense_layers;
    const char *dense_cache; /* NULL: dense rows are computed in every run */
} ovr = {0, 0, 0, 1, 0, 0, -1, 0, -1, -1, -1, -1, -1.0, -1.0, 0, NULL};

/* the oracle row's estimator (estimate=, below the oracle selection) */
enum { EST_NONE, EST_EVEN, EST_STRAT, EST_RAND, EST_FPS, EST_FPSW, EST_SFPS, EST_SFPSH };
static int est_kind = EST_NONE;
static int32_t est_rows = 64, est_seed = 1;
/* shortlist=F (with estimate=; issue 35, docs/quality.md "Shortlists"): the
   estimator's rows see only the blocks of a shortlist, the F x cap blocks
   (cap: budget_max_factor x base_budget) that a cheap score rates highest,
   with the sink and local blocks; each row's softmax is over those keys and
   its own segment's. */
static double est_shortlist = 0.0;
/* shortlist_by=ref (the reference block score: the plan's EI_PLAN_SCORES row,
   which every ranking computes for the entropy) | mean (the rows against each
   block's mean key: a softmax over blocks of q . mean) | bound (the rows
   against each block's per-dimension key max and min: Quest's upper bound of
   q.k in the block); shortlist_rows=N: the first N of the estimator's rows
   score the shortlist (0: all) */
enum { SL_REF, SL_MEAN, SL_BOUND };
static int sl_by = SL_REF;
static int32_t sl_rows = 0;
static int32_t sl_fullnorm = 0; /* shortlist_norm=full: each row's softmax over every key (a diagnostic: what the
                                   shortlist costs by its blocks alone), the mass kept only for the shortlist's */

/* any option beyond the ranking that changes the sparse modes */
static int ovr_changes_config(void) {
    return ovr.base_budget > 0 || ovr.segment > 0 || ovr.block > 0 || ovr.samples > 0 || ovr.top_p >= 0 || ovr.sink >= 0 ||
           ovr.max_factor >= 0 || ovr.precision >= 0 || ovr.rows >= 0 ||
           ovr.local >= 0 || ovr.dense_layers;
}

/* ranking=sampled starts from the library's preset (ei_config_quality), anything
   else from the paper's configuration; the options given override either */
static ei_config mode_config(int mode) {
    ei_config c = ovr.ranking >= EI_RANK_SAMPLED ? ei_config_quality() : ei_config_default();
    c.per_segment_budget = mode == M_PERSEG;
    if (ovr.ranking >= 0) c.ranking = (ei_ranking)ovr.ranking;
    if (ovr.base_budget > 0) c.base_budget = ovr.base_budget;
    if (ovr.segment > 0) c.segment_size = ovr.segment;
    if (ovr.block > 0) c.block_size = ovr.block;
    if (ovr.samples > 0) c.rank_samples = ovr.samples;
    if (ovr.precision >= 0) c.rank_precision = (ei_rank_precision)ovr.precision;
    if (ovr.rows >= 0) c.rank_rows = (ei_rank_rows)ovr.rows;
    if (ovr.top_p >= 0) c.top_p = ovr.top_p;
    if (ovr.max_factor >= 0) c.budget_max_factor = ovr.max_factor;
    if (ovr.sink >= 0) c.sink_blocks = ovr.sink;
    if (ovr.local >= 0) c.local_blocks = ovr.local;
    return c;
}

static const char *ranking_id(ei_ranking r) {
    return r == EI_RANK_SAMPLED ? "sampled" : r == EI_RANK_ANTIDIAGONAL ? "antidiagonal" : "reference";
}

/* a whole non-negative integer (no trailing characters) */
static int parse_count(const char *s, int32_t *out) {
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 0 || v > INT32_MAX) return -1;
    *out = (int32_t)v;
    return 0;
}

static int parse_override(const char *arg) {
    if (!strncmp(arg, "dense_layers=", 13)) { /* comma list of layer numbers */
        const char *p = arg + 13;
        for (; *p; p = *p == ',' ? p + 1 : p) {
            char *end;
            long l = strtol(p, &end, 10);
            if (end == p || l < 0 || l > 63) return -1;
            ovr.dense_layers |= (uint64_t)1 << l;
            p = end;
        }
        return 0;
    }
    if (!strncmp(arg, "dense_cache=", 12)) {
        ovr.dense_cache = arg + 12;
        return *ovr.dense_cache ? 0 : -1;
    }
    if (!strncmp(arg, "ranking=", 8)) {
        if (!strcmp(arg + 8, "reference")) ovr.ranking = EI_RANK_REFERENCE;
        else if (!strcmp(arg + 8, "sampled")) ovr.ranking = EI_RANK_SAMPLED;
        else if (!strcmp(arg + 8, "antidiagonal")) ovr.ranking = EI_RANK_ANTIDIAGONAL;
        else return -1;
        return 0;
    }
    if (!strncmp(arg, "rows=", 5)) {
        if (!strcmp(arg + 5, "even")) ovr.rows = EI_RANK_ROWS_EVEN;
        else if (!strcmp(arg + 5, "spread")) ovr.rows = EI_RANK_ROWS_SPREAD;
        else return -1;
        return 0;
    }
    if (!strncmp(arg, "estimate=", 9)) {
        static const char *names[] = {"none", "even", "strat", "rand", "fps", "fpsw", "sfps", "sfpsh"};
        int k;
        for (k = 0; k < 8; k++)
            if (!strcmp(arg + 9, names[k])) { est_kind = k; return 0; }
        return -1;
    }
    if (!strncmp(arg, "estimate_rows=", 14)) return parse_count(arg + 14, &est_rows) || est_rows < 1 ? -1 : 0;
    if (!strncmp(arg, "estimate_seed=", 14)) return parse_count(arg + 14, &est_seed);
    if (!strncmp(arg, "shortlist_by=", 13)) {
        if (!strcmp(arg + 13, "ref")) sl_by = SL_REF;
        else if (!strcmp(arg + 13, "mean")) sl_by = SL_MEAN;
        else if (!strcmp(arg + 13, "bound")) sl_by = SL_BOUND;
        else return -1;
        return 0;
    }
    if (!strcmp(arg, "shortlist_norm=full")) { sl_fullnorm = 1; return 0; }
    if (!strncmp(arg, "shortlist_rows=", 15)) return parse_count(arg + 15, &sl_rows);
    if (!strncmp(arg, "shortlist=", 10)) {
        char *end;
        est_shortlist = strtod(arg + 10, &end);
        return end == arg + 10 || *end || !(est_shortlist > 0) ? -1 : 0;
    }
    if (!strncmp(arg, "precision=", 10)) {
        if (!strcmp(arg + 10, "f32")) ovr.precision = EI_RANK_PRECISION_F32;
        else if (!strcmp(arg + 10, "int8")) ovr.precision = EI_RANK_PRECISION_INT8;
        else return -1;
        return 0;
    }
    if (!strncmp(arg, "max_factor=", 11)) {
        char *end;
        double v;
        errno = 0;
        v = strtod(arg + 11, &end);
        if (end == arg + 11 || *end || errno || !(v >= 1.0 && v <= 64.0)) return -1;
        ovr.max_factor = v;
        return 0;
    }
    if (!strncmp(arg, "top_p=", 6)) {
        char *end;
        double v;
        errno = 0;
        v = strtod(arg + 6, &end);
        if (end == arg + 6 || *end || errno || !(v >= 0.0 && v <= 1.0)) return -1;
        ovr.top_p = v;
        return 0;
    }
    {
        static const struct { const char *name; int32_t *v; } keys[] = {
            {"base_budget=", &ovr.base_budget}, {"segment=", &ovr.segment}, {"block=", &ovr.block},
            {"oracle=", &ovr.oracle}, {"no_reference=", &ovr.no_reference}, {"mass=", &ovr.mass},
            {"samples=", &ovr.samples}, {"sink=", &ovr.sink}, {"local=", &ovr.local}};
        size_t i;
        for (i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (!strncmp(arg, keys[i].name, strlen(keys[i].name))) return parse_count(arg + strlen(keys[i].name), keys[i].v);
    }
    return -1;
}

/* Prefill micro-batch in every mode, whatever the segment (segment= must divide
   it, so a batch is a whole number of segments, as chunked planning needs):
   timings compare configurations, not batch sizes. Scored positions end where a
   last segment of this size would start. */
enum { EVAL_BATCH = 512 };

static gm_attn_mode mode_attn(int mode) {
    return mode == M_DENSE || mode == M_BF16KV ? GM_ATTN_EI_DENSE : GM_ATTN_EI_SPARSE; /* ragged, per-segment, oracle */
}

/* ---------------------------------------------------------------- oracle selection
   Diagnostic (the oracle row; oracle=0 skips it): keep the plan's counts, but rank a sparse segment's
   blocks by the attention mass its queries really put on them (dense causal
   softmax, summed over the segment's queries and the group's heads). What the
   best block selector would keep at the same budget: it separates what the
   budget costs from what the reference's block score costs. */
typedef struct oracle_job {
    const gm_state *s;
    int l;
    int64_t row0, seg_start;
    int32_t nb, seg_len;
    double *mass;          /* [nth][n_kv_head][nb] */
    int failed;            /* a thread could not allocate its scratch */
} oracle_job;

/* Row (token t, query head h) of layer l: its dense causal softmax over keys
   0..t, weight x its probability on each key before nb blocks added to
   mass[key / block]; w holds t + 1 floats. */
static void row_mass_in(const gm_state *s, int l, int64_t row0, int64_t t, int h, int32_t nb, double weight,
                        const uint8_t *in, float *w, double *mass);
static void row_mass(const gm_state *s, int l, int64_t row0, int64_t t, int h, int32_t nb, double weight, float *w,
                     double *mass) {
    row_mass_in(s, l, row0, t, h, nb, weight, NULL, w, mass);
}
/* row_mass over the keys of the blocks b < nb with in[b] set and every key
   from block nb on (in NULL: every key): the softmax over those keys only. */
static void row_mass_in(const gm_state *s, int l, int64_t row0, int64_t t, int h, int32_t nb, double weight,
                        const uint8_t *in, float *w, double *mass) {
    const gm_hparams *hp = &s->m->hp;
    const int H = hp->n_head, G = hp->n_kv_head, D = hp->head_dim, R = H / G, bs = s->ei_cfg.block_size;
    const float *kc = s->k_cache[l], *q = s->q + ((size_t)(t - row0) * H + h) * D;
    float mx = -INFINITY;
    double sum = 0;
    int64_t key;
    for (key = 0; key <= t; key++) {
        const float *k = kc + ((size_t)key * G + h / R) * D;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, dot = 0; /* 8 lanes: the compiler vectorizes it */
        int d, u;
        if (in && !sl_fullnorm && key < (int64_t)nb * bs && !in[key / bs]) { w[key] = -INFINITY; continue; }
        for (d = 0; d + 8 <= D; d += 8)
            for (u = 0; u < 8; u++) acc[u] += q[d + u] * k[d + u];
        for (; d < D; d++) dot += q[d] * k[d];
        for (u = 0; u < 8; u++) dot += acc[u];
        w[key] = dot * hp->attn_scale;
        if (w[key] > mx) mx = w[key];
    }
    for (key = 0; key <= t; key++) sum += (w[key] = expf(w[key] - mx));
    for (key = 0; key < (int64_t)nb * bs; key++)
        if (!in || in[key / bs]) mass[key / bs] += weight * w[key] / sum;
}

/* Thread ith: for its queries of the segment [seg_start, seg_start + seg_len) and
   every head, the dense causal softmax over keys 0..t; the weight on keys before
   the segment is added to their block's mass. */
static void oracle_task(void *arg, int ith, int nth) {
    oracle_job *j = (oracle_job *)arg;
    const gm_hparams *hp = &j->s->m->hp;
    const int H = hp->n_head, G = hp->n_kv_head, R = H / G;
    double *mass = j->mass + (size_t)ith * G * j->nb;
    float *w = (float *)malloc((size_t)(j->seg_start + j->seg_len) * sizeof(float));
    int64_t t;
    int h;
    if (!w) { j->failed = 1; return; }
    for (t = j->seg_start + ith; t < j->seg_start + j->seg_len; t += nth)
        for (h = 0; h < H; h++) row_mass(j->s, j->l, j->row0, t, h, j->nb, 1.0, w, mass + (size_t)(h / R) * j->nb);
    free(w);
}

/* Diagnostic estimators for the oracle row (estimate=NAME, issue 35): instead of
   every query row, a few rows of the segment, chosen by NAME, each weighed
   by w, give the block mass (f32 scores, double sums):
     even    the library's sampled rows (token t0 + ((2i+1) S) / (2N), head i % R):
             the sampled ranking in f32, a check of this path
     strat   one row at a random token of each of N equal strata, head i % R
     rand    N rows at random tokens and heads of the segment
     fps     farthest-point rows: the first of `even`, then each time the
             (token, head) whose query direction is farthest (1 - cosine) from
             the rows chosen so far
     fpsw    fps, each row weighed by how many of the segment's rows are
             nearest to it (a stratified estimate of the whole mass)
     sfps    stratified fps: row i from stratum i (tokens [t0 + iS/N, t0 +
             (i+1)S/N)), any head of the group: the candidate farthest from
             rows 0..i-1 (row 0: the stratum's middle token, head 0)
     sfpsh   sfps with row i's head fixed to i % R (tokens vary)
   estimate_rows=N (default 64) rows per segment and kv head; estimate_seed=S. */
typedef struct est_job {
    const gm_state *s;
    int l;
    int64_t row0, seg_start;
    int32_t nb, n_rows;
    const int64_t *tok;
    const int32_t *head;
    const double *w;
    const uint8_t *in; /* the shortlist (shortlist=F), or NULL */
    double *mass; /* [nth][nb] */
    int failed;
} est_job;
static void est_task(void *arg, int ith, int nth) {
    est_job *j = (est_job *)arg;
    double *mass = j->mass + (size_t)ith * j->nb;
    float *w = (float *)malloc((size_t)(j->seg_start + j->s->ei_cfg.segment_size) * sizeof(float));
    int32_t i;
    if (!w) { j->failed = 1; return; }
    for (i = ith; i < j->n_rows; i += nth) row_mass_in(j->s, j->l, j->row0, j->tok[i], j->head[i], j->nb, j->w[i], j->in, w, mass);
    free(w);
}
static uint64_t est_rng;
static uint32_t est_next(void) {
    est_rng = est_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(est_rng >> 33);
}
/* The rows of kv head kv in the segment [t0, t0 + len) (S: segment size):
   fills tok/head/w, returns their count. */
static int32_t est_pick(const gm_state *s, int kv, int64_t t0, int32_t len, int32_t S, int64_t row0, int64_t *tok,
                        int32_t *head, double *w) {
    const int H = s->m->hp.n_head, G = s->m->hp.n_kv_head, D = s->m->hp.head_dim, R = H / G;
    const int32_t N = est_rows;
    int32_t i, n = 0;
    if (est_kind == EST_EVEN || est_kind == EST_STRAT || est_kind == EST_RAND) {
        for (i = 0; i < N; i++) {
            int64_t t;
            int h = kv * R + i % R;
            if (est_kind == EST_EVEN) t = t0 + ((2 * (int64_t)i + 1) * S) / (2 * (int64_t)N);
            else if (est_kind == EST_STRAT) t = t0 + ((int64_t)i * S) / N + est_next() % (uint32_t)(S / N > 0 ? S / N : 1);
            else { t = t0 + est_next() % (uint32_t)len; h = kv * R + (int)(est_next() % (uint32_t)R); }
            if (t >= t0 + len) continue;
            tok[n] = t; head[n] = h; w[n] = 1.0; n++;
        }
        return n;
    }
    if (est_kind == EST_SFPS || est_kind == EST_SFPSH) {
        float *u = (float *)malloc((size_t)N * D * sizeof(float));
        float *cand = (float *)malloc((size_t)D * sizeof(float));
        if (!u || !cand) { free(u); free(cand); return -1; }
        for (i = 0; i < N; i++) {
            const int64_t a = t0 + ((int64_t)i * S) / N, z = t0 + ((int64_t)(i + 1) * S) / N;
            int64_t t, bt = -1;
            int hh, bh = 0;
            float bestv = 3.f;
            for (t = a; t < z && t < t0 + len; t++)
                for (hh = 0; hh < R; hh++) {
                    const float *q = s->q + ((size_t)(t - row0) * H + kv * R + hh) * D;
                    double nn = 0;
                    float worst = -2.f;
                    int d, c2;
                    if (est_kind == EST_SFPSH && hh != i % R) continue;
                    for (d = 0; d < D; d++) nn += (double)q[d] * q[d];
                    nn = nn > 0 ? 1.0 / sqrt(nn) : 0;
                    for (d = 0; d < D; d++) cand[d] = (float)(q[d] * nn);
                    if (i == 0) { /* the stratum's middle token, head 0 (sfpsh: its head) */
                        if (t != a + (z - a) / 2) continue;
                        bt = t; bh = hh; memcpy(u, cand, (size_t)D * sizeof(float));
                        break;
                    }
                    for (c2 = 0; c2 < n; c2++) {
                        float dot = 0;
                        for (d = 0; d < D; d++) dot += cand[d] * u[(size_t)c2 * D + d];
                        if (dot > worst) worst = dot;
                    }
                    if (worst < bestv) { bestv = worst; bt = t; bh = hh; memcpy(u + (size_t)n * D, cand, (size_t)D * sizeof(float)); }
                }
            if (bt < 0) continue;
            tok[n] = bt; head[n] = kv * R + bh; w[n] = 1.0; n++;
        }
        free(u); free(cand);
        return n;
    }
    {   /* fps / fpsw over the segment's len x R rows, by direction */
        const int64_t C = (int64_t)len * R;
        float *u = (float *)malloc((size_t)C * D * sizeof(float));
        float *best = (float *)malloc((size_t)C * sizeof(float));
        int32_t *owner = (int32_t *)malloc((size_t)C * sizeof(int32_t));
        int64_t c, first;
        if (!u || !best || !owner) { free(u); free(best); free(owner); return -1; }
        for (c = 0; c < C; c++) {
            const float *q = s->q + ((size_t)(t0 + c / R - row0) * H + kv * R + c % R) * D;
            double nn = 0;
            int d;
            for (d = 0; d < D; d++) nn += (double)q[d] * q[d];
            nn = nn > 0 ? 1.0 / sqrt(nn) : 0;
            for (d = 0; d < D; d++) u[c * D + d] = (float)(q[d] * nn);
            best[c] = -2.f; /* best cosine to a chosen row */
            owner[c] = 0;
        }
        first = ((int64_t)S / (2 * N)) * R; /* even's row 0 (head 0 of the group) */
        if (first >= C) first = 0;
        for (i = 0; i < N && i < C; i++) {
            int64_t pick = first;
            if (i > 0) {
                float lo = 2.f;
                for (c = 0; c < C; c++)
                    if (best[c] < lo) { lo = best[c]; pick = c; }
            }
            tok[n] = t0 + pick / R; head[n] = kv * R + (int)(pick % R); w[n] = 0; n++;
            for (c = 0; c < C; c++) {
                const float *a = u + c * D, *b = u + pick * D;
                float dot = 0;
                int d;
                for (d = 0; d < D; d++) dot += a[d] * b[d];
                if (dot > best[c] || c == pick) { best[c] = c == pick ? 2.f : dot; owner[c] = n - 1; }
            }
        }
        for (c = 0; c < C; c++) w[owner[c]] += 1.0;
        for (i = 0; i < n; i++) w[i] = est_kind == EST_FPSW ? w[i] * n / (double)C : 1.0;
        free(u); free(best); free(owner);
        return n;
    }
}
/* the shortlist's order: score descending, then block (sl_prob: the scores) */
static const float *sl_prob;
static int sl_desc(const void *a, const void *b) {
    const float x = sl_prob[*(const int32_t *)a], y = sl_prob[*(const int32_t *)b];
    return x > y ? -1 : x < y ? 1 : *(const int32_t *)a - *(const int32_t *)b;
}
/* The rows' block scores by mean key or bound into sc[nb] (mass summed over rows). */
static int sl_row_scores(const gm_state *s, int l, int kv, int32_t nb, int64_t row0, const int64_t *tok,
                         const int32_t *head, int32_t n, float *sc) {
    const gm_hparams *hp = &s->m->hp;
    const int H = hp->n_head, G = hp->n_kv_head, D = hp->head_dim, bs = s->ei_cfg.block_size;
    float *rep = (float *)malloc((size_t)nb * 2 * D * sizeof(float)), *lg = (float *)malloc((size_t)nb * sizeof(float));
    int32_t b, i, d, e;
    if (!rep || !lg) { free(rep); free(lg); return -1; }
    for (b = 0; b < nb; b++) { /* [b][0]: mean or max, [b][1]: min */
        float *a = rep + (size_t)b * 2 * D, *z = a + D;
        for (d = 0; d < D; d++) { a[d] = sl_by == SL_MEAN ? 0.0f : -INFINITY; z[d] = INFINITY; }
        for (e = 0; e < bs; e++) {
            const float *k = s->k_cache[l] + ((size_t)((int64_t)b * bs + e) * G + kv) * D;
            for (d = 0; d < D; d++) {
                if (sl_by == SL_MEAN) a[d] += k[d] / bs;
                else { a[d] = k[d] > a[d] ? k[d] : a[d]; z[d] = k[d] < z[d] ? k[d] : z[d]; }
            }
        }
    }
    for (b = 0; b < nb; b++) sc[b] = 0.0f;
    for (i = 0; i < n; i++) {
        const float *q = s->q + ((size_t)(tok[i] - row0) * H + head[i]) * D;
        float mx = -INFINITY;
        double z = 0;
        for (b = 0; b < nb; b++) {
            const float *a = rep + (size_t)b * 2 * D, *zz = a + D;
            float dot = 0;
            for (d = 0; d < D; d++) dot += sl_by == SL_MEAN ? q[d] * a[d] : (q[d] * a[d] > q[d] * zz[d] ? q[d] * a[d] : q[d] * zz[d]);
            lg[b] = dot * hp->attn_scale;
            if (lg[b] > mx) mx = lg[b];
        }
        for (b = 0; b < nb; b++) z += (lg[b] = expf(lg[b] - mx));
        for (b = 0; b < nb; b++) sc[b] += (float)(lg[b] / z);
    }
    free(rep); free(lg);
    return 0;
}
/* est_shortlist's blocks of kv head kv's segment at t0 (nb before it) into in[nb], scored by
   sl_by (with the rows tok/head[0..n) for mean and bound). */
static int est_shortlist_blocks(const gm_state *s, int l, int kv, int64_t t0, int32_t nb, int64_t row0, const int64_t *tok,
                                const int32_t *head, int32_t n, uint8_t *in) {
    const ei_plan *p = &s->plans[l];
    const ei_config *c = &s->ei_cfg;
    const int32_t seg = (int32_t)(t0 / c->segment_size);
    const int64_t L = (int64_t)(est_shortlist * c->budget_max_factor * c->base_budget / c->block_size);
    int32_t *ord = (int32_t *)malloc((size_t)nb * sizeof(int32_t)), b;
    float *sc = NULL;
    if (nb <= 0 || !ord || !p->scores) { free(ord); return -1; }
    sl_prob = p->scores + EI_PLAN_ROW(p, kv, seg) * (size_t)(p->blk_capacity > 0 ? p->blk_capacity : 1);
    if (sl_by != SL_REF) {
        if (!(sc = (float *)malloc((size_t)nb * sizeof(float))) ||
            sl_row_scores(s, l, kv, nb, row0, tok, head, sl_rows > 0 && sl_rows < n ? sl_rows : n, sc)) { free(sc); free(ord); return -1; }
        sl_prob = sc;
    }
    for (b = 0; b < nb; b++) ord[b] = b;
    qsort(ord, (size_t)nb, sizeof *ord, sl_desc);
    memset(in, 0, (size_t)nb);
    for (b = 0; b < nb && b < L; b++) in[ord[b]] = 1;
    for (b = 0; b < nb && b < c->sink_blocks; b++) in[b] = 1;
    for (b = nb - c->local_blocks > 0 ? nb - c->local_blocks : 0; b < nb; b++) in[b] = 1;
    free(ord);
    free(sc);
    return 0;
}
static int64_t sl_blocks, sl_all; /* blocks the shortlists held, of all the visible ones */

/* The estimator's block mass of kv head kv into mk[nb] (zeroed first). */
static int est_mass(gm_state *s, int l, int kv, int64_t t0, int32_t len, int32_t nb, int64_t row0, double *mk) {
    const int nth = gm_pool_size(s->pool);
    int64_t *tok = (int64_t *)malloc((size_t)est_rows * sizeof(int64_t));
    int32_t *head = (int32_t *)malloc((size_t)est_rows * sizeof(int32_t));
    double *w = (double *)malloc((size_t)est_rows * sizeof(double));
    est_job j;
    int32_t n, i, b;
    memset(&j, 0, sizeof j);
    if (!tok || !head || !w) { free(tok); free(head); free(w); return -1; }
    n = est_pick(s, kv, t0, len, s->ei_cfg.segment_size, row0, tok, head, w);
    j.s = s; j.l = l; j.row0 = row0; j.seg_start = t0; j.nb = nb; j.n_rows = n < 0 ? 0 : n;
    j.tok = tok; j.head = head; j.w = w;
    j.mass = (double *)calloc((size_t)nth * nb, sizeof(double));
    if (n < 0 || !j.mass) { free(tok); free(head); free(w); free(j.mass); return -1; }
    if (est_shortlist > 0) {
        uint8_t *in = (uint8_t *)malloc((size_t)nb);
        if (!in || est_shortlist_blocks(s, l, kv, t0, nb, row0, tok, head, n, in)) { free(in); free(tok); free(head); free(w); free(j.mass); return -1; }
        for (b = 0; b < nb; b++) sl_blocks += in[b];
        sl_all += nb;
        j.in = in;
    }
    gm_pool_run(s->pool, est_task, &j);
    free((void *)j.in);
    for (b = 0; b < nb; b++) {
        double v = 0;
        for (i = 0; i < nth; i++) v += j.mass[(size_t)i * nb + b];
        mk[b] = v;
    }
    free(tok); free(head); free(w); free(j.mass);
    return j.failed ? -1 : 0;
}

/* Share of the attention mass on a sparse segment's earlier keys that its kept
   blocks hold, summed over (layer, kv head, segment) rows: under the plan's own
   ranking and under the oracle's. */
static struct { double ref, oracle; int64_t rows; } mass_kept;
static int oracle_rerank; /* 1: the oracle mode; 0: measure the mass only (mass=1), the plan unchanged */
static double hook_s;     /* seconds in oracle_rank, taken out of the run's timings */

/* gm_state.plan_hook: re-rank the kept blocks of the sparse segments in this
   chunk (or only measure the mass they hold). */
static int oracle_rank(gm_state *s, int l, int n, int64_t row0) {
    ei_plan *p = &s->plans[l];
    const int nth = gm_pool_size(s->pool), S = p->segment_size, G = s->m->hp.n_kv_head;
    const double t0 = gm_now();
    int32_t seg, kv, i, b, c;
    for (seg = (int32_t)(row0 / S); seg < p->n_segments && (int64_t)seg * S < row0 + n; seg++) {
        oracle_job j;
        if (!ei_plan_segment_is_sparse(s->ei, p, seg)) continue;
        j.s = s; j.l = l; j.row0 = row0; j.seg_start = (int64_t)seg * S;
        j.seg_len = (int32_t)((row0 + n - j.seg_start) < S ? row0 + n - j.seg_start : S);
        j.nb = (int32_t)(j.seg_start / p->block_size);
        j.failed = 0;
        if (j.seg_start < row0) return -1; /* a segment split across chunks: not supported here */
        if (!(j.mass = (double *)calloc((size_t)nth * G * j.nb, sizeof(double)))) return -1;
        if (est_kind == EST_NONE || !oracle_rerank) gm_pool_run(s->pool, oracle_task, &j);
        if (j.failed) { free(j.mass); return -1; }
        for (i = 1; i < nth; i++)
            for (b = 0; b < G * j.nb; b++) j.mass[b] += j.mass[(size_t)i * G * j.nb + b];
        for (kv = 0; kv < G; kv++) {
            /* the heads of kv head `kv` share its blocks: their summed mass ranks them */
            const double *mk = j.mass + (size_t)kv * j.nb;
            double *em = NULL;
            if (est_kind != EST_NONE && oracle_rerank) { /* the estimator ranks (no dense pass: mass kept is its own) */
                if (!(em = (double *)malloc((size_t)j.nb * sizeof(double))) ||
                    est_mass(s, l, kv, j.seg_start, j.seg_len, j.nb, row0, em)) { free(em); free(j.mass); return -1; }
                mk = em;
            }
            int32_t keep = p->keep_count[EI_PLAN_ROW(p, kv, seg)], *row = EI_PLAN_BLOCKS(p, kv, seg);
            uint8_t *taken = (uint8_t *)calloc((size_t)j.nb, 1);
            double total = 0, ref = 0, best_sum = 0;
            if (!taken) { free(j.mass); return -1; }
            for (b = 0; b < j.nb; b++) total += mk[b];
            for (c = 0; c < keep; c++) ref += mk[row[c]];
            for (c = 0; c < keep; c++) {
                const double *rk = em ? em : mk;
                int32_t best = -1;
                for (b = 0; b < j.nb; b++)
                    if (!taken[b] && (best < 0 || rk[b] > rk[best])) best = b;
                taken[best] = 1;
                if (oracle_rerank) row[c] = best;
                best_sum += mk[best];
            }
            free(taken);
            free(em);
            if (total > 0) {
                mass_kept.ref += ref / total;
                mass_kept.oracle += best_sum / total;
                mass_kept.rows++;
            }
        }
        free(j.mass);
    }
    hook_s += gm_now() - t0;
    return 0;
}

/* The log gets each global layer's kept tokens per sparse segment: where budgets go. */
static void log_kept_tokens(const gm_state *s) {
    int l, h, seg;
    for (l = 0; l < s->m->hp.n_layer; l++) {
        const ei_plan *p = &s->plans[l];
        if (!s->m->layers[l].is_global || !p->n_segments) continue;
        for (h = 0; h < p->n_kv_heads; h++) {
            fprintf(stderr, "  layer %d kv head %d (%s): kept tokens per sparse segment:", l, h,
                    p->head_class[h] == EI_HEAD_RIGID ? "rigid" : "dynamic");
            for (seg = 1; seg < p->n_segments; seg++)
                if (ei_plan_segment_is_sparse(s->ei, p, seg)) fprintf(stderr, " %d", p->keep_count[EI_PLAN_ROW(p, h, seg)] * p->block_size);
            fprintf(stderr, "\n");
        }
    }
}

/* mean fraction of the dense causal keys that a sparse segment attends to */
static double plan_density(const gm_state *s) {
    double sum = 0;
    int n = 0, l, h, seg;
    for (l = 0; l < s->m->hp.n_layer; l++) {
        const ei_plan *p = &s->plans[l];
        if (!s->m->layers[l].is_global) continue;
        for (h = 0; h < p->n_kv_heads; h++)
            for (seg = 1; seg < p->n_segments; seg++) {
                double dense, kept;
                if (!ei_plan_segment_is_sparse(s->ei, p, seg)) continue;
                dense = (double)seg * p->segment_size + p->segment_size / 2.0;
                kept = (double)p->keep_count[EI_PLAN_ROW(p, h, seg)] * p->block_size + p->segment_size / 2.0;
                sum += kept / dense;
                n++;
            }
    }
    return n ? sum / n : 1.0;
}

typedef struct ppl_row { double ppl, agree, agree_head, agree_rest, t_prefill, t_attn, density; int64_t n_scored; double t_profile; } ppl_row;

/* ---------------------------------------------------------------- dense cache
   dense_cache=DIR: the dense mode's results (its row and arg-maxes; its passkey
   answers) do not depend on the sparse options, so a sweep computes them once.
   A file is named by a hash of everything they depend on: the model file's
   size, the token ids, the positions or the key. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
static uint64_t model_bytes;
static void dense_cache_path(char *out, size_t cap, const char *kind, uint64_t h) {
    size_t layout = sizeof(ppl_row); /* the cached record's layout */
    h = fnv1a(fnv1a(h, &model_bytes, sizeof model_bytes), &layout, sizeof layout);
    snprintf(out, cap, "%s/dense-%s-%016llx.bin", ovr.dense_cache, kind, (unsigned long long)h);
}
/* 1 if loaded: n bytes of a, then m bytes of b */
static int dense_cache_load(const char *path, void *a, size_t n, void *b, size_t m) {
    FILE *f = fopen(path, "rb");
    int ok = f && fread(a, 1, n, f) == n && (!m || fread(b, 1, m, f) == m);
    if (f) fclose(f);
    return ok;
}
static void dense_cache_save(const char *path, const void *a, size_t n, const void *b, size_t m) {
    char tmp[1200];
    FILE *f;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "wb"))) return;
    if (fwrite(a, 1, n, f) == n && (!m || fwrite(b, 1, m, f) == m) && fclose(f) == 0) rename(tmp, path);
    else remove(tmp);
}

static int ppl_run_uncached(const gm_model *m, gm_pool *pool, int mode, const int32_t *ids, int64_t L, const int64_t *pos,
                            int64_t n_pos, int32_t *argmax, ppl_row *row, char *err, size_t errlen);
static int ppl_run(const gm_model *m, gm_pool *pool, int mode, const int32_t *ids, int64_t L, const int64_t *pos, int64_t n_pos,
                   int32_t *argmax, ppl_row *row, char *err, size_t errlen) {
    char path[1100];
    uint64_t h = 0xcbf29ce484222325ull;
    int r;
    if (mode != M_DENSE || !ovr.dense_cache) return ppl_run_uncached(m, pool, mode, ids, L, pos, n_pos, argmax, row, err, errlen);
    h = fnv1a(fnv1a(h, ids, (size_t)(L + 1) * sizeof *ids), pos, (size_t)n_pos * sizeof *pos);
    dense_cache_path(path, sizeof path, "ppl", h);
    if (dense_cache_load(path, row, sizeof *row, argmax, (size_t)n_pos * sizeof *argmax)) {
        fprintf(stderr, "  dense row from %s\n", path);
        return 0;
    }
    r = ppl_run_uncached(m, pool, mode, ids, L, pos, n_pos, argmax, row, err, errlen);
    if (!r) dense_cache_save(path, row, sizeof *row, argmax, (size_t)n_pos * sizeof *argmax);
    return r;
}
static int ppl_run_uncached(const gm_model *m, gm_pool *pool, int mode, const int32_t *ids, int64_t L, const int64_t *pos,
                            int64_t n_pos, int32_t *argmax, ppl_row *row, char *err, size_t errlen) {
    gm_state s;
    ei_config cfg = mode_config(mode);
    const int Dm = m->hp.d_model;
    float *hidden = (float *)malloc((size_t)L * Dm * sizeof(float));
    float *sel = (float *)malloc((size_t)n_pos * Dm * sizeof(float));
    float *logits = (float *)malloc((size_t)64 * m->hp.n_vocab * sizeof(float));
    int32_t *targets = (int32_t *)malloc((size_t)n_pos * sizeof(int32_t));
    score_acc acc = {0, 0};
    double t0;
    int64_t i;
    if (!hidden || !sel || !logits || !targets) { snprintf(err, errlen, "out of memory"); return -1; }
    if (gm_state_init(&s, m, pool, L, EVAL_BATCH, mode_attn(mode), &cfg, err, errlen)) return -1;
    s.kv_bf16 = mode == M_BF16KV;
    s.dense_layers = ovr.dense_layers;
    oracle_rerank = mode == M_ORACLE;
    est_rng = (uint64_t)est_seed * 0x9E3779B97F4A7C15ull + 1;
    if (mode == M_ORACLE || (ovr.mass && (mode == M_RAGGED || mode == M_PERSEG))) s.plan_hook = oracle_rank;
    memset(&mass_kept, 0, sizeof mass_kept);
    hook_s = 0;
    t0 = gm_now();
    if (gm_prefill(&s, ids, L, hidden, err, errlen)) return -1;
    /* without the oracle's dense softmax passes (the engine counts the plan hook in global attention) */
    row->t_prefill = gm_now() - t0 - hook_s;
    row->t_attn = s.stats.t_attn_global - hook_s;
    row->t_profile = s.stats.t_profile; /* planning, inside t_attn */
    row->density = mode_attn(mode) == GM_ATTN_EI_DENSE ? 1.0 : plan_density(&s);
    if (mode_attn(mode) == GM_ATTN_EI_SPARSE) log_kept_tokens(&s);
    for (i = 0; i < n_pos; i++) {
        memcpy(sel + (size_t)i * Dm, hidden + (size_t)pos[i] * Dm, (size_t)Dm * sizeof(float));
        targets[i] = ids[pos[i] + 1];
    }
    score_rows(&s, sel, n_pos, targets, argmax, logits, 64, &acc);
    row->ppl = exp(acc.nll / (double)acc.n);
    row->n_scored = acc.n;
    gm_state_free(&s);
    free(hidden); free(sel); free(logits); free(targets);
    return 0;
}

/* ---------------------------------------------------------------- passkey */
static const char *FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";

static int32_t *passkey_prompt(const gm_tokenizer *t, int64_t target_len, double depth, int key, int64_t *n_out) {
    /* measure the filler's token count once, then build text of the right size */
    int64_t nf = 1, nq = 0, ni = 0, reps, before, k;
    char needle[256], question[256];
    char *text;
    size_t cap, w = 0;
    int32_t *ids;
    snprintf(needle, sizeof needle, "The pass key is %05d. Remember it. %05d is the pass key. ", key, key);
    snprintf(question, sizeof question, "What is the pass key? The pass key is");
    {
        int32_t *tmp = tokenize_all(t, FILLER, strlen(FILLER), 0, &nf); free(tmp);
        tmp = tokenize_all(t, question, strlen(question), 0, &nq); free(tmp);
        tmp = tokenize_all(t, needle, strlen(needle), 0, &ni); free(tmp);
    }
    reps = (target_len - nq - ni - 1) / nf;
    before = (int64_t)(reps * depth + 0.5);
    cap = (size_t)(reps + 1) * strlen(FILLER) + strlen(needle) + strlen(question) + 16;
    text = (char *)malloc(cap);
    for (k = 0; k < reps; k++) {
        if (k == before) { memcpy(text + w, needle, strlen(needle)); w += strlen(needle); }
        memcpy(text + w, FILLER, strlen(FILLER));
        w += strlen(FILLER);
    }
    if (before >= reps) { memcpy(text + w, needle, strlen(needle)); w += strlen(needle); }
    memcpy(text + w, question, strlen(question));
    w += strlen(question);
    ids = tokenize_all(t, text, w, 1, n_out);
    free(text);
    return ids;
}

static int passkey_run_uncached(const gm_model *m, gm_pool *pool, int mode, const int32_t *ids, int64_t n, int key,
                                char *answer, size_t anscap, int *ok, char *err, size_t errlen);
static int passkey_run(const gm_model *m, gm_pool *pool, int mode, const int32_t *ids, int64_t n, int key, char *answer,
                       size_t anscap, int *ok, char *err, size_t errlen) {
    char path[1100], saved[256];
    uint64_t h = 0xcbf29ce484222325ull;
    int r;
    if (mode != M_DENSE || !ovr.dense_cache || anscap > sizeof saved)
        return passkey_run_uncached(m, pool, mode, ids, n, key, answer, anscap, ok, err, errlen);
    h = fnv1a(fnv1a(h, ids, (size_t)n * sizeof *ids), &key, sizeof key);
    dense_cache_path(path, sizeof path, "passkey", h);
    memset(saved, 0, sizeof saved);
    if (dense_cache_load(path, ok, sizeof *ok, saved, sizeof saved)) {
        snprintf(answer, anscap, "%s", saved);
        return 0;
    }
    r = passkey_run_uncached(m, pool, mode, ids, n, key, answer, anscap, ok, err, errlen);
    snprintf(saved, sizeof saved, "%s", answer);
    if (!r) dense_cache_save(path, ok, sizeof *ok, saved, sizeof saved);
    return r;
}
static int passkey_run_uncached(const gm_model *m, gm_pool *pool, int mode, const int32_t *ids, int64_t n, int key,
                                char *answer, size_t anscap, int *ok, char *err, size_t errlen) {
    gm_state s;
    ei_config cfg = mode_config(mode);
    const int Dm = m->hp.d_model, V = m->hp.n_vocab;
    float *hidden = (float *)malloc((size_t)n * Dm * sizeof(float));
    float *logits = (float *)malloc((size_t)V * sizeof(float));
    int32_t gen[10], next;
    char keystr[16];
    int i;
    if (!hidden || !logits) return -1;
    if (gm_state_init(&s, m, pool, n + 16, EVAL_BATCH, mode_attn(mode), &cfg, err, errlen)) return -1;
    s.dense_layers = ovr.dense_layers;
    if (gm_prefill(&s, ids, n, hidden, err, errlen)) return -1;
    gm_logits(&s, hidden + (size_t)(n - 1) * Dm, 1, logits);
    for (i = 0; i < 8; i++) {
        next = argmax_row(logits, V);
        gen[i] = next;
        if (gm_decode(&s, &next, 1, hidden, err, errlen)) return -1;
        gm_logits(&s, hidden, 1, logits);
    }
    detok(&m->tok, gen, 8, answer, anscap);
    snprintf(keystr, sizeof keystr, "%05d", key);
    *ok = strstr(answer, keystr) != NULL;
    gm_state_free(&s);
    free(hidden);
    free(logits);
    return 0;
}

/* ---------------------------------------------------------------- JSON report
   Kept in memory and rewritten whole (to a temporary file, then renamed) after
   every row, so a run that stops half-way leaves a valid file ("complete":
   false). Plain fprintf: strings escaped, invalid UTF-8 replaced, numbers that
   are not finite written as null. */
static const char *mode_id[N_MODES] = {"dense", "ragged", "per_segment", "oracle", "bf16kv"};

typedef struct json_row {
    int64_t ctx;
    int mode;
    ppl_row r;
    double ppl_dense;
    double mass_plan, mass_oracle; /* shares, NAN where not measured */
} json_row;

typedef struct pk_trial {
    int64_t ctx, tokens;
    double depth;
    int key, n_done; /* modes run so far */
    int ok[N_MODES];
    char answer[N_MODES][256];
} pk_trial;

static struct {
    const char *path, *model, *text;
    int64_t tokens_in_text;
    int threads, n_modes;
    json_row rows[8 * N_MODES];
    int n_rows;
    int64_t pk_ctxs[8];
    int n_pk;
    pk_trial trials[8 * 3];
    int n_trials;
} rep;

/* bytes of the valid UTF-8 sequence at p (p[0] >= 0x80), 0 if invalid */
static int utf8_len(const unsigned char *p) {
    int n, i;
    uint32_t cp;
    if ((p[0] & 0xE0) == 0xC0) n = 2, cp = p[0] & 0x1Fu;
    else if ((p[0] & 0xF0) == 0xE0) n = 3, cp = p[0] & 0x0Fu;
    else if ((p[0] & 0xF8) == 0xF0) n = 4, cp = p[0] & 0x07u;
    else return 0;
    for (i = 1; i < n; i++) { /* stops at the terminating 0 */
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3Fu);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

static void json_str(FILE *f, const char *s) {
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    fputc('"', f);
    while (*p) {
        int n;
        if (*p == '"' || *p == '\\') fputc('\\', f), fputc(*p++, f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p++);
        else if (*p < 0x80) fputc(*p++, f);
        else if ((n = utf8_len(p)) > 0) fwrite(p, 1, (size_t)n, f), p += n;
        else fputs("\\ufffd", f), p++;
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.10g", v);
    else fputs("null", f);
}

/* `, "key": ` then the value */
static void jkey(FILE *f, const char *key) { fprintf(f, ", \"%s\": ", key); }
static void jnum(FILE *f, const char *key, double v) { jkey(f, key); json_num(f, v); }
static void jint(FILE *f, const char *key, long long v) { jkey(f, key); fprintf(f, "%lld", v); }
static void jstr(FILE *f, const char *key, const char *v) {
    jkey(f, key);
    if (v) json_str(f, v);
    else fputs("null", f);
}

/* the sparse configuration's fields (after a first key) */
static void json_config_fields(FILE *f, const ei_config *c) {
    jint(f, "rank_samples", c->rank_samples);
    jstr(f, "rank_precision", c->rank_precision == EI_RANK_PRECISION_INT8 ? "int8" : "f32");
    jstr(f, "rank_rows", c->rank_rows == EI_RANK_ROWS_SPREAD ? "spread" : "even");
    jnum(f, "top_p", c->top_p);
    jint(f, "sink_blocks", c->sink_blocks);
    jint(f, "local_blocks", c->local_blocks);
    jint(f, "base_budget", c->base_budget);
    jint(f, "segment_size", c->segment_size);
    jint(f, "block_size", c->block_size);
    jint(f, "threshold_len", (long long)c->threshold_len);
}

static int write_json(int complete, double total_s) {
    char tmp[1100];
    const ei_config c = mode_config(M_RAGGED);
    FILE *f;
    int i, mode, l, first;
    snprintf(tmp, sizeof tmp, "%s.tmp", rep.path);
    if (!(f = fopen(tmp, "w"))) return -1;
    fputs("{\"model\": ", f);
    json_str(f, rep.model);
    jstr(f, "text", rep.text);
    jint(f, "tokens_in_text", (long long)rep.tokens_in_text);
    jint(f, "threads", rep.threads);
    jkey(f, "complete");
    fputs(complete ? "true" : "false", f);
    jnum(f, "total_s", total_s);
    fputs(",\n \"config\": {\"ranking\": ", f);
    json_str(f, ranking_id(c.ranking));
    json_config_fields(f, &c);
    jnum(f, "budget_min_factor", c.budget_min_factor);
    jnum(f, "budget_max_factor", c.budget_max_factor);
    jkey(f, "preset");
    json_str(f, ovr.ranking >= EI_RANK_SAMPLED ? "ei_config_quality" : "ei_config_default");
    jkey(f, "overrides");
    fputs(ovr_changes_config() ? "true" : "false", f);
    jkey(f, "dense_layers");
    fputc('[', f);
    for (l = 0, first = 1; l < 64; l++)
        if (ovr.dense_layers >> l & 1) fprintf(f, "%s%d", first ? "" : ", ", l), first = 0;
    fputs("]},\n \"rows\": [", f);
    for (i = 0; i < rep.n_rows; i++) {
        const json_row *r = &rep.rows[i];
        const ei_config rc = mode_config(r->mode);
        const int sparse = mode_attn(r->mode) == GM_ATTN_EI_SPARSE;
        fprintf(f, "%s\n  {\"context\": %lld", i ? "," : "", (long long)r->ctx);
        jstr(f, "mode", mode_id[r->mode]);
        jstr(f, "mode_name", mode_name[r->mode]);
        jstr(f, "ranking", r->mode == M_ORACLE ? "oracle" : sparse ? ranking_id(rc.ranking) : NULL);
        jint(f, "scored", (long long)r->r.n_scored);
        jnum(f, "perplexity", r->r.ppl);
        jnum(f, "ppl_dense", r->ppl_dense);
        jnum(f, "ppl_vs_dense_pct", 100.0 * (r->r.ppl / r->ppl_dense - 1.0));
        jnum(f, "agreement_pct", 100.0 * r->r.agree);
        jnum(f, "agreement_first64_pct", 100.0 * r->r.agree_head);
        jnum(f, "agreement_rest_pct", 100.0 * r->r.agree_rest);
        jnum(f, "density", r->r.density);
        jnum(f, "attention_s", r->r.t_attn);
        jnum(f, "profile_s", r->r.t_profile);
        jnum(f, "prefill_s", r->r.t_prefill);
        jnum(f, "mass_kept_pct", 100.0 * (r->mode == M_ORACLE ? r->mass_oracle : r->mass_plan));
        if (isfinite(r->mass_plan)) {
            jnum(f, "mass_kept_plan_pct", 100.0 * r->mass_plan);
            jnum(f, "mass_kept_oracle_pct", 100.0 * r->mass_oracle);
        }
        jkey(f, "per_segment_budget");
        fputs(rc.per_segment_budget ? "true" : "false", f);
        json_config_fields(f, &rc);
        fputc('}', f);
    }
    fputs("],\n \"passkey\": ", f);
    if (!rep.n_pk) fputs("null", f);
    else {
        int hits[N_MODES] = {0}, total[N_MODES] = {0};
        fputs("{\"contexts\": [", f);
        for (i = 0; i < rep.n_pk; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)rep.pk_ctxs[i]);
        fputs("], \"trials\": [", f);
        for (i = 0; i < rep.n_trials; i++) {
            const pk_trial *t = &rep.trials[i];
            fprintf(f, "%s\n   {\"context\": %lld", i ? "," : "", (long long)t->ctx);
            jint(f, "tokens", (long long)t->tokens);
            jnum(f, "depth", t->depth);
            jint(f, "key", t->key);
            for (mode = 0; mode < t->n_done; mode++) {
                jkey(f, mode_id[mode]);
                fprintf(f, "{\"ok\": %s, \"answer\": ", t->ok[mode] ? "true" : "false");
                json_str(f, t->answer[mode]);
                fputc('}', f);
                hits[mode] += t->ok[mode];
                total[mode]++;
            }
            fputc('}', f);
        }
        fputs("],\n  \"results\": [", f);
        for (mode = 0; mode < rep.n_modes; mode++) {
            fprintf(f, "%s{\"mode\": ", mode ? ", " : "");
            json_str(f, mode_id[mode]);
            jint(f, "hits", hits[mode]);
            jint(f, "total", total[mode]);
            fputc('}', f);
        }
        fputs("]}", f);
    }
    fputs("}\n", f);
    if (fclose(f) || rename(tmp, rep.path)) { remove(tmp); return -1; }
    return 0;
}

static int parse_list(const char *s, int64_t *out, int max) {
    int n = 0;
    while (s && *s && n < max) {
        out[n++] = atoll(s);
        s = strchr(s, ',');
        if (s) s++;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : ".cache/model/gemma-3-270m-q4_k_m.gguf";
    const char *out_path = argc > 2 ? argv[2] : "build/eval.md";
    int64_t ctxs[8], pk_ctxs[8];
    int n_ctx = parse_list(argc > 3 ? argv[3] : "8192,16384,32768", ctxs, 8);
    int n_pk = parse_list(argc > 4 ? argv[4] : "8192,16384", pk_ctxs, 8);
    const char *text_path = argc > 5 ? argv[5] : "licences";
    const char *text_name = strcmp(text_path, "licences") ? text_path : "/usr/share/common-licenses/*";
    gm_model m;
    gm_pool *pool;
    char err[512];
    size_t len;
    char *text;
    int32_t *ids;
    int64_t n_all;
    int c, mode, mi, n_modes, n_ppl;
    int ppl_modes[N_MODES];
    char json_path[1024];
    int n_mass = 0;
    FILE *md;
    double t_start = gm_now();

    for (c = 6; c < argc; c++)
        if (parse_override(argv[c])) { fprintf(stderr, "gemma-eval: unknown option or bad value: %s\n", argv[c]); return 2; }
    if (ovr.segment < 0 || (ovr.segment > 0 && EVAL_BATCH % ovr.segment) || ovr.block < 0 || ovr.base_budget < 0) {
        fprintf(stderr, "gemma-eval: segment must divide %d; block and base_budget must be positive\n", EVAL_BATCH);
        return 2;
    }
    { /* the library's own checks of the sparse configuration, before the model loads */
        ei_config cfg = mode_config(M_RAGGED);
        ei_context *ctx = NULL;
        ei_result r = ei_context_create(&cfg, &ctx);
        if (r != EI_OK) {
            fprintf(stderr, "gemma-eval: configuration: %s (%s)\n", ei_result_name(r), ei_last_error());
            return 2;
        }
        ei_context_destroy(ctx);
    }
    { /* the JSON report: the markdown path with .md replaced by .json (or .json appended) */
        size_t n = strlen(out_path);
        if (n + 6 > sizeof json_path) { fprintf(stderr, "gemma-eval: path too long: %s\n", out_path); return 2; }
        memcpy(json_path, out_path, n + 1);
        if (n >= 3 && !strcmp(json_path + n - 3, ".md")) json_path[n - 3] = 0;
        strcat(json_path, ".json");
    }
    if (gm_model_load(&m, model, err, sizeof err)) { fprintf(stderr, "gemma-eval: %s\n", err); return 1; }
    {
        FILE *mf = fopen(model, "rb");
        if (mf && fseek(mf, 0, SEEK_END) == 0) model_bytes = (uint64_t)ftell(mf);
        if (mf) fclose(mf);
    }
    text = strcmp(text_path, "licences") ? load_text_file(text_path, &len) : load_licences(&len);
    ids = text ? tokenize_all(&m.tok, text, len, 1, &n_all) : NULL;
    if (!ids) { fprintf(stderr, "gemma-eval: cannot read %s\n", text_name); return 1; }
    pool = gm_pool_create(gm_default_threads());
    /* with one kv head the reference's per-segment count (max over heads) is the
       head's own count: that plan is the ragged plan, so it is not run twice */
    n_modes = m.hp.n_kv_head > 1 ? M_PERSEG + 1 : M_PERSEG;
    /* perplexity table: the passkey modes, then the precision reference: how far a
       common engine choice (K/V cached in bf16) moves a dense run, for scale */
    for (n_ppl = 0; n_ppl < n_modes; n_ppl++) ppl_modes[n_ppl] = n_ppl;
    if (est_kind != EST_NONE) n_ppl = 1; /* an estimator's run: dense (cached) and the oracle row only */
    if (est_shortlist > 0 && (est_kind == EST_NONE || !ovr.oracle)) {
        fprintf(stderr, "gemma-eval: shortlist= needs estimate= (and the oracle row)\n");
        return 2;
    }
    if (est_shortlist > 0) gm_plan_extra_flags |= EI_PLAN_SCORES;
    if (ovr.oracle) ppl_modes[n_ppl++] = M_ORACLE;
    if (!ovr.no_reference) ppl_modes[n_ppl++] = M_BF16KV;
    md = fopen(out_path, "w");
    if (!md) { fprintf(stderr, "gemma-eval: cannot write %s\n", out_path); return 1; }
    rep.path = json_path;
    rep.model = model;
    rep.text = text_name;
    rep.tokens_in_text = n_all;
    rep.threads = gm_pool_size(pool);
    rep.n_modes = n_modes;
    rep.n_pk = n_pk;
    for (c = 0; c < n_pk; c++) rep.pk_ctxs[c] = pk_ctxs[c];
    if (write_json(0, NAN)) { fprintf(stderr, "gemma-eval: cannot write %s\n", json_path); return 1; }
    {
        ei_config d = mode_config(M_RAGGED);
        char sparse_list[256] = "", dense_note[128] = "";
        int l, n_local = 0;
        for (l = 0; l < m.hp.n_layer; l++) {
            size_t w = strlen(sparse_list);
            if (!m.layers[l].is_global) n_local++;
            else if (ovr.dense_layers >> l & 1)
                snprintf(dense_note + strlen(dense_note), sizeof dense_note - strlen(dense_note), "%s%d", *dense_note ? ", " : "", l);
            else snprintf(sparse_list + w, sizeof sparse_list - w, "%s%d", w ? ", " : "", l);
        }
        if (*dense_note) {
            size_t w = strlen(sparse_list);
            snprintf(sparse_list + w, sizeof sparse_list - w, " (global layers %s kept dense)", dense_note);
        }
        char rank_desc[512];
        if (d.ranking == EI_RANK_SAMPLED)
            snprintf(rank_desc, sizeof rank_desc, "sampled attention mass (%d real query rows per segment and kv head, scored exactly)",
                     (int)d.rank_samples);
        else if (d.ranking == EI_RANK_ANTIDIAGONAL)
            snprintf(rank_desc, sizeof rank_desc,
                     "antidiagonal attention mass (%d query tiles of one block per segment and kv head, each row one key "
                     "of every block, XAttention's antidiagonals)",
                     (int)d.rank_samples);
        else snprintf(rank_desc, sizeof rank_desc, "the reference's block score (the paper's)");
        if (d.top_p > 0)
            snprintf(rank_desc + strlen(rank_desc), sizeof rank_desc - strlen(rank_desc),
                     "; keep counts: top-p %g of the ranking's mass, between 1x and %gx the base budget", d.top_p,
                     (double)(d.budget_max_factor > 1.0 ? d.budget_max_factor : 1.0));
        else snprintf(rank_desc + strlen(rank_desc), sizeof rank_desc - strlen(rank_desc), "; keep counts: the budget recurrence");
        snprintf(rank_desc + strlen(rank_desc), sizeof rank_desc - strlen(rank_desc),
                 "; always kept: %d sink block(s) from position 0, %d local block(s) before the segment", (int)d.sink_blocks,
                 (int)d.local_blocks);
        fprintf(md, "# entropyinfer on Gemma 3 270M (Q4_K_M GGUF, f32 engine)\n\n");
        if (argc > 6) {
            fprintf(md, "Options:");
            for (c = 6; c < argc; c++) fprintf(md, " `%s`", argv[c]);
            fprintf(md, "\n\n");
        }
        fprintf(md, "Ranking: %s (ranking=%s, rank_samples %d, rank_precision %s, rank_rows %s, top_p %g, sink_blocks %d, local_blocks %d).\n\n",
                rank_desc, ranking_id(d.ranking), (int)d.rank_samples,
                d.rank_precision == EI_RANK_PRECISION_INT8 ? "int8" : "f32",
                d.rank_rows == EI_RANK_ROWS_SPREAD ? "spread" : "even", d.top_p, (int)d.sink_blocks, (int)d.local_blocks);
        fprintf(md, "Configuration: %s%s: segment %d, block %d, threshold_len %lld, base_budget %d "
                    "(dynamic heads x%.0f..x%.0f), e_t %g, delta_t %.1f, alpha %.1f; last segment dense. "
                    "entropyinfer runs in the global layers %s; the %d sliding-window (%d) layers are dense in every mode. "
                    "%d threads on a shared 2-core machine: timings are indicative only. "
                    "%s\n\n",
                ovr.ranking >= EI_RANK_SAMPLED ? "the library's preset ei_config_quality()" : "the paper's defaults",
                ovr_changes_config() ? " with overrides from the command line" : "",
                d.segment_size, d.block_size, (long long)d.threshold_len, d.base_budget, (double)d.budget_min_factor,
                (double)d.budget_max_factor, (double)d.rigid_entropy, (double)d.delta_t, (double)d.alpha, sparse_list, n_local,
                m.hp.sliding_window, gm_pool_size(pool),
                n_modes <= M_PERSEG ? "This model has a single kv head per layer, so the reference's per-segment budget (the max over "
                                    "heads) is that head's own budget: the per-segment plan is the ragged plan and is not run separately."
                                  : "Ragged: each kv head its own budget; per-segment: the reference's max over heads for every head.");
        fprintf(md, "## Perplexity and top-1 agreement on the sparse segments\n\n");
        fprintf(md, "Text: the first L tokens of %s (%lld tokens in all). Scored: next-token "
                    "predictions at positions in [4096, start of the last segment), subsampled to at most 4096 positions "
                    "(same positions in every mode). Density: mean fraction of the dense causal keys that a sparse segment "
                    "attends (kept blocks + half its own segment, over all global layers).\n\n",
                text_name, (long long)n_all);
        fprintf(md, "| context | mode | scored | perplexity | vs dense | top-1 agreement | agreement, first 64 / rest of a segment | density | global attention s | prefill s |\n");
        fprintf(md, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        fflush(md);
    }
    for (c = 0; c < n_ctx; c++) {
        int64_t L = ctxs[c], lo = 4096, hi, n_pos, stride, i;
        int64_t *pos;
        int32_t *am[N_MODES];
        ppl_row rows[N_MODES];
        if (L + 1 > n_all || L > m.hp.n_ctx) { fprintf(stderr, "skip context %lld (document or model too short)\n", (long long)L); continue; }
        hi = (L + EVAL_BATCH - 1) / EVAL_BATCH * EVAL_BATCH - EVAL_BATCH;
        if (hi <= lo) continue;
        stride = (hi - lo + 4095) / 4096;
        n_pos = (hi - lo + stride - 1) / stride;
        pos = (int64_t *)malloc((size_t)n_pos * sizeof(int64_t));
        for (i = 0; i < n_pos; i++) pos[i] = lo + i * stride;
        for (mi = 0; mi < n_ppl; mi++) {
            mode = ppl_modes[mi];
            am[mode] = (int32_t *)malloc((size_t)n_pos * sizeof(int32_t));
            fprintf(stderr, "[%6.0fs] context %lld: %s ...\n", gm_now() - t_start, (long long)L, mode_name[mode]);
            if (ppl_run(&m, pool, mode, ids, L, pos, n_pos, am[mode], &rows[mode], err, sizeof err)) {
                fprintf(stderr, "gemma-eval: %s\n", err);
                return 1;
            }
            {
                /* agreement overall, and split by where the token sits in its segment: the
                   first 64 tokens of a sparse segment see only kept blocks before them in
                   the global layers (no guaranteed local window), the rest also see
                   64+ keys of their own segment */
                int64_t agree = 0, nh = 0, ah = 0, ar = 0, seg = mode_config(mode).segment_size;
                for (i = 0; i < n_pos; i++) {
                    int same = am[mode][i] == am[M_DENSE][i], head = pos[i] % seg < 64;
                    agree += same;
                    nh += head;
                    ah += head && same;
                    ar += !head && same;
                }
                rows[mode].agree = (double)agree / (double)n_pos;
                rows[mode].agree_head = nh ? (double)ah / (double)nh : 1.0;
                rows[mode].agree_rest = n_pos > nh ? (double)ar / (double)(n_pos - nh) : 1.0;
            }
            fprintf(md, "| %lld | %s | %lld | %.4f | %+.2f%% | %.2f%% | %.1f%% / %.1f%% | %.1f%% | %.2f | %.1f |\n", (long long)L,
                    mode_name[mode], (long long)rows[mode].n_scored, rows[mode].ppl,
                    100.0 * (rows[mode].ppl / rows[M_DENSE].ppl - 1.0), 100.0 * rows[mode].agree,
                    100.0 * rows[mode].agree_head, 100.0 * rows[mode].agree_rest, 100.0 * rows[mode].density, rows[mode].t_attn, rows[mode].t_prefill);
            fflush(md);
            if (rep.n_rows < (int)(sizeof rep.rows / sizeof rep.rows[0])) {
                json_row *jr = &rep.rows[rep.n_rows++];
                jr->ctx = L;
                jr->mode = mode;
                jr->r = rows[mode];
                jr->ppl_dense = rows[M_DENSE].ppl;
                jr->mass_plan = jr->mass_oracle = NAN;
                if (mass_kept.rows && (mode == M_ORACLE || (ovr.mass && (mode == M_RAGGED || mode == M_PERSEG)))) {
                    jr->mass_plan = mass_kept.ref / (double)mass_kept.rows;
                    jr->mass_oracle = mass_kept.oracle / (double)mass_kept.rows;
                    n_mass++;
                }
                if (write_json(0, NAN)) fprintf(stderr, "gemma-eval: cannot write %s\n", json_path);
            }
        }
        for (mi = 0; mi < n_ppl; mi++) free(am[ppl_modes[mi]]);
        free(pos);
    }

    if (n_mass) {
        fprintf(md, "\nAttention mass that the kept blocks hold, as a share of what the segment's queries put on "
                    "all keys before the segment (dense softmax; mean over layers and sparse segments), at the same counts "
                    "(the oracle row: the plan's counts under the run's ranking, %s):\n\n"
                    "| context | measured in the mode | the plan's ranking | oracle ranking |\n|---:|---|---:|---:|\n",
                ranking_id(mode_config(M_RAGGED).ranking));
        for (c = 0; c < rep.n_rows; c++)
            if (isfinite(rep.rows[c].mass_plan))
                fprintf(md, "| %lld | %s | %.1f%% | %.1f%% |\n", (long long)rep.rows[c].ctx, mode_name[rep.rows[c].mode],
                        100.0 * rep.rows[c].mass_plan, 100.0 * rep.rows[c].mass_oracle);
    }
    if (!n_pk) {
        fprintf(md, "\nPasskey retrieval: not run.\n");
        goto done;
    }
    fprintf(md, "\n## Passkey retrieval\n\n");
    fprintf(md, "Filler \"%s\" repeated; the sentence \"The pass key is NNNNN. Remember it. NNNNN is the pass key.\" at the "
                "given depth; the prompt ends \"What is the pass key? The pass key is\" and 8 tokens are decoded greedily. "
                "A cell shows whether the key was reproduced and the decoded text.\n\n", FILLER);
    fprintf(md, "| context | depth | key | dense | entropyinfer ragged |%s\n|---:|---:|---:|---|---|%s\n",
            n_modes > M_PERSEG ? " entropyinfer per-segment |" : "", n_modes > M_PERSEG ? "---|" : "");
    fflush(md);
    {
        const double depths[3] = {0.1, 0.5, 0.9};
        int d, hits[N_MODES] = {0}, total = 0;
        for (c = 0; c < n_pk; c++)
            for (d = 0; d < 3; d++) {
                int key = 10000 + (int)((uint32_t)(pk_ctxs[c] * 7919 + d * 104729) % 90000u);
                int64_t n = 0;
                int32_t *pids = passkey_prompt(&m.tok, pk_ctxs[c], depths[d], key, &n);
                pk_trial *tr = &rep.trials[rep.n_trials++]; /* at most 8 contexts x 3 depths */
                tr->ctx = pk_ctxs[c];
                tr->tokens = n;
                tr->depth = depths[d];
                tr->key = key;
                tr->n_done = 0;
                fprintf(md, "| %lld | %.0f%% | %05d |", (long long)n, depths[d] * 100, key);
                for (mode = 0; mode < n_modes; mode++) {
                    char ans[256];
                    int ok = 0;
                    fprintf(stderr, "[%6.0fs] passkey %lld depth %.0f%%: %s ...\n", gm_now() - t_start, (long long)n, depths[d] * 100,
                            mode_name[mode]);
                    if (passkey_run(&m, pool, mode, pids, n, key, ans, sizeof ans, &ok, err, sizeof err)) {
                        fprintf(stderr, "gemma-eval: %s\n", err);
                        return 1;
                    }
                    {
                        char *p;
                        for (p = ans; *p; p++) if (*p == '|') *p = '/';
                    }
                    fprintf(md, " %s `%s` |", ok ? "yes" : "**no**", ans);
                    hits[mode] += ok;
                    fflush(md);
                    tr->ok[mode] = ok;
                    snprintf(tr->answer[mode], sizeof tr->answer[mode], "%s", ans);
                    tr->n_done = mode + 1;
                    if (write_json(0, NAN)) fprintf(stderr, "gemma-eval: cannot write %s\n", json_path);
                }
                fprintf(md, "\n");
                total++;
                free(pids);
            }
        fprintf(md, "\nRetrieved: dense %d/%d, ragged %d/%d", hits[0], total, hits[1], total);
        if (n_modes > M_PERSEG) fprintf(md, ", per-segment %d/%d", hits[M_PERSEG], total);
        fprintf(md, ".\n");
    }
done:
    if (sl_all)
        fprintf(md, "\nShortlist (shortlist=%g): %.1f%% of the visible blocks, over the estimator's segments.\n",
                est_shortlist, 100.0 * (double)sl_blocks / (double)sl_all);
    fprintf(md, "\nTotal evaluation time: %.0f s.\n", gm_now() - t_start);
    fclose(md);
    if (write_json(1, gm_now() - t_start)) { fprintf(stderr, "gemma-eval: cannot write %s\n", json_path); return 1; }
    fprintf(stderr, "wrote %s and %s in %.0f s\n", out_path, json_path, gm_now() - t_start);
    free(ids);
    free(text);
    gm_pool_destroy(pool);
    gm_model_free(&m);
    return 0;
}
