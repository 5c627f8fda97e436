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
ncu_alt m x 4096
torch_prefill
layer_rounds 200 m x x m
ex_table m x
left 260 "x's tests" && gtests x $B/x '*' 260  # the whole binary: ~230 s on an H100 (session 62)
left 500 "x's memcheck" && memcheck x $B/x 'Fp8Mode.NarrowTiles*:Fp8Mode.Tails*:Prefill.*'
for tool in racecheck synccheck; do left 540 "x's $tool" && sancheck x $B/x $tool 'Fp8Mode.NarrowTiles*:Prefill.*'; done
pack_logs
