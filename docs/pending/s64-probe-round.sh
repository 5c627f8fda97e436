#!/usr/bin/env bash
# Session 64: upper bounds, timing only, of what the exact prefill path's small launches
# cost in the graph at M = 16..128: the generic fallback kernels behind the prefill GEMMs
# (MXMOE_PROBE_NO_FALLBACK: not launched; results stay right while no value is inexact,
# as in the bench) and x's BF16 staging (MXMOE_PROBE_NO_STAGE: not launched; GEMM1 then
# reads stale rows: timing only). The binary is main + s64-probe.patch (three getenv
# lines; not for landing). Pack:
#   git apply docs/pending/s64-probe.patch && cmake --build build-gpu --target mxmoe_cli
#   mkdir -p /tmp/pp/p && cp build-gpu/mxmoe /tmp/pp/p/ && tar cf - -C /tmp/pp p | xz -T2 -6 > .gpubin/s64p/bins.tar.xz
#   git apply -R docs/pending/s64-probe.patch; cp docs/pending/{s64-probe-round.sh,round_lib.sh} .gpubin/s64p/
# then: bash .gpubin/s64p/s64-probe-round.sh, carry [".gpubin/s64p"]
set -u
B=/tmp/b64p; mkdir -p $B && [ -x $B/p/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
run() {  # VARIANT ROUND ENV...
  local v=$1 r=$2; shift 2
  env "$@" timeout 40 $B/p/mxmoe bench --tokens 16,32,64,128 --iterations 20 \
    --json $L/${v}_$r.json > $L/${v}_$r.log 2>&1
  note "$v r$r rc=$? $(summ $L/${v}_$r.json) $(el)"
}
for r in 1 2 3; do
  run base $r MXMOE_PROBE_NONE=1
  run nofb $r MXMOE_PROBE_NO_FALLBACK=1
  run nostage $r MXMOE_PROBE_NO_STAGE=1
  run neither $r MXMOE_PROBE_NO_FALLBACK=1 MXMOE_PROBE_NO_STAGE=1
done
python3 - $L <<'PY' | tee -a $S
import json, sys, glob, statistics as st
L = sys.argv[1]; t = {}
for f in glob.glob(L + '/*.json'):
    v = f.split('/')[-1].rsplit('_', 1)[0]
    for c in json.load(open(f))['cases']:
        if c['mode'] == 'graph': t.setdefault((c['tokens'], v), []).append(c['median_us'])
vs = ['base', 'nofb', 'nostage', 'neither']
print('| M | ' + ' | '.join(vs) + ' | nofb | nostage | neither |')
for M in sorted({k[0] for k in t}):
    b = st.median(t[(M, 'base')])
    print('| %d | %s | %s |' % (M, ' | '.join(' / '.join('%.1f' % x for x in t.get((M, v), [])) for v in vs),
          ' | '.join('%+.1f us (%+.1f%%)' % (st.median(t[(M, v)]) - b, 100 * (st.median(t[(M, v)]) / b - 1)) for v in vs[1:])))
PY
pack_logs
