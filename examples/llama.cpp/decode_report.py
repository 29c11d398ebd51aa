#!/usr/bin/env python3
"""decode_report.py - the report of examples/llama.cpp/eval_decode.sh (issue 37), standard library only.

    python3 examples/llama.cpp/decode_report.py [LOGS (build/decode_eval)] [OUT_PREFIX (build/decode_eval)]

Reads LOGS/<text>/<model-context>/{cont,passkey-D}/<run>.out (llama-ei-decode --run lines) and writes
OUT_PREFIX.json (one record per policy run), OUT_PREFIX.md (the tables) and OUT_PREFIX.svg
(continuation perplexity against the fraction of KV positions kept, one line per policy, one
panel per text and model/context).

Perplexity and top-1 agreement of a run are over the continuation tokens after its first
compression (after_from); dense's perplexity over the same tokens is the reference. Decode speed:
the median single-token step after the first compression (dense: from step 16), which a busy
machine disturbs less than the mean; recompressions are in the mean (step_ms_after), not here.
"""
import json
import math
import os
import sys

POLICIES = ["entropyinfer", "entropyinfer_recent", "entropyinfer_entropyw", "snapkv", "streaming", "h2o"]
LABELS = {
    "entropyinfer": "entropyinfer (the paper's)",
    "entropyinfer_recent": "entropyinfer, half the budget newest (decode_recent 0.5)",
    "entropyinfer_entropyw": "entropyinfer, layers weighted by entropy",
    "snapkv": "SnapKV",
    "streaming": "StreamingLLM",
    "h2o": "H2O",
}
COLORS = {"entropyinfer": "#d62728", "entropyinfer_recent": "#8c564b", "entropyinfer_entropyw": "#ff9896", "snapkv": "#1f77b4",
          "streaming": "#2ca02c", "h2o": "#9467bd"}


def panel_key(text, mc):
    """handbook before perlfaq; SmolLM2 before Gemma; shorter contexts first"""
    model, _, ctx = mc.rpartition("-")
    return ({"handbook": 0}.get(text, 1), text, {"smollm2": 0, "gemma": 1}.get(model, 2), model,
            int(ctx) if ctx.isdigit() else 0)


def passkey_cell(run, d):
    """A run's passkey answer: 1 found, 0 lost; "?" for a run that did not compress before the
    question's tokens were computed (their K/V, computed over every cell, may carry the
    key: not a test of what the compression kept), as every run before llama-ei-decode printed
    compressed_before_question."""
    ok = int(d.get("passkey_ok", "0"))
    if run == "dense":
        return ok
    return ok if d.get("compressed_before_question") == "1" else "?"


def parse(path):
    d = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition(" ")
            d[k] = v
    return d


def ppl(nll, start):
    xs = nll[start:]
    return math.exp(sum(xs) / len(xs)) if xs else float("nan")


