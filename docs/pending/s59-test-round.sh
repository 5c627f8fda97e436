#!/usr/bin/env bash
# Session 59: main 1c05123 (the 32-token GEMM1 epilogue without its spill) plus the GPU test
# PrefillKernels.KeepNothingInLocalMemory (gemm1/gemm2_prefill_local_bytes), built in
# /tmp/s57-k/build-gpu (sm_90a). Run with carry [".gpubin/s59t"] (~90 s).
set -u
B=/tmp/b59t; mkdir -p $B && tar xJf .gpubin/s59t/bins.tar.xz -C $B; t=$B/t
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
gtests t $t 'PrefillKernels.*:DecodeKernels.*:Prefill.*:Layer.*' 60
memcheck t $t 'Prefill.*:PrefillKernels.*'
timeout 70 $t/mxmoe validate --suite all --backend cuda > $L/t_validate.log 2>&1
note "t validate all rc=$? $(grep -E 'passed' $L/t_validate.log | tail -1) $(el)"
timeout 30 python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
timeout 30 $t/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json --json $L/t_dec.json > $L/t_dec.log 2>&1
note "decode rc=$? $(summ $L/t_dec.json) $(el)"
cat $S
pack_logs
