// Host side of the sm_90a K-grouped (wgrad) FP8 GEMM: TMA descriptors, the instantiation of a config,
// launch.
// sm_90a only (built with the CUTLASS-header SM90 objects, src/core/CMakeLists.txt).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "common/error.hpp"
#include "cuda/gemm/sm90/sm90_fp8_grouped_k_1x128_1x128.cuh"
#include "cuda/gemm/sm90/sm90_grouped_k.hpp"
#include "cuda/gemm/sm90/sm90_host.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace {

// The workspace's two regions: A's and B's prepared scales (sm90::GroupedKScales).
struct Scratch {
  float* sf_a;
  float* sf_b;
  int64_t bytes;
};
Scratch scratch(int64_t m, int64_t n, int64_t k, int64_t g, void* base) {
  const int64_t a = sm90::GroupedKScales::a_floats(m, n, g) * 4, b = sm90::GroupedKScales::b_floats(m, k, g) * 4;
  char* p = static_cast<char*>(base);
  return {reinterpret_cast<float*>(p), reinterpret_cast<float*>(p ? p + a : nullptr), a + b};  // a % 512 == 0
}
Scratch scratch(const GroupedKRun& r) { return scratch(r.m, r.n, r.k, r.groups, r.workspace); }

// What the scale preparation's and the GEMM's device arguments share: the group ends, the shape and
// the prepared scales' two regions.
template <class P>
void fill_shared(P& p, const GroupedKRun& r, const Scratch& ws) {
  p.offs = r.offs;
  p.offs_s = r.offs_s;
  p.groups = r.groups;
  p.m = static_cast<int>(r.m);
  p.n = static_cast<int>(r.n);
  p.k = static_cast<int>(r.k);
  p.sf_a = ws.sf_a;
  p.sf_b = ws.sf_b;
}

// check_only: whether the instantiation's shared memory fits (its group tables grow with G), nothing
// launched.
template <class K>
bool launch(const GroupedKRun& r, bool check_only) {
  void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const sm90::GroupedKParams) =
      sm90::grouped_k_kernel<K>;
  const int limit = sm90_prepare_smem(reinterpret_cast<const void*>(kernel), r.device);
  const size_t smem = K::smem_bytes(r.groups);
  if (smem > static_cast<size_t>(limit)) return false;
  if (check_only) return true;
  const CUtensorMap ma = kmajor_map(r.a, r.m, r.n, r.lda, K::kBlockM / 2);  // boxes in two halves
  const CUtensorMap mb = kmajor_map(r.b, r.m, r.k, r.ldb, K::kBlockN / 2);
  // The output as (G N, K) rows: a warpgroup's 64 rows of a tile are stored by TMA when all are < N.
  const CUtensorMap mo = output_map(r.out, r.out_bf16, static_cast<uint64_t>(r.groups) * r.n, r.k, K::kEpiBoxBytes);
  const int64_t mt = (r.n + K::kBlockM - 1) / K::kBlockM, nt = (r.k + K::kBlockN - 1) / K::kBlockN;
  const Scratch ws = scratch(r);
  sm90::GroupedKParams p{};
  fill_shared(p, r, ws);
  p.out = r.out;
  // A group's slots: its tiles in blocks of kClusterM x kClusterN (sm90::ktile).
  const int64_t bm = (mt + K::kClusterM - 1) / K::kClusterM, bn = (nt + K::kClusterN - 1) / K::kClusterN;
  p.group_tiles = static_cast<int>(bm * bn * K::kCluster);
  p.group_div = sm90::make_fast_div(static_cast<uint32_t>(p.group_tiles));
  p.band_div = sm90::make_fast_div(static_cast<uint32_t>(K::kBandBlocks * bn));
  cudaLaunchConfig_t cfg{};
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
  // Persistent grid: one CTA per SM (a multiple of the cluster size; at 4, as many clusters as can
  // be resident at once: a GPC's SMs need not divide by 4), at most one per tile slot of the G groups
  // (CTAs without tiles only zero-fill empty groups).
  int64_t sms = r.sm_count;
  if (K::kCluster > 2) {
    cfg.gridDim = dim3(K::kCluster);  // the query's grid: one cluster
    sms = std::min<int64_t>(sms, K::kCluster * sm90_max_clusters(reinterpret_cast<const void*>(kernel), r.device, cfg));
  }
  int64_t grid = std::min<int64_t>(sms, r.groups * static_cast<int64_t>(p.group_tiles));
  grid = std::max<int64_t>(K::kCluster, grid / K::kCluster * K::kCluster);
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  // Each k-block's scales as fp32 in the producer's order (grouped_k_prepare_scales), then the GEMM.
  sm90::GroupedKScales sp{};
  fill_shared(sp, r, ws);
  sp.a_scale = r.a_scale;
  sp.as_s0 = r.as_s0;
  sp.b_scale = r.b_scale;
  sp.bs_s0 = r.bs_s0;
  const dim3 prep_grid(static_cast<unsigned>(mt + nt), static_cast<unsigned>(r.groups));
  sm90::grouped_k_prepare_scales<<<prep_grid, 128, 0, r.stream>>>(sp);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaLaunchKernelEx(&cfg, kernel, ma, mb, mo, p);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    fail_status(MXMOE_ERR_CUDA, "grouped_mm_tile128_kgroups: kernel launch failed: ", cudaGetErrorString(e));
  return true;
}

