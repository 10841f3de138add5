#!/usr/bin/env bash
# Diagnostic (device): SASS opcode histogram of the warp-tile quantization kernel and Nsight Compute
# sections of one launch per named bench case. Env: MXMOE_BUILD, OUT.
set -uo pipefail
B=${MXMOE_BUILD:?}
export LD_LIBRARY_PATH="$B/src/core:${LD_LIBRARY_PATH:-}"
cuobjdump -sass -arch sm_90a "$B/src/core/libmxmoe.so" 2>/dev/null \
  | awk '/Function : .*quant_warp_kernel/{on=1} on&&/Function : /&&!/quant_warp_kernel/{on=0} on' > "$OUT/warp.sass"
echo "warp kernel SASS lines: $(wc -l < "$OUT/warp.sass")"
grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_]+(\.[A-Z0-9_]+)*' "$OUT/warp.sass" \
  | awk '{print $NF}' | sort | uniq -c | sort -rn | head -40 > "$OUT/warp_sass_hist.txt"
head -40 "$OUT/warp_sass_hist.txt"
for case in "quant_32x1_t A 16640x5120" "fused_rt_1x32+q_32x1 A 16640x5120"; do
  echo "--- ncu: $case"
  timeout 240 ncu --kernel-name regex:quant_warp --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats \
    "$B/bench/quantize_bench" --quick --filter "$case" > "$OUT/ncu-$(echo "$case" | tr ' +/' '___').txt" 2>&1
  grep -E "DRAM Throughput|Memory Throughput|Compute \(SM\)|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Achieved Occupancy|Registers Per|Stall|Duration|L1/TEX Hit|L2 Hit|Executed Ipc" \
    "$OUT/ncu-$(echo "$case" | tr ' +/' '___').txt" | head -40
done
