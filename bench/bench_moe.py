#!/usr/bin/env python3
"""MoE expert layer forward+backward: SonicMoE and transformers' bf16 grouped_mm experts vs mxmoe.moe_experts
(BENCH.md).

For each BENCH.md "MoE layer configs" row (16384 tokens; Qwen3-30B-A3B also at 4096) one step is
    out = experts(x, topk_idx, topk_weights, w13, w2[, bias13, bias2]); out.backward(dY)
with grads for x, topk_weights, w13, w2 (and the biases where the model has them), for the impls
  sonic_bf16         SonicMoE (sonic-moe 0.1.2.post1, bf16, Hopper; BENCH.md's peer for MoE layers), its
                     functional layer on the same weights without copies:
                       sonicmoe.moe_TC_softmax_topk_layer(x, R.t(), w13.permute(1, 2, 0), None,
                           w2.permute(1, 2, 0), None, k, stream, ActivationType.SWIGLU, False,
                           is_softmax_over_topk=False, norm_topk_probs=True, concat_layout=True)
                     It routes by itself (router logits x @ R, softmax, top-k, renormalize: the routing
                     below, from the same R and x; the row's "sonic_check" has its logits and per-expert
                     load against it, and its output against transformers'), so its timed step also
                     holds the router GEMM (T x H x E), its top-k softmax and their backward (dlogits @ R
                     into dx): about 0.5% of the layer's FLOPs for Qwen3-30B-A3B. Grads: x, w13, w2
                     (the routing scores' grad goes into dx through its router, not to a topk_weights
                     leaf; R gets none: it does not require grad, SonicMoE does not need it to).
                     QuACK's GEMMs with their default configs (tuned=False; --moe-sonic-tuned: autotuned,
                     minutes per config; the JSON's "sonic" says which). The first call JIT-compiles
                     (6-65 s a config): it is the untimed check step, its seconds in first_call_s. Not
                     for gpt-oss (its clamped SwiGLU is not among SonicMoE's activations): those rows
                     say "skipped: ...". Where sonic-moe does not import (or on CPU) its rows carry
                     the error "sonic-moe not importable (...)" and the run goes on.
  transformers_bf16  transformers' `grouped_mm` experts forward (transformers.integrations.moe.
                     grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights), called
                     on a stand-in `self` holding the weights); where transformers does not import, the
                     same op sequence in plain torch (the JSON's "transformers" field says which ran)
  mxmoe_bf16         mxmoe.moe_experts(recipe=None): mxmoe's fused layer with quantization off
  mxmoe_tile128      mxmoe.moe_experts(recipe="mxfp8_rceil_tile128")
  mxmoe_exact        mxmoe.moe_experts(recipe="mxfp8_rceil")
  mxmoe_tile128_unfused  (only when named) mxmoe_tile128 with the layer's epilogue fusions off: SwiGLU
                     and dSwiGLU run as quantize passes over a stored h / dY' instead of in GEMM1's and
                     the down-projection dgrad's epilogues; the same run then shows what they buy
  mxmoe_bf16_gather  (only when named) mxmoe_bf16 with every GEMM reading the routed rows of x and dout
                     inside the GEMM (all of Bf16's gather pieces: also the up projection's SwiGLU
                     epilogue and the wgrads, which lose on Hopper and are off by default)
  mxmoe_bf16_gathered  (only when named) mxmoe_bf16 with none of them: every GEMM on gathered copies for
                     torch._grouped_mm; beside mxmoe_bf16 it shows what the default pieces buy
  mxmoe_bf16_kgather  (only when named) mxmoe_bf16's default pieces plus the K-grouped gather wgrads
                     (dW13 and dW2 without gathered copies): beside mxmoe_bf16, what turning them on buys
Routing (outside the timed step, seeded): router logits = x @ R for a random bf16 R (H, E), softmax in
fp32, top-k, renormalized (Qwen3's norm_topk_prob), weights in bf16; the load imbalance that gives is
in each row (load_max_over_mean). Weights are bf16 N(0, 1/fan_in).

Modes (BENCH.md method): "eager" (steps back to back, CUDA events around each, one sync at the end,
median of --moe-reps after --moe-warmup) and "graph" (the same step captured once in a CUDA graph,
warm-up on a side stream, replayed; a capture failure is recorded in the row's error, not raised).
Each step sets the grads to None and writes every weight in place first (bench_e2e.touch_weights: a
one-element x*1 == x write that bumps the version counter), so mxmoe re-quantizes its weights every
step as after an optimizer step (its weight cache cannot serve them); the same write for every impl.
  fwd_bwd_us  one fwd+bwd step (median)          fwd_us  the forward alone under no_grad (median)
  peak_mib    torch.cuda.max_memory_allocated over one eager fwd+bwd step above what was allocated
              before it (stats reset first); the same number on the eager and graph rows
  ratio_vs_transformers  transformers_bf16 fwd_bwd_us / this fwd_bwd_us, same config, tokens and mode
              (> 1: faster than transformers); ratio_vs_mxmoe_bf16 the same against mxmoe_bf16
  gemm_configs  tile128 rows: the Hopper configuration of each of the layer's grouped GEMMs
              (mxmoe.sm90_gemm_config; w13_forward, ..., w2_wgrad)
  sonic_us    SonicMoE's fwd_bwd_us in the same run, config, tokens and mode (on every row)
  ratio_vs_sonic  sonic_us / this fwd_bwd_us (> 1: faster than SonicMoE); peak_vs_sonic  this peak_mib
              / SonicMoE's; first_call_s  the first (untimed, checked) step's seconds: JIT, autotuning
Each config measures sonic_bf16 first, then transformers_bf16, then the mxmoe impls.
Out of memory (or any error) in one (config, impl) is recorded in its rows and the run goes on.
--moe-profile adds "breakdown": one eager fwd+bwd step of each impl under torch.profiler, CUDA kernel
time grouped by kind (gemm, quantize, swiglu, gather_scatter, combine, setup, copy, other; by kernel
name) with the top kernels, to explain a missed target.

  python3 bench/bench_moe.py [--moe-configs NAMES] [--moe-tokens N,..] [--moe-modes eager,graph]
                             [--moe-reps 10] [--moe-profile] [--out bench/results/moe_layer.json]
  python -m mxmoe bench --moe [the same arguments]
  python3 bench/bench_moe.py --device cpu --moe-configs tiny --moe-reps 2     (smoke test, no GPU)

A benchmark, not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import time
import types
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

BASELINE = "transformers_bf16"
SONIC = "sonic_bf16"  # SonicMoE's layer: the peer every mxmoe number is printed beside (BENCH.md)
IMPLS = [SONIC, BASELINE, "mxmoe_bf16", "mxmoe_tile128", "mxmoe_exact", "mxmoe_tile128_cached"]
RECIPES = {"mxmoe_bf16": None, "mxmoe_tile128": "mxfp8_rceil_tile128", "mxmoe_exact": "mxfp8_rceil",
           "mxmoe_tile128_cached": "mxfp8_rceil_tile128"}
# *_cached: the weights are not written between steps, so their FP8 forms come from the weight cache:
# gradient-accumulation micro-batches 2..N of an optimizer step (eager only: the cache is off during
# CUDA-graph capture, so its graph rows re-quantize the weights as the plain impl's do).
CACHED = {"mxmoe_tile128_cached"}
# Measurement-only impls, run when named in --moe-impls (not in the default list).
UNFUSED = "mxmoe_tile128_unfused"
BF16_GATHER = "mxmoe_bf16_gather"  # the bf16 layer with every gather GEMM on (Sm90Backend.bf16_gather_gemms)
BF16_GATHERED = "mxmoe_bf16_gathered"  # the bf16 layer with none: gathered copies for torch._grouped_mm
BF16_KGATHER = "mxmoe_bf16_kgather"  # the default pieces plus the K-grouped gather wgrads
EXTRA_IMPLS = [UNFUSED, BF16_GATHER, BF16_GATHERED, BF16_KGATHER]
RECIPES[UNFUSED] = "mxfp8_rceil_tile128"
RECIPES[BF16_GATHER] = None
RECIPES[BF16_GATHERED] = None
RECIPES[BF16_KGATHER] = None
MODES = ["eager", "graph"]
GPT_OSS_ALPHA, GPT_OSS_LIMIT = 1.702, 7.0  # transformers' GptOssExperts


class MoEConfig(NamedTuple):
    name: str  # the BENCH.md name
    hidden: int
    intermediate: int
    experts: int  # local experts
    top_k: int
    bias: bool = False  # expert biases (gpt-oss)
    gpt_oss: bool = False  # the model's activation is gpt-oss' clamped SwiGLU (interleaved gate/up)
    default_tokens: Tuple[int, ...] = (16384,)


# BENCH.md "MoE layer configs" (public models); keys are what --moe-configs takes.
CONFIGS: Dict[str, MoEConfig] = {
    "qwen3-30b-a3b": MoEConfig("Qwen3-30B-A3B", 2048, 768, 128, 8, default_tokens=(16384, 4096)),
    "deepseek-v3-ep8": MoEConfig("DeepSeek-V3 EP8", 7168, 2048, 32, 8),
    "llama4-scout": MoEConfig("Llama4-Scout", 5120, 8192, 16, 1),
    "mixtral-8x7b": MoEConfig("Mixtral-8x7B", 4096, 14336, 8, 2),
    "gpt-oss-120b": MoEConfig("gpt-oss-120b", 2880, 2880, 128, 4, bias=True, gpt_oss=True),
    "small": MoEConfig("small", 1024, 768, 16, 4, default_tokens=(4096,)),  # BENCH.md "small (tests, CPU)"
    "tiny": MoEConfig("tiny", 64, 32, 4, 2, default_tokens=(64,)),  # the CPU smoke test
    "tiny-bias": MoEConfig("tiny-bias", 64, 32, 4, 2, bias=True, gpt_oss=True, default_tokens=(64,)),
}
DEFAULT_CONFIGS = ["qwen3-30b-a3b", "deepseek-v3-ep8", "llama4-scout", "mixtral-8x7b", "gpt-oss-120b"]


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def parse_configs(spec: str) -> List[str]:
    """Comma list of CONFIGS keys or BENCH.md names (case and punctuation ignored), or 'default'/'all'."""
    names: List[str] = []
    for s in filter(None, (x.strip() for x in spec.split(","))):
        if s in ("default", "all"):
            names += DEFAULT_CONFIGS
            continue
        hits = [k for k, c in CONFIGS.items() if _norm(s) in (_norm(k), _norm(c.name))]
        if not hits:  # a unique prefix ("qwen3", "mixtral")
            hits = [k for k, c in CONFIGS.items() if _norm(k).startswith(_norm(s)) or _norm(c.name).startswith(_norm(s))]
            hits = [h for h in hits if not h.startswith("tiny")] or hits
        if len(hits) != 1:
            raise SystemExit(f"unknown or ambiguous MoE config {s!r}; choose from {', '.join(CONFIGS)}")
        names.append(hits[0])
    return list(dict.fromkeys(names))


def runs_for(configs: List[str], tokens_spec: str) -> List[Tuple[str, int]]:
    """(config, tokens) pairs: each config at its default token counts, or at every --moe-tokens value."""
    tokens = [int(t) for t in tokens_spec.split(",") if t.strip()] if tokens_spec else None
    return [(c, t) for c in configs for t in (tokens or CONFIGS[c].default_tokens)]


# ---- environment --------------------------------------------------------------------------------

# date, commit (MXMOE_COMMIT first), device, clocks, torch: the host benchmark's definition.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_host import env_info  # noqa: E402


# ---- the transformers baseline ------------------------------------------------------------------

def _grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """transformers.integrations.moe._grouped_mm: F.grouped_mm where torch has it, else torch._grouped_mm."""
    if hasattr(torch.nn.functional, "grouped_mm"):
        return torch.nn.functional.grouped_mm(input.to(weight.dtype), weight, offs=offs)
    return torch._grouped_mm(input.to(weight.dtype), weight, offs=offs)


def _grouped_linear(input, weight, offs, bias=None, is_transposed=False):
    """transformers.integrations.moe._grouped_linear."""
    out = _grouped_mm(input, weight if is_transposed else weight.transpose(-2, -1), offs)
    if bias is not None:
        out.add_(bias)
    return out


def local_grouped_mm_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                     top_k_weights: torch.Tensor) -> torch.Tensor:
    """The op sequence of transformers 5.17's grouped_mm_experts_forward (src/transformers/integrations/
    moe.py), for where transformers is not installed: sort the (token, k) entries by expert, gather the
    rows (perm // k), histc + cumsum offsets, the EP-sentinel masks, grouped_mm gate_up (+ bias), the
    gate, grouped_mm down (+ bias), times the routing weights, inverse permutation, reshape + sum over
    top-k. tests/python/test_bench_moe.py checks it against the real one bit for bit where transformers
    imports."""
    device = hidden_states.device
    num_top_k = top_k_index.size(-1)
    num_tokens = hidden_states.size(0)
    hidden_dim = hidden_states.size(-1)
    sample_weights = top_k_weights.reshape(-1)
    expert_ids = top_k_index.reshape(-1)
    expert_ids_g, perm = torch.sort(expert_ids)
    selected_hidden_states_g = hidden_states[perm // num_top_k]
    sample_weights_g = sample_weights[perm]
    histc_input = expert_ids_g.float() if device.type in ("cpu", "mps") else expert_ids_g.int()
    tokens_per_expert = torch.histc(histc_input, bins=self.num_experts, min=0, max=self.num_experts - 1)
    offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
    sentinel_mask = (expert_ids_g >= self.num_experts).unsqueeze(-1)
    expert_ids_g.clamp_(max=self.num_experts - 1)
    selected_biases = self.gate_up_proj_bias[expert_ids_g] if self.has_bias else None
    selected_hidden_states_g.masked_fill_(sentinel_mask, 0.0)
    proj_out = _grouped_linear(selected_hidden_states_g, self.gate_up_proj, offsets, bias=selected_biases,
                               is_transposed=self.is_transposed)
    proj_out = proj_out.masked_fill(sentinel_mask, 0.0)
    proj_out = self._apply_gate(proj_out)
    selected_biases = self.down_proj_bias[expert_ids_g] if self.has_bias else None
    proj_out = _grouped_linear(proj_out, self.down_proj, offsets, bias=selected_biases,
                               is_transposed=self.is_transposed)
    proj_out = proj_out.masked_fill(sentinel_mask, 0.0)
    weighted_out = proj_out * sample_weights_g.unsqueeze(-1)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.size(0), device=device)
    weighted_out = weighted_out[inv_perm]
    final_hidden_states = weighted_out.view(num_tokens, num_top_k, hidden_dim).sum(dim=1)
    return final_hidden_states.to(hidden_states.dtype)


def transformers_experts_forward() -> Tuple[Callable, dict]:
    """transformers' grouped_mm experts function where it imports, else the local copy; and a record of
    which one it is (for the JSON)."""
    try:
        import transformers
        from transformers.integrations.moe import grouped_mm_experts_forward as fn

        try:
            sig = str(inspect.signature(fn))
        except (TypeError, ValueError):
            sig = "?"
        return fn, {"source": "transformers", "version": transformers.__version__,
                    "function": f"transformers.integrations.moe.grouped_mm_experts_forward{sig}"}
    except Exception as e:  # not installed (CPU dev machine), or a version without it
        return local_grouped_mm_experts_forward, {
            "source": "local", "version": None,
            "function": "bench_moe.local_grouped_mm_experts_forward (the op sequence of transformers 5.17's "
                        "grouped_mm_experts_forward)",
            "import_error": f"{type(e).__name__}: {e}"}


class HFExperts:
    """Stands in for a transformers experts module (the `self` its experts functions read): weights in
    transformers' layout (gate_up_proj (E, 2I, H) [gate | up], down_proj (E, H, I), not transposed), the
    attributes set by @use_experts_implementation (has_gate, has_bias, is_transposed, is_concatenated),
    act_fn (SiLU, as ACT2FN["silu"]) and _apply_gate: transformers' _default_apply_gate (chunk, act(gate)
    * up), or gpt-oss' GptOssExperts._apply_gate (clamped, alpha 1.702, up + 1, interleaved or
    concatenated halves as the mxmoe rows use)."""

    def __init__(self, w13, w2, b13, b2, gpt_oss_layout: Optional[str] = None):
        self.gate_up_proj, self.down_proj = w13, w2
        self.gate_up_proj_bias, self.down_proj_bias = b13, b2
        self.num_experts = w13.size(0)
        self.hidden_dim, self.intermediate_dim = w13.size(2), w2.size(2)
        self.has_gate = True
        self.has_bias = b13 is not None
        self.is_transposed = False
        self.experts_are_transposed = False  # the older transformers 4.5x spelling
        self.is_concatenated = gpt_oss_layout != "interleaved"
        self.act_fn = torch.nn.functional.silu
        self.config = types.SimpleNamespace(_experts_implementation="grouped_mm")
        self.gpt_oss_layout = gpt_oss_layout
        self.alpha, self.limit = GPT_OSS_ALPHA, GPT_OSS_LIMIT

    def _apply_gate(self, gate_up_out: torch.Tensor) -> torch.Tensor:
        if self.gpt_oss_layout is None:
            gate, up = gate_up_out.chunk(2, dim=-1)
            return self.act_fn(gate) * up
        if self.gpt_oss_layout == "interleaved":
            gate, up = gate_up_out[..., ::2], gate_up_out[..., 1::2]
        else:
            gate, up = gate_up_out.chunk(2, dim=-1)
        gate = gate.clamp(min=None, max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return (up + 1) * glu


# ---- SonicMoE ------------------------------------------------------------------------------------

SONIC_CALL = ("sonicmoe.moe_TC_softmax_topk_layer(x, router_w, w13.permute(1, 2, 0), None, w2.permute(1, 2, 0), "
              "None, k, torch.cuda.current_stream().cuda_stream, ActivationType.SWIGLU, False, "
              "is_softmax_over_topk=False, norm_topk_probs=True, concat_layout=True)")
# The QuACK GEMM entry points SonicMoE calls (each takes tuned=True by default: autotune on first use).
SONIC_GEMMS = ("gemm", "gemm_gated", "gemm_dgated")


class Sonic(NamedTuple):
    layer: Callable  # sonicmoe.moe_TC_softmax_topk_layer
    swiglu: object  # sonicmoe.enums.ActivationType.SWIGLU


def _untuned(fn: Callable) -> Callable:
    """fn with tuned=False unless the caller says otherwise: QuACK's default GEMM config, no autotuning."""
    if getattr(fn, "_bench_moe_untuned", False):
        return fn

    def call(*args, **kwargs):
        kwargs.setdefault("tuned", False)
        return fn(*args, **kwargs)

    call._bench_moe_untuned = True
    call.__wrapped__ = fn
    return call


