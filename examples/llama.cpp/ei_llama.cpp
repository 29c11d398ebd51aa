// ei_llama.cpp - entropyinfer inside llama.cpp (compiled into libllama by
// entropyinfer.patch; the entry points are described in ei_llama.h).
//
// What runs where
//   A layer is served when its attention is plain causal softmax attention
//   over the KV cache: no sliding window, soft-capping, ALiBi, sinks, KQ bias
//   or MLA, equal K/V head sizes, an F16/BF16/F32 cache and a head-major V
//   (flash attention on; with it off llama.cpp stores V transposed).
//   A ubatch is served when llama_decode announced it, it has at least
//   min_tokens tokens (default 32), each sequence's tokens are one run of
//   consecutive positions (a unified cache: any mix of sequences in the
//   call's order; --no-kv-unified: equal runs, streams in order), and each
//   sequence's cells in view hold each of its positions below the run's end
//   at most once, the run's own among them (ei_slices_of). A sequence's keys
//   are those cells in position order: a view of the cache when they run in
//   order (from cell 0, or from a later cell: a slot of a unified cache), else
//   gathered by ei_op_gather (slots whose cells interleave; CPU layers only, a
//   GPU layer runs llama.cpp's attention for such ubatches). A sequence that
//   misses positions (a compressed or cut prefix) is attended densely over
//   the cells it has (as llama.cpp's mask lets it).
//   Each sequence has its own plan per layer and is planned and attended as
//   its own, whatever the cache's layout: a ubatch of 4 sequences of 128 tokens
//   gives the perplexity of one sequence per ubatch of 128 tokens, to the
//   last digit (llama-perplexity -c 2048 -b 8192 -ub 512 -no-kvu against
//   -b 2048 -ub 128, SmolLM2: 21.9293 both; and -c 512 -b 2048 -ub 2048, 4 sequences a ubatch, unified
//   cache and -no-kvu: 13.9518 both). Everything else runs llama.cpp's own attention, and the
//   reason is printed once on stderr ("entropyinfer: ..."); ubatches below
//   min_tokens (decoding) are a choice and not reported.
//
//   For a served layer and ubatch the graph holds three ggml custom ops in
//   place of llama.cpp's attention nodes:
//     ei_profile   ei_profile_chunk in parts over ggml's threads (ei_exec ith/nth: kv-head ranges)
//     ei_finalize  ei_plan_finalize, one thread (and the density statistics)
//     ei_attn      ei_attention_prefill in parts (ei_exec ith/nth) into [head_dim*n_head, n_tokens]
//   The parts of both share the state's one host workspace, sized by ei_layer_sizes for the most
//   threads ggml gives an op (n_threads or n_threads_batch, whichever is larger).
//   Q is llama.cpp's f32 post-RoPE query, K and V are views of the cache (no
//   copies). The ubatch's first position and is_final are read at compute
//   time (set_input of a graph input of ours), and that input's can_reuse
//   makes llama.cpp rebuild the graph whenever the serve decision or the
//   number of cells in the K/V views changes. A failing library call is
//   reported with ei_last_error(): planning falls back to entropyinfer's dense
//   attention for that ubatch, an attention failure retries without the plan.
//
// Decode compression (on with --entropyinfer; compress=0 turns it off)
//   Per sequence: each sequence of the context (n_seq_max) has its own decoder in every served
//   layer (made on its first observed ubatch, ei_seq_decoders), its own keep set and evictions.
//   An observe op in every served layer copies each sequence's queries of the ubatch into that
//   sequence's decoder (ei_observe_decide: a sequence's rows are its own; with --kv-unified off
//   llama.cpp gives each sequence one run of the ubatch, in a unified cache a ubatch holds the
//   call's tokens in their order and each sequence is observed run by run; its positions
//   continue its last ubatch or restart at 0; a token that is the only position of its sequence
//   in the llama_decode call is a generated token). At the end of llama_decode, for every sequence
//   whose decoders are due (decode_gap generated tokens, then every recompress_every),
//   llama_ei_compress scores that sequence's cells in its KV stream (the stream's rows of the K
//   storage; with --kv-unified off a stream of its own, in a unified cache the shared one) in
//   every layer of the KV cache (ei_decode_score in parts over the context's threads, one shared
//   workspace; rows mapped to the
//   sequence's positions, empty cells and other sequences' cells ignored), adds them into one
//   score per cell (ei_decode_shared_add: each layer weighs 1), keeps decode_budget cells with the
//   window (ei_decode_select_shared), evicts the sequence's other positions with seq_rm of that
//   sequence (a cell it shares with another sequence, e.g. a prefix after seq_cp, stays the
//   other's) and moves the stream's cells in use to the front (llama_kv_cache::ei_compact, added
//   by the patch: every sequence's cells of the stream, in cell order) so that attention reads
//   fewer cells. iSWA models (Gemma 3): only the base cache of the global layers is compressed;
//   the sliding-window cache keeps its cells. Refused with a message, compression then off for
//   the context: a KV cache with a layer that is not served, recurrent/hybrid memory, a pending
//   context shift, several positions per token (M-RoPE); for one sequence (until it starts again
//   at position 0): its tokens of a ubatch out of position order, a library call that fails.
//   The exit line counts the distinct sequences compressed ("compressions C of N sequences") and
//   those with a served ubatch ("ubatches S/T of N sequences", when more than one).
//
// Positions after compression (issue 34)
//   The cache records the positions it evicted (llama_kv_cache::ei_evict);
//   llama_entropyinfer_seq_first_missing gives the first one, and seq_rm
//   refuses a truncation that would keep it (llama.cpp's "partial removal not
//   possible": the caller clears the sequence and processes its prompt again),
//   so a reused prefix is always exact. Speculative decoding takes back its
//   draft tokens with llama_entropyinfer_seq_rewind. When positions jump (a
//   reuse, a rewind, a context shift), observation starts over at the new
//   position if the prefix below it is exact (or after a rewind); over a
//   compressed prefix compression pauses for the sequence until it is exact
//   again. llama_entropyinfer_seq_set_enabled turns entropyinfer (prefill and
//   decode compression) off or on per sequence (llama-server: a request's
//   "entropyinfer": false). All of this is per sequence: rewinds, pauses and
//   restarts of one sequence leave the others' decoders as they are.
//
// On the GPU (llama.cpp's CUDA backend, -ngl, built by `make llama-cpp-cuda`)
//   A layer whose K/V cache lies in CUDA memory is served by the CUDA plugin
//   (libentropyinfer_cuda.so, loaded by the header): the same ops, registered
//   with ggml-cuda as CUDA twins of the custom ops (the patch adds
//   ggml_backend_cuda_register_custom_op), run on ggml's CUDA stream over the
//   device tensors: ei_profile_chunk (every kv head in one call, the plan in
//   device memory), ei_attention_prefill, ei_decode_observe into a device
//   decoder. No host copy of Q/K/V and no synchronisation inside a layer: the
//   GPU contexts defer data errors (cfg.cuda_deferred_errors), read back with
//   ei_cuda_status between llama_decode calls, with the keep counts of the
//   density line (ei_gpu_settle: no wait between the ubatches of one call). ggml-cuda never captures a graph holding a custom op into a CUDA
//   graph (the ops read the ubatch's position when they run). Decode
//   compression keeps each sequence's decoders in device memory (made as on
//   the CPU, on the sequence's first ubatch), scores, pools and selects on the
//   device (one synchronising call per sequence compressed at the end of
//   llama_decode), then evicts and compacts as on the CPU. gpu_timing=1
//   times the GPU ops with a synchronisation around each (a measurement
//   mode; the time-dense mode times llama.cpp's attention the same way). Served only on CUDA device 0 with an F16 or BF16 cache and
//   head sizes 64/128/256 (the GPU kernels'); other GPU backends (Metal,
//   Vulkan, ...) and layers run llama.cpp's attention, reported once.
//
// Modes (--entropyinfer-opt mode=...)
//   sparse      (default) planning + block-sparse attention
//   ei-dense    entropyinfer's attention kernel without a plan (dense causal)
//   time-dense  llama.cpp's own attention, timed in the layers and ubatches
//               entropyinfer would serve (numerics of unpatched llama.cpp)
//
// At exit one line sums the run: layers served, ubatches served, the density
// of the sparse segments (keys attended / keys of dense causal attention,
// summed over their queries and kv heads), and the wall time of planning, of
// entropyinfer's attention and of llama.cpp's attention (time-dense), each
// from the first of ggml's threads entering the op to the last leaving it.

#define ENTROPYINFER_IMPLEMENTATION
#include "entropyinfer.h"

#include "ei_llama.h"

#include "llama-arch.h"
#include "llama-batch.h"
#include "llama-context.h"
#include "llama-cparams.h"
#include "llama-graph.h"
#include "llama-hparams.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-memory-hybrid.h"
#include "llama-memory-hybrid-iswa.h"
#include "llama-model.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

// ---------------------------------------------------------------- options

enum ei_mode { EI_MODE_SPARSE = 0, EI_MODE_EI_DENSE = 1, EI_MODE_TIME_DENSE = 2 };
// Tokens a CPU plan holds when made; it doubles (ei_plan_grow) as a prompt passes it, up to the
// stream's cells, so plans cost what the prompts hold, not the context (69 bytes per token per
// layer for 32/8 heads of 128: LIMITS in entropyinfer.h)
static const int64_t EI_PLAN_FIRST = 4096;
static const char * const k_mode_names[] = { "sparse", "ei-dense", "time-dense" };
// Who runs the sparse attention: the library's kernels in a custom op (the CPU's SIMD paths, the
// CUDA plugin), or llama.cpp's own attention (ggml_flash_attn_ext, or soft_max without -fa) with the
// plan turned into its KQ mask by ei_plan_mask (and the sparse-mask hint n_kv_max: the route that
// reaches ggml's other backends, README "Two executors")
enum ei_executor { EI_EXEC_OP = 0, EI_EXEC_MASK = 1 };
static const char * const k_executor_names[] = { "op", "mask" };

struct ei_options {
    bool      enabled    = false;
    ei_config cfg        = ei_config_default();
    int       min_tokens = 32;
    ei_mode   mode       = EI_MODE_SPARSE;
    ei_executor executor = EI_EXEC_OP;
    bool      compress   = true; // decode compression (observe, keep-set, evict)
    // decode_budget given by the user: with decode_budget_ratio > 0 the glue otherwise raises the
    // budget's cap to the context's cells, so that the ratio alone decides (the library caps a
    // ratio budget at decode_budget, 1024 by default: 1/4 of 8k would silently become 1/8)
    bool      budget_set = false;
    bool        gpu          = true;  // serve layers whose cache is in CUDA memory (the CUDA plugin)
    bool        gpu_timing   = false; // time the GPU ops, synchronising around each
    // keep_keys=1: plans made with EI_PLAN_KEEP_KEYS, so that each micro-batch's planning reads
    // only the new keys' block min/max (head_dim bytes more plan memory per cell and kv head)
    bool        keep_keys    = false;
    std::string cuda_library;         // the plugin's path (empty: $EI_CUDA_LIBRARY, then the header's search)
};

static ei_options & ei_opts() {
    static ei_options o;
    return o;
}

enum ei_field_kind { EI_FIELD_I32, EI_FIELD_I64, EI_FIELD_F64, EI_FIELD_F32, EI_FIELD_SIMD, EI_FIELD_POOL, EI_FIELD_REDUCE,
                     EI_FIELD_RANKING, EI_FIELD_ROWS, EI_FIELD_PRECISION, EI_FIELD_POLICY, EI_FIELD_SHARED };

struct ei_field {
    const char *  name;
    ei_field_kind kind;
    size_t        offset;
};

#define EI_FIELD(name, kind) { #name, kind, offsetof(ei_config, name) }
static const ei_field k_fields[] = {
    EI_FIELD(segment_size,       EI_FIELD_I32),
    EI_FIELD(block_size,         EI_FIELD_I32),
    EI_FIELD(threshold_len,      EI_FIELD_I64),
    EI_FIELD(base_budget,        EI_FIELD_I32),
    EI_FIELD(rigid_entropy,      EI_FIELD_F64),
    EI_FIELD(delta_t,            EI_FIELD_F64),
    EI_FIELD(alpha,              EI_FIELD_F64),
    EI_FIELD(budget_min_factor,  EI_FIELD_F64),
    EI_FIELD(budget_max_factor,  EI_FIELD_F64),
    EI_FIELD(last_segment_dense, EI_FIELD_I32),
    EI_FIELD(per_segment_budget, EI_FIELD_I32),
    EI_FIELD(ranking,            EI_FIELD_RANKING),
    EI_FIELD(rank_samples,       EI_FIELD_I32),
    EI_FIELD(rank_rows,          EI_FIELD_ROWS),
    EI_FIELD(rank_precision,     EI_FIELD_PRECISION),
    EI_FIELD(top_p,              EI_FIELD_F64),
    EI_FIELD(sink_blocks,        EI_FIELD_I32),
    EI_FIELD(local_blocks,       EI_FIELD_I32),
    EI_FIELD(simd,               EI_FIELD_SIMD),
    // decode compression (one keep-set per sequence: gqa_reduce reduces all heads of a layer;
    // decode_scale is the model's kq_scale of each layer)
    EI_FIELD(decode_budget,      EI_FIELD_I32),
    EI_FIELD(window,             EI_FIELD_I32),
    EI_FIELD(decode_gap,         EI_FIELD_I32),
    EI_FIELD(pool,               EI_FIELD_POOL),
    EI_FIELD(pool_kernel,        EI_FIELD_I32),
    EI_FIELD(gqa_reduce,         EI_FIELD_REDUCE),
    EI_FIELD(recompress_every,   EI_FIELD_I32),
    // decode policies (issue 37): every policy runs through the same observe / score / shared_add /
    // select_shared / evict path below, so they compare at equal budgets. snapkv scores with the
    // last `window` prompt queries (observed by every prompt ubatch), h2o sums the attention of the
    // queries observed (decode_positions: the context's cells unless given)
    EI_FIELD(decode_policy,        EI_FIELD_POLICY),
    EI_FIELD(decode_sink,          EI_FIELD_I32),
    EI_FIELD(decode_budget_ratio,  EI_FIELD_F64),
    EI_FIELD(decode_budget_min,    EI_FIELD_I32),
    EI_FIELD(decode_positions,     EI_FIELD_I64),
    EI_FIELD(decode_shared_weight, EI_FIELD_SHARED),
    EI_FIELD(decode_recent,        EI_FIELD_F32),
};
#undef EI_FIELD

static bool ei_parse_int(const std::string & s, long long lo, long long hi, long long & out) {
    if (s.empty()) {
        return false;
    }
    errno = 0;
    char * end = nullptr;
    const long long v = strtoll(s.c_str(), &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi) {
        return false;
    }
    out = v;
    return true;
}

static bool ei_parse_double(const std::string & s, double & out) {
    if (s.empty()) {
        return false;
    }
    errno = 0;
    char * end = nullptr;
    const double v = strtod(s.c_str(), &end);
    if (errno != 0 || *end != '\0' || !std::isfinite(v)) {
        return false;
    }
    out = v;
    return true;
}

// value: a name of the list (its index) or the index itself
static bool ei_parse_enum(const std::string & s, const char * const * names, int n, int & out) {
    for (int i = 0; i < n; ++i) {
        if (s == names[i]) {
            out = i;
            return true;
        }
    }
    long long v;
    if (ei_parse_int(s, 0, n - 1, v)) {
        out = (int) v;
        return true;
    }
    return false;
}

static std::string ei_names(const char * const * names, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
        s += (i ? "|" : "");
        s += names[i];
    }
    return s;
}

static const char * const k_simd_names[]   = { "auto", "scalar", "avx2", "avx512", "neon", "avx512_bf16" };
static const char * const k_pool_names[]   = { "avg", "max", "none" };
static const char * const k_reduce_names[] = { "mean", "max" };
static const char * const k_ranking_names[] = { "reference", "sampled" };
static const char * const k_rows_names[] = { "even", "spread" }; // ei_rank_rows
static const char * const k_precision_names[] = { "f32", "int8" }; // ei_rank_precision
// in the order of the enums ei_decode_policy and ei_shared_weight
static const char * const k_policy_names[] = { "entropyinfer", "streaming", "snapkv", "h2o" };
static const char * const k_shared_names[] = { "equal", "entropy" };

// The enum fields of ei_config: their value names (in the enum's order), by field kind.
struct ei_enum_names {
    ei_field_kind       kind;
    const char * const * names;
    int                 n;
};
static const ei_enum_names k_enum_names[] = {
    { EI_FIELD_SIMD,    k_simd_names,    6 },
    { EI_FIELD_POOL,    k_pool_names,    3 },
    { EI_FIELD_REDUCE,  k_reduce_names,  2 },
    { EI_FIELD_RANKING, k_ranking_names, 2 },
    { EI_FIELD_ROWS,    k_rows_names,    2 },
    { EI_FIELD_PRECISION, k_precision_names, 2 },
    { EI_FIELD_POLICY,  k_policy_names,  4 },
    { EI_FIELD_SHARED,  k_shared_names,  2 },
};
// (the enum fields are stored as int: ei_set_one copies an int into them)
static_assert(sizeof(ei_simd) == sizeof(int) && sizeof(ei_pool) == sizeof(int) && sizeof(ei_reduce) == sizeof(int) &&
              sizeof(ei_ranking) == sizeof(int) && sizeof(ei_rank_rows) == sizeof(int) && sizeof(ei_rank_precision) == sizeof(int) &&
              sizeof(ei_decode_policy) == sizeof(int) &&
              sizeof(ei_shared_weight) == sizeof(int), "ei_config's enum fields are int-sized");

static const ei_enum_names * ei_enum_of(ei_field_kind kind) {
    for (const ei_enum_names & e : k_enum_names) {
        if (e.kind == kind) {
            return &e;
        }
    }
    return nullptr;
}

