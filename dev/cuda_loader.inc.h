/* dev/cuda_loader.inc.h - the header side of the CUDA backend.

   Two parts:
   1. THE ABI (always, once): the function table that entropyinfer_cuda.cu
      exports through ei_cuda_get_api(EI_CUDA_ABI_VERSION). Both sides must
      see the same struct: the .cu includes this file with EI__CUDA_ABI_ONLY
      defined (or, once the lead moves this block into entropyinfer.h under
      `#ifdef EI_CUDA_ABI_DECLS`, it gets it from the header).
   2. THE LOADER (ENTROPYINFER_IMPLEMENTATION only; this is what goes into the
      header's `// >>cuda-loader` section): dlopen of the plugin and the
      private ei__cuda_* functions the public API calls when
      cfg.backend == EI_BACKEND_CUDA. No CUDA header is needed: CUDA objects
      (streams, device pointers) are plain void pointers here.

   Assumed from the header's implementation: struct ei_context { ei_config cfg;
   ...; void *cuda; }, and ei__fail(ctx, code, fmt, ...) which records the
   message for ei_last_error(), logs it and returns code. */

#ifndef EI__CUDA_ABI_INCLUDED
#define EI__CUDA_ABI_INCLUDED

/* Bump on any change of ei_cuda_api or of the meaning of its functions. */
#define EI_CUDA_ABI_VERSION 1
#define EI_CUDA_ENTRY_POINT "ei_cuda_get_api"
#define EI_CUDA_MSG_SIZE 256

/* Plan copies between host and device memory (ei_cuda_api.plan_copy). */
enum { EI_CUDA_DEVICE_TO_HOST = 0, EI_CUDA_HOST_TO_DEVICE = 1, EI_CUDA_DEVICE_TO_DEVICE = 2 };

/* Every function that can fail returns an ei_result and, on failure, writes a
   NUL-terminated message of at most EI_CUDA_MSG_SIZE bytes into msg. Tensor,
   plan, keep-set, decoder-ring and workspace pointers are device pointers;
   the struct holding them lives on the host. All work is queued on
   cfg->cuda_stream (NULL: the default stream) and is asynchronous, except
   profile (it waits for its non-finite check) and the explicit copies. */
typedef struct ei_cuda_api {
    int32_t abi_version;   /* EI_CUDA_ABI_VERSION */
    int32_t struct_size;   /* sizeof(ei_cuda_api) */
    const char *(*build_info)(void);
    /* 0 and a device description in msg if a usable device exists. */
    ei_result (*device_check)(char *msg);

    /* device memory helpers (also for tests and engines without CUDA headers) */
    ei_result (*mem_alloc)(void **ptr, size_t bytes, char *msg);
    void (*mem_free)(void *ptr);
    /* kind: 0 device->host, 1 host->device, 2 device->device; waits for the stream */
    ei_result (*mem_copy)(void *dst, const void *src, size_t bytes, int kind, void *stream, char *msg);
    ei_result (*synchronize)(void *stream, char *msg);

    /* plans: same layout as the CPU's, arrays in device memory */
    ei_result (*plan_size)(const ei_config *cfg, int64_t max_tokens, int32_t n_kv_heads,
                           int32_t head_dim, uint32_t flags, size_t *bytes, char *msg);
    ei_result (*plan_init)(const ei_config *cfg, ei_plan *plan, int64_t max_tokens,
                           int32_t n_kv_heads, int32_t head_dim, uint32_t flags,
                           void *device_memory, size_t bytes, char *msg);
    /* copy the arrays of src into dst (same n_kv_heads; dst capacity >= src
       contents); direction EI_CUDA_*; the host-side fields are copied too */
    ei_result (*plan_copy)(const ei_config *cfg, ei_plan *dst, const ei_plan *src,
                           int direction, char *msg);

    ei_result (*profile_workspace_size)(const ei_config *cfg, int64_t n_tokens, int32_t n_heads,
                                        int32_t n_kv_heads, int32_t head_dim, size_t *bytes, char *msg);
    ei_result (*profile)(const ei_config *cfg, const ei_tensor *q, const ei_tensor *k,
                         ei_plan *plan, void *workspace, size_t workspace_bytes, char *msg);

    ei_result (*attention_workspace_size)(const ei_config *cfg, int32_t n_heads, int32_t n_kv_heads,
                                          int32_t head_dim, size_t *bytes, char *msg);
    /* plan NULL: dense causal. One launch for the whole layer. */
    ei_result (*attention)(const ei_config *cfg, const ei_tensor *q, const ei_tensor *k,
                           const ei_tensor *v, const ei_plan *plan, ei_out_tensor *out,
                           int64_t q_offset, void *workspace, size_t workspace_bytes, char *msg);

    /* decoder ring in device memory: f32 [window][n_heads][head_dim], query
       number i (counting every observed query from 0) in slot i % window */
    ei_result (*decoder_size)(const ei_config *cfg, int32_t n_heads, int32_t head_dim,
                              size_t *bytes, char *msg);
    ei_result (*decoder_init)(const ei_config *cfg, ei_decoder *dec, int32_t n_heads,
                              int32_t n_kv_heads, int32_t head_dim, void *device_memory,
                              size_t bytes, char *msg);
    ei_result (*decode_observe)(const ei_config *cfg, ei_decoder *dec, const ei_tensor *q,
                                int generated, char *msg);
    ei_result (*decode_workspace_size)(const ei_config *cfg, int64_t n_tokens, int32_t n_heads,
                                       int32_t n_kv_heads, size_t *bytes, char *msg);
    ei_result (*decode_keep)(const ei_config *cfg, ei_decoder *dec, const ei_tensor *k,
                             ei_keep_set *keep, void *workspace, size_t workspace_bytes, char *msg);
    ei_result (*kv_compact)(const ei_config *cfg, const ei_keep_set *keep, ei_out_tensor *k,
                            ei_out_tensor *v, char *msg);
} ei_cuda_api;

