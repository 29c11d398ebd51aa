#!/usr/bin/env python3
"""Compare the C engine's dense logits with llama.cpp (llama-cpp-python).

    python3 examples/gemma/check_logits.py --engine build/gemma \
        --model .cache/model/gemma-3-270m-q4_k_m.gguf [--tokens 512]

Creates a test-only virtual environment (.cache/venv by default) with numpy
and llama-cpp-python on first use, then:
  1. tokenizes the text with both tokenizers and reports any difference;
  2. runs the engine (--dump-logits) and llama.cpp on the SAME token ids;
  3. reports max/mean |logit difference|, top-1 agreement, and perplexity
     of both on the prose.

Tolerance (why it is not 1e-5): both read the same quantized weights, but
llama.cpp's CPU matmuls quantize the *activations* to 8 bits (q8_0/q8_K)
before every quantized-weight dot product, and its attention uses an f16
K/V cache by default (we ask for f32). Our engine keeps activations in f32.
8-bit activation rounding (relative error ~0.4% per product, accumulated
over 18 layers) moves logits of magnitude ~10-30 by a few hundredths on
average and up to a few tenths at the extremes. So we require:
  mean |diff| <= 0.05 * std(logits), max |diff| <= 1.0 (on logits whose
  spread is ~30), top-1 agreement >= 98%, perplexity within 1%.
A real bug (wrong norm convention, rope layout, window, scale, a bad dequant
block) shifts logits by whole units and breaks every one of these.
"""
import argparse
import os
import subprocess
import sys
import venv


def ensure_venv(path):
    py = os.path.join(path, "bin", "python")
    if not os.path.exists(py):
        print(f"creating test venv {path}", flush=True)
        venv.create(path, with_pip=True)
    try:
        subprocess.run([py, "-c", "import numpy, llama_cpp"], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        print("installing numpy + llama-cpp-python into the test venv (builds llama.cpp: several minutes)", flush=True)
        env = dict(os.environ)
        env.setdefault("CMAKE_ARGS", "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON")
        subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "numpy", "llama-cpp-python"],
                       check=True, env=env)
    return py


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="build/gemma")
    ap.add_argument("--model", default=".cache/model/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--venv", default=".cache/venv")
    ap.add_argument("--out", default="build/check_logits")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.inner:
        py = ensure_venv(a.venv)
        os.makedirs(a.out, exist_ok=True)
        dump = os.path.join(a.out, "engine_logits.f32")
        cmd = [a.engine, "-m", a.model, "--dump-logits", dump, "-f", a.text, "-t", str(a.tokens)]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        args = [py, os.path.abspath(__file__), "--inner", "--model", a.model, "--text", a.text,
                "--tokens", str(a.tokens), "--out", a.out]
        sys.exit(subprocess.run(args).returncode)

    import numpy as np
    from llama_cpp import Llama

    dump = os.path.join(a.out, "engine_logits.f32")
    toks = np.fromfile(dump + ".tokens", dtype=np.int32)
    n = len(toks)
    llm = Llama(model_path=a.model, n_ctx=max(n, 512), n_batch=512, n_ubatch=512, logits_all=True,
                n_threads=os.cpu_count(), verbose=False, type_k=0, type_v=0, flash_attn=False)
    text = open(a.text, "rb").read()
    ref_toks = llm.tokenize(text, add_bos=True, special=False)[:n]
    same = sum(1 for x, y in zip(ref_toks, toks.tolist()) if x == y)
    first_diff = next((i for i, (x, y) in enumerate(zip(ref_toks, toks.tolist())) if x != y), None)
    print(f"tokenizer: {same}/{n} ids equal to llama.cpp's" + (f" (first difference at {first_diff})" if first_diff is not None else ""))

    llm.reset()
    llm.eval(toks.tolist())
    V = llm.n_vocab()
    ref = np.array(llm.scores[:n], dtype=np.float32).reshape(n, V)
    mine = np.fromfile(dump, dtype=np.float32).reshape(n, V)
    d = np.abs(ref - mine)

    def ppl(lg):
        lg = lg[:-1].astype(np.float64)
        m = lg.max(axis=1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(lg - m).sum(axis=1)))
        nll = lse - lg[np.arange(n - 1), toks[1:]]
        return float(np.exp(nll.mean()))

    top1 = float((ref.argmax(1) == mine.argmax(1)).mean())
    p_ref, p_mine = ppl(ref), ppl(mine)
    std = float(ref.std())
    print(f"logits: {n} tokens x {V}; max |diff| {d.max():.4f}, mean |diff| {d.mean():.5f}, logit std {std:.3f}")
    print(f"top-1 agreement {top1 * 100:.2f}%")
    print(f"perplexity on {os.path.basename(a.text)} ({n} tokens): engine {p_mine:.4f}, llama.cpp {p_ref:.4f} "
          f"(rel diff {abs(p_mine - p_ref) / p_ref * 100:.3f}%)")
    ok = (same == n and d.mean() <= 0.05 * std and d.max() <= 1.0 and top1 >= 0.98
          and abs(p_mine - p_ref) / p_ref <= 0.01)
    print("check-logits:", "PASS" if ok else "FAIL")
    print(f"1 passed, 0 failed" if ok else "0 passed, 1 failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
