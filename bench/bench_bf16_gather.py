#!/usr/bin/env python3
"""The bf16 layer's gather kernels one by one against what they replace, in the same run (BENCH.md
method: CUDA events, median of --reps after --warmup; the inputs of one MoE layer's step: tokens
routed top-k at random by mxmoe.ops.moe_routing, bf16 N(0, 1) activations, N(0, 1/fan_in) weights;
the config's shape with concatenated halves, plain SwiGLU and no biases).

  up+swiglu   ops.moe_swiglu_mm_bf16(x, perm, w13)        vs  moe_gather + torch._grouped_mm + ops.swiglu
  up          ops.moe_gather_mm_bf16(x, perm, w13)        vs  moe_gather + torch._grouped_mm
  down dgrad  ops.moe_dswiglu_mm_bf16(dout, perm, w2, h)  vs  moe_gather + torch._grouped_mm (w2 as it lies)
                                                             + weight pass + ops.swiglu_backward
                                                             + ops.moe_swiglu_weight_grad
  down dgrad+act  the same writing dW2's act(h) too (want_act, as the layer calls it)  vs  the same
                  + ops.swiglu(h)
  down mm     ops.moe_gather_mm_bf16(dout, perm, w2)      vs  moe_gather + torch._grouped_mm: the same
                                                             mainloop storing dY' (the epilogue's share
                                                             of "down dgrad" is the difference)
  dW13        ops.moe_kgather_mm_bf16(dH, x, perm)        vs  moe_gather + torch._grouped_mm (dH^T . rows)
  dW2         ops.moe_kgather_mm_bf16(dout, w act, perm)  vs  moe_gather + torch._grouped_mm

Each pair is checked to agree first (relative Frobenius error; bf16 sums in different orders), then
timed. Prints one row per op: us (ours, theirs), ratio (theirs / ours: > 1 is faster), the GEMM's
TFLOP/s; --json writes the rows. CPU (--device cpu, tiny shapes): a smoke test of the script only.

  python3 bench/bench_bf16_gather.py [--config qwen3-30b-a3b] [--tokens 16384] [--json out.json]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_moe  # noqa: E402  (the MoE configs)

BF16, F32 = torch.bfloat16, torch.float32


def timed(fn, device, warmup, reps):
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        import time

        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        return sorted(ts)[len(ts) // 2]
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return sorted(ts)[len(ts) // 2]


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="qwen3-30b-a3b", choices=sorted(bench_moe.CONFIGS))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--device", default="cuda")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    from mxmoe import ops

    dev = torch.device(a.device)
    cfg = bench_moe.CONFIGS[a.config]
    T, H, I, E, k = a.tokens, cfg.hidden, cfg.intermediate, cfg.experts, cfg.top_k
    g = torch.Generator(device="cpu").manual_seed(0)
    idx = torch.rand(T, E, generator=g).topk(k, -1).indices.to(dev)
    offs, perm, inv = ops.moe_routing(idx, E)
    x = torch.randn(T, H, generator=g).to(BF16).to(dev)
    dout = torch.randn(T, H, generator=g).to(BF16).to(dev)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).to(BF16).to(dev)
    w2 = (torch.randn(E, H, I, generator=g) / I**0.5).to(BF16).to(dev)
    rs = torch.rand(T, k, generator=g).to(dev)
    act = (0, *ops.SWIGLU_STANDARD)
    N = T * k

    def mm(rows, w_t):  # torch._grouped_mm on gathered rows, as the bf16 layer's path without the kernels
        return ops.dense_grouped_mm(rows, w_t, offs)

    h = ops.moe_gather_mm_bf16(x, perm, k, w13, False, offs)
    dh_ref = None
    cases = []
    # up projection with and without the SwiGLU epilogue
    cases.append(("up+swiglu", 4 * N * H * I,
                  lambda: ops.moe_swiglu_mm_bf16(x, perm, k, w13, None, *act, offs)[1],
                  lambda: ops.swiglu(mm(ops.moe_gather(x, perm, k, None, BF16), w13.transpose(-2, -1)), *act)))
    cases.append(("up", 4 * N * H * I, lambda: ops.moe_gather_mm_bf16(x, perm, k, w13, False, offs),
                  lambda: mm(ops.moe_gather(x, perm, k, None, BF16), w13.transpose(-2, -1))))

    def unfused_dgrad():
        d_y = mm(ops.moe_gather(dout, perm, k, None, BF16), w2)
        factor = ops.moe_gather(torch.ones(T, 1, dtype=F32, device=dev), perm, k, rs, F32)
        return ops.swiglu_backward(torch.mul(d_y, factor, out=torch.empty_like(d_y)), h, *act), \
            ops.moe_swiglu_weight_grad(d_y, h, inv, *act)

    cases.append(("down dgrad", 2 * N * H * I, lambda: ops.moe_dswiglu_mm_bf16(dout, perm, k, w2, h, rs, *act, offs)[0],
                  lambda: unfused_dgrad()[0]))
    # with dW2's act(h) from the epilogue, as the layer calls it, against the unfused path's SwiGLU pass
    cases.append(("down dgrad+act", 2 * N * H * I,
                  lambda: ops.moe_dswiglu_mm_bf16(dout, perm, k, w2, h, rs, *act, offs, True)[2],
                  lambda: (unfused_dgrad()[0], ops.swiglu(h, *act))[1]))
    cases.append(("down mm", 2 * N * H * I, lambda: ops.moe_gather_mm_bf16(dout, perm, k, w2, True, offs),
                  lambda: mm(ops.moe_gather(dout, perm, k, None, BF16), w2)))
    dh_ref = unfused_dgrad()[0]
    cases.append(("dW13", 4 * N * H * I, lambda: ops.moe_kgather_mm_bf16(dh_ref, x, perm, k, True, offs),
                  lambda: mm(dh_ref.t(), ops.moe_gather(x, perm, k, None, BF16))))
    y = ops.swiglu(h, *act)
    cases.append(("dW2", 2 * N * H * I, lambda: ops.moe_kgather_mm_bf16(dout, y, perm, k, False, offs),
                  lambda: mm(ops.moe_gather(dout, perm, k, None, BF16).t(), y)))

    rows = []
    print(f"{cfg.name} T={T} (H {H}, I {I}, E {E}, top-{k}) on {dev}"
          + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else " (a smoke test: times mean nothing)"))
    print(f"{'op':22} {'ours us':>9} {'torch us':>9} {'ratio':>6} {'TFLOP/s':>8} {'rel err':>8}")
    for name, flops, ours, theirs in cases:
        err = rel_err(ours(), theirs())
        if not err < 2e-2:
            raise SystemExit(f"{name}: the kernel and the gathered path disagree (relative error {err:.3g})")
        us, ref_us = timed(ours, dev, a.warmup, a.reps), timed(theirs, dev, a.warmup, a.reps)
        row = dict(op=name, config=cfg.name, tokens=T, ours_us=us, torch_us=ref_us, ratio=ref_us / us,
                   tflops=flops / us / 1e6, rel_err=err)
        rows.append(row)
        print(f"{name:22} {us:9.0f} {ref_us:9.0f} {ref_us / us:6.2f} {row['tflops']:8.0f} {err:8.1e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "device": str(dev)}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
