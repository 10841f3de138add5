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
# "bench case|kernel name regex" pairs: the kernels whose copy ratio has no measured bound yet.
cases=(
  "quant_32x1_t A 16640x5120|regex:quant_(warp|slab)"
  "fused_rt_1x32+q_32x1 A 16640x5120|regex:quant_(warp|slab)"
  "fused_rt_1x32+rt_32x1 A 16640x5120|regex:quant_(warp|slab)"
  "fused_rt_1x32 A 16640x5120|regex:quant_rows"
  "dequant_1x32 A 16640x5120|regex:dequant_rows"
  "fused_1x32_blockedM A 16640x5120|regex:quant_slab"
  "to_blocked A 16640x7168|regex:blocked_kernel"
)
for pair in "${cases[@]}"; do
  case=${pair%%|*}; kern=${pair##*|}
  f="$OUT/ncu-$(echo "$case" | tr ' +/' '___').txt"
  echo "--- ncu: $case ($kern)"
  timeout 120 ncu --kernel-name "$kern" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats \
    "$B/bench/quantize_bench" --quick --filter "$case" > "$f" 2>&1
  grep -E "^    (DRAM Throughput|Compute \(SM\) Throughput|Duration|Issued Warp Per|Eligible Warps|Achieved Occupancy|Registers Per|Warp Cycles Per Issued)" "$f" | tr -s ' ' | paste -sd';'
done
