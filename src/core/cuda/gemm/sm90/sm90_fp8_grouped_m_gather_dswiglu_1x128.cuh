// sm_90a FP8 grouped GEMM on routed rows with the dSwiGLU epilogue: the MoE layer's down-projection
// dgrad. The mainloop is the gather GEMM's (sm90_fp8_grouped_m_1x128_128x128.cuh, GroupedMGather at
// BlockN 128): dY' = gather(dout) . w2[e] (M, I), the routed rows unweighted. dY' is never stored; each
// 128 x 128 tile of it (one group's rows, columns n0 .. n0 + 127 of I) becomes:
//   dH = act'(h, w * bf16(dY'))  rounded to bf16, gate columns n0 + c and up columns I + n0 + c, from
//        the saved pre-activation h (M, 2I) and the routing weight w of each row, exactly as the
//        SWIGLU_BACKWARD quantize source computes it from a stored bf16 dY' (cuda/quantize/source.cuh);
//   dh_q / dh_scale     its rowwise 1x128 operand (the up projection's dgrad): the tile's gate columns
//                       and its up columns are one block each (I % 128 == 0, concatenated halves);
//   dh_qt / dh_scale_t  its columnwise 128x1 operand (the up projection's wgrad), transposed: the
//                       tile's rows are one block (tiles start at group starts, as the quantize pass's
//                       panels);
//   tw_part             per row, <bf16(dY'), act(h)> over the tile's 128 columns (the routing
//                       weights' gradient, summed over the column tiles by the caller): the expert
//                       outputs are never needed.
// The codes and scales are bit for bit those of the gather GEMM writing bf16 dY' followed by the tile128
// quantize pass over the SWIGLU_BACKWARD source. Bytes: h read once, the two FP8 forms written once,
// instead of dY' written, read twice (quantize pass, weights' gradient) and h read twice.
//
// Who does what: the epilogue costs more instructions than the tile's mainloop (~30 per element for
// the SwiGLU derivative), so most of it runs on a fourth warpgroup, one tile behind, while the two
// math warpgroups run the next tile's mainloop. The math warpgroups turn the tile's first kMathChunks
// 8-column chunks into dH themselves and hand the rest over as bf16 dY' in shared memory (S, 32 KB,
// the base kernel's epilogue buffer), then go on; the epilogue warpgroup (one thread per tile row)
// computes the rest of its row of dH into S (gate half, in place) and U (up half), the row's scales,
// partial and codes, then (one thread per column pair) the columns' maxima, scales and codes, which
// leave transposed through S, and frees S. Two mbarriers order the hand-over (full: 256 math threads
// arrive; empty: 128 epilogue threads arrive). The math warpgroups keep one accumulator set (the
// overlapped promotion's second set measured free here) so that four warpgroups fit the register
// file, and the ring has 3 stages beside S and U (the host's choice: fewer stages leave more L1 for
// the epilogue's loads of h).
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "common/moe_activation.hpp"
#include "cuda/gemm/sm90/sm90_epilogue_handoff.cuh"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_1x128_128x128.cuh"
#include "cuda/quantize/common.cuh"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace sm90 {

template <int Stages_>
struct GroupedMGatherDSwiglu : GroupedMGatherHandoff<Stages_> {
  using Base = typename GroupedMGatherHandoff<Stages_>::Gather;
  using GroupedMGatherHandoff<Stages_>::kHalfBytes;
  using GroupedMGatherHandoff<Stages_>::kAbs2;
  // S (the base's epilogue buffer) and U: hand-over tiles (sm90_epilogue_handoff.cuh). After U: each
  // row's statistics of the math warpgroups' chunks (RowStats), then the hand-over barriers (full, empty).
  // The math warpgroups compute dH of the tile's first kMathChunks 8-column chunks themselves (they
  // hold dY' in registers), the epilogue warpgroup the rest (Qwen3-30B-A3B 16K, same run: 0, 4 and 8
  // chunks about the same, 4 marginally best: docs/design/gemm-sm90.md).
  static constexpr int kMathChunks = 4;
  static_assert(kMathChunks % 4 == 0 && kMathChunks < 16, "the epilogue takes its chunks 4 at a time");
  struct RowStats {
    float part[4];    // the partial's sums s4[q] over the math warpgroups' chunks
    uint32_t mg, mu;  // |dH| maxima (bf16 pairs) over those chunks, gate and up
    uint32_t pad[2];
  };
  static constexpr int kStatsBytes = 128 * static_cast<int>(sizeof(RowStats));
  static constexpr int kEpiExtraBytes = kHalfBytes + kStatsBytes + 2 * 8;
  // Base::smem_bytes plus the extra region and the third group table (G + 1 ints).
  static constexpr size_t smem_bytes(int groups) {
    return Base::smem_bytes(groups) + kEpiExtraBytes + (static_cast<size_t>(groups) + 1) * sizeof(int);
  }

