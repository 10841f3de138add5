"""Expert weights quantized once per optimizer step (mxmoe/weight_cache.py): reused across
micro-batches, never served stale after any tracked write (optimizer step, in-place edit, writes
through views and detach() aliases, load_state_dict, dtype/device moves), the same under torch.compile
(the lookup runs inside the op mxmoe::weight_forms when the compiled graph runs), off for inference
tensors, and results bit-identical to the cache turned off. The sm90 backend runs on CPU here (the core's CPU
kernels); the GPU suite runs the same file on the H200."""
import contextlib

import pytest
import torch

import mxmoe
from mxmoe import ops, weight_cache
from mx_testutils import offsets

RECIPES = ["mxfp8_rceil_tile128", "mxfp8_rceil"]
WEIGHT_OPS = {"mxfp8_rceil_tile128": "sm90_tile128_weight", "mxfp8_rceil": "sm90_exact_weight"}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class Experts(torch.nn.Module):
    def __init__(self, g=3, n=128, k=128, device="cpu"):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(g, n, k, device=device, dtype=torch.bfloat16) / k**0.5)

    def forward(self, a, offs, recipe):
        return mxmoe.grouped_mm(a, self.w.transpose(-2, -1), offs, recipe=recipe, backend="sm90")


@pytest.fixture
def counter(monkeypatch):
    """Counts the weight-quantization ops the sm90 backend runs (on real tensors: not torch.compile's
    fake-tensor tracing of mxmoe::weight_forms)."""
    from torch._subclasses.fake_tensor import FakeTensor

    calls = {"n": 0}
    for name in list(WEIGHT_OPS.values()) + ["weight_forms_if"]:
        real = getattr(ops, name)

        def counting(*args, _real=real):
            calls["n"] += not isinstance(args[0], FakeTensor)
            return _real(*args)

        monkeypatch.setattr(ops, name, counting)
    weight_cache.refresh_weights()
    yield calls
    weight_cache.refresh_weights()


@contextlib.contextmanager
def uncached():
    """The cache bypassed without dropping its entries (set_weight_cache(False) also frees them)."""
    old = weight_cache._enabled
    weight_cache._enabled = False
    try:
        yield
    finally:
        weight_cache._enabled = old


def _usable(device, recipe):
    if device == "cuda" and recipe.endswith("tile128"):
        return mxmoe.build_info()["tile128_gemm"] and torch.cuda.get_device_capability() == (9, 0)
    return True


def _batch(device, m=200, k=128):
    return torch.randn(m, k, device=device, dtype=torch.bfloat16), offsets([70, 0, 130], device)


def _step(model, a, offs, recipe):
    out = model(a, offs, recipe)
    out.float().square().mean().backward()
    return out.detach()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", RECIPES)
def test_once_per_optimizer_step_and_bitwise_equal(device, recipe, counter):
    if not _usable(device, recipe):
        pytest.skip("needs Hopper and the tile128 GEMMs")
    torch.manual_seed(1)
    cached, plain = Experts(device=device), Experts(device=device)
    plain.load_state_dict(cached.state_dict())
    opt_c = torch.optim.SGD(cached.parameters(), lr=0.5)
    opt_p = torch.optim.SGD(plain.parameters(), lr=0.5)
    batches = [_batch(device) for _ in range(4)]
    for step in range(3):
        for a, offs in batches:  # 4 micro-batches, gradients accumulated
            y_c = _step(cached, a, offs, recipe)
            with uncached():
                y_p = _step(plain, a, offs, recipe)
            assert torch.equal(y_c, y_p)
        assert torch.equal(cached.w.grad, plain.w.grad)
        opt_c.step()
        opt_p.step()
        opt_c.zero_grad()
        opt_p.zero_grad()
        assert torch.equal(cached.w, plain.w)
    # with the cache: one weight pass per optimizer step; without: one per micro-batch
    assert counter["n"] == 3 + 3 * 4
    # the last step dropped the entry (the optimizer step post-hook); the next forward makes it anew
    assert mxmoe.weight_cache_info()["entries"] == 0
    _step(cached, *batches[0], recipe)
    info = mxmoe.weight_cache_info()
    assert info["enabled"] and info["entries"] == 1 and info["bytes"] > 0


