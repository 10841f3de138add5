// Host helpers of the sm_90a GEMM launchers (sm90_host.hpp).
#include "cuda/gemm/sm90/sm90_host.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  if (!fn) fail_status(MXMOE_ERR_CUDA, "grouped_mm_tile128: the driver has no cuTensorMapEncodeTiled");
  return fn;
}

}  // namespace

CUtensorMap kmajor_map(const void* base, uint64_t inner, uint64_t outer, uint64_t ld, uint32_t box_outer) {
  CUtensorMap m;
  std::memset(&m, 0, sizeof(m));
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {ld};
  const cuuint32_t box[2] = {128, box_outer};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode_tiled()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
                                    elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail_status(MXMOE_ERR_CUDA, "grouped_mm_tile128: cuTensorMapEncodeTiled failed (", static_cast<int>(r),
                ") for a ", outer, " x ", inner, " operand");
  return m;
}

CUtensorMap output_map(void* base, bool bf16, uint64_t rows, uint64_t cols, uint32_t box_bytes) {
  CUtensorMap m;
  std::memset(&m, 0, sizeof(m));
  const uint64_t elem_bytes = bf16 ? 2 : 4;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * elem_bytes};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_bytes / elem_bytes), 64};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode_tiled()(
      &m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, base, dims, strides, box, elem,
      CU_TENSOR_MAP_INTERLEAVE_NONE, box_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
      CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail_status(MXMOE_ERR_CUDA, "grouped_mm_tile128: cuTensorMapEncodeTiled failed (", static_cast<int>(r),
                ") for a ", rows, " x ", cols, " output");
  return m;
}

CUtensorMap output_map_3d_bf16(void* base, uint64_t g, uint64_t rows, uint64_t cols) {
  CUtensorMap m;
  std::memset(&m, 0, sizeof(m));
  const cuuint64_t dims[3] = {cols, rows, g};
  const cuuint64_t strides[2] = {cols * 2, rows * cols * 2};
  const cuuint32_t box[3] = {64, 64, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r = encode_tiled()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box, elem,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail_status(MXMOE_ERR_CUDA, "grouped_mm_bf16_kgather: cuTensorMapEncodeTiled failed (", static_cast<int>(r),
                ") for a ", g, " x ", rows, " x ", cols, " output");
  return m;
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

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
