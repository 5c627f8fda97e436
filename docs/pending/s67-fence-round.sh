#!/usr/bin/env bash
# Session 67, prepared, not run: GEMM2's TMA tiles (96 / 128 tokens) without the proxy
# fence after each `full` wait (docs/pending/s67-gemm2-no-fence.patch on f0a4aa2: the fence
# is for pf_producer's cp.async rows; pf_producer_tma's rows and words come by the async
# proxy). SASS: gemm2_prefill<128>'s chunk loop 185 -> 183, <96> reordered, nothing else
# changes. Run 0's ncu put the fence (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S) at 1.4% of
# gemm2_prefill<128>'s samples at M=1024. Whatever GPU comes: the variant's tests first
# (test_engine's prefill and layer tests, test_suite_cuda, memcheck and synccheck of the
# prefill tests), then the exact layer against main at M = 128 / 512 / 1024 / 4096 (three
# alternating rounds), then ncu of gemm2_prefill at M = 1024 / 4096 (main, n, n, main).
# Pack (.gpubin/s67f, ignored): from build-gpu with the patch applied,
#   mkdir -p n && cp build-gpu/mxmoe build-gpu/tests/test_engine build-gpu/tests/test_suite_cuda n/
#   tar cf - n | xz -T2 -6 > .gpubin/s67f/bins.tar.xz; rm -r n
# carry [".gpubin/s67m", ".gpubin/s67f"]; ROUND_S=<the call's limit> bash docs/pending/s67-fence-round.sh
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $gpu"
B=/tmp/b67m; mkdir -p $B && [ -x $B/m/mxmoe ] || tar xJf .gpubin/s67m/bins.tar.xz -C $B; m=$B/m
V=/tmp/b67f; mkdir -p $V && [ -x $V/n/mxmoe ] || tar xJf .gpubin/s67f/bins.tar.xz -C $V; n=$V/n
. "$(dirname "$0")/round_lib.sh"
note "main $(cat .gpubin/s67m/BUILT) against n on $gpu"
R=${ROUND_S:-560}
gtests n $n 'Prefill*:Layer.*:E2m1Decode.*' 200
timeout 160 $n/test_suite_cuda --gtest_brief=1 > $L/n_suite.log 2>&1
note "n test_suite_cuda rc=$? $(passed $L/n_suite.log) $(el)"; grep -E "FAILED|Failure" $L/n_suite.log | head -3 | tee -a $S
memcheck n $n 'Prefill*:Layer.Prefill*'
sancheck n $n synccheck 'Prefill*:Layer.Prefill*'
mkdir -p $L/ex
for r in 1 2 3; do
  order="m n"; [ $r = 2 ] && order="n m"
  for b in $order; do
    left $(( R - 120 )) "exact $b r$r" || break 2
    bin=$m; [ $b = n ] && bin=$n
    timeout 60 $bin/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --json $L/ex/${b}_f8_$r.json \
      > $L/ex/${b}_$r.log 2>&1
    note "exact $b r$r rc=$? $(summ $L/ex/${b}_f8_$r.json) $(el)"
  done
done
note "exact, graph (us; n against m, medians):"; L=$L/ex f8_table m n
for b in m n n m; do
  bin=$m; [ $b = n ] && bin=$n
  for M in 1024 4096; do
    left $(( R - 40 )) "ncu $b $M" || break 2
    timeout 40 ncu --clock-control none --kernel-name regex:'gemm2_prefill' \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv \
      $bin/mxmoe bench --tokens $M --iterations 1 > $L/ncu_${b}_${M}_$(ls $L/ncu_${b}_${M}_* 2>/dev/null | wc -l).csv 2>&1
    note "ncu $b $M rc=$? $(el)"
  done
done
python3 - $L <<'PY' | tee -a $S
import csv, glob, sys, statistics as st
for f in sorted(glob.glob(sys.argv[1] + '/ncu_*.csv')):
    rows = [r for r in csv.reader(open(f)) if len(r) > 10]
    if not rows: print(f.split('/')[-1], 'no rows'); continue
    h = rows[0]; im = h.index('Metric Name'); iv = h.index('Metric Value')
    d = {}
    for r in rows[1:]: d.setdefault(r[im], []).append(float(r[iv].replace(',', '')))
    print(f.split('/')[-1], 'gemm2_prefill %.1f us %.2f M inst (medians of %d launches)' % (
        st.median(d['gpu__time_duration.sum']) / 1e3, st.median(d['smsp__inst_executed.sum']) / 1e6,
        len(d['gpu__time_duration.sum'])))
PY
pack_logs
