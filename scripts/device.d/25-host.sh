#!/usr/bin/env bash
# Host enqueue time of one grouped_mm forward+backward vs bf16 torch._grouped_mm, and eager vs CUDA-graph
# device time (bench/bench_host.py; BENCH.md fine-grained and seeds shapes). Targets printed per row:
# host_us <= 1.3x torch_host_us, fine-grained eager_us <= 1.1x graph_us. Rows to $OUT/host.json,
# the short table to $OUT/table-host.txt. Extra arguments: MXMOE_HOST_ARGS (e.g. "--shapes fine --reps 100").
set -uo pipefail
status=0
SECONDS=0
timeout ${MXMOE_HOST_TIMEOUT:-240} python3 bench/bench_host.py --json "$OUT/host.json" ${MXMOE_HOST_ARGS:-} \
  2>&1 | tee "$OUT/bench-host.log" | tail -40
rc=${PIPESTATUS[0]}
[[ $rc -eq 0 ]] || { echo "bench_host exit $rc"; status=1; }
echo "bench_host after ${SECONDS}s"
sed -n '/^== host enqueue time/,$p' "$OUT/bench-host.log" > "$OUT/table-host.txt"
[[ -s "$OUT/table-host.txt" ]] || echo "host bench: no table (exit $rc)" > "$OUT/table-host.txt"
exit $status
