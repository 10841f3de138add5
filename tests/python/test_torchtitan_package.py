"""mxmoe against the released torchtitan package (0.3.x): models built by the package's own code,
converted, compared with the unconverted model with a non-zero expert bias -- output and every gradient
(bf16 layer to bf16 rounding, MX recipes at torchao's SQNR bars), load-balancing counts bitwise, again
after an optimizer step and TorchTitan's own balancing update. (torchao's reference MoE and torchtitan
0.2's MoE: test_torchtitan_convert.py.) torchtitan 0.3 needs torch >= 2.12: on an older torch (the GPU
machine's 2.11) the module is skipped; CI installs it beside torch 2.13.

On the CPU the attention of the whole-model tests is causal attention through torch's SDPA (FlexAttention
has no CPU backward), the same in the reference and the converted model; the MoE is the package's.
"""
import copy
import types

import pytest
import torch
import torch.nn.functional as F

import mxmoe
import mxmoe.integrations.torchtitan as tt
from mx_testutils import sqnr

if torch.__version__ < (2, 12):
    # Its models import torch >= 2.12 APIs (torch.distributed.fsdp.DataParallelMeshDims) even where
    # torchtitan.models.common imports: skip the module before any of them is imported.
    pytest.skip("torchtitan 0.3 needs torch >= 2.12", allow_module_level=True)
pytest.importorskip("torchtitan.models.common.moe", reason="torchtitan 0.3 (needs torch >= 2.12)",
                    exc_type=ImportError)
from mxmoe.integrations.torchtitan_converter import MXMoEConverter, MXMoEFeedForward, MXMoERoutedExperts  # noqa: E402,E501
from torchtitan.components.optimizer.optimizer import register_moe_load_balancing_hook  # noqa: E402
from torchtitan.models.common.attention import FlexAttention  # noqa: E402
from torchtitan.models.common.feed_forward import FeedForward  # noqa: E402
from torchtitan.models.common.moe import GroupedExperts, MoE  # noqa: E402
from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher  # noqa: E402
from torchtitan.models.deepseek_v3 import model_registry as deepseek_v3  # noqa: E402
from torchtitan.models.gpt_oss import model_registry as gpt_oss  # noqa: E402
from torchtitan.models.qwen3 import model_registry as qwen3  # noqa: E402

MX = "mxfp8_rceil_tile128"
# torchao's test_training.py bars for its MXFP8 recipes (output, input grad, parameter grads), and what
# the bf16 fused layer must reach against TorchTitan's bf16 experts (the same math, other rounding order).
BARS = {MX: (23.0, 27.0, 21.0), "mxfp8_rceil": (23.0, 27.0, 21.0), None: (40.0, 40.0, 35.0)}
SEQ = 64


def _causal_sdpa(self, q, k, v, *, attention_masks=None, score_mod=None, scale=None, enable_gqa=False,
                 out_transform=None, **kwargs):
    assert score_mod is None and out_transform is None
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         scale=scale, enable_gqa=enable_gqa)
    return out.transpose(1, 2)


def _build(registry, flavor, converters, hidden=64, layers=2):
    """The package's debug model, cut to `layers` layers and experts of width `hidden` (CPU-sized)."""
    cfg = registry(flavor, converters=converters).model
    cfg.layers = cfg.layers[:layers]
    for _, c, _, _ in cfg.traverse(GroupedExperts.Config):
        c.hidden_dim = hidden
    torch.manual_seed(0)
    model = cfg.build()
    model.init_states(buffer_device=torch.device("cpu"))
    for m in model.modules():
        if isinstance(m, FlexAttention):
            m.forward = types.MethodType(_causal_sdpa, m)
    return model


def _moes(model):
    return [m for m in model.modules() if isinstance(m, MoE)]


def _set_bias(model, seed):
    g = torch.Generator().manual_seed(seed)
    for moe in _moes(model):
        moe.expert_bias_E.copy_(torch.randn(moe.expert_bias_E.shape, generator=g) * 0.05)


