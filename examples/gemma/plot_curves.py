#!/usr/bin/env python3
"""Quality against density, from gemma-eval's JSON reports, as one SVG.

    python3 examples/gemma/plot_curves.py build/eval/*.json -o build/eval_curves.svg

Python 3 standard library only. Reads any number of JSON reports written by
build/gemma-eval (examples/gemma/eval.c: the markdown path with .json) and
draws, per context (one column each, ascending), two panels: perplexity change
against dense (%) and top-1 agreement with dense (%), both against density (%
of the dense causal keys a sparse segment attends).

Series: each run's ragged row is a point of its ranking's series ("reference
ranking", "sampled ranking", "antidiagonal ranking"), each oracle row a point of "oracle ranking (at
the <ranking>'s counts)"; points are grouped by (context, series) and joined
in order of density. Where runs of one ranking differ in more than the swept
knobs (base_budget, top_p), e.g. in sink/local blocks or rank_samples, each
distinct configuration is its own series, its label naming what differs. A
point of a ragged series is annotated with its base budget (keep counts from
the budget recurrence) or its top_p. Rows whose values are null are skipped.
"""

import argparse
import json
import math
import os
import sys
from html import escape

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
ORACLE_PALETTE = ["#333333", "#7f7f7f", "#8c6d31", "#393b79"]
MARKERS = ["circle", "square", "triangle", "diamond", "triangle-down", "cross"]

# fields of a run's configuration that name a series when they differ between
# runs of one ranking (the swept knobs, base_budget and the top_p value, do not)
IDENT_FIELDS = [
    ("counts", "counts"),
    ("rank_samples", "samples"),
    ("rank_rows", "rows"),
    ("rank_precision", "scores"),
    ("budget_max_factor", "cap x base"),
    ("sink_blocks", "sink"),
    ("local_blocks", "local"),
    ("segment_size", "segment"),
    ("block_size", "block"),
    ("threshold_len", "threshold"),
    ("dense_layers", "dense layers"),
    ("per_segment_budget", "per-segment"),
]


def finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load(paths):
    runs = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"plot_curves: skipping {path}: {e}", file=sys.stderr)
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
            print(f"plot_curves: skipping {path}: no rows", file=sys.stderr)
            continue
        doc["_path"] = path
        runs.append(doc)
    return runs


def row_ident(run, row):
    """What identifies the configuration of a row, beyond its ranking and the swept knobs."""
    cfg = dict(run.get("config") or {})
    cfg.update({k: v for k, v in row.items() if v is not None and k != "ranking"})  # the oracle row's is "oracle"
    top_p = cfg.get("top_p") or 0
    ident = {
        "counts": "top-p" if finite(top_p) and top_p > 0 else "budget",
        "rank_samples": cfg.get("rank_samples") if cfg.get("ranking") in ("sampled", "antidiagonal") else None,
        "rank_rows": cfg.get("rank_rows") if cfg.get("ranking") == "sampled" else None,
        "rank_precision": cfg.get("rank_precision") if cfg.get("ranking") == "sampled" else None,
        "dense_layers": ",".join(str(x) for x in (run.get("config") or {}).get("dense_layers") or []) or None,
        "per_segment_budget": cfg.get("per_segment_budget"),
    }
    for k in ("sink_blocks", "local_blocks", "segment_size", "block_size", "threshold_len", "budget_max_factor"):
        ident[k] = cfg.get(k)
    ident["text"] = os.path.basename(str(run.get("text") or ""))
    ident["model"] = os.path.basename(str(run.get("model") or ""))
    return ident


