// sm_90a bf16 grouped GEMM on routed rows with the SwiGLU epilogue: the bf16 MoE layer's up projection.
// The mainloop is the bf16 gather GEMM's (GroupedMGather<128, ., bf16, true>: h = gather(x) . w13[e]^T
// (M, 2I), + b13[e] when given). The math threads store each tile as h (bf16 as the unfused layer has
// it: the GEMM's bf16, then + bias in fp32 rounded again, mxmoe's add_group_bias) and write
//   act(h) = swiglu(gate, up)  (M, I) bf16, the bits of mxmoe_swiglu on the stored h,
// so GEMM2 reads act(h) without a SwiGLU pass over h (2I bf16 read, I written a row). Two layouts:
//   concatenated (Interleaved_ false): a CTA takes its tiles in pairs (kPairs, as the FP8 SwiGLU
//     variant): the gate tile (columns n0 .. n0 + 127) and then the up tile (I + n0 ..); the math
//     threads keep the gate tile in registers (32 bf16 pairs a thread) through the up tile's mainloop;
//   interleaved (gpt-oss, Interleaved_ true): a thread's column pair is one (gate, up) pair, so every
//     tile gives its 64 act columns alone.
// No quantization, so no fourth warpgroup: the math warpgroups store bf16 straight to global memory.
#pragma once

#include <cuda_bf16.h>

#include "common/moe_activation.hpp"
#include "cuda/common/bf16_pack.cuh"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_1x128_128x128.cuh"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace sm90 {

template <int Stages_, bool Interleaved_ = false>
struct GroupedMGatherSwigluBf16 : GroupedMGather<128, Stages_, __nv_bfloat16, true, false> {
  using Base = GroupedMGather<128, Stages_, __nv_bfloat16, true, false>;
  static constexpr bool kFusedEpilogue = true;
  static constexpr bool kPairs = !Interleaved_;
  // Concatenated: the gate tile of the current pair as h stores it, bf16 pairs [2 j + r] (rows lr + 8 r,
  // columns 8 j + 2 (lane % 4) + {0, 1}).
  struct HandoffState {
    uint32_t gate[Interleaved_ ? 1 : Base::kAcc / 2];
  };
  // Base::smem_bytes plus the third group table the fused epilogues' kernel path writes (G + 1 ints).
  static constexpr size_t smem_bytes(int groups) {
    return Base::smem_bytes(groups) + (static_cast<size_t>(groups) + 1) * sizeof(int);
  }
  static __device__ __forceinline__ void prefetch_tile(const GroupedMParams&, const TileCoord&, int) {}

  // h's bf16 pair at columns (col, col + 1) of group g: the GEMM's bf16 (+ 0, the bias-free output, so
  // -0 is +0), then + bias in fp32 rounded to bf16 once more where a bias is given.
  static __device__ __forceinline__ uint32_t h_pair(const GroupedMParams& p, int g, int col, float x, float y) {
    const uint32_t v = cvt_bf16x2(__fadd_rn(x, 0.f), __fadd_rn(y, 0.f));
    if (p.bias == nullptr) return v;
    const int64_t o = g * p.bias_s0 + static_cast<int64_t>(col) * p.bias_s1;
    float b0, b1;
    if (p.bias_bf16) {
      const auto* bb = static_cast<const uint16_t*>(p.bias);
      b0 = bf16_to_f32(bb[o]);
      b1 = bf16_to_f32(bb[o + p.bias_s1]);
    } else {
      const auto* bf = static_cast<const float*>(p.bias);
      b0 = bf[o];
      b1 = bf[o + p.bias_s1];
    }
    return pack_bf16x2(__fadd_rn(__uint_as_float(v << 16), b0), __fadd_rn(__uint_as_float(v & 0xFFFF0000u), b1));
  }

  // A math thread (mw, warp, lane) after a tile's mainloop, holding rows lr and lr + 8, columns
  // 8 j + 2 (lane % 4) + {0, 1}: the tile stored as h; act(h) of its columns (interleaved) or, after the
  // up tile, of the pair's (concatenated). Rows outside the tile and columns past 2I are left alone.
  template <bool PLAIN>
  static __device__ __forceinline__ void handoff(const GroupedMParams& p, const TileCoord& c,
                                                 const float (&fin)[Base::kAcc], uint8_t*, uint32_t, int mw,
                                                 int warp, int lane, int, int, HandoffState& hs) {
    const int N = p.n, I = N / 2, q = lane & 3;
    const int lr = mw * 64 + warp * 16 + lane / 4;
    const bool up = !Interleaved_ && c.n0 >= I;
    auto* h = static_cast<uint16_t*>(p.out);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tr = lr + 8 * r;
      const bool in = tr < c.rows;
      const int64_t row = c.row0 + tr;
#pragma unroll
      for (int j = 0; j < Base::kAcc / 4; ++j) {
        const int col = c.n0 + 8 * j + 2 * q;  // h's column
        if (Interleaved_ && col >= N) continue;
        const uint32_t v = h_pair(p, c.g, col, fin[4 * j + 2 * r], fin[4 * j + 2 * r + 1]);
        if (in) *reinterpret_cast<uint32_t*>(h + row * N + col) = v;
        if constexpr (Interleaved_) {
          if (in) {
            const float a = swiglu_value<PLAIN>(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u), p.act);
            p.act_bf16[row * I + col / 2] = static_cast<uint16_t>(pack_bf16x2(a, 0.f) & 0xFFFFu);
          }
        } else if (!up) {
          hs.gate[2 * j + r] = v;
        } else if (in) {
          const uint32_t g2 = hs.gate[2 * j + r];
          float a[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float g = __uint_as_float(e ? g2 & 0xFFFF0000u : g2 << 16);
            const float u = __uint_as_float(e ? v & 0xFFFF0000u : v << 16);
            a[e] = swiglu_value<PLAIN>(g, u, p.act);
          }
          *reinterpret_cast<uint32_t*>(p.act_bf16 + row * I + (col - I)) = pack_bf16x2(a[0], a[1]);
        }
      }
    }
  }

  // The math threads t (< 256) of every CTA after the tile loop: the rows past the last group (from
  // `end`) of h and act(h) are zero (as the gather GEMM's rows past the groups, no bias there, and
  // swiglu(0, 0)).
  static __device__ __forceinline__ void tail(const GroupedMParams& p, int64_t end, int64_t, int t) {
    const int64_t rows = p.m - end, n = p.n;
    if (rows <= 0) return;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * 256 + t, stride = static_cast<int64_t>(gridDim.x) * 256;
    uint16_t* h = static_cast<uint16_t*>(p.out) + end * n;
    for (int64_t i = first; i < rows * n; i += stride) h[i] = 0;
    uint16_t* act = p.act_bf16 + end * (n / 2);
    for (int64_t i = first; i < rows * (n / 2); i += stride) act[i] = 0;
  }
};

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