class _OneRank:
    """TorchTitan's ParallelDims as the balancing hook reads it, for one process without a mesh."""

    ep_enabled, tp = False, 1

    @staticmethod
    def get_optional_mesh(name):
        return None


def _logits(model, tokens):
    return model(tokens, torch.arange(tokens.shape[1]).repeat(tokens.shape[0], 1))


def _step(model, tokens, targets):
    logits = _logits(model, tokens)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    loss.backward()
    return logits


def _compare(y, y_ref, model, ref, bars, what):
    out_bar, _, grad_bar = bars
    s = sqnr(y.float(), y_ref.float())
    assert s >= out_bar and not torch.equal(y, y_ref), f"{what}: output SQNR {s:.1f} (bar {out_bar})"
    for (n, p), (n_ref, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert n == n_ref
        if q.grad is None:
            assert p.grad is None, n
            continue
        g = sqnr(p.grad.float(), q.grad.float())
        assert g >= grad_bar, f"{what}: grad of {n}: SQNR {g:.1f} (bar {grad_bar})"
    for moe, moe_ref in zip(_moes(model), _moes(ref)):
        assert torch.equal(moe.tokens_per_expert_E, moe_ref.tokens_per_expert_E), what
        assert moe.tokens_per_expert_E.sum() > 0


@pytest.mark.parametrize("recipe", [MX, None])
@pytest.mark.parametrize("name,registry,flavor", [("qwen3", qwen3, "debugmodel_moe"),
                                                   ("deepseek_v3", deepseek_v3, "debugmodel")])
def test_converter_matches_the_unconverted_model(name, registry, flavor, recipe, monkeypatch):
    ref = _build(registry, flavor, None)
    model = _build(registry, flavor, [MXMoEConverter.Config(recipe=recipe)])
    routed = [m for m in model.modules() if isinstance(m, MXMoERoutedExperts)]
    assert routed and len(routed) == len(_moes(model)) and all(m.recipe == recipe for m in routed)
    assert model.state_dict().keys() == ref.state_dict().keys()
    model.load_state_dict(ref.state_dict())
    _set_bias(ref, 1), _set_bias(model, 1)
    calls = []
    real = tt.moe_experts
    monkeypatch.setattr(tt, "moe_experts", lambda *a, **k: calls.append(k["recipe"]) or real(*a, **k))
    g = torch.Generator().manual_seed(2)
    opt, opt_ref = (torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref))
    register_moe_load_balancing_hook(opt, [model], _OneRank())
    register_moe_load_balancing_hook(opt_ref, [ref], _OneRank())
    for step in range(2):
        tokens = torch.randint(0, 2048, (2, SEQ), generator=g)
        targets = torch.randint(0, 2048, (2, SEQ), generator=g)
        y, y_ref = _step(model, tokens, targets), _step(ref, tokens, targets)
        assert calls == [recipe] * len(routed) * (step + 1)
        _compare(y, y_ref, model, ref, BARS[recipe], f"{name} step {step}")
        before = [moe.expert_bias_E.clone() for moe in _moes(ref)]
        opt.step(), opt_ref.step()  # the pre-hook: TorchTitan's bias update from the counts, then zeroes them
        opt.zero_grad(), opt_ref.zero_grad()
        for moe, moe_ref, b in zip(_moes(model), _moes(ref), before):
            assert torch.equal(moe.expert_bias_E, moe_ref.expert_bias_E) and not torch.equal(moe.expert_bias_E, b)
            assert moe.tokens_per_expert_E.sum() == 0
        # The next step starts from the same weights (the recipes' grads moved them apart), so that its
        # routing -- with the updated bias -- can be compared bitwise again.
        model.load_state_dict(ref.state_dict())


