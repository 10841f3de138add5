#!/usr/bin/env bash
# Issue 12's measurements at one commit, in two device calls (each under the 10-minute limit), carrying
# build-cuda's libmxmoe.so, libmxmoe_torch.so and mxmoe_tests (see README "GPU work"):
#   bash scripts/diag/issue12_run.sh tests   # every gtest + memcheck, GPU pytest, grouped_mm e2e rows
#                                            # (eager and CUDA graph; torchao's fp8 rowwise beside them
#                                            # when its wheel is carried in .whl/)
#   bash scripts/diag/issue12_run.sh gemm    # GEMM gtests + memcheck, the GEMM table of every pass with
#                                            # the own kernels and CUTLASS as variants and DeepGEMM beside
#                                            # them when carried (.carry/deepgemm-*.tgz: its public source,
#                                            # fetched, never committed), Nsight Compute own vs DeepGEMM
# (Two calls: one call for both ran past the 10-minute limit at 804184d and returned nothing.)
# MXMOE_COMMIT names the tree (the device copy's git HEAD can differ).
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-$PWD/out/device} PYTHONUNBUFFERED=1
part=${1:?tests or gemm}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
if compgen -G ".carry/deepgemm-*.tgz" >/dev/null; then
  mkdir -p /tmp/dgp && tar -xzf .carry/deepgemm-*.tgz -C /tmp/dgp && export PYTHONPATH=/tmp/dgp:${PYTHONPATH:-}
fi

case $part in
  tests)
    bash scripts/device_run.sh 10-gtest 15-pytest 2>&1 | grep -v "^\.\|^$" | tail -30
    export MXMOE_BUILD=$PWD/build-cuda MXMOE_LIBRARY=$PWD/build-cuda/src/core/libmxmoe.so
    export MXMOE_OPS_LIBRARY=$PWD/build-cuda/src/ops/libmxmoe_torch.so LD_LIBRARY_PATH=$PWD/build-cuda/src/core
    export PYTHONPATH=$PWD/python:${PYTHONPATH:-}
    for mode in eager graph; do
      timeout 200 python3 -m mxmoe bench --recipes mxfp8_rceil_tile128 --compile $mode --no-moe-layer \
        --out "$OUT/e2e-$mode" > "$OUT/bench-e2e-$mode.log" 2>&1
      echo "e2e $mode rc $?"
      sed -n '/^A_shape/,$p' "$OUT/bench-e2e-$mode.log"
      grep -E "torchao|FAILED" "$OUT/bench-e2e-$mode.log" | head -5
    done
    ;;
  gemm)
    python3 -c "import deep_gemm; print('deep_gemm', deep_gemm.__file__)" 2>&1 | tail -1
    # No variants here (the own-vs-CUTLASS comparison is gemm_v6_call.sh's): the time goes to DeepGEMM's
    # JIT builds (one per shape and pass) and its timings.
    MXMOE_BENCH_GEMM_TIMEOUT=${MXMOE_BENCH_GEMM_TIMEOUT:-360} MXMOE_BENCH_GEMM_ARGS=${MXMOE_BENCH_GEMM_ARGS:---profile=} \
      bash scripts/device_run.sh 30-gemm 2>&1 | grep -vE "^\s+(variants|deepgemm)" | tail -60
    export MXMOE_BUILD=$PWD/build-cuda LD_LIBRARY_PATH=$PWD/build-cuda/src/core MXMOE_LIBRARY=$PWD/build-cuda/src/core/libmxmoe.so
    for v in "own:forward:grouped_m_kernel" "deepgemm:deepgemm:fp8_gemm_kernel"; do
      IFS=: read -r label pas kern <<<"$v"
      MXMOE_GEMM_SM90=mxmoe timeout 60 ncu --clock-control none --kernel-name "regex:$kern" --launch-skip 2 \
        --launch-count 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --metrics "l1tex__m_xbar2l1tex_read_bytes.sum.per_second" \
        python3 scripts/diag/gemm_one_call.py 32768 8192 5120 2 $pas > "/tmp/ncu-fwd-$label.txt" 2>&1
      { echo "== ncu forward 32768 x 8192 x 5120, G 2: $label"; cat "/tmp/ncu-fwd-$label.txt"; } >> "$OUT/ncu-fwd.txt"
      echo "== ncu forward 32768 x 8192 x 5120, G 2: $label"
      grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|xbar2l1tex|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|highest-utilized|Registers Per|Block Size|Grid Size" \
        "/tmp/ncu-fwd-$label.txt" | sed -E 's/ +/ /g' | head -14
    done
    ;;
  *) echo "part: expected tests or gemm, got $part"; exit 2 ;;
esac
