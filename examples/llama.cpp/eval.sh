#!/bin/sh
# entropyinfer inside llama.cpp: long-context perplexity and attention time with
# llama.cpp's own llama-perplexity, patched and unpatched. The script behind
# `make llama-cpp-eval` (not in CI; tens of minutes on a small CPU). Writes
# build/llama_cpp_eval.md and keeps every run's full output, exact command and
# exit status in build/llama_cpp_eval/.
#
#   sh examples/llama.cpp/eval.sh                        # from the repository root
#   EVAL_ONLY=smollm2 sh examples/llama.cpp/eval.sh      # re-run a part
#   EVAL_ONLY=gemma16k,gemma32k ...   EVAL_ONLY=smollm2-2k ...   EVAL_ONLY=none (report only)
#
# Runs (text: the Debian Administrator's Handbook, examples/gemma/fetch_corpus.sh):
#   SmolLM2-135M-Instruct Q4_1 at -c 8192, 1 chunk, modes
#     vanilla       unpatched llama-perplexity, dense
#     dense         patched, no flag (must print the same perplexity to the last digit)
#     entropyinfer  patched --entropyinfer (ragged per-head plans, the default)
#     quality       patched --entropyinfer --entropyinfer-opt preset=quality
#                   (ei_config_quality: the sampled ranking, top-p counts, sink/local blocks)
#     per-segment   patched --entropyinfer --entropyinfer-opt per_segment_budget=1
#                   (the reference's one count per segment: the max over heads)
#     time-dense    patched --entropyinfer --entropyinfer-opt mode=time-dense
#                   (times llama.cpp's own attention in the layers entropyinfer would
#                   serve; numerics dense)
#     ei-dense      (not run by default) --entropyinfer-opt mode=ei-dense: entropyinfer's
#                   attention kernel without a plan, dense
#     quality-mask  (not run by default) preset=quality,executor=mask: the same plans run by
#                   llama.cpp's own flash attention through ei_plan_mask's KQ mask
#   Gemma 3 270M Q4_K_M at -c 16384 and -c 32768, 1 chunk, modes entropyinfer and
#     time-dense (whose perplexity is the dense one: llama.cpp's own attention;
#     GEMMA_MODES=vanilla,... adds the unpatched run).
# Every run: flash attention on (`-fa on`, or `-fa` on llama.cpp versions whose
# flag takes no value: read from --help), -t = nproc, -b (EVAL_BATCH below) -ub 512, and -lv 4
# where --help lists a "4: trace" verbosity (newer llama.cpp shows libllama's
# INFO messages, the llama_perf_context_print timings among them, only there).
#
# The report is rebuilt from every log in the log folder, so runs made at
# different times (EVAL_ONLY) end up in one report; EVAL_ONLY=none only rebuilds it.
# Delete build/llama_cpp_eval/ to start afresh.
#
# What is read from each run's output (stdout and stderr together):
#   Final estimate: PPL = 12.3456 +/- 0.12345                (perplexity.cpp)
#   perplexity: 33.33 seconds per pass - ETA 0.55 minutes    (the first chunk's prefill)
#   llama_perf_context_print: prompt eval time = 1234.56 ms / 8192 tokens (...)
#                       (shown for reference: llama.cpp 0c1e57098 leaves some
#                       llama_decode calls out of it)
#   entropyinfer: mode sparse, layers 3/18, ubatches 10/16, density 0.5300, plan 0.123 s, attention 1.900 s
#   entropyinfer: mode time-dense, layers 3/18, ubatches 10/16, dense-attention 5.600 s
#                       the patched tool's summary at exit (ei_llama.cpp): the last
#                       line starting "entropyinfer: mode ", read loosely as
#                       "key value [unit]" pairs separated by spaces, commas,
#                       semicolons, '=' or ':' (ms are turned into s); copied into
#                       the report with the start-up line "entropyinfer: on, ..."
#                       and up to 5 other "entropyinfer:" messages.
# A run that fails is listed with the last line of its output; exit 132 (SIGILL)
# gets a hint: EVAL_EXTRA_ARGS=-nr keeps ggml off its AMX kernels.
#
# Environment (all optional):
#   LLAMA_PERPLEXITY          patched binary   (build/llama.cpp/bin/llama-perplexity)
#   LLAMA_PERPLEXITY_VANILLA  unpatched binary (build/llama.cpp-vanilla/bin/llama-perplexity)
#   SMOL_MODEL, GEMMA_MODEL   the .gguf files  (.cache/model/..., fetch_models.sh)
#   EVAL_TEXT                 the text file    (.cache/corpus/debian-handbook.txt)
#   EVAL_ONLY                 comma list of smollm2, gemma, MODEL-CTX (gemma16k,
#                             gemma-32768, smollm2-8k), all (default) or none
#   EVAL_CONTEXTS             contexts for a model named without one (comma list;
#                             default: smollm2 8192, gemma 16384,32768)
#   EVAL_CHUNKS               --chunks (default 1: perplexity over the second half of one context)
#   SMOL_MODES, GEMMA_MODES   modes to run (comma lists of the names above)
#   EVAL_THREADS (nproc)  EVAL_UBATCH (512)
#   EVAL_BATCH                -b: llama_decode's batch (default: the context, so a chunk is
#                             one llama_decode call and only its last segment is dense, as
#                             in the paper: the glue marks the last ubatch of each call
#                             final. Gemma's 262k-token vocabulary makes that call's logits
#                             large: 8.6 GB at 16k, 17 GB at 32k; llama-perplexity with a
#                             smaller batch reserves n_ctx x n_vocab floats, worse)
#   EVAL_FA, EVAL_LOG_ARGS    flash-attention / logging arguments instead of the detected ones
#   EVAL_EXTRA_ARGS           more llama-perplexity arguments (split on spaces)
#   EVAL_OUT (build/llama_cpp_eval.md)  EVAL_LOGS (build/llama_cpp_eval)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

