/* fuzz_api.c - libFuzzer target over every public entry point of entropyinfer.

   The input bytes are a small program: two configurations (every knob drawn
   from its defaults, its limits and values past them), a layer (shapes,
   dtypes, strides: contiguous, padded, head-major, zero, negative, aliasing,
   huge; values with NaN, Inf, denormals and huge magnitudes injected), then
   a sequence of operations in any order (the op byte modulo OP_COUNT, see
   run_op): plan init (caller memory, or NULL: the context allocates),
   reset, finalize, grow, the plan as a mask (ei_plan_mask), profiling
   whole, in parts and on threads, chunked (chunks of any size and offset),
   plan corruption (arbitrary block indices and counts), prefill attention
   with arbitrary plans, decode attention (a keep set or none) and its merge,
   decoder init/observe/due/keep (also before anything was observed), keep
   sets over row maps and compaction with arbitrary indices, ei_layer_sizes
   with extreme shapes, the GPU-memory helpers on a CPU context, swapping the
   context a plan was made with, and (issue 31) every call that takes an
   ei_exec run as a whole call on threads, or in parts ith/nth with ONE
   workspace every part passes (sized by ei_layer_sizes for nth, sometimes
   too small: refused), or with hostile fields: n_threads negative, past
   the limit or with nth, ith >= nth or negative, nth huge, a NULL workspace
   with bytes, a NULL ei_exec; a bad ei_exec is refused with its code
   (exec_refusal) before anything else; parts are compared with the whole
   call where they must equal it (a plan, bit for bit; select / shared_add
   / select_shared: part 0 works, the others leave everything as it was;
   the decode merge after a call on threads writes nothing). Every public
   function is called (42 in 0.2). And (issue 15):
     placement   one call's buffers (views, plan memory and struct, decoder
                 ring and struct, keep-set arrays and struct, row maps,
                 scores, workspaces) placed in one arena at fuzzer-chosen
                 byte offsets (odd ones included), and optionally one placed
                 over another at a fuzzer-chosen offset (also interleaved
                 views of one layout). Oracles: a written region that meets
                 another is refused (EI_ERR_OVERLAP, or any error), unless the
                 two are views of one dtype and strides with disjoint
                 elements; misaligned views (element size) and int32/float
                 arrays (4 bytes) are refused; otherwise the call gives the
                 same result, bit for bit, as with every buffer apart and
                 64-byte aligned (plan, decoder and workspace memory may have
                 any alignment). Gaps between the buffers are poisoned, so
                 ASan reports any access outside them;
     plan edit   a plan's layout field, count or array pointer (or a
                 decoder's) set to an arbitrary value, then the plan used:
                 an edited layout field or counts that do not fit the layout
                 are refused;
     small stack any other op run on a thread with a 64 KiB stack (mmap, with
                 a guard page below it: an overflow is a clean crash);
     cell_pos    ei_check_key_positions over orderly, broken and misaligned
                 maps.

   Every buffer handed to the library has exactly the size its shape says, so
   AddressSanitizer reports any access outside it. Oracles besides the
   sanitizers: every failure's message names its code; successful calls leave
   valid plans and keep sets; compaction moves exactly the kept rows; dense
   and sparse attention match the double-precision reference of the method's
   semantics (the reference of check.h, ref_attention_token, on sampled
   tokens) when the inputs are tame; nothing reads padding (padding is NaN,
   so reading it would report a non-finite input); a successful attention
   over finite, bounded V writes finite outputs (NaN/Inf in the Q and K rows
   a call reads is refused, EI_ERR_NONFINITE).

   Speed (issue 15: >= 4,000 executions/s on one core under -fsanitize=
   fuzzer,address,undefined -O1): contexts are created once per distinct
   configuration and kept in a cache keyed by the configuration's bytes;
   layers are capped at tokens^2 x heads x dim <= FZ_LAYER_WORK and one
   attention call at FZ_ATTN_WORK (a long layer's last queries); an input
   runs at most FZ_MAX_OPS ops and stops when its work budget (FZ_INPUT_WORK,
   roughly multiply-adds) is spent; the small configuration (segment 8,
   block 2, threshold 16) has sparse segments at 25 tokens; calls with
   worker threads are rare (a thread start under ASan costs as much as a
   whole input: fz_threads) and the small-stack thread is started once; large
   buffers come from a pool with the bytes around them poisoned (ASan maps
   and unmaps large allocations); the harness itself is compiled without
   coverage instrumentation (only the library gives libFuzzer features).
   EI_FUZZ_TIMING=1 prints the time of each op and the placement outcomes
   per call kind at exit. EI_FUZZ_PLACE_BIAS=k (1..8) turns k/8 of the op
   bytes into the placement op (a campaign that counts placement calls).

   Ops (the op byte modulo OP_COUNT): 0 plan init, 1-2 profile (a whole
   call), 3 profile in parts, 4 profile on threads, 5 and 24 chunk (threads
   or parts), 6 reset/finalize/grow/mask, 7 corrupt, 8 attention (prefill
   in parts, or a decode step in parts), 10 attention on threads, 11 decoder
   init, 12-13 observe, 9 and 14 decode (row maps: score in parts, or keep),
   15 compact, 16 decoder reset, 17 sizes (ei_layer_sizes), 18 new layer,
   19 swap contexts, 20 placement, 21 plan/decoder edit, 22 small stack,
   23 cell_pos, 25 int64 edges (issue 36: positions, counts, strides,
   capacities and a plan's / decoder's counters at the int64 and int32 edges
   and the documented limits). tests/fuzz_seeds.py writes inputs in this
   format; the 0.2 API (issue 31) kept it, but for the decode step's
   placement, whose partials now live in the workspace (no byte for their
   address), and the bytes ops 5, 6, 14 and 17 now read in branches that
   older inputs seldom take.

   Op families can be switched off (compile -DEI_FUZZ_FAMILIES=mask or
   environment EI_FUZZ_FAMILIES=mask; FAM_* below), e.g. while the library
   lacks the checks one family needs.

   Build (libFuzzer):  clang -fsanitize=fuzzer,address,undefined tests/fuzz_api.c
   Build (replay):     cc -DEI_FUZZ_STANDALONE tests/fuzz_api.c   then
                       ./fuzz_replay FILE_OR_DIR...   (runs each input once)
   EI_FUZZ_VERBOSE=1 traces every op and call. */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "check.h"
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FZ_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(FZ_ASAN)
#define FZ_ASAN 1
#endif
#ifdef FZ_ASAN
#include <sanitizer/asan_interface.h>
#define FZ_POISON(p, n) __asan_poison_memory_region((p), (n))
#define FZ_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define FZ_POISON(p, n) ((void)(p), (void)(n))
#define FZ_UNPOISON(p, n) ((void)(p), (void)(n))
#endif
/* The harness's own loops (fills, references, checks) without coverage
   instrumentation: faster, and the fuzzer's feedback is the library's. */
#if defined(__clang__) && __clang_major__ >= 13
#define FZ_NOCOV __attribute__((noinline, no_sanitize("coverage")))
#elif defined(__GNUC__)
#define FZ_NOCOV __attribute__((noinline))
#else
#define FZ_NOCOV
#endif
/* ... and the pure arithmetic on the harness's own data (the rng, element
   conversions, fills, the double reference) without ASan/UBSan checks as
   well: their memcpy/memset calls are still checked by ASan's interceptors. */
#if defined(__clang__) && __clang_major__ >= 13
#define FZ_FAST __attribute__((noinline, no_sanitize("coverage", "address", "undefined")))
#define FZ_FAST_INLINE __attribute__((no_sanitize("coverage", "address", "undefined")))
#elif defined(__GNUC__) && __GNUC__ >= 8
#define FZ_FAST __attribute__((noinline, no_sanitize("address", "undefined")))
#define FZ_FAST_INLINE __attribute__((no_sanitize("address", "undefined")))
#else
#define FZ_FAST
#define FZ_FAST_INLINE
#endif

/* The whole harness below is left out of coverage (the library above is
   instrumented): libFuzzer's feedback is the library's, the harness's own
   loops add no features (features cost time on every run) and run faster. */
#if defined(__clang__) && __clang_major__ >= 13 && !defined(EI_FUZZ_COVER_HARNESS)
#pragma clang attribute push(__attribute__((no_sanitize("coverage"))), apply_to = function)
#define FZ_PRAGMA_PUSHED 1
#endif

/* ------------------------------------------------------------ op families */
enum {
    FAM_OVERLAP = 1,   /* placement: one buffer over another */
    FAM_ALIGN = 2,     /* placement: views and int32/float arrays at misaligned addresses */
    FAM_PLANEDIT = 4,  /* plan / decoder fields edited after init */
    FAM_STACK = 8,     /* ops on a 64 KiB thread stack */
    FAM_NONFINITE = 16 /* attention: NaN/Inf in Q/K rows read is refused, finite V gives finite outputs */
};
#ifndef EI_FUZZ_FAMILIES
#define EI_FUZZ_FAMILIES (FAM_OVERLAP | FAM_ALIGN | FAM_PLANEDIT | FAM_STACK | FAM_NONFINITE)
#endif
static unsigned families(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("EI_FUZZ_FAMILIES");
        v = e && *e ? (int)(strtol(e, NULL, 0) & 0xffff) : (EI_FUZZ_FAMILIES);
    }
    return (unsigned)v;
}
#define FAMILY(x) ((families() & (x)) != 0)

/* ------------------------------------------------------------ work budget */
#ifndef FZ_LAYER_WORK
#define FZ_LAYER_WORK 12288.0   /* tokens^2 x heads x dim of a layer */
#endif
/* one attention call: queries x keys x heads x dim, the keys rounded up to
   the kernels' 64-key tiles and dim to 16 lanes (attn_cost) */
#ifndef FZ_ATTN_WORK
#define FZ_ATTN_WORK 32768.0
#endif
#ifndef FZ_MAX_OPS
#define FZ_MAX_OPS 12           /* ops per input */
#endif
#ifndef FZ_INPUT_WORK
#define FZ_INPUT_WORK 600000.0  /* per input, roughly multiply-adds */
#endif
static double work_left;
static void work_spend(double w) { work_left -= w; }
static double attn_cost(int64_t cnt, int64_t keys, int32_t H, int32_t d) {
    return (double)cnt * (double)((keys + 63) / 64 * 64) * (double)(H > 0 ? H : 1) * (double)((d + 15) / 16 * 16);
}
/* ei_exec.n_threads of a call on threads. Starting a thread costs 0.2-0.4
   ms under ASan (its 8 MB stack's shadow is cleared), the cost of a hundred
   plain calls: a call with worker threads is rare (byte % 32 == 31) and
   comes once per input; otherwise one thread (the caller runs the call), 0
   (the caller alone too) or -1 now and then, and (byte % 32 == 30) a count
   past the limit (EI__MAX_THREADS + 1, INT32_MAX, INT32_MIN, -2: refused
   before any thread starts). */
static int threads_left;
static int fz_threads(unsigned b, int maxn) {
    static const int past[] = {EI__MAX_THREADS + 1, INT32_MAX, INT32_MIN, -2};
    if (b % 32u == 31u && threads_left > 0) {
        threads_left--;
        return 2 + (int)((b >> 5) % (unsigned)(maxn > 2 ? maxn - 1 : 1));
    }
    if (b % 32u == 0u) return -(int)((b >> 5) & 1u);
    if (b % 32u == 30u) return past[(b >> 5) & 3u];
    return 1;
}
/* The same, always a count the library runs (placement). */
static int fz_threads1(unsigned b, int maxn) { int n = fz_threads(b, maxn); return n > 0 && n <= EI__MAX_THREADS ? n : 1; }

/* ------------------------------------------------------------ input bytes */
typedef struct fz {
    const uint8_t *p;
    size_t n, i;
    uint8_t *rec;        /* when set: every byte read is recorded here (the context cache's key) */
    unsigned nrec, caprec;
} fz;
static unsigned fz_u8(fz *f) {
    unsigned v = f->i < f->n ? f->p[f->i++] : 0u;
    if (f->rec) {
        if (f->nrec < f->caprec) f->rec[f->nrec] = (uint8_t)v;
        f->nrec++;
    }
    return v;
}
static unsigned fz_u16(fz *f) { unsigned a = fz_u8(f); return a | (fz_u8(f) << 8); }
static uint32_t fz_u32(fz *f) { uint32_t a = fz_u16(f); return a | ((uint32_t)fz_u16(f) << 16); }
static int fz_left(const fz *f) { return f->i < f->n; }
#define FZ_PICK(f, arr) ((arr)[fz_u8(f) % (sizeof(arr) / sizeof((arr)[0]))])

static void fz_fail(const char *what, long a, long b) {
    fprintf(stderr, "fuzz_api oracle failed: %s (%ld, %ld); last error: %s\n", what, a, b, ei_last_error());
    abort();
}
#define ORACLE(cond, what, a, b) do { if (!(cond)) fz_fail(what, (long)(a), (long)(b)); } while (0)

static int verbose = -1;
/* Every result is in the table, and every failure's message names its code. */
#define checked(expr) checked_((expr), #expr)
static ei_result checked_(ei_result r, const char *what) {
    if (verbose > 0) fprintf(stderr, "    %.60s -> %s %s\n", what, ei_result_name(r), r ? ei_last_error() : "");
    ORACLE(r <= 0 && r >= EI_RESULT_MIN_, "result outside EI_RESULT_TABLE", r, 0);
    if (r != EI_OK) ORACLE(strstr(ei_last_error(), ei_result_name(r)) != NULL, "message does not name its code", r, 0);
    return r;
}

/* The code a bad ei_exec is refused with before anything else is looked at
   (EI_OK: x is valid): ith/nth or n_threads out of range EI_ERR_SIZE,
   threads and parts at once EI_ERR_CONFIG, a NULL workspace with bytes
   EI_ERR_NULL. */
static ei_result exec_refusal(const ei_exec *x) {
    if (!x) return EI_OK;
    if (x->nth >= 2) {
        if (x->nth > EI__MAX_THREADS || x->ith < 0 || x->ith >= x->nth) return EI_ERR_SIZE;
        if (x->n_threads > 1) return EI_ERR_CONFIG;
    } else if (x->nth < 0 || x->ith != 0 || x->n_threads < 0 || x->n_threads > EI__MAX_THREADS)
        return EI_ERR_SIZE;
    return !x->workspace && x->workspace_bytes ? EI_ERR_NULL : EI_OK;
}
/* checked() of a call that took x (and ctx): a bad x is refused with its code. */
#define xchecked(ctx, x, expr) exec_checked_((ctx), (x), checked(expr))
static ei_result exec_checked_(const ei_context *ctx, const ei_exec *x, ei_result r) {
    ei_result want = exec_refusal(x);
    if (ctx && want != EI_OK) ORACLE(r == want, "a bad ei_exec was not refused with its code", r, want);
    return r;
}
/* Threads a call's workspace is sized for: n when the library accepts it, else 1. */
static int ws_threads(int n) { return n >= 1 && n <= EI__MAX_THREADS ? n : 1; }
/* ei_layer_sizes of a layer (n_heads H, n_kv_heads KV) for n_threads threads or parts. */
static ei_result fz_sizes(const ei_context *ctx, int64_t max_tokens, int32_t H, int32_t KV, int32_t d, uint32_t flags,
                          int n_threads, ei_sizes *sz) {
    ei_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.max_tokens = max_tokens; sh.n_heads = H; sh.n_kv_heads = KV; sh.head_dim = d; sh.plan_flags = flags;
    sh.n_threads = n_threads;
    return checked(ei_layer_sizes(ctx, &sh, sz));
}

/* ------------------------------------------------------------ rng and element access */
static uint64_t rng_s;
static FZ_FAST uint32_t rng_next(void) {
    rng_s ^= rng_s << 13; rng_s ^= rng_s >> 7; rng_s ^= rng_s << 17;
    return (uint32_t)(rng_s >> 32);
}
static FZ_FAST float rng_val(void) { return (float)((int32_t)(rng_next() >> 21) - 1024) * (1.0f / 512.0f); } /* [-2, 2) */

/* The library's conversions (>>convert), uninstrumented. */
static FZ_FAST uint16_t fz_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static FZ_FAST uint16_t fz_to_f16(float f) {
    uint32_t u, sign, a;
    memcpy(&u, &f, 4);
    sign = (u >> 16) & 0x8000u; a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        float m, frac;
        uint32_t r;
        memcpy(&m, &a, 4);
        m *= 16777216.0f;
        r = (uint32_t)m;
        frac = m - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    a += 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return (uint16_t)(sign | (a >> 13));
}
static FZ_FAST float fz_from16(uint16_t h, ei_dtype dt) {
    uint32_t u;
    float f;
    if (dt == EI_BF16) { u = (uint32_t)h << 16; memcpy(&f, &u, 4); return f; }
    {
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
        if (ex == 0x1f) u = sign | 0x7f800000u | (man << 13);
        else if (ex == 0) { f = (float)man * (1.0f / 16777216.0f); return sign ? -f : f; }
        else u = sign | ((ex + 112u) << 23) | (man << 13);
        memcpy(&f, &u, 4);
        return f;
    }
}
/* Element i of a buffer of dtype dt (any alignment: memcpy). */
static FZ_FAST float load_el(const void *buf, ei_dtype dt, size_t i) {
    if (dtype_size(dt) == 2) {
        uint16_t h;
        memcpy(&h, (const unsigned char *)buf + 2 * i, 2);
        return fz_from16(h, dt);
    } else {
        float f;
        memcpy(&f, (const unsigned char *)buf + 4 * i, 4);
        return f;
    }
}
static FZ_FAST void store_el(void *buf, ei_dtype dt, size_t i, float v) {
    if (dtype_size(dt) == 2) {
        uint16_t h = dt == EI_BF16 ? fz_to_bf16(v) : fz_to_f16(v);
        memcpy((unsigned char *)buf + 2 * i, &h, 2);
    } else memcpy((unsigned char *)buf + 4 * i, &v, 4);
}
static FZ_FAST_INLINE size_t el_index(const ei_tensor *t, int64_t tok, int32_t h, int32_t i) {
    return (size_t)(tok * t->token_stride + (int64_t)h * t->head_stride + i);
}

/* ------------------------------------------------------------ buffers */
/* An exact-size allocation (ASan catches any byte outside it). */
static void *xalloc(size_t n) { void *p = malloc(n ? n : 1); if (!p) abort(); return p; }
/* Memory the library writes (workspaces, outputs, plan and decoder memory,
   keep sets) starts as garbage: NaN bytes or huge values, alternately, so a
   kernel that reads what it never wrote gives wrong (or non-finite) results
   deterministically, whatever the allocator hands out. */
static unsigned poison_count;
static int poison_byte(void) {
    static int forced = -2;
    if (forced == -2) {
        const char *e = getenv("EI_FUZZ_POISON");
        forced = e && *e >= '0' && *e <= '9' ? (int)strtol(e, NULL, 0) & 255 : -1;
    }
    if (forced >= 0) return forced;
    return (poison_count++ & 1) ? 0x7f : 0xff;
}
static int poison_off(void) { /* EI_FUZZ_POISON=none: leave it uninitialised (valgrind memcheck finds reads of it) */
    static int off = -1;
    if (off < 0) { const char *e = getenv("EI_FUZZ_POISON"); off = e && !strcmp(e, "none"); }
    return off;
}
/* Large buffers (workspaces are 150-400 KB) come from a pool of persistent
   allocations: ASan maps and unmaps large ones on every malloc/free, and the
   page faults cost more than the calls. Everything in a pool allocation
   outside the buffer handed out is poisoned (and a free buffer entirely), so
   ASan reports any access outside it, before it as well as after it. With
   EI_FUZZ_POISON=none (valgrind) every buffer is a fresh exact allocation. */
#define FZ_POOL 32
typedef struct pool_entry { unsigned char *raw, *user; size_t cap; } pool_entry;
static pool_entry pool[FZ_POOL];
static int poison_off(void);
static unsigned char *pool_take(size_t n, size_t *cap) {
    int i, best = -1;
    if (poison_off() || n > ((size_t)1 << 30)) return NULL;
    for (i = 0; i < FZ_POOL; ++i)
        if (!pool[i].user && pool[i].raw && pool[i].cap >= n && (best < 0 || pool[i].cap < pool[best].cap)) best = i;
    if (best < 0)
        for (i = 0; i < FZ_POOL; ++i)
            if (!pool[i].user) { /* a free entry, too small or empty: (re)allocate it */
                size_t c = (size_t)1 << 16;
                while (c < n) c *= 2;
                if (pool[i].raw) { FZ_UNPOISON(pool[i].raw, pool[i].cap); free(pool[i].raw); }
                pool[i].raw = (unsigned char *)xalloc(c);
                pool[i].cap = c;
                FZ_POISON(pool[i].raw, c);
                best = i;
                break;
            }
    if (best < 0) return NULL;
    pool[best].user = pool[best].raw;
    *cap = pool[best].cap;
    return pool[best].raw;
}
static int pool_give(const void *user) {
    int i;
    for (i = 0; i < FZ_POOL; ++i)
        if (pool[i].user && pool[i].user == (const unsigned char *)user) {
            FZ_POISON(pool[i].raw, pool[i].cap);
            pool[i].user = NULL;
            return 1;
        }
    return 0;
}
/* ... at a varying address: address mod 64 = off mod 64. Library memory
   (plan, decoder, workspaces) takes any offset, odd ones included ("any
   alignment" is the contract); int32/float arrays multiples of 4 (misaligned
   ones are the placement op's). Small buffers end exactly where their
   allocation ends (the offset is kept in the byte before the buffer). */
static void *walloc_off(size_t n, unsigned off) {
    unsigned char *raw, *p;
    size_t cap = 0;
    off %= 64u;
    if (n >= 256 && (raw = pool_take(n + 64, &cap)) != NULL) {
        size_t at = cap - n;
        at -= ((uintptr_t)(raw + at) - off) % 64u;
        p = raw + at;
        FZ_UNPOISON(p, n);
        {
            int i;
            for (i = 0; i < FZ_POOL; ++i)
                if (pool[i].raw == raw) pool[i].user = p;
        }
        if (!poison_off()) { /* large workspaces are mostly never touched: whole every 8th time, else their ends */
            int pb = poison_byte();
            if (n <= 20480 || (poison_count & 7u) == 0) memset(p, pb, n);
            else { memset(p, pb, 16384); memset(p + n - 4096, pb, 4096); }
        }
        return p;
    }
    off = off ? off : 64u;
    raw = (unsigned char *)xalloc(n + off);
    p = raw + off;
    if (!poison_off()) memset(p, poison_byte(), n);
    else poison_count++;
    p[-1] = (unsigned char)off;
    return p;
}
static void *walloc_mem(size_t n) { return walloc_off(n, poison_count * 37u + 11u); }
static void *walloc_arr(size_t n) { return walloc_off(n, ((poison_count * 5u + 3u) % 16u) * 4u); }
static void wfree(void *p) {
    if (!p || pool_give(p)) return;
    free((unsigned char *)p - ((unsigned char *)p)[-1]);
}
/* An exact buffer for view data: it ends where its memory ends, and from a
   pool entry the bytes before it are poisoned. */
static void *valloc_exact(size_t n) {
    size_t cap = 0;
    unsigned char *raw;
    int i;
    if (n < 256 || (raw = pool_take(n, &cap)) == NULL) return xalloc(n);
    for (i = 0; i < FZ_POOL; ++i)
        if (pool[i].raw == raw) pool[i].user = raw + cap - n;
    FZ_UNPOISON(raw + cap - n, n);
    return raw + cap - n;
}
static void vfree(void *p) {
    if (p && !pool_give(p)) free(p);
}

/* A view of [n][h][d] in its own exact buffer. */
typedef struct view {
    ei_tensor t;
    void *buf;       /* owned */
    size_t elems;    /* elements in buf */
    int valid;       /* strides positive and non-aliasing (library should accept the layout) */
    int tame;        /* every element finite and |x| <= 1e3 */
} view;

static const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 1e30f, -1e30f, 1e-40f, -1e-45f,
                                 0.0f, -0.0f, 65504.0f, 70000.0f, 1e-8f, 3e38f, 1e20f, -1e20f};

/* Stride modes: 0 contiguous, 1 padded tokens, 2 head-major, 3 padded heads,
   4 zero stride, 5 negative stride, 6 aliasing, 7 arbitrary, 8 huge. */
static void view_make(view *v, fz *f, ei_dtype dt, int64_t n, int32_t h, int32_t d, int mode) {
    int64_t ts = (int64_t)h * d, hs = d;
    int backed = 0; /* the buffer covers every element the view addresses */
    uint8_t pad1 = (uint8_t)(fz_u8(f) % 9), pad2 = (uint8_t)(fz_u8(f) % 9);
    memset(v, 0, sizeof *v);
    switch (mode) {
        case 1: ts = (int64_t)h * d + pad1 + 1; break;
        case 2: ts = d + pad1; hs = n * ts + pad2; break;
        case 3: hs = d + pad1 + 1; ts = (int64_t)h * hs + pad2; break;
        case 4: if (fz_u8(f) & 1) ts = 0; else hs = 0; break;
        case 5: if (fz_u8(f) & 1) ts = -ts; else hs = -hs; break;
        case 6: ts = d; hs = d; if (h == 1 && n > 1) ts = d > 1 ? d - 1 : 0; break;
        case 7: ts = (int16_t)fz_u16(f); hs = (int16_t)fz_u16(f); break;
        case 8: /* the farthest element past 2^60 (refused), or just inside it with one token (accepted) */
            ts = n > 1 ? ((int64_t)1 << 60) / (n - 1) + 1 + (int64_t)(fz_u8(f) % 3) : ((int64_t)1 << 61);
            break;
        default: break;
    }
    v->t.dtype = dt; v->t.n_tokens = n; v->t.n_heads = h; v->t.head_dim = d;
    v->t.token_stride = ts; v->t.head_stride = hs;
    if (n <= 0 || h <= 0 || d <= 0 || ts <= 0 || hs <= 0 || (n > 1 && ts > ((int64_t)1 << 24)) || (h > 1 && hs > ((int64_t)1 << 24)) ||
        n > 4096 || h > 64 || d > 256) {
        v->elems = (size_t)(d > 0 && d <= 256 ? d : 1); /* the library must reject before reading more */
    } else {
        int64_t ext = (n - 1) * ts + (int64_t)(h - 1) * hs + d;
        if (ext > ((int64_t)1 << 17)) { /* too big for a fast input: fall back to contiguous */
            ts = (int64_t)h * d; hs = d;
            v->t.token_stride = ts; v->t.head_stride = hs;
            ext = n * ts;
        }
        v->elems = (size_t)ext;
        backed = 1;
    }
    {
        int64_t s_in = hs <= ts ? hs : ts, n_in = hs <= ts ? h : n, s_out = hs <= ts ? ts : hs, n_out = hs <= ts ? n : h;
        /* the library's rule: the farthest element (n-1)*ts + (h-1)*hs + d below 2^60 */
        double far = (double)(n > 0 ? n - 1 : 0) * (double)ts + (double)(h > 0 ? h - 1 : 0) * (double)hs + (double)d;
        v->valid = ts > 0 && hs > 0 && far <= (double)((int64_t)1 << 60) && n > 0 && h > 0 && d > 0 &&
                   !((n_in > 1 && s_in < d) || (n_out > 1 && s_out < s_in * (n_in - 1) + d)) && backed;
    }
    v->buf = valloc_exact(v->elems * dtype_size(dt));
    v->t.data = v->buf;
    v->tame = 1;
}
/* Padding NaN (all-ones bytes: NaN in every dtype), real elements from the
   rng (mode 1: peaked, 2: ties, 3: raw 16-bit patterns) or raw bits. */
