/* gguf.c - see gguf.h. */
#define _POSIX_C_SOURCE 200809L
#include "gguf.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ errors */
int gguf_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ------------------------------------------------------------ bounded reader */
typedef struct rd {
    const uint8_t *p;
    size_t size, pos;
    int bad;          /* set once a read ran past the end */
} rd;

static const uint8_t *rd_take(rd *r, uint64_t n) {
    if (r->bad || n > r->size - r->pos) { r->bad = 1; return NULL; }
    const uint8_t *q = r->p + r->pos;
    r->pos += (size_t)n;
    return q;
}
static uint32_t rd_u32(rd *r) {
    const uint8_t *q = rd_take(r, 4);
    if (!q) return 0;
    return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}
static uint64_t rd_u64(rd *r) {
    const uint8_t *q = rd_take(r, 8);
    uint64_t v = 0;
    int i;
    if (!q) return 0;
    for (i = 7; i >= 0; i--) v = v << 8 | q[i];
    return v;
}
static int rd_str(rd *r, gguf_str *s) {
    uint64_t n = rd_u64(r);
    const uint8_t *q;
    if (r->bad) return -1;
    q = rd_take(r, n);
    if (!q) return -1;
    s->p = (const char *)q;
    s->n = n;
    return 0;
}

static uint64_t le64(const uint8_t *q) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = v << 8 | q[i];
    return v;
}
static uint32_t le32(const uint8_t *q) {
    return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}
static uint16_t le16(const uint8_t *q) { return (uint16_t)(q[0] | q[1] << 8); }

static int vtype_size(uint32_t t) {
    switch (t) {
    case GGUF_VT_U8: case GGUF_VT_I8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_U16: case GGUF_VT_I16: return 2;
    case GGUF_VT_U32: case GGUF_VT_I32: case GGUF_VT_F32: return 4;
    case GGUF_VT_U64: case GGUF_VT_I64: case GGUF_VT_F64: return 8;
    default: return 0; /* string, array, unknown */
    }
}

int gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.n == n && memcmp(s.p, c, n) == 0;
}

/* ------------------------------------------------------------ tensor types */
int gguf_type_info(uint32_t type, int *be, int *bb) {
    int e = 0, b = 0;
    switch (type) {
    case GGUF_T_F32: e = 1; b = 4; break;
    case GGUF_T_F16: e = 1; b = 2; break;
    case GGUF_T_BF16: e = 1; b = 2; break;
    case GGUF_T_Q4_0: e = 32; b = 18; break;
    case GGUF_T_Q4_1: e = 32; b = 20; break;
    case GGUF_T_Q5_0: e = 32; b = 22; break;
    case GGUF_T_Q5_1: e = 32; b = 24; break;
    case GGUF_T_Q8_0: e = 32; b = 34; break;
    case GGUF_T_Q8_1: e = 32; b = 36; break;
    case GGUF_T_Q2_K: e = 256; b = 84; break;
    case GGUF_T_Q3_K: e = 256; b = 110; break;
    case GGUF_T_Q4_K: e = 256; b = 144; break;
    case GGUF_T_Q5_K: e = 256; b = 176; break;
    case GGUF_T_Q6_K: e = 256; b = 210; break;
    case GGUF_T_Q8_K: e = 256; b = 292; break;
    default: return 0;
    }
    if (be) *be = e;
    if (bb) *bb = b;
    return 1;
}

const char *gguf_type_name(uint32_t type) {
    switch (type) {
    case GGUF_T_F32: return "F32"; case GGUF_T_F16: return "F16"; case GGUF_T_BF16: return "BF16";
    case GGUF_T_Q4_0: return "Q4_0"; case GGUF_T_Q4_1: return "Q4_1";
    case GGUF_T_Q5_0: return "Q5_0"; case GGUF_T_Q5_1: return "Q5_1";
    case GGUF_T_Q8_0: return "Q8_0"; case GGUF_T_Q8_1: return "Q8_1";
    case GGUF_T_Q2_K: return "Q2_K"; case GGUF_T_Q3_K: return "Q3_K";
    case GGUF_T_Q4_K: return "Q4_K"; case GGUF_T_Q5_K: return "Q5_K";
    case GGUF_T_Q6_K: return "Q6_K"; case GGUF_T_Q8_K: return "Q8_K";
    default: return "unknown";
    }
}

