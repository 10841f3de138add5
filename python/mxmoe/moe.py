"""The fused MoE expert layer: route -> dispatch -> experts (SwiGLU) -> combine, in MXFP8.

    out = mxmoe.moe_experts(x, topk_idx, topk_weights, w13, w2, recipe=..., activation=..., layout=...)

Data flow (docs/design/moe-layer.md; N = T*k rows in expert order, a static bound, so
nothing waits on the host):
  routing   moe_routing(topk_idx, E): offs (E,) expert end rows, perm (N,) sorted row -> entry t*k+j,
            inv (T, k) entry -> row. Ids outside [0, E) are dropped: their rows sit after offs[-1],
            the GEMMs write them as 0, so they add nothing and get no grad.
  (tile128: align_routing pads each expert's rows to a multiple of 16 with zero rows, so that the
            wgrad GEMM reads every group in place)
  GEMM1     h = dispatch(x) @ w13[e]^T (+ bias13)   dispatch = the gather of x's rows, quantized by the
                                                    GEMM's quantizer as it reads them (no copy of x)
  GEMM2     o = act(h) @ w2[e]^T (+ bias2)          act (SwiGLU) computed by GEMM2's quantizer as it
                                                    reads h: no activation tensor is stored
  combine   out[t] = sum_j w[t, j] * o[inv[t, j]]   fp32, j in order: deterministic
Backward: dO = w * gather(dout) and dH = act'(h, dY) are again computed inside the quantizers of the
GEMMs that consume them (each GEMM's dgrad and wgrad operands from one read); dx = the combine of the
dgrad rows without weights (deterministic scatter-add); d topk_weights[t, j] = <dout[t], o[inv[t, j]]>.
Saved for backward: h (bf16: SwiGLU's inputs), o (bf16: the routing weights' grad), the FP8 wgrad
operands of dispatch(x) and act(h), and the routing; the weights' FP8 forms live in the weight cache
(mxmoe/weight_cache.py: once per optimizer step).

Paths, chosen once per call (_path); tile128 and exact are one autograd Function (_FusedMX) over
their recipe family's phase ops:
  tile128  recipe mxfp8_rceil_tile128 on Hopper (FP8 tensor cores) or CPU (the exact reference GEMMs):
           _Tile128Phases, the moe_tile128_* phase ops;
  exact    mxfp8_rceil / mxfp8_floor on Hopper (on CPU with backend='fused'): _ExactPhases, the
           moe_exact_* phase ops (MX round trips + bf16 GEMMs, as the sm90 backend's exact recipes);
  bf16     recipe=None: the same fused data flow unquantized (torch._grouped_mm), the apples-to-apples
           baseline;
  composed everything else (other GPUs, exact recipes on CPU, mxfp8_rceil_wgrad_with_hp, backend
           overrides): mxmoe.grouped_mm between differentiable gather / SwiGLU / combine ops
           (materializes the bf16 intermediates).

Layouts: w13 (E, 2I, H) and w2 (E, H, I), the layouts of transformers 5's gate_up_proj / down_proj.
layout="concatenated": w13[:, :I] is the gate and w13[:, I:] the up projection (transformers'
Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3: `.chunk(2, dim=-1)` of the GEMM output); "interleaved": gate
rows at even and up rows at odd indices (gpt-oss: `[..., ::2]`, `[..., 1::2]`).
activation: "swiglu" (silu(g) * u), "gpt_oss" (gpt-oss's clamped variant: g = min(g, 7),
u = clamp(u, -7, 7), g * sigmoid(1.702 g) * (u + 1)) or a Swiglu(alpha, limit, up_offset).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

from . import ops, weight_cache
from ._lib import build_info
from .backends import row_groups
from .recipes import get_recipe

BF16 = torch.bfloat16
F32 = torch.float32
_FLOAT = (BF16, F32)
GATHER, SWIGLU, SWIGLU_BACKWARD = ops.SOURCE_GATHER, ops.SOURCE_SWIGLU, ops.SOURCE_SWIGLU_BACKWARD

__all__ = ["moe_experts", "Swiglu", "ACTIVATIONS", "LAYOUTS"]


@dataclass(frozen=True)
class Swiglu:
    """act(g, u) = gc * sigmoid(alpha * gc) * (uc + up_offset), gc = min(g, limit), uc = clamp(u, +-limit)."""

    alpha: float = 1.0
    limit: float = math.inf
    up_offset: float = 0.0


ACTIVATIONS = {"swiglu": Swiglu(), "gpt_oss": Swiglu(1.702, 7.0, 1.0)}
LAYOUTS = {"concatenated": 0, "interleaved": 1}


def _activation(activation) -> Swiglu:
    if isinstance(activation, Swiglu):
        return activation
    act = ACTIVATIONS.get(activation) if isinstance(activation, str) else None
    if act is None:
        raise ValueError(f"activation: expected one of {', '.join(map(repr, ACTIVATIONS))} or a mxmoe.moe.Swiglu, "
                         f"got {activation!r}")
    return act


def _layout(layout) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    return LAYOUTS[layout]


# ---- the pieces every path shares ------------------------------------------------------------------


def _act_args(act: Swiglu, layout: int):
    return 1, layout, act.alpha, act.limit, act.up_offset


WGRAD_ALIGN = 16  # the tile128 wgrad GEMM reads a token group in place when it starts at a multiple of 16


def align_routing(offs: Tensor, perm: Tensor, inv: Tensor, align: int):
    """moe_routing's layout with every expert's rows padded to a multiple of `align`: group e keeps its
    rows in order at the start of its padded range, padding rows (perm -1) follow and are read as
    zeros, the dropped entries come after the last group. Returns (offs, perm, inv) of the padded
    layout: perm has a static T*k + (align-1)*E rows rounded up to `align` (no host sync). The tile128
    wgrad GEMM then reads every group in place instead of copying it to an aligned start."""
    n, E = perm.shape[0], offs.shape[0]
    cap = (n + (align - 1) * E + align - 1) // align * align
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    ends = torch.cumsum((counts + (align - 1)) // align * align, 0, dtype=torch.int32)
    # Each group's rows move by (padded start - start); the dropped ones by the total padding.
    shift = torch.cat([ends - (counts + (align - 1)) // align * align - (offs - counts), ends[-1:] - offs[-1:]])
    rows = torch.arange(n, device=perm.device, dtype=torch.int32)
    pos = rows + shift[torch.searchsorted(offs, rows, right=True)]
    perm_al = torch.full((cap,), -1, dtype=torch.int32, device=perm.device).scatter_(0, pos.long(), perm)
    return ends, perm_al, pos[inv.long()]


def _add_bias(out: Tensor, bias: Optional[Tensor], offs: Tensor) -> Tensor:
    """out + bias[g] on group g's rows (fp32, then out's dtype); rows past the groups stay 0."""
    if bias is None:
        return out
    rows = torch.cat([bias.float(), bias.new_zeros((1, bias.shape[1]), dtype=F32)])
    return (out.float() + rows[row_groups(offs, out.shape[0])]).to(out.dtype)


def _bias_grad(rows_grad: Tensor, offs: Tensor, dtype) -> Tensor:
    return ops.moe_group_sum(rows_grad, offs).to(dtype)


def _dtype(t: Optional[Tensor]):
    return None if t is None else t.dtype


def _cast(t: Optional[Tensor], dtype) -> Optional[Tensor]:
    return t if t is None or t.dtype == dtype else t.to(dtype)


# ---- the fused MX paths: one data flow, the recipe family's phase ops ----------------------------


class _Tile128Phases:
    """tile128 on FP8 tensor cores (Hopper) or the CPU reference: the moe_tile128_* phase ops."""

    @staticmethod
    def routing(topk_idx, E):
        return align_routing(*ops.moe_routing(topk_idx, E), WGRAD_ALIGN)

    @staticmethod
    def weights(w, mode):
        q, s, qt, st = weight_cache.forms(w, "sm90_tile128", mode)
        return (q, s), (qt, st)  # forward (along K), dgrad (along N)

    @staticmethod
    def forward(src, fwd, offs, bias, mode, want_col):
        return ops.moe_tile128_forward(*src, *fwd, offs, bias, mode, BF16, want_col)

    @staticmethod
    def backward(src, bwd, a_q, a_s, offs, mode, need_da, need_dw, w_dtype):
        return ops.moe_tile128_backward(*src, *bwd, a_q, a_s, offs, mode, need_da, need_dw, BF16, w_dtype)


class _ExactPhases:
    """Exact recipes (MX round trips + bf16 GEMMs, as the sm90 backend): the moe_exact_* phase ops."""

    @staticmethod
    def routing(topk_idx, E):
        return ops.moe_routing(topk_idx, E)  # the bf16 GEMMs read groups at any row

    @staticmethod
    def weights(w, mode):
        dq, q, s = weight_cache.forms(w, "sm90_exact", mode)
        return (dq,), (q, s)

    @staticmethod
    def forward(src, fwd, offs, bias, mode, want_col):
        out, a_q, a_s = ops.moe_exact_forward(*src, *fwd, offs, mode, want_col)
        return _add_bias(out, bias, offs), a_q, a_s

    @staticmethod
    def backward(src, bwd, a_q, a_s, offs, mode, need_da, need_dw, w_dtype):
        da, dw = ops.moe_exact_backward(*src, *bwd, a_q, a_s, offs, mode, need_da, need_dw)
        return da, _cast(dw, w_dtype)


def _split_grad(dw13: Optional[Tensor], up_rows: Optional[int]):
    """dw13, or (d gate, d up) for a pair whose halves have up_rows rows each."""
    if up_rows is None or dw13 is None:
        return dw13, None
    return dw13[:, :up_rows], dw13[:, up_rows:]


def _gather_src(x, perm, k, row_scale=None):
    return (GATHER, x, None, perm, row_scale, k, 0, 1.0, 0.0, 0.0)


class _FusedMX(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_idx, topk_w, w13, w2, b13, b2, mode: int, act: Swiglu, layout: int, phases,
                w_up=None, score_before: bool = False):
        # w_up: given, w13 is the gate half and w_up the up half (E, I, H) each.
        # score_before: the weights scale the dispatched rows (quantized from the fp32 product) and the
        # combine sums unweighted; the weights' grad then comes from x and the dispatched rows' grad.
        k, E = topk_idx.shape[1], w13.shape[0]
        offs, perm, inv = phases.routing(topk_idx, E)
        need_w13, need_w2 = ctx.needs_input_grad[3] or ctx.needs_input_grad[11], ctx.needs_input_grad[4]
        w13_f, w13_b = phases.weights(w13 if w_up is None else (w13, w_up), mode)
        w2_f, w2_b = phases.weights(w2, mode)
        # GEMM1 on the dispatched rows of x (gathered, scaled when score_before, quantized in one pass).
        rs = topk_w.float().contiguous() if score_before else None
        h, x_q, x_s = phases.forward(_gather_src(x, perm, k, rs), w13_f, offs, b13, mode, need_w13)
        # GEMM2 on act(h), computed by its quantizer.
        swiglu_src = (SWIGLU, h, None, None, None, *_act_args(act, layout))
        o, y_q, y_s = phases.forward(swiglu_src, w2_f, offs, b2, mode, need_w2)
        out = ops.moe_combine(o, inv, None if score_before else topk_w, x.dtype)
        # The weights' grad reads o (weights after the experts) or x (weights before them).
        ctx.save_for_backward(h, x if score_before else o, x_q, x_s, y_q, y_s, *w13_b, *w2_b, offs, perm, inv,
                              topk_w)
        ctx.cfg = (k, mode, act, layout, x.dtype, w13.dtype, w2.dtype, _dtype(b13), _dtype(b2), phases, len(w13_b),
                   score_before)
        ctx.up_rows = None if w_up is None else w_up.shape[1]
        return out

    @staticmethod
    def backward(ctx, dout):
        k, mode, act, layout, x_dtype, w13_dtype, w2_dtype, b13, b2, phases, nb, score_before = ctx.cfg
        h, o_or_x, x_q, x_s, y_q, y_s, *rest = ctx.saved_tensors
        w13_b, w2_b, (offs, perm, inv, topk_w) = rest[:nb], rest[nb:2 * nb], rest[2 * nb:]
        need_x, _, need_tw, need_w13, need_w2, need_b13, need_b2 = ctx.needs_input_grad[:7]
        need_w13 = need_w13 or ctx.needs_input_grad[11]
        dout = dout.contiguous()
        rs = topk_w.float().contiguous()
        rs_after = None if score_before else rs  # the weights' factor on dO (weights after the experts)
        d_tw = None
        if need_tw and not score_before:
            d_tw = ops.moe_combine_weight_grad(dout, o_or_x, inv).to(topk_w.dtype)
        need_dxs = need_x or (need_tw and score_before)  # the dispatched rows' grad
        need_h = need_dxs or need_w13 or need_b13
        dx = dw13 = dw2 = db13 = db2 = None
        if need_h or need_w2:
            # dO = w * gather(dout), quantized as read: dY = dO @ w2 (dgrad) and dW2 = dO^T act(h) (wgrad).
            d_y, dw2 = phases.backward(_gather_src(dout, perm, k, rs_after), w2_b, y_q if need_w2 else None,
                                       y_s if need_w2 else None, offs, mode, need_h, need_w2, w2_dtype)
        if need_b2:
            db2 = _bias_grad(ops.moe_gather(dout, perm, k, rs_after, F32), offs, b2)
        if need_h:
            # dH = act'(h, dY), quantized as read: dXs = dH @ w13 and dW13 = dH^T dispatch(x).
            dswiglu_src = (SWIGLU_BACKWARD, h, d_y, None, None, *_act_args(act, layout))
            dxs, dw13 = phases.backward(dswiglu_src, w13_b, x_q if need_w13 else None, x_s if need_w13 else None,
                                        offs, mode, need_dxs, need_w13, w13_dtype)
            if need_b13:
                db13 = _bias_grad(ops.swiglu_backward(d_y, h, layout, act.alpha, act.limit, act.up_offset), offs, b13)
            if need_tw and score_before:  # d w[t, j] = <x[t], dXs[inv[t, j]]>
                d_tw = ops.moe_combine_weight_grad(o_or_x, dxs, inv).to(topk_w.dtype)
            if need_x:  # dx[t] = sum_j w[t, j] dXs[inv[t, j]] when the weights scaled the rows
                dx = ops.moe_combine(dxs, inv, rs if score_before else None, x_dtype)
        dw13, dw_up = _split_grad(dw13 if need_w13 else None, ctx.up_rows)
        return (dx, None, d_tw, dw13, dw2 if need_w2 else None, db13, db2, None, None, None, None, dw_up, None)


# ---- bf16: the same fused data flow, unquantized --------------------------------------------------


def _mm(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """bf16 torch._grouped_mm (rows past the groups 0); offs from moe_routing are exact group ends."""
    return ops._dense_grouped_mm(a, b, offs)


class _Bf16(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_idx, topk_w, w13, w2, b13, b2, mode: int, act: Swiglu, layout: int, w_up=None,
                score_before: bool = False):
        k, E = topk_idx.shape[1], w13.shape[0]
        offs, perm, inv = ops.moe_routing(topk_idx, E)
        w13b, w2b = _cast(w13 if w_up is None else weight_cache.joined((w13, w_up)), BF16), _cast(w2, BF16)
        # score_before: the rows scaled in fp32 and rounded once to bf16 (TorchTitan's order).
        xs = ops.moe_gather(x, perm, k, topk_w.float().contiguous() if score_before else None, BF16)
        h = _add_bias(_mm(xs, w13b.transpose(-2, -1), offs), b13, offs)
        y = ops.swiglu(h, layout, act.alpha, act.limit, act.up_offset)
        o = _add_bias(_mm(y, w2b.transpose(-2, -1), offs), b2, offs)
        out = ops.moe_combine(o, inv, None if score_before else topk_w, x.dtype)
        ctx.save_for_backward(xs, h, y, x if score_before else o, w13b, w2b, offs, perm, inv, topk_w)
        ctx.cfg = (k, act, layout, x.dtype, w13.dtype, w2.dtype, _dtype(b13), _dtype(b2), score_before)
        ctx.up_rows = None if w_up is None else w_up.shape[1]
        return out

    @staticmethod
    def backward(ctx, dout):
        xs, h, y, o_or_x, w13b, w2b, offs, perm, inv, topk_w = ctx.saved_tensors
        k, act, layout, x_dtype, w13_dtype, w2_dtype, b13, b2, score_before = ctx.cfg
        need_x, _, need_tw, need_w13, need_w2, need_b13, need_b2 = ctx.needs_input_grad[:7]
        need_w13 = need_w13 or ctx.needs_input_grad[10]
        dout = dout.contiguous()
        rs = topk_w.float().contiguous()
        d_tw = None
        if need_tw and not score_before:
            d_tw = ops.moe_combine_weight_grad(dout, o_or_x, inv).to(topk_w.dtype)
        need_dxs = need_x or (need_tw and score_before)
        need_h = need_dxs or need_w13 or need_b13
        dx = dw13 = dw2 = db13 = db2 = None
        d_o = ops.moe_gather(dout, perm, k, None if score_before else rs, BF16)
        if need_w2:
            dw2 = _cast(_mm(d_o.t(), y, offs), w2_dtype)
        if need_b2:
            db2 = _bias_grad(d_o, offs, b2)
        if need_h:
            d_y = _mm(d_o, w2b, offs)
            dh = ops.swiglu_backward(d_y, h, layout, act.alpha, act.limit, act.up_offset)
            if need_w13:
                dw13 = _cast(_mm(dh.t(), xs, offs), w13_dtype)
            if need_b13:
                db13 = _bias_grad(dh, offs, b13)
            if need_dxs:
                dxs = _mm(dh, w13b, offs)
                if need_tw and score_before:  # d w[t, j] = <x[t], dXs[inv[t, j]]>
                    d_tw = ops.moe_combine_weight_grad(o_or_x, dxs, inv).to(topk_w.dtype)
                if need_x:
                    dx = ops.moe_combine(dxs, inv, rs if score_before else None, x_dtype)
        dw13, dw_up = _split_grad(dw13, ctx.up_rows)
        return (dx, None, d_tw, dw13, dw2, db13, db2, None, None, None, dw_up, None)


# ---- composed: mxmoe.grouped_mm between differentiable gather / SwiGLU / combine --------------------


class _Gather(torch.autograd.Function):
    """x rows in expert order; backward: the deterministic sum of each token's k rows."""

    @staticmethod
    def forward(ctx, x, perm, inv, k: int):
        ctx.save_for_backward(inv)
        ctx.x_dtype = x.dtype
        return ops.moe_gather(x, perm, k, None, x.dtype)

    @staticmethod
    def backward(ctx, dxs):
        (inv,) = ctx.saved_tensors
        return ops.moe_combine(dxs.contiguous(), inv, None, ctx.x_dtype), None, None, None


