"""``torch.ops.mxmoe.*``: the core's operations as torch ops, registered from C++ (src/ops/).

The C++ op layer allocates outputs with torch (so the caching allocator and CUDA graphs see every
byte), lets the core validate every argument once (its message names the argument) and launches on
torch's current stream; no Python runs inside an op. This module
  * loads the op library (mxmoe/_lib.py);
  * registers each op's fake (meta) implementation for torch.compile / FakeTensor tracing: output
    shapes from input shapes only, with the C API's static upper bounds (grouped scale capacity
    ceil(M/32) + G, blocked sizes of ``mxmoe_blocked_size``), never branching on or ``int()``-ing a
    symbolic size and never reading tensor data, so ``dynamic=True`` compiles without host syncs;
  * exposes one Python function per op (``ops.quantize(...)`` = ``torch.ops.mxmoe.quantize``) that
    turns the op's error into the Python exception a user expects: an invalid argument raises
    ValueError, a request this build or device cannot serve NotImplementedError (torch itself shows
    every C++ error as RuntimeError).

Ops (schemas in src/ops/library.cpp):
  quantize(x, offs?, block_r, block_c, mode, want_q, want_qt, want_scale_c, want_scale_r)
      -> (q, qt, scale_c, scale_r); outputs not asked for come back as empty (0,) tensors.
  dequantize(q, scale, axis, offs?, out_dtype) -> out
  scales_to_blocked(scale, kind, offs?) -> blocked (1-D)
  scales_from_blocked(blocked, kind, offs?, scale_shape) -> scale
  grouped_mm_mx(a, a_scale, b, b_scale, offs, bias?, out_dtype) -> out (M, N)
  grouped_mm_mx_kgroups(a, a_scale, b, b_scale, offs, out_dtype) -> out (G, N, K)
  grouped_mm_tile128(a, a_scale, b, b_scale, offs, bias?, out_dtype) -> out (M, N)
  grouped_mm_tile128_kgroups(a, a_scale, b, b_scale, offs, out_dtype) -> out (G, N, K)
      the tile128 recipe's GEMMs (Hopper FP8 tensor cores on sm90; exact CPU reference on the host)
  quantize_fused(x, offs?, row_block, col_block, tile128, mode, row_outputs, col_outputs, dq_dtype)
      -> 12 tensors: one read of x, rowwise and/or columnwise MX operands, blocked scales, MX round trip
  sm90_tile128_weight / sm90_exact_weight   a weight's quantized forms (once per optimizer step)
  weight_forms_if(flag!, w, form, mode) -> forms   form 0 / 1: sm90_tile128_weight's / sm90_exact_weight's,
      recorded on a capturing stream under a conditional CUDA-graph node on flag (int32 on w's device):
      a replay recomputes them only when flag != 0, then zeroes it (mxmoe/weight_cache.py)
  capture_id(device) -> int   the CUDA-graph capture recorded on the device's current stream (0: none)
  sm90_tile128_forward / sm90_tile128_backward / sm90_exact_forward / sm90_exact_backward
      one whole forward or backward of a grouped_mm on Hopper in one op (see backends/sm90.py)
  check_offsets(offs, m) -> ()   (checked mode: syncs, raises ValueError on bad offsets)
  clamp_offsets(offs, m) -> ends  (min(m, max(0, offs[0..g])), on offs' device)
  zero_rows_past_groups(x!, offs) -> ()   zero x's rows past the last group's end (in place)
  dense_grouped_mm(a, b, offs) -> torch._grouped_mm behind an op boundary (op name _dense_grouped_mm)
  quantize_fused_source(src..., offs?, ...) -> quantize_fused of a computed input (the fused MoE
      layer's dispatch gather, SwiGLU, SwiGLU backward), never materialized
  moe_tile128_forward / moe_tile128_backward / moe_exact_forward / moe_exact_backward
      the sm90 phases with A (or dY) a computed input (mxmoe/moe/, backends/phases.py)
  moe_tile128_swiglu_forward / moe_tile128_dswiglu_dgrad / moe_tile128_up_wgrad
      the tile128 layer's up projection with SwiGLU in its epilogue (then GEMM2), its
      down-projection dgrad with dSwiGLU in its epilogue (dH's two FP8 forms and the routing
      weights' partials), and the up projection's wgrad on dH's columnwise form and dispatch(x)
      (moe_tile128_backward and moe_tile128_up_wgrad take the layer's aligned routing,
      phases.align_routing: their wgrads read every token group in place; on a GPU, where CUTLASS runs
      the wgrad, a group starting off a multiple of 16 rows gets NaN weight grads)
  moe_routing(topk_idx, num_experts) -> (offs (E,), perm (T*k,), inv (T, k)) int32: stable expert order
      of the router's choices (ids outside [0, E) dropped to the end); no host sync
  moe_gather(x, perm, k, row_scale?, out_dtype) -> x[perm // k] (* row_scale.flat[perm]) (T*k, H)
  moe_gather_mm_bf16(x, perm, k, w, w_kn, offs) -> x[perm // k] @ w[g]^T (w (G, N, K)) or @ w[g] (w_kn:
      (G, K, N)) per group of offs, (T*k, N) bf16, the rows read in the GEMM (no gathered copy; rows past
      the groups 0): the bf16 MoE layer's up projection and down-projection dgrad (sm_90a kernel; a
      reference on the CPU; moe_gather_mm_bf16_available(m, n, kdim, groups, t, fanout, w_kn, device))
  moe_kgather_mm_bf16(a, b, perm, k, gather_b, offs) -> (G, M, N) bf16: per group of offs, the sum over its
      routed rows r of a_r^T b_r, the rows of b (gather_b) or a read as x[perm // k] (no gathered copy):
      the bf16 layer's dW13 = dH^T dispatch(x) and dW2 = dispatch(dout)^T (w act(h)) (sm_90a kernel)
  moe_swiglu_mm_bf16(x, perm, k, w13, bias?, layout, alpha, limit, up_offset, offs) -> (h, act): the bf16
      layer's up projection h = x[perm // k] @ w13[g]^T (+ bias[g]) (M, 2I) with act = swiglu(h) (M, I)
      in its epilogue
  moe_dswiglu_mm_bf16(dout, perm, k, w2, h, row_scale?, layout, alpha, limit, up_offset, offs, want_act=False)
      -> (dh, tw_part, act): the bf16 layer's down-projection dgrad dY' = dout[perm // k] @ w2[g] (never
      stored) with dH = swiglu_backward(bf16(w * dY'), h) (M, 2I) bf16, the routing weights' per-128-column
      partials <dY', swiglu(h)> (M, ceil(I/128)) f32 and, want_act, act = swiglu(h) (M, I) bf16 (else (0, I))
      in its epilogue (either layout)
  moe_combine(y, inv, weights?, out_dtype) -> sum_j w[t, j] * y[inv[t, j]] (T, H), fp32, j in order
  moe_combine_weight_grad(dout, y, inv) -> dw (T, k) f32 = <dout[t], y[inv[t, j]]>
  moe_swiglu_weight_grad(dy, h, inv, layout, alpha, limit, up_offset) -> dw (T, k) f32
      = <dy[r], swiglu(h[r])>, r = inv[t, j]: the same gradient from the down projection's dgrad dy
      (N, I) (dout gathered without routing weights, times W2) and the saved pre-activation h (N, 2I)
      bf16, without the expert outputs (a down-projection bias term <dout[t], b2> is the caller's)
  moe_group_sum(x, offs) -> per-group row sums (G, C) f32 (bias gradients)
  swiglu(h, layout, alpha, limit, up_offset) -> y (N, I); swiglu_backward(dy, h, ...) -> dh (N, 2I)
      layout 0 [gate | up] halves, 1 interleaved (gpt-oss); see the SWIGLU_* constants below
  build_info() -> str   (parsed by mxmoe.build_info())
  sm90_gemm_config(kind, m, n, k, groups, out_bf16) -> str   the Hopper tile128 GEMM configuration of
      a shape (mxmoe.sm90_gemm_config: mxmoe_sm90_gemm_config's text)
See include/mxmoe/quantize.h for the layouts (grouped compact scales, scale_c / scale_r, q / qt).
"""
from __future__ import annotations

