#!/usr/bin/env bash
# Session 63: p = main 7f964af + the producers' ring addresses broadcast once
# (ring_addrs in the FP8 producers and GEMM2's exact TMA producer; no S2UR in their issue
# loops), against main (m). ncu of the FP8 kernels at M=4096, the FP8 and exact layers in
# alternating rounds, the SM clock and power beside FP8 M=4096 graph replays (nvidia-smi
# every 50 ms), decode once each, then p's whole test_engine, the sanitizers and validate
# (exact all, fp8 smoke) (~380 s).
# Pack: m/mxmoe = main's build, p/mxmoe + p/test_engine = main + the change
# (cmake -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMXMOE_CUDA_ARCHS=90a; targets
# mxmoe_cli, test_engine), then
#   tar cf - m/mxmoe p/mxmoe p/test_engine | xz -T2 -6 > .gpubin/s63p/bins.tar.xz
# with this script, round_lib.sh and ncu_table.py beside it; run:
#   bash .gpubin/s63p/s63-p-round.sh   carry [".gpubin/s63p"]
set -u
B=/tmp/b63p; mkdir -p $B && [ -x $B/p/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
ncu_alt m p 4096
torch_prefill
layer_rounds 200 p m m p p m
ex_table m p
# The SM clock and board power while the FP8 layer at M=4096 runs (eager and graph, 40
# iterations each): the median of the samples drawing over 300 W.
for v in m p m p; do
  left 240 "clock $v" || break
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 > $L/clk_$v.$$.csv &
  smi=$!; sleep 0.3
  timeout 40 $B/$v/mxmoe bench --tokens 4096 --iterations 40 --precision fp8 > $L/clk_${v}_bench.$$.log 2>&1
  kill $smi; wait $smi 2>/dev/null
  note "clock $v $(python3 -c "
import sys,statistics as st
r=[tuple(float(x) for x in l.split(',')) for l in open(sys.argv[1]) if l.strip() and l[0].isdigit()]
b=[c for c,p in r if p>300]
print('%d of %d samples over 300 W: SM clock median %.0f MHz, power median %.0f W' % (len(b),len(r),st.median(b) if b else 0,st.median([p for c,p in r if p>300]) if b else 0))" $L/clk_$v.$$.csv) $(awk '$2!="mode"&&$1==4096{printf "%s %s us ", $2, $4}' $L/clk_${v}_bench.$$.log)"
  sleep 2
done
for v in m p; do
  timeout 30 $B/$v/mxmoe bench --tokens 1,8,16,32 --iterations 20 > $L/${v}_dec.log 2>&1
  note "decode $v rc=$? graph M:us $(awk '$2=="graph"{printf "%s:%s ", $1, $4}' $L/${v}_dec.log)"
done
left 300 "p's tests" && gtests p $B/p '*' 200
left 480 "p's memcheck" && memcheck p $B/p 'Fp8Mode.NarrowTiles*:Fp8Mode.Tails*:Prefill.*'
for tool in racecheck synccheck; do left 500 "p's $tool" && sancheck p $B/p $tool 'Fp8Mode.NarrowTiles*:Prefill.*'; done
left 500 "validate exact" && { timeout 70 $B/p/mxmoe validate --suite all --backend cuda > $L/p_validate.log 2>&1
  note "p validate all exact rc=$? $(grep -E 'passed' $L/p_validate.log | tail -1) $(el)"; }
left 530 "validate fp8 smoke" && { timeout 45 $B/p/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/p_validate_fp8.log 2>&1
  note "p validate smoke fp8 rc=$? $(grep -E 'passed' $L/p_validate_fp8.log | tail -1) $(el)"; }
pack_logs
