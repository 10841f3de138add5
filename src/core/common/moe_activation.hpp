// Scalar math of the MoE kernel family shared by the CPU reference (cpu/moe.cpp), the CUDA kernels
// (cuda/moe/moe.cu) and the fused quantizers that compute SwiGLU on the fly (cuda/quantize/quantize.cu): one
// definition, so every backend evaluates the same fp32 operations in the same order.
//
//  - SwiGLU (mxmoe_swiglu): every multiply/add/divide is a separately rounded IEEE fp32 operation
//    (__fmul_rn / __fadd_rn / __fdiv_rn on the device, -ffp-contract=off on the host), so nothing can
//    be contracted into an FMA. The one exception is expf: host libm and CUDA's expf may differ by
//    an ulp of fp32 for some inputs, so CPU and CUDA SwiGLU outputs can differ (rarely) by one ulp of
//    the output dtype (bf16: one bf16 ulp at most). Two CUDA kernels including this header give
//    identical bits.
//  - The fixed reduction orders of mxmoe_moe_combine_weight_grad and mxmoe_moe_group_sum (below), so
//    that the CPU reference and the CUDA kernels are bit-identical.
#pragma once

#include <cmath>
#include <cstdint>

#include "mxmoe/mx_format.hpp"  // MXMOE_HD, mul_rn

#ifndef MXMOE_HD
#if defined(__CUDACC__)
#define MXMOE_HD __host__ __device__ inline
#else
#define MXMOE_HD inline
#endif
#endif

namespace mxmoe {

// Layouts of the gate and up halves in h (N, 2I).
constexpr int kSwigluConcat = 0;       // h = [gate | up] along the last dim (gate_up_proj + .chunk(2, -1))
constexpr int kSwigluInterleaved = 1;  // gate = h[..., 0::2], up = h[..., 1::2] (gpt-oss)

struct SwigluParams {
  int layout;       // kSwigluConcat or kSwigluInterleaved
  float alpha;      // sigmoid slope: 1 for SiLU, 1.702 for gpt-oss
  float limit;      // clamp bound (+inf = no clamp); gpt-oss: 7
  float up_offset;  // added to the clamped up value: 0, gpt-oss: 1
};

// ---- separately rounded fp32 operations (no contraction on either side) ------------------------
MXMOE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MXMOE_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
MXMOE_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
MXMOE_HD float exp_f32(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

// Outputs of the MoE kernels write any NaN as the canonical quiet NaN (0x7FC00000; 0x7FC0 in bf16),
// as the rest of the core does: host and device arithmetic propagate different NaN payloads.
MXMOE_HD float canon_nan(float f) { return f32_is_nan(f32_bits(f)) ? bits_f32(0x7FC00000u) : f; }

// sigmoid(z) = 1 / (1 + exp(-z)), 1 / d correctly rounded (a plain division on the host).
// On the device, for sigmoid's d = 1 + exp(-z) (d >= 1, +inf or NaN), without a branch: __frcp_rn
// guards its inline path (MUFU.RCP and one Newton step) with a branch to a called subroutine, and
// that branch per element splits the unrolled SwiGLU code into blocks the compiler cannot interleave
// (the dSwiGLU epilogue ran 12 % faster without it; a warp with one lane at d = +inf also took the
// call). Here:
//   d < 2^126:  the inline path itself, r = r0 + r0 (1 - d r0) from the approximate reciprocal r0;
//   d >= 2^126 (a subnormal result): the same for d 2^-64, scaled back by 2^-64 (rounding once more),
//               then moved by one subnormal step where the residual 1 - d x says the double rounding
//               missed (no exact halfway case exists: 1 / d would be an odd multiple of 2^-150);
//   d = +inf:   +0.
// The same bits as __frcp_rn for every d >= 1 (tests/cpp/test_cuda_rcp.cu checks all 2^30 of them).
MXMOE_HD float rcp_rn(float d) {
#if defined(__CUDA_ARCH__)
  const bool big = d >= 0x1p126f;
  const float ds = big ? d * 0x1p-64f : d;
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(ds));
  const float r = __fmaf_rn(r0, __fmaf_rn(-ds, r0, 1.0f), r0);
  const float x0 = r * 0x1p-64f;
  const float rho = __fmaf_rn(-d, x0, 1.0f);
  const float step = fabsf(rho) > (d * 0x1p-75f) * 0x1p-75f ? copysignf(0x1p-149f, rho) : 0.0f;  // d 2^-150, exact
  const float x = x0 + step;
  return d == INFINITY ? 0.0f : (big ? x : r);
#else
  return 1.0f / d;
#endif
}
MXMOE_HD float sigmoid_f32(float z) { return rcp_rn(add_rn(1.0f, exp_f32(-z))); }

// rcp_rn's inline path alone, for 1 <= d < 2^126 or NaN, where it gives rcp_rn's bits (and __frcp_rn's:
// tests/cpp/test_cuda_rcp.cu): 3 instructions instead of ~15 for the subnormal and +inf cases.
MXMOE_HD float rcp_rn_moderate(float d) {
#if defined(__CUDA_ARCH__)
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(d));
  return __fmaf_rn(r0, __fmaf_rn(-d, r0, 1.0f), r0);
#else
  return 1.0f / d;
#endif
}