/* ------------------------------------------------------------ parsing */
static void free_parsed(gguf_file *f) {
    uint64_t i;
    if (f->kv)
        for (i = 0; i < f->n_kv; i++) free(f->kv[i].strs);
    free(f->kv);
    free(f->tensors);
    f->kv = NULL;
    f->tensors = NULL;
}

static int cmp_tensor_name(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    uint64_t n = x->name.n < y->name.n ? x->name.n : y->name.n;
    int c = memcmp(x->name.p, y->name.p, (size_t)n);
    if (c) return c;
    return x->name.n < y->name.n ? -1 : x->name.n > y->name.n;
}

/* Largest element count we accept for a tensor (keeps byte sizes far from
   overflow) and for a metadata array. */
#define GGUF_MAX_ELEMS ((int64_t)1 << 40)

static int parse(gguf_file *f, char *err, size_t errlen) {
    rd r = {0};
    uint64_t i;
    r.p = f->base;
    r.size = f->size;

    if (f->size < 24) return gguf_fail(err, errlen, "gguf: file too small (%zu bytes) for a GGUF header", f->size);
    if (memcmp(f->base, "GGUF", 4) != 0) return gguf_fail(err, errlen, "gguf: bad magic (not a GGUF file)");
    r.pos = 4;
    f->version = rd_u32(&r);
    if (f->version != 2 && f->version != 3)
        return gguf_fail(err, errlen, "gguf: unsupported version %u (need 2 or 3)", f->version);
    f->n_tensors = rd_u64(&r);
    f->n_kv = rd_u64(&r);
    /* each kv needs >= 8+0+4+1 bytes and each tensor info >= 8+4+8+4+8 bytes */
    if (f->n_kv > (f->size - r.pos) / 13)
        return gguf_fail(err, errlen, "gguf: kv count %llu cannot fit in the file", (unsigned long long)f->n_kv);
    if (f->n_tensors > (f->size - r.pos) / 32)
        return gguf_fail(err, errlen, "gguf: tensor count %llu cannot fit in the file", (unsigned long long)f->n_tensors);

    f->kv = (gguf_kv *)calloc(f->n_kv ? f->n_kv : 1, sizeof(gguf_kv));
    f->tensors = (gguf_tensor *)calloc(f->n_tensors ? f->n_tensors : 1, sizeof(gguf_tensor));
    if (!f->kv || !f->tensors) return gguf_fail(err, errlen, "gguf: out of memory");

    f->alignment = 32;
    for (i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        size_t at = r.pos;
        if (rd_str(&r, &kv->key)) return gguf_fail(err, errlen, "gguf: truncated key of kv %llu (at byte %zu)", (unsigned long long)i, at);
        kv->type = rd_u32(&r);
        if (r.bad) return gguf_fail(err, errlen, "gguf: truncated type of kv '%.*s'", (int)(kv->key.n > 200 ? 200 : kv->key.n), kv->key.p);
        kv->n = 1;
        if (kv->type == GGUF_VT_ARRAY) {
            kv->arr_type = rd_u32(&r);
            kv->n = rd_u64(&r);
            if (r.bad) return gguf_fail(err, errlen, "gguf: truncated array header of '%.*s'", (int)(kv->key.n > 200 ? 200 : kv->key.n), kv->key.p);
            if (kv->arr_type == GGUF_VT_ARRAY) return gguf_fail(err, errlen, "gguf: nested arrays are not supported ('%.*s')", (int)(kv->key.n > 200 ? 200 : kv->key.n), kv->key.p);
        } else {
            kv->arr_type = kv->type;
        }
        if (kv->arr_type == GGUF_VT_STRING) {
            uint64_t j;
            if (kv->n > (r.size - r.pos) / 8)
                return gguf_fail(err, errlen, "gguf: string array '%.*s' of %llu items cannot fit", (int)(kv->key.n > 200 ? 200 : kv->key.n), kv->key.p, (unsigned long long)kv->n);
            kv->strs = (gguf_str *)malloc((size_t)(kv->n ? kv->n : 1) * sizeof(gguf_str));
            if (!kv->strs) return gguf_fail(err, errlen, "gguf: out of memory");
            kv->data = r.p + r.pos;
            for (j = 0; j < kv->n; j++)
                if (rd_str(&r, &kv->strs[j]))
                    return gguf_fail(err, errlen, "gguf: truncated string %llu of '%.*s'", (unsigned long long)j, (int)(kv->key.n > 200 ? 200 : kv->key.n), kv->key.p);
        } else {
            int es = vtype_size(kv->arr_type);
            if (!es) return gguf_fail(err, errlen, "gguf: unknown value type %u for '%.*s'", kv->arr_type, (int)(kv->key.n > 200 ? 200 : kv->key.n), kv->key.p);
            if (kv->n > (r.size - r.pos) / (uint64_t)es)
                return gguf_fail(err, errlen, "gguf: value of '%.*s' runs past the end of the file", (int)(kv->key.n > 200 ? 200 : kv->key.n), kv->key.p);
            kv->data = rd_take(&r, kv->n * (uint64_t)es);
            if (!kv->data && kv->n) return gguf_fail(err, errlen, "gguf: truncated value of '%.*s'", (int)(kv->key.n > 200 ? 200 : kv->key.n), kv->key.p);
        }
        if (gguf_str_eq(kv->key, "general.alignment")) {
            if (kv->type != GGUF_VT_U32) return gguf_fail(err, errlen, "gguf: general.alignment must be u32");
            f->alignment = le32(kv->data);
            if (f->alignment == 0 || (f->alignment & (f->alignment - 1)) || f->alignment > (1u << 20))
                return gguf_fail(err, errlen, "gguf: bad alignment %u", f->alignment);
        }
    }

    for (i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint32_t d;
        int be, bb;
        int64_t n = 1;
        if (rd_str(&r, &t->name)) return gguf_fail(err, errlen, "gguf: truncated name of tensor %llu", (unsigned long long)i);
        t->n_dims = rd_u32(&r);
        if (r.bad) return gguf_fail(err, errlen, "gguf: truncated tensor info %llu", (unsigned long long)i);
        if (t->n_dims < 1 || t->n_dims > 4)
            return gguf_fail(err, errlen, "gguf: tensor '%.*s' has %u dims (1..4 allowed)", (int)(t->name.n > 200 ? 200 : t->name.n), t->name.p, t->n_dims);
        for (d = 0; d < 4; d++) t->ne[d] = 1;
        for (d = 0; d < t->n_dims; d++) {
            uint64_t v = rd_u64(&r);
            if (v < 1 || v > (uint64_t)GGUF_MAX_ELEMS || (uint64_t)n > (uint64_t)GGUF_MAX_ELEMS / v)
                return gguf_fail(err, errlen, "gguf: tensor '%.*s' has a bad dimension %llu", (int)(t->name.n > 200 ? 200 : t->name.n), t->name.p, (unsigned long long)v);
            t->ne[d] = (int64_t)v;
            n *= (int64_t)v;
        }
        t->type = rd_u32(&r);
        t->offset = rd_u64(&r);
        if (r.bad) return gguf_fail(err, errlen, "gguf: truncated tensor info of '%.*s'", (int)(t->name.n > 200 ? 200 : t->name.n), t->name.p);
        if (!gguf_type_info(t->type, &be, &bb))
            return gguf_fail(err, errlen, "gguf: tensor '%.*s' has unknown type %u", (int)(t->name.n > 200 ? 200 : t->name.n), t->name.p, t->type);
        if (t->ne[0] % be)
            return gguf_fail(err, errlen, "gguf: tensor '%.*s': row of %lld is not a multiple of the %s block (%d)", (int)(t->name.n > 200 ? 200 : t->name.n), t->name.p, (long long)t->ne[0], gguf_type_name(t->type), be);
        if (t->offset % f->alignment)
            return gguf_fail(err, errlen, "gguf: tensor '%.*s' offset %llu is not aligned to %u", (int)(t->name.n > 200 ? 200 : t->name.n), t->name.p, (unsigned long long)t->offset, f->alignment);
        t->n_elems = n;
        t->nbytes = (uint64_t)(n / be) * (uint64_t)bb;
    }
    {
        uint64_t a = f->alignment;
        uint64_t off = ((uint64_t)r.pos + a - 1) / a * a;
        if (off > f->size) return gguf_fail(err, errlen, "gguf: file ends before its data section");
        f->data_offset = off;
    }
    for (i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t avail = f->size - f->data_offset;
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return gguf_fail(err, errlen, "gguf: data of tensor '%.*s' (%llu bytes at %llu) runs past the end of the file (truncated?)",
                        (int)(t->name.n > 200 ? 200 : t->name.n), t->name.p, (unsigned long long)t->nbytes, (unsigned long long)t->offset);
        t->data = f->base + f->data_offset + t->offset;
    }
    /* duplicate tensor names make lookups ambiguous */
    if (f->n_tensors > 1) {
        const gguf_tensor **ix = (const gguf_tensor **)malloc((size_t)f->n_tensors * sizeof(*ix));
        int dup = 0;
        if (!ix) return gguf_fail(err, errlen, "gguf: out of memory");
        for (i = 0; i < f->n_tensors; i++) ix[i] = &f->tensors[i];
        qsort(ix, (size_t)f->n_tensors, sizeof(*ix), cmp_tensor_name);
        for (i = 1; i < f->n_tensors && !dup; i++)
            if (cmp_tensor_name(&ix[i - 1], &ix[i]) == 0) dup = 1;
        free(ix);
        if (dup) return gguf_fail(err, errlen, "gguf: duplicate tensor names");
    }
    return 0;
}

