#!/bin/sh
# Pack what `make llama-cpp-cuda` and the GPU eval need but a GPU machine without network
# cannot fetch: the pinned llama.cpp tree (pruned to what the build reads), the two models and
# the eval text, into parts small enough for a transfer limit (the device tool of this workplace
# carries at most 64 MiB of ignored files per call; files left under an ignored folder stay
# between calls while the machine is held). Run here, from the repository root, after
# `make llama-cpp-models` and `sh examples/gemma/fetch_corpus.sh`:
#
#   sh examples/llama.cpp/device_pack.sh        # -> build/device/{src.tar.xz, part-NN, SHA256SUMS}
#
# Then, one call per part on the GPU machine (each carrying build/device/part-NN; the first also
# src.tar.xz and SHA256SUMS), and finally there:
#
#   sh examples/llama.cpp/device_unpack.sh      # checks every sha256, fills .cache/
#
# Variables: DEVICE_PART_MB (54), DEVICE_MODELS (the .gguf files; default both).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
COMMIT=0c1e57098
SRC=.cache/llama.cpp/src-$COMMIT
OUT=build/device
PART_MB=${DEVICE_PART_MB:-54}
MODELS=${DEVICE_MODELS:-.cache/model/gemma-3-270m-q4_k_m.gguf .cache/model/SmolLM2-135M-Instruct.Q4_1.gguf}
TEXT=.cache/corpus/debian-handbook.txt
[ -f "$SRC/.fetched" ] || { echo "device_pack: $SRC missing: make llama-cpp first" >&2; exit 1; }
for f in $MODELS $TEXT; do [ -s "$f" ] || { echo "device_pack: $f missing" >&2; exit 1; }; done
rm -rf "$OUT" && mkdir -p "$OUT"
# the tree without what a build never reads: vocab test files, docs, tests, media, CI
tar -C .cache/llama.cpp -cJf "$OUT/src.tar.xz" \
    --exclude="src-$COMMIT/models" --exclude="src-$COMMIT/docs" --exclude="src-$COMMIT/tests" \
    --exclude="src-$COMMIT/media" --exclude="src-$COMMIT/.github" --exclude="src-$COMMIT/benches" \
    --exclude="src-$COMMIT/gguf-py" "src-$COMMIT"
# text and models as one stream, cut into parts (-h: the model cache may hold links); the first
# parts alone give the text and the first model (device_unpack.sh takes what arrived)
tar -chf - $TEXT $MODELS | split -b "${PART_MB}m" -d -a 2 - "$OUT/part-"
( cd "$OUT" && sha256sum src.tar.xz part-* > SHA256SUMS )
( cd "$ROOT" && sha256sum -b $TEXT $MODELS ) > "$OUT/FILES.sha256"
ls -l "$OUT" >&2
