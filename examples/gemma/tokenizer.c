/* tokenizer.c - SentencePiece-style tokenizer read from GGUF metadata
   (tokenizer.ggml.model = "llama": a vocabulary with scores, byte fallback).

   Encoding, as llama.cpp does it for this model type:
   1. Special tokens are cut out of the text first, longest first:
      user-defined tokens always (Gemma 3 has "\n", "\n\n", runs of spaces
      and tabs, some HTML tags), control tokens only with parse_special.
   2. Each remaining piece: spaces become U+2581, the text is split into
      UTF-8 characters, and the adjacent pair whose concatenation is a
      vocabulary token with the highest score (leftmost on ties) is merged,
      repeatedly, until no pair forms a token.
   3. Symbols that are tokens map to their id; the others fall back to
      <0xXX> byte tokens. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemma.h"

static uint32_t hash_bytes(const char *p, size_t n) {
    uint32_t h = 2166136261u;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h;
}

int32_t gm_find_token(const gm_tokenizer *t, const char *s, size_t n) {
    uint32_t i = hash_bytes(s, n) & t->hash_mask;
    for (;;) {
        int32_t id = t->hash[i];
        if (id < 0) return -1;
        if (t->pieces[id].n == n && memcmp(t->pieces[id].p, s, n) == 0) return id;
        i = (i + 1) & t->hash_mask;
    }
}

static const gm_tokenizer *g_sort_tok; /* qsort has no context argument in C99 */
static int cmp_len_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint64_t nx = g_sort_tok->pieces[x].n, ny = g_sort_tok->pieces[y].n;
    if (nx != ny) return nx > ny ? -1 : 1;
    return x < y ? -1 : x > y;
}

int gm_tokenizer_init(gm_tokenizer *t, const gguf_file *f, char *err, size_t errlen) {
    uint64_t n = 0, ns = 0, nt = 0, i;
    const gguf_kv *toks, *scores, *types;
    gguf_str model;
    int64_t v;
    uint32_t cap;
    memset(t, 0, sizeof(*t));
    if (gguf_get_str(f, "tokenizer.ggml.model", &model) || !gguf_str_eq(model, "llama")) {
        snprintf(err, errlen, "tokenizer: need tokenizer.ggml.model = \"llama\" (SentencePiece)");
        return -1;
    }
    toks = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &n);
    scores = gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VT_F32, &ns);
    types = gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_I32, &nt);
    if (!toks || n == 0 || n > (1u << 24)) {
        snprintf(err, errlen, "tokenizer: missing or bad tokenizer.ggml.tokens");
        return -1;
    }
    if (!scores || ns != n || (types && nt != n)) {
        snprintf(err, errlen, "tokenizer: scores/token_type arrays missing or of the wrong length");
        return -1;
    }
    t->n_vocab = (int32_t)n;
    t->pieces = toks->strs;
    t->scores = (float *)malloc(n * sizeof(float));
    t->types = (int32_t *)malloc(n * sizeof(int32_t));
    for (cap = 1; cap < 2 * n; cap <<= 1) {}
    t->hash = (int32_t *)malloc((size_t)cap * sizeof(int32_t));
    t->specials = (int32_t *)malloc(n * sizeof(int32_t));
    if (!t->scores || !t->types || !t->hash || !t->specials) {
        gm_tokenizer_free(t);
        snprintf(err, errlen, "tokenizer: out of memory");
        return -1;
    }
    t->hash_mask = cap - 1;
    memset(t->hash, 0xff, (size_t)cap * sizeof(int32_t));
    for (i = 0; i < n; i++) {
        memcpy(&t->scores[i], scores->data + 4 * i, 4);
        if (types) {
            const uint8_t *q = types->data + 4 * i;
            t->types[i] = (int32_t)((uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24);
        } else {
            t->types[i] = 1;
        }
    }
    /* text -> id; a later duplicate replaces an earlier one (as llama.cpp) */
    for (i = 0; i < n; i++) {
        uint32_t h = hash_bytes(t->pieces[i].p, (size_t)t->pieces[i].n) & t->hash_mask;
        while (t->hash[h] >= 0) {
            int32_t o = t->hash[h];
            if (t->pieces[o].n == t->pieces[i].n && memcmp(t->pieces[o].p, t->pieces[i].p, (size_t)t->pieces[i].n) == 0) break;
            h = (h + 1) & t->hash_mask;
        }
        t->hash[h] = (int32_t)i;
    }
    for (i = 0; i < 256; i++) {
        char b[8];
        snprintf(b, sizeof b, "<0x%02X>", (unsigned)i);
        t->byte_tok[i] = gm_find_token(t, b, 6);
    }
    for (i = 0; i < n; i++)
        if ((t->types[i] == 3 || t->types[i] == 4) && t->pieces[i].n > 0) t->specials[t->n_specials++] = (int32_t)i;
    g_sort_tok = t;
    qsort(t->specials, (size_t)t->n_specials, sizeof(int32_t), cmp_len_desc);
    g_sort_tok = NULL;
    t->bos = gguf_get_int(f, "tokenizer.ggml.bos_token_id", &v) == 0 && v >= 0 && v < (int64_t)n ? (int32_t)v : -1;
    t->eos = gguf_get_int(f, "tokenizer.ggml.eos_token_id", &v) == 0 && v >= 0 && v < (int64_t)n ? (int32_t)v : -1;
    t->unk = gguf_get_int(f, "tokenizer.ggml.unknown_token_id", &v) == 0 && v >= 0 && v < (int64_t)n ? (int32_t)v : -1;
    t->add_bos = gguf_get_int(f, "tokenizer.ggml.add_bos_token", &v) == 0 ? (int)(v != 0) : 1;
    {
        int64_t sp = 0;
        if (gguf_get_int(f, "tokenizer.ggml.add_space_prefix", &sp) == 0 && sp) {
            /* Gemma 3 says false; other SPM models prepend a space. Not needed here. */
        }
    }
    return 0;
}

