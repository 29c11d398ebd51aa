// ei_decode_eval.cpp - decode KV-cache compression inside llama.cpp, measured
// (built as build/llama.cpp/bin/llama-ei-decode by entropyinfer.patch; run by
// examples/llama.cpp/eval_decode.sh and smoke.sh).
//
//   llama-ei-decode -m MODEL -f TEXT -c N_CTX [options] [--entropyinfer] [--entropyinfer-opt NAME=VALUE ...]
//
// Continuation (default): the first N_CTX - cont tokens of TEXT are the
// prompt (one llama_decode call, ubatches of -ub), then the next `cont`
// tokens are fed one llama_decode call each, as generated tokens are. With
// --entropyinfer the glue compresses the KV cache after decode_gap of them
// (and every recompress_every after). Printed, one "key value" per line:
//   nll_all, ppl_all      over the cont fed tokens (each predicted by the logits of the step before)
//   nll_after, ppl_after  over the tokens fed after the first compression (all of them when none ran)
//   step_ms_after         mean wall time of one single-token llama_decode after it (same steps when none ran)
//   compressions, cells_before, cells_after, kv_bytes_before, kv_bytes_after, compress_s
//   argmax, nll           the top-1 token and the NLL of every step (space separated: runs compare
//                         on the same tokens)
// --passkey DEPTH,KEY: the prompt is TEXT as filler with "The pass key is KEY. Remember it. KEY is
// the pass key." at DEPTH (0..1) of the filler, then "What is the pass key? The pass key is"; the
// prompt's last `fed` tokens (default 16, the default decode_gap; the question is about 11 tokens,
// so the filler's last ones come first) are fed one by one, so that compression, when on, fires
// before the answer: pass --fed at least the runs' largest decode_gap. Then `gen` (8) tokens are
// generated greedily:
//   answer "<text>", passkey_ok 0|1, compressions_before_answer N, compressed_before_question 0|1
//   (1: the first compression came before the question's first token was computed, so the answer
//   tests what the compression kept; 0: the question's K/V were computed over every cell and may
//   carry the key), plus the lines above. A decode_gap of G needs --fed of at least G + 12.
//
// Options: -t THREADS (nproc), -td THREADS (single-token steps; -t: on a shared machine 1 keeps
// llama.cpp's spinning thread barriers from stalling each step), -ub N (512), --cont N (256), --fed N (16), --gen N (8).
//
// Runs from one saved prefill (issue 37: every decode policy compared on one prompt):
//   --run NAME:OPTS (repeatable) --out-dir DIR [--refeed N (32)]
// The prompt minus its last N tokens is prefilled ONCE, densely, in a context without
// entropyinfer (llama.cpp unchanged), and its KV cache saved (llama_state_seq_get_data). Each run
// then gets a fresh context created with its own options (OPTS: "dense" for llama.cpp unchanged,
// else entropyinfer options name=value,... after the --entropyinfer-opt ones, with min_tokens
// raised so that every attention stays llama.cpp's: the prefill is dense for all runs), the cache
// restored (llama_state_seq_set_data), the last N prompt tokens fed again in one call (so that
// the decoders observe the prompt's last queries: SnapKV scores with them, the default's window
// starts with them), then the fed tokens as above; its lines go to DIR/NAME.out. Dense prefill
// for all: the runs differ only in what decode compression keeps, and the dense reference is the
// same prefill with no compression. N >= window: the observed prompt queries are the ones the
// decoders would have kept from a whole-prompt prefill. Printed on stdout: prefill_tokens, prefill_s,
// state_bytes, and per run its wall time (run NAME wall_s S).
// Every run also prints step_ms_median_after (the median step after the first compression:
// robust to a busy machine; compression steps included in step_ms_after only).
#include "llama.h"
#include "ei_llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static void die(const char * msg) {
    fprintf(stderr, "llama-ei-decode: %s\n", msg);
    exit(1);
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool bos) {
    int n = -llama_tokenize(vocab, text.c_str(), (int32_t) text.size(), nullptr, 0, bos, false);
    std::vector<llama_token> out((size_t) std::max(n, 0));
    if (n > 0 && llama_tokenize(vocab, text.c_str(), (int32_t) text.size(), out.data(), n, bos, false) != n) {
        die("tokenization failed");
    }
    return out;
}

