// Interface between the tile128 GEMM dispatch (gemm_tile128.cu: workspace carving, group info,
// scale conversion, staging and zero-fill kernels; built for every CUDA arch) and the CUTLASS
// SM90 kernels (cutlass/gemm_sm90_*.cu: sm_90a only, built when CUTLASS headers are found). Plain types
// only, so the dispatch TU never includes CUTLASS.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace mxmoe {
namespace cuda {
namespace tile128 {

constexpr int kTile = 128;  // coarse block along the reduction dim, and the CTA tile M = N = K

// One token group, computed on the device from offs by the group-info kernel (clamped like
// groups_from_offsets: end_g = min(M, max(end_{g-1}, offs[g])), start_g = end_{g-1}).
struct GroupInfo {
  int64_t start;    // first token (row for M-grouped, column of the (R, M) operands for K-grouped)
  int64_t len;      // tokens in the group (0 for empty)
  int64_t kb_off;   // sum_{h<g} ceil(len_h / 128): first 128-block of the group (K-grouped scales)
  int64_t blk_off;  // sum_{h<g} ceil(len_h / 32): first 32-run in the grouped compact scale layout
  int64_t stage_col;  // K-grouped: column of the group in the staging buffer, -1 = read in place,
                      // kGroupUnreadable: not readable in place and no staging (in-place calls)
  int64_t pad;
};

// A K-grouped call without staging (mxmoe_grouped_mm_tile128_kgroups_in_place) whose group starts off a
// multiple of 16 tokens: the group gets no tiles and its output is written as NaN.
constexpr int64_t kGroupUnreadable = -2;

// Forward / dgrad: out (M, N) = A (M, K) . B[g] (N, K)^T over row groups (+ bias[g]).
// sfa: fp32 scales of A, per group g packed M-major at sfa + start_g * kb: [kb][len_g] (a 1x128
// block per row and 128 of K); sfb: (G, nb, kb) M-major per expert: [kb][nb]; bias fp32 (G, N) or
// null. Group g with len 0 gets an empty problem (no tiles).
struct FwdPlan {
  int groups = 0;
  int64_t m = 0, n = 0, k = 0;
  const GroupInfo* info = nullptr;
  const uint8_t* a = nullptr;
  const uint8_t* b = nullptr;
  void* out = nullptr;
  const float* sfa = nullptr;
  const float* sfb = nullptr;
  const float* bias = nullptr;
  void* desc = nullptr;  // fwd_desc_bytes() of device workspace: CUTLASS descriptors + workspace
  int sm_count = 0;
  cudaStream_t stream = nullptr;
};

// Wgrad: out[g] (N, K) = A[:, group] (N, len_g) . B[:, group] (K, len_g)^T. A group reads its
// tokens in place (a + start, row stride lda) or, when stage_col >= 0, from the staging copies
// (a_stage + stage_col, row stride ld_stage) where every group starts 16-byte aligned.
// sfa / sfb: fp32, per group g packed M-major at N * kb_off_g / K * kb_off_g: [kb][row].
struct KgPlan {
  int groups = 0;
  int64_t m = 0, n = 0, k = 0;
  const GroupInfo* info = nullptr;
  const uint8_t* a = nullptr;
  const uint8_t* b = nullptr;
  int64_t lda = 0, ldb = 0;
  const uint8_t* a_stage = nullptr;
  const uint8_t* b_stage = nullptr;
  int64_t ld_stage = 0;
  void* out = nullptr;
  const float* sfa = nullptr;
  const float* sfb = nullptr;
  void* desc = nullptr;
  int sm_count = 0;
  cudaStream_t stream = nullptr;
};

// Bytes of device workspace the CUTLASS side needs (descriptor arrays + CUTLASS's own workspace).
size_t fwd_desc_bytes_bf16(int groups, int sm_count);
size_t fwd_desc_bytes_f32(int groups, int sm_count);
size_t kg_desc_bytes_bf16(int groups, int sm_count);
size_t kg_desc_bytes_f32(int groups, int sm_count);

// The tile order of CUTLASS's persistent scheduler (Sm90GemmConfig's raster_n / swizzle).
struct Schedule {
  bool raster_n = false;  // along N (else along M)
  int swizzle = 1;        // max swizzle size
};

// Launch the CUTLASS grouped GEMM alone on plan.stream (the descriptors come from the info+descriptor
// kernel launched before it, *_info_desc_* in gemm_tile128.cu). Throw mxmoe::Error.
void fwd_run_bf16(const FwdPlan& p, const Schedule& s);
void fwd_run_f32(const FwdPlan& p, const Schedule& s);
void kg_run_bf16(const KgPlan& p, const Schedule& s);
void kg_run_f32(const KgPlan& p, const Schedule& s);

}  // namespace tile128
}  // namespace cuda
}  // namespace mxmoe
