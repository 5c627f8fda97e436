#!/usr/bin/env bash
# Session 50's second round, for landing s50-gather.patch once s50-round.sh says it wins:
# the landing commit's whole test_engine (the device E4M3 sweep aside: it checks every float
# and touches no kernel of the patch), its layer-argument tests, the smoke validation in
# both precisions, racecheck on the FP8 layer's tests (the gather's new barrier count),
# and the FP8 bench beside main's staging (MXMOE_F8_GATHER=0) once more. Run from the
# repository root with L's binaries in .gpubin/s50b/bins.tar.xz (L/mxmoe, L/test_engine,
# L/test_layer_args; built from main after `git am docs/pending/s50-gather.patch`).
set -u
B=/tmp/b; mkdir -p $B && tar xJf .gpubin/s50b/bins.tar.xz -C $B
S=$OUT/summary.txt
t0=$(date +%s)
note() { echo "$*" >> $S; }
left() { [ $(( $(date +%s) - t0 )) -lt $1 ] || { note "skipped past $1 s: $2"; return 1; }; }
passed() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader >> $S
timeout 240 $B/L/test_engine --gtest_brief=1 --gtest_filter='-Formats.DeviceE4m3*' > $OUT/te.log 2>&1
note "L test_engine (-Formats.DeviceE4m3*): rc=$? $(passed $OUT/te.log) ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|Failure" $OUT/te.log | head -8 >> $S
timeout 60 $B/L/test_layer_args --gtest_brief=1 > $OUT/args.log 2>&1
note "L test_layer_args: rc=$? $(passed $OUT/args.log)"
for pr in exact fp8; do
  timeout 60 $B/L/mxmoe validate --suite smoke --backend cuda --precision $pr > $OUT/smoke_$pr.log 2>&1
  note "L smoke $pr rc=$? $(grep -E 'passed' $OUT/smoke_$pr.log | tail -1)"
done
left 420 "racecheck" && { timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $B/L/test_engine --gtest_brief=1 \
  --gtest_filter='Fp8Mode.Fused*:Fp8Mode.Tails*' > $OUT/race.log 2>&1
  note "L racecheck rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/race.log | tr '\n' ' ') $(passed $OUT/race.log)"; }
if left 520 "bench"; then
  timeout 40 python3 bench/torch_baseline.py --tokens 1024,4096 --iterations 10 --json $OUT/torch.json > $OUT/torch.log 2>&1
  for v in L0 L; do
    g=1; [ $v = L0 ] && g=0
    MXMOE_F8_GATHER=$g timeout 40 $B/L/mxmoe bench --tokens 1024,4096 --iterations 10 --precision fp8 \
      --baseline $OUT/torch.json --json $OUT/${v}_f8_1.json > $OUT/${v}_f8_1.log 2>&1
    note "bench $v rc=$?"
  done
  python3 bench/compare_runs.py $OUT --variants L0,L --pattern '{v}_f8_1.json' >> $S 2>&1
fi
cat $S
cd $OUT && tar czf all.tgz --exclude=all.tgz . && find . -type f ! -name all.tgz ! -name summary.txt -delete
