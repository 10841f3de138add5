"""mxmoe as a transformers 5 experts implementation.

    import mxmoe
    model = AutoModelForCausalLM.from_config(config, experts_implementation="mxmoe")
    # or, on a loaded model:  model.set_experts_implementation("mxmoe")

transformers 5 routes every MoE experts module decorated with ``@use_experts_implementation``
through ``ALL_EXPERTS_FUNCTIONS[config._experts_implementation]`` (src/transformers/integrations/
moe.py). ``import mxmoe`` registers :func:`experts_forward` there as ``"mxmoe"`` (at once when
transformers is already imported, else when it imports that module: no transformers import cost
for users who do not use it). The function runs the module's own parameters through
``mxmoe.moe_experts``, the fused expert layer (dispatch, FP8 GEMMs with SwiGLU between them,
combine): nothing is copied or re-registered, so state_dict, checkpoints, optimizers and
``.to()`` see the model unchanged.

The recipe, per experts module, from the first that is set:
  1. ``module._mxmoe_recipe`` (what ``mxmoe.convert(model, recipe=...)`` sets);
  2. the model config's ``mxmoe_recipe`` attribute (``AutoConfig.from_pretrained(..., mxmoe_recipe=
     "mxfp8_rceil")``; it is saved with the config);
  3. ``mxmoe.configure(recipe=...)``, default ``"mxfp8_rceil_tile128"``.
``"bf16"`` (or None) runs the same fused layer without quantization.

Which experts fit (checked on every call, with an error naming the module's class and the reason):
gated experts (``has_gate``) whose gate is either transformers' default ``act_fn(gate) * up`` on
the ``.chunk(2)`` halves with ``act_fn`` SiLU (Qwen2/3-MoE, Mixtral, OLMoE, DeepSeek-V2/V3, ...), or
gpt-oss's clamped SwiGLU on interleaved halves (``alpha``, ``limit`` read from the module);
``is_transposed`` weights are read through a transposed view; expert biases (``has_bias``) are
the layer's biases. H and I must be multiples of 32 (MX blocks).

generate(): transformers swaps ``"grouped_mm"`` for ``"batched_mm"`` while decoding; it leaves
other implementations alone, so a model on ``"mxmoe"`` decodes through mxmoe as well (the weights'
quantized forms come from the weight cache; decode steps of a few tokens are bound by the layer's
fixed costs, not its GEMMs). eval(), no_grad and inference_mode run the forward only.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..moe import Swiglu, layer_backend_kwargs, moe_experts
from ..recipes import get_recipe

NAME = "mxmoe"
_DEFAULTS = {"recipe": "mxfp8_rceil_tile128", "backend": "auto"}


def configure(recipe: Optional[str] = None, backend: Optional[str] = None) -> dict:
    """Set the defaults of the registered ``"mxmoe"`` experts implementation (and of convert's
    transformers modules): recipe (an mxmoe recipe name, or "bf16") and backend ('auto', 'fused',
    'composed'). Returns the settings now in force."""
    if recipe is not None:
        _recipe(recipe)  # validates
        _DEFAULTS["recipe"] = recipe
    if backend is not None:
        if backend not in ("auto", "fused", "composed"):
            raise ValueError(f"backend: expected 'auto', 'fused' or 'composed', got {backend!r}")
        _DEFAULTS["backend"] = backend
    return dict(_DEFAULTS)


def _recipe(name) -> Optional[str]:
    if name is None or name == "bf16":
        return None
    return get_recipe(name).name


@dataclass(frozen=True)
class ExpertsSpec:
    """How a transformers experts module maps onto mxmoe.moe_experts."""

    layout: str  # "concatenated" | "interleaved"
    activation: Swiglu
    transposed: bool  # gate_up_proj (E, H, 2I), down_proj (E, I, H)
    bias: bool


class UnsupportedExperts(ValueError):
    """The experts module's computation is not one the fused layer implements."""


def _is_silu(fn) -> bool:
    if isinstance(fn, torch.nn.SiLU):
        return True
    try:
        from transformers.activations import SiLUActivation
    except ImportError:  # pragma: no cover - transformers without that class
        return False
    return isinstance(fn, SiLUActivation)


def _gpt_oss_gate():
    try:
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    except ImportError:  # pragma: no cover
        return None
    return GptOssExperts._apply_gate


