// Host side of the sm_90a K-grouped (wgrad) FP8 GEMM: TMA descriptors, the instantiation of a config,
// launch.
// sm_90a only (built with the CUTLASS-header SM90 objects, src/core/CMakeLists.txt).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "common/error.hpp"
#include "cuda/gemm/sm90/sm90_fp8_grouped_k_1x128_1x128.cuh"
#include "cuda/gemm/sm90/sm90_grouped_k.hpp"
#include "cuda/gemm/sm90/sm90_host.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace {

template <class K>
bool launch(const GroupedKRun& r) {
  void (*kernel)(const CUtensorMap, const CUtensorMap, const sm90::GroupedKParams) = sm90::grouped_k_kernel<K>;
  const int limit = sm90_prepare_smem(reinterpret_cast<const void*>(kernel), r.device);
  const size_t smem = K::smem_bytes(r.groups);
  if (smem > static_cast<size_t>(limit)) return false;
  const CUtensorMap ma = kmajor_map(r.a, r.m, r.n, r.lda, K::kBlockM);
  const CUtensorMap mb = kmajor_map(r.b, r.m, r.k, r.ldb, K::kBlockN / 2);  // B boxes in two halves
  const int64_t mt = (r.n + K::kBlockM - 1) / K::kBlockM, nt = (r.k + K::kBlockN - 1) / K::kBlockN;
  sm90::GroupedKParams p{};
  p.offs = r.offs;
  p.offs_s = r.offs_s;
  p.groups = r.groups;
  p.m = static_cast<int>(r.m);
  p.n = static_cast<int>(r.n);
  p.k = static_cast<int>(r.k);
  p.a_scale = r.a_scale;
  p.as_s0 = r.as_s0;
  p.b_scale = r.b_scale;
  p.bs_s0 = r.bs_s0;
  p.out = r.out;
  p.group_tiles = static_cast<int>((mt * nt + K::kCluster - 1) / K::kCluster * K::kCluster);
  p.group_div = sm90::make_fast_div(static_cast<uint32_t>(p.group_tiles));
  p.band_div = sm90::make_fast_div(static_cast<uint32_t>(K::kBand * nt));
  // Persistent grid: one CTA per SM (a multiple of the cluster size), at most one per tile slot of
  // the G groups (CTAs without tiles only zero-fill empty groups).
  int64_t grid = std::min<int64_t>(r.sm_count, r.groups * static_cast<int64_t>(p.group_tiles));
  grid = std::max<int64_t>(K::kCluster, grid / K::kCluster * K::kCluster);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(K::kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = r.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = K::kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, ma, mb, p);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    fail_status(MXMOE_ERR_CUDA, "grouped_mm_tile128_kgroups: kernel launch failed: ", cudaGetErrorString(e));
  return true;
}

static_assert(sm90::GroupedK<1, float>::kScaleFloats == kGroupedKScaleFloats,
              "grouped_k_stages (sm90_config.hpp) counts the kernel's scale slots");

// The instantiation of config c (sm90_config.hpp): cluster and producer.
template <class Out>
bool dispatch(const GroupedKRun& r, const Sm90GemmConfig& c) {
  constexpr int S = grouped_k_stages(static_cast<int>(sizeof(Out)));
  const bool pairs = c.cluster == 2;
  if (c.warp_producer)
    return pairs ? launch<sm90::GroupedK<S, Out, 2, true>>(r) : launch<sm90::GroupedK<S, Out, 1, true>>(r);
  return pairs ? launch<sm90::GroupedK<S, Out, 2>>(r) : launch<sm90::GroupedK<S, Out, 1>>(r);
}

}  // namespace

bool sm90_grouped_k(const GroupedKRun& r, const Sm90GemmConfig& c) {
  // TMA: 16-byte aligned bases and row strides; int32 shapes and tile counts; 16-byte output chunks.
  if (r.m <= 0 || r.n <= 0 || r.k <= 0 || r.groups <= 0 || r.k % 8 != 0) return false;
  if (reinterpret_cast<uintptr_t>(r.a) % 16 != 0 || reinterpret_cast<uintptr_t>(r.b) % 16 != 0) return false;
  if (r.lda % 16 != 0 || r.ldb % 16 != 0 || r.lda < r.m || r.ldb < r.m) return false;
  if (reinterpret_cast<uintptr_t>(r.out) % 16 != 0) return false;
  if (r.m >= (int64_t{1} << 31) || r.n >= (int64_t{1} << 31) || r.k >= (int64_t{1} << 31)) return false;
  if (r.groups * ((r.n + 127) / 128 * ((r.k + 127) / 128) + 1) >= (int64_t{1} << 31)) return false;
  return r.out_bf16 ? dispatch<__nv_bfloat16>(r, c) : dispatch<float>(r, c);
}

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
