#!/usr/bin/env bash
# Session 57's round: s56-round.sh's steps (m = main + s55-seg-by-expert + s56-per-device-
# cache + s57-knob-helper, o = main) plus g = main + s56-gemm2-boundary (GEMM2 issues the next tile's first
# FP8 group before its epilogue). Build and pack first, from a clean main:
#   m: main + git apply docs/pending/s55-seg-by-expert.patch docs/pending/s56-per-device-cache.patch
#      docs/pending/s57-knob-helper.patch, built (mxmoe_cli test_engine test_layer_args);
#   o: main's mxmoe; g: a worktree of main + s56-gemm2-boundary.patch (mxmoe_cli test_engine);
#   stripped, packed as one solid archive, similar binaries side by side (27.6 MB where
#   separate archives took 47 MB for four of the six; the carry holds 64 MiB):
#      tar cf - m/mxmoe o/mxmoe g/mxmoe m/test_engine g/test_engine m/test_layer_args | xz -9e > .gpubin/s57/bins.tar.xz
#   cp docs/pending/s57-round.sh docs/pending/round_lib.sh .gpubin/s57/; a BUILT file beside them
# then: bash .gpubin/s57/s57-round.sh with carry [".gpubin/s57"].
# Order: what landing needs first (both branches' GPU tests, sanitizers, FP8 timing o/m/g
# alternating), then the permutation under ncu, the validation suites, and on an H200
# main's figures for the issues. Guards fit ~540 s.
set -u
B=/tmp/b; mkdir -p $B && tar xJf .gpubin/s57/bins.tar.xz -C $B
m=$B/m; o=$B/o; g=$B/g
. "$(dirname "$0")/round_lib.sh"
cat .gpubin/s57/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
h200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
timeout 150 $m/test_engine --gtest_brief=1 --gtest_filter='Permute.*:Layer.*:Prefill.*:Fp8Mode.*' > $L/tests.log 2>&1
note "m test_engine rc=$? $(passed $L/tests.log) $(el)"; grep -E "FAILED|Failure" $L/tests.log | head -5 | tee -a $S
timeout 90 $g/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*:Layer.*' > $L/g_tests.log 2>&1
note "g test_engine rc=$? $(passed $L/g_tests.log) $(el)"; grep -E "FAILED|Failure" $L/g_tests.log | head -5 | tee -a $S
timeout 30 $m/test_layer_args --gtest_brief=1 > $L/args.log 2>&1; note "test_layer_args rc=$? $(passed $L/args.log)"
for tool in memcheck racecheck; do
  timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 $m/test_engine --gtest_brief=1 \
    --gtest_filter='Permute.*:Layer.PermutationGrid*' > $L/$tool.log 2>&1
  note "m $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ') $(passed $L/$tool.log) $(el)"
done
left 240 "m Gemm1Act" && { timeout 70 $m/test_engine --gtest_brief=1 --gtest_filter='Gemm1Act.*' > $L/g1_tests.log 2>&1
  note "m test_engine Gemm1Act.* (the knobs MXMOE_PREFILL_CTAS / TOKEN_TILE / DECODE_BLOCKS / READY) rc=$? $(passed $L/g1_tests.log) $(el)"; }
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $g/test_engine --gtest_brief=1 \
  --gtest_filter='Fp8Mode.TailsPadding*:Fp8Mode.RowFormBitIdentical*' > $L/g_memcheck.log 2>&1
note "g memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/g_memcheck.log | tr '\n' ' ') $(passed $L/g_memcheck.log) $(el)"
timeout 80 python3 bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $L/T.json > $L/T.log 2>&1
note "torch prefill rc=$? $(el)"
f8() { timeout 45 $2/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision fp8 --baseline $L/T.json \
    --json $L/${1}_f8_$3.json > $L/${1}_f8_$3.log 2>&1; note "fp8 $1 r$3 rc=$? $(summ $L/${1}_f8_$3.json) $(el)"; }
left 330 "fp8 round 1" && { f8 o $o 1; f8 m $m 1; f8 g $g 1; }
left 380 "fp8 round 2" && { f8 g $g 2; f8 m $m 2; f8 o $o 2; }
perm() {  # perm NAME BIN M [ENV=VALUE]: the permutation's kernels of 4 forwards under ncu
  left 480 "ncu $1 M=$3" || return 1
  env ${4:-X=} timeout 40 ncu --clock-control none --kernel-name regex:permute --launch-count 4 --metrics gpu__time_duration.sum \
    --csv $2/mxmoe bench --tokens $3 --iterations 1 --precision fp8 > $L/ncu_$1_$3.csv 2>&1
  note "permute $1 M=$3 ${4:-}: $(grep -E '^"' $L/ncu_$1_$3.csv | grep -v Metric | awk -F'","' '{print $5 ":" $NF}' | tr -d '"' | sed 's/void unnamed>:://; s/(.*)//' | tr '\n' ' ')ns $(el)"
}
for M in 4096 16384; do perm o $o $M; perm m $m $M; done
perm m256 $m 16384 MXMOE_PERMUTE_MAX_BLOCKS=256
left 470 "validate all" && { timeout 60 $m/mxmoe validate --suite all --backend cuda > $L/all_exact.log 2>&1
  note "validate all exact rc=$? $(grep -E 'passed' $L/all_exact.log | tail -1) $(el)"; }
left 500 "smoke fp8" && { timeout 35 $g/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/smoke_fp8.log 2>&1
  note "g smoke fp8 rc=$? $(grep -E 'passed' $L/smoke_fp8.log | tail -1) $(el)"; }
# main's figures for the issues: on an H200 only (the floors and peaks are the H200's)
if [ "$h200" = 1 ]; then
  left 495 exact && { timeout 40 $o/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision exact --baseline $L/T.json \
    --json $L/o_ex.json > $L/o_ex.log 2>&1; note "exact o rc=$? $(summ $L/o_ex.json) $(el)"; }
  left 525 decode && { timeout 40 python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
    timeout 25 $o/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json --json $L/o_dec.json > $L/o_dec.log 2>&1
    note "decode o rc=$? $(summ $L/o_dec.json) $(el)"; }
fi
python3 bench/compare_runs.py $L --variants o,m --rounds 1,2 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
python3 bench/compare_runs.py $L --variants o,g --rounds 1,2 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
cat $S
pack_logs
