"""The expert activation and the w13 layouts of the fused MoE layer (mxmoe/moe/__init__.py's docstring).

activation: "swiglu" (silu(g) * u), "gpt_oss" (gpt-oss's clamped variant: g = min(g, 7),
u = clamp(u, -7, 7), g * sigmoid(1.702 g) * (u + 1)) or a Swiglu(alpha, limit, up_offset).
layout: "concatenated" (w13[:, :I] gate, w13[:, I:] up) or "interleaved" (gate rows even, up rows odd).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Swiglu", "ACTIVATIONS", "LAYOUTS", "resolve_activation", "resolve_layout"]


@dataclass(frozen=True)
class Swiglu:
    """act(g, u) = gc * sigmoid(alpha * gc) * (uc + up_offset), gc = min(g, limit), uc = clamp(u, +-limit)."""

    alpha: float = 1.0
    limit: float = math.inf
    up_offset: float = 0.0


ACTIVATIONS = {"swiglu": Swiglu(), "gpt_oss": Swiglu(1.702, 7.0, 1.0)}
LAYOUTS = {"concatenated": 0, "interleaved": 1}


def resolve_activation(activation) -> Swiglu:
    if isinstance(activation, Swiglu):
        return activation
    act = ACTIVATIONS.get(activation) if isinstance(activation, str) else None
    if act is None:
        raise ValueError(f"activation: expected one of {', '.join(map(repr, ACTIVATIONS))} or a mxmoe.moe.Swiglu, "
                         f"got {activation!r}")
    return act


def resolve_layout(layout) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    return LAYOUTS[layout]
