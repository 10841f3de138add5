// The sm_90a FP8 grouped GEMM on routed rows of a per-token operand (the gather variant of
// sm90_fp8_grouped_m_1x128_128x128.cuh), behind plain types like sm90_grouped_m.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/sm90/sm90_grouped_m.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {

// out (M, N) = A[rows] (M, K) . B[g] (N, K)^T (+ bias[g]) per row group, GEMM row r reading row
// gather[r] / fanout of A (a_rows, K) (a negative or out-of-range index: a zero row); with row_scale,
// out row r is scaled by row_scale[gather[r]] in fp32 before the bias. GroupedMRun's a / a_scale /
// as_s0 describe the per-token operand; m is the routed row count (gather's length).
struct GroupedMGatherRun : GroupedMRun {
  const int32_t* gather = nullptr;
  int64_t fanout = 1;
  int64_t a_rows = 0;
  int64_t lda = 0;  // A's row stride in bytes
  const float* row_scale = nullptr;
};

// Whether sm90_grouped_m_gather takes a call of this shape on `device` (an sm_90 GPU, the shape
// limits of the kernel, the group table in shared memory). Launches nothing.
bool sm90_grouped_m_gather_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows, int64_t lda,
                                 int64_t fanout, bool out_bf16, int device);

// Launches on r.stream and returns true, or returns false having launched nothing where
// sm90_grouped_m_gather_takes says no (or a base is not 16-byte aligned). Throws on CUDA errors.
bool sm90_grouped_m_gather(const GroupedMGatherRun& r);

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
