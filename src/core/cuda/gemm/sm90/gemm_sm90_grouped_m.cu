// Host side of the sm_90a M-grouped FP8 GEMM: TMA descriptors, the instantiation of a config, launch.
// sm_90a only (built with the CUTLASS-header SM90 objects, src/core/CMakeLists.txt).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "common/error.hpp"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_1x128_128x128.cuh"
#include "cuda/gemm/sm90/sm90_grouped_m.hpp"
#include "cuda/gemm/sm90/sm90_host.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace {

template <class K>
bool launch(const GroupedMRun& r) {
  void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const sm90::GroupedMParams) =
      sm90::grouped_m_kernel<K>;
  const int limit = sm90_prepare_smem(reinterpret_cast<const void*>(kernel), r.device);
  const size_t smem = K::smem_bytes(r.groups);
  if (smem > static_cast<size_t>(limit)) return false;
  const CUtensorMap ma = kmajor_map(r.a, r.k, r.m, r.k, 128);
  const CUtensorMap mb = kmajor_map(r.b, r.k, static_cast<uint64_t>(r.groups) * r.n, r.k, K::kBlockN / 2);
  const CUtensorMap mo = output_map(r.out, r.out_bf16, r.m, r.n, K::kEpiBoxBytes);
  sm90::GroupedMParams p = sm90::grouped_m_params(r);
  const int64_t nt = (r.n + K::kBlockN - 1) / K::kBlockN;
  // The tile decode's divisor: the tiles of a full band (N = 0: no tiles, any divisor >= 1).
  p.band_div = sm90::make_fast_div(static_cast<uint32_t>(K::kBand * std::max<int64_t>(nt, 1)));
  const int64_t upper = ((r.m + 127) / 128 + r.groups) * nt;  // m-tiles <= ceil(M / 128) + G
  // Persistent grid: one CTA per SM (a multiple of the cluster size), at most one per tile slot.
  int64_t grid = std::min<int64_t>(r.sm_count, (upper + K::kCluster - 1) / K::kCluster * K::kCluster);
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
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, ma, mb, mo, p);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, "grouped_mm_tile128: kernel launch failed: ", cudaGetErrorString(e));
  return true;
}

// The instantiation of config c (sm90_config.hpp): tile width, cluster, producer, and the lean
// layout's extra stage where it fits beside the group table (else the usual stages).
template <class Out, int Cluster>
bool dispatch_n(const GroupedMRun& r, Sm90GemmConfig& c) {
  constexpr int kOut = static_cast<int>(sizeof(Out));
  switch (c.block_n) {
    case 192:
      return launch<sm90::GroupedM<192, grouped_m_stages(192, kOut), Out, Cluster>>(r);
    case 160:
      return launch<sm90::GroupedM<160, grouped_m_stages(160, kOut), Out, Cluster>>(r);
    default: {
      constexpr int S = grouped_m_stages(128, kOut);
      const bool warp = c.warp_producer;
      if (c.lean && (warp ? launch<sm90::GroupedM<128, S + 1, Out, Cluster, true, true>>(r)
                          : launch<sm90::GroupedM<128, S + 1, Out, Cluster, true>>(r)))
        return true;
      const bool ran = warp ? launch<sm90::GroupedM<128, S, Out, Cluster, false, true>>(r)
                            : launch<sm90::GroupedM<128, S, Out, Cluster>>(r);
      if (ran && c.lean) {
        c.lean = false;
        c.stages = S;
      }
      return ran;
    }
  }
}

template <class Out>
bool dispatch(const GroupedMRun& r, Sm90GemmConfig& c) {
  return c.cluster == 2 ? dispatch_n<Out, 2>(r, c) : dispatch_n<Out, 1>(r, c);
}

}  // namespace

bool sm90_grouped_m(const GroupedMRun& r, Sm90GemmConfig& c) {
  // TMA: 16-byte aligned bases and row strides; int32 coordinates and shapes.
  if (r.k <= 0 || r.k % 16 != 0 || r.groups <= 0) return false;
  if (reinterpret_cast<uintptr_t>(r.a) % 16 != 0 || reinterpret_cast<uintptr_t>(r.b) % 16 != 0) return false;
  if (r.m >= (int64_t{1} << 31) || r.n * r.groups >= (int64_t{1} << 31) || r.k >= (int64_t{1} << 31)) return false;
  if (r.m * r.n >= (int64_t{1} << 62)) return false;
  return r.out_bf16 ? dispatch<__nv_bfloat16>(r, c) : dispatch<float>(r, c);
}

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
