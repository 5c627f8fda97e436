#!/usr/bin/env bash
# Prepared in session 55, not run: the next round for the grid permutation. Build first:
#   git apply docs/pending/s55-seg-by-expert.patch && bash docs/pending/s55-build.sh
#   cp docs/pending/s55-round5.sh .gpubin/s55a/round5.sh
# then one device call: bash .gpubin/s55a/round5.sh with carry [".gpubin/s55a"].
# m = main + the patch (the grid's counts as [expert][block], read coalesced; the knob
# MXMOE_PERMUTE_MAX_BLOCKS), o = main. m's GPU tests (among them the cases at 16384 and
# 16385 tokens added after session 55's run 4), sanitizers, then the permutation under
# ncu from 16 to 64 blocks and past them: 64 blocks of 2 and 4 steps (M=8192, 16384)
# against 128 and 256 one-step blocks (the knob) and main's forms.
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
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $m/test_engine --gtest_brief=1 \
    --gtest_filter='Permute.*:Layer.PermutationGrid*' > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ') $(passed $L/$tool.log) $(el)"
done
perm() {  # perm NAME BIN M [ENV=VALUE]: the permutation's kernels of 4 forwards under ncu
  left 420 "ncu $1 M=$3" || return 1
  env ${4:-X=} timeout 40 ncu --clock-control none --kernel-name regex:permute --launch-count 4 --metrics gpu__time_duration.sum \
    --csv $2/mxmoe bench --tokens $3 --iterations 1 --precision fp8 > $L/ncu_$1_$3.csv 2>&1
  note "permute $1 M=$3 ${4:-}: $(grep -E '^"' $L/ncu_$1_$3.csv | grep -v Metric | awk -F'","' '{print $5 ":" $NF}' | tr -d '"' | sed 's/void unnamed>:://; s/(.*)//' | tr '\n' ' ')ns $(el)"
}
for M in 1024 4096 8192 16384; do perm o $o $M; perm m $m $M; done
perm m128 $m 8192 MXMOE_PERMUTE_MAX_BLOCKS=128
perm m256 $m 16384 MXMOE_PERMUTE_MAX_BLOCKS=256
left 480 "validate all" && { timeout 80 $m/mxmoe validate --suite all --backend cuda > $L/all_exact.log 2>&1
  note "validate all exact rc=$? $(grep -E 'passed' $L/all_exact.log | tail -1) $(el)"; }
left 540 "smoke fp8" && { timeout 50 $m/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/smoke_fp8.log 2>&1
  note "smoke fp8 rc=$? $(grep -E 'passed' $L/smoke_fp8.log | tail -1) $(el)"; }
cat $S
tar czf /tmp/all.tgz -C $OUT l 2>/dev/null; rm -rf $L; mv /tmp/all.tgz $OUT/
