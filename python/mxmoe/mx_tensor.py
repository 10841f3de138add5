"""MXTensor and the public quantize(): MXFP8 tensors produced by the core's quantizer.

MXTensor is a plain container (deliberately not a torch.Tensor subclass: no __torch_dispatch__, no
autograd through it; it is what a caller hands to mxmoe.grouped_mm as a pre-quantized operand or
inspects in tests). All numerics are the core's (docs/design/mx-format.md); nothing here computes a scale.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from . import _lib, ops

Block = Union[int, str, tuple]


def _mode_code(mode) -> int:
    if isinstance(mode, str) and mode.lower() in _lib.SCALE_MODES:
        return _lib.SCALE_MODES[mode.lower()]
    raise ValueError(f"mode: expected one of {', '.join(_lib.SCALE_MODES)}, got {mode!r}")


def _mode_name(code: int) -> str:
    return {v: k for k, v in _lib.SCALE_MODES.items()}[code]


def _block_size(block) -> int:
    """32 and 128: 1-D blocks along dim; 'tile128' / (128, 128): 128x128 tiles (returns -128)."""
    if block in ("tile128", (128, 128), [128, 128]):
        return -128
    if block in (32, 128):
        return int(block)
    raise ValueError(f"block: expected 32, 128 or 'tile128' (128x128 tiles), got {block!r}")


class MXTensor:
    """An MXFP8 tensor: float8_e4m3fn elements + one float8_e8m0fnu scale per 32 along ``dim``.

    Attributes:
      qdata:  e4m3 elements in the shape of the quantized tensor. For ``dim=-2`` it is a transposed
              view of the contiguous ``qt`` storage the core writes (the layout wgrad/dgrad GEMMs read).
      scale:  e8m0 bytes, the quantized tensor's shape with size ceil(n/32) at ``dim`` (one byte per
              32-element MX block; coarse 128 / 128x128 blocks repeat their byte). For ``dim=-2`` it
              is a transposed view of the core's ``scale_r``. With ``offs`` (token groups along dim -2)
              the scale axis has the grouped compact layout of capacity ceil(M/32) + G: group g's
              blocks start at sum_{h<g} ceil(size_h/32), unused entries are 0.
      dim:    -1 or -2, the dimension the blocks run along.
      block:  (block_r, block_c) as in mxmoe_quant_config, e.g. (1, 32), (32, 1), (128, 128).
      mode:   scale rule: 'rceil', 'floor', 'ceil' or 'even'.
      offs:   the token-group offsets used (dim=-2 only), or None.
      orig_dtype: dtype of the tensor that was quantized.
    """

    __slots__ = ("qdata", "scale", "dim", "block", "mode", "offs", "orig_dtype")

    def __init__(self, qdata, scale, dim, block, mode, offs=None, orig_dtype=torch.bfloat16):
        self.qdata = qdata
        self.scale = scale
        self.dim = dim
        self.block = tuple(block)
        self.mode = mode
        self.offs = offs
        self.orig_dtype = orig_dtype

    @property
    def shape(self) -> torch.Size:
        return self.qdata.shape

    @property
    def device(self) -> torch.device:
        return self.qdata.device

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """x_hat = e4m3(q) * 2^(s - 127) in ``dtype`` (bf16 or f32), with the quantized tensor's shape.

        Elements outside every token group (rows after offs[-1]) are 0.
        """
        shape = self.qdata.shape
        q, s = self.qdata, self.scale
        if self.dim == -2:
            # Dequantize the contiguous (.., C, R) storage along its last dim, hand back a view.
            q, s = q.transpose(-2, -1), s.transpose(-2, -1)
        lead = q.shape[:-1]
        q3 = q if q.dim() in (2, 3) else q.reshape(-1, q.shape[-1])
        s3 = s if s.dim() in (2, 3) else s.reshape(-1, s.shape[-1])
        out = ops.dequantize(q3, s3, 1, self.offs, dtype)
        out = out.reshape(*lead, out.shape[-1])
        return out.transpose(-2, -1) if self.dim == -2 else out.reshape(shape)

    def __repr__(self) -> str:
        return (
            f"MXTensor(shape={tuple(self.shape)}, dim={self.dim}, block={self.block}, mode={self.mode!r}, "
            f"grouped={self.offs is not None}, device={self.device})"
        )


def quantize(
    x: torch.Tensor,
    dim: int = -1,
    mode: str = "rceil",
    block: Block = 32,
    offs: Optional[torch.Tensor] = None,
) -> MXTensor:
    """MX-quantize ``x`` (bf16 or f32) along ``dim`` with the core's quantizer.

    Args:
      x: any rank >= 1 for ``dim=-1`` (leading dims are flattened; the last dim must be a multiple of
         32); rank >= 2 for ``dim=-2``; rank 2 or 3 for ``block='tile128'``.
      dim: the last (-1) or second-to-last (-2) dimension. dim=-2 needs a size multiple of 32 unless
         ``offs`` is given.
      mode: 'rceil' (training default, torchao/cuBLAS compatible), 'floor', 'ceil' or 'even'.
      block: 32 (MX), 128 (1x128 coarse blocks along dim) or 'tile128' (128x128 tiles; ``dim`` then only
         picks which orientation of the scales ``.scale`` holds).
      offs: int32 (G,) cumulative token-group ends along dim -2 of a 2D x (dim=-2 only). Blocks never
         cross a group end and the last block of a group may be partial (missing rows count as zeros),
         so groups need no padding; rows after offs[-1] quantize to 0.
    Returns an MXTensor (see its docstring for the layouts).
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"x: expected dtype bfloat16 or float32, got {str(x.dtype).replace('torch.', '')}")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"x: expected a cpu or cuda tensor, got a tensor on device '{x.device}'")
    mode_code = _mode_code(mode)
    size = _block_size(block)
    nd = x.dim()
    if nd == 0:
        raise ValueError("x: expected at least 1 dim, got a 0-dim tensor")
    d = dim + nd if dim < 0 else dim
    if d == nd - 1:
        dim = -1
    elif d == nd - 2 and nd >= 2:
        dim = -2
    else:
        raise ValueError(f"dim: expected the last or second-to-last dim of a {nd}-D tensor, got {dim}")
    if offs is not None:
        if dim != -2 or nd != 2 or size == -128:
            raise ValueError(
                f"offs: token groups apply to blocks along dim -2 (dim=-2, block 32 or 128) of a 2D x, "
                f"got dim={dim}, block={block!r}, x with {nd} dims"
            )
        if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
            raise ValueError(f"offs: expected a 1-D int32 tensor, got {_describe(offs)}")
        if offs.device != x.device:
            raise ValueError(f"offs: expected device {x.device} (x's), got {offs.device}")

    if size == -128:
        if nd not in (2, 3):
            raise ValueError(f"x: 128x128 tiles need a 2D or 3D x, got shape {tuple(x.shape)}")
        block_rc = (128, 128)
        x3 = x
    elif dim == -1:
        block_rc = (1, size)
        x3 = x if nd in (2, 3) else x.reshape(-1, x.shape[-1])
    else:
        block_rc = (size, 1)
        x3 = x if nd in (2, 3) else x.reshape(-1, x.shape[-2], x.shape[-1])

    along_c = dim == -1
    q, qt, s_c, s_r = ops.quantize(
        x3, offs, block_rc[0], block_rc[1], mode_code, along_c, not along_c, along_c, not along_c
    )
    if along_c:
        qdata = q.reshape(x.shape)
        scale = s_c.reshape(*x.shape[:-1], s_c.shape[-1])
    else:
        qdata = qt.transpose(-2, -1).reshape(x.shape)  # a view: only the batch dim is split
        scale = s_r.transpose(-2, -1)
        if nd not in (2, 3):
            scale = scale.reshape(*x.shape[:-2], scale.shape[-2], scale.shape[-1])
    return MXTensor(qdata, scale, dim, block_rc, _mode_name(mode_code), offs, x.dtype)


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).replace('torch.', '')} tensor of shape {tuple(t.shape)} on {t.device}"
    return type(t).__name__
