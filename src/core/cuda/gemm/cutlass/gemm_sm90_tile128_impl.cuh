// CUTLASS SM90 blockwise-scaled grouped FP8 GEMMs for the tile128 recipe (sm_90a only).
//
// CUTLASS is used as a library through its headers: the collective is
// KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise (TMA loads, two consumer warpgroups,
// fp32 accumulation with the per-128-K partial of the FP8 wgmma scaled by the operand scales and
// added into fp32 accumulators), the tile scheduler is CUTLASS's persistent group scheduler, and
// the epilogue is the pointer-array TMA epilogue with an epilogue visitor tree that adds a
// per-expert bias row. The scale granularities are the recipe's coarse blocks:
//   forward / dgrad  A 1x128 along K (per row), B 128x128 tiles         -> (1, 128, 128)
//   wgrad            A and B 1x128 along tokens (per row of each)         -> (1, 1, 128)
// Each TU includes this header and instantiates one (pass, output dtype) pair, so the slow CUTLASS
// compilations run in parallel and a change recompiles one of them.
//
// Group problem descriptors (shapes, pointers, strides, scale layouts) are written on the device by
// the one-block kernel that also computes the GroupInfo array from offs (one launch per call), so
// nothing here reads offs on the host. The CUTLASS kernel is launched directly (one
// cudaLaunchKernelExC per call); its kernel attributes are set once per device (gemm() below).
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "common/error.hpp"
#include "cuda/gemm/gemm_tile128.cuh"
#include "mxmoe/mx_format.hpp"

#include "cute/tensor.hpp"
#include "cutlass/cluster_launch.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"

#if !defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED) && defined(__CUDA_ARCH__)
#error "the tile128 grouped GEMMs need CUTLASS's SM90 modifiable-TMA support (CUDA >= 12.3, sm_90a)"
#endif

