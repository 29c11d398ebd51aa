"""Continuation perplexity and top-1 agreement of each run in a llama-ei-decode --out-dir against its
dense.out, over the tokens after the first compression (index 16 on): python3 compare.py DIR"""
import sys, glob, math, os
d = sys.argv[1]
def nll(f):
    for line in open(f):
        if line.startswith("nll "): return [float(x) for x in line.split()[1:]]
def arg(f):
    for line in open(f):
        if line.startswith('argmax '): return line.split()[1:]
dn = nll(os.path.join(d, 'dense.out')); da = arg(os.path.join(d,'dense.out'))
base = math.exp(sum(dn[16:]) / len(dn[16:]))
print(f"dense ppl(after 16) {base:.4f}")
for f in sorted(glob.glob(os.path.join(d, '*.out'))):
    n = os.path.basename(f)[:-4]
    if n == 'dense': continue
    x = nll(f); a = arg(f)
    if not x: continue
    p = math.exp(sum(x[16:]) / len(x[16:]))
    agr = sum(1 for i in range(16, min(len(a), len(da))) if a[i] == da[i]) / (min(len(a), len(da)) - 16) * 100
    print(f"{n:12s} ppl {p:.4f} vs dense {100*(p/base-1):+.2f}%  agreement {agr:.1f}%")