int gguf_parse(const void *buf, size_t size, gguf_file *f, char *err, size_t errlen) {
    memset(f, 0, sizeof(*f));
    if (!buf) return gguf_fail(err, errlen, "gguf: NULL buffer");
    f->base = (const uint8_t *)buf;
    f->size = size;
    if (parse(f, err, errlen)) {
        free_parsed(f);
        return -1;
    }
    return 0;
}

int gguf_open(const char *path, gguf_file *f, char *err, size_t errlen) {
    int fd;
    struct stat st;
    void *m;
    memset(f, 0, sizeof(*f));
    fd = open(path, O_RDONLY);
    if (fd < 0) return gguf_fail(err, errlen, "gguf: cannot open '%s'", path);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return gguf_fail(err, errlen, "gguf: '%s' is not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return gguf_fail(err, errlen, "gguf: '%s' is too small (%lld bytes) to be a GGUF file", path, (long long)st.st_size);
    }
    m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return gguf_fail(err, errlen, "gguf: cannot map '%s'", path);
    if (gguf_parse(m, (size_t)st.st_size, f, err, errlen)) {
        munmap(m, (size_t)st.st_size);
        return -1;
    }
    f->mapped = 1;
    return 0;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    free_parsed(f);
    if (f->mapped && f->base) munmap((void *)f->base, f->size);
    memset(f, 0, sizeof(*f));
}

