/*
 * mxmoe C API, MoE kernels: routing, dispatch (gather), combine, group sums and SwiGLU. Conventions
 * in mxmoe/common.h.
 */
#ifndef MXMOE_MOE_H_
#define MXMOE_MOE_H_

#include "mxmoe/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== MoE kernels: routing, dispatch (gather), combine, SwiGLU ===================================
 * The data movement and elementwise steps of the fused expert layer around the grouped GEMMs.
 * T tokens, k experts per token (top-k), E experts, N = T*k rows in expert order. Index tensors are
 * int32 and contiguous; every kernel clamps device-resident indices instead of trusting them (never
 * out of bounds). All outputs are contiguous and written whole (no caller initialization needed).
 * Every call is deterministic (fixed reduction orders, no float atomics) and on CUDA launches on
 * `stream` without host syncs or allocations (CUDA-graph safe). Empty inputs (T = 0, H = 0, k = 0)
 * are valid: outputs with elements are still written (zeros where nothing is summed). NaN stays
 * visible and is written as the canonical NaN (0x7FC00000, bf16 0x7FC0) wherever a value is computed
 * or converted (host and device arithmetic propagate different payloads); same-dtype gathers without
 * row_scale copy the bits.
 *
 * mxmoe_moe_routing: the expert-order permutation of the (T, k) router choices.
 *   topk_idx (T, k) int32 or int64: expert ids; ids outside [0, E) (negative too) are DROPPED.
 *   Entries are sorted stably by (key, flat index t*k+j), key = id for a kept entry, E for a dropped
 *   one. Outputs (int32, on topk_idx's device):
 *     offs (E,)   cumulative END rows: expert e owns sorted rows [offs[e-1], offs[e]); offs[E-1] is
 *                 the number of kept entries; the dropped ones occupy [offs[E-1], N) in flat order
 *     perm (N,)   perm[p] = flat index t*k+j of the entry at sorted position p
 *     inv (T, k)  inv[t, j] = sorted position of entry (t, j) (dropped entries included)
 *   1 <= num_experts <= 2^20, N < 2^31. workspace: CUDA scratch of at least
 *   mxmoe_moe_routing_workspace_size(N, E, device) bytes on topk_idx's device (any dtype, contiguous,
 *   uninitialized, garbage afterwards; NULL allowed when the size is 0, e.g. on the host). The size
 *   depends only on (N, E, device): 256 + 3 * round_up(4 N, 256) + CUB radix sort temp storage for N
 *   32-bit keys of ceil(log2(E+1)) bits. It returns -1 on error (message in mxmoe_last_error()).
 *
 * mxmoe_moe_gather: out[r, :] = x[perm[r] / k, :]   (times row_scale.flat[perm[r]] when given)
 *   x (T, H) bf16|f32; perm (R,) int32 (R = T*k, or more for padded routing), values clamped into
 *   [0, T*k) except negative ones, which give a row of zeros (padding rows); row_scale optional
 *   (T, k) f32|bf16; out (R, H) bf16|f32. The product is one fp32 multiply, rounded once (RNE) to
 *   out's dtype; without row_scale the values are converted (exact copy for equal dtypes).
 *
 * mxmoe_moe_combine: out[t, :] = sum_{j = 0..k-1, in this order} w[t, j] * y[inv[t, j], :]
 *   y (N, H) bf16|f32 (N >= 1 when T*k > 0); inv (T, k) int32, values clamped into [0, N); weights
 *   optional (T, k) f32|bf16; out (T, H) bf16|f32. fp32 accumulator from +0: acc = fl(acc + fl(w*y))
 *   (two roundings, never an FMA), without weights acc = fl(acc + y); rounded once to out's dtype.
 *   Forward combine and, without weights, the backward of the dispatch (dX = sum of the k rows).
 *
 * mxmoe_moe_combine_weight_grad: dw[t, j] = sum_h dout[t, h] * y[inv[t, j], h] in fp32
 *   dout (T, H), y (N, H) bf16|f32; inv (T, k) int32 clamped into [0, N); dw (T, k) f32. Fixed
 *   order: element h goes to lane (h/8) % 32, each lane sums its products in increasing h
 *   (fl(acc + fl(d*y))), the 32 lanes are added in the tree v[l] += v[l + off], off = 16, 8, 4, 2, 1.
 *
 * mxmoe_moe_swiglu_weight_grad: dw[t, j] = sum_i dy[r, i] * act(h[r])_i in fp32, r = inv[t, j]
 *   The routing-weight gradient without the expert outputs: with out[t] = sum_j w[t, j] * o_r and
 *   o_r = act(h_r) W2^T (+ b2), dL/dw[t, j] = <dout[t], o_r> = <dout[t] W2, act(h_r)> (+ <dout[t], b2>:
 *   not part of this op, the caller adds it). dy (N, I) bf16|f32: the down projection's dgrad of each
 *   routed row without routing weights (dy[r] = dout[t] W2 for the row's token t and expert); h (N, 2I)
 *   bf16: the saved pre-activation, gate and up in `layout` as for mxmoe_swiglu; act = mxmoe_swiglu's
 *   fp32 value for (layout, alpha, limit, up_offset) (same requirements), not rounded to a dtype; inv
 *   (T, k) int32 clamped into [0, N) (N >= 1 when T*k > 0); dw (T, k) f32. Fixed order as
 *   mxmoe_moe_combine_weight_grad's: element i goes to lane (i/8) % 32, each lane sums its products in
 *   increasing i (fl(acc + fl(dy*act))), the 32 lanes are added in the tree v[l] += v[l + off],
 *   off = 16, 8, 4, 2, 1. CPU and CUDA agree bit for bit except through expf (see mxmoe_swiglu): an
 *   act value may differ by an fp32 ulp, dw then by a few fp32 ulps of sum_i |dy*act|.
 *
 * mxmoe_moe_group_sum: out[g, c] = sum of x[r, c] over the rows r of group g (bias gradients)
 *   x (M, C) bf16|f32; offs (G,) int32 cumulative group ends, clamped as everywhere (rows past
 *   offs[G-1] ignored, empty groups give 0); out (G, C) f32. Fixed order: row r of a group starting
 *   at s goes to lane (r - s) % 16, each lane sums in increasing r, the 16 lanes are added in the tree
 *   v[i] += v[i + off], off = 8, 4, 2, 1.
 *
 * mxmoe_swiglu: y = gc * sigmoid(alpha * gc) * (uc + up_offset),
 *   gc = min(g, limit), uc = clamp(u, -limit, limit), sigmoid(z) = 1 / (1 + exp(-z)), in fp32.
 *   h (N, 2I) bf16|f32 holds gate g and up u: layout MXMOE_SWIGLU_CONCAT: [g | u] halves along the
 *   last dim (gate_up_proj + .chunk(2, -1): Qwen3-MoE, Mixtral, OLMoE, DeepSeek); layout
 *   MXMOE_SWIGLU_INTERLEAVED: g = h[..., 0::2], u = h[..., 1::2] (gpt-oss). y (N, I), h's dtype,
 *   each element rounded once (RNE). Standard SwiGLU: alpha 1, limit +inf, up_offset 0 (silu(g) * u);
 *   gpt-oss: alpha 1.702, limit 7, up_offset 1. Requirements: limit >= 0 (not NaN), alpha and
 *   up_offset finite. NaN inputs stay NaN.
 * mxmoe_swiglu_backward: dh (N, 2I) in h's layout and dtype from dy (N, I) bf16|f32 and h:
 *   dg = dy * (uc + up_offset) * (s + alpha*gc*s*(1-s)) with s = sigmoid(alpha*gc), 0 where g > limit;
 *   du = dy * gc * s, 0 where |u| > limit (the clamps pass the gradient at their bounds, as torch.clamp,
 *   and keep NaN visible).
 *   Every operation is a separately rounded fp32 operation (no FMA contraction), identical on CPU
 *   and CUDA except expf (host libm vs CUDA expf, which can differ by an fp32 ulp): the CPU and CUDA
 *   results may then differ (rarely) by one ulp of a bf16 output (a few ulps of an f32 one); dg also
 *   where s + alpha*gc*s*(1-s) cancels towards 0, by a tiny absolute amount (~1e-7 |dy (uc+up_offset)|).
 */
typedef enum {
  MXMOE_SWIGLU_CONCAT = 0,
  MXMOE_SWIGLU_INTERLEAVED = 1
} mxmoe_swiglu_layout;

MXMOE_API int64_t mxmoe_moe_routing_workspace_size(int64_t n, int64_t num_experts, int32_t device);

MXMOE_API mxmoe_status mxmoe_moe_routing(const mxmoe_tensor* topk_idx, int64_t num_experts,
                                         mxmoe_tensor* offs, mxmoe_tensor* perm, mxmoe_tensor* inv,
                                         const mxmoe_tensor* workspace, void* stream);

MXMOE_API mxmoe_status mxmoe_moe_gather(const mxmoe_tensor* x, const mxmoe_tensor* perm, int64_t k,
                                        const mxmoe_tensor* row_scale, mxmoe_tensor* out,
                                        void* stream);

MXMOE_API mxmoe_status mxmoe_moe_combine(const mxmoe_tensor* y, const mxmoe_tensor* inv,
                                         const mxmoe_tensor* weights, mxmoe_tensor* out,
                                         void* stream);

MXMOE_API mxmoe_status mxmoe_moe_combine_weight_grad(const mxmoe_tensor* dout, const mxmoe_tensor* y,
                                                     const mxmoe_tensor* inv, mxmoe_tensor* dw,
                                                     void* stream);

MXMOE_API mxmoe_status mxmoe_moe_swiglu_weight_grad(const mxmoe_tensor* dy, const mxmoe_tensor* h,
                                                    const mxmoe_tensor* inv, int32_t layout, float alpha,
                                                    float limit, float up_offset, mxmoe_tensor* dw,
                                                    void* stream);

MXMOE_API mxmoe_status mxmoe_moe_group_sum(const mxmoe_tensor* x, const mxmoe_tensor* offs,
                                           mxmoe_tensor* out, void* stream);

MXMOE_API mxmoe_status mxmoe_swiglu(const mxmoe_tensor* h, int32_t layout, float alpha, float limit,
                                    float up_offset, mxmoe_tensor* y, void* stream);

MXMOE_API mxmoe_status mxmoe_swiglu_backward(const mxmoe_tensor* dy, const mxmoe_tensor* h,
                                             int32_t layout, float alpha, float limit,
                                             float up_offset, mxmoe_tensor* dh, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MXMOE_MOE_H_ */
