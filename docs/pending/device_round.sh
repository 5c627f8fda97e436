#!/bin/bash
# The device round for docs/pending (README.md there), rewritten in session 43, after its
# round found 0007's first form faulting: a = main, g = main + 0001-0006 + 0008-0010,
# h = g + 0007, unpacked from bin.tar.xz next to this script (g and h also hold test_engine
# and test_error_flags, g test_layer_args; tma_probe is docs/pending/tma_probe.cu built with
# nvcc: its last line says whether 0007's own boxes load, and load the right scales). Run
# from the repository root. At most 8 files come back from a call, so the logs go into
# $OUT/l<PART>.tgz, packed again after every step (a call cut short still returns them).
# PART=1 (~7 min): correctness. The TMA probe (does a box from an unaligned start fault?
#   do 0007's boxes load?); g's test_engine, test_error_flags and test_layer_args whole,
#   and the GPU-marked Python tests on g's package (py/, pytests/ in bin.tar.xz);
#   h's FP8 and layer tests (h differs from g only in the FP8 kernels' token scales) and
#   memcheck on them; validate --suite all,
#   exact on g and FP8 on h (or on g if h failed).
# PART=2 (~8 min): speed. The PyTorch baseline; two alternating rounds of benches (FP8:
#   a g h; exact: a g); the decode sizes M=1..32 (a, g); the smoke comparison of a and g.
R=$PWD; cd "$(dirname "$0")"; tar xf bin.tar.xz; L=$OUT/l; mkdir -p $L; S=$OUT/summary.txt; T0=$SECONDS
summ() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))['cases']
print(' '.join('%d:%.1f'%(c['tokens'],c['median_us']) for c in d if c['mode']=='graph'))" $1 2>/dev/null; }
line() { grep -E "$1" "$2" | tr '\n' ' '; }
pack() { echo "  [$((SECONDS - T0)) s]" >> $S; tar czf $OUT/l${PART:-1}.tgz -C $OUT l; }
if [ "${PART:-1}" = 1 ]; then
  [ -x tma_probe ] && { timeout 30 ./tma_probe > $L/probe.txt 2>&1; echo "tma_probe rc=$? $(tail -1 $L/probe.txt)" >> $S; pack; }
  g/mxmoe info > $L/info.txt 2>&1; echo "g info rc=$? $(grep -E '^\s+\[0\]' $L/info.txt)" >> $S
  timeout 200 g/test_engine > $L/te_g.txt 2>&1; echo "g test_engine rc=$? $(line '^\[  (PASSED|FAILED)' $L/te_g.txt)" >> $S
  timeout 30 g/test_error_flags > $L/flags_g.txt 2>&1; echo "g test_error_flags rc=$? $(line '^\[  (PASSED|FAILED)' $L/flags_g.txt)" >> $S
  timeout 60 g/test_layer_args > $L/args_g.txt 2>&1; echo "g test_layer_args rc=$? $(line '^\[  (PASSED|FAILED)' $L/args_g.txt)" >> $S; pack
  # g's Python package (built here for the device's Python 3.12, sm_90a) on g's python/tests,
  # copied over the device's copy of the tree (the tests find bench/ from their own path).
  if [ -d py ] && [ -d pytests ]; then
    cp -r pytests/. $R/python/tests/
    (P=$PWD/py; cd $R && PYTHONPATH=$P timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider python/tests) > $L/pytest_g.txt 2>&1
    echo "g pytest -m gpu rc=$? $(tail -1 $L/pytest_g.txt)" >> $S; pack
  fi
  timeout 90 h/test_engine --gtest_filter='Fp8Mode.*:Layer.*:Permute.*' > $L/te_h.txt 2>&1; HRC=$?; echo "h test_engine Fp8Mode/Layer/Permute rc=$HRC $(line '^\[  (PASSED|FAILED)' $L/te_h.txt)" >> $S; pack
  timeout 90 compute-sanitizer --tool memcheck h/test_engine --gtest_filter='Permute.*:Fp8Mode.Stage*:Fp8Mode.Tails*:Fp8Mode.LayerWithin*:Finalize.*' > $L/mc_h.txt 2>&1; echo "h memcheck rc=$? $(line 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $L/mc_h.txt)" >> $S; pack
  timeout 80 g/mxmoe validate --suite all --backend cuda > $L/val_ex_g.txt 2>&1; echo "g validate exact rc=$? $(tail -1 $L/val_ex_g.txt)" >> $S; pack
  V=h; [ "$HRC" = 0 ] || V=g
  timeout 120 $V/mxmoe validate --suite all --backend cuda --precision fp8 --json $L/val_f8_$V.json > $L/val_f8_$V.txt 2>&1; echo "$V validate fp8 rc=$? $(tail -1 $L/val_f8_$V.txt)" >> $S; pack
else
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv -lms 200 > $L/clocks.csv 2>&1 & SMI=$!
  timeout 80 python3 $R/bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $L/T.json > $L/T.txt 2>&1; echo "torch rc=$? $(tr -d '\n ' < $L/T.json | head -c 120)" >> $S; pack
  for r in 1 2; do
    for b in a g h; do [ -x $b/mxmoe ] || continue; timeout 45 $b/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision fp8 --baseline $L/T.json --json $L/${b}_f8_$r.json > $L/${b}_f8_$r.txt 2>&1; echo "$b fp8 r$r rc=$? $(summ $L/${b}_f8_$r.json)" >> $S; done
    for b in a g; do timeout 45 $b/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision exact --baseline $L/T.json --json $L/${b}_ex_$r.json > $L/${b}_ex_$r.txt 2>&1; echo "$b exact r$r rc=$? $(summ $L/${b}_ex_$r.json)" >> $S; done
    pack
  done
  kill $SMI
  timeout 60 python3 $R/bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.txt 2>&1; echo "torch decode rc=$?" >> $S
  for b in a g; do timeout 45 $b/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json --json $L/${b}_dec.json > $L/${b}_dec.txt 2>&1; echo "$b decode rc=$? $(summ $L/${b}_dec.json)" >> $S; done; pack
  SEED=$RANDOM$RANDOM
  for pr in exact fp8; do
    for b in a g; do timeout 45 $b/mxmoe validate --suite smoke --backend cuda --precision $pr --seed $SEED --json $L/smoke_${pr}_$b.json > $L/smoke_${pr}_$b.txt 2>&1; echo "$b smoke $pr rc=$? $(tail -1 $L/smoke_${pr}_$b.txt)" >> $S; done
  done
  pack
fi
echo "PART=${PART:-1} elapsed $((SECONDS - T0)) s" >> $S
cat $S
