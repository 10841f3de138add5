"""The MoE kernel family as torch ops (mxmoe.ops.moe_* / swiglu*): results against plain torch on the
CPU (routing vs torch.sort(stable=True), gather vs indexing, combine vs an explicit fp32 loop over j,
SwiGLU vs the torch formula within one bf16 ulp, the SwiGLU weight grad vs the torch formula and vs
autograd of a tiny routed MoE), errors as ValueError naming the argument, opcheck on every op, a
fullgraph dynamic compile of the chain; on a GPU, CUDA equals CPU."""
import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from functorch.compile import make_boxed_func

import mxmoe  # noqa: F401  (registers torch.ops.mxmoe)
from mxmoe import ops

BF16, F32 = torch.bfloat16, torch.float32
INF = float("inf")
STANDARD = (ops.SWIGLU_CONCAT,) + ops.SWIGLU_STANDARD
GPT_OSS = (ops.SWIGLU_INTERLEAVED,) + ops.SWIGLU_GPT_OSS
PARAMS = [STANDARD, GPT_OSS, (ops.SWIGLU_CONCAT, 1.702, 7.0, 1.0), (ops.SWIGLU_INTERLEAVED, 1.0, INF, 0.0),
          (ops.SWIGLU_CONCAT, 0.5, 0.5, 0.0)]


# ---- references in plain torch ----------------------------------------------------------------------


def ref_routing(topk_idx, e):
    t, k = topk_idx.shape
    ids = topk_idx.reshape(-1).long()
    keys = torch.where((ids >= 0) & (ids < e), ids, torch.full_like(ids, e))
    _, perm = torch.sort(keys, stable=True)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    offs = torch.bincount(keys, minlength=e + 1)[:e].cumsum(0)
    return offs.int(), perm.int(), inv.view(t, k).int()


def ref_gather(x, perm, k, row_scale, out_dtype):
    """Negative entries: padding rows of zeros; others clamped into [0, T*k)."""
    src = perm.long().clamp(0, x.shape[0] * k - 1)
    v = x[src // k].float()
    if row_scale is not None:
        v = v * row_scale.reshape(-1)[src].float()[:, None]
    v[perm < 0] = 0
    return v.to(out_dtype)


def ref_combine(y, inv, w, out_dtype):
    t, k = inv.shape
    acc = torch.zeros(t, y.shape[1], dtype=F32)
    idx = inv.long().clamp(0, y.shape[0] - 1)
    for j in range(k):
        rows = y[idx[:, j]].float()
        acc = acc + (rows if w is None else w[:, j:j + 1].float() * rows)
    return acc.to(out_dtype)


def split(h, layout):
    if layout == ops.SWIGLU_CONCAT:
        return h.chunk(2, dim=-1)
    return h[..., 0::2], h[..., 1::2]


def ref_swiglu(h, layout, alpha, limit, up_offset):
    g, u = (t.float() for t in split(h, layout))
    g = g.clamp(max=limit)
    u = u.clamp(-limit, limit)
    return g * torch.sigmoid(alpha * g) * (u + up_offset)


def ulp_bf16(x):
    """One bf16 ulp at |x| (fp32 tensor)."""
    m = x.abs().clamp(min=2.0 ** -126)
    return torch.exp2(torch.floor(torch.log2(m)) - 7)


def assert_within_bf16_ulp(got, want, atol=0.0):
    """got (bf16 or f32 output) within one bf16 ulp of want (fp32 reference), NaN where want is NaN."""
    got, want = got.float(), want.float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    g, w = got[~nan], want[~nan]
    inf = torch.isinf(w)
    assert torch.equal(g[inf], w[inf])
    g, w = g[~inf], w[~inf]
    err = (g - w).abs()
    bound = torch.maximum(ulp_bf16(torch.maximum(g.abs(), w.abs())), torch.full_like(err, atol))
    assert bool((err <= bound).all()), f"max error {float((err - bound).max())} over one bf16 ulp"


# ---- routing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("t,k,e,lo,hi", [(50, 1, 4, 0, 3), (33, 8, 16, -3, 19), (64, 2, 1, 0, 0), (40, 2, 8, 5, 5),
                                         (0, 4, 5, 0, 4), (7, 3, 1 << 20, -2, (1 << 20) + 2)])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_routing_matches_stable_sort(t, k, e, lo, hi, dtype):
    topk = torch.randint(lo, hi + 1, (t, k), dtype=dtype)
    offs, perm, inv = ops.moe_routing(topk, e)
    for got, want in zip((offs, perm, inv), ref_routing(topk, e)):
        assert got.dtype == torch.int32
        assert torch.equal(got, want)


