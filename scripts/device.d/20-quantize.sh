#!/usr/bin/env bash
# Quantization kernels (issue 4): the CUDA gtests (CudaQuantize.*, Fused.*), compute-sanitizer
# memcheck on a small filter, and the bandwidth benchmark (JSON rows in $OUT/quantize.json).
# Short table in $OUT/table-quantize.txt. Env from device_run.sh: MXMOE_BUILD, OUT.
set -uo pipefail
B=${MXMOE_BUILD:?}
T=$B/tests/cpp/mxmoe_tests
export MXMOE_COMMIT=${MXMOE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
status=0

echo "--- gtest CudaQuantize.*:Fused.*"
timeout 420 "$T" --gtest_filter='CudaQuantize.*:Fused.*' >"$OUT/gtest-quantize.log" 2>&1
grc=$?
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|differ|error' "$OUT/gtest-quantize.log" | head -40
[[ $grc -eq 0 ]] || status=1

# By default only some bf16 32x1 requests take the warp-tile kernel (the rest the slab kernel);
# MXMOE_QUANT_WARP=2 sends every eligible request there, so both kernels stay bit-exact.
echo "--- gtest with MXMOE_QUANT_WARP=2 (warp-tile kernel for every eligible request)"
MXMOE_QUANT_WARP=2 timeout 300 "$T" --gtest_filter='CudaQuantize.AlongR:CudaQuantize.FusedWarpTile:CudaQuantize.Fused' \
  >"$OUT/gtest-quantize-warp.log" 2>&1
wrc=$?
grep -E '^\[  (PASSED|FAILED) |Failure' "$OUT/gtest-quantize-warp.log" | head -10
[[ $wrc -eq 0 ]] || status=1

echo "--- compute-sanitizer memcheck (CudaQuantize.SmallSanitizer)"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$T" --gtest_filter='CudaQuantize.SmallSanitizer' \
  >"$OUT/sanitizer-quantize.log" 2>&1
src=$?
grep -E 'ERROR SUMMARY|Invalid|PASSED|FAILED' "$OUT/sanitizer-quantize.log" | head -12
[[ $src -eq 0 ]] || status=1
MXMOE_QUANT_WARP=2 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$T" --gtest_filter='CudaQuantize.SmallSanitizer' \
  >"$OUT/sanitizer-quantize-warp.log" 2>&1
src2=$?
grep -E 'ERROR SUMMARY' "$OUT/sanitizer-quantize-warp.log" | sed 's/^/(MXMOE_QUANT_WARP=2) /'
[[ $src2 -eq 0 ]] || status=1

echo "--- benchmark"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader 2>/dev/null
{
  echo "quantization kernels: gtest rc=$grc, memcheck rc=$src, commit $MXMOE_COMMIT"
  timeout 400 "$B/bench/quantize_bench" --json "$OUT/quantize.json" "$@"
} 2>&1 | tee "$OUT/table-quantize.txt" >/dev/null
brc=${PIPESTATUS[0]}
tail -3 "$OUT/table-quantize.txt"
[[ $brc -eq 0 ]] || status=1
# Same-run A/B of the kernel choice for the columnwise requests (docs/perf/quantize.md, version 6).
echo "--- A/B: warp-tile kernel for every eligible request (MXMOE_QUANT_WARP=2), A shapes"
MXMOE_QUANT_WARP=2 timeout 200 "$B/bench/quantize_bench" --quick --json "$OUT/quantize-warp.json" 2>&1 \
  | grep -E "32x1|rows" | tee "$OUT/ab-quantize.txt"
# Same-run A/B of the tile128 pass kernel (docs/perf/quantize.md, version 9): the same requests on
# the general kernels.
echo "--- A/B: tile128 passes on the general kernels (MXMOE_QUANT_TILE128=0)"
MXMOE_QUANT_TILE128=0 timeout 200 "$B/bench/quantize_bench" --filter x128 --json "$OUT/quantize-tile128-off.json" 2>&1 \
  | grep -E "128x1|128x128" | tee "$OUT/ab-tile128.txt"
# Same-run A/B of the weights' TMA kernel (docs/design/quantize.md): the 128x128 requests on the
# tile128 pass kernel.
echo "--- A/B: the weights' 128x128 pass on the tile128 pass kernel (MXMOE_QUANT_TMA=0)"
MXMOE_QUANT_TMA=0 timeout 200 "$B/bench/quantize_bench" --filter 128x128 --json "$OUT/quantize-tma-off.json" 2>&1 \
  | grep -E "128x128" | tee "$OUT/ab-tma.txt"
MXMOE_QUANT_TMA=0 timeout 200 "$T" --gtest_filter='CudaQuantize.FusedTile128Weights' \
  >"$OUT/gtest-quantize-tma-off.log" 2>&1 || status=1
grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest-quantize-tma-off.log" | head -3
echo "--- gtest with MXMOE_QUANT_TILE128=0 (the general kernels on the same requests)"
MXMOE_QUANT_TILE128=0 timeout 200 "$T" --gtest_filter='CudaQuantize.FusedTile128Pass:CudaQuantize.Tiles128' \
  >"$OUT/gtest-quantize-tile128-off.log" 2>&1 || status=1
grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest-quantize-tile128-off.log" | head -5
exit $status
