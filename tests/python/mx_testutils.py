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
