"""CUDA paths of the binding (marked gpu: skipped without a CUDA device; run on the GPU machine).
The CUDA core must match the CPU core bit for bit; grouped_mm on CUDA must run on torch's current
stream, allocate through torch and capture into a CUDA graph (no host syncs)."""
import pytest
import torch

import mxmoe
from mxmoe import _lib
from mx_testutils import offsets, rel_err

pytestmark = pytest.mark.gpu
RCEIL = _lib.SCALE_RCEIL


def _u8(t):
    return t.view(torch.uint8).cpu() if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu) else t.cpu()


@pytest.fixture(autouse=True)
def _needs_cuda_build():
    if not mxmoe.has_cuda():
        pytest.skip("libmxmoe was built without CUDA")


@pytest.mark.parametrize(
    "shape,sizes,block",
    [((256, 128), None, (1, 32)), ((203, 96), [50, 0, 140], (32, 1)), ((2, 160, 256), None, (128, 128)), ((256, 128), None, (1, 128))],
)
def test_quantize_cuda_matches_cpu(shape, sizes, block):
    x = torch.randn(shape, dtype=torch.bfloat16)
    o = offsets(sizes) if sizes else None
    along_c, along_r = block[1] > 1, block[0] > 1
    args = (block[0], block[1], RCEIL, True, True, along_c, along_r)
    cpu = torch.ops.mxmoe.quantize(x, o, *args)
    gpu = torch.ops.mxmoe.quantize(x.cuda(), o.cuda() if o is not None else None, *args)
    for c, g in zip(cpu, gpu):
        assert g.device.type == "cuda" and torch.equal(_u8(c), _u8(g))


def test_grouped_mm_cuda_side_stream_and_backward():
    A = torch.randn(203, 64, dtype=torch.bfloat16)
    W = torch.randn(3, 96, 64, dtype=torch.bfloat16)
    o = offsets([50, 0, 140])
    ref = mxmoe.grouped_mm(A, W.transpose(-2, -1), o, backend="emulated", out_dtype=torch.float32)
    Ag, Wg = A.cuda().requires_grad_(), W.cuda().requires_grad_()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # kernels must launch on the current (side) stream
        y = mxmoe.grouped_mm(Ag, Wg.transpose(-2, -1), o.cuda(), out_dtype=torch.float32)
        y.sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    assert rel_err(y.cpu(), ref) < 1e-2  # CUDA emulation rounds the grouped GEMM to bf16
    assert Ag.grad.shape == Ag.shape and Wg.grad.shape == Wg.shape and torch.isfinite(Wg.grad).all()


@pytest.mark.parametrize("backend", ["reference", "emulated"])
def test_grouped_mm_cuda_graph_capture(backend):
    A = torch.randn(256, 64, dtype=torch.bfloat16, device="cuda")
    B_t = torch.randn(3, 96, 64, dtype=torch.bfloat16, device="cuda").transpose(-2, -1)
    o = offsets([50, 0, 140], "cuda")
    try:
        eager = mxmoe.grouped_mm(A, B_t, o, backend=backend)
    except NotImplementedError as e:
        pytest.skip(f"not in this build: {e}")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # fails on any host sync or allocation outside torch's allocator
        out = mxmoe.grouped_mm(A, B_t, o, backend=backend)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_compile_cuda():
    fn = torch.compile(lambda A, B_t, o: mxmoe.grouped_mm(A, B_t, o), fullgraph=True, dynamic=True)
    A = torch.randn(203, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    W = torch.randn(3, 96, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    o = offsets([50, 0, 140], "cuda")
    y = fn(A, W.transpose(-2, -1), o)
    y.float().pow(2).sum().backward()
    ye = mxmoe.grouped_mm(A.detach(), W.detach().transpose(-2, -1), o)
    torch.testing.assert_close(y, ye)