void gm_tokenizer_free(gm_tokenizer *t) {
    free(t->scores);
    free(t->types);
    free(t->hash);
    free(t->specials);
    memset(t, 0, sizeof(*t));
}

/* ------------------------------------------------------------ SPM merging */
typedef struct sym { int32_t prev, next; size_t off, n; } sym;
typedef struct bigram { int32_t left, right; float score; size_t size; } bigram;

/* max-heap: higher score first, then lower left index */
static int bg_less(const bigram *a, const bigram *b) {
    return a->score < b->score || (a->score == b->score && a->left > b->left);
}
typedef struct heap { bigram *a; size_t n, cap; } heap;
static int heap_push(heap *h, bigram b) {
    size_t i;
    if (h->n == h->cap) {
        size_t nc = h->cap ? 2 * h->cap : 64;
        bigram *na = (bigram *)realloc(h->a, nc * sizeof(bigram));
        if (!na) return -1;
        h->a = na;
        h->cap = nc;
    }
    i = h->n++;
    h->a[i] = b;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_less(&h->a[p], &h->a[i])) break;
        { bigram tmp = h->a[p]; h->a[p] = h->a[i]; h->a[i] = tmp; }
        i = p;
    }
    return 0;
}
static bigram heap_pop(heap *h) {
    bigram top = h->a[0];
    size_t i = 0;
    h->a[0] = h->a[--h->n];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && bg_less(&h->a[m], &h->a[l])) m = l;
        if (r < h->n && bg_less(&h->a[m], &h->a[r])) m = r;
        if (m == i) break;
        { bigram tmp = h->a[m]; h->a[m] = h->a[i]; h->a[i] = tmp; }
        i = m;
    }
    return top;
}

typedef struct outbuf { int32_t *out; int64_t cap, n; } outbuf;
static void emit(outbuf *o, int32_t id) {
    if (o->n < o->cap) o->out[o->n] = id;
    o->n++;
}

static int try_bigram(const gm_tokenizer *t, const char *s, const sym *syms, int32_t l, int32_t r, heap *h) {
    bigram b;
    int32_t id;
    if (l < 0 || r < 0) return 0;
    id = gm_find_token(t, s + syms[l].off, syms[l].n + syms[r].n);
    if (id < 0) return 0;
    b.left = l;
    b.right = r;
    b.score = t->scores[id];
    b.size = syms[l].n + syms[r].n;
    return heap_push(h, b);
}

