"""Helpers shared by the Python tests (not collected: the name does not start with test_)."""
import torch

RECIPE_NAMES = ["mxfp8_rceil", "mxfp8_floor", "mxfp8_rceil_wgrad_with_hp", "mxfp8_rceil_tile128"]
BACKEND_NAMES = ["reference", "emulated", "sm90"]  # sm90 runs on CPU too (its CPU ops), so CI covers its logic


def sqnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    """20 log10(||ref|| / ||x - ref||) in dB (inf when equal)."""
    x, ref = x.double(), ref.double()
    err = (x - ref).norm()
    if err == 0:
        return float("inf")
    return (20 * torch.log10(ref.norm() / err)).item()


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def offsets(sizes, device="cpu") -> torch.Tensor:
    """int32 cumulative ends of groups with the given sizes."""
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def group_ids(offs: torch.Tensor, m: int) -> torch.Tensor:
    """Group index of each row (G past the last end), for references."""
    return torch.searchsorted(offs.long(), torch.arange(m), right=True)


def reference_grouped_mm(A, B_t, offs, dy=None, bias=None):
    """bf16 autograd reference: torch._grouped_mm on the unquantized operands, fp32 accumulation and
    fp32 results (computed in fp32 on CPU: bf16 values are exact in fp32), rows past offs[-1] zeroed.
    Returns (out, dA, dB_t, dbias) (grads None without dy; torch leaves the rows of dA past offs[-1]
    unwritten, so they are zeroed here)."""
    a = A.detach().float().requires_grad_()
    b = B_t.detach().float().requires_grad_()
    out = torch._grouped_mm(a, b, offs=offs)
    m = A.shape[0]
    gid = group_ids(offs, m)
    valid = (gid < offs.shape[0]).unsqueeze(1)
    bl = None
    if bias is not None:
        bl = bias.detach().float().requires_grad_()
        ext = torch.cat([bl, torch.zeros(1, bl.shape[1])])
        out = out + ext[gid]
    out = torch.where(valid, out, torch.zeros(()))
    if dy is None:
        return out.detach(), None, None, None
    out.backward(dy.float())
    da = torch.where(valid, a.grad, torch.zeros(()))
    return out.detach(), da, b.grad, (bl.grad if bl is not None else None)


# ---- scalar codecs straight from MX_SPEC.md (independent of the core: struct bit twiddling and
# torch's own RNE float8 cast), for spot checks of the ops' bytes -----------------------------------
import struct  # noqa: E402

RCEIL, FLOOR, CEIL, EVEN = 0, 1, 2, 3


def f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def bits_f32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def _floor_byte(bits: int) -> int:
    e = (bits >> 23) & 0xFF
    p = e - 127 if e > 0 else -127
    return min(max(p - 8, -127), 128) + 127


def e8m0_from_amax(amax: float, mode: int) -> int:
    bits = f32_bits(amax) & 0x7FFFFFFF
    if bits >= 0x7F800000:  # NaN or Inf
        return 255
    if mode == RCEIL:
        d = (torch.tensor(amax, dtype=torch.float32) * torch.tensor(bits_f32(0x3B124925))).item()
        db = f32_bits(d) & 0x7FFFFFFF
        if db >= 0x7F800000:
            return 255
        e, m = db >> 23, db & 0x7FFFFF
        return e + ((m > 0x400000) if e == 0 else (m != 0))
    if mode == FLOOR:
        return _floor_byte(bits)
    if mode == CEIL:
        e = (bits >> 23) & 0xFF
        p = (e - 127 if e > 0 else -127) + (1 if bits & 0x7FFFFF else 0)
        return min(max(p - 8, -127), 128) + 127
    if mode == EVEN:
        rounded = (bits + (1 << 19)) & 0xFF800000
        if (rounded >> 23) & 0xFF == 0xFF:  # carried past the largest exponent: p = 128
            return 247
        return _floor_byte(rounded)
    raise ValueError(mode)


def e4m3_from_float(v: float) -> int:
    """RNE, saturating to +-448, NaN kept (torch's cast is RNE; the clamp makes it saturate)."""
    t = torch.tensor([v], dtype=torch.float32).clamp(-448.0, 448.0)
    return int(t.to(torch.float8_e4m3fn).view(torch.uint8).item())


def e4m3_to_float(b: int) -> float:
    return torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()


def e8m0_to_float(s: int) -> float:
    return float("nan") if s == 255 else 2.0 ** (s - 127)
