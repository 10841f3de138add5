"""Expert parallelism (EP): one MoE layer's experts sharded over a process group, tokens dispatched to
the ranks that own their experts as FP8 codes + E8M0 scales, expert outputs combined in bf16.

    out = mxmoe.distributed.ep_moe_experts(x, topk_idx, topk_weights, w13_local, w2_local,
                                           num_experts=E, group=ep_group, recipe="mxfp8_rceil_tile128")
    layer = mxmoe.distributed.EPMoEExperts.from_experts(full_module, group=ep_group)

Sharding: rank r of `group` (W ranks) owns the contiguous experts [r*E_loc, (r+1)*E_loc), E_loc = E / W;
w13_local (E_loc, 2I, H) and w2_local (E_loc, H, I) are those experts' weights.

Data flow of one forward (every rank routes its own T tokens; N = T*k entries (t, j)):
  routing   ops.moe_routing(topk_idx, E): the entries in expert order, stable. Expert e = r*E_loc + l
            lives on rank r, so this order is "by destination rank, then local expert, then entry",
            and the counts per expert, viewed (W, E_loc), are the send counts. Ids outside [0, E) sort
            after every expert: they are dropped here (contribute 0, get no grad), never sent.
  counts    all_to_all_single of the (E,) counts (equal splits): each rank learns how many rows of each
            of its local experts every source sends. torch's all_to_all_single takes its split sizes
            as host lists, so the per-rank totals come to the host: ONE device->host copy per forward
            (the only host sync of the layer; the backward reuses the same splits).
  dispatch  x is quantized ONCE, rowwise, with the recipe's forward activation quantization
            (mxfp8_rceil_tile128: 1x128 blocks along H, RCEIL; mxfp8_rceil: 1x32 RCEIL; mxfp8_floor: 1x32
            FLOOR); each sent entry's row of codes (H bytes) and scales (one E8M0 byte per block: H/128
            for tile128, H/32 for the 1x32 recipes) travels as one uint8 row (gloo has no float8
            dtypes) in one all_to_all_single: ~0.50x (tile128) / ~0.52x (1x32) of bf16's 2H bytes.
            recipe=None sends the bf16 rows.
  experts   the receiver dequantizes the rows to x's dtype and runs its local experts on them with the
            fused single-process layer, mxmoe.moe_experts(x_recv, local_ids (R, 1), ones (R, 1),
            w13_local, w2_local, ...). That layer quantizes its input rows again with the same blocks;
            quantizing an already quantized block gives back the same values, so its FP8 GEMM operand
            is value-identical to the one the single-process layer builds from x: the forward is
            bit-identical to single-process moe_experts on dequantize(quantize(x)) (rowwise round trip),
            while dx and d topk_weights, which see x only through that quantization, match the
            single-process layer on x itself.
            The columnwise (wgrad) operand of dW13 = dH^T dispatch(x) is built after arrival, from the
            received (round-tripped) rows, whereas the single-process layer builds it from x itself:
            this is why dW13 differs slightly from the single-process layer's. (Slightly: scales are
            powers of two and e4m3 rounds to 3 mantissa bits whatever the scale, so an element's wgrad
            code changes only where the element is e4m3-subnormal under its row block's or its wgrad
            block's scale, i.e. far below that block's amax; the CPU tests see relative differences
            ~1e-7 in dW13.) dW2 and the biases' grads see the same operands, in the same
            row order, as the single-process layer; the one exception is the tile128 fused layer's
            bias2 grad, which it sums from fp32 w * dout while every GEMM operand (both layers) and
            EP's returned rows use w * dout rounded to x's dtype.
  combine   the expert outputs (R, H) in x's dtype go back to their source ranks with the reverse
            all_to_all_single, and the source does out[t] = sum_j w[t, j] * o[(t, j)] in fp32, j in order
            (ops.moe_combine, as the single-process layer: deterministic).
Backward: the reverse exchanges carry x's dtype (bf16) gradients: d o goes to the expert ranks,
d x_recv comes back and is summed per token (ops.moe_combine without weights: deterministic);
the dispatch quantization is passed straight through (d x = the sum of its entries' d x_recv).
Custom autograd Functions (no torch.distributed.nn); no host sync in the backward.

Collectives: every rank of `group` must call the layer (and its backward) the same number of times, in
the same order, with the same num_experts, recipe and weight shapes and the same requires_grad on
x / the weights (the backward's exchanges run where autograd reaches them). Empty sends and receives
(a rank that gets no rows, a rank with T = 0) are fine. Argument checks are local and run before any
collective, so a mistake made on every rank raises there instead of hanging.

Tensors live on x's device: gloo on the CPU, NCCL on CUDA (the same code).

dispatch_stats() reports the bytes given to all_to_all_single (forward dispatch: codes + scales +
counts; forward combine; backward), reset_dispatch_stats() zeroes them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .. import ops
from ..moe import Combine, Swiglu, is_dtensor, moe_experts, resolve_activation, resolve_layout
from ..nn import MoEExperts, check_sizes, init_expert_parameters_, make_expert_parameters
from ..recipes import get_recipe

__all__ = ["ep_moe_experts", "EPMoEExperts", "dispatch_stats", "reset_dispatch_stats", "expert_range",
           "expert_mesh", "shard_over_experts"]

_FLOAT = (torch.bfloat16, torch.float32)
_INT = (torch.int32, torch.int64)
U8 = torch.uint8

# ---- bytes on the wire ----------------------------------------------------------------------------

_STAT_KEYS = ("calls", "dispatch_bytes", "dispatch_count_bytes", "dispatch_rows", "combine_bytes",
              "backward_bytes")
_STATS = dict.fromkeys(_STAT_KEYS, 0)


def dispatch_stats(reset: bool = False) -> dict:
    """Bytes this process passed to all_to_all_single (the send buffers' sizes, including its own chunk):
      calls                 forwards of the layer
      dispatch_bytes        forward dispatch: codes + scales (or bf16 rows for recipe=None) + counts
      dispatch_count_bytes  of which the token counts exchange
      dispatch_rows         rows (entries) sent by the forward dispatch
      combine_bytes         forward combine: the expert outputs sent back (x's dtype)
      backward_bytes        both backward exchanges (x's dtype gradients)
    reset: zero the counters after reading them."""
    out = dict(_STATS)
    if reset:
        reset_dispatch_stats()
    return out


def reset_dispatch_stats() -> None:
    for key in _STAT_KEYS:
        _STATS[key] = 0


def _a2a(out: Tensor, inp: Tensor, out_splits: List[int], in_splits: List[int], group, stat: str) -> None:
    """all_to_all_single on byte views (gloo has no float8 dtypes; one wire dtype for every exchange):
    the splits count rows (dim 0), which the (rows, bytes per row) view keeps."""
    _STATS[stat] += inp.numel() * inp.element_size()
    dist.all_to_all_single(_bytes(out), _bytes(inp.contiguous()), out_splits, in_splits, group=group)


def _bytes(t: Tensor) -> Tensor:
    """A contiguous tensor as (rows, bytes per row) uint8 (a 1-D tensor: one element per row)."""
    rows = t.unsqueeze(1) if t.dim() == 1 else t.view(t.shape[0], t.shape[1:].numel())
    return rows.view(U8)


# ---- the plan of one forward: splits (host lists), shared by the forward and backward exchanges -----


@dataclass(frozen=True)
class _Plan:
    group: object
    send_splits: List[int]  # rows sent to each rank of the group
    recv_splits: List[int]  # rows received from each rank
    n_send: int
    n_recv: int
    n_rows: int  # T * k: the routing's row space (sent rows first, dropped ones after)


def _rowwise(recipe):
    """(block, mode) of the recipe's forward activation quantization, or None for bf16."""
    if recipe is None:
        return None
    r = get_recipe(recipe)
    return r.a_block, r.mode


class _Dispatch(torch.autograd.Function):
    """x (T, H) -> x_recv (R, H): the sent entries' rows, quantized once (rowwise), exchanged as bytes,
    dequantized to x's dtype. Backward: d x_recv back to the sources (x's dtype), summed per token."""

    @staticmethod
    def forward(ctx, x, tok, inv, plan: _Plan, quant):
        T, H = x.shape
        if quant is None:
            rows, nbytes = x.to(torch.bfloat16).view(U8), 2 * H  # (T, 2H) bytes of the bf16 rows
            n_scale = stride = 0
        else:
            block, mode = quant
            q, _, scale, _ = ops.quantize(x, None, 1, block, mode, True, False, True, False)
            stride = block // ops.BLOCK  # the scale tensor repeats a coarse block's byte: send it once
            n_scale = scale.shape[1]
            rows = torch.cat([q.view(U8), scale.view(U8)[:, ::stride]], dim=1)
            nbytes = rows.shape[1]
        send = rows.index_select(0, tok)  # (n_send, bytes): destination rank, local expert, entry order
        recv = torch.empty((plan.n_recv, nbytes), dtype=U8, device=x.device)
        _STATS["dispatch_rows"] += plan.n_send
        _a2a(recv, send, plan.recv_splits, plan.send_splits, plan.group, "dispatch_bytes")
        if quant is None:
            x_recv = recv.view(torch.bfloat16).to(x.dtype)
        else:
            q_r = recv[:, :H].contiguous().view(ops.E4M3)
            s_c = recv[:, H:]  # one byte per block: repeat it over the block's 32-element pieces
            s_r = s_c.unsqueeze(2).expand(-1, -1, stride).reshape(plan.n_recv, s_c.shape[1] * stride)[:, :n_scale]
            s_r = s_r.contiguous().view(ops.E8M0)
            x_recv = ops.dequantize(q_r, s_r, 1, None, x.dtype)
        ctx.save_for_backward(inv)
        ctx.plan, ctx.x_shape, ctx.x_dtype = plan, (T, H), x.dtype
        return x_recv

    @staticmethod
    def backward(ctx, d_recv):
        (inv,) = ctx.saved_tensors
        plan, (T, H), dtype = ctx.plan, ctx.x_shape, ctx.x_dtype
        if d_recv is None:
            d_recv = torch.zeros((plan.n_recv, H), dtype=dtype, device=inv.device)
        d_rows = torch.empty((plan.n_rows, H), dtype=dtype, device=d_recv.device)
        d_rows[plan.n_send:].zero_()  # dropped entries: no grad
        _a2a(d_rows[:plan.n_send], d_recv.to(dtype), plan.send_splits, plan.recv_splits, plan.group,
             "backward_bytes")
        return ops.moe_combine(d_rows, inv, None, dtype), None, None, None, None


class _Return(torch.autograd.Function):
    """The expert outputs (R, H) -> (T*k, H) rows at their sources, in routing-row order (the dropped
    rows after the sent ones: 0). Backward: d o of the sent rows to the expert ranks."""

    @staticmethod
    def forward(ctx, y_recv, plan: _Plan):
        H = y_recv.shape[1]
        rows = torch.empty((plan.n_rows, H), dtype=y_recv.dtype, device=y_recv.device)
        rows[plan.n_send:].zero_()
        _a2a(rows[:plan.n_send], y_recv, plan.send_splits, plan.recv_splits, plan.group, "combine_bytes")
        ctx.plan, ctx.dtype = plan, y_recv.dtype
        return rows

    @staticmethod
    def backward(ctx, d_rows):
        plan = ctx.plan
        d_recv = torch.empty((plan.n_recv, d_rows.shape[1]), dtype=ctx.dtype, device=d_rows.device)
        _a2a(d_recv, d_rows[:plan.n_send].to(ctx.dtype), plan.recv_splits, plan.send_splits, plan.group,
             "backward_bytes")
        return d_recv, None


# ---- checks ------------------------------------------------------------------------------------------


def _desc(t) -> str:
    if not isinstance(t, Tensor):
        return type(t).__name__
    return f"{str(t.dtype).replace('torch.', '')} tensor of shape {tuple(t.shape)} on {t.device}"


def _group_info(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialized (call init_process_group first)")
    return dist.get_world_size(group), dist.get_rank(group)


def expert_range(num_experts: int, group=None):
    """(first, end) expert ids this rank owns in `group`: [rank * E_loc, (rank + 1) * E_loc)."""
    world, rank = _group_info(group)
    e_loc = _local_count(num_experts, world)
    return rank * e_loc, (rank + 1) * e_loc


def _local_count(num_experts, world: int) -> int:
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts: expected a positive int, got {num_experts!r}")
    if num_experts % world:
        raise ValueError(f"num_experts: expected a multiple of the group size {world} (experts are sharded in "
                         f"equal contiguous blocks), got {num_experts}")
    return num_experts // world


def _local_shard(name: str, t, world: int):
    """A weight given as this rank's plain shard, or as the global DTensor sharded over the experts
    (Shard(0) on the group's 1-D mesh, as EPMoEExperts holds them): its local shard (differentiable)."""
    if not is_dtensor(t):
        return t
    from torch.distributed.tensor import Shard

    if t.device_mesh.ndim != 1 or t.device_mesh.size() != world or tuple(t.placements) != (Shard(0),):
        raise ValueError(f"{name}_local: expected this rank's shard or a DTensor sharded over the experts "
                         f"(Shard(0)) on a 1-D mesh of the group's {world} ranks, got placements "
                         f"{tuple(t.placements)} on a mesh of shape {tuple(t.device_mesh.shape)}")
    return t.to_local()


def expert_mesh(group=None, device_type: str = "cpu"):
    """The 1-D DeviceMesh of an expert-parallel process group (default: the world)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group if group is not None else dist.group.WORLD, device_type)


def shard_over_experts(local: Tensor, mesh, requires_grad: bool = True) -> nn.Parameter:
    """A Parameter holding `local` (this rank's experts, (E_loc, ...)) as the global (E, ...) DTensor
    sharded over the experts: DCP then saves and loads each rank's experts (and their optimizer
    states), also into a different number of ranks; without it, torch.distributed.checkpoint takes a
    plain tensor for a replicated one and keeps only one rank's copy."""
    from torch.distributed.tensor import DTensor, Shard

    return nn.Parameter(DTensor.from_local(local.detach(), mesh, [Shard(0)], run_check=False),
                        requires_grad=requires_grad)


def _check(x, topk_idx, topk_w, w13, w2, b13, b2, e_loc, num_experts, world):
    for name, t in (("x", x), ("topk_idx", topk_idx), ("topk_weights", topk_w), ("w13_local", w13),
                    ("w2_local", w2)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2 or x.dtype not in _FLOAT:
        raise ValueError(f"x: expected a (T, H) bfloat16 or float32 tensor, got a {_desc(x)}")
    T, H = x.shape
    if topk_idx.dim() != 2 or topk_idx.shape[0] != T or topk_idx.dtype not in _INT:
        raise ValueError(f"topk_idx: expected a (T={T}, k) int32 or int64 tensor of expert ids, got a "
                         f"{_desc(topk_idx)}")
    k = topk_idx.shape[1]
    if not isinstance(topk_w, Tensor) or topk_w.shape != topk_idx.shape or topk_w.dtype not in _FLOAT:
        raise ValueError(f"topk_weights: expected a ({T}, {k}) bfloat16 or float32 tensor (topk_idx's shape), "
                         f"got a {_desc(topk_w)}")
    where = f"num_experts {num_experts} / group size {world}"
    if w13.dim() != 3 or w13.shape[0] != e_loc or w13.shape[2] != H or w13.shape[1] % 2 or w13.dtype not in _FLOAT:
        raise ValueError(f"w13_local: expected an (E_loc={e_loc} ({where}), 2I, H={H}) bfloat16 or float32 "
                         f"tensor, got a {_desc(w13)}")
    I = w13.shape[1] // 2
    if w2.dim() != 3 or tuple(w2.shape) != (e_loc, H, I) or w2.dtype not in _FLOAT:
        raise ValueError(f"w2_local: expected an (E_loc={e_loc} ({where}), H={H}, I={I}) bfloat16 or float32 "
                         f"tensor, got a {_desc(w2)}")
    if H % 32 or I % 32:
        raise ValueError(f"w13_local: expected H and I to be multiples of 32 (MX blocks), got H={H}, I={I}")
    for name, b, n in (("bias13_local", b13, 2 * I), ("bias2_local", b2, H)):
        if b is not None and (not isinstance(b, Tensor) or b.dim() != 2 or tuple(b.shape) != (e_loc, n)
                              or b.dtype not in _FLOAT):
            raise ValueError(f"{name}: expected an (E_loc={e_loc}, {n}) bfloat16 or float32 tensor, got a "
                             f"{_desc(b)}")
    for name, t in (("topk_idx", topk_idx), ("topk_weights", topk_w), ("w13_local", w13), ("w2_local", w2),
                    ("bias13_local", b13), ("bias2_local", b2)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (x's), got {t.device}")


# ---- the layer -----------------------------------------------------------------------------------------


def ep_moe_experts(
    x: Tensor,
    topk_idx: Tensor,
    topk_weights: Tensor,
    w13_local: Tensor,
    w2_local: Tensor,
    *,
    num_experts: int,
    group=None,
    recipe: Optional[str] = "mxfp8_rceil_tile128",
    activation: Union[str, Swiglu] = "swiglu",
    layout: str = "concatenated",
    bias13_local: Optional[Tensor] = None,
    bias2_local: Optional[Tensor] = None,
    backend: str = "auto",
    grouped_mm_backend: str = "auto",
) -> Tensor:
    """The experts of one MoE layer, sharded over `group`: out[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t]).

    Args:
      x: (T, H) bfloat16 or float32: this rank's tokens (T may be 0).
      topk_idx: (T, k) int32 or int64 global expert ids in [0, num_experts); others are dropped
        (contribute 0, get no grad, are never sent).
      topk_weights: (T, k) bfloat16 or float32 routing weights (used as given).
      w13_local: (E_loc, 2I, H), w2_local: (E_loc, H, I): this rank's experts [rank*E_loc, (rank+1)*E_loc)
        (rank in `group`), E_loc = num_experts / group size.
      num_experts: E, the layer's total expert count (a multiple of the group size).
      group: the expert-parallel process group (default: the world).
      recipe, activation, layout, backend, grouped_mm_backend: as mxmoe.moe_experts (the local experts
        run through it); the recipe also picks the dispatch quantization (module docstring).
      bias13_local: optional (E_loc, 2I); bias2_local: optional (E_loc, H).
    Returns (T, H) in x's dtype; differentiable in x, topk_weights, the weights and the biases.

    Numerics: the forward is bit-identical to single-process moe_experts over all ranks' tokens with x
    replaced by its rowwise round trip dequantize(quantize(x)) (recipe=None: to moe_experts itself);
    dW13's wgrad operand is built from the received (round-tripped) rows, so dW13 differs slightly from
    the single-process layer's (see the module docstring).
    Host syncs: exactly one device->host copy of the token counts per forward (the split sizes that
    torch's all_to_all_single takes as host lists); the backward reuses them and does not sync.
    Every rank of `group` must call it (and run its backward) in the same order.
    """
    world, rank = _group_info(group)
    e_loc = _local_count(num_experts, world)
    w13_local, w2_local, bias13_local, bias2_local = (
        _local_shard(n, t, world) for n, t in (("w13", w13_local), ("w2", w2_local), ("bias13", bias13_local),
                                              ("bias2", bias2_local)))
    _check(x, topk_idx, topk_weights, w13_local, w2_local, bias13_local, bias2_local, e_loc, num_experts, world)
    quant = _rowwise(recipe)  # ValueError on an unknown recipe, before any collective
    resolve_activation(activation), resolve_layout(layout)
    if backend not in ("auto", "fused", "composed"):
        raise ValueError(f"backend: expected 'auto', 'fused' or 'composed', got {backend!r}")
    device = x.device
    T, k = topk_idx.shape
    _STATS["calls"] += 1

    # Routing: entries in expert order = by destination rank, then local expert (stable); dropped last.
    offs, perm, inv = ops.moe_routing(topk_idx.contiguous(), num_experts)
    send_counts = torch.diff(offs, prepend=offs.new_zeros(1))  # (E,) = (W, E_loc) rows per destination
    recv_counts = torch.empty_like(send_counts)  # (W, E_loc): rows of my local experts from each source
    _STATS["dispatch_count_bytes"] += send_counts.numel() * send_counts.element_size()
    _a2a(recv_counts, send_counts, [e_loc] * world, [e_loc] * world, group, "dispatch_bytes")
    # The one device->host copy: the per-rank totals, split sizes of the exchanges below.
    totals = torch.cat([send_counts.view(world, e_loc).sum(1), recv_counts.view(world, e_loc).sum(1)]).tolist()
    send_splits, recv_splits = totals[:world], totals[world:]
    plan = _Plan(group, send_splits, recv_splits, sum(send_splits), sum(recv_splits), T * k)

    tok = perm[:plan.n_send].long() // k  # the token of each sent entry
    x_recv = _Dispatch.apply(x.contiguous(), tok, inv, plan, quant)
    # The received rows: by source rank, then local expert; their local expert ids without a sync.
    local_ids = torch.repeat_interleave(torch.arange(e_loc, device=device).repeat(world), recv_counts.long(),
                                        output_size=plan.n_recv).unsqueeze(1)
    ones = torch.ones((plan.n_recv, 1), dtype=torch.float32, device=device)
    y_recv = moe_experts(x_recv, local_ids, ones, w13_local, w2_local, recipe=recipe, activation=activation,
                         layout=layout, bias13=bias13_local, bias2=bias2_local, backend=backend,
                         grouped_mm_backend=grouped_mm_backend)
    rows = _Return.apply(y_recv, plan)
    return Combine.apply(rows, topk_weights.contiguous(), perm, inv, k, x.dtype)


class EPMoEExperts(nn.Module):
    """This rank's share of one MoE layer's experts under expert parallelism (ep_moe_experts).

    Args:
      num_experts, hidden_size, intermediate_size: E (all ranks together), H, I (multiples of 32).
      group: the expert-parallel process group (default: the world; initialized before construction).
      recipe, activation, layout: as mxmoe.nn.MoEExperts (the recipe also picks the dispatch encoding).
      bias: give the experts biases bias13 (E_loc, 2I) and bias2 (E_loc, H).
      dtype, device: of the parameters.
    Parameters: w13 (E, 2I, H) and w2 (E, H, I) as DTensors sharded over the experts (Shard(0) on the
    group's mesh): this rank holds the experts [expert_start, expert_end) (``w13.to_local()``,
    initialized independently per rank, as nn.Linear; from_experts slices a full module instead), and
    torch.distributed.checkpoint saves / loads every rank's experts and optimizer states.
    forward(x (..., H), topk_idx (..., k) global ids, topk_weights (..., k)) -> (..., H) in x's dtype.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *, group=None,
                 recipe: Optional[str] = "mxfp8_rceil_tile128", activation: Union[str, Swiglu] = "swiglu",
                 layout: str = "concatenated", bias: bool = False, dtype: Optional[torch.dtype] = None,
                 device=None):
        super().__init__()
        resolve_activation(activation), resolve_layout(layout), _rowwise(recipe)
        check_sizes(hidden_size=hidden_size, intermediate_size=intermediate_size)
        world, rank = _group_info(group)
        e_loc = _local_count(num_experts, world)
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.group, self.group_size, self.group_rank = group, world, rank
        self.num_local_experts = e_loc
        self.expert_start, self.expert_end = rank * e_loc, (rank + 1) * e_loc
        self.recipe, self.activation, self.layout = recipe, activation, layout
        make_expert_parameters(self, e_loc, hidden_size, intermediate_size, bias, dtype, device)
        self.reset_parameters()
        # The parameters as global DTensors sharded over the experts (see shard_over_experts): correct
        # DCP checkpoints of every rank's experts and optimizer states, loadable on another rank count.
        mesh = expert_mesh(group, self.w13.device.type)
        for name in ("w13", "w2", "bias13", "bias2"):
            if getattr(self, name) is not None:
                setattr(self, name, shard_over_experts(getattr(self, name), mesh))

    def reset_parameters(self) -> None:
        # mxmoe.nn.MoEExperts' init on this rank's shards (each rank draws its own experts)
        local = [None if t is None else t.to_local() if is_dtensor(t) else t
                 for t in (self.w13, self.w2, self.bias13, self.bias2)]
        init_expert_parameters_(*local, self.hidden_size, self.intermediate_size)

    @classmethod
    def from_experts(cls, module, group=None) -> "EPMoEExperts":
        """This rank's slice (copies) of a full single-process mxmoe.nn.MoEExperts' weights, with its recipe,
        activation and layout."""
        if not isinstance(module, MoEExperts):
            raise ValueError(f"module: expected a mxmoe.nn.MoEExperts, got {type(module).__name__}")
        w13 = module.w13
        ep = cls(module.num_experts, module.hidden_size, module.intermediate_size, group=group,
                 recipe=module.recipe, activation=module.activation, layout=module.layout,
                 bias=module.bias13 is not None, dtype=w13.dtype, device=w13.device)
        sl = slice(ep.expert_start, ep.expert_end)
        with torch.no_grad():
            for name in ("w13", "w2", "bias13", "bias2"):
                src = getattr(module, name)
                if src is not None:
                    getattr(ep, name).to_local().copy_(src.detach()[sl])
        return ep

    def forward(self, x: Tensor, topk_idx: Tensor, topk_weights: Tensor) -> Tensor:
        lead = x.shape[:-1]
        out = ep_moe_experts(x.reshape(-1, x.shape[-1]), topk_idx.reshape(-1, topk_idx.shape[-1]),
                             topk_weights.reshape(-1, topk_weights.shape[-1]), self.w13, self.w2,
                             num_experts=self.num_experts, group=self.group, recipe=self.recipe,
                             activation=self.activation, layout=self.layout, bias13_local=self.bias13,
                             bias2_local=self.bias2)
        return out.reshape(*lead, x.shape[-1])

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, local_experts=[{self.expert_start}, {self.expert_end}), "
                f"group_size={self.group_size}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, recipe={self.recipe!r}, "
                f"activation={self.activation!r}, layout={self.layout!r}, bias={self.bias13 is not None}")