static FZ_FAST void view_fill_values(view *v, unsigned mode) {
    int64_t t;
    int32_t h, j;
    size_t es = dtype_size(v->t.dtype);
    memset(v->buf, 0xff, v->elems * es);
    if (!v->valid) { /* refused before any element is read: a constant, cheaply */
        memset(v->buf, 0x3c, v->elems * es);
        return;
    }
    for (t = 0; t < v->t.n_tokens; ++t)
        for (h = 0; h < v->t.n_heads; ++h) {
            size_t e0 = el_index(&v->t, t, h, 0);
            for (j = 0; j < v->t.head_dim; ++j) {
                float x = rng_val();
                if (mode == 1) x *= 20.0f;                          /* peaked softmaxes */
                if (mode == 2) x = (float)(rng_next() % 3u) - 1.0f; /* many exact ties */
                if (mode == 3 && es == 2) { ((uint16_t *)v->buf)[e0 + (size_t)j] = (uint16_t)rng_next(); continue; }
                store_el(v->buf, v->t.dtype, e0 + (size_t)j, x);
            }
        }
}
/* Every real element finite and |x| <= 1e3. */
static FZ_FAST int view_is_tame(const view *v) {
    int64_t t;
    int32_t h, j;
    if (!v->valid) return 0;
    for (t = 0; t < v->t.n_tokens; ++t)
        for (h = 0; h < v->t.n_heads; ++h) {
            size_t e0 = el_index(&v->t, t, h, 0);
            for (j = 0; j < v->t.head_dim; ++j) {
                float x = load_el(v->buf, v->t.dtype, e0 + (size_t)j);
                if (!(fabsf(x) <= 1e3f)) return 0;
            }
        }
    return 1;
}
static void view_fill(view *v, fz *f) {
    unsigned mode = fz_u8(f) % 4, nspec = fz_u8(f) % 4, s;
    view_fill_values(v, mode);
    if (!v->valid) return;
    for (s = 0; s < nspec; ++s) {
        int64_t tt = (int64_t)(fz_u16(f) % (unsigned)v->t.n_tokens);
        int32_t hh = (int32_t)(fz_u8(f) % (unsigned)v->t.n_heads), jj = (int32_t)(fz_u8(f) % (unsigned)v->t.head_dim);
        float x = FZ_PICK(f, specials);
        store_el(v->buf, v->t.dtype, el_index(&v->t, tt, hh, jj), x);
    }
    v->tame = mode != 3 && nspec == 0 ? 1 : view_is_tame(v);
}
static void describe(const char *name, const view *v) {
    if (!verbose) return;
    fprintf(stderr, "  %s: dtype %d, %lld tokens x %d heads x %d dims, strides token %lld head %lld, %zu elements, valid %d tame %d\n",
            name, (int)v->t.dtype, (long long)v->t.n_tokens, (int)v->t.n_heads, (int)v->t.head_dim,
            (long long)v->t.token_stride, (long long)v->t.head_stride, v->elems, v->valid, v->tame);
}
static void view_free(view *v) { vfree(v->buf); memset(v, 0, sizeof *v); }

/* Rows [t0, t0+cnt) of view src into view dst (same dtype, heads, dim; any
   layouts; element bytes copied). */
static FZ_FAST void copy_rows(const ei_tensor *dst, void *dst_data, const ei_tensor *src, int64_t t0, int64_t cnt) {
    size_t es = dtype_size(src->dtype), rb = (size_t)src->head_dim * es;
    int64_t t;
    int32_t h;
    for (t = 0; t < cnt; ++t)
        for (h = 0; h < src->n_heads; ++h)
            memcpy((unsigned char *)dst_data + el_index(dst, t, h, 0) * es,
                   (const unsigned char *)src->data + el_index(src, t0 + t, h, 0) * es, rb);
}
/* Rows [t0, t0+cnt) of src (valid view) into a new buffer with its own layout,
   followed by `pad` NaN rows. */
static void view_rows_padded(view *dst, const view *src, int64_t t0, int64_t cnt, int64_t pad, fz *f) {
    view_make(dst, f, src->t.dtype, cnt + pad, src->t.n_heads, src->t.head_dim, (int)(fz_u8(f) % 4));
    memset(dst->buf, 0xff, dst->elems * dtype_size(dst->t.dtype));
    copy_rows(&dst->t, dst->buf, &src->t, t0, cnt);
    dst->tame = src->tame;
}
static void view_rows(view *dst, const view *src, int64_t t0, int64_t cnt, fz *f) { view_rows_padded(dst, src, t0, cnt, 0, f); }

/* ------------------------------------------------------------ configuration */
static int n_alloc_calls = 0, fail_after = -1;
static void *fz_alloc(size_t n, void *u) {
    (void)u;
    if (fail_after >= 0 && n_alloc_calls++ >= fail_after) return NULL;
    return malloc(n);
}
static void fz_free(void *p, void *u) { (void)u; free(p); }
static void fz_log(void *u, ei_result code, const char *msg) {
    (void)u;
    ORACLE(code < 0 && strstr(msg, ei_result_name(code)) != NULL, "logged message does not name its code", code, 0);
}

static ei_config fz_small_config(void) {
    ei_config c = ei_config_default();
    /* small enough that short layers (FZ_LAYER_WORK) have sparse segments and compress */
    c.segment_size = 8; c.block_size = 2; c.base_budget = 8; c.threshold_len = 16;
    c.decode_budget = 12; c.window = 4; c.decode_gap = 2;
    return c;
}
static ei_config fz_config(fz *f) {
    static const int32_t seg[] = {16, 512, 1, 2, 4, 8, 32, 64, 24, 0, -1, EI_MAX_SEGMENT, EI_MAX_SEGMENT + 1, INT32_MAX, INT32_MIN};
    static const int32_t blk[] = {4, 8, 1, 2, 3, 16, 0, -1, 5, 7, 64, INT32_MAX};
    static const int64_t thr[] = {32, 4096, 0, 1, 16, -1, INT64_MAX, INT64_MIN, 48};
    static const int32_t base[] = {16, 2048, 0, 1, 4, 7, 64, 9, EI_MAX_BUDGET, EI_MAX_BUDGET + 1, -1, INT32_MAX};
    static const double ent[] = {1e-5, 0.0, 1.0, 10.0, 1e30, -1.0, NAN, INFINITY, -0.0, DBL_MIN, 0.5};
    static const double dl[] = {0.4, 0.0, 1.0, 5.0, 1e300, -0.1, NAN, INFINITY, 0.05};
    static const double fmin[] = {1.0, 0.0, 0.5, 3.0, 64.0, 65.0, -1.0, NAN};
    static const double fmax[] = {3.0, 1.0, 0.0, 64.0, 64.0001, 100.0, NAN, INFINITY, 2.0};
    static const int32_t flag[] = {1, 0, 2, -1};
    static const float scl[] = {0.0f, 0.125f, 1e-30f, 1e30f, -1.0f, NAN, INFINITY, FLT_MAX, 2.0f};
    static const int32_t dbud[] = {24, 1024, 8, 7, 1, 0, EI_MAX_BUDGET, EI_MAX_BUDGET + 1, 100, 5, 40, 12};
    static const int32_t win[] = {8, 32, 1, 2, 65536, 65537, 0, -1, 3, 5};
    static const int32_t gap[] = {4, 16, 0, 1, 8, 9, -1, 2};
    static const int32_t pool[] = {EI_POOL_AVG, EI_POOL_MAX, EI_POOL_NONE, 3, -1};
    static const int32_t kern[] = {5, 1, 3, 7, 0, 2, -1, 1023, 1025, 31};
    static const int32_t red[] = {EI_REDUCE_MEAN, EI_REDUCE_MAX, 2, -1};
    static const int32_t rec[] = {0, 1, 2, 5, -1, INT32_MAX};
    static const int32_t simd[] = {EI_SIMD_AUTO, EI_SIMD_SCALAR, EI_SIMD_AVX2, EI_SIMD_AVX512, EI_SIMD_NEON, 5, -1};
    static const int32_t rk[] = {EI_RANK_SAMPLED, EI_RANK_REFERENCE, 3, -1, EI_RANK_ANTIDIAGONAL};
    static const int32_t smp[] = {8, 1, 3, 64, 0, -1, EI_MAX_RANK_SAMPLES, EI_MAX_RANK_SAMPLES + 1, 33};
    static const double tp[] = {0.9, 0.0, 1.0, 0.5, 1e-9, -0.1, 1.5, NAN, INFINITY};
    static const int32_t sk[] = {1, 0, 2, 8, 1000, -1, EI_MAX_BUDGET + 1};
    static const int32_t dpol[] = {EI_DECODE_STREAMING, EI_DECODE_SNAPKV, EI_DECODE_H2O, EI_DECODE_ENTROPYINFER, 4, -1};
    static const int32_t dsink[] = {4, 0, 1, 100, -1, EI_MAX_BUDGET + 1};
    static const double drat[] = {0.25, 0.0, 1.0, 1e-9, 0.5, -0.1, 1.5, NAN};
    static const int32_t dmin[] = {4, 12, 8, 0, 13, 3, INT32_MAX};
    /* (H2O decoders hold n_heads x decode_positions floats: small values, and one past the limit) */
    static const int64_t dpos[] = {64, 0, 1, 200, 16, -1, EI_MAX_TOKENS + 1};
    static const int32_t dshw[] = {EI_SHARED_EQUAL, EI_SHARED_ENTROPY, 2, -1};
    ei_config c = fz_small_config();
    unsigned sel = fz_u8(f); /* bit i: knob group i is fuzzed (0: the small valid configuration) */
    if (sel & 1) { c.segment_size = FZ_PICK(f, seg); c.block_size = FZ_PICK(f, blk); }
    if (sel & 2) { c.threshold_len = FZ_PICK(f, thr); c.base_budget = FZ_PICK(f, base); }
    if (sel & 4) {
        c.rigid_entropy = FZ_PICK(f, ent); c.delta_t = FZ_PICK(f, dl); c.alpha = FZ_PICK(f, dl);
        c.budget_min_factor = FZ_PICK(f, fmin); c.budget_max_factor = FZ_PICK(f, fmax);
    }
    if (sel & 8) { c.last_segment_dense = FZ_PICK(f, flag); c.per_segment_budget = FZ_PICK(f, flag); c.attn_scale = FZ_PICK(f, scl); }
    if (sel & 16) {
        c.window = FZ_PICK(f, win); c.decode_budget = FZ_PICK(f, dbud); c.decode_gap = FZ_PICK(f, gap);
        c.recompress_every = FZ_PICK(f, rec); c.decode_scale = FZ_PICK(f, scl);
    }
    if (sel & 32) {
        c.pool = (ei_pool)FZ_PICK(f, pool); c.pool_kernel = FZ_PICK(f, kern);
        c.per_kv_head = FZ_PICK(f, flag); c.gqa_reduce = (ei_reduce)FZ_PICK(f, red);
    }
    if (sel & 64) c.simd = (ei_simd)FZ_PICK(f, simd);
    if (sel & 128) {
        unsigned x = fz_u8(f);
        if (x & 1) { c.allocator.alloc = fz_alloc; c.allocator.free = fz_free; fail_after = (x & 2) ? (int)(fz_u8(f) % 4) : -1; }
        if (x & 4) c.allocator.free = NULL; /* alloc without free: refused */
        if (x & 8) c.log = fz_log;
        if (x & 16) { c.backend = EI_BACKEND_CUDA; c.cuda_library = "/nonexistent/libentropyinfer_cuda.so"; }
        if (x & 32) c.backend = (ei_backend)7;
        if (x & 64) { /* the ranking beyond the paper */
            c.ranking = (ei_ranking)FZ_PICK(f, rk); c.rank_samples = FZ_PICK(f, smp); c.top_p = FZ_PICK(f, tp);
            c.sink_blocks = FZ_PICK(f, sk); c.local_blocks = FZ_PICK(f, sk);
        }
        if (x & 128) { /* decode policies and budgets that follow the context (issue 37) */
            c.decode_policy = (ei_decode_policy)FZ_PICK(f, dpol); c.decode_sink = FZ_PICK(f, dsink);
            c.decode_budget_ratio = FZ_PICK(f, drat); c.decode_budget_min = FZ_PICK(f, dmin);
            c.decode_positions = FZ_PICK(f, dpos);
            c.decode_shared_weight = (ei_shared_weight)FZ_PICK(f, dshw);
        }
    }
    return c;
}

/* Contexts are immutable: one per distinct configuration, created once and
   kept in a small cache keyed by the configuration's bytes (a failed
   creation is remembered with the valid context it falls back to). */
#define FZ_CACHE 256
#define FZ_KEY 64
typedef struct ctx_entry {
    uint8_t key[FZ_KEY];
    unsigned len;
    ei_context *ctx;
} ctx_entry;
static ctx_entry ctx_cache[FZ_CACHE];
static unsigned ctx_cache_next;
static ei_context *fz_context_create(ei_config c) {
    ei_context *ctx = (ei_context *)1;
    ei_result r = checked(ei_context_create(&c, &ctx));
    if (r != EI_OK) {
        ORACLE(ctx == NULL, "context returned on failure", r, 0);
        c = fz_small_config(); /* go on with a valid one */
        fail_after = -1;
        if (checked(ei_context_create(&c, &ctx)) != EI_OK) abort();
    } else {
        ORACLE(ctx != NULL, "no context on success", 0, 0);
        ORACLE(ei_context_config(ctx)->segment_size == c.segment_size, "config not kept", 0, 0);
        ORACLE(ei_cpu_supports(ei_context_config(ctx)->simd), "chosen SIMD path unsupported", ei_context_config(ctx)->simd, 0);
        /* the configuration the context runs: the path and backend chosen, never AUTO / CUDA_OR_CPU */
        ORACLE(ei_context_config(ctx)->simd != EI_SIMD_AUTO && ei_context_config(ctx)->backend != EI_BACKEND_CUDA_OR_CPU &&
                   (ei_context_config(ctx)->backend == EI_BACKEND_CPU || ei_context_config(ctx)->backend == EI_BACKEND_CUDA),
               "ei_context_config does not report the path and backend chosen", ei_context_config(ctx)->simd,
               ei_context_config(ctx)->backend);
    }
    return ctx;
}
static ei_context *fz_context(fz *f, ei_context *keep) {
    uint8_t key[FZ_KEY];
    unsigned i, len;
    ei_config c;
    ctx_entry *e;
    f->rec = key; f->nrec = 0; f->caprec = FZ_KEY;
    c = fz_config(f);
    f->rec = NULL;
    len = f->nrec;
    ORACLE(len <= FZ_KEY, "configuration longer than the cache key", len, FZ_KEY);
    for (i = 0; i < FZ_CACHE; ++i)
        if (ctx_cache[i].ctx && ctx_cache[i].len == len && !memcmp(ctx_cache[i].key, key, len)) return ctx_cache[i].ctx;
    e = &ctx_cache[ctx_cache_next++ % FZ_CACHE];
    if (e->ctx == keep) e = &ctx_cache[ctx_cache_next++ % FZ_CACHE]; /* never the other context of this input */
    if (e->ctx) ei_context_destroy(e->ctx);
    e->ctx = NULL; /* the allocator may fail: creation falls back to the small configuration */
    e->ctx = fz_context_create(c);
    memcpy(e->key, key, len);
    e->len = len;
    return e->ctx;
}

/* ------------------------------------------------------------ state */
typedef struct state {
    ei_context *ctx, *alt;
    view q, k, v;
    int64_t n;
    int32_t H, KV, d;
    ei_plan plan;
    void *plan_mem;
    int plan_ok, plan_owned, plan_trusted; /* trusted: produced by the library with the current ctx, not corrupted */
    int plan_dirty; /* op_corrupt wrote into the plan since its init or reset: rows the library does not
                       rewrite (past the planned segments, a skipped gap) may hold what it wrote */
    ei_context *plan_ctx;
    ei_decoder dec;
    void *dec_mem;
    int dec_ok;
    ei_keep_set keep;
    int keep_ok;
} state;

static void plan_release(state *s) {
    if (s->plan_owned) ei_plan_free(s->plan_ctx, &s->plan);
    wfree(s->plan_mem);
    s->plan_mem = NULL;
    s->plan_ok = s->plan_owned = s->plan_trusted = s->plan_dirty = 0;
    memset(&s->plan, 0, sizeof s->plan);
}
static void keep_release(state *s) {
    wfree(s->keep.index); wfree(s->keep.mask); wfree(s->keep.pooled);
    memset(&s->keep, 0, sizeof s->keep);
    s->keep_ok = 0;
}

static const ei_dtype dtypes[] = {EI_F32, EI_F16, EI_BF16, EI_F32, (ei_dtype)3, (ei_dtype)-1};

/* The sampled ranking scores rank_samples rows per segment and kv head
   whatever the segment's length (4096 rows of an 8-token segment), the
   antidiagonal one rank_samples tiles of as much work: its cost over a
   layer, relative to the layer's attention. */
static double rank_cost(const ei_context *ctx) {
    const ei_config *c = ei_context_config(ctx);
    double f;
    if (!c || c->ranking == EI_RANK_REFERENCE || c->segment_size <= 0) return 1.0;
    f = (double)c->rank_samples / (double)c->segment_size; /* rows scored per query of a segment (expf each) */
    return f > 1.0 ? f : 1.0;
}
static void layer_new(state *s, fz *f) {
    static const int32_t dims[] = {8, 16, 1, 3, 7, 17, 32, 33, 64, 5, 24, 0, -1, EI_MAX_HEAD_DIM + 1};
    unsigned gsel = fz_u8(f);
    ei_dtype dt = FZ_PICK(f, dtypes);
    int64_t n = (int64_t)(fz_u16(f) % 200u) + 1;
    view_free(&s->q); view_free(&s->k); view_free(&s->v);
    s->plan_trusted = 0; /* the plan was made for other data */
    s->KV = (int32_t)(gsel % 4) + 1;
    s->H = s->KV * (int32_t)((gsel >> 2) % 4 + 1);
    if ((gsel >> 4) == 15) s->H = s->KV + 1;       /* not a GQA multiple */
    if ((gsel >> 4) == 14) { s->H = 0; }            /* no heads */
    s->d = FZ_PICK(f, dims);
    if ((gsel >> 4) == 13) n = 0;
    if ((gsel >> 4) == 12) n = -5;
    /* keep each input fast: dense attention costs n^2 H d */
    while (n > 8 && (double)n * (double)n * (double)(s->H > 0 ? s->H : 1) * (double)(s->d > 0 ? s->d : 1) *
                        EI__MAX(rank_cost(s->ctx), rank_cost(s->alt)) > FZ_LAYER_WORK)
        n /= 2;
    s->n = n;
    rng_s = ((uint64_t)fz_u32(f) << 1) | 1u;
    view_make(&s->q, f, dt, n, s->H, s->d, (int)(fz_u8(f) % 9)); view_fill(&s->q, f);
    view_make(&s->k, f, dt, n, s->KV, s->d, (int)(fz_u8(f) % 9)); view_fill(&s->k, f);
    dt = FZ_PICK(f, dtypes); /* one read per statement: argument order is unspecified */
    view_make(&s->v, f, dt, n, s->KV, s->d, (int)(fz_u8(f) % 9)); view_fill(&s->v, f);
    describe("layer q", &s->q); describe("layer k", &s->k); describe("layer v", &s->v);
    work_spend((double)(s->q.elems + s->k.elems + s->v.elems));
}
/* The layer's sizes, for ops that need valid ones (0: none). */
static int layer_usable(const state *s) {
    return s->n > 0 && s->H > 0 && s->KV > 0 && s->H % s->KV == 0 && s->d > 0 && s->d <= 256 && s->q.valid && s->k.valid &&
           s->v.valid;
}

/* ------------------------------------------------------------ plan checks */
/* Always-kept blocks that lead a row of a segment that sees nvis blocks. */
static int64_t fz_forced(const ei_config *c, int64_t nvis) {
    int64_t n_sink, local0;
    return ei__forced_blocks(c, nvis, &n_sink, &local0);
}
static FZ_NOCOV void plan_check(const state *s, const ei_context *ctx) {
    const ei_plan *p = &s->plan;
    const ei_config *c = ei_context_config(ctx);
    int32_t h, sg, i, j, bps = c->segment_size / c->block_size;
    ORACLE(p->n_segments >= 0 && p->n_segments <= p->seg_capacity, "n_segments outside capacity", p->n_segments, p->seg_capacity);
    ORACLE(p->n_blocks >= 0 && p->n_blocks <= p->blk_capacity, "n_blocks outside capacity", p->n_blocks, p->blk_capacity);
    for (h = 0; h < p->n_kv_heads; ++h) {
        ORACLE(p->head_class[h] <= 1, "head class", p->head_class[h], h);
        for (sg = 0; sg < p->n_segments; ++sg) {
            size_t row = (size_t)h * (size_t)p->seg_capacity + (size_t)sg;
            const int32_t *idx = p->block_index + row * (size_t)p->max_keep;
            int32_t cnt = p->keep_count[row];
            int64_t forced = -1;
            ORACLE(cnt >= 0 && cnt <= p->max_keep, "keep count above the row capacity max_keep", cnt, p->max_keep);
            ORACLE(p->keep_blocks[row] >= 0 && p->keep_blocks[row] <= p->max_keep, "keep_blocks above max_keep", p->keep_blocks[row], p->max_keep);
            ORACLE((int64_t)cnt <= (int64_t)sg * bps, "keep count not causal", cnt, sg);
            for (i = 0; i < cnt && i < p->max_keep; ++i) {
                ORACLE(idx[i] >= 0 && idx[i] < sg * bps && idx[i] < p->n_blocks, "block index out of range", idx[i], sg);
                for (j = 0; j < i; ++j) ORACLE(idx[j] != idx[i], "duplicate block", idx[i], sg);
                if (i > 0 && p->scores && c->ranking == EI_RANK_REFERENCE) {
                    if (forced < 0) forced = fz_forced(c, (int64_t)sg * bps);
                    if (i > forced)
                        ORACLE(p->scores[row * (size_t)EI__MAX(p->blk_capacity, 1) + (size_t)idx[i - 1]] >=
                                   p->scores[row * (size_t)EI__MAX(p->blk_capacity, 1) + (size_t)idx[i]],
                               "ranking not descending", i, sg);
                }
            }
            if (!c->per_segment_budget)
                for (i = cnt; i < p->max_keep; ++i) ORACLE(idx[i] == -1, "padding not -1", idx[i], i);
        }
    }
}

static void op_plan_init(state *s, fz *f) {
    unsigned m = fz_u8(f);
    ei_context *ctx = (m & 1) ? s->alt : s->ctx;
    int64_t maxt = s->n > 0 ? s->n : 1;
    int32_t kv = s->KV, d = s->d;
    uint32_t flags = m >> 1 & 3u;
    size_t bytes = 0;
    ei_sizes sz;
    ei_result r;
    plan_release(s);
    switch (fz_u8(f) % 8) {
        case 1: maxt += fz_u8(f); break;
        case 2: maxt = fz_u8(f) % 64 + 1; break;
        case 3: maxt = (m & 64) ? EI_MAX_TOKENS + 1 : 0; break;
        case 4: kv = (int32_t)(fz_u8(f) % 6); break;
        case 5: flags = fz_u8(f); break;
        default: break;
    }
    /* the plan's size (a layer of kv query heads: the plan depends only on kv, d and flags) */
    r = fz_sizes(ctx, maxt, kv, kv, d, flags, 1, &sz);
    if (r != EI_OK) return;
    bytes = sz.plan;
    ORACLE(bytes > 0, "zero plan size", 0, 0);
    if (bytes > ((size_t)4 << 20)) return; /* too big for a fast input */
    work_spend((double)bytes / 4.0);
    if (m & 8) { /* memory NULL, bytes 0: the context allocates */
        r = checked(ei_plan_init(ctx, &s->plan, maxt, kv, d, flags, NULL, 0));
        if (r == EI_OK) {
            s->plan_ok = s->plan_owned = 1; s->plan_ctx = ctx;
            ORACLE(s->plan.owned_memory != NULL, "ei_plan_init(NULL, 0) made a plan without owned memory", 0, 0);
        }
    } else {
        size_t give = bytes, less;
        if (m & 16) { less = 1 + fz_u8(f) % 8; give = bytes > less ? bytes - less : 1; }
        s->plan_mem = walloc_mem(give);
        r = checked(ei_plan_init(ctx, &s->plan, maxt, kv, d, flags, (m & 32) ? NULL : s->plan_mem, give));
        if (m & 32) ORACLE(r == EI_ERR_NULL, "ei_plan_init with memory NULL and bytes > 0 is not EI_ERR_NULL", r, give);
        if (r == EI_OK) { s->plan_ok = 1; s->plan_ctx = ctx; ORACLE(give >= bytes, "plan accepted too small memory", give, bytes); }
        else { wfree(s->plan_mem); s->plan_mem = NULL; }
    }
    s->plan_trusted = s->plan_dirty = 0;
}

/* One workspace for profiling on nt threads or in nt parts (ei_layer_sizes'
   for nt; sometimes a few bytes short). */
static void *ws_for_profile(const state *s, const ei_context *ctx, fz *f, int64_t n, size_t *bytes, int nt) {
    size_t need = 0;
    ei_sizes sz;
    unsigned m = fz_u8(f);
    if (fz_sizes(ctx, n, s->H, s->KV, s->d, 0, ws_threads(nt), &sz) != EI_OK) need = 64;
    else need = sz.profile;
    if (need > ((size_t)8 << 20) * (size_t)ws_threads(nt)) need = 64;
    if ((m & 7) == 7 && need > 8) need -= 1 + (m >> 3) % 8; /* too small */
    *bytes = need;
    return walloc_mem(need);
}

static void after_profile(state *s, ei_result r, const ei_context *ctx) {
    if (r == EI_OK && s->plan_ok) {
        /* a plan made with another context may not be used with this one
           (its rows are sized for the other configuration) */
        s->plan_trusted = ctx == s->plan_ctx && !s->plan_dirty;
        plan_check(s, ctx);
    }
    /* padding is NaN and real elements are tame: a non-finite report means
       the library read outside the view */
    if (r == EI_ERR_NONFINITE)
        ORACLE(!(s->q.tame && s->k.tame && s->q.valid && s->k.valid), "NaN reported for finite input (padding read?)", 0, 0);
}
static double layer_cost(const state *s, double per_token) {
    return (double)(s->n > 0 ? s->n : 1) * (double)(s->H > 0 ? s->H : 1) * (double)(s->d > 0 ? s->d : 1) * per_token;
}

/* A plan's arrays and counts as bytes (the parts' plan against the whole call's). */
static size_t plan_extent(const ei_config *c, int64_t max_tokens, int32_t kv, int32_t d, uint32_t flags);
/* What a plan holds, for comparing two plans bit for bit: its counts, each
   kv head's class, and per planned segment its entropy, budget, counts and
   the blocks it keeps (not the padding between arrays or past the counts,
   which the library never writes: under memcheck it is uninitialised). */
static unsigned char *plan_bytes(const ei_context *ctx, const ei_plan *p, size_t *n) {
    int64_t cnt[4];
    unsigned char *b;
    size_t at = 0, cap;
    int32_t h, sg, kc;
    (void)ctx;
    if (!p->entropy || p->n_segments < 0 || p->n_segments > p->seg_capacity || p->max_keep < 0) return NULL;
    cap = sizeof cnt + (size_t)p->n_kv_heads * (1u + (size_t)p->n_segments * (16u + 4u * (size_t)p->max_keep));
    b = (unsigned char *)xalloc(cap);
    cnt[0] = p->n_tokens; cnt[1] = p->n_segments; cnt[2] = p->n_blocks; cnt[3] = p->final;
    memcpy(b, cnt, sizeof cnt);
    at = sizeof cnt;
    for (h = 0; h < p->n_kv_heads; ++h) {
        b[at++] = p->head_class[h];
        for (sg = 0; sg < p->n_segments; ++sg) {
            size_t row = EI_PLAN_ROW(p, h, sg);
            memcpy(b + at, &p->entropy[row], 4); at += 4;
            memcpy(b + at, &p->budget[row], 4); at += 4;
            memcpy(b + at, &p->keep_blocks[row], 4); at += 4;
            memcpy(b + at, &p->keep_count[row], 4); at += 4;
            kc = p->keep_count[row] < 0 ? 0 : p->keep_count[row] > p->max_keep ? p->max_keep : p->keep_count[row];
            memcpy(b + at, EI_PLAN_BLOCKS(p, h, sg), 4u * (size_t)kc); at += 4u * (size_t)kc;
        }
    }
    *n = at;
    return b;
}

/* kind 0: a whole call on one thread (or a NULL ei_exec, or a NULL
   workspace with bytes); 1: in parts, ith of nth from two bytes (-1..4 of
   0..5: bad pairs refused), then sometimes the other parts and
   ei_plan_finalize (the whole plan, checked, and then sometimes compared
   with a whole call's, bit for bit); 2: on threads. */
