// The hand-over buffer of the fused epilogues (sm90_fp8_grouped_m_gather_dswiglu_1x128.cuh,
// sm90_fp8_grouped_m_gather_swiglu_1x128.cuh): one 128 x 128 bf16 tile in shared memory, written by
// the math warpgroups in their accumulator layout and read by the epilogue warpgroup a row per thread.
#pragma once

#include <cstdint>

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

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
