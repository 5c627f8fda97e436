#!/usr/bin/env bash
# Session 64: the prefill path's generic fallbacks with grid z 1 (heuristics.h
# generic_grid_z: 672 + 392 blocks at Kimi's shapes whatever M, instead of up to 4x that
# from M=64 on), against main e09413b (.gpubin/s64m's m/mxmoe); z's GPU tests.
# Predicted (run 3's probe: ~1.3 ns a block): M=16 / 32 unchanged (z was 1), M=64 -1.4 us,
# M=128 and up -4 us (M=128 -1.1%).
# Pack: z/mxmoe and z/test_engine from cmake --build build-gpu --target mxmoe_cli test_engine:
#   tar cf - z | xz -T2 -6 > .gpubin/s64z/bins.tar.xz; cp docs/pending/{s64-z-round.sh,round_lib.sh} .gpubin/s64z/
# then: ROUND_S=<the call's limit> bash .gpubin/s64z/s64-z-round.sh, carry [".gpubin/s64m", ".gpubin/s64z"]
set -u
B=/tmp/b64z; mkdir -p $B
[ -x $B/z/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
[ -x $B/m/mxmoe ] || tar xJf "$(dirname "$0")/../s64m/bins.tar.xz" -C $B m/mxmoe
. "$(dirname "$0")/round_lib.sh"
R=${ROUND_S:-590}
note "m = $(cat "$(dirname "$0")/../s64m/BUILT" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
gtests z $B/z 'Layer.PrefillProgrammatic*:Gemm1Act.*' 150
mkdir -p $L/ex
for r in 1 2 3; do
  for v in m z; do
    timeout 60 $B/$v/mxmoe bench --tokens 16,64,128,512,1024,4096 --iterations 10 \
      --json $L/ex/${v}_f8_$r.json > $L/ex/${v}_$r.log 2>&1
    note "exact $v r$r rc=$? $(summ $L/ex/${v}_f8_$r.json) $(el)"
  done
done
note "exact path (the files are named _f8_ for f8_table):"; L=$L/ex f8_table m z; L=${L%/ex}
left $(( R - 90 )) "memcheck" && memcheck z $B/z 'Layer.PrefillProgrammatic*'
left $(( R - 170 )) "whole test_engine" && gtests zall $B/z '*' 160
pack_logs
