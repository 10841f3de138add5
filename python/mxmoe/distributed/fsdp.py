"""FSDP2 with the MX all-gather of expert weights: FP8 codes + E8M0 tile scales on the wire.

    mxmoe.distributed.enable_mx_all_gather(model)   # before fully_shard
    for layer in model.layers: fully_shard(layer)
    fully_shard(model)

Without it FSDP2 all-gathers each expert weight in its parameter dtype, and every rank then
quantizes the whole gathered weight again for the forward and once more for the backward. With it,
an expert weight whose module runs the tile128 recipe becomes an ``MXShardWeight`` (a tensor
subclass around the same data: state_dict, optimizers and DCP see the same values and keys) with
FSDP2's all-gather extension hooks:
  fsdp_pre_all_gather   the local shard's 128x128 tiles (its FP8 codes along K and one E8M0 scale per
                        tile), computed once per optimizer step (mxmoe/weight_cache.py), are the
                        all-gather inputs: N*K bytes + N*K/16384 per expert, about 0.50x bf16's 2*N*K;
  fsdp_post_all_gather  the gathered codes and tile scales become an ``MXGatheredWeight``, the
                        unsharded parameter FSDP2 hands the module: it carries exactly the forms
                        ``ops.sm90_tile128_weight`` computes from the whole weight (codes along K, their
                        transpose along N, scales of both), which the fused layer and the sm90 grouped_mm
                        backend read through the weight cache without quantizing anything. A 128x128 tile
                        has one scale, so the transpose of its codes is the tile of the transposed
                        weight: the codes gathered for the forward also serve the dgrad GEMM.
Numerics: identical to the single-process tile128 layer. FSDP2 shards an (E, N, K) expert weight
along the experts (dim 0), so every tile lies inside one rank's shard and the local quantization is
the whole weight's. Gradients are unchanged: they stay in the parameter dtype and FSDP2
reduce-scatters them as usual.

Which weights take the MX all-gather (``enable_mx_all_gather`` returns the decision per parameter):
  * mxmoe.nn.MoEExperts (w13, w2), transformers experts on experts_implementation="mxmoe" or converted
    (gate_up_proj, down_proj), TorchTitan / the demo model converted (w1, w2, w3), when the module's
    recipe is mxfp8_rceil_tile128;
  * not the exact recipes (mxfp8_rceil / mxfp8_floor): they quantize W in 1x32 blocks along K for the
    forward and along N for the dgrad, independently, so neither form can be made from the other and
    gathering both would cost more than bf16; those weights keep FSDP2's bf16 all-gather;
  * not when the experts do not split evenly over the FSDP ranks (E % world_size != 0): FSDP2 then
    pads the last shard, and its extension contract needs all-gather inputs of the padded bf16 shape;
    such a weight keeps the bf16 all-gather (the decision says so);
  * not TorchTitan's separate w1 / w3 when their I is not a multiple of 128: the layer joins them
    into one (E, 2I, H) weight, whose tiles would straddle the two;
  * not gpt-oss's transposed experts (the layer reads views of them, which run on the dequantized data).
The gathered weight is read-only and holds tile128 forms only: any other op on it (a view, a print, a
recipe switched to an exact one afterwards) sees its dequantized values, and an exact recipe's weight
pass raises ValueError rather than compute on them.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_map_only

from .. import ops, weight_cache
from ..moe import is_dtensor
from ..recipes import get_recipe

E4M3, E8M0, U8 = torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.uint8
TILE = 128
SCALE_BLOCK = 32  # sm90_tile128_weight's scales: one per 32 columns, repeated over the tile
TILE128 = "mxfp8_rceil_tile128"
_aten = torch.ops.aten
_FORM = "sm90_tile128"  # the weight cache's form of ops.sm90_tile128_weight (mxmoe/backends/phases.py, backends/sm90.py)

__all__ = ["MXShardWeight", "MXGatheredWeight", "enable_mx_all_gather", "disable_mx_all_gather", "TILE128"]


# ---- the tile forms ---------------------------------------------------------------------------------


def _tile_codes(w: Tensor, mode: int):
    """The all-gather inputs of a local (E, N, K) shard: FP8 codes along K as bytes (E, N, K) and one E8M0
    scale byte per 128x128 tile (E, ceil(N/128), ceil(K/128))."""
    q, s, _, _ = ops.sm90_tile128_weight(w.contiguous(), mode)
    grid = s.view(U8)[:, ::TILE, ::TILE // SCALE_BLOCK].contiguous()
    return q.view(U8), grid


def _expand(grid: Tensor, rows: int, cols: int) -> Tensor:
    """Tile scales (E, ceil(rows/128), ceil(cols/128)) -> per-row scales every 32 columns (E, rows, cols/32)."""
    per = TILE // SCALE_BLOCK
    E, nr, nc = grid.shape
    full = grid[:, :, None, :, None].expand(E, nr, TILE, nc, per).reshape(E, nr * TILE, nc * per)
    return full[:, :rows, :cols // SCALE_BLOCK]


def _dequantize(q: Tensor, s: Tensor, dtype) -> Tensor:
    return (q.float() * s.float().repeat_interleave(SCALE_BLOCK, dim=-1)).to(dtype)


# ---- the sharded parameter: the local data with the all-gather hooks --------------------------------

# Ops FSDP2 applies while sharding a parameter (chunking, padding, copying into its flat buffer) that
# must keep the subclass, so that the sharded local tensor still carries the hooks. Every other op
# runs on the plain data and returns plain tensors (optimizer states, grads, state_dict values).
_KEEP = {
    _aten.detach.default, _aten.alias.default, _aten.view.default, _aten.as_strided.default, _aten.slice.Tensor,
    _aten.split.Tensor, _aten.split_with_sizes.default, _aten.new_zeros.default, _aten.new_empty.default,
    _aten.empty_like.default, _aten.clone.default, _aten._to_copy.default, _aten._pin_memory.default,
}


class MXShardWeight(Tensor):
    """An expert weight (or FSDP2's local shard of it) whose all-gather carries tile128 FP8 codes and
    E8M0 tile scales. Holds the plain data (``._data``) and computes like it."""

    @staticmethod
    def __new__(cls, data: Tensor, mode: int):
        return Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(),
                                             storage_offset=data.storage_offset(), dtype=data.dtype,
                                             device=data.device, requires_grad=data.requires_grad)

    def __init__(self, data: Tensor, mode: int):
        self._data = data
        self._mode = mode

    def __repr__(self):
        return f"MXShardWeight(mode={self._mode}, {self._data!r})"

    def __tensor_flatten__(self):
        return ["_data"], self._mode

    @staticmethod
    def __tensor_unflatten__(inner, mode, outer_size, outer_stride):
        return MXShardWeight(inner["_data"], mode)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        unwrap = lambda t: t._data  # noqa: E731
        out = func(*tree_map_only(cls, unwrap, args), **tree_map_only(cls, unwrap, kwargs))
        if func._schema.is_mutable and args and isinstance(args[0], cls):
            return args[0]  # in place (optimizer updates, copy_): the data changed, the wrapper is the same
        if func in _KEEP:
            mode = next(t._mode for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, cls))
            return tree_map_only(Tensor, lambda t: cls(t, mode), out)
        return out

    # FSDP2's all-gather extension (torch.distributed.fsdp, fully_shard)
    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        codes, grid = weight_cache.quantized(self._data, ("fsdp_tile128_shard", self._mode),
                                             lambda w: _tile_codes(w, self._mode))
        # The grid rides in the metadata too: at world size 1 FSDP2 (torch 2.11) copies only the first
        # all-gather input to its output and drops the others; the local grid is then the whole one.
        return (codes, grid), (self._mode, tuple(outer_size), grid)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        mode, size, local_grid = metadata
        codes = all_gather_outputs[0]
        grid = all_gather_outputs[1] if len(all_gather_outputs) > 1 else None
        if out is not None:
            # FSDP2 refilled the same buffers (the views out holds): rebuild the derived forms in place.
            if grid is None:
                with torch.autograd._unsafe_preserve_version_counter(out._grid):
                    out._grid.copy_(local_grid)
            out._refill()
            return None
        if grid is None:
            grid = local_grid.clone()
        w = MXGatheredWeight(codes.view(E4M3).view(size), grid.view(size[0], *grid.shape[1:]), mode, param_dtype)
        return w, w._derived()


# ---- the unsharded parameter: the gathered forms ----------------------------------------------------


class MXGatheredWeight(Tensor):
    """The all-gathered expert weight (E, N, K): ``ops.sm90_tile128_weight``'s four forms, no bf16 data.
    Read-only. The mxmoe backends take its forms from the weight cache; any other op sees the dequantized
    weight (the values the tile128 GEMMs compute with)."""

    @staticmethod
    def __new__(cls, q, grid, mode, dtype, derived=None):
        return Tensor._make_wrapper_subclass(cls, q.shape, dtype=dtype, device=q.device)

    def __init__(self, q: Tensor, grid: Tensor, mode: int, dtype, derived=None):
        self._q, self._grid, self._mode = q, grid, mode
        E, N, K = q.shape
        if derived is None:
            s = _expand(grid, N, K).contiguous().view(E8M0)
            st = _expand(grid.transpose(1, 2), K, N).contiguous().view(E8M0)
            derived = (s, q.view(U8).transpose(1, 2).contiguous().view(E4M3), st)
        self._s, self._qt, self._st = derived

    def _derived(self):
        return self._s, self._qt, self._st

    def _refill(self):
        # Autograd saved these forms in the forward; the backward's re-gather (reshard_after_forward)
        # refills them with the same values, so their version must not move (as FSDP2's own copy-out).
        E, N, K = self._q.shape
        for dst, src in ((self._s, _expand(self._grid, N, K)), (self._qt, self._q.view(U8).transpose(1, 2)),
                         (self._st, _expand(self._grid.transpose(1, 2), K, N))):
            with torch.autograd._unsafe_preserve_version_counter(dst):
                dst.view(U8).copy_(src)

    def _alias(self):
        return MXGatheredWeight(self._q, self._grid, self._mode, self.dtype, self._derived())

    def mxmoe_forms(self, form: tuple):
        """The weight cache's forms for ``form`` (see weight_cache.quantized)."""
        if form == (_FORM, self._mode):
            return self._q, self._s, self._qt, self._st
        raise ValueError(f"mxmoe: this expert weight was all-gathered as tile128 FP8 (mode {self._mode}); the layer "
                         f"asks for its {form} form, which needs the weight itself: call "
                         "mxmoe.distributed.enable_mx_all_gather only for modules that run mxfp8_rceil_tile128")

    def dequantize(self) -> Tensor:
        return _dequantize(self._q, self._s, self.dtype)

    def __repr__(self):
        return f"MXGatheredWeight(shape={tuple(self.shape)}, dtype={self.dtype}, mode={self._mode})"

    def __tensor_flatten__(self):
        return ["_q", "_grid", "_s", "_qt", "_st"], (self._mode, self.dtype)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        mode, dtype = meta
        return MXGatheredWeight(inner["_q"], inner["_grid"], mode, dtype, (inner["_s"], inner["_qt"], inner["_st"]))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        this = args[0] if args and isinstance(args[0], cls) else None
        if this is not None:
            if func in (_aten.detach.default, _aten.alias.default):
                return this._alias()
            if func in (_aten.as_strided.default, _aten.view.default) and tuple(args[1]) == tuple(this.shape):
                return this._alias()  # FSDP2's as_strided of the unsharded tensor to its own size
            if func._schema.is_mutable:
                raise RuntimeError(f"mxmoe: {func} writes to an all-gathered MX expert weight, which is read-only "
                                   "(FSDP2's unsharded view of the sharded parameter)")
        deq = lambda t: t.dequantize()  # noqa: E731
        return func(*tree_map_only(cls, deq, args), **tree_map_only(cls, deq, kwargs))


# ---- choosing the weights ---------------------------------------------------------------------------


def _expert_weights(model: nn.Module):
    """(fqn prefix, module, {attr: weight}, recipe, pair) for every module whose experts run on mxmoe;
    pair: the names of a (gate, up) pair joined for the GEMM, else ()."""
    from ..conversion import conversion_mechanism, conversion_recipe
    from ..integrations import torchtitan as tt
    from ..integrations import transformers as hf
    from ..nn import MoEExperts

    for fqn, m in model.named_modules():
        if isinstance(m, MoEExperts):
            yield fqn, m, {"w13": m.w13, "w2": m.w2}, m.recipe, ()
        elif hf.is_transformers_experts(m) and (conversion_mechanism(m) == "transformers" or getattr(
                getattr(m, "config", None), "_experts_implementation", None) == "mxmoe"):
            if getattr(m, "is_transposed", False):
                yield fqn, m, {}, "transposed experts (gpt-oss): the layer reads views of them", ()
                continue
            yield fqn, m, {"gate_up_proj": m.gate_up_proj, "down_proj": m.down_proj}, hf.module_recipe(m), ()
        elif conversion_mechanism(m) in ("demo", "torchtitan", "seam"):  # the record sits on the experts module
            spec = tt.experts_spec(m)
            weights = {n: w for n, w in spec.weights(m).items() if w.dim() == 3}  # biases keep their dtype
            yield fqn, m, weights, conversion_recipe(m), spec.pair


def _plain(v):
    if isinstance(v, MXShardWeight):
        return v._data
    local = getattr(v, "_local_tensor", None)
    if isinstance(local, MXShardWeight):  # FSDP2's DTensor parameter
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local._data, v.device_mesh, v.placements, run_check=False, shape=v.shape,
                                  stride=v.stride())
    return v


