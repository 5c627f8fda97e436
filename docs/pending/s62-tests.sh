#!/usr/bin/env bash
# Session 62: c's test_engine past what s60-c-round.sh ran (every test but Fp8Mode.* and the
# 32-local-expert layer test), then validate --suite all on the CUDA backend, exact and fp8
# (the fp8 suite takes ~100 s on an H100: session 62 cut it at 60 s, then ran it alone).
set -u
B=/tmp/b60c; mkdir -p $B && [ -x $B/c/test_engine ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
gtests c $B/c '-Fp8Mode.*:Layer.PrefillPastThirtyTwoLocalExpertsMatchesReference' 380
for p in exact fp8; do
  timeout 200 $B/c/mxmoe validate --suite all --backend cuda --precision $p > $L/c_val_$p.log 2>&1
  note "c validate all $p rc=$? $(grep -E 'passed, .* failed' $L/c_val_$p.log | tail -1) $(el)"
done
pack_logs
