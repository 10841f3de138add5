"""TorchTitan model converters that put every MoE's routed experts on mxmoe's fused layer.

One name, ``MXMoEConverter``, in the convention of the installed torchtitan release:

torchtitan 0.2.x: a ``ModelConverter`` registered as ``"mxmoe"`` (recipe mxfp8_rceil_tile128) and
``"mxmoe.<recipe>"`` (any mxmoe recipe), each also as ``"<name>.shared"`` (the shared experts on the
fused layer too); list it in ``model.converters`` of the job config. It runs
``mxmoe.convert`` on the built model (the reference MoE variant: ``router(x, expert_bias)``, counts on
the MoE, ``score_before_experts`` on the fused path).

torchtitan 0.3.x (below):

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

import importlib.util
from typing import Optional

from ..recipes import RECIPES
from .torchtitan import check_recipe_backend

if importlib.util.find_spec("torchtitan.protocols.model_converter") is not None:  # torchtitan 0.2.x
    from torchtitan.protocols.model_converter import register_model_converter

    __all__ = ["MXMoEConverter"]

    class MXMoEConverter:
        """TorchTitan 0.2's ModelConverter: the MoEs' routed experts on mxmoe's fused layer."""

        recipe: Optional[str] = "mxfp8_rceil_tile128"
        backend: str = "auto"
        shared_experts: bool = False

        def __init__(self, job_config, parallel_dims):
            check_recipe_backend(self.recipe, self.backend)
            if getattr(parallel_dims, "ep_enabled", False):
                raise NotImplementedError("mxmoe: MXMoEConverter fuses dispatch and combine at EP=1 only; "
                                          "parallelism.expert_parallel_degree > 1 is not supported")

        def convert(self, model):
            from ..conversion import convert, conversion_mechanism

            convert(model, recipe=self.recipe, backend=self.backend, shared_experts=self.shared_experts)
            if not any(conversion_mechanism(m) == "torchtitan" for m in model.modules()):
                raise ValueError("mxmoe: MXMoEConverter found no TorchTitan MoE in the model: nothing to convert")

        def post_optimizer_hook(self, model):
            pass

    register_model_converter(MXMoEConverter, "mxmoe")
    register_model_converter(type("MXMoEConverter_shared", (MXMoEConverter,), {"shared_experts": True}),
                             "mxmoe.shared")
    for _name in RECIPES:
        for _shared in (False, True):
            register_model_converter(
                type(f"MXMoEConverter_{_name}", (MXMoEConverter,), {"recipe": _name, "shared_experts": _shared}),
                f"mxmoe.{_name}" + (".shared" if _shared else ""))
else:  # torchtitan 0.3.x
    from ._torchtitan_v03 import MXMoEConverter, MXMoEFeedForward, MXMoERoutedExperts  # noqa: F401

    __all__ = ["MXMoEConverter", "MXMoEFeedForward", "MXMoERoutedExperts"]