static int utf8_len(uint8_t c) {
    static const int lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

/* Tokenize one piece of plain text (no special tokens in it). */
static int spm_piece(const gm_tokenizer *t, const char *text, size_t n, outbuf *o) {
    char *s;
    size_t m = 0, i, nsym = 0;
    sym *syms;
    heap h = {0};
    int32_t k;
    int rc = 0;
    if (n == 0) return 0;
    s = (char *)malloc(3 * n);
    syms = (sym *)malloc(3 * n * sizeof(sym));
    if (!s || !syms) { free(s); free(syms); return -1; }
    for (i = 0; i < n; i++) {  /* escape whitespace: ' ' -> U+2581 */
        if (text[i] == ' ') { s[m++] = (char)0xE2; s[m++] = (char)0x96; s[m++] = (char)0x81; }
        else s[m++] = text[i];
    }
    for (i = 0; i < m;) {
        size_t len = (size_t)utf8_len((uint8_t)s[i]);
        if (len > m - i) len = m - i;
        syms[nsym].off = i;
        syms[nsym].n = len;
        syms[nsym].prev = (int32_t)nsym - 1;
        syms[nsym].next = i + len < m ? (int32_t)nsym + 1 : -1;
        nsym++;
        i += len;
    }
    for (i = 1; i < nsym && rc == 0; i++) rc = try_bigram(t, s, syms, (int32_t)i - 1, (int32_t)i, &h);
    while (h.n > 0 && rc == 0) {
        bigram b = heap_pop(&h);
        sym *L = &syms[b.left], *R = &syms[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue; /* stale */
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) syms[R->next].prev = b.left;
        rc = try_bigram(t, s, syms, L->prev, b.left, &h);
        if (rc == 0) rc = try_bigram(t, s, syms, b.left, L->next, &h);
    }
    for (k = 0; rc == 0 && k >= 0 && nsym > 0; k = syms[k].next) {
        int32_t id = gm_find_token(t, s + syms[k].off, syms[k].n);
        if (id >= 0) {
            emit(o, id);
        } else {
            size_t j;
            for (j = 0; j < syms[k].n; j++) {
                int32_t bt = t->byte_tok[(uint8_t)s[syms[k].off + j]];
                emit(o, bt >= 0 ? bt : t->unk);
            }
        }
    }
    free(h.a);
    free(s);
    free(syms);
    return rc;
}

/* A fragment of the input: special token id, or a text range (id = -1). */
typedef struct frag { int32_t id; size_t off, n; } frag;

int64_t gm_encode(const gm_tokenizer *t, const char *text, size_t n, int add_bos, int parse_special,
                  int32_t *out, int64_t cap) {
    outbuf o;
    frag *fr, *nf;
    size_t nfr = 1, capf = 16, i;
    int32_t si;
    o.out = out;
    o.cap = cap;
    o.n = 0;
    if (add_bos && t->bos >= 0) emit(&o, t->bos);
    fr = (frag *)malloc(capf * sizeof(frag));
    if (!fr) return -1;
    fr[0].id = -1;
    fr[0].off = 0;
    fr[0].n = n;
    for (si = 0; si < t->n_specials; si++) {
        int32_t id = t->specials[si];
        const char *sp = t->pieces[id].p;
        size_t sn = (size_t)t->pieces[id].n, nn = 0, capn;
        if (t->types[id] == 3 && !parse_special) continue;
        capn = nfr + 16;
        nf = (frag *)malloc(capn * sizeof(frag));
        if (!nf) { free(fr); return -1; }
        for (i = 0; i < nfr; i++) {
            size_t pos = fr[i].off, end = fr[i].off + fr[i].n;
            if (fr[i].id >= 0) { nf[nn++] = fr[i]; goto grow; }
            while (pos < end) {
                /* find the next occurrence of the special token in [pos, end) */
                size_t at = pos;
                int found = 0;
                while (at + sn <= end) {
                    const char *hit = (const char *)memchr(text + at, sp[0], end - at - sn + 1);
                    if (!hit) break;
                    at = (size_t)(hit - text);
                    if (memcmp(text + at, sp, sn) == 0) { found = 1; break; }
                    at++;
                }
                if (!found) {
                    nf[nn].id = -1; nf[nn].off = pos; nf[nn].n = end - pos; nn++;
                    pos = end;
                } else {
                    if (at > pos) { nf[nn].id = -1; nf[nn].off = pos; nf[nn].n = at - pos; nn++; }
                    if (nn + 2 >= capn) {
                        frag *g = (frag *)realloc(nf, 2 * capn * sizeof(frag));
                        if (!g) { free(nf); free(fr); return -1; }
                        nf = g;
                        capn *= 2;
                    }
                    nf[nn].id = id; nf[nn].off = at; nf[nn].n = sn; nn++;
                    pos = at + sn;
                }
                if (nn + 2 >= capn) {
                    frag *g = (frag *)realloc(nf, 2 * capn * sizeof(frag));
                    if (!g) { free(nf); free(fr); return -1; }
                    nf = g;
                    capn *= 2;
                }
            }
        grow:
            if (nn + 2 >= capn) {
                frag *g = (frag *)realloc(nf, 2 * capn * sizeof(frag));
                if (!g) { free(nf); free(fr); return -1; }
                nf = g;
                capn *= 2;
            }
        }
        free(fr);
        fr = nf;
        nfr = nn;
        capf = capn;
    }
    (void)capf;
    for (i = 0; i < nfr; i++) {
        if (fr[i].id >= 0) emit(&o, fr[i].id);
        else if (spm_piece(t, text + fr[i].off, fr[i].n, &o)) { free(fr); return -1; }
    }
    free(fr);
    return o.n;
}

int gm_decode_piece(const gm_tokenizer *t, int32_t id, char *buf, int cap) {
    int n = 0;
    size_t i;
    const gguf_str *p;
    if (cap <= 0) return 0;
    buf[0] = 0;
    if (id < 0 || id >= t->n_vocab) return 0;
    p = &t->pieces[id];
    if (t->types[id] == 3) return 0;            /* control: nothing */
    if (t->types[id] == 6 && p->n == 6) {         /* <0xXX> */
        unsigned v = 0;
        if (sscanf(p->p + 3, "%2x", &v) == 1 && cap > 1) { buf[0] = (char)v; buf[1] = 0; return 1; }
        return 0;
    }
    for (i = 0; i < p->n && n < cap - 1;) {
        if (i + 3 <= p->n && (uint8_t)p->p[i] == 0xE2 && (uint8_t)p->p[i + 1] == 0x96 && (uint8_t)p->p[i + 2] == 0x81) {
            buf[n++] = ' ';
            i += 3;
        } else {
            buf[n++] = p->p[i++];
        }
    }
    buf[n] = 0;
    return n;
}
