"""quantize_fused_source: the fused quantizer reading a computed input (the MoE layer's dispatch gather,
SwiGLU and SwiGLU backward) gives the bytes of materializing that input with the MoE ops
(moe_gather / swiglu / swiglu_backward) and quantizing it with quantize_fused. On CPU (the core's
reference composes exactly that) and on the GPU (one pass in the tile kernel, nothing materialized),
for the tile128 blocks (1x128 rowwise + 128x1 per token group) and the exact recipe's (1x32 round trip
+ 32x1 codes), with groups of any size; and the bad-input messages."""
import pytest
import torch

from mxmoe import ops

BF16, F32 = torch.bfloat16, torch.float32
Q, QT, S, DQ = ops.FUSED_Q, ops.FUSED_QT, ops.FUSED_SCALE, ops.FUSED_DQ
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (row_block, col_block, row outputs, col outputs): the tile128 recipe's A / dY pass, the exact one's.
BLOCKINGS = {"tile128": (128, 128, Q | S, QT | S), "exact": (32, 32, DQ, Q | S), "exact_dy": (32, 32, DQ | Q | S, DQ)}


def _u8(t):
    """The bits (NaN == NaN when their bits are equal)."""
    ints = {torch.float8_e4m3fn: torch.uint8, torch.float8_e8m0fnu: torch.uint8, torch.bfloat16: torch.int16,
            torch.float32: torch.int32}
    return t.view(ints[t.dtype]) if t.dtype in ints else t


def _same_outputs(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.shape == y.shape and x.dtype == y.dtype, i
        assert torch.equal(_u8(x), _u8(y)), f"output {i} differs"


def _offs(sizes, device):
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)


def _routing(T, k, E, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, E + 1, (T, k), generator=g)  # some ids out of range: dropped
    return ops.moe_routing(idx.to(device), E)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("blocking", list(BLOCKINGS))
