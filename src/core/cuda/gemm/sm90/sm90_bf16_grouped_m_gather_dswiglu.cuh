// sm_90a bf16 grouped GEMM on routed rows with the dSwiGLU epilogue: the bf16 MoE layer's
// down-projection dgrad. The mainloop is the bf16 gather GEMM's (GroupedMGather<128, ., bf16, true,
// true>: dY' = gather(dout) . w2[e], w2 (E, H, I) read as it lies); dY' is never stored. Each 128 x 128
// tile of it (one group's rows, columns n0 .. n0 + 127 of I) becomes, in the math warpgroups' epilogue:
//   dH = act'(h, bf16(w * bf16(dY')))  bf16, from the saved pre-activation h (M, 2I) and the row's
//        routing weight w (1 without row_scale): the bits of the unfused bf16 layer (the gather GEMM's
//        bf16 dY', the weight applied in fp32 and rounded to bf16, then mxmoe_swiglu_backward). Column c
//        of dY' pairs with h's gate and up columns c and I + c (concatenated halves) or 2c and 2c + 1
//        (interleaved, gpt-oss), as p.act.layout says;
//   tw_part  per row, <bf16(dY'), act(h)> over the tile's columns in a fixed order (lane q of a row's
//        quad sums columns n0 + 8 j + 2 q + e, j < 16, e < 2, in that order from +0; then (s0 + s1) +
//        (s2 + s3)): the routing weights' gradient summed over the column tiles by the caller;
//   act      optional (p.act_bf16): bf16(act(h)), the value the partial used, as mxmoe_swiglu writes it
//        (the bf16 layer's dW2 operand, which would otherwise cost a SwiGLU pass over h).
// Bytes: h read once, dH written once, instead of dY' written and read three times (the weight, the
// SwiGLU backward, the weights' gradient) and h read twice. Unlike the FP8 variant there is no
// quantization, so the math warpgroups do the epilogue themselves (row pairs from their accumulators,
// h and dH as bf16 pairs straight from and to global memory; the producer prefetches the tile's rows
// of h into L2 as the tile starts).
// The epilogue stays in the math warpgroups: a fourth-warpgroup form (the FP8 variant's: dY' handed over
// through shared memory, one epilogue thread per tile row) measured slower, 1698 against 1521 us at
// Qwen3-30B-A3B 16K (H100): a row per thread makes each h load and dH store touch 32 rows' lines
// (docs/design/gemm-sm90.md).
#pragma once

#include <cuda_bf16.h>

#include "common/moe_activation.hpp"
#include "cuda/common/bf16_pack.cuh"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_1x128_128x128.cuh"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace sm90 {

template <int Stages_>
struct GroupedMGatherDSwigluBf16 : GroupedMGather<128, Stages_, __nv_bfloat16, true, true> {
  using Base = GroupedMGather<128, Stages_, __nv_bfloat16, true, true>;
  static constexpr bool kFusedEpilogue = true;
  // Base::smem_bytes plus the third group table the fused epilogues' kernel path writes (G + 1 ints).
  static constexpr size_t smem_bytes(int groups) {
    return Base::smem_bytes(groups) + (static_cast<size_t>(groups) + 1) * sizeof(int);
  }

  // The producer warpgroup's thread t (< 128), at the start of a tile: tile row t's h (the tile's 128
  // gate and 128 up values) into L2 for the epilogue.
  static __device__ __forceinline__ void prefetch_tile(const GroupedMParams& p, const TileCoord& c, int t) {
    if (t >= c.rows) return;
    const uint16_t* row = p.h + (static_cast<int64_t>(c.row0) + t) * 2 * static_cast<int64_t>(p.n);
    const int bytes = min(256, 2 * (p.n - c.n0));  // columns past I (I % 64 == 0: 128 or 256 bytes)
    if (p.act.layout == kSwigluInterleaved) {
      prefetch_l2(row + 2 * c.n0, 2 * bytes);
    } else {
      prefetch_l2(row + c.n0, bytes);
      prefetch_l2(row + p.n + c.n0, bytes);
    }
  }

  // One element of the epilogue: dH's gate and up values (dg, du) at dY' element d (a bf16 value), gate
  // g and up u of h and the row weight w, the unfused layer's bits (bf16(w * dY'): one fp32 multiply
  // rounded to bf16), y = act(h) (fp32; the optional act output is its bf16 rounding), and the routing
  // weights' partial continued with <d, y>.
  template <bool PLAIN>
  static __device__ __forceinline__ void dswiglu_element(float d, float g, float u, float w, const SwigluParams& act,
                                                         float& dg, float& du, float& y, float& part) {
    const uint32_t dw2 = cvt_bf16x2(__fmul_rn(d, w), 0.f);
    swiglu_grad_value<PLAIN>(g, u, __uint_as_float(dw2 << 16), act, &dg, &du, &y);
    part = add_rn(part, mul_rn(d, y));
  }

