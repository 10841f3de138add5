// The device reciprocal of sigmoid (rcp_rn, common/moe_activation.hpp): the same bits as __frcp_rn for
// every float d >= 1 (all 2^30 of them: [1, 2^128), +inf) and a NaN for NaN. Its branch-free path is
// what every SwiGLU kernel (the quantize passes, the MoE kernels, the dSwiGLU GEMM epilogue) evaluates.
// Its inline path alone (rcp_rn_moderate) below 2^126, and the moderate sigmoid the PLAIN SwiGLU kernels
// take when no gate value is below -87: the same bits for every bf16 gate value they take it for.
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
    const bool moderate_ok = d >= 0x1p126f || __float_as_uint(mxmoe::rcp_rn_moderate(d)) == __float_as_uint(want);
    if (__float_as_uint(want) != __float_as_uint(got) || !moderate_ok) {
      atomicAdd(count, 1ull);
      *example = static_cast<uint32_t>(b);
    }
  }
}

__global__ void rcp_nan(float d, uint32_t* out) {
  out[0] = __float_as_uint(mxmoe::rcp_rn(d));
  out[1] = __float_as_uint(mxmoe::rcp_rn_moderate(d));
}

// Every bf16 gate value g: where the kernels' tests admit the moderate sigmoid (the packed-pair test
// and the float test !(g < -87)), its bits against sigmoid_f32's.
__global__ void sigmoid_moderate_mismatches(unsigned* count, uint32_t* example) {
  const uint32_t b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b > 0xFFFFu) return;
  const float g = __uint_as_float(b << 16);
  const bool pair = mxmoe::bf16x2_sigmoid_moderate(b | (b << 16)), scalar = !(g < -87.0f);
  const bool same = __float_as_uint(mxmoe::sigmoid_f32_moderate(g)) == __float_as_uint(mxmoe::sigmoid_f32(g));
  if ((pair && !scalar) || (scalar && !same)) {
    atomicAdd(count, 1u);
    *example = b;
  }
}

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
  uint32_t* nan_out = nullptr;
  ASSERT_EQ(cudaMalloc(&nan_out, 2 * sizeof *nan_out), cudaSuccess);
  rcp_nan<<<1, 1>>>(__builtin_nanf(""), nan_out);
  uint32_t h_nan[2] = {0, 0};
  cudaMemcpy(h_nan, nan_out, sizeof h_nan, cudaMemcpyDeviceToHost);
  EXPECT_TRUE((h_nan[0] & 0x7FFFFFFFu) > 0x7F800000u) << "NaN in, NaN out";
  EXPECT_EQ(h_nan[1], h_nan[0]) << "the moderate path gives rcp_rn's NaN";
  cudaFree(nan_out);
  cudaFree(count);
  cudaFree(example);
}

TEST(CudaRcp, ModerateSigmoidSameBitsWhereAdmitted) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  unsigned* count = nullptr;
  uint32_t* example = nullptr;
  ASSERT_EQ(cudaMalloc(&count, sizeof *count), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&example, sizeof *example), cudaSuccess);
  cudaMemset(count, 0, sizeof *count);
  sigmoid_moderate_mismatches<<<256, 256>>>(count, example);
  unsigned h_count = 1;
  uint32_t h_example = 0;
  ASSERT_EQ(cudaMemcpy(&h_count, count, sizeof h_count, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaMemcpy(&h_example, example, sizeof h_example, cudaMemcpyDeviceToHost);
  EXPECT_EQ(h_count, 0u) << "bf16 gate bits 0x" << std::hex << h_example;
  cudaFree(count);
  cudaFree(example);
}

}  // namespace
