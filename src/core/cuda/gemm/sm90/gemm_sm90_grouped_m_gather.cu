// Host side of the gather variants of the sm_90a M-grouped FP8 GEMM (stored output, the SwiGLU epilogue
// of the MoE layer's up projection, the dSwiGLU epilogue of its down-projection dgrad): checks, B's TMA descriptor, launch. sm_90a only (built with the CUTLASS-header SM90 objects, src/core/CMakeLists.txt).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "common/error.hpp"
#include "common/moe_activation.hpp"
#include "cuda/gemm/sm90/sm90_bf16_grouped_m_gather_dswiglu.cuh"
#include "cuda/gemm/sm90/sm90_bf16_grouped_m_gather_swiglu.cuh"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_1x128_128x128.cuh"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_gather_dswiglu_1x128.cuh"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_gather_swiglu_1x128.cuh"
#include "cuda/gemm/sm90/sm90_grouped_m_gather.hpp"
#include "cuda/gemm/sm90/sm90_host.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace {

// The one configuration: BlockN 128, the stages of the TMA kernel at BlockN 128 with bf16 output
// (5), no cluster (the producer warpgroup copies A; multicast of B is not wired for it).
using Kernel = sm90::GroupedMGather<128, 5, __nv_bfloat16>;
// The bf16 forms (the bf16 MoE layer): the same 32 KB stages (128-byte k-blocks of 64 elements).
using Bf16Kernel = sm90::GroupedMGather<128, 5, __nv_bfloat16, true, false>;
using Bf16KnKernel = sm90::GroupedMGather<128, 5, __nv_bfloat16, true, true>;
// Its dSwiGLU epilogue variant (a fourth warpgroup, one tile behind: the same ring).
using Bf16DSwigluKernel = sm90::GroupedMGatherDSwigluBf16<5>;
// Its SwiGLU epilogue variants (the epilogue in the math warpgroups): concatenated halves (a tile holds
// 64 gate and the same 64 up columns) and interleaved ones.
using Bf16SwigluKernel = sm90::GroupedMGatherSwigluBf16<5, false>;
using Bf16SwigluInterKernel = sm90::GroupedMGatherSwigluBf16<5, true>;
// The dSwiGLU epilogue's variant: the same mainloop with 3 stages beside its hand-over buffers (64 KB).
// 3 stages measured 11% faster than 4 at Qwen3-30B-A3B 16K (H100, same run), most likely because the
// shared memory left over is L1, which the epilogue's loads of h go through (docs/design/gemm-sm90.md).
using DSwigluKernel = sm90::GroupedMGatherDSwiglu<3>;
// The SwiGLU epilogue's variant: the same mainloop and stages, its two hand-over tiles (64 KB) beside them;
// concatenated and interleaved halves.
using SwigluKernel = sm90::GroupedMGatherSwiglu<4, false>;
using SwigluInterKernel = sm90::GroupedMGatherSwiglu<4, true>;

int device_sm_major(int device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return 0;
  return major;
}