typedef const ei_cuda_api *(*ei_cuda_get_api_fn)(int abi_version);

#endif /* EI__CUDA_ABI_INCLUDED */

#if !defined(EI__CUDA_ABI_ONLY) && !defined(EI__CUDA_LOADER_INCLUDED)
#define EI__CUDA_LOADER_INCLUDED
/* Not every entry is wired into the public API in every build. */
#if defined(__GNUC__) || defined(__clang__)
#define EI__CUDA_FN static __attribute__((unused))
#else
#define EI__CUDA_FN static
#endif
// >>cuda-loader
#ifndef EI_NO_CUDA_LOADER
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#if defined(__linux__)
#include <unistd.h> /* readlink, where the feature macros declare it */
#endif

typedef struct ei__cuda_state {
    void *library;              /* dlopen handle */
    const ei_cuda_api *api;
    char path[640];             /* what was opened */
} ei__cuda_state;

#define EI__CUDA_API(ctx) (((const ei__cuda_state *)(ctx)->cuda)->api)

/* Try one candidate; on failure append dlerror() to why (bounded). */
EI__CUDA_FN void *ei__cuda_try_open(const char *path, char *why, size_t why_size) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        size_t used = strlen(why);
        if (used + 4 < why_size)
            snprintf(why + used, why_size - used, "%s%s", used ? "; " : "", e ? e : path);
    }
    return h;
}

