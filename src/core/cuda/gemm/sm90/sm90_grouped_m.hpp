// The sm_90a FP8 grouped GEMM with token groups along M (sm90_fp8_grouped_m_1x128_128x128.cuh),
// behind plain types so the tile128 dispatch (gemm_tile128.cu, built for every arch) never
// includes CuTe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/sm90/sm90_config.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {

// One forward / dgrad call of the tile128 recipe: out (M, N) = A (M, K) . B[g] (N, K)^T (+ bias).
// A, B and out contiguous; scales are the recipe's E8M0 1x32 rows (the 128-blocks read byte 4 kb).
struct GroupedMRun {
  int64_t m = 0, n = 0, k = 0;
  int groups = 0;
  const uint8_t* a = nullptr;
  const uint8_t* a_scale = nullptr;
  int64_t as_s0 = 0;
  const uint8_t* b = nullptr;
  const uint8_t* b_scale = nullptr;
  int64_t bs_s0 = 0, bs_s1 = 0;
  const int32_t* offs = nullptr;
  int64_t offs_s = 1;
  const void* bias = nullptr;
  bool bias_bf16 = false;
  int64_t bias_s0 = 0, bias_s1 = 0;
  void* out = nullptr;
  bool out_bf16 = true;
  int sm_count = 0;
  int device = 0;
  cudaStream_t stream = nullptr;
};

// Launches the kernel instantiation of config c (select_sm90_config, impl own) on r.stream and returns
// true, or returns false having launched nothing when the call is outside what the kernel takes (K = 0,
// unaligned bases, too many groups for the shared group table); the caller then runs the CUTLASS
// path. Where c's lean layout does not fit, the usual stages run and c says so. Throws mxmoe::Error on
// CUDA errors.
bool sm90_grouped_m(const GroupedMRun& r, Sm90GemmConfig& c);

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
