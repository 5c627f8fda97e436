#!/usr/bin/env bash
# Session 60, rounds 1 and 2 in one call (carry [".gpubin/s60", ".gpubin/s60t"], ~63 MB with
# the tree): the FP8 layer m / a / b in alternating rounds, then b's FP8 tests and the
# sanitizers, b's FP8 validation, and ncu's DRAM bytes (m, b), each while time is left.
set -u
B=/tmp/b60; mkdir -p $B && tar xJf .gpubin/s60/bins.tar.xz -C $B && tar xJf .gpubin/s60t/bins.tar.xz -C $B
. .gpubin/s60/round_lib.sh
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
left 330 "b's FP8 tests" && gtests b $B/b 'Fp8Mode.*:Layer.PrefillPastThirtyTwoLocalExpertsMatchesReference' 120
left 420 "b's memcheck" && memcheck b $B/b 'Fp8Mode.NarrowTiles*:Fp8Mode.Tails*'
left 460 "b's validation" && { timeout 60 $B/b/mxmoe validate --suite all --backend cuda --precision fp8 > $L/b_validate.log 2>&1
  note "b validate fp8 rc=$? $(grep -E 'passed, .* failed' $L/b_validate.log | tail -1) $(el)"; }
for tool in racecheck synccheck; do
  left 500 "b's $tool" && { timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 $B/b/test_engine --gtest_brief=1 \
    --gtest_filter='Fp8Mode.NarrowTiles*' > $L/b_$tool.log 2>&1
    note "b $tool rc=$? $(grep -E 'SUMMARY' $L/b_$tool.log | tr '\n' ' ') $(passed $L/b_$tool.log) $(el)"; }
done
for v in m b; do
  left 540 "ncu $v" && { timeout 25 ncu --clock-control none -k regex:"gemm[12]_fp8" --launch-skip 2 --launch-count 2 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
    $B/$v/mxmoe bench --tokens 4096 --iterations 1 --precision fp8 > $L/${v}_ncu.log 2>&1
  note "ncu $v rc=$?: $(grep -E 'gemm[12]_fp8_kernel|gpu__time|dram__bytes|hit_rate' $L/${v}_ncu.log | sed -E 's/\(Gemm.*//; s/ +/ /g' | tr '\n' ';') $(el)"; }
done
pack_logs
