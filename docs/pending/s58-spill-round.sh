#!/usr/bin/env bash
# Session 58: docs/pending/s58-decode-spills.patch (s57-onerow-brow.patch and the rest:
# GEMM2's decode kernels keep no value in local memory; ptxas: 0 bytes spilled in all 15
# of gemm2.cu's kernels, main 6 / 10 / 18) beside main. o = main 4e48197's mxmoe; s = the
# same tree + the patch (mxmoe_cli, test_engine). Pack:
#   tar cf - s/mxmoe s/test_engine | xz -9e > .gpubin/s58b/bins.tar.xz (o: .gpubin/s57g2's)
#   cp docs/pending/s58-spill-round.sh docs/pending/round_lib.sh .gpubin/s58b/; a BUILT file
# then: bash .gpubin/s58b/s58-spill-round.sh with carry [".gpubin/s57g2", ".gpubin/s58b"] (~300 s).
# Prediction: decode within noise (-1..+1%): the spill loads sat at block start, between
# tiles and in the epilogue (one per cycle in the one-row kernel's loop, an L1 hit); the
# mainloops' instruction counts are within +-3% of main's.
set -u
B=/tmp/b58b; mkdir -p $B && tar xJf .gpubin/s58b/bins.tar.xz -C $B && tar xJf .gpubin/s57g2/bins.tar.xz -C $B o/mxmoe; o=$B/o; s=$B/s
. "$(dirname "$0")/round_lib.sh"
cat .gpubin/s58b/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
timeout 200 $s/test_engine --gtest_brief=1 --gtest_filter='-Fp8Mode.*:Permute.*:Routing.*' > $L/s_tests.log 2>&1
note "s test_engine rc=$? $(passed $L/s_tests.log) $(el)"; grep -E "FAILED|Failure" $L/s_tests.log | head -5 | tee -a $S
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $s/test_engine --gtest_brief=1 \
  --gtest_filter='Gemm2.Decode*:Gemm2.OneRow*:DecodeKernels.*' > $L/s_memcheck.log 2>&1
note "s memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/s_memcheck.log | tr '\n' ' ') $(passed $L/s_memcheck.log) $(el)"
timeout 50 python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
note "torch decode rc=$? $(el)"
dec() { timeout 40 $2/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json \
    --json $L/${1}_dec_$3.json > $L/${1}_dec_$3.log 2>&1; note "decode $1 r$3 rc=$? $(summ $L/${1}_dec_$3.json) $(el)"; }
left 330 "decode round 1" && { dec o $o 1; dec s $s 1; }
left 370 "decode round 2" && { dec s $s 2; dec o $o 2; }
left 410 "decode round 3" && { dec o $o 3; dec s $s 3; }
left 450 "s smoke" && { timeout 35 $s/mxmoe validate --suite smoke --backend cuda > $L/s_smoke.log 2>&1
  note "s smoke rc=$? $(grep -E 'passed' $L/s_smoke.log | tail -1) $(el)"; }
python3 bench/compare_runs.py $L --variants o,s --rounds 1,2,3 --pattern '{v}_dec_{r}.json' 2>&1 | tee -a $S
cat $S
pack_logs
