// sm_90a bf16 grouped GEMM on routed rows with the dSwiGLU epilogue: the bf16 MoE layer's
// down-projection dgrad. The mainloop is the bf16 gather GEMM's (GroupedMGather<128, ., bf16, true,
// true>: dY' = gather(dout) . w2[e], w2 (E, H, I) read as it lies); dY' is never stored. Each 128 x 128
// tile of it (one group's rows, columns n0 .. n0 + 127 of I) becomes:
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
// SwiGLU backward, the weights' gradient) and h read twice.
// A fourth warpgroup runs the epilogue one tile behind: the math warpgroups put dY' in shared memory (S)
// and run the next tile's mainloop while the epilogue warpgroup turns the tile into dH, act and the
// partials, a warp per row with its lanes across the columns (lane l: columns 4 l .. 4 l + 3), so every
// h load and dH / act store of a warp is one contiguous run of the row. The partials' order (lane q of
// 4 summing columns 8 j + 2 q + e) is rebuilt through a per-warp scratch of 8 rows' fp32 products.
// Measured against the two forms it replaced (docs/design/gemm-sm90.md): the epilogue in the math
// warpgroups (h and dH as bf16 pairs of two rows a thread) and a fourth warpgroup with one thread per
// row, whose 16-byte accesses touched 32 rows' lines each.
#pragma once

#include <cuda_bf16.h>

#include "common/moe_activation.hpp"
#include "cuda/common/bf16_pack.cuh"
#include "cuda/gemm/sm90/sm90_epilogue_handoff.cuh"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_1x128_128x128.cuh"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace sm90 {

