#!/usr/bin/env bash
# Diagnostic device call for the wgrad kernel's warp producer (issue 12, step 6): the GEMM gtests
# (OwnSm90Wgrad runs both producers at cluster 1 and 2) + memcheck, the own wgrad kernel with the
# thread producer (default) and the warp producer (MXMOE_GEMM_PRODUCER=warp) beside CUTLASS on every
# wgrad bench_gemm shape in one process, and Nsight Compute of one seeds-shape wgrad launch per producer
# (warp-stall sampling per SASS instruction). Run from the repo root on the device with a carried
# build: bash scripts/diag/wgrad_warp_call.sh
set -uo pipefail
export MXMOE_BUILD=$PWD/build-cuda MXMOE_LIBRARY=$PWD/build-cuda/src/core/libmxmoe.so
export MXMOE_OPS_LIBRARY=$PWD/build-cuda/src/ops/libmxmoe_torch.so LD_LIBRARY_PATH=$PWD/build-cuda/src/core
export PYTHONPATH=$PWD/python:${PYTHONPATH:-} PYTHONUNBUFFERED=1 OUT=${OUT:-$PWD/out/device}
mkdir -p "$OUT" /tmp/gemm-step
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
OUT=/tmp/gemm-step MXMOE_GEMM_SKIP_BENCH=1 bash scripts/device.d/30-gemm.sh 2>&1 | grep -E "FAILED|PASSED|ERROR SUMMARY|exit" | tail -12
cp /tmp/gemm-step/gemm-tests.log /tmp/gemm-step/gemm-memcheck.log "$OUT/" 2>/dev/null

SECONDS=0
timeout 200 python3 bench/bench_gemm.py --passes wgrad --profile= \
  --variants "cutlass:MXMOE_GEMM_SM90=cutlass,own:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_PRODUCER=thread,own-warp:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_PRODUCER=warp" \
  --json "$OUT/wgrad-variants.json" --table /tmp/table-wgrad-variants.txt > "$OUT/bench-wgrad-variants.log" 2>&1
echo "bench wgrad rc $? after ${SECONDS}s"
awk '/^\[/{shape=$0} /variants/{print shape" | "$0}' "$OUT/bench-wgrad-variants.log" | sed -E 's/ +/ /g' | cut -c1-150

for v in "own:thread" "own-warp:warp"; do
  IFS=: read -r label prod <<<"$v"
  SECONDS=0
  MXMOE_GEMM_SM90=mxmoe MXMOE_GEMM_PRODUCER=$prod timeout 100 ncu --clock-control none --kernel-name regex:grouped_k_kernel \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --metrics "smsp__inst_executed.sum" -o /tmp/wg-$label python3 scripts/diag/gemm_one_call.py 16640 8192 5120 1 wgrad \
    > "/tmp/ncu-wg-$label-run.txt" 2>&1
  echo "== ncu wgrad 16640 x 8192 x 5120 G 1, $label (${SECONDS}s)"
  ncu -i /tmp/wg-$label.ncu-rep --print-summary none > "$OUT/ncu-wgrad-$label.txt" 2>&1
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|highest-utilized|inst_executed" \
    "$OUT/ncu-wgrad-$label.txt" | sed -E 's/ +/ /g' | head -9
  [[ $label == own-warp ]] && ncu -i /tmp/wg-$label.ncu-rep --page source --csv --print-source sass > "$OUT/ncu-wgrad-$label-sass.csv" 2>&1
done
