#!/usr/bin/env bash
# The short form of s53-round.sh (packed beside it by s53-build.sh into .gpubin/s53a as
# round_min.sh): the same round with SHORT=1, for little device time (session 53's run 1).
d=$(dirname "$0"); r=$d/round.sh; [ -f "$r" ] || r=$d/s53-round.sh
SHORT=1 exec bash "$r"