@pytest.mark.parametrize("recipe", RECIPES)
def test_tracked_writes_invalidate(recipe, counter):
    model = Experts()
    a, offs = _batch("cpu")

    def fresh_equals_cached():
        y = model(a, offs, recipe).detach()
        with uncached():
            ref = model(a, offs, recipe).detach()
        return torch.equal(y, ref)

    assert fresh_equals_cached()
    with torch.no_grad():
        model.w.mul_(2.0)  # in-place edit
    assert fresh_equals_cached()
    with torch.no_grad():
        model.w.transpose(-2, -1)[0].add_(1.0)  # through a view
    assert fresh_equals_cached()
    model.w.detach()[1].neg_()  # through a detach() alias (shares the version counter)
    assert fresh_equals_cached()
    state = {"w": torch.randn_like(model.w)}
    model.load_state_dict(state)
    assert fresh_equals_cached()
    model.float()  # dtype move: new data, new dtype
    assert model.w.dtype == torch.float32
    assert fresh_equals_cached()
    model.bfloat16()
    assert fresh_equals_cached()


OPTIMIZERS = {
    "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_optimizer_steps_invalidate_even_without_version_bumps(device, opt_name, counter):
    """torch's fused optimizer kernels write parameters without bumping their version counters; the
    step post-hook drops the stepped parameters' entries, so the next forward never sees stale forms."""
    recipe = "mxfp8_rceil_tile128"
    if not _usable(device, recipe):
        pytest.skip("needs Hopper and the tile128 GEMMs")
    model = Experts(device=device)
    opt = OPTIMIZERS[opt_name](model.parameters())
    a, offs = _batch(device)
    for _ in range(3):
        y = _step(model, a, offs, recipe)
        with uncached():
            assert torch.equal(y, model(a, offs, recipe).detach())
        before = model.w.detach().clone()
        opt.step()
        opt.zero_grad()
        assert not torch.equal(model.w, before)  # the step changed the weight ...
    assert counter["n"] == 3 + 3  # ... and every step's forward re-quantized it (cached + uncached)


def test_untracked_data_write_needs_refresh(counter):
    # Writes through .data bypass torch's version counter (by design): documented; refresh_weights()
    # is the way out. This pins both halves of that statement.
    model = Experts()
    a, offs = _batch("cpu")
    recipe = "mxfp8_rceil_tile128"
    before = model(a, offs, recipe).detach()
    model.w.data.mul_(4.0)
    stale = model(a, offs, recipe).detach()
    assert torch.equal(stale, before)  # served from the cache: the write was invisible
    assert mxmoe.refresh_weights(model) == 1
    with uncached():
        ref = model(a, offs, recipe).detach()
    assert torch.equal(model(a, offs, recipe).detach(), ref) and not torch.equal(ref, before)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_once_per_optimizer_step_under_compile(recipe, backend, counter):
    """A compiled training step (fwd + bwd, fullgraph) reuses the forms across micro-batches and
    re-quantizes after each optimizer step; outputs and gradients equal eager without the cache; the
    cached tensors stay intact (Inductor never writes into an extern op's output that only extern ops
    read)."""
    torch.manual_seed(2)
    model, plain = Experts(), Experts()
    plain.load_state_dict(model.state_dict())
    opt, opt_p = torch.optim.SGD(model.parameters(), lr=0.5), torch.optim.SGD(plain.parameters(), lr=0.5)
    torch._dynamo.reset()
    fwd = torch.compile(lambda a, o: model(a, o, recipe), fullgraph=True, backend=backend)
    batches = [_batch("cpu") for _ in range(3)]
    bits = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t  # noqa: E731 (fp8 has no ==)
    for _ in range(2):
        for i, (a, offs) in enumerate(batches):
            y = fwd(a, offs)
            y.float().square().mean().backward()
            with uncached():
                assert torch.equal(y.detach(), _step(plain, a, offs, recipe))
            (entry,) = weight_cache._entries.values()
            if i == 0:
                snapshot = [bits(f).clone() for f in entry.forms]
        assert all(torch.equal(bits(f), c) for f, c in zip(entry.forms, snapshot))
        assert torch.equal(model.w.grad, plain.w.grad)
        opt.step(), opt_p.step()
        opt.zero_grad(), opt_p.zero_grad()
    # compiled: one weight pass per optimizer step; eager without the cache: one per micro-batch
    assert counter["n"] == 2 + 2 * 3
    torch._dynamo.reset()


@pytest.mark.parametrize("recipe", RECIPES)
def test_tracked_writes_invalidate_under_compile(recipe, counter):
    model = Experts()
    a, offs = _batch("cpu")
    torch._dynamo.reset()
    fwd = torch.compile(lambda a, o: model(a, o, recipe), backend="aot_eager")

    def fresh_equals_cached():
        y = fwd(a, offs).detach()
        with uncached():
            ref = model(a, offs, recipe).detach()
        return torch.equal(y, ref)

    assert fresh_equals_cached()
    n = counter["n"]
    assert fresh_equals_cached() and counter["n"] == n + 1  # a hit in the graph (+1: the uncached ref)
    with torch.no_grad():
        model.w.mul_(2.0)
    assert fresh_equals_cached()
    model.w.detach()[1].neg_()
    assert fresh_equals_cached()
    model.load_state_dict({"w": torch.randn_like(model.w)})
    assert fresh_equals_cached()
    model.float()  # dtype move (recompiles)
    assert fresh_equals_cached()
    torch._dynamo.reset()


def test_weight_forms_op_rejects_unknown_form():
    with pytest.raises(ValueError, match="form must be one of"):
        torch.ops.mxmoe.weight_forms(torch.zeros(1, 128, 128, dtype=torch.bfloat16), None, "bogus", 0)


def test_off_in_inference_mode(counter):
    model = Experts()
    a, offs = _batch("cpu")
    with torch.inference_mode():
        frozen = Experts()  # inference tensors have no version counter: never cached
        frozen(a, offs, "mxfp8_rceil_tile128")
        assert mxmoe.weight_cache_info()["entries"] == 0
        model(a, offs, "mxfp8_rceil_tile128")  # a normal parameter used under inference_mode keeps its counter
    assert mxmoe.weight_cache_info()["entries"] == 1


def test_entry_freed_with_its_weight(counter):
    model = Experts()
    a, offs = _batch("cpu")
    model(a, offs, "mxfp8_rceil")
    assert mxmoe.weight_cache_info()["entries"] == 1
    del model
    import gc

    gc.collect()
    assert mxmoe.weight_cache_info()["entries"] == 0


def test_disabled_by_switch(counter):
    model = Experts()
    a, offs = _batch("cpu")
    mxmoe.set_weight_cache(False)
    try:
        model(a, offs, "mxfp8_rceil")
        model(a, offs, "mxfp8_rceil")
        assert counter["n"] == 2 and mxmoe.weight_cache_info()["entries"] == 0
    finally:
        mxmoe.set_weight_cache(True)


# ---- CUDA-graph capture: the capture's own entries (weight_cache._captured) ----------------------


def test_capture_entries_logic(monkeypatch, counter):
    """The capture rule on CPU, with the capture simulated (the H200 tests below capture for real):
    one weight pass per weight per capture; a write recorded in between records a new one; another
    capture, or a lookup outside the capture, never sees this capture's forms."""
    recipe = "mxfp8_rceil_tile128"
    model = Experts()
    batches = [_batch("cpu") for _ in range(3)]
    monkeypatch.setattr(weight_cache, "_capture_id", lambda parts: 7)
    for a, offs in batches:
        _step(model, a, offs, recipe)
    assert counter["n"] == 1  # three micro-batches' fwd+bwd, one pass
    info = mxmoe.weight_cache_info()
    assert info["capture_entries"] == 1 and info["capture_bytes"] > 0 and info["entries"] == 0
    with torch.no_grad():
        model.w.mul_(2.0)  # recorded between two uses: the next use records a new pass
    y = _step(model, *batches[0], recipe)
    assert counter["n"] == 2
    with uncached():
        assert torch.equal(y, _step(model, *batches[0], recipe))  # (+1: the uncached reference)
    monkeypatch.setattr(weight_cache, "_capture_id", lambda parts: 8)
    _step(model, *batches[0], recipe)  # another capture: its own pass
    assert counter["n"] == 4 and mxmoe.weight_cache_info()["capture_entries"] == 1
    monkeypatch.setattr(weight_cache, "_capture_id", lambda parts: 0)
    _step(model, *batches[0], recipe)  # eager again: the capture's entries are gone
    assert counter["n"] == 5
    info = mxmoe.weight_cache_info()
    assert info["capture_entries"] == 0 and info["entries"] == 1


def test_capture_ops_on_cpu():
    with pytest.raises(ValueError, match="device: expected a CUDA device index >= 0, got -1"):
        ops.capture_id(-1)
    w = torch.zeros(1, 128, 128, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="x: expected a CUDA tensor"):
        ops.weight_forms_if(torch.ones(1, dtype=torch.int32), w, 0, 0)


def _graphed_steps(model, batches, recipe, write_between, counter):
    """One captured "optimizer step": fwd+bwd of every micro-batch (grads accumulated), optionally an
    in-place weight write recorded after the first one. Warm-up on a side stream first (as
    torch.cuda.graph requires); returns (graph, the captured outputs, the weight passes recorded)."""
    def run():
        outs = []
        for i, (a, offs) in enumerate(batches):
            outs.append(_step(model, a, offs, recipe))
            if write_between and i == 0:
                with torch.no_grad():
                    model.w.mul_(0.5)
        return outs

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        model.w.grad = None
        saved = model.w.detach().clone()
        run()
        with torch.no_grad():
            model.w.copy_(saved)
    torch.cuda.current_stream().wait_stream(s)
    model.w.grad = None
    graph = torch.cuda.CUDAGraph()
    n0 = counter["n"]
    with torch.cuda.graph(graph):
        outs = run()
    return graph, outs, counter["n"] - n0


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("write_between", [False, True])
def test_cuda_graph_once_per_captured_step(recipe, write_between, counter):
    """A real capture on the GPU: one weight pass recorded for three micro-batches' fwd+bwd (two with a
    write recorded between them); every replay re-runs the recorded pass, so a weight changed between
    replays (eagerly, or by the recorded write) is never served stale: outputs and gradients of each
    replay bit-equal eager code without the cache on the same weights."""
    if not _usable("cuda", recipe):
        pytest.skip("needs Hopper and the tile128 GEMMs")
    torch.manual_seed(3)
    model, plain = Experts(device="cuda"), Experts(device="cuda")
    plain.load_state_dict(model.state_dict())
    batches = [_batch("cuda") for _ in range(3)]
    start = model.w.detach().clone()
    graph, outs, passes = _graphed_steps(model, batches, recipe, write_between, counter)
    assert passes == (2 if write_between else 1)
    assert mxmoe.weight_cache_info()["capture_entries"] == 1
    for scale in (1.0, -3.0):
        with torch.no_grad():  # the weight as the replay will see it (an eager write between replays)
            model.w.copy_(start * scale)
            plain.w.copy_(start * scale)
        graph.replay()
        torch.cuda.synchronize()
        plain.w.grad = None
        with uncached():
            for i, (a, offs) in enumerate(batches):
                assert torch.equal(outs[i], _step(plain, a, offs, recipe)), (scale, i)
                if write_between and i == 0:
                    with torch.no_grad():
                        plain.w.mul_(0.5)
        assert torch.equal(model.w.grad, plain.w.grad)
        assert torch.equal(model.w, plain.w)
    # a lookup outside the capture drops the capture's entries
    _step(model, *batches[0], recipe)
    assert mxmoe.weight_cache_info()["capture_entries"] == 0


def test_graph_weight_cache_needs_cuda_and_no_capture():
    with pytest.raises(ValueError, match="device must be a CUDA device, got cpu"):
        mxmoe.graph_weight_cache("cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_graph_weight_cache_across_replays(recipe, counter):
    """graph_weight_cache(): a graph of one micro-batch computes the weight's forms in the first replay
    only; later replays read the kept forms (proved by corrupting them: the output follows); an
    optimizer step, or refresh_weights() after a manual write, makes the next replay recompute, and
    its outputs and gradients then bit-equal eager code without the cache."""
    if not _usable("cuda", recipe):
        pytest.skip("needs Hopper and the tile128 GEMMs")
    torch.manual_seed(4)
    model, plain = Experts(device="cuda"), Experts(device="cuda")
    plain.load_state_dict(model.state_dict())
    opt, opt_p = torch.optim.SGD(model.parameters(), lr=0.5), torch.optim.SGD(plain.parameters(), lr=0.5)
    batch = _batch("cuda")
    with mxmoe.graph_weight_cache():
        graph, (out,), passes = _graphed_steps(model, [batch], recipe, False, counter)
    assert passes == 1
    (kept,) = weight_cache._kept.values()
    assert mxmoe.weight_cache_info()["kept_entries"] == 1 and mxmoe.weight_cache_info()["kept_bytes"] > 0

    def replay_matches_eager():
        graph.replay()
        torch.cuda.synchronize()
        plain.w.grad = None
        with uncached():
            ref = _step(plain, *batch, recipe)
        return torch.equal(out, ref) and torch.equal(model.w.grad, plain.w.grad)

    assert replay_matches_eager()  # first replay: the flag was set, the pass ran
    assert replay_matches_eager()  # later replays: the kept forms (still right: the weight is unchanged)
    saved = [f.clone() for f in kept.forms]
    for f in kept.forms:  # corrupt them: a replay that reads them instead of recomputing shows it
        f.view(torch.uint8).fill_(0)
    assert not replay_matches_eager()
    for f, c in zip(kept.forms, saved):
        f.copy_(c)
    assert replay_matches_eager()  # (and the gradients are right again for the steps below)
    for _ in range(2):  # an optimizer step flags the forms: the next replay recomputes them
        opt.step(), opt_p.step()
        assert torch.equal(model.w, plain.w)
        assert replay_matches_eager()
    with torch.no_grad():  # a manual write between replays is not seen ...
        model.w.mul_(-2.0)
        plain.w.mul_(-2.0)
    assert not replay_matches_eager()
    mxmoe.refresh_weights()  # ... until refresh_weights()
    assert replay_matches_eager()
    del graph, kept
    del model, opt
    import gc

    gc.collect()
    assert mxmoe.weight_cache_info()["kept_entries"] == 0  # freed with the weight
