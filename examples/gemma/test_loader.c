/* test_loader.c - the GGUF reader must turn truncated or corrupted files into
   errors, never crashes or reads outside the file.

     build/test_gemma_loader MODEL.gguf

   1. truncation: the file cut at every byte of its first 4 KiB, at ~3000
      points over the metadata and tensor-info region and ~300 over the
      tensor data: every cut that loses tensor data must fail with a message;
   2. corruption: 2400 single bytes and 600 8-byte fields of the header
      region overwritten with random or extreme values: parsing must either
      fail with a message or succeed with every tensor inside the buffer,
      and then the tokenizer and hyper-parameter reads must not crash;
   3. targeted: absurd counts, string lengths, dims, types and offsets;
   4. whole-model loads of missing, empty and garbage files fail cleanly.
   Build with -fsanitize=address,undefined to also catch stray reads.
   Prints "N passed, M failed". */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemma.h"

static int n_pass, n_fail;
#define CHECK(cond, ...)                          \
    do {                                          \
        if (cond) n_pass++;                       \
        else {                                    \
            n_fail++;                             \
            if (n_fail < 20) {                    \
                fprintf(stderr, "FAIL: ");        \
                fprintf(stderr, __VA_ARGS__);     \
                fprintf(stderr, "\n");            \
            }                                     \
        }                                         \
    } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* every tensor lies inside the buffer (what a successful parse promises) */
static int tensors_inside(const gguf_file *f, const uint8_t *buf, size_t size) {
    uint64_t i;
    for (i = 0; i < f->n_tensors; i++) {
        const uint8_t *p = (const uint8_t *)f->tensors[i].data;
        if (p < buf || p > buf + size || f->tensors[i].nbytes > (uint64_t)(buf + size - p)) return 0;
    }
    return 1;
}

