#!/usr/bin/env bash
# Session 54's round (packed by s54-build.sh into .gpubin/s54a): m = the working tree's
# build (in session 54, main + the one-block permutation before it landed: 513..4096 pairs,
# up to 64 local experts; runs 2-3 had it to 32768), o = main 0a025c2.
# Its GPU tests, its kernel against the two-kernel form under ncu (M = 64..256), the layer of both
# alternating, the smoke validations, memcheck and racecheck on the permutation tests.
# Notes go to stdout too, so a cut call still reports; 00summary.txt sorts first.
set -u
B=/tmp/b; mkdir -p $B && tar xJf .gpubin/s54a/bins.tar.xz -C $B; m=$B/m; o=$B/o
S=$OUT/00summary.txt; L=$OUT/l; mkdir -p $L; t0=$(date +%s)
note() { echo "$*" | tee -a $S; }
left() { [ $(( $(date +%s) - t0 )) -lt $1 ] || { note "skipped past $1 s: $2"; return 1; }; }
passed() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
el() { echo "($(( $(date +%s) - t0 )) s)"; }
cat .gpubin/s54a/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
timeout 150 $m/test_engine --gtest_brief=1 --gtest_filter='Permute.*:Layer.*:Prefill.*:Fp8Mode.*' > $L/tests.log 2>&1
note "test_engine rc=$? $(passed $L/tests.log) $(el)"; grep -E "FAILED|Failure" $L/tests.log | head -5 | tee -a $S
timeout 30 $m/test_layer_args --gtest_brief=1 > $L/args.log 2>&1; note "test_layer_args rc=$? $(passed $L/args.log)"
# The permutation's kernels per forward (us; the two-kernel form is two launches).
for M in ${NCU_TOKENS:-64 128 256}; do
  for v in o m; do left 260 "ncu M=$M" || break 2
    timeout 30 ncu --clock-control none --kernel-name regex:permute --launch-count 4 --metrics gpu__time_duration.sum \
      --csv ${!v}/mxmoe bench --tokens $M --iterations 1 --precision fp8 > $L/ncu_${v}_$M.csv 2>&1
    note "permute $v M=$M: $(grep -E '^"' $L/ncu_${v}_$M.csv | grep -v Metric | awk -F'","' '{print $5 ":" $NF}' | tr -d '"' | sed 's/void unnamed>:://; s/(PermuteParams)//' | tr '\n' ' ')ns $(el)"
  done
done
for r in 1 2; do
  for v in o m; do left 380 "layer $v r$r" || break 2
    timeout 45 ${!v}/mxmoe bench --tokens ${LAYER_TOKENS:-64,128,256,512} --iterations 10 --precision fp8 --json $L/${v}_f8_$r.json > $L/${v}_f8_$r.log 2>&1
    note "fp8 $v r$r rc=$? $(el)"
  done
done
for v in o m; do left 420 "exact $v" || break
  timeout 40 ${!v}/mxmoe bench --tokens ${EXACT_TOKENS:-64,128,256} --iterations 10 --precision exact --json $L/${v}_ex_1.json > $L/${v}_ex_1.log 2>&1
  note "exact $v rc=$? $(el)"
done
for pr in fp8 exact; do left 470 "smoke $pr" || continue
  timeout 50 $m/mxmoe validate --suite smoke --backend cuda --precision $pr > $L/smoke_$pr.log 2>&1
  note "smoke $pr rc=$? $(grep -E 'passed' $L/smoke_$pr.log | tail -1) $(el)"
done
for tool in memcheck racecheck; do left 530 $tool || break
  timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 $m/test_engine --gtest_brief=1 \
    --gtest_filter='Permute.*' > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ') $(passed $L/$tool.log) $(el)"
done
python3 bench/compare_runs.py $L --variants o,m --rounds 1,2 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
python3 bench/compare_runs.py $L --variants o,m --rounds 1 --pattern '{v}_ex_{r}.json' 2>&1 | tee -a $S
cat $S
tar czf /tmp/all.tgz -C $OUT l 2>/dev/null; rm -rf $L; mv /tmp/all.tgz $OUT/
