#!/usr/bin/env bash
# Session 56's round (one device call; prepared, not run: no machine came). Build and
# pack first, from a clean main:
#   git apply docs/pending/s55-seg-by-expert.patch docs/pending/s56-per-device-cache.patch
#   bash docs/pending/s55-build.sh
#   cp docs/pending/s56-round.sh .gpubin/s55a/round.sh; cp docs/pending/round_lib.sh .gpubin/s55a/
# then: bash .gpubin/s55a/round.sh with carry [".gpubin/s55a"].
# m = main + the patches (the grid's counts as [expert][block], read coalesced; the knob
# MXMOE_PERMUTE_MAX_BLOCKS; one per-device cache helper for two host queries), o = main.
# 1) m's GPU tests (among them session 55's untested cases at 16384 and 16385 tokens) and
# sanitizers; 2) the permutation under ncu, o against m, to 16384 tokens and past 64
# blocks (knob); 3) validation suites on m; 4) the FP8 layer, o and m alternating, and on
# an H200 main's figures for the issues (FP8, exact, decode beside the PyTorch baseline of
# this run). Notes go to stdout as well; 00summary.txt sorts first. Guards fit ~500 s.
set -u
B=/tmp/b; mkdir -p $B && tar xJf .gpubin/s55a/bins.tar.xz -C $B; m=$B/m; o=$B/o
. "$(dirname "$0")/round_lib.sh"
cat .gpubin/s55a/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
timeout 150 $m/test_engine --gtest_brief=1 --gtest_filter='Permute.*:Layer.*:Prefill.*:Fp8Mode.*' > $L/tests.log 2>&1
note "test_engine rc=$? $(passed $L/tests.log) $(el)"; grep -E "FAILED|Failure" $L/tests.log | head -5 | tee -a $S
timeout 30 $m/test_layer_args --gtest_brief=1 > $L/args.log 2>&1; note "test_layer_args rc=$? $(passed $L/args.log)"
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $m/test_engine --gtest_brief=1 \
    --gtest_filter='Permute.*:Layer.PermutationGrid*' > $L/$tool.log 2>&1
  note "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tr '\n' ' ') $(passed $L/$tool.log) $(el)"
done
perm() {  # perm NAME BIN M [ENV=VALUE]: the permutation's kernels of 4 forwards under ncu
  left 300 "ncu $1 M=$3" || return 1
  env ${4:-X=} timeout 40 ncu --clock-control none --kernel-name regex:permute --launch-count 4 --metrics gpu__time_duration.sum \
    --csv $2/mxmoe bench --tokens $3 --iterations 1 --precision fp8 > $L/ncu_$1_$3.csv 2>&1
  note "permute $1 M=$3 ${4:-}: $(grep -E '^"' $L/ncu_$1_$3.csv | grep -v Metric | awk -F'","' '{print $5 ":" $NF}' | tr -d '"' | sed 's/void unnamed>:://; s/(.*)//' | tr '\n' ' ')ns $(el)"
}
perm m $m 1024
for M in 4096 16384 8192; do perm o $o $M; perm m $m $M; done
perm m256 $m 16384 MXMOE_PERMUTE_MAX_BLOCKS=256
perm m128 $m 8192 MXMOE_PERMUTE_MAX_BLOCKS=128
left 340 "validate all" && { timeout 60 $m/mxmoe validate --suite all --backend cuda > $L/all_exact.log 2>&1
  note "validate all exact rc=$? $(grep -E 'passed' $L/all_exact.log | tail -1) $(el)"; }
left 380 "smoke fp8" && { timeout 35 $m/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/smoke_fp8.log 2>&1
  note "smoke fp8 rc=$? $(grep -E 'passed' $L/smoke_fp8.log | tail -1) $(el)"; }
h200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
timeout 80 python3 bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $L/T.json > $L/T.log 2>&1
note "torch prefill rc=$? $(el)"
f8() { timeout 45 $2/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision fp8 --baseline $L/T.json \
    --json $L/${1}_f8_$3.json > $L/${1}_f8_$3.log 2>&1; note "fp8 $1 r$3 rc=$? $(summ $L/${1}_f8_$3.json) $(el)"; }
left 400 "fp8 round 1" && { f8 o $o 1; f8 m $m 1; }
# main's figures for the issues: on an H200 only (the floors and peaks are the H200's)
if [ "$h200" = 1 ]; then
  left 430 exact && { timeout 45 $o/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision exact --baseline $L/T.json \
    --json $L/o_ex.json > $L/o_ex.log 2>&1; note "exact o rc=$? $(summ $L/o_ex.json) $(el)"; }
  left 450 decode && { timeout 50 python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
    timeout 40 $o/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json --json $L/o_dec.json > $L/o_dec.log 2>&1
    note "decode o rc=$? $(summ $L/o_dec.json) $(el)"; }
  left 480 "fp8 round 2" && { f8 o $o 2; f8 m $m 2; }
fi
python3 bench/compare_runs.py $L --variants o,m --rounds 1,2 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
cat $S
pack_logs