def sonic_moe(tuned: bool = False) -> Tuple[Optional[Sonic], dict]:
    """SonicMoE's functional layer where sonic-moe imports (scripts/sonic_wheels.sh carries it to the GPU
    machine), else None; and a record for the JSON (versions, the call, which GEMM configs). tuned=False
    rebinds the QuACK GEMMs that sonicmoe.functional's forward and backward modules call to tuned=False
    (QuACK's default configs, as BENCH.md's SonicMoE numbers); tuned=True leaves QuACK's autotuning on
    (QUACK_CACHE_DIR keeps its results)."""
    try:
        import sonicmoe
        import sonicmoe.functional as sf
        from sonicmoe.enums import ActivationType
        from sonicmoe.functional import backward as sb, forward as sfw

        layer = sf.moe_TC_softmax_topk_layer
        patched = []
        if not tuned:
            for mod in (sfw, sb, sf):
                for name in SONIC_GEMMS:
                    if callable(getattr(mod, name, None)):
                        setattr(mod, name, _untuned(getattr(mod, name)))
                        patched.append(f"{mod.__name__}.{name}")
        info = {"source": "sonic-moe", "version": getattr(sonicmoe, "__version__", None), "function": SONIC_CALL,
                "gemm_configs": "default (QuACK tuned=False)" if not tuned else "autotuned (QuACK tuned=True)",
                "untuned": patched}
        try:
            import quack

            info["quack"] = getattr(quack, "__version__", None)
            info["quack_cache_dir"] = os.environ.get("QUACK_CACHE_DIR")
        except Exception as e:
            info["quack"] = f"? ({type(e).__name__})"
        try:
            import cutlass

            info["cutlass_dsl"] = getattr(cutlass, "__version__", None)
        except Exception as e:
            info["cutlass_dsl"] = f"? ({type(e).__name__})"
        return Sonic(layer, ActivationType.SWIGLU), info
    except Exception as e:  # not installed (CPU dev machine, wheels not carried) or a broken install
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        return None, {"source": None, "version": None, "function": SONIC_CALL,
                      "import_error": f"{type(e).__name__}: {msg}"}


