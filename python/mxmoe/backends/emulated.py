"""The emulated backend: core quantize + core dequantize + torch._grouped_mm on the dequantized (exactly
representable) values. 'auto' picks it on CUDA GPUs that no other backend claims; it has no fused MoE
layer (the layer runs composed on it).
"""
from __future__ import annotations

import torch

from .. import ops
from . import register_backend
from .common import QuantizeThenMM, cast, compute_dtype, dense, row_groups, torch_grouped_mm


class EmulatedBackend(QuantizeThenMM):
    """Core dequantize + torch._grouped_mm on the dequantized (exactly representable) values."""

    name = "emulated"
    auto_priority = 0

    def auto_on(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def mm(self, a_q, a_s, b_q, b_s, offs, bias, out_dtype):
        ct = compute_dtype(a_q.device)
        a = ops.dequantize(a_q, a_s, 1, None, ct)
        b = ops.dequantize(b_q, b_s, 1, None, ct)
        m = a.shape[0]
        out = torch_grouped_mm(a, b.transpose(-2, -1), offs, m)  # rows past offs[-1] are 0
        if bias is not None:
            # bias[g] on group g's rows, in fp32 before rounding; rows past offs[-1] get the zero row.
            bias_rows = torch.cat([bias.float(), bias.new_zeros((1, bias.shape[1]), dtype=torch.float32)])
            out = out + bias_rows[row_groups(offs, m)]
        return cast(out, out_dtype)

    def quant_tokens(self, x, block, mode, offs):
        # q in x's own (M, X) layout (+ scale_r (X, cap)): torch._grouped_mm wants 16-byte aligned strides,
        # which an (X, M) buffer lacks for token counts M that are not multiples of 4 (8 for bf16), while
        # (M, X)^T (column-major) is fine (X is a multiple of 32). No transposition copies are needed.
        q, _, _, s = ops.quantize(dense(x), offs, block, 1, mode, True, False, False, True)
        return q, s

    def mm_k(self, a_q, a_s, b_q, b_s, offs, out_dtype):
        ct = compute_dtype(a_q.device)
        # Grouped compact scales along M (axis 0); tokens outside every group dequantize to 0.
        a = ops.dequantize(a_q, a_s, 0, offs, ct)  # (M, N)
        b = ops.dequantize(b_q, b_s, 0, offs, ct)  # (M, K)
        return cast(torch_grouped_mm(a.t(), b, offs, a.shape[0]), out_dtype)


register_backend(EmulatedBackend())
