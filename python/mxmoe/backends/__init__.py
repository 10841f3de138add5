"""Backends: how the three grouped GEMMs of an MXFP8 MoE layer are computed; this module is their registry.

Following torchao's refactor of its MXFP8 grouped-GEMM autograd function (seed 001), the split happens
once, up front: the autograd function (grouped.py) picks a backend and then only calls its
``forward`` / ``backward``; each backend is one straight code path with no "emulated or not"
branches inside. A backend is a small object, one module each, that says what it supports and
registers itself here by name (``register_backend``); this registry imports no backend (the package
root, mxmoe/__init__.py, imports them):

  reference  (reference.py) core CPU/CUDA kernels end to end: core quantize + mxmoe_grouped_mm_mx
             (forward, dgrad) + mxmoe_grouped_mm_mx_kgroups (wgrad). The exact MX GEMM (fp32 accumulation).
  emulated   (emulated.py) core quantize + core dequantize + torch._grouped_mm on the dequantized values.
  sm90       (sm90.py) Hopper kernels.
  sm100      (sm100.py) core quantizers writing blocked scales + MXFP8 torch._scaled_grouped_mm.
  auto       the registered backend of the highest ``auto_priority`` whose ``auto_on(device)`` holds:
             reference on CPU; on CUDA sm90 on Hopper, sm100 on Blackwell (compute capability 10.x),
             emulated elsewhere. A backend may refuse a device also when asked for by name
             (``check_device``): sm100 does (docs/design/overview.md: MXFP8 _scaled_grouped_mm
             corrupts the CUDA context on sm90).

A backend also chooses the fused MoE layer's path (mxmoe.moe): ``layer_phases(recipe, fused)`` gives the
phase ops (phases.py) it runs the fused layer with, or None for the layer composed of grouped_mm calls.

Everything numeric is the core's; the Python here only decides which quantization feeds which GEMM.
No host syncs: offs stays on the device. The pieces the backends share are in common.py.
"""
from __future__ import annotations

import functools
from typing import Dict, FrozenSet, Optional

import torch

from .. import ops
from ..recipes import Recipe

# The bf16 MoE layer's GEMMs that can read routed rows inside the GEMM (Backend.bf16_gather_gemms).
BF16_GATHER_PIECES = frozenset({"up", "up_swiglu", "down_dgrad", "wgrad"})

__all__ = ["Backend", "BACKENDS", "register_backend", "get_backend", "resolve_backend"]


