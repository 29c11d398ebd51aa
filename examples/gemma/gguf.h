/* gguf.h - a small, defensive reader for GGUF model files (versions 2 and 3).

   The file is memory-mapped read-only; every read is bounds-checked, so a
   truncated or corrupted file gives an error message, never a crash.
   Tensor data stays in the mapping; gguf_dequantize() turns rows of any
   supported type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
   Q6_K) into float32.

   Layout facts (GGUF spec / ggml): little-endian; header "GGUF", version,
   tensor count, kv count; then key/value pairs; then tensor infos (name,
   dims, type, offset relative to the data section); the data section
   starts at the next multiple of general.alignment (default 32). A tensor's
   ne[0] is its innermost (contiguous) dimension: a weight with
   ne = [in, out] is `out` rows of `in` values. */
#ifndef GEMMA_GGUF_H
#define GEMMA_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
    GGUF_VT_U8 = 0, GGUF_VT_I8 = 1, GGUF_VT_U16 = 2, GGUF_VT_I16 = 3,
    GGUF_VT_U32 = 4, GGUF_VT_I32 = 5, GGUF_VT_F32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_U64 = 10, GGUF_VT_I64 = 11,
    GGUF_VT_F64 = 12, GGUF_VT_COUNT_ = 13
};

/* ggml tensor types this reader knows the block size of */
enum gguf_ttype {
    GGUF_T_F32 = 0, GGUF_T_F16 = 1, GGUF_T_Q4_0 = 2, GGUF_T_Q4_1 = 3,
    GGUF_T_Q5_0 = 6, GGUF_T_Q5_1 = 7, GGUF_T_Q8_0 = 8, GGUF_T_Q8_1 = 9,
    GGUF_T_Q2_K = 10, GGUF_T_Q3_K = 11, GGUF_T_Q4_K = 12, GGUF_T_Q5_K = 13,
    GGUF_T_Q6_K = 14, GGUF_T_Q8_K = 15, GGUF_T_BF16 = 30
};

typedef struct gguf_str {
    const char *p;  /* points into the mapping: NOT NUL-terminated */
    uint64_t n;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    uint32_t type;       /* enum gguf_vtype */
    uint32_t arr_type;   /* element type when type == GGUF_VT_ARRAY */
    uint64_t n;          /* element count (1 for scalars) */
    const uint8_t *data; /* scalar value / first array element, in the mapping */
    gguf_str *strs;      /* string values (type STRING, or array of STRING) */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    int64_t ne[4];       /* unused dims are 1 */
    uint32_t type;       /* enum gguf_ttype */
    uint64_t offset;     /* relative to the data section */
    const void *data;
    uint64_t nbytes;
    int64_t n_elems;
} gguf_tensor;

typedef struct gguf_file {
    const uint8_t *base; /* the mapping (or the caller's buffer) */
    size_t size;
    int mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t data_offset;
} gguf_file;

/* 0 on success; on failure -1 and a message in err. */
/* Writes a message into err (errlen bytes, may be NULL/0) and returns -1;
   the error convention of the whole engine. */
int gguf_fail(char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int gguf_open(const char *path, gguf_file *f, char *err, size_t errlen);
/* Parse a file image already in memory (the buffer must outlive f). */
int gguf_parse(const void *buf, size_t size, gguf_file *f, char *err, size_t errlen);
void gguf_close(gguf_file *f);

const gguf_kv *gguf_find(const gguf_file *f, const char *key);
int gguf_str_eq(gguf_str s, const char *c);
/* Typed getters: 0 on success, -1 if absent or of an incompatible type. */
int gguf_get_int(const gguf_file *f, const char *key, int64_t *out);  /* any integer or bool */
int gguf_get_float(const gguf_file *f, const char *key, double *out); /* f32/f64 or integer */
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* An array; *n elements of *type starting at *data (strings: kv->strs). */
const gguf_kv *gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, uint64_t *n);

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Block geometry of a tensor type: elements per block and bytes per block;
   0 if the type is unknown. */
int gguf_type_info(uint32_t type, int *block_elems, int *block_bytes);
const char *gguf_type_name(uint32_t type);
/* 1 if gguf_dequantize supports the type. */
int gguf_can_dequantize(uint32_t type);
/* Dequantize n elements (a multiple of the block size) of the given type
   from src into dst. 0 on success, -1 for an unsupported type/size. */
int gguf_dequantize(uint32_t type, const void *src, float *dst, int64_t n);

float gguf_f16_to_f32(uint16_t h);

#endif
