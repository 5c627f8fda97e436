#!/usr/bin/env bash
# Session 63 (for the next session): main (9156049: e, x and p landed) on whatever GPU
# comes; the issues' figures count only on an H200. Main's FP8 (three rounds), exact
# (two) and decode (two) layers beside the PyTorch baselines of the same run, the SM
# clock under the FP8 M=4096 load (clock_probe), then every single-GPU test binary:
# test_layer_args, test_error_flags, test_suite_cuda (the coverage matrix on the GPU),
# test_engine with what is left, and validate --suite all --precision fp8 last (~150 s
# alone, not run on the landed kernels yet).
# Pack, from a build of main (cmake -B build-gpu -DCMAKE_BUILD_TYPE=Release
# -DMXMOE_CUDA_ARCHS=90a; targets mxmoe_cli test_engine test_suite_cuda test_error_flags
# test_layer_args; the test binaries are under build-gpu/tests/):
#   tar cf - m/mxmoe m/test_engine m/test_suite_cuda m/test_error_flags m/test_layer_args | xz -T2 -9e > .gpubin/s64m/bins.tar.xz
#   cp docs/pending/{s64-main-round.sh,round_lib.sh,ncu_table.py} .gpubin/s64m/; git rev-parse --short HEAD > .gpubin/s64m/BUILT
# then: ROUND_S=<the call's limit> bash .gpubin/s64m/s64-main-round.sh, carry [".gpubin/s64m"]
set -u
B=/tmp/b64m; mkdir -p $B && [ -x $B/m/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B; m=$B/m
. "$(dirname "$0")/round_lib.sh"
R=${ROUND_S:-590}  # the call's seconds
note "main $(cat "$(dirname "$0")/BUILT" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
for t in test_layer_args test_error_flags; do
  timeout 30 $m/$t --gtest_brief=1 > $L/$t.log 2>&1; note "$t rc=$? $(passed $L/$t.log) $(el)"
  grep -E "FAILED|Failure" $L/$t.log | head -3 | tee -a $S
done
torch_prefill
f8 m $m 1
timeout 45 $m/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --baseline $L/T.json \
  --json $L/m_exact_1.json > $L/m_exact_1.log 2>&1; note "exact r1 rc=$? $(summ $L/m_exact_1.json) $(el)"
f8 m $m 2
timeout 45 $m/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --baseline $L/T.json \
  --json $L/m_exact_2.json > $L/m_exact_2.log 2>&1; note "exact r2 rc=$? $(summ $L/m_exact_2.json) $(el)"
f8 m $m 3
decode_rounds m $m 2
clock_probe m $m 4096
left $(( R - 200 )) "test_suite_cuda" && { timeout 150 $m/test_suite_cuda --gtest_brief=1 > $L/test_suite_cuda.log 2>&1
  note "test_suite_cuda rc=$? $(passed $L/test_suite_cuda.log) $(el)"; grep -E "FAILED|Failure" $L/test_suite_cuda.log | head -3 | tee -a $S; }
left $(( R - 180 )) "test_engine" && gtests m $m '*' 175  # ~110-170 s whole on an H100 (session 63)
left $(( R - 40 )) "validate fp8" && { timeout $(( R - 10 - $(date +%s) + t0 )) $m/mxmoe validate --suite all --backend cuda \
    --precision fp8 > $L/m_validate_fp8.log 2>&1
  note "validate all fp8 rc=$? $(grep -E 'passed' $L/m_validate_fp8.log | tail -1) $(el)"; }
pack_logs
