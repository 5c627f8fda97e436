#!/usr/bin/env bash
# Session 62: m against c at M=1024 / 4096 only, twelve alternating runs (the first round's
# M=4096 medians spread +-2%, wider than the difference).
set -u
B=/tmp/b60c; mkdir -p $B && [ -x $B/c/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
torch_prefill
for v in m c c m m c c m m c c m; do
  n=$(( $(ls $L/${v}_g_*.json 2>/dev/null | wc -l) + 1 ))
  timeout 60 $B/$v/mxmoe bench --tokens 1024,4096 --iterations 20 --precision fp8 --baseline $L/T.json \
    --json $L/${v}_g_$n.json > $L/${v}_g_$n.log 2>&1; note "fp8 $v r$n rc=$? $(summ $L/${v}_g_$n.json) $(el)"
done
pack_logs
