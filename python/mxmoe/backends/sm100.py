"""The Blackwell (sm100) backend: mxmoe's quantizers writing blocked scales + torch's MXFP8 grouped GEMM.

Blackwell has block-scaled MMA, so every recipe runs as a real MX GEMM: the core's fused quantizer
writes e4m3 data and the E8M0 scales directly in the blocked layout the tensor cores read, and
``torch._scaled_grouped_mm`` (float8_e4m3fn data, float8_e8m0fnu scales) computes forward, dgrad and
wgrad. The tile128 recipe takes the same path: its 1x128 / 128x128 encodings are valid MXFP8 tensors
(one byte per 32 elements, the coarse block's byte repeated, docs/design/mx-format.md), so no special case is needed.

torch._scaled_grouped_mm conventions for MXFP8 (CUDA: MSLK/FBGEMM mx8mx8bf16_grouped_mm or cuBLASLt;
checks in aten/src/ATen/native/cuda/GroupedBlas.cpp and torch/_meta_registrations.py):
  * mat_a row-major, mat_b column-major (its last two dims); output bf16 only, no bias.
  * 2D x 3D (groups along M: forward, dgrad): A (M, K), B (G, K, N) = W.transpose(-2, -1) of a
    contiguous (G, N, K). scale_a: 2-D, group g's (size_g, K/32) scales blocked on their own, starting
    at row sum_{h<g} roundup(size_h, 128) of a (>= M, roundup(K/32, 4)) buffer: mxmoe's GROUPS_M
    layout, bit for bit. scale_b: (G, roundup(N, 128) * roundup(K/32, 4)), each expert's (N, K/32)
    scales blocked: mxmoe's PER_EXPERT layout. Output rows past offs[-1] are left unwritten.
  * 2D x 2D (groups along the contraction = tokens: wgrad): A (N, T) row-major, B (T, K) column-major,
    output (G, N, K). Group g's scales are the (rows, size_g/32) matrix blocked on its own at flat
    offset roundup(rows, 128) * sum_{h<g} roundup(size_h/32, 4): mxmoe's GROUPS_K layout. The kernel
    reads size_g // 32 scale columns and needs size_g % 16 == 0 (TMA alignment), so token groups
    must start and end on multiples of 32 in the data (see _pad_tokens). Empty groups are skipped
    (their output is left unwritten).

MXFP8 _scaled_grouped_mm must never run on sm90: it does not raise there, it corrupts the CUDA
context (docs/design/overview.md, "What runs"). This backend's check_device (run by backends.resolve_backend
when it is asked for by name) and auto_on therefore check the compute capability first
(``require_sm100_device``, ``is_sm100``). It has no fused MoE layer (the layer runs composed on it).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _lib, ops
from ..recipes import Recipe
from . import Backend, register_backend
from .common import cast, clamp_offsets, hp_wgrad, row_groups

Q, QT, SB = ops.FUSED_Q, ops.FUSED_QT, ops.FUSED_SCALE_BLOCKED
BF16 = torch.bfloat16
E4M3 = torch.float8_e4m3fn

# The MXFP8 grouped GEMM this backend calls, through a module attribute so the CPU tests can put an
# emulator of its documented semantics in its place (there is no Blackwell GPU in CI).
scaled_grouped_mm = getattr(torch, "_scaled_grouped_mm", None)


def is_sm100(device: torch.device) -> bool:
    """A CUDA device of compute capability 10.x with torch's MXFP8 grouped GEMM available."""
    return (
        device.type == "cuda"
        and hasattr(torch, "_scaled_grouped_mm")
        and torch.cuda.get_device_capability(device)[0] == 10
    )


def require_sm100_device(device: torch.device) -> None:
    """Raise ValueError unless `device` can run this backend (called by resolve_backend('sm100'))."""
    if is_sm100(device):
        return
    if device.type != "cuda":
        got = f"a {device.type} device"
    elif not hasattr(torch, "_scaled_grouped_mm"):
        got = f"torch {torch.__version__} without torch._scaled_grouped_mm"
    else:
        got = f"compute capability {tuple(torch.cuda.get_device_capability(device))} on {device}"
    raise ValueError(
        "backend: 'sm100' needs a CUDA device of compute capability (10, x) (Blackwell) and "
        f"torch._scaled_grouped_mm, got {got}. Use backend='auto' (sm90 on Hopper, emulated elsewhere)."
    )


def _round_up(x, n):
    return (x + n - 1) // n * n


# ---- the three GEMMs --------------------------------------------------------------------------------


