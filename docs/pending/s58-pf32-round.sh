#!/usr/bin/env bash
# Session 58: the exact prefill path's 32-token GEMM1 epilogue reads the expert's offset
# and count where it uses them (after pass 1) instead of holding them over the tile:
# ptxas 0 bytes of spill for activation kinds 0, 2 and 3 (SiTU alpha 4, Kimi-K3's), where
# main keeps 4; kinds 1 and 4 keep 4 / 16. p = main 8791ac4 + that change (built in
# /tmp/s57-k); o = main 4e48197's mxmoe (.gpubin/s57g2), the same prefill kernels but this.
# Pack: tar cf - p/mxmoe p/test_engine | xz -9e > .gpubin/s58p/bins.tar.xz; cp this and
# round_lib.sh to .gpubin/s58p/; run with carry [".gpubin/s57g2", ".gpubin/s58p"] (~320 s).
# Prediction: M=16 / 32 (the 32-token tile) within noise; M=1..8 (decode path) unchanged.
set -u
B=/tmp/b58p; mkdir -p $B && tar xJf .gpubin/s58p/bins.tar.xz -C $B && tar xJf .gpubin/s57g2/bins.tar.xz -C $B o/mxmoe
o=$B/o; p=$B/p
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
gtests p $p 'Prefill.*:Layer.*:DecodeKernels.*' 60
memcheck p $p 'Prefill.*'
timeout 70 $p/mxmoe validate --suite all --backend cuda > $L/p_validate.log 2>&1
note "p validate all rc=$? $(grep -E 'passed' $L/p_validate.log | tail -1) $(el)"
timeout 30 python3 bench/torch_baseline.py --tokens 16,32,48 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
note "torch rc=$? $(el)"
pf() { timeout 30 $2/mxmoe bench --tokens 16,32,48 --iterations 20 --baseline $L/Td.json \
    --json $L/${1}_pf_$3.json > $L/${1}_pf_$3.log 2>&1; note "pf32 $1 r$3 rc=$? $(summ $L/${1}_pf_$3.json) $(el)"; }
left 150 "round 1" && { pf o $o 1; pf p $p 1; }
left 170 "round 2" && { pf p $p 2; pf o $o 2; }
left 190 "round 3" && { pf o $o 3; pf p $p 3; }
left 200 "Gemm1Act" && gtests p1 $p 'Gemm1Act.*' 110
python3 bench/compare_runs.py $L --variants o,p --rounds 1,2,3 --pattern '{v}_pf_{r}.json' 2>&1 | tee -a $S
cat $S
pack_logs
