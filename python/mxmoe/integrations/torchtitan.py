"""TorchTitan MoE layers on mxmoe's fused expert layer, recognised by structure.

Three TorchTitan variants are recognised; anything that looks like TorchTitan but matches none of them
raises a ValueError naming the module and what did not match, instead of running a different function.

  released (torchtitan 0.3.x)  ``MoE`` routes and counts (``router(x, expert_bias_E)``,
        ``tokens_per_expert_E``) and calls ``routed_experts``: a ``RoutedExperts`` holding a
        ``token_dispatcher`` and ``inner_experts`` (``GroupedExperts``: w1_EFD / w3_EFD (E, F, D) gate /
        up, w2_EDF (E, D, F); or gpt-oss's ``GptOssGroupedExperts``: interleaved mlp1_weight_EGD with
        mlp1_bias_EG, mlp2_weight_EDF with mlp2_bias_ED, the clamped SwiGLU). The scores multiply the
        expert outputs in the dispatcher's combine. Converted: ``RoutedExperts.forward`` becomes the fused
        layer (dispatch, experts, combine); the MoE's routing, bias and counting are not touched. The
        local and the "standard" all-to-all dispatcher are recognised; the fused layer runs while the
        dispatch is local (EP=1) and raises under an expert-parallel mesh. With any other dispatcher
        (DeepEP, HybridEP, ...) the experts' ``_grouped_mm`` seam runs on mxmoe.grouped_mm instead
        (mechanism "seam": dispatch and combine stay TorchTitan's).
  reference  (torchao's reference_moe.py, TorchTitan before the RoutedExperts split) ``MoE`` holds
        ``router`` with ``forward(x, expert_bias)``, ``reorderer``, ``experts`` (w1, w2, w3),
        ``expert_bias`` and ``tokens_per_expert`` (counted by the MoE), ``score_before_experts``.
  router_counts  ``router.forward(x)`` counts ``tokens_per_expert`` itself; the MoE has no expert bias.

For the last two the MoE's forward is replaced by :func:`moe_forward`, which does what the original
does around the experts: the same router call (with the bias where the router takes it), the same count
update, shared experts added, and the routed part on ``mxmoe.moe_experts`` -- with
``score_before=True`` when the MoE scales the gathered rows before the experts (TorchTitan's default).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from ..moe import ACTIVATIONS, Swiglu, is_dtensor, layer_backend_kwargs, moe_experts
from ..recipes import get_recipe

CONVERTER_BACKENDS = ("auto", "fused", "composed")


def check_recipe_backend(recipe: Optional[str], backend: str) -> None:
    """The converters' recipe (None: the bf16 fused layer) and backend, or a ValueError naming them."""
    if recipe is not None:
        get_recipe(recipe)
    if backend not in CONVERTER_BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, CONVERTER_BACKENDS))}, got {backend!r}")


# ---- the experts modules --------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpertsSpec:
    """What the fused layer needs of a TorchTitan experts module: attribute names and the activation."""

    gate: str  # w13's attribute, or the gate half's when `up` is set
    up: Optional[str]  # the up half's attribute (w1 / w3 style pair), or None for one (E, 2F, D) tensor
    down: str
    bias13: Optional[str] = None
    bias2: Optional[str] = None
    layout: str = "concatenated"
    activation: Swiglu = ACTIVATIONS["swiglu"]

    def weights(self, m: nn.Module) -> dict:
        names = [n for n in (self.gate, self.up, self.down, self.bias13, self.bias2) if n is not None]
        return {n: getattr(m, n) for n in names}

    @property
    def pair(self) -> Tuple[str, ...]:
        return () if self.up is None else (self.gate, self.up)


def _3d(m, *names):
    ws = [getattr(m, n, None) for n in names]
    return all(isinstance(w, Tensor) and w.dim() == 3 for w in ws)


def _method_owner(cls, name: str) -> Optional[str]:
    """The __qualname__ of the function `cls.name` resolves to (None when there is none)."""
    f = getattr(cls, name, None)
    return getattr(getattr(f, "__func__", f), "__qualname__", None)


