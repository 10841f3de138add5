"""Loading the op library and the C API's constants.

The ops (``torch.ops.mxmoe.*``) are registered from C++ by ``libmxmoe_torch.so`` (src/ops/), built
against the LibTorch stable ABI: one binary serves torch 2.11 (the GPU machine) and 2.13 (CI), with
no libpython or per-version rebuild (README, developer notes). It links ``libmxmoe.so``, the
torch-free core that the C++ tests exercise. Loading it registers the ops; mxmoe/ops.py adds the
fakes and the Python-facing wrappers.

Where it is found: env ``MXMOE_OPS_LIBRARY`` (a path to libmxmoe_torch.so, e.g. a build tree's
``build/src/ops/libmxmoe_torch.so``), else the copy packaged in ``mxmoe/lib/``.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Dict

import torch

BLOCK = 32
LIBRARY_NAME = "libmxmoe_torch.so"

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

_lock = threading.Lock()
_loaded: str | None = None


def _candidates() -> list:
    env = os.environ.get("MXMOE_OPS_LIBRARY")
    if env:
        return [Path(env)]
    # The package's search path (an editable install may list several directories); the package is
    # imported before this module, so it is in sys.modules (no import of it from here).
    package = sys.modules.get(__name__.rpartition(".")[0])
    dirs = [Path(p) for p in getattr(package, "__path__", [])] or [Path(__file__).parent]
    return [d / "lib" / LIBRARY_NAME for d in dirs]


def library_path() -> str:
    """Path of the op library (``MXMOE_OPS_LIBRARY`` if set, else the packaged copy)."""
    for c in _candidates():
        if c.is_file():
            return str(c)
    if os.environ.get("MXMOE_OPS_LIBRARY"):
        raise OSError(f"mxmoe: MXMOE_OPS_LIBRARY={os.environ['MXMOE_OPS_LIBRARY']!r} is not a file")
    tried = ", ".join(str(c) for c in _candidates())
    raise OSError(
        f"mxmoe: the op library {LIBRARY_NAME} was not found (looked at: {tried}). Install the package "
        "(`bash scripts/setup.sh`, or `pip install .`: it builds and packages the libraries), or build "
        "with CMake and point MXMOE_OPS_LIBRARY at build/src/ops/libmxmoe_torch.so."
    )


def load() -> str:
    """Load the op library once (registers torch.ops.mxmoe.*); returns its path."""
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                path = library_path()
                torch.ops.load_library(path)
                _loaded = path
    return _loaded


def build_info() -> Dict[str, object]:
    """What this build of mxmoe carries: ``cuda`` (bool), ``cuda_archs`` (list of str),
    ``tile128_gemm`` (bool: the Hopper FP8 GEMMs, CUDA + CUTLASS), ``torch_abi`` ("stable"),
    ``torch_target`` (the oldest torch the binary loads in), ``torch_built_with``, ``version``,
    ``library`` (the op library's path)."""
    load()
    raw = dict(kv.split("=", 1) for kv in torch.ops.mxmoe.build_info().split(";"))
    return {
        "version": raw["version"],
        "cuda": raw["cuda"] == "1",
        "cuda_archs": [a for a in raw["cuda_archs"].split(",") if a],
        "tile128_gemm": raw["tile128_gemm"] == "1",
        "torch_abi": raw["torch_abi"],
        "torch_target": raw["torch_target"],
        "torch_built_with": raw["torch_built_with"],
        "library": _loaded,
    }


def version() -> str:
    return build_info()["version"]


def has_cuda() -> bool:
    """True if the library was built with its CUDA kernels."""
    return build_info()["cuda"]
