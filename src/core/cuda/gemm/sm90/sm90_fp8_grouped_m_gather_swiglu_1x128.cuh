// sm_90a FP8 grouped GEMM on routed rows with the SwiGLU epilogue: the MoE layer's up projection
// (GEMM1). The mainloop is the gather GEMM's (sm90_fp8_grouped_m_1x128_128x128.cuh, GroupedMGather at
// BlockN 128): h = gather(x) . w13[e]^T (+ b13[e]) (M, 2I). A CTA takes its tiles in pairs (kPairs) that
// hold both halves of one 128-column block of act(h) = swiglu(gate, up):
//   concatenated halves (gate | up, I % 128 == 0): the gate tile (one group's rows, columns n0 ..
//     n0 + 127), then the up tile (columns I + n0 ..);
//   interleaved halves (gate 2c, up 2c + 1: gpt-oss; 2I % 128 == 0): tiles 2 j and 2 j + 1, act columns
//     128 j .. 128 j + 127. With I % 128 == 64 the last block has 64 columns: its pair's second tile is a
//     ghost past 2I, which loads and computes the first tile again and is never stored.
// Each pair becomes:
//   h                     both tiles stored as bf16, as the gather GEMM stores them (the
//                         pre-activation, kept for the backward; + b13 in fp32, rounded once);
//   q_row / scale_row     act(h)'s rowwise 1x128 operand (GEMM2's A): the pair's 128 act columns are
//                         one block;
//   q_col / scale_col     act(h)'s columnwise 128x1 operand (the down projection's wgrad), transposed:
//                         the tile's rows are one block (tiles start at group starts, as the quantize
//                         pass's panels); only when q_col is set.
// The bytes are those of the gather GEMM writing h followed by the tile128 quantize pass over the
// SWIGLU source: h is written once and not read back (the pass read it: 2I bf16 per row).
//
// Who does what, as in the dSwiGLU epilogue: the math warpgroups hand each pair over as bf16 in shared
// memory (the gate tile into G, the up tile into S, the base's epilogue buffer) and go on to the next
// pair's mainloops. They keep the gate tile in registers (32 bf16 pairs a thread) through the up
// tile's mainloop and hand both tiles over after it, so the epilogue warpgroup has the whole next pair
// (two mainloops) for one pair's work: it stores both tiles as h, computes act(h) a row per thread
// (values into S in place, the row's maximum, scale and codes), then a column per thread (maximum,
// scale, codes transposed through G, stored by 8 threads per 128-byte column run), then frees both
// buffers. (Handing the gate tile over on its own left the epilogue one mainloop for the pair's act
// and codes, its bound.) Two mbarriers: full (the 256 math threads arrive) and empty (the 128
// epilogue threads), once per pair. The register budgets move 8 from the epilogue warpgroup to each
// math warpgroup for the held gate tile.
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

template <int Stages_, bool Interleaved_ = false>
struct GroupedMGatherSwiglu : GroupedMGatherHandoff<Stages_> {
  using Base = typename GroupedMGatherHandoff<Stages_>::Gather;
  using GroupedMGatherHandoff<Stages_>::kHalfBytes;
  using GroupedMGatherHandoff<Stages_>::kAbs2;
  static constexpr bool kPairs = true;
  static constexpr bool kInterleaved = Interleaved_;
  // A pair's tiles (pair index times 128 in n0): concatenated, n0 and I + n0; interleaved, 2 n0 and
  // 2 n0 + 128. A ghost second tile (interleaved, n0 >= 2I) loads its first tile's B and scales.
  static __device__ __forceinline__ int pair_n0(int n0, int second, int n) {
    return kInterleaved ? 2 * n0 + 128 * second : second ? n0 + n / 2 : n0;
  }
  static __device__ __forceinline__ int load_n0(int n0, int n) { return kInterleaved && n0 >= n ? n0 - 128 : n0; }
  static __device__ __forceinline__ bool second_tile(int n0, int n) {
    return kInterleaved ? ((n0 >> 7) & 1) != 0 : n0 >= n / 2;
  }
  static constexpr int kProducerRegs = 40, kMathRegs = 176, kEpiRegs = 120;
  static_assert(kProducerRegs + 2 * kMathRegs + kEpiRegs <= 512, "four warpgroups share 64K registers");
  // The math side's gate tile of the current pair, bf16 pairs as handoff stores them: [2 j + r].
  struct HandoffState {
    uint32_t gate[Base::kAcc / 2];
  };
  // After S (the base's epilogue buffer): G, then the barriers (full, empty).
  static constexpr int kEpiExtraBytes = kHalfBytes + 2 * 8;
  // Base::smem_bytes plus the extra region and the third group table (G + 1 ints).
  static constexpr size_t smem_bytes(int groups) {
    return Base::smem_bytes(groups) + kEpiExtraBytes + (static_cast<size_t>(groups) + 1) * sizeof(int);
  }

