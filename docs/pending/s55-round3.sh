#!/usr/bin/env bash
# Session 55's third round (packed by s55-build.sh into .gpubin/s55a as round3.sh): m = the
# working tree's build after run 2 (one block up to 3 steps; its path without the grid's
# extra scan, barrier and copies), o = main (HEAD). m's GPU tests and sanitizers, the
# permutation's kernels under ncu (o and m), m's grid at M=4096 under ncu --set full, the
# exact validation suite and the FP8 smoke one, one layer round of each. Notes go to
# stdout too; 00summary.txt sorts first.
set -u
B=/tmp/b; mkdir -p $B && tar xJf .gpubin/s55a/bins.tar.xz -C $B; m=$B/m; o=$B/o
S=$OUT/00summary.txt; L=$OUT/l; mkdir -p $L; t0=$(date +%s)
note() { echo "$*" | tee -a $S; }
left() { [ $(( $(date +%s) - t0 )) -lt $1 ] || { note "skipped past $1 s: $2"; return 1; }; }
passed() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
el() { echo "($(( $(date +%s) - t0 )) s)"; }
cat .gpubin/s55a/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
timeout 150 $m/test_engine --gtest_brief=1 --gtest_filter='Permute.*:Layer.*:Prefill.*:Fp8Mode.*' > $L/tests.log 2>&1
note "test_engine rc=$? $(passed $L/tests.log) $(el)"; grep -E "FAILED|Failure" $L/tests.log | head -5 | tee -a $S
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $m/test_engine --gtest_brief=1 \
    --gtest_filter='Permute.*:Layer.PermutationGrid*' > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ') $(passed $L/$tool.log) $(el)"
done
perm() {  # perm NAME BIN M [ENV=VALUE]: the permutation's kernels of 4 forwards under ncu
  left 280 "ncu $1 M=$3" || return 1
  env ${4:-X=} timeout 30 ncu --clock-control none --kernel-name regex:permute --launch-count 4 --metrics gpu__time_duration.sum \
    --csv $2/mxmoe bench --tokens $3 --iterations 1 --precision fp8 > $L/ncu_$1_$3.csv 2>&1
  note "permute $1 M=$3 ${4:-}: $(grep -E '^"' $L/ncu_$1_$3.csv | grep -v Metric | awk -F'","' '{print $5 ":" $NF}' | tr -d '"' | sed 's/void unnamed>:://; s/(.*)//' | tr '\n' ' ')ns $(el)"
}
for M in 64 128 192 256 1024 4096; do perm o $o $M; perm m $m $M; done
left 300 "ncu full" && { timeout 60 ncu --clock-control none --kernel-name regex:permute --launch-skip 1 --launch-count 1 --set full \
    $m/mxmoe bench --tokens 4096 --iterations 1 --precision fp8 > $L/ncu_full_m_4096.txt 2>&1
  note "ncu full m M=4096 rc=$? $(el)"; grep -E "Duration|Elapsed Cycles|Executed Ipc A|Warp Cycles Per Issued|Achieved Occupancy|DRAM Throughput|L2 Cache Throughput" $L/ncu_full_m_4096.txt | head -9 | tee -a $S; }
left 400 "validate all" && { timeout 80 $m/mxmoe validate --suite all --backend cuda > $L/all_exact.log 2>&1
  note "validate all exact rc=$? $(grep -E 'passed' $L/all_exact.log | tail -1) $(el)"; }
left 470 "smoke fp8" && { timeout 50 $m/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/smoke_fp8.log 2>&1
  note "smoke fp8 rc=$? $(grep -E 'passed' $L/smoke_fp8.log | tail -1) $(el)"; }
for v in o m; do left 520 "layer $v" || break
  timeout 30 ${!v}/mxmoe bench --tokens 128,256,1024,4096 --iterations 10 --precision fp8 --json $L/${v}_f8_1.json > $L/${v}_f8_1.log 2>&1
  note "fp8 $v rc=$? $(el)"
done
python3 bench/compare_runs.py $L --variants o,m --rounds 1 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
cat $S
tar czf /tmp/all.tgz -C $OUT l 2>/dev/null; rm -rf $L; mv /tmp/all.tgz $OUT/
