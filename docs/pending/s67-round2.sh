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
. "$(dirname "$0")/round_lib.sh"
gpu=$(gpu_name); echo "GPU: $gpu"
m=$(unpack .gpubin/s64m /tmp/b64m m); f=$(unpack .gpubin/s67b /tmp/b67 f)
note "main $(cat .gpubin/s64m/BUILT) against f on $gpu"
R=${ROUND_S:-560}
gtests f $f 'E2m1Decode.*:Prefill.Fp4ToBf16*:PrefillKernels.*' 90
suite_cuda f $f
memcheck f $f 'Prefill*:Layer.Prefill*'
ab_rounds $(( R - 150 )) 16,32,64,128,1024 20 ${ROUNDS:-3} m $m f $f
[ ${ROUNDS:-3} -gt 0 ] && { note "exact, graph (us, ROUNDS rounds; f against m, medians):"; L=$L/ex f8_table m f
  note "eager:"; L=$L/ex MODE=eager f8_table m f; }
T=$(( R - 15 - $(date +%s) + t0 )); [ $T -gt 30 ] && gtests f_rest $f '-E2m1Decode.*:Prefill.Fp4ToBf16*:PrefillKernels.*' $T || note "test_engine (the rest) skipped: ${T} s left"
pack_logs
