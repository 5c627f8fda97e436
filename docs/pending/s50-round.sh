#!/usr/bin/env bash
# Session 50's prepared round (docs/pending/s50-round.sh, packed by s50-build.sh into
# .gpubin/s50a with the binaries). Run from the repository root. Binaries: h =
# s49-stage-hint.patch, L = s50-gather.patch (each what would land). Variants: a = h with
# MXMOE_STAGE_HINT=0 and L0 = L with MXMOE_F8_GATHER=0 (both main's x staging), h, L.
set -u
D=.gpubin/s50a
B=/tmp/b; mkdir -p $B && tar xJf $D/bins.tar.xz -C $B
S=$OUT/summary.txt
t0=$(date +%s)
note() { echo "$*" >> $S; }
# A step starts only while the round has time left for it (the call's limit is 600 s).
left() { [ $(( $(date +%s) - t0 )) -lt $1 ] || { note "skipped past $1 s: $2"; return 1; }; }
bin_of() { case $1 in a|h) echo $B/h;; *) echo $B/L;; esac; }
env_of() { case $1 in a) echo "MXMOE_STAGE_HINT=0";; h) echo "MXMOE_STAGE_HINT=1";; L0) echo "MXMOE_F8_GATHER=0";;
  L) echo "MXMOE_F8_GATHER=1";; esac; }
passed() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader >> $S
timeout 150 $B/L/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*:Layer.PrefillPast*' > $OUT/L_tests.log 2>&1
rc=$?
note "L Fp8Mode.*+Layer.PrefillPast*: rc=$rc $(passed $OUT/L_tests.log) ($(( $(date +%s) - t0 )) s)"
# A hang (a barrier that never completes) would hold every later L step to its timeout.
V="a h L0 L"; L_ok=1
[ $rc -eq 124 ] && { V="a h"; L_ok=0; note "L timed out: its bench, smoke, memcheck and ncu skipped"; }
grep -E "FAILED|Failure" $OUT/L_tests.log | head -5 >> $S
timeout 120 $B/h/test_engine --gtest_brief=1 --gtest_filter='Fp8Mode.*:Layer.PrefillPast*' > $OUT/h_tests.log 2>&1
note "h Fp8Mode.*+Layer.PrefillPast*: rc=$? $(passed $OUT/h_tests.log) ($(( $(date +%s) - t0 )) s)"
grep -E "FAILED|Failure" $OUT/h_tests.log | head -5 >> $S
timeout 120 python3 bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $OUT/torch.json > $OUT/torch.log 2>&1
note "torch rc=$?"
for r in 1 2; do
  for v in $V; do
    env $(env_of $v) timeout 100 $(bin_of $v)/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision fp8 \
      --baseline $OUT/torch.json --json $OUT/${v}_f8_$r.json > $OUT/${v}_f8_$r.log 2>&1
    note "bench $v round $r rc=$? ($(( $(date +%s) - t0 )) s)"
  done
done
python3 bench/compare_runs.py $OUT --variants $(echo $V | tr ' ' ,) --rounds 1,2 --pattern '{v}_f8_{r}.json' > $OUT/compare.md 2>&1
# M=16384 (issue 5's largest case; the target is for every M >= 1024): one round.
if [ $L_ok = 1 ] && left 330 "M=16384"; then
  timeout 90 python3 bench/torch_baseline.py --tokens 16384 --iterations 5 --json $OUT/torch16k.json > $OUT/torch16k.log 2>&1
  note "torch 16384 rc=$?"
  for v in a L; do
    env $(env_of $v) timeout 60 $(bin_of $v)/mxmoe bench --tokens 16384 --iterations 5 --precision fp8 \
      --baseline $OUT/torch16k.json --json $OUT/${v}_f8_16k.json > $OUT/${v}_f8_16k.log 2>&1
    note "bench $v 16384 rc=$? ($(( $(date +%s) - t0 )) s)"
  done
  python3 bench/compare_runs.py $OUT --variants a,L --rounds 16k --pattern '{v}_f8_{r}.json' >> $OUT/compare.md 2>&1
fi
for v in L h; do
  [ $v = L ] && [ $L_ok = 0 ] && continue
  timeout 60 $B/$v/mxmoe validate --suite smoke --backend cuda --precision fp8 --json $OUT/${v}_smoke.json > $OUT/${v}_smoke.log 2>&1
  note "$v smoke fp8 rc=$? $(grep -E 'passed' $OUT/${v}_smoke.log | tail -1)"
done
[ $L_ok = 1 ] && timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/L/test_engine --gtest_brief=1 \
  --gtest_filter='Fp8Mode.Stage*:Fp8Mode.Tails*:Fp8Mode.Fused*' > $OUT/L_memcheck.log 2>&1
note "L memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/L_memcheck.log | tr '\n' ' ') $(passed $OUT/L_memcheck.log) ($(( $(date +%s) - t0 )) s)"
for v in a h L; do
  [ $v = L ] && [ $L_ok = 0 ] && continue
  left 460 "ncu staging $v" || continue
  env $(env_of $v) timeout 40 ncu --clock-control none --kernel-name regex:stage_fp8 --launch-count 2 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_op_read_hit_rate.pct \
    --csv $(bin_of $v)/mxmoe bench --tokens 1024 --iterations 1 --precision fp8 > $OUT/ncu_${v}_1024.csv 2>&1
  note "ncu staging $v rc=$? ($(( $(date +%s) - t0 )) s)"
done
for vm in L:1024 h:1024 L:4096 h:4096; do
  v=${vm%:*}; m=${vm#*:}
  [ $v = L ] && [ $L_ok = 0 ] && continue
  left 530 "ncu all $v $m" || continue
  env $(env_of $v) timeout 45 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    $(bin_of $v)/mxmoe bench --tokens $m --iterations 1 --precision fp8 > $OUT/ncuall_${v}_$m.csv 2>&1
  note "ncu all $v $m rc=$? ($(( $(date +%s) - t0 )) s)"
done
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
