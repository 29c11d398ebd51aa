#!/bin/sh
# Fetch a long, non-repetitive English document for `make eval`: The Debian
# Administrator's Handbook (Debian package debian-handbook, ~1.2 M characters
# of prose in its HTML edition), flattened to plain text in reading order.
# Prints the path of the text file on stdout.
#
#   sh examples/gemma/fetch_corpus.sh            # from the repository root
#
# Why not only the licence texts: /usr/share/common-licenses holds near-copies
# (GFDL-1.2/1.3, GPL-1/2/3, LGPL-2/2.1), so past ~10k tokens a dense model
# predicts much of it by copying from far back (perplexity falls from 12.9 at
# 8k to 4.8 at 16k), which measures copying rather than long-context reading.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE="${EI_CORPUS_CACHE:-$ROOT/.cache/corpus}"
PY="${PYTHON:-python3}"
OUT="$CACHE/debian-handbook.txt"
if [ -s "$OUT" ]; then echo "$OUT"; exit 0; fi
mkdir -p "$CACHE/deb"
(cd "$CACHE/deb" && rm -f debian-handbook_*.deb && apt-get download debian-handbook >&2)
rm -rf "$CACHE/tree"
dpkg-deb -x "$CACHE"/deb/debian-handbook_*.deb "$CACHE/tree"
"$PY" "$(dirname "$0")/html_to_text.py" "$CACHE/tree/usr/share/doc/debian-handbook/html/en-US" > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
rm -rf "$CACHE/tree"
echo "$OUT"
