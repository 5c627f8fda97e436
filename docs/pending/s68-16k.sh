#!/usr/bin/env bash
# Session 68, run 4: issue 5's largest case, M=16384 (its targets hold for every M >= 1024),
# on main d2e4033's binaries: the PyTorch BF16 baseline, then the exact and the FP8 layer in
# two alternating rounds beside it (graph replay and eager, median of 5).
# carry [".gpubin/s67m"]; bash docs/pending/s68-16k.sh
set -u
. "$(dirname "$0")/round_lib.sh"
m=$(unpack .gpubin/s67m /tmp/b67m m)
note "main $(cat .gpubin/s67m/BUILT) on $(gpu_name)"
m16k m $m 2
pack_logs