class _Act(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, act: Swiglu, layout: int):
        h = h.contiguous()
        ctx.save_for_backward(h)
        ctx.act, ctx.layout = act, layout
        return ops.swiglu(h, layout, act.alpha, act.limit, act.up_offset)

    @staticmethod
    def backward(ctx, dy):
        (h,) = ctx.saved_tensors
        a = ctx.act
        return ops.swiglu_backward(dy.contiguous(), h, ctx.layout, a.alpha, a.limit, a.up_offset), None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o, topk_w, perm, inv, k: int, out_dtype):
        o = o.contiguous()
        ctx.save_for_backward(o, topk_w, perm, inv)
        ctx.k = k
        return ops.moe_combine(o, inv, topk_w, out_dtype)

    @staticmethod
    def backward(ctx, dout):
        o, topk_w, perm, inv = ctx.saved_tensors
        dout = dout.contiguous()
        d_o = ops.moe_gather(dout, perm, ctx.k, topk_w.float().contiguous(), o.dtype)
        d_tw = ops.moe_combine_weight_grad(dout, o, inv).to(topk_w.dtype) if ctx.needs_input_grad[1] else None
        return d_o, d_tw, None, None, None, None


def _composed(x, topk_idx, topk_w, w13, w2, b13, b2, recipe, backend, act, layout, score_before=False):
    """score_before: sum_j expert(w[t, j] * x[t]) (TorchTitan's score_before_experts) instead of
    sum_j w[t, j] * expert(x[t]): the weights scale the gathered rows (one fp32 multiply, rounded
    once to x's dtype, as TorchTitan) and the combine sums unweighted. recipe None: bf16 GEMMs."""
    from .grouped import grouped_mm  # the drop-in's autograd; imported here: grouped imports nothing of ours

    def mm(a, w, bias):
        if recipe is None:
            out = torch._grouped_mm(a, w.to(a.dtype).transpose(-2, -1), offs=offs)
            return out if bias is None else _add_bias(out, bias, offs)
        return grouped_mm(a, w.transpose(-2, -1), offs, recipe=recipe, backend=backend, bias=bias)

    k, E = topk_idx.shape[1], w13.shape[0]
    offs, perm, inv = ops.moe_routing(topk_idx, E)
    xs = _Gather.apply(x, perm, inv, k)
    if score_before:
        xs = (xs.float() * topk_w.reshape(-1).float()[perm.long()].unsqueeze(1)).to(x.dtype)
        topk_w = torch.ones_like(topk_w, dtype=F32)
    h = mm(xs, w13, b13)
    y = _Act.apply(h, act, layout)
    o = mm(y, w2, b2)
    return _Combine.apply(o, topk_w, perm, inv, k, x.dtype)


