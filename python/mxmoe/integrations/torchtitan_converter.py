"""A TorchTitan (0.3.x) model converter that puts every MoE's routed experts on mxmoe's fused layer.

TorchTitan's converters rewrite the model *config* before the model is built; list this one in a
model registry's ``converters=[...]``::

    from mxmoe.integrations.torchtitan_converter import MXMoEConverter
    from torchtitan.models.qwen3 import model_registry
    spec = model_registry("debugmodel_moe", converters=[MXMoEConverter.Config(recipe="mxfp8_rceil_tile128")])

Each ``RoutedExperts.Config`` with TorchTitan's local or "standard" all-to-all token dispatcher and a ``GroupedExperts``
or ``GptOssGroupedExperts`` inside becomes an :class:`MXMoERoutedExperts.Config`: the same children
(parameter names, initialisation, state_dict keys unchanged), a forward that runs dispatch, experts and
combine in ``mxmoe.moe_experts``. The MoE around it (router, expert bias, load-balancing counts, shared
experts) is TorchTitan's own code, untouched. The fused layer dispatches locally: under an
expert-parallel mesh (EP > 1) the forward raises NotImplementedError. Anything else raises ValueError naming the config's FQN:
nothing is converted halfway. Importing this module imports torchtitan.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from torchtitan.components.quantization import QuantizationConverter
from torchtitan.models.common.moe import GroupedExperts, RoutedExperts
from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher, LocalTokenDispatcher
from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts

from ..recipes import get_recipe
from . import torchtitan as tt

__all__ = ["MXMoEConverter", "MXMoERoutedExperts"]

_EXPERTS_CONFIGS = (GroupedExperts.Config, GptOssGroupedExperts.Config)
# The "standard" all-to-all dispatcher is the models' default; at EP=1 (no ep mesh) it dispatches locally.
_DISPATCHER_CONFIGS = (LocalTokenDispatcher.Config, AllToAllTokenDispatcher.Config)
_BACKENDS = ("auto", "fused", "composed")


def _check(recipe: Optional[str], backend: str) -> None:
    if recipe is not None:
        get_recipe(recipe)  # ValueError naming the recipes
    if backend not in _BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, _BACKENDS))}, got {backend!r}")


class MXMoERoutedExperts(RoutedExperts):
    """TorchTitan's RoutedExperts with dispatch, experts and combine in mxmoe's fused layer."""

    @dataclass(kw_only=True, slots=True)
    class Config(RoutedExperts.Config):
        recipe: Optional[str] = "mxfp8_rceil_tile128"
        """mxmoe recipe of the expert GEMMs; None runs the same fused layer in bf16."""
        backend: str = "auto"
        """'auto' (fused where the hardware has it), 'fused' (raise instead of composing) or 'composed'."""

    def __init__(self, config: Config):
        _check(config.recipe, config.backend)
        super().__init__(config)
        if not tt.known_dispatcher(self.token_dispatcher):
            raise ValueError(f"token_dispatcher: expected TorchTitan's LocalTokenDispatcher or AllToAllTokenDispatcher, "
                             f"got {type(self.token_dispatcher).__name__}")
        tt.experts_spec(self.inner_experts)  # raises for experts whose computation mxmoe does not know
        self.recipe = None if config.recipe is None else get_recipe(config.recipe).name
        self.backend = config.backend

    def forward(self, x_BLD, topk_scores_BLK, topk_expert_ids_BLK, num_local_tokens_per_expert_E):
        return tt.routed_forward(self, x_BLD, topk_scores_BLK, topk_expert_ids_BLK, self.recipe, self.backend)


class MXMoEConverter(QuantizationConverter):
    """Routed experts of every MoE on mxmoe's fused expert layer (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(QuantizationConverter.Config):
        recipe: Optional[str] = "mxfp8_rceil_tile128"
        """mxmoe recipe: 'mxfp8_rceil_tile128' (FP8 GEMMs on Hopper), 'mxfp8_rceil', 'mxfp8_floor',
        'mxfp8_rceil_wgrad_with_hp', or None for mxmoe's bf16 fused layer."""
        backend: str = "auto"
        """'auto', 'fused' or 'composed' (mxmoe.moe_experts' backend)."""

    def __init__(self, config: Config):
        _check(config.recipe, config.backend)
        self.config = config

    def convert(self, model_config):
        converted = 0
        for fqn, cfg, parent, attr in list(model_config.traverse(RoutedExperts.Config)):
            where = fqn or "<root>"
            if type(cfg.token_dispatcher) not in _DISPATCHER_CONFIGS:
                raise ValueError(f"mxmoe: {where}.token_dispatcher is a {type(cfg.token_dispatcher).__qualname__}: "
                                 "MXMoEConverter fuses dispatch and combine for the local or the standard all-to-all "
                                 "dispatcher (comm_backend 'standard') at EP=1 only")
            if type(cfg.inner_experts) not in _EXPERTS_CONFIGS:
                raise ValueError(f"mxmoe: {where}.inner_experts is a {type(cfg.inner_experts).__qualname__}: expected "
                                 "GroupedExperts.Config or GptOssGroupedExperts.Config (another converter applied "
                                 "first?)")
            kept = {f.name: getattr(cfg, f.name) for f in fields(RoutedExperts.Config) if f.init}
            new = MXMoERoutedExperts.Config(**kept, recipe=self.config.recipe, backend=self.config.backend)
            if parent is None:
                model_config = new
            elif isinstance(parent, list):
                parent[attr] = new
            else:
                setattr(parent, attr, new)
            converted += 1
        if converted == 0:
            raise ValueError("mxmoe: MXMoEConverter found no RoutedExperts in the model config: nothing to convert")
        return model_config