def paired(a, b, start):
    """mean and standard error of the per-token NLL difference a - b over steps start.. (the same tokens):
    exp(mean) is the perplexity ratio; 2 standard errors say how far 240 tokens pin it down"""
    d = [x - y for x, y in zip(a[start:], b[start:])]
    n = len(d)
    m = sum(d) / n
    var = sum((x - m) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    return m, math.sqrt(var / n)


def frac_label(r):
    """1/n for 1/n, else the fraction itself (0.9)"""
    if r >= 1:
        return "1"
    n = round(1 / r)
    return "1/%d" % n if abs(n * r - 1) < 1e-6 else "%g" % r


def collect(logs):
    recs = []
    for text in sorted(os.listdir(logs)):
        for mc in sorted(os.listdir(os.path.join(logs, text))):
            base = os.path.join(logs, text, mc)
            if not os.path.isdir(base):
                continue
            cont = os.path.join(base, "cont")
            dense = os.path.join(cont, "dense.out")
            pk = {}
            for sub in sorted(os.listdir(base)):
                if sub.startswith("passkey-"):
                    for fn in os.listdir(os.path.join(base, sub)):
                        if fn.endswith(".out"):
                            pk.setdefault(fn[:-4], {})[sub[len("passkey-"):]] = passkey_cell(
                                fn[:-4], parse(os.path.join(base, sub, fn)))
            if not os.path.exists(dense):
                continue
            dn = parse(dense)
            d_nll = [float(x) for x in dn["nll"].split()]
            d_arg = dn["argmax"].split()
            recs.append({"text": text, "model_context": mc, "run": "dense", "policy": "dense", "fraction": 1.0,
                         "ppl_dense": ppl(d_nll, 16), "ppl": ppl(d_nll, 16), "vs_dense_pct": 0.0, "agreement_pct": 100.0,
                         "step_ms_median": float(dn.get("step_ms_median_after", "nan")),
                         "prompt_tokens": int(dn["prompt_tokens"]), "fed_tokens": int(dn.get("fed_tokens", "256")),
                         "passkey": pk.get("dense", {}),
                         "options": "dense", "wall_s": float(dn.get("wall_s", "nan")), "nll": d_nll})
            for fn in sorted(os.listdir(cont)):
                if not fn.endswith(".out") or fn == "dense.out":
                    continue
                name = fn[:-4]
                r = parse(os.path.join(cont, fn))
                policy, _, frac = name.rpartition("-")
                start = int(r["after_from"])
                if start < 0:
                    start = 16
                nll = [float(x) for x in r["nll"].split()]
                arg = r["argmax"].split()
                p, pd = ppl(nll, start), ppl(d_nll, start)
                agree = [a == b for a, b in zip(arg[start:], d_arg[start:])]
                m, se = paired(nll, d_nll, start)
                recs.append({"text": text, "model_context": mc, "run": name, "policy": policy, "fraction": float(frac),
                             "after_from": start, "ppl": p, "ppl_dense": pd, "vs_dense_pct": 100 * (p / pd - 1),
                             "vs_dense_2se_pct": [100 * (math.exp(m - 2 * se) - 1), 100 * (math.exp(m + 2 * se) - 1)],
                             "nll": nll,
                             "agreement_pct": 100 * sum(agree) / len(agree),
                             "compressions": int(r["compressions"]), "cells_before": int(r["cells_before"]),
                             "cells_after": int(r["cells_after"]), "kv_bytes_before": int(r["kv_bytes_before"]),
                             "kv_bytes_after": int(r["kv_bytes_after"]), "compress_s": float(r["compress_s"]),
                             "step_ms_mean": float(r["step_ms_after"]),
                             "step_ms_median": float(r.get("step_ms_median_after", "nan")),
                             "prompt_tokens": int(r["prompt_tokens"]), "passkey": pk.get(name, {}),
                             "options": r.get("options", ""), "wall_s": float(r.get("wall_s", "nan"))})
    return recs


def markdown(recs):
    out = ["| text | model, context | policy | kept | KV cells before -> after | continuation ppl (dense) | vs dense (2 s.e.) | "
           "top-1 agreement | passkey 10/50/90 % | decode ms/token median (tok/s) | compress s (all) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {p: i for i, p in enumerate(["dense"] + POLICIES)}
    for r in sorted(recs, key=lambda r: (panel_key(r["text"], r["model_context"]), -r["fraction"] if r["policy"] == "dense" else 0,
                                         r["fraction"], order.get(r["policy"], 99))):
        pk = "/".join(str(r["passkey"].get(d, "-")) for d in ("0.1", "0.5", "0.9")) if r["passkey"] else "-"
        ms = r["step_ms_median"]
        tps = "%.1f (%.1f)" % (ms, 1000 / ms) if ms == ms and ms > 0 else "-"
        if r["policy"] == "dense":
            out.append("| %s | %s | dense | 1 | %d + %d | %.4f | (reference) | - | %s | %s | - |" % (
                r["text"], r["model_context"], r["prompt_tokens"], r.get("fed_tokens", 256), r["ppl"], pk, tps))
        else:
            out.append("| %s | %s | %s | %s | %d -> %d | %.4f (%.4f) | %+.2f %% (%+.1f..%+.1f) | %.1f %% | %s | %s | %.2f (%d) |" % (
                r["text"], r["model_context"], r["policy"], frac_label(r["fraction"]), r["cells_before"], r["cells_after"],
                r["ppl"], r["ppl_dense"], r["vs_dense_pct"], r["vs_dense_2se_pct"][0], r["vs_dense_2se_pct"][1],
                r["agreement_pct"], pk, tps, r["compress_s"],
                r["compressions"]))
    return "\n".join(out) + "\n"


def versus(recs):
    """the paper's claim, run by run: the default's continuation perplexity against each baseline's at
    the same fraction, on the same tokens (both from the later of the two first compressions)"""
    out = ["| text | model, context | kept | paper's vs SnapKV | paper's vs StreamingLLM | paper's vs H2O | "
           "entropy-weighted layers vs paper's | decode_recent 0.5 vs SnapKV | vs StreamingLLM | vs H2O | vs paper's |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["text"], r["model_context"], r["fraction"]) for r in recs if r["policy"] == "entropyinfer"},
                  key=lambda k: (panel_key(k[0], k[1]), k[2]))
    for text, mc, f in keys:
        by = {r["policy"]: r for r in recs if r["text"] == text and r["model_context"] == mc and r["fraction"] == f}
        cells = []
        for a, b in (("entropyinfer", "snapkv"), ("entropyinfer", "streaming"), ("entropyinfer", "h2o"),
                     ("entropyinfer_entropyw", "entropyinfer"), ("entropyinfer_recent", "snapkv"),
                     ("entropyinfer_recent", "streaming"), ("entropyinfer_recent", "h2o"),
                     ("entropyinfer_recent", "entropyinfer")):
            if a in by and b in by:
                start = max(by[a]["after_from"], by[b]["after_from"])
                m, se = paired(by[a]["nll"], by[b]["nll"], start)
                cells.append("%+.2f %% (%+.1f..%+.1f)" % (100 * (math.exp(m) - 1), 100 * (math.exp(m - 2 * se) - 1),
                                                          100 * (math.exp(m + 2 * se) - 1)))
            else:
                cells.append("-")
        if any(c != "-" for c in cells):
            out.append("| %s | %s | %s | %s |" % (text, mc, frac_label(f), " | ".join(cells)))
    return "\n".join(out) + "\n"


def svg(recs):
    panels = sorted({(r["text"], r["model_context"]) for r in recs}, key=lambda k: panel_key(*k))
    if not panels:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>\n'
    W, H, ml, mr, mt, mb = 360, 280, 66, 12, 30, 44
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    legend_h = 24 * ((len(POLICIES) + 2) // 2) + 10
    tw, th = max(cols * W, 720), rows * H + legend_h
    s = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (tw, th),
         '<rect width="100%" height="100%" fill="white"/>']
    xs_all = [1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0]
    for i, (text, mc) in enumerate(panels):
        ox, oy = (i % cols) * W, (i // cols) * H
        pr = [r for r in recs if r["text"] == text and r["model_context"] == mc]
        ys = [r["vs_dense_pct"] for r in pr]
        top = max(ys + [1.0])
        ymax = next(v for v in (2, 5, 10, 20, 30, 50, 100, 200, 500, 1000, float(math.ceil(top))) if v >= top)
        step = ymax / 5.0
        ymin = -step * math.ceil(-min(ys) / step) if min(ys) < 0 else 0.0
        pw, ph = W - ml - mr, H - mt - mb

        def X(f):
            return ox + ml + pw * (math.log2(f) - math.log2(1 / 16)) / (math.log2(1.0) - math.log2(1 / 16))

        def Y(v):
            return oy + mt + ph * (1 - (v - ymin) / (ymax - ymin))
        s.append('<text x="%.1f" y="%.1f" text-anchor="middle" font-weight="bold">%s, %s</text>' % (
            ox + ml + pw / 2, oy + 18, {"handbook": "Debian handbook", "perlfaq": "Perl FAQ"}.get(text, text), mc))
        s.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888"/>' % (ox + ml, oy + mt, pw, ph))
        for k in range(int(round((ymax - ymin) / step)) + 1):
            v = ymin + step * k
            s.append('<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/>' % (ox + ml, ox + ml + pw, Y(v), Y(v)))
            s.append('<text x="%.1f" y="%.1f" text-anchor="end">%+.0f %%</text>' % (ox + ml - 4, Y(v) + 4, v) if ymax - ymin >= 5
                     else '<text x="%.1f" y="%.1f" text-anchor="end">%+.1f %%</text>' % (ox + ml - 4, Y(v) + 4, v))
        for f in xs_all:
            s.append('<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>' % (X(f), oy + mt + ph + 14, frac_label(f)))
        s.append('<text x="%.1f" y="%.1f" text-anchor="middle">fraction of KV positions kept</text>' % (
            ox + ml + pw / 2, oy + mt + ph + 30))
        s.append('<text transform="translate(%.1f,%.1f) rotate(-90)" text-anchor="middle">continuation ppl vs dense</text>' % (
            ox + 12, oy + mt + ph / 2))
        s.append('<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black" stroke-dasharray="4,3"/>' % (
            ox + ml, ox + ml + pw, Y(0), Y(0)))
        for p in POLICIES:
            pts = sorted((r["fraction"], r["vs_dense_pct"]) for r in pr if r["policy"] == p)
            if not pts:
                continue
            if len(pts) > 1:
                s.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (
                    COLORS[p], " ".join("%.1f,%.1f" % (X(f), Y(v)) for f, v in pts)))
            for f, v in pts:
                s.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s %s: %+.2f %%</title></circle>' % (
                    X(f), Y(v), COLORS[p], LABELS[p], frac_label(f), v))
    for j, p in enumerate(POLICIES + ["dense"]):
        lx, ly = 20 + (j % 2) * (tw - 40) / 2, rows * H + 16 + 24 * (j // 2)
        if p == "dense":
            s.append('<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black" stroke-dasharray="4,3"/>' % (lx, lx + 24, ly, ly))
            s.append('<text x="%.1f" y="%.1f">dense (same tokens)</text>' % (lx + 30, ly + 4))
        else:
            s.append('<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>' % (lx, lx + 24, ly, ly, COLORS[p]))
            s.append('<text x="%.1f" y="%.1f">%s</text>' % (lx + 30, ly + 4, LABELS[p]))
    s.append("</svg>")
    return "\n".join(s) + "\n"


def main():
    logs = sys.argv[1] if len(sys.argv) > 1 else "build/decode_eval"
    prefix = sys.argv[2] if len(sys.argv) > 2 else "build/decode_eval"
    recs = collect(logs)
    with open(prefix + ".json", "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(r) for r in recs) + "\n]\n")  # one run a line
    md = markdown(recs) + "\nThe default against each baseline at equal budget (continuation perplexity ratio - 1, " \
        "negative: the default is better; 2 standard errors of the per-token difference):\n\n" + versus(recs)
    with open(prefix + ".md", "w") as f:
        f.write("# Decode compression in llama.cpp: policies at equal budgets (eval_decode.sh)\n\n" + md +
                "\n![continuation perplexity vs fraction kept](%s.svg)\n" % os.path.basename(prefix))
    with open(prefix + ".svg", "w") as f:
        f.write(svg(recs))
    sys.stdout.write(md)


if __name__ == "__main__":
    main()
