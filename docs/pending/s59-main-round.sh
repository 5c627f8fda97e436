#!/usr/bin/env bash
# Main 5be37c9 (session 58's code: the decode kernels without local memory, and
# common.cuh most_local_bytes) on whatever GPU comes: the issues' figures count only on an H200. Pack
# from a build of main (mxmoe_cli and the GPU test binaries; session 59 packed it from
# /tmp/s57-k/build-gpu):
#   tar cf - m/mxmoe m/test_engine m/test_suite_cuda m/test_error_flags m/test_layer_args | xz -9e > .gpubin/s59m/bins.tar.xz
#   cp docs/pending/s59-main-round.sh docs/pending/round_lib.sh .gpubin/s59m/; a BUILT file
# then: ROUND_S=<the call's limit> bash .gpubin/s59m/s59-main-round.sh with carry
# [".gpubin/s59m"] (~450 s with the whole test_engine). Order: the quick test binaries,
# then main's figures beside the PyTorch baseline of the same run (the issues' sizes),
# then test_suite_cuda, then test_engine with what is left of the call.
set -u
B=/tmp/b59m; mkdir -p $B && tar xJf .gpubin/s59m/bins.tar.xz -C $B; m=$B/m
. "$(dirname "$0")/round_lib.sh"
note "main $(cat .gpubin/s59m/BUILT)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
for t in test_layer_args test_error_flags; do
  timeout 30 $m/$t --gtest_brief=1 > $L/$t.log 2>&1; note "$t rc=$? $(passed $L/$t.log) $(el)"
  grep -E "FAILED|Failure" $L/$t.log | head -3 | tee -a $S
done
gtests dk $m 'DecodeKernels.*' 20
torch_prefill
timeout 45 $m/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision exact --baseline $L/T.json \
  --json $L/m_ex.json > $L/m_ex.log 2>&1; note "exact rc=$? $(summ $L/m_ex.json) $(el)"
f8 m $m 1; f8 m $m 2
timeout 50 python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
for r in 1 2; do
  timeout 40 $m/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json --json $L/m_dec_$r.json > $L/m_dec_$r.log 2>&1
  note "decode r$r rc=$? $(summ $L/m_dec_$r.json) $(el)"
done
timeout 120 $m/test_suite_cuda --gtest_brief=1 > $L/test_suite_cuda.log 2>&1
note "test_suite_cuda rc=$? $(passed $L/test_suite_cuda.log) $(el)"; grep -E "FAILED|Failure" $L/test_suite_cuda.log | head -3 | tee -a $S
R=${ROUND_S:-540}  # the call's seconds: test_engine takes what is left of them (~170 s whole on an H100)
left $(( R - 60 )) "test_engine" && { timeout $(( R - 10 - $(date +%s) + t0 )) $m/test_engine --gtest_brief=1 > $L/test_engine.log 2>&1
  note "test_engine rc=$? $(passed $L/test_engine.log) $(el)"; grep -E "FAILED|Failure" $L/test_engine.log | head -3 | tee -a $S; }
cat $S
pack_logs
