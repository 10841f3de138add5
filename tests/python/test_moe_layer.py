"""The fused MoE expert layer (mxmoe.moe_experts, mxmoe.nn.MoEExperts).

Every path (tile128, exact, bf16, composed) against an fp32 composition of plain torch ops written
here (a loop over experts: index, matmul, SwiGLU, weighted index_add), at SQNR bars; the fused exact
and tile128 paths bit-identical to the same layer built from mxmoe.grouped_mm (the composed path on the
sm90 backend); routing edge cases; bad input; determinism; torch.compile and CUDA graphs. The phase
ops run on CPU too (the core's reference kernels), so CI covers the fused logic; the GPU runs the
same tests on the H200 kernels."""
import math
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mxmoe
from mxmoe.moe import Swiglu
from mx_testutils import sqnr

BF16 = torch.bfloat16
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
TILE, EXACT = "mxfp8_rceil_tile128", "mxfp8_rceil"
# SQNR bars (dB: output, input grads, weight grads) for the whole layer against fp32: two chained
# GEMMs with four quantized operands each way (MX_SPEC's per-GEMM bars are 27 / 25 / 24). Measured
# on these inputs: 23.3-24.9 dB for rceil and tile128 (FLOOR about 1.4 dB less); a wrong scale or
# a misrouted row costs far more.
BARS = {TILE: (22, 21.5, 21.5), EXACT: (22, 21.5, 21.5), "mxfp8_floor": (21, 20.5, 20.5),
        "mxfp8_rceil_wgrad_with_hp": (22, 21.5, 21.5)}


def _fused_ok(device):
    if device == "cpu":
        return True
    return torch.cuda.get_device_capability() == (9, 0) and mxmoe.build_info()["tile128_gemm"]


def _bf16_gather_on(monkeypatch, device, pieces=mxmoe.backends.BF16_GATHER_PIECES):
    """The bf16 layer's gather GEMMs `pieces` on for the device's backend (skips where they cannot run)."""
    if not _fused_ok(device):
        pytest.skip("needs Hopper and a build with the sm_90a kernels")
    backend = mxmoe.backends.get_backend(mxmoe.backends.resolve_backend("auto", torch.device(device)))
    monkeypatch.setattr(backend, "bf16_gather_gemms", frozenset(pieces))


def _inputs(device, T=77, H=64, I=96, E=5, k=2, dtype=BF16, bias=False, seed=0, idx=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    logits = torch.randn(T, E, generator=g)
    tw, ti = torch.softmax(logits, -1).topk(k, -1)
    tw = (tw / tw.sum(-1, keepdim=True)).to(dtype)
    if idx is not None:
        ti = idx
    w13 = (torch.randn(E, 2 * I, H, generator=g) / math.sqrt(H)).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) / math.sqrt(I)).to(dtype)
    b13 = (torch.randn(E, 2 * I, generator=g) * 0.1).to(dtype) if bias else None
    b2 = (torch.randn(E, H, generator=g) * 0.1).to(dtype) if bias else None
    dout = torch.randn(T, H, generator=g).to(dtype)
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    return dict(x=mv(x), topk_idx=mv(ti), topk_weights=mv(tw), w13=mv(w13), w2=mv(w2), bias13=mv(b13),
                bias2=mv(b2)), mv(dout)


GRAD_NAMES = ("x", "topk_weights", "w13", "w2", "bias13", "bias2")


def _leaves(inp):
    out = dict(inp)
    for n in GRAD_NAMES:
        if out.get(n) is not None:
            out[n] = out[n].detach().clone().requires_grad_(True)
    return out


def _run(inp, dout, **kw):
    """Output and grads of moe_experts on fresh leaves."""
    leaves = _leaves(inp)
    out = mxmoe.moe_experts(**leaves, **kw)
    out.backward(dout)
    return out.detach(), {n: leaves[n].grad for n in GRAD_NAMES if leaves.get(n) is not None}


