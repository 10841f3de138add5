#!/usr/bin/env bash
# Diagnostic (device): SASS opcode histogram of the warp-tile quantization kernel and Nsight Compute
# sections of one launch per named bench case. Env: MXMOE_BUILD, OUT.
#   bash scripts/diag/quant_profile.sh ["bench case#kernel name regex" ...]
# e.g. "fused_1x128+128x1 A 16640x5120#regex:tile128_pass" (default: the cases below).
set -uo pipefail
B=${MXMOE_BUILD:?}
export LD_LIBRARY_PATH="$B/src/core:${LD_LIBRARY_PATH:-}"
cuobjdump -sass -arch sm_90a "$B/src/core/libmxmoe.so" 2>/dev/null \
  | awk '/Function : .*quant_warp_kernel/{on=1} on&&/Function : /&&!/quant_warp_kernel/{on=0} on' > "$OUT/warp.sass"
echo "warp kernel SASS lines: $(wc -l < "$OUT/warp.sass")"
grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_]+(\.[A-Z0-9_]+)*' "$OUT/warp.sass" \
  | awk '{print $NF}' | sort | uniq -c | sort -rn | head -40 > "$OUT/warp_sass_hist.txt"
# "bench case#kernel name regex" pairs: one case per kernel family below its copy-ratio target (the
# measured bounds of docs/perf/quantize.md), A 16640x5120 unless the family needs another shape.
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=(
  "quant_32x1_t A 16640x5120#regex:quant_slab"
  "fused_1x32+32x1 A 16640x5120#regex:quant_slab"
  "fused_rt_1x32+32x1t A 16640x5120#regex:quant_(slab|warp)"
  "fused_rt_1x32+q_32x1 A 16640x5120#regex:quant_slab"
  "fused_rt_1x32+rt_32x1 A 16640x5120#regex:quant_warp"
  "fused_rt_1x32 A 16640x5120#regex:quant_rows"
  "dequant_1x32 A 16640x5120#regex:dequant_rows"
  "dequant_32x1 A 16640x5120#regex:dequant_warp"
  "fused_1x32_blockedM A 16640x5120#regex:quant_slab"
  "to_blocked A 16640x7168#regex:blocked"
  "quant_32x1_t jag 16384x4096/G8#regex:quant_slab"
  "fused_w_128x128 W 8x8192x5120#regex:tile128_pass"
  "fused_1x128+128x1 A 16640x5120#regex:tile128_pass"
)
for pair in "${cases[@]}"; do
  case=${pair%%#*}; kern=${pair##*#}
  f="$OUT/ncu-$(echo "$case" | tr ' +/' '___').txt"
  timeout 120 ncu --kernel-name "$kern" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_(long_scoreboard|wait|short_scoreboard|no_instruction|math_pipe_throttle|lg_throttle|barrier|mio_throttle)_per_issue_active\.ratio,smsp__inst_executed.sum" \
    "$B/bench/quantize_bench" --filter "$case" > "$f" 2>&1
  echo "--- ncu: $case ($kern): $(grep -E '^ +(DRAM Throughput|Compute \(SM\) Throughput|Issued Warp Per Scheduler|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued Instruction) ' "$f" \
    | sed -E 's/ +/ /g' | paste -sd';')"
  grep -E "smsp__" "$f" | sed -E 's/ +/ /g' | sort -t' ' -k4 -g -r | head -5
done
