"""``torch.ops.mxmoe.*``: every core operation as a ``torch.library`` custom op.

Each op's real implementation allocates its outputs with torch (so the caching allocator and CUDA
graphs see every byte) and calls the core through ctypes (mxmoe/_lib.py) on the current stream. The
core validates every argument once and its message names the argument; a bad call raises ValueError
(invalid argument) or NotImplementedError (this build/device cannot serve it).

Each op also has a fake (meta) implementation for torch.compile / FakeTensor tracing. Fakes compute
output shapes from the input shapes only, with the static upper bounds of the C API (grouped scale
capacity ceil(M/32) + G, blocked sizes of ``mxmoe_blocked_size``), never branching on or ``int()``-ing
a symbolic size and never reading tensor data, so ``dynamic=True`` compiles without host syncs.

Ops (schemas are inferred from the type hints below):
  quantize(x, offs?, block_r, block_c, mode, want_q, want_qt, want_scale_c, want_scale_r)
      -> (q, qt, scale_c, scale_r); outputs not asked for come back as empty (0,) tensors.
  dequantize(q, scale, axis, offs?, out_dtype) -> out
  scales_to_blocked(scale, kind, offs?) -> blocked (1-D)
  scales_from_blocked(blocked, kind, offs?, scale_shape) -> scale
  grouped_mm_mx(a, a_scale, b, b_scale, offs, bias?, out_dtype) -> out (M, N)
  grouped_mm_mx_kgroups(a, a_scale, b, b_scale, offs, out_dtype) -> out (G, N, K)
  check_offsets(offs, m) -> ()   (checked mode: syncs, raises ValueError on bad offsets)
  quantize_fused(x, offs?, row_block, col_block, tile128, mode, row_outputs, col_outputs, dq_dtype)
      -> 12 tensors: one read of x, rowwise and/or columnwise MX operands, blocked scales, MX round trip
  zero_rows_past_groups(x!, offs) -> ()   zero x's rows past the last group's end (in place)
  grouped_mm_tile128(a, a_scale, b, b_scale, offs, bias?, out_dtype) -> out (M, N)
  grouped_mm_tile128_kgroups(a, a_scale, b, b_scale, offs, out_dtype) -> out (G, N, K)
      the tile128 recipe's GEMMs (Hopper FP8 tensor cores on sm90; exact CPU reference on the host)
See include/mxmoe/mxmoe.h for the layouts (grouped compact scales, scale_c / scale_r, q / qt).
"""
from __future__ import annotations

import ctypes
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _lib

E4M3 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
BLOCK = _lib.BLOCK

__all__ = [
    "quantize",
    "dequantize",
    "scales_to_blocked",
    "scales_from_blocked",
    "grouped_mm_mx",
    "grouped_mm_mx_kgroups",
    "check_offsets",
    "quantize_fused",
    "grouped_mm_tile128",
    "grouped_mm_tile128_kgroups",
    "zero_rows_past_groups",
    "grouped_scale_capacity",
    "blocked_size",
]


# ---- eager fast path -----------------------------------------------------------------------------


def _plain(x) -> bool:
    """A value the op's Python implementation can take directly: no tensor, or a plain host/CUDA tensor
    (no FakeTensor / FunctionalTensor / other subclass, no functorch wrapper)."""
    if not isinstance(x, Tensor):
        return True
    return type(x) is Tensor and not _is_functorch_wrapped(x)


_is_functorch_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)


def call(op, *args):
    """Run a mxmoe custom op. In plain eager mode (real tensors, no torch.compile tracing, no Python
    dispatch mode) the op's implementation is called directly: the dispatcher round trip of a Python
    custom op costs ~50 us of host time per call, which is what bounds small training steps on the GPU
    (docs/perf/e2e.md, host overhead). Anything traced or wrapped goes through ``torch.ops.mxmoe.*`` as
    usual (fakes, functionalization, compile), so the two paths run the same code on real tensors."""
    impl = getattr(op, "_init_fn", None)
    if (impl is not None and not torch.compiler.is_compiling() and _dispatch_mode() is None
            and all(_plain(a) for a in args)):
        return impl(*args)
    return op(*args)


def _dispatch_mode():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


# ---- shape rules shared by the real and the fake implementations (SymInt-safe arithmetic) ----------


def _cdiv(a, b):
    return (a + b - 1) // b