def sonic_skip_reason(cfg: "MoEConfig", activation: str, layout: str) -> Optional[str]:
    """Why SonicMoE has no row for this layer (None: it runs): its layer has no clamped SwiGLU (gpt-oss)."""
    if cfg.gpt_oss or cfg.bias or activation != "swiglu" or layout != "concatenated":
        return ("skipped: SonicMoE has no gpt-oss layer (its GLU activations: swiglu, geglu, reglu; no clamped "
                f"SwiGLU with alpha 1.702, limit 7, up + 1); these rows: expert biases, {activation}/{layout}")
    return None


# ---- one config's tensors and steps ---------------------------------------------------------------

class Case:
    """One (config, tokens): inputs, routing, weights (shared by every impl), dY, and the steps."""

    def __init__(self, cfg: MoEConfig, tokens: int, device: torch.device, seed: int = 0):
        h, i, e, k = cfg.hidden, cfg.intermediate, cfg.experts, cfg.top_k
        gen = torch.Generator(device=device).manual_seed(seed)
        rand = lambda *size: torch.randn(*size, generator=gen, device=device, dtype=torch.bfloat16)
        self.cfg, self.tokens, self.device = cfg, tokens, device
        self.x = rand(tokens, h).requires_grad_(True)
        with torch.no_grad():
            router = rand(h, e).mul_(h**-0.5)  # a random bf16 router
            probs = torch.softmax((self.x @ router).float(), dim=-1)
            w, idx = torch.topk(probs, k, dim=-1)
            w = w / w.sum(dim=-1, keepdim=True)  # Qwen3's norm_topk_prob
            load = torch.bincount(idx.reshape(-1), minlength=e).float()
        self.router = router  # (H, E): SonicMoE routes from it (router_w = router.t(), a view)
        self.topk_idx = idx  # int64 (T, k)
        self.topk_weights = w.to(torch.bfloat16).requires_grad_(True)
        self.load_max_over_mean = float(load.max() / load.mean())
        self.empty_experts = int((load == 0).sum())
        self.w13 = rand(e, 2 * i, h).mul_(h**-0.5).requires_grad_(True)
        self.w2 = rand(e, h, i).mul_(i**-0.5).requires_grad_(True)
        self.b13 = rand(e, 2 * i).mul_(0.02).requires_grad_(True) if cfg.bias else None
        self.b2 = rand(e, h).mul_(0.02).requires_grad_(True) if cfg.bias else None
        self.dy = rand(tokens, h)
        self.out: Optional[torch.Tensor] = None
        self.impl: Optional[str] = None  # the impl of the last forward(): which grads it must give
        from bench_e2e import touch_weights

        self._touch = touch_weights
        self.touch = True  # write the weights between steps (off for the *_cached impls)

    def weights(self) -> List[torch.Tensor]:
        return [t for t in (self.w13, self.w2, self.b13, self.b2) if t is not None]

    def grad_tensors(self, impl: Optional[str] = "all") -> Dict[str, torch.Tensor]:
        """The leaves an impl's step gives grads to (impl "all": every leaf). SonicMoE routes by itself:
        the routing scores' grad flows into x through its router, so it has no topk_weights leaf."""
        impl = self.impl if impl is None else impl
        named = {"x": self.x, "topk_weights": self.topk_weights, "w13": self.w13, "w2": self.w2}
        if impl == SONIC:
            del named["topk_weights"]
        if self.b13 is not None:
            named.update(bias13=self.b13, bias2=self.b2)
        return named

    def zero_grads(self) -> None:
        """Between steps: grads to None (zero_grad(set_to_none=True)) and every weight written in place
        as by an optimizer step (bench_e2e.touch_weights), so mxmoe re-quantizes them every step."""
        for t in self.grad_tensors("all").values():
            t.grad = None
        self.out = None
        if self.touch:
            self._touch(*self.weights())

    def forward(self, impl: str, hf_fn: Callable, activation: str, layout: str,
                sonic: Optional[Sonic] = None) -> Callable[[], torch.Tensor]:
        x, idx, w, w13, w2, b13, b2 = self.x, self.topk_idx, self.topk_weights, self.w13, self.w2, self.b13, self.b2
        self.touch = impl not in CACHED
        self.impl = impl
        if impl == SONIC:
            full = self.sonic_forward(sonic)
            return lambda: full()[0]
        if impl == BASELINE:
            experts = HFExperts(w13, w2, b13, b2, gpt_oss_layout=layout if activation != "swiglu" else None)
            return lambda: hf_fn(experts, x, idx, w)
        import mxmoe

        recipe = RECIPES[impl]
        return lambda: mxmoe.moe_experts(x, idx, w, w13, w2, recipe=recipe, activation=activation, layout=layout,
                                         bias13=b13, bias2=b2)

    def sonic_forward(self, sonic: Optional[Sonic]) -> Callable[[], tuple]:
        """SonicMoE's whole layer on this case's x, router and weights (no copies: permuted views, the
        router's transpose); returns its (out, router_logits, expert_frequency)."""
        if sonic is None:
            raise RuntimeError("sonic-moe not importable")
        if self.device.type != "cuda":
            raise RuntimeError("sonic-moe needs a CUDA device (Hopper)")
        x, w13, w2, router_w, k = self.x, self.w13, self.w2, self.router.t(), self.cfg.top_k
        layer, swiglu = sonic.layer, sonic.swiglu
        # F.linear(x, router.t()) is x @ router: the logits of this case's routing, same op and layouts.
        return lambda: layer(x, router_w, w13.permute(1, 2, 0), None, w2.permute(1, 2, 0), None, k,
                             torch.cuda.current_stream().cuda_stream, swiglu, False,
                             is_softmax_over_topk=False, norm_topk_probs=True, concat_layout=True)

    def sonic_check(self, sonic: Optional[Sonic], hf_fn: Callable) -> dict:
        """SonicMoE against the routing and layer every other impl gets (outside the timings): its router
        logits equal to x @ router bit for bit, its tokens per expert against the topk_idx counts, and
        its output against the transformers baseline's on the same weights and routing (relative
        Frobenius error; bf16 and SonicMoE's fp32 routing scores: ~1e-2 or less; a wrong weight layout
        would be ~1)."""
        with torch.no_grad():
            out, logits, freq = self.sonic_forward(sonic)()
            ref_logits = self.x @ self.router
            load = torch.bincount(self.topk_idx.reshape(-1), minlength=self.cfg.experts)
            diff = (freq.long() - load).abs()
            ref = hf_fn(HFExperts(self.w13, self.w2, None, None), self.x, self.topk_idx, self.topk_weights)
            err = float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))
            res = {"logits_equal": bool(torch.equal(logits, ref_logits)), "load_equal": bool(diff.max() == 0),
                   "load_max_abs_diff": int(diff.max()), "load_diff_tokens": int(diff.sum()),
                   "out_rel_err_vs_transformers": round(err, 6)}
            del out, logits, freq, ref
        self.zero_grads()
        return res

    def paths(self):
        """The layer's path choice for this impl's steps: UNFUSED turns the tile128 phases' epilogue
        fusions off while a step runs (forward and backward, also while a CUDA graph is captured),
        BF16_GATHER / BF16_GATHERED all / none of the bf16 layer's gather GEMMs on, BF16_KGATHER the
        default ones at this hidden size plus the wgrads."""
        if self.impl in (BF16_GATHER, BF16_GATHERED, BF16_KGATHER):
            from mxmoe.backends import BF16_GATHER_PIECES
            from mxmoe.backends.sm90 import Sm90Backend

            pieces = {BF16_GATHER: BF16_GATHER_PIECES, BF16_GATHERED: frozenset(),
                      BF16_KGATHER: frozenset(Sm90Backend().bf16_gather_pieces(self.cfg.hidden)) | {"wgrad"}}
            return _patched(Sm90Backend, bf16_gather_gemms=pieces[self.impl])
        if self.impl != UNFUSED:
            return contextlib.nullcontext()
        from mxmoe.backends.phases import Tile128Phases

        return _patched(Tile128Phases, fused_up_takes=staticmethod(lambda *a: False),
                        fused_down_takes=staticmethod(lambda *a: False))

    def step(self, fwd: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run():
            with self.paths():
                self.zero_grads()
                out = fwd()
                out.backward(self.dy)
                self.out = out

        return run

    def fwd_step(self, fwd: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run():
            with self.paths():
                self.zero_grads()
                with torch.no_grad():
                    self.out = fwd()

        return run

    def check(self, fwd: Callable[[], torch.Tensor]) -> None:
        """One step with the output and every grad checked (shape, finite), so a broken impl fails
        before it is timed (and an impl that skipped a grad is not timed doing less work)."""
        self.step(fwd)()
        if self.out is None or tuple(self.out.shape) != tuple(self.x.shape):
            raise RuntimeError(f"output shape {None if self.out is None else tuple(self.out.shape)}, "
                               f"expected {tuple(self.x.shape)}")
        # MXMOE_BENCH_UNCHECKED=1: a bound variant (a kernel with a step removed, scripts/ab_variants.sh)
        # leaves outputs unwritten; it is timed without the finiteness checks.
        unchecked = os.environ.get("MXMOE_BENCH_UNCHECKED") == "1"
        if not unchecked and not bool(torch.isfinite(self.out).all()):
            raise RuntimeError("non-finite output")
        for name, t in self.grad_tensors(None).items():
            if t.grad is None or t.grad.shape != t.shape:
                raise RuntimeError(f"no grad of {name} of shape {tuple(t.shape)}")
            if not unchecked and not bool(torch.isfinite(t.grad).all()):
                raise RuntimeError(f"non-finite grad of {name}")
        for t in self.grad_tensors("all").values():
            t.grad = None
        self.out = None


@contextlib.contextmanager
def _patched(cls, **attrs):
    """cls's attributes replaced for the duration of the block."""
    old = {n: cls.__dict__[n] for n in attrs}
    try:
        for n, v in attrs.items():
            setattr(cls, n, v)
        yield
    finally:
        for n, v in old.items():
            setattr(cls, n, v)


# ---- timing -------------------------------------------------------------------------------------

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_us(run: Callable[[], None], device: torch.device, warmup: int, reps: int) -> float:
    """Median per-repetition time after warm-up. CUDA: the repetitions back to back with an event pair
    around each and one sync at the end (as triton's do_bench), so the host's launch latency at the
    start of a step is not counted as device time. CPU: wall time per repetition."""
    for _ in range(warmup):
        run()
    _sync(device)
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)


def eager_us(case: Case, run: Callable[[], None], warmup: int, reps: int) -> float:
    try:
        return _median_us(run, case.device, warmup, reps)
    finally:
        case.zero_grads()


def graph_us(case: Case, run: Callable[[], None], warmup: int, reps: int) -> float:
    """run captured once in a CUDA graph (torch docs, whole-network capture: warm-up on a side stream,
    grads None before capture so backward allocates them from the graph's pool and each replay refills
    them) and replayed: median per replay. The weight write inside run is captured too; mxmoe's weight
    cache is off during capture, so every replay re-quantizes."""
    if case.device.type != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device")
    dev = case.device
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        for _ in range(max(2, warmup)):
            run()
    torch.cuda.current_stream(dev).wait_stream(s)
    torch.cuda.synchronize(dev)
    case.zero_grads()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            run()
        return _median_us(graph.replay, dev, 1, reps)
    finally:
        case.zero_grads()
        del graph
        _free(dev)  # the graph's private pool back to the allocator before the next measurement


def peak_mib(case: Case, run: Callable[[], None]) -> Optional[float]:
    """Peak allocated memory during one eager step above what was allocated before it (grads None)."""
    if case.device.type != "cuda":
        return None
    case.zero_grads()
    torch.cuda.synchronize(case.device)
    base = torch.cuda.memory_allocated(case.device)
    torch.cuda.reset_peak_memory_stats(case.device)
    run()
    torch.cuda.synchronize(case.device)
    peak = (torch.cuda.max_memory_allocated(case.device) - base) / 2**20
    case.zero_grads()
    return peak


# ---- per-kernel breakdown -----------------------------------------------------------------------

# First match wins (checked on the lowercased kernel name): setup before gemm (at::cuda's
# prepare_grouped_gemm_data, the tile128 descriptor kernels), gemm before quantize.
CATEGORIES: List[Tuple[str, str]] = [
    ("setup", r"prepare_grouped_gemm|desc_kernel|group_info|clamp_offsets|zero_tail|zero_empty|memset|"
              r"fillfunctor|fill_kernel"),
    ("gemm", r"gemm|cutlass|nvjet|xmma|wgmma|gmma|cublas|grouped_mm|aten::mm$|aten::bmm|addmm|matmul"),
    ("quantize", r"quant|sfa_|sfb_|scale_kernel|kg_stage|fp8|e4m3|amax"),
    ("swiglu", r"swiglu|silu|sigmoid|glu|clamp"),
    ("gather_scatter", r"gather|scatter|index|permute|sort|radix|histc|histogram|cumsum|scan|dispatch"),
    ("combine", r"combine|reduce|group_sum|aten::sum$"),
    ("copy", r"copy|memcpy|cat_"),
]


def classify(name: str) -> str:
    low = name.lower()
    for cat, pat in CATEGORIES:
        if re.search(pat, low):
            return cat
    return "other"


def _short(name: str, n: int = 90) -> str:
    name = name[5:] if name.startswith("void ") else name
    return name if len(name) <= n else name[: n - 3] + "..."


def profile_breakdown(case: Case, impl: str, run: Callable[[], None], top: int = 10) -> dict:
    """One step under torch.profiler (after one warm-up step): CUDA kernel time by category and the top
    kernels. On CPU (the smoke test) the same from aten ops' self CPU time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = case.device.type == "cuda"
    run()
    _sync(case.device)
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        run()
        _sync(case.device)
    case.zero_grads()
    def device_us(e) -> float:
        us = getattr(e, "self_device_time_total", None)
        return float(getattr(e, "self_cuda_time_total", 0.0) if us is None else us)

    events = prof.key_averages()
    if cuda:
        picked = [e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA]
        picked = picked or [e for e in events if device_us(e) > 0 and e.self_cpu_time_total == 0]
        kernels = [(e.key, device_us(e), int(e.count)) for e in picked]
    else:
        kernels = [(e.key, float(e.self_cpu_time_total), int(e.count)) for e in events
                   if e.key.startswith(("aten::", "mxmoe::"))]
    kernels = [k for k in kernels if k[1] > 0]
    kernels.sort(key=lambda r: -r[1])
    cats: Dict[str, float] = {c: 0.0 for c, _ in CATEGORIES}
    cats["other"] = 0.0
    counts: Dict[str, int] = {c: 0 for c in cats}
    for name, us, n in kernels:
        c = classify(name)
        cats[c] += us
        counts[c] += n
    total = sum(cats.values())
    return {"config": case.cfg.name, "tokens": case.tokens, "impl": impl, "timer": "cuda kernels" if cuda else "cpu ops",
            "total_us": total, "categories_us": {c: round(v, 1) for c, v in cats.items() if v > 0},
            "categories_calls": {c: n for c, n in counts.items() if n > 0},
            "top": [{"kernel": _short(k), "us": round(us, 1), "calls": n, "category": classify(k)}
                    for k, us, n in kernels[:top]]}


# ---- the gpt-oss activation probe ---------------------------------------------------------------

def probe_gpt_oss(device: torch.device, activation: str, layouts: List[str]) -> dict:
    """Whether mxmoe.moe_experts runs gpt-oss' clamped SwiGLU: a tiny call per candidate layout (fwd+bwd,
    with biases). The first that runs is used for the gpt-oss rows (mxmoe and the transformers gate
    alike); else those rows use activation="swiglu", layout="concatenated"."""
    tried = []
    cfg = CONFIGS["tiny-bias"]
    for layout in layouts:
        try:
            case = Case(cfg, 64, device, seed=1)
            fwd = case.forward("mxmoe_bf16", local_grouped_mm_experts_forward, activation, layout)
            case.check(fwd)
            return {"activation": activation, "layout": layout, "probe": tried + [f"{activation}/{layout}: ok"]}
        except Exception as e:
            tried.append(f"{activation}/{layout}: {_err(e)}")
    return {"activation": "swiglu", "layout": "concatenated", "probe": tried}


# ---- one (config, tokens) -----------------------------------------------------------------------

def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg[:300]}"


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _cleanup(case: "Case", device: torch.device) -> None:
    """After a failure (called outside the except block, so the traceback's frames no longer hold the
    failed step's tensors): grads dropped and the allocator's cache emptied; never raises."""
    try:
        case.zero_grads()
        _free(device)
    except Exception as e:  # a sticky CUDA error: the next impl will report its own failure
        print(f"(cleanup failed: {_err(e)})", flush=True)


def sm90_gemm_configs(cfg: MoEConfig, tokens: int) -> Optional[Dict[str, str]]:
    """The Hopper tile128 configurations of the layer's six grouped GEMMs (mxmoe.sm90_gemm_config: kernel,
    tile, stages, ...; the same on any machine): tokens x top_k routed rows in `experts` groups, w13
    (E, 2I, H) and w2 (E, H, I), each as forward (M, N, K), dgrad (M, K, N) and wgrad (N, K over M)."""
    try:
        from mxmoe import sm90_gemm_config
    except ImportError:  # an mxmoe without the query
        return None
    m, e = tokens * cfg.top_k, cfg.experts
    out = {}
    for w, n, k in (("w13", 2 * cfg.intermediate, cfg.hidden), ("w2", cfg.hidden, cfg.intermediate)):
        out[f"{w}_forward"] = sm90_gemm_config("forward", m, n, k, e)
        out[f"{w}_dgrad"] = sm90_gemm_config("dgrad", m, k, n, e)
        out[f"{w}_wgrad"] = sm90_gemm_config("wgrad", m, n, k, e)
    return out


def bench_case(name: str, tokens: int, device: torch.device, impls: List[str], modes: List[str], reps: int,
               warmup: int, hf_fn: Callable, gpt_oss: Optional[dict], profile: bool,
               deadline: Optional[float] = None, log=print, sonic: Optional[Sonic] = None,
               sonic_error: Optional[str] = None) -> Tuple[List[dict], List[dict]]:
    """Rows (one per impl and mode) and, with profile, the per-kernel breakdowns of one (config, tokens).
    sonic: SonicMoE's layer (sonic_moe()), None where it does not import (sonic_error says why)."""
    cfg = CONFIGS[name]
    activation, layout = ("swiglu", "concatenated")
    if cfg.gpt_oss and gpt_oss is not None:
        activation, layout = gpt_oss["activation"], gpt_oss["layout"]
    base = {"config": cfg.name, "config_key": name, "tokens": tokens, "hidden": cfg.hidden,
            "intermediate": cfg.intermediate, "experts": cfg.experts, "top_k": cfg.top_k, "bias": cfg.bias,
            "activation": activation, "layout": layout}

    gemm_configs = sm90_gemm_configs(cfg, tokens)

    def row(impl, mode, **kw):
        r = {**base, "impl": impl, "mode": mode, "fwd_bwd_us": None, "fwd_us": None, "peak_mib": None,
             "ratio_vs_transformers": None, "ratio_vs_mxmoe_bf16": None, "fwd_ratio_vs_transformers": None,
             "sonic_us": None, "ratio_vs_sonic": None, "peak_vs_sonic": None, "first_call_s": None,
             "reps": None, "warmup": None, "error": None, "oom": False,
             "gemm_configs": gemm_configs if RECIPES.get(impl) == "mxfp8_rceil_tile128" else None}
        r.update(kw)
        return r

    t_setup = time.perf_counter()
    failed = None
    try:
        case = Case(cfg, tokens, device)
    except Exception as e:  # out of memory building the inputs: every row of the config says so
        failed = (_err(e), _is_oom(e))
    if failed:
        _free(device)
        log(f"FAILED {cfg.name} T={tokens} (inputs): {failed[0]}")
        return [row(i, m, error=failed[0], oom=failed[1]) for i in impls for m in modes], []
    base.update(load_max_over_mean=round(case.load_max_over_mean, 3), empty_experts=case.empty_experts)
    log(f"--- {cfg.name} T={tokens} H={cfg.hidden} I={cfg.intermediate} E={cfg.experts} k={cfg.top_k}"
        f"{' bias' if cfg.bias else ''} {activation}/{layout}: load max/mean {case.load_max_over_mean:.3f}, "
        f"{case.empty_experts} empty experts (inputs {time.perf_counter() - t_setup:.1f}s)")
    rows: List[dict] = []
    breakdowns: List[dict] = []
    for impl in impls:
        if deadline is not None and time.perf_counter() > deadline:
            rows += [row(impl, m, error="skipped: time budget (--moe-budget-s) spent") for m in modes]
            log(f"{cfg.name} T={tokens} {impl}: skipped (time budget)")
            continue
        extra = {}
        if impl == SONIC:
            why = sonic_skip_reason(cfg, activation, layout)
            if why is None and sonic is None:
                why = f"sonic-moe not importable ({sonic_error or '?'})"
            elif why is None and device.type != "cuda":
                why = f"sonic-moe needs a CUDA device (Hopper), not {device.type}"
            if why:
                rows += [row(impl, m, error=why) for m in modes]
                log(f"{cfg.name} T={tokens} {impl}: {why}")
                continue
        failed = None
        try:
            fwd = case.forward(impl, hf_fn, activation, layout, sonic=sonic)
            t0 = time.perf_counter()
            case.check(fwd)  # first call: library load, lazy init, JIT, autotuning outside the timings
            _sync(device)
            t1 = time.perf_counter()
            extra["first_call_s"] = round(t1 - t0, 3)
            if impl == SONIC:  # the same routing and layer as every other impl's? (outside the timings)
                extra["sonic_check"] = case.sonic_check(sonic, hf_fn)
            case.step(fwd)()
            _sync(device)
            step_s = time.perf_counter() - t1
            case.zero_grads()
            # Bounded time: fewer repetitions where one step is long (the big configs).
            r, w = (reps, warmup) if step_s < 0.05 else (max(3, min(reps, 6)), max(1, min(warmup, 2)))
            peak = peak_mib(case, case.step(fwd))
        except Exception as e:  # OOM or a failing impl: record it, free what it held, go on
            failed = (_err(e), _is_oom(e))
        if failed:
            _cleanup(case, device)
            rows += [row(impl, m, error=failed[0], oom=failed[1], **extra) for m in modes]
            log(f"FAILED {cfg.name} T={tokens} {impl}: {failed[0]}")
            continue
        log(f"{cfg.name} T={tokens} {impl}: first call {t1 - t0:.2f}s, one step {step_s * 1e3:.1f} ms; reps {r}"
            + (f"; check {extra['sonic_check']}" if "sonic_check" in extra else ""))
        for mode in modes:
            timer = eager_us if mode == "eager" else graph_us
            failed, fb = None, None
            try:
                fb = timer(case, case.step(fwd), w, r)
                fo = timer(case, case.fwd_step(fwd), w, r)
            except Exception as e:  # e.g. a step that cannot be captured in a CUDA graph
                failed = (_err(e), _is_oom(e))
            if failed:
                _cleanup(case, device)
                rows.append(row(impl, mode, fwd_bwd_us=fb, peak_mib=peak, reps=r, warmup=w, error=failed[0],
                                oom=failed[1], **extra))
                log(f"FAILED {cfg.name} T={tokens} {impl} {mode}: {failed[0]}")
                continue
            rows.append(row(impl, mode, fwd_bwd_us=fb, fwd_us=fo, peak_mib=peak, reps=r, warmup=w, **extra))
            log(f"{cfg.name} T={tokens} {impl} {mode}: fwd+bwd {fb:.1f} us, fwd {fo:.1f} us, "
                f"peak {_f(peak, '{:.0f}')} MiB")
        if profile:
            failed = None
            try:
                breakdowns.append(profile_breakdown(case, impl, case.step(fwd)))
            except Exception as e:
                failed = _err(e)
            if failed:
                _cleanup(case, device)
                breakdowns.append({"config": cfg.name, "tokens": tokens, "impl": impl, "error": failed})
                log(f"FAILED profile {cfg.name} T={tokens} {impl}: {failed}")
    add_ratios(rows)
    del case
    _free(device)
    return rows, breakdowns


