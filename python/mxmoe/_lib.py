"""ctypes binding of the core's C API (include/mxmoe/mxmoe.h).

Why ctypes and not a LibTorch extension: DESIGN.md's first choice for the binding layer is the LibTorch
stable ABI; mxmoe uses its documented fallback instead, the core's C API (libmxmoe.so) called through
ctypes from inside ``torch.library`` custom ops (mxmoe/ops.py). One binary then serves torch 2.11
(the GPU machine, Python 3.12) and torch 2.13 (CI, Python 3.11): it includes no torch header and is
never rebuilt per torch version, and it is the same library the C++ tests exercise.

This module knows nothing about autograd or shapes beyond the struct layout: it
  * loads the library (env ``MXMOE_LIBRARY`` first, else the copy packaged in ``mxmoe/lib/``);
  * mirrors ``mxmoe_tensor`` / ``mxmoe_quant_config`` and the enums;
  * turns a ``torch.Tensor`` into an ``mxmoe_tensor`` view (no copy: pointer, shape, strides, device);
  * turns a failed status into a Python exception carrying ``mxmoe_last_error()``:
    INVALID_ARGUMENT -> ValueError, UNSUPPORTED -> NotImplementedError, anything else -> RuntimeError.

ctypes releases the GIL for the duration of each call; the core's CPU kernels are multithreaded.
CUDA entry points get ``torch.cuda.current_stream().cuda_stream`` and never synchronize the host.
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Optional

import torch

MAX_DIMS = 4
BLOCK = 32

# mxmoe_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_UNSUPPORTED = 2
ERR_CUDA = 3
ERR_INTERNAL = 4

# mxmoe_dtype
DTYPE_BF16 = 0
DTYPE_F32 = 1
DTYPE_E4M3 = 2
DTYPE_E8M0 = 3
DTYPE_I32 = 4
DTYPE_F64 = 5

# mxmoe_scale_mode
SCALE_RCEIL = 0
SCALE_FLOOR = 1
SCALE_CEIL = 2
SCALE_EVEN = 3
SCALE_MODES = {"rceil": SCALE_RCEIL, "floor": SCALE_FLOOR, "ceil": SCALE_CEIL, "even": SCALE_EVEN}

# mxmoe_blocked_kind
BLOCKED_WHOLE = 0
BLOCKED_GROUPS_M = 1
BLOCKED_GROUPS_K = 2
BLOCKED_PER_EXPERT = 3

TORCH_TO_MXMOE_DTYPE = {
    torch.bfloat16: DTYPE_BF16,
    torch.float32: DTYPE_F32,
    torch.float8_e4m3fn: DTYPE_E4M3,
    torch.float8_e8m0fnu: DTYPE_E8M0,
    torch.int32: DTYPE_I32,
    torch.float64: DTYPE_F64,
}


class MxTensorC(ctypes.Structure):
    """Mirror of ``mxmoe_tensor``: a strided view, shapes and strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
        ("device", ctypes.c_int32),
    ]


class QuantConfigC(ctypes.Structure):
    """Mirror of ``mxmoe_quant_config`` (passed by value)."""

    _fields_ = [("block_r", ctypes.c_int32), ("block_c", ctypes.c_int32), ("mode", ctypes.c_int)]


_P = ctypes.POINTER(MxTensorC)


class FusedSideC(ctypes.Structure):
    """Mirror of ``mxmoe_fused_side``: the outputs wanted from one side of mxmoe_quantize_fused."""

    _fields_ = [(n, _P) for n in ("q", "qt", "scale", "scale_blocked", "dq", "dqt")]


class FusedConfigC(ctypes.Structure):
    """Mirror of ``mxmoe_fused_config`` (passed by value)."""

    _fields_ = [
        ("row_block", ctypes.c_int32),
        ("col_block", ctypes.c_int32),
        ("tile128", ctypes.c_int32),
        ("mode", ctypes.c_int),
    ]