PATCHED=${LLAMA_PERPLEXITY:-build/llama.cpp/bin/llama-perplexity}
VANILLA=${LLAMA_PERPLEXITY_VANILLA:-build/llama.cpp-vanilla/bin/llama-perplexity}
SMOL_MODEL=${SMOL_MODEL:-.cache/model/SmolLM2-135M-Instruct.Q4_1.gguf}
GEMMA_MODEL=${GEMMA_MODEL:-.cache/model/gemma-3-270m-q4_k_m.gguf}
TEXT=${EVAL_TEXT:-.cache/corpus/debian-handbook.txt}
EVAL_ONLY=${EVAL_ONLY:-all}
EVAL_CONTEXTS=${EVAL_CONTEXTS:-}
EVAL_CHUNKS=${EVAL_CHUNKS:-}
SMOL_MODES=${SMOL_MODES:-vanilla,dense,entropyinfer,quality,per-segment,time-dense}
GEMMA_MODES=${GEMMA_MODES:-entropyinfer,quality,time-dense}
NPROC=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
THREADS=${EVAL_THREADS:-$NPROC}
BATCH=${EVAL_BATCH:-}
UBATCH=${EVAL_UBATCH:-512}
EXTRA=${EVAL_EXTRA_ARGS:-}
OUT=${EVAL_OUT:-build/llama_cpp_eval.md}
LOGS=${EVAL_LOGS:-build/llama_cpp_eval}

MODELS="smollm2 gemma"
ALL_MODES="vanilla dense entropyinfer quality quality-mask per-segment ei-dense time-dense"

die() { echo "llama-cpp-eval: $*" >&2; exit 1; }
say() { echo "llama-cpp-eval: $*" >&2; }

# ---------------------------------------------------------------- per model
model_file()   { case $1 in smollm2) echo "$SMOL_MODEL";; gemma) echo "$GEMMA_MODEL";; esac; }
model_title()  { case $1 in smollm2) echo "SmolLM2-135M-Instruct (Q4_1)";; gemma) echo "Gemma 3 270M (Q4_K_M)";; esac; }
model_ctxs()   { if [ -n "$EVAL_CONTEXTS" ]; then echo "$EVAL_CONTEXTS"; else
                 case $1 in smollm2) echo 8192;; gemma) echo 16384,32768;; esac; fi; }
model_chunks() { if [ -n "$EVAL_CHUNKS" ]; then echo "$EVAL_CHUNKS"; else
                 case $1 in smollm2) echo 1;; gemma) echo 1;; esac; fi; }
