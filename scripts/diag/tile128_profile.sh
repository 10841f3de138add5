#!/usr/bin/env bash
# Diagnostic (device): where the tile128 pass kernel's instructions and stalls go. For each named
# bench case: one launch under Nsight Compute (full set), its summary and the per-instruction SASS
# view (executed instructions and stall samples per SASS line) as CSV; plus the kernel instances'
# SASS. Env: MXMOE_BUILD, OUT.   bash scripts/diag/tile128_profile.sh ["bench case" ...]
set -uo pipefail
B=${MXMOE_BUILD:?}
export LD_LIBRARY_PATH="$B/src/core:${LD_LIBRARY_PATH:-}"
D=$OUT/tile128-profile
mkdir -p "$D"
cuobjdump -sass -arch sm_90a "$B/src/core/libmxmoe.so" 2>/dev/null \
  | awk '/Function : .*tile128_pass_kernel/{on=1} on&&/Function : /&&!/tile128_pass_kernel/{on=0} on' > "$D/tile128.sass"
echo "tile128 kernels SASS lines: $(wc -l < "$D/tile128.sass")"
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=(
  "fused_1x128+128x1 moe 131072x768/G64a16"
  "src_swiglu_1x128+128x1 moe"
  "src_gather_1x128+128x1 moe"
  "fused_w_128x128 W 64x1536x1024"
)
for c in "${cases[@]}"; do
  n=$(echo "$c" | tr ' +/' '___')
  timeout 150 ncu --set full -k regex:tile128_pass --launch-skip 3 --launch-count 1 -f -o "$D/$n" \
    "$B/bench/quantize_bench" --filter "$c" > "$D/$n.log" 2>&1
  ncu -i "$D/$n.ncu-rep" --page details > "$D/$n.details.txt" 2>&1
  ncu -i "$D/$n.ncu-rep" --page source --csv --print-source sass > "$D/$n.sass.csv" 2>&1
  rm -f "$D/$n.ncu-rep"
  echo "--- $c: $(grep -E '^ +(DRAM Throughput|Compute \(SM\) Throughput|Issued Warp Per Scheduler|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued Instruction|Executed Instructions|Duration) ' "$D/$n.details.txt" \
    | sed -E 's/ +/ /g' | paste -sd';')"
  echo "    sass.csv lines: $(wc -l < "$D/$n.sass.csv")"; head -c 600 "$D/$n.sass.csv"; echo
done
tar -C "$OUT" -czf "$OUT/tile128-profile.tgz" tile128-profile && rm -rf "$D"
