#!/usr/bin/env bash
# Session 50's prepared round (docs/pending/s50-round.sh; run from the repository root with
# the binaries in .gpubin/s50a/bins.tar.xz): h = s50-stage-hint.patch alone (what would
# land), p = h + the probes (s50-probes.patch). Variants: a = h, MXMOE_STAGE_HINT=0 (main's
# staging); h = h; p8 = p, MXMOE_STAGE_PASSES=8; g1 / g2 = p8 + MXMOE_F8_GATHER=1 / 2 (x
# staged by token, GEMM1 gathering its rows by TMA, one row a copy / by cp.async).
set -u
D=.gpubin/s50a
B=/tmp/b; mkdir -p $B && tar xJf $D/bins.tar.xz -C $B
S=$OUT/summary.txt
note() { echo "$*" >> $S; }
# A step starts only while the round has time left for it (the call's limit is 600 s).
left() { [ $(( $(date +%s) - t0 )) -lt $1 ] || { note "skipped past $1 s: $2"; return 1; }; }
bin_of() { case $1 in a|h) echo $B/h;; *) echo $B/p;; esac; }
env_of() { case $1 in a) echo "MXMOE_STAGE_HINT=0";; h) echo "MXMOE_STAGE_HINT=1";; p8) echo "MXMOE_STAGE_PASSES=8";;
  g1) echo "MXMOE_STAGE_PASSES=8 MXMOE_F8_GATHER=1";; g2) echo "MXMOE_STAGE_PASSES=8 MXMOE_F8_GATHER=2";; esac; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader >> $S
t0=$(date +%s)
timeout 150 $B/h/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*:Layer.PrefillPast*' > $OUT/h_tests.log 2>&1
note "h Fp8Mode.*+Layer.PrefillPast*: rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/h_tests.log | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|Failure" $OUT/h_tests.log | head -5 >> $S
timeout 150 $B/p/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*' > $OUT/p_tests.log 2>&1
note "p Fp8Mode.* (both gathers compared inside): rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/p_tests.log | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|Failure" $OUT/p_tests.log | head -5 >> $S
env $(env_of g2) timeout 120 $B/p/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.Layer*:Fp8Mode.Tails*' > $OUT/g2_tests.log 2>&1
note "g2 Fp8Mode.Layer*+Tails* (against the reference): rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/g2_tests.log | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
timeout 120 python3 bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $OUT/torch.json > $OUT/torch.log 2>&1
note "torch rc=$?"
V="a h p8 g1 g2"
for r in 1 2; do
  for v in $V; do
    env $(env_of $v) timeout 100 $(bin_of $v)/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision fp8 \
      --baseline $OUT/torch.json --json $OUT/${v}_f8_$r.json > $OUT/${v}_f8_$r.log 2>&1
    note "bench $v round $r rc=$? ($(( $(date +%s) - t0 )) s)"
  done
done
python3 bench/compare_runs.py $OUT --variants a,h,p8,g1,g2 --rounds 1,2 --pattern '{v}_f8_{r}.json' > $OUT/compare.md 2>&1
timeout 100 $B/h/mxmoe validate --suite smoke --backend cuda --precision fp8 --json $OUT/h_smoke.json > $OUT/h_smoke.log 2>&1
note "h smoke fp8 rc=$? $(grep -E 'passed' $OUT/h_smoke.log | tail -1)"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/p/test_engine --gtest_brief=1 \
  --gtest_filter='Fp8Mode.Stage*:Fp8Mode.Tails*:Fp8Mode.Fused*' > $OUT/p_memcheck.log 2>&1
note "p memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $OUT/p_memcheck.log | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
for v in a h p8 g2; do
  left 470 "ncu staging $v" || continue
  env $(env_of $v) timeout 50 ncu --clock-control none --kernel-name regex:stage_fp8 --launch-count 2 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_op_read_hit_rate.pct \
    --csv $(bin_of $v)/mxmoe bench --tokens 1024 --iterations 1 --precision fp8 > $OUT/ncu_${v}_1024.csv 2>&1
  note "ncu $v rc=$? ($(( $(date +%s) - t0 )) s)"
done
for v in h g1 g2; do
  left 500 "ncu all $v" || continue
  env $(env_of $v) timeout 50 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    $(bin_of $v)/mxmoe bench --tokens 1024 --iterations 1 --precision fp8 > $OUT/ncuall_${v}_1024.csv 2>&1
  note "ncu all $v rc=$? ($(( $(date +%s) - t0 )) s)"
done
# Where M=4096 stands (58.7% of the FP8 peak in session 49): every kernel's time.
left 520 "ncu all h 4096" && env $(env_of h) timeout 50 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  $B/h/mxmoe bench --tokens 4096 --iterations 1 --precision fp8 > $OUT/ncuall_h_4096.csv 2>&1
note "ncu all h 4096 rc=$? ($(( $(date +%s) - t0 )) s)"
python3 - $OUT >> $S <<'PY'
import csv, sys, glob, os, collections
for f in sorted(glob.glob(sys.argv[1] + '/ncu*.csv')):
    rows = [r for r in csv.reader(l for l in open(f) if l.startswith('"'))]
    if not rows: continue
    h = rows[0]; iK = h.index('Kernel Name'); iM = h.index('Metric Name'); iV = h.index('Metric Value')
    vals = collections.defaultdict(list)
    for r in rows[1:]:
        k = r[iK].replace('(anonymous namespace)::', '').split('(')[0].split('::')[-1][:32]
        vals[(k, r[iM].split('__')[1])].append(r[iV])
    print(os.path.basename(f), '; '.join('%s %s=%s' % (k[0], k[1], ','.join(v[:4])) for k, v in vals.items()))
PY
cat $OUT/compare.md >> $S
cat $S
cd $OUT && tar czf all.tgz --exclude=all.tgz . && find . -type f ! -name all.tgz ! -name summary.txt -delete
