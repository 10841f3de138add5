// TMA tensor maps (tensor_map.hpp).
#include "cuda/common/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "common/error.hpp"

namespace mxmoe {
namespace cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled(const char* what) {
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
  if (!fn) fail_status(MXMOE_ERR_CUDA, what, ": the driver has no cuTensorMapEncodeTiled");
  return fn;
}

}  // namespace

CUtensorMap tiled_map(const char* what, CUtensorMapDataType dtype, uint32_t rank, const void* base, const uint64_t* dims,
                      const uint64_t* strides, const uint32_t* box, CUtensorMapSwizzle swizzle,
                      CUtensorMapL2promotion promotion) {
  CUtensorMap m;
  std::memset(&m, 0, sizeof(m));
  cuuint64_t d[5] = {};
  cuuint64_t s[4] = {};
  cuuint32_t b[5] = {};
  const cuuint32_t elem[5] = {1, 1, 1, 1, 1};
  if (rank < 1 || rank > 5) fail_status(MXMOE_ERR_INVALID_ARGUMENT, what, ": tensor map rank ", rank, " not in [1, 5]");
  for (uint32_t i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    if (i + 1 < rank) s[i] = strides[i];
  }
  const CUresult r = encode_tiled(what)(&m, dtype, rank, const_cast<void*>(base), d, s, b, elem,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::string shape = std::to_string(dims[0]);
    for (uint32_t i = 1; i < rank; ++i) shape += " x " + std::to_string(dims[i]);
    fail_status(MXMOE_ERR_CUDA, what, ": cuTensorMapEncodeTiled failed (", static_cast<int>(r), ") for dims ", shape,
                " (innermost first)");
  }
  return m;
}

}  // namespace cuda
}  // namespace mxmoe
