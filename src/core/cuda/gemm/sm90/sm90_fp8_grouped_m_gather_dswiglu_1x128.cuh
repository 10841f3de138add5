// sm_90a FP8 grouped GEMM on routed rows with the dSwiGLU epilogue: the MoE layer's down-projection
// dgrad. The mainloop is the gather GEMM's (sm90_fp8_grouped_m_1x128_128x128.cuh, GroupedMGather at
// BlockN 128): dY' = gather(dout) . w2[e] (M, I), the routed rows unweighted. dY' is never stored; each
// 128 x 128 tile of it (one group's rows, columns n0 .. n0 + 127 of I) becomes, in the epilogue:
//   dH = act'(h, w * bf16(dY'))  rounded to bf16, gate columns n0 + c and up columns I + n0 + c, from
//        the saved pre-activation h (M, 2I) and the routing weight w of each row, exactly as the
//        SWIGLU_BACKWARD quantize source computes it from a stored bf16 dY' (cuda/quantize/source.cuh);
//   dh_q / dh_scale     its rowwise 1x128 operand (the up projection's dgrad): the tile's gate columns
//                       and its up columns are one block each (I % 128 == 0, concatenated halves);
//   dh_qt / dh_scale_t  its columnwise 128x1 operand (the up projection's wgrad), transposed: the
//                       tile's rows are one block (tiles start at group starts, as the quantize pass's
//                       panels), staged through shared memory and stored as 128-byte column runs;
//   (both code forms are staged in the 32 KB epilogue buffer as 128 x 128 boxes and leave by TMA for
//   whole, aligned tiles (p.dh_tma: the launcher's maps of dh_q and dh_qt), else by the threads;)
//   tw_part             per row, <bf16(dY'), act(h)> over the tile's 128 columns (the routing
//                       weights' gradient, summed over the column tiles by the caller): the expert
//                       outputs are never needed.
// The codes and scales are bit for bit those of the gather GEMM writing bf16 dY' followed by the tile128
// quantize pass over the SWIGLU_BACKWARD source. Bytes: h read once, the two FP8 forms written once,
// instead of dY' written, read twice (quantize pass, weights' gradient) and h read twice.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "common/moe_activation.hpp"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_1x128_128x128.cuh"
#include "cuda/quantize/common.cuh"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace sm90 {

template <int Stages_>
struct GroupedMGatherDSwiglu : GroupedMGather<128, Stages_, __nv_bfloat16> {
  using Base = GroupedMGather<128, Stages_, __nv_bfloat16>;
  static constexpr bool kDSwiglu = true;
  // After the epilogue buffer (which holds the tile's transposed codes, 256 columns x 128 rows): the
  // column maxima of each math warp's 16 rows [8 warps][128 packed column pairs], then the tile's 256
  // column reciprocals (NaN for a NaN scale) and scale bytes.
  static constexpr int kPartBytes = 8 * 128 * 4;
  static constexpr int kRecipOff = kPartBytes;
  static constexpr int kScaleOff = kRecipOff + 256 * 4;
  static constexpr int kEpiExtraBytes = kScaleOff + 256;
  static_assert(Base::kEpiBytes == 256 * 128, "the epilogue buffer holds one tile of transposed codes");
  static_assert(kEpiExtraBytes % 8 == 0, "the barriers after it stay 8-byte aligned");
  // Base::smem_bytes plus the extra region and the third group table (G + 1 ints).
  static constexpr size_t smem_bytes(int groups) {
    return Base::smem_bytes(groups) + kEpiExtraBytes + (static_cast<size_t>(groups) + 1) * sizeof(int);
  }

  // The producer warpgroup's thread t (< 128), at the start of a tile: tile row t's h (its 128 gate
  // and 128 up values) into L2, so that the epilogue's loads of h, ~10 us later, do not wait on HBM.
  static __device__ __forceinline__ void prefetch_tile(const GroupedMParams& p, const TileCoord& c, int t) {
    if (t >= c.rows) return;
    const uint16_t* row = p.h + (static_cast<int64_t>(c.row0) + t) * 2 * static_cast<int64_t>(p.n) + c.n0;
    prefetch_l2(row, 256);
    prefetch_l2(row + p.n, 256);
  }