static void op_profile(state *s, fz *f, int kind) {
    ei_context *ctx = s->ctx;
    size_t wb;
    void *ws;
    ei_exec x;
    ei_result r;
    ei_plan *p = (fz_u8(f) % 16 == 15) ? NULL : &s->plan;
    if (!s->plan_ok && p) p = (fz_u8(f) & 1) ? NULL : &s->plan; /* zeroed, uninitialised plan */
    work_spend(layer_cost(s, 8.0));
    if (kind == 0) {
        unsigned b;
        ws = ws_for_profile(s, ctx, f, s->n, &wb, 1);
        b = fz_u8(f) % 32;
        x = ex(1, b == 31 ? NULL : ws, wb);
        r = xchecked(ctx, &x, ei_profile(ctx, b == 30 ? NULL : &x, &s->q.t, &s->k.t, p));
        if (b == 30) ORACLE(r != EI_OK, "ei_profile with a NULL ei_exec (no workspace) accepted", 0, 0);
    } else if (kind == 1) {
        int32_t ith = (int32_t)(fz_u8(f) % 6) - 1, nth = (int32_t)(fz_u8(f) % 6), j;
        unsigned rest;
        ws = ws_for_profile(s, ctx, f, s->n, &wb, nth);
        x = ex_part(ith, nth, ws, wb);
        r = xchecked(ctx, &x, ei_profile(ctx, &x, &s->q.t, &s->k.t, p));
        rest = r == EI_OK ? fz_u8(f) : 0u;
        if (rest & 1) { /* the other parts (the engine's threads), then ei_plan_finalize after its barrier */
            for (j = 0; j < nth && r == EI_OK; ++j)
                if (j != ith) { x.ith = j; r = xchecked(ctx, &x, ei_profile(ctx, &x, &s->q.t, &s->k.t, p)); }
            if (r == EI_OK) r = checked(ei_plan_finalize(ctx, p));
            if (r == EI_OK && (rest & 2) && p && s->plan_ctx == ctx) { /* the same plan as a whole call's, bit for bit */
                size_t na = 0, nb = 0;
                unsigned char *a = plan_bytes(ctx, p, &na), *b;
                ei_exec one = ex(1, ws, wb);
                if (a && checked(ei_profile(ctx, &one, &s->q.t, &s->k.t, p)) == EI_OK) {
                    b = plan_bytes(ctx, p, &nb);
                    ORACLE(b && na == nb && !memcmp(a, b, na), "a plan made in parts differs from the whole call's", ith, nth);
                    free(b);
                }
                free(a);
            }
        }
        if (r == EI_OK && !(rest & 1)) { s->plan_trusted = 0; wfree(ws); return; } /* a part's plan is not checked */
    } else {
        int nt = fz_threads(fz_u8(f), 3);
        ws = ws_for_profile(s, ctx, f, s->n, &wb, nt);
        x = ex(nt, ws, wb);
        r = xchecked(ctx, &x, ei_profile(ctx, &x, &s->q.t, &s->k.t, p));
    }
    after_profile(s, r, ctx);
    wfree(ws);
}

/* Chunked planning: a chunk of queries in its own buffer at any position
   (continuing, rolling back or skipping), the keys so far in theirs with
   padding cells after them, or a final call without queries. */
static void op_chunk(state *s, fz *f) {
    ei_context *ctx = s->ctx;
    const ei_config *c = ei_context_config(ctx);
    int64_t off = s->plan_ok ? s->plan.n_tokens : 0, cnt;
    unsigned m = fz_u8(f);
    int is_final, no_queries;
    int64_t pad;
    view qc, kc;
    size_t wb = 0;
    void *ws;
    ei_sizes sz;
    ei_exec x;
    int nt = 1, ith = 0, nth = 0, all_parts = 0, wsn = 1;
    ei_result r;
    if (!s->q.valid || !s->k.valid || s->n <= 0 || s->q.t.n_tokens != s->k.t.n_tokens) return;
    if (m & 1) off = (int64_t)(fz_u8(f) % (unsigned)s->n);
    if (off >= s->n) return;
    cnt = (m & 2) ? (int64_t)c->segment_size * (1 + fz_u8(f) % 3) : (int64_t)(fz_u8(f) % 64) + 1;
    if (m & 4) cnt = s->n - off;
    if (off + cnt > s->n) cnt = s->n - off;
    is_final = off + cnt == s->n ? !(m & 8) : (m & 16) != 0;
    pad = (m & 32) ? (int64_t)(fz_u8(f) % (unsigned)(s->n - off - cnt + 1)) : 0;
    no_queries = (m & 72) == 72 && s->plan_ok && s->plan.n_tokens <= s->n; /* finalise where the plan ends */
    if (no_queries) { off = s->plan.n_tokens; cnt = 0; is_final = 1; pad = s->n - off; }
    if (!no_queries) view_rows(&qc, &s->q, off, cnt, f);
    view_rows_padded(&kc, &s->k, 0, off + cnt, pad, f); /* padding cells are NaN: never read */
    if (m & 128) { /* in parts: ith 0..4 of nth 0..4 (bad pairs refused); sometimes every part, then finalize */
        unsigned b = fz_u8(f);
        ith = (int)(b % 5);
        all_parts = (int)((b / 5) & 1);
        nth = (int)(fz_u8(f) % 5);
        wsn = ws_threads(nth);
    } else { /* on nt threads (0: the caller alone), the workspace sized for nt or (a refused one) for one */
        unsigned b = fz_u8(f);
        nt = (int)(b % 4);
        if ((b >> 2) & 1) wsn = ws_threads(nt);
    }
    if (fz_sizes(ctx, s->plan_ok ? s->plan.max_tokens : s->n, s->H, s->KV, s->d, 0, wsn, &sz) != EI_OK ||
        (wb = sz.profile) > ((size_t)8 << 20) * (size_t)wsn)
        wb = 64;
    if ((m & 96) == 96 && wb > 8) wb -= 8;
    ws = walloc_mem(wb);
    work_spend(layer_cost(s, 8.0));
    if (m & 128) {
        int j, first_ok;
        x = ex_part(ith, nth, ws, wb);
        r = xchecked(ctx, &x, ei_profile_chunk(ctx, &x, no_queries ? NULL : &qc.t, &kc.t, s->plan_ok ? &s->plan : NULL, off,
                                               is_final));
        first_ok = r == EI_OK;
        if (r == EI_OK && all_parts) {
            for (j = 0; j < nth && r == EI_OK; ++j)
                if (j != ith) {
                    x.ith = j;
                    r = xchecked(ctx, &x, ei_profile_chunk(ctx, &x, no_queries ? NULL : &qc.t, &kc.t, s->plan_ok ? &s->plan : NULL,
                                                           off, is_final));
                }
            if (r == EI_OK) r = checked(ei_plan_finalize(ctx, s->plan_ok ? &s->plan : NULL));
        }
        if (first_ok && !(all_parts && r == EI_OK)) s->plan_trusted = 0; /* a part's plan, or parts that failed */
    }
    if (!(m & 128) || (all_parts && r == EI_OK)) {
        if (!(m & 128)) {
            x = ex(nt, ws, wb);
            r = xchecked(ctx, &x, ei_profile_chunk(ctx, &x, no_queries ? NULL : &qc.t, &kc.t, s->plan_ok ? &s->plan : NULL, off,
                                                   is_final));
        }
        /* a chunk rewrites only its own segments: a plan corrupted earlier stays
           untrusted unless this chunk started it (offset 0 rewrites every row) */
        if (r == EI_OK) {
            s->plan_trusted = (s->plan_trusted || (off == 0 && !no_queries)) && ctx == s->plan_ctx && !s->plan_dirty;
            if (s->plan_trusted) plan_check(s, ctx);
        }
    }
    wfree(ws);
    if (!no_queries) view_free(&qc);
    view_free(&kc);
}

static void op_corrupt(state *s, fz *f) {
    ei_plan *p = &s->plan;
    static const int32_t vals[] = {-1, -2, INT32_MIN, INT32_MAX, 0, 1, 1 << 20, 65535, 7};
    size_t rows, i;
    unsigned which = fz_u8(f) % 5;
    int32_t x;
    if (!s->plan_ok) return;
    rows = (size_t)p->n_kv_heads * (size_t)p->seg_capacity;
    x = (fz_u8(f) & 1) ? FZ_PICK(f, vals) : (int32_t)(fz_u8(f) % 64) - 8;
    if (fz_u8(f) % 4 == 0) x = (int32_t)((uint32_t)x + (uint32_t)p->n_blocks);
    switch (which) {
        case 0: if (p->max_keep > 0) p->block_index[fz_u32(f) % (rows * (size_t)p->max_keep)] = x; break;
        case 1: p->keep_count[fz_u32(f) % rows] = x; break;
        case 2: p->keep_blocks[fz_u32(f) % rows] = x; break;
        case 3: p->head_class[fz_u32(f) % (size_t)p->n_kv_heads] = (uint8_t)x; break;
        default: /* every row of one head points at one block */
            for (i = 0; i < rows * (size_t)p->max_keep; ++i) p->block_index[i] = x;
            break;
    }
    s->plan_trusted = 0;
    s->plan_dirty = 1;
}

/* ------------------------------------------------------------ attention */
/* check.h's ref_attention_token (FORMAT.md semantics) on the harness's
   uninstrumented loads: query token t of q (position q_offset + t), every
   query head, out[h * d + i] in double; 0 when a logit leaves float range
   (the kernels clamp those to +-FLT_MAX by design). */
static FZ_FAST int fz_ref_token(const ei_config *c, const ei_plan *plan, const ei_tensor *q, const ei_tensor *k,
                                 const ei_tensor *v, int64_t q_offset, int64_t t, double *out) {
    int32_t H = q->n_heads, G = H / k->n_heads, d = q->head_dim, h, i;
    int64_t p = q_offset + t, j;
    int sparse = ref_segment_sparse(c, plan, p / c->segment_size), in_range = 1;
    double scale = ref_attn_scale(c, d);
    int64_t *pos = (int64_t *)xalloc(sizeof(int64_t) * (size_t)ref_token_key_cap(c, plan, sparse, p));
    double *w = (double *)xalloc(sizeof(double) * (size_t)ref_token_key_cap(c, plan, sparse, p));
    double *qrow = (double *)xalloc(sizeof(double) * (size_t)d);
    for (h = 0; h < H; ++h) {
        int32_t kvh = h / G;
        int64_t np = ref_token_keys(c, plan, sparse, p, kvh, pos);
        double z;
        for (i = 0; i < d; ++i) qrow[i] = load_el(q->data, q->dtype, el_index(q, t, h, i));
        for (j = 0; j < np; ++j) {
            double dot = 0;
            size_t e0 = el_index(k, pos[j], kvh, 0);
            for (i = 0; i < d; ++i) dot += qrow[i] * load_el(k->data, k->dtype, e0 + (size_t)i);
            w[j] = dot * scale;
        }
        z = ref_softmax_weights(w, np, &in_range);
        for (i = 0; i < d; ++i) out[(size_t)h * (size_t)d + (size_t)i] = 0;
        for (j = 0; j < np; ++j) {
            size_t e0 = el_index(v, pos[j], kvh, 0);
            for (i = 0; i < d; ++i) out[(size_t)h * (size_t)d + (size_t)i] += w[j] * load_el(v->data, v->dtype, e0 + (size_t)i);
        }
        for (i = 0; i < d; ++i) out[(size_t)h * (size_t)d + (size_t)i] /= z;
    }
    free(pos); free(w); free(qrow);
    return in_range;
}
/* max |v| over the real elements of v (NaN counts as infinite). */
static FZ_FAST double fz_vmax(const ei_tensor *v, int64_t n_tokens) {
    double m = 0;
    int64_t t;
    int32_t h, i;
    for (t = 0; t < n_tokens && t < v->n_tokens; ++t)
        for (h = 0; h < v->n_heads; ++h)
            for (i = 0; i < v->head_dim; ++i) {
                double x = fabs((double)load_el(v->data, v->dtype, el_index(v, t, h, i)));
                if (!(x <= m)) m = x == x ? x : INFINITY;
            }
    return m;
}
/* The output against the reference on a few sampled tokens (the last one,
   the first one and a fuzzer-chosen one); a token with a logit beyond float
   range is skipped (clamped by design). */
static FZ_FAST int attention_matches(const ei_context *ctx, const ei_plan *plan, const view *q, const view *k, const view *v,
                                      const ei_out_tensor *o, int64_t q_off, unsigned pick) {
    int32_t H = q->t.n_heads, d = q->t.head_dim, h, i;
    int64_t toks[3];
    int nt = 0, a, ok = 1;
    /* f32 arithmetic: summation order only; the AVX-512 BF16 kernel
       (q, k, v all bf16) rounds the weights to bf16 (~2^-9) */
    int all_bf16 = q->t.dtype == EI_BF16 && k->t.dtype == EI_BF16 && v->t.dtype == EI_BF16;
    double tol = (o->dtype != EI_F32 ? 1e-2 : all_bf16 ? 4e-3 : 2e-4) * (1.0 + fz_vmax(&v->t, v->t.n_tokens));
    double *ref = (double *)xalloc(sizeof(double) * (size_t)H * (size_t)d);
    toks[nt++] = q->t.n_tokens - 1;
    if (q->t.n_tokens > 1) toks[nt++] = 0;
    if (q->t.n_tokens > 2) toks[nt++] = (int64_t)(pick % (unsigned)q->t.n_tokens);
    for (a = 0; a < nt && ok; ++a) {
        int64_t t = toks[a];
        if (!fz_ref_token(ei_context_config(ctx), plan, &q->t, &k->t, &v->t, q_off, t, ref)) continue;
        for (h = 0; h < H && ok; ++h)
            for (i = 0; i < d; ++i) {
                double want = ref[(size_t)h * (size_t)d + (size_t)i];
                float got = load_el(o->data, o->dtype, (size_t)(t * o->token_stride + (int64_t)h * o->head_stride + i));
                if (!(fabs((double)got - want) <= tol)) {
                    fprintf(stderr, "attention mismatch at token %lld head %d dim %d: %g vs reference %g\n",
                            (long long)(q_off + t), (int)h, (int)i, (double)got, want);
                    ok = 0;
                    break;
                }
            }
    }
    free(ref);
    return ok;
}
/* Every element of out finite (a successful call over finite, bounded V). */
static FZ_FAST int out_finite(const ei_out_tensor *o) {
    int64_t t;
    int32_t h, i;
    for (t = 0; t < o->n_tokens; ++t)
        for (h = 0; h < o->n_heads; ++h)
            for (i = 0; i < o->head_dim; ++i)
                if (!isfinite(load_el(o->data, o->dtype, (size_t)(t * o->token_stride + (int64_t)h * o->head_stride + i))))
                    return 0;
    return 1;
}

static void op_attention(state *s, fz *f, int threaded) {
    ei_context *ctx = s->ctx;
    unsigned m = fz_u8(f);
    int64_t q_off = 0, cnt = s->n;
    view qc, kc, vc;
    view ov;
    ei_out_tensor out;
    size_t wb = 0;
    void *ws;
    const ei_plan *plan = (m & 1) && s->plan_ok ? &s->plan : NULL;
    int ith, nth, all_ok = 1;
    ei_sizes sz;
    ei_exec x;
    ei_result r = EI_OK;
    static const int nths[] = {1, 2, 3, 1, 0, -1, 4};
    if (!s->q.valid || !s->k.valid || !s->v.valid || s->n <= 0) {
        /* invalid views: the library must refuse them without reading */
        ei_out_tensor o0 = ei_out_tensor_make(NULL, EI_F32, 1, 1, 1);
        float one = 0;
        o0.data = &one;
        r = fz_sizes(ctx, s->n > 0 ? s->n : 1, s->H, s->KV, s->d, 0, 1, &sz);
        wb = r == EI_OK && sz.prefill < ((size_t)8 << 20) ? sz.prefill : 64;
        ws = walloc_mem(wb);
        x = ex(1, ws, wb);
        xchecked(ctx, &x, ei_attention_prefill(ctx, &x, &s->q.t, &s->k.t, &s->v.t, NULL, &o0, 0));
        wfree(ws);
        return;
    }
    if (m & 2) { /* a chunk of queries at an offset */
        q_off = (int64_t)(fz_u8(f) % (unsigned)s->n);
        if (m & 4) q_off -= q_off % ei_context_config(ctx)->segment_size;
        cnt = (int64_t)(fz_u8(f) % (unsigned)(s->n - q_off)) + 1;
    }
    /* long layers: the last queries of the range only (late segments: the sparse ones) */
    while (cnt > 1 && attn_cost(cnt, q_off + cnt, s->H, s->d) > FZ_ATTN_WORK) {
        q_off += cnt - cnt / 2;
        cnt /= 2;
    }
    work_spend((double)cnt * (double)(q_off + cnt) * (double)s->H * (double)s->d);
    view_rows(&qc, &s->q, q_off, cnt, f);
    {
        int64_t nk = q_off + cnt;
        if ((m & 24) == 24) nk = (m & 32) ? nk - 1 : nk + (nk < s->n); /* disagreeing shapes */
        if (nk <= 0) nk = 1;
        view_rows(&kc, &s->k, 0, nk, f);
        view_rows(&vc, &s->v, 0, nk, f);
        kc.tame = view_is_tame(&kc); /* rows of an untame layer may be tame */
    }
    qc.tame = view_is_tame(&qc);
    if ((m & 24) == 24 && (m & 64)) q_off = -q_off - 1;
    {
        ei_dtype odt = FZ_PICK(f, dtypes);
        view_make(&ov, f, odt, cnt, s->H, s->d, (int)(fz_u8(f) % 9));
    }
    if (!poison_off()) memset(ov.buf, poison_byte(), ov.elems * dtype_size(ov.t.dtype)); /* garbage until written */
    memcpy(&out, &ov.t, sizeof out); /* same layout, writable */
    out.data = ov.buf;
    if (verbose > 0) {
        fprintf(stderr, "  attention: q_offset %lld, plan %s\n", (long long)q_off, plan ? "yes" : "NULL");
        describe("q", &qc); describe("k", &kc); describe("v", &vc); describe("out", &ov);
    }
    if ((m & 128) && !plan && cnt <= EI_DECODE_MAX_TOKENS + 1) { /* a decode step: keys split over threads or parts, merged */
        ei_keep_set keep, *kp = NULL;
        unsigned one_part;
        int keep_full = 0, keep_broken = 0;
        unsigned km = fz_u8(f);
        memset(&keep, 0, sizeof keep);
        if (km & 1) { /* through a keep set: all rows (must equal dense), a random subset, or a broken one */
            static const int32_t odd[] = {0, -1, 2, 3, 5};
            int64_t ntok = q_off + 1 - (int64_t)(fz_u8(f) % 3) + ((km & 8) ? 1 : 0), row;
            int32_t ho = (km & 6) == 0 ? 1 : (km & 6) == 2 ? s->KV : (km & 6) == 4 ? s->H : FZ_PICK(f, odd), h, i;
            if (ntok < 0) ntok = 0;
            if (ntok > 4096) ntok = 4096;
            keep.heads_out = ho;
            keep.n_tokens = ntok;
            keep.capacity = (int32_t)ntok + (int32_t)(fz_u8(f) % 3);
            keep_full = (km & 16) != 0;
            keep.n_kept = keep_full ? (int32_t)ntok : (int32_t)(fz_u8(f) % (unsigned)(ntok + 1));
            if (ho > 0 && ho <= 64) {
                keep.index = (int32_t *)walloc_arr((size_t)ho * (size_t)(keep.capacity > 0 ? keep.capacity : 1) * 4u);
                for (h = 0; h < ho; ++h) /* n_kept ascending rows of 0 .. ntok - 1 */
                    for (i = 0, row = 0; i < keep.n_kept; ++row)
                        if (keep_full || row >= ntok - (keep.n_kept - i) || fz_u8(f) % 2)
                            keep.index[(size_t)h * (size_t)keep.capacity + (size_t)i++] = (int32_t)row;
                if ((km & 32) && keep.n_kept > 1) { /* a repeated row */
                    keep.index[keep.n_kept - 1] = keep.index[keep.n_kept - 2];
                    keep_broken = 1;
                }
            }
            kp = &keep;
        }
        /* one workspace of ei_sizes.decode for the nth parts or threads (the partials live in it); sometimes
           one sized for a single thread (too small for nth parts: refused), or a byte short */
        nth = threaded ? fz_threads(fz_u8(f), 3) : FZ_PICK(f, nths);
        one_part = fz_u8(f) % 8 == 7;
        if (fz_sizes(ctx, q_off + cnt, s->H, s->KV, s->d, 0, one_part ? 1 : ws_threads(nth), &sz) != EI_OK ||
            (wb = sz.decode) > ((size_t)16 << 20))
            wb = 64;
        if (fz_u8(f) % 8 == 7 && wb > 0) wb--;
        ws = walloc_mem(wb);
        if (threaded) {
            x = ex(nth, ws, wb);
            r = xchecked(ctx, &x, ei_attention_decode(ctx, &x, &qc.t, &kc.t, &vc.t, kp, &out, q_off));
            all_ok = r == EI_OK;
            if (r == EI_OK) { /* after a call on threads the merge has nothing to do: EI_OK, out as it is */
                size_t ob = ov.elems * dtype_size(ov.t.dtype);
                unsigned char *before = (unsigned char *)xalloc(ob);
                memcpy(before, ov.buf, ob);
                r = xchecked(ctx, &x, ei_attention_decode_merge(ctx, &x, &out));
                ORACLE(r == EI_OK && !memcmp(before, ov.buf, ob), "ei_attention_decode_merge after a call on threads", r, nth);
                free(before);
            }
        } else {
            for (ith = 0; ith < (nth > 1 ? nth : 1) && all_ok; ++ith) {
                x = ex_part(ith, nth, ws, wb);
                all_ok = (r = xchecked(ctx, &x, ei_attention_decode(ctx, &x, &qc.t, &kc.t, &vc.t, kp, &out, q_off))) == EI_OK;
            }
            for (ith = 0; ith < (nth > 1 ? nth : 1) && all_ok; ++ith) { /* after the engine's barrier */
                x = ex_part(ith, nth, ws, wb);
                all_ok = (r = xchecked(ctx, &x, ei_attention_decode_merge(ctx, &x, &out))) == EI_OK;
            }
            if (one_part && nth >= 2)
                ORACLE(r != EI_OK, "decode in parts accepted a workspace for one part", nth, wb);
        }
        if (kp) {
            ORACLE(!(keep_broken && r == EI_OK), "decode attention accepted a keep set with a repeated row", keep.n_kept, 0);
            ORACLE(!(r == EI_OK && keep.n_tokens > q_off + 1), "decode attention accepted a keep set made after the step",
                   keep.n_tokens, q_off);
            if (!keep_full) all_ok = 0; /* a subset: no dense reference to compare with */
            wfree(keep.index);
        }
    } else if (threaded) {
        int nt = fz_threads(fz_u8(f), 3);
        if (fz_sizes(ctx, q_off + cnt, s->H, s->KV, s->d, 0, ws_threads(nt), &sz) != EI_OK ||
            (wb = sz.prefill) > ((size_t)8 << 20) * (size_t)ws_threads(nt))
            wb = 64;
        if (fz_u8(f) % 8 == 7 && wb > 0) wb--;
        ws = walloc_mem(wb);
        x = ex(nt, ws, wb);
        r = xchecked(ctx, &x, ei_attention_prefill(ctx, &x, &qc.t, &kc.t, &vc.t, plan, &out, q_off));
        all_ok = r == EI_OK;
    } else { /* in parts: one workspace for nth (every part passes it) */
        int short_ws;
        nth = FZ_PICK(f, nths);
        if (verbose > 0) fprintf(stderr, "  nth %d\n", nth);
        if (fz_sizes(ctx, q_off + cnt, s->H, s->KV, s->d, 0, ws_threads(nth), &sz) != EI_OK ||
            (wb = sz.prefill) > ((size_t)8 << 20) * (size_t)ws_threads(nth))
            wb = 64;
        short_ws = fz_u8(f) % 8 == 7 && wb > 0;
        if (short_ws) wb--;
        ws = walloc_mem(wb);
        if (fz_u8(f) % 8 == 7) { /* a single odd call: ith -1..4 of nth, and hostile ei_exec fields */
            static const int32_t huge[] = {EI__MAX_THREADS + 1, INT32_MAX, EI__MAX_THREADS, INT32_MIN};
            unsigned b = fz_u8(f);
            x = ex_part((int)(b % 6) - 1, nth, ws, wb);
            switch ((b / 6) % 6) {
                case 1: x.n_threads = 2 + (int32_t)(b % 3); break;                     /* threads and parts at once */
                case 2: x.nth = huge[b % 4]; x.ith = (b & 1) && x.nth > 0 ? x.nth - 1 : 0; break; /* nth past the limit (or at it) */
                case 3: x.n_threads = (b & 1) ? -1 : EI__MAX_THREADS + 1; break;       /* n_threads out of range */
                case 4: x.workspace = NULL; x.workspace_bytes = wb ? wb : 1; break;    /* a NULL workspace with bytes */
                case 5: x.ith = (int32_t)(b & 1 ? INT32_MIN : INT32_MAX); break;        /* ith at the int32 edges */
                default: break;
            }
            if (verbose > 0) fprintf(stderr, "  exec n_threads %d ith %d nth %d ws %p bytes %zu\n", (int)x.n_threads,
                                     (int)x.ith, (int)x.nth, x.workspace, x.workspace_bytes);
            r = xchecked(ctx, &x, ei_attention_prefill(ctx, &x, &qc.t, &kc.t, &vc.t, plan, &out, q_off));
            all_ok = 0;
        } else {
            for (ith = 0; ith < (nth > 1 ? nth : 1); ++ith) {
                x = ex_part(ith, nth, ws, wb);
                r = xchecked(ctx, &x, ei_attention_prefill(ctx, &x, &qc.t, &kc.t, &vc.t, plan, &out, q_off));
                if (r != EI_OK) { all_ok = 0; break; }
            }
            if (short_ws && nth >= 2 && qc.valid && kc.valid && vc.valid && ov.valid)
                ORACLE(r != EI_OK, "attention in parts accepted a workspace a byte short of nth shares", nth, wb);
        }
    }
    if (all_ok && r == EI_OK && qc.tame && kc.tame && vc.tame && ov.valid && (!plan || (s->plan_trusted && s->plan_ctx == ctx && plan->n_kv_heads == s->KV)) &&
        ei_context_config(ctx)->backend == EI_BACKEND_CPU) {
        if (!attention_matches(ctx, plan, &qc, &kc, &vc, &out, q_off, m)) fz_fail("attention differs from the reference", q_off, cnt);
    }
    /* the Q and K rows a call reads are scanned (EI_ERR_NONFINITE) and V is
       not: over finite V small enough for the output dtype, a successful call
       over all of q writes finite values (NaN padding read would show too) */
    if (FAMILY(FAM_NONFINITE) && all_ok && r == EI_OK && ov.valid && q_off >= 0) {
        double vmax = fz_vmax(&vc.t, q_off + cnt);
        if (vmax <= (ov.t.dtype == EI_F16 ? 6e4 : 1e30)) ORACLE(out_finite(&out), "attention wrote NaN/Inf over finite V", q_off, cnt);
    }
    if (FAMILY(FAM_NONFINITE) && r == EI_ERR_NONFINITE && qc.valid && kc.valid)
        ORACLE(!(qc.tame && kc.tame), "attention reported NaN/Inf for finite Q and K", q_off, cnt);
    wfree(ws);
    view_free(&qc); view_free(&kc); view_free(&vc); view_free(&ov);
}

/* ------------------------------------------------------------ decode */
static void op_decoder_init(state *s, fz *f) {
    unsigned m = fz_u8(f);
    int32_t H = s->H, KV = s->KV, d = s->d;
    size_t need = 0, give;
    memset(&s->dec, 0, sizeof s->dec);
    wfree(s->dec_mem);
    s->dec_mem = NULL;
    s->dec_ok = 0;
    if (m & 1) H = (int32_t)(fz_u8(f) % 10) - 1;
    if (m & 2) KV = (int32_t)(fz_u8(f) % 10) - 1;
    { /* the decoder's size depends on H and d: asked for a layer of H kv heads when KV does not divide H */
        ei_sizes sz;
        if (fz_sizes(s->ctx, 1, H, KV > 0 && H > 0 && H % KV == 0 ? KV : H, d, 0, 1, &sz) != EI_OK ||
            (need = sz.decoder) > ((size_t)2 << 20))
            need = 64;
    }
    give = (m & 4) ? need - 1 : need;
    s->dec_mem = walloc_mem(give);
    if (checked(ei_decoder_init(s->ctx, &s->dec, H, KV, d, (m & 8) ? NULL : s->dec_mem, give)) == EI_OK) s->dec_ok = 1;
}

