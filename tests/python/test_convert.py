"""mxmoe.convert on a small TorchTitan-style MoE whose experts call torch._grouped_mm on 3D weight
parameters: the calls are redirected (eager and torch.compile), parameters stay plain nn.Parameters,
training reduces the loss, state_dict round-trips, unconvert restores torch's path."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mxmoe
import mxmoe.grouped
from mx_testutils import sqnr
from test_compile import Recorder, _targets

DIM, HIDDEN, E, T = 64, 96, 4, 150


class GroupedExperts(nn.Module):
    """TorchTitan's pattern: 3D expert weights used through torch._grouped_mm (model code not edited)."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(E, HIDDEN, DIM) * DIM**-0.5)
        self.w2 = nn.Parameter(torch.randn(E, DIM, HIDDEN) * HIDDEN**-0.5)
        self.w3 = nn.Parameter(torch.randn(E, HIDDEN, DIM) * DIM**-0.5)

    def forward(self, x, num_tokens_per_expert):
        offs = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
        h = F.silu(torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(x, self.w3.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, self.w2.transpose(-2, -1), offs=offs)


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(DIM, E, bias=False)
        self.experts = GroupedExperts()
        self.head = nn.Linear(DIM, DIM)

    def forward(self, x):
        probs = self.router(x).softmax(-1)
        top, idx = probs.max(-1)
        order = torch.argsort(idx, stable=True)
        counts = F.one_hot(idx, E).sum(0)  # static shape: no data-dependent sizes under compile
        out = self.experts(x[order], counts) * top[order].unsqueeze(1)
        out = torch.zeros_like(x).index_copy(0, order, out)
        return self.head(x + out)


def _data():
    return torch.randn(T, DIM), torch.randn(T, DIM)


def test_convert_redirects_and_keeps_parameters(monkeypatch):
    model = MoE()
    ref_model = copy.deepcopy(model)
    params = {n: p for n, p in model.named_parameters()}
    x, _ = _data()
    ref = ref_model(x)
    calls = []
    real = mxmoe.grouped.grouped_mm
    monkeypatch.setattr(mxmoe.grouped, "grouped_mm", lambda *a, **k: calls.append(k["recipe"]) or real(*a, **k))
    assert mxmoe.convert(model, recipe="mxfp8_rceil") is model
    assert mxmoe.is_converted(model.experts) and not mxmoe.is_converted(model.router)
    y = model(x)
    assert calls == ["mxfp8_rceil"] * 3  # w1, w3, w2
    assert not torch.equal(y, ref) and sqnr(y, ref) > 25
    for n, p in model.named_parameters():
        assert p is params[n] and type(p) is nn.Parameter and type(p.data) is torch.Tensor
    assert model.state_dict().keys() == ref_model.state_dict().keys()
    mxmoe.unconvert(model)
    assert not mxmoe.is_converted(model.experts)
    assert torch.equal(model(x), ref)


def test_convert_filter_and_other_calls_pass_through():
    model = MoE()
    x, _ = _data()
    ref = model(x)
    mxmoe.convert(model, filter_fn=lambda m, fqn: False)
    assert torch.equal(model(x), ref)
    # inside a converted module, a 2D x 2D torch._grouped_mm is not the expert pattern: untouched
    redirect = mxmoe.conversion._redirecting_grouped_mm("mxfp8_rceil", "auto")
    a, b = torch.randn(96, 64), torch.randn(96, 32)  # k-grouped: (64, 96) x (96, 32)
    offs = torch.tensor([40, 96], dtype=torch.int32)
    assert torch.equal(redirect(a.t(), b, offs=offs), torch._grouped_mm(a.t(), b, offs=offs))
    # the converted forward is a copy whose globals see the redirect; torch itself is untouched
    mxmoe.convert(model)
    assert mxmoe.conversion_mechanism(model.experts) == "redirect"
    assert torch._grouped_mm is mxmoe.conversion._redirecting_grouped_mm.__globals__["torch"]._grouped_mm
    assert model.experts.forward.__func__.__globals__["torch"]._grouped_mm is not torch._grouped_mm
    with pytest.raises(ValueError, match="recipe"):
        mxmoe.convert(model, recipe="nope")


def test_converted_model_trains_and_state_dict_round_trips():
    model = mxmoe.convert(MoE(), recipe="mxfp8_rceil")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, target = _data()
    losses = []
    for _ in range(6):
        loss = F.mse_loss(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    sd = model.state_dict()
    fresh = mxmoe.convert(MoE())
    fresh.load_state_dict(sd)
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))


def test_converted_model_under_compile():
    model = mxmoe.convert(MoE(), recipe="mxfp8_rceil", backend="reference")
    x, target = _data()
    eager_model = copy.deepcopy(model)  # a deep copy is converted too (its own hooks)
    torch._dynamo.reset()
    rec = Recorder()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=rec.backend)
    y = compiled(x)
    y_eager = eager_model(x)
    assert torch.equal(y, y_eager)
    F.mse_loss(y, target).backward()
    F.mse_loss(y_eager, target).backward()
    for (n, p), q in zip(model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=n)
    fw = _targets(rec.fw[0])
    assert sum("mxmoe.grouped_mm_mx.default" in t for t in fw) == 3
    assert not any("_grouped_mm.default" in t and "mxmoe" not in t for t in fw)
    assert any("mxmoe.grouped_mm_mx_kgroups" in t for t in _targets(rec.bw[0]))


def test_deepcopy_of_converted_model():
    model = mxmoe.convert(MoE())
    ref = MoE()
    ref.load_state_dict(model.state_dict())
    x, _ = _data()
    twin = copy.deepcopy(model)
    assert mxmoe.is_converted(twin.experts) and torch.equal(twin(x), model(x))
    mxmoe.unconvert(twin)
    assert torch.equal(twin(x), ref(x)) and not torch.equal(model(x), ref(x))  # the original is untouched