static double nll_of(const float * logits, int n_vocab, llama_token target) {
    float m = -INFINITY;
    for (int i = 0; i < n_vocab; ++i) {
        m = std::max(m, logits[i]);
    }
    double z = 0.0;
    for (int i = 0; i < n_vocab; ++i) {
        z += std::exp((double) logits[i] - m);
    }
    return -((double) logits[target] - m - std::log(z));
}

static llama_token argmax_of(const float * logits, int n_vocab) {
    return (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
}

// one llama_decode of n tokens (only the last one's logits); returns its wall time
static double decode(llama_context * ctx, llama_token * tok, int n) {
    const double t0 = now_s();
    if (llama_decode(ctx, llama_batch_get_one(tok, n)) != 0) {
        die("llama_decode failed");
    }
    return now_s() - t0;
}

// What a run needs from main (one tokenised prompt, fed tokens, passkey).
struct eval_input {
    const llama_vocab *      vocab = nullptr;
    int                      n_vocab = 0;
    std::vector<llama_token> fed_tok;
    bool                     passkey = false;
    int                      key = 0, gen = 8;
    int                      question_at = 0; // passkey: the fed token where the question starts
};

// Feed the fed tokens one llama_decode call each after the prompt (whose last logits are `last`),
// and print the run's lines (see the top of the file) to out.
static void run_fed(llama_context * ctx, const eval_input & in, std::vector<float> last, FILE * out) {
    const int n_vocab = in.n_vocab;
    llama_entropyinfer_decode_info info;
    double nll_all = 0, nll_after = 0, ms_after = 0, ms_all = 0;
    int n_after = 0, first_after = -1;
    std::vector<double> step_ms;
    std::string argmax, nlls;
    for (size_t i = 0; i < in.fed_tok.size(); ++i) {
        const double nll = nll_of(last.data(), n_vocab, in.fed_tok[i]);
        nll_all += nll;
        if (first_after >= 0) {
            nll_after += nll;
            ++n_after;
        }
        argmax += (i ? " " : "") + std::to_string(argmax_of(last.data(), n_vocab));
        char nb[32];
        snprintf(nb, sizeof nb, "%s%.5f", i ? " " : "", nll);
        nlls += nb;
        llama_token t = in.fed_tok[i];
        const double dt = decode(ctx, &t, 1);
        ms_all += dt * 1e3;
        step_ms.push_back(dt * 1e3);
        if (first_after >= 0) {
            ms_after += dt * 1e3;
        }
        const float * lg = llama_get_logits_ith(ctx, -1);
        last.assign(lg, lg + n_vocab);
        if (first_after < 0 && llama_entropyinfer_get_decode_info(ctx, &info) == 0 && info.compressions > 0) {
            first_after = (int) i + 1; // the next token is predicted from the compressed cache
        }
    }
    const int nfed = (int) in.fed_tok.size();
    if (first_after < 0) { // no compression: every step counts (the median: from step 16, as the runs that compress)
        n_after   = nfed;
        nll_after = nll_all;
        ms_after  = ms_all;
    }
    if (!in.passkey) {
        fprintf(out, "fed_tokens %d\nnll_all %.6f\nppl_all %.4f\nafter_from %d\nnll_after %.6f\nppl_after %.4f\n", nfed,
                nll_all / nfed, std::exp(nll_all / nfed), first_after, n_after ? nll_after / n_after : 0.0,
                n_after ? std::exp(nll_after / n_after) : 0.0);
        const int steps = first_after >= 0 ? nfed - first_after : nfed;
        fprintf(out, "step_ms_after %.3f\n", steps > 0 ? ms_after / steps : 0.0);
        // the median step from the first compression on (without one: from step 16, where the
        // default decode_gap compresses, so dense's steps compare with the same positions)
        std::vector<double> after(step_ms.begin() + std::min(nfed - 1, first_after >= 0 ? first_after : 16), step_ms.end());
        std::sort(after.begin(), after.end());
        fprintf(out, "step_ms_median_after %.3f\n", after[after.size() / 2]);
        fprintf(out, "argmax %s\nnll %s\n", argmax.c_str(), nlls.c_str());
    } else {
        std::string answer;
        llama_token tok = argmax_of(last.data(), n_vocab);
        if (llama_entropyinfer_get_decode_info(ctx, &info) != 0) {
            memset(&info, 0, sizeof info);
        }
        const int before_answer = (int) info.compressions;
        // an eviction test when the cache was compressed before the question's tokens were computed
        // (first_after: the fed token after the first compression); otherwise their K/V, computed
        // with attention over every cell, may carry the key past any eviction
        const int before_question = first_after >= 0 && first_after <= in.question_at ? 1 : 0;
        for (int g = 0; g < in.gen; ++g) {
            char piece[256];
            const int n = llama_token_to_piece(in.vocab, tok, piece, sizeof piece, 0, false);
            if (n > 0) {
                answer.append(piece, (size_t) n);
            }
            if (g + 1 < in.gen) {
                decode(ctx, &tok, 1);
                tok = argmax_of(llama_get_logits_ith(ctx, -1), n_vocab);
            }
        }
        for (char & c : answer) {
            c = c == '\n' || c == '"' ? ' ' : c;
        }
        fprintf(out, "answer \"%s\"\npasskey_ok %d\ncompressions_before_answer %d\ncompressed_before_question %d\n",
                answer.c_str(), answer.find(std::to_string(in.key)) != std::string::npos ? 1 : 0, before_answer,
                before_question);
    }
    if (llama_entropyinfer_get_decode_info(ctx, &info) != 0) {
        memset(&info, 0, sizeof info);
    }
    fprintf(out, "compressions %d\ncells_before %lld\ncells_after %lld\nkv_bytes_before %lld\nkv_bytes_after %lld\ncompress_s %.3f\n",
            (int) info.compressions, (long long) info.cells_before, (long long) info.cells_after,
            (long long) info.bytes_before, (long long) info.bytes_after, info.seconds);
    fflush(out);
}

static void set_options(const std::string & opts) {
    char err[512];
    if (!opts.empty() && llama_entropyinfer_option(opts.c_str(), err, sizeof err) != 0) {
        die(err);
    }
}

int main(int argc, char ** argv) {
    std::string model_path, text_path, passkey, out_dir;
    int n_ctx = 0, threads = (int) std::max(1u, std::thread::hardware_concurrency()), ubatch = 512;
    int cont = 256, fed = 16, gen = 8, refeed = 32, threads_decode = 0;
    std::vector<std::string> base_opts;                          // --entropyinfer-opt, in order
    std::vector<std::pair<std::string, std::string>> runs;       // --run NAME:OPTS
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> const char * {
            if (i + 1 >= argc) {
                die(("missing value after " + a).c_str());
            }
            return argv[++i];
        };
        if (a == "-m") {
            model_path = next();
        } else if (a == "-f") {
            text_path = next();
        } else if (a == "-c") {
            n_ctx = atoi(next());
        } else if (a == "-t") {
            threads = atoi(next());
        } else if (a == "-td") {
            threads_decode = atoi(next());
        } else if (a == "-ub") {
            ubatch = atoi(next());
        } else if (a == "--cont") {
            cont = atoi(next());
        } else if (a == "--fed") {
            fed = atoi(next());
        } else if (a == "--gen") {
            gen = atoi(next());
        } else if (a == "--refeed") {
            refeed = atoi(next());
        } else if (a == "--passkey") {
            passkey = next();
        } else if (a == "--out-dir") {
            out_dir = next();
        } else if (a == "--run") {
            const std::string r = next();
            const size_t colon = r.find(':');
            if (colon == std::string::npos || colon == 0 || r.find('/') != std::string::npos) {
                die(("--run NAME:OPTS (OPTS: dense, or name=value,...; NAME without '/'), got '" + r + "'").c_str());
            }
            runs.emplace_back(r.substr(0, colon), r.substr(colon + 1));
        } else if (a == "--entropyinfer") {
            llama_entropyinfer_enable();
        } else if (a == "--entropyinfer-opt") {
            base_opts.push_back(next());
            set_options(base_opts.back()); // checked now: a bad option fails before any work
        } else {
            die(("unknown argument " + a).c_str());
        }
    }
    if (model_path.empty() || text_path.empty() || n_ctx < 64 || threads < 1 || ubatch < 1 || cont < 1 || fed < 1 || gen < 1 ||
        refeed < 1 || (!runs.empty() && out_dir.empty())) {
        die("usage: llama-ei-decode -m MODEL -f TEXT -c N_CTX [-t N] [-td N] [-ub N] [--cont N] [--passkey DEPTH,KEY] "
            "[--fed N] [--gen N] [--entropyinfer] [--entropyinfer-opt NAME=VALUE] "
            "[--run NAME:OPTS ... --out-dir DIR [--refeed N]]");
    }
    // every run's options are checked before the prefill (minutes at 32k)
    for (const auto & r : runs) {
        if (r.second != "dense") {
            llama_entropyinfer_reset();
            for (const auto & o : base_opts) {
                set_options(o);
            }
            set_options(r.second);
        }
    }
    std::string text;
    {
        FILE * f = fopen(text_path.c_str(), "rb");
        if (!f) {
            die(("cannot open " + text_path).c_str());
        }
        char buf[1 << 16];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
            text.append(buf, n);
        }
        fclose(f);
    }

    llama_backend_init();
    llama_log_set([](ggml_log_level level, const char * msg, void *) {
        if (level >= GGML_LOG_LEVEL_WARN || strstr(msg, "llama_kv_cache: size") != nullptr) { // the caches' sizes too
            fputs(msg, stderr);
        }
    }, nullptr);
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        die("cannot load the model");
    }
    eval_input in;
    in.vocab   = llama_model_get_vocab(model);
    in.n_vocab = llama_vocab_n_tokens(in.vocab);
    in.gen     = gen;
    const llama_vocab * vocab = in.vocab;

    // the prompt and the tokens fed after it
    std::vector<llama_token> prompt;
    if (passkey.empty()) {
        std::vector<llama_token> all = tokenize(vocab, text, true);
        if ((int) all.size() < n_ctx) {
            die("the text is shorter than the context");
        }
        prompt.assign(all.begin(), all.begin() + (n_ctx - cont));
        in.fed_tok.assign(all.begin() + (n_ctx - cont), all.begin() + n_ctx);
    } else {
        in.passkey = true;
        double depth = 0.5;
        if (sscanf(passkey.c_str(), "%lf,%d", &depth, &in.key) != 2 || depth < 0 || depth > 1) {
            die("--passkey DEPTH,KEY (DEPTH in 0..1)");
        }
        const std::string ks = std::to_string(in.key);
        std::vector<llama_token> needle = tokenize(vocab, " The pass key is " + ks + ". Remember it. " + ks + " is the pass key. ", false);
        std::vector<llama_token> question = tokenize(vocab, "\nWhat is the pass key? The pass key is", false);
        std::vector<llama_token> filler = tokenize(vocab, text, true);
        const int n_fill = n_ctx - gen - (int) needle.size() - (int) question.size() - 8;
        if (n_fill < 64 || (int) filler.size() < n_fill) {
            die("the text is too short for this context");
        }
        const int at = 1 + (int) (depth * (n_fill - 1));
        prompt.assign(filler.begin(), filler.begin() + at);
        prompt.insert(prompt.end(), needle.begin(), needle.end());
        prompt.insert(prompt.end(), filler.begin() + at, filler.begin() + n_fill);
        prompt.insert(prompt.end(), question.begin(), question.end());
        // the last fed tokens of the prompt (question and filler), never the needle's
        const int nf = std::min(fed, (n_fill - at) + (int) question.size());
        in.fed_tok.assign(prompt.end() - nf, prompt.end());
        in.question_at = std::max(0, nf - (int) question.size());
        prompt.resize(prompt.size() - (size_t) nf);
    }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = (uint32_t) n_ctx;
    cp.n_batch         = (uint32_t) n_ctx;
    cp.n_ubatch        = (uint32_t) ubatch;
    cp.n_threads       = threads_decode > 0 ? threads_decode : threads; // llama.cpp: single-token ubatches
    cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.no_perf         = false;

    if (runs.empty()) { // one run, the whole prompt in this process's options
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            die("cannot create the context");
        }
        const double t_prompt = decode(ctx, prompt.data(), (int) prompt.size());
        printf("prompt_tokens %d\nprompt_s %.3f\n", (int) prompt.size(), t_prompt);
        const float * lg = llama_get_logits_ith(ctx, -1);
        run_fed(ctx, in, std::vector<float>(lg, lg + in.n_vocab), stdout);
        llama_free(ctx);
    } else {
        const int R = std::min(refeed, (int) prompt.size() - 1);
        const int n_pre = (int) prompt.size() - R;
        std::vector<uint8_t> state;
        {
            llama_entropyinfer_reset(); // the prefill: llama.cpp unchanged
            llama_context * ctx = llama_init_from_model(model, cp);
            if (!ctx) {
                die("cannot create the context");
            }
            const double t_prompt = decode(ctx, prompt.data(), n_pre);
            state.resize(llama_state_seq_get_size(ctx, 0));
            if (state.empty() || llama_state_seq_get_data(ctx, state.data(), state.size(), 0) != state.size()) {
                die("llama_state_seq_get_data failed");
            }
            printf("prefill_tokens %d\nprefill_s %.3f\nstate_bytes %zu\n", n_pre, t_prompt, state.size());
            fflush(stdout);
            llama_free(ctx);
        }
        for (const auto & r : runs) {
            const double t0 = now_s();
            llama_entropyinfer_reset();
            if (r.second != "dense") {
                for (const auto & o : base_opts) {
                    set_options(o);
                }
                set_options("min_tokens=2147483647"); // dense attention for the prompt tokens fed again
                set_options(r.second);
            }
            llama_context * ctx = llama_init_from_model(model, cp);
            if (!ctx) {
                die("cannot create the context");
            }
            if (llama_state_seq_set_data(ctx, state.data(), state.size(), 0) != state.size()) {
                die("llama_state_seq_set_data failed");
            }
            decode(ctx, prompt.data() + n_pre, R);
            const std::string path = out_dir + "/" + r.first + ".out";
            FILE * out = fopen((path + ".tmp").c_str(), "w");
            if (!out) {
                die(("cannot write " + path).c_str());
            }
            fprintf(out, "run %s\noptions %s\nprompt_tokens %d\nprefill_tokens %d\nrefeed %d\n", r.first.c_str(),
                    r.second.c_str(), (int) prompt.size(), n_pre, R);
            const float * lg = llama_get_logits_ith(ctx, -1);
            run_fed(ctx, in, std::vector<float>(lg, lg + in.n_vocab), out);
            fprintf(out, "wall_s %.1f\n", now_s() - t0);
            fclose(out);
            if (rename((path + ".tmp").c_str(), path.c_str()) != 0) { // complete runs only under their name
                die(("cannot rename to " + path).c_str());
            }
            printf("run %s wall_s %.1f\n", r.first.c_str(), now_s() - t0);
            fflush(stdout);
            llama_free(ctx);
        }
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
