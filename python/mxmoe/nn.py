"""torch.nn modules over mxmoe's functional layers.

MoEExperts owns one MoE layer's expert weights in the layouts transformers 5 and TorchTitan use
(w13 (E, 2I, H): gate and up; w2 (E, H, I): down) and runs mxmoe.moe_experts on them: routing in,
combined token outputs out. The router stays with the model (it decides topk_idx / topk_weights).
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import Tensor, nn

from .moe import Swiglu, moe_experts, resolve_activation, resolve_layout

__all__ = ["MoEExperts"]


def check_sizes(**sizes: int) -> None:
    """Expert layer sizes: positive ints; hidden_size and intermediate_size multiples of 32 (MX blocks)."""
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    h, i = sizes["hidden_size"], sizes["intermediate_size"]
    if h % 32 or i % 32:
        raise ValueError(f"hidden_size, intermediate_size: expected multiples of 32, got {h}, {i}")


def make_expert_parameters(module: nn.Module, num_experts: int, hidden_size: int, intermediate_size: int,
                           bias: bool, dtype=None, device=None) -> None:
    """module.w13 (E, 2I, H), w2 (E, H, I) and, with bias, bias13 (E, 2I), bias2 (E, H) (else None)."""
    kw = dict(dtype=dtype, device=device)
    module.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, **kw))
    module.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, **kw))
    if bias:
        module.bias13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, **kw))
        module.bias2 = nn.Parameter(torch.empty(num_experts, hidden_size, **kw))
    else:
        module.register_parameter("bias13", None)
        module.register_parameter("bias2", None)


def init_expert_parameters_(w13: Tensor, w2: Tensor, bias13: Optional[Tensor], bias2: Optional[Tensor],
                            hidden_size: int, intermediate_size: int) -> None:
    """nn.Linear's default per expert: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), in place."""
    with torch.no_grad():
        for t, fan_in in ((w13, hidden_size), (w2, intermediate_size), (bias13, hidden_size),
                          (bias2, intermediate_size)):
            if t is not None:
                t.uniform_(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))


class MoEExperts(nn.Module):
    """The experts of one MoE layer: out[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t]).

    Args:
      num_experts, hidden_size, intermediate_size: E, H, I (H and I multiples of 32).
      recipe: 'mxfp8_rceil_tile128' (default), 'mxfp8_rceil', 'mxfp8_floor', 'mxfp8_rceil_wgrad_with_hp'
        or None (the same fused layer in bf16); changeable later through the `recipe` attribute.
      activation: 'swiglu' (default), 'gpt_oss' or a mxmoe.moe.Swiglu.
      layout: 'concatenated' (w13[:, :I] gate, w13[:, I:] up) or 'interleaved' (even rows gate, odd up).
      bias: give the experts biases bias13 (E, 2I) and bias2 (E, H).
      dtype, device: of the parameters.
    forward(x (..., H), topk_idx (..., k), topk_weights (..., k)) -> (..., H) in x's dtype.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 recipe: Optional[str] = "mxfp8_rceil_tile128", activation: Union[str, Swiglu] = "swiglu",
                 layout: str = "concatenated", bias: bool = False, dtype: Optional[torch.dtype] = None,
                 device=None):
        super().__init__()
        resolve_activation(activation), resolve_layout(layout)  # fail early on a bad name
        check_sizes(num_experts=num_experts, hidden_size=hidden_size, intermediate_size=intermediate_size)
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.recipe, self.activation, self.layout = recipe, activation, layout
        make_expert_parameters(self, num_experts, hidden_size, intermediate_size, bias, dtype, device)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_expert_parameters_(self.w13, self.w2, self.bias13, self.bias2, self.hidden_size,
                                self.intermediate_size)

    def forward(self, x: Tensor, topk_idx: Tensor, topk_weights: Tensor) -> Tensor:
        lead = x.shape[:-1]
        out = moe_experts(x.reshape(-1, x.shape[-1]), topk_idx.reshape(-1, topk_idx.shape[-1]),
                          topk_weights.reshape(-1, topk_weights.shape[-1]), self.w13, self.w2, recipe=self.recipe,
                          activation=self.activation, layout=self.layout, bias13=self.bias13, bias2=self.bias2)
        # No view of the result for 2-D tokens: FSDP2 warns about modules that return views.
        return out if x.dim() == 2 else out.reshape(*lead, x.shape[-1])

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, recipe={self.recipe!r}, "
                f"activation={self.activation!r}, layout={self.layout!r}, bias={self.bias13 is not None}")