namespace mxmoe {
namespace cuda {
namespace tile128 {
namespace sm90 {

using namespace cute;

// One grouped GEMM configuration. GranN: scale granularity along the output's N (128 for the
// weight tiles of forward/dgrad, 1 for wgrad's per-row B scales). TileN: CTA tile along N (128; a
// 128x192 wgrad tile was measured 20-30% slower: ptxas spills ~300 bytes, docs/design/gemm-sm90.md).
template <class ElementD_, int GranN, int TileN = 128>
struct Config {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = ElementD_;
  using LayoutA = cutlass::layout::RowMajor;     // (M, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // (K, N) viewed, i.e. (N, K) with K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  using TileShape = Shape<_128, Int<TileN>, _128>;
  using ClusterShape = Shape<_1, _2, _1>;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, GranN, kTile>;  // M-major SFs
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  // D = acc + bias[g][n] (bias pointer per group; a null array means no bias).
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float*, float, Stride<_0, _1, _0>>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElementD, float, cutlass::FloatRoundStyle::round_to_nearest>,
      cutlass::epilogue::fusion::Sm90AccFetch, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, ElementD,
      LayoutD*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA*, LayoutSFA*>,
      kAlignAB, ElementB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  static_assert(cute::is_same_v<StrideA, cute::Stride<int64_t, _1, _0>>, "A: K-major (M, K)");
  static_assert(cute::is_same_v<StrideB, cute::Stride<int64_t, _1, _0>>, "B: K-major (N, K)");
  static_assert(cute::is_same_v<StrideD, cute::Stride<int64_t, _1, _0>>, "D: row-major (M, N)");
};

// Per-group descriptor arrays carved from the caller's workspace.
template <class Cfg>
struct Desc {
  typename Cfg::Shape3* problem;
  const typename Cfg::ElementA** ptr_a;
  const typename Cfg::ElementB** ptr_b;
  typename Cfg::ElementD** ptr_d;
  const float** ptr_sfa;
  const float** ptr_sfb;
  float** ptr_bias;
  typename Cfg::StrideA* stride_a;
  typename Cfg::StrideB* stride_b;
  typename Cfg::StrideD* stride_d;
  typename Cfg::LayoutSFA* layout_sfa;
  typename Cfg::LayoutSFB* layout_sfb;
  void* cutlass_ws;
};

inline size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// sched = nullptr (workspace sizing): the device id and the scheduler knobs are left at their
// defaults; CUTLASS's workspace size depends on neither (the group scheduler needs no workspace, the
// SM count is given), and this saves the cudaGetDevice call of the sizing queries.
template <class Cfg>
typename Cfg::Gemm::Arguments make_args(const Desc<Cfg>& d, int groups, int sm_count, bool bias,
                                        const Schedule* sched) {
  typename Cfg::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {groups, d.problem, nullptr};  // shapes on the device only
  args.mainloop = {d.ptr_a, d.stride_a, d.ptr_b, d.stride_b, d.ptr_sfa, d.layout_sfa, d.ptr_sfb, d.layout_sfb};
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = d.stride_d;
  args.epilogue.ptr_D = d.ptr_d;
  args.epilogue.dD = d.stride_d;
  // EVT arguments: {acc fetch, bias row broadcast, plus}.
  args.epilogue.thread = {{}, {bias ? d.ptr_bias : nullptr, 0.0f, {}}, {}};
  args.hw_info.sm_count = sm_count;
  if (!sched) return args;
  cudaGetDevice(&args.hw_info.device_id);
  // Tile order of the persistent scheduler (the call's Sm90GemmConfig; defaults measured in
  // docs/design/gemm-sm90.md).
  using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.scheduler.raster_order = sched->raster_n ? Raster::AlongN : Raster::AlongM;
  args.scheduler.max_swizzle_size = sched->swizzle;
  return args;
}

// Bytes of the descriptor arrays + CUTLASS workspace, and the carving of a workspace pointer.
template <class Cfg>
size_t carve(void* base, int groups, int sm_count, Desc<Cfg>* out) {
  const size_t g = static_cast<size_t>(groups);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return base ? static_cast<char*>(base) + at : nullptr;
  };
  Desc<Cfg> d{};
  d.problem = reinterpret_cast<typename Cfg::Shape3*>(take(g * sizeof(typename Cfg::Shape3)));
  d.ptr_a = reinterpret_cast<const typename Cfg::ElementA**>(take(g * sizeof(void*)));
  d.ptr_b = reinterpret_cast<const typename Cfg::ElementB**>(take(g * sizeof(void*)));
  d.ptr_d = reinterpret_cast<typename Cfg::ElementD**>(take(g * sizeof(void*)));
  d.ptr_sfa = reinterpret_cast<const float**>(take(g * sizeof(void*)));
  d.ptr_sfb = reinterpret_cast<const float**>(take(g * sizeof(void*)));
  d.ptr_bias = reinterpret_cast<float**>(take(g * sizeof(void*)));
  d.stride_a = reinterpret_cast<typename Cfg::StrideA*>(take(g * sizeof(typename Cfg::StrideA)));
  d.stride_b = reinterpret_cast<typename Cfg::StrideB*>(take(g * sizeof(typename Cfg::StrideB)));
  d.stride_d = reinterpret_cast<typename Cfg::StrideD*>(take(g * sizeof(typename Cfg::StrideD)));
  d.layout_sfa = reinterpret_cast<typename Cfg::LayoutSFA*>(take(g * sizeof(typename Cfg::LayoutSFA)));
  d.layout_sfb = reinterpret_cast<typename Cfg::LayoutSFB*>(take(g * sizeof(typename Cfg::LayoutSFB)));
  const size_t ws = Cfg::Gemm::get_workspace_size(make_args<Cfg>(d, groups, sm_count, false, nullptr));
  d.cutlass_ws = take(ws);
  if (out) *out = d;
  return off;
}

template <class Cfg>
__device__ typename Cfg::StrideA kmajor(int64_t ld) {
  typename Cfg::StrideA s{};
  cute::get<0>(s) = ld;
  return s;
}

// ---- group info + descriptors: one single-block kernel per call --------------------------------

constexpr int kInfoThreads = 256;  // the block size of the info kernels (the shared chunk size below)

// offs -> GroupInfo, in the one block of an info kernel (blockDim.x <= kInfoThreads). Chunks of
// blockDim groups: load, scan on thread 0, then thread t writes info[base + t] and hands the same
// GroupInfo to emit(g, gi) (the per-group descriptor writer), so the descriptors never re-read
// info from global memory.
// stage_mode: 0 never stage (M-grouped); 1 stage groups whose start is not a multiple of 16;
// 2 stage every non-empty group; 3 never stage, and mark such groups kGroupUnreadable (K-grouped in
// place: no staging buffer).
template <class Emit>
__device__ void group_info_block(const int32_t* offs, int64_t offs_s, int groups, int64_t m, int stage_mode,
                                 GroupInfo* info, const Emit& emit) {
  __shared__ int64_t s_end[kInfoThreads];
  __shared__ int64_t s_carry[3];  // prev end, kb prefix, blk prefix
  __shared__ GroupInfo s_info[kInfoThreads];
  if (threadIdx.x == 0) s_carry[0] = s_carry[1] = s_carry[2] = 0;
  for (int base = 0; base < groups; base += blockDim.x) {
    const int g = base + threadIdx.x;
    const int n = min(static_cast<int>(blockDim.x), groups - base);
    if (g < groups) s_end[threadIdx.x] = offs[g * offs_s];
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t prev = s_carry[0], kb = s_carry[1], blk = s_carry[2];
      for (int i = 0; i < n; ++i) {
        const int64_t o = s_end[i];
        const int64_t e = o < prev ? prev : (o > m ? m : o);
        GroupInfo gi{};
        gi.start = prev;
        gi.len = e - prev;
        gi.kb_off = kb;
        gi.blk_off = blk;
        const bool off16 = gi.len > 0 && gi.start % 16 != 0;
        const bool stage = gi.len > 0 && (stage_mode == 2 || (stage_mode == 1 && off16));
        gi.stage_col = stage ? ((gi.start + 15) / 16 * 16 + 16 * static_cast<int64_t>(base + i))
                             : (stage_mode == 3 && off16 ? kGroupUnreadable : -1);
        s_info[i] = gi;
        kb += (gi.len + kTile - 1) / kTile;
        blk += (gi.len + kBlock - 1) / kBlock;
        prev = e;
      }
      s_carry[0] = prev;
      s_carry[1] = kb;
      s_carry[2] = blk;
    }
    __syncthreads();
    if (g < groups) {
      const GroupInfo gi = s_info[threadIdx.x];
      info[g] = gi;
      emit(g, gi);
    }
    __syncthreads();
  }
}

// Forward / dgrad descriptors: group g is rows [start, start + len) of A and out, expert g of B.
template <class Cfg>
struct FwdDescEmit {
  FwdPlan p;
  Desc<Cfg> d;
  __device__ void operator()(int g, const GroupInfo& gi) const {
    using EA = typename Cfg::ElementA;
    using EB = typename Cfg::ElementB;
    using ED = typename Cfg::ElementD;
    const int64_t kb = (p.k + kTile - 1) / kTile, nb = (p.n + kTile - 1) / kTile;
    const int m = static_cast<int>(gi.len), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    d.problem[g] = typename Cfg::Shape3(m, n, k);
    d.ptr_a[g] = reinterpret_cast<const EA*>(p.a + gi.start * p.k);
    d.ptr_b[g] = reinterpret_cast<const EB*>(p.b + static_cast<int64_t>(g) * p.n * p.k);
    d.ptr_d[g] = static_cast<ED*>(p.out) + gi.start * p.n;
    d.ptr_sfa[g] = p.sfa + gi.start * kb;
    d.ptr_sfb[g] = p.sfb + static_cast<int64_t>(g) * nb * kb;
    d.ptr_bias[g] = p.bias ? const_cast<float*>(p.bias) + static_cast<int64_t>(g) * p.n : nullptr;
    d.stride_a[g] = kmajor<Cfg>(p.k);
    d.stride_b[g] = kmajor<Cfg>(p.k);
    d.stride_d[g] = kmajor<Cfg>(p.n);
    d.layout_sfa[g] = Cfg::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
    d.layout_sfb[g] = Cfg::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
  }
};

// Wgrad descriptors: problem (N, K, len_g); empty groups get M = 0 (no tiles; zeroed elsewhere,
// since a K = 0 problem would leave CUTLASS's accumulators unwritten).
template <class Cfg>
struct KgDescEmit {
  KgPlan p;
  Desc<Cfg> d;
  __device__ void operator()(int g, const GroupInfo& gi) const {
    using EA = typename Cfg::ElementA;
    using EB = typename Cfg::ElementB;
    using ED = typename Cfg::ElementD;
    // Empty and unreadable groups: no tiles (the prologue writes their outputs).
    const bool tiles = gi.len > 0 && gi.stage_col != kGroupUnreadable;
    const int m = tiles ? static_cast<int>(p.n) : 0, n = static_cast<int>(p.k);
    const int k = tiles ? static_cast<int>(gi.len) : 0;
    d.problem[g] = typename Cfg::Shape3(m, n, k);
    const bool staged = gi.stage_col >= 0;
    const uint8_t* a = staged ? p.a_stage + gi.stage_col : p.a + gi.start;
    const uint8_t* b = staged ? p.b_stage + gi.stage_col : p.b + gi.start;
    d.ptr_a[g] = reinterpret_cast<const EA*>(a);
    d.ptr_b[g] = reinterpret_cast<const EB*>(b);
    d.ptr_d[g] = static_cast<ED*>(p.out) + static_cast<int64_t>(g) * p.n * p.k;
    d.ptr_sfa[g] = p.sfa + gi.kb_off * p.n;
    d.ptr_sfb[g] = p.sfb + gi.kb_off * p.k;
    d.ptr_bias[g] = nullptr;
    d.stride_a[g] = kmajor<Cfg>(staged ? p.ld_stage : p.lda);
    d.stride_b[g] = kmajor<Cfg>(staged ? p.ld_stage : p.ldb);
    d.stride_d[g] = kmajor<Cfg>(p.k);
    d.layout_sfa[g] = Cfg::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
    d.layout_sfb[g] = Cfg::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
  }
};

// One block: GroupInfo[G] into p.info (the caller's workspace; the later prologue kernels read it)
// and the CUTLASS descriptors of every group.
template <class Cfg>
__global__ void __launch_bounds__(kInfoThreads) fwd_info_desc_kernel(const int32_t* offs, int64_t offs_s,
                                                                    FwdPlan p, Desc<Cfg> d) {
  group_info_block(offs, offs_s, p.groups, p.m, 0, const_cast<GroupInfo*>(p.info), FwdDescEmit<Cfg>{p, d});
}

template <class Cfg>
__global__ void __launch_bounds__(kInfoThreads) kg_info_desc_kernel(const int32_t* offs, int64_t offs_s,
                                                                   int stage_mode, KgPlan p, Desc<Cfg> d) {
  group_info_block(offs, offs_s, p.groups, p.m, stage_mode, const_cast<GroupInfo*>(p.info), KgDescEmit<Cfg>{p, d});
}

inline void check_cutlass(cutlass::Status s, const char* what) {
  if (s != cutlass::Status::kSuccess)
    fail_status(MXMOE_ERR_CUDA, what, ": CUTLASS returned ", cutlassGetStatusString(s));
}

inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, what, ": ", cudaGetErrorString(e));
}