  static __device__ __forceinline__ uint64_t* handoff_bars(uint8_t* smem_epi) {
    return reinterpret_cast<uint64_t*>(smem_epi + 2 * kHalfBytes);
  }
  static __device__ __forceinline__ void init_handoff(uint8_t* smem_epi) {
    uint64_t* bars = handoff_bars(smem_epi);
    cutlass::arch::ClusterBarrier::init(&bars[0], 256);  // full: every math thread stored its pairs of both tiles
    cutlass::arch::ClusterBarrier::init(&bars[1], 128);  // empty: every epilogue thread is done with G and S
  }
  // Nothing to prefetch: the epilogue reads only what the math warpgroups hand over.
  static __device__ __forceinline__ void prefetch_tile(const GroupedMParams&, const TileCoord&, int) {}

  // b13[g] at columns col, col + 1 in fp32 (0 without a bias or past N: a ghost tile). Interleaved halves
  // only (gpt-oss): the concatenated variant's math warps keep their registers (the host declines a
  // bias there).
  static __device__ __forceinline__ float2 bias_pair(const GroupedMParams& p, int g, int col) {
    if (!kInterleaved || p.bias == nullptr || col >= p.n) return make_float2(0.f, 0.f);
    const int64_t o = g * p.bias_s0 + static_cast<int64_t>(col) * p.bias_s1;
    if (p.bias_bf16) {
      const auto* bb = static_cast<const uint16_t*>(p.bias);
      return make_float2(bf16_to_f32(bb[o]), bf16_to_f32(bb[o + p.bias_s1]));
    }
    const auto* bf = static_cast<const float*>(p.bias);
    return make_float2(bf[o], bf[o + p.bias_s1]);
  }