// The gather fields of the device arguments and the launch, shared by the variants; false (nothing
// launched) where the shared memory does not fit. With always, a launch also for m == 0 (the fused
// epilogues write their outputs' tails).
template <class K>
bool launch_gather(const GroupedMGatherRun& r, sm90::GroupedMParams& p, const char* what, bool always) {
  void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const sm90::GroupedMParams) =
      sm90::grouped_m_kernel<K>;
  const int limit = sm90_prepare_smem(reinterpret_cast<const void*>(kernel), r.device);
  if (K::smem_bytes(r.groups) > static_cast<size_t>(limit)) return false;
  // B's boxes: BlockN / 2 rows of 128 bytes of K; MN-major (bf16 B[g] (K, N), r.k bytes): 64 K rows of
  // 128 bytes (64 columns) of N.
  const CUtensorMap mb =
      K::kBMajorMN ? kmajor_map(r.b, 2 * r.n, static_cast<uint64_t>(r.groups) * (r.k / 2), 2 * r.n, 64)
                   : kmajor_map(r.b, r.k, static_cast<uint64_t>(r.groups) * r.n, r.k, K::kBlockN / 2);
  // The tile order's columns: tiles, or pairs of tiles (an odd tile count: the last pair has a ghost).
  const int64_t tiles_n = (r.n + K::kBlockN - 1) / K::kBlockN;
  const int64_t nt = K::kPairs ? (tiles_n + 1) / 2 : tiles_n;
  p.band_div = sm90::make_fast_div(static_cast<uint32_t>(K::kBand * nt));
  p.gather = r.gather;
  p.a = r.a;
  p.lda = r.lda;
  p.max_index = static_cast<int>(r.a_rows * r.fanout - 1);  // -1 when A has no rows: every row zero
  p.fanout_div = sm90::make_fast_div(static_cast<uint32_t>(r.fanout));
  p.row_scale = r.row_scale;
  if (r.m == 0 && !always) return true;
  const int64_t upper = ((r.m + 127) / 128 + r.groups) * nt;  // m-tiles <= ceil(M / 128) + G (in pairs: pairs)
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(r.sm_count, upper));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(K::kThreads);
  cfg.dynamicSmemBytes = K::smem_bytes(r.groups);
  cfg.stream = r.stream;
  // The A map is unused by the gather variants (the producer copies A): B's map fills its slot, and
  // the output's where nothing is stored by TMA (the fused epilogues).
  CUtensorMap mo = mb;
  if constexpr (!K::kFusedEpilogue) mo = output_map(r.out, r.out_bf16, std::max<int64_t>(r.m, 1), r.n, K::kEpiBoxBytes);
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, mb, mb, mo, p);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, what, ": kernel launch failed: ", cudaGetErrorString(e));
  return true;
}

// The shape limits both variants share (int32 rows and shapes; 32-bit A byte offsets; the largest
// routed index through the 32-bit magic division).
bool gather_shape_ok(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows, int64_t lda, int64_t fanout,
                     int device) {
  if (device < 0 || device_sm_major(device) != 9) return false;
  if (m < 0 || n <= 0 || k <= 0 || k % 16 != 0 || n % 16 != 0 || groups <= 0 || fanout < 1) return false;
  if (lda < k || lda % 16 != 0) return false;
  if (m >= (int64_t{1} << 31) || n * groups >= (int64_t{1} << 31) || k >= (int64_t{1} << 31)) return false;
  if (a_rows >= (int64_t{1} << 31) || a_rows * lda >= (int64_t{1} << 32) || m * n >= (int64_t{1} << 62)) return false;
  return a_rows * fanout < (int64_t{1} << 31);
}

}  // namespace

bool sm90_grouped_m_gather_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows, int64_t lda,
                                 int64_t fanout, bool out_bf16, int device) {
  if (!out_bf16 || !gather_shape_ok(m, n, k, groups, a_rows, lda, fanout, device)) return false;
  return Kernel::smem_bytes(static_cast<int>(std::min<int64_t>(groups, 1 << 20))) <= 227 * 1024;
}

bool sm90_grouped_m_gather(const GroupedMGatherRun& r) {
  if (!sm90_grouped_m_gather_takes(r.m, r.n, r.k, r.groups, r.a_rows, r.lda, r.fanout, r.out_bf16, r.device))
    return false;
  if (reinterpret_cast<uintptr_t>(r.a) % 16 != 0 || reinterpret_cast<uintptr_t>(r.b) % 16 != 0) return false;
  sm90::GroupedMParams p = sm90::grouped_m_params(r);
  return launch_gather<Kernel>(r, p, "grouped_mm_tile128_gather", false);
}

bool sm90_grouped_m_gather_bf16_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows,
                                      int64_t fanout, bool b_kn, int device) {
  if (k % 8 != 0 || (b_kn && (k % 64 != 0 || n % 64 != 0)) || k >= (int64_t{1} << 30)) return false;
  if (!gather_shape_ok(m, n, 2 * k, groups, a_rows, 2 * k, fanout, device)) return false;
  if (b_kn && 2 * n * groups * k >= (int64_t{1} << 40)) return false;
  if (b_kn && groups * k >= (int64_t{1} << 31)) return false;  // B's TMA row coordinate g K + k0 is an int
  return Bf16Kernel::smem_bytes(static_cast<int>(std::min<int64_t>(groups, 1 << 20))) <= 227 * 1024;
}

