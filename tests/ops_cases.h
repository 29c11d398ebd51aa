/* tests/ops_cases.h - the operations' case table and the code that runs a
   case on one backend and compares two runs: used by tests/test_ops.c (every
   case on the scalar reference, every SIMD path and CUDA) and by
   tests/fuzz_backends.c (which draws cases from the same table and varies
   them). Include it after check.h.

   A case (ops_case) is one operation of the public API with its shapes
   (tokens, heads, kv heads, head_dim), dtypes (q, k/v, out), layout of
   every view (contiguous, strided with padding between heads and tokens,
   head-major, a cache padded past its valid rows), protocol (the chunks a
   chunked plan is made of; the batches the decoder observes; the query
   range of a prefill chunk), configuration, and the ways its calls run
   (an ei_exec: the whole call on one thread, on threads, or in parts with
   one shared workspace). ops_data_make builds its inputs on the host
   (deterministic in the case and a seed), ops_run runs it on a side
   (check.h: a CPU context on one SIMD path, or a CUDA context with device
   memory) the case's first way, ops_run_way any of its ways, ops_compare
   compares a run against the reference run with the tolerances of
   check.h's table (test_tols), ops_compare_ways two ways of one side (bit
   for bit where the library promises it), ops_check_ref compares the
   reference run with check.h's double-precision references. */
#ifndef EI_TEST_OPS_CASES_H
#define EI_TEST_OPS_CASES_H
#ifndef EI_TEST_CHECK_H
#error "ops_cases.h: include check.h first"
#endif
#include <time.h>

/* ------------------------------------------------------------ the table */
typedef enum ops_op {
    OP_PROFILE,          /* ei_profile */
    OP_PROFILE_CHUNKED,  /* ei_profile_chunk over a protocol's chunks */
    OP_PLAN_FINALIZE,    /* ei_profile in parts, then ei_plan_finalize (per-segment budgets: its first way 'p' or 'r') */
    OP_PREFILL_DENSE,    /* ei_attention_prefill, plan NULL */
    OP_PREFILL_SPARSE,   /* ei_attention_prefill with the reference's plan */
    OP_DECODE_ATTN,      /* ei_attention_decode + ei_attention_decode_merge (a step of 3 tokens when the first way is
                            '1', else of 1) */
    OP_DECODE_ATTN_KEEP, /* the same through a keep set, CPU backend only */
    OP_DECODE_OBSERVE,   /* ei_decode_observe in a protocol's batches: the window ring */
    OP_DECODE_KEEP,      /* ei_decode_keep ('p', 'r': refused with EI_ERR_CONFIG, then ei_decode_score in parts +
                            ei_decode_select, as an engine's threads make it) */
    OP_DECODE_SCORE,     /* ei_decode_score */
    OP_DECODE_SELECT,    /* ei_decode_score + ei_decode_select */
    OP_DECODE_SHARED,    /* ei_decode_shared_add of two layers + ei_decode_select_shared */
    OP_KV_COMPACT,       /* ei_kv_compact of a K and a V cache */
    OP_PLAN_MASK,        /* ei_plan_mask of the reference's plan over the last call's queries: q the base mask's
                            dtype (layout contig: no base), out the mask's; mask heads by nth: 1 the union,
                            2 one per kv head, 3 and more one per query head */
    OP_COUNT
} ops_op;
static const char *const ops_op_names[OP_COUNT] CHECK_UNUSED = {
    "profile", "profile-chunked", "plan-finalize", "prefill-dense", "prefill-sparse", "decode-attn", "decode-attn-keep",
    "decode-observe", "decode-keep", "decode-score", "decode-select", "decode-shared", "kv-compact", "plan-mask"};

/* Layouts of every view of a case (q, k, v, out, caches). */
enum { LAY_CONTIG, LAY_STRIDED, LAY_HEAD_MAJOR, LAY_PADDED, LAY_COUNT };
static const char *const ops_layout_names[LAY_COUNT] CHECK_UNUSED = {"contig", "strided", "head-major", "padded"};

/* Configurations. */
enum { CFG_SMALL, CFG_SAMPLED, CFG_PSEG, CFG_INTERLEAVED, CFG_WIDE, CFG_SAMPLED_I8, CFG_DECODE, CFG_DECODE_MAX, CFG_DECODE_PERQ,
       CFG_DECODE_512, CFG_DECODE_300, CFG_DECODE_256, CFG_DECODE_128, CFG_COUNT };
static const char *const ops_cfg_names[CFG_COUNT] CHECK_UNUSED = {"small", "sampled", "per-seg", "seg64", "seg512", "sampled-i8",
                                                                  "decode", "dec-max", "dec-perq", "b512", "b300-max",
                                                                  "b256-perq", "b128"};

/* Protocols: calls in thousandths of the case's tokens, (start, end, final);
   end -1: a call without queries; start -1 ends the list. Chunked plans
   make these calls; the decoder observes the same batches (the prompt's);
   prefill attention attends the queries of the protocol's last call. */
#define OPS_CALLS 5
typedef struct ops_call { int start, end, final; } ops_call;
static const ops_call ops_protocols[][OPS_CALLS] CHECK_UNUSED = {
    {{0, 1000, 1}, {-1, 0, 0}, {-1, 0, 0}, {-1, 0, 0}, {-1, 0, 0}},             /* P0 whole prompt, one call */
    {{0, 250, 0}, {250, 500, 0}, {500, 750, 0}, {750, 1000, 1}, {-1, 0, 0}},   /* P1 four micro-batches */
    {{0, 333, 0}, {333, 700, 0}, {200, 900, 0}, {900, 1000, 1}, {-1, 0, 0}},   /* P2 unaligned, a roll-back */
    {{0, 400, 0}, {520, 1000, 0}, {1000, -1, 1}, {-1, 0, 0}, {-1, 0, 0}},      /* P3 a skip, a final call without q */
    {{0, 600, 1}, {600, 1000, 1}, {-1, 0, 0}, {-1, 0, 0}, {-1, 0, 0}},         /* P4 final, then the next turn */
};
#define OPS_PROTOCOLS ((int)(sizeof ops_protocols / sizeof ops_protocols[0]))

/* Ways to run the calls that take an ei_exec (a case's `ways`: letters, the
   first the case's own way: ops_run runs it, and every path and the GPU are
   compared with the reference's run of it; test_ops runs the others on the
   same side and compares each with the first, ops_compare_ways):
     '1'  the whole call on the calling thread (n_threads 1)
     't'  the whole call on nth threads (n_threads nth: the caller and the context's workers)
     'p'  nth parts, ith 0 .. nth - 1 in turn as an engine's threads make them, every part with
          the same ei_exec but ith and ONE workspace (ei_layer_sizes for nth); then the step after
          the engine's barrier: ei_plan_finalize, or ei_attention_decode_merge by every part
     'r'  the same parts in reverse order (ith nth - 1 .. 0: "at once or in any order")
   "-": the operation takes no ei_exec (observe, compaction, the mask): one run.
   On the GPU every way is one launch sequence (parts: part 0's call, the
   others return EI_OK; n_threads unused). */
#define OPS_WAYS_MAX 4
typedef struct ops_case {
    ops_op op;
    int32_t n, H, KV, d;   /* tokens (decode: positions), query heads, kv heads, head_dim */
    ei_dtype q, kv, out;   /* q's dtype, k's and v's, the output's */
    int layout, proto, cfg;
    int nth;               /* threads of 't', parts of 'p' and 'r' (plan-mask: its mask heads) */
    const char *ways;      /* the ways, the case's own first */
} ops_case;

