#!/usr/bin/env bash
# The next session's round (packed by s53-build.sh into .gpubin/s53a with main's binary):
# main measured for the issues' tables, on the card that comes (say which), and x's
# scattered staging profiled and timed at 1, 2, 4 and 7 warps per token (PERFORMANCE.md
# session 52, lead 2). Run from the repository root. Notes go to stdout as well, so a cut
# call still reports; 00summary.txt sorts first. SHORT=1 (s53-round-min.sh, for little
# device time): the FP8 and layer tests only instead of the whole test_engine, and the
# later steps' time guards cut to fit ~400 s; `pick FULL SHORT` chooses between the two.
set -u
pick() { [ -n "${SHORT:-}" ] && echo "$2" || echo "$1"; }
B=/tmp/b; mkdir -p $B && tar xJf .gpubin/s53a/bins.tar.xz -C $B; m=$B/m
S=$OUT/00summary.txt; L=$OUT/l; mkdir -p $L; t0=$(date +%s)
note() { echo "$*" | tee -a $S; }
left() { [ $(( $(date +%s) - t0 )) -lt $1 ] || { note "skipped past $1 s: $2"; return 1; }; }
passed() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
el() { echo "($(( $(date +%s) - t0 )) s)"; }
summ() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))['cases']
print(' '.join('%d:%.1fus/%.2fxfloor/%.2fxtorch/%.1f%%' % (c['tokens'],c['median_us'],c['median_us']/max(c['hbm_floor_us'],c['mma_floor_us']),(c.get('torch_us') or 0)/c['median_us'],100*c['tflops']/c['mma_tflops_ceiling']) for c in d if c['mode']=='graph'))" $1 2>&1 | tail -1; }
cat .gpubin/s53a/BUILT | tee -a $S
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
# Formats.DeviceE4m3* (every float through the conversion) left out for time, as session 49's run 5.
timeout $(pick 170 100) $m/test_engine --gtest_brief=1 --gtest_filter="$(pick '-Formats.DeviceE4m3*' 'Fp8Mode.*:Layer.*')" \
  > $L/tests.log 2>&1
note "test_engine rc=$? $(passed $L/tests.log) $(el)"; grep -E "FAILED|Failure" $L/tests.log | head -5 | tee -a $S
timeout 30 $m/test_layer_args --gtest_brief=1 > $L/args.log 2>&1; note "test_layer_args rc=$? $(passed $L/args.log)"
timeout 80 python3 bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $L/T.json > $L/T.log 2>&1
note "torch prefill rc=$? $(el)"
f8() { timeout 45 $m/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision fp8 --baseline $L/T.json \
    --json $L/f8_$1.json > $L/f8_$1.log 2>&1; note "fp8 r$1 rc=$? $(summ $L/f8_$1.json) $(el)"; }
f8 1
# Lead 2: the scattered staging's warps per token at M=1024 (default 4; MXMOE_F8_SPLIT).
for sp in 1 2 4 7; do left $(pick 250 170) "split $sp" || break
  MXMOE_F8_SPLIT=$sp timeout 30 ncu --clock-control none --kernel-name regex:stage_fp8 --launch-count 2 \
    --metrics gpu__time_duration.sum --csv $m/mxmoe bench --tokens 1024 --iterations 1 --precision fp8 > $L/ncu_split$sp.csv 2>&1
  note "stage_fp8 M=1024 split $sp rc=$?: $(grep -E '^"' $L/ncu_split$sp.csv | grep stage_fp8 | awk -F'","' '{print $NF}' | tr -d '"' | tr '\n' ' ')us $(el)"
done
left $(pick 290 210) "fp8 round 2" && f8 2
left $(pick 320 240) exact && { timeout 45 $m/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision exact --baseline $L/T.json \
  --json $L/ex.json > $L/ex.log 2>&1; note "exact rc=$? $(summ $L/ex.json) $(el)"; }
left $(pick 360 270) decode && { timeout 50 python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
  timeout 40 $m/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json --json $L/dec.json > $L/dec.log 2>&1
  note "decode rc=$? $(summ $L/dec.json) $(el)"; }
for pr in fp8 exact; do left $(pick 430 320) "smoke $pr" || continue
  timeout 50 $m/mxmoe validate --suite smoke --backend cuda --precision $pr > $L/smoke_$pr.log 2>&1
  note "smoke $pr rc=$? $(grep -E 'passed' $L/smoke_$pr.log | tail -1) $(el)"
done
left $(pick 490 330) memcheck && { timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $m/test_engine --gtest_brief=1 \
  --gtest_filter='Fp8Mode.Stage*:Fp8Mode.Fused*' > $L/memcheck.log 2>&1
  note "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.log | tr '\n' ' ') $(passed $L/memcheck.log) $(el)"; }
# Lead 2: what holds the scattered staging at M=1024 (~1.2 TB/s to DRAM on an H100).
left $(pick 540 360) "ncu stage" && { timeout 45 ncu --clock-control none --kernel-name regex:stage_fp8 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
  $m/mxmoe bench --tokens 1024 --iterations 1 --precision fp8 > $L/ncu_stage_1024.txt 2>&1
  note "ncu stage 1024 rc=$? $(el)"; grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Stall|Achieved Occupancy" $L/ncu_stage_1024.txt | head -14 | tee -a $S; }
python3 bench/compare_runs.py $L --variants f8 --rounds 1,2 --pattern '{v}_{r}.json' 2>&1 | tee -a $S
cat $S
tar czf /tmp/all.tgz -C $OUT l 2>/dev/null; rm -rf $L; mv /tmp/all.tgz $OUT/
