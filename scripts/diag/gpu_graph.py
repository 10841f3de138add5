import torch, mxmoe
torch.manual_seed(0)
m, n, k, sizes = 4096, 1024, 768, [0, 50, 1, 99, 0, 7, 60, 31]
A = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
W = (torch.randn(len(sizes), n, k, device="cuda") / k**0.5).to(torch.bfloat16)
dy = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
offs = torch.tensor(sizes, dtype=torch.int32, device="cuda").cumsum(0).to(torch.int32)
def f(a, w, o):
    return mxmoe.grouped_mm(a, w.transpose(-2, -1), o, recipe="mxfp8_rceil")
a = A.clone().requires_grad_(); w = W.clone().requires_grad_()
y = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")(a, w, offs)
y.backward(dy)
