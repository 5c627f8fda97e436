#!/usr/bin/env bash
# Session 57's second round: main 4e48197 (the permutation's [expert][block] counts, the
# per-device cache and env_knob landed) on whatever GPU comes; the issues' figures count
# only on an H200. Pack from a build of main (mxmoe_cli and the GPU test binaries):
#   tar cf - m/mxmoe m/test_engine m/test_suite_cuda m/test_error_flags m/test_layer_args | xz -9e > .gpubin/s57m/bins.tar.xz
#   cp docs/pending/s57-main-round.sh docs/pending/round_lib.sh .gpubin/s57m/
# then: ROUND_S=<the call's limit> bash .gpubin/s57m/s57-main-round.sh with carry [".gpubin/s57m"] (~400 s).
# Order: the GPU test binaries not run this session on this build's GPU kind first, then
# main's figures beside the PyTorch baseline of the same run, then the whole test_engine.
set -u
B=/tmp/b57m; mkdir -p $B && tar xJf .gpubin/s57m/bins.tar.xz -C $B; m=$B/m
. "$(dirname "$0")/round_lib.sh"
note "main $(cat .gpubin/s57m/BUILT)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
for t in test_layer_args test_error_flags test_suite_cuda; do
  timeout 150 $m/$t --gtest_brief=1 > $L/$t.log 2>&1; note "$t rc=$? $(passed $L/$t.log) $(el)"
  grep -E "FAILED|Failure" $L/$t.log | head -3 | tee -a $S
done
timeout 80 python3 bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $L/T.json > $L/T.log 2>&1
note "torch prefill rc=$? $(el)"
timeout 45 $m/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision exact --baseline $L/T.json \
  --json $L/m_ex.json > $L/m_ex.log 2>&1; note "exact rc=$? $(summ $L/m_ex.json) $(el)"
for r in 1 2; do
  timeout 45 $m/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision fp8 --baseline $L/T.json \
    --json $L/m_f8_$r.json > $L/m_f8_$r.log 2>&1; note "fp8 r$r rc=$? $(summ $L/m_f8_$r.json) $(el)"
done
timeout 50 python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
timeout 40 $m/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json --json $L/m_dec.json > $L/m_dec.log 2>&1
note "decode rc=$? $(summ $L/m_dec.json) $(el)"
R=${ROUND_S:-540}  # the call's seconds: test_engine takes what is left of them (~150 s whole on an H100)
left $(( R - 60 )) "test_engine" && { timeout $(( R - 10 - $(date +%s) + t0 )) $m/test_engine --gtest_brief=1 > $L/test_engine.log 2>&1
  note "test_engine rc=$? $(passed $L/test_engine.log) $(el)"; grep -E "FAILED|Failure" $L/test_engine.log | head -3 | tee -a $S; }
cat $S
pack_logs
