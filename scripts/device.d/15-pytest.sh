#!/usr/bin/env bash
# Step 15: the GPU pytest suite (ops on CUDA, the sm90 phases vs their composition, end-to-end
# autograd, compile, CUDA graphs) against the carried build (MXMOE_OPS_LIBRARY from device_run.sh).
set -uo pipefail
python3 -m pytest -q -m gpu tests/python -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.log" | tail -25
rc=${PIPESTATUS[0]}
grep -E "passed|failed" "$OUT/pytest-gpu.log" | tail -1 | sed 's/^/GPU pytest: /' > "$OUT/table-pytest.txt"
exit $rc
