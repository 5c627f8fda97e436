#!/usr/bin/env bash
# Session 68, run 4: issue 5's largest case, M=16384 (its targets hold for every M >= 1024),
# on main d2e4033's binaries: the PyTorch BF16 baseline, then the exact and the FP8 layer in
# two alternating rounds beside it (graph replay and eager, median of 5).
# carry [".gpubin/s67m"]; bash docs/pending/s68-16k.sh
set -u
. "$(dirname "$0")/round_lib.sh"
m=$(unpack .gpubin/s67m /tmp/b67m m)
note "main $(cat .gpubin/s67m/BUILT) on $(gpu_name)"
timeout 150 python3 bench/torch_baseline.py --tokens 16384 --iterations 5 --json $L/T16.json > $L/T16.log 2>&1
note "torch 16384 rc=$? $(el)"
for r in 1 2; do
  order="exact fp8"; [ $r = 2 ] && order="fp8 exact"
  for p in $order; do
    timeout 120 $m/mxmoe bench --tokens 16384 --iterations 5 --precision $p --baseline $L/T16.json \
      --json $L/${p}_16k_$r.json > $L/${p}_16k_$r.log 2>&1
    note "$p r$r rc=$? $(summ $L/${p}_16k_$r.json) $(el)"
  done
done
pack_logs
