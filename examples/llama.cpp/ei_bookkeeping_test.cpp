// ei_bookkeeping_test.cpp - positions after decode compression, through llama.cpp's public API
// (issue 34; built as build/llama.cpp/bin/llama-ei-bookkeeping by entropyinfer.patch, run by
// `make llama-cpp-bookkeeping` on SmolLM2-135M and Gemma 3 270M).
//
//   llama-ei-bookkeeping -m MODEL -f TEXT [-t THREADS (2)] [-n PROMPT_TOKENS (1200)] [--suffix N (32)] [--multi-only]
//
// A prompt of the first PROMPT_TOKENS tokens of TEXT is prefilled densely (min_tokens above the
// prompt: llama.cpp's attention, so that a context without entropyinfer holds the same K/V), then
// tokens are generated greedily one llama_decode each until decode compression ran (decode_gap 4,
// decode_budget_ratio 0.5). Then, printing each check:
//   compress   a compression ran and cut the cells in use
//   range      seq_pos_max still the last position, F = llama_entropyinfer_seq_first_missing in [0, max)
//   refuse     seq_rm(F + 1, -1) and seq_rm(max, -1) return false and change nothing
//   rewind     llama_entropyinfer_seq_rewind(max) succeeds, F stays, the token decodes again
//   state      the sequence saved and restored into a second context: the same F, truncation refused
//   shift      seq_add(+7) moves F and max by 7; a context shift's discard (seq_rm of 16 positions
//              above F, then seq_add of the rest by -16) succeeds, F stays, a token decodes after it,
//              a truncation above F is still refused; seq_div(2) makes F F/2
//   pause      restored into a third context, a token decoded, then a context shift's discard above F:
//              12 tokens after it (positions jump over the compressed prefix) compress nothing;
//              seq_rm at F, 8 tokens fed from F and 12 generated: it compresses again
//   seq_rm(F)  seq_rm(F, -1) succeeds, nothing missing after it
//   reuse      the suffix tokens [F, F + N) decoded again (one call, every logit) against a context
//              that never had entropyinfer (every position there), fed the prompt as A was, cut at F
//              with seq_rm and fed the same suffix: logits bit-equal, else within 1e-3 of the
//              largest |logit| (printed: which, and the largest difference). A "note" line adds the
//              difference to a fresh context fed [0, F) in one call: not a bit-for-bit reference,
//              llama.cpp's CPU matmuls round differently at other batch sizes
//   per-seq    llama_entropyinfer_seq_set_enabled(off): no compression in 12 more tokens; on again:
//              it compresses again within 12 (observation restarted after the reuse)
// Then several sequences in one context (n_seq_max 2), with --kv-unified off ("split") and on
// ("unified"): two different prompts (200 and 170 tokens) prefilled densely as sequences 0 and 1 in
// a context without entropyinfer of that layout, saved and restored into context A (entropyinfer, decode_gap 4)
// and context B (entropyinfer off); A and B then get the same batches: 3 tokens of sequence 0 alone,
// one batch of 2 tokens of each, interleaved (s0 s1 s0 s1: in a unified cache a ubatch that mixes
// the sequences, each observed run by run), then one token of each per llama_decode until both
// compressed. The tokens are the texts' own continuations (the same in A and B), every logit read:
//   ms-X order   sequence 0 compressed first, while sequence 1 had not been
//   ms-X intact  right after that: sequence 1 has nothing missing (F = -1) and its whole position
//                range; sequence 0 has F >= 0
//   ms-X logits  A against B: every row of both sequences before any compression, and sequence 1's
//                rows while only sequence 0 was compressed (up to the batch after which sequence 1
//                compressed): split, bit-equal (the streams are independent); unified, within 1e-3
//                of the largest |logit| (printed: bit-equal or the largest difference; sequence 0's
//                compaction moves sequence 1's cells in the shared stream, in cell order)
//   ms-X both    each sequence compressed (llama_entropyinfer_get_seq_decode_info: its own cells
//                dropped), F >= 0 for both, the context's decode info counts 2 sequences
// Then prefill of several sequences in one ubatch (entropyinfer with small segments: segment_size 64,
// threshold_len 128, base_budget 96; compression off): both texts fed as 4 batches of 48 tokens of
// each, interleaved (in a unified cache their cells alternate, so each sequence's keys are gathered),
// then positions 10..19 of sequence 0 removed and batches of 40 + 1 and 40 + 40 tokens (sequence 0
// misses positions: attended densely over its cells). Contexts in both layouts (unified, --kv-unified
// off): without entropyinfer (R), sparse (U), mode=ei-dense (D):
//   mp-unified served  U unified served every ubatch of the 6 batches, of 2 sequences, sparse (density
//                      < 1); D unified too
//   mp-unified logits  U and D, unified against --kv-unified off, over the interleaved prompts: bit-equal
//                      (each sequence planned and attended as its own, whatever the layout), or at most 1.25x
//                      as far apart as R's two layouts where llama.cpp's own layers differ between them (Gemma's
//                      sliding-window layers: 9.35 against our 9.87 logits; SmolLM2, every layer ours: bit-equal)
//   mp-dense logits    sequence 0's rows after the removal, D against R (unified): top-1 equal in 90%
// The mp checks are for the CPU backend: with the layers on a GPU, a ubatch whose sequences' cells
// interleave runs llama.cpp's attention there (CUDA build, H100, 2026-12-06: 1 of 6 served, as designed).
// ms-shared: the unified layout again, sequence 1 made by llama_memory_seq_cp of sequence 0's prompt
// (every prompt cell shared by both), each then fed its own continuation: when sequence 0 compresses,
// the shared cells it evicts stay sequence 1's (intact: F = -1, every position), and sequence 1's
// logits are as without entropyinfer until it compresses itself.
// One line per check ("ok" or "FAIL"), then a summary; exit status 1 when a check failed.
#include "llama.h"
#include "ei_llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static int g_failed = 0, g_checks = 0;