  // One tile's epilogue, by both math warpgroups (256 threads; thread (mw, warp, lane) holds rows lr and
  // lr + 8 of the tile, columns 8 j + 2 (lane % 4) + {0, 1}, as the accumulator layout).
  template <bool PLAIN>
  static __device__ __forceinline__ void epilogue(const GroupedMParams& p, const TileCoord& c,
                                                  float (&fin)[Base::kAcc], int mw, int warp, int lane, int src0,
                                                  int src1, uint8_t* smem_epi, const int* s_end, const int* s_runs,
                                                  int nt, const CUtensorMap* map_q, const CUtensorMap* map_qt) {
    constexpr int kJ = Base::kAcc / 4;  // 16 chunks of 8 columns
    constexpr uint32_t kAbs2 = 0x7FFF7FFFu;
    const int I = p.n;
    const int64_t C2 = 2 * static_cast<int64_t>(I);
    const int q = lane & 3;
    const int lr = mw * 64 + warp * 16 + lane / 4;
    const int lt2 = mw * 128 + warp * 32 + lane;  // 0 .. 255 over both math warpgroups
    const bool in0 = lr < c.rows, in1 = lr + 8 < c.rows;
    const int64_t row0 = c.row0 + lr, row1 = row0 + 8;
    // The routing weight of each row (0 for a padding row, as dy_row_factor).
    const float f0 = src0 >= 0 ? __ldg(p.row_scale + gather_index(p, static_cast<int>(row0))) : 0.f;
    const float f1 = src1 >= 0 ? __ldg(p.row_scale + gather_index(p, static_cast<int>(row1))) : 0.f;
    // h's gate words of the thread's columns (bf16 pairs); the up words are I / 2 words further.
    const uint32_t* h0 = reinterpret_cast<const uint32_t*>(p.h + (in0 ? row0 : c.row0) * C2 + c.n0 + 2 * q);
    const uint32_t* h1 = reinterpret_cast<const uint32_t*>(p.h + (in1 ? row1 : c.row0) * C2 + c.n0 + 2 * q);
    const int up = I / 2;

    // All of the thread's h words first (64 loads in flight, from L2: the producer prefetched them).
    uint32_t HG[kJ][2], HU[kJ][2];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      HG[j][0] = in0 ? __ldg(h0 + 4 * j) : 0u;
      HU[j][0] = in0 ? __ldg(h0 + up + 4 * j) : 0u;
      HG[j][1] = in1 ? __ldg(h1 + 4 * j) : 0u;
      HU[j][1] = in1 ? __ldg(h1 + up + 4 * j) : 0u;
    }

    // dH as bf16 pairs: [2 j + r] = row lr + 8 r, columns 8 j + 2 q + {0, 1}; gate and up halves.
    uint32_t dg[2 * kJ], du[2 * kJ];
    float part[2] = {0.f, 0.f};
    auto swiglu = [&](auto moderate) {
      constexpr bool kModerate = decltype(moderate)::value;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const uint32_t hg[2] = {HG[j][0], HG[j][1]}, hu[2] = {HU[j][0], HU[j][1]};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float f = r ? f1 : f0;
          // dY' as the gather GEMM stores it (+ 0: its bias-free output, so -0 is stored as +0; then
          // bf16), times the row's weight.
          const uint32_t dp =
              qk::cvt_bf16x2(__fadd_rn(fin[4 * j + 2 * r], 0.f), __fadd_rn(fin[4 * j + 2 * r + 1], 0.f));
          float vg[2], vu[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float d = __uint_as_float(e ? dp & 0xFFFF0000u : dp << 16);
            const float g = __uint_as_float(e ? hg[r] & 0xFFFF0000u : hg[r] << 16);
            const float u = __uint_as_float(e ? hu[r] & 0xFFFF0000u : hu[r] << 16);
            float y;
            swiglu_grad_value<PLAIN, kModerate>(g, u, __fmul_rn(d, f), p.act, &vg[e], &vu[e], &y);
            part[r] = add_rn(part[r], mul_rn(d, y));
          }
          const bool in = r ? in1 : in0;
          dg[2 * j + r] = in ? qk::cvt_bf16x2(vg[0], vg[1]) : 0u;
          du[2 * j + r] = in ? qk::cvt_bf16x2(vu[0], vu[1]) : 0u;
        }
      }
    };
    if constexpr (PLAIN) {
      // The moderate sigmoid (3 instructions for the reciprocal instead of ~15) when no gate value of
      // the warp's tile rows is below -87: one vote, a branch around the unrolled loop.
      uint32_t gmax = 0;
#pragma unroll
      for (int j = 0; j < kJ; ++j) gmax = __vmaxu2(gmax, __vmaxu2(HG[j][0], HG[j][1]));
      if (__all_sync(0xffffffffu, bf16x2_sigmoid_moderate(gmax))) {
        swiglu(std::true_type{});
      } else {
        swiglu(std::false_type{});
      }
    } else {
      swiglu(std::false_type{});
    }

    // ---- routing weights' partials: the quad's 4 lanes' sums, (q0 + q1) + (q2 + q3) ----
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      part[r] = add_rn(part[r], __shfl_xor_sync(0xffffffffu, part[r], 1));
      part[r] = add_rn(part[r], __shfl_xor_sync(0xffffffffu, part[r], 2));
    }
    if (q == 0 && in0) p.tw_part[row0 * nt + c.n0 / 128] = part[0];
    if (q == 1 && in1) p.tw_part[row1 * nt + c.n0 / 128] = part[1];

    // ---- rowwise 1x128: each row's gate block and up block (the quad holds a row's 128 columns) ----
    uint32_t s_row[4];  // gate row lr, gate lr + 8, up lr, up lr + 8
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t* v = b < 2 ? dg : du;
      uint32_t m = 0;
