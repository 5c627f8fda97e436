#!/usr/bin/env bash
# Session 69, run 3 (ran on an H100): where GEMM1's warps wait at M=128 (run 2: latency-bound,
# 2.95 warps per scheduler, each issuing every 5.6-6.0 cycles), main (m) against the
# FP8-operand probe (q): ncu's per-reason stall ratios (warps stalled per issued
# instruction) of gemm1_prefill, one launch past the first two, at M=128 and 32. First, on
# an H200 only, M=16384 (m16k).
# carry [".gpubin/s67m", ".gpubin/s69q"]; bash docs/pending/s69-stalls2.sh
set -u
. "$(dirname "$0")/round_lib.sh"
m=$(unpack .gpubin/s67m /tmp/b67m m); q=$(unpack .gpubin/s69q /tmp/b69q q)
note "main $(cat .gpubin/s67m/BUILT) and q ($(cat .gpubin/s69q/BUILT)) on $(gpu_name)"
m16k_on_h200 m $m
gemm1_ncu_mq why --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum'
python3 - $L <<'PY' | tee -a $S
import csv, glob, os, sys
vals = {}
for f in sorted(glob.glob(sys.argv[1] + '/why_*.csv')):
    name = os.path.basename(f)[4:-4]
    rows = [r for r in csv.reader(l for l in open(f) if l.startswith('"'))]
    if not rows or not {'Metric Name', 'Metric Value'} <= set(rows[0]):
        print('  %s: no rows' % name); continue
    h = rows[0]; iM, iV = h.index('Metric Name'), h.index('Metric Value')
    for r in rows[1:]: vals.setdefault(r[iM].replace('smsp__average_warps_issue_stalled_', '').replace('_per_issue_active.ratio', ''), {})[name] = r[iV]
names = ['m_128', 'q_128', 'm_32', 'q_32']
def key(k):
    try: return -float(str(vals[k].get('m_128', '0')).replace(',', ''))
    except ValueError: return 0.0
print('| stall reason (warps per issued instruction) | ' + ' | '.join(names) + ' |')
for k in sorted(vals, key=key): print('| %s | %s |' % (k, ' | '.join(vals[k].get(n, '-') for n in names)))
PY
pack_logs