model_modes()  { case $1 in smollm2) echo "$SMOL_MODES";; gemma) echo "$GEMMA_MODES";; esac | tr ',' ' '; }

mode_bin() { case $1 in vanilla) echo "$VANILLA";; *) echo "$PATCHED";; esac; }
mode_args() {
    case $1 in
        vanilla|dense) ;;
        entropyinfer)  echo "--entropyinfer";;
        quality)       echo "--entropyinfer --entropyinfer-opt preset=quality";;
        quality-mask)  echo "--entropyinfer --entropyinfer-opt preset=quality,executor=mask";;
        per-segment)   echo "--entropyinfer --entropyinfer-opt per_segment_budget=1";;
        ei-dense)      echo "--entropyinfer --entropyinfer-opt mode=ei-dense";;
        time-dense)    echo "--entropyinfer --entropyinfer-opt mode=time-dense";;
        *) die "unknown mode '$1' (one of: $ALL_MODES)";;
    esac
}
mode_title() {
    case $1 in
        vanilla)      echo "dense, llama.cpp unpatched";;
        dense)        echo "dense, patched (no flag)";;
        entropyinfer) echo "entropyinfer (ragged per-head plans)";;
        quality)      echo "entropyinfer preset=quality (sampled ranking of 128 farthest-point rows, top-p, sink/local)";;
        quality-mask) echo "entropyinfer preset=quality, executor mask (llama.cpp's attention through the plan's mask)";;
        per-segment)  echo "entropyinfer per_segment_budget=1";;
        ei-dense)     echo "ei-dense (entropyinfer's kernel, no plan)";;
        time-dense)   echo "time-dense (llama.cpp attention timed, dense numerics)";;
    esac
}

# "16k" -> 16384, "8192" -> 8192; anything else -> empty
ctx_num() {
    case $1 in
        *[!0-9kK]*|'') ;;
        *[kK]) n=${1%?}; case $n in ''|*[!0-9]*) ;; *) echo $((n * 1024));; esac;;
        *[!0-9]*) ;;
        *) echo "$1";;
    esac
}

# Check EVAL_ONLY (in this shell: die in a command substitution would not stop us).
check_only() {
    for item in $(echo "$EVAL_ONLY" | tr ',' ' '); do
        case $item in
            none|all|smollm2|gemma) ;;
            smollm2*|gemma*)
                case $item in smollm2*) m=smollm2;; *) m=gemma;; esac
                rest=${item#"$m"}; rest=${rest#[-_]}
                [ -n "$(ctx_num "$rest")" ] ||
                    die "EVAL_ONLY: cannot read a context in '$item' (e.g. ${m}-8k, ${m}8192)";;
            *) die "EVAL_ONLY: unknown item '$item' (smollm2, gemma, MODEL-CTX such as gemma16k, all, none)";;
        esac
    done
    for v in $(echo "${EVAL_CONTEXTS:-1}" | tr ',' ' '); do
        [ -n "$(ctx_num "$v")" ] || die "EVAL_CONTEXTS: '$v' is not a context size"
    done
}

# The contexts to run for MODEL under EVAL_ONLY, one a line, deduplicated.
selected_ctxs() {
    m=$1
    for item in $(echo "$EVAL_ONLY" | tr ',' ' '); do
        case $item in
            all|"$m") model_ctxs "$m" | tr ',' '\n' | while read -r v; do ctx_num "$v"; done;;
            "$m"*) rest=${item#"$m"}; ctx_num "${rest#[-_]}";;
        esac
    done | awk 'NF && !seen[$0]++'
}

# ---------------------------------------------------------------- parsing
# Each reads one run's output file and prints its fields, or nothing.

# "PPL ERR" from the last `Final estimate: PPL = 12.3456 +/- 0.12345`.
parse_ppl() {
    sed -n 's/.*Final estimate: PPL = \([^ ]*\) +\/- \([^ ]*\).*/\1 \2/p' "$1" | tail -n 1
}

# "MS TOKENS" from the last `llama_perf_context_print: prompt eval time = 1234.56 ms / 8192 tokens`.
parse_prompt_eval() {
    sed -n 's/.*prompt eval time = *\([0-9.]*\) ms \/ *\([0-9]*\) tokens.*/\1 \2/p' "$1" | tail -n 1
}

