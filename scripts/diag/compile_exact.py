"""Diagnostic (device): where does the compiled exact recipe's training step differ from eager?
Logs every torch._grouped_mm call (shapes, strides, offs, input/output checksums) in eager and
compiled (aot_eager and inductor) runs of the jagged step of tests/python/test_gpu_e2e.py."""
import os
import sys

import torch

import mxmoe

torch.manual_seed(0)
m, n, k, sizes = 4096, 1024, 768, [0, 517, 1, 999, 0, 77, 1200, 31]
A = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
W = (torch.randn(len(sizes), n, k, device="cuda") / k**0.5).to(torch.bfloat16)
dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
recipe = sys.argv[1] if len(sys.argv) > 1 else "mxfp8_rceil"

LOG = []
_orig = torch._grouped_mm


def logged(a, b, offs=None, **kw):
    out = _orig(a, b, offs=offs, **kw)
    LOG.append((tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), offs.tolist() if offs is not None else None,
                a.float().sum().item(), b.float().sum().item(), out.float().nan_to_num().sum().item(),
                out.isnan().sum().item()))
    return out


torch._grouped_mm = logged

# Every mxmoe op call at run time (inside the compiled graphs too): input/output checksums, strides,
# data pointers and the stream it launches on.
from mxmoe import ops  # noqa: E402

OPLOG = []


def _sum(t):
    return None if t is None or t.numel() == 0 else round(float(t.float().nan_to_num().sum()), 3)


def _trace(name, fn):
    def wrapper(*args):
        torch.cuda.synchronize()
        ins = [(tuple(a.shape), a.stride(), a.dtype, _sum(a), a.data_ptr() % 4096) if isinstance(a, torch.Tensor) else a
               for a in args]
        outs = fn(*args)
        torch.cuda.synchronize()
        res = outs if isinstance(outs, (list, tuple)) else [outs]
        OPLOG.append((name, torch.cuda.current_stream().cuda_stream, ins,
                      [_sum(o) for o in res if isinstance(o, torch.Tensor)]))
        return outs
    return wrapper


for opname in ("quantize_fused", "dequantize", "_dense_grouped_mm"):
    op = getattr(ops, opname)
    torch.library.register_kernel(f"mxmoe::{opname}", "cuda", _trace(opname, op._init_fn))


def f(a, w, o):
    return mxmoe.grouped_mm(a, w.transpose(-2, -1), o, recipe=recipe)


def step(fn):
    LOG.clear()
    OPLOG.clear()
    a = A.detach().clone().requires_grad_()
    w = W.detach().clone().requires_grad_()
    y = fn(a, w, offs)
    y.backward(dy)
    torch.cuda.synchronize()
    if os.environ.get("MXMOE_DIAG_TRACE"):
        print(f"  -- op trace ({len(OPLOG)} calls)")
        for e in OPLOG:
            print("    ", e)
    return (y.detach(), a.grad, w.grad), list(LOG)


def report(name, ref, got):
    (r, rl), (g, gl) = ref, got
    print(f"== {name}")
    for label, x, z in zip(("y", "da", "dw"), r, g):
        eq = torch.equal(x, z)
        line = f"  {label}: equal={eq}"
        if not eq:
            d = (x.float() - z.float()).abs()
            line += f" maxdiff={d.max().item():.3e} nan_ref={x.isnan().sum().item()} nan_got={z.isnan().sum().item()}"
            if label == "dw":
                line += " per-group maxdiff=" + str([f"{v:.2e}" for v in d.flatten(1).max(1).values.tolist()])
            if label in ("y", "da"):
                rows = d.max(1).values.nonzero().flatten()
                line += f" rows differing: {rows.numel()} first={rows[:5].tolist()} last={rows[-5:].tolist()}"
                line += f" zero rows got={int((z == 0).all(1).sum())} ref={int((x == 0).all(1).sum())}"
        print(line)
    print(f"  grouped_mm calls eager={len(rl)} compiled={len(gl)}")
    for i, (a, b) in enumerate(zip(rl, gl)):
        same = a == b
        print(f"   call {i}: {'same' if same else 'DIFF'}")
        if not same:
            print(f"     eager   : {a}")
            print(f"     compiled: {b}")


e1 = step(f)
e2 = step(f)
report("eager vs eager", e1, e2)
print("dy checksum", _sum(dy), "offs", offs.tolist())
for backend in ("aot_eager", "inductor"):
    torch._dynamo.reset()
    c = step(torch.compile(f, fullgraph=True, dynamic=True, backend=backend))
    report(f"eager vs compiled[{backend}]", e1, c)
