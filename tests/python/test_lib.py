"""The ctypes layer: library loading, tensor views, status -> exception, size formulas vs the C API."""
import ctypes

import pytest
import torch

import mxmoe
from mxmoe import _lib, ops


def test_library_loads_and_reports_version():
    assert mxmoe.core_version() == "0.1.0"
    assert isinstance(mxmoe.has_cuda(), bool)
    assert mxmoe.library_path().endswith(("libmxmoe.so", "libmxmoe.dylib", "mxmoe.dll"))


def test_missing_library_gives_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("MXMOE_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(OSError, match="MXMOE_LIBRARY"):
        _lib.library_path()


@pytest.mark.parametrize(
    "dtype,code",
    [
        (torch.bfloat16, _lib.DTYPE_BF16),
        (torch.float32, _lib.DTYPE_F32),
        (torch.float8_e4m3fn, _lib.DTYPE_E4M3),
        (torch.float8_e8m0fnu, _lib.DTYPE_E8M0),
        (torch.int32, _lib.DTYPE_I32),
    ],
)
def test_view_mirrors_tensor(dtype, code):
    t = torch.zeros(4, 6, 8, dtype=dtype)[1:, :, ::2].transpose(0, 1)
    v = _lib.view(t, "t")._obj
    assert v.dtype == code and v.ndim == 3 and v.device == -1
    assert list(v.shape[:3]) == list(t.shape) and list(v.strides[:3]) == list(t.stride())
    assert v.data == t.data_ptr()  # includes the storage offset


def test_view_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"x: expected dtype .* got float16"):
        _lib.view(torch.zeros(2, dtype=torch.float16), "x")
    with pytest.raises(ValueError, match=r"x: expected at most 4 dims, got 5"):
        _lib.view(torch.zeros(1, 1, 1, 1, 1), "x")
    with pytest.raises(ValueError, match=r"x: expected a cpu or cuda tensor, got a tensor on device 'meta'"):
        _lib.view(torch.zeros(2, device="meta"), "x")
    assert _lib.view(None, "x") is None


def test_status_maps_to_exceptions():
    _lib.check(_lib.OK, "op")
    with pytest.raises(ValueError, match=r"^mxmoe\.op"):
        _lib.check(_lib.ERR_INVALID_ARGUMENT, "op")
    with pytest.raises(NotImplementedError):
        _lib.check(_lib.ERR_UNSUPPORTED, "op")
    for status in (_lib.ERR_CUDA, _lib.ERR_INTERNAL):
        with pytest.raises(RuntimeError):
            _lib.check(status, "op")


def test_core_message_reaches_python():
    # The core validates and names the argument; the message comes through mxmoe_last_error().
    x = torch.zeros(4, 48)  # last dim not a multiple of 32
    with pytest.raises(ValueError, match=r"mxmoe\.quantize: x: expected the last dim .* multiple of 32, got 48"):
        ops.quantize(x, None, 1, 32, 0, True, False, True, False)


@pytest.mark.parametrize("h,w,g", [(1, 1, 1), (130, 5, 3), (256, 8, 0), (7, 300, 9)])
def test_size_formulas_match_core(h, w, g):
    lib = _lib.lib()
    for kind in (_lib.BLOCKED_WHOLE, _lib.BLOCKED_GROUPS_M, _lib.BLOCKED_GROUPS_K, _lib.BLOCKED_PER_EXPERT):
        assert ops.blocked_size(kind, h, w, g) == lib.mxmoe_blocked_size(kind, h, w, g)
    assert ops.grouped_scale_capacity(h, g) == lib.mxmoe_grouped_scale_capacity(h, g)


def test_scalar_codecs_bound():
    lib = _lib.lib()
    assert lib.mxmoe_e8m0_from_amax(ctypes.c_float(448.0), _lib.SCALE_RCEIL) == 127
    assert lib.mxmoe_e4m3_from_float(448.0) == 0x7E
    assert lib.mxmoe_e4m3_to_float(0x7E) == 448.0
    assert lib.mxmoe_e8m0_to_float(127) == 1.0
