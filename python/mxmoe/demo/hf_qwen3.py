"""The training demo's second model: a transformers Qwen3-MoE (Qwen3MoeForCausalLM) built from a config
with random init (no downloads), behind the small interface train.py drives (forward(tokens) ->
logits, moe_layers() with tokens_per_expert counters, update_expert_bias(), aux_loss()).

The experts run as transformers ships them (`experts_implementation="grouped_mm"`: bf16
torch._grouped_mm) or as mxmoe (`experts_implementation="mxmoe"`, the recipe in the config's
`mxmoe_recipe`): the one documented line, nothing else differs. Load balancing is Qwen3-MoE's own
router aux loss (router_aux_loss_coef, on the router logits the model returns).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class _LoadCounter:
    """tokens_per_expert of one sparse MoE block, counted from its router's top-k ids (a forward hook)."""

    def __init__(self, router: nn.Module, num_experts: int, device):
        self.tokens_per_expert = torch.zeros(num_experts, device=device)
        self.handle = router.register_forward_hook(self._hook)

    def _hook(self, module, args, out):
        ids = out[-1]  # Qwen3MoeTopKRouter: (router_logits, router_scores, router_indices)
        if module.training:
            flat = ids.reshape(-1)
            self.tokens_per_expert.scatter_add_(0, flat, torch.ones_like(flat, dtype=self.tokens_per_expert.dtype))


def qwen3_moe_config(*, vocab_size: int, dim: int, n_layers: int, n_heads: int, num_experts: int, top_k: int,
                     moe_hidden: int, max_seq_len: int, kv_heads: Optional[int] = None,
                     experts_implementation: str = "grouped_mm", mxmoe_recipe: Optional[str] = None,
                     head_dim: Optional[int] = None):
    """head_dim: None for dim // n_heads (Qwen3-30B-A3B: 32 heads of 128 at hidden 2048)."""
    from transformers import Qwen3MoeConfig

    kw = {} if mxmoe_recipe is None else {"mxmoe_recipe": mxmoe_recipe}
    return Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=dim, intermediate_size=4 * dim, moe_intermediate_size=moe_hidden,
        num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=kv_heads or max(1, n_heads // 4),
        head_dim=head_dim or dim // n_heads, num_experts=num_experts, num_experts_per_tok=top_k, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=max_seq_len, tie_word_embeddings=False,
        output_router_logits=True, router_aux_loss_coef=0.001, use_cache=False, bos_token_id=0, eos_token_id=None,
        pad_token_id=None, experts_implementation=experts_implementation, **kw)


class HFQwen3MoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        from transformers import Qwen3MoeForCausalLM

        self.hf = Qwen3MoeForCausalLM(config)
        self._aux = None
        self._counters = []

    def start_load_counters(self) -> None:
        """Count routed tokens per expert (after the model is on its device)."""
        dev = next(self.parameters()).device
        for layer in self.hf.model.layers:
            gate = layer.mlp.gate
            self._counters.append(_LoadCounter(gate, gate.num_experts, dev))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.hf(input_ids=tokens, use_cache=False)
        self._aux = out.aux_loss
        return out.logits

    def aux_loss(self) -> torch.Tensor:
        """router_aux_loss_coef * the load-balancing loss of the last forward (0 in eval)."""
        if self._aux is None or not self.training:
            return torch.zeros((), device=next(self.parameters()).device)
        return self.hf.router_aux_loss_coef * self._aux

    def moe_layers(self):
        return self._counters

    def update_expert_bias(self) -> None:  # Qwen3-MoE balances with its aux loss; only reset the counts
        for c in self._counters:
            c.tokens_per_expert.zero_()
