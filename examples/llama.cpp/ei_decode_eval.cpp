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
// last `fed` (default: decode_gap, 16) tokens of the question are fed one by one (so compression,
// when on, fires before the answer), then `gen` (8) tokens are generated greedily:
//   answer "<text>", passkey_ok 0|1, plus the compression lines above.
//
// Options: -t THREADS (nproc), -ub N (512), --cont N (256), --fed N (16), --gen N (8).
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

int main(int argc, char ** argv) {
    std::string model_path, text_path, passkey;
    int n_ctx = 0, threads = (int) std::max(1u, std::thread::hardware_concurrency()), ubatch = 512;
    int cont = 256, fed = 16, gen = 8;
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
        } else if (a == "-ub") {
            ubatch = atoi(next());
        } else if (a == "--cont") {
            cont = atoi(next());
        } else if (a == "--fed") {
            fed = atoi(next());
        } else if (a == "--gen") {
            gen = atoi(next());
        } else if (a == "--passkey") {
            passkey = next();
        } else if (a == "--entropyinfer") {
            llama_entropyinfer_enable();
        } else if (a == "--entropyinfer-opt") {
            char err[512];
            if (llama_entropyinfer_option(next(), err, sizeof err) != 0) {
                die(err);
            }
        } else {
            die(("unknown argument " + a).c_str());
        }
    }
    if (model_path.empty() || text_path.empty() || n_ctx < 64 || threads < 1 || ubatch < 1 || cont < 1 || fed < 1 || gen < 1) {
        die("usage: llama-ei-decode -m MODEL -f TEXT -c N_CTX [-t N] [-ub N] [--cont N] [--passkey DEPTH,KEY] "
            "[--fed N] [--gen N] [--entropyinfer] [--entropyinfer-opt NAME=VALUE]");
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
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    // the prompt and the tokens fed after it
    std::vector<llama_token> prompt, fed_tok;
    int key = 0;
    if (passkey.empty()) {
        std::vector<llama_token> all = tokenize(vocab, text, true);
        if ((int) all.size() < n_ctx) {
            die("the text is shorter than the context");
        }
        prompt.assign(all.begin(), all.begin() + (n_ctx - cont));
        fed_tok.assign(all.begin() + (n_ctx - cont), all.begin() + n_ctx);
    } else {
        double depth = 0.5;
        if (sscanf(passkey.c_str(), "%lf,%d", &depth, &key) != 2 || depth < 0 || depth > 1) {
            die("--passkey DEPTH,KEY (DEPTH in 0..1)");
        }
        const std::string ks = std::to_string(key);
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
        const int nf = std::min(fed, (int) question.size());
        fed_tok.assign(prompt.end() - nf, prompt.end());
        prompt.resize(prompt.size() - (size_t) nf);
    }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = (uint32_t) n_ctx;
    cp.n_batch         = (uint32_t) n_ctx;
    cp.n_ubatch        = (uint32_t) ubatch;
    cp.n_threads       = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.no_perf         = false;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die("cannot create the context");
    }

    const double t_prompt = decode(ctx, prompt.data(), (int) prompt.size());
    printf("prompt_tokens %d\nprompt_s %.3f\n", (int) prompt.size(), t_prompt);

    llama_entropyinfer_decode_info info;
    std::vector<float> last(llama_get_logits_ith(ctx, -1), llama_get_logits_ith(ctx, -1) + n_vocab);
    double nll_all = 0, nll_after = 0, ms_after = 0, ms_all = 0;
    int n_after = 0, first_after = -1;
    std::string argmax, nlls;
    for (size_t i = 0; i < fed_tok.size(); ++i) {
        const double nll = nll_of(last.data(), n_vocab, fed_tok[i]);
        nll_all += nll;
        if (first_after >= 0) {
            nll_after += nll;
            ++n_after;
        }
        argmax += (i ? " " : "") + std::to_string(argmax_of(last.data(), n_vocab));
        char nb[32];
        snprintf(nb, sizeof nb, "%s%.5f", i ? " " : "", nll);
        nlls += nb;
        const double dt = decode(ctx, &fed_tok[i], 1);
        ms_all += dt * 1e3;
        if (first_after >= 0) {
            ms_after += dt * 1e3;
        }
        const float * lg = llama_get_logits_ith(ctx, -1);
        last.assign(lg, lg + n_vocab);
        if (first_after < 0 && llama_entropyinfer_get_decode_info(ctx, &info) == 0 && info.compressions > 0) {
            first_after = (int) i + 1; // the next token is predicted from the compressed cache
        }
    }
    const int nfed = (int) fed_tok.size();
    if (first_after < 0) { // no compression: every step counts
        n_after   = nfed;
        nll_after = nll_all;
        ms_after  = ms_all;
    }
    if (passkey.empty()) {
        printf("fed_tokens %d\nnll_all %.6f\nppl_all %.4f\nafter_from %d\nnll_after %.6f\nppl_after %.4f\n", nfed,
               nll_all / nfed, std::exp(nll_all / nfed), first_after, n_after ? nll_after / n_after : 0.0,
               n_after ? std::exp(nll_after / n_after) : 0.0);
        const int steps = first_after >= 0 ? nfed - first_after : nfed;
        printf("step_ms_after %.3f\nargmax %s\nnll %s\n", steps > 0 ? ms_after / steps : 0.0, argmax.c_str(), nlls.c_str());
    } else {
        std::string answer;
        llama_token tok = argmax_of(last.data(), n_vocab);
        for (int g = 0; g < gen; ++g) {
            char piece[256];
            const int n = llama_token_to_piece(vocab, tok, piece, sizeof piece, 0, false);
            if (n > 0) {
                answer.append(piece, (size_t) n);
            }
            if (g + 1 < gen) {
                decode(ctx, &tok, 1);
                tok = argmax_of(llama_get_logits_ith(ctx, -1), n_vocab);
            }
        }
        for (char & c : answer) {
            c = c == '\n' || c == '"' ? ' ' : c;
        }
        printf("answer \"%s\"\npasskey_ok %d\n", answer.c_str(), answer.find(std::to_string(key)) != std::string::npos ? 1 : 0);
    }
    if (llama_entropyinfer_get_decode_info(ctx, &info) != 0) {
        memset(&info, 0, sizeof info);
    }
    printf("compressions %d\ncells_before %lld\ncells_after %lld\nkv_bytes_before %lld\nkv_bytes_after %lld\ncompress_s %.3f\n",
           (int) info.compressions, (long long) info.cells_before, (long long) info.cells_after,
           (long long) info.bytes_before, (long long) info.bytes_after, info.seconds);
    fflush(stdout);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