  // A math thread (mw, warp, lane) after its tile's mainloop, holding rows lr and lr + 8, columns
  // 8 j + 2 (lane % 4) + {0, 1} of dY': dH and the partial for its two rows (rows outside the tile are
  // left alone).
  template <bool PLAIN>
  static __device__ __forceinline__ void handoff(const GroupedMParams& p, const TileCoord& c,
                                                 const float (&fin)[Base::kAcc], uint8_t*, uint32_t, int mw,
                                                 int warp, int lane, int src0, int src1,
                                                 typename Base::HandoffState&) {
    const int I = p.n, q = lane & 3;
    const int lr = mw * 64 + warp * 16 + lane / 4;
    const bool inter = p.act.layout == kSwigluInterleaved;
    const int ntw = (I + 127) / 128;
    constexpr int kJ = Base::kAcc / 4;
    // Every h word of the thread's two rows and their routing weights are loaded before any math: dH's
    // stores may alias h as far as the compiler knows, so loads placed between them waited one L2 round
    // trip per chunk (32 a tile: 1690 instead of 1490 us at Qwen3-30B-A3B 16K, H100). Gate and up bf16
    // pairs of columns c, c + 1 (c = n0 + 8 j + 2 q): h[c], h[I + c] or, interleaved, h[2 c .. 2 c + 3].
    bool in[2];
    float w[2];
    uint32_t G[2][kJ], U[2][kJ];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tr = lr + 8 * r;
      const int src = r ? src1 : src0;
      in[r] = tr < c.rows;
      const int64_t row = c.row0 + tr;
      // the routing weight of the row: 0 for a padding row, 1 without row_scale (weights before the experts)
      w[r] = 1.f;
      if (p.row_scale != nullptr)
        w[r] = src >= 0 && in[r] ? __ldg(p.row_scale + gather_index(p, static_cast<int>(row))) : 0.f;
      const uint16_t* hr = p.h + (in[r] ? row : c.row0) * 2 * I;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const int col = c.n0 + 8 * j + 2 * q;
        const bool ok = in[r] && col < I;
        if (inter) {
          const uint2 v = ok ? __ldg(reinterpret_cast<const uint2*>(hr + 2 * col)) : make_uint2(0u, 0u);
          G[r][j] = v.x;  // g0 u0
          U[r][j] = v.y;  // g1 u1
        } else {
          G[r][j] = ok ? __ldg(reinterpret_cast<const uint32_t*>(hr + col)) : 0u;
          U[r][j] = ok ? __ldg(reinterpret_cast<const uint32_t*>(hr + I + col)) : 0u;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = c.row0 + lr + 8 * r;
      uint16_t* dr = p.dh_bf16 + row * 2 * I;
      float part = 0.f;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const int col = c.n0 + 8 * j + 2 * q;
        if (!in[r] || col >= I) continue;
        // dY' as the gather GEMM stores it (+ 0, its bias-free output, so -0 is +0; then bf16)
        const uint32_t d2 = cvt_bf16x2(__fadd_rn(fin[4 * j + 2 * r], 0.f), __fadd_rn(fin[4 * j + 2 * r + 1], 0.f));
        const uint32_t g2 = inter ? __byte_perm(G[r][j], U[r][j], 0x5410) : G[r][j];
        const uint32_t u2 = inter ? __byte_perm(G[r][j], U[r][j], 0x7632) : U[r][j];
        float dg[2], du[2], y[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float d = __uint_as_float(e ? d2 & 0xFFFF0000u : d2 << 16);
          const float g = __uint_as_float(e ? g2 & 0xFFFF0000u : g2 << 16);
          const float u = __uint_as_float(e ? u2 & 0xFFFF0000u : u2 << 16);
          dswiglu_element<PLAIN>(d, g, u, w[r], p.act, dg[e], du[e], y[e], part);
        }
        if (p.act_bf16 != nullptr) *reinterpret_cast<uint32_t*>(p.act_bf16 + row * I + col) = pack_bf16x2(y[0], y[1]);
        if (inter) {
          *reinterpret_cast<uint2*>(dr + 2 * col) = make_uint2(pack_bf16x2(dg[0], du[0]), pack_bf16x2(dg[1], du[1]));
        } else {
          *reinterpret_cast<uint32_t*>(dr + col) = pack_bf16x2(dg[0], dg[1]);
          *reinterpret_cast<uint32_t*>(dr + I + col) = pack_bf16x2(du[0], du[1]);
        }
      }
      // (s0 + s1) + (s2 + s3) over the row's quad: every lane of the quad ends with the same sum
      part = add_rn(part, __shfl_xor_sync(0xffffffffu, part, 1));
      part = add_rn(part, __shfl_xor_sync(0xffffffffu, part, 2));
      if (in[r] && q == 0) p.tw_part[row * ntw + c.n0 / 128] = part;
    }
  }

  // The math threads t (< 256) of every CTA after the tile loop: the rows past the last group (from
  // `end`) of dH and tw_part are zero.
  static __device__ __forceinline__ void tail(const GroupedMParams& p, int64_t end, int64_t, int t) {
    const int64_t rows = p.m - end, C2 = 2 * static_cast<int64_t>(p.n), ntw = (p.n + 127) / 128;
    if (rows <= 0) return;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * 256 + t, stride = static_cast<int64_t>(gridDim.x) * 256;
    uint4* dh = reinterpret_cast<uint4*>(p.dh_bf16 + end * C2);  // 2 C2 bytes a row, a multiple of 16
    for (int64_t i = first; i < rows * C2 / 8; i += stride) dh[i] = make_uint4(0, 0, 0, 0);
    for (int64_t i = first; i < rows * ntw; i += stride) p.tw_part[end * ntw + i] = 0.f;
    if (p.act_bf16 == nullptr) return;
    uint4* act = reinterpret_cast<uint4*>(p.act_bf16 + end * p.n);  // 2 I bytes a row, a multiple of 16
    for (int64_t i = first; i < rows * p.n / 8; i += stride) act[i] = make_uint4(0, 0, 0, 0);
  }
};

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
