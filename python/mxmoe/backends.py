"""Backends: how the three grouped GEMMs of an MXFP8 MoE layer are computed.

Following torchao's refactor of its MXFP8 grouped-GEMM autograd function (seed 001), the split happens
once, up front: the autograd function (grouped.py) picks a backend and then only calls its
``forward`` / ``dgrad`` / ``wgrad``; each backend is one straight code path with no "emulated or not"
branches inside. A backend is a small object with those three methods, registered by name:

  reference  core CPU/CUDA kernels end to end: core quantize + mxmoe_grouped_mm_mx (forward, dgrad)
             + mxmoe_grouped_mm_mx_kgroups (wgrad). The exact MX GEMM (fp32 accumulation).
  emulated   core quantize + core dequantize + torch._grouped_mm on the dequantized values.
  sm90       (sm90.py) Hopper kernels.
  sm100      (sm100.py) core quantizers writing blocked scales + MXFP8 torch._scaled_grouped_mm.
  auto       reference on CPU; on CUDA sm90 on Hopper, sm100 on Blackwell (compute capability 10.x),
             emulated elsewhere. sm100 is gated by compute capability, also when asked for by name
             (docs/design/overview.md: MXFP8 _scaled_grouped_mm corrupts the CUDA context on sm90).

Both current backends share the quantization steps of the recipe (recipes.py) and differ only in the
two GEMM primitives, so they derive from ``QuantizeThenMM``. Everything numeric is the core's; the
Python here only decides which quantization feeds which GEMM. No host syncs: offs stays on the device.
"""
from __future__ import annotations

import functools
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from . import ops
from .recipes import Recipe

Pair = Tuple[Tensor, Tensor]  # (e4m3 data, e8m0 scale)


# ---- quantization steps (thin wrappers over torch.ops.mxmoe.quantize) --------------------------------


def _dense(x: Tensor) -> Tensor:
    # The core's CPU kernels take any strides (including expanded, stride-0 grads); its CUDA kernels
    # need contiguous inputs.
    return x if x.device.type == "cpu" else x.contiguous()


def quant_along_last(x: Tensor, block: int, mode: int) -> Pair:
    """1 x block blocks along the last dim of a 2D/3D x -> (q in x's shape, scale_c)."""
    q, _, s, _ = ops.quantize(_dense(x), None, 1, block, mode, True, False, True, False)
    return q, s


def quant_along_rows(x: Tensor, block: int, mode: int, offs: Optional[Tensor] = None) -> Pair:
    """block x 1 blocks along dim -2 (per token group with offs) -> (qt (.., C, R), scale_r (.., C, n))."""
    _, qt, _, s = ops.quantize(_dense(x), offs, block, 1, mode, False, True, False, True)
    return qt, s


