#!/usr/bin/env bash
# Session 67, prepared, not run: GEMM2's TMA tiles (96 / 128 tokens) without the proxy
# fence after each `full` wait (docs/pending/s67-gemm2-no-fence.patch on f0a4aa2: the fence
# is for pf_producer's cp.async rows; pf_producer_tma's rows and words come by the async
# proxy). SASS: gemm2_prefill<128>'s chunk loop 185 -> 183, <96> reordered, nothing else
# changes. Run 0's ncu put the fence (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S) at 1.4% of
# gemm2_prefill<128>'s samples at M=1024. Whatever GPU comes: the variant's tests first
# (test_engine's prefill and layer tests, test_suite_cuda, memcheck and synccheck of the
# prefill tests), then the exact layer against main at M = 128 / 512 / 1024 / 4096 (three
# alternating rounds), then ncu of gemm2_prefill at M = 1024 / 4096 (main, n, n, main).
# Pack (.gpubin/s67f, ignored): from build-gpu with the patch applied,
#   mkdir -p n && cp build-gpu/mxmoe build-gpu/tests/test_engine build-gpu/tests/test_suite_cuda n/
#   tar cf - n | xz -T2 -6 > .gpubin/s67f/bins.tar.xz; rm -r n
# carry [".gpubin/s67m", ".gpubin/s67f"]; ROUND_S=<the call's limit> bash docs/pending/s67-fence-round.sh
set -u
. "$(dirname "$0")/round_lib.sh"
gpu=$(gpu_name); echo "GPU: $gpu"
m=$(unpack .gpubin/s67m /tmp/b67m m); n=$(unpack .gpubin/s67f /tmp/b67f n)
note "main $(cat .gpubin/s67m/BUILT) against n on $gpu"
R=${ROUND_S:-560}
gtests n $n 'Prefill*:Layer.*:E2m1Decode.*' 200
suite_cuda n $n
memcheck n $n 'Prefill*:Layer.Prefill*'
sancheck n $n synccheck 'Prefill*:Layer.Prefill*'
ab_rounds $(( R - 120 )) 128,512,1024,4096 10 3 m $m n $n
note "exact, graph (us; n against m, medians):"; L=$L/ex f8_table m n
for b in m n n m; do
  bin=$m; [ $b = n ] && bin=$n
  for M in 1024 4096; do
    left $(( R - 40 )) "ncu $b $M" && ncu_times $b $bin $M gemm2_prefill exact
  done
done
python3 "$RL_DIR/ncu_table.py" $L m n | tee -a $S
pack_logs
