"""The fused MoE layer's autograd functions: one data flow, three ways to run it (the entry point,
mxmoe.moe_experts, is in layer.py; the data flow is described in mxmoe/moe/__init__.py).

  FusedMX   the fused MX layer over a recipe family's phase ops (mxmoe/backends/phases.py), handed over
            by the backend that runs it (Backend.layer_phases)
  Bf16      the same fused data flow unquantized (torch._grouped_mm): recipe=None
  composed  mxmoe.grouped_mm between the differentiable Gather / Act (SwiGLU) / Combine functions
            (materializes the bf16 intermediates); Combine is also expert parallelism's combine
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import grouped, ops, weight_cache
from ..backends.common import add_group_bias
from .activation import Swiglu

BF16 = torch.bfloat16
F32 = torch.float32
GATHER, SWIGLU, SWIGLU_BACKWARD = ops.SOURCE_GATHER, ops.SOURCE_SWIGLU, ops.SOURCE_SWIGLU_BACKWARD

__all__ = ["FusedMX", "Bf16", "Gather", "Act", "Combine", "composed"]


# ---- the pieces every path shares ------------------------------------------------------------------


def _act_args(act: Swiglu, layout: int):
    return 1, layout, act.alpha, act.limit, act.up_offset


def _bias_grad(rows_grad: Tensor, offs: Tensor, dtype) -> Tensor:
    return ops.moe_group_sum(rows_grad, offs).to(dtype)


def _dtype(t: Optional[Tensor]):
    return None if t is None else t.dtype


def _may_release() -> bool:
    """Whether this backward may hand a saved tensor's memory back at its last read instead of when the
    autograd graph lets go of it (after the whole backward): eager only (a compiled backward has its own
    liveness), no CUDA graph being captured, and the graph not kept for another backward (retain_graph or
    create_graph read the saved tensors again)."""
    if torch.compiler.is_compiling():
        return False
    keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    if keep_graph is None or keep_graph():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _release(t: Optional[Tensor]) -> None:
    """t's memory back to the allocator now (t is empty afterwards) where _may_release allows: for the
    layer's own saved intermediates (h) after their last read, which nothing outside the layer holds."""
    if t is not None and _may_release():
        t.untyped_storage().resize_(0)


def _cast(t: Optional[Tensor], dtype) -> Optional[Tensor]:
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _split_grad(dw13: Optional[Tensor], up_rows: Optional[int]):
    """dw13, or (d gate, d up) for a pair whose halves have up_rows rows each."""
    if up_rows is None or dw13 is None:
        return dw13, None
    return dw13[:, :up_rows], dw13[:, up_rows:]


def _gather_src(x, perm, k, row_scale=None):
    return (GATHER, x, None, perm, row_scale, k, 0, 1.0, 0.0, 0.0)


def _scale_rows(rows: Tensor, perm: Tensor, rs: Tensor, k: int) -> Tensor:
    """rows[n] * rs.flat[perm[n]] (0 for padding rows), one fp32 multiply rounded once to rows' dtype, in
    one vectorized pass: the gather kernel over the rows themselves (identity index, k = 1) with each
    row's factor as its row scale. (A broadcast bf16 x fp32 torch.mul, the same bits, took PyTorch's
    unvectorized path: 834 us on gpt-oss-120b's 65536 x 2880 rows on the H100.)"""
    factor = ops.moe_gather(torch.ones(rs.shape[0], 1, dtype=F32, device=rs.device), perm, k, rs, F32)
    ident = torch.arange(rows.shape[0], dtype=torch.int32, device=rows.device)
    return ops.moe_gather(rows, ident, 1, factor, rows.dtype)


def _bias_weight_grad(dout: Tensor, topk_idx: Tensor, b2: Tensor) -> Tensor:
    """<dout[t], b2[topk_idx[t, j]]> in fp32, 0 for ids outside [0, E) (dropped entries)."""
    E = b2.shape[0]
    per_expert = dout.float() @ b2.float().t()  # (T, E)
    idx = topk_idx.long()
    kept = (idx >= 0) & (idx < E)
    return torch.where(kept, per_expert.gather(1, idx.clamp(0, E - 1)), 0.0)


# ---- the fused MX paths: one data flow, the recipe family's phase ops ----------------------------


