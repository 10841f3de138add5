#!/usr/bin/env bash
# Diagnostic (device): Nsight Compute sections of one launch of the tile128 pass kernel
# (quantize/tile128_bf16.cu) per named bench case. Env: MXMOE_BUILD, OUT.
set -uo pipefail
B=${MXMOE_BUILD:?}
export LD_LIBRARY_PATH="$B/src/core:${LD_LIBRARY_PATH:-}"
for case in "${@:-fused_1x128+128x1 A 16640x5120}"; do
  f="$OUT/ncu-$(echo "$case" | tr ' +/' '___').txt"
  timeout 120 ncu --kernel-name regex:tile128_pass --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_(long_scoreboard|wait|short_scoreboard|no_instruction|math_pipe_throttle|lg_throttle|barrier|mio_throttle)_per_issue_active\.ratio,smsp__inst_executed.sum" \
    "$B/bench/quantize_bench" --filter "$case" > "$f" 2>&1
  echo "--- ncu: $case: $(grep -E '^ +(DRAM Throughput|Compute \(SM\) Throughput|Issued Warp Per Scheduler|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued Instruction) ' "$f" \
    | sed -E 's/ +/ /g' | paste -sd';')"
  grep -E "smsp__" "$f" | sed -E 's/ +/ /g' | sort -t' ' -k4 -g -r | head -6
done