def _same_code(f, g) -> bool:
    f, g = getattr(f, "__code__", None), getattr(g, "__code__", None)
    return f is not None and g is not None and (f.co_code, f.co_consts, f.co_names) == (g.co_code, g.co_consts,
                                                                                      g.co_names)


def experts_spec(module: torch.nn.Module) -> ExpertsSpec:
    """The module's layout and activation, or UnsupportedExperts saying why it does not fit."""
    cls = type(module).__name__
    if not getattr(module, "has_gate", False):
        raise UnsupportedExperts(f"mxmoe: {cls} has ungated experts (up_proj and an activation); the fused "
                                 "expert layer implements gated SwiGLU experts only")
    from transformers.integrations.moe import _default_apply_gate

    gate = getattr(type(module), "_apply_gate", None)
    gpt_oss = None if gate is _default_apply_gate else _gpt_oss_gate()  # imported only when needed
    if gate is _default_apply_gate:
        act_fn = getattr(module, "act_fn", None)
        if not _is_silu(act_fn):
            raise UnsupportedExperts(f"mxmoe: {cls} gates with act_fn = {type(act_fn).__name__} (config.hidden_act); "
                                     "the fused expert layer implements SiLU gates (SwiGLU) only")
        act, layout = Swiglu(), "concatenated"
    elif gpt_oss is not None and (gate is gpt_oss or _same_code(gate, gpt_oss)):
        act, layout = Swiglu(float(module.alpha), float(module.limit), 1.0), "interleaved"
    else:
        raise UnsupportedExperts(f"mxmoe: {cls} has its own _apply_gate ({getattr(gate, '__qualname__', gate)}), "
                                 "which is neither transformers' default SwiGLU nor gpt-oss's clamped one")
    return ExpertsSpec(layout, act, bool(getattr(module, "is_transposed", False)),
                       bool(getattr(module, "has_bias", False)))


def module_recipe(module) -> Optional[str]:
    name = module.__dict__.get("_mxmoe_recipe")
    if name is None:
        name = getattr(getattr(module, "config", None), "mxmoe_recipe", None)
    if name is None:
        name = _DEFAULTS["recipe"]
    return _recipe(name)


def experts_forward(self: torch.nn.Module, hidden_states: Tensor, top_k_index: Tensor,
                    top_k_weights: Tensor) -> Tensor:
    """transformers' experts interface: (T, H) tokens, (T, k) expert ids and routing weights -> (T, H)."""
    spec = experts_spec(self)
    w13, w2 = self.gate_up_proj, self.down_proj
    if spec.transposed:
        w13, w2 = w13.transpose(-2, -1), w2.transpose(-2, -1)
    b13 = self.gate_up_proj_bias if spec.bias else None
    b2 = self.down_proj_bias if spec.bias else None
    # As transformers' grouped_mm experts: the tokens in the weights' dtype (autocast can hand over
    # fp32 activations with bf16 weights), the result in the tokens' dtype.
    x = hidden_states if hidden_states.dtype == w2.dtype else hidden_states.to(w2.dtype)
    out = moe_experts(x, top_k_index, top_k_weights, w13, w2, recipe=module_recipe(self),
                      activation=spec.activation, layout=spec.layout, bias13=b13, bias2=b2,
                      **layer_backend_kwargs(self.__dict__.get("_mxmoe_backend") or _DEFAULTS["backend"]))
    return out.to(hidden_states.dtype)


def is_transformers_experts(module: torch.nn.Module) -> bool:
    """An experts module of a transformers 5 model that dispatches through ALL_EXPERTS_FUNCTIONS."""
    if "transformers" not in sys.modules:
        return False
    return (hasattr(module, "has_gate") and hasattr(module, "is_transposed") and hasattr(module, "config")
            and hasattr(module, "gate_up_proj" if module.has_gate else "up_proj")
            and hasattr(module, "down_proj"))


# ---- registration ---------------------------------------------------------------------------------

_TARGET = "transformers.integrations.moe"


def register() -> None:
    """Register experts_forward as transformers' "mxmoe" experts implementation (idempotent)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, experts_forward)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Runs register() right after transformers imports its experts interface module."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)  # the module is in sys.modules from here on: register() imports it
            _remove_hook()
            register()

        spec.loader.exec_module = exec_and_register
        return spec


_HOOK = _RegisterOnImport()


def _remove_hook() -> None:
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def register_when_available() -> None:
    """At `import mxmoe`: register now if transformers' interface is loaded, else when it loads."""
    if _TARGET in sys.modules:
        register()
    elif _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