class FusedMX(torch.autograd.Function):
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
        # GEMM1 on the dispatched rows of x (gathered, scaled when score_before, quantized as read). The
        # wgrad operand of those rows is built in the backward from x: nothing of T*k rows x H is kept.
        # On tile128 (concatenated halves with I % 128 == 0, or interleaved ones with I % 64 == 0; b13 or
        # none) GEMM1's epilogue computes act(h) and writes its FP8 forms (GEMM2's operand and dW2's);
        # else GEMM2's quantizer computes it as it reads h.
        fused_up = (not score_before and hasattr(phases, "fused_up_takes")
                    and phases.fused_up_takes(x, w13_f, k, layout, b13 is not None))
        if fused_up:
            h, o, y_q, y_s = phases.fused_up_forward(x, perm, k, w13_f, act, w2_f, offs, b2, mode, need_w2, b13,
                                                     layout)
        else:
            rs = topk_w.float().contiguous() if score_before else None
            h, _, _ = phases.forward(_gather_src(x, perm, k, rs), w13_f, offs, b13, mode, False)
            swiglu_src = (SWIGLU, h, None, None, None, *_act_args(act, layout))
            o, y_q, y_s = phases.forward(swiglu_src, w2_f, offs, b2, mode, need_w2)
        out = ops.moe_combine(o, inv, None if score_before else topk_w, x.dtype)
        # The expert outputs o are not kept: with the weights after the experts their grad comes from
        # the unweighted dgrad and h (backward); with the weights before them, from x.
        ctx.save_for_backward(h, x, y_q, y_s, *w13_b, *w2_b, offs, perm, inv,
                              topk_w, *((topk_idx, b2) if b2 is not None and not score_before else (None, None)))
        ctx.cfg = (k, mode, act, layout, x.dtype, w13.dtype, w2.dtype, _dtype(b13), _dtype(b2), phases, len(w13_b),
                   score_before)
        ctx.up_rows = None if w_up is None else w_up.shape[1]
        return out

    @staticmethod
    def backward(ctx, dout):
        k, mode, act, layout, x_dtype, w13_dtype, w2_dtype, b13, b2, phases, nb, score_before = ctx.cfg
        h, x_saved, y_q, y_s, *rest = ctx.saved_tensors
        w13_b, w2_b, (offs, perm, inv, topk_w, topk_idx, b2_w) = rest[:nb], rest[nb:2 * nb], rest[2 * nb:]
        need_x, _, need_tw, need_w13, need_w2, need_b13, need_b2 = ctx.needs_input_grad[:7]
        need_w13 = need_w13 or ctx.needs_input_grad[11]
        dout = dout.contiguous()
        rs = topk_w.float().contiguous()
        d_tw = None
        need_dxs = need_x or (need_tw and score_before)  # the dispatched rows' grad
        need_h = need_dxs or need_w13 or need_b13
        dx = dw13 = dw2 = db13 = db2 = None
        # Weights after the experts on tile128 (concatenated halves, I % 128 == 0, no b13): the down
        # projection's dgrad with dSwiGLU in its epilogue. dY' = gather(dout) @ w2 is never stored; the
        # kernel writes dH = act'(h, w * dY') as the FP8 operands of dXs = dH @ w13 and dW13 =
        # dH^T dispatch(x), and per-row partials of <dY', act(h)>, the weights' gradient.
        fused_down = (not score_before and need_h and b13 is None and hasattr(phases, "fused_down_takes")
                      and phases.fused_down_takes(dout, h, w2_b, k, layout))
        # Order: the grads that are needed last are made last, and what they read is freed before (the
        # peak is in the up projection's backward; dW2 comes after dx).
        x_q = x_s = None
        if need_w13 and not fused_down:  # dispatch(x)'s wgrad operand, as the forward would have built it
            x_q, x_s = phases.wgrad_operand(_gather_src(x_saved, perm, k, rs if score_before else None), offs, mode)
        if score_before:
            # dO = gather(dout) (no weights after the experts): dY = dO @ w2 and dW2 = dO^T act(h).
            if need_h or need_w2:
                d_y, dw2 = phases.backward(_gather_src(dout, perm, k), w2_b, y_q if need_w2 else None,
                                           y_s if need_w2 else None, offs, mode, need_h, need_w2, w2_dtype)
            dy_factor = ()
        else:
            # Weights after the experts, dO = w * gather(dout). The dgrad runs on the unweighted rows,
            # dY' = gather(dout) @ w2 (the rows read per token by the gather GEMM), and the weights are
            # applied where dY' is read next: dH = act'(h, w * dY'). d w[t, j] = <dout[t], o[n]> =
            # <dY'[n], act(h[n])> (+ <dout[t], b2[e]>), so o is never kept. The wgrad reads the weighted
            # rows, dW2 = (w * gather(dout))^T act(h), quantized as read.
            if fused_down:
                # h's one read is the first GEMM's: its memory goes back right after (_may_release), so
                # the up projection's wgrad and dgrad peak without it.
                dxs, dw13, tw_part = phases.fused_down_backward(dout, perm, k, rs, w2_b, h, act, w13_b,
                                                                x_saved if need_w13 else None, offs, mode, need_dxs,
                                                                need_w13, w13_dtype, _may_release())
            elif need_h or need_tw:
                d_y, _ = phases.backward(_gather_src(dout, perm, k), w2_b, None, None, offs, mode, True, False,
                                         w2_dtype)
            if need_tw:
                if fused_down:
                    d_tw = tw_part.sum(1)[inv.long()]  # rows past the groups (dropped ids) are 0
                else:
                    d_tw = ops.moe_swiglu_weight_grad(d_y, h, inv, layout, act.alpha, act.limit, act.up_offset)
                if topk_idx is not None:  # the output bias's share of o
                    d_tw = d_tw + _bias_weight_grad(dout, topk_idx, b2_w)
                d_tw = d_tw.to(topk_w.dtype)
            dy_factor = (perm, rs, k)
        if need_b2:
            db2 = _bias_grad(ops.moe_gather(dout, perm, k, None if score_before else rs, F32), offs, b2)
        if need_h and not fused_down:
            # dH = act'(h, [w *] dY), quantized as read: dXs = dH @ w13 and dW13 = dH^T dispatch(x).
            if dy_factor:
                dswiglu_src = (SWIGLU_BACKWARD, h, d_y, *dy_factor, *_act_args(act, layout)[1:])
            else:
                dswiglu_src = (SWIGLU_BACKWARD, h, d_y, None, None, *_act_args(act, layout))
            dxs, dw13 = phases.backward(dswiglu_src, w13_b, x_q, x_s, offs, mode, need_dxs, need_w13, w13_dtype)
            if need_b13:
                d_y_w = d_y if score_before else _scale_rows(d_y, perm, rs, k)
                db13 = _bias_grad(ops.swiglu_backward(d_y_w, h, layout, act.alpha, act.limit, act.up_offset), offs, b13)
            if need_tw and score_before:  # d w[t, j] = <x[t], dXs[inv[t, j]]>
                d_tw = ops.moe_combine_weight_grad(x_saved, dxs, inv).to(topk_w.dtype)
            _release(h)  # its last read (dW2 reads act(h)'s saved forms)
        if need_x:  # dx[t] = sum_j w[t, j] dXs[inv[t, j]] when the weights scaled the rows
            dx = ops.moe_combine(dxs, inv, rs if score_before else None, x_dtype)
        dxs = d_y = x_q = x_s = None
        if need_w2 and not score_before:
            _, dw2 = phases.backward(_gather_src(dout, perm, k, rs), w2_b, y_q, y_s, offs, mode, False, True,
                                     w2_dtype)
        dw13, dw_up = _split_grad(dw13 if need_w13 else None, ctx.up_rows)
        return (dx, None, d_tw, dw13, dw2 if need_w2 else None, db13, db2, None, None, None, None, dw_up, None)


