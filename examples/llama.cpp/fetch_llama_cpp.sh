#!/bin/sh
# examples/llama.cpp/fetch_llama_cpp.sh - the pinned llama.cpp tree, from PyPI.
#
# llama-cpp-python's source distribution vendors a whole llama.cpp tree
# (vendor/llama.cpp). This script downloads that sdist with pip, checks its
# sha256 and unpacks the tree into $LLAMA_CPP_PRISTINE (default
# .cache/llama.cpp/src-<commit>), unpatched. Idempotent: a second run checks
# the stamp and returns. Nothing of llama.cpp is committed to this repository.
#
#     sh examples/llama.cpp/fetch_llama_cpp.sh
set -eu

VERSION=0.3.36                 # llama-cpp-python release
COMMIT=0c1e57098               # its vendored ggml-org/llama.cpp commit (CHANGELOG.md of the sdist)
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

CACHE=${LLAMA_CPP_CACHE:-.cache/llama.cpp}
DEST=${LLAMA_CPP_PRISTINE:-$CACHE/src-$COMMIT}
SDIST=$CACHE/llama_cpp_python-$VERSION.tar.gz
PIP=${PIP:-python3 -m pip}

if [ -f "$DEST/.fetched" ] && [ "$(cat "$DEST/.fetched")" = "$SHA256" ]; then
    exit 0
fi

mkdir -p "$CACHE"
check() { [ -f "$SDIST" ] && echo "$SHA256  $SDIST" | sha256sum -c --status -; }

if ! check; then
    echo "fetch_llama_cpp: downloading llama-cpp-python==$VERSION (sdist) from PyPI" >&2
    tmp=$(mktemp -d "$CACHE/dl.XXXXXX")
    # pip prepares the sdist's metadata in an isolated build environment (~1 min)
    $PIP download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp"
    mv "$tmp/llama_cpp_python-$VERSION.tar.gz" "$SDIST"
    rm -rf "$tmp"
    if ! check; then
        echo "fetch_llama_cpp: sha256 of $SDIST is $(sha256sum "$SDIST" | cut -d' ' -f1), expected $SHA256" >&2
        exit 1
    fi
fi

echo "fetch_llama_cpp: unpacking vendor/llama.cpp ($COMMIT) into $DEST" >&2
rm -rf "$DEST" "$DEST.tmp"
mkdir -p "$DEST.tmp"
tar -xzf "$SDIST" -C "$DEST.tmp" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp"
# the tree's .git is a submodule pointer into a repository the sdist lacks
rm -f "$DEST.tmp/.git"
echo "$COMMIT" > "$DEST.tmp/.llama_cpp_commit"
mv "$DEST.tmp" "$DEST"
echo "$SHA256" > "$DEST/.fetched"
