#!/bin/sh
# The other half of device_pack.sh, on the GPU machine, from the repository root: checks the parts'
# sha256, unpacks the llama.cpp tree into .cache/llama.cpp (marked fetched, as fetch_llama_cpp.sh
# leaves it) and the models and text into .cache/, and checks their sha256 again.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
D=build/device
# the parts that arrived (all of them, or the first ones: the text and the models they complete)
( cd "$D" && sha256sum -c --quiet --ignore-missing SHA256SUMS )
if [ ! -f .cache/llama.cpp/src-0c1e57098/.fetched ]; then
    mkdir -p .cache/llama.cpp
    tar -C .cache/llama.cpp -xJf "$D/src.tar.xz"
    touch .cache/llama.cpp/src-0c1e57098/.fetched
fi
cat "$D"/part-* | tar -xf - 2>/dev/null || echo "device_unpack: the parts end inside a file (not all were sent)" >&2
while read -r sum file; do
    file=${file#\*}
    if [ -f "$file" ] && echo "$sum *$file" | sha256sum -c --quiet - >/dev/null 2>&1; then
        echo "device_unpack: $file (sha256 checked)"
    else
        rm -f "$file"
        echo "device_unpack: $file incomplete or missing: removed" >&2
    fi
done < "$D/FILES.sha256"
