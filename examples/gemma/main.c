/* main.c - command-line front end of the Gemma 3 example engine.

     gemma -m MODEL -p "text" [-n 32]           greedy generation
     gemma -m MODEL --tokenize FILE [-t N]      print token ids (one line)
     gemma -m MODEL --dump-logits OUT -f FILE -t N
            prefill the first N tokens of FILE (BOS first) densely and write
            N x n_vocab float32 logits to OUT and the tokens to OUT.tokens
            (int32), for check_logits.py
     gemma -m MODEL --ppl FILE [-t N]           perplexity of the first N tokens

   Options: --threads K, --batch B (prefill micro-batch, default 512). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemma.h"

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    char *buf;
    long sz;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) || (sz = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) { fclose(f); return NULL; }
    buf = (char *)malloc((size_t)sz + 1);
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) { free(buf); fclose(f); return NULL; }
    buf[sz] = 0;
    fclose(f);
    *n = (size_t)sz;
    return buf;
}

static int32_t *tokenize(const gm_tokenizer *t, const char *text, size_t n, int64_t *ntok) {
    int64_t cap = (int64_t)n + 2, k;
    int32_t *ids = (int32_t *)malloc((size_t)cap * sizeof(int32_t));
    if (!ids) return NULL;
    k = gm_encode(t, text, n, 1, 0, ids, cap);
    if (k < 0 || k > cap) { free(ids); return NULL; }
    *ntok = k;
    return ids;
}

int main(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *tok_file = NULL, *dump = NULL, *file = NULL, *ppl_file = NULL;
    int n_gen = 32, threads = gm_default_threads(), batch = 512, i;
    int64_t n_tok = 0;
    char err[512];
    gm_model m;
    gm_pool *pool;
    gm_state s;
    double t0;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-m") && v) { model = v; i++; }
        else if (!strcmp(a, "-p") && v) { prompt = v; i++; }
        else if (!strcmp(a, "-n") && v) { n_gen = atoi(v); i++; }
        else if (!strcmp(a, "-t") && v) { n_tok = atoll(v); i++; }
        else if (!strcmp(a, "-f") && v) { file = v; i++; }
        else if (!strcmp(a, "--tokenize") && v) { tok_file = v; i++; }
        else if (!strcmp(a, "--dump-logits") && v) { dump = v; i++; }
        else if (!strcmp(a, "--ppl") && v) { ppl_file = v; i++; }
        else if (!strcmp(a, "--threads") && v) { threads = atoi(v); i++; }
        else if (!strcmp(a, "--batch") && v) { batch = atoi(v); i++; }
        else { fprintf(stderr, "usage: see the comment at the top of examples/gemma/main.c (bad argument '%s')\n", a); return 2; }
    }
    if (!model) { fprintf(stderr, "gemma: -m MODEL is required\n"); return 2; }
    t0 = gm_now();
    if (gm_model_load(&m, model, err, sizeof err)) { fprintf(stderr, "gemma: %s\n", err); return 1; }
    fprintf(stderr, "loaded %s: %d layers, d_model %d, %d heads (%d kv) x %d, ffn %d, vocab %d, window %d, in %.2f s\n",
            model, m.hp.n_layer, m.hp.d_model, m.hp.n_head, m.hp.n_kv_head, m.hp.head_dim, m.hp.d_ff, m.hp.n_vocab,
            m.hp.sliding_window, gm_now() - t0);

    if (tok_file) {
        size_t n;
        char *text = read_file(tok_file, &n);
        int32_t *ids;
        int64_t k, j;
        if (!text) { fprintf(stderr, "gemma: cannot read %s\n", tok_file); return 1; }
        ids = tokenize(&m.tok, text, n, &k);
        if (!ids) { fprintf(stderr, "gemma: tokenize failed\n"); return 1; }
        if (n_tok > 0 && n_tok < k) k = n_tok;
        for (j = 0; j < k; j++) printf("%d%c", ids[j], j + 1 < k ? ' ' : '\n');
        free(ids);
        free(text);
        gm_model_free(&m);
        return 0;
    }

    pool = gm_pool_create(threads);
    if (dump || ppl_file) {
        const char *src = dump ? file : ppl_file;
        size_t n;
        char *text = src ? read_file(src, &n) : NULL;
        int32_t *ids;
        int64_t k;
        float *hidden, *logits;
        int64_t j, chunk = 64;
        double nll = 0, t1;
        int64_t top1 = 0;
        FILE *out = NULL;
        if (!text) { fprintf(stderr, "gemma: cannot read input file\n"); return 1; }
        ids = tokenize(&m.tok, text, n, &k);
        if (!ids) { fprintf(stderr, "gemma: tokenize failed\n"); return 1; }
        if (n_tok <= 0 || n_tok > k) n_tok = k;
        if (gm_state_init(&s, &m, pool, n_tok, batch < n_tok ? batch : (int)n_tok, GM_ATTN_DENSE_OWN, NULL, err, sizeof err)) {
            fprintf(stderr, "gemma: %s\n", err);
            return 1;
        }
        hidden = (float *)malloc((size_t)n_tok * m.hp.d_model * sizeof(float));
        logits = (float *)malloc((size_t)chunk * m.hp.n_vocab * sizeof(float));
        t1 = gm_now();
        if (gm_prefill(&s, ids, n_tok, hidden, err, sizeof err)) { fprintf(stderr, "gemma: %s\n", err); return 1; }
        fprintf(stderr, "prefill %lld tokens: %.2f s (matmul %.2f, attention local %.2f global %.2f)\n", (long long)n_tok,
                gm_now() - t1, s.stats.t_matmul, s.stats.t_attn_local, s.stats.t_attn_global);
        if (dump) {
            char path[4096];
            FILE *tf;
            out = fopen(dump, "wb");
            snprintf(path, sizeof path, "%s.tokens", dump);
            tf = fopen(path, "wb");
            if (!out || !tf) { fprintf(stderr, "gemma: cannot write %s\n", dump); return 1; }
            fwrite(ids, sizeof(int32_t), (size_t)n_tok, tf);
            fclose(tf);
        }
        for (j = 0; j < n_tok; j += chunk) {
            int c = n_tok - j < chunk ? (int)(n_tok - j) : (int)chunk, a;
            gm_logits(&s, hidden + (size_t)j * m.hp.d_model, c, logits);
            if (out) fwrite(logits, sizeof(float), (size_t)c * m.hp.n_vocab, out);
            for (a = 0; a < c; a++) {
                const float *lr = logits + (size_t)a * m.hp.n_vocab;
                int64_t pos = j + a, v;
                float mx = lr[0];
                int32_t arg = 0;
                double se = 0;
                if (pos + 1 >= n_tok) break;
                for (v = 0; v < m.hp.n_vocab; v++) if (lr[v] > mx) { mx = lr[v]; arg = (int32_t)v; }
                for (v = 0; v < m.hp.n_vocab; v++) se += exp((double)(lr[v] - mx));
                nll += -((double)(lr[ids[pos + 1]] - mx) - log(se));
                top1 += arg == ids[pos + 1];
            }
        }
        if (out) fclose(out);
        printf("tokens %lld  perplexity %.4f  top1-accuracy %.4f\n", (long long)n_tok, exp(nll / (double)(n_tok - 1)),
               (double)top1 / (double)(n_tok - 1));
        free(hidden);
        free(logits);
        free(ids);
        free(text);
        gm_state_free(&s);
    } else {
        const char *text = prompt ? prompt : "The GNU General Public License is";
        int64_t k;
        int32_t *ids = tokenize(&m.tok, text, strlen(text), &k), next;
        float *hidden, *logits;
        int g;
        char piece[256];
        if (!ids) return 1;
        if (gm_state_init(&s, &m, pool, k + n_gen + 1, batch < k + n_gen + 1 ? batch : (int)(k + n_gen + 1), GM_ATTN_DENSE_OWN, NULL, err, sizeof err)) {
            fprintf(stderr, "gemma: %s\n", err);
            return 1;
        }
        hidden = (float *)malloc((size_t)k * m.hp.d_model * sizeof(float));
        logits = (float *)malloc((size_t)m.hp.n_vocab * sizeof(float));
        t0 = gm_now();
        if (gm_prefill(&s, ids, k, hidden, err, sizeof err)) { fprintf(stderr, "gemma: %s\n", err); return 1; }
        fprintf(stderr, "prefill %lld tokens in %.3f s\n", (long long)k, gm_now() - t0);
        printf("%s", text);
        gm_logits(&s, hidden + (size_t)(k - 1) * m.hp.d_model, 1, logits);
        t0 = gm_now();
        for (g = 0; g < n_gen; g++) {
            int v;
            next = 0;
            for (v = 1; v < m.hp.n_vocab; v++) if (logits[v] > logits[next]) next = v;
            if (next == m.tok.eos) break;
            gm_decode_piece(&m.tok, next, piece, sizeof piece);
            printf("%s", piece);
            fflush(stdout);
            if (gm_decode(&s, &next, 1, hidden, err, sizeof err)) { fprintf(stderr, "gemma: %s\n", err); return 1; }
            gm_logits(&s, hidden, 1, logits);
        }
        printf("\n");
        fprintf(stderr, "decode %d tokens: %.2f tok/s\n", g, g / (gm_now() - t0));
        free(hidden);
        free(logits);
        free(ids);
        gm_state_free(&s);
    }
    gm_pool_destroy(pool);
    gm_model_free(&m);
    return 0;
}
