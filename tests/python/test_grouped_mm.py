"""mxmoe.grouped_mm: accuracy against the bf16 autograd reference (MX_SPEC.md bars) for every recipe
and backend with jagged and empty groups, agreement of the backends, bias, pre-quantized A, layouts,
checked mode and clear errors."""
import pytest
import torch

import mxmoe
from mx_testutils import BACKEND_NAMES, RECIPE_NAMES, offsets, reference_grouped_mm, rel_err, sqnr

K, N = 64, 96
GROUPS = {
    1: [77],  # one group, not a multiple of 32, rows left after it
    3: [50, 0, 140],  # an empty group in the middle
    8: [0, 17, 40, 3, 0, 64, 31, 33],  # jagged, empty first group
}
M = 203  # not a multiple of 4 (torch._grouped_mm alignment) nor of 32


def _problem(G, dtype=torch.bfloat16, bias=False):
    A = torch.randn(M, K, dtype=dtype)
    W = torch.randn(G, N, K, dtype=dtype) / K**0.5  # contiguous (G, N, K) expert weights
    b = torch.randn(G, N, dtype=dtype) if bias else None
    return A, W, offsets(GROUPS[G]), b


def _run(A, W, offs, dy, bias=None, **kw):
    A = A.detach().clone().requires_grad_()
    W = W.detach().clone().requires_grad_()
    if bias is not None:
        bias = bias.detach().clone().requires_grad_()
    y = mxmoe.grouped_mm(A, W.transpose(-2, -1), offs, bias=bias, **kw)
    y.backward(dy.to(y.dtype))
    return y, A.grad, W.grad, (bias.grad if bias is not None else None)


@pytest.mark.parametrize("G", sorted(GROUPS))
@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_sqnr_vs_bf16_reference(recipe, backend, G):
    A, W, offs, _ = _problem(G)
    dy = torch.randn(M, N, dtype=torch.bfloat16)
    ref, ref_dA, ref_dB, _ = reference_grouped_mm(A, W.transpose(-2, -1), offs, dy)
    y, dA, dW, _ = _run(A, W, offs, dy, recipe=recipe, backend=backend)
    assert y.dtype == torch.bfloat16 and y.shape == (M, N)
    assert dA.dtype == A.dtype and dW.dtype == W.dtype and dW.shape == W.shape
    end = int(offs[-1])
    assert torch.all(y[end:] == 0) and torch.all(dA[end:] == 0)
    assert sqnr(y, ref) >= 27, "forward"
    assert sqnr(dA, ref_dA) >= 25, "input grad"
    assert sqnr(dW, ref_dB.transpose(-2, -1)) >= 24, "weight grad"
    for g in range(G):  # empty groups give zero weight grads
        if GROUPS[G][g] == 0:
            assert torch.all(dW[g] == 0)


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_reference_and_emulated_agree(recipe):
    # Same core quantization, then the core's MX GEMM vs torch._grouped_mm on the dequantized values:
    # equal up to fp32 summation order (MX_SPEC: relative Frobenius error <= 1e-5 for fp32 output).
    A, W, offs, bias = _problem(8, dtype=torch.float32, bias=True)
    dy = torch.randn(M, N)
    outs = [_run(A, W, offs, dy, bias, recipe=recipe, backend=be, out_dtype=torch.float32) for be in BACKEND_NAMES]
    for x, y in zip(outs[0], outs[1]):
        assert x.dtype == torch.float32
        assert rel_err(x, y) <= 1e-5


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_bias_forward_exact_and_grad(backend):
    A, W, offs, bias = _problem(3, dtype=torch.float32, bias=True)
    kw = dict(backend=backend, out_dtype=torch.float32)
    y0 = mxmoe.grouped_mm(A, W.transpose(-2, -1), offs, **kw)
    y1 = mxmoe.grouped_mm(A, W.transpose(-2, -1), offs, bias=bias, **kw)
    # The bias is added once, in fp32, to the fp32 accumulator of its group's rows only.
    gid = torch.searchsorted(offs.long(), torch.arange(M), right=True)
    expect = y0.clone()
    valid = gid < 3
    expect[valid] = y0[valid] + bias[gid[valid]]
    assert torch.equal(y1, expect)
    # Integer operands (|v| <= 3) quantize losslessly and their products sum exactly in fp32, so the MX
    # GEMM is exact and out_with_bias - out_without_bias == bias per group, bit for bit.
    Ai = torch.randint(-3, 4, (M, K)).float()
    Wi = torch.randint(-3, 4, (3, N, K)).float()
    ib = torch.randint(-100, 101, (3, N)).float()
    z0 = mxmoe.grouped_mm(Ai, Wi.transpose(-2, -1), offs, **kw)
    z1 = mxmoe.grouped_mm(Ai, Wi.transpose(-2, -1), offs, bias=ib, **kw)
    exact = torch.zeros(M, N, dtype=torch.float64)
    for g, (s, e) in enumerate([(0, 50), (50, 50), (50, 190)]):
        exact[s:e] = Ai[s:e].double() @ Wi[g].double().t()
    assert torch.equal(z0.double(), exact)
    assert torch.equal((z1 - z0)[valid], ib[gid[valid]]) and torch.all(z1[~valid] == 0)
    # bias grad: per-group sum of dY over the group's rows
    dy = torch.randn(M, N)
    _, _, _, dbias = _run(A, W, offs, dy, bias, **kw)
    ref = torch.stack([dy[s:e].sum(0) for s, e in zip([0, 50, 50], [50, 50, 190])])
    assert dbias.dtype == bias.dtype
    torch.testing.assert_close(dbias, ref, rtol=1e-5, atol=1e-5)
    assert torch.all(dbias[1] == 0)


