#!/usr/bin/env bash
# The MoE expert layer on the GPU (bench/bench_moe.py = python -m mxmoe bench --moe; BENCH.md "MoE layer
# configs": Qwen3-30B-A3B at 16K and 4K tokens, DeepSeek-V3 EP8, Llama4-Scout, Mixtral-8x7B, gpt-oss-120b
# at 16K): SonicMoE's bf16 layer and transformers' bf16 grouped_mm experts vs mxmoe.moe_experts bf16 /
# tile128 / exact, fwd+bwd eager and CUDA graph, with the per-kernel breakdown of one eager step of each
# impl. Rows to $OUT/moe_layer.json, the log to $OUT/bench-moe.log, the short table to $OUT/table-moe.txt
# and the markdown for BENCHMARKS.md to $OUT/moe_layer.md. Extra arguments: MXMOE_MOE_ARGS (e.g.
# "--moe-configs qwen3-30b-a3b --moe-reps 20"); MXMOE_MOE_TIMEOUT (seconds, default 480: the device's
# limit is 10 minutes a command; the benchmark itself stops starting new impls after --moe-budget-s 330).
# SonicMoE (the sonic_bf16 rows, measured first in each config; BENCH.md's MoE-layer peer) runs where its
# wheels were carried: `source scripts/sonic_wheels.sh auto` below installs them into /tmp/sonic and puts
# /tmp/sonic and /tmp/sonic/nvidia_cutlass_dsl/python_packages on PYTHONPATH; without them its rows say
# "sonic-moe not importable". In one call: carry .whl-sonic/one (`bash scripts/sonic_wheels.sh pack`) and
# the packed build's libraries alone (.carry/build/src: 62.7 MiB with the tree), run with
# MXMOE_COMMIT=<the tree's commit> MXMOE_BUILD=$PWD/.carry/build. Else the wheel parts .whl-sonic/1-3
# over calls of one warm machine: each call stages what it carried into /tmp/sonic-wheels, the last
# installs. Its first call per config JIT-compiles (6-65 s, QuACK's default GEMM configs; cached in
# /tmp while the machine stays warm), so split the configs over calls with MXMOE_MOE_ARGS.
# SONIC_JIT_CACHE=DIR (opt-in, not yet tried on the device): CuTe DSL keeps SonicMoE's compiled kernels
# in DIR (CUTE_DSL_CACHE_DIR, cutlass-dsl >= 4.3.2) and the step returns DIR as $OUT/sonic-jit-cache.tgz,
# so a later call (another session) can carry DIR back and skip the JIT's 8-65 s per config.
set -uo pipefail
status=0
SECONDS=0
if [[ -n "${SONIC_JIT_CACHE:-}" ]]; then
  mkdir -p "$SONIC_JIT_CACHE" && export CUTE_DSL_CACHE_DIR="$(cd "$SONIC_JIT_CACHE" && pwd)"
  echo "SonicMoE JIT cache: $CUTE_DSL_CACHE_DIR ($(du -sh "$CUTE_DSL_CACHE_DIR" | cut -f1) before)"
fi
source scripts/sonic_wheels.sh auto
python3 -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -1
python3 -c 'import sonicmoe, quack; print("sonic-moe", sonicmoe.__version__, "quack", quack.__version__)' 2>&1 | tail -1
timeout ${MXMOE_MOE_TIMEOUT:-480} python3 -m mxmoe bench --moe --moe-profile --out "$OUT/moe_layer.json" \
  ${MXMOE_MOE_ARGS:-} 2>&1 | tee "$OUT/bench-moe.log" | tail -60
rc=${PIPESTATUS[0]}
[[ $rc -eq 0 ]] || { echo "bench_moe exit $rc"; status=1; }
echo "bench_moe after ${SECONDS}s"
if [[ -n "${SONIC_JIT_CACHE:-}" ]]; then
  tar -C "$CUTE_DSL_CACHE_DIR" -czf "$OUT/sonic-jit-cache.tgz" . && ls -l "$OUT/sonic-jit-cache.tgz"
fi
sed -n '/^== MoE expert layer/,$p' "$OUT/bench-moe.log" > "$OUT/table-moe.txt"
[[ -s "$OUT/table-moe.txt" ]] || echo "MoE layer bench: no table (exit $rc)" > "$OUT/table-moe.txt"
if [[ -f "$OUT/moe_layer.json" ]]; then
  python3 bench/tables.py moe "$OUT/moe_layer.json" > "$OUT/moe_layer.md" 2>&1 || status=1
fi
exit $status