static void check(bool ok, const char * name, const std::string & detail) {
    ++g_checks;
    g_failed += ok ? 0 : 1;
    printf("%-4s %-10s %s\n", ok ? "ok" : "FAIL", name, detail.c_str());
    fflush(stdout);
}

static void die(const std::string & msg) {
    fprintf(stderr, "llama-ei-bookkeeping: %s\n", msg.c_str());
    exit(2);
}

static std::string fmt(const char * f, ...) __attribute__((format(printf, 1, 2)));
static std::string fmt(const char * f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// one llama_decode of tokens at positions pos0.. of sequence 0; every logit when all_logits
static bool decode(llama_context * ctx, const llama_token * tok, int n, llama_pos pos0, bool all_logits) {
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        b.token[i]     = tok[i];
        b.pos[i]       = pos0 + i;
        b.n_seq_id[i]  = 1;
        b.seq_id[i][0] = 0;
        b.logits[i]    = all_logits || i == n - 1;
    }
    b.n_tokens = n;
    const bool ok = llama_decode(ctx, b) == 0;
    llama_batch_free(b);
    return ok;
}

static llama_token argmax_last(llama_context * ctx, int n_vocab) {
    const float * lg = llama_get_logits_ith(ctx, -1);
    return (llama_token) (std::max_element(lg, lg + n_vocab) - lg);
}

static int compressions(const llama_context * ctx) {
    llama_entropyinfer_decode_info info;
    return llama_entropyinfer_get_decode_info(ctx, &info) == 0 ? info.compressions : -1;
}

static void set_option(const char * o) {
    char err[512];
    if (llama_entropyinfer_option(o, err, sizeof err) != 0) {
        die(err);
    }
}

static llama_context * new_context(llama_model * model, int n_ctx, int threads, int n_seq = 1, bool unified = false,
                                   ggml_type kv_type = GGML_TYPE_F16, bool flash = true) {
    llama_context_params cp = llama_context_default_params();
    cp.type_k          = kv_type;
    cp.type_v          = kv_type;
    cp.n_ctx           = (uint32_t) n_ctx;
    cp.n_seq_max       = (uint32_t) n_seq;
    cp.kv_unified      = unified;
    cp.n_batch         = (uint32_t) n_ctx;
    cp.n_ubatch        = 512;
    cp.n_threads       = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full        = true; // Gemma 3: the sliding-window layers keep every position, as the reference does
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die("cannot create a context");
    }
    return ctx;
}

struct logit_diff {
    bool   bit_equal = true;
    double max_diff = 0, max_abs = 0;
};

// la against lb (la.size() floats); max_abs: the largest |logit| of lb
static logit_diff compare(const std::vector<float> & la, const float * lb) {
    logit_diff d;
    for (size_t i = 0; i < la.size(); ++i) {
        d.max_diff  = std::max(d.max_diff, (double) std::fabs(la[i] - lb[i]));
        d.max_abs   = std::max(d.max_abs, (double) std::fabs(lb[i]));
        d.bit_equal = d.bit_equal && memcmp(&la[i], &lb[i], sizeof(float)) == 0;
    }
    return d;
}

struct seq_view {
    llama_pos min, max, first_missing;
};

static seq_view view(llama_context * ctx, llama_seq_id seq = 0) {
    llama_memory_t mem = llama_get_memory(ctx);
    return { llama_memory_seq_pos_min(mem, seq), llama_memory_seq_pos_max(mem, seq), llama_entropyinfer_seq_first_missing(ctx, seq) };
}

// one token of a batch: (token, position, sequence)
struct tok_at {
    llama_token  tok;
    llama_pos    pos;
    llama_seq_id seq;
};

static bool decode_mixed(llama_context * ctx, const std::vector<tok_at> & ts, bool all_logits = true) {
    llama_batch b = llama_batch_init((int32_t) ts.size(), 0, 1);
    for (size_t i = 0; i < ts.size(); ++i) {
        b.token[i]     = ts[i].tok;
        b.pos[i]       = ts[i].pos;
        b.n_seq_id[i]  = 1;
        b.seq_id[i][0] = ts[i].seq;
        b.logits[i]    = all_logits || i + 1 == ts.size();
    }
    b.n_tokens = (int32_t) ts.size();
    const bool ok = llama_decode(ctx, b) == 0;
    llama_batch_free(b);
    return ok;
}