// sigmoid_f32 for z >= -87 or NaN: then 1 + exp(-z) < 2^126 (e^87 < 6.1e37 < 2^126 = 8.5e37, with
// expf's 2 ulp), so the moderate reciprocal gives sigmoid_f32's bits.
MXMOE_HD float sigmoid_f32_moderate(float z) { return rcp_rn_moderate(add_rn(1.0f, exp_f32(-z))); }

// Whether both bf16 values of a packed pair are >= -87 or a positive-signed NaN, i.e. neither is
// below -87, -inf or a negative NaN (bf16 bits above 0xC2AE = -87.0): where a PLAIN SwiGLU (z = g) may
// take sigmoid_f32_moderate. A kernel tests its gate words (or their __vmaxu2) and, with one vote per
// warp, runs the moderate instantiation of its unrolled loop: a branch around the loop, none inside.
MXMOE_HD bool bf16x2_sigmoid_moderate(uint32_t w) { return (w & 0xFFFFu) <= 0xC2AEu && (w >> 16) <= 0xC2AEu; }

// Whether no g[q] of 8 is below -87 (NaN counts as not below): a PLAIN SwiGLU of these gate values
// may take the moderate sigmoid. Kernels branch once per 8 elements, around their unrolled math; a
// thread meets g < -87 only on extreme inputs.
MXMOE_HD bool sigmoid_moderate8(const float (&g)[8]) {
  bool ok = true;
  for (int q = 0; q < 8; ++q) ok = ok && !(g[q] < -87.0f);
  return ok;
}

// Clamps written with comparisons that keep NaN (fminf/fmaxf would turn a NaN into the bound):
// gc = min(g, limit), uc = min(max(u, -limit), limit), as torch.clamp.
MXMOE_HD float swiglu_clamp_gate(float g, float limit) { return g > limit ? limit : g; }
MXMOE_HD float swiglu_clamp_up(float u, float limit) { return u > limit ? limit : (u < -limit ? -limit : u); }

// PLAIN: the caller has checked swiglu_is_plain(p) (no clamp, alpha 1: Qwen3, Mixtral, DeepSeek):
// then min(g, +inf) = g, the up clamp is the identity and 1 * gc = gc, so skipping those operations
// gives the same values (a NaN stays a NaN; only its payload may differ, which no MX output sees).
MXMOE_HD bool swiglu_is_plain(const SwigluParams& p) { return p.limit == INFINITY && p.alpha == 1.0f; }

// y = gc * sigmoid(alpha * gc) * (uc + up_offset), evaluated as (gc * s) * (uc + up_offset).
// MODERATE (PLAIN only): the caller knows g >= -87 or NaN (bf16x2_sigmoid_moderate); the same bits.
template <bool PLAIN = false, bool MODERATE = false>
MXMOE_HD float swiglu_value(float g, float u, const SwigluParams& p) {
  static_assert(PLAIN || !MODERATE, "the moderate sigmoid needs z = g");
  const float gc = PLAIN ? g : swiglu_clamp_gate(g, p.limit);
  const float uc = PLAIN ? u : swiglu_clamp_up(u, p.limit);
  const float s = MODERATE ? sigmoid_f32_moderate(gc) : sigmoid_f32(PLAIN ? gc : mul_rn(p.alpha, gc));
  return mul_rn(mul_rn(gc, s), add_rn(uc, p.up_offset));
}

