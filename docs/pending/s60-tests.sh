#!/usr/bin/env bash
# Session 60, round 2: b's test_engine (the narrow tiles and the token tiles innermost):
# the new test, every FP8 test and the 80-expert walk, memcheck, racecheck and synccheck on
# the new test and the tails, then the rest of test_engine with what is left. Pack:
#   tar cf - b/test_engine | xz -T2 -6 > .gpubin/s60t/bins.tar.xz
# run: bash .gpubin/s60t/s60-tests.sh with carry [".gpubin/s60t"] (~250 s).
set -u
B=/tmp/b60t; mkdir -p $B && tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
gtests b $B/b 'Fp8Mode.*:Layer.PrefillPastThirtyTwoLocalExpertsMatchesReference' 150
memcheck b $B/b 'Fp8Mode.NarrowTiles*:Fp8Mode.Tails*'
for tool in racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $B/b/test_engine --gtest_brief=1 \
    --gtest_filter='Fp8Mode.NarrowTiles*' > $L/b_$tool.log 2>&1
  note "b $tool rc=$? $(grep -E 'SUMMARY' $L/b_$tool.log | tr '\n' ' ') $(passed $L/b_$tool.log) $(el)"
done
left 420 "the rest of test_engine" && { timeout $(( 560 - $(date +%s) + t0 )) $B/b/test_engine --gtest_brief=1 \
  --gtest_filter='-Fp8Mode.*:Layer.PrefillPastThirtyTwoLocalExpertsMatchesReference' > $L/b_rest.log 2>&1
  note "b test_engine rest rc=$? $(passed $L/b_rest.log) $(el)"; grep -E "FAILED|Failure" $L/b_rest.log | head -5 | tee -a $S; }
pack_logs
