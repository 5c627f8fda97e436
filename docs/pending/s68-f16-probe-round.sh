#!/usr/bin/env bash
# Session 68, prepared, not run: a timing-only probe of session 65's design lead for the
# exact prefill consumers, FP16 operands (PERFORMANCE.md session 65, "A design lead"):
# docs/pending/s68-f16-probe.patch on 58be149, built with -DMXMOE_PROBE_F16_OPERANDS (p,
# .gpubin/s68p). Its consumers decode each weight word with the decode path's 9-op FP16
# placement and multiply by an FP16 scale (4 HMUL2), and its prefill wgmmas take FP16
# operands; the staged B rows stay BF16 bits read as FP16, so p's results are WRONG (no
# tests; bench times only). SASS: every prefill chunk loop 185-196 -> 163-167 instructions
# (LOP3 68-69 -> 52-53, the LEA / SHF of the BF16 placement gone). What the real design
# would add (x and the intermediate staged as FP16 with per-row factors, a per-row weight
# offset in the epilogue) is outside the mainloop. The question: do ~15% fewer consumer
# instructions (a third fewer ALU ops per word) buy time at M=16 / 32 (issue 4: the SM's
# instructions bound them, session 64) and at the larger sizes, where session 67's 3%
# fewer did not at the 32-token tile.
# Whatever GPU comes: p's layer once at M=32 under ncu with every kernel (that no generic
# fallback did the work: gemm1_act_kernel / gemm2_kernel must leave at once, ~3 us), three
# alternating rounds of main (m, .gpubin/s67m) and p, exact, at M=16..4096 (graph and
# eager), ncu of both prefill GEMMs at M=32 and 1024 (m, p, p, m), and the pipes' use of
# GEMM1 at M=32 (session 67's lead 4).
# carry [".gpubin/s67m", ".gpubin/s68p"]; ROUND_S=<the call's limit> bash docs/pending/s68-f16-probe-round.sh
set -u
. "$(dirname "$0")/round_lib.sh"
m=$(unpack .gpubin/s67m /tmp/b67m m); p=$(unpack .gpubin/s68p /tmp/b68p p)
note "main $(cat .gpubin/s67m/BUILT) against p ($(cat .gpubin/s68p/BUILT)) on $(gpu_name)"
R=${ROUND_S:-300}
kernels_at p $p 32
ab_rounds $(( R - 120 )) 16,32,64,128,1024,4096 10 3 m $m p $p
note "exact, graph (us; p against m, medians):"; L=$L/ex f8_table m p
note "eager:"; L=$L/ex MODE=eager f8_table m p
for b in m p p m; do
  bin=$m; [ $b = p ] && bin=$p
  for M in 32 1024; do left $(( R - 60 )) "ncu $b $M" && ncu_times $b $bin $M 'gemm[12]_prefill' exact; done
done
python3 "$RL_DIR/ncu_table.py" $L m p | tee -a $S
for b in m p; do
  bin=$m; [ $b = p ] && bin=$p
  left $(( R - 25 )) "pipes $b" && { timeout 40 ncu --clock-control none --kernel-name regex:gemm1_prefill --launch-skip 2 \
      --launch-count 1 --metrics 'regex:sm__inst_executed_pipe_.*\.sum$,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active$,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum' \
      --csv $bin/mxmoe bench --tokens 32 --iterations 1 > $L/pipes_${b}_32.csv 2>&1; note "pipes $b rc=$? $(el)"; }
done
python3 - $L/pipes_m_32.csv $L/pipes_p_32.csv <<'PY' | tee -a $S
import csv, sys
def read(f):
    try: rows = [r for r in csv.reader(l for l in open(f) if l.startswith('"'))]
    except OSError: return {}
    if not rows: return {}
    h = rows[0]; iM, iV = h.index('Metric Name'), h.index('Metric Value')
    return {r[iM]: r[iV] for r in rows[1:]}
a, b = read(sys.argv[1]), read(sys.argv[2])
for k in sorted(set(a) | set(b)):
    print('  %-70s m %14s  p %14s' % (k, a.get(k, '-'), b.get(k, '-')))
PY
pack_logs