def test_routing_from_topk():
    # The usual producer: torch.topk of router logits (int64 indices), all experts used.
    logits = torch.randn(128, 16)
    _, idx = torch.topk(logits, 4, dim=-1)
    offs, perm, inv = ops.moe_routing(idx, 16)
    assert int(offs[-1]) == 128 * 4
    counts = torch.bincount(idx.reshape(-1), minlength=16)
    assert torch.equal(offs, counts.cumsum(0).int())
    # perm and inv are inverse permutations, and the sorted keys are non-decreasing.
    assert torch.equal(perm[inv.reshape(-1).long()], torch.arange(512, dtype=torch.int32))
    keys = idx.reshape(-1)[perm.long()]
    assert bool((keys[1:] >= keys[:-1]).all())


# ---- gather / combine ---------------------------------------------------------------------------------


@pytest.mark.parametrize("h", [48, 13])
@pytest.mark.parametrize("x_dtype", [BF16, F32])
@pytest.mark.parametrize("out_dtype", [BF16, F32])
@pytest.mark.parametrize("scale_dtype", [None, F32, BF16])
def test_gather_matches_indexing(h, x_dtype, out_dtype, scale_dtype):
    t, k = 9, 3
    x = torch.randn(t, h, dtype=x_dtype)
    perm = torch.randperm(t * k, dtype=torch.int32)
    perm[1], perm[-1] = -4, 10 ** 6  # a padding row (zeros); clamped into [0, T*k)
    scale = None if scale_dtype is None else torch.rand(t, k, dtype=scale_dtype)
    out = ops.moe_gather(x, perm, k, scale, out_dtype)
    assert out.dtype == out_dtype and out.shape == (t * k, h)
    assert torch.equal(out, ref_gather(x, perm, k, scale, out_dtype))


@pytest.mark.parametrize("h", [32, 7])
@pytest.mark.parametrize("y_dtype", [BF16, F32])
@pytest.mark.parametrize("out_dtype", [BF16, F32])
@pytest.mark.parametrize("w_dtype", [None, F32, BF16])
def test_combine_matches_fp32_loop(h, y_dtype, out_dtype, w_dtype):
    t, k = 11, 4
    y = torch.randn(t * k, h, dtype=y_dtype)
    inv = torch.randint(-2, t * k + 2, (t, k), dtype=torch.int32)
    w = None if w_dtype is None else torch.rand(t, k, dtype=w_dtype)
    out = ops.moe_combine(y, inv, w, out_dtype)
    assert torch.equal(out, ref_combine(y, inv, w, out_dtype))


