#!/usr/bin/env bash
# Session 60, round 1: the FP8 kernels' narrow tiles (a), and the same with the token
# tiles walked innermost (b), against main (m), on whatever GPU comes. Pack (from the
# build trees; m = main 63fc4a9 in /tmp/s57-k/build-gpu, a and b = /tmp/s60 with
# kF8TokenTilesInner false / true):
#   tar cf - {m,a,b}/mxmoe | xz -T2 -6 > .gpubin/s60/bins.tar.xz
# then: bash .gpubin/s60/s60-round.sh with carry [".gpubin/s60"] (~300 s). Order: the
# PyTorch baseline, the FP8 layer in alternating rounds (m a b, a b m, b m a, m a b), the
# FP8 validation suite on b and a, DRAM bytes of both FP8 GEMMs under ncu (m, b).
# (Round 2, s60-tests.sh: the chosen variant's test_engine.)
set -u
B=/tmp/b60; mkdir -p $B && tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
torch_prefill
for order in "m a b" "a b m" "b m a" "m a b"; do
  r=$(( ${r:-0} + 1 ))
  for v in $order; do f8 $v $B/$v $r; done
done
python3 - $L <<'PY' | tee -a $S
import json, sys, glob, statistics as st
L = sys.argv[1]; t = {}
for f in sorted(glob.glob(L + '/*_f8_*.json')):
    v = f.split('/')[-1].split('_')[0]
    for c in json.load(open(f))['cases']:
        if c['mode'] == 'graph': t.setdefault((c['tokens'], v), []).append(c['median_us'])
print('| M | m | a | b | a vs m | b vs m |')
for M in sorted({k[0] for k in t}):
    g = {v: t.get((M, v), [float('nan')]) for v in 'mab'}
    md = {v: st.median(g[v]) for v in 'mab'}
    print('| %d | %s | %s | %s | %+.1f%% | %+.1f%% |' % (M, ' / '.join('%.1f' % x for x in g['m']),
          ' / '.join('%.1f' % x for x in g['a']), ' / '.join('%.1f' % x for x in g['b']),
          100 * (md['a'] / md['m'] - 1), 100 * (md['b'] / md['m'] - 1)))
PY
for v in b a; do
  left 330 "$v's validation" && { timeout 80 $B/$v/mxmoe validate --suite all --backend cuda --precision fp8 > $L/${v}_validate.log 2>&1
    note "$v validate fp8 rc=$? $(grep -E 'passed, .* failed' $L/${v}_validate.log | tail -1) $(el)"; }
done
for v in m b; do
  left 480 "ncu $v" && { timeout 45 ncu --clock-control none -k regex:"gemm[12]_fp8" --launch-skip 2 --launch-count 2 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
    $B/$v/mxmoe bench --tokens 4096 --iterations 1 --precision fp8 > $L/${v}_ncu.log 2>&1
  note "ncu $v rc=$?: $(grep -E 'gemm[12]_fp8_kernel|gpu__time|dram__bytes|hit_rate' $L/${v}_ncu.log | sed -E 's/\(Gemm.*//; s/ +/ /g' | tr '\n' ';') $(el)"; }
done
pack_logs
