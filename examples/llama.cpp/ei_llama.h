// ei_llama.h - entropyinfer inside llama.cpp: the glue's entry points.
//
// ei_llama.cpp is compiled into libllama by entropyinfer.patch (which also
// builds llama-ei-decode, ei_decode_eval.cpp), and called from these places
// of llama.cpp:
//   common/arg.cpp      --entropyinfer, --entropyinfer-opt NAME=VALUE
//   llama_context       create / free the per-context state (cparams.ei),
//                       announce each ubatch of llama_decode (is it the last?),
//                       decode compression at the end of llama_decode
//   llama_kv_cache      ei_compact: move the cells in use to the front; ei_evict and
//                       ei_first_missing: the record of evicted positions (seq_rm
//                       refuses a truncation that would keep one)
//   llama-server        reuse at most [0, F) of a compressed slot, the request
//                       field "entropyinfer"; speculative rollbacks: seq_rewind
//   build_attn          (KV-cache and iSWA variants) llama_ei_build_attn instead
//                       of build_attn_mha: entropyinfer's planning and block-sparse
//                       attention as ggml custom ops for the layers and ubatches
//                       it can serve exactly, llama.cpp's attention otherwise.
// Disabled (no --entropyinfer), cparams.ei is null and every hook reduces to
// the unpatched code path: same graph, same numbers.
#pragma once

#include "llama.h"

#include <cstddef>
#include <cstdint>

// ---- command line (process-wide options, read when a context is created)