static int seq_compressions(const llama_context * ctx, llama_seq_id seq) {
    llama_entropyinfer_decode_info info;
    return llama_entropyinfer_get_seq_decode_info(ctx, seq, &info) == 0 ? info.compressions : -1;
}

// Several sequences in one context (see the header: ms-split, ms-unified). p0, p1: the two prompts
// and their continuations (the tokens fed after them); states: the two sequences prefilled by a
// context without entropyinfer of the same layout (a saved sequence names its KV streams), saved and
// restored into A and B.
static void multi_seq(llama_model * model, int threads, bool unified, const std::vector<llama_token> & p0,
                      const std::vector<llama_token> & p1, int n0, int n1, int n_vocab, bool shared = false) {
    const double      t0   = now_s();
    const std::string name = shared ? "shared" : unified ? "unified" : "split";
    const int         n_ctx = 2 * 512;
    llama_entropyinfer_reset();
    std::vector<std::vector<uint8_t>> states(2);
    if (!shared) {
        llama_context * donor = new_context(model, n_ctx, threads, 2, unified);
        for (int s = 0; s < 2; ++s) {
            std::vector<tok_at> prompt;
            for (int i = 0; i < (s == 0 ? n0 : n1); ++i) {
                prompt.push_back({ (s == 0 ? p0 : p1)[(size_t) i], i, s });
            }
            if (!decode_mixed(donor, prompt, false)) {
                die("prefilling the two sequences failed (" + name + ")");
            }
            states[s].resize(llama_state_seq_get_size(donor, s));
            if (llama_state_seq_get_data(donor, states[s].data(), states[s].size(), s) != states[s].size()) {
                die("saving a sequence failed (" + name + ")");
            }
        }
        llama_free(donor);
    }
    llama_context * b = new_context(model, n_ctx, threads, 2, unified);
    set_option("min_tokens=2147483647,decode_gap=4,recompress_every=8,decode_budget_ratio=0.5");
    llama_context * a = new_context(model, n_ctx, threads, 2, unified);
    llama_entropyinfer_reset();
    // shared: sequence 0's prompt prefilled in A and B alike (llama.cpp's attention: min_tokens), then
    // llama_memory_seq_cp to sequence 1, whose own continuation (p1's) follows the common prefix
    std::vector<llama_token> p1s(p0.begin(), p0.begin() + n0);
    p1s.insert(p1s.end(), p1.begin() + n1, p1.end());
    for (llama_context * c : { a, b }) {
        if (shared) {
            std::vector<tok_at> prompt;
            for (int i = 0; i < n0; ++i) {
                prompt.push_back({ p0[(size_t) i], i, 0 });
            }
            if (!decode_mixed(c, prompt, false)) {
                die("prefilling the common prefix failed (" + name + ")");
            }
            llama_memory_seq_cp(llama_get_memory(c), 0, 1, -1, -1);
            continue;
        }
        for (int s = 0; s < 2; ++s) {
            if (llama_state_seq_set_data(c, states[s].data(), states[s].size(), s) != states[s].size()) {
                die("restoring a sequence failed (" + name + ")");
            }
        }
    }
    const std::vector<llama_token> * pr[2] = { &p0, shared ? &p1s : &p1 };
    llama_pos next[2] = { n0, shared ? n0 : n1 };
    auto tok = [&](int s) { // the next token of sequence s (its text's continuation)
        const tok_at t = { (*pr[s])[(size_t) next[s]], next[s], s };
        next[s]++;
        return t;
    };
    std::vector<std::vector<tok_at>> steps;
    for (int i = 0; i < 3; ++i) {
        steps.push_back({ tok(0) });
    }
    {
        const tok_at a0 = tok(0), b0 = tok(1), a1 = tok(0), b1 = tok(1);
        steps.push_back({ a0, b0, a1, b1 });
    }
    int    k_first = -1, k_both = -1, rows_equal = 0, rows_cmp = 0;
    double max_diff = 0, max_abs = 0;
    bool   intact = false;
    std::string intact_detail = "sequence 0 was never compressed alone";
    for (size_t k = 0; k < 40 && k_both < 0; ++k) {
        if (k >= steps.size()) {
            steps.push_back({ tok(0), tok(1) });
        }
        const std::vector<tok_at> & st = steps[k];
        const int c0_before = seq_compressions(a, 0), c1_before = seq_compressions(a, 1);
        if (!decode_mixed(a, st) || !decode_mixed(b, st)) {
            die("a decode step failed (" + name + ")");
        }
        // rows to compare: all before any compression; sequence 1's while only sequence 0 was compressed
        for (size_t i = 0; i < st.size(); ++i) {
            const bool cmp = (c0_before == 0 && c1_before == 0) || (st[i].seq == 1 && c1_before == 0);
            if (!cmp) {
                continue;
            }
            const float * la = llama_get_logits_ith(a, (int32_t) i);
            const std::vector<float> va(la, la + n_vocab);
            const logit_diff d = compare(va, llama_get_logits_ith(b, (int32_t) i));
            rows_cmp++;
            rows_equal += d.bit_equal ? 1 : 0;
            max_diff = std::max(max_diff, d.max_diff);
            max_abs  = std::max(max_abs, d.max_abs);
        }
        const int c0 = seq_compressions(a, 0), c1 = seq_compressions(a, 1);
        if (k_first < 0 && c0 > 0) {
            k_first = (int) k;
            const seq_view v0 = view(a, 0), v1 = view(a, 1);
            intact = c1 == 0 && v1.first_missing == -1 && v1.min == 0 && v1.max == next[1] - 1 && v0.first_missing >= 0;
            intact_detail = fmt("after batch %d: sequence 1 F %d, positions %d..%d (fed 0..%d), compressions %d; "
                                "sequence 0 F %d", (int) k + 1, v1.first_missing, v1.min, v1.max, next[1] - 1, c1,
                                v0.first_missing);
        }
        if (c0 > 0 && c1 > 0) {
            k_both = (int) k;
        }
    }
    check(k_first >= 0 && k_both > k_first, ("ms-" + name).c_str(),
          fmt("order: sequence 0 compressed after batch %d, sequence 1 after batch %d", k_first + 1, k_both + 1));
    check(intact, ("ms-" + name).c_str(), "intact: " + intact_detail);
    const bool logits_ok = rows_cmp > 0 && (unified ? (rows_equal == rows_cmp || max_diff <= 1e-3 * max_abs)
                                                    : rows_equal == rows_cmp);
    check(logits_ok, ("ms-" + name).c_str(),
          fmt("logits: %d rows against the context without entropyinfer (both sequences before any compression, "
              "sequence 1 while only sequence 0 was compressed): %d bit-equal, max |diff| %.3g, largest |logit| %.3g%s",
              rows_cmp, rows_equal, max_diff, max_abs, unified ? " (tolerance 1e-3 of it)" : " (bit-equal required)"));
    llama_entropyinfer_decode_info i0, i1, ia;
    llama_entropyinfer_get_seq_decode_info(a, 0, &i0);
    llama_entropyinfer_get_seq_decode_info(a, 1, &i1);
    llama_entropyinfer_get_decode_info(a, &ia);
    const llama_pos f0 = llama_entropyinfer_seq_first_missing(a, 0), f1 = llama_entropyinfer_seq_first_missing(a, 1);
    check(i0.compressions >= 1 && i1.compressions >= 1 && i0.cells_after < i0.cells_before && i1.cells_after < i1.cells_before &&
              f0 >= 0 && f1 >= 0 && ia.sequences == 2, ("ms-" + name).c_str(),
          fmt("both: sequence 0 %d compression(s), cells %lld -> %lld, F %d; sequence 1 %d, cells %lld -> %lld, F %d; "
              "the context: %d compressions of %d sequences (%.2f s)", i0.compressions, (long long) i0.cells_before,
              (long long) i0.cells_after, f0, i1.compressions, (long long) i1.cells_before, (long long) i1.cells_after, f1,
              ia.compressions, ia.sequences, now_s() - t0));
    llama_free(a);
    llama_free(b);
}