def add_ratios(rows: List[dict]) -> None:
    """ratio_vs_transformers (every impl) and ratio_vs_mxmoe_bf16 (the others): baseline time over this
    impl's time, same config, tokens and mode; on every row SonicMoE's time (sonic_us), sonic_us over this
    impl's time (ratio_vs_sonic) and this impl's peak over SonicMoE's (peak_vs_sonic)."""
    def times(impl, key):
        return {(r["config"], r["tokens"], r["mode"]): r[key] for r in rows if r["impl"] == impl and r.get(key)}

    hf, hf_fwd, mx = times(BASELINE, "fwd_bwd_us"), times(BASELINE, "fwd_us"), times("mxmoe_bf16", "fwd_bwd_us")
    sonic, sonic_peak = times(SONIC, "fwd_bwd_us"), {k[:2]: v for k, v in times(SONIC, "peak_mib").items()}
    for r in rows:
        k = (r["config"], r["tokens"], r["mode"])
        r["sonic_us"] = sonic.get(k)
        if r["fwd_bwd_us"]:
            if k in hf:
                r["ratio_vs_transformers"] = hf[k] / r["fwd_bwd_us"]
            if r["impl"] != BASELINE and k in mx:
                r["ratio_vs_mxmoe_bf16"] = mx[k] / r["fwd_bwd_us"]
            if k in sonic:
                r["ratio_vs_sonic"] = sonic[k] / r["fwd_bwd_us"]
        if r["fwd_us"] and k in hf_fwd:
            r["fwd_ratio_vs_transformers"] = hf_fwd[k] / r["fwd_us"]
        if r.get("peak_mib") and k[:2] in sonic_peak:
            r["peak_vs_sonic"] = r["peak_mib"] / sonic_peak[k[:2]]