def test_gather_padded_rows():
    # perm longer than T*k with -1 padding rows (the tile128 layer's 16-aligned groups).
    x = torch.randn(5, 16)
    perm = torch.tensor([3, -1, -1, 0, 9, -1, 2, 1], dtype=torch.int32)
    out = ops.moe_gather(x, perm, 2, None, F32)
    assert out.shape == (8, 16)
    for r, p in enumerate(perm.tolist()):
        assert torch.equal(out[r], torch.zeros(16) if p < 0 else x[p // 2])


def test_round_trip_through_routing():
    # route -> gather -> identity experts -> combine with weights summing to 1 gives x back (fp32).
    t, k, e, h = 64, 4, 8, 16
    x = torch.randn(t, h)
    idx = torch.randint(0, e, (t, k))
    w = torch.full((t, k), 0.25)
    offs, perm, inv = ops.moe_routing(idx, e)
    xs = ops.moe_gather(x, perm, k, None, F32)
    out = ops.moe_combine(xs, inv, w, F32)
    torch.testing.assert_close(out, x, rtol=1e-6, atol=1e-6)
    # dispatch^T: combine without weights sums the k copies.
    torch.testing.assert_close(ops.moe_combine(xs, inv, None, F32), 4 * x)


def test_weight_grad_and_group_sum():
    t, k, h = 13, 3, 100
    dout, y = torch.randn(t, h), torch.randn(t * k, h, dtype=BF16)
    inv = torch.randperm(t * k, dtype=torch.int32).view(t, k)
    dw = ops.moe_combine_weight_grad(dout, y, inv)
    assert dw.dtype == F32 and dw.shape == (t, k)
    want = (dout[:, None, :].double() * y[inv.long()].double()).sum(-1)
    torch.testing.assert_close(dw.double(), want, rtol=1e-5, atol=1e-5)
    offs = torch.tensor([5, 5, 20, 39], dtype=torch.int32)
    s = ops.moe_group_sum(y, offs)
    bounds = [0, 5, 5, 20, 39]
    want = torch.stack([y[a:b].double().sum(0) for a, b in zip(bounds[:-1], bounds[1:])])
    assert s.dtype == F32 and s.shape == (4, h)
    torch.testing.assert_close(s.double(), want, rtol=1e-5, atol=1e-5)


def ref_swiglu_weight_grad(dy, h, inv, layout, alpha, limit, up_offset):
    """dw[t, j] = <dy[r], swiglu(h[r])>, r = inv[t, j] clamped into [0, N), in float64 of the fp32 act."""
    r = inv.long().clamp(0, dy.shape[0] - 1)
    act = ref_swiglu(h, layout, alpha, limit, up_offset)  # fp32
    return (dy.double()[r] * act.double()[r]).sum(-1)


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("dy_dtype", [BF16, F32])
@pytest.mark.parametrize("i", [40, 7])
def test_swiglu_weight_grad_matches_torch_formula(params, dy_dtype, i):
    layout, alpha, limit, up = params
    t, k, n = 9, 3, 30  # n > t*k: padded rows nobody points at
    dy = torch.randn(n, i, dtype=dy_dtype)
    h = (torch.randn(n, 2 * i) * 3).to(BF16)
    if limit != INF:
        h[0, :4] = torch.tensor([limit, -limit, 1.5 * limit, -1.5 * limit])
    inv = torch.randint(-2, n + 2, (t, k), dtype=torch.int32)  # clamped into [0, N)
    dw = ops.moe_swiglu_weight_grad(dy, h, inv, layout, alpha, limit, up)
    assert dw.dtype == F32 and dw.shape == (t, k)
    want = ref_swiglu_weight_grad(dy, h, inv, layout, alpha, limit, up)
    scale = (dy.double()[inv.long().clamp(0, n - 1)].abs() * 50).sum(-1)  # |act| <~ 50 (h ~ 3 sigma 4)
    assert bool(((dw.double() - want).abs() <= 1e-5 * (1 + scale)).all()), (dw, want)


def test_swiglu_weight_grad_nan_and_empty():
    dy, h = torch.randn(4, 8), torch.randn(4, 16, dtype=BF16)
    h[1, 3] = float("nan")
    dy[2, 0] = float("nan")
    dw = ops.moe_swiglu_weight_grad(dy, h, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), *GPT_OSS)
    assert torch.equal(torch.isnan(dw), torch.tensor([[False, True], [True, False]]))
    empty = ops.moe_swiglu_weight_grad(torch.randn(0, 8), torch.randn(0, 16, dtype=BF16),
                                       torch.zeros(0, 2, dtype=torch.int32), *STANDARD)
    assert empty.shape == (0, 2) and empty.dtype == F32
    zero_i = ops.moe_swiglu_weight_grad(torch.randn(6, 0), torch.randn(6, 0, dtype=BF16),
                                        torch.arange(6, dtype=torch.int32).view(3, 2), *STANDARD)
    assert torch.equal(zero_i, torch.zeros(3, 2))


def _tiny_moe(params, device, bias):
    """A tiny routed SwiGLU MoE in plain torch: returns (autograd d loss / d w, the same from
    moe_swiglu_weight_grad on dy = dO' W2 and the saved bf16 pre-activation, + the caller's bias term)."""
    layout, alpha, limit, up = params
    t, k, e, hd, i = 12, 2, 3, 16, 24
    x = torch.randn(t, hd, device=device)
    topk = torch.stack([torch.randperm(e)[:k] for _ in range(t)]).to(device)
    w = torch.rand(t, k, device=device, requires_grad=True)
    w1 = torch.randn(e, 2 * i, hd, device=device) / hd ** 0.5
    w2 = torch.randn(e, hd, i, device=device) / i ** 0.5
    b2 = torch.randn(e, hd, device=device) if bias else torch.zeros(e, hd, device=device)
    dout = torch.randn(t, hd, device=device)
    offs, perm, inv = ops.moe_routing(topk, e)
    tok = perm.long() // k                      # token of each routed row
    ex = topk.reshape(-1)[perm.long()].long()   # expert of each routed row
    h = torch.einsum("nh,nch->nc", x[tok], w1[ex]).to(BF16)  # saved pre-activation (bf16)
    o = torch.einsum("ni,nhi->nh", ref_swiglu(h, layout, alpha, limit, up), w2[ex]) + b2[ex]
    out = (w[:, :, None] * o[inv.long()]).sum(1)
    (out * dout).sum().backward()
    dy = torch.einsum("nh,nhi->ni", dout[tok], w2[ex])  # dO' W2: the down projection's dgrad, unweighted
    dw = ops.moe_swiglu_weight_grad(dy, h, inv, layout, alpha, limit, up)
    dw = dw + (dout[:, None, :] * b2[ex][inv.long()]).sum(-1)  # <dout[t], b2[e]>: the caller's term
    return w.grad, dw


@pytest.mark.parametrize("params", [STANDARD, GPT_OSS, (ops.SWIGLU_CONCAT, 0.5, 0.75, -0.25)])
@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_weight_grad_is_the_routing_weight_gradient(params, bias):
    want, got = _tiny_moe(params, "cpu", bias)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ---- SwiGLU -----------------------------------------------------------------------------------------


def swiglu_input(n, i2, dtype, limit):
    h = torch.randn(n, i2) * 4
    if limit != INF:
        h[0, :4] = torch.tensor([limit, -limit, 1.5 * limit, -1.5 * limit])
    h[1, :3] = torch.tensor([0.0, float("nan"), INF])
    return h.to(dtype)


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_swiglu_matches_torch_formula(params, dtype):
    layout, alpha, limit, up = params
    h = swiglu_input(16, 64, dtype, limit)
    y = ops.swiglu(h, layout, alpha, limit, up)
    assert y.dtype == dtype and y.shape == (16, 32)
    assert_within_bf16_ulp(y, ref_swiglu(h, layout, alpha, limit, up))


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_swiglu_backward_matches_autograd(params, dtype):
    layout, alpha, limit, up = params
    h = swiglu_input(16, 64, dtype, limit)
    h[1, :3] = 1.0  # autograd of the torch formula masks NaN under a finite clamp; the op keeps it (C++ test)
    dy = torch.randn(16, 32, dtype=dtype)
    dh = ops.swiglu_backward(dy, h, layout, alpha, limit, up)
    assert dh.dtype == dtype and dh.shape == h.shape
    hf = h.float().requires_grad_()
    ref_swiglu(hf, layout, alpha, limit, up).backward(dy.float())
    # Where g's slope s + z s (1 - s) cancels, fp32 differences of the two formulas are absolute.
    assert_within_bf16_ulp(dh, hf.grad, atol=1e-5)


# ---- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,arg",
    [
        (lambda: ops.moe_routing(torch.zeros(4, 2), 4), "topk_idx"),
        (lambda: ops.moe_routing(torch.zeros(4, 2, dtype=torch.int32), 0), "num_experts"),
        (lambda: ops.moe_routing(torch.zeros(8, dtype=torch.int32), 4), "topk_idx"),
        (lambda: ops.moe_gather(torch.randn(4, 8), torch.arange(6, dtype=torch.int32).view(2, 3), 2, None, F32),
         "perm"),
        (lambda: ops.moe_gather(torch.randn(4, 8), torch.arange(8), 2, None, F32), "perm"),
        (lambda: ops.moe_gather(torch.randn(4, 8), torch.arange(8, dtype=torch.int32), 2, torch.ones(4, 3), F32),
         "row_scale"),
        (lambda: ops.moe_gather(torch.randn(4, 8), torch.arange(8, dtype=torch.int32), 2, None, torch.int32), "out"),
        (lambda: ops.moe_combine(torch.randn(8, 4), torch.zeros(4, 2, dtype=torch.int32), torch.ones(2, 2), F32),
         "weights"),
        (lambda: ops.moe_combine(torch.randn(8, 4, 1), torch.zeros(4, 2, dtype=torch.int32), None, F32), "y"),
        (lambda: ops.moe_combine_weight_grad(torch.randn(4, 8), torch.randn(8, 6), torch.zeros(4, 2, dtype=torch.int32)),
         "y"),
        (lambda: ops.moe_group_sum(torch.randn(8, 4), torch.tensor([3, 8])), "offs"),
        (lambda: ops.moe_swiglu_weight_grad(torch.randn(4, 8), torch.randn(4, 16), torch.zeros(2, 2, dtype=torch.int32),
                                            *STANDARD), "h"),
        (lambda: ops.moe_swiglu_weight_grad(torch.randn(4, 8), torch.randn(4, 8, dtype=BF16),
                                            torch.zeros(2, 2, dtype=torch.int32), *STANDARD), "h"),
        (lambda: ops.moe_swiglu_weight_grad(torch.randn(4, 8), torch.randn(4, 16, dtype=BF16),
                                            torch.zeros(2, 2, dtype=torch.int64), *STANDARD), "inv"),
        (lambda: ops.moe_swiglu_weight_grad(torch.randn(4, 8).int(), torch.randn(4, 16, dtype=BF16),
                                            torch.zeros(2, 2, dtype=torch.int32), *STANDARD), "dy"),
        (lambda: ops.moe_swiglu_weight_grad(torch.randn(4, 8), torch.randn(4, 16, dtype=BF16),
                                            torch.zeros(2, 2, dtype=torch.int32), 2, 1.0, INF, 0.0), "layout"),
        (lambda: ops.moe_swiglu_weight_grad(torch.randn(4, 8), torch.randn(4, 16, dtype=BF16),
                                            torch.zeros(2, 2, dtype=torch.int32), 0, 1.0, float("nan"), 0.0), "limit"),
        (lambda: ops.moe_swiglu_weight_grad(torch.randn(4, 8), torch.randn(4, 16, dtype=BF16),
                                            torch.zeros(2, 2, dtype=torch.int32), 0, 1.0, INF, float("nan")),
         "up_offset"),
        (lambda: ops.swiglu(torch.randn(4, 7), 0, 1.0, INF, 0.0), "h"),
        (lambda: ops.swiglu(torch.randn(4, 8), 2, 1.0, INF, 0.0), "layout"),
        (lambda: ops.swiglu(torch.randn(4, 8), 0, 1.0, -1.0, 0.0), "limit"),
        (lambda: ops.swiglu(torch.randn(4, 8), 0, float("nan"), INF, 0.0), "alpha"),
        (lambda: ops.swiglu_backward(torch.randn(4, 3), torch.randn(4, 8), 0, 1.0, INF, 0.0), "dy"),
    ],
)
def test_errors_name_the_argument(call, arg):
    with pytest.raises(ValueError, match=rf"^mxmoe\.\w+: {arg}: expected .*got"):
        call()