_PS = ctypes.POINTER(FusedSideC)
_SIGNATURES = {
    "mxmoe_last_error": (ctypes.c_char_p, []),
    "mxmoe_version": (ctypes.c_char_p, []),
    "mxmoe_has_cuda": (ctypes.c_int, []),
    "mxmoe_e8m0_from_amax": (ctypes.c_uint8, [ctypes.c_float, ctypes.c_int]),
    "mxmoe_e8m0_to_float": (ctypes.c_float, [ctypes.c_uint8]),
    "mxmoe_e4m3_from_float": (ctypes.c_uint8, [ctypes.c_float]),
    "mxmoe_e4m3_to_float": (ctypes.c_float, [ctypes.c_uint8]),
    "mxmoe_quantize": (ctypes.c_int, [_P, _P, QuantConfigC, _P, _P, _P, _P, ctypes.c_void_p]),
    "mxmoe_dequantize": (ctypes.c_int, [_P, _P, ctypes.c_int32, _P, _P, ctypes.c_void_p]),
    "mxmoe_grouped_scale_capacity": (ctypes.c_int64, [ctypes.c_int64, ctypes.c_int64]),
    "mxmoe_blocked_size": (ctypes.c_int64, [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]),
    "mxmoe_scales_to_blocked": (ctypes.c_int, [_P, ctypes.c_int, _P, _P, ctypes.c_void_p]),
    "mxmoe_scales_from_blocked": (ctypes.c_int, [_P, ctypes.c_int, _P, _P, ctypes.c_void_p]),
    "mxmoe_grouped_mm_mx": (ctypes.c_int, [_P, _P, _P, _P, _P, _P, _P, ctypes.c_void_p]),
    "mxmoe_grouped_mm_mx_kgroups": (ctypes.c_int, [_P, _P, _P, _P, _P, _P, ctypes.c_void_p]),
    "mxmoe_check_offsets": (ctypes.c_int, [_P, ctypes.c_int64, ctypes.c_void_p]),
    "mxmoe_zero_rows_past_groups": (ctypes.c_int, [_P, _P, ctypes.c_void_p]),
    "mxmoe_quantize_fused": (ctypes.c_int, [_P, _P, FusedConfigC, _PS, _PS, ctypes.c_void_p]),
    "mxmoe_grouped_mm_tile128_workspace_size": (ctypes.c_int64, [ctypes.c_int64] * 4 + [ctypes.c_int32]),
    "mxmoe_grouped_mm_tile128_kgroups_workspace_size": (ctypes.c_int64, [ctypes.c_int64] * 4 + [ctypes.c_int32]),
    "mxmoe_grouped_mm_tile128": (ctypes.c_int, [_P] * 8 + [ctypes.c_void_p]),
    "mxmoe_grouped_mm_tile128_kgroups": (ctypes.c_int, [_P] * 7 + [ctypes.c_void_p]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def _candidates() -> list:
    env = os.environ.get("MXMOE_LIBRARY")
    if env:
        return [Path(env)]
    import mxmoe  # the package's search path; an editable install may list several directories

    dirs = [Path(p) for p in getattr(mxmoe, "__path__", [])] or [Path(__file__).parent]
    return [d / "lib" / name for d in dirs for name in ("libmxmoe.so", "libmxmoe.dylib", "mxmoe.dll")]


def library_path() -> str:
    """Path of the libmxmoe the binding uses (``MXMOE_LIBRARY`` if set, else the packaged copy)."""
    for c in _candidates():
        if c.is_file():
            return str(c)
    tried = ", ".join(str(c) for c in _candidates())
    if os.environ.get("MXMOE_LIBRARY"):
        raise OSError(f"mxmoe: MXMOE_LIBRARY={os.environ['MXMOE_LIBRARY']!r} is not a file")
    raise OSError(
        "mxmoe: the core library libmxmoe.so was not found (looked at: " + tried + "). Install the "
        "package with `pip install --no-build-isolation .` (it builds and packages the library), or "
        "build it with CMake and point MXMOE_LIBRARY at build/src/core/libmxmoe.so."
    )


def lib() -> ctypes.CDLL:
    """The loaded core library (loaded on first use, so ``import mxmoe`` never fails on it)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            handle = ctypes.CDLL(path)
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(handle, name)
                fn.restype = restype
                fn.argtypes = argtypes
            _lib_path = path
            _lib = handle
    return _lib


def last_error() -> str:
    return lib().mxmoe_last_error().decode("utf-8", "replace")


def check(status: int, what: str) -> None:
    """Raise the Python exception for a failed status, with the core's message."""
    if status == OK:
        return
    msg = last_error()
    text = f"mxmoe.{what}: {msg}" if msg else f"mxmoe.{what}: failed with status {status}"
    if status == ERR_INVALID_ARGUMENT:
        raise ValueError(text)
    if status == ERR_UNSUPPORTED:
        raise NotImplementedError(text)
    raise RuntimeError(text)


def device_index(t: torch.Tensor, name: str) -> int:
    """-1 for host memory, the CUDA ordinal otherwise; anything else is a clear ValueError."""
    if t.device.type == "cpu":
        return -1
    if t.device.type == "cuda":
        return t.device.index if t.device.index is not None else torch.cuda.current_device()
    raise ValueError(f"{name}: expected a cpu or cuda tensor, got a tensor on device '{t.device}'")


def view(t: Optional[torch.Tensor], name: str):
    """``mxmoe_tensor`` view of a tensor (or None -> NULL). No copy; the tensor must outlive the call."""
    v = view_struct(t, name)
    return None if v is None else ctypes.byref(v)


def view_struct(t: Optional[torch.Tensor], name: str) -> Optional[MxTensorC]:
    """The ``mxmoe_tensor`` itself (for struct fields: keep it referenced during the call)."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    code = TORCH_TO_MXMOE_DTYPE.get(t.dtype)
    if code is None:
        allowed = ", ".join(str(d).replace("torch.", "") for d in TORCH_TO_MXMOE_DTYPE)
        raise ValueError(f"{name}: expected dtype one of {allowed}, got {str(t.dtype).replace('torch.', '')}")
    if t.dim() > MAX_DIMS:
        raise ValueError(f"{name}: expected at most {MAX_DIMS} dims, got {t.dim()} (shape {tuple(t.shape)})")
    v = MxTensorC()
    v.data = t.data_ptr() or None
    v.dtype = code
    v.ndim = t.dim()
    strides = t.stride()
    if t.numel() == 0:
        # torch reports arbitrary strides for empty tensors (e.g. (1, 1) for a contiguous (32, 0));
        # give the row-major ones, which are equally valid (no element is ever addressed).
        strides, run = [0] * t.dim(), 1
        for i in range(t.dim() - 1, -1, -1):
            strides[i], run = run, run * t.shape[i]
    for i, (s, st) in enumerate(zip(t.shape, strides)):
        v.shape[i] = s
        v.strides[i] = st
    v.device = device_index(t, name)
    return v


def stream_for(t: torch.Tensor):
    """The stream a CUDA entry point launches on: torch's current stream on t's device (None on host)."""
    if t.device.type == "cuda":
        return ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)
    return None


def quant_config(block_r: int, block_c: int, mode: int) -> QuantConfigC:
    return QuantConfigC(block_r, block_c, mode)


def version() -> str:
    return lib().mxmoe_version().decode()


def has_cuda() -> bool:
    """True if libmxmoe was built with its CUDA kernels."""
    return bool(lib().mxmoe_has_cuda())