def test_bias_bf16_and_accuracy():
    A, W, offs, bias = _problem(3, bias=True)
    dy = torch.randn(M, N, dtype=torch.bfloat16)
    ref, _, _, ref_dbias = reference_grouped_mm(A, W.transpose(-2, -1), offs, dy, bias)
    y, dA, dW, dbias = _run(A, W, offs, dy, bias)
    assert sqnr(y, ref) >= 27 and sqnr(dbias, ref_dbias) >= 40 and dbias.dtype == torch.bfloat16


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_prequantized_A(backend):
    A, W, offs, _ = _problem(3)
    B_t = W.transpose(-2, -1)
    y_hp = mxmoe.grouped_mm(A, B_t, offs, backend=backend)
    mx = mxmoe.quantize(A, dim=-1, mode="rceil")
    Wl = W.clone().requires_grad_()
    y_mx = mxmoe.grouped_mm(mx, Wl.transpose(-2, -1), offs, backend=backend)
    assert torch.equal(y_hp, y_mx)  # same quantization of A as the hp path's forward
    dy = torch.randn(M, N, dtype=torch.bfloat16)
    y_mx.backward(dy)
    _, _, ref_dB, _ = reference_grouped_mm(A, B_t, offs, dy)
    assert sqnr(Wl.grad, ref_dB.transpose(-2, -1)) >= 24
    with pytest.raises(ValueError, match="A: expected an MXTensor of a 2D"):
        mxmoe.grouped_mm(mxmoe.quantize(A[:192], dim=-2), B_t, offs)


def test_weight_layouts_and_stride0_grad():
    A, W, offs, _ = _problem(3)
    y_t = mxmoe.grouped_mm(A, W.transpose(-2, -1), offs)
    y_c = mxmoe.grouped_mm(A, W.transpose(-2, -1).contiguous(), offs)  # a contiguous (G, K, N) B_t
    assert torch.equal(y_t, y_c)
    Wl = W.clone().requires_grad_()
    Al = A.clone().requires_grad_()
    mxmoe.grouped_mm(Al, Wl.transpose(-2, -1), offs).sum().backward()  # expanded (stride-0) grad
    assert torch.isfinite(Wl.grad).all() and torch.isfinite(Al.grad).all()
    # the grad of B_t has the layout of B_t (a transposed view of a (G, N, K) tensor)
    Bl = W.transpose(-2, -1).clone().requires_grad_()
    mxmoe.grouped_mm(A, Bl, offs, backend="reference").sum().backward()
    assert Bl.grad.shape == Bl.shape


