#!/bin/bash
# shortlist diagnostic runs (issue 35)
M=.cache/model/gemma-3-270m-q4_k_m.gguf
T=${TEXT:-.cache/corpus/debian-handbook.txt}
N=${N:-32768}
for F in "$@"; do
  tag=$F; extra=""
  [ "$F" != "none" ] && extra="shortlist=$F $SLX"; tag=$F${SLTAG:-}
  start=$(date +%s)
  build/gemma-eval $M build/sl/${NAME:-hb}-$N-sl$tag.md $N "" $T no_reference=1 dense_cache=build/sl/dense ranking=sampled rows=spread samples=128 precision=int8 oracle=1 estimate=fps estimate_rows=128 $extra > build/sl/${NAME:-hb}-$N-sl$tag.log 2>&1
  echo "$F rc $? $(( $(date +%s) - start )) s"
done