#pragma unroll
      for (int j = 0; j < kJ; ++j) m = __vmaxu2(m, v[2 * j + (b & 1)] & kAbs2);
      uint32_t a = max(m << 16, m & 0xFFFF0000u);  // |bf16| maxima as fp32 bits (NaN above all)
      a = max(a, __shfl_xor_sync(0xffffffffu, a, 1));
      a = max(a, __shfl_xor_sync(0xffffffffu, a, 2));
      s_row[b] = e8m0_from_amax_bits(a, static_cast<mxmoe_scale_mode>(p.mode));
    }
    {
      // Lane q writes one of the four scale runs (4 bytes: the block's byte per 32 columns).
      const int b = q;
      const bool in = (b & 1) ? in1 : in0;
      if (in) {
        const int64_t row = (b & 1) ? row1 : row0;
        const int64_t col = (b < 2 ? 0 : I) + c.n0;
        *reinterpret_cast<uint32_t*>(p.dh_scale + row * (C2 / 32) + col / 32) =
            (b == 0 ? s_row[0] : b == 1 ? s_row[1] : b == 2 ? s_row[2] : s_row[3]) * 0x01010101u;
      }
    }
    // The codes go to shared memory first, then out whole: by two TMA stores (a whole tile, p.dh_tma) or
    // as 16-byte row runs, instead of an STG.U16 per 2 bytes (the MIO queue stalled on those). The
    // epilogue buffer holds the gate box then the up box, 128 rows x 128 bytes each, 16-byte chunk c
    // of row r at c ^ (r % 8) (TMA's 128-byte swizzle; a warp's 2-byte stores hit 16 banks once).
    uint8_t* tbuf = smem_epi;
    // (dh_qt's boxes start at row0 bytes into a row: TMA wants those 16-byte aligned.)
    const bool tma = p.dh_tma && c.rows == 128, tma_cols = tma && (c.row0 & 15) == 0;
    if (lt2 == 0) bulk_wait_group_read0();  // the previous tile's column codes have left tbuf (TMA)
    asm volatile("bar.sync 3, 256;" ::: "memory");  // ... and its column stores have read it
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t s = s_row[b];
      const float rc = qk::e8m0_recip(s);
      const uint32_t* v = b < 2 ? dg : du;
      const int rr = lr + 8 * (b & 1);
      uint8_t* rowp = tbuf + (b >> 1) * 128 * 128 + rr * 128 + 2 * q;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const uint32_t w = v[2 * j + (b & 1)];
        uint32_t code = qk::cvt_e4m3x2(__fmul_rn(__uint_as_float(w << 16), rc), __fmul_rn(__uint_as_float(w & 0xFFFF0000u), rc));
        code = s == kE8M0Nan ? 0x7F7Fu : code;
        *reinterpret_cast<uint16_t*>(rowp + 16 * ((j >> 1) ^ (rr & 7)) + 8 * (j & 1)) = static_cast<uint16_t>(code);
      }
    }
    if (tma) fence_async_shared();  // the staged rows, written by this thread, are read by TMA next

    // ---- columnwise 128x1 over the tile's rows: maxima per warp, then per column ----
    uint32_t* s_part = reinterpret_cast<uint32_t*>(smem_epi + Base::kEpiBytes);
    float* s_rc = reinterpret_cast<float*>(smem_epi + Base::kEpiBytes + kRecipOff);
    uint8_t* s_sc = smem_epi + Base::kEpiBytes + kScaleOff;
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const uint32_t* v = hf ? du : dg;
        uint32_t m = __vmaxu2(v[2 * j] & kAbs2, v[2 * j + 1] & kAbs2);
        m = __vmaxu2(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = __vmaxu2(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = __vmaxu2(m, __shfl_xor_sync(0xffffffffu, m, 16));
        if (lane < 4) s_part[(mw * 4 + warp) * 128 + hf * 64 + 4 * j + q] = m;
      }
    }
    asm volatile("bar.sync 3, 256;" ::: "memory");
    if (lt2 < 128) {  // column pair lt2 % 64 of half lt2 / 64
      uint32_t a2 = s_part[lt2];
#pragma unroll
      for (int w = 1; w < 8; ++w) a2 = __vmaxu2(a2, s_part[w * 128 + lt2]);
      const int col = (lt2 >> 6) * 128 + 2 * (lt2 & 63);
      const uint32_t slo = e8m0_from_amax_bits(a2 << 16, static_cast<mxmoe_scale_mode>(p.mode));
      const uint32_t shi = e8m0_from_amax_bits(a2 & 0xFFFF0000u, static_cast<mxmoe_scale_mode>(p.mode));
      s_sc[col] = static_cast<uint8_t>(slo);
      s_sc[col + 1] = static_cast<uint8_t>(shi);
      s_rc[col] = slo == kE8M0Nan ? __uint_as_float(0x7FC00000u) : qk::e8m0_recip(slo);
      s_rc[col + 1] = shi == kE8M0Nan ? __uint_as_float(0x7FC00000u) : qk::e8m0_recip(shi);
    }
    // The rowwise codes out: a whole tile by TMA (one thread; it waits for the reads before the
    // transposed codes reuse the buffer), else 128 rows x 16 chunks, thread lt2 + 256 i taking row
    // id / 16, chunk id % 16 (16 threads write a row's gate run and up run, 128 bytes each).
    if (tma) {
      if (lt2 == 0) {
        tma_store_2d(map_q, tbuf, c.n0, c.row0);
        tma_store_2d(map_q, tbuf + 128 * 128, I + c.n0, c.row0);
        bulk_commit_group();
        bulk_wait_group_read0();
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int id = lt2 + 256 * i, rr = id >> 4, ch = id & 15;
        if (rr < c.rows) {
          const uint4 w = *reinterpret_cast<const uint4*>(tbuf + (ch >> 3) * 128 * 128 + rr * 128 + 16 * ((ch & 7) ^ (rr & 7)));
          const int64_t col = (ch < 8 ? 0 : I - 128) + c.n0 + 16 * ch;
          *reinterpret_cast<uint4*>(p.dh_q + (c.row0 + rr) * C2 + col) = w;
        }
      }
    }
    asm volatile("bar.sync 3, 256;" ::: "memory");
    // Transposed codes into the epilogue buffer: column cl's row chunk u (16 rows) at cl * 128 +
    // 16 (u ^ (cl & 7)) (the XOR spreads a warp's byte stores over the banks).
    const int sw = 16 * (lr >> 4), rb = lr & 15;  // rows lr and lr + 8 share a chunk
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const uint32_t* v = hf ? du : dg;
        const int col0 = hf * 128 + 8 * j + 2 * q;
        const float2 rc = *reinterpret_cast<const float2*>(s_rc + col0);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float r = e ? rc.y : rc.x;
          const float v0 = __uint_as_float(e ? v[2 * j] & 0xFFFF0000u : v[2 * j] << 16);
          const float v1 = __uint_as_float(e ? v[2 * j + 1] & 0xFFFF0000u : v[2 * j + 1] << 16);
          uint32_t two = qk::cvt_e4m3x2(__fmul_rn(v0, r), __fmul_rn(v1, r));
          two = r != r ? 0x7F7Fu : two;  // the NaN scale: NaN codes
          const int cl = col0 + e;
          uint8_t* d = tbuf + cl * 128 + ((sw ^ (16 * (cl & 7))) | rb);
          d[0] = static_cast<uint8_t>(two);
          d[8] = static_cast<uint8_t>(two >> 8);
        }
      }
    }
    if (tma_cols) fence_async_shared();  // the staged columns are read by TMA next
    asm volatile("bar.sync 3, 256;" ::: "memory");
    if (tma_cols) {
      // A whole tile: the gate and up boxes (128 columns x 128 rows of codes each) by TMA; the next
      // tile's epilogue waits for their reads before it reuses the buffer.
      if (lt2 == 0) {
        tma_store_2d(map_qt, tbuf, c.row0, c.n0);
        tma_store_2d(map_qt, tbuf + 128 * 128, c.row0, I + c.n0);
        bulk_commit_group();
      }
    } else {
      // 256 columns x 8 chunks of 16 rows: 8 threads write one column's 128-byte run.
      const int64_t M = p.m;
      const bool vec = (c.row0 & 15) == 0 && (M & 15) == 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int id = lt2 + 256 * i, cl = id >> 3, u = id & 7;
        if (16 * u >= c.rows) continue;
        const int64_t colg = cl < 128 ? c.n0 + cl : I + c.n0 + (cl - 128);
        uint8_t* dst = p.dh_qt + colg * M + c.row0 + 16 * u;
        const uint4 w = *reinterpret_cast<const uint4*>(tbuf + cl * 128 + 16 * (u ^ (cl & 7)));
        if (vec && 16 * u + 16 <= c.rows) {
          *reinterpret_cast<uint4*>(dst) = w;
        } else {
          const int n = min(16, c.rows - 16 * u);
          for (int b = 0; b < n; ++b) {
            const uint32_t word = b < 4 ? w.x : b < 8 ? w.y : b < 12 ? w.z : w.w;
            dst[b] = static_cast<uint8_t>(word >> (8 * (b & 3)));
          }
        }
      }
    }
    {
      // Column scales: the block's byte in each of its 32-row runs (grouped compact layout).
      const int cl = lt2;
      const int start = c.g ? s_end[c.g - 1] : 0;
      const int64_t run0 = s_runs[c.g] + 4 * ((c.row0 - start) / 128);
      const int64_t nruns = min(static_cast<int64_t>((c.rows + 31) / 32), min(int64_t{4}, p.n_r - run0));
      const int64_t colg = cl < 128 ? c.n0 + cl : I + c.n0 + (cl - 128);
      const uint8_t sb = s_sc[cl];
      for (int e = 0; e < nruns; ++e) p.dh_scale_t[colg * p.n_r + run0 + e] = sb;
    }
  }

  // The outputs' entries past the groups, by thread t of 256 in every CTA after its tiles: rows past
  // the last group (end .. M) as if dY' were zero there (zero codes, the all-zero block's scale, zero
  // partials) and the column scales past the groups' runs (zero), as the quantize pass writes them.
  static __device__ __forceinline__ void tail(const GroupedMParams& p, int64_t end, int64_t runs, int t) {
    const int64_t M = p.m, C2 = 2 * static_cast<int64_t>(p.n), nt = p.n / 128;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * 256 + t, stride = static_cast<int64_t>(gridDim.x) * 256;
    const int64_t rows = M - end;
    if (rows > 0) {
      uint4* q = reinterpret_cast<uint4*>(p.dh_q + end * C2);  // C2 % 16 == 0
      for (int64_t i = first; i < rows * C2 / 16; i += stride) q[i] = make_uint4(0, 0, 0, 0);
      const uint32_t z = e8m0_from_amax_bits(0u, static_cast<mxmoe_scale_mode>(p.mode)) * 0x01010101u;
      uint32_t* s = reinterpret_cast<uint32_t*>(p.dh_scale + end * (C2 / 32));  // C2 / 32 % 4 == 0
      for (int64_t i = first; i < rows * C2 / 128; i += stride) s[i] = z;
      for (int64_t i = first; i < rows * nt; i += stride) p.tw_part[end * nt + i] = 0.f;
      for (int64_t i = first; i < rows * C2; i += stride) {
        const int64_t col = i / rows;
        p.dh_qt[col * M + end + (i - col * rows)] = 0;
      }
    }
    const int64_t extra = p.n_r - runs;
    for (int64_t i = first; extra > 0 && i < extra * C2; i += stride) {
      const int64_t col = i / extra;
      p.dh_scale_t[col * p.n_r + runs + (i - col * extra)] = 0;
    }
  }
};

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
