"""The C++ op layer as Python sees it: loading, build facts, errors (type and message), and that the
ops run as C++ kernels (no Python implementation registered for them)."""
import subprocess

import pytest
import torch

import mxmoe
from mxmoe import _lib, ops
from mx_testutils import offsets


def test_library_loads_and_reports_build_info():
    info = mxmoe.build_info()
    assert info["version"] == mxmoe.__version__ == mxmoe.core_version()
    assert info["torch_abi"] == "stable" and info["torch_target"] == "2.11"
    assert isinstance(info["cuda"], bool) and isinstance(info["tile128_gemm"], bool)
    assert isinstance(info["cuda_archs"], list)
    if info["cuda"]:
        assert "90a" in info["cuda_archs"]
    if info["tile128_gemm"]:
        assert info["cuda"]
    assert mxmoe.library_path().endswith("libmxmoe_torch.so")


def test_missing_library_gives_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("MXMOE_OPS_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(OSError, match="MXMOE_OPS_LIBRARY"):
        _lib.library_path()


def test_ops_are_cpp_kernels():
    # Registered from C++: the CPU and CUDA kernels are not Python functions (torch.library.custom_op
    # would have put a Python kernel there), and no Python op body exists to bypass the dispatcher.
    for name in ("quantize", "quantize_fused", "grouped_mm_tile128", "sm90_tile128_forward", "sm90_tile128_weight", "sm90_exact_backward"):
        op = getattr(torch.ops.mxmoe, name).default
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CPU"), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CUDA"), name
        assert not hasattr(op, "_init_fn")
    for module in (mxmoe._lib, mxmoe.ops):
        assert "ctypes" not in vars(module)


@pytest.mark.parametrize(
    "call,exc,pattern",
    [
        # the core's validator names the argument and what it expected vs got
        (lambda: ops.quantize(torch.zeros(4, 48), None, 1, 32, 0, True, False, True, False), ValueError,
         r"^mxmoe\.quantize: x: expected the last dim .* multiple of 32, got 48"),
        (lambda: ops.quantize(torch.zeros(2, 64, dtype=torch.float16), None, 1, 32, 0, True, False, True, False),
         ValueError, r"^mxmoe\.quantize: x: expected dtype one of .*, got Half"),
        (lambda: ops.quantize(torch.zeros(1, 1, 1, 1, 32), None, 1, 32, 0, True, False, True, False), ValueError,
         r"x: expected 2 or 3 dims"),
        (lambda: ops.dequantize(torch.zeros(1, 1, 1, 1, 1, dtype=torch.float8_e4m3fn),
                                torch.zeros(1, dtype=torch.float8_e8m0fnu), 1, None, torch.float32), ValueError,
         r"q: expected at most 4 dims, got 5"),
        (lambda: ops.quantize(torch.zeros(4, 64), None, 1, 32, 2**40, True, False, True, False), ValueError,
         r"mode: expected an int32 value"),
        (lambda: ops.scales_to_blocked(torch.zeros(4, 4, dtype=torch.float8_e8m0fnu), 9, None), ValueError,
         r"kind: expected WHOLE \(0\)"),
        (lambda: ops.scales_from_blocked(torch.zeros(512, dtype=torch.float8_e8m0fnu), 0, None, [-1, 4]),
         ValueError, r"scale_shape: expected sizes >= 0"),
        (lambda: ops.grouped_mm_tile128(torch.zeros(4, 128, dtype=torch.float8_e4m3fn),
                                        torch.zeros(4, 4, dtype=torch.float8_e8m0fnu),
                                        torch.zeros(1, 32, 128, dtype=torch.float8_e4m3fn),
                                        torch.zeros(1, 32, 3, dtype=torch.float8_e8m0fnu),
                                        torch.tensor([4], dtype=torch.int32), None, torch.bfloat16), ValueError,
         r"^mxmoe\.grouped_mm_tile128: b_scale: expected shape"),
        (lambda: ops.sm90_tile128_backward(torch.zeros(4, 128), torch.zeros(1, 128, 128, dtype=torch.float8_e4m3fn),
                                           torch.zeros(1, 128, 4, dtype=torch.float8_e8m0fnu), None, None,
                                           offsets([4]), 0, False, True, torch.bfloat16, torch.bfloat16),
         ValueError, r"a_qt, a_scale: required when need_dw"),
    ],
)
def test_errors_name_the_argument(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_torch_ops_raise_runtime_error_with_the_same_message():
    with pytest.raises(RuntimeError, match=r"mxmoe\.quantize \(invalid argument\): x: expected the last dim"):
        torch.ops.mxmoe.quantize(torch.zeros(4, 48), None, 1, 32, 0, True, False, True, False)


def test_outputs_untouched_on_error():
    # zero_rows_past_groups mutates x: a rejected call (bad offs dtype) must leave x as it was.
    x = torch.randn(8, 32)
    before = x.clone()
    with pytest.raises(ValueError, match="offs"):
        ops.zero_rows_past_groups(x, torch.tensor([3], dtype=torch.int64))
    assert torch.equal(x, before)


@pytest.mark.parametrize("h,w,g", [(1, 1, 1), (130, 5, 3), (256, 8, 0), (7, 300, 9)])
def test_fake_sizes_match_the_ops(h, w, g):
    # The fakes' static bounds (Python) must equal the sizes the C++ ops allocate.
    scale = torch.randint(0, 200, (h, w), dtype=torch.uint8).view(torch.float8_e8m0fnu)
    offs = offsets([0] * g) if g else None
    for kind in (_lib.BLOCKED_WHOLE, _lib.BLOCKED_GROUPS_M) if g else (_lib.BLOCKED_WHOLE,):
        real = ops.scales_to_blocked(scale, kind, offs if kind == _lib.BLOCKED_GROUPS_M else None)
        assert real.numel() == ops.blocked_size(kind, h, w, g)


def test_one_binary_no_libpython():
    # The op library links no libpython and no c10/ATen C++ symbols: only torch's C shim.
    path = mxmoe.library_path()
    deps = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    assert "libpython" not in deps and "libtorch_python" not in deps and "libc10.so" not in deps
    undefined = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True).stdout
    assert "_ZN3c10" not in undefined and "_ZN2at" not in undefined