# ---- opcheck ----------------------------------------------------------------------------------------


def _opcheck_cases():
    t, k, e, h = 6, 2, 4, 16
    idx = torch.randint(-1, e + 1, (t, k), dtype=torch.int32)
    perm = torch.randperm(t * k, dtype=torch.int32)
    inv = torch.randperm(t * k, dtype=torch.int32).view(t, k)
    x, y = torch.randn(t, h, dtype=BF16), torch.randn(t * k, h)
    w = torch.rand(t, k)
    return [
        ("moe_routing", (idx, e)),
        ("moe_routing", (idx.long(), e)),
        ("moe_gather", (x, perm, k, None, BF16)),
        ("moe_gather", (x, perm, k, w, F32)),
        ("moe_combine", (y, inv, w, BF16)),
        ("moe_combine", (y, inv, None, F32)),
        ("moe_combine_weight_grad", (torch.randn(t, h), y, inv)),
        ("moe_swiglu_weight_grad", (y, torch.randn(t * k, 2 * h, dtype=BF16), inv, 1, 1.702, 7.0, 1.0)),
        ("moe_swiglu_weight_grad", (y.to(BF16), torch.randn(t * k, 2 * h, dtype=BF16), inv, 0, 1.0, INF, 0.0)),
        ("moe_group_sum", (y, torch.tensor([3, 3, 10], dtype=torch.int32))),
        ("swiglu", (torch.randn(5, 32, dtype=BF16), 0, 1.0, INF, 0.0)),
        ("swiglu", (torch.randn(5, 32), 1, 1.702, 7.0, 1.0)),
        ("swiglu_backward", (torch.randn(5, 16, dtype=BF16), torch.randn(5, 32, dtype=BF16), 1, 1.702, 7.0, 1.0)),
    ]