# ---- output -------------------------------------------------------------------------------------

def _f(v, fmt="{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


COLS = [("config", "config", "{}"), ("tokens", "tokens", "{}"), ("impl", "impl", "{}"), ("mode", "mode", "{}"),
        ("fwd_bwd_us", "fwd_bwd_us", "{:.0f}"), ("fwd_us", "fwd_us", "{:.0f}"), ("peak_mib", "peak_mib", "{:.0f}"),
        ("ratio_vs_sonic", "vs sonic", "{:.3f}x"), ("peak_vs_sonic", "peak vs sonic", "{:.2f}x"),
        ("ratio_vs_transformers", "vs transformers", "{:.3f}x"), ("ratio_vs_mxmoe_bf16", "vs mxmoe_bf16", "{:.3f}x"),
        ("first_call_s", "first call s", "{:.1f}"), ("error", "error", "{}")]


def table(rows: List[dict]) -> str:
    head = [h for _, h, _ in COLS]
    cells = [[_f(r.get(k), fmt)[:70] for k, _, fmt in COLS] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
    line = lambda xs: "  ".join(x.ljust(w) for x, w in zip(xs, widths)).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(c) for c in cells])


def format_breakdown(b: dict) -> str:
    if b.get("error"):
        return f"  {b['config']} T={b['tokens']} {b['impl']}: FAILED {b['error']}"
    tot = b["total_us"] or 1.0
    cats = ", ".join(f"{c} {us:.0f} ({us / tot:.0%})" for c, us in sorted(b["categories_us"].items(), key=lambda x: -x[1]))
    return f"  {b['config']} T={b['tokens']} {b['impl']}: {b['total_us']:.0f} us ({b['timer']}) = {cats}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--moe-configs", default="default",
                   help=f"comma list of {', '.join(CONFIGS)} (or their BENCH.md names); default: the five "
                        "BENCH.md models")
    p.add_argument("--moe-tokens", default="",
                   help="comma list of token counts for every config (default: 16384, and 4096 too for Qwen3)")
    p.add_argument("--moe-modes", default="eager,graph", help="comma list of eager, graph")
    p.add_argument("--moe-impls", default=",".join(IMPLS), help=f"comma list of {', '.join(IMPLS + EXTRA_IMPLS)} (default: all but the last)")
    p.add_argument("--moe-reps", type=int, default=10, help="timed repetitions per measurement (median); "
                   "configs whose step takes over 50 ms use at most 6")
    p.add_argument("--moe-warmup", type=int, default=3, help="untimed steps before each measurement")
    p.add_argument("--moe-profile", action="store_true",
                   help="per-kernel breakdown (torch.profiler) of one eager fwd+bwd step of each impl")
    p.add_argument("--moe-budget-s", type=float, default=330.0,
                   help="stop starting new impls after this many seconds (the device's 10-minute limit)")
    p.add_argument("--moe-sonic-tuned", action="store_true",
                   help="let QuACK autotune SonicMoE's GEMMs (minutes a config; QUACK_CACHE_DIR keeps the "
                        "results); default: its default GEMM configs (tuned=False), as BENCH.md's numbers")
    p.add_argument("--moe-gpt-oss-activation", default="gpt_oss",
                   help="mxmoe activation name probed for gpt-oss' clamped SwiGLU")
    p.add_argument("--moe-gpt-oss-layouts", default="interleaved,concatenated",
                   help="layouts probed, in order, with that activation")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test: no graph mode)")
    p.add_argument("--moe-merge", nargs="+", metavar="JSON", default=None,
                   help="merge the rows of runs split over device calls (same commit and device; the device's "
                        "10-minute limit) into --out and print the table; runs nothing")
    p.add_argument("--out", default=None,
                   help="the JSON file (a folder: moe_layer.json in it); default bench/results/moe_layer.json "
                        "on a GPU, none for the CPU smoke test (it must not replace the committed GPU rows)")


