#!/usr/bin/env bash
# Step 55: TorchTitan on mxmoe (bench/bench_torchtitan.py). torchao's reference MoE at its test size
# (bf16 vs mxmoe.convert, eager and compiled, score_before_experts both ways), then TorchTitan 0.3's
# Trainer on its debug MoE model, bf16 vs MXMoEConverter. Needs torchtitan, torchao and their small
# dependencies as wheels in .whl (device_run.sh installs them). MXMOE_TT_STEPS sets the Trainer steps,
# MXMOE_TT_ARGS adds train arguments (e.g. "--compiled"). Rows to $OUT/torchtitan.json.
set -uo pipefail
status=0
timeout ${MXMOE_TT_LAYER_TIMEOUT:-240} python3 bench/bench_torchtitan.py layer --out "$OUT/torchtitan-layer.json" \
  > "$OUT/bench-torchtitan-layer.log" 2>&1 || status=1
tail -3 "$OUT/bench-torchtitan-layer.log"
timeout ${MXMOE_TT_TRAIN_TIMEOUT:-420} python3 bench/bench_torchtitan.py train --steps "${MXMOE_TT_STEPS:-300}" \
  ${MXMOE_TT_ARGS:-} --out "$OUT/torchtitan-train.json" > "$OUT/bench-torchtitan-train.log" 2>&1 || status=1
grep -E "^train|Error|error" "$OUT/bench-torchtitan-train.log" | tail -8
inputs=$(ls "$OUT"/torchtitan-layer.json "$OUT"/torchtitan-train.json 2>/dev/null)
[[ -n "$inputs" ]] && python3 bench/bench_torchtitan.py table $inputs --out "$OUT/torchtitan.json" \
  > "$OUT/table-torchtitan.txt" 2>&1
rm -f "$OUT"/torchtitan-layer.json "$OUT"/torchtitan-train.json
exit $status