// Prefill of several sequences in one ubatch (see the header: mp-unified, mp-dense). p0, p1: the two
// texts; every context has n_seq_max 2 and gets the same batches.
static void multi_prefill(llama_model * model, int threads, const std::vector<llama_token> & p0,
                          const std::vector<llama_token> & p1, int n_vocab) {
    const double t0    = now_s();
    const int    n_ctx = 2 * 512, chunk = 48;
    const char * small = "min_tokens=32,segment_size=64,threshold_len=128,base_budget=96,last_segment_dense=0,compress=0";
    llama_entropyinfer_reset();
    // contexts by [layout: 0 unified, 1 --kv-unified off]: llama.cpp's attention, sparse, ei-dense
    llama_context * ref[2]   = { new_context(model, n_ctx, threads, 2, true), new_context(model, n_ctx, threads, 2, false) };
    set_option(small);
    llama_context * sp[2]    = { new_context(model, n_ctx, threads, 2, true), new_context(model, n_ctx, threads, 2, false) };
    set_option("mode=ei-dense");
    llama_context * dn[2]    = { new_context(model, n_ctx, threads, 2, true), new_context(model, n_ctx, threads, 2, false) };
    llama_entropyinfer_reset();
    llama_context * all_ctx[6] = { ref[0], ref[1], sp[0], sp[1], dn[0], dn[1] };
    const std::vector<llama_token> * pr[2] = { &p0, &p1 };
    llama_pos next[2] = { 0, 0 };
    auto run = [&](int seq, int n, std::vector<tok_at> & b) { // the next n tokens of sequence seq
        for (int i = 0; i < n; ++i, ++next[seq]) {
            b.push_back({ (*pr[seq])[(size_t) next[seq]], next[seq], seq });
        }
    };
    std::vector<std::vector<tok_at>> steps;
    for (int k = 0; k < 4; ++k) { // the prompts in interleaved chunks: a ubatch holds both, cells alternate
        steps.emplace_back();
        run(0, chunk, steps.back());
        run(1, chunk, steps.back());
    }
    const size_t n_first = steps.size();
    steps.emplace_back(); // after positions 10 .. 19 of sequence 0 are removed: 40 of it, 1 of sequence 1
    run(0, 40, steps.back());
    run(1, 1, steps.back());
    steps.emplace_back();
    run(1, 40, steps.back());
    run(0, 40, steps.back());
    auto row = [&](llama_context * c, size_t i) {
        const float * l = llama_get_logits_ith(c, (int32_t) i);
        return std::vector<float>(l, l + n_vocab);
    };
    auto top1 = [](const std::vector<float> & l) { return std::max_element(l.begin(), l.end()) - l.begin(); };
    int    n_lay = 0, eq_lay = 0, n_miss = 0, agree_miss = 0;
    double diff_lay = 0, diff_ref = 0, diff_miss = 0, abs_miss = 0;
    for (size_t k = 0; k < steps.size(); ++k) {
        for (llama_context * c : all_ctx) {
            if (k == n_first && !llama_memory_seq_rm(llama_get_memory(c), 0, 10, 20)) {
                die("seq_rm(0, 10, 20) failed (mp)");
            }
            if (!decode_mixed(c, steps[k])) {
                die("a prefill step failed (mp)");
            }
        }
        for (size_t i = 0; i < steps[k].size(); ++i) {
            if (k < n_first) { // the interleaved prompts: each layout's rows against the other's
                const std::vector<float> r0 = row(ref[0], i);
                diff_ref = std::max(diff_ref, compare(r0, llama_get_logits_ith(ref[1], (int32_t) i)).max_diff);
                for (llama_context ** c : { sp, dn }) {
                    const logit_diff d = compare(row(c[0], i), llama_get_logits_ith(c[1], (int32_t) i));
                    n_lay++;
                    eq_lay += d.bit_equal ? 1 : 0;
                    diff_lay = std::max(diff_lay, d.max_diff);
                }
            } else if (steps[k][i].seq == 0) { // sequence 0 without positions 10 .. 19: ei-dense against llama.cpp
                const std::vector<float> a = row(dn[0], i), b = row(ref[0], i);
                const logit_diff d = compare(a, b.data());
                n_miss++;
                agree_miss += top1(a) == top1(b) ? 1 : 0;
                diff_miss = std::max(diff_miss, d.max_diff);
                abs_miss  = std::max(abs_miss, d.max_abs);
            }
        }
    }
    llama_entropyinfer_prefill_info iu, is, id;
    llama_entropyinfer_get_prefill_info(sp[0], &iu);
    llama_entropyinfer_get_prefill_info(sp[1], &is);
    llama_entropyinfer_get_prefill_info(dn[0], &id);
    check(iu.ubatches_served == (int64_t) steps.size() && iu.sequences == 2 && iu.density < 1.0 &&
              id.ubatches_served == (int64_t) steps.size(), "mp-unified",
          fmt("served: unified cache, %d batches of both sequences: %lld of %lld ubatches served, %d sequences, density %.4f "
              "(ei-dense: %lld of %lld; --kv-unified off: %lld of %lld)", (int) steps.size(), (long long) iu.ubatches_served,
              (long long) iu.ubatches, iu.sequences, iu.density, (long long) id.ubatches_served, (long long) id.ubatches,
              (long long) is.ubatches_served, (long long) is.ubatches));
    check(n_lay > 0 && (eq_lay == n_lay || diff_lay <= 1.25 * diff_ref), "mp-unified",
          fmt("logits: the interleaved prompts, unified cache against --kv-unified off (each sequence in a stream of its "
              "own), sparse and ei-dense: %d of %d rows bit-equal, max |diff| %.3g; llama.cpp's own attention differs "
              "between the two layouts by %.3g (bit-equal required, or at most 1.25x llama.cpp's own difference where "
              "layers it runs, e.g. Gemma's sliding-window ones, differ between the layouts)", eq_lay, n_lay, diff_lay, diff_ref));
    check(n_miss > 0 && agree_miss * 10 >= n_miss * 9, "mp-dense",
          fmt("logits: sequence 0 with positions 10..19 removed (attended densely over the cells it has), ei-dense "
              "against llama.cpp's attention in the unified cache: top-1 equal in %d of %d rows (90%% required), max "
              "|diff| %.3g, largest |logit| %.3g (%.2f s)", agree_miss, n_miss, diff_miss, abs_miss, now_s() - t0));
    for (llama_context * c : all_ctx) {
        llama_free(c);
    }
}

