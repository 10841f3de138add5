"""mxmoe.grouped_mm: a differentiable MXFP8 drop-in for ``torch._grouped_mm(A, B_t, offs=offs)``.

The autograd function computes three grouped GEMMs (docs/design/mx-format.md, "Contract"), each through the
chosen backend (mxmoe/backends/) with the recipe's quantization (recipes.py):
  forward  Y  = A W_g^T per token group                (A, W along K)
  dgrad    dA = dY W_g per group                       (dY along N, W along N)
  wgrad    dW_g = dY_g^T A_g, returned as dB_t = dW^T   (dY, A along M, blocks within each group)
  bias     dbias_g = sum of dY over group g's rows     (on the device, fp32 accumulation)

Compile- and CUDA-graph-friendly by construction: every kernel is a torch.library custom op with a
fake implementation, outputs are allocated by torch, offs stays on its device (no .item(), .tolist(),
.cpu()), and CUDA kernels launch on torch's current stream. ``torch.compile(fullgraph=True,
dynamic=True)`` traces forward and backward without graph breaks.
"""
from __future__ import annotations

import os
from typing import Optional, Union

import torch
from torch import Tensor

from . import ops
from .backends import get_backend, resolve_backend
from .backends.common import group_sum
from .mx_tensor import MXTensor
from .recipes import RECIPES, get_recipe

_FLOAT = (torch.bfloat16, torch.float32)


