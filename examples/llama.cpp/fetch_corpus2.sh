#!/bin/sh
# The second text of the decode evaluation (issue 37), beside the Debian Administrator's Handbook
# (examples/gemma/fetch_corpus.sh): the Perl FAQ, perlfaq1..perlfaq9 of the Debian package perl-doc
# (~370 k characters, about 100 k tokens: enough for a 32k context), rendered to plain text by
# pod2text (perl's own, in the base system) in that order. Another kind of text than the handbook:
# questions and answers about a programming language, with code between the prose.
# Prints the path of the text file on stdout.
#
#   sh examples/llama.cpp/fetch_corpus2.sh       # from the repository root
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE="${EI_CORPUS_CACHE:-$ROOT/.cache/corpus}"
OUT="$CACHE/perlfaq.txt"
if [ -s "$OUT" ]; then echo "$OUT"; exit 0; fi
command -v pod2text > /dev/null || { echo "fetch_corpus2: pod2text missing (package perl)" >&2; exit 1; }
mkdir -p "$CACHE/deb"
(cd "$CACHE/deb" && rm -f perl-doc_*.deb && apt-get download perl-doc >&2)
rm -rf "$CACHE/tree-perl"
dpkg-deb -x "$CACHE"/deb/perl-doc_*.deb "$CACHE/tree-perl"
POD=$(find "$CACHE/tree-perl/usr/share/perl" -name perlfaq1.pod | head -1)
[ -n "$POD" ] || { echo "fetch_corpus2: perlfaq1.pod not found in perl-doc" >&2; exit 1; }
for i in 1 2 3 4 5 6 7 8 9; do
    pod2text "$(dirname "$POD")/perlfaq$i.pod"
done > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
rm -rf "$CACHE/tree-perl"
echo "$OUT"
