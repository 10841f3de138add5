"""The fused MoE layer's phase ops, one family per kernel set (the layer: mxmoe/moe/functional.py).

The fused layer (mxmoe.moe_experts) runs one data flow (routing -> GEMM1 on the dispatched rows ->
GEMM2 on act(h) -> combine, and its backward) over a family's four phases: routing(topk_idx, E),
weights(w, mode) (the weights' forward and dgrad forms, from the weight cache), forward(...) and
backward(...). A backend hands the layer the family it runs (Backend.layer_phases):
  TILE128  recipe mxfp8_rceil_tile128: the moe_tile128_* phase ops (FP8 tensor cores on Hopper, the
           exact reference GEMMs on CPU), on the routing padded per expert (align_routing);
  EXACT    mxfp8_rceil / mxfp8_floor: the moe_exact_* phase ops (MX round trips + bf16 GEMMs, as the
           sm90 backend's exact recipes).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import ops, weight_cache
from .common import add_group_bias

BF16 = torch.bfloat16

__all__ = ["WGRAD_ALIGN", "align_routing", "Tile128Phases", "ExactPhases", "TILE128", "EXACT"]


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


def _cast(t: Optional[Tensor], dtype) -> Optional[Tensor]:
    return t if t is None or t.dtype == dtype else t.to(dtype)


class Tile128Phases:
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

    @staticmethod
    def fused_up_takes(x: Tensor, w13_f, k: int, layout: int, has_b13: bool = False) -> bool:
        """Whether fused_up_forward runs this call: concatenated halves with I a multiple of 128, or
        interleaved ones with I a multiple of 64 (gpt-oss's 2880); b13 or none (on the GPU interleaved
        halves only); on the GPU where the sm_90a kernel takes the shape. This mirrors mxmoe_grouped_mm_tile128_gather_swiglu_available (the
        op enforces it with a clear error), in Python for torch.compile as fused_down_takes."""
        E, two_i, H = w13_f[0].shape
        T = x.shape[0]
        if two_i % (256 if layout == 0 else 128) != 0:
            return False
        if x.device.type != "cuda":
            return True  # the CPU composition takes every call
        if layout == 0 and has_b13:
            return False  # the kernel takes b13 with interleaved halves only
        # int32 rows and indices, 32-bit byte offsets of x's rows, the group tables in shared memory.
        return H % 16 == 0 and 0 < E <= 2048 and E * two_i < 2**31 and T * H < 2**32 and T * k < 2**31

    @staticmethod
    def fused_up_forward(x, perm, k, w13_f, act, w2_f, offs, b2, mode, want_col, b13=None, layout=0):
        """The up projection with SwiGLU (and b13) in its epilogue (h and act(h)'s FP8 forms from one
        GEMM), then the down projection: (h, o, act's wgrad codes, scales)."""
        return ops.moe_tile128_swiglu_forward(x, perm, k, *w13_f, b13, layout, act.alpha, act.limit, act.up_offset,
                                              *w2_f, offs, b2, mode, want_col)

    @staticmethod
    def fused_down_takes(dout: Tensor, h: Tensor, w2_b, k: int, layout: int) -> bool:
        """Whether fused_down_backward runs this call: concatenated halves, I a multiple of 128; on the
        GPU where the sm_90a kernel takes the shape. This mirrors
        mxmoe_grouped_mm_tile128_gather_dswiglu_available (the op enforces it with a clear error):
        decided in Python so torch.compile sees a plain branch (T stays symbolic: a guard)."""
        I, H, E, T = w2_b[0].shape[1], w2_b[0].shape[2], w2_b[0].shape[0], dout.shape[0]
        if layout != 0 or I % 128 != 0:
            return False
        if dout.device.type != "cuda":
            return True  # the CPU composition takes every call
        # int32 rows and indices, 32-bit byte offsets of dout's rows, the group tables in shared memory.
        return (H % 16 == 0 and 0 < E <= 2048 and E * I < 2**31 and T * H < 2**32 and T * k < 2**31
                and h.shape[0] < 2**31)

    @staticmethod
    def fused_down_backward(dout, perm, k, rs, w2_b, h, act, w13_b, x, offs, mode, need_dxs, need_dw13, w13_dtype,
                            release_h=False):
        """The down projection's dgrad with dSwiGLU (and the routing weights) in its epilogue, then the up
        projection's wgrad (on dispatch(x), its operand built from x) and dgrad on the FP8 forms it wrote:
        (dXs or None, dW13 or None, tw_part). release_h: h's memory goes back after the first GEMM, its
        last read (h is empty afterwards), so the two GEMMs after it peak without h. The wgrad comes
        first and dH's columnwise form is freed before dXs exists: the layer's peak is here."""
        dh_q, dh_s, dh_qt, dh_st, tw_part = ops.moe_tile128_dswiglu_dgrad(dout, perm, k, rs, *w2_b, h, act.alpha,
                                                                          act.limit, act.up_offset, offs, mode)
        if release_h:
            h.untyped_storage().resize_(0)
        dw13 = ops.moe_tile128_up_wgrad(dh_qt, dh_st, x, perm, k, offs, mode, w13_dtype) if need_dw13 else None
        del dh_qt, dh_st
        dxs = ops.grouped_mm_tile128(dh_q, dh_s, *w13_b, offs, None, BF16) if need_dxs else None
        return dxs, dw13, tw_part

    @staticmethod
    def wgrad_operand(src, offs, mode):
        """The forward's wgrad operand of a source (what forward(..., want_col=True) returns), alone:
        128x1 blocks along the rows per group, transposed (codes, scales)."""
        outs = ops.quantize_fused_source(*src, offs, 128, 128, False, mode, 0, ops.FUSED_QT | ops.FUSED_SCALE, BF16)
        return outs[7], outs[8]


class ExactPhases:
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
        return add_group_bias(out, bias, offs), a_q, a_s

    @staticmethod
    def backward(src, bwd, a_q, a_s, offs, mode, need_da, need_dw, w_dtype):
        da, dw = ops.moe_exact_backward(*src, *bwd, a_q, a_s, offs, mode, need_da, need_dw)
        return da, _cast(dw, w_dtype)

    @staticmethod
    def wgrad_operand(src, offs, mode):
        """As Tile128Phases.wgrad_operand: 32x1 blocks along the rows per group (codes, scales)."""
        outs = ops.quantize_fused_source(*src, offs, 32, 32, False, mode, 0, ops.FUSED_Q | ops.FUSED_SCALE, BF16)
        return outs[6], outs[8]


TILE128 = Tile128Phases
EXACT = ExactPhases