def _round_up(a, b):
    return _cdiv(a, b) * b


def grouped_scale_capacity(m, g):
    """Length of a grouped compact scale axis for m rows in g groups: ceil(m/32) + g (upper bound)."""
    return _cdiv(m, BLOCK) + g


def blocked_size(kind: int, h, w, g):
    """Bytes of a blocked scale buffer, as ``mxmoe_blocked_size`` (works on SymInts)."""
    if kind == _lib.BLOCKED_WHOLE:
        return _round_up(h, 128) * _round_up(w, 4)
    if kind == _lib.BLOCKED_GROUPS_M:
        return (h + 128 * g) * _round_up(w, 4)
    if kind == _lib.BLOCKED_GROUPS_K:
        return _round_up(h, 128) * (_cdiv(w, BLOCK) + 4 * g)
    if kind == _lib.BLOCKED_PER_EXPERT:
        return g * _round_up(h, 128) * _round_up(w, 4)
    raise ValueError(f"kind: expected WHOLE (0), GROUPS_M (1), GROUPS_K (2) or PER_EXPERT (3), got {kind}")


def _blocked_size_of_scale(scale: Tensor, kind: int, offs: Optional[Tensor]):
    g = offs.shape[0] if offs is not None else 0
    if kind == _lib.BLOCKED_PER_EXPERT:
        if scale.dim() != 3:
            raise ValueError(f"scale: expected 3 dims (G, R, C) for PER_EXPERT, got shape {tuple(scale.shape)}")
        return blocked_size(kind, scale.shape[1], scale.shape[2], scale.shape[0])
    if scale.dim() != 2:
        raise ValueError(f"scale: expected 2 dims, got shape {tuple(scale.shape)}")
    if kind == _lib.BLOCKED_GROUPS_K:
        # scale (R, ceil(M/32) + G): the tokens are (columns - G) * 32, which gives the same bound.
        return _round_up(scale.shape[0], 128) * (scale.shape[1] - g + 4 * g)
    return blocked_size(kind, scale.shape[0], scale.shape[1], g)


