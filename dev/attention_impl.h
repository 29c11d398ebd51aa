/* Placeholder until the attention kernels land. */
EIDEF ei_result ei_attention_workspace_size(const ei_context *ctx, int32_t n_heads, int32_t n_kv_heads,
                                            int32_t head_dim, size_t *bytes) {
    (void)n_heads; (void)n_kv_heads; (void)head_dim; (void)bytes;
    return ei__fail(ctx, EI_ERR_UNSUPPORTED, "attention not built yet");
}
EIDEF ei_result ei_attention_prefill(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                     const ei_tensor *v, const ei_plan *plan, ei_out_tensor *out,
                                     int64_t q_offset, int ith, int nth, void *workspace, size_t workspace_bytes) {
    (void)q; (void)k; (void)v; (void)plan; (void)out; (void)q_offset; (void)ith; (void)nth; (void)workspace; (void)workspace_bytes;
    return ei__fail(ctx, EI_ERR_UNSUPPORTED, "attention not built yet");
}
EIDEF ei_result ei_attention_prefill_mt(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                        const ei_tensor *v, const ei_plan *plan, ei_out_tensor *out,
                                        int64_t q_offset, int n_threads, void *workspace, size_t workspace_bytes) {
    (void)q; (void)k; (void)v; (void)plan; (void)out; (void)q_offset; (void)n_threads; (void)workspace; (void)workspace_bytes;
    return ei__fail(ctx, EI_ERR_UNSUPPORTED, "attention not built yet");
}
