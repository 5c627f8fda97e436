# h200_dispatch.sh — sourced first by a device round script (session 66 on), from the
# repository root with carry [".gpubin/s64m"]: on an H200 it runs main's issue-figures
# round (.gpubin/s64m/s64-main-round.sh, ROUND_S default 560) in the script's place;
# elsewhere it unpacks main's binaries (m = their folder), sources round_lib.sh and
# returns, and the script goes on with its own work.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
case "$gpu" in *H200*) ROUND_S=${ROUND_S:-560} exec bash .gpubin/s64m/s64-main-round.sh ;; esac
B=/tmp/b64m; mkdir -p $B && [ -x $B/m/mxmoe ] || tar xJf .gpubin/s64m/bins.tar.xz -C $B; m=$B/m
. "$(dirname "${BASH_SOURCE[0]}")/round_lib.sh"
note "main $(cat .gpubin/s64m/BUILT) on $gpu"