static void op_observe(state *s, fz *f) {
    unsigned m = fz_u8(f);
    int64_t t0, cnt, q_pos;
    view qc;
    if (!s->q.valid || s->n <= 0) {
        checked(ei_decode_observe(s->ctx, s->dec_ok ? &s->dec : NULL, &s->q.t, s->dec_ok ? s->dec.position_end : 0,
                                  (int)(m & 1)));
        return;
    }
    t0 = (int64_t)(fz_u8(f) % (unsigned)s->n);
    cnt = (m & 2) ? 1 : (int64_t)(fz_u8(f) % (unsigned)(s->n - t0)) + 1;
    if (t0 + cnt > s->n) cnt = s->n - t0;
    view_rows(&qc, &s->q, t0, cnt, f);
    /* positions: mostly the protocol's (a fresh decoder's queries as the cache's newest rows, then the next
       position), sometimes the rows' own start (a jump: refused unless it is the next one) */
    if (m & 16) q_pos = t0;
    else q_pos = s->dec_ok && s->dec.n_observed > 0 ? s->dec.position_end : s->n - cnt;
    checked(ei_decode_observe(s->ctx, (m & 4) && !s->dec_ok ? NULL : &s->dec, &qc.t, q_pos, (int)(m & 1)));
    (void)ei_decode_due(s->ctx, &s->dec);
    view_free(&qc);
}

/* Decode keep sets over a row map (positions shuffled over the rows, an empty
   row, a garbage entry), scoring in nth parts with one workspace (sometimes
   one sized for a single part: refused), per-head or shared; select,
   shared_add and select_shared whole, in parts (part 0 works, the others
   return EI_OK and write nothing) or with n_threads 2. */
static void op_decode_rows(state *s, fz *f) {
    ei_context *ctx = s->ctx;
    const ei_config *c = ei_context_config(ctx);
    unsigned m = fz_u8(f);
    int64_t n = s->k.t.n_tokens, j;
    int32_t *map, h, i, H = s->dec.n_heads, KV = s->dec.n_kv_heads; /* the decoder's heads: op_decoder_init may vary them */
    int nth, ith, mode;
    unsigned b;
    float *scores, *shared;
    size_t wb = 0;
    void *ws;
    ei_keep_set ks;
    ei_sizes sz;
    ei_exec x;
    ei_result r = EI_OK;
    if (!s->k.valid || n <= 0 || !s->dec_ok || H <= 0 || (size_t)n * (size_t)H > ((size_t)16 << 20)) return;
    work_spend((double)n * (double)H * (double)s->d * (double)EI__MAX(ei_context_config(ctx)->window, 1) * 2.0);
    map = (int32_t *)walloc_arr(sizeof(int32_t) * (size_t)n);
    for (j = 0; j < n; ++j) map[j] = (int32_t)j;
    for (j = n - 1; j > 0; --j) {
        int64_t x = (int64_t)(fz_u16(f) % (unsigned)(j + 1));
        int32_t t = map[j];
        map[j] = map[x]; map[x] = t;
    }
    if (m & 1) map[fz_u16(f) % (unsigned)n] = -1;
    if (m & 2) map[fz_u16(f) % (unsigned)n] = (int32_t)fz_u32(f);
    b = fz_u8(f);
    nth = 1 + (int)(b % 4u);
    mode = (int)((b >> 2) & 3u); /* 1: the workspace of one part; 2: select etc. in parts; 3: with n_threads 2 */
    if (fz_sizes(ctx, n, H, KV, s->dec.head_dim, 0, mode == 1 ? 1 : nth, &sz) != EI_OK ||
        (wb = sz.decode_keep) > ((size_t)8 << 20) * (size_t)nth)
        wb = 64;
    ws = walloc_mem(wb);
    scores = (float *)walloc_arr(sizeof(float) * (size_t)H * (size_t)n);
    shared = (float *)walloc_arr(sizeof(float) * (size_t)n);
    memset(shared, 0, sizeof(float) * (size_t)n);
    for (ith = 0; ith < nth && r == EI_OK; ++ith) {
        x = ex_part(ith, nth, ws, wb);
        r = xchecked(ctx, &x, ei_decode_score(ctx, &x, &s->dec, &s->k.t, map, 0, scores));
    }
    if (mode == 1 && nth >= 2) ORACLE(r != EI_OK, "decode_score in parts accepted the workspace of one part", nth, wb);
    memset(&ks, 0, sizeof ks);
    ks.heads_out = (m & 4) ? 1 : c->per_kv_head ? KV : H;
    ks.capacity = (int32_t)EI__MIN(n, (int64_t)c->decode_budget);
    ks.index = (int32_t *)walloc_arr(sizeof(int32_t) * (size_t)ks.heads_out * (size_t)ks.capacity);
    ks.positions = (int32_t *)walloc_arr(sizeof(int32_t) * (size_t)ks.heads_out * (size_t)ks.capacity);
    ks.row_pos = map;
    if (r == EI_OK) {
        int parts = mode == 2 ? nth : 1, p;
        for (p = parts - 1; p >= 0 && r == EI_OK; --p) { /* part 0 last: the others must leave everything as it was */
            ei_decoder dec0 = s->dec;
            float *shared0 = NULL;
            x = mode == 2 ? ex_part(p, nth, ws, wb) : ex(mode == 3 ? 2 : 1, ws, wb);
            ks.n_kept = -7; /* (an output: a part that does nothing leaves it) */
            if (p > 0) { shared0 = (float *)xalloc(sizeof(float) * (size_t)n); memcpy(shared0, shared, sizeof(float) * (size_t)n); }
            if (m & 4) {
                r = xchecked(ctx, &x, ei_decode_shared_add(ctx, &x, &s->dec, scores, n, map, shared));
                if (r == EI_OK) r = xchecked(ctx, &x, ei_decode_select_shared(ctx, &x, &s->dec, shared, n, &ks));
            } else {
                r = xchecked(ctx, &x, ei_decode_select(ctx, &x, &s->dec, scores, n, &ks));
            }
            if (p > 0) {
                ORACLE(r == EI_OK && ks.n_kept == -7 && !memcmp(&dec0, &s->dec, sizeof dec0) &&
                           !memcmp(shared0, shared, sizeof(float) * (size_t)n),
                       "a part other than 0 of select / shared_add / select_shared did something", p, r);
                free(shared0);
            }
        }
    }
    if (r == EI_OK)
        for (h = 0; h < ks.heads_out; ++h)
            for (i = 0; i < ks.n_kept; ++i) {
                int32_t row = ks.index[(size_t)h * (size_t)ks.capacity + (size_t)i];
                ORACLE(row >= 0 && row < n && (i == 0 || row > ks.index[(size_t)h * (size_t)ks.capacity + (size_t)i - 1]),
                       "kept rows not ascending in range", row, i);
                ORACLE(map[row] >= 0 && ks.positions[(size_t)h * (size_t)ks.capacity + (size_t)i] == map[row],
                       "kept row's position is not its map entry", row, map[row]);
            }
    wfree(ks.index); wfree(ks.positions); wfree(scores); wfree(shared); wfree(ws); wfree(map);
}

/* sel (64..255, the op's selector byte) % 8: 0-4 one thread (or 0: the
   caller alone), 5 on threads, 6 in parts (refused: EI_ERR_CONFIG), 7 a
   NULL ei_exec (no workspace). */
static void op_decode_keep(state *s, fz *f, unsigned sel) {
    ei_context *ctx = s->ctx;
    const ei_config *c = ei_context_config(ctx);
    unsigned m = fz_u8(f);
    int64_t n = s->n;
    view kc;
    size_t wb = 0;
    void *ws;
    ei_keep_set *ks = &s->keep;
    ei_sizes sz;
    ei_exec x;
    int nt = (sel >> 3) & 1 ? 0 : 1;
    ei_result r;
    int32_t heads_out;
    if (sel % 8 == 5 && threads_left > 0) { threads_left--; nt = 2; }
    if (!s->k.valid || s->n <= 0) {
        x = ex(1, NULL, 0);
        xchecked(ctx, &x, ei_decode_keep(ctx, &x, &s->dec, &s->k.t, &s->keep));
        return;
    }
    keep_release(s);
    work_spend((double)n * (double)s->H * (double)s->d * (double)EI__MAX(c->window, 1));
    if (m & 1) n = (int64_t)(fz_u8(f) % (unsigned)s->n) + 1;
    view_rows(&kc, &s->k, 0, n, f);
    heads_out = c->per_kv_head ? s->KV : s->H;
    if (m & 2) heads_out = (int32_t)(fz_u8(f) % 9);
    ks->heads_out = heads_out;
    ks->capacity = (int32_t)EI__MIN(n, (int64_t)c->decode_budget);
    if (m & 4) ks->capacity += (int32_t)(fz_u8(f) % 5) - 2;
    if (heads_out > 0 && ks->capacity > 0 && ks->capacity < (1 << 20)) {
        ks->index = (int32_t *)walloc_arr(sizeof(int32_t) * (size_t)heads_out * (size_t)ks->capacity);
        if (m & 8) {
            ks->mask_capacity = n - ((m & 16) ? 1 : 0);
            if (ks->mask_capacity > 0) ks->mask = (uint8_t *)walloc_mem((size_t)heads_out * (size_t)ks->mask_capacity);
        }
        if (m & 32) {
            ks->pooled_capacity = n - EI__MIN((int64_t)c->window, n) - ((m & 64) ? 1 : 0);
            if (ks->pooled_capacity > 0) ks->pooled = (float *)walloc_arr(sizeof(float) * (size_t)heads_out * (size_t)ks->pooled_capacity);
        }
    }
    if (fz_sizes(ctx, n, s->H, s->KV, s->d, 0, ws_threads(nt), &sz) != EI_OK ||
        (wb = sz.decode_keep) > ((size_t)8 << 20) * (size_t)ws_threads(nt))
        wb = 64;
    if ((m & 128) && wb > 0) wb -= 1;
    ws = walloc_mem(wb);
    x = sel % 8 == 6 ? ex_part((int)(sel >> 3) & 1, 2, ws, wb) : ex(nt, ws, wb);
    r = xchecked(ctx, &x, ei_decode_keep(ctx, sel % 8 == 7 ? NULL : &x, s->dec_ok ? &s->dec : NULL, &kc.t, ks));
    if (sel % 8 == 6) ORACLE(r == EI_ERR_CONFIG, "ei_decode_keep in parts was not refused with EI_ERR_CONFIG", r, 0);
    if (sel % 8 == 7) ORACLE(r != EI_OK, "ei_decode_keep with a NULL ei_exec (no workspace) accepted", r, 0);
    if (r == EI_OK) {
        int32_t h, i;
        ORACLE(ks->n_kept >= 0 && ks->n_kept <= ks->capacity, "n_kept outside capacity", ks->n_kept, ks->capacity);
        ORACLE(ks->n_kept == (int32_t)EI__MIN(n, ei__decode_budget(c, n)), "n_kept is not min(n, budget)", ks->n_kept, n);
        for (h = 0; h < ks->heads_out; ++h) {
            const int32_t *idx = ks->index + (size_t)h * (size_t)ks->capacity;
            for (i = 0; i < ks->n_kept; ++i) {
                ORACLE(idx[i] >= 0 && idx[i] < n && (i == 0 || idx[i] > idx[i - 1]), "keep index not ascending in range", idx[i], i);
                if (ks->mask) ORACLE(ks->mask[(size_t)h * (size_t)ks->mask_capacity + (size_t)idx[i]] == 1, "mask disagrees", h, i);
            }
        }
        if (ks->compressed) { /* the tail (the observation window's positions) is always kept, last */
            int64_t W = ei__decode_tail(c, &s->dec);
            for (h = 0; h < ks->heads_out; ++h)
                for (i = 0; i < W; ++i)
                    ORACLE(ks->index[(size_t)h * (size_t)ks->capacity + (size_t)(ks->n_kept - W + i)] == n - W + i,
                           "window position not kept", h, i);
        }
        s->keep_ok = 1;
    }
    wfree(ws);
    view_free(&kc);
}

/* Compaction with the last keep set or an arbitrary one, on K/V caches in exact buffers. */
static void op_compact(state *s, fz *f) {
    unsigned m = fz_u8(f);
    ei_keep_set ks;
    int32_t *index = NULL;
    view kv[2];
    ei_out_tensor o[2];
    void *orig[2] = {NULL, NULL};
    int w, use[2];
    int32_t h, i, heads;
    int64_t n;
    ei_result r;
    memset(&ks, 0, sizeof ks);
    if (s->keep_ok && (m & 1)) {
        ks = s->keep;
        ks.mask = NULL; ks.pooled = NULL;
    } else {
        ks.heads_out = (int32_t)(fz_u8(f) % 5);
        ks.capacity = (int32_t)(fz_u8(f) % 40);
        ks.n_kept = (int32_t)(fz_u8(f) % 44) - 2;
        ks.n_tokens = (int64_t)(fz_u8(f) % 60) - 2;
        if (ks.heads_out > 0 && ks.capacity > 0) {
            index = (int32_t *)xalloc(sizeof(int32_t) * (size_t)ks.heads_out * (size_t)ks.capacity);
            for (h = 0; h < ks.heads_out; ++h) {
                int32_t pos = 0;
                for (i = 0; i < ks.capacity; ++i) {
                    unsigned b = fz_u8(f);
                    pos = (int32_t)((uint32_t)pos + b % 4u);
                    if (b >= 250) pos = (int32_t)fz_u32(f); /* arbitrary */
                    index[(size_t)h * (size_t)ks.capacity + (size_t)i] = (int32_t)((uint32_t)pos + (uint32_t)i);
                }
            }
        }
        ks.index = (m & 2) ? NULL : index;
    }
    heads = ks.heads_out > 0 ? ks.heads_out : 1;
    n = ks.n_tokens > 0 ? ks.n_tokens : 1;
    if (m & 4) n += (int64_t)(fz_u8(f) % 4) - 1;
    if (n <= 0) n = 1;
    for (w = 0; w < 2; ++w) {
        use[w] = !((m >> (3 + w)) & 1);
        ei_dtype cdt = FZ_PICK(f, dtypes);
        view_make(&kv[w], f, cdt, n, (m & 32) ? heads + 1 : heads, s->d > 0 ? s->d : 4, (int)(fz_u8(f) % 9));
        rng_s = rng_s ? rng_s : 1;
        view_fill(&kv[w], f);
        memcpy(&o[w], &kv[w].t, sizeof o[w]);
        o[w].data = kv[w].buf;
        orig[w] = xalloc(kv[w].elems * dtype_size(kv[w].t.dtype));
        memcpy(orig[w], kv[w].buf, kv[w].elems * dtype_size(kv[w].t.dtype));
    }
    r = checked(ei_kv_compact((m & 64) ? NULL : s->ctx, (m & 128) ? NULL : &ks, use[0] ? &o[0] : NULL, use[1] ? &o[1] : NULL));
    if (r == EI_OK && !(m & 128))
        for (w = 0; w < 2; ++w) {
            size_t rb;
            if (!use[w]) continue;
            rb = (size_t)o[w].head_dim * dtype_size(o[w].dtype);
            for (h = 0; h < ks.heads_out; ++h)
                for (i = 0; i < ks.n_kept; ++i) {
                    int32_t src = ks.index[(size_t)h * (size_t)ks.capacity + (size_t)i];
                    ORACLE(src >= i && src < n, "compaction accepted a bad index", src, i);
                    ORACLE(!memcmp((char *)kv[w].buf + el_index(&kv[w].t, i, h, 0) * dtype_size(o[w].dtype),
                                   (char *)orig[w] + el_index(&kv[w].t, src, h, 0) * dtype_size(o[w].dtype), rb),
                           "compaction moved the wrong row", h, i);
                }
        }
    for (w = 0; w < 2; ++w) { view_free(&kv[w]); free(orig[w]); }
    free(index);
}

/* ------------------------------------------------------------ size queries */
#ifdef __SIZEOF_INT128__
typedef unsigned __int128 u128;
#else
typedef unsigned long long u128;
#endif
/* A context of ei_config_quality() (made once), for size queries. */
static ei_context *quality_context(void) {
    static ei_context *qctx = NULL;
    if (!qctx) {
        ei_config qc = ei_config_quality();
        if (checked(ei_context_create(&qc, &qctx)) != EI_OK) fz_fail("ei_config_quality() refused", 0, 0);
    }
    return qctx;
}
/* ei_layer_sizes of a shape from the picks (and ei_exec's n_threads at its
   edges), the queries with NULL arguments, the GPU-memory helpers on a CPU
   context, ei_tensor_make of the picks, the CPU probes. */
static void op_sizes(state *s, fz *f) {
    static const int64_t toks[] = {1, 2, 511, 512, 513, 4096, EI_MAX_TOKENS, EI_MAX_TOKENS + 1, 0, -1, INT64_MAX, INT64_MIN};
    static const int32_t heads[] = {1, 2, 8, 64, EI_MAX_HEADS, EI_MAX_HEADS + 1, 0, -1, INT32_MAX, 3};
    static const int32_t dims[] = {1, 64, 128, EI_MAX_HEAD_DIM, EI_MAX_HEAD_DIM + 1, 0, -1, INT32_MAX};
    static const int32_t threads[] = {1, 0, 2, 3, 16, EI__MAX_THREADS, EI__MAX_THREADS + 1, -1, INT32_MAX, INT32_MIN, 64, 7};
    unsigned sel = fz_u8(f), fb;
    ei_context *ctx = (sel & 2) ? quality_context() : (sel & 1) ? s->alt : s->ctx;
    const ei_config *c = ei_context_config(ctx);
    int64_t n = FZ_PICK(f, toks);
    int32_t H = FZ_PICK(f, heads), KV = FZ_PICK(f, heads), d = FZ_PICK(f, dims), nt;
    uint32_t flags;
    ei_shape sh;
    ei_sizes z, z1;
    ei_result r;
    int valid;
    fb = fz_u8(f);
    flags = fb % 4;
    nt = threads[(fb >> 2) % (sizeof threads / sizeof threads[0])];
    if (sel & 4) flags |= (sel & 8) ? EI_PLAN_KEEP_KEYS : 0x80u; /* KEEP_KEYS (alone: without CHUNKED), or an unknown flag */
    memset(&sh, 0, sizeof sh);
    sh.max_tokens = n; sh.n_heads = H; sh.n_kv_heads = KV; sh.head_dim = d; sh.plan_flags = flags; sh.n_threads = nt;
    memset(&z, 0x5a, sizeof z);
    r = checked(ei_layer_sizes(ctx, &sh, &z));
    valid = n >= 1 && n <= EI_MAX_TOKENS && H >= 1 && H <= EI_MAX_HEADS && KV >= 1 && KV <= EI_MAX_HEADS && H % KV == 0 &&
            d >= 1 && d <= EI_MAX_HEAD_DIM && nt >= 0 && nt <= EI__MAX_THREADS;
    if (!valid) ORACLE(r != EI_OK, "ei_layer_sizes accepted a shape outside the limits", n, nt);
    if (r == EI_OK) {
        u128 segs = (u128)((n + c->segment_size - 1) / c->segment_size);
        int nn = nt > 1 ? nt : 1;
        ORACLE((u128)z.plan >= segs * (u128)KV * 16u, "plan size wrapped", (long)z.plan, n);
        ORACLE((u128)z.profile >= (u128)d * 8u * (u128)nn, "profile workspace too small", (long)z.profile, d);
        ORACLE((u128)z.decode_keep >= ((u128)H * (u128)n * 4u + (u128)32 * (u128)n * 4u + (u128)n * 32u) * (u128)nn,
               "decode workspace wrapped", (long)z.decode_keep, n);
        ORACLE((u128)z.decoder >= (u128)c->window * (u128)H * (u128)d * 4u, "decoder size wrapped", (long)z.decoder, H);
        ORACLE(z.prefill > 0 && z.decode > 0, "zero attention workspace", (long)z.prefill, (long)z.decode);
        ORACLE(z.workspace == EI__MAX(EI__MAX(z.profile, z.prefill), EI__MAX(z.decode, z.decode_keep)),
               "sizes.workspace is not the largest workspace", (long)z.workspace, 0);
        /* n_threads: the per-thread shares laid end to end (CPU); plan and decoder do not change */
        sh.n_threads = 1;
        if (checked(ei_layer_sizes(ctx, &sh, &z1)) == EI_OK) {
            ORACLE(z.plan == z1.plan && z.decoder == z1.decoder, "plan or decoder size depends on n_threads", nt, 0);
            ORACLE(z.profile == z1.profile * (size_t)nn && z.prefill == z1.prefill * (size_t)nn &&
                       z.decode_keep == z1.decode_keep * (size_t)nn && z.decode >= z1.decode,
                   "workspaces for n_threads are not n_threads shares", nt, (long)z.profile);
        } else ORACLE(0, "ei_layer_sizes refused one thread after accepting n_threads", nt, 0);
        sh.n_threads = nt;
    }
    ORACLE(checked(ei_layer_sizes(ctx, &sh, NULL)) == EI_ERR_NULL, "ei_layer_sizes: sizes NULL", 0, 0);
    ORACLE(checked(ei_layer_sizes(ctx, NULL, &z)) == EI_ERR_NULL, "ei_layer_sizes: shape NULL", 0, 0);
    ORACLE(checked(ei_layer_sizes(NULL, &sh, &z)) == EI_ERR_NULL, "ei_layer_sizes: context NULL", 0, 0);
    { /* GPU-memory helpers: on a CPU context a clear EI_ERR_UNSUPPORTED (or EI_ERR_NULL) */
        void *dp = NULL;
        char buf[16] = {0};
        ei_plan dst;
        unsigned m = fz_u8(f);
        memset(&dst, 0, sizeof dst);
        checked(ei_device_alloc(ctx, (m & 1) ? &dp : NULL, (size_t)fz_u16(f)));
        ei_device_free(ctx, dp);
        checked(ei_device_copy(ctx, (m & 2) ? buf : NULL, buf + 8, 8, (int)(m >> 4) - 1));
        checked(ei_plan_copy((m & 4) ? ctx : NULL, &dst, s->plan_ok ? &s->plan : NULL, (int)(m >> 5) - 1));
        ORACLE(dst.entropy == NULL, "ei_plan_copy wrote a plan on a CPU context", 0, 0);
        r = checked(ei_cuda_status((m & 8) ? ctx : NULL));
        ORACLE(r == ((m & 8) ? EI_OK : EI_ERR_NULL), "ei_cuda_status on a CPU context (or NULL)", r, m);
    }
    { /* a contiguous view of the picks: its strides are the layout's, whatever the values */
        ei_tensor t = ei_tensor_make(NULL, (ei_dtype)(fb >> 6), n, H, d);
        ORACLE(t.n_tokens == n && t.n_heads == H && t.head_dim == d && t.dtype == (ei_dtype)(fb >> 6) && t.data == NULL &&
                   t.head_stride == (int64_t)d && t.token_stride == (int64_t)H * (int64_t)d,
               "ei_tensor_make is not the contiguous view", H, d);
    }
    (void)ei_plan_segment_is_sparse(ctx, s->plan_ok ? &s->plan : NULL, (int32_t)fz_u32(f));
    (void)ei_simd_name((ei_simd)(int32_t)fz_u32(f));
    (void)ei_cpu_supports((ei_simd)(int32_t)fz_u8(f));
    (void)ei_result_string((ei_result)(int8_t)fz_u8(f));
    {
        double ratio = ei_cpu_dpbf16_ratio();
        ORACLE(ratio >= 0.0 && ratio < 1e6 && (ratio == 0.0 || ei_cpu_supports(EI_SIMD_AVX512_BF16)),
               "ei_cpu_dpbf16_ratio out of range (or non-zero without AVX512_BF16)", (long)(ratio * 1000), 0);
    }
}


/* ------------------------------------------------------------ int64 edges (issue 36) */
/* Every caller value a call adds to or multiplies (positions, counts,
   strides, capacities; a plan's and a decoder's counters) at the int64 and
   int32 edges, at the documented limits and around them: a call refuses it
   with a code its message names, or (in range) accepts it; under UBSan no
   sum or product overflows before the value is checked. */
static const int64_t edge_vals[] = {INT64_MIN, INT64_MIN + 1, (int64_t)INT32_MIN - 1, INT32_MIN, -2, -1, 0, 1,
                                    INT32_MAX, (int64_t)INT32_MAX + 1, EI_MAX_TOKENS - 1, EI_MAX_TOKENS,
                                    EI_MAX_TOKENS + 1, ((int64_t)1 << 40) + 1, INT64_MAX - 1, INT64_MAX};