import re
from typing import Optional

import torch
from torch import Tensor

from . import _lib

_lib.load()  # registers the ops; the fakes below attach to them

E4M3 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
BF16 = torch.bfloat16
BLOCK = _lib.BLOCK

# Output bits of one side of quantize_fused (row_outputs / col_outputs; 0 = side not wanted).
FUSED_Q, FUSED_QT, FUSED_SCALE, FUSED_SCALE_BLOCKED, FUSED_DQ, FUSED_DQT = 1, 2, 4, 8, 16, 32
_FUSED_NAMES = ("q", "qt", "scale", "scale_blocked", "dq", "dqt")

__all__ = [
    "quantize", "dequantize", "scales_to_blocked", "scales_from_blocked", "grouped_mm_mx",
    "grouped_mm_mx_kgroups", "check_offsets", "clamp_offsets", "quantize_fused", "grouped_mm_tile128",
    "grouped_mm_tile128_kgroups", "zero_rows_past_groups", "sm90_tile128_weight", "sm90_tile128_forward", "sm90_exact_weight", "sm90_tile128_backward",
    "sm90_exact_forward", "sm90_exact_backward", "quantize_fused_source", "moe_tile128_forward",
    "moe_tile128_backward", "moe_tile128_dswiglu_dgrad", "moe_tile128_up_wgrad", "moe_tile128_swiglu_forward", "moe_exact_forward", "moe_exact_backward", "grouped_scale_capacity", "blocked_size", "quantize_fused_sides",
    "weight_forms_if", "capture_id", "sm90_gemm_config",
]

