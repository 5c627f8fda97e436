#!/usr/bin/env bash
# Session 62, e: 51389be's narrow tiles with the consumers' group-loop addresses set up
# once per kernel and broadcast by a shuffle (F8GroupAddrs), so that ptxas keeps them in
# uniform registers instead of re-deriving the shared window's base (S2UR SR_CgaCtaId and
# ~8 uniform instructions) in every group and at every tile's start, as it did in 51389be
# (GEMM2's group loop: 99 instructions, main 109, 51389be 110). Against main 610a4e0 (m):
# ncu of gemm1_fp8 / gemm2_fp8 at M=4096 (51389be: +0.7% in both), e's FP8 GPU tests,
# then the layer in alternating rounds as time allows (~280 s in all). Pack:
#   tar cf - m/mxmoe e/mxmoe e/test_engine | xz -T2 -6 > .gpubin/s62e/bins.tar.xz
# with ncu_table.py and round_lib.sh beside it; run: bash .gpubin/s62e/s62-e-round.sh,
# carry [".gpubin/s62e"].
set -u
B=/tmp/b62e; mkdir -p $B && [ -x $B/e/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
for vm in m:4096 e:4096 e:4096 m:4096; do
  v=${vm%:*}; m=${vm#*:}
  left 100 "ncu $v $m" && ncu_fp8 $v $B/$v $m
done
python3 "$(dirname "$0")/ncu_table.py" $L m e | tee -a $S
left 120 "e's FP8 tests" && gtests e $B/e 'Fp8Mode.*' 140
left 240 "layer rounds" && torch_prefill
for v in m e e m; do
  left 262 "layer $v" || break
  n=$(( $(ls $L/${v}_f8_*.json 2>/dev/null | wc -l) + 1 )); f8 $v $B/$v $n
done
ls $L/e_f8_*.json > /dev/null 2>&1 && f8_table m e
pack_logs
