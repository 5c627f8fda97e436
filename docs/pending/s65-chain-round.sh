#!/usr/bin/env bash
# Session 65: the exact prefill path's chain after x's staging as programmatic launches
# (heuristics.h programmatic_prefill_links: GEMM1's prefill kernel after the staging,
# GEMM2's after GEMM1's fallback, finalize after GEMM2's fallback). c = the change, u = the
# same binary with MXMOE_PF_CHAIN=0 (the chain off, all else as c), k1 / k3 the same with
# the GEMM1 link alone / GEMM1's and GEMM2's (MXMOE_PF_CHAIN=1 / 3), m = main (.gpubin/s64m,
# 5327533). The new test first, the layer rounds (exact M=16..4096, three alternating
# rounds; decode M=1 / 8, two), then c's GPU tests: memcheck of the chain's test, the
# whole test_engine, test_suite_cuda, test_error_flags, test_layer_args and
# validate --suite all --backend cuda, each while time is left.
# Pack (main f76f5cc + `git apply docs/pending/s65-chain.patch`, as 73b44f4 was): cmake
# --build build-gpu --target mxmoe_cli test_engine test_suite_cuda
# test_error_flags test_layer_args, then (c/ holding mxmoe and the four test binaries)
#   tar cf - c | xz -T2 -9e > .gpubin/s65c/bins.tar.xz
#   cp docs/pending/{s65-chain-round.sh,round_lib.sh} .gpubin/s65c/; git rev-parse --short HEAD > .gpubin/s65c/BUILT
# then: ROUND_S=<the call's limit> bash .gpubin/s65c/s65-chain-round.sh, carry [".gpubin/s64m", ".gpubin/s65c"]
set -u
B=/tmp/b65c; mkdir -p $B
[ -x $B/c/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
[ -x $B/m/mxmoe ] || tar xJf "$(dirname "$0")/../s64m/bins.tar.xz" -C $B m/mxmoe
. "$(dirname "$0")/round_lib.sh"
R=${ROUND_S:-590}
c=$B/c
note "c built from $(cat "$(dirname "$0")/BUILT" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
gtests c $c 'Layer.PrefillProgrammatic*' 120
mkdir -p $L/ex
run_ex() {  # NAME ROUND [ENV...]: the exact layer at the prefill path's sizes (c's binary but for m)
  local v=$1 r=$2 bin=$c; shift 2; [ $v = m ] && bin=$B/m
  env "$@" timeout 60 $bin/mxmoe bench --tokens 16,32,64,128,512,1024,4096 --iterations 10 \
    --json $L/ex/${v}_f8_$r.json > $L/ex/${v}_$r.log 2>&1
  note "exact $v r$r rc=$? $(summ $L/ex/${v}_f8_$r.json) $(el)"; }
# k1: GEMM1's link alone (MXMOE_PF_CHAIN=1), k3: GEMM1's and GEMM2's (3), one round; c: all three (7)
for r in $(seq 1 ${ROUNDS:-3}); do  # ROUNDS: fewer when the call is short
  run_ex m $r; run_ex u $r MXMOE_PF_CHAIN=0; run_ex c $r
  [ $r -eq 1 ] && { run_ex k1 $r MXMOE_PF_CHAIN=1; run_ex k3 $r MXMOE_PF_CHAIN=3; }
done
for r in $(seq 1 ${DEC:-2}); do  # DEC=0: no decode rounds
  for v in m c; do
    timeout 40 $B/$v/mxmoe bench --tokens 1,8 --iterations 20 --json $L/${v}_dec_$r.json > $L/${v}_dec_$r.log 2>&1
    note "decode $v r$r rc=$? $(summ $L/${v}_dec_$r.json) $(el)"
  done
done
note "exact path (the files are named _f8_ for f8_table):"; L=$L/ex f8_table u m c k1 k3; L=${L%/ex}
# memcheck of the chain's test (three layers: ~1.5x session 64's, so 110 s, not round_lib's 60)
left $(( R - 130 )) "memcheck" && SAN_S=110 memcheck c $c 'Layer.PrefillProgrammatic*'
left $(( R - 180 )) "whole test_engine" && gtests call $c '*' 175
for t in test_error_flags test_layer_args; do
  left $(( R - 40 )) "$t" && { timeout 30 $c/$t --gtest_brief=1 > $L/$t.log 2>&1; note "$t rc=$? $(passed $L/$t.log) $(el)"
    grep -E "FAILED|Failure" $L/$t.log | head -3 | tee -a $S; }
done
left $(( R - 160 )) "test_suite_cuda" && { timeout 150 $c/test_suite_cuda --gtest_brief=1 > $L/test_suite_cuda.log 2>&1
  note "test_suite_cuda rc=$? $(passed $L/test_suite_cuda.log) $(el)"; grep -E "FAILED|Failure" $L/test_suite_cuda.log | head -3 | tee -a $S; }
left $(( R - 60 )) "validate" && { timeout $(( R - 10 - $(date +%s) + t0 )) $c/mxmoe validate --suite all --backend cuda \
    > $L/c_validate.log 2>&1; note "validate all rc=$? $(grep -E 'passed' $L/c_validate.log | tail -1) $(el)"; }
pack_logs