static void op_edges(state *s, fz *f) {
    ei_context *ctx = s->ctx;
    unsigned which = fz_u8(f);
    int64_t e = FZ_PICK(f, edge_vals);
    int past = e < 0 || e > EI_MAX_TOKENS; /* a position or count no call accepts */
    size_t wb = 0;
    void *ws = NULL;
    ei_sizes sz;
    ei_exec x;
    ei_result r = EI_OK;
    if (verbose > 0) fprintf(stderr, "  edges: case %u, value %lld\n", which % 9, (long long)e);
    if (!layer_usable(s) || ei_context_config(ctx)->backend != EI_BACKEND_CPU) return;
    switch (which % 9) {
        case 0: case 1: { /* chunked planning: q_pos, or q's count at the largest q_pos */
            ei_tensor q = s->q.t;
            int64_t q_pos = e;
            if (which % 9 == 1) { q.n_tokens = e; q_pos = (fz_u8(f) & 1) ? EI_MAX_TOKENS : s->plan_ok ? s->plan.n_tokens : 0; }
            if (fz_sizes(ctx, s->plan_ok ? s->plan.max_tokens : s->n, s->H, s->KV, s->d, 0, 1, &sz) != EI_OK ||
                (wb = sz.profile) > ((size_t)8 << 20))
                return;
            ws = walloc_mem(2 * wb);
            x = ex(1, ws, wb);
            if (!s->plan_ok || !s->plan.state) { r = checked(ei_profile_chunk(ctx, &x, &q, &s->k.t, NULL, q_pos, 0)); break; }
            if (fz_u8(f) & 1) x = ex(2, ws, 2 * wb); /* on 2 threads */
            r = checked(ei_profile_chunk(ctx, &x, &q, &s->k.t, &s->plan, q_pos, 0));
            if (q_pos > s->n || (which % 9 == 1 && (past || e == 0))) ORACLE(r != EI_OK, "a chunk past its keys was accepted", e, q_pos);
            s->plan_trusted = 0;
            break;
        }
        case 2: case 3: { /* attention: q_offset (prefill, a decode step) */
            int64_t cnt = (which % 9 == 3) ? 1 : EI__MIN(s->n, (int64_t)4);
            ei_tensor q = s->q.t;
            float *out = (float *)walloc_arr(sizeof(float) * (size_t)cnt * (size_t)s->H * (size_t)s->d);
            ei_out_tensor o = ei_out_tensor_make(out, EI_F32, cnt, s->H, s->d);
            q.n_tokens = cnt;
            if (fz_sizes(ctx, s->n, s->H, s->KV, s->d, 0, 1, &sz) == EI_OK) {
                wb = which % 9 == 2 ? sz.prefill : sz.decode;
                ws = walloc_mem(wb);
                x = ex(1, ws, wb);
                if (which % 9 == 2) r = checked(ei_attention_prefill(ctx, &x, &q, &s->k.t, &s->v.t, NULL, &o, e));
                else r = checked(ei_attention_decode(ctx, &x, &q, &s->k.t, &s->v.t, NULL, &o, e));
                if (past || e + cnt > s->n) ORACLE(r != EI_OK, "attention past its keys was accepted", e, cnt);
            }
            wfree(out);
            break;
        }
        case 4: { /* a keep set's counts and capacities, read by a decode step and by compaction */
            ei_keep_set k = s->keep;
            ei_tensor q = s->q.t;
            float *out = (float *)walloc_arr(sizeof(float) * (size_t)s->H * (size_t)s->d);
            ei_out_tensor o = ei_out_tensor_make(out, EI_F32, 1, s->H, s->d);
            unsigned field = fz_u8(f) % 3;
            if (!s->keep_ok) { wfree(out); return; }
            /* a larger capacity the library accepts puts head h's row at h x capacity, past the harness's index:
               compared as the int32 the field will hold (an edge below INT32_MIN wraps to a large capacity) */
            if (field == 2 && (int32_t)e > k.capacity && k.heads_out > 1) { wfree(out); return; }
            if (field == 0) k.n_tokens = e;
            else if (field == 1) k.n_kept = (int32_t)e;
            else k.capacity = (int32_t)e;
            q.n_tokens = 1;
            if (fz_sizes(ctx, s->n, s->H, s->KV, s->d, 0, 1, &sz) == EI_OK) {
                ws = walloc_mem(wb = sz.decode);
                x = ex(1, ws, wb);
                r = checked(ei_attention_decode(ctx, &x, &q, &s->k.t, &s->v.t, &k, &o, s->n - 1));
                if (field == 0 && past) ORACLE(r != EI_OK, "a keep set of a count past the limits was accepted", e, 0);
            }
            wfree(out);
            break;
        }
        case 5: case 6: { /* row map strides (scoring), a keep set's capacities (keep) */
            /* a stride the library accepts says kv head h's map is at row_pos + h x stride: the harness's one
               map of n rows holds only kv head 0's, so such a stride is given only to a layer of one kv head */
            int stride_refused = e < 0 || (e > 0 && e < s->n) || e > ((int64_t)1 << 40);
            unsigned field = which % 9 == 6 ? fz_u8(f) % 3 : 0;
            int32_t *map;
            float *scores;
            int64_t j;
            if (field == 0 && !stride_refused && s->KV > 1) return;
            /* the same for a capacity the library accepts: head h's mask or pooled row lies at h x capacity, the
               harness's arrays hold one row, so such a capacity is given only to a keep set of one head */
            if (field > 0 && !past && e >= s->n && (ei_context_config(ctx)->per_kv_head ? s->KV : s->H) > 1) return;
            map = (int32_t *)walloc_arr(sizeof(int32_t) * (size_t)s->n);
            scores = (float *)walloc_arr(sizeof(float) * (size_t)s->H * (size_t)s->n);
            for (j = 0; j < s->n; ++j) map[j] = (int32_t)j;
            if (fz_sizes(ctx, s->n, s->H, s->KV, s->d, 0, 1, &sz) == EI_OK && (wb = sz.decode_keep) <= ((size_t)8 << 20)) {
                ws = walloc_mem(wb);
                x = ex(1, ws, wb);
                if (which % 9 == 5) {
                    r = checked(ei_decode_score(ctx, &x, s->dec_ok ? &s->dec : NULL, &s->k.t, map, e, scores));
                    if (stride_refused) ORACLE(r != EI_OK, "a row map stride past its limits was accepted", e, 0);
                } else {
                    ei_keep_set k;
                    int32_t heads_out = ei_context_config(ctx)->per_kv_head ? s->KV : s->H;
                    memset(&k, 0, sizeof k);
                    k.heads_out = heads_out;
                    k.capacity = (int32_t)s->n;
                    k.index = (int32_t *)walloc_arr(sizeof(int32_t) * (size_t)heads_out * (size_t)s->n);
                    if (field == 0) { k.row_pos = map; k.row_pos_stride = e; }
                    else if (field == 1) { k.mask = (uint8_t *)(void *)scores; k.mask_capacity = e; }
                    else { k.pooled = scores; k.pooled_capacity = e; }
                    r = checked(ei_decode_keep(ctx, &x, s->dec_ok ? &s->dec : NULL, &s->k.t, &k));
                    if ((past && field > 0) || (field == 0 && stride_refused))
                        ORACLE(r != EI_OK, "a keep capacity or map stride past the limits was accepted", e, field);
                    wfree(k.index);
                }
            }
            wfree(map); wfree(scores);
            break;
        }
        case 7: { /* a decoder's counters: due, observe */
            ei_decoder d = s->dec;
            unsigned field = fz_u8(f) % 3;
            ei_tensor q = s->q.t;
            if (!s->dec_ok) return;
            if (field == 0) d.n_observed = e;
            else if (field == 1) d.n_generated = e;
            else d.last_compress = e;
            (void)ei_decode_due(ctx, &d);
            q.n_tokens = 1;
            r = checked(ei_decode_observe(ctx, &d, &q, d.position_end, 1));
            if (field == 2 ? e < -1 || e > EI_MAX_TOKENS : past) /* (last_compress -1: none yet) */
                ORACLE(r != EI_OK, "a decoder with counters past the limits was accepted", e, field);
            break;
        }
        default: { /* a plan's count: attention, finalize, reset, is_sparse, free */
            ei_plan p = s->plan;
            if (!s->plan_ok) return;
            p.n_tokens = e;
            (void)ei_plan_segment_is_sparse(ctx, &p, (int32_t)(fz_u8(f) % 4));
            r = checked(ei_plan_finalize(ctx, &p));
            if (past) ORACLE(r != EI_OK, "a plan with n_tokens past the limits was accepted", e, 0);
            r = checked(ei_plan_reset(&p));
            if (past) ORACLE(r != EI_OK, "ei_plan_reset of a plan with n_tokens past the limits", e, 0);
            break;
        }
    }
    wfree(ws);
}


/* ------------------------------------------------------------ growing plans, plans as masks (issue 31) */
/* The rows of a plan's planned segments (entropy, budget, both counts, the
   kept blocks), the head classes and the counts, to compare across
   ei_plan_grow (which moves them into a new layout). */
typedef struct plan_rows { float *f; int32_t *i; uint8_t *hc; int64_t cnt[4]; int32_t kv, segs, mk; } plan_rows;
static void plan_rows_take(const ei_plan *p, plan_rows *o) {
    int32_t h, sg, k;
    size_t nr;
    memset(o, 0, sizeof *o);
    o->kv = p->n_kv_heads; o->segs = EI__MIN(p->n_segments, p->seg_capacity); o->mk = p->max_keep;
    o->cnt[0] = p->n_tokens; o->cnt[1] = p->n_segments; o->cnt[2] = p->n_blocks; o->cnt[3] = p->final;
    nr = (size_t)EI__MAX(o->kv, 0) * (size_t)EI__MAX(o->segs, 0);
    o->f = (float *)xalloc(sizeof(float) * 2 * (nr ? nr : 1));
    o->i = (int32_t *)xalloc(sizeof(int32_t) * (nr ? nr : 1) * (size_t)(2 + EI__MAX(o->mk, 0)));
    o->hc = (uint8_t *)xalloc((size_t)EI__MAX(o->kv, 1));
    for (h = 0; h < o->kv; ++h) {
        o->hc[h] = p->head_class[h];
        for (sg = 0; sg < o->segs; ++sg) {
            size_t row = EI_PLAN_ROW(p, h, sg), at = (size_t)h * (size_t)o->segs + (size_t)sg;
            int32_t *ri = o->i + at * (size_t)(2 + o->mk);
            o->f[2 * at] = p->entropy[row]; o->f[2 * at + 1] = p->budget[row];
            ri[0] = p->keep_blocks[row]; ri[1] = p->keep_count[row];
            for (k = 0; k < o->mk; ++k) ri[2 + k] = EI_PLAN_BLOCKS(p, h, sg)[k];
        }
    }
}
static int plan_rows_same(const ei_plan *p, const plan_rows *o) {
    int32_t h, sg, k;
    if (p->n_tokens != o->cnt[0] || p->n_segments != o->cnt[1] || p->n_blocks != o->cnt[2] || p->final != o->cnt[3] ||
        p->n_kv_heads != o->kv || p->max_keep < o->mk)
        return 0;
    for (h = 0; h < o->kv; ++h) {
        if (p->head_class[h] != o->hc[h]) return 0;
        for (sg = 0; sg < o->segs; ++sg) {
            size_t row = EI_PLAN_ROW(p, h, sg), at = (size_t)h * (size_t)o->segs + (size_t)sg;
            const int32_t *ri = o->i + at * (size_t)(2 + o->mk);
            if (memcmp(&p->entropy[row], &o->f[2 * at], 4) || memcmp(&p->budget[row], &o->f[2 * at + 1], 4) ||
                p->keep_blocks[row] != ri[0] || p->keep_count[row] != ri[1])
                return 0;
            for (k = 0; k < o->mk; ++k)
                if (EI_PLAN_BLOCKS(p, h, sg)[k] != ri[2 + k]) return 0;
        }
    }
    return 1;
}
static void plan_rows_free(plan_rows *o) { free(o->f); free(o->i); free(o->hc); }

/* ei_plan_grow of the state's plan (its context's or the other one, or
   NULL) to a max_tokens past its own, at or below it, or at the limits and
   past them. A refusal leaves the plan as it was (a plan in caller memory
   is refused); at or below max_tokens: EI_OK, nothing done; a grown plan
   holds at least max_tokens, its rows, counts and chunked state kept. */
static void op_plan_grow(state *s, fz *f) {
    static const int64_t past[] = {0, -1, EI_MAX_TOKENS + 1, INT64_MAX, INT64_MIN, ((int64_t)1 << 40)};
    unsigned m = fz_u8(f), t = fz_u8(f);
    ei_context *ctx = (m & 1) ? s->alt : s->ctx;
    ei_plan *p = (m & 2) ? NULL : &s->plan, before;
    int64_t target, mt = s->plan.max_tokens;
    plan_rows rows;
    ei_result r;
    switch (t % 4) {
        case 0: target = mt + 1 + (int64_t)((t >> 2) % 64); break; /* a chunk or two more */
        case 1: target = mt - (int64_t)((t >> 2) % 4); break;      /* at or below: nothing to do */
        case 2: target = FZ_PICK(f, past); break;
        default: target = 2 * mt + (int64_t)(t >> 2); break;
    }
    if ((t % 4 == 0 || t % 4 == 3) && target > 8192) target = mt + 1; /* a fast input: plans of at most ~8k tokens */
    work_spend((double)(target > 0 && target <= 8192 ? target : 1) * (double)EI__MAX(s->plan.n_kv_heads, 1) * 8.0);
    memcpy(&before, &s->plan, sizeof before);
    plan_rows_take(&s->plan, &rows);
    r = checked(ei_plan_grow(ctx, p, target));
    if (!p) ORACLE(r != EI_OK, "ei_plan_grow of a NULL plan accepted", 0, 0);
    else if (r != EI_OK) ORACLE(!memcmp(&before, p, sizeof before), "a refused ei_plan_grow changed the plan", r, target);
    else if (target <= before.max_tokens)
        ORACLE(!memcmp(&before, p, sizeof before), "ei_plan_grow to at most max_tokens changed the plan", target, before.max_tokens);
    else {
        ORACLE(s->plan_owned, "ei_plan_grow moved a plan of caller memory", target, 0);
        ORACLE(target <= EI_MAX_TOKENS, "ei_plan_grow past EI_MAX_TOKENS accepted", target, 0);
        ORACLE(p->max_tokens >= target, "a grown plan holds fewer tokens than asked", p->max_tokens, target);
        ORACLE(plan_rows_same(p, &rows), "a grown plan lost its rows or counts", target, before.max_tokens);
        if (s->plan_trusted) plan_check(s, s->plan_ctx);
    }
    plan_rows_free(&rows);
}

/* ei_plan_mask: the state's plan (or NULL: dense) as a mask of 1, kv or
   query heads (or a count it refuses), f32/f16/bf16 (or an unknown dtype),
   rows at the plan's end, inside it, past it, at hostile offsets, keys to
   the rows' end and past it, contiguous, head-major, padded or aliasing
   layouts, with no base, a base of 1 or out's heads, or a base over out.
   Oracles: a refusal of every bad argument, and where the call succeeds
   every element: -inf where the plan hides key j from the row's query
   (keys after it, blocks a sparse segment does not keep), else base's
   value (0 without a base). */
static FZ_FAST int mask_visible(const ei_context *ctx, const ei_plan *plan, int32_t heads, int32_t h, int64_t t, int64_t j) {
    const ei_config *c = ei_context_config(ctx);
    int32_t sg, kv0, kv1, kvh, i;
    if (j > t) return 0;
    sg = (int32_t)(t / c->segment_size);
    if (!plan || !ei_plan_segment_is_sparse(ctx, plan, sg) || j >= (int64_t)sg * c->segment_size) return 1;
    kv0 = heads == 1 ? 0 : h / (heads / plan->n_kv_heads);
    kv1 = heads == 1 ? plan->n_kv_heads : kv0 + 1;
    for (kvh = kv0; kvh < kv1; ++kvh) {
        const int32_t *b = EI_PLAN_BLOCKS(plan, kvh, sg);
        int32_t cnt = plan->keep_count[EI_PLAN_ROW(plan, kvh, sg)];
        for (i = 0; i < cnt; ++i)
            if ((int64_t)b[i] == j / c->block_size) return 1;
    }
    return 0;
}
static void op_plan_mask(state *s, fz *f) {
    static const float bvals[] = {0.0f, -INFINITY, -1.5f, 2.0f};
    static const int32_t bad_heads[] = {0, -1, 3, EI_MAX_HEADS + 1, 5};
    static const int64_t bad_off[] = {-1, EI_MAX_TOKENS, INT64_MAX, INT64_MIN};
    static const ei_dtype mdt[] = {EI_F32, EI_F16, EI_BF16, (ei_dtype)3};
    unsigned m = fz_u8(f), m2 = fz_u8(f), m3 = fz_u8(f);
    ei_context *ctx = s->ctx;
    const ei_plan *plan = (m & 1) ? &s->plan : NULL;
    int32_t kv = plan ? plan->n_kv_heads : EI__MAX(s->KV, 1), heads, h;
    int64_t covered = plan ? plan->n_tokens : EI__MAX(s->n, (int64_t)1), rows, keys, q_off, i, j, ext = 0;
    int lay = (int)((m2 >> 4) & 3u), bsel = (int)((m >> 6) & 3u), sane, ok_args;
    ei_mask out, base, *bp = NULL;
    size_t es;
    ei_result r;
    switch ((m >> 1) & 3u) {
        case 0: heads = kv; break;
        case 1: heads = kv * (int32_t)(1 + m2 % 3); break;
        case 2: heads = 1; break;
        default: heads = bad_heads[m2 % 5]; break;
    }
    memset(&out, 0, sizeof out);
    out.dtype = mdt[(m >> 3) & 3u];
    rows = 1 + (int64_t)(m3 % 16);
    switch ((m3 >> 4) & 3u) {
        case 0: rows = EI__MIN(rows, covered); q_off = covered - rows; break;  /* the plan's last rows */
        case 1: q_off = (int64_t)(m2 % (unsigned)(covered > 0 ? covered : 1)); break; /* inside, maybe past its end */
        case 2: q_off = 0; break;
        default: q_off = bad_off[m2 % 4]; break;
    }
    keys = q_off >= 0 && q_off <= EI_MAX_TOKENS ? q_off + rows + ((m & 32) ? (int64_t)(m2 % 8) : 0) : rows;
    if ((m3 >> 6) == 3) keys = (m2 & 1) ? 0 : -1;
    out.n_heads = heads; out.n_rows = rows; out.n_keys = keys;
    /* (rows 0: an empty plan's last rows; refused, and no extent to allocate) */
    sane = rows >= 1 && heads >= 1 && heads <= 64 && keys >= 1 && keys <= 4096 && (int)out.dtype >= 0 && (int)out.dtype <= 2;
    switch (lay) {
        case 0: out.head_stride = keys; out.row_stride = (int64_t)heads * keys; break;
        case 1: out.row_stride = keys; out.head_stride = rows * keys; break;
        case 2: out.head_stride = keys + 3; out.row_stride = (int64_t)heads * (keys + 3) + 5; break;
        default: /* heads that alias (two or more heads), or a stride that is not positive: refused */
            out.row_stride = (m2 & 2) ? -1 : (int64_t)heads * keys;
            out.head_stride = heads > 1 && (m2 & 4) ? keys - 1 : (m2 & 1) ? 0 : -keys;
            sane = 0;
            break;
    }
    es = sane ? dtype_size(out.dtype) : 4;
    if (sane) ext = (rows - 1) * out.row_stride + (int64_t)(heads - 1) * out.head_stride + keys;
    out.data = walloc_arr((size_t)(sane ? ext : 4) * es); /* (element-aligned: misaligned views are the placement op's) */
    if (sane) memset(out.data, 0xff, (size_t)ext * es); /* NaN: an element left unwritten shows */
    if (bsel && sane) {
        base = out;
        if (bsel == 1) { base.n_heads = 1; base.head_stride = keys; base.row_stride = keys; }
        if (bsel == 3) bp = &base; /* over out: refused */
        else {
            int64_t bext = (rows - 1) * base.row_stride + (int64_t)(base.n_heads - 1) * base.head_stride + keys;
            base.dtype = mdt[m3 % 3];
            base.data = walloc_arr((size_t)bext * dtype_size(base.dtype));
            for (i = 0; i < bext; ++i) store_el(base.data, base.dtype, (size_t)i, bvals[rng_next() % 4u]);
            bp = &base;
        }
    }
    ok_args = sane && q_off >= 0 && q_off <= EI_MAX_TOKENS - rows && bsel != 3 &&
              (!plan || ((heads == 1 || heads % plan->n_kv_heads == 0) && plan->n_tokens >= q_off + rows));
    work_spend((double)(sane ? ext : 1) * 2.0);
    ORACLE(checked(ei_plan_mask(NULL, plan, q_off, bp, &out)) == EI_ERR_NULL, "ei_plan_mask without a context", 0, 0);
    ORACLE(checked(ei_plan_mask(ctx, plan, q_off, bp, NULL)) == EI_ERR_NULL, "ei_plan_mask without out", 0, 0);
    r = checked(ei_plan_mask(ctx, plan, q_off, bp, &out));
    if (!ok_args) ORACLE(r != EI_OK, "ei_plan_mask accepted bad arguments", heads, q_off);
    if (r == EI_OK && (!plan || (s->plan_trusted && s->plan_ctx == ctx))) {
        for (h = 0; h < heads; ++h)
            for (i = 0; i < rows; ++i)
                for (j = 0; j < keys; ++j) {
                    size_t at = (size_t)(i * out.row_stride + (int64_t)h * out.head_stride + j);
                    float want = -INFINITY;
                    unsigned char wb[4], gb[4];
                    if (mask_visible(ctx, plan, heads, h, q_off + i, j))
                        want = !bp ? 0.0f
                                   : load_el(bp->data, bp->dtype,
                                             (size_t)(i * bp->row_stride + (int64_t)(bp->n_heads == 1 ? 0 : h) * bp->head_stride + j));
                    store_el(wb, out.dtype, 0, want);
                    memcpy(gb, (unsigned char *)out.data + at * es, es);
                    if (memcmp(wb, gb, es)) {
                        fprintf(stderr, "plan mask: head %d row %lld key %lld: %g, expected %g\n", (int)h, (long long)(q_off + i),
                                (long long)j, (double)load_el(out.data, out.dtype, at), (double)want);
                        fz_fail("ei_plan_mask differs from the plan's rule", (long)(q_off + i), (long)j);
                    }
                }
    }
    if (bp && bp != &base) bp = NULL;
    if (bsel && sane && bsel != 3) wfree(base.data);
    wfree(out.data);
}

/* ------------------------------------------------------------ cache order check */
/* ei_check_key_positions over an orderly map, one with a broken cell, and a
   map at a misaligned address (EI_ERR_ALIGN). */
static void op_cell_pos(state *s, fz *f) {
    unsigned m = fz_u8(f);
    int64_t n = (int64_t)(fz_u8(f) % 80u) + ((m & 64) ? -2 : 1), j, bad = -1;
    unsigned char *raw;
    int32_t *map;
    size_t off = (m & 3) ? 4u * (m & 3u) : 0u;
    ei_result r;
    if (FAMILY(FAM_ALIGN) && (m & 4)) off += 1u + (m >> 3) % 3u; /* not a multiple of 4 */
    raw = (unsigned char *)xalloc((size_t)(n > 0 ? n : 1) * 4u + off);
    map = (int32_t *)(void *)(raw + off);
    for (j = 0; j < n; ++j) {
        int32_t x = (int32_t)j;
        memcpy((unsigned char *)map + 4 * j, &x, 4);
    }
    if ((m & 16) && n > 0) {
        int32_t x = (int32_t)fz_u32(f);
        bad = (int64_t)(fz_u8(f) % (unsigned)n);
        memcpy((unsigned char *)map + 4 * bad, &x, 4);
        if (x == (int32_t)bad) bad = -1;
    }
    r = checked(ei_check_key_positions((m & 32) ? NULL : s->ctx, (m & 128) ? NULL : map, n));
    if (r == EI_OK) {
        ORACLE(n >= 0 && (n == 0 || !(m & 128)), "ei_check_key_positions accepted bad arguments", m, n);
        ORACLE(n == 0 || bad < 0, "ei_check_key_positions accepted a broken map", bad, n);
        ORACLE(n == 0 || (m & 128) || off % 4u == 0, "ei_check_key_positions accepted a misaligned map", off, 0);
    }
    if (!(m & 128) && n > 0 && off % 4u == 0) /* the context is optional (messages only) */
        ORACLE((r == EI_OK) == (bad < 0), "ei_check_key_positions: result disagrees with the map", r, bad);
    free(raw);
}

/* ------------------------------------------------------------ edited plans and decoders */
/* The plan's counts fit its layout (the header's rule for the fields calls
   change: n_tokens within max_tokens, n_segments and n_blocks derived from
   it, final 0 or 1). */
static int plan_counts_fit(const ei_plan *p) {
    int64_t segs;
    if (p->segment_size <= 0 || p->block_size <= 0 || p->n_tokens < 0 || p->n_tokens > p->max_tokens) return 0;
    segs = p->n_tokens > 0 ? (p->n_tokens - 1) / p->segment_size + 1 : 0;
    return p->n_segments == segs && p->n_segments <= p->seg_capacity &&
           p->n_blocks >= 0 && p->n_blocks <= p->blk_capacity &&
           p->n_blocks == (segs > 0 ? (segs - 1) * (p->segment_size / p->block_size) : 0) && (p->final == 0 || p->final == 1);
}
/* One field of the plan (or the decoder) set to an arbitrary value, then the
   plan (decoder) used: a changed layout field (sizes, capacities, flags,
   array pointers) and counts that do not fit the layout are refused before
   any array is read (ASan: the plan memory is exact). The fields are put back
   afterwards (what the call wrote stays). */
static void op_plan_edit(state *s, fz *f) {
    static const int64_t vals[] = {0, 1, -1, 2, 3, 7, 16, 17, 64, 4096, INT32_MAX, INT32_MIN, (int64_t)1 << 26,
                                   ((int64_t)1 << 26) + 1, INT64_MAX, INT64_MIN, 65535, 255};
    unsigned which = fz_u8(f) % 28, use = fz_u8(f), vm = fz_u8(f);
    int64_t delta = (int64_t)(vm >> 1) - 64, v;
    int layout_changed = 0;
    ei_result r = EI_OK;
    if (which < 20) { /* the plan */
        ei_plan saved, *p = &s->plan;
        size_t ws_need = 0, wb;
        void *ws = NULL;
        if (!s->plan_ok) return;
        memcpy(&saved, p, sizeof saved);
#define EDIT_INT(field, type) do { v = (vm & 1) ? FZ_PICK(f, vals) : (int64_t)p->field + delta; p->field = (type)v; \
                                   layout_changed = p->field != saved.field; } while (0)
#define EDIT_PTR(field, type) do { uintptr_t b_ = (uintptr_t)p->field; \
                                   p->field = (type)(void *)((vm & 1) ? (fz_u8(f) & 1 ? 0 : (uintptr_t)p->entropy) : b_ + (uintptr_t)(delta * 4)); \
                                   layout_changed = p->field != saved.field; } while (0)
        switch (which) {
            case 0: EDIT_INT(max_tokens, int64_t); break;
            case 1: EDIT_INT(n_kv_heads, int32_t); break;
            case 2: EDIT_INT(head_dim, int32_t); break;
            case 3: EDIT_INT(max_keep, int32_t); break;
            case 4: EDIT_INT(seg_capacity, int32_t); break;
            case 5: EDIT_INT(blk_capacity, int32_t); break;
            case 6: EDIT_INT(flags, uint32_t); break;
            case 7: EDIT_INT(segment_size, int32_t); break;
            case 8: EDIT_INT(block_size, int32_t); break;
            case 9: EDIT_INT(on_device, int32_t); break;
            case 10: EDIT_PTR(entropy, float *); break;
            case 11: EDIT_PTR(head_class, uint8_t *); break;
            case 12: EDIT_PTR(budget, float *); break;
            case 13: EDIT_PTR(keep_blocks, int32_t *); break;
            case 14: EDIT_PTR(keep_count, int32_t *); break;
            case 15: EDIT_PTR(block_index, int32_t *); break;
            case 16: EDIT_PTR(scores, float *); break;
            case 17: EDIT_PTR(state, void *); break;
            /* counts: edited ones that still fit the layout may be accepted */
            case 18: EDIT_INT(n_tokens, int64_t); layout_changed = 0; break;
            default:
                if (vm & 2) { EDIT_INT(n_segments, int32_t); } else if (vm & 4) { EDIT_INT(n_blocks, int32_t); } else { EDIT_INT(final, int32_t); }
                layout_changed = 0;
                break;
        }
