"""mxmoe: MXFP8 Mixture-of-Experts training (a C++/CUDA core with a PyTorch front door).

Public API:
  mxmoe.grouped_mm(A, B_t, offs, *, recipe, backend, bias, out_dtype)  differentiable MXFP8 drop-in
      for torch._grouped_mm(A, B_t, offs=offs)
  mxmoe.quantize(x, dim, mode, block, offs) -> MXTensor (.qdata, .scale, .dequantize(dtype))
  mxmoe.moe_experts(x, topk_idx, topk_weights, w13, w2, *, recipe, activation, layout, bias13, bias2)
      the fused MoE expert layer (dispatch -> experts with SwiGLU -> combine, FP8 data flow; mxmoe/moe/)
  mxmoe.nn.MoEExperts(E, H, I, recipe=...)   a module owning w13 (E, 2I, H) and w2 (E, H, I)
  mxmoe.convert(model, recipe, filter_fn, backend) / mxmoe.unconvert(model)   switch a model's experts
      over (transformers experts, TorchTitan MoE, or a redirect of torch._grouped_mm; conversion.py)
  experts_implementation="mxmoe"        transformers 5 models (registered at import; integrations/)
  mxmoe.configure(recipe, backend)      defaults of that implementation
  mxmoe.check_offsets(offs, m)          checked mode (also: env MXMOE_CHECK_OFFSETS=1)
  torch.ops.mxmoe.*                     the core's operations as custom ops (mxmoe.ops)

  mxmoe.refresh_weights() / set_weight_cache() / weight_cache_info()   expert weights quantized once
                                        per optimizer step (mxmoe/weight_cache.py)
  mxmoe.graph_weight_cache()            around a CUDA-graph capture: the forms kept across replays
  mxmoe.distributed                     FSDP2 MX all-gather (enable_mx_all_gather), expert parallel
                                        (ep_moe_experts, EPMoEExperts), the torchrun launch; TP: DTensor
                                        weights in moe_experts (the rule tensor_parallel.py registers in
                                        the layer, imported here)
  mxmoe.build_info()                    what this build carries (cuda, cuda_archs, tile128_gemm, torch_abi)
  mxmoe.sm90_gemm_config(pass_, m, n, k, groups)   the Hopper tile128 GEMM configuration of a shape
                                        (kernel, tile, stages, ...; MXMOE_PRINT_CONFIGS=1 prints it per launch)

Binding: the ops are registered from C++ (libmxmoe_torch.so, src/ops/) through the LibTorch stable
ABI, so one binary serves torch 2.11 and 2.13; it links the torch-free core libmxmoe.so. Loaded at
import from env MXMOE_OPS_LIBRARY, else from the package (mxmoe/lib/), see mxmoe/_lib.py.

Modules: an import DAG (tests/python/test_imports.py), lower layers first: _lib, ops, recipes,
mx_tensor, weight_cache; backends/ (the registry, which imports no backend, then common.py,
phases.py: the fused layer's phase ops, and one module per backend, each registering itself);
grouped; moe/ (activation, functional, layer: the path comes from the backend); nn, integrations/,
conversion, distributed/ (tensor_parallel.py registers the layer's DTensor rule); this package root,
which imports the backends and tensor_parallel so that they register. Demo code: demo/ (`python -m
mxmoe train`); benchmark code: the source tree's bench/ (`python -m mxmoe bench` = bench/bench_e2e.py).
"""
from __future__ import annotations

from . import ops  # registers torch.ops.mxmoe.*
from .backends import BACKENDS, register_backend
# Each backend module registers itself (the registry, mxmoe.backends, imports none of them), in this
# order (BACKENDS lists them so); sm100 is gated by compute capability. mxmoe.sm90 / mxmoe.sm100 stay
# attributes, as before the move to backends/.
from .backends import reference as _reference, emulated as _emulated  # noqa: F401
from .backends import sm90, sm100  # noqa: F401
from ._lib import build_info, has_cuda, library_path, version as core_version
from .conversion import conversion_mechanism, convert, is_converted, unconvert
from .integrations.transformers import configure, register_when_available as _register_with_transformers
from .grouped import check_offsets, grouped_mm
from .moe import moe_experts
from .mx_tensor import MXTensor, quantize
from .ops import sm90_gemm_config
from . import nn
from .recipes import RECIPES, Recipe
from .weight_cache import graph_weight_cache, refresh_weights, set_weight_cache, weight_cache_info
from .distributed import tensor_parallel as _tensor_parallel  # noqa: F401  registers the layer's DTensor rule

_register_with_transformers()

__version__ = "0.1.0"

__all__ = [
    "grouped_mm",
    "moe_experts",
    "nn",
    "quantize",
    "MXTensor",
    "convert",
    "unconvert",
    "is_converted",
    "conversion_mechanism",
    "configure",
    "check_offsets",
    "RECIPES",
    "Recipe",
    "BACKENDS",
    "register_backend",
    "ops",
    "library_path",
    "core_version",
    "has_cuda",
    "build_info",
    "sm90_gemm_config",
    "refresh_weights",
    "graph_weight_cache",
    "set_weight_cache",
    "weight_cache_info",
]
