"""The sm90 recipe phases (one op per forward / backward of a grouped_mm) against the composition of
the primitive ops they replace (quantize_fused + grouped_mm_tile128 / dequantize + torch._grouped_mm):
bit-identical outputs, and only the outputs each phase needs. The ops run on CPU too (the core's
reference kernels), so CI covers the logic; the GPU runs the same test on the H200 kernels."""
import pytest
import torch

from mxmoe import ops
from mx_testutils import offsets

Q, QT, S, DQ = ops.FUSED_Q, ops.FUSED_QT, ops.FUSED_SCALE, ops.FUSED_DQ
RCEIL = 0
BF16 = torch.bfloat16

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _u8(t):
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu) else t


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(_u8(a), _u8(b))


def _inputs(device, m=333, k=256, n=384, sizes=(100, 0, 150, 33)):
    a = torch.randn(m, k, dtype=BF16, device=device)
    w = torch.randn(len(sizes), n, k, dtype=BF16, device=device)
    dy = torch.randn(m, n, dtype=BF16, device=device)
    return a, w, dy, offsets(list(sizes), device)


def _tile128_available(device):
    if device == "cpu":
        return True
    from mxmoe import build_info

    return build_info()["tile128_gemm"] and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("want_a_col", [True, False])
def test_tile128_phases_equal_the_composition(device, want_a_col):
    if not _tile128_available(device):
        pytest.skip("needs Hopper and the tile128 GEMMs")
    a, w, dy, offs = _inputs(device)
    bias = torch.randn(w.shape[0], w.shape[1], dtype=BF16, device=device)
    w_q, w_qs, w_qt, w_s = ops.sm90_tile128_weight(w, RCEIL)
    out, a_qt, a_s = ops.sm90_tile128_forward(a, w_q, w_qs, offs, bias, RCEIL, torch.float32, want_a_col)
    a_row, a_col = ops.quantize_fused_sides(a, offs, 128, 128, False, RCEIL, Q | S, QT | S)
    w_row, w_col = ops.quantize_fused_sides(w, None, 128, 128, True, RCEIL, Q | S, QT | S)
    _same(w_q, w_row["q"])
    _same(w_qs, w_row["scale"])
    _same(out, ops.grouped_mm_tile128(a_row["q"], a_row["scale"], w_row["q"], w_row["scale"], offs, bias,
                                      torch.float32))
    _same(w_qt, w_col["qt"])
    _same(w_s, w_col["scale"])
    if want_a_col:
        _same(a_qt, a_col["qt"])
        _same(a_s, a_col["scale"])
    else:
        assert a_qt.numel() == 0 and a_s.numel() == 0  # not computed, not allocated
    if not want_a_col:
        return
    da, dw = ops.sm90_tile128_backward(dy, w_qt, w_s, a_qt, a_s, offs, RCEIL, True, True, BF16, torch.float32)
    dy_row, dy_col = ops.quantize_fused_sides(dy, offs, 128, 128, False, RCEIL, Q | S, QT | S)
    _same(da, ops.grouped_mm_tile128(dy_row["q"], dy_row["scale"], w_qt, w_s, offs, None, BF16))
    _same(dw, ops.grouped_mm_tile128_kgroups(dy_col["qt"], dy_col["scale"], a_qt, a_s, offs, torch.float32))
    da_only, none = ops.sm90_tile128_backward(dy, w_qt, w_s, None, None, offs, RCEIL, True, False, BF16, BF16)
    _same(da_only, da)
    assert none.numel() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_exact_phases_equal_the_composition(device):
    a, w, dy, offs = _inputs(device)
    m = a.shape[0]
    w_dq, w_q, w_s = ops.sm90_exact_weight(w, RCEIL)
    out, a_q, a_s = ops.sm90_exact_forward(a, w_dq, offs, RCEIL, True)
    a_row, a_col = ops.quantize_fused_sides(a, offs, 32, 32, False, RCEIL, DQ, Q | S)
    w_row, w_col = ops.quantize_fused_sides(w, None, 32, 32, False, RCEIL, DQ, Q | S)
    _same(w_dq, w_row["dq"])
    ends = ops.clamp_offsets(offs, m)
    _same(out, ops._dense_grouped_mm(a_row["dq"], w_row["dq"].transpose(-2, -1), ends))
    assert torch.count_nonzero(out[int(ends[-1]):]) == 0  # rows past the groups are zero
    _same(w_q, w_col["q"])
    _same(w_s, w_col["scale"])
    _same(a_q, a_col["q"])
    _same(a_s, a_col["scale"])
    da, dw = ops.sm90_exact_backward(dy, w_q, w_s, a_q, a_s, offs, RCEIL, True, True)
    dy_row, dy_col = ops.quantize_fused_sides(dy, offs, 32, 32, False, RCEIL, DQ, DQ)
    w_n = ops.dequantize(w_q, w_s, 0, None, BF16)
    _same(da, ops._dense_grouped_mm(dy_row["dq"], w_n, ends))
    a_m = ops.dequantize(a_q, a_s, 0, offs, BF16)
    _same(dw, ops._dense_grouped_mm(dy_col["dq"].t(), a_m, ends))


@pytest.mark.parametrize("device", DEVICES)
def test_phases_clamp_bad_offsets(device):
    # Offsets past M, decreasing or negative are clamped (never out of bounds), as in every kernel.
    a, w, dy, _ = _inputs(device, m=200, sizes=(50, 50, 50, 50))
    bad = torch.tensor([-5, 120, 60, 900], dtype=torch.int32, device=device)
    good = ops.clamp_offsets(bad, a.shape[0])
    assert good.tolist() == [0, 120, 120, 200]
    w_dq = ops.sm90_exact_weight(w, RCEIL)[0]
    for fwd in (lambda o: ops.sm90_exact_forward(a, w_dq, o, RCEIL, True),):
        for x, y in zip(fwd(bad), fwd(good)):
            _same(x, y)


def test_phase_errors_name_the_argument():
    a, w, dy, offs = _inputs("cpu")
    with pytest.raises(ValueError, match=r"^mxmoe\.sm90_exact_forward: .*offs"):
        ops.sm90_exact_forward(a, ops.sm90_exact_weight(w, RCEIL)[0], offs.long(), RCEIL, True)
    with pytest.raises(ValueError, match=r"w_dq: expected the \(G, N, K\) bfloat16 MX round trip"):
        ops.sm90_exact_forward(a, w.float(), offs, RCEIL, True)
    with pytest.raises(ValueError, match=r"w: expected 2 or 3 dims"):
        ops.sm90_tile128_weight(w[0, 0], RCEIL)
