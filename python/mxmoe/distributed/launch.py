"""The demo's distributed training (``torchrun --nproc-per-node N -m mxmoe train --fsdp | --ep``).

One process per rank (gloo on the CPU, NCCL on GPUs, rank r on cuda:LOCAL_RANK); every rank trains on
its slice of each global batch, so the run sees the same data as the single process.
  --fsdp  FSDP2 (fully_shard per transformer block and the root); in the MXFP8 run the tile128 expert
          weights are all-gathered as FP8 codes + E8M0 tile scales (enable_mx_all_gather).
  --ep    expert parallel over all ranks: rank r keeps experts [r*E/N, (r+1)*E/N) and the MoE layers
          dispatch FP8 tokens (ep_moe_experts; the bf16 run dispatches bf16); the other parameters
          are data parallel through FSDP2 (the expert weights are left out of it).
"""
from __future__ import annotations

import datetime
import os
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn


def world_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init(device_type: str) -> torch.device:
    """Join the torchrun job (env://); returns this rank's device."""
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=600))
    if device_type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def finish() -> None:
    """Leave the job: every rank waits for the others, then the process group is destroyed, so its
    background threads stop before the interpreter exits (a rank that exited with a live gloo group
    was seen to abort at exit: "terminate called without an active exception", SIGABRT, after a
    successful run)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def backend() -> str:
    return dist.get_backend() if dist.is_initialized() else "none"


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _blocks(model: nn.Module):
    """The transformer blocks (each its own FSDP2 unit): the demo's model.layers, or a transformers
    CausalLM's model.model.layers (also inside the demo's HFQwen3MoE wrapper, .hf)."""
    for m in (model, getattr(model, "model", None), getattr(getattr(model, "hf", None), "model", None)):
        layers = getattr(m, "layers", None) if m is not None else None
        if layers is not None:
            return list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers)
    raise SystemExit(f"--fsdp: no transformer blocks found in {type(model).__name__} (expected .layers or "
                     ".model.layers)")


def _ep_experts_fn(recipe: Optional[str], num_experts: int):
    from .expert_parallel import ep_moe_experts

    def run(x, topk_idx, topk_weights, experts):  # this rank's experts: the DTensors' local shards
        w13 = torch.cat([experts.w1.to_local(), experts.w3.to_local()], dim=1)
        return ep_moe_experts(x, topk_idx, topk_weights, w13, experts.w2.to_local(), num_experts=num_experts,
                              recipe=recipe)

    return run


def shard(model: nn.Module, *, ep: bool, recipe: Optional[str]) -> dict:
    """Make the model distributed: FSDP2 (--fsdp) or EP + FSDP2 for the rest (--ep; see the module
    docstring). recipe: the run's MXFP8 recipe or None (bf16). Returns enable_mx_all_gather's decisions
    ({} when it does not apply: EP, or the bf16 run)."""
    from torch.distributed.fsdp import fully_shard

    from .fsdp import enable_mx_all_gather

    n, r = world(), rank()
    decisions, ignored = {}, set()
    if ep:
        if not hasattr(model, "moe_layers"):
            raise SystemExit("--ep: the expert-parallel launch runs the demo model (--model demo)")
        E = model.moe_layers()[0].experts.w1.shape[0]
        if E % n:
            raise SystemExit(f"--ep: --experts ({E}) must be a multiple of the world size ({n})")
        lo, hi = r * E // n, (r + 1) * E // n
        from .expert_parallel import expert_mesh, shard_over_experts

        mesh = expert_mesh(None, next(model.parameters()).device.type)
        for moe in model.moe_layers():
            # This rank's experts, held as the global DTensor sharded over the experts: DCP checkpoints
            # keep every rank's experts and optimizer states (and load on another rank count).
            for name in ("w1", "w2", "w3"):
                p = getattr(moe.experts, name)
                setattr(moe.experts, name, shard_over_experts(p.detach()[lo:hi].clone(), mesh))
            moe.experts_fn = _ep_experts_fn(recipe, E)
        ignored = {p for moe in model.moe_layers() for p in moe.experts.parameters()}
        # The EP backward sums every rank's tokens into its experts' grads; FSDP2 averages the other
        # grads over the ranks: scale the experts' by 1/n for the same objective (the mean of the ranks' losses).
        def average(t):
            t.grad.div_(n)

        for p in ignored:
            p.register_post_accumulate_grad_hook(average)
    elif recipe is not None:
        decisions = enable_mx_all_gather(model, world_size=n)
    for block in _blocks(model):
        fully_shard(block, ignored_params=ignored or None)
    fully_shard(model, ignored_params=ignored or None)
    return decisions


def clip_grad_norm_(params, max_norm: float) -> torch.Tensor:
    """Global grad-norm clipping over FSDP2's and EP's grads, DTensors sharded on meshes of their own
    (torch's clip_grad_norm_ would combine norms across meshes): each rank's squares of its local
    shards, summed over the ranks (every element lives on exactly one rank)."""
    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    dev = local[0].device
    sq = torch.stack([t.float().square().sum() for t in local]).sum() if local else torch.zeros((), device=dev)
    dist.all_reduce(sq)
    norm = sq.sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for t in local:
        t.mul_(scale.to(t.dtype))
    return norm


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t)
    return t / world()


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    return t
