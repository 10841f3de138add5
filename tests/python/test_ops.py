"""torch.ops.mxmoe.*: opcheck (schema, fake/meta, autograd registration, AOT dispatch with dynamic
shapes) for every op, and spot checks of the ops' results against the C core's scalar codecs.
Full bit-exactness of the kernels is tested in C++ (tests/cpp); these check the binding."""
import pytest
import torch

import mxmoe  # noqa: F401  (registers torch.ops.mxmoe)
from mxmoe import _lib
from mx_testutils import e4m3_from_float, e4m3_to_float, e8m0_from_amax, e8m0_to_float, offsets

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
q_op = torch.ops.mxmoe.quantize.default
RCEIL, FLOOR = _lib.SCALE_RCEIL, _lib.SCALE_FLOOR


_FP8 = (E4M3, E8M0)


def _opcheck(op, args):
    """torch.library.opcheck. Its schema test compares inputs before/after with torch.allclose, which
    torch does not implement for float8 dtypes; for ops taking fp8 inputs that test is replaced by the
    same check done bitwise here (no input mutated, no output aliasing an input)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not any(t.dtype in _FP8 for t in tensors):
        torch.library.opcheck(op, args)
        return
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(op, args, test_utils=utils)
    before = [t.view(torch.uint8).clone() if t.dtype in _FP8 else t.clone() for t in tensors]
    outs = op(*args)
    outs = outs if isinstance(outs, (tuple, list)) else [outs]
    for t, b in zip(tensors, before):
        assert torch.equal(t.view(torch.uint8) if t.dtype in _FP8 else t, b), "an input was mutated"
        for o in outs:
            if isinstance(o, torch.Tensor) and o.numel() and t.numel():
                assert o.untyped_storage().data_ptr() != t.untyped_storage().data_ptr(), "output aliases input"


# ---- opcheck ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,offs,block,wants",
    [
        ((64, 96), None, (1, 32), (True, False, True, False)),
        ((64, 96), None, (1, 128), (True, True, True, False)),
        ((70, 64), [5, 0, 40, 20], (32, 1), (False, True, False, True)),
        ((2, 96, 64), None, (32, 1), (True, True, False, True)),
        ((2, 96, 160), None, (128, 128), (True, True, True, True)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_opcheck_quantize(shape, offs, block, wants, dtype):
    x = torch.randn(shape, dtype=dtype)
    o = offsets(offs) if offs else None
    _opcheck(torch.ops.mxmoe.quantize.default, (x, o, block[0], block[1], RCEIL, *wants))


def test_opcheck_dequantize():
    x = torch.randn(70, 64)
    o = offsets([5, 0, 40, 20])
    q, qt, sc, sr = q_op(x, o, 32, 1, RCEIL, True, True, False, True)
    _opcheck(torch.ops.mxmoe.dequantize.default, (qt, sr, 1, o, torch.float32))
    q, _, sc, _ = q_op(x, None, 1, 32, RCEIL, True, False, True, False)
    _opcheck(torch.ops.mxmoe.dequantize.default, (q, sc, 1, None, torch.bfloat16))
    x3 = torch.randn(2, 64, 32)
    q, _, _, sr = q_op(x3, None, 32, 1, RCEIL, True, False, False, True)
    _opcheck(torch.ops.mxmoe.dequantize.default, (q, sr, 0, None, torch.float32))


def _scales(*shape):
    return torch.randint(100, 140, shape, dtype=torch.uint8).view(E8M0)


@pytest.mark.parametrize("kind", ["whole", "groups_m", "groups_k", "per_expert"])
def test_opcheck_blocked(kind):
    o = offsets([37, 0, 200, 3])  # M = 240 tokens / rows
    if kind == "whole":
        s, k, off = _scales(130, 6), _lib.BLOCKED_WHOLE, None
    elif kind == "groups_m":
        s, k, off = _scales(240, 5), _lib.BLOCKED_GROUPS_M, o
    elif kind == "groups_k":
        s, k, off = _scales(70, mxmoe.ops.grouped_scale_capacity(240, 4)), _lib.BLOCKED_GROUPS_K, o
    else:
        s, k, off = _scales(3, 130, 6), _lib.BLOCKED_PER_EXPERT, None
    _opcheck(torch.ops.mxmoe.scales_to_blocked.default, (s, k, off))
    b = torch.ops.mxmoe.scales_to_blocked(s, k, off)
    _opcheck(torch.ops.mxmoe.scales_from_blocked.default, (b, k, off, list(s.shape)))


def _mx_operands(M=100, K=64, N=96, G=3, sizes=(30, 0, 61)):
    a = torch.randn(M, K)
    w = torch.randn(G, N, K)
    o = offsets(sizes)
    aq, _, asc, _ = q_op(a, None, 1, 32, RCEIL, True, False, True, False)
    wq, _, wsc, _ = q_op(w, None, 1, 32, RCEIL, True, False, True, False)
    return aq, asc, wq, wsc, o


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_opcheck_grouped_mm_mx(with_bias, out_dtype):
    aq, asc, wq, wsc, o = _mx_operands()
    bias = torch.randn(3, 96) if with_bias else None
    _opcheck(torch.ops.mxmoe.grouped_mm_mx.default, (aq, asc, wq, wsc, o, bias, out_dtype))


def test_opcheck_grouped_mm_mx_kgroups():
    M, N, K = 100, 96, 64
    o = offsets([30, 0, 61])
    _, dyt, _, dys = q_op(torch.randn(M, N), o, 32, 1, RCEIL, False, True, False, True)
    _, at, _, as_ = q_op(torch.randn(M, K), o, 32, 1, RCEIL, False, True, False, True)
    _opcheck(torch.ops.mxmoe.grouped_mm_mx_kgroups.default, (dyt, dys, at, as_, o, torch.float32))


def test_opcheck_check_offsets():
    _opcheck(torch.ops.mxmoe.check_offsets.default, (offsets([3, 0, 5]), 10))


def test_opcheck_clamp_offsets():
    _opcheck(torch.ops.mxmoe.clamp_offsets.default, (offsets([3, 0, 5]), 6))


def test_opcheck_dense_grouped_mm():
    o = offsets([30, 0, 61])
    _opcheck(torch.ops.mxmoe._dense_grouped_mm.default, (torch.randn(100, 64), torch.randn(3, 64, 32), o))


# ---- results vs MX_SPEC's scalar codecs (mx_testutils: written from the spec, not from the core) -----

_e8m0, _e4m3 = e8m0_from_amax, e4m3_from_float


@pytest.mark.parametrize("mode", [RCEIL, FLOOR, _lib.SCALE_CEIL, _lib.SCALE_EVEN])
def test_quantize_spot_bits(mode):
    # fp32 input with a wide dynamic range; check a few 32-blocks against the scalar codecs:
    # s = e8m0(amax), q_i = e4m3(x_i * 2^(127 - s)) (the product is exact in fp32 here: a power of 2).
    x = torch.randn(8, 128) * torch.logspace(-20, 20, 8, base=2).unsqueeze(1)
    q, _, s, _ = q_op(x, None, 1, 32, mode, True, False, True, False)
    qb, sb = q.view(torch.uint8), s.view(torch.uint8)
    for r, blk in [(0, 0), (3, 2), (7, 3), (5, 1)]:
        xs = x[r, 32 * blk : 32 * blk + 32]
        sbyte = _e8m0(xs.abs().max().item(), mode)
        assert sb[r, blk].item() == sbyte
        scale = torch.tensor(2.0 ** (127 - sbyte), dtype=torch.float32)
        expected = [_e4m3((v * scale).item()) for v in xs]
        assert qb[r, 32 * blk : 32 * blk + 32].tolist() == expected


def test_dequantize_spot_values():
    q = torch.randint(0, 256, (4, 64), dtype=torch.uint8)
    q[q == 0x7F] = 0
    q[q == 0xFF] = 0
    s = torch.randint(100, 150, (4, 2), dtype=torch.uint8)
    out = torch.ops.mxmoe.dequantize(q.view(E4M3), s.view(E8M0), 1, None, torch.float32)
    for r, c in [(0, 0), (1, 33), (3, 63), (2, 17)]:
        expect = e4m3_to_float(q[r, c].item()) * e8m0_to_float(s[r, c // 32].item())
        assert out[r, c].item() == expect


def test_quantize_orientations_agree():
    # Blocks along dim -2 of x equal blocks along the last dim of x^T (same bits), for 32 and 128.
    x = torch.randn(256, 96)
    for b in (32, 128):
        _, qt, _, sr = q_op(x, None, b, 1, RCEIL, False, True, False, True)
        q, _, sc, _ = q_op(x.t().contiguous(), None, 1, b, RCEIL, True, False, True, False)
        assert torch.equal(qt.view(torch.uint8), q.view(torch.uint8)), f"block {b}"
        assert torch.equal(sr.view(torch.uint8), sc.view(torch.uint8)), f"block {b}"


def test_quantize_1x128_repeats_the_block_scale():
    # A 1x128 block's byte is the rule applied to the amax of all 128 elements, repeated 4 times.
    x = torch.randn(16, 256) * torch.logspace(-3, 3, 16, base=2).unsqueeze(1)
    _, _, s, _ = q_op(x, None, 1, 128, RCEIL, True, False, True, False)
    sb = s.view(torch.uint8)
    for r in range(16):
        for blk in range(2):
            expect = _e8m0(x[r, 128 * blk : 128 * blk + 128].abs().max().item(), RCEIL)
            assert sb[r, 4 * blk : 4 * blk + 4].tolist() == [expect] * 4, (r, blk)


def test_blocked_layout_spot_bytes_and_round_trip():
    s = torch.randint(1, 255, (130, 6), dtype=torch.uint8)
    b = torch.ops.mxmoe.scales_to_blocked(s.view(E8M0), _lib.BLOCKED_WHOLE, None).view(torch.uint8)
    Wp = 8
    for i, j in [(0, 0), (129, 5), (37, 3), (100, 4)]:
        idx = ((i // 128) * (Wp // 4) + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
        assert b[idx].item() == s[i, j].item()
    assert int(b.sum()) == int(s.sum())  # padding bytes are zero
    back = torch.ops.mxmoe.scales_from_blocked(b.view(E8M0), _lib.BLOCKED_WHOLE, None, [130, 6])
    assert torch.equal(back.view(torch.uint8), s)


def test_check_offsets_op():
    # torch.ops.mxmoe.* raise RuntimeError (torch's type for every C++ error) with the core's message;
    # mxmoe.ops' functions raise ValueError with the same message.
    from mxmoe import ops

    ops.check_offsets(offsets([3, 0, 5]), 8)
    with pytest.raises(ValueError, match=r"^mxmoe\.check_offsets: offs"):
        ops.check_offsets(torch.tensor([3, 2], dtype=torch.int32), 8)
    with pytest.raises(ValueError, match="offs"):
        ops.check_offsets(torch.tensor([3, 9], dtype=torch.int32), 8)
    with pytest.raises(RuntimeError, match=r"mxmoe\.check_offsets \(invalid argument\): offs"):
        torch.ops.mxmoe.check_offsets(torch.tensor([3, 2], dtype=torch.int32), 8)


def test_clamp_offsets_op():
    # min(m, max(0, offs[0..g])): written out for a few cases (negative, decreasing, past m, empty).
    cases = [([3, 0, 5], 8, [3, 3, 5]), ([-4, 2, 1, 9], 6, [0, 2, 2, 6]), ([], 5, [])]
    for offs, m, want in cases:
        got = torch.ops.mxmoe.clamp_offsets(torch.tensor(offs, dtype=torch.int32), m)
        assert got.dtype == torch.int32 and got.tolist() == want
    long_offs = torch.randint(-50, 400, (300,), dtype=torch.int32)  # more than one warp of groups
    want = torch.cummax(long_offs.clamp(min=0), 0).values.clamp(max=333)
    assert torch.equal(torch.ops.mxmoe.clamp_offsets(long_offs, 333), want)


# ---- fused quantization -----------------------------------------------------------------------------

ALL_OUT = 63  # q, qt, scale, scale_blocked, dq, dqt


@pytest.mark.parametrize(
    "shape,sizes,rb,cb,tile",
    [((256, 96), None, 32, 32, False), ((203, 64), [50, 0, 140], 128, 32, False), ((2, 160, 256), None, 128, 128, True)],
)
def test_opcheck_quantize_fused(shape, sizes, rb, cb, tile):
    x = torch.randn(shape, dtype=torch.bfloat16)
    o = offsets(sizes) if sizes else None
    _opcheck(torch.ops.mxmoe.quantize_fused.default, (x, o, rb, cb, tile, RCEIL, ALL_OUT, ALL_OUT, torch.float32))
    _opcheck(torch.ops.mxmoe.quantize_fused.default, (x, o, rb, cb, tile, RCEIL, 0, 5, torch.bfloat16))


def test_quantize_fused_equals_the_composition():
    # The fused op's bytes are mxmoe_quantize + mxmoe_dequantize + mxmoe_scales_to_blocked composed.
    x = torch.randn(203, 96)
    o = offsets([50, 0, 140])
    outs = torch.ops.mxmoe.quantize_fused(x, o, 32, 32, False, RCEIL, ALL_OUT, ALL_OUT, torch.float32)
    rq, rqt, rs, rsb, rdq, rdqt, cq, cqt, cs, csb, cdq, cdqt = outs
    q, qt, s, _ = q_op(x, None, 1, 32, RCEIL, True, True, True, False)
    assert torch.equal(_u8(rq), _u8(q)) and torch.equal(_u8(rqt), _u8(qt)) and torch.equal(_u8(rs), _u8(s))
    assert torch.equal(_u8(rsb), _u8(torch.ops.mxmoe.scales_to_blocked(s, _lib.BLOCKED_GROUPS_M, o)))
    assert torch.equal(rdq, torch.ops.mxmoe.dequantize(q, s, 1, None, torch.float32)) and torch.equal(rdqt, rdq.t())
    q, qt, _, s = q_op(x, o, 32, 1, RCEIL, True, True, False, True)
    assert torch.equal(_u8(cq), _u8(q)) and torch.equal(_u8(cqt), _u8(qt)) and torch.equal(_u8(cs), _u8(s))
    assert torch.equal(_u8(csb), _u8(torch.ops.mxmoe.scales_to_blocked(s, _lib.BLOCKED_GROUPS_K, o)))
    assert torch.equal(cdqt, torch.ops.mxmoe.dequantize(qt, s, 1, o, torch.float32)) and torch.equal(cdq, cdqt.t())
    with pytest.raises(ValueError, match="row, col: expected at least one side"):
        mxmoe.ops.quantize_fused(x, o, 32, 32, False, RCEIL, 0, 0, torch.float32)


def _u8(t):
    return t.view(torch.uint8)