def _mm_rows(a_q: Tensor, a_blocked: Tensor, b_q: Tensor, b_blocked: Tensor, ends: Tensor) -> Tensor:
    """2D x 3D: out (M, N) bf16 = A (M, K) . B[g] (N, K)^T per row group (rows past the groups 0).
    a_blocked: GROUPS_M scales of A; b_q (G, N, K) contiguous, so its transpose is the column-major
    (G, K, N) operand torch wants; b_blocked: PER_EXPERT scales of b_q (one (N, K/32) per expert)."""
    k = a_q.shape[1]
    out = scaled_grouped_mm(
        a_q,
        b_q.transpose(-2, -1),
        a_blocked.view(-1, _round_up(k // 32, 4)),  # M + 128 G rows (torch checks >= M)
        b_blocked.view(b_q.shape[0], -1),
        offs=ends,
        out_dtype=BF16,
    )
    ops.zero_rows_past_groups(out, ends)  # torch leaves them unwritten; mxmoe's contract says 0
    return out


def _pad_tokens(qt: Tensor, dest: Tensor, t_pad) -> Tensor:
    """qt (X, T) e4m3 -> (X, t_pad) with token t at column dest[t] and zeros elsewhere.

    torch's k-grouped MXFP8 GEMM wants every token group to start on a multiple of 32 tokens
    (16-byte aligned TMA loads and size_g // 32 scale columns), mxmoe's groups have any size. Padding
    the FP8 data is the cheapest fix: one byte per element, once per operand, and the scales need no
    change at all, since mxmoe's grouped compact scales already give each group ceil(size_g/32)
    blocks whose last one treats the missing tokens as zeros - exactly the padded group's scales.
    """
    out = torch.zeros((qt.shape[0], t_pad), dtype=torch.uint8, device=qt.device)
    return out.index_copy_(1, dest, qt.view(torch.uint8)).view(E4M3)  # index_copy has no fp8 kernel


def _token_padding(ends: Tensor, t: int):
    """Where each of the t tokens goes once every group is padded to a multiple of 32 tokens (device
    ops only): (dest (t,) int64, padded group ends (G,) int32, non-empty groups (G,) bool, t_pad).
    Group g starts at 32 * sum_{h<g} ceil(size_h/32), i.e. at 32 x its first grouped-compact scale
    column; tokens past the last group follow it (they are zeros). t_pad = 32 * (ceil(t/32) + G) is
    a static upper bound (no host sync)."""
    g = ends.shape[0]
    ends64 = ends.long()
    starts = torch.cat([ends64.new_zeros(1), ends64[:-1]])
    blocks = (ends64 - starts + 31) // 32
    pad_ends = torch.cumsum(blocks, 0) * 32
    pad_starts = pad_ends - blocks * 32
    tokens = torch.arange(t, device=ends.device)
    gid = torch.searchsorted(ends64, tokens, right=True)  # G for tokens past the last group
    start_of = torch.cat([starts, ends64[-1:]])
    pad_start_of = torch.cat([pad_starts, pad_ends[-1:]])
    dest = tokens - start_of[gid] + pad_start_of[gid]
    return dest, pad_ends.to(torch.int32), blocks > 0, 32 * ((t + 31) // 32 + g)


def _mm_tokens(dy_qt: Tensor, dy_blocked: Tensor, a_qt: Tensor, a_blocked: Tensor, ends: Tensor) -> Tensor:
    """2D x 2D: dW (G, N, K) bf16, dW[g] = dY_g^T A_g over group g's tokens. dy_qt (N, T), a_qt (K, T):
    the columnwise quantizations (zeros outside every group); *_blocked: their GROUPS_K scales."""
    n, t = dy_qt.shape
    k = a_qt.shape[0]
    dest, pad_ends, nonempty, t_pad = _token_padding(ends, t)
    dw = scaled_grouped_mm(
        _pad_tokens(dy_qt, dest, t_pad),  # (N, T_pad) row-major
        _pad_tokens(a_qt, dest, t_pad).t(),  # (T_pad, K) column-major
        dy_blocked.view(_round_up(n, 128), -1),  # rows >= N, as torch checks
        a_blocked.view(_round_up(k, 128), -1),
        offs=pad_ends,
        out_dtype=BF16,
    )
    # Empty groups are skipped by the kernel (output unwritten); their weight grad is 0.
    return torch.where(nonempty.view(-1, 1, 1), dw, torch.zeros((), dtype=dw.dtype, device=dw.device))


def _finish(out: Tensor, bias, ends: Tensor, out_dtype) -> Tensor:
    """bias[g] on group g's rows (the GEMM has no bias with MXFP8), then out_dtype. torch's MXFP8
    grouped GEMM writes bf16 only, so fp32 outputs carry bf16 precision and a bias is added after
    that rounding (within one bf16 ulp of the exact result)."""
    if bias is None:
        return cast(out, out_dtype)
    rows = torch.cat([bias.float(), bias.new_zeros((1, bias.shape[1]), dtype=torch.float32)])
    return (out.float() + rows[row_groups(ends, out.shape[0])]).to(out_dtype)


# ---- the backend ------------------------------------------------------------------------------------


class Sm100Backend(Backend):
    """One fused read of A gives its forward operand (rowwise, GROUPS_M scales) and its wgrad operand
    (columnwise per group, GROUPS_K scales; kept for backward as FP8 instead of A); one read of W per
    step gives both orientations (PER_EXPERT scales each, the dgrad one kept); one read of dY gives
    the dgrad and wgrad operands."""

    name = "sm100"
    auto_priority = 10

    def auto_on(self, device: torch.device) -> bool:
        return is_sm100(device)

    def check_device(self, device: torch.device) -> None:
        require_sm100_device(device)  # never let the MXFP8 GEMM reach a non-Blackwell device

    def needs_input_for_backward(self, recipe: Recipe) -> bool:
        return recipe.wgrad_hp  # otherwise A's wgrad quantization is saved instead of A

    def forward(self, a, a_mx, w, offs, bias, recipe, out_dtype, need_dw=True):
        mode = recipe.mode
        m = a.shape[0] if a is not None else a_mx[0].shape[0]
        ends = clamp_offsets(offs, m)
        wgrad_block = recipe.wgrad_block or 32  # unused when wgrad runs unquantized
        want_a_col = need_dw and not recipe.wgrad_hp
        if a is None:
            # Pre-quantized A (along K): its scales go to the blocked layout; wgrad needs A along the
            # tokens, so it is dequantized (exact) and quantized columnwise once, here.
            a_q, a_s = a_mx
            a_blocked = ops.scales_to_blocked(a_s, _lib.BLOCKED_GROUPS_M, ends)
            a_col = None
            if want_a_col:
                a_hp = ops.dequantize(a_q, a_s, 1, None, BF16)
                _, a_col = ops.quantize_fused_sides(a_hp, ends, 32, wgrad_block, False, mode, 0, QT | SB)
        else:
            a_row, a_col = ops.quantize_fused_sides(a, ends, recipe.a_block, wgrad_block, False, mode, Q | SB,
                                                    (QT | SB) if want_a_col else 0)
            a_q, a_blocked = a_row["q"], a_row["scale_blocked"]
        if recipe.w_tile128:
            w_row, w_col = ops.quantize_fused_sides(w, None, 128, 128, True, mode, Q | SB, QT | SB)
        else:  # 1x32 along K (forward), 32x1 along N (dgrad)
            w_row, w_col = ops.quantize_fused_sides(w, None, 32, 32, False, mode, Q | SB, QT | SB)
        # Forward: B[g] = W[g] (N, K) along K. Saved: W along N as qt (G, K, N), the dgrad operand, and
        # A along the tokens (FP8, half of A's bytes), the wgrad operand.
        out = _mm_rows(a_q, a_blocked, w_row["q"], w_row["scale_blocked"], ends)
        out = _finish(out, bias, ends, out_dtype)
        saved = (w_col["qt"], w_col["scale_blocked"],
                 a_col["qt"] if want_a_col else None, a_col["scale_blocked"] if want_a_col else None)
        return out, saved

    def backward(self, dy, a, a_mx, w, saved, offs, recipe, need_da, need_dw, a_dtype, w_dtype):
        w_qt, w_blocked, a_qt, a_blocked = saved
        ends = clamp_offsets(offs, dy.shape[0])
        fp8_wgrad = need_dw and not recipe.wgrad_hp
        dy_row = dy_col = None
        if need_da or fp8_wgrad:
            dy_row, dy_col = ops.quantize_fused_sides(dy, ends, recipe.dy_block, recipe.wgrad_block or 32, False,
                                                      recipe.mode, (Q | SB) if need_da else 0,
                                                      (QT | SB) if fp8_wgrad else 0)
        da = dw = None
        if need_da:
            # dA = dY W_g: B[g] = W[g]^T (K, N) along N, i.e. w_qt.
            da = cast(_mm_rows(dy_row["q"], dy_row["scale_blocked"], w_qt, w_blocked, ends), a_dtype)
        if need_dw:
            if recipe.wgrad_hp:
                if a is None:
                    a = ops.dequantize(a_mx[0], a_mx[1], 1, None, BF16)
                dw = hp_wgrad(dy, a, offs, w_dtype)
            else:
                dw = cast(_mm_tokens(dy_col["qt"], dy_col["scale_blocked"], a_qt, a_blocked, ends), w_dtype)
        return da, dw


register_backend(Sm100Backend())