# Seconds of the first pass (the first chunk's llama_decode calls up to a
# llama_synchronize), from `perplexity: 33.33 seconds per pass - ETA ...`.
parse_pass_s() {
    sed -n 's/.*perplexity: *\([0-9.]*\) seconds per pass.*/\1/p' "$1" | head -n 1
}

# The run's summary: the last line that starts with `entropyinfer: mode `, else
# the last that starts with `entropyinfer:` but is not the start-up line
# (`entropyinfer: on, ...`). An optional log prefix of llama.cpp's timestamped
# logging (such as "0.01.234.567 I ") is allowed and dropped.
parse_ei_line() {
    l=$(grep -E '^([0-9.]+ [A-Z] )?[[:space:]]*entropyinfer: mode ' "$1" | tail -n 1 || true)
    [ -n "$l" ] || l=$(grep -E '^([0-9.]+ [A-Z] )?[[:space:]]*entropyinfer:' "$1" |
                       grep -v 'entropyinfer: on,' | tail -n 1 || true)
    printf '%s\n' "$l" | sed -n 's/^.*entropyinfer:/entropyinfer:/p'
}
# The start-up line with the configuration (`entropyinfer: on, mode ..., segment_size ...`).
parse_ei_config() {
    grep -E '^([0-9.]+ [A-Z] )?[[:space:]]*entropyinfer: on,' "$1" | tail -n 1 | sed 's/^.*entropyinfer:/entropyinfer:/' || true
}

# ei_field LINE NAME...: the value of the first NAME (aliases) found in an
# `entropyinfer:` line read as "key [key...] value [unit]" pairs. Keys are
# lowercased, '_' becomes '-', words of one key are joined by '-'. Values with
# unit ms/us are converted to seconds; "3/18" stays as it is.
ei_field() {
    line=$1; shift
    printf '%s\n' "$line" | awk -v names="$*" '
    function emit(k, v, u) {
        if (u == "ms") v = sprintf("%.6g", v / 1000); else if (u == "us") v = sprintf("%.6g", v / 1000000)
        if (k != "" && !(k in val)) val[k] = v
        last = k
    }
    BEGIN {
        numpre = "^[-+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)(e[-+]?[0-9]+)?(/[0-9]+)?"
        num = numpre "(%|x|s|ms|us|sec)?$"
    }
    {
        s = tolower($0)
        sub(/^.*entropyinfer:/, "", s)
        gsub(/[,;|]/, " , ", s)
        gsub(/[()\[\]{}:]/, " ", s)
        gsub(/ *= */, "=", s)
        gsub(/_/, "-", s)
        n = split(s, t, /[ \t]+/)
        key = ""; last = ""
        for (i = 1; i <= n; i++) {
            w = t[i]
            if (w == "") continue
            if (w == ",") { key = ""; last = ""; continue }
            if (w ~ /=/) {                      # key=value: the value may be a word
                k = substr(w, 1, index(w, "=") - 1); v = substr(w, index(w, "=") + 1)
                if (v == "") { key = k; last = ""; continue }
                if (v ~ num) { u = v; sub(numpre, "", u); emit(k, substr(v, 1, length(v) - length(u)), u) }
                else if (!(k in val)) { val[k] = v; last = "" }
                key = ""
                continue
            }
            if (w ~ num) {
                u = w; sub(numpre, "", u)
                v = substr(w, 1, length(w) - length(u))
                if (key != "") { emit(key, v, u); key = "" }
                else last = ""
            } else if (key == "" && last != "" && w ~ /^(s|sec|secs|seconds|ms|us|%|x)$/) {
                if (w == "ms") val[last] = sprintf("%.6g", val[last] / 1000)
                else if (w == "us") val[last] = sprintf("%.6g", val[last] / 1000000)
                last = ""
            } else {
                key = (key == "") ? w : key "-" w
                last = ""
            }
        }
        m = split(names, nm, " ")
        for (j = 1; j <= m; j++) if (nm[j] in val) { print val[nm[j]]; exit }
    }'
}
ei_density()   { ei_field "$1" density mean-density kept-density avg-density; }
ei_layers()    { ei_field "$1" layers served-layers layers-served served; }
ei_ubatches()  { ei_field "$1" ubatches served-ubatches ubatches-served; }
ei_plan()      { ei_field "$1" plan plan-time planning profile; }
ei_attention() { ei_field "$1" attention attn attention-time ei-attention sparse-attention; }
ei_dense_attention() {
    ei_field "$1" dense-attention dense-attn attention-dense dense-attention-time flash-attention fa-attention llama-attention
}

