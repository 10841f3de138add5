#!/usr/bin/env bash
# Diagnostic device call for the forward / dgrad kernel v7 (issue 12: scale bytes loaded 4 k-blocks at
# a time and shared across each quad by shuffle): the GEMM gtests + memcheck, the own kernel at BlockN
# 128 / 160 beside CUTLASS on every forward / dgrad bench_gemm shape in one process, SM clock sampled,
# and Nsight Compute of one forward launch with the warp-stall sampling per SASS instruction
# (SourceCounters; the per-instruction table printed as CSV). Run from the repo root on the device
# with a carried build: bash scripts/diag/gemm_v7_call.sh
set -uo pipefail
export MXMOE_BUILD=$PWD/build-cuda MXMOE_LIBRARY=$PWD/build-cuda/src/core/libmxmoe.so
export MXMOE_OPS_LIBRARY=$PWD/build-cuda/src/ops/libmxmoe_torch.so LD_LIBRARY_PATH=$PWD/build-cuda/src/core
export PYTHONPATH=$PWD/python:${PYTHONPATH:-} PYTHONUNBUFFERED=1 OUT=${OUT:-$PWD/out/device}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
MXMOE_GEMM_SKIP_BENCH=1 bash scripts/device.d/30-gemm.sh 2>&1 | grep -v "^function\|GemmUniversal" | tail -24

# Nsight Compute first (the warp-stall table is the point of this call), one forward launch.
SECONDS=0
MXMOE_GEMM_SM90=mxmoe timeout 150 ncu --clock-control none --kernel-name regex:grouped_m_kernel --launch-skip 2 \
  --launch-count 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section SourceCounters --section InstructionStats \
  --metrics "l1tex__m_xbar2l1tex_read_bytes.sum.per_second,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts.sum,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum" \
  -o /tmp/own128 python3 scripts/diag/gemm_one_call.py 32768 8192 5120 2 > "$OUT/ncu-v7-run.txt" 2>&1
echo "== ncu own128 v7 (${SECONDS}s, rc $?)"
ncu -i /tmp/own128.ncu-rep --print-summary none > "$OUT/ncu-v7-own128.txt" 2>&1
grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|L1/TEX Cache|L2 Cache Throughput|xbar2l1tex|wavefronts|data_bank|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|highest-utilized" \
  "$OUT/ncu-v7-own128.txt" | sed -E 's/ +/ /g' | head -16
ncu -i /tmp/own128.ncu-rep --page source --csv --print-source sass > "$OUT/ncu-v7-own128-sass.csv" 2>&1
echo "sass csv: $(wc -l < "$OUT/ncu-v7-own128-sass.csv") lines"
head -c 600 "$OUT/ncu-v7-own128-sass.csv"; echo

nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500 > "$OUT/smi.csv" &
smi=$!
SECONDS=0
timeout 280 python3 bench/bench_gemm.py --passes forward,dgrad --profile= \
  --variants "cutlass:MXMOE_GEMM_SM90=cutlass,own128:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_BLOCK_N=128,own160:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_BLOCK_N=160" \
  --json "$OUT/gemm-v7-fwd.json" --table "$OUT/table-gemm-v7-fwd.txt" > "$OUT/bench-gemm-v7-fwd.log" 2>&1
echo "bench fwd/dgrad rc $? after ${SECONDS}s"
kill $smi 2>/dev/null
grep -E "^\[|variants|forward|dgrad" "$OUT/bench-gemm-v7-fwd.log" | cut -c1-160
awk -F', ' '{print $2}' "$OUT/smi.csv" | sort -n | awk '{a[NR]=$1} END {print "SM clock MHz during benches: min", a[1], "median", a[int(NR/2)], "max", a[NR]}'