# ---- errors -----------------------------------------------------------------------------------------

_ERROR = re.compile(r"mxmoe\.(\w+) \((invalid argument|unsupported)\): ")


def _python_error(e: RuntimeError) -> Exception:
    """The op's C++ error as the exception Python code expects (same message, without the kind)."""
    text = str(e)
    m = _ERROR.search(text)
    if m is None:
        return e
    msg = text[m.start():].replace(m.group(0), f"mxmoe.{m.group(1)}: ", 1)
    return (ValueError if m.group(2) == "invalid argument" else NotImplementedError)(msg)


def _python_op(name: str):
    op = getattr(torch.ops.mxmoe, name).default

    def call(*args):
        try:
            return op(*args)
        except RuntimeError as e:
            raise _python_error(e) from None

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"torch.ops.mxmoe.{name} (errors as ValueError / NotImplementedError). Schema: {op._schema}"
    call.op = op
    return call


quantize = _python_op("quantize")
dequantize = _python_op("dequantize")
scales_to_blocked = _python_op("scales_to_blocked")
scales_from_blocked = _python_op("scales_from_blocked")
grouped_mm_mx = _python_op("grouped_mm_mx")
grouped_mm_mx_kgroups = _python_op("grouped_mm_mx_kgroups")
grouped_mm_tile128 = _python_op("grouped_mm_tile128")
grouped_mm_tile128_kgroups = _python_op("grouped_mm_tile128_kgroups")
check_offsets = _python_op("check_offsets")
clamp_offsets = _python_op("clamp_offsets")
zero_rows_past_groups = _python_op("zero_rows_past_groups")
quantize_fused = _python_op("quantize_fused")
sm90_tile128_weight = _python_op("sm90_tile128_weight")
sm90_tile128_forward = _python_op("sm90_tile128_forward")
sm90_tile128_backward = _python_op("sm90_tile128_backward")
sm90_exact_weight = _python_op("sm90_exact_weight")
weight_forms_if = _python_op("weight_forms_if")
capture_id = _python_op("capture_id")
sm90_exact_forward = _python_op("sm90_exact_forward")
sm90_exact_backward = _python_op("sm90_exact_backward")
_dense_grouped_mm = _python_op("_dense_grouped_mm")
dense_grouped_mm = _dense_grouped_mm  # the public name the backends and the layer use
quantize_fused_source = _python_op("quantize_fused_source")
moe_tile128_forward = _python_op("moe_tile128_forward")
moe_tile128_backward = _python_op("moe_tile128_backward")
moe_tile128_dswiglu_dgrad = _python_op("moe_tile128_dswiglu_dgrad")
moe_tile128_up_wgrad = _python_op("moe_tile128_up_wgrad")
moe_tile128_swiglu_forward = _python_op("moe_tile128_swiglu_forward")
moe_exact_forward = _python_op("moe_exact_forward")
moe_exact_backward = _python_op("moe_exact_backward")

