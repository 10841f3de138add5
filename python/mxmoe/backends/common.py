"""What the backends share: the recipe's quantization steps (thin wrappers over torch.ops.mxmoe.quantize),
device-side group bookkeeping (no host sync), the GEMMs on dequantized values, and QuantizeThenMM, the
base of the backends that quantize per the recipe (recipes.py) and differ only in the two GEMM
primitives (reference.py, emulated.py).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import ops
from ..recipes import Recipe
from . import Backend

Pair = Tuple[Tensor, Tensor]  # (e4m3 data, e8m0 scale)


# ---- quantization steps (thin wrappers over torch.ops.mxmoe.quantize) --------------------------------


def dense(x: Tensor) -> Tensor:
    # The core's CPU kernels take any strides (including expanded, stride-0 grads); its CUDA kernels
    # need contiguous inputs.
    return x if x.device.type == "cpu" else x.contiguous()


def quant_along_last(x: Tensor, block: int, mode: int) -> Pair:
    """1 x block blocks along the last dim of a 2D/3D x -> (q in x's shape, scale_c)."""
    q, _, s, _ = ops.quantize(dense(x), None, 1, block, mode, True, False, True, False)
    return q, s


def quant_along_rows(x: Tensor, block: int, mode: int, offs: Optional[Tensor] = None) -> Pair:
    """block x 1 blocks along dim -2 (per token group with offs) -> (qt (.., C, R), scale_r (.., C, n))."""
    _, qt, _, s = ops.quantize(dense(x), offs, block, 1, mode, False, True, False, True)
    return qt, s


def quant_tiles(w: Tensor, mode: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """128x128 tiles, both orientations from one pass: (q, scale_c, qt, scale_r)."""
    q, qt, sc, sr = ops.quantize(dense(w), None, 128, 128, mode, True, True, True, True)
    return q, sc, qt, sr


# ---- device-side group bookkeeping (no host sync) ----------------------------------------------------


def clamp_offsets(offs: Tensor, m) -> Tensor:
    """The core's clamping rule, on the device: end_g = min(m, max(0, offs[0..g])) (bad offsets give
    empty groups, never out-of-bounds rows). One core kernel (torch.ops.mxmoe.clamp_offsets)."""
    return ops.clamp_offsets(offs, m)


def row_groups(offs: Tensor, m) -> Tensor:
    """Group index of each of the m rows (G for rows past offs[-1]), int64 on offs' device."""
    rows = torch.arange(m, device=offs.device, dtype=offs.dtype)
    return torch.searchsorted(clamp_offsets(offs, m), rows, right=True)


def group_sum(dy: Tensor, offs: Tensor, groups) -> Tensor:
    """(G, N) fp32 per-group sums of dy's rows (the bias grad); rows past offs[-1] are dropped."""
    gid = row_groups(offs, dy.shape[0])
    acc = dy.new_zeros((groups + 1, dy.shape[1]), dtype=torch.float32)
    return acc.index_add_(0, gid, dy.float())[:groups]


def add_group_bias(out: Tensor, bias: Optional[Tensor], offs: Tensor) -> Tensor:
    """out + bias[g] on group g's rows (fp32, then out's dtype); rows past the groups stay 0."""
    if bias is None:
        return out
    if bias.dtype == out.dtype:
        # torch adds two bf16 (or f32) tensors in fp32 and rounds once: the same values as the fp32 sum
        # below, in one pass over out instead of four fp32 ones.
        rows = torch.cat([bias, bias.new_zeros((1, bias.shape[1]))])
        return torch.add(out, rows[row_groups(offs, out.shape[0])])
    rows = torch.cat([bias.float(), bias.new_zeros((1, bias.shape[1]), dtype=torch.float32)])
    return (out.float() + rows[row_groups(offs, out.shape[0])]).to(out.dtype)


def compute_dtype(device: torch.device) -> torch.dtype:
    # GEMMs on dequantized MX values: every e4m3 x 2^e value is exact in bf16 and in fp32, so a GEMM
    # on them in either dtype (with fp32 accumulation) is the same exact reference for the MX GEMM.
    # On CPU fp32 is used because bf16 matmuls there are ~75x slower (measured: 11.4 s vs 0.15 s for
    # 8192x512 @ 8x512x1024); on GPUs bf16 is the fast path.
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def torch_grouped_mm(a: Tensor, b: Tensor, offs: Tensor, m) -> Tensor:
    """torch._grouped_mm on clamped offsets, fp32 result. m: rows (2D x 3D) or tokens (2D x 2D).
    For 2D x 3D, rows past offs[-1] (which torch leaves unwritten, even NaN) are zero, as in the core."""
    offs = clamp_offsets(offs, m)
    if a.dtype == torch.float32:
        return ops.dense_grouped_mm(a, b, offs)  # fp32 torch._grouped_mm, traceable (see ops.py)
    out = torch._grouped_mm(a, b, offs=offs).float()
    if b.dim() == 3:
        rows = torch.arange(out.shape[0], device=out.device).unsqueeze(1)
        out = torch.where(rows < offs[-1], out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """t as dtype, and t itself (no .to call at all) when it already is. Under torch.compile on
    torch 2.11, a no-op ``.to()`` on the tensor an autograd.Function returns makes Dynamo record the
    same tensor twice as a forward output and route the output's grad to the wrong slot: the
    backward then ran on zeros (pytorch/pytorch#180642; seen here as compiled != eager for the
    exact recipe on the H200)."""
    return t if t.dtype == dtype else t.to(dtype)


def hp_wgrad(dy: Tensor, a: Tensor, offs: Tensor, out_dtype: torch.dtype) -> Tensor:
    """Unquantized wgrad dW[g] = dY_g^T A_g (G, N, K) (recipe mxfp8_rceil_wgrad_with_hp)."""
    ct = compute_dtype(dy.device)
    # contiguous(): torch._grouped_mm rejects expanded (stride-0) operands such as the grad of a sum.
    dy_t = dy.to(ct).contiguous().t()
    out = torch_grouped_mm(dy_t, a.to(ct).contiguous(), offs, dy.shape[0])
    return cast(out, out_dtype)


# ---- quantize per the recipe, then the backend's two MX GEMM primitives --------------------------


class QuantizeThenMM(Backend):
    """Core quantizers per the recipe, then the backend's two MX GEMM primitives:
    ``mm`` (rows of A grouped: forward and dgrad) and ``mm_k`` (contraction grouped: wgrad)."""

    def mm(self, a_q, a_s, b_q, b_s, offs, bias, out_dtype) -> Tensor:
        raise NotImplementedError

    def mm_k(self, a_q, a_s, b_q, b_s, offs, out_dtype) -> Tensor:
        raise NotImplementedError

    def quant_tokens(self, x: Tensor, block: int, mode: int, offs: Tensor) -> Pair:
        """wgrad operand: x (M, X) in blocks along M per token group, in the layout ``mm_k`` reads.
        Default: qt (X, M) + scale_r (X, cap), the layout of mxmoe_grouped_mm_mx_kgroups."""
        return quant_along_rows(x, block, mode, offs)

    def forward(self, a, a_mx, w, offs, bias, recipe, out_dtype, need_dw=True):
        a_q, a_s = a_mx if a_mx is not None else quant_along_last(a, recipe.a_block, recipe.mode)
        if recipe.w_tile128:
            # One quantization of W per step serves forward (q, scale_c) and dgrad (qt, scale_r).
            w_q, w_s, w_qt, w_sr = quant_tiles(w, recipe.mode)
            saved = (w_qt, w_sr)
        else:
            w_q, w_s = quant_along_last(w, 32, recipe.mode)
            saved = (None, None)
        return self.mm(a_q, a_s, w_q, w_s, offs, bias, out_dtype), saved

    def dgrad(self, dy, w, saved, offs, recipe, out_dtype):
        dy_q, dy_s = quant_along_last(dy, recipe.dy_block, recipe.mode)  # along N
        w_qt, w_sr = saved
        if w_qt is None:
            w_qt, w_sr = quant_along_rows(w, 32, recipe.mode)  # W along N: qt (G, K, N)
        return self.mm(dy_q, dy_s, w_qt, w_sr, offs, None, out_dtype)

    def wgrad(self, dy, a, offs, recipe, out_dtype):
        if recipe.wgrad_hp:
            return hp_wgrad(dy, a, offs, out_dtype)
        # Along M (tokens), per group: dY -> (N, M), A -> (K, M), grouped compact scales.
        dy_t = self.quant_tokens(dy, recipe.wgrad_block, recipe.mode, offs)
        a_t = self.quant_tokens(a, recipe.wgrad_block, recipe.mode, offs)
        return self.mm_k(*dy_t, *a_t, offs, out_dtype)