// The two layouts' checks (ms-split, ms-unified): the prompts and continuations cut from the text.
static void multi_seq_all(llama_model * model, const std::vector<llama_token> & all, const std::string & text_path,
                          int threads, int n_vocab) {
    const int n_tok = (int) all.size();
    const int n0 = 200, n1 = 170, off1 = 1500, cont = 48;
    if (n_tok < off1 + n1 + cont) {
        die(fmt("%s: %d tokens, %d needed", text_path.c_str(), n_tok, off1 + n1 + cont));
    }
    const std::vector<llama_token> p0(all.begin(), all.begin() + n0 + cont), p1(all.begin() + off1, all.begin() + off1 + n1 + cont);
    multi_seq(model, threads, false, p0, p1, n0, n1, n_vocab);
    multi_seq(model, threads, true, p0, p1, n0, n1, n_vocab);
    multi_seq(model, threads, true, p0, p1, n0, n1, n_vocab, true);
    if (n_tok < off1 + 300) {
        die(fmt("%s: %d tokens, %d needed", text_path.c_str(), n_tok, off1 + 300));
    }
    multi_prefill(model, threads, std::vector<llama_token>(all.begin(), all.begin() + 300),
                  std::vector<llama_token>(all.begin() + off1, all.begin() + off1 + 300), n_vocab);
}