def experts_spec(m: nn.Module) -> Optional[ExpertsSpec]:
    """The spec of a TorchTitan experts module (any variant), None when it is not one.

    Raises ValueError when the module has TorchTitan's expert weights but computes something else
    (its forward or its ``_grouped_mm`` seam overridden, e.g. by another converter)."""
    if _3d(m, "w1", "w2", "w3"):
        spec = ExpertsSpec("w1", "w3", "w2")
        known_forward = None  # the reference variant's GroupedExperts: checked by shape only
    elif _3d(m, "w1_EFD", "w2_EDF", "w3_EFD"):
        spec, known_forward = ExpertsSpec("w1_EFD", "w3_EFD", "w2_EDF"), "GroupedExperts.forward"
    elif _3d(m, "mlp1_weight_EGD", "mlp2_weight_EDF") and isinstance(getattr(m, "mlp1_bias_EG", None), Tensor):
        limit = float(getattr(m, "swiglu_limit", 7.0))
        spec = ExpertsSpec("mlp1_weight_EGD", None, "mlp2_weight_EDF", "mlp1_bias_EG", "mlp2_bias_ED",
                           layout="interleaved", activation=Swiglu(1.702, limit, 1.0))
        known_forward = "GptOssGroupedExperts.forward"
    else:
        return None
    w = spec.weights(m)
    gate, down = w[spec.gate], w[spec.down]
    E, F, D = gate.shape
    if spec.up is not None and tuple(w[spec.up].shape) != (E, F, D):
        raise ValueError(f"mxmoe: {type(m).__name__}.{spec.up}: expected shape {(E, F, D)} ({spec.gate}'s), got "
                         f"{tuple(w[spec.up].shape)}")
    F_out = F if spec.up is not None else F // 2
    if tuple(down.shape) != (E, D, F_out):
        raise ValueError(f"mxmoe: {type(m).__name__}.{spec.down}: expected shape {(E, D, F_out)}, got "
                         f"{tuple(down.shape)}")
    cls = type(m)
    if known_forward is not None and _method_owner(cls, "forward") != known_forward:
        raise ValueError(f"mxmoe: {cls.__name__} has TorchTitan's expert weights but its forward is "
                         f"{_method_owner(cls, 'forward')}, not {known_forward}: mxmoe cannot tell what it computes")
    if hasattr(cls, "_grouped_mm") and _method_owner(cls, "_grouped_mm") != "GroupedExperts._grouped_mm":
        raise ValueError(f"mxmoe: {cls.__name__} overrides GroupedExperts._grouped_mm "
                         f"({_method_owner(cls, '_grouped_mm')}): its GEMMs are already replaced (another "
                         "converter?); convert the unconverted model")
    return spec


def grouped_experts_weights(experts: nn.Module):
    """(w1, w2, w3) of a w1 / w3 pair experts module (any naming), else None."""
    try:
        spec = experts_spec(experts)
    except ValueError:
        return None
    if spec is None or spec.up is None:
        return None
    w = spec.weights(experts)
    return w[spec.gate], w[spec.down], w[spec.up]


def _local(w: Optional[Tensor], what: str) -> Optional[Tensor]:
    if w is not None and is_dtensor(w):
        raise NotImplementedError(f"mxmoe: {what} is a DTensor (tensor or expert parallel); the converted "
                                  "TorchTitan experts run on plain tensors (FSDP's unsharded weights are plain)")
    return w


def run_experts(experts: nn.Module, spec: ExpertsSpec, x: Tensor, ids: Tensor, scores: Tensor, recipe, backend,
                score_before: bool = False) -> Tensor:
    """mxmoe.moe_experts on the experts module's own parameters: (T, D) x, (T, K) ids and scores."""
    w = {n: _local(t, f"{type(experts).__name__}.{n}") for n, t in spec.weights(experts).items()}
    w13 = (w[spec.gate], w[spec.up]) if spec.up is not None else w[spec.gate]
    return moe_experts(x, ids, scores, w13, w[spec.down], recipe=recipe, activation=spec.activation,
                       layout=spec.layout, bias13=w.get(spec.bias13), bias2=w.get(spec.bias2),
                       score_before=score_before, **layer_backend_kwargs(backend))


# ---- torchtitan 0.3.x: RoutedExperts (token_dispatcher + inner_experts) -------------------------------


_LOCAL = ("LocalTokenDispatcher.dispatch", "LocalTokenDispatcher.combine")
_ALL_TO_ALL = ("AllToAllTokenDispatcher.dispatch", "AllToAllTokenDispatcher.combine")


def known_dispatcher(dispatcher) -> bool:
    """TorchTitan's LocalTokenDispatcher or its "standard" AllToAllTokenDispatcher (local while its
    ep_mesh is None, i.e. EP=1), or a subclass that keeps their dispatch and combine."""
    cls = type(dispatcher)
    return (_method_owner(cls, "dispatch"), _method_owner(cls, "combine")) in (_LOCAL, _ALL_TO_ALL)


