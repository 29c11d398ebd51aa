/* tests/insn_tile.c - one attention query tile on a forced kernel, for
   counting instructions under qemu-user (make insn-count-arm64): 4 query
   heads of one kv head, head_dim 128, 64 query tokens attending densely
   (causal) to their own 64 keys, which is one tile of 256 rows x one key
   tile of 64 keys (>>attention's geometry), plus its Q packing and output
   store. Usage: insn_tile scalar|neon|neon-bf16|neon-bfmmla|neon-fhm CALLS
   [f32|f16|bf16] (neon-bf16 and neon-bfmmla run BFDOT / BFMMLA only for
   bf16, neon-fhm FMLAL only for f16); the difference between CALLS = 2 and
   CALLS = 1 is one tile's instructions, setup excluded. */
#define ENTROPYINFER_IMPLEMENTATION
#include "entropyinfer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    enum { N = 64, H = 4, HK = 1, D = 128 };
    ei_config cfg = ei_config_default();
    ei_context *ctx;
    ei_dtype dt = EI_F32;
    float *q, *k, *v, *o;
    ei_shape shape;
    ei_sizes sizes;
    ei_exec x;
    size_t i, es;
    int calls, c;
    if (argc < 3) { fprintf(stderr, "usage: %s scalar|neon|neon-bf16|neon-bfmmla|neon-fhm CALLS [f32|f16|bf16]\n", argv[0]); return 2; }
    cfg.simd = strcmp(argv[1], "neon-bf16") == 0 ? EI_SIMD_NEON_BF16 : strcmp(argv[1], "neon-fhm") == 0 ? EI_SIMD_NEON_FHM
               : strcmp(argv[1], "neon-bfmmla") == 0 ? EI_SIMD_NEON_BFMMLA
               : strcmp(argv[1], "neon") == 0 ? EI_SIMD_NEON : EI_SIMD_SCALAR;
    calls = atoi(argv[2]);
    if (argc > 3) dt = strcmp(argv[3], "f16") == 0 ? EI_F16 : strcmp(argv[3], "bf16") == 0 ? EI_BF16 : EI_F32;
    es = dt == EI_F32 ? 4 : 2;
    if (ei_context_create(&cfg, &ctx) != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); return 1; }
    q = (float *)malloc(N * H * D * es); k = (float *)malloc(N * HK * D * es); v = (float *)malloc(N * HK * D * es);
    o = (float *)malloc(N * H * D * 4);
    for (i = 0; i < (size_t)N * H * D; ++i) {
        float x = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        if (dt == EI_F32) q[i] = x; else ((uint16_t *)(void *)q)[i] = dt == EI_F16 ? ei__f32_to_f16(x) : ei__f32_to_bf16(x);
        if (i < (size_t)N * HK * D) {
            if (dt == EI_F32) { k[i] = x * 0.5f; v[i] = -x; }
            else {
                ((uint16_t *)(void *)k)[i] = dt == EI_F16 ? ei__f32_to_f16(x * 0.5f) : ei__f32_to_bf16(x * 0.5f);
                ((uint16_t *)(void *)v)[i] = dt == EI_F16 ? ei__f32_to_f16(-x) : ei__f32_to_bf16(-x);
            }
        }
    }
    memset(&shape, 0, sizeof shape);
    shape.max_tokens = N; shape.n_heads = H; shape.n_kv_heads = HK; shape.head_dim = D; shape.n_threads = 1;
    if (ei_layer_sizes(ctx, &shape, &sizes) != EI_OK) { fprintf(stderr, "%s\n", ei_last_error()); return 1; }
    memset(&x, 0, sizeof x); /* one thread, the attention workspace */
    x.workspace = malloc(sizes.prefill);
    x.workspace_bytes = sizes.prefill;
    {
        ei_tensor tq = ei_tensor_make(q, dt, N, H, D), tk = ei_tensor_make(k, dt, N, HK, D), tv = ei_tensor_make(v, dt, N, HK, D);
        ei_out_tensor to = ei_out_tensor_make(o, EI_F32, N, H, D);
        for (c = 0; c < calls; ++c)
            if (ei_attention_prefill(ctx, &x, &tq, &tk, &tv, NULL, &to, 0) != EI_OK) {
                fprintf(stderr, "%s\n", ei_last_error());
                return 1;
            }
    }
    printf("%s %s: %d calls, out[0] = %g\n", ei_simd_name(ei_context_config(ctx)->simd), argv[3] ? argv[3] : "f32", calls, (double)o[0]);
    ei_context_destroy(ctx); free(q); free(k); free(v); free(o); free(x.workspace);
    return 0;
}
