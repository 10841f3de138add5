#!/usr/bin/env bash
# Diagnostic device call for GEMM v6 (issue 12): the GEMM gtests + memcheck, then in one process per
# pass the own kernels' variants beside CUTLASS on every bench_gemm shape (forward / dgrad: BlockN 128,
# 160, 192; wgrad: the own K-grouped kernel at cluster 1 and 2), SM clock and power sampled during the
# benches, and Nsight Compute of one forward launch per variant. Run from the repo root on the device
# with a carried build: bash scripts/diag/gemm_v6_call.sh
set -uo pipefail
export MXMOE_BUILD=$PWD/build-cuda MXMOE_LIBRARY=$PWD/build-cuda/src/core/libmxmoe.so
export MXMOE_OPS_LIBRARY=$PWD/build-cuda/src/ops/libmxmoe_torch.so LD_LIBRARY_PATH=$PWD/build-cuda/src/core
export PYTHONPATH=$PWD/python:${PYTHONPATH:-} PYTHONUNBUFFERED=1 OUT=${OUT:-$PWD/out/device}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
MXMOE_GEMM_SKIP_BENCH=1 bash scripts/device.d/30-gemm.sh 2>&1 | tail -30

nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500 > "$OUT/smi.csv" &
smi=$!
SECONDS=0
timeout 300 python3 bench/bench_gemm.py --passes forward,dgrad --profile= \
  --variants "cutlass:MXMOE_GEMM_SM90=cutlass,own128:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_BLOCK_N=128,own160:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_BLOCK_N=160,own192:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_BLOCK_N=192" \
  --json "$OUT/gemm-v6-fwd.json" --table "$OUT/table-gemm-v6-fwd.txt" > "$OUT/bench-gemm-v6-fwd.log" 2>&1
echo "bench fwd/dgrad rc $? after ${SECONDS}s"
SECONDS=0
timeout 200 python3 bench/bench_gemm.py --passes wgrad --profile= \
  --variants "cutlass:MXMOE_GEMM_SM90=cutlass,own:MXMOE_GEMM_SM90=mxmoe,own-c1:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_CLUSTER=1,own-c2:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_CLUSTER=2" \
  --json "$OUT/gemm-v6-wgrad.json" --table "$OUT/table-gemm-v6-wgrad.txt" > "$OUT/bench-gemm-v6-wgrad.log" 2>&1
echo "bench wgrad rc $? after ${SECONDS}s"
kill $smi 2>/dev/null
grep -E "^\[|variants|forward|dgrad|wgrad" "$OUT/bench-gemm-v6-fwd.log" "$OUT/bench-gemm-v6-wgrad.log" | sed 's/^[^:]*://' | cut -c1-150
awk -F', ' '{print $2}' "$OUT/smi.csv" | sort -n | awk '{a[NR]=$1} END {print "SM clock MHz during benches: min", a[1], "median", a[int(NR/2)], "max", a[NR]}'

# Nsight Compute, one forward launch each (Llama-4-Scout-like rows, 2 groups of 16384), clocks as found.
for v in "own128:MXMOE_GEMM_BLOCK_N=128" "own160:MXMOE_GEMM_BLOCK_N=160"; do
  IFS=: read -r label env <<<"$v"
  SECONDS=0
  env MXMOE_GEMM_SM90=mxmoe "$env" timeout 120 ncu --clock-control none --kernel-name regex:grouped_m_kernel \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis \
    --metrics "l1tex__m_xbar2l1tex_read_bytes.sum.per_second,smsp__cycles_active.avg,sm__cycles_elapsed.avg.per_second" \
    python3 scripts/diag/gemm_one_call.py 32768 8192 5120 2 > "$OUT/ncu-fwd-$label.txt" 2>&1
  echo "== ncu $label (${SECONDS}s)"
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|xbar2l1tex|Issue Slots Busy|Warp Cycles Per Issued|Executed Ipc|stall" "$OUT/ncu-fwd-$label.txt" | sed -E 's/ +/ /g' | head -14
done
