#!/usr/bin/env bash
# Session 62 (run in session 63 as run 1): x = main + s62-narrow-tiles-e.patch +
# s62-exact-g1-addrs-x.patch (the FP8 narrow tiles with their addresses set up once, and
# the exact GEMM1's chunk loop without the shared window's re-derivation), against main
# (m); the two patches are commits 8a300f1 and 7f964af now, so build 92e87d0 (m) and
# 7f964af (x). ncu of the two FP8 kernels at M=4096, the exact and FP8 layers in alternating
# rounds, then x's whole test_engine and the sanitizers (~520 s).
# Pack: build main and main + both patches (cmake -B build-gpu -DCMAKE_BUILD_TYPE=Release
# -DMXMOE_CUDA_ARCHS=90a; targets mxmoe_cli, test_engine), then
#   tar cf - m/mxmoe x/mxmoe x/test_engine | xz -T2 -6 > .gpubin/s63x/bins.tar.xz
# with this script, round_lib.sh and ncu_table.py beside it; run:
#   bash .gpubin/s63x/s63-ex-round.sh   carry [".gpubin/s63x"]
set -u
B=/tmp/b63x; mkdir -p $B && [ -x $B/x/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
for vm in m:4096 x:4096 x:4096 m:4096; do
  v=${vm%:*}; m=${vm#*:}
  left 100 "ncu $v $m" && ncu_fp8 $v $B/$v $m
done
python3 "$(dirname "$0")/ncu_table.py" $L m x | tee -a $S
torch_prefill
mkdir -p $L/ex
for v in m x x m; do
  left 200 "layer rounds $v" || break
  n=$(( $(ls $L/${v}_f8_*.json 2>/dev/null | wc -l) + 1 )); f8 $v $B/$v $n
  timeout 60 $B/$v/mxmoe bench --tokens 128,1024,4096 --iterations 10 --baseline $L/T.json \
    --json $L/ex/${v}_f8_$n.json > $L/ex/${v}_ex_$n.log 2>&1
  note "exact $v r$n rc=$? $(summ $L/ex/${v}_f8_$n.json) $(el)"
done
f8_table m x
note "exact path (files named _f8_ for f8_table):"; L=$L/ex f8_table m x
L=${L%/ex}
left 260 "x's tests" && gtests x $B/x '*' 260  # the whole binary: ~230 s on an H100 (session 62)
left 500 "x's memcheck" && memcheck x $B/x 'Fp8Mode.NarrowTiles*:Fp8Mode.Tails*:Prefill.*'
for tool in racecheck synccheck; do left 540 "x's $tool" && sancheck x $B/x $tool 'Fp8Mode.NarrowTiles*:Prefill.*'; done
pack_logs
