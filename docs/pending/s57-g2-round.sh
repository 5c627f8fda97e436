#!/usr/bin/env bash
# GEMM2's tile-boundary prefetch, second form (docs/pending/s57-gemm2-boundary-v2.patch:
# session 56's patch, the last tile through a break, and f8_store_y without per-thread
# branches: predicated stores, bias and row scales four column pairs ahead). Its group
# loop is back on the uniform datapath (SASS: 107 / 187 instructions a group against
# main's 109 / 191; session 56's form 139 / 220 ran 5.7-7.7% slower). Pack from main:
#   o: main's mxmoe; g: a worktree of main + the patch (mxmoe_cli, test_engine);
#   tar cf - o/mxmoe g/mxmoe g/test_engine | xz -9e > .gpubin/s57g2/bins.tar.xz
#   cp docs/pending/s57-g2-round.sh docs/pending/round_lib.sh .gpubin/s57g2/; a BUILT file
# then: bash .gpubin/s57g2/s57-g2-round.sh with carry [".gpubin/s57g2"] (~330 s).
# Prediction (session 56): GEMM2 -0..-3.5%, the FP8 layer -0..-1% at M >= 1024.
set -u
B=/tmp/b57g2; mkdir -p $B && tar xJf .gpubin/s57g2/bins.tar.xz -C $B; o=$B/o; g=$B/g
. "$(dirname "$0")/round_lib.sh"
cat .gpubin/s57g2/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
timeout 100 $g/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*:Layer.*' > $L/g_tests.log 2>&1
note "g test_engine rc=$? $(passed $L/g_tests.log) $(el)"; grep -E "FAILED|Failure" $L/g_tests.log | head -5 | tee -a $S
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $g/test_engine --gtest_brief=1 \
  --gtest_filter='Fp8Mode.TailsPadding*:Fp8Mode.RowFormBitIdentical*' > $L/g_memcheck.log 2>&1
note "g memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/g_memcheck.log | tr '\n' ' ') $(passed $L/g_memcheck.log) $(el)"
timeout 80 python3 bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $L/T.json > $L/T.log 2>&1
note "torch prefill rc=$? $(el)"
f8() { timeout 45 $2/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision fp8 --baseline $L/T.json \
    --json $L/${1}_f8_$3.json > $L/${1}_f8_$3.log 2>&1; note "fp8 $1 r$3 rc=$? $(summ $L/${1}_f8_$3.json) $(el)"; }
left 250 "fp8 round 1" && { f8 o $o 1; f8 g $g 1; }
left 270 "fp8 round 2" && { f8 g $g 2; f8 o $o 2; }
left 290 "fp8 round 3" && { f8 o $o 3; f8 g $g 3; }
left 300 "smoke fp8" && { timeout 35 $g/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/smoke_fp8.log 2>&1
  note "g smoke fp8 rc=$? $(grep -E 'passed' $L/smoke_fp8.log | tail -1) $(el)"; }
python3 bench/compare_runs.py $L --variants o,g --rounds 1,2,3 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
cat $S
pack_logs
