#!/usr/bin/env python3
"""A few tile128 GEMM calls of one shape (for Nsight Compute; bench/bench_gemm.py's inputs).
Usage: gemm_one_call.py M N K G [forward|wgrad|deepgemm] [jagged]
  forward: out (M, N) = x (M, K) . w[g] (N, K)^T;  wgrad: out[g] (N, K) = dY^T (N, M) . x^T (K, M)^T
  deepgemm: the forward through DeepGEMM's M-grouped contiguous kernel (bench_gemm.py's anchor; needs
  deep_gemm importable), for a kernel-to-kernel profile beside mxmoe's
  jagged: bench_gemm.py's random group sizes (unaligned starts, some empty) instead of 128-multiples."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_gemm as bg  # noqa: E402

M, N, K, G = (int(v) for v in sys.argv[1:5])
pas = sys.argv[5] if len(sys.argv) > 5 else "forward"
jagged = len(sys.argv) > 6 and sys.argv[6] == "jagged"
sizes = bg.group_sizes(M, G, jagged, seed=M + N + K + G)
offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
if pas == "forward":
    x8, w8 = bg.fp8((M, K)), bg.fp8((G, N, K))
    a_s, b_s = bg.coarse_rows(M, K // 32), bg.coarse_tiles(G, N, K // 32)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ws = bg.workspace(bg.LIB.mxmoe_grouped_mm_tile128_workspace_size(M, N, K, G, 0))
    run = bg.mx_fwd_call(x8, a_s, w8, b_s, offs, out, ws)
elif pas == "wgrad":
    dyt8, xt8 = bg.fp8((N, M)), bg.fp8((K, M))
    cap = (M + 31) // 32 + G
    a_s, b_s = bg.scale_bytes((N, cap)), bg.scale_bytes((K, cap))
    out = torch.empty(G, N, K, device="cuda", dtype=torch.bfloat16)
    ws = bg.workspace(bg.LIB.mxmoe_grouped_mm_tile128_kgroups_workspace_size(M, N, K, G, 0))
    run = bg.mx_kg_call(dyt8, a_s, xt8, b_s, offs, out, ws)
elif pas == "deepgemm":
    run = bg.deepgemm_m_grouped(bg.fp8((M, K)), bg.fp8((G, N, K)), sizes, N)
    if run is None:
        raise SystemExit("deepgemm: deep_gemm is not importable")
else:
    raise SystemExit(f"pass: expected forward, wgrad or deepgemm, got {pas!r}")
for _ in range(4):
    run()
torch.cuda.synchronize()
print("done", pas, M, N, K, G, "jagged" if jagged else "aligned")
