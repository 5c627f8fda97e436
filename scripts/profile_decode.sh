#!/usr/bin/env bash
# Nsight Compute profile of the decode path's kernels (Kimi-K3 bench shapes), for the
# stall reasons and achieved bandwidth of each stage. Needs ncu on the GPU machine.
#   scripts/profile_decode.sh BUILD_DIR OUT_DIR [M...]
# Writes OUT_DIR/ncu_M<m>.txt (per-kernel details) and a one-line-per-kernel summary.
set -uo pipefail
B=${1:?build dir}; OUT_DIR=${2:?output dir}; shift 2
ms=${*:-1 8 32}
mkdir -p "$OUT_DIR"
for m in $ms; do
  # Skip the warm-up launches of bench (eager, first iterations) and profile one
  # forward's worth of kernels; --clock-control none keeps the boost clocks the bench sees.
  timeout 300 ncu --clock-control none --set full --launch-skip 40 --launch-count 8 \
    "$B/mxmoe" bench --tokens "$m" --iterations 3 > "$OUT_DIR/ncu_M$m.txt" 2>&1
  echo "== M=$m rc=$?"
  grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput  |Achieved Occupancy|Registers Per|Warp Cycles Per Issued|One or More Eligible" "$OUT_DIR/ncu_M$m.txt" | head -80
done
