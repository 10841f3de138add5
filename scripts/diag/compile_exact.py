"""Diagnostic (device): where does the compiled exact recipe's training step differ from eager?
Logs every torch._grouped_mm call (shapes, strides, offs, input/output checksums) in eager and
compiled (aot_eager and inductor) runs of the jagged step of tests/python/test_gpu_e2e.py."""
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


def f(a, w, o):
    return mxmoe.grouped_mm(a, w.transpose(-2, -1), o, recipe=recipe)


def step(fn):
    LOG.clear()
    a = A.detach().clone().requires_grad_()
    w = W.detach().clone().requires_grad_()
    y = fn(a, w, offs)
    y.backward(dy)
    torch.cuda.synchronize()
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
for backend in ("aot_eager", "inductor"):
    torch._dynamo.reset()
    c = step(torch.compile(f, fullgraph=True, dynamic=True, backend=backend))
    report(f"eager vs compiled[{backend}]", e1, c)