static bool ei_set_one(const std::string & item, std::string & err) {
    ei_options & o = ei_opts();
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
        err = "expected NAME=VALUE, got '" + item + "'";
        return false;
    }
    const std::string name = item.substr(0, eq), value = item.substr(eq + 1);
    long long iv;
    double dv;
    int ev;
    if (name == "min_tokens") {
        if (!ei_parse_int(value, 1, INT32_MAX, iv)) {
            err = "min_tokens: expected an integer >= 1, got '" + value + "'";
            return false;
        }
        o.min_tokens = (int) iv;
        return true;
    }
    if (name == "gpu" || name == "gpu_timing" || name == "keep_keys") {
        if (!ei_parse_int(value, 0, 1, iv)) {
            err = name + ": expected 0 or 1, got '" + value + "'";
            return false;
        }
        (name == "gpu" ? o.gpu : name == "gpu_timing" ? o.gpu_timing : o.keep_keys) = iv != 0;
        return true;
    }
    if (name == "cuda_library") {
        o.cuda_library = value;
        return true;
    }
    if (name == "compress") {
        if (!ei_parse_int(value, 0, 1, iv)) {
            err = "compress: expected 0 or 1, got '" + value + "'";
            return false;
        }
        o.compress = iv != 0;
        return true;
    }
    if (name == "mode" || name == "executor") { // the glue's own enum options
        const bool          is_mode = name == "mode";
        const char * const * names  = is_mode ? k_mode_names : k_executor_names;
        const int           n       = is_mode ? 3 : 2;
        if (!ei_parse_enum(value, names, n, ev)) {
            err = name + ": expected " + ei_names(names, n) + ", got '" + value + "'";
            return false;
        }
        if (is_mode) {
            o.mode = (ei_mode) ev;
        } else {
            o.executor = (ei_executor) ev;
        }
        return true;
    }
    if (name == "preset") { // the library's measured-best ranking and budgets over the paper's configuration
        if (value != "quality" && value != "paper") {
            err = "preset: expected quality|paper, got '" + value + "'";
            return false;
        }
        const ei_config q = value == "quality" ? ei_config_quality() : ei_config_default();
        o.cfg.ranking      = q.ranking;
        o.cfg.rank_samples = q.rank_samples;
        o.cfg.rank_rows    = q.rank_rows;
        o.cfg.rank_precision = q.rank_precision;
        o.cfg.top_p        = q.top_p;
        o.cfg.sink_blocks  = q.sink_blocks;
        o.cfg.local_blocks = q.local_blocks;
        o.cfg.budget_max_factor = q.budget_max_factor; // the top-p counts' cap (quality: 4x base; until 2026-12-07 the glue left the paper's 3x)
        return true;
    }
    if (name == "attn_scale" || name == "decode_scale") {
        err = name + " is the model's (llama.cpp's kq_scale of each layer) and cannot be set";
        return false;
    }
    for (const ei_field & f : k_fields) {
        if (name != f.name) {
            continue;
        }
        char * p = (char *) &o.cfg + f.offset;
        bool ok = false;
        switch (f.kind) {
            case EI_FIELD_I32:
                ok = ei_parse_int(value, INT32_MIN, INT32_MAX, iv);
                if (ok) { int32_t x = (int32_t) iv; memcpy(p, &x, sizeof x); }
                break;
            case EI_FIELD_I64:
                ok = ei_parse_int(value, INT64_MIN, INT64_MAX, iv);
                if (ok) { int64_t x = (int64_t) iv; memcpy(p, &x, sizeof x); }
                break;
            case EI_FIELD_F64:
                ok = ei_parse_double(value, dv);
                if (ok) { memcpy(p, &dv, sizeof dv); }
                break;
            case EI_FIELD_F32:
                ok = ei_parse_double(value, dv) && std::fabs(dv) <= 3.0e38;
                if (ok) { float x = (float) dv; memcpy(p, &x, sizeof x); }
                break;
            default: { // an enum field: its names, or its index
                const ei_enum_names * e = ei_enum_of(f.kind);
                ok = e && ei_parse_enum(value, e->names, e->n, ev);
                if (ok) { memcpy(p, &ev, sizeof ev); }
                break;
            }
        }
        if (ok && name == "decode_budget") {
            o.budget_set = true;
        }
        if (!ok) {
            const ei_enum_names * e = ei_enum_of(f.kind);
            const std::string what =
                f.kind == EI_FIELD_I32 || f.kind == EI_FIELD_I64 ? std::string("an integer") :
                f.kind == EI_FIELD_F64 || f.kind == EI_FIELD_F32 ? std::string("a finite number") :
                e ? ei_names(e->names, e->n) + " or 0.." + std::to_string(e->n - 1) : std::string("a value");
            err = std::string(f.name) + ": expected " + what + ", got '" + value + "'";
            return false;
        }
        return true;
    }
    err = "unknown option '" + name + "' (known: ";
    for (const ei_field & f : k_fields) {
        err += f.name;
        err += ", ";
    }
    err += "min_tokens, mode, executor, preset, compress, gpu, gpu_timing, cuda_library)";
    return false;
}

// ---------------------------------------------------------------- reports and statistics

static int64_t ei_now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::steady_clock::now().time_since_epoch()).count();
}

static std::mutex & ei_mutex() {
    static std::mutex m;
    return m;
}

// One line on stderr per kind of message: messages that differ only in numbers (layer,
// positions, cells) are one kind, so each situation is reported once.
static void ei_report_once(const std::string & msg) {
    static std::set<std::string> seen;
    std::string key;
    for (char c : msg) {
        if (c < '0' || c > '9') {
            key += c;
        }
    }
    std::lock_guard<std::mutex> lock(ei_mutex());
    if (seen.insert(key).second) {
        fprintf(stderr, "entropyinfer: %s\n", msg.c_str());
        fflush(stderr);
    }
}

struct ei_stats {
    int     n_layer         = 0;
    int     layers_served   = 0;
    int     layers_gpu      = 0; // of them, served on the GPU
    int64_t gpu_plan_bytes  = 0, gpu_dec_bytes = 0, gpu_ws_bytes = 0; // device memory of a context
    int64_t cpu_plan_bytes  = 0; // host memory of a context's plans (they grow with the prompts: the most)
    int64_t ubatches        = 0; // announced by llama_decode
    int64_t ubatches_served = 0; // with entropyinfer (time-dense: timed)
    double  kept            = 0; // keys attended by the queries of sparse segments (per kv head)
    double  causal          = 0; // keys a dense causal attention would attend for the same queries
    int64_t ns_plan         = 0;
    int64_t ns_attn         = 0;
    int64_t ns_dense        = 0; // llama.cpp's attention (time-dense)
    int32_t seqs_served     = 0; // distinct sequences with a served ubatch (summed over contexts)
    // decode compression (cells and bytes: the compressed sequence's, at the first compression and the last)
    int32_t compressions    = 0;
    int32_t seqs_compressed = 0; // distinct sequences compressed (summed over contexts)
    int64_t cells_before    = 0, cells_after = 0, bytes_before = 0, bytes_after = 0;
    int64_t ns_compress     = 0;

    void add(const ei_stats & o) {
        if (o.compressions > 0) {
            if (compressions == 0) {
                cells_before = o.cells_before;
                bytes_before = o.bytes_before;
            }
            cells_after  = o.cells_after;
            bytes_after  = o.bytes_after;
        }
        compressions    += o.compressions;
        seqs_compressed += o.seqs_compressed;
        seqs_served     += o.seqs_served;
        ns_compress     += o.ns_compress;
        n_layer          = std::max(n_layer, o.n_layer);
        layers_served    = std::max(layers_served, o.layers_served);
        layers_gpu       = std::max(layers_gpu, o.layers_gpu);
        gpu_plan_bytes   = std::max(gpu_plan_bytes, o.gpu_plan_bytes);
        cpu_plan_bytes   = std::max(cpu_plan_bytes, o.cpu_plan_bytes);
        gpu_dec_bytes    = std::max(gpu_dec_bytes, o.gpu_dec_bytes);
        gpu_ws_bytes     = std::max(gpu_ws_bytes, o.gpu_ws_bytes);
        ubatches        += o.ubatches;
        ubatches_served += o.ubatches_served;
        kept            += o.kept;
        causal          += o.causal;
        ns_plan         += o.ns_plan;
        ns_attn         += o.ns_attn;
        ns_dense        += o.ns_dense;
    }
};

struct ei_global {
    ei_stats                       done;      // of freed contexts
    std::set<llama_ei_state *>     live;
    int                            contexts = 0;
};

static ei_global & ei_glob() {
    static ei_global * g = new ei_global; // never destroyed: read by the atexit handler
    return *g;
}

// ---------------------------------------------------------------- per-context state

// Wall time of one custom-op call over ggml's threads: from the first thread
// in to the last thread out.
struct ei_timer {
    std::atomic<int>     in{0};
    std::atomic<int>     out{0};
    std::atomic<int64_t> t0{0};

    void reset() {
        in  = 0;
        out = 0;
    }
    void enter() {
        if (in.fetch_add(1) == 0) {
            t0 = ei_now_ns();
        }
    }
    // the elapsed ns for the last of nth threads, -1 for the others
    int64_t leave(int nth) {
        if (out.fetch_add(1) + 1 == nth) {
            return ei_now_ns() - t0.load();
        }
        return -1;
    }
};

// One sequence's decoder in one layer (decode compression). Made lazily, when the sequence's
// first ubatch is observed (ei_seq_decoders, from set_input: the main thread, before the graph
// runs), not for all n_seq_max sequences up front: an H2O decoder holds n_heads x decode_positions
// floats (4x the context's cells: SmolLM2 at 8k cells, 9 heads x 32k x 4 bytes = 1.2 MB per layer
// and sequence, 141 MB for 30 layers x 4 sequences), and many contexts with several sequences
// never generate (perplexity, embeddings) or use only some of them (a server's idle slots).
struct ei_seq_decoder {
    ei_decoder           dec   = {};
    std::vector<uint8_t> mem;             // its ring (host)
    void *               g_mem = nullptr; // its ring (device: a layer on the GPU)
    bool                 has   = false;
};

struct ei_layer {
    llama_ei_state * st       = nullptr;
    int              il       = -1;
    int              status   = 0;       // 0: not seen yet, 1: served, -1: not served
    ei_context *     ctx      = nullptr; // owned by the state (one per attention scale)
    ei_context *     ctx_plan = nullptr; // planning's: attn_scale * the Q pre-scale it undoes (ei_raw_query)
    // one plan per sequence (n_seq_max), made when a ubatch first plans that sequence (ei_layer_plan)
    std::vector<ei_plan> plans;
    std::vector<uint8_t> has_plan;
    int32_t          n_head = 0, n_head_kv = 0, head_dim = 0;
    size_t           k_row = 0, v_row = 0; // bytes of a cell's K and V rows (a gathered row, ei_op_gather)

    // this ubatch
    bool             use_plan = false;
    std::atomic<int> failed{0};
    std::string      error;
    ei_timer         t_plan, t_attn;
    int64_t          ns_plan = 0;
    int64_t          t_dense0 = 0;

    // decode compression: the observation window of each sequence (ei_seq_decoder, by sequence id:
    // the context's n_seq_max, each made on its sequence's first observed ubatch, ei_seq_decoders)
    bool                 has_dec   = false; // this layer observes (its graph has the observe op)
    size_t               dec_bytes = 0;     // one decoder's memory (ei_sizes.decoder)
    std::vector<ei_seq_decoder> decs;

    // on the GPU (the cache in CUDA memory): ctx/ctx_plan are CUDA contexts on the null stream (sizes,
    // allocations); the ops take the stream's contexts (ei_gpu_context)
    bool                 gpu = false;
    float                scale = 0.0f, scale_plan = 0.0f;
    std::vector<std::array<int64_t, 3>> stat_pending; // GPU: (sequence, q_pos, n) of this ubatch, read at the next settle
    int64_t              plan_tokens = 0;              // the most a plan holds: the cells of a stream
    int64_t              plan_bytes  = 0;              // what its CPU plans hold now (they grow)
    ei_sizes             sizes = {};                   // its buffers (ei_layer_sizes at setup: plan_tokens rows,
                                                       // the state's ws_threads on the CPU, one call on the GPU)

    void fail(const char * what) {
        int expected = 0;
        if (failed.compare_exchange_strong(expected, 1)) {
            error = std::string(what) + ": " + ei_last_error();
        }
    }
};

struct llama_ei_state {
    ei_options                             opts;
    int                                    n_layer = 0;
    std::vector<std::unique_ptr<ei_layer>> layers;
    std::map<uint32_t, ei_context *>       ctxs;          // by the bits of the attention scale
    ei_context *                           ctx0 = nullptr; // the configuration as given (checks)
    void *                                 ws = nullptr;  // the host ops' one workspace (every part passes it)
    size_t                                 ws_bytes = 0;
    int                                    ws_threads = 0; // the parts it is sized for (ei_layer_sizes' n_threads)

    // the ubatch llama_decode is processing (announced), and the one computed
    const llama_pos * ann_pos  = nullptr;
    uint32_t          ann_n    = 0;
    bool              ann_last = false;
    // the served ubatch's sequences (ei_slices_of, set_input), one slice each: its run of the
    // ubatch's rows and where its keys are. Keys are the sequence's cells that hold positions
    // below the run's end, in position order: m rows, the run's queries the last n of them.
    // planned: m == q_pos + n (no position missing: rows are positions), planned with the
    // sequence's plan; otherwise (a compressed prefix) dense attention over the m rows. The rows
    // are a view of the K/V views (stream `view`, from cell c0) when the cells run in order, else
    // gathered into the state's buffer (ei_op_gather; CPU layers only).
    struct ei_slice {
        int64_t q_pos;    // position of the run's first token
        int32_t r0, n;    // rows [r0, r0 + n) of the ubatch
        int32_t seq;      // its sequence: the plan's slot
        int32_t view;     // stream index in the K/V views (--kv-unified off: one per sequence)
        bool    planned;  // no position missing below q_pos + n
        int64_t m;        // key rows; the first query is row m - n
        int64_t c0;       // the rows are cells c0 .. c0 + m - 1 of the view, or -1: gathered
        int64_t g0;       // gathered: its cells are cell_gather[g0 .. g0 + m) (the gathered slices' cells one
                          // after another, so its rows start g0 rows into a layer's gather: ei_gathered); else -1
    };
    std::vector<ei_slice> slices;
    std::vector<int32_t>  cell_gather;          // the gathered slices' cells, in position order (ei_set_slices)
    std::vector<uint8_t>  gather;               // their K and V rows (ei_op_gather), every CPU layer in turn
    int               is_final = 0;
    uint32_t          ann_n_all = 0;

    // decode compression, per sequence (ei_observe_decide, llama_ei_compress): each sequence of the
    // context (n_seq_max) has its own decoders (ei_layer::decs), keep set and evictions
    struct ei_seq_state {
        bool    started   = false; // observed since its (re)start
        bool    off       = false; // refused for this sequence (reported) until it starts again at position 0
        bool    has_dec   = false; // its decoders are made (ei_seq_decoders)
        int64_t next_pos  = -1;    // the position after its last observed token
        bool    active    = false; // this ubatch's rows of it are observed
        int     generated = 0;     // ... as generated tokens
        bool    paused    = false; // a jump over a compressed prefix (ei_observe_decide)
        bool    rewound   = false; // llama_entropyinfer_seq_rewind since its last ubatch
        bool    one       = false; // the llama_decode call holds one position of it (a generated token)
        bool    served    = false; // a ubatch of it was served (statistics)
        // this ubatch's rows of the sequence: runs [r0, r1) of consecutive rows, the first's position
        // (the positions continue from run to run)
        std::vector<std::array<int64_t, 3>> runs;
        // its compressions (llama_entropyinfer_get_seq_decode_info)
        int32_t compressions = 0;
        int64_t cells_before = 0, cells_after = 0, bytes_before = 0, bytes_after = 0, ns_compress = 0;
    };
    std::vector<ei_seq_state>         seqs;                  // by sequence id (n_seq_max)
    bool                              dec_off       = false; // refused for this context (reported)
    bool                              obs_any       = false; // this ubatch has observed rows
    int                               n_threads     = 1;
    std::vector<uint8_t>              dec_ws;                // the scoring's one workspace (every part passes it)
    std::vector<float>                dec_scores, dec_shared;
    std::vector<int32_t>              dec_row_pos, dec_index, dec_positions;
    // per-request on/off (llama_entropyinfer_seq_set_enabled): a sequence's own setting, else all_on
    bool                              all_on        = true;
    std::map<llama_seq_id, bool>      seq_on;

    // the GPU (ei_gpu_*): contexts by (attention scale, stream, deferred errors), device buffers
    std::map<std::tuple<uint32_t, void *, int>, ei_context *> gctxs;
    ei_context *                      gsetup   = nullptr; // CUDA, null stream: allocations and frees
    void *                            g_stream = nullptr; // the stream of the last GPU op
    bool                              g_pending = false;  // GPU ops queued since the last ei_gpu_settle
    bool                              g_settle_next = false; // a GPU ubatch ended inside a segment: settle at the next
    std::vector<std::pair<void *, size_t>> gbuf;          // device buffers by ei_gpu_buf slot
    std::vector<int32_t>              g_counts;           // keep counts read back
    int64_t                           g_buf_bytes = 0;    // the most gbuf held at once

    ei_stats          stats;
};

// device buffers of the state, by slot (grown, never shrunk)
enum ei_gpu_slot { EI_G_PROFILE_WS = 0, EI_G_ATTN_WS, EI_G_SCRATCH, EI_G_ROW_POS, EI_G_SCORES, EI_G_SHARED, EI_G_INDEX, EI_G_POSITIONS,
                   EI_G_DECODE_WS, EI_G_SLOTS };

static void ei_free_ws(llama_ei_state * st) {
    free(st->ws);
    st->ws       = nullptr;
    st->ws_bytes = 0;
}

// The host workspace of at least `bytes` (a layer's ei_layer_sizes for st->ws_threads parts; grown,
// never shrunk; graph-build time: no op runs).
static bool ei_ensure_ws(llama_ei_state * st, size_t bytes) {
    if (st->ws && bytes <= st->ws_bytes) {
        return true;
    }
    ei_free_ws(st);
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    st->ws = aligned_alloc(64, rounded);
    if (!st->ws) {
        return false;
    }
    st->ws_bytes = bytes;
    return true;
}

// How a library call runs: part ith of nth (nth >= 2: ggml's threads, or the scoring threads, all
// passing the same workspace), or nth 1: the whole call on the calling thread.
static ei_exec ei_part(int ith, int nth, void * ws, size_t bytes) {
    ei_exec x = {};
    x.ith             = nth > 1 ? ith : 0;
    x.nth             = nth;
    x.workspace       = ws;
    x.workspace_bytes = bytes;
    return x;
}

// The flags of every plan the glue makes: chunked (a prompt comes in micro-batches), and with
// keep_keys=1 the key blocks' min/max kept in the plan.
static uint32_t ei_plan_flags() {
    return EI_PLAN_CHUNKED | (ei_opts().keep_keys ? EI_PLAN_KEEP_KEYS : 0u);
}

// Every buffer of a layer's calls (ei_layer_sizes) over max_tokens cache rows, on n_threads
// threads or parts (the GPU: 1, one launch sequence).
static ei_result ei_sizes_of(const ei_context * c, const ei_layer * L, int64_t max_tokens, int n_threads, ei_sizes * sizes) {
    ei_shape shape   = {};
    shape.max_tokens = max_tokens;
    shape.n_heads    = L->n_head;
    shape.n_kv_heads = L->n_head_kv;
    shape.head_dim   = L->head_dim;
    shape.plan_flags = ei_plan_flags();
    shape.n_threads  = n_threads;
    return ei_layer_sizes(c, &shape, sizes);
}

// ---------------------------------------------------------------- the GPU

// The state's CUDA context for one attention scale on one stream (ggml's, or the null stream for
// sizes and allocations: device memory belongs to the device, not to a stream), deferring data
// errors (the ops of a layer) or waiting for them (decode compression, outside the graph).
// Created on first use; NULL (reported) when the plugin does not load.
static ei_context * ei_gpu_context(llama_ei_state * st, float scale, void * stream, int deferred) {
    uint32_t bits;
    memcpy(&bits, &scale, sizeof bits);
    const auto key = std::make_tuple(bits, stream, deferred);
    auto it = st->gctxs.find(key);
    if (it != st->gctxs.end()) {
        return it->second;
    }
    ei_config cfg = st->opts.cfg;
    cfg.attn_scale           = scale;
    cfg.decode_scale         = scale;
    cfg.backend              = EI_BACKEND_CUDA;
    cfg.cuda_stream          = stream;
    cfg.cuda_deferred_errors = deferred;
    cfg.cuda_library         = st->opts.cuda_library.empty() ? nullptr : st->opts.cuda_library.c_str();
    ei_context * c = nullptr;
    if (ei_context_create(&cfg, &c) != EI_OK) {
        ei_report_once(std::string("the CUDA plugin: ") + ei_last_error());
        return nullptr;
    }
    st->gctxs.emplace(key, c);
    if (!st->gsetup) {
        st->gsetup = c;
    }
    return c;
}

