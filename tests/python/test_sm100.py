"""The Blackwell (sm100) backend.

There is no Blackwell GPU in CI or on the team's device machine (H200), so most of this file runs the
backend on the CPU with ``torch._scaled_grouped_mm`` replaced by an emulator written here from the
documented semantics of torch's MXFP8 grouped GEMM (its meta checks; per-group blocked scales as in
aten/src/ATen/native/cuda/GroupedBlas.cpp and FBGEMM's mx8mx8bf16_grouped kernel args; the blocked
layout as torchao's ``to_blocked``). The emulator decodes the e4m3 data and the blocked e8m0 scales
itself (nothing of mxmoe's layout code is reused) and multiplies per group in fp32, so a wrong scale
layout, group offset or transposition in the backend makes the results differ from the exact
reference backend. Rows and groups the real kernel leaves unwritten are NaN here, so the backend
must clear them itself.

The device gate is checked with a patched capability query; the real-GPU test skips unless the GPU
is a Blackwell (compute capability 10.x).
"""
import pytest
import torch

import mxmoe
from mxmoe import backends, sm100
from mx_testutils import offsets, rel_err, sqnr

E4M3, E8M0, BF16 = torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.bfloat16
RECIPES = ["mxfp8_rceil", "mxfp8_floor", "mxfp8_rceil_wgrad_with_hp", "mxfp8_rceil_tile128"]


# ---- an emulator of torch._scaled_grouped_mm with MXFP8 operands ----------------------------------


def _round_up(x, n):
    return (x + n - 1) // n * n