def _dt(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def _desc(t) -> str:
    if isinstance(t, Tensor):
        return f"{_dt(t.dtype)} tensor of shape {tuple(t.shape)} on {t.device}"
    return type(t).__name__


@torch.compiler.assume_constant_result
def _checked_mode() -> bool:
    """MXMOE_CHECK_OFFSETS=1: validate offs in every grouped_mm call (a host sync; debugging aid).

    Read on each eager call; under torch.compile it is read once when tracing (a constant of the
    compiled graph, like any config), so set it before compiling."""
    return os.environ.get("MXMOE_CHECK_OFFSETS", "0") not in ("", "0")


def check_offsets(offs: Tensor, m: int) -> None:
    """Checked mode: raise ValueError unless offs is a 1-D int32 tensor, non-decreasing, >= 0 and <= m.

    This synchronizes with offs' device (it reads the values); the training path never calls it unless
    MXMOE_CHECK_OFFSETS=1. Without it, bad offsets never cause out-of-bounds accesses: the kernels
    clamp them (end_g = min(m, max(0, offs[0..g]))), so they give empty or cut groups instead.
    """
    if not isinstance(offs, Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise ValueError(f"offs: expected a 1-D int32 tensor, got {_desc(offs)}")
    ops.check_offsets(offs, m)


class _GroupedMMFunction(torch.autograd.Function):
    """Inputs: a (M, K) hp tensor, or None with (a_q, a_s) a pre-quantized operand along K."""

    @staticmethod
    def forward(ctx, a, a_q, a_s, b_t, offs, bias, recipe_name, backend_name, out_dtype):
        recipe = RECIPES[recipe_name]
        backend = get_backend(backend_name)
        w = b_t.transpose(-2, -1)  # (G, N, K): contiguous when b_t is the usual transposed view
        a_mx = None if a is not None else (a_q, a_s)
        need_dw = ctx.needs_input_grad[3]
        out, saved = backend.forward(a, a_mx, w, offs, bias, recipe, out_dtype, need_dw)
        # A backend that keeps its own (quantized) copy of A for wgrad lets the autograd drop A.
        keep_a = backend.needs_input_for_backward(recipe)
        ctx.save_for_backward(a if keep_a else None, a_q if keep_a else None, a_s if keep_a else None,
                              b_t, offs, *saved)
        ctx.recipe_name = recipe_name
        ctx.backend_name = backend_name
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.a_dtype = a.dtype if a is not None else torch.bfloat16
        return out

    @staticmethod
    def backward(ctx, dy):
        a, a_q, a_s, b_t, offs, *saved = ctx.saved_tensors
        recipe = RECIPES[ctx.recipe_name]
        backend = get_backend(ctx.backend_name)
        w = b_t.transpose(-2, -1)
        need_a, need_b, need_bias = ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.needs_input_grad[5]
        a_mx = (a_q, a_s) if a_q is not None else None
        da, dw = backend.backward(dy, a, a_mx, w, tuple(saved), offs, recipe, need_a, need_b,
                                  ctx.a_dtype, b_t.dtype)
        db_t = dw.transpose(-2, -1) if dw is not None else None
        dbias = group_sum(dy, offs, b_t.shape[0]).to(ctx.bias_dtype) if need_bias else None
        return da, None, None, db_t, None, dbias, None, None, None


def grouped_mm(
    A: Union[Tensor, MXTensor],
    B_t: Tensor,
    offs: Tensor,
    *,
    recipe: str = "mxfp8_rceil",
    backend: str = "auto",
    bias: Optional[Tensor] = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """Grouped GEMM with MXFP8 forward, dgrad and wgrad; a drop-in for torch._grouped_mm(A, B_t, offs=offs).

    Args:
      A: (M, K) bf16 or f32 activations, or an MXTensor quantized along K (dim=-1, e.g. from
         ``mxmoe.quantize(A)``): the forward then uses it as is and the backward dequantizes it for the
         column-wise wgrad quantization. An MXTensor is not a torch.Tensor, so no grad flows to it;
         grads still flow to B_t and bias.
      B_t: (G, K, N) bf16 or f32 expert weights, normally ``W.transpose(-2, -1)`` of contiguous (G, N, K)
         weights (as in torch._grouped_mm). On CPU other strides (e.g. a contiguous (G, K, N)) work too,
         without a copy.
      offs: int32 (G,) cumulative end rows of the G token groups, on A's device. Any group sizes: empty
         groups and sizes that are not multiples of 32 need no padding (a scale block never crosses a
         group boundary; the last block of a group is partial). Rows past offs[-1] give 0 (and no grad).
         Offsets are never read on the host: bad offsets are clamped by the kernels, and checked mode
         (MXMOE_CHECK_OFFSETS=1, or mxmoe.check_offsets) validates them with a sync and raises.
      recipe: 'mxfp8_rceil' (default), 'mxfp8_floor', 'mxfp8_rceil_wgrad_with_hp' or
         'mxfp8_rceil_tile128' (see mxmoe.recipes).
      backend: 'auto', 'reference' (core MX GEMMs), 'sm90' (Hopper: FP8 tensor cores for tile128, fused MX
         round trip + bf16 GEMMs for the exact recipes), 'sm100' (Blackwell: core quantizers writing
         blocked scales + MXFP8 torch._scaled_grouped_mm; compute capability 10.x only) or 'emulated'
         (core quantize/dequantize + torch._grouped_mm). 'auto': sm90 on Hopper, sm100 on Blackwell,
         reference on CPU, emulated elsewhere.
      bias: optional (G, N) bf16/f32, added to group g's rows (in fp32, before rounding to out_dtype).
      out_dtype: bfloat16 (default) or float32.
    Returns (M, N) out_dtype. Grads: A (its dtype), B_t (its dtype, shape and the layout of a transposed
    view), bias (per-group sum of the output grad). K and N must be multiples of 32.
    """
    r = get_recipe(recipe)
    for name, t in (("A", A), ("B_t", B_t), ("bias", bias)):
        if type(t).__name__ == "DTensor":
            # No sharding rule: a grouped GEMM's groups, K and N all interact with the MX blocks; the fused
            # layer (mxmoe.moe_experts) has the tensor-parallel rule (mxmoe/distributed/tensor_parallel.py).
            raise ValueError(f"{name}: a DTensor with placements {tuple(t.placements)}; mxmoe.grouped_mm computes on "
                             "local tensors: pass .to_local() shards, or use mxmoe.moe_experts, which takes "
                             "tensor-parallel DTensor weights")
    if isinstance(A, MXTensor):
        a_hp, a_q, a_s = None, A.qdata, A.scale
        if A.dim != -1 or A.offs is not None or A.qdata.dim() != 2:
            raise ValueError(
                f"A: expected an MXTensor of a 2D (M, K) tensor quantized along K (dim=-1, no offs), got {A!r}"
            )
        a_ref = a_q
    elif isinstance(A, Tensor):
        a_hp, a_q, a_s = A, None, None
        if A.dim() != 2:
            raise ValueError(f"A: expected 2 dims (M, K), got shape {tuple(A.shape)}")
        if A.dtype not in _FLOAT:
            raise ValueError(f"A: expected dtype bfloat16 or float32, got {_dt(A.dtype)}")
        a_ref = A
    else:
        raise ValueError(f"A: expected a torch.Tensor or an MXTensor, got {type(A).__name__}")
    device = a_ref.device
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"A: expected a cpu or cuda tensor, got a tensor on device '{device}'")
    M, K = a_ref.shape
    if not isinstance(B_t, Tensor):
        raise ValueError(f"B_t: expected a torch.Tensor, got {type(B_t).__name__}")
    if B_t.dim() != 3:
        raise ValueError(
            f"B_t: expected 3 dims (G, K, N), the transpose of (G, N, K) expert weights, got shape {tuple(B_t.shape)}"
        )
    if B_t.dtype not in _FLOAT:
        raise ValueError(f"B_t: expected dtype bfloat16 or float32, got {_dt(B_t.dtype)}")
    if B_t.device != device:
        raise ValueError(f"B_t: expected device {device} (A's), got {B_t.device}")
    G, N = B_t.shape[0], B_t.shape[2]
    if B_t.shape[1] != K:
        raise ValueError(
            f"B_t: expected shape (G, K={K}, N) matching A's K: pass W.transpose(-2, -1) of (G, N, K) weights, "
            f"got shape {tuple(B_t.shape)}"
        )
    if K % 32 != 0:
        raise ValueError(f"A: expected K (dim 1) to be a multiple of 32, got {K}")
    if N % 32 != 0:
        raise ValueError(f"B_t: expected N (dim 2) to be a multiple of 32, got {N}")
    if not isinstance(offs, Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise ValueError(f"offs: expected a 1-D int32 tensor of G={G} group ends, got {_desc(offs)}")
    if offs.shape[0] != G:
        raise ValueError(f"offs: expected shape ({G},) (one end per group of B_t), got {tuple(offs.shape)}")
    if offs.device != device:
        raise ValueError(f"offs: expected device {device} (A's), got {offs.device}")
    if bias is not None:
        if not isinstance(bias, Tensor) or bias.dtype not in _FLOAT:
            raise ValueError(f"bias: expected a bfloat16 or float32 tensor of shape ({G}, {N}), got {_desc(bias)}")
        if bias.dim() != 2 or bias.shape[0] != G or bias.shape[1] != N:
            raise ValueError(f"bias: expected shape ({G}, {N}), got {tuple(bias.shape)}")
        if bias.device != device:
            raise ValueError(f"bias: expected device {device} (A's), got {bias.device}")
    if out_dtype not in _FLOAT:
        raise ValueError(f"out_dtype: expected torch.bfloat16 or torch.float32, got {out_dtype}")
    backend_name = resolve_backend(backend, device)
    if _checked_mode():
        ops.check_offsets(offs, M)
    return _GroupedMMFunction.apply(a_hp, a_q, a_s, B_t, offs, bias, r.name, backend_name, out_dtype)
