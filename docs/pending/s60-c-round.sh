#!/usr/bin/env bash
# Session 60, round 3: c = the narrow tiles (no tile-order change) with the FP8 group loop
# on 32-bit shared addresses (GEMM2's loop 110 instructions against main's 109), against
# main (m). Pack: tar cf - m/mxmoe c/mxmoe c/test_engine | xz -T2 -6 > .gpubin/s60c/bins.tar.xz
# run: bash .gpubin/s60c/s60-c-round.sh with carry [".gpubin/s60c"] (~360 s); SHORT=1:
# six timing rounds instead of eight, no validation, earlier guards (~250 s).
set -u
SHORT=${SHORT:-0}
B=/tmp/b60c; mkdir -p $B && tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
gtests c $B/c 'Fp8Mode.NarrowTiles*' 40
torch_prefill
order="m c c m m c c m"; [ $SHORT = 1 ] && order="m c c m m c"
for v in $order; do
  n=$(( $(ls $L/${v}_f8_*.json 2>/dev/null | wc -l) + 1 )); f8 $v $B/$v $n
done
f8_table m c
if [ $SHORT = 1 ]; then g=(150 75 215 235); else g=(220 100 290 320); fi  # guards (s) and the tests' timeout
left ${g[0]} "c's FP8 tests" && gtests c $B/c 'Fp8Mode.*:Layer.PrefillPastThirtyTwoLocalExpertsMatchesReference:-Fp8Mode.NarrowTiles*' ${g[1]}
left ${g[2]} "c's memcheck" && memcheck c $B/c 'Fp8Mode.NarrowTiles*:Fp8Mode.Tails*'
for tool in racecheck synccheck; do left ${g[3]} "c's $tool" && sancheck c $B/c $tool 'Fp8Mode.NarrowTiles*'; done
[ $SHORT = 0 ] && left 340 "c's validation" && { timeout 40 $B/c/mxmoe validate --suite smoke --backend cuda --precision fp8 > $L/c_validate.log 2>&1
  note "c validate smoke fp8 rc=$? $(grep -E 'passed, .* failed' $L/c_validate.log | tail -1) $(el)"; }
pack_logs