class Backend:
    """Interface. W is the (G, N, K) weight (B_t.transpose(-2, -1)); offs int32 (G,) group ends.

    forward(a, a_mx, w, offs, bias, recipe, out_dtype, need_dw) -> (out (M, N), saved):
        a: (M, K) bf16/f32 or None when a_mx = (q, scale_c) is a pre-quantized operand along K.
        saved: a tuple of tensors (entries may be None) the backend wants back in backward, e.g. the
        weight's dgrad orientation or A's wgrad quantization from the same pass over memory.
    needs_input_for_backward(recipe) -> whether the autograd must keep A (or its a_mx) for backward.
    backward(dy, a, a_mx, w, saved, offs, recipe, need_da, need_dw, a_dtype, w_dtype) -> (dA, dW):
        the default runs dgrad and wgrad separately:
    dgrad(dy, w, saved, offs, recipe, out_dtype) -> dA (M, K)
    wgrad(dy, a, offs, recipe, out_dtype) -> dW (G, N, K)   (a in high precision)

    What it supports:
    auto_priority, auto_on(device) -> 'auto' picks, among the backends with auto_on(device), the one
        of the highest auto_priority (None: never picked by 'auto').
    check_device(device) -> raise ValueError when asked for by name on a device it must not run on.
    layer_phases(recipe, fused) -> the fused MoE layer's phase ops for `recipe` on this backend's
        device (mxmoe/backends/phases.py), or None: the layer then runs composed (mxmoe.grouped_mm
        between gather / SwiGLU / combine). fused: the caller asked for the fused layer
        (backend='fused'), where a backend may offer phases it does not pick on its own.
    """

    name = "base"
    auto_priority: Optional[int] = None
    # Which GEMMs of the bf16 MoE layer (recipe=None) read their routed rows inside the GEMM on this
    # backend's device (BF16_GATHER_PIECES; mxmoe.moe.functional.Bf16 says what each is); the others
    # gather the rows first and run torch._grouped_mm. None: bf16_gather_pieces' shape heuristic.
    bf16_gather_gemms: Optional[FrozenSet[str]] = frozenset()

    def auto_on(self, device: torch.device) -> bool:
        return False

    def bf16_gather_pieces(self, hidden: int) -> FrozenSet[str]:
        """The bf16 layer's gather GEMMs for experts on this hidden size: bf16_gather_gemms when set."""
        return self.bf16_gather_gemms or frozenset()

    def check_device(self, device: torch.device) -> None:
        return None

    def layer_phases(self, recipe: Recipe, fused: bool):
        return None

    def forward(self, a, a_mx, w, offs, bias, recipe: Recipe, out_dtype, need_dw=True):
        raise NotImplementedError

    def needs_input_for_backward(self, recipe: Recipe) -> bool:
        return True

    def backward(self, dy, a, a_mx, w, saved, offs, recipe: Recipe, need_da, need_dw, a_dtype, w_dtype):
        da = self.dgrad(dy, w, saved, offs, recipe, a_dtype) if need_da else None
        dw = None
        if need_dw:
            if a is None:
                # Pre-quantized A: the wgrad operand needs A along M (tokens), so dequantize (exact in
                # bf16) and requantize column-wise per group.
                a = ops.dequantize(a_mx[0], a_mx[1], 1, None, torch.bfloat16)
            dw = self.wgrad(dy, a, offs, recipe, w_dtype)
        return da, dw

    def dgrad(self, dy, w, saved, offs, recipe: Recipe, out_dtype):
        raise NotImplementedError

    def wgrad(self, dy, a, offs, recipe: Recipe, out_dtype):
        raise NotImplementedError


BACKENDS: Dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    """Add (or replace) a backend by its name; every backend module registers its own here."""
    BACKENDS[backend.name] = backend
    cache_clear = getattr(_auto_cuda_backend, "cache_clear", None)
    if cache_clear is not None:
        cache_clear()  # 'auto' may pick the new one


def _auto(device: torch.device) -> str:
    best = None
    for backend in BACKENDS.values():
        if backend.auto_priority is not None and backend.auto_on(device):
            if best is None or backend.auto_priority > best.auto_priority:
                best = backend
    if best is None:
        raise ValueError(f"backend: 'auto' found no registered backend for device '{device}' "
                         f"(registered: {', '.join(BACKENDS)})")
    return best.name


@functools.lru_cache(maxsize=None)
def _auto_cuda_backend(index: int) -> str:
    """'auto' on CUDA device `index` (asked once per device: the capability query costs host time)."""
    return _auto(torch.device("cuda", index))


def resolve_backend(name: str, device: torch.device) -> str:
    """Name of the backend a call with `backend=name` on `device` uses ('auto' picks the best)."""
    if name == "auto":
        # Hopper: the sm90 backend (FP8 tensor cores for tile128, fused MX round trip + bf16 GEMMs for
        # the exact recipes). Blackwell: sm100 (MXFP8 block-scaled tensor cores through torch). CPU:
        # the core's exact MX GEMMs (faster there than fp32 torch matmuls on dequantized operands).
        # Other GPUs: emulated.
        if device.type == "cuda":
            return _auto_cuda_backend(device.index if device.index is not None else torch.cuda.current_device())
        return _auto(device)
    if name not in BACKENDS:
        raise ValueError(f"backend: expected 'auto' or one of {', '.join(sorted(BACKENDS))}, got {name!r}")
    BACKENDS[name].check_device(device)  # e.g. never let sm100's MXFP8 GEMM reach a non-Blackwell device
    return name


def get_backend(name: str) -> Backend:
    return BACKENDS[name]
