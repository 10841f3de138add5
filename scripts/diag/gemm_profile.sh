#!/usr/bin/env bash
# Diagnostic (device): Nsight Compute on one tile128 forward GEMM launch per kernel variant (the own
# sm90 kernel at BlockN 128 / 192 and the CUTLASS kernel), same shape and inputs. Env: MXMOE_BUILD, OUT.
#   bash scripts/diag/gemm_profile.sh [M N K G]     (default: the seeds shape, 16640 8192 5120 1)
set -uo pipefail
B=${MXMOE_BUILD:?}
export LD_LIBRARY_PATH="$B/src/core:${LD_LIBRARY_PATH:-}" MXMOE_LIBRARY="$B/src/core/libmxmoe.so"
shape=("${@:-16640 8192 5120 1}")
for v in "own128:MXMOE_GEMM_BLOCK_N=128:grouped_m_kernel" "own192:MXMOE_GEMM_BLOCK_N=192:grouped_m_kernel" \
         "cutlass:MXMOE_GEMM_SM90=cutlass:device_kernel"; do
  IFS=: read -r label env kern <<<"$v"
  f="$OUT/ncu-gemm-$label.txt"
  env "$env" timeout 150 ncu --kernel-name "regex:$kern" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
    --section Occupancy \
    --metrics "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio" \
    python3 scripts/diag/gemm_one_call.py ${shape[@]} >"$f" 2>&1
  echo "== $label"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|gmma_cycles|lts__t_bytes|xbar2l1tex|stalled|Registers Per|Shared Memory Config|Dynamic Shared" "$f" | head -20
done
