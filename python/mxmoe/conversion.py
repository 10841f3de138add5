"""mxmoe.convert: run an existing MoE model's experts through mxmoe without editing its code.

convert() picks, per module it selects (default: modules that directly own a 3D parameter, i.e. the
expert weights), the best of three mechanisms:

  transformers  an experts module of a transformers 5 model (``@use_experts_implementation``): its
                forward becomes mxmoe's registered experts implementation (mxmoe/integrations/
                transformers.py), the whole fused expert layer on the module's own parameters.
                (For the whole model in one line, without convert: ``experts_implementation="mxmoe"``.)
  torchtitan    the experts of a TorchTitan MoE (torchtitan 0.3's RoutedExperts, torchao's reference MoE,
                the router-counting variant; recognised by structure, mxmoe/integrations/torchtitan.py):
                the routed part runs on the fused layer; routing, expert bias, load-balancing counts
                and shared experts exactly as the model does them. A TorchTitan-shaped MoE that fits
                no known variant is an error, not a guess.
  demo          the demo model's MoE (its experts_fn hook).
  seam          a TorchTitan GroupedExperts whose dispatcher mxmoe does not know (DeepEP, HybridEP, ...)
                or outside a MoE: its ``_grouped_mm`` method runs on mxmoe.grouped_mm.
  redirect      anything else whose forward calls ``torch._grouped_mm`` (or ``F.grouped_mm``) on a
                3D weight: a copy of the module's forward function whose globals see an mxmoe
                ``torch._grouped_mm`` (2D A, 3D B, offs given -> mxmoe.grouped_mm; other calls go to
                torch's), so only those calls change and no other torch call pays for an intercept.
                torch.compile traces the copy like the original.

Nothing is added to the parameters or buffers: optimizers, state_dict, model.to(), deepcopy (the
copy is converted too) see the model as before. Each mechanism is an instance attribute of the
module it changes; unconvert() removes them. Calling convert() again replaces recipe and backend.
"""
from __future__ import annotations

import sys
import types
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .recipes import get_recipe

_ATTR = "_mxmoe_convert"


def _owns_3d_parameter(module: nn.Module, fqn: str) -> bool:
    return any(p.dim() == 3 for p in module.parameters(recurse=False))


# ---- redirect: the module's forward with an mxmoe torch._grouped_mm in its globals ---------------


def _redirecting_grouped_mm(recipe: str, backend: str):
    real = torch._grouped_mm

    def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        if offs is None or mat_a.dim() != 2 or mat_b.dim() != 3:
            return real(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)  # not the expert pattern
        from .grouped import grouped_mm as mx_grouped_mm

        return mx_grouped_mm(mat_a, mat_b, offs, recipe=recipe, backend=backend, bias=bias,
                             out_dtype=out_dtype if out_dtype is not None else mat_a.dtype)

    return grouped_mm


def _module_with(real: types.ModuleType, name: str, fn) -> types.ModuleType:
    """A module object like ``real`` with ``name`` bound to ``fn`` (real is not modified)."""
    # Its own name: Dynamo resolves a module called "torch" to torch itself.
    twin = types.ModuleType(f"mxmoe_redirect.{real.__name__}", real.__doc__)
    twin.__dict__.update({k: v for k, v in real.__dict__.items() if k not in ("__name__", "__doc__")})
    setattr(twin, name, fn)
    return twin


def _redirected_forward(module: nn.Module, recipe: str, backend: str):
    """type(module).forward with torch._grouped_mm / F.grouped_mm redirected, or None when its code
    reaches neither through a global name."""
    f = type(module).forward
    f = getattr(f, "__func__", f)
    code = getattr(f, "__code__", None)
    if code is None:
        return None
    key = (code, recipe, backend)
    fn = _REDIRECTED.get(key)
    if fn is None:
        fn = _REDIRECTED[key] = _redirected_function(f, recipe, backend)
    return None if fn is None else types.MethodType(fn, module)


_REDIRECTED: dict = {}  # (forward's code, recipe, backend) -> its redirected copy (or None)


def _globals_reaching_grouped_mm(code) -> set:
    """Global names the code reads `_grouped_mm` / `grouped_mm` from (``torch._grouped_mm(...)``,
    ``F.grouped_mm(...)``), in it or its nested functions: only such a forward is redirected, so a
    forward that merely uses torch while its GEMMs run elsewhere (a method it calls) is not reported
    as converted."""
    import dis

    names, last_global = set(), None
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_GLOBAL":
            last_global = ins.argval
            continue
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and last_global is not None \
                and ins.argval in ("_grouped_mm", "grouped_mm"):
            names.add(last_global)
        last_global = None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_reaching_grouped_mm(const)
    return names