# value of KEY in a run's .meta file (key=value lines)
meta() { if [ -f "$1" ]; then sed -n "s/^$2=//p" "$1" | tail -n 1; fi; }

# awk arithmetic helpers (print "-" when an input is missing)
pct_delta() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%+.3f %%\n", (a / b - 1) * 100 }'; }
ms_to_s()   { awk -v a="$1" 'BEGIN { if (a == "") print "-"; else printf "%.2f\n", a / 1000 }'; }
ratio()     { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2fx\n", a / b }'; }
dash()      { if [ -n "$1" ]; then printf '%s\n' "$1"; else echo "-"; fi; }

# ---------------------------------------------------------------- running
shquote() {
    case $1 in
        ''|*[!A-Za-z0-9_./=,:+@%-]*) printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")";;
        *) printf '%s' "$1";;
    esac
}
quote_cmd() { q=""; for a in "$@"; do q="$q${q:+ }$(shquote "$a")"; done; printf '%s\n' "$q"; }

# flash-attention arguments for BIN: "-fa on" where --flash-attn takes on|off|auto.
fa_args() {
    if [ -n "${EVAL_FA+x}" ]; then echo "$EVAL_FA"; return; fi
    line=$("$1" --help 2>&1 | grep -E -e '--flash-attn' | head -n 1 || true)
    case $line in
        '') say "warning: $1 --help shows no --flash-attn; running without it"; echo "";;
        *on\|off*|*\'on\'*|*'[on'*) echo "-fa on";;
        *) echo "-fa";;
    esac
}

# logging arguments for BIN: llama.cpp versions whose -lv has a "trace" level (4)
# print libllama's INFO messages, llama_perf_context_print's among them, only at -lv 4.
log_args() {
    if [ -n "${EVAL_LOG_ARGS+x}" ]; then echo "$EVAL_LOG_ARGS"; return; fi
    if "$1" --help 2>&1 | grep -q -E '^ *- *4: *trace'; then echo "-lv 4"; else echo ""; fi
}

bin_version() { "$1" --version 2>&1 | grep -E 'version|built with' | tr '\n' ' ' | sed 's/ *$//' || true; }

model_batch() { # MODEL CTX
    if [ -n "$BATCH" ]; then echo "$BATCH"; else echo "$2"; fi
}

run_one() { # MODEL CTX MODE
    m=$1; c=$2; mode=$3
    bin=$(mode_bin "$mode")
    name="$m-$c-$mode"
    case $mode in vanilla) fa="$FA_VANILLA $LOG_VANILLA";; *) fa="$FA_PATCHED $LOG_PATCHED";; esac
    # shellcheck disable=SC2046,SC2086  # the flag lists are split on purpose
    set -- "$bin" -m "$(model_file "$m")" -f "$TEXT" -c "$c" --chunks "$(model_chunks "$m")" \
        -b "$(model_batch "$m" "$c")" -ub "$UBATCH" -t "$THREADS" $fa $(mode_args "$mode") $EXTRA
    cmd=$(quote_cmd "$@")
    printf '%s\n' "$cmd" > "$LOGS/$name.cmd"
    say "$name: $cmd"
    t0=$(date +%s)
    rc=0; "$@" > "$LOGS/$name.log" 2>&1 || rc=$?
    t1=$(date +%s)
    {
        echo "rc=$rc"
        echo "wall_s=$((t1 - t0))"
        echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "binary=$bin"
        echo "version=$(bin_version "$bin")"
    } > "$LOGS/$name.meta"
    ppl=$(parse_ppl "$LOGS/$name.log")
    if [ "$rc" != 0 ]; then
        say "$name: FAILED (exit $rc), see $LOGS/$name.log"; FAILED="$FAILED $name"
        if [ "$rc" = 132 ]; then
            say "  exit 132 is SIGILL: a GGML_NATIVE build can use AMX tile instructions that this (virtual)"
            say "  machine does not run; EVAL_EXTRA_ARGS=-nr (no extra buffer types: no repack, no AMX) avoids them"
        fi
    elif [ -z "$ppl" ]; then
        say "$name: no 'Final estimate' line, see $LOGS/$name.log"; FAILED="$FAILED $name"
    else
        say "$name: PPL $ppl, $((t1 - t0)) s"
    fi
}

