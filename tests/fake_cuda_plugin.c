/* fake_cuda_plugin.c - a stand-in for libentropyinfer_cuda.so that runs on
   any machine, for tests/test_plugin.c: its "device memory" is host memory
   and its entries only count their calls. Built three ways:
     (default)              a working table
     -DFAKE_ABI_VERSION=1   a table of another ABI version
     -DFAKE_NO_DEVICE       device_check fails (no GPU)
   It shows that the header validates every call before the plugin sees it,
   loads plugins, reports version mismatches and falls back to the CPU. */
#define EI_CUDA_ABI_DECLS
#include "entropyinfer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FAKE_ABI_VERSION
#define FAKE_ABI_VERSION EI_CUDA_ABI_VERSION
#endif
#define EXPORT __attribute__((visibility("default")))

/* calls per entry, read by the test through dlsym */
EXPORT int fake_calls[32];
enum { C_ALLOC, C_FREE, C_COPY, C_SET, C_SYNC, C_PLAN_COPY, C_PWS, C_PROFILE, C_AWS, C_ATTN, C_OBSERVE, C_DWS, C_KEEP,
       C_COMPACT, C_SCORE, C_SELECT, C_SHARED_ADD, C_SELECT_SHARED, C_PROFILE_CHUNK, C_PLAN_MASK };

static const char *info(void) { return "fake entropyinfer CUDA plugin (host memory)"; }
static ei_result device_check(char *msg) {
#ifdef FAKE_NO_DEVICE
    snprintf(msg, EI_CUDA_MSG_SIZE, "fake: no device");
    return EI_ERR_BACKEND;
#else
    snprintf(msg, EI_CUDA_MSG_SIZE, "fake device");
    return EI_OK;
#endif
}
static ei_result mem_alloc(void **p, size_t n, char *msg) {
    fake_calls[C_ALLOC]++;
    *p = malloc(n ? n : 1);
    if (!*p) { snprintf(msg, EI_CUDA_MSG_SIZE, "fake: out of memory"); return EI_ERR_NOMEM; }
    return EI_OK;
}
static void mem_free(void *p) { fake_calls[C_FREE]++; free(p); }
static ei_result mem_copy(void *d, const void *s, size_t n, int kind, void *st, char *msg) {
    (void)kind; (void)st; (void)msg; fake_calls[C_COPY]++; memmove(d, s, n); return EI_OK;
}
static ei_result mem_set(void *d, int b, size_t n, void *st, char *msg) {
    (void)st; (void)msg; fake_calls[C_SET]++; memset(d, b, n); return EI_OK;
}
static ei_result sync_(void *st, char *msg) { (void)st; (void)msg; fake_calls[C_SYNC]++; return EI_OK; }
static ei_result plan_copy(const ei_config *c, ei_plan *d, const ei_plan *s, int dir, char *msg) {
    (void)c; (void)d; (void)s; (void)dir; (void)msg; fake_calls[C_PLAN_COPY]++; return EI_OK;
}
static ei_result pws(const ei_config *c, int64_t n, int32_t h, int32_t kv, int32_t d, size_t *b, char *msg) {
    (void)c; (void)n; (void)h; (void)kv; (void)d; (void)msg; fake_calls[C_PWS]++; *b = 64; return EI_OK;
}
static ei_result profile(const ei_config *c, const ei_tensor *q, const ei_tensor *k, ei_plan *p, void *w, size_t wb,
                         char *msg) {
    (void)c; (void)q; (void)k; (void)p; (void)w; (void)wb; (void)msg; fake_calls[C_PROFILE]++; return EI_OK;
}
static ei_result aws(const ei_config *c, int32_t h, int32_t kv, int32_t d, size_t *b, char *msg) {
    (void)c; (void)h; (void)kv; (void)d; (void)msg; fake_calls[C_AWS]++; *b = 0; return EI_OK;
}
static ei_result attn(const ei_config *c, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v, const ei_plan *p,
                      ei_out_tensor *o, int64_t off, void *w, size_t wb, char *msg) {
    (void)c; (void)q; (void)k; (void)v; (void)p; (void)o; (void)off; (void)w; (void)wb; (void)msg;
    fake_calls[C_ATTN]++;
    return EI_OK;
}
static ei_result observe(const ei_config *c, ei_decoder *d, const ei_tensor *q, int g, char *msg) {
    (void)c; (void)msg; fake_calls[C_OBSERVE]++;
    d->n_observed += q->n_tokens;
    if (g) d->n_generated += q->n_tokens;
    return EI_OK;
}
static ei_result dws(const ei_config *c, int64_t n, int32_t h, int32_t kv, size_t *b, char *msg) {
    (void)c; (void)n; (void)h; (void)kv; (void)msg; fake_calls[C_DWS]++; *b = 64; return EI_OK;
}
static ei_result keep(const ei_config *c, ei_decoder *d, const ei_tensor *k, ei_keep_set *ks, void *w, size_t wb,
                      char *msg) {
    (void)c; (void)d; (void)k; (void)ks; (void)w; (void)wb; (void)msg; fake_calls[C_KEEP]++; return EI_OK;
}
static ei_result compact(const ei_config *c, const ei_keep_set *ks, ei_out_tensor *k, ei_out_tensor *v, char *msg) {
    (void)c; (void)ks; (void)k; (void)v; (void)msg; fake_calls[C_COMPACT]++; return EI_OK;
}
static ei_result score(const ei_config *c, const ei_decoder *d, const ei_tensor *k, const int32_t *rp, int64_t rs,
                       float *s, int32_t h0, int32_t h1, void *w, size_t wb, char *msg) {
    (void)c; (void)d; (void)k; (void)rp; (void)rs; (void)s; (void)h0; (void)h1; (void)w; (void)wb; (void)msg;
    fake_calls[C_SCORE]++;
    return EI_OK;
}
static ei_result select_(const ei_config *c, ei_decoder *d, const float *s, int64_t n, ei_keep_set *ks, void *w,
                         size_t wb, char *msg) {
    (void)c; (void)d; (void)s; (void)n; (void)ks; (void)w; (void)wb; (void)msg; fake_calls[C_SELECT]++; return EI_OK;
}
static ei_result shared_add(const ei_config *c, ei_decoder *d, const float *s, int64_t n, const int32_t *rp, float *sh,
                            void *w, size_t wb, char *msg) {
    (void)c; (void)d; (void)s; (void)n; (void)rp; (void)sh; (void)w; (void)wb; (void)msg;
    fake_calls[C_SHARED_ADD]++;
    return EI_OK;
}
static ei_result select_shared(const ei_config *c, const ei_decoder *d, const float *sh, int64_t n, ei_keep_set *ks,
                               void *w, size_t wb, char *msg) {
    (void)c; (void)d; (void)sh; (void)n; (void)ks; (void)w; (void)wb; (void)msg;
    fake_calls[C_SELECT_SHARED]++;
    return EI_OK;
}

