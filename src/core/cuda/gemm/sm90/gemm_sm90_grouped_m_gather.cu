// Host side of the gather variant of the sm_90a M-grouped FP8 GEMM: checks, B's TMA descriptor,
// launch. sm_90a only (built with the CUTLASS-header SM90 objects, src/core/CMakeLists.txt).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "common/error.hpp"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_1x128_128x128.cuh"
#include "cuda/gemm/sm90/sm90_grouped_m_gather.hpp"
#include "cuda/gemm/sm90/sm90_host.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace {

// The one configuration: BlockN 128, the stages of the TMA kernel at BlockN 128 with bf16 output
// (5), no cluster (the producer warpgroup copies A; multicast of B is not wired for it).
using Kernel = sm90::GroupedMGather<128, 5, __nv_bfloat16>;

int device_sm_major(int device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return 0;
  return major;
}

}  // namespace

bool sm90_grouped_m_gather_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows, int64_t lda,
                                 int64_t fanout, bool out_bf16, int device) {
  if (!out_bf16 || device < 0 || device_sm_major(device) != 9) return false;
  if (m < 0 || n <= 0 || k <= 0 || k % 16 != 0 || n % 16 != 0 || groups <= 0 || fanout < 1) return false;
  if (lda < k || lda % 16 != 0) return false;
  // int32 rows and shapes; byte offsets of A rows in 32 bits (the producer keeps them so).
  if (m >= (int64_t{1} << 31) || n * groups >= (int64_t{1} << 31) || k >= (int64_t{1} << 31)) return false;
  if (a_rows >= (int64_t{1} << 31) || a_rows * lda >= (int64_t{1} << 32) || m * n >= (int64_t{1} << 62)) return false;
  // The largest routed index, a_rows * fanout - 1, is divided by the kernel's 32-bit magic division.
  if (a_rows * fanout >= (int64_t{1} << 31)) return false;
  return Kernel::smem_bytes(static_cast<int>(std::min<int64_t>(groups, 1 << 20))) <= 227 * 1024;
}

bool sm90_grouped_m_gather(const GroupedMGatherRun& r) {
  if (!sm90_grouped_m_gather_takes(r.m, r.n, r.k, r.groups, r.a_rows, r.lda, r.fanout, r.out_bf16, r.device))
    return false;
  if (reinterpret_cast<uintptr_t>(r.a) % 16 != 0 || reinterpret_cast<uintptr_t>(r.b) % 16 != 0) return false;
  void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const sm90::GroupedMParams) =
      sm90::grouped_m_kernel<Kernel>;
  const int limit = sm90_prepare_smem(reinterpret_cast<const void*>(kernel), r.device);
  const size_t smem = Kernel::smem_bytes(r.groups);
  if (smem > static_cast<size_t>(limit)) return false;
  const CUtensorMap mb = kmajor_map(r.b, r.k, static_cast<uint64_t>(r.groups) * r.n, r.k, Kernel::kBlockN / 2);
  const CUtensorMap mo = output_map(r.out, r.out_bf16, std::max<int64_t>(r.m, 1), r.n, Kernel::kEpiBoxBytes);
  sm90::GroupedMParams p = sm90::grouped_m_params(r);
  const int64_t nt = (r.n + Kernel::kBlockN - 1) / Kernel::kBlockN;
  p.band_div = sm90::make_fast_div(static_cast<uint32_t>(Kernel::kBand * nt));
  p.gather = r.gather;
  p.a = r.a;
  p.lda = r.lda;
  p.max_index = static_cast<int>(r.a_rows * r.fanout - 1);  // -1 when A has no rows: every row zero
  p.fanout_div = sm90::make_fast_div(static_cast<uint32_t>(r.fanout));
  p.row_scale = r.row_scale;
  if (r.m == 0) return true;
  const int64_t upper = ((r.m + 127) / 128 + r.groups) * nt;  // m-tiles <= ceil(M / 128) + G
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(r.sm_count, upper));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(Kernel::kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = r.stream;
  // The A map is unused by the gather variant (its producer copies A); B's map fills the slot.
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, mb, mb, mo, p);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    fail_status(MXMOE_ERR_CUDA, "grouped_mm_tile128_gather: kernel launch failed: ", cudaGetErrorString(e));
  return true;
}

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