def _plain_state_dict(module, state_dict, prefix, local_metadata):
    """state_dict hook: plain tensors (sharing the parameters' storage) instead of MXShardWeight, so that
    checkpoints (torch.save, DCP) hold the same tensors as without the MX all-gather."""
    for k in list(state_dict):
        state_dict[k] = _plain(state_dict[k])


def enable_mx_all_gather(model: nn.Module, *, world_size: Optional[int] = None) -> Dict[str, str]:
    """Turn the expert weights of ``model`` whose modules run the tile128 recipe into MXShardWeight
    parameters, so that FSDP2 all-gathers them as FP8 codes + E8M0 tile scales. Call it before
    ``fully_shard``. world_size: the FSDP2 shard group's size (default: the default process group's).
    Returns {parameter fqn: "mx"} for the converted weights and {fqn: reason} for the expert weights
    that keep FSDP2's all-gather in their dtype. Values, state_dict keys and requires_grad are kept."""
    if world_size is None:
        import torch.distributed as dist

        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected a positive int, got {world_size!r}")
    decisions: Dict[str, str] = {}
    for prefix, module, weights, recipe, pair in _expert_weights(model):
        for name, w in weights.items():
            fqn = f"{prefix}.{name}" if prefix else name
            reason = None
            if recipe is None or not isinstance(recipe, str) or get_recipe(recipe).name != TILE128:
                reason = f"recipe {recipe!r}: only {TILE128} weights are all-gathered as MX tiles"
            elif isinstance(w, MXShardWeight):
                reason = "mx"
            elif is_dtensor(w):
                reason = "already a DTensor (call enable_mx_all_gather before fully_shard)"
            elif w.dim() != 3 or w.shape[1] % 32 or w.shape[2] % 32:
                reason = f"shape {tuple(w.shape)}: expected (E, N, K) with N and K multiples of 32"
            elif w.shape[0] % world_size:
                reason = (f"{w.shape[0]} experts do not split evenly over {world_size} ranks (FSDP2 would pad the "
                          "last shard)")
            elif name in pair and w.shape[1] % TILE:
                reason = f"{'/'.join(pair)} with I={w.shape[1]} (not a multiple of 128) are joined across a tile boundary"
            if reason is None:
                p = nn.Parameter(MXShardWeight(w.detach(), get_recipe(recipe).mode), requires_grad=w.requires_grad)
                setattr(module, name, p)
                if not module.__dict__.get("_mxmoe_plain_state_dict"):
                    module._register_state_dict_hook(_plain_state_dict)
                    module._mxmoe_plain_state_dict = True
                reason = "mx"
            decisions[fqn] = reason
    return decisions


def disable_mx_all_gather(model: nn.Module) -> int:
    """Undo enable_mx_all_gather on a model not yet sharded: plain parameters again. Returns the count."""
    n = 0
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if isinstance(p, MXShardWeight):
                setattr(module, name, nn.Parameter(p._data, requires_grad=p.requires_grad))
                n += 1
    return n
