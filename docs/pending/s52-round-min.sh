#!/usr/bin/env bash
# Session 52's minimal form of session 51's round (docs/pending/s51-round.sh), for a call
# with ~7 minutes of device time left: the GPU tests, the bench G against S (two rounds if
# time allows), memcheck on the staging and fused tests, FP8 smoke validation, then (time
# left) the torch baseline and the forced runs at 128 / 256. Notes to stdout too.
set -u
B=/tmp/b; mkdir -p $B && tar xJf .gpubin/s51a/bins.tar.xz -C $B
S=$OUT/00summary.txt; t0=$(date +%s)
note() { echo "$*" | tee -a $S; }
left() { [ $(( $(date +%s) - t0 )) -lt $1 ] || { note "skipped past $1 s: $2"; return 1; }; }
passed() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader | tee -a $S
timeout 100 $B/S/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*:Layer.PrefillPast*' > $OUT/tests.log 2>&1
note "S Fp8Mode.*+Layer.PrefillPast*: rc=$? $(passed $OUT/tests.log) ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|Failure" $OUT/tests.log | head -5 | tee -a $S
bench() {  # variant round tokens
  local g=""; [ $1 = G ] && g="MXMOE_F8_SCATTER=0"
  env $g timeout 50 $B/S/mxmoe bench --tokens $3 --iterations 10 --precision fp8 \
    --json $OUT/${1}_f8_$2.json > $OUT/${1}_f8_$2.log 2>&1
  note "bench $1 round $2 rc=$? ($(( $(date +%s) - t0 )) s)"
}
for v in G S; do bench $v 1 128,512,1024,4096; done
python3 bench/compare_runs.py $OUT --variants G,S --rounds 1 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
left 260 memcheck && { timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $B/S/test_engine --gtest_brief=1 \
  --gtest_filter='Fp8Mode.Stage*:Fp8Mode.Fused*' > $OUT/memcheck.log 2>&1
  note "S memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log | tr '\n' ' ') $(passed $OUT/memcheck.log) ($(( $(date +%s) - t0 )) s)"; }
left 330 smoke && { timeout 50 $B/S/mxmoe validate --suite smoke --backend cuda --precision fp8 > $OUT/smoke_fp8.log 2>&1
  note "S smoke fp8 rc=$? $(grep -E 'passed' $OUT/smoke_fp8.log | tail -1) ($(( $(date +%s) - t0 )) s)"; }
if left 360 "bench round 2"; then
  for v in S G; do bench $v 2 128,512,1024,4096; done
  python3 bench/compare_runs.py $OUT --variants G,S --rounds 1,2 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
fi
left 430 "args" && { timeout 30 $B/S/test_layer_args --gtest_brief=1 > $OUT/args.log 2>&1; note "S test_layer_args rc=$? $(passed $OUT/args.log)"; }
if left 450 "forced small M"; then
  for v in small0 small1; do
    MXMOE_F8_SCATTER=${v#small} timeout 30 $B/S/mxmoe bench --tokens 128,256 --iterations 10 --precision fp8 \
      --json $OUT/${v}_f8_1.json > $OUT/$v.log 2>&1
  done
  python3 bench/compare_runs.py $OUT --variants small0,small1 --pattern '{v}_f8_1.json' 2>&1 | tee -a $S
fi
cat $S
tar czf /tmp/all.tgz -C $OUT . 2>/dev/null; find $OUT -type f ! -name 00summary.txt -delete; mv /tmp/all.tgz $OUT/
