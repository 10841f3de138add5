"""ops.call: the eager fast path of the mxmoe ops (the implementation called directly, no dispatcher)
must give the dispatcher path's results, be taken only in plain eager mode, and leave every traced or
wrapped call (FakeTensorMode, torch.compile, dispatch modes, tensor subclasses) to torch.ops.mxmoe.*."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import mxmoe
from mxmoe import ops
from mx_testutils import offsets

FUSED_ARGS = (32, 32, False, ops._lib.SCALE_RCEIL, ops.FUSED_DQ, ops.FUSED_Q | ops.FUSED_SCALE, torch.bfloat16)


@pytest.fixture
def spy(monkeypatch):
    """Counts the fast-path calls of quantize_fused: ops.call reads op._init_fn, while the dispatcher
    runs the kernel registered when the op was defined (the original function)."""
    calls = []
    orig = ops.quantize_fused._init_fn

    def counting(*args):
        calls.append(args)
        return orig(*args)

    monkeypatch.setattr(ops.quantize_fused, "_init_fn", counting)
    return calls


def _inputs():
    torch.manual_seed(0)
    return torch.randn(200, 96, dtype=torch.bfloat16), offsets([0, 45, 100, 31])


def test_eager_fast_path_equals_dispatcher(spy):
    x, offs = _inputs()
    fast = ops.call(ops.quantize_fused, x, offs, *FUSED_ARGS)
    assert len(spy) == 1, "plain eager call did not take the fast path"
    slow = ops.quantize_fused(x, offs, *FUSED_ARGS)
    assert len(spy) == 1, "the dispatcher path must not go through op._init_fn"
    assert len(fast) == len(slow) == 12
    for f, s in zip(fast, slow):
        assert f.dtype == s.dtype and f.shape == s.shape
        assert torch.equal(f.view(torch.uint8), s.view(torch.uint8)) if f.element_size() == 1 else torch.equal(f, s)


def test_fake_tensors_go_through_the_op(spy):
    x, offs = _inputs()
    with FakeTensorMode() as mode:
        fx, foffs = mode.from_tensor(x), mode.from_tensor(offs)
        outs = ops.call(ops.quantize_fused, fx, foffs, *FUSED_ARGS)
    assert not spy, "fake tensors reached the implementation"
    assert outs[4].shape == x.shape and outs[6].shape == x.shape  # dq (row side), q (column side)


def test_dispatch_mode_sees_the_op(spy):
    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x, offs = _inputs()
    with Log():
        ops.call(ops.quantize_fused, x, offs, *FUSED_ARGS)
    assert not spy
    assert any("mxmoe.quantize_fused" in s for s in seen)


def test_compiled_graph_calls_the_op(spy):
    x, offs = _inputs()

    def f(x, offs):
        return ops.call(ops.quantize_fused, x, offs, *FUSED_ARGS)[4]

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, offs)
    assert not spy, "torch.compile traced the implementation instead of the op"
    assert torch.equal(got, ops.quantize_fused(x, offs, *FUSED_ARGS)[4])


def test_subclass_tensors_go_through_the_op(spy):
    x, offs = _inputs()
    ops.call(ops.quantize_fused, torch.nn.Parameter(x, requires_grad=False), offs, *FUSED_ARGS)
    assert not spy


def test_grouped_mm_eager_uses_the_fast_path(spy):
    # The sm90 backend's passes take it in eager mode (same results as before: test_grouped_mm).
    x, offs = _inputs()
    w = torch.randn(4, 64, 96, dtype=torch.bfloat16)
    mxmoe.grouped_mm(x, w.transpose(-2, -1), offs, recipe="mxfp8_rceil", backend="sm90")
    assert len(spy) == 2  # A's pass and W's pass
