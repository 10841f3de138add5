"""mxmoe: MXFP8 Mixture-of-Experts training (a C++/CUDA core with a PyTorch front door).

Public API:
  mxmoe.grouped_mm(A, B_t, offs, *, recipe, backend, bias, out_dtype)  differentiable MXFP8 drop-in
      for torch._grouped_mm(A, B_t, offs=offs)
  mxmoe.quantize(x, dim, mode, block, offs) -> MXTensor (.qdata, .scale, .dequantize(dtype))
  mxmoe.convert(model, recipe, filter_fn, backend) / mxmoe.unconvert(model)
  mxmoe.check_offsets(offs, m)          checked mode (also: env MXMOE_CHECK_OFFSETS=1)
  torch.ops.mxmoe.*                     the core's operations as custom ops (mxmoe.ops)

Binding: the core's C API (libmxmoe.so) called through ctypes inside torch.library custom ops, the
fallback of DESIGN.md rather than the LibTorch stable ABI, so one binary serves torch 2.11 and 2.13
with no torch headers or per-version build (see mxmoe/_lib.py). The library is loaded on first use
from env MXMOE_LIBRARY, else from the package (mxmoe/lib/libmxmoe.so).
"""
from __future__ import annotations

from . import ops  # registers torch.ops.mxmoe.*
from . import sm90  # registers the Hopper backend
from . import sm100  # registers the Blackwell backend (gated by compute capability)
from ._lib import has_cuda, library_path, version as core_version
from .backends import BACKENDS, register_backend
from .conversion import convert, is_converted, unconvert
from .grouped import check_offsets, grouped_mm
from .mx_tensor import MXTensor, quantize
from .recipes import RECIPES, Recipe

__version__ = "0.1.0"

__all__ = [
    "grouped_mm",
    "quantize",
    "MXTensor",
    "convert",
    "unconvert",
    "is_converted",
    "check_offsets",
    "RECIPES",
    "Recipe",
    "BACKENDS",
    "register_backend",
    "ops",
    "library_path",
    "core_version",
    "has_cuda",
]
