#!/usr/bin/env bash
# Session 54's last call (packed by s54-build.sh as .gpubin/s54a/check.sh): the GPU tests
# of the one-block permutation as it lands (after run 5's form was folded into one walk per
# phase), memcheck and racecheck on them, the FP8 smoke validation, and the kernel under
# ncu at M=128 beside main's two kernels (o).
set -u
B=/tmp/b; mkdir -p $B && tar xJf .gpubin/s54a/bins.tar.xz -C $B; m=$B/m
S=$OUT/00summary.txt; L=$OUT/l; mkdir -p $L; t0=$(date +%s)
note() { echo "$*" | tee -a $S; }
passed() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
el() { echo "($(( $(date +%s) - t0 )) s)"; }
cat .gpubin/s54a/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
timeout 100 $m/test_engine --gtest_brief=1 --gtest_filter='Permute.*:Layer.*:Prefill.*' > $L/tests.log 2>&1
note "test_engine rc=$? $(passed $L/tests.log) $(el)"; grep -E "FAILED|Failure" $L/tests.log | head -5 | tee -a $S
for tool in memcheck racecheck; do
  timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 $m/test_engine --gtest_brief=1 \
    --gtest_filter='Permute.*' > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ') $(passed $L/$tool.log) $(el)"
done
timeout 50 $m/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/smoke_fp8.log 2>&1
note "smoke fp8 rc=$? $(grep -E 'passed' $L/smoke_fp8.log | tail -1) $(el)"
for v in o m; do
  timeout 30 ncu --clock-control none --kernel-name regex:permute --launch-count 4 --metrics gpu__time_duration.sum \
    --csv $B/$v/mxmoe bench --tokens 128 --iterations 1 --precision fp8 > $L/ncu_${v}_128.csv 2>&1
  note "permute $v M=128: $(grep -E '^"' $L/ncu_${v}_128.csv | grep -v Metric | awk -F'","' '{print $5 ":" $NF}' | tr -d '"' | sed 's/void unnamed>:://; s/(PermuteParams)//' | tr '\n' ' ')ns $(el)"
done
tar czf /tmp/all.tgz -C $OUT l 2>/dev/null; rm -rf $L; mv /tmp/all.tgz $OUT/
