#!/usr/bin/env bash
# Session 53's second call, on the warm machine after round.sh (same binaries,
# .gpubin/s53a): x's scattered staging at other warps per token, under ncu and in the
# layer. Usage: bash .gpubin/s53a/round2.sh "SPLITS" where SPLITS are MXMOE_F8_SPLIT
# values to set beside the default (d). Stage: ncu time at M=1024, 2048, 4096; layer: FP8
# graph replay at 1024, 2048, 4096, the variants alternating over two rounds.
set -u
B=/tmp/b; [ -x $B/m/mxmoe ] || { mkdir -p $B && tar xJf .gpubin/s53a/bins.tar.xz -C $B; }; m=$B/m
S=$OUT/00summary.txt; L=$OUT/l; mkdir -p $L; t0=$(date +%s)
note() { echo "$*" | tee -a $S; }
el() { echo "($(( $(date +%s) - t0 )) s)"; }
splits=${1:-"2 7"}
cat .gpubin/s53a/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
for M in 1024 2048 4096; do
  for sp in d $splits; do
    [ $(( $(date +%s) - t0 )) -lt 200 ] || { note "ncu skipped past 200 s"; break 2; }
    env $([ $sp = d ] || echo MXMOE_F8_SPLIT=$sp) timeout 30 ncu --clock-control none --kernel-name regex:stage_fp8 \
      --launch-count 2 --metrics gpu__time_duration.sum --csv $m/mxmoe bench --tokens $M --iterations 1 \
      --precision fp8 > $L/ncu_${M}_$sp.csv 2>&1
    note "stage M=$M split $sp: $(grep -E '^"' $L/ncu_${M}_$sp.csv | grep stage_fp8 | awk -F'","' '{print $NF}' | tr -d '"' | tr '\n' ' ')us $(el)"
  done
done
for r in 1 2; do
  for sp in d $splits; do
    [ $(( $(date +%s) - t0 )) -lt 420 ] || { note "layer skipped past 420 s"; break 2; }
    env $([ $sp = d ] || echo MXMOE_F8_SPLIT=$sp) timeout 40 $m/mxmoe bench --tokens 1024,2048,4096 --iterations 10 \
      --precision fp8 --json $L/s${sp}_f8_$r.json > $L/s${sp}_f8_$r.log 2>&1
    note "layer split $sp r$r rc=$? $(el)"
  done
done
python3 bench/compare_runs.py $L --variants "sd$(for s in $splits; do echo -n ,s$s; done)" --rounds 1,2 \
  --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
tar czf /tmp/all2.tgz -C $OUT l 2>/dev/null; rm -rf $L; mv /tmp/all2.tgz $OUT/