# ---- bf16: the same fused data flow, unquantized --------------------------------------------------


def _mm(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """bf16 torch._grouped_mm (rows past the groups 0); offs from moe_routing are exact group ends."""
    return ops.dense_grouped_mm(a, b, offs)


def _gather_mm_takes(t: Tensor, w: Tensor, k: int, w_kn: bool) -> bool:
    """Whether ops.moe_gather_mm_bf16 runs rows of t (T, K) routed k ways times w on the GPU: the shape
    limits of mxmoe_grouped_mm_bf16_gather_available, decided in Python so torch.compile sees a plain
    branch (int32 rows and indices, 32-bit byte offsets of t's rows, the group table in shared memory;
    w (E, K, N) read as it lies needs K and N multiples of 64). No tokens: the ops write nothing."""
    T, K = t.shape
    E, N = w.shape[0], w.shape[2] if w_kn else w.shape[1]
    if w_kn and (K % 64 != 0 or N % 64 != 0 or E * K >= 2**31):  # B's row coordinate g K + k0: int32
        return False
    return K % 8 == 0 and N % 16 == 0 and 0 < E <= 2048 and E * N < 2**31 and T * K < 2**31 and T * k < 2**31


def _kgather_mm_takes(m: int, n: int, E: int, t: Tensor, k: int) -> bool:
    """Whether ops.moe_kgather_mm_bf16 runs a (G = E, m, n) wgrad over t's rows routed k ways on the GPU:
    mxmoe_grouped_mm_bf16_kgather_available's limits (m and n multiples of 8, int32 rows, indices and
    tiles, the group table in shared memory), in Python for torch.compile."""
    return m % 8 == 0 and n % 8 == 0 and 0 < E <= 2048 and E * m < 2**31 and t.shape[0] * k < 2**31


class Bf16(torch.autograd.Function):
    """FusedMX's data flow in bf16: x and the pre-activation h are kept, nothing of T*k rows x H.
    gather (Backend.bf16_gather_gemms, a tuple of BF16_GATHER_PIECES) names the GEMMs that read their
    routed rows of x or dout inside the GEMM instead of from a gathered copy for torch._grouped_mm:
      "up"         the up projection (ops.moe_gather_mm_bf16; b13 and SwiGLU then run as passes);
      "up_swiglu"  the up projection with b13 and act(h) in its epilogue (ops.moe_swiglu_mm_bf16;
                   interleaved halves, or concatenated ones with I % 64 == 0; else "up" if named);
      "down_dgrad" the down projection's dgrad with dH, the routing weights' grad and dW2's act(h) in its
                   epilogue instead of storing dY' (ops.moe_dswiglu_mm_bf16);
      "wgrad"      dW13 = dH^T dispatch(x) and dW2 = dispatch(dout)^T (w act(h)) (ops.moe_kgather_mm_bf16).
    act(h) is recomputed for dW2 (but by "down_dgrad"); the routing weights' grad comes from the unweighted
    dgrad and h, as on the MX paths."""

    @staticmethod
    def forward(ctx, x, topk_idx, topk_w, w13, w2, b13, b2, mode: int, act: Swiglu, layout: int, w_up=None,
                score_before: bool = False, gather: tuple = ()):
        k, E = topk_idx.shape[1], w13.shape[0]
        offs, perm, inv = ops.moe_routing(topk_idx, E)
        w13b, w2b = _cast(w13 if w_up is None else weight_cache.joined((w13, w_up)), BF16), _cast(w2, BF16)
        gather_up = not score_before and _gather_mm_takes(x, w13b, k, False)
        if gather_up and "up_swiglu" in gather and (layout == ops.SWIGLU_INTERLEAVED or w13b.shape[1] % 128 == 0):
            # h (+ b13) and act(h) from the GEMM's epilogue: no bias pass, no SwiGLU pass over h
            h, y = ops.moe_swiglu_mm_bf16(_cast(x, BF16), perm, k, w13b, b13, layout, act.alpha, act.limit,
                                          act.up_offset, offs)
        else:
            if gather_up and "up" in gather:
                h = ops.moe_gather_mm_bf16(_cast(x, BF16), perm, k, w13b, False, offs)
            else:
                # score_before: the rows scaled in fp32 and rounded once to bf16 (TorchTitan's order), then
                # the GEMM: the row scale cannot move after it.
                rs = topk_w.float().contiguous() if score_before else None
                h = _mm(ops.moe_gather(x, perm, k, rs, BF16), w13b.transpose(-2, -1), offs)
            h = add_group_bias(h, b13, offs)
            y = ops.swiglu(h, layout, act.alpha, act.limit, act.up_offset)
        o = add_group_bias(_mm(y, w2b.transpose(-2, -1), offs), b2, offs)
        del y
        out = ops.moe_combine(o, inv, None if score_before else topk_w, x.dtype)
        ctx.save_for_backward(h, x, w13b, w2b, offs, perm, inv, topk_w,
                              *((topk_idx, b2) if b2 is not None and not score_before else (None, None)))
        ctx.cfg = (k, act, layout, x.dtype, w13.dtype, w2.dtype, _dtype(b13), _dtype(b2), score_before, gather)
        ctx.up_rows = None if w_up is None else w_up.shape[1]
        return out

    @staticmethod
    def backward(ctx, dout):
        h, x_saved, w13b, w2b, offs, perm, inv, topk_w, topk_idx, b2_w = ctx.saved_tensors
        k, act, layout, x_dtype, w13_dtype, w2_dtype, b13, b2, score_before, gather = ctx.cfg
        need_x, _, need_tw, need_w13, need_w2, need_b13, need_b2 = ctx.needs_input_grad[:7]
        need_w13 = need_w13 or ctx.needs_input_grad[10]
        dout = dout.contiguous()
        rs = topk_w.float().contiguous()
        act_args = (layout, act.alpha, act.limit, act.up_offset)
        d_tw = None
        need_dxs = need_x or (need_tw and score_before)
        need_h = need_dxs or need_w13 or need_b13
        dx = dw13 = dw2 = db13 = db2 = None
        d_y = dh = y_w2 = None  # y_w2: act(h) for dW2 where it was made before h was released
        if need_h or (need_tw and not score_before):
            # The dgrad on the unweighted rows, dY' = gather(dout) @ w2; with the weights after the
            # experts they are applied where dY' is read next, dH = act'(h, w * dY'), and d w[t, j] =
            # <dout[t], o[n]> = <dY'[n], act(h[n])> (+ <dout[t], b2[e]>): o is not kept.
            if "down_dgrad" in gather and _gather_mm_takes(dout, w2b, k, True):
                # dY' is never stored: its GEMM's epilogue writes dH = act'(h, bf16(w * dY')), the routing
                # weights' per-128-column partials of <dY', act(h)> and dW2's act(h) (no second pass over h).
                dh, tw_part, y_act = ops.moe_dswiglu_mm_bf16(_cast(dout, BF16), perm, k, w2b, h,
                                                             None if score_before else rs, layout, act.alpha,
                                                             act.limit, act.up_offset, offs, need_w2)
                y_w2 = y_act if need_w2 else None  # (0, I) when not asked for
                del y_act  # y_w2 alone holds it, so that dropping y_w2 frees it
                if need_tw and not score_before:
                    d_tw = tw_part.sum(1)[inv.long()]  # rows past the groups (dropped ids) are 0
                del tw_part
            else:
                d_y = _mm(ops.moe_gather(dout, perm, k, None, BF16), w2b, offs)
                if need_tw and not score_before:
                    d_tw = ops.moe_swiglu_weight_grad(d_y, h, inv, *act_args)
            if need_tw and not score_before:
                if topk_idx is not None:  # the output bias's share of o
                    d_tw = d_tw + _bias_weight_grad(dout, topk_idx, b2_w)
                d_tw = d_tw.to(topk_w.dtype)
        if need_h:
            if dh is None:
                dh = ops.swiglu_backward(d_y if score_before else _scale_rows(d_y, perm, rs, k), h, *act_args)
            d_y = None
            if _may_release():
                # h's reads are done but dW2's act(h): made now unless the dgrad's epilogue made it (I
                # columns a row instead of h's 2I), and h's memory goes back before the up projection's grads.
                if need_w2 and y_w2 is None:
                    y_w2 = ops.swiglu(h, *act_args)
                _release(h)
            if need_b13:
                db13 = _bias_grad(dh, offs, b13)
            # dXs (and dx from it) before dW13, so that the routed rows' grad is freed before the weights'
            # grad exists: the peak holds one of them beside h and dH, not both.
            if need_dxs:
                dxs = _mm(dh, w13b, offs)
                if need_tw and score_before:  # d w[t, j] = <x[t], dXs[inv[t, j]]>
                    d_tw = ops.moe_combine_weight_grad(x_saved, dxs, inv).to(topk_w.dtype)
                if need_x:
                    dx = ops.moe_combine(dxs, inv, rs if score_before else None, x_dtype)
                del dxs
            if need_w13 and "wgrad" in gather and not score_before and _kgather_mm_takes(
                    dh.shape[1], x_saved.shape[1], w13b.shape[0], x_saved, k):
                # dW13 = dH^T dispatch(x), the rows of x read inside the GEMM
                dw13 = _cast(ops.moe_kgather_mm_bf16(dh, _cast(x_saved, BF16), perm, k, True, offs), w13_dtype)
            elif need_w13:  # dispatch(x), as the forward built it
                xs = ops.moe_gather(x_saved, perm, k, rs if score_before else None, BF16)
                dw13 = _cast(_mm(dh.t(), xs, offs), w13_dtype)
                del xs
            dh = None
        d_y = None
        # dO = [w *] gather(dout): dW2 = dO^T act(h) (act(h) recomputed), db2 from dO. Last: the up
        # projection's operands are freed by then (the peak was there with dW2 alive).
        kgather_w2 = need_w2 and "wgrad" in gather and _kgather_mm_takes(w2b.shape[1], w2b.shape[2], w2b.shape[0],
                                                                          dout, k)
        if kgather_w2:
            # dW2 = dispatch(dout)^T ([w *] act(h)): the weights on act(h)'s rows, dout's rows read in the GEMM
            y = ops.swiglu(h, *act_args) if y_w2 is None else y_w2
            y_w2 = None
            if not score_before:  # in place (fp32 product, rounded once): no second N x I tensor at the peak
                y.mul_(ops.moe_gather(torch.ones(rs.shape[0], 1, dtype=F32, device=rs.device), perm, k, rs, F32))
            dw2 = _cast(ops.moe_kgather_mm_bf16(_cast(dout, BF16), y, perm, k, False, offs), w2_dtype)
            del y
        if (need_w2 and not kgather_w2) or need_b2:
            d_o = ops.moe_gather(dout, perm, k, None if score_before else rs, BF16)
            if need_w2 and not kgather_w2:
                dw2 = _cast(_mm(d_o.t(), ops.swiglu(h, *act_args) if y_w2 is None else y_w2, offs), w2_dtype)
            y_w2 = None
            if need_b2:
                db2 = _bias_grad(d_o, offs, b2)
            del d_o
        dw13, dw_up = _split_grad(dw13, ctx.up_rows)
        return (dx, None, d_tw, dw13, dw2, db13, db2, None, None, None, dw_up, None, None)


# ---- composed: mxmoe.grouped_mm between differentiable gather / SwiGLU / combine --------------------


class Gather(torch.autograd.Function):
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


class Act(torch.autograd.Function):
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


class Combine(torch.autograd.Function):
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


def composed(x, topk_idx, topk_w, w13, w2, b13, b2, recipe, backend, act, layout, score_before=False):
    """score_before: sum_j expert(w[t, j] * x[t]) (TorchTitan's score_before_experts) instead of
    sum_j w[t, j] * expert(x[t]): the weights scale the gathered rows (one fp32 multiply, rounded
    once to x's dtype, as TorchTitan) and the combine sums unweighted. recipe None: bf16 GEMMs."""
    def mm(a, w, bias):
        if recipe is None:
            out = torch._grouped_mm(a, w.to(a.dtype).transpose(-2, -1), offs=offs)
            return out if bias is None else add_group_bias(out, bias, offs)
        return grouped.grouped_mm(a, w.transpose(-2, -1), offs, recipe=recipe, backend=backend, bias=bias)

    k, E = topk_idx.shape[1], w13.shape[0]
    offs, perm, inv = ops.moe_routing(topk_idx, E)
    xs = Gather.apply(x, perm, inv, k)
    if score_before:
        xs = (xs.float() * topk_w.reshape(-1).float()[perm.long()].unsqueeze(1)).to(x.dtype)
        topk_w = torch.ones_like(topk_w, dtype=F32)
    h = mm(xs, w13, b13)
    y = Act.apply(h, act, layout)
    o = mm(y, w2, b2)
    return Combine.apply(o, topk_w, perm, inv, k, x.dtype)
