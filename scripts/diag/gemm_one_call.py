#!/usr/bin/env python3
"""A few tile128 forward GEMM calls of one shape (for Nsight Compute; bench/bench_gemm.py's inputs).
Usage: gemm_one_call.py M N K G"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_gemm as bg  # noqa: E402

M, N, K, G = (int(v) for v in sys.argv[1:5])
sizes = bg.group_sizes(M, G, False, seed=0)
offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
x8, w8 = bg.fp8((M, K)), bg.fp8((G, N, K))
a_s, b_s = bg.coarse_rows(M, K // 32), bg.coarse_tiles(G, N, K // 32)
out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
ws = bg.workspace(bg.LIB.mxmoe_grouped_mm_tile128_workspace_size(M, N, K, G, 0))
run = bg.mx_fwd_call(x8, a_s, w8, b_s, offs, out, ws)
for _ in range(4):
    run()
torch.cuda.synchronize()
print("done", M, N, K, G)
