#!/usr/bin/env python3
"""probe_compare.py - issue 37's 16k probe: each run of a llama-ei-decode --out-dir (its *.out) against
the dense.out of the same directory, on the same tokens, standard library only.

    python3 docs/decode_eval/long/probe_compare.py DIR [DEFAULT_RUN (entropyinfer-0.25)]

Prints a markdown table per directory:
  after the first compression  steps after_from..fed (the run's own range, as decode_report.py):
                               perplexity vs dense with 2 standard errors of the per-token NLL
                               difference, top-1 agreement
  common range                 steps C..fed, C the latest after_from of the directory's runs, so that
                               a run with a later first compression is compared on the same tokens
  whole                        steps 16..fed, the dense steps before a later first compression included
                               (the policy's cost over the whole continuation)
  blocks                       16..256, 256..512, 512..768, 768..1024 (dense steps before a run's first
                               compression count as they are: the cost of the policy over the block)
  vs the default               the paired ratio to DEFAULT_RUN over the later of the two after_from
"""
import math
import os
import sys

# the run files' reader is the report's (examples/llama.cpp/decode_report.py)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "llama.cpp"))
from decode_report import parse  # noqa: E402


def stats(a, b, lo, hi, aa=None, ba=None):
    """perplexity ratio - 1 of run a to b over steps lo..hi, its 2 s.e. band, and top-1 agreement"""
    d = [x - y for x, y in zip(a[lo:hi], b[lo:hi])]
    n = len(d)
    if n == 0:
        return "-"
    m = sum(d) / n
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1) / n) if n > 1 else 0.0
    s = "%+.2f %% (%+.1f..%+.1f)" % (100 * (math.exp(m) - 1), 100 * (math.exp(m - 2 * se) - 1), 100 * (math.exp(m + 2 * se) - 1))
    if aa is not None:
        s += ", %.1f %%" % (100.0 * sum(x == y for x, y in zip(aa[lo:hi], ba[lo:hi])) / n)
    return s


def main():
    d = sys.argv[1]
    default = sys.argv[2] if len(sys.argv) > 2 else "entropyinfer-0.25"
    dn = parse(os.path.join(d, "dense.out"))
    dnll = [float(x) for x in dn["nll"].split()]
    darg = dn["argmax"].split()
    fed = len(dnll)
    runs = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".out") and fn != "dense.out":
            r = parse(os.path.join(d, fn))
            runs[fn[:-4]] = (r, [float(x) for x in r["nll"].split()], r["argmax"].split())
    start = {k: (int(r["after_from"]) if int(r["after_from"]) >= 0 else 16) for k, (r, _, _) in runs.items()}
    C = max(start.values()) if start else 16
    print("%s: fed %d tokens, prompt %s (prefill %s + refeed %s); dense ppl over steps 16..%d %.4f" % (
        d, fed, dn["prompt_tokens"], dn["prefill_tokens"], dn["refeed"], fed, math.exp(sum(dnll[16:]) / (fed - 16))))
    print()
    print("| run | options | after_from (scored) | vs dense after the first compression, agreement | "
          "steps %d..%d (common) | steps 16..%d (whole) | vs %s |" % (C, fed, fed, default))
    print("|---|---|---|---|---|---|---|")
    for k, (r, nll, arg) in runs.items():
        s = start[k]
        vs_def = "-"
        if k != default and default in runs:
            lo = max(s, start[default])
            vs_def = stats(nll, runs[default][1], lo, fed)
        print("| %s | %s | %d (%d) | %s | %s | %s | %s |" % (k, r["options"], s, fed - s, stats(nll, dnll, s, fed, arg, darg),
                                                        stats(nll, dnll, C, fed, arg, darg), stats(nll, dnll, 16, fed, arg, darg),
                                                        vs_def))
    print()
    # 256-token blocks of the fed steps (a shorter continuation: fewer blocks, the last one partial)
    blocks = [(lo, min(lo + 256, fed) if lo > 16 else min(256, fed)) for lo in [16] + list(range(256, fed, 256))]
    print("| run | " + " | ".join("%d..%d" % b for b in blocks) + " |")
    print("|---|" + "---|" * len(blocks))
    for k, (r, nll, arg) in runs.items():
        print("| %s | %s |" % (k, " | ".join(stats(nll, dnll, lo, hi, arg, darg) for lo, hi in blocks)))
    print()
    for k, (r, _, _) in runs.items():
        print("%s: compressions %s, cells %s -> %s, compress_s %s, wall_s %s, step_ms_median_after %s" % (
            k, r["compressions"], r["cells_before"], r["cells_after"], r["compress_s"], r.get("wall_s", "-"),
            r.get("step_ms_median_after", "-")))


if __name__ == "__main__":
    main()
