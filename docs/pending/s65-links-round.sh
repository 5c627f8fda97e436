#!/usr/bin/env bash
# Session 65 (for the next session): which of the prefill chain's links pay, one at a time,
# with the build of s65-chain.patch in .gpubin/s65c (its knob MXMOE_PF_CHAIN takes the links
# as bits: 1 GEMM1's prefill kernel after x's staging, 2 GEMM2's after GEMM1's fallback,
# 4 finalize after GEMM2's fallback). Run 1's single round (PERFORMANCE.md session 65) read,
# under graph replay against the chain off, the GEMM1 link alone +1.2..+3.6% at M=16..512,
# while adding the GEMM2 link to it took 4.9 / 1.6 us back at M=16 / 32 and adding finalize's
# cost 1-12 us: so the GEMM2 link alone (2) may pay where the others do not. Three
# alternating rounds of u (0), k2, k6 (2 + 4), k1, c (7) at M=16..4096, graph and eager,
# then, if time is left, the whole test_engine with the chain as k2 (the layers built
# before Layer.PrefillProgrammatic* unsets the knob, and that test's `pdl` layer, have only
# that link; the tests after it run the default, all three) and the new test's memcheck.
# Pack: none beyond s65-chain-round.sh's (.gpubin/s65c); cp docs/pending/s65-links-round.sh .gpubin/s65c/
# then: ROUND_S=<the call's limit> bash .gpubin/s65c/s65-links-round.sh, carry [".gpubin/s65c"]
set -u
B=/tmp/b65c; mkdir -p $B
[ -x $B/c/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
R=${ROUND_S:-590}
c=$B/c
note "c built from $(cat "$(dirname "$0")/BUILT" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
mkdir -p $L/ex
run_links() {  # NAME ROUND KNOB
  MXMOE_PF_CHAIN=$3 timeout 60 $c/mxmoe bench --tokens 16,32,64,128,512,1024,4096 --iterations 10 \
    --json $L/ex/${1}_f8_$2.json > $L/ex/${1}_$2.log 2>&1
  note "exact $1 r$2 rc=$? $(summ $L/ex/${1}_f8_$2.json) $(el)"; }
for r in 1 2 3; do
  run_links u $r 0; run_links k2 $r 2; run_links k6 $r 6; run_links k1 $r 1; run_links c $r 7
done
note "graph (the files are named _f8_ for f8_table):"; L=$L/ex f8_table u k2 k6 k1 c; L=${L%/ex}
note "eager:"; MODE=eager L=$L/ex f8_table u k2 k6 k1 c; L=${L%/ex}
left $(( R - 180 )) "whole test_engine (k2)" && MXMOE_PF_CHAIN=2 gtests k2 $c '*' 175
left $(( R - 130 )) "memcheck (k2)" && MXMOE_PF_CHAIN=2 SAN_S=110 memcheck k2 $c 'Layer.PrefillProgrammatic*'
pack_logs