#undef EDIT_INT
#undef EDIT_PTR
        if (verbose > 0)
            fprintf(stderr, "  plan field %u edited (layout changed %d, counts fit %d; tokens %lld/%lld, segments %d/%d, blocks %d/%d)\n", which,
                    layout_changed, plan_counts_fit(p), (long long)p->n_tokens, (long long)p->max_tokens, (int)p->n_segments,
                    (int)p->seg_capacity, (int)p->n_blocks, (int)p->blk_capacity);
        ei_sizes sz;
        ei_exec x;
        if (fz_sizes(s->ctx, saved.max_tokens, s->H, s->KV, s->d, 0, 2, &sz) != EI_OK || sz.profile > ((size_t)16 << 20))
            ws_need = 64;
        else ws_need = sz.profile / 2;
        wb = ws_need;
        x = ex(1, NULL, 0);
        switch (use % 8) {
            case 0: ws = walloc_mem(wb); x = ex(1, ws, wb); r = checked(ei_profile(s->ctx, &x, &s->q.t, &s->k.t, p)); break;
            case 1: ws = walloc_mem(wb); x = ex(1, ws, wb); r = checked(ei_profile_chunk(s->ctx, &x, &s->q.t, &s->k.t, p, 0, 1)); break;
            case 2: { /* in 2 parts (one of them may hold no kv head: it does nothing): the first failure */
                int j;
                ws = walloc_mem(2 * wb);
                for (j = 0; j < 2 && r == EI_OK; ++j) {
                    x = ex_part(j, 2, ws, 2 * wb);
                    r = checked(ei_profile(s->ctx, &x, &s->q.t, &s->k.t, p));
                }
                break;
            }
            case 3: {
                view ov;
                ei_out_tensor out;
                size_t per = 64;
                if (!layer_usable(s)) { r = checked(ei_plan_finalize(s->ctx, p)); break; }
                view_make(&ov, f, EI_F32, s->n, s->H, s->d, 0);
                memcpy(&out, &ov.t, sizeof out);
                out.data = ov.buf;
                if (fz_sizes(s->ctx, s->n, s->H, s->KV, s->d, 0, 1, &sz) == EI_OK && sz.prefill <= ((size_t)8 << 20)) per = sz.prefill;
                ws = walloc_mem(per);
                x = ex(1, ws, per);
                work_spend((double)s->n * (double)s->n * (double)s->H * (double)s->d);
                r = checked(ei_attention_prefill(s->ctx, &x, &s->q.t, &s->k.t, &s->v.t, p, &out, 0));
                view_free(&ov);
                break;
            }
            case 4: r = checked(ei_plan_finalize(s->ctx, p)); break;
            case 5: r = checked(ei_plan_reset(p)); break;
            case 6: {
                ei_plan dst;
                memset(&dst, 0, sizeof dst);
                (void)ei_plan_segment_is_sparse(s->ctx, p, (int32_t)(use >> 3));
                r = checked(ei_plan_copy(s->ctx, &dst, p, EI_COPY_HOST_TO_DEVICE));
                ORACLE(r != EI_OK, "ei_plan_copy succeeded on a CPU context", r, 0);
                r = EI_ERR_STATE; /* not a plan check */
                break;
            }
            default: {
                int nt = fz_threads1(fz_u8(f), 2);
                ws = walloc_mem(wb * (size_t)nt);
                x = ex(nt, ws, wb * (size_t)nt);
                r = checked(ei_profile(s->ctx, &x, &s->q.t, &s->k.t, p));
                break;
            }
        }
        work_spend(layer_cost(s, 8.0));
        if (layout_changed || !plan_counts_fit(p))
            ORACLE(r != EI_OK, "a plan with an edited layout field or counts outside its layout was accepted", which, use % 8);
        wfree(ws);
        memcpy(p, &saved, sizeof saved);
        s->plan_trusted = 0;
    } else { /* the decoder */
        ei_decoder saved, *d = &s->dec;
        if (!s->dec_ok) return;
        memcpy(&saved, d, sizeof saved);
        switch (which) {
            case 20: v = (vm & 1) ? FZ_PICK(f, vals) : d->n_heads + delta; d->n_heads = (int32_t)v; layout_changed = d->n_heads != saved.n_heads; break;
            case 21: v = (vm & 1) ? FZ_PICK(f, vals) : d->n_kv_heads + delta; d->n_kv_heads = (int32_t)v; layout_changed = d->n_kv_heads != saved.n_kv_heads; break;
            case 22: v = (vm & 1) ? FZ_PICK(f, vals) : d->head_dim + delta; d->head_dim = (int32_t)v; layout_changed = d->head_dim != saved.head_dim; break;
            case 23: v = (vm & 1) ? FZ_PICK(f, vals) : d->window + delta; d->window = (int32_t)v; layout_changed = d->window != saved.window; break;
            case 24:
                d->queries = (float *)(void *)((vm & 1) ? 0 : (uintptr_t)d->queries + (uintptr_t)(delta * 4));
                layout_changed = d->queries != saved.queries;
                break;
            case 25:
                if (vm & 2) d->position_end = (vm & 1) ? FZ_PICK(f, vals) : d->position_end + delta;
                else d->n_observed = (vm & 1) ? FZ_PICK(f, vals) : d->n_observed + delta;
                break;
            case 26: d->n_generated = (vm & 1) ? FZ_PICK(f, vals) : d->n_generated + delta; break;
            default: d->last_compress = (vm & 1) ? FZ_PICK(f, vals) : d->last_compress + delta; break;
        }
        {
            int counts_fit = d->n_observed >= 0 && d->n_observed <= EI_MAX_TOKENS && d->n_generated >= 0 &&
                             d->position_end >= d->n_observed && d->position_end <= EI_MAX_TOKENS &&
                             d->n_generated <= d->n_observed && d->last_compress >= -1 &&
                             d->last_compress <= d->n_generated;
            if (verbose > 0) fprintf(stderr, "  decoder field %u edited (layout changed %d, counts fit %d)\n", which, layout_changed, counts_fit);
            switch (use % 4) {
                case 0: r = checked(ei_decoder_reset(d)); counts_fit = 1; break; /* reset sets the counters */
                case 1: {
                    view qc;
                    if (!s->q.valid || s->n <= 0) { r = checked(ei_decode_observe(s->ctx, d, &s->q.t, d->position_end, 1)); break; }
                    view_rows(&qc, &s->q, s->n - 1, 1, f);
                    r = checked(ei_decode_observe(s->ctx, d, &qc.t, d->position_end, 1));
                    view_free(&qc);
                    break;
                }
                case 2: (void)ei_decode_due(s->ctx, d); r = EI_ERR_STATE; counts_fit = 1; layout_changed = 0; break;
                default: {
                    size_t wb = 0;
                    void *ws;
                    ei_keep_set ks;
                    int64_t n = s->n > 0 ? s->n : 1;
                    ei_exec x;
                    ei_sizes sz;
                    if (!s->k.valid) { x = ex(1, NULL, 0); r = checked(ei_decode_keep(s->ctx, &x, d, &s->k.t, &s->keep)); break; }
                    memset(&ks, 0, sizeof ks);
                    ks.heads_out = ei_context_config(s->ctx)->per_kv_head ? s->KV : s->H;
                    ks.capacity = (int32_t)EI__MIN(n, (int64_t)ei_context_config(s->ctx)->decode_budget);
                    if (ks.heads_out <= 0 || ks.capacity <= 0) { r = EI_ERR_STATE; counts_fit = 1; layout_changed = 0; break; }
                    ks.index = (int32_t *)walloc_arr(4u * (size_t)ks.heads_out * (size_t)ks.capacity);
                    if (fz_sizes(s->ctx, n, saved.n_heads, saved.n_kv_heads, saved.head_dim, 0, 1, &sz) != EI_OK ||
                        (wb = sz.decode_keep) > ((size_t)8 << 20))
                        wb = 64;
                    ws = walloc_mem(wb);
                    x = ex(1, ws, wb);
                    work_spend((double)n * (double)saved.n_heads * (double)saved.head_dim * (double)EI__MAX(saved.window, 1));
                    r = checked(ei_decode_keep(s->ctx, &x, d, &s->k.t, &ks));
                    wfree(ws);
                    wfree(ks.index);
                    break;
                }
            }
            if (layout_changed || !counts_fit)
                ORACLE(r != EI_OK, "a decoder with an edited field or counters out of range was accepted", which, use % 4);
        }
        memcpy(d, &saved, sizeof saved);
    }
}

/* ------------------------------------------------------------ placement */
/* One call with every buffer it uses placed in one arena: each at a
   fuzzer-chosen address (mod 64), optionally one (the guest) over another
   (the host) at a fuzzer-chosen offset. The bytes between buffers are
   poisoned (ASan). The same call with every buffer apart and 64-byte aligned
   (views keep their address mod 64) is the reference. */
enum { R_Q, R_K, R_V, R_OUT, R_PLAN, R_PSTRUCT, R_WS, R_DEC, R_DSTRUCT, R_KSTRUCT, R_INDEX, R_POS, R_MASK, R_POOLED,
       R_ROWPOS, R_SCORES, R_SHARED, R_COUNT };
static const char *const role_names[R_COUNT] = {"q", "k", "v", "out", "plan memory", "ei_plan", "workspace",
                                                "decoder memory", "ei_decoder", "ei_keep_set", "keep->index",
                                                "keep->positions", "keep->mask", "keep->pooled", "row_pos", "scores",
                                                "shared"};
enum { PK_VIEW, PK_ARR, PK_BYTES, PK_MEM, PK_STRUCT };
static const unsigned char role_kind[R_COUNT] = {PK_VIEW, PK_VIEW, PK_VIEW, PK_VIEW, PK_MEM, PK_STRUCT, PK_MEM, PK_MEM,
                                                 PK_STRUCT, PK_STRUCT, PK_ARR, PK_ARR, PK_BYTES, PK_ARR, PK_ARR, PK_ARR,
                                                 PK_ARR};
/* Roles whose contents the harness prepares with library calls (or builds):
   an overlap that involves one leaves no reference to compare with. */
static int role_prepared(int r) { return r == R_PLAN || r == R_PSTRUCT || r == R_DEC || r == R_DSTRUCT || r == R_KSTRUCT; }

/* (issue 36) PL_STEP: a decode step through a keep set (ei_attention_decode
   with a keep set and its merge: on threads, or in parts with one workspace
   that holds the partials); PL_PLAN_RESET, PL_DEC_RESET: a plan (reset or
   finalize) or decoder (reset) made apart by init, its struct then copied
   where the fuzzer put it, its own arrays included. PL_PROFILE and
   PL_SCORE run in parts too (one workspace, part ith's share at ith x its
   nth of the bytes; a part checks against every part's share, so the whole
   workspace counts as written). */
enum { PL_PROFILE, PL_CHUNK, PL_ATTN, PL_DEC_INIT, PL_OBSERVE, PL_KEEP, PL_SCORE, PL_SELECT, PL_SHARED_ADD,
       PL_SELECT_SHARED, PL_COMPACT, PL_PLAN_INIT, PL_STEP, PL_PLAN_RESET, PL_DEC_RESET, PL_COUNT };
static const char *const kind_names[PL_COUNT] = {"profile", "profile_chunk", "attention", "decoder_init", "observe",
                                                 "decode_keep", "decode_score", "decode_select", "shared_add",
                                                 "select_shared", "kv_compact", "plan_init", "decode_step",
                                                 "plan_reset", "decoder_reset"};

typedef struct pcall {
    ei_context *ctx;
    const ei_config *c;
    int kind;
    unsigned var;
    int64_t n, cnt, q_off, kn; /* rows / keys; queries; first query's position; rows of the K view */
    int32_t H, KV, d;
    ei_dtype dt, vdt, odt;
    int lay[4];                /* layouts of q, k (or compact's k), v, out */
    uint32_t flags;
    int nt;                    /* a call on nt threads (0: one thread) */
    int ith, nth;              /* decode_score: part ith of nth; profile, decode step: nth >= 2 parts (every one) */
    int use_plan, is_final;
    int64_t c1;                /* chunk: positions planned before the call */
    int32_t heads_out, capacity, n_kept;
    int64_t mask_cap, pooled_cap;
    int64_t keep_n;            /* decode step: the rows its keep set scored */
    size_t partb, per;         /* decode step: partials (in the workspace), and the attention workspace per thread */
    size_t bytes[R_COUNT];     /* 0: not used by the call */
    int inter;                 /* interleaved views: host and guest forced (1) */
    unsigned var2;
    view qs, ks, vs;           /* sources: tame values, contiguous */
    int32_t *rowpos, *index;
    float *scores, *shared;
    /* prepared state, restored into the arena's structs */
    ei_plan plan;
    ei_decoder dec;
} pcall;

typedef struct placement {
    int64_t pos[R_COUNT];
    unsigned char *p[R_COUNT];
    unsigned char *raw, *base;
    size_t alloc;
    int pooled;
} placement;

static void lay_strides(int lay, int64_t n, int32_t h, int32_t d, int64_t *ts, int64_t *hs) {
    switch (lay) {
        case 1: *ts = (int64_t)h * d + 3; *hs = d; break;                  /* padded tokens */
        case 2: *ts = d; *hs = n * (int64_t)d; break;                      /* head-major */
        case 3: *ts = 2 * (int64_t)h * d; *hs = d; break;                  /* every other token row free */
        case 4: *ts = 2 * (int64_t)h * d; *hs = 2 * (int64_t)d; break;     /* every other head row free */
        default: *ts = (int64_t)h * d; *hs = d; break;
    }
}
static ei_tensor pview(int lay, ei_dtype dt, int64_t n, int32_t h, int32_t d, const void *data) {
    ei_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data; t.dtype = dt; t.n_tokens = n; t.n_heads = h; t.head_dim = d;
    lay_strides(lay, n, h, d, &t.token_stride, &t.head_stride);
    return t;
}
static ei_out_tensor pview_out(int lay, ei_dtype dt, int64_t n, int32_t h, int32_t d, void *data) {
    ei_tensor t = pview(lay, dt, n, h, d, data);
    ei_out_tensor o;
    memcpy(&o, &t, sizeof o);
    o.data = data;
    return o;
}
static size_t tensor_bytes(const ei_tensor *t) {
    return (size_t)((t->n_tokens - 1) * t->token_stride + (int64_t)(t->n_heads - 1) * t->head_stride + t->head_dim) *
           dtype_size(t->dtype);
}
static ei_tensor as_view(const ei_out_tensor *o) {
    ei_tensor t;
    memcpy(&t, o, sizeof t);
    t.data = o->data;
    return t;
}
/* Bytes of a plan's arrays, from entropy to the end of the last one (ei_plan_init's layout). */
static size_t plan_extent(const ei_config *c, int64_t max_tokens, int32_t kv, int32_t d, uint32_t flags) {
    ei__plan_geom g;
    int last = (flags & EI_PLAN_CHUNKED) ? EI__PA_STATE : (flags & EI_PLAN_SCORES) ? EI__PA_SCORES : EI__PA_BLOCK_INDEX;
    if (!ei__plan_geometry(c, max_tokens, kv, d, flags, &g)) return 0;
    return g.offset[last] + g.size[last];
}
static size_t ring_bytes(const pcall *pc) { return (size_t)pc->c->window * (size_t)pc->H * (size_t)pc->d * 4u; }
/* EI_DECODE_H2O: the decoder's sums, laid out by ei_decoder_init after its
   ring (at the next 64-byte boundary), written by the calls that write the
   decoder struct. Sizes from the call's configuration, as ring_bytes (a
   struct's fields may be garbage). */
static size_t acc_bytes(const pcall *pc) {
    return pc->c->decode_policy == EI_DECODE_H2O ? (size_t)pc->H * (size_t)pc->c->decode_positions * 4u : 0u;
}
static const void *acc_ptr(const pcall *pc, const ei_decoder *dec) {
    if (!acc_bytes(pc) || !dec->queries) return NULL; /* (a zeroed struct: refused for its NULL ring) */
    return (const void *)((const unsigned char *)dec->queries + ((ring_bytes(pc) + 63u) & ~(size_t)63u));
}

/* ---- the regions of a call (the rules of issue 15) and the harness's own test */
typedef struct preg {
    const unsigned char *p;
    size_t len;
    int written, role;
    int is_view;
    ei_tensor view;
} preg;
typedef struct pregs { preg r[16]; int n; } pregs;
static void preg_add(pregs *g, int role, const void *p, size_t len, int written) {
    if (!p || !len) return;
    g->r[g->n].p = (const unsigned char *)p; g->r[g->n].len = len; g->r[g->n].written = written; g->r[g->n].role = role;
    g->r[g->n].is_view = 0;
    g->n++;
}
static void preg_view(pregs *g, int role, const ei_tensor *t, int written) {
    preg_add(g, role, t->data, tensor_bytes(t), written);
    g->r[g->n - 1].is_view = 1;
    g->r[g->n - 1].view = *t;
}
/* Whether two views share a byte of their elements (brute force over a bitmap). */
static FZ_FAST int views_share_bytes(const ei_tensor *a, const ei_tensor *b) {
    const unsigned char *a0 = (const unsigned char *)a->data, *b0 = (const unsigned char *)b->data;
    const unsigned char *lo = a0 < b0 ? a0 : b0, *ae = a0 + tensor_bytes(a), *be = b0 + tensor_bytes(b);
    size_t span = (size_t)((ae > be ? ae : be) - lo), esa = dtype_size(a->dtype), esb = dtype_size(b->dtype), x;
    unsigned char *bits = (unsigned char *)calloc(span / 8 + 1, 1);
    int64_t t;
    int32_t h;
    int share = 0;
    if (!bits) abort();
    for (t = 0; t < a->n_tokens; ++t)
        for (h = 0; h < a->n_heads; ++h) {
            size_t o = (size_t)(a0 - lo) + el_index(a, t, h, 0) * esa;
            for (x = o; x < o + (size_t)a->head_dim * esa; ++x) bits[x >> 3] |= (unsigned char)(1u << (x & 7));
        }
    for (t = 0; t < b->n_tokens && !share; ++t)
        for (h = 0; h < b->n_heads && !share; ++h) {
            size_t o = (size_t)(b0 - lo) + el_index(b, t, h, 0) * esb;
            for (x = o; x < o + (size_t)b->head_dim * esb; ++x)
                if (bits[x >> 3] & (1u << (x & 7))) { share = 1; break; }
        }
    free(bits);
    return share;
}
/* 1 if some pair of regions meets where one of the two is written, other
   than two views of one dtype, head_dim and strides with disjoint elements. */
static int regions_conflict(const pregs *g, int *pa, int *pb) {
    int i, j;
    for (i = 0; i < g->n; ++i)
        for (j = i + 1; j < g->n; ++j) {
            const preg *a = &g->r[i], *b = &g->r[j];
            if (!a->written && !b->written) continue;
            if (!(a->p < b->p + b->len && b->p < a->p + a->len)) continue;
            if (a->is_view && b->is_view && a->view.dtype == b->view.dtype && a->view.head_dim == b->view.head_dim &&
                a->view.token_stride == b->view.token_stride && a->view.head_stride == b->view.head_stride &&
                !views_share_bytes(&a->view, &b->view))
                continue;
            *pa = a->role; *pb = b->role;
            return 1;
        }
    return 0;
}

/* ---- the call's parameters */
static int pcall_setup(pcall *pc, state *s, fz *f) {
    const ei_config *c;
    size_t per = 0;
    int i;
    memset(pc, 0, sizeof *pc);
    pc->ctx = s->ctx;
    pc->c = c = ei_context_config(s->ctx);
    pc->kind = (int)(fz_u8(f) % PL_COUNT);
    pc->var = fz_u8(f);
    if (ei_context_config(pc->ctx)->backend != EI_BACKEND_CPU) return 0;
    if (layer_usable(s) && s->H <= 16 && s->d <= 64 && s->q.t.dtype >= EI_F32 && s->q.t.dtype <= EI_BF16 &&
        s->v.t.dtype >= EI_F32 && s->v.t.dtype <= EI_BF16) {
        pc->n = EI__MIN(s->n, 40); pc->H = s->H; pc->KV = s->KV; pc->d = s->d;
        pc->dt = s->q.t.dtype; pc->vdt = s->v.t.dtype;
    } else {
        pc->n = 24; pc->H = 2; pc->KV = 1; pc->d = 8; pc->dt = EI_F32; pc->vdt = EI_BF16;
    }
    while (pc->n > 4 && (double)pc->n * (double)pc->n * (double)pc->H * (double)pc->d * rank_cost(pc->ctx) > FZ_LAYER_WORK / 4)
        pc->n /= 2;
    for (i = 0; i < 4; ++i) pc->lay[i] = (int)(fz_u8(f) % 5);
    pc->odt = (ei_dtype)(fz_u8(f) % 3);
    pc->cnt = pc->n; pc->kn = pc->n;
    pc->heads_out = c->per_kv_head ? pc->KV : pc->H;
    pc->capacity = (int32_t)EI__MIN(pc->n, (int64_t)EI__MAX(c->decode_budget, 1));
    pc->mask_cap = pc->n;
    pc->pooled_cap = pc->n;
    pc->var2 = fz_u8(f);
    pc->inter = FAMILY(FAM_OVERLAP) && (pc->var2 & 12) == 12;
    switch (pc->kind) {
        case PL_PROFILE:
            pc->flags = (pc->var >> 4) & 3u;
            if ((pc->var & 3) == 2) pc->nt = fz_threads1(fz_u8(f), 3);
            if ((pc->var & 3) == 1) pc->nth = 2 + (int)((pc->var >> 2) & 1u); /* in 2 or 3 parts, then finalize */
            if (pc->inter && pc->H == pc->KV) { pc->lay[1] = pc->lay[0] = 3 + (pc->lay[0] & 1); } /* q, k interleaved (both read) */
            else pc->inter = 0;
            break;
        case PL_CHUNK:
            pc->flags = EI_PLAN_CHUNKED | ((pc->var & 16) ? EI_PLAN_SCORES : 0u);
            pc->c1 = (pc->var & 4) ? (int64_t)(fz_u8(f) % (unsigned)pc->n) : 0;
            pc->cnt = 1 + (int64_t)(fz_u8(f) % (unsigned)(pc->n - pc->c1));
            pc->q_off = pc->c1;
            pc->is_final = pc->c1 + pc->cnt == pc->n ? !(pc->var & 8) : 0;
            pc->kn = pc->c1 + pc->cnt + ((pc->var & 64) ? (int64_t)(fz_u8(f) % 4) : 0);
            if (pc->var & 32) pc->nt = fz_threads1(fz_u8(f), 3); /* on threads: every share checked first */
            pc->inter = 0;
            break;
        case PL_ATTN:
            pc->use_plan = pc->var & 1;
            if (pc->var & 2) {
                pc->q_off = (int64_t)(fz_u8(f) % (unsigned)pc->n);
                pc->cnt = 1 + (int64_t)(fz_u8(f) % (unsigned)(pc->n - pc->q_off));
            }
            while (pc->cnt > 1 && attn_cost(pc->cnt, pc->q_off + pc->cnt, pc->H, pc->d) > FZ_ATTN_WORK) {
                pc->q_off += pc->cnt - pc->cnt / 2;
                pc->cnt /= 2;
            }
            pc->kn = pc->q_off + pc->cnt;
            if (pc->var & 4) pc->nt = fz_threads1(fz_u8(f), 3);
            if (pc->inter) { pc->odt = pc->dt; pc->lay[3] = pc->lay[0] = 3 + (pc->lay[0] & 1); } /* out between q's rows */
            break;
        case PL_OBSERVE:
            pc->cnt = 1 + (int64_t)(fz_u8(f) % (unsigned)pc->n);
            pc->inter = 0;
            break;
        case PL_KEEP:
            if (pc->var & 16) pc->nt = fz_threads1(fz_u8(f), 2);
            pc->inter = 0;
            break;
        case PL_SCORE:
            pc->nth = 1 + (int)((pc->var >> 4) % 3);
            pc->ith = (int)((pc->var >> 6) % (unsigned)pc->nth);
            pc->inter = 0;
            break;
        case PL_SELECT_SHARED: pc->heads_out = 1; pc->inter = 0; break;
        case PL_COMPACT:
            pc->heads_out = pc->KV;
            pc->capacity = (int32_t)pc->n;
            pc->n_kept = (int32_t)(fz_u8(f) % (unsigned)(pc->n + 1));
            if (pc->inter) { pc->vdt = pc->dt; pc->lay[2] = pc->lay[1] = 3 + (pc->lay[1] & 1); } /* v between k's rows */
            break;
        case PL_PLAN_INIT: case PL_PLAN_RESET: pc->flags = pc->var & 3u; pc->inter = 0; break;
        case PL_STEP: /* the set made at or before the step's first query (keep->n_tokens <= q_offset + 1) */
            pc->cnt = 1 + (int64_t)(fz_u8(f) % (unsigned)EI__MIN(pc->n, (int64_t)4));
            pc->q_off = pc->n - pc->cnt;
            pc->keep_n = 1 + (int64_t)(fz_u8(f) % (unsigned)(pc->q_off + 1));
            pc->heads_out = (pc->var & 8) ? pc->H : (pc->var & 16) ? 1 : pc->KV;
            pc->capacity = (int32_t)pc->keep_n;
            pc->n_kept = (int32_t)(fz_u8(f) % (unsigned)(pc->keep_n + 1));
            if (pc->var & 4) pc->nt = fz_threads1(fz_u8(f), 3);
            else pc->nth = (int)(pc->var & 3u) % 3 + 1; /* 2, 3: in parts, then the merges */
            pc->inter = 0;
            break;
        default: pc->inter = 0; break;
    }
    /* the buffers each call uses, and their sizes */
#define USE(role, b) (pc->bytes[role] = (b))
    {
        ei_tensor t;
        int64_t n = pc->n;
        int dec = 0, keep = 0;
        ei_shape shape; /* the layer, per thread (the call's count multiplies below) */
        ei_sizes sz;
        memset(&shape, 0, sizeof shape);
        shape.max_tokens = n; shape.n_heads = pc->H; shape.n_kv_heads = pc->KV; shape.head_dim = pc->d; shape.n_threads = 1;
        switch (pc->kind) {
            case PL_PROFILE: case PL_CHUNK: case PL_ATTN:
                t = pview(pc->lay[0], pc->dt, pc->cnt, pc->H, pc->d, NULL); USE(R_Q, tensor_bytes(&t));
                t = pview(pc->lay[1], pc->dt, pc->kn, pc->KV, pc->d, NULL); USE(R_K, tensor_bytes(&t));
                if (pc->kind == PL_ATTN) {
                    t = pview(pc->lay[2], pc->vdt, pc->kn, pc->KV, pc->d, NULL); USE(R_V, tensor_bytes(&t));
                    t = pview(pc->lay[3], pc->odt, pc->cnt, pc->H, pc->d, NULL); USE(R_OUT, tensor_bytes(&t));
                    if (ei_layer_sizes(pc->ctx, &shape, &sz) != EI_OK) return 0;
                    per = sz.prefill;
                } else if (ei_layer_sizes(pc->ctx, &shape, &sz) != EI_OK)
                    return 0;
                else per = sz.profile;
                USE(R_WS, per * (size_t)(pc->nt > 0 ? pc->nt : pc->nth > 1 ? pc->nth : 1));
                if (pc->kind != PL_ATTN || pc->use_plan) {
                    shape.plan_flags = pc->flags;
                    if (ei_layer_sizes(pc->ctx, &shape, &sz) != EI_OK) return 0;
                    USE(R_PLAN, sz.plan); USE(R_PSTRUCT, sizeof(ei_plan));
                }
                break;
            case PL_PLAN_INIT: case PL_PLAN_RESET:
                shape.plan_flags = pc->flags;
                if (ei_layer_sizes(pc->ctx, &shape, &sz) != EI_OK) return 0;
                USE(R_PLAN, sz.plan); USE(R_PSTRUCT, sizeof(ei_plan));
                break;
            case PL_DEC_INIT: case PL_DEC_RESET: dec = 1; break;
            case PL_STEP:
                t = pview(pc->lay[0], pc->dt, pc->cnt, pc->H, pc->d, NULL); USE(R_Q, tensor_bytes(&t));
                t = pview(pc->lay[1], pc->dt, pc->kn, pc->KV, pc->d, NULL); USE(R_K, tensor_bytes(&t));
                t = pview(pc->lay[2], pc->vdt, pc->kn, pc->KV, pc->d, NULL); USE(R_V, tensor_bytes(&t));
                t = pview(pc->lay[3], pc->odt, pc->cnt, pc->H, pc->d, NULL); USE(R_OUT, tensor_bytes(&t));
                USE(R_KSTRUCT, sizeof(ei_keep_set));
                USE(R_INDEX, 4u * (size_t)pc->heads_out * (size_t)EI__MAX(pc->capacity, 1));
                /* the partials of the call's threads or parts live in the workspace (ei_sizes.decode) */
                if (ei_layer_sizes(pc->ctx, &shape, &sz) != EI_OK) return 0;
                pc->per = sz.prefill;
                shape.n_threads = pc->nt > 0 ? pc->nt : pc->nth;
                if (ei_layer_sizes(pc->ctx, &shape, &sz) != EI_OK ||
                    ei__decode_partials_size(pc->ctx, pc->cnt, pc->H, pc->d, pc->nt > 0 ? pc->nt : pc->nth, &pc->partb) != EI_OK)
                    return 0;
                USE(R_WS, sz.decode);
                break;
            case PL_OBSERVE:
                dec = 1;
                t = pview(pc->lay[0], pc->dt, pc->cnt, pc->H, pc->d, NULL); USE(R_Q, tensor_bytes(&t));
                break;
            case PL_KEEP: case PL_SCORE:
                dec = 1; keep = pc->kind == PL_KEEP;
                t = pview(pc->lay[1], pc->dt, n, pc->KV, pc->d, NULL); USE(R_K, tensor_bytes(&t));
                if (pc->kind == PL_SCORE) USE(R_SCORES, 4u * (size_t)pc->H * (size_t)n);
                if (pc->var & 8) USE(R_ROWPOS, 4u * (size_t)n);
                break;
            case PL_SELECT: case PL_SHARED_ADD: case PL_SELECT_SHARED:
                dec = 1; keep = pc->kind != PL_SHARED_ADD;
                if (pc->kind != PL_SELECT_SHARED) USE(R_SCORES, 4u * (size_t)pc->H * (size_t)n);
                if (pc->kind != PL_SELECT) USE(R_SHARED, 4u * (size_t)n);
                if ((pc->var & 8) || pc->kind == PL_SHARED_ADD) USE(R_ROWPOS, 4u * (size_t)n);
                break;
            case PL_COMPACT:
                t = pview(pc->lay[1], pc->dt, n, pc->KV, pc->d, NULL); USE(R_K, tensor_bytes(&t));
                t = pview(pc->lay[2], pc->vdt, n, pc->KV, pc->d, NULL); USE(R_V, tensor_bytes(&t));
                USE(R_KSTRUCT, sizeof(ei_keep_set));
                USE(R_INDEX, 4u * (size_t)pc->heads_out * (size_t)pc->capacity);
                break;
            default: return 0;
        }
        if (dec) {
            if (ei_layer_sizes(pc->ctx, &shape, &sz) != EI_OK || sz.decoder > ((size_t)1 << 20)) return 0;
            USE(R_DEC, sz.decoder); USE(R_DSTRUCT, sizeof(ei_decoder));
            if (pc->kind != PL_DEC_INIT && pc->kind != PL_OBSERVE && pc->kind != PL_DEC_RESET) /* score: nth parts' shares */
                USE(R_WS, sz.decode_keep * (size_t)(pc->nt > 0 ? pc->nt : pc->kind == PL_SCORE ? pc->nth : 1));
        }
        if (keep) {
            if (pc->heads_out <= 0 || pc->capacity <= 0) return 0;
            USE(R_KSTRUCT, sizeof(ei_keep_set));
            USE(R_INDEX, 4u * (size_t)pc->heads_out * (size_t)pc->capacity);
            if (pc->var & 1) USE(R_POS, 4u * (size_t)pc->heads_out * (size_t)pc->capacity);
            if (pc->var & 2) USE(R_MASK, (size_t)pc->heads_out * (size_t)pc->mask_cap);
            if (pc->var & 4) USE(R_POOLED, 4u * (size_t)pc->heads_out * (size_t)pc->pooled_cap);
        }
    }
#undef USE
    for (i = 0; i < R_COUNT; ++i)
        if (pc->bytes[i] > ((size_t)4 << 20)) return 0;
    /* sources */
    {
        int64_t t;
        int32_t *map;
        view_make(&pc->qs, f, pc->dt, pc->n, pc->H, pc->d, 0);
        view_make(&pc->ks, f, pc->dt, pc->n, pc->KV, pc->d, 0);
        view_make(&pc->vs, f, pc->vdt, pc->n, pc->KV, pc->d, 0);
        view_fill_values(&pc->qs, 0); view_fill_values(&pc->ks, 0); view_fill_values(&pc->vs, 0);
        map = pc->rowpos = (int32_t *)xalloc(4u * (size_t)pc->n);
        for (t = 0; t < pc->n; ++t) map[t] = (int32_t)t;
        if (pc->var & 32)
            for (t = pc->n - 1; t > 0; --t) { int64_t x = (int64_t)(rng_next() % (uint32_t)(t + 1)); int32_t y = map[t]; map[t] = map[x]; map[x] = y; }
        if ((pc->var & 128) && pc->n > 1) map[rng_next() % (uint32_t)pc->n] = -1;
        pc->scores = (float *)xalloc(4u * (size_t)pc->H * (size_t)pc->n);
        for (t = 0; t < (int64_t)pc->H * pc->n; ++t) pc->scores[t] = (float)(rng_next() % 1000u) / 1000.0f;
        pc->shared = (float *)xalloc(4u * (size_t)pc->n);
        for (t = 0; t < pc->n; ++t) pc->shared[t] = pc->kind == PL_SHARED_ADD && !(pc->var & 64) ? 0.0f : (float)(rng_next() % 1000u) / 500.0f;
        pc->index = (int32_t *)xalloc(4u * (size_t)pc->heads_out * (size_t)EI__MAX(pc->capacity, 1));
        if (pc->kind == PL_COMPACT || pc->kind == PL_STEP) { /* ascending rows of each head: n_kept of the rows scored */
            int32_t h;
            int64_t rows = pc->kind == PL_STEP ? pc->keep_n : pc->n;
            for (h = 0; h < pc->heads_out; ++h) {
                int64_t need = pc->n_kept, left = rows, j = 0;
                for (t = 0; t < rows && need > 0; ++t, --left)
                    if ((int64_t)(rng_next() % (uint32_t)left) < need) { pc->index[(size_t)h * (size_t)pc->capacity + (size_t)j++] = (int32_t)t; need--; }
            }
        }
    }
    return 1;
}
static void pcall_free(pcall *pc) {
    view_free(&pc->qs); view_free(&pc->ks); view_free(&pc->vs);
    free(pc->rowpos); free(pc->scores); free(pc->shared); free(pc->index);
}

