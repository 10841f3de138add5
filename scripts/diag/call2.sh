# GPU check of 8eb5a37+: gtests + GPU pytest, own GEMM v5 vs CUTLASS, micro-batch graph modes.
export MXMOE_COMMIT=${MXMOE_COMMIT:-8eb5a37}
bash scripts/device_run.sh 10-gtest 15-pytest 2>&1 | grep -v "^\.\|^$" | tail -40
export MXMOE_BUILD=$PWD/build-cuda MXMOE_LIBRARY=$PWD/build-cuda/src/core/libmxmoe.so
export MXMOE_OPS_LIBRARY=$PWD/build-cuda/src/ops/libmxmoe_torch.so LD_LIBRARY_PATH=$PWD/build-cuda/src/core PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
timeout 200 python3 bench/bench_gemm.py --passes forward,dgrad --profile= \
  --variants "cutlass:MXMOE_GEMM_SM90=cutlass,own:MXMOE_GEMM_SM90=mxmoe,own192:MXMOE_GEMM_SM90=mxmoe+MXMOE_GEMM_BLOCK_N=192" \
  --json $OUT/gemm-v5.json --table $OUT/table-gemm-v5.txt > $OUT/bench-gemm-v5.log 2>&1; echo "bench_gemm rc $?"
python3 bench/tables.py gemm_kernels $OUT/gemm-v5.json 2>&1 | head -40
for c in graph graph-mb; do timeout 120 python3 -m mxmoe bench --micro-batches 4 --shapes seeds --compile $c --no-moe-layer --reps 5 --out $OUT/mb-$c 2>&1 | sed -n '/^A_shape/,$p'; done