#define F32 EI_F32
#define F16 EI_F16
#define BF16 EI_BF16
static const ops_case ops_cases[] CHECK_UNUSED = {
    /* op                   n     H   KV  d    q     kv    out   layout          proto cfg           nth ways */
    /* profiling: whole prompt, chunked, parts + finalize */
    {OP_PROFILE,            700,  8,  2,  64,  F32,  F32,  F32,  LAY_CONTIG,     0, CFG_SMALL,       2,  "1tp"},
    {OP_PROFILE,            700,  8,  2,  64,  BF16, BF16, F32,  LAY_STRIDED,    0, CFG_SMALL,       3,  "1pt"},
    {OP_PROFILE,            640,  6,  3,  40,  F16,  F16,  F32,  LAY_HEAD_MAJOR, 0, CFG_SAMPLED,     2,  "t1p"},
    {OP_PROFILE,            900,  8,  1,  64,  F32,  BF16, F32,  LAY_CONTIG,     0, CFG_SAMPLED,     3,  "1tr"},
    {OP_PROFILE,            512,  4,  2,  128, BF16, BF16, F32,  LAY_STRIDED,    0, CFG_INTERLEAVED, 2,  "1tp"},
    {OP_PROFILE,            777,  12, 4,  33,  F32,  F16,  F32,  LAY_STRIDED,    0, CFG_PSEG,        3,  "1tp"},
    /* the shapes of test_cuda's former random_plans (bf16, contiguous; sizes where GPUs plan) */
    {OP_PROFILE,            3000, 8,  2,  64,  BF16, BF16, F32,  LAY_CONTIG,     0, CFG_WIDE,        2,  "1tp"},
    {OP_PROFILE,            5000, 4,  4,  128, BF16, BF16, F32,  LAY_CONTIG,     0, CFG_WIDE,        3,  "1tp"},
    {OP_PROFILE,            1777, 6,  3,  32,  BF16, BF16, F32,  LAY_CONTIG,     0, CFG_SMALL,       2,  "1pt"},
    {OP_PROFILE,            9000, 8,  1,  64,  BF16, BF16, F32,  LAY_CONTIG,     0, CFG_WIDE,        3,  "1tp"},
    {OP_PROFILE,            700,  14, 2,  64,  BF16, BF16, F32,  LAY_CONTIG,     0, CFG_INTERLEAVED, 2,  "1tp"},
    {OP_PROFILE_CHUNKED,    900,  8,  2,  64,  F32,  F32,  F32,  LAY_CONTIG,     1, CFG_SMALL,       2,  "1tp"},
    {OP_PROFILE_CHUNKED,    900,  8,  2,  64,  BF16, BF16, F32,  LAY_PADDED,     2, CFG_SMALL,       3,  "1rt"},
    {OP_PROFILE_CHUNKED,    1000, 4,  1,  128, F32,  F16,  F32,  LAY_PADDED,     3, CFG_SAMPLED,     2,  "t1p"},
    {OP_PROFILE_CHUNKED,    700,  6,  2,  64,  F16,  F16,  F32,  LAY_STRIDED,    4, CFG_SAMPLED,     2,  "1pt"},
    /* the sampled ranking's int8 scores: odd head_dim, GQA, every dtype, chunked */
    {OP_PROFILE,            900,  8,  2,  64,  BF16, BF16, F32,  LAY_CONTIG,     0, CFG_SAMPLED_I8,  2,  "1tp"},
    {OP_PROFILE,            700,  6,  3,  33,  F32,  F16,  F32,  LAY_STRIDED,    0, CFG_SAMPLED_I8,  3,  "t1r"},
    {OP_PROFILE,            640,  4,  1,  256, F16,  F16,  F32,  LAY_HEAD_MAJOR, 0, CFG_SAMPLED_I8,  2,  "1pt"},
    {OP_PROFILE_CHUNKED,    1000, 8,  2,  128, BF16, BF16, F32,  LAY_PADDED,     2, CFG_SAMPLED_I8,  2,  "1tp"},
    {OP_PROFILE_CHUNKED,    800,  4,  1,  40,  F32,  F32,  F32,  LAY_CONTIG,     3, CFG_SAMPLED_I8,  3,  "t1p"},
    {OP_PROFILE_CHUNKED,    800,  16, 2,  32,  F32,  BF16, F32,  LAY_HEAD_MAJOR, 2, CFG_PSEG,        3,  "1tp"},
    {OP_PLAN_FINALIZE,      800,  8,  4,  64,  F32,  F32,  F32,  LAY_CONTIG,     0, CFG_PSEG,        2,  "p1t"},
    {OP_PLAN_FINALIZE,      640,  8,  2,  64,  BF16, BF16, F32,  LAY_STRIDED,    0, CFG_PSEG,        2,  "r1t"},
    /* prefill attention: dense and sparse, whole prompt and a chunk */
    {OP_PREFILL_DENSE,      600,  8,  2,  64,  F32,  F32,  F32,  LAY_CONTIG,     0, CFG_SMALL,       2,  "1tp"},
    {OP_PREFILL_DENSE,      600,  8,  2,  64,  BF16, BF16, F32,  LAY_STRIDED,    0, CFG_SMALL,       2,  "p1t"},
    {OP_PREFILL_DENSE,      512,  4,  2,  128, BF16, BF16, F32,  LAY_STRIDED,    0, CFG_INTERLEAVED, 3,  "1tp"},
    {OP_PREFILL_DENSE,      500,  4,  1,  128, F16,  F16,  F16,  LAY_HEAD_MAJOR, 0, CFG_SMALL,       2,  "1pt"},
    {OP_PREFILL_DENSE,      640,  8,  2,  64,  F32,  F16,  F32,  LAY_PADDED,     1, CFG_SMALL,       3,  "t1p"},
    {OP_PREFILL_DENSE,      300,  4,  4,  256, BF16, BF16, BF16, LAY_CONTIG,     0, CFG_SMALL,       2,  "1tp"},
    {OP_PREFILL_SPARSE,     700,  8,  2,  64,  F32,  F32,  F32,  LAY_CONTIG,     0, CFG_SMALL,       2,  "1tp"},
    {OP_PREFILL_SPARSE,     700,  8,  2,  64,  BF16, BF16, F32,  LAY_STRIDED,    0, CFG_SMALL,       2,  "p1t"},
    {OP_PREFILL_SPARSE,     512,  4,  2,  128, BF16, BF16, F32,  LAY_STRIDED,    0, CFG_INTERLEAVED, 3,  "1tr"},
    {OP_PREFILL_SPARSE,     900,  14, 2,  64,  F16,  F16,  F32,  LAY_CONTIG,     0, CFG_SAMPLED,     2,  "1tp"},
    {OP_PREFILL_SPARSE,     800,  8,  2,  128, F32,  BF16, BF16, LAY_PADDED,     1, CFG_SMALL,       2,  "1pt"},
    {OP_PREFILL_SPARSE,     800,  8,  2,  64,  F32,  F16,  F16,  LAY_HEAD_MAJOR, 2, CFG_PSEG,        3,  "t1p"},
    /* decode attention: plain, through a keep set */
    {OP_DECODE_ATTN,        700,  8,  2,  64,  F32,  F32,  F32,  LAY_CONTIG,     0, CFG_DECODE,      2,  "1tp"},
    {OP_DECODE_ATTN,        700,  8,  2,  64,  BF16, BF16, F32,  LAY_STRIDED,    0, CFG_DECODE,      3,  "t1p"},
    {OP_DECODE_ATTN,        900,  4,  1,  128, F32,  F16,  F32,  LAY_PADDED,     0, CFG_DECODE,      2,  "p1tr"},
    {OP_DECODE_ATTN,        500,  16, 2,  128, F32,  BF16, BF16, LAY_HEAD_MAJOR, 0, CFG_DECODE,      3,  "1tp"},
    {OP_DECODE_ATTN_KEEP,   600,  8,  2,  64,  F32,  F32,  F32,  LAY_CONTIG,     0, CFG_DECODE,      2,  "1tp"},
    {OP_DECODE_ATTN_KEEP,   600,  8,  2,  64,  F32,  F16,  F32,  LAY_STRIDED,    0, CFG_DECODE,      3,  "t1p"},
    {OP_DECODE_ATTN_KEEP,   500,  6,  3,  32,  BF16, BF16, F32,  LAY_HEAD_MAJOR, 0, CFG_DECODE_PERQ, 2,  "1pt"},
    /* decode compression */
    {OP_DECODE_OBSERVE,     300,  8,  2,  64,  F32,  F32,  F32,  LAY_CONTIG,     1, CFG_DECODE,      1,  "-"},
    {OP_DECODE_OBSERVE,     300,  8,  2,  64,  BF16, BF16, F32,  LAY_STRIDED,    2, CFG_DECODE,      1,  "-"},
    {OP_DECODE_OBSERVE,     200,  4,  4,  40,  F16,  F16,  F32,  LAY_HEAD_MAJOR, 0, CFG_DECODE,      1,  "-"},
    {OP_DECODE_KEEP,        600,  8,  2,  64,  F32,  F32,  F32,  LAY_CONTIG,     1, CFG_DECODE,      2,  "1tp"},
    {OP_DECODE_KEEP,        600,  8,  2,  64,  F32,  BF16, F32,  LAY_PADDED,     2, CFG_DECODE_MAX,  2,  "t1p"},
    {OP_DECODE_KEEP,        500,  6,  2,  40,  F16,  F16,  F32,  LAY_STRIDED,    0, CFG_DECODE_PERQ, 3,  "1tp"},
    /* the shapes and policies of test_cuda's former random_decode (bf16 caches) */
    {OP_DECODE_KEEP,        3000, 8,  2,  128, F32,  BF16, F32,  LAY_CONTIG,     0, CFG_DECODE_512,  2,  "1tp"},
    {OP_DECODE_KEEP,        2500, 8,  4,  64,  F32,  BF16, F32,  LAY_CONTIG,     0, CFG_DECODE_300,  2,  "1tp"},
    {OP_DECODE_KEEP,        1200, 4,  2,  64,  F32,  BF16, F32,  LAY_CONTIG,     0, CFG_DECODE_256,  2,  "1tp"},
    {OP_DECODE_KEEP,        100,  4,  2,  64,  F32,  BF16, F32,  LAY_CONTIG,     0, CFG_DECODE_128,  2,  "1tp"},
    {OP_DECODE_SCORE,       600,  8,  2,  64,  F32,  F32,  F32,  LAY_CONTIG,     1, CFG_DECODE,      3,  "p1t"},
    {OP_DECODE_SCORE,       700,  8,  1,  128, BF16, BF16, F32,  LAY_PADDED,     2, CFG_DECODE,      2,  "p1tr"},
    {OP_DECODE_SCORE,       400,  4,  2,  16,  F32,  F16,  F32,  LAY_HEAD_MAJOR, 0, CFG_DECODE_MAX,  2,  "1tp"},
    {OP_DECODE_SELECT,      600,  8,  2,  64,  F32,  F32,  F32,  LAY_PADDED,     1, CFG_DECODE,      2,  "p1t"},
    {OP_DECODE_SELECT,      500,  8,  4,  32,  BF16, BF16, F32,  LAY_STRIDED,    0, CFG_DECODE_PERQ, 3,  "1tr"},
    {OP_DECODE_SHARED,      600,  8,  2,  64,  F32,  F32,  F32,  LAY_CONTIG,     1, CFG_DECODE,      2,  "1tp"},
    {OP_DECODE_SHARED,      500,  8,  2,  64,  F32,  BF16, F32,  LAY_PADDED,     2, CFG_DECODE_MAX,  3,  "1pt"},
    {OP_KV_COMPACT,         300,  2,  2,  64,  F32,  BF16, F32,  LAY_HEAD_MAJOR, 0, CFG_DECODE,      1,  "-"},
    {OP_KV_COMPACT,         300,  4,  4,  80,  F32,  F32,  F32,  LAY_STRIDED,    0, CFG_DECODE,      1,  "-"},
    {OP_KV_COMPACT,         250,  3,  3,  128, F32,  F16,  F32,  LAY_CONTIG,     0, CFG_DECODE,      1,  "-"},
    /* the plan as a mask (base dtype in q's column) */
    {OP_PLAN_MASK,          700,  8,  2,  64,  F32,  F32,  F16,  LAY_CONTIG,     0, CFG_SMALL,       3,  "-"},
    {OP_PLAN_MASK,          700,  8,  2,  64,  F16,  BF16, F16,  LAY_STRIDED,    1, CFG_SMALL,       1,  "-"},
    {OP_PLAN_MASK,          900,  14, 2,  64,  F32,  F16,  BF16, LAY_HEAD_MAJOR, 2, CFG_SAMPLED,     2,  "-"},
    {OP_PLAN_MASK,          800,  8,  2,  128, BF16, BF16, F32,  LAY_PADDED,     1, CFG_PSEG,        3,  "-"},
    {OP_PLAN_MASK,          512,  4,  1,  128, F16,  F16,  F16,  LAY_PADDED,     3, CFG_INTERLEAVED, 1,  "-"},
};
#undef F32
#undef F16
#undef BF16
#define OPS_CASES ((int)(sizeof ops_cases / sizeof ops_cases[0]))

