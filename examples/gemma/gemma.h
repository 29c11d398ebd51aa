/* gemma.h - a small, readable Gemma 3 inference engine (CPU, f32) that runs
   a GGUF file and hooks entropyinfer into the attention of its global layers.

   Pieces:
     gm_tokenizer   SentencePiece-style tokenizer from the GGUF metadata
     gm_model       hyper-parameters + weights dequantized to f32 at load
     gm_state       one sequence: KV cache, scratch, threads, and (optionally)
                    the entropyinfer plans/decoders of the global layers

   Gemma 3 layout (what the forward pass does, per layer):
     h   = x + post_attn_norm(Wo . attn(rope(qnorm(Wq.n)), rope(knorm(Wk.n)), Wv.n)),
           n = attn_norm(x)
     out = h + post_ffn_norm(Wdown . (gelu_tanh(Wgate.m) * Wup.m)),  m = ffn_norm(h)
   Local layers attend to a sliding window (rope base 10k); every
   `swa_pattern`-th layer is global (full causal attention, rope base from
   the metadata, 1M). Embeddings are scaled by sqrt(d_model) and tied to the
   output projection.

   entropyinfer hooks (built when GEMMA_WITH_EI is defined):
     prefill  global layers: ei_profile_chunk per 512-token micro-batch, then
              ei_attention_prefill with the plan (dense mode: plan NULL).
     decode   global layers: ei_decode_observe on every query; when
              ei_decode_due: ei_decode_keep + ei_kv_compact on that layer's
              cache (rows then no longer equal positions; RoPE was applied at
              the absolute position before caching, so new tokens simply
              continue from the absolute position).
   Local layers always stay dense (their window is 512 tokens anyway). */
#ifndef GEMMA_H
#define GEMMA_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

#ifdef GEMMA_WITH_EI
#include "../../entropyinfer.h"
#endif

/* ------------------------------------------------------------ tokenizer */
typedef struct gm_tokenizer {
    int32_t n_vocab;
    gguf_str *pieces;      /* token texts (into the GGUF mapping) */
    float *scores;
    int32_t *types;        /* 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte */
    int32_t bos, eos, unk;
    int add_bos;
    int32_t byte_tok[256]; /* <0xXX> tokens, -1 if absent */
    int32_t *hash;         /* open addressing: text -> id */
    uint32_t hash_mask;
    int32_t *specials;     /* user-defined + control tokens, longest first */
    int32_t n_specials;
} gm_tokenizer;

int gm_tokenizer_init(gm_tokenizer *t, const gguf_file *f, char *err, size_t errlen);
void gm_tokenizer_free(gm_tokenizer *t);
/* Encode text (n bytes). Returns the token count (may exceed cap: then
   call again with a larger buffer), or -1 on allocation failure.
   parse_special: also match control tokens like <start_of_turn>. */
int64_t gm_encode(const gm_tokenizer *t, const char *text, size_t n, int add_bos, int parse_special,
                  int32_t *out, int64_t cap);
/* The text of one token (byte tokens give their byte; control tokens "").
   Writes at most cap-1 bytes plus a NUL; returns the piece length. */
int gm_decode_piece(const gm_tokenizer *t, int32_t id, char *buf, int cap);
int32_t gm_find_token(const gm_tokenizer *t, const char *s, size_t n);

/* ------------------------------------------------------------ model */
typedef struct gm_hparams {
    int n_layer, d_model, n_head, n_kv_head, head_dim, d_ff, n_vocab, n_ctx;
    int sliding_window, swa_pattern;
    float eps, rope_base_global, rope_base_local, attn_scale, embed_scale, final_softcap;
} gm_hparams;

typedef struct gm_layer {
    const float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffn_norm;
    const float *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down; /* packed panels (see gemma.c) */
    int is_global;
    float rope_base;
} gm_layer;

typedef struct gm_model {
    gm_hparams hp;
    gguf_file file;
    gm_tokenizer tok;
    const gguf_tensor *embd; /* token_embd in the file: rows dequantized on lookup */
    float *out_proj;   /* the same matrix, f32, packed: the (tied) output projection */
    float *out_norm;
    gm_layer *layers;
    float *arena;      /* all dequantized weights */
    size_t arena_floats;
} gm_model;

int gm_model_load(gm_model *m, const char *path, char *err, size_t errlen);
void gm_model_free(gm_model *m);

/* ------------------------------------------------------------ threads */
typedef struct gm_pool gm_pool;
typedef void (*gm_task)(void *arg, int ith, int nth);
gm_pool *gm_pool_create(int n_threads);  /* n_threads includes the caller */
void gm_pool_run(gm_pool *p, gm_task fn, void *arg);
int gm_pool_size(const gm_pool *p);
void gm_pool_destroy(gm_pool *p);
int gm_default_threads(void);

/* ------------------------------------------------------------ sequence state */
typedef enum gm_attn_mode {
    GM_ATTN_DENSE_OWN = 0, /* the engine's own dense attention everywhere */
    GM_ATTN_EI_DENSE = 1,  /* global layers: ei_attention_prefill with plan NULL */
    GM_ATTN_EI_SPARSE = 2  /* global layers: profile + sparse prefill + decode compression */
} gm_attn_mode;

