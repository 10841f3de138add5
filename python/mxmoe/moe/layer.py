"""mxmoe.moe_experts: the fused MoE layer's entry point (argument checks, the path, the DTensor rule).

The path, chosen once per call: recipe=None: Bf16; else the phase ops the device's backend runs the
recipe with (Backend.layer_phases): FusedMX over them; none (or backend='composed', or the
mxfp8_rceil_wgrad_with_hp recipe): the composed layer on grouped_mm_backend. The autograd functions are
in functional.py.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ..backends import get_backend, resolve_backend
from ..recipes import Recipe, get_recipe
from .activation import Swiglu, resolve_activation, resolve_layout
from .functional import Bf16, FusedMX, composed

_FLOAT = (torch.bfloat16, torch.float32)

__all__ = ["moe_experts", "is_dtensor", "layer_backend_kwargs", "register_dtensor_rule"]


def is_dtensor(t) -> bool:
    """A torch.distributed DTensor (checked by name: no torch.distributed import on this path)."""
    return type(t).__name__ == "DTensor"


def _desc(t) -> str:
    if not isinstance(t, Tensor):
        return type(t).__name__
    return f"{str(t.dtype).replace('torch.', '')} tensor of shape {tuple(t.shape)} on {t.device}"


def _check_pair(w13):
    """A (gate, up) pair for w13: two (E, I, H) tensors of one dtype and device."""
    if len(w13) != 2 or not all(isinstance(t, Tensor) for t in w13):
        raise ValueError(f"w13: expected a tensor or a (gate, up) pair of tensors, got {len(w13)} items "
                         f"({', '.join(_desc(t) for t in w13)})")
    g, u = w13
    if g.dim() != 3 or u.shape != g.shape or u.dtype != g.dtype or u.device != g.device:
        raise ValueError(f"w13: expected gate and up weights of one (E, I, H) shape, dtype and device, got a "
                         f"{_desc(g)} and a {_desc(u)}")


def _check(x, topk_idx, topk_w, w13, w2, b13, b2):
    if isinstance(w13, (tuple, list)):
        _check_pair(w13)
        g = w13[0]
        # The pair's checks below run on the shape it stands for: (E, 2I, H).
        w13 = g.new_empty((1, 1, 1)).expand(g.shape[0], 2 * g.shape[1], g.shape[2])
    for name, t in (("x", x), ("topk_idx", topk_idx), ("topk_weights", topk_w), ("w13", w13), ("w2", w2)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2 or x.dtype not in _FLOAT:
        raise ValueError(f"x: expected a (T, H) bfloat16 or float32 tensor, got a {_desc(x)}")
    T, H = x.shape
    if topk_idx.dim() != 2 or topk_idx.shape[0] != T or topk_idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_idx: expected a (T={T}, k) int32 or int64 tensor of expert ids, got a {_desc(topk_idx)}")
    k = topk_idx.shape[1]
    if topk_w.shape != topk_idx.shape or topk_w.dtype not in _FLOAT:
        raise ValueError(f"topk_weights: expected a ({T}, {k}) bfloat16 or float32 tensor (topk_idx's shape), "
                         f"got a {_desc(topk_w)}")
    if w13.dim() != 3 or w13.shape[2] != H or w13.shape[1] % 2 != 0 or w13.dtype not in _FLOAT:
        raise ValueError(f"w13: expected an (E, 2I, H={H}) bfloat16 or float32 tensor (gate and up), got a {_desc(w13)}")
    E, I = w13.shape[0], w13.shape[1] // 2
    if w2.dim() != 3 or tuple(w2.shape) != (E, H, I) or w2.dtype not in _FLOAT:
        raise ValueError(f"w2: expected an (E={E}, H={H}, I={I}) bfloat16 or float32 tensor, got a {_desc(w2)}")
    if H % 32 != 0 or I % 32 != 0:
        raise ValueError(f"w13: expected H and I to be multiples of 32 (MX blocks), got H={H}, I={I}")
    for name, b, n in (("bias13", b13, 2 * I), ("bias2", b2, H)):
        if b is not None and (not isinstance(b, Tensor) or b.dim() != 2 or tuple(b.shape) != (E, n)
                              or b.dtype not in _FLOAT):
            raise ValueError(f"{name}: expected an (E={E}, {n}) bfloat16 or float32 tensor, got a {_desc(b)}")
    for name, t in (("topk_idx", topk_idx), ("topk_weights", topk_w), ("w13", w13), ("w2", w2), ("bias13", b13),
                    ("bias2", b2)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (x's), got {t.device}")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"x: expected a cpu or cuda tensor, got a tensor on device '{x.device}'")


def _layer_phases(r: Recipe, device: torch.device, backend: str):
    """The fused layer's phase ops for this call, chosen by the backend that runs it (Backend.layer_phases,
    mxmoe/backends/phases.py), or None: the composed layer. The fused layer runs on the device's own
    backend (what 'auto' resolves to); grouped_mm_backend is the composed layer's."""
    if backend == "composed" or r.wgrad_hp:
        return None
    if backend not in ("auto", "fused"):
        raise ValueError(f"backend: expected 'auto', 'fused' or 'composed', got {backend!r}")
    phases = get_backend(resolve_backend("auto", device)).layer_phases(r, backend == "fused")
    if phases is None and backend == "fused":
        got = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
        raise NotImplementedError(f"backend='fused': the fused {r.name} layer needs a Hopper GPU (sm_90) "
                                  f"and a build with the tile128 GEMMs; got {got}")
    return phases