def quant_tiles(w: Tensor, mode: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """128x128 tiles, both orientations from one pass: (q, scale_c, qt, scale_r)."""
    q, qt, sc, sr = ops.quantize(_dense(w), None, 128, 128, mode, True, True, True, True)
    return q, sc, qt, sr


# ---- device-side group bookkeeping (no host sync) ----------------------------------------------------


def clamp_offsets(offs: Tensor, m) -> Tensor:
    """The core's clamping rule, on the device: end_g = min(m, max(0, offs[0..g])) (bad offsets give
    empty groups, never out-of-bounds rows). One core kernel (torch.ops.mxmoe.clamp_offsets)."""
    return ops.clamp_offsets(offs, m)


def row_groups(offs: Tensor, m) -> Tensor:
    """Group index of each of the m rows (G for rows past offs[-1]), int64 on offs' device."""
    rows = torch.arange(m, device=offs.device, dtype=offs.dtype)
    return torch.searchsorted(clamp_offsets(offs, m), rows, right=True)


def group_sum(dy: Tensor, offs: Tensor, groups) -> Tensor:
    """(G, N) fp32 per-group sums of dy's rows (the bias grad); rows past offs[-1] are dropped."""
    gid = row_groups(offs, dy.shape[0])
    acc = dy.new_zeros((groups + 1, dy.shape[1]), dtype=torch.float32)
    return acc.index_add_(0, gid, dy.float())[:groups]


def compute_dtype(device: torch.device) -> torch.dtype:
    # GEMMs on dequantized MX values: every e4m3 x 2^e value is exact in bf16 and in fp32, so a GEMM
    # on them in either dtype (with fp32 accumulation) is the same exact reference for the MX GEMM.
    # On CPU fp32 is used because bf16 matmuls there are ~75x slower (measured: 11.4 s vs 0.15 s for
    # 8192x512 @ 8x512x1024); on GPUs bf16 is the fast path.
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def torch_grouped_mm(a: Tensor, b: Tensor, offs: Tensor, m) -> Tensor:
    """torch._grouped_mm on clamped offsets, fp32 result. m: rows (2D x 3D) or tokens (2D x 2D).
    For 2D x 3D, rows past offs[-1] (which torch leaves unwritten, even NaN) are zero, as in the core."""
    offs = clamp_offsets(offs, m)
    if a.dtype == torch.float32:
        return ops._dense_grouped_mm(a, b, offs)  # fp32 torch._grouped_mm, traceable (see ops.py)
    out = torch._grouped_mm(a, b, offs=offs).float()
    if b.dim() == 3:
        rows = torch.arange(out.shape[0], device=out.device).unsqueeze(1)
        out = torch.where(rows < offs[-1], out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """t as dtype, and t itself (no .to call at all) when it already is. Under torch.compile on
    torch 2.11, a no-op ``.to()`` on the tensor an autograd.Function returns makes Dynamo record the
    same tensor twice as a forward output and route the output's grad to the wrong slot: the
    backward then ran on zeros (pytorch/pytorch#180642; seen here as compiled != eager for the
    exact recipe on the H200)."""
    return t if t.dtype == dtype else t.to(dtype)


def hp_wgrad(dy: Tensor, a: Tensor, offs: Tensor, out_dtype: torch.dtype) -> Tensor:
    """Unquantized wgrad dW[g] = dY_g^T A_g (G, N, K) (recipe mxfp8_rceil_wgrad_with_hp)."""
    ct = compute_dtype(dy.device)
    # contiguous(): torch._grouped_mm rejects expanded (stride-0) operands such as the grad of a sum.
    dy_t = dy.to(ct).contiguous().t()
    out = torch_grouped_mm(dy_t, a.to(ct).contiguous(), offs, dy.shape[0])
    return cast(out, out_dtype)


# ---- backends ----------------------------------------------------------------------------------------


class Backend:
    """Interface. W is the (G, N, K) weight (B_t.transpose(-2, -1)); offs int32 (G,) group ends.

    forward(a, a_mx, w, offs, bias, recipe, out_dtype, need_dw) -> (out (M, N), saved):
        a: (M, K) bf16/f32 or None when a_mx = (q, scale_c) is a pre-quantized operand along K.
        saved: a tuple of tensors (entries may be None) the backend wants back in backward, e.g. the
        weight's dgrad orientation or A's wgrad quantization from the same pass over memory.
    needs_input_for_backward(recipe) -> whether the autograd must keep A (or its a_mx) for backward.
    backward(dy, a, a_mx, w, saved, offs, recipe, need_da, need_dw, a_dtype, w_dtype) -> (dA, dW):
        the default runs dgrad and wgrad separately:
    dgrad(dy, w, saved, offs, recipe, out_dtype) -> dA (M, K)
    wgrad(dy, a, offs, recipe, out_dtype) -> dW (G, N, K)   (a in high precision)
    """

    name = "base"

    def forward(self, a, a_mx, w, offs, bias, recipe: Recipe, out_dtype, need_dw=True):
        raise NotImplementedError

    def needs_input_for_backward(self, recipe: Recipe) -> bool:
        return True

    def backward(self, dy, a, a_mx, w, saved, offs, recipe: Recipe, need_da, need_dw, a_dtype, w_dtype):
        da = self.dgrad(dy, w, saved, offs, recipe, a_dtype) if need_da else None
        dw = None
        if need_dw:
            if a is None:
                # Pre-quantized A: the wgrad operand needs A along M (tokens), so dequantize (exact in
                # bf16) and requantize column-wise per group.
                a = ops.dequantize(a_mx[0], a_mx[1], 1, None, torch.bfloat16)
            dw = self.wgrad(dy, a, offs, recipe, w_dtype)
        return da, dw

    def dgrad(self, dy, w, saved, offs, recipe: Recipe, out_dtype):
        raise NotImplementedError

    def wgrad(self, dy, a, offs, recipe: Recipe, out_dtype):
        raise NotImplementedError


class QuantizeThenMM(Backend):
    """Core quantizers per the recipe, then the backend's two MX GEMM primitives:
    ``mm`` (rows of A grouped: forward and dgrad) and ``mm_k`` (contraction grouped: wgrad)."""

    def mm(self, a_q, a_s, b_q, b_s, offs, bias, out_dtype) -> Tensor:
        raise NotImplementedError

    def mm_k(self, a_q, a_s, b_q, b_s, offs, out_dtype) -> Tensor:
        raise NotImplementedError

    def quant_tokens(self, x: Tensor, block: int, mode: int, offs: Tensor) -> Pair:
        """wgrad operand: x (M, X) in blocks along M per token group, in the layout ``mm_k`` reads.
        Default: qt (X, M) + scale_r (X, cap), the layout of mxmoe_grouped_mm_mx_kgroups."""
        return quant_along_rows(x, block, mode, offs)

    def forward(self, a, a_mx, w, offs, bias, recipe, out_dtype, need_dw=True):
        a_q, a_s = a_mx if a_mx is not None else quant_along_last(a, recipe.a_block, recipe.mode)
        if recipe.w_tile128:
            # One quantization of W per step serves forward (q, scale_c) and dgrad (qt, scale_r).
            w_q, w_s, w_qt, w_sr = quant_tiles(w, recipe.mode)
            saved = (w_qt, w_sr)
        else:
            w_q, w_s = quant_along_last(w, 32, recipe.mode)
            saved = (None, None)
        return self.mm(a_q, a_s, w_q, w_s, offs, bias, out_dtype), saved

    def dgrad(self, dy, w, saved, offs, recipe, out_dtype):
        dy_q, dy_s = quant_along_last(dy, recipe.dy_block, recipe.mode)  # along N
        w_qt, w_sr = saved
        if w_qt is None:
            w_qt, w_sr = quant_along_rows(w, 32, recipe.mode)  # W along N: qt (G, K, N)
        return self.mm(dy_q, dy_s, w_qt, w_sr, offs, None, out_dtype)

    def wgrad(self, dy, a, offs, recipe, out_dtype):
        if recipe.wgrad_hp:
            return hp_wgrad(dy, a, offs, out_dtype)
        # Along M (tokens), per group: dY -> (N, M), A -> (K, M), grouped compact scales.
        dy_t = self.quant_tokens(dy, recipe.wgrad_block, recipe.mode, offs)
        a_t = self.quant_tokens(a, recipe.wgrad_block, recipe.mode, offs)
        return self.mm_k(*dy_t, *a_t, offs, out_dtype)


class ReferenceBackend(QuantizeThenMM):
    """Core MX GEMM kernels end to end (exact; fp32 accumulation)."""

    name = "reference"

    def mm(self, a_q, a_s, b_q, b_s, offs, bias, out_dtype):
        return ops.grouped_mm_mx(a_q, a_s, b_q, b_s, offs, bias, out_dtype)

    def mm_k(self, a_q, a_s, b_q, b_s, offs, out_dtype):
        return ops.grouped_mm_mx_kgroups(a_q, a_s, b_q, b_s, offs, out_dtype)


class EmulatedBackend(QuantizeThenMM):
    """Core dequantize + torch._grouped_mm on the dequantized (exactly representable) values."""

    name = "emulated"

    def mm(self, a_q, a_s, b_q, b_s, offs, bias, out_dtype):
        ct = compute_dtype(a_q.device)
        a = ops.dequantize(a_q, a_s, 1, None, ct)
        b = ops.dequantize(b_q, b_s, 1, None, ct)
        m = a.shape[0]
        out = torch_grouped_mm(a, b.transpose(-2, -1), offs, m)  # rows past offs[-1] are 0
        if bias is not None:
            # bias[g] on group g's rows, in fp32 before rounding; rows past offs[-1] get the zero row.
            bias_rows = torch.cat([bias.float(), bias.new_zeros((1, bias.shape[1]), dtype=torch.float32)])
            out = out + bias_rows[row_groups(offs, m)]
        return cast(out, out_dtype)

    def quant_tokens(self, x, block, mode, offs):
        # q in x's own (M, X) layout (+ scale_r (X, cap)): torch._grouped_mm wants 16-byte aligned strides,
        # which an (X, M) buffer lacks for token counts M that are not multiples of 4 (8 for bf16), while
        # (M, X)^T (column-major) is fine (X is a multiple of 32). No transposition copies are needed.
        q, _, _, s = ops.quantize(_dense(x), offs, block, 1, mode, True, False, False, True)
        return q, s

    def mm_k(self, a_q, a_s, b_q, b_s, offs, out_dtype):
        ct = compute_dtype(a_q.device)
        # Grouped compact scales along M (axis 0); tokens outside every group dequantize to 0.
        a = ops.dequantize(a_q, a_s, 0, offs, ct)  # (M, N)
        b = ops.dequantize(b_q, b_s, 0, offs, ct)  # (M, K)
        return cast(torch_grouped_mm(a.t(), b, offs, a.shape[0]), out_dtype)


BACKENDS: Dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    """Add (or replace) a backend by its name; GPU backends register here."""
    BACKENDS[backend.name] = backend


register_backend(ReferenceBackend())
register_backend(EmulatedBackend())


@functools.lru_cache(maxsize=None)
def _auto_cuda_backend(index: int) -> str:
    """'auto' on CUDA device `index` (asked once per device: the capability query costs host time)."""
    from .sm90 import is_sm90
    from .sm100 import is_sm100

    device = torch.device("cuda", index)
    if is_sm90(device):
        return "sm90"
    return "sm100" if is_sm100(device) else "emulated"


def resolve_backend(name: str, device: torch.device) -> str:
    """Name of the backend a call with `backend=name` on `device` uses ('auto' picks the best)."""
    if name == "auto":
        # Hopper: the sm90 backend (FP8 tensor cores for tile128, fused MX round trip + bf16 GEMMs for
        # the exact recipes). Blackwell: sm100 (MXFP8 block-scaled tensor cores through torch). CPU:
        # the core's exact MX GEMMs (faster there than fp32 torch matmuls on dequantized operands).
        # Other GPUs: emulated.
        if device.type == "cuda":
            return _auto_cuda_backend(device.index if device.index is not None else torch.cuda.current_device())
        return "reference"
    if name not in BACKENDS:
        raise ValueError(f"backend: expected 'auto' or one of {', '.join(sorted(BACKENDS))}, got {name!r}")
    if name == "sm100":
        from .sm100 import require_sm100_device

        require_sm100_device(device)  # never let the MXFP8 GEMM reach a non-Blackwell device
    return name


def get_backend(name: str) -> Backend:
    return BACKENDS[name]
