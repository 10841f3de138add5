"""A small MoE decoder-only language model, written the way TorchTitan writes its MoE models.

Nothing here knows about MXFP8 or precision: the experts call `torch._grouped_mm` on their 3D weights,
so `mxmoe.convert(model, recipe=...)` can take those GEMMs over without edits, and the trainer decides
which dtype the GEMMs run in. The forward pass has no host syncs (`offs` stays on the device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class MoEModelArgs:
    vocab_size: int = 138
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    max_seq_len: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # MoE FFN in every block.
    num_experts: int = 8
    top_k: int = 2
    moe_hidden: int = 256
    route_norm: bool = True  # renormalize the top-k weights to sum to 1 (Mixtral style)
    # Auxiliary-loss-free load balancing (DeepSeek-V3, as in TorchTitan): a per-expert bias added to the
    # scores for expert *selection* only, nudged after each step toward equal load. 0 turns it off.
    load_balance_coeff: float = 1e-3


def _rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (bs, seqlen, heads, head_dim); rotate interleaved pairs.
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, args: MoEModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def init_weights(self, init_std: float) -> None:
        for lin in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        q = self.wq(x).view(bs, seqlen, self.n_heads, self.head_dim)
        k = self.wk(x).view(bs, seqlen, self.n_heads, self.head_dim)
        v = self.wv(x).view(bs, seqlen, self.n_heads, self.head_dim)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


class GroupedExperts(nn.Module):
    """All experts' SwiGLU FFNs as three 3D weights, run as grouped GEMMs over expert-sorted tokens."""

    def __init__(self, dim: int, hidden: int, num_experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, dim))

    def init_weights(self, init_std: float) -> None:
        nn.init.trunc_normal_(self.w1, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.w2, mean=0.0, std=init_std)
        nn.init.trunc_normal_(self.w3, mean=0.0, std=init_std)

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        # x: (tokens, dim) sorted by expert; offs: int32 (num_experts,) cumulative end row of each
        # expert's group, on x's device.
        h = F.silu(torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(x, self.w3.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, self.w2.transpose(-2, -1), offs=offs)


class TokenChoiceTopKRouter(nn.Module):
    def __init__(self, dim: int, num_experts: int, top_k: int, route_norm: bool):
        super().__init__()
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.num_experts = num_experts
        self.top_k = top_k
        self.route_norm = route_norm

    def init_weights(self, init_std: float) -> None:
        nn.init.trunc_normal_(self.gate.weight, mean=0.0, std=init_std)

    def forward(self, x: torch.Tensor, expert_bias: torch.Tensor | None):
        """x: (tokens, dim) -> top-k weights (tokens, k) fp32, expert ids (tokens, k), counts (E,)."""
        scores = F.softmax(self.gate(x).float(), dim=-1)
        if expert_bias is not None:
            # The bias steers which experts are picked, not how much their outputs weigh.
            _, selected = torch.topk(scores + expert_bias, k=self.top_k, dim=-1)
            top_scores = scores.gather(-1, selected)
        else:
            top_scores, selected = torch.topk(scores, k=self.top_k, dim=-1)
        if self.route_norm:
            top_scores = top_scores / (top_scores.sum(dim=-1, keepdim=True) + 1e-20)
        # Counting with scatter_add keeps the output size static (bincount would sync with the host).
        flat = selected.flatten()
        counts = torch.zeros(self.num_experts, dtype=torch.int64, device=x.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))
        return top_scores, selected, counts


class MoE(nn.Module):
    def __init__(self, args: MoEModelArgs):
        super().__init__()
        self.num_experts = args.num_experts
        self.top_k = args.top_k
        self.router = TokenChoiceTopKRouter(args.dim, args.num_experts, args.top_k, args.route_norm)
        self.experts = GroupedExperts(args.dim, args.moe_hidden, args.num_experts)
        # Optional fused expert layer (e.g. mxmoe.moe_experts): (x, topk_idx, topk_weights, experts) ->
        # the combined (tokens, dim) output, replacing the permute / grouped GEMMs / combine below.
        self.experts_fn = None
        self.load_balance_coeff = args.load_balance_coeff
        if args.load_balance_coeff > 0:
            self.register_buffer("expert_bias", torch.zeros(args.num_experts), persistent=True)
        else:
            self.expert_bias = None
        # Tokens routed to each expert since the last bias update (also handy for load statistics).
        self.register_buffer(
            "tokens_per_expert", torch.zeros(args.num_experts, dtype=torch.float32), persistent=False
        )

    def init_weights(self, init_std: float) -> None:
        self.router.init_weights(init_std)
        self.experts.init_weights(init_std)
        if self.expert_bias is not None:
            self.expert_bias.zero_()
        self.tokens_per_expert.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seqlen, dim = x.shape
        x = x.reshape(-1, dim)
        top_scores, selected, counts = self.router(x, self.expert_bias)
        if self.training:
            self.tokens_per_expert.add_(counts)
        if self.experts_fn is not None:
            return self.experts_fn(x, selected, top_scores, self.experts).to(x.dtype).view(bs, seqlen, dim)

        # Permute: sort the (token, slot) pairs by expert; a stable sort keeps token order inside each
        # expert's group. offs = cumulative counts, int32, computed on the device.
        order = torch.argsort(selected.flatten(), stable=True)
        token_idx = order // self.top_k
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        routed_out = self.experts(x[token_idx], offs)

        # Weight by the router score and scatter back to token order (sums each token's k experts).
        routed_out = routed_out.float() * top_scores.flatten()[order, None]
        out = torch.zeros_like(x).index_add(0, token_idx, routed_out.to(x.dtype))
        return out.view(bs, seqlen, dim)

    @torch.no_grad()
    def update_expert_bias(self) -> None:
        """After an optimizer step: raise the bias of under-loaded experts, lower over-loaded ones."""
        tpe = self.tokens_per_expert
        if self.expert_bias is not None:
            delta = self.load_balance_coeff * torch.sign(tpe.mean() - tpe)
            self.expert_bias.add_(delta - delta.mean())
        tpe.zero_()


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: MoEModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.moe = MoE(args)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        # Depth-scaled init of the output projections (TorchTitan's depth_init).
        self.init_std = 0.02 / math.sqrt(2 * (layer_id + 1))

    def init_weights(self) -> None:
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(self.init_std)
        self.moe.init_weights(self.init_std)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.moe(self.ffn_norm(h))


class MoETransformer(nn.Module):
    def __init__(self, args: MoEModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(i, args) for i in range(args.n_layers))
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        cos, sin = _rope_tables(args.dim // args.n_heads, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers:
            layer.init_weights()
        self.norm.reset_parameters()
        final_std = self.args.dim**-0.5
        nn.init.trunc_normal_(self.output.weight, 0.0, final_std, -3 * final_std, 3 * final_std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (bs, seqlen) int64 -> logits (bs, seqlen, vocab) fp32."""
        seqlen = tokens.shape[1]
        cos, sin = self.rope_cos[:seqlen], self.rope_sin[:seqlen]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h)).float()

    def moe_layers(self) -> list[MoE]:
        return [layer.moe for layer in self.layers]

    @torch.no_grad()
    def update_expert_bias(self) -> None:
        for moe in self.moe_layers():
            moe.update_expert_bias()
