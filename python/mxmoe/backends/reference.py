"""The reference backend: the core's MX GEMM kernels end to end (CPU and CUDA): core quantize +
mxmoe_grouped_mm_mx (forward, dgrad) + mxmoe_grouped_mm_mx_kgroups (wgrad). The exact MX GEMM (fp32
accumulation). 'auto' picks it on every device but CUDA. On the CPU it also runs the fused MoE layer:
tile128 on the phase ops' CPU reference GEMMs; the exact recipes only when asked for (backend='fused'):
the core's MX GEMMs composed beat the fused exact phases' bf16 GEMMs there (torch's CPU bf16 grouped GEMM
is slow).
"""
from __future__ import annotations

import torch

from .. import ops
from ..recipes import Recipe
from . import register_backend
from .common import QuantizeThenMM
from .phases import EXACT, TILE128


class ReferenceBackend(QuantizeThenMM):
    """Core MX GEMM kernels end to end (exact; fp32 accumulation)."""

    name = "reference"
    auto_priority = 0

    def auto_on(self, device: torch.device) -> bool:
        return device.type != "cuda"

    def layer_phases(self, recipe: Recipe, fused: bool):
        if recipe.w_tile128:
            return TILE128
        return EXACT if fused else None

    def mm(self, a_q, a_s, b_q, b_s, offs, bias, out_dtype):
        return ops.grouped_mm_mx(a_q, a_s, b_q, b_s, offs, bias, out_dtype)

    def mm_k(self, a_q, a_s, b_q, b_s, offs, out_dtype):
        return ops.grouped_mm_mx_kgroups(a_q, a_s, b_q, b_s, offs, out_dtype)


register_backend(ReferenceBackend())
