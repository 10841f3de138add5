"""The training demo (`python -m mxmoe train`): bf16 vs MXFP8 experts on the demo MoE LM.

CPU tests use a reduced config (a few seconds each); the GPU test runs the same on CUDA.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from mxmoe.demo.data import SyntheticLanguage, make_batches
from mxmoe.demo.model import MoEModelArgs, MoETransformer
from mxmoe.demo.train import Bf16GroupedMM, TrainConfig, cpu_threads, format_report, run_comparison

# Small enough for CI, big enough that the loss falls well below the unigram level (~4.1 nats).
SMALL = dict(steps=60, batch_size=8, seq_len=64, dim=64, n_heads=2, n_layers=2, num_experts=8, top_k=2,
             moe_hidden=128, lr=4e-3, warmup_steps=10, eval_batches=4)


@pytest.fixture(autouse=True, scope="module")
def _threads():
    # As the CLI does: one thread when the machine is busy (OpenMP threads stall each other there).
    before = torch.get_num_threads()
    torch.set_num_threads(cpu_threads())
    yield
    torch.set_num_threads(before)


def _check_report(rep, cfg):
    base, mx = rep["runs"]["bf16"], rep["runs"][cfg.recipe]
    for run in (base, mx):
        assert len(run["loss"]) == cfg.steps
        assert all(map(lambda v: v == v and v < 100, run["loss"]))  # finite
        # Loss fell meaningfully: from ~ln(vocab) to well below the unigram entropy.
        assert run["loss"][0] > 4.5
        assert run["final_train_loss"] < 3.3, run["final_train_loss"]
        assert run["eval_loss"] < 3.3, run["eval_loss"]
        assert run["tokens_per_s"] > 0
    assert abs(rep["rel_diff_eval"]) <= 0.02, rep["rel_diff_eval"]
    assert abs(rep["rel_diff_train"]) <= 0.02, rep["rel_diff_train"]
    assert rep["within_tolerance"]
    # Same init and data: the first step's loss is computed before any update, so it matches closely.
    assert abs(base["loss"][0] - mx["loss"][0]) < 1e-2


@pytest.mark.parametrize("recipe", ["mxfp8_rceil", "mxfp8_rceil_tile128"])
def test_mxfp8_matches_bf16_cpu(recipe):
    cfg = TrainConfig(**SMALL, recipe=recipe, device="cpu")
    rep = run_comparison(cfg, progress=False, log=lambda *_: None)
    _check_report(rep, cfg)
    report = format_report(rep)
    print(report)
    assert "PASS" in report


@pytest.mark.parametrize("recipe", ["mxfp8_rceil_tile128"])
def test_hf_qwen3_model_matches_bf16_cpu(recipe, monkeypatch):
    """--model hf-qwen3: transformers' Qwen3-MoE, bf16 run on its grouped_mm experts, MXFP8 run on
    experts_implementation="mxmoe" (every MoE layer's experts through the fused layer)."""
    pytest.importorskip("transformers")
    import mxmoe.integrations.transformers as hf

    calls = []
    real = hf.moe_experts
    monkeypatch.setattr(hf, "moe_experts", lambda *a, **k: calls.append(k["recipe"]) or real(*a, **k))
    cfg = TrainConfig(**{**SMALL, "n_heads": 4}, recipe=recipe, device="cpu", model="hf-qwen3")
    rep = run_comparison(cfg, progress=False, log=lambda *_: None)
    _check_report(rep, cfg)
    assert "Qwen3-MoE" in rep["header"] and "experts_implementation='mxmoe'" in rep["header"]
    # every step's forward of both layers, plus the held-out batches, ran mxmoe (the bf16 run none)
    assert calls.count(recipe) == cfg.n_layers * (cfg.steps + cfg.eval_batches) and set(calls) == {recipe}


def test_cli_writes_png_and_json(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mxmoe", "train", "--steps", "6", "--batch-size", "4", "--seq-len", "32",
           "--dim", "32", "--heads", "2", "--layers", "1", "--hidden", "64", "--eval-batches", "1",
           "--device", "cpu", "--no-progress", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert res.returncode == 0, res.stdout + res.stderr
    assert "held-out loss" in res.stdout and "tokens/s" in res.stdout
    png = (out / "train_curves.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    rep = json.loads((out / "train_curves.json").read_text())
    assert set(rep["runs"]) == {"bf16", "mxfp8_rceil"}
    assert len(rep["runs"]["bf16"]["loss"]) == 6 and len(rep["runs"]["mxfp8_rceil"]["loss"]) == 6
    assert rep["config"]["steps"] == 6
    assert "held-out loss" in (out / "train_report.txt").read_text()


def test_bf16_emulation_matches_torch_bf16_grouped_mm():
    # The CPU baseline's emulation (fp32 GEMM on bf16-rounded operands, rounded output; grads rounded
    # through autograd) must agree with a real bf16 torch._grouped_mm, forward and backward, up to
    # fp32 summation order (a bf16 ulp or so).
    torch.manual_seed(0)
    M, K, N, G = 96, 64, 32, 4
    offs = torch.tensor([10, 10, 61, M], dtype=torch.int32)
    a = torch.randn(M, K, requires_grad=True)
    w = torch.randn(G, N, K, requires_grad=True)
    dy = torch.randn(M, N)

    with Bf16GroupedMM(emulate=True):
        y = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    y.backward(dy)
    assert y.dtype == torch.float32
    assert torch.equal(y, y.bfloat16().float())  # the output is bf16-valued

    a_ref = a.detach().bfloat16().requires_grad_()
    w_ref = w.detach().bfloat16().requires_grad_()
    y_ref = torch._grouped_mm(a_ref, w_ref.transpose(-2, -1), offs=offs)
    y_ref.backward(dy.bfloat16())
    for got, ref in ((y, y_ref), (a.grad, a_ref.grad), (w.grad, w_ref.grad)):
        assert torch.equal(got, got.bfloat16().float())
        torch.testing.assert_close(got, ref.float(), rtol=2 ** -7, atol=1e-5)


def test_model_routing_and_offsets():
    torch.manual_seed(0)
    args = MoEModelArgs(vocab_size=50, dim=32, n_layers=1, n_heads=2, max_seq_len=16, num_experts=4,
                        top_k=2, moe_hidden=64)
    model = MoETransformer(args)
    seen = {}

    def hook(module, inputs):
        seen["x"], seen["offs"] = inputs

    model.layers[0].moe.experts.register_forward_pre_hook(hook)
    tokens = torch.randint(0, 50, (3, 16))
    logits = model(tokens)
    assert logits.shape == (3, 16, 50) and logits.dtype == torch.float32
    offs = seen["offs"]
    assert offs.dtype == torch.int32 and offs.device == tokens.device
    assert offs.shape == (4,) and int(offs[-1]) == 3 * 16 * 2  # every (token, slot) pair is routed
    assert bool((offs[1:] >= offs[:-1]).all())
    assert seen["x"].shape == (3 * 16 * 2, 32)
    # The load-balancing bias moves toward equal load and the counter resets.
    moe = model.layers[0].moe
    assert float(moe.tokens_per_expert.sum()) == 3 * 16 * 2
    model.update_expert_bias()
    assert float(moe.tokens_per_expert.sum()) == 0 and abs(float(moe.expert_bias.sum())) < 1e-6


def test_model_has_no_host_syncs():
    # Ops that read device values on the host (.item(), nonzero and other data-dependent shapes) stall
    # a GPU; none may appear in the model's forward or backward. (The GPU test checks with CUDA's own
    # sync detector.)
    from torch.utils._python_dispatch import TorchDispatchMode

    syncing = {"_local_scalar_dense", "nonzero", "unique", "_unique2", "masked_select", "repeat_interleave",
               "bincount"}
    seen = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func._overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = MoETransformer(MoEModelArgs(vocab_size=50, dim=32, n_layers=2, n_heads=2, max_seq_len=16,
                                        num_experts=4, top_k=2, moe_hidden=64))
    tokens = torch.randint(0, 50, (2, 16))
    with Record():
        model(tokens).logsumexp(-1).mean().backward()
        model.update_expert_bias()
    assert "_grouped_mm" in seen
    assert not (seen & syncing), seen & syncing


def test_data_is_deterministic_and_structured():
    lang = SyntheticLanguage()
    a, h = make_batches(lang, 2, 4, 32, seed=1)
    b, _ = make_batches(lang, 2, 4, 32, seed=1)
    c, _ = make_batches(lang, 2, 4, 32, seed=2)
    assert a.shape == (2, 4, 33) and torch.equal(a, b) and not torch.equal(a, c)
    assert int(a.max()) < lang.vocab_size
    # Real structure: the source entropy is far below uniform over the vocabulary.
    assert 1.0 < h < 0.6 * torch.log(torch.tensor(float(lang.vocab_size)))


@pytest.mark.gpu
def test_mxfp8_matches_bf16_cuda():
    cfg = TrainConfig(**SMALL, device="cuda")
    # No host syncs on the training path: the model's forward and backward run under sync-error mode.
    torch.manual_seed(0)
    model = MoETransformer(cfg.model_args(SyntheticLanguage().vocab_size)).cuda()
    tokens = torch.randint(0, 100, (2, 64), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with Bf16GroupedMM(emulate=False), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tokens).float().logsumexp(-1).mean()
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    rep = run_comparison(cfg, progress=False, log=lambda *_: None)
    _check_report(rep, cfg)
    assert rep["device"].startswith("cuda")