/* ---- placing the buffers */
/* All-ones bytes (NaN in every dtype); large workspaces at their ends only. */
static void fill_all(unsigned char *p, size_t n) { memset(p, 0xff, n); }
static void fill_ff(unsigned char *p, size_t n) {
    if (n <= 20480) memset(p, 0xff, n);
    else { memset(p, 0xff, 16384); memset(p + n - 4096, 0xff, 4096); }
}
/* resid[r]: address mod 64 of role r; guest over host at offset o from the
   host's region (reference: every buffer apart, memory 64-byte aligned). */
static void placement_build(placement *pl, const pcall *pc, const unsigned *resid, int host, int guest, int64_t o,
                            int guest_raw, int reference) {
    int64_t cursor = 0, lo = 0, hi = 0;
    int r, first = 1;
    memset(pl, 0, sizeof *pl);
    for (r = 0; r < R_COUNT; ++r) {
        int64_t want;
        if (!pc->bytes[r] || (!reference && r == guest)) continue;
        want = reference ? (role_kind[r] == PK_VIEW ? (int64_t)resid[r] : 0) : (int64_t)resid[r];
        pl->pos[r] = cursor + ((want - cursor % 64) + 64) % 64;
        cursor = pl->pos[r] + (int64_t)pc->bytes[r] + (reference ? 64 : 8 + (int64_t)((r * 13 + resid[r]) % 40));
    }
    if (!reference && guest >= 0) {
        int64_t hoff = 0, goff = 0, g;
        if (host == R_PLAN || host == R_DEC) hoff = (64 - pl->pos[host] % 64) % 64;
        if (guest == R_PLAN || guest == R_DEC) goff = (64 - (int64_t)resid[guest]) % 64;
        g = pl->pos[host] + hoff + o - goff;
        if (role_kind[guest] == PK_STRUCT) g -= ((g % 8) + 8) % 8; /* the harness writes the struct */
        else if (!guest_raw && role_kind[guest] == PK_VIEW) {
            int64_t es = (int64_t)dtype_size(guest == R_V ? pc->vdt : guest == R_OUT ? pc->odt : pc->dt);
            g -= ((g % es) + es) % es;
        } else if (!guest_raw && role_kind[guest] == PK_ARR)
            g -= ((g % 4) + 4) % 4;
        pl->pos[guest] = g;
    }
    for (r = 0; r < R_COUNT; ++r) {
        if (!pc->bytes[r]) continue;
        if (first || pl->pos[r] < lo) lo = pl->pos[r];
        if (first || pl->pos[r] + (int64_t)pc->bytes[r] > hi) hi = pl->pos[r] + (int64_t)pc->bytes[r];
        first = 0;
    }
    lo -= ((lo % 64) + 64) % 64; /* shift by a multiple of 64: residues stay */
    pl->alloc = (size_t)(hi - lo) + 128;
    pl->pooled = (pl->raw = pool_take(pl->alloc, &pl->alloc)) != NULL;
    if (!pl->pooled) pl->raw = (unsigned char *)xalloc(pl->alloc);
    pl->base = pl->raw + (64 - (uintptr_t)pl->raw % 64) % 64;
    FZ_POISON(pl->raw, pl->alloc);
    for (r = 0; r < R_COUNT; ++r) {
        if (!pc->bytes[r]) continue;
        pl->pos[r] -= lo;
        pl->p[r] = pl->base + pl->pos[r];
        FZ_UNPOISON(pl->p[r], pc->bytes[r]);
    }
}
static void placement_free(placement *pl) {
    if (!pl->raw) return;
    if (pl->pooled) pool_give(pl->raw);
    else { FZ_UNPOISON(pl->raw, pl->alloc); free(pl->raw); }
    pl->raw = NULL;
}

/* ---- views of the call over a placement */
static ei_tensor pc_q(const pcall *pc, const placement *pl) { return pview(pc->lay[0], pc->dt, pc->cnt, pc->H, pc->d, pl->p[R_Q]); }
static ei_tensor pc_k(const pcall *pc, const placement *pl) {
    return pview(pc->lay[1], pc->dt, pc->kind == PL_CHUNK || pc->kind == PL_ATTN ? pc->kn : pc->n, pc->KV, pc->d, pl->p[R_K]);
}
static ei_tensor pc_v(const pcall *pc, const placement *pl) {
    return pview(pc->lay[2], pc->vdt, pc->kind == PL_ATTN ? pc->kn : pc->n, pc->KV, pc->d, pl->p[R_V]);
}
static ei_out_tensor pc_out(const pcall *pc, const placement *pl) { return pview_out(pc->lay[3], pc->odt, pc->cnt, pc->H, pc->d, pl->p[R_OUT]); }
static ei_out_tensor pc_kout(const pcall *pc, const placement *pl) { return pview_out(pc->lay[1], pc->dt, pc->n, pc->KV, pc->d, pl->p[R_K]); }
static ei_out_tensor pc_vout(const pcall *pc, const placement *pl) { return pview_out(pc->lay[2], pc->vdt, pc->n, pc->KV, pc->d, pl->p[R_V]); }
static ei_keep_set pc_keep(const pcall *pc, const placement *pl) {
    ei_keep_set k;
    memset(&k, 0, sizeof k);
    k.heads_out = pc->heads_out;
    k.capacity = pc->capacity;
    k.index = (int32_t *)(void *)pl->p[R_INDEX];
    k.positions = (int32_t *)(void *)pl->p[R_POS];
    if (pl->p[R_MASK]) { k.mask = pl->p[R_MASK]; k.mask_capacity = pc->mask_cap; }
    if (pl->p[R_POOLED]) { k.pooled = (float *)(void *)pl->p[R_POOLED]; k.pooled_capacity = pc->pooled_cap; }
    k.row_pos = (const int32_t *)(void *)pl->p[R_ROWPOS];
    if (pc->kind == PL_COMPACT) { k.n_kept = pc->n_kept; k.n_tokens = pc->n; }
    if (pc->kind == PL_STEP) { k.n_kept = pc->n_kept; k.n_tokens = pc->keep_n; }
    return k;
}

/* Placement outcomes per call kind (EI_FUZZ_TIMING prints them):
   refused conflicts, refused misalignments, clean calls, of which compared
   with the reference, interleaved views accepted, results EI_OK. */
static long place_stats[PL_COUNT][6];
/* ---- preparing: plan and decoder through the library, into the arena */
/* The oracle of an init (ei_plan_init, ei_decoder_init) that returned r for
   its struct (role st, `bytes` long) and its memory (role mem): refused
   when they overlap, accepted otherwise. Returns 1 when the init stands. */
static int pc_init_judged(pcall *pc, placement *pl, int mem, int st, size_t bytes, ei_result r, const char *what,
                          int reference) {
    pregs g;
    int a, b;
    g.n = 0;
    preg_add(&g, mem, pl->p[mem], pc->bytes[mem], 1);
    preg_add(&g, st, pl->p[st], bytes, 1);
    if (regions_conflict(&g, &a, &b)) {
        ORACLE(r != EI_OK, "an init accepted its struct over its memory", a, b);
        if (!reference) place_stats[pc->kind][0]++;
        return 0;
    }
    if (r != EI_OK) fprintf(stderr, "%s: ", what);
    ORACLE(r == EI_OK, "an init refused memory of the right size (any alignment)", r, (long)(pl->pos[mem] % 64));
    return 1;
}
static int pc_prepare(pcall *pc, placement *pl, int reference) {
    ei_result r;
    if (pc->kind == PL_PLAN_RESET) { /* made apart; pc_fill_structs copies it where the fuzzer put it */
        ei_plan apart;
        if (ei_plan_init(pc->ctx, &apart, pc->n, pc->KV, pc->d, pc->flags, pl->p[R_PLAN], pc->bytes[R_PLAN]) != EI_OK) return 0;
        memcpy(&pc->plan, &apart, sizeof pc->plan);
        return 1;
    }
    if (pc->kind == PL_DEC_RESET) {
        ei_decoder apart;
        int64_t w = EI__MIN((int64_t)EI__MAX(pc->c->window, 1), pc->n);
        ei_tensor q0 = pc->qs.t;
        q0.n_tokens = w;
        if (ei_decoder_init(pc->ctx, &apart, pc->H, pc->KV, pc->d, pl->p[R_DEC], pc->bytes[R_DEC]) != EI_OK ||
            ei_decode_observe(pc->ctx, &apart, &q0, pc->n - w, 0) != EI_OK)
            return 0;
        memcpy(&pc->dec, &apart, sizeof pc->dec);
        return 1;
    }
    if (pc->bytes[R_PLAN]) {
        ei_plan *p = (ei_plan *)(void *)pl->p[R_PSTRUCT];
        r = checked(ei_plan_init(pc->ctx, p, pc->n, pc->KV, pc->d, pc->flags, pl->p[R_PLAN], pc->bytes[R_PLAN]));
        if (!pc_init_judged(pc, pl, R_PLAN, R_PSTRUCT, sizeof *p, r, "ei_plan_init", reference)) return 0;
        if (pc->kind == PL_PLAN_INIT) return 1;
        if ((pc->kind == PL_ATTN && pc->use_plan) || (pc->kind == PL_CHUNK && pc->c1 > 0)) {
            size_t need = 0;
            void *ws;
            ei_sizes sz;
            ei_exec x;
            if (fz_sizes(pc->ctx, pc->n, pc->H, pc->KV, pc->d, 0, 1, &sz) != EI_OK) return 0;
            need = sz.profile;
            ws = walloc_mem(need);
            x = ex(1, ws, need);
            if (pc->kind == PL_ATTN) r = checked(ei_profile(pc->ctx, &x, &pc->qs.t, &pc->ks.t, p));
            else {
                ei_tensor q0 = pc->qs.t, k0 = pc->ks.t;
                q0.n_tokens = k0.n_tokens = pc->c1;
                r = checked(ei_profile_chunk(pc->ctx, &x, &q0, &k0, p, 0, 0));
            }
            wfree(ws);
            if (r != EI_OK && reference) return 0;
        }
        memcpy(&pc->plan, p, sizeof pc->plan);
    }
    if (pc->bytes[R_DEC]) {
        ei_decoder *d = (ei_decoder *)(void *)pl->p[R_DSTRUCT];
        r = checked(ei_decoder_init(pc->ctx, d, pc->H, pc->KV, pc->d, pl->p[R_DEC], pc->bytes[R_DEC]));
        if (!pc_init_judged(pc, pl, R_DEC, R_DSTRUCT, sizeof *d, r, "ei_decoder_init", reference)) return 0;
        if (pc->kind != PL_DEC_INIT && (pc->kind != PL_OBSERVE || (pc->var & 2))) {
            int64_t w = EI__MIN((int64_t)EI__MAX(pc->c->window, 1), pc->n);
            ei_tensor q0 = pc->qs.t;
            q0.data = (const unsigned char *)pc->qs.buf + (size_t)(pc->n - w) * (size_t)pc->H * (size_t)pc->d * dtype_size(pc->dt);
            q0.n_tokens = w;
            r = checked(ei_decode_observe(pc->ctx, d, &q0, pc->n - w, 0)); /* the cache's newest positions */
            if (r == EI_OK && (pc->var & 64)) {
                q0.n_tokens = 1;
                r = checked(ei_decode_observe(pc->ctx, d, &q0, d->position_end, 1));
            }
            if (r != EI_OK && reference) return 0;
        }
        memcpy(&pc->dec, d, sizeof pc->dec);
    }
    return 1;
}

/* ---- filling: inputs from the sources (or, for the reference, the fuzzed
   arena's bytes), outputs garbage; the structs last */
static int role_is_input(const pcall *pc, int r) {
    switch (r) {
        case R_Q: case R_V: case R_ROWPOS: return 1;
        case R_K: return 1;
        case R_SCORES: return pc->kind != PL_SCORE;
        case R_SHARED: return 1;
        case R_INDEX: return pc->kind == PL_COMPACT || pc->kind == PL_STEP;
        default: return 0;
    }
}
static FZ_FAST void pc_fill_role(const pcall *pc, const placement *pl, int r) {
    ei_tensor t;
    switch (r) {
        case R_Q:
            t = pc_q(pc, pl);
            copy_rows(&t, pl->p[R_Q], &pc->qs.t, pc->kind == PL_OBSERVE ? pc->n - pc->cnt : pc->q_off, pc->cnt);
            break;
        case R_K:
            t = pc_k(pc, pl);
            copy_rows(&t, pl->p[R_K], &pc->ks.t, 0, EI__MIN(t.n_tokens, pc->n));
            break;
        case R_V:
            t = pc_v(pc, pl);
            copy_rows(&t, pl->p[R_V], &pc->vs.t, 0, EI__MIN(t.n_tokens, pc->n));
            break;
        case R_OUT: { /* its elements only: the out view may lie between q's rows */
            ei_out_tensor o = pc_out(pc, pl);
            int64_t tt;
            int32_t h;
            size_t es = dtype_size(o.dtype);
            for (tt = 0; tt < o.n_tokens; ++tt)
                for (h = 0; h < o.n_heads; ++h)
                    memset((unsigned char *)o.data + (size_t)(tt * o.token_stride + (int64_t)h * o.head_stride) * es, 0xff,
                           (size_t)o.head_dim * es);
            break;
        }
        case R_ROWPOS: memcpy(pl->p[r], pc->rowpos, pc->bytes[r]); break;
        case R_SCORES: if (pc->kind != PL_SCORE) memcpy(pl->p[r], pc->scores, pc->bytes[r]); else memset(pl->p[r], 0xff, pc->bytes[r]); break;
        case R_SHARED: memcpy(pl->p[r], pc->shared, pc->bytes[r]); break;
        case R_INDEX: if (pc->kind == PL_COMPACT || pc->kind == PL_STEP) memcpy(pl->p[r], pc->index, pc->bytes[r]); else memset(pl->p[r], 0xff, pc->bytes[r]); break;
        case R_POS: case R_MASK: case R_POOLED: memset(pl->p[r], 0xff, pc->bytes[r]); break;
        case R_WS: fill_ff(pl->p[r], pc->bytes[r]); break;
        default: break;
    }
}
static void pc_fill_structs(const pcall *pc, const placement *pl) {
    if (pc->bytes[R_PSTRUCT] && pc->bytes[R_PLAN] && pc->kind != PL_PLAN_INIT) memcpy(pl->p[R_PSTRUCT], &pc->plan, sizeof pc->plan);
    if (pc->bytes[R_DSTRUCT] && pc->kind != PL_DEC_INIT) memcpy(pl->p[R_DSTRUCT], &pc->dec, sizeof pc->dec);
    if (pc->bytes[R_KSTRUCT]) {
        ei_keep_set k = pc_keep(pc, pl);
        memcpy(pl->p[R_KSTRUCT], &k, sizeof k);
    }
}

/* ---- the call */
static ei_result pc_run(const pcall *pc, const placement *pl) {
    ei_context *ctx = pc->ctx;
    ei_plan *plan = (ei_plan *)(void *)pl->p[R_PSTRUCT];
    ei_decoder *dec = (ei_decoder *)(void *)pl->p[R_DSTRUCT];
    ei_keep_set *keep = (ei_keep_set *)(void *)pl->p[R_KSTRUCT];
    void *ws = pl->p[R_WS];
    size_t wb = pc->bytes[R_WS];
    ei_tensor q = pc_q(pc, pl), k = pc_k(pc, pl), v = pc_v(pc, pl);
    ei_out_tensor out = pc_out(pc, pl), ko = pc_kout(pc, pl), vo = pc_vout(pc, pl);
    const int32_t *rowpos = (const int32_t *)(void *)pl->p[R_ROWPOS];
    float *scores = (float *)(void *)pl->p[R_SCORES], *shared = (float *)(void *)pl->p[R_SHARED];
    ei_exec x = ex(pc->nt > 0 ? pc->nt : 1, ws, wb); /* on the call's threads (1: the caller) */
    ei_result r = EI_OK;
    int j;
    switch (pc->kind) {
        case PL_PROFILE:
            if (pc->nth >= 2) { /* in parts (the first failure), then finalize */
                for (j = 0; j < pc->nth && r == EI_OK; ++j) {
                    x = ex_part(j, pc->nth, ws, wb);
                    r = checked(ei_profile(ctx, &x, &q, &k, plan));
                }
                return r == EI_OK ? checked(ei_plan_finalize(ctx, plan)) : r;
            }
            return checked(ei_profile(ctx, &x, &q, &k, plan));
        case PL_CHUNK: return checked(ei_profile_chunk(ctx, &x, &q, &k, plan, pc->q_off, pc->is_final));
        case PL_ATTN: return checked(ei_attention_prefill(ctx, &x, &q, &k, &v, pc->use_plan ? plan : NULL, &out, pc->q_off));
        case PL_DEC_INIT: return checked(ei_decoder_init(ctx, dec, pc->H, pc->KV, pc->d, pl->p[R_DEC], pc->bytes[R_DEC]));
        case PL_OBSERVE: return checked(ei_decode_observe(ctx, dec, &q, dec ? dec->position_end : 0, (int)(pc->var & 1)));
        case PL_KEEP: return checked(ei_decode_keep(ctx, &x, dec, &k, keep));
        case PL_SCORE: x = ex_part(pc->ith, pc->nth, ws, wb); return checked(ei_decode_score(ctx, &x, dec, &k, rowpos, 0, scores));
        case PL_SELECT: return checked(ei_decode_select(ctx, &x, dec, scores, pc->n, keep));
        case PL_SHARED_ADD: return checked(ei_decode_shared_add(ctx, &x, dec, scores, pc->n, rowpos, shared));
        case PL_SELECT_SHARED: return checked(ei_decode_select_shared(ctx, &x, dec, shared, pc->n, keep));
        case PL_COMPACT: return checked(ei_kv_compact(ctx, keep, &ko, &vo));
        case PL_PLAN_INIT: return checked(ei_plan_init(ctx, plan, pc->n, pc->KV, pc->d, pc->flags, pl->p[R_PLAN], pc->bytes[R_PLAN]));
        case PL_PLAN_RESET: return checked((pc->var & 4) ? ei_plan_finalize(ctx, plan) : ei_plan_reset(plan));
        case PL_DEC_RESET: return checked(ei_decoder_reset(dec));
        case PL_STEP:
            if (pc->nt > 0 || pc->nth < 2) { /* on threads: the merge does nothing */
                r = checked(ei_attention_decode(ctx, &x, &q, &k, &v, keep, &out, pc->q_off));
                return r == EI_OK ? checked(ei_attention_decode_merge(ctx, &x, &out)) : r;
            }
            for (j = 0; j < pc->nth && r == EI_OK; ++j) { /* the parts, then (after the engine's barrier) their merges */
                x = ex_part(j, pc->nth, ws, wb);
                r = checked(ei_attention_decode(ctx, &x, &q, &k, &v, keep, &out, pc->q_off));
            }
            for (j = 0; j < pc->nth && r == EI_OK; ++j) {
                x = ex_part(j, pc->nth, ws, wb);
                r = checked(ei_attention_decode_merge(ctx, &x, &out));
            }
            return r;
        default: return EI_ERR_STATE;
    }
}
/* The workspace bytes a call on threads needs: a thread's share (ei_layer_sizes
   for one thread) per thread the call runs (on threads ei_profile runs at
   most one per kv head or, with fewer kv heads than threads, per segment;
   ei_decode_keep one per query head). */
static size_t pc_ws_need(const pcall *pc) {
    size_t per = pc->bytes[R_WS] / (size_t)(pc->nt > 0 ? pc->nt : 1);
    int used = pc->nt > 0 ? pc->nt : 1;
    if (pc->kind == PL_PROFILE && pc->nt > 0)
        used = (int)EI__MIN((int64_t)pc->nt, EI__MAX((int64_t)pc->KV, (pc->n + pc->c->segment_size - 1) / pc->c->segment_size));
    if (pc->kind == PL_KEEP && pc->nt > 0) used = EI__MIN(pc->nt, pc->H);
    if (pc->kind == PL_CHUNK && pc->nt > 0) used = EI__MIN(pc->nt, pc->KV);
    return per * (size_t)used;
}
/* The regions the call uses, from the rules (not from the library). */
static void pc_regions(const pcall *pc, const placement *pl, pregs *g) {
    const ei_plan *plan = (const ei_plan *)(const void *)pl->p[R_PSTRUCT];
    const ei_decoder *dec = (const ei_decoder *)(const void *)pl->p[R_DSTRUCT];
    ei_tensor t;
    ei_out_tensor o;
    int kw = pc->kind == PL_KEEP || pc->kind == PL_SELECT || pc->kind == PL_SELECT_SHARED;
    g->n = 0;
    switch (pc->kind) {
        case PL_PROFILE: case PL_CHUNK: case PL_ATTN:
            t = pc_q(pc, pl); preg_view(g, R_Q, &t, 0);
            t = pc_k(pc, pl); preg_view(g, R_K, &t, 0);
            if (pc->kind == PL_ATTN) {
                t = pc_v(pc, pl); preg_view(g, R_V, &t, 0);
                o = pc_out(pc, pl); t = as_view(&o); preg_view(g, R_OUT, &t, 1);
            }
            if (pc->kind != PL_ATTN || pc->use_plan) {
                preg_add(g, R_PLAN, plan->entropy, plan_extent(pc->c, pc->n, pc->KV, pc->d, pc->flags), pc->kind != PL_ATTN);
                preg_add(g, R_PSTRUCT, plan, sizeof *plan, pc->kind != PL_ATTN);
            }
            if (pc->kind == PL_PROFILE && pc->nth >= 2) /* in parts: every part's share, the whole workspace */
                preg_add(g, R_WS, pl->p[R_WS], pc->bytes[R_WS], 1);
            else preg_add(g, R_WS, pl->p[R_WS], pc_ws_need(pc), 1);
            break;
        case PL_PLAN_INIT:
            preg_add(g, R_PLAN, pl->p[R_PLAN], pc->bytes[R_PLAN], 1);
            preg_add(g, R_PSTRUCT, plan, sizeof *plan, 1);
            break;
        case PL_PLAN_RESET: /* the arrays init laid out, and the struct (read by finalize, written by reset) */
            preg_add(g, R_PLAN, plan->entropy, plan_extent(pc->c, pc->n, pc->KV, pc->d, pc->flags), 1);
            preg_add(g, R_PSTRUCT, plan, sizeof *plan, !(pc->var & 4));
            break;
        case PL_DEC_RESET: /* the struct apart from the ring (and H2O's sums) it describes */
            preg_add(g, R_DEC, dec->queries, ring_bytes(pc), 0);
            preg_add(g, R_DEC, acc_ptr(pc, dec), acc_bytes(pc), 0);
            preg_add(g, R_DSTRUCT, dec, sizeof *dec, 1);
            break;
        case PL_STEP: { /* the partials from the workspace's first 64-byte boundary, then the threads' shares
                           (in parts: part j's at j x its nth of the bytes after the partials) */
            unsigned char *w = pl->p[R_WS];
            size_t pad = (64 - (uintptr_t)w % 64) % 64;
            t = pc_q(pc, pl); preg_view(g, R_Q, &t, 0);
            t = pc_k(pc, pl); preg_view(g, R_K, &t, 0);
            t = pc_v(pc, pl); preg_view(g, R_V, &t, 0);
            o = pc_out(pc, pl); t = as_view(&o); preg_view(g, R_OUT, &t, 1);
            preg_add(g, R_KSTRUCT, pl->p[R_KSTRUCT], sizeof(ei_keep_set), 0);
            preg_add(g, R_INDEX, pl->p[R_INDEX], pc->bytes[R_INDEX], 0);
            if (pc->nt > 0 || pc->nth < 2)
                preg_add(g, R_WS, w + pad, pc->partb + pc->per * (size_t)(pc->nt > 0 ? pc->nt : 1), 1);
            else /* in parts: the partials, then every part's share: the rest of the workspace */
                preg_add(g, R_WS, w + pad, pc->bytes[R_WS] - pad, 1);
            break;
        }
        case PL_DEC_INIT:
            preg_add(g, R_DEC, pl->p[R_DEC], pc->bytes[R_DEC], 1);
            preg_add(g, R_DSTRUCT, dec, sizeof *dec, 1);
            break;
        case PL_OBSERVE:
            t = pc_q(pc, pl); preg_view(g, R_Q, &t, 0);
            preg_add(g, R_DEC, dec->queries, ring_bytes(pc), 1);
            preg_add(g, R_DEC, acc_ptr(pc, dec), acc_bytes(pc), 1);
            preg_add(g, R_DSTRUCT, dec, sizeof *dec, 1);
            break;
        case PL_COMPACT:
            preg_add(g, R_KSTRUCT, pl->p[R_KSTRUCT], sizeof(ei_keep_set), 0);
            preg_add(g, R_INDEX, pl->p[R_INDEX], pc->bytes[R_INDEX], 0);
            o = pc_kout(pc, pl); t = as_view(&o); preg_view(g, R_K, &t, 1);
            o = pc_vout(pc, pl); t = as_view(&o); preg_view(g, R_V, &t, 1);
            break;
        default: /* decode */
            if (pc->kind == PL_KEEP || pc->kind == PL_SCORE) {
                t = pc_k(pc, pl); preg_view(g, R_K, &t, 0);
                preg_add(g, R_DEC, dec->queries, ring_bytes(pc), 0);
            }
            preg_add(g, R_DSTRUCT, dec, sizeof *dec, pc->kind != PL_SCORE && pc->kind != PL_SELECT_SHARED);
            if (pc->kind != PL_SCORE && pc->kind != PL_SELECT_SHARED) preg_add(g, R_DEC, acc_ptr(pc, dec), acc_bytes(pc), 1);
            if (kw) {
                preg_add(g, R_KSTRUCT, pl->p[R_KSTRUCT], sizeof(ei_keep_set), 1);
                preg_add(g, R_INDEX, pl->p[R_INDEX], pc->bytes[R_INDEX], 1);
                preg_add(g, R_POS, pl->p[R_POS], pc->bytes[R_POS], 1);
                preg_add(g, R_MASK, pl->p[R_MASK], pc->bytes[R_MASK], 1);
                preg_add(g, R_POOLED, pl->p[R_POOLED], pc->bytes[R_POOLED], 1);
            }
            preg_add(g, R_ROWPOS, pl->p[R_ROWPOS], pc->bytes[R_ROWPOS], 0);
            preg_add(g, R_SCORES, pl->p[R_SCORES], pc->bytes[R_SCORES], pc->kind == PL_SCORE);
            preg_add(g, R_SHARED, pl->p[R_SHARED], pc->bytes[R_SHARED], pc->kind == PL_SHARED_ADD);
            if (pc->kind == PL_SCORE && pc->nth >= 2) /* in parts: every part's share, the whole workspace */
                preg_add(g, R_WS, pl->p[R_WS], pc->bytes[R_WS], 1);
            else if (pc->kind == PL_SCORE) /* one part of one: a thread's share */
                preg_add(g, R_WS, pl->p[R_WS], pc->bytes[R_WS] / (size_t)pc->nth, 1);
            else preg_add(g, R_WS, pl->p[R_WS], pc_ws_need(pc), 1);
            break;
    }
}
/* A view, or an int32/float array, the call uses at an address that is not a
   multiple of its element size. */