template <int Stages_>
struct GroupedMGatherDSwigluBf16 : GroupedMGather<128, Stages_, __nv_bfloat16, true, true> {
  using Base = GroupedMGather<128, Stages_, __nv_bfloat16, true, true>;
  static constexpr bool kFusedEpilogue = true;
  static constexpr bool kEpiWarpgroup = true;
  static constexpr int kThreads = 512;  // producer, two math warpgroups, epilogue
  static constexpr bool kOverlap = false;  // (an FP8 promotion setting; bf16 accumulates in place)
  static constexpr int kProducerRegs = 40, kMathRegs = 168, kEpiRegs = 136;
  static_assert(kProducerRegs + 2 * kMathRegs + kEpiRegs <= 512, "four warpgroups share 64K registers");
  static_assert(Base::kEpiBytes == kHandoffTileBytes, "the epilogue buffer holds one hand-over tile");
  // A warp's scratch: 8 rows of 128 fp32 products, rows 136 words apart (two wavefronts a 64-bit read).
  static constexpr int kScratchStride = 136, kScratchBytes = 4 * 8 * kScratchStride * 4;
  // After S: the hand-over barriers (full: 256 math threads stored their dY'; empty: 128 epilogue
  // threads read theirs), then the four warps' scratch.
  static constexpr int kEpiExtraBytes = 16 + kScratchBytes;
  static constexpr size_t smem_bytes(int groups) {
    return Base::smem_bytes(groups) + kEpiExtraBytes + (static_cast<size_t>(groups) + 1) * sizeof(int);
  }
  static __device__ __forceinline__ uint64_t* handoff_bars(uint8_t* smem_epi) {
    return reinterpret_cast<uint64_t*>(smem_epi + kHandoffTileBytes);
  }
  static __device__ __forceinline__ float* scratch(uint8_t* smem_epi, int warp) {
    return reinterpret_cast<float*>(smem_epi + kHandoffTileBytes + 16) + warp * 8 * kScratchStride;
  }
  static __device__ __forceinline__ void init_handoff(uint8_t* smem_epi) {
    uint64_t* bars = handoff_bars(smem_epi);
    cutlass::arch::ClusterBarrier::init(&bars[0], 256);
    cutlass::arch::ClusterBarrier::init(&bars[1], 128);
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

  // A math thread (mw, warp, lane) after its tile's mainloop, holding rows lr and lr + 8, columns
  // 8 j + 2 (lane % 4) + {0, 1} of dY': the rows as bf16 pairs into S once the epilogue warpgroup has
  // freed it (phase ph), then on to the next tile.
  template <bool PLAIN>
  static __device__ __forceinline__ void handoff(const GroupedMParams&, const TileCoord&,
                                                 const float (&fin)[Base::kAcc], uint8_t* smem_epi, uint32_t ph,
                                                 int mw, int warp, int lane, int, int, typename Base::HandoffState&) {
    constexpr int kJ = Base::kAcc / 4;
    uint64_t* bars = handoff_bars(smem_epi);
    const int lr = mw * 64 + warp * 16 + lane / 4, q = lane & 3;
    // dY' as the gather GEMM stores it (+ 0, its bias-free output, so -0 is +0; then bf16)
    uint32_t d[kJ][2];
#pragma unroll
    for (int j = 0; j < kJ; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        d[j][r] = cvt_bf16x2(__fadd_rn(fin[4 * j + 2 * r], 0.f), __fadd_rn(fin[4 * j + 2 * r + 1], 0.f));
    cutlass::arch::ClusterBarrier::wait(&bars[1], ph ^ 1u);
#pragma unroll
    for (int j = 0; j < kJ; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(smem_epi + handoff_offset(lr + 8 * r, j) + 4 * q) = d[j][r];
    cutlass::arch::ClusterBarrier::arrive(&bars[0]);
  }

  // The epilogue warpgroup's thread et (< 128) on one tile (hand-over phase ph). Warp ew takes tile rows
  // 32 ew .. 32 ew + 31 in blocks of 8, lane l columns n0 + 4 l .. + 3 of each (inside I or none: I %
  // 64 == 0). h is read 4 rows ahead of its use; each row's products <bf16(dY'), act(h)> go to the
  // warp's scratch, and after a block lane 4 rs + q sums row rs's columns 8 j + 2 q + e (j, e
  // ascending, from +0: a column past I adds +0, which leaves every such sum as it is), then (s0 + s1)
  // + (s2 + s3).
  template <bool PLAIN>
  static __device__ __forceinline__ void epilogue_tile(const GroupedMParams& p, const TileCoord& c, int et,
                                                       uint8_t* smem_epi, const int*, const int*, int, uint32_t ph) {
    uint64_t* bars = handoff_bars(smem_epi);
    const int I = p.n, ntw = (I + 127) / 128;
    const int64_t C2 = 2 * static_cast<int64_t>(I);
    const bool inter = p.act.layout == kSwigluInterleaved;
    const int ew = et >> 5, lane = et & 31;
    const int col = c.n0 + 4 * lane;
    const bool col_ok = col < I;
    const int r0 = 32 * ew;  // the warp's first tile row
    float* sc = scratch(smem_epi, ew);
    // The routing weight of row r0 + lane (0 for a padding row, 1 without row_scale), shuffled per row.
    float w_lane = 1.f;
    if (p.row_scale != nullptr) {
      const int r = r0 + lane;
      const int src = r < c.rows ? gather_row(p, c.row0 + r) : -1;
      w_lane = src >= 0 ? __ldg(p.row_scale + gather_index(p, c.row0 + r)) : 0.f;
    }
    // h's words of a row at this lane's columns: concatenated, the gate pair words (x, y) and the up
    // pair words (z, w); interleaved, the 4 (gate, up) words. A ring of 4 rows.
    auto load = [&](int r) {
      if (r >= c.rows || !col_ok) return make_uint4(0, 0, 0, 0);
      const uint16_t* hr = p.h + (c.row0 + r) * C2;
      if (inter) return __ldg(reinterpret_cast<const uint4*>(hr + 2 * col));
      const uint2 g = __ldg(reinterpret_cast<const uint2*>(hr + col));
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(hr + I + col));
      return make_uint4(g.x, g.y, u.x, u.y);
    };
    uint4 H[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) H[i] = load(r0 + i);
    cutlass::arch::ClusterBarrier::wait(&bars[0], ph);
#pragma unroll 1
    for (int b = 0; b < 4; ++b) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = r0 + 8 * b + i;
        const uint4 hw = H[i % 4];
        if (8 * b + i + 4 < 32) H[i % 4] = load(r + 4);
        const float w = __shfl_sync(0xffffffffu, w_lane, 8 * b + i);
        const uint2 d2 = *reinterpret_cast<const uint2*>(smem_epi + handoff_offset(r, lane >> 1) + 8 * (lane & 1));
        const bool on = r < c.rows && col_ok;
        float prod[4] = {0.f, 0.f, 0.f, 0.f};
        if (on) {
          const uint32_t dw[2] = {d2.x, d2.y};
          const uint32_t hwd[4] = {hw.x, hw.y, hw.z, hw.w};
          float dg[4], du[4], y[4];
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            const float d = __uint_as_float(t & 1 ? dw[t / 2] & 0xFFFF0000u : dw[t / 2] << 16);
            // concatenated: gate word t / 2 (x, y), up word 2 + t / 2 (z, w); interleaved: word t is (g, u)
            const uint32_t gw = inter ? hwd[t] << 16 : (t & 1 ? hwd[t / 2] & 0xFFFF0000u : hwd[t / 2] << 16);
            const uint32_t uw = inter ? hwd[t] & 0xFFFF0000u
                                      : (t & 1 ? hwd[2 + t / 2] & 0xFFFF0000u : hwd[2 + t / 2] << 16);
            dswiglu_element<PLAIN>(d, __uint_as_float(gw), __uint_as_float(uw), w, p.act, dg[t], du[t], y[t],
                                  prod[t]);
          }
          const int64_t row = c.row0 + r;
          uint16_t* dr = p.dh_bf16 + row * C2;
          if (inter) {
            *reinterpret_cast<uint4*>(dr + 2 * col) = make_uint4(pack_bf16x2(dg[0], du[0]), pack_bf16x2(dg[1], du[1]),
                                                                 pack_bf16x2(dg[2], du[2]), pack_bf16x2(dg[3], du[3]));
          } else {
            *reinterpret_cast<uint2*>(dr + col) = make_uint2(pack_bf16x2(dg[0], dg[1]), pack_bf16x2(dg[2], dg[3]));
            *reinterpret_cast<uint2*>(dr + I + col) = make_uint2(pack_bf16x2(du[0], du[1]), pack_bf16x2(du[2], du[3]));
          }
          if (p.act_bf16 != nullptr)
            *reinterpret_cast<uint2*>(p.act_bf16 + row * I + col) =
                make_uint2(pack_bf16x2(y[0], y[1]), pack_bf16x2(y[2], y[3]));
        }
        // dswiglu_element added each product to its +0 start: a -0 product is +0 here, which no sum
        // from +0 can tell apart
        *reinterpret_cast<float4*>(sc + i * kScratchStride + 4 * lane) = make_float4(prod[0], prod[1], prod[2], prod[3]);
      }
      __syncwarp();
      // lane 4 rs + q: sum q of row rs of the block
      const int rs = lane >> 2, q = lane & 3;
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float2 v = *reinterpret_cast<const float2*>(sc + rs * kScratchStride + 8 * j + 2 * q);
        s = add_rn(add_rn(s, v.x), v.y);
      }
      const float s2 = add_rn(s, __shfl_xor_sync(0xffffffffu, s, 1));  // q 0: s0 + s1; q 2: s2 + s3
      const float tot = add_rn(s2, __shfl_xor_sync(0xffffffffu, s2, 2));
      const int r = r0 + 8 * b + rs;
      if (q == 0 && r < c.rows) p.tw_part[(static_cast<int64_t>(c.row0) + r) * ntw + c.n0 / 128] = tot;
      __syncwarp();  // the scratch is read before the next block writes it
    }
    cutlass::arch::ClusterBarrier::arrive(&bars[1]);  // S read: the next tile's dY' may come
  }
};

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
