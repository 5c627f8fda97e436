#!/usr/bin/env bash
# Session 58: the exact prefill path's 32-token GEMM1 epilogue without its spill, beside
# main at the sizes that tile serves. Variant V from pack PACK (V's mxmoe and test_engine),
# ROUNDS alternating rounds; o = main 4e48197's mxmoe (.gpubin/s57g2: the same prefill
# kernels but this change).
# - Run (session 58, H100): V=p PACK=s58p ROUNDS=3 (the defaults): p = main 8791ac4 +
#   docs/pending/s58-pf32-epilogue.patch (the offset loaded after the scales' computation,
#   the count read where used): ptxas 0 bytes for kinds 0, 2 and 3 (SiTU alpha 4,
#   Kimi-K3's), kinds 1 and 4 keep 4 / 16. M=32 came out +0.8% (PERFORMANCE.md).
# - Next: V=q PACK=s58q ROUNDS=4: q = main 8791ac4 + s58-pf32-epilogue-v2.patch (the load
#   right after pass 1's barrier, ~195 instructions ahead of its first use; same ptxas
#   result), built in /tmp/s57-k. Predicted: M=16 / 32 / 48 within noise (+-0.3%).
# Pack: tar cf - V/mxmoe V/test_engine | xz -9e > .gpubin/PACK/bins.tar.xz; cp this and
# round_lib.sh to .gpubin/PACK/; run `V=.. PACK=.. ROUNDS=.. bash .gpubin/PACK/s58-pf32-round.sh`
# with carry [".gpubin/s57g2", ".gpubin/PACK"] and a call limit of 330 s.
set -u
V=${V:-p}; PACK=${PACK:-s58p}; ROUNDS=${ROUNDS:-3}
B=/tmp/b$PACK; mkdir -p $B && tar xJf .gpubin/$PACK/bins.tar.xz -C $B && tar xJf .gpubin/s57g2/bins.tar.xz -C $B o/mxmoe
o=$B/o; v=$B/$V
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
gtests $V $v 'Prefill.*:Layer.*:DecodeKernels.*' 60
memcheck $V $v 'Prefill.*'
timeout 70 $v/mxmoe validate --suite all --backend cuda > $L/${V}_validate.log 2>&1
note "$V validate all rc=$? $(grep -E 'passed' $L/${V}_validate.log | tail -1) $(el)"
timeout 30 python3 bench/torch_baseline.py --tokens 16,32,48 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
note "torch rc=$? $(el)"
pf() { timeout 30 $2/mxmoe bench --tokens 16,32,48 --iterations 20 --baseline $L/Td.json \
    --json $L/${1}_pf_$3.json > $L/${1}_pf_$3.log 2>&1; note "pf32 $1 r$3 rc=$? $(summ $L/${1}_pf_$3.json) $(el)"; }
for r in $(seq 1 $ROUNDS); do  # o first in odd rounds, V first in even ones
  left $(( 130 + 20 * r )) "round $r" && if (( r % 2 )); then pf o $o $r; pf $V $v $r; else pf $V $v $r; pf o $o $r; fi
done
left $(( 200 + 20 * (ROUNDS - 3) )) "Gemm1Act" && gtests ${V}1 $v 'Gemm1Act.*' 110
python3 bench/compare_runs.py $L --variants o,$V --rounds $(seq -s, 1 $ROUNDS) --pattern '{v}_pf_{r}.json' 2>&1 | tee -a $S
cat $S
pack_logs