def run(configs: str = "default", tokens: str = "", modes: str = "eager,graph", impls: str = ",".join(IMPLS),
        reps: int = 10, warmup: int = 3, profile: bool = False, device: str = "cuda", out: Optional[str] = None,
        budget_s: float = 330.0, gpt_oss_activation: str = "gpt_oss",
        gpt_oss_layouts: str = "interleaved,concatenated", sonic_tuned: bool = False) -> dict:
    """The whole benchmark; returns the JSON document (written to out when given). device="cpu" with the
    tiny config and reps 1-2 is the smoke test of the plumbing."""
    dev = torch.device(device)
    t_start = time.perf_counter()
    deadline = t_start + budget_s if budget_s and budget_s > 0 else None
    names = parse_configs(configs)
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in mode_list if m not in MODES]
    if bad:
        raise SystemExit(f"unknown mode(s) {bad}; choose from {MODES}")
    if dev.type != "cuda" and "graph" in mode_list:
        mode_list = [m for m in mode_list if m != "graph"]
        print("(cpu: no CUDA graphs; graph mode skipped)")
    asked = [s.strip() for s in impls.split(",") if s.strip()]
    # SonicMoE first (its numbers are every row's "vs sonic"), then the transformers baseline (always).
    impl_list = list(dict.fromkeys(([SONIC] if SONIC in asked else []) + [BASELINE] + asked))
    bad = [i for i in impl_list if i not in IMPLS + EXTRA_IMPLS]
    if bad:
        raise SystemExit(f"unknown impl(s) {bad}; choose from {IMPLS + EXTRA_IMPLS}")
    import mxmoe

    env = env_info(dev)
    hf_fn, hf_info = transformers_experts_forward()
    sonic, sonic_info = sonic_moe(tuned=sonic_tuned) if SONIC in impl_list else (None, None)
    print(f"device {env['device']}{' clocks ' + env['clocks'] if env['clocks'] else ''}, torch {env['torch']}, "
          f"commit {env['commit'] or '?'}, {env['date']}", flush=True)
    print(f"baseline: {hf_info['function']}"
          f"{' (transformers ' + hf_info['version'] + ')' if hf_info['version'] else ' (' + hf_info.get('import_error', '') + ')'}",
          flush=True)
    if sonic_info is not None:
        print("SonicMoE: " + (f"sonic-moe {sonic_info['version']}, quack {sonic_info.get('quack')}, cutlass-dsl "
                               f"{sonic_info.get('cutlass_dsl')}, GEMMs {sonic_info['gemm_configs']}" if sonic else
                               f"not importable ({sonic_info['import_error']}): its rows say so"), flush=True)
    if not hasattr(mxmoe, "moe_experts"):
        print("mxmoe.moe_experts not found: only the transformers baseline (and SonicMoE) run", flush=True)
        impl_list = [i for i in impl_list if i in (SONIC, BASELINE)]
    gpt_oss = None
    if any(CONFIGS[n].gpt_oss for n in names) and hasattr(mxmoe, "moe_experts"):
        gpt_oss = probe_gpt_oss(dev, gpt_oss_activation, [s.strip() for s in gpt_oss_layouts.split(",") if s.strip()])
        print(f"gpt-oss rows: activation={gpt_oss['activation']} layout={gpt_oss['layout']} ({'; '.join(gpt_oss['probe'])})",
              flush=True)
    rows: List[dict] = []
    breakdowns: List[dict] = []
    log = lambda s: print(f"[{time.perf_counter() - t_start:6.1f}s] {s}", flush=True)
    for name, t in runs_for(names, tokens):
        try:
            r, b = bench_case(name, t, dev, impl_list, mode_list, reps, warmup, hf_fn, gpt_oss, profile, deadline, log,
                              sonic=sonic, sonic_error=(sonic_info or {}).get("import_error"))
        except Exception as e:  # anything not caught per impl: record it, go on
            _free(dev)
            log(f"FAILED {name} T={t}: {_err(e)}")
            r, b = [{"config": CONFIGS[name].name, "config_key": name, "tokens": t, "impl": i, "mode": m,
                     "fwd_bwd_us": None, "fwd_us": None, "peak_mib": None, "ratio_vs_transformers": None,
                     "ratio_vs_mxmoe_bf16": None, "sonic_us": None, "ratio_vs_sonic": None, "peak_vs_sonic": None,
                     "first_call_s": None, "error": _err(e), "oom": _is_oom(e)}
                    for i in impl_list for m in mode_list], []
        rows += r
        breakdowns += b
    for r in rows:
        r.update(date=env["date"], commit=env["commit"], device=env["device"])
    doc = {"rows": rows, "breakdown": breakdowns, **env, "transformers": hf_info, "sonic": sonic_info,
           "gpt_oss": gpt_oss,
           "settings": {"configs": names, "tokens": tokens or "default", "modes": mode_list, "impls": impl_list,
                        "reps": reps, "warmup": warmup, "profile": profile, "sonic_tuned": sonic_tuned},
           "wall_s": round(time.perf_counter() - t_start, 1)}
    if out:
        path = os.path.join(out, "moe_layer.json") if (os.path.isdir(out) or out.endswith("/")) else out
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        doc["path"] = path
    print()
    print("== MoE expert layer fwd+bwd vs SonicMoE bf16 and transformers bf16 grouped_mm experts (bench/bench_moe.py) ==")
    print(f"device {env['device']}{' clocks ' + env['clocks'] if env['clocks'] else ''}, torch {env['torch']}, "
          f"commit {env['commit'] or '?'}, {env['date']}; baseline {hf_info['source']}"
          f"{' ' + hf_info['version'] if hf_info['version'] else ''}; ratio = baseline us / impl us (same run)")
    if sonic_info is not None:
        print(f"SonicMoE: sonic-moe {sonic_info['version']}, quack {sonic_info.get('quack')}, GEMMs "
              f"{sonic_info['gemm_configs']}" if sonic else f"SonicMoE: not importable ({sonic_info['import_error']})")
    if gpt_oss:
        print(f"gpt-oss rows: activation={gpt_oss['activation']} layout={gpt_oss['layout']}")
    if dev.type == "cpu":
        print("(cpu: a smoke test of the script only; times mean nothing)")
    if breakdowns:
        print("per-kernel breakdown, one eager fwd+bwd step:")
        for b in breakdowns:
            print(format_breakdown(b))
    print(table(rows) if rows else "no rows")
    if out:
        print(f"rows: {doc['path']} ({doc['wall_s']}s)")
    return doc