def layer_backend_kwargs(backend: str) -> dict:
    """moe_experts' backend arguments for a backend name that may also be an mxmoe.grouped_mm backend
    ('reference', 'sm90', ...: the composed layer on it), as convert() and the integrations take it."""
    if backend in ("auto", "fused", "composed"):
        return {"backend": backend}
    return {"backend": "composed", "grouped_mm_backend": backend}


# The layer on DTensor expert weights: a rule registered by the module that implements it (tensor
# parallelism, mxmoe/distributed/tensor_parallel.py), so that the layer imports nothing of torch.distributed.
_dtensor_rule: Optional[Callable[..., Tensor]] = None


def register_dtensor_rule(rule: Callable[..., Tensor]) -> None:
    """Install rule(x, topk_idx, topk_weights, w13, w2, *, bias13, bias2, layout, recipe, activation,
    backend, grouped_mm_backend) as what moe_experts computes when its expert weights are DTensors."""
    global _dtensor_rule
    _dtensor_rule = rule


def moe_experts(
    x: Tensor,
    topk_idx: Tensor,
    topk_weights: Tensor,
    w13: Tensor,
    w2: Tensor,
    *,
    recipe: Optional[str] = "mxfp8_rceil_tile128",
    activation: Union[str, Swiglu] = "swiglu",
    layout: str = "concatenated",
    bias13: Optional[Tensor] = None,
    bias2: Optional[Tensor] = None,
    backend: str = "auto",
    grouped_mm_backend: str = "auto",
    score_before: bool = False,
) -> Tensor:
    """The MoE experts of one layer, fused: out[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t]).

    expert_e(v) = w2[e] @ act(w13[e] @ v + bias13[e]) + bias2[e], with act the SwiGLU of the gate and up
    halves of w13's output (layout, activation: see the module docstring).

    Args:
      x: (T, H) bfloat16 or float32 tokens.
      topk_idx: (T, k) int32 or int64 expert ids; ids outside [0, E) are dropped (contribute 0, never
        read out of bounds).
      topk_weights: (T, k) bfloat16 or float32 routing weights (used as given: no normalization).
      w13: (E, 2I, H) gate and up projections, or a (gate, up) pair of (E, I, H) tensors (TorchTitan's
        w1, w3: joined for the GEMM, once per optimizer step where the weight cache holds it; each gets
        its own grad); w2: (E, H, I) down projections (bfloat16 or float32).
      recipe: 'mxfp8_rceil_tile128' (default: FP8 tensor cores on Hopper), 'mxfp8_rceil', 'mxfp8_floor',
        'mxfp8_rceil_wgrad_with_hp' (see mxmoe.recipes), or None for the same fused layer in bf16.
      bias13: optional (E, 2I); bias2: optional (E, H) expert biases.
      backend: 'auto' (the fused path where one exists, else 'composed'), 'fused' (raise instead of
        composing) or 'composed' (mxmoe.grouped_mm between differentiable gather / SwiGLU / combine).
      grouped_mm_backend: the composed path's mxmoe.grouped_mm backend ('auto', 'sm90', 'reference', ...).
      score_before: apply the weights to the dispatched rows instead of the expert outputs (TorchTitan's
        score_before_experts): out[t] = sum_j expert_{idx[t, j]}(w[t, j] * x[t]). The product is formed in
        fp32; the bf16 layer rounds it to bf16 as TorchTitan does, the MX layers quantize it directly.
    Returns (T, H) in x's dtype. Differentiable in x, topk_weights, w13, w2 and the biases.
    H and I must be multiples of 32.
    """
    weights = (*(w13 if isinstance(w13, (tuple, list)) else (w13,)), w2, bias13, bias2)
    if not isinstance(score_before, bool):
        raise ValueError(f"score_before: expected a bool, got {type(score_before).__name__}")
    if any(is_dtensor(t) for t in weights):  # tensor parallel (mxmoe/distributed/tensor_parallel.py)
        if score_before:
            raise NotImplementedError("score_before=True with DTensor (tensor-parallel) expert weights is not "
                                      "supported; apply the weights after the experts")
        if _dtensor_rule is None:
            raise NotImplementedError("DTensor expert weights: no rule registered (import mxmoe.distributed)")
        return _dtensor_rule(x, topk_idx, topk_weights, w13, w2, bias13=bias13, bias2=bias2,
                             layout=layout, recipe=recipe, activation=activation, backend=backend,
                             grouped_mm_backend=grouped_mm_backend)
    if is_dtensor(x):
        raise ValueError(f"x: a DTensor with placements {tuple(x.placements)} and plain expert weights; pass "
                         "x.to_local() (or DTensor weights, for tensor parallelism)")
    _check(x, topk_idx, topk_weights, w13, w2, bias13, bias2)
    act, lay = resolve_activation(activation), resolve_layout(layout)
    r = None if recipe is None else get_recipe(recipe)
    phases = None if r is None else _layer_phases(r, x.device, backend)
    compose = r is not None and phases is None
    w_up = None
    if isinstance(w13, (tuple, list)):
        if compose:
            w13 = torch.cat(tuple(w13), dim=1)
        else:
            w13, w_up = w13
    if compose:
        return composed(x, topk_idx.contiguous(), topk_weights.contiguous(), w13, w2, bias13, bias2, recipe,
                        grouped_mm_backend, act, lay, score_before=score_before)
    args = (x.contiguous(), topk_idx.contiguous(), topk_weights.contiguous(), w13, w2, bias13, bias2)
    if r is None:
        gather = () if backend == "composed" else tuple(sorted(
            get_backend(resolve_backend("auto", x.device)).bf16_gather_pieces(x.shape[1])))
        return Bf16.apply(*args, 0, act, lay, w_up, score_before, gather)
    return FusedMX.apply(*args, r.mode, act, lay, phases, w_up, score_before)
