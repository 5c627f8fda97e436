#!/usr/bin/env bash
# Session 63, runs 2 and 3 (after s63-ex-round.sh, on the same warm machine and pack; the
# calls ran these lines inline): m = main, x = main + e + x, in alternating rounds.
#   bash .gpubin/s63x/s63-rounds-2-3.sh layer    # run 2: FP8 and exact layers, 4 rounds each, memcheck (~155 s)
#   bash .gpubin/s63x/s63-rounds-2-3.sh decode   # run 3: decode M=1..32, 3 rounds each (~15 s)
# carry [".gpubin/s63x"] (the pack of s63-ex-round.sh, with this script beside it).
set -u
B=/tmp/b63x; mkdir -p $B; [ -x $B/x/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B
. "$(dirname "$0")/round_lib.sh"
if [ "${1:-layer}" = layer ]; then
  torch_prefill
  layer_rounds 100000 x m m x x m m x
  ex_table m x
  left 400 mem && memcheck x $B/x 'Layer.*:Fp8Mode.*'
else  # decode: the bench JSON named _f8_ for f8_table
  timeout 80 python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 20 --json $L/TD.json > $L/TD.log 2>&1
  note "torch decode rc=$? $(el)"
  for v in m x x m m x; do
    n=$(( $(ls $L/${v}_f8_*.json 2>/dev/null | wc -l) + 1 ))
    timeout 60 $B/$v/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/TD.json \
      --json $L/${v}_f8_$n.json > $L/${v}_dec_$n.log 2>&1
    note "decode $v r$n rc=$? $(summ $L/${v}_f8_$n.json) $(el)"
  done
  f8_table m x
fi
pack_logs