  static __device__ __forceinline__ int chunk_offset(int r, int j) { return handoff_offset(r, j); }
  static __device__ __forceinline__ RowStats* row_stats(uint8_t* smem_epi) {
    return reinterpret_cast<RowStats*>(smem_epi + 2 * kHalfBytes);
  }
  static __device__ __forceinline__ uint64_t* handoff_bars(uint8_t* smem_epi) {
    return reinterpret_cast<uint64_t*>(smem_epi + 2 * kHalfBytes + kStatsBytes);
  }
  static __device__ __forceinline__ void init_handoff(uint8_t* smem_epi) {
    uint64_t* bars = handoff_bars(smem_epi);
    cutlass::arch::ClusterBarrier::init(&bars[0], 256);  // full: every math thread stored its dY'
    cutlass::arch::ClusterBarrier::init(&bars[1], 128);  // empty: every epilogue thread read S and U
  }

  // The producer warpgroup's thread t (< 128), at the start of a tile: tile row t's h (its 128 gate
  // and 128 up values) into L2, so that the epilogue's loads of h, a tile later, do not wait on HBM.
  static __device__ __forceinline__ void prefetch_tile(const GroupedMParams& p, const TileCoord& c, int t) {
    if (t >= c.rows) return;
    const uint16_t* row = p.h + (static_cast<int64_t>(c.row0) + t) * 2 * static_cast<int64_t>(p.n) + c.n0;
    prefetch_l2(row, 256);
    prefetch_l2(row + p.n, 256);
  }

  // One bf16 pair of dY' (d2) with its gate and up pairs of h (g2, u2), a row's weight f: dH's gate
  // and up pairs (zero outside the tile's rows), the partial <bf16(dY'), act(h)> continued in `part`,
  // the |dH| maxima in mg, mu. Both hand-over sides run it, so their values and order agree.
  template <bool PLAIN, bool kModerate>
  static __device__ __forceinline__ void dswiglu_pair(uint32_t d2, uint32_t g2, uint32_t u2, float f, bool in,
                                                      const SwigluParams& act, float& part, uint32_t& mg,
                                                      uint32_t& mu, uint32_t& og, uint32_t& ou) {
    float vg[2], vu[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float d = __uint_as_float(e ? d2 & 0xFFFF0000u : d2 << 16);
      const float g = __uint_as_float(e ? g2 & 0xFFFF0000u : g2 << 16);
      const float u = __uint_as_float(e ? u2 & 0xFFFF0000u : u2 << 16);
      float y;
      swiglu_grad_value<PLAIN, kModerate>(g, u, __fmul_rn(d, f), act, &vg[e], &vu[e], &y);
      part = add_rn(part, mul_rn(d, y));
    }
    og = in ? qk::cvt_bf16x2(vg[0], vg[1]) : 0u;
    ou = in ? qk::cvt_bf16x2(vu[0], vu[1]) : 0u;
    mg = __vmaxu2(mg, og & kAbs2);
    mu = __vmaxu2(mu, ou & kAbs2);
  }

