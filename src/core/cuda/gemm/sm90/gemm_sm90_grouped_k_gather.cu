// Host side of the sm_90a bf16 K-grouped gather GEMM (sm90_bf16_grouped_k_gather.cuh): checks, the output's
// TMA map, launch. sm_90a only (built with the CUTLASS-header SM90 objects, src/core/CMakeLists.txt).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "common/error.hpp"
#include "cuda/gemm/sm90/sm90_bf16_grouped_k_gather.cuh"
#include "cuda/gemm/sm90/sm90_grouped_k_gather.hpp"
#include "cuda/gemm/sm90/sm90_host.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace {

using Kernel = sm90::GroupedKGatherBf16<5>;

}  // namespace

bool sm90_grouped_k_gather_bf16_takes(int64_t rows, int64_t m, int64_t n, int64_t groups, int64_t t_rows,
                                      int64_t fanout, int device) {
  int major = 0;
  if (device < 0 || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (major != 9 || rows < 0 || m <= 0 || n <= 0 || m % 8 != 0 || n % 8 != 0 || groups <= 0 || fanout < 1) return false;
  if (rows >= (int64_t{1} << 31) || t_rows * fanout >= (int64_t{1} << 31)) return false;
  const int64_t tiles = groups * ((m + 127) / 128) * ((n + 127) / 128);
  if (tiles >= (int64_t{1} << 31) || groups * m >= (int64_t{1} << 31)) return false;
  return Kernel::smem_bytes(static_cast<int>(std::min<int64_t>(groups, 1 << 20))) <= 227 * 1024;
}

bool sm90_grouped_k_gather_bf16(const GroupedKGatherRun& r) {
  if (!sm90_grouped_k_gather_bf16_takes(r.rows, r.m, r.n, r.groups, r.t_rows, r.fanout, r.device)) return false;
  for (const void* q : {static_cast<const void*>(r.a), static_cast<const void*>(r.b), static_cast<const void*>(r.out)})
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  if (r.lda % 16 != 0 || r.ldb % 16 != 0) return false;
  void (*kernel)(const CUtensorMap, const sm90::GroupedKGatherParams) = sm90::grouped_k_gather_bf16_kernel<Kernel>;
  const int limit = sm90_prepare_smem(reinterpret_cast<const void*>(kernel), r.device);
  if (Kernel::smem_bytes(r.groups) > static_cast<size_t>(limit)) return false;
  sm90::GroupedKGatherParams p{};
  p.offs = r.offs;
  p.offs_s = r.offs_s;
  p.groups = r.groups;
  p.rows = static_cast<int>(r.rows);
  p.m = static_cast<int>(r.m);
  p.n = static_cast<int>(r.n);
  p.a = r.a;
  p.lda = r.lda;
  p.b = r.b;
  p.ldb = r.ldb;
  p.gather = r.gather;
  p.max_index = static_cast<int>(r.t_rows * r.fanout - 1);  // -1 when the gathered operand has no rows
  p.fanout_div = sm90::make_fast_div(static_cast<uint32_t>(r.fanout));
  p.gather_b = r.gather_b ? 1 : 0;
  p.mt = static_cast<int>((r.m + 127) / 128);
  p.nt = static_cast<int>((r.n + 127) / 128);
  p.group_div = sm90::make_fast_div(static_cast<uint32_t>(p.mt * p.nt));
  p.nt_div = sm90::make_fast_div(static_cast<uint32_t>(p.nt));
  const CUtensorMap mo = output_map_3d_bf16(r.out, r.groups, r.m, r.n);
  const int64_t tiles = static_cast<int64_t>(r.groups) * p.mt * p.nt;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(r.sm_count, tiles))));
  cfg.blockDim = dim3(Kernel::kThreads);
  cfg.dynamicSmemBytes = Kernel::smem_bytes(r.groups);
  cfg.stream = r.stream;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, mo, p);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    fail_status(MXMOE_ERR_CUDA, "grouped_mm_bf16_kgather: kernel launch failed: ", cudaGetErrorString(e));
  return true;
}

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
