"""Training recipes: which MX blocks each operand of each grouped GEMM is quantized with.

Notation (docs/design/mx-format.md): A activations (M, K), W expert weights (G, N, K) (the user
passes B_t = W.transpose(-2, -1)), dY output grad (M, N), offs int32 cumulative group ends.

| recipe                     | forward A / W            | dgrad dY / W             | wgrad dY, A (along M, per group) |
|----------------------------|--------------------------|--------------------------|----------------------------------|
| mxfp8_rceil, mxfp8_floor   | 1x32 along K / 1x32 along K | 1x32 along N / 32x1 on W (along N) | 32x1                  |
| mxfp8_rceil_wgrad_with_hp  | as mxfp8_rceil           | as mxfp8_rceil           | none: unquantized (bf16) GEMM    |
| mxfp8_rceil_tile128        | 1x128 along K / 128x128 tiles | 1x128 along N / the same 128x128 tiles | 128x1        |

For tile128 the weights are quantized once per step with 128x128 tiles, giving both orientations
(q + scale_c for the forward, qt + scale_r for dgrad). Every encoding is a valid MXFP8 tensor (one E8M0
byte per 32 elements; coarse blocks repeat their byte), so every GEMM is the same MX GEMM.
Wgrad blocks never cross a token-group boundary and the last block of a group may be partial, so token
groups of any size (empty, not multiples of 32) need no padding.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import _lib


@dataclass(frozen=True)
class Recipe:
    name: str
    mode: int  # mxmoe_scale_mode of every quantization
    a_block: int  # forward A: 1 x a_block along K
    dy_block: int  # dgrad dY: 1 x dy_block along N
    w_tile128: bool  # W in 128x128 tiles, quantized once for forward and dgrad (else 1x32 / 32x1)
    wgrad_block: int  # wgrad dY and A: wgrad_block x 1 along M per group; 0 = unquantized wgrad

    @property
    def wgrad_hp(self) -> bool:
        return self.wgrad_block == 0


RECIPES = {
    r.name: r
    for r in (
        Recipe("mxfp8_rceil", _lib.SCALE_RCEIL, 32, 32, False, 32),
        Recipe("mxfp8_floor", _lib.SCALE_FLOOR, 32, 32, False, 32),
        Recipe("mxfp8_rceil_wgrad_with_hp", _lib.SCALE_RCEIL, 32, 32, False, 0),
        Recipe("mxfp8_rceil_tile128", _lib.SCALE_RCEIL, 128, 128, True, 128),
    )
}


def get_recipe(recipe) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    r = RECIPES.get(recipe)
    if r is None:
        raise ValueError(f"recipe: expected one of {', '.join(RECIPES)}, got {recipe!r}")
    return r