def test_gpt_oss_experts_with_biases_and_clamped_swiglu():
    """gpt-oss's MoE (interleaved gate/up with biases, clamped SwiGLU) from the package's debug config."""
    cfgs = {}
    for conv in (None, [MXMoEConverter.Config(recipe=MX)]):
        cfg = gpt_oss("debugmodel", converters=conv).model
        moe_cfg = next(c for _, c, _, _ in cfg.traverse(MoE.Config))
        cfgs[conv is None] = moe_cfg
    torch.manual_seed(0)
    ref = cfgs[True].build()
    moe = cfgs[False].build()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.05)
    ref.to(torch.bfloat16), moe.to(torch.bfloat16)  # gpt-oss's experts compute and return bf16
    moe.load_state_dict(ref.state_dict())
    for m in (ref, moe):
        m.expert_bias_E.copy_(torch.linspace(-0.05, 0.05, m.expert_bias_E.numel()))
    assert isinstance(moe.routed_experts, MXMoERoutedExperts)
    D = moe.router.gate.in_features
    x = torch.randn(2, SEQ, D, dtype=torch.bfloat16)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y = ref(xr), moe(xm)
    assert sqnr(y.float(), y_ref.float()) >= 23 and not torch.equal(y, y_ref)
    y.float().square().mean().backward()
    y_ref.float().square().mean().backward()
    assert sqnr(xm.grad.float(), xr.grad.float()) >= 27
    for (n, p), q in zip(moe.named_parameters(), ref.parameters()):
        assert sqnr(p.grad.float(), q.grad.float()) >= 21, (n, sqnr(p.grad.float(), q.grad.float()))
    assert torch.equal(moe.tokens_per_expert_E, ref.tokens_per_expert_E)


def test_convert_recognises_the_released_moe(monkeypatch):
    """mxmoe.convert on the package's model: RoutedExperts on the fused layer (mechanism "torchtitan")."""
    ref = _build(qwen3, "debugmodel_moe", None)
    model = copy.deepcopy(ref)
    _set_bias(ref, 3), _set_bias(model, 3)
    mxmoe.convert(model, recipe=MX)
    inner = [m for m in model.modules() if isinstance(m, GroupedExperts)]
    assert inner and all(mxmoe.conversion_mechanism(m) == "torchtitan" for m in inner)
    calls = []
    real = tt.moe_experts
    monkeypatch.setattr(tt, "moe_experts", lambda *a, **k: calls.append(k["recipe"]) or real(*a, **k))
    tokens = torch.randint(0, 2048, (2, SEQ))
    y, y_ref = _step(model, tokens, tokens), _step(ref, tokens, tokens)
    assert calls == [MX] * len(inner)
    _compare(y, y_ref, model, ref, BARS[MX], "mxmoe.convert")
    mxmoe.unconvert(model)
    with torch.no_grad():
        assert torch.equal(_logits(model, tokens), _logits(ref, tokens))


def test_grouped_experts_outside_a_known_moe_run_through_the_seam(monkeypatch):
    """A GroupedExperts on its own (or behind a dispatcher mxmoe does not know): its _grouped_mm seam runs on
    mxmoe.grouped_mm -- never a silent no-op like the forward redirect on this class used to be."""
    torch.manual_seed(4)
    ref = GroupedExperts.Config(dim=64, hidden_dim=96, num_experts=4).build()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.1)
    experts = copy.deepcopy(ref)
    mxmoe.convert(experts, recipe="mxfp8_rceil")
    assert mxmoe.conversion_mechanism(experts) == "seam"
    calls = []
    real = mxmoe.grouped.grouped_mm
    monkeypatch.setattr(mxmoe.grouped, "grouped_mm", lambda *a, **k: calls.append(k["recipe"]) or real(*a, **k))
    x = torch.randn(100, 64, dtype=torch.bfloat16)
    counts = torch.tensor([30, 0, 50, 20])
    y, y_ref = experts(x, counts), ref(x, counts)
    assert calls == ["mxfp8_rceil"] * 3
    assert sqnr(y.float(), y_ref.float()) > 20 and not torch.equal(y, y_ref)
    mxmoe.unconvert(experts)
    assert torch.equal(experts(x, counts), y_ref)


