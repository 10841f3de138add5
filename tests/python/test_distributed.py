"""torch.distributed on the CPU (gloo, spawned processes, bounded time): FSDP2's fully_shard on models whose
experts run through mxmoe (mxmoe.nn.MoEExperts, the demo model switched over by mxmoe.convert, a
transformers Qwen3-MoE on experts_implementation="mxmoe") trains exactly like the single-process model
on the same per-rank data, and DCP (torch.distributed.checkpoint)
save / load round-trips model and optimizer; the same with the MX all-gather of expert weights
(mxmoe/distributed/fsdp.py: bit-identical to the single process, about half of bf16's bytes); a rank
that fails mid-step ends the group with an error instead of a hang."""
import os

import pytest
import torch

from dist_util import spawn

WORLD = 2


def _spawn(fn_name, world=WORLD):
    spawn(__name__, fn_name, world)


# ---- the rank bodies (module-level: spawn pickles them by name) ----------------------------------

E, H, I, T, K = 4, 64, 64, 96, 2


def _shard_data(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(T, H, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    return x, idx, torch.rand(T, K, generator=g)


def _experts_fsdp_matches_single_process(rank, world, tmp):
    import mxmoe
    from torch.distributed.fsdp import fully_shard

    for recipe in ("mxfp8_rceil_tile128", "mxfp8_rceil"):
        torch.manual_seed(0)
        model = mxmoe.nn.MoEExperts(E, H, I, recipe=recipe)
        ref = mxmoe.nn.MoEExperts(E, H, I, recipe=recipe)
        ref.load_state_dict(model.state_dict())
        fully_shard(model)
        assert type(model.w13).__name__ == "DTensor"
        hits = []

        def no_stale_hit(step):
            # FSDP2 refills its unsharded weights in reused storage without a version bump: after an
            # optimizer step the cache must not serve the old forms (it did, before every step
            # dropped all entries: 2 stale hits at step 3 here)
            assert mxmoe.weight_cache_info()["hits"] == hits[-1], (recipe, step)

        _train_like_single_process(model, ref, _shard_data, rank, world, recipe, 5,
                                   before_forward=lambda step: hits.append(mxmoe.weight_cache_info()["hits"]),
                                   after_forward=no_stale_hit)


def _train_like_single_process(model, ref, data, rank, world, label, steps, before_forward=None,
                               after_forward=None, after_backward=None):
    """`steps` AdamW steps of the sharded `model` on this rank's data(step, rank) next to the
    single-process `ref` on every rank's data (grads averaged, as FSDP2's reduce-scatter): the same
    loss on this rank's data, the same grads and, at the end, the same weights."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(steps):
        x, idx, w = data(step, rank)
        if before_forward:
            before_forward(step)
        loss = model(x, idx, w).square().mean()
        if after_forward:
            after_forward(step)
        loss.backward()
        if after_backward:
            after_backward(step)
        for r in range(world):
            xr, ir, wr = data(step, r)
            lr = ref(xr, ir, wr).square().mean() / world
            lr.backward()
            if r == rank:
                assert torch.equal(loss.detach(), lr.detach() * world), (label, step, loss.item(), lr.item() * world)
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-6, atol=1e-7, msg=f"{label} {step} {n}")
        for o in (opt, opt_ref):
            o.step()
            o.zero_grad()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.full_tensor(), q.detach(), rtol=1e-5, atol=1e-6, msg=f"{label} {n}")


def _dcp_save(model, opt, path):
    """Model and optimizer (sharded or not) to a DCP checkpoint; returns the model state dict saved."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    return msd


def _dcp_load(model, opt, path, first_backward):
    """A fresh model and optimizer loaded from a DCP checkpoint: one step first (first_backward() then
    opt.step()) materializes the optimizer state that DCP loads into."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import mxmoe

    first_backward()
    opt.step()
    opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    mxmoe.refresh_weights()  # a load into sharded parameters is not seen by the cache (weight_cache.py)


def _demo_model_fsdp_and_dcp(rank, world, tmp):
    from torch.distributed.fsdp import fully_shard

    import mxmoe
    from mxmoe.demo.model import MoEModelArgs, MoETransformer

    args = MoEModelArgs(vocab_size=64, dim=64, n_layers=2, n_heads=2, max_seq_len=32, num_experts=4, top_k=2,
                        moe_hidden=64)

    def build():
        torch.manual_seed(0)
        m = mxmoe.convert(MoETransformer(args), recipe="mxfp8_rceil_tile128")
        for layer in m.layers.values() if isinstance(m.layers, torch.nn.ModuleDict) else m.layers:
            fully_shard(layer)
        fully_shard(m)
        return m

    def batch(step):
        g = torch.Generator().manual_seed(10 * step + rank)
        return torch.randint(0, 64, (2, 33), generator=g)

    def loss_of(m, b):
        logits = m(b[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten())

    model = build()
    assert {mxmoe.conversion_mechanism(moe.experts) for moe in model.moe_layers()} == {"demo"}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(3):
        loss = loss_of(model, batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert all(v == v for v in losses)
    _dcp_save(model, opt, os.path.join(tmp, "ckpt"))
    # A fresh model and optimizer, loaded: the same next loss and the same next step as the original.
    fresh = build()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=3e-3)
    _dcp_load(fresh, fresh_opt, os.path.join(tmp, "ckpt"), lambda: fresh(batch(0)[:, :-1]).sum().backward())
    for m, o in ((model, opt), (fresh, fresh_opt)):
        loss = loss_of(m, batch(3))
        loss.backward()
        o.step()
        o.zero_grad()
    with torch.no_grad():
        a, b = loss_of(model, batch(4)), loss_of(fresh, batch(4))
    assert torch.equal(a, b), (a.item(), b.item())


def _hf_qwen3_fsdp_matches_single_process(rank, world, tmp, mx=False):
    """A transformers Qwen3-MoE on experts_implementation="mxmoe", each decoder layer fully_shard-ed
    (mx: its experts' weights all-gathered as MX tiles)."""
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    import mxmoe  # noqa: F401  (registers the implementation)

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=4, num_experts_per_tok=2, max_position_embeddings=32,
                         experts_implementation="mxmoe")
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg)
    ref = Qwen3MoeForCausalLM(cfg)
    ref.load_state_dict(model.state_dict())
    if mx:
        from mxmoe.distributed import enable_mx_all_gather

        decisions = enable_mx_all_gather(model)
        assert len(decisions) == 4 and set(decisions.values()) == {"mx"}, decisions
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)

    def batch(r):
        return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(7 + r))

    loss = model(batch(rank), labels=batch(rank)).loss
    loss.backward()
    for r in range(world):
        lr = ref(batch(r), labels=batch(r)).loss
        (lr / world).backward()
        if r == rank:
            assert torch.equal(loss.detach(), lr.detach()), (loss.item(), lr.item())
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-5, atol=1e-7, msg=n)


