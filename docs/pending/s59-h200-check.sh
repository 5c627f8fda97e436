#!/usr/bin/env bash
# Session 59: on an H200, main 5be37c9 (m) against main b6ed796 (t): the layer at M=16 / 32
# in alternating rounds, then s59-ncu32.sh's ncu of the 32-token GEMM1 kernel alone.
# Carry [".gpubin/s59m", ".gpubin/s59t"] (~60 s).
set -u
B=/tmp/b59n; mkdir -p $B && tar xJf .gpubin/s59m/bins.tar.xz -C $B m/mxmoe && tar xJf .gpubin/s59t/bins.tar.xz -C $B t/mxmoe
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $S
for r in 1 2; do for v in m t; do
  timeout 30 $B/$v/mxmoe bench --tokens 16,32 --iterations 20 --json $L/pf_${v}_$r.json > /dev/null 2>&1
  note "$v r$r rc=$? $(summ $L/pf_${v}_$r.json)"
done; done
bash "$(dirname "$0")/s59-ncu32.sh"
pack_logs
