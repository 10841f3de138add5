"""The saved pre-activation in FP8 instead of bf16 (issue: "the pre-activation (FP8 or bf16: measure
both, keep the better, say why)"): what it costs in accuracy and what it saves in bytes, without a GPU.

The layer (mxmoe.moe_experts, tile128 or bf16) runs fwd+bwd on the same inputs three ways: as it is (h
saved in bf16), and with the saved h replaced by its MXFP8 round trip, 1x32 and 1x128 blocks (RCEIL),
through torch.autograd.graph.saved_tensors_hooks: what a layer that stores q(h) + scales and reads
dq(q(h)) in its backward computes (the forward is unchanged: GEMM1's epilogue reads its accumulator,
not the stored h). Each output and grad against an fp32 composition of plain torch ops (per expert: index,
matmul, SwiGLU, weighted index_add), as SQNR in dB; the bytes of h per routed row beside it.
Only the backward reads h: dH = act'(h, w * dY'), so dx, dW13 and the routing weights' grad move; dW2
reads act(h)'s own FP8 operand (tile128) or act(h) recomputed from h (bf16 layer).

  python3 bench/preact_precision.py [--tokens 256] [--hidden 2048] [--inter 768] [--experts 16] [--topk 8]
"""
import argparse
import math

import torch

import mxmoe

GRADS = ("x", "topk_weights", "w13", "w2")


def inputs(T, H, I, E, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).bfloat16()
    tw, ti = torch.softmax(torch.randn(T, E, generator=g), -1).topk(k, -1)
    tw = (tw / tw.sum(-1, keepdim=True)).bfloat16()
    w13 = (torch.randn(E, 2 * I, H, generator=g) / math.sqrt(H)).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g) / math.sqrt(I)).bfloat16()
    dout = torch.randn(T, H, generator=g).bfloat16()
    return dict(x=x, topk_idx=ti, topk_weights=tw, w13=w13, w2=w2), dout


def reference(inp, dout):
    """fp32 composition of plain torch ops: output and grads."""
    leaves = {n: t.detach().float().requires_grad_(n in GRADS) for n, t in inp.items() if n != "topk_idx"}
    x, tw, w13, w2, idx = leaves["x"], leaves["topk_weights"], leaves["w13"], leaves["w2"], inp["topk_idx"]
    I = w13.shape[1] // 2
    out = x * 0
    for e in range(w13.shape[0]):
        t_i, j_i = (idx == e).nonzero(as_tuple=True)
        if t_i.numel():
            h = x[t_i] @ w13[e].t()
            y = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
            out = out.index_add(0, t_i, (y @ w2[e].t()) * tw[t_i, j_i, None])
    out.backward(dout.float())
    return out.detach(), {n: leaves[n].grad for n in GRADS}


def sqnr(a, ref):
    err = (a.float() - ref).pow(2).sum().item()
    return float("inf") if err == 0 else 10 * math.log10(ref.pow(2).sum().item() / err)


def run(inp, dout, recipe, h_block, I):
    """moe_experts' output and grads; h_block 32 / 128: the saved pre-activation (any saved bf16 (rows,
    2I) tensor) replaced by its MXFP8 round trip with that block; None: as it is."""
    leaves = {n: (t.detach().clone().requires_grad_(True) if n in GRADS else t) for n, t in inp.items()}
    hits = []

    def pack(t):
        if h_block is not None and t.dim() == 2 and t.dtype == torch.bfloat16 and t.shape[1] == 2 * I \
                and t.shape[0] >= inp["topk_idx"].numel():
            hits.append(tuple(t.shape))
            return mxmoe.quantize(t, dim=-1, mode="rceil", block=h_block).dequantize(torch.bfloat16)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = mxmoe.moe_experts(**leaves, recipe=recipe)
    if h_block is not None and len(hits) != 1:
        raise RuntimeError(f"expected one saved pre-activation (rows, {2 * I}) bf16, found {hits}")
    out.backward(dout)
    return out.detach(), {n: leaves[n].grad for n in GRADS}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    T, H, I, E, k = a.tokens, a.hidden, a.inter, a.experts, a.topk
    inp, dout = inputs(T, H, I, E, k, a.seed)
    ref_out, ref_grads = reference(inp, dout)
    print(f"T={T} H={H} I={I} E={E} k={k}: SQNR (dB) against fp32; h bytes per routed row: bf16 {4 * I}, "
          f"MXFP8 1x32 {2 * I + 2 * I // 32}, 1x128 {2 * I + 2 * I // 128}")
    print(f"{'layer':8} {'saved h':14} {'out':>6} " + " ".join(f"{'d' + n:>15}" for n in GRADS))
    for recipe, name in (("mxfp8_rceil_tile128", "tile128"), (None, "bf16")):
        for h_block, label in ((None, "bf16"), (32, "MXFP8 1x32"), (128, "MXFP8 1x128")):
            out, grads = run(inp, dout, recipe, h_block, I)
            print(f"{name:8} {label:14} {sqnr(out, ref_out):6.1f} "
                  + " ".join(f"{sqnr(grads[n], ref_grads[n]):15.1f}" for n in GRADS))


if __name__ == "__main__":
    main()
