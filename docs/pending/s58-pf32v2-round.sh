#!/usr/bin/env bash
# The exact prefill path's 32-token GEMM1 epilogue without its spill, second form
# (docs/pending/s58-pf32-epilogue-v2.patch): the expert's offset loaded right after pass
# 1's barrier, so that the scales' computation (~195 instructions before the first store
# that needs it) covers its latency; the count read where it is used. The first form
# (s58-pf32-epilogue.patch, the load after the scales) cost +0.8% at M=32 (session 58,
# H100). ptxas: 0 bytes for kinds 0, 2 and 3 (SiTU alpha 4, Kimi-K3's); kinds 1 and 4
# keep 4 / 16; kind 3's SASS 3488 instructions as main's, mainloop unchanged (199).
# q = main 8791ac4 (f7e295f: the same code) + the v2 patch (built in /tmp/s57-k,
# session 58); o = main 4e48197's mxmoe (.gpubin/s57g2: the same prefill kernels but this). Pack:
#   tar cf - q/mxmoe q/test_engine | xz -9e > .gpubin/s58q/bins.tar.xz
#   cp docs/pending/s58-pf32v2-round.sh docs/pending/round_lib.sh .gpubin/s58q/
# then: bash .gpubin/s58q/s58-pf32v2-round.sh with carry [".gpubin/s57g2", ".gpubin/s58q"]
# (~320 s; call limit >= 330). Prediction: M=16 / 32 / 48 within noise (+-0.3%).
set -u
B=/tmp/b58q; mkdir -p $B && tar xJf .gpubin/s58q/bins.tar.xz -C $B && tar xJf .gpubin/s57g2/bins.tar.xz -C $B o/mxmoe
o=$B/o; q=$B/q
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
gtests q $q 'Prefill.*:Layer.*:DecodeKernels.*' 60
memcheck q $q 'Prefill.*'
timeout 70 $q/mxmoe validate --suite all --backend cuda > $L/q_validate.log 2>&1
note "q validate all rc=$? $(grep -E 'passed' $L/q_validate.log | tail -1) $(el)"
timeout 30 python3 bench/torch_baseline.py --tokens 16,32,48 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
note "torch rc=$? $(el)"
pf() { timeout 30 $2/mxmoe bench --tokens 16,32,48 --iterations 20 --baseline $L/Td.json \
    --json $L/${1}_pf_$3.json > $L/${1}_pf_$3.log 2>&1; note "pf32 $1 r$3 rc=$? $(summ $L/${1}_pf_$3.json) $(el)"; }
left 150 "round 1" && { pf o $o 1; pf q $q 1; }
left 165 "round 2" && { pf q $q 2; pf o $o 2; }
left 180 "round 3" && { pf o $o 3; pf q $q 3; }
left 195 "round 4" && { pf q $q 4; pf o $o 4; }
left 205 "Gemm1Act" && gtests q1 $q 'Gemm1Act.*' 110
python3 bench/compare_runs.py $L --variants o,q --rounds 1,2,3,4 --pattern '{v}_pf_{r}.json' 2>&1 | tee -a $S
cat $S
pack_logs
