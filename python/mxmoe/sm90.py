"""The Hopper (sm90) backend: the fast path on the H200.

Hopper has FP8 tensor cores but no block-scaled MMA (DESIGN.md, "Hopper GEMM: where the ceilings
are"), so the two recipe families take different routes:

  exact recipes (mxfp8_rceil, mxfp8_floor, mxfp8_rceil_wgrad_with_hp): each operand goes through the
      fused MX round trip (quantize to MXFP8 and dequantize to bf16 in one pass; exact in bf16) and the
      GEMM is bf16 torch._grouped_mm. The result equals the MX GEMM up to fp32 summation order; the
      cost over bf16 is the rounding passes.
  tile128 (mxfp8_rceil_tile128): 1x128 / 128x128 MX encodings run on the FP8 tensor cores through
      mxmoe's Hopper grouped GEMMs (torch.ops.mxmoe.grouped_mm_tile128 and _kgroups).

Fewest trips over memory: one fused read of A gives its forward operand and its wgrad operand (kept
for backward as FP8 + scales, half of A's bytes, instead of A itself); one read of W per step gives
both orientations (the dgrad one kept as FP8); one read of dY gives the dgrad and wgrad operands.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import ops
from .backends import Backend, cast, clamp_offsets, register_backend, row_groups
from .recipes import Recipe

Q, QT, S, DQ = ops.FUSED_Q, ops.FUSED_QT, ops.FUSED_SCALE, ops.FUSED_DQ
BF16 = torch.bfloat16


def _mm_rows(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """bf16 torch._grouped_mm, 2D x 3D with row groups, rows past the groups zeroed (by a kernel that
    touches only them), as an opaque op so torch.compile keeps torch's kernel."""
    return ops.call(ops._dense_grouped_mm, a, b, clamp_offsets(offs, a.shape[0]))


def _mm_tokens(a_t: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """bf16 torch._grouped_mm, 2D x 2D with groups along the tokens: (N, M) x (M, K) -> (G, N, K)."""
    return ops.call(ops._dense_grouped_mm, a_t, b, clamp_offsets(offs, b.shape[0]))


def _add_bias(out: Tensor, bias, offs: Tensor) -> Tensor:
    if bias is None:
        return out
    # bias[g] on group g's rows (fp32 before rounding); rows past offs[-1] get the zero row.
    rows = torch.cat([bias.float(), bias.new_zeros((1, bias.shape[1]), dtype=torch.float32)])
    return out.float() + rows[row_groups(offs, out.shape[0])]


class Sm90Backend(Backend):
    name = "sm90"

    def needs_input_for_backward(self, recipe: Recipe) -> bool:
        return recipe.wgrad_hp  # otherwise A's wgrad quantization is saved instead of A

    # ---- forward ----------------------------------------------------------------------------------

    def forward(self, a, a_mx, w, offs, bias, recipe, out_dtype, need_dw=True):
        if a is None:  # pre-quantized A (along K): its round trip is its dequantization
            a = ops.call(ops.dequantize, a_mx[0], a_mx[1], 1, None, BF16)
        want_a_col = need_dw and not recipe.wgrad_hp
        if recipe.w_tile128:
            return self._forward_tile128(a, w, offs, bias, recipe, out_dtype, want_a_col)
        return self._forward_exact(a, w, offs, bias, recipe, out_dtype, want_a_col)

    def _forward_exact(self, a, w, offs, bias, recipe, out_dtype, want_a_col):
        m = recipe.mode
        a_row, a_col = ops.quantize_fused_sides(a, offs, 32, 32, False, m, DQ, (Q | S) if want_a_col else 0)
        w_row, w_col = ops.quantize_fused_sides(w, None, 32, 32, False, m, DQ, Q | S)
        out = _mm_rows(a_row["dq"], w_row["dq"].transpose(-2, -1), offs)
        out = cast(_add_bias(out, bias, offs), out_dtype)
        # Saved: W along N (FP8, dgrad) and A along M per group (FP8, wgrad).
        return out, (w_col["q"], w_col["scale"], a_col["q"] if want_a_col else None,
                     a_col["scale"] if want_a_col else None)

    def _forward_tile128(self, a, w, offs, bias, recipe, out_dtype, want_a_col):
        m = recipe.mode
        a_row, a_col = ops.quantize_fused_sides(a, offs, 128, 128, False, m, Q | S, (QT | S) if want_a_col else 0)
        # One 128x128 quantization of W: q/scale (forward) and qt/scale (dgrad) from the same pass.
        w_row, w_col = ops.quantize_fused_sides(w, None, 128, 128, True, m, Q | S, QT | S)
        out = ops.call(ops.grouped_mm_tile128, a_row["q"], a_row["scale"], w_row["q"], w_row["scale"], offs, bias,
                       out_dtype)
        return out, (w_col["qt"], w_col["scale"], a_col["qt"] if want_a_col else None,
                     a_col["scale"] if want_a_col else None)

    # ---- backward ---------------------------------------------------------------------------------

    def backward(self, dy, a, a_mx, w, saved, offs, recipe, need_da, need_dw, a_dtype, w_dtype):
        w_c, w_cs, a_c, a_cs = saved
        m = recipe.mode
        tile = recipe.w_tile128
        block = 128 if tile else 32
        fp8_wgrad = need_dw and not recipe.wgrad_hp
        if tile:
            row_bits, col_bits = (Q | S) if need_da else 0, (QT | S) if fp8_wgrad else 0
        else:
            row_bits, col_bits = DQ if need_da else 0, DQ if fp8_wgrad else 0
        dy_row = dy_col = None
        if row_bits or col_bits:
            dy_row, dy_col = ops.quantize_fused_sides(dy, offs, block, block, False, m, row_bits, col_bits)
        da = dw = None
        if need_da:
            if tile:
                da = ops.call(ops.grouped_mm_tile128, dy_row["q"], dy_row["scale"], w_c, w_cs, offs, None, a_dtype)
            else:
                w_n = ops.call(ops.dequantize, w_c, w_cs, 0, None, BF16)  # W rounded along N, (G, N, K)
                da = cast(_mm_rows(dy_row["dq"], w_n, offs), a_dtype)
        if need_dw:
            if recipe.wgrad_hp:
                if a is None:
                    a = ops.call(ops.dequantize, a_mx[0], a_mx[1], 1, None, BF16)
                dw = cast(_mm_tokens(cast(dy, BF16).contiguous().t(), cast(a, BF16).contiguous(), offs), w_dtype)
            elif tile:
                dw = ops.call(ops.grouped_mm_tile128_kgroups, dy_col["qt"], dy_col["scale"], a_c, a_cs, offs, w_dtype)
            else:
                a_m = ops.call(ops.dequantize, a_c, a_cs, 0, offs, BF16)  # A rounded along M per group, (M, K)
                dw = cast(_mm_tokens(dy_col["dq"].t(), a_m, offs), w_dtype)
        return da, dw


register_backend(Sm90Backend())


def is_sm90(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)
