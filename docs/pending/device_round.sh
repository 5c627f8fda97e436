#!/bin/bash
# The device round for docs/pending (README.md there), written in session 40: a = main,
# b = + 0001 (the segmented permutation), c = b + 0002 (the FP8 staging's batched loads),
# unpacked from bin.tar.xz next to this script (c also holds the test binaries). c's GPU
# tests and memcheck, the PyTorch baseline, two alternating rounds of benches.
# Logs under $OUT/l; the summary in $OUT/summary.txt (print it last).
R=$PWD; cd "$(dirname "$0")"; tar xf bin.tar.xz; L=$OUT/l; mkdir -p $L; S=$OUT/summary.txt; T0=$SECONDS
nvidia-smi -q -d POWER,CLOCK,PERFORMANCE > $L/smi_q.txt 2>&1; echo "$(grep -E "Current Power Limit|Max Power Limit|Default Power Limit" $L/smi_q.txt | head -3 | tr -s ' ' | tr '\n' ';')" >> $S
summ() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))['cases']
print(' '.join('%d:%.1f'%(c['tokens'],c['median_us']) for c in d if c['mode']=='graph'))" $1; }
timeout 80 c/test_engine --gtest_filter=-Gemm1Act.* > $L/te.txt 2>&1; echo "c test_engine (-Gemm1Act.*) rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/te.txt | tr '\n' ' ')" >> $S
timeout 60 c/test_suite_cuda > $L/suite.txt 2>&1; echo "c test_suite_cuda rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/suite.txt | tr '\n' ' ')" >> $S
timeout 30 c/test_error_flags > $L/flags.txt 2>&1; echo "c test_error_flags rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/flags.txt | tr '\n' ' ')" >> $S
timeout 60 compute-sanitizer --tool memcheck c/test_engine --gtest_filter='Permute.*:Fp8Mode.Stage*:Fp8Mode.Tails*:Layer.OutOfRange*' > $L/mc.txt 2>&1; echo "c memcheck rc=$? $(grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $L/mc.txt | tr '\n' ' ')" >> $S
echo "tests done $((SECONDS - T0)) s" >> $S
timeout 120 python3 $R/bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 20 --json $L/T.json > $L/T.txt 2>&1; echo "torch rc=$? $(cat $L/T.json | head -c 200)" >> $S
echo "torch done $((SECONDS - T0)) s" >> $S
for r in 1 2; do
  for b in a b c; do timeout 60 $b/mxmoe bench --tokens 512,1024,4096 --iterations 10 --precision fp8 --baseline $L/T.json --json $L/${b}_f8_$r.json > $L/${b}_f8_$r.txt 2>&1; echo "$b fp8 r$r rc=$? $(summ $L/${b}_f8_$r.json)" >> $S; done
  for b in a b; do timeout 60 $b/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision exact --baseline $L/T.json --json $L/${b}_ex_$r.json > $L/${b}_ex_$r.txt 2>&1; echo "$b exact r$r rc=$? $(summ $L/${b}_ex_$r.json)" >> $S; done
done
echo "elapsed $((SECONDS - T0)) s" >> $S
