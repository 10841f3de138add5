#!/usr/bin/env bash
# Step 60: scale-out on one GPU (issue 15): the MX all-gather's per-rank cost (bench/bench_distributed.py)
# and the distributed training demo at world size 1 on NCCL (torchrun, FSDP2 with the MX all-gather,
# then expert parallel). The NCCL world-size-1 tests run in step 15 (test_distributed.py, marked gpu).
set -uo pipefail
rc=0
python3 bench/bench_distributed.py --out "$OUT/distributed.json" 2>&1 | tee "$OUT/distributed.log" | tail -12 || rc=1
for mode in fsdp ep; do
  python3 -m torch.distributed.run --nproc-per-node 1 -m mxmoe train --$mode --recipe mxfp8_rceil_tile128 --steps ${MXMOE_DIST_STEPS:-100} \
    --no-progress --out "$OUT/train-$mode" > "$OUT/train-$mode.log" 2>&1 \
    || { rc=1; grep -m8 -E "Error|error|Traceback|File \"/work" "$OUT/train-$mode.log"; }
  grep -E "held-out|tokens/s|^(PASS|FAIL)" "$OUT/train-$mode.log"
  grep -E "^(PASS|FAIL)" "$OUT/train-$mode.log" | sed "s/^/torchrun --$mode (NCCL, 1 rank): /" >> "$OUT/table-distributed.txt"
done
exit $rc
