"""mxmoe.convert: run an existing MoE model's expert GEMMs through mxmoe without editing its code.

Target pattern (TorchTitan's GroupedExperts and similar): experts hold 3D weight parameters and call
``torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=offs)``. convert() adds a forward pre-hook and
a forward hook (always called, also on exceptions) to each matched module; between them a
TorchFunctionMode is active that redirects every ``torch._grouped_mm`` call whose B operand is 3D (and
A is 2D with offs given) to ``mxmoe.grouped_mm``. Everything else passes through untouched.

Parameters stay ordinary nn.Parameters holding plain tensors, so optimizers, state_dict, model.to(),
FSDP wrapping etc. are unchanged; unconvert() removes the hooks.

torch.compile: Dynamo only routes calls through a TorchFunctionMode for functions it considers
"overridable", a set built from torch.overrides that leaves out private names such as
torch._grouped_mm. convert() therefore adds torch._grouped_mm to Dynamo's set (a private cache,
torch._dynamo.variables.torch.get_overridable_functions; present in torch 2.11-2.13), so a compiled
model redirects exactly like an eager one (tested, fullgraph=True, forward and backward).
"""
from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .recipes import get_recipe

_ATTR = "_mxmoe_convert"


def _owns_3d_parameter(module: nn.Module, fqn: str) -> bool:
    return any(p.dim() == 3 for p in module.parameters(recurse=False))


class GroupedMMRedirect(TorchFunctionMode):
    """Redirects torch._grouped_mm(A 2D, B 3D, offs=...) to mxmoe.grouped_mm with a fixed recipe/backend."""

    def __init__(self, recipe: str, backend: str):
        super().__init__()
        self.recipe = recipe
        self.backend = backend

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch._grouped_mm:
            redirected = self._redirect(*args, **kwargs)
            if redirected is not None:
                return redirected
        return func(*args, **kwargs)

    def _redirect(self, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        if offs is None or mat_a.dim() != 2 or mat_b.dim() != 3:
            return None  # not the MoE expert pattern: leave it to torch
        from .grouped import grouped_mm

        return grouped_mm(
            mat_a,
            mat_b,
            offs,
            recipe=self.recipe,
            backend=self.backend,
            bias=bias,
            out_dtype=out_dtype if out_dtype is not None else mat_a.dtype,
        )


def _enable_dynamo_dispatch() -> None:
    """Let Dynamo trace torch._grouped_mm through TorchFunctionModes (see the module docstring)."""
    try:
        from torch._dynamo.variables import torch as dynamo_torch

        dynamo_torch.get_overridable_functions().add(torch._grouped_mm)
        if torch._grouped_mm not in dynamo_torch.get_overridable_functions():
            raise RuntimeError("the set is not cached in this torch version")
    except Exception as e:  # pragma: no cover - depends on torch internals
        warnings.warn(
            f"mxmoe.convert: could not register torch._grouped_mm with torch._dynamo ({e!r}); converted "
            "modules work in eager mode, but torch.compile may bypass the redirect",
            stacklevel=3,
        )


class _Conversion:
    """Per-module state: the mode instances pushed by the pre-hook (a stack, for re-entrant calls)."""

    def __init__(self, module: nn.Module, recipe: str, backend: str):
        self.recipe = recipe
        self.backend = backend
        self.active = []
        self.handles = [
            module.register_forward_pre_hook(self._enter),
            module.register_forward_hook(self._exit, always_call=True),
        ]

    def _enter(self, module, args):
        mode = GroupedMMRedirect(self.recipe, self.backend)
        mode.__enter__()
        self.active.append(mode)

    def _exit(self, module, args, output):
        self.active.pop().__exit__(None, None, None)

    def remove(self):
        for h in self.handles:
            h.remove()


def convert(
    model: nn.Module,
    recipe: str = "mxfp8_rceil",
    filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
    backend: str = "auto",
) -> nn.Module:
    """Make the model's MoE expert GEMMs (torch._grouped_mm on 3D weights) run through mxmoe.grouped_mm.

    Args:
      model: any nn.Module; it is modified in place (hooks only) and returned.
      recipe: an mxmoe recipe name (see mxmoe.recipes.RECIPES).
      filter_fn: ``filter_fn(module, fqn) -> bool`` picks the modules to convert; default: modules that
        directly own a 3D parameter (the expert weights).
      backend: mxmoe backend for the redirected calls ('auto', 'reference', 'emulated').
    Calls converting an already converted module replace its recipe/backend. Undo with unconvert().
    Only calls made while a converted module's forward runs are redirected, and only those with a 2D A,
    a 3D B and offs; the redirected call gets out_dtype = A's dtype unless the call passes one.
    """
    get_recipe(recipe)  # validate early
    from .backends import BACKENDS

    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend: expected 'auto' or one of {', '.join(sorted(BACKENDS))}, got {backend!r}")
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected an nn.Module, got {type(model).__name__}")
    filter_fn = filter_fn or _owns_3d_parameter
    _enable_dynamo_dispatch()
    for fqn, module in model.named_modules():
        if not filter_fn(module, fqn):
            continue
        old = getattr(module, _ATTR, None)
        if old is not None:
            old.remove()
        setattr(module, _ATTR, _Conversion(module, get_recipe(recipe).name, backend))
    return model


def unconvert(model: nn.Module) -> nn.Module:
    """Remove what convert() added (the hooks); the model computes with torch._grouped_mm again."""
    for module in model.modules():
        conv = getattr(module, _ATTR, None)
        if conv is not None:
            conv.remove()
            delattr(module, _ATTR)
    return model


def is_converted(module: nn.Module) -> bool:
    return getattr(module, _ATTR, None) is not None
