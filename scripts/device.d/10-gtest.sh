#!/usr/bin/env bash
# Step 10: every C++ test on the GPU (the CUDA kernels bit-exact against the CPU core, the tile128
# GEMMs, the clamped offsets, validation) and compute-sanitizer memcheck on the small cases of each
# kernel family. Env from device_run.sh: MXMOE_BUILD, OUT. Short table in $OUT/table-gtest.txt.
set -uo pipefail
T="$MXMOE_BUILD/tests/cpp/mxmoe_tests"
status=0
SECONDS=0
timeout 300 "$T" >"$OUT/gtest-all.log" 2>&1
rc=$?
grep -E "^\[  (FAILED|SKIPPED) |Failure|^\[  PASSED|^\[==========\] [0-9]+ tests" "$OUT/gtest-all.log" | head -30
echo "gtest (all) exit $rc after ${SECONDS}s"
[[ $rc -eq 0 ]] || status=1
SECONDS=0
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 7 "$T" \
  --gtest_filter='CudaClampOffsets.*:CudaQuantize.SmallSanitizer:CudaGemmTile128.SmallForwardAndWgrad:CudaGemmTile128.Gather*:CudaGemm.Generic*' \
  >"$OUT/gtest-memcheck.log" 2>&1
mrc=$?
grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/gtest-memcheck.log" | tail -4
echo "memcheck exit $mrc after ${SECONDS}s"
[[ $mrc -eq 0 ]] || status=1
# The MoE kernel family (routing through CUB, gather, combine, SwiGLU) under memcheck, separately
# bounded: its routing cases include 2^20 experts.
SECONDS=0
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 7 "$T" --gtest_filter='CudaMoe.*' \
  >"$OUT/gtest-memcheck-moe.log" 2>&1
mmrc=$?
grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/gtest-memcheck-moe.log" | tail -4
echo "memcheck (MoE) exit $mmrc after ${SECONDS}s"
[[ $mmrc -eq 0 ]] || status=1
{ echo "gtest: $(grep -E '^\[  PASSED' "$OUT/gtest-all.log" | head -1) $(grep -cE '^\[  FAILED  \] [A-Z]' "$OUT/gtest-all.log") failed (rc $rc); memcheck rc $mrc, MoE memcheck rc $mmrc"; } \
  > "$OUT/table-gtest.txt"
exit $status