  // A math thread (mw, warp, lane) after its tile's mainloop, holding rows lr and lr + 8, columns
  // 8 j + 2 (lane % 4) + {0, 1}: the tile as the gather GEMM stores it (+ b13 in fp32, or + 0, its
  // bias-free output, so -0 is stored as +0; then bf16). The pair's first tile stays in hs; after the
  // second, once the epilogue warpgroup has freed the buffers (phase ph), the first tile goes into G and
  // the second into S.
  template <bool PLAIN>
  static __device__ __forceinline__ void handoff(const GroupedMParams& p, const TileCoord& c,
                                                 const float (&fin)[Base::kAcc], uint8_t* smem_epi, uint32_t ph,
                                                 int mw, int warp, int lane, int, int, HandoffState& hs) {
    auto pair = [&](int j, int r, const float2& b) {
      return qk::cvt_bf16x2(__fadd_rn(fin[4 * j + 2 * r], b.x), __fadd_rn(fin[4 * j + 2 * r + 1], b.y));
    };
    auto bias_of = [&](int j) { return bias_pair(p, c.g, c.n0 + 8 * j + 2 * (lane & 3)); };
    if (!second_tile(c.n0, p.n)) {
#pragma unroll
      for (int j = 0; j < Base::kAcc / 4; ++j) {
        const float2 b = bias_of(j);
#pragma unroll
        for (int r = 0; r < 2; ++r) hs.gate[2 * j + r] = pair(j, r, b);
      }
      return;
    }
    uint8_t* const S = smem_epi;
    uint8_t* const G = smem_epi + kHalfBytes;
    uint64_t* bars = handoff_bars(smem_epi);
    const int lr = mw * 64 + warp * 16 + lane / 4, q = lane & 3;
    cutlass::arch::ClusterBarrier::wait(&bars[1], ph ^ 1u);
#pragma unroll
    for (int j = 0; j < Base::kAcc / 4; ++j) {
      const float2 b = bias_of(j);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int off = handoff_offset(lr + 8 * r, j) + 4 * q;
        *reinterpret_cast<uint32_t*>(G + off) = hs.gate[2 * j + r];
        *reinterpret_cast<uint32_t*>(S + off) = pair(j, r, b);
      }
    }
    cutlass::arch::ClusterBarrier::arrive(&bars[0]);
  }

  // The tile's rows of `buf` (rows < rows) to dst (row 0, its first column; row stride ld elements):
  // 16 threads per 256-byte row, thread et taking chunk et % 16 of rows et / 16 + 8 i.
  static __device__ __forceinline__ void store_rows(const uint8_t* buf, uint16_t* dst, int64_t ld, int rows, int et) {
    const int ch = et & 15;
#pragma unroll 4
    for (int i = 0; i < 16; ++i) {
      const int r = (et >> 4) + 8 * i;
      if (r < rows)
        *reinterpret_cast<uint4*>(dst + r * ld + 8 * ch) = *reinterpret_cast<const uint4*>(buf + handoff_offset(r, ch));
    }
  }

  // act of one 8-column chunk (g4, u4: bf16 gate and up), rounded to bf16 (zero outside the tile's
  // rows), its |act| maxima continued in m (bf16 pairs).
  template <bool PLAIN, bool kModerate>
  static __device__ __forceinline__ uint4 act_chunk(const uint4& g4, const uint4& u4, bool in, const SwigluParams& act,
                                                    uint32_t& m) {
    const uint32_t gw[4] = {g4.x, g4.y, g4.z, g4.w}, uw[4] = {u4.x, u4.y, u4.z, u4.w};
    uint32_t o[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float v0 = swiglu_value<PLAIN, kModerate>(__uint_as_float(gw[w] << 16), __uint_as_float(uw[w] << 16), act);
      const float v1 = swiglu_value<PLAIN, kModerate>(__uint_as_float(gw[w] & 0xFFFF0000u),
                                                      __uint_as_float(uw[w] & 0xFFFF0000u), act);
      o[w] = in ? qk::cvt_bf16x2(v0, v1) : 0u;
      m = __vmaxu2(m, o[w] & kAbs2);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
  }

  // Interleaved halves: act of the 8 (gate, up) words of g8 (columns 2 c, 2 c + 1 of h in each 32-bit
  // word: gate low, up high), rounded to bf16 (zero where !in), |act| maxima continued in m.
  template <bool PLAIN, bool kModerate>
  static __device__ __forceinline__ uint4 act_chunk_interleaved(const uint4& lo, const uint4& hi, bool in,
                                                                const SwigluParams& act, uint32_t& m) {
    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float v0 = swiglu_value<PLAIN, kModerate>(__uint_as_float(w[2 * i] << 16),
                                                      __uint_as_float(w[2 * i] & 0xFFFF0000u), act);
      const float v1 = swiglu_value<PLAIN, kModerate>(__uint_as_float(w[2 * i + 1] << 16),
                                                      __uint_as_float(w[2 * i + 1] & 0xFFFF0000u), act);
      o[i] = in ? qk::cvt_bf16x2(v0, v1) : 0u;
      m = __vmaxu2(m, o[i] & kAbs2);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
  }

  // The epilogue warpgroup's thread et (< 128) on one tile of a pair (hand-over phase ph, per pair):
  // nothing on the first tile; on the second, the pair's work. Buffers: G holds the first tile, S the
  // second. Concatenated halves: act(h) replaces the up tile in S and act's transposed codes go through
  // G; interleaved: act(h) replaces the first tile in G (act chunk j from h chunks 2 j, 2 j + 1 of G,
  // then of S) and the codes go through S.
  template <bool PLAIN>
  static __device__ __forceinline__ void epilogue_tile(const GroupedMParams& p, const TileCoord& c, int et,
                                                       uint8_t* smem_epi, const int* s_end, const int* s_runs, int,
                                                       uint32_t ph) {
    uint8_t* const S = smem_epi;               // the pair's second tile
    uint8_t* const G = smem_epi + kHalfBytes;  // the pair's first tile
    uint8_t* const A = kInterleaved ? G : S;   // act(h) after the row pass
    uint8_t* const T = kInterleaved ? S : G;   // act's transposed codes
    uint64_t* bars = handoff_bars(smem_epi);
    const int I = p.n / 2;
    const int64_t C2 = p.n;
    if (!second_tile(c.n0, p.n)) return;  // the first tile: handed over with the second
    const int n_first = kInterleaved ? c.n0 - 128 : c.n0 - I;
    const int a0 = kInterleaved ? n_first / 2 : c.n0 - I;  // act's columns a0 .. a0 + va - 1
    const int va = kInterleaved ? min(128, I - a0) : 128;   // 128, or 64 (interleaved, I % 128 == 64)
    uint16_t* const h = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(c.row0) * C2;
    cutlass::arch::ClusterBarrier::wait(&bars[0], ph);
    store_rows(G, h + n_first, C2, c.rows, et);
    if (c.n0 < p.n) store_rows(S, h + c.n0, C2, c.rows, et);  // not a ghost
    asm volatile("bar.sync 3, 128;" ::: "memory");  // every row of G and S stored before act replaces one
    const auto mode = static_cast<mxmoe_scale_mode>(p.mode);

    // ---- one thread per row r: act(h) into A, the row's scale and codes ----
    const int r = et;
    const bool in = r < c.rows;
    const int64_t row = c.row0 + r;
    uint32_t m = 0;
#pragma unroll 1
    for (int j0 = 0; j0 < 16; j0 += 4) {
      // Four act chunks at a time, one branch around them, so that their math interleaves. Interleaved:
      // chunks j0 .. j0 + 3 read h chunks 2 j0 % 16 .. + 7 of G (j0 < 8) or S, all loaded before any
      // act chunk is written (G's chunks j0 .. j0 + 3 were read by this batch or the one before).
      uint4 g4[kInterleaved ? 8 : 4], u4[4];
      uint32_t gm = 0;
      if constexpr (kInterleaved) {
        const uint8_t* src = j0 < 8 ? G : S;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          g4[jj] = *reinterpret_cast<const uint4*>(src + handoff_offset(r, (2 * j0 + jj) & 15));
          // the gate halves (low 16 bits) for the moderate-sigmoid vote
          gm = __vmaxu2(gm, __vmaxu2(__vmaxu2(g4[jj].x & 0xFFFFu, g4[jj].y & 0xFFFFu),
                                     __vmaxu2(g4[jj].z & 0xFFFFu, g4[jj].w & 0xFFFFu)));
        }
      } else {
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int off = handoff_offset(r, j0 + jj);
          g4[jj] = *reinterpret_cast<const uint4*>(G + off);
          u4[jj] = *reinterpret_cast<const uint4*>(S + off);
          gm = __vmaxu2(gm, __vmaxu2(__vmaxu2(g4[jj].x, g4[jj].y), __vmaxu2(g4[jj].z, g4[jj].w)));
        }
      }
      auto act4 = [&](auto plain, auto moderate) {
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          constexpr bool kP = decltype(plain)::value, kM = decltype(moderate)::value;
          uint4 v;
          if constexpr (kInterleaved)
            v = act_chunk_interleaved<kP, kM>(g4[2 * jj], g4[2 * jj + 1], in && 8 * (j0 + jj) < va, p.act, m);
          else
            v = act_chunk<kP, kM>(g4[jj], u4[jj], in, p.act, m);
          *reinterpret_cast<uint4*>(A + handoff_offset(r, j0 + jj)) = v;
        }
      };
      if constexpr (PLAIN) {
        // The moderate sigmoid when no gate value of the warp's 4 chunks is below -87 (one vote per 32
        // columns; the same bits either way).
        if (__all_sync(0xffffffffu, bf16x2_sigmoid_moderate(gm)))
          act4(std::true_type{}, std::true_type{});
        else
          act4(std::true_type{}, std::false_type{});
      } else {
        act4(std::false_type{}, std::false_type{});
      }
    }
    // The row's scale (|bf16| maxima as fp32 bits, NaN above all) and codes: 16-byte stores of 16 codes.
    const uint32_t sr = e8m0_from_amax_bits(max(m << 16, m & 0xFFFF0000u), mode);
    if (in) {
      uint8_t* const srow = p.scale_row + row * (I / 32) + a0 / 32;
      if (va == 128 && (I / 32) % 4 == 0) {
        *reinterpret_cast<uint32_t*>(srow) = sr * 0x01010101u;
      } else {
        for (int b = 0; b < va / 32; ++b) srow[b] = static_cast<uint8_t>(sr);
      }
      const float rc = qk::e8m0_recip(sr);
      uint8_t* dst = p.q_row + row * I + a0;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        if (16 * jj >= va) break;
        uint32_t o[4];
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const uint4 v = *reinterpret_cast<const uint4*>(A + handoff_offset(r, 2 * jj + h2));
          const uint32_t vw[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int w = 0; w < 4; w += 2) {
            const uint32_t lo = qk::cvt_e4m3x2(__fmul_rn(__uint_as_float(vw[w] << 16), rc),
                                               __fmul_rn(__uint_as_float(vw[w] & 0xFFFF0000u), rc));
            const uint32_t hi = qk::cvt_e4m3x2(__fmul_rn(__uint_as_float(vw[w + 1] << 16), rc),
                                               __fmul_rn(__uint_as_float(vw[w + 1] & 0xFFFF0000u), rc));
            o[2 * h2 + w / 2] = sr == kE8M0Nan ? 0x7F7F7F7Fu : lo | (hi << 16);
          }
        }
        *reinterpret_cast<uint4*>(dst + 16 * jj) = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
    asm volatile("bar.sync 3, 128;" ::: "memory");  // every row's act in A; T read by every thread

    // ---- one thread per column: its maximum over the tile's 128 rows (rows past the group hold
    // zeros), scale and transposed codes (column runs of the group's rows) ----
    if (p.q_col != nullptr) {
      const int cl = et, jc = cl >> 3, wo = 4 * ((cl & 7) >> 1);
      const bool hi = cl & 1;  // the column's half of its bf16 pair
      uint32_t mc = 0;
#pragma unroll 8
      for (int rr = 0; rr < 128; ++rr)
        mc = __vmaxu2(mc, *reinterpret_cast<const uint32_t*>(A + handoff_offset(rr, jc) + wo) & kAbs2);
      const uint32_t sc = e8m0_from_amax_bits(hi ? mc & 0xFFFF0000u : mc << 16, mode);
      const float rc = qk::e8m0_recip(sc);
      // Rows 16 u .. 16 u + 15 as one 16-byte chunk (byte b: row 16 u + b), staged in T at column cl's
      // chunk u ^ (cl % 8), a quarter-warp's 8 columns on distinct banks.
#pragma unroll 1
      for (int u = 0; u < 8; ++u) {
        uint32_t wd[4];
#pragma unroll
        for (int i = 0; i < 8; ++i) {  // rows 16 u + 2 i, + 1
          const int ra = 16 * u + 2 * i;
          const uint32_t a = *reinterpret_cast<const uint32_t*>(A + handoff_offset(ra, jc) + wo);
          const uint32_t b = *reinterpret_cast<const uint32_t*>(A + handoff_offset(ra + 1, jc) + wo);
          const float fa = __uint_as_float(hi ? a & 0xFFFF0000u : a << 16);
          const float fb = __uint_as_float(hi ? b & 0xFFFF0000u : b << 16);
          uint32_t two = qk::cvt_e4m3x2(__fmul_rn(fa, rc), __fmul_rn(fb, rc));
          two = sc == kE8M0Nan ? 0x7F7Fu : two;  // the NaN scale: NaN codes
          wd[i / 2] = (i & 1) ? wd[i / 2] | (two << 16) : two;
        }
        *reinterpret_cast<uint4*>(T + cl * 128 + 16 * (u ^ (cl & 7))) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
      }
      asm volatile("bar.sync 3, 128;" ::: "memory");  // every column's codes in T
      store_column_runs<128, kInterleaved>(T, p.q_col, p.m, c, et, [&](int cs) { return a0 + cs; }, va);
      // The column's scale: the block's byte in each of its 32-row runs.
      if (cl < va) {
        const ScaleRuns sr = tile_scale_runs(p, c, s_end, s_runs);
        for (int e = 0; e < sr.count; ++e)
          p.scale_col[static_cast<int64_t>(a0 + cl) * p.n_r + sr.first + e] = static_cast<uint8_t>(sc);
      }
    }
    cutlass::arch::ClusterBarrier::arrive(&bars[1]);  // G and S read: the next pair may come
  }

  // The outputs' entries past the groups, by thread t of 256 in every CTA after its tiles: rows past
  // the last group (end .. M) as the gather GEMM and the quantize pass write them (h zero, zero codes,
  // the all-zero block's scale) and the column scales past the groups' runs (zero).
  static __device__ __forceinline__ void tail(const GroupedMParams& p, int64_t end, int64_t runs, int t) {
    const int64_t M = p.m, C2 = p.n, I = p.n / 2;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * 256 + t, stride = static_cast<int64_t>(gridDim.x) * 256;
    const int64_t rows = M - end;
    if (rows > 0) {
      uint4* hz = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + end * C2);  // 2 C2 % 16 == 0
      for (int64_t i = first; i < rows * C2 / 8; i += stride) hz[i] = make_uint4(0, 0, 0, 0);
      uint4* q = reinterpret_cast<uint4*>(p.q_row + end * I);  // I % 16 == 0
      for (int64_t i = first; i < rows * I / 16; i += stride) q[i] = make_uint4(0, 0, 0, 0);
      const uint32_t z = e8m0_from_amax_bits(0u, static_cast<mxmoe_scale_mode>(p.mode));
      if ((I / 32) % 4 == 0) {
        uint32_t* s = reinterpret_cast<uint32_t*>(p.scale_row + end * (I / 32));
        for (int64_t i = first; i < rows * I / 128; i += stride) s[i] = z * 0x01010101u;
      } else {  // I % 128 == 64 (interleaved halves)
        uint8_t* s = p.scale_row + end * (I / 32);
        for (int64_t i = first; i < rows * (I / 32); i += stride) s[i] = static_cast<uint8_t>(z);
      }
      for (int64_t i = first; p.q_col != nullptr && i < rows * I; i += stride) {
        const int64_t col = i / rows;
        p.q_col[col * M + end + (i - col * rows)] = 0;
      }
    }
    const int64_t extra = p.n_r - runs;
    for (int64_t i = first; p.q_col != nullptr && extra > 0 && i < extra * I; i += stride) {
      const int64_t col = i / extra;
      p.scale_col[col * p.n_r + runs + (i - col * extra)] = 0;
    }
  }
};

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
