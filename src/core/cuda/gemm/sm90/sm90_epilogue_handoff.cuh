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