/* exercise what the engine reads from metadata after a successful parse */
static void use_metadata(const gguf_file *f) {
    gm_tokenizer t;
    char err[256];
    int64_t v;
    double d;
    gguf_str s;
    gguf_get_int(f, "gemma3.block_count", &v);
    gguf_get_float(f, "gemma3.rope.freq_base", &d);
    gguf_get_str(f, "general.architecture", &s);
    if (gm_tokenizer_init(&t, f, err, sizeof err) == 0) {
        int32_t ids[64];
        char piece[64];
        int64_t n = gm_encode(&t, "Hello  world\n\n<b>x</b>", 22, 1, 1, ids, 64), i;
        for (i = 0; i < n && i < 64; i++) gm_decode_piece(&t, ids[i], piece, sizeof piece);
        gm_tokenizer_free(&t);
    }
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : ".cache/model/gemma-3-270m-q4_k_m.gguf";
    FILE *fp = fopen(path, "rb");
    uint8_t *buf, *work;
    size_t size, hdr, cut, data_end = 0;
    gguf_file f;
    char err[512];
    int i, rc;
    uint64_t t;
    if (!fp) { fprintf(stderr, "test_loader: cannot open %s (run `make model`)\n", path); return 1; }
    fseek(fp, 0, SEEK_END);
    size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    buf = (uint8_t *)malloc(size);
    work = (uint8_t *)malloc(size);
    if (!buf || !work || fread(buf, 1, size, fp) != size) { fprintf(stderr, "test_loader: read failed\n"); return 1; }
    fclose(fp);

    /* the intact file parses */
    rc = gguf_parse(buf, size, &f, err, sizeof err);
    CHECK(rc == 0, "intact file: %s", err);
    if (rc) return 1;
    hdr = (size_t)f.data_offset;
    for (t = 0; t < f.n_tensors; t++) {
        size_t e = (size_t)(f.data_offset + f.tensors[t].offset + f.tensors[t].nbytes);
        if (e > data_end) data_end = e;
    }
    printf("%s: %zu bytes, %llu kv, %llu tensors, header %zu bytes, data ends at %zu\n", path, size,
           (unsigned long long)f.n_kv, (unsigned long long)f.n_tensors, hdr, data_end);
    use_metadata(&f);
    gguf_close(&f);

    /* 1. truncation (parsing a prefix of the same buffer: no copies needed) */
    {
        int n_cuts = 0;
        for (cut = 0; cut < 4096 && cut < size; cut++, n_cuts++) {
            err[0] = 0;
            rc = gguf_parse(buf, cut, &f, err, sizeof err);
            CHECK(rc != 0 && err[0], "truncated at %zu: parse %s", cut, rc ? "gave no message" : "succeeded");
            if (rc == 0) gguf_close(&f);
        }
        for (i = 0; i < 3000; i++, n_cuts++) {
            cut = (size_t)(rnd() % hdr);
            err[0] = 0;
            rc = gguf_parse(buf, cut, &f, err, sizeof err);
            CHECK(rc != 0 && err[0], "truncated at %zu (header)", cut);
            if (rc == 0) gguf_close(&f);
        }
        for (i = 0; i < 300; i++, n_cuts++) {
            cut = hdr + (size_t)(rnd() % (data_end - hdr));
            err[0] = 0;
            rc = gguf_parse(buf, cut, &f, err, sizeof err);
            CHECK(rc != 0 && err[0], "truncated at %zu (data)", cut);
            if (rc == 0) gguf_close(&f);
        }
        rc = gguf_parse(buf, data_end - 1, &f, err, sizeof err);
        CHECK(rc != 0, "truncated by one byte of tensor data");
        if (rc == 0) gguf_close(&f);
        printf("truncation: %d cuts; e.g. \"%s\"\n", n_cuts, err);
    }

    /* 2. corruption of the header region */
    {
        int ok = 0, bad = 0;
        memcpy(work, buf, hdr); /* only the header region is ever modified */
        for (i = 0; i < 3000; i++) {
            size_t at = (size_t)(rnd() % hdr), len = i < 2400 ? 1 : 8, k;
            uint8_t saved[8];
            if (at + len > hdr) at = hdr - len;
            memcpy(saved, work + at, len);
            for (k = 0; k < len; k++) {
                uint64_t r = rnd();
                work[at + k] = (uint8_t)(i % 3 == 0 ? 0xFF : i % 3 == 1 ? 0x00 : r);
            }
            rc = gguf_parse(work, size, &f, err, sizeof err);
            if (rc == 0) {
                ok++;
                CHECK(tensors_inside(&f, work, size), "corrupt byte at %zu: a tensor points outside the file", at);
                if (ok % 16 == 1) use_metadata(&f); /* building a 262k-token tokenizer takes a while */
                gguf_close(&f);
            } else {
                bad++;
                CHECK(err[0] != 0, "corrupt byte at %zu: error without a message", at);
            }
            memcpy(work + at, saved, len);
        }
        printf("corruption: 3000 cases, %d rejected with a message, %d still valid (e.g. a changed letter in a string)\n", bad, ok);
    }

    /* 3. targeted absurd values (work is intact again in the header region) */
    {
        struct { size_t at; uint64_t v; int len; const char *what; } cases[] = {
            {0, 0x46554746, 4, "bad magic"},
            {4, 1, 4, "version 1"},
            {4, 99, 4, "version 99"},
            {8, ~0ull, 8, "n_tensors = 2^64-1"},
            {8, 1ull << 40, 8, "n_tensors = 2^40"},
            {16, ~0ull, 8, "n_kv = 2^64-1"},
            {16, 1ull << 33, 8, "n_kv = 2^33"},
            {24, ~0ull, 8, "first key length = 2^64-1"},
            {24, 1ull << 62, 8, "first key length = 2^62"},
        };
        size_t c;
        for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            uint8_t saved[8];
            int k;
            memcpy(saved, work + cases[c].at, 8);
            for (k = 0; k < cases[c].len; k++) work[cases[c].at + k] = (uint8_t)(cases[c].v >> (8 * k));
            err[0] = 0;
            rc = gguf_parse(work, size, &f, err, sizeof err);
            CHECK(rc != 0 && err[0], "targeted '%s' was accepted", cases[c].what);
            if (rc == 0) gguf_close(&f);
            else printf("  %-28s -> %s\n", cases[c].what, err);
            memcpy(work + cases[c].at, saved, 8);
        }
        /* the first tensor info: dims, type, offset */
        rc = gguf_parse(buf, size, &f, err, sizeof err);
        if (rc == 0) {
            /* the first block-quantized tensor, so that a row of 33 is not a block multiple */
            uint64_t q = 0;
            size_t ti;
            uint32_t nd;
            while (q + 1 < f.n_tensors && f.tensors[q].type == GGUF_T_F32) q++;
            ti = (size_t)((const uint8_t *)f.tensors[q].name.p - buf) + (size_t)f.tensors[q].name.n;
            nd = f.tensors[q].n_dims;
            struct { size_t at; uint64_t v; int len; const char *what; } tc[] = {
                {ti, 0, 4, "tensor with 0 dims"},
                {ti, 9, 4, "tensor with 9 dims"},
                {ti + 4, 0, 8, "tensor dim 0"},
                {ti + 4, ~0ull, 8, "tensor dim 2^64-1"},
                {ti + 4, 1ull << 45, 8, "tensor dim 2^45"},
                {ti + 4, 33, 8, "row not a block multiple"},
                {ti + 4 + 8 * (size_t)nd, 77, 4, "unknown tensor type"},
                {ti + 8 + 8 * (size_t)nd, 1, 8, "misaligned offset"},
                {ti + 8 + 8 * (size_t)nd, 1ull << 60, 8, "offset past the end"},
            };
            gguf_close(&f);
            memcpy(work, buf, hdr);
            for (c = 0; c < sizeof tc / sizeof tc[0]; c++) {
                uint8_t saved[8];
                int k;
                memcpy(saved, work + tc[c].at, 8);
                for (k = 0; k < tc[c].len; k++) work[tc[c].at + k] = (uint8_t)(tc[c].v >> (8 * k));
                err[0] = 0;
                rc = gguf_parse(work, size, &f, err, sizeof err);
                /* a zero-dim row or bad type is an error; for dims that still fit, the
                   tensor would overlap others or run past the end: either way an error */
                CHECK(rc != 0 && err[0], "targeted '%s' was accepted", tc[c].what);
                if (rc == 0) gguf_close(&f);
                else printf("  %-28s -> %s\n", tc[c].what, err);
                memcpy(work + tc[c].at, saved, 8);
            }
        }
    }

    /* 4. whole-model loads of bad files */
    {
        gm_model m;
        const char *tmp = "build/test_loader_tmp.gguf";
        FILE *o;
        rc = gm_model_load(&m, "/nonexistent/model.gguf", err, sizeof err);
        CHECK(rc != 0 && err[0], "missing file accepted");
        printf("  %-28s -> %s\n", "missing file", err);
        o = fopen(tmp, "wb");
        if (o) {
            fclose(o);
            rc = gm_model_load(&m, tmp, err, sizeof err);
            CHECK(rc != 0 && err[0], "empty file accepted");
            printf("  %-28s -> %s\n", "empty file", err);
            o = fopen(tmp, "wb");
            for (i = 0; i < 100000; i++) fputc((int)(rnd() & 0xff), o);
            fclose(o);
            rc = gm_model_load(&m, tmp, err, sizeof err);
            CHECK(rc != 0 && err[0], "garbage file accepted");
            printf("  %-28s -> %s\n", "garbage file", err);
            o = fopen(tmp, "wb");
            fwrite(buf, 1, hdr + 1000, o); /* header intact, data cut */
            fclose(o);
            rc = gm_model_load(&m, tmp, err, sizeof err);
            CHECK(rc != 0 && err[0], "model file without its data accepted");
            printf("  %-28s -> %s\n", "header only", err);
            remove(tmp);
        }
    }

    free(buf);
    free(work);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