# Computed inputs of quantize_fused_source and the moe_* phases (mxmoe_source_kind).
SOURCE_GATHER, SOURCE_SWIGLU, SOURCE_SWIGLU_BACKWARD = 1, 2, 3

_sm90_gemm_config = _python_op("sm90_gemm_config")
_GEMM_PASSES = {"forward": 0, "dgrad": 0, "wgrad": 1}  # mxmoe_gemm_pass: M-grouped, K-grouped


def sm90_gemm_config(pass_: str, m: int, n: int, k: int, groups: int, out_dtype: torch.dtype = BF16) -> str:
    """The configuration a tile128 grouped GEMM of this shape gets on Hopper: kernel (own or CUTLASS),
    tile, stages, producer, cluster, scheduler, with the MXMOE_* environment's overrides applied; the
    line MXMOE_PRINT_CONFIGS=1 prints per launch. Pure host logic (no GPU needed).

    pass_: "forward" or "dgrad" (grouped_mm_tile128: out (m, n) = a (m, k) . b[g] (n, k)^T, so dgrad's
    n and k are the model's K and N) or "wgrad" (grouped_mm_tile128_kgroups: out (g, n, k) over m
    tokens). out_dtype: torch.bfloat16 or torch.float32."""
    if pass_ not in _GEMM_PASSES:
        raise ValueError(f"mxmoe.sm90_gemm_config: pass_: expected one of {sorted(_GEMM_PASSES)}, got {pass_!r}")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"mxmoe.sm90_gemm_config: out_dtype: expected torch.bfloat16 or torch.float32, "
                         f"got {out_dtype}")
    return _sm90_gemm_config(_GEMM_PASSES[pass_], m, n, k, groups, out_dtype == torch.bfloat16)

# check_offsets returns nothing; without this mark, graph dead-code elimination (AOTAutograd,
# Inductor) would drop it from compiled graphs and checked mode would silently do nothing.
torch.fx.node.has_side_effect(torch.ops.mxmoe.check_offsets.default)


# ---- shape rules of the fakes (SymInt-safe arithmetic; the C++ op layer uses the same rules) -------


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


def _check_dims(x: Tensor, name: str):
    if x.dim() not in (2, 3):
        raise ValueError(f"{name}: expected 2 or 3 dims, got shape {tuple(x.shape)}")