def test_no_grad_and_out_dtype():
    A, W, offs, _ = _problem(1)
    with torch.no_grad():
        y = mxmoe.grouped_mm(A, W.transpose(-2, -1), offs, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and not y.requires_grad


def test_checked_mode(monkeypatch):
    A, W, offs, _ = _problem(3)
    bad = torch.tensor([50, 40, 140], dtype=torch.int32)  # decreasing
    past = torch.tensor([50, 50, M + 1], dtype=torch.int32)  # past M
    # unchecked: bad offsets never read out of bounds; they are clamped (decreasing -> empty group)
    y = mxmoe.grouped_mm(A, W.transpose(-2, -1), bad, backend="reference")
    y_ok = mxmoe.grouped_mm(A, W.transpose(-2, -1), torch.tensor([50, 50, 140], dtype=torch.int32), backend="reference")
    assert torch.equal(y, y_ok)
    assert torch.isfinite(mxmoe.grouped_mm(A, W.transpose(-2, -1), past)).all()
    for o in (bad, past):
        with pytest.raises(ValueError, match="offs"):
            mxmoe.check_offsets(o, M)
    mxmoe.check_offsets(offs, M)
    monkeypatch.setenv("MXMOE_CHECK_OFFSETS", "1")
    for o in (bad, past):
        with pytest.raises(ValueError, match="offs"):
            mxmoe.grouped_mm(A, W.transpose(-2, -1), o)
    mxmoe.grouped_mm(A, W.transpose(-2, -1), offs)


def test_clear_errors():
    A, W, offs, bias = _problem(3, bias=True)
    B_t = W.transpose(-2, -1)
    cases = [
        (dict(A=A.half()), "A: expected dtype bfloat16 or float32, got float16"),
        (dict(A=A[None]), r"A: expected 2 dims \(M, K\), got shape \(1, 203, 64\)"),
        (dict(A=A.to("meta")), "A: expected a cpu or cuda tensor, got a tensor on device 'meta'"),
        (dict(B_t=W), r"B_t: expected shape \(G, K=64, N\) matching A's K: pass W.transpose\(-2, -1\)"),
        (dict(B_t=B_t[0]), r"B_t: expected 3 dims \(G, K, N\)"),
        (dict(B_t=B_t.to(torch.float16)), "B_t: expected dtype bfloat16 or float32, got float16"),
        (dict(B_t=B_t.to("meta")), "B_t: expected device cpu .A's., got meta"),
        (dict(A=A[:, :48], B_t=B_t[:, :48]), "A: expected K .dim 1. to be a multiple of 32, got 48"),
        (dict(B_t=B_t[:, :, :40]), "B_t: expected N .dim 2. to be a multiple of 32, got 40"),
        (dict(offs=offs.long()), "offs: expected a 1-D int32 tensor"),
        (dict(offs=offs[None]), "offs: expected a 1-D int32 tensor"),
        (dict(offs=offs[:2]), r"offs: expected shape \(3,\) \(one end per group of B_t\), got \(2,\)"),
        (dict(offs=offs.to("meta")), "offs: expected device cpu"),
        (dict(bias=bias[:2]), r"bias: expected shape \(3, 96\), got \(2, 96\)"),
        (dict(bias=bias.half()), "bias: expected a bfloat16 or float32 tensor"),
        (dict(out_dtype=torch.float16), "out_dtype: expected torch.bfloat16 or torch.float32"),
        (dict(recipe="fp8"), "recipe: expected one of mxfp8_rceil"),
        (dict(backend="cuda"), "backend: expected 'auto' or one of"),
        (dict(A=[1, 2]), "A: expected a torch.Tensor or an MXTensor, got list"),
    ]
    for override, msg in cases:
        args = dict(A=A, B_t=B_t, offs=offs)
        kw = {}
        for k, v in override.items():
            (args if k in args else kw)[k] = v
        with pytest.raises(ValueError, match=msg):
            mxmoe.grouped_mm(args["A"], args["B_t"], args["offs"], **kw)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("m,sizes", [(64, [0]), (64, [0, 0, 0]), (0, [0, 0])])
def test_all_groups_empty_and_no_tokens(backend, m, sizes):
    A = torch.randn(m, K, requires_grad=True)
    W = torch.randn(len(sizes), N, K, requires_grad=True)
    y = mxmoe.grouped_mm(A, W.transpose(-2, -1), offsets(sizes), backend=backend)
    y.sum().backward()
    assert y.shape == (m, N) and torch.all(y == 0) and torch.all(A.grad == 0) and torch.all(W.grad == 0)
