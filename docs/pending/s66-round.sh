#!/usr/bin/env bash
# Session 66: one device call, whichever GPU comes. On an H200, main's issue-figures round
# (.gpubin/s64m, main 5327533's kernels = main's now); on anything else (an H100 mostly),
# which of the prefill chain's links pay (.gpubin/s65c, s65-links-round.sh), since main's
# round on an H100 was run twice in session 64.
# carry [".gpubin/s64m", ".gpubin/s65c"]; ROUND_S=<the call's limit> bash docs/pending/s66-round.sh
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
case "$gpu" in
  *H200*) ROUND_S=${ROUND_S:-560} bash .gpubin/s64m/s64-main-round.sh ;;
  *)      ROUND_S=${ROUND_S:-300} bash .gpubin/s65c/s65-links-round.sh ;;
esac
