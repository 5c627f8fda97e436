#!/usr/bin/env bash
# Session 68, run 1. On an H200: main's issue-figures round from the landed code
# (.gpubin/s67m/s64-main-round.sh, d2e4033's binaries; this is what ran). Elsewhere: the
# landed test_engine's decode tests (never run on a GPU: session 67's run 2 found no
# machine), then s67-fence-round.sh (s67-gemm2-no-fence.patch's build against main) with
# the time left. (As run, the other branch repeated s67-fence-round.sh's body and then ran
# the rest of the landed test_engine; it never ran and now calls the script instead.)
# carry [".gpubin/s67m", ".gpubin/s67f"]; ROUND_S=<the call's limit> bash docs/pending/s68-round.sh
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $gpu"
case "$gpu" in *H200*) ROUND_S=${ROUND_S:-560} exec bash .gpubin/s67m/s64-main-round.sh ;; esac
. "$(dirname "$0")/round_lib.sh"
m=$(unpack .gpubin/s67m /tmp/b67m m)
R=${ROUND_S:-560}
gtests m $m 'E2m1Decode.*:Prefill.Fp4ToBf16*:PrefillKernels.*' 90
ROUND_S=$(( R - $(date +%s) + t0 )) exec bash "$(dirname "$0")/s67-fence-round.sh"