def _forward_saving(leaves, **kw):
    """moe_experts' output and every tensor its autograd graph saved for the backward."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = mxmoe.moe_experts(**leaves, **kw)
    return out, saved


def _reference(inp, dout, act=Swiglu(), layout="concatenated", score_before=False):
    """fp32 plain-torch composition: per expert, the tokens routed to it (ids outside [0, E) dropped)."""
    leaves = {n: (None if t is None else t.detach().float().cpu()) for n, t in inp.items()}
    leaves["topk_idx"] = inp["topk_idx"].cpu()
    for n in GRAD_NAMES:
        if leaves.get(n) is not None:
            leaves[n].requires_grad_(True)
    x, idx, tw, w13, w2 = (leaves[n] for n in ("x", "topk_idx", "topk_weights", "w13", "w2"))
    b13, b2 = leaves["bias13"], leaves["bias2"]
    E, I = w13.shape[0], w13.shape[1] // 2
    # Every leaf in the graph (0 * ...): with no routed token at all (T = 0) the grads are zeros.
    out = x * 0 + 0 * sum(t.sum() for t in (tw, w13, w2, b13, b2) if t is not None)
    for e in range(E):
        t_i, j_i = (idx == e).nonzero(as_tuple=True)
        if t_i.numel() == 0:
            continue
        xe = x[t_i] * tw[t_i, j_i, None] if score_before else x[t_i]
        h = xe @ w13[e].t() + (0 if b13 is None else b13[e])
        g, u = (h[:, 0::2], h[:, 1::2]) if layout == "interleaved" else (h[:, :I], h[:, I:])
        if math.isfinite(act.limit):
            g, u = g.clamp(max=act.limit), u.clamp(-act.limit, act.limit)
        y = g * torch.sigmoid(act.alpha * g) * (u + act.up_offset)
        o = y @ w2[e].t() + (0 if b2 is None else b2[e])
        out = out.index_add(0, t_i, o if score_before else o * tw[t_i, j_i, None])
    out.backward(dout.float().cpu())
    return out.detach(), {n: leaves[n].grad for n in GRAD_NAMES if leaves.get(n) is not None}


def _assert_bars(out, grads, ref_out, ref_grads, bars):
    fwd, dgrad, wgrad = bars
    assert sqnr(out.float().cpu(), ref_out) >= fwd, f"out: {sqnr(out.float().cpu(), ref_out):.1f} dB"
    for n, g in grads.items():
        bar = wgrad if n in ("w13", "w2", "bias13", "bias2") else dgrad
        s = sqnr(g.float().cpu(), ref_grads[n])
        assert s >= bar, f"grad of {n}: {s:.1f} dB < {bar}"


def _same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert torch.equal(a, b), f"{what}: max |diff| {(a.float() - b.float()).abs().max().item()}"


# ---- accuracy against fp32 ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_scale_rows_is_one_rounded_fp32_product(device, dtype):
    """The routing weights on routed rows (functional._scale_rows, the gather kernel with an identity
    index): rows[n] * rs.flat[perm[n]] computed in fp32 and rounded once to the rows' dtype (torch's
    bf16 x fp32 product written to a bf16 tensor), 0 for padding rows (perm < 0), perm values past T*k
    clamped; Inf and the zeros' signs kept."""
    from mxmoe.moe.functional import _scale_rows

    g = torch.Generator().manual_seed(5)
    T, k, C = 37, 3, 48
    rows = (torch.randn(T * k + 4, C, generator=g) * 3).to(dtype)
    rows[2, 5], rows[3, 7], rows[4, 0] = float("inf"), -0.0, float("-inf")
    rs = torch.rand(T, k, generator=g)
    rs[1, 2] = -0.75
    perm = torch.randperm(T * k, generator=g).to(torch.int32)
    perm = torch.cat([perm, torch.tensor([-1, -5, T * k + 9, 4], dtype=torch.int32)])
    got = _scale_rows(rows.to(device), perm.to(device), rs.to(device), k).cpu()
    factor = torch.where(perm < 0, 0.0, rs.flatten()[perm.long().clamp(0, T * k - 1)]).view(-1, 1)
    want = (rows.float() * factor).to(dtype)
    assert got.dtype == dtype
    assert torch.equal(got.view(torch.int16 if dtype == BF16 else torch.int32),
                       want.view(torch.int16 if dtype == BF16 else torch.int32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [TILE, EXACT, "mxfp8_floor", "mxfp8_rceil_wgrad_with_hp"])
def test_recipes_against_fp32(device, recipe):
    inp, dout = _inputs(device, bias=True)
    out, grads = _run(inp, dout, recipe=recipe)
    assert out.dtype == BF16 and out.shape == inp["x"].shape
    _assert_bars(out, grads, *_reference(inp, dout), BARS[recipe])


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_equals_fp32_up_to_bf16_rounding(device):
    inp, dout = _inputs(device, bias=True)
    out, grads = _run(inp, dout, recipe=None)
    ref_out, ref_grads = _reference(inp, dout)
    # Operands and the intermediates (h, act(h), o, dO, dY, dH) rounded to bf16, fp32 accumulation.
    assert sqnr(out.float().cpu(), ref_out) >= 38
    for n, g in grads.items():
        assert sqnr(g.float().cpu(), ref_grads[n]) >= 35, n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("score_before", [False, True])
def test_bf16_saved_for_backward(device, bias, score_before):
    """The bf16 layer keeps what the MX layers keep (SonicMoE's x and pre-activation): no tensor of
    T*k*H elements or more besides the weights -- not the dispatched x, act(h) or the expert outputs
    (the backward gathers and recomputes them) -- and its grads still meet the bf16 bars."""
    T, H, I, E, k = 90, 256, 64, 4, 2  # h (T*k, 2I) stays below T*k*H
    inp, dout = _inputs(device, T=T, H=H, I=I, E=E, k=k, seed=9, bias=bias)
    leaves = _leaves(inp)
    out, saved = _forward_saving(leaves, recipe=None, score_before=score_before)
    # Anything of T*k*I elements or more besides x, the weights and h (T*k, 2I): act(h) is that size.
    big = [(tuple(t.shape), t.dtype) for t in saved if t.numel() >= T * k * I and t.data_ptr() != leaves["x"].data_ptr()
           and not (t.dim() == 3 and t.shape[0] == E) and tuple(t.shape) != (T * k, 2 * I)]
    assert not big, f"saved beyond x and h: {big}"
    assert any(t.data_ptr() == leaves["x"].data_ptr() for t in saved), "x itself is kept"
    out.backward(dout)
    ref_out, ref_grads = _reference(inp, dout, score_before=score_before)
    _assert_bars(out.detach(), {n: leaves[n].grad for n in GRAD_NAMES if leaves.get(n) is not None}, ref_out,
                 ref_grads, (38, 35, 35))


class _OpNames(TorchDispatchMode):
    """The names of the ops called under it, in order."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,gpt_oss", [(BF16, False), (torch.float32, False), (BF16, True)])
@pytest.mark.parametrize("pieces", ["all", "sm90"])
def test_bf16_gather_gemm_same_bits_as_gathered_rows(monkeypatch, device, dtype, gpt_oss, pieces):
    """With its backend's bf16_gather_gemms, GEMMs of the bf16 layer that read routed rows of x or dout
    read them inside the GEMM instead of from a gathered copy: all: every one (moe_swiglu_mm_bf16: the up
    projection with act(h) in its epilogue; moe_dswiglu_mm_bf16: the down-projection dgrad with dH in its
    epilogue; moe_kgather_mm_bf16: dW13, dW2); sm90: Sm90Backend's default (the up projection with the
    SwiGLU epilogue, moe_swiglu_mm_bf16, and the dSwiGLU dgrad); the sm_90a kernels, on the CPU their references. With
    exact operands (multiples of 1/8: every fp32 sum of the forward and dgrad GEMMs exact, so their
    summation order cannot matter) the output and the grad of x are the bits of the same layer gathering
    the rows first for torch._grouped_mm; the weights' grads (sums of inexact products, and dW2 weighting
    act(h)'s rows instead of dout's) and the routing weights' (another summation order) agree to bf16
    rounding. gpt_oss: its clamped activation, interleaved halves and expert biases (b13 added in the up
    projection's epilogue as the unfused layer adds it: the same bits)."""
    from mxmoe.backends.sm90 import Sm90Backend

    sm90 = Sm90Backend().bf16_gather_pieces(2048)  # what Hopper takes at Qwen3-30B-A3B's hidden size
    assert sm90 == {"up", "up_swiglu", "down_dgrad"} and not Sm90Backend().bf16_gather_pieces(7168)
    _bf16_gather_on(monkeypatch, device, mxmoe.backends.BF16_GATHER_PIECES if pieces == "all" else sm90)
    T, H, I, E, k = 300, 256, 128, 6, 4
    inp, _ = _inputs(device, T=T, H=H, I=I, E=E, k=k, seed=31, dtype=dtype, bias=gpt_oss)
    kw = dict(activation="gpt_oss", layout="interleaved") if gpt_oss else {}
    g = torch.Generator().manual_seed(32)
    eighths = lambda shape: (torch.randint(-16, 17, shape, generator=g) / 8).to(dtype).to(device)  # noqa: E731
    inp.update(x=eighths((T, H)), w13=eighths((E, 2 * I, H)), w2=eighths((E, H, I)))
    inp["topk_idx"][5, 1] = E + 3  # a dropped id
    inp["topk_idx"][inp["topk_idx"] == E - 1] = 0  # expert E - 1 gets no rows (a token may pick 0 twice)
    dout = eighths((T, H))
    with _OpNames() as seen:
        out, grads = _run(inp, dout, recipe=None, **kw)
    names = lambda op: sum(f"mxmoe.{op}." in n for n in seen.names)  # noqa: E731
    assert (names("moe_swiglu_mm_bf16"), names("moe_gather_mm_bf16"), names("moe_dswiglu_mm_bf16"),
            names("moe_kgather_mm_bf16")) == ((1, 0, 1, 2) if pieces == "all" else (1, 0, 1, 0)), \
        "the up projection; the down-projection dgrad with dSwiGLU; dW13 and dW2"
    backend = mxmoe.backends.get_backend(mxmoe.backends.resolve_backend("auto", inp["x"].device))
    monkeypatch.setattr(backend, "bf16_gather_gemms", frozenset())
    with _OpNames() as seen:
        ref_out, ref_grads = _run(inp, dout, recipe=None, **kw)
    assert not any("_mm_bf16" in n for n in seen.names)
    _same(out, ref_out, "out")
    _same(grads["x"], ref_grads["x"], "grad of x")
    # the routing weights' grad sums <dY', act(h)> per 128 columns in the epilogue's order
    for n in ("topk_weights", "w13", "w2", *(("bias13", "bias2") if gpt_oss else ())):
        assert sqnr(grads[n].float().cpu(), ref_grads[n].float().cpu()) >= 40, n
    for n in ("w13", "w2"):
        assert not grads[n][E - 1].any(), f"grad of {n}: the expert without rows"


class _LiveOutputs(TorchDispatchMode):
    """Every op output's storage from the op that made it until it is freed; `moments` lists, per op
    called, the (op, shape, dtype) of the outputs alive right after it (inputs made outside not counted)."""

    def __init__(self):
        super().__init__()
        self.live, self.moments = {}, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if id(st) not in self.live:
                    self.live[id(st)] = (str(func), tuple(t.shape), t.dtype)
                    weakref.finalize(st, self.live.pop, id(st), None)
        self.moments.append((str(func), list(self.live.values())))
        return out


@pytest.mark.parametrize("recipe", [TILE, None])
def test_backward_order_bounds_peak_memory(recipe):
    """The backward makes the grads needed last last and frees what they read first, so that the peak
    (the up projection's backward) does not also hold dW2, and on tile128 not dispatch(x)'s wgrad
    operand beside dXs either: dW2 (E, H, I) and dXs (routed rows, H) are never alive together."""
    T, H, I, E, k = 150, 256, 128, 6, 3
    inp, dout = _inputs("cpu", T=T, H=H, I=I, E=E, k=k, seed=21)
    leaves = _leaves(inp)
    out = mxmoe.moe_experts(**leaves, recipe=recipe)
    track = _LiveOutputs()
    with track:
        out.backward(dout)
    def is_dxs(f, s):  # the routed rows' dgrad: a GEMM's (rows, H) output
        return ("grouped_mm" in f or "backward" in f) and len(s) == 2 and s[1] == H and s[0] >= T * k

    both = [f for f, live in track.moments
            if any(s == (E, H, I) for _, s, _ in live) and any(is_dxs(g, s) for g, s, _ in live)]
    assert not both, f"dW2 and dXs alive together after {both[:3]}"
    if recipe == TILE:  # (dH's columnwise form, the dSwiGLU dgrad's output, is (2I, rows) = (H, rows) here)
        x_op = [f for f, live in track.moments if any(len(s) == 2 and s[0] == H and d == torch.float8_e4m3fn
                                                      and "dswiglu" not in g for g, s, d in live)]
        assert not x_op, f"dispatch(x)'s wgrad operand made outside the fused backward: {x_op[:3]}"
    assert leaves["w2"].grad is not None and leaves["w13"].grad is not None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe,backend", [(TILE, "auto"), (EXACT, "fused"), (TILE, "composed"), (None, "auto")])
def test_score_before_experts(device, recipe, backend):
    """score_before=True (TorchTitan's score_before_experts): sum_j expert(w * x) on the fused paths too,
    every grad (topk_weights' included) against the fp32 composition."""
    inp, dout = _inputs(device, bias=True, k=3)
    out, grads = _run(inp, dout, recipe=recipe, backend=backend, score_before=True)
    ref_out, ref_grads = _reference(inp, dout, score_before=True)
    _assert_bars(out, grads, ref_out, ref_grads, BARS[recipe] if recipe else (38, 35, 35))
    # a different function from the weights-after layer on these inputs
    assert sqnr(_reference(inp, dout)[0], ref_out) < 15
    with pytest.raises(ValueError, match="score_before: expected a bool"):
        mxmoe.moe_experts(**inp, recipe=recipe, score_before=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [TILE, EXACT, None])
@pytest.mark.parametrize("layout,activation", [("interleaved", "gpt_oss"), ("concatenated", Swiglu(1.5, 3.0, 0.5))])
def test_layouts_and_activations(device, recipe, layout, activation):
    inp, dout = _inputs(device, bias=True, seed=3)
    out, grads = _run(inp, dout, recipe=recipe, layout=layout, activation=activation)
    act = mxmoe.moe.ACTIVATIONS[activation] if isinstance(activation, str) else activation
    bars = (38, 35, 35) if recipe is None else BARS[recipe]
    _assert_bars(out, grads, *_reference(inp, dout, act, layout), bars)


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_inputs(device):
    inp, dout = _inputs(device, dtype=torch.float32)
    out, grads = _run(inp, dout, recipe=TILE)
    assert out.dtype == torch.float32 and grads["x"].dtype == torch.float32 and grads["w13"].dtype == torch.float32
    _assert_bars(out, grads, *_reference(inp, dout), BARS[TILE])


# ---- the fused paths == the same layer built from mxmoe.grouped_mm ----------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [TILE, EXACT])
@pytest.mark.parametrize("layout", ["concatenated", "interleaved"])
def test_fused_bit_identical_to_grouped_mm_layer(device, recipe, layout):
    """Where the fused layer computes what the composed one does, the same bits: the output (GEMM1 on x
    read per token through the routing, SwiGLU, GEMM2, combine) and the down projection's weight grad
    (dW2 from w * dout). Its backward runs the down projection's dgrad on the unweighted rows and applies
    the weights after it (dH = act'(h, w * dY')), and takes the weights' grad from dY' and h, where the
    composed layer quantizes w * dout and reads o: those grads are held to the fp32 bars."""
    if not _fused_ok(device):
        pytest.skip("needs a Hopper GPU and the tile128 GEMMs")
    inp, dout = _inputs(device, T=150, H=128, I=128, E=6, k=3, seed=5)
    out_f, g_f = _run(inp, dout, recipe=recipe, layout=layout, backend="fused")
    out_c, g_c = _run(inp, dout, recipe=recipe, layout=layout, backend="composed", grouped_mm_backend="sm90")
    _same(out_f, out_c, "out")
    _same(g_f["w2"], g_c["w2"], "grad of w2")
    _assert_bars(out_f, g_f, *_reference(inp, dout, layout=layout), BARS[recipe])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("I", [128, 256])
def test_tile128_dswiglu_backward_same_bits_as_unfused(device, I, monkeypatch):
    """tile128's backward with dSwiGLU in the down projection's dgrad epilogue (I % 128 == 0,
    concatenated halves, no b13) against the same layer through the standalone quantize pass over a
    stored dY': the same bits for dx, dw13 and dw2 (the FP8 operands are identical), and the routing
    weights' grad equal up to its summation order (per 128-column tile, then over the tiles)."""
    if not _fused_ok(device):
        pytest.skip("needs a Hopper GPU and the tile128 GEMMs")
    from mxmoe.backends.phases import Tile128Phases

    inp, dout = _inputs(device, T=150, H=256, I=I, E=6, k=3, seed=13)
    calls = []
    fused = Tile128Phases.fused_down_backward
    monkeypatch.setattr(Tile128Phases, "fused_down_backward",
                        staticmethod(lambda *a: calls.append(1) or fused(*a)))
    out_f, g_f = _run(inp, dout, recipe=TILE)
    assert calls, "the fused down-projection backward ran"
    monkeypatch.setattr(Tile128Phases, "fused_down_takes", staticmethod(lambda *a: False))
    out_u, g_u = _run(inp, dout, recipe=TILE)
    _same(out_f, out_u, "out")
    for n in ("x", "w13", "w2"):
        _same(g_f[n], g_u[n], f"grad of {n}")
    tw_f, tw_u = g_f["topk_weights"].float(), g_u["topk_weights"].float()
    assert (tw_f - tw_u).abs().max() <= 1e-5 * tw_u.abs().max(), "routing weights' grad"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("I, activation, layout, bias", [
    (128, "swiglu", "concatenated", False), (384, "swiglu", "concatenated", False),
    (128, "gpt_oss", "concatenated", False), (384, "gpt_oss", "concatenated", False),
    # gpt-oss's layer: interleaved halves and the expert biases, I % 128 == 64 (192) and == 0
    (192, "gpt_oss", "interleaved", True), (256, "gpt_oss", "interleaved", True), (192, "swiglu", "interleaved", False)])
def test_tile128_swiglu_forward_same_bits_as_unfused(device, I, activation, layout, bias, monkeypatch):
    """tile128's forward with SwiGLU (and b13) in the up projection's epilogue (h and act(h)'s FP8 forms
    from one GEMM) against the same layer through GEMM2's quantizer reading h: the same bits for the
    output and every grad (h and the FP8 operands are identical)."""
    if not _fused_ok(device):
        pytest.skip("needs a Hopper GPU and the tile128 GEMMs")
    from mxmoe.backends.phases import Tile128Phases

    inp, dout = _inputs(device, T=150, H=256, I=I, E=6, k=3, seed=17, bias=bias)
    calls = []
    fused = Tile128Phases.fused_up_forward
    monkeypatch.setattr(Tile128Phases, "fused_up_forward", staticmethod(lambda *a: calls.append(1) or fused(*a)))
    out_f, g_f = _run(inp, dout, recipe=TILE, activation=activation, layout=layout)
    assert calls, "the fused up-projection forward ran"
    monkeypatch.setattr(Tile128Phases, "fused_up_takes", staticmethod(lambda *a: False))
    out_u, g_u = _run(inp, dout, recipe=TILE, activation=activation, layout=layout)
    _same(out_f, out_u, "out")
    for n in ("x", "topk_weights", "w13", "w2", "bias13", "bias2"):
        if n in g_f:
            _same(g_f[n], g_u[n], f"grad of {n}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [TILE, EXACT])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("score_before", [False, True])
def test_saved_for_backward(device, recipe, bias, score_before):
    """What the fused MX layer keeps for its backward: x, the pre-activation h, act(h)'s wgrad operand,
    the routing and the weights' forms -- no tensor of T*k*H elements or more besides the weights'
    (E, ., .) forms: not the expert outputs o (the weights' grad comes from the dgrad and h), not the
    dispatched x in any dtype (its wgrad operand is built in the backward). H is chosen above 2I."""
    if not _fused_ok(device):
        pytest.skip("needs a Hopper GPU and the tile128 GEMMs")
    T, H, I, E, k = 90, 256, 64, 4, 2  # h (T*k + padding, 2I) stays below T*k*H
    inp, dout = _inputs(device, T=T, H=H, I=I, E=E, k=k, seed=9, bias=bias)
    leaves = _leaves(inp)
    out, saved = _forward_saving(leaves, recipe=recipe, backend="fused", score_before=score_before)
    big = [(tuple(t.shape), t.dtype) for t in saved if t.numel() >= T * k * H and not (t.dim() == 3 and t.shape[0] == E)]
    assert not big, f"saved tensors of T*k*H elements or more: {big}"
    assert any(t is leaves["x"] or t.data_ptr() == leaves["x"].data_ptr() for t in saved), "x itself is kept"
    out.backward(dout)  # and the backward runs from what was kept
    ref_out, ref_grads = _reference(inp, dout, score_before=score_before)
    _assert_bars(out.detach(), {n: leaves[n].grad for n in GRAD_NAMES if leaves.get(n) is not None}, ref_out,
                 ref_grads, BARS[recipe])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [TILE, EXACT, None])
@pytest.mark.parametrize("I", [128, 96])  # tile128: the dSwiGLU dgrad releases h (I % 128 == 0), else the layer
def test_h_released_at_its_last_read(device, recipe, I):
    """The pre-activation h goes back to the allocator at its last read in the eager backward, so the up
    projection's grads and dW2 peak without it; with retain_graph it stays (a second backward reads it)
    and that second backward gives the first one's grads, bit for bit."""
    if recipe is not None and not _fused_ok(device):
        pytest.skip("needs a Hopper GPU and the tile128 GEMMs")
    inp, dout = _inputs(device, T=90, H=128, I=I, E=4, k=2, seed=21)

    def h_of(saved):
        hs = [t for t in saved if t.dim() == 2 and t.shape[1] == 2 * I and t.dtype == BF16]
        assert len(hs) == 1, [(tuple(t.shape), t.dtype) for t in saved]
        return hs[0]

    leaves = _leaves(inp)
    out, saved = _forward_saving(leaves, recipe=recipe, backend="fused")
    h = h_of(saved)
    assert h.untyped_storage().nbytes() > 0
    out.backward(dout)
    assert h.untyped_storage().nbytes() == 0, "h released after its last read"
    grads = {n: leaves[n].grad for n in GRAD_NAMES if leaves.get(n) is not None}

    leaves = _leaves(inp)
    out, saved = _forward_saving(leaves, recipe=recipe, backend="fused")
    h = h_of(saved)
    out.backward(dout, retain_graph=True)
    assert h.untyped_storage().nbytes() > 0, "kept for the next backward"
    first = {n: leaves[n].grad.clone() for n in grads}
    for n in grads:
        leaves[n].grad = None
    out.backward(dout)
    for n in grads:
        _same(leaves[n].grad, first[n], f"second backward's grad of {n}")
        _same(first[n], grads[n], f"grad of {n} with retain_graph")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scaled", [False, True])
def test_tile128_phase_on_routed_rows_equals_materialized(device, scaled):
    """The tile128 phase ops on a GATHER source (the layer's GEMM1 forward and down-projection dgrad): the
    gather GEMM reading x per token through perm gives the bits of the same phase on the materialized
    routed rows (1x128 blocks of a row are the token's, the GEMM sums in the same order). With a row
    scale the phase quantizes the scaled rows (the materialized path)."""
    if not _fused_ok(device):
        pytest.skip("needs a Hopper GPU and the tile128 GEMMs")
    from mxmoe.backends.phases import TILE128
    from mxmoe import ops

    inp, dout = _inputs(device, T=150, H=128, I=128, E=6, k=3, seed=8)
    x, w13 = inp["x"], inp["w13"]
    offs, perm, inv = TILE128.routing(inp["topk_idx"], 6)
    fwd, _ = TILE128.weights(w13, 0)
    _, bwd = TILE128.weights(inp["w2"], 0)  # dgrad: dO (rows, H) @ w2
    rs = inp["topk_weights"].float().contiguous() if scaled else None
    src = (ops.SOURCE_GATHER, x, None, perm, rs, 3, 0, 1.0, 0.0, 0.0)
    rows = ops.moe_gather(x, perm, 3, rs, x.dtype)
    h_g, xq_g, xs_g = ops.moe_tile128_forward(*src, *fwd, offs, None, 0, BF16, True)
    h_m, xq_m, xs_m = ops.sm90_tile128_forward(rows, *fwd, offs, None, 0, BF16, True)
    for a, b, n in ((h_g, h_m, "h"), (xq_g, xq_m, "wgrad operand"), (xs_g, xs_m, "its scales")):
        assert torch.equal(a.view(torch.uint8) if a.dtype.itemsize == 1 else a,
                           b.view(torch.uint8) if b.dtype.itemsize == 1 else b), n
    dy = torch.randn(150, 128, generator=torch.Generator().manual_seed(3)).to(BF16).to(device)
    dsrc = (ops.SOURCE_GATHER, dy, None, perm, None, 3, 0, 1.0, 0.0, 0.0)
    da_g, _ = ops.moe_tile128_backward(*dsrc, *bwd, None, None, offs, 0, True, False, BF16, BF16)
    da_m, _ = ops.sm90_tile128_backward(ops.moe_gather(dy, perm, 3, None, BF16), *bwd, None, None, offs, 0, True,
                                        False, BF16, BF16)
    assert torch.equal(da_g, da_m)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [TILE, EXACT])
