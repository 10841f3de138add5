// Host helpers of the sm_90a GEMM launchers (sm90_host.hpp).
#include "cuda/gemm/sm90/sm90_host.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "cuda/common/tensor_map.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {

CUtensorMap kmajor_map(const void* base, uint64_t inner, uint64_t outer, uint64_t ld, uint32_t box_outer) {
  const uint64_t dims[2] = {inner, outer};
  const uint64_t strides[1] = {ld};
  const uint32_t box[2] = {128, box_outer};
  return tiled_map("grouped_mm_tile128 operand", CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, base, dims, strides, box,
                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

CUtensorMap output_map(void* base, bool bf16, uint64_t rows, uint64_t cols, uint32_t box_bytes) {
  const uint64_t elem_bytes = bf16 ? 2 : 4;
  const uint64_t dims[2] = {cols, rows};
  const uint64_t strides[1] = {cols * elem_bytes};
  const uint32_t box[2] = {static_cast<uint32_t>(box_bytes / elem_bytes), 64};
  return tiled_map("grouped_mm_tile128 output", bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                   2, base, dims, strides, box, box_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                   CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

CUtensorMap output_map_3d_bf16(void* base, uint64_t g, uint64_t rows, uint64_t cols) {
  const uint64_t dims[3] = {cols, rows, g};
  const uint64_t strides[2] = {cols * 2, rows * cols * 2};
  const uint32_t box[3] = {64, 64, 1};
  return tiled_map("grouped_mm_bf16_kgather output", CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box,
                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

namespace {

int optin_smem(int device) {
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<size_t>(device) >= cache.size()) cache.resize(device + 1, 0);
  if (cache[device] == 0) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
      cudaGetLastError();
      v = 48 * 1024;
    }
    cache[device] = v;
  }
  return cache[device];
}

}  // namespace

int sm90_prepare_smem(const void* fn, int device) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> limits;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(fn, device);
  const auto found = limits.find(key);
  if (found != limits.end()) return found->second;
  cudaFuncAttributes attr{};
  cudaError_t e = cudaFuncGetAttributes(&attr, fn);
  const int lim = optin_smem(device) - static_cast<int>(attr.sharedSizeBytes);
  if (e == cudaSuccess) e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, lim);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail_status(MXMOE_ERR_CUDA, "grouped_mm_tile128: setting the kernel's shared memory (", lim,
                " bytes): ", cudaGetErrorString(e));
  }
  limits[key] = lim;
  return lim;
}

int sm90_max_clusters(const void* fn, int device, const cudaLaunchConfig_t& cfg) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t>, int> counts;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(fn, device, cfg.dynamicSmemBytes);
  const auto found = counts.find(key);
  if (found != counts.end()) return found->second;
  int n = 0;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, fn, &cfg);
  if (e != cudaSuccess || n < 1) {
    cudaGetLastError();
    fail_status(MXMOE_ERR_CUDA, "grouped_mm_tile128: no cluster of ", cfg.gridDim.x, " CTAs fits (",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 clusters", ")");
  }
  counts[key] = n;
  return n;
}

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