/* ------------------------------------------------------------ lookups */
const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    uint64_t i;
    for (i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

int gguf_get_int(const gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type == GGUF_VT_ARRAY) return -1;
    switch (kv->type) {
    case GGUF_VT_U8: case GGUF_VT_BOOL: *out = kv->data[0]; return 0;
    case GGUF_VT_I8: *out = (int8_t)kv->data[0]; return 0;
    case GGUF_VT_U16: *out = le16(kv->data); return 0;
    case GGUF_VT_I16: *out = (int16_t)le16(kv->data); return 0;
    case GGUF_VT_U32: *out = le32(kv->data); return 0;
    case GGUF_VT_I32: *out = (int32_t)le32(kv->data); return 0;
    case GGUF_VT_U64: { uint64_t v = le64(kv->data); if (v > INT64_MAX) return -1; *out = (int64_t)v; return 0; }
    case GGUF_VT_I64: *out = (int64_t)le64(kv->data); return 0;
    default: return -1;
    }
}

int gguf_get_float(const gguf_file *f, const char *key, double *out) {
    const gguf_kv *kv = gguf_find(f, key);
    int64_t iv;
    if (!kv || kv->type == GGUF_VT_ARRAY) return -1;
    if (kv->type == GGUF_VT_F32) {
        uint32_t u = le32(kv->data);
        float x;
        memcpy(&x, &u, 4);
        *out = x;
        return 0;
    }
    if (kv->type == GGUF_VT_F64) {
        uint64_t u = le64(kv->data);
        double x;
        memcpy(&x, &u, 8);
        *out = x;
        return 0;
    }
    if (gguf_get_int(f, key, &iv) == 0) { *out = (double)iv; return 0; }
    return -1;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_VT_STRING) return -1;
    *out = kv->strs[0];
    return 0;
}

