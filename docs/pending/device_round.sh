#!/bin/bash
# One device round for the pending series (docs/pending/README.md), written in session 39
# for the first session with a GPU. Layout next to this script, unpacked from bin.tar.xz:
# a/ b/ c/ d/ each with `mxmoe` (scripts/variants.sh), and d/ also test_engine,
# test_suite_cuda, test_error_flags (built from the checkout with every patch applied).
# Part 1 (PART=1, ~8 min): alternating benches of a..d, then d's GPU tests. Part 2
# (PART=2, ~8 min): validation of d, a-vs-d smoke comparison, ncu of the FP8 GEMMs,
# sanitizers. Part 3 (PART=3, ~3 min, optional): where the FP8 layer's time goes outside
# its two GEMMs (session 38 ran 5.93 ms at M=4096 with GEMM1 + GEMM2 4.86 ms under ncu):
# every kernel of one forward under ncu, and the SM clock and power during graph replay.
# Logs under $OUT/l (tarred), the summary printed last.
cd "$(dirname "$0")"; S=$OUT/summary.txt; tar xf bin.tar.xz; mkdir -p $OUT/l; L=$OUT/l; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
summ() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))['cases']
print(' '.join('%d:%.1f'%(c['tokens'],c['median_us']) for c in d if c['mode']=='graph'))" $1; }
if [ "${PART:-1}" = 3 ]; then
  for pr in fp8 exact; do for m in 1024 4096; do
    timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv d/mxmoe bench --tokens $m --iterations 1 --precision $pr > $L/kernels_${pr}_$m.csv 2>$L/kernels_${pr}_$m.err
    python3 - $L/kernels_${pr}_$m.csv "$pr M=$m" >> $S <<'PY'
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
h=rows[0]; k=h.index('Kernel Name'); v=h.index('Metric Value'); u=h.index('Metric Unit')
# bench --iterations 1 runs 4 eager forwards and 4 graph replays (3 warm-ups and the timed
# one each): per kernel name, its launches and their median (setup kernels launch once).
by={}
for r in rows[1:]: by.setdefault((r[k].split('(')[0][:48], r[u]), []).append(float(r[v].replace(',','')))
print(sys.argv[2], 'kernel launches', len(rows)-1)
for (name,unit),vals in by.items(): print('  %-48s x%-3d median %10.1f %s' % (name, len(vals), sorted(vals)[len(vals)//2], unit))
PY
  done; done
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 50 > $L/clocks.csv 2>&1 &
  SMI=$!
  timeout 90 d/mxmoe bench --tokens 4096 --iterations 30 --precision fp8 --json $L/clk_f8.json > $L/clk_f8.txt 2>&1; echo "d fp8 M=4096 x30 rc=$? $(summ $L/clk_f8.json)" >> $S
  kill $SMI
  python3 - $L/clocks.csv >> $S <<'PY'
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))[1:]
cl=[float(r[1].split()[0]) for r in rows if len(r)>2 and 'MHz' in r[1]]
pw=[float(r[2].split()[0]) for r in rows if len(r)>2 and 'W' in r[2]]
if cl: print('SM clock MHz min/median/max %d/%d/%d over %d samples; power W median %.0f max %.0f; reasons seen: %s' % (min(cl), sorted(cl)[len(cl)//2], max(cl), len(cl), sorted(pw)[len(pw)//2], max(pw), sorted(set(r[4].strip() for r in rows if len(r)>4))))
PY
elif [ "${PART:-1}" = 1 ]; then
  for r in 1 2; do for b in a b c d; do
    timeout 90 $b/mxmoe bench --tokens 512,1024,4096 --iterations 10 --precision fp8 --json $L/${b}_f8_$r.json > $L/${b}_f8_$r.txt 2>&1; echo "$b fp8 r$r rc=$? $(summ $L/${b}_f8_$r.json)" >> $S
  done; done
  for r in 1 2; do for b in a b; do
    timeout 90 $b/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision exact --json $L/${b}_ex_$r.json > $L/${b}_ex_$r.txt 2>&1; echo "$b exact r$r rc=$? $(summ $L/${b}_ex_$r.json)" >> $S
  done; done
  echo "benches done $((SECONDS - T0)) s" >> $S
  timeout 200 d/test_engine > $L/test_engine.txt 2>&1; echo "d test_engine rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/test_engine.txt | tr '\n' ' ')" >> $S
  timeout 60 d/test_suite_cuda > $L/suite.txt 2>&1; echo "d test_suite_cuda rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/suite.txt | tr '\n' ' ')" >> $S
  timeout 60 d/test_error_flags > $L/flags.txt 2>&1; echo "d test_error_flags rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/flags.txt | tr '\n' ' ')" >> $S
else
  SEED=$RANDOM$RANDOM
  for pr in exact fp8; do
    for b in a d; do timeout 90 $b/mxmoe validate --suite smoke --backend cuda --precision $pr --seed $SEED --json $L/smoke_${pr}_$b.json > $L/smoke_${pr}_$b.txt 2>&1; echo "$b smoke $pr rc=$? $(tail -1 $L/smoke_${pr}_$b.txt)" >> $S; done
    python3 - $L/smoke_${pr}_a.json $L/smoke_${pr}_d.json $pr >> $S <<'PY'
import json,sys
def strip(d):
  if isinstance(d,dict): return {k:strip(v) for k,v in d.items() if not any(w in k for w in ('time','_us','seconds','elapsed'))}
  if isinstance(d,list): return [strip(v) for v in d]
  return d
a,b=[strip(json.load(open(f))) for f in sys.argv[1:3]]
print('smoke', sys.argv[3], 'a and d give the same error figures (timings dropped):', a==b)
PY
  done
  timeout 60 d/mxmoe run > $L/run.txt 2>&1; echo "d run rc=$? $(tail -1 $L/run.txt)" >> $S
  timeout 90 d/mxmoe validate --suite all --backend cuda > $L/val_ex.txt 2>&1; echo "d validate exact rc=$? $(tail -1 $L/val_ex.txt)" >> $S
  timeout 200 d/mxmoe validate --suite all --backend cuda --precision fp8 > $L/val_f8.txt 2>&1; echo "d validate fp8 rc=$? $(tail -1 $L/val_f8.txt)" >> $S
  for b in a d; do for k in gemm1_fp8 gemm2_fp8; do
    timeout 60 ncu --clock-control none -k regex:$k --launch-count 1 --section SpeedOfLight --section SchedulerStats --csv $b/mxmoe bench --tokens 4096 --iterations 1 --precision fp8 > $L/ncu_${b}_$k.csv 2>$L/ncu_${b}_$k.err
    echo "$b $k M=4096 $(grep -E '"(Duration|Issue Slots Busy|No Eligible)"' $L/ncu_${b}_$k.csv | awk -F'","' '{print $(NF-2) " " $NF}' | tr -d '"' | tr '\n' ' ')" >> $S
  done; done
  for tool in memcheck synccheck; do
    timeout 60 compute-sanitizer --tool $tool d/test_engine --gtest_filter='Fp8Mode.Tails*:Fp8Mode.LayerWithin*' > $L/${tool}_f8.txt 2>&1; echo "d $tool fp8 rc=$? $(grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $L/${tool}_f8.txt | tr '\n' ' ')" >> $S
    timeout 60 compute-sanitizer --tool $tool d/test_engine --gtest_filter='Gemm1Act.*:Layer.PrefillPast*' > $L/${tool}_ex.txt 2>&1; echo "d $tool exact rc=$? $(grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $L/${tool}_ex.txt | tr '\n' ' ')" >> $S
  done
fi
echo "elapsed $((SECONDS - T0)) s" >> $S
cd $OUT && tar cJf logs.tar.xz l && rm -rf l; cat $S