CHECK_FN ei_config ops_config(int cfg) {
    ei_config c = ei_config_default();
    c.segment_size = 128;
    c.block_size = 8;
    c.threshold_len = 256;
    c.base_budget = 128;
    if (cfg == CFG_SAMPLED || cfg == CFG_SAMPLED_I8) {
        c.ranking = EI_RANK_SAMPLED;
        c.rank_samples = 16;
        c.top_p = 0.9;
        c.sink_blocks = 1;
        c.local_blocks = 2;
    }
    if (cfg == CFG_SAMPLED_I8) { /* int8 scores (CPU only: the GPU refuses them), more rows */
        c.rank_precision = EI_RANK_PRECISION_INT8;
        c.rank_samples = 40;
    }
    if (cfg == CFG_PSEG) { /* e_t 1: rigid heads beside dynamic ones on this data */
        c.per_segment_budget = 1;
        c.last_segment_dense = 0;
        c.rigid_entropy = 1.0;
    }
    if (cfg == CFG_INTERLEAVED) { /* test_backends' scenario 4 */
        c.segment_size = 64;
        c.threshold_len = 128;
        c.base_budget = 64;
    }
    if (cfg == CFG_WIDE) { /* the paper's segment, a base budget of a segment */
        c.segment_size = 512;
        c.threshold_len = 1024;
        c.base_budget = 512;
    }
    if (cfg >= CFG_DECODE) {
        c.window = 16;
        c.decode_gap = 8;
        c.decode_budget = 64;
    }
    if (cfg == CFG_DECODE_MAX) {
        c.pool = EI_POOL_MAX;
        c.gqa_reduce = EI_REDUCE_MAX;
    }
    if (cfg == CFG_DECODE_PERQ) {
        c.per_kv_head = 0;
        c.pool_kernel = 3;
    }
    if (cfg >= CFG_DECODE_512) { /* budget, window; gap 16 */
        static const int32_t budget[4] = {512, 300, 256, 128}, window[4] = {32, 16, 32, 32};
        c.decode_budget = budget[cfg - CFG_DECODE_512];
        c.window = window[cfg - CFG_DECODE_512];
        c.decode_gap = 16;
    }
    if (cfg == CFG_DECODE_300) {
        c.gqa_reduce = EI_REDUCE_MAX;
        c.pool = EI_POOL_MAX;
        c.pool_kernel = 7;
    }
    if (cfg == CFG_DECODE_256) {
        c.per_kv_head = 0;
        c.pool = EI_POOL_NONE;
        c.pool_kernel = 1;
    }
    return c;
}
CHECK_FN int ops_is_decode(ops_op op) { return op >= OP_DECODE_ATTN && op <= OP_KV_COMPACT; }
CHECK_FN int ops_is_plan(ops_op op) { return op <= OP_PLAN_FINALIZE; }
CHECK_FN int ops_is_attention(ops_op op) { return op >= OP_PREFILL_DENSE && op <= OP_DECODE_ATTN_KEEP; }

/* ------------------------------------------------------------ ways */
/* The case's own way (the first of its ways; '1' for "-" or none). */
CHECK_FN char ops_first_way(const ops_case *cs) {
    return cs->ways && cs->ways[0] && cs->ways[0] != '-' ? cs->ways[0] : '1';
}
CHECK_FN int ops_way_is_parts(char way) { return way == 'p' || way == 'r'; }
/* The threads (or parts) a way runs on: the workspace's count. */
CHECK_FN int ops_way_n(const ops_case *cs, char way) { return way == '1' || cs->nth < 1 ? 1 : cs->nth; }
/* The calls a way makes: nth parts, or one whole call. */
CHECK_FN int ops_way_calls(const ops_case *cs, char way) { return ops_way_is_parts(way) ? ops_way_n(cs, way) : 1; }
/* The ei_exec of a way's call number i (parts: 'p' in order, 'r' reversed). */
CHECK_FN ei_exec ops_exec(const ops_case *cs, char way, int i, void *ws, size_t ws_bytes) {
    ei_exec x;
    int n = ops_way_n(cs, way);
    memset(&x, 0, sizeof x);
    x.workspace = ws;
    x.workspace_bytes = ws_bytes;
    if (ops_way_is_parts(way) && n > 1) {
        x.nth = n;
        x.ith = way == 'r' ? n - 1 - i : i;
    } else
        x.n_threads = n;
    return x;
}
/* Every buffer of the case's layer on a side, for max_tokens tokens and a
   way's threads or parts. */
CHECK_FN ei_sizes ops_sizes(const side *s, const ops_case *cs, int64_t max_tokens, uint32_t plan_flags, char way) {
    ei_shape sh;
    ei_sizes z;
    memset(&sh, 0, sizeof sh);
    sh.max_tokens = max_tokens;
    sh.n_heads = cs->H;
    sh.n_kv_heads = cs->KV;
    sh.head_dim = cs->d;
    sh.plan_flags = plan_flags;
    sh.n_threads = ops_way_n(cs, way);
    CHECK_OK(ei_layer_sizes(s->ctx, &sh, &z));
    return z;
}
/* Whether the library promises two ways of a case the same bits on a side:
   plans are "the same plan however it runs"; a prefill row is computed by
   one thread in one order whatever ith/nth; decode scores split by query
   head; select, shared_add and select_shared run on one thread (part 0);
   on the GPU every way is the same launch sequence. Not: decode attention
   on the CPU over other key splits (one thread against nth: the partials
   are summed in another order: within the attention tolerance), and on the
   GPU ei_decode_keep against ei_decode_score + ei_decode_select (its own
   launches: keep sets equal up to near-ties). */
CHECK_FN int ops_ways_exact(const ops_case *cs, int gpu, char a, char b) {
    if (!gpu && (cs->op == OP_DECODE_ATTN || cs->op == OP_DECODE_ATTN_KEEP)) return ops_way_n(cs, a) == ops_way_n(cs, b);
    if (gpu && cs->op == OP_DECODE_KEEP) return ops_way_is_parts(a) == ops_way_is_parts(b);
    return 1;
}

/* Whether the CUDA backend runs the case (else it must refuse it with
   EI_ERR_DTYPE or EI_ERR_UNSUPPORTED): attention takes k and v 16-bit, q of
   k's dtype or f32, head_dim 64/128/256, and no keep set; planning takes
   every configuration, int8 ranking scores (CFG_SAMPLED_I8) included. */
CHECK_FN int ops_gpu_runs(const ops_case *cs) {
    if (cs->op == OP_DECODE_ATTN_KEEP) return 0;
    if (cs->op == OP_PLAN_MASK) return 1;
    if (cs->op == OP_PREFILL_DENSE || cs->op == OP_PREFILL_SPARSE || cs->op == OP_DECODE_ATTN)
        return cs->kv != EI_F32 && (cs->q == cs->kv || cs->q == EI_F32) && (cs->d == 64 || cs->d == 128 || cs->d == 256);
    return 1;
}