const gguf_kv *gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, uint64_t *n) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->arr_type != elem_type) return NULL;
    if (n) *n = kv->n;
    return kv;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    uint64_t i;
    for (i = 0; i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

/* ------------------------------------------------------------ dequantization */
float gguf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    float x;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        x = (float)man * (1.0f / 16777216.0f);
        return sign ? -x : x;
    }
    if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&x, &u, 4);
    return x;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Q4_K/Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min packed
   into 12 bytes: sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scale) and
   4..7 (min); sub-blocks 4..7 in the nibbles of bytes 8..11 plus the top two
   bits of bytes 0..3 (scale) and 4..7 (min). */
static void k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

int gguf_can_dequantize(uint32_t type) {
    switch (type) {
    case GGUF_T_F32: case GGUF_T_F16: case GGUF_T_BF16: case GGUF_T_Q4_0: case GGUF_T_Q4_1:
    case GGUF_T_Q5_0: case GGUF_T_Q5_1: case GGUF_T_Q8_0: case GGUF_T_Q4_K: case GGUF_T_Q5_K:
    case GGUF_T_Q6_K: return 1;
    default: return 0;
    }
}

int gguf_dequantize(uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *b = (const uint8_t *)src;
    int be, bb;
    int64_t i, nb;
    if (!gguf_can_dequantize(type) || !gguf_type_info(type, &be, &bb) || n < 0 || n % be) return -1;
    nb = n / be;
    for (i = 0; i < nb; i++, b += bb, dst += be) {
        int j, l;
        switch (type) {
        case GGUF_T_F32:
            memcpy(dst, b, 4);
            break;
        case GGUF_T_F16:
            dst[0] = gguf_f16_to_f32(le16(b));
            break;
        case GGUF_T_BF16:
            dst[0] = bf16_to_f32(le16(b));
            break;
        case GGUF_T_Q4_0: { /* d(f16), 16 bytes of nibbles: low = elems 0..15, high = 16..31 */
            float d = gguf_f16_to_f32(le16(b));
            for (j = 0; j < 16; j++) {
                dst[j] = (float)((b[2 + j] & 0x0f) - 8) * d;
                dst[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
            }
            break;
        }
        case GGUF_T_Q4_1: { /* d, m, nibbles: x = q*d + m */
            float d = gguf_f16_to_f32(le16(b)), m = gguf_f16_to_f32(le16(b + 2));
            for (j = 0; j < 16; j++) {
                dst[j] = (float)(b[4 + j] & 0x0f) * d + m;
                dst[j + 16] = (float)(b[4 + j] >> 4) * d + m;
            }
            break;
        }
        case GGUF_T_Q5_0: /* d, 32 high bits (u32 LE), nibbles; x = (q | hi<<4) - 16 */
        case GGUF_T_Q5_1: { /* d, m, high bits, nibbles; x = q*d + m */
            int has_m = type == GGUF_T_Q5_1;
            float d = gguf_f16_to_f32(le16(b)), m = has_m ? gguf_f16_to_f32(le16(b + 2)) : 0.0f;
            uint32_t qh = le32(b + (has_m ? 4 : 2));
            const uint8_t *qs = b + (has_m ? 8 : 6);
            int off = has_m ? 0 : 16;
            for (j = 0; j < 16; j++) {
                int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
                int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
                dst[j] = (float)(lo - off) * d + m;
                dst[j + 16] = (float)(hi - off) * d + m;
            }
            break;
        }
        case GGUF_T_Q8_0: {
            float d = gguf_f16_to_f32(le16(b));
            for (j = 0; j < 32; j++) dst[j] = (float)(int8_t)b[2 + j] * d;
            break;
        }
        case GGUF_T_Q4_K: { /* d, dmin, scales[12], qs[128]; 4 groups of 64 = 2 sub-blocks (low, high nibbles) */
            float d = gguf_f16_to_f32(le16(b)), dmin = gguf_f16_to_f32(le16(b + 2));
            const uint8_t *sc = b + 4, *q = b + 16;
            for (j = 0; j < 4; j++) {
                int s0, m0, s1, m1;
                k_scale_min(2 * j, sc, &s0, &m0);
                k_scale_min(2 * j + 1, sc, &s1, &m1);
                for (l = 0; l < 32; l++) {
                    dst[64 * j + l] = d * (float)s0 * (float)(q[32 * j + l] & 0x0f) - dmin * (float)m0;
                    dst[64 * j + 32 + l] = d * (float)s1 * (float)(q[32 * j + l] >> 4) - dmin * (float)m1;
                }
            }
            break;
        }
        case GGUF_T_Q5_K: { /* d, dmin, scales[12], qh[32], qs[128] */
            float d = gguf_f16_to_f32(le16(b)), dmin = gguf_f16_to_f32(le16(b + 2));
            const uint8_t *sc = b + 4, *qh = b + 16, *q = b + 48;
            for (j = 0; j < 4; j++) {
                int s0, m0, s1, m1;
                k_scale_min(2 * j, sc, &s0, &m0);
                k_scale_min(2 * j + 1, sc, &s1, &m1);
                for (l = 0; l < 32; l++) {
                    int lo = (q[32 * j + l] & 0x0f) + (((qh[l] >> (2 * j)) & 1) << 4);
                    int hi = (q[32 * j + l] >> 4) + (((qh[l] >> (2 * j + 1)) & 1) << 4);
                    dst[64 * j + l] = d * (float)s0 * (float)lo - dmin * (float)m0;
                    dst[64 * j + 32 + l] = d * (float)s1 * (float)hi - dmin * (float)m1;
                }
            }
            break;
        }
        case GGUF_T_Q6_K: { /* ql[128], qh[64], scales[16] (i8), d; two halves of 128 */
            const uint8_t *ql = b, *qh = b + 128;
            const int8_t *sc = (const int8_t *)(b + 192);
            float d = gguf_f16_to_f32(le16(b + 208));
            int h;
            for (h = 0; h < 2; h++) {
                float *y = dst + 128 * h;
                const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
                const int8_t *s = sc + 8 * h;
                for (l = 0; l < 32; l++) {
                    int is = l / 16;
                    int q1 = ((L[l] & 0x0f) | ((H[l] & 3) << 4)) - 32;
                    int q2 = ((L[l + 32] & 0x0f) | (((H[l] >> 2) & 3) << 4)) - 32;
                    int q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32;
                    int q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;
                    y[l] = d * (float)s[is] * (float)q1;
                    y[l + 32] = d * (float)s[is + 2] * (float)q2;
                    y[l + 64] = d * (float)s[is + 4] * (float)q3;
                    y[l + 96] = d * (float)s[is + 6] * (float)q4;
                }
            }
            break;
        }
        default:
            return -1;
        }
    }
    return 0;
}
