#!/usr/bin/env bash
# Session 68, run 1. On an H200: main's issue-figures round from the landed code
# (.gpubin/s67m/s64-main-round.sh, d2e4033's binaries). Elsewhere: the landed test_engine's
# decode tests (never run on a GPU: session 67's run 2 found no machine), then
# s67-gemm2-no-fence.patch's build (n, .gpubin/s67f) as s67-fence-round.sh has it (its
# tests, synccheck, three alternating rounds against main at M=128..4096, ncu of
# gemm2_prefill), then the rest of the landed test_engine with the time left.
# carry [".gpubin/s67m", ".gpubin/s67f"]; ROUND_S=<the call's limit> bash docs/pending/s68-round.sh
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $gpu"
case "$gpu" in *H200*) ROUND_S=${ROUND_S:-560} exec bash .gpubin/s67m/s64-main-round.sh ;; esac
. "$(dirname "$0")/round_lib.sh"
m=$(unpack .gpubin/s67m /tmp/b67m m); n=$(unpack .gpubin/s67f /tmp/b67f n)
note "main $(cat .gpubin/s67m/BUILT) against n on $gpu"
R=${ROUND_S:-560}
landed='E2m1Decode.*:Prefill.Fp4ToBf16*:PrefillKernels.*'
gtests m $m "$landed" 90
gtests n $n 'Prefill*:Layer.*:E2m1Decode.*' 200
suite_cuda n $n
memcheck n $n 'Prefill*:Layer.Prefill*'
sancheck n $n synccheck 'Prefill*:Layer.Prefill*'
ab_rounds $(( R - 240 )) 128,512,1024,4096 10 3 m $m n $n
note "exact, graph (us; n against m, medians):"; L=$L/ex f8_table m n
note "eager:"; L=$L/ex MODE=eager f8_table m n
for b in m n n m; do
  bin=$m; [ $b = n ] && bin=$n
  for M in 1024 4096; do
    left $(( R - 180 )) "ncu $b $M" && ncu_times $b $bin $M gemm2_prefill exact
  done
done
python3 "$RL_DIR/ncu_table.py" $L m n | tee -a $S
T=$(( R - 15 - $(date +%s) + t0 )); [ $T -gt 30 ] && gtests m_rest $m "-$landed:Prefill*:Layer.*" $T || note "test_engine (the rest) skipped: ${T} s left"
pack_logs