def collect(runs):
    """-> contexts (sorted), series: list of dicts {label, kind, color, marker, points: {ctx: [(x, ppl, agree, note)]}}."""
    items = []  # (group, ident, ctx, density%, ppl%, agree%, note)
    for run in runs:
        run_ranking = (run.get("config") or {}).get("ranking") or "reference"
        for row in run["rows"]:
            if not isinstance(row, dict):
                continue
            mode = row.get("mode")
            if mode == "ragged":
                group = (row.get("ranking") or run_ranking, False)
            elif mode == "oracle":
                group = (run_ranking, True)  # the oracle at this ranking's counts
            else:
                continue
            ctx, dens = row.get("context"), row.get("density")
            if not finite(ctx) or not finite(dens):
                continue
            top_p = row.get("top_p", (run.get("config") or {}).get("top_p"))
            budget = row.get("base_budget", (run.get("config") or {}).get("base_budget"))
            note = f"p{top_p:g}" if finite(top_p) and top_p > 0 else (f"{budget}" if finite(budget) else "")
            ppl = row.get("ppl_vs_dense_pct")
            agree = row.get("agreement_pct")
            items.append((group, row_ident(run, row), int(ctx), 100.0 * dens,
                          ppl if finite(ppl) else None, agree if finite(agree) else None, note))
    # which identity fields differ within a group (text and model: across all runs)
    varying = {}
    for group in {it[0] for it in items}:
        idents = [it[1] for it in items if it[0] == group]
        varying[group] = [k for k, _ in IDENT_FIELDS if len({repr(i.get(k)) for i in idents}) > 1]
    global_vary = [k for k in ("text", "model") if len({it[1][k] for it in items}) > 1]

    def label(group, ident):
        ranking, oracle = group
        parts = []
        for k, name in IDENT_FIELDS:
            if k in varying[group]:
                v = ident.get(k)
                if k == "counts":
                    parts.append(f"{v} counts")
                elif k == "per_segment_budget":
                    parts.append("per-segment" if v else "ragged")
                else:
                    parts.append(f"{name} {'-' if v is None else v}")
        parts += [str(ident[k]) for k in global_vary]
        base = f"oracle ranking (at the {ranking} ranking's counts)" if oracle else f"{ranking} ranking"
        return base + (f" ({', '.join(parts)})" if parts else "")

    series = {}
    for group, ident, ctx, x, ppl, agree, note in items:
        lab = label(group, ident)
        s = series.setdefault(lab, {"label": lab, "group": group, "points": {}})
        s["points"].setdefault(ctx, []).append((x, ppl, agree, "" if group[1] else note))
    order = {"reference": 0, "sampled": 1, "antidiagonal": 2}
    out = sorted(series.values(), key=lambda s: (s["group"][1], order.get(s["group"][0], 2), s["group"][0], s["label"]))
    n_plain = n_oracle = 0
    for s in out:
        if s["group"][1]:
            s["color"] = ORACLE_PALETTE[n_oracle % len(ORACLE_PALETTE)]
            s["marker"] = MARKERS[(n_plain + n_oracle) % len(MARKERS)]
            s["dashed"] = True
            n_oracle += 1
        else:
            s["color"] = PALETTE[n_plain % len(PALETTE)]
            s["marker"] = MARKERS[n_plain % len(MARKERS)]
            s["dashed"] = False
            n_plain += 1
        for pts in s["points"].values():
            pts.sort(key=lambda p: p[0])
    contexts = sorted({c for s in out for c in s["points"]})
    return contexts, out


def nice_ticks(lo, hi, n=5):
    if not (finite(lo) and finite(hi)):
        lo, hi = 0.0, 1.0
    if hi - lo < 1e-9:
        pad = max(abs(lo) * 0.05, 0.5)
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = mag
    for m in (1, 2, 2.5, 5, 10):
        step = m * mag
        if step >= raw:
            break
    t0 = math.floor(lo / step + 1e-9) * step
    t1 = math.ceil(hi / step - 1e-9) * step
    count = int(round((t1 - t0) / step))
    ticks = [t0 + i * step for i in range(count + 1)]
    decimals = max(0, -int(math.floor(math.log10(step) + 1e-9)))
    if abs(step / 10 ** -decimals - round(step / 10 ** -decimals)) > 1e-6:
        decimals += 1
    return t0, t1, ticks, decimals


def ctx_name(c):
    return f"{c // 1024}k" if c % 1024 == 0 else str(c)


def marker_svg(kind, x, y, color, hollow, r=4.5):
    fill = "white" if hollow else color
    common = f'fill="{fill}" stroke="{color}" stroke-width="1.5"'
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {common}/>'
    if kind == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {common}/>'
    if kind in ("triangle", "triangle-down"):
        s = 1 if kind == "triangle" else -1
        pts = [(x, y - s * r * 1.2), (x - r * 1.1, y + s * r * 0.8), (x + r * 1.1, y + s * r * 0.8)]
    elif kind == "diamond":
        pts = [(x, y - r * 1.3), (x + r * 1.1, y), (x, y + r * 1.3), (x - r * 1.1, y)]
    else:  # cross
        return (f'<path d="M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}M{x - r:.1f},{y + r:.1f}L{x + r:.1f},{y - r:.1f}" '
                f'stroke="{color}" stroke-width="2" fill="none"/>')
    return f'<polygon points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}" {common}/>'