/* ------------------------------------------------------------ random data */
typedef struct ops_rng { uint64_t s; } ops_rng;
CHECK_FN uint64_t ops_next(ops_rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
CHECK_FN double ops_unit(ops_rng *r) { return (double)(ops_next(r) >> 11) * (1.0 / 9007199254740992.0); }
CHECK_FN float ops_normal(ops_rng *r) {
    double u = ops_unit(r) + 1e-12, v = ops_unit(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* ------------------------------------------------------------ views */
/* [rows][H][d] stored as dt in a layout; bytes outside the elements 0xFF
   (NaN in every dtype). */
typedef struct ops_view {
    ei_dtype dt;
    int64_t rows, ts, hs, off, extent;
    int32_t H, d;
    unsigned char *host;
} ops_view;
CHECK_FN size_t ops_view_bytes(const ops_view *v) { return (size_t)v->extent * dtype_size(v->dt); }
CHECK_FN void ops_view_make(ops_view *v, ei_dtype dt, int64_t rows, int32_t H, int32_t d, int layout) {
    v->dt = dt; v->rows = rows; v->H = H; v->d = d; v->off = 0;
    if (layout == LAY_STRIDED) { v->off = 3; v->hs = d + 8; v->ts = (int64_t)H * v->hs + 5; }
    else if (layout == LAY_HEAD_MAJOR) { v->ts = d; v->hs = rows * d + 4; }
    else { v->hs = d; v->ts = (int64_t)H * d; }
    v->extent = v->off + (rows - 1) * v->ts + (int64_t)(H - 1) * v->hs + d;
    v->host = (unsigned char *)malloc(ops_view_bytes(v));
    if (!v->host) { printf("out of memory\n"); exit(2); }
    memset(v->host, 0xFF, ops_view_bytes(v));
}
CHECK_FN int64_t ops_at(const ops_view *v, int64_t t, int32_t h, int32_t i) { return v->off + t * v->ts + (int64_t)h * v->hs + i; }
CHECK_FN void ops_set(ops_view *v, int64_t t, int32_t h, int32_t i, float x) {
    int64_t e = ops_at(v, t, h, i);
    if (v->dt == EI_F32) memcpy(v->host + e * 4, &x, 4);
    else {
        uint16_t b = v->dt == EI_F16 ? ei__f32_to_f16(x) : ei__f32_to_bf16(x);
        memcpy(v->host + e * 2, &b, 2);
    }
}
CHECK_FN double ops_get(const ops_view *v, const unsigned char *bytes, int64_t t, int32_t h, int32_t i) {
    return ei__load1(bytes, v->dt, ops_at(v, t, h, i));
}
/* Tokens [first, first + n) of a view whose bytes start at base. */
CHECK_FN ei_tensor ops_tensor(const ops_view *v, const void *base, int64_t first, int64_t n) {
    ei_tensor t = ei_tensor_make((const char *)base + (size_t)(v->off + first * v->ts) * dtype_size(v->dt), v->dt, n, v->H, v->d);
    t.token_stride = v->ts;
    t.head_stride = v->hs;
    return t;
}
CHECK_FN ei_out_tensor ops_out_tensor(const ops_view *v, void *base) {
    ei_out_tensor t = ei_out_tensor_make((char *)base + (size_t)v->off * dtype_size(v->dt), v->dt, v->rows, v->H, v->d);
    t.token_stride = v->ts;
    t.head_stride = v->hs;
    return t;
}
/* 1 if every byte of `bytes` outside the view's elements is still 0xFF. */
CHECK_FN int ops_padding_intact(const ops_view *v, const unsigned char *bytes) {
    size_t es = dtype_size(v->dt), nb = ops_view_bytes(v), b;
    unsigned char *mark = (unsigned char *)calloc(nb ? nb : 1, 1);
    int64_t t;
    int32_t h;
    int ok = 1;
    if (!mark) { printf("out of memory\n"); exit(2); }
    for (t = 0; t < v->rows; ++t)
        for (h = 0; h < v->H; ++h) memset(mark + (size_t)ops_at(v, t, h, 0) * es, 1, (size_t)v->d * es);
    for (b = 0; b < nb && ok; ++b) ok = mark[b] || bytes[b] == 0xFF;
    free(mark);
    return ok;
}
CHECK_FN void ops_view_free(ops_view *v) { free(v->host); v->host = NULL; }

/* ------------------------------------------------------------ a case's inputs */
typedef struct ops_data {
    const ops_case *cs;
    ei_config c;
    int64_t n, rows;         /* tokens (positions); rows of the k/v views (padded caches: more) */
    int64_t q0, m;           /* prefill attention and decode steps: the queries [q0, q0 + m) */
    ops_view q, k, v;        /* q [n][H][d], k and v [rows][KV][d] (decode: rows hold positions by row_pos) */
    int32_t *row_pos;        /* decode, padded layout: [rows] the position each row holds, -1 none */
    ei_plan plan;            /* prefill-sparse: the reference's plan (scalar path), host memory */
    ei_context *host;        /* the scalar context that made it */
    int32_t *keep_index;     /* attention through a keep set, compaction: [heads][cap] */
    int32_t keep_heads, keep_cap, keep_n;
    int64_t keep_tokens;
    ops_call calls[OPS_CALLS]; /* the protocol in tokens */
    int n_calls;
} ops_data;

/* The protocol's calls in tokens of n. */
CHECK_FN int ops_protocol_calls(int proto, int64_t n, ops_call *out) {
    int i, nc = 0;
    for (i = 0; i < OPS_CALLS && ops_protocols[proto][i].start >= 0; ++i) {
        const ops_call *p = &ops_protocols[proto][i];
        out[nc].start = (int)(n * p->start / 1000);
        out[nc].end = p->end < 0 ? -1 : (int)(n * p->end / 1000);
        out[nc].final = p->final;
        nc++;
    }
    return nc;
}

/* Q and K with structure planning can see (per kv head a direction; a
   query's share of it follows its segment, a key's its block); V normal. */
CHECK_FN void ops_fill_qk(ops_rng *r, ops_view *q, ops_view *k, int64_t n, int32_t seg, int32_t bs, const int32_t *row_pos) {
    int32_t KV = k->H, G = q->H / k->H, d = q->d, h, i;
    float *u = (float *)malloc(sizeof(float) * (size_t)KV * d), noise = 0.6f;
    int64_t t;
    if (!u) { printf("out of memory\n"); exit(2); }
    for (h = 0; h < KV; ++h) {
        float len = (float)sqrt((1.0 + 12.0 * ops_unit(r)) / d);
        for (i = 0; i < d; ++i) u[(size_t)h * d + i] = len * ops_normal(r);
    }
    for (t = 0; t < n; ++t)
        for (h = 0; h < q->H; ++h) {
            ops_rng sr;
            float f;
            sr.s = (uint64_t)(h / G) * 7919u + (uint64_t)(t / seg) * 104729u + 17u;
            f = (h / G) % 2 ? 2.0f : (float)(3.0 * ops_unit(&sr));
            for (i = 0; i < d; ++i) ops_set(q, t, h, i, noise * ops_normal(r) + f * u[(size_t)(h / G) * d + i]);
        }
    for (t = 0; t < k->rows; ++t) {
        int64_t p = row_pos ? row_pos[t] : t < n ? t : -1;
        for (h = 0; h < KV; ++h) {
            ops_rng sr;
            float f;
            sr.s = (uint64_t)h * 31u + (uint64_t)((p < 0 ? 0 : p) / bs) * 6151u + 5u;
            f = (float)(2.0 * ops_unit(&sr)) + (p >= 0 && p < bs && h % 2 == 0 ? 4.0f : 0.0f);
            for (i = 0; i < d; ++i) {
                float x = noise * ops_normal(r) + f * u[(size_t)h * d + i];
                if (p >= 0) ops_set(k, t, h, i, x); /* rows holding no position stay NaN */
            }
        }
    }
    free(u);
}
CHECK_FN void ops_fill_v(ops_rng *r, ops_view *v, int64_t n, const int32_t *row_pos) {
    int64_t t;
    int32_t h, i;
    for (t = 0; t < v->rows; ++t)
        for (h = 0; h < v->H; ++h)
            for (i = 0; i < v->d; ++i) {
                float x = ops_normal(r);
                if (row_pos ? row_pos[t] >= 0 : t < n) ops_set(v, t, h, i, x);
            }
}

/* The inputs of a case (seed: 0 for the table's own data; the fuzzer passes
   others). The reference plan of prefill-sparse comes from the scalar path. */
CHECK_FN void ops_data_make(ops_data *D, const ops_case *cs, uint64_t seed) {
    ops_rng r;
    int64_t j;
    memset(D, 0, sizeof *D);
    D->cs = cs;
    D->c = ops_config(cs->cfg);
    D->n = cs->n;
    r.s = seed * 0x2545F4914F6CDD1Dull + (uint64_t)cs->op * 1000003u + (uint64_t)cs->n * 7u + (uint64_t)cs->d + 1;
    D->n_calls = ops_protocol_calls(cs->proto, D->n, D->calls);
    D->rows = D->n;
    if (cs->layout == LAY_PADDED) {
        if (!ops_is_decode(cs->op) || ops_is_attention(cs->op)) /* an engine's cache: rows past the keys hold NaN */
            D->rows = (D->n + 255) / 256 * 256 + (D->n % 256 == 0 ? 256 : 0);
        else { /* rows out of position order, empty rows between */
            int64_t extra = D->n / 5 + 3, t;
            D->rows = D->n + extra;
            D->row_pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)D->rows);
            if (!D->row_pos) { printf("out of memory\n"); exit(2); }
            for (j = 0; j < D->rows; ++j) D->row_pos[j] = j < D->n ? (int32_t)j : -1;
            for (j = D->rows - 1; j > 0; --j) { /* scatter */
                int64_t x = (int64_t)(ops_next(&r) % (uint64_t)(j + 1));
                t = D->row_pos[j]; D->row_pos[j] = D->row_pos[x]; D->row_pos[x] = (int32_t)t;
            }
        }
    }
    /* attention queries: the protocol's last call (prefill), a step of a few tokens (decode) */
    D->q0 = 0;
    D->m = D->n;
    if (cs->op == OP_PREFILL_DENSE || cs->op == OP_PREFILL_SPARSE || cs->op == OP_PLAN_MASK) {
        const ops_call *last = &D->calls[D->n_calls - 1];
        D->q0 = last->start;
        D->m = (last->end < 0 ? D->n : last->end) - D->q0;
        if (D->m < 1) { D->q0 = 0; D->m = D->n; }
    }
    if (cs->op == OP_DECODE_ATTN || cs->op == OP_DECODE_ATTN_KEEP) {
        D->m = ops_way_n(cs, ops_first_way(cs)) > 1 ? 1 : 3; /* a split step: one token */
        D->q0 = D->n - D->m;
    }
    if (cs->op == OP_KV_COMPACT) { /* caches [rows][H][d] of two dtypes */
        ops_view_make(&D->k, cs->kv, D->rows, cs->H, cs->d, cs->layout);
        ops_view_make(&D->v, cs->q, D->rows, cs->H, cs->d / 2 + 1, cs->layout == LAY_HEAD_MAJOR ? LAY_CONTIG : cs->layout);
        ops_fill_v(&r, &D->k, D->n, NULL);
        ops_fill_v(&r, &D->v, D->n, NULL);
    } else {
        ops_view_make(&D->q, cs->q, D->n, cs->H, cs->d, cs->layout == LAY_PADDED ? LAY_CONTIG : cs->layout);
        ops_view_make(&D->k, cs->kv, D->rows, cs->KV, cs->d, cs->layout);
        ops_view_make(&D->v, cs->kv, D->rows, cs->KV, cs->d, cs->layout);
        ops_fill_qk(&r, &D->q, &D->k, D->n, D->c.segment_size, D->c.block_size, D->row_pos);
        ops_fill_v(&r, &D->v, D->n, D->row_pos);
    }
    if (cs->op == OP_PREFILL_SPARSE || cs->op == OP_PLAN_MASK) { /* the reference plan: the scalar path, whole prompt */
        ei_config c = D->c;
        ei_exec x;
        side hs;
        ei_sizes z;
        ei_tensor tq = ops_tensor(&D->q, D->q.host, 0, D->n), tk = ops_tensor(&D->k, D->k.host, 0, D->n);
        c.simd = EI_SIMD_SCALAR;
        D->host = ctx_make(0, c);
        hs.gpu = 0;
        hs.ctx = D->host;
        z = ops_sizes(&hs, cs, D->n, 0, '1');
        CHECK_OK(ei_plan_init(D->host, &D->plan, D->n, cs->KV, cs->d, 0, NULL, 0));
        memset(&x, 0, sizeof x);
        x.workspace_bytes = z.profile;
        x.workspace = malloc(z.profile);
        CHECK_OK(ei_profile(D->host, &x, &tq, &tk, &D->plan));
        free(x.workspace);
    }
    if (cs->op == OP_DECODE_ATTN_KEEP || cs->op == OP_KV_COMPACT) { /* a keep set: every third row and the newest 16 */
        int32_t h, i;
        int64_t made = cs->op == OP_KV_COMPACT ? D->n : D->q0 - 2;
        D->keep_heads = cs->op == OP_KV_COMPACT ? cs->H : D->c.per_kv_head ? cs->KV : cs->H;
        D->keep_cap = (int32_t)(made / 3 + 16 + 1);
        D->keep_tokens = made;
        D->keep_index = (int32_t *)malloc(sizeof(int32_t) * (size_t)D->keep_heads * (size_t)D->keep_cap);
        if (!D->keep_index) { printf("out of memory\n"); exit(2); }
        for (h = 0; h < D->keep_heads; ++h) {
            int32_t *idx = D->keep_index + (size_t)h * (size_t)D->keep_cap;
            int64_t j2, older = (made - 16 - 2) / 3;
            for (i = 0; i < D->keep_cap; ++i) idx[i] = -1;
            i = 0;
            for (j2 = 0; j2 < older; ++j2) idx[i++] = (int32_t)(3 * j2 + h % 3);
            for (j2 = made - 16; j2 < made; ++j2) idx[i++] = (int32_t)j2;
            D->keep_n = i; /* the same count for every head */
        }
    }
}
CHECK_FN void ops_data_free(ops_data *D) {
    ops_view_free(&D->q); ops_view_free(&D->k); ops_view_free(&D->v);
    free(D->row_pos);
    free(D->keep_index);
    if (D->host) { ei_plan_free(D->host, &D->plan); ei_context_destroy(D->host); }
    memset(D, 0, sizeof *D);
}

/* ------------------------------------------------------------ one run */
typedef struct ops_result {
    ei_result r;            /* the operation's code (its first failure) */
    ei_plan plan;           /* plans: a host copy (laid out by `host`) */
    ei_context *host;
    float *out;             /* attention [m][H][d]; scores [H][rows] or shared [rows] */
    size_t n_out;
    unsigned char *raw;     /* the decoder ring, the compacted caches: bytes */
    size_t n_raw;
    keep_host keep;         /* decode-keep, -select, -shared */
    int has_keep, intact;
    int64_t window;         /* decode: the window's positions */
    double seconds;
} ops_result;

CHECK_FN double ops_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define OPS_FIRST(res, call) do { ei_result r1_ = (call); if ((res) == EI_OK) (res) = r1_; } while (0)

/* A view's bytes on a side, and a host copy of them back. */
CHECK_FN void *ops_up(const side *s, const ops_view *v) { return mem_up(s, v->host, ops_view_bytes(v)); }

/* Plans: profile, chunked, in parts + finalize. */
CHECK_FN void ops_run_plan(const ops_data *D, const side *s, char way, ops_result *o) {
    const ops_case *cs = D->cs;
    uint32_t flags = EI_PLAN_SCORES | (cs->op == OP_PROFILE_CHUNKED ? EI_PLAN_CHUNKED : 0u);
    void *dq = ops_up(s, &D->q), *dk = ops_up(s, &D->k), *ws;
    ei_sizes z = ops_sizes(s, cs, D->n, flags, way);
    int calls = ops_way_calls(cs, way), i, j;
    ei_plan dplan, *plan;
    ei_config hc = D->c;
    double t0;
    memset(&dplan, 0, sizeof dplan);
    o->host = ctx_make(0, hc);
    CHECK_OK(ei_plan_init(o->host, &o->plan, D->n, cs->KV, cs->d, flags, NULL, 0));
    if (s->gpu) CHECK_OK(ei_plan_init(s->ctx, &dplan, D->n, cs->KV, cs->d, flags, NULL, 0));
    plan = s->gpu ? &dplan : &o->plan;
    ws = mem_new(s, z.profile); /* one workspace, whatever the way */
    t0 = ops_now();
    o->r = EI_OK;
    if (cs->op != OP_PROFILE_CHUNKED) {
        ei_tensor tq = ops_tensor(&D->q, dq, 0, D->n), tk = ops_tensor(&D->k, dk, 0, D->n);
        for (j = 0; j < calls; ++j) { /* the parts in turn, as an engine's threads would */
            ei_exec x = ops_exec(cs, way, j, ws, z.profile);
            OPS_FIRST(o->r, ei_profile(s->ctx, &x, &tq, &tk, plan));
        }
        if (calls > 1 && o->r == EI_OK) OPS_FIRST(o->r, ei_plan_finalize(s->ctx, plan)); /* after the barrier */
    } else
        for (i = 0; i < D->n_calls && o->r == EI_OK; ++i) {
            const ops_call *cc = &D->calls[i];
            int64_t end = cc->end < 0 ? cc->start : cc->end;
            ei_tensor tq = ops_tensor(&D->q, dq, cc->start, end - cc->start), tk = ops_tensor(&D->k, dk, 0, D->rows);
            if (cs->layout != LAY_PADDED) tk.n_tokens = end; /* padded: the whole cache, cells past end ignored */
            for (j = 0; j < calls; ++j) {
                ei_exec x = ops_exec(cs, way, j, ws, z.profile);
                OPS_FIRST(o->r, ei_profile_chunk(s->ctx, &x, cc->end < 0 ? NULL : &tq, &tk, plan, cc->start, cc->final));
            }
            if (calls > 1 && o->r == EI_OK) OPS_FIRST(o->r, ei_plan_finalize(s->ctx, plan));
        }
    o->seconds = ops_now() - t0;
    if (s->gpu && o->r == EI_OK) CHECK_OK(ei_plan_copy(s->ctx, &o->plan, &dplan, EI_COPY_DEVICE_TO_HOST));
    if (s->gpu) ei_plan_free(s->ctx, &dplan);
    mem_del(s, ws, z.profile);
    mem_del(s, dq, ops_view_bytes(&D->q));
    mem_del(s, dk, ops_view_bytes(&D->k));
    o->intact = 1;
}

/* Gathers an output view's elements into o->out (f32 [rows][H][d]) and
   checks the bytes around them. */
CHECK_FN void ops_take_out(const side *s, const ops_view *ov, void *dout, ops_result *o) {
    unsigned char *b = (unsigned char *)mem_down(s, dout, ops_view_bytes(ov));
    int64_t t;
    int32_t h, i;
    o->n_out = (size_t)ov->rows * (size_t)ov->H * (size_t)ov->d;
    o->out = (float *)malloc(sizeof(float) * (o->n_out ? o->n_out : 1));
    if (!o->out) { printf("out of memory\n"); exit(2); }
    for (t = 0; t < ov->rows; ++t)
        for (h = 0; h < ov->H; ++h)
            for (i = 0; i < ov->d; ++i) o->out[((size_t)t * ov->H + h) * ov->d + i] = (float)ops_get(ov, b, t, h, i);
    o->intact = ops_padding_intact(ov, b);
    free(b);
}

/* Attention: prefill dense/sparse, decode, decode through a keep set. */
CHECK_FN void ops_run_attention(const ops_data *D, const side *s, char way, ops_result *o) {
    const ops_case *cs = D->cs;
    void *dq = ops_up(s, &D->q), *dk = ops_up(s, &D->k), *dv = ops_up(s, &D->v), *dout, *ws, *didx = NULL;
    ops_view ov;
    int decode = ops_is_decode(cs->op), calls = ops_way_calls(cs, way), j;
    ei_sizes z = ops_sizes(s, cs, D->q0 + D->m, 0, way);
    size_t wb = decode ? z.decode : z.prefill;
    ei_plan dplan;
    const ei_plan *plan = NULL;
    ei_tensor tq = ops_tensor(&D->q, dq, D->q0, D->m), tk = ops_tensor(&D->k, dk, 0, D->q0 + D->m);
    ei_tensor tv = ops_tensor(&D->v, dv, 0, D->q0 + D->m);
    ei_out_tensor to;
    ei_keep_set ks;
    double t0;
    memset(&dplan, 0, sizeof dplan);
    memset(&ks, 0, sizeof ks);
    ops_view_make(&ov, cs->out, D->m, cs->H, cs->d, cs->layout == LAY_PADDED ? LAY_CONTIG : cs->layout);
    dout = ops_up(s, &ov);
    to = ops_out_tensor(&ov, dout);
    if (cs->op == OP_PREFILL_SPARSE) {
        if (s->gpu) {
            CHECK_OK(ei_plan_init(s->ctx, &dplan, D->n, cs->KV, cs->d, 0, NULL, 0));
            CHECK_OK(ei_plan_copy(s->ctx, &dplan, &D->plan, EI_COPY_HOST_TO_DEVICE));
            plan = &dplan;
        } else
            plan = &D->plan;
    }
    if (cs->op == OP_DECODE_ATTN_KEEP) {
        ks.heads_out = D->keep_heads;
        ks.capacity = D->keep_cap;
        ks.n_kept = D->keep_n;
        ks.compressed = 1;
        ks.n_tokens = D->keep_tokens;
        didx = mem_up(s, D->keep_index, sizeof(int32_t) * (size_t)D->keep_heads * (size_t)D->keep_cap);
        ks.index = (int32_t *)didx;
    }
    ws = mem_new(s, wb); /* one workspace, whatever the way (decode: the parts' partials live in it) */
    t0 = ops_now();
    o->r = EI_OK;
    for (j = 0; j < calls; ++j) {
        ei_exec x = ops_exec(cs, way, j, ws, wb);
        if (decode)
            OPS_FIRST(o->r, ei_attention_decode(s->ctx, &x, &tq, &tk, &tv, cs->op == OP_DECODE_ATTN_KEEP ? &ks : NULL, &to,
                                                D->q0));
        else
            OPS_FIRST(o->r, ei_attention_prefill(s->ctx, &x, &tq, &tk, &tv, plan, &to, D->q0));
    }
    /* after the barrier every part merges its rows (after a whole call: nothing to do) */
    for (j = 0; decode && o->r == EI_OK && j < calls; ++j) {
        ei_exec x = ops_exec(cs, way, j, ws, wb);
        OPS_FIRST(o->r, ei_attention_decode_merge(s->ctx, &x, &to));
    }
    o->seconds = ops_now() - t0;
    if (o->r == EI_OK) ops_take_out(s, &ov, dout, o);
    else o->intact = 1;
    if (s->gpu && plan) ei_plan_free(s->ctx, &dplan);
    if (didx) mem_del(s, didx, sizeof(int32_t) * (size_t)D->keep_heads * (size_t)D->keep_cap);
    mem_del(s, ws, wb);
    mem_del(s, dout, ops_view_bytes(&ov));
    mem_del(s, dq, ops_view_bytes(&D->q));
    mem_del(s, dk, ops_view_bytes(&D->k));
    mem_del(s, dv, ops_view_bytes(&D->v));
    ops_view_free(&ov);
}

/* Decode compression: observe, keep, score, select, shared. */
CHECK_FN void ops_run_decode(const ops_data *D, const side *s, char way, ops_result *o) {
    const ops_case *cs = D->cs;
    int layers = cs->op == OP_DECODE_SHARED ? 2 : 1, L, i, j, calls = ops_way_calls(cs, way);
    void *dq = ops_up(s, &D->q), *dk = ops_up(s, &D->k), *dv = ops_up(s, &D->v), *ring[2], *ws, *drp = NULL;
    void *dsc[2] = {NULL, NULL}, *dsh = NULL;
    ei_sizes z = ops_sizes(s, cs, D->rows, 0, way);
    size_t ring_bytes = z.decoder, wb = z.decode_keep, sc_bytes = sizeof(float) * (size_t)cs->H * (size_t)D->rows;
    ei_decoder dec[2];
    int32_t heads = D->c.per_kv_head ? cs->KV : cs->H, cap = (int32_t)EI__MIN(D->n, (int64_t)D->c.decode_budget);
    int64_t gen = 6, prompt = D->n - gen;
    ei_tensor tk[2];
    double t0;
    tk[0] = ops_tensor(&D->k, dk, 0, D->rows);
    tk[1] = ops_tensor(&D->v, dv, 0, D->rows); /* the second layer's keys */
    if (D->row_pos) drp = mem_up(s, D->row_pos, sizeof(int32_t) * (size_t)D->rows);
    ws = mem_new(s, wb); /* one workspace, whatever the way */
    t0 = ops_now();
    o->r = EI_OK;
    for (L = 0; L < layers; ++L) { /* the prompt in the protocol's batches, then generated tokens one at a time */
        int64_t t = 0;
        ring[L] = mem_new(s, ring_bytes);
        CHECK_OK(ei_decoder_init(s->ctx, &dec[L], cs->H, cs->KV, cs->d, ring[L], ring_bytes));
        for (i = 0; i < D->n_calls; ++i) { /* batches end where the protocol's calls end (roll-backs and skips merged) */
            int64_t end = EI__MIN((int64_t)(D->calls[i].end < 0 ? D->calls[i].start : D->calls[i].end), prompt);
            ei_tensor tq;
            if (end <= t) continue;
            tq = ops_tensor(&D->q, dq, t, end - t);
            OPS_FIRST(o->r, ei_decode_observe(s->ctx, &dec[L], &tq, t, 0));
            t = end;
        }
        if (t < prompt) {
            ei_tensor tq = ops_tensor(&D->q, dq, t, prompt - t);
            OPS_FIRST(o->r, ei_decode_observe(s->ctx, &dec[L], &tq, t, 0));
        }
        for (t = prompt; t < D->n; ++t) {
            ei_tensor tq = ops_tensor(&D->q, dq, t, 1);
            OPS_FIRST(o->r, ei_decode_observe(s->ctx, &dec[L], &tq, t, 1));
        }
    }
    o->window = EI__MIN(D->n, (int64_t)D->c.window);
    if (cs->op == OP_DECODE_OBSERVE) {
        o->n_raw = (size_t)D->c.window * (size_t)cs->H * (size_t)cs->d * 4;
        o->raw = (unsigned char *)mem_down(s, dec[0].queries, o->n_raw);
    }
    if (cs->op == OP_DECODE_KEEP) {
        ei_keep_set ks = keep_new(s, heads, cap, D->rows, D->rows);
        ei_result rk = EI_OK;
        ks.row_pos = (const int32_t *)drp;
        if (calls > 1) { /* ei_decode_keep runs on threads; an engine's parts score, then part 0 selects */
            ei_exec x = ops_exec(cs, way, 0, ws, wb);
            CHECK_ERR(ei_decode_keep(s->ctx, &x, &dec[0], &tk[0], &ks), EI_ERR_CONFIG);
            dsc[0] = mem_new(s, sc_bytes);
            for (j = 0; j < calls; ++j) {
                x = ops_exec(cs, way, j, ws, wb);
                OPS_FIRST(rk, ei_decode_score(s->ctx, &x, &dec[0], &tk[0], (const int32_t *)drp, 0, (float *)dsc[0]));
            }
            for (j = 0; j < calls && rk == EI_OK; ++j) { /* after the barrier */
                x = ops_exec(cs, way, j, ws, wb);
                OPS_FIRST(rk, ei_decode_select(s->ctx, &x, &dec[0], (const float *)dsc[0], D->rows, &ks));
            }
        } else {
            ei_exec x = ops_exec(cs, way, 0, ws, wb);
            rk = ei_decode_keep(s->ctx, &x, &dec[0], &tk[0], &ks);
        }
        keep_take(s, &ks, rk, &o->keep);
        o->has_keep = 1;
        OPS_FIRST(o->r, o->keep.r);
    }
    if (cs->op == OP_DECODE_SCORE || cs->op == OP_DECODE_SELECT || cs->op == OP_DECODE_SHARED) {
        for (L = 0; L < layers; ++L) {
            dsc[L] = mem_new(s, sc_bytes);
            for (j = 0; j < calls; ++j) {
                ei_exec x = ops_exec(cs, way, j, ws, wb);
                OPS_FIRST(o->r, ei_decode_score(s->ctx, &x, &dec[L], &tk[L], (const int32_t *)drp, 0, (float *)dsc[L]));
            }
        }
        if (cs->op == OP_DECODE_SCORE) {
            o->out = (float *)mem_down(s, dsc[0], sc_bytes);
            o->n_out = sc_bytes / 4;
        }
        if (cs->op == OP_DECODE_SELECT) { /* every part calls it after the barrier; part 0 selects */
            ei_keep_set ks = keep_new(s, heads, cap, D->rows, D->rows);
            ei_result rk = EI_OK;
            ks.row_pos = (const int32_t *)drp;
            for (j = 0; j < calls; ++j) {
                ei_exec x = ops_exec(cs, way, j, ws, wb);
                OPS_FIRST(rk, ei_decode_select(s->ctx, &x, &dec[0], (const float *)dsc[0], D->rows, &ks));
            }
            keep_take(s, &ks, rk, &o->keep);
            o->has_keep = 1;
            OPS_FIRST(o->r, o->keep.r);
        }
        if (cs->op == OP_DECODE_SHARED) {
            float *zero = (float *)calloc((size_t)D->rows, sizeof(float));
            ei_keep_set ks;
            ei_result rk = EI_OK;
            if (!zero) { printf("out of memory\n"); exit(2); }
            dsh = mem_up(s, zero, sizeof(float) * (size_t)D->rows);
            free(zero);
            for (L = 0; L < layers; ++L)
                for (j = 0; j < calls; ++j) {
                    ei_exec x = ops_exec(cs, way, j, ws, wb);
                    OPS_FIRST(o->r, ei_decode_shared_add(s->ctx, &x, &dec[L], (const float *)dsc[L], D->rows,
                                                         (const int32_t *)drp, (float *)dsh));
                }
            o->out = (float *)mem_down(s, dsh, sizeof(float) * (size_t)D->rows);
            o->n_out = (size_t)D->rows;
            ks = keep_new(s, 1, cap, D->rows, D->rows);
            ks.row_pos = (const int32_t *)drp;
            for (j = 0; j < calls; ++j) {
                ei_exec x = ops_exec(cs, way, j, ws, wb);
                OPS_FIRST(rk, ei_decode_select_shared(s->ctx, &x, &dec[0], (const float *)dsh, D->rows, &ks));
            }
            keep_take(s, &ks, rk, &o->keep);
            o->has_keep = 1;
            OPS_FIRST(o->r, o->keep.r);
            mem_del(s, dsh, sizeof(float) * (size_t)D->rows);
        }
    }
    o->seconds = ops_now() - t0;
    o->intact = 1;
    for (L = 0; L < layers; ++L) {
        mem_del(s, ring[L], ring_bytes);
        if (dsc[L]) mem_del(s, dsc[L], sc_bytes);
    }
    if (drp) mem_del(s, drp, sizeof(int32_t) * (size_t)D->rows);
    mem_del(s, ws, wb);
    mem_del(s, dq, ops_view_bytes(&D->q));
    mem_del(s, dk, ops_view_bytes(&D->k));
    mem_del(s, dv, ops_view_bytes(&D->v));
}

/* Compaction of a K and a V cache (two dtypes, V narrower) with the case's keep set. */
CHECK_FN void ops_run_compact(const ops_data *D, const side *s, ops_result *o) {
    size_t ib = sizeof(int32_t) * (size_t)D->keep_heads * (size_t)D->keep_cap, kb = ops_view_bytes(&D->k), vb = ops_view_bytes(&D->v);
    void *dk = ops_up(s, &D->k), *dv = ops_up(s, &D->v), *didx = mem_up(s, D->keep_index, ib);
    ei_out_tensor ok = ops_out_tensor(&D->k, dk), ov = ops_out_tensor(&D->v, dv);
    ei_keep_set ks;
    double t0;
    unsigned char *bk, *bv;
    memset(&ks, 0, sizeof ks);
    ks.heads_out = D->keep_heads;
    ks.capacity = D->keep_cap;
    ks.n_kept = D->keep_n;
    ks.compressed = 1;
    ks.n_tokens = D->keep_tokens;
    ks.index = (int32_t *)didx;
    t0 = ops_now();
    o->r = ei_kv_compact(s->ctx, &ks, &ok, &ov);
    o->seconds = ops_now() - t0;
    bk = (unsigned char *)mem_down(s, dk, kb);
    bv = (unsigned char *)mem_down(s, dv, vb);
    o->n_raw = kb + vb;
    o->raw = (unsigned char *)malloc(o->n_raw);
    if (!o->raw) { printf("out of memory\n"); exit(2); }
    memcpy(o->raw, bk, kb);
    memcpy(o->raw + kb, bv, vb);
    free(bk);
    free(bv);
    o->intact = 1;
    mem_del(s, didx, ib);
    mem_del(s, dk, kb);
    mem_del(s, dv, vb);
}

/* The plan as a mask: the mask's views and the base's values. Keys: the
   k view's rows (a padded cache: keys past the queries). The base is an
   engine's mask: -inf past the query and on every 37th key (another
   sequence's cells), else a small value of its own (ALiBi-like). */
CHECK_FN int32_t ops_mask_heads(const ops_case *cs) { return cs->nth == 1 ? 1 : cs->nth == 2 ? cs->KV : cs->H; }
CHECK_FN int64_t ops_mask_keys(const ops_data *D) { return D->cs->layout == LAY_PADDED ? D->rows : D->q0 + D->m; }
CHECK_FN int ops_mask_has_base(const ops_case *cs) { return cs->layout != LAY_CONTIG; }
CHECK_FN void ops_mask_base(const ops_data *D, ops_view *b) {
    const ops_case *cs = D->cs;
    int32_t hb = cs->nth % 2 ? 1 : ops_mask_heads(cs), h; /* one head broadcast, or one per mask head */
    int64_t i, j, nk = ops_mask_keys(D);
    ops_view_make(b, cs->q, D->m, hb, (int32_t)nk, cs->layout == LAY_PADDED ? LAY_STRIDED : cs->layout);
    for (i = 0; i < D->m; ++i)
        for (h = 0; h < hb; ++h)
            for (j = 0; j < nk; ++j)
                ops_set(b, i, h, (int32_t)j, j > D->q0 + i || j % 37 == 36 ? -INFINITY : (float)((j + 3 * h) % 7) * -0.25f);
}
CHECK_FN void ops_run_mask(const ops_data *D, const side *s, ops_result *o) {
    const ops_case *cs = D->cs;
    ops_view ov, bv;
    void *dout, *dbase = NULL;
    ei_plan dplan;
    const ei_plan *plan = &D->plan;
    ei_mask out, base;
    double t0;
    memset(&dplan, 0, sizeof dplan);
    memset(&bv, 0, sizeof bv);
    ops_view_make(&ov, cs->out, D->m, ops_mask_heads(cs), (int32_t)ops_mask_keys(D),
                  cs->layout == LAY_PADDED ? LAY_CONTIG : cs->layout);
    dout = ops_up(s, &ov);
    out.data = (char *)dout + (size_t)ov.off * dtype_size(ov.dt);
    out.dtype = ov.dt; out.n_heads = ov.H; out.n_rows = ov.rows; out.n_keys = ov.d;
    out.row_stride = ov.ts; out.head_stride = ov.hs;
    if (ops_mask_has_base(cs)) {
        ops_mask_base(D, &bv);
        dbase = ops_up(s, &bv);
        base.data = (char *)dbase + (size_t)bv.off * dtype_size(bv.dt);
        base.dtype = bv.dt; base.n_heads = bv.H; base.n_rows = bv.rows; base.n_keys = bv.d;
        base.row_stride = bv.ts; base.head_stride = bv.hs;
    }
    if (s->gpu) {
        CHECK_OK(ei_plan_init(s->ctx, &dplan, D->n, cs->KV, cs->d, 0, NULL, 0));
        CHECK_OK(ei_plan_copy(s->ctx, &dplan, &D->plan, EI_COPY_HOST_TO_DEVICE));
        plan = &dplan;
    }
    t0 = ops_now();
    o->r = ei_plan_mask(s->ctx, plan, D->q0, dbase ? &base : NULL, &out);
    if (s->gpu && o->r == EI_OK) CHECK_OK(ei_cuda_status(s->ctx));
    o->seconds = ops_now() - t0;
    if (o->r == EI_OK) ops_take_out(s, &ov, dout, o);
    else o->intact = 1;
    if (s->gpu) ei_plan_free(s->ctx, &dplan);
    if (dbase) mem_del(s, dbase, ops_view_bytes(&bv));
    mem_del(s, dout, ops_view_bytes(&ov));
    ops_view_free(&ov);
    ops_view_free(&bv);
}

/* Runs the case on a side the way `way` (one of its ways): o holds what came back. */
CHECK_FN void ops_run_way(const ops_data *D, const side *s, char way, ops_result *o) {
    memset(o, 0, sizeof *o);
    if (ops_is_plan(D->cs->op)) ops_run_plan(D, s, way, o);
    else if (D->cs->op == OP_PLAN_MASK) ops_run_mask(D, s, o);
    else if (D->cs->op == OP_KV_COMPACT) ops_run_compact(D, s, o);
    else if (ops_is_attention(D->cs->op)) ops_run_attention(D, s, way, o);
    else ops_run_decode(D, s, way, o);
}
/* The case's own way. */
CHECK_FN void ops_run(const ops_data *D, const side *s, ops_result *o) { ops_run_way(D, s, ops_first_way(D->cs), o); }
CHECK_FN void ops_result_free(ops_result *o) {
    if (o->host) { ei_plan_free(o->host, &o->plan); ei_context_destroy(o->host); }
    free(o->out);
    free(o->raw);
    if (o->has_keep) keep_free(&o->keep);
    memset(o, 0, sizeof *o);
}

/* ------------------------------------------------------------ comparing */
/* What rounding an f32 q to k's 16-bit type (the GPU's attention and its
   tensor-core sampled ranking do; the CPU keeps f32) can move a logit, twice
   (a softmax weight or a sampled mass, relative): 2 u scale max|q| max|k|,
   u 2^-8 (bf16) or 2^-11 (f16); 0 where q is not f32 over 16-bit k. */
CHECK_FN double ops_q_round_bound(const ops_data *D) {
    const ops_case *cs = D->cs;
    double qmax = 0, kmax = 0, u = cs->kv == EI_BF16 ? 1.0 / 256 : 1.0 / 2048;
    int64_t tt;
    int32_t h, i;
    if (cs->q != EI_F32 || cs->kv == EI_F32 || cs->op == OP_KV_COMPACT) return 0;
    for (tt = 0; tt < D->n; ++tt)
        for (h = 0; h < cs->H; ++h) {
            double x2 = 0;
            for (i = 0; i < cs->d; ++i) x2 += ops_get(&D->q, D->q.host, tt, h, i) * ops_get(&D->q, D->q.host, tt, h, i);
            qmax = fmax(qmax, sqrt(x2));
        }
    for (tt = 0; tt < D->rows; ++tt)
        for (h = 0; h < cs->KV; ++h) {
            double x2 = 0;
            for (i = 0; i < cs->d; ++i) x2 += ops_get(&D->k, D->k.host, tt, h, i) * ops_get(&D->k, D->k.host, tt, h, i);
            if (x2 == x2) kmax = fmax(kmax, sqrt(x2));
        }
    return 2 * u * qmax * kmax * (D->c.attn_scale > 0 ? (double)D->c.attn_scale : 1.0 / sqrt((double)cs->d));
}

/* The attention tolerance of a run against the reference: a CPU path
   (kernels rounding P: wider), or the GPU (16-bit k/v; an f32 q rounded to
   k's type adds its logit bound, u * scale * max|q| * max|k|, twice). */
CHECK_FN void ops_attn_tol(const ops_data *D, int gpu, ei_simd path, double *rel_l2, double *max_abs) {
    const ops_case *cs = D->cs;
    const test_tol *t = &test_tols[gpu ? (cs->out == EI_BF16 ? TOL_ATTN_GPU_BF16OUT : cs->kv == EI_F16 && cs->q == EI_F32
                                                                                          ? TOL_ATTN_GPU_F16 : TOL_ATTN_GPU)
                                       : kernel_rounds_p(path) && cs->q == EI_BF16 && cs->kv == EI_BF16 ? TOL_ATTN_ROUNDS_P
                                                                                                         : TOL_ATTN_CPU];
    double vmax = 0, extra = gpu ? ops_q_round_bound(D) : 0; /* the GPU rounds an f32 q to k's type */
    int64_t tt;
    int32_t h, i;
    for (tt = 0; tt < D->v.rows; ++tt)
        for (h = 0; h < D->v.H; ++h)
            for (i = 0; i < D->v.d; ++i) {
                double x = fabs(ops_get(&D->v, D->v.host, tt, h, i));
                if (x == x && x > vmax) vmax = x;
            }
    *rel_l2 = t->rel_l2 + extra + (gpu ? 0 : tol_out_rounding(cs->out));
    *max_abs = (t->max_abs + extra + tol_out_rounding(cs->out)) * (vmax > 1 ? vmax : 1);
}

/* Two plans (b against the reference a): fields; classes but at a knife-edge
   of e_t; entropies and budgets; rows identical or equal up to near-ties of
   the ranking scores (the sampled mass in double where the segment is
   sampled, else a's softmaxed scores), counts apart only where budgets
   are (a floor at a block edge) or at a knife-edge of top_p. */
CHECK_FN void ops_plan_compare(const char *who, const ops_data *D, const ei_plan *a, const ei_plan *b, double qround,
                               int *knife_out) {
    const ei_config *c = &D->c;
    int kvh, s, shown = 0, knife = 0, bad = 0, ent = 0, bud = 0;
    const test_tol *te = &test_tols[TOL_ENTROPY], *tb = &test_tols[TOL_BUDGET];
    double *sc;
    unsigned char *given = NULL;
    ei_tensor tq = ops_tensor(&D->q, D->q.host, 0, D->n), tk = ops_tensor(&D->k, D->k.host, 0, D->n);
    CHECK(a->n_tokens == b->n_tokens && a->n_segments == b->n_segments && a->n_blocks == b->n_blocks && a->final == b->final &&
              a->max_keep == b->max_keep,
          "%s: plan fields differ (tokens %lld/%lld, segments %d/%d, blocks %d/%d, final %d/%d)", who, (long long)a->n_tokens,
          (long long)b->n_tokens, a->n_segments, b->n_segments, a->n_blocks, b->n_blocks, a->final, b->final);
    if (a->n_segments != b->n_segments || a->max_keep != b->max_keep || a->n_blocks != b->n_blocks) return;
    sc = (double *)malloc(sizeof(double) * (size_t)(a->n_blocks + 1));
    if (D->cs->op == OP_PROFILE_CHUNKED) { /* the queries the chunked plan holds (the sampled rows it sums) */
        int i;
        int64_t t;
        given = (unsigned char *)calloc((size_t)D->n + 1, 1);
        for (i = 0; i < D->n_calls; ++i) {
            int64_t q0 = D->calls[i].start, q1 = D->calls[i].end < 0 ? q0 : D->calls[i].end;
            int64_t end = i ? (D->calls[i - 1].end < 0 ? D->calls[i - 1].start : D->calls[i - 1].end) : 0;
            if (q0 < end)
                for (t = q0 / c->segment_size * c->segment_size; t < D->n; ++t) given[t] = 0;
            for (t = q0; t < q1; ++t) given[t] = 1;
        }
    }
    for (kvh = 0; kvh < a->n_kv_heads; ++kvh) {
        int edge = 0;
        if (a->head_class[kvh] != b->head_class[kvh]) {
            for (s = 1; s < a->n_segments; ++s)
                edge |= fabs((double)a->entropy[EI_PLAN_ROW(a, kvh, s)] - c->rigid_entropy) <= 1e-3 * (c->rigid_entropy + 1e-6);
            CHECK(edge, "%s: kv head %d: class %d, reference %d, entropies not near e_t", who, kvh, b->head_class[kvh],
                  a->head_class[kvh]);
            knife++;
        }
        for (s = 0; s < a->n_segments; ++s) {
            size_t ra = EI_PLAN_ROW(a, kvh, s), rb = EI_PLAN_ROW(b, kvh, s);
            if (!close_to(b->entropy[rb], a->entropy[ra], te->abs, te->rel) && ent++ < 3)
                printf("  %s: kv %d seg %d: entropy %.9g, reference %.9g\n", who, kvh, s, (double)b->entropy[rb], (double)a->entropy[ra]);
            if (!edge && !close_to(b->budget[rb], a->budget[ra], tb->abs, tb->rel) && bud++ < 3)
                printf("  %s: kv %d seg %d: budget %.9g, reference %.9g\n", who, kvh, s, (double)b->budget[rb], (double)a->budget[ra]);
        }
    }
    CHECK(ent == 0 && bud == 0, "%s: %d entropies and %d budgets beyond %s / %s", who, ent, bud, te->name, tb->name);
    for (kvh = 0; kvh < a->n_kv_heads; ++kvh)
        for (s = 1; s < a->n_segments; ++s) {
            size_t ra = EI_PLAN_ROW(a, kvh, s), rb = EI_PLAN_ROW(b, kvh, s);
            int64_t nvis = EI__MIN((int64_t)s * (c->segment_size / c->block_size), (int64_t)a->n_blocks), bl;
            double tie;
            if (a->keep_count[ra] == b->keep_count[rb] && a->keep_blocks[ra] == b->keep_blocks[rb] &&
                !memcmp(EI_PLAN_BLOCKS(a, kvh, s), EI_PLAN_BLOCKS(b, kvh, s), sizeof(int32_t) * (size_t)a->max_keep))
                continue;
            if ((a->keep_blocks[ra] != b->keep_blocks[rb] || a->keep_count[ra] != b->keep_count[rb]) &&
                (a->budget[ra] != b->budget[rb] || a->head_class[kvh] != b->head_class[kvh] || c->per_segment_budget)) {
                knife++; /* budgets a rounding apart floor to other block counts; per-segment counts follow every head's */
                continue;
            }
            if (c->ranking == EI_RANK_SAMPLED && (int64_t)s * c->segment_size >= c->threshold_len &&
                ref_sampled_mass_given(c, &tq, &tk, kvh, s, D->n, given, sc) > 0)
                tie = test_tols[TOL_RANK_SAMPLED].tie + qround;
            else {
                for (bl = 0; bl < nvis; ++bl) sc[bl] = a->scores[ra * (size_t)a->blk_capacity + (size_t)bl];
                tie = test_tols[TOL_RANK_REFERENCE].tie;
            }
            bad += plan_row_compare(who, c, a, b, kvh, s, sc, tie, &knife, &shown);
        }
    CHECK(bad == 0, "%s: %d plan rows differ beyond near-ties", who, bad);
    if (knife_out) *knife_out += knife;
    free(sc);
    free(given);
}

/* A run (got, on path `path` or the GPU) against the reference run (ref,
   the scalar path): the same code; then what the operation returns, within
   the operation's tolerance. Returns the near-ties / knife-edges seen. */
CHECK_FN int ops_compare(const char *who, const ops_data *D, const ops_result *ref, const ops_result *got, int gpu, ei_simd path) {
    const ops_case *cs = D->cs;
    int knife = 0;
    CHECK(got->r == ref->r, "%s: %s, reference %s", who, ei_result_name(got->r), ei_result_name(ref->r));
    CHECK(got->intact, "%s: wrote outside its output's elements", who);
    if (got->r != EI_OK || ref->r != EI_OK) return 0;
    if (ops_is_plan(cs->op))
        ops_plan_compare(who, D, &ref->plan, &got->plan, gpu && D->c.ranking == EI_RANK_SAMPLED ? ops_q_round_bound(D) : 0, &knife);
    else if (ops_is_attention(cs->op)) {
        double rel_l2, max_abs;
        l2_acc a = l2_of_f32(got->out, ref->out, ref->n_out);
        ops_attn_tol(D, gpu, path, &rel_l2, &max_abs);
        CHECK(got->n_out == ref->n_out, "%s: %zu outputs, reference %zu", who, got->n_out, ref->n_out);
        check_l2(who, &a, rel_l2, max_abs);
    } else if (cs->op == OP_DECODE_OBSERVE || cs->op == OP_KV_COMPACT)
        CHECK(got->n_raw == ref->n_raw && !memcmp(got->raw, ref->raw, ref->n_raw), "%s: not bit-identical to the reference (%s)",
              who, test_tols[TOL_EXACT].why);
    else if (cs->op == OP_PLAN_MASK)
        CHECK(got->n_out == ref->n_out && !memcmp(got->out, ref->out, sizeof(float) * ref->n_out),
              "%s: the mask is not bit-identical to the reference (%s)", who, test_tols[TOL_EXACT].why);
    else {
        int32_t div = cs->op == OP_DECODE_SHARED ? 1 : D->c.per_kv_head ? 1 : cs->H / cs->KV;
        if (got->out) { /* scores */
            const test_tol *t = &test_tols[TOL_DECODE_SCORE];
            size_t j;
            int bad = 0;
            for (j = 0; j < ref->n_out; ++j)
                if (!close_to(got->out[j], ref->out[j], t->abs, t->rel) ||
                    ((ref->out[j] == 0.0f) != (got->out[j] == 0.0f) && fabs(got->out[j] - ref->out[j]) > 1e-12))
                    if (bad++ < 3) printf("  %s: score[%zu] %g, reference %g\n", who, j, (double)got->out[j], (double)ref->out[j]);
            CHECK(bad == 0, "%s: %d scores beyond %s", who, bad, t->name);
        }
        if (got->has_keep) {
            keep_check_one(who, ops_op_names[cs->op], &got->keep, D->row_pos, 0, div, got->window);
            knife += keep_compare(who, &ref->keep, &got->keep, D->row_pos, 0, div, got->window);
        }
    }
    return knife;
}

/* Two plans laid out alike, the same bits in every field and row planned. */
CHECK_FN int ops_plan_identical(const ei_plan *a, const ei_plan *b) {
    int32_t kvh, s;
    if (a->n_tokens != b->n_tokens || a->n_segments != b->n_segments || a->n_blocks != b->n_blocks ||
        a->max_keep != b->max_keep || a->final != b->final || a->n_kv_heads != b->n_kv_heads)
        return 0;
    if (memcmp(a->head_class, b->head_class, (size_t)a->n_kv_heads)) return 0;
    for (kvh = 0; kvh < a->n_kv_heads; ++kvh)
        for (s = 0; s < a->n_segments; ++s) {
            size_t ra = EI_PLAN_ROW(a, kvh, s), rb = EI_PLAN_ROW(b, kvh, s);
            if (memcmp(&a->entropy[ra], &b->entropy[rb], 4) || memcmp(&a->budget[ra], &b->budget[rb], 4) ||
                a->keep_blocks[ra] != b->keep_blocks[rb] || a->keep_count[ra] != b->keep_count[rb] ||
                memcmp(EI_PLAN_BLOCKS(a, kvh, s), EI_PLAN_BLOCKS(b, kvh, s), sizeof(int32_t) * (size_t)a->max_keep))
                return 0;
            if (a->scores && b->scores &&
                memcmp(a->scores + ra * (size_t)a->blk_capacity, b->scores + rb * (size_t)b->blk_capacity,
                       sizeof(float) * (size_t)a->n_blocks))
                return 0;
        }
    return 1;
}
CHECK_FN int ops_keep_identical(const keep_host *a, const keep_host *b) {
    size_t ib = (size_t)a->heads * (size_t)a->cap * 4;
    return a->heads == b->heads && a->cap == b->cap && a->n_kept == b->n_kept && a->compressed == b->compressed &&
           a->n_tokens == b->n_tokens && a->n == b->n && a->pcap == b->pcap && !memcmp(a->index, b->index, ib) &&
           !memcmp(a->positions, b->positions, ib) && !memcmp(a->mask, b->mask, (size_t)a->heads * (size_t)a->n) &&
           !memcmp(a->pooled, b->pooled, (size_t)a->heads * (size_t)a->pcap * 4);
}
/* Another way's run (got, way wg) of a case on one side against its first
   way's (first, way wf): bit for bit where the library promises it
   (ops_ways_exact: the same code, and everything the operation returns
   the same bits), else as ops_compare compares a path with the reference.
   Returns the near-ties / knife-edges seen. */
CHECK_FN int ops_compare_ways(const char *who, const ops_data *D, const ops_result *first, const ops_result *got, int gpu,
                              ei_simd path, char wf, char wg) {
    int same;
    if (!ops_ways_exact(D->cs, gpu, wf, wg)) return ops_compare(who, D, first, got, gpu, path);
    CHECK(got->r == first->r, "%s: %s, the case's first way '%c' %s", who, ei_result_name(got->r), wf,
          ei_result_name(first->r));
    CHECK(got->intact, "%s: wrote outside its output's elements", who);
    if (got->r != EI_OK || first->r != EI_OK) return 0;
    same = got->n_out == first->n_out && got->n_raw == first->n_raw && got->has_keep == first->has_keep;
    if (same && got->out) same = !memcmp(got->out, first->out, sizeof(float) * got->n_out);
    if (same && got->raw) same = !memcmp(got->raw, first->raw, got->n_raw);
    if (same && got->has_keep) same = ops_keep_identical(&got->keep, &first->keep);
    if (same && ops_is_plan(D->cs->op)) same = ops_plan_identical(&got->plan, &first->plan);
    CHECK(same, "%s: not bit-identical to the case's first way '%c' (the library gives the same result however a call "
          "runs)", who, wf);
    return 0;
}

/* A mask against the keys check.h's reference attention reads
   (ref_token_keys: the union over kv heads for a one-head mask), and the
   base's values (0 without one) rounded to the mask's dtype on them. */
CHECK_FN void ops_check_mask(const char *who, const ops_data *D, const ops_result *o) {
    const ops_case *cs = D->cs;
    int32_t mh = ops_mask_heads(cs), G = mh == 1 ? 1 : mh / cs->KV, h, kvh;
    int64_t nk = ops_mask_keys(D), i, j, e, np, bad = 0;
    unsigned char *vis = (unsigned char *)malloc((size_t)nk);
    int64_t *pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(nk + (int64_t)D->plan.max_keep * D->c.block_size + 1));
    ops_view bv;
    memset(&bv, 0, sizeof bv);
    if (!vis || !pos) { printf("out of memory\n"); exit(2); }
    if (ops_mask_has_base(cs)) ops_mask_base(D, &bv);
    for (i = 0; i < D->m; ++i)
        for (h = 0; h < mh; ++h) {
            int64_t t = D->q0 + i;
            int sparse = ref_segment_sparse(&D->c, &D->plan, t / D->c.segment_size);
            memset(vis, 0, (size_t)nk);
            for (kvh = mh == 1 ? 0 : h / G; kvh < (mh == 1 ? cs->KV : h / G + 1); ++kvh) {
                np = ref_token_keys(&D->c, &D->plan, sparse, t, kvh, pos);
                for (e = 0; e < np; ++e) vis[pos[e]] = 1;
            }
            for (j = 0; j < nk; ++j) {
                float want = -INFINITY, got = o->out[((size_t)i * (size_t)mh + (size_t)h) * (size_t)nk + (size_t)j];
                if (vis[j]) {
                    want = bv.host ? (float)ops_get(&bv, bv.host, i, bv.H == 1 ? 0 : h, (int32_t)j) : 0.0f;
                    if (cs->out != EI_F32) want = cs->out == EI_F16 ? ei__f16_to_f32(ei__f32_to_f16(want))
                                                                    : ei__bf16_to_f32(ei__f32_to_bf16(want));
                }
                if (memcmp(&want, &got, sizeof want) != 0 && bad++ < 3)
                    printf("  %s: mask [%lld][%d][%lld] = %g, the reference's keys give %g\n", who, (long long)i, (int)h,
                           (long long)j, (double)got, (double)want);
            }
        }
    CHECK(bad == 0, "%s: %lld mask entries differ from the keys the reference attention reads", who, (long long)bad);
    free(vis);
    free(pos);
    ops_view_free(&bv);
}

