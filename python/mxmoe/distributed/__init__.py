"""mxmoe on torch.distributed (docs/design/distributed.md): no runtime of its own.

  fsdp.py             FSDP2's all-gather of expert weights as tile128 FP8 codes + E8M0 tile scales
                      (enable_mx_all_gather before fully_shard)
  expert_parallel.py  the expert-parallel layer: experts sharded over a process group, tokens
                      dispatched as FP8 + scales, combined in bf16 (ep_moe_experts, EPMoEExperts)
  tensor_parallel.py  expert weights as DTensors sharded along their hidden dim (TP)
"""
from .expert_parallel import EPMoEExperts, dispatch_stats, ep_moe_experts
from .fsdp import MXGatheredWeight, MXShardWeight, disable_mx_all_gather, enable_mx_all_gather

__all__ = ["enable_mx_all_gather", "disable_mx_all_gather", "MXShardWeight", "MXGatheredWeight", "ep_moe_experts",
           "EPMoEExperts", "dispatch_stats"]
