#!/usr/bin/env bash
# Issue 6 on the device: the seeds-format e2e benchmark and the GPU training demo (the GPU pytest
# suite is step 15). Short tables to $OUT/table-e2e.txt.
set -uo pipefail
status=0
: > "$OUT/table-e2e.txt"
python3 -m mxmoe bench ${MXMOE_BENCH_ARGS:-} --out "$OUT" 2>&1 | tee "$OUT/bench-e2e.log" | tail -40 || status=1
sed -n '/^A_shape/,$p' "$OUT/bench-e2e.log" >> "$OUT/table-e2e.txt"
# Gradient accumulation: 4 fwd+bwd per weight update (the weights quantized once per update), for
# each --compile choice in MXMOE_MB_COMPILE (space-separated; e.g. "all graph-mb").
for mbc in ${MXMOE_MB_COMPILE:-eager}; do
  mkdir -p "$OUT/mb-$mbc"
  python3 -m mxmoe bench --micro-batches "${MXMOE_MICRO_BATCHES:-4}" --shapes "${MXMOE_MB_SHAPES:-seeds}" --compile "$mbc" \
    --recipes "${MXMOE_MB_RECIPES:-mxfp8_rceil,mxfp8_rceil_tile128}" --no-moe-layer --out "$OUT/mb-$mbc" 2>&1 \
    | tee "$OUT/bench-e2e-mb-$mbc.log" | tail -12 || status=1
  { echo "micro-batches ${MXMOE_MICRO_BATCHES:-4}, --compile $mbc:"; sed -n '/^A_shape/,$p' "$OUT/bench-e2e-mb-$mbc.log"; } \
    >> "$OUT/table-e2e.txt"
done
if [[ -z "${MXMOE_SKIP_TRAIN:-}" ]]; then
  # The demo on the GPU for each recipe family: final losses within 2% of bf16 (--strict fails otherwise).
  for recipe in mxfp8_rceil mxfp8_rceil_tile128; do
    python3 -m mxmoe train --device cuda --recipe "$recipe" --strict --out "$OUT/train-$recipe" ${MXMOE_TRAIN_ARGS:-} \
      2>&1 | tail -30 > "$OUT/train-$recipe.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    { echo "train demo, $recipe:"; grep -E "final train loss|held-out|tokens/s|PASS|FAIL" "$OUT/train-$recipe.log"; } \
      | tee -a "$OUT/table-e2e.txt"
  done
fi
exit $status