bool sm90_grouped_m_gather_bf16(const GroupedMGatherRun& r, bool b_kn) {
  if (!sm90_grouped_m_gather_bf16_takes(r.m, r.n, r.k / 2, r.groups, r.a_rows, r.fanout, b_kn, r.device) ||
      r.lda != r.k || !r.out_bf16)
    return false;
  for (const void* q : {static_cast<const void*>(r.a), static_cast<const void*>(r.b), static_cast<const void*>(r.out)})
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  sm90::GroupedMParams p = sm90::grouped_m_params(r);
  p.bias = nullptr;
  return b_kn ? launch_gather<Bf16KnKernel>(r, p, "grouped_mm_bf16_gather", false)
              : launch_gather<Bf16Kernel>(r, p, "grouped_mm_bf16_gather", false);
}

bool sm90_grouped_m_gather_dswiglu_bf16_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows,
                                              int64_t fanout, int device) {
  if (!sm90_grouped_m_gather_bf16_takes(m, n, k, groups, a_rows, fanout, true, device)) return false;
  if (2 * n >= (int64_t{1} << 31)) return false;
  const int g = static_cast<int>(std::min<int64_t>(groups, 1 << 20));
  return Bf16DSwigluKernel::smem_bytes(g) <= 227 * 1024;
}

bool sm90_grouped_m_gather_dswiglu_bf16(const GroupedMGatherDSwigluBf16Run& r) {
  if (!sm90_grouped_m_gather_dswiglu_bf16_takes(r.m, r.n, r.k / 2, r.groups, r.a_rows, r.fanout, r.device) ||
      r.lda != r.k || r.h == nullptr || r.dh == nullptr || r.tw_part == nullptr)
    return false;
  for (const void* q : {static_cast<const void*>(r.a), static_cast<const void*>(r.b), static_cast<const void*>(r.h),
                        static_cast<const void*>(r.dh), static_cast<const void*>(r.act)})
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  sm90::GroupedMParams p = sm90::grouped_m_params(r);
  p.out = nullptr;
  p.bias = nullptr;
  p.h = r.h;
  if (r.layout != kSwigluConcat && r.layout != kSwigluInterleaved) return false;
  p.act = SwigluParams{r.layout, r.alpha, r.limit, r.up_offset};
  p.plain = swiglu_is_plain(p.act) ? 1 : 0;
  p.tw_part = r.tw_part;
  p.dh_bf16 = r.dh;
  p.act_bf16 = r.act;  // optional
  return launch_gather<Bf16DSwigluKernel>(r, p, "grouped_mm_bf16_gather_dswiglu", true);
}

bool sm90_grouped_m_gather_swiglu_bf16_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows,
                                             int64_t fanout, int layout, int device) {
  if (layout == kSwigluConcat ? n % 128 != 0 : layout != kSwigluInterleaved) return false;  // concat: I % 64
  if (!sm90_grouped_m_gather_bf16_takes(m, n, k, groups, a_rows, fanout, false, device)) return false;
  return Bf16SwigluKernel::smem_bytes(static_cast<int>(std::min<int64_t>(groups, 1 << 20))) <= 227 * 1024;
}

bool sm90_grouped_m_gather_swiglu_bf16(const GroupedMGatherSwigluBf16Run& r) {
  if (!sm90_grouped_m_gather_swiglu_bf16_takes(r.m, r.n, r.k / 2, r.groups, r.a_rows, r.fanout, r.layout, r.device) ||
      r.lda != r.k || r.out == nullptr || r.act == nullptr || !r.out_bf16)
    return false;
  for (const void* q : {static_cast<const void*>(r.a), static_cast<const void*>(r.b), static_cast<const void*>(r.out),
                        static_cast<const void*>(r.act)})
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  sm90::GroupedMParams p = sm90::grouped_m_params(r);  // with the bias (G, 2I), added before the SwiGLU
  p.act = SwigluParams{r.layout, r.alpha, r.limit, r.up_offset};
  p.plain = swiglu_is_plain(p.act) ? 1 : 0;
  p.act_bf16 = r.act;
  return r.layout == kSwigluInterleaved
             ? launch_gather<Bf16SwigluInterKernel>(r, p, "grouped_mm_bf16_gather_swiglu", true)
             : launch_gather<Bf16SwigluKernel>(r, p, "grouped_mm_bf16_gather_swiglu", true);
}

