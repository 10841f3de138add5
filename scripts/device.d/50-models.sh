#!/usr/bin/env bash
# Proof on a real model (issue 14): a transformers Qwen3-MoE (~0.62B parameters, random init) trained on
# the synthetic language with transformers' bf16 experts and with experts_implementation="mxmoe" (both
# recipes), three seeds each, to a plateau; eager and compiled tokens/s, peak memory, a per-kernel
# profile (bench/bench_models.py). MXMOE_MODELS_ARGS passes arguments (e.g. "--recipes bf16 --seeds 0");
# the full proof takes about 10 minutes, so it is run in parts and merged (--merge). JSON to
# $OUT/models.json, the log to $OUT/bench-models.log, the table to $OUT/table-models.txt.
#
# Speed preset (BENCH.md "Model configs"): MXMOE_MODELS_ARGS="--shape qwen3-30b-a3b" runs the
# Qwen3-30B-A3B-shaped model instead (hidden 2048, 32/4 heads of 128, 128 experts of 768 top-8, 4 layers,
# vocab 32768, seq 4096 x batch 4; random init and tokens, no loss verdict): transformers bf16, mxmoe bf16
# and mxfp8_rceil_tile128, 30 eager steps (5 untimed) each, then 30 compiled steps (10 untimed: they
# compile) each; tokens/s, peak memory, ratios vs transformers bf16 and vs mxmoe bf16, the targets.
# Estimated 3-5 minutes on an H200 (torch.compile of the whole model: about 30-60 s a recipe). Eager only
# (about a minute): add "--compile-steps 0"; a part: "--recipes ...", merged later with --merge. Its files
# are named after the shape: $OUT/models-qwen3-30b-a3b.json (bench/results/ has a BENCHMARKS.md section
# for that name), bench-models-qwen3-30b-a3b.log, table-models-qwen3-30b-a3b.txt; when the time limit
# (MXMOE_MODELS_TIMEOUT) cuts it short, the runs finished so far are summarized into that JSON.
set -uo pipefail
name=models
[[ " ${MXMOE_MODELS_ARGS:-} " =~ [[:space:]]--shape[=[:space:]]+([^[:space:]]+) ]] && name="models-${BASH_REMATCH[1]}"
timeout ${MXMOE_MODELS_TIMEOUT:-560} python3 bench/bench_models.py --out "$OUT/$name.json" ${MXMOE_MODELS_ARGS:-} \
  2>&1 | grep -v "Warning\|warn(" | tee "$OUT/bench-$name.log" | tail -40
rc=${PIPESTATUS[0]}
if [[ $name != models && ! -f "$OUT/$name.json" && -s "$OUT/$name.json.partial" ]]; then
  echo "models bench: cut short (exit $rc); the finished runs:" | tee -a "$OUT/bench-$name.log"
  python3 bench/bench_models.py --merge "$OUT/$name.json.partial" --out "$OUT/$name.json" 2>&1 \
    | tee -a "$OUT/bench-$name.log" | tail -12
fi
sed -n '/^Qwen3-MoE (/,$p' "$OUT/bench-$name.log" > "$OUT/table-$name.txt"
[[ -s "$OUT/table-$name.txt" ]] || echo "models bench: no table (exit $rc)" > "$OUT/table-$name.txt"
exit $rc