EI__CUDA_FN ei_result ei__cuda_open(ei_context *ctx) {
    char why[1024] = {0};
    char self_dir[512] = {0};
    char candidate[600];
    const char *explicit_path = ctx->cfg.cuda_library;
    void *lib = NULL;
    const char *opened = NULL;
    ei_cuda_get_api_fn get_api;
    const ei_cuda_api *api;
    ei__cuda_state *st;
    char msg[EI_CUDA_MSG_SIZE];
    ei_result r;

    ctx->cuda = NULL;
    if (!explicit_path || !explicit_path[0]) explicit_path = getenv("EI_CUDA_LIBRARY");
    if (explicit_path && explicit_path[0]) {
        lib = ei__cuda_try_open(explicit_path, why, sizeof why);
        opened = explicit_path;
        if (!lib)
            return ei__fail(ctx, EI_ERR_BACKEND, "CUDA backend: cannot load '%s' (%s)", explicit_path, why);
    } else {
        static const char *const names[] = {
            "libentropyinfer_cuda.so", "./libentropyinfer_cuda.so", "./build/libentropyinfer_cuda.so"};
        size_t i;
        for (i = 0; i < sizeof names / sizeof names[0] && !lib; i++) {
            lib = ei__cuda_try_open(names[i], why, sizeof why);
            opened = names[i];
        }
        if (!lib) { /* next to the executable, and in its build/ folder */
            long n = -1;
#if defined(__linux__) && defined(__USE_XOPEN2K)
            n = (long)readlink("/proc/self/exe", self_dir, sizeof self_dir - 1);
#endif
            if (n > 0) {
                char *slash;
                self_dir[n] = 0;
                slash = strrchr(self_dir, '/');
                if (slash) {
                    slash[1] = 0;
                    snprintf(candidate, sizeof candidate, "%slibentropyinfer_cuda.so", self_dir);
                    lib = ei__cuda_try_open(candidate, why, sizeof why);
                    if (!lib) {
                        snprintf(candidate, sizeof candidate, "%s../build/libentropyinfer_cuda.so", self_dir);
                        lib = ei__cuda_try_open(candidate, why, sizeof why);
                    }
                    opened = candidate;
                }
            }
        }
        if (!lib)
            return ei__fail(ctx, EI_ERR_BACKEND,
                            "CUDA backend: libentropyinfer_cuda.so not found (set ei_config.cuda_library or "
                            "EI_CUDA_LIBRARY; build it with 'make cuda'): %s", why);
    }
    *(void **)(&get_api) = dlsym(lib, EI_CUDA_ENTRY_POINT);
    if (!get_api) {
        dlclose(lib);
        return ei__fail(ctx, EI_ERR_BACKEND, "CUDA backend: '%s' has no entry point %s", opened,
                        EI_CUDA_ENTRY_POINT);
    }
    api = get_api(EI_CUDA_ABI_VERSION);
    if (!api || api->abi_version != EI_CUDA_ABI_VERSION || api->struct_size != (int32_t)sizeof(ei_cuda_api)) {
        int found = api ? api->abi_version : -1;
        dlclose(lib);
        return ei__fail(ctx, EI_ERR_BACKEND,
                        "CUDA backend: '%s' speaks ABI version %d, this header needs %d (rebuild it)",
                        opened, found, EI_CUDA_ABI_VERSION);
    }
    msg[0] = 0;
    r = api->device_check(msg);
    if (r != EI_OK) {
        dlclose(lib);
        return ei__fail(ctx, EI_ERR_BACKEND, "CUDA backend: no usable device (%s)", msg);
    }
    st = (ei__cuda_state *)calloc(1, sizeof *st);
    if (!st) {
        dlclose(lib);
        return ei__fail(ctx, EI_ERR_NOMEM, "CUDA backend: out of host memory");
    }
    st->library = lib;
    st->api = api;
    snprintf(st->path, sizeof st->path, "%s", opened ? opened : "");
    ctx->cuda = st;
    return EI_OK;
}

EI__CUDA_FN void ei__cuda_close(ei_context *ctx) {
    ei__cuda_state *st = (ei__cuda_state *)ctx->cuda;
    if (!st) return;
    if (st->library) dlclose(st->library);
    free(st);
    ctx->cuda = NULL;
}