// A device buffer of the state of at least `bytes` (grown, never shrunk; NULL on failure).
static void * ei_gpu_buf(llama_ei_state * st, ei_gpu_slot slot, size_t bytes) {
    st->gbuf.resize(EI_G_SLOTS, { nullptr, 0 });
    auto & b = st->gbuf[slot];
    if (b.first && b.second >= bytes) {
        return b.first;
    }
    ei_device_free(st->gsetup, b.first);
    b = { nullptr, 0 };
    void * p = nullptr;
    if (!st->gsetup || ei_device_alloc(st->gsetup, &p, std::max<size_t>(bytes, 64)) != EI_OK) {
        ei_report_once(std::string("device memory: ") + ei_last_error());
        return nullptr;
    }
    b = { p, std::max<size_t>(bytes, 64) };
    int64_t total = 0;
    for (const auto & x : st->gbuf) {
        total += (int64_t) x.second;
    }
    if (total > st->g_buf_bytes) { // planning and decode-compression buffers: workspaces
        st->stats.gpu_ws_bytes += total - st->g_buf_bytes;
        st->g_buf_bytes = total;
    }
    return p;
}

// Wait for the context's stream (a 4-byte read back), then the time.
static int64_t ei_gpu_time(llama_ei_state * st, const ei_context * c) {
    int32_t tmp = 0;
    void * scratch = ei_gpu_buf(st, EI_G_SCRATCH, 64);
    if (c && scratch) {
        ei_device_copy(c, &tmp, scratch, sizeof tmp, EI_COPY_DEVICE_TO_HOST);
    }
    return ei_now_ns();
}

static void ei_count_density(llama_ei_state * st, const ei_layer * L, const ei_plan & p, const int32_t * keep_count,
                             int64_t q_pos, int64_t n);

// After the GPU ops of ubatches: the data errors they deferred (ei_cuda_status, one record per
// device) and their keep counts (density). It waits for the GPU, so it runs between llama_decode
// calls (at the first ubatch of the next call), before a compression, in the info calls and at
// the context's end, not between the ubatches of one call: a wait there kept llama.cpp from
// preparing the next ubatch (its inputs, the KQ mask of every cell) while the GPU ran this one,
// and cost Gemma 3 270M 1.5 s of a 131072-token prefill in ubatches of 512 (H100). The counts
// read late are those the ubatches used: a segment's keep count changes only when a later chunk
// continues it (then ei_op's ubatch asks for a settle at the next ubatch, g_settle_next) or a
// later call plans it again (the next llama_decode call, after this settle).
static void ei_gpu_settle(llama_ei_state * st) {
    st->g_settle_next = false;
    if (!st->g_pending) {
        return;
    }
    st->g_pending = false;
    ei_context * c = nullptr;
    for (auto & kv : st->gctxs) {
        if (std::get<1>(kv.first) == st->g_stream && std::get<2>(kv.first) == 1) {
            c = kv.second;
            break;
        }
    }
    if (!c) {
        return;
    }
    if (ei_cuda_status(c) != EI_OK) {
        ei_report_once(std::string("a data error on the GPU in a served layer: ") + ei_last_error() +
                       ": that ubatch's attention outputs are unspecified");
    }
    for (auto & L : st->layers) {
        int64_t read = -1; // the sequence whose counts g_counts holds (a call's ubatches: one read)
        bool    ok   = false;
        for (const auto & sp : L->stat_pending) { // (sequence, q_pos, n)
            const ei_plan & p = L->plans[(size_t) sp[0]];
            if (sp[0] != read) {
                read = sp[0];
                st->g_counts.resize((size_t) p.n_kv_heads * (size_t) p.seg_capacity);
                ok = ei_device_copy(c, st->g_counts.data(), p.keep_count, st->g_counts.size() * sizeof(int32_t),
                                    EI_COPY_DEVICE_TO_HOST) == EI_OK;
            }
            if (ok) {
                ei_count_density(st, L.get(), p, st->g_counts.data(), sp[1], sp[2]);
            }
        }
        L->stat_pending.clear();
    }
}