def test_fused_biases_match_grouped_mm_layer(device, recipe):
    if not _fused_ok(device):
        pytest.skip("needs a Hopper GPU and the tile128 GEMMs")
    inp, dout = _inputs(device, T=150, H=128, I=128, E=6, k=3, seed=6, bias=True)
    out_f, g_f = _run(inp, dout, recipe=recipe, backend="fused")
    out_c, g_c = _run(inp, dout, recipe=recipe, backend="composed", grouped_mm_backend="sm90")
    _same(out_f, out_c, "out")
    _same(g_f["w2"], g_c["w2"], "grad of w2")
    # x, w13, the weights and bias13 through the unweighted dgrad (test_fused_bit_identical_to_grouped_mm_layer)
    _assert_bars(out_f, g_f, *_reference(inp, dout), BARS[recipe])
    for n in ("bias2",):
        # Per-group sums of the same rows: grouped_mm sums the bf16-rounded dO, the fused layer its fp32
        # values (w * dout), in other orders.
        d = (g_f[n].float() - g_c[n].float()).abs().max()
        assert d <= 0.01 * g_c[n].float().abs().max(), f"grad of {n}: max |diff| {d.item()}"


# ---- routing ---------------------------------------------------------------------------------------


def _idx(rows, device):
    return torch.tensor(rows, dtype=torch.int64, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [TILE, EXACT, None])
