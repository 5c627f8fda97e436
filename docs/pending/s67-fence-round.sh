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
. "$(dirname "$0")/round_lib.sh"
gpu=$(gpu_name); echo "GPU: $gpu"
m=$(unpack .gpubin/s67m /tmp/b67m m); n=$(unpack .gpubin/s67f /tmp/b67f n)
note "main $(cat .gpubin/s67m/BUILT) against n on $gpu"
R=${ROUND_S:-560}
gtests n $n 'Prefill*:Layer.*:E2m1Decode.*' 200
suite_cuda n $n
memcheck n $n 'Prefill*:Layer.Prefill*'
sancheck n $n synccheck 'Prefill*:Layer.Prefill*'
ab_rounds $(( R - 120 )) 128,512,1024,4096 10 3 m $m n $n
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
