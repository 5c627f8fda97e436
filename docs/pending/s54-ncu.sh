#!/usr/bin/env bash
# Session 54's profile of the one-block permutation (binaries of .gpubin/s54a, round.sh
# first or alone): ncu's full set and source counters of permute_block_kernel at M=1024
# (16384 pairs), and the two-kernel form's for comparison.
set -u
B=/tmp/b; [ -x $B/m/mxmoe ] || { mkdir -p $B && tar xJf .gpubin/s54a/bins.tar.xz -C $B; }
S=$OUT/00summary.txt
for v in m o; do
  timeout 120 ncu --set full --import-source no --kernel-name regex:permute --launch-count $([ $v = m ] && echo 1 || echo 2) \
    --print-details all $B/$v/mxmoe bench --tokens 1024 --iterations 1 --precision fp8 > $OUT/ncu_full_$v.txt 2>&1
  echo "ncu $v rc=$?" | tee -a $S
done
grep -E "Duration|Executed Ipc|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|Registers Per|Bank Conflicts|Shared Memory" $OUT/ncu_full_m.txt | head -40 | tee -a $S