/* The reference run against check.h's double-precision references where
   there is one (attention: every 7th query token; keep sets: their shape). */
CHECK_FN void ops_check_ref(const char *who, const ops_data *D, const ops_result *o) {
    const ops_case *cs = D->cs;
    if (o->r != EI_OK) return;
    if (ops_is_attention(cs->op)) {
        ei_tensor tq = ops_tensor(&D->q, D->q.host, D->q0, D->m), tk = ops_tensor(&D->k, D->k.host, 0, D->q0 + D->m);
        ei_tensor tv = ops_tensor(&D->v, D->v.host, 0, D->q0 + D->m);
        double *row = (double *)malloc(sizeof(double) * (size_t)cs->H * (size_t)cs->d), vmax = ref_vmax(&tv, -1), worst = 0;
        double tol = test_tols[TOL_ATTN_REF].max_abs + tol_out_rounding(cs->out);
        int64_t t;
        size_t i;
        int in_range = 1;
        ei_keep_set ks;
        memset(&ks, 0, sizeof ks);
        ks.heads_out = D->keep_heads; ks.capacity = D->keep_cap; ks.n_kept = D->keep_n; ks.n_tokens = D->keep_tokens;
        ks.index = D->keep_index;
        for (t = 0; t < D->m; t += 7) {
            const float *got = o->out + (size_t)t * (size_t)cs->H * (size_t)cs->d;
            if (cs->op == OP_DECODE_ATTN_KEEP) in_range &= ref_attention_keep(&D->c, &ks, &tq, &tk, &tv, D->q0, t, row);
            else in_range &= ref_attention_token(&D->c, cs->op == OP_PREFILL_SPARSE ? &D->plan : NULL, &tq, &tk, &tv, D->q0, t, row);
            for (i = 0; i < (size_t)cs->H * (size_t)cs->d; ++i) worst = fmax(worst, fabs(got[i] - row[i]) / (vmax > 0 ? vmax : 1));
        }
        CHECK(in_range && worst <= tol, "%s: against the double reference: max error %.3g of max|v| (limit %.3g)", who, worst, tol);
        free(row);
    }
    if (o->has_keep) {
        int32_t div = cs->op == OP_DECODE_SHARED ? 1 : D->c.per_kv_head ? 1 : cs->H / cs->KV;
        keep_check_one(who, ops_op_names[cs->op], &o->keep, D->row_pos, 0, div, o->window);
    }
    if (cs->op == OP_PLAN_MASK) ops_check_mask(who, D, o);
}

/* One line naming a case. */
CHECK_FN void ops_case_name(const ops_case *cs, char *buf, size_t cap) {
    snprintf(buf, cap, "%s n=%d %d/%d d=%d %s/%s->%s %s P%d %s nth=%d %s", ops_op_names[cs->op], cs->n, cs->H, cs->KV,
             cs->d, dtype_name(cs->q), dtype_name(cs->kv), dtype_name(cs->out), ops_layout_names[cs->layout], cs->proto,
             ops_cfg_names[cs->cfg], cs->nth, cs->ways ? cs->ways : "-");
}
#endif
