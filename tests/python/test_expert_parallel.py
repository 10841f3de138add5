"""Expert parallelism on the CPU (gloo, spawned ranks, bounded time): mxmoe.distributed.ep_moe_experts /
EPMoEExperts with the experts sharded over the ranks and the tokens dispatched as FP8 codes + E8M0
scales match the single-process layer run on every rank's tokens:
  * forward bit-identical (torch.equal) to mxmoe.moe_experts on the rowwise round trip
    dequantize(quantize(x)) of x (tile128, mxfp8_rceil), to moe_experts itself for recipe=None;
  * dW2 bit-identical to the single-process layer on the round-tripped x; dx, d topk_weights, dW13,
    d bias13, d bias2 close to it and to the layer on x (EP applies the routing weights before its
    local dgrad, the single-process fused layer after it, recipe=None included: there they differ by
    bf16 roundings only);
  * float32 tokens (rows and grads travel in float32), leading dims through EPMoEExperts, from_experts;
  * the dispatch moves <= 0.55x the bytes of the bf16 dispatch (the exact byte count is pinned);
  * bad routing: out-of-range ids dropped, all tokens on one rank's experts, ranks with no tokens;
  * bad arguments raise ValueError on every rank before any collective (no hang)."""
import pytest
import torch

from dist_util import spawn

H, I, K = 160, 64, 2  # H = 160: tile128's last block per row is partial (32 of 128)
MX_RECIPES = ("mxfp8_rceil_tile128", "mxfp8_rceil")


def _spawn(fn_name, world):
    spawn(__name__, fn_name, world, timeout_s=120)


def _settled(body):
    """A rank body that ends with a barrier: every rank's last exchange has completed before any rank
    tears its process group down (gloo aborted a rank now and then at exit without it)."""
    def run(rank, world, tmp):
        import torch.distributed as dist

        body(rank, world, tmp)
        dist.barrier()

    run.__name__ = run.__qualname__ = body.__name__
    return run


# ---- helpers (run inside the ranks) ------------------------------------------------------------------


def _round_trip(x, recipe):
    """x's rowwise MX round trip with the recipe's forward activation blocks (recipe None: x)."""
    from mxmoe import ops
    from mxmoe.recipes import get_recipe

    if recipe is None:
        return x
    r = get_recipe(recipe)
    q, _, s, _ = ops.quantize(x, None, 1, r.a_block, r.mode, True, False, True, False)
    return ops.dequantize(q, s, 1, None, x.dtype)