// Gradients of swiglu_value at (g, u) for the incoming gradient dy:
//   z = alpha * gc, s = sigmoid(z)
//   dg = dy * (uc + up_offset) * (s + z * s * (1 - s))   where the gate clamp passes (g <= limit)
//   du = dy * (gc * s)                                   where the up clamp passes (-limit <= u <= limit)
// The clamps pass the gradient at their bounds (torch.clamp's inclusive rule) and wherever the
// comparison is false, i.e. also for NaN inputs: a NaN stays visible in the gradient (torch would
// mask it to 0 under a finite clamp; with limit = +inf, plain silu(g) * u, it propagates too).
template <bool PLAIN = false, bool MODERATE = false>
MXMOE_HD void swiglu_grad(float g, float u, float dy, const SwigluParams& p, float* dg, float* du) {
  static_assert(PLAIN || !MODERATE, "the moderate sigmoid needs z = g");
  const float gc = PLAIN ? g : swiglu_clamp_gate(g, p.limit);
  const float uc = PLAIN ? u : swiglu_clamp_up(u, p.limit);
  const float z = PLAIN ? gc : mul_rn(p.alpha, gc);
  const float s = MODERATE ? sigmoid_f32_moderate(z) : sigmoid_f32(z);
  const float uo = add_rn(uc, p.up_offset);
  const float dsig = add_rn(s, mul_rn(mul_rn(z, s), sub_rn(1.0f, s)));  // d(gc * s) / d gc
  const float dgc = mul_rn(mul_rn(dy, uo), dsig);
  *dg = !PLAIN && g > p.limit ? 0.0f : dgc;
  *du = !PLAIN && (u > p.limit || u < -p.limit) ? 0.0f : mul_rn(dy, mul_rn(gc, s));
}

// swiglu_grad and swiglu_value at (g, u) from one evaluation of the sigmoid: the same operations,
// so dg, du and y are bit for bit those of the two functions (the fused down-projection epilogue needs
// dH and act(h) of the same elements).
template <bool PLAIN = false, bool MODERATE = false>
MXMOE_HD void swiglu_grad_value(float g, float u, float dy, const SwigluParams& p, float* dg, float* du, float* y) {
  static_assert(PLAIN || !MODERATE, "the moderate sigmoid needs z = g");
  const float gc = PLAIN ? g : swiglu_clamp_gate(g, p.limit);
  const float uc = PLAIN ? u : swiglu_clamp_up(u, p.limit);
  const float z = PLAIN ? gc : mul_rn(p.alpha, gc);
  const float s = MODERATE ? sigmoid_f32_moderate(z) : sigmoid_f32(z);
  const float uo = add_rn(uc, p.up_offset);
  const float gs = mul_rn(gc, s);
  const float dsig = add_rn(s, mul_rn(mul_rn(z, s), sub_rn(1.0f, s)));
  const float dgc = mul_rn(mul_rn(dy, uo), dsig);
  *dg = !PLAIN && g > p.limit ? 0.0f : dgc;
  *du = !PLAIN && (u > p.limit || u < -p.limit) ? 0.0f : mul_rn(dy, gs);
  *y = mul_rn(gs, uo);
}

// ---- fixed reduction orders (CPU reference == CUDA, bit for bit) -------------------------------
// mxmoe_moe_combine_weight_grad: dw[t, j] = sum_h dout[t, h] * y[inv[t, j], h]. Element h belongs to
// lane (h / kDotChunk) % kDotLanes; each lane sums its elements in increasing h from +0 as
// acc = fl(acc + fl(dout * y)); then the lanes are added pairwise in a fixed tree:
// for off = 16, 8, 4, 2, 1: v[l] = fl(v[l] + v[l + off]) for l < off; dw = v[0].
constexpr int kDotLanes = 32;
constexpr int kDotChunk = 8;
// mxmoe_moe_group_sum: out[g, c] = sum of x[r, c] over the rows [s, e) of group g. Row r belongs to
// lane (r - s) % kSumLanes; each lane sums its rows in increasing r from +0; then the lanes are added
// in the tree for off = 8, 4, 2, 1: v[i] = fl(v[i] + v[i + off]) for i < off; out = v[0].
constexpr int kSumLanes = 16;

}  // namespace mxmoe