def _redirected_function(f, recipe: str, backend: str):
    mm = _redirecting_grouped_mm(recipe, backend)
    # The copy's globals are a registered module of their own (a snapshot of f's module globals):
    # torch.compile resolves an inlined function's globals through its module's name.
    home = types.ModuleType(f"mxmoe_redirect_{len(_REDIRECTED)}_{f.__globals__.get('__name__', 'module')}")
    globs = home.__dict__
    globs.update({k: v for k, v in f.__globals__.items() if k not in ("__name__", "__spec__", "__loader__")})
    changed = False
    reached = _globals_reaching_grouped_mm(f.__code__)
    for name, value in f.__globals__.items():
        if name not in reached:
            continue
        if value is torch:
            globs[name] = _module_with(torch, "_grouped_mm", mm)
            changed = True
        elif value is F and hasattr(F, "grouped_mm"):
            globs[name] = _module_with(F, "grouped_mm", mm)
            changed = True
    if not changed:
        return None
    sys.modules[home.__name__] = home
    fn = types.FunctionType(f.__code__, globs, f.__name__, f.__defaults__, f.__closure__)
    fn.__kwdefaults__ = f.__kwdefaults__
    fn.__qualname__ = f.__qualname__
    return fn


# ---- per-module state ----------------------------------------------------------------------------


class _Conversion:
    """What convert() changed on one selected module, so that unconvert() can undo it."""

    def __init__(self, mechanism: str, target: nn.Module, attrs: dict, recipe: str):
        self.mechanism = mechanism  # "transformers" | "torchtitan" | "demo" | "seam" | "redirect" | "dense"
        self.target = target  # the module whose attributes changed (the experts or their MoE)
        self.attrs = attrs  # attribute -> previous value (_MISSING: there was none)
        self.recipe = recipe

    def remove(self):
        for name, old in self.attrs.items():
            if old is _MISSING:
                self.target.__dict__.pop(name, None)
            else:
                setattr(self.target, name, old)

    def __deepcopy__(self, memo):
        # The module copies carry the changed attributes themselves; the record follows its target.
        import copy

        return _Conversion(self.mechanism, copy.deepcopy(self.target, memo), dict(self.attrs), self.recipe)


_MISSING = object()


def _set(target: nn.Module, values: dict) -> dict:
    old = {k: target.__dict__.get(k, _MISSING) for k in values}
    for k, v in values.items():
        object.__setattr__(target, k, v)
    return old


def _convert_one(module: nn.Module, parent: Optional[nn.Module], fqn: str, recipe: str, backend: str) -> _Conversion:
    from .integrations import torchtitan as tt
    from .integrations import transformers as hf

    if hf.is_transformers_experts(module):
        hf.experts_spec(module)  # unsupported experts fail here, with the reason
        attrs = {"forward": types.MethodType(hf.experts_forward, module), "_mxmoe_recipe": recipe,
                 "_mxmoe_backend": backend}
        return _Conversion("transformers", module, _set(module, attrs), recipe)
    try:
        spec = tt.experts_spec(module)
    except ValueError as e:
        raise ValueError(f"mxmoe.convert: module '{fqn}': {e}") from None
    if spec is not None:
        if tt.is_routed_experts(parent, module):  # torchtitan 0.3.x: RoutedExperts(token_dispatcher, inner_experts)
            if tt.known_dispatcher(parent.token_dispatcher):
                attrs = {"forward": types.MethodType(tt.routed_experts_forward, parent), "_mxmoe_recipe": recipe,
                         "_mxmoe_backend": backend}
                return _Conversion("torchtitan", parent, _set(parent, attrs), recipe)
            # Another dispatcher (DeepEP, HybridEP, ...): it stays; the experts' GEMMs run on mxmoe.
            return _Conversion("seam", module, _set(module, {"_grouped_mm": tt.grouped_mm_seam(recipe, backend)}),
                               recipe)
        if parent is not None and getattr(parent, "experts", None) is module:
            if hasattr(parent, "experts_fn"):  # the demo model's hook
                fn = tt.demo_experts_fn(recipe, backend)
                return _Conversion("demo", parent, _set(parent, {"experts_fn": fn}), recipe)
            if tt.is_torchtitan_moe(parent):
                parent_fqn = fqn.rpartition(".")[0] or "<root>"
                try:
                    variant = tt.moe_variant(parent)
                except ValueError as e:
                    raise ValueError(f"mxmoe.convert: module '{parent_fqn}': {e}") from None
                attrs = {"forward": types.MethodType(tt.moe_forward, parent), "_mxmoe_recipe": recipe,
                         "_mxmoe_backend": backend, "_mxmoe_variant": variant}
                return _Conversion("torchtitan", parent, _set(parent, attrs), recipe)
        if hasattr(type(module), "_grouped_mm"):  # a GroupedExperts outside a known MoE: its GEMM seam
            return _Conversion("seam", module, _set(module, {"_grouped_mm": tt.grouped_mm_seam(recipe, backend)}),
                               recipe)
    fwd = _redirected_forward(module, recipe, backend)
    if fwd is None:
        raise ValueError(f"mxmoe.convert: module '{fqn}' ({type(module).__name__}) owns 3D weights but is neither a "
                         "transformers experts module, nor a TorchTitan MoE's experts, nor calls torch._grouped_mm "
                         "(or F.grouped_mm) from its forward; pass filter_fn to leave it out")
    return _Conversion("redirect", module, _set(module, {"forward": fwd}), recipe)


