#!/usr/bin/env bash
# Diagnostic device call for the forward / dgrad kernel v7 (issue 12): the GEMM gtests + memcheck, the
# own kernel (BlockN 128 as is, with the warp producer: MXMOE_GEMM_PRODUCER=warp, with one more stage:
# MXMOE_GEMM_EXTRA_STAGE=1, and with both; v7b also ran one accumulator set, v7c BlockN 160 / 192) beside
# CUTLASS on every forward / dgrad bench_gemm shape in one process, SM clock sampled, and Nsight Compute
# of one forward launch per variant with the warp-stall sampling per SASS instruction (SourceCounters;
# the per-instruction table as CSV: ncu-<variant>-sass.csv). Run from the repo root on the device
# with a carried build: bash scripts/diag/gemm_v7_call.sh
# (MXMOE_VARIANTS replaces the bench's variant list; MXMOE_NCU=0 skips Nsight; step 7 ran BlockN 160 with the
# warp producer: MXMOE_NCU=0 MXMOE_VARIANTS="own:MXMOE_GEMM_SM90=mxmoe,own160-warp:MXMOE_GEMM_SM90=mxmoe+
# MXMOE_GEMM_BLOCK_N=160+MXMOE_GEMM_PRODUCER=warp" bash scripts/diag/gemm_v7_call.sh at 78bb87c; those
# instances were removed after it measured 0.78-0.89x, docs/perf/gemm.md step 7)
set -uo pipefail
export MXMOE_BUILD=$PWD/build-cuda MXMOE_LIBRARY=$PWD/build-cuda/src/core/libmxmoe.so
export MXMOE_OPS_LIBRARY=$PWD/build-cuda/src/ops/libmxmoe_torch.so LD_LIBRARY_PATH=$PWD/build-cuda/src/core
export PYTHONPATH=$PWD/python:${PYTHONPATH:-} PYTHONUNBUFFERED=1 OUT=${OUT:-$PWD/out/device}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
# (The device returns at most 8 files: the GEMM step's SASS table stays in /tmp, the ncu run logs too.)
mkdir -p /tmp/gemm-step
OUT=/tmp/gemm-step MXMOE_GEMM_SKIP_BENCH=1 bash scripts/device.d/30-gemm.sh 2>&1 | grep -v "^function\|GemmUniversal" | tail -24
cp /tmp/gemm-step/gemm-tests.log /tmp/gemm-step/gemm-memcheck.log "$OUT/" 2>/dev/null

nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500 > /tmp/smi.csv &
smi=$!
SECONDS=0
timeout 280 python3 bench/bench_gemm.py --passes forward,dgrad --profile= \
  --variants "${MXMOE_VARIANTS:-cutlass:MXMOE_GEMM_SM90=cutlass,own:MXMOE_GEMM_SM90=mxmoe,own-warp:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_PRODUCER=warp,own-stage:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_EXTRA_STAGE=1,own-warp-stage:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_PRODUCER=warp+MXMOE_GEMM_EXTRA_STAGE=1}" \
  --json "$OUT/gemm-variants.json" --table /tmp/table-gemm-variants.txt > "$OUT/bench-gemm-variants.log" 2>&1
echo "bench fwd/dgrad rc $? after ${SECONDS}s"
kill $smi 2>/dev/null
awk '/^\[/{shape=$0} /variants/{print shape" | "$0}' "$OUT/bench-gemm-variants.log" | sed -E 's/ +/ /g' | cut -c1-150
awk -F', ' '{print $2}' /tmp/smi.csv | sort -n | awk '{a[NR]=$1} END {print "SM clock MHz during benches: min", a[1], "median", a[int(NR/2)], "max", a[NR]}'

# Nsight Compute after the bench, of the warp producer only (the default kernel's SASS is the v7c build's,
# whose table is bench/results/ncu/0b12dc8-fwd-own128-sass-stalls.csv.gz).
[[ ${MXMOE_NCU:-1} == 0 ]] && exit 0
for v in "own-warp:MXMOE_GEMM_PRODUCER=warp"; do
  IFS=: read -r label env <<<"$v"
  SECONDS=0
  env MXMOE_GEMM_SM90=mxmoe "$env" timeout 150 ncu --clock-control none --kernel-name regex:grouped_m_kernel --launch-skip 2 \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section SourceCounters --section InstructionStats \
    --metrics "l1tex__m_xbar2l1tex_read_bytes.sum.per_second,smsp__inst_executed.sum" \
    -o /tmp/$label python3 scripts/diag/gemm_one_call.py 32768 8192 5120 2 > "/tmp/ncu-$label-run.txt" 2>&1
  echo "== ncu $label (${SECONDS}s)"
  ncu -i /tmp/$label.ncu-rep --print-summary none > "$OUT/ncu-$label.txt" 2>&1
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|L1/TEX Cache|L2 Cache Throughput|xbar2l1tex|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|highest-utilized|inst_executed" \
    "$OUT/ncu-$label.txt" | sed -E 's/ +/ /g' | head -12
  ncu -i /tmp/$label.ncu-rep --page source --csv --print-source sass > "$OUT/ncu-$label-sass.csv" 2>&1
done