@pytest.mark.slow
def test_fsdp2_transformers_qwen3_on_mxmoe_matches_single_process():
    pytest.importorskip("transformers")
    _spawn("_hf_qwen3_fsdp_matches_single_process")


def _hf_qwen3_fsdp_mx_matches_single_process(rank, world, tmp):
    _hf_qwen3_fsdp_matches_single_process(rank, world, tmp, mx=True)


@pytest.mark.slow
def test_fsdp2_mx_all_gather_transformers_qwen3_matches_single_process():
    pytest.importorskip("transformers")
    _spawn("_hf_qwen3_fsdp_mx_matches_single_process")


@pytest.mark.slow
def test_fsdp2_experts_match_single_process():
    _spawn("_experts_fsdp_matches_single_process")


@pytest.mark.slow
def test_fsdp2_demo_model_trains_and_dcp_round_trips():
    _spawn("_demo_model_fsdp_and_dcp")


# ---- MX all-gather (mxmoe/distributed/fsdp.py) --------------------------------------------------------


class _GatherBytes:
    """Counts the bytes FSDP2's all-gathers produce (its collectives call one of these two)."""

    def __init__(self):
        import torch.distributed as dist

        self.bytes, self._undo = 0, []
        for name in ("all_gather_into_tensor", "all_gather_single"):
            real = getattr(dist, name, None)
            if real is None:
                continue

            def counting(out, inp, *a, _real=real, **kw):
                self.bytes += out.numel() * out.element_size()
                return _real(out, inp, *a, **kw)

            setattr(dist, name, counting)
            self._undo.append((name, real))

    def close(self):
        import torch.distributed as dist

        for name, real in self._undo:
            setattr(dist, name, real)