def merge(paths: List[str], out: Optional[str]) -> dict:
    """One document from runs of the same commit on the same device (configs split over device calls):
    their rows and breakdowns in order, the first run's environment, the settings' configs and impls
    joined, wall_s summed. Different commits or devices are an error: their ratios would not compare."""
    docs = []
    for path in paths:
        with open(path) as f:
            docs.append(json.load(f))
    for key in ("commit", "device"):
        seen = sorted({str(d.get(key)) for d in docs})
        if len(seen) > 1:
            raise SystemExit(f"--moe-merge: the runs' {key} differ ({', '.join(seen)}); merge runs of one {key}")
    doc = dict(docs[0])
    doc["rows"] = [r for d in docs for r in d["rows"]]
    doc["breakdown"] = [b for d in docs for b in d.get("breakdown", [])]
    doc["settings"] = dict(docs[0]["settings"])
    for key in ("configs", "impls"):
        doc["settings"][key] = list(dict.fromkeys(v for d in docs for v in d["settings"][key]))
    doc["wall_s"] = round(sum(d.get("wall_s", 0) for d in docs), 1)
    doc["merged_from"] = [os.path.basename(p) for p in paths]
    doc.pop("path", None)
    if out:
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
    print(table(doc["rows"]) if doc["rows"] else "no rows")
    return doc


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="bench_moe.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    a = p.parse_args(argv)
    if a.moe_merge:
        merge(a.moe_merge, a.out)
        return 0
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_moe needs a CUDA device (BENCH.md: benchmarks run on the GPU machine); "
              "for a smoke test use --device cpu --moe-configs tiny --moe-reps 2")
        return 2
    doc = run(configs=a.moe_configs, tokens=a.moe_tokens, modes=a.moe_modes, impls=a.moe_impls, reps=a.moe_reps,
              warmup=a.moe_warmup, profile=a.moe_profile, device=a.device,
              out=a.out if a.out is not None else (None if a.device == "cpu" else "bench/results/moe_layer.json"),
              budget_s=a.moe_budget_s,
              gpt_oss_activation=a.moe_gpt_oss_activation, gpt_oss_layouts=a.moe_gpt_oss_layouts,
              sonic_tuned=a.moe_sonic_tuned)
    ok = [r for r in doc["rows"] if r["fwd_bwd_us"] is not None]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
