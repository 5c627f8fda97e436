#!/usr/bin/env bash
# Session 66, second call: whichever GPU comes. On an H200, main's issue-figures round
# (.gpubin/s64m: main 5327533's kernels, main's now). On anything else, what holds the exact
# layer at M=128 (issue 5's 1.3x-of-floor point, 2.12x on session 64's H100) and M=64:
# every kernel's ncu time, instructions and DRAM reads at M=64 / 128 / 512, then the two
# prefill kernels' sections at M=128 (tensor pipe, issue, warp states, occupancy), with
# main's binary from the same pack (~60 s).
# carry [".gpubin/s64m"]; ROUND_S=<the call's limit> bash docs/pending/s66-round2.sh
set -u
. "$(dirname "$0")/h200_dispatch.sh"
here=$(dirname "$0")
R=${ROUND_S:-300}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee -a $S
for M in 128 64 512; do
  timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum --csv \
    $m/mxmoe bench --tokens $M --iterations 1 > $L/ncu_all_$M.csv 2>&1
  note "ncu all kernels M=$M rc=$? $(el)"
  python3 "$here/ncu_kernels.py" $L/ncu_all_$M.csv | tee -a $S
done
left $(( R - 60 )) "ncu sections M=128" && {
  timeout 90 ncu --clock-control none --kernel-name regex:'gemm[12]_prefill' --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats \
    --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg,smsp__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_cycles_active.max.pct_of_peak_sustained_elapsed,sm__cycles_active.max,sm__cycles_active.min \
    $m/mxmoe bench --tokens 128 --iterations 1 > $L/ncu_sections_128.txt 2>&1
  note "ncu sections M=128 rc=$? $(el)"
  grep -E "gemm[12]_prefill|Duration|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots Busy|Issued Ipc Active|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued|Achieved Occupancy|pipe_tensor_cycles|sm__cycles_active|L2 Hit Rate|SM Frequency|Grid Size|Registers Per" \
    $L/ncu_sections_128.txt | sed -E 's/ {2,}/ /g' | head -60 | tee -a $S; }
pack_logs
