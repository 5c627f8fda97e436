#!/usr/bin/env bash
# Session 64: the exact prefill path's small launches off its critical path (run 3's
# probe bounded them at 3.6-4.8% of the layer at M=16..128, H100): s = x's BF16 staging as
# a programmatic dependent of the permutation (it runs beside it); f = s + the generic
# fallbacks as programmatic dependents of the prefill GEMMs (dispatched in their tails).
# m = main (.gpubin/s64m's m/mxmoe, kernels of 9156049). f's GPU tests: the new
# Layer.PrefillProgrammaticLaunchesBitIdenticalToPlainOnes first, the layer rounds, then
# the prefill-path tests and memcheck, then the whole test_engine with what is left.
# Pack: build s (the staging change alone) and f (both) with cmake --build build-gpu
# --target mxmoe_cli test_engine; s/mxmoe, f/mxmoe and f/test_engine into
#   tar cf - s f | xz -T2 -6 > .gpubin/s64f/bins.tar.xz
#   cp docs/pending/{s64-pdl-round.sh,round_lib.sh} .gpubin/s64f/
# then: ROUND_S=<the call's limit> bash .gpubin/s64f/s64-pdl-round.sh, carry [".gpubin/s64m", ".gpubin/s64f"]
set -u
B=/tmp/b64f; mkdir -p $B
[ -x $B/f/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
[ -x $B/m/mxmoe ] || tar xJf "$(dirname "$0")/../s64m/bins.tar.xz" -C $B m/mxmoe
. "$(dirname "$0")/round_lib.sh"
R=${ROUND_S:-590}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
gtests f $B/f 'Layer.PrefillProgrammatic*' 120
mkdir -p $L/ex
for r in 1 2 3; do
  for v in m s f; do
    timeout 60 $B/$v/mxmoe bench --tokens 16,32,64,128,512,1024,4096 --iterations 10 \
      --json $L/ex/${v}_f8_$r.json > $L/ex/${v}_$r.log 2>&1
    note "exact $v r$r rc=$? $(summ $L/ex/${v}_f8_$r.json) $(el)"
  done
done
for r in 1 2; do
  for v in m f; do
    timeout 40 $B/$v/mxmoe bench --tokens 1,8 --iterations 20 --json $L/${v}_dec_$r.json > $L/${v}_dec_$r.log 2>&1
    note "decode $v r$r rc=$? $(summ $L/${v}_dec_$r.json) $(el)"
  done
done
note "exact path (the files are named _f8_ for f8_table):"; L=$L/ex f8_table m s f; L=${L%/ex}
left $(( R - 200 )) "prefill tests" && gtests f $B/f 'Layer.*:Gemm1Act.*:Gemm2.*:Prefill*:Permute.*:StageBf16.*' 200
left $(( R - 90 )) "memcheck" && memcheck f $B/f 'Layer.PrefillProgrammatic*'
left $(( R - 170 )) "whole test_engine" && gtests fall $B/f '*' 160
pack_logs