/* Call one table entry with a message buffer; turn a failure into ei__fail. */
#define EI__CUDA_CALL(ctx, name, ...)                                                 \
    do {                                                                              \
        char ei__msg[EI_CUDA_MSG_SIZE];                                               \
        ei_result ei__r;                                                              \
        if (!(ctx)->cuda) return ei__fail((ctx), EI_ERR_BACKEND, "CUDA backend not loaded"); \
        ei__msg[0] = 0;                                                               \
        ei__r = EI__CUDA_API(ctx)->name(__VA_ARGS__, ei__msg);                        \
        if (ei__r != EI_OK) return ei__fail((ctx), ei__r, "CUDA " #name ": %s", ei__msg); \
        return EI_OK;                                                                 \
    } while (0)

EI__CUDA_FN ei_result ei__cuda_plan_size(const ei_context *ctx, int64_t max_tokens, int32_t n_kv_heads,
                                    int32_t head_dim, uint32_t flags, size_t *bytes) {
    EI__CUDA_CALL(ctx, plan_size, &ctx->cfg, max_tokens, n_kv_heads, head_dim, flags, bytes);
}
EI__CUDA_FN ei_result ei__cuda_plan_init(const ei_context *ctx, ei_plan *plan, int64_t max_tokens,
                                    int32_t n_kv_heads, int32_t head_dim, uint32_t flags, void *memory,
                                    size_t bytes) {
    EI__CUDA_CALL(ctx, plan_init, &ctx->cfg, plan, max_tokens, n_kv_heads, head_dim, flags, memory, bytes);
}
EI__CUDA_FN ei_result ei__cuda_plan_copy(const ei_context *ctx, ei_plan *dst, const ei_plan *src, int direction) {
    EI__CUDA_CALL(ctx, plan_copy, &ctx->cfg, dst, src, direction);
}
EI__CUDA_FN ei_result ei__cuda_profile_workspace_size(const ei_context *ctx, int64_t n_tokens, int32_t n_heads,
                                                 int32_t n_kv_heads, int32_t head_dim, size_t *bytes) {
    EI__CUDA_CALL(ctx, profile_workspace_size, &ctx->cfg, n_tokens, n_heads, n_kv_heads, head_dim, bytes);
}
EI__CUDA_FN ei_result ei__cuda_profile(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                  ei_plan *plan, void *ws, size_t ws_bytes) {
    EI__CUDA_CALL(ctx, profile, &ctx->cfg, q, k, plan, ws, ws_bytes);
}
EI__CUDA_FN ei_result ei__cuda_attention_workspace_size(const ei_context *ctx, int32_t n_heads, int32_t n_kv_heads,
                                                   int32_t head_dim, size_t *bytes) {
    EI__CUDA_CALL(ctx, attention_workspace_size, &ctx->cfg, n_heads, n_kv_heads, head_dim, bytes);
}
EI__CUDA_FN ei_result ei__cuda_attention(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                    const ei_tensor *v, const ei_plan *plan, ei_out_tensor *out,
                                    int64_t q_offset, void *ws, size_t ws_bytes) {
    EI__CUDA_CALL(ctx, attention, &ctx->cfg, q, k, v, plan, out, q_offset, ws, ws_bytes);
}
EI__CUDA_FN ei_result ei__cuda_decoder_size(const ei_context *ctx, int32_t n_heads, int32_t head_dim, size_t *bytes) {
    EI__CUDA_CALL(ctx, decoder_size, &ctx->cfg, n_heads, head_dim, bytes);
}
EI__CUDA_FN ei_result ei__cuda_decoder_init(const ei_context *ctx, ei_decoder *dec, int32_t n_heads,
                                       int32_t n_kv_heads, int32_t head_dim, void *memory, size_t bytes) {
    EI__CUDA_CALL(ctx, decoder_init, &ctx->cfg, dec, n_heads, n_kv_heads, head_dim, memory, bytes);
}
EI__CUDA_FN ei_result ei__cuda_decode_observe(const ei_context *ctx, ei_decoder *dec, const ei_tensor *q,
                                         int generated) {
    EI__CUDA_CALL(ctx, decode_observe, &ctx->cfg, dec, q, generated);
}
EI__CUDA_FN ei_result ei__cuda_decode_workspace_size(const ei_context *ctx, int64_t n_tokens, int32_t n_heads,
                                                int32_t n_kv_heads, size_t *bytes) {
    EI__CUDA_CALL(ctx, decode_workspace_size, &ctx->cfg, n_tokens, n_heads, n_kv_heads, bytes);
}
EI__CUDA_FN ei_result ei__cuda_decode_keep(const ei_context *ctx, ei_decoder *dec, const ei_tensor *k,
                                      ei_keep_set *keep, void *ws, size_t ws_bytes) {
    EI__CUDA_CALL(ctx, decode_keep, &ctx->cfg, dec, k, keep, ws, ws_bytes);
}
EI__CUDA_FN ei_result ei__cuda_kv_compact(const ei_context *ctx, const ei_keep_set *keep, ei_out_tensor *k,
                                     ei_out_tensor *v) {
    EI__CUDA_CALL(ctx, kv_compact, &ctx->cfg, keep, k, v);
}
EI__CUDA_FN ei_result ei__cuda_mem_alloc(const ei_context *ctx, void **ptr, size_t bytes) {
    EI__CUDA_CALL(ctx, mem_alloc, ptr, bytes);
}
EI__CUDA_FN void ei__cuda_mem_free(const ei_context *ctx, void *ptr) {
    if (ctx->cuda && ptr) EI__CUDA_API(ctx)->mem_free(ptr);
}
EI__CUDA_FN ei_result ei__cuda_mem_copy(const ei_context *ctx, void *dst, const void *src, size_t bytes, int kind) {
    EI__CUDA_CALL(ctx, mem_copy, dst, src, bytes, kind, ctx->cfg.cuda_stream);
}
#undef EI__CUDA_CALL

#else /* EI_NO_CUDA_LOADER: the CUDA backend is compiled out */

EI__CUDA_FN ei_result ei__cuda_open(ei_context *ctx) {
    ctx->cuda = NULL;
    return ei__fail(ctx, EI_ERR_BACKEND, "CUDA backend compiled out (EI_NO_CUDA_LOADER)");
}
EI__CUDA_FN void ei__cuda_close(ei_context *ctx) { ctx->cuda = NULL; }
#define EI__CUDA_STUB(ctx) return ei__fail((ctx), EI_ERR_UNSUPPORTED, "CUDA backend compiled out (EI_NO_CUDA_LOADER)")
EI__CUDA_FN ei_result ei__cuda_plan_size(const ei_context *ctx, int64_t a, int32_t b, int32_t hd, uint32_t c,
                                    size_t *d) {
    (void)a; (void)b; (void)hd; (void)c; (void)d; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_plan_init(const ei_context *ctx, ei_plan *p, int64_t a, int32_t b, int32_t hd,
                                    uint32_t c, void *m, size_t n) {
    (void)p; (void)a; (void)b; (void)hd; (void)c; (void)m; (void)n; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_plan_copy(const ei_context *ctx, ei_plan *d, const ei_plan *s, int dir) {
    (void)d; (void)s; (void)dir; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_profile_workspace_size(const ei_context *ctx, int64_t a, int32_t b, int32_t c,
                                                 int32_t d, size_t *e) {
    (void)a; (void)b; (void)c; (void)d; (void)e; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_profile(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *p,
                                  void *w, size_t n) {
    (void)q; (void)k; (void)p; (void)w; (void)n; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_attention_workspace_size(const ei_context *ctx, int32_t a, int32_t b, int32_t c,
                                                   size_t *d) {
    (void)a; (void)b; (void)c; (void)d; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_attention(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                    const ei_tensor *v, const ei_plan *p, ei_out_tensor *o, int64_t off,
                                    void *w, size_t n) {
    (void)q; (void)k; (void)v; (void)p; (void)o; (void)off; (void)w; (void)n; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_decoder_size(const ei_context *ctx, int32_t a, int32_t b, size_t *c) {
    (void)a; (void)b; (void)c; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_decoder_init(const ei_context *ctx, ei_decoder *d, int32_t a, int32_t b, int32_t c,
                                       void *m, size_t n) {
    (void)d; (void)a; (void)b; (void)c; (void)m; (void)n; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_decode_observe(const ei_context *ctx, ei_decoder *d, const ei_tensor *q, int g) {
    (void)d; (void)q; (void)g; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_decode_workspace_size(const ei_context *ctx, int64_t a, int32_t b, int32_t c,
                                                size_t *d) {
    (void)a; (void)b; (void)c; (void)d; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_decode_keep(const ei_context *ctx, ei_decoder *d, const ei_tensor *k, ei_keep_set *s,
                                      void *w, size_t n) {
    (void)d; (void)k; (void)s; (void)w; (void)n; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_kv_compact(const ei_context *ctx, const ei_keep_set *s, ei_out_tensor *k,
                                     ei_out_tensor *v) {
    (void)s; (void)k; (void)v; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN ei_result ei__cuda_mem_alloc(const ei_context *ctx, void **p, size_t n) {
    (void)p; (void)n; EI__CUDA_STUB(ctx);
}
EI__CUDA_FN void ei__cuda_mem_free(const ei_context *ctx, void *p) { (void)ctx; (void)p; }
EI__CUDA_FN ei_result ei__cuda_mem_copy(const ei_context *ctx, void *d, const void *s, size_t n, int kind) {
    (void)d; (void)s; (void)n; (void)kind; EI__CUDA_STUB(ctx);
}
#undef EI__CUDA_STUB
#endif /* EI_NO_CUDA_LOADER */
#endif /* loader part */
