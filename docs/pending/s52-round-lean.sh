#!/usr/bin/env bash
# Session 52's lean form of session 51's round (less device time left: the exact smoke,
# ncu at 4096 out; every guard earlier).
# Session 51's prepared round (packed by s51-build.sh into .gpubin/s51a with the binary).
# Run from the repository root. One binary, S = main + s51-scatter.patch: variants G
# (MXMOE_F8_SCATTER=0: x gathered into routed-row order, main's staging) and S (the
# default: scattered by token from 512 tokens on). Notes go to stdout as well, so a cut
# call still reports; 00summary.txt sorts first among what comes back.
set -u
B=/tmp/b; mkdir -p $B && tar xJf .gpubin/s51a/bins.tar.xz -C $B
S=$OUT/00summary.txt; t0=$(date +%s)
note() { echo "$*" | tee -a $S; }
# A step starts only while the round has time left for it (the call's limit is 600 s).
left() { [ $(( $(date +%s) - t0 )) -lt $1 ] || { note "skipped past $1 s: $2"; return 1; }; }
passed() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader | tee -a $S
timeout 120 $B/S/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*:Layer.PrefillPast*' > $OUT/tests.log 2>&1
note "S Fp8Mode.*+Layer.PrefillPast*: rc=$? $(passed $OUT/tests.log) ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|Failure" $OUT/tests.log | head -5 | tee -a $S
timeout 90 python3 bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $OUT/torch.json > $OUT/torch.log 2>&1
note "torch rc=$?"
for r in 1 2; do
  [ $r = 2 ] && { left 200 "bench round 2" || break; }
  for v in G S; do
    g=""; [ $v = G ] && g="MXMOE_F8_SCATTER=0"
    env $g timeout 60 $B/S/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision fp8 \
      --baseline $OUT/torch.json --json $OUT/${v}_f8_$r.json > $OUT/${v}_f8_$r.log 2>&1
    note "bench $v round $r rc=$? ($(( $(date +%s) - t0 )) s)"
  done
done
r2=1,2; [ -f $OUT/S_f8_2.json ] || r2=1
python3 bench/compare_runs.py $OUT --variants G,S --rounds $r2 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
# The threshold (heuristics.h use_scattered_x_staging: 512): both forms forced at 128 and 256.
if left 290 "forced small M"; then
  for v in small0 small1; do  # MXMOE_F8_SCATTER=0 (gathered), =1 (scattered)
    MXMOE_F8_SCATTER=${v#small} timeout 40 $B/S/mxmoe bench --tokens 128,256 --iterations 10 --precision fp8 \
      --json $OUT/${v}_f8_1.json > $OUT/$v.log 2>&1
  done
  python3 bench/compare_runs.py $OUT --variants small0,small1 --pattern '{v}_f8_1.json' 2>&1 | tee -a $S
  note "bench forced 128,256 ($(( $(date +%s) - t0 )) s)"
fi
for pr in fp8; do
  timeout 60 $B/S/mxmoe validate --suite smoke --backend cuda --precision $pr > $OUT/smoke_$pr.log 2>&1
  note "S smoke $pr rc=$? $(grep -E 'passed' $OUT/smoke_$pr.log | tail -1)"
done
timeout 40 $B/S/test_layer_args --gtest_brief=1 > $OUT/args.log 2>&1
note "S test_layer_args rc=$? $(passed $OUT/args.log)"
left 310 memcheck && { timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $B/S/test_engine --gtest_brief=1 \
  --gtest_filter='Fp8Mode.Stage*:Fp8Mode.Fused*' > $OUT/memcheck.log 2>&1
  note "S memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log | tr '\n' ' ') $(passed $OUT/memcheck.log) ($(( $(date +%s) - t0 )) s)"; }
for vm in G:1024 S:1024; do
  v=${vm%:*}; m=${vm#*:}; g=""; [ $v = G ] && g="MXMOE_F8_SCATTER=0"
  left 400 "ncu $v $m" || continue
  env $g timeout 30 ncu --clock-control none --kernel-name regex:stage_fp8 --launch-count 2 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv $B/S/mxmoe bench --tokens $m --iterations 1 --precision fp8 > $OUT/ncu_${v}_$m.csv 2>&1
  note "ncu $v $m rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E '^"' $OUT/ncu_${v}_$m.csv | grep stage_fp8 | awk -F'","' '{print $(NF-2), $NF}' | tr -d '"' | tee -a $S
done
cat $S
tar czf /tmp/all.tgz -C $OUT . 2>/dev/null; find $OUT -type f ! -name 00summary.txt -delete; mv /tmp/all.tgz $OUT/