@pytest.mark.parametrize("name,args", _opcheck_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_opcheck(name, args):
    torch.library.opcheck(getattr(torch.ops.mxmoe, name).default, args)


def test_compile_fullgraph_dynamic_no_sync():
    """routing -> gather -> swiglu -> combine traced in one graph, no host sync, one compile for several T."""
    graphs = []

    def fw(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def layer(x, idx, w):
        offs, perm, inv = ops.moe_routing.op(idx, 8)
        xs = ops.moe_gather.op(x, perm, idx.shape[1], None, F32)
        hs = ops.swiglu.op(xs, 1, 1.702, 7.0, 1.0)
        return ops.moe_combine.op(hs, inv, w, F32), offs

    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend=aot_autograd(fw_compiler=fw))
    for t in (16, 24, 40):
        x, idx, w = torch.randn(t, 32), torch.randint(0, 8, (t, 2)), torch.rand(t, 2)
        got, want = compiled(x, idx, w), layer(x, idx, w)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(graphs) <= 2  # one dynamic graph (a recompile for the first size change at most)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert not any(s in t for t in targets for s in ("_local_scalar_dense", "nonzero", "_assert_async"))


# ---- CUDA == CPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_cuda_matches_cpu(dtype):
    t, k, e, h = 257, 4, 16, 136
    idx = torch.randint(-1, e + 1, (t, k))
    x = torch.randn(t, h, dtype=dtype)
    w = torch.rand(t, k)
    cpu = ops.moe_routing(idx, e)
    gpu = ops.moe_routing(idx.cuda(), e)
    for a, b in zip(cpu, gpu):
        assert torch.equal(a, b.cpu())
    offs, perm, inv = cpu
    xs = ops.moe_gather(x, perm, k, w, dtype)
    assert torch.equal(ops.moe_gather(x.cuda(), perm.cuda(), k, w.cuda(), dtype).cpu(), xs)
    out = ops.moe_combine(xs, inv, w, dtype)
    assert torch.equal(ops.moe_combine(xs.cuda(), inv.cuda(), w.cuda(), dtype).cpu(), out)
    dout = torch.randn(t, h, dtype=dtype)
    dw = ops.moe_combine_weight_grad(dout, xs, inv)
    assert torch.equal(ops.moe_combine_weight_grad(dout.cuda(), xs.cuda(), inv.cuda()).cpu(), dw)
    gs = ops.moe_group_sum(xs, offs)
    assert torch.equal(ops.moe_group_sum(xs.cuda(), offs.cuda()).cpu(), gs)
    for layout, alpha, limit, up in PARAMS:
        hh = swiglu_input(64, 2 * h, dtype, limit)
        y = ops.swiglu(hh, layout, alpha, limit, up)
        assert_within_bf16_ulp(ops.swiglu(hh.cuda(), layout, alpha, limit, up).cpu(), y.float())
        dy = torch.randn(64, h, dtype=dtype)
        dh = ops.swiglu_backward(dy, hh, layout, alpha, limit, up)
        assert_within_bf16_ulp(ops.swiglu_backward(dy.cuda(), hh.cuda(), layout, alpha, limit, up).cpu(), dh.float(),
                               atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("dy_dtype", [BF16, F32])
@pytest.mark.parametrize("i", [256, 40, 13])
def test_cuda_swiglu_weight_grad(params, dy_dtype, i):
    # CUDA equals the CPU up to act terms whose host and device expf differ by an fp32 ulp (moe.h), and
    # the torch formula within fp32 rounding; NaN where a row holds one. Aligned and offset views.
    layout, alpha, limit, up = params
    t, k, n = 300, 4, 1203
    dy = torch.randn(n, i, dtype=dy_dtype)
    h = swiglu_input(n, 2 * i, BF16, limit)  # row 1 holds a NaN
    inv = torch.randint(-2, n + 2, (t, k), dtype=torch.int32)
    inv[0, 0] = 1
    cpu = ops.moe_swiglu_weight_grad(dy, h, inv, layout, alpha, limit, up)
    for off in (0, 1):  # off 1: 2- or 4-byte shifted data (the kernel's scalar path)
        dyc = torch.empty(n * i + off, dtype=dy_dtype, device="cuda")[off:].view(n, i).copy_(dy)
        hc = torch.empty(n * 2 * i + off, dtype=BF16, device="cuda")[off:].view(n, 2 * i).copy_(h)
        gpu = ops.moe_swiglu_weight_grad(dyc, hc, inv.cuda(), layout, alpha, limit, up).cpu()
        assert torch.equal(torch.isnan(gpu), torch.isnan(cpu)) and bool(torch.isnan(cpu[0, 0]))
        scale = (dy.double()[inv.long().clamp(0, n - 1)].abs() * ref_swiglu(h, layout, alpha, limit, up).double()
                 .nan_to_num(0, 0, 0)[inv.long().clamp(0, n - 1)].abs()).sum(-1)
        ok = ~torch.isnan(cpu)
        assert bool(((gpu.double() - cpu.double()).abs()[ok] <= 4e-6 * (1 + scale[ok])).all())
        # a second call gives the same bits (deterministic)
        again = ops.moe_swiglu_weight_grad(dyc, hc, inv.cuda(), layout, alpha, limit, up).cpu()
        assert torch.equal(again.view(torch.int32), gpu.view(torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("params", [STANDARD, GPT_OSS])
def test_cuda_swiglu_weight_grad_is_the_routing_weight_gradient(params):
    want, got = _tiny_moe(params, "cuda", True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_cuda_graph_capture():
    t, k, e, h = 64, 2, 8, 32
    idx, x, w = torch.randint(0, e, (t, k), device="cuda"), torch.randn(t, h, device="cuda"), torch.rand(t, k, device="cuda")

    def step():
        offs, perm, inv = ops.moe_routing(idx, e)
        xs = ops.moe_gather(x, perm, k, None, F32)
        return ops.moe_combine(xs, inv, w, F32)

    want = step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("out_dtype,bias_dtype", [(BF16, BF16), (F32, F32), (BF16, F32)])
def test_add_group_bias_is_the_fp32_sum_rounded_once(device, out_dtype, bias_dtype):
    """The layers' expert-bias add (backends/common.add_group_bias): out + bias[g] on group g's rows,
    summed in fp32 and rounded once to out's dtype (its one-pass same-dtype form included), rows past the
    groups and empty groups as the offsets say; written out here as a loop over the groups."""
    from mxmoe.backends.common import add_group_bias

    g = torch.Generator().manual_seed(3)
    out = (torch.randn(1000, 96, generator=g) * torch.logspace(-3, 3, 96)).to(out_dtype)
    out[900:] = 0
    bias = (torch.randn(7, 96, generator=g) * 10).to(bias_dtype)
    ends = [100, 100, 250, 500, 600, 700, 900]
    want = out.float().clone()
    start = 0
    for e, end in enumerate(ends):
        want[start:end] += bias[e].float()
        start = end
    want = want.to(out_dtype)
    got = add_group_bias(out.to(device), bias.to(device), torch.tensor(ends, dtype=torch.int32, device=device))
    assert got.dtype == out_dtype
    assert torch.equal(got.cpu(), want)
