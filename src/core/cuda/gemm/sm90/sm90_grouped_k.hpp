// The sm_90a FP8 grouped GEMM with token groups along the reduction (the tile128 wgrad,
// sm90_fp8_grouped_k_1x128_1x128.cuh) behind plain types, like sm90_grouped_m.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/sm90/sm90_config.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {

// One wgrad call: out[g] (N, K) = A[:, group g] (N, len_g) . B[:, group g] (K, len_g)^T over the
// token groups of offs. A (N, M) and B (K, M) tokens contiguous with row strides lda / ldb bytes;
// scales the recipe's grouped compact E8M0 layout (N, cap) / (K, cap); out (G, N, K) contiguous.
struct GroupedKRun {
  int64_t m = 0, n = 0, k = 0;
  int groups = 0;
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  const uint8_t* a_scale = nullptr;
  int64_t as_s0 = 0;
  const uint8_t* b = nullptr;
  int64_t ldb = 0;
  const uint8_t* b_scale = nullptr;
  int64_t bs_s0 = 0;
  const int32_t* offs = nullptr;
  int64_t offs_s = 1;
  void* out = nullptr;
  bool out_bf16 = true;
  // Device scratch for the prepared scales, at least sm90_grouped_k_workspace_size(m, n, k, groups) bytes,
  // 16-byte aligned.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  int sm_count = 0;
  int device = 0;
  cudaStream_t stream = nullptr;
};

// Launches the scale preparation and the kernel instantiation of config c (select_sm90_config, impl
// own) on r.stream and returns true, or returns false having launched nothing when the call is
// outside what the kernel takes (M = 0, row strides or bases not 16-byte aligned, K not a multiple of
// 8, too many groups for the shared tables, a workspace too small); the caller then runs CUTLASS.
bool sm90_grouped_k(const GroupedKRun& r, const Sm90GemmConfig& c);

// Whether sm90_grouped_k takes r under config c, given a large enough workspace (r.workspace is not
// read): the same checks, nothing launched. The workspace size query for given operands uses it.
bool sm90_grouped_k_takes(const GroupedKRun& r, const Sm90GemmConfig& c);

// The scratch the own kernel needs: each k-block's scales as fp32, in the order the producer loads
// them (sm90::GroupedKScales).
int64_t sm90_grouped_k_workspace_size(int64_t m, int64_t n, int64_t k, int64_t groups);

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