def check_local_dispatch(dispatcher) -> None:
    """Raise unless the dispatcher dispatches locally now (mxmoe's fused layer owns dispatch and combine)."""
    cls = type(dispatcher)
    if (_method_owner(cls, "dispatch"), _method_owner(cls, "combine")) == _LOCAL:
        return
    if known_dispatcher(dispatcher) and getattr(dispatcher, "ep_mesh", None) is None:
        return  # AllToAllTokenDispatcher at EP=1 falls back to the local dispatch
    raise NotImplementedError(f"mxmoe: the routed experts' {cls.__name__} dispatches over an expert-parallel mesh; "
                              "mxmoe's fused layer dispatches locally (EP=1) only. Convert with EP=1, or leave the "
                              "MoE unconverted")


def is_routed_experts(parent: Optional[nn.Module], module: nn.Module) -> bool:
    return (parent is not None and getattr(parent, "inner_experts", None) is module
            and hasattr(parent, "token_dispatcher"))


def routed_forward(routed: nn.Module, x_BLD: Tensor, topk_scores_BLK: Tensor, topk_expert_ids_BLK: Tensor,
                   recipe, backend) -> Tensor:
    """RoutedExperts.forward with dispatch, experts and combine in mxmoe's fused layer: the scores
    multiply the expert outputs, as the local dispatcher's combine does."""
    if is_dtensor(x_BLD):
        raise NotImplementedError("mxmoe: the converted RoutedExperts got a DTensor input (tensor parallel); "
                                  "not supported")
    check_local_dispatch(routed.token_dispatcher)
    B, L, D = x_BLD.shape
    K = topk_scores_BLK.shape[-1]
    experts = routed.inner_experts
    out = run_experts(experts, experts_spec(experts), x_BLD.reshape(B * L, D),
                      topk_expert_ids_BLK.reshape(B * L, K), topk_scores_BLK.reshape(B * L, K), recipe, backend)
    return out.view(B, -1, D)


def routed_experts_forward(self: nn.Module, x_BLD, topk_scores_BLK, topk_expert_ids_BLK,
                           num_local_tokens_per_expert_E=None):
    """The instance forward mxmoe.convert installs on a RoutedExperts (same signature as TorchTitan's)."""
    return routed_forward(self, x_BLD, topk_scores_BLK, topk_expert_ids_BLK, self.__dict__["_mxmoe_recipe"],
                          self.__dict__.get("_mxmoe_backend", "auto"))


def grouped_mm_seam(recipe, backend):
    """GroupedExperts._grouped_mm (keyword-only A, B_t, offs) on mxmoe.grouped_mm."""
    from .. import grouped

    gmm_backend = layer_backend_kwargs(backend).get("grouped_mm_backend", "auto")

    def _grouped_mm(*, A, B_t, offs):
        return grouped.grouped_mm(A, B_t, offs, recipe=recipe, backend=gmm_backend)

    return _grouped_mm


# ---- shared experts (opt-in): TorchTitan's dense SwiGLU FeedForward on the fused layer -----------------


def check_dense_ffn(m: nn.Module, where: str, own_forward: bool = True) -> None:
    """Raise unless ``m`` is TorchTitan's FeedForward: w2(silu(w1(x)) * w3(x)), bias-free Linear layers
    (own_forward: its forward is FeedForward's own)."""
    lin = [getattr(m, n, None) for n in ("w1", "w2", "w3")]
    ok = all(isinstance(x, nn.Linear) and x.bias is None for x in lin)
    if ok:
        (F1, D), (D2, F2), (F3, D3) = (tuple(x.weight.shape) for x in lin)
        ok = F1 == F2 == F3 and D == D2 == D3
    if not ok or (own_forward and _method_owner(type(m), "forward") != "FeedForward.forward"):
        raise ValueError(f"mxmoe: {where} ({type(m).__name__}) is not TorchTitan's FeedForward (bias-free w1, w2, w3 "
                         "and forward w2(silu(w1 x) * w3 x)): its shared experts cannot run on the fused layer")


