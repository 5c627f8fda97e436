#!/usr/bin/env bash
# Session 55's second round (packed by s55-build.sh into .gpubin/s55a as round2.sh): m =
# the working tree's build after run 1 (the block form's pair indices 32-bit, one block's
# row_map in one sweep; the grid form under graph replay tested), o = main (HEAD).
# m's GPU tests and sanitizers, the permutation's kernels under ncu from one step to 64
# blocks (o, m, and m's one block at 3 and 4 steps), the layer of both alternating, the
# FP8 smoke validation. Notes go to stdout too; 00summary.txt sorts first.
set -u
B=/tmp/b; mkdir -p $B && tar xJf .gpubin/s55a/bins.tar.xz -C $B; m=$B/m; o=$B/o
S=$OUT/00summary.txt; L=$OUT/l; mkdir -p $L; t0=$(date +%s)
note() { echo "$*" | tee -a $S; }
left() { [ $(( $(date +%s) - t0 )) -lt $1 ] || { note "skipped past $1 s: $2"; return 1; }; }
passed() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
el() { echo "($(( $(date +%s) - t0 )) s)"; }
cat .gpubin/s55a/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
timeout 120 $m/test_engine --gtest_brief=1 --gtest_filter='Permute.*:Layer.*' > $L/tests.log 2>&1
note "test_engine rc=$? $(passed $L/tests.log) $(el)"; grep -E "FAILED|Failure" $L/tests.log | head -5 | tee -a $S
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $m/test_engine --gtest_brief=1 \
    --gtest_filter='Permute.*:Layer.PermutationGrid*' > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ') $(passed $L/$tool.log) $(el)"
done
perm() {  # perm NAME BIN M [ENV=VALUE]: the permutation's kernels of 4 forwards under ncu
  left 330 "ncu $1 M=$3" || return 1
  env ${4:-X=} timeout 30 ncu --clock-control none --kernel-name regex:permute --launch-count 4 --metrics gpu__time_duration.sum \
    --csv $2/mxmoe bench --tokens $3 --iterations 1 --precision fp8 > $L/ncu_$1_$3.csv 2>&1
  note "permute $1 M=$3 ${4:-}: $(grep -E '^"' $L/ncu_$1_$3.csv | grep -v Metric | awk -F'","' '{print $5 ":" $NF}' | tr -d '"' | sed 's/void unnamed>:://; s/(.*)//' | tr '\n' ' ')ns $(el)"
}
for M in 64 128 192 256 1024 4096; do perm o $o $M; perm m $m $M; done
perm m1 $m 192 MXMOE_PERMUTE_ONE_BLOCK_STEPS=4
perm m1 $m 256 MXMOE_PERMUTE_ONE_BLOCK_STEPS=4
for r in 1 2; do
  for v in o m; do left 450 "layer $v r$r" || break 2
    timeout 60 ${!v}/mxmoe bench --tokens 64,128,256,1024,4096 --iterations 10 --precision fp8 --json $L/${v}_f8_$r.json > $L/${v}_f8_$r.log 2>&1
    note "fp8 $v r$r rc=$? $(el)"
  done
done
for v in o m; do left 480 "exact $v" || break
  timeout 40 ${!v}/mxmoe bench --tokens 128,256,1024 --iterations 10 --precision exact --json $L/${v}_ex_1.json > $L/${v}_ex_1.log 2>&1
  note "exact $v rc=$? $(el)"
done
left 530 "smoke fp8" && { timeout 50 $m/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/smoke_fp8.log 2>&1
  note "smoke fp8 rc=$? $(grep -E 'passed' $L/smoke_fp8.log | tail -1) $(el)"; }
python3 bench/compare_runs.py $L --variants o,m --rounds 1,2 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
python3 bench/compare_runs.py $L --variants o,m --rounds 1 --pattern '{v}_ex_{r}.json' 2>&1 | tee -a $S
cat $S
tar czf /tmp/all.tgz -C $OUT l 2>/dev/null; rm -rf $L; mv /tmp/all.tgz $OUT/
