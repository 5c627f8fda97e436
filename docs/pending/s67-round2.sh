#!/usr/bin/env bash
# Session 67, run 2: the landed form (heuristics.h pf_decode_shared_shift: the 12-op decode
# at the 96- and 128-token tiles, the 13-op one at 32 and 64) on whatever GPU comes: its
# decode tests (both forms, every 32-bit word), test_suite_cuda and a memcheck of the
# prefill tests first, then the exact layer against main at M = 16 / 32 / 64 / 128 / 1024
# (three alternating rounds, graph and eager), then the rest of its test_engine with the
# time left. ROUNDS=0 skips the timing (the landed kernels' SASS is run 1's at the
# 96- and 128-token tiles and main's at 32 and 64, sass_loops.py --compare).
# Pack (.gpubin/s67b, ignored): from build-gpu at the landed commit,
#   mkdir -p f && cp build-gpu/mxmoe build-gpu/tests/test_engine build-gpu/tests/test_suite_cuda f/
#   tar cf - f | xz -T2 -6 > .gpubin/s67b/bins.tar.xz; rm -r f
# carry [".gpubin/s64m", ".gpubin/s67b"]; ROUND_S=<the call's limit> bash docs/pending/s67-round2.sh
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $gpu"
B=/tmp/b64m; mkdir -p $B && [ -x $B/m/mxmoe ] || tar xJf .gpubin/s64m/bins.tar.xz -C $B; m=$B/m
V=/tmp/b67; mkdir -p $V && [ -x $V/f/mxmoe ] || tar xJf .gpubin/s67b/bins.tar.xz -C $V; f=$V/f
. "$(dirname "$0")/round_lib.sh"
note "main $(cat .gpubin/s64m/BUILT) against f on $gpu"
R=${ROUND_S:-560}
gtests f $f 'E2m1Decode.*:Prefill.Fp4ToBf16*:PrefillKernels.*' 90
timeout 160 $f/test_suite_cuda --gtest_brief=1 > $L/f_suite.log 2>&1
note "f test_suite_cuda rc=$? $(passed $L/f_suite.log) $(el)"; grep -E "FAILED|Failure" $L/f_suite.log | head -3 | tee -a $S
memcheck f $f 'Prefill*:Layer.Prefill*'
mkdir -p $L/ex
for r in $(seq 1 ${ROUNDS:-3}); do
  order="m f"; [ $r = 2 ] && order="f m"
  for b in $order; do
    left $(( R - 150 )) "exact $b r$r" || break 2
    bin=$m; [ $b = f ] && bin=$f
    timeout 60 $bin/mxmoe bench --tokens 16,32,64,128,1024 --iterations 20 --json $L/ex/${b}_f8_$r.json \
      > $L/ex/${b}_$r.log 2>&1
    note "exact $b r$r rc=$? $(summ $L/ex/${b}_f8_$r.json) $(el)"
  done
done
[ ${ROUNDS:-3} -gt 0 ] && { note "exact, graph (us, ROUNDS rounds; f against m, medians):"; L=$L/ex f8_table m f
  note "eager:"; L=$L/ex MODE=eager f8_table m f; }
T=$(( R - 15 - $(date +%s) + t0 )); [ $T -gt 30 ] && gtests f_rest $f '-E2m1Decode.*:Prefill.Fp4ToBf16*:PrefillKernels.*' $T || note "test_engine (the rest) skipped: ${T} s left"
pack_logs
