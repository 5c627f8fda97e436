#!/usr/bin/env bash
# Session 59: why the 32-token GEMM1 epilogue change gained more than its arithmetic.
# ncu on gemm1_prefill_kernel at M=32: main 5be37c9 (m, .gpubin/s59m) against main b6ed796
# (t, .gpubin/s59t): duration, warp stall reasons (no_instruction = instruction cache),
# local-load L1 hits and misses. Carry [".gpubin/s59m", ".gpubin/s59t"].
set -u
B=/tmp/b59n; mkdir -p $B && tar xJf .gpubin/s59m/bins.tar.xz -C $B m/mxmoe && tar xJf .gpubin/s59t/bins.tar.xz -C $B t/mxmoe
M='gpu__time_duration.sum,smsp__inst_executed.sum,l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_hit.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_miss.sum,regex:smsp__pcsamp_warps_issue_stalled_.*'
i=0
for v in m t m t; do
  i=$((i + 1))  # each repeat its own file
  timeout 60 ncu --clock-control none -k regex:gemm1_prefill --launch-skip 3 --launch-count 1 --metrics $M \
    $B/$v/mxmoe bench --tokens 32 --iterations 2 > $OUT/ncu32_${v}_$i.txt 2>&1
  echo "== $v ($i) rc=$?"; grep -E 'gpu__time|inst_executed|local_op|no_instructions |long_scoreboard |barrier |wait |short_scoreboard |math_pipe|mio_throttle |lg_throttle ' $OUT/ncu32_${v}_$i.txt | grep -v not_issued | sed 's/  */ /g'
done