@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("scaled", [False, True])
def test_gather_source(device, blocking, dtype, scaled):
    T, k, E, H = 97, 3, 5, 256
    offs, perm, inv = _routing(T, k, E, device)
    x = torch.randn(T, H, dtype=dtype).to(device)
    rs = torch.rand(T, k).to(device) if scaled else None
    rb, cb, ro, co = BLOCKINGS[blocking]
    got = ops.quantize_fused_source(ops.SOURCE_GATHER, x, None, perm, rs, k, 0, 1.0, 0.0, 0.0, offs, rb, cb, False,
                                    0, ro, co, BF16)
    xs = ops.moe_gather(x, perm, k, rs, dtype)
    want = ops.quantize_fused(xs, offs, rb, cb, False, 0, ro, co, BF16)
    _same_outputs(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("blocking", list(BLOCKINGS))
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("act", [(1.0, float("inf"), 0.0), (1.702, 7.0, 1.0)])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("I", [256, 96])  # the tile128 backward pairs gate and up column tiles when I % 128 == 0
def test_swiglu_sources(device, blocking, layout, act, backward, I):
    R = 300
    offs = _offs([100, 0, 37, 150], device)  # rows 287..299 past the groups
    h = (torch.randn(R, 2 * I) * 3).to(BF16)
    # special values in both halves (and in the gate / up columns a paired backward tile shares)
    h[3, 5], h[40, I + 5], h[41, 7], h[120, I + I // 2], h[200, 2 * I - 1] = float("nan"), float("inf"), -float("inf"), \
        float("nan"), 1e30
    h = h.to(device)
    rb, cb, ro, co = BLOCKINGS[blocking]
    if backward:
        dy = torch.randn(R, I).to(BF16).to(device)
        got = ops.quantize_fused_source(ops.SOURCE_SWIGLU_BACKWARD, h, dy, None, None, 1, layout, *act, offs, rb, cb,
                                        False, 0, ro, co, BF16)
        x = ops.swiglu_backward(dy, h, layout, *act)
    else:
        got = ops.quantize_fused_source(ops.SOURCE_SWIGLU, h, None, None, None, 1, layout, *act, offs, rb, cb, False,
                                        0, ro, co, BF16)
        x = ops.swiglu(h, layout, *act)
    _same_outputs(got, ops.quantize_fused(x, offs, rb, cb, False, 0, ro, co, BF16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("blocking", ["tile128", "exact"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("I", [256, 96])
def test_swiglu_backward_row_scale(device, blocking, layout, I):
    """SWIGLU_BACKWARD with the routing weights (perm, row_scale, k): dy row r times
    row_scale.flat[perm[r]] in fp32 (0 for a padding row) before the SwiGLU gradient: the bytes of
    materializing that fp32 dy, its swiglu_backward and quantizing the result."""
    from mxmoe.backends.phases import align_routing

    T, k, E = 70, 3, 5
    offs, perm, inv = align_routing(*_routing(T, k, E, device, seed=7), 16)
    R = perm.shape[0]
    h = (torch.randn(R, 2 * I) * 3).to(BF16).to(device)
    dy = torch.randn(R, I).to(BF16).to(device)
    rs = torch.rand(T, k).to(device)
    act = (1.702, 7.0, 1.0)
    rb, cb, ro, co = BLOCKINGS[blocking]
    got = ops.quantize_fused_source(ops.SOURCE_SWIGLU_BACKWARD, h, dy, perm, rs, k, layout, *act, offs, rb, cb, False,
                                    0, ro, co, BF16)
    factor = ops.moe_gather(torch.ones(T, 1, device=device), perm, k, rs, F32)  # (R, 1), 0 on padding rows
    assert bool((factor[perm < 0] == 0).all()) and bool((perm < 0).any())
    dh = ops.swiglu_backward(dy.float() * factor, h, layout, *act)
    _same_outputs(got, ops.quantize_fused(dh, offs, rb, cb, False, 0, ro, co, BF16))
    # the weights change the bytes
    plain = ops.quantize_fused_source(ops.SOURCE_SWIGLU_BACKWARD, h, dy, None, None, 1, layout, *act, offs, rb, cb,
                                      False, 0, ro, co, BF16)
    assert not torch.equal(_u8(plain[0 if ro & Q else 4]), _u8(got[0 if ro & Q else 4]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("blocking", ["tile128", "exact"])
def test_gather_source_padded_routing(device, blocking):
    """The tile128 layer's padded routing (mxmoe.backends.phases.align_routing): perm longer than T*k, -1 on the
    padding rows, which read as zeros; the groups start at multiples of 16."""
    from mxmoe.backends.phases import align_routing

    T, k, E, H = 61, 2, 6, 128
    offs, perm, inv = align_routing(*_routing(T, k, E, device, seed=2), 16)
    assert perm.shape[0] == (T * k + 15 * E + 15) // 16 * 16 and bool((offs % 16 == 0).all())
    x = torch.randn(T, H, dtype=BF16).to(device)
    rs = torch.rand(T, k).to(device)
    rb, cb, ro, co = BLOCKINGS[blocking]
    got = ops.quantize_fused_source(ops.SOURCE_GATHER, x, None, perm, rs, k, 0, 1.0, 0.0, 0.0, offs, rb, cb, False,
                                    0, ro, co, BF16)
    xs = ops.moe_gather(x, perm, k, rs, BF16)
    pad = perm < 0
    assert bool(pad.any()) and torch.equal(xs[pad], torch.zeros_like(xs[pad]))
    # every entry lands on its row: the gathered row of entry (t, j) is x[t] * w[t, j]
    ref = (x.float().unsqueeze(1) * rs.unsqueeze(-1)).to(BF16)  # (T, k, H)
    assert torch.equal(xs[inv.long()], ref)
    _same_outputs(got, ops.quantize_fused(xs, offs, rb, cb, False, 0, ro, co, BF16))


@pytest.mark.gpu
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("shape", ["small", "partial_columns", "many_tiles"])
def test_gather_source_cuda_equals_cpu(scaled, shape):
    """many_tiles: enough tiles that every CTA of the GPU pass takes many (64K routed rows x 8 column
    tiles), so its steady-state loop runs (copies issued two tiles ahead into three buffers), which the
    small shape never reaches past a CTA's first tiles; with the layer's padded routing (-1 rows).
    partial_columns: H = 416, the last column tile a quarter wide (its rows' copies are 64 bytes)."""
    from mxmoe.backends.phases import align_routing

    many_tiles = shape == "many_tiles"
    shapes = {"small": (129, 2, 7, 384), "partial_columns": (300, 3, 9, 416), "many_tiles": (8192, 8, 64, 1024)}
    T, k, E, H = shapes[shape]
    offs, perm, inv = _routing(T, k, E, "cpu", seed=5 if many_tiles else 4)
    if many_tiles:
        offs, perm, inv = align_routing(offs, perm, inv, 16)
        assert bool((perm < 0).any())
    x = torch.randn(T, H, dtype=BF16)
    rs = torch.rand(T, k) if scaled else None
    args = lambda d: (ops.SOURCE_GATHER, x.to(d), None, perm.to(d), None if rs is None else rs.to(d), k, 0, 1.0, 0.0,  # noqa: E731
                      0.0, offs.to(d), 128, 128, False, 0, Q | S, QT | S, BF16)
    _same_outputs([t.cpu() for t in ops.quantize_fused_source(*args("cuda"))], ops.quantize_fused_source(*args("cpu")))


def test_source_errors():
    x = torch.randn(8, 64, dtype=BF16)
    perm = torch.arange(16, dtype=torch.int32)
    base = dict(src_kind=ops.SOURCE_GATHER, src_a=x, src_b=None, perm=perm, row_scale=None, k=2, layout=0, alpha=1.0,
                limit=0.0, up_offset=0.0, offs=None, row_block=32, col_block=32, tile128=False, mode=0,
                row_outputs=Q | S, col_outputs=0, dq_dtype=BF16)

    def call(**kw):
        a = {**base, **kw}
        return ops.quantize_fused_source(*a.values())

    call()  # valid
    for kw, msg in [
        (dict(src_kind=9), "src_kind: expected GATHER"),
        (dict(perm=perm.long()), "src.perm"),
        (dict(k=0), "src.k: expected 1 <= k"),
        (dict(row_scale=torch.ones(8, 3)), "src.row_scale"),
        (dict(src_kind=ops.SOURCE_SWIGLU, perm=None, src_a=x[:, :63]), "src.a"),
        (dict(src_kind=ops.SOURCE_SWIGLU, perm=None, layout=2), "src.layout: expected 0"),
        (dict(src_kind=ops.SOURCE_SWIGLU_BACKWARD, perm=None), "src.b"),
        (dict(src_kind=ops.SOURCE_SWIGLU_BACKWARD, src_b=x[:, :32].contiguous(), perm=perm[:8]), "src.perm, src.row_scale: expected both"),
        (dict(src_kind=ops.SOURCE_SWIGLU_BACKWARD, src_b=x[:, :32].contiguous(), perm=perm[:8], row_scale=torch.ones(4, 3)),
         "src.k"),
        (dict(src_kind=ops.SOURCE_SWIGLU, perm=None, src_a=x.float()), "src.a"),
    ]:
        with pytest.raises(ValueError, match=msg):
            call(**kw)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gather", "gather_scaled", "swiglu", "swiglu_clamped", "swiglu_bwd", "swiglu_bwd_clamped"])
def test_sources_many_tiles(kind):
    """Shapes with many tiles per CTA (the tile128 pass is a persistent grid of ~2-3 CTAs per SM that
    resolves its tiles in increasing order with a forward-only group cursor): every CTA walks several
    panels and groups. The gather is exact on both devices: CUDA against the CPU core. SwiGLU's expf may
    differ by an ulp between host and device (CudaMoe.SwigluWithinOneUlpOfCpu), so there the source pass
    is checked against quantizing the input materialized on the GPU, and that quantization against the
    CPU core's on the same bytes."""
    g = torch.Generator().manual_seed(11)
    if kind.startswith("gather"):
        T, k, E, H = 16384, 4, 64, 512
        idx = torch.randint(0, E, (T, k), generator=g)
        offs, perm, _ = ops.moe_routing(idx, E)
        x = torch.randn(T, H, generator=g).to(BF16)
        rs = torch.rand(T, k, generator=g) if kind == "gather_scaled" else None

        def run(d):
            return ops.quantize_fused_source(ops.SOURCE_GATHER, x.to(d), None, perm.to(d),
                                             None if rs is None else rs.to(d), k, 0, 1.0, 0.0, 0.0, offs.to(d), 128,
                                             128, False, 0, Q | S, QT | S, BF16)
        _same_outputs([t.cpu() for t in run("cuda")], run("cpu"))
        return
    R, I = 65536, 256
    sizes = torch.randint(0, 2 * R // 64, (64,), generator=g)
    sizes[3] = 0
    sizes = (sizes * (R - 1000) // int(sizes.sum())).tolist()  # rows past the last group
    offs = _offs(sizes, "cuda")
    h = (torch.randn(R, 2 * I, generator=g) * 3).to(BF16).cuda()
    dy = torch.randn(R, I, generator=g).to(BF16).cuda()
    act = (1.702, 7.0, 1.0) if kind.endswith("clamped") else (1.0, float("inf"), 0.0)
    if kind.startswith("swiglu_bwd"):
        got = ops.quantize_fused_source(ops.SOURCE_SWIGLU_BACKWARD, h, dy, None, None, 1, 0, *act, offs, 128, 128, False,
                                        0, Q | S, QT | S, BF16)
        x = ops.swiglu_backward(dy, h, 0, *act)
    else:
        got = ops.quantize_fused_source(ops.SOURCE_SWIGLU, h, None, None, None, 1, 0, *act, offs, 128, 128, False, 0,
                                        Q | S, QT | S, BF16)
        x = ops.swiglu(h, 0, *act)
    want = ops.quantize_fused(x, offs, 128, 128, False, 0, Q | S, QT | S, BF16)
    _same_outputs(got, want)
    _same_outputs([t.cpu() for t in want], ops.quantize_fused(x.cpu(), offs.cpu(), 128, 128, False, 0, Q | S, QT | S, BF16))
