#!/usr/bin/env bash
# Step 35: the bf16 layer's gather GEMMs one by one against the paths they replace
# (bench/bench_bf16_gather.py); first their GPU contract tests, since a kernel that hangs would hang
# the bench.
# Configs: MXMOE_BF16_GATHER_CONFIGS (default Qwen3-30B-A3B and DeepSeek-V3 EP8). JSON and logs under
# $OUT; the short table in $OUT/table-bf16-gather.txt.
set -uo pipefail
T="$MXMOE_BUILD/tests/cpp/mxmoe_tests"
status=0
SECONDS=0
timeout 120 "$T" --gtest_filter='CudaGemm.Bf16*' >"$OUT/bf16-gather-tests.log" 2>&1
rc=$?
grep -E "^\[ +(PASSED|FAILED) |Failure" "$OUT/bf16-gather-tests.log" | head -20
echo "gtest CudaGemm.Bf16* exit $rc after ${SECONDS}s"
[[ $rc -eq 0 ]] || { echo "bf16 gather tests failed: no bench"; exit 1; }
: >"$OUT/table-bf16-gather.txt"
for c in ${MXMOE_BF16_GATHER_CONFIGS:-qwen3-30b-a3b deepseek-v3-ep8}; do
  timeout 150 python3 bench/bench_bf16_gather.py --config "$c" --reps 6 --json "$OUT/bf16-gather-$c.json" \
    2>&1 | grep -v Warn | tee -a "$OUT/table-bf16-gather.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
done
exit $status