static ei_result deferred_status(void *st, char *msg) { (void)st; (void)msg; return EI_OK; }
static ei_result profile_chunk(const ei_config *c, const ei_tensor *q, const ei_tensor *k, ei_plan *p, int64_t q_pos,
                               int is_final, void *w, size_t wb, char *msg) {
    (void)c; (void)q; (void)k; (void)p; (void)q_pos; (void)is_final; (void)w; (void)wb; (void)msg;
    fake_calls[C_PROFILE_CHUNK]++;
    return EI_OK;
}
static ei_result plan_mask(const ei_config *c, const ei_plan *p, int64_t q_offset, const ei_mask *base, ei_mask *out,
                           char *msg) {
    (void)c; (void)p; (void)q_offset; (void)base; (void)out; (void)msg;
    fake_calls[C_PLAN_MASK]++;
    return EI_OK;
}

static const ei_cuda_api table = {FAKE_ABI_VERSION, (int32_t)sizeof(ei_cuda_api), info, device_check, mem_alloc,
                                  mem_free, mem_copy, mem_set, sync_, plan_copy, pws, profile, aws, attn, observe, dws,
                                  keep, compact, score, select_, shared_add, select_shared, deferred_status,
                                  profile_chunk, plan_mask};
EXPORT const ei_cuda_api *ei_cuda_get_api(int abi_version) {
    (void)abi_version; /* the table whatever is asked: the header compares */
    return &table;
}
