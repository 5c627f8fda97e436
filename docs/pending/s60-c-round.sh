#!/usr/bin/env bash
# Session 60, round 3: c = the narrow tiles (no tile-order change) with the FP8 group loop
# on 32-bit shared addresses (GEMM2's loop 110 instructions against main's 109), against
# main (m). Pack: tar cf - m/mxmoe c/mxmoe c/test_engine | xz -T2 -6 > .gpubin/s60c/bins.tar.xz
# run: bash .gpubin/s60c/s60-c-round.sh with carry [".gpubin/s60c"] (~360 s).
set -u
B=/tmp/b60c; mkdir -p $B && tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
gtests c $B/c 'Fp8Mode.NarrowTiles*' 40
torch_prefill
r=0
for v in m c c m m c c m; do
  n=$(( $(ls $L/${v}_f8_*.json 2>/dev/null | wc -l) + 1 )); f8 $v $B/$v $n
done
python3 - $L <<'PY' | tee -a $S
import json, sys, glob, statistics as st
L = sys.argv[1]; t = {}
for f in sorted(glob.glob(L + '/*_f8_*.json')):
    v = f.split('/')[-1].split('_')[0]
    for c in json.load(open(f))['cases']:
        if c['mode'] == 'graph': t.setdefault((c['tokens'], v), []).append(c['median_us'])
print('| M | m | c | c vs m (medians) |')
for M in sorted({k[0] for k in t}):
    g = {v: t.get((M, v), [float('nan')]) for v in 'mc'}
    print('| %d | %s | %s | %+.1f%% |' % (M, ' / '.join('%.1f' % x for x in g['m']), ' / '.join('%.1f' % x for x in g['c']),
          100 * (st.median(g['c']) / st.median(g['m']) - 1)))
PY
left 220 "c's FP8 tests" && gtests c $B/c 'Fp8Mode.*:Layer.PrefillPastThirtyTwoLocalExpertsMatchesReference:-Fp8Mode.NarrowTiles*' 100
left 290 "c's memcheck" && memcheck c $B/c 'Fp8Mode.NarrowTiles*:Fp8Mode.Tails*'
for tool in racecheck synccheck; do
  left 320 "c's $tool" && { timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 $B/c/test_engine --gtest_brief=1 \
    --gtest_filter='Fp8Mode.NarrowTiles*' > $L/c_$tool.log 2>&1
    note "c $tool rc=$? $(grep -E 'SUMMARY' $L/c_$tool.log | tr '\n' ' ') $(passed $L/c_$tool.log) $(el)"; }
done
left 340 "c's validation" && { timeout 40 $B/c/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/c_validate.log 2>&1
  note "c validate smoke fp8 rc=$? $(grep -E 'passed, .* failed' $L/c_validate.log | tail -1) $(el)"; }
pack_logs
