#!/usr/bin/env bash
# The FP8 GEMMs' tile-boundary prefetch (the next tile's first group goes out before
# this tile's epilogue), second form. g = main + docs/pending/s57-gemm2-boundary-v2.patch
# (GEMM2: session 56's patch, the last tile through a break, f8_store_y without
# per-thread branches: predicated stores, bias and row scales four column pairs ahead);
# h = main + s57-gemm12-boundary.patch (the same, and GEMM1 too: the drain's wait before
# the group goes out). Both group loops are back on the uniform datapath (SASS: GEMM2
# 107 / 187 instructions a group against main's 109 / 191, GEMM1 107 / 189 against
# 110 / 192; session 56's GEMM2 form, 139 / 220, ran 5.7-7.7% slower). Pack from main:
#   o: main's mxmoe; g, h: worktrees of main + each patch (mxmoe_cli, test_engine);
#   tar cf - o/mxmoe g/mxmoe h/mxmoe g/test_engine h/test_engine | xz -9e > .gpubin/s57g2/bins.tar.xz
#   cp docs/pending/s57-g2-round.sh docs/pending/round_lib.sh .gpubin/s57g2/; a BUILT file
# then: bash .gpubin/s57g2/s57-g2-round.sh with carry [".gpubin/s57g2"] (~450 s).
# Prediction: g: GEMM2 -0..-3.5%, the FP8 layer -0..-1% at M >= 1024 (session 56); h: a
# further -0..-1% (GEMM1's epilogue only stages to shared memory: a shorter bubble).
set -u
B=/tmp/b57g2; mkdir -p $B && tar xJf .gpubin/s57g2/bins.tar.xz -C $B; o=$B/o; g=$B/g; h=$B/h
. "$(dirname "$0")/round_lib.sh"
cat .gpubin/s57g2/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
timeout 100 $g/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*:Layer.*' > $L/g_tests.log 2>&1
note "g test_engine rc=$? $(passed $L/g_tests.log) $(el)"; grep -E "FAILED|Failure" $L/g_tests.log | head -5 | tee -a $S
timeout 100 $h/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*:Layer.*' > $L/h_tests.log 2>&1
note "h test_engine rc=$? $(passed $L/h_tests.log) $(el)"; grep -E "FAILED|Failure" $L/h_tests.log | head -5 | tee -a $S
for v in g h; do
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/$v/test_engine --gtest_brief=1 \
    --gtest_filter='Fp8Mode.TailsPadding*:Fp8Mode.RowFormBitIdentical*' > $L/${v}_memcheck.log 2>&1
  note "$v memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/${v}_memcheck.log | tr '\n' ' ') $(passed $L/${v}_memcheck.log) $(el)"
done
torch_prefill
left 330 "fp8 round 1" && { f8 o $o 1; f8 g $g 1; f8 h $h 1; }
left 360 "fp8 round 2" && { f8 h $h 2; f8 g $g 2; f8 o $o 2; }
left 390 "fp8 round 3" && { f8 o $o 3; f8 g $g 3; f8 h $h 3; }
for v in g h; do
  left 450 "$v smoke fp8" && { timeout 35 $B/$v/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/${v}_smoke_fp8.log 2>&1
    note "$v smoke fp8 rc=$? $(grep -E 'passed' $L/${v}_smoke_fp8.log | tail -1) $(el)"; }
done
for v in g h; do
  python3 bench/compare_runs.py $L --variants o,$v --rounds 1,2,3 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
done
cat $S
pack_logs