inline void check_cuda(cudaError_t e, const char* what, const char* call) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) error so a later launch check does not report it, as CUTLASS does
    fail_status(MXMOE_ERR_CUDA, what, ": ", call, ": ", cudaGetErrorString(e));
  }
}

// The kernel attributes CUTLASS's adapter sets on every call (GemmUniversalAdapter::initialize:
// the dynamic shared-memory opt-in; ClusterLauncher::launch -> init: non-portable cluster sizes
// allowed), set once per (kernel, device) instead: both are per-kernel settings of the device's
// context and this TU is the only code that launches device_kernel<GemmKernel>. The opt-in is only
// ever raised (SharedStorageSize is a constant of the kernel, so it is set once).
template <class GemmKernel>
void set_kernel_attributes_once(int device, const char* what) {
  static std::mutex mu;
  static std::vector<int> opt_in;  // per device: the shared-memory opt-in set so far, 0 = none yet
  constexpr int smem = static_cast<int>(GemmKernel::SharedStorageSize);
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) fail_status(MXMOE_ERR_CUDA, what, ": no current CUDA device");
  if (static_cast<size_t>(device) >= opt_in.size()) opt_in.resize(static_cast<size_t>(device) + 1, 0);
  const int want = smem > 0 ? smem : 1;
  if (opt_in[device] >= want) return;
  const void* kernel = reinterpret_cast<const void*>(&cutlass::device_kernel<GemmKernel>);
  if (smem >= (48 << 10))
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what,
               "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), what,
             "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)");
  opt_in[device] = want;
}

