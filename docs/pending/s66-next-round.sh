#!/usr/bin/env bash
# Session 66, for the next session's first call: whichever GPU comes. On an H200, main's
# issue-figures round (.gpubin/s64m, main 5327533's kernels = main's now). Elsewhere, where
# the exact prefill kernels' warps wait (PERFORMANCE.md session 66, lead 2): ncu warp-state
# samples and source counters of gemm1_prefill / gemm2_prefill at M=128 and 1024 (one
# launch past the first each), exported per SASS instruction and read by
# bench/ncu_hot_code.py (stall reasons, then the instructions with the most samples of the
# top reasons). ~2 min on an H100.
# carry [".gpubin/s64m"]; ROUND_S=<the call's limit> bash docs/pending/s66-next-round.sh
set -u
. "$(dirname "$0")/h200_dispatch.sh"
R=${ROUND_S:-300}
for M in 128 1024; do
  for k in gemm1_prefill gemm2_prefill; do
    left $(( R - 60 )) "stalls $k M=$M" || break 2
    timeout 90 ncu --section WarpStateStats --section SourceCounters -k regex:$k --launch-skip 2 --launch-count 1 \
      -o $L/${k}_$M $m/mxmoe bench --tokens $M --iterations 1 > $L/${k}_${M}_ncu.log 2>&1
    note "ncu $k M=$M rc=$? $(el)"
    ncu --import $L/${k}_$M.ncu-rep --page source --csv --print-source sass > $L/${k}_$M.sass.csv 2>/dev/null
    rm -f $L/${k}_$M.ncu-rep  # the export holds what the table reads; the report is large
    python3 bench/ncu_hot_code.py $L/${k}_$M.sass.csv 2>&1 | head -25 | tee -a $S
    for r in stall_long_sb stall_barrier stall_wait; do
      python3 bench/ncu_hot_code.py $L/${k}_$M.sass.csv --top $r -n 8 2>&1 | tail -9 >> $L/${k}_${M}_top.txt
    done
  done
done
pack_logs