def convert(
    model: nn.Module,
    recipe: str = "mxfp8_rceil",
    filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
    backend: str = "auto",
    shared_experts: bool = False,
) -> nn.Module:
    """Switch the model's MoE experts over to mxmoe (the mechanism per module: the module docstring).

    Args:
      model: any nn.Module; it is modified in place (instance attributes only) and returned.
      recipe: an mxmoe recipe name (see mxmoe.recipes.RECIPES).
      filter_fn: ``filter_fn(module, fqn) -> bool`` picks the modules to convert; default: modules that
        directly own a 3D parameter (the expert weights).
      backend: 'auto', or an mxmoe.grouped_mm backend ('reference', 'emulated', 'sm90', ...): the
        redirected calls use it, and the fused layer then runs composed on it.
      shared_experts: also run the shared experts of every converted TorchTitan MoE (TorchTitan's dense
        SwiGLU FeedForward, module ``shared_experts``) on the fused layer, as one expert with every token
        routed to it (mechanism "dense"). Off by default: the shared experts stay as the model has them.
    Raises ValueError naming the module when a selected module fits no mechanism, or when its experts
    are not a computation the fused layer implements (transformers experts without a SwiGLU gate).
    """
    get_recipe(recipe)  # validate early
    from .backends import BACKENDS

    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend: expected 'auto' or one of {', '.join(sorted(BACKENDS))}, got {backend!r}")
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected an nn.Module, got {type(model).__name__}")
    filter_fn = filter_fn or _owns_3d_parameter
    recipe_name = get_recipe(recipe).name
    parents = {}
    for _, m in model.named_modules():
        for child in m.children():
            parents.setdefault(id(child), m)
    selected = [(fqn, m) for fqn, m in model.named_modules() if filter_fn(m, fqn)]
    if not isinstance(shared_experts, bool):
        raise ValueError(f"shared_experts: expected a bool, got {type(shared_experts).__name__}")
    for fqn, module in selected:
        old = module.__dict__.get(_ATTR)
        if old is not None:
            old.remove()
        conv = _convert_one(module, parents.get(id(module)), fqn, recipe_name, backend)
        object.__setattr__(module, _ATTR, conv)
    for fqn, module in model.named_modules():  # a shared FeedForward converted earlier: undone or redone
        conv = module.__dict__.get(_ATTR)
        if conv is not None and conv.mechanism == "dense":
            conv.remove()
            module.__dict__.pop(_ATTR, None)
    if shared_experts:
        _convert_shared_experts(model, parents, recipe_name, backend)
    return model


def _convert_shared_experts(model: nn.Module, parents: dict, recipe: str, backend: str) -> None:
    from .integrations import torchtitan as tt

    names = {id(m): fqn or "<root>" for fqn, m in model.named_modules()}
    moes = {}
    for m in model.modules():
        conv = m.__dict__.get(_ATTR)
        if conv is not None and conv.mechanism == "torchtitan":
            # the record's target: the MoE (reference variants) or its RoutedExperts (torchtitan 0.3)
            moe = conv.target if hasattr(conv.target, "router") else parents[id(conv.target)]
            moes[id(moe)] = (moe, names[id(moe)])
    if not moes:
        raise ValueError("shared_experts=True: the model has no TorchTitan MoE that convert() switched over")
    for moe, where in moes.values():
        shared = getattr(moe, "shared_experts", None)
        if shared is None:
            continue
        tt.check_dense_ffn(shared, f"module '{where}'.shared_experts")
        attrs = {"forward": types.MethodType(tt.dense_ffn_forward, shared), "_mxmoe_recipe": recipe,
                 "_mxmoe_backend": backend}
        object.__setattr__(shared, _ATTR, _Conversion("dense", shared, _set(shared, attrs), recipe))


def unconvert(model: nn.Module) -> nn.Module:
    """Remove what convert() added (the hooks); the model computes with torch._grouped_mm again."""
    for module in model.modules():
        conv = getattr(module, _ATTR, None)
        if conv is not None:
            conv.remove()
            module.__dict__.pop(_ATTR, None)
    return model


def is_converted(module: nn.Module) -> bool:
    return module.__dict__.get(_ATTR) is not None


def conversion_mechanism(module: nn.Module) -> Optional[str]:
    """How convert() switched this module over ("transformers", "torchtitan", "demo", "seam", "redirect", "dense"), or None."""
    conv = module.__dict__.get(_ATTR)
    return None if conv is None else conv.mechanism


def conversion_recipe(module: nn.Module) -> Optional[str]:
    """The recipe convert() gave this module, or None when it was not converted."""
    conv = module.__dict__.get(_ATTR)
    return None if conv is None else conv.recipe
