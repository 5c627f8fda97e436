#!/usr/bin/env bash
# Session 62: the FP8 layer's kernels one by one, m (main 610a4e0) against c (51389be's
# kernels), at M=512 (where the layer gained 3.7%) and M=4096 (+0.7% in noise): each
# kernel's duration and executed warp instructions over the bench's forwards (ncu,
# unmodified clocks, as the layer runs). Run: bash .gpubin/s60c/s62-ncu.sh with carry
# [".gpubin/s60c"] (~200 s), ncu_table.py beside it.
set -u
B=/tmp/b60c; mkdir -p $B && [ -x $B/c/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
for vm in m:4096 c:4096 c:512 m:512 m:4096 c:4096; do
  v=${vm%:*}; m=${vm#*:}
  left 420 "ncu $v $m" && ncu_fp8 $v $B/$v $m 60
done
python3 "$(dirname "$0")/ncu_table.py" $L m c | tee -a $S  # as run: the ncu call and this table inline (round_lib.sh ncu_fp8 and ncu_table.py since)
pack_logs