static void ei_print_summary() {
    ei_global & g = ei_glob();
    ei_stats s;
    int contexts;
    ei_mode mode;
    {
        std::lock_guard<std::mutex> lock(ei_mutex());
        s = g.done;
        for (llama_ei_state * st : g.live) {
            s.add(st->stats);
        }
        contexts = g.contexts;
        mode     = ei_opts().mode;
    }
    if (contexts == 0) {
        return;
    }
    char line[1024];
    int  n = snprintf(line, sizeof line, "entropyinfer: mode %s%s, layers %d/%d, ubatches %lld/%lld",
            k_mode_names[mode], mode == EI_MODE_SPARSE && ei_opts().executor == EI_EXEC_MASK ? " (executor mask)" : "",
            s.layers_served, s.n_layer, (long long) s.ubatches_served, (long long) s.ubatches);
    if (s.seqs_served > 1) { // several sequences (of a context, summed over contexts) had served ubatches
        n += snprintf(line + n, sizeof line - n, " of %d sequences", (int) s.seqs_served);
    }
    const bool timing = ei_opts().gpu_timing;
    if (mode == EI_MODE_SPARSE) {
        if (s.causal > 0) {
            n += snprintf(line + n, sizeof line - n, ", density %.4f", s.kept / s.causal);
        } else {
            n += snprintf(line + n, sizeof line - n, ", density 1 (no sparse segment)");
        }
        n += snprintf(line + n, sizeof line - n, ", plan %.3f s", s.ns_plan * 1e-9);
    }
    if (mode != EI_MODE_TIME_DENSE) {
        n += snprintf(line + n, sizeof line - n, ", attention %.3f s", s.ns_attn * 1e-9);
    } else {
        n += snprintf(line + n, sizeof line - n, ", dense-attention %.3f s", s.ns_dense * 1e-9);
    }
    if (s.layers_gpu > 0) { // GPU ops are timed only with gpu_timing=1 (a synchronisation around each)
        n += snprintf(line + n, sizeof line - n, ", backend %s (%d layers on the GPU%s), gpu-memory %.1f MiB "
                      "(plans %.1f, decoders %.1f, workspaces %.1f)",
                      s.layers_gpu == s.layers_served ? "cuda" : "cuda+cpu", s.layers_gpu,
                      timing ? ", timed with synchronisation" : "; times: gpu_timing=1",
                      (s.gpu_plan_bytes + s.gpu_dec_bytes + s.gpu_ws_bytes) / 1048576.0, s.gpu_plan_bytes / 1048576.0,
                      s.gpu_dec_bytes / 1048576.0, s.gpu_ws_bytes / 1048576.0);
    } else if (s.layers_served > 0) {
        n += snprintf(line + n, sizeof line - n, ", backend cpu");
        if (s.cpu_plan_bytes > 0) {
            n += snprintf(line + n, sizeof line - n, ", plans %.2f MiB", s.cpu_plan_bytes / 1048576.0);
        }
    }
    if (s.compressions > 0) {
        n += snprintf(line + n, sizeof line - n, ", compressions %d of %d sequence%s, cells=%lld->%lld, kv-bytes=%lld->%lld, "
                      "compress %.3f s", (int) s.compressions, (int) s.seqs_compressed, s.seqs_compressed == 1 ? "" : "s",
                      (long long) s.cells_before, (long long) s.cells_after,
                      (long long) s.bytes_before, (long long) s.bytes_after, s.ns_compress * 1e-9);
    }
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

// ---------------------------------------------------------------- command line

void llama_entropyinfer_enable(void) {
    static std::once_flag once;
    std::call_once(once, [] {
        // construct what the handler reads before registering it (it runs before their destructors)
        (void) ei_opts();
        (void) ei_mutex();
        (void) ei_glob();
        atexit(ei_print_summary);
    });
    ei_opts().enabled = true;
}

void llama_entropyinfer_reset(void) {
    ei_opts() = ei_options(); // enabled = false, the paper's configuration
}

int llama_entropyinfer_option(const char * name_values, char * err, size_t err_size) {
    std::string s = name_values ? name_values : "", msg;
    size_t start = 0;
    while (true) {
        const size_t comma = s.find(',', start);
        const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (!ei_set_one(item, msg)) {
            if (err && err_size) {
                snprintf(err, err_size, "%s", msg.c_str());
            }
            return -1;
        }
        if (comma == std::string::npos) {
            break;
        }
        start = comma + 1;
    }
    llama_entropyinfer_enable();
    return 0;
}

const char * llama_entropyinfer_help(void) {
    static std::string help;
    if (help.empty()) {
        const ei_config d = ei_config_default();
        char buf[4096];
        snprintf(buf, sizeof buf,
            "entropyinfer option (repeatable, or comma-separated; implies --entropyinfer): "
            "the ei_config fields segment_size (%d), block_size (%d), threshold_len (%lld), base_budget (%d), "
            "rigid_entropy (%g), delta_t (%g), alpha (%g), budget_min_factor (%g), budget_max_factor (%g), "
            "last_segment_dense (%d), per_segment_budget (%d), ranking (reference|sampled), rank_samples (%d), "
            "rank_rows (even|spread: farthest-point rows), rank_precision (f32|int8: the sampled rows' scores, on either backend), "
            "top_p (%g), sink_blocks (%d), local_blocks (%d), simd (auto|scalar|avx2|avx512|neon|avx512_bf16); "
            "preset=quality (ei_config_quality(): the sampled ranking of 128 farthest-point rows, top-p counts, sink and "
            "local blocks) or "
            "preset=paper; "
            "min_tokens (32: smaller ubatches run llama.cpp's attention); "
            "decode compression (generated tokens' queries observed; after decode_gap of them one keep-set of "
            "decode_budget positions per sequence, the other KV cells evicted and the rest moved to the front): "
            "decode_budget (%d), window (%d), decode_gap (%d), recompress_every (%d), pool (avg|max|none), "
            "pool_kernel (%d), gqa_reduce (mean|max), compress (1; 0: off), decode_policy "
            "(entropyinfer|streaming|snapkv|h2o), decode_sink (%d), decode_budget_ratio (%g; > 0: the budget is that "
            "fraction of the sequence's positions, at least decode_budget_min (%d), at most decode_budget, which is then the "
            "context's cells unless given), decode_positions (h2o: 4x the context's cells), decode_shared_weight "
            "(equal|entropy), decode_recent (0; in (0, 1]: entropyinfer and snapkv keep that share of the budget "
            "newest, as h2o keeps half); "
            "mode: sparse (default: entropyinfer's plans and block-sparse attention), ei-dense (its kernel without "
            "a plan), time-dense (llama.cpp's attention, timed in the layers entropyinfer would serve); "
            "executor: op (default: entropyinfer's attention kernels) or mask (llama.cpp's own attention, the plan "
            "as its KQ mask); "
            "on the GPU (a KV cache in CUDA memory): gpu (1; 0: such layers run llama.cpp's attention), gpu_timing "
            "(0; 1: time the GPU ops, synchronising around each), cuda_library (the plugin's path; default "
            "$EI_CUDA_LIBRARY, then libentropyinfer_cuda.so beside the program or on the loader's path)",
            (int) d.segment_size, (int) d.block_size, (long long) d.threshold_len, (int) d.base_budget,
            d.rigid_entropy, d.delta_t, d.alpha, d.budget_min_factor, d.budget_max_factor,
            (int) d.last_segment_dense, (int) d.per_segment_budget, (int) d.rank_samples, d.top_p, (int) d.sink_blocks,
            (int) d.local_blocks, (int) d.decode_budget, (int) d.window, (int) d.decode_gap, (int) d.recompress_every,
            (int) d.pool_kernel, (int) d.decode_sink, d.decode_budget_ratio, (int) d.decode_budget_min);
        help = buf;
    }
    return help.c_str();
}

// ---------------------------------------------------------------- context

llama_ei_state * llama_ei_context_init(const llama_model & model, const llama_cparams & cparams) {
    const ei_options & o = ei_opts();
    if (!o.enabled) {
        return nullptr;
    }
    auto st = std::make_unique<llama_ei_state>();
    st->opts    = o;
    st->n_layer = (int) model.hparams.n_layer();
    {
        // sizes the library needs that only the context knows: a ratio budget's cap (decode_budget,
        // unless given: the cells, so that the ratio decides) and H2O's positions, unless given: 4x
        // the cells (a compressed cache frees cells, so generation can run past n_ctx positions; past
        // decode_positions the library refuses the keep set (EI_ERR_SIZE), reported once, and
        // generation goes on uncompressed; memory: n_heads x 4 bytes per position and layer)
        ei_config &   c     = st->opts.cfg;
        const int64_t cells = std::max<int64_t>((int64_t) cparams.n_ctx, 1);
        if (c.decode_budget_ratio > 0 && !o.budget_set) {
            c.decode_budget = (int32_t) std::min<int64_t>(std::max<int64_t>(cells, c.decode_budget), EI_MAX_BUDGET);
        }
        if (c.decode_policy == EI_DECODE_H2O && c.decode_positions == 0) {
            c.decode_positions = std::min<int64_t>(4 * cells, EI_MAX_TOKENS);
        }
    }
    for (int il = 0; il < st->n_layer; ++il) {
        st->layers.emplace_back(new ei_layer);
        st->layers.back()->st = st.get();
        st->layers.back()->il = il;
    }
    st->stats.n_layer = st->n_layer;
    st->seqs.resize(std::max<uint32_t>(cparams.n_seq_max, 1));
    if (ei_context_create(&st->opts.cfg, &st->ctx0) != EI_OK) {
        const std::string msg = std::string("invalid configuration: ") + ei_last_error();
        ei_report_once(msg);
        throw std::runtime_error("entropyinfer: " + msg);
    }

    static std::once_flag once;
    std::call_once(once, [&] {
        const ei_config & c = st->opts.cfg;
        fprintf(stderr, "entropyinfer: on, mode %s, executor %s, segment_size %d, block_size %d, threshold_len %lld, base_budget %d, "
                "last_segment_dense %d, per_segment_budget %d, ranking %s (rank_samples %d, rank_rows %s, rank_precision %s, top_p %g, sink_blocks %d, "
                "local_blocks %d), min_tokens %d, keep_keys %d, simd %s; %s\n",
                k_mode_names[st->opts.mode], k_executor_names[st->opts.executor], (int) c.segment_size, (int) c.block_size, (long long) c.threshold_len,
                (int) c.base_budget, (int) c.last_segment_dense, (int) c.per_segment_budget,
                k_ranking_names[c.ranking == EI_RANK_SAMPLED ? 1 : 0], (int) c.rank_samples,
                k_rows_names[c.rank_rows == EI_RANK_ROWS_SPREAD ? 1 : 0],
                k_precision_names[c.rank_precision == EI_RANK_PRECISION_INT8 ? 1 : 0], c.top_p, (int) c.sink_blocks,
                (int) c.local_blocks, st->opts.min_tokens, (int) st->opts.keep_keys,
                ei_simd_name(ei_context_config(st->ctx0)->simd),
                cparams.flash_attn ? "flash attention on: the V cache is head-major, layers can be served"
                                   : "flash attention off: llama.cpp stores the V cache transposed, so no layer can be "
                                     "served and llama.cpp's attention runs everywhere (use -fa on)");
        fflush(stderr);
    });

    std::lock_guard<std::mutex> lock(ei_mutex());
    ei_glob().live.insert(st.get());
    ei_glob().contexts++;
    return st.release();
}

void llama_ei_context_free(llama_ei_state * st) {
    if (!st) {
        return;
    }
    ei_gpu_settle(st); // the last llama_decode call's GPU reports and keep counts, before the stats are added
    {
        std::lock_guard<std::mutex> lock(ei_mutex());
        ei_glob().done.add(st->stats);
        ei_glob().live.erase(st);
    }
    for (auto & L : st->layers) {
        for (size_t i = 0; i < L->plans.size(); ++i) {
            if (L->has_plan[i]) {
                ei_plan_free(L->gpu ? st->gsetup : L->ctx, &L->plans[i]);
            }
        }
        for (auto & D : L->decs) {
            ei_device_free(st->gsetup, D.g_mem); // (null for host decoders)
        }
    }
    for (auto & b : st->gbuf) {
        ei_device_free(st->gsetup, b.first);
    }
    for (auto & kv : st->ctxs) {
        ei_context_destroy(kv.second);
    }
    for (auto & kv : st->gctxs) {
        ei_context_destroy(kv.second);
    }
    // (st->gsetup is one of st->gctxs)
    ei_context_destroy(st->ctx0);
    ei_free_ws(st);
    delete st;
}

void llama_ei_ubatch_begin(llama_ei_state * st, const llama_ubatch & ubatch, bool last, uint32_t n_tokens_all,
                           const llama_batch_allocr * balloc) {
    if (!st) {
        return;
    }
    if (st->ann_last || st->g_settle_next) { // the first ubatch of a llama_decode call (ei_gpu_settle)
        ei_gpu_settle(st);
    }
    st->ann_pos   = ubatch.pos;
    st->ann_n     = ubatch.n_tokens;
    st->ann_last  = last;
    st->ann_n_all = n_tokens_all;
    st->stats.ubatches++;
    // a sequence's token is a generated one when the llama_decode call holds one position of that
    // sequence (one token per call and sequence: the batch of a server's generating slots, in one
    // ubatch or, --no-kv-unified, in ubatches of consecutive sequence ids), whatever else the call holds
    for (size_t s = 0; s < st->seqs.size(); ++s) {
        const llama_pos p0 = balloc ? balloc->seq_pos_min((llama_seq_id) s) : -1;
        st->seqs[s].one = balloc ? p0 >= 0 && p0 == balloc->seq_pos_max((llama_seq_id) s) : n_tokens_all == 1;
    }
}

void llama_ei_ubatch_end(llama_ei_state * st) {
    if (!st) {
        return;
    }
    st->ann_pos = nullptr;
    st->ann_n   = 0;
}

// ---------------------------------------------------------------- serve decisions

enum ei_decision { EI_SILENT = 0, EI_FALLBACK = 1, EI_SERVE = 2 };

static const llama_kv_cache_context * ei_attn_kv(const llama_memory_context_i * m) {
    if (auto * kv = dynamic_cast<const llama_kv_cache_context *>(m)) {
        return kv;
    }
    if (auto * iswa = dynamic_cast<const llama_kv_cache_iswa_context *>(m)) {
        return iswa->get_base();
    }
    if (auto * hyb = dynamic_cast<const llama_memory_hybrid_context *>(m)) {
        return hyb->get_attn();
    }
    if (auto * hyb = dynamic_cast<const llama_memory_hybrid_iswa_context *>(m)) {
        return hyb->get_attn() ? hyb->get_attn()->get_base() : nullptr;
    }
    return nullptr; // unknown memory: no reuse of served graphs (ei_decide falls back)
}

// Is entropyinfer on for seq (llama_entropyinfer_seq_set_enabled): its own setting, else all_on.
static bool ei_seq_enabled(const llama_ei_state * st, llama_seq_id seq) {
    const auto it = st->seq_on.find(seq);
    return it == st->seq_on.end() ? st->all_on : it->second;
}

// The sequences of a ubatch as slices (llama_ei_state::ei_slice), in the order of their runs;
// false with why when it cannot be served. Each sequence's tokens are one run of rows with
// consecutive positions (a unified cache's ubatch holds the llama_decode call's tokens in their
// order, any mix of sequences; with --kv-unified off llama.cpp gives each sequence one equal run
// and the runs' streams are consecutive, build_attn_mha's layout), each token of one sequence.
// Its keys: the cells of its stream in view that hold it at a position below the run's end, each
// position at most once, the run's own positions among them. gather receives the cells of the
// slices that are not one run of cells in position order (the caller's: ei_decide only asks, the
// state's list is set by ei_set_slices alone).
static bool ei_slices_of(const llama_ei_state * st, const llama_ubatch & ub, const llama_kv_cache_context * kvc,
                         std::vector<llama_ei_state::ei_slice> & out, std::vector<int32_t> & gather, std::string & why) {
    const llama_kv_cache * kv = kvc->get_kv();
    const bool             streams = kv->get_n_stream() > 1;
    char                   buf[256];
    std::vector<int32_t>   cell_of; // the cell of each position of a sequence
    out.clear();
    gather.clear();
    if (!ub.seq_id || !ub.n_seq_id) {
        why = "a ubatch without sequence ids: llama.cpp's attention";
        return false;
    }
    for (uint32_t i = 0; i < ub.n_tokens;) {
        if (ub.n_seq_id[i] != 1) {
            why = "tokens that belong to several sequences: llama.cpp's attention";
            return false;
        }
        const llama_seq_id seq = ub.seq_id[i][0];
        uint32_t           j   = i + 1;
        while (j < ub.n_tokens && ub.n_seq_id[j] == 1 && ub.seq_id[j][0] == seq && ub.pos[j] == ub.pos[j - 1] + 1) {
            ++j;
        }
        for (const auto & o : out) {
            if (o.seq == seq) {
                why = "a sequence's tokens are not one run of consecutive positions in the ubatch: llama.cpp's attention";
                return false;
            }
        }
        if (seq < 0 || (size_t) seq >= st->seqs.size()) {
            why = "a sequence id past n_seq_max: llama.cpp's attention";
            return false;
        }
        llama_ei_state::ei_slice sl = {};
        sl.q_pos = ub.pos[i];
        sl.r0    = (int32_t) i;
        sl.n     = (int32_t) (j - i);
        sl.seq   = seq;
        out.push_back(sl);
        i = j;
    }
    if (streams) { // the K/V views span the ubatch's streams, one equal run each, in stream order
        const int32_t stream0 = out.empty() ? 0 : (int32_t) kv->get_stream(out[0].seq);
        for (size_t i = 0; i < out.size(); ++i) {
            if (out[i].n != out[0].n || (int32_t) kv->get_stream(out[i].seq) != stream0 + (int32_t) i) {
                why = "the sequences of a ubatch are not equal runs in consecutive KV streams: llama.cpp's attention";
                return false;
            }
            out[i].view = (int32_t) i;
        }
    }
    for (auto & sl : out) {
        const llama_kv_cells & cells = kv->get_cells(sl.seq);
        const int64_t          n_kv  = std::min<int64_t>(kvc->get_n_kv(), cells.size());
        const int64_t          end   = sl.q_pos + sl.n;
        if (sl.q_pos < 0 || end > EI_MAX_TOKENS) {
            why = "positions outside 0 .. EI_MAX_TOKENS: llama.cpp's attention";
            return false;
        }
        cell_of.assign((size_t) end, -1);
        for (int64_t c = 0; c < n_kv; ++c) {
            if (cells.is_empty((uint32_t) c) || !cells.seq_has((uint32_t) c, sl.seq)) {
                continue;
            }
            const llama_pos p = cells.pos_get((uint32_t) c);
            if (p < 0 || p >= end) {
                continue; // a later position: no query of the run sees it
            }
            if (cell_of[(size_t) p] >= 0) {
                snprintf(buf, sizeof buf, "cells %d and %lld both hold position %d of sequence %d: llama.cpp's attention",
                         (int) cell_of[(size_t) p], (long long) c, (int) p, (int) sl.seq);
                why = buf;
                return false;
            }
            cell_of[(size_t) p] = (int32_t) c;
        }
        // the sequence's cells in position order (compacted over the missing positions)
        const size_t g0 = gather.size();
        for (int64_t p = 0; p < end; ++p) {
            if (cell_of[(size_t) p] >= 0) {
                gather.push_back(cell_of[(size_t) p]);
            } else if (p >= sl.q_pos) {
                snprintf(buf, sizeof buf, "position %lld of sequence %d is not in the cells in view: llama.cpp's attention",
                         (long long) p, (int) sl.seq);
                why = buf;
                return false;
            }
        }
        sl.m       = (int64_t) (gather.size() - g0);
        sl.planned = sl.m == end;
        sl.c0      = gather[g0];
        for (int64_t r = 1; r < sl.m && sl.c0 >= 0; ++r) {
            if (gather[g0 + (size_t) r] != sl.c0 + r) {
                sl.c0 = -1;
            }
        }
        if (sl.c0 >= 0) {
            gather.resize(g0); // a view: nothing to gather
            sl.g0 = -1;
        } else {
            sl.g0 = (int64_t) g0;
        }
    }
    return true;
}

// What the graph of a served ubatch holds besides the ops (the input's layout; graphs are reused
// while it stays): EI_LAYOUT_CELLS, every sequence planned over the cells from 0 of its view (the
// mask executor's and the GPU's own case); EI_LAYOUT_VIEWS, some sequence's rows start at a later
// cell or miss positions (attended densely); EI_LAYOUT_GATHER, some sequence's cells are gathered
// (ei_op_gather: CPU layers; a GPU layer runs llama.cpp's attention).
enum ei_layout { EI_LAYOUT_CELLS = 0, EI_LAYOUT_VIEWS = 1, EI_LAYOUT_GATHER = 2 };

static int ei_layout_of(const std::vector<llama_ei_state::ei_slice> & slices) {
    int l = EI_LAYOUT_CELLS;
    for (const auto & sl : slices) {
        l = std::max(l, sl.c0 < 0 ? (int) EI_LAYOUT_GATHER : sl.c0 > 0 || !sl.planned ? (int) EI_LAYOUT_VIEWS : (int) EI_LAYOUT_CELLS);
    }
    return l;
}

// Can this ubatch be served (in every servable layer)? why: the reason when not; layout: its
// ei_layout when served.
static ei_decision ei_decide(llama_ei_state * st, const llama_ubatch & ub, const llama_kv_cache_context * kvc,
                             const llama_cparams & cp, std::string & why, int * layout = nullptr) {
    if (!ub.pos || ub.pos != st->ann_pos || ub.n_tokens != st->ann_n) {
        return EI_SILENT; // not a ubatch of llama_decode (graph reservation): llama.cpp's attention, no report
    }
    if (cp.training) {
        return EI_SILENT;
    }
    for (uint32_t i = 0; ub.seq_id_unq && i < ub.n_seqs_unq; ++i) {
        if (!ei_seq_enabled(st, ub.seq_id_unq[i])) {
            return EI_SILENT; // turned off for a sequence of the ubatch (llama_entropyinfer_seq_set_enabled)
        }
    }
    if (!cp.causal_attn) {
        why = "non-causal attention (llama_set_causal_attn): llama.cpp's attention";
        return EI_FALLBACK;
    }
    if ((int64_t) ub.n_tokens < st->opts.min_tokens) {
        return EI_SILENT; // by choice (decode, warm-up): llama.cpp's attention, not reported
    }
    if (ub.n_pos != 1) {
        why = "several positions per token (M-RoPE): llama.cpp's attention";
        return EI_FALLBACK;
    }
    if (!kvc || !kvc->get_kv()) {
        why = "no KV cache: llama.cpp's attention";
        return EI_FALLBACK;
    }
    std::vector<llama_ei_state::ei_slice> slices;
    std::vector<int32_t>                  gather;
    if (!ei_slices_of(st, ub, kvc, slices, gather, why)) {
        return EI_FALLBACK;
    }
    if (layout) {
        *layout = ei_layout_of(slices);
    }
    return EI_SERVE;
}

static ei_plan * ei_layer_plan(llama_ei_state * st, ei_layer * L, int32_t seq);
static ei_plan * ei_layer_plan_at(ei_layer * L, int32_t seq);
static void      ei_layer_plans_grow(llama_ei_state * st, ei_layer * L);

// The sequences of a served ubatch (set_input: main thread, before the graph runs): its slices,
// the gather buffer sized for them, and the plans of its planned sequences made (grown). A layer
// that does not run ours for this layout (a GPU layer when rows are gathered) is skipped.
static void ei_set_slices(llama_ei_state * st, const llama_ubatch * ub, const llama_kv_cache_context * kvc,
                          ei_decision d, int layout) {
    st->slices.clear();
    st->cell_gather.clear();
    if (d != EI_SERVE || !ub || !kvc) {
        return;
    }
    std::string why;
    if (!ei_slices_of(st, *ub, kvc, st->slices, st->cell_gather, why) || ei_layout_of(st->slices) != layout) {
        // cannot happen (the graph's decision was made on this ubatch and cache): the ops write NaN
        ei_report_once("the served ubatch changed between graph and compute (" + why + "): its attention output is NaN");
        st->slices.clear();
        st->cell_gather.clear();
        return;
    }
    size_t row = 0; // the K + V bytes of a gathered cell, the most of any CPU layer
    for (const auto & L : st->layers) {
        if (L->status == 1 && !L->gpu) {
            row = std::max(row, L->k_row + L->v_row);
        }
    }
    size_t gathered = 0;
    for (const auto & sl : st->slices) {
        gathered += sl.c0 < 0 ? (size_t) sl.m * row : 0;
        if (!st->seqs[(size_t) sl.seq].served) {
            st->seqs[(size_t) sl.seq].served = true;
            st->stats.seqs_served++;
        }
    }
    if (st->gather.size() < gathered) {
        st->gather.resize(gathered);
    }
    for (auto & L : st->layers) {
        if (L->status != 1 || L->plans.empty() || (L->gpu && layout == EI_LAYOUT_GATHER)) {
            continue;
        }
        for (const auto & sl : st->slices) {
            if (sl.planned && !ei_layer_plan(st, L.get(), sl.seq)) {
                L->fail("a plan for the sequence");
            }
        }
        ei_layer_plans_grow(st, L.get());
    }
}

// ---------------------------------------------------------------- decode compression

// Decode compression off for the whole context (the memory, a layer, a device allocation), reported.
static void ei_decode_refuse(llama_ei_state * st, const std::string & why) {
    ei_report_once("decode compression off for this context: " + why);
    st->dec_off = true;
    st->obs_any = false;
    for (auto & S : st->seqs) {
        S.active = false;
    }
}

// ... for one sequence until it starts again at position 0 (a new sequence in that id), reported.
static void ei_decode_refuse_seq(llama_ei_state * st, llama_seq_id seq, const std::string & why) {
    ei_report_once("decode compression off for sequence " + std::to_string(seq) + ": " + why);
    auto & S  = st->seqs[(size_t) seq];
    S.off     = true;
    S.active  = false;
    S.started = false;
}

// The sequence's decoders in every observing layer, made on its first observed ubatch (set_input:
// the main thread, no op running; see ei_seq_decoder for why not up front). false: refused (reported).
static bool ei_seq_decoders(llama_ei_state * st, llama_seq_id seq) {
    auto & S = st->seqs[(size_t) seq];
    if (S.has_dec) {
        return true;
    }
    ei_context * sync = nullptr;
    for (auto & L : st->layers) {
        if (!L->has_dec || L->decs[(size_t) seq].has) {
            continue;
        }
        ei_seq_decoder & D = L->decs[(size_t) seq];
        void * mem = nullptr;
        if (L->gpu) {
            if (ei_device_alloc(L->ctx, &D.g_mem, L->dec_bytes) != EI_OK) {
                ei_decode_refuse(st, std::string("a decoder on the GPU: ") + ei_last_error());
                return false;
            }
            mem = D.g_mem;
            st->stats.gpu_dec_bytes += (int64_t) L->dec_bytes;
            sync = L->ctx;
        } else {
            D.mem.resize(L->dec_bytes);
            mem = D.mem.data();
        }
        if (ei_decoder_init(L->ctx, &D.dec, L->n_head, L->n_head_kv, L->head_dim, mem, L->dec_bytes) != EI_OK) {
            ei_decode_refuse(st, "layer " + std::to_string(L->il) + ": ei_decoder_init: " + ei_last_error());
            return false;
        }
        D.has = true;
    }
    if (sync) { // the device decoders' clears ran on the null stream; ggml's streams do not wait for it
        ei_gpu_time(st, sync);
    }
    S.has_dec = true;
    return true;
}

// One sequence's rows of this ubatch (S.runs, filled by ei_observe_decide): are they observed?
// Its tokens come in position order: a new sequence starts at position 0 (its decoders are reset),
// every later ubatch continues where its last one ended. A token that is the only position of its
// sequence in the llama_decode call is a generated token; once one was, later tokens count as
// generated.
static void ei_observe_seq(llama_ei_state * st, const llama_ubatch * ub, const llama_kv_cache * kv, llama_seq_id seq) {
    auto & S = st->seqs[(size_t) seq];
    if (!ei_seq_enabled(st, seq)) {
        return; // turned off for this sequence (a request's "entropyinfer": false)
    }
    const int64_t p0 = ub->pos[S.runs[0][0]];
    if (S.off && p0 != 0) {
        return; // refused until it starts again
    }
    int64_t n = 0;
    for (auto & r : S.runs) {
        r[2] = p0 + n;
        for (int64_t i = r[0]; i < r[1]; ++i, ++n) {
            if (ub->pos[i] != p0 + n) {
                ei_decode_refuse_seq(st, seq, "positions of its tokens in a ubatch are not consecutive and in order");
                return;
            }
        }
    }
    bool generated = S.one;
    for (auto & L : st->layers) {
        if (L->has_dec && L->decs[(size_t) seq].has) {
            generated = generated || L->decs[(size_t) seq].dec.n_generated > 0;
            break;
        }
    }
    // a new sequence (llama-perplexity clears the memory for each chunk), or the first ubatch of a
    // sequence whose cache was restored (llama_state_seq_set_data: a saved prefill): observation
    // starts here, so the decoders need the last `window` prompt tokens fed again after the
    // restore (the window's queries are not part of the saved state)
    bool restart = p0 == 0 || !S.started;
    if (!restart && (p0 != S.next_pos || S.paused)) {
        // positions jump (prompt-cache reuse, a rewind, a context shift), or a pause goes on. Onto an
        // exact prefix (no position below p0 was evicted) or after llama_entropyinfer_seq_rewind,
        // observation starts over here; over a compressed prefix (a context shift of a compressed
        // cache) compression pauses for this sequence until its prefix is exact again (seq_rm at
        // or below the first missing position, or cleared)
        if (S.rewound || !kv || kv->ei_first_missing(seq) < 0) {
            restart = true;
        } else {
            if (!S.paused) {
                char buf[256];
                snprintf(buf, sizeof buf, "decode compression paused for sequence %d: positions jump from %lld to %lld "
                         "over a compressed prefix (first missing position %d)", (int) seq, (long long) S.next_pos,
                         (long long) p0, (int) kv->ei_first_missing(seq));
                ei_report_once(buf);
            }
            S.paused   = true;
            S.next_pos = p0 + n;
            return;
        }
    }
    if (!ei_seq_decoders(st, seq)) {
        return;
    }
    if (restart) {
        for (auto & L : st->layers) {
            if (L->has_dec) {
                ei_decoder_reset(&L->decs[(size_t) seq].dec);
            }
        }
        generated = S.one;
        S.off     = false;
        S.paused  = false;
        S.rewound = false;
    }
    S.started   = true;
    S.next_pos  = p0 + n;
    S.active    = true;
    S.generated = generated ? 1 : 0;
    st->obs_any = true;
}

// Which rows of this ubatch are observed, and into which sequence's decoders (compute time, from
// set_input)? Each sequence's rows are its own (a token of several sequences is a query of each):
// with --no-kv-unified llama.cpp gives each sequence one run of the ubatch (split_equal); in a
// unified cache (split_simple) the ubatch holds the call's tokens in their order, any mix of
// sequences, and each sequence's rows are observed run by run, in position order.
// kv: the cache of the served layers (null: none), whose record says whether a held prefix is exact
static void ei_observe_decide(llama_ei_state * st, const llama_ubatch * ub, const llama_kv_cache * kv) {
    st->obs_any = false;
    for (auto & S : st->seqs) {
        S.active = false;
        S.runs.clear();
    }
    if (!st->opts.compress || st->dec_off || !ub || !ub->pos || ub->pos != st->ann_pos || ub->n_tokens != st->ann_n) {
        return; // off, or not a ubatch of llama_decode (graph reservation)
    }
    bool any = false;
    for (auto & L : st->layers) {
        any = any || L->has_dec;
    }
    if (!any || !ub->seq_id || !ub->n_seq_id) {
        return;
    }
    if (ub->n_pos != 1) {
        ei_decode_refuse(st, "several positions per token (M-RoPE)");
        return;
    }
    for (uint32_t i = 0; i < ub->n_tokens; ++i) {
        for (int32_t k = 0; k < ub->n_seq_id[i]; ++k) {
            const llama_seq_id seq = ub->seq_id[i][k];
            if (seq < 0 || (size_t) seq >= st->seqs.size()) {
                continue; // (llama_batch_allocr refuses these)
            }
            auto & runs = st->seqs[(size_t) seq].runs;
            if (!runs.empty() && runs.back()[1] == (int64_t) i) {
                runs.back()[1] = i + 1;
            } else {
                runs.push_back({ (int64_t) i, (int64_t) i + 1, 0 });
            }
        }
    }
    for (size_t seq = 0; seq < st->seqs.size(); ++seq) {
        if (!st->seqs[seq].runs.empty()) {
            ei_observe_seq(st, ub, kv, (llama_seq_id) seq);
        }
    }
}

// Executor mask: the most keys a query row of this ubatch may see under any plan of the
// configuration (ggml's sparse-mask hint n_kv_max): the budget cap's blocks (ei_plan.max_keep, the
// manual's "max factor x base") and the segment's own keys; 0 (no hint) when a row may see every
// earlier key (a segment that starts before threshold_len, the last segment of the prompt's final
// ubatch with last_segment_dense) or when the bound reaches the cells in view.
static int64_t ei_mask_bound(const llama_ei_state * st, const llama_ubatch & ub, int64_t n_kv) {
    const ei_config & c = st->opts.cfg;
    if (st->opts.executor != EI_EXEC_MASK || st->opts.mode != EI_MODE_SPARSE || !ub.pos || ub.n_tokens == 0) {
        return 0;
    }
    llama_pos lo = ub.pos[0];
    for (uint32_t i = 1; i < ub.n_tokens; ++i) {
        lo = std::min(lo, ub.pos[i]);
    }
    if ((int64_t) lo / c.segment_size * c.segment_size < c.threshold_len || (c.last_segment_dense && st->ann_last)) {
        return 0;
    }
    const int64_t cap   = (int64_t) std::floor(std::max(1.0, c.budget_max_factor) * c.base_budget / c.block_size);
    const int64_t bound = cap * c.block_size + c.segment_size;
    return bound < n_kv ? bound : 0;
}

// The graph input of ours: the compute-time ubatch data, and graph reuse only
// while the decision stays the same.
class llm_graph_input_ei : public llm_graph_input_i {
public:
    llm_graph_input_ei(llama_ei_state * st, ei_decision d) : st(st), decision(d) {}

    void set_input(const llama_ubatch * ub) override {
        st->is_final = st->ann_last ? 1 : 0;
        for (auto & L : st->layers) {
            L->failed = 0;
            L->t_plan.reset();
            L->t_attn.reset();
        }
        ei_set_slices(st, ub, kvc, decision, layout);
        if (decision == EI_SERVE && served_layers > 0) {
            st->stats.ubatches_served++;
        }
        ei_observe_decide(st, ub, kv);
    }

    bool can_reuse(const llm_graph_params & params) override {
        std::string why;
        const llama_kv_cache_context * kvc = ei_attn_kv(params.mctx);
        // the K/V views of a served graph span n_kv cells (llama.cpp's own check of that lives in
        // its KQ-mask input, which skips an unallocated mask: iSWA models whose global layers we serve)
        if (kvc && (int64_t) kvc->get_n_kv() != n_kv) {
            return false;
        }
        if (ei_mask_bound(st, params.ubatch, n_kv) != n_kv_max) { // executor mask: the hint is in the graph
            return false;
        }
        int layout_now = EI_LAYOUT_CELLS;
        if (ei_decide(st, params.ubatch, kvc, params.cparams, why, &layout_now) != decision ||
            (decision == EI_SERVE && layout_now != layout)) {
            return false;
        }
        this->kvc = kvc; // the ubatch's memory context (set_input reads its cells), as llama.cpp's inputs do
        return true;
    }

    llama_ei_state *       st;
    ei_decision            decision;
    int                    served_layers = 0;
    int64_t                n_kv          = -1;      // cells of the K/V views the graph was built with
    int64_t                n_kv_max      = 0;       // executor mask: the graph's sparse-mask hint (ei_mask_bound)
    const llama_kv_cache * kv            = nullptr; // the cache whose streams the sequences use
    const llama_kv_cache_context * kvc   = nullptr; // the ubatch's view of it (n_kv cells)
    int                    layout        = EI_LAYOUT_CELLS; // of a served graph (ei_layout)
};

static llm_graph_input_ei * ei_graph_input(const llm_graph_context & g, llama_ei_state * st,
                                           const llama_kv_cache_context * kvc) {
    for (auto & in : g.res->inputs) {
        if (auto * e = dynamic_cast<llm_graph_input_ei *>(in.get())) {
            return e;
        }
    }
    std::string why;
    int               layout = EI_LAYOUT_CELLS;
    const ei_decision d      = ei_decide(st, g.ubatch, kvc, g.cparams, why, &layout);
    if (d == EI_FALLBACK) {
        ei_report_once(why);
    }
    auto * in = new llm_graph_input_ei(st, d);
    in->layout = layout;
    in->kvc    = kvc;
    in->n_kv = kvc ? (int64_t) kvc->get_n_kv() : -1;
    in->n_kv_max = ei_mask_bound(st, g.ubatch, in->n_kv);
    in->kv   = kvc ? kvc->get_kv() : nullptr;
    g.res->add_input(llm_graph_input_ptr(in));
    return in;
}

static bool ei_cache_type(ggml_type t) {
    return t == GGML_TYPE_F16 || t == GGML_TYPE_BF16 || t == GGML_TYPE_F32;
}

// Why layer il cannot be served, or nullptr.
static bool ei_gpu_register();

// The tensor whose buffer holds t's data (a view's source).
static const ggml_tensor * ei_storage(const ggml_tensor * t) {
    return t->view_src ? t->view_src : t;
}

// Does t live in host memory (the CPU backend's, or a host buffer of a GPU backend)?
static bool ei_on_host(const ggml_tensor * t) {
    const ggml_backend_buffer_t b = ei_storage(t)->buffer;
    return b == nullptr || ggml_backend_buffer_is_host(b);
}

// Why a layer whose K/V cache is in GPU memory cannot be served there, or nullptr.
static const char * ei_gpu_reason(const llama_ei_state * st, const ggml_tensor * k, const ggml_tensor * v) {
    if (ei_on_host(k) != ei_on_host(v))
        return "a layer with K and V caches in different memories runs llama.cpp's attention";
    if (!st->opts.gpu)
        return "layers whose KV cache is in GPU memory run llama.cpp's attention (gpu=0)";
    const char * name = ggml_backend_buft_name(ggml_backend_buffer_get_type(ei_storage(k)->buffer));
    if (!name || strcmp(name, "CUDA0") != 0 || strcmp(name, ggml_backend_buft_name(ggml_backend_buffer_get_type(ei_storage(v)->buffer))) != 0)
        return "a KV cache in the memory of a GPU backend other than CUDA device 0 (Metal, Vulkan, another CUDA device): "
               "llama.cpp's attention";
    if (!ei_gpu_register())
        return "the CUDA backend has no custom-op hook (a ggml-cuda without entropyinfer.patch): llama.cpp's attention";
    if (k->type != v->type || (k->type != GGML_TYPE_F16 && k->type != GGML_TYPE_BF16))
        return "a KV cache on the GPU that is not F16 or BF16 for both K and V (the GPU kernels'): llama.cpp's attention";
    if (k->ne[0] != 64 && k->ne[0] != 128 && k->ne[0] != 256)
        return "a head size other than 64/128/256 on the GPU (the GPU kernels'): llama.cpp's attention";
    return nullptr;
}

static const char * ei_layer_reason(const llama_ei_state * st, const llm_graph_context & g, const llama_kv_cache_context * mctx,
                                    const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v,
                                    const ggml_tensor * kq_b, const ggml_tensor * sinks, const ggml_tensor * v_mla, int il) {
    const llama_hparams & hp = g.hparams;
    if (!mctx)                                      return "layers without a KV cache run llama.cpp's attention";
    if (hp.is_swa(il))                              return "sliding-window layers run llama.cpp's attention";
    if (hp.attn_soft_cap)                           return "layers with logit soft-capping run llama.cpp's attention";
    if (hp.use_alibi || hp.f_max_alibi_bias > 0.0f) return "ALiBi layers run llama.cpp's attention";
    if (g.arch == LLM_ARCH_GROK)                    return "Grok's scaled logits run llama.cpp's attention";
    if (sinks)                                      return "layers with attention sinks run llama.cpp's attention";
    if (kq_b)                                       return "layers with a KQ bias run llama.cpp's attention";
    if (v_mla)                                      return "MLA layers run llama.cpp's attention";
    if (hp.n_embd_head_k(il) != hp.n_embd_head_v(il)) return "layers whose K and V head sizes differ run llama.cpp's attention";
    if (!ei_cache_type(k->type) || !ei_cache_type(v->type))
        return "a quantized KV cache is not served (F16, BF16 or F32 only): llama.cpp's attention";
    if (v->nb[1] > v->nb[2])
        return "the V cache is transposed (flash attention off): llama.cpp's attention in every layer (use -fa on)";
    if (q->type != GGML_TYPE_F32 || q->nb[0] != sizeof(float) || q->nb[1] % sizeof(float) || q->nb[2] % sizeof(float))
        return "a query that is not f32 with contiguous heads: llama.cpp's attention";
    const size_t es = ggml_type_size(k->type);
    if (k->nb[0] != es || v->nb[0] != ggml_type_size(v->type) || k->nb[1] % es || k->nb[2] % es ||
        v->nb[1] % ggml_type_size(v->type) || v->nb[2] % ggml_type_size(v->type))
        return "a K/V cache view without contiguous heads: llama.cpp's attention";
    if (q->ne[0] != k->ne[0] || k->ne[0] != v->ne[0] || k->ne[1] != v->ne[1] || k->ne[1] <= 0 || q->ne[1] % k->ne[1])
        return "Q/K/V head shapes that do not match: llama.cpp's attention";
    if (q->ne[1] / k->ne[1] > EI_MAX_CHUNK_GROUP)
        return "more query heads per kv head than entropyinfer's chunked planning takes: llama.cpp's attention";
    if (!ei_on_host(k) || !ei_on_host(v))
        return ei_gpu_reason(st, k, v);
    return nullptr;
}

static ei_dtype ei_dtype_of(ggml_type t) {
    return t == GGML_TYPE_F16 ? EI_F16 : t == GGML_TYPE_BF16 ? EI_BF16 : EI_F32;
}

// The query that planning reads. The method's block scores are defined on the raw
// post-RoPE query (the reference softmaxes unscaled scores), but some models fold
// the attention scale into Q before attention (Gemma 3: Q * 1/sqrt(head_dim), then
// kq_scale 1); planning on the scaled Q would flatten every block distribution by
// that factor (higher entropies, smaller relative changes, other budgets). When Q
// is the output of a (not in-place) ggml_scale by a positive factor without bias,
// planning reads its input instead: computed already, kept alive as our source.
// *pre_scale receives that factor (1 when Q is read as it is): the sampled ranking
// scores real rows of the raw Q, so its planning context scales them by it.
static ggml_tensor * ei_raw_query(ggml_tensor * q, float * pre_scale = nullptr) {
    float sb[2] = { 0.0f, 0.0f };
    if (pre_scale) {
        *pre_scale = 1.0f;
    }
    if (q->op != GGML_OP_SCALE || q->view_src != nullptr || q->src[0] == nullptr) {
        return q;
    }
    memcpy(sb, q->op_params, sizeof sb); // ggml_scale_impl: scale, bias
    ggml_tensor * raw = q->src[0];
    if (!(sb[0] > 0.0f) || sb[1] != 0.0f || raw->type != GGML_TYPE_F32 || !ggml_are_same_shape(raw, q)) {
        return q;
    }
    if (pre_scale) {
        *pre_scale = sb[0];
    }
    return raw;
}

// [head_dim, n_heads, n_tokens] ggml view -> ei_tensor (strides in elements)
static ei_tensor ei_view(const ggml_tensor * t) {
    const size_t es = ggml_type_size(t->type);
    ei_tensor v;
    v.data         = t->data;
    v.dtype        = ei_dtype_of(t->type);
    v.n_heads      = (int32_t) t->ne[1];
    v.head_dim     = (int32_t) t->ne[0];
    v.n_tokens     = t->ne[2];
    v.token_stride = (int64_t) (t->nb[2] / es);
    v.head_stride  = (int64_t) (t->nb[1] / es);
    return v;
}

// The queries of a slice of the ubatch: rows [r0, r0 + n) of q [head_dim, heads, tokens].
static ei_tensor ei_slice_q(const ggml_tensor * q, const llama_ei_state::ei_slice & sl) {
    ei_tensor v = ei_view(q);
    v.n_tokens = sl.n;
    v.data     = (const char *) q->data + (size_t) sl.r0 * q->nb[2];
    return v;
}
// Where ei_op_gather puts a gathered slice's K (which 0) or V (1) rows for layer L: each gathered
// slice's K rows, then its V rows, in slice order. The gathered slices before it hold g0 cells
// (ei_slices_of), so it starts g0 rows of L's K + V in.
static uint8_t * ei_gathered(const ei_layer * L, const llama_ei_state::ei_slice & sl, int which) {
    const size_t off = (size_t) sl.g0 * (L->k_row + L->v_row);
    return L->st->gather.data() + off + (which ? (size_t) sl.m * L->k_row : 0);
}
// Its key rows in K (which 0) or V (1), t the layer's view [head_dim, kv heads, cells, streams]:
// cells c0 .. of its stream in view, or the rows ei_op_gather copied for layer L.
static ei_tensor ei_slice_kv(const ei_layer * L, const ggml_tensor * t, const llama_ei_state::ei_slice & sl, int which) {
    ei_tensor v = ei_view(t);
    if (sl.c0 >= 0) {
        v.data     = (const char *) t->data + (size_t) sl.view * t->nb[3] + (size_t) sl.c0 * t->nb[2];
        v.n_tokens = t->ne[2] - sl.c0;
        return v;
    }
    v.data         = ei_gathered(L, sl, which);
    v.n_tokens     = sl.m;
    v.token_stride = t->ne[0] * t->ne[1];
    v.head_stride  = t->ne[0];
    return v;
}
// Its rows of the attention output [head_dim * heads, tokens] (f32).
static ei_out_tensor ei_slice_out(ggml_tensor * dst, const ei_tensor & q, const llama_ei_state::ei_slice & sl) {
    return ei_out_tensor_make((char *) dst->data + (size_t) sl.r0 * dst->nb[1], EI_F32, sl.n, q.n_heads, q.head_dim);
}

// The state's context for one attention scale (created on first use; NULL on failure).
static ei_context * ei_context_for_scale(llama_ei_state * st, float scale) {
    uint32_t bits;
    memcpy(&bits, &scale, sizeof bits);
    auto it = st->ctxs.find(bits);
    if (it == st->ctxs.end()) {
        ei_config cfg = st->opts.cfg;
        cfg.attn_scale   = scale;
        cfg.decode_scale = scale; // decode scores: the layer's own softmax(kq_scale * q.k)
        ei_context * c = nullptr;
        if (ei_context_create(&cfg, &c) != EI_OK) {
            ei_report_once(std::string("context for attention scale failed: ") + ei_last_error() + ": llama.cpp's attention");
            return nullptr;
        }
        it = st->ctxs.emplace(bits, c).first;
    }
    return it->second;
}

// The plan of one sequence in a layer (made on first use, for a stream's cells; NULL: reported).
static ei_plan * ei_layer_plan(llama_ei_state * st, ei_layer * L, int32_t seq) {
    if (seq < 0 || (size_t) seq >= L->plans.size()) {
        return nullptr;
    }
    if (!L->has_plan[(size_t) seq]) {
        // a GPU plan holds the seq's cells (it does not grow); a CPU plan starts at
        // EI_PLAN_FIRST tokens and grows with the prompt (ei_layer_plans_grow)
        const int64_t n = L->gpu ? L->plan_tokens : std::min<int64_t>(L->plan_tokens, EI_PLAN_FIRST);
        if (ei_plan_init(L->ctx, &L->plans[(size_t) seq], n, L->n_head_kv, L->head_dim, ei_plan_flags(),
                         nullptr, 0) != EI_OK) {
            ei_report_once(std::string("plan allocation failed: ") + ei_last_error() + ": entropyinfer's dense attention");
            return nullptr;
        }
        L->has_plan[(size_t) seq] = 1;
        if (L->gpu) { // its clears ran on the null seq; ggml's seqs do not wait for it
            st->stats.gpu_plan_bytes += (int64_t) L->sizes.plan;
            ei_gpu_time(st, L->ctx);
        }
    }
    return &L->plans[(size_t) seq];
}

// Before the graph runs (main thread): each CPU plan the ubatch uses holds its slice's positions,
// grown to twice what it held (at most the stream's cells) when it would not; the planning
// workspace was sized for the cells. The bytes the context's CPU plans hold, for the summary.
static void ei_layer_plans_grow(llama_ei_state * st, ei_layer * L) {
    if (L->gpu) {
        return;
    }
    for (const auto & sl : st->slices) {
        ei_plan *     P   = sl.planned ? ei_layer_plan_at(L, sl.seq) : nullptr;
        const int64_t end = sl.q_pos + sl.n;
        if (!P || end <= P->max_tokens) {
            continue;
        }
        const int64_t n = std::min(L->plan_tokens, std::max(end, 2 * P->max_tokens));
        if (ei_plan_grow(L->ctx, P, n) != EI_OK) {
            L->fail("ei_plan_grow");
        }
    }
    int64_t bytes = 0;
    for (size_t i = 0; i < L->plans.size(); ++i) {
        if (L->has_plan[i]) {
            ei_shape shape = {};
            ei_sizes sz    = {};
            shape.max_tokens = L->plans[i].max_tokens;
            shape.n_heads    = L->n_head;
            shape.n_kv_heads = L->n_head_kv;
            shape.head_dim   = L->head_dim;
            shape.plan_flags = L->plans[i].flags;
            if (ei_layer_sizes(L->ctx, &shape, &sz) == EI_OK) {
                bytes += (int64_t) sz.plan;
            }
        }
    }
    L->plan_bytes = bytes;
    int64_t total = 0;
    for (const auto & M : st->layers) {
        total += M->plan_bytes;
    }
    st->stats.cpu_plan_bytes = std::max(st->stats.cpu_plan_bytes, total);
}

// The plan of a sequence, if made (the ops: set_input made the ubatch's).
static ei_plan * ei_layer_plan_at(ei_layer * L, int32_t seq) {
    return seq >= 0 && (size_t) seq < L->plans.size() && L->has_plan[(size_t) seq] ? &L->plans[(size_t) seq] : nullptr;
}

// A layer's plans, one per sequence of the context (n_seq_max), each for the cells a sequence can
// hold (a stream's); sequence 0's now (the others when a ubatch first plans them).
static bool ei_layer_plans_init(llama_ei_state * st, ei_layer * L, int64_t n_cells) {
    L->plans.assign(st->seqs.size(), ei_plan{});
    L->has_plan.assign(st->seqs.size(), 0);
    L->plan_tokens = n_cells;
    return ei_layer_plan(st, L, 0) != nullptr;
}

// First build of a layer served on the GPU: CUDA contexts (null stream), then the plan, the
// workspaces and the decoder in device memory, sized to the context's cells.
static bool ei_gpu_layer_setup(llama_ei_state * st, ei_layer * L, const llama_kv_cache_context * mctx,
                               const ggml_tensor * q, const ggml_tensor * k, float kq_scale, float pre_scale) {
    L->gpu        = true;
    L->scale      = kq_scale;
    L->scale_plan = kq_scale * pre_scale;
    L->ctx        = ei_gpu_context(st, L->scale, nullptr, 1);
    L->ctx_plan   = ei_gpu_context(st, L->scale_plan, nullptr, 1);
    if (!L->ctx || !L->ctx_plan) {
        ei_report_once("the CUDA plugin did not load (see above): llama.cpp's attention in the layers on the GPU");
        return false;
    }
    L->n_head    = (int32_t) q->ne[1];
    L->n_head_kv = (int32_t) k->ne[1];
    L->head_dim  = (int32_t) k->ne[0];
    const int64_t n_cells = mctx->get_kv()->get_size();
    // the plan, workspaces and decoder of the layer: one launch sequence per call, so one
    // workspace each, whatever ggml's threads
    if (ei_sizes_of(L->ctx, L, n_cells, 1, &L->sizes) != EI_OK) {
        ei_report_once(std::string("buffer sizes on the GPU: ") + ei_last_error() + ": llama.cpp's attention");
        return false;
    }
    if (st->opts.mode == EI_MODE_SPARSE) {
        if (!ei_layer_plans_init(st, L, n_cells)) {
            return false;
        }
        if (!ei_gpu_buf(st, EI_G_PROFILE_WS, L->sizes.profile)) {
            ei_report_once(std::string("planning workspace on the GPU: ") + ei_last_error() + ": llama.cpp's attention");
            return false;
        }
    }
    // one attention workspace for every layer (its calls follow each other on the stream): the
    // deferred reports and the partial rows of split-K
    if (!ei_gpu_buf(st, EI_G_ATTN_WS, L->sizes.prefill)) {
        ei_report_once(std::string("attention workspace on the GPU: ") + ei_last_error() + ": llama.cpp's attention");
        return false;
    }
    if (st->opts.compress) { // the sequences' decoders in device memory: made on their first ubatch (ei_seq_decoders)
        L->dec_bytes = L->sizes.decoder;
        L->decs.resize(st->seqs.size());
        L->has_dec = true;
    }
    // the clears above ran on the null stream; ggml's streams do not wait for it
    ei_gpu_time(st, L->ctx);
    st->stats.layers_gpu++;
    return true;
}

// First build of a servable layer: its contexts (per attention scale), plan and workspaces.
static bool ei_layer_setup(llama_ei_state * st, ei_layer * L, const llm_graph_context & g,
                           const llama_kv_cache_context * mctx, ggml_tensor * q, const ggml_tensor * k,
                           float kq_scale) {
    float pre_scale = 1.0f;
    ei_raw_query(q, &pre_scale);
    if (!ei_on_host(k)) {
        return ei_gpu_layer_setup(st, L, mctx, q, k, kq_scale, pre_scale);
    }
    L->ctx      = ei_context_for_scale(st, kq_scale);
    L->ctx_plan = ei_context_for_scale(st, kq_scale * pre_scale);
    if (!L->ctx || !L->ctx_plan) {
        return false;
    }
    L->n_head    = (int32_t) q->ne[1];
    L->n_head_kv = (int32_t) k->ne[1];
    L->head_dim  = (int32_t) k->ne[0];
    const int64_t n_cells = mctx->get_kv()->get_size();
    // the ops run in parts on ggml's threads: as many as the graph's plan gives an op
    // (GGML_N_TASKS_MAX), n_threads or n_threads_batch; the state's one workspace is sized for
    // the most at the first layer's setup (more threads later, llama_set_n_threads: the ops use
    // that many parts and leave the others idle)
    if (st->ws_threads == 0) {
        st->ws_threads = std::max({ (int) g.cparams.n_threads, (int) g.cparams.n_threads_batch, 1 });
    }
    if (ei_sizes_of(L->ctx, L, n_cells, st->ws_threads, &L->sizes) != EI_OK) {
        ei_report_once(std::string("workspace size: ") + ei_last_error() + ": llama.cpp's attention");
        return false;
    }
    if (st->opts.mode == EI_MODE_SPARSE && !ei_layer_plans_init(st, L, n_cells)) {
        return false;
    }
    if (!ei_ensure_ws(st, std::max(st->opts.mode == EI_MODE_SPARSE ? L->sizes.profile : 0, L->sizes.prefill))) {
        ei_report_once("workspace allocation failed: llama.cpp's attention");
        return false;
    }
    if (st->opts.compress) { // the sequences' observation windows: made on their first ubatch (ei_seq_decoders)
        L->dec_bytes = L->sizes.decoder;
        L->decs.resize(st->seqs.size());
        L->has_dec = true;
    }
    return true;
}

// ---------------------------------------------------------------- custom ops

// The plan a slice attends with: its sequence's, when planned, in sparse mode, and the layer's
// planning of this ubatch succeeded; NULL for dense attention.
static const ei_plan * ei_slice_plan(ei_layer * L, const llama_ei_state::ei_slice & sl) {
    return L->st->opts.mode == EI_MODE_SPARSE && L->use_plan && sl.planned ? ei_layer_plan_at(L, sl.seq) : nullptr;
}

// NaN into rows [r0, r0 + n) of a host attention output [head_dim * heads, tokens] (f32).
static void ei_out_nan(ggml_tensor * dst, int64_t r0, int64_t n) {
    for (int64_t r = r0; r < r0 + n; ++r) {
        float * row = (float *) ((char *) dst->data + (size_t) r * dst->nb[1]);
        for (int64_t j = 0; j < dst->ne[0]; ++j) {
            row[j] = NAN;
        }
    }
}

// Each planned sequence of the ubatch profiled into its plan (q: dst's src 0, K: src 1) with context
// c (NULL: fails) and x; false at the first failure (ei_last_error says why).
static bool ei_profile_slices(ei_layer * L, ei_context * c, const ei_exec & x, const ggml_tensor * dst) {
    for (const auto & sl : L->st->slices) {
        if (!sl.planned) {
            continue;
        }
        const ei_tensor q = ei_slice_q(dst->src[0], sl);
        const ei_tensor k = ei_slice_kv(L, dst->src[1], sl, 0);
        ei_plan *       P = ei_layer_plan_at(L, sl.seq);
        if (!c || !P || ei_profile_chunk(c, &x, &q, &k, P, sl.q_pos, L->st->is_final) != EI_OK) {
            return false;
        }
    }
    return true;
}

// The K and V rows of the gathered slices (EI_LAYOUT_GATHER: a sequence whose cells are not one
// run in position order, e.g. interleaved with other sequences' in a unified cache) copied into
// the state's buffer, in parts over ggml's threads (each a share of the rows), before the layer's
// profile and attention ops read them (ei_slice_kv). The copy is as the cache stores it, so
// attention over it gives what it gives over the cells.
static void ei_op_gather(ggml_tensor * dst, int ith, int nth, void * ud) {
    ei_layer *          L     = (ei_layer *) ud;
    llama_ei_state *    st    = L->st;
    const ggml_tensor * t2[2] = { dst->src[0], dst->src[1] };
    const int64_t       total = (int64_t) st->cell_gather.size(), a = total * ith / nth, b = total * (ith + 1) / nth;
    for (const auto & sl : st->slices) {
        if (sl.c0 >= 0 || a >= sl.g0 + sl.m || b <= sl.g0) {
            continue;
        }
        for (int which = 0; which < 2; ++which) {
            const ggml_tensor * t    = t2[which];
            uint8_t *           to   = ei_gathered(L, sl, which);
            const size_t        head = ggml_row_size(t->type, t->ne[0]), row = which ? L->v_row : L->k_row;
            for (int64_t g = std::max(a, sl.g0); g < std::min(b, sl.g0 + sl.m); ++g) {
                const char * src = (const char *) t->data + (size_t) sl.view * t->nb[3] + (size_t) st->cell_gather[(size_t) g] * t->nb[2];
                uint8_t *    out = to + (size_t) (g - sl.g0) * row;
                for (int64_t h = 0; h < t->ne[1]; ++h) {
                    memcpy(out + (size_t) h * head, src + (size_t) h * t->nb[1], head);
                }
            }
        }
    }
}

static void ei_op_profile(ggml_tensor * dst, int ith, int nth, void * ud) {
    ei_layer *       L  = (ei_layer *) ud;
    llama_ei_state * st = L->st;
    L->t_plan.enter();
    // parts: the threads the workspace is sized for at most (the others idle); part ith plans kv
    // heads [kv ith / nw, kv (ith + 1) / nw) (none: it returns at once), ei_op_finalize then
    // finalises the plans (nw 1: the whole call, finalised already)
    const int     nw = std::min(nth, st->ws_threads);
    const ei_exec x  = ei_part(ith, nw, st->ws, st->ws_bytes);
    if (ith < nw && !ei_profile_slices(L, L->ctx_plan, x, dst)) { // every part its kv heads of each plan
        L->fail("ei_profile_chunk");
    }
    const int64_t t = L->t_plan.leave(nth);
    if (t >= 0) {
        L->ns_plan = t;
    }
}

// Density of the sparse segments a ubatch of n queries from q_pos holds: kept / causal keys over
// their queries (keep_count: the plan's, in host memory).
static void ei_count_density(llama_ei_state * st, const ei_layer * L, const ei_plan & p, const int32_t * keep_count,
                             int64_t q_pos, int64_t n) {
    const int64_t   seg = p.segment_size;
    const int64_t   a0 = q_pos, a1 = q_pos + n;
    for (int64_t s = a0 / seg; s <= (a1 - 1) / seg; ++s) {
        if (!ei_plan_segment_is_sparse(L->ctx, &p, (int32_t) s)) {
            continue;
        }
        const int64_t S0 = s * seg, a = std::max(S0, a0), b = std::min(S0 + seg, a1), cnt = b - a;
        // sum over queries p in [a, b) of (p - S0 + 1) (own segment) and of (p + 1) (causal)
        const double diag   = 0.5 * (double) cnt * (double) ((a - S0 + 1) + (b - S0));
        const double causal = 0.5 * (double) cnt * (double) ((a + 1) + b);
        for (int32_t h = 0; h < p.n_kv_heads; ++h) {
            st->stats.kept   += (double) cnt * keep_count[EI_PLAN_ROW(&p, h, s)] * p.block_size + diag;
            st->stats.causal += causal;
        }
    }
}

// After planning a ubatch of n queries: use the plan, or on a failure run entropyinfer's dense
// attention this time and start the plan again (a GPU plan: laid out anew; the next ubatch from
// position 0 rolls it back in any case).
static void ei_plan_done(ei_layer * L) {
    llama_ei_state * st = L->st;
    if (L->failed) {
        ei_report_once("layer " + std::to_string(L->il) + ": " + L->error +
                       "; this ubatch runs entropyinfer's dense attention (exact)");
        for (const auto & sl : st->slices) {
            ei_plan * P = sl.planned ? ei_layer_plan_at(L, sl.seq) : nullptr;
            if (!P) {
                continue;
            }
            if (L->gpu) {
                ei_plan_free(st->gsetup, P);
                L->has_plan[(size_t) sl.seq] = 0;
                ei_layer_plan(st, L, sl.seq);
            } else {
                ei_plan_reset(P);
            }
        }
        L->use_plan = false;
        return;
    }
    L->use_plan = true;
    for (const auto & sl : st->slices) {
        const ei_plan * P = sl.planned ? ei_layer_plan_at(L, sl.seq) : nullptr;
        if (!P) {
            continue;
        }
        if (L->gpu) { // the counts are on the device: ei_gpu_settle reads them after the llama_decode call
            L->stat_pending.push_back({ (int64_t) sl.seq, sl.q_pos, (int64_t) sl.n });
            if ((sl.q_pos + sl.n) % P->segment_size != 0) { // the next chunk continues the segment: read before it
                st->g_settle_next = true;
            }
        } else {
            ei_count_density(st, L, *P, P->keep_count, sl.q_pos, sl.n);
        }
    }
}

static void ei_op_finalize(ggml_tensor * dst, int ith, int nth, void * ud) {
    (void) nth;
    if (ith != 0) {
        return;
    }
    ei_layer *       L  = (ei_layer *) ud;
    llama_ei_state * st = L->st;
    const int64_t    t0 = ei_now_ns();
    (void) dst;
    for (const auto & sl : st->slices) {
        ei_plan * P = ei_layer_plan_at(L, sl.seq);
        if (sl.planned && !L->failed && (!P || ei_plan_finalize(L->ctx_plan, P) != EI_OK)) {
            L->fail("ei_plan_finalize");
        }
    }
    ei_plan_done(L);
    st->stats.ns_plan += L->ns_plan + (ei_now_ns() - t0);
}

static void ei_op_attention(ggml_tensor * dst, int ith, int nth, void * ud) {
    ei_layer *       L  = (ei_layer *) ud;
    llama_ei_state * st = L->st;
    L->t_attn.enter();
    const int     nw = std::min(nth, st->ws_threads); // parts, as ei_op_profile's
    const ei_exec x  = ei_part(ith, nw, st->ws, st->ws_bytes);
    const int     ns = (int) st->slices.size();
    if (ns == 0 && ith == 0) { // no slices: ei_set_slices reported why
        ei_out_nan(dst, 0, dst->ne[1]);
    }
    for (int i = 0; i < ns && ith < nw; ++i) { // each sequence over its own keys, a planned one with its plan
        const auto &    sl = st->slices[(size_t) i];
        const ei_tensor q  = ei_slice_q(dst->src[0], sl);
        const ei_tensor k  = ei_slice_kv(L, dst->src[1], sl, 0);
        const ei_tensor v  = ei_slice_kv(L, dst->src[2], sl, 1);
        ei_out_tensor   o  = ei_slice_out(dst, q, sl);
        const ei_plan * plan = ei_slice_plan(L, sl);
        ei_result r = ei_attention_prefill(L->ctx, &x, &q, &k, &v, plan, &o, sl.m - sl.n);
        if (r != EI_OK && plan) {
            // argument checks fail alike in every thread: all of them retry without the plan
            ei_report_once("layer " + std::to_string(L->il) + ": ei_attention_prefill: " + ei_last_error() +
                           "; retrying without the plan (dense)");
            r = ei_attention_prefill(L->ctx, &x, &q, &k, &v, nullptr, &o, sl.m - sl.n);
        }
        if (r != EI_OK) {
            ei_report_once("layer " + std::to_string(L->il) + ": ei_attention_prefill: " + ei_last_error() +
                           "; the attention output of this ubatch is NaN");
            ei_out_nan(dst, sl.r0, sl.n);
        }
    }
    const int64_t t = L->t_attn.leave(nth);
    if (t >= 0) {
        st->stats.ns_attn += t;
    }
}

static void ei_op_time_begin(ggml_tensor * dst, int ith, int nth, void * ud) {
    (void) dst; (void) nth;
    if (ith == 0) {
        ((ei_layer *) ud)->t_dense0 = ei_now_ns();
    }
}

// What the timing ops measure: llama.cpp's dense attention (mode time-dense), or the mask and
// llama.cpp's attention through it (executor mask).
static int64_t & ei_timed_ns(llama_ei_state * st) {
    return st->opts.mode == EI_MODE_TIME_DENSE ? st->stats.ns_dense : st->stats.ns_attn;
}

static void ei_op_time_end(ggml_tensor * dst, int ith, int nth, void * ud) {
    (void) dst; (void) nth;
    if (ith == 0) {
        ei_layer * L = (ei_layer *) ud;
        ei_timed_ns(L->st) += ei_now_ns() - L->t_dense0;
    }
}

// Executor mask: the plan as llama.cpp's KQ mask. Stream i of a mask tensor [n_kv, rows, heads,
// streams] (f16 with flash attention, f32 without) as an ei_mask of rows [r0, r1).
static ei_mask ei_mask_view(const ggml_tensor * t, int i, int64_t r0, int64_t r1) {
    const size_t es = ggml_type_size(t->type);
    ei_mask m;
    m.data        = (char *) t->data + (size_t) i * t->nb[3] + (size_t) r0 * t->nb[1];
    m.dtype       = t->type == GGML_TYPE_F16 ? EI_F16 : EI_F32;
    m.n_heads     = (int32_t) t->ne[2];
    m.n_rows      = r1 - r0;
    m.n_keys      = t->ne[0];
    m.row_stride  = (int64_t) (t->nb[1] / es);
    m.head_stride = (int64_t) (t->nb[2] / es);
    return m;
}

// Rows [r0, r1) of sequence slice i (EI_LAYOUT_CELLS: its keys are the cells from 0): llama.cpp's
// mask (src 0) where the plan lets a query see a key, -inf elsewhere; without a usable plan the mask
// as it is (dense attention, exact). A mask of several streams has each slice's rows in its stream.
static bool ei_mask_rows(ei_layer * L, ei_context * c, ggml_tensor * dst, int i, int64_t r0, int64_t r1) {
    llama_ei_state * st   = L->st;
    const auto &     sl   = st->slices[(size_t) i];
    const int64_t    off  = dst->src[0]->ne[3] > 1 ? 0 : sl.r0;
    const ei_mask    base = ei_mask_view(dst->src[0], sl.view, off + r0, off + r1);
    ei_mask          out  = ei_mask_view(dst, sl.view, off + r0, off + r1);
    const ei_plan *  plan = ei_slice_plan(L, sl);
    ei_result r = c ? ei_plan_mask(c, plan, sl.q_pos + r0, &base, &out) : EI_ERR_UNSUPPORTED;
    if (r != EI_OK && c && plan) {
        ei_report_once("layer " + std::to_string(L->il) + ": ei_plan_mask: " + ei_last_error() +
                       "; this ubatch attends densely (the mask as llama.cpp made it)");
        r = ei_plan_mask(c, nullptr, sl.q_pos + r0, &base, &out);
    }
    return r == EI_OK;
}

static void ei_op_mask(ggml_tensor * dst, int ith, int nth, void * ud) {
    ei_layer *       L  = (ei_layer *) ud;
    llama_ei_state * st = L->st;
    const int        ns = (int) st->slices.size();
    for (int i = 0; i < ns; ++i) { // each sequence's rows, split over the threads
        const int64_t n = st->slices[(size_t) i].n, r0 = n * ith / nth, r1 = n * (ith + 1) / nth;
        if (r0 < r1 && !ei_mask_rows(L, L->ctx, dst, i, r0, r1)) {
            ei_report_once("layer " + std::to_string(L->il) + ": ei_plan_mask: " + ei_last_error() +
                           "; the attention output of this ubatch is unspecified");
        }
    }
}

// Observe the ubatch's queries (dst->src[0]) in each observed sequence's decoder of the layer: a
// sequence in one run of rows gives its last `window` rows, whose positions end at its next_pos (a
// prompt call of a whole window may skip ahead); in several runs (a unified cache's mixed ubatch)
// each run, in order (the library keeps the last `window`). c: the layer's context (GPU: the stream's).
static void ei_observe_layer(ei_layer * L, ei_context * c, ggml_tensor * dst) {
    llama_ei_state * st = L->st;
    const ei_tensor  q0 = ei_view(dst->src[0]);
    for (size_t seq = 0; seq < st->seqs.size(); ++seq) {
        auto & S = st->seqs[seq];
        if (!S.active) {
            continue;
        }
        ei_decoder * dec = &L->decs[seq].dec;
        for (const auto & r : S.runs) {
            int64_t r0 = r[0], q_pos = r[2];
            if (S.runs.size() == 1) {
                const int64_t keep = std::min<int64_t>(r[1] - r[0], dec->window);
                r0    = r[1] - keep;
                q_pos = S.next_pos - keep;
            }
            ei_tensor q = q0;
            q.data     = (const float *) q0.data + (size_t) r0 * (size_t) q0.token_stride;
            q.n_tokens = r[1] - r0;
            if (!c || ei_decode_observe(c, dec, &q, q_pos, S.generated) != EI_OK) {
                ei_decode_refuse_seq(st, (llama_seq_id) seq, "layer " + std::to_string(L->il) + ": ei_decode_observe: " +
                                     (c ? ei_last_error() : "no CUDA context"));
                break;
            }
        }
    }
}

// Observe the queries of this ubatch in the layer's decoders (one thread; each decoder keeps the
// last `window` of its sequence).
static void ei_op_observe(ggml_tensor * dst, int ith, int nth, void * ud) {
    (void) nth;
    ei_layer *       L  = (ei_layer *) ud;
    llama_ei_state * st = L->st;
    if (ith != 0 || !st->obs_any || !L->has_dec) {
        return;
    }
    ei_observe_layer(L, L->gpu ? nullptr : L->ctx, dst);
}

// The GPU twins of the custom ops (ggml-cuda calls them with its stream; registered by
// ei_gpu_register): the same library calls on the stream's CUDA contexts, over device tensors.

// An op of a layer served on the GPU, on ggml's stream (false, reported: a layer of the host).
static bool ei_gpu_op_begin(ei_layer * L, void * stream, const char * op) {
    L->st->g_stream  = stream;
    L->st->g_pending = true;
    if (!L->gpu) {
        ei_report_once("layer " + std::to_string(L->il) + ": " + op + " was scheduled on the GPU but its KV cache is in host "
                       "memory: its output is unspecified");
        return false;
    }
    return true;
}

static void ei_cuda_profile(ggml_tensor * dst, void * stream, void * ud) {
    ei_layer *       L  = (ei_layer *) ud;
    llama_ei_state * st = L->st;
    if (!ei_gpu_op_begin(L, stream, "ei_profile")) {
        L->fail("scheduled on the GPU");
        return;
    }
    ei_context *    c  = ei_gpu_context(st, L->scale_plan, stream, 1);
    const int64_t   t0 = st->opts.gpu_timing ? ei_gpu_time(st, c) : 0;
    const auto &    ws = st->gbuf[EI_G_PROFILE_WS];
    const ei_exec   x  = ei_part(0, 1, ws.first, ws.second); // one call: every kv head, finalised
    if (!ei_profile_slices(L, c, x, dst)) {
        L->fail("ei_profile_chunk (GPU)");
    }
    L->ns_plan = st->opts.gpu_timing ? ei_gpu_time(st, c) - t0 : 0;
}

static void ei_cuda_finalize(ggml_tensor * dst, void * stream, void * ud) {
    ei_layer * L = (ei_layer *) ud;
    (void) dst;
    ei_gpu_op_begin(L, stream, "ei_finalize");
    ei_plan_done(L); // ei_profile_chunk finalised the plans on the GPU
    L->st->stats.ns_plan += L->ns_plan;
}

static void ei_cuda_attention(ggml_tensor * dst, void * stream, void * ud) {
    ei_layer *       L  = (ei_layer *) ud;
    llama_ei_state * st = L->st;
    if (!ei_gpu_op_begin(L, stream, "ei_attn")) {
        return;
    }
    ei_context *    c  = ei_gpu_context(st, L->scale, stream, 1);
    const int64_t   t0 = st->opts.gpu_timing ? ei_gpu_time(st, c) : 0;
    const auto &    ws = st->gbuf[EI_G_ATTN_WS];
    const ei_exec   x  = ei_part(0, 1, ws.first, ws.second); // one launch
    const int       ns = (int) st->slices.size();
    for (int i = 0; i < ns; ++i) { // each sequence over its own keys (views: no gather on the GPU)
        const auto &    sl = st->slices[(size_t) i];
        const ei_tensor q  = ei_slice_q(dst->src[0], sl);
        const ei_tensor k  = ei_slice_kv(L, dst->src[1], sl, 0);
        const ei_tensor v  = ei_slice_kv(L, dst->src[2], sl, 1);
        ei_out_tensor   o  = ei_slice_out(dst, q, sl);
        const ei_plan * plan = ei_slice_plan(L, sl);
        ei_result r = c ? ei_attention_prefill(c, &x, &q, &k, &v, plan, &o, sl.m - sl.n) : EI_ERR_UNSUPPORTED;
        if (r != EI_OK && c && plan) {
            ei_report_once("layer " + std::to_string(L->il) + ": ei_attention_prefill (GPU): " + ei_last_error() +
                           "; retrying without the plan (dense)");
            r = ei_attention_prefill(c, &x, &q, &k, &v, nullptr, &o, sl.m - sl.n);
        }
        if (r != EI_OK) {
            ei_report_once("layer " + std::to_string(L->il) + ": ei_attention_prefill (GPU): " + ei_last_error() +
                           "; the attention output of this ubatch is NaN");
            std::vector<float> nan((size_t) (o.n_tokens * o.n_heads * o.head_dim), NAN);
            if (c) {
                ei_device_copy(c, o.data, nan.data(), nan.size() * sizeof(float), EI_COPY_HOST_TO_DEVICE);
            }
        }
    }
    if (st->opts.gpu_timing) {
        st->stats.ns_attn += ei_gpu_time(st, c) - t0;
    }
}

static void ei_cuda_time_begin(ggml_tensor * dst, void * stream, void * ud) {
    (void) dst;
    ei_layer * L = (ei_layer *) ud;
    if (ei_gpu_op_begin(L, stream, "ei_time_begin")) {
        L->t_dense0 = ei_gpu_time(L->st, ei_gpu_context(L->st, L->scale, stream, 1));
    }
}

static void ei_cuda_time_end(ggml_tensor * dst, void * stream, void * ud) {
    (void) dst;
    ei_layer * L = (ei_layer *) ud;
    if (ei_gpu_op_begin(L, stream, "ei_time_end")) {
        ei_timed_ns(L->st) += ei_gpu_time(L->st, ei_gpu_context(L->st, L->scale, stream, 1)) - L->t_dense0;
    }
}

static void ei_cuda_mask(ggml_tensor * dst, void * stream, void * ud) {
    ei_layer * L = (ei_layer *) ud;
    if (!ei_gpu_op_begin(L, stream, "ei_mask")) {
        return;
    }
    ei_context * c  = ei_gpu_context(L->st, L->scale, stream, 1);
    const int    ns = (int) L->st->slices.size();
    for (int i = 0; i < ns; ++i) {
        if (!ei_mask_rows(L, c, dst, i, 0, L->st->slices[(size_t) i].n)) {
            ei_report_once("layer " + std::to_string(L->il) + ": ei_plan_mask (GPU): " + ei_last_error() +
                           "; the attention output of this ubatch is unspecified");
        }
    }
}

static void ei_cuda_observe(ggml_tensor * dst, void * stream, void * ud) {
    ei_layer * L = (ei_layer *) ud;
    if (!L->st->obs_any || !L->has_dec || !ei_gpu_op_begin(L, stream, "ei_observe")) {
        return;
    }
    ei_observe_layer(L, ei_gpu_context(L->st, L->scale, stream, 1), dst);
}

// Register the twins with ggml-cuda (once per process; false without the hook: a ggml-cuda
// without entropyinfer.patch, or no CUDA backend).
static bool ei_gpu_register() {
    typedef void (*cuda_op_t)(ggml_tensor *, void *, void *);
    typedef void (*register_t)(ggml_custom_op_t, cuda_op_t);
    static int registered = -1;
    std::lock_guard<std::mutex> lock(ei_mutex());
    if (registered < 0) {
        registered = 0;
        ggml_backend_reg_t reg = ggml_backend_reg_by_name("CUDA");
        register_t fn = reg ? (register_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_cuda_register_custom_op") : nullptr;
        if (fn) {
            fn(ei_op_profile,    ei_cuda_profile);
            fn(ei_op_finalize,   ei_cuda_finalize);
            fn(ei_op_attention,  ei_cuda_attention);
            fn(ei_op_time_begin, ei_cuda_time_begin);
            fn(ei_op_time_end,   ei_cuda_time_end);
            fn(ei_op_observe,    ei_cuda_observe);
            fn(ei_op_mask,       ei_cuda_mask);
            registered = 1;
        }
    }
    return registered == 1;
}

// Is a keep set due for this sequence (its decoders say so)?
static bool ei_seq_due(const llama_ei_state * st, llama_seq_id seq) {
    const auto & S = st->seqs[(size_t) seq];
    if (!S.started || S.off || S.paused || !S.has_dec || !ei_seq_enabled(st, seq)) {
        return false;
    }
    for (const auto & L : st->layers) {
        if (L->has_dec) {
            return ei_decode_due(L->ctx, &L->decs[(size_t) seq].dec) != 0;
        }
    }
    return false;
}

bool llama_ei_compress_due(const llama_ei_state * st) {
    if (!st || !st->opts.compress || st->dec_off) {
        return false;
    }
    for (size_t seq = 0; seq < st->seqs.size(); ++seq) {
        if (ei_seq_due(st, (llama_seq_id) seq)) {
            return true;
        }
    }
    return false;
}

// The KV cache whose cells the served layers use: a unified cache, or the
// base (full-attention) cache of an iSWA model, whose sliding-window cache
// keeps its own cells (those layers are never compressed).
static llama_kv_cache * ei_compress_cache(llama_memory_i * mem) {
    if (auto * kv = dynamic_cast<llama_kv_cache *>(mem)) {
        return kv;
    }
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        return iswa->get_base();
    }
    return nullptr;
}

// The first n cells of KV stream strm of a layer's K cache storage [streams][cells][kv heads][head_dim]
// (llama_kv_cache: one stream per sequence with --kv-unified off, ne[2] of the storage) as a tensor.
static ei_tensor ei_k_cells(const ei_layer * L, const ggml_tensor * k, uint32_t strm, int64_t n) {
    ei_tensor kt;
    kt.data         = (const char *) k->data + (size_t) strm * k->nb[2];
    kt.dtype        = ei_dtype_of(k->type);
    kt.n_heads      = L->n_head_kv;
    kt.head_dim     = L->head_dim;
    kt.n_tokens     = n;
    kt.token_stride = (int64_t) (k->nb[1] / ggml_type_size(k->type));
    kt.head_stride  = L->head_dim;
    return kt;
}

// The sequence's keep set from every layer's scores, on the CPU (the context's threads score).
// keep's positions: st->dec_positions.
static bool ei_select_shared_cpu(llama_ei_state * st, llama_kv_cache * kv, const std::vector<ei_layer *> & layers,
                                 llama_seq_id seq, uint32_t strm, int64_t n, ei_keep_set & keep) {
    char buf[256];
    ei_layer *    L0 = layers[0];
    const int32_t H = L0->n_head, KV = L0->n_head_kv;
    ei_decoder *  D0 = &L0->decs[(size_t) seq].dec;
    // the scoring in nt parts (query-head ranges) on threads of ours, one workspace for all of them
    // (ei_sizes.decode_keep for nt parts); shared_add and select_shared on this thread with it
    const int nt = std::max(1, std::min(st->n_threads, (int) H));
    ei_sizes  sizes;
    if (ei_sizes_of(L0->ctx, L0, n, nt, &sizes) != EI_OK) {
        ei_decode_refuse_seq(st, seq, std::string("ei_layer_sizes: ") + ei_last_error());
        return false;
    }
    const size_t ws_bytes = sizes.decode_keep;
    st->dec_ws.resize(std::max<size_t>(ws_bytes, 1));
    const ei_exec x1 = ei_part(0, 1, st->dec_ws.data(), ws_bytes);
    st->dec_shared.assign((size_t) n, 0.0f);
    for (ei_layer * L : layers) {
        const ggml_tensor * k = kv->get_k_storage(L->il);
        if (!ei_cache_type(k->type) || !k->data || !k->buffer || !ggml_backend_buffer_is_host(k->buffer) ||
            L->n_head != H || L->n_head_kv != KV) {
            snprintf(buf, sizeof buf, "layer %d: its K cache is not a host F16/BF16/F32 tensor of the first layer's shape", L->il);
            ei_decode_refuse(st, buf);
            return false;
        }
        const ei_decoder * dec = &L->decs[(size_t) seq].dec;
        const ei_tensor    kt  = ei_k_cells(L, k, strm, n);
        st->dec_scores.resize((size_t) H * (size_t) n);
        std::vector<ei_result> rs((size_t) nt, EI_OK);
        std::vector<std::string> msgs((size_t) nt);
        auto score = [&](int ith) {
            const ei_exec x = ei_part(ith, nt, st->dec_ws.data(), ws_bytes);
            rs[ith] = ei_decode_score(L->ctx, &x, dec, &kt, st->dec_row_pos.data(), 0, st->dec_scores.data());
            if (rs[ith] != EI_OK) {
                msgs[ith] = ei_last_error();
            }
        };
        std::vector<std::thread> pool;
        for (int ith = 1; ith < nt; ++ith) {
            pool.emplace_back(score, ith);
        }
        score(0);
        for (auto & t : pool) {
            t.join();
        }
        for (int ith = 0; ith < nt; ++ith) {
            if (rs[ith] != EI_OK) {
                ei_decode_refuse_seq(st, seq, "layer " + std::to_string(L->il) + ": ei_decode_score: " + msgs[ith]);
                return false;
            }
        }
        if (ei_decode_shared_add(L->ctx, &x1, &L->decs[(size_t) seq].dec, st->dec_scores.data(), n, st->dec_row_pos.data(),
                                 st->dec_shared.data()) != EI_OK) {
            ei_decode_refuse_seq(st, seq, "layer " + std::to_string(L->il) + ": ei_decode_shared_add: " + ei_last_error());
            return false;
        }
    }
    const int32_t cap = (int32_t) std::min<int64_t>(n, L0->ctx ? ei_context_config(L0->ctx)->decode_budget : n);
    st->dec_index.assign((size_t) std::max(cap, 1), 0);
    st->dec_positions.assign((size_t) std::max(cap, 1), 0);
    keep.heads_out = 1;
    keep.capacity  = std::max(cap, 1);
    keep.index     = st->dec_index.data();
    keep.positions = st->dec_positions.data();
    keep.row_pos   = st->dec_row_pos.data();
    if (ei_decode_select_shared(L0->ctx, &x1, D0, st->dec_shared.data(), n, &keep) != EI_OK) {
        ei_decode_refuse_seq(st, seq, std::string("ei_decode_select_shared: ") + ei_last_error());
        return false;
    }
    return true;
}

// The same on the GPU over the device K caches (the row map, scores, pooled sums and keep set in
// device memory; one context that waits for data errors: outside the graph), then the kept
// positions read back into st->dec_positions.
static bool ei_select_shared_gpu(llama_ei_state * st, llama_kv_cache * kv, const std::vector<ei_layer *> & layers,
                                 llama_seq_id seq, uint32_t strm, int64_t n, ei_keep_set & keep) {
    char buf[256];
    ei_layer *    L0 = layers[0];
    const int32_t H = L0->n_head, KV = L0->n_head_kv;
    ei_decoder *  D0 = &L0->decs[(size_t) seq].dec;
    ei_context *  c0 = ei_gpu_context(st, L0->scale, st->g_stream, 0);
    ei_sizes      sizes;
    if (!c0 || ei_sizes_of(c0, L0, n, 1, &sizes) != EI_OK) {
        ei_decode_refuse_seq(st, seq, std::string("ei_layer_sizes (GPU): ") + (c0 ? ei_last_error() : "no CUDA context"));
        return false;
    }
    const size_t ws_bytes = sizes.decode_keep;
    const int32_t cap = (int32_t) std::max<int64_t>(std::min<int64_t>(n, ei_context_config(c0)->decode_budget), 1);
    void * d_row = ei_gpu_buf(st, EI_G_ROW_POS, (size_t) n * sizeof(int32_t));
    void * d_scr = ei_gpu_buf(st, EI_G_SCORES, (size_t) H * (size_t) n * sizeof(float));
    void * d_shr = ei_gpu_buf(st, EI_G_SHARED, (size_t) n * sizeof(float));
    void * d_idx = ei_gpu_buf(st, EI_G_INDEX, (size_t) cap * sizeof(int32_t));
    void * d_pos = ei_gpu_buf(st, EI_G_POSITIONS, (size_t) cap * sizeof(int32_t));
    void * d_ws  = ei_gpu_buf(st, EI_G_DECODE_WS, ws_bytes);
    const ei_exec x = ei_part(0, 1, d_ws, ws_bytes); // one call each (device workspace)
    st->dec_shared.assign((size_t) n, 0.0f);
    if (!d_row || !d_scr || !d_shr || !d_idx || !d_pos || !d_ws ||
        ei_device_copy(c0, d_row, st->dec_row_pos.data(), (size_t) n * sizeof(int32_t), EI_COPY_HOST_TO_DEVICE) != EI_OK ||
        ei_device_copy(c0, d_shr, st->dec_shared.data(), (size_t) n * sizeof(float), EI_COPY_HOST_TO_DEVICE) != EI_OK) {
        ei_decode_refuse(st, std::string("device memory for decode compression: ") + ei_last_error());
        return false;
    }
    for (ei_layer * L : layers) {
        const ggml_tensor * k = kv->get_k_storage(L->il);
        ei_context *        c = ei_gpu_context(st, L->scale, st->g_stream, 0);
        if (!L->gpu || !c || ei_on_host(k) || L->n_head != H || L->n_head_kv != KV) {
            snprintf(buf, sizeof buf, "layer %d: its K cache is not on the GPU in the first layer's shape", L->il);
            ei_decode_refuse(st, buf);
            return false;
        }
        ei_decoder *    dec = &L->decs[(size_t) seq].dec;
        const ei_tensor kt  = ei_k_cells(L, k, strm, n);
        if (ei_decode_score(c, &x, dec, &kt, (const int32_t *) d_row, 0, (float *) d_scr) != EI_OK) {
            ei_decode_refuse_seq(st, seq, "layer " + std::to_string(L->il) + ": ei_decode_score (GPU): " + ei_last_error());
            return false;
        }
        if (ei_decode_shared_add(c, &x, dec, (const float *) d_scr, n, (const int32_t *) d_row, (float *) d_shr) != EI_OK) {
            ei_decode_refuse_seq(st, seq, "layer " + std::to_string(L->il) + ": ei_decode_shared_add (GPU): " + ei_last_error());
            return false;
        }
    }
    keep.heads_out = 1;
    keep.capacity  = cap;
    keep.index     = (int32_t *) d_idx;
    keep.positions = (int32_t *) d_pos;
    keep.row_pos   = (const int32_t *) d_row;
    if (ei_decode_select_shared(c0, &x, D0, (const float *) d_shr, n, &keep) != EI_OK) {
        ei_decode_refuse_seq(st, seq, std::string("ei_decode_select_shared (GPU): ") + ei_last_error());
        return false;
    }
    st->dec_positions.assign((size_t) cap, 0);
    if (keep.compressed && ei_device_copy(c0, st->dec_positions.data(), d_pos, (size_t) keep.n_kept * sizeof(int32_t),
                                          EI_COPY_DEVICE_TO_HOST) != EI_OK) {
        ei_decode_refuse_seq(st, seq, std::string("reading the kept positions back: ") + ei_last_error());
        return false;
    }
    keep.positions = st->dec_positions.data();
    return true;
}

// One sequence's keep set applied: its cells in its KV stream (with --kv-unified off, a stream of its
// own; in a unified cache the stream all sequences share) scored against its decoders, the positions
// not kept evicted from this sequence only (ei_evict: seq_rm of this sequence, which leaves a cell
// it shares with another sequence, e.g. a common prefix after seq_cp, to the other), then the
// stream compacted (ei_compact moves every non-empty cell of the stream, any sequence's, to the
// front, in cell order).
static void ei_compress_seq(llama_ei_state * st, llama_kv_cache * kv, const std::vector<ei_layer *> & layers,
                            llama_seq_id seq) {
    const int64_t  t0   = ei_now_ns();
    const uint32_t strm = kv->get_stream(seq);
    // the sequence's rows of the stream: -1 for empty cells and other sequences' cells (never
    // scored or kept); a cell it shares with another sequence is scored as its own
    int64_t n = 0, used_before = 0;
    {
        const llama_kv_cells & cells = kv->get_cells(seq);
        n = cells.used_max_p1();
        st->dec_row_pos.assign((size_t) n, -1);
        for (int64_t j = 0; j < n; ++j) {
            if (!cells.is_empty((uint32_t) j) && cells.seq_has((uint32_t) j, seq)) {
                st->dec_row_pos[(size_t) j] = cells.pos_get((uint32_t) j);
                ++used_before;
            }
        }
    }
    int64_t row_bytes = 0; // K and V bytes of one cell over the cache's layers
    for (ei_layer * L : layers) {
        const ggml_tensor * k = kv->get_k_storage(L->il);
        row_bytes += 2 * (int64_t) k->nb[1];
    }

    // one keep-set for the sequence: every layer's scores, each layer weighing 1
    ei_keep_set keep;
    memset(&keep, 0, sizeof keep);
    if (!(layers[0]->gpu ? ei_select_shared_gpu(st, kv, layers, seq, strm, n, keep)
                         : ei_select_shared_cpu(st, kv, layers, seq, strm, n, keep))) {
        return;
    }
    if (keep.compressed) {
        // evict the positions not kept, in runs, through llama.cpp's own memory API
        std::vector<int32_t> kept(st->dec_positions.begin(), st->dec_positions.begin() + keep.n_kept), held;
        std::sort(kept.begin(), kept.end());
        for (int64_t j = 0; j < n; ++j) {
            if (st->dec_row_pos[(size_t) j] >= 0) {
                held.push_back(st->dec_row_pos[(size_t) j]);
            }
        }
        std::sort(held.begin(), held.end());
        size_t ik = 0;
        for (size_t i = 0; i < held.size();) {
            while (ik < kept.size() && kept[ik] < held[i]) {
                ++ik;
            }
            if (ik < kept.size() && kept[ik] == held[i]) {
                ++i;
                continue;
            }
            size_t e = i + 1; // a run of evicted positions: held[i..e) with no kept one between
            while (e < held.size() && (ik >= kept.size() || held[e] < kept[ik])) {
                ++e;
            }
            kv->ei_evict(seq, held[i], held[e - 1] + 1); // this sequence's only; recorded: ei_first_missing
            i = e;
        }
        if (kv->ei_compact(strm) < 0) {
            ei_report_once("decode compression: the V cache is transposed, cells evicted but not moved to the front");
        }
    }
    int64_t used_after = 0;
    {
        const llama_kv_cells & cells = kv->get_cells(seq);
        for (uint32_t j = 0; j < cells.used_max_p1(); ++j) {
            used_after += !cells.is_empty(j) && cells.seq_has(j, seq) ? 1 : 0;
        }
    }
    const int64_t ns = ei_now_ns() - t0;
    auto & S = st->seqs[(size_t) seq];
    if (S.compressions == 0) {
        S.cells_before = used_before;
        S.bytes_before = used_before * row_bytes;
        st->stats.seqs_compressed++;
    }
    S.compressions++;
    S.cells_after  = used_after;
    S.bytes_after  = used_after * row_bytes;
    S.ns_compress += ns;
    ei_stats & s = st->stats;
    if (s.compressions == 0) {
        s.cells_before = used_before;
        s.bytes_before = used_before * row_bytes;
    }
    s.compressions++;
    s.cells_after  = used_after;
    s.bytes_after  = used_after * row_bytes;
    s.ns_compress += ns;
}

// At the end of llama_decode: every sequence whose decoders are due, one after the other.
void llama_ei_compress(llama_ei_state * st, llama_memory_i * mem) {
    if (!llama_ei_compress_due(st)) {
        return;
    }
    ei_gpu_settle(st);
    char buf[256];
    llama_kv_cache * kv = ei_compress_cache(mem);
    if (!kv) {
        ei_decode_refuse(st, "the model's memory is not a KV cache (recurrent or hybrid memory)");
        return;
    }
    if (kv->get_has_shift()) {
        ei_decode_refuse(st, "a context shift is pending");
        return;
    }
    // every layer of the cache must be observed: evicting a cell removes it from all of them
    std::vector<ei_layer *> layers;
    for (uint32_t il : kv->get_layer_ids()) {
        ei_layer * L = il < st->layers.size() ? st->layers[il].get() : nullptr;
        if (!L || !L->has_dec) {
            snprintf(buf, sizeof buf, "layer %u shares the KV cells but is not served (see above): evicting its cells "
                     "would change it", il);
            ei_decode_refuse(st, buf);
            return;
        }
        layers.push_back(L);
    }
    if (layers.empty()) {
        return;
    }
    for (size_t seq = 0; seq < st->seqs.size() && !st->dec_off; ++seq) {
        if (ei_seq_due(st, (llama_seq_id) seq)) {
            ei_compress_seq(st, kv, layers, (llama_seq_id) seq);
        }
    }
}

// The state behind ctx for an info call, its out zeroed first; nullptr (the call returns -1) when
// out is NULL or entropyinfer is off for ctx.
static const llama_ei_state * ei_info_state(const llama_context * ctx, void * out, size_t bytes) {
    if (!out) {
        return nullptr;
    }
    memset(out, 0, bytes);
    return ctx ? ctx->get_cparams().ei : nullptr;
}

int llama_entropyinfer_get_decode_info(const llama_context * ctx, llama_entropyinfer_decode_info * out) {
    const llama_ei_state * st = ei_info_state(ctx, out, sizeof *out);
    if (!st) {
        return -1;
    }
    out->compressions = st->stats.compressions;
    out->cells_before = st->stats.cells_before;
    out->cells_after  = st->stats.cells_after;
    out->bytes_before = st->stats.bytes_before;
    out->bytes_after  = st->stats.bytes_after;
    out->seconds      = st->stats.ns_compress * 1e-9;
    out->sequences    = st->stats.seqs_compressed;
    return 0;
}

int llama_entropyinfer_get_prefill_info(const llama_context * ctx, llama_entropyinfer_prefill_info * out) {
    const llama_ei_state * st = ei_info_state(ctx, out, sizeof *out);
    if (!st) {
        return -1;
    }
    ei_gpu_settle(const_cast<llama_ei_state *>(st)); // the GPU ubatches' keep counts not read yet (waits for them)
    out->ubatches        = st->stats.ubatches;
    out->ubatches_served = st->stats.ubatches_served;
    out->sequences       = st->stats.seqs_served;
    out->density         = st->stats.causal > 0 ? st->stats.kept / st->stats.causal : 1.0;
    return 0;
}

int llama_entropyinfer_get_seq_decode_info(const llama_context * ctx, llama_seq_id seq, llama_entropyinfer_decode_info * out) {
    const llama_ei_state * st = ei_info_state(ctx, out, sizeof *out);
    if (!st || seq < 0 || (size_t) seq >= st->seqs.size()) {
        return -1;
    }
    const auto & S = st->seqs[(size_t) seq];
    out->compressions = S.compressions;
    out->cells_before = S.cells_before;
    out->cells_after  = S.cells_after;
    out->bytes_before = S.bytes_before;
    out->bytes_after  = S.bytes_after;
    out->seconds      = S.ns_compress * 1e-9;
    out->sequences    = S.compressions > 0 ? 1 : 0;
    return 0;
}

// ---------------------------------------------------------------- positions after compression

// ctx's sequence seq, or a message on stderr (bad arguments are the caller's bug, reported, no crash)
static bool ei_seq_valid(const llama_context * ctx, llama_seq_id seq, const char * fn) {
    if (!ctx || seq < 0 || (uint32_t) seq >= llama_n_seq_max(ctx)) {
        fprintf(stderr, "%s: %s: sequence %d of a context with %u\n", fn, ctx ? "no such sequence" : "no context", (int) seq,
                ctx ? llama_n_seq_max(ctx) : 0u);
        return false;
    }
    return true;
}

llama_pos llama_entropyinfer_seq_first_missing(const llama_context * ctx, llama_seq_id seq) {
    if (!ei_seq_valid(ctx, seq, __func__)) {
        return -2;
    }
    const llama_kv_cache * kv = ei_compress_cache(llama_get_memory(ctx));
    return kv ? kv->ei_first_missing(seq) : -1; // other memory is never compressed
}

bool llama_entropyinfer_seq_rewind(llama_context * ctx, llama_seq_id seq, llama_pos p0) {
    if (!ei_seq_valid(ctx, seq, __func__)) {
        return false;
    }
    const bool prev = llama_kv_cache::ei_set_rewind(true);
    const bool ok   = llama_memory_seq_rm(llama_get_memory(ctx), seq, p0, -1);
    llama_kv_cache::ei_set_rewind(prev);
    llama_ei_state * st = ctx->get_cparams().ei;
    if (ok && st && (size_t) seq < st->seqs.size() && st->seqs[(size_t) seq].started && p0 < st->seqs[(size_t) seq].next_pos) {
        st->seqs[(size_t) seq].rewound = true; // its next ubatch continues at p0: observation starts over there
    }
    return ok;
}

int llama_entropyinfer_seq_set_enabled(llama_context * ctx, llama_seq_id seq, bool enabled) {
    llama_ei_state * st = ctx ? ctx->get_cparams().ei : nullptr;
    if (!st) {
        return -1; // entropyinfer is off for this context: nothing to turn on or off
    }
    if (seq < 0) {
        st->all_on = enabled;
        st->seq_on.clear();
        return 0;
    }
    if (!ei_seq_valid(ctx, seq, __func__)) {
        return -1;
    }
    st->seq_on[seq] = enabled;
    return 0;
}

// ---------------------------------------------------------------- graph

// Executor mask: llama.cpp's attention (build_attn_mha: flash attention with -fa, else soft_max)
// through the plan's mask. One mask head where the layer has one kv head (the plan's keys exactly);
// with several, one per query head on the CPU (exact: ggml broadcasts mask heads as h % ne32, not by
// GQA group), and on the GPU the union of the kv heads' keys in one head (more keys than the plan:
// ggml-cuda's flash attention takes no mask with ne32 > 1 and would run the op on the CPU, 200x
// slower on SmolLM2 8k). The mask is as large as llama.cpp's own per head: n_kv x tokens x 2 bytes.
// n_kv_max, ggml's sparse-mask
// hint (finite entries per row at most), is the plan's bound: the budget cap's keys and the
// segment's own (ei_mask_bound), or 0 (none) when a row may see every earlier key. Timed as
// llama.cpp's attention is in mode time-dense (ns_attn here).
static ggml_tensor * ei_build_attn_masked(const llm_graph_context & g, ei_layer * L, llm_graph_input_ei * in,
                                          ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * kq_b,
                                          ggml_tensor * kq_mask, ggml_tensor * sinks, ggml_tensor * v_mla, float kq_scale,
                                          int il, ggml_tensor * fin) {
    ggml_context * ctx0  = g.ctx0;
    const bool     timed = !L->gpu || L->st->opts.gpu_timing; // GPU times synchronise: only when asked
    ggml_tensor *  t0    = nullptr;
    if (timed) {
        ggml_tensor * a0[4] = { q, k, v, fin };
        t0 = ggml_custom_4d(ctx0, GGML_TYPE_F32, 1, 1, 1, 1, a0, 4, ei_op_time_begin, 1, L);
        ggml_format_name(t0, "ei_time_begin-%d", il);
        ggml_build_forward_expand(g.gf, t0);
    }
    const int64_t heads = L->n_head_kv == 1 || L->gpu ? 1 : L->n_head;
    ggml_tensor * a1[3] = { kq_mask, fin, t0 };
    ggml_tensor * mask  = ggml_custom_4d(ctx0, kq_mask->type, kq_mask->ne[0], kq_mask->ne[1], heads, kq_mask->ne[3], a1,
                                         timed ? 3 : 2, ei_op_mask, GGML_N_TASKS_MAX, L);
    ggml_format_name(mask, "ei_mask-%d", il);
    ggml_tensor * cur = g.build_attn_mha(q, k, v, kq_b, mask, sinks, v_mla, in->n_kv_max, kq_scale, il);
    if (timed) {
        ggml_tensor * a2[2] = { cur, t0 };
        ggml_tensor * t1    = ggml_custom_4d(ctx0, GGML_TYPE_F32, 1, 1, 1, 1, a2, 2, ei_op_time_end, 1, L);
        ggml_format_name(t1, "ei_time_end-%d", il);
        ggml_build_forward_expand(g.gf, t1);
    }
    return cur;
}

ggml_tensor * llama_ei_build_attn(
        const llm_graph_context      & g,
        const llama_kv_cache_context * mctx,
        ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
        ggml_tensor * kq_b, ggml_tensor * kq_mask, ggml_tensor * sinks, ggml_tensor * v_mla,
        float kq_scale, int il) {
    llama_ei_state * st = g.cparams.ei;
    if (!st || il < 0 || il >= st->n_layer) {
        return g.build_attn_mha(q, k, v, kq_b, kq_mask, sinks, v_mla, 0, kq_scale, il);
    }
    ei_layer * L = st->layers[il].get();
    if (L->status == 0) {
        const char * why = ei_layer_reason(st, g, mctx, q, k, v, kq_b, sinks, v_mla, il);
        if (why) {
            ei_report_once(why);
            L->status = -1;
        } else {
            L->status = ei_layer_setup(st, L, g, mctx, q, k, kq_scale) ? 1 : -1;
        }
        if (L->status == 1) {
            st->stats.layers_served++;
        }
    }
    if (L->status != 1) {
        return g.build_attn_mha(q, k, v, kq_b, kq_mask, sinks, v_mla, 0, kq_scale, il);
    }

    llm_graph_input_ei * in = ei_graph_input(g, st, mctx);
    st->n_threads = std::max(1, (int) g.cparams.n_threads);
    if (L->has_dec) { // decode compression: the queries of every ubatch (observed when ei_observe_decide says so)
        ggml_tensor * a[1] = { q };
        ggml_tensor * obs = ggml_custom_4d(g.ctx0, GGML_TYPE_F32, 1, 1, 1, 1, a, 1, ei_op_observe, 1, L);
        ggml_format_name(obs, "ei_observe-%d", il);
        ggml_build_forward_expand(g.gf, obs);
    }
    // the K/V views: one stream per sequence of the ubatch with --kv-unified off, else the one stream
    const int64_t n_views = mctx->get_kv()->get_n_stream() > 1 && g.ubatch.seq_id_unq ? std::max<int64_t>(g.ubatch.n_seqs_unq, 1) : 1;
    if (in->decision == EI_SERVE && (k->ne[3] != n_views || v->ne[3] != n_views)) {
        ei_report_once("the K/V views' streams are not the ubatch's sequences: llama.cpp's attention");
        in->decision = EI_FALLBACK; // the whole graph: later layers see it too
    }
    if (in->decision != EI_SERVE) {
        return g.build_attn_mha(q, k, v, kq_b, kq_mask, sinks, v_mla, 0, kq_scale, il);
    }
    if (L->gpu && in->layout == EI_LAYOUT_GATHER) {
        ei_report_once("a sequence's cells are not one run in position order (a unified cache of several sequences): "
                       "llama.cpp's attention in the layers on the GPU for such ubatches");
        return g.build_attn_mha(q, k, v, kq_b, kq_mask, sinks, v_mla, 0, kq_scale, il);
    }
    if (st->opts.executor == EI_EXEC_MASK && st->opts.mode == EI_MODE_SPARSE && kq_mask && in->layout != EI_LAYOUT_CELLS) {
        ei_report_once("executor mask: a sequence's keys are not the cells from 0 in position order (a unified cache of "
                       "several sequences, or a compressed prefix): llama.cpp's attention for such ubatches");
        return g.build_attn_mha(q, k, v, kq_b, kq_mask, sinks, v_mla, 0, kq_scale, il);
    }
    in->served_layers++;
    if (!L->gpu) {
        L->k_row = ggml_row_size(k->type, k->ne[0] * k->ne[1]);
        L->v_row = ggml_row_size(v->type, v->ne[0] * v->ne[1]);
    }

    ggml_context * ctx0 = g.ctx0;
    if (st->opts.mode == EI_MODE_TIME_DENSE) {
        ggml_tensor * a0[3] = { q, k, v };
        ggml_tensor * t0 = ggml_custom_4d(ctx0, GGML_TYPE_F32, 1, 1, 1, 1, a0, 3, ei_op_time_begin, 1, L);
        ggml_format_name(t0, "ei_time_begin-%d", il);
        ggml_build_forward_expand(g.gf, t0);
        ggml_tensor * cur = g.build_attn_mha(q, k, v, kq_b, kq_mask, sinks, v_mla, 0, kq_scale, il);
        ggml_tensor * a1[2] = { cur, t0 };
        ggml_tensor * t1 = ggml_custom_4d(ctx0, GGML_TYPE_F32, 1, 1, 1, 1, a1, 2, ei_op_time_end, 1, L);
        ggml_format_name(t1, "ei_time_end-%d", il);
        ggml_build_forward_expand(g.gf, t1);
        return cur;
    }

    ggml_tensor * gat = nullptr; // the gathered K/V rows, read by the profile and attention ops
    if (in->layout == EI_LAYOUT_GATHER) {
        ggml_tensor * ag[2] = { k, v };
        gat = ggml_custom_4d(ctx0, GGML_TYPE_F32, 1, 1, 1, 1, ag, 2, ei_op_gather, GGML_N_TASKS_MAX, L);
        ggml_format_name(gat, "ei_gather-%d", il);
    }
    ggml_tensor * fin = nullptr;
    if (st->opts.mode == EI_MODE_SPARSE) {
        ggml_tensor * a0[3] = { ei_raw_query(q), k, gat };
        ggml_tensor * prof = ggml_custom_4d(ctx0, GGML_TYPE_F32, 1, 1, 1, 1, a0, gat ? 3 : 2, ei_op_profile, GGML_N_TASKS_MAX, L);
        ggml_format_name(prof, "ei_profile-%d", il);
        ggml_tensor * a1[1] = { prof };
        fin = ggml_custom_4d(ctx0, GGML_TYPE_F32, 1, 1, 1, 1, a1, 1, ei_op_finalize, 1, L);
        ggml_format_name(fin, "ei_finalize-%d", il);
    }
    if (fin && kq_mask && st->opts.executor == EI_EXEC_MASK) {
        return ei_build_attn_masked(g, L, in, q, k, v, kq_b, kq_mask, sinks, v_mla, kq_scale, il, fin);
    }
    // the KQ mask is not read; as a source it stays allocated, so llama.cpp's graph-reuse check
    // of the mask's size (n_kv) stays in force
    ggml_tensor * a2[6] = { q, k, v, nullptr, nullptr, nullptr };
    int n_args = 3;
    if (kq_mask) {
        a2[n_args++] = kq_mask;
    }
    if (fin) {
        a2[n_args++] = fin;
    }
    if (gat) {
        a2[n_args++] = gat;
    }
    ggml_tensor * out = ggml_custom_4d(ctx0, GGML_TYPE_F32, q->ne[0] * q->ne[1], q->ne[2], 1, 1,
                                       a2, n_args, ei_op_attention, GGML_N_TASKS_MAX, L);
    ggml_format_name(out, "ei_attn-%d", il);
    ggml_build_forward_expand(g.gf, out);
    return out;
}