def dense_ffn(m: nn.Module, x: Tensor, recipe, backend) -> Tensor:
    """FeedForward ``m`` on x (..., D) as the fused layer with one expert and every token routed to it."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    T = x2.shape[0]
    ids = torch.zeros(T, 1, dtype=torch.int32, device=x.device)
    ones = torch.ones(T, 1, dtype=torch.float32, device=x.device)
    w1, w2, w3 = (_local(getattr(m, n).weight, f"{type(m).__name__}.{n}.weight") for n in ("w1", "w2", "w3"))
    out = moe_experts(x2, ids, ones, (w1.unsqueeze(0), w3.unsqueeze(0)), w2.unsqueeze(0), recipe=recipe,
                      **layer_backend_kwargs(backend))
    return out.reshape(shape)


def dense_ffn_forward(self: nn.Module, x: Tensor) -> Tensor:
    """The instance forward mxmoe.convert(shared_experts=True) installs on a shared FeedForward."""
    return dense_ffn(self, x, self.__dict__["_mxmoe_recipe"], self.__dict__.get("_mxmoe_backend", "auto"))


# ---- the reference and router-counting variants: the MoE's forward --------------------------------


def _forward_params(module: nn.Module):
    return [p for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def moe_variant(moe: nn.Module) -> str:
    """'reference' or 'router_counts' for a TorchTitan MoE with router + experts + score_before_experts;
    ValueError naming what does not match either."""
    name = type(moe).__name__
    router = getattr(moe, "router", None)
    if not isinstance(router, nn.Module) or not hasattr(router, "top_k"):
        raise ValueError(f"mxmoe: {name}.router: expected TorchTitan's token-choice router (a module with top_k)")
    if not isinstance(getattr(moe, "score_before_experts", None), bool):
        raise ValueError(f"mxmoe: {name}: expected a bool score_before_experts (TorchTitan's MoE)")
    params = [p.name for p in _forward_params(router)]
    has_bias_attr = "expert_bias" in moe.__dict__ or "expert_bias" in moe._buffers
    moe_counts = isinstance(moe._buffers.get("tokens_per_expert"), Tensor)
    router_counts = isinstance(getattr(router, "tokens_per_expert", None), Tensor)
    if len(params) == 2 and has_bias_attr and moe_counts and not router_counts and hasattr(moe, "reorderer"):
        return "reference"
    if len(params) == 1 and not has_bias_attr and router_counts and not moe_counts:
        return "router_counts"
    raise ValueError(
        f"mxmoe: {name} is TorchTitan-shaped (router, experts, score_before_experts) but matches no variant mxmoe "
        f"knows: router.forward takes {params}, MoE expert_bias {'present' if has_bias_attr else 'absent'}, "
        f"tokens_per_expert counted by {'the MoE' if moe_counts else ''}{' and ' if moe_counts and router_counts else ''}"
        f"{'the router' if router_counts else ''}{'nobody' if not (moe_counts or router_counts) else ''}. "
        "Known: router(x, expert_bias) with MoE-side expert_bias, tokens_per_expert and reorderer (torchao's "
        "reference_moe.py), or router(x) counting tokens_per_expert itself with no expert bias. Leave the module "
        "out with filter_fn, or use torchtitan 0.3's converter (mxmoe.integrations.torchtitan_converter)")


def is_torchtitan_moe(module: nn.Module) -> bool:
    """A MoE with router + experts (TorchTitan's expert weights) + score_before_experts (either variant)."""
    experts = getattr(module, "experts", None)
    return (isinstance(getattr(module, "router", None), nn.Module) and isinstance(experts, nn.Module)
            and hasattr(module, "score_before_experts") and grouped_experts_weights(experts) is not None)


def moe_forward(self: nn.Module, x: Tensor) -> Tensor:
    """The reference / router-counting MoE.forward with the routed part on mxmoe (module docstring)."""
    recipe, backend = self.__dict__["_mxmoe_recipe"], self.__dict__.get("_mxmoe_backend", "auto")
    variant = self.__dict__["_mxmoe_variant"]
    if is_dtensor(x):
        raise NotImplementedError("mxmoe: the converted TorchTitan MoE got a DTensor input (tensor parallel); "
                                  "not supported")
    bs, slen, dim = x.shape
    x = x.view(-1, dim)
    if variant == "reference":
        top_scores, selected, counts = self.router(x, self.expert_bias)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts)
    else:
        top_scores, selected, _ = self.router(x)
    routed = run_experts(self.experts, experts_spec(self.experts), x, selected, top_scores, recipe, backend,
                         score_before=self.score_before_experts)
    shared = getattr(self, "shared_experts", None)
    out = routed if shared is None else shared(x) + routed
    return out.reshape(bs, slen, dim)


def demo_experts_fn(recipe, backend: str = "auto"):
    """The demo model's MoE.experts_fn hook: (x, ids, weights, experts) -> the combined experts output."""

    def run(x, topk_idx, topk_weights, experts):
        return run_experts(experts, experts_spec(experts), x, topk_idx, topk_weights, recipe, backend)

    return run
