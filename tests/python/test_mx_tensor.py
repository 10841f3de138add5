"""mxmoe.quantize / MXTensor: shapes, layouts (views of the core's q/qt, scale_c/scale_r), modes,
grouped scales, dequantize, and clear errors."""
import pytest
import torch

import mxmoe
from mx_testutils import offsets, sqnr

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu


def _bytes(t):
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode", ["rceil", "floor", "ceil", "even"])
def test_quantize_last_dim(dtype, mode):
    x = torch.randn(64, 96, dtype=dtype)
    mx = mxmoe.quantize(x, dim=-1, mode=mode)
    assert isinstance(mx, mxmoe.MXTensor)
    assert mx.qdata.dtype == E4M3 and mx.qdata.shape == x.shape
    assert mx.scale.dtype == E8M0 and mx.scale.shape == (64, 3)
    assert mx.mode == mode and mx.block == (1, 32) and mx.dim == -1
    assert sqnr(mx.dequantize(torch.float32), x) > 28
    assert mx.dequantize().dtype == torch.bfloat16


def test_quantize_dim_minus2_is_a_view_of_qt():
    x = torch.randn(96, 64)
    mx = mxmoe.quantize(x, dim=-2)
    assert mx.qdata.shape == x.shape and mx.scale.shape == (3, 64)
    # qdata / scale are transposed views of the contiguous qt (64, 96) / scale_r (64, 3) the core wrote
    assert mx.qdata.t().is_contiguous() and mx.scale.t().is_contiguous()
    ref = mxmoe.quantize(x.t().contiguous(), dim=-1)
    assert torch.equal(_bytes(mx.qdata.t()), _bytes(ref.qdata))
    assert torch.equal(_bytes(mx.scale.t()), _bytes(ref.scale))
    assert torch.equal(mx.dequantize(torch.float32), ref.dequantize(torch.float32).t())
    assert sqnr(mx.dequantize(torch.float32), x) > 28


def test_quantize_3d_and_higher_rank():
    w = torch.randn(3, 64, 96)
    for dim, sshape in [(-1, (3, 64, 3)), (-2, (3, 2, 96)), (2, (3, 64, 3)), (1, (3, 2, 96))]:
        mx = mxmoe.quantize(w, dim=dim)
        assert mx.qdata.shape == w.shape and mx.scale.shape == sshape
        assert sqnr(mx.dequantize(torch.float32), w) > 28
    x = torch.randn(2, 3, 4, 64)
    mx = mxmoe.quantize(x)
    assert mx.qdata.shape == x.shape and mx.scale.shape == (2, 3, 4, 2)
    assert torch.equal(mx.dequantize(torch.float32).reshape(-1, 64), mxmoe.quantize(x.reshape(-1, 64)).dequantize(torch.float32))
    x1 = torch.randn(64)
    assert mxmoe.quantize(x1).scale.shape == (2,)
    x4 = torch.randn(2, 3, 64, 32)
    mx4 = mxmoe.quantize(x4, dim=-2)
    assert mx4.scale.shape == (2, 3, 2, 32)
    assert sqnr(mx4.dequantize(torch.float32), x4) > 28


def test_quantize_grouped_rows():
    sizes = [5, 0, 70, 33]
    o = offsets(sizes)
    x = torch.randn(120, 64)  # 12 rows after the last group
    mx = mxmoe.quantize(x, dim=-2, offs=o)
    cap = -(-120 // 32) + 4
    assert mx.scale.shape == (cap, 64) and mx.offs is o
    d = mx.dequantize(torch.float32)
    assert torch.all(d[108:] == 0)  # rows outside every group
    assert sqnr(d[:108], x[:108]) > 28
    # a group's blocks never cross its end: quantizing a group alone gives the same bits
    start, end = 5, 75
    alone = mxmoe.quantize(torch.cat([x[start:end], torch.zeros(26, 64)]), dim=-2)
    assert torch.equal(_bytes(mx.qdata[start:end]), _bytes(alone.qdata[:70]))


def test_quantize_coarse_blocks():
    x = torch.randn(256, 128)
    m128 = mxmoe.quantize(x, block=128)
    assert m128.block == (1, 128) and m128.scale.shape == (256, 4)
    s = m128.scale.view(torch.uint8)
    assert torch.all(s == s[:, :1])  # one byte per 128-block, repeated per 32
    t = mxmoe.quantize(x, block="tile128")
    assert t.block == (128, 128)
    st = t.scale.view(torch.uint8)
    assert torch.all(st[:128] == st[0]) and torch.all(st[128:] == st[128])
    tr = mxmoe.quantize(x, dim=-2, block="tile128")
    assert tr.scale.shape == (8, 128)
    assert torch.equal(t.dequantize(torch.float32), tr.dequantize(torch.float32))  # one tile, both orientations
    assert sqnr(t.dequantize(torch.float32), x) > 25


def test_quantize_errors():
    x = torch.randn(64, 64)
    with pytest.raises(ValueError, match="x: expected dtype bfloat16 or float32, got float16"):
        mxmoe.quantize(x.half())
    with pytest.raises(ValueError, match="mode: expected one of rceil, floor, ceil, even, got 'up'"):
        mxmoe.quantize(x, mode="up")
    with pytest.raises(ValueError, match="block: expected 32, 128 or 'tile128'"):
        mxmoe.quantize(x, block=64)
    with pytest.raises(ValueError, match="dim: expected the last or second-to-last dim"):
        mxmoe.quantize(torch.randn(2, 64, 64), dim=0)
    with pytest.raises(ValueError, match="offs: token groups apply to blocks along dim -2"):
        mxmoe.quantize(x, dim=-1, offs=offsets([64]))
    with pytest.raises(ValueError, match="offs: expected a 1-D int32 tensor"):
        mxmoe.quantize(x, dim=-2, offs=torch.tensor([64]))
    with pytest.raises(ValueError, match="x: expected a cpu or cuda tensor, got a tensor on device 'meta'"):
        mxmoe.quantize(torch.empty(64, 64, device="meta"))
    with pytest.raises(ValueError, match="multiple of 32, got 48"):  # the core's message
        mxmoe.quantize(torch.randn(4, 48))
