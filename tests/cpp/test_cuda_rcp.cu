// The device reciprocal of sigmoid (rcp_rn, common/moe_activation.hpp): the same bits as __frcp_rn for
// every float d >= 1 (all 2^30 of them: [1, 2^128), +inf) and a NaN for NaN. Its branch-free path is
// what every SwiGLU kernel (the quantize passes, the MoE kernels, the dSwiGLU GEMM epilogue) evaluates.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "common/moe_activation.hpp"

namespace {

__global__ void rcp_mismatches(uint32_t first, uint32_t last, unsigned long long* count, uint32_t* example) {
  for (uint64_t b = first + blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; b <= last;
       b += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const float d = __uint_as_float(static_cast<uint32_t>(b));
    const float want = __frcp_rn(d), got = mxmoe::rcp_rn(d);
    if (__float_as_uint(want) != __float_as_uint(got)) {
      atomicAdd(count, 1ull);
      *example = static_cast<uint32_t>(b);
    }
  }
}

__global__ void rcp_nan(float d, uint32_t* out) { *out = __float_as_uint(mxmoe::rcp_rn(d)); }

TEST(CudaRcp, SameBitsAsFrcpRnForEveryDAtLeastOne) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  unsigned long long* count = nullptr;
  uint32_t* example = nullptr;
  ASSERT_EQ(cudaMalloc(&count, sizeof *count), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&example, sizeof *example), cudaSuccess);
  cudaMemset(count, 0, sizeof *count);
  cudaMemset(example, 0, sizeof *example);
  rcp_mismatches<<<1024, 256>>>(0x3F800000u, 0x7F800000u, count, example);  // 1.0 .. +inf
  unsigned long long h_count = 0;
  uint32_t h_example = 0;
  ASSERT_EQ(cudaMemcpy(&h_count, count, sizeof h_count, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaMemcpy(&h_example, example, sizeof h_example, cudaMemcpyDeviceToHost);
  EXPECT_EQ(h_count, 0ull) << "first mismatch seen at d bits 0x" << std::hex << h_example;
  rcp_nan<<<1, 1>>>(__builtin_nanf(""), example);
  cudaMemcpy(&h_example, example, sizeof h_example, cudaMemcpyDeviceToHost);
  EXPECT_TRUE((h_example & 0x7FFFFFFFu) > 0x7F800000u) << "NaN in, NaN out";
  cudaFree(count);
  cudaFree(example);
}

}  // namespace
