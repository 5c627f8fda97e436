#!/usr/bin/env bash
# Session 69: three timing-only probes of a cheaper exact-prefill consumer beside main, on
# whatever GPU comes (results of p, q and r are WRONG by design: no tests, bench times only):
#   m  main d2e4033's binaries (.gpubin/s67m; main's kernels unchanged since)
#   p  session 68's FP16-operand probe (.gpubin/s68p, s68-f16-probe.patch): every prefill
#      chunk loop 185-196 -> 163-167 SASS instructions
#   q  this session's FP8-operand probe (.gpubin/s69q, s69-f8-probe.patch on 3f1b987, built
#      with -DMXMOE_PROBE_FP8_OPERANDS): the consumers turn each word of 8 E2M1 codes into
#      8 E4M3 bytes through a per-(row, block) table (two PRMTs) and issue one FP8 k32 wgmma
#      per MX block and m64 tile (4 per chunk instead of 8 BF16 k16): every prefill chunk
#      loop 185-196 -> 128-131 instructions. What the real design would add (an E4M3
#      activation tile, half the B bytes; fp32 promotion every 128 K with per-token scales,
#      a second accumulator set) is left out, so q is its upper bound.
#   r  q with the promotion (.gpubin/s69r, s69-f8-promote-probe.patch = q's patch and
#      -DMXMOE_PROBE_FP8_PROMOTE): each 128 K's wgmmas into a second accumulator set, then
#      kTok / 2 FFMAs per tile by per-token scales from shared memory. ptxas spills 544-572
#      bytes at the 128-token tile (M >= 1024 there: not this design's sizes), 8-44 at 96.
# The question: how much of issue 5's M=128 (345 us exact, target 222) and issue 4's
# M=16 / 32 (213 / 218 us, target 139) do ~33% fewer consumer instructions and half the
# tensor time buy?
# q's and r's kernels once at M=128 under ncu (no generic fallback may do the work),
# three rotating rounds of m, p, q, r at M=16..4096 (graph and eager), ncu of both prefill
# GEMMs at M=32 and 128 for m, r, q, p.
# carry [".gpubin/s67m", ".gpubin/s68p", ".gpubin/s69q", ".gpubin/s69r"]; ROUND_S=<the call's limit> bash docs/pending/s69-probes-round.sh
# As run (session 69, run 1), the rounds were written out here in the orders m p q r,
# r m q p, q r p m; now ab_rounds rotates the list (m p q r, p q r m, q r m p).
# Ran in session 69 (run 1, an H100): q's and r's wrong intermediates set the exact path's
# fallback word, so their GEMM2 prefill kernels left at once and the generic kernels did
# the layer; only their GEMM1 figures (ncu) count (PERFORMANCE.md session 69).
set -u
. "$(dirname "$0")/round_lib.sh"
m=$(unpack .gpubin/s67m /tmp/b67m m); p=$(unpack .gpubin/s68p /tmp/b68p p); q=$(unpack .gpubin/s69q /tmp/b69q q)
r=$(unpack .gpubin/s69r /tmp/b69r r)
note "main $(cat .gpubin/s67m/BUILT) against p ($(cat .gpubin/s68p/BUILT)), q ($(cat .gpubin/s69q/BUILT)) and r ($(cat .gpubin/s69r/BUILT)) on $(gpu_name)"
R=${ROUND_S:-300}
bin_of() { case $1 in m) echo $m ;; p) echo $p ;; q) echo $q ;; r) echo $r ;; esac; }
kernels_at q $q 128
kernels_at r $r 128
ab_rounds $(( R - 90 )) 16,32,64,128,1024,4096 10 3 m $m p $p q $q r $r
note "exact, graph (us; p, q and r against m, medians):"; L=$L/ex f8_table m p q r
note "eager:"; L=$L/ex MODE=eager f8_table m p q r
for b in m r q p; do
  for M in 32 128; do left $(( R - 35 )) "ncu $b $M" && ncu_times $b $(bin_of $b) $M 'gemm[12]_prefill' exact; done
done
python3 "$RL_DIR/ncu_table.py" $L m r | tee -a $S
python3 "$RL_DIR/ncu_table.py" $L m q | tee -a $S
python3 "$RL_DIR/ncu_table.py" $L m p | tee -a $S
pack_logs
