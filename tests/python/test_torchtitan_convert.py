"""mxmoe.convert on TorchTitan-shaped MoE layers (router -> (scores, ids, counts), GroupedExperts with 3D
w1 / w2 / w3, shared experts, score_before_experts both ways) and on the demo model: the MoE's routed
part runs on the fused layer with the (w1, w3) pair as it is; parameters, buffers and state_dict keys
unchanged; the load-balancing counts still advance; unconvert restores the original forward."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mxmoe
import mxmoe.integrations.torchtitan as tt
from mx_testutils import sqnr

DIM, HID, E, K, T = 64, 96, 4, 2, 160


class Router(nn.Module):
    """TorchTitan's TokenChoiceTopKRouter interface: forward(x) -> (top_scores, ids, counts), counting
    tokens_per_expert itself."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(DIM, E, bias=False)
        self.top_k = K
        self.register_buffer("tokens_per_expert", torch.zeros(E), persistent=False)

    def forward(self, x):
        scores = torch.sigmoid(self.gate(x).float())
        top, ids = torch.topk(scores, K, dim=-1)
        counts = torch.histc(ids.view(-1).float(), bins=E, min=0, max=E)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts)
        return top, ids, counts


class GroupedExperts(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(E, HID, DIM) * DIM**-0.5)
        self.w2 = nn.Parameter(torch.randn(E, DIM, HID) * HID**-0.5)
        self.w3 = nn.Parameter(torch.randn(E, HID, DIM) * DIM**-0.5)

    def forward(self, x, counts):
        offs = torch.cumsum(counts, 0).to(torch.int32)
        h = F.silu(torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(x, self.w3.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, self.w2.transpose(-2, -1), offs=offs)


class SharedExpert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        return self.w(x)


class MoE(nn.Module):
    """TorchTitan's MoE.forward (torchtitan/models/common/moe/moe.py), written from its interface."""

    def __init__(self, score_before_experts):
        super().__init__()
        self.router = Router()
        self.experts = GroupedExperts()
        self.shared_experts = SharedExpert()
        self.score_before_experts = score_before_experts

    def forward(self, x):
        bs, slen, dim = x.shape
        x = x.view(-1, dim)
        top, ids, _ = self.router(x)
        counts = torch.histc(ids.view(-1).float(), bins=E, min=0, max=E)
        return self.routed_and_shared(x, top, ids, counts).reshape(bs, slen, dim)

    def routed_and_shared(self, x, top, ids, counts):
        """Sort by expert, gather, experts, scatter back, weight (before or after), add the shared expert."""
        dim = x.shape[-1]
        order = torch.argsort(ids.view(-1), stable=True)
        routed = x[order // K]
        if self.score_before_experts:
            routed = (routed.float() * top.view(-1)[order].reshape(-1, 1)).to(x.dtype)
        out_r = self.experts(routed, counts.to(torch.int64))
        unsorted = torch.zeros_like(out_r)
        unsorted[order] = out_r
        unsorted = unsorted.view(-1, K, dim)
        if self.score_before_experts:
            out_e = unsorted.sum(1)
        else:
            out_e = torch.bmm(top.reshape(-1, 1, K), unsorted.float()).to(x.dtype).squeeze(1)
        return self.shared_experts(x) + out_e


class Model(nn.Module):
    def __init__(self, score_before_experts):
        super().__init__()
        self.moe = MoE(score_before_experts)
        self.head = nn.Linear(DIM, DIM)

    def forward(self, x):
        return self.head(x + self.moe(x))


@pytest.mark.parametrize("score_before", [False, True])
def test_torchtitan_moe_runs_on_the_fused_layer(score_before, monkeypatch):
    torch.manual_seed(0)
    model = Model(score_before)
    ref = copy.deepcopy(model)
    x = torch.randn(2, T // 2, DIM)
    target = torch.randn(2, T // 2, DIM)
    params = dict(model.named_parameters())
    calls = []
    real_moe, real_gmm = tt.moe_experts, mxmoe.grouped.grouped_mm
    monkeypatch.setattr(tt, "moe_experts", lambda *a, **k: calls.append(("fused", k["recipe"])) or real_moe(*a, **k))
    monkeypatch.setattr(mxmoe.grouped, "grouped_mm",
                        lambda *a, **k: calls.append(("grouped_mm", k["recipe"])) or real_gmm(*a, **k))
    mxmoe.convert(model, recipe="mxfp8_rceil_tile128")
    assert mxmoe.conversion_mechanism(model.moe.experts) == "torchtitan"
    assert dict(model.named_parameters()) == params and model.state_dict().keys() == ref.state_dict().keys()
    y, y_ref = model(x), ref(x)
    assert calls == [("fused", "mxfp8_rceil_tile128")]  # score_before_experts too: no composed fallback
    assert sqnr(y, y_ref) > 25 and not torch.equal(y, y_ref)
    assert torch.equal(model.moe.router.tokens_per_expert, ref.moe.router.tokens_per_expert)
    F.mse_loss(y, target).backward()
    F.mse_loss(y_ref, target).backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.grad is not None and sqnr(p.grad, q.grad) > 17, (n, sqnr(p.grad, q.grad))
    # the bf16 layer matches TorchTitan's forward to fp32/bf16 rounding; unconvert restores it exactly
    mxmoe.unconvert(model)
    assert mxmoe.conversion_mechanism(model.moe.experts) is None and "forward" not in model.moe.__dict__
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))


class BiasRouter(nn.Module):
    """The reference variant's router (torchao's reference_moe.py, written from its interface):
    forward(x, expert_bias) picks the top-k of score + bias, gates with the unbiased score, and returns
    the counts for the MoE to accumulate."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(DIM, E, bias=False)
        self.top_k = K

    def forward(self, x, expert_bias=None):
        scores = torch.sigmoid(self.gate(x).float())
        choice = scores if expert_bias is None else scores + expert_bias
        _, ids = torch.topk(choice, K, dim=-1, sorted=False)
        top = scores.gather(1, ids)
        return top, ids, torch.histc(ids.view(-1).float(), bins=E, min=0, max=E)


class ReferenceMoE(MoE):
    """The reference variant: the MoE holds expert_bias and tokens_per_expert, a reorderer sorts."""

    def __init__(self, score_before_experts):
        super().__init__(score_before_experts)
        self.router = BiasRouter()
        self.reorderer = nn.Identity()
        self.register_buffer("expert_bias", torch.linspace(-0.3, 0.3, E))
        self.register_buffer("tokens_per_expert", torch.zeros(E), persistent=False)

    def forward(self, x):
        bs, slen, dim = x.shape
        x = x.view(-1, dim)
        top, ids, counts = self.router(x, self.expert_bias)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts)
        return self.routed_and_shared(x, top, ids, counts).reshape(bs, slen, dim)


@pytest.mark.parametrize("score_before", [False, True])
def test_reference_variant_keeps_the_expert_bias_and_the_counts(score_before, monkeypatch):
    """A non-zero expert bias changes the routing: the converted MoE must route with it (the bug was a
    3 dB output) and count on the MoE's buffer, bitwise as the original."""
    torch.manual_seed(0)
    model = Model(score_before)
    model.moe = ReferenceMoE(score_before)
    ref = copy.deepcopy(model)
    calls = []
    real = tt.moe_experts
    monkeypatch.setattr(tt, "moe_experts", lambda *a, **k: calls.append(k["score_before"]) or real(*a, **k))
    mxmoe.convert(model, recipe="mxfp8_rceil_tile128")
    assert model.moe.__dict__["_mxmoe_variant"] == "reference"
    x = torch.randn(2, T // 2, DIM)
    y, y_ref = model(x), ref(x)
    assert calls == [score_before]
    assert sqnr(y, y_ref) > 25 and not torch.equal(y, y_ref)
    assert torch.equal(model.moe.tokens_per_expert, ref.moe.tokens_per_expert)
    assert ref.moe.tokens_per_expert.sum() == T * K
    unbiased = torch.topk(torch.sigmoid(ref.moe.router.gate(x.view(-1, DIM))), K)[1].sort(-1)[0]
    biased = ref.moe.router(x.view(-1, DIM), ref.moe.expert_bias)[1].sort(-1)[0]
    assert not torch.equal(unbiased, biased)  # the bias matters on these inputs
    F.mse_loss(y, torch.zeros_like(y)).backward()
    F.mse_loss(y_ref, torch.zeros_like(y)).backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.grad is not None and sqnr(p.grad, q.grad) > 17, (n, sqnr(p.grad, q.grad))


def test_shared_experts_that_are_not_a_feed_forward_are_named():
    with pytest.raises(ValueError, match=r"module 'moe'.shared_experts \(SharedExpert\) is not TorchTitan's FeedForward"):
        mxmoe.convert(Model(True), shared_experts=True)
    with pytest.raises(ValueError, match="shared_experts: expected a bool"):
        mxmoe.convert(Model(True), shared_experts="yes")


def test_router_taking_a_bias_without_moe_counts_is_refused():
    moe = ReferenceMoE(True)
    del moe._buffers["tokens_per_expert"]
    with pytest.raises(ValueError, match=r"module '0': mxmoe: ReferenceMoE is TorchTitan-shaped .* no variant"):
        mxmoe.convert(nn.Sequential(moe))


def test_pair_weights_are_cached_once_per_step():
    torch.manual_seed(1)
    model = mxmoe.convert(Model(False), recipe="mxfp8_rceil_tile128")
    x = torch.randn(1, T, DIM)
    mxmoe.refresh_weights()
    before = mxmoe.weight_cache_info()
    model(x).sum().backward()
    model(x).sum().backward()  # a second micro-batch: the joined (w1, w3) forms come from the cache
    after = mxmoe.weight_cache_info()
    assert after["misses"] - before["misses"] == 2  # (w1, w3) and w2, once
    assert after["hits"] - before["hits"] == 2
    with torch.no_grad():
        model.moe.experts.w3.mul_(1.5)  # an in-place write to one half invalidates the joined entry
    model(x)
    assert mxmoe.weight_cache_info()["misses"] - after["misses"] == 1


def test_demo_model_converts_through_its_hook():
    from mxmoe.demo.model import MoEModelArgs, MoETransformer

    torch.manual_seed(0)
    model = MoETransformer(MoEModelArgs(vocab_size=64, dim=64, n_layers=1, n_heads=2, max_seq_len=16,
                                        num_experts=4, top_k=2, moe_hidden=64))
    ref = copy.deepcopy(model)
    mxmoe.convert(model, recipe="mxfp8_rceil")
    moe = next(iter(model.moe_layers()))
    assert mxmoe.conversion_mechanism(moe.experts) == "demo" and moe.experts_fn is not None
    tokens = torch.randint(0, 64, (2, 16))
    y, y_ref = model(tokens), ref(tokens)
    assert sqnr(y, y_ref) > 20 and not torch.equal(y, y_ref)
    mxmoe.unconvert(model)
    assert moe.experts_fn is None and torch.equal(model(tokens), y_ref)


def test_module_that_fits_no_mechanism_is_named():
    class Opaque(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(2, 4, 4))

        def forward(self, x):
            return x

    with pytest.raises(ValueError, match=r"module .0. \(Opaque\) owns 3D weights"):
        mxmoe.convert(nn.Sequential(Opaque()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_torchtitan_moe_fused():
    torch.manual_seed(3)
    model = Model(False).cuda().to(torch.bfloat16)
    ref = copy.deepcopy(model)
    mxmoe.convert(model, recipe="mxfp8_rceil_tile128")
    x = torch.randn(4, 256, DIM, device="cuda", dtype=torch.bfloat16)
    y, y_ref = model(x), ref(x)
    assert sqnr(y.float(), y_ref.float()) > 22
    y.float().square().mean().backward()
    y_ref.float().square().mean().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert sqnr(p.grad.float(), q.grad.float()) > 15, n


# ---- the packages' own reference-variant MoE (GPU: its router counts with a CUDA-only histc) ------------


def _torchao_reference_moe():
    """torchao 0.18's copy of TorchTitan's MoE (test/prototype/moe_training/reference_moe.py in its wheel)."""
    import importlib.metadata
    import importlib.util
    import sys

    try:
        dist = importlib.metadata.distribution("torchao")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torchao not installed (carried as a wheel to the GPU machine: scripts/device_run.sh)")
    path = dist.locate_file("test/prototype/moe_training/reference_moe.py")
    spec = importlib.util.spec_from_file_location("torchao_reference_moe", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _torchtitan_v02_moe():
    """torchtitan 0.2's MoE (the released package the GPU machine's torch runs)."""
    return pytest.importorskip("torchtitan.models.moe.moe", reason="torchtitan 0.2 not installed")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the reference routers count with a CUDA-only histc")
@pytest.mark.parametrize("source", ["torchao", "torchtitan 0.2"])
@pytest.mark.parametrize("score_before,shared", [(True, False), (False, False), (True, True)])
def test_reference_moe_from_the_packages(source, score_before, shared, monkeypatch):
    """torchao's test_training.py setup at a small size: the package's MoE, bf16 on the GPU, a non-zero
    expert bias, converted with mxmoe.convert: torchao's SQNR bars, counts bitwise."""
    mod = _torchao_reference_moe() if source == "torchao" else _torchtitan_v02_moe()
    args = mod.MoEArgs(num_experts=8, num_shared_experts=1, score_func="sigmoid", top_k=2,
                       score_before_experts=score_before, load_balance_coeff=1e-3)
    torch.manual_seed(0)
    ref = mod.MoE(args, dim=256, hidden_dim=512).to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():  # torchtitan 0.2's init writes the parameters in place
        ref.init_weights(0.05, torch.device("cuda"))
        ref.expert_bias.copy_(torch.linspace(-0.1, 0.1, 8, device="cuda"))
    model = copy.deepcopy(ref)
    recipe = "mxfp8_rceil_tile128"
    mxmoe.convert(model, recipe=recipe, shared_experts=shared)
    assert mxmoe.conversion_mechanism(model.experts) == "torchtitan"
    assert model.__dict__["_mxmoe_variant"] == "reference"
    assert mxmoe.conversion_mechanism(model.shared_experts) == ("dense" if shared else None)
    calls = []
    real = tt.moe_experts
    monkeypatch.setattr(tt, "moe_experts", lambda *a, **k: calls.append((k["recipe"], k.get("score_before", False)))
                        or real(*a, **k))
    x = torch.randn(4, 512, 256, dtype=torch.bfloat16, device="cuda")
    xm, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, y_ref = model(xm), ref(xr)
    assert calls == [(recipe, score_before)] + [(recipe, False)] * shared
    # torchao's output and weight-grad bars (23 / 21 dB); its input-grad bar (27) holds at its own size
    # (dim 5120: 31-35 dB in bench/bench_torchtitan.py), at this small size the layer's own bar (22)
    assert sqnr(y.float(), y_ref.float()) >= 23 and not torch.equal(y, y_ref)
    assert torch.equal(model.tokens_per_expert, ref.tokens_per_expert)
    assert ref.tokens_per_expert.sum() == 4 * 512 * 2
    target = torch.randn_like(x)
    F.mse_loss(y, target).backward()
    F.mse_loss(y_ref, target).backward()
    assert sqnr(xm.grad.float(), xr.grad.float()) >= 22
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert sqnr(p.grad.float(), q.grad.float()) >= 21, (n, sqnr(p.grad.float(), q.grad.float()))


def test_unrecognised_torchao_reference_moe_is_an_error():
    mod = _torchao_reference_moe()  # built only (its router's histc runs on CUDA alone)
    moe = mod.MoE(mod.MoEArgs(num_experts=4, top_k=1), dim=64, hidden_dim=64)
    del moe._buffers["tokens_per_expert"]  # counts kept somewhere mxmoe does not know
    with pytest.raises(ValueError, match=r"mxmoe.convert: module '<root>': mxmoe: MoE is TorchTitan-shaped .* no variant"):
        mxmoe.convert(moe)
