#!/usr/bin/env bash
# Session 58: s57-g2-round.sh and s58-spill-round.sh in one call (machine starts were
# scarce: each try cost 90 s of device time). Carry [".gpubin/s57g2", ".gpubin/s58b"];
# run: bash .gpubin/s58b/s58-combined-round.sh (~480 s; the left() guards drop the
# smoke runs first).
#   o: main 4e48197 (.gpubin/s57g2's o and .gpubin/s58b's o: the same build)
#   g / h: main + s57-gemm2-boundary-v2.patch / s57-gemm12-boundary.patch (FP8 GEMMs)
#   s: main + s58-decode-spills.patch (decode kernels: no local memory; its test
#      DecodeKernels.KeepNothingInLocalMemory)
# Predictions: g FP8 layer -0..-1% at M >= 1024, h a further -0..-1%; s decode within
# noise (-1..+1%).
set -u
B=/tmp/b58c; mkdir -p $B && tar xJf .gpubin/s57g2/bins.tar.xz -C $B && tar xJf .gpubin/s58b/bins.tar.xz -C $B
o=$B/o; g=$B/g; h=$B/h; s=$B/s
. "$(dirname "$0")/round_lib.sh"
cat .gpubin/s57g2/BUILT .gpubin/s58b/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
timeout 90 $s/test_engine --gtest_brief=1 --gtest_filter='DecodeKernels.*:Gemm2.*:Layer.*:Balanced.*' > $L/s_tests.log 2>&1
note "s test_engine rc=$? $(passed $L/s_tests.log) $(el)"; grep -E "FAILED|Failure|Expected|Which is" $L/s_tests.log | head -6 | tee -a $S
for v in g h; do
  timeout 70 $B/$v/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*:Layer.*' > $L/${v}_tests.log 2>&1
  note "$v test_engine rc=$? $(passed $L/${v}_tests.log) $(el)"; grep -E "FAILED|Failure" $L/${v}_tests.log | head -5 | tee -a $S
done
timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $s/test_engine --gtest_brief=1 \
  --gtest_filter='Gemm2.Decode*:DecodeKernels.*' > $L/s_memcheck.log 2>&1
note "s memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/s_memcheck.log | tr '\n' ' ') $(passed $L/s_memcheck.log) $(el)"
for v in g h; do
  timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $B/$v/test_engine --gtest_brief=1 \
    --gtest_filter='Fp8Mode.TailsPadding*:Fp8Mode.RowFormBitIdentical*' > $L/${v}_memcheck.log 2>&1
  note "$v memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/${v}_memcheck.log | tr '\n' ' ') $(passed $L/${v}_memcheck.log) $(el)"
done
torch_prefill
timeout 50 python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
note "torch decode rc=$? $(el)"
dec() { timeout 40 $2/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json \
    --json $L/${1}_dec_$3.json > $L/${1}_dec_$3.log 2>&1; note "decode $1 r$3 rc=$? $(summ $L/${1}_dec_$3.json) $(el)"; }
left 330 "round 1" && { f8 o $o 1; f8 g $g 1; f8 h $h 1; dec o $o 1; dec s $s 1; }
left 390 "round 2" && { f8 h $h 2; f8 g $g 2; f8 o $o 2; dec s $s 2; dec o $o 2; }
left 450 "round 3" && { f8 o $o 3; f8 g $g 3; f8 h $h 3; dec o $o 3; dec s $s 3; }
left 490 "s smoke" && { timeout 35 $s/mxmoe validate --suite smoke --backend cuda > $L/s_smoke.log 2>&1
  note "s smoke rc=$? $(grep -E 'passed' $L/s_smoke.log | tail -1) $(el)"; }
for v in g h; do
  python3 bench/compare_runs.py $L --variants o,$v --rounds 1,2,3 --pattern '{v}_f8_{r}.json' 2>&1 | tee -a $S
done
python3 bench/compare_runs.py $L --variants o,s --rounds 1,2,3 --pattern '{v}_dec_{r}.json' 2>&1 | tee -a $S
cat $S
pack_logs