static int pc_misaligned(const pcall *pc, const placement *pl, int *role) {
    int r;
    for (r = 0; r < R_COUNT; ++r) {
        size_t need = 1;
        if (!pc->bytes[r] || !pl->p[r]) continue;
        if (role_kind[r] == PK_VIEW) need = dtype_size(r == R_V ? pc->vdt : r == R_OUT ? pc->odt : pc->dt);
        else if (role_kind[r] == PK_ARR) need = 4;
        if ((uintptr_t)pl->p[r] % need) { *role = r; return 1; }
    }
    return 0;
}

/* ---- what the call produced, as bytes */
typedef struct snap { unsigned char *b; size_t n, cap; } snap;
static void snap_put(snap *s, const void *p, size_t n) {
    if (s->n + n > s->cap) {
        s->cap = (s->n + n) * 2 + 256;
        s->b = (unsigned char *)realloc(s->b, s->cap);
        if (!s->b) abort();
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
}
static FZ_FAST void snap_view(snap *s, const ei_out_tensor *o) {
    int64_t t;
    int32_t h;
    size_t es = dtype_size(o->dtype);
    for (t = 0; t < o->n_tokens; ++t)
        for (h = 0; h < o->n_heads; ++h)
            snap_put(s, (const unsigned char *)o->data + (size_t)(t * o->token_stride + (int64_t)h * o->head_stride) * es,
                     (size_t)o->head_dim * es);
}
static void pc_snapshot(const pcall *pc, const placement *pl, snap *s) {
    const ei_plan *plan = (const ei_plan *)(const void *)pl->p[R_PSTRUCT];
    const ei_decoder *dec = (const ei_decoder *)(const void *)pl->p[R_DSTRUCT];
    const ei_keep_set *keep = (const ei_keep_set *)(const void *)pl->p[R_KSTRUCT];
    ei_out_tensor o;
    s->n = 0;
    switch (pc->kind) {
        case PL_PROFILE: case PL_CHUNK: case PL_PLAN_INIT: case PL_PLAN_RESET: {
            int64_t cnt[4];
            cnt[0] = plan->n_tokens; cnt[1] = plan->n_segments; cnt[2] = plan->n_blocks; cnt[3] = plan->final;
            snap_put(s, cnt, sizeof cnt);
            snap_put(s, plan->entropy, plan_extent(pc->c, pc->n, pc->KV, pc->d, pc->flags));
            break;
        }
        case PL_ATTN: case PL_STEP: o = pc_out(pc, pl); snap_view(s, &o); break;
        case PL_COMPACT: o = pc_kout(pc, pl); snap_view(s, &o); o = pc_vout(pc, pl); snap_view(s, &o); break;
        case PL_SCORE: snap_put(s, pl->p[R_SCORES], pc->bytes[R_SCORES]); break;
        default: {
            int64_t cnt[6];
            cnt[0] = dec->n_observed; cnt[1] = dec->n_generated; cnt[2] = dec->last_compress;
            cnt[3] = keep ? keep->n_kept : 0; cnt[4] = keep ? keep->compressed : 0; cnt[5] = keep ? keep->n_tokens : 0;
            snap_put(s, cnt, sizeof cnt);
            if (pc->kind == PL_OBSERVE || pc->kind == PL_DEC_INIT) snap_put(s, dec->queries, ring_bytes(pc));
            if (pc->kind == PL_SHARED_ADD) snap_put(s, pl->p[R_SHARED], pc->bytes[R_SHARED]);
            if (keep) {
                int r;
                for (r = R_INDEX; r <= R_POOLED; ++r)
                    if (pc->bytes[r]) snap_put(s, pl->p[r], pc->bytes[r]);
            }
            break;
        }
    }
}
/* Compaction moved the kept rows (the reference placement: K and V apart). */
static FZ_FAST void compact_check(const pcall *pc, const placement *pl) {
    ei_out_tensor o[2];
    const view *src[2];
    int w;
    int32_t h, i;
    o[0] = pc_kout(pc, pl); o[1] = pc_vout(pc, pl);
    src[0] = &pc->ks; src[1] = &pc->vs;
    for (w = 0; w < 2; ++w) {
        size_t es = dtype_size(o[w].dtype), rb = (size_t)pc->d * es;
        for (h = 0; h < pc->heads_out; ++h)
            for (i = 0; i < pc->n_kept; ++i) {
                int32_t row = pc->index[(size_t)h * (size_t)pc->capacity + (size_t)i];
                ORACLE(!memcmp((const unsigned char *)o[w].data + (size_t)(i * o[w].token_stride + (int64_t)h * o[w].head_stride) * es,
                               (const unsigned char *)src[w]->buf + el_index(&src[w]->t, row, h, 0) * es, rb),
                       "placement: compaction moved the wrong row", h, i);
            }
    }
}

static void op_place(state *s, fz *f) {
    pcall pc;
    placement A, B;
    unsigned resid[R_COUNT];
    int guest_raw = 0, host = -1, guest = -1, r, used[R_COUNT], nused = 0, conflict, mis, ra = 0, rb = 0, mrole = -1, diff;
    int64_t o = 0;
    ei_result res_a, res_b = EI_OK;
    pregs g;
    snap sa, sb;
    memset(&A, 0, sizeof A); memset(&B, 0, sizeof B);
    memset(&sa, 0, sizeof sa); memset(&sb, 0, sizeof sb);
    if (!pcall_setup(&pc, s, f)) { pcall_free(&pc); return; }
    /* each buffer's address mod 64 */
    for (r = 0; r < R_COUNT; ++r) {
        unsigned al, need = 1;
        resid[r] = 0;
        if (!pc.bytes[r]) continue;
        used[nused++] = r;
        al = fz_u8(f);
        if (role_kind[r] == PK_VIEW) need = (unsigned)dtype_size(r == R_V ? pc.vdt : r == R_OUT ? pc.odt : pc.dt);
        else if (role_kind[r] == PK_ARR) need = 4;
        else if (role_kind[r] == PK_STRUCT) need = 8;
        resid[r] = al & 63u;
        if (need > 1 && role_kind[r] != PK_STRUCT && FAMILY(FAM_ALIGN) && (al >> 6) == 3) {
            if (resid[r] % need == 0) resid[r] += 1;            /* misaligned: refused */
        } else resid[r] -= resid[r] % need;
    }
    /* one buffer over another */
    if (pc.inter) {
        int es = (int)dtype_size(pc.dt);
        unsigned x = fz_u8(f);
        host = pc.kind == PL_COMPACT ? R_K : R_Q;
        guest = pc.kind == PL_COMPACT ? R_V : pc.kind == PL_ATTN ? R_OUT : R_K;
        o = (pc.lay[pc.kind == PL_COMPACT ? 1 : 0] == 3 ? (int64_t)(pc.kind == PL_COMPACT ? pc.KV : pc.H) * pc.d : pc.d) * es;
        if (x % 3 == 0) o += (int64_t)es * (1 + (int64_t)(x >> 2) % pc.d); /* sharing elements: refused */
        if (x % 5 == 1) o = -o;
        resid[guest] = (unsigned)((resid[host] + (unsigned)(((o % 64) + 64) % 64)) % 64u);
        guest_raw = 1;
    } else if (FAMILY(FAM_OVERLAP) && nused >= 2 && (fz_u8(f) & 1)) {
        unsigned x = fz_u8(f);
        int64_t hl, gl;
        {
            unsigned hi = fz_u8(f) % (unsigned)nused, gi = fz_u8(f) % (unsigned)nused;
            if (gi == hi) gi = (hi + 1) % (unsigned)nused;
            host = used[hi];
            guest = used[gi];
        }
        hl = (int64_t)(host == R_PLAN ? plan_extent(pc.c, pc.n, pc.KV, pc.d, pc.flags) : host == R_DEC && pc.kind != PL_DEC_INIT ? ring_bytes(&pc) : pc.bytes[host]);
        gl = (int64_t)pc.bytes[guest];
        if (hl <= 0) hl = 1;
        switch (x & 7) {
            case 0: o = hl - 1; break;           /* the guest's first byte on the host's last */
            case 1: o = 1 - gl; break;           /* the guest's last byte on the host's first */
            case 2: o = hl; break;               /* just after: no overlap */
            case 3: o = -gl; break;              /* just before: no overlap */
            default: o = (int64_t)(fz_u16(f) % (unsigned)EI__MIN(hl + gl - 1, 65535)) - (gl - 1); break;
        }
        guest_raw = (x & 8) != 0 && FAMILY(FAM_ALIGN); /* the guest at the offset as it falls (else element-aligned) */
    }
    if (verbose > 0)
        fprintf(stderr, "  placement: %s, n %lld, q %lld at %lld, heads %d/%d, dim %d, guest %s over %s at %lld\n",
                kind_names[pc.kind], (long long)pc.n, (long long)pc.cnt, (long long)pc.q_off, (int)pc.H, (int)pc.KV,
                (int)pc.d, guest >= 0 ? role_names[guest] : "-", host >= 0 ? role_names[host] : "-", (long long)o);
    placement_build(&A, &pc, resid, host, guest, o, guest_raw, 0);
    for (r = 0; r < R_COUNT; ++r)
        if (pc.bytes[r]) (r == R_WS ? fill_ff : fill_all)(A.p[r], pc.bytes[r]);
    work_spend(2.0 * (double)pc.n * (double)pc.n * (double)pc.H * (double)pc.d);
    if (!pc_prepare(&pc, &A, 0)) goto done;
    for (r = 0; r < R_COUNT; ++r)
        if (pc.bytes[r] && r != guest) pc_fill_role(&pc, &A, r);
    if (guest >= 0) pc_fill_role(&pc, &A, guest);
    pc_fill_structs(&pc, &A);
    pc_regions(&pc, &A, &g);
    conflict = regions_conflict(&g, &ra, &rb);
    mis = pc_misaligned(&pc, &A, &mrole);
    /* the reference: always when buffers meet, for a quarter of the others */
    diff = !conflict && !mis && (guest >= 0 || (pc.var2 & 3) == 0);
    if (guest >= 0) /* the guest may meet any buffer, not only its host: none the harness prepares */
        for (r = 0; r < R_COUNT; ++r)
            if (pc.bytes[r] && r != guest && A.pos[r] < A.pos[guest] + (int64_t)pc.bytes[guest] &&
                A.pos[guest] < A.pos[r] + (int64_t)pc.bytes[r] && (role_prepared(r) || role_prepared(guest)))
                diff = 0;
    if (verbose > 0) fprintf(stderr, "  conflict %d (%s, %s), misaligned %d (%s), reference %d\n", conflict,
                             conflict ? role_names[ra] : "-", conflict ? role_names[rb] : "-", mis, mis ? role_names[mrole] : "-", diff);
    if (diff) {
        unsigned resid_b[R_COUNT];
        for (r = 0; r < R_COUNT; ++r) resid_b[r] = A.p[r] ? (unsigned)((uintptr_t)A.p[r] % 64u) : 0u; /* views: as in A */
        placement_build(&B, &pc, resid_b, -1, -1, 0, 0, 1);
        for (r = 0; r < R_COUNT; ++r)
            if (pc.bytes[r]) (r == R_WS ? fill_ff : fill_all)(B.p[r], pc.bytes[r]);
        if (!pc_prepare(&pc, &B, 1)) diff = 0;
        else {
            for (r = 0; r < R_COUNT; ++r) {
                if (!pc.bytes[r]) continue;
                if (role_is_input(&pc, r)) memcpy(B.p[r], A.p[r], pc.bytes[r]);
                else pc_fill_role(&pc, &B, r);
            }
            pc_fill_structs(&pc, &B);
            res_b = pc_run(&pc, &B);
            pc_snapshot(&pc, &B, &sb);
            if (res_b == EI_OK && pc.kind == PL_COMPACT) compact_check(&pc, &B);
        }
    }
    res_a = pc_run(&pc, &A);
    place_stats[pc.kind][conflict ? 0 : mis ? 1 : 2]++;
    if (!conflict && !mis && diff) place_stats[pc.kind][3]++;
    if (!conflict && pc.inter) place_stats[pc.kind][4]++;
    if (res_a == EI_OK) place_stats[pc.kind][5]++;
    if (conflict)
        ORACLE(res_a != EI_OK, "placement: a call accepted a written buffer over another", ra, rb);
    else if (mis)
        ORACLE(res_a != EI_OK, "placement: a call accepted a misaligned view or array", mrole, (long)((uintptr_t)A.p[mrole] % 64));
    else {
        ORACLE(res_a != EI_ERR_OVERLAP && res_a != EI_ERR_ALIGN, "placement: a call refused buffers that do not conflict", res_a,
               guest);
        if (diff) {
            ORACLE(res_a == res_b, "placement: result differs from the one with buffers apart and aligned", res_a, res_b);
            if (res_a == EI_OK) {
                pc_snapshot(&pc, &A, &sa);
                if (sa.n != sb.n || memcmp(sa.b, sb.b, sa.n)) {
                    size_t i = 0;
                    while (i < sa.n && i < sb.n && sa.b[i] == sb.b[i]) ++i;
                    fprintf(stderr, "placement: %s outputs differ at byte %zu of %zu (%zu): %02x%02x%02x%02x vs %02x%02x%02x%02x\n", kind_names[pc.kind], i, sa.n, sb.n,
                            sa.b[i & ~3u], sa.b[(i & ~3u) + 1], sa.b[(i & ~3u) + 2], sa.b[(i & ~3u) + 3], sb.b[i & ~3u], sb.b[(i & ~3u) + 1], sb.b[(i & ~3u) + 2], sb.b[(i & ~3u) + 3]);
                }
                ORACLE(sa.n == sb.n && !memcmp(sa.b, sb.b, sa.n),
                       "placement: output differs from the one with buffers apart and aligned", pc.kind, guest);
            }
        }
    }
done:
    free(sa.b); free(sb.b);
    placement_free(&A);
    placement_free(&B);
    pcall_free(&pc);
}

/* ------------------------------------------------------------ driver */
enum {
    OP_PLAN_INIT, OP_PROFILE, OP_PROFILE2, OP_PROFILE_HEADS, OP_PROFILE_MT, OP_CHUNK, OP_RESET_FINALIZE, OP_CORRUPT,
    OP_ATTENTION, OP_DECODE2, OP_ATTENTION_MT, OP_DECODER_INIT, OP_OBSERVE, OP_OBSERVE2, OP_DECODE, OP_COMPACT,
    OP_DECODER_RESET, OP_SIZES, OP_LAYER, OP_SWAP, OP_PLACE, OP_PLAN_EDIT, OP_SMALL_STACK, OP_CELL_POS, OP_CHUNK2,
    OP_EDGES, OP_COUNT
};
static void run_op(state *s, fz *f, unsigned op);

/* Another op on a thread whose stack is 64 KiB (mmap'd, a PROT_NONE guard
   page below it: an overflow is a clean SEGV, not a silent write). One
   worker thread, started once and handed each job (a thread start costs
   more than a whole input). */
#define FZ_SMALL_STACK ((size_t)64 << 10)
typedef struct stack_job { state *s; fz *f; unsigned op; } stack_job;
static pthread_mutex_t stack_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stack_cv = PTHREAD_COND_INITIALIZER;
static stack_job *stack_pending;
static int stack_busy;
static void *stack_main(void *unused) {
    (void)unused;
    pthread_mutex_lock(&stack_lock);
    for (;;) {
        stack_job *j;
        while (!stack_pending) pthread_cond_wait(&stack_cv, &stack_lock);
        j = stack_pending;
        pthread_mutex_unlock(&stack_lock);
        run_op(j->s, j->f, j->op);
        pthread_mutex_lock(&stack_lock);
        stack_pending = NULL;
        stack_busy = 0;
        pthread_cond_broadcast(&stack_cv);
    }
    return NULL;
}
static void op_small_stack(state *s, fz *f) {
    static int started = 0; /* 1: running, -1: cannot */
    static const unsigned char ops[] = {OP_PROFILE, OP_PROFILE_HEADS, OP_PROFILE_MT, OP_CHUNK, OP_ATTENTION, OP_ATTENTION_MT,
                                        OP_DECODE, OP_COMPACT, OP_OBSERVE, OP_PLACE, OP_PLAN_EDIT, OP_DECODER_INIT, OP_SIZES};
    stack_job job;
    job.s = s; job.f = f; job.op = FZ_PICK(f, ops);
    if (!started) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        unsigned char *mem = (unsigned char *)mmap(NULL, FZ_SMALL_STACK + page, PROT_READ | PROT_WRITE,
                                                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        pthread_attr_t attr;
        pthread_t tid;
        started = -1;
        if (mem == (unsigned char *)MAP_FAILED) return;
        if (mprotect(mem, page, PROT_NONE) != 0) abort();
        if (pthread_attr_init(&attr) != 0) return;
        if (pthread_attr_setstack(&attr, mem + page, FZ_SMALL_STACK) == 0 && pthread_create(&tid, &attr, stack_main, NULL) == 0) {
            pthread_detach(tid);
            started = 1;
        }
        pthread_attr_destroy(&attr);
    }
    if (started < 0) return;
    if (verbose > 0) fprintf(stderr, "  on a 64 KiB stack: op %u\n", job.op);
    pthread_mutex_lock(&stack_lock);
    stack_pending = &job;
    stack_busy = 1;
    pthread_cond_broadcast(&stack_cv);
    while (stack_busy) pthread_cond_wait(&stack_cv, &stack_lock);
    pthread_mutex_unlock(&stack_lock);
}

static void run_op(state *s, fz *f, unsigned op) {
    switch (op) {
        case OP_PLAN_INIT: op_plan_init(s, f); break;
        case OP_PROFILE: case OP_PROFILE2: op_profile(s, f, 0); break;
        case OP_PROFILE_HEADS: op_profile(s, f, 1); break;
        case OP_PROFILE_MT: op_profile(s, f, 2); break;
        case OP_CHUNK: case OP_CHUNK2: op_chunk(s, f); break;
        case OP_RESET_FINALIZE: { /* a plan: reset or finalize, grow (byte & 6 == 2), mask (byte & 6 == 4) */
            unsigned b = s->plan_ok ? fz_u8(f) : 0u;
            if (s->plan_ok && (b & 6u) == 2u) op_plan_grow(s, f);
            else if (s->plan_ok && (b & 6u) == 4u) op_plan_mask(s, f);
            else if (s->plan_ok && (b & 1)) {
                if (checked(ei_plan_reset(&s->plan)) == EI_OK) s->plan_dirty = 0; /* every row cleared */
                s->plan_trusted = 0;
            }
            else checked(ei_plan_finalize(s->ctx, s->plan_ok ? &s->plan : NULL));
            break;
        }
        case OP_CORRUPT: op_corrupt(s, f); break;
        case OP_ATTENTION: op_attention(s, f, 0); break;
        case OP_ATTENTION_MT: op_attention(s, f, 1); break;
        case OP_DECODER_INIT: op_decoder_init(s, f); break;
        case OP_OBSERVE: case OP_OBSERVE2: op_observe(s, f); break;
        case OP_DECODE: case OP_DECODE2: {
            unsigned sel = fz_u8(f);
            if (sel < 64) op_decode_rows(s, f);
            else op_decode_keep(s, f, sel);
            break;
        }
        case OP_COMPACT: op_compact(s, f); break;
        case OP_DECODER_RESET: if (s->dec_ok) checked(ei_decoder_reset(&s->dec)); else checked(ei_decoder_reset(NULL)); break;
        case OP_SIZES: op_sizes(s, f); break;
        case OP_LAYER: layer_new(s, f); break;
        case OP_SWAP: { ei_context *t = s->ctx; s->ctx = s->alt; s->alt = t; break; } /* plans meet the other context */
        case OP_PLACE: op_place(s, f); break;
        case OP_PLAN_EDIT: if (FAMILY(FAM_PLANEDIT)) op_plan_edit(s, f); break;
        case OP_SMALL_STACK: if (FAMILY(FAM_STACK)) op_small_stack(s, f); break;
        case OP_CELL_POS: op_cell_pos(s, f); break;
        case OP_EDGES: op_edges(s, f); break;
        default: break;
    }
}

/* EI_FUZZ_TIMING=1: the time spent in each op, printed at exit. */
#include <time.h>
static int op_timing = -1;
static double op_seconds[OP_COUNT];
static long op_calls[OP_COUNT];
static void op_timing_print(void) {
    int op, k;
    fprintf(stderr, "placement (kind: conflicts, misaligned, clean, compared, interleaved accepted, EI_OK):\n");
    for (k = 0; k < PL_COUNT; ++k)
        fprintf(stderr, "  %-14s %6ld %6ld %6ld %6ld %6ld %6ld\n", kind_names[k], place_stats[k][0], place_stats[k][1],
                place_stats[k][2], place_stats[k][3], place_stats[k][4], place_stats[k][5]);
    for (op = 0; op < OP_COUNT; ++op)
        if (op_calls[op])
            fprintf(stderr, "  op %2d: %7ld calls, %8.1f us each, %7.3f s\n", op, op_calls[op],
                    1e6 * op_seconds[op] / (double)op_calls[op], op_seconds[op]);
}
static int place_bias = -1;
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f;
    state s;
    int ops = 0;
    memset(&f, 0, sizeof f);
    f.p = data; f.n = size; f.i = 0;
    if (verbose < 0) verbose = getenv("EI_FUZZ_VERBOSE") != NULL;
    if (op_timing < 0 && (op_timing = getenv("EI_FUZZ_TIMING") != NULL) != 0) atexit(op_timing_print);
    memset(&s, 0, sizeof s);
    n_alloc_calls = 0; fail_after = -1; poison_count = 0;
    work_left = FZ_INPUT_WORK;
    threads_left = 1;
    s.ctx = fz_context(&f, NULL);
    if (verbose) {
        const ei_config *c = ei_context_config(s.ctx);
        fprintf(stderr, "ctx: segment %d block %d threshold %lld base %d factors %g..%g per_segment %d ranking %d samples %d top_p %g "
                        "sink %d local %d decode %d window %d gap %d simd %s\n",
                (int)c->segment_size, (int)c->block_size, (long long)c->threshold_len, (int)c->base_budget, c->budget_min_factor,
                c->budget_max_factor, (int)c->per_segment_budget, (int)c->ranking, (int)c->rank_samples, c->top_p,
                (int)c->sink_blocks, (int)c->local_blocks, (int)c->decode_budget, (int)c->window, (int)c->decode_gap,
                ei_simd_name(ei_context_config(s.ctx)->simd));
    }
    fail_after = -1;
    s.alt = fz_context(&f, s.ctx);
    fail_after = -1;
    layer_new(&s, &f);
    while (fz_left(&f) && ops++ < FZ_MAX_OPS && work_left > 0) {
        unsigned byte = fz_u8(&f), op = byte % OP_COUNT;
        /* EI_FUZZ_PLACE_BIAS=k (1..8): an op byte whose top 3 bits are below k runs the placement op (a
           campaign that must run it many times; the other ops still build the state it places) */
        if (place_bias < 0) { const char *e = getenv("EI_FUZZ_PLACE_BIAS"); place_bias = e ? atoi(e) : 0; }
        if ((int)(byte >> 5) < place_bias) op = OP_PLACE;
        if (verbose) fprintf(stderr, "op %u at byte %zu (work left %.0f)\n", op, f.i - 1, work_left);
        if (op_timing) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            run_op(&s, &f, op);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            op_seconds[op] += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            op_calls[op]++;
            continue;
        }
        run_op(&s, &f, op);
    }
    plan_release(&s);
    keep_release(&s);
    wfree(s.dec_mem);
    view_free(&s.q); view_free(&s.k); view_free(&s.v);
    return 0;
}


#ifdef EI_FUZZ_STANDALONE
/* Replay: every file named, or every file in every folder named, once. */
static int replay_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    uint8_t *buf;
    long len;
    if (!fp) { fprintf(stderr, "cannot open %s\n", path); return 1; }
    fseek(fp, 0, SEEK_END);
    len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    buf = (uint8_t *)xalloc((size_t)(len > 0 ? len : 1));
    if (len > 0 && fread(buf, 1, (size_t)len, fp) != (size_t)len) { fclose(fp); free(buf); return 1; }
    fclose(fp);
    {
        struct timespec t0, t1;
        double us;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        LLVMFuzzerTestOneInput(buf, (size_t)(len > 0 ? len : 0));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        us = 1e6 * (double)(t1.tv_sec - t0.tv_sec) + 1e-3 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (op_timing > 0 && us > 1000.0) fprintf(stderr, "slow input (%.0f us): %s\n", us, path);
    }
    free(buf);
    return 0;
}
int main(int argc, char **argv) {
    int i, files = 0, bad = 0;
    for (i = 1; i < argc; ++i) {
        struct stat st;
        if (stat(argv[i], &st) != 0) { fprintf(stderr, "no such input: %s\n", argv[i]); bad++; continue; }
        if (S_ISDIR(st.st_mode)) {
            DIR *dir = opendir(argv[i]);
            struct dirent *e;
            char path[4096];
            while (dir && (e = readdir(dir)) != NULL) {
                if (e->d_name[0] == '.') continue;
                snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
                if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) { bad += replay_file(path); files++; }
            }
            if (dir) closedir(dir);
        } else { bad += replay_file(argv[i]); files++; }
    }
    printf("fuzz replay: %d inputs, %d unreadable\n", files, bad);
    return bad ? 1 : 0;
}
#endif
#ifdef FZ_PRAGMA_PUSHED
#pragma clang attribute pop
#endif