  // A math thread (mw, warp, lane) after its tile's mainloop, holding rows lr and lr + 8, columns
  // 8 j + 2 (lane % 4) + {0, 1} of dY' (as the gather GEMM stores it: + 0, its bias-free output, so -0
  // is stored as +0; then bf16), once the epilogue warpgroup has freed S (phase ph): chunks
  // j < kMathChunks become dH here (gate into S, up into U, the rows' partial sums and maxima into
  // RowStats), the others go into S as bf16 dY' for the epilogue warpgroup.
  template <bool PLAIN>
  static __device__ __forceinline__ void handoff(const GroupedMParams& p, const TileCoord& c,
                                                 const float (&fin)[Base::kAcc], uint8_t* smem_epi, uint32_t ph,
                                                 int mw, int warp, int lane, int src0, int src1,
                                                 typename Base::HandoffState&) {
    constexpr int kJ = kMathChunks;
    uint8_t* const S = smem_epi;
    uint8_t* const U = smem_epi + kHalfBytes;
    uint64_t* bars = handoff_bars(smem_epi);
    const int lr = mw * 64 + warp * 16 + lane / 4, q = lane & 3;
    const int I = p.n;
    const int64_t C2 = 2 * static_cast<int64_t>(I);
    const bool in0 = lr < c.rows, in1 = lr + 8 < c.rows;
    const int64_t row0 = c.row0 + lr, row1 = row0 + 8;
    // The routing weight of each row (0 for a padding row, as dy_row_factor).
    const float f0 = src0 >= 0 ? __ldg(p.row_scale + gather_index(p, static_cast<int>(row0))) : 0.f;
    const float f1 = src1 >= 0 ? __ldg(p.row_scale + gather_index(p, static_cast<int>(row1))) : 0.f;
    // h's gate words of the thread's columns in the math chunks (bf16 pairs); up words I / 2 further.
    const uint32_t* h0 = reinterpret_cast<const uint32_t*>(p.h + (in0 ? row0 : c.row0) * C2 + c.n0 + 2 * q);
    const uint32_t* h1 = reinterpret_cast<const uint32_t*>(p.h + (in1 ? row1 : c.row0) * C2 + c.n0 + 2 * q);
    const int up = I / 2;
    uint32_t HG[kJ][2], HU[kJ][2];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      HG[j][0] = in0 ? __ldg(h0 + 4 * j) : 0u;
      HU[j][0] = in0 ? __ldg(h0 + up + 4 * j) : 0u;
      HG[j][1] = in1 ? __ldg(h1 + 4 * j) : 0u;
      HU[j][1] = in1 ? __ldg(h1 + up + 4 * j) : 0u;
    }
    cutlass::arch::ClusterBarrier::wait(&bars[1], ph ^ 1u);
#pragma unroll
    for (int j = kJ; j < Base::kAcc / 4; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(S + chunk_offset(lr + 8 * r, j) + 4 * q) =
            qk::cvt_bf16x2(__fadd_rn(fin[4 * j + 2 * r], 0.f), __fadd_rn(fin[4 * j + 2 * r + 1], 0.f));
    float part[2] = {0.f, 0.f};
    uint32_t mg[2] = {0u, 0u}, mu[2] = {0u, 0u};
    auto swiglu = [&](auto moderate) {
      constexpr bool kModerate = decltype(moderate)::value;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t dp = qk::cvt_bf16x2(__fadd_rn(fin[4 * j + 2 * r], 0.f), __fadd_rn(fin[4 * j + 2 * r + 1], 0.f));
          uint32_t og, ou;
          dswiglu_pair<PLAIN, kModerate>(dp, HG[j][r], HU[j][r], r ? f1 : f0, r ? in1 : in0, p.act, part[r], mg[r],
                                         mu[r], og, ou);
          const int off = chunk_offset(lr + 8 * r, j) + 4 * q;
          *reinterpret_cast<uint32_t*>(S + off) = og;
          *reinterpret_cast<uint32_t*>(U + off) = ou;
        }
      }
    };
    if constexpr (PLAIN) {
      // The moderate sigmoid when no gate value of the warp's chunks is below -87 (one vote).
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
    RowStats* st = row_stats(smem_epi);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      st[lr + 8 * r].part[q] = part[r];  // lane q's sum is the partial's s4[q]
      mg[r] = __vmaxu2(mg[r], __shfl_xor_sync(0xffffffffu, mg[r], 1));
      mg[r] = __vmaxu2(mg[r], __shfl_xor_sync(0xffffffffu, mg[r], 2));
      mu[r] = __vmaxu2(mu[r], __shfl_xor_sync(0xffffffffu, mu[r], 1));
      mu[r] = __vmaxu2(mu[r], __shfl_xor_sync(0xffffffffu, mu[r], 2));
    }
    if (q == 0) {
      st[lr].mg = mg[0];
      st[lr].mu = mu[0];
      st[lr + 8].mg = mg[1];
      st[lr + 8].mu = mu[1];
    }
    cutlass::arch::ClusterBarrier::arrive(&bars[0]);
  }

  // The epilogue warpgroup's thread et (< 128) on one tile (hand-over phase ph).
  template <bool PLAIN>
  static __device__ __forceinline__ void epilogue_tile(const GroupedMParams& p, const TileCoord& c, int et,
                                                       uint8_t* smem_epi, const int* s_end, const int* s_runs, int nt,
                                                       uint32_t ph) {
    uint8_t* const S = smem_epi;
    uint8_t* const U = smem_epi + kHalfBytes;
    uint64_t* bars = handoff_bars(smem_epi);
    const int I = p.n;
    const int64_t C2 = 2 * static_cast<int64_t>(I);
    const auto mode = static_cast<mxmoe_scale_mode>(p.mode);

    // ---- one thread per row r: dH, the row's scales, partial and codes ----
    const int r = et;
    const bool in = r < c.rows;
    const int64_t row = c.row0 + r;
    // The routing weight (0 for a padding row, as dy_row_factor; rows past the group compute with it
    // and are masked).
    const int src = in ? gather_row(p, static_cast<int>(row)) : -1;
    const float f = src >= 0 ? __ldg(p.row_scale + gather_index(p, static_cast<int>(row))) : 0.f;
    // h's gate chunks of 8 values from chunk kMathChunks on; the up chunks are I / 8 chunks further.
    // Three chunks are loaded ahead of their use (the first three before the wait for dY').
    const uint4* hg = reinterpret_cast<const uint4*>(p.h + (in ? row : c.row0) * C2 + c.n0);
    const int up = I / 8;
    uint4 G[4], Uh[4];
    auto load = [&](int j, int slot) {
      G[slot] = in ? __ldg(hg + j) : make_uint4(0, 0, 0, 0);
      Uh[slot] = in ? __ldg(hg + up + j) : make_uint4(0, 0, 0, 0);
    };
    load(kMathChunks, 0);
    load(kMathChunks + 1, 1);
    load(kMathChunks + 2, 2);
    cutlass::arch::ClusterBarrier::wait(&bars[0], ph);

    // The partial's 4 sums (column 8 j + 2 w + e into s4[w]) and the |dH| maxima (bf16 pairs, gate and
    // up), continued from the math warpgroups' chunks.
    const RowStats& st = row_stats(smem_epi)[r];
    float s4[4] = {st.part[0], st.part[1], st.part[2], st.part[3]};
    uint32_t mg = st.mg, mu = st.mu;
    auto chunk = [&](int j, const uint4& g4, const uint4& u4, auto moderate) {
      constexpr bool kModerate = decltype(moderate)::value;
      uint8_t* const sp = S + chunk_offset(r, j);
      const uint4 d4 = *reinterpret_cast<const uint4*>(sp);
      const uint32_t dw[4] = {d4.x, d4.y, d4.z, d4.w}, gw[4] = {g4.x, g4.y, g4.z, g4.w},
                     uw[4] = {u4.x, u4.y, u4.z, u4.w};
      uint32_t og[4], ou[4];
#pragma unroll
      for (int w = 0; w < 4; ++w)
        dswiglu_pair<PLAIN, kModerate>(dw[w], gw[w], uw[w], f, in, p.act, s4[w], mg, mu, og[w], ou[w]);
      *reinterpret_cast<uint4*>(sp) = make_uint4(og[0], og[1], og[2], og[3]);
      *reinterpret_cast<uint4*>(U + chunk_offset(r, j)) = make_uint4(ou[0], ou[1], ou[2], ou[3]);
    };
    // Four chunks per trip (not all 16 unrolled: the epilogue's code is most of the kernel's, and
    // instruction fetch stalled it), chunk j in ring slot j % 4.
#pragma unroll 1
    for (int j0 = kMathChunks; j0 < 16; j0 += 4) {
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int j = j0 + jj;
        if (j + 3 < 16) load(j + 3, (jj + 3) % 4);  // slot (j + 3) % 4: kMathChunks % 4 == 0
        const uint4 g4 = G[jj], u4 = Uh[jj];
        if constexpr (PLAIN) {
          // The moderate sigmoid (3 instructions for the reciprocal instead of ~15) when no gate value
          // of the warp's chunk is below -87: one vote per 8 columns, a branch around the math.
          const uint32_t gm = __vmaxu2(__vmaxu2(g4.x, g4.y), __vmaxu2(g4.z, g4.w));
          if (__all_sync(0xffffffffu, bf16x2_sigmoid_moderate(gm))) {
            chunk(j, g4, u4, std::true_type{});
          } else {
            chunk(j, g4, u4, std::false_type{});
          }
        } else {
          chunk(j, g4, u4, std::false_type{});
        }
      }
    }
    // Row scales (|bf16| maxima as fp32 bits, NaN above all), the partial, then the row's codes from
    // its dH in S and U: 16-byte stores of 16 codes.
    const uint32_t sg = e8m0_from_amax_bits(max(mg << 16, mg & 0xFFFF0000u), mode);
    const uint32_t su = e8m0_from_amax_bits(max(mu << 16, mu & 0xFFFF0000u), mode);
    if (in) {
      uint8_t* srow = p.scale_row + row * (C2 / 32);
      *reinterpret_cast<uint32_t*>(srow + c.n0 / 32) = sg * 0x01010101u;
      *reinterpret_cast<uint32_t*>(srow + (I + c.n0) / 32) = su * 0x01010101u;
      p.tw_part[row * nt + c.n0 / 128] = add_rn(add_rn(s4[0], s4[1]), add_rn(s4[2], s4[3]));
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const uint32_t s = hf ? su : sg;
        const float rc = qk::e8m0_recip(s);
        const uint8_t* buf = hf ? U : S;
        uint8_t* dst = p.q_row + row * C2 + (hf ? I : 0) + c.n0;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          uint32_t o[4];
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const uint4 v = *reinterpret_cast<const uint4*>(buf + chunk_offset(r, 2 * jj + h2));
            const uint32_t vw[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int w = 0; w < 4; w += 2) {
              const uint32_t lo = qk::cvt_e4m3x2(__fmul_rn(__uint_as_float(vw[w] << 16), rc),
                                                 __fmul_rn(__uint_as_float(vw[w] & 0xFFFF0000u), rc));
              const uint32_t hi = qk::cvt_e4m3x2(__fmul_rn(__uint_as_float(vw[w + 1] << 16), rc),
                                                 __fmul_rn(__uint_as_float(vw[w + 1] & 0xFFFF0000u), rc));
              o[2 * h2 + w / 2] = s == kE8M0Nan ? 0x7F7F7F7Fu : lo | (hi << 16);
            }
          }
          *reinterpret_cast<uint4*>(dst + 16 * jj) = make_uint4(o[0], o[1], o[2], o[3]);
        }
      }
    }
    asm volatile("bar.sync 3, 128;" ::: "memory");  // every row's dH is in S and U

    // ---- one thread per column pair: the columns' maxima over the tile's 128 rows (rows past the
    // group hold zeros), scales and transposed codes (column runs of the group's rows) ----
    {
      const int hf = et >> 6, pr = et & 63;  // half (gate / up), column pair
      const uint8_t* buf = hf ? U : S;
      const int jc = pr >> 2, wo = 4 * (pr & 3);
      uint32_t m = 0;
#pragma unroll
      for (int rr = 0; rr < 128; ++rr) m = __vmaxu2(m, *reinterpret_cast<const uint32_t*>(buf + chunk_offset(rr, jc) + wo) & kAbs2);
      const uint32_t slo = e8m0_from_amax_bits(m << 16, mode), shi = e8m0_from_amax_bits(m & 0xFFFF0000u, mode);
      const float rlo = qk::e8m0_recip(slo), rhi = qk::e8m0_recip(shi);
      const int64_t M = p.m;
      const int64_t col = (hf ? I : 0) + c.n0 + 2 * pr;  // and col + 1
      // The two columns' codes of all 128 rows (16 per word group u), in registers until every thread
      // has read S and U; then transposed into S (column cl's 16-row chunk u at cl * 128 +
      // 16 (u ^ (cl % 8))) and stored by 8 threads per 128-byte column run: a column per thread would
      // take a 1-byte store per row where a group starts off a 16-row boundary (most tiles), each
      // warp store touching 32 lines.
      uint32_t clo[8][4], chi[8][4];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {  // rows 16 u + 2 i, + 1
          const int ra = 16 * u + 2 * i;
          const uint32_t a = *reinterpret_cast<const uint32_t*>(buf + chunk_offset(ra, jc) + wo);
          const uint32_t b = *reinterpret_cast<const uint32_t*>(buf + chunk_offset(ra + 1, jc) + wo);
          uint32_t lo = qk::cvt_e4m3x2(__fmul_rn(__uint_as_float(a << 16), rlo), __fmul_rn(__uint_as_float(b << 16), rlo));
          uint32_t hi = qk::cvt_e4m3x2(__fmul_rn(__uint_as_float(a & 0xFFFF0000u), rhi),
                                       __fmul_rn(__uint_as_float(b & 0xFFFF0000u), rhi));
          lo = slo == kE8M0Nan ? 0x7F7Fu : lo;  // the NaN scale: NaN codes
          hi = shi == kE8M0Nan ? 0x7F7Fu : hi;
          if (i & 1) {
            clo[u][i / 2] |= lo << 16;
            chi[u][i / 2] |= hi << 16;
          } else {
            clo[u][i / 2] = lo;
            chi[u][i / 2] = hi;
          }
        }
      }
      asm volatile("bar.sync 3, 128;" ::: "memory");  // S and U read by every thread
      const int cl = hf * 128 + 2 * pr;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        *reinterpret_cast<uint4*>(S + cl * 128 + 16 * (u ^ (cl & 7))) = make_uint4(clo[u][0], clo[u][1], clo[u][2], clo[u][3]);
        *reinterpret_cast<uint4*>(S + (cl + 1) * 128 + 16 * (u ^ ((cl + 1) & 7))) =
            make_uint4(chi[u][0], chi[u][1], chi[u][2], chi[u][3]);
      }
      asm volatile("bar.sync 3, 128;" ::: "memory");
      store_column_runs<256>(S, p.q_col, M, c, et, [&](int cs) { return (cs < 128 ? 0 : I - 128) + c.n0 + cs; });
      // Column scales: the block's byte in each of its 32-row runs.
      const ScaleRuns sr = tile_scale_runs(p, c, s_end, s_runs);
      for (int e = 0; e < sr.count; ++e) {
        p.scale_col[col * p.n_r + sr.first + e] = static_cast<uint8_t>(slo);
        p.scale_col[(col + 1) * p.n_r + sr.first + e] = static_cast<uint8_t>(shi);
      }
    }
    cutlass::arch::ClusterBarrier::arrive(&bars[1]);  // S and U read: the next tile's dY' may come
  }

  // The outputs' entries past the groups, by thread t of 256 in every CTA after its tiles: rows past
  // the last group (end .. M) as if dY' were zero there (zero codes, the all-zero block's scale, zero
  // partials) and the column scales past the groups' runs (zero), as the quantize pass writes them.
  static __device__ __forceinline__ void tail(const GroupedMParams& p, int64_t end, int64_t runs, int t) {
    const int64_t M = p.m, C2 = 2 * static_cast<int64_t>(p.n), nt = p.n / 128;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * 256 + t, stride = static_cast<int64_t>(gridDim.x) * 256;
    const int64_t rows = M - end;
    if (rows > 0) {
      uint4* q = reinterpret_cast<uint4*>(p.q_row + end * C2);  // C2 % 16 == 0
      for (int64_t i = first; i < rows * C2 / 16; i += stride) q[i] = make_uint4(0, 0, 0, 0);
      const uint32_t z = e8m0_from_amax_bits(0u, static_cast<mxmoe_scale_mode>(p.mode)) * 0x01010101u;
      uint32_t* s = reinterpret_cast<uint32_t*>(p.scale_row + end * (C2 / 32));  // C2 / 32 % 4 == 0
      for (int64_t i = first; i < rows * C2 / 128; i += stride) s[i] = z;
      for (int64_t i = first; i < rows * nt; i += stride) p.tw_part[end * nt + i] = 0.f;
      for (int64_t i = first; i < rows * C2; i += stride) {
        const int64_t col = i / rows;
        p.q_col[col * M + end + (i - col * rows)] = 0;
      }
    }
    const int64_t extra = p.n_r - runs;
    for (int64_t i = first; extra > 0 && i < extra * C2; i += stride) {
      const int64_t col = i / extra;
      p.scale_col[col * p.n_r + runs + (i - col * extra)] = 0;
    }
  }
};

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
