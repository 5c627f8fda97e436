#!/bin/bash
# Session 46 device round, one call: a = main (0c658a8: session 45's kernels and the
# session's tidies) and b = a + the FP8 GEMM1's drain re-expressing the intermediate
# (branch s46-drain), unpacked from ab.tar.xz: a/mxmoe; b/mxmoe, b/test_engine,
# b/test_layer_args. Run from the repository root. Logs in $OUT/l.tgz, packed after every
# step; steps past their time guard are skipped and say so.
R=$PWD; cd "$(dirname "$0")"; tar xf ab.tar.xz; L=$OUT/l; mkdir -p $L; S=$OUT/summary.txt; T0=$SECONDS
summ() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))['cases']
print(' '.join('%d:%.1fus/%.2fxfloor/%.2fxtorch/%.1f%%' % (c['tokens'],c['median_us'],c['median_us']/max(c['hbm_floor_us'],c['mma_floor_us']),(c.get('torch_us') or 0)/c['median_us'],100*c['tflops']/c['mma_tflops_ceiling']) for c in d if c['mode']=='graph'))" $1 2>&1 | tail -1; }
line() { grep -E "$1" "$2" | tr '\n' ' '; }
pack() { echo "  [$((SECONDS - T0)) s]" >> $S; tar czf $OUT/l.tgz -C $OUT l; }
left() { [ $((SECONDS - T0)) -lt $1 ] || { echo "skipped past $1 s: $2" >> $S; return 1; }; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader >> $S
timeout 150 b/test_engine > $L/te_b.txt 2>&1; echo "b test_engine rc=$? $(line '^\[  (PASSED|FAILED)' $L/te_b.txt)" >> $S
grep -E "drain re-expression|FAILED  \]" $L/te_b.txt | head -12 >> $S
timeout 40 b/test_layer_args > $L/args_b.txt 2>&1; echo "b test_layer_args rc=$? $(line '^\[  (PASSED|FAILED)' $L/args_b.txt)" >> $S; pack
timeout 70 b/mxmoe validate --suite all --backend cuda --precision fp8 --json $L/val_f8_b.json > $L/val_f8_b.txt 2>&1; echo "b validate fp8 rc=$? $(tail -1 $L/val_f8_b.txt)" >> $S; pack
timeout 60 python3 $R/bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $L/T.json > $L/T.txt 2>&1; echo "torch rc=$?" >> $S; pack
for r in 1 2; do for v in a b; do left 330 "fp8 $v r$r" || continue
  timeout 40 $v/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision fp8 --baseline $L/T.json --json $L/${v}_f8_$r.json > $L/${v}_f8_$r.txt 2>&1; echo "$v fp8 r$r rc=$? $(summ $L/${v}_f8_$r.json)" >> $S; pack
done; done
left 380 "exact" && { timeout 40 b/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision exact --baseline $L/T.json --json $L/b_ex.json > $L/b_ex.txt 2>&1; echo "b exact rc=$? $(summ $L/b_ex.json)" >> $S; pack; }
left 430 "decode" && { timeout 45 python3 $R/bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.txt 2>&1; timeout 40 b/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json --json $L/b_dec.json > $L/b_dec.txt 2>&1; echo "b decode rc=$? $(summ $L/b_dec.json)" >> $S; pack; }
left 500 "memcheck" && { timeout 80 compute-sanitizer --tool memcheck b/test_engine --gtest_filter='Fp8Mode.Drain*:Fp8Mode.Tails*' > $L/mc_b.txt 2>&1; echo "b memcheck rc=$? $(line 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $L/mc_b.txt)" >> $S; pack; }
echo "elapsed $((SECONDS - T0)) s" >> $S
cat $S
