#!/usr/bin/env bash
# Session 69, run 2: why the FP8-operand probe (q, .gpubin/s69q) took only 22% off GEMM1 at
# M=128 with a third fewer instructions and half the tensor time (run 1): ncu's warp-state,
# scheduler and pipe sections of gemm1_prefill (one launch past the first two) for main (m)
# and q at M=128 and 32; first, on an H200 only, M=16384 (s68-16k.sh's m16k; run 1 ran it
# on an H100).
# carry [".gpubin/s67m", ".gpubin/s69q"]; bash docs/pending/s69-stalls.sh
set -u
. "$(dirname "$0")/round_lib.sh"
m=$(unpack .gpubin/s67m /tmp/b67m m); q=$(unpack .gpubin/s69q /tmp/b69q q)
note "main $(cat .gpubin/s67m/BUILT) and q ($(cat .gpubin/s69q/BUILT)) on $(gpu_name)"
m16k_on_h200 m $m
gemm1_ncu_mq stall --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section SpeedOfLight \
  --page details
python3 - $L <<'PY' | tee -a $S
import csv, glob, os, sys
vals = {}
for f in sorted(glob.glob(sys.argv[1] + '/stall_*.csv')):
    name = os.path.basename(f)[6:-4]
    rows = [r for r in csv.reader(l for l in open(f) if l.startswith('"'))]
    if not rows or not {'Section Name', 'Metric Name', 'Metric Unit', 'Metric Value'} <= set(rows[0]):
        print('  %s: no details rows' % name); continue
    h = rows[0]; iS, iM, iU, iV = (h.index(x) for x in ('Section Name', 'Metric Name', 'Metric Unit', 'Metric Value'))
    for r in rows[1:]: vals.setdefault((r[iS], r[iM], r[iU]), {})[name] = r[iV]
names = ['m_128', 'q_128', 'm_32', 'q_32']
print('| section | metric | unit | ' + ' | '.join(names) + ' |')
for k in sorted(vals): print('| %s | %s | %s | %s |' % (k[0], k[1], k[2], ' | '.join(vals[k].get(n, '-') for n in names)))
PY
pack_logs
