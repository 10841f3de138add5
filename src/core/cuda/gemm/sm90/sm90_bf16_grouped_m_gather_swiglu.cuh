// sm_90a bf16 grouped GEMM on routed rows with the SwiGLU epilogue: the bf16 MoE layer's up projection.
// The mainloop is the bf16 gather GEMM's (GroupedMGather<128, ., bf16, true>: h = gather(x) . w13[e]^T
// (M, 2I), + b13[e] when given). The math threads store each tile as h (bf16 as the unfused layer has
// it: the GEMM's bf16, then + bias in fp32 rounded again, mxmoe's add_group_bias) and write
//   act(h) = swiglu(gate, up)  (M, I) bf16, the bits of mxmoe_swiglu on the stored h,
// so GEMM2 reads act(h) without a SwiGLU pass over h (2I bf16 read, I written a row). Two layouts:
//   concatenated (Interleaved_ false, I % 64 == 0): both halves in one tile. Tile n0 = 128 j loads B's
//     gate rows 64 j .. + 63 and its up rows I + 64 j .. + 63 (two 64-row boxes, as every tile's B), so
//     a math thread holds a (gate, up) pair of the same column in accumulators j and j + 8: act needs no
//     other tile. The tile's h (two 64-column runs) and act (one) are staged in shared memory in the
//     plain epilogue's swizzled layout and stored by the warpgroup in 16-byte row chunks (128 bytes of a
//     row per 8 threads), masked by the group's rows;
//   interleaved (gpt-oss, Interleaved_ true): a thread's column pair is one (gate, up) pair, so every
//     tile gives its 64 act columns alone; stored from registers.
// No quantization, so no fourth warpgroup: the math warpgroups store bf16 to global memory themselves.
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
  static constexpr bool kHalves = !Interleaved_;
  // Halves: tile n0 reads gate rows n0 / 2 .. and up rows n0 / 2 + I ..; its h columns are the same.
  static __device__ __forceinline__ int load_n0(int n0, int) { return kHalves ? n0 / 2 : n0; }
  static __device__ __forceinline__ int b_second_half(int n) { return kHalves ? n / 2 : Base::kBlockN / 2; }
  // Halves: each math warpgroup's act staging (64 rows x 128 bytes, the layout of one h box) after the
  // epilogue buffer, which stages the tile's h.
  static constexpr int kActWgBytes = 64 * 128;
  static constexpr int kEpiExtraBytes = kHalves ? 2 * kActWgBytes : 0;
  // Base::smem_bytes plus the act staging and the third group table the fused epilogues' kernel path
  // writes (G + 1 ints).
  static constexpr size_t smem_bytes(int groups) {
    return Base::smem_bytes(groups) + kEpiExtraBytes + (static_cast<size_t>(groups) + 1) * sizeof(int);
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
  // 8 j + 2 (lane % 4) + {0, 1} of the tile (halves: columns 8 j of the gate run for j < 8, of the up run
  // for j >= 8): h and act(h) of the tile. Rows outside the group and columns past 2I are left alone.
  template <bool PLAIN>
  static __device__ __forceinline__ void handoff(const GroupedMParams& p, const TileCoord& c,
                                                 const float (&fin)[Base::kAcc], uint8_t* smem_epi, uint32_t,
                                                 int mw, int warp, int lane, int, int, typename Base::HandoffState&) {
    if constexpr (kHalves)
      handoff_halves<PLAIN>(p, c, fin, smem_epi, mw, warp, lane);
    else
      handoff_interleaved<PLAIN>(p, c, fin, mw, warp, lane);
  }

  template <bool PLAIN>
  static __device__ __forceinline__ void handoff_halves(const GroupedMParams& p, const TileCoord& c,
                                                        const float (&fin)[Base::kAcc], uint8_t* smem_epi, int mw,
                                                        int warp, int lane) {
    const int I = p.n / 2, n0 = c.n0 / 2, q = lane & 3, lt = warp * 32 + lane;
    uint8_t* epi = smem_epi + mw * Base::kEpiWgBytes;  // h: box 0 the gate run, box 1 the up run
    uint8_t* act = smem_epi + Base::kEpiBytes + mw * kActWgBytes;
    // The previous tile's staging has been read out by every thread of the warpgroup.
    asm volatile("bar.sync %0, 128;" ::"r"(1 + mw) : "memory");
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int lr = warp * 16 + lane / 4 + 8 * r;  // row in this warpgroup's 64
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = n0 + 8 * j + 2 * q;  // the gate column; its up column is I + col
        const uint32_t g2 = h_pair(p, c.g, col, fin[4 * j + 2 * r], fin[4 * j + 2 * r + 1]);
        const uint32_t u2 = h_pair(p, c.g, I + col, fin[4 * (j + 8) + 2 * r], fin[4 * (j + 8) + 2 * r + 1]);
        float a[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float g = __uint_as_float(e ? g2 & 0xFFFF0000u : g2 << 16);
          const float u = __uint_as_float(e ? u2 & 0xFFFF0000u : u2 << 16);
          a[e] = swiglu_value<PLAIN>(g, u, p.act);
        }
        // chunk j of a 128-byte box row at chunk j ^ (lr % 8); the pair at byte 4 q of it
        const int off = lr * 128 + 16 * (j ^ (lr & 7)) + 4 * q;
        *reinterpret_cast<uint32_t*>(epi + off) = g2;
        *reinterpret_cast<uint32_t*>(epi + 64 * 128 + off) = u2;
        *reinterpret_cast<uint32_t*>(act + off) = pack_bf16x2(a[0], a[1]);
      }
    }
    asm volatile("bar.sync %0, 128;" ::"r"(1 + mw) : "memory");
    // Copy-out: thread lt takes chunk lt % 8 of rows lt / 8 + 16 i of the three runs (8 threads a
    // 128-byte row run); rows past the group are not written (they are the next group's).
    const int rows_here = c.rows - mw * 64, ch = lt & 7;
    auto* h = static_cast<uint16_t*>(p.out);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int lr = lt / 8 + 16 * i;
      const int off = lr * 128 + 16 * (ch ^ (lr & 7));
      const uint4 vg = *reinterpret_cast<const uint4*>(epi + off);
      const uint4 vu = *reinterpret_cast<const uint4*>(epi + 64 * 128 + off);
      const uint4 va = *reinterpret_cast<const uint4*>(act + off);
      if (lr < rows_here) {
        const int64_t row = c.row0 + mw * 64 + lr;
        *reinterpret_cast<uint4*>(h + row * p.n + n0 + 8 * ch) = vg;
        *reinterpret_cast<uint4*>(h + row * p.n + I + n0 + 8 * ch) = vu;
        *reinterpret_cast<uint4*>(p.act_bf16 + row * I + n0 + 8 * ch) = va;
      }
    }
  }

  template <bool PLAIN>
  static __device__ __forceinline__ void handoff_interleaved(const GroupedMParams& p, const TileCoord& c,
                                                             const float (&fin)[Base::kAcc], int mw, int warp,
                                                             int lane) {
    const int N = p.n, I = N / 2, q = lane & 3;
    const int lr = mw * 64 + warp * 16 + lane / 4;
    auto* h = static_cast<uint16_t*>(p.out);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tr = lr + 8 * r;
      const bool in = tr < c.rows;
      const int64_t row = c.row0 + tr;
#pragma unroll
      for (int j = 0; j < Base::kAcc / 4; ++j) {
        const int col = c.n0 + 8 * j + 2 * q;  // h's column
        if (col >= N || !in) continue;
        const uint32_t v = h_pair(p, c.g, col, fin[4 * j + 2 * r], fin[4 * j + 2 * r + 1]);
        *reinterpret_cast<uint32_t*>(h + row * N + col) = v;
        const float a = swiglu_value<PLAIN>(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u), p.act);
        p.act_bf16[row * I + col / 2] = static_cast<uint16_t>(pack_bf16x2(a, 0.f) & 0xFFFFu);
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