def panel(out, x0, y0, w, h, title, ylabel, series, ctx, metric, xdom, zero_line):
    """One panel at (x0, y0) (its plot area w x h). metric: 1 = ppl %, 2 = agreement %."""
    ys = [p[metric] for s in series for p in s["points"].get(ctx, []) if p[metric] is not None]
    xlo, xhi, xticks, xdec = xdom
    if ys:
        lo, hi = min(ys), max(ys)
        if zero_line:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
        span = hi - lo
        lo, hi = lo - 0.05 * span, hi + 0.05 * span
        if metric == 2 and hi > 100.0 and max(ys) <= 100.0:
            hi = 100.0
    else:
        lo, hi = 0.0, 1.0
    ylo, yhi, yticks, ydec = nice_ticks(lo, hi)

    def X(v):
        return x0 + (v - xlo) / (xhi - xlo) * w

    def Y(v):
        return y0 + h - (v - ylo) / (yhi - ylo) * h

    out.append(f'<text x="{x0 + w / 2:.1f}" y="{y0 - 10:.1f}" text-anchor="middle" font-size="13" font-weight="bold">{escape(title)}</text>')
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="white" stroke="#444"/>')
    for t in xticks:
        px = X(t)
        out.append(f'<line x1="{px:.1f}" y1="{y0}" x2="{px:.1f}" y2="{y0 + h}" stroke="#e6e6e6"/>')
        out.append(f'<line x1="{px:.1f}" y1="{y0 + h}" x2="{px:.1f}" y2="{y0 + h + 4}" stroke="#444"/>')
        out.append(f'<text x="{px:.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{t:.{xdec}f}</text>')
    for t in yticks:
        py = Y(t)
        out.append(f'<line x1="{x0}" y1="{py:.1f}" x2="{x0 + w}" y2="{py:.1f}" stroke="#e6e6e6"/>')
        out.append(f'<line x1="{x0 - 4}" y1="{py:.1f}" x2="{x0}" y2="{py:.1f}" stroke="#444"/>')
        out.append(f'<text x="{x0 - 7}" y="{py + 4:.1f}" text-anchor="end" font-size="11">{t:.{ydec}f}</text>')
    if zero_line and ylo < 0 < yhi:
        out.append(f'<line x1="{x0}" y1="{Y(0):.1f}" x2="{x0 + w}" y2="{Y(0):.1f}" stroke="#888" stroke-dasharray="2,3"/>')
        out.append(f'<text x="{x0 + 4}" y="{Y(0) - 4:.1f}" font-size="10" fill="#666">dense</text>')
    out.append(f'<text x="{x0 + w / 2:.1f}" y="{y0 + h + 34}" text-anchor="middle" font-size="12">density (% of the dense keys)</text>')
    out.append(f'<text transform="translate({x0 - 44},{y0 + h / 2:.1f}) rotate(-90)" text-anchor="middle" font-size="12">{escape(ylabel)}</text>')
    if not ys:
        out.append(f'<text x="{x0 + w / 2:.1f}" y="{y0 + h / 2:.1f}" text-anchor="middle" font-size="12" fill="#999">no data</text>')
        return
    out.append(f'<svg x="{x0}" y="{y0}" width="{w}" height="{h}" viewBox="{x0} {y0} {w} {h}" overflow="hidden">')
    for s in series:
        pts = [(X(p[0]), Y(p[metric]), p[3]) for p in s["points"].get(ctx, []) if p[metric] is not None]
        if len(pts) > 1:
            dash = ' stroke-dasharray="6,4"' if s["dashed"] else ""
            out.append(f'<polyline points="{" ".join(f"{a:.1f},{b:.1f}" for a, b, _ in pts)}" fill="none" '
                       f'stroke="{s["color"]}" stroke-width="1.8"{dash}/>')
        for a, b, note in pts:
            out.append(marker_svg(s["marker"], a, b, s["color"], s["dashed"]))
            if note:
                out.append(f'<text x="{a + 6:.1f}" y="{b - 6:.1f}" font-size="9" fill="{s["color"]}">{escape(note)}</text>')
    out.append("</svg>")