bool sm90_grouped_m_gather_dswiglu_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows,
                                         int64_t lda, int64_t fanout, int layout, int device) {
  if (layout != kSwigluConcat || n % 128 != 0 || !gather_shape_ok(m, n, k, groups, a_rows, lda, fanout, device))
    return false;
  // (M, 2I) and (2I, M) byte offsets in 64 bits; 2I columns as int32.
  if (2 * n >= (int64_t{1} << 31)) return false;
  return DSwigluKernel::smem_bytes(static_cast<int>(std::min<int64_t>(groups, 1 << 20))) <= 227 * 1024;
}

bool sm90_grouped_m_gather_dswiglu(const GroupedMGatherDSwigluRun& r) {
  if (!sm90_grouped_m_gather_dswiglu_takes(r.m, r.n, r.k, r.groups, r.a_rows, r.lda, r.fanout, kSwigluConcat,
                                           r.device))
    return false;
  if (reinterpret_cast<uintptr_t>(r.a) % 16 != 0 || reinterpret_cast<uintptr_t>(r.b) % 16 != 0) return false;
  // row_scale is read only through a routed index; with no tokens (T = 0) every row is a zero row.
  if ((r.row_scale == nullptr && r.a_rows > 0) || r.h == nullptr) return false;
  for (const void* q : {static_cast<const void*>(r.h), static_cast<const void*>(r.dh_q),
                        static_cast<const void*>(r.dh_qt)})
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(r.dh_scale) % 4 != 0) return false;
  sm90::GroupedMParams p = sm90::grouped_m_params(r);
  p.out = nullptr;
  p.bias = nullptr;
  p.h = r.h;
  p.act = SwigluParams{kSwigluConcat, r.alpha, r.limit, r.up_offset};
  p.plain = swiglu_is_plain(p.act) ? 1 : 0;
  p.mode = r.mode;
  p.q_row = r.dh_q;
  p.scale_row = r.dh_scale;
  p.q_col = r.dh_qt;
  p.scale_col = r.dh_scale_t;
  p.n_r = r.n_r;
  p.tw_part = r.tw_part;
  return launch_gather<DSwigluKernel>(r, p, "grouped_mm_tile128_gather_dswiglu", true);
}

bool sm90_grouped_m_gather_swiglu_takes(int64_t m, int64_t n, int64_t k, int64_t groups, int64_t a_rows,
                                        int64_t lda, int64_t fanout, int layout, int device) {
  if (layout != kSwigluConcat && layout != kSwigluInterleaved) return false;
  if (n % (layout == kSwigluConcat ? 256 : 128) != 0 || !gather_shape_ok(m, n, k, groups, a_rows, lda, fanout, device))
    return false;
  return SwigluKernel::smem_bytes(static_cast<int>(std::min<int64_t>(groups, 1 << 20))) <= 227 * 1024;
}

bool sm90_grouped_m_gather_swiglu(const GroupedMGatherSwigluRun& r) {
  if (!sm90_grouped_m_gather_swiglu_takes(r.m, r.n, r.k, r.groups, r.a_rows, r.lda, r.fanout, r.layout, r.device))
    return false;
  if (reinterpret_cast<uintptr_t>(r.a) % 16 != 0 || reinterpret_cast<uintptr_t>(r.b) % 16 != 0) return false;
  if ((r.qt == nullptr) != (r.scale_t == nullptr) || r.out == nullptr || !r.out_bf16) return false;
  if (r.layout == kSwigluConcat && r.bias != nullptr) return false;  // b13: the interleaved variant only
  for (const void* q : {static_cast<const void*>(r.out), static_cast<const void*>(r.q), static_cast<const void*>(r.qt)})
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(r.scale) % 4 != 0) return false;
  sm90::GroupedMParams p = sm90::grouped_m_params(r);  // bias: b13, added before the bf16 rounding of h
  p.act = SwigluParams{r.layout, r.alpha, r.limit, r.up_offset};
  p.plain = swiglu_is_plain(p.act) ? 1 : 0;
  p.mode = r.mode;
  p.q_row = r.q;
  p.scale_row = r.scale;
  p.q_col = r.qt;
  p.scale_col = r.scale_t;
  p.n_r = r.n_r;
  return r.layout == kSwigluInterleaved
             ? launch_gather<SwigluInterKernel>(r, p, "grouped_mm_tile128_gather_swiglu", true)
             : launch_gather<SwigluKernel>(r, p, "grouped_mm_tile128_gather_swiglu", true);
}

}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
