"""The fused MoE expert layer: route -> dispatch -> experts (SwiGLU) -> combine, in MXFP8.

    out = mxmoe.moe_experts(x, topk_idx, topk_weights, w13, w2, recipe=..., activation=..., layout=...)

Data flow (docs/design/moe-layer.md; N = T*k rows in expert order, a static bound, so
nothing waits on the host):
  routing   moe_routing(topk_idx, E): offs (E,) expert end rows, perm (N,) sorted row -> entry t*k+j,
            inv (T, k) entry -> row. Ids outside [0, E) are dropped: their rows sit after offs[-1],
            the GEMMs write them as 0, so they add nothing and get no grad.
  (tile128: align_routing pads each expert's rows to a multiple of 16 with zero rows, so that the
            wgrad GEMM reads every group in place)
  GEMM1     h = dispatch(x) @ w13[e]^T (+ bias13)   dispatch = the gather of x's rows, quantized by the
                                                    GEMM's quantizer as it reads them (no copy of x)
  GEMM2     o = act(h) @ w2[e]^T (+ bias2)          act (SwiGLU) computed by GEMM2's quantizer as it
                                                    reads h, or (tile128, concatenated halves) in
                                                    GEMM1's epilogue: no bf16 activation tensor
  combine   out[t] = sum_j w[t, j] * o[inv[t, j]]   fp32, j in order: deterministic
Backward: the down projection's dgrad runs on the unweighted rows, dY' = gather(dout) @ w2, and the
weights are applied where dY' is read next, dH = act'(h, w * dY') (inside the quantizers of the GEMMs
that consume it, or in tile128's fused dgrad epilogue); dW2 = (w * gather(dout))^T act(h); dx = the
combine of the dgrad rows without weights (deterministic); d topk_weights[t, j] = <dY'[n], act(h[n])>
(+ <dout[t], bias2[e]>), n = inv[t, j], so the expert outputs o are never kept.
Saved for backward: x, h (bf16: SwiGLU's input), act(h)'s FP8 wgrad operand (MX paths) and the
routing -- nothing of T*k rows x H: dispatch(x)'s wgrad operand is built in the backward from x, and
the bf16 path gathers x and recomputes act(h) there (or has it from its fused down-projection dgrad).
The weights' FP8 forms live in the weight cache (mxmoe/weight_cache.py: once per optimizer step).

Paths, chosen once per call by the backend that runs the layer (Backend.layer_phases, in layer.py);
tile128 and exact are one autograd Function (functional.FusedMX) over their recipe family's phase ops
(mxmoe/backends/phases.py):
  tile128  recipe mxfp8_rceil_tile128 on Hopper (FP8 tensor cores) or CPU (the exact reference GEMMs):
           TILE128, the moe_tile128_* phase ops (the sm90 and reference backends offer them);
  exact    mxfp8_rceil / mxfp8_floor on Hopper (on CPU with backend='fused'): EXACT, the
           moe_exact_* phase ops (MX round trips + bf16 GEMMs, as the sm90 backend's exact recipes);
  bf16     recipe=None: the same fused data flow unquantized (torch._grouped_mm), the apples-to-apples
           baseline;
  composed everything else (other GPUs, exact recipes on CPU, mxfp8_rceil_wgrad_with_hp, backend
           overrides): mxmoe.grouped_mm between differentiable gather / SwiGLU / combine ops
           (materializes the bf16 intermediates).

Layouts: w13 (E, 2I, H) and w2 (E, H, I), the layouts of transformers 5's gate_up_proj / down_proj.
layout="concatenated": w13[:, :I] is the gate and w13[:, I:] the up projection (transformers'
Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3: `.chunk(2, dim=-1)` of the GEMM output); "interleaved": gate
rows at even and up rows at odd indices (gpt-oss: `[..., ::2]`, `[..., 1::2]`).
activation: "swiglu" (silu(g) * u), "gpt_oss" (gpt-oss's clamped variant: g = min(g, 7),
u = clamp(u, -7, 7), g * sigmoid(1.702 g) * (u + 1)) or a Swiglu(alpha, limit, up_offset).

Modules (a DAG: activation <- functional <- layer; the layer imports no backend and nothing of
torch.distributed):
  activation.py  Swiglu, ACTIVATIONS, LAYOUTS (and their checks)
  functional.py  the autograd functions: FusedMX, Bf16, and the composed layer's Gather / Act / Combine
  layer.py       moe_experts: checks, the path, the DTensor rule (registered by tensor parallelism)
"""
from .activation import ACTIVATIONS, LAYOUTS, Swiglu, resolve_activation, resolve_layout
from .functional import Combine
from .layer import is_dtensor, layer_backend_kwargs, moe_experts, register_dtensor_rule

__all__ = ["moe_experts", "Swiglu", "ACTIVATIONS", "LAYOUTS", "is_dtensor", "layer_backend_kwargs",
           "register_dtensor_rule", "resolve_activation", "resolve_layout", "Combine"]
