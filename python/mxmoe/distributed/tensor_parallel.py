"""Tensor parallelism for the fused expert layer: expert weights as DTensors sharded along the expert
hidden dim (the rule mxmoe.moe_experts applies when it is given DTensor weights: registered into the
layer at import, mxmoe.moe.register_dtensor_rule, so the layer imports nothing of torch.distributed).

The one sharding a SwiGLU expert layer computes without moving tokens (TorchTitan's
ExpertTensorParallel, Megatron's expert TP): on a 1-D mesh of tp ranks,
  w13   Shard(1)   each rank holds rows [r*I/tp, (r+1)*I/tp) of the gate AND of the up projection:
                   TorchTitan's separate w1 / w3 as a (gate, up) pair of Shard(1) DTensors, or an
                   interleaved w13 (gpt-oss: gate/up rows alternate, so any even split keeps pairs)
  w2    Shard(2)   the matching columns of the down projection
  bias13 Shard(1), bias2 Replicate (added once, on mesh rank 0's partial sum)
  x, topk_idx, topk_weights replicated (plain tensors, or DTensors with Replicate())
Each rank runs the fused layer on its shards (SwiGLU is elementwise in I, so its slice of the
intermediate is exact) and holds a partial sum of the output: the result is a DTensor with
Partial() placement (``.full_tensor()`` / ``redistribute`` all-reduces it). Grads: the weights' are
their local shards' (Shard placements, as given); x's and topk_weights' are all-reduced by DTensor's
autograd (they are partial sums over the ranks' slices).

Numerics: the MX blocks of both GEMMs lie in one rank's slice when I/tp is a multiple of 128 (tile128)
or 32 (exact recipes): then every FP8 operand is the single-process one, and only the final sum of
the tp partial outputs (each rounded to x's dtype) differs in rounding.

No rule can exist, and a ValueError says so, for: a concatenated [gate | up] w13 sharded along dim 1
(Shard(1) gives one rank gate rows and another the matching up rows: pass the halves as a pair),
w13 or w2 sharded along H (the SwiGLU would need the full pre-activation), weights sharded along the
experts (that is expert parallelism: tokens must move; mxmoe.distributed.ep_moe_experts), meshes of
more than one dim (flatten TP to its own 1-D mesh), or sharded tokens (x must be replicated).
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from ..moe import is_dtensor, moe_experts, register_dtensor_rule


def _place(t) -> str:
    return "a plain tensor" if not is_dtensor(t) else f"a DTensor with placements {tuple(t.placements)}"


def moe_experts_tensor_parallel(x, topk_idx, topk_weights, w13, w2, *, bias13: Optional[Tensor] = None,
                                bias2: Optional[Tensor] = None, layout: str = "concatenated", **kwargs):
    """mxmoe.moe_experts on DTensor expert weights (the rule in the module docstring). kwargs: the
    remaining moe_experts arguments. Returns a DTensor with Partial() placement."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    pair = isinstance(w13, (tuple, list))
    w13s = tuple(w13) if pair else (w13,)
    named = [(f"w13[{i}]" if pair else "w13", t) for i, t in enumerate(w13s)] + [("w2", w2)]
    named += [(n, t) for n, t in (("bias13", bias13), ("bias2", bias2)) if t is not None]
    mesh = next(t.device_mesh for _, t in named if is_dtensor(t))
    if mesh.ndim != 1:
        raise ValueError(f"w13: expected DTensor weights on a 1-D tensor-parallel mesh, got a {mesh.ndim}-D mesh "
                         f"{mesh}; give the experts their own 1-D TP mesh")
    want = {"w2": Shard(2), "bias13": Shard(1), "bias2": Replicate()}
    for name, t in named:
        if not is_dtensor(t) or t.device_mesh != mesh:
            raise ValueError(f"{name}: expected a DTensor on the weights' mesh {mesh}, got {_place(t)}")
        expect = want.get(name, Shard(1))
        if tuple(t.placements) != (expect,):
            if tuple(t.placements) == (Shard(0),):
                raise ValueError(f"{name}: sharded over the experts (Shard(0)) is expert parallelism, which moves "
                                 "tokens between ranks: use mxmoe.distributed.ep_moe_experts / EPMoEExperts")
            raise ValueError(f"{name}: expected placements ({expect!r},) (tensor parallel along the expert hidden dim), "
                             f"got {tuple(t.placements)}")
    tp = mesh.size()
    if not pair and layout == "concatenated" and tp > 1:
        raise ValueError("w13: a Shard(1) of the concatenated [gate | up] weight gives one rank gate rows and another "
                         "the matching up rows; pass the halves as a (gate, up) pair of Shard(1) DTensors "
                         "(TorchTitan's w1, w3) or use the interleaved layout")
    for name, t in (("x", x), ("topk_idx", topk_idx), ("topk_weights", topk_weights)):
        if is_dtensor(t) and tuple(t.placements) != (Replicate(),):
            raise ValueError(f"{name}: expected replicated tokens under tensor parallelism, got {_place(t)}")

    def replicated(t):
        # Local view of a replicated input whose grad is a partial sum over the ranks' slices: DTensor's
        # autograd all-reduces it on the way back.
        if t is None or not t.dtype.is_floating_point:
            return t.to_local() if is_dtensor(t) else t
        d = t if is_dtensor(t) else DTensor.from_local(t, mesh, [Replicate()], run_check=False)
        return d.to_local(grad_placements=[Partial()])

    loc = [t.to_local() for t in w13s]
    b2 = None
    if bias2 is not None:  # added once: on mesh rank 0's partial (a 0 factor elsewhere keeps the grads in step)
        b2 = replicated(bias2) * (1.0 if mesh.get_local_rank() == 0 else 0.0)
    idx = topk_idx.to_local() if is_dtensor(topk_idx) else topk_idx
    out = moe_experts(replicated(x), idx, replicated(topk_weights), tuple(loc) if pair else loc[0], w2.to_local(),
                      bias13=None if bias13 is None else bias13.to_local(), bias2=b2, layout=layout, **kwargs)
    return DTensor.from_local(out, mesh, [Partial()], run_check=False)


register_dtensor_rule(moe_experts_tensor_parallel)  # the layer's rule for DTensor weights