def test_expert_parallel_dispatch_is_refused_not_run_locally():
    model = _build(qwen3, "debugmodel_moe", [MXMoEConverter.Config(recipe=MX)], layers=1)
    routed = next(m for m in model.modules() if isinstance(m, MXMoERoutedExperts))
    assert isinstance(routed.token_dispatcher, AllToAllTokenDispatcher)
    routed.token_dispatcher.ep_mesh = object()  # what parallelize wires under EP > 1
    with pytest.raises(NotImplementedError, match="expert-parallel mesh"):
        model(torch.randint(0, 2048, (1, 16)), torch.arange(16)[None])


def test_converter_names_what_it_cannot_convert():
    from torchtitan.models.common.token_dispatcher import TorchAOTokenDispatcher

    cfg = qwen3("debugmodel_moe").model
    routed = next(c for _, c, _, _ in cfg.traverse(MXMoERoutedExperts.Config.__mro__[1]))
    routed.token_dispatcher = TorchAOTokenDispatcher.Config(num_experts=64, top_k=8, pad_multiple=32)
    with pytest.raises(ValueError, match=r"layers\.0\.moe\.routed_experts\.token_dispatcher is a TorchAOTokenDispatcher"):
        MXMoEConverter.Config(recipe=MX).build().convert(cfg)
    with pytest.raises(ValueError, match="recipe"):
        MXMoEConverter.Config(recipe="fp4").build()
    with pytest.raises(ValueError, match="backend: expected"):
        MXMoEConverter.Config(backend="cutlass").build()


def test_experts_with_a_replaced_gemm_are_refused():
    class Quantized(GroupedExperts):  # what another converter makes of the class
        def _grouped_mm(self, *, A, B_t, offs):
            return torch._grouped_mm(A, B_t, offs=offs)

    experts = Quantized(GroupedExperts.Config(dim=64, hidden_dim=64, num_experts=2))
    with pytest.raises(ValueError, match=r"module '<root>'|Quantized overrides GroupedExperts._grouped_mm"):
        mxmoe.convert(experts)


def test_shared_experts_on_the_fused_layer(monkeypatch):
    """shared_experts=True (converter Config and mxmoe.convert): DeepSeek-V3's shared FeedForward runs as
    one expert on the fused layer; the model still matches bf16 at the bars."""
    ref = _build(deepseek_v3, "debugmodel", None)
    model = _build(deepseek_v3, "debugmodel", [MXMoEConverter.Config(recipe=MX, shared_experts=True)])
    shared = [m for m in model.modules() if isinstance(m, MXMoEFeedForward)]
    assert shared and len(shared) == len(_moes(model)) and all(m.shared_experts is not None for m in _moes(ref))
    model.load_state_dict(ref.state_dict())
    _set_bias(ref, 6), _set_bias(model, 6)
    calls = []
    real = tt.moe_experts
    monkeypatch.setattr(tt, "moe_experts", lambda *a, **k: calls.append(k["recipe"]) or real(*a, **k))
    tokens = torch.randint(0, 2048, (2, SEQ))
    y, y_ref = _step(model, tokens, tokens), _step(ref, tokens, tokens)
    assert calls == [MX] * (2 * len(shared))  # routed + shared per MoE
    _compare(y, y_ref, model, ref, BARS[MX], "shared experts (converter)")
    # mxmoe.convert on the unconverted model does the same (mechanism "dense")
    conv = _build(deepseek_v3, "debugmodel", None)
    conv.load_state_dict(ref.state_dict())
    _set_bias(conv, 6)
    mxmoe.convert(conv, recipe=MX, shared_experts=True)
    dense = [m for m in conv.modules() if isinstance(m, FeedForward) and mxmoe.conversion_mechanism(m) == "dense"]
    assert len(dense) == len(shared)
    with torch.no_grad():
        assert torch.equal(_logits(conv, tokens), _logits(model, tokens))  # the same computation
        mxmoe.convert(conv, recipe=MX)  # again without: the shared experts are TorchTitan's again
        assert not any(mxmoe.conversion_mechanism(m) == "dense" for m in conv.modules())
        mxmoe.unconvert(conv)
        assert torch.equal(_logits(conv, tokens), _logits(ref, tokens))
