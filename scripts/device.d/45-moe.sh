#!/usr/bin/env bash
# The MoE expert layer on the GPU (bench/bench_moe.py = python -m mxmoe bench --moe; BENCH.md "MoE layer
# configs": Qwen3-30B-A3B at 16K and 4K tokens, DeepSeek-V3 EP8, Llama4-Scout, Mixtral-8x7B, gpt-oss-120b
# at 16K): transformers' bf16 grouped_mm experts vs mxmoe.moe_experts bf16 / tile128 / exact, fwd+bwd
# eager and CUDA graph, with the per-kernel breakdown of one eager step of each impl. Rows to
# $OUT/moe_layer.json, the log to $OUT/bench-moe.log, the short table to $OUT/table-moe.txt and the
# markdown for BENCHMARKS.md to $OUT/moe_layer.md. Extra arguments: MXMOE_MOE_ARGS (e.g.
# "--moe-configs qwen3-30b-a3b --moe-reps 20"); MXMOE_MOE_TIMEOUT (seconds, default 480: the device's
# limit is 10 minutes a command; the benchmark itself stops starting new impls after --moe-budget-s 330).
set -uo pipefail
status=0
SECONDS=0
python3 -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -1
timeout ${MXMOE_MOE_TIMEOUT:-480} python3 -m mxmoe bench --moe --moe-profile --out "$OUT/moe_layer.json" \
  ${MXMOE_MOE_ARGS:-} 2>&1 | tee "$OUT/bench-moe.log" | tail -60
rc=${PIPESTATUS[0]}
[[ $rc -eq 0 ]] || { echo "bench_moe exit $rc"; status=1; }
echo "bench_moe after ${SECONDS}s"
sed -n '/^== MoE expert layer/,$p' "$OUT/bench-moe.log" > "$OUT/table-moe.txt"
[[ -s "$OUT/table-moe.txt" ]] || echo "MoE layer bench: no table (exit $rc)" > "$OUT/table-moe.txt"
if [[ -f "$OUT/moe_layer.json" ]]; then
  python3 bench/tables.py moe "$OUT/moe_layer.json" > "$OUT/moe_layer.md" 2>&1 || status=1
fi
exit $status
