// mxmoe_clamp_offsets on the device equals the host result (random offsets, more groups than one warp).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "mxmoe/mxmoe.h"

namespace {
mxmoe_tensor vec_i32(int32_t* p, int64_t n, int32_t device) {
  mxmoe_tensor t{};
  t.data = p;
  t.dtype = MXMOE_DTYPE_I32;
  t.ndim = 1;
  t.shape[0] = n;
  t.strides[0] = 1;
  t.device = device;
  return t;
}
}  // namespace

TEST(CudaClampOffsets, MatchesHost) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  for (int64_t g : {1, 5, 31, 32, 33, 300}) {
    std::vector<int32_t> offs(g), want(g), got(g, -1);
    std::uniform_int_distribution<int32_t> d(-50, 1000);
    for (auto& o : offs) o = d(rng);
    const int64_t m = 777;
    mxmoe_tensor ho = vec_i32(offs.data(), g, -1), hw = vec_i32(want.data(), g, -1);
    ASSERT_EQ(mxmoe_clamp_offsets(&ho, m, &hw, nullptr), MXMOE_OK) << mxmoe_last_error();
    int32_t *d_offs = nullptr, *d_out = nullptr;
    ASSERT_EQ(cudaMalloc(&d_offs, g * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_out, g * 4), cudaSuccess);
    cudaMemcpy(d_offs, offs.data(), g * 4, cudaMemcpyHostToDevice);
    mxmoe_tensor dev_o = vec_i32(d_offs, g, 0), dev_r = vec_i32(d_out, g, 0);
    ASSERT_EQ(mxmoe_clamp_offsets(&dev_o, m, &dev_r, nullptr), MXMOE_OK) << mxmoe_last_error();
    ASSERT_EQ(cudaMemcpy(got.data(), d_out, g * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, want) << "G = " << g;
    cudaFree(d_offs);
    cudaFree(d_out);
  }
}
