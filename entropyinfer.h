/* entropyinfer.h - entropy-guided adaptive sparse attention and latent
   KV-cache compression for long-context LLMs (EntropyInfer, arXiv 2606.09508),
   as one embeddable C99 header.                      MIT licence: see end.

   QUICK START
   ===========
   In exactly one C or C++ file:

       #define ENTROPYINFER_IMPLEMENTATION
       #include "entropyinfer.h"

   Everywhere else include it plainly. Link with -lm (and -lpthread for the
   optional thread helpers, -ldl for the optional CUDA backend). One layer
   of an engine, from the prompt to compressed decode: q_ptr, k_ptr, v_ptr
   (bf16) are the Q/K/V the model produces for n tokens after RoPE and
   out_ptr (f32) their attention output. The prompt (all but the last 32
   tokens) is prefilled in micro-batches of 512 over a KV cache padded to
   256 rows, then the last 32 are decoded one at a time, the cache
   compressed to cfg.decode_budget rows after cfg.decode_gap of them
   (`make test-quickstart-header` compiles and runs this block as it
   stands here, as C and as C++):

       ei_config cfg = ei_config_default();      // the paper's configuration
       ei_context *ctx;
       if (ei_context_create(&cfg, &ctx) != EI_OK) { puts(ei_last_error()); return 1; }
       const int64_t cap = (n + 255) / 256 * 256;  // cache rows, padded as many engines pad them
       const int64_t n_prompt = n - 32, ubatch = 512;
       const size_t row = 8 * 128;                // elements of a cache row: 8 kv heads x head_dim 128

       // once, at setup: every buffer of the layer from one query (32 query heads,
       // 8 kv heads, head_dim 128, up to cap tokens), the calls run on 2 threads
       ei_shape shape;
       memset(&shape, 0, sizeof shape);
       shape.max_tokens = cap;
       shape.n_heads = 32; shape.n_kv_heads = 8; shape.head_dim = 128;
       shape.plan_flags = EI_PLAN_CHUNKED;        // a plan for micro-batches
       shape.n_threads = 2;
       ei_sizes sz;
       if (ei_layer_sizes(ctx, &shape, &sz) != EI_OK) { puts(ei_last_error()); return 1; }
       ei_exec x;                                 // how every call runs: its threads (or
       memset(&x, 0, sizeof x);                   // x.ith/x.nth: a part of your own pool's)
       x.n_threads = 2;
       x.workspace = malloc(sz.workspace);        // and one workspace for every call
       x.workspace_bytes = sz.workspace;
       void *plan_mem = malloc(sz.plan), *dec_mem = malloc(sz.decoder);
       uint16_t *k_cache = (uint16_t *)calloc((size_t)cap * row, 2);
       uint16_t *v_cache = (uint16_t *)calloc((size_t)cap * row, 2);
       ei_plan plan;
       ei_decoder dec;
       ei_keep_set keep;
       memset(&keep, 0, sizeof keep);
       keep.heads_out = 8;                         // a set per kv head (cfg.per_kv_head)
       keep.capacity = cfg.decode_budget;
       keep.index = (int32_t *)malloc(sizeof(int32_t) * 8 * (size_t)cfg.decode_budget);
       ei_result r = ei_plan_init(ctx, &plan, cap, 8, 128, EI_PLAN_CHUNKED, plan_mem, sz.plan);
       if (r == EI_OK) r = ei_decoder_init(ctx, &dec, 32, 8, 128, dec_mem, sz.decoder);

       // prefill, per micro-batch of positions [p, p + m): its K/V appended to the cache,
       // planned against the padded cache (rows past p + m are ignored), attended, observed
       int64_t rows = 0;                          // cache rows in use
       for (int64_t p = 0; r == EI_OK && p < n_prompt; p += ubatch) {
           int64_t m = n_prompt - p < ubatch ? n_prompt - p : ubatch;
           memcpy(k_cache + (size_t)rows * row, (const uint16_t *)k_ptr + (size_t)p * row, (size_t)m * row * 2);
           memcpy(v_cache + (size_t)rows * row, (const uint16_t *)v_ptr + (size_t)p * row, (size_t)m * row * 2);
           rows += m;
           ei_tensor q = ei_tensor_make((const uint16_t *)q_ptr + (size_t)p * 32 * 128, EI_BF16, m, 32, 128);
           ei_tensor k = ei_tensor_make(k_cache, EI_BF16, cap, 8, 128);
           ei_tensor v = ei_tensor_make(v_cache, EI_BF16, cap, 8, 128);
           ei_out_tensor out = ei_out_tensor_make((float *)out_ptr + (size_t)p * 32 * 128, EI_F32, m, 32, 128);
           r = ei_profile_chunk(ctx, &x, &q, &k, &plan, p, p + m == n_prompt); // the plan
           if (r == EI_OK) r = ei_attention_prefill(ctx, &x, &q, &k, &v, &plan, &out, p);
           if (r == EI_OK) r = ei_decode_observe(ctx, &dec, &q, p, 0); // keeps the last cfg.window
       }

       // decode, per generated token of position t: its K/V appended at row `rows`,
       // attended, observed; when due, the cache keeps the rows that matter, in place
       for (int64_t t = n_prompt; r == EI_OK && t < n; ++t) {
           memcpy(k_cache + (size_t)rows * row, (const uint16_t *)k_ptr + (size_t)t * row, row * 2);
           memcpy(v_cache + (size_t)rows * row, (const uint16_t *)v_ptr + (size_t)t * row, row * 2);
           rows += 1;
           ei_tensor q1 = ei_tensor_make((const uint16_t *)q_ptr + (size_t)t * 32 * 128, EI_BF16, 1, 32, 128);
           ei_tensor k = ei_tensor_make(k_cache, EI_BF16, rows, 8, 128); // the rows in use (a
           ei_tensor v = ei_tensor_make(v_cache, EI_BF16, rows, 8, 128); // padded view: a row map)
           ei_out_tensor o1 = ei_out_tensor_make((float *)out_ptr + (size_t)t * 32 * 128, EI_F32, 1, 32, 128);
           // q_offset: the query's ROW (after a compaction rows are fewer than positions);
           // the keys split over the threads, no keep set: the whole cache
           r = ei_attention_decode(ctx, &x, &q1, &k, &v, NULL, &o1, rows - 1);
           if (r == EI_OK) r = ei_decode_observe(ctx, &dec, &q1, t, 1);
           if (r == EI_OK && ei_decode_due(ctx, &dec)) {     // after cfg.decode_gap tokens
               ei_out_tensor ko = ei_out_tensor_make(k_cache, EI_BF16, rows, 8, 128);
               ei_out_tensor vo = ei_out_tensor_make(v_cache, EI_BF16, rows, 8, 128);
               r = ei_decode_keep(ctx, &x, &dec, &k, &keep);
               if (r == EI_OK) r = ei_kv_compact(ctx, &keep, &ko, &vo);
               if (r == EI_OK) rows = keep.n_kept;  // RoPE positions go on from t + 1
           }
       }
       if (r != EI_OK) puts(ei_last_error());
       ei_context_destroy(ctx);
       free(plan_mem); free(dec_mem); free(x.workspace);
       free(k_cache); free(v_cache); free(keep.index);

   PROTOCOLS says what chunked plans equal and how decode lines up its
   window; THREADS how an engine's own thread pool runs the calls in parts;
   docs/integration.md shows caches shared by every layer (llama.cpp's).

   BUILD OPTIONS (define before the implementation include)
   =============
   | macro                   | effect                                               |
   | EI_STATIC               | all functions static (private copy per file)          |
   | EI_ASSERT(x)            | checks the library's internal invariants (sizes it  |
   |                         | computed itself, never caller input; default: no-op) |
   | EI_MALLOC(sz), EI_FREE(p)| default allocator pair (both or neither)            |
   | EI_NO_SIMD              | scalar paths only                                    |
   | EI_NO_AVX2, EI_NO_AVX512| leave out that x86 path                              |
   | EI_NO_AVX512BF16        | leave out the vdpbf16ps attention (EI_SIMD_AVX512_BF16)|
   | EI_NO_AMX               | leave out the AMX tile attention (EI_SIMD_AMX)         |
   | EI_NO_VNNI              | leave out vpdpbusd (EI_RANK_PRECISION_INT8's scores  |
   |                         | and EI_RANK_ROWS_SPREAD's picking then take int16    |
   |                         | vpmaddwd; the same results)                          |
   | EI_ATTN_PREFER_DPBF16   | AUTO: vdpbf16ps attention wherever present (default: |
   |                         | where its measured rate wins, ei_cpu_dpbf16_ratio)   |
   | EI_NO_NEON              | leave out the NEON path                               |
   | EI_NO_PTHREADS          | no built-in threads (n_threads shares run in turn)   |
   | EI_NO_CUDA_LOADER       | leave out dlopen of the CUDA backend                  |
   | EI_CUDA_LIBRARY_NAME    | the plugin's file name (default                      |
   |                         | "libentropyinfer_cuda.so"; GPU MEMORY: finding it)   |

   CONCEPTS
   ========
   segment     a run of segment_size consecutive queries (default 512).
   block       a run of block_size consecutive keys (default 8).
   profiling   cheap block-level estimate of each segment's attention: the
               elementwise max/min of a segment's queries and of a block's
               keys give score(s,b) = max((qmax.kmax + qmin.kmax)/2,
               (qmax.kmin + qmin.kmin)/2), averaged over the query heads of a
               kv group, softmaxed over the blocks strictly before s. The
               scores are not scaled: give profiling the raw post-RoPE Q.
               An engine that folds the attention scale into Q (llama.cpp's
               Gemma 3: Q * 1/sqrt(head_dim)) profiles the Q before that
               scale, or every block distribution is flattened by it.
   entropy     -sum p ln(p + 1e-9) of that distribution, per kv head, segment.
   rigid head  every entropy of segments 1.. is below rigid_entropy (e_t):
               keeps base_budget tokens in every segment.
   dynamic head budget follows the entropy's relative change r[s]:
               B[s] = clamp(B[s-1] + alpha*base*(r[s]-delta_t), 1x, 3x base).
   plan        per kv head and segment: entropy, budget, keep count and the
               ranked key blocks kept (descending score, ties to lower index).
   ranking     (cfg.ranking) the order in which a segment keeps blocks.
               EI_RANK_REFERENCE: the block score above (the paper's, and
               the golden-tested mode). EI_RANK_SAMPLED: attention mass.
               R = rank_samples real query rows of segment s (first token
               t0) are scored exactly: row i is token t_i = t0 +
               ((2i + 1) segment_size) / (2R) (integer division) of query
               head kvh*G + i mod G (G = query heads per kv head), used when
               t_i is a token given so far; the softmax of scale * q.k_j over
               keys j = 0..t_i (scale: attn_scale, 0 = 1/sqrt(head_dim)) is
               summed per block b < t0 / block_size, and a block's mass is
               that sum over the rows used. A row subsample of the true
               attention mass (its expectation over rows). A segment none of
               whose rows is given yet (a chunk that ends just after its
               start, or a last segment shorter than the first row's offset)
               is ranked by the reference score. Either way the
               reference score gives the entropy, the head class and the
               budget recurrence (a plan's budget field).
               Score precision (cfg.rank_precision): EI_RANK_PRECISION_F32
               scores in f32 (the default). EI_RANK_PRECISION_INT8 rounds
               each sampled row x (its d elements as f32) and each key to
               int8 with its own scale: s = max|x_i| / 127 (f32 division),
               x8_i = x_i / s (f32 division) rounded half away from zero,
               clamped to [-127, 127] (an all-zero row: zeros, s = 0); the
               row's logit on key j is then scale * s_q * s_k * (the int32
               sum of q8_i k8_i), the f32 products taken in that order
               (scale in log2 units, as the walk's exp2 needs); max, exp and
               the block sums are the f32 ranking's. Integer sums are exact,
               so every CPU path gives bit-identical scores (vpdpbusd on
               AVX512_VNNI or AVX-VNNI, int16 vpmaddwd on AVX2, plain loops
               elsewhere). Each key is rounded once per profiling call and
               kv head, however many rows and segments score it. It applies
               to EI_RANK_SAMPLED's ranking only (decode scores stay f32);
               the CUDA backend forms the same int32 sums (the int8 values
               held exactly in bf16 or f32 rows, whose products and partial
               sums are integers below 2^24: exact in f32) and the same
               logits. NaN or +-inf in a sampled row or a key: EI_ERR_NONFINITE, as
               with f32. An f32 emulation of this
               rounding ranked as well as f32 on Gemma 3 270M at 32k with
               128 rows; cost: docs/quality.md, "The sampled rows in int8
               (issue 35)".
               Rows (cfg.rank_rows): EI_RANK_ROWS_EVEN scores the rows
               above. EI_RANK_ROWS_SPREAD picks them by farthest point where
               the call holds the whole segment (tokens t0 .. t0 +
               segment_size - 1; elsewhere, a segment split across
               ei_profile_chunk calls or a prompt's shorter last segment,
               the even rows): the candidates are the tokens t0 + j st of
               each query head of the group, in that order (token-major),
               st the smallest stride that keeps them at most 1024 and
               their int8 rows at most 128 KiB (st = ceil(segment_size /
               max(1, floor(min(1024, 131072 / dq) / G))), dq = head_dim
               rounded up to 4: 512 candidates for G 4 at head_dim 256, 1024
               at 128; they fit one CTA's shared memory on the GPU, one
               thread a candidate: the CUDA backend refuses a group of more
               than 1024 query heads, EI_ERR_UNSUPPORTED),
               each rounded to int8 as above (c8; n = the int32 sum of c8^2,
               r = 1 / sqrt(n) in double, 0 where n is 0); the cosine of
               two candidates is (double)(the int32 sum of a8 b8) * r_a *
               r_b. Row 0 is even row 0's token rounded down to the stride
               (the group's first head);
               each next row is the candidate whose largest cosine to the
               rows so far is smallest (the earliest on ties); min(R,
               candidates) rows, scored in candidate order. Rows where the
               segment's queries differ, not at fixed offsets: a query
               direction that few tokens share gets a row, so the blocks
               only it attends to count. Integer dots: the same rows on
               every path and backend. Cost: R passes over the candidates
               (at most R x 128 Ki int8 products a segment and kv head).
               Measured on Gemma 3 270M: docs/quality.md, "Rows where the
               queries differ (issue 35)".
               EI_RANK_ANTIDIAGONAL: attention mass on antidiagonals, after
               XAttention (Xu et al., arXiv 2503.16428, which sums the
               strided antidiagonals of each (query block, key block) tile
               as the block's importance). R = rank_samples query tiles of
               block_size (bs) rows: tile i starts at token t0 + bs *
               (((2i + 1) (segment_size / bs)) / (2R)) (integer division),
               query head kvh*G + i mod G; its row r (token u) scores every
               key of the first sink_blocks blocks and, after them, only
               the keys j <= u with j mod bs = bs - 1 - r: one key of every
               block, so over the tile's bs rows each (tile, block) pair's
               antidiagonal, every key of a block once, for about the cost
               of one sampled row (R tiles see bs x R queries for the
               price of R rows). Unlike XAttention, which softmaxes the
               antidiagonal sums, each row is softmaxed over its own keys,
               a strided key weighing bs (it stands for its block; the
               sink blocks, whose mass a stride would miss, are exact), and
               its weight on a block added to the block's mass (a mass, so
               that top_p counts mean the same as with sampled rows).
               CPU only: the CUDA backend refuses it (EI_ERR_UNSUPPORTED)
               rather than plan differently.
               Measured on Gemma 3 270M (docs/quality.md): as good as
               EI_RANK_SAMPLED at about the same cost, not better, so
               ei_config_quality() keeps the sampled ranking.
   top_p       (0 = off) a head keeps, in ranking order, the fewest blocks
               whose share of the ranking's mass over the blocks before the
               segment reaches top_p (reference ranking: the softmaxed block
               scores; sampled: the mass), then at least base_budget and at
               most budget_max_factor x base_budget tokens, within the cap.
   sink, local the first sink_blocks blocks and the local_blocks blocks just
               before the segment lead every ranked row (sink first, then
               local, each ascending; counted once) and count in its keep
               count: a row keeps at least them (within the cap).
   observation window   the last `window` queries (the last window-decode_gap
               prompt queries and the first decode_gap generated ones); decode
               compression scores the cache against it and keeps
               decode_budget positions per kv head (window included), or one
               set for every head and layer of a sequence (shared keep set:
               each layer's scores weigh 1, ei_decode_shared_add).
   decode policy (cfg.decode_policy) what a keep set keeps besides the tail:
               the newest positions, which it always keeps (the keys of the
               queries the decoder holds: W = min(window, observed)). Of the
               other positions (candidates, oldest first) it keeps b - tail,
               b the decode budget below. One code path serves the four, so
               that they compare at equal budgets (issue 37):
     EI_DECODE_ENTROPYINFER  the paper's (arXiv 2606.09508; golden-tested):
               the mean over the window's W queries of their softmax weight
               (scale decode_scale) on each position, reduced per kv head by
               gqa_reduce (per_kv_head), pooled over the candidates (pool,
               pool_kernel), the top b - W kept. The window holds the last
               window - decode_gap prompt queries and the first generated
               ones, so generated queries take part in the scoring.
               decode_recent r > 0 (here and for SNAPKV; 0, the default, is
               the paper's): the newest R = max(floor(r x b), tail)
               positions are kept by recency, as H2O's recent window, and
               only the older candidates are ranked (their top b - R).
     EI_DECODE_STREAMING  StreamingLLM (Xiao et al., arXiv 2309.17453):
               no scoring and no read of K; the first min(decode_sink,
               b - W) positions held (its attention sinks; decode_sink 4 as
               in the paper) and the newest others, b in all. keep->pooled
               shows 1 for a kept candidate, 0 else.
     EI_DECODE_SNAPKV  SnapKV (Li et al., arXiv 2404.14469): the decoder
               holds the last `window` PROMPT queries (generated ones are
               counted, never stored); they score the positions they see
               (each its own and earlier) as the default does: mean weight,
               gqa_reduce, pooled (SnapKV's avgpool of width 5 and window 32
               are our defaults), the top kept. The tail is those W prompt
               positions and every generated position after them (SnapKV
               compresses the prompt only): a keep set whose tail exceeds b
               is refused (EI_ERR_STATE). decode_gap 0 compresses right
               after the prompt, as the paper; recompress_every scores again
               with the same prompt queries.
     EI_DECODE_H2O  H2O (Zhang et al., arXiv 2306.14048): the decoder sums,
               per query head and position, the softmax weights of every
               query it has scored (decode_positions positions, in its
               memory); each keep set adds the queries observed since the
               last one (at most the window's W: recompress_every <= window
               counts every generated query once; the first adds the W of
               the window, prompt queries among them), reduces the sums per
               kv head by gqa_reduce (no pooling, as H2O) and keeps the
               newest R = max(b / 2, W) positions (its recent window: half
               the budget, as the paper) and the top b - R older ones (its
               heavy hitters). A decoder sums for one sequence
               (ei_decoder_reset starts again; positions are its keys).
               Summing happens in the calls that write the decoder:
               ei_decode_keep, ei_decode_select, ei_decode_shared_add.
               Shared keep sets: each policy's per-layer value (the pooled
               mean weight, H2O's reduced sums over all heads) weighs 1 per
               layer as above (decode_shared_weight EI_SHARED_ENTROPY: exp(H)
               instead, H the entropy of the layer's normalised values, the
               number of cells it spreads over; off by default, unmeasured); ei_decode_select_shared keeps by the policy
               (STREAMING: by position alone, shared_add adds nothing).
   decode budget b  decode_budget positions per keep set (window included),
               or with decode_budget_ratio r > 0: ceil(r x P), P the
               sequence's length (its newest position held + 1, not the
               rows held: after a compaction the ratio still follows the
               context, so recompress_every keeps the cache near r x P as
               generation goes on), at least decode_budget_min and at most
               decode_budget. The cap is decode_budget so that the keep
               set's arrays and the engine's compacted cache are sized once
               from one number whatever the context; the floor (128 by
               default, >= window) keeps a short context's set from holding
               little more than its window, where no policy has candidates
               left to choose among (a choice, not a measurement). A cache
               holding fewer than b positions keeps every one.

   DATA FORMATS
   ============
   Tensors are views (ei_tensor): pointer, dtype (f32, f16, bf16), element
   strides for token and head (positive, non-aliasing), head_dim contiguous,
   data aligned to its element size (4 bytes f32, 2 bytes f16/bf16; the
   caller's int32/float arrays to 4 bytes; else EI_ERR_ALIGN). Plan, decoder
   and workspace memory may have any alignment (the library aligns inside).
   Query head h belongs to kv head h / (n_heads / n_kv_heads). A plan's
   arrays are [kv_head][segment] rows with row stride plan.seg_capacity;
   block_index rows hold plan.max_keep ranked block numbers padded with -1.
   A keep set holds, per head, the kept ROWS of the cache in ascending order
   (what ei_kv_compact moves) and, optionally, the position each holds; a
   cache's rows map to positions through row_pos (default: row j holds
   position j; -1: a row without one), so caches whose rows are not in
   position order (an engine's reused cells, a compacted cache) are scored
   in position order.

   PROTOCOLS
   =========
   Whole prompt: one ei_profile call with all queries and keys; equals the
   reference implementation (see tests/golden_runner.c).
   Chunked (micro-batched prefill, chat turns, prompt caches):
   ei_profile_chunk with the queries of positions [q_pos, q_pos + m) and the
   cache's keys (cell j = position j; cells past q_pos + m ignored): any
   start and count; q_pos below the plan's end rolls it back, above it skips
   positions; is_final marks the end of a prompt and a later chunk continues
   (the next turn). Segments split across chunks get their whole-prompt rows
   once all their queries are in; entropies of segments >= 1 are identical
   to whole-prompt ones. A head is rigid while every entropy so far is below
   e_t; once one is not it follows the budget recurrence, tracked from
   segment 0, so plans equal whole-prompt ones for every head except one that
   turns dynamic late (its earlier segments used the base budget). Segment
   0's entropy and the last segment's cap are set by a final call.
   On the CUDA backend ei_profile_chunk runs the same protocol with q, k and
   the plan in device memory, every kv head in one call (the head states stay
   in the plan's device memory; a call in parts is made whole by part 0): plans equal the CPU's chunked ones (counts, classes and the
   default ranking exactly; entropies and scores within float32 summation
   order; tests/test_cuda.c). With EI_RANK_SAMPLED the open segment's
   sampled rows are summed over chunks as on the CPU, by the whole-prompt
   sampled kernels (GPU MEMORY: tensor cores round an f32 q to k's type);
   the masses agree with the CPU's within that rounding and float32
   summation order (the GPU adds a chunk's rows to the stored ones as one
   sum, and splits keys by the chunk's shape), so near-ties may rank in
   another order, as for whole-prompt plans; counts (top_p: but at a
   knife-edge of the mass) and classes are the CPU's, entropies as above. Like ei_profile it queues its kernels on
   cfg.cuda_stream and waits only to read its data-error flag back (none
   with cuda_deferred_errors: a chunk can be captured in a CUDA graph). One
   difference: a q whose query heads per kv head differ from the open
   segment's is found on the device (EI_ERR_SHAPE after the plan changed,
   as with NaN: roll back with q_pos 0).
   Decode: ei_decode_observe the prompt's queries (the decoder keeps the last
   `window`), then each generated token's, each call with its first
   position (q_pos; calls follow each other). When ei_decode_due says so (after
   decode_gap generated tokens whose K/V are in the cache), ei_decode_keep
   scores the cache against the window (query i lines up with key
   n - window + i; the reference fires one token later, with its window one
   position off its keys: a deliberate difference) and ei_kv_compact
   compacts it. recompress_every = k compresses again every k tokens. After
   a compaction row i holds keep.positions[h][i]: pass them as row_pos next
   time, with the new tokens' rows after them. Engines whose cells are
   shared by every head and layer (llama.cpp) take one keep set per
   sequence: ei_decode_score each layer (threads split the query heads),
   ei_decode_shared_add its scores, ei_decode_select_shared, then evict the
   positions not kept. A padded cache (an engine's view longer than the
   sequence: llama.cpp pads its K view to 256 cells): without a row map row j
   holds position j and every row must hold one, so a view with more rows
   than the decoder's position_end (the newest observed query's position + 1)
   is refused (EI_ERR_SHAPE) by every decode call that scores or selects,
   never scored as positions; pass a view cut at position_end, or a row map
   with -1 for the padding (its rows are then never scored or kept). The
   other decode policies (CONCEPTS: decode policy)
   run through the same calls; EI_DECODE_SNAPKV and EI_DECODE_H2O change
   what ei_decode_score scores (the prompt's window; the queries not yet
   summed), and an EI_DECODE_H2O decoder needs decode_positions > 0 and
   positions below it. The CUDA backend runs every policy and ratio as the
   CPU does (the same keep sets up to float32 near-ties, tests/test_cuda.c),
   except that with cuda_deferred_errors and a row map the host never learns
   the sequence's length: decode_budget_ratio > 0 and EI_DECODE_H2O are
   refused there (EI_ERR_UNSUPPORTED; EI_DECODE_H2O's ei_decode_score is
   not, it writes no sums).

   ACCURACY ACROSS PATHS
   =====================
   Scalar, AVX2, AVX-512 and NEON agree within float32 summation-order error
   (not bit-identical); every path passes the golden tolerances of
   tests/golden/FORMAT.md. Entropies of chunked and whole-prompt planning on one path are
   bit-identical, and so are the sampled ranking's block masses (rows are
   added in row order however chunks cut a segment; on the CUDA backend the
   entropies are bit-identical too, the masses are not: a chunk's rows are
   summed apart from the rows stored before, and keys split by the chunk's
   shape, so near-ties may rank in another order, tests/test_cuda.c). The sampled ranking's
   SIMD kernels use a polynomial 2^x (~1 ulp) where the scalar one calls
   expf: masses agree across paths within 1e-3 relative, so near-ties may
   rank in another order. The avx512-bf16 path ranks (EI_RANK_SAMPLED)
   against bf16 keys of even head_dim with vdpbf16ps and so rounds q to bf16
   first, as the CUDA backend's ranking does on its tensor cores (logits
   within 2^-8 scale sum |q_i k_i|; equal to the other paths' for a bf16 q);
   decode scores keep an f32 q on every path, as on the CUDA backend.
   With EI_RANK_PRECISION_INT8 the sampled ranking's scores are
   bit-identical on every CPU path (and every x86 dot: vpdpbusd on zmm or
   ymm, vpmaddwd; the rounding is the same bytes); its masses then differ
   across paths only by the 2^x above (within 1e-3 relative).
   Decode scores run through the same kernels (rows in
   position order, whatever the row order of the cache): the same holds for
   them, and a cache and the same cache with its rows permuted give
   bit-identical scores on one path. EI_RANK_ANTIDIAGONAL
   scores each row with the path's dot product and expf: its masses agree across paths
   within float32 summation order, and are bit-identical on one path over
   thread and kv-head splits and however chunks cut a segment (rows are
   added in token order). expf/logf come from libm (no fast approximations) and no
   flush-to-zero is set.

   LIMITS
   ======
   EI_MAX_TOKENS (2^26) tokens, EI_MAX_HEADS (4096) heads, EI_MAX_HEAD_DIM
   (1024), views whose farthest element lies within 2^60 elements and within
   PTRDIFF_MAX bytes of the first, budgets up to EI_MAX_BUDGET: size
   arithmetic is checked (EI_ERR_SIZE / EI_ERR_OVERFLOW past them).
   32-bit targets (size_t and pointers of 32 bits; i386 and armhf are
   tested): the same limits, and two that bind sooner, each EI_ERR_OVERFLOW:
   a view's farthest element lies within PTRDIFF_MAX = 2^31 - 1 bytes of its
   first (2^29 f32 or 2^30 f16/bf16 elements) and below the top of the
   address space; every size the library computes (plans, workspaces, the
   decoder's ring, ei_*_size) fits in SIZE_MAX = 2^32 - 1 bytes, e.g. the
   decoder of a window of 65536 queries x 4096 heads x 1024 dims, or the
   profiling workspace of 2^26 tokens in one-token segments, are refused
   there (tests/test_limits.c checks both at the edge). The vdpbf16ps path
   (EI_SIMD_AVX512_BF16) is x86-64 only. Chunked planning keeps each kv head's open
   segment's query min/max for up to EI_MAX_CHUNK_GROUP (64) query heads per
   kv head (EI_ERR_UNSUPPORTED past it; whole-prompt planning has no limit).
   The sampled ranking scores up to EI_MAX_RANK_SAMPLES (4096) rows per
   segment and kv head (the antidiagonal one that many tiles); its workspace
   adds 32 x n_tokens floats of scores (EI_RANK_PRECISION_INT8: and the
   keys in int8, n_tokens x (head_dim rounded up to 4, + 8) bytes, and a
   batch of rows, 129 x head_dim bytes, per thread).
   Plan memory per layer (ei_sizes.plan; per kv head and segment: 24 bytes of
   counts plus a row of max_keep block indices, max_keep = the budget cap,
   not the context; chunked plans add the recurrence rows, one open
   segment's query min/max and block row per kv head): 32 query / 8 kv
   heads, head_dim 128, segment 512, EI_PLAN_CHUNKED: 2.14 MiB at 32k tokens
   (69 bytes per token), 7.08 MiB at 128k (57); ei_config_quality(): 2.64
   and 9.08 MiB. EI_PLAN_SCORES adds a float per kv head, segment and block
   (quadratic in tokens: for analysis). Chunked planning builds the key
   blocks' min/max of the cache again on every call, in its workspace (one
   read of K so far per chunk: n^2 / chunk work); EI_PLAN_KEEP_KEYS keeps
   them in the plan instead, 2 x head_dim x 4 bytes per block and kv head
   (1 KiB per token for 8 kv heads of 128: 33.6 MiB at 32k), and each call
   reads only the new keys (a roll-back builds them all again once). A plan
   of the library's memory (ei_plan_init with memory NULL) grows with the
   prompt (ei_plan_grow): allocate it for a micro-batch or two, not the
   context. Planning a 32k prompt of that shape in chunks
   of 512 (bench/bench_profile 32768 32 8 128 1 2 512 [1], bf16, one thread,
   AVX2, 2-core AMD EPYC VM): 1068-1152 ms without the store (three runs),
   317 ms with it, 289 ms as one ei_profile call; the plans are the same.
   Decode: a workspace of about (n_heads + 41) x 4 bytes per cache row per
   thread (ei_sizes.decode_keep); the rows that hold positions are read
   in full: NaN/Inf there, or scores that overflow, give EI_ERR_NONFINITE.
   A decoder observes at most EI_MAX_TOKENS queries (EI_ERR_SIZE past it;
   ei_decoder_reset starts again). An EI_DECODE_H2O decoder adds
   n_heads x decode_positions x 4 bytes (32 query heads, 32k positions:
   4 MiB per layer) and refuses a cache holding a position past it
   (EI_ERR_SIZE). Decode attention (ei_attention_decode)
   takes up to EI_DECODE_MAX_TOKENS (16) query tokens a call; its partials
   are threads x tokens x heads x (head_dim + 2) floats.
   NaN or Inf in Q or K: EI_ERR_NONFINITE (profiling reads them in full;
   attention checks each query row of its tiles and each key row it reads,
   just before scoring it: keys a sparse row drops, or past the call's last
   query, are not read; in parts, the parts whose rows meet it return
   it); finite inputs so large that float32 block or decode scores overflow:
   EI_ERR_NONFINITE (attention clamps its logits to +-FLT_MAX).
   Stack: a call uses at most 24 KiB of the caller's stack (measured: up to
   13 KB, ei_decode_keep on threads, gcc -O2 x86-64; tests/test_threads.c
   runs every entry point on a 64 KiB thread stack and checks the bound);
   the context's workers run on threads created with default attributes.
   V is never scanned: NaN/Inf in V propagates to the outputs of the queries
   that attend to it and, in the SIMD kernels, of the earlier queries of its
   64-key tile (masked weight 0 times NaN), as in tiled flash attention.

   MEMORY RULES
   ============
   A call refuses, with EI_ERR_OVERLAP and a message naming both, any two of
   the regions it reads and writes that intersect where one of them is
   written: views (address range from the first element to the end of the
   farthest), a plan's arrays, a decoder's query ring, the workspace bytes it
   uses (on threads: every thread's share, the per-thread size times the
   threads it runs, n_threads or fewer when there are fewer heads to split;
   in parts: the part's share), keep-set arrays, scores,
   row maps, and the ei_plan / ei_keep_set / ei_decoder / ei_tensor structs
   it reads or writes. Read-only regions may share memory (Q and K in one
   buffer). Two views with the same dtype and strides are compared element
   by element: K and V interleaved in one buffer pass. Plans and decoders
   are written by the library only: their layout fields and array pointers
   are sealed at init (a checksum in .seal), so one edited afterwards, or a
   struct never initialised, is refused (EI_ERR_STATE) before any of its
   memory is touched; so are counts outside what the memory was laid out for.
   MEMORY ARGUMENTS, the regions of each call (views: their data and their
   ei_tensor / ei_out_tensor struct, read; plan: the ei_plan struct, plan
   arrays: what ei_plan_init laid out; decoder: the ei_decoder struct and,
   where the struct is written, its summed attention (EI_DECODE_H2O), ring:
   its query ring; keep: the ei_keep_set struct and its index, positions,
   mask, pooled arrays; ws: the workspace bytes the call uses (above);
   the context is read by every call):
   | entry                               | reads             | writes          |
   | ei_plan_init                        |                   | plan, memory    |
   | ei_plan_reset                       |                   | plan, arrays    |
   | ei_plan_finalize                    | plan              | plan arrays     |
   | ei_plan_grow                        | plan, plan arrays | plan (arrays:   |
   |                                     |                   | new, library's) |
   | ei_profile ei_profile_chunk         | q, k              | plan, plan      |
   |                                     |                   | arrays, ws      |
   | ei_attention_prefill                | q, k, v, plan,    | out, ws         |
   |                                     | plan arrays       |                 |
   | ei_attention_decode                 | q, k, v, keep,    | ws (the parts'  |
   |                                     | keep->index       | partials; out   |
   |                                     |                   | on threads)     |
   | ei_attention_decode_merge           | ws (partials)     | out             |
   | ei_decoder_init                     |                   | decoder, memory |
   | ei_decoder_reset                    | ring (apart)      | decoder         |
   | ei_decode_observe                   | q                 | decoder, ring   |
   | ei_decode_keep                      | k, ring, row_pos  | decoder, keep   |
   |                                     |                   | and arrays, ws  |
   | ei_decode_score                     | k, decoder, ring, | scores, ws      |
   |                                     | row_pos           |                 |
   | ei_decode_select                    | scores, row_pos   | decoder, keep   |
   |                                     |                   | and arrays, ws  |
   | ei_decode_shared_add                | scores, row_pos   | decoder,        |
   |                                     |                   | shared, ws      |
   | ei_decode_select_shared             | shared, decoder,  | keep and        |
   |                                     | row_pos           | arrays, ws      |
   | ei_kv_compact                       | keep, keep->index | k, v            |
   | ei_plan_mask                        | base, plan, plan  | out             |
   |                                     | arrays            |                 |
   | ei_plan_copy (CUDA)                 | src plan, arrays  | dst plan, arrays|
   | ei_device_copy (device to device)   | src               | dst             |
   Every pair of a call's regions of which one is written is compared once,
   before anything is written (tests/test_limits.c places each region of
   every row inside each other one: at its start, middle and end, straddling
   its end, and just past it). A plan or decoder struct lying inside its own
   arrays is refused by every call that takes it (EI_ERR_OVERLAP). Structs
   come first: every entry that takes a plan or decoder checks its seal and
   counters before it reads anything else of it, whatever it returns:
   ei_plan_free leaves a plan it refuses as it is (nothing freed, the reason
   in ei_last_error; a zeroed plan is freed already, and a refused
   ei_plan_init leaves the struct as it was), ei_plan_segment_is_sparse and
   ei_decode_due return 0 for a refused struct (the reason in
   ei_last_error). Caller values (positions, counts, strides, capacities)
   are range-checked before any sum or product is formed with them, up to
   the int64 edges. A refused call leaves every struct, plan and decoder as
   it was: a call on threads checks every share before any thread runs (data
   errors found while computing, NaN/Inf or a row map's faults, may leave
   outputs written in part, as each call documents).

   ERRORS
   ======
   Every function returns ei_result: EI_OK (0) or a negative code.
   ei_result_name() and ei_result_string() give its name and meaning;
   ei_last_error() gives a message about the calling thread's last failure
   (thread-local storage; the only per-thread state in the library). An
   optional logger in ei_config receives the same messages. The library never
   aborts, exits or prints.

   THREADS
   =======
   Every operation runs as its ei_exec says (API, "execution"): on threads
   (n_threads: the calling thread and the context's workers) or in parts
   (ith/nth: the engine's own pool calls it nth times), with one workspace
   for the call either way (ei_layer_sizes for that thread count). An
   ei_context is immutable after creation: any number of threads may use
   one context at once. The parts of one call share its plan (each writes
   its own kv heads' rows; only part 0 or the part holding kv head 0 writes
   the shared fields), its output (each writes its own rows) and its
   workspace (each its own share); a decoder belongs to one call at a time
   (observe, keep, select and shared_add write it), except that the parts
   of ei_decode_score read it at once (each writes its own query heads'
   rows of scores). Anything else written by a call belongs to one thread at
   a time. The logger may be called from several threads at once (your
   threads, or the context's workers): make it thread-safe. A failure on a
   worker is returned, with its message, to the calling thread.
   Calls on threads run the first share on the calling thread and the
   others on workers the context keeps from call to call (started by the
   first call that needs them, ended by ei_context_destroy; they spin for
   some tens of microseconds after a call, then sleep). One call at a time
   has them: a call made while another thread's call holds them starts and
   joins threads of its own, which costs 51 us per extra thread on a 2-core
   Zen 5 VM (16 us on a Sapphire Rapids one). Measured on the Zen 5 VM,
   decode attention on 2 threads over 64 keys (32/8 heads, bf16, best of
   2000 calls): 30-33 us on 1 thread, 34-36 us on 2 with the kept workers,
   57-62 us starting threads per call. An engine with its own thread pool
   runs the calls in parts on it, as examples/gemma does for attention and
   the llama.cpp glue does on ggml's threads. Under EI_NO_PTHREADS a call
   on threads runs its shares one after another on the calling thread.
*/
#ifndef ENTROPYINFER_H
#define ENTROPYINFER_H

#include <stddef.h>
#include <stdint.h>

#define EI_VERSION_MAJOR 0
#define EI_VERSION_MINOR 2
#define EI_VERSION_PATCH 0
#define EI_VERSION_STRING "0.2.0"

#ifndef EIDEF
#ifdef EI_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define EIDEF static __attribute__((unused))
#else
#define EIDEF static
#endif
#else
#ifdef __cplusplus
#define EIDEF extern "C"
#else
#define EIDEF extern
#endif
#endif
#endif

/* ---------------------------------------------------------------- results */
/* One table yields the enum, the names and the messages. */
#define EI_RESULT_TABLE(X)                                                         \
    X(EI_OK,               0, "success")                                           \
    X(EI_ERR_NULL,        -1, "a required pointer argument is NULL")               \
    X(EI_ERR_SIZE,        -2, "a size is zero, negative or above its maximum")     \
    X(EI_ERR_GQA,         -3, "n_heads is not a multiple of n_kv_heads")           \
    X(EI_ERR_CONFIG,      -4, "invalid configuration value")                       \
    X(EI_ERR_STRIDE,      -5, "a stride is zero, negative or makes elements alias") \
    X(EI_ERR_DTYPE,       -6, "unknown or unsupported dtype")                      \
    X(EI_ERR_NONFINITE,   -7, "NaN or Inf in the input (or scores overflow)")      \
    X(EI_ERR_OVERFLOW,    -8, "size arithmetic overflows")                         \
    X(EI_ERR_WORKSPACE,   -9, "workspace or output buffer too small")             \
    X(EI_ERR_NOMEM,      -10, "allocation failed")                                 \
    X(EI_ERR_STATE,      -11, "call out of protocol order")                        \
    X(EI_ERR_SHAPE,      -12, "shapes of the arguments disagree")                  \
    X(EI_ERR_UNSUPPORTED,-13, "not supported by this CPU, build or backend")       \
    X(EI_ERR_BACKEND,    -14, "GPU backend unavailable (library, driver or device)") \
    X(EI_ERR_OVERLAP,    -15, "two buffers of a call overlap and one of them is written") \
    X(EI_ERR_ALIGN,      -16, "data not aligned to its element size")

/* Codes run 0, -1, -2, ... without gaps, so the lowest is 1 - (entries). */
#define EI__ONE(name, value, text) +1
typedef enum ei_result {
#define EI__ENUM(name, value, text) name = value,
    EI_RESULT_TABLE(EI__ENUM)
#undef EI__ENUM
    EI_RESULT_MIN_ = 1 - (0 EI_RESULT_TABLE(EI__ONE))
} ei_result;
#undef EI__ONE

EIDEF const char *ei_result_name(ei_result r);   /* "EI_ERR_NULL" */
EIDEF const char *ei_result_string(ei_result r); /* its meaning */
EIDEF const char *ei_last_error(void);           /* detail of this thread's last failure */

/* ---------------------------------------------------------------- tensors */
typedef enum ei_dtype { EI_F32 = 0, EI_F16 = 1, EI_BF16 = 2 } ei_dtype;

/* A read-only view of [n_tokens][n_heads][head_dim]. Strides count elements
   (not bytes), must be positive and must not make two elements alias;
   head_dim is contiguous. */
typedef struct ei_tensor {
    const void *data;
    ei_dtype dtype;
    int32_t n_heads;
    int32_t head_dim;
    int64_t n_tokens;
    int64_t token_stride;
    int64_t head_stride;
} ei_tensor;

/* The same for buffers the library writes (attention output, compaction). */
typedef struct ei_out_tensor {
    void *data;
    ei_dtype dtype;
    int32_t n_heads;
    int32_t head_dim;
    int64_t n_tokens;
    int64_t token_stride;
    int64_t head_stride;
} ei_out_tensor;

/* Contiguous [n_tokens][n_heads][head_dim] views. */
EIDEF ei_tensor ei_tensor_make(const void *data, ei_dtype dtype, int64_t n_tokens,
                               int32_t n_heads, int32_t head_dim);
EIDEF ei_out_tensor ei_out_tensor_make(void *data, ei_dtype dtype, int64_t n_tokens,
                                       int32_t n_heads, int32_t head_dim);

/* Documented maximums (checked; past them: EI_ERR_SIZE). */
#define EI_MAX_TOKENS     (1LL << 26)  /* 64M tokens per sequence */
#define EI_MAX_HEADS      4096
#define EI_MAX_HEAD_DIM   1024
#define EI_MAX_SEGMENT    (1 << 20)
#define EI_MAX_BUDGET     (1 << 26)
#define EI_MAX_CHUNK_GROUP 64          /* query heads per kv head in chunked planning */
#define EI_MAX_RANK_SAMPLES 4096       /* rank_samples */
#define EI_MAX_THREADS    256          /* ei_exec n_threads / nth, ei_shape n_threads */

/* ---------------------------------------------------------------- config */
typedef enum ei_pool { EI_POOL_AVG = 0, EI_POOL_MAX = 1, EI_POOL_NONE = 2 } ei_pool;
typedef enum ei_reduce { EI_REDUCE_MEAN = 0, EI_REDUCE_MAX = 1 } ei_reduce;
/* What decode compression keeps (CONCEPTS: decode policy). */
typedef enum ei_decode_policy {
    EI_DECODE_ENTROPYINFER = 0, /* the paper's: the window of generated queries scores the cache (golden-tested) */
    EI_DECODE_STREAMING = 1,    /* StreamingLLM: decode_sink first positions + the newest ones, no scoring */
    EI_DECODE_SNAPKV = 2,       /* SnapKV: the last prompt queries score the cache, generated ones never do */
    EI_DECODE_H2O = 3           /* H2O: attention summed over the queries observed so far: heavy hitters
                                   + the newest half of the budget */
} ei_decode_policy;
/* How ei_decode_shared_add weighs a layer in a shared keep set. */
typedef enum ei_shared_weight {
    EI_SHARED_EQUAL = 0,   /* each layer's candidates weigh 1 in total */
    EI_SHARED_ENTROPY = 1  /* a layer weighs exp(H), H the entropy of its normalised scores: the
                              number of cells it spreads over (a flat layer gets more cells) */
} ei_shared_weight;
/* How profiling ranks a segment's key blocks (CONCEPTS: ranking). */
typedef enum ei_ranking {
    EI_RANK_REFERENCE = 0, /* the paper's midpoint-query block score (golden-tested) */
    EI_RANK_SAMPLED = 1,   /* attention mass of sampled real query rows, scored exactly */
    EI_RANK_ANTIDIAGONAL = 2 /* attention mass on the antidiagonals of sampled (query block, key block)
                                tiles, as XAttention (arXiv 2503.16428); CPU only */
} ei_ranking;
/* The arithmetic of EI_RANK_SAMPLED's scores (CONCEPTS: ranking). */
typedef enum ei_rank_precision {
    EI_RANK_PRECISION_F32 = 0, /* f32 q . k (the avx512-bf16 path: q rounded to bf16 against bf16 keys) */
    EI_RANK_PRECISION_INT8 = 1 /* q rows and keys rounded to int8, one scale each, exact int32 dot
                                  products: the same scores on every path and backend */
} ei_rank_precision;
/* Which query rows EI_RANK_SAMPLED scores (CONCEPTS: ranking). */
typedef enum ei_rank_rows {
    EI_RANK_ROWS_EVEN = 0,  /* rows at evenly spaced tokens of the segment, the group's heads in turn */
    EI_RANK_ROWS_SPREAD = 1 /* farthest-point rows: each the query direction least like the rows
                               before it; both backends */
} ei_rank_rows;
typedef enum ei_simd {
    EI_SIMD_AUTO = 0,   /* best this CPU and OS support */
    EI_SIMD_SCALAR = 1, /* plain reference */
    EI_SIMD_AVX2 = 2,   /* AVX2 + FMA + F16C */
    EI_SIMD_AVX512 = 3, /* AVX-512 F/BW/DQ/VL (+BF16/FP16 dot products where present) */
    EI_SIMD_NEON = 4,
    EI_SIMD_AVX512_BF16 = 5, /* AVX-512, and vdpbf16ps attention for all-bf16 calls (CPUs with AVX512_BF16) */
    EI_SIMD_AMX = 6,         /* AVX-512, and AMX-BF16 tile attention for all-bf16 calls (Linux, CPUs with AMX) */
    EI_SIMD_NEON_BF16 = 7,   /* NEON, and BFDOT Q K^T for all-bf16 calls (CPUs with FEAT_BF16; forced only) */
    EI_SIMD_NEON_FHM = 8,    /* NEON, and FMLAL/FMLAL2 Q K^T for all-f16 calls (CPUs with FEAT_FHM; forced only) */
    EI_SIMD_NEON_BFMMLA = 9  /* NEON, and BFMMLA Q K^T for all-bf16 calls (CPUs with FEAT_BF16; forced only) */
} ei_simd;
typedef enum ei_backend {
    EI_BACKEND_CPU = 0,
    EI_BACKEND_CUDA = 1,        /* the CUDA plugin; context creation fails without it */
    EI_BACKEND_CUDA_OR_CPU = 2  /* the CUDA plugin when it loads and finds a GPU, else the CPU (the
                                   logger hears why); ei_context_config()->backend says which */
} ei_backend;

typedef struct ei_allocator {
    void *(*alloc)(size_t size, void *user_data);
    void (*free)(void *ptr, void *user_data);
    void *user_data;
} ei_allocator;

typedef void (*ei_log_fn)(void *user_data, ei_result code, const char *message);

/* Start from ei_config_default() (the paper's configuration) and change
   fields: several knobs have 0 as a meaningful value. */
typedef struct ei_config {
    /* prefill profiling and plans */
    int32_t segment_size;        /* 512 query tokens */
    int32_t block_size;          /* 8 key tokens; segment_size % block_size == 0 */
    int64_t threshold_len;       /* 4096: segments starting before it attend densely */
    int32_t base_budget;         /* 2048 tokens */
    double rigid_entropy;        /* e_t = 1e-5 */
    double delta_t;              /* 0.4 */
    double alpha;                /* 0.5 */
    double budget_min_factor;    /* 1.0: dynamic budgets >= 1x base */
    double budget_max_factor;    /* 3.0: dynamic budgets <= 3x base */
    int32_t last_segment_dense;  /* 1: the last segment always attends densely */
    int32_t per_segment_budget;  /* 0: each head keeps its own count (ragged);
                                    1: the reference's max over heads per segment */
    /* block ranking and budgets beyond the paper (CONCEPTS; the defaults are
       the reference's; ei_config_quality() gives the best measured values) */
    ei_ranking ranking;          /* EI_RANK_REFERENCE */
    int32_t rank_samples;        /* 64: query rows scored per segment and kv head (EI_RANK_SAMPLED);
                                    query tiles of block_size rows (EI_RANK_ANTIDIAGONAL) */
    double top_p;                /* 0: keep counts from the budget recurrence; in (0, 1]:
                                    blocks kept until their share of the ranking's mass
                                    reaches top_p, between base and max factor x base */
    int32_t sink_blocks;         /* 0: key blocks from position 0 always kept */
    int32_t local_blocks;        /* 0: key blocks just before the segment always kept */
    /* attention */
    float attn_scale;            /* 0: 1/sqrt(head_dim) */
    /* decode (latent KV compression) */
    int32_t decode_budget;       /* 1024 positions kept per head, window included */
    int32_t window;              /* 32 observation queries */
    int32_t decode_gap;          /* 16 generated tokens before compressing */
    ei_pool pool;                /* EI_POOL_AVG */
    int32_t pool_kernel;         /* 5 (odd) */
    int32_t per_kv_head;         /* 1: one keep-set per kv head; 0: per query head */
    ei_reduce gqa_reduce;        /* EI_REDUCE_MEAN over a group's query heads */
    int32_t recompress_every;    /* 0: compress once; k: again every k generated tokens */
    float decode_scale;          /* 0: 1/sqrt(head_dim) */
    ei_decode_policy decode_policy; /* EI_DECODE_ENTROPYINFER (CONCEPTS: decode policy) */
    int32_t decode_sink;         /* 4: positions from 0 that EI_DECODE_STREAMING always keeps */
    double decode_budget_ratio;  /* 0: keep sets hold decode_budget positions; in (0, 1]: ceil(ratio x
                                    the sequence's length in positions), between decode_budget_min
                                    and decode_budget (CONCEPTS: decode budget) */
    int32_t decode_budget_min;   /* 128: the floor of a ratio budget (window..decode_budget) */
    int64_t decode_positions;    /* 0: the positions 0..decode_positions-1 whose summed attention an
                                    EI_DECODE_H2O decoder holds (its memory: n_heads x 4 bytes each) */
    ei_shared_weight decode_shared_weight; /* EI_SHARED_EQUAL: a layer's weight in a shared keep set */
    float decode_recent;         /* 0: the paper's; in (0, 1]: EI_DECODE_ENTROPYINFER and EI_DECODE_SNAPKV
                                    keep the newest max(floor(decode_recent x b), tail) positions of a
                                    budget b and rank only the older ones (CONCEPTS: decode policy) */
    /* execution */
    ei_simd simd;                /* EI_SIMD_AUTO */
    ei_backend backend;          /* EI_BACKEND_CPU */
    const char *cuda_library;    /* NULL: $EI_CUDA_LIBRARY, then EI_CUDA_LIBRARY_NAME through the
                                    loader's search path, then beside the program (GPU MEMORY) */
    void *cuda_stream;           /* cudaStream_t for the CUDA backend (NULL: default) */
    int32_t cuda_deferred_errors; /* 0: GPU calls wait to return data errors; 1: per-layer GPU calls never
                                     wait (CUDA graph capture), data errors go to ei_cuda_status() */
    ei_allocator allocator;      /* {0}: EI_MALLOC/EI_FREE */
    ei_log_fn log;               /* NULL: silent */
    void *log_user_data;
    /* (last, so that the fields above keep the layout the CUDA plugin's ABI 13 reads) */
    ei_rank_precision rank_precision; /* EI_RANK_PRECISION_F32: the arithmetic of EI_RANK_SAMPLED's
                                         scores; EI_RANK_PRECISION_INT8: int8 q and k, exact
                                         int32 dot products (CONCEPTS: ranking; both backends) */
    ei_rank_rows rank_rows;      /* EI_RANK_ROWS_EVEN: which query rows EI_RANK_SAMPLED scores;
                                    EI_RANK_ROWS_SPREAD: farthest-point rows (CONCEPTS: ranking; both
                                    backends; other rankings ignore it, as they ignore rank_precision) */
} ei_config;

EIDEF ei_config ei_config_default(void);
/* The paper's configuration with the ranking and budgets that measured best
   on real models (docs/quality.md, "Block ranking beyond the paper"). */
EIDEF ei_config ei_config_quality(void);

/* ---------------------------------------------------------------- context */
typedef struct ei_context ei_context;

EIDEF ei_result ei_context_create(const ei_config *cfg, ei_context **out);
EIDEF void ei_context_destroy(ei_context *ctx);
/* The configuration the context runs: the one given, with simd the path
   chosen (never EI_SIMD_AUTO) and backend the one that runs (EI_BACKEND_CPU
   or EI_BACKEND_CUDA, never EI_BACKEND_CUDA_OR_CPU). */
EIDEF const ei_config *ei_context_config(const ei_context *ctx);
EIDEF int ei_cpu_supports(ei_simd path);                /* 1 if this CPU/OS/build can run it */
EIDEF const char *ei_simd_name(ei_simd path);
/* The vdpbf16ps FLOP rate over the f32 FMA FLOP rate of this core, measured
   once per process (0 without AVX512_BF16). EI_SIMD_AUTO runs bf16 attention
   with vdpbf16ps (the avx512-bf16 path) when it is at least 1.25, else
   widens bf16 to f32 (>>kernels says why). */
EIDEF double ei_cpu_dpbf16_ratio(void);

/* ---------------------------------------------------------------- execution */
/* How a call runs, the same for every operation (profile, attention, decode
   keep sets), in the manner of ggml's compute params:
     threads  nth 0 or 1: the call does the whole operation on n_threads
              threads, the calling thread and n_threads - 1 of the context's
              workers (THREADS; 0 or 1: the calling thread alone);
     parts    nth >= 2: the engine's own nth threads each make the call with
              ith = 0 .. nth - 1 and otherwise the same arguments (n_threads
              0 or 1), at once or in any order; each does part ith. An
              operation with a step that needs every part done has a second
              call made after the engine's barrier: ei_plan_finalize after
              ei_profile / ei_profile_chunk, ei_attention_decode_merge after
              ei_attention_decode; and a step that cannot be split
              (ei_decode_select, _shared_add, _select_shared) is done by part
              0 while the others return EI_OK. A part with nothing to do
              (part ith > 0 of those, a part of ei_profile or
              ei_profile_chunk whose kv-head share is empty, a part other
              than 0 on the CUDA backend) returns EI_OK at once, without
              looking at the other arguments: the part that works reports
              what is wrong with them.
   workspace: ONE buffer for the whole call, however it runs: every part
   passes the same one, and the library gives each thread its share. Its
   size is ei_layer_sizes' for the same thread count (shape.n_threads = the
   call's n_threads or nth); any alignment. On the CUDA backend it is device
   memory, the call is one launch sequence on cfg.cuda_stream (threads
   unused; in parts, part 0 makes it). A NULL ei_exec is one thread and no
   workspace (enough for calls that need none: ei_decode_observe does not
   take one). */
typedef struct ei_exec {
    int32_t n_threads;      /* threads of a whole call (0: 1; at most EI_MAX_THREADS) */
    int32_t ith, nth;       /* part ith of nth (nth 0 or 1: a whole call) */
    void *workspace;        /* ei_sizes.workspace bytes (or the operation's own entry) */
    size_t workspace_bytes;
} ei_exec;

/* Every buffer a layer's calls need, from one query: the layer's shape and
   the threads (or parts) its calls run on. */
typedef struct ei_shape {
    int64_t max_tokens;     /* the most tokens a call sees: prompt tokens planned, cache rows
                               attended or scored (a plan's capacity: ei_plan_init's max_tokens) */
    int32_t n_heads;        /* query heads */
    int32_t n_kv_heads;     /* kv heads (n_heads a multiple of it) */
    int32_t head_dim;
    uint32_t plan_flags;    /* EI_PLAN_* of the layer's plan */
    int32_t n_threads;      /* threads or parts of the calls (0: 1) */
} ei_shape;
typedef struct ei_sizes {
    size_t plan;            /* ei_plan_init's memory */
    size_t decoder;         /* ei_decoder_init's memory */
    size_t profile;         /* workspace of ei_profile and ei_profile_chunk */
    size_t prefill;         /* workspace of ei_attention_prefill */
    size_t decode;          /* workspace of ei_attention_decode and its merge (up to
                               EI_DECODE_MAX_TOKENS query tokens, with or without a keep set) */
    size_t decode_keep;     /* workspace of ei_decode_keep, _score, _select, _shared_add and
                               _select_shared over up to max_tokens cache rows
                               (profile 0: this context cannot plan, e.g. EI_RANK_ANTIDIAGONAL on the
                               CUDA backend; ei_profile says why. Thread counts up to EI_MAX_THREADS) */
    size_t workspace;       /* the largest of the four workspaces: one buffer serves every
                               call of the layer (calls one after another) */
} ei_sizes;
EIDEF ei_result ei_layer_sizes(const ei_context *ctx, const ei_shape *shape, ei_sizes *sizes);

/* ---------------------------------------------------------------- plans */
enum { EI_HEAD_DYNAMIC = 0, EI_HEAD_RIGID = 1 };
#define EI_PLAN_CHUNKED 1u   /* plan also holds the state of chunked planning */
#define EI_PLAN_SCORES  2u   /* plan also stores the observation scores */
#define EI_PLAN_KEEP_KEYS 4u /* with EI_PLAN_CHUNKED: the plan keeps the key blocks' min/max, so
                                each ei_profile_chunk reads only the keys that are new (after a
                                roll-back: all, once); without it (smaller plans) every call reads
                                all keys so far (LIMITS) */

/* A per-layer, per-sequence sparsity plan. Arrays are caller-visible and
   laid out as below, the same on CPU and GPU (ei__plan_geometry):
     entropy      f32[n_kv_heads][n_segments]
     head_class   u8 [n_kv_heads]                  EI_HEAD_RIGID / EI_HEAD_DYNAMIC
     budget       f32[n_kv_heads][n_segments]      tokens
     keep_blocks  i32[n_kv_heads][n_segments]      each head's own count (after caps)
     keep_count   i32[n_kv_heads][n_segments]      the count applied: keep_blocks, or
                                                  the max over heads (per_segment_budget)
     block_index  i32[n_kv_heads][n_segments][max_keep]  ranked, padded with -1
     scores       f32[n_kv_heads][n_segments][n_blocks]  softmaxed (EI_PLAN_SCORES only)
   Segment 0 keeps nothing. */
typedef struct ei_plan {
    int64_t n_tokens;      /* tokens planned so far (whole prompt: all) */
    int64_t max_tokens;    /* capacity */
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t n_segments;    /* ceil(n_tokens / segment_size) */
    int32_t n_blocks;      /* scored key blocks: (n_segments-1)*segment_size/block_size */
    int32_t max_keep;      /* row capacity of block_index */
    int32_t segment_size, block_size;
    int32_t final;         /* 1 once the whole prompt is planned */
    uint32_t flags;
    float *entropy;
    uint8_t *head_class;
    float *budget;
    int32_t *keep_blocks;
    int32_t *keep_count;
    int32_t *block_index;
    float *scores;
    void *state;           /* chunked planning state (library-private) */
    void *owned_memory;    /* set by ei_plan_init with memory NULL (the context's allocator) */
    int32_t on_device;     /* 1: arrays live in GPU memory (CUDA backend) */
    int32_t seg_capacity;  /* segments the arrays can hold */
    int32_t blk_capacity;  /* blocks a scores row can hold */
    uint64_t seal;         /* library-private: checksum of the layout fields above, set by
                              ei_plan_init; a plan whose layout was edited is refused */
} ei_plan;

/* Index of row (kv head, segment) in the [kv][segment] arrays (row stride
   seg_capacity), and the ranked block list of that row (max_keep entries,
   the first keep_count[EI_PLAN_ROW(...)] meaningful). */
#define EI_PLAN_ROW(plan, kv_head, segment) ((size_t)(kv_head) * (size_t)(plan)->seg_capacity + (size_t)(segment))
#define EI_PLAN_BLOCKS(plan, kv_head, segment) \
    ((plan)->block_index + EI_PLAN_ROW(plan, kv_head, segment) * (size_t)(plan)->max_keep)

/* Lay a plan of up to max_tokens tokens (flags: EI_PLAN_*) out in caller
   memory: at least ei_sizes.plan bytes (ei_layer_sizes with shape.max_tokens
   = max_tokens and shape.plan_flags = flags), any alignment; device memory
   on the CUDA backend. memory NULL with bytes 0: the context's allocator
   owns it (setup time, not per layer; a GPU context allocates on the
   device), freed by ei_plan_free. memory NULL with bytes > 0 is
   EI_ERR_NULL (a failed allocation of the caller's). */
EIDEF ei_result ei_plan_init(const ei_context *ctx, ei_plan *plan, int64_t max_tokens,
                             int32_t n_kv_heads, int32_t head_dim, uint32_t flags,
                             void *memory, size_t bytes);
/* Frees what ei_plan_init allocated (memory NULL) and zeroes the plan; a
   zeroed plan or one in caller memory is zeroed, nothing freed; a plan
   ei_plan_init did not make (or edited) is left as it is, nothing freed,
   the reason in ei_last_error. */
EIDEF void ei_plan_free(const ei_context *ctx, ei_plan *plan);
/* A plan that grows with the prompt: a plan of ei_plan_init with memory NULL
   (the library's memory; CPU backend) moves into memory laid out for max_tokens, its rows,
   counts and chunked state kept, so that an engine allocates plans for the
   prompt so far (a micro-batch or two) instead of the whole context, and
   grows them before the chunk that passes plan.max_tokens (plans equal
   those of a plan allocated for the whole prompt, bit for bit: test_core).
   Never shrinks (max_tokens <= plan.max_tokens: EI_OK, nothing done). Grow
   the profiling workspace too (ei_layer_sizes at the new max_tokens). Not
   between the parts of one ei_profile_chunk call.
   On a refusal (no memory, a plan of caller memory, a GPU plan) the plan is
   as it was. */
EIDEF ei_result ei_plan_grow(const ei_context *ctx, ei_plan *plan, int64_t max_tokens);
/* Start a new sequence in an existing plan (chunked planning). */
EIDEF ei_result ei_plan_reset(ei_plan *plan);
/* After every part of an ei_profile / ei_profile_chunk call made in parts
   has returned (the engine's barrier): fills keep_count with the max over
   heads when per_segment_budget = 1 (a no-op otherwise, and after a call
   made on threads, which does it itself). */
EIDEF ei_result ei_plan_finalize(const ei_context *ctx, ei_plan *plan);

/* ---------------------------------------------------------------- profiling */
/* Whole-prompt planning (equals the reference): q [n][heads][dim],
   k [n][kv_heads][dim] post-RoPE, same n. Fills every kv head of the plan.
   Workspace: ei_sizes.profile (shape.max_tokens >= n). Threads split the kv
   heads; with fewer kv heads than threads each kv head's segments are split
   over its threads instead (at most max(kv heads, segments) threads work).
   Parts split the kv heads (part ith: kv heads [kv ith / nth,
   kv (ith + 1) / nth)), then ei_plan_finalize; only the part holding kv
   head 0 writes the plan's shared fields (n_tokens, n_segments, ...). The
   same plan however it runs, bit for bit. */
EIDEF ei_result ei_profile(const ei_context *ctx, const ei_exec *x, const ei_tensor *q, const ei_tensor *k,
                           ei_plan *plan);

/* Chunked planning (plan made with EI_PLAN_CHUNKED), for engines that
   prefill in micro-batches. q holds the queries of positions [q_pos, q_pos +
   q->n_tokens) (any start, any count); k is the cache: cell j holds the key
   of position j for j < q_pos + q->n_tokens, and cells past those (padding,
   later tokens) are ignored. Where the chunk starts:
     q_pos == plan->n_tokens  continues the sequence, also after a final call
                              (the next turn of a chat);
     q_pos <  plan->n_tokens  rolls the plan back to q_pos first (0: a new
                              sequence; a prompt cache kept up to q_pos);
     q_pos >  plan->n_tokens  skips positions whose queries the engine did not
                              give (e.g. decoded with its own attention).
   is_final = 1 marks the end of a prompt: the last segment's cap and the
   last-segment-dense rule apply to it, and segment 0's entropy is set; a
   final call with q = NULL (q_pos = plan->n_tokens) finalises a plan whose
   last chunk was not marked. Exactness: a segment split across chunks is
   planned from the min/max of its queries so far and gets its whole-prompt
   row once all its queries are in; entropies of segments >= 1 then equal
   whole-prompt ones. A head is rigid while all its entropies so far are
   below e_t; once one is not it follows the recurrence tracked from the
   start, so plans equal whole-prompt ones except for a head that turns
   dynamic late (its earlier segments kept the base budget). After a roll-back
   into a segment, or skipped positions, that segment is planned from the
   queries given after the cut only, and after a skip the recurrence starts
   again as at segment 1. Workspace: ei_sizes.profile with the
   plan's max_tokens. Up to EI_MAX_CHUNK_GROUP query heads per kv head.
   Threads split the kv heads; with fewer kv heads than threads (one, in
   Gemma 3 270M) each segment's query min/max is split over the threads by
   query head and its block scores by block range instead (the key min/max,
   the softmax, the budget and the ranking of a segment stay on the calling
   thread). Parts split the kv heads only (part ith: kv heads
   [kv ith / nth, kv (ith + 1) / nth), none when that is empty), then
   ei_plan_finalize. The same plan however it runs, bit for bit. CUDA
   backend: every kv head in one call (part 0), either ranking, PROTOCOLS
   says the rest. A
   chunked plan's state does not travel with ei_plan_copy: continue a copied
   plan with a roll-back to 0. */
EIDEF ei_result ei_profile_chunk(const ei_context *ctx, const ei_exec *x, const ei_tensor *q, const ei_tensor *k,
                                 ei_plan *plan, int64_t q_pos, int is_final);
/* What the library needs of an engine's cache order: cell j holds the key of
   position j for every j < n_keys (a cache filled in order for one sequence).
   EI_OK if cell_pos[j] == j for all of them; otherwise EI_ERR_SHAPE naming
   the first cell that breaks it (keep that layer on the engine's attention). */
EIDEF ei_result ei_check_key_positions(const ei_context *ctx, const int32_t *cell_pos, int64_t n_keys);

/* 1 if query segment `segment` of the plan attends sparsely (starts at or
   after threshold_len, and is not the last segment when last_segment_dense);
   0 for a plan it refuses (MEMORY RULES; the reason in ei_last_error). */
EIDEF int ei_plan_segment_is_sparse(const ei_context *ctx, const ei_plan *plan, int32_t segment);

/* ---------------------------------------------------------------- attention */
/* Block-sparse prefill attention executing a plan (plan NULL: dense causal).
   q holds tokens [q_offset, q_offset + q->n_tokens) (q_offset = 0 for the
   whole prompt; chunked callers pass the chunk's first position); k and v hold
   keys 0 .. q_offset + q->n_tokens - 1. out has q's shape (f32, f16 or bf16).
   Threads or parts split the work items (query tiles of a head); workspace
   ei_sizes.prefill.
   CUDA backend: one launch does the layer. For head_dim 64 and 256 a call
   whose work fills less than half the GPU (an engine's micro-batch of few
   heads: 512 queries x 4 heads is 32 CTAs) splits each work item's keys
   over several CTAs and merges their rows (split-K, as FlashDecoding) in
   the workspace: ei_sizes.prefill reports room for it (about 17 MB on an
   H200; one workspace serves every layer of a stream, calls in stream
   order). A smaller workspace (or none, without cuda_deferred_errors)
   splits less or not at all; outputs agree within float32 summation order.
   EI_CUDA_ATTN_SPLIT=N caps the splits (1: off). */
EIDEF ei_result ei_attention_prefill(const ei_context *ctx, const ei_exec *x, const ei_tensor *q,
                                     const ei_tensor *k, const ei_tensor *v, const ei_plan *plan,
                                     ei_out_tensor *out, int64_t q_offset);

/* The plan as an additive attention mask, for engines that keep their own
   attention kernel and give it a mask (llama.cpp's ggml_flash_attn_ext, with
   its sparse-mask hint ggml_flash_attn_ext_set_n_kv_max; PyTorch's SDPA
   attn_mask): element [i][h][j] of out is base's (0 without a base) where
   the query at position t = q_offset + i may see key j under the plan, and
   -inf elsewhere, so that attention with this mask equals
   ei_attention_prefill with the plan (within summation order). Query t of
   segment s = t / segment_size sees keys j <= t: all of them where the
   segment is dense (plan NULL, or ei_plan_segment_is_sparse 0), else the
   segment's own keys (j >= s x segment_size) and the blocks the plan keeps
   for it (j / block_size among its first keep_count block_index entries).
   Key j is position j, as in ei_attention_prefill. Mask heads: out.n_heads
   n_kv_heads (head h: kv head h), a multiple of it (head h: kv head
   h / (n_heads / n_kv_heads), one mask per query head), or 1 (the union over
   kv heads: exact with one kv head, more keys than the plan's otherwise).
   base: NULL, or a mask of out's rows and keys with 1 or out.n_heads heads
   (the engine's causal/padding mask: its -inf entries stay -inf); it may
   not overlap out. Views count elements; keys are contiguous. The plan must
   cover the rows (plan->n_tokens >= q_offset + n_rows). CUDA backend: base,
   out and the plan in device memory, one launch on cfg.cuda_stream, nothing
   read back (a device plan's counts are clamped and block numbers outside
   0 .. s x segment_size / block_size - 1 skipped, as attention does). */
typedef struct ei_mask {
    void *data;          /* out: written; base: only read */
    ei_dtype dtype;      /* EI_F32, EI_F16 or EI_BF16 */
    int32_t n_heads;
    int64_t n_rows;      /* query rows: positions q_offset .. q_offset + n_rows - 1 */
    int64_t n_keys;      /* keys 0 .. n_keys - 1 (at most EI_MAX_TOKENS) */
    int64_t row_stride;  /* elements between rows */
    int64_t head_stride; /* elements between heads */
} ei_mask;
EIDEF ei_result ei_plan_mask(const ei_context *ctx, const ei_plan *plan, int64_t q_offset, const ei_mask *base,
                             ei_mask *out);

/* Decode attention: a step of 1..EI_DECODE_MAX_TOKENS query tokens (the
   tokens of q line up with the cache ROWS q_offset ..; k and v hold rows
   0 .. q_offset + n_tokens - 1: q_offset is the row of the step's first
   key, which is its position until a compaction (ei_kv_compact) leaves
   fewer rows than positions; RoPE uses positions, attention rows), dense
   causal, the same result as ei_attention_prefill with plan NULL (within
   float32 summation order), split along the keys so that every thread
   works however few kv heads the layer has: each thread or part attends to
   its slice of the keys for every head and writes a partial row (output,
   running max and sum) into the workspace, then the partials are merged
   into out. On threads ei_attention_decode does both; in parts, the merge
   is ei_attention_decode_merge, made by every part after the engine's
   barrier with the same ei_exec (each writes its share of out's rows;
   after a call on threads it does nothing). Workspace: ei_sizes.decode.
   NaN/Inf in q or in a key gets EI_ERR_NONFINITE.
   keep: NULL attends to the whole cache. A keep set attends through it
   instead, for engines that mask evicted rows rather than compacting them
   (ei_kv_compact): each query head attends to its set's kept rows
   (keep->index: one row per kv head, per query head, or one shared set),
   then to every row appended since the set was made (keep->n_tokens ..
   q_offset + t, causal). The set must have been made at or before the
   step's first query (keep->n_tokens <= q_offset + 1); the result equals
   dense attention over the compacted cache. CPU backend only.
   CUDA backend: one launch (part 0), the merge does nothing. */
#define EI_DECODE_MAX_TOKENS 16
typedef struct ei_keep_set ei_keep_set;
EIDEF ei_result ei_attention_decode(const ei_context *ctx, const ei_exec *x, const ei_tensor *q,
                                    const ei_tensor *k, const ei_tensor *v, const ei_keep_set *keep,
                                    ei_out_tensor *out, int64_t q_offset);
EIDEF ei_result ei_attention_decode_merge(const ei_context *ctx, const ei_exec *x, ei_out_tensor *out);

/* ---------------------------------------------------------------- decode */
/* Per-layer, per-sequence observation state. */
typedef struct ei_decoder {
    int32_t n_heads, n_kv_heads, head_dim, window;
    int64_t n_observed;     /* queries observed in total */
    int64_t position_end;   /* the newest observed query's position + 1 (ei_decode_observe's q_pos + rows):
                               without a row map a scored cache holds at most this many rows */
    int64_t n_generated;    /* of which generated */
    int64_t last_compress;  /* n_generated at the last compression (-1: none) */
    float *queries;         /* ring of the last `window` queries, f32 [window][n_heads][head_dim] */
    float *accumulated;     /* EI_DECODE_H2O: f32 [n_heads][n_positions], the attention each position
                               received from the queries summed so far (else NULL) */
    int64_t n_positions;    /* its row length (cfg.decode_positions; 0 without it) */
    int64_t n_accumulated;  /* queries summed into it (the newest ones after them are not yet) */
    int64_t accumulated_end; /* positions below it hold sums; newer ones count from 0 */
    uint64_t seal;          /* library-private: checksum of the layout fields, set by
                               ei_decoder_init; an edited decoder is refused */
} ei_decoder;

/* Lay a decoder out in caller memory of ei_sizes.decoder bytes (device
   memory on the CUDA backend). */
EIDEF ei_result ei_decoder_init(const ei_context *ctx, ei_decoder *dec, int32_t n_heads,
                                int32_t n_kv_heads, int32_t head_dim, void *memory, size_t bytes);
EIDEF ei_result ei_decoder_reset(ei_decoder *dec);
/* Feed queries: the prompt's (all or its last ones; generated = 0), then each
   generated token's (generated = 1). The decoder keeps the last `window`.
   q_pos: the position of q's first row. Calls follow each other (the next
   q_pos is the last one's end; ei_decoder_reset starts over, e.g. after a
   rewind), except that the first may start anywhere (the prompt's last
   queries) and a prompt call (generated = 0) of at least `window` queries
   may skip ahead (its queries replace the whole ring: an engine may feed
   only each micro-batch's last window); anything else is EI_ERR_STATE. The newest query's position + 1 is
   dec->position_end: a cache scored without a row map holds at most that
   many rows (PROTOCOLS: decode over a padded cache). */
EIDEF ei_result ei_decode_observe(const ei_context *ctx, ei_decoder *dec, const ei_tensor *q, int64_t q_pos,
                                  int generated);
/* 1 when the engine should ask for a keep-set now (decode_gap generated
   tokens observed since the prompt, or recompress_every since the last); 0
   for a decoder it refuses (MEMORY RULES; the reason in ei_last_error). */
EIDEF int ei_decode_due(const ei_context *ctx, const ei_decoder *dec);

/* The rows each head keeps. A cache is n_tokens ROWS; each row holds one
   POSITION of the sequence (row_pos; by default row j holds position j) or
   none (-1: an empty cell, another sequence's: never scored, never kept).
   Candidates: the rows holding positions, minus the window (the rows of
   the newest W positions, W = the queries the decoder holds, always kept). */
struct ei_keep_set {
    int32_t heads_out;      /* in: n_kv_heads (per_kv_head), n_heads, or 1 (a shared set) */
    int32_t capacity;       /* in: row length of index/positions (>= min(rows holding positions, decode_budget)) */
    int32_t n_kept;         /* out: rows kept per head */
    int32_t compressed;     /* out: 0 when fewer than the budget's rows hold positions (every one kept) */
    int64_t n_tokens;       /* out: rows of the cache scored */
    int32_t *index;         /* out [heads_out][capacity]: the kept ROWS, ascending, window included */
    uint8_t *mask;          /* optional out [heads_out][mask_capacity]: mask[h][row] = 1 if kept */
    int64_t mask_capacity;
    float *pooled;          /* optional out [heads_out][pooled_capacity]: the pooled score of every
                               candidate, oldest position first (row_pos NULL: of positions
                               0..n_tokens-W-1, W the tail), the value that was ranked (CONCEPTS:
                               decode policy, for each policy's) */
    int64_t pooled_capacity;
    const int32_t *row_pos; /* optional in [n_tokens] (per kv head: + kvh * row_pos_stride): the
                               position row j holds, -1 = none. NULL: row j holds position j */
    int64_t row_pos_stride; /* 0: one map for every kv head */
    int32_t *positions;     /* optional out [heads_out][capacity]: the position held by row
                               index[h][i]; after ei_kv_compact row i holds positions[h][i]
                               (the next call's row_pos) */
};

/* Score the cache k [n_tokens rows][n_kv_heads][dim] against the window and
   fill keep (ei_decode_score, then ei_decode_select). The window's W
   queries line up with the keys of the newest W positions; each query
   attends the rows holding positions up to its own. Threads split the
   query heads of the scoring; on parts it is refused (EI_ERR_CONFIG: make
   the two calls, with the barrier between them). Workspace:
   ei_sizes.decode_keep (shape.max_tokens >= the cache's rows). */
EIDEF ei_result ei_decode_keep(const ei_context *ctx, const ei_exec *x, ei_decoder *dec, const ei_tensor *k,
                               ei_keep_set *keep);
/* The parts, for shared keep sets and for an engine's own threads:
   ei_decode_score: fills scores [n_heads][k->n_tokens]: scores[h][row] =
     the mean over the window's queries of query head h of their softmax
     weight on that row (0 for rows holding no position); row_pos /
     row_pos_stride as in ei_keep_set. Threads or parts split the query
     heads (part ith: heads [n_heads ith / nth, n_heads (ith + 1) / nth)).
   ei_decode_select: from one layer's scores, the keep set of each head
     (query heads reduced per kv head by gqa_reduce when per_kv_head; pooled
     over candidates in position order; the top b - W kept, b the decode
     budget; other policies: CONCEPTS, decode policy).
   Shared keep set (one set of rows for every head and every layer of a
     sequence, as llama.cpp's KV cells are shared): zero shared [n_tokens],
     ei_decode_shared_add each layer's scores (all its query heads reduced by
     gqa_reduce, pooled, then divided by their sum over the candidates: each
     layer weighs 1, whatever mass it leaves on its window; layers added, or
     with gqa_reduce max their maximum kept), then
     ei_decode_select_shared (keep->heads_out = 1; keep->row_pos the map).
     shared_add marks the decoder as compressed (ei_decode_due).
   select, shared_add and select_shared run on one thread (in parts: part
   0's call; the others return EI_OK). Workspace: ei_sizes.decode_keep. */
EIDEF ei_result ei_decode_score(const ei_context *ctx, const ei_exec *x, const ei_decoder *dec, const ei_tensor *k,
                                const int32_t *row_pos, int64_t row_pos_stride, float *scores);
EIDEF ei_result ei_decode_select(const ei_context *ctx, const ei_exec *x, ei_decoder *dec, const float *scores,
                                 int64_t n_rows, ei_keep_set *keep);
EIDEF ei_result ei_decode_shared_add(const ei_context *ctx, const ei_exec *x, ei_decoder *dec, const float *scores,
                                     int64_t n_rows, const int32_t *row_pos, float *shared);
EIDEF ei_result ei_decode_select_shared(const ei_context *ctx, const ei_exec *x, const ei_decoder *dec,
                                        const float *shared, int64_t n_rows, ei_keep_set *keep);
/* In-place compaction of a contiguous-per-head cache with keep->heads_out
   heads (or any number of heads for a shared set, heads_out 1): row i of
   head h becomes row keep->index[h][i]. Afterwards the cache holds
   keep->n_kept rows per head; row i holds position keep->positions[h][i]. */
EIDEF ei_result ei_kv_compact(const ei_context *ctx, const ei_keep_set *keep, ei_out_tensor *k, ei_out_tensor *v);


/* ---------------------------------------------------------------- GPU memory */
/* With the CUDA backend every tensor, plan array, decoder ring, keep set and
   workspace is device memory; these helpers let engines without CUDA headers
   (and the tests) manage it. On the CPU backend they return EI_ERR_UNSUPPORTED.
   Attention on the GPU (prefill and decode) takes k and v both bf16 or both
   f16, head_dim 64/128/256, and q of k's dtype or f32 (llama.cpp's f32 Q over
   an f16 cache): an f32 q is rounded to k's 16-bit type (round to nearest
   even) as each Q tile is loaded, without a copy of Q, since the tensor cores
   take 16-bit operands; the CPU keeps q in f32. The logits then differ from
   the CPU's by at most u * scale * sum |q_i k_i|, u the unit roundoff (2^-8
   for bf16's 8 significant bits, 2^-11 for f16's 11; about u/sqrt(3) rms per
   element, ~2^-9 for bf16): outputs agree within the 16-bit
   kernels' usual tolerance (tests/test_cuda.c), and equal bit for bit the GPU's
   result for q rounded to k's type beforehand. An f32 q element that rounds to
   Inf (f16: |x| >= 65520) is refused like NaN/Inf (EI_ERR_NONFINITE); other
   mixes (q f16 with k bf16, k and v of different dtypes, f32 k/v) get
   EI_ERR_DTYPE. Profiling takes any dtypes: the reference ranking reads q in
   f32 either way (plans equal the CPU's); the sampled ranking (EI_RANK_SAMPLED)
   rounds an f32 q to k's type on the tensor cores as attention does (an f32 q
   element that rounds to Inf there: EI_ERR_NONFINITE), and runs on CUDA cores
   in f32 for f32 k or head_dim other than 64/128/256; with
   EI_RANK_PRECISION_INT8 every key is rounded once per call into the
   workspace (ei_sizes.profile counts it: n_tokens x n_kv_heads x
   (2 x head_dim rounded up to 64, 128 or 256, + 4) bytes) and the rows run
   on the tensor cores for any dtype up to head_dim 256 (f32 CUDA cores
   above). Chunked planning (ei_profile_chunk) runs on the GPU with either
   ranking, every kv head in one call (PROTOCOLS). EI_RANK_ANTIDIAGONAL has
   no GPU kernels yet: every profiling call of a CUDA context refuses it
   (EI_ERR_UNSUPPORTED).
   Finding the plugin (EI_BACKEND_CUDA*): cfg.cuda_library, else the path in
   $EI_CUDA_LIBRARY, else libentropyinfer_cuda.so through the dynamic loader's
   search path (LD_LIBRARY_PATH, the program's RUNPATH, ld.so.cache, system
   folders: `make install PREFIX=...` puts it in PREFIX/lib), then (glibc)
   beside the program or shared library that compiled the implementation, and
   in that folder's ../lib. Never the working directory. */
enum { EI_COPY_DEVICE_TO_HOST = 0, EI_COPY_HOST_TO_DEVICE = 1, EI_COPY_DEVICE_TO_DEVICE = 2 };
EIDEF ei_result ei_device_alloc(const ei_context *ctx, void **ptr, size_t bytes);
EIDEF void ei_device_free(const ei_context *ctx, void *ptr);
/* Synchronous copy on the context's stream; kind: EI_COPY_*. */
EIDEF ei_result ei_device_copy(const ei_context *ctx, void *dst, const void *src, size_t bytes, int kind);
/* Copy a plan's arrays and fields between host and device (synchronous);
   dst: same kv heads, segment and block size, capacity >= src contents. */
EIDEF ei_result ei_plan_copy(const ei_context *ctx, ei_plan *dst, const ei_plan *src, int direction);

/* CUDA graphs (cfg.cuda_deferred_errors = 1). By default a GPU call that must
   look at device data to return its code (NaN/Inf in q or k, score overflow,
   a bad keep index, a bad row map) waits for cfg.cuda_stream and reads a flag
   back. With cuda_deferred_errors the per-layer calls ei_profile,
   ei_profile_chunk, the attention calls (prefill and decode),
   ei_decode_observe, ei_decode_keep, ei_decode_score,
   ei_decode_select, ei_decode_shared_add, ei_decode_select_shared and
   ei_kv_compact never wait, read back or allocate: they only queue kernels
   (row maps are sorted by CUB in the decode workspace) and async memsets
   (and, for a chunk, a device-to-device copy) on cfg.cuda_stream, so an
   engine can capture a layer's calls in a CUDA graph (cudaStreamBeginCapture
   .. EndCapture) and replay it. Host-side checks (views, shapes, plan layout,
   protocol, workspace size) still fail at call time; a data error is recorded
   on the device instead, and the call's outputs are then unspecified
   (attention and compaction write nothing, a decoder has counted the queries
   it did not store). In this mode the attention workspace holds the call's
   scan reports (512 bytes, so that a graph replays its own; plus split-K's
   partial rows for head_dim 64/256, below): pass ei_sizes.prefill
   bytes. After synchronising, the engine calls ei_cuda_status: the first data
   error recorded since the last call, with the code and message the waiting
   call would have returned (ei_last_error), then cleared; EI_OK if none. The
   record is one per process and device: contexts in the mode on one device
   share it. Keep sets: the host fields n_kept, compressed and n_tokens are
   set at call time. Without a row map (keep->row_pos NULL) the cache holds
   n_tokens positions and they are exact. With a row map the positions it
   holds (np) are known only on the device, so the call assumes
   np >= decode_budget: n_kept = decode_budget and compressed = 1 (the counts
   of every call that compresses), and the device checks it: a cache holding
   fewer positions is reported by ei_cuda_status (EI_ERR_UNSUPPORTED, naming
   the count; the waiting call would have kept every position); with
   n_tokens < decode_budget and a row map keep, select and select_shared
   refuse at call time (EI_ERR_UNSUPPORTED). Call without the mode for such
   caches (a graph of the first keep of a short sequence is rarely worth it).
   For the same reason (the sequence's length is on the device only), with
   a row map keep, select and select_shared refuse decode_budget_ratio > 0
   (the budget follows that length) and keep, select and shared_add refuse
   EI_DECODE_H2O (its sums end at it), at call time (EI_ERR_UNSUPPORTED).
   Row-map faults (a value < -1, two rows of one position, fewer positions
   than the window, a window not consecutive), NaN/Inf in k, overflowing
   scores, non-finite shared scores and capacities that depend on np are
   reported with the waiting call's code and message; after one, the keep
   set, scores and shared array are left unwritten by the kernels after the
   check (their contents are unspecified, as the host fields). On the
   CPU, or without the mode, ei_cuda_status returns EI_OK. */
EIDEF ei_result ei_cuda_status(const ei_context *ctx);

/* ---------------------------------------------------------------- CUDA plugin ABI */
/* The function table that libentropyinfer_cuda.so exports; visible to the
   implementation and to the plugin (which defines EI_CUDA_ABI_DECLS). */
#if defined(EI_CUDA_ABI_DECLS) || defined(ENTROPYINFER_IMPLEMENTATION)
#ifndef EI__CUDA_ABI_INCLUDED
#define EI__CUDA_ABI_INCLUDED

/* Bump on any change of ei_cuda_api or of the meaning of its functions (ei_config is passed by
   pointer: a new field is a change; 14: rank_precision; 15: rank_rows; 16: the GPU picks
   EI_RANK_ROWS_SPREAD's rows; 17: the GPU scores EI_RANK_PRECISION_INT8). */
#define EI_CUDA_ABI_VERSION 17
#define EI_CUDA_ENTRY_POINT "ei_cuda_get_api"
/* The plugin's file name, looked up when neither cfg.cuda_library nor
   $EI_CUDA_LIBRARY names a path (a build may define another name). */
#ifndef EI_CUDA_LIBRARY_NAME
#define EI_CUDA_LIBRARY_NAME "libentropyinfer_cuda.so"
#endif
#define EI_CUDA_MSG_SIZE 256

/* The header validates every argument of a public call (views, shapes, GQA,
   plan layout and capacities, protocol state, budgets) before it calls an
   entry here, so both backends accept and refuse the same calls with the same
   codes. An entry checks only what the device adds: dtypes and head sizes its
   kernels support, alignment, grid limits, and the contents of device memory
   the host cannot read (NaN/Inf in Q/K, keep-set indices); on failure it
   returns the code and writes a NUL-terminated message of at most
   EI_CUDA_MSG_SIZE bytes into msg. Tensor, plan-array, keep-set, decoder-ring
   and workspace pointers are device pointers; the structs holding them live
   on the host. Work is queued on cfg->cuda_stream (NULL: the default stream)
   and is asynchronous, except where an entry must read a device flag back
   (profile, profile_chunk, attention (NaN/Inf in the Q and K rows it reads), decode_observe,
   kv_compact, the decode entries that read a row map or check scores) and
   the explicit copies. With cfg->cuda_deferred_errors (ABI 6) profile, profile_chunk,
   attention, decode_observe and kv_compact read nothing back: each queues a
   one-thread kernel that records its report on the device (the first since
   deferred_status cleared it), and returns EI_OK unless a host-side check
   fails. ABI 8: so do decode_keep, decode_score, decode_select,
   decode_shared_add and decode_select_shared; with a row map the keep-set
   entries set n_kept = decode_budget, compressed = 1 and check
   np >= decode_budget on the device (n_tokens < decode_budget:
   EI_ERR_UNSUPPORTED at call time). ABI 10: ei_config has the decode
   policy fields (decode_policy .. decode_shared_weight) and ei_decoder the
   H2O sums (accumulated .. accumulated_end): the decode entries follow
   ei__decode_scored, ei__decode_tail and ei__decode_budget; a decoder's
   memory is laid out by the header (ring, then the sums). ABI 13:
   ei_config has decode_recent (ei__decode_recent). */
typedef struct ei_cuda_api {
    int32_t abi_version;   /* EI_CUDA_ABI_VERSION of the plugin's build */
    int32_t struct_size;   /* sizeof(ei_cuda_api) of the plugin's build */
    const char *(*build_info)(void);
    /* EI_OK and a device description in msg if a usable device exists. */
    ei_result (*device_check)(char *msg);

    /* device memory */
    ei_result (*mem_alloc)(void **ptr, size_t bytes, char *msg);
    void (*mem_free)(void *ptr);
    /* kind: EI_COPY_*; waits for the stream */
    ei_result (*mem_copy)(void *dst, const void *src, size_t bytes, int kind, void *stream, char *msg);
    ei_result (*mem_set)(void *dst, int byte, size_t bytes, void *stream, char *msg);
    ei_result (*synchronize)(void *stream, char *msg);

    /* copy a plan's arrays (layout of ei__plan_geometry) between host and
       device; direction EI_COPY_*; the header checked that dst can hold src */
    ei_result (*plan_copy)(const ei_config *cfg, ei_plan *dst, const ei_plan *src, int direction, char *msg);

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

    /* the decoder ring (f32 [window][n_heads][head_dim], query number i in
       slot i % window) is laid out and cleared by the header; observe scans
       the queries it keeps for NaN/Inf before it changes anything */
    ei_result (*decode_observe)(const ei_config *cfg, ei_decoder *dec, const ei_tensor *q,
                                int generated, char *msg);
    ei_result (*decode_workspace_size)(const ei_config *cfg, int64_t n_tokens, int32_t n_heads,
                                       int32_t n_kv_heads, size_t *bytes, char *msg);
    /* scores the queries of ei__decode_scored(cfg, dec) (the last
       ei__decode_window(cfg, dec) observed by default; ABI 10: the decode
       policy's, keeping ei__decode_tail positions and ei__decode_budget) */
    ei_result (*decode_keep)(const ei_config *cfg, ei_decoder *dec, const ei_tensor *k,
                             ei_keep_set *keep, void *workspace, size_t workspace_bytes, char *msg);
    /* checks the keep-set's indices (ascending, inside the cache) on the
       device before moving anything; a shared set (heads_out 1) moves every
       head of the caches */
    ei_result (*kv_compact)(const ei_config *cfg, const ei_keep_set *keep, ei_out_tensor *k,
                            ei_out_tensor *v, char *msg);

    /* ABI 4: the parts of decode_keep (ei_decode_score / _select /
       _shared_add / _select_shared). The row maps (row_pos, keep->row_pos)
       are device arrays the plugin validates (the CPU's codes: EI_ERR_SHAPE
       for a bad map); decode_keep honours keep->row_pos and fills
       keep->positions. decode_score fills query heads [h0, h1) of scores
       (the header splits ith/nth). */
    ei_result (*decode_score)(const ei_config *cfg, const ei_decoder *dec, const ei_tensor *k,
                              const int32_t *row_pos, int64_t row_pos_stride, float *scores, int32_t h0,
                              int32_t h1, void *workspace, size_t workspace_bytes, char *msg);
    ei_result (*decode_select)(const ei_config *cfg, ei_decoder *dec, const float *scores, int64_t n_rows,
                               ei_keep_set *keep, void *workspace, size_t workspace_bytes, char *msg);
    ei_result (*decode_shared_add)(const ei_config *cfg, ei_decoder *dec, const float *scores, int64_t n_rows,
                                   const int32_t *row_pos, float *shared, void *workspace,
                                   size_t workspace_bytes, char *msg);
    ei_result (*decode_select_shared)(const ei_config *cfg, const ei_decoder *dec, const float *shared,
                                      int64_t n_rows, ei_keep_set *keep, void *workspace,
                                      size_t workspace_bytes, char *msg);
    /* ABI 6: the first report recorded under cfg->cuda_deferred_errors since
       the last call, as the code and message of the synchronous call (EI_OK:
       none), then cleared; waits for the stream */
    ei_result (*deferred_status)(void *stream, char *msg);

    /* ABI 7: chunked planning (ei_profile_chunk) of every kv head of a plan
       made with EI_PLAN_CHUNKED, through the profile stages. The header
       checked the protocol from the plan's host fields: every head's chunk
       ends at plan->n_tokens (whole-range calls only), plan->final says
       whether the last call was final. The per-head state (ei__head_state,
       the recurrence rows, the open segment's query min/max) lives in the
       plan's state region on the device, with the key-block min/max store
       only for EI_PLAN_KEEP_KEYS (ABI 9; otherwise every chunk builds them
       again in the workspace); the
       open-mass row holds the open segment's raw block scores, or (ABI 8,
       EI_RANK_SAMPLED) its sampled block mass once a sampled row of it is
       in (open_rows counts them; a continued segment adds the chunk's rows
       to it, as the CPU does). q NULL: the final call without queries.
       Asynchronous like profile: one flag read back, or recorded with
       cuda_deferred_errors; a query-group change is found there
       (EI_ERR_SHAPE). */
    ei_result (*profile_chunk)(const ei_config *cfg, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                               int64_t q_pos, int is_final, void *workspace, size_t workspace_bytes, char *msg);
    /* ABI 12: ei_plan_mask (plan NULL: dense causal); the header checked the
       views, the plan's layout and that it covers the rows; device plan rows
       are clamped as attention clamps them. One launch, nothing read back. */
    ei_result (*plan_mask)(const ei_config *cfg, const ei_plan *plan, int64_t q_offset, const ei_mask *base,
                           ei_mask *out, char *msg);
} ei_cuda_api;

/* The plugin's only export: returns its table whatever version is asked
   for; the header compares abi_version and struct_size and names both. */
typedef const ei_cuda_api *(*ei_cuda_get_api_fn)(int abi_version);

/* ---------------------------------------------------------------- the method's rules, once
   Plan layout, caps, sparsity of a segment, the rigid test and the budget
   recurrence, as inline functions that compile for the host and (under
   nvcc) the device: the CPU implementation, the CUDA plugin and the tests
   all call these; nothing re-derives them. */
#include <math.h>
#ifdef __CUDACC__
#define EI__HD static inline __host__ __device__
#else
#define EI__HD static inline
#endif
#define EI__PLAN_ALIGN 64

EI__HD int64_t ei__ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
EI__HD int64_t ei__round_up(int64_t a, int64_t m) { return ei__ceil_div(a, m) * m; }
EI__HD size_t ei__align_size(size_t x) { return (x + EI__PLAN_ALIGN - 1) & ~(size_t)(EI__PLAN_ALIGN - 1); }

/* Per-kv-head state of chunked planning (CPU plans with EI_PLAN_CHUNKED). */
typedef struct ei__head_state {
    int64_t tokens_done;   /* the chunk end so far: positions [0, tokens_done) are planned or skipped */
    int64_t blocks_done;   /* EI_PLAN_KEEP_KEYS: key blocks whose min/max the plan holds */
    int32_t group;         /* query heads per kv head of the stored query representation (0: none) */
    int32_t open_valid;    /* the open segment's query representation is stored */
    int32_t last_final;    /* the open segment's row was planned with the final call's cap */
    int32_t open_rows;     /* EI_RANK_SAMPLED: sampled rows summed into the open segment's mass (both backends) */
} ei__head_state;
/* The budget recurrence after segment s of one kv head: planning segment s+1
   is a function of this row alone, so any segment can be planned again
   (a chunk that continues it, a roll-back, a final call). */
typedef struct ei__seg_state {
    double budget_dyn;     /* B[s], tracked from the first planned segment */
    float entropy;         /* H[s] as the recurrence saw it (segment 0: 0) */
    int32_t known;         /* 0: segment s was skipped, rolled back or never planned */
    int32_t rigid_so_far;  /* every entropy of segments 1..s below e_t */
    int32_t pad_;
} ei__seg_state;
/* The chunked state region: head states, [kv][segment] recurrence rows,
   each head's open-segment query representation [EI_MAX_CHUNK_GROUP][2][d]
   and its open segment's sampled block mass [blks_pad] (EI_RANK_SAMPLED; the
   CUDA backend keeps the open segment's raw block scores there until a
   sampled row of it is in) and, with EI_PLAN_KEEP_KEYS only, its key-block
   min/max store [2][d][blks_pad] (max first; the CUDA backend's own
   layout). Without it each chunk builds the key blocks' min/max again from
   the cache, in its workspace (issue 31: the store was 32 of a 32k plan's
   33.6 MiB, kept per layer for keys the cache holds; min/max of the same
   keys are the same floats, so the plans are the same either way). */
typedef struct ei__chunk_geom { size_t seg_rows, open_reps, open_mass, key_reps, bytes; } ei__chunk_geom;
EI__HD void ei__chunk_geometry(int64_t segs, int64_t blks_pad, int32_t n_kv_heads, int32_t head_dim, int keep_keys,
                               ei__chunk_geom *g) {
    size_t kv = (size_t)n_kv_heads;
    g->seg_rows = ei__align_size(kv * sizeof(ei__head_state));
    g->open_reps = g->seg_rows + ei__align_size(kv * (size_t)segs * sizeof(ei__seg_state));
    g->open_mass = g->open_reps + ei__align_size(kv * (size_t)EI_MAX_CHUNK_GROUP * 2u * (size_t)head_dim * 4u);
    g->key_reps = g->open_mass + ei__align_size(kv * (size_t)blks_pad * 4u);
    g->bytes = keep_keys ? g->key_reps + kv * 2u * (size_t)head_dim * (size_t)blks_pad * 4u : g->open_mass + kv * (size_t)blks_pad * 4u;
}

/* Row capacity of block_index: the most blocks a budget of this
   configuration keeps (max factor x base), at most the blocks there are. */
EI__HD int32_t ei__max_keep(const ei_config *c, int64_t blk_capacity) {
    double f = c->budget_max_factor > 1.0 ? (double)c->budget_max_factor : 1.0;
    int64_t k = (int64_t)floor(f * (double)c->base_budget / (double)c->block_size);
    return (int32_t)(k < blk_capacity ? k : blk_capacity);
}

/* The arrays of a plan, in memory order, each 64-byte aligned from a
   64-byte aligned base (bytes includes 64 of slack to align the base). */
enum { EI__PA_ENTROPY, EI__PA_CLASS, EI__PA_BUDGET, EI__PA_KEEP_BLOCKS, EI__PA_KEEP_COUNT, EI__PA_BLOCK_INDEX,
       EI__PA_SCORES, EI__PA_STATE, EI__PA_COUNT };
typedef struct ei__plan_geom {
    int64_t segs, blks, blks_pad, max_keep;
    size_t offset[EI__PA_COUNT], size[EI__PA_COUNT];
    size_t bytes;
} ei__plan_geom;
/* 0 when a size overflows size_t. */
EI__HD int ei__plan_geometry(const ei_config *c, int64_t max_tokens, int32_t n_kv_heads, int32_t head_dim,
                             uint32_t flags, ei__plan_geom *g) {
    size_t kv = (size_t)n_kv_heads, rows, o = 0, lim = (size_t)-1 / 8;
    int i;
    g->segs = ei__ceil_div(max_tokens, c->segment_size);
    g->blks = (g->segs - 1) * (c->segment_size / c->block_size);
    g->blks_pad = ei__round_up(g->blks > 0 ? g->blks : 1, 16);
    g->max_keep = ei__max_keep(c, g->blks);
    rows = kv * (size_t)g->segs;
    if (rows / kv != (size_t)g->segs || rows > lim / ((size_t)g->max_keep + 1) ||
        rows > lim / (size_t)g->blks_pad || kv * 2u * (size_t)head_dim > lim / (size_t)g->blks_pad)
        return 0;
    g->size[EI__PA_ENTROPY] = rows * 4u;
    g->size[EI__PA_CLASS] = kv;
    g->size[EI__PA_BUDGET] = rows * 4u;
    g->size[EI__PA_KEEP_BLOCKS] = rows * 4u;
    g->size[EI__PA_KEEP_COUNT] = rows * 4u;
    g->size[EI__PA_BLOCK_INDEX] = rows * (size_t)g->max_keep * 4u;
    g->size[EI__PA_SCORES] = (flags & EI_PLAN_SCORES) ? rows * (size_t)(g->blks > 0 ? g->blks : 1) * 4u : 0;
    g->size[EI__PA_STATE] = 0;
    if (flags & EI_PLAN_CHUNKED) {
        ei__chunk_geom cg;
        if (rows > lim / sizeof(ei__seg_state) || kv * (size_t)head_dim > lim / (2u * EI_MAX_CHUNK_GROUP)) return 0;
        ei__chunk_geometry(g->segs, g->blks_pad, n_kv_heads, head_dim, (flags & EI_PLAN_KEEP_KEYS) != 0, &cg);
        g->size[EI__PA_STATE] = cg.bytes;
    }
    for (i = 0; i < EI__PA_COUNT; ++i) {
        size_t next = o + ei__align_size(g->size[i]);
        if (next < o) return 0;
        g->offset[i] = o;
        o = next;
    }
    g->bytes = o + EI__PLAN_ALIGN;
    return g->bytes > o;
}

/* Blocks segment s may keep: all blocks before it, and for the last scored
   segment n_blocks - ((n mod segment) div block + 1) (tests/golden/FORMAT.md). */
EI__HD int64_t ei__cap_blocks(const ei_config *c, int32_t s, int64_t n_tokens, int64_t n_blocks) {
    int64_t visible = (int64_t)s * (c->segment_size / c->block_size);
    int64_t tail = n_blocks - ((n_tokens % c->segment_size) / c->block_size + 1);
    int64_t cap = visible < tail ? visible : tail;
    return cap > 0 ? cap : 0;
}
/* Segment s attends sparsely: it starts at or past threshold_len and is not
   the last segment of a finished plan when last_segment_dense. */
/* Segment s is ranked by sampled mass: EI_RANK_SAMPLED, and it may attend
   sparsely (segments that start before threshold_len attend densely: their
   rows, never read, keep the reference ranking and cost nothing). */
EI__HD int ei__rank_sampled(const ei_config *c, int32_t s) {
    return c->ranking == EI_RANK_SAMPLED && s > 0 && (int64_t)s * c->segment_size >= c->threshold_len;
}
/* The same for any ranking by estimated attention mass (EI_RANK_SAMPLED,
   EI_RANK_ANTIDIAGONAL; the CPU's planning). */
EI__HD int ei__rank_by_mass(const ei_config *c, int32_t s) {
    return c->ranking != EI_RANK_REFERENCE && s > 0 && (int64_t)s * c->segment_size >= c->threshold_len;
}
EI__HD int ei__segment_sparse(const ei_config *c, int32_t s, int32_t n_segments, int32_t final) {
    if ((int64_t)s * c->segment_size < c->threshold_len) return 0;
    return !(c->last_segment_dense && final && s == n_segments - 1);
}
/* An entropy below e_t keeps a head rigid (every segment after 0 must be;
   with one segment the condition holds vacuously). */
EI__HD int ei__entropy_rigid(const ei_config *c, float h) { return (double)h < c->rigid_entropy; }
EI__HD int ei__head_rigid(const ei_config *c, const float *entropy_row, int32_t n_segments) {
    int32_t s;
    for (s = 1; s < n_segments; ++s)
        if (!ei__entropy_rigid(c, entropy_row[s])) return 0;
    return 1;
}
/* One step of the dynamic-head budget recurrence (double precision):
   B[0] = base; r = delta_t at s = 1, else the entropy's relative change,
   clamped to [0, 1 + delta_t]; B[s] = clamp(B[s-1] + alpha base (r - delta_t),
   min factor x base, max factor x base). */
/* Its two halves, so that a GPU can compute every segment's step at once and
   run only the additions in series: the step alpha base (r - delta_t) of
   segment s >= 1, and prev plus a step, clamped. */
EI__HD double ei__budget_step(const ei_config *c, int32_t s, float h, float h_prev) {
    double base = (double)c->base_budget, r;
    r = s == 1 ? c->delta_t : ((double)h - (double)h_prev) / ((double)h_prev + 1e-9);
    r = r > 0.0 ? r : 0.0;
    r = r < 1.0 + c->delta_t ? r : 1.0 + c->delta_t;
    return c->alpha * base * (r - c->delta_t);
}
EI__HD double ei__budget_add(const ei_config *c, double prev, double step) {
    double base = (double)c->base_budget, lo = c->budget_min_factor * base, hi = c->budget_max_factor * base;
    double b = prev + step;
    b = b > lo ? b : lo;
    return b < hi ? b : hi;
}
EI__HD double ei__budget_next(const ei_config *c, int32_t s, double prev, float h, float h_prev) {
    if (s == 0) return (double)c->base_budget;
    return ei__budget_add(c, prev, ei__budget_step(c, s, h, h_prev));
}
/* Budget in tokens -> blocks kept: floor to blocks, then cap; segment 0 keeps none. */
EI__HD int32_t ei__keep_of(const ei_config *c, int32_t s, double budget, int64_t cap) {
    double k = floor(budget / (double)c->block_size);
    if (s == 0) return 0;
    if (k > (double)cap) k = (double)cap;
    return k < 0 ? 0 : (int32_t)k;
}
/* Chunked planning, one segment's step of the recurrence (both backends):
   cur (segment s) from prev (segment s-1, NULL for s = 0) and the segment's
   entropy h. A head stays rigid while every entropy so far is below e_t; the
   dynamic budget is tracked from segment 0 whatever the class; the first
   segment after skipped or forgotten ones starts as segment 1 does. */
EI__HD void ei__chunk_recurrence(const ei_config *c, int32_t s, const ei__seg_state *prev, float h, ei__seg_state *cur) {
    if (s == 0) {
        cur->budget_dyn = (double)c->base_budget;
        cur->rigid_so_far = 1;
    } else if (prev->known) {
        cur->budget_dyn = ei__budget_next(c, s, prev->budget_dyn, h, prev->entropy);
        cur->rigid_so_far = prev->rigid_so_far && ei__entropy_rigid(c, h);
    } else {
        cur->budget_dyn = ei__budget_next(c, 1, (double)c->base_budget, h, 0.0f);
        cur->rigid_so_far = ei__entropy_rigid(c, h);
    }
    cur->entropy = h;
    cur->known = 1;
}
/* The budget a chunked segment applies: base while rigid, else the recurrence's. */
EI__HD double ei__chunk_budget(const ei_config *c, const ei__seg_state *cur) {
    return cur->rigid_so_far ? (double)c->base_budget : cur->budget_dyn;
}
/* EI_RANK_SAMPLED: the token of sampled row i of segment s (CONCEPTS:
   ranking); its query head is kvh * G + i % G. */
EI__HD int64_t ei__sample_token(const ei_config *c, int32_t s, int32_t i) {
    return (int64_t)s * c->segment_size + ((2 * (int64_t)i + 1) * c->segment_size) / (2 * (int64_t)c->rank_samples);
}
/* x / s rounded half away from zero, clamped to +-127, for |x / s| below
   2^31 (the quantisers' range: |x| <= 127 s up to rounding): trunc, then
   the exact remainder decides. The int8 ranking's and the spread rows'
   rounding, on both backends. */
EI__HD int8_t ei__round_i8(float t) {
    float r = (float)(int32_t)t, f = t - r;
    if (f >= 0.5f) r += 1.0f;
    else if (f <= -0.5f) r -= 1.0f;
    return (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int32_t)r);
}
EI__HD int ei__rank_spread(const ei_config *c) { return c->ranking == EI_RANK_SAMPLED && c->rank_rows == EI_RANK_ROWS_SPREAD; }
/* EI_RANK_ROWS_SPREAD's candidates (CONCEPTS: ranking): at most
   EI__SPREAD_MAX of them and EI__SPREAD_BYTES of int8 rows, so that a
   segment's candidates fit one CTA's shared memory on the GPU (sm_80 and up)
   and each pick is one pass over 128 KiB on the CPU. Tokens t0 + j st of
   each of the G query heads, j < ceil(segment_size / st): the smallest
   stride st that keeps their count within both. */
#define EI__SPREAD_MAX 1024
#define EI__SPREAD_BYTES 131072
EI__HD int64_t ei__spread_stride(const ei_config *c, int32_t G, int32_t head_dim) {
    int64_t cap = EI__SPREAD_BYTES / ei__round_up(head_dim, 4), per;
    if (cap > EI__SPREAD_MAX) cap = EI__SPREAD_MAX;
    per = cap / G > 0 ? cap / G : 1; /* tokens; G > cap: one token, G candidates */
    return ei__ceil_div(c->segment_size, per);
}
/* The candidates of a segment: ceil(segment_size / st) tokens x G heads. */
EI__HD int64_t ei__spread_candidates(const ei_config *c, int32_t G, int32_t head_dim) {
    return ei__ceil_div(c->segment_size, ei__spread_stride(c, G, head_dim)) * G;
}
/* The first spread row: even row 0's token (ei__sample_token) rounded down
   to the stride, the group's first head (candidate 0 if that is past them). */
EI__HD int64_t ei__spread_first(const ei_config *c, int32_t G, int32_t head_dim) {
    int64_t st = ei__spread_stride(c, G, head_dim);
    int64_t b = (c->segment_size / (2 * (int64_t)c->rank_samples)) / st * G;
    return b < ei__spread_candidates(c, G, head_dim) ? b : 0;
}
/* Segment s takes spread rows in a call whose queries are tokens [t_lo,
   t_hi) (q holding them from q_pos): EI_RANK_ROWS_SPREAD, and the call
   holds all its tokens. */
EI__HD int ei__spread_whole(const ei_config *c, int32_t s, int64_t q_pos, int64_t t_lo, int64_t t_hi) {
    const int64_t t0 = (int64_t)s * c->segment_size;
    return ei__rank_spread(c) && t_lo <= t0 && q_pos <= t0 && t_hi >= t0 + c->segment_size;
}
/* EI_RANK_ANTIDIAGONAL: the first token of query tile i of segment s, a
   whole query block (CONCEPTS: ranking); its query head is kvh * G + i % G,
   its row r (token + r) scores the keys of phase block_size - 1 - r. */
EI__HD int64_t ei__antidiag_tile_token(const ei_config *c, int32_t s, int32_t i) {
    int64_t nt = c->segment_size / c->block_size;
    return (int64_t)s * c->segment_size + c->block_size * (((2 * (int64_t)i + 1) * nt) / (2 * (int64_t)c->rank_samples));
}
/* The always-kept blocks of a segment that sees nvis blocks: sink blocks
   [0, *n_sink) and local blocks [*local0, nvis). Returns their count. */
EI__HD int64_t ei__forced_blocks(const ei_config *c, int64_t nvis, int64_t *n_sink, int64_t *local0) {
    int64_t ns = (int64_t)c->sink_blocks < nvis ? (int64_t)c->sink_blocks : nvis;
    int64_t l0 = nvis - (int64_t)c->local_blocks;
    *n_sink = ns;
    *local0 = l0 > ns ? l0 : ns;
    return ns + (nvis - *local0);
}
/* A row's keep count: from the budget (ei__keep_of), or with top_p from k_p,
   the fewest ranked blocks whose share reaches top_p, clamped to
   [base, max factor x base] tokens; then at least the n_forced always-kept
   blocks, at most cap and the row capacity max_keep. Segment 0 keeps none. */
EI__HD int32_t ei__keep_count(const ei_config *c, int32_t s, double budget, int64_t k_p, int64_t n_forced, int64_t cap,
                              int32_t max_keep) {
    int64_t k;
    if (s == 0) return 0;
    if (c->top_p > 0.0) {
        int64_t lo = (int64_t)floor((double)c->base_budget / (double)c->block_size);
        int64_t hi = (int64_t)floor((c->budget_max_factor > 1.0 ? c->budget_max_factor : 1.0) * (double)c->base_budget /
                                    (double)c->block_size);
        k = k_p < lo ? lo : k_p;
        k = k < hi ? k : hi;
    } else
        k = (int64_t)floor(budget / (double)c->block_size);
    k = k > n_forced ? k : n_forced;
    k = k < cap ? k : cap;
    k = k < (int64_t)max_keep ? k : (int64_t)max_keep;
    return k < 0 ? 0 : (int32_t)k;
}
/* Queries a keep-set scores: the window, or every query observed when fewer. */
EI__HD int64_t ei__decode_window(const ei_config *c, const ei_decoder *dec) {
    return dec->n_observed < (int64_t)c->window ? dec->n_observed : (int64_t)c->window;
}
/* The newest positions every keep set keeps (the tail): the keys of the
   window's queries; EI_DECODE_SNAPKV: of the prompt queries it holds, and
   every generated position after them (its ring holds prompt queries only). */
EI__HD int64_t ei__decode_tail(const ei_config *c, const ei_decoder *dec) {
    int64_t prompt;
    if (c->decode_policy != EI_DECODE_SNAPKV) return ei__decode_window(c, dec);
    prompt = dec->n_observed - dec->n_generated;
    return (prompt < (int64_t)c->window ? prompt : (int64_t)c->window) + dec->n_generated;
}
/* The queries that score the cache: numbers q0 .. q0+m-1 of those observed
   (ring slot number % window); query number t lines up with the position
   n_observed - t before the newest + 1. The window (ENTROPYINFER,
   STREAMING), the prompt's last window queries (SNAPKV), the window's queries
   not yet summed into the decoder (H2O: m can be 0). */
EI__HD int64_t ei__decode_scored(const ei_config *c, const ei_decoder *dec, int64_t *q0) {
    int64_t W = ei__decode_window(c, dec), m = W, end = dec->n_observed;
    if (c->decode_policy == EI_DECODE_SNAPKV) {
        end = dec->n_observed - dec->n_generated;
        m = end < (int64_t)c->window ? end : (int64_t)c->window;
    } else if (c->decode_policy == EI_DECODE_H2O) {
        int64_t fresh = dec->n_observed - dec->n_accumulated;
        m = fresh < W ? fresh : W;
    }
    *q0 = end - m;
    return m;
}
/* The positions a keep set holds when it compresses a sequence of P
   positions (the newest held + 1): decode_budget, or with a ratio
   ceil(ratio x P) between decode_budget_min and decode_budget. */
EI__HD int64_t ei__decode_budget(const ei_config *c, int64_t P) {
    double b;
    if (!(c->decode_budget_ratio > 0.0)) return c->decode_budget;
    b = ceil(c->decode_budget_ratio * (double)P);
    if (b < (double)c->decode_budget_min) b = (double)c->decode_budget_min;
    if (b > (double)c->decode_budget) b = (double)c->decode_budget;
    return (int64_t)b;
}

/* The newest positions a keep set of b positions holds by recency alone
   before it ranks the older ones (ei__keep_policy, keep_finish_kernel):
   EI_DECODE_H2O b / 2 (its recent window, as in its paper);
   EI_DECODE_ENTROPYINFER and EI_DECODE_SNAPKV floor(decode_recent x b);
   0 otherwise. The tail is kept whatever this says (R = max(this, tail)).
   Why decode_recent: on Gemma 3 at 32k StreamingLLM and H2O, which keep
   thousands of recent positions, stayed within 2% of dense where the window
   alone did not (docs/decode_eval/window_probe). */
EI__HD int64_t ei__decode_recent(const ei_config *c, int64_t b) {
    if (c->decode_policy == EI_DECODE_H2O) return b / 2;
    if (!(c->decode_recent > 0.0f) ||
        (c->decode_policy != EI_DECODE_ENTROPYINFER && c->decode_policy != EI_DECODE_SNAPKV))
        return 0;
    return (int64_t)floor((double)c->decode_recent * (double)b);
}

#endif /* EI__CUDA_ABI_INCLUDED */
#endif

#endif /* ENTROPYINFER_H */

/* ======================================================================== */
/*                              IMPLEMENTATION                              */
/* ======================================================================== */
#ifdef ENTROPYINFER_IMPLEMENTATION
#ifndef ENTROPYINFER_IMPLEMENTATION_DONE
#define ENTROPYINFER_IMPLEMENTATION_DONE
/* SECTIONS (search for the marker, e.g. "// >>plan")
     >>common        includes, the context struct, the kernel table type, errors,
                     allocation, size arithmetic, arenas, the *_mt fork-join
     >>convert       f16 / bf16 <-> f32, bit-exact
     >>cpu-features  cpuid/xgetbv: which SIMD paths this CPU, OS and build can run
     >>validate      views (strides, aliasing, extents), overlaps, Q/K agreement
     >>config        ei_config_default and its checks
     >>backend       the CUDA plugin: dlopen, the EI__CUDA call-through, device memory
     >>context       ei_context_create (kernel table, backend, fallback)
     >>plan          plan layout (ei__plan_geometry under the ABI), init, reset, free
     >>simd          what the min/max and block-score kernels compute
     >>profile       whole-prompt planning: reps, scores, entropy, budgets, ranking
     >>profile-chunked  causal planning, one chunk of segments at a time
     >>decode        observation window, keep-sets, KV compaction
     >>attention     block-sparse / dense prefill attention: checks, tile walk,
                     the stage interface, the scalar reference
     >>isa-scalar, >>isa-avx2, >>isa-avx512, >>isa-avx512bf16, >>isa-neon
                     each path's kernels (a vector vocabulary, the elementwise
                     stages written once against it, the hand-written score and
                     P.V loops) and its kernel table
     >>exec          the public calls: an ei_exec (threads or parts, one
                     workspace) run through the functions above; ei_layer_sizes
     >>kernels       ei__kernels_for: the table a context uses
   The method's rules (plan geometry, caps, sparse segments, rigid test,
   budget recurrence, decode window) are not here but above, under the CUDA
   plugin ABI, so that the plugin and the tests share them. */

// >>common ------------------------------------------------------------------
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>   /* vsnprintf only: the library never prints */
#include <stdlib.h>
#include <string.h>

#ifndef EI_ASSERT
#define EI_ASSERT(x) ((void)0)
#endif
#if defined(EI_MALLOC) != defined(EI_FREE)
#error "define both EI_MALLOC and EI_FREE, or neither"
#endif
#ifndef EI_MALLOC
#define EI_MALLOC(sz) malloc(sz)
#define EI_FREE(p) free(p)
#endif

#if defined(__cplusplus) && __cplusplus >= 201103L
#define EI__TLS thread_local
#elif defined(_MSC_VER)
#define EI__TLS __declspec(thread)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define EI__TLS _Thread_local
#else
#define EI__TLS __thread
#endif

#if defined(__GNUC__) || defined(__clang__)
#define EI__MAYBE_UNUSED __attribute__((unused))
#else
#define EI__MAYBE_UNUSED
#endif
/* GCC's own intrinsic headers trip -Wmaybe-uninitialized (_mm512_undefined_ps)
   when inlined into C++; the warning is about the header, not this code. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define EI__POP_DIAGNOSTICS 1
#endif

#define EI__MIN(a, b) ((a) < (b) ? (a) : (b))
#define EI__MAX(a, b) ((a) > (b) ? (a) : (b))
#define EI__ALIGN 64

/* x86 SIMD is compiled per function with target attributes, so a plain -O2
   build still carries the AVX2 and AVX-512 paths; which one runs is decided
   at context creation from cpuid + xgetbv. */
#if !defined(EI_NO_SIMD) && (defined(__GNUC__) || defined(__clang__)) && \
    (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#include <cpuid.h>
#ifndef EI_NO_AVX2
#define EI__HAVE_AVX2 1
#define EI__TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif
#ifndef EI_NO_AVX512
#define EI__HAVE_AVX512 1
#define EI__TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#endif
#endif
/* vdpbf16ps (AVX512_BF16) needs gcc >= 10 or clang >= 9, and x86-64: its
   rate calibration (>>kernels) times 16 accumulators in zmm0..15 plus two
   operands, registers that 32-bit mode does not have (it has zmm0..7). */
#if defined(EI__HAVE_AVX512) && !defined(EI_NO_AVX512BF16) && defined(__x86_64__) && \
    ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define EI__HAVE_AVX512BF16 1
#define EI__TARGET_AVX512BF16 \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")))
#endif
/* vpdpbusd (EI_RANK_PRECISION_INT8's dot): AVX512_VNNI on gcc >= 9 or
   clang >= 8, AVX-VNNI (its VEX form on ymm) on gcc >= 11 or clang >= 12;
   EI_NO_VNNI leaves both out (int16 vpmaddwd then). */
#if defined(EI__HAVE_AVX512) && !defined(EI_NO_VNNI) && \
    ((defined(__clang__) && __clang_major__ >= 8) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 9))
#define EI__HAVE_AVX512VNNI 1
#define EI__TARGET_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
#endif
#if defined(EI__HAVE_AVX2) && !defined(EI_NO_VNNI) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define EI__HAVE_AVXVNNI 1
#define EI__TARGET_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#endif
/* AMX tiles: gcc >= 11 or clang >= 12, and Linux (the OS grants the tile
   state per process: arch_prctl, >>cpu-features) */
#if defined(EI__HAVE_AVX512BF16) && !defined(EI_NO_AMX) && defined(__linux__) && defined(__x86_64__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define EI__HAVE_AMX 1
#define EI__TARGET_AMX \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c,amx-tile,amx-bf16")))
#endif
#if !defined(EI_NO_SIMD) && !defined(EI_NO_NEON) && defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define EI__HAVE_NEON 1
#if defined(__linux__)
#include <sys/auxv.h> /* getauxval: the CPU's features as the kernel reports them (>>cpu-features) */
#define EI__HAVE_AUXV 1
#endif
/* BFDOT and BFMMLA (FEAT_BF16): compiled per function with a target
   attribute on gcc >= 10, as the x86 paths are, so a plain build carries
   them and the CPU decides; clang's arm_neon.h offers the bf16 intrinsics
   only when the whole file targets them (-march=...+bf16), so there it
   follows the build. */
#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#define EI__HAVE_NEON_BF16 1
#define EI__TARGET_NEON_BF16
#elif !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10
#define EI__HAVE_NEON_BF16 1
#define EI__TARGET_NEON_BF16 __attribute__((target("arch=armv8.2-a+bf16")))
#endif
/* FMLAL/FMLAL2 (FEAT_FHM: f16 products added to f32 sums) the same way:
   per function on gcc >= 9, from the build's target on clang. */
#if defined(__ARM_FEATURE_FP16_FML)
#define EI__HAVE_NEON_FHM 1
#define EI__TARGET_NEON_FHM
#elif !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 9
#define EI__HAVE_NEON_FHM 1
#define EI__TARGET_NEON_FHM __attribute__((target("arch=armv8.2-a+fp16fml")))
#endif
#endif

/* One kernel table per context, chosen once at creation (>>kernels): every
   stage that has per-ISA code is called through it, so a context runs one
   path throughout and a test forces a path by choosing cfg.simd. */
struct ei__attn_job;
struct ei__attn_ws;
struct ei__attn_tile;
struct ei__rank_q8;
struct ei__rank_keys;
typedef struct ei__attn_stages {   /* the stages of one query tile (>>attention) */
    void (*pack_q)(const struct ei__attn_job *J, struct ei__attn_ws *w, const struct ei__attn_tile *T);
    void (*prep_kv)(const struct ei__attn_job *J, struct ei__attn_ws *w, const struct ei__attn_tile *T, int32_t nk);
    void (*scores)(const struct ei__attn_job *J, struct ei__attn_ws *w, const struct ei__attn_tile *T, int32_t nk,
                   int need_mask);
    void (*softmax)(struct ei__attn_ws *w, const struct ei__attn_tile *T, int32_t nk);
    void (*pack_p)(struct ei__attn_ws *w, const struct ei__attn_tile *T, int32_t nk); /* NULL: P stays f32 */
    void (*pv)(const struct ei__attn_job *J, struct ei__attn_ws *w, const struct ei__attn_tile *T, int32_t nk);
    void (*store)(const struct ei__attn_job *J, struct ei__attn_ws *w, const struct ei__attn_tile *T);
} ei__attn_stages;
typedef struct ei__kernels {
    ei_simd simd;
    /* profiling: elementwise max/min of nt rows of one head (0 if NaN/Inf was
       read); group-mean block scores of one segment (>>simd) */
    int (*minmax)(const ei_tensor *t, int64_t t0, int64_t nt, int32_t head, float *mx, float *mn);
    /* attention: 1 if rows pos[0..n) of one head hold no NaN/Inf (>>simd) */
    int (*rows_finite)(const ei_tensor *t, const int64_t *pos, int32_t n, int32_t head);
    void (*score_row)(const float *qrep, int32_t G, int32_t d, const float *kmaxT, const float *kminT, int64_t ld,
                      int64_t nb, float *raw);
    /* decode scoring */
    float (*dot)(const float *a, const float *b, int32_t d);
    /* EI_RANK_SAMPLED: add the block mass of up to EI__SAMPLE_ROWS sampled
       rows to mass[0..nvis) (>>profile, ei__sample_mass); 0 if a score is
       not finite */
    int (*sample_mass)(const float *qt, const int64_t *tok, int32_t nr, const ei_tensor *k, int32_t kvh, float scale,
                       int32_t bs, int64_t nvis, float *lg, float *kbuf, float *mass, const int32_t *krow);
    /* the same contract for the ranking's sampled rows: sample_mass, or (the
       avx512-bf16 path) vdpbf16ps on bf16 keys with q rounded to bf16, as
       the CUDA backend's ranking rounds it; decode scores keep sample_mass
       (f32 q, as the CUDA backend's decode scores) */
    int (*rank_mass)(const float *qt, const int64_t *tok, int32_t nr, const ei_tensor *k, int32_t kvh, float scale,
                     int32_t bs, int64_t nvis, float *lg, float *kbuf, float *mass, const int32_t *krow);
    /* the same with EI_RANK_PRECISION_INT8: the batch's rows in int8
       (ei__rank_q8, >>profile), keys quantised a tile at a time, exact
       int32 dot products (the x86 dot: q->dot); keys in position order */
    int (*rank_mass_i8)(const struct ei__rank_q8 *q, const int64_t *tok, int32_t nr, const ei_tensor *k, int32_t kvh,
                        float scale, int32_t bs, int64_t nvis, float *lg, float *kbuf, float *mass);
    /* EI_RANK_PRECISION_INT8's rounding of rows [kc->n, j1) of head kvh
       (ei__rank_keys_extend_scalar's contract: the same bytes on every path) */
    int (*rank_round_i8)(struct ei__rank_keys *kc, const ei_tensor *k, int32_t kvh, int64_t j1, float *row);
    /* prefill attention: f32-arithmetic stages (NULL: the scalar reference),
       and stages for all-bf16 / all-f16 calls with an even head_dim (NULL:
       none) */
    const ei__attn_stages *attn;
    const ei__attn_stages *attn_bf16;
    const ei__attn_stages *attn_f16;
    /* decode attention: one key tile of one head group into its partials
       (>>attention, ei__attn_decode_tile; NULL: the prefill stages or the
       scalar reference); 0 if a key row holds NaN/Inf */
    int (*decode)(const struct ei__attn_job *J, struct ei__attn_ws *w, int32_t kvh, const float *q, int32_t nr, float *st,
                  const int64_t *pos, int32_t nk, const int64_t *pf_pos, int32_t pf_nk);
    /* EI_RANK_ANTIDIAGONAL: the weights of a group of up to antidiag_lanes
       query tiles (>>profile, ei__antidiag_mass; >>attention's template
       EI__DEFINE_ANTIDIAG_GROUP); NULL: the plain per-row reference */
    int (*antidiag_group)(const float *qt, const int64_t *u, const ei_tensor *k, int32_t kvh, float scale, int32_t bs,
                          int64_t ns, int64_t ld, float *lg, float *kbuf);
    int32_t antidiag_lanes;
    /* EI_RANK_ROWS_SPREAD: out[c] = the int32 sum of cand[c][i] p[i] over i < dq
       for c < n (rows dq bytes apart; exact, so every path gives the same
       sums; ei__spread_dots_scalar is the plain one) */
    void (*spread_dots)(const int8_t *cand, int64_t n, int32_t dq, const int8_t *p, int32_t *out);
    /* EI_RANK_ROWS_SPREAD's pick step, where the path has a faster one (NULL:
       spread_dots and the plain loop of ei__spread_rows; run only where
       ei_context.i8dot has EI__I8DOT_AVX512VNNI): the dots of the n
       candidates (regrouped by ei__spread_regroup into t, with sum128)
       with row p, each candidate's largest cosine best[c] raised to
       dot r[c] rp where that is larger, and the next pick returned: the
       smallest best[c], the earliest on ties. ei__spread_rows' loop bit
       for bit (the same exact dots, the same double products). */
    int64_t (*spread_step)(const int8_t *t, const int32_t *sum128, int64_t n, int32_t dq, const int8_t *p, double rp,
                           const double *r, double *best);
} ei__kernels;

typedef struct ei__cuda_state {
    void *library;              /* dlopen handle */
    const ei_cuda_api *api;
    char path[640];             /* what was opened */
} ei__cuda_state;

struct ei_context {
    ei_config cfg;              /* as given (backend as asked for) */
    ei_backend backend;         /* the backend in use: EI_BACKEND_CPU or EI_BACKEND_CUDA */
    const ei__kernels *kern;    /* the CPU kernels */
    int i8dot;                  /* EI_RANK_PRECISION_INT8: the x86 int8 dots this CPU runs (EI__I8DOT_* bits, >>cpu-features) */
    ei_allocator alloc;
    ei__cuda_state *cuda;       /* the loaded plugin (>>backend), NULL on the CPU */
    struct ei__pool *pool;      /* the *_mt helpers' workers (>>memory, ei__fork_join); NULL: none */
};

static EI__TLS char ei__tls_message[512];

/* Record why a call failed (thread-local), tell the logger, return code. */
static ei_result ei__fail(const ei_context *ctx, ei_result code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static ei_result ei__fail(const ei_context *ctx, ei_result code, const char *fmt, ...) {
    va_list ap;
    int n = snprintf(ei__tls_message, sizeof ei__tls_message, "%s: ", ei_result_name(code));
    if (n < 0 || n >= (int)sizeof ei__tls_message) n = 0;
    va_start(ap, fmt);
    vsnprintf(ei__tls_message + n, sizeof ei__tls_message - (size_t)n, fmt, ap);
    va_end(ap);
    if (ctx && ctx->cfg.log) ctx->cfg.log(ctx->cfg.log_user_data, code, ei__tls_message);
    return code;
}

EIDEF const char *ei_result_name(ei_result r) {
    switch (r) {
#define EI__NAME(name, value, text) case name: return #name;
        EI_RESULT_TABLE(EI__NAME)
#undef EI__NAME
        default: return "EI_ERR_UNKNOWN";
    }
}
EIDEF const char *ei_result_string(ei_result r) {
    switch (r) {
#define EI__TEXT(name, value, text) case name: return text;
        EI_RESULT_TABLE(EI__TEXT)
#undef EI__TEXT
        default: return "unknown result code";
    }
}
EIDEF const char *ei_last_error(void) { return ei__tls_message; }

static void *ei__alloc(const ei_allocator *a, size_t n) {
    if (a && a->alloc) return a->alloc(n, a->user_data);
    return EI_MALLOC(n);
}
static void ei__free(const ei_allocator *a, void *p) {
    if (!p) return;
    if (a && a->free) a->free(p, a->user_data);
    else EI_FREE(p);
}

/* Overflow-checked size arithmetic: every helper returns 0 on overflow. */
static int ei__mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}
static int ei__add_size(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}
/* Bytes of an aligned array of n elements of size elem, added to *total. */
static int ei__reserve(size_t *total, size_t n, size_t elem) {
    size_t bytes, t;
    if (!ei__mul_size(n, elem, &bytes)) return 0;
    if (!ei__add_size(bytes, EI__ALIGN - 1, &bytes)) return 0;
    bytes &= ~(size_t)(EI__ALIGN - 1);
    if (!ei__add_size(*total, bytes, &t)) return 0;
    *total = t;
    return 1;
}
/* Carve an aligned array from a bump arena (sizes were checked by reserve). */
typedef struct ei__arena { unsigned char *ptr, *end; } ei__arena;
static void ei__arena_init(ei__arena *a, void *mem, size_t bytes) {
    uintptr_t p = (uintptr_t)mem, q = (p + EI__ALIGN - 1) & ~(uintptr_t)(EI__ALIGN - 1);
    a->ptr = (unsigned char *)mem + (q - p);
    a->end = (unsigned char *)mem + bytes;
    if (a->ptr > a->end) a->ptr = a->end;
}
static void *ei__arena_take(ei__arena *a, size_t n, size_t elem) {
    size_t bytes = (n * elem + EI__ALIGN - 1) & ~(size_t)(EI__ALIGN - 1);
    void *p = a->ptr;
    /* every arena was sized by ei__reserve with the same counts */
    EI_ASSERT((size_t)(a->end - a->ptr) >= bytes);
    if ((size_t)(a->end - a->ptr) < bytes) return NULL;
    a->ptr += bytes;
    return p;
}

/* Fork-join for the built-in *_mt helpers: task(arg, ith, nth, ws + ith*per,
   per) for ith = 0..nth-1, the calling thread taking ith 0, the others on
   the context's workers (ei__pool), or, while another call uses those, on
   threads started and joined for this call; a share that no thread can take
   runs on the caller. The first failure wins. Under EI_NO_PTHREADS every
   share runs on the calling thread in turn. */
#define EI__MAX_THREADS EI_MAX_THREADS
typedef ei_result (*ei__task_fn)(void *arg, int ith, int nth, void *ws, size_t ws_bytes);
#ifndef EI_NO_PTHREADS
#include <pthread.h>
#include <unistd.h> /* getpid */
/* The caller's stack holds one small slot per thread (24-32 bytes, 8 KB at
   EI__MAX_THREADS) and one message: the first failing share's (lowest ith),
   copied under a lock from the worker's thread-local message. */
typedef struct ei__fork {
    ei__task_fn task;
    void *arg;
    unsigned char *ws;
    size_t per;
    int nth, failed_ith;
    pthread_mutex_t lock;
    char message[sizeof ei__tls_message];
} ei__fork;
typedef struct ei__share {
    ei__fork *fork;
    pthread_t tid;
    int ith, started;
    ei_result result;  /* written by its worker only, read after the join */
} ei__share;
static void *ei__share_run(void *p) {
    ei__share *sh = (ei__share *)p;
    ei__fork *f = sh->fork;
    ei_result r = f->task(f->arg, sh->ith, f->nth, f->ws ? f->ws + f->per * (size_t)sh->ith : NULL, f->per);
    sh->result = r;
    if (r != EI_OK) {
        pthread_mutex_lock(&f->lock);
        if (f->failed_ith < 0 || sh->ith < f->failed_ith) {
            f->failed_ith = sh->ith;
            memcpy(f->message, ei__tls_message, sizeof f->message);
        }
        pthread_mutex_unlock(&f->lock);
    }
    return NULL;
}

/* A context's workers, kept from one *_mt call to the next: starting and
   joining a thread costs 51 us on a 2-core Zen 5 VM (16 us on a Sapphire
   Rapids one), handing a share to a spinning worker much less (below), and
   a chunked prefill forks per segment. Started by the first call that needs them
   (never more than its nth - 1), ended by ei_context_destroy. One call at a
   time has them (owner, taken with trylock: the context is shared by the
   engine's threads); a call that finds them taken starts threads of its
   own. A forked child process has none of them (pid). */
typedef struct ei__pool ei__pool;
typedef struct ei__pool_arg {
    ei__pool *pool;
    int i;              /* worker i runs share i + 1 */
    unsigned long gen0; /* the dispatch count when it was started */
} ei__pool_arg;
struct ei__pool {
    pthread_mutex_t owner, m; /* m guards what follows */
    pthread_cond_t go, done;
    ei__share *shares;        /* the running call's slots */
    unsigned long gen;        /* calls dispatched */
    int n, active, pending, quit;
    pid_t pid;
    pthread_t tid[EI__MAX_THREADS - 1];
    ei__pool_arg arg[EI__MAX_THREADS - 1];
};
/* Waiting: a short spin first (EI__POOL_SPIN pauses, some tens of us), so
   calls that follow each other closely skip the sleep and the wake-up (on
   the 2-core Zen 5 VM a condition-variable round trip took about 25 us each
   way: 64-key ei_attention_decode_mt on 2 threads 72-77 us with sleeping
   workers, 55-59 us starting threads per call); then the condition
   variable. gen, quit and pending are written under m and read atomically
   outside it. */
#if defined(__GNUC__) || defined(__clang__)
#define EI__POOL_LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define EI__POOL_STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#define EI__POOL_SPIN 2000
#else
#define EI__POOL_LOAD(x) (x)
#define EI__POOL_STORE(x, v) ((x) = (v))
#define EI__POOL_SPIN 0
#endif
static void ei__cpu_relax(void) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    __builtin_ia32_pause();
#elif (defined(__GNUC__) || defined(__clang__)) && (defined(__aarch64__) || defined(__arm__))
    __asm__ __volatile__("yield");
#endif
}
static void *ei__pool_worker(void *a) {
    ei__pool_arg *wa = (ei__pool_arg *)a;
    ei__pool *p = wa->pool;
    unsigned long seen = wa->gen0;
    int k;
    for (;;) {
        for (k = 0; k < EI__POOL_SPIN && EI__POOL_LOAD(p->gen) == seen && !EI__POOL_LOAD(p->quit); ++k) ei__cpu_relax();
        pthread_mutex_lock(&p->m);
        while (EI__POOL_LOAD(p->gen) == seen && !EI__POOL_LOAD(p->quit)) pthread_cond_wait(&p->go, &p->m);
        if (EI__POOL_LOAD(p->quit)) break;
        seen = EI__POOL_LOAD(p->gen);
        if (wa->i < p->active) {
            ei__share *sh = &p->shares[wa->i + 1];
            pthread_mutex_unlock(&p->m);
            ei__share_run(sh);
            pthread_mutex_lock(&p->m);
            EI__POOL_STORE(p->pending, EI__POOL_LOAD(p->pending) - 1);
            if (EI__POOL_LOAD(p->pending) == 0) pthread_cond_signal(&p->done);
        }
        pthread_mutex_unlock(&p->m);
    }
    pthread_mutex_unlock(&p->m);
    return NULL;
}
static ei__pool *ei__pool_open(const ei_allocator *al) {
    ei__pool *p = (ei__pool *)ei__alloc(al, sizeof *p);
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    if (pthread_mutex_init(&p->owner, NULL) != 0) goto no_owner;
    if (pthread_mutex_init(&p->m, NULL) != 0) goto no_m;
    if (pthread_cond_init(&p->go, NULL) != 0) goto no_go;
    if (pthread_cond_init(&p->done, NULL) != 0) goto no_done;
    p->pid = getpid();
    return p;
no_done:
    pthread_cond_destroy(&p->go);
no_go:
    pthread_mutex_destroy(&p->m);
no_m:
    pthread_mutex_destroy(&p->owner);
no_owner:
    ei__free(al, p);
    return NULL;
}
static void ei__pool_close(ei__pool *p, const ei_allocator *al) {
    int k;
    if (!p) return;
    if (p->pid == getpid()) {
        pthread_mutex_lock(&p->m);
        EI__POOL_STORE(p->quit, 1);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->m);
        for (k = 0; k < p->n; ++k) pthread_join(p->tid[k], NULL);
    }
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->go);
    pthread_mutex_destroy(&p->m);
    pthread_mutex_destroy(&p->owner);
    ei__free(al, p);
}
/* Shares sh[0..nth) on the caller and the workers; 0 (nothing run) when the
   workers are another call's or this is a forked child. */
static int ei__pool_run(ei__pool *p, ei__share *sh, int nth) {
    int t;
    if (!p || p->pid != getpid() || pthread_mutex_trylock(&p->owner) != 0) return 0;
    pthread_mutex_lock(&p->m);
    for (; p->n < nth - 1; ++p->n) { /* start the workers this call lacks */
        p->arg[p->n].pool = p;
        p->arg[p->n].i = p->n;
        p->arg[p->n].gen0 = p->gen;
        if (pthread_create(&p->tid[p->n], NULL, ei__pool_worker, &p->arg[p->n]) != 0) break;
    }
    p->active = EI__MIN(p->n, nth - 1);
    p->shares = sh;
    EI__POOL_STORE(p->pending, p->active);
    EI__POOL_STORE(p->gen, p->gen + 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->m);
    ei__share_run(&sh[0]);
    for (t = p->active + 1; t < nth; ++t) ei__share_run(&sh[t]); /* no worker could be started for them */
    for (t = 0; t < EI__POOL_SPIN && EI__POOL_LOAD(p->pending) > 0; ++t) ei__cpu_relax();
    pthread_mutex_lock(&p->m);
    while (EI__POOL_LOAD(p->pending) > 0) pthread_cond_wait(&p->done, &p->m);
    p->shares = NULL;
    pthread_mutex_unlock(&p->m);
    pthread_mutex_unlock(&p->owner);
    return 1;
}
#endif
static ei_result ei__fork_join(const ei_context *ctx, ei__task_fn task, void *arg, int nth, void *ws, size_t per) {
    int t;
#ifndef EI_NO_PTHREADS
    ei__fork f;
    ei__share sh[EI__MAX_THREADS];
    ei_result r = EI_OK;
    f.task = task; f.arg = arg; f.ws = (unsigned char *)ws; f.per = per; f.nth = nth; f.failed_ith = -1;
    if (pthread_mutex_init(&f.lock, NULL) != 0) { /* no lock, no threads: every share on this one */
        for (t = 0; t < nth; ++t)
            if ((r = task(arg, t, nth, ws ? (unsigned char *)ws + per * (size_t)t : NULL, per)) != EI_OK) return r;
        return EI_OK;
    }
    for (t = 0; t < nth; ++t) { sh[t].fork = &f; sh[t].ith = t; sh[t].started = 0; sh[t].result = EI_OK; }
    if (nth == 1) ei__share_run(&sh[0]);
    else if (!ei__pool_run(ctx ? ctx->pool : NULL, sh, nth)) { /* threads of this call's own */
        for (t = 1; t < nth; ++t) sh[t].started = pthread_create(&sh[t].tid, NULL, ei__share_run, &sh[t]) == 0;
        ei__share_run(&sh[0]);
        for (t = 1; t < nth; ++t) {
            if (sh[t].started) pthread_join(sh[t].tid, NULL);
            else ei__share_run(&sh[t]);
        }
    }
    pthread_mutex_destroy(&f.lock);
    if (f.failed_ith >= 0) {
        memcpy(ei__tls_message, f.message, sizeof f.message);
        r = sh[f.failed_ith].result;
    }
    return r;
#else
    (void)ctx;
    for (t = 0; t < nth; ++t) {
        ei_result r = task(arg, t, nth, ws ? (unsigned char *)ws + per * (size_t)t : NULL, per);
        if (r != EI_OK) return r;
    }
    return EI_OK;
#endif
}

// >>convert: f16 / bf16 <-> f32, bit-exact and portable ---------------------
static float ei__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t ei__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static float ei__bf16_to_f32(uint16_t h) { return ei__bits_f32((uint32_t)h << 16); }
static uint16_t ei__f32_to_bf16(float f) {
    uint32_t u = ei__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* nearest even */
    return (uint16_t)(u >> 16);
}
static float ei__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return ei__bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float f = (float)man * (1.0f / 16777216.0f); /* man * 2^-24, exact */
        return sign ? -f : f;
    }
    return ei__bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}
static uint16_t ei__f32_to_f16(float f) {
    uint32_t u = ei__f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);           /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* overflow -> Inf */
    if (a < 0x38800000u) {                                            /* subnormal or zero */
        float m = ei__bits_f32(a) * 16777216.0f;                      /* scaled to 2^-24 units */
        uint32_t r = (uint32_t)m;
        float frac = m - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    a += 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return (uint16_t)(sign | (a >> 13));
}
/* One element of a view as f32. */
static float ei__load1(const void *base, ei_dtype dt, int64_t i) {
    switch (dt) {
        case EI_F16: return ei__f16_to_f32(((const uint16_t *)base)[i]);
        case EI_BF16: return ei__bf16_to_f32(((const uint16_t *)base)[i]);
        default: return ((const float *)base)[i];
    }
}
EI__MAYBE_UNUSED static void ei__store1(void *base, ei_dtype dt, int64_t i, float v) {
    switch (dt) {
        case EI_F16: ((uint16_t *)base)[i] = ei__f32_to_f16(v); break;
        case EI_BF16: ((uint16_t *)base)[i] = ei__f32_to_bf16(v); break;
        default: ((float *)base)[i] = v; break;
    }
}
static size_t ei__dtype_size(ei_dtype dt) { return dt == EI_F32 ? 4 : 2; }
/* Pointer to row (token t, head h) of a view, in elements of its dtype. */
static const void *ei__row(const ei_tensor *t, int64_t tok, int32_t head) {
    return (const unsigned char *)t->data +
           (size_t)(tok * t->token_stride + (int64_t)head * t->head_stride) * ei__dtype_size(t->dtype);
}
/* A row of any dtype into f32. */
static void ei__row_to_f32(const void *row, ei_dtype dt, int32_t d, float *out) {
    int32_t i;
    if (dt == EI_F32) { memcpy(out, row, (size_t)d * 4u); return; }
    for (i = 0; i < d; ++i) out[i] = ei__load1(row, dt, i);
}

static void *ei__row_out(const ei_out_tensor *t, int64_t tok, int32_t head) {
    return (unsigned char *)t->data +
           (size_t)(tok * t->token_stride + (int64_t)head * t->head_stride) * ei__dtype_size(t->dtype);
}

// >>cpu-features ------------------------------------------------------------
#if defined(EI__HAVE_AVX2) || defined(EI__HAVE_AVX512)
static uint64_t ei__xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif
#ifdef EI__HAVE_AMX
/* Linux enables the 8 KB AMX tile state per process on request
   (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, 18); without it the first
   tile instruction raises SIGILL. Asked only where the CPU has AMX: it makes
   the process's signal frames about 8 KB larger (an alternate signal stack
   must hold them; the kernel refuses the request if one is too small, and
   then the AMX path is simply not offered). Granting is idempotent. The
   system call is made directly (arch_prctl is 158 on x86-64): libc's
   syscall() is not declared in strict C99 builds. */
static int ei__amx_permitted(void) {
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(158L), "D"(0x1023L /* ARCH_REQ_XCOMP_PERM */), "S"(18L /* XFEATURE_XTILEDATA */)
                     : "rcx", "r11", "memory");
    return ret == 0;
}
#endif
/* Bit i of the result: path i can run (the compiler emitted it and the CPU
   and OS support it). Computed fresh: cpuid is cheap and this avoids a
   mutable global. */
static unsigned ei__cpu_paths(void) {
    unsigned paths = 1u << EI_SIMD_SCALAR;
#if defined(EI__HAVE_AVX2) || defined(EI__HAVE_AVX512)
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
        uint64_t xcr0 = osxsave ? ei__xgetbv0() : 0;
        int ymm_os = (xcr0 & 6) == 6, zmm_os = (xcr0 & 0xe6) == 0xe6;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1,
                vl = (b >> 31) & 1;
#ifdef EI__HAVE_AVX2
            if (ymm_os && avx2 && fma && f16c) paths |= 1u << EI_SIMD_AVX2;
#endif
#ifdef EI__HAVE_AVX512
            if (zmm_os && avx2 && fma && f16c && f && dq && bw && vl) paths |= 1u << EI_SIMD_AVX512;
#endif
#ifdef EI__HAVE_AVX512BF16 /* AVX512_BF16: cpuid leaf 7 subleaf 1, EAX bit 5 */
            {
                unsigned edx7 = d; /* leaf 7 subleaf 0 */
                if (((paths >> EI_SIMD_AVX512) & 1u) && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1u)) {
                    paths |= 1u << EI_SIMD_AVX512_BF16;
#ifdef EI__HAVE_AMX /* AMX-TILE, AMX-BF16: leaf 7 EDX bits 24, 22; XCR0 bits 17-18; the process's permission
                       (the AMX table runs AVX512_BF16 stages around its tiles) */
                    if (((edx7 >> 24) & 1u) && ((edx7 >> 22) & 1u) && (xcr0 & 0x60000u) == 0x60000u && ei__amx_permitted())
                        paths |= 1u << EI_SIMD_AMX;
#endif
                }
                (void)edx7;
            }
#endif
            (void)avx2; (void)f; (void)dq; (void)bw; (void)vl; (void)zmm_os; (void)ymm_os;
        }
    }
#endif
#ifdef EI__HAVE_NEON
#ifdef EI__HAVE_AUXV
    /* Linux: the kernel's hwcaps, so a binary built elsewhere decides on the
       CPU it runs on. HWCAP_ASIMD is bit 1 of AT_HWCAP (the kernel's ABI;
       spelled out because older libcs' headers lack the name). */
    if (getauxval(AT_HWCAP) & (1ul << 1)) paths |= 1u << EI_SIMD_NEON;
#ifdef EI__HAVE_NEON_BF16 /* HWCAP2_BF16: bit 14 of AT_HWCAP2 (BFDOT and BFMMLA) */
    if (((paths >> EI_SIMD_NEON) & 1u) && (getauxval(AT_HWCAP2) & (1ul << 14)))
        paths |= (1u << EI_SIMD_NEON_BF16) | (1u << EI_SIMD_NEON_BFMMLA);
#endif
#ifdef EI__HAVE_NEON_FHM /* HWCAP_ASIMDHP (bit 10: FP16 vector arithmetic) and HWCAP_ASIMDFHM (bit 23: FMLAL) */
    if (((paths >> EI_SIMD_NEON) & 1u) && (getauxval(AT_HWCAP) & (1ul << 10)) && (getauxval(AT_HWCAP) & (1ul << 23)))
        paths |= 1u << EI_SIMD_NEON_FHM;
#endif
#else
    /* elsewhere the compile-time fact: the compiler targets AArch64 with
       Advanced SIMD (__ARM_NEON), which every such CPU has; BF16 only where
       the build targets it */
    paths |= 1u << EI_SIMD_NEON;
#if defined(EI__HAVE_NEON_BF16) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
    paths |= (1u << EI_SIMD_NEON_BF16) | (1u << EI_SIMD_NEON_BFMMLA);
#endif
#if defined(EI__HAVE_NEON_FHM) && defined(__ARM_FEATURE_FP16_FML)
    paths |= 1u << EI_SIMD_NEON_FHM;
#endif
#endif
#endif
    return paths;
}
/* The int8 dot product of EI_RANK_PRECISION_INT8's x86 scores: vpdpbusd on
   zmm (AVX512_VNNI: cpuid leaf 7 ECX bit 11, with the avx512 path), on ymm
   (AVX-VNNI: leaf 7 subleaf 1 EAX bit 4, with the avx2 path), else int8
   widened to int16 and vpmaddwd (exact: vpmaddubsw would saturate). Bits
   of the result: the dots this CPU has; a path's kernels take the widest
   their ISA allows (>>isa-avx2, >>isa-avx512); every one gives the same
   int32 sums. */
enum { EI__I8DOT_WIDEN = 0, EI__I8DOT_AVXVNNI = 1, EI__I8DOT_AVX512VNNI = 2 };
static int ei__cpu_i8dot(void) {
    int dot = EI__I8DOT_WIDEN;
#if (defined(EI__HAVE_AVX512VNNI) || defined(EI__HAVE_AVXVNNI))
    unsigned paths = ei__cpu_paths(), a, b, c, d;
#ifdef EI__HAVE_AVXVNNI
    if (((paths >> EI_SIMD_AVX2) & 1u) && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1u))
        dot = EI__I8DOT_AVXVNNI;
#endif
#ifdef EI__HAVE_AVX512VNNI
    if (((paths >> EI_SIMD_AVX512) & 1u) && __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((c >> 11) & 1u))
        dot |= EI__I8DOT_AVX512VNNI;
#endif
    (void)paths; (void)a; (void)b; (void)c; (void)d;
#endif
    return dot;
}
EIDEF int ei_cpu_supports(ei_simd path) {
    if (path == EI_SIMD_AUTO) return 1;
    if ((int)path < 0 || (int)path > EI_SIMD_NEON_BFMMLA) return 0;
    return (ei__cpu_paths() >> path) & 1u;
}
EIDEF const char *ei_simd_name(ei_simd path) {
    switch (path) {
        case EI_SIMD_AUTO: return "auto";
        case EI_SIMD_SCALAR: return "scalar";
        case EI_SIMD_AVX2: return "avx2";
        case EI_SIMD_AVX512: return "avx512";
        case EI_SIMD_NEON: return "neon";
        case EI_SIMD_AVX512_BF16: return "avx512-bf16";
        case EI_SIMD_AMX: return "amx";
        case EI_SIMD_NEON_BF16: return "neon-bf16";
        case EI_SIMD_NEON_FHM: return "neon-fhm";
        case EI_SIMD_NEON_BFMMLA: return "neon-bfmmla";
        default: return "unknown";
    }
}

// >>validate ----------------------------------------------------------------
/* A view is valid when its sizes are within limits, its strides positive and
   non-aliasing: sorted by stride, each axis must step over the whole extent of
   the axes inside it. */
/* The names of a view's three axes in messages, and the inner one's limit:
   an ei_tensor's (tokens, heads, head_dim) or an ei_mask's (rows, heads, keys). */
typedef struct ei__axes {
    const char *outer, *inner, *outer_stride, *unit;
    int64_t inner_max;
} ei__axes;
static const ei__axes ei__tensor_axes = {"n_tokens", "head_dim", "token", "dims", EI_MAX_HEAD_DIM};
static ei_result ei__check_view_axes(const ei_context *ctx, const void *data, ei_dtype dtype, int64_t n_tokens,
                                     int32_t n_heads, int64_t head_dim, int64_t ts, int64_t hs, const char *name,
                                     const ei__axes *ax) {
    int64_t s_in, n_in, s_out, n_out, extent;
    if (!data) return ei__fail(ctx, EI_ERR_NULL, "%s: data is NULL", name);
    if (dtype != EI_F32 && dtype != EI_F16 && dtype != EI_BF16)
        return ei__fail(ctx, EI_ERR_DTYPE, "%s: dtype %d is not EI_F32, EI_F16 or EI_BF16", name, (int)dtype);
    if (n_tokens <= 0 || n_tokens > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "%s: %s %lld not in 1..%lld", name, ax->outer, (long long)n_tokens,
                        (long long)EI_MAX_TOKENS);
    if (n_heads <= 0 || n_heads > EI_MAX_HEADS)
        return ei__fail(ctx, EI_ERR_SIZE, "%s: n_heads %d not in 1..%d", name, (int)n_heads, EI_MAX_HEADS);
    if (head_dim <= 0 || head_dim > ax->inner_max)
        return ei__fail(ctx, EI_ERR_SIZE, "%s: %s %lld not in 1..%lld", name, ax->inner, (long long)head_dim,
                        (long long)ax->inner_max);
    if (ts <= 0 || hs <= 0)
        return ei__fail(ctx, EI_ERR_STRIDE, "%s: strides must be positive (%s %lld, head %lld)", name, ax->outer_stride,
                        (long long)ts, (long long)hs);
    /* strides count elements, so an aligned first element aligns them all */
    if ((uintptr_t)data % ei__dtype_size(dtype) != 0)
        return ei__fail(ctx, EI_ERR_ALIGN, "%s: data at %p is not aligned to its %d-byte elements", name, data,
                        (int)ei__dtype_size(dtype));
    /* The farthest element, (n_tokens-1)*ts + (n_heads-1)*hs + head_dim, must
       stay below 2^60 elements and its byte offset within PTRDIFF_MAX, so that
       byte offsets fit in ptrdiff_t and size_t: with a 32-bit size_t that is
       2 GiB, far below 2^60 elements. And the view may not run past the top
       of the address space (a region's end, data + bytes, must not wrap). */
    {
        int64_t limit = (int64_t)1 << 60, span_t = n_tokens - 1, span_h = (int64_t)n_heads - 1;
        uint64_t byte_limit = (uint64_t)PTRDIFF_MAX / ei__dtype_size(dtype); /* 2^61 / 2^62, or 2^29 / 2^30 on 32-bit */
        if ((uint64_t)limit > byte_limit) limit = (int64_t)byte_limit;
        if ((span_t > 0 && ts > limit / span_t) || (span_h > 0 && hs > limit / span_h) ||
            span_t * ts > limit - span_h * hs - head_dim)
            return ei__fail(ctx, EI_ERR_OVERFLOW, "%s: strides (%s %lld, head %lld) reach past %lld elements", name,
                            ax->outer_stride, (long long)ts, (long long)hs, (long long)limit);
        if ((uint64_t)(UINTPTR_MAX - (uintptr_t)data) <
            (uint64_t)(span_t * ts + span_h * hs + head_dim) * ei__dtype_size(dtype))
            return ei__fail(ctx, EI_ERR_OVERFLOW, "%s: %p plus the view's extent runs past the end of the address space",
                            name, data);
    }
    if (hs <= ts) { s_in = hs; n_in = n_heads; s_out = ts; n_out = n_tokens; }
    else { s_in = ts; n_in = n_tokens; s_out = hs; n_out = n_heads; }
    extent = s_in * (n_in - 1) + head_dim;
    if ((n_in > 1 && s_in < head_dim) || (n_out > 1 && s_out < extent))
        return ei__fail(ctx, EI_ERR_STRIDE,
                        "%s: strides (%s %lld, head %lld) make elements alias for %lld %ss x %d heads x %lld %s",
                        name, ax->outer_stride, (long long)ts, (long long)hs, (long long)n_tokens, ax->outer_stride,
                        (int)n_heads, (long long)head_dim, ax->unit);
    return EI_OK;
}
static ei_result ei__check_view(const ei_context *ctx, const void *data, ei_dtype dtype, int64_t n_tokens,
                                int32_t n_heads, int32_t head_dim, int64_t ts, int64_t hs, const char *name) {
    return ei__check_view_axes(ctx, data, dtype, n_tokens, n_heads, head_dim, ts, hs, name, &ei__tensor_axes);
}
static ei_result ei__check_tensor(const ei_context *ctx, const ei_tensor *t, const char *name) {
    if (!t) return ei__fail(ctx, EI_ERR_NULL, "%s is NULL", name);
    return ei__check_view(ctx, t->data, t->dtype, t->n_tokens, t->n_heads, t->head_dim, t->token_stride,
                          t->head_stride, name);
}
/* A view of a buffer the library writes, to check it like any other. */
static ei_tensor ei__as_view(const ei_out_tensor *t) {
    ei_tensor v;
    v.data = t->data; v.dtype = t->dtype; v.n_heads = t->n_heads; v.head_dim = t->head_dim;
    v.n_tokens = t->n_tokens; v.token_stride = t->token_stride; v.head_stride = t->head_stride;
    return v;
}
static ei_result ei__check_out_tensor(const ei_context *ctx, const ei_out_tensor *t, const char *name) {
    ei_tensor v;
    if (!t) return ei__fail(ctx, EI_ERR_NULL, "%s is NULL", name);
    v = ei__as_view(t);
    return ei__check_tensor(ctx, &v, name);
}
/* ---- overlaps, alignment, sealed layouts
   The README promises that bad input never makes the library write outside a
   caller's buffer. Three things a careless caller can do break that unless
   every call checks them:
   - place one buffer over another (an output over the plan it is reading, a
     keep-set array inside the workspace, K and V the same cache): every call
     lists the regions it reads and writes and refuses any pair that
     intersects where one of the two is written (EI_ERR_OVERLAP, naming both).
     Read-only regions may share memory (Q and K in one buffer). A view's
     region is its address range, except that two views of the same dtype and
     strides are compared element by element, so interleaved layouts (K and V
     rows alternating in one buffer) pass;
   - hand view data at an address that is not a multiple of its element size
     (f32 loaded as float would be undefined behaviour): EI_ERR_ALIGN, and
     the same for the caller's int32/float arrays. Plan, decoder and workspace
     memory may have any alignment (the library aligns inside them);
   - edit a plan's or decoder's size fields or pointers after init: their
     layout fields are sealed with a checksum at init and every call checks
     it (EI_ERR_STATE), then checks the fields that calls change against the
     capacity the memory was laid out for. */
#define EI__MAX_REGIONS 16
typedef struct ei__region {
    const void *p;
    size_t bytes;
    const char *name;
    int written;
    const ei_tensor *view; /* the view whose data this is, or NULL */
} ei__region;
typedef struct ei__regions {
    ei__region r[EI__MAX_REGIONS];
    ei_tensor views[EI__MAX_REGIONS]; /* copies of out tensors as read views */
    int n;
} ei__regions;

static void ei__reg_mem(ei__regions *g, const void *p, size_t bytes, const char *name, int written) {
    EI_ASSERT(g->n < EI__MAX_REGIONS);
    if (!p || !bytes || g->n >= EI__MAX_REGIONS) return;
    g->r[g->n].p = p; g->r[g->n].bytes = bytes; g->r[g->n].name = name; g->r[g->n].written = written;
    g->r[g->n].view = NULL;
    g->n++;
}
/* Bytes from a checked view's first element to the end of its farthest. */
static size_t ei__view_bytes(const ei_tensor *t) {
    return (size_t)((t->n_tokens - 1) * t->token_stride + (int64_t)(t->n_heads - 1) * t->head_stride + t->head_dim) *
           ei__dtype_size(t->dtype);
}
/* A checked view's data, and the struct that describes it (read throughout
   the call, so nothing may be written over it either). */
/* The workspace a call registers for its overlap checks. A call in parts
   registers every part's share (>>exec sets the span on the part's thread
   for the call): a part cannot see how the others use the buffer they
   share, so an output, q or plan lying in another part's share is refused
   by every part, before any writes, as a call on threads refuses it. */
typedef struct ei__span { const void *p; size_t bytes; } ei__span;
static EI__TLS ei__span ei__tls_ws_span;
static void ei__reg_workspace(ei__regions *g, const void *workspace, size_t bytes) {
    if (ei__tls_ws_span.p) ei__reg_mem(g, ei__tls_ws_span.p, ei__tls_ws_span.bytes, "the workspace (every part's share)", 1);
    else ei__reg_mem(g, workspace, bytes, "the workspace", 1);
}
static void ei__reg_view(ei__regions *g, const ei_tensor *t, const char *name, const char *struct_name, int written) {
    int i = g->n;
    ei__reg_mem(g, t->data, ei__view_bytes(t), name, written);
    if (g->n > i) { g->views[i] = *t; g->r[i].view = &g->views[i]; }
    ei__reg_mem(g, t, sizeof *t, struct_name, 0);
}
static void ei__reg_out_view(ei__regions *g, const ei_out_tensor *t, const char *name, const char *struct_name) {
    int i = g->n;
    ei_tensor v = ei__as_view(t);
    ei__reg_mem(g, t->data, ei__view_bytes(&v), name, 1);
    if (g->n > i) { g->views[i] = v; g->r[i].view = &g->views[i]; }
    ei__reg_mem(g, t, sizeof *t, struct_name, 0);
}

static int64_t ei__floor_div(int64_t a, int64_t b) { int64_t q = a / b; return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q; }
static int64_t ei__ceil_div_s(int64_t a, int64_t b) { return -ei__floor_div(-a, b); }
/* Whether two views of one dtype, strides and head_dim share an element:
   whether b's offset from a, D elements, is dt*ts + dh*hs + di for some
   dt in (-nt_b, nt_a), dh in (-nh_b, nh_a), di in (-d, d). The axes nest
   (each steps over the extent of the one inside it), so few outer steps
   can reach D; past 64 candidates the answer is a conservative yes. */
static int ei__views_share_element(const ei_tensor *a, const ei_tensor *b) {
    int64_t es = (int64_t)ei__dtype_size(a->dtype), diff = (int64_t)((intptr_t)b->data - (intptr_t)a->data), D;
    int64_t s_in, in_lo, in_hi, s_out, out_lo, out_hi, d = a->head_dim, lo, hi, o, o0, o1;
    if (diff % es != 0) return 1;
    D = diff / es;
    if (a->head_stride <= a->token_stride) {
        s_in = a->head_stride; in_lo = 1 - (int64_t)b->n_heads; in_hi = (int64_t)a->n_heads - 1;
        s_out = a->token_stride; out_lo = 1 - b->n_tokens; out_hi = a->n_tokens - 1;
    } else {
        s_in = a->token_stride; in_lo = 1 - b->n_tokens; in_hi = a->n_tokens - 1;
        s_out = a->head_stride; out_lo = 1 - (int64_t)b->n_heads; out_hi = (int64_t)a->n_heads - 1;
    }
    lo = in_lo * s_in - (d - 1); /* the inner steps reach [lo, hi] */
    hi = in_hi * s_in + (d - 1);
    o0 = EI__MAX(out_lo, ei__ceil_div_s(D - hi, s_out));
    o1 = EI__MIN(out_hi, ei__floor_div(D - lo, s_out));
    if (o1 - o0 > 64) return 1;
    for (o = o0; o <= o1; ++o) {
        int64_t rem = D - o * s_out;
        int64_t i0 = EI__MAX(in_lo, ei__ceil_div_s(rem - (d - 1), s_in)), i1 = EI__MIN(in_hi, ei__floor_div(rem + (d - 1), s_in));
        if (i0 <= i1) return 1;
    }
    return 0;
}
static int ei__same_layout(const ei_tensor *a, const ei_tensor *b) {
    return a->dtype == b->dtype && a->head_dim == b->head_dim && a->token_stride == b->token_stride &&
           a->head_stride == b->head_stride;
}
/* Every pair of a call's regions where one is written: disjoint. */
static ei_result ei__check_regions(const ei_context *ctx, const ei__regions *g) {
    int i, j;
    for (i = 0; i < g->n; ++i)
        for (j = i + 1; j < g->n; ++j) {
            const ei__region *a = &g->r[i], *b = &g->r[j];
            uintptr_t a0 = (uintptr_t)a->p, b0 = (uintptr_t)b->p;
            if (!a->written && !b->written) continue;
            if (!(a0 < b0 + b->bytes && b0 < a0 + a->bytes)) continue;
            if (a->view && b->view && ei__same_layout(a->view, b->view) && !ei__views_share_element(a->view, b->view))
                continue;
            return ei__fail(ctx, EI_ERR_OVERLAP, "%s [%p, +%zu bytes) overlaps %s [%p, +%zu bytes) and the call writes %s",
                            a->name, a->p, a->bytes, b->name, b->p, b->bytes, a->written ? a->name : b->name);
        }
    /* the context is read by every call (its configuration, kernels, workers) */
    for (i = 0; ctx && i < g->n; ++i) {
        uintptr_t a0 = (uintptr_t)g->r[i].p, c0 = (uintptr_t)ctx;
        if (g->r[i].written && a0 < c0 + sizeof *ctx && c0 < a0 + g->r[i].bytes)
            return ei__fail(ctx, EI_ERR_OVERLAP, "%s [%p, +%zu bytes) overlaps the ei_context [%p, +%zu bytes) and the call writes %s",
                            g->r[i].name, g->r[i].p, g->r[i].bytes, (const void *)ctx, sizeof *ctx, g->r[i].name);
    }
    return EI_OK;
}
/* A caller's int32 / float array: 4-byte aligned. */
static ei_result ei__check_align4(const ei_context *ctx, const void *p, const char *name) {
    if ((uintptr_t)p % 4u != 0)
        return ei__fail(ctx, EI_ERR_ALIGN, "%s at %p is not 4-byte aligned", name, p);
    return EI_OK;
}

/* FNV-1a over the fields that fix a plan's or decoder's memory layout. */
static uint64_t ei__fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
#define EI__FNV_FIELD(h, x) ((h) = ei__fnv((h), &(x), sizeof(x)))
static uint64_t ei__plan_seal(const ei_plan *p) {
    uint64_t h = 14695981039346656037ull;
    EI__FNV_FIELD(h, p->max_tokens); EI__FNV_FIELD(h, p->n_kv_heads); EI__FNV_FIELD(h, p->head_dim);
    EI__FNV_FIELD(h, p->max_keep); EI__FNV_FIELD(h, p->segment_size); EI__FNV_FIELD(h, p->block_size);
    EI__FNV_FIELD(h, p->flags); EI__FNV_FIELD(h, p->entropy); EI__FNV_FIELD(h, p->head_class);
    EI__FNV_FIELD(h, p->budget); EI__FNV_FIELD(h, p->keep_blocks); EI__FNV_FIELD(h, p->keep_count);
    EI__FNV_FIELD(h, p->block_index); EI__FNV_FIELD(h, p->scores); EI__FNV_FIELD(h, p->state);
    EI__FNV_FIELD(h, p->on_device); EI__FNV_FIELD(h, p->seg_capacity); EI__FNV_FIELD(h, p->blk_capacity);
    EI__FNV_FIELD(h, p->owned_memory); /* what ei_plan_free hands back to the allocator */
    return h | 1u; /* never 0: a zeroed plan is not sealed */
}
static uint64_t ei__decoder_seal(const ei_decoder *d) {
    uint64_t h = 14695981039346656037ull;
    EI__FNV_FIELD(h, d->n_heads); EI__FNV_FIELD(h, d->n_kv_heads); EI__FNV_FIELD(h, d->head_dim);
    EI__FNV_FIELD(h, d->window); EI__FNV_FIELD(h, d->queries); EI__FNV_FIELD(h, d->accumulated);
    EI__FNV_FIELD(h, d->n_positions);
    return h | 1u;
}

/* Q and K of one layer: same head_dim, GQA grouping. */
static ei_result ei__check_qk(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k) {
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if ((r = ei__check_tensor(ctx, q, "q")) != EI_OK) return r;
    if ((r = ei__check_tensor(ctx, k, "k")) != EI_OK) return r;
    if (q->head_dim != k->head_dim)
        return ei__fail(ctx, EI_ERR_SHAPE, "q head_dim %d != k head_dim %d", (int)q->head_dim, (int)k->head_dim);
    if (q->n_heads % k->n_heads != 0)
        return ei__fail(ctx, EI_ERR_GQA, "n_heads %d is not a multiple of n_kv_heads %d", (int)q->n_heads,
                        (int)k->n_heads);
    return EI_OK;
}

EIDEF ei_tensor ei_tensor_make(const void *data, ei_dtype dtype, int64_t n_tokens, int32_t n_heads,
                               int32_t head_dim) {
    ei_tensor t;
    memset(&t, 0, sizeof t); /* padding too: a caller may copy, hash or compare views bytewise */
    t.data = data; t.dtype = dtype; t.n_heads = n_heads; t.head_dim = head_dim; t.n_tokens = n_tokens;
    t.head_stride = head_dim; t.token_stride = (int64_t)n_heads * head_dim;
    return t;
}
EIDEF ei_out_tensor ei_out_tensor_make(void *data, ei_dtype dtype, int64_t n_tokens, int32_t n_heads,
                                       int32_t head_dim) {
    ei_out_tensor t;
    memset(&t, 0, sizeof t); /* padding too: a caller may copy, hash or compare views bytewise */
    t.data = data; t.dtype = dtype; t.n_heads = n_heads; t.head_dim = head_dim; t.n_tokens = n_tokens;
    t.head_stride = head_dim; t.token_stride = (int64_t)n_heads * head_dim;
    return t;
}

// >>config ------------------------------------------------------------------
EIDEF ei_config ei_config_default(void) {
    ei_config c;
    memset(&c, 0, sizeof c);
    c.segment_size = 512;
    c.block_size = 8;
    c.threshold_len = 4096;
    c.base_budget = 2048;
    c.rigid_entropy = 1e-5;
    c.delta_t = 0.4;
    c.alpha = 0.5;
    c.budget_min_factor = 1.0f;
    c.budget_max_factor = 3.0f;
    c.last_segment_dense = 1;
    c.per_segment_budget = 0;
    c.ranking = EI_RANK_REFERENCE;
    c.rank_samples = 64;
    c.top_p = 0.0;
    c.sink_blocks = 0;
    c.local_blocks = 0;
    c.attn_scale = 0.0f;
    c.decode_budget = 1024;
    c.window = 32;
    c.decode_gap = 16;
    c.pool = EI_POOL_AVG;
    c.pool_kernel = 5;
    c.per_kv_head = 1;
    c.gqa_reduce = EI_REDUCE_MEAN;
    c.recompress_every = 0;
    c.decode_scale = 0.0f;
    c.decode_policy = EI_DECODE_ENTROPYINFER;
    c.decode_sink = 4;        /* StreamingLLM's four attention sinks */
    c.decode_budget_ratio = 0.0;
    c.decode_budget_min = 128; /* see CONCEPTS: decode budget */
    c.decode_positions = 0;
    c.decode_shared_weight = EI_SHARED_EQUAL;
    c.decode_recent = 0.0f;   /* the paper's: only the window's positions are kept by recency */
    c.simd = EI_SIMD_AUTO;
    c.backend = EI_BACKEND_CPU;
    c.rank_precision = EI_RANK_PRECISION_F32;
    c.rank_rows = EI_RANK_ROWS_EVEN;
    return c;
}

/* The values measured best on real models (docs/quality.md, "Block ranking beyond
   the paper", "Spread rows on the GPU: the preset" and "int8 scores on the
   GPU"): the paper's segments, blocks, threshold and base budget, the sampled
   ranking of 128 farthest-point rows scored in int8 (Gemma 3 270M at 32k
   against 64 even rows in f32: perplexity -0.08% / +1.34% of dense on two
   texts where the even rows gave +0.30% / +5.13%; f32 scores of the same rows
   -0.20% / +2.02% for 1.5x the time), top-p counts (cap 4x base), sink/local
   blocks. */
EIDEF ei_config ei_config_quality(void) {
    ei_config c = ei_config_default();
    c.ranking = EI_RANK_SAMPLED;
    c.rank_samples = 128;
    c.rank_rows = EI_RANK_ROWS_SPREAD;
    c.rank_precision = EI_RANK_PRECISION_INT8;
    c.top_p = 0.95;
    c.sink_blocks = 1;
    c.local_blocks = 8;
    c.budget_max_factor = 4.0; /* top-p counts up to 4x base: at 32k the 3x cap bound most segments */
    return c;
}

static int ei__finite(double x) { return x == x && x - x == 0.0; }

static ei_result ei__check_config(const ei_config *c) {
#define EI__BAD(...) return ei__fail(NULL, EI_ERR_CONFIG, __VA_ARGS__)
    if (c->segment_size <= 0 || c->segment_size > EI_MAX_SEGMENT)
        EI__BAD("segment_size %d not in 1..%d", (int)c->segment_size, EI_MAX_SEGMENT);
    if (c->block_size <= 0 || c->block_size > c->segment_size)
        EI__BAD("block_size %d not in 1..segment_size (%d)", (int)c->block_size, (int)c->segment_size);
    if (c->segment_size % c->block_size != 0)
        EI__BAD("segment_size %d is not a multiple of block_size %d", (int)c->segment_size, (int)c->block_size);
    if (c->threshold_len < 0) EI__BAD("threshold_len %lld is negative", (long long)c->threshold_len);
    if (c->base_budget < 0 || c->base_budget > EI_MAX_BUDGET)
        EI__BAD("base_budget %d not in 0..%d", (int)c->base_budget, EI_MAX_BUDGET);
    if (!ei__finite(c->rigid_entropy) || c->rigid_entropy < 0) EI__BAD("rigid_entropy must be finite and >= 0");
    if (!ei__finite(c->delta_t) || c->delta_t < 0) EI__BAD("delta_t must be finite and >= 0");
    if (!ei__finite(c->alpha) || c->alpha < 0) EI__BAD("alpha must be finite and >= 0");
    if (!ei__finite(c->budget_min_factor) || !ei__finite(c->budget_max_factor) || c->budget_min_factor < 0 ||
        c->budget_max_factor < c->budget_min_factor || c->budget_max_factor > 64.0)
        EI__BAD("budget factors must satisfy 0 <= min (%g) <= max (%g) <= 64", (double)c->budget_min_factor,
                (double)c->budget_max_factor);
    if (c->last_segment_dense != 0 && c->last_segment_dense != 1) EI__BAD("last_segment_dense must be 0 or 1");
    if (c->cuda_deferred_errors != 0 && c->cuda_deferred_errors != 1) EI__BAD("cuda_deferred_errors must be 0 or 1");
    if (c->per_segment_budget != 0 && c->per_segment_budget != 1) EI__BAD("per_segment_budget must be 0 or 1");
    if (c->ranking != EI_RANK_REFERENCE && c->ranking != EI_RANK_SAMPLED && c->ranking != EI_RANK_ANTIDIAGONAL)
        EI__BAD("unknown ranking %d (EI_RANK_REFERENCE, EI_RANK_SAMPLED or EI_RANK_ANTIDIAGONAL)", (int)c->ranking);
    if (c->rank_samples <= 0 || c->rank_samples > EI_MAX_RANK_SAMPLES)
        EI__BAD("rank_samples %d not in 1..%d", (int)c->rank_samples, EI_MAX_RANK_SAMPLES);
    if (c->rank_precision != EI_RANK_PRECISION_F32 && c->rank_precision != EI_RANK_PRECISION_INT8)
        EI__BAD("unknown rank_precision %d (EI_RANK_PRECISION_F32 or EI_RANK_PRECISION_INT8)", (int)c->rank_precision);
    if (c->rank_rows != EI_RANK_ROWS_EVEN && c->rank_rows != EI_RANK_ROWS_SPREAD)
        EI__BAD("unknown rank_rows %d (EI_RANK_ROWS_EVEN or EI_RANK_ROWS_SPREAD)", (int)c->rank_rows);
    if (!ei__finite(c->top_p) || c->top_p < 0 || c->top_p > 1) EI__BAD("top_p must be in 0..1 (0: budgets from the recurrence)");
    if (c->sink_blocks < 0 || c->local_blocks < 0 || c->sink_blocks > EI_MAX_BUDGET || c->local_blocks > EI_MAX_BUDGET)
        EI__BAD("sink_blocks %d / local_blocks %d not in 0..%d", (int)c->sink_blocks, (int)c->local_blocks, EI_MAX_BUDGET);
    /* scales are ~1/sqrt(head_dim); past 1e4 float32 logits overflow for ordinary inputs */
    if (!ei__finite(c->attn_scale) || c->attn_scale < 0 || c->attn_scale > 1e4) EI__BAD("attn_scale must be in 0..1e4 (0: 1/sqrt(head_dim))");
    if (!ei__finite(c->decode_scale) || c->decode_scale < 0 || c->decode_scale > 1e4) EI__BAD("decode_scale must be in 0..1e4 (0: 1/sqrt(head_dim))");
    if (c->window <= 0 || c->window > 65536) EI__BAD("window %d not in 1..65536", (int)c->window);
    if (c->decode_budget < c->window || c->decode_budget > EI_MAX_BUDGET)
        EI__BAD("decode_budget %d not in window (%d)..%d", (int)c->decode_budget, (int)c->window, EI_MAX_BUDGET);
    if (c->decode_gap < 0 || c->decode_gap > c->window)
        EI__BAD("decode_gap %d not in 0..window (%d)", (int)c->decode_gap, (int)c->window);
    if (c->pool != EI_POOL_AVG && c->pool != EI_POOL_MAX && c->pool != EI_POOL_NONE) EI__BAD("unknown pool %d", (int)c->pool);
    if (c->pool != EI_POOL_NONE && (c->pool_kernel <= 0 || c->pool_kernel % 2 == 0 || c->pool_kernel > 1023))
        EI__BAD("pool_kernel %d must be odd, 1..1023", (int)c->pool_kernel);
    if (c->per_kv_head != 0 && c->per_kv_head != 1) EI__BAD("per_kv_head must be 0 or 1");
    if (c->gqa_reduce != EI_REDUCE_MEAN && c->gqa_reduce != EI_REDUCE_MAX) EI__BAD("unknown gqa_reduce %d", (int)c->gqa_reduce);
    if (c->recompress_every < 0) EI__BAD("recompress_every %d is negative", (int)c->recompress_every);
    if (c->decode_policy != EI_DECODE_ENTROPYINFER && c->decode_policy != EI_DECODE_STREAMING &&
        c->decode_policy != EI_DECODE_SNAPKV && c->decode_policy != EI_DECODE_H2O)
        EI__BAD("unknown decode_policy %d", (int)c->decode_policy);
    if (c->decode_sink < 0 || c->decode_sink > EI_MAX_BUDGET) /* (a keep set holds at most b - W of them) */
        EI__BAD("decode_sink %d not in 0..%d", (int)c->decode_sink, EI_MAX_BUDGET);
    if (!ei__finite(c->decode_budget_ratio) || c->decode_budget_ratio < 0 || c->decode_budget_ratio > 1)
        EI__BAD("decode_budget_ratio must be in 0..1 (0: decode_budget)");
    if (c->decode_budget_ratio > 0 && (c->decode_budget_min < c->window || c->decode_budget_min > c->decode_budget))
        EI__BAD("decode_budget_min %d not in window (%d)..decode_budget (%d)", (int)c->decode_budget_min, (int)c->window,
                (int)c->decode_budget);
    if (c->decode_positions < 0 || c->decode_positions > EI_MAX_TOKENS)
        EI__BAD("decode_positions %lld not in 0..%lld", (long long)c->decode_positions, (long long)EI_MAX_TOKENS);
    if (c->decode_shared_weight != EI_SHARED_EQUAL && c->decode_shared_weight != EI_SHARED_ENTROPY)
        EI__BAD("unknown decode_shared_weight %d", (int)c->decode_shared_weight);
    if (!(c->decode_recent >= 0.0f && c->decode_recent <= 1.0f)) /* (NaN fails too) */
        EI__BAD("decode_recent %g not in 0..1", (double)c->decode_recent);
    if (c->decode_policy == EI_DECODE_H2O && c->decode_positions == 0)
        EI__BAD("EI_DECODE_H2O needs decode_positions > 0 (the positions its decoder sums attention for)");
    if ((int)c->simd < 0 || (int)c->simd > EI_SIMD_NEON_BFMMLA) EI__BAD("unknown simd path %d", (int)c->simd);
    if (c->backend != EI_BACKEND_CPU && c->backend != EI_BACKEND_CUDA && c->backend != EI_BACKEND_CUDA_OR_CPU)
        EI__BAD("unknown backend %d", (int)c->backend);
    if ((c->allocator.alloc == NULL) != (c->allocator.free == NULL)) EI__BAD("allocator needs both alloc and free, or neither");
#undef EI__BAD
    return EI_OK;
}

// >>backend: the CUDA plugin, loaded with dlopen -----------------------------
/* A GPU context holds the plugin's table; every public call validates its
   arguments (>>validate and each stage's checks) and then either runs the
   CPU code or calls the table entry of the same name through EI__CUDA, which
   turns a failure into the thread's error message. */
static int ei__on_gpu(const ei_context *ctx) { return ctx && ctx->cuda; }
static const ei_cuda_api *ei__cuda_api_of(const ei_context *ctx) { return ctx->cuda->api; }
static EI__TLS char ei__cuda_msg[EI_CUDA_MSG_SIZE];
static ei_result ei__cuda_result(const ei_context *ctx, const char *entry, ei_result r) {
    return r == EI_OK ? EI_OK : ei__fail(ctx, r, "CUDA %s: %s", entry, ei__cuda_msg);
}
#define EI__CUDA(ctx, entry, ...) \
    (ei__cuda_msg[0] = 0, ei__cuda_result((ctx), #entry, ei__cuda_api_of(ctx)->entry(__VA_ARGS__, ei__cuda_msg)))

#ifndef EI_NO_CUDA_LOADER
#include <dlfcn.h>

/* Try one candidate; on failure append dlerror() to why (bounded). */
static void *ei__cuda_try_open(const char *path, char *why, size_t why_size) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        size_t used = strlen(why);
        if (used + 4 < why_size) snprintf(why + used, why_size - used, "%s%s", used ? "; " : "", e ? e : path);
    }
    return h;
}

/* The library named by cfg.cuda_library or $EI_CUDA_LIBRARY; else the default
   name through the dynamic loader's search path (LD_LIBRARY_PATH, the
   program's RUNPATH, ld.so.cache and the system folders: where `make install`
   puts it); then, with glibc, beside the object that holds this code (the
   program, or the engine's shared library: $ORIGIN, which glibc's dlopen
   expands) and in its ../lib (an installed prefix's bin/ and lib/). Never a
   path relative to the working directory: the folder a program is started in
   must not choose its code. */
static void *ei__cuda_find(const ei_config *c, char *opened, size_t opened_size, char *why, size_t why_size) {
    static const char *const names[] = {EI_CUDA_LIBRARY_NAME
#if defined(__GLIBC__)
                                        , "$ORIGIN/" EI_CUDA_LIBRARY_NAME, "$ORIGIN/../lib/" EI_CUDA_LIBRARY_NAME
#endif
    };
    const char *path = c->cuda_library && c->cuda_library[0] ? c->cuda_library : getenv("EI_CUDA_LIBRARY");
    void *lib = NULL;
    size_t i;
    if (path && path[0]) {
        snprintf(opened, opened_size, "%s", path);
        return ei__cuda_try_open(path, why, why_size);
    }
    for (i = 0; i < sizeof names / sizeof names[0] && !lib; i++) {
        snprintf(opened, opened_size, "%s", names[i]);
        lib = ei__cuda_try_open(names[i], why, why_size);
    }
    return lib;
}

static ei_result ei__cuda_open(ei_context *ctx) {
    char why[1024] = {0}, opened[640] = {0};
    void *lib = ei__cuda_find(&ctx->cfg, opened, sizeof opened, why, sizeof why);
    ei_cuda_get_api_fn get_api;
    const ei_cuda_api *api;
    ei__cuda_state *st;
    if (!lib)
        return ei__fail(ctx, EI_ERR_BACKEND,
                        "CUDA backend: " EI_CUDA_LIBRARY_NAME " not found (set ei_config.cuda_library or "
                        "EI_CUDA_LIBRARY, or install it with 'make cuda install'): %s", why);
    *(void **)(&get_api) = dlsym(lib, EI_CUDA_ENTRY_POINT);
    api = get_api ? get_api(EI_CUDA_ABI_VERSION) : NULL;
    if (!api) {
        dlclose(lib);
        return ei__fail(ctx, EI_ERR_BACKEND, "CUDA backend: '%s' has no entry point %s returning a table", opened,
                        EI_CUDA_ENTRY_POINT);
    }
    if (api->abi_version != EI_CUDA_ABI_VERSION || api->struct_size != (int32_t)sizeof(ei_cuda_api)) {
        ei_result r = ei__fail(ctx, EI_ERR_BACKEND,
                               "CUDA backend: '%s' speaks ABI version %d (a table of %d bytes), this header speaks "
                               "version %d (%d bytes): rebuild the library with this header ('make cuda')",
                               opened, (int)api->abi_version, (int)api->struct_size, EI_CUDA_ABI_VERSION,
                               (int)sizeof(ei_cuda_api));
        dlclose(lib);
        return r;
    }
    ei__cuda_msg[0] = 0;
    if (api->device_check(ei__cuda_msg) != EI_OK) {
        dlclose(lib);
        return ei__fail(ctx, EI_ERR_BACKEND, "CUDA backend: no usable device (%s)", ei__cuda_msg);
    }
    if (!(st = (ei__cuda_state *)ei__alloc(&ctx->alloc, sizeof *st))) {
        dlclose(lib);
        return ei__fail(ctx, EI_ERR_NOMEM, "CUDA backend: out of host memory");
    }
    memset(st, 0, sizeof *st);
    st->library = lib;
    st->api = api;
    snprintf(st->path, sizeof st->path, "%s", opened);
    ctx->cuda = st;
    return EI_OK;
}
static void ei__cuda_close(ei_context *ctx) {
    if (!ctx->cuda) return;
    dlclose(ctx->cuda->library);
    ei__free(&ctx->alloc, ctx->cuda);
    ctx->cuda = NULL;
}
#else /* EI_NO_CUDA_LOADER: no dlopen; a context never holds a plugin */
static ei_result ei__cuda_open(ei_context *ctx) {
    return ei__fail(ctx, EI_ERR_BACKEND, "CUDA backend compiled out (EI_NO_CUDA_LOADER)");
}
static void ei__cuda_close(ei_context *ctx) { (void)ctx; }
#endif

EIDEF ei_result ei_device_alloc(const ei_context *ctx, void **ptr, size_t bytes) {
    if (!ctx || !ptr) return ei__fail(ctx, EI_ERR_NULL, "context or ptr is NULL");
    if (!ei__on_gpu(ctx)) return ei__fail(ctx, EI_ERR_UNSUPPORTED, "device memory needs the CUDA backend");
    return EI__CUDA(ctx, mem_alloc, ptr, bytes);
}
EIDEF void ei_device_free(const ei_context *ctx, void *ptr) {
    if (ei__on_gpu(ctx) && ptr) ei__cuda_api_of(ctx)->mem_free(ptr);
}
EIDEF ei_result ei_device_copy(const ei_context *ctx, void *dst, const void *src, size_t bytes, int kind) {
    if (!ctx || !dst || !src) return ei__fail(ctx, EI_ERR_NULL, "context, dst or src is NULL");
    if (!ei__on_gpu(ctx)) return ei__fail(ctx, EI_ERR_UNSUPPORTED, "device memory needs the CUDA backend");
    if (kind < EI_COPY_DEVICE_TO_HOST || kind > EI_COPY_DEVICE_TO_DEVICE) return ei__fail(ctx, EI_ERR_CONFIG, "copy kind %d", kind);
    if (kind == EI_COPY_DEVICE_TO_DEVICE) { /* (host and device addresses of a copy cannot meet) */
        ei__regions g;
        ei_result r;
        g.n = 0;
        ei__reg_mem(&g, src, bytes, "src", 0);
        ei__reg_mem(&g, dst, bytes, "dst", 1);
        if ((r = ei__check_regions(ctx, &g)) != EI_OK) return r;
    }
    return EI__CUDA(ctx, mem_copy, dst, src, bytes, kind, ctx->cfg.cuda_stream);
}
EIDEF ei_result ei_cuda_status(const ei_context *ctx) {
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (!ei__on_gpu(ctx) || !ctx->cfg.cuda_deferred_errors) return EI_OK; /* nothing is ever deferred */
    return EI__CUDA(ctx, deferred_status, ctx->cfg.cuda_stream);
}
static ei_result ei__check_plan_layout(const ei_context *ctx, const ei_plan *plan); /* >>plan */
static void ei__reg_plan(ei__regions *g, const ei_plan *plan, int written);
EIDEF ei_result ei_plan_copy(const ei_context *ctx, ei_plan *dst, const ei_plan *src, int direction) {
    ei__regions g;
    ei_result r;
    if (!ctx || !dst || !src) return ei__fail(ctx, EI_ERR_NULL, "context, dst or src is NULL");
    if (!ei__on_gpu(ctx)) return ei__fail(ctx, EI_ERR_UNSUPPORTED, "plan copies between host and device need the CUDA backend");
    if (direction < EI_COPY_DEVICE_TO_HOST || direction > EI_COPY_DEVICE_TO_DEVICE)
        return ei__fail(ctx, EI_ERR_CONFIG, "copy direction %d", direction);
    if ((r = ei__check_plan_layout(ctx, dst)) != EI_OK || (r = ei__check_plan_layout(ctx, src)) != EI_OK) return r;
    if (src->on_device != (direction != EI_COPY_HOST_TO_DEVICE) || dst->on_device != (direction != EI_COPY_DEVICE_TO_HOST))
        return ei__fail(ctx, EI_ERR_STATE, "copy direction %d from a %s plan to a %s plan", direction,
                        src->on_device ? "GPU" : "host", dst->on_device ? "GPU" : "host");
    g.n = 0;
    ei__reg_plan(&g, src, 0);
    ei__reg_plan(&g, dst, 1);
    if ((r = ei__check_regions(ctx, &g)) != EI_OK) return r;
    if (dst->max_tokens < src->n_tokens)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "destination plan holds %lld tokens, the source covers %lld",
                        (long long)dst->max_tokens, (long long)src->n_tokens);
    if (dst->n_kv_heads != src->n_kv_heads || dst->segment_size != src->segment_size ||
        dst->block_size != src->block_size)
        return ei__fail(ctx, EI_ERR_SHAPE, "plans differ in kv heads (%d, %d), segment (%d, %d) or block size (%d, %d)",
                        (int)dst->n_kv_heads, (int)src->n_kv_heads, (int)dst->segment_size, (int)src->segment_size,
                        (int)dst->block_size, (int)src->block_size);
    if (dst->seg_capacity < src->n_segments || dst->max_keep < src->max_keep ||
        (src->scores && dst->scores && dst->blk_capacity < src->n_blocks))
        return ei__fail(ctx, EI_ERR_WORKSPACE, "destination plan holds %d segments x %d blocks, the source %d x %d",
                        (int)dst->seg_capacity, (int)dst->max_keep, (int)src->n_segments, (int)src->max_keep);
    return EI__CUDA(ctx, plan_copy, &ctx->cfg, dst, src, direction);
}

// >>context -----------------------------------------------------------------
static const ei__kernels *ei__kernels_for(ei_simd path); /* >>kernels */

EIDEF ei_result ei_context_create(const ei_config *cfg, ei_context **out) {
    ei_config c;
    ei_context *ctx;
    ei_result r;
    if (!out) return ei__fail(NULL, EI_ERR_NULL, "out (ei_context **) is NULL");
    *out = NULL;
    c = cfg ? *cfg : ei_config_default();
    if ((r = ei__check_config(&c)) != EI_OK) {
        if (c.log) c.log(c.log_user_data, r, ei__tls_message);
        return r;
    }
    ctx = (ei_context *)ei__alloc(&c.allocator, sizeof *ctx);
    if (!ctx) return ei__fail(NULL, EI_ERR_NOMEM, "allocating the context (%u bytes)", (unsigned)sizeof *ctx);
    memset(ctx, 0, sizeof *ctx);
    ctx->cfg = c;
    ctx->alloc = c.allocator;
    ctx->backend = EI_BACKEND_CPU;
    if (!(ctx->kern = ei__kernels_for(c.simd))) {
        r = ei__fail(ctx, EI_ERR_UNSUPPORTED, "SIMD path '%s' was forced but this CPU, OS or build lacks it",
                     ei_simd_name(c.simd));
        ei__free(&ctx->alloc, ctx);
        return r;
    }
    ctx->i8dot = ei__cpu_i8dot();
    if (c.backend != EI_BACKEND_CPU) {
        if ((r = ei__cuda_open(ctx)) == EI_OK) ctx->backend = EI_BACKEND_CUDA;
        else if (c.backend == EI_BACKEND_CUDA) {
            ei__free(&ctx->alloc, ctx);
            return r;
        } else if (c.log) { /* EI_BACKEND_CUDA_OR_CPU: say why the CPU runs it */
            char why[600];
            snprintf(why, sizeof why, "EI_BACKEND_CUDA_OR_CPU: running on the CPU (%s)", ei__tls_message);
            c.log(c.log_user_data, EI_OK, why);
        }
    }
#ifndef EI_NO_PTHREADS
    if (ctx->backend == EI_BACKEND_CPU) ctx->pool = ei__pool_open(&ctx->alloc); /* NULL: every call starts its threads */
#endif
    /* ei_context_config tells what runs: the path and the backend chosen */
    ctx->cfg.simd = ctx->kern->simd;
    ctx->cfg.backend = ctx->backend;
    *out = ctx;
    return EI_OK;
}
EIDEF void ei_context_destroy(ei_context *ctx) {
    ei_allocator a;
    if (!ctx) return;
    ei__cuda_close(ctx);
    a = ctx->alloc;
#ifndef EI_NO_PTHREADS
    ei__pool_close(ctx->pool, &a);
#endif
    ei__free(&a, ctx);
}
EIDEF const ei_config *ei_context_config(const ei_context *ctx) { return ctx ? &ctx->cfg : NULL; }

// >>plan --------------------------------------------------------------------
/* Plans are laid out by ei__plan_geometry (under the ABI), the same on both
   backends; here they are checked, placed in memory and cleared. */

/* Per-head chunked state and (EI_PLAN_KEEP_KEYS) its key-block min/max
   store (transposed: [2][head_dim][blks_pad], max first). */
static ei__head_state *ei__plan_states(const ei_plan *p) { return (ei__head_state *)p->state; }
static ei__chunk_geom ei__plan_chunk_geom(const ei_plan *p) {
    ei__chunk_geom g;
    ei__chunk_geometry(p->seg_capacity, ei__round_up(p->blk_capacity > 0 ? p->blk_capacity : 1, 16), p->n_kv_heads,
                       p->head_dim, (p->flags & EI_PLAN_KEEP_KEYS) != 0, &g);
    return g;
}
/* The recurrence row of (kv head, segment). */
static ei__seg_state *ei__plan_seg_state(const ei_plan *p, int32_t kvh, int64_t s) {
    return (ei__seg_state *)((unsigned char *)p->state + ei__plan_chunk_geom(p).seg_rows) +
           (size_t)kvh * (size_t)p->seg_capacity + (size_t)s;
}
/* Head kvh's stored query representation of its open segment ([G][2][d]). */
static float *ei__plan_open_reps(const ei_plan *p, int32_t kvh) {
    return (float *)((unsigned char *)p->state + ei__plan_chunk_geom(p).open_reps) +
           (size_t)kvh * (size_t)EI_MAX_CHUNK_GROUP * 2u * (size_t)p->head_dim;
}
/* Head kvh's sampled block mass of its open segment ([blks_pad]). */
static float *ei__plan_krep(const ei_plan *p, int32_t kvh) {
    int64_t pad = ei__round_up(p->blk_capacity > 0 ? p->blk_capacity : 1, 16);
    return (float *)((unsigned char *)p->state + ei__plan_chunk_geom(p).key_reps) +
           (size_t)kvh * 2u * (size_t)p->head_dim * (size_t)pad;
}
static float *ei__plan_open_mass(const ei_plan *p, int32_t kvh) {
    int64_t pad = ei__round_up(p->blk_capacity > 0 ? p->blk_capacity : 1, 16);
    return (float *)((unsigned char *)p->state + ei__plan_chunk_geom(p).open_mass) + (size_t)kvh * (size_t)pad;
}

/* The arguments of a plan's layout, checked once for both backends. */
static ei_result ei__check_plan_geometry(const ei_context *ctx, int64_t max_tokens, int32_t n_kv_heads,
                                         int32_t head_dim, uint32_t flags, ei__plan_geom *g) {
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (max_tokens <= 0 || max_tokens > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "max_tokens %lld not in 1..%lld", (long long)max_tokens, (long long)EI_MAX_TOKENS);
    if (n_kv_heads <= 0 || n_kv_heads > EI_MAX_HEADS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_kv_heads %d not in 1..%d", (int)n_kv_heads, EI_MAX_HEADS);
    if (head_dim <= 0 || head_dim > EI_MAX_HEAD_DIM)
        return ei__fail(ctx, EI_ERR_SIZE, "head_dim %d not in 1..%d", (int)head_dim, EI_MAX_HEAD_DIM);
    if (flags & ~(EI_PLAN_CHUNKED | EI_PLAN_SCORES | EI_PLAN_KEEP_KEYS))
        return ei__fail(ctx, EI_ERR_CONFIG, "unknown plan flags 0x%x", (unsigned)flags);
    if ((flags & EI_PLAN_KEEP_KEYS) && !(flags & EI_PLAN_CHUNKED))
        return ei__fail(ctx, EI_ERR_CONFIG, "EI_PLAN_KEEP_KEYS is for chunked plans (flags 0x%x)", (unsigned)flags);
    if (!ei__plan_geometry(&ctx->cfg, max_tokens, n_kv_heads, head_dim, flags, g))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "plan of %lld tokens x %d kv heads does not fit in size_t",
                        (long long)max_tokens, (int)n_kv_heads);
    return EI_OK;
}

static ei_result ei__plan_size(const ei_context *ctx, int64_t max_tokens, int32_t n_kv_heads, int32_t head_dim,
                             uint32_t flags, size_t *bytes) {
    ei__plan_geom g;
    ei_result r;
    if (!bytes) return ei__fail(ctx, EI_ERR_NULL, "bytes is NULL");
    *bytes = 0;
    if ((r = ei__check_plan_geometry(ctx, max_tokens, n_kv_heads, head_dim, flags, &g)) != EI_OK) return r;
    *bytes = g.bytes;
    return EI_OK;
}

/* Rows of the [kv][segment] arrays, and the length of a scores row. */
static size_t ei__plan_rows(const ei_plan *p) { return (size_t)p->n_kv_heads * (size_t)p->seg_capacity; }
static size_t ei__plan_score_row(const ei_plan *p) { return (size_t)EI__MAX(p->blk_capacity, 1); }

/* A plan's arrays live where its context computes: host or device memory. */
static ei_result ei__check_plan_side(const ei_context *ctx, const ei_plan *plan) {
    if (plan->on_device == ei__on_gpu(ctx)) return EI_OK;
    return ei__fail(ctx, EI_ERR_STATE, "a %s plan on a %s context", plan->on_device ? "GPU" : "host",
                    ei__on_gpu(ctx) ? "GPU" : "CPU");
}

/* Bytes of a sealed plan's arrays, from its first to the end of its last. */
static size_t ei__plan_extent(const ei_plan *p) {
    size_t rows = ei__plan_rows(p);
    const unsigned char *end;
    if (p->state) end = (const unsigned char *)p->state + ei__plan_chunk_geom(p).bytes;
    else if (p->scores) end = (const unsigned char *)(p->scores + rows * ei__plan_score_row(p));
    else end = (const unsigned char *)(p->block_index + rows * (size_t)p->max_keep);
    return (size_t)(end - (const unsigned char *)p->entropy);
}
/* Whether [p, p + bytes) and [base, base + extent) share a byte. */
static int ei__ranges_meet(const void *p, size_t bytes, const void *base, size_t extent) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
    return a < b + extent && b < a + bytes;
}
/* A plan as ei_plan_init laid it out (sealed layout fields), with the counts
   calls change within the capacity its memory was laid out for. Every call
   that takes a plan starts here, so an edited or never-initialised plan is
   refused before any of its arrays is read. The counts are not read by
   profiling calls on kv-head ranges that exclude kv head 0: the call with kv
   head 0 writes them while the others run (ei__check_plan_seal only). */
static ei_result ei__check_plan_seal(const ei_context *ctx, const ei_plan *plan) {
    if (!plan || !plan->entropy) return ei__fail(ctx, EI_ERR_NULL, "plan is NULL or not initialised");
    if (plan->seal != ei__plan_seal(plan))
        return ei__fail(ctx, EI_ERR_STATE,
                        "plan layout fields (sizes, capacities, flags, array pointers) were changed after ei_plan_init, "
                        "or the plan was not made by it");
    /* ei_plan_init keeps the struct out of its memory; a sealed struct copied
       into its own arrays would be overwritten by the call that fills them
       (ei_plan_reset, ei_plan_finalize, profiling) while it is being read */
    if (ei__ranges_meet(plan, sizeof *plan, plan->entropy, ei__plan_extent(plan)))
        return ei__fail(ctx, EI_ERR_OVERLAP, "the ei_plan struct [%p, +%zu bytes) lies inside the plan's arrays [%p, +%zu bytes)",
                        (const void *)plan, sizeof *plan, (const void *)plan->entropy, ei__plan_extent(plan));
    return EI_OK;
}
static ei_result ei__check_plan_layout(const ei_context *ctx, const ei_plan *plan) {
    int64_t segs;
    ei_result r = ei__check_plan_seal(ctx, plan);
    if (r != EI_OK) return r;
    /* (n_tokens first: any int64 reaches here, and ceil_div must not overflow) */
    segs = plan->n_tokens > 0 && plan->n_tokens <= plan->max_tokens ? ei__ceil_div(plan->n_tokens, plan->segment_size) : 0;
    if (plan->n_tokens < 0 || plan->n_tokens > plan->max_tokens || plan->n_segments != segs ||
        plan->n_segments > plan->seg_capacity || plan->n_blocks < 0 || plan->n_blocks > plan->blk_capacity ||
        plan->n_blocks != (segs > 0 ? (segs - 1) * (plan->segment_size / plan->block_size) : 0) ||
        (plan->final != 0 && plan->final != 1))
        return ei__fail(ctx, EI_ERR_STATE,
                        "plan counts (n_tokens %lld, n_segments %d, n_blocks %d, final %d) do not fit its layout "
                        "(max_tokens %lld, %d segments, %d blocks)",
                        (long long)plan->n_tokens, (int)plan->n_segments, (int)plan->n_blocks, (int)plan->final,
                        (long long)plan->max_tokens, (int)plan->seg_capacity, (int)plan->blk_capacity);
    return EI_OK;
}
static ei_result ei__check_plan(const ei_context *ctx, const ei_plan *plan) {
    ei_result r = ei__check_plan_layout(ctx, plan);
    return r != EI_OK ? r : ei__check_plan_side(ctx, plan);
}
/* A plan's arrays and the struct that points at them. */
static void ei__reg_plan(ei__regions *g, const ei_plan *plan, int written) {
    ei__reg_mem(g, plan->entropy, ei__plan_extent(plan), "the plan's arrays", written);
    ei__reg_mem(g, plan, sizeof *plan, "the ei_plan struct", written);
}


/* ei_plan_grow: copy rows of `len` elements of `es` bytes from a layout of
   row stride so (elements) to one of stride sn, for n_rows rows. */
static void ei__copy_rows(void *dst, size_t sn, const void *src, size_t so, size_t len, size_t n_rows, size_t es) {
    size_t i;
    for (i = 0; i < n_rows; ++i)
        memcpy((unsigned char *)dst + i * sn * es, (const unsigned char *)src + i * so * es, len * es);
}
static ei_result ei__plan_alloc(const ei_context *ctx, ei_plan *plan, int64_t max_tokens, int32_t n_kv_heads,
                                int32_t head_dim, uint32_t flags);
EIDEF ei_result ei_plan_grow(const ei_context *ctx, ei_plan *plan, int64_t max_tokens) {
    ei_plan g;
    size_t kv, so, sn, i;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if ((r = ei__check_plan(ctx, plan)) != EI_OK) return r;
    if (!plan->owned_memory)
        return ei__fail(ctx, EI_ERR_STATE, "only a plan of the library's memory grows (ei_plan_init with memory "
                                           "NULL); a plan in caller memory: lay it out again with ei_plan_init, or "
                                           "allocate it for the whole context");
    if (plan->on_device)
        return ei__fail(ctx, EI_ERR_UNSUPPORTED, "a GPU plan does not grow: allocate it for the context");
    if (plan->segment_size != ctx->cfg.segment_size || plan->block_size != ctx->cfg.block_size)
        return ei__fail(ctx, EI_ERR_SHAPE, "plan was laid out for segment %d / block %d, context has %d / %d",
                        (int)plan->segment_size, (int)plan->block_size, (int)ctx->cfg.segment_size, (int)ctx->cfg.block_size);
    if (max_tokens <= plan->max_tokens) return EI_OK;
    if ((r = ei__plan_alloc(ctx, &g, max_tokens, plan->n_kv_heads, plan->head_dim, plan->flags)) != EI_OK) return r;
    if (g.max_keep < plan->max_keep) { /* a context of a smaller budget cap than the plan's */
        ei_plan_free(ctx, &g);
        return ei__fail(ctx, EI_ERR_SHAPE, "plan keeps up to %d blocks a row, this context's layout %d: grow it under "
                        "the context that made it", (int)plan->max_keep, (int)g.max_keep);
    }
    kv = (size_t)plan->n_kv_heads;
    so = (size_t)plan->seg_capacity;
    sn = (size_t)g.seg_capacity;
    /* [kv][segment] rows (the new ones as ei_plan_reset left them), block lists padded with -1 */
    ei__copy_rows(g.entropy, sn, plan->entropy, so, so, kv, 4);
    ei__copy_rows(g.budget, sn, plan->budget, so, so, kv, 4);
    ei__copy_rows(g.keep_blocks, sn, plan->keep_blocks, so, so, kv, 4);
    ei__copy_rows(g.keep_count, sn, plan->keep_count, so, so, kv, 4);
    memcpy(g.head_class, plan->head_class, kv);
    for (i = 0; i < kv; ++i)
        ei__copy_rows(g.block_index + i * sn * (size_t)g.max_keep, (size_t)g.max_keep,
                      plan->block_index + i * so * (size_t)plan->max_keep, (size_t)plan->max_keep, (size_t)plan->max_keep, so, 4);
    if (plan->scores)
        for (i = 0; i < kv; ++i)
            ei__copy_rows(g.scores + i * sn * ei__plan_score_row(&g), ei__plan_score_row(&g),
                          plan->scores + i * so * ei__plan_score_row(plan), ei__plan_score_row(plan),
                          ei__plan_score_row(plan), so, 4);
    if (plan->state) { /* head states, recurrence rows, open segments' queries, sampled mass and key store */
        size_t po = (size_t)ei__round_up(plan->blk_capacity > 0 ? plan->blk_capacity : 1, 16);
        size_t pn = (size_t)ei__round_up(g.blk_capacity > 0 ? g.blk_capacity : 1, 16);
        memcpy(ei__plan_states(&g), ei__plan_states(plan), kv * sizeof(ei__head_state));
        for (i = 0; i < kv; ++i) {
            memcpy(ei__plan_seg_state(&g, (int32_t)i, 0), ei__plan_seg_state(plan, (int32_t)i, 0), so * sizeof(ei__seg_state));
            memcpy(ei__plan_open_reps(&g, (int32_t)i), ei__plan_open_reps(plan, (int32_t)i),
                   (size_t)EI_MAX_CHUNK_GROUP * 2u * (size_t)plan->head_dim * 4u);
            memcpy(ei__plan_open_mass(&g, (int32_t)i), ei__plan_open_mass(plan, (int32_t)i), po * 4u);
            if (plan->flags & EI_PLAN_KEEP_KEYS) /* [2][head_dim][blks_pad] */
                ei__copy_rows(ei__plan_krep(&g, (int32_t)i), pn, ei__plan_krep(plan, (int32_t)i), po, po,
                              2u * (size_t)plan->head_dim, 4);
        }
    }
    g.n_tokens = plan->n_tokens;
    g.n_segments = plan->n_segments;
    g.n_blocks = plan->n_blocks;
    g.final = plan->final;
    ei_plan_free(ctx, plan);
    *plan = g; /* (the seal covers layout fields only: the copy stays sealed) */
    return EI_OK;
}

EIDEF ei_result ei_plan_reset(ei_plan *plan) {
    size_t rows;
    ei_result r;
    if ((r = ei__check_plan_layout(NULL, plan)) != EI_OK) return r;
    if (plan->on_device)
        return ei__fail(NULL, EI_ERR_UNSUPPORTED, "a GPU plan is reset by calling ei_plan_init on its memory again");
    rows = ei__plan_rows(plan);
    plan->n_tokens = 0;
    plan->n_segments = 0;
    plan->n_blocks = 0;
    plan->final = 0;
    memset(plan->entropy, 0, rows * sizeof(float));
    memset(plan->head_class, 0, (size_t)plan->n_kv_heads);
    memset(plan->budget, 0, rows * sizeof(float));
    memset(plan->keep_blocks, 0, rows * sizeof(int32_t));
    memset(plan->keep_count, 0, rows * sizeof(int32_t));
    memset(plan->block_index, 0xff, rows * (size_t)plan->max_keep * sizeof(int32_t)); /* -1 */
    if (plan->scores) memset(plan->scores, 0, rows * ei__plan_score_row(plan) * sizeof(float));
    if (plan->state) {
        memset(ei__plan_states(plan), 0, (size_t)plan->n_kv_heads * sizeof(ei__head_state));
        memset(ei__plan_seg_state(plan, 0, 0), 0, rows * sizeof(ei__seg_state));
    }
    return EI_OK;
}

static ei_result ei__plan_init_mem(const ei_context *ctx, ei_plan *plan, int64_t max_tokens, int32_t n_kv_heads,
                             int32_t head_dim, uint32_t flags, void *memory, size_t bytes) {
    ei__plan_geom g;
    unsigned char *base;
    ei_result r = ei__check_plan_geometry(ctx, max_tokens, n_kv_heads, head_dim, flags, &g);
    if (r != EI_OK) return r;
    if (!plan) return ei__fail(ctx, EI_ERR_NULL, "plan is NULL");
    if (!memory) return ei__fail(ctx, EI_ERR_NULL, "plan memory is NULL");
    if (bytes < g.bytes) return ei__fail(ctx, EI_ERR_WORKSPACE, "plan memory of %zu bytes, %zu needed", bytes, g.bytes);
    {
        ei__regions reg;
        reg.n = 0;
        ei__reg_mem(&reg, memory, g.bytes, "plan memory", 1);
        ei__reg_mem(&reg, plan, sizeof *plan, "the ei_plan struct", 1);
        if ((r = ei__check_regions(ctx, &reg)) != EI_OK) return r;
    }
    /* the same layout in host or device memory: pointer arithmetic only */
    base = (unsigned char *)memory + ((EI__PLAN_ALIGN - (uintptr_t)memory % EI__PLAN_ALIGN) % EI__PLAN_ALIGN);
    memset(plan, 0, sizeof *plan);
    plan->entropy = (float *)(base + g.offset[EI__PA_ENTROPY]);
    plan->head_class = (uint8_t *)(base + g.offset[EI__PA_CLASS]);
    plan->budget = (float *)(base + g.offset[EI__PA_BUDGET]);
    plan->keep_blocks = (int32_t *)(base + g.offset[EI__PA_KEEP_BLOCKS]);
    plan->keep_count = (int32_t *)(base + g.offset[EI__PA_KEEP_COUNT]);
    plan->block_index = (int32_t *)(base + g.offset[EI__PA_BLOCK_INDEX]);
    if (flags & EI_PLAN_SCORES) plan->scores = (float *)(base + g.offset[EI__PA_SCORES]);
    if (flags & EI_PLAN_CHUNKED) plan->state = base + g.offset[EI__PA_STATE];
    plan->max_tokens = max_tokens;
    plan->n_kv_heads = n_kv_heads;
    plan->head_dim = head_dim;
    plan->max_keep = (int32_t)g.max_keep;
    plan->segment_size = ctx->cfg.segment_size;
    plan->block_size = ctx->cfg.block_size;
    plan->flags = flags;
    plan->seg_capacity = (int32_t)g.segs;
    plan->blk_capacity = (int32_t)g.blks;
    if (ei__on_gpu(ctx)) plan->on_device = 1;
    plan->seal = ei__plan_seal(plan);
    if (!ei__on_gpu(ctx)) return ei_plan_reset(plan);
    /* device: zero counts and entropies, -1 block lists, zero scores */
    if ((r = EI__CUDA(ctx, mem_set, base, 0, g.offset[EI__PA_BLOCK_INDEX], ctx->cfg.cuda_stream)) != EI_OK ||
        (r = EI__CUDA(ctx, mem_set, plan->block_index, 0xff, g.size[EI__PA_BLOCK_INDEX], ctx->cfg.cuda_stream)) != EI_OK)
        return r;
    if (plan->state && /* chunked: no head state, no known recurrence row (ei_plan_reset's) */
        (r = EI__CUDA(ctx, mem_set, plan->state, 0, ei__plan_chunk_geom(plan).open_reps, ctx->cfg.cuda_stream)) != EI_OK)
        return r;
    if (plan->scores) return EI__CUDA(ctx, mem_set, plan->scores, 0, g.size[EI__PA_SCORES], ctx->cfg.cuda_stream);
    return EI_OK;
}

static ei_result ei__plan_alloc(const ei_context *ctx, ei_plan *plan, int64_t max_tokens, int32_t n_kv_heads,
                              int32_t head_dim, uint32_t flags) {
    size_t bytes;
    void *mem;
    ei_result r = ei__plan_size(ctx, max_tokens, n_kv_heads, head_dim, flags, &bytes);
    if (r != EI_OK) return r;
    if (!plan) return ei__fail(ctx, EI_ERR_NULL, "plan is NULL");
    if (ei__on_gpu(ctx)) {
        if ((r = EI__CUDA(ctx, mem_alloc, &mem, bytes)) != EI_OK) return r;
    } else if (!(mem = ei__alloc(&ctx->alloc, bytes)))
        return ei__fail(ctx, EI_ERR_NOMEM, "allocating a plan of %zu bytes", bytes);
    r = ei__plan_init_mem(ctx, plan, max_tokens, n_kv_heads, head_dim, flags, mem, bytes);
    if (r != EI_OK) {
        if (ei__on_gpu(ctx)) ei__cuda_api_of(ctx)->mem_free(mem);
        else ei__free(&ctx->alloc, mem);
        /* init refused before writing the plan, or laid it out over the memory
           just freed: either way no sealed plan may point there */
        if (plan->seal == ei__plan_seal(plan) && plan->entropy) memset(plan, 0, sizeof *plan);
        return r;
    }
    plan->owned_memory = mem;
    plan->seal = ei__plan_seal(plan);
    return EI_OK;
}
static int ei__all_zero(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; ++i)
        if (b[i]) return 0;
    return 1;
}
/* A plan's own memory goes back to where it came from: a device plan to the
   CUDA context that allocated it (free() on device memory is undefined;
   without that context the plan is left as it is and the error recorded). */
EIDEF void ei_plan_free(const ei_context *ctx, ei_plan *plan) {
    if (!plan || ei__all_zero(plan, sizeof *plan)) return; /* freed already, or zeroed and never made */
    /* a struct ei_plan_init did not make (an engine's cleanup
       after a failed alloc, garbage, an edited owned_memory) holds nothing of
       ours: left as it is, the error recorded, nothing freed */
    if (ei__check_plan_seal(ctx, plan) != EI_OK) return;
    if (plan->owned_memory && plan->on_device) {
        if (!ei__on_gpu(ctx)) {
            ei__fail(ctx, EI_ERR_STATE, "a GPU plan is freed with the CUDA context that allocated it (plan left as is)");
            return;
        }
        ei__cuda_api_of(ctx)->mem_free(plan->owned_memory);
    } else if (plan->owned_memory)
        ei__free(ctx ? &ctx->alloc : NULL, plan->owned_memory);
    memset(plan, 0, sizeof *plan);
}

EIDEF int ei_plan_segment_is_sparse(const ei_context *ctx, const ei_plan *plan, int32_t segment) {
    if (!ctx || ei__check_plan_layout(ctx, plan) != EI_OK) return 0; /* refused: 0, the error recorded */
    if (segment < 0 || segment >= plan->n_segments) return 0;
    return ei__segment_sparse(&ctx->cfg, segment, plan->n_segments, plan->final);
}

// >>simd: min/max representations and block scores -------------------------
/* The profiling kernels, one per path (the code is in the >>isa-* sections;
   the scalar one is the reference):
   minmax: elementwise max/min over nt rows of one head of a view; returns 0
   if a NaN or Inf was read. Exact (max and min do not round): every path
   gives the same values (a zero's sign aside).
   score_row: for blocks 0..nb-1 (transposed key representations, leading
   dimension ld) the group-mean raw score
     (1/G) sum_g max((qmax.kmax + qmin.kmax)/2, (qmax.kmin + qmin.kmin)/2)
   with qrep laid out [G][2][d] (max row, then min row). Results agree across
   paths within float32 summation-order error (not bit-identical).

   ISA code is grouped by ISA: one section per path (>>isa-scalar, >>isa-avx2,
   >>isa-avx512, >>isa-avx512bf16, >>isa-neon) holds its minmax, score_row,
   dot and attention stages and ends with its kernel table (>>kernels picks
   one per context). Hot loops (score_row, dot, the attention Q K^T and P V)
   are hand-written per ISA; the elementwise pieces (minmax here; exp2,
   online softmax, row conversion, K/V packing, score store and output
   normalise in >>attention) are templates written once against a small
   vector vocabulary, which each x86 section provides (as ggml's simd
   mappings do):
     EI__VEC, EI__VN   a vector of EI__VN f32 lanes (AVX2 8, AVX-512 16: a
                       16-row vector of the attention tile is 2 AVX2 vectors)
     EI__VMASK         lane mask (EI__VGE, NaN tracking)
     EI__VTAIL         the first n lanes of a partial vector: EI__VFIRST(n)
     EI__VZERO() EI__VSET1(x) EI__VLOAD(p) EI__VSTORE(p, v) (aligned)
     EI__VLOADU(p)     unaligned load (f32 data is only 4-byte aligned)
     EI__VSTOREU EI__VADD EI__VSUB EI__VMUL EI__VMAX EI__VMIN
     EI__VFMA(a, b, c) = a*b + c, EI__VROUND (to nearest), EI__VGE(a, b)
     EI__VPOW2(p, n, keep)          p * 2^n in kept lanes, 0 elsewhere
     EI__VLOAD_ROW(p, dt, tail)     tail lanes of a row of any dtype as f32
                                    (exact), other lanes 0
     EI__VSTORE_ROW(p, dt, v, tail) tail lanes into a row of any dtype
                                    (f16/bf16: nearest even)
     EI__VSELECT_BITS(bits, x, y)   lane i: x if bit i is set, else y
     EI__VNAN_NONE() EI__VNAN_OR(m, v) EI__VANY(m)   NaN tracking
     EI__VHSUM(v) EI__VHMAX(v)   the sum, the largest of the lanes (a float)
     EI__VMINMAX_VECS  vectors per minmax pass
   A section defines EI__VISA (its name: avx2) and EI__VTARGET (its target
   attribute), expands the templates (EI__DEFINE_MINMAX() defines
   ei__minmax_avx2, ...) and #undefs both. Vocabulary ops are static inline
   functions ei__<isa>_<op> carrying the section's target attribute (this
   header compiles ISA code without -march, >>common), so they are
   type-checked and a debugger steps into them; EI__VADD names ei__avx2_add
   there. The templates are macros, C having no templates (re-including the
   header per ISA, as stb_image_resize2.h does, would need guards around the
   whole file): a template is one line to a debugger and in compiler
   messages, and cc -E shows it expanded. */
#define EI__VCAT3_(a, b, c) a##b##c
#define EI__VCAT3(a, b, c) EI__VCAT3_(a, b, c)
#define EI__V(op) EI__VCAT3(ei__, EI__VISA, _##op)    /* ei__<isa>_<op> */
#define EI__VNAME(f) EI__VCAT3(f, _, EI__VISA)        /* f_<isa> */
#if defined(__GNUC__) || defined(__clang__)
#define EI__VINLINE static inline __attribute__((always_inline))
#else
#define EI__VINLINE static inline
#endif
/* The vocabulary ops whose intrinsics differ between x86 ISAs only in their
   prefix (mm: _mm256, _mm512), defined for section isa with vector type V. */
#define EI__DEFINE_VOCAB_LANEWISE(isa, TARGET, V, mm)                                                          \
    TARGET EI__VINLINE V ei__##isa##_zero(void) { return mm##_setzero_ps(); }                                  \
    TARGET EI__VINLINE V ei__##isa##_set1(float x) { return mm##_set1_ps(x); }                                 \
    TARGET EI__VINLINE V ei__##isa##_load(const float *p) { return mm##_load_ps(p); }                          \
    TARGET EI__VINLINE V ei__##isa##_loadu(const float *p) { return mm##_loadu_ps(p); }                        \
    TARGET EI__VINLINE void ei__##isa##_store(float *p, V v) { mm##_store_ps(p, v); }                          \
    TARGET EI__VINLINE void ei__##isa##_storeu(float *p, V v) { mm##_storeu_ps(p, v); }                        \
    TARGET EI__VINLINE V ei__##isa##_add(V a, V b) { return mm##_add_ps(a, b); }                               \
    TARGET EI__VINLINE V ei__##isa##_sub(V a, V b) { return mm##_sub_ps(a, b); }                               \
    TARGET EI__VINLINE V ei__##isa##_mul(V a, V b) { return mm##_mul_ps(a, b); }                               \
    TARGET EI__VINLINE V ei__##isa##_fma(V a, V b, V c) { return mm##_fmadd_ps(a, b, c); }                     \
    TARGET EI__VINLINE V ei__##isa##_max(V a, V b) { return mm##_max_ps(a, b); }                               \
    TARGET EI__VINLINE V ei__##isa##_min(V a, V b) { return mm##_min_ps(a, b); }
#define EI__VEC EI__V(v)
#define EI__VMASK EI__V(m)
#define EI__VTAIL EI__V(tail)
#define EI__VN EI__V(n)
#define EI__VMINMAX_VECS EI__V(minmax_vecs)
#define EI__VFIRST EI__V(first)
#define EI__VZERO EI__V(zero)
#define EI__VSET1 EI__V(set1)
#define EI__VLOAD EI__V(load)
#define EI__VLOADU EI__V(loadu)
#define EI__VSTORE EI__V(store)
#define EI__VSTOREU EI__V(storeu)
#define EI__VADD EI__V(add)
#define EI__VSUB EI__V(sub)
#define EI__VMUL EI__V(mul)
#define EI__VFMA EI__V(fma)
#define EI__VMAX EI__V(max)
#define EI__VMIN EI__V(min)
#define EI__VROUND EI__V(round)
#define EI__VGE EI__V(ge)
#define EI__VPOW2 EI__V(pow2)
#define EI__VLOAD_ROW EI__V(load_row)
#define EI__VSTORE_ROW EI__V(store_row)
#define EI__VSELECT_BITS EI__V(select_bits)
#define EI__VNAN_NONE EI__V(nan_none)
#define EI__VNAN_OR EI__V(nan_or)
#define EI__VANY EI__V(any)
#define EI__VHSUM EI__V(hsum)
#define EI__VHMAX EI__V(hmax)

/* minmax, written once: passes of EI__VMINMAX_VECS vectors of dims, rows
   streamed through 2 accumulators per vector; NaN tracked per lane, Inf
   checked on the results; the rows EI__MINMAX_AHEAD ahead are prefetched
   (whole-prompt profiling at 32k, 8/1 heads, bf16, one thread of a Zen 5:
   29-35 ms with it, 38-45 ms without). Defines ei__minmax_<isa>. */
#define EI__MINMAX_AHEAD 16
#define EI__DEFINE_MINMAX()                                                                                    \
    EI__VTARGET static int EI__VNAME(ei__minmax)(const ei_tensor *t, int64_t t0, int64_t nt, int32_t head,      \
                                                 float *mx, float *mn) {                                        \
        const int32_t d = t->head_dim;                                                                         \
        const size_t es = ei__dtype_size(t->dtype);                                                            \
        EI__VMASK nan = EI__VNAN_NONE();                                                                       \
        int32_t c, i;                                                                                          \
        int bad = 0;                                                                                           \
        for (c = 0; c < d; c += EI__VN * EI__VMINMAX_VECS) {                                                  \
            EI__VEC vx[EI__VMINMAX_VECS], vn[EI__VMINMAX_VECS];                                                \
            EI__VTAIL tail[EI__VMINMAX_VECS];                                                                  \
            int32_t nv = 0;                                                                                    \
            int64_t r;                                                                                         \
            for (; nv < EI__VMINMAX_VECS && c + EI__VN * nv < d; ++nv) {                                       \
                tail[nv] = EI__VFIRST(EI__MIN(d - c - EI__VN * nv, (int32_t)EI__VN));                          \
                vx[nv] = EI__VSET1(-FLT_MAX);                                                                  \
                vn[nv] = EI__VSET1(FLT_MAX);                                                                   \
            }                                                                                                  \
            for (r = 0; r < nt; ++r) {                                                                         \
                const unsigned char *row = (const unsigned char *)ei__row(t, t0 + r, head) + (size_t)c * es;   \
                if (r + EI__MINMAX_AHEAD < nt) /* a head's rows are strided: the hardware prefetch lags */     \
                    ei__prefetch_bytes((const unsigned char *)ei__row(t, t0 + r + EI__MINMAX_AHEAD, head) + (size_t)c * es, \
                                       (size_t)(nv * EI__VN) * es, 1);                                         \
                for (i = 0; i < nv; ++i) {                                                                     \
                    EI__VEC v = EI__VLOAD_ROW(row + (size_t)(EI__VN * i) * es, t->dtype, tail[i]);             \
                    nan = EI__VNAN_OR(nan, v);                                                                 \
                    vx[i] = EI__VMAX(vx[i], v);                                                                \
                    vn[i] = EI__VMIN(vn[i], v);                                                                \
                }                                                                                              \
            }                                                                                                  \
            for (i = 0; i < nv; ++i) {                                                                         \
                EI__VSTORE_ROW(mx + c + EI__VN * i, EI_F32, vx[i], tail[i]);                                   \
                EI__VSTORE_ROW(mn + c + EI__VN * i, EI_F32, vn[i], tail[i]);                                   \
            }                                                                                                  \
        }                                                                                                      \
        for (i = 0; i < d; ++i)                                                                                \
            if (mx[i] == INFINITY || mn[i] == -INFINITY) bad = 1;                                              \
        return !(bad || EI__VANY(nan));                                                                        \
    }

/* rows_finite, written once: whether rows pos[0..n) of one head of a view
   hold only finite values: acc += x * 0 stays 0 unless some x is NaN or
   +-Inf (then NaN), one FMA per vector. Attention calls it on each key tile
   just before scoring it, while the rows are in cache. Defines
   ei__rows_finite_<isa>. */
#define EI__DEFINE_ROWS_FINITE()                                                                               \
    EI__VTARGET static int EI__VNAME(ei__rows_finite)(const ei_tensor *t, const int64_t *pos, int32_t n,        \
                                                      int32_t head) {                                           \
        const int32_t d = t->head_dim;                                                                         \
        const size_t es = ei__dtype_size(t->dtype);                                                            \
        const EI__VEC zero = EI__VZERO();                                                                      \
        EI__VEC acc = EI__VZERO();                                                                             \
        int32_t j, c;                                                                                          \
        for (j = 0; j < n; ++j) {                                                                              \
            const unsigned char *row = (const unsigned char *)ei__row(t, pos[j], head);                        \
            if (t->dtype == EI_F32)                                                                            \
                for (c = 0; c + (int32_t)EI__VN <= d; c += EI__VN)                                             \
                    acc = EI__VFMA(EI__VLOADU((const float *)(const void *)row + c), zero, acc);               \
            else                                                                                               \
                for (c = 0; c + (int32_t)EI__VN <= d; c += EI__VN)                                             \
                    acc = EI__VFMA(EI__VLOAD_ROW(row + (size_t)c * es, t->dtype, EI__VFIRST(EI__VN)), zero, acc); \
            if (c < d)                                                                                         \
                acc = EI__VFMA(EI__VLOAD_ROW(row + (size_t)c * es, t->dtype, EI__VFIRST(d - c)), zero, acc);    \
        }                                                                                                      \
        return !EI__VANY(EI__VNAN_OR(EI__VNAN_NONE(), acc));                                                   \
    }

// >>profile -----------------------------------------------------------------
typedef struct ei__ranked { float score; int32_t index; } ei__ranked;

/* Rank order of the method: descending score, ties to the lower index. */
static int ei__ranked_before(const ei__ranked *a, const ei__ranked *b) {
    return a->score > b->score || (a->score == b->score && a->index < b->index);
}
static int ei__ranked_cmp(const void *pa, const void *pb) {
    return ei__ranked_before((const ei__ranked *)pa, (const ei__ranked *)pb) ? -1 : 1;
}
/* Quickselect: afterwards v[0..k) hold the k first elements in rank order (unsorted). */
static void ei__select_top(ei__ranked *v, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1, want = k - 1;
    if (k <= 0 || k >= n) return;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2, i = lo, j = hi;
        ei__ranked a = v[lo], b = v[mid], c = v[hi], p, t;
        /* median of three */
        if (ei__ranked_before(&b, &a)) { t = a; a = b; b = t; }
        if (ei__ranked_before(&c, &b)) { b = c; if (ei__ranked_before(&b, &a)) b = a; }
        p = b;
        while (i <= j) {
            while (ei__ranked_before(&v[i], &p)) ++i;
            while (ei__ranked_before(&p, &v[j])) --j;
            if (i <= j) { t = v[i]; v[i] = v[j]; v[j] = t; ++i; --j; }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
}
/* The k best of the n candidates in pairs, in rank order, into out[0..k). */
static void ei__rank_top_pairs(ei__ranked *pairs, int64_t n, int64_t k, int32_t *out) {
    int64_t b;
    if (k > n) k = n;
    if (k <= 0) return;
    ei__select_top(pairs, n, k);
    qsort(pairs, (size_t)k, sizeof *pairs, ei__ranked_cmp);
    for (b = 0; b < k; ++b) out[b] = pairs[b].index;
}
/* The k best of raw[0..n) in rank order into out[0..k). */
static void ei__rank_top(const float *raw, int64_t n, int64_t k, int32_t *out, ei__ranked *pairs) {
    int64_t b;
    for (b = 0; b < n; ++b) { pairs[b].score = raw[b]; pairs[b].index = (int32_t)b; }
    ei__rank_top_pairs(pairs, n, k, out);
}

/* Softmax over the nvis visible blocks and its entropy -sum p ln(p + 1e-9),
   in float32 like the reference (sums in double). prob (optional) receives
   the row over nb blocks, masked ones 0. Returns 0 if the scores are not
   finite (finite but huge inputs can overflow float32 dot products). */
static int ei__softmax_entropy(const float *raw, int64_t nvis, int64_t nb, float *tmp, float *prob, float *entropy) {
    float m = -FLT_MAX, z;
    double sum = 0.0, h = 0.0;
    int64_t b;
    for (b = 0; b < nvis; ++b) {
        if (!(raw[b] - raw[b] == 0.0f)) return 0;
        if (raw[b] > m) m = raw[b];
    }
    for (b = 0; b < nvis; ++b) { tmp[b] = expf(raw[b] - m); sum += tmp[b]; }
    z = (float)sum;
    for (b = 0; b < nvis; ++b) {
        float p = tmp[b] / z;
        h -= (double)p * (double)logf(p + 1e-9f);
        if (prob) prob[b] = p;
    }
    if (prob) for (b = nvis; b < nb; ++b) prob[b] = 0.0f;
    *entropy = (float)h;
    return 1;
}
/* Segment 0 sees no block: the reference's fully masked row comes out uniform. */
static float ei__uniform_entropy(int64_t nb, float *prob) {
    float p, h;
    int64_t b;
    if (nb <= 0) return 0.0f;
    p = 1.0f / (float)nb;
    h = (float)(-(double)nb * (double)p * (double)logf(p + 1e-9f));
    if (prob) for (b = 0; b < nb; ++b) prob[b] = p;
    return h;
}


/* EI_RANK_SAMPLED scores its rows in batches against tiles of keys. */
enum { EI__SAMPLE_ROWS = 32 };
/* Keys per tile of the sampled ranking's kernels: whole blocks, about 64. */
static int32_t ei__sample_tile_keys(int32_t bs) { return bs * (bs < 64 ? 64 / bs : 1); }
/* Floats of its score buffer for n tokens (block size bs): the scalar
   reference keeps every score ([n][rows]); the tiled kernels a tile, the
   blocks' sums and two values per tile ([tile + n/bs + 2 tiles][rows]). */
static size_t ei__sample_lg_floats(int64_t n, int32_t bs) {
    int64_t tk = ei__sample_tile_keys(bs), tiled = tk + n / bs + 2 * (n / tk + 1), rows = ei__round_up(n, 16);
    return (size_t)(rows > tiled ? rows : tiled) * EI__SAMPLE_ROWS;
}
/* EI_RANK_PRECISION_INT8 (CONCEPTS: ranking): a batch of sampled rows in
   int8, in the layouts the dot kernels read (row r of the batch in column r,
   rows from nr on and elements from d on zero). Rounding is shared plain C
   (ei__quant_i8) or, for keys, vector code that gives the same bytes. */
/* The keys of one kv head in int8, 0..n-1 rounded so far in this call
   (each key once per profiling call and kv head, whatever the rows and
   segments that score it): key j's bytes at k + j dq, its scale s_k and
   128 x its sum (vpdpbusd's offset). */
typedef struct ei__rank_keys {
    int8_t *k;
    float *s;
    int32_t *sum128;
    int64_t n;
    int32_t head;               /* the kv head they are of (-1: none yet) */
} ei__rank_keys;
typedef struct ei__rank_q8 {
    ei__rank_keys *kc;          /* the keys (the kernel rounds those its rows need first) */
    const int8_t *q;            /* [dq/4][EI__SAMPLE_ROWS][4]: element i of row r at ((i/4) 32 + r) 4 + i%4 */
    const uint8_t *qu;          /* the same + 128 (vpdpbusd's unsigned operand) */
    const int16_t *q16;         /* [dq/2][EI__SAMPLE_ROWS][2] (vpmaddwd's pairs) */
    float s[EI__SAMPLE_ROWS];   /* each row's scale s_q (0 from nr on) */
    int32_t dq;                 /* head_dim rounded up to 4 */
    int dot;                    /* the x86 dots this CPU has (ei_context.i8dot) */
} ei__rank_q8;
static int ei__rank_int8(const ei_config *c) {
    return c->ranking == EI_RANK_SAMPLED && c->rank_precision == EI_RANK_PRECISION_INT8;
}
/* Bytes of a batch's int8 rows (q, qu, q16) and one row of d bytes. */
static size_t ei__rank_q8_bytes(int32_t d) { return (size_t)ei__round_up(d, 4) * EI__SAMPLE_ROWS * 4u + (size_t)ei__round_up(d, 4); }
/* x rounded to f32 where the compiler keeps excess precision (x87 math on
   i386: FLT_EVAL_METHOD 2, and C++ does not round at assignments there),
   so that the plain int8 rounding and scores are the vector paths' bit for
   bit; x itself elsewhere. */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
static float ei__f32_round(float x) {
    volatile float v = x;
    return v;
}
#else
#define ei__f32_round(x) (x)
#endif
/* One row of d f32 in int8 (CONCEPTS: ranking): s = max|x| / 127, out[i] =
   round(x[i] / s) (all zero where s is 0); returns s, or -1 if an element
   is NaN or +-inf (out then zero). */
static float ei__quant_i8(const float *x, int32_t d, int8_t *out) {
    float m = 0.0f, s;
    int32_t i;
    for (i = 0; i < d; ++i) {
        float a = x[i] < 0.0f ? -x[i] : x[i];
        if (!(x[i] - x[i] == 0.0f)) {
            memset(out, 0, (size_t)d);
            return -1.0f;
        }
        m = a > m ? a : m;
    }
    s = ei__f32_round(m / 127.0f);
    for (i = 0; i < d; ++i) out[i] = ei__round_i8(s > 0.0f ? ei__f32_round(x[i] / s) : 0.0f);
    return s;
}

/* EI_RANK_ROWS_SPREAD's dots (the spread_dots contract), plain. */
static void ei__spread_dots_scalar(const int8_t *cand, int64_t n, int32_t dq, const int8_t *p, int32_t *out) {
    int64_t c;
    int32_t i;
    for (c = 0; c < n; ++c) {
        const int8_t *x = cand + (size_t)c * (size_t)dq;
        int32_t acc = 0;
        for (i = 0; i < dq; ++i) acc += (int32_t)x[i] * p[i];
        out[c] = acc;
    }
}

/* Round keys [kc->n, j1) of kv head kvh into kc (a key row widened to f32
   in row, d rounded up to 16 floats); 1 if one holds NaN or +-inf. The
   plain version; the vector ones give the same bytes. */
static int ei__rank_keys_extend_scalar(ei__rank_keys *kc, const ei_tensor *k, int32_t kvh, int64_t j1, float *row) {
    const int32_t d = k->head_dim, dq = (int32_t)ei__round_up(d, 4);
    int bad = 0;
    int32_t i;
    for (; kc->n < j1; ++kc->n) {
        int8_t *kj = kc->k + (size_t)kc->n * (size_t)dq;
        int32_t sum = 0;
        ei__row_to_f32(ei__row(k, kc->n, kvh), k->dtype, d, row);
        if ((kc->s[kc->n] = ei__quant_i8(row, d, kj)) < 0.0f) {
            bad = 1;
            kc->s[kc->n] = 0.0f;
        }
        memset(kj + d, 0, (size_t)(dq - d));
        for (i = 0; i < d; ++i) sum += kj[i];
        kc->sum128[kc->n] = 128 * sum;
    }
    return bad;
}
EI__MAYBE_UNUSED static int32_t ei__ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The score buffer and key tile of a ranking by mass: EI_RANK_ANTIDIAGONAL
   runs the same kernels over one key in bs (ceil(n / bs) keys, one-key
   blocks), so it takes the larger of the two layouts. */
static size_t ei__mass_lg_floats(const ei_config *c, int64_t n) {
    size_t a = ei__sample_lg_floats(n, c->block_size), b = ei__sample_lg_floats(ei__ceil_div(n, c->block_size) + 1, 1);
    return c->ranking == EI_RANK_ANTIDIAGONAL && b > a ? b : a;
}
static int32_t ei__mass_tile_keys(const ei_config *c) {
    int32_t a = ei__sample_tile_keys(c->block_size), b = ei__sample_tile_keys(1);
    return c->ranking == EI_RANK_ANTIDIAGONAL && b > a ? b : a;
}

/* EI_RANK_ANTIDIAGONAL scores groups of query tiles with the rows of a
   phase in the lanes of vectors (EI__DEFINE_ANTIDIAG_GROUP), 32 tiles a
   group, for blocks of up to 64 tokens and sink blocks of up to
   512 keys in all; other shapes take the plain per-row path. */
#define EI__ANTIDIAG_LANES EI__SAMPLE_ROWS
static int ei__antidiag_grouped_shape(const ei_config *c, int64_t n) {
    int64_t nb = (ei__ceil_div(n, c->segment_size) - 1) * (c->segment_size / c->block_size);
    return c->ranking == EI_RANK_ANTIDIAGONAL && c->block_size <= 64 &&
           EI__MIN((int64_t)c->sink_blocks, EI__MAX(nb, (int64_t)0)) * c->block_size <= 512;
}
/* Keys a phase of a group scores, at most (its weight rows' stride). */
static int64_t ei__antidiag_ld(const ei_config *c, int64_t n) {
    int64_t nb = (ei__ceil_div(n, c->segment_size) - 1) * (c->segment_size / c->block_size);
    int64_t ns = EI__MIN((int64_t)c->sink_blocks, EI__MAX(nb, (int64_t)0));
    return ei__round_up(ns * c->block_size + n / c->block_size + 2, 8);
}

/* Workspace of one profiling thread. */
#define EI__KREP_GROUP 16 /* key blocks built at a time (ei__build_key_reps) */
typedef struct ei__profile_ws {
    float *kmaxT, *kminT; /* whole-prompt key representations [d][ld] */
    float *qrep, *qtmp;   /* [G][2][d] each */
    float *rows;          /* raw score rows [rows][ld] */
    float *tmp;           /* [ld] */
    ei__ranked *pairs;    /* [ld] */
    float *mx, *mn;       /* [d] */
    float *kstage;        /* key blocks on their way into kmaxT/kminT [EI__KREP_GROUP][2][d] */
    /* EI_RANK_SAMPLED and EI_RANK_ANTIDIAGONAL only (NULL otherwise) */
    float *mass;          /* a segment's block mass [ld] */
    float *sq;            /* a batch of sampled query rows, transposed [d][EI__SAMPLE_ROWS] */
    float *keys;          /* a tile of keys as f32 [ei__sample_tile_keys][d rounded up to 16] */
    float *logits;        /* the batch's scores (ei__sample_lg_floats) */
    unsigned char *sq8;   /* EI_RANK_PRECISION_INT8: the batch's rows in int8 (ei__rank_q8_bytes; NULL otherwise) */
    ei__rank_keys k8;     /* EI_RANK_PRECISION_INT8: keys in int8 (n x (head_dim rounded up to 4 + 8) bytes), each
                             rounded once per call and kv head */
    /* EI_RANK_ANTIDIAGONAL's tile groups (ei__antidiag_grouped; NULL otherwise) */
    float *ad_q;          /* a group's rows, per phase transposed [bs][d][EI__ANTIDIAG_LANES] */
    float *ad_w;          /* their weights [bs][ad_ld][EI__ANTIDIAG_LANES] */
    int64_t *ad_u;        /* their tokens [bs][EI__ANTIDIAG_LANES] */
    int64_t *ad_last;     /* the rows in token order: each one's blocks [0, last) */
    int64_t *ad_row;      /* and its weights' column: (phase x ad_ld) x lanes + lane */
    int64_t ad_ld;
    /* EI_RANK_ROWS_SPREAD (NULL otherwise): the candidates of a segment's rows in int8
       [EI__SPREAD_MAX][dq], their 1/sqrt(norm), largest cosine to the rows so far and dots,
       and the rows picked (tokens, query heads; sp_n of them, for segment sp_seg) */
    int8_t *sp8;
    int8_t *sp8g;         /* the candidates regrouped for spread_step (ei__spread_regroup) */
    int32_t *sp_sum128;   /* and 128 x each one's byte sum */
    double *sp_r, *sp_best;
    float *sp_s;          /* the candidates' int8 scales (not used: cosines need no scale) */
    int32_t *sp_dot;
    int64_t *sp_tok;
    int32_t *sp_head;
    int32_t sp_n, sp_seg;
    int score_threads;    /* threads a chunk's segment splits its query min/max and block scores over (ei_profile_chunk_mt) */
    int32_t krep_head;    /* chunked planning: the kv head whose key blocks [0, krep_blocks) kmaxT/kminT hold (-1: none) */
    int64_t krep_blocks;
} ei__profile_ws;

static int ei__profile_ws_layout(const ei_config *c, int64_t n, int32_t G, int32_t d, ei__profile_ws *w, void *mem,
                                 size_t bytes, size_t *need) {
    int64_t S = ei__ceil_div(n, c->segment_size), nb = (S - 1) * (c->segment_size / c->block_size);
    int64_t ld = ei__round_up(nb > 0 ? nb : 1, 16), spc = ei__rank_spread(c) && G > 0 ? ei__spread_candidates(c, G, d) : 0;
    size_t total = 0;
    ei__arena a;
    if (!ei__reserve(&total, 2u * (size_t)d, (size_t)ld * 4u) || !ei__reserve(&total, (size_t)G * 2u, (size_t)d * 4u) ||
        !ei__reserve(&total, (size_t)G * 2u, (size_t)d * 4u) ||
        !ei__reserve(&total, (size_t)S, (size_t)ld * 4u) || !ei__reserve(&total, (size_t)ld, 4u) ||
        !ei__reserve(&total, (size_t)ld, sizeof(ei__ranked)) || !ei__reserve(&total, (size_t)d, 4u) ||
        !ei__reserve(&total, (size_t)d, 4u) || !ei__reserve(&total, 2u * EI__KREP_GROUP, (size_t)d * 4u) ||
        (c->ranking != EI_RANK_REFERENCE &&
         (!ei__reserve(&total, (size_t)ld, 4u) || !ei__reserve(&total, EI__SAMPLE_ROWS, (size_t)d * 4u) ||
          !ei__reserve(&total, (size_t)ei__mass_tile_keys(c), (size_t)ei__round_up(d, 16) * 4u) ||
          !ei__reserve(&total, ei__mass_lg_floats(c, n), 4u))) ||
        (ei__rank_int8(c) && (!ei__reserve(&total, ei__rank_q8_bytes(d), 1u) ||
                              !ei__reserve(&total, (size_t)n, (size_t)ei__round_up(d, 4)) ||
                              !ei__reserve(&total, (size_t)n, 4u) || !ei__reserve(&total, (size_t)n, 4u))) ||
        (ei__rank_spread(c) &&
         (!ei__reserve(&total, (size_t)spc, (size_t)ei__round_up(d, 4)) ||
          !ei__reserve(&total, (size_t)ei__round_up(spc, 16), (size_t)ei__round_up(d, 4)) ||
          !ei__reserve(&total, (size_t)ei__round_up(spc, 16), 4u) || !ei__reserve(&total, (size_t)spc, 8u) ||
          !ei__reserve(&total, (size_t)spc, 8u) || !ei__reserve(&total, (size_t)spc, 4u) ||
          !ei__reserve(&total, (size_t)spc, 4u) || !ei__reserve(&total, (size_t)c->rank_samples, 8u) ||
          !ei__reserve(&total, (size_t)c->rank_samples, 4u))) ||
        (ei__antidiag_grouped_shape(c, n) &&
         (!ei__reserve(&total, (size_t)c->block_size * EI__ANTIDIAG_LANES, (size_t)d * 4u) ||
          !ei__reserve(&total, (size_t)c->block_size * EI__ANTIDIAG_LANES, (size_t)ei__antidiag_ld(c, n) * 4u) ||
          !ei__reserve(&total, (size_t)c->block_size * EI__ANTIDIAG_LANES, 8u) ||
          !ei__reserve(&total, (size_t)c->block_size * EI__ANTIDIAG_LANES, 8u) ||
          !ei__reserve(&total, (size_t)c->block_size * EI__ANTIDIAG_LANES, 8u))) ||
        !ei__add_size(total, EI__ALIGN, &total))
        return 0;
    *need = total;
    if (!mem || bytes < total) return 1;
    ei__arena_init(&a, mem, bytes);
    w->kmaxT = (float *)ei__arena_take(&a, (size_t)d, (size_t)ld * 4u);
    w->kminT = (float *)ei__arena_take(&a, (size_t)d, (size_t)ld * 4u);
    w->qrep = (float *)ei__arena_take(&a, (size_t)G * 2u, (size_t)d * 4u);
    w->qtmp = (float *)ei__arena_take(&a, (size_t)G * 2u, (size_t)d * 4u);
    w->rows = (float *)ei__arena_take(&a, (size_t)S, (size_t)ld * 4u);
    w->tmp = (float *)ei__arena_take(&a, (size_t)ld, 4u);
    w->pairs = (ei__ranked *)ei__arena_take(&a, (size_t)ld, sizeof(ei__ranked));
    w->mx = (float *)ei__arena_take(&a, (size_t)d, 4u);
    w->mn = (float *)ei__arena_take(&a, (size_t)d, 4u);
    w->kstage = (float *)ei__arena_take(&a, 2u * EI__KREP_GROUP, (size_t)d * 4u);
    w->mass = w->sq = w->keys = w->logits = NULL;
    w->score_threads = 1;
    w->krep_head = -1;
    w->krep_blocks = 0;
    if (c->ranking != EI_RANK_REFERENCE) {
        w->mass = (float *)ei__arena_take(&a, (size_t)ld, 4u);
        w->sq = (float *)ei__arena_take(&a, EI__SAMPLE_ROWS, (size_t)d * 4u);
        w->keys = (float *)ei__arena_take(&a, (size_t)ei__mass_tile_keys(c), (size_t)ei__round_up(d, 16) * 4u);
        w->logits = (float *)ei__arena_take(&a, ei__mass_lg_floats(c, n), 4u);
    }
    memset(&w->k8, 0, sizeof w->k8);
    w->k8.head = -1;
    w->sq8 = NULL;
    if (ei__rank_int8(c)) {
        w->sq8 = (unsigned char *)ei__arena_take(&a, ei__rank_q8_bytes(d), 1u);
        w->k8.k = (int8_t *)ei__arena_take(&a, (size_t)n, (size_t)ei__round_up(d, 4));
        w->k8.s = (float *)ei__arena_take(&a, (size_t)n, 4u);
        w->k8.sum128 = (int32_t *)ei__arena_take(&a, (size_t)n, 4u);
    }
    w->sp8 = w->sp8g = NULL;
    w->sp_sum128 = NULL;
    w->sp_r = w->sp_best = NULL;
    w->sp_s = NULL;
    w->sp_dot = w->sp_head = NULL;
    w->sp_tok = NULL;
    w->sp_n = 0;
    w->sp_seg = -1;
    if (ei__rank_spread(c)) {
        w->sp8 = (int8_t *)ei__arena_take(&a, (size_t)spc, (size_t)ei__round_up(d, 4));
        w->sp8g = (int8_t *)ei__arena_take(&a, (size_t)ei__round_up(spc, 16), (size_t)ei__round_up(d, 4));
        w->sp_sum128 = (int32_t *)ei__arena_take(&a, (size_t)ei__round_up(spc, 16), 4u);
        w->sp_r = (double *)ei__arena_take(&a, (size_t)spc, 8u);
        w->sp_best = (double *)ei__arena_take(&a, (size_t)spc, 8u);
        w->sp_s = (float *)ei__arena_take(&a, (size_t)spc, 4u);
        w->sp_dot = (int32_t *)ei__arena_take(&a, (size_t)spc, 4u);
        w->sp_tok = (int64_t *)ei__arena_take(&a, (size_t)c->rank_samples, 8u);
        w->sp_head = (int32_t *)ei__arena_take(&a, (size_t)c->rank_samples, 4u);
    }
    w->ad_q = w->ad_w = NULL;
    w->ad_u = w->ad_last = w->ad_row = NULL;
    w->ad_ld = 0;
    if (ei__antidiag_grouped_shape(c, n)) {
        w->ad_ld = ei__antidiag_ld(c, n);
        w->ad_q = (float *)ei__arena_take(&a, (size_t)c->block_size * EI__ANTIDIAG_LANES, (size_t)d * 4u);
        w->ad_w = (float *)ei__arena_take(&a, (size_t)c->block_size * EI__ANTIDIAG_LANES, (size_t)w->ad_ld * 4u);
        w->ad_u = (int64_t *)ei__arena_take(&a, (size_t)c->block_size * EI__ANTIDIAG_LANES, 8u);
        w->ad_last = (int64_t *)ei__arena_take(&a, (size_t)c->block_size * EI__ANTIDIAG_LANES, 8u);
        w->ad_row = (int64_t *)ei__arena_take(&a, (size_t)c->block_size * EI__ANTIDIAG_LANES, 8u);
    }
    return 1;
}

/* The sizes a workspace query names, for both backends (a query without
   n_tokens or head_dim passes 1). */
static ei_result ei__check_sizes(const ei_context *ctx, int64_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                 int32_t head_dim, const size_t *bytes) {
    if (!ctx || !bytes) return ei__fail(ctx, EI_ERR_NULL, "context or bytes is NULL");
    if (n_tokens <= 0 || n_tokens > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_tokens %lld not in 1..%lld", (long long)n_tokens, (long long)EI_MAX_TOKENS);
    if (n_heads <= 0 || n_heads > EI_MAX_HEADS || n_kv_heads <= 0 || n_kv_heads > EI_MAX_HEADS)
        return ei__fail(ctx, EI_ERR_SIZE, "heads %d / kv heads %d not in 1..%d", (int)n_heads, (int)n_kv_heads, EI_MAX_HEADS);
    if (n_heads % n_kv_heads)
        return ei__fail(ctx, EI_ERR_GQA, "n_heads %d is not a multiple of n_kv_heads %d", (int)n_heads, (int)n_kv_heads);
    if (head_dim <= 0 || head_dim > EI_MAX_HEAD_DIM)
        return ei__fail(ctx, EI_ERR_SIZE, "head_dim %d not in 1..%d", (int)head_dim, EI_MAX_HEAD_DIM);
    return EI_OK;
}

/* The CUDA plugin has no kernels for EI_RANK_ANTIDIAGONAL yet: its plans
   would silently differ from the CPU's, so profiling there is refused. */
static ei_result ei__check_gpu_ranking(const ei_context *ctx) {
    if (ctx->cfg.ranking == EI_RANK_ANTIDIAGONAL)
        return ei__fail(ctx, EI_ERR_UNSUPPORTED,
                        "EI_RANK_ANTIDIAGONAL is a CPU ranking: profile on the CPU backend, or rank with EI_RANK_SAMPLED "
                        "on the CUDA backend");
    return EI_OK;
}

static ei_result ei__profile_ws_size(const ei_context *ctx, int64_t n_tokens, int32_t n_heads,
                                          int32_t n_kv_heads, int32_t head_dim, size_t *bytes) {
    ei__profile_ws w;
    ei_result r = ei__check_sizes(ctx, n_tokens, n_heads, n_kv_heads, head_dim, bytes);
    if (r != EI_OK) return r;
    if (ei__on_gpu(ctx)) {
        if ((r = ei__check_gpu_ranking(ctx)) != EI_OK) return r;
        return EI__CUDA(ctx, profile_workspace_size, &ctx->cfg, n_tokens, n_heads, n_kv_heads, head_dim, bytes);
    }
    if (!ei__profile_ws_layout(&ctx->cfg, n_tokens, n_heads / n_kv_heads, head_dim, &w, NULL, 0, bytes))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "profiling workspace for %lld tokens overflows size_t", (long long)n_tokens);
    return EI_OK;
}

/* Min/max representation of key blocks [b0, b1) of kv head kvh, stored
   transposed ([d][ld]) so block scores vectorise across blocks. Blocks go
   EI__KREP_GROUP at a time through stage ([group][2][d]) and leave it a run
   of columns per dimension: written one block at a time, each block's 2d
   floats would land in 2d cache lines ld floats apart, and with ld a
   multiple of 1024 (4 KiB) those lines share one L1 set (a 32k-token plan
   built its keys 3-4 times slower that way). */
static int ei__build_key_reps(const ei__kernels *K, const ei_tensor *k, int32_t kvh, int32_t bs, int64_t b0, int64_t b1,
                              float *kmaxT, float *kminT, int64_t ld, float *stage) {
    int64_t b, j, cnt;
    int32_t i, d = k->head_dim;
    for (b = b0; b < b1; b += cnt) {
        cnt = EI__MIN(b1 - b, (int64_t)EI__KREP_GROUP);
        for (j = 0; j < cnt; ++j) {
            float *mx = stage + (size_t)j * 2u * (size_t)d;
            if (!K->minmax(k, (b + j) * bs, bs, kvh, mx, mx + d)) return 0;
        }
        for (i = 0; i < d; ++i) {
            float *xo = kmaxT + (size_t)i * (size_t)ld + (size_t)b, *no = kminT + (size_t)i * (size_t)ld + (size_t)b;
            for (j = 0; j < cnt; ++j) {
                xo[j] = stage[(size_t)j * 2u * (size_t)d + (size_t)i];
                no[j] = stage[(size_t)j * 2u * (size_t)d + (size_t)d + (size_t)i];
            }
        }
    }
    /* zero the padding columns (read, never used, by full-width loads) */
    if (b1 > 0)
        for (i = 0; i < d; ++i)
            for (b = b1; b < ei__round_up(b1, 16) && b < ld; ++b)
                kmaxT[(size_t)i * (size_t)ld + (size_t)b] = kminT[(size_t)i * (size_t)ld + (size_t)b] = 0.0f;
    return 1;
}
/* Query representations of segment s for the G query heads of kv head kvh. */
static int ei__build_query_reps_heads(const ei__kernels *K, const ei_tensor *q, int64_t row0, int64_t nrows, int32_t kvh,
                                      int32_t G, int32_t g0, int32_t g1, float *qrep) {
    int32_t g, d = q->head_dim;
    for (g = g0; g < g1; ++g) {
        float *qx = qrep + (size_t)g * 2u * (size_t)d;
        if (!K->minmax(q, row0, nrows, kvh * G + g, qx, qx + d)) return 0;
    }
    return 1;
}
static int ei__build_query_reps(const ei__kernels *K, const ei_tensor *q, int64_t row0, int64_t nrows, int32_t kvh,
                                int32_t G, float *qrep) {
    return ei__build_query_reps_heads(K, q, row0, nrows, kvh, G, 0, G, qrep);
}

/* The same over nth threads, each the reps of a range of the group's heads
   (ei_profile_chunk_mt with fewer kv heads than threads); one thread below
   EI__QREP_SPLIT_MIN elements (handing a share to a worker and joining it
   costs some microseconds, ei__pool). */
typedef struct ei__qrep_split {
    const ei__kernels *K;
    const ei_tensor *q;
    int64_t row0, nrows;
    int32_t kvh, G;
    float *qrep;
} ei__qrep_split;
static ei_result ei__qrep_share(void *arg, int ith, int nth, void *ws, size_t ws_bytes) {
    const ei__qrep_split *j = (const ei__qrep_split *)arg;
    (void)ws; (void)ws_bytes;
    return ei__build_query_reps_heads(j->K, j->q, j->row0, j->nrows, j->kvh, j->G, (int32_t)((int64_t)j->G * ith / nth),
                                      (int32_t)((int64_t)j->G * (ith + 1) / nth), j->qrep)
               ? EI_OK
               : EI_ERR_NONFINITE;
}
#define EI__QREP_SPLIT_MIN ((int64_t)1 << 18)
static int ei__build_query_reps_mt(const ei_context *ctx, const ei_tensor *q, int64_t row0, int64_t nrows, int32_t kvh,
                                   int32_t G, float *qrep, int nth) {
    const ei__kernels *K = ctx->kern;
    ei__qrep_split j;
    if (nrows * G * q->head_dim < EI__QREP_SPLIT_MIN || EI__MIN(nth, G) <= 1)
        return ei__build_query_reps(K, q, row0, nrows, kvh, G, qrep);
    j.K = K; j.q = q; j.row0 = row0; j.nrows = nrows; j.kvh = kvh; j.G = G; j.qrep = qrep;
    return ei__fork_join(ctx, ei__qrep_share, &j, EI__MIN(nth, G), NULL, 0) == EI_OK;
}

/* The checks every profiling call shares; n_keys: the valid keys of k (the
   chunked calls let k hold more cells); q NULL: a final chunked call without
   new queries. */
static ei_result ei__check_profile_args(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                        const ei_plan *plan, int64_t n_keys, int32_t kv0, int32_t kv1) {
    ei_result r = q ? ei__check_qk(ctx, q, k) : ei__check_tensor(ctx, k, "k");
    if (r != EI_OK) return r;
    if ((r = kv0 == 0 ? ei__check_plan_layout(ctx, plan) : ei__check_plan_seal(ctx, plan)) != EI_OK ||
        (r = ei__check_plan_side(ctx, plan)) != EI_OK)
        return r;
    if (plan->n_kv_heads != k->n_heads)
        return ei__fail(ctx, EI_ERR_SHAPE, "plan has %d kv heads, k has %d", (int)plan->n_kv_heads, (int)k->n_heads);
    if (plan->head_dim != k->head_dim)
        return ei__fail(ctx, EI_ERR_SHAPE, "plan head_dim %d, k head_dim %d", (int)plan->head_dim, (int)k->head_dim);
    if (plan->segment_size != ctx->cfg.segment_size || plan->block_size != ctx->cfg.block_size)
        return ei__fail(ctx, EI_ERR_SHAPE, "plan was laid out for segment %d / block %d, context has %d / %d",
                        (int)plan->segment_size, (int)plan->block_size, (int)ctx->cfg.segment_size, (int)ctx->cfg.block_size);
    if (n_keys > plan->max_tokens)
        return ei__fail(ctx, EI_ERR_SIZE, "%lld tokens exceed the plan's capacity of %lld", (long long)n_keys,
                        (long long)plan->max_tokens);
    if (ei__max_keep(&ctx->cfg, plan->blk_capacity) > plan->max_keep)
        return ei__fail(ctx, EI_ERR_SHAPE, "plan rows hold %d blocks, this context's budgets need %d: lay the plan out with this context",
                        (int)plan->max_keep, (int)ei__max_keep(&ctx->cfg, plan->blk_capacity));
    if (kv0 < 0 || kv1 > k->n_heads || kv0 >= kv1)
        return ei__fail(ctx, EI_ERR_SIZE, "kv head range [%d, %d) is not inside [0, %d)", (int)kv0, (int)kv1, (int)k->n_heads);
    return EI_OK;
}

/* Row s of head kvh: its keep count and its ranked blocks. sc: the ranking
   score of the nvis visible blocks (the reference's raw block score, or the
   sampled mass); wt: the weights top_p adds up (the sampled mass), NULL for
   the reference ranking (its softmax weights, from sc); budget: the
   recurrence's. The always-kept blocks lead the row (ei__forced_blocks); the
   row holds the head's own count (ragged) or every block it could keep
   (per_segment_budget: ei_plan_finalize trims). */
static void ei__plan_rank_row(const ei_config *c, ei_plan *plan, int32_t kvh, int32_t s, const float *sc, const float *wt,
                              int64_t nvis, int64_t cap, double budget, ei__ranked *pairs) {
    size_t row = (size_t)kvh * (size_t)plan->seg_capacity + (size_t)s;
    int32_t *idx = plan->block_index + row * (size_t)plan->max_keep;
    int64_t n_sink = 0, local0 = 0, nf = 0, np = 0, ranked = 0, k_p = -1, k, i, b;
    for (i = 0; i < plan->max_keep; ++i) idx[i] = -1;
    if (s == 0) { plan->keep_blocks[row] = plan->keep_count[row] = 0; return; }
    nf = ei__forced_blocks(c, nvis, &n_sink, &local0);
    /* the ranked candidates: the visible blocks that are not always kept */
    for (b = n_sink; b < local0; ++b) { pairs[np].score = sc[b]; pairs[np].index = (int32_t)b; ++np; }
    if (c->top_p > 0.0) { /* the fewest blocks, forced first, whose weight reaches top_p of the row's */
        float m = -FLT_MAX;
        double total = 0.0, cum = 0.0;
        if (!wt) for (b = 0; b < nvis; ++b) m = sc[b] > m ? sc[b] : m;
#define EI__W(b) (wt ? (double)wt[b] : (double)expf(sc[b] - m))
        for (b = 0; b < nvis; ++b) total += EI__W(b);
        for (b = 0; b < n_sink; ++b) cum += EI__W(b);
        for (b = local0; b < nvis; ++b) cum += EI__W(b);
        ranked = EI__MIN(np, (int64_t)plan->max_keep); /* past the row capacity the count is clamped anyway */
        ei__select_top(pairs, np, ranked);
        qsort(pairs, (size_t)ranked, sizeof *pairs, ei__ranked_cmp);
        for (k_p = nf, i = 0; cum < c->top_p * total && i < ranked; ++i, ++k_p) cum += EI__W(pairs[i].index);
        if (cum < c->top_p * total) ++k_p; /* not reached within the row's capacity */
        if (!(total > 0.0)) k_p = 0;
#undef EI__W
    }
    plan->keep_blocks[row] = ei__keep_count(c, s, budget, k_p, nf, cap, plan->max_keep);
    plan->keep_count[row] = plan->keep_blocks[row];
    k = c->per_segment_budget ? EI__MIN((int64_t)plan->max_keep, cap) : plan->keep_blocks[row];
    for (i = 0, b = 0; b < n_sink && i < k; ++b) idx[i++] = (int32_t)b;
    for (b = local0; b < nvis && i < k; ++b) idx[i++] = (int32_t)b;
    if (k - i > ranked) { /* pairs[0..ranked) are in rank order */
        ranked = EI__MIN(k - i, np);
        ei__select_top(pairs, np, ranked);
        qsort(pairs, (size_t)ranked, sizeof *pairs, ei__ranked_cmp);
    }
    for (b = 0; i < k && b < ranked; ++b) idx[i++] = pairs[b].index;
}


/* The candidates [n][dq] regrouped for spread_step: t [dq/4][n rounded up
   to 16][4] (4 bytes of 16 candidates in 64 bytes; candidates past n zero,
   and their sum128 entries, which the rounding wrote for the first n). */
static void ei__spread_regroup(const int8_t *cand, int64_t n, int32_t dq, int8_t *t, int32_t *sum128) {
    const int64_t n16 = ei__round_up(n, 16);
    int64_t c;
    int32_t g;
    for (c = 0; c < n16; ++c) {
        const int8_t *x = c < n ? cand + (size_t)c * (size_t)dq : NULL;
        for (g = 0; g < dq / 4; ++g) {
            int8_t *o = t + ((size_t)g * (size_t)n16 + (size_t)c) * 4u;
            if (x) memcpy(o, x + (size_t)g * 4u, 4);
            else memset(o, 0, 4);
        }
        if (!x) sum128[c] = 0;
    }
}
/* EI_RANK_ROWS_SPREAD (CONCEPTS: ranking): segment s's rows picked by
   farthest point among its candidates (tokens t0 + j st, every query head of
   kv head kvh's group; q holds the queries of tokens from q_pos on, all of
   the segment's), into w->sp_tok / sp_head in token order, then head.
   Returns 0 if a candidate holds NaN or +-inf. */
static int ei__spread_rows(const ei_context *ctx, const ei_tensor *q, int64_t q_pos, int32_t kvh, int32_t G, int32_t s,
                           ei__profile_ws *w) {
    const ei_config *c = &ctx->cfg;
    const int64_t t0 = (int64_t)s * c->segment_size, st = ei__spread_stride(c, G, q->head_dim);
    const int64_t C = ei__spread_candidates(c, G, q->head_dim);
    const int32_t dq = (int32_t)ei__round_up(q->head_dim, 4), R = c->rank_samples;
    void (*dots)(const int8_t *, int64_t, int32_t, const int8_t *, int32_t *) = ctx->kern->spread_dots;
    int64_t (*step)(const int8_t *, const int32_t *, int64_t, int32_t, const int8_t *, double, const double *, double *) =
        (ctx->i8dot & EI__I8DOT_AVX512VNNI) ? ctx->kern->spread_step : NULL;
    int64_t b, pick, *idx = w->sp_tok;
    int32_t n = 0, i, g;
    for (b = 0; b < C; ++b) { /* candidate b = j G + g: the path's int8 rounding, 1 / sqrt(its norm) */
        ei__rank_keys rk;
        ei_tensor v = *q;
        int8_t *r = w->sp8 + (size_t)b * (size_t)dq;
        int32_t nn;
        g = (int32_t)(b % G);
        v.data = ei__row(q, t0 + (b / G) * st - q_pos, 0);
        v.n_tokens = 1;
        rk.k = r;
        rk.s = w->sp_s + b;
        rk.sum128 = w->sp_sum128 + b; /* 128 x its byte sum, for spread_step */
        rk.n = 0;
        rk.head = kvh * G + g;
        if (ctx->kern->rank_round_i8(&rk, &v, kvh * G + g, 1, w->keys)) return 0;
        dots(r, 1, dq, r, &nn);
        w->sp_r[b] = nn > 0 ? 1.0 / sqrt((double)nn) : 0.0;
        w->sp_best[b] = -2.0;
    }
    if (step) ei__spread_regroup(w->sp8, C, dq, w->sp8g, w->sp_sum128);
    pick = ei__spread_first(c, G, q->head_dim);
    for (;;) {
        double best = 4.0, rp = w->sp_r[pick];
        int64_t next = 0;
        idx[n++] = pick;
        if (n == R || n == C) break;
        w->sp_best[pick] = 3.0; /* taken: above every cosine */
        if (step) {
            pick = step(w->sp8g, w->sp_sum128, C, dq, w->sp8 + (size_t)pick * (size_t)dq, rp, w->sp_r, w->sp_best);
            continue;
        }
        dots(w->sp8, C, dq, w->sp8 + (size_t)pick * (size_t)dq, w->sp_dot);
        for (b = 0; b < C; ++b) { /* each candidate's largest cosine to the rows so far; the smallest is next */
            double cs = (double)w->sp_dot[b] * w->sp_r[b] * rp;
            if (cs > w->sp_best[b]) w->sp_best[b] = cs;
            if (w->sp_best[b] < best) {
                best = w->sp_best[b];
                next = b;
            }
        }
        pick = next;
    }
    for (i = 1; i < n; ++i) { /* token order (then head): candidate order */
        int64_t v = idx[i];
        int32_t k = i;
        for (; k > 0 && idx[k - 1] > v; --k) idx[k] = idx[k - 1];
        idx[k] = v;
    }
    for (i = 0; i < n; ++i) {
        w->sp_head[i] = kvh * G + (int32_t)(idx[i] % G);
        idx[i] = t0 + (idx[i] / G) * st;
    }
    w->sp_n = n;
    w->sp_seg = s;
    return 1;
}
/* Which rows segment s's sampled ranking scores in this call: w->sp_* holds
   the spread rows where EI_RANK_ROWS_SPREAD applies (the call's rows [t_lo,
   t_hi) hold the whole segment), else sp_seg is -1 (the even rows). Returns
   how many rows there are, or -1 if a candidate is not finite. */
static int32_t ei__sample_rows_pick(const ei_context *ctx, const ei_tensor *q, int64_t q_pos, int32_t kvh, int32_t G, int32_t s,
                                int64_t t_lo, int64_t t_hi, ei__profile_ws *w) {
    w->sp_seg = -1;
    w->sp_n = 0;
    if (!ei__spread_whole(&ctx->cfg, s, q_pos, t_lo, t_hi)) return ctx->cfg.rank_samples;
    return ei__spread_rows(ctx, q, q_pos, kvh, G, s, w) ? w->sp_n : -1;
}
/* Row i of segment s's sampled rows: its token, and its query head in *head. */
static int64_t ei__sample_row(const ei_config *c, const ei__profile_ws *w, int32_t kvh, int32_t G, int32_t s, int32_t i,
                              int32_t *head) {
    if (w->sp_seg == s) {
        *head = w->sp_head[i];
        return w->sp_tok[i];
    }
    *head = kvh * G + i % G;
    return ei__sample_token(c, s, i);
}

/* ei__sample_mass with EI_RANK_PRECISION_INT8: each row rounded to int8
   (the path's rank_round_i8, the bytes of ei__quant_i8; NaN or +-inf in
   it: 0) into the layouts of ei__rank_q8, then the path's int8 kernel. */
static int ei__sample_mass_i8(const ei_context *ctx, const ei_tensor *q, int64_t q_pos, const ei_tensor *k, int32_t kvh,
                              int32_t G, int32_t s, int64_t t_lo, int64_t t_hi, float *mass, int32_t *rows,
                              ei__profile_ws *w) {
    enum { R = EI__SAMPLE_ROWS };
    const ei_config *c = &ctx->cfg;
    const int32_t d = k->head_dim, dq = (int32_t)ei__round_up(d, 4);
    const float scale = c->attn_scale > 0.0f ? c->attn_scale : 1.0f / sqrtf((float)d);
    int8_t *q8 = (int8_t *)w->sq8, *row = q8 + (size_t)dq * R * 4u;
    uint8_t *qu = (uint8_t *)(q8 + (size_t)dq * R);
    int16_t *q16 = (int16_t *)(void *)(q8 + (size_t)dq * R * 2u);
    ei__rank_q8 b;
    int64_t tok[EI__SAMPLE_ROWS];
    int32_t i = 0, nr, e, sum, n_rows;
    if (w->k8.head != kvh) { /* another kv head's keys: rounded anew */
        w->k8.head = kvh;
        w->k8.n = 0;
    }
    b.kc = &w->k8;
    b.q = q8;
    b.qu = qu;
    b.q16 = q16;
    b.dq = dq;
    b.dot = ctx->i8dot;
    if ((n_rows = ei__sample_rows_pick(ctx, q, q_pos, kvh, G, s, t_lo, t_hi, w)) < 0) return 0;
    while (i < n_rows) {
        memset(q8, 0, (size_t)dq * R);
        memset(qu, 0x80, (size_t)dq * R);
        memset(q16, 0, (size_t)dq * R * 2u);
        memset(b.s, 0, sizeof b.s);
        for (nr = 0; i < n_rows && nr < R; ++i) { /* the next batch of rows, in columns */
            int32_t h;
            int64_t t = ei__sample_row(c, w, kvh, G, s, i, &h);
            ei__rank_keys rk;
            ei_tensor qv = *q; /* the row as a one-row view */
            if (t < t_lo || t >= t_hi) continue;
            tok[nr] = t;
            qv.data = ei__row(q, t - q_pos, h);
            qv.n_tokens = 1;
            rk.k = row;
            rk.s = &b.s[nr];
            rk.sum128 = &sum;
            rk.n = 0;
            rk.head = 0;
            if (ctx->kern->rank_round_i8(&rk, &qv, 0, 1, w->keys)) return 0;
            for (e = 0; e < dq; e += 4) { /* row bytes from d to dq are zero */
                size_t o = ((size_t)(e / 4) * R + (size_t)nr) * 4u;
                memcpy(q8 + o, row + e, 4);
                qu[o] = (uint8_t)(row[e] + 128);
                qu[o + 1] = (uint8_t)(row[e + 1] + 128);
                qu[o + 2] = (uint8_t)(row[e + 2] + 128);
                qu[o + 3] = (uint8_t)(row[e + 3] + 128);
                o = ((size_t)(e / 2) * R + (size_t)nr) * 2u;
                q16[o] = row[e];
                q16[o + 1] = row[e + 1];
                q16[o + 2 * R] = row[e + 2];
                q16[o + 2 * R + 1] = row[e + 3];
            }
            ++nr;
        }
        if (!nr) break;
        if (!ctx->kern->rank_mass_i8(&b, tok, nr, k, kvh, scale, c->block_size,
                                     (int64_t)s * (c->segment_size / c->block_size), w->logits, w->keys, mass))
            return 0;
        *rows += nr;
    }
    return 1;
}

/* EI_RANK_SAMPLED: add to mass[0..nvis) the block mass of the sampled rows
   of segment s whose tokens lie in [t_lo, t_hi) (CONCEPTS: ranking). q holds
   the queries of tokens from q_pos on; k every key up to the last row's
   token. Rows are scored in batches against tiles of keys converted to f32
   once, then softmaxed and summed per block in row order, so a segment whose
   rows arrive over several chunks gets the same sums as in one call.
   *rows counts the rows added. Returns 0 if a score is not finite. */
static int ei__sample_mass(const ei_context *ctx, const ei_tensor *q, int64_t q_pos, const ei_tensor *k, int32_t kvh,
                           int32_t G, int32_t s, int64_t t_lo, int64_t t_hi, float *mass, int32_t *rows, ei__profile_ws *w) {
    const ei_config *c = &ctx->cfg;
    const int32_t d = k->head_dim;
    const float scale = c->attn_scale > 0.0f ? c->attn_scale : 1.0f / sqrtf((float)d);
    int64_t tok[EI__SAMPLE_ROWS];
    int32_t i = 0, nr, e, n_rows;
    if (ei__rank_int8(c)) return ei__sample_mass_i8(ctx, q, q_pos, k, kvh, G, s, t_lo, t_hi, mass, rows, w);
    if ((n_rows = ei__sample_rows_pick(ctx, q, q_pos, kvh, G, s, t_lo, t_hi, w)) < 0) return 0;
    while (i < n_rows) {
        memset(w->sq, 0, (size_t)d * EI__SAMPLE_ROWS * sizeof(float));
        for (nr = 0; i < n_rows && nr < EI__SAMPLE_ROWS; ++i) { /* the next batch of rows, in columns */
            int32_t h;
            int64_t t = ei__sample_row(c, w, kvh, G, s, i, &h);
            if (t < t_lo || t >= t_hi) continue;
            tok[nr] = t;
            ei__row_to_f32(ei__row(q, t - q_pos, h), q->dtype, d, w->qtmp);
            for (e = 0; e < d; ++e) w->sq[(size_t)e * EI__SAMPLE_ROWS + (size_t)nr] = w->qtmp[e];
            ++nr;
        }
        if (!nr) break;
        if (!ctx->kern->rank_mass(w->sq, tok, nr, k, kvh, scale, c->block_size, (int64_t)s * (c->segment_size / c->block_size),
                                    w->logits, w->keys, mass, NULL))
            return 0;
        *rows += nr;
    }
    return 1;
}

/* EI_RANK_ANTIDIAGONAL: the tiles whose query block starts at token
   t0 + bs * qb are [*i0, *i1) (tile i's block is ((2i + 1) nt) / (2R),
   nondecreasing in i). */
static void ei__antidiag_tiles_of_block(const ei_config *c, int64_t qb, int32_t *i0, int32_t *i1) {
    int64_t nt = c->segment_size / c->block_size, R = c->rank_samples, lo = 0, hi = R;
    while (lo < hi) { /* the first tile whose block is >= qb */
        int64_t mid = (lo + hi) / 2;
        if (((2 * mid + 1) * nt) / (2 * R) < qb) lo = mid + 1; else hi = mid;
    }
    *i0 = (int32_t)lo;
    for (hi = lo; hi < R && ((2 * hi + 1) * nt) / (2 * R) == qb; ++hi) {}
    *i1 = (int32_t)hi;
}
/* One row of EI_RANK_ANTIDIAGONAL (CONCEPTS: ranking): query qf (f32) at
   token u scores the keys of the ns sink blocks (j < ns bs, j <= u) and the
   keys j = m bs + p (p its phase) of the later blocks up to u; a phase key
   stands for its block's bs keys (weight bs: the row's softmax is then an
   estimate of its softmax over every key, with the sink blocks, whose mass a
   stride would miss, exact). Its weight on each block b < nvis is added to
   mass[b]. lg holds u + 1 floats, kf d floats. 0 if a score is not finite. */
static int ei__antidiag_row(const ei_context *ctx, const float *qf, int64_t u, int32_t p, const ei_tensor *k, int32_t kvh,
                            float scale, int64_t ns, int64_t nvis, float *lg, float *kf, float *mass) {
    const int32_t d = k->head_dim, bs = ctx->cfg.block_size;
    const int64_t n_sink = EI__MIN(ns * bs, u + 1);
    int64_t j, m, n_lg = 0;
    float mx = -FLT_MAX, wp = (float)bs;
    double z = 0.0, inv;
    for (j = 0; j < n_sink; ++j, ++n_lg) { /* the sink blocks, every key */
        const float *kr = k->dtype == EI_F32 ? (const float *)ei__row(k, j, kvh) : kf;
        if (k->dtype != EI_F32) ei__row_to_f32(ei__row(k, j, kvh), k->dtype, d, kf);
        lg[n_lg] = ctx->kern->dot(qf, kr, d) * scale;
    }
    for (j = ns * bs + p; j <= u; j += bs, ++n_lg) { /* one key of every later block */
        const float *kr = k->dtype == EI_F32 ? (const float *)ei__row(k, j, kvh) : kf;
        if (k->dtype != EI_F32) ei__row_to_f32(ei__row(k, j, kvh), k->dtype, d, kf);
        lg[n_lg] = ctx->kern->dot(qf, kr, d) * scale;
    }
    for (j = 0; j < n_lg; ++j) {
        if (!(lg[j] - lg[j] == 0.0f)) return 0;
        mx = lg[j] > mx ? lg[j] : mx;
    }
    for (j = 0; j < n_lg; ++j) {
        lg[j] = expf(lg[j] - mx) * (j < n_sink ? 1.0f : wp);
        z += (double)lg[j];
    }
    inv = 1.0 / z;
    for (j = 0; j < n_sink && j < nvis * bs; ++j) mass[j / bs] += (float)((double)lg[j] * inv);
    for (m = ns, j = n_sink; j < n_lg && m < nvis; ++j, ++m) mass[m] += (float)((double)lg[j] * inv);
    return 1;
}
/* EI_RANK_ANTIDIAGONAL through the path's group kernel: tiles [g0, g1) of
   segment s (whole query blocks' tiles, at most the kernel's lanes), their
   rows in [lo, hi) scored together, then added to mass in token order (the
   tiles of one query block in tile order), as the per-row path does.
   *any: whether a row was in range. */
static int ei__antidiag_group_mass(const ei_context *ctx, const ei_tensor *q, int64_t q_pos, const ei_tensor *k,
                                   int32_t kvh, int32_t G, int32_t s, int32_t g0, int32_t g1, int64_t lo, int64_t hi,
                                   float *mass, int32_t *rows, ei__profile_ws *w) {
    const ei_config *c = &ctx->cfg;
    const int32_t d = k->head_dim, bs = c->block_size, V = ctx->kern->antidiag_lanes;
    const float scale = c->attn_scale > 0.0f ? c->attn_scale : 1.0f / sqrtf((float)d);
    const int64_t t0 = (int64_t)s * c->segment_size, nvis = t0 / bs, ns = EI__MIN((int64_t)c->sink_blocks, nvis);
    int64_t idx, m;
    int32_t p, t, e, given = 0;
    memset(w->ad_q, 0, (size_t)bs * (size_t)d * (size_t)V * sizeof(float));
    for (p = 0; p < bs; ++p)
        for (t = 0; t < V; ++t) {
            int64_t u = g0 + t < g1 ? ei__antidiag_tile_token(c, s, g0 + t) + (bs - 1 - p) : -1;
            float *qp = w->ad_q + (size_t)p * (size_t)d * (size_t)V;
            w->ad_u[p * V + t] = u >= lo && u < hi ? u : -1;
            if (w->ad_u[p * V + t] < 0) continue;
            ei__row_to_f32(ei__row(q, u - q_pos, kvh * G + (g0 + t) % G), q->dtype, d, w->qtmp);
            for (e = 0; e < d; ++e) qp[(size_t)e * (size_t)V + (size_t)t] = w->qtmp[e];
            ++given;
        }
    if (!given) return 1;
    if (!ctx->kern->antidiag_group(w->ad_q, w->ad_u, k, kvh, scale, bs, ns, w->ad_ld, w->ad_w, w->keys)) return 0;
    /* the rows in token order (a query block's tiles in tile order): their weight rows and last blocks */
    for (t = 0, given = 0; t < g1 - g0;) {
        int32_t t1 = t, r;
        int64_t qb = (ei__antidiag_tile_token(c, s, g0 + t) - t0) / bs;
        while (g0 + t1 < g1 && (ei__antidiag_tile_token(c, s, g0 + t1) - t0) / bs == qb) ++t1;
        for (r = 0; r < bs; ++r)
            for (e = t; e < t1; ++e) {
                int64_t u = w->ad_u[(bs - 1 - r) * V + e];
                if (u < 0) continue;
                w->ad_row[given] = (int64_t)(bs - 1 - r) * w->ad_ld * V + e;
                w->ad_last[given++] = EI__MIN(nvis, (u - (bs - 1 - r)) / bs + 1);
            }
        t = t1;
    }
    /* block by block, each block's rows in token order: the additions of the row-by-row order, in
       another loop order (one pass over the weights instead of one per row) */
    for (m = 0; m < ns; ++m) {
        float acc = mass[m];
        for (e = 0; e < given; ++e)
            for (idx = m * bs; idx < (m + 1) * bs; ++idx) acc += w->ad_w[w->ad_row[e] + idx * V];
        mass[m] = acc;
    }
    for (m = ns; m < nvis; m += 8) { /* 8 blocks at a time: 8 independent chains of additions */
        const int64_t at = (ns * bs + m - ns) * V, nm = EI__MIN((int64_t)8, nvis - m);
        float acc[8];
        int64_t x;
        for (x = 0; x < nm; ++x) acc[x] = mass[m + x];
        for (e = 0; e < given; ++e) {
            const float *wr = w->ad_w + w->ad_row[e] + at;
            if (w->ad_last[e] >= m + 8 && nm == 8) {
                acc[0] += wr[0]; acc[1] += wr[V]; acc[2] += wr[2 * V]; acc[3] += wr[3 * V];
                acc[4] += wr[4 * V]; acc[5] += wr[5 * V]; acc[6] += wr[6 * V]; acc[7] += wr[7 * V];
            } else
                for (x = 0; x < nm && m + x < w->ad_last[e]; ++x) acc[x] += wr[x * V];
        }
        for (x = 0; x < nm; ++x) mass[m + x] = acc[x];
    }
    *rows += given;
    return 1;
}

/* EI_RANK_ANTIDIAGONAL: add to mass[0..nvis) the block mass of the rows of
   segment s's query tiles whose tokens lie in [t_lo, t_hi) (CONCEPTS:
   ranking): row r of a tile (token u, phase p = bs - 1 - r) scores one key
   of every block (ei__antidiag_row), so a tile's bs rows cover each
   (query block, key block) pair's antidiagonal for the cost of one sampled
   row. Rows are added in token order (tiles of one query block in tile
   order), so a segment's mass is the same bit for bit however chunks cut it
   and however threads split segments and kv heads. */
static int ei__antidiag_mass(const ei_context *ctx, const ei_tensor *q, int64_t q_pos, const ei_tensor *k, int32_t kvh,
                             int32_t G, int32_t s, int64_t t_lo, int64_t t_hi, float *mass, int32_t *rows,
                             ei__profile_ws *w) {
    const ei_config *c = &ctx->cfg;
    const int32_t d = k->head_dim, bs = c->block_size;
    const float scale = c->attn_scale > 0.0f ? c->attn_scale : 1.0f / sqrtf((float)d);
    const int64_t t0 = (int64_t)s * c->segment_size, nvis = t0 / bs;
    const int64_t ns = EI__MIN((int64_t)c->sink_blocks, nvis);
    const int64_t lo = EI__MAX(t0, t_lo), hi = EI__MIN(t0 + c->segment_size, t_hi), nt = c->segment_size / bs;
    int64_t u;
    int32_t i0 = 0, i1 = 0, i;
    /* the path's group kernel when a query block's tiles fit in its lanes (groups never split them) */
    if (ctx->kern->antidiag_group && w->ad_q && ei__ceil_div(c->rank_samples, nt) <= ctx->kern->antidiag_lanes) {
        int32_t g0 = 0, V = ctx->kern->antidiag_lanes;
        while (g0 < c->rank_samples) {
            int32_t g1 = g0, b0, b1;
            while (g1 < c->rank_samples) { /* whole query blocks' tiles, at most V */
                ei__antidiag_tiles_of_block(c, (ei__antidiag_tile_token(c, s, g1) - t0) / bs, &b0, &b1);
                if (b1 - g0 > V) break;
                g1 = b1;
            }
            if (ei__antidiag_tile_token(c, s, g0) < hi && ei__antidiag_tile_token(c, s, g1 - 1) + bs > lo &&
                !ei__antidiag_group_mass(ctx, q, q_pos, k, kvh, G, s, g0, g1, lo, hi, mass, rows, w))
                return 0;
            g0 = g1;
        }
        return 1;
    }
    for (u = lo; u < hi; ++u) {
        int32_t r = (int32_t)((u - t0) % bs);
        if (u == lo || r == 0) ei__antidiag_tiles_of_block(c, (u - t0) / bs, &i0, &i1);
        for (i = i0; i < i1; ++i) {
            ei__row_to_f32(ei__row(q, u - q_pos, kvh * G + i % G), q->dtype, d, w->qtmp);
            if (!ei__antidiag_row(ctx, w->qtmp, u, bs - 1 - r, k, kvh, scale, ns, nvis, w->logits, w->keys, mass)) return 0;
            ++*rows;
        }
    }
    return 1;
}
/* The block mass of segment s's rows in [t_lo, t_hi) by the context's ranking. */
static int ei__segment_mass(const ei_context *ctx, const ei_tensor *q, int64_t q_pos, const ei_tensor *k, int32_t kvh,
                            int32_t G, int32_t s, int64_t t_lo, int64_t t_hi, float *mass, int32_t *rows, ei__profile_ws *w) {
    if (ctx->cfg.ranking == EI_RANK_ANTIDIAGONAL)
        return ei__antidiag_mass(ctx, q, q_pos, k, kvh, G, s, t_lo, t_hi, mass, rows, w);
    return ei__sample_mass(ctx, q, q_pos, k, kvh, G, s, t_lo, t_hi, mass, rows, w);
}

/* Whole-prompt planning: the profiling checks and as many queries as keys. */
/* What a profiling call reads (q, k) and writes (the plan, ws_bytes of the
   workspace) must not meet (ei__check_regions). */
static ei_result ei__check_profile_regions(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                          const ei_plan *plan, const void *workspace, size_t ws_bytes) {
    ei__regions g;
    g.n = 0;
    if (q) ei__reg_view(&g, q, "q", "the ei_tensor q", 0);
    ei__reg_view(&g, k, "k", "the ei_tensor k", 0);
    ei__reg_plan(&g, plan, 1);
    ei__reg_workspace(&g, workspace, ws_bytes);
    return ei__check_regions(ctx, &g);
}
static ei_result ei__check_whole_prompt(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                        const ei_plan *plan, int32_t kv0, int32_t kv1) {
    ei_result r;
    if (!q) return ei__fail(ctx, EI_ERR_NULL, "q is NULL");
    r = ei__check_profile_args(ctx, q, k, plan, k ? k->n_tokens : 0, kv0, kv1);
    if (r == EI_OK && q->n_tokens != k->n_tokens)
        return ei__fail(ctx, EI_ERR_SHAPE, "whole-prompt planning needs as many queries (%lld) as keys (%lld)",
                        (long long)q->n_tokens, (long long)k->n_tokens);
    return r;
}

/* What a plan covers once its first n tokens are planned (both backends). */
static void ei__plan_covers(const ei_config *c, ei_plan *plan, int64_t n, int final) {
    plan->n_tokens = n;
    plan->n_segments = (int32_t)ei__ceil_div(n, c->segment_size);
    plan->n_blocks = (plan->n_segments - 1) * (c->segment_size / c->block_size);
    plan->final = final ? 1 : 0;
}

static ei_result ei__nonfinite(const ei_context *ctx, const char *what, int32_t head, int64_t tok) {
    return ei__fail(ctx, EI_ERR_NONFINITE, "NaN or Inf in %s (head %d, tokens from %lld)", what, (int)head, (long long)tok);
}

/* Kv head kvh's share of whole-prompt planning for segments [s0, s1), in
   two steps (ei_profile_mt's split over segments puts a join between them;
   each thread keeps its workspace, so step 2 finds the scores of step 1):
   step 1: the key-block representations (all of them: each part builds its
     own, n x d work against the scores' quadratic), then per segment the
     query representation, block scores (w->rows), softmax and entropy;
   step 2: the head's class from every segment's entropy, the budget
     recurrence up to s1 (in double, as one pass would), and the keep counts
     and ranked blocks of the part's segments. */
static ei_result ei__profile_part(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                                  int32_t kvh, int32_t s0, int32_t s1, int step, ei__profile_ws *w) {
    const ei_config *c = &ctx->cfg;
    const int64_t n = q->n_tokens, bps = c->segment_size / c->block_size, S = ei__ceil_div(n, c->segment_size);
    const int64_t nb = (S - 1) * bps, ld = ei__round_up(nb > 0 ? nb : 1, 16);
    const int32_t G = q->n_heads / k->n_heads, d = q->head_dim;
    const size_t row0 = (size_t)kvh * (size_t)plan->seg_capacity;
    int32_t s;
    if (step == 1) {
        if (!ei__build_key_reps(ctx->kern, k, kvh, c->block_size, 0, nb, w->kmaxT, w->kminT, ld, w->kstage) ||
            (n > nb * c->block_size && !ctx->kern->minmax(k, nb * c->block_size, n - nb * c->block_size, kvh, w->mx, w->mn)))
            return ei__nonfinite(ctx, "k", kvh, 0);
        for (s = s0; s < s1; ++s) {
            int64_t t0 = (int64_t)s * c->segment_size, cnt = EI__MIN((int64_t)c->segment_size, n - t0);
            float *prob = plan->scores ? plan->scores + (row0 + (size_t)s) * (size_t)EI__MAX(plan->blk_capacity, 1) : NULL;
            if (!ei__build_query_reps(ctx->kern, q, t0, cnt, kvh, G, w->qrep)) return ei__nonfinite(ctx, "q", kvh * G, t0);
            if (s == 0) { plan->entropy[row0] = ei__uniform_entropy(nb, prob); continue; }
            ctx->kern->score_row(w->qrep, G, d, w->kmaxT, w->kminT, ld, EI__MIN((int64_t)s * bps, nb),
                                 w->rows + (size_t)s * (size_t)ld);
            if (!ei__softmax_entropy(w->rows + (size_t)s * (size_t)ld, EI__MIN((int64_t)s * bps, nb), nb, w->tmp, prob,
                                     &plan->entropy[row0 + (size_t)s]))
                return ei__fail(ctx, EI_ERR_NONFINITE, "block scores of kv head %d segment %d overflow float32", (int)kvh, (int)s);
        }
    } else {
        int rigid = 1;
        double budget = 0.0;
        for (s = 1; s < S; ++s) /* segment 0 sees no blocks: its entropy does not count */
            if (!ei__entropy_rigid(c, plan->entropy[row0 + (size_t)s])) rigid = 0;
        if (s0 == 0) plan->head_class[kvh] = (uint8_t)(rigid ? EI_HEAD_RIGID : EI_HEAD_DYNAMIC);
        for (s = 0; s < s1; ++s) {
            size_t row = row0 + (size_t)s;
            int64_t cap = ei__cap_blocks(c, s, n, nb);
            const float *sc = w->rows + (size_t)s * (size_t)ld, *wt = NULL;
            budget = rigid ? (double)c->base_budget
                           : ei__budget_next(c, s, budget, plan->entropy[row], s > 0 ? plan->entropy[row - 1] : 0.0f);
            if (s < s0) continue;
            plan->budget[row] = (float)budget;
            if (ei__rank_by_mass(c, s)) {
                int32_t rows = 0;
                memset(w->mass, 0, (size_t)s * (size_t)bps * sizeof(float));
                if (!ei__segment_mass(ctx, q, 0, k, kvh, G, s, 0, n, w->mass, &rows, w))
                    return ei__fail(ctx, EI_ERR_NONFINITE, "sampled scores of kv head %d segment %d overflow float32", (int)kvh, (int)s);
                if (rows > 0) sc = wt = w->mass; /* a last segment too short for any row keeps the reference ranking */
            }
            ei__plan_rank_row(c, plan, kvh, s, sc, wt, EI__MIN((int64_t)s * bps, nb), s == 0 ? 0 : cap, budget, w->pairs);
        }
    }
    return EI_OK;
}

/* A thread's workspace for whole-prompt planning, laid out and checked. */
static ei_result ei__profile_ws_take(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, void *workspace,
                                     size_t ws_bytes, ei__profile_ws *w, size_t *need) {
    if (!ei__profile_ws_layout(&ctx->cfg, q->n_tokens, q->n_heads / k->n_heads, q->head_dim, w, workspace, ws_bytes, need))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "profiling workspace overflows size_t");
    if (!workspace) return ei__fail(ctx, EI_ERR_NULL, "workspace is NULL (%zu bytes needed)", *need);
    if (ws_bytes < *need) return ei__fail(ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %zu needed", ws_bytes, *need);
    return EI_OK;
}

static ei_result ei__profile_range(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                                   int32_t kv0, int32_t kv1, void *workspace, size_t ws_bytes) {
    ei__profile_ws w;
    size_t need;
    int32_t kvh, S;
    ei_result r = ei__check_whole_prompt(ctx, q, k, plan, kv0, kv1);
    if (r != EI_OK || (r = ei__profile_ws_take(ctx, q, k, workspace, ws_bytes, &w, &need)) != EI_OK ||
        (r = ei__check_profile_regions(ctx, q, k, plan, workspace, need)) != EI_OK)
        return r;
    S = (int32_t)ei__ceil_div(q->n_tokens, ctx->cfg.segment_size);
    for (kvh = kv0; kvh < kv1; ++kvh)
        if ((r = ei__profile_part(ctx, q, k, plan, kvh, 0, S, 1, &w)) != EI_OK ||
            (r = ei__profile_part(ctx, q, k, plan, kvh, 0, S, 2, &w)) != EI_OK)
            return r;
    if (kv0 == 0) ei__plan_covers(&ctx->cfg, plan, q->n_tokens, 1);
    return EI_OK;
}

EIDEF ei_result ei_plan_finalize(const ei_context *ctx, ei_plan *plan) {
    int32_t s, h, i;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if ((r = ei__check_plan(ctx, plan)) != EI_OK) return r;
    if (!ctx->cfg.per_segment_budget || plan->on_device) return EI_OK; /* the GPU profile finalises itself */
    for (s = 0; s < plan->n_segments; ++s) {
        int32_t kmax = 0;
        for (h = 0; h < plan->n_kv_heads; ++h)
            kmax = EI__MAX(kmax, plan->keep_blocks[(size_t)h * (size_t)plan->seg_capacity + (size_t)s]);
        for (h = 0; h < plan->n_kv_heads; ++h) {
            size_t row = (size_t)h * (size_t)plan->seg_capacity + (size_t)s;
            int32_t *idx = plan->block_index + row * (size_t)plan->max_keep;
            plan->keep_count[row] = kmax;
            for (i = kmax; i < plan->max_keep; ++i) idx[i] = -1;
        }
    }
    return EI_OK;
}

static ei_result ei__profile_heads(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                                 int32_t kv_begin, int32_t kv_end, void *workspace, size_t workspace_bytes) {
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (ei__on_gpu(ctx))
        return ei__fail(ctx, EI_ERR_UNSUPPORTED, "head ranges are a CPU feature: call ei_profile on the CUDA backend");
    return ei__profile_range(ctx, q, k, plan, kv_begin, kv_end, workspace, workspace_bytes);
}
static ei_result ei__profile_whole(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                           void *workspace, size_t workspace_bytes) {
    ei_result r;
    if (!ctx || !k) return ei__fail(ctx, EI_ERR_NULL, "context or k is NULL");
    if ((r = ei__check_whole_prompt(ctx, q, k, plan, 0, k->n_heads)) != EI_OK) return r;
    if (ei__on_gpu(ctx)) {
        size_t need;
        if ((r = ei__check_gpu_ranking(ctx)) != EI_OK ||
            (r = ei__profile_ws_size(ctx, q->n_tokens, q->n_heads, k->n_heads, q->head_dim, &need)) != EI_OK ||
            (r = ei__check_profile_regions(ctx, q, k, plan, workspace, need)) != EI_OK)
            return r;
        if ((r = EI__CUDA(ctx, profile, &ctx->cfg, q, k, plan, workspace, workspace_bytes)) == EI_OK)
            ei__plan_covers(&ctx->cfg, plan, q->n_tokens, 1);
        return r;
    }
    r = ei__profile_range(ctx, q, k, plan, 0, k->n_heads, workspace, workspace_bytes);
    return r != EI_OK ? r : ei_plan_finalize(ctx, plan);
}

/* ei_profile_mt: kv heads split evenly over the threads; with fewer kv
   heads than threads (Gemma 3 270M has one), each kv head's segments split
   over its threads instead (ei__profile_split), in the two steps of
   ei__profile_part with a join between them. */
typedef struct ei__profile_job {
    const ei_context *ctx;
    const ei_tensor *q, *k;
    ei_plan *plan;
    int step;                 /* 0: kv-head ranges; 1, 2: the steps of a segment split */
} ei__profile_job;
/* Thread ith of nth (nth > kv heads): its kv head, and the segments [s0, s1)
   of that head whose cost midpoint falls in its share, segment s costing
   s + 1 (its score row and sampled rows grow with the blocks it sees). */
static void ei__profile_split(int32_t n_kv, int64_t S, int ith, int nth, int32_t *kvh, int32_t *s0, int32_t *s1) {
    int32_t h = (int32_t)((int64_t)ith * n_kv / nth);
    int first = (int)(((int64_t)h * nth + n_kv - 1) / n_kv), last = (int)(((int64_t)(h + 1) * nth + n_kv - 1) / n_kv);
    int j = ith - first, m = last - first;
    double total = (double)S * (double)(S + 1) / 2.0, lo = total * j / m, hi = total * (j + 1) / m, cum = 0.0;
    int64_t s;
    *kvh = h;
    *s0 = *s1 = 0;
    for (s = 0; s < S; ++s) {
        double mid = cum + (double)(s + 1) / 2.0;
        if (mid < lo) *s0 = (int32_t)(s + 1);
        if (mid < hi) *s1 = (int32_t)(s + 1);
        cum += (double)(s + 1);
    }
}
static ei_result ei__profile_share(void *arg, int ith, int nth, void *ws, size_t ws_bytes) {
    const ei__profile_job *j = (const ei__profile_job *)arg;
    int32_t kv = j->k->n_heads, kvh, s0, s1;
    ei__profile_ws w;
    size_t need;
    ei_result r;
    if (j->step == 0)
        return ei__profile_range(j->ctx, j->q, j->k, j->plan, (int32_t)((int64_t)kv * ith / nth),
                                 (int32_t)((int64_t)kv * (ith + 1) / nth), ws, ws_bytes);
    if ((r = ei__profile_ws_take(j->ctx, j->q, j->k, ws, ws_bytes, &w, &need)) != EI_OK) return r;
    ei__profile_split(kv, ei__ceil_div(j->q->n_tokens, j->ctx->cfg.segment_size), ith, nth, &kvh, &s0, &s1);
    if (s0 >= s1) return EI_OK;
    return ei__profile_part(j->ctx, j->q, j->k, j->plan, kvh, s0, s1, j->step, &w);
}
static ei_result ei__profile_mt(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                              int n_threads, void *workspace, size_t workspace_bytes) {
    ei__profile_job job;
    size_t per;
    int nt;
    ei_result r;
    if (!ctx || !k) return ei__fail(ctx, EI_ERR_NULL, "context or k is NULL");
    if (ei__on_gpu(ctx)) return ei__profile_whole(ctx, q, k, plan, workspace, workspace_bytes);
    if (n_threads <= 0 || n_threads > EI__MAX_THREADS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_threads %d not in 1..%d", n_threads, EI__MAX_THREADS);
    if ((r = ei__check_whole_prompt(ctx, q, k, plan, 0, k->n_heads)) != EI_OK) return r;
    nt = (int)EI__MIN((int64_t)n_threads, EI__MAX((int64_t)k->n_heads, ei__ceil_div(q->n_tokens, ctx->cfg.segment_size)));
    if ((r = ei__profile_ws_size(ctx, q->n_tokens, q->n_heads, k->n_heads, q->head_dim, &per)) != EI_OK) return r;
    if (!workspace) return ei__fail(ctx, EI_ERR_NULL, "workspace is NULL (%d x %zu bytes needed)", nt, per);
    if (workspace_bytes / (size_t)nt < per)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %d threads x %zu needed", workspace_bytes, nt, per);
    if ((r = ei__check_profile_regions(ctx, q, k, plan, workspace, per * (size_t)nt)) != EI_OK) return r;
    job.ctx = ctx; job.q = q; job.k = k; job.plan = plan; job.step = 0;
    if (nt <= k->n_heads) {
        if ((r = ei__fork_join(ctx, ei__profile_share, &job, nt, workspace, per)) != EI_OK) return r;
    } else { /* fewer kv heads than threads: segments split, a join between the steps */
        job.step = 1;
        if ((r = ei__fork_join(ctx, ei__profile_share, &job, nt, workspace, per)) != EI_OK) return r;
        job.step = 2;
        if ((r = ei__fork_join(ctx, ei__profile_share, &job, nt, workspace, per)) != EI_OK) return r;
        ei__plan_covers(&ctx->cfg, plan, q->n_tokens, 1);
    }
    return ei_plan_finalize(ctx, plan);
}

// >>profile-chunked ---------------------------------------------------------
/* Chunked planning keeps, per kv head, the budget recurrence after every
   segment (ei__seg_state), the key-block min/max store and the query min/max
   of its open segment (the one the last chunk ended in). Planning segment s
   reads the recurrence row of s-1, the segment's query representation and
   the key store, and writes row s of the plan and of the recurrence; so a
   chunk plans the segments its queries touch, in order, and any segment can
   be planned again. A chunk that continues a segment merges its queries into
   the stored representation: min/max are exact, so a segment split across
   chunks gets its whole-prompt row once all its queries are in. */

/* Forget head kvh's segments [s0, s1): plan rows cleared, recurrence unknown. */
static void ei__chunk_clear_rows(ei_plan *plan, int32_t kvh, int64_t s0, int64_t s1) {
    int64_t s;
    s1 = EI__MIN(s1, (int64_t)plan->seg_capacity);
    for (s = EI__MAX(s0, (int64_t)0); s < s1; ++s) {
        size_t row = EI_PLAN_ROW(plan, kvh, s);
        int32_t i, *idx = plan->block_index + row * (size_t)plan->max_keep;
        plan->entropy[row] = plan->budget[row] = 0.0f;
        plan->keep_blocks[row] = plan->keep_count[row] = 0;
        for (i = 0; i < plan->max_keep; ++i) idx[i] = -1;
        if (plan->scores) memset(plan->scores + row * ei__plan_score_row(plan), 0, ei__plan_score_row(plan) * sizeof(float));
        memset(ei__plan_seg_state(plan, kvh, s), 0, sizeof(ei__seg_state));
    }
}

/* Bring head kvh's chunk end to q_pos. Rolling back forgets every segment
   from q_pos on (a segment cut at q_pos is planned again from the queries
   given after q_pos: those before it are not stored), and the key store
   (EI_PLAN_KEEP_KEYS) whole: an engine rolls back when its cache changed,
   and a change may reach below the cut (llama.cpp's context shift rotates
   the keys it keeps), so the next call builds the store from the cache
   again, as a plan without it does every call. Skipping ahead leaves the
   segments wholly inside the gap unplanned (their recurrence unknown). */
static void ei__chunk_seek(const ei_config *c, ei_plan *plan, int32_t kvh, int64_t q_pos) {
    ei__head_state *st = &ei__plan_states(plan)[kvh];
    int64_t s_pos = q_pos / c->segment_size;
    if (q_pos < st->tokens_done) {
        ei__chunk_clear_rows(plan, kvh, q_pos % c->segment_size ? s_pos + 1 : s_pos,
                             ei__ceil_div(st->tokens_done, c->segment_size));
        st->open_valid = 0;
        st->last_final = 0;
        st->blocks_done = 0;
    }
    st->tokens_done = q_pos;
}

/* One segment's block scores (score_row) over nth threads, each a range of
   blocks (multiples of 16: whole vectors); a block's score depends on its
   block alone, so the row is the one-thread row bit for bit. */
typedef struct ei__score_split {
    const ei__kernels *kern;
    const float *qrep, *kmaxT, *kminT;
    int32_t G, d;
    int64_t ld, nb;
    float *raw;
} ei__score_split;
static ei_result ei__score_share(void *arg, int ith, int nth, void *ws, size_t ws_bytes) {
    const ei__score_split *j = (const ei__score_split *)arg;
    int64_t b0 = ei__round_up(j->nb * ith / nth, 16), b1 = ith == nth - 1 ? j->nb : ei__round_up(j->nb * (ith + 1) / nth, 16);
    (void)ws; (void)ws_bytes;
    b1 = EI__MIN(b1, j->nb);
    if (b0 < b1) j->kern->score_row(j->qrep, j->G, j->d, j->kmaxT + b0, j->kminT + b0, j->ld, b1 - b0, j->raw + b0);
    return EI_OK;
}
/* Below this many blocks a thread's share would not pay for its hand-off. */
#define EI__SCORE_SPLIT_MIN_BLOCKS 512
static void ei__score_row_split(const ei_context *ctx, const float *qrep, int32_t G, int32_t d, const float *kmaxT,
                                const float *kminT, int64_t ld, int64_t nb, float *raw, int nth) {
    const ei__kernels *kern = ctx->kern;
    ei__score_split j;
    nth = (int)EI__MIN((int64_t)nth, nb / EI__SCORE_SPLIT_MIN_BLOCKS);
    if (nth <= 1) { kern->score_row(qrep, G, d, kmaxT, kminT, ld, nb, raw); return; }
    j.kern = kern; j.qrep = qrep; j.kmaxT = kmaxT; j.kminT = kminT; j.G = G; j.d = d; j.ld = ld; j.nb = nb; j.raw = raw;
    (void)ei__fork_join(ctx, ei__score_share, &j, nth, NULL, 0); /* the shares cannot fail */
}

/* Plan segment s of head kvh for a sequence whose chunk ends at n, from the
   segment's query representation qrep ([G][2][d]) and, when it is ranked by
   sampled mass, its mass row (else NULL). last_final: s is the last segment
   of a final call (the reference's cap of the last segment). */
static ei_result ei__chunk_plan_segment(const ei_context *ctx, const ei_tensor *k, ei_plan *plan, int32_t kvh,
                                        int32_t s, int64_t n, int last_final, const float *qrep, const float *mass,
                                        int32_t G, ei__profile_ws *w) {
    const ei_config *c = &ctx->cfg;
    ei__head_state *st = &ei__plan_states(plan)[kvh];
    ei__seg_state *cur = ei__plan_seg_state(plan, kvh, s), *prev = s > 0 ? cur - 1 : NULL;
    int64_t bps = c->segment_size / c->block_size, nvis = (int64_t)s * bps;
    int64_t ld = ei__round_up(plan->blk_capacity > 0 ? plan->blk_capacity : 1, 16); /* the store's and the workspace's */
    int64_t cap = last_final ? ei__cap_blocks(c, s, n, (ei__ceil_div(n, c->segment_size) - 1) * bps) : nvis;
    int32_t d = plan->head_dim;
    const int store = (plan->flags & EI_PLAN_KEEP_KEYS) != 0;
    float *kmaxT = store ? ei__plan_krep(plan, kvh) : w->kmaxT, *kminT = kmaxT + (size_t)d * (size_t)ld;
    int64_t *built = store ? &st->blocks_done : &w->krep_blocks;
    size_t row = EI_PLAN_ROW(plan, kvh, s);
    float *prob = plan->scores ? plan->scores + row * ei__plan_score_row(plan) : NULL;
    float h = 0.0f;
    double budget;
    /* the blocks the plan or (a head at a time) this call's workspace holds, then the rest up to the segment */
    if (!store && w->krep_head != kvh) w->krep_head = kvh, w->krep_blocks = 0;
    if (nvis > *built) {
        if (!ei__build_key_reps(ctx->kern, k, kvh, c->block_size, *built, nvis, kmaxT, kminT, ld, w->kstage))
            return ei__nonfinite(ctx, "k", kvh, *built * c->block_size);
        *built = nvis;
    }
    if (s > 0) {
        ei__score_row_split(ctx, qrep, G, d, kmaxT, kminT, ld, nvis, w->rows, w->score_threads);
        if (!ei__softmax_entropy(w->rows, nvis, nvis, w->tmp, prob, &h))
            return ei__fail(ctx, EI_ERR_NONFINITE, "block scores of kv head %d segment %d overflow float32", (int)kvh, (int)s);
        if (prob) memset(prob + nvis, 0, (ei__plan_score_row(plan) - (size_t)nvis) * sizeof(float));
    } else if (prob)
        memset(prob, 0, ei__plan_score_row(plan) * sizeof(float));
    ei__chunk_recurrence(c, s, prev, h, cur);
    plan->entropy[row] = h;
    plan->head_class[kvh] = (uint8_t)(cur->rigid_so_far ? EI_HEAD_RIGID : EI_HEAD_DYNAMIC);
    budget = ei__chunk_budget(c, cur);
    plan->budget[row] = (float)budget;
    ei__plan_rank_row(c, plan, kvh, s, mass ? mass : w->rows, mass, nvis, s == 0 ? 0 : cap, budget, w->pairs);
    return EI_OK;
}

/* Merge rows [r0, r0+nr) of q into the representation qrep ([G][2][d]). */
static int ei__merge_query_reps(const ei_context *ctx, const ei_tensor *q, int64_t r0, int64_t nr, int32_t kvh, int32_t G,
                                float *qrep, float *tmp, int nth) {
    int32_t g, i, d = q->head_dim;
    if (!ei__build_query_reps_mt(ctx, q, r0, nr, kvh, G, tmp, nth)) return 0;
    for (g = 0; g < G; ++g) {
        float *mx = qrep + (size_t)g * 2u * (size_t)d, *mn = mx + d;
        const float *tx = tmp + (size_t)g * 2u * (size_t)d, *tn = tx + d;
        for (i = 0; i < d; ++i) {
            mx[i] = tx[i] > mx[i] ? tx[i] : mx[i];
            mn[i] = tn[i] < mn[i] ? tn[i] : mn[i];
        }
    }
    return 1;
}

/* The chunk's checks, before any head's state changes. */
static ei_result ei__check_chunk(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_plan *plan,
                                 int64_t q_pos, int is_final, int32_t kv0, int32_t kv1) {
    int64_t n;
    int32_t kvh;
    ei_result r;
    if (q_pos < 0 || q_pos > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "q_pos %lld not in 0..%lld", (long long)q_pos, (long long)EI_MAX_TOKENS);
    /* q's count is a caller value too: in range before the sum is formed */
    if (q && (r = ei__check_tensor(ctx, q, "q")) != EI_OK) return r;
    n = q_pos + (q ? q->n_tokens : 0);
    if ((r = ei__check_profile_args(ctx, q, k, plan, n, kv0, kv1)) != EI_OK) return r;
    if (!plan->state) return ei__fail(ctx, EI_ERR_STATE, "chunked planning needs a plan made with EI_PLAN_CHUNKED");
    if (k->n_tokens < n)
        return ei__fail(ctx, EI_ERR_SHAPE, "the chunk's queries reach position %lld but k holds %lld keys", (long long)n - 1,
                        (long long)k->n_tokens);
    if (q && q->n_heads / k->n_heads > EI_MAX_CHUNK_GROUP)
        return ei__fail(ctx, EI_ERR_UNSUPPORTED, "chunked planning keeps up to %d query heads per kv head, q has %d",
                        EI_MAX_CHUNK_GROUP, (int)(q->n_heads / k->n_heads));
    if (plan->on_device) { /* the head states are device memory: every head ends at the plan's end (whole-range
                              calls); a query-group change is found on the device */
        if (!q && (!is_final || plan->n_tokens != q_pos || q_pos == 0))
            return ei__fail(ctx, EI_ERR_STATE,
                            "a call without queries finalises the plan where it ends: is_final = 1 and q_pos = %lld "
                            "(got q_pos %lld, is_final %d)",
                            (long long)plan->n_tokens, (long long)q_pos, is_final);
        return EI_OK;
    }
    for (kvh = kv0; kvh < kv1; ++kvh) {
        const ei__head_state *st = &ei__plan_states(plan)[kvh];
        if (q && st->group && st->open_valid && st->group != q->n_heads / k->n_heads)
            return ei__fail(ctx, EI_ERR_SHAPE, "kv head %d was planned with %d query heads per kv head, q has %d", (int)kvh,
                            (int)st->group, (int)(q->n_heads / k->n_heads));
        if (!q && (!is_final || st->tokens_done != q_pos || !st->open_valid || q_pos == 0))
            return ei__fail(ctx, EI_ERR_STATE,
                            "a call without queries finalises the plan where it ends: is_final = 1 and q_pos = %lld "
                            "(kv head %d; got q_pos %lld, is_final %d)",
                            (long long)st->tokens_done, (int)kvh, (long long)q_pos, is_final);
    }
    return EI_OK;
}

static ei_result ei__profile_chunk_range(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                                         int64_t q_pos, int is_final, int32_t kv0, int32_t kv1, void *workspace,
                                         size_t ws_bytes, int score_threads) {
    const ei_config *c = &ctx->cfg;
    ei__profile_ws w;
    size_t need;
    int64_t n, seg = c->segment_size, s_end;
    int32_t d, kvh, s;
    ei_result r = ei__check_chunk(ctx, q, k, plan, q_pos, is_final, kv0, kv1);
    if (r != EI_OK) return r;
    n = q_pos + (q ? q->n_tokens : 0); /* (both checked) */
    d = k->head_dim;
    /* the workspace is sized for the plan's capacity (and the largest group) */
    if (!ei__profile_ws_layout(c, plan->max_tokens, q ? q->n_heads / k->n_heads : ei__plan_states(plan)[kv0].group, d, &w,
                               workspace, ws_bytes, &need))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "profiling workspace overflows size_t");
    if (!workspace) return ei__fail(ctx, EI_ERR_NULL, "workspace is NULL (%zu bytes needed)", need);
    if (ws_bytes < need)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %zu needed (size it with the plan's max_tokens)", ws_bytes, need);
    if ((r = ei__check_profile_regions(ctx, q, k, plan, workspace, need)) != EI_OK) return r;
    w.score_threads = score_threads;
    s_end = ei__ceil_div(n, seg); /* segments [.., s_end) hold positions < n */
    for (kvh = kv0; kvh < kv1; ++kvh) {
        ei__head_state *st = &ei__plan_states(plan)[kvh];
        float *open = ei__plan_open_reps(plan, kvh), *open_mass = ei__plan_open_mass(plan, kvh);
        int32_t G = q ? q->n_heads / k->n_heads : st->group;
        int64_t open_seg = st->tokens_done > 0 ? (st->tokens_done - 1) / seg : -1; /* before the seek */
        size_t row0 = EI_PLAN_ROW(plan, kvh, 0);
        if (q) {
            ei__chunk_seek(c, plan, kvh, q_pos); /* a roll-back drops the stored representation */
            /* the open segment was the last of a final call and stays before this chunk: plan it as an inner one */
            if (st->last_final && st->open_valid && open_seg < q_pos / seg &&
                (r = ei__chunk_plan_segment(ctx, k, plan, kvh, (int32_t)open_seg, n, 0, open,
                                            ei__rank_by_mass(c, (int32_t)open_seg) && st->open_rows > 0 ? open_mass : NULL, G,
                                            &w)) != EI_OK)
                return r;
            for (s = (int32_t)(q_pos / seg); s < s_end; ++s) {
                int64_t t0 = EI__MAX((int64_t)s * seg, q_pos), t1 = EI__MIN((int64_t)(s + 1) * seg, n);
                int continues = s == open_seg && st->open_valid;
                int32_t rows = continues ? st->open_rows : 0;
                float *mass = ei__rank_by_mass(c, s) ? w.mass : NULL;
                size_t mass_bytes = (size_t)s * (size_t)(seg / c->block_size) * sizeof(float);
                if (continues) { /* continue the stored segment */
                    memcpy(w.qrep, open, (size_t)G * 2u * (size_t)d * sizeof(float));
                    if (!ei__merge_query_reps(ctx, q, t0 - q_pos, t1 - t0, kvh, G, w.qrep, w.qtmp, score_threads))
                        return ei__nonfinite(ctx, "q", kvh * G, t0);
                } else if (!ei__build_query_reps_mt(ctx, q, t0 - q_pos, t1 - t0, kvh, G, w.qrep, score_threads))
                    return ei__nonfinite(ctx, "q", kvh * G, t0);
                if (mass) {
                    if (continues) memcpy(mass, open_mass, mass_bytes);
                    else memset(mass, 0, mass_bytes);
                    if (!ei__segment_mass(ctx, q, q_pos, k, kvh, G, s, t0, t1, mass, &rows, &w))
                        return ei__fail(ctx, EI_ERR_NONFINITE, "sampled scores of kv head %d segment %d overflow float32", (int)kvh, (int)s);
                }
                /* no row of the segment given yet: the reference ranking, until its rows come */
                if ((r = ei__chunk_plan_segment(ctx, k, plan, kvh, s, n, is_final && s == s_end - 1, w.qrep,
                                                mass && rows > 0 ? mass : NULL, G, &w)) != EI_OK)
                    return r;
                if (s == s_end - 1) { /* the new open segment */
                    memcpy(open, w.qrep, (size_t)G * 2u * (size_t)d * sizeof(float));
                    if (mass) memcpy(open_mass, mass, mass_bytes);
                    st->open_rows = rows;
                    st->open_valid = 1;
                    st->group = G;
                }
            }
        } else if ((r = ei__chunk_plan_segment(ctx, k, plan, kvh, (int32_t)open_seg, n, 1, open,
                                               ei__rank_by_mass(c, (int32_t)open_seg) && st->open_rows > 0 ? open_mass : NULL,
                                               G, &w)) != EI_OK)
            return r;
        st->tokens_done = n;
        st->last_final = is_final ? 1 : 0;
        /* segment 0: the uniform entropy over the scored blocks once final */
        if (is_final) {
            int64_t nb = (s_end - 1) * (seg / c->block_size);
            if (n > nb * c->block_size && !ctx->kern->minmax(k, nb * c->block_size, n - nb * c->block_size, kvh, w.mx, w.mn))
                return ei__nonfinite(ctx, "k", kvh, nb * c->block_size);
            plan->entropy[row0] = ei__uniform_entropy(nb, plan->scores ? plan->scores + row0 * ei__plan_score_row(plan) : NULL);
        }
    }
    if (kv0 == 0) ei__plan_covers(c, plan, n, is_final);
    return EI_OK;
}

/* The CUDA backend: every kv head in one pass of the profile stages (the
   plugin's profile_chunk), the protocol checked here from the plan's host
   fields; the plan then covers the chunk as on the CPU. */
static ei_result ei__profile_chunk_gpu(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                                       int64_t q_pos, int is_final, void *workspace, size_t ws_bytes) {
    size_t need;
    ei_result r = ei__check_chunk(ctx, q, k, plan, q_pos, is_final, 0, k->n_heads);
    if (r != EI_OK || (r = ei__check_gpu_ranking(ctx)) != EI_OK) return r;
    /* sized for the plan's capacity, as on the CPU (a final call without queries needs no query features) */
    if ((r = ei__profile_ws_size(ctx, plan->max_tokens, q ? q->n_heads : k->n_heads, k->n_heads, k->head_dim,
                                       &need)) != EI_OK ||
        (r = ei__check_profile_regions(ctx, q, k, plan, workspace, need)) != EI_OK)
        return r;
    r = EI__CUDA(ctx, profile_chunk, &ctx->cfg, q, k, plan, q_pos, is_final, workspace, ws_bytes);
    if (r == EI_OK) ei__plan_covers(&ctx->cfg, plan, q_pos + (q ? q->n_tokens : 0), is_final);
    return r;
}
static ei_result ei__profile_chunk_heads(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                                       int64_t q_pos, int is_final, int32_t kv_begin, int32_t kv_end, void *workspace,
                                       size_t workspace_bytes) {
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (ei__on_gpu(ctx)) {
        if (!k) return ei__fail(ctx, EI_ERR_NULL, "k is NULL");
        if (kv_begin != 0 || kv_end != k->n_heads)
            return ei__fail(ctx, EI_ERR_UNSUPPORTED,
                            "kv-head ranges of chunked planning are a CPU feature: call ei_profile_chunk (every kv head "
                            "in one call) on the CUDA backend");
        return ei__profile_chunk_gpu(ctx, q, k, plan, q_pos, is_final, workspace, workspace_bytes);
    }
    return ei__profile_chunk_range(ctx, q, k, plan, q_pos, is_final, kv_begin, kv_end, workspace, workspace_bytes, 1);
}
static ei_result ei__profile_chunk_all(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                                 int64_t q_pos, int is_final, void *workspace, size_t workspace_bytes) {
    ei_result r;
    if (!k) return ei__fail(ctx, EI_ERR_NULL, "k is NULL");
    if (ctx && ei__on_gpu(ctx)) /* the plugin applies per_segment_budget itself */
        return ei__profile_chunk_gpu(ctx, q, k, plan, q_pos, is_final, workspace, workspace_bytes);
    r = ei__profile_chunk_heads(ctx, q, k, plan, q_pos, is_final, 0, k->n_heads, workspace, workspace_bytes);
    return r != EI_OK ? r : ei_plan_finalize(ctx, plan);
}

/* ei_profile_chunk_mt: kv-head ranges over the threads, or, with fewer kv
   heads than threads, every head on this thread with its query min/max and
   block scores split (ei__build_query_reps_mt, ei__score_row_split). The whole chunk is checked before any share runs,
   so a bad call leaves every head's state as it was. */
typedef struct ei__chunk_job {
    const ei_context *ctx;
    const ei_tensor *q, *k;
    ei_plan *plan;
    int64_t q_pos;
    int is_final;
} ei__chunk_job;
static ei_result ei__chunk_share(void *arg, int ith, int nth, void *ws, size_t ws_bytes) {
    const ei__chunk_job *j = (const ei__chunk_job *)arg;
    int32_t kv = j->k->n_heads;
    return ei__profile_chunk_range(j->ctx, j->q, j->k, j->plan, j->q_pos, j->is_final, (int32_t)((int64_t)kv * ith / nth),
                                   (int32_t)((int64_t)kv * (ith + 1) / nth), ws, ws_bytes, 1);
}
static ei_result ei__profile_chunk_mt(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, ei_plan *plan,
                                    int64_t q_pos, int is_final, int n_threads, void *workspace, size_t workspace_bytes) {
    ei__chunk_job job;
    size_t per;
    int32_t kv, G;
    int nt;
    ei_result r;
    if (!ctx || !k || !plan) return ei__fail(ctx, EI_ERR_NULL, "context, k or plan is NULL");
    if (ei__on_gpu(ctx)) return ei__profile_chunk_all(ctx, q, k, plan, q_pos, is_final, workspace, workspace_bytes);
    if (n_threads <= 0 || n_threads > EI__MAX_THREADS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_threads %d not in 1..%d", n_threads, EI__MAX_THREADS);
    if ((r = ei__check_chunk(ctx, q, k, plan, q_pos, is_final, 0, k->n_heads)) != EI_OK) return r;
    kv = k->n_heads;
    G = q ? q->n_heads / kv : ei__plan_states(plan)[0].group;
    if ((r = ei__profile_ws_size(ctx, plan->max_tokens, EI__MAX(G, 1) * kv, kv, k->head_dim, &per)) != EI_OK) return r;
    nt = EI__MIN(n_threads, (int)kv);
    if (!workspace) return ei__fail(ctx, EI_ERR_NULL, "workspace is NULL (%d x %zu bytes needed)", nt, per);
    if (workspace_bytes / (size_t)nt < per)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %d threads x %zu needed", workspace_bytes, nt, per);
    /* every share's workspace against q, k and the plan before any share runs:
       a share refused after another planned its heads would leave the plan
       moved by a refused call */
    if ((r = ei__check_profile_regions(ctx, q, k, plan, workspace, per * (size_t)nt)) != EI_OK) return r;
    if (nt > 1) {
        job.ctx = ctx; job.q = q; job.k = k; job.plan = plan; job.q_pos = q_pos; job.is_final = is_final;
        r = ei__fork_join(ctx, ei__chunk_share, &job, nt, workspace, per);
    } else /* one kv head (or one thread): its segments' query min/max and block scores split */
        r = ei__profile_chunk_range(ctx, q, k, plan, q_pos, is_final, 0, kv, workspace, per, n_threads);
    return r != EI_OK ? r : ei_plan_finalize(ctx, plan);
}

EIDEF ei_result ei_check_key_positions(const ei_context *ctx, const int32_t *cell_pos, int64_t n_keys) {
    int64_t j;
    if (n_keys < 0 || n_keys > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_keys %lld not in 0..%lld", (long long)n_keys, (long long)EI_MAX_TOKENS);
    if (n_keys > 0 && !cell_pos) return ei__fail(ctx, EI_ERR_NULL, "cell_pos is NULL");
    if (ei__check_align4(ctx, cell_pos, "cell_pos") != EI_OK) return EI_ERR_ALIGN;
    for (j = 0; j < n_keys; ++j)
        if (cell_pos[j] != j)
            return ei__fail(ctx, EI_ERR_SHAPE,
                            "cache cell %lld holds position %ld: the library reads key j at cell j (cells 0..%lld must hold "
                            "positions 0..%lld in order)",
                            (long long)j, (long)cell_pos[j], (long long)n_keys - 1, (long long)n_keys - 1);
    return EI_OK;
}

// >>decode ------------------------------------------------------------------
static ei_result ei__decoder_size(const ei_context *ctx, int32_t n_heads, int32_t head_dim, size_t *bytes) {
    size_t total = 0;
    if (!ctx || !bytes) return ei__fail(ctx, EI_ERR_NULL, "context or bytes is NULL");
    if (n_heads <= 0 || n_heads > EI_MAX_HEADS) return ei__fail(ctx, EI_ERR_SIZE, "n_heads %d out of range", (int)n_heads);
    if (head_dim <= 0 || head_dim > EI_MAX_HEAD_DIM) return ei__fail(ctx, EI_ERR_SIZE, "head_dim %d out of range", (int)head_dim);
    if (!ei__reserve(&total, (size_t)ctx->cfg.window * (size_t)n_heads, (size_t)head_dim * 4u) ||
        (ctx->cfg.decode_policy == EI_DECODE_H2O && /* H2O: the summed attention of every position */
         !ei__reserve(&total, (size_t)n_heads, (size_t)ctx->cfg.decode_positions * 4u)) ||
        !ei__add_size(total, EI__ALIGN, &total))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "decoder size overflows");
    *bytes = total;
    return EI_OK;
}
/* Bytes of a sealed decoder's query ring, and of its summed attention (H2O). */
static size_t ei__decoder_ring_bytes(const ei_decoder *dec) {
    return (size_t)dec->window * (size_t)dec->n_heads * (size_t)dec->head_dim * 4u;
}
static size_t ei__decoder_acc_bytes(const ei_decoder *dec) {
    return dec->accumulated ? (size_t)dec->n_heads * (size_t)dec->n_positions * 4u : 0u;
}
/* A decoder as ei_decoder_init made it: sealed fields, the struct outside
   its ring (as init placed it: observe writes the ring and the counters). */
static ei_result ei__check_decoder_seal(const ei_context *ctx, const ei_decoder *dec) {
    if (!dec || !dec->queries) return ei__fail(ctx, EI_ERR_NULL, "decoder is NULL or not initialised");
    if (dec->seal != ei__decoder_seal(dec))
        return ei__fail(ctx, EI_ERR_STATE, "decoder fields (heads, head_dim, window, ring pointer) were changed after "
                                           "ei_decoder_init, or the decoder was not made by it");
    if (ei__ranges_meet(dec, sizeof *dec, dec->queries, ei__decoder_ring_bytes(dec)))
        return ei__fail(ctx, EI_ERR_OVERLAP, "the ei_decoder struct [%p, +%zu bytes) lies inside its query ring [%p, +%zu bytes)",
                        (const void *)dec, sizeof *dec, (const void *)dec->queries, ei__decoder_ring_bytes(dec));
    if (dec->accumulated && ei__ranges_meet(dec, sizeof *dec, dec->accumulated, ei__decoder_acc_bytes(dec)))
        return ei__fail(ctx, EI_ERR_OVERLAP, "the ei_decoder struct [%p, +%zu bytes) lies inside its summed attention [%p, +%zu bytes)",
                        (const void *)dec, sizeof *dec, (const void *)dec->accumulated, ei__decoder_acc_bytes(dec));
    return EI_OK;
}
/* A decoder as ei_decoder_init laid it out (sealed fields; the window of
   ctx when given) with its counters in range: an edited decoder is refused
   before its ring is read or written. */
static ei_result ei__check_decoder_layout(const ei_context *ctx, const ei_decoder *dec) {
    ei_result r = ei__check_decoder_seal(ctx, dec);
    if (r != EI_OK) return r;
    if (ctx && dec->window != ctx->cfg.window)
        return ei__fail(ctx, EI_ERR_SHAPE, "decoder was made for window %d, context has %d", (int)dec->window,
                        (int)ctx->cfg.window);
    if (ctx && ctx->cfg.decode_policy == EI_DECODE_H2O && (!dec->accumulated || dec->n_positions != ctx->cfg.decode_positions))
        return ei__fail(ctx, EI_ERR_SHAPE, "decoder holds summed attention of %lld positions, the context's EI_DECODE_H2O needs %lld "
                        "(ei_decoder_init under this context)", (long long)(dec->accumulated ? dec->n_positions : 0),
                        (long long)ctx->cfg.decode_positions);
    if (dec->n_observed < 0 || dec->n_observed > EI_MAX_TOKENS || dec->n_generated < 0 ||
        dec->n_generated > dec->n_observed || dec->last_compress < -1 || dec->last_compress > dec->n_generated ||
        dec->n_accumulated < 0 || dec->n_accumulated > dec->n_observed || dec->accumulated_end < 0 ||
        dec->accumulated_end > dec->n_positions || dec->position_end < dec->n_observed || dec->position_end > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_STATE, "decoder counters out of range (observed %lld, position end %lld, generated %lld, "
                        "last compression %lld, summed %lld, positions summed %lld)", (long long)dec->n_observed,
                        (long long)dec->position_end, (long long)dec->n_generated, (long long)dec->last_compress,
                        (long long)dec->n_accumulated, (long long)dec->accumulated_end);
    return EI_OK;
}
/* The decoder's ring (ring: 0 unused, 1 read, 2 written) and its struct
   (read, or written when the call updates its counters) as regions. */
static void ei__reg_decoder(ei__regions *g, const ei_decoder *dec, int ring, int struct_written) {
    if (ring)
        ei__reg_mem(g, dec->queries, ei__decoder_ring_bytes(dec), "the decoder's query ring", ring == 2);
    if (dec->accumulated && struct_written) /* (H2O: the calls that write the struct may sum into it) */
        ei__reg_mem(g, dec->accumulated, ei__decoder_acc_bytes(dec), "the decoder's summed attention", 1);
    ei__reg_mem(g, dec, sizeof *dec, "the ei_decoder struct", struct_written);
}

EIDEF ei_result ei_decoder_reset(ei_decoder *dec) {
    ei_result r = ei__check_decoder_seal(NULL, dec); /* (any counters: it resets them) */
    if (r != EI_OK) return r;
    dec->n_observed = 0;
    dec->position_end = 0;
    dec->n_generated = 0;
    dec->last_compress = -1;
    dec->n_accumulated = 0;
    dec->accumulated_end = 0; /* (the sums are overwritten from 0 as positions come: nothing to clear) */
    return EI_OK;
}
EIDEF ei_result ei_decoder_init(const ei_context *ctx, ei_decoder *dec, int32_t n_heads, int32_t n_kv_heads,
                                int32_t head_dim, void *memory, size_t bytes) {
    size_t need;
    ei__arena a;
    ei_result r = ei__decoder_size(ctx, n_heads, head_dim, &need);
    if (r != EI_OK) return r;
    if (!dec || !memory) return ei__fail(ctx, EI_ERR_NULL, "decoder or its memory is NULL");
    if (n_kv_heads <= 0 || n_kv_heads > n_heads || n_heads % n_kv_heads)
        return ei__fail(ctx, EI_ERR_GQA, "n_heads %d is not a multiple of n_kv_heads %d", (int)n_heads, (int)n_kv_heads);
    if (bytes < need) return ei__fail(ctx, EI_ERR_WORKSPACE, "decoder memory of %zu bytes, %zu needed", bytes, need);
    {
        ei__regions g;
        g.n = 0;
        ei__reg_mem(&g, memory, need, "decoder memory", 1);
        ei__reg_mem(&g, dec, sizeof *dec, "the ei_decoder struct", 1);
        if ((r = ei__check_regions(ctx, &g)) != EI_OK) return r;
    }
    memset(dec, 0, sizeof *dec);
    ei__arena_init(&a, memory, bytes);
    dec->queries = (float *)ei__arena_take(&a, (size_t)ctx->cfg.window * (size_t)n_heads, (size_t)head_dim * 4u);
    if (ctx->cfg.decode_policy == EI_DECODE_H2O) {
        dec->n_positions = ctx->cfg.decode_positions;
        dec->accumulated = (float *)ei__arena_take(&a, (size_t)n_heads, (size_t)dec->n_positions * 4u);
    }
    dec->n_heads = n_heads;
    dec->n_kv_heads = n_kv_heads;
    dec->head_dim = head_dim;
    dec->window = ctx->cfg.window;
    dec->seal = ei__decoder_seal(dec);
    if (ei__on_gpu(ctx) && /* the same layout in device memory, cleared there */
        (r = EI__CUDA(ctx, mem_set, dec->queries, 0, need - EI__ALIGN, ctx->cfg.cuda_stream)) != EI_OK)
        return r;
    return ei_decoder_reset(dec);
}

EIDEF ei_result ei_decode_observe(const ei_context *ctx, ei_decoder *dec, const ei_tensor *q, int64_t q_pos,
                                  int generated) {
    int64_t t, first;
    int32_t h;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if ((r = ei__check_decoder_layout(ctx, dec)) != EI_OK) return r;
    if ((r = ei__check_tensor(ctx, q, "q")) != EI_OK) return r;
    if (q->n_heads != dec->n_heads || q->head_dim != dec->head_dim)
        return ei__fail(ctx, EI_ERR_SHAPE, "q has %d heads x %d dims, decoder %d x %d", (int)q->n_heads, (int)q->head_dim,
                        (int)dec->n_heads, (int)dec->head_dim);
    {
        ei__regions g;
        g.n = 0;
        ei__reg_view(&g, q, "q", "the ei_tensor q", 0);
        ei__reg_decoder(&g, dec, 2, 1);
        if ((r = ei__check_regions(ctx, &g)) != EI_OK) return r;
    }
    if (!generated && dec->n_generated > 0)
        return ei__fail(ctx, EI_ERR_STATE, "prompt queries after generated ones: ei_decoder_reset starts a new sequence");
    if (q->n_tokens > EI_MAX_TOKENS - dec->n_observed) /* a sequence holds at most EI_MAX_TOKENS positions */
        return ei__fail(ctx, EI_ERR_SIZE, "%lld queries observed, %lld more exceed %lld: ei_decoder_reset starts a new sequence",
                        (long long)dec->n_observed, (long long)q->n_tokens, (long long)EI_MAX_TOKENS);
    /* (n_tokens <= EI_MAX_TOKENS, ei__check_tensor: the sum below is formed inside int64) */
    if (q_pos < 0 || q_pos > EI_MAX_TOKENS - q->n_tokens)
        return ei__fail(ctx, EI_ERR_SIZE, "q_pos %lld: the queries' positions must lie in 0..%lld", (long long)q_pos,
                        (long long)EI_MAX_TOKENS - 1);
    /* the ring lines its queries up with the newest positions of the cache: they follow each other, or a prompt
       call skips ahead with a whole window of queries (they replace the ring: an engine that feeds only each
       micro-batch's last window) */
    if (dec->n_observed > 0 && q_pos != dec->position_end &&
        !(q_pos > dec->position_end && !generated && q->n_tokens >= dec->window))
        return ei__fail(ctx, EI_ERR_STATE, "queries at position %lld, the decoder's next is %lld: observed queries follow each "
                        "other, or a prompt call skips ahead with at least a window (%d) of them (ei_decoder_reset starts "
                        "over, e.g. after a rewind)", (long long)q_pos, (long long)dec->position_end, (int)dec->window);
    if (generated && ctx->cfg.decode_policy == EI_DECODE_SNAPKV) { /* counted, never stored: its ring holds the prompt's */
        dec->n_observed += q->n_tokens;
        dec->n_generated += q->n_tokens;
        dec->position_end = q_pos + q->n_tokens;
        return EI_OK;
    }
    if (ei__on_gpu(ctx)) {
        if ((r = EI__CUDA(ctx, decode_observe, &ctx->cfg, dec, q, generated)) == EI_OK) dec->position_end = q_pos + q->n_tokens;
        return r;
    }
    first = EI__MAX((int64_t)0, q->n_tokens - dec->window);
    for (t = first; t < q->n_tokens; ++t) /* check before changing any state */
        for (h = 0; h < q->n_heads; ++h) {
            const void *row = ei__row(q, t, h);
            int32_t i;
            for (i = 0; i < q->head_dim; ++i) {
                float v = ei__load1(row, q->dtype, i);
                if (!(v - v == 0.0f)) return ei__nonfinite(ctx, "observed q", h, t);
            }
        }
    for (t = first; t < q->n_tokens; ++t) {
        int64_t slot = (dec->n_observed + t) % dec->window;
        for (h = 0; h < q->n_heads; ++h)
            ei__row_to_f32(ei__row(q, t, h), q->dtype, q->head_dim,
                           dec->queries + ((size_t)slot * (size_t)dec->n_heads + (size_t)h) * (size_t)dec->head_dim);
    }
    dec->n_observed += q->n_tokens;
    dec->position_end = q_pos + q->n_tokens;
    if (generated) dec->n_generated += q->n_tokens;
    return EI_OK;
}

EIDEF int ei_decode_due(const ei_context *ctx, const ei_decoder *dec) {
    /* refused (NULL, a decoder not made by ei_decoder_init, edited, counters
       out of range): 0, the error recorded; the counters are in range before
       they are subtracted */
    if (!ctx) {
        (void)ei__fail(ctx, EI_ERR_NULL, "context is NULL");
        return 0;
    }
    if (ei__check_decoder_layout(ctx, dec) != EI_OK) return 0;
    if (dec->last_compress < 0) return dec->n_generated >= ctx->cfg.decode_gap && dec->n_observed > 0;
    return ctx->cfg.recompress_every > 0 && dec->n_generated - dec->last_compress >= ctx->cfg.recompress_every;
}

/* Decode workspace, one per thread: the rows in position order and their
   sort keys, the sampled-mass kernel's buffers (a batch of window queries,
   a tile of keys, its scores) and a score row; for selection a reduced and
   a pooled row and ranking pairs; for ei_decode_keep the scores of every
   query head (ei_decode_keep_mt: the first thread's). */
typedef struct ei__decode_ws {
    int32_t *order;    /* [n] rows that hold positions, oldest first */
    int64_t *keys;     /* [n] (position << 32 | row) while sorting */
    float *qt;         /* [d][EI__SAMPLE_ROWS] a batch of window queries, transposed */
    float *kbuf;       /* [tile][d rounded up to 16] */
    float *lg;         /* ei__sample_lg_floats(n, 1) */
    float *mass;       /* [n] summed weights, oldest first */
    float *red;        /* [n] */
    float *pooled;     /* [n] */
    ei__ranked *pairs; /* [n] */
    float *scores;     /* [n_heads][n] */
} ei__decode_ws;
static int ei__decode_ws_layout(int64_t n, int32_t H, int32_t d, ei__decode_ws *w, void *mem, size_t bytes,
                                size_t *need) {
    size_t total = 0, dp = (size_t)ei__round_up(d, 16), N = (size_t)n;
    ei__arena a;
    if (!ei__reserve(&total, N, 4u) || !ei__reserve(&total, N, 8u) ||
        !ei__reserve(&total, EI__SAMPLE_ROWS, (size_t)d * 4u) ||
        !ei__reserve(&total, (size_t)ei__sample_tile_keys(1), dp * 4u) ||
        !ei__reserve(&total, ei__sample_lg_floats(n, 1), 4u) || !ei__reserve(&total, N, 4u) ||
        !ei__reserve(&total, N, 4u) || !ei__reserve(&total, N, 4u) || !ei__reserve(&total, N, sizeof(ei__ranked)) ||
        !ei__reserve(&total, (size_t)H, N * 4u) || !ei__add_size(total, EI__ALIGN, &total))
        return 0;
    *need = total;
    if (!mem || bytes < total) return 1;
    ei__arena_init(&a, mem, bytes);
    w->order = (int32_t *)ei__arena_take(&a, N, 4u);
    w->keys = (int64_t *)ei__arena_take(&a, N, 8u);
    w->qt = (float *)ei__arena_take(&a, EI__SAMPLE_ROWS, (size_t)d * 4u);
    w->kbuf = (float *)ei__arena_take(&a, (size_t)ei__sample_tile_keys(1), dp * 4u);
    w->lg = (float *)ei__arena_take(&a, ei__sample_lg_floats(n, 1), 4u);
    w->mass = (float *)ei__arena_take(&a, N, 4u);
    w->red = (float *)ei__arena_take(&a, N, 4u);
    w->pooled = (float *)ei__arena_take(&a, N, 4u);
    w->pairs = (ei__ranked *)ei__arena_take(&a, N, sizeof(ei__ranked));
    w->scores = (float *)ei__arena_take(&a, (size_t)H, N * 4u);
    return 1;
}
static ei_result ei__decode_ws_size(const ei_context *ctx, int64_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                         size_t *bytes) {
    ei__decode_ws w;
    ei_result r = ei__check_sizes(ctx, n_tokens, n_heads, n_kv_heads, 1, bytes);
    if (r != EI_OK) return r;
    if (ei__on_gpu(ctx)) return EI__CUDA(ctx, decode_workspace_size, &ctx->cfg, n_tokens, n_heads, n_kv_heads, bytes);
    if (!ei__decode_ws_layout(n_tokens, n_heads, EI_MAX_HEAD_DIM, &w, NULL, 0, bytes))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "decode workspace overflows size_t");
    return EI_OK;
}
/* The workspace of one call (or thread) for n rows, laid out in w. */
static ei_result ei__decode_ws_take(const ei_context *ctx, int64_t n, int32_t H, void *workspace, size_t bytes,
                                    ei__decode_ws *w) {
    size_t need;
    if (!ei__decode_ws_layout(n, H, EI_MAX_HEAD_DIM, w, workspace, bytes, &need))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "decode workspace overflows size_t");
    if (!workspace) return ei__fail(ctx, EI_ERR_NULL, "workspace is NULL (%zu bytes needed)", need);
    if (bytes < need) return ei__fail(ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %zu needed", bytes, need);
    return EI_OK;
}

/* Pool a score row of length L: avg (zero padding, divide by kernel width,
   as torch's count_include_pad), max, or none. */
static void ei__pool_scores(ei_pool pool, int32_t kernel, const float *x, int64_t L, float *out) {
    int64_t j, t, r = kernel / 2;
    if (pool == EI_POOL_NONE || kernel <= 1) { memcpy(out, x, (size_t)L * sizeof(float)); return; }
    for (j = 0; j < L; ++j) {
        float acc = pool == EI_POOL_MAX ? -FLT_MAX : 0.0f;
        for (t = j - r; t <= j + r; ++t) {
            if (t < 0 || t >= L) continue;
            if (pool == EI_POOL_MAX) acc = x[t] > acc ? x[t] : acc;
            else acc += x[t];
        }
        out[j] = pool == EI_POOL_MAX ? acc : acc / (float)kernel;
    }
}

static int ei__int64_cmp(const void *pa, const void *pb) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return (a > b) - (a < b);
}

/* The rows of a cache of n rows that hold positions, oldest first, into
   order[0..*np) (row_pos NULL: row j holds position j). The newest W
   positions are the window: they must be consecutive (the keys of the
   observed queries, every one in the cache). */
static ei_result ei__decode_order(const ei_context *ctx, const int32_t *row_pos, int64_t n, int64_t W, int32_t *order,
                                  int64_t *keys, int64_t *np_out) {
    int64_t j, np = 0, i;
    int sorted = 1;
    if (!row_pos) {
        for (j = 0; j < n; ++j) order[j] = (int32_t)j;
        np = n;
    } else {
        for (j = 0; j < n; ++j) {
            if (row_pos[j] < -1)
                return ei__fail(ctx, EI_ERR_SHAPE, "row_pos[%lld] = %d (a position >= 0, or -1 for a row without one)",
                                (long long)j, (int)row_pos[j]);
            if (row_pos[j] < 0) continue;
            if (np && row_pos[j] <= row_pos[order[np - 1]]) sorted = 0;
            order[np++] = (int32_t)j;
        }
        if (!sorted) { /* position << 32 | row: sorts by position, rows break no tie (checked below) */
            for (i = 0; i < np; ++i) keys[i] = (int64_t)row_pos[order[i]] << 32 | (int64_t)order[i];
            qsort(keys, (size_t)np, sizeof *keys, ei__int64_cmp);
            for (i = 0; i < np; ++i) order[i] = (int32_t)(keys[i] & 0xffffffff);
        }
        for (i = 1; i < np; ++i)
            if (row_pos[order[i]] == row_pos[order[i - 1]])
                return ei__fail(ctx, EI_ERR_SHAPE, "rows %d and %d both hold position %d", (int)order[i - 1], (int)order[i],
                                (int)row_pos[order[i]]);
    }
    if (np < W)
        return ei__fail(ctx, EI_ERR_SHAPE, "the cache holds %lld positions, fewer than the %lld observed queries",
                        (long long)np, (long long)W);
    if (row_pos && W > 0 && row_pos[order[np - 1]] - row_pos[order[np - W]] != W - 1)
        return ei__fail(ctx, EI_ERR_SHAPE,
                        "the newest %lld positions (%d..%d) are not consecutive: the window's keys must all be in the cache",
                        (long long)W, (int)row_pos[order[np - W]], (int)row_pos[order[np - 1]]);
    *np_out = np;
    return EI_OK;
}

/* The decode scores of query head h: scale * q.k of each scored query
   (ei__decode_scored: the window, or the policy's queries) against the keys
   of its kv head (rows in position order, order[0..np)), softmax over the
   keys up to its own (query number t lines up with the key at
   np - (n_observed - t)), mean over the m queries; out[row], 0 for rows that
   hold no position (and every row when m is 0). Batches of EI__SAMPLE_ROWS
   queries through the sampled ranking's kernel with one-key blocks. */
static ei_result ei__decode_score_head(const ei_context *ctx, const ei_decoder *dec, const ei_tensor *k, int32_t h,
                                       const int32_t *order, int64_t np, float *out, ei__decode_ws *w) {
    const int32_t d = dec->head_dim, H = dec->n_heads, kvh = h / (H / dec->n_kv_heads);
    const float scale = ctx->cfg.decode_scale > 0 ? ctx->cfg.decode_scale : 1.0f / sqrtf((float)d);
    int64_t tok[EI__SAMPLE_ROWS], i0, j, q0, m = ei__decode_scored(&ctx->cfg, dec, &q0);
    int32_t r, e, nr;
    memset(w->mass, 0, (size_t)np * sizeof(float));
    for (i0 = 0; i0 < m; i0 += EI__SAMPLE_ROWS) {
        nr = (int32_t)EI__MIN((int64_t)EI__SAMPLE_ROWS, m - i0);
        memset(w->qt, 0, (size_t)d * EI__SAMPLE_ROWS * sizeof(float));
        for (r = 0; r < nr; ++r) {
            int64_t t = q0 + i0 + r, slot = t % dec->window;
            const float *qv = dec->queries + ((size_t)slot * (size_t)H + (size_t)h) * (size_t)d;
            for (e = 0; e < d; ++e) w->qt[(size_t)e * EI__SAMPLE_ROWS + (size_t)r] = qv[e];
            tok[r] = np - (dec->n_observed - t);
        }
        if (!ctx->kern->sample_mass(w->qt, tok, nr, k, kvh, scale, 1, tok[nr - 1] + 1, w->lg, w->kbuf, w->mass, order))
            return ei__fail(ctx, EI_ERR_NONFINITE, "decode scores of query head %d are not finite (NaN/Inf in k, or "
                            "float32 overflow)", (int)h);
    }
    memset(out, 0, (size_t)k->n_tokens * sizeof(float));
    if (m > 0)
        for (j = 0; j < np; ++j) out[order[j]] = w->mass[j] / (float)m;
    return EI_OK;
}

/* The map of kv head kvh's rows (NULL: identity). */
static const int32_t *ei__row_map(const ei_keep_set *keep, int32_t kvh) {
    if (!keep || !keep->row_pos) return NULL;
    return keep->row_pos + (size_t)kvh * (size_t)keep->row_pos_stride;
}

/* Bytes of the row maps of n_maps kv heads over n rows (read by the call). */
static void ei__reg_row_pos(ei__regions *g, const int32_t *row_pos, int64_t stride, int32_t n_maps, int64_t n) {
    size_t ints = stride > 0 ? (size_t)(n_maps - 1) * (size_t)stride + (size_t)n : (size_t)n;
    ei__reg_mem(g, row_pos, ints * 4u, "row_pos", 0);
}
/* A keep set the call fills (its struct and arrays) and the maps it reads. */
static void ei__reg_keep(ei__regions *g, const ei_keep_set *keep, int32_t n_maps, int64_t n) {
    size_t heads = (size_t)keep->heads_out, cap = (size_t)keep->capacity;
    ei__reg_mem(g, keep, sizeof *keep, "the ei_keep_set struct", 1);
    ei__reg_mem(g, keep->index, heads * cap * 4u, "keep->index", 1);
    ei__reg_mem(g, keep->positions, heads * cap * 4u, "keep->positions", 1);
    if (keep->mask) ei__reg_mem(g, keep->mask, heads * (size_t)keep->mask_capacity, "keep->mask", 1);
    if (keep->pooled) ei__reg_mem(g, keep->pooled, heads * (size_t)keep->pooled_capacity * 4u, "keep->pooled", 1);
    if (keep->row_pos) ei__reg_row_pos(g, keep->row_pos, keep->row_pos_stride, n_maps, n);
}
/* The decode workspace a call uses: threads x ei_decode_workspace_size. */
static ei_result ei__reg_decode_ws(const ei_context *ctx, ei__regions *g, const ei_decoder *dec, int64_t n,
                                   const void *workspace, int threads) {
    size_t per;
    ei_result r = ei__decode_ws_size(ctx, n, dec->n_heads, dec->n_kv_heads, &per);
    if (r == EI_OK) ei__reg_workspace(g, workspace, per * (size_t)threads);
    return r;
}

static ei_result ei__check_rows(const ei_context *ctx, int64_t n_rows) {
    if (n_rows <= 0 || n_rows > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_rows %lld not in 1..%lld", (long long)n_rows, (long long)EI_MAX_TOKENS);
    return EI_OK;
}

/* The scored cache k has the decoder's kv heads and head size. */
static ei_result ei__check_decoder_k(const ei_context *ctx, const ei_decoder *dec, const ei_tensor *k) {
    if (k->n_heads != dec->n_kv_heads || k->head_dim != dec->head_dim)
        return ei__fail(ctx, EI_ERR_SHAPE, "k has %d heads x %d dims, decoder expects %d x %d", (int)k->n_heads,
                        (int)k->head_dim, (int)dec->n_kv_heads, (int)dec->head_dim);
    return EI_OK;
}

/* Checks shared by every decode entry point. */
static ei_result ei__check_decoder(const ei_context *ctx, const ei_decoder *dec) {
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if ((r = ei__check_decoder_layout(ctx, dec)) != EI_OK) return r;
    if (dec->n_observed <= 0) return ei__fail(ctx, EI_ERR_STATE, "no query observed yet (ei_decode_observe first)");
    if (ctx->cfg.decode_policy == EI_DECODE_SNAPKV && dec->n_observed == dec->n_generated)
        return ei__fail(ctx, EI_ERR_STATE, "EI_DECODE_SNAPKV scores with the prompt's queries and none was observed "
                        "(ei_decode_observe them with generated = 0)");
    return EI_OK;
}

/* A cache of n_rows rows without a row map holds position j in row j: every
   row must hold a position, so rows past the newest observed query's
   (an engine's padded view: llama.cpp pads its K view to 256 cells) are
   refused, not scored as positions (the window would line up with padding
   and the padding be kept). A map marks such rows -1; a view can end there. */
static ei_result ei__check_decode_rows(const ei_context *ctx, const ei_decoder *dec, const int32_t *row_pos, int64_t n_rows) {
    if (!row_pos && n_rows > dec->position_end)
        return ei__fail(ctx, EI_ERR_SHAPE, "the cache has %lld rows and no row map, but the newest observed query is position "
                        "%lld: rows past it hold no position (padding?): pass a view of %lld rows, or a row map with -1 for "
                        "the rows past it", (long long)n_rows, (long long)dec->position_end - 1, (long long)dec->position_end);
    return EI_OK;
}

/* ei_decode_score once its arguments are checked (ei_decode_keep_mt's
   workers run it on scores inside the caller's workspace). */
static ei_result ei__decode_score_run(const ei_context *ctx, const ei_decoder *dec, const ei_tensor *k,
                                      const int32_t *row_pos, int64_t row_pos_stride, float *scores, int ith, int nth,
                                      void *workspace, size_t workspace_bytes) {
    ei__decode_ws w;
    int64_t W, np = 0;
    int32_t h, h0, h1, G, kv_done = -1;
    ei_result r;
    if (ei__on_gpu(ctx)) /* this thread's query heads, scored on the device */
        return EI__CUDA(ctx, decode_score, &ctx->cfg, dec, k, row_pos, row_pos_stride, scores,
                        (int32_t)((int64_t)dec->n_heads * ith / nth), (int32_t)((int64_t)dec->n_heads * (ith + 1) / nth),
                        workspace, workspace_bytes);
    if ((r = ei__decode_ws_take(ctx, k->n_tokens, dec->n_heads, workspace, workspace_bytes, &w)) != EI_OK) return r;
    W = ei__decode_tail(&ctx->cfg, dec);
    G = dec->n_heads / dec->n_kv_heads;
    h0 = (int32_t)((int64_t)dec->n_heads * ith / nth);
    h1 = (int32_t)((int64_t)dec->n_heads * (ith + 1) / nth);
    for (h = h0; h < h1; ++h) {
        if (h / G != kv_done) { /* the order of this kv head's rows */
            kv_done = h / G;
            r = ei__decode_order(ctx, row_pos ? row_pos + (size_t)kv_done * (size_t)row_pos_stride : NULL, k->n_tokens, W,
                                 w.order, w.keys, &np);
            if (r != EI_OK) return r;
        }
        if ((r = ei__decode_score_head(ctx, dec, k, h, w.order, np, scores + (size_t)h * (size_t)k->n_tokens, &w)) != EI_OK)
            return r;
    }
    return EI_OK;
}

static ei_result ei__decode_score_part(const ei_context *ctx, const ei_decoder *dec, const ei_tensor *k, const int32_t *row_pos,
                                int64_t row_pos_stride, float *scores, int ith, int nth, void *workspace,
                                size_t workspace_bytes) {
    ei__regions g;
    ei_result r;
    if ((r = ei__check_decoder(ctx, dec)) != EI_OK) return r;
    if ((r = ei__check_tensor(ctx, k, "k")) != EI_OK) return r;
    if (!scores) return ei__fail(ctx, EI_ERR_NULL, "scores is NULL");
    if ((r = ei__check_decoder_k(ctx, dec, k)) != EI_OK) return r;
    if (nth < 1 || ith < 0 || ith >= nth) return ei__fail(ctx, EI_ERR_SIZE, "thread %d of %d", ith, nth);
    if (row_pos_stride < 0 || (row_pos_stride > 0 && row_pos_stride < k->n_tokens) || row_pos_stride > ((int64_t)1 << 40))
        return ei__fail(ctx, EI_ERR_STRIDE, "row_pos_stride %lld (0: one map for every kv head, else %lld..2^40 rows)",
                        (long long)row_pos_stride, (long long)k->n_tokens);
    if ((r = ei__check_align4(ctx, scores, "scores")) != EI_OK || (r = ei__check_align4(ctx, row_pos, "row_pos")) != EI_OK)
        return r;
    if ((r = ei__check_decode_rows(ctx, dec, row_pos, k->n_tokens)) != EI_OK) return r;
    g.n = 0; /* threads share the decoder, k, the maps and scores (their own rows of it) */
    ei__reg_view(&g, k, "k", "the ei_tensor k", 0);
    ei__reg_decoder(&g, dec, 1, 0);
    if (row_pos) ei__reg_row_pos(&g, row_pos, row_pos_stride, dec->n_kv_heads, k->n_tokens);
    ei__reg_mem(&g, scores, (size_t)dec->n_heads * (size_t)k->n_tokens * 4u, "scores", 1);
    if ((r = ei__reg_decode_ws(ctx, &g, dec, k->n_tokens, workspace, 1)) != EI_OK ||
        (r = ei__check_regions(ctx, &g)) != EI_OK)
        return r;
    return ei__decode_score_run(ctx, dec, k, row_pos, row_pos_stride, scores, ith, nth, workspace, workspace_bytes);
}

/* Checks of a keep set about to be filled for n rows (heads_out rows). */
static ei_result ei__check_keep(const ei_context *ctx, const ei_keep_set *keep, int32_t heads_out, int64_t n,
                                const char *why) {
    ei_result r;
    if (!keep || !keep->index) return ei__fail(ctx, EI_ERR_NULL, "keep set or its index array is NULL");
    if ((r = ei__check_align4(ctx, keep->index, "keep->index")) != EI_OK ||
        (r = ei__check_align4(ctx, keep->positions, "keep->positions")) != EI_OK ||
        (r = ei__check_align4(ctx, keep->pooled, "keep->pooled")) != EI_OK ||
        (r = ei__check_align4(ctx, keep->row_pos, "keep->row_pos")) != EI_OK)
        return r;
    if ((keep->pooled && (keep->pooled_capacity < 0 || keep->pooled_capacity > EI_MAX_TOKENS)) ||
        (keep->mask && keep->mask_capacity > EI_MAX_TOKENS))
        return ei__fail(ctx, EI_ERR_SIZE, "pooled capacity %lld / mask capacity %lld not in 0..%lld",
                        (long long)keep->pooled_capacity, (long long)keep->mask_capacity, (long long)EI_MAX_TOKENS);
    if (keep->row_pos && keep->row_pos_stride > ((int64_t)1 << 40))
        return ei__fail(ctx, EI_ERR_STRIDE, "row_pos_stride %lld past 2^40", (long long)keep->row_pos_stride);
    if (keep->heads_out != heads_out)
        return ei__fail(ctx, EI_ERR_SHAPE, "keep set has %d heads, %d needed (%s)", (int)keep->heads_out, (int)heads_out, why);
    if ((int64_t)keep->capacity < EI__MIN(n, (int64_t)ctx->cfg.decode_budget) || keep->capacity < 0)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "keep capacity %d < %lld positions", (int)keep->capacity,
                        (long long)EI__MIN(n, (int64_t)ctx->cfg.decode_budget));
    if (keep->mask && keep->mask_capacity < n)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "mask capacity %lld < %lld tokens", (long long)keep->mask_capacity, (long long)n);
    if (keep->row_pos && (keep->row_pos_stride < 0 || (keep->row_pos_stride > 0 && keep->row_pos_stride < n)))
        return ei__fail(ctx, EI_ERR_STRIDE, "row_pos_stride %lld (0: one map for every kv head, else >= %lld rows)",
                        (long long)keep->row_pos_stride, (long long)n);
    return EI_OK;
}

/* Keep row h of a keep set: the top k candidates of score[0..L) (candidate
   j = the row order[j]; score already pooled) and the W window rows
   order[L..L+W), as rows ascending, with their positions and mask. */
static void ei__keep_rows(ei_keep_set *keep, int32_t h, const int32_t *map, const float *score, const int32_t *order,
                          int64_t L, int64_t W, int64_t kk, int64_t n, ei__ranked *pairs) {
    int32_t *idx = keep->index + (size_t)h * (size_t)keep->capacity;
    int64_t j;
    if (kk > L) kk = L;
    if (kk < 0) kk = 0;
    ei__rank_top(score, L, kk, idx, pairs);
    for (j = 0; j < kk; ++j) idx[j] = order[idx[j]];
    for (j = 0; j < W; ++j) idx[kk + j] = order[L + j];
    /* ascending rows (rows are unique) */
    for (j = 0; j < kk + W; ++j) { pairs[j].score = -(float)idx[j]; pairs[j].index = idx[j]; }
    qsort(pairs, (size_t)(kk + W), sizeof *pairs, ei__ranked_cmp);
    for (j = 0; j < kk + W; ++j) idx[j] = pairs[j].index;
    if (keep->positions)
        for (j = 0; j < kk + W; ++j)
            keep->positions[(size_t)h * (size_t)keep->capacity + (size_t)j] = map ? map[idx[j]] : idx[j];
    if (keep->mask) {
        uint8_t *m = keep->mask + (size_t)h * (size_t)keep->mask_capacity;
        memset(m, 0, (size_t)n);
        for (j = 0; j < kk + W; ++j) m[idx[j]] = 1;
    }
    keep->n_kept = (int32_t)(kk + W);
}

/* Reduce the scores of query heads h0..h0+nh (rows of n) over the given
   candidates (order[0..L)) by gqa_reduce into red[0..L). */
static void ei__reduce_heads(const ei_config *c, const float *scores, int64_t n, int32_t h0, int32_t nh,
                             const int32_t *order, int64_t L, float *red) {
    int64_t j;
    int32_t i;
    for (j = 0; j < L; ++j) {
        float v = scores[(size_t)h0 * (size_t)n + (size_t)order[j]];
        for (i = 1; i < nh; ++i) {
            float x = scores[(size_t)(h0 + i) * (size_t)n + (size_t)order[j]];
            v = c->gqa_reduce == EI_REDUCE_MAX ? (x > v ? x : v) : v + x;
        }
        red[j] = c->gqa_reduce == EI_REDUCE_MAX ? v : v / (float)nh;
    }
}

/* Fewer rows hold positions than decode_budget: every one is kept. */
static void ei__keep_all(ei_keep_set *keep, int64_t np, int64_t n, int32_t h, const int32_t *map) {
    int64_t j, m = 0;
    int32_t *idx = keep->index + (size_t)h * (size_t)keep->capacity;
    for (j = 0; j < n; ++j) /* the rows that hold positions, ascending */
        if (!map || map[j] >= 0) idx[m++] = (int32_t)j;
    if (keep->positions)
        for (j = 0; j < np; ++j) keep->positions[(size_t)h * (size_t)keep->capacity + (size_t)j] = map ? map[idx[j]] : idx[j];
    if (keep->mask) {
        uint8_t *mk = keep->mask + (size_t)h * (size_t)keep->mask_capacity;
        memset(mk, 0, (size_t)n);
        for (j = 0; j < np; ++j) mk[idx[j]] = 1;
    }
    keep->n_kept = (int32_t)np;
}

/* The sequence's length in positions: the newest held + 1 (a cache
   without a map holds positions 0..np-1). What a ratio budget follows. */
static int64_t ei__decode_length(const int32_t *map, const int32_t *order, int64_t np) {
    return map ? (int64_t)map[order[np - 1]] + 1 : np;
}

/* H2O: the summed attention of query heads h0..h0+nh on the candidates
   order[0..L) (by the position each holds; positions from accumulated_end
   on have none yet: 0), reduced by gqa_reduce into red[0..L). */
static void ei__reduce_acc(const ei_config *c, const ei_decoder *dec, int32_t h0, int32_t nh, const int32_t *map,
                           const int32_t *order, int64_t L, float *red) {
    int64_t j;
    int32_t i;
    for (j = 0; j < L; ++j) {
        int64_t p = map ? map[order[j]] : order[j];
        float v = 0.0f;
        for (i = 0; i < nh; ++i) {
            float x = p < dec->accumulated_end ? dec->accumulated[(size_t)(h0 + i) * (size_t)dec->n_positions + (size_t)p] : 0.0f;
            v = i == 0 ? x : c->gqa_reduce == EI_REDUCE_MAX ? (x > v ? x : v) : v + x;
        }
        red[j] = c->gqa_reduce == EI_REDUCE_MAX ? v : v / (float)nh;
    }
}

/* H2O: adds the attention of the m queries not yet summed (scores: their
   mean per query head, by row; ei__decode_scored) to the sum of each
   position held, times m (a sum over queries, as H2O accumulates). Every kv
   head's map is checked first (positions inside the decoder's
   n_positions, one count and one length for every head, the keep set's
   capacities), so that a refused call leaves the decoder as it was. */
static ei_result ei__decode_accumulate(const ei_context *ctx, ei_decoder *dec, const float *scores, int64_t n,
                                       const int32_t *row_pos, int64_t stride, const ei_keep_set *keep, ei__decode_ws *w) {
    const ei_config *c = &ctx->cfg;
    const int32_t G = dec->n_heads / dec->n_kv_heads;
    int64_t T = ei__decode_tail(c, dec), q0, m = ei__decode_scored(c, dec, &q0), np = 0, np0 = -1, P = 0, P0 = -1, b, j;
    int32_t kvh, h, pass;
    ei_result r;
    for (pass = 0; pass < 2; ++pass)
        for (kvh = 0; kvh < dec->n_kv_heads; ++kvh) {
            const int32_t *map = row_pos ? row_pos + (size_t)kvh * (size_t)stride : NULL;
            if (pass == 1 && m == 0) break;
            if ((r = ei__decode_order(ctx, map, n, T, w->order, w->keys, &np)) != EI_OK) return r;
            P = ei__decode_length(map, w->order, np);
            if (pass == 0) {
                if (P > dec->n_positions)
                    return ei__fail(ctx, EI_ERR_SIZE, "the cache holds position %lld, past the %lld positions whose attention "
                                    "the decoder sums (decode_positions)", (long long)(P - 1), (long long)dec->n_positions);
                if (np0 >= 0 && (np != np0 || P != P0))
                    return ei__fail(ctx, EI_ERR_SHAPE, "the row maps of kv heads hold %lld and %lld positions, of sequences of "
                                    "%lld and %lld (one count per keep set)", (long long)np0, (long long)np, (long long)P0,
                                    (long long)P);
                np0 = np; P0 = P;
                b = ei__decode_budget(c, P);
                if (keep && np < b && np > (int64_t)keep->capacity)
                    return ei__fail(ctx, EI_ERR_WORKSPACE, "keep capacity %d < %lld positions", (int)keep->capacity, (long long)np);
                if (keep && np >= b && keep->pooled && keep->pooled_capacity < np - T)
                    return ei__fail(ctx, EI_ERR_WORKSPACE, "pooled capacity %lld < %lld", (long long)keep->pooled_capacity,
                                    (long long)(np - T));
                continue;
            }
            for (h = kvh * G; h < (kvh + 1) * G; ++h) {
                float *acc = dec->accumulated + (size_t)h * (size_t)dec->n_positions;
                const float *sc = scores + (size_t)h * (size_t)n;
                for (j = 0; j < np; ++j) {
                    int64_t p = map ? map[w->order[j]] : w->order[j];
                    acc[p] = (p < dec->accumulated_end ? acc[p] : 0.0f) + (float)m * sc[w->order[j]];
                }
            }
        }
    if (m > 0) {
        dec->accumulated_end = P0; /* every position held below it was written */
        dec->n_accumulated = dec->n_observed;
    }
    return EI_OK;
}

/* Keep row h by the decode policy from score[0..L), the candidates'
   (order[0..L), oldest first; order[L..L+T) the tail, always kept), b
   positions in all (T <= b <= L + T):
   ENTROPYINFER, SNAPKV: the top b - T of score;
   STREAMING: the first min(decode_sink, b - T) candidates (the sinks) and the
     newest others; score becomes 1 for a kept candidate, 0 else (what the
     pooled output shows);
   H2O: the newest R = max(b / 2, T) positions (the tail, then the newest
     candidates: H2O's recent window, half the budget as in its paper) and
     the top b - R of score among the older candidates (its heavy hitters);
   ENTROPYINFER, SNAPKV with decode_recent > 0: likewise with R =
     max(floor(decode_recent x b), T). R: ei__decode_recent. */
static void ei__keep_policy(const ei_config *c, ei_keep_set *keep, int32_t h, const int32_t *map, float *score,
                            const int32_t *order, int64_t L, int64_t T, int64_t b, int64_t n, ei__ranked *pairs) {
    int64_t kk = b - T, Lr = L, j;
    if (c->decode_policy == EI_DECODE_STREAMING) {
        int64_t sink = EI__MIN((int64_t)c->decode_sink, kk);
        Lr = L - (kk - sink);
        for (j = 0; j < L; ++j) score[j] = j < sink || j >= Lr ? 1.0f : 0.0f;
        kk = sink;
    } else if (ei__decode_recent(c, b) > 0) { /* H2O, or decode_recent: a recent window, then the ranked */
        int64_t R = EI__MAX(ei__decode_recent(c, b), T);
        Lr = L - (R - T);
        kk = b - R;
    }
    ei__keep_rows(keep, h, map, score, order, Lr, L - Lr + T, kk, n, pairs);
}

/* A keep set's tail (the newest T positions) larger than its budget b:
   only SnapKV's can be (its prompt window and every generated position). */
static ei_result ei__decode_tail_fits(const ei_context *ctx, int64_t T, int64_t b) {
    if (T <= b) return EI_OK;
    return ei__fail(ctx, EI_ERR_STATE, "EI_DECODE_SNAPKV keeps its %lld newest positions (the prompt's window and every "
                    "generated one), more than the budget of %lld: compress sooner (decode_gap) or keep more",
                    (long long)T, (long long)b);
}

/* The keep set of each head from checked arguments (ei_decode_keep_mt
   passes scores inside its workspace). */
static ei_result ei__decode_select_rows(const ei_context *ctx, ei_decoder *dec, const float *scores, int64_t n_rows,
                                        ei_keep_set *keep, void *workspace, size_t workspace_bytes) {
    const ei_config *c = &ctx->cfg;
    ei__decode_ws w;
    int64_t T, np = 0, np0 = -1, P, P0 = -1, b = 0, L;
    int32_t h, heads_out = c->per_kv_head ? dec->n_kv_heads : dec->n_heads, G, kvh_done = -1;
    ei_result r;
    if (ei__on_gpu(ctx)) return EI__CUDA(ctx, decode_select, c, dec, scores, n_rows, keep, workspace, workspace_bytes);
    if ((r = ei__decode_ws_take(ctx, n_rows, dec->n_heads, workspace, workspace_bytes, &w)) != EI_OK) return r;
    T = ei__decode_tail(c, dec);
    G = dec->n_heads / dec->n_kv_heads;
    if (c->decode_policy == EI_DECODE_H2O &&
        (r = ei__decode_accumulate(ctx, dec, scores, n_rows, keep->row_pos, keep->row_pos ? keep->row_pos_stride : 0, keep,
                                   &w)) != EI_OK)
        return r;
    for (h = 0; h < heads_out; ++h) {
        int32_t kvh = c->per_kv_head ? h : h / G;
        const int32_t *map = ei__row_map(keep, kvh);
        if (kvh != kvh_done && (r = ei__decode_order(ctx, map, n_rows, T, w.order, w.keys, &np)) != EI_OK) return r;
        kvh_done = kvh;
        P = ei__decode_length(map, w.order, np);
        if (np0 >= 0 && (np != np0 || P != P0)) /* (on failure the keep set's arrays hold partial rows) */
            return ei__fail(ctx, EI_ERR_SHAPE, "the row maps of kv heads hold %lld and %lld positions, of sequences of %lld "
                            "and %lld (one count per keep set)", (long long)np0, (long long)np, (long long)P0, (long long)P);
        np0 = np; P0 = P;
        b = ei__decode_budget(c, P);
        if (np > (int64_t)keep->capacity && np < b) /* (capacity >= min(n_rows, budget) >= np else) */
            return ei__fail(ctx, EI_ERR_WORKSPACE, "keep capacity %d < %lld positions", (int)keep->capacity, (long long)np);
        if (np < b) { ei__keep_all(keep, np, n_rows, h, map); continue; }
        if ((r = ei__decode_tail_fits(ctx, T, b)) != EI_OK) return r; /* (the first head: nothing written) */
        L = np - T;
        if (keep->pooled && keep->pooled_capacity < L)
            return ei__fail(ctx, EI_ERR_WORKSPACE, "pooled capacity %lld < %lld", (long long)keep->pooled_capacity, (long long)L);
        {
            float *pooled = keep->pooled ? keep->pooled + (size_t)h * (size_t)keep->pooled_capacity : w.pooled;
            int32_t hq = c->per_kv_head ? h * G : h, nq = c->per_kv_head ? G : 1;
            if (c->decode_policy == EI_DECODE_H2O) /* summed attention, not pooled (as H2O ranks it) */
                ei__reduce_acc(c, dec, hq, nq, map, w.order, L, pooled);
            else if (c->decode_policy != EI_DECODE_STREAMING) {
                ei__reduce_heads(c, scores, n_rows, hq, nq, w.order, L, w.red);
                ei__pool_scores(c->pool, c->pool_kernel, w.red, L, pooled);
            }
            ei__keep_policy(c, keep, h, map, pooled, w.order, L, T, b, n_rows, w.pairs);
        }
    }
    keep->n_tokens = n_rows;
    keep->compressed = np >= b;
    dec->last_compress = dec->n_generated;
    return EI_OK;
}
/* A row map found faulty at a later kv head (a data error) refuses the call
   after earlier heads' rows were written: the arrays are outputs and hold
   partial rows, but the struct's count is put back, so a refused call leaves
   the ei_keep_set struct (and the decoder) as they were. */
static ei_result ei__decode_select_run(const ei_context *ctx, ei_decoder *dec, const float *scores, int64_t n_rows,
                                       ei_keep_set *keep, void *workspace, size_t workspace_bytes) {
    int32_t n_kept = keep->n_kept;
    ei_result r = ei__decode_select_rows(ctx, dec, scores, n_rows, keep, workspace, workspace_bytes);
    if (r != EI_OK) keep->n_kept = n_kept;
    return r;
}
static ei_result ei__decode_select(const ei_context *ctx, ei_decoder *dec, const float *scores, int64_t n_rows,
                                 ei_keep_set *keep, void *workspace, size_t workspace_bytes) {
    ei__regions g;
    int32_t heads_out;
    ei_result r;
    if ((r = ei__check_decoder(ctx, dec)) != EI_OK) return r;
    if (!scores) return ei__fail(ctx, EI_ERR_NULL, "scores is NULL");
    if ((r = ei__check_rows(ctx, n_rows)) != EI_OK) return r;
    if ((r = ei__check_align4(ctx, scores, "scores")) != EI_OK) return r;
    heads_out = ctx->cfg.per_kv_head ? dec->n_kv_heads : dec->n_heads;
    if (keep && (r = ei__check_decode_rows(ctx, dec, keep->row_pos, n_rows)) != EI_OK) return r; /* (before the capacities) */
    if ((r = ei__check_keep(ctx, keep, heads_out, n_rows, ctx->cfg.per_kv_head ? "one per kv head" : "one per query head")) != EI_OK)
        return r;
    g.n = 0;
    ei__reg_mem(&g, scores, (size_t)dec->n_heads * (size_t)n_rows * 4u, "scores", 0);
    ei__reg_decoder(&g, dec, 0, 1);
    ei__reg_keep(&g, keep, dec->n_kv_heads, n_rows);
    if ((r = ei__reg_decode_ws(ctx, &g, dec, n_rows, workspace, 1)) != EI_OK || (r = ei__check_regions(ctx, &g)) != EI_OK)
        return r;
    return ei__decode_select_run(ctx, dec, scores, n_rows, keep, workspace, workspace_bytes);
}

static ei_result ei__decode_shared_add(const ei_context *ctx, ei_decoder *dec, const float *scores, int64_t n_rows,
                                     const int32_t *row_pos, float *shared, void *workspace, size_t workspace_bytes) {
    const ei_config *c;
    ei__decode_ws w;
    int64_t W, np = 0, L, j;
    double sum = 0.0;
    ei_result r;
    if ((r = ei__check_decoder(ctx, dec)) != EI_OK) return r;
    c = &ctx->cfg;
    if (!scores || !shared) return ei__fail(ctx, EI_ERR_NULL, "scores or shared is NULL");
    if ((r = ei__check_rows(ctx, n_rows)) != EI_OK) return r;
    if ((r = ei__check_align4(ctx, scores, "scores")) != EI_OK || (r = ei__check_align4(ctx, shared, "shared")) != EI_OK ||
        (r = ei__check_align4(ctx, row_pos, "row_pos")) != EI_OK)
        return r;
    if ((r = ei__check_decode_rows(ctx, dec, row_pos, n_rows)) != EI_OK) return r;
    {
        ei__regions g;
        g.n = 0;
        ei__reg_mem(&g, scores, (size_t)dec->n_heads * (size_t)n_rows * 4u, "scores", 0);
        if (row_pos) ei__reg_row_pos(&g, row_pos, 0, 1, n_rows);
        ei__reg_mem(&g, shared, (size_t)n_rows * 4u, "shared", 1);
        ei__reg_decoder(&g, dec, 0, 1);
        if ((r = ei__reg_decode_ws(ctx, &g, dec, n_rows, workspace, 1)) != EI_OK ||
            (r = ei__check_regions(ctx, &g)) != EI_OK)
            return r;
    }
    if (ei__on_gpu(ctx)) return EI__CUDA(ctx, decode_shared_add, c, dec, scores, n_rows, row_pos, shared, workspace, workspace_bytes);
    if ((r = ei__decode_ws_take(ctx, n_rows, dec->n_heads, workspace, workspace_bytes, &w)) != EI_OK) return r;
    W = ei__decode_tail(c, dec);
    if (c->decode_policy == EI_DECODE_H2O && /* (checks the map before the decoder's sums change) */
        (r = ei__decode_accumulate(ctx, dec, scores, n_rows, row_pos, 0, NULL, &w)) != EI_OK)
        return r;
    if ((r = ei__decode_order(ctx, row_pos, n_rows, W, w.order, w.keys, &np)) != EI_OK) return r;
    L = np - W;
    if (c->decode_policy == EI_DECODE_STREAMING) { /* nothing to add: it keeps by position alone */
        dec->last_compress = dec->n_generated;
        return EI_OK;
    }
    /* every head of the layer, reduced; pooled over positions (H2O: its
       summed attention, not pooled); a layer's candidates then weigh 1 in
       total, so that every layer has one vote (the mass a layer leaves on
       its window or its sinks differs); layers are added (gqa_reduce mean)
       or their maximum kept (max) */
    if (c->decode_policy == EI_DECODE_H2O) ei__reduce_acc(c, dec, 0, dec->n_heads, row_pos, w.order, L, w.pooled);
    else {
        ei__reduce_heads(c, scores, n_rows, 0, dec->n_heads, w.order, L, w.red);
        ei__pool_scores(c->pool, c->pool_kernel, w.red, L, w.pooled);
    }
    for (j = 0; j < L; ++j) sum += w.pooled[j];
    if (sum > 0.0) {
        /* EI_SHARED_ENTROPY: times exp(H), H = -sum p ln p of p = pooled / sum
           = ln sum - (sum x ln x) / sum: the cells the layer spreads over, so
           that a flat layer claims more of the set than a peaked one */
        double weight = 1.0, xlx = 0.0;
        if (c->decode_shared_weight == EI_SHARED_ENTROPY) {
            for (j = 0; j < L; ++j)
                if (w.pooled[j] > 0.0f) xlx += (double)w.pooled[j] * log((double)w.pooled[j]);
            weight = exp(log(sum) - xlx / sum);
        }
        for (j = 0; j < L; ++j) {
            float v = (float)(w.pooled[j] / sum * weight), *x = shared + w.order[j];
            *x = c->gqa_reduce == EI_REDUCE_MAX ? (v > *x ? v : *x) : *x + v;
        }
    }
    dec->last_compress = dec->n_generated;
    return EI_OK;
}

static ei_result ei__decode_select_shared(const ei_context *ctx, const ei_decoder *dec, const float *shared, int64_t n_rows,
                                        ei_keep_set *keep, void *workspace, size_t workspace_bytes) {
    const ei_config *c;
    ei__decode_ws w;
    int64_t W, np = 0, L, j, b;
    ei_result r;
    if ((r = ei__check_decoder(ctx, dec)) != EI_OK) return r;
    c = &ctx->cfg;
    if (!shared) return ei__fail(ctx, EI_ERR_NULL, "shared is NULL");
    if ((r = ei__check_rows(ctx, n_rows)) != EI_OK) return r;
    if (keep && (r = ei__check_decode_rows(ctx, dec, keep->row_pos, n_rows)) != EI_OK) return r; /* (before the capacities) */
    if ((r = ei__check_keep(ctx, keep, 1, n_rows, "a shared keep set has one")) != EI_OK) return r;
    if ((r = ei__check_align4(ctx, shared, "shared")) != EI_OK) return r;
    {
        ei__regions g;
        g.n = 0;
        ei__reg_mem(&g, shared, (size_t)n_rows * 4u, "shared", 0);
        ei__reg_decoder(&g, dec, 0, 0);
        ei__reg_keep(&g, keep, 1, n_rows);
        if ((r = ei__reg_decode_ws(ctx, &g, dec, n_rows, workspace, 1)) != EI_OK ||
            (r = ei__check_regions(ctx, &g)) != EI_OK)
            return r;
    }
    if (ei__on_gpu(ctx)) return EI__CUDA(ctx, decode_select_shared, c, dec, shared, n_rows, keep, workspace, workspace_bytes);
    if ((r = ei__decode_ws_take(ctx, n_rows, dec->n_heads, workspace, workspace_bytes, &w)) != EI_OK) return r;
    W = ei__decode_tail(c, dec);
    if ((r = ei__decode_order(ctx, keep->row_pos, n_rows, W, w.order, w.keys, &np)) != EI_OK) return r;
    b = ei__decode_budget(c, ei__decode_length(keep->row_pos, w.order, np));
    if (np < b) { /* the struct's fields change once nothing can refuse the call */
        if (np > (int64_t)keep->capacity)
            return ei__fail(ctx, EI_ERR_WORKSPACE, "keep capacity %d < %lld positions", (int)keep->capacity, (long long)np);
        ei__keep_all(keep, np, n_rows, 0, keep->row_pos);
        keep->n_tokens = n_rows;
        keep->compressed = 0;
        return EI_OK;
    }
    if ((r = ei__decode_tail_fits(ctx, W, b)) != EI_OK) return r;
    L = np - W;
    if (keep->pooled && keep->pooled_capacity < L)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "pooled capacity %lld < %lld", (long long)keep->pooled_capacity, (long long)L);
    for (j = 0; j < L; ++j) {
        float v = shared[w.order[j]];
        if (!(v - v == 0.0f)) return ei__fail(ctx, EI_ERR_NONFINITE, "shared score of row %d is not finite", (int)w.order[j]);
        w.pooled[j] = v;
    }
    ei__keep_policy(c, keep, 0, keep->row_pos, w.pooled, w.order, L, W, b, n_rows, w.pairs);
    if (keep->pooled) memcpy(keep->pooled, w.pooled, (size_t)L * sizeof(float)); /* (STREAMING: what it kept) */
    keep->n_tokens = n_rows;
    keep->compressed = 1;
    return EI_OK;
}

/* ei_decode_keep's scoring, thread ith of nth (ei_decode_keep_mt). */
typedef struct ei__decode_job {
    const ei_context *ctx;
    const ei_decoder *dec;
    const ei_tensor *k;
    const ei_keep_set *keep;
    float *scores;
} ei__decode_job;
static ei_result ei__decode_share(void *arg, int ith, int nth, void *ws, size_t ws_bytes) {
    const ei__decode_job *j = (const ei__decode_job *)arg;
    return ei__decode_score_run(j->ctx, j->dec, j->k, j->keep->row_pos, j->keep->row_pos ? j->keep->row_pos_stride : 0,
                                j->scores, ith, nth, ws, ws_bytes);
}

static ei_result ei__decode_keep_mt(const ei_context *ctx, ei_decoder *dec, const ei_tensor *k, ei_keep_set *keep,
                                  int n_threads, void *workspace, size_t workspace_bytes) {
    const ei_config *c;
    ei__decode_ws w;
    ei__decode_job job;
    size_t per;
    int32_t heads_out;
    int nt;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (!dec || !dec->queries) return ei__fail(ctx, EI_ERR_NULL, "decoder is NULL or not initialised");
    if (!keep || !keep->index) return ei__fail(ctx, EI_ERR_NULL, "keep set or its index array is NULL");
    if ((r = ei__check_decoder(ctx, dec)) != EI_OK) return r;
    c = &ctx->cfg;
    if ((r = ei__check_tensor(ctx, k, "k")) != EI_OK) return r;
    if ((r = ei__check_decoder_k(ctx, dec, k)) != EI_OK) return r;
    heads_out = c->per_kv_head ? dec->n_kv_heads : dec->n_heads;
    if ((r = ei__check_decode_rows(ctx, dec, keep->row_pos, k->n_tokens)) != EI_OK) return r; /* (before the capacities) */
    if ((r = ei__check_keep(ctx, keep, heads_out, k->n_tokens, c->per_kv_head ? "one per kv head" : "one per query head")) != EI_OK)
        return r;
    if (n_threads <= 0 || n_threads > EI__MAX_THREADS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_threads %d not in 1..%d", n_threads, EI__MAX_THREADS);
    {
        ei__regions g;
        g.n = 0;
        ei__reg_view(&g, k, "k", "the ei_tensor k", 0);
        ei__reg_decoder(&g, dec, 1, 1);
        ei__reg_keep(&g, keep, dec->n_kv_heads, k->n_tokens);
        if ((r = ei__reg_decode_ws(ctx, &g, dec, k->n_tokens, workspace,
                                   ei__on_gpu(ctx) ? 1 : EI__MIN(n_threads, dec->n_heads))) != EI_OK ||
            (r = ei__check_regions(ctx, &g)) != EI_OK)
            return r;
    }
    if (ei__on_gpu(ctx)) { /* the cache in position order, scored whole on the device */
        int64_t W = ei__decode_tail(c, dec), n = k->n_tokens;
        if (keep->row_pos) /* a device map: the plugin checks it and counts its positions */
            return EI__CUDA(ctx, decode_keep, c, dec, k, keep, workspace, workspace_bytes);
        if (n < W)
            return ei__fail(ctx, EI_ERR_SHAPE, "the cache holds %lld keys, fewer than the %lld observed queries",
                            (long long)n, (long long)W);
        if (n >= ei__decode_budget(c, n) && W > ei__decode_budget(c, n))
            return ei__decode_tail_fits(ctx, W, ei__decode_budget(c, n));
        if (n >= ei__decode_budget(c, n) && keep->pooled && keep->pooled_capacity < n - W)
            return ei__fail(ctx, EI_ERR_WORKSPACE, "pooled capacity %lld < %lld", (long long)keep->pooled_capacity, (long long)(n - W));
        return EI__CUDA(ctx, decode_keep, c, dec, k, keep, workspace, workspace_bytes);
    }
    if ((r = ei__decode_ws_size(ctx, k->n_tokens, dec->n_heads, dec->n_kv_heads, &per)) != EI_OK) return r;
    nt = EI__MIN(n_threads, dec->n_heads);
    if (!workspace) return ei__fail(ctx, EI_ERR_NULL, "workspace is NULL (%d x %zu bytes needed)", nt, per);
    if (workspace_bytes / (size_t)nt < per)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %d threads x %zu needed", workspace_bytes, nt, per);
    if ((r = ei__decode_ws_take(ctx, k->n_tokens, dec->n_heads, workspace, per, &w)) != EI_OK) return r;
    job.ctx = ctx; job.dec = dec; job.k = k; job.keep = keep; job.scores = w.scores;
    if (c->decode_policy == EI_DECODE_STREAMING) r = EI_OK; /* keeps by position: k is not read */
    else if (nt == 1) r = ei__decode_share(&job, 0, 1, workspace, per);
    else r = ei__fork_join(ctx, ei__decode_share, &job, nt, workspace, per);
    if (r != EI_OK) return r;
    return ei__decode_select_run(ctx, dec, w.scores, k->n_tokens, keep, workspace, per);
}


/* Checks of a filled keep set that a call reads (ei_kv_compact, decode
   attention): its counts, then (ei__check_keep_index) every kept row
   ascending inside the rows it scored. */
static ei_result ei__check_keep_filled(const ei_context *ctx, const ei_keep_set *keep) {
    if (!keep || !keep->index) return ei__fail(ctx, EI_ERR_NULL, "keep set or its index is NULL");
    if (keep->heads_out <= 0 || keep->capacity < 0 || keep->n_kept < 0 || keep->n_kept > keep->capacity ||
        keep->n_kept > keep->n_tokens || keep->n_tokens > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SHAPE, "keep set is not filled (%d heads, n_kept %d, capacity %d, %lld tokens)",
                        (int)keep->heads_out, (int)keep->n_kept, (int)keep->capacity, (long long)keep->n_tokens);
    return ei__check_align4(ctx, keep->index, "keep->index");
}
static ei_result ei__check_keep_index(const ei_context *ctx, const ei_keep_set *keep) {
    int32_t h, i;
    for (h = 0; h < keep->heads_out; ++h) {
        const int32_t *idx = keep->index + (size_t)h * (size_t)keep->capacity;
        for (i = 0; i < keep->n_kept; ++i)
            if (idx[i] < i || idx[i] >= keep->n_tokens || (i > 0 && idx[i] <= idx[i - 1]))
                return ei__fail(ctx, EI_ERR_SHAPE, "keep index [%d][%d] = %d is not ascending inside the cache", (int)h, (int)i, (int)idx[i]);
    }
    return EI_OK;
}

EIDEF ei_result ei_kv_compact(const ei_context *ctx, const ei_keep_set *keep, ei_out_tensor *k, ei_out_tensor *v) {
    ei_out_tensor *t[2];
    int32_t which, h, i;
    ei_result r;
    t[0] = k; t[1] = v;
    if ((r = ei__check_keep_filled(ctx, keep)) != EI_OK) return r;
    if (!k && !v) return ei__fail(ctx, EI_ERR_NULL, "k and v are both NULL");
    for (which = 0; which < 2; ++which) {
        ei_out_tensor *x = t[which];
        if (!x) continue; /* K only or V only is fine */
        if ((r = ei__check_out_tensor(ctx, x, which ? "v" : "k")) != EI_OK) return r;
        if (x->n_heads != keep->heads_out && keep->heads_out != 1) /* 1: a shared set, for every head */
            return ei__fail(ctx, EI_ERR_SHAPE, "%s cache has %d heads, keep set %d", which ? "v" : "k", (int)x->n_heads, (int)keep->heads_out);
        if (x->n_tokens < keep->n_tokens)
            return ei__fail(ctx, EI_ERR_SHAPE, "%s cache holds %lld tokens, keep set scored %lld", which ? "v" : "k",
                            (long long)x->n_tokens, (long long)keep->n_tokens);
    }
    { /* one cache passed twice would be compacted twice; the index must not move under it */
        ei__regions g;
        g.n = 0;
        ei__reg_mem(&g, keep, sizeof *keep, "the ei_keep_set struct", 0);
        ei__reg_mem(&g, keep->index, (size_t)keep->heads_out * (size_t)keep->capacity * 4u, "keep->index", 0);
        if (k) ei__reg_out_view(&g, k, "k", "the ei_out_tensor k");
        if (v) ei__reg_out_view(&g, v, "v", "the ei_out_tensor v");
        if ((r = ei__check_regions(ctx, &g)) != EI_OK) return r;
    }
    if (ei__on_gpu(ctx)) return EI__CUDA(ctx, kv_compact, &ctx->cfg, keep, k, v); /* shared sets too */
    if ((r = ei__check_keep_index(ctx, keep)) != EI_OK) return r; /* every index before moving anything */
    for (which = 0; which < 2; ++which) {
        ei_out_tensor *x = t[which];
        size_t row_bytes;
        if (!x) continue;
        row_bytes = (size_t)x->head_dim * ei__dtype_size(x->dtype);
        for (h = 0; h < x->n_heads; ++h) {
            const int32_t *idx = keep->index + (size_t)(keep->heads_out == 1 ? 0 : h) * (size_t)keep->capacity;
            for (i = 0; i < keep->n_kept; ++i)
                if (idx[i] != i) memmove(ei__row_out(x, i, h), ei__row_out(x, idx[i], h), row_bytes);
        }
    }
    return EI_OK;
}

// >>attention ---------------------------------------------------------------
/* Block-sparse prefill attention executing a plan (plan NULL: dense causal).

   Semantics (tests/golden/FORMAT.md, "Sparse prefill attention"): query token t of
   segment s (query head h, kv head h/G) attends
     - if ei_plan_segment_is_sparse(s): the key blocks the plan keeps for
       (h/G, s) (all before the segment start), then the segment's own keys
       s*segment_size .. t;
     - otherwise: keys 0 .. t (dense causal).
   Softmax scale attn_scale (0: 1/sqrt(head_dim)); f32 accumulation.

   Algorithm (flash-style, no n x n buffer): a tile is Mt query tokens x Gt
   query heads of one kv group (about EI__ATTN_ROWS = 256 rows; Mt is 16
   times a power of two) against key tiles of EI__ATTN_NK = 64 keys, so each
   key/value row is read once per tile for every head of the group. Rows of
   a tile are laid out r = g*Mt + token and vectorised 16 at a time, so
   S^T = K Q^T (keys x rows) is computed with key elements broadcast against
   packed Q^T columns (AVX-512 register block: 32 rows x 8 keys), and the
   online softmax (running max, sum, rescale) is purely vertical: no
   horizontal reductions. O += P V runs per 64-dim chunk of a packed value
   tile (AVX-512 register block: 4 rows x 64 dims). Scores are scaled by
   scale*log2(e) and exponentiated with a 1-2 ulp polynomial exp2 that maps
   -inf and very negative inputs to 0; masked keys are -inf, the running max
   starts at -FLT_MAX, scores are clamped to +-FLT_MAX (NaN from overflowing
   dot products too), so no -inf - -inf and no NaN from finite input.

   Kernels (the stages of the context's table, >>isa-*, chosen per call
   from it and the dtypes; the score and P V loops are hand-written per ISA,
   the elementwise stages written once against a vector vocabulary, >>simd):
     scalar       the reference, one query row at a time (libm exp2f).
     neon         AArch64 Advanced SIMD, f32 arithmetic (4 lanes); f16/bf16
                  rows converted per tile. What AUTO picks on AArch64.
     neon-bf16    q, k, v all bf16, even head_dim, a CPU with FEAT_BF16
                  (HWCAP2_BF16): BFDOT for Q K^T (bf16 pair products, f32
                  sums), the neon stages for the rest (P V in f32). Only
                  when cfg.simd = EI_SIMD_NEON_BF16 forces it: its speed has
                  not been measured on ARM hardware, so AUTO keeps neon.
     neon-bfmmla  as neon-bf16 with BFMMLA for Q K^T (2 rows x 4 dimensions
                  x 2 keys an instruction, twice BFDOT's products, the same
                  arithmetic). Only when cfg.simd = EI_SIMD_NEON_BFMMLA
                  forces it, for the same reason.
     neon-fhm     q, k, v all f16, even head_dim, a CPU with FEAT_FHM
                  (HWCAP_ASIMDHP and HWCAP_ASIMDFHM): FMLAL/FMLAL2 for Q K^T
                  (f16 products, exact in f32, added to f32 sums in
                  dimension order: the same scores as neon on f16 inputs),
                  keys read as they are, the neon stages for the rest (P V
                  in f32). Only when cfg.simd = EI_SIMD_NEON_FHM forces it:
                  its speed has not been measured on ARM hardware (only its
                  instruction count under qemu), so AUTO keeps neon.
     avx2         AVX2+FMA, f32 arithmetic; f16/bf16 rows converted per tile.
     avx512       AVX-512F, f32 arithmetic; f16/bf16 rows converted per tile
                  (vcvtph2ps / a shift). What AUTO picks for every dtype.
     avx512-bf16  q, k, v all bf16, even head_dim, a CPU with AVX512_BF16:
                  vdpbf16ps for Q K^T (bf16 products exact, f32 sums) and for
                  P V with P rounded to bf16 (error ~2^-9 per weight, as GPU
                  flash attention does); the sampled ranking's rows against
                  bf16 keys too, q rounded to bf16 (ACCURACY ACROSS PATHS;
                  its profile 0.6-0.7x the f32 kernel's at 32k on a Zen 5,
                  docs/quality.md). cfg.simd = EI_SIMD_AVX512_BF16
                  forces it; AUTO picks it where its FLOP rate, measured at
                  the first context creation (ei_cpu_dpbf16_ratio, >>kernels),
                  is at least 1.25x the f32 FMA rate, because that ratio
                  depends on the core: about 0.5 on a Sapphire Rapids, about
                  1.8 on an AMD Zen 5 (or always, when the build defines
                  EI_ATTN_PREFER_DPBF16). Otherwise bf16 rows are widened to
                  f32 (a shift) and run through the avx512 kernel.
     amx          q, k, v all bf16, even head_dim, a CPU with AMX-BF16 on
                  Linux (>>isa-amx): Q K^T and P V as 16 x 16 tile multiplies
                  (tdpbf16ps; P rounded to bf16 as above), softmax and store
                  in AVX-512. AUTO picks it for all-bf16 calls wherever the CPU
                  and OS have AMX: on a 2-core Sapphire Rapids VM, dense bf16
                  attention at 8k took 1325 ms against 2618 ms with avx512
                  (one thread, `ei_bench --kernel`, a loaded machine). Its
                  accumulators make a round trip through memory per key tile,
                  which bounds it. Where the CPU has AMX, detecting it asks
                  Linux for the tile state (arch_prctl), which makes signal
                  frames about 8 KB larger; define EI_NO_AMX to leave it out.
   f16 inputs use vcvtph2ps + f32 FMAs: AVX512_FP16 only offers FMAs that
   accumulate in f16 (no f32-accumulating dot product before AVX10.2), which
   would put ~1e-2 errors on the logits. The f32-arithmetic kernels agree
   with each other and with a double reference within float32 summation-order
   error (tests: 1e-5 of max|v| at unit-scale inputs); not bit-identical
   across kernels. A given kernel is deterministic and independent of
   ith/nth (each query row is computed by one thread, in one order).

   Decode steps (ei_attention_decode*) run their own tile on the vector
   paths (ei__attn_decode_tile, written once; avx2, avx512, and avx512 f32
   arithmetic under avx512-bf16): a step reads the whole cache once for a
   few rows, so it is bound by memory, not FLOPs. Only real rows are
   computed (4 query rows per pass over a key row), scores are horizontal
   sums, a group's next key tile is prefetched, and the walk goes tile by
   tile across kv heads (one front-to-back sweep of a token-major cache).
   The scalar path runs the reference row by row. Results depend on the
   thread count (the key split changes the summation order), not on which
   thread runs a slice.

   Work split: items are (kv head, head subgroup, segment, query tile); each
   item's cost is estimated (rows x keys) and thread ith of nth takes the
   items whose cost midpoint falls in its 1/nth share, contiguous in
   (kv head, segment) order. A query tile holds 16 x 2^k tokens of up to 8
   heads (256 rows); calls with fewer query tokens (decode steps) shrink it
   to the next power of two of their token count, down to one token with the
   heads packed into 16-row vectors, since padding rows are computed and
   dropped (a 64-token tile would do 64x the work of a one-token call). No
   allocation, no globals.

   Measured figures (GFLOP/s against the machine's FMA peak, sparse against
   dense, ggml's flash attention on the same cores) live in
   docs/performance.md, not here; `make bench-run` reproduces them. */

#define EI__ATTN_NK 64       /* keys per key tile (multiple of 8) */
#define EI__ATTN_MAX_GT 8    /* query heads per tile */
#ifndef EI__ATTN_ROWS
#define EI__ATTN_ROWS 256    /* target rows (query tokens x heads) per tile */
#endif
#ifndef EI__ATTN_MT_MIN
#define EI__ATTN_MT_MIN 2    /* at least 16 x this many tokens per tile */
#endif
#define EI__ATTN_MAX_THREADS EI__MAX_THREADS


/* One call's arguments, resolved. */
typedef struct ei__attn_job {
    const ei_context *ctx;
    const ei_tensor *q, *k, *v;
    const ei_plan *plan;
    const ei_out_tensor *out;
    int64_t q_offset, q_end;   /* absolute positions of q's first and one-past-last token */
    const ei_keep_set *keep;   /* decode restricted to a keep set (NULL: dense) */
    int32_t G, Gt, Mt, d, dpad;
    int32_t seg, bs;
    float c;                   /* softmax scale * log2(e) */
    const ei__attn_stages *K;  /* the vector stages, NULL: the scalar reference */
} ei__attn_job;

/* Workspace of one thread. */
typedef struct ei__attn_ws {
    float *qt;          /* packed queries: f32 [d][ld] (bf16 kernels: u32 pairs [d/2][ld]; neon-fhm, neon-bfmmla:
                           16-bit layouts of their pack_q) */
    float *s;           /* scores, then probabilities, [NK][ld] */
    uint32_t *pp;       /* probabilities as bf16 pairs [NK/2][ld] */
    float *o;           /* output accumulators [ld][dpad] */
    float *m, *l, *alpha; /* running max, running sum, rescale factor [ld] */
    float *kbuf;        /* converted key rows [NK][dpad] */
    float *vbuf;        /* value tile as f32, 64-dim chunk-major: (j, i) at ((i/64)*NK + j)*64 + i%64;
                           bf16 kernel: key pairs as bf16, (j, i) at (j/2)*dpad*2 + 2*i + j%2 */
    float *qrow;        /* one query row [dpad] (scalar reference) */
    const void **kp, **vp; /* row pointers of the key tile [NK] */
    int64_t *kpos;      /* key positions [NK] */
    int64_t *kpos_next; /* positions of the next key tile (prefetched) [NK] */
    int32_t *blocks;    /* a plan row's kept blocks, sorted ascending [keep_cap] */
    int32_t keep_cap;
    const char *bad;    /* what held NaN/Inf ("q" or "k"), its head and token; NULL: nothing */
    int32_t bad_head;
    int64_t bad_tok;
} ei__attn_ws;

static void ei__attn_geometry(int32_t G, int32_t d, int32_t *Gt, int32_t *Mt, int32_t *dpad) {
    int32_t gt = EI__MIN(G, EI__ATTN_MAX_GT);
    *Gt = gt;
    int32_t m = EI__MAX(EI__ATTN_MT_MIN, EI__ATTN_ROWS / 16 / gt), p2 = 1;
    while (p2 * 2 <= m) p2 *= 2; /* a power of two: the vector -> token map is a mask */
    *Mt = 16 * p2;
    *dpad = (int32_t)ei__round_up(d, 16);
}

/* Room to sort a plan row's kept blocks: what a plan made with this
   configuration holds per row, at most 2^16 (longer rows run unsorted). */
static int32_t ei__attn_keep_cap(const ei_config *c) {
    double k = floor(EI__MAX(1.0, (double)c->budget_max_factor) * (double)c->base_budget / (double)c->block_size);
    return (int32_t)EI__MIN(k, 65536.0) + 1;
}

static int ei__attn_ws_layout(const ei_config *c, int32_t G, int32_t d, ei__attn_ws *w, void *mem, size_t bytes,
                              size_t *need) {
    int32_t Gt, Mt, dpad, keep_cap = ei__attn_keep_cap(c);
    size_t total = 0, ld, nk = EI__ATTN_NK;
    ei__arena a;
    ei__attn_geometry(G, d, &Gt, &Mt, &dpad);
    ld = (size_t)Gt * (size_t)Mt;
    if (!ei__reserve(&total, (size_t)dpad * ld, 4) || !ei__reserve(&total, nk * ld, 4) ||
        !ei__reserve(&total, nk / 2 * ld, 4) || !ei__reserve(&total, ld * (size_t)dpad, 4) ||
        !ei__reserve(&total, ld, 4) || !ei__reserve(&total, ld, 4) || !ei__reserve(&total, ld, 4) ||
        !ei__reserve(&total, nk * (size_t)dpad, 4) || !ei__reserve(&total, nk * (size_t)ei__round_up(dpad, 64), 4) ||
        !ei__reserve(&total, (size_t)dpad, 4) || !ei__reserve(&total, nk, sizeof(void *)) ||
        !ei__reserve(&total, nk, sizeof(void *)) || !ei__reserve(&total, nk, sizeof(int64_t)) ||
        !ei__reserve(&total, nk, sizeof(int64_t)) || !ei__reserve(&total, (size_t)keep_cap, sizeof(int32_t)) ||
        !ei__add_size(total, EI__ALIGN, &total))
        return 0;
    *need = total;
    if (!mem || bytes < total) return 1;
    ei__arena_init(&a, mem, bytes);
    w->qt = (float *)ei__arena_take(&a, (size_t)dpad * ld, 4);
    w->s = (float *)ei__arena_take(&a, nk * ld, 4);
    w->pp = (uint32_t *)ei__arena_take(&a, nk / 2 * ld, 4);
    w->o = (float *)ei__arena_take(&a, ld * (size_t)dpad, 4);
    w->m = (float *)ei__arena_take(&a, ld, 4);
    w->l = (float *)ei__arena_take(&a, ld, 4);
    w->alpha = (float *)ei__arena_take(&a, ld, 4);
    w->kbuf = (float *)ei__arena_take(&a, nk * (size_t)dpad, 4);
    w->vbuf = (float *)ei__arena_take(&a, nk * (size_t)ei__round_up(dpad, 64), 4);
    w->qrow = (float *)ei__arena_take(&a, (size_t)dpad, 4);
    w->kp = (const void **)ei__arena_take(&a, nk, sizeof(void *));
    w->vp = (const void **)ei__arena_take(&a, nk, sizeof(void *));
    w->kpos = (int64_t *)ei__arena_take(&a, nk, sizeof(int64_t));
    w->kpos_next = (int64_t *)ei__arena_take(&a, nk, sizeof(int64_t));
    w->blocks = (int32_t *)ei__arena_take(&a, (size_t)keep_cap, sizeof(int32_t));
    w->keep_cap = keep_cap;
    return 1;
}

static ei_result ei__attn_ws_size(const ei_context *ctx, int32_t n_heads, int32_t n_kv_heads,
                                            int32_t head_dim, size_t *bytes) {
    ei__attn_ws w;
    ei_result r = ei__check_sizes(ctx, 1, n_heads, n_kv_heads, head_dim, bytes);
    if (r != EI_OK) return r;
    if (ei__on_gpu(ctx)) return EI__CUDA(ctx, attention_workspace_size, &ctx->cfg, n_heads, n_kv_heads, head_dim, bytes);
    if (!ei__attn_ws_layout(&ctx->cfg, n_heads / n_kv_heads, head_dim, &w, NULL, 0, bytes))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "attention workspace overflows size_t");
    return EI_OK;
}

/* ---- the key sequence of one query tile: kept blocks, then a causal run -- */
typedef struct ei__attn_keys {
    const int32_t *blocks; /* kept block indices (sparse) or NULL */
    int64_t n_block_keys;  /* n_blocks * block_size */
    int32_t bs;
    int64_t run0, run1;    /* the contiguous run [run0, run1) */
} ei__attn_keys;

static int64_t ei__attn_keys_total(const ei__attn_keys *ks) { return ks->n_block_keys + (ks->run1 - ks->run0); }
/* Positions of keys e0 .. e0+n-1 of the sequence; returns the largest. */
static int64_t ei__attn_key_positions(const ei__attn_keys *ks, int64_t e0, int32_t n, int64_t *pos) {
    int32_t j = 0;
    int64_t e = e0, last = -1;
    while (j < n && e < ks->n_block_keys) {
        int64_t b = e / ks->bs, off = e - b * ks->bs, p0 = (int64_t)ks->blocks[b] * ks->bs;
        for (; j < n && off < ks->bs; ++j, ++off, ++e) pos[j] = p0 + off;
        if (pos[j - 1] > last) last = pos[j - 1];
    }
    for (; j < n; ++j, ++e) { pos[j] = ks->run0 + (e - ks->n_block_keys); last = pos[j]; }
    return last;
}

/* ---- scalar reference ------------------------------------------------- */
static void ei__attn_row_to_f32(const void *row, ei_dtype dt, int32_t d, float *dst) {
    int32_t i;
    if (dt == EI_F32) { memcpy(dst, row, (size_t)d * 4u); return; }
    for (i = 0; i < d; ++i) dst[i] = ei__load1(row, dt, i);
}
static float ei__attn_clamp(float x) {
    if (!(x >= -FLT_MAX)) return -FLT_MAX; /* -inf and NaN */
    return x > FLT_MAX ? FLT_MAX : x;
}

/* One query row (head h, position t) over every key of ks: the output
   before normalisation in o[0..d), the running max *m (log2 units) and sum
   *l of the online softmax (*m = -FLT_MAX, *l = 0 for no keys). */
static void ei__attn_row_scalar(const ei__attn_job *J, ei__attn_ws *w, int32_t kvh, int32_t h, int64_t t,
                                const ei__attn_keys *ks, float *o, float *m_out, float *l_out) {
    int32_t d = J->d, i, j;
    int64_t e0, total = ei__attn_keys_total(ks);
    float *qv = w->qrow, *sc = w->s, *kv = w->kbuf, *vv = w->vbuf, m = -FLT_MAX, l = 0.0f;
    ei__attn_row_to_f32(ei__row(J->q, t - J->q_offset, h), J->q->dtype, d, qv);
    for (i = 0; i < d; ++i) o[i] = 0.0f;
    for (e0 = 0; e0 < total; e0 += EI__ATTN_NK) {
        int32_t nk = (int32_t)EI__MIN((int64_t)EI__ATTN_NK, total - e0);
        float mx = m, al, sum = 0.0f;
        ei__attn_key_positions(ks, e0, nk, w->kpos);
        for (j = 0; j < nk; ++j) {
            float acc = 0.0f;
            ei__attn_row_to_f32(ei__row(J->k, w->kpos[j], kvh), J->k->dtype, d, kv);
            for (i = 0; i < d; ++i) acc += qv[i] * kv[i];
            sc[j] = ei__attn_clamp(acc * J->c);
            if (sc[j] > mx) mx = sc[j];
        }
        al = exp2f(m - mx);
        for (i = 0; i < d; ++i) o[i] *= al;
        for (j = 0; j < nk; ++j) {
            float p = exp2f(sc[j] - mx);
            sum += p;
            ei__attn_row_to_f32(ei__row(J->v, w->kpos[j], kvh), J->v->dtype, d, vv);
            for (i = 0; i < d; ++i) o[i] += p * vv[i];
        }
        l = l * al + sum;
        m = mx;
    }
    *m_out = m;
    *l_out = l;
}

static void ei__attn_qtile_scalar(const ei__attn_job *J, ei__attn_ws *w, int32_t kvh, int32_t h0, int32_t gt, int64_t t0,
                                  int32_t nt, const ei__attn_keys *tile_keys) {
    int32_t d = J->d, g, tok, i;
    for (g = 0; g < gt; ++g)
        for (tok = 0; tok < nt; ++tok) {
            int64_t t = t0 + tok;
            ei__attn_keys ks = *tile_keys;
            float m, l, inv;
            void *orow;
            ks.run1 = t + 1;
            ei__attn_row_scalar(J, w, kvh, h0 + g, t, &ks, w->o, &m, &l);
            inv = 1.0f / l;
            orow = ei__row_out(J->out, t - J->q_offset, h0 + g);
            for (i = 0; i < d; ++i) ei__store1(orow, J->out->dtype, i, w->o[i] * inv);
        }
}

/* ---- vector kernels: tile stages ---------------------------------------- */
/* Stages of one query tile (a path's ei__attn_stages, >>isa-*):
     pack_q   the tile's queries into w->qt (zero rows past nt)
     prep_kv  key/value row pointers of the key tile (converted rows if needed)
     scores   w->s[j][r] = clamp(c * q_r.k_j), -inf where key j > token of r
     softmax  online softmax over the tile: m, l, alpha; w->s becomes P
     pack_p   (bf16 kernel only) P rounded to bf16 pairs
     pv       O[r] = alpha[r] * O[r] + sum_j P[j][r] v_j
     store    out = O / l for the valid rows
   scores and pv are hand-written per ISA (>>isa-*), as are the bf16
   kernel's packings; prep_kv, softmax and store are the templates below,
   written once against the vector vocabulary (>>simd); pack_q is plain C. */
/* Rows are head-major: row r = g * mt + tok (head h0 + g, token t0 + tok);
   mt (tokens per head, a power of two) is 16 x 2^k for prompt chunks and
   1..8 for calls with fewer tokens (decode steps), where a 16-row vector
   holds 16 / mt heads; ld rounds gt * mt up to whole vectors (padding rows
   are zero queries whose results are dropped). */
typedef struct ei__attn_tile {
    int32_t ld, nvec, mt;   /* rows (multiple of 16), 16-row vectors, tokens per head */
    int32_t nt, gt, h0, kvh;
    int64_t t0;
} ei__attn_tile;

/* Visible lanes of 16-row vector vi for key position p: lane i holds row
   16 vi + i, whose token is t0 + (16 vi + i) % mt; visible when the token is
   at or past p. */
EI__MAYBE_UNUSED static uint32_t ei__attn_vmask(const ei__attn_tile *T, int32_t vi, int64_t p) {
    int64_t diff;
    uint32_t grp, m = 0;
    int32_t i;
    if (T->mt >= 16) { /* 16 consecutive tokens of one head */
        diff = p - (T->t0 + 16 * (vi & (T->mt / 16 - 1)));
        if (diff <= 0) return 0xffffu;
        if (diff >= 16) return 0u;
        return (0xffffu << diff) & 0xffffu;
    }
    diff = p - T->t0; /* 16 / mt heads of mt tokens each */
    if (diff <= 0) return 0xffffu;
    if (diff >= T->mt) return 0u;
    grp = ((1u << T->mt) - 1u) & ~((1u << diff) - 1u);
    for (i = 0; i < 16; i += T->mt) m |= grp << i;
    return m;
}

/* Queries transposed into w->qt [d][ld] (row r of the tile is column r):
   plain C shared by the f32-arithmetic paths; the work is a strided
   scatter, which compiled per ISA ran more instructions, not fewer. */
EI__MAYBE_UNUSED static void ei__attn_pack_q_f32(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T) {
    int32_t r, i, d = J->d;
    for (r = 0; r < T->ld; ++r) {
        int32_t g = r / T->mt, tok = r % T->mt;
        if (g < T->gt && tok < T->nt)
            ei__attn_row_to_f32(ei__row(J->q, T->t0 + tok - J->q_offset, T->h0 + g), J->q->dtype, d, w->qrow);
        else for (i = 0; i < d; ++i) w->qrow[i] = 0.0f;
        for (i = 0; i < d; ++i) w->qt[(size_t)i * (size_t)T->ld + (size_t)r] = w->qrow[i];
    }
}

/* Queries as u32 bf16 pairs (q[2i], q[2i+1]) [d/2][ld] (row r of the tile
   is column r): the packing of the kernels that take a dimension pair per
   instruction (vdpbf16ps, BFDOT) for all-bf16 calls; plain C shared by
   them, a strided scatter like ei__attn_pack_q_f32. */
EI__MAYBE_UNUSED static void ei__attn_pack_q_pairs(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T) {
    int32_t r, i2, d2 = J->d / 2;
    uint32_t *qp = (uint32_t *)w->qt;
    for (r = 0; r < T->ld; ++r) {
        int32_t g = r / T->mt, tok = r % T->mt;
        if (g < T->gt && tok < T->nt) {
            const unsigned char *row = (const unsigned char *)ei__row(J->q, T->t0 + tok - J->q_offset, T->h0 + g);
            for (i2 = 0; i2 < d2; ++i2) memcpy(&qp[(size_t)i2 * (size_t)T->ld + (size_t)r], row + 4 * i2, 4);
        } else
            for (i2 = 0; i2 < d2; ++i2) qp[(size_t)i2 * (size_t)T->ld + (size_t)r] = 0u;
    }
}

/* The elementwise stages, written once (vocabulary and mechanics: >>simd).
   EI__ATTN_DEFINE_STAGES() defines, for the section's EI__VISA:
     ei__attn_exp2_<isa>        2^x per lane
     ei__attn_row_f32_<isa>     a row of any dtype as d f32, zero to dpad
     ei__attn_put_scores_<isa>  one vector of scores: scale, clamp, mask, store
     ei__attn_prep_kv_<isa>, ei__attn_softmax_<isa>, ei__attn_store_<isa>
                                stages of ei__attn_stages
   A 16-row vector of the tile layout is 16 / EI__VN vectors: part `sub` of
   vector vi holds rows 16 vi + EI__VN sub ... */

/* 2^x; -inf, NaN and x < -126 give 0 (no subnormal weights: they would cost
   microcode assists in the FMAs and weigh < 2^-126 anyway; max() returns its
   second operand for a NaN, so NaN becomes -127 and is dropped). Cephes
   exp2f polynomial on [-0.5, 0.5], ~1 ulp. */
#define EI__ATTN_DEFINE_EXP2()                                                                                 \
    EI__VTARGET EI__VINLINE EI__VEC EI__VNAME(ei__attn_exp2)(EI__VEC x) {                                       \
        EI__VEC n, f, p;                                                                                       \
        EI__VMASK keep;                                                                                        \
        x = EI__VMAX(x, EI__VSET1(-127.0f));                                                                   \
        keep = EI__VGE(x, EI__VSET1(-126.0f));                                                                 \
        n = EI__VROUND(x);                                                                                     \
        f = EI__VSUB(x, n);                                                                                    \
        p = EI__VSET1(1.535336188319500e-4f);                                                                  \
        p = EI__VFMA(p, f, EI__VSET1(1.339887440266574e-3f));                                                  \
        p = EI__VFMA(p, f, EI__VSET1(9.618437357674640e-3f));                                                  \
        p = EI__VFMA(p, f, EI__VSET1(5.550332471162809e-2f));                                                  \
        p = EI__VFMA(p, f, EI__VSET1(2.402264791363012e-1f));                                                  \
        p = EI__VFMA(p, f, EI__VSET1(6.931472028550421e-1f));                                                  \
        p = EI__VFMA(p, f, EI__VSET1(1.0f));                                                                   \
        return EI__VPOW2(p, n, keep);                                                                          \
    }

/* A row of any dtype as d f32, zero from d to dpad. */
#define EI__ATTN_DEFINE_ROW_F32()                                                                              \
    EI__VTARGET static void EI__VNAME(ei__attn_row_f32)(const void *row, ei_dtype dt, int32_t d, int32_t dpad,  \
                                                        float *dst) {                                          \
        const size_t es = ei__dtype_size(dt);                                                                  \
        int32_t c0;                                                                                            \
        for (c0 = 0; c0 < dpad; c0 += EI__VN) {                                                                \
            int32_t rem = d - c0;                                                                              \
            EI__VSTOREU(dst + c0, rem > 0 ? EI__VLOAD_ROW((const unsigned char *)row + (size_t)c0 * es, dt,     \
                                                          EI__VFIRST(EI__MIN(rem, (int32_t)EI__VN)))            \
                                          : EI__VZERO());                                                      \
        }                                                                                                      \
    }

/* Scores of rows 16 vi + EI__VN sub ... for key j: scale, clamp to
   +-FLT_MAX (NaN too), -inf where the key is past the row's token. ld is
   T->ld, passed by value: a vector store may alias T, and the reload would
   cost a multiply per store. */
#define EI__ATTN_DEFINE_PUT_SCORES()                                                                           \
    EI__VTARGET EI__VINLINE void EI__VNAME(ei__attn_put_scores)(ei__attn_ws *w, const ei__attn_tile *T,         \
                                                                int32_t ld, int need_mask, int32_t j,          \
                                                                int32_t vi, int32_t sub, EI__VEC acc,          \
                                                                EI__VEC cv) {                                  \
        EI__VEC x = EI__VMIN(EI__VMAX(EI__VMUL(acc, cv), EI__VSET1(-FLT_MAX)), EI__VSET1(FLT_MAX));            \
        if (need_mask)                                                                                         \
            x = EI__VSELECT_BITS(ei__attn_vmask(T, vi, w->kpos[j]) >> (EI__VN * sub), x, EI__VSET1(-INFINITY)); \
        EI__VSTORE(w->s + (size_t)j * (size_t)ld + (size_t)vi * 16u + (size_t)(EI__VN * sub), x);              \
    }

/* Key rows: in place (f32) or converted into kbuf. Value rows: always copied
   into the chunk-major vbuf (a contiguous 16 KB block per 64 dims, so the
   P V sweep stays in L1 whatever the cache's token stride). Key pointers
   past nk repeat the last row (the score loops run whole key groups). */
#define EI__ATTN_DEFINE_PREP_KV()                                                                              \
    EI__VTARGET static void EI__VNAME(ei__attn_prep_kv)(const ei__attn_job *J, ei__attn_ws *w,                  \
                                                        const ei__attn_tile *T, int32_t nk) {                  \
        const int32_t d = J->d, dpad = J->dpad;                                                                \
        const size_t es = ei__dtype_size(J->v->dtype);                                                         \
        int32_t j, c0;                                                                                         \
        for (j = 0; j < nk; ++j) {                                                                             \
            const void *kr = ei__row(J->k, w->kpos[j], T->kvh);                                                \
            const unsigned char *vr = (const unsigned char *)ei__row(J->v, w->kpos[j], T->kvh);                \
            if (J->k->dtype != EI_F32) {                                                                       \
                float *dst = w->kbuf + (size_t)j * (size_t)dpad;                                               \
                EI__VNAME(ei__attn_row_f32)(kr, J->k->dtype, d, dpad, dst);                                    \
                kr = dst;                                                                                      \
            }                                                                                                  \
            w->kp[j] = kr;                                                                                     \
            for (c0 = 0; c0 < dpad; c0 += EI__VN) {                                                            \
                int32_t rem = d - c0;                                                                          \
                float *dst = w->vbuf + ((size_t)(c0 / 64) * EI__ATTN_NK + (size_t)j) * 64u + (size_t)(c0 % 64);  \
                EI__VSTORE(dst, rem > 0 ? EI__VLOAD_ROW(vr + (size_t)c0 * es, J->v->dtype,                       \
                                                        EI__VFIRST(EI__MIN(rem, (int32_t)EI__VN)))              \
                                        : EI__VZERO());                                                        \
            }                                                                                                  \
        }                                                                                                      \
        for (; j < ((nk + 7) & ~7); ++j) w->kp[j] = w->kp[nk - 1];                                             \
    }

/* Online softmax, per vector of rows (purely vertical): new max over the key
   tile, alpha = 2^(m_old - m_new), P = 2^(s - m_new), l = l alpha + sum P. */
#define EI__ATTN_DEFINE_SOFTMAX()                                                                              \
    EI__VTARGET static void EI__VNAME(ei__attn_softmax)(ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {   \
        const int32_t ld = T->ld;                                                                              \
        int32_t vi, j;                                                                                         \
        for (vi = 0; vi < ld / (int32_t)EI__VN; ++vi) {                                                        \
            float *col = w->s + (size_t)vi * EI__VN;                                                           \
            EI__VEC mo = EI__VLOAD(w->m + vi * EI__VN), mx = mo, al, sum = EI__VZERO();                        \
            for (j = 0; j < nk; ++j) mx = EI__VMAX(mx, EI__VLOAD(col + (size_t)j * (size_t)ld));               \
            al = EI__VNAME(ei__attn_exp2)(EI__VSUB(mo, mx));                                                   \
            for (j = 0; j < nk; ++j) {                                                                         \
                float *p = col + (size_t)j * (size_t)ld;                                                       \
                EI__VEC e = EI__VNAME(ei__attn_exp2)(EI__VSUB(EI__VLOAD(p), mx));                              \
                EI__VSTORE(p, e);                                                                              \
                sum = EI__VADD(sum, e);                                                                        \
            }                                                                                                  \
            EI__VSTORE(w->l + vi * EI__VN, EI__VFMA(EI__VLOAD(w->l + vi * EI__VN), al, sum));                  \
            EI__VSTORE(w->m + vi * EI__VN, mx);                                                                \
            EI__VSTORE(w->alpha + vi * EI__VN, al);                                                            \
        }                                                                                                      \
    }

/* out = O / l for the tile's valid rows, in the output's dtype. */
#define EI__ATTN_DEFINE_STORE()                                                                                \
    EI__VTARGET static void EI__VNAME(ei__attn_store)(const ei__attn_job *J, ei__attn_ws *w,                    \
                                                      const ei__attn_tile *T) {                                \
        const int32_t d = J->d;                                                                                \
        const ei_dtype dt = J->out->dtype;                                                                     \
        const size_t es = ei__dtype_size(dt);                                                                  \
        int32_t g, tok, c0;                                                                                    \
        for (g = 0; g < T->gt; ++g)                                                                            \
            for (tok = 0; tok < T->nt; ++tok) {                                                                \
                int32_t r = g * J->Mt + tok;                                                                   \
                const float *o = w->o + (size_t)r * (size_t)J->dpad;                                           \
                EI__VEC inv = EI__VSET1(1.0f / w->l[r]);                                                       \
                unsigned char *dst = (unsigned char *)ei__row_out(J->out, T->t0 + tok - J->q_offset, T->h0 + g); \
                for (c0 = 0; c0 + EI__VN <= d; c0 += EI__VN)                                                   \
                    EI__VSTORE_ROW(dst + (size_t)c0 * es, dt, EI__VMUL(EI__VLOAD(o + c0), inv), EI__VFIRST(EI__VN)); \
                if (c0 < d)                                                                                    \
                    EI__VSTORE_ROW(dst + (size_t)c0 * es, dt, EI__VMUL(EI__VLOAD(o + c0), inv), EI__VFIRST(d - c0)); \
            }                                                                                                  \
    }

#define EI__ATTN_DEFINE_STAGES()                                                                               \
    EI__ATTN_DEFINE_EXP2()                                                                                     \
    EI__ATTN_DEFINE_ROW_F32()                                                                                  \
    EI__ATTN_DEFINE_PUT_SCORES()                                                                               \
    EI__ATTN_DEFINE_PREP_KV()                                                                                  \
    EI__ATTN_DEFINE_SOFTMAX()                                                                                  \
    EI__ATTN_DEFINE_STORE()

/* Prefetch the cache lines of bytes [p, p + n) for reading: into every level
   (l1 = 1, prefetcht0: read soon, by the next tile) or into L2 only (l1 = 0,
   prefetcht1: for rows read after the walk has touched more than L1 holds;
   a decode step's next tile of a group comes after every other group's
   tile, n_kv_heads x 32 KB of bf16 K and V). Measured on an AMD Zen 5 (2
   threads, 32k bf16 keys, 32/8 heads): a decode step took 14-17 ms with
   prefetcht0, 7.7-9 ms with prefetcht1, 25-28 ms with no software prefetch. */
static void ei__prefetch_bytes(const void *p, size_t n, int l1) {
#if defined(__GNUC__) || defined(__clang__)
    size_t o;
    if (l1)
        for (o = 0; o < n; o += 64) __builtin_prefetch((const char *)p + o, 0, 3);
    else
        for (o = 0; o < n; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
#else
    (void)p; (void)n; (void)l1;
#endif
}
/* Prefetch the key and value rows at positions pos[0..n) into the cache. */
static void ei__attn_prefetch_rows(const ei__attn_job *J, int32_t kvh, const int64_t *pos, int32_t n) {
    size_t kbytes = (size_t)J->d * ei__dtype_size(J->k->dtype), vbytes = (size_t)J->d * ei__dtype_size(J->v->dtype);
    int32_t j;
    for (j = 0; j < n; ++j) {
        ei__prefetch_bytes(ei__row(J->k, pos[j], kvh), kbytes, 1);
        ei__prefetch_bytes(ei__row(J->v, pos[j], kvh), vbytes, 1);
    }
}

/* In-place heapsort (no allocation): kept blocks visited in ascending
   position order read the cache front to back. */
static void ei__attn_sort_i32(int32_t *v, int32_t n) {
    int32_t i, end;
    for (i = n / 2 - 1; i >= 0; --i)
        for (int32_t r = i;;) {
            int32_t c = 2 * r + 1, t;
            if (c >= n) break;
            if (c + 1 < n && v[c + 1] > v[c]) ++c;
            if (v[r] >= v[c]) break;
            t = v[r]; v[r] = v[c]; v[c] = t; r = c;
        }
    for (end = n - 1; end > 0; --end) {
        int32_t t = v[0];
        v[0] = v[end]; v[end] = t;
        for (int32_t r = 0;;) {
            int32_t c = 2 * r + 1;
            if (c >= end) break;
            if (c + 1 < end && v[c + 1] > v[c]) ++c;
            if (v[r] >= v[c]) break;
            t = v[r]; v[r] = v[c]; v[c] = t; r = c;
        }
    }
}

/* NaN/Inf in what a tile reads (README: NaN or Inf in Q or K gets a code):
   its query rows, here, and its key rows: the vector path checks each key
   tile just before scoring it (the rows are then in cache: a one-token call
   would otherwise read K twice from memory), the scalar reference all of
   them before its row loop. V is not read for this. The Q rows cost about
   1/keys of the tile's work; the key rows 1/rows (1/16 for a one-token tile,
   whose 16-row vector holds its heads). */
static int ei__attn_bad(ei__attn_ws *w, const char *what, int32_t head, int64_t tok) {
    w->bad = what; w->bad_head = head; w->bad_tok = tok;
    return 0;
}
static int ei__attn_q_finite(const ei__attn_job *J, ei__attn_ws *w, int32_t h0, int32_t gt, int64_t t0, int32_t nt) {
    int32_t g;
    for (g = 0; g < gt; ++g)
        if (!J->ctx->kern->minmax(J->q, t0 - J->q_offset, nt, h0 + g, w->kbuf, w->kbuf + J->dpad))
            return ei__attn_bad(w, "q", h0 + g, t0);
    return 1;
}
static int ei__attn_keys_finite(const ei__attn_job *J, ei__attn_ws *w, int32_t kvh, const ei__attn_keys *ks) {
    int64_t total = ei__attn_keys_total(ks), e0;
    for (e0 = 0; e0 < total; e0 += EI__ATTN_NK) {
        int32_t nk = (int32_t)EI__MIN((int64_t)EI__ATTN_NK, total - e0);
        ei__attn_key_positions(ks, e0, nk, w->kpos);
        if (!J->ctx->kern->rows_finite(J->k, w->kpos, nk, kvh)) return ei__attn_bad(w, "k", kvh, w->kpos[0]);
    }
    return 1;
}

/* One query tile through the vector stages J->K, up to the output before
   normalisation (w->o, w->m, w->l: K->store or ei__attn_save_partial
   next); 0 if a key row holds NaN/Inf. */
static int ei__attn_qtile_vec(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T, const ei__attn_keys *ks) {
    const ei__attn_stages *K = J->K;
    int64_t total = ei__attn_keys_total(ks), e0;
    size_t i, rows = (size_t)T->ld;
    for (i = 0; i < rows; ++i) { w->m[i] = -FLT_MAX; w->l[i] = 0.0f; }
    memset(w->o, 0, rows * (size_t)J->dpad * sizeof(float));
    K->pack_q(J, w, T);
    for (e0 = 0; e0 < total; e0 += EI__ATTN_NK) {
        int32_t nk = (int32_t)EI__MIN((int64_t)EI__ATTN_NK, total - e0);
        int64_t last = ei__attn_key_positions(ks, e0, nk, w->kpos);
        int32_t jp;
        if (!J->ctx->kern->rows_finite(J->k, w->kpos, nk, T->kvh)) return ei__attn_bad(w, "k", T->kvh, w->kpos[0]);
        for (jp = nk; jp < ((nk + 7) & ~7); ++jp) w->kpos[jp] = w->kpos[nk - 1]; /* the score loops run whole key groups */
        if (e0 + EI__ATTN_NK < total) { /* the next tile's rows: kept blocks are scattered */
            int32_t nn = (int32_t)EI__MIN((int64_t)EI__ATTN_NK, total - e0 - EI__ATTN_NK);
            ei__attn_key_positions(ks, e0 + EI__ATTN_NK, nn, w->kpos_next);
            ei__attn_prefetch_rows(J, T->kvh, w->kpos_next, nn);
        }
        K->prep_kv(J, w, T, nk);
        K->scores(J, w, T, nk, last > T->t0);
        K->softmax(w, T, nk);
        if (K->pack_p) K->pack_p(w, T, nk);
        K->pv(J, w, T, nk);
    }
    return 1;
}

/* ---- work items, costs, split ------------------------------------------ */
static int ei__attn_sparse(const ei__attn_job *J, int32_t s) {
    return J->plan && ei_plan_segment_is_sparse(J->ctx, J->plan, s);
}
/* Walk every item of the call in (kv head, head subgroup, segment, tile)
   order. mode 0: return the total cost. mode 1: run the items of thread ith
   (-1 when one reads NaN/Inf: w->bad says where). */
static int64_t ei__attn_walk(const ei__attn_job *J, int mode, int64_t total_cost, int ith, int nth, ei__attn_ws *w) {
    int32_t kvh, hs, n_kv = J->k->n_heads, n_hs = (J->G + J->Gt - 1) / J->Gt;
    int64_t cum = 0;
    int32_t s_first = (int32_t)(J->q_offset / J->seg), s_last = (int32_t)((J->q_end - 1) / J->seg), s;
    for (kvh = 0; kvh < n_kv; ++kvh)
        for (hs = 0; hs < n_hs; ++hs) {
            int32_t h0 = kvh * J->G + hs * J->Gt, gt = EI__MIN(J->Gt, J->G - hs * J->Gt);
            for (s = s_first; s <= s_last; ++s) {
                int64_t S0 = (int64_t)s * J->seg, S1 = S0 + J->seg;
                int64_t a = EI__MAX(S0, J->q_offset), b = EI__MIN(S1, J->q_end), t0;
                ei__attn_keys ks;
                ks.blocks = NULL;
                ks.n_block_keys = 0;
                ks.bs = J->bs;
                ks.run0 = 0;
                if (ei__attn_sparse(J, s)) {
                    size_t row = (size_t)kvh * (size_t)J->plan->seg_capacity + (size_t)s;
                    ks.blocks = J->plan->block_index + row * (size_t)J->plan->max_keep;
                    ks.n_block_keys = (int64_t)J->plan->keep_count[row] * J->bs;
                    ks.run0 = S0;
                }
                for (t0 = a; t0 < b; t0 += J->Mt) {
                    int32_t nt = (int32_t)EI__MIN((int64_t)J->Mt, b - t0);
                    int64_t keys = ks.n_block_keys + (t0 + nt - ks.run0);
                    int64_t cost = (keys + 64) * (int64_t)gt * J->Mt;
                    if (mode == 1) {
                        /* owner: the thread whose share holds the item's cost midpoint */
                        int64_t mid = cum + cost / 2;
                        int owner = (int)((double)mid * (double)nth / (double)total_cost);
                        if (owner >= nth) owner = nth - 1;
                        if (owner == ith) {
                            if (!ei__attn_q_finite(J, w, h0, gt, t0, nt)) return -1;
                            ks.run1 = t0 + nt;
                            if (ks.blocks && ks.blocks != w->blocks && ks.n_block_keys / J->bs <= w->keep_cap) {
                                int32_t nb = (int32_t)(ks.n_block_keys / J->bs);
                                memcpy(w->blocks, ks.blocks, (size_t)nb * sizeof(int32_t));
                                ei__attn_sort_i32(w->blocks, nb);
                                ks.blocks = w->blocks; /* for the segment's later tiles too */
                            }
                            if (!J->K) {
                                if (!ei__attn_keys_finite(J, w, kvh, &ks)) return -1;
                                ei__attn_qtile_scalar(J, w, kvh, h0, gt, t0, nt, &ks);
                            } else {
                                ei__attn_tile T;
                                T.mt = J->Mt; T.ld = (int32_t)ei__round_up(gt * J->Mt, 16); T.nvec = T.ld / 16;
                                T.nt = nt; T.gt = gt; T.h0 = h0; T.kvh = kvh; T.t0 = t0;
                                if (!ei__attn_qtile_vec(J, w, &T, &ks)) return -1;
                                J->K->store(J, w, &T);
                            }
                        }
                    }
                    cum += cost;
                }
            }
        }
    return cum;
}

/* ---- validation --------------------------------------------------------- */

/* Thread ith of nth of an attention or decode call. */
static ei_result ei__attn_check_split(const ei_context *ctx, int ith, int nth) {
    if (nth <= 0 || nth > EI__ATTN_MAX_THREADS || ith < 0 || ith >= nth)
        return ei__fail(ctx, EI_ERR_SIZE, "ith %d / nth %d: need 0 <= ith < nth <= %d", ith, nth, EI__ATTN_MAX_THREADS);
    return EI_OK;
}

/* A keep set a decode step can attend through: filled, one row per kv head,
   per query head or shared, made before the step's first query (its kept
   rows lie before that query, so every token of the step sees them; rows
   appended since are attended causally). Its rows are checked ascending
   inside the cache (ei__check_keep_index) once the call's regions are known
   apart: the step writes its workspace, partials and out, and a keep set
   lying in one of them would be read after the kernel overwrote it. */
static ei_result ei__check_decode_keep(const ei_context *ctx, const ei_keep_set *keep, const ei_tensor *q,
                                       const ei_tensor *k, int64_t q_offset) {
    ei_result r;
    if ((r = ei__check_keep_filled(ctx, keep)) != EI_OK) return r;
    if (keep->heads_out != 1 && keep->heads_out != k->n_heads && keep->heads_out != q->n_heads)
        return ei__fail(ctx, EI_ERR_SHAPE, "keep set has %d rows: 1, %d (kv heads) or %d (query heads) expected",
                        (int)keep->heads_out, (int)k->n_heads, (int)q->n_heads);
    if (keep->n_tokens > q_offset + 1)
        return ei__fail(ctx, EI_ERR_SHAPE, "keep set scored %lld rows, the step's first query is row %lld: its kept rows "
                        "must lie at or before it", (long long)keep->n_tokens, (long long)q_offset);
    return EI_OK;
}

/* Every check of an attention call, for both backends (partials: a decode
   call's, NULL for prefill; keep: a decode call's keep set, or NULL). Every
   region of the call is listed once, so each pair is compared. */
/* The plan rows that queries q_offset .. need - 1 read, for a checked plan
   that covers them: counts within max_keep and kept blocks before their
   segment. A device plan's rows are device memory the host cannot read:
   the kernels clamp counts and skip block numbers outside the segment. */
static ei_result ei__check_plan_rows(const ei_context *ctx, const ei_plan *plan, int64_t q_offset, int64_t need) {
    int32_t kvh, s, s_first = (int32_t)(q_offset / ctx->cfg.segment_size), s_last = (int32_t)((need - 1) / ctx->cfg.segment_size);
    for (kvh = 0; kvh < plan->n_kv_heads && !plan->on_device; ++kvh)
        for (s = s_first; s <= s_last; ++s) {
            size_t row = (size_t)kvh * (size_t)plan->seg_capacity + (size_t)s;
            int64_t first_blocked = (int64_t)s * (ctx->cfg.segment_size / ctx->cfg.block_size);
            int32_t cnt, i;
            const int32_t *idx;
            if (!ei__segment_sparse(&ctx->cfg, s, plan->n_segments, plan->final)) continue; /* (plan checked) */
            cnt = plan->keep_count[row];
            if (cnt < 0 || cnt > plan->max_keep)
                return ei__fail(ctx, EI_ERR_SHAPE, "plan keep_count %d of kv head %d segment %d not in 0..%d", (int)cnt,
                                (int)kvh, (int)s, (int)plan->max_keep);
            idx = plan->block_index + row * (size_t)plan->max_keep;
            for (i = 0; i < cnt; ++i)
                if (idx[i] < 0 || idx[i] >= first_blocked)
                    return ei__fail(ctx, EI_ERR_SHAPE,
                                    "plan block_index[%d][%d][%d] = %d is not a block before the segment (0..%lld)",
                                    (int)kvh, (int)s, (int)i, (int)idx[i], (long long)first_blocked - 1);
        }
    return EI_OK;
}
static ei_result ei__attn_check(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                                const ei_plan *plan, const ei_keep_set *keep, const ei_out_tensor *out, int64_t q_offset,
                                const void *workspace, int n_ws, const void *partials, size_t partials_bytes) {
    ei__regions g;
    size_t per;
    ei_result r;
    int64_t need;
    if ((r = ei__check_qk(ctx, q, k)) != EI_OK) return r;
    if ((r = ei__check_tensor(ctx, v, "v")) != EI_OK) return r;
    if ((r = ei__check_out_tensor(ctx, out, "out")) != EI_OK) return r;
    if (v->n_heads != k->n_heads || v->head_dim != k->head_dim)
        return ei__fail(ctx, EI_ERR_SHAPE, "v has %d heads x %d dims, k has %d x %d", (int)v->n_heads, (int)v->head_dim,
                        (int)k->n_heads, (int)k->head_dim);
    if (out->n_heads != q->n_heads || out->head_dim != q->head_dim || out->n_tokens != q->n_tokens)
        return ei__fail(ctx, EI_ERR_SHAPE, "out is %lld x %d x %d, q is %lld x %d x %d", (long long)out->n_tokens,
                        (int)out->n_heads, (int)out->head_dim, (long long)q->n_tokens, (int)q->n_heads, (int)q->head_dim);
    if (q_offset < 0 || q_offset > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "q_offset %lld not in 0..%lld", (long long)q_offset, (long long)EI_MAX_TOKENS);
    need = q_offset + q->n_tokens;
    if (need > EI_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "q_offset + n_tokens = %lld exceeds %lld", (long long)need, (long long)EI_MAX_TOKENS);
    if (k->n_tokens < need || v->n_tokens < need)
        return ei__fail(ctx, EI_ERR_SHAPE, "queries reach token %lld but k holds %lld and v %lld keys", (long long)need - 1,
                        (long long)k->n_tokens, (long long)v->n_tokens);
    if (plan && (r = ei__check_plan(ctx, plan)) != EI_OK) return r;
    if (keep && (r = ei__check_decode_keep(ctx, keep, q, k, q_offset)) != EI_OK) return r;
    if ((r = ei__attn_ws_size(ctx, q->n_heads, k->n_heads, q->head_dim, &per)) != EI_OK) return r;
    g.n = 0; /* attention is not in place: out meets nothing it reads */
    ei__reg_view(&g, q, "q", "the ei_tensor q", 0);
    ei__reg_view(&g, k, "k", "the ei_tensor k", 0);
    ei__reg_view(&g, v, "v", "the ei_tensor v", 0);
    ei__reg_out_view(&g, out, "out", "the ei_out_tensor out");
    if (plan) ei__reg_plan(&g, plan, 0);
    ei__reg_workspace(&g, workspace, per * (size_t)n_ws);
    if (partials) ei__reg_mem(&g, partials, partials_bytes, "partials", 1);
    if (keep) {
        ei__reg_mem(&g, keep, sizeof *keep, "the ei_keep_set struct", 0);
        ei__reg_mem(&g, keep->index, (size_t)keep->heads_out * (size_t)keep->capacity * 4u, "keep->index", 0);
    }
    if ((r = ei__check_regions(ctx, &g)) != EI_OK) return r;
    if (keep && (r = ei__check_keep_index(ctx, keep)) != EI_OK) return r;
    if (plan) {
        if (plan->n_kv_heads != k->n_heads)
            return ei__fail(ctx, EI_ERR_SHAPE, "plan has %d kv heads, k has %d", (int)plan->n_kv_heads, (int)k->n_heads);
        if (plan->segment_size != ctx->cfg.segment_size || plan->block_size != ctx->cfg.block_size)
            return ei__fail(ctx, EI_ERR_SHAPE, "plan was laid out for segment %d / block %d, context has %d / %d",
                            (int)plan->segment_size, (int)plan->block_size, (int)ctx->cfg.segment_size, (int)ctx->cfg.block_size);
        if (plan->n_tokens < need)
            return ei__fail(ctx, EI_ERR_STATE, "plan covers %lld tokens, queries reach %lld: profile them first",
                            (long long)plan->n_tokens, (long long)need);
        return ei__check_plan_rows(ctx, plan, q_offset, need);
    }
    return EI_OK;
}

/* The job of a checked call: tile geometry, scale and the kernel's stages. */
static void ei__attn_setup(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                           const ei_plan *plan, const ei_out_tensor *out, int64_t q_offset, ei__attn_job *J) {
    double scale;
    memset(J, 0, sizeof *J);
    J->ctx = ctx; J->q = q; J->k = k; J->v = v; J->plan = plan; J->out = out;
    J->q_offset = q_offset; J->q_end = q_offset + q->n_tokens;
    J->G = q->n_heads / k->n_heads;
    J->d = q->head_dim;
    ei__attn_geometry(J->G, J->d, &J->Gt, &J->Mt, &J->dpad);
    /* few query tokens (a decode step): shrink the tile to them; rows past the
       call's tokens are computed and thrown away, so a 64-token tile would do
       64x the work of one token; below 16 tokens the heads share vectors */
    while (J->Mt > 1 && J->Mt / 2 >= q->n_tokens) J->Mt /= 2;
    J->seg = ctx->cfg.segment_size;
    J->bs = ctx->cfg.block_size;
    scale = ctx->cfg.attn_scale > 0.0f ? (double)ctx->cfg.attn_scale : 1.0 / sqrt((double)J->d);
    J->c = (float)(scale * 1.4426950408889634);
    J->K = ctx->kern->attn;
    if (ctx->kern->attn_bf16 && q->dtype == EI_BF16 && k->dtype == EI_BF16 && v->dtype == EI_BF16 && J->d % 2 == 0)
        J->K = ctx->kern->attn_bf16;
    if (ctx->kern->attn_f16 && q->dtype == EI_F16 && k->dtype == EI_F16 && v->dtype == EI_F16 && J->d % 2 == 0)
        J->K = ctx->kern->attn_f16;
}

/* One thread's workspace, laid out. */
static ei_result ei__attn_ws_take(const ei__attn_job *J, void *workspace, size_t ws_bytes, ei__attn_ws *w) {
    size_t need;
    if (!ei__attn_ws_layout(&J->ctx->cfg, J->G, J->d, w, workspace, ws_bytes, &need))
        return ei__fail(J->ctx, EI_ERR_OVERFLOW, "attention workspace overflows size_t");
    if (!workspace) return ei__fail(J->ctx, EI_ERR_NULL, "workspace is NULL (%zu bytes needed)", need);
    if (ws_bytes < need) return ei__fail(J->ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %zu needed", ws_bytes, need);
    w->bad = NULL;
    return EI_OK;
}
static ei_result ei__attn_bad_fail(const ei__attn_job *J, const ei__attn_ws *w) {
    return ei__fail(J->ctx, EI_ERR_NONFINITE, "NaN or Inf in %s (head %d, tokens from %lld)", w->bad, (int)w->bad_head,
                    (long long)w->bad_tok);
}

static ei_result ei__attn_run(const ei__attn_job *J, int ith, int nth, void *workspace, size_t ws_bytes) {
    ei__attn_ws w;
    int64_t total;
    ei_result r;
    if ((r = ei__attn_ws_take(J, workspace, ws_bytes, &w)) != EI_OK) return r;
    total = ei__attn_walk(J, 0, 0, ith, nth, NULL);
    if (total > 0 && ei__attn_walk(J, 1, total, ith, nth, &w) < 0) return ei__attn_bad_fail(J, &w);
    return EI_OK;
}

static ei_result ei__attn_prefill_part(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                                     const ei_plan *plan, ei_out_tensor *out, int64_t q_offset, int ith, int nth,
                                     void *workspace, size_t workspace_bytes) {
    ei__attn_job J;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if ((r = ei__attn_check_split(ctx, ith, nth)) != EI_OK) return r;
    if ((r = ei__attn_check(ctx, q, k, v, plan, NULL, out, q_offset, workspace, 1, NULL, 0)) != EI_OK) return r;
    if (ei__on_gpu(ctx)) /* one launch does the whole layer: the call with ith 0 makes it */
        return ith == 0 ? EI__CUDA(ctx, attention, &ctx->cfg, q, k, v, plan, out, q_offset, workspace, workspace_bytes)
                        : EI_OK;
    ei__attn_setup(ctx, q, k, v, plan, out, q_offset, &J);
    return ei__attn_run(&J, ith, nth, workspace, workspace_bytes);
}

static ei_result ei__attn_share(void *arg, int ith, int nth, void *ws, size_t ws_bytes) {
    return ei__attn_run((const ei__attn_job *)arg, ith, nth, ws, ws_bytes);
}

/* Built-in pthread helper: n_threads workers (the calling thread is one of
   them), workspace = n_threads x ei_attention_workspace_size. Under
   EI_NO_PTHREADS the shares run one after another on the calling thread. */
static ei_result ei__attn_prefill_mt(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                                        const ei_plan *plan, ei_out_tensor *out, int64_t q_offset, int n_threads,
                                        void *workspace, size_t workspace_bytes) {
    ei__attn_job J;
    size_t per;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (n_threads <= 0 || n_threads > EI__ATTN_MAX_THREADS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_threads %d not in 1..%d", n_threads, EI__ATTN_MAX_THREADS);
    if ((r = ei__attn_check(ctx, q, k, v, plan, NULL, out, q_offset, workspace, ei__on_gpu(ctx) ? 1 : n_threads, NULL, 0)) != EI_OK)
        return r;
    if (ei__on_gpu(ctx)) return EI__CUDA(ctx, attention, &ctx->cfg, q, k, v, plan, out, q_offset, workspace, workspace_bytes);
    ei__attn_setup(ctx, q, k, v, plan, out, q_offset, &J);
    if (n_threads == 1) return ei__attn_run(&J, 0, 1, workspace, workspace_bytes);
    if ((r = ei__attn_ws_size(ctx, q->n_heads, k->n_heads, q->head_dim, &per)) != EI_OK) return r;
    if (!workspace) return ei__fail(ctx, EI_ERR_NULL, "workspace is NULL (%d threads x %zu bytes needed)", n_threads, per);
    if (workspace_bytes / (size_t)n_threads < per)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %d threads x %zu needed", workspace_bytes, n_threads, per);
    return ei__fork_join(ctx, ei__attn_share, &J, n_threads, workspace, per);
}

/* ---- decode attention: few query tokens, split along the keys --------- */
/* A decode step has one query token (a few with speculative decoding): a
   split by kv head leaves threads idle when a layer has fewer kv heads than
   threads (Gemma 3 270M has one), and the cache is read once per step, so
   the work is split along the keys instead. Thread ith of nth attends, for
   every head, to the key slice [n ith / nth, n (ith + 1) / nth) (rounded to
   key tiles; n = q_offset + n_tokens) and writes the output before
   normalisation with its running max and sum: a partial, row h * n_tokens
   + token of its slot. The merge combines the nth partials of a row,
   out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s with M = max_s m_s
   (exact: the online softmax split in two), and runs after every slice is
   in (the engine's barrier between the two calls, or the join of
   ei_attention_decode_mt). The scalar reference splits the same way, one
   row at a time (ei__attn_row_scalar). */
#define EI__DECODE_PARTIAL_HEAD 2 /* floats before a partial's outputs: m, l */

static size_t ei__decode_partial_floats(int32_t d) { return (size_t)d + EI__DECODE_PARTIAL_HEAD; }

static ei_result ei__decode_partials_size(const ei_context *ctx, int64_t n_tokens, int32_t n_heads,
                                                  int32_t head_dim, int nth, size_t *bytes) {
    size_t rows, floats;
    ei_result r = ei__check_sizes(ctx, 1, n_heads, 1, head_dim, bytes);
    if (r != EI_OK) return r;
    if (n_tokens <= 0 || n_tokens > EI_DECODE_MAX_TOKENS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_tokens %lld not in 1..%d (a decode step; longer: ei_attention_prefill)",
                        (long long)n_tokens, EI_DECODE_MAX_TOKENS);
    if (nth <= 0 || nth > EI__ATTN_MAX_THREADS)
        return ei__fail(ctx, EI_ERR_SIZE, "nth %d not in 1..%d", nth, EI__ATTN_MAX_THREADS);
    if (!ei__mul_size((size_t)n_tokens * (size_t)n_heads, (size_t)nth, &rows) ||
        !ei__mul_size(rows, ei__decode_partial_floats(head_dim), &floats) || !ei__mul_size(floats, 4u, bytes))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "decode partials overflow size_t");
    return EI_OK;
}

/* Row (head h, token tok) of a slot of partials over nt tokens. */
static float *ei__decode_partial_row(float *slot, int32_t h, int64_t tok, int64_t nt, int32_t d) {
    return slot + ((size_t)h * (size_t)nt + (size_t)tok) * ei__decode_partial_floats(d);
}
/* A row whose slice held no key the row sees. */
static void ei__decode_partial_empty(float *dst, int32_t d) {
    dst[0] = -FLT_MAX;
    dst[1] = 0.0f;
    memset(dst + EI__DECODE_PARTIAL_HEAD, 0, (size_t)d * sizeof(float));
}
/* Decode attention, written once (vocabulary: >>simd). One key tile, the
   cache rows pos[0..nk) (nk <= EI__ATTN_NK) of kv head kvh, for the nr rows of
   one head group: row r = g * n_tokens + t is head h0 + g at token t; q
   holds them as f32 scaled by scale * log2(e), dpad apart (zero past d), st
   their partials (m, l, o[d]; ei__decode_partial_floats(d) apart), which
   the tile updates (online softmax). The rows pf_pos[0..pf_nk) of the
   group's next tile are prefetched (the walk visits every group's tile
   before it comes back, so they are in cache by then). Why not the prefill stages: their tile
   pads a row vector to 16 rows, so a one-token step of 4 heads computed 16
   rows for 4; here only real rows are computed, 4 at a time, so each key
   and value row read from memory serves 4 of them, and a score is one
   horizontal sum per 4 x d/EI__VN FMAs. NaN/Inf: the queries are finite
   (checked when packed), so a key row holding NaN or Inf makes its scores
   non-finite; such a tile is then checked with rows_finite, which tells a
   bad key (returns 0, w->bad set) from finite values whose product
   overflowed (clamped to +-FLT_MAX, as the prefill tile does). Defines
   ei__attn_decode_tile_<isa>. */
#define EI__DEFINE_DECODE_TILE()                                                                               \
    EI__VTARGET static int EI__VNAME(ei__attn_decode_tile)(const ei__attn_job *J, ei__attn_ws *w, int32_t kvh,  \
                                                           const float *q, int32_t nr, float *st,               \
                                                           const int64_t *pos, int32_t nk,                      \
                                                           const int64_t *pf_pos, int32_t pf_nk) {              \
        const int32_t d = J->d, dpad = J->dpad, nt = (int32_t)J->q->n_tokens;                                 \
        const int32_t nr4 = (nr + 3) & ~3, nkv = (int32_t)ei__round_up(nk, EI__VN);                            \
        const size_t P = ei__decode_partial_floats(d), kes = ei__dtype_size(J->k->dtype);                      \
        const size_t ves = ei__dtype_size(J->v->dtype);                                                        \
        const ei_dtype kdt = J->k->dtype, vdt = J->v->dtype;                                                   \
        float *sc = w->s; /* scores, then weights: row r at r * EI__ATTN_NK */                                 \
        int32_t r, r0, b, j, c;                                                                                \
        int64_t pmax;                                                                                          \
        EI__VMASK bad = EI__VNAN_NONE();                                                                       \
        int flag;                                                                                              \
        for (j = 0; j < nk; ++j) {                                                                             \
            w->kp[j] = ei__row(J->k, pos[j], kvh);                                                             \
            w->vp[j] = ei__row(J->v, pos[j], kvh);                                                             \
        }                                                                                                      \
        for (r0 = 0; r0 < nr; r0 += 4) { /* scores; rows past nr repeat the last one (not kept) */            \
            const float *q0 = q + (size_t)r0 * (size_t)dpad, *q1 = q + (size_t)EI__MIN(r0 + 1, nr - 1) * (size_t)dpad; \
            const float *q2 = q + (size_t)EI__MIN(r0 + 2, nr - 1) * (size_t)dpad;                              \
            const float *q3 = q + (size_t)EI__MIN(r0 + 3, nr - 1) * (size_t)dpad;                              \
            float *s0 = sc + (size_t)r0 * EI__ATTN_NK;                                                         \
            for (j = 0; j < nk; ++j) {                                                                         \
                const unsigned char *kr = (const unsigned char *)w->kp[j];                                     \
                EI__VEC a0 = EI__VZERO(), a1 = a0, a2 = a0, a3 = a0;                                           \
                if (r0 == 0 && j < pf_nk) { /* the group's next tile, spread over this one */                  \
                    ei__prefetch_bytes(ei__row(J->k, pf_pos[j], kvh), (size_t)d * kes, 0);                     \
                    ei__prefetch_bytes(ei__row(J->v, pf_pos[j], kvh), (size_t)d * ves, 0);                     \
                }                                                                                              \
                for (c = 0; c < d; c += EI__VN) {                                                              \
                    EI__VEC kv = EI__VLOAD_ROW(kr + (size_t)c * kes, kdt, EI__VFIRST(EI__MIN(d - c, (int32_t)EI__VN))); \
                    a0 = EI__VFMA(EI__VLOADU(q0 + c), kv, a0);                                                 \
                    a1 = EI__VFMA(EI__VLOADU(q1 + c), kv, a1);                                                 \
                    a2 = EI__VFMA(EI__VLOADU(q2 + c), kv, a2);                                                 \
                    a3 = EI__VFMA(EI__VLOADU(q3 + c), kv, a3);                                                 \
                }                                                                                              \
                s0[j] = EI__VHSUM(a0);                                                                         \
                s0[EI__ATTN_NK + j] = EI__VHSUM(a1);                                                           \
                s0[2 * EI__ATTN_NK + j] = EI__VHSUM(a2);                                                       \
                s0[3 * EI__ATTN_NK + j] = EI__VHSUM(a3);                                                       \
            }                                                                                                  \
        }                                                                                                      \
        for (j = 1, pmax = pos[0]; j < nk; ++j) pmax = EI__MAX(pmax, pos[j]);                                 \
        for (r = 0; r < nr4; ++r) { /* clamp, causal mask, pad to whole vectors; rows past nr weigh 0 */       \
            float *s = sc + (size_t)r * EI__ATTN_NK;                                                           \
            int64_t lim = J->q_offset + r % nt + 1; /* the row's token sees keys < lim */                     \
            for (j = 0; j < nkv; j += EI__VN) { /* x - x: NaN where x is NaN or +-Inf */                       \
                EI__VEC x = r >= nr ? EI__VZERO()                                                              \
                                    : EI__VLOAD_ROW(s + j, EI_F32, EI__VFIRST(EI__MIN(nk - j, (int32_t)EI__VN))); \
                bad = EI__VNAN_OR(bad, EI__VSUB(x, x));                                                        \
                EI__VSTOREU(s + j, EI__VMIN(EI__VMAX(x, EI__VSET1(-FLT_MAX)), EI__VSET1(FLT_MAX)));            \
            }                                                                                                  \
            if (r >= nr) continue;                                                                             \
            if (pmax >= lim) /* some key of the tile is past the row's token (a step of several tokens) */     \
                for (j = 0; j < nk; ++j) s[j] = pos[j] < lim ? s[j] : -INFINITY;                               \
            for (j = nk; j < nkv; ++j) s[j] = -INFINITY;                                                       \
        }                                                                                                      \
        flag = EI__VANY(bad);                                                                                  \
        if (flag && !J->ctx->kern->rows_finite(J->k, pos, nk, kvh)) return ei__attn_bad(w, "k", kvh, pos[0]);  \
        for (r = 0; r < nr; ++r) { /* online softmax of the row */                                             \
            float *s = sc + (size_t)r * EI__ATTN_NK, *pr = st + (size_t)r * P, mx;                             \
            EI__VEC sum = EI__VZERO(), vmx = EI__VSET1(pr[0]);                                                 \
            for (j = 0; j < nkv; j += EI__VN) vmx = EI__VMAX(vmx, EI__VLOADU(s + j)); /* padding: -inf */      \
            mx = EI__VHMAX(vmx);                                                                               \
            for (j = 0; j < nkv; j += EI__VN) {                                                                \
                EI__VEC e = EI__VNAME(ei__attn_exp2)(EI__VSUB(EI__VLOADU(s + j), EI__VSET1(mx)));              \
                EI__VSTOREU(s + j, e);                                                                         \
                sum = EI__VADD(sum, e);                                                                        \
            }                                                                                                  \
            w->alpha[r] = exp2f(pr[0] - mx);                                                                   \
            pr[1] = pr[1] * w->alpha[r] + EI__VHSUM(sum);                                                      \
            pr[0] = mx;                                                                                        \
        }                                                                                                      \
        for (r0 = 0; r0 < nr; r0 += 4) { /* o = o alpha + P V, one vector of dims at a time */                 \
            const int32_t nb = EI__MIN(4, nr - r0);                                                            \
            const float *p = sc + (size_t)r0 * EI__ATTN_NK;                                                    \
            float *o0 = st + (size_t)r0 * P + EI__DECODE_PARTIAL_HEAD;                                         \
            for (c = 0; c < d; c += EI__VN) {                                                                  \
                EI__VTAIL tail = EI__VFIRST(EI__MIN(d - c, (int32_t)EI__VN));                                  \
                EI__VEC a[4];                                                                                  \
                EI__VEC a0 = EI__VZERO(), a1 = a0, a2 = a0, a3 = a0;                                           \
                for (j = 0; j < nk; ++j) {                                                                     \
                    EI__VEC vv = EI__VLOAD_ROW((const unsigned char *)w->vp[j] + (size_t)c * ves, vdt, tail);  \
                    a0 = EI__VFMA(EI__VSET1(p[j]), vv, a0);                                                    \
                    a1 = EI__VFMA(EI__VSET1(p[EI__ATTN_NK + j]), vv, a1);                                      \
                    a2 = EI__VFMA(EI__VSET1(p[2 * EI__ATTN_NK + j]), vv, a2);                                  \
                    a3 = EI__VFMA(EI__VSET1(p[3 * EI__ATTN_NK + j]), vv, a3);                                  \
                }                                                                                              \
                a[0] = a0; a[1] = a1; a[2] = a2; a[3] = a3;                                                    \
                for (b = 0; b < nb; ++b) {                                                                     \
                    float *ob = o0 + (size_t)b * P + c;                                                        \
                    EI__VSTORE_ROW(ob, EI_F32, EI__VFMA(EI__VLOAD_ROW(ob, EI_F32, tail), EI__VSET1(w->alpha[r0 + b]), a[b]), tail); \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        return 1;                                                                                              \
    }

/* The keys a decode step attends to, one list per keep-set row: dense,
   rows 0 .. q_end - 1; with a keep set (ei_attention_decode_keep), its
   kept rows, then every row appended since it was made (keep->n_tokens ..
   q_end - 1). Every list has the same length, so thread ith of nth takes
   the same slice [L ith / nth, L (ith + 1) / nth) (rounded to key tiles)
   of every list. */
static int64_t ei__decode_n_keys(const ei__attn_job *J) {
    return J->keep ? (int64_t)J->keep->n_kept + (J->q_end - J->keep->n_tokens) : J->q_end;
}
/* The keep-set row of query head h (kv head h / G): a shared set, one per
   kv head or one per query head. */
static int32_t ei__decode_set(const ei__attn_job *J, int32_t h) {
    if (!J->keep || J->keep->heads_out == 1) return 0;
    return J->keep->heads_out == J->q->n_heads ? h : h / J->G;
}
/* Heads per group of the decode walk: a group shares its keys, so with one
   keep set per query head (and G > 1) every head is its own group. */
static int32_t ei__decode_group_heads(const ei__attn_job *J) {
    return J->keep && J->keep->heads_out == J->q->n_heads && J->G > 1 ? 1 : J->Gt;
}
/* Keys [lo, hi) of set `set`'s list as ei__attn_keys (kept rows: blocks of
   one row). */
static void ei__decode_keys(const ei__attn_job *J, int32_t set, int64_t lo, int64_t hi, ei__attn_keys *ks) {
    const ei_keep_set *keep = J->keep;
    int64_t nk;
    ks->blocks = NULL; ks->n_block_keys = 0; ks->bs = 1;
    if (!keep) { ks->run0 = lo; ks->run1 = hi; return; }
    nk = keep->n_kept;
    if (lo < nk) {
        ks->blocks = keep->index + (size_t)set * (size_t)keep->capacity + (size_t)lo;
        ks->n_block_keys = EI__MIN(hi, nk) - lo;
    }
    ks->run0 = keep->n_tokens + EI__MAX(lo - nk, (int64_t)0);
    ks->run1 = keep->n_tokens + EI__MAX(hi - nk, (int64_t)0);
}

/* The decode walk of a kernel table with a decode kernel: keys [lo, hi) of
   every group's list (group: heads of one kv head sharing their keys, at
   most Gt of them) into the partials of slot. The groups' query rows are
   packed and scaled once, as many groups at a time as the workspace's query
   buffer holds (all of them for a one-token step of up to Gt x Mt heads),
   and their tiles are walked tile by tile across those groups: with a
   token-major cache the 64-key tiles of all kv heads then lie together,
   and the walk reads the slice front to back once instead of once per kv
   head at its head stride. */
static int ei__attn_decode_slice_vec(const ei__attn_job *J, ei__attn_ws *w, int64_t lo, int64_t hi, float *slot) {
    const int32_t nt = (int32_t)J->q->n_tokens, d = J->d, dpad = J->dpad, Gg = ei__decode_group_heads(J);
    const int32_t n_hs = (J->G + Gg - 1) / Gg, n_groups = J->k->n_heads * n_hs;
    const size_t P = ei__decode_partial_floats(d);
    int32_t cap, Gt, Mt, dp, g0 = 0, g1, gi, h, t, i;
    ei__attn_geometry(J->G, d, &Gt, &Mt, &dp);
    cap = Gt * Mt; /* rows of w->qt (ei__attn_ws_layout) */
    for (; g0 < n_groups; g0 = g1) {
        int32_t hfirst = (g0 / n_hs) * J->G + (g0 % n_hs) * Gg, rows = 0;
        int64_t e0;
        for (g1 = g0; g1 < n_groups; ++g1) { /* the unit: groups g0 .. g1 - 1, whole heads hfirst .. */
            int32_t gt = EI__MIN(Gg, J->G - (g1 % n_hs) * Gg);
            if (rows + gt * nt > cap) break;
            rows += gt * nt;
        }
        for (gi = g0; gi < g1; ++gi) {
            int32_t h0 = (gi / n_hs) * J->G + (gi % n_hs) * Gg, gt = EI__MIN(Gg, J->G - (gi % n_hs) * Gg);
            if (!ei__attn_q_finite(J, w, h0, gt, J->q_offset, nt)) return 0;
            for (h = h0; h < h0 + gt; ++h)
                for (t = 0; t < nt; ++t) {
                    float *qr = w->qt + (size_t)((h - hfirst) * nt + t) * (size_t)dpad;
                    ei__attn_row_to_f32(ei__row(J->q, t, h), J->q->dtype, d, qr);
                    for (i = 0; i < d; ++i) qr[i] *= J->c;
                    for (; i < dpad; ++i) qr[i] = 0.0f;
                    ei__decode_partial_empty(ei__decode_partial_row(slot, h, t, nt, d), d);
                }
        }
        for (e0 = lo; e0 < hi; e0 += EI__ATTN_NK) {
            int32_t nk = (int32_t)EI__MIN((int64_t)EI__ATTN_NK, hi - e0);
            int32_t pf_nk = (int32_t)EI__MAX((int64_t)0, EI__MIN((int64_t)EI__ATTN_NK, hi - e0 - EI__ATTN_NK));
            for (gi = g0; gi < g1; ++gi) {
                int32_t h0 = (gi / n_hs) * J->G + (gi % n_hs) * Gg, gt = EI__MIN(Gg, J->G - (gi % n_hs) * Gg);
                ei__attn_keys ks;
                ei__decode_keys(J, ei__decode_set(J, h0), lo, hi, &ks);
                ei__attn_key_positions(&ks, e0 - lo, nk, w->kpos);
                ei__attn_key_positions(&ks, e0 - lo + nk, pf_nk, w->kpos_next);
                if (!J->ctx->kern->decode(J, w, gi / n_hs, w->qt + (size_t)((h0 - hfirst) * nt) * (size_t)dpad, gt * nt,
                                          slot + (size_t)h0 * (size_t)nt * P, w->kpos, nk, w->kpos_next, pf_nk))
                    return 0;
            }
        }
    }
    return 1;
}

/* Thread ith's key slice for every head, into slot ith of partials. */
static ei_result ei__attn_decode_run(const ei__attn_job *J, int ith, int nth, float *partials, void *workspace,
                                     size_t ws_bytes) {
    const int64_t n = ei__decode_n_keys(J), nt = J->q->n_tokens;
    int64_t lo = n * ith / nth / EI__ATTN_NK * EI__ATTN_NK;
    int64_t hi = ith == nth - 1 ? n : n * (ith + 1) / nth / EI__ATTN_NK * EI__ATTN_NK;
    int32_t kvh, h, tok;
    float *slot = ei__decode_partial_row(partials, (int32_t)ith * J->q->n_heads, 0, nt, J->d); /* slots follow each other */
    ei__attn_ws w;
    ei_result r;
    if ((r = ei__attn_ws_take(J, workspace, ws_bytes, &w)) != EI_OK) return r;
    if (lo < hi && J->ctx->kern->decode)
        return ei__attn_decode_slice_vec(J, &w, lo, hi, slot) ? EI_OK : ei__attn_bad_fail(J, &w);
    /* the scalar reference, one row at a time (an empty slice: every row empty) */
    for (kvh = 0; kvh < J->k->n_heads; ++kvh) {
        if (!ei__attn_q_finite(J, &w, kvh * J->G, J->G, J->q_offset, (int32_t)nt)) return ei__attn_bad_fail(J, &w);
        for (h = kvh * J->G; h < (kvh + 1) * J->G; ++h) {
            ei__attn_keys ks;
            ei__decode_keys(J, ei__decode_set(J, h), lo, hi, &ks);
            if (lo < hi && (h == kvh * J->G || ei__decode_set(J, h) != ei__decode_set(J, h - 1)) &&
                !ei__attn_keys_finite(J, &w, kvh, &ks))
                return ei__attn_bad_fail(J, &w);
            for (tok = 0; tok < nt; ++tok) {
                float *dst = ei__decode_partial_row(slot, h, tok, nt, J->d);
                ei__attn_keys row = ks;
                row.run1 = EI__MAX(row.run0, EI__MIN(row.run1, J->q_offset + tok + 1)); /* causal */
                if (lo >= hi || ei__attn_keys_total(&row) == 0) ei__decode_partial_empty(dst, J->d);
                else ei__attn_row_scalar(J, &w, kvh, h, J->q_offset + tok, &row, dst + EI__DECODE_PARTIAL_HEAD, &dst[0], &dst[1]);
            }
        }
    }
    return EI_OK;
}

/* Rows [rows ith / nth, rows (ith + 1) / nth) of out from the n_slots
   partials of each (plain C: the merge is d x n_slots flops a row). */
static void ei__attn_decode_merge_rows(const ei_out_tensor *out, const float *partials, int n_slots, int ith, int nth) {
    const int32_t d = out->head_dim;
    const int64_t nt = out->n_tokens, rows = nt * out->n_heads;
    const size_t P = ei__decode_partial_floats(d), slot_floats = (size_t)rows * P;
    int64_t r, r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    float wgt[EI__ATTN_MAX_THREADS];
    int s;
    for (r = r0; r < r1; ++r) {
        const float *p0 = partials + (size_t)r * P;
        float M = -FLT_MAX, L = 0.0f, inv;
        void *orow = ei__row_out(out, r % nt, (int32_t)(r / nt));
        int32_t i;
        for (s = 0; s < n_slots; ++s) M = EI__MAX(M, p0[(size_t)s * slot_floats]);
        for (s = 0; s < n_slots; ++s) {
            wgt[s] = exp2f(p0[(size_t)s * slot_floats] - M);
            L += wgt[s] * p0[(size_t)s * slot_floats + 1];
        }
        inv = 1.0f / L;
        for (i = 0; i < d; ++i) {
            float o = 0.0f;
            for (s = 0; s < n_slots; ++s) o += wgt[s] * p0[(size_t)s * slot_floats + EI__DECODE_PARTIAL_HEAD + (size_t)i];
            ei__store1(orow, out->dtype, i, o * inv);
        }
    }
}

/* The partials of nth threads: present, need bytes long, 4-byte aligned. */
static ei_result ei__check_partials(const ei_context *ctx, const float *partials, size_t bytes, size_t need, int nth) {
    if (!partials) return ei__fail(ctx, EI_ERR_NULL, "partials is NULL (%zu bytes needed)", need);
    if (bytes < need) return ei__fail(ctx, EI_ERR_WORKSPACE, "partials of %zu bytes, %zu needed for %d threads", bytes, need, nth);
    return ei__check_align4(ctx, partials, "partials");
}

/* Checks of a decode call: the attention checks, its token count, the
   partials' size and alignment, the keep set if any. */
static ei_result ei__attn_decode_check(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                                       const ei_keep_set *keep, const ei_out_tensor *out, int64_t q_offset, int nth,
                                       const void *workspace, int n_ws, const float *partials, size_t partials_bytes) {
    size_t need;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (!q) return ei__fail(ctx, EI_ERR_NULL, "q is NULL");
    if ((r = ei__decode_partials_size(ctx, q->n_tokens, q->n_heads, q->head_dim, nth, &need)) != EI_OK) return r;
    if (!ei__on_gpu(ctx)) {
        if ((r = ei__check_partials(ctx, partials, partials_bytes, need, nth)) != EI_OK) return r;
    } else if (keep)
        return ei__fail(ctx, EI_ERR_UNSUPPORTED, "decode attention through a keep set runs on the CPU backend "
                        "(compact the cache with ei_kv_compact and attend densely)");
    return ei__attn_check(ctx, q, k, v, NULL, keep, out, q_offset, workspace, n_ws, partials, partials ? need : 0);
}

static ei_result ei__attn_decode_part(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k, const ei_tensor *v,
                                         const ei_keep_set *keep, ei_out_tensor *out, int64_t q_offset, int ith, int nth,
                                         float *partials, size_t partials_bytes, void *workspace, size_t workspace_bytes) {
    ei__attn_job J;
    ei_result r;
    if ((r = ei__attn_check_split(ctx, ith, nth)) != EI_OK) return r;
    if ((r = ei__attn_decode_check(ctx, q, k, v, keep, out, q_offset, nth, workspace, 1, partials, partials_bytes)) != EI_OK)
        return r;
    if (ei__on_gpu(ctx)) /* one launch: the call with ith 0 writes out, the merge has nothing to do */
        return ith == 0 ? EI__CUDA(ctx, attention, &ctx->cfg, q, k, v, NULL, out, q_offset, workspace, workspace_bytes)
                        : EI_OK;
    ei__attn_setup(ctx, q, k, v, NULL, out, q_offset, &J);
    J.keep = keep;
    return ei__attn_decode_run(&J, ith, nth, partials, workspace, workspace_bytes);
}

static ei_result ei__attn_decode_merge(const ei_context *ctx, ei_out_tensor *out, const float *partials,
                                          size_t partials_bytes, int ith, int nth) {
    ei__regions g;
    size_t need;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if ((r = ei__attn_check_split(ctx, ith, nth)) != EI_OK) return r;
    if ((r = ei__check_out_tensor(ctx, out, "out")) != EI_OK) return r;
    if (ei__on_gpu(ctx)) return EI_OK;
    if ((r = ei__decode_partials_size(ctx, out->n_tokens, out->n_heads, out->head_dim, nth, &need)) != EI_OK)
        return r;
    if ((r = ei__check_partials(ctx, partials, partials_bytes, need, nth)) != EI_OK) return r;
    g.n = 0;
    ei__reg_out_view(&g, out, "out", "the ei_out_tensor out");
    ei__reg_mem(&g, partials, need, "partials", 0);
    if ((r = ei__check_regions(ctx, &g)) != EI_OK) return r;
    ei__attn_decode_merge_rows(out, partials, nth, ith, nth);
    return EI_OK;
}

/* ei_attention_decode_mt's workspace: the partials (64-byte aligned inside
   it), then n_threads attention workspaces. */
static ei_result ei__attn_decode_mt_sizes(const ei_context *ctx, int64_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                          int32_t head_dim, int n_threads, size_t *partials, size_t *per, size_t *bytes) {
    size_t ws;
    ei_result r;
    if ((r = ei__decode_partials_size(ctx, n_tokens, n_heads, head_dim, n_threads, partials)) != EI_OK ||
        (r = ei__attn_ws_size(ctx, n_heads, n_kv_heads, head_dim, per)) != EI_OK)
        return r;
    if (!ei__mul_size(*per, (size_t)n_threads, &ws) || !ei__add_size(ws, *partials + EI__ALIGN, bytes))
        return ei__fail(ctx, EI_ERR_OVERFLOW, "decode workspace overflows size_t");
    return EI_OK;
}

typedef struct ei__decode_mt_arg { const ei__attn_job *J; float *partials; } ei__decode_mt_arg;
static ei_result ei__attn_decode_share(void *arg, int ith, int nth, void *ws, size_t ws_bytes) {
    const ei__decode_mt_arg *a = (const ei__decode_mt_arg *)arg;
    return ei__attn_decode_run(a->J, ith, nth, a->partials, ws, ws_bytes);
}

/* Built-in pthread helper: both phases, the merge on the calling thread. */
static ei_result ei__attn_decode_mt(const ei_context *ctx, const ei_tensor *q, const ei_tensor *k,
                                            const ei_tensor *v, const ei_keep_set *keep, ei_out_tensor *out,
                                            int64_t q_offset, int n_threads, void *workspace, size_t workspace_bytes) {
    ei__attn_job J;
    ei__decode_mt_arg a;
    size_t pbytes = 0, per = 0, need = 0;
    unsigned char *ws = (unsigned char *)workspace;
    ei_result r;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (!q) return ei__fail(ctx, EI_ERR_NULL, "q is NULL");
    if (n_threads <= 0 || n_threads > EI__ATTN_MAX_THREADS)
        return ei__fail(ctx, EI_ERR_SIZE, "n_threads %d not in 1..%d", n_threads, EI__ATTN_MAX_THREADS);
    if (ei__on_gpu(ctx))
        return ei__attn_decode_part(ctx, q, k, v, keep, out, q_offset, 0, 1, NULL, 0, workspace, workspace_bytes);
    if ((r = ei__attn_decode_mt_sizes(ctx, q->n_tokens, q->n_heads, k ? k->n_heads : 1, q->head_dim, n_threads, &pbytes,
                                      &per, &need)) != EI_OK)
        return r;
    if (!workspace) return ei__fail(ctx, EI_ERR_NULL, "workspace is NULL (%zu bytes needed)", need);
    if (workspace_bytes < need) return ei__fail(ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes, %zu needed", workspace_bytes, need);
    a.partials = (float *)(void *)(ws + ((EI__ALIGN - (uintptr_t)ws % EI__ALIGN) % EI__ALIGN));
    ws = (unsigned char *)a.partials + pbytes;
    if ((r = ei__attn_decode_check(ctx, q, k, v, keep, out, q_offset, n_threads, ws, n_threads, a.partials, pbytes)) != EI_OK)
        return r;
    ei__attn_setup(ctx, q, k, v, NULL, out, q_offset, &J);
    J.keep = keep;
    a.J = &J;
    if ((r = ei__fork_join(ctx, ei__attn_decode_share, &a, n_threads, ws, per)) != EI_OK) return r;
    ei__attn_decode_merge_rows(out, a.partials, n_threads, 0, 1);
    return EI_OK;
}

/* The block mass of sampled rows (EI_RANK_SAMPLED), written once; defines
   ei__sample_mass_<isa>, and ei__sample_mass_by_<isa>, its walk with the
   tile scores as a parameter (the avx512-bf16 path's vdpbf16ps scores,
   ei__sample_scores_dpbf16). qt [d][EI__SAMPLE_ROWS]: row r of the batch in
   column r (columns from nr on zero), tokens tok[0..nr) ascending. For each
   row, scale * q.k_j over keys j = 0..tok[r] of kv head kvh (in log2 units:
   the scale carries log2 e), softmaxed; the weights of block b < nvis
   (block_size bs) are summed and added to mass[b], rows in row order (so a
   segment's mass does not depend on how its rows are batched). Keys go by
   tiles of ei__sample_tile_keys (whole blocks): a tile's scores stay in L1,
   its max, its exp sum and its blocks' exp sums (relative to the tile max)
   are kept, and the blocks are rescaled once the row's max and sum are
   known: one pass over the scores. lg: the layout of ei__sample_lg_floats;
   kbuf: a tile of key rows as f32, stride d rounded up to 16. krow (NULL:
   key j is row j) gathers key j from row krow[j] (decode scoring of caches
   whose rows are not in position order, with bs = 1: mass[j] is key j's
   summed weight). The scalar reference, with expf and every score stored,
   is ei__sample_mass_scalar (>>isa-scalar).
   ei__sample_scores_<isa>: one tile's scores, keys j0 .. j0+nk, rows in
   lanes: a key's score for all rows is a broadcast-FMA walk over d, 8 keys
   at a time, in f32 (each key row widened into kbuf first); the tile's
   scores go to tl [nk][EI__SAMPLE_ROWS], times sc. Returns 1 if a score is
   NaN or +-inf. */
typedef int (*ei__sample_scores_fn)(const void *qx, const ei_tensor *k, int32_t kvh, const int32_t *krow, int64_t j0,
                                    int64_t nk, float *kbuf, float sc, float *tl);
#define EI__DEFINE_SAMPLE_MASS()                                                                               \
    EI__VTARGET static int EI__VNAME(ei__sample_scores)(const void *qx, const ei_tensor *k, int32_t kvh,        \
                                                        const int32_t *krow, int64_t j0, int64_t nk, float *kbuf, \
                                                        float scf, float *tl) {                                \
        enum { R = EI__SAMPLE_ROWS, RV = EI__SAMPLE_ROWS / EI__VN, PV = EI__VN == 16 ? 2 : 1 }; /* PV: row vectors per pass */ \
        const float *qt = (const float *)qx;                                                                   \
        const int32_t d = k->head_dim, dp = (int32_t)ei__round_up(d, 16);                                      \
        const EI__VEC sc = EI__VSET1(scf);                                                                     \
        EI__VMASK nan = EI__VNAN_NONE();                                                                       \
        int64_t j;                                                                                             \
        int32_t i, u, v, r;                                                                                    \
        for (j = 0; j < nk; ++j)                                                                               \
            EI__VNAME(ei__attn_row_f32)(ei__row(k, krow ? krow[j0 + j] : j0 + j, kvh), k->dtype, d, dp,       \
                                        kbuf + (size_t)j * (size_t)dp);                                        \
        for (j = 0; j < nk; j += 8) /* 8 keys x PV row vectors at a time, accumulators in registers */      \
            for (v = 0; v < RV; v += PV) {                                                                     \
                const float *q0 = qt + (size_t)(v * EI__VN), *q1 = q0 + (PV > 1 ? EI__VN : 0);                 \
                const float *k0 = kbuf + (size_t)EI__MIN(j + 0, nk - 1) * (size_t)dp,                          \
                            *k1 = kbuf + (size_t)EI__MIN(j + 1, nk - 1) * (size_t)dp,                          \
                            *k2 = kbuf + (size_t)EI__MIN(j + 2, nk - 1) * (size_t)dp,                          \
                            *k3 = kbuf + (size_t)EI__MIN(j + 3, nk - 1) * (size_t)dp,                          \
                            *k4 = kbuf + (size_t)EI__MIN(j + 4, nk - 1) * (size_t)dp,                          \
                            *k5 = kbuf + (size_t)EI__MIN(j + 5, nk - 1) * (size_t)dp,                          \
                            *k6 = kbuf + (size_t)EI__MIN(j + 6, nk - 1) * (size_t)dp,                          \
                            *k7 = kbuf + (size_t)EI__MIN(j + 7, nk - 1) * (size_t)dp;                          \
                EI__VEC a0 = EI__VZERO(), a1 = EI__VZERO(), a2 = EI__VZERO(), a3 = EI__VZERO();                \
                EI__VEC a4 = EI__VZERO(), a5 = EI__VZERO(), a6 = EI__VZERO(), a7 = EI__VZERO();                \
                EI__VEC b0 = EI__VZERO(), b1 = EI__VZERO(), b2 = EI__VZERO(), b3 = EI__VZERO();                \
                EI__VEC b4 = EI__VZERO(), b5 = EI__VZERO(), b6 = EI__VZERO(), b7 = EI__VZERO();                \
                EI__VEC acc[2][8];                                                                             \
                for (i = 0; i < d; ++i) {                                                                      \
                    EI__VEC qa = EI__VLOAD(q0 + (size_t)i * R), kb;                                            \
                    EI__VEC qb = PV > 1 ? EI__VLOAD(q1 + (size_t)i * R) : qa;                                  \
                    kb = EI__VSET1(k0[i]); a0 = EI__VFMA(qa, kb, a0); if (PV > 1) b0 = EI__VFMA(qb, kb, b0);   \
                    kb = EI__VSET1(k1[i]); a1 = EI__VFMA(qa, kb, a1); if (PV > 1) b1 = EI__VFMA(qb, kb, b1);   \
                    kb = EI__VSET1(k2[i]); a2 = EI__VFMA(qa, kb, a2); if (PV > 1) b2 = EI__VFMA(qb, kb, b2);   \
                    kb = EI__VSET1(k3[i]); a3 = EI__VFMA(qa, kb, a3); if (PV > 1) b3 = EI__VFMA(qb, kb, b3);   \
                    kb = EI__VSET1(k4[i]); a4 = EI__VFMA(qa, kb, a4); if (PV > 1) b4 = EI__VFMA(qb, kb, b4);   \
                    kb = EI__VSET1(k5[i]); a5 = EI__VFMA(qa, kb, a5); if (PV > 1) b5 = EI__VFMA(qb, kb, b5);   \
                    kb = EI__VSET1(k6[i]); a6 = EI__VFMA(qa, kb, a6); if (PV > 1) b6 = EI__VFMA(qb, kb, b6);   \
                    kb = EI__VSET1(k7[i]); a7 = EI__VFMA(qa, kb, a7); if (PV > 1) b7 = EI__VFMA(qb, kb, b7);   \
                }                                                                                              \
                acc[0][0] = a0; acc[0][1] = a1; acc[0][2] = a2; acc[0][3] = a3;                                \
                acc[0][4] = a4; acc[0][5] = a5; acc[0][6] = a6; acc[0][7] = a7;                                \
                acc[1][0] = b0; acc[1][1] = b1; acc[1][2] = b2; acc[1][3] = b3;                                \
                acc[1][4] = b4; acc[1][5] = b5; acc[1][6] = b6; acc[1][7] = b7;                                \
                for (u = 0; u < 8 && j + u < nk; ++u)                                                          \
                    for (r = 0; r < PV; ++r) {                                                                 \
                        EI__VEC x = EI__VMUL(acc[r][u], sc);                                                   \
                        nan = EI__VNAN_OR(nan, EI__VSUB(x, x)); /* NaN for NaN and +-inf */                    \
                        EI__VSTORE(tl + (size_t)(j + u) * R + (size_t)((v + r) * EI__VN), x);                  \
                    }                                                                                          \
            }                                                                                                  \
        return EI__VANY(nan);                                                                                  \
    }                                                                                                          \
    EI__MAYBE_UNUSED EI__VTARGET static int EI__VNAME(ei__sample_mass_by)(ei__sample_scores_fn scores, const void *qx,          \
                                                         const int64_t *tok, int32_t nr, const ei_tensor *k,    \
                                                         int32_t kvh, float scale, int32_t bs, int64_t nvis,    \
                                                         float *lg, float *kbuf, float *mass,                   \
                                                         const int32_t *krow) {                                 \
        enum { R = EI__SAMPLE_ROWS, RV = EI__SAMPLE_ROWS / EI__VN };                                           \
        const int32_t tk = ei__sample_tile_keys(bs);                                                           \
        const int64_t last = tok[nr - 1], ntiles = last / tk + 1;                                              \
        float *tl = lg, *bsum = tl + (size_t)tk * R, *tm = bsum + (size_t)nvis * R, *tz = tm + (size_t)ntiles * R; \
        float inv[EI__SAMPLE_ROWS], part[EI__SAMPLE_ROWS], m[EI__SAMPLE_ROWS];                                 \
        int64_t j0, j, b, t;                                                                                   \
        int32_t v, r;                                                                                          \
        int bad = 0;                                                                                           \
        for (t = 0, j0 = 0; j0 <= last; ++t, j0 += tk) {                                                       \
            int64_t nk = EI__MIN((int64_t)tk, last + 1 - j0);                                                  \
            bad |= scores(qx, k, kvh, krow, j0, nk, kbuf, scale * 1.44269504088896341f, tl);                   \
            for (j = EI__MAX(tok[0] + 1 - j0, (int64_t)0); j < nk; ++j) /* causal: row r sees keys up to tok[r] */ \
                for (r = 0; r < nr; ++r)                                                                       \
                    if (tok[r] < j0 + j) tl[(size_t)j * R + (size_t)r] = -INFINITY;                            \
            for (v = 0; v < RV; ++v) { /* the tile's max and exp sum; its blocks' exp sums */                \
                EI__VEC mx = EI__VSET1(-FLT_MAX), z = EI__VZERO(), bsv = EI__VZERO();                          \
                for (j = 0; j < nk; ++j) mx = EI__VMAX(mx, EI__VLOAD(tl + (size_t)j * R + (size_t)(v * EI__VN))); \
                for (j = 0; j < nk; ++j) {                                                                     \
                    EI__VEC e = EI__VNAME(ei__attn_exp2)(EI__VSUB(EI__VLOAD(tl + (size_t)j * R + (size_t)(v * EI__VN)), mx)); \
                    z = EI__VADD(z, e);                                                                        \
                    bsv = EI__VADD(bsv, e);                                                                    \
                    if ((j + 1) % bs == 0) {                                                                   \
                        b = (j0 + j) / bs;                                                                     \
                        if (b < nvis) EI__VSTORE(bsum + (size_t)b * R + (size_t)(v * EI__VN), bsv);            \
                        bsv = EI__VZERO();                                                                     \
                    }                                                                                          \
                }                                                                                              \
                EI__VSTORE(tm + (size_t)t * R + (size_t)(v * EI__VN), mx);                                     \
                EI__VSTORE(tz + (size_t)t * R + (size_t)(v * EI__VN), z);                                      \
            }                                                                                                  \
        }                                                                                                      \
        if (bad) return 0;                                                                                     \
        for (r = 0; r < R; ++r) { /* each row's max and sum over its tiles */                                 \
            double zr = 0.0;                                                                                   \
            m[r] = -FLT_MAX;                                                                                   \
            for (t = 0; t < ntiles; ++t) m[r] = tm[(size_t)t * R + (size_t)r] > m[r] ? tm[(size_t)t * R + (size_t)r] : m[r]; \
            if (r < nr && !(m[r] - m[r] == 0.0f)) return 0; /* +inf: the scores overflow */                    \
            for (t = 0; t < ntiles; ++t) zr += (double)tz[(size_t)t * R + (size_t)r] * exp2((double)(tm[(size_t)t * R + (size_t)r] - m[r])); \
            inv[r] = r < nr && zr > 0.0 ? (float)(1.0 / zr) : 0.0f;                                           \
        }                                                                                                      \
        for (b = 0; b < nvis; ++b) {                                                                           \
            t = b * bs / tk;                                                                                   \
            if (b == 0 || (b * bs) % tk == 0) /* a new tile: its rows' scale */                                \
                for (r = 0; r < nr; ++r) part[r] = (float)exp2((double)(tm[(size_t)t * R + (size_t)r] - m[r])) * inv[r]; \
            for (r = 0; r < nr; ++r) mass[b] += bsum[(size_t)b * R + (size_t)r] * part[r];                     \
        }                                                                                                      \
        return 1;                                                                                              \
    }                                                                                                          \
    EI__VTARGET static int EI__VNAME(ei__sample_mass)(const float *qt, const int64_t *tok, int32_t nr,          \
                                                      const ei_tensor *k, int32_t kvh, float scale, int32_t bs, \
                                                      int64_t nvis, float *lg, float *kbuf, float *mass,        \
                                                      const int32_t *krow) {                                    \
        return EI__VNAME(ei__sample_mass_by)(EI__VNAME(ei__sample_scores), qt, tok, nr, k, kvh, scale, bs, nvis, \
                                             lg, kbuf, mass, krow);                                             \
    }

/* EI_RANK_ANTIDIAGONAL, written once: the weights of a group of query tiles
   (>>profile, ei__antidiag_mass; the plain reference is ei__antidiag_row).
   Defines ei__antidiag_group_<isa>. Lane t of the group's 32 lanes
   (EI__SAMPLE_ROWS, EI__SAMPLE_ROWS / EI__VN vectors) is tile t of the
   group. qt [bs][d][32]: phase p's rows (row bs-1-p of each tile)
   transposed, zero in lanes without a row; u[p 32 + t] that row's token
   (-1: none). Phase p's keys are idx = 0..ns bs - 1 (every
   key of the sink blocks) and then idx = ns bs + m - ns for the keys m bs + p,
   m >= ns, up to the phase's last token; lg[(p ld + idx) 32 + t] receives
   the row's normalised weight on key idx (a strided key weighs bs; 0 past
   the row's token). The 8 keys of a step are converted to f32 into kbuf (8 x
   d rounded up to 16) once: keys of one phase, 8 blocks apart, so a group
   reads each key once (R = 64 tiles: two reads of K per segment, as 64
   sampled rows) and each 8 x bs keys close together. Rows sit in lanes: a
   key's score for all the group's rows of its phase is a broadcast-FMA walk
   over d. Returns 0 if a score is not finite. */
#define EI__DEFINE_ANTIDIAG_GROUP()                                                                            \
    EI__VTARGET static int EI__VNAME(ei__antidiag_group)(const float *qt, const int64_t *u, const ei_tensor *k,   \
                                                         int32_t kvh, float scale, int32_t bs, int64_t ns,     \
                                                         int64_t ld, float *lg, float *kbuf) {                 \
        const int32_t d = k->head_dim, dp = (int32_t)ei__round_up(d, 16);                                      \
        const EI__VEC sc = EI__VSET1(scale * 1.44269504088896341f);                                           \
        enum { L = EI__SAMPLE_ROWS, RV = EI__SAMPLE_ROWS / EI__VN };                                           \
        EI__VMASK nan = EI__VNAN_NONE();                                                                       \
        EI__VEC mx[64][RV];                                                                                    \
        float zl[L];                                                                                           \
        int64_t umin[64], nidx[64], idx, most = 0, j;                                                          \
        int32_t p, t, e, i, v;                                                                                 \
        for (p = 0; p < bs; ++p) { /* each phase's keys: up to its last row's token */                        \
            int64_t umax = -1;                                                                                 \
            umin[p] = INT64_MAX;                                                                               \
            for (t = 0; t < L; ++t)                                                                            \
                if (u[p * L + t] >= 0) {                                                                       \
                    umax = EI__MAX(umax, u[p * L + t]);                                                        \
                    umin[p] = EI__MIN(umin[p], u[p * L + t]);                                                  \
                }                                                                                              \
            nidx[p] = umax < 0 ? 0 : ns * bs + (umax >= ns * bs + p ? (umax - p) / bs - ns + 1 : 0);           \
            most = EI__MAX(most, nidx[p]);                                                                     \
            for (v = 0; v < RV; ++v) mx[p][v] = EI__VSET1(-FLT_MAX);                                           \
        }                                                                                                      \
        for (idx = 0; idx < most; idx += 8) /* 8 keys of each phase: past the sink, 8 x bs keys in a row */  \
            for (p = 0; p < bs; ++p) {                                                                         \
                float *lp = lg + (size_t)p * (size_t)ld * L;                                                   \
                const int32_t nk = (int32_t)EI__MIN((int64_t)8, nidx[p] - idx);                                \
                const float *k0 = kbuf, *k1 = kbuf + (size_t)dp, *k2 = kbuf + 2u * (size_t)dp,                 \
                            *k3 = kbuf + 3u * (size_t)dp, *k4 = kbuf + 4u * (size_t)dp,                        \
                            *k5 = kbuf + 5u * (size_t)dp, *k6 = kbuf + 6u * (size_t)dp,                        \
                            *k7 = kbuf + 7u * (size_t)dp;                                                      \
                if (nk <= 0) continue;                                                                         \
                for (e = 0; e < 8; ++e) { /* short steps repeat their last key */                             \
                    int64_t ii = idx + EI__MIN(e, nk - 1);                                                     \
                    j = ii < ns * bs ? ii : (ns + ii - ns * bs) * bs + p;                                      \
                    EI__VNAME(ei__attn_row_f32)(ei__row(k, j, kvh), k->dtype, d, dp, kbuf + (size_t)e * (size_t)dp); \
                }                                                                                              \
                for (v = 0; v < RV; ++v) { /* the keys stay in L1 over the row vectors */                      \
                    const float *qp = qt + (size_t)p * (size_t)d * L + (size_t)v * EI__VN;                     \
                    EI__VEC a0 = EI__VZERO(), a1 = EI__VZERO(), a2 = EI__VZERO(), a3 = EI__VZERO();            \
                    EI__VEC a4 = EI__VZERO(), a5 = EI__VZERO(), a6 = EI__VZERO(), a7 = EI__VZERO(), acc[8];    \
                    for (i = 0; i < d; ++i) {                                                                  \
                        EI__VEC qa = EI__VLOAD(qp + (size_t)i * L);                                            \
                        a0 = EI__VFMA(qa, EI__VSET1(k0[i]), a0); a1 = EI__VFMA(qa, EI__VSET1(k1[i]), a1);      \
                        a2 = EI__VFMA(qa, EI__VSET1(k2[i]), a2); a3 = EI__VFMA(qa, EI__VSET1(k3[i]), a3);      \
                        a4 = EI__VFMA(qa, EI__VSET1(k4[i]), a4); a5 = EI__VFMA(qa, EI__VSET1(k5[i]), a5);      \
                        a6 = EI__VFMA(qa, EI__VSET1(k6[i]), a6); a7 = EI__VFMA(qa, EI__VSET1(k7[i]), a7);      \
                    }                                                                                          \
                    acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3;                                        \
                    acc[4] = a4; acc[5] = a5; acc[6] = a6; acc[7] = a7;                                        \
                    for (e = 0; e < nk; ++e) {                                                                 \
                        EI__VEC x = EI__VMUL(acc[e], sc);                                                      \
                        float *o = lp + (size_t)(idx + e) * L + (size_t)v * EI__VN;                            \
                        nan = EI__VNAN_OR(nan, EI__VSUB(x, x)); /* NaN for NaN and +-inf */                    \
                        EI__VSTORE(o, x);                                                                      \
                        j = idx + e < ns * bs ? idx + e : (ns + idx + e - ns * bs) * bs + p;                   \
                        if (j > umin[p]) /* causal: a lane sees keys up to its row's token */                 \
                            for (t = 0; t < EI__VN; ++t)                                                       \
                                if (u[p * L + v * EI__VN + t] < j) o[t] = -INFINITY;                           \
                        mx[p][v] = EI__VMAX(mx[p][v], EI__VLOAD(o));                                           \
                    }                                                                                          \
                }                                                                                              \
            }                                                                                                  \
        for (p = 0; p < bs; ++p) { /* weights: a strided key stands for its block's bs keys */                \
            float *lp = lg + (size_t)p * (size_t)ld * L;                                                       \
            for (v = 0; v < RV; ++v) {                                                                         \
                EI__VEC z = EI__VZERO();                                                                       \
                for (idx = 0; idx < nidx[p]; ++idx) {                                                          \
                    float *o = lp + (size_t)idx * L + (size_t)v * EI__VN;                                      \
                    EI__VEC w = EI__VNAME(ei__attn_exp2)(EI__VSUB(EI__VLOAD(o), mx[p][v]));                    \
                    if (idx >= ns * bs) w = EI__VMUL(w, EI__VSET1((float)bs));                                 \
                    EI__VSTORE(o, w);                                                                          \
                    z = EI__VADD(z, w);                                                                        \
                }                                                                                              \
                EI__VSTOREU(zl + v * EI__VN, z);                                                               \
            }                                                                                                  \
            for (t = 0; t < L; ++t) zl[t] = zl[t] > 0.0f ? (float)(1.0 / (double)zl[t]) : 0.0f;                \
            for (idx = 0; idx < nidx[p]; ++idx)                                                                \
                for (v = 0; v < RV; ++v) {                                                                     \
                    float *o = lp + (size_t)idx * L + (size_t)v * EI__VN;                                      \
                    EI__VSTORE(o, EI__VMUL(EI__VLOAD(o), EI__VLOADU(zl + v * EI__VN)));                        \
                }                                                                                              \
        }                                                                                                      \
        return !EI__VANY(nan);                                                                                 \
    }

// >>mask: the plan as an attention mask (ei_plan_mask) -----------------------
/* An engine's own attention kernel runs the plan through this mask. The
   rule is attention's (ei__attn_walk: kept blocks, then the segment's own
   keys up to the query; dense segments see every earlier key), written
   out per key; the CUDA plugin applies the same rule (mask_kernel). */
static const ei__axes ei__mask_axes = {"n_rows", "n_keys", "row", "keys", EI_MAX_TOKENS};
static ei_result ei__check_mask(const ei_context *ctx, const ei_mask *m, const char *name) {
    if (!m) return ei__fail(ctx, EI_ERR_NULL, "%s is NULL", name);
    return ei__check_view_axes(ctx, m->data, m->dtype, m->n_rows, m->n_heads, m->n_keys, m->row_stride, m->head_stride,
                               name, &ei__mask_axes);
}
/* A checked mask as a view (rows as tokens, keys as the contiguous axis),
   for the overlap checks. */
static ei_tensor ei__mask_view(const ei_mask *m) {
    ei_tensor v;
    v.data = m->data; v.dtype = m->dtype; v.n_heads = m->n_heads; v.head_dim = (int32_t)m->n_keys;
    v.n_tokens = m->n_rows; v.token_stride = m->row_stride; v.head_stride = m->head_stride;
    return v;
}
static void ei__reg_mask(ei__regions *g, const ei_mask *m, const char *name, const char *struct_name, int written) {
    int i = g->n;
    ei_tensor v = ei__mask_view(m);
    ei__reg_mem(g, m->data, ei__view_bytes(&v), name, written);
    if (g->n > i) { g->views[i] = v; g->r[i].view = &g->views[i]; }
    ei__reg_mem(g, m, sizeof *m, struct_name, 0);
}
static ei_result ei__plan_mask_check(const ei_context *ctx, const ei_plan *plan, int64_t q_offset, const ei_mask *base,
                                     const ei_mask *out) {
    ei__regions g;
    ei_result r;
    int64_t need;
    if ((r = ei__check_mask(ctx, out, "out")) != EI_OK) return r;
    if (base && (r = ei__check_mask(ctx, base, "base")) != EI_OK) return r;
    if (q_offset < 0 || q_offset > EI_MAX_TOKENS - out->n_rows)
        return ei__fail(ctx, EI_ERR_SIZE, "q_offset %lld not in 0..%lld for %lld rows", (long long)q_offset,
                        (long long)(EI_MAX_TOKENS - out->n_rows), (long long)out->n_rows);
    need = q_offset + out->n_rows;
    if (base && (base->n_rows != out->n_rows || base->n_keys != out->n_keys ||
                 (base->n_heads != 1 && base->n_heads != out->n_heads)))
        return ei__fail(ctx, EI_ERR_SHAPE, "base is %lld rows x %d heads x %lld keys, out %lld x %d x %lld (base: out's "
                        "rows and keys, 1 head or out's)", (long long)base->n_rows, (int)base->n_heads,
                        (long long)base->n_keys, (long long)out->n_rows, (int)out->n_heads, (long long)out->n_keys);
    if (plan) {
        if ((r = ei__check_plan(ctx, plan)) != EI_OK) return r;
        if (plan->segment_size != ctx->cfg.segment_size || plan->block_size != ctx->cfg.block_size)
            return ei__fail(ctx, EI_ERR_SHAPE, "plan was laid out for segment %d / block %d, context has %d / %d",
                            (int)plan->segment_size, (int)plan->block_size, (int)ctx->cfg.segment_size, (int)ctx->cfg.block_size);
        if (out->n_heads != 1 && out->n_heads % plan->n_kv_heads != 0)
            return ei__fail(ctx, EI_ERR_SHAPE, "out has %d mask heads: 1, the plan's %d kv heads or a multiple of them",
                            (int)out->n_heads, (int)plan->n_kv_heads);
        if (plan->n_tokens < need)
            return ei__fail(ctx, EI_ERR_STATE, "plan covers %lld tokens, the rows reach %lld: profile them first",
                            (long long)plan->n_tokens, (long long)need);
    }
    g.n = 0;
    ei__reg_mask(&g, out, "out", "the ei_mask struct out", 1);
    if (base) ei__reg_mask(&g, base, "base", "the ei_mask struct base", 0);
    if (plan) ei__reg_plan(&g, plan, 0);
    if ((r = ei__check_regions(ctx, &g)) != EI_OK) return r;
    return plan ? ei__check_plan_rows(ctx, plan, q_offset, need) : EI_OK;
}

/* Keys [j0, j1) of row i of mask head h: -inf, or base's values (0 without
   a base). Typed stores: the row loops are memset-like. */
static void ei__mask_put(const ei_mask *out, const ei_mask *base, int32_t h, int64_t i, int64_t j0, int64_t j1,
                         int visible) {
    size_t es = ei__dtype_size(out->dtype), n = (size_t)(j1 - j0);
    char *o = (char *)out->data + (size_t)(i * out->row_stride + (int64_t)h * out->head_stride + j0) * es;
    size_t e;
    if (j1 <= j0) return;
    if (!visible) {
        if (out->dtype == EI_F32) {
            float *f = (float *)o;
            for (e = 0; e < n; ++e) f[e] = -INFINITY;
        } else {
            uint16_t *u = (uint16_t *)o, ninf = out->dtype == EI_F16 ? (uint16_t)0xFC00u : (uint16_t)0xFF80u;
            for (e = 0; e < n; ++e) u[e] = ninf;
        }
    } else if (!base) {
        memset(o, 0, n * es); /* +0 in all three types */
    } else {
        const char *b = (const char *)base->data +
                        (size_t)(i * base->row_stride + (int64_t)(base->n_heads == 1 ? 0 : h) * base->head_stride + j0) *
                            ei__dtype_size(base->dtype);
        if (base->dtype == out->dtype) memcpy(o, b, n * es);
        else
            for (e = 0; e < n; ++e) ei__store1(o, out->dtype, (int64_t)e, ei__load1(b, base->dtype, (int64_t)e));
    }
}

EIDEF ei_result ei_plan_mask(const ei_context *ctx, const ei_plan *plan, int64_t q_offset, const ei_mask *base,
                             ei_mask *out) {
    ei_result r;
    int64_t i, seg, bs;
    int32_t h, G;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if ((r = ei__plan_mask_check(ctx, plan, q_offset, base, out)) != EI_OK) return r;
    if (ei__on_gpu(ctx)) return EI__CUDA(ctx, plan_mask, &ctx->cfg, plan, q_offset, base, out);
    seg = ctx->cfg.segment_size;
    bs = ctx->cfg.block_size;
    G = plan && out->n_heads > 1 ? out->n_heads / plan->n_kv_heads : 1;
    for (h = 0; h < out->n_heads; ++h)
        for (i = 0; i < out->n_rows; ++i) {
            int64_t t = q_offset + i, S0 = t / seg * seg, end = EI__MIN(t + 1, out->n_keys);
            int32_t s = (int32_t)(t / seg), kv0, kv1, kvh, c;
            if (!plan || !ei__segment_sparse(&ctx->cfg, s, plan->n_segments, plan->final)) {
                ei__mask_put(out, base, h, i, 0, end, 1);
                ei__mask_put(out, base, h, i, end, out->n_keys, 0);
                continue;
            }
            ei__mask_put(out, base, h, i, 0, out->n_keys, 0);
            ei__mask_put(out, base, h, i, EI__MIN(S0, end), end, 1);
            kv0 = out->n_heads == 1 ? 0 : h / G; /* one head: the union of the kv heads' blocks */
            kv1 = out->n_heads == 1 ? plan->n_kv_heads : kv0 + 1;
            for (kvh = kv0; kvh < kv1; ++kvh) {
                const int32_t *blocks = EI_PLAN_BLOCKS(plan, kvh, s);
                int32_t cnt = plan->keep_count[EI_PLAN_ROW(plan, kvh, s)]; /* checked: 0..max_keep, blocks before S0 */
                for (c = 0; c < cnt; ++c) {
                    int64_t j0 = (int64_t)blocks[c] * bs;
                    ei__mask_put(out, base, h, i, EI__MIN(j0, end), EI__MIN(j0 + bs, end), 1);
                }
            }
        }
    return EI_OK;
}

// >>exec: the public calls, each operation run as its ei_exec says ---------
/* Every operation has one public call taking an ei_exec; the work itself is
   done by the functions above, each written for one way to run: a part
   (ith of nth, one workspace of its own), a whole call on one thread, or
   the built-in threads (ei__fork_join over per-thread workspaces laid end to
   end). Here an ei_exec picks one of them and cuts the call's one workspace
   into the shares they take: in parts, part ith takes the ith of nth equal
   slices, so a workspace of ei_layer_sizes for nth threads gives each part
   at least its own size. */
typedef struct ei__run {
    int n_threads;         /* a whole call: its threads (1: the caller alone) */
    int ith, nth;          /* nth >= 2: part ith of nth */
    unsigned char *ws;
    size_t ws_bytes;
} ei__run;

static ei_result ei__exec_read(const ei_context *ctx, const ei_exec *x, ei__run *e) {
    e->n_threads = 1; e->ith = 0; e->nth = 1; e->ws = NULL; e->ws_bytes = 0;
    if (!ctx) return ei__fail(ctx, EI_ERR_NULL, "context is NULL");
    if (!x) return EI_OK;
    if (x->nth >= 2) {
        if (x->nth > EI__MAX_THREADS || x->ith < 0 || x->ith >= x->nth)
            return ei__fail(ctx, EI_ERR_SIZE, "ei_exec part ith %d of nth %d: need 0 <= ith < nth <= %d", (int)x->ith,
                            (int)x->nth, EI__MAX_THREADS);
        if (x->n_threads > 1)
            return ei__fail(ctx, EI_ERR_CONFIG, "ei_exec with n_threads %d and nth %d: a call runs on threads or in "
                            "parts, not both", (int)x->n_threads, (int)x->nth);
        e->ith = x->ith; e->nth = x->nth;
    } else {
        if (x->nth < 0 || x->ith != 0)
            return ei__fail(ctx, EI_ERR_SIZE, "ei_exec ith %d, nth %d: a whole call has ith 0 and nth 0 or 1 "
                            "(parts: nth >= 2)", (int)x->ith, (int)x->nth);
        if (x->n_threads < 0 || x->n_threads > EI__MAX_THREADS)
            return ei__fail(ctx, EI_ERR_SIZE, "ei_exec n_threads %d not in 0..%d", (int)x->n_threads, EI__MAX_THREADS);
        e->n_threads = x->n_threads > 1 ? x->n_threads : 1;
    }
    if (!x->workspace && x->workspace_bytes)
        return ei__fail(ctx, EI_ERR_NULL, "ei_exec workspace is NULL with workspace_bytes %zu", x->workspace_bytes);
    e->ws = (unsigned char *)x->workspace;
    e->ws_bytes = x->workspace ? x->workspace_bytes : 0;
    return EI_OK;
}
/* Part ith's slice of the bytes [base, base + bytes) of the workspace: the
   ith of nth equal slices, as the built-in threads lay their shares end to
   end (each share aligns its own arena, so a slice may start anywhere; the
   sizes stay exact: a byte less than ei_layer_sizes reports is refused). */
static void *ei__run_slice(const ei__run *e, unsigned char *base, size_t bytes, size_t *slice) {
    *slice = base ? bytes / (size_t)e->nth : 0;
    return base ? base + *slice * (size_t)e->ith : NULL;
}
/* A part's call with the span of every part's share registered (ei__reg_workspace). */
static void ei__span_set(const void *p, size_t bytes) { ei__tls_ws_span.p = p; ei__tls_ws_span.bytes = bytes; }
static ei_result ei__span_clear(ei_result r) { ei__tls_ws_span.p = NULL; ei__tls_ws_span.bytes = 0; return r; }
/* What a part with no kv heads of its own checks (k is checked already): q
   and the plan's layout (read only; the plan's rows belong to the parts that plan). */
static ei_result ei__empty_part_check(const ei_context *ctx, const ei_tensor *q, int q_optional, const ei_plan *plan) {
    ei_result r;
    if ((!q_optional || q) && (r = ei__check_tensor(ctx, q, "q")) != EI_OK) return r;
    return ei__check_plan_layout(ctx, plan);
}
/* The kv heads (or query heads) [n ith / nth, n (ith + 1) / nth) of part ith. */
static void ei__run_range(const ei__run *e, int32_t n, int32_t *b, int32_t *end) {
    *b = (int32_t)((int64_t)n * e->ith / e->nth);
    *end = (int32_t)((int64_t)n * (e->ith + 1) / e->nth);
}

EIDEF ei_result ei_layer_sizes(const ei_context *ctx, const ei_shape *shape, ei_sizes *sizes) {
    size_t per[4], pbytes = 0;
    int n, i, gpu;
    ei_result r;
    if (!ctx || !shape || !sizes) return ei__fail(ctx, EI_ERR_NULL, "context, shape or sizes is NULL");
    memset(sizes, 0, sizeof *sizes);
    if (shape->n_threads < 0 || shape->n_threads > EI_MAX_THREADS)
        return ei__fail(ctx, EI_ERR_SIZE, "shape n_threads %d not in 0..%d", (int)shape->n_threads, EI_MAX_THREADS);
    n = shape->n_threads > 1 ? shape->n_threads : 1;
    gpu = ei__on_gpu(ctx);
    if ((r = ei__check_sizes(ctx, shape->max_tokens, shape->n_heads, shape->n_kv_heads, shape->head_dim, &per[0])) != EI_OK ||
        (r = ei__plan_size(ctx, shape->max_tokens, shape->n_kv_heads, shape->head_dim, shape->plan_flags,
                           &sizes->plan)) != EI_OK ||
        (r = ei__decoder_size(ctx, shape->n_heads, shape->head_dim, &sizes->decoder)) != EI_OK ||
        (r = ei__attn_ws_size(ctx, shape->n_heads, shape->n_kv_heads, shape->head_dim, &per[1])) != EI_OK ||
        (r = ei__decode_ws_size(ctx, shape->max_tokens, shape->n_heads, shape->n_kv_heads, &per[3])) != EI_OK)
        return r;
    /* planning this context cannot run (EI_RANK_ANTIDIAGONAL on the GPU) needs
       no workspace: 0, and ei_profile says why; every other size stands */
    if ((r = ei__profile_ws_size(ctx, shape->max_tokens, shape->n_heads, shape->n_kv_heads, shape->head_dim,
                                 &per[0])) == EI_ERR_UNSUPPORTED)
        per[0] = 0;
    else if (r != EI_OK)
        return r;
    if (gpu) per[2] = per[1]; /* a decode step is one attention launch; one workspace per launch sequence */
    else {
        /* decode: the partials of n shares (from a 64-byte boundary), then n attention shares */
        if ((r = ei__decode_partials_size(ctx, EI_DECODE_MAX_TOKENS, shape->n_heads, shape->head_dim, n, &pbytes)) != EI_OK)
            return r;
        per[2] = per[1];
        for (i = 0; i < 4; ++i)
            if (!ei__mul_size(per[i], (size_t)n, &per[i]))
                return ei__fail(ctx, EI_ERR_OVERFLOW, "workspace for %d threads overflows size_t", n);
        if (!ei__add_size(per[2], pbytes + EI__ALIGN, &per[2])) /* the partials from a 64-byte boundary */
            return ei__fail(ctx, EI_ERR_OVERFLOW, "decode workspace overflows size_t");
    }
    sizes->profile = per[0];
    sizes->prefill = per[1];
    sizes->decode = per[2];
    sizes->decode_keep = per[3];
    sizes->workspace = EI__MAX(EI__MAX(per[0], per[1]), EI__MAX(per[2], per[3]));
    return EI_OK;
}

EIDEF ei_result ei_plan_init(const ei_context *ctx, ei_plan *plan, int64_t max_tokens, int32_t n_kv_heads,
                             int32_t head_dim, uint32_t flags, void *memory, size_t bytes) {
    if (!memory && bytes)
        return ei__fail(ctx, EI_ERR_NULL, "memory is NULL with bytes %zu (NULL with 0: the context allocates)", bytes);
    if (!memory) return ei__plan_alloc(ctx, plan, max_tokens, n_kv_heads, head_dim, flags);
    return ei__plan_init_mem(ctx, plan, max_tokens, n_kv_heads, head_dim, flags, memory, bytes);
}

EIDEF ei_result ei_profile(const ei_context *ctx, const ei_exec *x, const ei_tensor *q, const ei_tensor *k,
                           ei_plan *plan) {
    ei__run e;
    int32_t b, end;
    size_t slice;
    void *ws;
    ei_result r;
    if ((r = ei__exec_read(ctx, x, &e)) != EI_OK) return r;
    if (e.nth == 1)
        return e.n_threads > 1 ? ei__profile_mt(ctx, q, k, plan, e.n_threads, e.ws, e.ws_bytes)
                               : ei__profile_whole(ctx, q, k, plan, e.ws, e.ws_bytes);
    if (ei__on_gpu(ctx)) return e.ith == 0 ? ei__profile_whole(ctx, q, k, plan, e.ws, e.ws_bytes) : EI_OK;
    if ((r = ei__check_tensor(ctx, k, "k")) != EI_OK) return r;
    ei__run_range(&e, k->n_heads, &b, &end);
    if (b >= end) return ei__empty_part_check(ctx, q, 0, plan); /* more parts than kv heads: none here */
    ws = ei__run_slice(&e, e.ws, e.ws_bytes, &slice);
    ei__span_set(e.ws, e.ws_bytes);
    return ei__span_clear(ei__profile_heads(ctx, q, k, plan, b, end, ws, slice));
}

EIDEF ei_result ei_profile_chunk(const ei_context *ctx, const ei_exec *x, const ei_tensor *q, const ei_tensor *k,
                                 ei_plan *plan, int64_t q_pos, int is_final) {
    ei__run e;
    int32_t b, end;
    size_t slice;
    void *ws;
    ei_result r;
    if ((r = ei__exec_read(ctx, x, &e)) != EI_OK) return r;
    if (e.nth == 1)
        return e.n_threads > 1 ? ei__profile_chunk_mt(ctx, q, k, plan, q_pos, is_final, e.n_threads, e.ws, e.ws_bytes)
                               : ei__profile_chunk_all(ctx, q, k, plan, q_pos, is_final, e.ws, e.ws_bytes);
    if (ei__on_gpu(ctx))
        return e.ith == 0 ? ei__profile_chunk_all(ctx, q, k, plan, q_pos, is_final, e.ws, e.ws_bytes) : EI_OK;
    if ((r = ei__check_tensor(ctx, k, "k")) != EI_OK) return r;
    ei__run_range(&e, k->n_heads, &b, &end);
    if (b >= end) return ei__empty_part_check(ctx, q, 1, plan);
    ws = ei__run_slice(&e, e.ws, e.ws_bytes, &slice);
    ei__span_set(e.ws, e.ws_bytes);
    return ei__span_clear(ei__profile_chunk_heads(ctx, q, k, plan, q_pos, is_final, b, end, ws, slice));
}

EIDEF ei_result ei_attention_prefill(const ei_context *ctx, const ei_exec *x, const ei_tensor *q, const ei_tensor *k,
                                     const ei_tensor *v, const ei_plan *plan, ei_out_tensor *out, int64_t q_offset) {
    ei__run e;
    size_t slice;
    void *ws;
    ei_result r;
    if ((r = ei__exec_read(ctx, x, &e)) != EI_OK) return r;
    if (e.nth == 1) return ei__attn_prefill_mt(ctx, q, k, v, plan, out, q_offset, e.n_threads, e.ws, e.ws_bytes);
    if (ei__on_gpu(ctx))
        return e.ith == 0 ? ei__attn_prefill_part(ctx, q, k, v, plan, out, q_offset, 0, 1, e.ws, e.ws_bytes) : EI_OK;
    ws = ei__run_slice(&e, e.ws, e.ws_bytes, &slice);
    ei__span_set(e.ws, e.ws_bytes);
    return ei__span_clear(ei__attn_prefill_part(ctx, q, k, v, plan, out, q_offset, e.ith, e.nth, ws, slice));
}

/* Decode in parts: the workspace is laid out as on threads (ei__attn_decode_mt:
   the partials of every part, 64-byte aligned, then the parts' attention
   workspaces); the merge finds the partials where the parts wrote them. */
static ei_result ei__decode_parts_layout(const ei_context *ctx, const ei__run *e, int64_t n_tokens, int32_t n_heads,
                                         int32_t head_dim, float **partials, size_t *pbytes, void **ws, size_t *slice) {
    unsigned char *p;
    size_t pad;
    ei_result r;
    if ((r = ei__decode_partials_size(ctx, n_tokens, n_heads, head_dim, e->nth, pbytes)) != EI_OK) return r;
    if (!e->ws) return ei__fail(ctx, EI_ERR_NULL, "workspace is NULL (ei_sizes.decode bytes needed)");
    pad = (EI__ALIGN - (uintptr_t)e->ws % EI__ALIGN) % EI__ALIGN;
    if (e->ws_bytes < pad + *pbytes)
        return ei__fail(ctx, EI_ERR_WORKSPACE, "workspace of %zu bytes holds no room for the %zu bytes of partials "
                        "(ei_sizes.decode)", e->ws_bytes, *pbytes);
    p = e->ws + pad;
    *partials = (float *)(void *)p;
    *ws = ei__run_slice(e, p + *pbytes, e->ws_bytes - pad - *pbytes, slice);
    if (!*ws) *slice = 0; /* no room past the partials: the part's call names the size it needs */
    return EI_OK;
}

EIDEF ei_result ei_attention_decode(const ei_context *ctx, const ei_exec *x, const ei_tensor *q, const ei_tensor *k,
                                    const ei_tensor *v, const ei_keep_set *keep, ei_out_tensor *out, int64_t q_offset) {
    ei__run e;
    float *partials;
    size_t pbytes, slice;
    void *ws;
    ei_result r;
    if ((r = ei__exec_read(ctx, x, &e)) != EI_OK) return r;
    if (e.nth == 1) return ei__attn_decode_mt(ctx, q, k, v, keep, out, q_offset, e.n_threads, e.ws, e.ws_bytes);
    if (ei__on_gpu(ctx))
        return e.ith == 0 ? ei__attn_decode_part(ctx, q, k, v, keep, out, q_offset, 0, 1, NULL, 0, e.ws, e.ws_bytes)
                          : EI_OK;
    if (!q) return ei__fail(ctx, EI_ERR_NULL, "q is NULL");
    if ((r = ei__decode_parts_layout(ctx, &e, q->n_tokens, q->n_heads, q->head_dim, &partials, &pbytes, &ws, &slice)) !=
        EI_OK)
        return r;
    /* the parts' shares: the bytes past the partials (registered on their own) */
    ei__span_set((unsigned char *)partials + pbytes, (size_t)(e.ws + e.ws_bytes - ((unsigned char *)partials + pbytes)));
    return ei__span_clear(ei__attn_decode_part(ctx, q, k, v, keep, out, q_offset, e.ith, e.nth, partials, pbytes, ws, slice));
}

EIDEF ei_result ei_attention_decode_merge(const ei_context *ctx, const ei_exec *x, ei_out_tensor *out) {
    ei__run e;
    float *partials;
    size_t pbytes, slice;
    void *ws;
    ei_result r;
    if ((r = ei__exec_read(ctx, x, &e)) != EI_OK) return r;
    if ((r = ei__check_out_tensor(ctx, out, "out")) != EI_OK) return r;
    if (e.nth == 1 || ei__on_gpu(ctx)) return EI_OK; /* the call itself merged */
    if ((r = ei__decode_parts_layout(ctx, &e, out->n_tokens, out->n_heads, out->head_dim, &partials, &pbytes, &ws,
                                     &slice)) != EI_OK)
        return r;
    return ei__attn_decode_merge(ctx, out, partials, pbytes, e.ith, e.nth);
}

EIDEF ei_result ei_decode_keep(const ei_context *ctx, const ei_exec *x, ei_decoder *dec, const ei_tensor *k,
                               ei_keep_set *keep) {
    ei__run e;
    ei_result r;
    if ((r = ei__exec_read(ctx, x, &e)) != EI_OK) return r;
    if (e.nth > 1)
        return ei__fail(ctx, EI_ERR_CONFIG, "ei_decode_keep runs on threads, not in parts: an engine's own threads "
                        "call ei_decode_score in parts, then ei_decode_select after their barrier");
    return ei__decode_keep_mt(ctx, dec, k, keep, e.n_threads, e.ws, e.ws_bytes);
}

/* ei_decode_score on the built-in threads: each scores its query heads with
   its own workspace (the calls check everything before any writes). */
typedef struct ei__decode_score_job {
    const ei_context *ctx;
    const ei_decoder *dec;
    const ei_tensor *k;
    const int32_t *row_pos;
    int64_t row_pos_stride;
    float *scores;
} ei__decode_score_job;
static ei_result ei__decode_score_share(void *arg, int ith, int nth, void *ws, size_t ws_bytes) {
    const ei__decode_score_job *j = (const ei__decode_score_job *)arg;
    return ei__decode_score_part(j->ctx, j->dec, j->k, j->row_pos, j->row_pos_stride, j->scores, ith, nth, ws, ws_bytes);
}
EIDEF ei_result ei_decode_score(const ei_context *ctx, const ei_exec *x, const ei_decoder *dec, const ei_tensor *k,
                                const int32_t *row_pos, int64_t row_pos_stride, float *scores) {
    ei__decode_score_job job;
    ei__run e;
    size_t slice;
    void *ws;
    int nt;
    ei_result r;
    if ((r = ei__exec_read(ctx, x, &e)) != EI_OK) return r;
    if (ei__on_gpu(ctx) || (e.nth == 1 && e.n_threads == 1)) /* one launch (part 0), or the caller alone */
        return e.ith == 0 ? ei__decode_score_part(ctx, dec, k, row_pos, row_pos_stride, scores, 0, 1, e.ws, e.ws_bytes)
                          : EI_OK;
    if (e.nth > 1) {
        ws = ei__run_slice(&e, e.ws, e.ws_bytes, &slice);
        ei__span_set(e.ws, e.ws_bytes);
        return ei__span_clear(ei__decode_score_part(ctx, dec, k, row_pos, row_pos_stride, scores, e.ith, e.nth, ws, slice));
    }
    if (!dec) return ei__fail(ctx, EI_ERR_NULL, "decoder is NULL");
    nt = EI__MIN(e.n_threads, EI__MAX(dec->n_heads, 1));
    job.ctx = ctx; job.dec = dec; job.k = k; job.row_pos = row_pos; job.row_pos_stride = row_pos_stride;
    job.scores = scores;
    return ei__fork_join(ctx, ei__decode_score_share, &job, nt, e.ws, e.ws_bytes / (size_t)nt);
}

EIDEF ei_result ei_decode_select(const ei_context *ctx, const ei_exec *x, ei_decoder *dec, const float *scores,
                                 int64_t n_rows, ei_keep_set *keep) {
    ei__run e;
    ei_result r;
    if ((r = ei__exec_read(ctx, x, &e)) != EI_OK) return r;
    return e.ith == 0 ? ei__decode_select(ctx, dec, scores, n_rows, keep, e.ws, e.ws_bytes) : EI_OK;
}
EIDEF ei_result ei_decode_shared_add(const ei_context *ctx, const ei_exec *x, ei_decoder *dec, const float *scores,
                                     int64_t n_rows, const int32_t *row_pos, float *shared) {
    ei__run e;
    ei_result r;
    if ((r = ei__exec_read(ctx, x, &e)) != EI_OK) return r;
    return e.ith == 0 ? ei__decode_shared_add(ctx, dec, scores, n_rows, row_pos, shared, e.ws, e.ws_bytes) : EI_OK;
}
EIDEF ei_result ei_decode_select_shared(const ei_context *ctx, const ei_exec *x, const ei_decoder *dec,
                                        const float *shared, int64_t n_rows, ei_keep_set *keep) {
    ei__run e;
    ei_result r;
    if ((r = ei__exec_read(ctx, x, &e)) != EI_OK) return r;
    return e.ith == 0 ? ei__decode_select_shared(ctx, dec, shared, n_rows, keep, e.ws, e.ws_bytes) : EI_OK;
}

// >>isa-scalar: the plain reference kernels ---------------------------------
/* The reference every other path is checked against (tests/test_core.c,
   tests/test_attention.c): plain C, one element at a time. Its attention is
   the scalar tile walk in >>attention (ei__attn_qtile_scalar: attn NULL). */
static int ei__rows_finite_scalar(const ei_tensor *t, const int64_t *pos, int32_t n, int32_t head) {
    int32_t j, i;
    for (j = 0; j < n; ++j) {
        const void *row = ei__row(t, pos[j], head);
        for (i = 0; i < t->head_dim; ++i) {
            float x = ei__load1(row, t->dtype, i);
            if (!(x - x == 0.0f)) return 0;
        }
    }
    return 1;
}
static int ei__minmax_scalar(const ei_tensor *t, int64_t t0, int64_t nt, int32_t head, float *mx, float *mn) {
    int32_t d = t->head_dim, i;
    int64_t r;
    int bad = 0;
    for (i = 0; i < d; ++i) { mx[i] = -FLT_MAX; mn[i] = FLT_MAX; }
    for (r = 0; r < nt; ++r) {
        const void *row = ei__row(t, t0 + r, head);
        for (i = 0; i < d; ++i) {
            float v = ei__load1(row, t->dtype, i);
            if (v != v) bad = 1;
            if (v > mx[i]) mx[i] = v;
            if (v < mn[i]) mn[i] = v;
        }
    }
    for (i = 0; i < d; ++i)
        if (mx[i] == INFINITY || mn[i] == -INFINITY) bad = 1;
    return !bad;
}

static void ei__score_row_scalar(const float *qrep, int32_t G, int32_t d, const float *kmaxT, const float *kminT,
                                 int64_t ld, int64_t nb, float *raw) {
    int64_t b;
    int32_t g, i;
    for (b = 0; b < nb; ++b) {
        float sum = 0.0f;
        for (g = 0; g < G; ++g) {
            const float *qx = qrep + (size_t)g * 2u * (size_t)d, *qn = qx + d;
            float a0 = 0, a1 = 0, a2 = 0, a3 = 0, s1, s2;
            for (i = 0; i < d; ++i) {
                float kx = kmaxT[(size_t)i * (size_t)ld + (size_t)b], kn = kminT[(size_t)i * (size_t)ld + (size_t)b];
                a0 += qx[i] * kx; a1 += qn[i] * kx; a2 += qx[i] * kn; a3 += qn[i] * kn;
            }
            s1 = (a0 + a1) * 0.5f;
            s2 = (a2 + a3) * 0.5f;
            sum += s1 > s2 ? s1 : s2;
        }
        raw[b] = sum / (float)G;
    }
}

/* dot(a, b) over d floats (decode scoring). */
static float ei__dot_scalar(const float *a, const float *b, int32_t d) {
    float s = 0.0f;
    int32_t i;
    for (i = 0; i < d; ++i) s += a[i] * b[i];
    return s;
}

/* The plain references' walk over stored scores lg [keys][EI__SAMPLE_ROWS]: the
   softmax of row r over keys 0..tok[r] (base2: scores in log2 units, exp2f;
   else expf), then per block the rows' weights, rows added in row order, into
   mass[0..nvis). 0 if a score is NaN or +-inf. */
static int ei__sample_walk_scalar(float *lg, const int64_t *tok, int32_t nr, int32_t bs, int64_t nvis, float *mass, int base2) {
    const int32_t R = EI__SAMPLE_ROWS;
    float inv[EI__SAMPLE_ROWS];
    int64_t j, b;
    int32_t r;
    for (r = 0; r < nr; ++r) { /* softmax of row r over keys 0..tok[r] */
        float m = -FLT_MAX;
        double z = 0.0;
        for (j = 0; j <= tok[r]; ++j) {
            float x = lg[(size_t)j * R + (size_t)r];
            if (!(x - x == 0.0f)) return 0;
            m = x > m ? x : m;
        }
        for (j = 0; j <= tok[r]; ++j) {
            float *x = &lg[(size_t)j * R + (size_t)r];
            *x = base2 ? exp2f(*x - m) : expf(*x - m);
            z += (double)*x;
        }
        inv[r] = (float)(1.0 / z);
    }
    for (b = 0; b < nvis; ++b) /* per block, rows added in row order; row r sees keys 0..tok[r] */
        for (r = 0; r < nr; ++r) {
            float acc = 0.0f;
            for (j = b * bs; j < (b + 1) * bs && j <= tok[r]; ++j) acc += lg[(size_t)j * R + (size_t)r];
            mass[b] += acc * inv[r];
        }
    return 1;
}

/* The block mass of sampled rows (EI_RANK_SAMPLED; the vector version and
   the contract: EI__DEFINE_SAMPLE_MASS in >>attention's templates). */
static int ei__sample_mass_scalar(const float *qt, const int64_t *tok, int32_t nr, const ei_tensor *k, int32_t kvh,
                                  float scale, int32_t bs, int64_t nvis, float *lg, float *kbuf, float *mass,
                                  const int32_t *krow) {
    const int32_t d = k->head_dim, R = EI__SAMPLE_ROWS;
    int64_t j;
    int32_t r, i;
    for (j = 0; j <= tok[nr - 1]; ++j) { /* scale * q.k, rows in columns */
        ei__row_to_f32(ei__row(k, krow ? krow[j] : j, kvh), k->dtype, d, kbuf);
        for (r = 0; r < R; ++r) {
            float acc = 0.0f;
            for (i = 0; i < d; ++i) acc += qt[(size_t)i * R + (size_t)r] * kbuf[i];
            lg[(size_t)j * R + (size_t)r] = acc * scale;
        }
    }
    return ei__sample_walk_scalar(lg, tok, nr, bs, nvis, mass, 0);
}

/* EI_RANK_PRECISION_INT8's tile scores (the contract of
   ei__sample_scores_<isa>, EI__DEFINE_SAMPLE_MASS; qx an ei__rank_q8 whose
   keys kc hold keys j0 .. j0+nk), plain: per row the int32 sum of q8 k8
   and the score sc s_q s_k sum, multiplied in that order. Every path's
   int8 scores equal these bit for bit. */
static int ei__rank_scores_i8_scalar(const void *qx, const ei_tensor *k, int32_t kvh, const int32_t *krow, int64_t j0,
                                     int64_t nk, float *kbuf, float sc, float *tl) {
    enum { R = EI__SAMPLE_ROWS };
    const ei__rank_q8 *q = (const ei__rank_q8 *)qx;
    const ei__rank_keys *kc = q->kc;
    const int32_t d = k->head_dim;
    int64_t j;
    int32_t r, i;
    int bad = 0;
    (void)kvh; (void)krow; (void)kbuf; /* keys in position order, rounded before (kc) */
    for (j = 0; j < nk; ++j) {
        const int8_t *kj = kc->k + (size_t)(j0 + j) * (size_t)q->dq;
        for (r = 0; r < R; ++r) {
            int32_t acc = 0;
            float x;
            for (i = 0; i < d; ++i) acc += (int32_t)q->q[((size_t)(i / 4) * R + (size_t)r) * 4u + (size_t)(i % 4)] * kj[i];
            x = ei__f32_round(ei__f32_round(ei__f32_round(sc * q->s[r]) * kc->s[j0 + j]) * (float)acc);
            if (!(x - x == 0.0f)) bad = 1;
            tl[(size_t)j * R + (size_t)r] = x;
        }
    }
    return bad;
}
/* The block mass of int8 rows (rank_mass_i8), the plain reference: every
   score stored (log2 units: the scale carries log2 e), exp2f. */
static int ei__rank_mass_i8_scalar(const ei__rank_q8 *q, const int64_t *tok, int32_t nr, const ei_tensor *k, int32_t kvh,
                                   float scale, int32_t bs, int64_t nvis, float *lg, float *kbuf, float *mass) {
    const int32_t R = EI__SAMPLE_ROWS, tk = ei__sample_tile_keys(bs);
    int64_t j0;
    int bad = ei__rank_keys_extend_scalar(q->kc, k, kvh, tok[nr - 1] + 1, kbuf);
    for (j0 = 0; j0 <= tok[nr - 1]; j0 += tk)
        bad |= ei__rank_scores_i8_scalar(q, k, kvh, NULL, j0, EI__MIN((int64_t)tk, tok[nr - 1] + 1 - j0), kbuf,
                                         scale * 1.44269504088896341f, lg + (size_t)j0 * (size_t)R);
    return !bad && ei__sample_walk_scalar(lg, tok, nr, bs, nvis, mass, 1);
}

static const ei__kernels ei__kernels_scalar = {EI_SIMD_SCALAR, ei__minmax_scalar, ei__rows_finite_scalar, ei__score_row_scalar, ei__dot_scalar,
                                               ei__sample_mass_scalar, ei__sample_mass_scalar, ei__rank_mass_i8_scalar,
                                               ei__rank_keys_extend_scalar, NULL, NULL, NULL, NULL, NULL, 0, ei__spread_dots_scalar, NULL};

// >>isa-avx2: AVX2 + FMA + F16C, 8 lanes ------------------------------------
#ifdef EI__HAVE_AVX2
/* The vocabulary (>>simd): 8 f32 lanes in a ymm register; a 16-row vector of
   the attention tile is two of them. A partial row (n < 8 lanes) goes
   through a small copy: AVX2 has no 16-bit masked loads and stores. */
typedef __m256 ei__avx2_v;
typedef __m256 ei__avx2_m;     /* lane mask: all-ones lanes */
typedef int32_t ei__avx2_tail; /* lane count, 0..8 */
enum { ei__avx2_n = 8, ei__avx2_minmax_vecs = 4 };
EI__TARGET_AVX2 EI__VINLINE ei__avx2_tail ei__avx2_first(int32_t n) { return n; }
EI__DEFINE_VOCAB_LANEWISE(avx2, EI__TARGET_AVX2, __m256, _mm256)
EI__TARGET_AVX2 EI__VINLINE __m256 ei__avx2_round(__m256 x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
EI__TARGET_AVX2 EI__VINLINE __m256 ei__avx2_ge(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
/* p * 2^n through the exponent field (n in -127..127; exact unless the
   result is subnormal, where it rounds like vscalefps). */
EI__TARGET_AVX2 EI__VINLINE __m256 ei__avx2_pow2(__m256 p, __m256 n, __m256 keep) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
EI__TARGET_AVX2 static inline __m256 ei__avx2_load_row(const void *p, ei_dtype dt, ei__avx2_tail n) {
    if (n < 8) {
        float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int32_t i;
        for (i = 0; i < n; ++i) tmp[i] = ei__load1(p, dt, i);
        return _mm256_loadu_ps(tmp);
    }
    if (dt == EI_F32) return _mm256_loadu_ps((const float *)p);
    if (dt == EI_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
/* bf16 rows and partial rows are stored through the scalar conversion. */
EI__TARGET_AVX2 EI__VINLINE void ei__avx2_store_row(void *p, ei_dtype dt, __m256 x, ei__avx2_tail n) {
    float tmp[8];
    int32_t i;
    if (n == 8 && dt == EI_F32) { _mm256_storeu_ps((float *)p, x); return; }
    if (n == 8 && dt == EI_F16) {
        _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        return;
    }
    _mm256_storeu_ps(tmp, x);
    if (dt == EI_BF16) for (i = 0; i < n; ++i) ((uint16_t *)p)[i] = ei__f32_to_bf16(tmp[i]);
    else if (dt == EI_F16) for (i = 0; i < n; ++i) ((uint16_t *)p)[i] = ei__f32_to_f16(tmp[i]);
    else for (i = 0; i < n; ++i) ((float *)p)[i] = tmp[i];
}
EI__TARGET_AVX2 EI__VINLINE __m256 ei__avx2_select_bits(uint32_t bits, __m256 x, __m256 y) {
    const __m256i lanebit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i b = _mm256_and_si256(_mm256_set1_epi32((int)bits), lanebit);
    return _mm256_blendv_ps(y, x, _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, lanebit)));
}
EI__TARGET_AVX2 EI__VINLINE __m256 ei__avx2_nan_none(void) { return _mm256_setzero_ps(); }
EI__TARGET_AVX2 EI__VINLINE __m256 ei__avx2_nan_or(__m256 m, __m256 v) {
    return _mm256_or_ps(m, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}
EI__TARGET_AVX2 EI__VINLINE int ei__avx2_any(__m256 m) { return _mm256_movemask_ps(m) != 0; }
EI__TARGET_AVX2 EI__VINLINE float ei__avx2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
EI__TARGET_AVX2 EI__VINLINE float ei__avx2_hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* The templates: ei__minmax_avx2, ei__attn_{exp2, row_f32, put_scores,
   prep_kv, softmax, store}_avx2. */
#define EI__VISA avx2
#define EI__VTARGET EI__TARGET_AVX2
EI__DEFINE_MINMAX()
EI__DEFINE_ROWS_FINITE()
EI__ATTN_DEFINE_STAGES()
EI__DEFINE_SAMPLE_MASS()
EI__DEFINE_ANTIDIAG_GROUP()
EI__DEFINE_DECODE_TILE()
#undef EI__VTARGET
#undef EI__VISA

/* Hand-written: block scores, dot, Q K^T, P V. */
EI__TARGET_AVX2 static void ei__score_row_avx2(const float *qrep, int32_t G, int32_t d, const float *kmaxT,
                                               const float *kminT, int64_t ld, int64_t nb, float *raw) {
    int64_t b;
    const __m256 half = _mm256_set1_ps(0.5f), gdiv = _mm256_set1_ps((float)G);
    /* ld is a multiple of 16 and columns past nb exist (padding), so whole
       8-wide loads stay inside the representation store. */
    for (b = 0; b < nb; b += 16) {
        __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
        float out[16];
        int32_t g, i;
        int64_t j, rem = nb - b;
        for (g = 0; g < G; ++g) {
            const float *qx = qrep + (size_t)g * 2u * (size_t)d, *qn = qx + d;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
            for (i = 0; i < d; ++i) {
                const float *px = kmaxT + (size_t)i * (size_t)ld + (size_t)b;
                const float *pn = kminT + (size_t)i * (size_t)ld + (size_t)b;
                __m256 bx = _mm256_set1_ps(qx[i]), bn = _mm256_set1_ps(qn[i]);
                __m256 kx0 = _mm256_loadu_ps(px), kn0 = _mm256_loadu_ps(pn);
                __m256 kx1 = _mm256_loadu_ps(px + 8), kn1 = _mm256_loadu_ps(pn + 8);
                a0 = _mm256_fmadd_ps(bx, kx0, a0); a1 = _mm256_fmadd_ps(bn, kx0, a1);
                a2 = _mm256_fmadd_ps(bx, kn0, a2); a3 = _mm256_fmadd_ps(bn, kn0, a3);
                c0 = _mm256_fmadd_ps(bx, kx1, c0); c1 = _mm256_fmadd_ps(bn, kx1, c1);
                c2 = _mm256_fmadd_ps(bx, kn1, c2); c3 = _mm256_fmadd_ps(bn, kn1, c3);
            }
            sum0 = _mm256_add_ps(sum0, _mm256_max_ps(_mm256_mul_ps(_mm256_add_ps(a0, a1), half),
                                                     _mm256_mul_ps(_mm256_add_ps(a2, a3), half)));
            sum1 = _mm256_add_ps(sum1, _mm256_max_ps(_mm256_mul_ps(_mm256_add_ps(c0, c1), half),
                                                     _mm256_mul_ps(_mm256_add_ps(c2, c3), half)));
        }
        _mm256_storeu_ps(out, _mm256_div_ps(sum0, gdiv));
        _mm256_storeu_ps(out + 8, _mm256_div_ps(sum1, gdiv));
        for (j = 0; j < 16 && j < rem; ++j) raw[b + j] = out[j];
    }
}

/* dot(a, b) over d floats (decode scoring). */
EI__TARGET_AVX2 static float ei__dot_avx2(const float *a, const float *b, int32_t d) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m128 h;
    float s;
    int32_t i = 0;
    for (; i + 16 <= d; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    s0 = _mm256_add_ps(s0, s1);
    h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    s = _mm_cvtss_f32(h);
    for (; i < d; ++i) s += a[i] * b[i];
    return s;
}

/* S^T = K Q^T for the tile (>>attention): 2 row vectors (4 ymm of rows) x 2
   keys per register block (8 accumulators); a leftover vector x 4 keys. */
#define EI__PUT256(acc, j, vi, sub) ei__attn_put_scores_avx2(w, T, ld, need_mask, (j), (vi), (sub), (acc), cv)
EI__TARGET_AVX2 static void ei__attn_scores_avx2(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                 int32_t nk, int need_mask) {
    const int32_t ld = T->ld, d = J->d;
    const __m256 cv = _mm256_set1_ps(J->c);
    int32_t vb, j, i;
    /* 2 vectors (4 ymm of rows) x 2 keys: 8 accumulators */
    for (vb = 0; vb + 2 <= T->nvec; vb += 2)
        for (j = 0; j < nk; j += 2) {
            const float *k0 = (const float *)w->kp[j], *k1 = (const float *)w->kp[j + 1];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            for (i = 0; i < d; ++i, qp += ld) {
                __m256 q0 = _mm256_load_ps(qp), q1 = _mm256_load_ps(qp + 8), q2 = _mm256_load_ps(qp + 16),
                       q3 = _mm256_load_ps(qp + 24), b;
                /* keep the 4 loads in registers: folded into each FMA they would be
                   loaded twice and the loop would be load-bound */
                __asm__("" : "+x"(q0), "+x"(q1), "+x"(q2), "+x"(q3));
                b = _mm256_broadcast_ss(k0 + i);
                a00 = _mm256_fmadd_ps(b, q0, a00); a01 = _mm256_fmadd_ps(b, q1, a01);
                a02 = _mm256_fmadd_ps(b, q2, a02); a03 = _mm256_fmadd_ps(b, q3, a03);
                b = _mm256_broadcast_ss(k1 + i);
                a10 = _mm256_fmadd_ps(b, q0, a10); a11 = _mm256_fmadd_ps(b, q1, a11);
                a12 = _mm256_fmadd_ps(b, q2, a12); a13 = _mm256_fmadd_ps(b, q3, a13);
            }
            EI__PUT256(a00, j, vb, 0); EI__PUT256(a01, j, vb, 1);
            EI__PUT256(a02, j, vb + 1, 0); EI__PUT256(a03, j, vb + 1, 1);
            EI__PUT256(a10, j + 1, vb, 0); EI__PUT256(a11, j + 1, vb, 1);
            EI__PUT256(a12, j + 1, vb + 1, 0); EI__PUT256(a13, j + 1, vb + 1, 1);
        }
    for (; vb < T->nvec; ++vb)
        for (j = 0; j < nk; j += 4) {
            const float *k0 = (const float *)w->kp[j], *k1 = (const float *)w->kp[j + 1];
            const float *k2 = (const float *)w->kp[j + 2], *k3 = (const float *)w->kp[j + 3];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            for (i = 0; i < d; ++i, qp += ld) {
                __m256 q0 = _mm256_load_ps(qp), q1 = _mm256_load_ps(qp + 8), b;
                b = _mm256_broadcast_ss(k0 + i); a00 = _mm256_fmadd_ps(b, q0, a00); a01 = _mm256_fmadd_ps(b, q1, a01);
                b = _mm256_broadcast_ss(k1 + i); a10 = _mm256_fmadd_ps(b, q0, a10); a11 = _mm256_fmadd_ps(b, q1, a11);
                b = _mm256_broadcast_ss(k2 + i); a20 = _mm256_fmadd_ps(b, q0, a20); a21 = _mm256_fmadd_ps(b, q1, a21);
                b = _mm256_broadcast_ss(k3 + i); a30 = _mm256_fmadd_ps(b, q0, a30); a31 = _mm256_fmadd_ps(b, q1, a31);
            }
            EI__PUT256(a00, j, vb, 0); EI__PUT256(a01, j, vb, 1);
            EI__PUT256(a10, j + 1, vb, 0); EI__PUT256(a11, j + 1, vb, 1);
            EI__PUT256(a20, j + 2, vb, 0); EI__PUT256(a21, j + 2, vb, 1);
            EI__PUT256(a30, j + 3, vb, 0); EI__PUT256(a31, j + 3, vb, 1);
        }
}
#undef EI__PUT256

/* O[r][..] = alpha[r] O[r][..] + sum_j P[j][r] V[j][..]: 64-dim chunks of the
   value tile (its 16 KB block stays in L1), 16 dims x 4 rows inside. */
EI__TARGET_AVX2 static void ei__attn_pv_avx2(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {
    const int32_t ld = T->ld, dpad = J->dpad;
    int32_t r, c0, c1, j;
    for (c0 = 0; c0 < dpad; c0 += 64)
        for (c1 = c0; c1 < dpad && c1 < c0 + 64; c1 += 16) {
            const float *vc = w->vbuf + (size_t)(c0 / 64) * EI__ATTN_NK * 64u + (size_t)(c1 - c0);
            for (r = 0; r < ld; r += 4) {
                const __m256 al0 = _mm256_set1_ps(w->alpha[r]), al1 = _mm256_set1_ps(w->alpha[r + 1]),
                             al2 = _mm256_set1_ps(w->alpha[r + 2]), al3 = _mm256_set1_ps(w->alpha[r + 3]);
                float *o0 = w->o + (size_t)r * (size_t)dpad + c1, *o1 = o0 + dpad, *o2 = o1 + dpad, *o3 = o2 + dpad;
                __m256 x00 = _mm256_mul_ps(al0, _mm256_load_ps(o0)), x01 = _mm256_mul_ps(al0, _mm256_load_ps(o0 + 8)),
                       x10 = _mm256_mul_ps(al1, _mm256_load_ps(o1)), x11 = _mm256_mul_ps(al1, _mm256_load_ps(o1 + 8)),
                       x20 = _mm256_mul_ps(al2, _mm256_load_ps(o2)), x21 = _mm256_mul_ps(al2, _mm256_load_ps(o2 + 8)),
                       x30 = _mm256_mul_ps(al3, _mm256_load_ps(o3)), x31 = _mm256_mul_ps(al3, _mm256_load_ps(o3 + 8));
                const float *pj = w->s + r, *vr = vc;
                for (j = 0; j < nk; ++j, pj += ld, vr += 64) {
                    __m256 v0 = _mm256_load_ps(vr), v1 = _mm256_load_ps(vr + 8), p;
                    p = _mm256_broadcast_ss(pj); x00 = _mm256_fmadd_ps(p, v0, x00); x01 = _mm256_fmadd_ps(p, v1, x01);
                    p = _mm256_broadcast_ss(pj + 1); x10 = _mm256_fmadd_ps(p, v0, x10); x11 = _mm256_fmadd_ps(p, v1, x11);
                    p = _mm256_broadcast_ss(pj + 2); x20 = _mm256_fmadd_ps(p, v0, x20); x21 = _mm256_fmadd_ps(p, v1, x21);
                    p = _mm256_broadcast_ss(pj + 3); x30 = _mm256_fmadd_ps(p, v0, x30); x31 = _mm256_fmadd_ps(p, v1, x31);
                }
                _mm256_store_ps(o0, x00); _mm256_store_ps(o0 + 8, x01);
                _mm256_store_ps(o1, x10); _mm256_store_ps(o1 + 8, x11);
                _mm256_store_ps(o2, x20); _mm256_store_ps(o2 + 8, x21);
                _mm256_store_ps(o3, x30); _mm256_store_ps(o3 + 8, x31);
            }
        }
}

static const ei__attn_stages ei__attn_avx2 = {ei__attn_pack_q_f32, ei__attn_prep_kv_avx2, ei__attn_scores_avx2,
                                              ei__attn_softmax_avx2, NULL, ei__attn_pv_avx2, ei__attn_store_avx2};
/* EI_RANK_PRECISION_INT8 on ymm. Keys [kc->n, j1) rounded as ei__quant_i8
   rounds them, 8 elements at a time (max|x| is exact in any order, the
   division correctly rounded, trunc and the remainder exact: the same
   bytes); 1 if a key holds NaN or +-inf. */
EI__TARGET_AVX2 static int ei__rank_keys_extend_avx2(ei__rank_keys *kc, const ei_tensor *k, int32_t kvh, int64_t j1,
                                                     float *row) {
    const int32_t d = k->head_dim, dp = (int32_t)ei__round_up(d, 16), dq = (int32_t)ei__round_up(d, 4);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), one = _mm256_set1_ps(1.0f);
    int32_t c0;
    int bad = 0;
    for (; kc->n < j1; ++kc->n) {
        int8_t *k8 = kc->k + (size_t)kc->n * (size_t)dq;
        __m256 m = _mm256_setzero_ps(), nan = _mm256_setzero_ps(), sv;
        __m128 m4;
        __m256i sum = _mm256_setzero_si256();
        float s;
        ei__attn_row_f32_avx2(ei__row(k, kc->n, kvh), k->dtype, d, dp, row);
        for (c0 = 0; c0 < dq; c0 += 8) {
            __m256 x = _mm256_loadu_ps(row + c0), z = _mm256_sub_ps(x, x);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
            m = _mm256_max_ps(m, _mm256_and_ps(x, absm));
        }
        m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        s = _mm_cvtss_f32(m4) / 127.0f;
        if (_mm256_movemask_ps(nan)) {
            bad = 1;
            s = 0.0f;
        }
        kc->s[kc->n] = s;
        sv = _mm256_set1_ps(s > 0.0f ? s : 1.0f);
        for (c0 = 0; c0 < dq; c0 += 8) {
            __m256 x = _mm256_div_ps(_mm256_loadu_ps(row + c0), sv);
            __m256 r = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), f = _mm256_sub_ps(x, r);
            __m256i v;
            __m128i p16, p8;
            r = _mm256_add_ps(r, _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one));
            r = _mm256_sub_ps(r, _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(-0.5f), _CMP_LE_OQ), one));
            r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
            v = s > 0.0f ? _mm256_cvtps_epi32(r) : _mm256_setzero_si256();
            sum = _mm256_add_epi32(sum, v);
            p16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            p8 = _mm_packs_epi16(p16, p16);
            if (dq - c0 >= 8) _mm_storel_epi64((__m128i *)(void *)(k8 + c0), p8);
            else { /* the last 4 */
                int32_t w8 = _mm_cvtsi128_si32(p8);
                memcpy(k8 + c0, &w8, 4);
            }
        }
        {
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            kc->sum128[kc->n] = 128 * _mm_cvtsi128_si32(s4);
        }
    }
    return bad;
}
/* The tile's keys widened to int16 (vpmaddwd's pairs) into kbuf [nk][dq]. */
EI__TARGET_AVX2 static const int16_t *ei__rank_keys_i16_avx2(const ei__rank_keys *kc, int32_t dq, int64_t j0, int64_t nk,
                                                             float *kbuf) {
    int16_t *k16 = (int16_t *)(void *)kbuf;
    const int8_t *k8 = kc->k + (size_t)j0 * (size_t)dq;
    size_t i, n = (size_t)nk * (size_t)dq;
    for (i = 0; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(k16 + i), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(k8 + i))));
    for (; i < n; ++i) k16[i] = k8[i];
    return k16;
}
/* The tile scores on ymm, 8 rows a vector, 8 keys at a time: a group of
   4 bytes (vpdpbusd: q + 128 against the key's bytes, less 128 x the key's
   sum) or 2 int16 (vpmaddwd) of every row against a broadcast group of the
   key; then sc s_q s_k times the sum, as ei__rank_scores_i8_scalar. */
#define EI__DEFINE_RANK_SCORES_I8_YMM(name, TARGET, QB, KB, KSZ, NG, DOT, CORR)                                  \
    TARGET static int name(const void *qx, const ei_tensor *k, int32_t kvh, const int32_t *krow, int64_t j0,     \
                           int64_t nk, float *kbuf, float scf, float *tl) {                                       \
        enum { R = EI__SAMPLE_ROWS };                                                                           \
        const ei__rank_q8 *q = (const ei__rank_q8 *)qx;                                                         \
        const ei__rank_keys *kc = q->kc;                                                                        \
        const int32_t dq = q->dq, ng = NG;                                                                      \
        const unsigned char *qb = (const unsigned char *)(QB), *kb = (const unsigned char *)(KB);               \
        __m256 nan = _mm256_setzero_ps();                                                                       \
        int64_t j;                                                                                              \
        int32_t g, u, v;                                                                                        \
        (void)k; (void)kvh; (void)krow; (void)kbuf;                                                             \
        for (j = 0; j < nk; j += 8)                                                                             \
            for (v = 0; v < R / 8; ++v) {                                                                       \
                const unsigned char *kr[8];                                                                     \
                __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0; \
                __m256 rs = _mm256_mul_ps(_mm256_set1_ps(scf), _mm256_loadu_ps(q->s + v * 8));                 \
                __m256i acc[8];                                                                                 \
                for (u = 0; u < 8; ++u) kr[u] = kb + (size_t)EI__MIN(j + u, nk - 1) * (size_t)dq * (KSZ);      \
                for (g = 0; g < ng; ++g) {                                                                      \
                    __m256i qv = _mm256_loadu_si256((const __m256i *)(const void *)(qb + ((size_t)g * R + (size_t)v * 8) * 4u)); \
                    a0 = DOT(a0, qv, _mm256_set1_epi32(ei__ld32(kr[0] + (size_t)g * 4u)));                     \
                    a1 = DOT(a1, qv, _mm256_set1_epi32(ei__ld32(kr[1] + (size_t)g * 4u)));                     \
                    a2 = DOT(a2, qv, _mm256_set1_epi32(ei__ld32(kr[2] + (size_t)g * 4u)));                     \
                    a3 = DOT(a3, qv, _mm256_set1_epi32(ei__ld32(kr[3] + (size_t)g * 4u)));                     \
                    a4 = DOT(a4, qv, _mm256_set1_epi32(ei__ld32(kr[4] + (size_t)g * 4u)));                     \
                    a5 = DOT(a5, qv, _mm256_set1_epi32(ei__ld32(kr[5] + (size_t)g * 4u)));                     \
                    a6 = DOT(a6, qv, _mm256_set1_epi32(ei__ld32(kr[6] + (size_t)g * 4u)));                     \
                    a7 = DOT(a7, qv, _mm256_set1_epi32(ei__ld32(kr[7] + (size_t)g * 4u)));                     \
                }                                                                                               \
                acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3; acc[4] = a4; acc[5] = a5; acc[6] = a6; acc[7] = a7; \
                for (u = 0; u < 8 && j + u < nk; ++u) {                                                         \
                    __m256i dot = (CORR) ? _mm256_sub_epi32(acc[u], _mm256_set1_epi32(kc->sum128[j0 + j + u])) : acc[u]; \
                    __m256 x = _mm256_mul_ps(_mm256_mul_ps(rs, _mm256_set1_ps(kc->s[j0 + j + u])), _mm256_cvtepi32_ps(dot)); \
                    nan = _mm256_or_ps(nan, _mm256_cmp_ps(_mm256_sub_ps(x, x), _mm256_sub_ps(x, x), _CMP_UNORD_Q)); \
                    _mm256_storeu_ps(tl + (size_t)(j + u) * R + (size_t)v * 8, x);                              \
                }                                                                                               \
            }                                                                                                   \
        return _mm256_movemask_ps(nan) != 0;                                                                    \
    }
#define EI__RANK_DOT_MADD(acc, q, k) _mm256_add_epi32(acc, _mm256_madd_epi16(q, k))
EI__DEFINE_RANK_SCORES_I8_YMM(ei__rank_scores_i8_avx2, EI__TARGET_AVX2, q->q16, ei__rank_keys_i16_avx2(kc, dq, j0, nk, kbuf),
                              2u, dq / 2, EI__RANK_DOT_MADD, 0)
#ifdef EI__HAVE_AVXVNNI
#define EI__RANK_DOT_AVXVNNI(acc, q, k) _mm256_dpbusd_avx_epi32(acc, q, k)
EI__DEFINE_RANK_SCORES_I8_YMM(ei__rank_scores_i8_avxvnni, EI__TARGET_AVXVNNI, q->qu, kc->k + (size_t)j0 * (size_t)dq, 1u,
                              dq / 4, EI__RANK_DOT_AVXVNNI, 1)
#endif
/* The int8 scores on ymm this CPU runs: vpdpbusd (AVX-VNNI) or vpmaddwd. */
static ei__sample_scores_fn ei__rank_scores_i8_ymm(int dot) {
#ifdef EI__HAVE_AVXVNNI
    if (dot & EI__I8DOT_AVXVNNI) return ei__rank_scores_i8_avxvnni;
#endif
    (void)dot;
    return ei__rank_scores_i8_avx2;
}
EI__TARGET_AVX2 static int ei__rank_mass_i8_avx2(const ei__rank_q8 *q, const int64_t *tok, int32_t nr, const ei_tensor *k,
                                                 int32_t kvh, float scale, int32_t bs, int64_t nvis, float *lg, float *kbuf,
                                                 float *mass) {
    if (ei__rank_keys_extend_avx2(q->kc, k, kvh, tok[nr - 1] + 1, kbuf)) return 0;
    return ei__sample_mass_by_avx2(ei__rank_scores_i8_ymm(q->dot), q, tok, nr, k, kvh, scale, bs, nvis, lg, kbuf, mass, NULL);
}

/* EI_RANK_ROWS_SPREAD's dots: int8 widened to int16 pairs, vpmaddwd (exact). */
EI__TARGET_AVX2 static void ei__spread_dots_avx2(const int8_t *cand, int64_t n, int32_t dq, const int8_t *p, int32_t *out) {
    int64_t c;
    for (c = 0; c < n; ++c) {
        const int8_t *x = cand + (size_t)c * (size_t)dq;
        __m256i acc = _mm256_setzero_si256();
        __m128i h;
        int32_t i = 0, tail = 0;
        for (; i + 16 <= dq; i += 16)
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + i))),
                                                          _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + i)))));
        for (; i < dq; ++i) tail += (int32_t)x[i] * p[i];
        h = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        out[c] = _mm_cvtsi128_si32(h) + tail;
    }
}
static const ei__kernels ei__kernels_avx2 = {EI_SIMD_AVX2, ei__minmax_avx2, ei__rows_finite_avx2, ei__score_row_avx2, ei__dot_avx2,
                                             ei__sample_mass_avx2, ei__sample_mass_avx2, ei__rank_mass_i8_avx2,
                                             ei__rank_keys_extend_avx2, &ei__attn_avx2, NULL, NULL, ei__attn_decode_tile_avx2,
                                             ei__antidiag_group_avx2, EI__SAMPLE_ROWS, ei__spread_dots_avx2, NULL};
#endif /* EI__HAVE_AVX2 */

// >>isa-avx512: AVX-512 F/BW/DQ/VL, 16 lanes --------------------------------
#ifdef EI__HAVE_AVX512
/* The vocabulary (>>simd): 16 f32 lanes in a zmm register, one 16-row vector
   of the attention tile; partial rows through masked loads and stores. */
typedef __m512 ei__avx512_v;
typedef __mmask16 ei__avx512_m;
typedef __mmask16 ei__avx512_tail;
enum { ei__avx512_n = 16, ei__avx512_minmax_vecs = 8 };
EI__TARGET_AVX512 EI__VINLINE ei__avx512_tail ei__avx512_first(int32_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}
EI__DEFINE_VOCAB_LANEWISE(avx512, EI__TARGET_AVX512, __m512, _mm512)
EI__TARGET_AVX512 EI__VINLINE __m512 ei__avx512_round(__m512 x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
EI__TARGET_AVX512 EI__VINLINE __mmask16 ei__avx512_ge(__m512 a, __m512 b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
EI__TARGET_AVX512 EI__VINLINE __m512 ei__avx512_pow2(__m512 p, __m512 n, __mmask16 keep) {
    return _mm512_maskz_scalef_ps(keep, p, n);
}
EI__TARGET_AVX512 static inline __m512 ei__avx512_load_row(const void *p, ei_dtype dt, __mmask16 m) {
    if (dt == EI_F32) return _mm512_maskz_loadu_ps(m, p);
    if (dt == EI_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
/* bf16: round to nearest even by integer arithmetic (stored values are finite). */
EI__TARGET_AVX512 EI__VINLINE void ei__avx512_store_row(void *p, ei_dtype dt, __m512 x, __mmask16 m) {
    if (dt == EI_F32) _mm512_mask_storeu_ps(p, m, x);
    else if (dt == EI_F16)
        _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else {
        __m512i u = _mm512_castps_si512(x);
        u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
        _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
    }
}
EI__TARGET_AVX512 EI__VINLINE __m512 ei__avx512_select_bits(uint32_t bits, __m512 x, __m512 y) {
    return _mm512_mask_blend_ps((__mmask16)bits, y, x);
}
EI__TARGET_AVX512 EI__VINLINE __mmask16 ei__avx512_nan_none(void) { return 0; }
EI__TARGET_AVX512 EI__VINLINE __mmask16 ei__avx512_nan_or(__mmask16 m, __m512 v) {
    return (__mmask16)(m | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
}
EI__TARGET_AVX512 EI__VINLINE int ei__avx512_any(__mmask16 m) { return m != 0; }
EI__TARGET_AVX512 EI__VINLINE float ei__avx512_hsum(__m512 v) { return _mm512_reduce_add_ps(v); }
EI__TARGET_AVX512 EI__VINLINE float ei__avx512_hmax(__m512 v) { return _mm512_reduce_max_ps(v); }

/* The templates: ei__minmax_avx512, ei__attn_{exp2, row_f32, put_scores,
   prep_kv, softmax, store}_avx512. */
#define EI__VISA avx512
#define EI__VTARGET EI__TARGET_AVX512
EI__DEFINE_MINMAX()
EI__DEFINE_ROWS_FINITE()
EI__ATTN_DEFINE_STAGES()
EI__DEFINE_SAMPLE_MASS()
EI__DEFINE_ANTIDIAG_GROUP()
EI__DEFINE_DECODE_TILE()
#undef EI__VTARGET
#undef EI__VISA

/* Hand-written: block scores, dot, Q K^T, P V. */
EI__TARGET_AVX512 static void ei__score_row_avx512(const float *qrep, int32_t G, int32_t d, const float *kmaxT,
                                                   const float *kminT, int64_t ld, int64_t nb, float *raw) {
    int64_t b;
    const __m512 half = _mm512_set1_ps(0.5f), gdiv = _mm512_set1_ps((float)G);
    for (b = 0; b < nb; b += 32) { /* two tiles of 16 blocks: 8 independent FMA chains */
        int64_t rem = nb - b;
        __mmask16 m0 = rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1u);
        __mmask16 m1 = rem >= 32 ? (__mmask16)0xffff : rem > 16 ? (__mmask16)((1u << (rem - 16)) - 1u) : (__mmask16)0;
        __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
        int32_t g, i;
        for (g = 0; g < G; ++g) {
            const float *qx = qrep + (size_t)g * 2u * (size_t)d, *qn = qx + d;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
            for (i = 0; i < d; ++i) {
                const float *px = kmaxT + (size_t)i * (size_t)ld + (size_t)b;
                const float *pn = kminT + (size_t)i * (size_t)ld + (size_t)b;
                __m512 bx = _mm512_set1_ps(qx[i]), bn = _mm512_set1_ps(qn[i]);
                __m512 kx0 = _mm512_maskz_loadu_ps(m0, px), kn0 = _mm512_maskz_loadu_ps(m0, pn);
                __m512 kx1 = _mm512_maskz_loadu_ps(m1, px + 16), kn1 = _mm512_maskz_loadu_ps(m1, pn + 16);
                a0 = _mm512_fmadd_ps(bx, kx0, a0); a1 = _mm512_fmadd_ps(bn, kx0, a1);
                a2 = _mm512_fmadd_ps(bx, kn0, a2); a3 = _mm512_fmadd_ps(bn, kn0, a3);
                c0 = _mm512_fmadd_ps(bx, kx1, c0); c1 = _mm512_fmadd_ps(bn, kx1, c1);
                c2 = _mm512_fmadd_ps(bx, kn1, c2); c3 = _mm512_fmadd_ps(bn, kn1, c3);
            }
            sum0 = _mm512_add_ps(sum0, _mm512_max_ps(_mm512_mul_ps(_mm512_add_ps(a0, a1), half),
                                                     _mm512_mul_ps(_mm512_add_ps(a2, a3), half)));
            sum1 = _mm512_add_ps(sum1, _mm512_max_ps(_mm512_mul_ps(_mm512_add_ps(c0, c1), half),
                                                     _mm512_mul_ps(_mm512_add_ps(c2, c3), half)));
        }
        _mm512_mask_storeu_ps(raw + b, m0, _mm512_div_ps(sum0, gdiv));
        if (m1) _mm512_mask_storeu_ps(raw + b + 16, m1, _mm512_div_ps(sum1, gdiv));
    }
}

/* dot(a, b) over d floats (decode scoring). */
EI__TARGET_AVX512 static float ei__dot_avx512(const float *a, const float *b, int32_t d) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int32_t i = 0;
    for (; i + 32 <= d; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i < d; i += 16) {
        __mmask16 m = d - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - i)) - 1u);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

#define EI__PUT512(acc, j, vi) ei__attn_put_scores_avx512(w, T, ld, need_mask, (j), (vi), 0, (acc), cv)
/* S^T = K Q^T for the tile: 2 row vectors (32 rows) x 8 keys per register
   block (16 accumulators; per dim 2 loads of Q^T + 8 broadcasts from key
   rows). Row vectors outside, keys inside: the 32 rows' Q^T (16 KB at
   d = 128) stays in L1 while the key tile streams past. */
EI__TARGET_AVX512 static void ei__attn_scores_avx512(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                     int32_t nk, int need_mask) {
    const int32_t ld = T->ld, d = J->d;
    const __m512 cv = _mm512_set1_ps(J->c);
    int32_t vb, j, i;
    for (vb = 0; vb + 2 <= T->nvec; vb += 2)
        for (j = 0; j < nk; j += 8) {
            const float *k0 = (const float *)w->kp[j], *k1 = (const float *)w->kp[j + 1];
            const float *k2 = (const float *)w->kp[j + 2], *k3 = (const float *)w->kp[j + 3];
            const float *k4 = (const float *)w->kp[j + 4], *k5 = (const float *)w->kp[j + 5];
            const float *k6 = (const float *)w->kp[j + 6], *k7 = (const float *)w->kp[j + 7];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
                   a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00, a60 = a00, a61 = a00, a70 = a00, a71 = a00;
            for (i = 0; i < d; ++i, qp += ld) {
                __m512 q0 = _mm512_load_ps(qp), q1 = _mm512_load_ps(qp + 16), b;
                b = _mm512_set1_ps(k0[i]); a00 = _mm512_fmadd_ps(b, q0, a00); a01 = _mm512_fmadd_ps(b, q1, a01);
                b = _mm512_set1_ps(k1[i]); a10 = _mm512_fmadd_ps(b, q0, a10); a11 = _mm512_fmadd_ps(b, q1, a11);
                b = _mm512_set1_ps(k2[i]); a20 = _mm512_fmadd_ps(b, q0, a20); a21 = _mm512_fmadd_ps(b, q1, a21);
                b = _mm512_set1_ps(k3[i]); a30 = _mm512_fmadd_ps(b, q0, a30); a31 = _mm512_fmadd_ps(b, q1, a31);
                b = _mm512_set1_ps(k4[i]); a40 = _mm512_fmadd_ps(b, q0, a40); a41 = _mm512_fmadd_ps(b, q1, a41);
                b = _mm512_set1_ps(k5[i]); a50 = _mm512_fmadd_ps(b, q0, a50); a51 = _mm512_fmadd_ps(b, q1, a51);
                b = _mm512_set1_ps(k6[i]); a60 = _mm512_fmadd_ps(b, q0, a60); a61 = _mm512_fmadd_ps(b, q1, a61);
                b = _mm512_set1_ps(k7[i]); a70 = _mm512_fmadd_ps(b, q0, a70); a71 = _mm512_fmadd_ps(b, q1, a71);
            }
            EI__PUT512(a00, j, vb); EI__PUT512(a01, j, vb + 1);
            EI__PUT512(a10, j + 1, vb); EI__PUT512(a11, j + 1, vb + 1);
            EI__PUT512(a20, j + 2, vb); EI__PUT512(a21, j + 2, vb + 1);
            EI__PUT512(a30, j + 3, vb); EI__PUT512(a31, j + 3, vb + 1);
            EI__PUT512(a40, j + 4, vb); EI__PUT512(a41, j + 4, vb + 1);
            EI__PUT512(a50, j + 5, vb); EI__PUT512(a51, j + 5, vb + 1);
            EI__PUT512(a60, j + 6, vb); EI__PUT512(a61, j + 6, vb + 1);
            EI__PUT512(a70, j + 7, vb); EI__PUT512(a71, j + 7, vb + 1);
        }
    for (; vb < T->nvec; ++vb) /* a leftover vector (G = 3, 5, 7): one vector x 8 keys */
        for (j = 0; j < nk; j += 8) {
            const float *k0 = (const float *)w->kp[j], *k1 = (const float *)w->kp[j + 1];
            const float *k2 = (const float *)w->kp[j + 2], *k3 = (const float *)w->kp[j + 3];
            const float *k4 = (const float *)w->kp[j + 4], *k5 = (const float *)w->kp[j + 5];
            const float *k6 = (const float *)w->kp[j + 6], *k7 = (const float *)w->kp[j + 7];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (i = 0; i < d; ++i, qp += ld) {
                __m512 q0 = _mm512_load_ps(qp);
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(k0[i]), q0, a0);
                a1 = _mm512_fmadd_ps(_mm512_set1_ps(k1[i]), q0, a1);
                a2 = _mm512_fmadd_ps(_mm512_set1_ps(k2[i]), q0, a2);
                a3 = _mm512_fmadd_ps(_mm512_set1_ps(k3[i]), q0, a3);
                a4 = _mm512_fmadd_ps(_mm512_set1_ps(k4[i]), q0, a4);
                a5 = _mm512_fmadd_ps(_mm512_set1_ps(k5[i]), q0, a5);
                a6 = _mm512_fmadd_ps(_mm512_set1_ps(k6[i]), q0, a6);
                a7 = _mm512_fmadd_ps(_mm512_set1_ps(k7[i]), q0, a7);
            }
            EI__PUT512(a0, j, vb); EI__PUT512(a1, j + 1, vb);
            EI__PUT512(a2, j + 2, vb); EI__PUT512(a3, j + 3, vb);
            EI__PUT512(a4, j + 4, vb); EI__PUT512(a5, j + 5, vb);
            EI__PUT512(a6, j + 6, vb); EI__PUT512(a7, j + 7, vb);
        }
}
#undef EI__PUT512

/* O[r][c0..c0+63] = alpha[r] O[r][..] + sum_j P[j][r] V[j][..]: 64-dim chunks
   outside (its 16 KB value block stays in L1), 4 rows x 64 dims inside. */
EI__TARGET_AVX512 static void ei__attn_pv_avx512(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                 int32_t nk) {
    const int32_t ld = T->ld, dpad = J->dpad;
    int32_t r, c0, j;
    for (c0 = 0; c0 < dpad; c0 += 64) {
        const float *vc = w->vbuf + (size_t)(c0 / 64) * EI__ATTN_NK * 64u;
        for (r = 0; r < ld; r += 4) {
            const __m512 al0 = _mm512_set1_ps(w->alpha[r]), al1 = _mm512_set1_ps(w->alpha[r + 1]),
                         al2 = _mm512_set1_ps(w->alpha[r + 2]), al3 = _mm512_set1_ps(w->alpha[r + 3]);
            float *o0 = w->o + (size_t)r * (size_t)dpad + c0, *o1 = o0 + dpad, *o2 = o1 + dpad, *o3 = o2 + dpad;
            const float *pj = w->s + r, *vr = vc;
            if (c0 + 64 <= dpad) {
                __m512 x00 = _mm512_mul_ps(al0, _mm512_load_ps(o0)), x01 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + 16)),
                       x02 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + 32)), x03 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + 48)),
                       x10 = _mm512_mul_ps(al1, _mm512_load_ps(o1)), x11 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + 16)),
                       x12 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + 32)), x13 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + 48)),
                       x20 = _mm512_mul_ps(al2, _mm512_load_ps(o2)), x21 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + 16)),
                       x22 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + 32)), x23 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + 48)),
                       x30 = _mm512_mul_ps(al3, _mm512_load_ps(o3)), x31 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + 16)),
                       x32 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + 32)), x33 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + 48));
                for (j = 0; j < nk; ++j, pj += ld, vr += 64) {
                    __m512 v0 = _mm512_load_ps(vr), v1 = _mm512_load_ps(vr + 16), v2 = _mm512_load_ps(vr + 32),
                           v3 = _mm512_load_ps(vr + 48), p;
                    p = _mm512_set1_ps(pj[0]);
                    x00 = _mm512_fmadd_ps(p, v0, x00); x01 = _mm512_fmadd_ps(p, v1, x01);
                    x02 = _mm512_fmadd_ps(p, v2, x02); x03 = _mm512_fmadd_ps(p, v3, x03);
                    p = _mm512_set1_ps(pj[1]);
                    x10 = _mm512_fmadd_ps(p, v0, x10); x11 = _mm512_fmadd_ps(p, v1, x11);
                    x12 = _mm512_fmadd_ps(p, v2, x12); x13 = _mm512_fmadd_ps(p, v3, x13);
                    p = _mm512_set1_ps(pj[2]);
                    x20 = _mm512_fmadd_ps(p, v0, x20); x21 = _mm512_fmadd_ps(p, v1, x21);
                    x22 = _mm512_fmadd_ps(p, v2, x22); x23 = _mm512_fmadd_ps(p, v3, x23);
                    p = _mm512_set1_ps(pj[3]);
                    x30 = _mm512_fmadd_ps(p, v0, x30); x31 = _mm512_fmadd_ps(p, v1, x31);
                    x32 = _mm512_fmadd_ps(p, v2, x32); x33 = _mm512_fmadd_ps(p, v3, x33);
                }
                _mm512_store_ps(o0, x00); _mm512_store_ps(o0 + 16, x01); _mm512_store_ps(o0 + 32, x02); _mm512_store_ps(o0 + 48, x03);
                _mm512_store_ps(o1, x10); _mm512_store_ps(o1 + 16, x11); _mm512_store_ps(o1 + 32, x12); _mm512_store_ps(o1 + 48, x13);
                _mm512_store_ps(o2, x20); _mm512_store_ps(o2 + 16, x21); _mm512_store_ps(o2 + 32, x22); _mm512_store_ps(o2 + 48, x23);
                _mm512_store_ps(o3, x30); _mm512_store_ps(o3 + 16, x31); _mm512_store_ps(o3 + 32, x32); _mm512_store_ps(o3 + 48, x33);
            } else {
                int32_t c1;
                for (c1 = 0; c0 + c1 < dpad; c1 += 16) { /* 16-dim pieces of a partial chunk */
                    __m512 x0 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c1)), x1 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c1)),
                           x2 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c1)), x3 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c1));
                    const float *pq = w->s + r, *vq = vc + c1;
                    for (j = 0; j < nk; ++j, pq += ld, vq += 64) {
                        __m512 v0 = _mm512_load_ps(vq);
                        x0 = _mm512_fmadd_ps(_mm512_set1_ps(pq[0]), v0, x0);
                        x1 = _mm512_fmadd_ps(_mm512_set1_ps(pq[1]), v0, x1);
                        x2 = _mm512_fmadd_ps(_mm512_set1_ps(pq[2]), v0, x2);
                        x3 = _mm512_fmadd_ps(_mm512_set1_ps(pq[3]), v0, x3);
                    }
                    _mm512_store_ps(o0 + c1, x0); _mm512_store_ps(o1 + c1, x1);
                    _mm512_store_ps(o2 + c1, x2); _mm512_store_ps(o3 + c1, x3);
                }
            }
        }
    }
}

static const ei__attn_stages ei__attn_avx512 = {ei__attn_pack_q_f32, ei__attn_prep_kv_avx512, ei__attn_scores_avx512,
                                                ei__attn_softmax_avx512, NULL, ei__attn_pv_avx512, ei__attn_store_avx512};
/* EI_RANK_PRECISION_INT8 on zmm: keys rounded as ei__rank_keys_extend_avx2
   rounds them (the same bytes), 16 elements at a time; then vpdpbusd
   (AVX512_VNNI), 32 rows in two vectors, 8 keys at a time: a group of 4
   bytes of q + 128 against the key's broadcast group, less 128 x the key's
   sum; sc s_q s_k times the sum, as the plain scores. A CPU without
   AVX512_VNNI takes the ymm scores (ei__rank_scores_i8_ymm). */
EI__TARGET_AVX512 static int ei__rank_keys_extend_avx512(ei__rank_keys *kc, const ei_tensor *k, int32_t kvh, int64_t j1,
                                                         float *row) {
    const int32_t d = k->head_dim, dp = (int32_t)ei__round_up(d, 16), dq = (int32_t)ei__round_up(d, 4);
    const __m512 one = _mm512_set1_ps(1.0f);
    int32_t c0;
    int bad = 0;
    for (; kc->n < j1; ++kc->n) {
        int8_t *k8 = kc->k + (size_t)kc->n * (size_t)dq;
        __m512 m = _mm512_setzero_ps(), sv;
        __m512i sum = _mm512_setzero_si512();
        __mmask16 nan = 0;
        float s;
        ei__attn_row_f32_avx512(ei__row(k, kc->n, kvh), k->dtype, d, dp, row);
        for (c0 = 0; c0 < dq; c0 += 16) {
            __m512 x = _mm512_loadu_ps(row + c0), z = _mm512_sub_ps(x, x);
            nan |= _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q);
            m = _mm512_max_ps(m, _mm512_abs_ps(x));
        }
        s = _mm512_reduce_max_ps(m) / 127.0f;
        if (nan) {
            bad = 1;
            s = 0.0f;
        }
        kc->s[kc->n] = s;
        sv = _mm512_set1_ps(s > 0.0f ? s : 1.0f);
        for (c0 = 0; c0 < dq; c0 += 16) {
            __m512 x = _mm512_div_ps(_mm512_loadu_ps(row + c0), sv);
            __m512 r = _mm512_roundscale_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(x, r);
            __m512i v;
            r = _mm512_mask_add_ps(r, _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ), r, one);
            r = _mm512_mask_sub_ps(r, _mm512_cmp_ps_mask(f, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), r, one);
            r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
            v = s > 0.0f ? _mm512_cvtps_epi32(r) : _mm512_setzero_si512();
            sum = _mm512_add_epi32(sum, v);
            _mm512_mask_cvtepi32_storeu_epi8(k8 + c0, (__mmask16)(dq - c0 >= 16 ? 0xffffu : (1u << (dq - c0)) - 1u), v);
        }
        kc->sum128[kc->n] = 128 * _mm512_reduce_add_epi32(sum);
    }
    return bad;
}
#ifdef EI__HAVE_AVX512VNNI
EI__TARGET_AVX512VNNI static int ei__rank_scores_i8_avx512vnni(const void *qx, const ei_tensor *k, int32_t kvh,
                                                               const int32_t *krow, int64_t j0, int64_t nk, float *kbuf,
                                                               float scf, float *tl) {
    enum { R = EI__SAMPLE_ROWS };
    const ei__rank_q8 *q = (const ei__rank_q8 *)qx;
    const ei__rank_keys *kc = q->kc;
    const int32_t dq = q->dq, ng = dq / 4;
    const __m512 r0 = _mm512_mul_ps(_mm512_set1_ps(scf), _mm512_loadu_ps(q->s)),
                 r1 = _mm512_mul_ps(_mm512_set1_ps(scf), _mm512_loadu_ps(q->s + 16));
    __mmask16 nan = 0;
    int64_t j;
    int32_t g, u;
    (void)k; (void)kvh; (void)krow; (void)kbuf; /* keys in position order, rounded before (kc) */
    for (j = 0; j < nk; j += 8) { /* 8 keys x 32 rows, accumulators in registers (named: arrays of them spill) */
        const int8_t *k0 = kc->k + (size_t)(j0 + EI__MIN(j + 0, nk - 1)) * (size_t)dq,
                     *k1 = kc->k + (size_t)(j0 + EI__MIN(j + 1, nk - 1)) * (size_t)dq,
                     *k2 = kc->k + (size_t)(j0 + EI__MIN(j + 2, nk - 1)) * (size_t)dq,
                     *k3 = kc->k + (size_t)(j0 + EI__MIN(j + 3, nk - 1)) * (size_t)dq,
                     *k4 = kc->k + (size_t)(j0 + EI__MIN(j + 4, nk - 1)) * (size_t)dq,
                     *k5 = kc->k + (size_t)(j0 + EI__MIN(j + 5, nk - 1)) * (size_t)dq,
                     *k6 = kc->k + (size_t)(j0 + EI__MIN(j + 6, nk - 1)) * (size_t)dq,
                     *k7 = kc->k + (size_t)(j0 + EI__MIN(j + 7, nk - 1)) * (size_t)dq;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        __m512i b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
        __m512i acc[2][8];
        for (g = 0; g < ng; ++g) {
            const __m512i q0 = _mm512_loadu_si512(q->qu + (size_t)g * R * 4u), q1 = _mm512_loadu_si512(q->qu + (size_t)g * R * 4u + 64);
            __m512i kb;
            kb = _mm512_set1_epi32(ei__ld32(k0 + (size_t)g * 4u)); a0 = _mm512_dpbusd_epi32(a0, q0, kb); b0 = _mm512_dpbusd_epi32(b0, q1, kb);
            kb = _mm512_set1_epi32(ei__ld32(k1 + (size_t)g * 4u)); a1 = _mm512_dpbusd_epi32(a1, q0, kb); b1 = _mm512_dpbusd_epi32(b1, q1, kb);
            kb = _mm512_set1_epi32(ei__ld32(k2 + (size_t)g * 4u)); a2 = _mm512_dpbusd_epi32(a2, q0, kb); b2 = _mm512_dpbusd_epi32(b2, q1, kb);
            kb = _mm512_set1_epi32(ei__ld32(k3 + (size_t)g * 4u)); a3 = _mm512_dpbusd_epi32(a3, q0, kb); b3 = _mm512_dpbusd_epi32(b3, q1, kb);
            kb = _mm512_set1_epi32(ei__ld32(k4 + (size_t)g * 4u)); a4 = _mm512_dpbusd_epi32(a4, q0, kb); b4 = _mm512_dpbusd_epi32(b4, q1, kb);
            kb = _mm512_set1_epi32(ei__ld32(k5 + (size_t)g * 4u)); a5 = _mm512_dpbusd_epi32(a5, q0, kb); b5 = _mm512_dpbusd_epi32(b5, q1, kb);
            kb = _mm512_set1_epi32(ei__ld32(k6 + (size_t)g * 4u)); a6 = _mm512_dpbusd_epi32(a6, q0, kb); b6 = _mm512_dpbusd_epi32(b6, q1, kb);
            kb = _mm512_set1_epi32(ei__ld32(k7 + (size_t)g * 4u)); a7 = _mm512_dpbusd_epi32(a7, q0, kb); b7 = _mm512_dpbusd_epi32(b7, q1, kb);
        }
        acc[0][0] = a0; acc[0][1] = a1; acc[0][2] = a2; acc[0][3] = a3; acc[0][4] = a4; acc[0][5] = a5; acc[0][6] = a6; acc[0][7] = a7;
        acc[1][0] = b0; acc[1][1] = b1; acc[1][2] = b2; acc[1][3] = b3; acc[1][4] = b4; acc[1][5] = b5; acc[1][6] = b6; acc[1][7] = b7;
        for (u = 0; u < 8 && j + u < nk; ++u) {
            const __m512i corr = _mm512_set1_epi32(kc->sum128[j0 + j + u]);
            const __m512 ks = _mm512_set1_ps(kc->s[j0 + j + u]);
            __m512 x0 = _mm512_mul_ps(_mm512_mul_ps(r0, ks), _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[0][u], corr)));
            __m512 x1 = _mm512_mul_ps(_mm512_mul_ps(r1, ks), _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[1][u], corr)));
            __m512 z0 = _mm512_sub_ps(x0, x0), z1 = _mm512_sub_ps(x1, x1); /* NaN for NaN and +-inf */
            nan |= _mm512_cmp_ps_mask(z0, z0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(z1, z1, _CMP_UNORD_Q);
            _mm512_storeu_ps(tl + (size_t)(j + u) * R, x0);
            _mm512_storeu_ps(tl + (size_t)(j + u) * R + 16, x1);
        }
    }
    return nan != 0;
}
#endif
/* rank_mass_i8 of the AVX-512 paths: the avx512 walk over the widest int8
   scores this CPU and build have. */
EI__TARGET_AVX512 static int ei__rank_mass_i8_avx512(const ei__rank_q8 *q, const int64_t *tok, int32_t nr, const ei_tensor *k,
                                                     int32_t kvh, float scale, int32_t bs, int64_t nvis, float *lg,
                                                     float *kbuf, float *mass) {
    ei__sample_scores_fn scores = ei__rank_scores_i8_scalar;
#ifdef EI__HAVE_AVX2
    scores = ei__rank_scores_i8_ymm(q->dot);
#endif
#ifdef EI__HAVE_AVX512VNNI
    if (q->dot & EI__I8DOT_AVX512VNNI) scores = ei__rank_scores_i8_avx512vnni;
#endif
    if (ei__rank_keys_extend_avx512(q->kc, k, kvh, tok[nr - 1] + 1, kbuf)) return 0;
    return ei__sample_mass_by_avx512(scores, q, tok, nr, k, kvh, scale, bs, nvis, lg, kbuf, mass, NULL);
}

/* EI_RANK_ROWS_SPREAD's dots: 32 int8 widened to int16, vpmaddwd (exact). */
EI__TARGET_AVX512 static void ei__spread_dots_avx512(const int8_t *cand, int64_t n, int32_t dq, const int8_t *p,
                                                     int32_t *out) {
    int64_t c;
    for (c = 0; c < n; ++c) {
        const int8_t *x = cand + (size_t)c * (size_t)dq;
        __m512i acc = _mm512_setzero_si512();
        int32_t i = 0, tail = 0;
        for (; i + 32 <= dq; i += 32)
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(x + i))),
                                                          _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + i)))));
        for (; i < dq; ++i) tail += (int32_t)x[i] * p[i];
        out[c] = _mm512_reduce_add_epi32(acc) + tail;
    }
}
#ifdef EI__HAVE_AVX512VNNI
/* spread_step on vpdpbusd: 16 candidates a vector, 4 bytes of each per
   instruction (the row's bytes + 128 as the unsigned operand, 128 x the
   candidate's byte sum taken off after: exact), 64 candidates at a time;
   then the cosines in double, 8 lanes, and the smallest with its
   candidate, lanes kept apart until the end so that ties go to the
   earliest candidate as in the plain loop. */
EI__TARGET_AVX512VNNI static int64_t ei__spread_step_avx512vnni(const int8_t *t, const int32_t *sum128, int64_t n, int32_t dq,
                                                                const int8_t *p, double rp, const double *r, double *best) {
    const int64_t n16 = ei__round_up(n, 16);
    const int32_t ng = dq / 4;
    const __m512d vrp = _mm512_set1_pd(rp);
    __m512d bv = _mm512_set1_pd(4.0); /* per lane: the smallest so far and its candidate */
    __m512i bi = _mm512_setzero_si512(), idx = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    int32_t dots[64];
    int64_t c, next = 0;
    int32_t g, u;
    double bmin = 4.0;
    for (c = 0; c < n16; c += 64) {
        const int32_t nv = (int32_t)EI__MIN((int64_t)4, (n16 - c) / 16);
        const int8_t *tc = t + (size_t)c * 4u;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        if (nv == 4)
            for (g = 0; g < ng; ++g) {
                const __m512i pb = _mm512_set1_epi32((int32_t)(ei__ld32(p + (size_t)g * 4u) ^ 0x80808080u));
                const int8_t *tg = tc + (size_t)g * (size_t)n16 * 4u;
                a0 = _mm512_dpbusd_epi32(a0, pb, _mm512_loadu_si512(tg));
                a1 = _mm512_dpbusd_epi32(a1, pb, _mm512_loadu_si512(tg + 64));
                a2 = _mm512_dpbusd_epi32(a2, pb, _mm512_loadu_si512(tg + 128));
                a3 = _mm512_dpbusd_epi32(a3, pb, _mm512_loadu_si512(tg + 192));
            }
        else
            for (g = 0; g < ng; ++g) {
                const __m512i pb = _mm512_set1_epi32((int32_t)(ei__ld32(p + (size_t)g * 4u) ^ 0x80808080u));
                const int8_t *tg = tc + (size_t)g * (size_t)n16 * 4u;
                a0 = _mm512_dpbusd_epi32(a0, pb, _mm512_loadu_si512(tg));
                if (nv > 1) a1 = _mm512_dpbusd_epi32(a1, pb, _mm512_loadu_si512(tg + 64));
                if (nv > 2) a2 = _mm512_dpbusd_epi32(a2, pb, _mm512_loadu_si512(tg + 128));
            }
        _mm512_storeu_si512(dots, _mm512_sub_epi32(a0, _mm512_loadu_si512(sum128 + c)));
        if (nv > 1) _mm512_storeu_si512(dots + 16, _mm512_sub_epi32(a1, _mm512_loadu_si512(sum128 + c + 16)));
        if (nv > 2) _mm512_storeu_si512(dots + 32, _mm512_sub_epi32(a2, _mm512_loadu_si512(sum128 + c + 32)));
        if (nv > 3) _mm512_storeu_si512(dots + 48, _mm512_sub_epi32(a3, _mm512_loadu_si512(sum128 + c + 48)));
        for (u = 0; u < nv * 16; u += 8) { /* 8 candidates: cosine, largest so far, smallest of those */
            const int64_t b = c + u;
            const __mmask8 in = (__mmask8)(b + 8 <= n ? 0xffu : b < n ? (1u << (n - b)) - 1u : 0u);
            __m512d cs, bs;
            __mmask8 lt;
            if (!in) break;
            cs = _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm256_loadu_si256((const __m256i *)(dots + u))),
                                             _mm512_maskz_loadu_pd(in, r + b)), vrp);
            bs = _mm512_maskz_loadu_pd(in, best + b);
            bs = _mm512_mask_mov_pd(bs, _mm512_cmp_pd_mask(cs, bs, _CMP_GT_OQ), cs);
            _mm512_mask_storeu_pd(best + b, in, bs);
            lt = _mm512_mask_cmp_pd_mask(in, bs, bv, _CMP_LT_OQ);
            bv = _mm512_mask_mov_pd(bv, lt, bs);
            bi = _mm512_mask_mov_epi64(bi, lt, _mm512_add_epi64(idx, _mm512_set1_epi64(b)));
        }
    }
    { /* the lanes' minima: the smallest value, the earliest candidate among equals */
        double v[8];
        int64_t ix[8];
        _mm512_storeu_pd(v, bv);
        _mm512_storeu_si512(ix, bi);
        for (u = 0; u < 8; ++u)
            if (v[u] < bmin || (v[u] == bmin && ix[u] < next)) {
                bmin = v[u];
                next = ix[u];
            }
    }
    return next;
}
#define EI__SPREAD_STEP_AVX512 ei__spread_step_avx512vnni
#else
#define EI__SPREAD_STEP_AVX512 NULL
#endif
static const ei__kernels ei__kernels_avx512 = {EI_SIMD_AVX512, ei__minmax_avx512, ei__rows_finite_avx512, ei__score_row_avx512, ei__dot_avx512,
                                               ei__sample_mass_avx512, ei__sample_mass_avx512, ei__rank_mass_i8_avx512,
                                               ei__rank_keys_extend_avx512, &ei__attn_avx512, NULL, NULL, ei__attn_decode_tile_avx512,
                                               ei__antidiag_group_avx512, EI__SAMPLE_ROWS, ei__spread_dots_avx512, EI__SPREAD_STEP_AVX512};
#endif /* EI__HAVE_AVX512 */

// >>isa-avx512bf16: AVX512_BF16 (vdpbf16ps) attention for bf16 q, k, v ------
#ifdef EI__HAVE_AVX512BF16
/* vdpbf16ps for Q K^T (bf16 products exact, f32 sums) and for P V with P
   rounded to bf16; softmax, output store, profiling and decode are the
   AVX-512 path's. Opt-in (>>attention, Kernels, says why). Hand-written:
   the pair layouts (queries, values and P as bf16 pairs) have no f32
   counterpart. */
/* bf16 kernel: queries as u32 pairs (ei__attn_pack_q_pairs); keys read in place. */
/* Values as key pairs: vbuf[j2][i] = (v[2 j2][i], v[2 j2 + 1][i]) as two bf16. */
EI__TARGET_AVX512BF16 static void ei__attn_prep_kv_avx512bf16(const ei__attn_job *J, ei__attn_ws *w,
                                                              const ei__attn_tile *T, int32_t nk) {
    static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i ilo = _mm512_loadu_si512(lo_idx), ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
    const int32_t d = J->d, dpad = J->dpad;
    uint16_t *vb = (uint16_t *)w->vbuf;
    int32_t j, c0;
    for (j = 0; j < nk; ++j) w->kp[j] = ei__row(J->k, w->kpos[j], T->kvh);
    for (; j < ((nk + 7) & ~7); ++j) w->kp[j] = w->kp[nk - 1];
    for (j = 0; j < nk; j += 2) {
        const uint16_t *va = (const uint16_t *)ei__row(J->v, w->kpos[j], T->kvh);
        const uint16_t *vbr = j + 1 < nk ? (const uint16_t *)ei__row(J->v, w->kpos[j + 1], T->kvh) : NULL;
        uint16_t *dst = vb + (size_t)(j / 2) * (size_t)dpad * 2u;
        for (c0 = 0; c0 < dpad; c0 += 32) {
            int32_t rem = d - c0;
            __mmask32 m = rem >= 32 ? (__mmask32)0xffffffffu : rem > 0 ? (__mmask32)((1u << rem) - 1u) : (__mmask32)0;
            __m512i a = _mm512_maskz_loadu_epi16(m, va + c0);
            __m512i b = vbr ? _mm512_maskz_loadu_epi16(m, vbr + c0) : _mm512_setzero_si512();
            _mm512_storeu_si512(dst + 2 * c0, _mm512_permutex2var_epi16(a, ilo, b));
            if (c0 + 16 < dpad) _mm512_storeu_si512(dst + 2 * c0 + 32, _mm512_permutex2var_epi16(a, ihi, b));
        }
    }
}
static uint32_t ei__attn_u32(const void *p) { uint32_t u; memcpy(&u, p, 4); return u; }
#define EI__ATTN_BCAST(ptr, i2) _mm512_set1_epi32((int)ei__attn_u32((const unsigned char *)(ptr) + 4 * (i2)))
#define EI__ATTN_DP(acc, a, b) acc = _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
#define EI__PUT512(acc, j, vi) ei__attn_put_scores_avx512(w, T, ld, need_mask, (j), (vi), 0, (acc), cv)

EI__TARGET_AVX512BF16 static void ei__attn_scores_avx512bf16(const ei__attn_job *J, ei__attn_ws *w,
                                                             const ei__attn_tile *T, int32_t nk, int need_mask) {
    const int32_t ld = T->ld, d2 = J->d / 2;
    const __m512 cv = _mm512_set1_ps(J->c);
    int32_t vb, j, i;
    for (vb = 0; vb + 4 <= T->nvec; vb += 4)
        for (j = 0; j < nk; j += 4) {
            const void *k0 = w->kp[j], *k1 = w->kp[j + 1], *k2 = w->kp[j + 2], *k3 = w->kp[j + 3];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
                   a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
            for (i = 0; i < d2; ++i, qp += ld) {
                __m512i q0 = _mm512_load_si512(qp), q1 = _mm512_load_si512(qp + 16), q2 = _mm512_load_si512(qp + 32),
                        q3 = _mm512_load_si512(qp + 48), b;
                b = EI__ATTN_BCAST(k0, i);
                EI__ATTN_DP(a00, b, q0); EI__ATTN_DP(a01, b, q1); EI__ATTN_DP(a02, b, q2); EI__ATTN_DP(a03, b, q3);
                b = EI__ATTN_BCAST(k1, i);
                EI__ATTN_DP(a10, b, q0); EI__ATTN_DP(a11, b, q1); EI__ATTN_DP(a12, b, q2); EI__ATTN_DP(a13, b, q3);
                b = EI__ATTN_BCAST(k2, i);
                EI__ATTN_DP(a20, b, q0); EI__ATTN_DP(a21, b, q1); EI__ATTN_DP(a22, b, q2); EI__ATTN_DP(a23, b, q3);
                b = EI__ATTN_BCAST(k3, i);
                EI__ATTN_DP(a30, b, q0); EI__ATTN_DP(a31, b, q1); EI__ATTN_DP(a32, b, q2); EI__ATTN_DP(a33, b, q3);
            }
            EI__PUT512(a00, j, vb); EI__PUT512(a01, j, vb + 1);
            EI__PUT512(a02, j, vb + 2); EI__PUT512(a03, j, vb + 3);
            EI__PUT512(a10, j + 1, vb); EI__PUT512(a11, j + 1, vb + 1);
            EI__PUT512(a12, j + 1, vb + 2); EI__PUT512(a13, j + 1, vb + 3);
            EI__PUT512(a20, j + 2, vb); EI__PUT512(a21, j + 2, vb + 1);
            EI__PUT512(a22, j + 2, vb + 2); EI__PUT512(a23, j + 2, vb + 3);
            EI__PUT512(a30, j + 3, vb); EI__PUT512(a31, j + 3, vb + 1);
            EI__PUT512(a32, j + 3, vb + 2); EI__PUT512(a33, j + 3, vb + 3);
        }
    for (; vb < T->nvec; ++vb)
        for (j = 0; j < nk; j += 4) {
            const void *k0 = w->kp[j], *k1 = w->kp[j + 1], *k2 = w->kp[j + 2], *k3 = w->kp[j + 3];
            const float *qp = w->qt + (size_t)vb * 16u;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (i = 0; i < d2; ++i, qp += ld) {
                __m512i q0 = _mm512_load_si512(qp), b;
                b = EI__ATTN_BCAST(k0, i); EI__ATTN_DP(a0, b, q0);
                b = EI__ATTN_BCAST(k1, i); EI__ATTN_DP(a1, b, q0);
                b = EI__ATTN_BCAST(k2, i); EI__ATTN_DP(a2, b, q0);
                b = EI__ATTN_BCAST(k3, i); EI__ATTN_DP(a3, b, q0);
            }
            EI__PUT512(a0, j, vb); EI__PUT512(a1, j + 1, vb);
            EI__PUT512(a2, j + 2, vb); EI__PUT512(a3, j + 3, vb);
        }
}

#undef EI__PUT512

/* P (f32 [j][r]) -> bf16 pairs pp[j2][r] = (P[2 j2][r], P[2 j2 + 1][r]). */
EI__TARGET_AVX512BF16 static void ei__attn_pack_p_avx512bf16(ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {
    static const uint16_t il_idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i il = _mm512_loadu_si512(il_idx);
    const int32_t ld = T->ld;
    int32_t j, vi;
    for (j = 0; j < nk; j += 2)
        for (vi = 0; vi < T->nvec; ++vi) {
            __m512 a = _mm512_load_ps(w->s + (size_t)j * (size_t)ld + (size_t)vi * 16u);
            __m512 b = j + 1 < nk ? _mm512_load_ps(w->s + (size_t)(j + 1) * (size_t)ld + (size_t)vi * 16u) : _mm512_setzero_ps();
            __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* low 16: a, high 16: b */
            _mm512_store_si512(w->pp + (size_t)(j / 2) * (size_t)ld + (size_t)vi * 16u, _mm512_permutexvar_epi16(il, ab));
        }
}

EI__TARGET_AVX512BF16 static void ei__attn_pv_avx512bf16(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                         int32_t nk) {
    const int32_t ld = T->ld, dpad = J->dpad, n2 = (nk + 1) / 2;
    const uint16_t *vb = (const uint16_t *)w->vbuf;
    int32_t r, c0, j;
    for (r = 0; r < ld; r += 4) {
        const __m512 al0 = _mm512_set1_ps(w->alpha[r]), al1 = _mm512_set1_ps(w->alpha[r + 1]),
                     al2 = _mm512_set1_ps(w->alpha[r + 2]), al3 = _mm512_set1_ps(w->alpha[r + 3]);
        float *o0 = w->o + (size_t)r * (size_t)dpad, *o1 = o0 + dpad, *o2 = o1 + dpad, *o3 = o2 + dpad;
        for (c0 = 0; c0 + 64 <= dpad; c0 += 64) {
            __m512 x00 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c0)), x01 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c0 + 16)),
                   x02 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c0 + 32)), x03 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c0 + 48)),
                   x10 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c0)), x11 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c0 + 16)),
                   x12 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c0 + 32)), x13 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c0 + 48)),
                   x20 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c0)), x21 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c0 + 16)),
                   x22 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c0 + 32)), x23 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c0 + 48)),
                   x30 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c0)), x31 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c0 + 16)),
                   x32 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c0 + 32)), x33 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c0 + 48));
            const uint32_t *pj = w->pp + r;
            for (j = 0; j < n2; ++j, pj += ld) {
                const uint16_t *vr = vb + ((size_t)j * (size_t)dpad + (size_t)c0) * 2u;
                __m512i v0 = _mm512_loadu_si512(vr), v1 = _mm512_loadu_si512(vr + 32), v2 = _mm512_loadu_si512(vr + 64),
                        v3 = _mm512_loadu_si512(vr + 96), p;
                p = _mm512_set1_epi32((int)pj[0]);
                EI__ATTN_DP(x00, p, v0); EI__ATTN_DP(x01, p, v1); EI__ATTN_DP(x02, p, v2); EI__ATTN_DP(x03, p, v3);
                p = _mm512_set1_epi32((int)pj[1]);
                EI__ATTN_DP(x10, p, v0); EI__ATTN_DP(x11, p, v1); EI__ATTN_DP(x12, p, v2); EI__ATTN_DP(x13, p, v3);
                p = _mm512_set1_epi32((int)pj[2]);
                EI__ATTN_DP(x20, p, v0); EI__ATTN_DP(x21, p, v1); EI__ATTN_DP(x22, p, v2); EI__ATTN_DP(x23, p, v3);
                p = _mm512_set1_epi32((int)pj[3]);
                EI__ATTN_DP(x30, p, v0); EI__ATTN_DP(x31, p, v1); EI__ATTN_DP(x32, p, v2); EI__ATTN_DP(x33, p, v3);
            }
            _mm512_store_ps(o0 + c0, x00); _mm512_store_ps(o0 + c0 + 16, x01);
            _mm512_store_ps(o0 + c0 + 32, x02); _mm512_store_ps(o0 + c0 + 48, x03);
            _mm512_store_ps(o1 + c0, x10); _mm512_store_ps(o1 + c0 + 16, x11);
            _mm512_store_ps(o1 + c0 + 32, x12); _mm512_store_ps(o1 + c0 + 48, x13);
            _mm512_store_ps(o2 + c0, x20); _mm512_store_ps(o2 + c0 + 16, x21);
            _mm512_store_ps(o2 + c0 + 32, x22); _mm512_store_ps(o2 + c0 + 48, x23);
            _mm512_store_ps(o3 + c0, x30); _mm512_store_ps(o3 + c0 + 16, x31);
            _mm512_store_ps(o3 + c0 + 32, x32); _mm512_store_ps(o3 + c0 + 48, x33);
        }
        for (; c0 < dpad; c0 += 16) {
            __m512 x0 = _mm512_mul_ps(al0, _mm512_load_ps(o0 + c0)), x1 = _mm512_mul_ps(al1, _mm512_load_ps(o1 + c0)),
                   x2 = _mm512_mul_ps(al2, _mm512_load_ps(o2 + c0)), x3 = _mm512_mul_ps(al3, _mm512_load_ps(o3 + c0));
            const uint32_t *pj = w->pp + r;
            for (j = 0; j < n2; ++j, pj += ld) {
                __m512i v0 = _mm512_loadu_si512(vb + ((size_t)j * (size_t)dpad + (size_t)c0) * 2u), p;
                p = _mm512_set1_epi32((int)pj[0]); EI__ATTN_DP(x0, p, v0);
                p = _mm512_set1_epi32((int)pj[1]); EI__ATTN_DP(x1, p, v0);
                p = _mm512_set1_epi32((int)pj[2]); EI__ATTN_DP(x2, p, v0);
                p = _mm512_set1_epi32((int)pj[3]); EI__ATTN_DP(x3, p, v0);
            }
            _mm512_store_ps(o0 + c0, x0); _mm512_store_ps(o1 + c0, x1);
            _mm512_store_ps(o2 + c0, x2); _mm512_store_ps(o3 + c0, x3);
        }
    }
}

/* EI_RANK_SAMPLED's tile scores with vdpbf16ps (bf16 k, even head_dim):
   qx is the batch's rows as bf16 pairs [d/2][EI__SAMPLE_ROWS] (q rounded to
   bf16, as the GPU's tensor cores round it), keys read in place as pairs;
   bf16 products are exact, sums f32. Twice the f32 kernel's FLOP rate where
   the path is chosen (ei_cpu_dpbf16_ratio >= 1.25), and no widening of the
   keys. The contract: ei__sample_scores_<isa> (EI__DEFINE_SAMPLE_MASS). */
EI__TARGET_AVX512BF16 static int ei__sample_scores_dpbf16(const void *qx, const ei_tensor *k, int32_t kvh,
                                                          const int32_t *krow, int64_t j0, int64_t nk, float *kbuf,
                                                          float scf, float *tl) {
    enum { R = EI__SAMPLE_ROWS };
    const uint32_t *qp = (const uint32_t *)qx;
    const int32_t d2 = k->head_dim / 2;
    const __m512 sc = _mm512_set1_ps(scf);
    __mmask16 bad = 0;
    int64_t j;
    int32_t i, u, r;
    (void)kbuf;
    for (j = 0; j < nk; j += 8) { /* 8 keys x 32 rows, accumulators in registers */
        const void *kr[8];
        __m512 a[8], b[8];
        for (u = 0; u < 8; ++u) {
            int64_t jj = j0 + EI__MIN(j + u, nk - 1);
            kr[u] = ei__row(k, krow ? krow[jj] : jj, kvh);
            a[u] = b[u] = _mm512_setzero_ps();
        }
        for (i = 0; i < d2; ++i) {
            __m512i q0 = _mm512_loadu_si512(qp + (size_t)i * R), q1 = _mm512_loadu_si512(qp + (size_t)i * R + 16), kb;
            kb = EI__ATTN_BCAST(kr[0], i); EI__ATTN_DP(a[0], kb, q0); EI__ATTN_DP(b[0], kb, q1);
            kb = EI__ATTN_BCAST(kr[1], i); EI__ATTN_DP(a[1], kb, q0); EI__ATTN_DP(b[1], kb, q1);
            kb = EI__ATTN_BCAST(kr[2], i); EI__ATTN_DP(a[2], kb, q0); EI__ATTN_DP(b[2], kb, q1);
            kb = EI__ATTN_BCAST(kr[3], i); EI__ATTN_DP(a[3], kb, q0); EI__ATTN_DP(b[3], kb, q1);
            kb = EI__ATTN_BCAST(kr[4], i); EI__ATTN_DP(a[4], kb, q0); EI__ATTN_DP(b[4], kb, q1);
            kb = EI__ATTN_BCAST(kr[5], i); EI__ATTN_DP(a[5], kb, q0); EI__ATTN_DP(b[5], kb, q1);
            kb = EI__ATTN_BCAST(kr[6], i); EI__ATTN_DP(a[6], kb, q0); EI__ATTN_DP(b[6], kb, q1);
            kb = EI__ATTN_BCAST(kr[7], i); EI__ATTN_DP(a[7], kb, q0); EI__ATTN_DP(b[7], kb, q1);
        }
        for (u = 0; u < 8 && j + u < nk; ++u)
            for (r = 0; r < 2; ++r) {
                __m512 x = _mm512_mul_ps(r ? b[u] : a[u], sc), z = _mm512_sub_ps(x, x); /* z: NaN for NaN and +-inf */
                bad |= _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q);
                _mm512_storeu_ps(tl + (size_t)(j + u) * R + (size_t)(r * 16), x);
            }
    }
    return bad != 0;
}
/* The ranking's sampled block mass on the avx512-bf16 path (rank_mass; decode
   scores keep ei__sample_mass_avx512): vdpbf16ps scores for bf16
   keys of even head_dim (the batch's rows packed as bf16 pairs into kbuf,
   which these scores do not use for keys: d/2 x 32 words, within its
   ei__sample_tile_keys x d floats), else the avx512 kernel. */
EI__TARGET_AVX512BF16 static int ei__sample_mass_avx512bf16(const float *qt, const int64_t *tok, int32_t nr,
                                                            const ei_tensor *k, int32_t kvh, float scale, int32_t bs,
                                                            int64_t nvis, float *lg, float *kbuf, float *mass,
                                                            const int32_t *krow) {
    enum { R = EI__SAMPLE_ROWS };
    uint32_t *qp = (uint32_t *)(void *)kbuf;
    int32_t i, r;
    if (k->dtype != EI_BF16 || k->head_dim % 2)
        return ei__sample_mass_avx512(qt, tok, nr, k, kvh, scale, bs, nvis, lg, kbuf, mass, krow);
    for (i = 0; i < k->head_dim / 2; ++i)
        for (r = 0; r < R; ++r)
            qp[(size_t)i * R + (size_t)r] = (uint32_t)ei__f32_to_bf16(qt[(size_t)(2 * i) * R + (size_t)r]) |
                                            (uint32_t)ei__f32_to_bf16(qt[(size_t)(2 * i + 1) * R + (size_t)r]) << 16;
    return ei__sample_mass_by_avx512(ei__sample_scores_dpbf16, qp, tok, nr, k, kvh, scale, bs, nvis, lg, kbuf, mass,
                                     krow);
}

static const ei__attn_stages ei__attn_avx512bf16 = {ei__attn_pack_q_pairs, ei__attn_prep_kv_avx512bf16,
                                                    ei__attn_scores_avx512bf16, ei__attn_softmax_avx512,
                                                    ei__attn_pack_p_avx512bf16, ei__attn_pv_avx512bf16,
                                                    ei__attn_store_avx512};
static const ei__kernels ei__kernels_avx512bf16 = {EI_SIMD_AVX512_BF16, ei__minmax_avx512, ei__rows_finite_avx512,
                                                   ei__score_row_avx512,
                                                   ei__dot_avx512, ei__sample_mass_avx512, ei__sample_mass_avx512bf16,
                                                   ei__rank_mass_i8_avx512, ei__rank_keys_extend_avx512, &ei__attn_avx512,
                                                   &ei__attn_avx512bf16, NULL, ei__attn_decode_tile_avx512,
                                                   ei__antidiag_group_avx512, EI__SAMPLE_ROWS, ei__spread_dots_avx512, EI__SPREAD_STEP_AVX512};
#endif /* EI__HAVE_AVX512BF16 */

// >>isa-amx: AMX-BF16 tiles for bf16 q, k, v ---------------------------------
#ifdef EI__HAVE_AMX
/* Q K^T and P V on AMX tiles (tdpbf16ps: 16 x 16 f32 += 16 x 32 bf16 times
   32 x 16 bf16, bf16 products exact, f32 sums, P rounded to bf16 as in the
   vdpbf16ps kernel); the softmax and output store are vector code. The
   tile layout differs from the vector kernels' (rows are not in lanes):
   scores are row-major, S[r][j] at w->s + r * EI__ATTN_NK + j, because the
   P V tile multiply needs P row-major. Tiles: palette 1, eight 16 x 64-byte
   registers, configured at the start of each tile stage and released at
   its end (so no tile state lives between calls).
     pack_q   Q row-major bf16 [ld][d32] (d32: head_dim rounded up to 32,
              zero-padded) in w->qt
     prep_kv  K^T as bf16 pairs [d32/2][EI__ATTN_NK] in w->kbuf (the B
              operand of S = Q K^T), V as key pairs in w->vbuf (the
              vdpbf16ps kernel's layout: the B operand of O += P V); key
              slots past nk are zero
     scores   S = Q K^T, then scale, clamp and causal mask
     softmax  online softmax along each row
     pack_p   P row-major bf16 [ld][EI__ATTN_NK] in w->pp
     pv       O = O alpha + P V */
typedef struct ei__amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ei__amx_cfg;
EI__TARGET_AMX static void ei__amx_begin(void) {
    ei__amx_cfg c;
    int i;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (i = 0; i < 8; ++i) { c.colsb[i] = 64; c.rows[i] = 16; }
    /* gcc 12 at -O1 does not see that ldtilecfg reads all 64 bytes of c: it
       dropped the zeroing of colsb[8..15] and rows[8..15] as dead stores, and
       the stack garbage left there made ldtilecfg fault (#GP: SIGSEGV, found
       by the fuzz corpus replayed natively on a Sapphire Rapids VM). The
       empty asm reads c in full, so every store above stays. */
    __asm__ __volatile__("" : : "m"(c) : "memory");
    _tile_loadconfig(&c);
}
static int32_t ei__amx_d32(int32_t d) { return (int32_t)ei__round_up(d, 32); }

EI__TARGET_AMX static void ei__attn_pack_q_amx(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T) {
    const int32_t d = J->d, d32 = ei__amx_d32(d);
    uint16_t *qb = (uint16_t *)(void *)w->qt;
    int32_t r;
    for (r = 0; r < T->ld; ++r) {
        int32_t g = r / T->mt, tok = r % T->mt;
        uint16_t *dst = qb + (size_t)r * (size_t)d32;
        if (g < T->gt && tok < T->nt) {
            memcpy(dst, ei__row(J->q, T->t0 + tok - J->q_offset, T->h0 + g), (size_t)d * 2u);
            memset(dst + d, 0, (size_t)(d32 - d) * 2u);
        } else
            memset(dst, 0, (size_t)d32 * 2u);
    }
}

/* V pairs as the vdpbf16ps kernel packs them (zero past nk up to the next
   32 keys: a tile multiply reads whole 32-key chunks); K transposed into
   pairs: kt[i2][j] = (k_j[2 i2], k_j[2 i2 + 1]). */
EI__TARGET_AMX static void ei__attn_prep_kv_amx(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                int32_t nk) {
    const int32_t d2 = J->d / 2, d32h = ei__amx_d32(J->d) / 2, dpad = J->dpad;
    uint32_t *kt = (uint32_t *)(void *)w->kbuf;
    int32_t j, i2;
    ei__attn_prep_kv_avx512bf16(J, w, T, nk);
    memset((uint16_t *)(void *)w->vbuf + (size_t)((nk + 1) / 2) * (size_t)dpad * 2u, 0,
           (size_t)(ei__round_up(nk, 32) / 2 - (nk + 1) / 2) * (size_t)dpad * 4u);
    for (j = 0; j < nk; ++j) {
        const unsigned char *kr = (const unsigned char *)w->kp[j];
        for (i2 = 0; i2 < d2; ++i2) kt[(size_t)i2 * EI__ATTN_NK + (size_t)j] = ei__attn_u32(kr + 4 * i2);
    }
    for (i2 = 0; i2 < d32h; ++i2)
        for (j = i2 < d2 ? nk : 0; j < EI__ATTN_NK; ++j) kt[(size_t)i2 * EI__ATTN_NK + (size_t)j] = 0u;
}

/* S = Q K^T: per 16-row block, the key blocks in pairs (C tiles 0-1, A 2,
   B 3-4), over d in 32-element chunks; then scale, clamp, mask. */
EI__TARGET_AMX static void ei__attn_scores_amx(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T, int32_t nk,
                                               int need_mask) {
    const int32_t ld = T->ld, d32 = ei__amx_d32(J->d), nkb = (int32_t)ei__round_up(nk, 16) / 16;
    const uint16_t *qb = (const uint16_t *)(const void *)w->qt;
    const uint32_t *kt = (const uint32_t *)(const void *)w->kbuf;
    const __m512 cv = _mm512_set1_ps(J->c), lo = _mm512_set1_ps(-FLT_MAX), hi = _mm512_set1_ps(FLT_MAX);
    const size_t ss = EI__ATTN_NK * 4u; /* bytes per score row */
    int32_t r0, kb, c, r, jv;
    int32_t krel[EI__ATTN_NK];
    ei__amx_begin();
    for (r0 = 0; r0 < ld; r0 += 16)
        for (kb = 0; kb < nkb; kb += 2) {
            float *s = w->s + (size_t)r0 * EI__ATTN_NK + (size_t)kb * 16u;
            _tile_zero(0);
            _tile_zero(1);
            for (c = 0; c < d32; c += 32) {
                _tile_loadd(2, qb + (size_t)r0 * (size_t)d32 + (size_t)c, (size_t)d32 * 2u);
                _tile_loadd(3, kt + (size_t)(c / 2) * EI__ATTN_NK + (size_t)kb * 16u, EI__ATTN_NK * 4u);
                _tile_dpbf16ps(0, 2, 3);
                if (kb + 1 < nkb) {
                    _tile_loadd(4, kt + (size_t)(c / 2) * EI__ATTN_NK + (size_t)(kb + 1) * 16u, EI__ATTN_NK * 4u);
                    _tile_dpbf16ps(1, 2, 4);
                }
            }
            _tile_stored(0, s, ss);
            if (kb + 1 < nkb) _tile_stored(1, s + 16, ss);
        }
    _tile_release();
    for (jv = 0; jv < nk; ++jv) /* key positions relative to the tile's first token, clamped to int32 */
        krel[jv] = (int32_t)EI__MAX(EI__MIN(w->kpos[jv] - T->t0, (int64_t)INT32_MAX), (int64_t)-1);
    for (; jv < EI__ATTN_NK; ++jv) krel[jv] = INT32_MAX;
    for (r = 0; r < ld; ++r) {
        float *s = w->s + (size_t)r * EI__ATTN_NK;
        const __m512i tok = _mm512_set1_epi32(r % T->mt); /* the row's token, relative to t0 */
        for (jv = 0; jv < nkb * 16; jv += 16) {
            __m512 x = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(s + jv), cv), lo), hi);
            __mmask16 keep = (__mmask16)(jv + 16 <= nk ? 0xffffu : (1u << (nk - jv)) - 1u);
            if (need_mask) keep &= _mm512_cmple_epi32_mask(_mm512_loadu_si512(krel + jv), tok);
            _mm512_storeu_ps(s + jv, _mm512_mask_blend_ps(keep, _mm512_set1_ps(-INFINITY), x));
        }
    }
}

/* Online softmax along rows of the row-major scores (16-key vectors). */
EI__TARGET_AMX static void ei__attn_softmax_amx(ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {
    const int32_t nkv = (int32_t)ei__round_up(nk, 16);
    int32_t r, j;
    for (r = 0; r < T->ld; ++r) {
        float *s = w->s + (size_t)r * EI__ATTN_NK, mx;
        __m512 vmx = _mm512_set1_ps(w->m[r]), sum = _mm512_setzero_ps();
        for (j = 0; j < nkv; j += 16) vmx = _mm512_max_ps(vmx, _mm512_loadu_ps(s + j));
        mx = _mm512_reduce_max_ps(vmx);
        for (j = 0; j < nkv; j += 16) {
            __m512 e = ei__attn_exp2_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j), _mm512_set1_ps(mx)));
            _mm512_storeu_ps(s + j, e);
            sum = _mm512_add_ps(sum, e);
        }
        for (; j < EI__ATTN_NK; j += 16) _mm512_storeu_ps(s + j, _mm512_setzero_ps()); /* whole 32-key chunks */
        w->alpha[r] = exp2f(w->m[r] - mx);
        w->l[r] = w->l[r] * w->alpha[r] + _mm512_reduce_add_ps(sum);
        w->m[r] = mx;
    }
}

/* P -> bf16, row-major [ld][EI__ATTN_NK] (round to nearest even). */
EI__TARGET_AMX static void ei__attn_pack_p_amx(ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {
    const int32_t n32 = (int32_t)ei__round_up(nk, 32);
    uint16_t *pb = (uint16_t *)(void *)w->pp;
    int32_t r, j;
    for (r = 0; r < T->ld; ++r) {
        const float *s = w->s + (size_t)r * EI__ATTN_NK;
        for (j = 0; j < n32; j += 32)
            _mm512_storeu_si512(pb + (size_t)r * EI__ATTN_NK + (size_t)j,
                                (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + j + 16), _mm512_loadu_ps(s + j)));
    }
}

/* O = O alpha + P V: rows scaled by vector code, then per 16-row block the
   16-dim blocks in pairs (C tiles 0-1, A 2, B 3-4) over 32-key chunks. The
   accumulators go through memory for every key tile (eight tile registers
   cannot hold 16 rows x 128 dims besides the operands): with 256-row tiles
   that traffic, not the tile multiplies, bounds this stage. */
EI__TARGET_AMX static void ei__attn_pv_amx(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {
    const int32_t ld = T->ld, dpad = J->dpad, ndb = dpad / 16, n32 = (int32_t)ei__round_up(nk, 32);
    const uint16_t *pb = (const uint16_t *)(const void *)w->pp;
    const uint32_t *vb = (const uint32_t *)(const void *)w->vbuf;
    const size_t os = (size_t)dpad * 4u;
    int32_t r, r0, db, kc, c;
    for (r = 0; r < ld; ++r) { /* alpha is 1 once a row's running max settles: most tiles of a long row */
        float *o = w->o + (size_t)r * (size_t)dpad;
        const __m512 al = _mm512_set1_ps(w->alpha[r]);
        if (w->alpha[r] != 1.0f)
            for (c = 0; c < dpad; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(al, _mm512_loadu_ps(o + c)));
    }
    ei__amx_begin();
    for (r0 = 0; r0 < ld; r0 += 16)
        for (db = 0; db < ndb; db += 2) {
            float *o = w->o + (size_t)r0 * (size_t)dpad + (size_t)db * 16u;
            _tile_loadd(0, o, os);
            if (db + 1 < ndb) _tile_loadd(1, o + 16, os);
            for (kc = 0; kc < n32; kc += 32) {
                _tile_loadd(2, pb + (size_t)r0 * EI__ATTN_NK + (size_t)kc, EI__ATTN_NK * 2u);
                _tile_loadd(3, vb + (size_t)(kc / 2) * (size_t)dpad + (size_t)db * 16u, os);
                _tile_dpbf16ps(0, 2, 3);
                if (db + 1 < ndb) {
                    _tile_loadd(4, vb + (size_t)(kc / 2) * (size_t)dpad + (size_t)(db + 1) * 16u, os);
                    _tile_dpbf16ps(1, 2, 4);
                }
            }
            _tile_stored(0, o, os);
            if (db + 1 < ndb) _tile_stored(1, o + 16, os);
        }
    _tile_release();
}

static const ei__attn_stages ei__attn_amx = {ei__attn_pack_q_amx, ei__attn_prep_kv_amx, ei__attn_scores_amx,
                                             ei__attn_softmax_amx, ei__attn_pack_p_amx, ei__attn_pv_amx,
                                             ei__attn_store_avx512};
static const ei__kernels ei__kernels_amx = {EI_SIMD_AMX, ei__minmax_avx512, ei__rows_finite_avx512, ei__score_row_avx512,
                                            ei__dot_avx512, ei__sample_mass_avx512, ei__sample_mass_avx512, ei__rank_mass_i8_avx512,
                                            ei__rank_keys_extend_avx512, &ei__attn_avx512, &ei__attn_amx, NULL,
                                            ei__attn_decode_tile_avx512, ei__antidiag_group_avx512, EI__SAMPLE_ROWS, ei__spread_dots_avx512, EI__SPREAD_STEP_AVX512};
#endif /* EI__HAVE_AMX */

// >>isa-neon: AArch64 Advanced SIMD, 4 lanes ---------------------------------
#ifdef EI__HAVE_NEON
/* The vocabulary (>>simd): 4 f32 lanes in a q register; a 16-row vector of
   the attention tile is 4 of them. Advanced SIMD is part of the AArch64
   base architecture that compilers target, so no target attribute is
   needed (EI__TARGET_NEON is empty); the CPU check is in >>cpu-features.
   max/min are FMAXNM/FMINNM: like x86's maxps with the NaN as its first
   operand they return the other operand, which the templates rely on (a
   NaN score clamps to -FLT_MAX, a NaN exponent to -127); FMAX would
   propagate the NaN. */
#define EI__TARGET_NEON
typedef float32x4_t ei__neon_v;
typedef uint32x4_t ei__neon_m; /* lane mask: all-ones lanes */
typedef int32_t ei__neon_tail; /* lane count, 0..4 */
enum { ei__neon_n = 4, ei__neon_minmax_vecs = 8 };
EI__VINLINE ei__neon_tail ei__neon_first(int32_t n) { return n; }
EI__VINLINE float32x4_t ei__neon_zero(void) { return vdupq_n_f32(0.0f); }
EI__VINLINE float32x4_t ei__neon_set1(float x) { return vdupq_n_f32(x); }
EI__VINLINE float32x4_t ei__neon_load(const float *p) { return vld1q_f32(p); }
EI__VINLINE float32x4_t ei__neon_loadu(const float *p) { return vld1q_f32(p); }
EI__VINLINE void ei__neon_store(float *p, float32x4_t v) { vst1q_f32(p, v); }
EI__VINLINE void ei__neon_storeu(float *p, float32x4_t v) { vst1q_f32(p, v); }
EI__VINLINE float32x4_t ei__neon_add(float32x4_t a, float32x4_t b) { return vaddq_f32(a, b); }
EI__VINLINE float32x4_t ei__neon_sub(float32x4_t a, float32x4_t b) { return vsubq_f32(a, b); }
EI__VINLINE float32x4_t ei__neon_mul(float32x4_t a, float32x4_t b) { return vmulq_f32(a, b); }
EI__VINLINE float32x4_t ei__neon_fma(float32x4_t a, float32x4_t b, float32x4_t c) { return vfmaq_f32(c, a, b); }
EI__VINLINE float32x4_t ei__neon_max(float32x4_t a, float32x4_t b) { return vmaxnmq_f32(a, b); }
EI__VINLINE float32x4_t ei__neon_min(float32x4_t a, float32x4_t b) { return vminnmq_f32(a, b); }
EI__VINLINE float32x4_t ei__neon_round(float32x4_t x) { return vrndnq_f32(x); }
EI__VINLINE uint32x4_t ei__neon_ge(float32x4_t a, float32x4_t b) { return vcgeq_f32(a, b); }
/* p * 2^n through the exponent field (n integral, in -127..127). */
EI__VINLINE float32x4_t ei__neon_pow2(float32x4_t p, float32x4_t n, uint32x4_t keep) {
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vreinterpretq_f32_u32(vandq_u32(keep, vreinterpretq_u32_f32(vmulq_f32(p, vreinterpretq_f32_s32(e)))));
}
/* Partial rows go through a small copy (no masked loads or stores). */
static inline float32x4_t ei__neon_load_row(const void *p, ei_dtype dt, ei__neon_tail n) {
    if (n < 4) {
        float tmp[4] = {0, 0, 0, 0};
        int32_t i;
        for (i = 0; i < n; ++i) tmp[i] = ei__load1(p, dt, i);
        return vld1q_f32(tmp);
    }
    if (dt == EI_F32) return vld1q_f32((const float *)p);
    if (dt == EI_F16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
    return vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(vld1_u16((const uint16_t *)p)), 16));
}
/* bf16 rows and partial rows are stored through the scalar conversion;
   f16 through FCVTN, which rounds to nearest even like ei__f32_to_f16. */
EI__VINLINE void ei__neon_store_row(void *p, ei_dtype dt, float32x4_t x, ei__neon_tail n) {
    float tmp[4];
    int32_t i;
    if (n == 4 && dt == EI_F32) { vst1q_f32((float *)p, x); return; }
    if (n == 4 && dt == EI_F16) { vst1_u16((uint16_t *)p, vreinterpret_u16_f16(vcvt_f16_f32(x))); return; }
    vst1q_f32(tmp, x);
    if (dt == EI_BF16) for (i = 0; i < n; ++i) ((uint16_t *)p)[i] = ei__f32_to_bf16(tmp[i]);
    else if (dt == EI_F16) for (i = 0; i < n; ++i) ((uint16_t *)p)[i] = ei__f32_to_f16(tmp[i]);
    else for (i = 0; i < n; ++i) ((float *)p)[i] = tmp[i];
}
EI__VINLINE float32x4_t ei__neon_select_bits(uint32_t bits, float32x4_t x, float32x4_t y) {
    static const uint32_t lanebit[4] = {1, 2, 4, 8};
    return vbslq_f32(vtstq_u32(vdupq_n_u32(bits), vld1q_u32(lanebit)), x, y);
}
EI__VINLINE uint32x4_t ei__neon_nan_none(void) { return vdupq_n_u32(0); }
EI__VINLINE uint32x4_t ei__neon_nan_or(uint32x4_t m, float32x4_t v) { return vorrq_u32(m, vmvnq_u32(vceqq_f32(v, v))); }
EI__VINLINE int ei__neon_any(uint32x4_t m) { return vmaxvq_u32(m) != 0; }
EI__VINLINE float ei__neon_hsum(float32x4_t v) { return vaddvq_f32(v); }
EI__VINLINE float ei__neon_hmax(float32x4_t v) { return vmaxvq_f32(v); }

/* The templates: ei__minmax_neon, ei__rows_finite_neon, ei__sample_mass_neon,
   ei__attn_{exp2, row_f32, put_scores, prep_kv, softmax, store,
   decode_tile}_neon. */
#define EI__VISA neon
#define EI__VTARGET EI__TARGET_NEON
EI__DEFINE_MINMAX()
EI__DEFINE_ROWS_FINITE()
EI__ATTN_DEFINE_STAGES()
EI__DEFINE_SAMPLE_MASS()
EI__DEFINE_ANTIDIAG_GROUP()
EI__DEFINE_DECODE_TILE()
#undef EI__VTARGET
#undef EI__VISA

/* Hand-written: block scores, dot, Q K^T, P V. */
static void ei__score_row_neon(const float *qrep, int32_t G, int32_t d, const float *kmaxT, const float *kminT,
                               int64_t ld, int64_t nb, float *raw) {
    int64_t b;
    const float32x4_t half = vdupq_n_f32(0.5f), gdiv = vdupq_n_f32((float)G);
    for (b = 0; b < nb; b += 4) {
        float32x4_t sum = vdupq_n_f32(0.0f);
        float out[4];
        int32_t g, i;
        int64_t j;
        for (g = 0; g < G; ++g) {
            const float *qx = qrep + (size_t)g * 2u * (size_t)d, *qn = qx + d;
            float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
            for (i = 0; i < d; ++i) {
                float32x4_t kx = vld1q_f32(kmaxT + (size_t)i * (size_t)ld + (size_t)b);
                float32x4_t kn = vld1q_f32(kminT + (size_t)i * (size_t)ld + (size_t)b);
                a0 = vfmaq_n_f32(a0, kx, qx[i]); a1 = vfmaq_n_f32(a1, kx, qn[i]);
                a2 = vfmaq_n_f32(a2, kn, qx[i]); a3 = vfmaq_n_f32(a3, kn, qn[i]);
            }
            sum = vaddq_f32(sum, vmaxq_f32(vmulq_f32(vaddq_f32(a0, a1), half), vmulq_f32(vaddq_f32(a2, a3), half)));
        }
        vst1q_f32(out, vdivq_f32(sum, gdiv));
        for (j = 0; j < 4 && b + j < nb; ++j) raw[b + j] = out[j];
    }
}

/* dot(a, b) over d floats (decode scoring): two accumulators hide the FMA
   latency. */
static float ei__dot_neon(const float *a, const float *b, int32_t d) {
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0;
    float s;
    int32_t i = 0;
    for (; i + 8 <= d; i += 8) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    }
    for (; i + 4 <= d; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    s = vaddvq_f32(vaddq_f32(s0, s1));
    for (; i < d; ++i) s += a[i] * b[i];
    return s;
}

/* S^T = K Q^T for the tile (>>attention): one 16-row vector (4 q registers)
   x 4 keys per register block, 16 accumulators; per dimension 4 row loads
   and 4 key elements (FMLA by element) for 16 FMAs. Key pointers are valid
   up to a multiple of 8 keys (prep_kv repeats the last row). */
/* The 16 accumulators a<key><vector> of a 4-key x 4-vector register block,
   each put with PUT(acc, key, vector). */
#define EI__NEON_PUT_BLOCK(PUT, j)                                                          \
    PUT(a00, j, 0); PUT(a01, j, 1); PUT(a02, j, 2); PUT(a03, j, 3);                         \
    PUT(a10, j + 1, 0); PUT(a11, j + 1, 1); PUT(a12, j + 1, 2); PUT(a13, j + 1, 3);         \
    PUT(a20, j + 2, 0); PUT(a21, j + 2, 1); PUT(a22, j + 2, 2); PUT(a23, j + 2, 3);         \
    PUT(a30, j + 3, 0); PUT(a31, j + 3, 1); PUT(a32, j + 3, 2); PUT(a33, j + 3, 3)
#define EI__PUTNEON(acc, j, sub) ei__attn_put_scores_neon(w, T, ld, need_mask, (j), vb, (sub), (acc), cv)
static void ei__attn_scores_neon(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T, int32_t nk,
                                 int need_mask) {
    const int32_t ld = T->ld, d = J->d;
    const float32x4_t cv = vdupq_n_f32(J->c);
    int32_t vb, j, i;
    for (vb = 0; vb < T->nvec; ++vb)
        for (j = 0; j < nk; j += 4) {
            const float *k0 = (const float *)w->kp[j], *k1 = (const float *)w->kp[j + 1];
            const float *k2 = (const float *)w->kp[j + 2], *k3 = (const float *)w->kp[j + 3];
            const float *qp = w->qt + (size_t)vb * 16u;
            float32x4_t a00 = vdupq_n_f32(0.0f), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
                        a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
            for (i = 0; i < d; ++i, qp += ld) {
                float32x4_t q0 = vld1q_f32(qp), q1 = vld1q_f32(qp + 4), q2 = vld1q_f32(qp + 8), q3 = vld1q_f32(qp + 12);
                float b = k0[i];
                a00 = vfmaq_n_f32(a00, q0, b); a01 = vfmaq_n_f32(a01, q1, b);
                a02 = vfmaq_n_f32(a02, q2, b); a03 = vfmaq_n_f32(a03, q3, b);
                b = k1[i];
                a10 = vfmaq_n_f32(a10, q0, b); a11 = vfmaq_n_f32(a11, q1, b);
                a12 = vfmaq_n_f32(a12, q2, b); a13 = vfmaq_n_f32(a13, q3, b);
                b = k2[i];
                a20 = vfmaq_n_f32(a20, q0, b); a21 = vfmaq_n_f32(a21, q1, b);
                a22 = vfmaq_n_f32(a22, q2, b); a23 = vfmaq_n_f32(a23, q3, b);
                b = k3[i];
                a30 = vfmaq_n_f32(a30, q0, b); a31 = vfmaq_n_f32(a31, q1, b);
                a32 = vfmaq_n_f32(a32, q2, b); a33 = vfmaq_n_f32(a33, q3, b);
            }
            EI__NEON_PUT_BLOCK(EI__PUTNEON, j);
        }
}
#undef EI__PUTNEON

/* O[r][..] = alpha[r] O[r][..] + sum_j P[j][r] V[j][..]: 64-dim chunks of the
   value tile (as avx2), 16 dims (4 registers) x 4 rows inside; the 4 rows'
   weights of key j are one vector load (rows are contiguous in P's column)
   and enter the FMAs by lane. */
static void ei__attn_pv_neon(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T, int32_t nk) {
    const int32_t ld = T->ld, dpad = J->dpad;
    int32_t r, c0, c1, j;
    for (c0 = 0; c0 < dpad; c0 += 64)
        for (c1 = c0; c1 < dpad && c1 < c0 + 64; c1 += 16) {
            const float *vc = w->vbuf + (size_t)(c0 / 64) * EI__ATTN_NK * 64u + (size_t)(c1 - c0);
            for (r = 0; r < ld; r += 4) {
                const float32x4_t al = vld1q_f32(w->alpha + r);
                float *o0 = w->o + (size_t)r * (size_t)dpad + c1, *o1 = o0 + dpad, *o2 = o1 + dpad, *o3 = o2 + dpad;
                float32x4_t x00 = vmulq_laneq_f32(vld1q_f32(o0), al, 0), x01 = vmulq_laneq_f32(vld1q_f32(o0 + 4), al, 0),
                            x02 = vmulq_laneq_f32(vld1q_f32(o0 + 8), al, 0), x03 = vmulq_laneq_f32(vld1q_f32(o0 + 12), al, 0),
                            x10 = vmulq_laneq_f32(vld1q_f32(o1), al, 1), x11 = vmulq_laneq_f32(vld1q_f32(o1 + 4), al, 1),
                            x12 = vmulq_laneq_f32(vld1q_f32(o1 + 8), al, 1), x13 = vmulq_laneq_f32(vld1q_f32(o1 + 12), al, 1),
                            x20 = vmulq_laneq_f32(vld1q_f32(o2), al, 2), x21 = vmulq_laneq_f32(vld1q_f32(o2 + 4), al, 2),
                            x22 = vmulq_laneq_f32(vld1q_f32(o2 + 8), al, 2), x23 = vmulq_laneq_f32(vld1q_f32(o2 + 12), al, 2),
                            x30 = vmulq_laneq_f32(vld1q_f32(o3), al, 3), x31 = vmulq_laneq_f32(vld1q_f32(o3 + 4), al, 3),
                            x32 = vmulq_laneq_f32(vld1q_f32(o3 + 8), al, 3), x33 = vmulq_laneq_f32(vld1q_f32(o3 + 12), al, 3);
                const float *pj = w->s + r, *vr = vc;
                for (j = 0; j < nk; ++j, pj += ld, vr += 64) {
                    float32x4_t v0 = vld1q_f32(vr), v1 = vld1q_f32(vr + 4), v2 = vld1q_f32(vr + 8), v3 = vld1q_f32(vr + 12);
                    float32x4_t p = vld1q_f32(pj);
                    x00 = vfmaq_laneq_f32(x00, v0, p, 0); x01 = vfmaq_laneq_f32(x01, v1, p, 0);
                    x02 = vfmaq_laneq_f32(x02, v2, p, 0); x03 = vfmaq_laneq_f32(x03, v3, p, 0);
                    x10 = vfmaq_laneq_f32(x10, v0, p, 1); x11 = vfmaq_laneq_f32(x11, v1, p, 1);
                    x12 = vfmaq_laneq_f32(x12, v2, p, 1); x13 = vfmaq_laneq_f32(x13, v3, p, 1);
                    x20 = vfmaq_laneq_f32(x20, v0, p, 2); x21 = vfmaq_laneq_f32(x21, v1, p, 2);
                    x22 = vfmaq_laneq_f32(x22, v2, p, 2); x23 = vfmaq_laneq_f32(x23, v3, p, 2);
                    x30 = vfmaq_laneq_f32(x30, v0, p, 3); x31 = vfmaq_laneq_f32(x31, v1, p, 3);
                    x32 = vfmaq_laneq_f32(x32, v2, p, 3); x33 = vfmaq_laneq_f32(x33, v3, p, 3);
                }
                vst1q_f32(o0, x00); vst1q_f32(o0 + 4, x01); vst1q_f32(o0 + 8, x02); vst1q_f32(o0 + 12, x03);
                vst1q_f32(o1, x10); vst1q_f32(o1 + 4, x11); vst1q_f32(o1 + 8, x12); vst1q_f32(o1 + 12, x13);
                vst1q_f32(o2, x20); vst1q_f32(o2 + 4, x21); vst1q_f32(o2 + 8, x22); vst1q_f32(o2 + 12, x23);
                vst1q_f32(o3, x30); vst1q_f32(o3 + 4, x31); vst1q_f32(o3 + 8, x32); vst1q_f32(o3 + 12, x33);
            }
        }
}

/* f32 arithmetic for every dtype (f16/bf16 rows widened per tile, as avx2). */
static const ei__attn_stages ei__attn_neon = {ei__attn_pack_q_f32, ei__attn_prep_kv_neon, ei__attn_scores_neon,
                                              ei__attn_softmax_neon, NULL, ei__attn_pv_neon, ei__attn_store_neon};
/* EI_RANK_PRECISION_INT8 on NEON: the neon walk over the plain int8
   scores (an sdot kernel is future work; the scores are the same). */
static int ei__rank_mass_i8_neon(const ei__rank_q8 *q, const int64_t *tok, int32_t nr, const ei_tensor *k, int32_t kvh,
                                 float scale, int32_t bs, int64_t nvis, float *lg, float *kbuf, float *mass) {
    if (ei__rank_keys_extend_scalar(q->kc, k, kvh, tok[nr - 1] + 1, kbuf)) return 0;
    return ei__sample_mass_by_neon(ei__rank_scores_i8_scalar, q, tok, nr, k, kvh, scale, bs, nvis, lg, kbuf, mass, NULL);
}
static const ei__kernels ei__kernels_neon = {EI_SIMD_NEON, ei__minmax_neon, ei__rows_finite_neon, ei__score_row_neon, ei__dot_neon,
                                             ei__sample_mass_neon, ei__sample_mass_neon, ei__rank_mass_i8_neon,
                                             ei__rank_keys_extend_scalar, &ei__attn_neon, NULL, NULL, ei__attn_decode_tile_neon,
                                             ei__antidiag_group_neon, EI__SAMPLE_ROWS, ei__spread_dots_scalar, NULL};

/* The prep_kv of the kernels that read 16-bit keys in place (neon-bf16,
   neon-bfmmla, neon-fhm): key row pointers; values (bf16 or f16 rows) widened into the
   f32 vbuf as the neon prep_kv does. */
EI__MAYBE_UNUSED static void ei__attn_prep_kv_neon_half(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                        int32_t nk) {
    const int32_t d = J->d, dpad = J->dpad;
    const ei_dtype vdt = J->v->dtype;
    int32_t j, c0;
    for (j = 0; j < nk; ++j) {
        const unsigned char *vr = (const unsigned char *)ei__row(J->v, w->kpos[j], T->kvh);
        w->kp[j] = ei__row(J->k, w->kpos[j], T->kvh);
        for (c0 = 0; c0 < dpad; c0 += 4) {
            int32_t rem = d - c0;
            float *dst = w->vbuf + ((size_t)(c0 / 64) * EI__ATTN_NK + (size_t)j) * 64u + (size_t)(c0 % 64);
            vst1q_f32(dst, rem > 0 ? ei__neon_load_row(vr + (size_t)c0 * 2u, vdt, EI__MIN(rem, 4)) : vdupq_n_f32(0.0f));
        }
    }
    for (; j < ((nk + 7) & ~7); ++j) w->kp[j] = w->kp[nk - 1];
}

#ifdef EI__HAVE_NEON_BF16
/* neon-bf16 (>>attention, Kernels): BFDOT for Q K^T of all-bf16 calls, the
   neon stages for the rest. Queries are packed as bf16 pairs (q[2i],
   q[2i+1]) [d/2][ld], so 4 rows of one dimension pair are one 128-bit load,
   and each key's pair is broadcast: BFDOT adds both products of the pair
   to each row's f32 sum (ei__attn_pack_q_pairs). Keys are read in place
   (ei__attn_prep_kv_neon_half). */
/* S^T = K Q^T: one 16-row vector (4 registers of 4 rows x 1 pair) x 4 keys,
   16 accumulators; per dimension pair 4 query loads, 4 key pairs
   broadcast, 16 BFDOTs. */
#define EI__PUTNEONBF(acc, j, sub) ei__attn_put_scores_neon(w, T, ld, need_mask, (j), vb, (sub), (acc), cv)
EI__TARGET_NEON_BF16 static inline bfloat16x8_t ei__neon_bf16_pair(const void *row, int32_t i2) {
    uint32_t pair;
    memcpy(&pair, (const unsigned char *)row + 4 * (size_t)i2, 4); /* rows are only 2-byte aligned */
    return vreinterpretq_bf16_u32(vdupq_n_u32(pair));
}
EI__TARGET_NEON_BF16 static void ei__attn_scores_neon_bf16(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                          int32_t nk, int need_mask) {
    const int32_t ld = T->ld, d2 = J->d / 2;
    const float32x4_t cv = vdupq_n_f32(J->c);
    int32_t vb, j, i2;
    for (vb = 0; vb < T->nvec; ++vb)
        for (j = 0; j < nk; j += 4) {
            const void *k0 = w->kp[j], *k1 = w->kp[j + 1], *k2 = w->kp[j + 2], *k3 = w->kp[j + 3];
            const uint32_t *qp = (const uint32_t *)w->qt + (size_t)vb * 16u;
            float32x4_t a00 = vdupq_n_f32(0.0f), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
                        a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
            for (i2 = 0; i2 < d2; ++i2, qp += ld) {
                bfloat16x8_t q0 = vreinterpretq_bf16_u32(vld1q_u32(qp)), q1 = vreinterpretq_bf16_u32(vld1q_u32(qp + 4)),
                             q2 = vreinterpretq_bf16_u32(vld1q_u32(qp + 8)), q3 = vreinterpretq_bf16_u32(vld1q_u32(qp + 12));
                bfloat16x8_t b = ei__neon_bf16_pair(k0, i2);
                a00 = vbfdotq_f32(a00, q0, b); a01 = vbfdotq_f32(a01, q1, b);
                a02 = vbfdotq_f32(a02, q2, b); a03 = vbfdotq_f32(a03, q3, b);
                b = ei__neon_bf16_pair(k1, i2);
                a10 = vbfdotq_f32(a10, q0, b); a11 = vbfdotq_f32(a11, q1, b);
                a12 = vbfdotq_f32(a12, q2, b); a13 = vbfdotq_f32(a13, q3, b);
                b = ei__neon_bf16_pair(k2, i2);
                a20 = vbfdotq_f32(a20, q0, b); a21 = vbfdotq_f32(a21, q1, b);
                a22 = vbfdotq_f32(a22, q2, b); a23 = vbfdotq_f32(a23, q3, b);
                b = ei__neon_bf16_pair(k3, i2);
                a30 = vbfdotq_f32(a30, q0, b); a31 = vbfdotq_f32(a31, q1, b);
                a32 = vbfdotq_f32(a32, q2, b); a33 = vbfdotq_f32(a33, q3, b);
            }
            EI__NEON_PUT_BLOCK(EI__PUTNEONBF, j);
        }
}
#undef EI__PUTNEONBF
static const ei__attn_stages ei__attn_neon_bf16 = {ei__attn_pack_q_pairs, ei__attn_prep_kv_neon_half,
                                                   ei__attn_scores_neon_bf16, ei__attn_softmax_neon, NULL,
                                                   ei__attn_pv_neon, ei__attn_store_neon};
static const ei__kernels ei__kernels_neon_bf16 = {EI_SIMD_NEON_BF16, ei__minmax_neon, ei__rows_finite_neon, ei__score_row_neon,
                                                  ei__dot_neon, ei__sample_mass_neon, ei__sample_mass_neon, ei__rank_mass_i8_neon,
                                                  ei__rank_keys_extend_scalar, &ei__attn_neon, &ei__attn_neon_bf16, NULL,
                                                  ei__attn_decode_tile_neon, ei__antidiag_group_neon, EI__SAMPLE_ROWS, ei__spread_dots_scalar, NULL};

/* neon-bfmmla (>>attention, Kernels): BFMMLA for Q K^T of all-bf16 calls,
   the neon stages for the rest. BFMMLA multiplies a 2 x 4 bf16 matrix (2
   rows x 4 dimensions) by a 4 x 2 one (4 dimensions x 2 keys) into a 2 x 2
   f32 sum [r0 k0, r0 k1, r1 k0, r1 k1]: 16 products an instruction, twice
   BFDOT's 8, with the same bf16 product and f32 sum arithmetic. Queries are
   packed per 4 dimensions and row pair (ei__attn_pack_q_bfmmla); UZP1/UZP2
   turn two row pairs' sums into the 4-row vectors of one key that
   put_scores takes. Keys are read in place (ei__attn_prep_kv_neon_half). */
/* w->qt as u16 [ceil(d/4)][4 ld]: element (row r, dimension i) at
   (i / 4) * 4 ld + (r / 2) * 8 + (r % 2) * 4 + i % 4; dimensions past d
   (d = 4n + 2) and rows past the tile are zero. */
static void ei__attn_pack_q_bfmmla(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T) {
    int32_t r, i, d = J->d, dq = (J->d + 3) / 4;
    uint16_t *qh = (uint16_t *)w->qt;
    for (r = 0; r < T->ld; ++r) {
        int32_t g = r / T->mt, tok = r % T->mt;
        uint16_t *col = qh + (size_t)(r / 2) * 8u + (size_t)(r % 2) * 4u;
        const unsigned char *row = NULL;
        if (g < T->gt && tok < T->nt) row = (const unsigned char *)ei__row(J->q, T->t0 + tok - J->q_offset, T->h0 + g);
        for (i = 0; i < dq; ++i) {
            uint16_t *dst = &col[(size_t)i * 4u * (size_t)T->ld];
            memset(dst, 0, 8);
            if (row && 4 * i + 4 <= d) memcpy(dst, row + 8 * i, 8);
            else if (row) memcpy(dst, row + 8 * i, 4); /* d = 4n + 2: the last pair */
        }
    }
}
/* keys j and j + 1, dimensions i..i+3 (n = 4) or i..i+1 (n = 2, the rest
   zero) as the 4 x 2 operand: key j in the low 64 bits */
EI__TARGET_NEON_BF16 static inline bfloat16x8_t ei__neon_bf16_keypair(const void *kj, const void *kj1, int32_t i, int n) {
    uint32_t p0, p1;
    if (n == 4)
        return vreinterpretq_bf16_u16(vcombine_u16(vld1_u16((const uint16_t *)kj + i), vld1_u16((const uint16_t *)kj1 + i)));
    memcpy(&p0, (const uint16_t *)kj + i, 4); /* rows are only 2-byte aligned */
    memcpy(&p1, (const uint16_t *)kj1 + i, 4);
    return vreinterpretq_bf16_u64(vcombine_u64(vcreate_u64(p0), vcreate_u64(p1)));
}
/* S^T = K Q^T: one 16-row vector (8 row pairs) x 4 keys (2 key pairs), 16
   accumulators c<row pair><key pair>; per 4 dimensions 8 query loads, 2 key
   pair operands, 16 BFMMLAs. */
#define EI__PUTNEONMM(acc, j, sub) ei__attn_put_scores_neon(w, T, ld, need_mask, (j), vb, (sub), (acc), cv)
#define EI__BFMMLA_ROWPAIR(p, qv)                                                                    \
    c##p##0 = vbfmmlaq_f32(c##p##0, qv, b0); c##p##1 = vbfmmlaq_f32(c##p##1, qv, b1)
/* 4 dimensions of the 8 row pairs at qp against key pairs b0, b1 */
#define EI__BFMMLA_QUAD()                                              \
    EI__BFMMLA_ROWPAIR(0, vreinterpretq_bf16_u16(vld1q_u16(qp)));      \
    EI__BFMMLA_ROWPAIR(1, vreinterpretq_bf16_u16(vld1q_u16(qp + 8)));  \
    EI__BFMMLA_ROWPAIR(2, vreinterpretq_bf16_u16(vld1q_u16(qp + 16))); \
    EI__BFMMLA_ROWPAIR(3, vreinterpretq_bf16_u16(vld1q_u16(qp + 24))); \
    EI__BFMMLA_ROWPAIR(4, vreinterpretq_bf16_u16(vld1q_u16(qp + 32))); \
    EI__BFMMLA_ROWPAIR(5, vreinterpretq_bf16_u16(vld1q_u16(qp + 40))); \
    EI__BFMMLA_ROWPAIR(6, vreinterpretq_bf16_u16(vld1q_u16(qp + 48))); \
    EI__BFMMLA_ROWPAIR(7, vreinterpretq_bf16_u16(vld1q_u16(qp + 56)))
/* the 4 rows of sub-vector s (row pairs 2s, 2s+1) for keys j..j+3 */
#define EI__BFMMLA_UNZIP(s, pa, pb)                                                                  \
    a0##s = vuzp1q_f32(c##pa##0, c##pb##0); a1##s = vuzp2q_f32(c##pa##0, c##pb##0);                  \
    a2##s = vuzp1q_f32(c##pa##1, c##pb##1); a3##s = vuzp2q_f32(c##pa##1, c##pb##1)
EI__TARGET_NEON_BF16 static void ei__attn_scores_neon_bfmmla(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                            int32_t nk, int need_mask) {
    const int32_t ld = T->ld, d = J->d;
    const float32x4_t cv = vdupq_n_f32(J->c);
    int32_t vb, j, i;
    for (vb = 0; vb < T->nvec; ++vb)
        for (j = 0; j < nk; j += 4) {
            const void *k0 = w->kp[j], *k1 = w->kp[j + 1], *k2 = w->kp[j + 2], *k3 = w->kp[j + 3];
            const uint16_t *qp = (const uint16_t *)w->qt + (size_t)vb * 64u;
            float32x4_t c00 = vdupq_n_f32(0.0f), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
                        c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
            float32x4_t a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33;
            bfloat16x8_t b0, b1;
            for (i = 0; i + 4 <= d; i += 4, qp += 4 * ld) {
                b0 = ei__neon_bf16_keypair(k0, k1, i, 4); b1 = ei__neon_bf16_keypair(k2, k3, i, 4);
                EI__BFMMLA_QUAD();
            }
            if (i < d) { /* d = 4n + 2: the last pair, zero past it */
                b0 = ei__neon_bf16_keypair(k0, k1, i, 2); b1 = ei__neon_bf16_keypair(k2, k3, i, 2);
                EI__BFMMLA_QUAD();
            }
            EI__BFMMLA_UNZIP(0, 0, 1);
            EI__BFMMLA_UNZIP(1, 2, 3);
            EI__BFMMLA_UNZIP(2, 4, 5);
            EI__BFMMLA_UNZIP(3, 6, 7);
            EI__NEON_PUT_BLOCK(EI__PUTNEONMM, j);
        }
}
#undef EI__BFMMLA_UNZIP
#undef EI__BFMMLA_QUAD
#undef EI__BFMMLA_ROWPAIR
#undef EI__PUTNEONMM
static const ei__attn_stages ei__attn_neon_bfmmla = {ei__attn_pack_q_bfmmla, ei__attn_prep_kv_neon_half,
                                                     ei__attn_scores_neon_bfmmla, ei__attn_softmax_neon, NULL,
                                                     ei__attn_pv_neon, ei__attn_store_neon};
static const ei__kernels ei__kernels_neon_bfmmla = {EI_SIMD_NEON_BFMMLA, ei__minmax_neon, ei__rows_finite_neon,
                                                    ei__score_row_neon, ei__dot_neon, ei__sample_mass_neon, ei__sample_mass_neon,
                                                    ei__rank_mass_i8_neon, ei__rank_keys_extend_scalar, &ei__attn_neon,
                                                    &ei__attn_neon_bfmmla, NULL, ei__attn_decode_tile_neon,
                                                    ei__antidiag_group_neon, EI__SAMPLE_ROWS, ei__spread_dots_scalar, NULL};
#endif /* EI__HAVE_NEON_BF16 */

#ifdef EI__HAVE_NEON_FHM
/* neon-fhm (>>attention, Kernels): FMLAL/FMLAL2 for Q K^T of all-f16 calls
   with an even head_dim, the neon stages for the rest (P V in f32). FMLAL
   multiplies the low 4 f16 lanes of a register by one f16 lane of another
   and adds the products to 4 f32 sums, FMLAL2 the high 4 lanes; an f16 x
   f16 product is exact in f32 and each add is fused, as FMLA's is, so with
   each row's dimensions added in order the scores equal the neon kernel's
   on the same f16 inputs (f32 accumulation throughout). Queries are packed
   per dimension pair and 4 rows, 8 halves: rows r..r+3 of dimension 2i,
   then of dimension 2i+1 (ei__attn_pack_q_f16_fhm); one 128-bit load holds
   both, FMLAL takes the first dimension and FMLAL2 the second against lanes
   0 and 1 of the key's pair. Keys are read in place
   (ei__attn_prep_kv_neon_half). */
/* w->qt as u16 [d/2][2 ld]: element (row r, dimension 2 i2 + e) at
   i2 * 2 ld + (r / 4) * 8 + e * 4 + r % 4; rows past the tile are zero. */
static void ei__attn_pack_q_f16_fhm(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T) {
    int32_t r, i2, d2 = J->d / 2;
    uint16_t *qh = (uint16_t *)w->qt;
    for (r = 0; r < T->ld; ++r) {
        int32_t g = r / T->mt, tok = r % T->mt;
        uint16_t *col = qh + (size_t)(r / 4) * 8u + (size_t)(r % 4), pair[2] = {0, 0};
        const unsigned char *row = NULL;
        if (g < T->gt && tok < T->nt) row = (const unsigned char *)ei__row(J->q, T->t0 + tok - J->q_offset, T->h0 + g);
        for (i2 = 0; i2 < d2; ++i2) {
            uint16_t *dst = &col[(size_t)i2 * 2u * (size_t)T->ld];
            if (row) memcpy(pair, row + 4 * i2, 4);
            dst[0] = pair[0];
            dst[4] = pair[1];
        }
    }
}
/* S^T = K Q^T: one 16-row vector (4 registers of 4 rows x 2 dimensions) x 4
   keys, 16 accumulators; per 4 dimensions (two pairs) 8 query loads, 4 key
   loads of 4 halves, 64 FMLAL/FMLAL2; an odd last pair alone. */
#define EI__PUTNEONFHM(acc, j, sub) ei__attn_put_scores_neon(w, T, ld, need_mask, (j), vb, (sub), (acc), cv)
/* the 16 accumulators' FMLAL (dimension of lane L0) then FMLAL2 (lane L1)
   against query registers q0..q3 and key registers b0..b3 (key rows k0..k3,
   dimensions from i). clang 14 gives FMLAL by element registers v16..v31
   for the element operand, which its encoding cannot name (wrong results
   under qemu): there each key element is broadcast by LD1R and multiplied
   vector by vector, one more load per 8 FMLALs. */
#if defined(__clang__)
#define EI__FHM_MLA(acc, q, kb, krow, L, half) \
    ((void)(kb),                              \
     acc = vfmlalq_##half##_f16(acc, q, vreinterpretq_f16_u16(vld1q_dup_u16((const uint16_t *)(krow) + i + (L)))))
#else
#define EI__FHM_MLA(acc, q, kb, krow, L, half) (acc = vfmlalq_lane_##half##_f16(acc, q, kb, L))
#endif
#define EI__FHM_PAIR(L0, L1)                                                       \
    EI__FHM_MLA(a00, q0, b0, k0, L0, low); EI__FHM_MLA(a00, q0, b0, k0, L1, high); \
    EI__FHM_MLA(a01, q1, b0, k0, L0, low); EI__FHM_MLA(a01, q1, b0, k0, L1, high); \
    EI__FHM_MLA(a02, q2, b0, k0, L0, low); EI__FHM_MLA(a02, q2, b0, k0, L1, high); \
    EI__FHM_MLA(a03, q3, b0, k0, L0, low); EI__FHM_MLA(a03, q3, b0, k0, L1, high); \
    EI__FHM_MLA(a10, q0, b1, k1, L0, low); EI__FHM_MLA(a10, q0, b1, k1, L1, high); \
    EI__FHM_MLA(a11, q1, b1, k1, L0, low); EI__FHM_MLA(a11, q1, b1, k1, L1, high); \
    EI__FHM_MLA(a12, q2, b1, k1, L0, low); EI__FHM_MLA(a12, q2, b1, k1, L1, high); \
    EI__FHM_MLA(a13, q3, b1, k1, L0, low); EI__FHM_MLA(a13, q3, b1, k1, L1, high); \
    EI__FHM_MLA(a20, q0, b2, k2, L0, low); EI__FHM_MLA(a20, q0, b2, k2, L1, high); \
    EI__FHM_MLA(a21, q1, b2, k2, L0, low); EI__FHM_MLA(a21, q1, b2, k2, L1, high); \
    EI__FHM_MLA(a22, q2, b2, k2, L0, low); EI__FHM_MLA(a22, q2, b2, k2, L1, high); \
    EI__FHM_MLA(a23, q3, b2, k2, L0, low); EI__FHM_MLA(a23, q3, b2, k2, L1, high); \
    EI__FHM_MLA(a30, q0, b3, k3, L0, low); EI__FHM_MLA(a30, q0, b3, k3, L1, high); \
    EI__FHM_MLA(a31, q1, b3, k3, L0, low); EI__FHM_MLA(a31, q1, b3, k3, L1, high); \
    EI__FHM_MLA(a32, q2, b3, k3, L0, low); EI__FHM_MLA(a32, q2, b3, k3, L1, high); \
    EI__FHM_MLA(a33, q3, b3, k3, L0, low); EI__FHM_MLA(a33, q3, b3, k3, L1, high)
#define EI__FHM_LOAD_Q(qp)                                                                \
    q0 = vreinterpretq_f16_u16(vld1q_u16(qp)); q1 = vreinterpretq_f16_u16(vld1q_u16((qp) + 8));    \
    q2 = vreinterpretq_f16_u16(vld1q_u16((qp) + 16)); q3 = vreinterpretq_f16_u16(vld1q_u16((qp) + 24))
/* halves i..i+3 (n = 4) or i..i+1 (n = 2, lanes 2 and 3 zero) of a key row */
EI__TARGET_NEON_FHM static inline float16x4_t ei__neon_f16_keys(const void *row, int32_t i, int n) {
    uint32_t pair;
    if (n == 4) return vreinterpret_f16_u16(vld1_u16((const uint16_t *)row + i));
    memcpy(&pair, (const uint16_t *)row + i, 4); /* rows are only 2-byte aligned */
    return vreinterpret_f16_u64(vcreate_u64(pair));
}
EI__TARGET_NEON_FHM static void ei__attn_scores_neon_fhm(const ei__attn_job *J, ei__attn_ws *w, const ei__attn_tile *T,
                                                        int32_t nk, int need_mask) {
    const int32_t ld = T->ld, d = J->d;
    const float32x4_t cv = vdupq_n_f32(J->c);
    int32_t vb, j, i;
    for (vb = 0; vb < T->nvec; ++vb)
        for (j = 0; j < nk; j += 4) {
            const void *k0 = w->kp[j], *k1 = w->kp[j + 1], *k2 = w->kp[j + 2], *k3 = w->kp[j + 3];
            const uint16_t *qp = (const uint16_t *)w->qt + (size_t)vb * 32u;
            float32x4_t a00 = vdupq_n_f32(0.0f), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
                        a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
            float16x8_t q0, q1, q2, q3;
            float16x4_t b0, b1, b2, b3;
            for (i = 0; i + 4 <= d; i += 4) {
                b0 = ei__neon_f16_keys(k0, i, 4); b1 = ei__neon_f16_keys(k1, i, 4);
                b2 = ei__neon_f16_keys(k2, i, 4); b3 = ei__neon_f16_keys(k3, i, 4);
                EI__FHM_LOAD_Q(qp);
                EI__FHM_PAIR(0, 1);
                qp += 2 * ld;
                EI__FHM_LOAD_Q(qp);
                EI__FHM_PAIR(2, 3);
                qp += 2 * ld;
            }
            if (i < d) { /* d = 4n + 2 */
                b0 = ei__neon_f16_keys(k0, i, 2); b1 = ei__neon_f16_keys(k1, i, 2);
                b2 = ei__neon_f16_keys(k2, i, 2); b3 = ei__neon_f16_keys(k3, i, 2);
                EI__FHM_LOAD_Q(qp);
                EI__FHM_PAIR(0, 1);
            }
            EI__NEON_PUT_BLOCK(EI__PUTNEONFHM, j);
        }
}
#undef EI__FHM_LOAD_Q
#undef EI__FHM_PAIR
#undef EI__FHM_MLA
#undef EI__PUTNEONFHM
static const ei__attn_stages ei__attn_neon_fhm = {ei__attn_pack_q_f16_fhm, ei__attn_prep_kv_neon_half,
                                                  ei__attn_scores_neon_fhm, ei__attn_softmax_neon, NULL,
                                                  ei__attn_pv_neon, ei__attn_store_neon};
static const ei__kernels ei__kernels_neon_fhm = {EI_SIMD_NEON_FHM, ei__minmax_neon, ei__rows_finite_neon, ei__score_row_neon,
                                                 ei__dot_neon, ei__sample_mass_neon, ei__sample_mass_neon, ei__rank_mass_i8_neon,
                                                 ei__rank_keys_extend_scalar, &ei__attn_neon, NULL, &ei__attn_neon_fhm,
                                                 ei__attn_decode_tile_neon, ei__antidiag_group_neon, EI__SAMPLE_ROWS, ei__spread_dots_scalar, NULL};
#endif /* EI__HAVE_NEON_FHM */
#endif /* EI__HAVE_NEON */

// >>kernels: one table per path, chosen once per context --------------------
#ifdef EI__HAVE_AVX512BF16
/* Which bf16 attention runs faster on this CPU: vdpbf16ps (bf16 products,
   f32 sums) or bf16 widened to f32 and f32 FMAs. Their rate ratio is a
   property of the core, not of the ISA: vdpbf16ps retires at about half the
   f32 FMA FLOP rate on a Sapphire Rapids and about 1.8x on a Zen 5, and the
   attention kernels follow (0.6x and 1.7x, issue 16's measurements). So it
   is measured: 16 independent chains of each instruction (enough to cover
   its latency on both cores), 1024 rounds, in time-stamp-counter ticks,
   after 8 untimed runs of each (512-bit units run slowly for tens of
   microseconds after idling), interleaved 7 times, the fastest run of each
   kept (a preempted run is only ever slower); about 0.3 ms. The dpbf16 kernel is chosen when its FLOP
   rate is at least 1.25x the f32 FMA rate: the ratios seen, 0.5 and 1.8,
   sit far on either side, and the dpbf16 kernel's extra packing work needs
   the margin. Done once per process (pthread_once; per context under
   EI_NO_PTHREADS). */
static uint64_t ei__tsc(void) {
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}
#define EI__CAL_ROUNDS 1024
/* The timed loops are assembly so that what they time does not depend on
   the compiler or its options (at -O0 intrinsics keep the accumulators in
   memory and the loop would time store forwarding): 16 accumulators
   zmm0..15, operands zmm16/17 (zero: no special values), `rounds` x 16
   instructions. */
#define EI__CAL_16(op)                                                                                        \
    op " %%zmm17, %%zmm16, %%zmm0\n\t" op " %%zmm17, %%zmm16, %%zmm1\n\t" op " %%zmm17, %%zmm16, %%zmm2\n\t"   \
    op " %%zmm17, %%zmm16, %%zmm3\n\t" op " %%zmm17, %%zmm16, %%zmm4\n\t" op " %%zmm17, %%zmm16, %%zmm5\n\t"   \
    op " %%zmm17, %%zmm16, %%zmm6\n\t" op " %%zmm17, %%zmm16, %%zmm7\n\t" op " %%zmm17, %%zmm16, %%zmm8\n\t"   \
    op " %%zmm17, %%zmm16, %%zmm9\n\t" op " %%zmm17, %%zmm16, %%zmm10\n\t" op " %%zmm17, %%zmm16, %%zmm11\n\t" \
    op " %%zmm17, %%zmm16, %%zmm12\n\t" op " %%zmm17, %%zmm16, %%zmm13\n\t" op " %%zmm17, %%zmm16, %%zmm14\n\t" \
    op " %%zmm17, %%zmm16, %%zmm15\n\t"
#define EI__CAL_LOOP(op, n)                                                                                   \
    __asm__ volatile("vpxord %%zmm16, %%zmm16, %%zmm16\n\tvpxord %%zmm17, %%zmm17, %%zmm17\n\t"                \
                     "1:\n\t" EI__CAL_16(op) "dec %0\n\tjnz 1b"                                                \
                     : "+r"(n)                                                                                 \
                     :                                                                                         \
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
                       "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc")
EI__TARGET_AVX512BF16 static uint64_t ei__cal_dpbf16(void) {
    uint64_t t0, n = EI__CAL_ROUNDS;
    t0 = ei__tsc();
    EI__CAL_LOOP("vdpbf16ps", n);
    return ei__tsc() - t0;
}
EI__TARGET_AVX512 static uint64_t ei__cal_fma(void) {
    uint64_t t0, n = EI__CAL_ROUNDS;
    t0 = ei__tsc();
    EI__CAL_LOOP("vfmadd231ps", n);
    return ei__tsc() - t0;
}
static double ei__dpbf16_ratio_value;
/* vdpbf16ps FLOP rate / f32 FMA FLOP rate (64 vs 32 flops an instruction). */
static void ei__dpbf16_measure(void) {
    uint64_t best_dp = UINT64_MAX, best_fma = UINT64_MAX, t;
    int r;
    for (r = 0; r < 8; ++r) { /* warm up: 512-bit units run slowly for ~10-50 us after idling (frequency licences) */
        (void)ei__cal_dpbf16();
        (void)ei__cal_fma();
    }
    for (r = 0; r < 7; ++r) {
        if ((t = ei__cal_dpbf16()) < best_dp) best_dp = t;
        if ((t = ei__cal_fma()) < best_fma) best_fma = t;
    }
    ei__dpbf16_ratio_value = best_dp ? 2.0 * (double)best_fma / (double)best_dp : 0.0;
}
static double ei__dpbf16_ratio(void) {
#ifndef EI_NO_PTHREADS
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (pthread_once(&once, ei__dpbf16_measure) != 0) ei__dpbf16_measure(); /* once failing: measure here */
#else
    ei__dpbf16_measure();
#endif
    return ei__dpbf16_ratio_value;
}
#define EI__DPBF16_MIN_RATIO 1.25
#endif

EIDEF double ei_cpu_dpbf16_ratio(void) {
#ifdef EI__HAVE_AVX512BF16
    if (ei_cpu_supports(EI_SIMD_AVX512_BF16)) return ei__dpbf16_ratio();
#endif
    return 0.0;
}

/* The table of a path this CPU, OS and build can run (NULL otherwise); AUTO:
   the widest one: AMX tiles for all-bf16 attention where the CPU and OS
   have them (2x the avx512 kernel on a Sapphire Rapids, issue 16's
   measurement), else where the CPU has AVX512_BF16 the vdpbf16ps attention
   when it is the faster here (ei__dpbf16_ratio); always vdpbf16ps when the
   build defines EI_ATTN_PREFER_DPBF16. On AArch64 AUTO is neon: neon-bf16,
   neon-bfmmla and neon-fhm run only when forced, their speed never having been measured
   on ARM hardware. */
static const ei__kernels *ei__kernels_for(ei_simd path) {
    if (path == EI_SIMD_AUTO) {
#ifdef EI__HAVE_AVX512BF16
        if (ei_cpu_supports(EI_SIMD_AVX512_BF16)) {
#ifdef EI_ATTN_PREFER_DPBF16
            return ei__kernels_for(EI_SIMD_AVX512_BF16);
#else
#ifdef EI__HAVE_AMX
            if (ei_cpu_supports(EI_SIMD_AMX)) return ei__kernels_for(EI_SIMD_AMX);
#endif
            if (ei__dpbf16_ratio() >= EI__DPBF16_MIN_RATIO) return ei__kernels_for(EI_SIMD_AVX512_BF16);
#endif
        }
#endif
        if (ei_cpu_supports(EI_SIMD_AVX512)) return ei__kernels_for(EI_SIMD_AVX512);
        if (ei_cpu_supports(EI_SIMD_AVX2)) return ei__kernels_for(EI_SIMD_AVX2);
        if (ei_cpu_supports(EI_SIMD_NEON)) return ei__kernels_for(EI_SIMD_NEON);
        return &ei__kernels_scalar;
    }
    if (!ei_cpu_supports(path)) return NULL;
    switch (path) {
#ifdef EI__HAVE_AVX2
        case EI_SIMD_AVX2: return &ei__kernels_avx2;
#endif
#ifdef EI__HAVE_AVX512
        case EI_SIMD_AVX512: return &ei__kernels_avx512;
#endif
#ifdef EI__HAVE_AVX512BF16
        case EI_SIMD_AVX512_BF16: return &ei__kernels_avx512bf16;
#endif
#ifdef EI__HAVE_AMX
        case EI_SIMD_AMX: return &ei__kernels_amx;
#endif
#ifdef EI__HAVE_NEON
        case EI_SIMD_NEON: return &ei__kernels_neon;
#endif
#ifdef EI__HAVE_NEON_BF16
        case EI_SIMD_NEON_BF16: return &ei__kernels_neon_bf16;
        case EI_SIMD_NEON_BFMMLA: return &ei__kernels_neon_bfmmla;
#endif
#ifdef EI__HAVE_NEON_FHM
        case EI_SIMD_NEON_FHM: return &ei__kernels_neon_fhm;
#endif
        case EI_SIMD_SCALAR: return &ei__kernels_scalar;
        default: return NULL;
    }
}

#ifdef EI__POP_DIAGNOSTICS
#pragma GCC diagnostic pop
#endif
#endif /* ENTROPYINFER_IMPLEMENTATION_DONE */
#endif /* ENTROPYINFER_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
MIT License

Copyright (c) 2026 the entropyinfer authors

Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
*/
