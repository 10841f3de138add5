#!/usr/bin/env bash
# Proof on a real model (issue 14): a transformers Qwen3-MoE (~0.62B parameters, random init) trained on
# the synthetic language with transformers' bf16 experts and with experts_implementation="mxmoe" (both
# recipes), three seeds each, to a plateau; eager and compiled tokens/s, peak memory, a per-kernel
# profile (bench/bench_models.py). MXMOE_MODELS_ARGS passes arguments (e.g. "--recipes bf16 --seeds 0");
# the full proof takes about 10 minutes, so it is run in parts and merged (--merge). JSON to
# $OUT/models.json, the log to $OUT/bench-models.log, the table to $OUT/table-models.txt.
set -uo pipefail
timeout ${MXMOE_MODELS_TIMEOUT:-560} python3 bench/bench_models.py --out "$OUT/models.json" ${MXMOE_MODELS_ARGS:-} \
  2>&1 | grep -v "Warning\|warn(" | tee "$OUT/bench-models.log" | tail -40
rc=${PIPESTATUS[0]}
sed -n '/^Qwen3-MoE (/,$p' "$OUT/bench-models.log" > "$OUT/table-models.txt"
[[ -s "$OUT/table-models.txt" ]] || echo "models bench: no table (exit $rc)" > "$OUT/table-models.txt"
exit $rc