def _quantize_shapes(x: Tensor, offs: Optional[Tensor]):
    if x.dim() not in (2, 3):
        raise ValueError(f"x: expected 2 or 3 dims, got shape {tuple(x.shape)}")
    lead = tuple(x.shape[:-2])
    r, c = x.shape[-2], x.shape[-1]
    n_r = grouped_scale_capacity(r, offs.shape[0]) if offs is not None else r // BLOCK
    return (lead + (r, c), lead + (c, r), lead + (r, c // BLOCK), lead + (c, n_r))


_QUANT_DTYPES = (E4M3, E4M3, E8M0, E8M0)


def _empty(shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)


# ---- quantize ---------------------------------------------------------------------------------------


@torch.library.custom_op("mxmoe::quantize", mutates_args=())
def quantize(
    x: Tensor,
    offs: Optional[Tensor],
    block_r: int,
    block_c: int,
    mode: int,
    want_q: bool,
    want_qt: bool,
    want_scale_c: bool,
    want_scale_r: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """MX-quantize x (2D/3D, bf16/f32) with block_r x block_c blocks (mxmoe_quantize)."""
    wants = (want_q, want_qt, want_scale_c, want_scale_r)
    outs = [
        _empty(s if w else (0,), d, x.device)
        for s, d, w in zip(_quantize_shapes(x, offs), _QUANT_DTYPES, wants)
    ]
    views = [_lib.view(o, n) if w else None for o, n, w in zip(outs, ("q", "qt", "scale_c", "scale_r"), wants)]
    _lib.check(
        _lib.lib().mxmoe_quantize(
            _lib.view(x, "x"), _lib.view(offs, "offs"), _lib.quant_config(block_r, block_c, mode),
            *views, _lib.stream_for(x),
        ),
        "quantize",
    )
    return tuple(outs)


@quantize.register_fake
def _(x, offs, block_r, block_c, mode, want_q, want_qt, want_scale_c, want_scale_r):
    wants = (want_q, want_qt, want_scale_c, want_scale_r)
    return tuple(
        x.new_empty(s if w else (0,), dtype=d)
        for s, d, w in zip(_quantize_shapes(x, offs), _QUANT_DTYPES, wants)
    )


# ---- dequantize -------------------------------------------------------------------------------------


@torch.library.custom_op("mxmoe::dequantize", mutates_args=())
def dequantize(q: Tensor, scale: Tensor, axis: int, offs: Optional[Tensor], out_dtype: torch.dtype) -> Tensor:
    """q * 2^(scale - 127) in out_dtype; axis 1: scale (.., R, nC), axis 0: scale (.., C, nR)."""
    out = _empty(q.shape, out_dtype, q.device)
    _lib.check(
        _lib.lib().mxmoe_dequantize(
            _lib.view(q, "q"), _lib.view(scale, "scale"), axis, _lib.view(offs, "offs"),
            _lib.view(out, "out"), _lib.stream_for(q),
        ),
        "dequantize",
    )
    return out


@dequantize.register_fake
def _(q, scale, axis, offs, out_dtype):
    return q.new_empty(q.shape, dtype=out_dtype)


# ---- blocked ("swizzled") scale layout -------------------------------------------------------------


@torch.library.custom_op("mxmoe::scales_to_blocked", mutates_args=())
def scales_to_blocked(scale: Tensor, kind: int, offs: Optional[Tensor]) -> Tensor:
    """Scale matrix -> 1-D blocked buffer of mxmoe_blocked_size bytes (padding zero)."""
    out = _empty((_blocked_size_of_scale(scale, kind, offs),), E8M0, scale.device)
    _lib.check(
        _lib.lib().mxmoe_scales_to_blocked(
            _lib.view(scale, "scale"), kind, _lib.view(offs, "offs"), _lib.view(out, "blocked"),
            _lib.stream_for(scale),
        ),
        "scales_to_blocked",
    )
    return out


@scales_to_blocked.register_fake
def _(scale, kind, offs):
    return scale.new_empty((_blocked_size_of_scale(scale, kind, offs),), dtype=E8M0)


@torch.library.custom_op("mxmoe::scales_from_blocked", mutates_args=())
def scales_from_blocked(blocked: Tensor, kind: int, offs: Optional[Tensor], scale_shape: Sequence[int]) -> Tensor:
    """The inverse of scales_to_blocked: scale_shape says which scale matrix to read back."""
    out = _empty(tuple(scale_shape), E8M0, blocked.device)
    _lib.check(
        _lib.lib().mxmoe_scales_from_blocked(
            _lib.view(blocked, "blocked"), kind, _lib.view(offs, "offs"), _lib.view(out, "scale"),
            _lib.stream_for(blocked),
        ),
        "scales_from_blocked",
    )
    return out


@scales_from_blocked.register_fake
def _(blocked, kind, offs, scale_shape):
    return blocked.new_empty(tuple(scale_shape), dtype=E8M0)


# ---- grouped GEMMs ----------------------------------------------------------------------------------


@torch.library.custom_op("mxmoe::grouped_mm_mx", mutates_args=())
def grouped_mm_mx(
    a: Tensor,
    a_scale: Tensor,
    b: Tensor,
    b_scale: Tensor,
    offs: Tensor,
    bias: Optional[Tensor],
    out_dtype: torch.dtype,
) -> Tensor:
    """out[m, n] = sum_k A[m, k] B[g(m), n, k] (+ bias[g(m), n]); rows past offs[-1] are 0."""
    out = _empty((a.shape[0], b.shape[1]), out_dtype, a.device)
    _lib.check(
        _lib.lib().mxmoe_grouped_mm_mx(
            _lib.view(a, "a"), _lib.view(a_scale, "a_scale"), _lib.view(b, "b"),
            _lib.view(b_scale, "b_scale"), _lib.view(offs, "offs"), _lib.view(bias, "bias"),
            _lib.view(out, "out"), _lib.stream_for(a),
        ),
        "grouped_mm_mx",
    )
    return out


def _rows_grouped_fake(a, a_scale, b, b_scale, offs, bias, out_dtype):
    """(M, N): the output of a grouped GEMM with groups of a's rows (grouped_mm_mx, grouped_mm_tile128)."""
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


grouped_mm_mx.register_fake(_rows_grouped_fake)


@torch.library.custom_op("mxmoe::grouped_mm_mx_kgroups", mutates_args=())
def grouped_mm_mx_kgroups(
    a: Tensor,
    a_scale: Tensor,
    b: Tensor,
    b_scale: Tensor,
    offs: Tensor,
    out_dtype: torch.dtype,
) -> Tensor:
    """wgrad: out[g, n, k] = sum_{m in group g} A[n, m] B[k, m]; scales grouped compact along M."""
    out = _empty((offs.shape[0], a.shape[0], b.shape[0]), out_dtype, a.device)
    _lib.check(
        _lib.lib().mxmoe_grouped_mm_mx_kgroups(
            _lib.view(a, "a"), _lib.view(a_scale, "a_scale"), _lib.view(b, "b"),
            _lib.view(b_scale, "b_scale"), _lib.view(offs, "offs"), _lib.view(out, "out"),
            _lib.stream_for(a),
        ),
        "grouped_mm_mx_kgroups",
    )
    return out


def _token_grouped_fake(a, a_scale, b, b_scale, offs, out_dtype):
    """(G, N, K): the output of a grouped GEMM with groups along the tokens (the *_kgroups ops)."""
    return a.new_empty((offs.shape[0], a.shape[0], b.shape[0]), dtype=out_dtype)


grouped_mm_mx_kgroups.register_fake(_token_grouped_fake)


# ---- checked mode -----------------------------------------------------------------------------------


@torch.library.custom_op("mxmoe::check_offsets", mutates_args=())
def check_offsets(offs: Tensor, m: int) -> None:
    """Raise ValueError unless offs is non-decreasing, >= 0 and <= m (syncs a device's stream)."""
    _lib.check(_lib.lib().mxmoe_check_offsets(_lib.view(offs, "offs"), m, _lib.stream_for(offs)), "check_offsets")


@check_offsets.register_fake
def _(offs, m):
    return None


# ---- fused quantization -----------------------------------------------------------------------------
# Output bits of one side of quantize_fused (row_outputs / col_outputs; 0 = side not wanted).
FUSED_Q, FUSED_QT, FUSED_SCALE, FUSED_SCALE_BLOCKED, FUSED_DQ, FUSED_DQT = 1, 2, 4, 8, 16, 32
_FUSED_NAMES = ("q", "qt", "scale", "scale_blocked", "dq", "dqt")


def _fused_side_shapes(x: Tensor, offs: Optional[Tensor], is_row: bool):
    """(shape, dtype-or-None for dq) of the six outputs of one side, as mxmoe_quantize_fused checks them."""
    lead = tuple(x.shape[:-2])
    r, c = x.shape[-2], x.shape[-1]
    g = offs.shape[0] if offs is not None else 0
    n_r = grouped_scale_capacity(r, g) if offs is not None else r // BLOCK
    sh, sw = (r, c // BLOCK) if is_row else (c, n_r)
    if x.dim() == 3:
        bsize = blocked_size(_lib.BLOCKED_PER_EXPERT, sh, sw, x.shape[0])
    elif offs is not None and is_row:
        bsize = blocked_size(_lib.BLOCKED_GROUPS_M, r, c // BLOCK, g)
    elif offs is not None:
        bsize = blocked_size(_lib.BLOCKED_GROUPS_K, c, r, g)
    else:
        bsize = blocked_size(_lib.BLOCKED_WHOLE, sh, sw, 0)
    return (lead + (r, c), lead + (c, r), lead + (sh, sw), (bsize,), lead + (r, c), lead + (c, r))


def _fused_outputs(x, offs, row_outputs, col_outputs, dq_dtype, new):
    outs = []
    for side_bits, is_row in ((row_outputs, True), (col_outputs, False)):
        shapes = _fused_side_shapes(x, offs, is_row) if x.dim() in (2, 3) else [(0,)] * 6
        for i, shape in enumerate(shapes):
            dtype = dq_dtype if i >= 4 else (E4M3 if i < 2 else E8M0)
            outs.append(new(shape if side_bits & (1 << i) else (0,), dtype))
    return outs


@torch.library.custom_op("mxmoe::quantize_fused", mutates_args=())
def quantize_fused(
    x: Tensor,
    offs: Optional[Tensor],
    row_block: int,
    col_block: int,
    tile128: bool,
    mode: int,
    row_outputs: int,
    col_outputs: int,
    dq_dtype: torch.dtype,
) -> List[Tensor]:
    """mxmoe_quantize_fused: one read of x gives a rowwise side (1 x row_block along C) and/or a
    columnwise side (col_block x 1 along R, per token group with offs), or with tile128 one 128x128
    quantization viewed by both. row_outputs / col_outputs are bit sets of FUSED_Q, FUSED_QT,
    FUSED_SCALE, FUSED_SCALE_BLOCKED, FUSED_DQ, FUSED_DQT (0: side not wanted). Returns 12 tensors,
    the row side's (q, qt, scale, scale_blocked, dq, dqt) then the column side's; outputs not asked
    for are empty (0,) tensors. dq/dqt (the MX round trip) have dq_dtype (bf16 or f32)."""
    if x.dim() not in (2, 3):
        raise ValueError(f"x: expected 2 or 3 dims, got shape {tuple(x.shape)}")
    outs = _fused_outputs(x, offs, row_outputs, col_outputs, dq_dtype, lambda s, d: _empty(s, d, x.device))
    keep, sides = [], []
    for k, bits in enumerate((row_outputs, col_outputs)):
        if not bits:
            sides.append(None)
            continue
        side = _lib.FusedSideC()
        for i, name in enumerate(_FUSED_NAMES):
            if bits & (1 << i):
                v = _lib.view_struct(outs[6 * k + i], ("row." if k == 0 else "col.") + name)
                keep.append(v)
                setattr(side, name, ctypes.pointer(v))
        keep.append(side)
        sides.append(ctypes.byref(side))
    cfg = _lib.FusedConfigC(row_block, col_block, 1 if tile128 else 0, mode)
    _lib.check(
        _lib.lib().mxmoe_quantize_fused(
            _lib.view(x, "x"), _lib.view(offs, "offs"), cfg, sides[0], sides[1], _lib.stream_for(x)
        ),
        "quantize_fused",
    )
    return outs


@quantize_fused.register_fake
def _(x, offs, row_block, col_block, tile128, mode, row_outputs, col_outputs, dq_dtype):
    return _fused_outputs(x, offs, row_outputs, col_outputs, dq_dtype, lambda s, d: x.new_empty(s, dtype=d))


def quantize_fused_sides(x: Tensor, offs: Optional[Tensor], row_block: int, col_block: int, tile128: bool,
                         mode: int, row_outputs: int, col_outputs: int, dq_dtype: torch.dtype = torch.bfloat16):
    """quantize_fused (through ``call``) on a contiguous x, as (row side, column side): each a dict
    q / qt / scale / scale_blocked / dq / dqt -> tensor (the ones not asked for are empty)."""
    outs = call(quantize_fused, x.contiguous(), offs, row_block, col_block, tile128, mode, row_outputs,
                col_outputs, dq_dtype)
    return dict(zip(_FUSED_NAMES, outs[:6])), dict(zip(_FUSED_NAMES, outs[6:]))


# ---- private: torch._grouped_mm in fp32 behind an op boundary ---------------------------------------
# torch._grouped_mm computes fp32 on CPU in eager mode, but its fake (meta) kernel insists on bf16
# operands, so tracing an fp32 call under torch.compile fails. The emulated backend computes on CPU
# in fp32 (see backends.compute_dtype), so it calls torch._grouped_mm through this op, whose fake
# only states the output shape. Not part of the public op set. Being opaque also keeps Inductor from
# replacing torch._grouped_mm with its own grouped-GEMM template inside mxmoe's graphs.


@torch.library.custom_op("mxmoe::_dense_grouped_mm", mutates_args=())
def _dense_grouped_mm(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """torch._grouped_mm(a, b, offs=offs): 2D x 3D -> (M, N), rows past offs[-1] zeroed (torch leaves
    them unwritten); 2D x 2D (k-grouped) -> (G, M, N). offs must be valid (the caller clamps it)."""
    out = torch._grouped_mm(a, b, offs=offs)
    if b.dim() == 3 and offs.numel() > 0:
        # A core kernel that touches only those rows (offs read on its device: no host sync).
        _lib.check(
            _lib.lib().mxmoe_zero_rows_past_groups(_lib.view(out, "out"), _lib.view(offs, "offs"), _lib.stream_for(out)),
            "_dense_grouped_mm",
        )
    return out


@_dense_grouped_mm.register_fake
def _(a, b, offs):
    if b.dim() == 3:
        return a.new_empty((a.shape[0], b.shape[2]))
    return a.new_empty((offs.shape[0], a.shape[0], b.shape[1]))


# check_offsets returns nothing; without this mark, graph dead-code elimination (AOTAutograd,
# Inductor) would drop it from compiled graphs and checked mode would silently do nothing.
torch.fx.node.has_side_effect(torch.ops.mxmoe.check_offsets.default)


# ---- tile128 grouped GEMMs (Hopper FP8 tensor cores; the exact CPU reference on the host) ------------


def _workspace(size_fn: str, m, n, k, g, device: torch.device) -> Tensor:
    """Scratch for the GEMM's device-built group descriptors and fp32 scales. Its size depends only on
    the shapes (never on offs), so it is allocated by torch without a host sync."""
    ordinal = device.index if device.type == "cuda" else -1
    if ordinal is None:
        ordinal = torch.cuda.current_device()
    size = getattr(_lib.lib(), size_fn)(m, n, k, g, ordinal)
    if size < 0:  # the device cannot run the kernel (not Hopper, or a build without CUTLASS)
        raise NotImplementedError(f"mxmoe.{size_fn}: {_lib.last_error()}")
    return torch.empty((_cdiv(size, 4),), dtype=torch.int32, device=device)


@torch.library.custom_op("mxmoe::grouped_mm_tile128", mutates_args=())
def grouped_mm_tile128(
    a: Tensor,
    a_scale: Tensor,
    b: Tensor,
    b_scale: Tensor,
    offs: Tensor,
    bias: Optional[Tensor],
    out_dtype: torch.dtype,
) -> Tensor:
    """out (M, N) = A (M, K) . B[g] (N, K)^T per row group (+ bias), A in 1x128 blocks along K, B in
    128x128 tiles (coarse-encoded E8M0 scales, one byte per 32); rows past offs[-1] are 0."""
    out = _empty((a.shape[0], b.shape[1]), out_dtype, a.device)
    ws = _workspace("mxmoe_grouped_mm_tile128_workspace_size", a.shape[0], b.shape[1], a.shape[1], b.shape[0], a.device)
    _lib.check(
        _lib.lib().mxmoe_grouped_mm_tile128(
            _lib.view(a, "a"), _lib.view(a_scale, "a_scale"), _lib.view(b, "b"),
            _lib.view(b_scale, "b_scale"), _lib.view(offs, "offs"), _lib.view(bias, "bias"),
            _lib.view(out, "out"), _lib.view(ws, "workspace"), _lib.stream_for(a),
        ),
        "grouped_mm_tile128",
    )
    return out


grouped_mm_tile128.register_fake(_rows_grouped_fake)


@torch.library.custom_op("mxmoe::grouped_mm_tile128_kgroups", mutates_args=())
def grouped_mm_tile128_kgroups(
    a: Tensor,
    a_scale: Tensor,
    b: Tensor,
    b_scale: Tensor,
    offs: Tensor,
    out_dtype: torch.dtype,
) -> Tensor:
    """wgrad: out[g] (N, K) = A (N, M)[:, group g] . B (K, M)[:, group g]^T, 1x128 blocks along the
    tokens of each group (grouped compact scales); empty groups give 0."""
    g = offs.shape[0]
    out = _empty((g, a.shape[0], b.shape[0]), out_dtype, a.device)
    ws = _workspace("mxmoe_grouped_mm_tile128_kgroups_workspace_size", a.shape[1], a.shape[0], b.shape[0], g, a.device)
    _lib.check(
        _lib.lib().mxmoe_grouped_mm_tile128_kgroups(
            _lib.view(a, "a"), _lib.view(a_scale, "a_scale"), _lib.view(b, "b"),
            _lib.view(b_scale, "b_scale"), _lib.view(offs, "offs"), _lib.view(out, "out"),
            _lib.view(ws, "workspace"), _lib.stream_for(a),
        ),
        "grouped_mm_tile128_kgroups",
    )
    return out


grouped_mm_tile128_kgroups.register_fake(_token_grouped_fake)


@torch.library.custom_op("mxmoe::zero_rows_past_groups", mutates_args=("x",))
def zero_rows_past_groups(x: Tensor, offs: Tensor) -> None:
    """In place: rows of x (M, N) past the last group's end become 0 (work only on those rows).
    For GEMM outputs that leave them unwritten, e.g. torch._grouped_mm's."""
    _lib.check(
        _lib.lib().mxmoe_zero_rows_past_groups(_lib.view(x, "x"), _lib.view(offs, "offs"), _lib.stream_for(x)),
        "zero_rows_past_groups",
    )


@zero_rows_past_groups.register_fake
def _(x, offs):
    return None
