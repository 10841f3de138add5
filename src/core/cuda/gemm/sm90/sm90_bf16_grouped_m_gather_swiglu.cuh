// sm_90a bf16 grouped GEMM on routed rows with the SwiGLU epilogue: the bf16 MoE layer's up projection.
// The mainloop is the bf16 gather GEMM's (GroupedMGather<128, ., bf16, true>: h = gather(x) . w13[e]^T
// (M, 2I), gate | up halves concatenated). A CTA takes its tiles in pairs (kPairs, as the FP8 SwiGLU
// variant): the gate tile (one group's rows, columns n0 .. n0 + 127) and then the up tile (I + n0 ..),
// so that its math threads hold both halves of 128 columns of act(h). They store each tile as h (bf16,
// as the gather GEMM stores it; the pre-activation kept for the backward), keep the gate tile in
// registers (32 bf16 pairs a thread) through the up tile's mainloop, and after it write
//   act(h) = swiglu(gate, up)  (M, I) bf16, the bits of mxmoe_swiglu on the stored h,
// so GEMM2 reads act(h) without a SwiGLU pass over h (2I bf16 read, I written a row). No quantization,
// so no fourth warpgroup: the math warpgroups store bf16 pairs straight to global memory.
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
struct GroupedMGatherSwigluBf16 : GroupedMGather<128, Stages_, __nv_bfloat16, true, false> {
  using Base = GroupedMGather<128, Stages_, __nv_bfloat16, true, false>;
  static constexpr bool kFusedEpilogue = true;
  static constexpr bool kPairs = true;
  // The gate tile of the current pair as h stores it: bf16 pairs [2 j + r] (rows lr + 8 r, columns
  // 8 j + 2 (lane % 4) + {0, 1}).
  struct HandoffState {
    uint32_t gate[Base::kAcc / 2];
  };
  // Base::smem_bytes plus the third group table the fused epilogues' kernel path writes (G + 1 ints).
  static constexpr size_t smem_bytes(int groups) {
    return Base::smem_bytes(groups) + (static_cast<size_t>(groups) + 1) * sizeof(int);
  }
  static __device__ __forceinline__ void prefetch_tile(const GroupedMParams&, const TileCoord&, int) {}

  // A math thread (mw, warp, lane) after a tile's mainloop, holding rows lr and lr + 8, columns
  // 8 j + 2 (lane % 4) + {0, 1}: the tile stored as h (+ 0, the bias-free output, so -0 is +0; then
  // bf16); after the up tile, act(h) of the pair's columns (rows outside the tile are left alone).
  template <bool PLAIN>
  static __device__ __forceinline__ void handoff(const GroupedMParams& p, const TileCoord& c,
                                                 const float (&fin)[Base::kAcc], uint8_t*, uint32_t, int mw,
                                                 int warp, int lane, int, int, HandoffState& hs) {
    const int I = p.n / 2, q = lane & 3;
    const int lr = mw * 64 + warp * 16 + lane / 4;
    const bool up = c.n0 >= I;
    auto* h = static_cast<uint16_t*>(p.out);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tr = lr + 8 * r;
      const bool in = tr < c.rows;
      const int64_t row = c.row0 + tr;
#pragma unroll
      for (int j = 0; j < Base::kAcc / 4; ++j) {
        const int col = 8 * j + 2 * q;
        const uint32_t v = cvt_bf16x2(__fadd_rn(fin[4 * j + 2 * r], 0.f), __fadd_rn(fin[4 * j + 2 * r + 1], 0.f));
        if (in) *reinterpret_cast<uint32_t*>(h + row * p.n + c.n0 + col) = v;
        if (!up) {
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
          *reinterpret_cast<uint32_t*>(p.act_bf16 + row * I + (c.n0 - I) + col) = pack_bf16x2(a[0], a[1]);
        }
      }
    }
  }

  // The math threads t (< 256) of every CTA after the tile loop: the rows past the last group (from
  // `end`) of h and act(h) are zero (as the gather GEMM's rows past the groups, and swiglu(0, 0)).
  static __device__ __forceinline__ void tail(const GroupedMParams& p, int64_t end, int64_t, int t) {
    const int64_t rows = p.m - end, n = p.n;
    if (rows <= 0) return;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * 256 + t, stride = static_cast<int64_t>(gridDim.x) * 256;
    uint4* h = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + end * n);  // 2 n bytes a row, % 16 == 0
    for (int64_t i = first; i < rows * n / 8; i += stride) h[i] = make_uint4(0, 0, 0, 0);
    uint4* act = reinterpret_cast<uint4*>(p.act_bf16 + end * (n / 2));
    for (int64_t i = first; i < rows * n / 16; i += stride) act[i] = make_uint4(0, 0, 0, 0);
  }
};

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