def _count_tile_quantizations():
    """Patches ops.sm90_tile128_weight to record the shapes it quantizes; returns the list."""
    from mxmoe import ops

    calls, real = [], ops.sm90_tile128_weight

    def counting(w, mode):
        calls.append(tuple(w.shape))
        return real(w, mode)

    ops.sm90_tile128_weight = counting
    return calls


E_MX, H_MX, I_MX = 4, 128, 128


def _mx_data(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(T, H_MX, generator=g)
    idx = torch.randint(-1, E_MX + 1, (T, K), generator=g)  # a few ids out of range: dropped
    return x, idx, torch.rand(T, K, generator=g)


def _mx_all_gather_matches_single_process(rank, world, tmp):
    import mxmoe
    from mxmoe.distributed import MXShardWeight, enable_mx_all_gather
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = mxmoe.nn.MoEExperts(E_MX, H_MX, I_MX)  # tile128
    ref = mxmoe.nn.MoEExperts(E_MX, H_MX, I_MX)
    ref.load_state_dict(model.state_dict())
    assert enable_mx_all_gather(model) == {"w13": "mx", "w2": "mx"}
    assert torch.equal(model.w13, ref.w13) and set(model.state_dict()) == set(ref.state_dict())
    fully_shard(model)
    assert isinstance(model.w13.to_local(), MXShardWeight)
    calls = _count_tile_quantizations()

    def only_local_shards_quantized(step):
        # Only this rank's shards were quantized (once each); the gathered forms were used as they came.
        assert sorted(calls) == sorted([(E_MX // world, 2 * I_MX, H_MX), (E_MX // world, H_MX, I_MX)]), calls

    _train_like_single_process(model, ref, _mx_data, rank, world, "mx all-gather", 3,
                               before_forward=lambda step: calls.clear(), after_backward=only_local_shards_quantized)


def _mx_all_gather_bytes(rank, world, tmp):
    """Bytes all-gathered per step: MX tiles vs FSDP2's own bf16 all-gather of the same bf16 experts."""
    import mxmoe
    from mxmoe.distributed import enable_mx_all_gather
    from torch.distributed.fsdp import fully_shard

    measured = {}
    for mx in (False, True):
        torch.manual_seed(0)
        model = mxmoe.nn.MoEExperts(8, 256, 256).to(torch.bfloat16)
        if mx:
            enable_mx_all_gather(model)
        fully_shard(model)
        x, idx, w = _mx_data(0, rank)
        counter = _GatherBytes()
        try:
            model(x[:, :1].expand(T, 256).bfloat16().contiguous(), idx.clamp(0, 7), w).float().square().mean().backward()
        finally:
            counter.close()
        measured[mx] = counter.bytes
    ratio = measured[True] / measured[False]
    if rank == 0:
        print(f"all-gathered bytes per step: bf16 {measured[False]}, MX {measured[True]}, ratio {ratio:.4f}")
    assert measured[False] > 0 and ratio <= 0.55, measured


def _mx_all_gather_models_and_dcp(rank, world, tmp):
    """The demo model converted (TorchTitan-shaped w1/w2/w3) and a transformers Qwen3-MoE: MX all-gather
    trains like the single process; DCP save / load round-trips with MX parameters; what is left on bf16."""
    from torch.distributed.fsdp import fully_shard

    import mxmoe
    from mxmoe.demo.model import MoEModelArgs, MoETransformer
    from mxmoe.distributed import enable_mx_all_gather

    args = MoEModelArgs(vocab_size=64, dim=128, n_layers=2, n_heads=2, max_seq_len=32, num_experts=4, top_k=2,
                        moe_hidden=128)

    def build(mx=True):
        torch.manual_seed(0)
        m = mxmoe.convert(MoETransformer(args), recipe="mxfp8_rceil_tile128")
        if mx:
            d = enable_mx_all_gather(m)
            assert set(d.values()) == {"mx"} and len(d) == 6, d
        for layer in m.layers.values() if isinstance(m.layers, torch.nn.ModuleDict) else m.layers:
            fully_shard(layer)
        fully_shard(m)
        return m

    def batch(step, r=rank):
        return torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(10 * step + r))

    def loss_of(m, b):
        logits = m(b[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), b[:, 1:].flatten())

    model, plain = build(), build(mx=False)
    opt, opt_plain = (torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (model, plain))
    for step in range(3):
        for m, o in ((model, opt), (plain, opt_plain)):
            loss_of(m, batch(step)).backward()
            o.step()
            o.zero_grad()
    with torch.no_grad():  # the same weights as FSDP2's bf16 all-gather path after 3 steps
        for (n, p), q in zip(model.named_parameters(), plain.parameters()):
            torch.testing.assert_close(p.full_tensor(), q.full_tensor(), rtol=1e-5, atol=1e-6, msg=n)
    msd = _dcp_save(model, opt, os.path.join(tmp, "ckpt"))
    assert all(type(v.to_local()).__name__ == "Tensor" for v in msd.values() if hasattr(v, "to_local")), \
        "state_dict values must be plain tensors (checkpoints unchanged)"
    fresh = build()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=3e-3)
    _dcp_load(fresh, fresh_opt, os.path.join(tmp, "ckpt"), lambda: loss_of(fresh, batch(0)).backward())
    for m, o in ((model, opt), (fresh, fresh_opt)):
        loss_of(m, batch(3)).backward()
        o.step()
        o.zero_grad()
    with torch.no_grad():
        a, b = loss_of(model, batch(4)), loss_of(fresh, batch(4))
    assert torch.equal(a, b), (a.item(), b.item())


def _mx_all_gather_decisions(rank, world, tmp):
    """Weights that keep FSDP2's own all-gather say why; they still train."""
    import mxmoe
    from mxmoe.distributed import enable_mx_all_gather
    from torch.distributed.fsdp import fully_shard

    uneven = mxmoe.nn.MoEExperts(3, 64, 64)
    d = enable_mx_all_gather(uneven)
    assert all("do not split evenly" in v for v in d.values()), d
    exact = mxmoe.nn.MoEExperts(4, 64, 64, recipe="mxfp8_rceil")
    d = enable_mx_all_gather(exact)
    assert all("only mxfp8_rceil_tile128" in v for v in d.values()), d
    for m in (uneven, exact):
        fully_shard(m)
        x, idx, w = _mx_data(0, rank)
        m(x[:, :64].contiguous(), idx.clamp(0, m.num_experts - 1), w).square().mean().backward()
        assert all(p.grad is not None for p in m.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_mx_all_gather_matches_single_process(world):
    _spawn("_mx_all_gather_matches_single_process", world)


@pytest.mark.slow
def test_fsdp2_mx_all_gather_bytes_at_most_055x_bf16():
    _spawn("_mx_all_gather_bytes")


@pytest.mark.slow
def test_fsdp2_mx_all_gather_demo_model_and_dcp():
    _spawn("_mx_all_gather_models_and_dcp")


@pytest.mark.slow
def test_fsdp2_mx_all_gather_decisions():
    _spawn("_mx_all_gather_decisions")


def _rank_fails_mid_step(rank, world, tmp):
    """Rank 1 dies in the middle of step 1 (after its forward, before the backward's reduce-scatter)."""
    import mxmoe
    from mxmoe.distributed import enable_mx_all_gather
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = mxmoe.nn.MoEExperts(E_MX, H_MX, I_MX)
    enable_mx_all_gather(model)
    fully_shard(model)
    for step in range(3):
        x, idx, w = _mx_data(step, rank)
        loss = model(x, idx, w).square().mean()
        if rank == 1 and step == 1:
            os._exit(3)  # a crash: no exception handling, no clean shutdown
        loss.backward()


@pytest.mark.slow
def test_rank_failure_mid_step_ends_group_without_hang():
    import time

    from dist_util import run_ranks

    t0 = time.monotonic()
    codes, msgs, alive = run_ranks(__name__, "_rank_fails_mid_step", 2, timeout_s=120, pg_timeout_s=20)
    elapsed = time.monotonic() - t0
    assert not alive, f"ranks {alive} hung after a peer died"
    assert codes[1] == 3 and codes[0] != 0, codes
    assert any(m.startswith("rank 0:") for m in msgs), msgs  # the survivor raised (gloo: peer closed / timeout)
    assert elapsed < 100, elapsed


# ---- tensor parallel (mxmoe/distributed/tensor_parallel.py) -------------------------------------------


def _tp_matches_single_process(rank, world, tmp):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    import mxmoe

    mesh = init_device_mesh("cpu", (world,))
    E, H, I = 4, 64, 128 * world  # I / tp = 128: every MX block in one rank's slice
    g = torch.Generator().manual_seed(0)
    w1, w3 = (torch.randn(E, I, H, generator=g) * 0.1 for _ in range(2))
    w2 = torch.randn(E, H, I, generator=g) * 0.1
    b2 = torch.randn(E, H, generator=g)
    x = torch.randn(T, H, generator=g)
    idx = torch.randint(-1, E, (T, K), generator=g)
    tw = torch.rand(T, K, generator=g)
    for recipe in ("mxfp8_rceil_tile128", "mxfp8_rceil", None):
        leaves = [t.clone().requires_grad_() for t in (x, tw, w1, w3, w2, b2)]
        xr, twr, w1r, w3r, w2r, b2r = leaves
        ref = mxmoe.moe_experts(xr, idx, twr, (w1r, w3r), w2r, bias2=b2r, recipe=recipe)
        dout = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
        ref.backward(dout)
        xs, tws = x.clone().requires_grad_(), tw.clone().requires_grad_()
        d1, d3 = (distribute_tensor(t, mesh, [Shard(1)]).requires_grad_() for t in (w1, w3))
        d2 = distribute_tensor(w2, mesh, [Shard(2)]).requires_grad_()
        db2 = distribute_tensor(b2, mesh, [Replicate()]).requires_grad_()
        out = mxmoe.moe_experts(xs, idx, tws, (d1, d3), d2, bias2=db2, recipe=recipe)
        assert tuple(out.placements) == (Partial(),)
        full = out.full_tensor()
        full.backward(dout)
        tol = dict(rtol=2e-2, atol=2e-2) if recipe else dict(rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(full, ref.detach(), **tol, msg=f"{recipe} out")
        for name, got, want in (("x", xs.grad, xr.grad), ("topk_weights", tws.grad, twr.grad),
                                ("w1", d1.grad.full_tensor(), w1r.grad), ("w3", d3.grad.full_tensor(), w3r.grad),
                                ("w2", d2.grad.full_tensor(), w2r.grad), ("bias2", db2.grad.full_tensor(), b2r.grad)):
            err = (got - want).norm() / want.norm()
            assert err < 2e-2, (recipe, name, err.item())
    # No rule: concatenated w13 along its rows, the experts dim, H.
    w13 = distribute_tensor(torch.cat([w1, w3], 1), mesh, [Shard(1)])
    with pytest.raises(ValueError, match=r"w13: a Shard\(1\) of the concatenated"):
        mxmoe.moe_experts(x, idx, tw, w13, distribute_tensor(w2, mesh, [Shard(2)]))
    with pytest.raises(ValueError, match="expert parallelism"):
        mxmoe.moe_experts(x, idx, tw, tuple(distribute_tensor(t, mesh, [Shard(0)]) for t in (w1, w3)),
                          distribute_tensor(w2, mesh, [Shard(0)]))
    with pytest.raises(ValueError, match=r"w2: expected placements \(Shard\(dim=2\),\)"):
        mxmoe.moe_experts(x, idx, tw, tuple(distribute_tensor(t, mesh, [Shard(1)]) for t in (w1, w3)),
                          distribute_tensor(w2, mesh, [Shard(1)]))
    with pytest.raises(ValueError, match="w2: expected a DTensor"):
        mxmoe.moe_experts(x, idx, tw, tuple(distribute_tensor(t, mesh, [Shard(1)]) for t in (w1, w3)), w2)
    with pytest.raises(ValueError, match="x: expected replicated tokens"):
        mxmoe.moe_experts(distribute_tensor(x, mesh, [Shard(0)]), idx, tw,
                          tuple(distribute_tensor(t, mesh, [Shard(1)]) for t in (w1, w3)),
                          distribute_tensor(w2, mesh, [Shard(2)]))
    dist.barrier()


@pytest.mark.slow
def test_tensor_parallel_experts_match_single_process():
    _spawn("_tp_matches_single_process")


def _grouped_mm_dtensor_error(rank, world, tmp):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import mxmoe

    mesh = init_device_mesh("cpu", (world,))
    b = distribute_tensor(torch.randn(2, 64, 64), mesh, [Shard(2)])
    with pytest.raises(ValueError, match="B_t: a DTensor with placements"):
        mxmoe.grouped_mm(torch.randn(8, 64), b, torch.tensor([4, 8], dtype=torch.int32))


@pytest.mark.slow
def test_grouped_mm_refuses_dtensors_clearly():
    _spawn("_grouped_mm_dtensor_error")


# ---- the CUDA paths: world size 1 on NCCL (the H200; skipped without a GPU) ---------------------------


def _nccl_fsdp_mx_tp_ep(rank, world, tmp):
    """FSDP2 + MX all-gather, the TP rule and the EP layer on CUDA tensors through NCCL collectives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    import mxmoe
    from mxmoe.distributed import MXShardWeight, enable_mx_all_gather, ep_moe_experts

    dev = torch.device("cuda", rank)
    E, H, I, T_, K_ = 8, 256, 256, 512, 2
    torch.manual_seed(0)
    model = mxmoe.nn.MoEExperts(E, H, I).to(dev, torch.bfloat16)
    ref = mxmoe.nn.MoEExperts(E, H, I).to(dev, torch.bfloat16)
    ref.load_state_dict(model.state_dict())
    assert set(enable_mx_all_gather(model).values()) == {"mx"}
    fully_shard(model)
    assert isinstance(model.w13.to_local(), MXShardWeight)
    calls = _count_tile_quantizations()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, fused=True)
    g = torch.Generator(device=dev).manual_seed(1)
    for step in range(3):
        calls.clear()
        x = torch.randn(T_, H, device=dev, generator=g).bfloat16()
        idx = torch.randint(0, E, (T_, K_), device=dev, generator=g)
        w = torch.rand(T_, K_, device=dev, generator=g).bfloat16()
        loss = model(x, idx, w).float().square().mean()
        loss.backward()
        assert len(calls) == 2, calls  # the shards, once; the gathered forms never re-quantized
        lr = ref(x, idx, w).float().square().mean()
        lr.backward()
        assert torch.equal(loss.detach(), lr.detach()), (step, loss.item(), lr.item())
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(p.grad.full_tensor(), q.grad), (step, n)
        for o in (opt, opt_ref):
            o.step()
            o.zero_grad()
    # TP rule on a 1-rank mesh: the same numbers as the plain layer.
    mesh = init_device_mesh("cuda", (world,))
    w1, w3 = (torch.randn(E, I, H, device=dev).bfloat16() * 0.05 for _ in range(2))
    w2 = torch.randn(E, H, I, device=dev).bfloat16() * 0.05
    x = torch.randn(T_, H, device=dev).bfloat16()
    idx = torch.randint(0, E, (T_, K_), device=dev)
    tw = torch.rand(T_, K_, device=dev).bfloat16()
    plain = mxmoe.moe_experts(x, idx, tw, (w1, w3), w2)
    tp = mxmoe.moe_experts(x, idx, tw, tuple(distribute_tensor(t, mesh, [Shard(1)]) for t in (w1, w3)),
                           distribute_tensor(w2, mesh, [Shard(2)]))
    assert torch.equal(tp.full_tensor(), plain)
    # EP layer on one rank (all experts local): the fused layer's result on the dispatched rows.
    ep = ep_moe_experts(x, idx, tw, torch.cat([w1, w3], 1), w2, num_experts=E)
    torch.testing.assert_close(ep.float(), plain.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_nccl_world_size_1_fsdp_mx_tp_ep_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    spawn(__name__, "_nccl_fsdp_mx_tp_ep", 1, backend="nccl")


# ---- the launch: torchrun -m mxmoe train --fsdp | --ep (mxmoe/distributed/launch.py) -------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp", "ep", "fsdp-hf-qwen3"])
def test_torchrun_train_demo(mode, tmp_path):
    """The README's distributed launch on 2 gloo ranks: both runs train, the report comes from rank 0
    only, and the MXFP8 run stays within the demo's tolerance of bf16."""
    import subprocess
    import sys

    from dist_util import free_port

    if mode == "fsdp-hf-qwen3":
        pytest.importorskip("transformers")
    flag, model = ("--fsdp", "hf-qwen3") if mode == "fsdp-hf-qwen3" else (f"--{mode}", "demo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "mxmoe", "train", flag, "--model", model, "--recipe", "mxfp8_rceil_tile128", "--steps", "12",
           "--batch-size", "4", "--seq-len", "32", "--dim", "128", "--hidden", "128", "--experts", "4",
           "--no-progress", "--threads", "1", "--strict", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("PASS: MXFP8 final losses") == 1, res.stdout[-2000:]
    expect = ("EP over 2 ranks, 2 experts each; tokens dispatched as FP8" if mode == "ep" else
              "FSDP2 over 2 ranks (expert weights all-gathered as MX tiles in the MXFP8 run)")
    assert expect in res.stdout, res.stdout[:3000]
    assert (tmp_path / "train_report.txt").exists()


def test_fsdp_flag_without_torchrun_says_how_to_launch():
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    res = subprocess.run([sys.executable, "-m", "mxmoe", "train", "--fsdp", "--steps", "1"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode != 0 and "launch with torchrun" in res.stderr, res.stderr[-2000:]


# ---- expert-parallel checkpoints: DCP save on N ranks, load on N and on another N ----------------------

_EP_ARGS = dict(vocab_size=64, dim=64, n_layers=2, n_heads=2, max_seq_len=32, num_experts=4, top_k=2, moe_hidden=64)


def _ep_demo(rank, world):
    """The demo model as `torchrun -m mxmoe train --ep` shards it, and its optimizer."""
    from mxmoe.demo.model import MoEModelArgs, MoETransformer
    from mxmoe.distributed import launch

    torch.manual_seed(0)
    model = MoETransformer(MoEModelArgs(**_EP_ARGS))
    launch.shard(model, ep=True, recipe="mxfp8_rceil_tile128")
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def _ep_batch(step, rank, world):
    g = torch.Generator().manual_seed(10 * step)
    return torch.randint(0, 64, (4, 17), generator=g).chunk(world)[rank]  # this rank's slice of a global batch


def _ep_loss(model, b):
    return torch.nn.functional.cross_entropy(model(b[:, :-1]).flatten(0, 1).float(), b[:, 1:].flatten())


def _expert_state(model, opt):
    """Every expert weight and its AdamW moments as full tensors (gathered over the ranks)."""
    out = {}
    for n, p in model.named_parameters():
        if ".experts." in n:
            out[n] = p.full_tensor().clone()
            for k, v in opt.state[p].items():
                if hasattr(v, "full_tensor"):
                    out[f"{n}.{k}"] = v.full_tensor().clone()
    return out


def _ep_save(rank, world, tmp):
    model, opt = _ep_demo(rank, world)
    for step in range(2):
        _ep_loss(model, _ep_batch(step, rank, world)).backward()
        opt.step()
        opt.zero_grad()
    assert type(model.moe_layers()[0].experts.w1).__name__ == "DTensor"
    _dcp_save(model, opt, os.path.join(tmp, "ep"))
    state = _expert_state(model, opt)
    if rank == 0:
        torch.save(state, os.path.join(tmp, "experts.pt"))


def _ep_load(rank, world, tmp):
    model, opt = _ep_demo(rank, world)
    _dcp_load(model, opt, os.path.join(tmp, "ep"), lambda: _ep_loss(model, _ep_batch(0, rank, world)).backward())
    got, want = _expert_state(model, opt), torch.load(os.path.join(tmp, "experts.pt"))
    assert set(got) == set(want) and len(want) == 3 * 2 * 3, sorted(want)  # 2 layers x w1/w2/w3 x (w, m, v)
    for k in want:
        assert torch.equal(got[k], want[k]), k


@pytest.mark.slow
def test_expert_parallel_dcp_save_on_2_load_on_2_and_4(tmp_path):
    spawn(__name__, "_ep_save", 2, tmp=str(tmp_path))
    for world in (2, 4):
        spawn(__name__, "_ep_load", world, tmp=str(tmp_path))


def _mx_all_gather_micro_batches(rank, world, tmp):
    """Gradient accumulation under FSDP2 + MX all-gather: each rank quantizes its shards once per optimizer
    step, however many micro-batches (and re-gathers) the step has; the grads are the single process's."""
    import mxmoe
    from mxmoe.distributed import enable_mx_all_gather
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = mxmoe.nn.MoEExperts(E_MX, H_MX, I_MX)
    ref = mxmoe.nn.MoEExperts(E_MX, H_MX, I_MX)
    ref.load_state_dict(model.state_dict())
    enable_mx_all_gather(model)
    fully_shard(model, reshard_after_forward=True)  # a re-gather before every backward
    calls = _count_tile_quantizations()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=False)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(2):
        calls.clear()
        for micro in range(3):
            x, idx, w = _mx_data(10 * step + micro, rank)
            model(x, idx, w).square().mean().backward()
            for r in range(world):
                xr, ir, wr = _mx_data(10 * step + micro, r)
                (ref(xr, ir, wr).square().mean() / world).backward()
        # w13 and w2: this rank's shards once, and the single-process reference's whole weights once
        # (its weight cache), for the 3 micro-batches and their re-gathers
        want = [(E_MX // world, 2 * I_MX, H_MX), (E_MX // world, H_MX, I_MX), (E_MX, 2 * I_MX, H_MX), (E_MX, H_MX, I_MX)]
        assert sorted(calls) == sorted(want), (step, calls)
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-6, atol=1e-7, msg=f"{step} {n}")
        for o in (opt, opt_ref):
            o.step()
            o.zero_grad()


@pytest.mark.slow
def test_fsdp2_mx_all_gather_quantizes_once_per_step_over_micro_batches():
    _spawn("_mx_all_gather_micro_batches")
