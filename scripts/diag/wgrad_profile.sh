#!/usr/bin/env bash
# Diagnostic (device): Nsight Compute on one tile128 wgrad launch (the own K-grouped kernel and
# CUTLASS's), with the per-SASS-instruction stall samples of the own kernel as CSV (where the helper
# warps and the math warps wait). Env: MXMOE_BUILD, OUT.
#   bash scripts/diag/wgrad_profile.sh ["label:env:M N K G:aligned|jagged:kernel regex" ...]
set -uo pipefail
B=${MXMOE_BUILD:?}
export LD_LIBRARY_PATH="$B/src/core:${LD_LIBRARY_PATH:-}" MXMOE_LIBRARY="$B/src/core/libmxmoe.so"
D=$OUT/wgrad-profile
mkdir -p "$D"
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=(
  "own-seeds:MXMOE_GEMM_SM90=mxmoe:16640 8192 5120 1:aligned:grouped_k_kernel"
  "cutlass-seeds:MXMOE_GEMM_SM90=cutlass:16640 8192 5120 1:aligned:device_kernel"
  "own-qwen3down:MXMOE_GEMM_SM90=mxmoe:131072 2048 768 128:jagged:grouped_k_kernel"
  "cutlass-qwen3down:MXMOE_GEMM_SM90=cutlass:131072 2048 768 128:jagged:device_kernel"
)
for c in "${cases[@]}"; do
  IFS=: read -r label env shape kind kern <<<"$c"
  SECONDS=0
  env "$env" timeout 170 ncu --clock-control none --kernel-name "regex:$kern" --launch-skip 2 --launch-count 1 -f -o "$D/$label" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
    --section SourceCounters \
    --metrics "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,l1tex__m_xbar2l1tex_read_bytes.sum.per_second" \
    python3 scripts/diag/gemm_one_call.py $shape wgrad $kind > "$D/$label.log" 2>&1
  ncu -i "$D/$label.ncu-rep" --page details > "$D/$label.details.txt" 2>&1
  [[ $label == own-* ]] && ncu -i "$D/$label.ncu-rep" --page source --csv --print-source sass > "$D/$label.sass.csv" 2>&1
  rm -f "$D/$label.ncu-rep"
  echo "== $label ($shape $kind, ${SECONDS}s)"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|gmma_cycles|lts__t_bytes|xbar2l1tex|Warp Cycles Per Issued|Registers Per" "$D/$label.details.txt" | sed -E 's/ +/ /g' | head -12
done
tar -C "$OUT" -czf "$OUT/wgrad-profile.tgz" wgrad-profile && rm -rf "$D"