// Writes GroupInfo + descriptors (one launch). The GEMM (gemm() below) reads the descriptors; the
// caller's prologue kernels launched between the two read GroupInfo.
template <class Cfg>
void fwd_info_desc(const FwdPlan& p, const int32_t* offs, int64_t offs_s, const char* what) {
  Desc<Cfg> d{};
  carve<Cfg>(p.desc, p.groups, p.sm_count, &d);
  fwd_info_desc_kernel<Cfg><<<1, kInfoThreads, 0, p.stream>>>(offs, offs_s, p, d);
  check_launch(what);
}

template <class Cfg>
void kg_info_desc(const KgPlan& p, const int32_t* offs, int64_t offs_s, int stage_mode, const char* what) {
  Desc<Cfg> d{};
  carve<Cfg>(p.desc, p.groups, p.sm_count, &d);
  kg_info_desc_kernel<Cfg><<<1, kInfoThreads, 0, p.stream>>>(offs, offs_s, stage_mode, p, d);
  check_launch(what);
}

// The CUTLASS grouped GEMM with exactly one runtime launch per call: what
// GemmUniversalAdapter::initialize + run do, without the per-call attribute calls.
//   initialize: GemmKernel::initialize_workspace (host code; for this kernel every component -- the
//     blockwise mainloop, the group tile scheduler, the EVT epilogue -- returns kSuccess without
//     launching anything; kept so a CUTLASS update that needs it still gets it), then
//     GemmKernel::to_underlying_arguments (host: TMA descriptor templates, scheduler params), then
//     cudaFuncSetAttribute(MaxDynamicSharedMemorySize) -> once per (kernel, device);
//   run (SM90 cluster launch, cluster 1x2x1, no host adapter, no PDL): ClusterLauncher::launch =
//     make_cluster_launch_config + check_cluster_dims + init (cudaFuncSetAttribute(
//     NonPortableClusterSizeAllowed) -> once per (kernel, device)) + cudaLaunchKernelExC.
// can_implement is evaluated once per Cfg: with the problem shapes on the device only (host shapes
// null) it checks the mode (kGrouped) and the rank of the problem shape; the per-group alignment
// checks of the mainloop and the epilogue are skipped without host shapes, the group scheduler
// accepts every argument and the EVT epilogue has no beta. Its answer is the same for every call.
template <class Cfg>
void gemm(const Desc<Cfg>& d, int groups, int sm_count, bool bias, const Schedule& sched, cudaStream_t stream,
          const char* what) {
  using Gemm = typename Cfg::Gemm;
  using GemmKernel = typename Gemm::GemmKernel;
  static_assert(!Gemm::kEnableCudaHostAdapter, "the launch below replicates the adapter without a host adapter");
  static_assert(GemmKernel::ArchTag::kMinComputeCapability == 90, "the launch below is the SM90 cluster launch");
  using ClusterShape = typename GemmKernel::DispatchPolicy::ClusterShape;
  static_assert(cute::is_static_v<ClusterShape> && cute::size(ClusterShape{}) > 1,
                "GemmUniversalAdapter launches a static 1x1x1 cluster through a different path");
  constexpr int smem = static_cast<int>(GemmKernel::SharedStorageSize);

  auto args = make_args<Cfg>(d, groups, sm_count, bias, &sched);
  static const cutlass::Status implementable = Gemm::can_implement(args);
  check_cutlass(implementable, what);
  set_kernel_attributes_once<GemmKernel>(args.hw_info.device_id, what);
  check_cutlass(GemmKernel::initialize_workspace(args, d.cutlass_ws, stream, nullptr), what);
  typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(args, d.cutlass_ws);

  const dim3 block = GemmKernel::get_block_shape();
  const dim3 grid = GemmKernel::get_grid_shape(params);
  const dim3 cluster(cute::size<0>(ClusterShape{}), cute::size<1>(ClusterShape{}), cute::size<2>(ClusterShape{}));
  auto config = cutlass::ClusterLauncher::make_cluster_launch_config(grid, cluster, block, smem, stream, false);
  check_cutlass(cutlass::ClusterLauncher::check_cluster_dims(config.gridDim(), cluster), what);
  void* kernel_params[] = {&params};
  const void* kernel = reinterpret_cast<const void*>(&cutlass::device_kernel<GemmKernel>);
  check_cuda(cudaLaunchKernelExC(&config.launch_config, kernel, kernel_params), what, "cudaLaunchKernelExC");
  check_launch(what);
}

