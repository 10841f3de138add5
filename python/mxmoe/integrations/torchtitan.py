"""TorchTitan-style MoE layers on mxmoe's fused expert layer.

TorchTitan's ``MoE`` (torchtitan/models/common/moe/moe.py) holds ``router`` (token-choice top-k:
``router(x) -> (top_scores, selected_experts_indices, num_tokens_per_expert)``, which also counts
``tokens_per_expert`` for the load-balancing bias), ``reorderer``, ``experts`` (``GroupedExperts``:
3D ``w1`` gate (E, I, H), ``w3`` up (E, I, H), ``w2`` down (E, H, I)), optional ``shared_experts`` and
``score_before_experts``. Its forward sorts the tokens by expert, gathers them, runs the three
grouped GEMMs and scatters back. :func:`moe_forward` is that forward with the routed part replaced by
``mxmoe.moe_experts(x, ids, scores, (w1, w3), w2)``: same router call (so the load-balancing counts
and bias behave as before), same shared experts, same output; the parameters are untouched (w1 and
w3 are joined for the GEMM once per optimizer step, in the weight cache).

``score_before_experts=True`` (TorchTitan's default: experts(score * x), then a plain sum) is a
different function of the scores from the fused layer's score * experts(x); it runs on mxmoe's
composed path (mxmoe.grouped_mm between gather, SwiGLU and combine), with the scores applied to
the gathered rows exactly as TorchTitan does.

mxmoe.convert() installs moe_forward on every such module (an instance attribute; unconvert removes
it) and on the demo model's MoE (which has an ``experts_fn`` hook for the same purpose).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..moe import ACTIVATIONS, _composed, is_dtensor, layer_backend_kwargs, moe_experts


def grouped_experts_weights(experts: nn.Module):
    """(w1, w2, w3) when ``experts`` is GroupedExperts-shaped (3D w1/w3 (E, I, H), w2 (E, H, I)), else None."""
    w1, w2, w3 = (getattr(experts, n, None) for n in ("w1", "w2", "w3"))
    if not all(isinstance(w, Tensor) and w.dim() == 3 for w in (w1, w2, w3)):
        return None
    E, I, H = w1.shape
    if tuple(w3.shape) != (E, I, H) or tuple(w2.shape) != (E, H, I):
        return None
    return w1, w2, w3


def is_torchtitan_moe(module: nn.Module) -> bool:
    """TorchTitan's MoE: router with top_k returning (scores, ids, counts), GroupedExperts-shaped experts."""
    router, experts = getattr(module, "router", None), getattr(module, "experts", None)
    return (isinstance(router, nn.Module) and hasattr(router, "top_k") and isinstance(experts, nn.Module)
            and grouped_experts_weights(experts) is not None and hasattr(module, "score_before_experts"))


def _local(w: Tensor) -> Tensor:
    if is_dtensor(w):
        raise NotImplementedError("mxmoe: expert weights are DTensors (FSDP / TP / EP); the converted TorchTitan "
                                  "MoE runs on plain tensors for now")
    return w


def moe_forward(self: nn.Module, x: Tensor) -> Tensor:
    """TorchTitan's MoE.forward with the routed experts on mxmoe (see the module docstring)."""
    recipe, backend = self.__dict__["_mxmoe_recipe"], self.__dict__.get("_mxmoe_backend", "auto")
    if is_dtensor(x):
        raise NotImplementedError("mxmoe: the converted TorchTitan MoE got a DTensor input (tensor parallel); "
                                  "not supported yet")
    bs, slen, dim = x.shape
    x = x.view(-1, dim)
    top_scores, selected, _ = self.router(x)
    w1, w2, w3 = (_local(w) for w in grouped_experts_weights(self.experts))
    if self.score_before_experts:
        gmm_backend = layer_backend_kwargs(backend).get("grouped_mm_backend", "auto")
        routed = _composed(x, selected.contiguous(), top_scores.contiguous(), torch.cat([w1, w3], dim=1), w2, None,
                           None, recipe, gmm_backend, ACTIVATIONS["swiglu"], 0, score_before=True)
    else:
        routed = moe_experts(x, selected, top_scores, (w1, w3), w2, recipe=recipe, **layer_backend_kwargs(backend))
    shared = getattr(self, "shared_experts", None)
    out = routed if shared is None else shared(x) + routed
    return out.reshape(bs, slen, dim)


def demo_experts_fn(recipe, backend: str = "auto"):
    """The demo model's MoE.experts_fn hook: (x, ids, weights, experts) -> the combined experts output."""

    def run(x, topk_idx, topk_weights, experts):
        w1, w2, w3 = grouped_experts_weights(experts)
        return moe_experts(x, topk_idx, topk_weights, (w1, w3), w2, recipe=recipe, **layer_backend_kwargs(backend))

    return run
