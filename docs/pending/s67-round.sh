#!/usr/bin/env bash
# Session 67: the prefill path's E2M1 -> BF16 decode in 12 integer ops instead of 13
# (fp4x8_to_bf16_times: q << 3 shared by pairs 1 and 3) against main, whichever GPU comes
# (on an H200, main's issue-figures round instead: h200_dispatch.sh). The variant's
# decode tests (every 32-bit word) and test_engine first, then the exact layer at
# M = 16 / 32 / 128 / 1024 in three alternating rounds (graph and eager), ncu's executed
# instructions and durations of both prefill GEMMs at M = 32 / 1024, the variant's
# test_suite_cuda, a memcheck and the rest of its test_engine (with what time is left) last.
# Pack (.gpubin/s67a, ignored): from build-gpu with the change,
#   mkdir -p v && cp build-gpu/mxmoe build-gpu/tests/test_engine build-gpu/tests/test_suite_cuda v/
#   tar cf - v | xz -T2 -6 > .gpubin/s67a/bins.tar.xz; rm -r v
# carry [".gpubin/s64m", ".gpubin/s67a"]; ROUND_S=<the call's limit> bash docs/pending/s67-round.sh
set -u
. "$(dirname "$0")/h200_dispatch.sh"
R=${ROUND_S:-560}
v=$(unpack .gpubin/s67a /tmp/b67 v)
gtests v $v 'E2m1Decode.*' 60
ab_rounds $(( R - 150 )) 16,32,128,1024 20 3 m $m v $v
for b in m v; do
  bin=$m; [ $b = v ] && bin=$v
  for M in 32 1024; do
    left $(( R - 110 )) "ncu $b $M" || break 2
    timeout 60 ncu --clock-control none --kernel-name regex:'gemm[12]_prefill' \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv \
      $bin/mxmoe bench --tokens $M --iterations 1 > $L/ncu_${b}_${M}.csv 2>&1
    note "ncu $b $M rc=$? $(el)"
  done
done
python3 - $L <<'PY' | tee -a $S
import csv, glob, sys, statistics as st, collections
L = sys.argv[1]
for f in sorted(glob.glob(L + '/ncu_*.csv')):
    rows = [r for r in csv.reader(open(f)) if len(r) > 10]
    if not rows: print(f, 'no rows'); continue
    h = rows[0]; ik = h.index('Kernel Name'); im = h.index('Metric Name'); iv = h.index('Metric Value')
    d = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows[1:]:
        k = 'gemm1' if 'gemm1_prefill' in r[ik] else 'gemm2'
        d[k][r[im]].append(float(r[iv].replace(',', '')))
    print(f.split('/')[-1], ' '.join('%s %.1f us %.2f M inst' % (k, st.median(v['gpu__time_duration.sum']) / 1e3,
          st.median(v['smsp__inst_executed.sum']) / 1e6) for k, v in sorted(d.items())))
PY
note "exact, graph (us, three rounds; v against m, medians):"; L=$L/ex f8_table m v
note "eager:"; L=$L/ex MODE=eager f8_table m v
left $(( R - 170 )) "test_suite_cuda" && suite_cuda v $v
left $(( R - 70 )) "memcheck" && memcheck v $v 'Prefill*:Layer.Prefill*'
T=$(( R - 15 - $(date +%s) + t0 )); [ $T -gt 30 ] && gtests v_all $v '-E2m1Decode.*' $T || note "test_engine (the rest) skipped: ${T} s left"
pack_logs