template <class Cfg, class Plan>
void run(const Plan& p, bool bias, const Schedule& sched, const char* what) {
  Desc<Cfg> d{};
  carve<Cfg>(p.desc, p.groups, p.sm_count, &d);
  gemm<Cfg>(d, p.groups, p.sm_count, bias, sched, p.stream, what);
}

}  // namespace sm90
}  // namespace tile128
}  // namespace cuda
}  // namespace mxmoe

// Instantiates the entry points of one (pass, output) pair in a TU. Per call the dispatch
// (gemm_tile128.cu) calls *_info_desc_* (one single-block kernel: GroupInfo + descriptors), launches
// its fused prologue kernel, then *_run_* (the CUTLASS GEMM only). The *_info_desc_* entry points are
// declared in gemm_tile128.cu next to their one caller.
#define MXMOE_TILE128_FWD(SUFFIX, ELEMENT_D)                                                          \
  namespace mxmoe { namespace cuda { namespace tile128 {                                             \
  using FwdCfg_##SUFFIX = sm90::Config<ELEMENT_D, kTile>;                                            \
  size_t fwd_desc_bytes_##SUFFIX(int groups, int sm_count) {                                         \
    return sm90::carve<FwdCfg_##SUFFIX>(nullptr, groups, sm_count, nullptr);                         \
  }                                                                                                  \
  void fwd_info_desc_##SUFFIX(const FwdPlan& p, const int32_t* offs, int64_t offs_s) {               \
    sm90::fwd_info_desc<FwdCfg_##SUFFIX>(p, offs, offs_s, "grouped_mm_tile128");                     \
  }                                                                                                  \
  void fwd_run_##SUFFIX(const FwdPlan& p, const Schedule& s) {                                      \
    sm90::run<FwdCfg_##SUFFIX>(p, p.bias != nullptr, s, "grouped_mm_tile128");                       \
  }                                                                                                  \
  }}}

#define MXMOE_TILE128_KG(SUFFIX, ELEMENT_D, TILE_N)                                                   \
  namespace mxmoe { namespace cuda { namespace tile128 {                                             \
  using KgCfg_##SUFFIX = sm90::Config<ELEMENT_D, 1, TILE_N>;                                         \
  size_t kg_desc_bytes_##SUFFIX(int groups, int sm_count) {                                          \
    return sm90::carve<KgCfg_##SUFFIX>(nullptr, groups, sm_count, nullptr);                          \
  }                                                                                                  \
  void kg_info_desc_##SUFFIX(const KgPlan& p, const int32_t* offs, int64_t offs_s, int stage_mode) { \
    sm90::kg_info_desc<KgCfg_##SUFFIX>(p, offs, offs_s, stage_mode, "grouped_mm_tile128_kgroups");   \
  }                                                                                                  \
  void kg_run_##SUFFIX(const KgPlan& p, const Schedule& s) {                                        \
    sm90::run<KgCfg_##SUFFIX>(p, false, s, "grouped_mm_tile128_kgroups");                            \
  }                                                                                                  \
  }}}