# ---- the entry point ---------------------------------------------------------------------------------


def is_dtensor(t) -> bool:
    """A torch.distributed DTensor (checked by name: no torch.distributed import on this path)."""
    return type(t).__name__ == "DTensor"


def _desc(t) -> str:
    if not isinstance(t, Tensor):
        return type(t).__name__
    return f"{str(t.dtype).replace('torch.', '')} tensor of shape {tuple(t.shape)} on {t.device}"


def _check_pair(w13):
    """A (gate, up) pair for w13: two (E, I, H) tensors of one dtype and device."""
    if len(w13) != 2 or not all(isinstance(t, Tensor) for t in w13):
        raise ValueError(f"w13: expected a tensor or a (gate, up) pair of tensors, got {len(w13)} items "
                         f"({', '.join(_desc(t) for t in w13)})")
    g, u = w13
    if g.dim() != 3 or u.shape != g.shape or u.dtype != g.dtype or u.device != g.device:
        raise ValueError(f"w13: expected gate and up weights of one (E, I, H) shape, dtype and device, got a "
                         f"{_desc(g)} and a {_desc(u)}")


def _check(x, topk_idx, topk_w, w13, w2, b13, b2):
    if isinstance(w13, (tuple, list)):
        _check_pair(w13)
        g = w13[0]
        # The pair's checks below run on the shape it stands for: (E, 2I, H).
        w13 = g.new_empty((1, 1, 1)).expand(g.shape[0], 2 * g.shape[1], g.shape[2])
    for name, t in (("x", x), ("topk_idx", topk_idx), ("topk_weights", topk_w), ("w13", w13), ("w2", w2)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2 or x.dtype not in _FLOAT:
        raise ValueError(f"x: expected a (T, H) bfloat16 or float32 tensor, got a {_desc(x)}")
    T, H = x.shape
    if topk_idx.dim() != 2 or topk_idx.shape[0] != T or topk_idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_idx: expected a (T={T}, k) int32 or int64 tensor of expert ids, got a {_desc(topk_idx)}")
    k = topk_idx.shape[1]
    if topk_w.shape != topk_idx.shape or topk_w.dtype not in _FLOAT:
        raise ValueError(f"topk_weights: expected a ({T}, {k}) bfloat16 or float32 tensor (topk_idx's shape), "
                         f"got a {_desc(topk_w)}")
    if w13.dim() != 3 or w13.shape[2] != H or w13.shape[1] % 2 != 0 or w13.dtype not in _FLOAT:
        raise ValueError(f"w13: expected an (E, 2I, H={H}) bfloat16 or float32 tensor (gate and up), got a {_desc(w13)}")
    E, I = w13.shape[0], w13.shape[1] // 2
    if w2.dim() != 3 or tuple(w2.shape) != (E, H, I) or w2.dtype not in _FLOAT:
        raise ValueError(f"w2: expected an (E={E}, H={H}, I={I}) bfloat16 or float32 tensor, got a {_desc(w2)}")
    if H % 32 != 0 or I % 32 != 0:
        raise ValueError(f"w13: expected H and I to be multiples of 32 (MX blocks), got H={H}, I={I}")
    for name, b, n in (("bias13", b13, 2 * I), ("bias2", b2, H)):
        if b is not None and (not isinstance(b, Tensor) or b.dim() != 2 or tuple(b.shape) != (E, n)
                              or b.dtype not in _FLOAT):
            raise ValueError(f"{name}: expected an (E={E}, {n}) bfloat16 or float32 tensor, got a {_desc(b)}")
    for name, t in (("topk_idx", topk_idx), ("topk_weights", topk_w), ("w13", w13), ("w2", w2), ("bias13", b13),
                    ("bias2", b2)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (x's), got {t.device}")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"x: expected a cpu or cuda tensor, got a tensor on device '{x.device}'")


def _path(recipe, device: torch.device, backend: str) -> str:
    if recipe is None:
        return "bf16"
    r = get_recipe(recipe)
    if backend == "composed" or r.wgrad_hp:
        return "composed"
    if backend not in ("auto", "fused"):
        raise ValueError(f"backend: expected 'auto', 'fused' or 'composed', got {backend!r}")
    if device.type == "cuda":
        from .sm90 import is_sm90

        fused_ok = is_sm90(device) and (not r.w_tile128 or _TILE128_GEMM)
        if not fused_ok:
            if backend == "fused":
                raise NotImplementedError(f"backend='fused': the fused {r.name} layer needs a Hopper GPU (sm_90) "
                                          f"and a build with the tile128 GEMMs; got {torch.cuda.get_device_name(device)}")
            return "composed"
    elif not r.w_tile128 and backend == "auto":
        # CPU, exact recipes: the core's MX GEMMs (reference backend) beat the bf16 GEMMs of the
        # fused exact phases there (torch's CPU bf16 grouped GEMM is slow); backend='fused' runs them.
        return "composed"
    return "tile128" if r.w_tile128 else "exact"


def layer_backend_kwargs(backend: str) -> dict:
    """moe_experts' backend arguments for a backend name that may also be an mxmoe.grouped_mm backend
    ('reference', 'sm90', ...: the composed layer on it), as convert() and the integrations take it."""
    if backend in ("auto", "fused", "composed"):
        return {"backend": backend}
    return {"backend": "composed", "grouped_mm_backend": backend}


_PHASES = {"tile128": _Tile128Phases, "exact": _ExactPhases}
# Read once at import (an op returning a str cannot be traced by torch.compile).
_TILE128_GEMM = bool(build_info()["tile128_gemm"])


def moe_experts(
    x: Tensor,
    topk_idx: Tensor,
    topk_weights: Tensor,
    w13: Tensor,
    w2: Tensor,
    *,
    recipe: Optional[str] = "mxfp8_rceil_tile128",
    activation: Union[str, Swiglu] = "swiglu",
    layout: str = "concatenated",
    bias13: Optional[Tensor] = None,
    bias2: Optional[Tensor] = None,
    backend: str = "auto",
    grouped_mm_backend: str = "auto",
    score_before: bool = False,
) -> Tensor:
    """The MoE experts of one layer, fused: out[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t]).

    expert_e(v) = w2[e] @ act(w13[e] @ v + bias13[e]) + bias2[e], with act the SwiGLU of the gate and up
    halves of w13's output (layout, activation: see the module docstring).

    Args:
      x: (T, H) bfloat16 or float32 tokens.
      topk_idx: (T, k) int32 or int64 expert ids; ids outside [0, E) are dropped (contribute 0, never
        read out of bounds).
      topk_weights: (T, k) bfloat16 or float32 routing weights (used as given: no normalization).
      w13: (E, 2I, H) gate and up projections, or a (gate, up) pair of (E, I, H) tensors (TorchTitan's
        w1, w3: joined for the GEMM, once per optimizer step where the weight cache holds it; each gets
        its own grad); w2: (E, H, I) down projections (bfloat16 or float32).
      recipe: 'mxfp8_rceil_tile128' (default: FP8 tensor cores on Hopper), 'mxfp8_rceil', 'mxfp8_floor',
        'mxfp8_rceil_wgrad_with_hp' (see mxmoe.recipes), or None for the same fused layer in bf16.
      bias13: optional (E, 2I); bias2: optional (E, H) expert biases.
      backend: 'auto' (the fused path where one exists, else 'composed'), 'fused' (raise instead of
        composing) or 'composed' (mxmoe.grouped_mm between differentiable gather / SwiGLU / combine).
      grouped_mm_backend: the composed path's mxmoe.grouped_mm backend ('auto', 'sm90', 'reference', ...).
      score_before: apply the weights to the dispatched rows instead of the expert outputs (TorchTitan's
        score_before_experts): out[t] = sum_j expert_{idx[t, j]}(w[t, j] * x[t]). The product is formed in
        fp32; the bf16 layer rounds it to bf16 as TorchTitan does, the MX layers quantize it directly.
    Returns (T, H) in x's dtype. Differentiable in x, topk_weights, w13, w2 and the biases.
    H and I must be multiples of 32.
    """
    weights = (*(w13 if isinstance(w13, (tuple, list)) else (w13,)), w2, bias13, bias2)
    if not isinstance(score_before, bool):
        raise ValueError(f"score_before: expected a bool, got {type(score_before).__name__}")
    if any(is_dtensor(t) for t in weights):  # tensor parallel (mxmoe/distributed/tensor_parallel.py)
        if score_before:
            raise NotImplementedError("score_before=True with DTensor (tensor-parallel) expert weights is not "
                                      "supported; apply the weights after the experts")
        from .distributed.tensor_parallel import moe_experts_tensor_parallel

        return moe_experts_tensor_parallel(x, topk_idx, topk_weights, w13, w2, bias13=bias13, bias2=bias2,
                                           layout=layout, recipe=recipe, activation=activation, backend=backend,
                                           grouped_mm_backend=grouped_mm_backend)
    if is_dtensor(x):
        raise ValueError(f"x: a DTensor with placements {tuple(x.placements)} and plain expert weights; pass "
                         "x.to_local() (or DTensor weights, for tensor parallelism)")
    _check(x, topk_idx, topk_weights, w13, w2, bias13, bias2)
    act, lay = _activation(activation), _layout(layout)
    path = _path(recipe, x.device, backend)
    w_up = None
    if isinstance(w13, (tuple, list)):
        if path == "composed":
            w13 = torch.cat(tuple(w13), dim=1)
        else:
            w13, w_up = w13
    if path == "composed":
        return _composed(x, topk_idx.contiguous(), topk_weights.contiguous(), w13, w2, bias13, bias2, recipe,
                         grouped_mm_backend, act, lay, score_before=score_before)
    args = (x.contiguous(), topk_idx.contiguous(), topk_weights.contiguous(), w13, w2, bias13, bias2)
    if path == "bf16":
        return _Bf16.apply(*args, 0, act, lay, w_up, score_before)
    return _FusedMX.apply(*args, get_recipe(recipe).mode, act, lay, _PHASES[path], w_up, score_before)
