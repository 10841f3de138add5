// What the fused epilogues of the gather GEMM share (sm90_fp8_grouped_m_gather_dswiglu_1x128.cuh,
// sm90_fp8_grouped_m_gather_swiglu_1x128.cuh): their thread layout and register budgets, and the
// hand-over buffer, one 128 x 128 bf16 tile in shared memory written by the math warpgroups in their
// accumulator layout and read by the epilogue warpgroup a row per thread.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/gemm/sm90/sm90_fp8_grouped_m_1x128_128x128.cuh"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace sm90 {

// 128 rows x 256 bytes (128 bf16).
constexpr int kHandoffTileBytes = 128 * 256;

// Byte offset of row r's 16-byte chunk j (columns 8 j .. 8 j + 7): chunk j ^ (r % 16), so that 8
// consecutive rows' chunk j (a row-per-thread access) and a row's 8 consecutive chunks (the
// accumulator layout, a column-pair-per-thread access) hit all 32 banks.
__device__ __forceinline__ int handoff_offset(int r, int j) { return r * 256 + 16 * (j ^ (r & 15)); }

// The column pass's last steps, shared by the fused epilogues: the epilogue warpgroup's thread et
// (< 128) stores `Cols` columns' codes staged transposed in T (column cs's 16-row chunk u at
// cs * 128 + 16 (u ^ (cs % 8))) to the columnwise operand q_col (M bytes a column: column cs at
// q_col's column col_of(cs), the tile's rows), 8 threads per 128-byte column run, 16-byte stores where
// the run is aligned and whole, bytes otherwise (a group starting off a 16-row boundary). Partial: only
// the first `valid` columns are stored (a block of act columns cut short by I).
template <int Cols, bool Partial = false, class ColOf>
__device__ __forceinline__ void store_column_runs(const uint8_t* T, uint8_t* q_col, int64_t M, const TileCoord& c,
                                                  int et, ColOf col_of, int valid = Cols) {
  const bool vec = (c.row0 & 15) == 0 && (M & 15) == 0;
#pragma unroll 4
  for (int i = 0; i < Cols * 8 / 128; ++i) {
    const int id = et + 128 * i, cs = id >> 3, u = id & 7;
    if (16 * u >= c.rows || (Partial && cs >= valid)) continue;
    uint8_t* dst = q_col + static_cast<int64_t>(col_of(cs)) * M + c.row0 + 16 * u;
    const uint4 w = *reinterpret_cast<const uint4*>(T + cs * 128 + 16 * (u ^ (cs & 7)));
    if (vec && 16 * u + 16 <= c.rows) {
      *reinterpret_cast<uint4*>(dst) = w;
    } else {
      const int cnt = min(16, c.rows - 16 * u);
      for (int b = 0; b < cnt; ++b) {
        const uint32_t word = b < 4 ? w.x : b < 8 ? w.y : b < 12 ? w.z : w.w;
        dst[b] = static_cast<uint8_t>(word >> (8 * (b & 3)));
      }
    }
  }
}

// The 32-row runs of the columnwise scales (grouped compact layout, n_r runs a column) that hold the
// tile's 128x1 block: its first run and how many (a block's scale byte goes into each).
struct ScaleRuns {
  int64_t first, count;
};
__device__ __forceinline__ ScaleRuns tile_scale_runs(const GroupedMParams& p, const TileCoord& c, const int* s_end,
                                                     const int* s_runs) {
  const int start = c.g ? s_end[c.g - 1] : 0;
  const int64_t run0 = s_runs[c.g] + 4 * ((c.row0 - start) / 128);
  return ScaleRuns{run0, min(static_cast<int64_t>((c.rows + 31) / 32), min(int64_t{4}, p.n_r - run0))};
}

// The gather GEMM at BlockN 128 with a fourth warpgroup for the epilogue (kEpiWarpgroup): the math
// warpgroups hand each tile over through shared memory (the base's epilogue buffer is one hand-over
// tile) and run the next tile's mainloop while the epilogue warpgroup turns it into its outputs. One
// accumulator set (no overlapped promotion), so that four warpgroups fit the register file.
template <int Stages_>
struct GroupedMGatherHandoff : GroupedMGather<128, Stages_, __nv_bfloat16> {
  using Gather = GroupedMGather<128, Stages_, __nv_bfloat16>;
  static constexpr bool kFusedEpilogue = true;
  static constexpr bool kEpiWarpgroup = true;
  static constexpr int kThreads = 512;  // producer, two math warpgroups, epilogue
  static constexpr bool kOverlap = false;
  static constexpr int kProducerRegs = 40, kMathRegs = 168, kEpiRegs = 136;
  static_assert(kProducerRegs + 2 * kMathRegs + kEpiRegs <= 512, "four warpgroups share 64K registers");
  static constexpr int kHalfBytes = kHandoffTileBytes;
  static_assert(Gather::kEpiBytes == kHalfBytes, "the epilogue buffer holds one hand-over tile");
  static constexpr uint32_t kAbs2 = 0x7FFF7FFFu;  // |x| of a bf16 pair
};

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
