#!/usr/bin/env bash
# Session 64: what holds the exact layer at M=16 / 32 (issue 4's farthest points: 1.85x /
# 1.87x the HBM floor on the H200, both on the exact prefill path's 32-token tile), and
# the SM clock under the exact path's sustained M=4096 load (run 1 found the FP8 mode at
# 1470 MHz, at the 700 W cap). On two GPUs, test_ep first (last run in session 9).
# Pack, from a build of main (cmake -B build-gpu -DCMAKE_BUILD_TYPE=Release
# -DMXMOE_CUDA_ARCHS=90a; targets mxmoe_cli test_ep; test_ep is under build-gpu/tests/):
#   mkdir -p /tmp/p/m && cp build-gpu/mxmoe build-gpu/tests/test_ep /tmp/p/m/
#   tar cf - -C /tmp/p m | xz -T2 -6 > .gpubin/s64d/bins.tar.xz
#   cp docs/pending/{s64-diag-round.sh,round_lib.sh,ncu_table.py,ncu_kernels.py} .gpubin/s64d/; git rev-parse --short HEAD > .gpubin/s64d/BUILT
# then: ROUND_S=<the call's limit> bash .gpubin/s64d/s64-diag-round.sh, carry [".gpubin/s64d"]
set -u
B=/tmp/b64d; mkdir -p $B && [ -x $B/m/mxmoe ] || tar xJf "$(dirname "$0")/bins.tar.xz" -C $B; m=$B/m
. "$(dirname "$0")/round_lib.sh"
R=${ROUND_S:-590}
note "main $(cat "$(dirname "$0")/BUILT" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -ge 2 ]; then
  # NCCL from the image's pip package (nvidia-nccl-cu13); multicast stays off (KINDS.md)
  nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$nccl:${LD_LIBRARY_PATH:-} timeout 240 $m/test_ep --gtest_brief=1 > $L/test_ep.log 2>&1
  note "test_ep ($gpus GPUs, NCCL from $nccl) rc=$? $(passed $L/test_ep.log) $(el)"
  grep -E "FAILED|Failure|SKIPPED" $L/test_ep.log | head -5 | tee -a $S
fi
# Every kernel of the exact layer at M = 1, 16, 32: ncu durations (one bench call each:
# its eager and graph forwards, unmodified clocks).
for M in 1 16 32; do
  timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum --csv \
    $m/mxmoe bench --tokens $M --iterations 1 > $L/ncu_all_$M.csv 2>&1
  note "ncu all kernels M=$M rc=$? $(el)"
  python3 "$(dirname "$0")/ncu_kernels.py" $L/ncu_all_$M.csv | tee -a $S
done
# The prefill kernels at M = 16 and 32, one forward past the first: speed of light, the
# tensor pipe, issue, warp states, occupancy.
for M in 16 32; do
  left $(( R - 150 )) "ncu sections M=$M" || break
  timeout 90 ncu --clock-control none --kernel-name regex:'gemm[12]_prefill' --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section Occupancy --section MemoryWorkloadAnalysis \
    --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg,smsp__cycles_active.avg.pct_of_peak_sustained_elapsed \
    $m/mxmoe bench --tokens $M --iterations 1 > $L/ncu_sections_$M.txt 2>&1
  note "ncu sections M=$M rc=$? $(el)"
  grep -E "gemm[12]_prefill|Duration|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots Busy|Issued Ipc Active|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued|Achieved Occupancy|pipe_tensor_cycles|L2 Hit Rate|SM Frequency" \
    $L/ncu_sections_$M.txt | sed -E 's/ {2,}/ /g' | head -40 | tee -a $S
done
left $(( R - 60 )) "clock exact" && clock_probe m $m 4096 400 exact
left $(( R - 40 )) "clock fp8 1024" && clock_probe m $m 1024 1500 fp8
pack_logs
