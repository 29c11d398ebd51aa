#!/bin/sh
# run_ggml_peer.sh GGML_DIR [ggml_peer options...]
# Builds bench/ggml_peer.c against an existing ggml checkout (github.com/ggml-org/ggml)
# or a llama.cpp source tree (its ggml/ is built through llama.cpp's own CMake, since
# the vendored copy does not configure alone), and runs it. Fetches nothing, e.g.
#     git clone https://github.com/ggml-org/ggml /tmp/ggml
#     bench/run_ggml_peer.sh /tmp/ggml --n 8192,16384 --threads 2 --kv f16
#     bench/run_ggml_peer.sh build/llama.cpp-src --n 16384 --kv f16   (examples/llama.cpp/fetch_llama_cpp.sh)
# The ggml build goes to GGML_DIR/build-peer (-DGGML_NATIVE=ON: ggml's best CPU code for
# the CPU that builds it; delete build-peer after moving to another CPU), the peer binary
# to build/ggml_peer. Nothing is written inside this repository except build/ggml_peer.
set -eu
GGML_DIR=${1:?usage: run_ggml_peer.sh GGML_DIR [ggml_peer options]}
shift
HERE=$(cd "$(dirname "$0")/.." && pwd)
BUILD="$GGML_DIR/build-peer"
INC="$GGML_DIR/include"
[ -f "$GGML_DIR/ggml.pc.in" ] || INC="$GGML_DIR/ggml/include" # a llama.cpp tree
if [ -z "$(find "$BUILD" -name libggml-cpu.a 2>/dev/null | head -n 1)" ]; then
    cmake -S "$GGML_DIR" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
          -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
          -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
    cmake --build "$BUILD" -j "$(nproc)" --target ggml ggml-cpu ggml-base >/dev/null
fi
lib() { find "$BUILD" -name "$1" | head -n 1; }
mkdir -p "$HERE/build"
cc -O2 -std=c11 -I"$INC" "$HERE/bench/ggml_peer.c" -o "$HERE/build/ggml_peer" \
   "$(lib libggml.a)" "$(lib libggml-cpu.a)" "$(lib libggml-base.a)" \
   -lstdc++ -lm -lpthread -fopenmp
exec "$HERE/build/ggml_peer" "$@"