typedef struct gm_stats {
    double t_attn_global;  /* seconds in global-layer attention (profiling included) */
    double t_profile;      /* of which profiling */
    double t_attn_local;
    double t_matmul;
    double t_compress;     /* decode keep + compaction */
    int64_t n_compress;
} gm_stats;

typedef struct gm_state {
    const gm_model *m;
    gm_pool *pool;
    int64_t max_ctx;
    int max_batch;
    int64_t n_past;        /* absolute position of the next token */
    float **k_cache, **v_cache;  /* per layer [max_ctx][n_kv][head_dim] */
    int64_t *cache_len;    /* rows held per layer (== n_past unless compacted) */
    /* scratch for a batch */
    float *x, *xn, *q, *k, *v, *att, *ao, *gate, *up, *tmp;
    float *rope_cos_l, *rope_sin_l, *rope_cos_g, *rope_sin_g; /* per batch row */
    gm_attn_mode mode;
    int kv_bf16;           /* round cached K/V rows to bfloat16 (a precision reference; default 0) */
    uint64_t dense_layers; /* GM_ATTN_EI_SPARSE: bit l set keeps global layer l dense (no plan, no
                              compression); set after gm_state_init, default 0: every global layer */
    /* GM_ATTN_EI_SPARSE, optional: called after each prefill chunk of a global layer is
       planned and before its attention runs (queries of rows row0.. in q, keys in
       k_cache[layer]); may inspect or rewrite plans[layer]. Nonzero return: an error.
       eval.c's oracle selection uses it. */
    int (*plan_hook)(struct gm_state *s, int layer, int n, int64_t row0);
    gm_stats stats;
#ifdef GEMMA_WITH_EI
    ei_context *ei;
    ei_config ei_cfg;
    ei_plan *plans;        /* per layer (global ones used) */
    ei_decoder *decs;
    void **dec_mem;
    void *plan_mem;
    /* the one workspace of every ei_* call: ei_layer_sizes' for the pool's threads
       (whole calls on threads and calls in parts alike; a decode step's partials in it) */
    void *ei_ws; size_t ei_ws_bytes;
    int32_t *keep_index;
    int prompt_done;       /* the prompt was planned to the end (final) */
    /* shared keep set (GEMMA_EI_SHARED=1 in the environment at gm_state_init): one set
       of rows for every global layer, from all of their scores (ei_decode_shared_add),
       as an engine whose KV cells are shared by all layers (llama.cpp) must; default 0:
       one keep set per layer and kv head (ei_decode_keep). */
    int ei_shared;
    float *shared_scores;  /* [n_head][max_ctx] one layer's scores, then [max_ctx] the sum */
    int32_t *row_pos, *shared_pos; /* [max_ctx]: the position of each row; of the rows kept */
    int64_t shared_rows;   /* rows whose positions shared_pos holds (0: row r = position r) */
    int64_t kv_bytes_before, kv_bytes_after;
    int ei_err;            /* nonzero once an ei_* call failed */
    char ei_msg[256];
#endif
} gm_state;

/* Create a state for sequences up to max_ctx tokens, batches up to
   max_batch tokens. ei_cfg (ignored without GEMMA_WITH_EI) configures
   entropyinfer for GM_ATTN_EI_* modes; NULL: ei_config_default(). */
/* 1 when GEMMA_EI_SHARED asks for one shared keep set (what gm_state_init reads) */
int gm_ei_shared_env(void);
/* EI_PLAN_* flags added to every plan gm_state_init lays out (0; eval's
   shortlist= diagnostic sets EI_PLAN_SCORES to read the reference block scores) */
extern uint32_t gm_plan_extra_flags;
int gm_state_init(gm_state *s, const gm_model *m, gm_pool *pool, int64_t max_ctx, int max_batch,
                  gm_attn_mode mode, const void *ei_cfg, char *err, size_t errlen);
void gm_state_free(gm_state *s);
void gm_state_reset(gm_state *s);

/* Prefill a prompt (processed in micro-batches of max_batch tokens; with
   entropyinfer, max_batch must be a multiple of segment_size). The final
   normed hidden states of every token go to hidden [n][d_model] if not NULL
   (feed them to gm_logits). Returns 0 or -1 (message in err). */
int gm_prefill(gm_state *s, const int32_t *tokens, int64_t n, float *hidden, char *err, size_t errlen);
/* Feed tokens after the prompt (generated or teacher-forced), n <= max_batch,
   decode path: observe + compress for entropyinfer. hidden as above. */
int gm_decode(gm_state *s, const int32_t *tokens, int n, float *hidden, char *err, size_t errlen);
/* logits [n][n_vocab] = token_embd . hidden (with final softcapping). */
void gm_logits(gm_state *s, const float *hidden, int n, float *logits);
/* KV-cache bytes currently held (all layers, f32). */
int64_t gm_kv_bytes(const gm_state *s);

double gm_now(void);

#endif
