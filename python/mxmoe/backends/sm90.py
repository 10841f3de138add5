"""The Hopper (sm90) backend: the fast path on the H200.

Hopper has FP8 tensor cores but no block-scaled MMA (docs/design/gemm-sm90.md), so the two recipe
families take different routes:

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

from .. import ops, weight_cache
from .._lib import build_info
from ..recipes import Recipe
from . import Backend, register_backend
from .common import cast, row_groups
from .phases import EXACT, TILE128

BF16 = torch.bfloat16
# Whether this build has the tile128 GEMMs. Read once at import (an op returning a str cannot be traced
# by torch.compile).
TILE128_GEMM = bool(build_info()["tile128_gemm"])


def _mm_tokens(a_t: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """bf16 torch._grouped_mm, 2D x 2D with groups along the tokens: (N, M) x (M, K) -> (G, N, K)."""
    return ops.dense_grouped_mm(a_t, b, ops.clamp_offsets(offs, b.shape[0]))


def _add_bias(out: Tensor, bias, offs: Tensor) -> Tensor:
    if bias is None:
        return out
    # bias[g] on group g's rows (fp32 before rounding); rows past offs[-1] get the zero row.
    rows = torch.cat([bias.float(), bias.new_zeros((1, bias.shape[1]), dtype=torch.float32)])
    return out.float() + rows[row_groups(offs, out.shape[0])]


class Sm90Backend(Backend):
    """'auto' on Hopper. It runs the fused MoE layer: the exact recipes on the moe_exact_* phase ops,
    tile128 on the moe_tile128_* ones when the build has the tile128 GEMMs (else composed)."""

    name = "sm90"
    auto_priority = 10
    bf16_gather_gemms = None  # bf16_gather_pieces decides per shape

    def bf16_gather_pieces(self, hidden: int):
        """The bf16 layer's gather GEMMs where they beat the path they replace (bench_bf16_gather and
        bench_moe's mxmoe_bf16 vs mxmoe_bf16_gathered, H100, 16K tokens, docs/design/gemm-sm90.md): at
        Qwen3-30B-A3B's hidden 2048 the up projection with the SwiGLU epilogue (1.06-1.12x gather +
        grouped_mm + SwiGLU pass) and the dSwiGLU down-projection dgrad (1.4-1.75x) win; at hidden
        2880-7168 (gpt-oss, Scout, Mixtral, DeepSeek-V3) the gather mainloop runs at ~60-77% of cuBLAS's
        rate and the layer loses 1-13%. The K-grouped gather wgrads lose everywhere measured (0.73-0.92x
        cuBLAS on a gathered copy at Qwen3-30B-A3B)."""
        if self.bf16_gather_gemms is not None:
            return self.bf16_gather_gemms
        return frozenset({"up", "up_swiglu", "down_dgrad"}) if hidden <= 2048 else frozenset()

    def auto_on(self, device: torch.device) -> bool:
        return is_sm90(device)

    def layer_phases(self, recipe: Recipe, fused: bool):
        if recipe.w_tile128:
            return TILE128 if TILE128_GEMM else None
        return EXACT

    def needs_input_for_backward(self, recipe: Recipe) -> bool:
        return recipe.wgrad_hp  # otherwise A's wgrad quantization is saved instead of A

    # ---- forward ----------------------------------------------------------------------------------

    def forward(self, a, a_mx, w, offs, bias, recipe, out_dtype, need_dw=True):
        if a is None:  # pre-quantized A (along K): its round trip is its dequantization
            a = ops.dequantize(a_mx[0], a_mx[1], 1, None, BF16)
        want_a_col = need_dw and not recipe.wgrad_hp
        if recipe.w_tile128:
            return self._forward_tile128(a, w, offs, bias, recipe, out_dtype, want_a_col)
        return self._forward_exact(a, w, offs, bias, recipe, out_dtype, want_a_col)

    def _forward_exact(self, a, w, offs, bias, recipe, out_dtype, want_a_col):
        # W's forms once per optimizer step (weight_cache): its MX round trip along K and W along N as
        # FP8 + scales (dgrad). One op: A's round trip (+ its wgrad operand), bf16 torch._grouped_mm,
        # rows past the groups zeroed.
        w_dq, w_q, w_s = weight_cache.forms(w, "sm90_exact", recipe.mode)
        out, a_q, a_s = ops.sm90_exact_forward(a, w_dq, offs, recipe.mode, want_a_col)
        out = cast(_add_bias(out, bias, offs), out_dtype)
        return out, (w_q, w_s, a_q if want_a_col else None, a_s if want_a_col else None)

    def _forward_tile128(self, a, w, offs, bias, recipe, out_dtype, want_a_col):
        # W's 128x128 tiles once per optimizer step (both orientations from one pass); one op: A's FP8
        # operands from one pass and the FP8 grouped GEMM.
        w_q, w_s, w_qt, w_st = weight_cache.forms(w, "sm90_tile128", recipe.mode)
        out, a_qt, a_s = ops.sm90_tile128_forward(a, w_q, w_s, offs, bias, recipe.mode, out_dtype, want_a_col)
        return out, (w_qt, w_st, a_qt if want_a_col else None, a_s if want_a_col else None)

    # ---- backward ---------------------------------------------------------------------------------

    def backward(self, dy, a, a_mx, w, saved, offs, recipe, need_da, need_dw, a_dtype, w_dtype):
        w_c, w_cs, a_c, a_cs = saved
        fp8_wgrad = need_dw and not recipe.wgrad_hp
        da = dw = None
        if recipe.w_tile128:
            # One op: one read of dY for both operands, the dgrad and the wgrad FP8 GEMMs.
            da, dw = ops.sm90_tile128_backward(dy, w_c, w_cs, a_c, a_cs, offs, recipe.mode, need_da, fp8_wgrad,
                                               a_dtype, w_dtype)
        elif need_da or fp8_wgrad:
            da, dw = ops.sm90_exact_backward(dy, w_c, w_cs, a_c, a_cs, offs, recipe.mode, need_da, fp8_wgrad)
            da, dw = cast(da, a_dtype), cast(dw, w_dtype)
        if need_dw and recipe.wgrad_hp:
            if a is None:
                a = ops.dequantize(a_mx[0], a_mx[1], 1, None, BF16)
            dw = cast(_mm_tokens(cast(dy, BF16).contiguous().t(), cast(a, BF16).contiguous(), offs), w_dtype)
        return (da if need_da else None), (dw if need_dw else None)


register_backend(Sm90Backend())


def is_sm90(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)