@pytest.mark.parametrize("case", ["empty_experts", "one_expert", "k1", "k8", "dropped_ids", "t0", "t0_gpt_oss", "t33"])
@pytest.mark.parametrize("I", [96, 128])  # 128: tile128's backward with dSwiGLU in the down projection's dgrad
def test_routing_cases(device, recipe, case, I):
    E = 5
    kw = dict(T=40, E=E, k=2, I=I)
    if case == "empty_experts":
        kw["idx"] = _idx([[0, 3]] * 20 + [[3, 0]] * 20, "cpu")
    elif case == "one_expert":
        kw.update(k=1, idx=_idx([[2]] * 40, "cpu"))
    elif case == "k1":
        kw["k"] = 1
    elif case == "k8":
        kw.update(E=9, k=8)
    elif case == "dropped_ids":
        kw["idx"] = torch.tensor([[-1, 7]] * 5 + [[1, 5]] * 5 + [[4, 0]] * 30, dtype=torch.int32)  # E = 5
    elif case in ("t0", "t0_gpt_oss"):
        kw["T"] = 0
    elif case == "t33":
        kw["T"] = 33
    gpt_oss = case == "t0_gpt_oss"  # its interleaved halves and biases: the fused up projection's other form
    inp, dout = _inputs(device, bias=gpt_oss, **kw)
    act = dict(activation="gpt_oss", layout="interleaved") if gpt_oss else {}
    out, grads = _run(inp, dout, recipe=recipe, **act)
    if kw["T"] == 0:  # no tokens: an empty output, zero weight (and bias) grads
        assert out.shape == (0, inp["x"].shape[1])
        for n in ("w13", "w2", "bias13", "bias2"):
            assert n not in grads or not grads[n].any(), n
        return
    ref_out, ref_grads = _reference(inp, dout)
    assert out.shape == ref_out.shape
    bars = (38, 35, 35) if recipe is None else BARS[recipe]
    _assert_bars(out, grads, ref_out, ref_grads, bars)
    if case == "dropped_ids":
        # entries with ids outside [0, E) contribute nothing and get zero weight grads
        assert torch.all(grads["topk_weights"][:5] == 0)
        assert torch.equal(out[:5].float().cpu(), torch.zeros(5, out.shape[1]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe,bf16_gather", [(TILE, False), (None, False), (None, True)])
@pytest.mark.parametrize("I", [96, 128])
def test_deterministic(monkeypatch, device, recipe, bf16_gather, I):
    if bf16_gather:
        _bf16_gather_on(monkeypatch, device)
    inp, dout = _inputs(device, T=200, I=I, E=4, k=3, seed=9)
    a = _run(inp, dout, recipe=recipe)
    b = _run(inp, dout, recipe=recipe)
    _same(a[0], b[0], "out")
    for n in a[1]:
        _same(a[1][n], b[1][n], n)


# ---- bad input -------------------------------------------------------------------------------------


def test_bad_inputs():
    inp, _ = _inputs("cpu")
    cases = [
        (dict(x=inp["x"][0]), "x: expected a (T, H)"),
        (dict(x=inp["x"].to(torch.float16)), "x: expected"),
        (dict(topk_idx=inp["topk_idx"].float()), "topk_idx: expected"),
        (dict(topk_idx=inp["topk_idx"][:5]), "topk_idx: expected a (T=77"),
        (dict(topk_weights=inp["topk_weights"][:, :1]), "topk_weights: expected"),
        (dict(w13=inp["w13"][:, :-1]), "w13: expected"),
        (dict(w2=inp["w2"][:-1]), "w2: expected an (E=5"),
        (dict(bias13=torch.zeros(5, 3)), "bias13: expected an (E=5, 192)"),
        (dict(recipe="nope"), "recipe: expected one of"),
        (dict(layout="nope"), "layout: expected one of"),
        (dict(activation="relu"), "activation: expected one of"),
        (dict(backend="nope"), "backend: expected"),
    ]
    for change, msg in cases:
        args = {**inp, **{k: v for k, v in change.items() if k in inp}}
        kw = {k: v for k, v in change.items() if k not in inp}
        with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            mxmoe.moe_experts(**args, **kw)


@pytest.mark.gpu
def test_wrong_device():
    inp, _ = _inputs("cuda")
    with pytest.raises(ValueError, match="w2: expected device cuda"):
        mxmoe.moe_experts(**{**inp, "w2": inp["w2"].cpu()})


# ---- the module ------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_module(device):
    torch.manual_seed(0)
    m = mxmoe.nn.MoEExperts(4, 64, 32, recipe=TILE, bias=True, dtype=BF16, device=device)
    assert set(m.state_dict()) == {"w13", "w2", "bias13", "bias2"}
    assert m.w13.shape == (4, 64, 64) and m.w2.shape == (4, 64, 32)
    x = torch.randn(2, 9, 64, dtype=BF16, device=device, requires_grad=True)
    tw, ti = torch.softmax(torch.randn(2, 9, 4, device=device), -1).topk(2, -1)
    out = m(x, ti, tw)
    assert out.shape == x.shape
    out.float().square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    ref = mxmoe.moe_experts(x.detach().reshape(-1, 64), ti.reshape(-1, 2), tw.reshape(-1, 2), m.w13, m.w2,
                            recipe=TILE, bias13=m.bias13, bias2=m.bias2)
    _same(out.detach().reshape(-1, 64), ref.detach(), "module == functional")


# ---- torch.compile and CUDA graphs -------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe,bf16_gather", [(TILE, False), (None, False), (None, True)])
@pytest.mark.parametrize("I", [96, 128])
def test_compile_fullgraph_dynamic(monkeypatch, device, recipe, bf16_gather, I):
    """bf16_gather: the bf16 layer with its backend's gather GEMMs on (the ops' fakes under compile)."""
    torch._dynamo.reset()
    inp, dout = _inputs(device, T=64, I=I, seed=11)
    if bf16_gather:
        _bf16_gather_on(monkeypatch, device)
    eager = _run(inp, dout, recipe=recipe)

    def step(x, topk_idx, topk_weights, w13, w2):
        return mxmoe.moe_experts(x, topk_idx, topk_weights, w13, w2, recipe=recipe)

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    leaves = _leaves({k: v for k, v in inp.items() if k not in ("bias13", "bias2")})
    out = compiled(**leaves)
    out.backward(dout)
    _same(out.detach(), eager[0], "compiled out")
    for n in ("x", "topk_weights", "w13", "w2"):
        _same(leaves[n].grad, eager[1][n], f"compiled grad of {n}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [TILE, EXACT])
def test_compile_reuses_cached_weights(device, recipe):
    """Compiled (fullgraph, dynamic): the expert weights' forms come from the weight cache when the
    graph runs (hits on every call after the first while the weights are unchanged), an in-place
    write is seen on the next call, and results equal eager's."""
    if not _fused_ok(device):
        pytest.skip("needs Hopper and the tile128 GEMMs")
    torch._dynamo.reset()
    mxmoe.refresh_weights()
    inp, dout = _inputs(device, T=64, seed=13)
    leaves = _leaves({k: v for k, v in inp.items() if k not in ("bias13", "bias2")})

    kw = dict(recipe=recipe, backend="fused")  # exact recipes take the fused path on CPU only if asked

    def step(x, topk_idx, topk_weights, w13, w2):
        return mxmoe.moe_experts(x, topk_idx, topk_weights, w13, w2, **kw)

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    outs = []
    for i in range(3):
        if i == 1:
            hits = mxmoe.weight_cache_info()["hits"]
        out = compiled(**leaves)
        out.backward(dout)
        outs.append(out.detach())
    assert mxmoe.weight_cache_info()["hits"] - hits == 4  # calls 2 and 3: w13 and w2 each
    with torch.no_grad():
        leaves["w13"].mul_(0.5)
    changed = compiled(**leaves).detach()
    mxmoe.set_weight_cache(False)
    try:
        ref = mxmoe.moe_experts(**leaves, **kw).detach()
        with torch.no_grad():
            leaves["w13"].mul_(2.0)
        ref0 = mxmoe.moe_experts(**leaves, **kw).detach()
    finally:
        mxmoe.set_weight_cache(True)
    _same(changed, ref, "compiled after an in-place write")
    for o in outs:
        _same(o, ref0, "compiled, cached weights")
    assert not torch.equal(changed, ref0)
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("recipe,bf16_gather", [(TILE, False), (EXACT, False), (None, False), (None, True)])
def test_cuda_graph_equals_eager(monkeypatch, recipe, bf16_gather):
    if bf16_gather:
        _bf16_gather_on(monkeypatch, "cuda")
    mxmoe.set_weight_cache(False)
    try:
        inp, dout = _inputs("cuda", T=128, H=128, I=128, E=4, k=2, seed=12)
        eager = _run(inp, dout, recipe=recipe)
        leaves = _leaves({k: v for k, v in inp.items() if k not in ("bias13", "bias2")})

        def step():
            for n in ("x", "topk_weights", "w13", "w2"):
                leaves[n].grad = None
            out = mxmoe.moe_experts(**leaves, recipe=recipe)
            out.backward(dout)
            return out

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()  # warm up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        for n in ("x", "topk_weights", "w13", "w2"):
            leaves[n].grad = None
        with torch.cuda.graph(g):
            out = mxmoe.moe_experts(**leaves, recipe=recipe)
            out.backward(dout)
        g.replay()
        torch.cuda.synchronize()
        _same(out.detach(), eager[0], "graph out")
        for n in ("x", "topk_weights", "w13", "w2"):
            _same(leaves[n].grad, eager[1][n], f"graph grad of {n}")
    finally:
        mxmoe.set_weight_cache(True)
