/* Stand-in until the CUDA loader lands: every GPU call reports it. */
static ei_result ei__cuda_open(ei_context *ctx) {
    return ei__fail(ctx, EI_ERR_BACKEND, "the CUDA backend loader is not built into this header");
}
static void ei__cuda_close(ei_context *ctx) { (void)ctx; }
static ei_result ei__cuda_plan_init(const ei_context *ctx, ei_plan *plan, int64_t max_tokens, int32_t n_kv_heads,
                                    int32_t head_dim, uint32_t flags, void *memory, size_t bytes) {
    (void)plan; (void)max_tokens; (void)n_kv_heads; (void)head_dim; (void)flags; (void)memory; (void)bytes;
    return ei__fail(ctx, EI_ERR_BACKEND, "no CUDA backend");
}
static ei_result ei__cuda_profile(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                                  void *workspace, size_t workspace_bytes) {
    (void)q; (void)k; (void)plan; (void)workspace; (void)workspace_bytes;
    return ei__fail(ctx, EI_ERR_BACKEND, "no CUDA backend");
}
static ei_result ei__cuda_decode_keep(const ei_context *ctx, ei_decoder *dec, const ei_tensor *k, ei_keep_set *keep,
                                      void *workspace, size_t workspace_bytes) {
    (void)dec; (void)k; (void)keep; (void)workspace; (void)workspace_bytes;
    return ei__fail(ctx, EI_ERR_BACKEND, "no CUDA backend");
}
static ei_result ei__cuda_kv_compact(const ei_context *ctx, const ei_keep_set *keep, ei_out_tensor *k, ei_out_tensor *v) {
    (void)keep; (void)k; (void)v;
    return ei__fail(ctx, EI_ERR_BACKEND, "no CUDA backend");
}
