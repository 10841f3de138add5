"""torch.compile(fullgraph=True, dynamic=True) of mxmoe.grouped_mm: forward AND backward traced into
graphs (no graph break: fullgraph=True raises on one), no host syncs in either graph, one compile for
several token counts, results equal to eager."""
import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import mxmoe
from mx_testutils import offsets

K, N = 64, 96
# .item() / .tolist() / data-dependent checks lower to these in an aot graph
SYNC_TARGETS = ("_local_scalar_dense", "_assert_scalar", "nonzero", "_assert_async")


class Recorder:
    """An aot_autograd backend that keeps the forward and backward graphs it is given."""

    def __init__(self):
        self.fw, self.bw = [], []

        def fw(gm, example_inputs):
            self.fw.append(gm)
            return make_boxed_func(gm.forward)

        def bw(gm, example_inputs):
            self.bw.append(gm)
            return make_boxed_func(gm.forward)

        self.backend = aot_autograd(fw_compiler=fw, bw_compiler=bw)


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _step(fn, A, W, offs, bias, dy):
    A = A.detach().clone().requires_grad_()
    W = W.detach().clone().requires_grad_()
    bias = bias.detach().clone().requires_grad_()
    y = fn(A, W.transpose(-2, -1), offs, bias)
    y.backward(dy)
    return y, A.grad, W.grad, bias.grad


def _inputs(M, sizes, G=3):
    A = torch.randn(M, K, dtype=torch.bfloat16)
    W = torch.randn(G, N, K, dtype=torch.bfloat16)
    bias = torch.randn(G, N, dtype=torch.bfloat16)
    dy = torch.randn(M, N, dtype=torch.bfloat16)
    return A, W, offsets(sizes), bias, dy


@pytest.mark.parametrize(
    "recipe,backend",
    [("mxfp8_rceil", "reference"), ("mxfp8_rceil_tile128", "emulated"), ("mxfp8_rceil_wgrad_with_hp", "emulated"),
     # the Hopper backend's graph logic (fused passes, saved FP8 operands) also runs on CPU ops
     ("mxfp8_rceil", "sm90"), ("mxfp8_rceil_tile128", "sm90")],
)
def test_compile_fullgraph_dynamic_fwd_bwd(recipe, backend):
    def fn(A, B_t, offs, bias):
        return mxmoe.grouped_mm(A, B_t, offs, recipe=recipe, backend=backend, bias=bias)

    torch._dynamo.reset()
    rec = Recorder()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=rec.backend)
    for M, sizes in [(200, [50, 0, 140]), (333, [100, 33, 7])]:
        args = _inputs(M, sizes)
        eager = _step(fn, *args)
        got = _step(compiled, *args)
        for e, g in zip(eager, got):
            assert torch.equal(e, g)
    assert len(rec.fw) == 1 and len(rec.bw) == 1, "one dynamic-shape graph pair for both token counts"
    fw, bw = _targets(rec.fw[0]), _targets(rec.bw[0])
    if backend == "sm90":  # one op per phase: the whole forward / backward of the grouped_mm
        assert any("mxmoe.sm90_" in t and "_forward" in t for t in fw)
        assert any("mxmoe.sm90_" in t and "_backward" in t for t in bw)
    else:
        assert any("mxmoe.quantize" in t for t in fw) and any("mxmoe.quantize" in t for t in bw)
    if backend == "reference":
        assert any("mxmoe.grouped_mm_mx.default" in t for t in fw)
        assert any("mxmoe.grouped_mm_mx_kgroups" in t for t in bw)
    for t in fw + bw:
        assert not any(s in t for s in SYNC_TARGETS), f"host sync in graph: {t}"


def test_compile_inductor_matches_eager():
    def fn(A, B_t, offs, bias):
        return mxmoe.grouped_mm(A, B_t, offs, backend="reference", bias=bias)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    args = _inputs(200, [50, 0, 140])
    eager = _step(fn, *args)
    got = _step(compiled, *args)
    assert torch.equal(eager[0], got[0]) and torch.equal(eager[1], got[1]) and torch.equal(eager[2], got[2])
    torch.testing.assert_close(eager[3], got[3], rtol=1e-2, atol=1e-2)  # bias grad: a reduction inductor may reorder


def test_checked_mode_survives_compilation(monkeypatch):
    # check_offsets returns nothing; it is marked side-effectful so graph DCE keeps it.
    monkeypatch.setenv("MXMOE_CHECK_OFFSETS", "1")
    torch._dynamo.reset()
    fn = torch.compile(lambda A, B_t, offs: mxmoe.grouped_mm(A, B_t, offs), fullgraph=True, dynamic=True, backend="aot_eager")
    A, W = torch.randn(64, K), torch.randn(2, N, K)
    fn(A, W.transpose(-2, -1), offsets([40, 20]))
    # A compiled graph calls torch.ops.mxmoe.check_offsets itself, so the error comes as torch shows
    # C++ errors (RuntimeError), with the core's message; eager mxmoe raises ValueError.
    with pytest.raises(RuntimeError, match=r"mxmoe\.check_offsets \(invalid argument\): offs"):
        fn(A, W.transpose(-2, -1), torch.tensor([40, 30], dtype=torch.int32))
    torch._dynamo.reset()  # the mode is read when tracing: do not leak this graph into other tests


def test_compile_prequantized_A():
    def fn(A, B_t, offs):
        return mxmoe.grouped_mm(mxmoe.quantize(A), B_t, offs)

    torch._dynamo.reset()
    A, W, offs, _, dy = _inputs(203, [50, 0, 140])
    Wc, We = W.clone().requires_grad_(), W.clone().requires_grad_()
    y = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")(A, Wc.transpose(-2, -1), offs)
    ye = fn(A, We.transpose(-2, -1), offs)
    y.backward(dy)
    ye.backward(dy)
    assert torch.equal(y, ye) and torch.equal(Wc.grad, We.grad)