def _unblock(buf: torch.Tensor, base: int, rows: int, cols: int) -> torch.Tensor:
    """The (rows, cols) scale matrix stored in the blocked layout at flat byte `base` of buf: 128x4
    tiles of 512 bytes, tiles row-major over (ceil(rows/128), ceil(cols/4)); inside a tile, row r
    and column c sit at byte (r % 32) * 16 + (r // 32) * 4 + c (cuBLAS / CUTLASS SM100 scale-factor
    layout, torchao to_blocked)."""
    tiles_per_row = _round_up(cols, 4) // 4
    i = torch.arange(rows).view(-1, 1)
    j = torch.arange(cols).view(1, -1)
    idx = base + ((i // 128) * tiles_per_row + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
    assert rows == 0 or cols == 0 or int(idx.max()) < buf.numel(), "the kernel would read past the scale buffer"
    return buf[idx]


def _decode(q: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """e4m3 q (R, C) with one e8m0 byte per 32 along C -> fp32 (exact); byte 255 is NaN."""
    s = scale_bytes.to(torch.int32)
    mult = torch.ldexp(torch.ones(s.shape), s - 127)
    mult[s == 255] = float("nan")
    return q.float() * mult.repeat_interleave(32, dim=1)


def _meta(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def emulated_scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
                               out_dtype=None, use_fast_accum=False, calls=None):
    # torch's own argument checks first (its meta kernel: dtypes, row-/column-major, 16-byte strides,
    # scale ranks and the 3D operand's exact blocked scale shape).
    torch._scaled_grouped_mm(_meta(mat_a), _meta(mat_b), _meta(scale_a), _meta(scale_b), offs=_meta(offs),
                             bias=bias, scale_result=scale_result, out_dtype=out_dtype,
                             use_fast_accum=use_fast_accum)
    assert mat_a.dtype == E4M3 and mat_b.dtype == E4M3 and scale_a.dtype == E8M0 and scale_b.dtype == E8M0
    assert out_dtype in (None, BF16) and bias is None, "MXFP8 grouped GEMM: bf16 output, no bias"
    assert scale_a.is_contiguous() and scale_b.is_contiguous()
    if calls is not None:
        calls.append("2d3d" if mat_b.dim() == 3 else "2d2d")
    ends = offs.tolist()
    sa, sb = scale_a.view(torch.uint8).flatten(), scale_b.view(torch.uint8)
    start = 0
    if mat_b.dim() == 3:  # groups along M
        m, k = mat_a.shape
        g, _, n = mat_b.shape
        assert len(ends) == g and all(0 <= e <= m for e in ends) and ends == sorted(ends)
        out = torch.full((m, n), float("nan"), dtype=BF16)  # rows past the groups: unwritten
        scale_row = 0  # group g's scales start at row sum_{h<g} roundup(size_h, 128)
        for gi, end in enumerate(ends):
            size = end - start
            if size > 0:
                a = _decode(mat_a[start:end], _unblock(sa, scale_row * _round_up(k // 32, 4), size, k // 32))
                b = _decode(mat_b[gi].t(), _unblock(sb[gi], 0, n, k // 32))  # (N, K)
                out[start:end] = (a @ b.t()).to(BF16)
            scale_row += _round_up(size, 128)
            start = end
        return out
    # 2D x 2D: groups along the contraction (tokens)
    m, t = mat_a.shape
    n = mat_b.shape[1]
    g = len(ends)
    assert all(0 <= e <= t for e in ends) and ends == sorted(ends)
    out = torch.full((g, m, n), float("nan"), dtype=BF16)  # empty groups: unwritten
    base_a = base_b = 0  # group g's scales: sum_{h<g} roundup(rows, 128) * roundup(size_h / 32, 4)
    for gi, end in enumerate(ends):
        size = end - start
        # The kernel asserts size % 16 == 0 and reads size // 32 scale columns: only whole 32-token
        # blocks are well defined.
        assert size % 32 == 0, f"token group {gi} has {size} tokens, not a multiple of 32"
        cols = size // 32
        if size > 0:
            a = _decode(mat_a[:, start:end], _unblock(sa, base_a, m, cols))  # (M, size)
            b = _decode(mat_b[start:end].t(), _unblock(sb.flatten(), base_b, n, cols))  # (N, size)
            out[gi] = (a @ b.t()).to(BF16)
        base_a += _round_up(m, 128) * _round_up(cols, 4)
        base_b += _round_up(n, 128) * _round_up(cols, 4)
        start = end
    return out


@pytest.fixture
def emulated_sm100(monkeypatch):
    """The sm100 backend on the CPU: the emulator in place of torch's GEMM, the device gate off (tests
    only). Returns the list of GEMM calls made ('2d3d' / '2d2d')."""
    calls = []
    monkeypatch.setattr(sm100, "scaled_grouped_mm",
                        lambda *a, **kw: emulated_scaled_grouped_mm(*a, calls=calls, **kw))
    monkeypatch.setattr(sm100, "require_sm100_device", lambda device: None)
    return calls


# ---- the emulator itself ---------------------------------------------------------------------------


def test_emulator_unblocking_agrees_with_the_spec_formula_on_random_bytes():
    # The emulator's tile arithmetic against a literal transcription of the torchao/cuBLAS layout:
    # pad to (128, 4) multiples, view as (row tiles, 128, col tiles, 4), tiles row-major, and inside
    # each 128x4 tile the (4 x 32, 4) -> (32, 4 x 4) interleave.
    rows, cols = 200, 7
    s = torch.randint(0, 256, (rows, cols), dtype=torch.uint8)
    padded = torch.zeros(_round_up(rows, 128), _round_up(cols, 4), dtype=torch.uint8)
    padded[:rows, :cols] = s
    tiles = padded.view(-1, 128, padded.shape[1] // 4, 4).permute(0, 2, 1, 3)
    blocked = tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1)
    assert torch.equal(_unblock(blocked, 0, rows, cols), s)
    assert torch.equal(_unblock(torch.cat([torch.zeros(64, dtype=torch.uint8), blocked]), 64, rows, cols), s)


# ---- the backend against the exact reference -------------------------------------------------------


SHAPES = {  # (M, K, N, group sizes): the seeds' shape family scaled down, and jagged groups
    "G1": (384, 256, 128, [384]),
    "G4": (384, 256, 128, [96, 96, 96, 96]),
    "jagged": (384, 256, 128, [100, 0, 77, 150]),  # not multiples of 32 or 128, an empty group, 57 rows left
    "jagged_tiny": (96, 64, 32, [1, 33, 0, 31]),  # partial 32-blocks only, groups inside one 128-row tile
}


def _step(A, W, offs, dy, backend, **kw):
    a = A.detach().clone().requires_grad_()
    w = W.detach().clone().requires_grad_()
    y = mxmoe.grouped_mm(a, w.transpose(-2, -1), offs, backend=backend, **kw)
    y.backward(dy)
    return y.detach(), a.grad, w.grad


def _problem(m, k, n, sizes, dtype=BF16):
    A = torch.randn(m, k).to(dtype)
    W = (torch.randn(len(sizes), n, k) / k**0.5).to(dtype)
    dy = torch.randn(m, n).to(dtype)
    return A, W, offsets(sizes), dy


def _assert_same_mx_gemm(x, ref, what):
    """Equal up to fp32 summation order, then one rounding to bf16: at most one bf16 ulp apart, and
    nearly always bit-equal (a wrong scale is off by a power of two, a wrong layout by everything)."""
    assert x.dtype == ref.dtype and x.shape == ref.shape, what
    assert not x.isnan().any(), f"{what}: NaN (unwritten rows or groups?)"
    x, ref = x.double(), ref.double()
    ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref.abs().clamp_min(1e-30)).exponent - 8)
    assert torch.all((x - ref).abs() <= ulp + 1e-30), f"{what}: more than one bf16 ulp from the exact MX GEMM"
    assert (x == ref).double().mean() >= 0.99, f"{what}: too many elements differ"


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("recipe", RECIPES)
def test_sm100_fwd_bwd_equals_exact_reference(emulated_sm100, recipe, shape):
    m, k, n, sizes = SHAPES[shape]
    A, W, offs, dy = _problem(m, k, n, sizes)
    y, da, dw = _step(A, W, offs, dy, "sm100", recipe=recipe)
    yr, dar, dwr = _step(A, W, offs, dy, "reference", recipe=recipe)
    _assert_same_mx_gemm(y, yr, "forward")
    _assert_same_mx_gemm(da, dar, "dgrad")
    _assert_same_mx_gemm(dw, dwr, "wgrad")
    end = sum(sizes)
    assert torch.all(y[end:] == 0) and torch.all(da[end:] == 0)
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.all(dw[g] == 0)
    # Forward and dgrad always, wgrad unless it runs unquantized: the MX GEMMs really went through
    # torch._scaled_grouped_mm.
    expected = ["2d3d", "2d3d"] + ([] if recipe == "mxfp8_rceil_wgrad_with_hp" else ["2d2d"])
    assert sorted(emulated_sm100) == sorted(expected)


def test_sm100_bias_fp32_out_and_pre_quantized_input(emulated_sm100):
    m, k, n, sizes = SHAPES["jagged"]
    A, W, offs, dy = _problem(m, k, n, sizes, dtype=torch.float32)
    bias = torch.randn(len(sizes), n, requires_grad=True)
    kw = dict(recipe="mxfp8_rceil", out_dtype=torch.float32)
    outs = {}
    for be in ("sm100", "reference"):
        b = bias.detach().clone().requires_grad_()
        w = W.detach().clone().requires_grad_()
        y = mxmoe.grouped_mm(mxmoe.quantize(A), w.transpose(-2, -1), offs, backend=be, bias=b, **kw)
        y.backward(dy)
        outs[be] = (y.detach(), w.grad, b.grad)
    (y, dw, db), (yr, dwr, dbr) = outs["sm100"], outs["reference"]
    # torch's MXFP8 GEMM writes bf16 only: fp32 outputs carry bf16 precision, bias added after it.
    assert y.dtype == torch.float32 and rel_err(y, yr) < 2**-8
    assert torch.all(y[sum(sizes):] == 0)
    assert dw.dtype == torch.float32 and rel_err(dw, dwr) < 2**-8
    assert torch.equal(db, dbr)


def test_sm100_rejects_a_wrong_scale_layout(emulated_sm100, monkeypatch):
    # Control: the same call with A's scales blocked as one whole matrix instead of per group (right
    # only when every group starts on a multiple of 128 rows) must not pass the comparison.
    from mxmoe import _lib, ops

    real = ops.quantize_fused

    def whole_blocked_rows(x, offs, *args):
        outs = list(real(x, offs, *args))
        if offs is not None and x.dim() == 2 and outs[3].numel() > 0:
            _, _, s, _ = ops.quantize(x, None, 1, args[0], args[3], True, False, True, False)
            whole = ops.scales_to_blocked(s, _lib.BLOCKED_WHOLE, None)
            outs[3] = torch.cat([whole, whole.new_zeros(outs[3].numel() - whole.numel())])
        return outs

    monkeypatch.setattr(ops, "quantize_fused", whole_blocked_rows)
    m, k, n, sizes = SHAPES["jagged"]
    A, W, offs, dy = _problem(m, k, n, sizes)
    y = mxmoe.grouped_mm(A, W.transpose(-2, -1), offs, backend="sm100")
    yr = mxmoe.grouped_mm(A, W.transpose(-2, -1), offs, backend="reference")
    with pytest.raises(AssertionError):
        _assert_same_mx_gemm(y, yr, "forward")


def test_token_padding_places_groups_on_32_token_boundaries():
    ends = torch.tensor([100, 100, 177, 327], dtype=torch.int32)
    dest, pad_ends, nonempty, t_pad = sm100._token_padding(ends, 384)
    assert pad_ends.tolist() == [128, 128, 224, 384]
    assert nonempty.tolist() == [True, False, True, True]
    assert t_pad == 32 * (12 + 4)
    assert dest[:100].tolist() == list(range(100))
    assert dest[100:177].tolist() == list(range(128, 205))
    assert dest[177:327].tolist() == list(range(224, 374))
    assert dest[327:].tolist() == list(range(384, 441))  # tokens past the groups: after them, unique
    assert int(dest.max()) < t_pad


# ---- the device gate ---------------------------------------------------------------------------------


def _fake_capability(monkeypatch, cap):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    # 'auto' is resolved once per device and cached; bypass the cache while the capability is faked.
    monkeypatch.setattr(backends, "_auto_cuda_backend", backends._auto_cuda_backend.__wrapped__)


@pytest.mark.parametrize("cap,expected", [((9, 0), "sm90"), ((10, 0), "sm100"), ((10, 3), "sm100"),
                                          ((8, 0), "emulated"), ((12, 0), "emulated")])
def test_auto_picks_sm100_only_on_blackwell(monkeypatch, cap, expected):
    _fake_capability(monkeypatch, cap)
    assert backends.resolve_backend("auto", torch.device("cuda", 0)) == expected
    assert backends.resolve_backend("auto", torch.device("cpu")) == "reference"


def test_auto_needs_torch_scaled_grouped_mm(monkeypatch):
    _fake_capability(monkeypatch, (10, 0))
    monkeypatch.delattr(torch, "_scaled_grouped_mm")
    assert backends.resolve_backend("auto", torch.device("cuda", 0)) == "emulated"


@pytest.mark.parametrize("cap", [(9, 0), (8, 9), (12, 0)])
def test_explicit_sm100_on_another_gpu_raises(monkeypatch, cap):
    _fake_capability(monkeypatch, cap)
    with pytest.raises(ValueError, match=r"backend: 'sm100' needs .*\(10, x\).* got compute capability "
                                         + str(tuple(cap)).replace("(", r"\(").replace(")", r"\)")):
        backends.resolve_backend("sm100", torch.device("cuda", 0))


def test_explicit_sm100_on_cpu_raises_before_any_gemm(monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("torch._scaled_grouped_mm reached on a non-Blackwell device")

    monkeypatch.setattr(sm100, "scaled_grouped_mm", must_not_run)
    A, W, offs, _ = _problem(64, 64, 32, [64])
    with pytest.raises(ValueError, match=r"backend: 'sm100' needs .* got a cpu device"):
        mxmoe.grouped_mm(A, W.transpose(-2, -1), offs, backend="sm100")


# ---- on a real Blackwell GPU -------------------------------------------------------------------------


def _is_blackwell():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10


@pytest.mark.gpu
@pytest.mark.skipif(not _is_blackwell(), reason="the sm100 backend needs a Blackwell GPU (compute capability 10.x)")
@pytest.mark.parametrize("recipe", RECIPES)
def test_sm100_on_blackwell(recipe):
    if not mxmoe.has_cuda():
        pytest.skip("libmxmoe was built without CUDA")
    assert backends.resolve_backend("auto", torch.device("cuda")) == "sm100"
    m, k, n, sizes = 4096, 768, 1024, [0, 517, 1, 999, 0, 77, 1200, 31]  # jagged, rows left over
    A = torch.randn(m, k, device="cuda", dtype=BF16)
    W = (torch.randn(len(sizes), n, k, device="cuda") / k**0.5).to(BF16)
    dy = torch.randn(m, n, device="cuda", dtype=BF16)
    offs = offsets(sizes, "cuda")
    y, da, dw = _step(A, W, offs, dy, "sm100", recipe=recipe)
    yr, dar, dwr = _step(A.cpu(), W.cpu(), offs.cpu(), dy.cpu(), "reference", recipe=recipe)
    end = sum(sizes)
    assert torch.all(y[end:] == 0) and torch.all(da[end:] == 0)
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.all(dw[g] == 0)
    # The same MX GEMMs as the exact reference, up to accumulation order and one bf16 rounding.
    assert rel_err(y.cpu(), yr) < 5e-3 and rel_err(da.cpu(), dar) < 5e-3 and rel_err(dw.cpu(), dwr) < 5e-3
    assert sqnr(y.cpu(), yr) > 40

    fn = torch.compile(lambda a, b, o: mxmoe.grouped_mm(a, b, o, recipe=recipe), fullgraph=True, dynamic=True)
    yc = fn(A, W.transpose(-2, -1), offs)
    assert rel_err(yc, y) < 1e-3
