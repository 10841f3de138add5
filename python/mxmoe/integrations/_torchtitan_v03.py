"""TorchTitan 0.3.x's converter and routed-experts module (mxmoe/integrations/torchtitan_converter.py
documents them; import them from there)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from torchtitan.components.quantization import QuantizationConverter
from torchtitan.models.common.feed_forward import FeedForward
from torchtitan.models.common.moe import GroupedExperts, MoE, RoutedExperts
from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher, LocalTokenDispatcher

from ..recipes import get_recipe
from . import torchtitan as tt
from .torchtitan import check_recipe_backend as _check

def _experts_configs():
    # gpt-oss's package imports its parallelize code; imported when a conversion runs
    from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts

    return (GroupedExperts.Config, GptOssGroupedExperts.Config)



# The "standard" all-to-all dispatcher is the models' default; at EP=1 (no ep mesh) it dispatches locally.
_DISPATCHER_CONFIGS = (LocalTokenDispatcher.Config, AllToAllTokenDispatcher.Config)
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


class MXMoEFeedForward(FeedForward):
    """TorchTitan's FeedForward (a MoE's shared experts) on mxmoe's fused layer as one expert."""

    @dataclass(kw_only=True, slots=True)
    class Config(FeedForward.Config):
        recipe: Optional[str] = "mxfp8_rceil_tile128"
        backend: str = "auto"

    def __init__(self, config: Config):
        _check(config.recipe, config.backend)
        super().__init__(config)
        tt.check_dense_ffn(self, "shared_experts", own_forward=False)
        self.recipe = None if config.recipe is None else get_recipe(config.recipe).name
        self.backend = config.backend

    def forward(self, x):
        return tt.dense_ffn(self, x, self.recipe, self.backend)


class MXMoEConverter(QuantizationConverter):
    """Routed experts of every MoE on mxmoe's fused expert layer (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(QuantizationConverter.Config):
        recipe: Optional[str] = "mxfp8_rceil_tile128"
        """mxmoe recipe: 'mxfp8_rceil_tile128' (FP8 GEMMs on Hopper), 'mxfp8_rceil', 'mxfp8_floor',
        'mxfp8_rceil_wgrad_with_hp', or None for mxmoe's bf16 fused layer."""
        backend: str = "auto"
        """'auto', 'fused' or 'composed' (mxmoe.moe_experts' backend)."""
        shared_experts: bool = False
        """Also run each MoE's shared experts (TorchTitan's FeedForward) on the fused layer, as one expert
        with every token routed to it. Off: they stay TorchTitan's bf16 FeedForward."""

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
            if type(cfg.inner_experts) not in _experts_configs():
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
        if self.config.shared_experts:
            for fqn, moe_cfg, _, _ in list(model_config.traverse(MoE.Config)):
                shared = moe_cfg.shared_experts
                if shared is None:
                    continue
                if type(shared) not in (FeedForward.Config, MXMoEFeedForward.Config):
                    raise ValueError(f"mxmoe: {fqn}.shared_experts is a {type(shared).__qualname__}: expected "
                                     "FeedForward.Config (shared_experts=True runs TorchTitan's SwiGLU FeedForward)")
                kept = {f.name: getattr(shared, f.name) for f in fields(FeedForward.Config) if f.init}
                moe_cfg.shared_experts = MXMoEFeedForward.Config(**kept, recipe=self.config.recipe,
                                                                 backend=self.config.backend)
        return model_config