def draw(runs, contexts, series, title):
    PW, PH = 330, 230                 # plot area of a panel
    ML, MR, MT, MB = 66, 24, 34, 50   # panel margins
    cw, ch = ML + PW + MR, MT + PH + MB
    head = 64
    width = max(max(len(contexts), 1) * cw + 20, 980)
    left = (width - max(len(contexts), 1) * cw) // 2     # the columns, centred
    legend_cols = 2 if max([len(s["label"]) for s in series] + [0]) * 7 + 60 < (width - 40) / 2 else 1
    legend_rows = (len(series) + legend_cols - 1) // legend_cols
    height = head + 2 * ch + 20 + 22 * legend_rows + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'font-family="DejaVu Sans, Arial, Helvetica, sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.1f}" y="26" text-anchor="middle" font-size="17" font-weight="bold">{escape(title)}</text>']
    texts = sorted({os.path.basename(str(r.get("text") or "?")) for r in runs})
    models = sorted({os.path.basename(str(r.get("model") or "?")) for r in runs})
    sub = (f"{', '.join(models)}; text: {', '.join(texts)}; {len(runs)} run(s). Points: the ragged plan per run "
           f"(labels: base budget, or top-p), the oracle at the same keep counts.")
    out.append(f'<text x="{width / 2:.1f}" y="46" text-anchor="middle" font-size="11" fill="#444">{escape(sub)}</text>')
    for ci, ctx in enumerate(contexts):
        xs = [p[0] for s in series for p in s["points"].get(ctx, [])]
        if xs:
            lo, hi = min(xs), max(xs)
            pad = max(0.05 * (hi - lo), (10.0 - (hi - lo)) / 2, 0.5)  # at least 10 points of density wide
            xdom = nice_ticks(max(lo - pad, 0.0), min(hi + pad, 100.0))
        else:
            xdom = nice_ticks(0, 100)
        x0 = left + ci * cw + ML
        panel(out, x0, head + MT, PW, PH, f"{ctx_name(ctx)} tokens: perplexity vs dense", "perplexity change vs dense (%)",
              series, ctx, 1, xdom, True)
        panel(out, x0, head + ch + MT, PW, PH, f"{ctx_name(ctx)} tokens: top-1 agreement", "top-1 agreement with dense (%)",
              series, ctx, 2, xdom, False)
    if not contexts:
        out.append(f'<text x="{width / 2:.1f}" y="{head + 40}" text-anchor="middle" font-size="13" fill="#999">no ragged or oracle rows</text>')
    ly = head + 2 * ch + 20
    col_w = (width - 40) / legend_cols
    for i, s in enumerate(series):
        lx = 20 + (i % legend_cols) * col_w
        yy = ly + (i // legend_cols) * 22
        dash = ' stroke-dasharray="6,4"' if s["dashed"] else ""
        out.append(f'<line x1="{lx:.1f}" y1="{yy:.1f}" x2="{lx + 36:.1f}" y2="{yy:.1f}" stroke="{s["color"]}" stroke-width="1.8"{dash}/>')
        out.append(marker_svg(s["marker"], lx + 18, yy, s["color"], s["dashed"]))
        out.append(f'<text x="{lx + 46:.1f}" y="{yy + 4:.1f}" font-size="12">{escape(s["label"])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description="quality-vs-density curves (SVG) from gemma-eval JSON reports")
    ap.add_argument("reports", nargs="+", help="JSON reports written by build/gemma-eval")
    ap.add_argument("-o", "--output", required=True, help="the SVG to write")
    ap.add_argument("--title", default="entropyinfer on Gemma 3 270M: quality against density")
    args = ap.parse_args(argv)
    runs = load(args.reports)
    if not runs:
        print("plot_curves: no readable report", file=sys.stderr)
        return 1
    contexts, series = collect(runs)
    svg = draw(runs, contexts, series, args.title)
    d = os.path.dirname(args.output)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(svg)
    n_pts = sum(len(p) for s in series for p in s["points"].values())
    print(f"plot_curves: {args.output}: {len(series)} series, {len(contexts)} context(s), {n_pts} points from {len(runs)} report(s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
