#!/bin/bash
# bench/cuda_session.sh - one call on a lent GPU machine: build the plugin and
# the GPU tests, check the attention kernels, time them against PyTorch SDPA and
# read ncu's figures for one kernel. Every step writes its log to $LOG (default
# $OUT, else build/); the summary lines go to stdout.
#
#   STEPS="build test fuzz memcheck sdpa bench ncu" bench/cuda_session.sh
#
# Used on the H200 for issue 32 (2026-12-03): build + test (CFG=wgo128
# SPCFG=wgk64) about 160 s, sdpa 18 s, bench with 5 shapes 35 s, fuzz 20 s,
# memcheck 29 s, ncu 35 s.
#
#   B=dir          build folder (default /tmp/eib: it outlives a carried tree on a warm machine)
#   CFG=wgo128     EI_CUDA_ATTN_CFG for test / fuzz / memcheck / ncu (default: the library's)
#   SPCFG=wgk64    EI_CUDA_ATTN_SPARSE_CFG (the sparse segments' kernel) likewise
#   SHAPES=...     EI_BENCH_SHAPES for bench (first = the real-density rows' kernel)
#   SIZES="..."    bench and sdpa sizes (default 32768 65536 131072)
#   FUZZ_S=60      seconds per fuzz job (2 jobs)
#   NCU_SHAPE=wgs128 NCU_SKIP=6  ncu's kernel and how many of its launches to skip (6: the sparse call)
# Steps: build (make cuda + test programs + bench, ptxas -v of the attention
# kernels: registers and spills), test (make test-cuda's programs), fuzz
# (make test-gpu-fuzz), memcheck (compute-sanitizer on test_cuda_graph and 8
# fuzz draws), racecheck (2 fuzz draws: the hazards and where), sdpa (bench/sdpa_ref.py: times and the kernel that ran), bench
# (build/ei_bench_cuda), ncu (the dense attention kernel at 32k, SpeedOfLight
# and the pipes).
set -u
B=${B:-/tmp/eib}; case $B in /*) ;; *) B=$PWD/$B ;; esac
LOG=${LOG:-${OUT:-build}}
SIZES=${SIZES:-32768 65536 131072}
STEPS=${STEPS:-build test fuzz memcheck sdpa bench ncu}
FUZZ_S=${FUZZ_S:-60}
mkdir -p "$B" "$LOG"
[ -n "${CFG:-}" ] && export EI_CUDA_ATTN_CFG=$CFG
[ -n "${SPCFG:-}" ] && export EI_CUDA_ATTN_SPARSE_CFG=$SPCFG
export EI_CUDA_LIBRARY=$B/libentropyinfer_cuda.so
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0)) s] $*"; }
for step in $STEPS; do
    case $step in
    build)
        make -s BUILD="$B" CUDA_NVCCFLAGS="-O3 -std=c++17 -lineinfo --threads 0 -Xptxas -v" cuda > "$LOG/build.log" 2>&1 || {
            tail -30 "$LOG/build.log"; say "build FAILED"; exit 1; }
        make -s BUILD="$B" T_BUILD="$B" "$B/test_cuda" "$B/test_backends" "$B/test_cuda_graph" "$B/fuzz_backends" "$B/ei_bench_cuda" \
            >> "$LOG/build.log" 2>&1 || { tail -30 "$LOG/build.log"; say "test build FAILED"; exit 1; }
        grep -A2 "Compiling entry.*attention_kernel.*sm_90a" "$LOG/build.log" | grep -o "[0-9]* bytes spill stores.*\|Used [0-9]* registers" |
            paste - - | sort | uniq -c | sed 's/^/  ptxas attention_kernel sm_90a: /'
        grep -A2 "Compiling entry.*attention_ws_kernel.*sm_90a" "$LOG/build.log" | grep -o "[0-9]* bytes spill stores.*\|Used [0-9]* registers" |
            paste - - | sort | uniq -c | sed 's/^/  ptxas attention_ws_kernel sm_90a: /'
        # the overlapped kernel's SASS (bf16, head_dim 128, 128 keys): HGMMA and the waits between them
        cuobjdump -sass -fun '_Z16attention_kernelILi128ELi8ELi1ELi128E13__nv_bfloat16Lb1ELb1ELi4EEv10AttnParamsNSt11conditionalIXgtT6_Li0EE8AttnMaps10AttnNoMapsE4typeE' \
            "$B/libentropyinfer_cuda.so" > "$LOG/wgo128.sass" 2>&1
        echo "  wgo128 SASS: $(grep -c HGMMA "$LOG/wgo128.sass") HGMMA, $(grep -c 'WARPGROUP.DEPBAR' "$LOG/wgo128.sass") WARPGROUP.DEPBAR, $(grep -c 'WARPGROUP.ARRIVE' "$LOG/wgo128.sass") WARPGROUP.ARRIVE"
        say "build ok" ;;
    test)
        ( $B/test_backends --require-gpu && $B/test_cuda_graph && $B/test_cuda ${GOLDEN:-tests/golden} ) > "$LOG/test.log" 2>&1
        rc=$?
        grep -E "FAIL|passed|failed" "$LOG/test.log" | tail -8
        say "test rc $rc" ;;
    fuzz)
        make -s BUILD="$B" T_BUILD="$B" test-gpu-fuzz CUDA_FUZZ_JOBS=2 CUDA_FUZZ_SECONDS=$FUZZ_S CUDA_FUZZ_ITERS=100000 \
            CUDA_FUZZ_RUN="$B/fuzz_backends --require-gpu" > "$LOG/fuzz.log" 2>&1
        rc=$?
        tail -6 "$LOG/fuzz.log"
        say "fuzz rc $rc" ;;
    memcheck)
        compute-sanitizer --tool memcheck --error-exitcode 9 $B/test_cuda_graph > "$LOG/memcheck.log" 2>&1
        rc1=$?
        compute-sanitizer --tool memcheck --error-exitcode 9 $B/fuzz_backends --require-gpu --seed 7 --iters 8 --max-n 600 \
            >> "$LOG/memcheck.log" 2>&1
        rc2=$?
        grep -E "ERROR SUMMARY" "$LOG/memcheck.log"
        say "memcheck rc $rc1 / $rc2" ;;
    racecheck)
        timeout ${RACE_S:-150} compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 \
            $B/fuzz_backends --require-gpu --seed 3 --iters ${RACE_ITERS:-2} --max-n 600 > "$LOG/racecheck.log" 2>&1
        rc=$?
        grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$LOG/racecheck.log"
        grep -E "hazard|Race reported" "$LOG/racecheck.log" | sort | uniq -c | sort -rn | head -5 | cut -c1-200
        grep -A6 -m2 "hazard" "$LOG/racecheck.log" | cut -c1-200
        say "racecheck rc $rc" ;;
    sdpa)
        PYTHONUNBUFFERED=1 python3 bench/sdpa_ref.py $SIZES > "$B/sdpa_times.txt" 2> "$LOG/sdpa.err"
        cp "$B/sdpa_times.txt" "$LOG/sdpa.txt"
        cat "$B/sdpa_times.txt"
        say "sdpa done" ;;
    bench)
        EI_SDPA_TIMES=$B/sdpa_times.txt EI_BENCH_SHAPES=${SHAPES:-} $B/ei_bench_cuda $SIZES > "$LOG/bench.log" 2>&1
        rc=$?
        grep -E "^ +[0-9]+ |by CTA shape|real density" "$LOG/bench.log"
        say "bench rc $rc" ;;
    ncu)
        # NCU_SKIP=6: the sparse call's first launch (ei_bench_cuda times 1 + 5 dense calls first)
        EI_BENCH_SHAPES=${NCU_SHAPE:-${CFG:-wgs128}} ncu --clock-control none -k regex:'attention_(ws_)?kernel' \
            --launch-skip ${NCU_SKIP:-0} --launch-count 1 \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats \
            --section MemoryWorkloadAnalysis \
            --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct \
            $B/ei_bench_cuda 32768 > "$LOG/ncu${NCU_SKIP:-0}.log" 2>&1
        grep -E "attention_(ws_)?kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc|Issue Slots|Tensor|Achieved Occupancy|Registers Per|L1/TEX Cache|L2 Cache Throughput|DRAM Throughput|sm__pipe_tensor|lts__t_sector_hit|L2 Hit|Stall|Warp Cycles Per Issued" \
            "$LOG/ncu${NCU_SKIP:-0}.log" | cut -c1-160 | head -30
        say "ncu done" ;;
    esac
done