def _data(rank, T, E, seed, ids=None):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    # magnitudes varying by powers of 2 per row and per 32 columns: the 1x128, 1x32 and the wgrad
    # operand's column blocks then get different scales (with uniform data they often coincide)
    mag = 2.0 ** torch.randint(-3, 4, (T, 1), generator=g) * 2.0 ** torch.randint(-2, 3, (H // 32,), generator=g)
    x = (torch.randn(T, H, generator=g) * mag.repeat_interleave(32, dim=1)).to(torch.bfloat16)
    if ids is None:
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).reshape(T, K)
    w = torch.rand(T, K, generator=g)
    cot = torch.randn(T, H, generator=g)
    return x, ids, w, cot


def _local(t):
    """EPMoEExperts' parameters and grads are DTensors sharded over the experts: this rank's shard."""
    return t.to_local() if hasattr(t, "to_local") else t


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _run_ep(ep, x, ids, w, cot):
    x = x.clone().requires_grad_()
    w = w.clone().requires_grad_()
    out = ep(x, ids, w)
    (out.float() * cot).sum().backward()
    return out.detach(), x.grad, w.grad


def _run_ref(ref, xs, ids, ws, cots, recipe, round_trip):
    """The single-process layer on all ranks' tokens; the total loss is the sum of the ranks' losses."""
    import mxmoe

    x = torch.cat(xs)
    x = (_round_trip(x, recipe) if round_trip else x).requires_grad_()
    w = torch.cat(ws).requires_grad_()
    for p in ref.parameters():
        p.grad = None
    out = mxmoe.moe_experts(x, torch.cat(ids), w, ref.w13, ref.w2, recipe=recipe, bias13=ref.bias13,
                            bias2=ref.bias2)
    (out.float() * torch.cat(cots)).sum().backward()
    grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    return out.detach(), x.grad, w.grad, grads


def _rows(rank, sizes):
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def _check_against_single_process(ep, ref, rank, world, data, recipe):
    """EP vs single process on the same tokens; returns nothing, asserts (see the module docstring)."""
    xs, ids, ws, cots = (list(v) for v in zip(*data))
    out, dx, dw = _run_ep(ep, xs[rank], ids[rank], ws[rank], cots[rank])
    rows = _rows(rank, [x.shape[0] for x in xs])
    sl = slice(ep.expert_start, ep.expert_end)
    ref_rt = _run_ref(ref, xs, ids, ws, cots, recipe, round_trip=True)
    ref_x = _run_ref(ref, xs, ids, ws, cots, recipe, round_trip=False) if recipe is not None else ref_rt
    msg = f"{recipe} rank {rank}/{world}"
    # forward: bit-identical to the single-process layer on the round-tripped x
    assert torch.equal(out, ref_rt[0][rows]), msg
    # The backward: EP's local layer gets the rows w * dout back through its combine (weights before its
    # dgrad), the single-process layer applies the weights after the down projection's dgrad (mxmoe/moe
    # functional.py): dW2 reads w * dout in both and is the same bits; dx, d topk_weights, dW13, d bias13
    # differ by the quantization of dout vs w * dout (close). recipe=None: by the bf16 rounding of
    # w * dY' vs w * dout (much closer).
    # MX: each about 23 dB from fp32 (test_moe_layer), 14 dB apart at most; bf16: roundings only.
    def close(a, b, what, tol=0.2 if recipe is not None else 0.02):
        assert _rel(a, b) <= tol, (msg, what, _rel(a, b))

    for got, want, what in ((dx, ref_rt[1][rows], "dx"), (dw, ref_rt[2][rows], "d topk_weights")):
        close(got, want, what)
    for name, p in ep.named_parameters():
        g_rt, g_x = ref_rt[3][name][sl], ref_x[3][name][sl]
        grad = _local(p.grad)
        if name == "w2":
            assert torch.equal(grad, g_rt), f"{msg} {name}"
        elif name == "bias2" and recipe == "mxfp8_rceil_tile128":
            # the single-process fused layer sums w * dout in fp32 for this one; EP's rows come back
            # as bf16 (w * dout), the value every GEMM operand of both layers is quantized from
            torch.testing.assert_close(grad, g_rt, rtol=1e-2, atol=1e-2, msg=f"{msg} {name}")
        else:
            close(grad, g_rt, name)
        # every grad close to the single-process layer on x itself
        close(grad, g_x, name + " (x)")


# ---- the rank bodies (module-level: spawn pickles them by name) ----------------------------------


@_settled
def _matches_single_process(rank, world, tmp):
    import mxmoe
    from mxmoe.distributed import EPMoEExperts, dispatch_stats

    E, T = 2 * world, 12
    data = [_data(r, T, E, seed=1) for r in range(world)]
    n_valid = T * K  # every id valid
    sent = {}
    for recipe in MX_RECIPES + (None,):
        torch.manual_seed(0)
        ref = mxmoe.nn.MoEExperts(E, H, I, recipe=recipe, bias=True)
        ep = EPMoEExperts.from_experts(ref, group=None)
        assert (ep.expert_start, ep.expert_end, ep.num_local_experts) == (2 * rank, 2 * rank + 2, 2)
        w13 = _local(ep.w13)
        assert torch.equal(w13, ref.w13[2 * rank:2 * rank + 2]) and w13.data_ptr() != ref.w13.data_ptr()
        assert tuple(ep.w13.shape) == tuple(ref.w13.shape)  # the global DTensor (Shard(0) over the experts)
        assert f"recipe={recipe!r}" in repr(ep) and "local_experts=[" in repr(ep)
        dispatch_stats(reset=True)
        _check_against_single_process(ep, ref, rank, world, data, recipe)
        stats = dispatch_stats()
        assert stats["calls"] == 1 and stats["dispatch_rows"] == n_valid, stats
        sent[recipe] = stats
    # bytes of the dispatch: codes (H) + one scale byte per block + the (E,) int32 counts
    counts = 4 * E
    assert sent["mxfp8_rceil_tile128"]["dispatch_bytes"] == n_valid * (H + 2) + counts  # 2 blocks of 1x128
    assert sent["mxfp8_rceil"]["dispatch_bytes"] == n_valid * (H + H // 32) + counts
    assert sent[None]["dispatch_bytes"] == n_valid * 2 * H + counts
    for recipe in MX_RECIPES:
        ratio = sent[recipe]["dispatch_bytes"] / sent[None]["dispatch_bytes"]
        assert ratio <= 0.55, (recipe, ratio)
        # the combine sends back, in bf16, the rows this rank received (its experts' entries)
        n_recv = sum(int(((d[1] >= 2 * rank) & (d[1] < 2 * rank + 2)).sum()) for d in data)
        assert sent[recipe]["combine_bytes"] == sent[None]["combine_bytes"] == n_recv * 2 * H
    assert dispatch_stats(reset=True)["calls"] == 1 and dispatch_stats()["calls"] == 0
    if world == 2:  # float32 tokens: the rows arrive (and the grads travel) in float32
        torch.manual_seed(0)
        ref = mxmoe.nn.MoEExperts(E, H, I, recipe="mxfp8_rceil_tile128")
        ep = EPMoEExperts.from_experts(ref)
        data32 = [(x.float(), ids, w, cot) for x, ids, w, cot in data]
        _check_against_single_process(ep, ref, rank, world, data32, "mxfp8_rceil_tile128")
        # leading dims (..., H), as mxmoe.nn.MoEExperts
        x, ids, w, _ = data[rank]
        out3 = ep(x.view(3, T // 3, H), ids.view(3, T // 3, K), w.view(3, T // 3, K))
        assert torch.equal(out3.view(T, H), ep(x, ids, w))


@_settled
def _bad_routing(rank, world, tmp):
    """World 4, E = 8: rank 0 has no tokens; every id that is in range is one of rank 1's experts (2, 3),
    so ranks 0, 2, 3 receive nothing; rank 1 also routes to -1, -5, 8 and 1000 (dropped). Then every
    rank with no tokens at all."""
    import mxmoe
    from mxmoe.distributed import EPMoEExperts, dispatch_stats

    E = 2 * world
    sizes = [0, 10, 6, 5][:world]

    def ids_of(r, T):
        g = torch.Generator().manual_seed(7 + r)
        ids = torch.randint(2, 4, (T, K), generator=g)
        if r == 1:
            ids[0] = torch.tensor([-1, 8])  # a token with both choices dropped
            ids[1, 1], ids[2, 0], ids[3, 1] = 1000, -5, E
        return ids

    data = [_data(r, sizes[r], E, seed=2, ids=ids_of(r, sizes[r])) for r in range(world)]
    n_valid = [int(((d[1] >= 0) & (d[1] < E)).sum()) for d in data]
    for recipe in ("mxfp8_rceil_tile128", None):
        torch.manual_seed(0)
        ref = mxmoe.nn.MoEExperts(E, H, I, recipe=recipe)
        ep = EPMoEExperts.from_experts(ref)
        dispatch_stats(reset=True)
        _check_against_single_process(ep, ref, rank, world, data, recipe)
        stats = dispatch_stats()
        assert stats["dispatch_rows"] == n_valid[rank]
        assert (stats["combine_bytes"] == 0) == (rank != 1)  # only rank 1 received rows to send back
        if rank == 1:  # the dropped entries: no grad; the token routed only to dropped ids: 0
            x, ids, w, cot = data[1]
            out, dx, dw = _run_ep(ep, x, ids, w, cot)
            bad = (ids < 0) | (ids >= E)
            assert torch.all(dw[bad] == 0) and torch.all(dw[~bad] != 0)
            assert torch.all(out[0] == 0) and torch.all(dx[0] == 0)
        else:
            _run_ep(ep, *data[rank])  # the collectives of rank 1's extra call
        if rank != 1:  # the experts nobody routes to: zero grads
            assert torch.all(_local(ep.w13.grad) == 0) and torch.all(_local(ep.w2.grad) == 0)
    # every rank without tokens: the exchanges are all empty
    ep = EPMoEExperts(E, H, I)
    x = torch.zeros(0, H, dtype=torch.bfloat16, requires_grad=True)
    out = ep(x, torch.zeros(0, K, dtype=torch.int64), torch.zeros(0, K))
    out.sum().backward()
    assert out.shape == (0, H) and x.grad.shape == (0, H) and torch.all(_local(ep.w13.grad) == 0)


@_settled
def _bad_arguments(rank, world, tmp):
    from mxmoe.distributed import EPMoEExperts, ep_moe_experts

    E, T = 2 * world, 4
    x = torch.randn(T, H, dtype=torch.bfloat16)
    ids, w = torch.randint(0, E, (T, K)), torch.rand(T, K)
    w13, w2 = torch.randn(2, 2 * I, H), torch.randn(2, H, I)

    def call(**kw):
        args = dict(x=x, topk_idx=ids, topk_weights=w, w13_local=w13, w2_local=w2)
        args.update({k: v for k, v in kw.items() if k in args})
        return ep_moe_experts(*args.values(), num_experts=kw.get("num_experts", E),
                              bias13_local=kw.get("bias13_local"), recipe=kw.get("recipe", "mxfp8_rceil_tile128"))

    with pytest.raises(ValueError, match=rf"num_experts: expected a multiple of the group size {world}.*got {E + 1}"):
        call(num_experts=E + 1)
    with pytest.raises(ValueError, match="num_experts: expected a positive int"):
        call(num_experts=0)
    with pytest.raises(ValueError, match=rf"w13_local: expected an \(E_loc=2 .*got a float32 tensor of shape "
                                         rf"\({E}, {2 * I}, {H}\)"):
        call(w13_local=torch.randn(E, 2 * I, H))  # the full layer's weights instead of this rank's
    with pytest.raises(ValueError, match=rf"w2_local: expected an \(E_loc=2 .*H={H}, I={I}\)"):
        call(w2_local=torch.randn(2, H, 2 * I))
    with pytest.raises(ValueError, match=r"bias13_local: expected an \(E_loc=2, 128\)"):
        call(bias13_local=torch.zeros(E, 2 * I))
    with pytest.raises(ValueError, match=rf"topk_weights: expected a \({T}, {K}\)"):
        call(topk_weights=torch.rand(T, K + 1))
    with pytest.raises(ValueError, match=r"x: expected a \(T, H\)"):
        call(x=x.unsqueeze(0))
    with pytest.raises(ValueError, match="recipe: expected one of"):
        call(recipe="fp4")
    with pytest.raises(ValueError, match=rf"num_experts: expected a multiple of the group size {world}"):
        EPMoEExperts(E + 1, H, I)
    with pytest.raises(ValueError, match="module: expected a mxmoe.nn.MoEExperts"):
        EPMoEExperts.from_experts(torch.nn.Linear(2, 2))
    # the group still works after the errors (nothing was half-exchanged)
    out = call()
    assert out.shape == (T, H) and torch.isfinite(out.float()).all()


# ---- the tests -----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ep_matches_single_process_and_dispatch_bytes(world):
    _spawn("_matches_single_process", world)


@pytest.mark.slow
def test_ep_bad_routing_dropped_ids_one_hot_rank_and_empty_ranks():
    _spawn("_bad_routing", 4)


@pytest.mark.slow
def test_ep_bad_arguments_raise_before_any_collective():
    _spawn("_bad_arguments", 2)