# ---------------------------------------------------------------- report
report_table() { # MODEL CTX
    m=$1; c=$2
    ref=""; refmode=""; refpass=""
    for r in vanilla dense time-dense; do   # time-dense: llama.cpp's attention, dense numerics
        f="$LOGS/$m-$c-$r.log"
        if [ -f "$f" ] && [ -n "$(parse_ppl "$f")" ]; then
            ref=$(parse_ppl "$f" | cut -d' ' -f1); refpass=$(parse_pass_s "$f"); refmode=$r; break
        fi
    done
    fa_dense=""
    if [ -f "$LOGS/$m-$c-time-dense.log" ]; then
        fa_dense=$(ei_dense_attention "$(parse_ei_line "$LOGS/$m-$c-time-dense.log")")
    fi
    chunks=$(grep -h -o 'calculating perplexity over .*' "$LOGS/$m-$c"-*.log 2>/dev/null | head -n 1 || true)
    echo "## $(model_title "$m"), context $c"
    echo
    [ -n "$chunks" ] && echo "llama-perplexity: $chunks." && echo
    echo "| mode | perplexity | vs dense | density | served layers, ubatches | prefill s, 1st chunk | dense / this | plan s | attention s, served layers | llama.cpp FA s, same layers | FA / entropyinfer | llama_perf prompt eval s (tokens) | wall s |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for mode in $ALL_MODES; do
        f="$LOGS/$m-$c-$mode.log"
        [ -f "$f" ] || continue
        rc=$(meta "$LOGS/$m-$c-$mode.meta" rc)
        pe=$(parse_ppl "$f"); ppl=${pe% *}; err=${pe#* }
        pr=$(parse_prompt_eval "$f"); pms=${pr% *}; ptok=${pr#* }
        line=$(parse_ei_line "$f")
        att=""; den=""; lay=""; pln=""; fa=""
        if [ -n "$line" ]; then
            att=$(ei_attention "$line"); den=$(ei_density "$line")
            lay=$(ei_layers "$line"); pln=$(ei_plan "$line")
            ub=$(ei_ubatches "$line"); [ -z "$ub" ] || lay="${lay:--}, $ub"
        fi
        if [ "$mode" = time-dense ]; then fa=$fa_dense; att=""; fi
        case $mode in entropyinfer|quality|quality-mask|per-segment|ei-dense) fa=$fa_dense;; esac
        if [ -z "$pe" ]; then
            pcol="no result (exit ${rc:-?})"; dcol="-"
        else
            pcol="$ppl ± $err"
            if [ "$mode" = "$refmode" ]; then dcol="(reference)"; else dcol=$(pct_delta "$ppl" "$ref"); fi
        fi
        pass=$(parse_pass_s "$f")
        perf="-"; [ -z "$pr" ] || perf="$(ms_to_s "$pms") ($ptok)"
        echo "| $(mode_title "$mode") | $pcol | $dcol | $(dash "$den") | $(dash "$lay") | $(dash "$pass") | $(ratio "$refpass" "$pass") | $(dash "$pln") | $(dash "$att") | $(dash "$fa") | $(ratio "$fa" "$att") | $perf | $(dash "$(meta "$LOGS/$m-$c-$mode.meta" wall_s)") |"
    done
    echo
    v=$(parse_ppl "$LOGS/$m-$c-vanilla.log" 2>/dev/null || true)
    d=$(parse_ppl "$LOGS/$m-$c-dense.log" 2>/dev/null || true)
    if [ -n "$v" ] && [ -n "$d" ]; then
        if [ "$v" = "$d" ]; then echo "Patched without --entropyinfer vs unpatched: identical (PPL ${v% *} ± ${v#* })."
        else echo "**Patched without --entropyinfer vs unpatched: DIFFERENT** (patched ${d% *} ± ${d#* }, unpatched ${v% *} ± ${v#* })."; fi
        echo
    fi
    have=""
    for mode in $ALL_MODES; do
        f="$LOGS/$m-$c-$mode.log"
        [ -f "$f" ] || continue
        [ -z "$(parse_ppl "$f")" ] || continue
        [ -n "$have" ] || { echo "Runs without a result (the end of their output):"; echo; have=1; }
        echo "- $mode, exit $(meta "$LOGS/$m-$c-$mode.meta" rc): \`$(grep -v '^[[:space:]]*$' "$f" | tail -n 1 | tr -d '`')\`"
    done
    [ -z "$have" ] || echo
    have=""
    for mode in $ALL_MODES; do
        f="$LOGS/$m-$c-$mode.log"
        [ -f "$f" ] || continue
        line=$(parse_ei_line "$f")
        [ -n "$line" ] || continue
        [ -n "$have" ] || { echo "The tool's \`entropyinfer:\` lines (start-up, summary):"; echo; have=1; }
        echo "- $mode: \`$(parse_ei_config "$f")\`"
        echo "  \`$line\`"
        # other messages (why a layer or ubatch runs llama.cpp's attention), at most 5
        grep -E '^([0-9.]+ [A-Z] )?[[:space:]]*entropyinfer:' "$f" | sed 's/^.*entropyinfer:/entropyinfer:/' |
            grep -v -e '^entropyinfer: on,' -e '^entropyinfer: mode ' | awk '!seen[$0]++' | head -n 5 |
            tr -d '`' | sed "s/^/  \`/; s/\$/\`/" || true
    done
    [ -z "$have" ] || echo
    fl=$(grep -h -o 'flash_attn *= *[A-Za-z0-9]*' "$LOGS/$m-$c"-*.log 2>/dev/null | tr -s ' ' | sort -u | tr '\n' ';' | sed 's/;$//; s/;/; /g' || true)
    [ -z "$fl" ] || { echo "llama.cpp context: $fl."; echo; }
}

# the contexts of MODEL that have logs, ascending
report_ctxs() {
    for f in "$LOGS/$1"-*.log "$LOGS/$1"-*.cmd; do [ -f "$f" ] && basename "$f"; done |
        sed -n "s/^$1-\([0-9]*\)-.*/\1/p" | sort -n -u
}

write_report() {
    tmp="$OUT.tmp"
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
    [ -n "$cpu" ] || cpu=$(uname -m)
    mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo 2>/dev/null || true)
    {
        echo "# entropyinfer in llama.cpp: long-context perplexity (llama-perplexity)"
        echo
        echo "Written by \`examples/llama.cpp/eval.sh\` (\`make llama-cpp-eval\`) on $(date -u '+%Y-%m-%d %H:%M UTC'), from the runs in \`$LOGS/\`."
        echo
        echo "- machine: $cpu, nproc $NPROC${mem:+, $mem}"
        chars=$(wc -c < "$TEXT" 2>/dev/null | tr -d ' ' || true)
        echo "- text: \`$TEXT\`${chars:+, $chars bytes (about $((chars / 4)) tokens at 4 characters a token)}"
        echo "- perplexity over the second half of each chunk (llama-perplexity's method); \"vs dense\" is against the unpatched dense run (else the patched dense one, else the time-dense run: llama.cpp's attention, the same numbers); prefill s: llama-perplexity's own timer of the first chunk (\"seconds per pass\": its llama_decode calls up to a llama_synchronize); wall s: the whole run, loading and tokenizing included"
        echo "- llama_perf prompt eval: llama_perf_context_print's total, for reference only: in llama.cpp 0c1e57098 it leaves out the time of some llama_decode calls (2048 tokens in 1.7 ms on a 2048-token chunk), so the prefill column uses the tool's timer"
        echo "- attention s, served layers: the \`attention\` field of the \`entropyinfer:\` line; llama.cpp FA s: the \`dense-attention\` field of the time-dense run (llama.cpp's flash attention in the same layers); FA / entropyinfer is their ratio"
        for meta_f in "$LOGS"/*.meta; do
            [ -f "$meta_f" ] || continue
            echo "$(meta "$meta_f" binary)|$(meta "$meta_f" version)"
        done | sort -u | while IFS='|' read -r b ver; do
            echo "- llama.cpp: \`$b\`: ${ver:-version unknown}"
        done
        sys=$(grep -h -m 1 'system_info:' "$LOGS"/*.log 2>/dev/null | head -n 1 | sed 's/^.*system_info:/system_info:/' || true)
        [ -z "$sys" ] || echo "- $sys"
        echo
        for m in $MODELS; do
            for c in $(report_ctxs "$m"); do
                report_table "$m" "$c"
            done
        done
        echo "## Commands"
        echo
        echo "Run from the repository root; output in \`$LOGS/MODEL-CTX-MODE.log\`."
        echo
        echo '```sh'
        for m in $MODELS; do
            for c in $(report_ctxs "$m"); do
                for mode in $ALL_MODES; do
                    f="$LOGS/$m-$c-$mode"
                    [ -f "$f.cmd" ] || continue
                    echo "# $m, -c $c, $mode: exit $(meta "$f.meta" rc), $(meta "$f.meta" wall_s) s, $(meta "$f.meta" date)"
                    cat "$f.cmd"
                done
            done
        done
        echo '```'
    } > "$tmp"
    mv "$tmp" "$OUT"
}

# ---------------------------------------------------------------- main
mkdir -p "$LOGS" "$(dirname "$OUT")"
check_only
FAILED=""
RUNS=""
for m in $MODELS; do
    for c in $(selected_ctxs "$m"); do
        for mode in $(model_modes "$m"); do
            mode_args "$mode" > /dev/null
            RUNS="$RUNS $m:$c:$mode"
        done
    done
done

if [ -n "$RUNS" ]; then
    # Everything the selected runs need, before starting any.
    need_patched=""; need_vanilla=""; need_models=""
    for r in $RUNS; do
        m=${r%%:*}; mode=${r##*:}
        case $mode in vanilla) need_vanilla=1;; *) need_patched=1;; esac
        case " $need_models " in *" $m "*) ;; *) need_models="$need_models $m";; esac
    done
    if [ -n "$need_patched" ] && [ ! -x "$PATCHED" ]; then
        die "patched llama-perplexity not found at $PATCHED: build it (examples/llama.cpp/llama-cpp.mk) or set LLAMA_PERPLEXITY"
    fi
    if [ -n "$need_vanilla" ] && [ ! -x "$VANILLA" ]; then
        die "unpatched llama-perplexity not found at $VANILLA: build it (examples/llama.cpp/llama-cpp.mk) or set LLAMA_PERPLEXITY_VANILLA"
    fi
    for m in $need_models; do
        [ -s "$(model_file "$m")" ] || die "model not found: $(model_file "$m") (sh examples/llama.cpp/fetch_models.sh)"
    done
    [ -s "$TEXT" ] || die "text not found: $TEXT (sh examples/gemma/fetch_corpus.sh, or set EVAL_TEXT)"
    chars=$(wc -c < "$TEXT" | tr -d ' ')
    warned=""
    for r in $RUNS; do
        c=$(echo "$r" | cut -d: -f2); m=${r%%:*}
        k=$(model_chunks "$m"); [ "$k" -ge 2 ] || k=2
        need=$((c * k))
        case " $warned " in *" $m:$c "*) continue;; esac
        warned="$warned $m:$c"
        if [ $((chars / 4)) -lt "$need" ]; then
            say "warning: $TEXT has about $((chars / 4)) tokens (chars/4); $m at -c $c wants $need or more"
        fi
    done
    FA_PATCHED=""; FA_VANILLA=""; LOG_PATCHED=""; LOG_VANILLA=""
    if [ -n "$need_patched" ]; then
        FA_PATCHED=$(fa_args "$PATCHED"); LOG_PATCHED=$(log_args "$PATCHED")
        "$PATCHED" --help 2>&1 | grep -q -e '--entropyinfer' ||
            say "warning: $PATCHED --help shows no --entropyinfer: is it the patched build?"
    fi
    if [ -n "$need_vanilla" ]; then FA_VANILLA=$(fa_args "$VANILLA"); LOG_VANILLA=$(log_args "$VANILLA"); fi
    for r in $RUNS; do
        run_one "${r%%:*}" "$(echo "$r" | cut -d: -f2)" "${r##*:}"
    done
elif [ "$EVAL_ONLY" != none ]; then
    die "EVAL_ONLY=$EVAL_ONLY selects no run"
fi

write_report
say "wrote $OUT"
if [ -n "$FAILED" ]; then die "failed runs:$FAILED"; fi