int main(int argc, char ** argv) {
    std::string model_path, text_path;
    int threads = 2, n_prompt = 1200, n_suffix = 32;
    bool multi_only = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (++i >= argc) {
                die(a + ": missing value");
            }
            return argv[i];
        };
        if (a == "-m") {
            model_path = next();
        } else if (a == "-f") {
            text_path = next();
        } else if (a == "-t") {
            threads = atoi(next().c_str());
        } else if (a == "-n") {
            n_prompt = atoi(next().c_str());
        } else if (a == "--suffix") {
            n_suffix = atoi(next().c_str());
        } else if (a == "--multi-only") {
            multi_only = true;
        } else {
            die("unknown argument " + a + " (usage: -m MODEL -f TEXT [-t N] [-n PROMPT_TOKENS] [--suffix N] [--multi-only])");
        }
    }
    if (model_path.empty() || text_path.empty() || threads < 1 || n_prompt < 256 || n_suffix < 1) {
        die("usage: -m MODEL -f TEXT [-t THREADS >= 1] [-n PROMPT_TOKENS >= 256] [--suffix N >= 1]");
    }
    const double t_start = now_s();

    llama_backend_init();
    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_ERROR) {
            fputs(text, stderr);
        }
    }, nullptr);
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        die("cannot load " + model_path);
    }
    const llama_vocab * vocab   = llama_model_get_vocab(model);
    const int           n_vocab = llama_vocab_n_tokens(vocab);

    std::ifstream in(text_path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::vector<llama_token> toks(text.size() + 16);
    const int n_tok = llama_tokenize(vocab, text.c_str(), (int32_t) text.size(), toks.data(), (int32_t) toks.size(), true, false);
    if (n_tok < n_prompt + n_suffix) {
        die(fmt("%s: %d tokens, %d needed", text_path.c_str(), n_tok, n_prompt + n_suffix));
    }
    const std::vector<llama_token> all(toks.begin(), toks.begin() + n_tok);
    if (multi_only) { // only the checks of several sequences
        multi_seq_all(model, all, text_path, threads, n_vocab);
        llama_model_free(model);
        llama_backend_free();
        printf("summary: %d/%d checks passed, total %.1f s\n", g_checks - g_failed, g_checks, now_s() - t_start);
        return g_failed ? 1 : 0;
    }
    toks.resize((size_t) n_prompt); // the history: the prompt, then the generated tokens
    const int n_ctx = n_prompt + 512;

    // A: entropyinfer with a dense prefill and a quick compression
    llama_entropyinfer_reset();
    set_option("min_tokens=2147483647,decode_gap=4,recompress_every=8,decode_budget_ratio=0.5");
    llama_context * a = new_context(model, n_ctx, threads);
    double t0 = now_s();
    if (!decode(a, toks.data(), n_prompt, 0, false)) {
        die("prefill failed");
    }
    const double t_prefill = now_s() - t0;
    t0 = now_s();
    for (int step = 0; step < 64 && compressions(a) < 1; ++step) {
        const llama_token t = argmax_last(a, n_vocab);
        toks.push_back(t);
        if (!decode(a, &t, 1, (llama_pos) toks.size() - 1, false)) {
            die("a generation step failed");
        }
    }
    llama_entropyinfer_decode_info info;
    llama_entropyinfer_get_decode_info(a, &info);
    check(info.compressions >= 1 && info.cells_after < info.cells_before, "compress",
          fmt("%d generated tokens, %d compression(s), cells %lld -> %lld (%.2f s)", (int) toks.size() - n_prompt,
              info.compressions, (long long) info.cells_before, (long long) info.cells_after, now_s() - t0));
    if (info.compressions < 1) {
        die("no compression: nothing to check");
    }

    // range: llama.cpp still reports the whole range; F says where the hole starts
    const seq_view v = view(a);
    const llama_pos F = v.first_missing, last = (llama_pos) toks.size() - 1;
    check(v.max == last && F >= 0 && F < v.max, "range",
          fmt("pos_min %d, pos_max %d (last position %d), first missing F = %d", v.min, v.max, last, F));
    if (F < 0 || F >= v.max) {
        die("no missing position: nothing to check");
    }

    // refuse: truncations that would keep a prefix with a hole
    llama_memory_t mem_a = llama_get_memory(a);
    const bool rm_above = llama_memory_seq_rm(mem_a, 0, F + 1, -1);
    const bool rm_last  = llama_memory_seq_rm(mem_a, 0, v.max, -1);
    const seq_view v2 = view(a);
    check(!rm_above && !rm_last && v2.max == v.max && v2.first_missing == F, "refuse",
          fmt("seq_rm(F+1, -1) %s, seq_rm(max, -1) %s; after: pos_max %d, F %d", rm_above ? "succeeded" : "refused",
              rm_last ? "succeeded" : "refused", v2.max, v2.first_missing));

    // rewind: speculative decoding's rollback of its last token, then the token again
    const bool rewound = llama_entropyinfer_seq_rewind(a, 0, v.max);
    const seq_view v3 = view(a);
    const bool redecoded = decode(a, &toks.back(), 1, v.max, false);
    const seq_view v4 = view(a);
    check(rewound && v3.max == v.max - 1 && v3.first_missing == F && redecoded && v4.max == v.max, "rewind",
          fmt("rewind(max) %s: pos_max %d, F %d; decoded again: %s, pos_max %d", rewound ? "ok" : "refused", v3.max,
              v3.first_missing, redecoded ? "ok" : "failed", v4.max));

    // state: save the sequence, restore it into another context
    {
        std::vector<uint8_t> state(llama_state_seq_get_size(a, 0));
        const bool saved = !state.empty() && llama_state_seq_get_data(a, state.data(), state.size(), 0) == state.size();
        llama_context * c = new_context(model, n_ctx, threads);
        const bool restored = saved && llama_state_seq_set_data(c, state.data(), state.size(), 0) == state.size();
        const seq_view vc = view(c);
        const bool refused = !llama_memory_seq_rm(llama_get_memory(c), 0, F + 1, -1);
        check(restored && vc.max == v.max && vc.first_missing == F && refused, "state",
              fmt("%zu bytes, restored %s: pos_max %d, F %d, seq_rm(F+1, -1) %s", state.size(), restored ? "ok" : "failed",
                  vc.max, vc.first_missing, refused ? "refused" : "succeeded"));

        // shift: the record moves with the cells
        llama_memory_t mem_c = llama_get_memory(c);
        llama_memory_seq_add(mem_c, 0, 0, -1, 7);
        const seq_view vs = view(c);
        const llama_pos Fs = F + 7;
        bool ok = vs.max == v.max + 7 && vs.first_missing == Fs;
        std::string detail = fmt("seq_add(+7): pos_max %d, F %d", vs.max, vs.first_missing);
        // a context shift's discard above F (llama-server: n_keep, then n_discard positions)
        const int n_discard = 16;
        if (Fs + 1 + n_discard < vs.max) {
            const bool rm = llama_memory_seq_rm(mem_c, 0, Fs + 1, Fs + 1 + n_discard);
            llama_memory_seq_add(mem_c, 0, Fs + 1 + n_discard, -1, -n_discard);
            const seq_view vd = view(c);
            const llama_token t = toks.back();
            const bool dec = decode(c, &t, 1, vd.max + 1, false);
            const bool trunc = llama_memory_seq_rm(mem_c, 0, Fs + 1, -1);
            // seq_div (self-extend) merges positions: F/2 counts as missing (conservative)
            llama_memory_seq_div(mem_c, 0, 0, -1, 2);
            const seq_view vv = view(c);
            ok = ok && rm && vd.max == vs.max - n_discard && vd.first_missing == Fs && dec && !trunc &&
                 vv.first_missing == Fs / 2;
            detail += fmt("; discard [F+1, F+%d) %s, shift -%d: pos_max %d, F %d; a token after it %s; "
                          "seq_rm(F+1, -1) %s; seq_div(2): F %d", 1 + n_discard, rm ? "ok" : "refused", n_discard, vd.max,
                          vd.first_missing, dec ? "decoded" : "failed", trunc ? "succeeded" : "refused", vv.first_missing);
        }
        check(ok, "shift", detail);

        llama_free(c);

        // pause: in a third context restored from the same state, a context shift (positions jump over
        // the compressed prefix) pauses compression; once the prefix is exact again (cut at F) it
        // observes and compresses again
        llama_context * d = new_context(model, n_ctx, threads);
        llama_memory_t mem_d = llama_get_memory(d);
        const bool restored_d = llama_state_seq_set_data(d, state.data(), state.size(), 0) == state.size();
        llama_pos pos = v.max + 1;
        auto generate = [&](int n) {
            bool ok_all = true;
            for (int i = 0; i < n; ++i) {
                const llama_token t = argmax_last(d, n_vocab);
                ok_all = decode(d, &t, 1, pos++, false) && ok_all;
            }
            return ok_all;
        };
        const bool g0 = restored_d && decode(d, &toks.back(), 1, pos++, false); // observation starts here
        const bool rm_d = llama_memory_seq_rm(mem_d, 0, F + 1, F + 1 + n_discard);
        llama_memory_seq_add(mem_d, 0, F + 1 + n_discard, -1, -n_discard);
        pos -= n_discard;
        const int  c0 = compressions(d);
        const bool g1 = generate(12);
        const int  c1 = compressions(d);
        const bool cut = llama_memory_seq_rm(mem_d, 0, F, -1);
        pos = F;
        const bool fed = cut && decode(d, toks.data() + F, 8, F, false);
        pos += 8;
        const bool g2 = fed && generate(12);
        const int  c2 = compressions(d);
        check(g0 && rm_d && g1 && c1 == c0 && cut && g2 && c2 > c1, "pause",
              fmt("after a context shift over the compressed prefix 12 tokens: compressions %d -> %d; cut at F %s, "
                  "8 tokens fed from F and 12 generated: -> %d", c0, c1, cut ? "ok" : "refused", c2));
        llama_free(d);
    }

    // reuse: keep exactly [0, F), decode the suffix again, compare with a context that never compressed
    const bool rm_f = llama_memory_seq_rm(mem_a, 0, F, -1);
    const seq_view vr = view(a);
    check(rm_f && vr.max == F - 1 && vr.first_missing == -1, "seq_rm(F)",
          fmt("seq_rm(F, -1) %s: pos_max %d, first missing %d", rm_f ? "ok" : "refused", vr.max, vr.first_missing));
    {
        std::vector<llama_token> suffix;
        for (int i = 0; i < n_suffix; ++i) { // the history from F on, then the text after the prompt
            const size_t j = (size_t) F + (size_t) i;
            suffix.push_back(j < toks.size() ? toks[j] : all[(size_t) n_prompt + (j - toks.size())]);
        }
        t0 = now_s();
        if (!decode(a, suffix.data(), n_suffix, F, true)) {
            die("decoding the suffix failed");
        }
        std::vector<float> la(llama_get_logits(a), llama_get_logits(a) + (size_t) n_suffix * n_vocab);

        // B: llama.cpp unchanged (entropyinfer off), never compressed: the prompt fed as A was, then
        // seq_rm(F, -1) and the suffix. The same ubatches as A, so bit-equal logits are expected
        llama_entropyinfer_reset();
        llama_context * b = new_context(model, n_ctx, threads);
        if (!decode(b, toks.data(), n_prompt, 0, false) || !llama_memory_seq_rm(llama_get_memory(b), 0, F, -1) ||
            !decode(b, suffix.data(), n_suffix, F, true)) {
            die("decoding the reference failed");
        }
        const logit_diff d = compare(la, llama_get_logits(b));
        check(d.bit_equal || d.max_diff <= 1e-3 * d.max_abs, "reuse",
              fmt("%d suffix tokens from F against a never-compressed context fed the prompt, cut at F, and the suffix: %s "
                  "(max |diff| %.3g, largest |logit| %.3g, tolerance 1e-3 of it; %.2f s)", n_suffix,
                  d.bit_equal ? "bit-equal" : "not bit-equal", d.max_diff, d.max_abs, now_s() - t0));
        llama_free(b);

        // for information: a fresh context fed only [0, F) in one call, then the suffix. Its K/V of
        // [0, F) come from a batch of F tokens instead of the prompt's ubatches of 512, and llama.cpp's
        // CPU matmuls round differently at another batch size, so this is no bit-for-bit reference
        llama_context * f = new_context(model, n_ctx, threads);
        if ((F > 0 && !decode(f, toks.data(), F, 0, false)) || !decode(f, suffix.data(), n_suffix, F, true)) {
            die("decoding the fresh reference failed");
        }
        const logit_diff e = compare(la, llama_get_logits(f));
        printf("note reuse       against a fresh context fed [0, F) then the suffix (other batch shapes): %s, max |diff| %.3g\n",
               e.bit_equal ? "bit-equal" : "not bit-equal", e.max_diff);
        llama_free(f);
    }

    // per-seq: off for sequence 0, then on again
    {
        std::vector<llama_token> hist(toks.begin(), toks.begin() + F);
        llama_pos pos = vr.max + 1 + n_suffix;
        auto generate = [&](int n) {
            for (int i = 0; i < n; ++i) {
                const llama_token t = argmax_last(a, n_vocab);
                if (!decode(a, &t, 1, pos++, false)) {
                    die("a generation step failed");
                }
            }
        };
        const int c0 = compressions(a);
        const int off = llama_entropyinfer_seq_set_enabled(a, 0, false);
        generate(12);
        const int c1 = compressions(a);
        const int on = llama_entropyinfer_seq_set_enabled(a, 0, true);
        generate(12);
        const int c2 = compressions(a);
        const int bad = llama_entropyinfer_seq_set_enabled(a, 1 << 20, true);
        check(off == 0 && c1 == c0 && on == 0 && c2 > c1 && bad == -1, "per-seq",
              fmt("off: compressions %d -> %d in 12 tokens; on again: -> %d in 12 more; an unknown sequence refused: %s",
                  c0, c1, c2, bad == -1 ? "yes" : "no"));
    }
    llama_free(a);

    multi_seq_all(model, all, text_path, threads, n_vocab);

    llama_model_free(model);
    llama_backend_free();

    printf("summary: %d/%d checks passed, prompt %d tokens (prefill %.2f s), total %.1f s\n", g_checks - g_failed, g_checks,
           n_prompt, t_prefill, now_s() - t_start);
    return g_failed ? 1 : 0;
}
