#!/usr/bin/env bash
# Session 60, rounds 1 and 2 in one call (carry [".gpubin/s60", ".gpubin/s60t"], ~63 MB with
# the tree): the FP8 layer m / a / b in alternating rounds, then b's FP8 tests and the
# sanitizers, b's FP8 validation, and ncu's DRAM bytes (m, b), each while time is left.
# (As run, its comparison table and racecheck / synccheck loop were written out here;
# round_lib.sh's f8_table and sancheck do the same since.)
set -u
B=/tmp/b60; mkdir -p $B && tar xJf .gpubin/s60/bins.tar.xz -C $B && tar xJf .gpubin/s60t/bins.tar.xz -C $B
. .gpubin/s60/round_lib.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
torch_prefill
for order in "m a b" "a b m" "b m a" "m a b"; do
  r=$(( ${r:-0} + 1 ))
  for v in $order; do f8 $v $B/$v $r; done
done
f8_table m a b
left 330 "b's FP8 tests" && gtests b $B/b 'Fp8Mode.*:Layer.PrefillPastThirtyTwoLocalExpertsMatchesReference' 120
left 420 "b's memcheck" && memcheck b $B/b 'Fp8Mode.NarrowTiles*:Fp8Mode.Tails*'
left 460 "b's validation" && { timeout 60 $B/b/mxmoe validate --suite all --backend cuda --precision fp8 > $L/b_validate.log 2>&1
  note "b validate fp8 rc=$? $(grep -E 'passed, .* failed' $L/b_validate.log | tail -1) $(el)"; }
for tool in racecheck synccheck; do left 500 "b's $tool" && sancheck b $B/b $tool 'Fp8Mode.NarrowTiles*'; done
for v in m b; do
  left 540 "ncu $v" && { timeout 25 ncu --clock-control none -k regex:"gemm[12]_fp8" --launch-skip 2 --launch-count 2 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
    $B/$v/mxmoe bench --tokens 4096 --iterations 1 --precision fp8 > $L/${v}_ncu.log 2>&1
  note "ncu $v rc=$?: $(grep -E 'gemm[12]_fp8_kernel|gpu__time|dram__bytes|hit_rate' $L/${v}_ncu.log | sed -E 's/\(Gemm.*//; s/ +/ /g' | tr '\n' ';') $(el)"; }
done
pack_logs
