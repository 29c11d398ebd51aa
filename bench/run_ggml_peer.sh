#!/bin/sh
# run_ggml_peer.sh GGML_DIR [ggml_peer options...]
# Builds bench/ggml_peer.c against an existing ggml checkout (github.com/ggml-org/ggml,
# or llama.cpp's ggml/ folder) and runs it. Fetches nothing: clone ggml yourself, e.g.
#     git clone https://github.com/ggml-org/ggml /tmp/ggml
#     bench/run_ggml_peer.sh /tmp/ggml --n 8192,16384 --threads 2 --kv f16
# The ggml build goes to GGML_DIR/build-peer (-DGGML_NATIVE=ON: ggml's best CPU code),
# the peer binary to build/ggml_peer. Nothing is written inside this repository
# except build/ggml_peer.
set -eu
GGML_DIR=${1:?usage: run_ggml_peer.sh GGML_DIR [ggml_peer options]}
shift
HERE=$(cd "$(dirname "$0")/.." && pwd)
BUILD="$GGML_DIR/build-peer"
if [ ! -f "$BUILD/src/libggml-cpu.a" ]; then
    cmake -S "$GGML_DIR" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
          -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >/dev/null
    cmake --build "$BUILD" -j "$(nproc)" --target ggml ggml-cpu ggml-base >/dev/null
fi
mkdir -p "$HERE/build"
cc -O2 -std=c11 -I"$GGML_DIR/include" "$HERE/bench/ggml_peer.c" -o "$HERE/build/ggml_peer" \
   "$BUILD/src/libggml.a" "$BUILD/src/libggml-cpu.a" "$BUILD/src/libggml-base.a" \
   -lstdc++ -lm -lpthread -fopenmp
exec "$HERE/build/ggml_peer" "$@"