#ifdef __cplusplus
extern "C" {
#endif

// Turn entropyinfer on with the paper's configuration (ei_config_default()).
LLAMA_API void llama_entropyinfer_enable(void);

// "name=value[,name=value...]": a numeric ei_config field or a glue option
// (see llama_entropyinfer_help()). Implies llama_entropyinfer_enable().
// Returns 0, or -1 with a message in err.
LLAMA_API int llama_entropyinfer_option(const char * name_values, char * err, size_t err_size);

// Back to entropyinfer off and the paper's configuration (the options as at start-up). A context
// keeps the options it was created with, so a program can create contexts with other options in
// turn (llama-ei-decode --run: one saved prefill, each decode policy in its own context).
LLAMA_API void llama_entropyinfer_reset(void);

// Help text of the options.
LLAMA_API const char * llama_entropyinfer_help(void);

// Decode compression of a context so far (all zero when it never compressed).
struct llama_entropyinfer_decode_info {
    int32_t compressions;   // keep-sets computed and applied
    int64_t cells_before;   // KV cells in use before the first compression (the compressed cache)
    int64_t cells_after;    // ... after the last one
    int64_t bytes_before;   // their K/V bytes
    int64_t bytes_after;
    double  seconds;        // scoring, selection, eviction and compaction, summed
    int32_t sequences;      // distinct sequences compressed (each has its own decoders and keep set)
};
// 0, or -1 when entropyinfer is off for ctx. Cells and bytes are those of the sequence compressed
// (its cells in its KV stream), at the context's first compression and at its last.
LLAMA_API int llama_entropyinfer_get_decode_info(const struct llama_context * ctx, struct llama_entropyinfer_decode_info * out);
// The same for one sequence: its own compressions, its cells before its first and after its last.
// 0, or -1 when entropyinfer is off for ctx or seq is out of range.
LLAMA_API int llama_entropyinfer_get_seq_decode_info(const struct llama_context * ctx, llama_seq_id seq,
                                                     struct llama_entropyinfer_decode_info * out);

// Prefill: what entropyinfer served in ctx so far (a unified cache's ubatches that mix sequences
// included: each sequence planned and attended over its own cells).
struct llama_entropyinfer_prefill_info {
    int64_t ubatches;        // ubatches llama_decode computed
    int64_t ubatches_served; // ... whose attention entropyinfer ran in its served layers
    int32_t sequences;       // distinct sequences with a served ubatch
    double  density;         // keys attended / causal keys over the sparse segments' queries (1: none sparse)
};
// 0, or -1 when entropyinfer is off for ctx.
LLAMA_API int llama_entropyinfer_get_prefill_info(const struct llama_context * ctx, struct llama_entropyinfer_prefill_info * out);

// Positions after decode compression. llama_memory_seq_pos_min/max still span the positions a
// compression evicted; the first missing one is F below, and llama_memory_seq_rm(mem, seq, p0, -1)
// with p0 > F (a truncation that keeps a prefix with a hole) returns false: clear the sequence and
// process the prompt again, or keep [0, F) with seq_rm(mem, seq, F, -1). A removal inside the
// sequence (a context shift's discard) is allowed, and shifts move the record with the cells.
// A restored sequence (llama_state_seq_set_data) counts every position below its max that no
// restored cell holds as missing.

// F: the lowest position below seq's max that the KV cache no longer holds; -1 when none is
// missing (or the memory is not a KV cache), -2 for a bad ctx/seq (reported on stderr).
LLAMA_API llama_pos llama_entropyinfer_seq_first_missing(const struct llama_context * ctx, llama_seq_id seq);

// Speculative decoding's rollback: remove positions [p0, end) of seq (p0 < 0: all, as seq_rm), the
// tokens the caller just added, even when p0 > F (the generation continues over its compressed
// cache; decode compression observes again from p0). true on success, false for a bad ctx/seq
// (reported) or when the memory refuses (as llama_memory_seq_rm).
LLAMA_API bool llama_entropyinfer_seq_rewind(struct llama_context * ctx, llama_seq_id seq, llama_pos p0);

// Per request: entropyinfer (sparse prefill and decode compression) on or off for seq, or for
// every sequence without a setting of its own when seq < 0. The other options stay process-wide
// (the state is sized when the context is created). 0, or -1 when entropyinfer is off for ctx
// or seq is out of range.
LLAMA_API int llama_entropyinfer_seq_set_enabled(struct llama_context * ctx, llama_seq_id seq, bool enabled);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
// ---- inside libllama (llama-context.cpp, llama-graph.cpp)

struct ggml_tensor;
struct llama_model;
struct llama_cparams;
struct llama_ubatch;
struct llm_graph_context;
class  llama_kv_cache_context;
struct llama_ei_state;

// nullptr when entropyinfer is off; throws std::runtime_error on a bad configuration.
llama_ei_state * llama_ei_context_init(const llama_model & model, const llama_cparams & cparams);
void             llama_ei_context_free(llama_ei_state * st);

// Around each ubatch of llama_context::decode: `last` is true for the last
// ubatch of the call (the end of the prompt: is_final for the planner);
// n_tokens_all: the call's tokens; balloc: the call's batch (a sequence with
// one position in it: a generated token of that sequence).
class llama_batch_allocr;
void llama_ei_ubatch_begin(llama_ei_state * st, const llama_ubatch & ubatch, bool last, uint32_t n_tokens_all,
                           const llama_batch_allocr * balloc);
void llama_ei_ubatch_end  (llama_ei_state * st);

// At the end of llama_context::decode: is a decode compression due (a
// sequence's decoders in the observed layers say so)? Then, after
// synchronising, compress every sequence that is due: one keep-set per
// sequence, its other cells evicted with seq_rm of that sequence and the
// cells in use of its KV stream moved to the front (llama_kv_cache::ei_compact).
struct llama_memory_i;
bool llama_ei_compress_due(const llama_ei_state * st);
void llama_ei_compress    (llama_ei_state * st, llama_memory_i * mem);

// build_attn_mha's replacement: returns the attention output
// [n_embd_head_v*n_head, n_tokens], built by entropyinfer or by build_attn_mha.
ggml_tensor * llama_ei_build_attn(
        const llm_graph_context      & g,
        const llama_kv_cache_context * mctx,
        ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
        ggml_tensor * kq_b, ggml_tensor * kq_mask, ggml_tensor * sinks, ggml_tensor * v_mla,
        float kq_scale, int il);
#endif
