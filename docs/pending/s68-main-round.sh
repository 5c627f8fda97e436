#!/usr/bin/env bash
# Session 68: main's issue-figures round in two calls (one call's 600 s holds either half),
# from the binaries in PACK (default .gpubin/s67m: main d2e4033's mxmoe and test binaries,
# packed as s64-main-round.sh's header says; main's code has not changed since).
#   PART=1: the figures. The PyTorch BF16 baseline, main's FP8 (three rounds) and exact (two)
#     layers at M=128..4096, M=16384 (both precisions, one round each), decode M=1..32 (two
#     rounds), the SM clock under the FP8 M=4096 load, then test_suite_cuda. ~330 s.
#   PART=2: the tests. test_layer_args, test_error_flags, the whole test_engine,
#     compute-sanitizer memcheck / synccheck of the prefill, layer and FP8-mode tests and
#     racecheck of the prefill ones, validate --suite all (exact, then FP8). ~420 s.
# carry ["<PACK>"]; PART=1|2 ROUND_S=<the call's limit> bash docs/pending/s68-main-round.sh
set -u
. "$(dirname "$0")/round_lib.sh"
P=${PACK:-.gpubin/s67m}; m=$(unpack $P /tmp/bmain m); R=${ROUND_S:-560}
note "main $(cat $P/BUILT) on $(gpu_name), part ${PART:-1}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
if [ "${PART:-1}" = 1 ]; then
  torch_prefill
  for r in 1 2 3; do
    f8 m $m $r
    [ $r = 3 ] && break
    exact_bench m $m $r
  done
  m16k m $m 1
  decode_rounds m $m 2
  clock_probe m $m 4096
  left $(( R - 160 )) "test_suite_cuda" && suite_cuda m $m
else
  for t in test_layer_args test_error_flags; do
    timeout 30 $m/$t --gtest_brief=1 > $L/$t.log 2>&1; note "$t rc=$? $(passed $L/$t.log) $(el)"
    grep -E "FAILED|Failure" $L/$t.log | head -3 | tee -a $S
  done
  gtests m $m '*' 175
  SAN_S=90 memcheck m $m 'Prefill*:Layer.Prefill*:Fp8Mode.*'
  SAN_S=90 sancheck m $m synccheck 'Prefill*:Layer.Prefill*:Fp8Mode.*'
  left $(( R - 230 )) "racecheck" && SAN_S=120 sancheck m $m racecheck 'Prefill*:Layer.Prefill*'
  for p in exact fp8; do
    T=$(( R - 10 - $(date +%s) + t0 )); [ $T -gt 60 ] || { note "validate $p skipped: ${T} s left"; continue; }
    timeout $T $m/mxmoe validate --suite all --backend cuda --precision $p > $L/m_validate_$p.log 2>&1
    note "validate all $p rc=$? $(grep -E 'passed' $L/m_validate_$p.log | tail -1) $(el)"
  done
fi
pack_logs
