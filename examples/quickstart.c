/* quickstart: the two hooks an engine adds to its attention, on random data.
   Prefill: profile Q/K into a plan, run block-sparse attention on it.
   Decode: observe queries, compress the KV cache once decode_gap tokens are out.
   This is the code sample of docs/integration.md ("Hooking into an engine's attention"). */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_PROMPT 6000
#define N_GEN 16
#define HEADS 8
#define KV_HEADS 2
#define DIM 64

static float frand(unsigned *s) { *s = *s * 1664525u + 1013904223u; return (float)(*s >> 8) / 16777216.0f - 0.5f; }

int main(void) {
    const long cap = N_PROMPT + N_GEN;          /* the engine's KV cache capacity */
    float *q = (float *)malloc(sizeof(float) * cap * HEADS * DIM);
    float *k = (float *)malloc(sizeof(float) * cap * KV_HEADS * DIM);
    float *v = (float *)malloc(sizeof(float) * cap * KV_HEADS * DIM);
    float *out = (float *)malloc(sizeof(float) * N_PROMPT * HEADS * DIM);
    unsigned seed = 1;
    long i, n;
    ei_config cfg = ei_config_default();
    ei_context *ctx;
    ei_plan plan;
    ei_decoder dec;
    ei_keep_set keep;
    ei_shape shape;
    ei_sizes sizes;
    ei_exec x;                                  /* how calls run: threads and the one workspace */
    void *dec_memory;

    memset(&keep, 0, sizeof keep);
    for (i = 0; i < cap * HEADS * DIM; ++i) q[i] = frand(&seed);
    for (i = 0; i < cap * KV_HEADS * DIM; ++i) { k[i] = frand(&seed); v[i] = frand(&seed); }

    /* ---- setup, once per model: context, plan and decoder memory, workspaces */
    if (ei_context_create(&cfg, &ctx) != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); return 1; }
    memset(&shape, 0, sizeof shape);
    shape.max_tokens = cap;
    shape.n_heads = HEADS;
    shape.n_kv_heads = KV_HEADS;
    shape.head_dim = DIM;
    shape.n_threads = 2;                        /* the calls below run on 2 threads */
    if (ei_layer_sizes(ctx, &shape, &sizes) != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); return 1; }
    memset(&x, 0, sizeof x);
    x.n_threads = 2;
    x.workspace = malloc(sizes.workspace);      /* one workspace serves every call of the layer */
    x.workspace_bytes = sizes.workspace;
    dec_memory = malloc(sizes.decoder);
    ei_plan_init(ctx, &plan, cap, KV_HEADS, DIM, 0, NULL, 0); /* memory NULL: the context allocates */
    ei_decoder_init(ctx, &dec, HEADS, KV_HEADS, DIM, dec_memory, sizes.decoder);
    keep.heads_out = KV_HEADS;
    keep.capacity = cfg.decode_budget;
    keep.index = (int32_t *)malloc(sizeof(int32_t) * KV_HEADS * cfg.decode_budget);

    /* ---- prefill hook: in the layer's attention, after RoPE */
    {
        ei_tensor qt = ei_tensor_make(q, EI_F32, N_PROMPT, HEADS, DIM);
        ei_tensor kt = ei_tensor_make(k, EI_F32, N_PROMPT, KV_HEADS, DIM);
        ei_tensor vt = ei_tensor_make(v, EI_F32, N_PROMPT, KV_HEADS, DIM);
        ei_out_tensor ot = ei_out_tensor_make(out, EI_F32, N_PROMPT, HEADS, DIM);
        if (ei_profile(ctx, &x, &qt, &kt, &plan) != EI_OK ||
            ei_attention_prefill(ctx, &x, &qt, &kt, &vt, &plan, &ot, 0) != EI_OK ||
            ei_decode_observe(ctx, &dec, &qt, 0, 0) != EI_OK) { /* the prompt's queries (from position 0) open the window */
            fprintf(stderr, "prefill: %s\n", ei_last_error());
            return 1;
        }
        printf("prefill: %ld tokens planned in %d segments; kv head 0 is %s\n", (long)plan.n_tokens,
               plan.n_segments, plan.head_class[0] == EI_HEAD_RIGID ? "rigid" : "dynamic");
    }

    /* ---- decode hook: per generated token, after its K/V are appended */
    for (n = N_PROMPT; n < cap; ++n) {
        ei_tensor q1 = ei_tensor_make(q + n * HEADS * DIM, EI_F32, 1, HEADS, DIM);
        ei_decode_observe(ctx, &dec, &q1, n, 1); /* the query of position n */
        if (ei_decode_due(ctx, &dec)) {
            ei_tensor kc = ei_tensor_make(k, EI_F32, n + 1, KV_HEADS, DIM);
            ei_out_tensor ko = ei_out_tensor_make(k, EI_F32, n + 1, KV_HEADS, DIM);
            ei_out_tensor vo = ei_out_tensor_make(v, EI_F32, n + 1, KV_HEADS, DIM);
            if (ei_decode_keep(ctx, &x, &dec, &kc, &keep) != EI_OK ||
                ei_kv_compact(ctx, &keep, &ko, &vo) != EI_OK) {
                fprintf(stderr, "decode: %s\n", ei_last_error());
                return 1;
            }
            printf("decode: cache of %ld tokens compacted to %d per kv head (window of %d included)\n", n + 1,
                   keep.n_kept, cfg.window);
        }
    }
    ei_plan_free(ctx, &plan);
    free(dec_memory); /* the decoder's memory is the caller's */
    ei_context_destroy(ctx);
    free(q); free(k); free(v); free(out); free(x.workspace); free(keep.index);
    return 0;
}
