/* common.h - helpers shared by demo.c and eval.c (static, header-only). */
#ifndef GEMMA_COMMON_H
#define GEMMA_COMMON_H

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gemma.h"

/* A long real document: the regular files of /usr/share/common-licenses
   (Debian's base-files), sorted by name, concatenated (~300 KB, ~60k
   tokens). Returns malloc'd text. */
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static char *load_licences(size_t *len) {
    const char *dir = "/usr/share/common-licenses";
    DIR *d = opendir(dir);
    struct dirent *e;
    char *names[256], *text = NULL;
    int n = 0, i;
    size_t total = 0;
    if (!d) return NULL;
    while ((e = readdir(d)) && n < 256)
        if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof(char *), cmp_str);
    for (i = 0; i < n; i++) {
        char path[1024];
        struct stat st;
        FILE *f;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (f = fopen(path, "rb"))) {
            char *nt = (char *)realloc(text, total + (size_t)st.st_size + 2);
            if (nt) {
                text = nt;
                total += fread(text + total, 1, (size_t)st.st_size, f);
                text[total++] = '\n';
            }
            fclose(f);
        }
        free(names[i]);
    }
    if (text) text[total] = 0;
    *len = total;
    return text;
}

/* A whole text file (eval's long document, the demo's GEMMA_DEMO_TEXT). Returns malloc'd text. */
static char *load_text_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (text = (char *)malloc((size_t)n + 1)) != NULL) {
        *len = fread(text, 1, (size_t)n, f);
        text[*len] = 0;
    }
    fclose(f);
    return text;
}


static int32_t *tokenize_all(const gm_tokenizer *t, const char *text, size_t n, int add_bos, int64_t *ntok) {
    int64_t cap = (int64_t)n + 2, k;
    int32_t *ids = (int32_t *)malloc((size_t)cap * sizeof(int32_t));
    if (!ids) return NULL;
    k = gm_encode(t, text, n, add_bos, 0, ids, cap);
    if (k < 0 || k > cap) { free(ids); return NULL; }
    *ntok = k;
    return ids;
}

/* For rows of hidden states (predicting targets[i]): accumulate the
   negative log-likelihood and store the arg-max token of each row. */
typedef struct score_acc { double nll; int64_t n; } score_acc;
static void score_rows(gm_state *s, const float *hidden, int64_t n_rows, const int32_t *targets, int32_t *argmax,
                       float *logits_buf, int chunk, score_acc *acc) {
    const int V = s->m->hp.n_vocab, Dm = s->m->hp.d_model;
    int64_t r0;
    for (r0 = 0; r0 < n_rows; r0 += chunk) {
        int c = n_rows - r0 < chunk ? (int)(n_rows - r0) : chunk, a;
        gm_logits(s, hidden + (size_t)r0 * Dm, c, logits_buf);
        for (a = 0; a < c; a++) {
            const float *lr = logits_buf + (size_t)a * V;
            float mx = lr[0];
            int32_t best = 0;
            double se = 0;
            int v;
            for (v = 1; v < V; v++) if (lr[v] > mx) { mx = lr[v]; best = v; }
            for (v = 0; v < V; v++) se += exp((double)(lr[v] - mx));
            if (argmax) argmax[r0 + a] = best;
            if (targets && acc) {
                acc->nll += -((double)(lr[targets[r0 + a]] - mx) - log(se));
                acc->n++;
            }
        }
    }
}

static int32_t argmax_row(const float *lr, int V) {
    int32_t best = 0;
    int v;
    for (v = 1; v < V; v++) if (lr[v] > lr[best]) best = v;
    return best;
}

/* printable, single-line version of a token sequence */
static void detok(const gm_tokenizer *t, const int32_t *ids, int n, char *out, size_t cap) {
    size_t w = 0;
    int i;
    out[0] = 0;
    for (i = 0; i < n; i++) {
        char piece[128];
        int k, len = gm_decode_piece(t, ids[i], piece, sizeof piece);
        for (k = 0; k < len && w + 3 < cap; k++) {
            char c = piece[k];
            if (c == '\n') { out[w++] = '\\'; out[w++] = 'n'; }
            else out[w++] = (unsigned char)c < 32 ? ' ' : c;
        }
    }
    out[w] = 0;
}

#endif
