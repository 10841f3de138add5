#!/usr/bin/env bash
# Diagnostic (device): a tile128 pass kernel change checked in one call: bit-exact gtests (quantize and
# the own GEMM, which shares cuda/fast_div.cuh), memcheck, the computed-source GPU tests, the tile128
# rows of the quantization bench and the Nsight Compute profile (scripts/diag/tile128_profile.sh).
# Env: MXMOE_BUILD, OUT (as device_run.sh sets them).
set -uo pipefail
B=${MXMOE_BUILD:?}
T=$B/tests/cpp/mxmoe_tests
export LD_LIBRARY_PATH="$B/src/core:${LD_LIBRARY_PATH:-}"
export MXMOE_OPS_LIBRARY=$B/src/ops/libmxmoe_torch.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
status=0
timeout 400 "$T" --gtest_filter='CudaQuantize.*:Fused.*:CudaGemmTile128.*' > "$OUT/gtest.log" 2>&1 || status=1
grep -E '^\[  (PASSED|FAILED) |^\[==========\]|Failure' "$OUT/gtest.log" | head -20
for f in CudaQuantize.SmallSanitizer CudaQuantize.FusedTile128Pass; do
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$T" --gtest_filter=$f > "$OUT/memcheck-$f.log" 2>&1 || status=1
  echo "memcheck $f: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-$f.log")"
done
timeout 300 python3 -m pytest -q -m gpu tests/python/test_moe_source.py > "$OUT/pytest-source.log" 2>&1 || status=1
tail -2 "$OUT/pytest-source.log"
timeout 200 "$B/bench/quantize_bench" --filter 128x1 --json "$OUT/quantize-tile128.json" > "$OUT/bench-tile128.txt" 2>&1 || status=1
grep -E "128x1|rows" "$OUT/bench-tile128.txt"
bash scripts/diag/tile128_profile.sh 2>&1 | grep -E "^---|lines:"
exit $status