static_assert(sm90::GroupedK<1, float>::kScaleFloats == kGroupedKScaleFloats,
              "grouped_k_stages (sm90_config.hpp) counts the kernel's scale slots");

// The instantiation of config c (sm90_config.hpp): cluster and producer.
template <class Out>
bool dispatch(const GroupedKRun& r, const Sm90GemmConfig& c, bool check_only) {
  constexpr int S = grouped_k_stages(static_cast<int>(sizeof(Out)));
  auto go = [&](auto warp_producer) {
    constexpr bool W = decltype(warp_producer)::value;
    switch (c.cluster) {
      case 4: return launch<sm90::GroupedK<S, Out, 4, W>>(r, check_only);
      case 2: return launch<sm90::GroupedK<S, Out, 2, W>>(r, check_only);
      default: return launch<sm90::GroupedK<S, Out, 1, W>>(r, check_only);
    }
  };
  return c.warp_producer ? go(std::true_type{}) : go(std::false_type{});
}

// What the kernel takes apart from its workspace.
bool operands_ok(const GroupedKRun& r, const Sm90GemmConfig& c) {
  // TMA: 16-byte aligned bases and row strides; int32 shapes and tile counts; 16-byte output chunks.
  if (r.m <= 0 || r.n <= 0 || r.k <= 0 || r.groups <= 0 || r.k % 8 != 0) return false;
  if (reinterpret_cast<uintptr_t>(r.a) % 16 != 0 || reinterpret_cast<uintptr_t>(r.b) % 16 != 0) return false;
  if (r.lda % 16 != 0 || r.ldb % 16 != 0 || r.lda < r.m || r.ldb < r.m) return false;
  if (reinterpret_cast<uintptr_t>(r.out) % 16 != 0) return false;
  if (r.m >= (int64_t{1} << 31) || r.n >= (int64_t{1} << 31) || r.k >= (int64_t{1} << 31)) return false;
  if (r.groups * ((r.n + 127) / 128 * ((r.k + 127) / 128) + 1) >= (int64_t{1} << 31)) return false;
  if (r.groups * r.n >= (int64_t{1} << 31)) return false;  // the output's TMA row coordinate
  if (r.groups > 65535) return false;  // the scale preparation's grid.y
  return r.out_bf16 ? dispatch<__nv_bfloat16>(r, c, true) : dispatch<float>(r, c, true);
}

}  // namespace

bool sm90_grouped_k_takes(const GroupedKRun& r, const Sm90GemmConfig& c) { return operands_ok(r, c); }

bool sm90_grouped_k(const GroupedKRun& r, const Sm90GemmConfig& c) {
  if (!operands_ok(r, c)) return false;
  // The prepared scales: a workspace of the size query's bytes, 16-byte aligned (bulk copies).
  if (reinterpret_cast<uintptr_t>(r.workspace) % 16 != 0 ||
      r.workspace_bytes < sm90_grouped_k_workspace_size(r.m, r.n, r.k, r.groups))
    return false;
  return r.out_bf16 ? dispatch<__nv_bfloat16>(r, c, false) : dispatch<float>(r, c, false);
}

int64_t sm90_grouped_k_workspace_size(int64_t m, int64_t n, int64_t k, int64_t groups) {
  return scratch(m, n, k, groups, nullptr).bytes;
}

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