def _quantize_shapes(x: Tensor, offs: Optional[Tensor]):
    _check_dims(x, "x")
    lead = tuple(x.shape[:-2])
    r, c = x.shape[-2], x.shape[-1]
    n_r = grouped_scale_capacity(r, offs.shape[0]) if offs is not None else r // BLOCK
    return (lead + (r, c), lead + (c, r), lead + (r, c // BLOCK), lead + (c, n_r))


def _fused_side_shapes(x: Tensor, offs: Optional[Tensor], is_row: bool):
    """Shapes of the six outputs of one side, as mxmoe_quantize_fused checks them."""
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


def _side(x, offs, is_row, bits, dq_dtype=BF16):
    """Fake outputs of one side (empty (0,) where not wanted)."""
    shapes = _fused_side_shapes(x, offs, is_row)
    return [
        x.new_empty(shape if bits & (1 << i) else (0,), dtype=dq_dtype if i >= 4 else (E4M3 if i < 2 else E8M0))
        for i, shape in enumerate(shapes)
    ]


# ---- fakes ------------------------------------------------------------------------------------------


def _fake(name):
    return torch.library.register_fake(f"mxmoe::{name}")


@_fake("quantize")
def _(x, offs, block_r, block_c, mode, want_q, want_qt, want_scale_c, want_scale_r):
    wants = (want_q, want_qt, want_scale_c, want_scale_r)
    return tuple(
        x.new_empty(s if w else (0,), dtype=d)
        for s, d, w in zip(_quantize_shapes(x, offs), (E4M3, E4M3, E8M0, E8M0), wants)
    )


@_fake("dequantize")
def _(q, scale, axis, offs, out_dtype):
    return q.new_empty(q.shape, dtype=out_dtype)


@_fake("scales_to_blocked")
def _(scale, kind, offs):
    return scale.new_empty((_blocked_size_of_scale(scale, kind, offs),), dtype=E8M0)


@_fake("scales_from_blocked")
def _(blocked, kind, offs, scale_shape):
    return blocked.new_empty(tuple(scale_shape), dtype=E8M0)


def _rows_grouped_fake(a, a_scale, b, b_scale, offs, bias, out_dtype):
    """(M, N): the output of a grouped GEMM with groups of a's rows."""
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _token_grouped_fake(a, a_scale, b, b_scale, offs, out_dtype):
    """(G, N, K): the output of a grouped GEMM with groups along the tokens (the *_kgroups ops)."""
    return a.new_empty((offs.shape[0], a.shape[0], b.shape[0]), dtype=out_dtype)


for _name in ("grouped_mm_mx", "grouped_mm_tile128"):
    _fake(_name)(_rows_grouped_fake)
for _name in ("grouped_mm_mx_kgroups", "grouped_mm_tile128_kgroups"):
    _fake(_name)(_token_grouped_fake)


@_fake("check_offsets")
def _(offs, m):
    return None


@_fake("clamp_offsets")
def _(offs, m):
    return offs.new_empty(offs.shape)


@_fake("zero_rows_past_groups")
def _(x, offs):
    return None


@_fake("_dense_grouped_mm")
def _(a, b, offs):
    if b.dim() == 3:
        return a.new_empty((a.shape[0], b.shape[2]))
    return a.new_empty((offs.shape[0], a.shape[0], b.shape[1]))


@_fake("quantize_fused")
def _(x, offs, row_block, col_block, tile128, mode, row_outputs, col_outputs, dq_dtype):
    _check_dims(x, "x")
    return _side(x, offs, True, row_outputs, dq_dtype) + _side(x, offs, False, col_outputs, dq_dtype)


@_fake("sm90_tile128_weight")
def _(w, mode):
    _check_dims(w, "w")
    row, col = _side(w, None, True, FUSED_Q | FUSED_SCALE), _side(w, None, False, FUSED_QT | FUSED_SCALE)
    return row[0], row[2], col[1], col[2]


@_fake("weight_forms_if")
def _(flag, w, form, mode):
    _check_dims(w, "w")
    if form == 0:
        row, col = _side(w, None, True, FUSED_Q | FUSED_SCALE), _side(w, None, False, FUSED_QT | FUSED_SCALE)
        return [row[0], row[2], col[1], col[2]]
    row, col = _side(w, None, True, FUSED_DQ), _side(w, None, False, FUSED_Q | FUSED_SCALE)
    return [row[4], col[0], col[2]]


@_fake("sm90_tile128_forward")
def _(a, w_q, w_scale, offs, bias, mode, out_dtype, want_a_col):
    _check_dims(a, "a")
    a_col = _side(a, offs, False, (FUSED_QT | FUSED_SCALE) if want_a_col else 0)
    return a.new_empty((a.shape[0], w_q.shape[-2]), dtype=out_dtype), a_col[1], a_col[2]


@_fake("sm90_tile128_backward")
def _(dy, w_qt, w_scale, a_qt, a_scale, offs, mode, need_da, need_dw, a_dtype, w_dtype):
    da = dy.new_empty((dy.shape[0], w_qt.shape[1]) if need_da else (0,), dtype=a_dtype)
    dw = dy.new_empty((offs.shape[0], dy.shape[1], a_qt.shape[0]) if need_dw else (0,), dtype=w_dtype)
    return da, dw


@_fake("sm90_exact_weight")
def _(w, mode):
    _check_dims(w, "w")
    row, col = _side(w, None, True, FUSED_DQ), _side(w, None, False, FUSED_Q | FUSED_SCALE)
    return row[4], col[0], col[2]


@_fake("sm90_exact_forward")
def _(a, w_dq, offs, mode, want_a_col):
    _check_dims(a, "a")
    a_col = _side(a, offs, False, (FUSED_Q | FUSED_SCALE) if want_a_col else 0)
    return a.new_empty((a.shape[0], w_dq.shape[-2]), dtype=BF16), a_col[0], a_col[2]


@_fake("sm90_exact_backward")
def _(dy, w_q, w_scale, a_q, a_scale, offs, mode, need_da, need_dw):
    da = dy.new_empty((dy.shape[0], w_q.shape[2]) if need_da else (0,), dtype=BF16)
    dw = dy.new_empty((offs.shape[0], dy.shape[1], a_q.shape[1]) if need_dw else (0,), dtype=BF16)
    return da, dw


def _source_shape(src_kind, src_a, perm):
    """The logical (R, C) of a computed input (mxmoe_quantize_fused_source)."""
    if src_a.dim() != 2:
        raise ValueError(f"src_a: expected 2 dims, got shape {tuple(src_a.shape)}")
    if src_kind == SOURCE_GATHER:
        return perm.shape[0], src_a.shape[1]
    if src_kind == SOURCE_SWIGLU:
        return src_a.shape[0], src_a.shape[1] // 2
    return src_a.shape[0], src_a.shape[1]


def _source_x(src_kind, src_a, perm):
    return src_a.new_empty(_source_shape(src_kind, src_a, perm))


@_fake("quantize_fused_source")
def _(src_kind, src_a, src_b, perm, row_scale, k, layout, alpha, limit, up_offset, offs, row_block, col_block,
      tile128, mode, row_outputs, col_outputs, dq_dtype):
    x = _source_x(src_kind, src_a, perm)
    return _side(x, offs, True, row_outputs, dq_dtype) + _side(x, offs, False, col_outputs, dq_dtype)


@_fake("moe_tile128_forward")
def _(src_kind, src_a, src_b, perm, row_scale, k, layout, alpha, limit, up_offset, w_q, w_scale, offs, bias, mode,
      out_dtype, want_a_col):
    a = _source_x(src_kind, src_a, perm)
    a_col = _side(a, offs, False, (FUSED_QT | FUSED_SCALE) if want_a_col else 0)
    return a.new_empty((a.shape[0], w_q.shape[-2]), dtype=out_dtype), a_col[1], a_col[2]


@_fake("moe_tile128_backward")
def _(src_kind, src_a, src_b, perm, row_scale, k, layout, alpha, limit, up_offset, w_qt, w_scale, a_qt, a_scale,
      offs, mode, need_da, need_dw, a_dtype, w_dtype):
    r, c = _source_shape(src_kind, src_a, perm)
    da = src_a.new_empty((r, w_qt.shape[1]) if need_da else (0,), dtype=a_dtype)
    dw = src_a.new_empty((offs.shape[0], c, a_qt.shape[0]) if need_dw else (0,), dtype=w_dtype)
    return da, dw


@_fake("moe_tile128_dswiglu_dgrad")
def _(dout, perm, k, row_scale, w2_qt, w2_scale, h, alpha, limit, up_offset, offs, mode):
    m, two_i = h.shape
    dh = h.new_empty((m, two_i), dtype=BF16)
    row, col = _side(dh, offs, True, FUSED_Q | FUSED_SCALE), _side(dh, offs, False, FUSED_QT | FUSED_SCALE)
    return row[0], row[2], col[1], col[2], h.new_empty((m, two_i // 256), dtype=torch.float32)


@_fake("moe_tile128_up_wgrad")
def _(dh_qt, dh_scale_t, x, perm, k, offs, mode, w_dtype):
    return x.new_empty((offs.shape[0], dh_qt.shape[0], x.shape[1]), dtype=w_dtype)


@_fake("moe_tile128_swiglu_forward")
def _(x, perm, k, w13_q, w13_scale, b13, layout, alpha, limit, up_offset, w2_q, w2_scale, offs, b2, mode, want_col):
    m, i = perm.shape[0], w13_q.shape[1] // 2
    y_col = _side(x.new_empty((m, i), dtype=BF16), offs, False, (FUSED_QT | FUSED_SCALE) if want_col else 0)
    return x.new_empty((m, 2 * i), dtype=BF16), x.new_empty((m, w2_q.shape[1]), dtype=BF16), y_col[1], y_col[2]


@_fake("moe_exact_forward")
def _(src_kind, src_a, src_b, perm, row_scale, k, layout, alpha, limit, up_offset, w_dq, offs, mode, want_a_col):
    a = _source_x(src_kind, src_a, perm)
    a_col = _side(a, offs, False, (FUSED_Q | FUSED_SCALE) if want_a_col else 0)
    return a.new_empty((a.shape[0], w_dq.shape[-2]), dtype=BF16), a_col[0], a_col[2]


@_fake("moe_exact_backward")
def _(src_kind, src_a, src_b, perm, row_scale, k, layout, alpha, limit, up_offset, w_q, w_scale, a_q, a_scale, offs,
      mode, need_da, need_dw):
    r, c = _source_shape(src_kind, src_a, perm)
    da = src_a.new_empty((r, w_q.shape[2]) if need_da else (0,), dtype=BF16)
    dw = src_a.new_empty((offs.shape[0], c, a_q.shape[1]) if need_dw else (0,), dtype=BF16)
    return da, dw


# ---- helpers ----------------------------------------------------------------------------------------


def quantize_fused_sides(x: Tensor, offs: Optional[Tensor], row_block: int, col_block: int, tile128: bool,
                         mode: int, row_outputs: int, col_outputs: int, dq_dtype: torch.dtype = BF16):
    """quantize_fused on a contiguous x, as (row side, column side): each a dict
    q / qt / scale / scale_blocked / dq / dqt -> tensor (the ones not asked for are empty)."""
    outs = quantize_fused(x.contiguous(), offs, row_block, col_block, tile128, mode, row_outputs, col_outputs,
                          dq_dtype)
    return dict(zip(_FUSED_NAMES, outs[:6])), dict(zip(_FUSED_NAMES, outs[6:]))


# ---- MoE kernel family (src/ops/ops_moe.cpp; semantics in include/mxmoe/moe.h) --------------------

SWIGLU_CONCAT, SWIGLU_INTERLEAVED = 0, 1
# (alpha, limit, up_offset) of the two common SwiGLU variants.
SWIGLU_STANDARD = (1.0, float("inf"), 0.0)  # silu(gate) * up (Qwen3-MoE, Mixtral, OLMoE, DeepSeek)
SWIGLU_GPT_OSS = (1.702, 7.0, 1.0)          # gpt-oss: clamped gate/up, sigmoid(1.702 g), (up + 1)

moe_routing = _python_op("moe_routing")
moe_gather = _python_op("moe_gather")
moe_combine = _python_op("moe_combine")
moe_gather_mm_bf16 = _python_op("moe_gather_mm_bf16")
moe_kgather_mm_bf16 = _python_op("moe_kgather_mm_bf16")
moe_dswiglu_mm_bf16 = _python_op("moe_dswiglu_mm_bf16")
moe_swiglu_mm_bf16 = _python_op("moe_swiglu_mm_bf16")
moe_combine_weight_grad = _python_op("moe_combine_weight_grad")
moe_swiglu_weight_grad = _python_op("moe_swiglu_weight_grad")
moe_group_sum = _python_op("moe_group_sum")
swiglu = _python_op("swiglu")
swiglu_backward = _python_op("swiglu_backward")

__all__ += [
    "moe_routing", "moe_gather", "moe_gather_mm_bf16", "moe_kgather_mm_bf16", "moe_swiglu_mm_bf16", "moe_dswiglu_mm_bf16",
    "moe_combine",
    "moe_combine_weight_grad",
    "moe_swiglu_weight_grad",
    "moe_group_sum", "swiglu", "swiglu_backward", "SWIGLU_CONCAT", "SWIGLU_INTERLEAVED", "SWIGLU_STANDARD",
    "SWIGLU_GPT_OSS",
]


def _dims(t: Tensor, name: str, n: int):
    if t.dim() != n:
        raise ValueError(f"{name}: expected {n} dims, got shape {tuple(t.shape)}")


@_fake("moe_routing")
def _(topk_idx, num_experts):
    _dims(topk_idx, "topk_idx", 2)
    t, k = topk_idx.shape
    i32 = torch.int32
    return (topk_idx.new_empty((num_experts,), dtype=i32), topk_idx.new_empty((t * k,), dtype=i32),
            topk_idx.new_empty((t, k), dtype=i32))


@_fake("moe_gather")
def _(x, perm, k, row_scale, out_dtype):
    _dims(x, "x", 2)
    _dims(perm, "perm", 1)
    return x.new_empty((perm.shape[0], x.shape[1]), dtype=out_dtype)


@_fake("moe_gather_mm_bf16")
def _(x, perm, k, w, w_kn, offs):
    _dims(x, "x", 2)
    _dims(perm, "perm", 1)
    _dims(w, "w", 3)
    return x.new_empty((perm.shape[0], w.shape[2] if w_kn else w.shape[1]), dtype=torch.bfloat16)


@_fake("moe_kgather_mm_bf16")
def _(a, b, perm, k, gather_b, offs):
    _dims(a, "a", 2)
    _dims(b, "b", 2)
    return a.new_empty((offs.shape[0], a.shape[1], b.shape[1]), dtype=torch.bfloat16)


@_fake("moe_swiglu_mm_bf16")
def _(x, perm, k, w13, bias, layout, alpha, limit, up_offset, offs):
    _dims(w13, "w13", 3)
    m, n = perm.shape[0], w13.shape[1]
    return x.new_empty((m, n), dtype=torch.bfloat16), x.new_empty((m, n // 2), dtype=torch.bfloat16)


@_fake("moe_dswiglu_mm_bf16")
def _(dout, perm, k, w2, h, row_scale, layout, alpha, limit, up_offset, offs, want_act=False):
    _dims(w2, "w2", 3)
    m, i = perm.shape[0], w2.shape[2]
    return (dout.new_empty((m, 2 * i), dtype=torch.bfloat16),
            dout.new_empty((m, (i + 127) // 128), dtype=torch.float32),
            dout.new_empty((m if want_act else 0, i), dtype=torch.bfloat16))


@_fake("moe_combine")
def _(y, inv, weights, out_dtype):
    _dims(y, "y", 2)
    _dims(inv, "inv", 2)
    return y.new_empty((inv.shape[0], y.shape[1]), dtype=out_dtype)


@_fake("moe_combine_weight_grad")
def _(dout, y, inv):
    _dims(inv, "inv", 2)
    return dout.new_empty((inv.shape[0], inv.shape[1]), dtype=torch.float32)


@_fake("moe_swiglu_weight_grad")
def _(dy, h, inv, layout, alpha, limit, up_offset):
    _dims(inv, "inv", 2)
    return dy.new_empty((inv.shape[0], inv.shape[1]), dtype=torch.float32)


@_fake("moe_group_sum")
def _(x, offs):
    _dims(x, "x", 2)
    _dims(offs, "offs", 1)
    return x.new_empty((offs.shape[0], x.shape[1]), dtype=torch.float32)


@_fake("swiglu")
def _(h, layout, alpha, limit, up_offset):
    _dims(h, "h", 2)
    return h.new_empty((h.shape[0], h.shape[1] // 2))


@_fake("swiglu_backward")
def _(dy, h, layout, alpha, limit, up_offset):
    return h.new_empty(h.shape)
