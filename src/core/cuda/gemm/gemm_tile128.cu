// tile128 grouped GEMMs on Hopper: the work around the CUTLASS kernels (cutlass/gemm_sm90_*.cu).
//
// One call = three stream-ordered launches; nothing syncs the host, nothing is allocated (all
// scratch lives in the caller's workspace), so a call can be captured in a CUDA graph.
//   1. info + descriptors (one block; gemm_sm90_tile128_impl.cuh): offs -> GroupInfo[G] (clamped
//      starts/lengths, block prefixes, staging columns) and the CUTLASS per-group descriptors
//   2. fused prologue (one grid, its jobs split by blockIdx ranges; reads GroupInfo):
//        scale conversion  E8M0 bytes (one per 32-run, repeated over each coarse block) -> the fp32
//                          per-block scales CUTLASS reads, in its M-major per-group layouts
//                          (+ forward: bias -> fp32)
//        wgrad only: staging copy of the (R, M) operands' token columns for groups whose first
//                          token is not 16-byte aligned (TMA needs 16-byte aligned group bases and
//                          row strides); forward and dgrad never stage
//        zero fill         forward: rows past the last group; wgrad: outputs of empty groups
//   3. the CUTLASS grouped GEMM (cutlass/gemm_sm90_*.cu; one cudaLaunchKernelExC, kernel attributes set
//      once per device)
//
// Workspace layout (each piece 256-byte aligned; sizes from static bounds, never from offs):
//   forward: GroupInfo[G] | sfa f32 [M * kb] | sfb f32 [G * nb * kb] | bias f32 [G * N] | CUTLASS
//   wgrad:   GroupInfo[G] | sfa f32 [N * cap128] | sfb f32 [K * cap128] | A stage [N * lds] |
//            B stage [K * lds] | CUTLASS           (cap128 = ceil(M/128) + G, lds = staging stride)
//            or, for the own sm_90a kernel, its prepared scales (sm90_grouped_k_workspace_size) from
//            the start: the size is the larger of the two
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/error.hpp"
#include "common/int_math.hpp"
#include "cuda/gemm/sm90/sm90_grouped_k.hpp"
#include "cuda/gemm/sm90/sm90_grouped_m.hpp"
#include "cuda/gemm/sm90/sm90_grouped_k_gather.hpp"
#include "cuda/gemm/sm90/sm90_grouped_m_gather.hpp"
#include "cuda/gemm/gemm_tile128.cuh"
#include "mxmoe/mx_format.hpp"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {

#if defined(MXMOE_HAVE_CUTLASS)
namespace tile128 {
// Info + descriptor launch of the CUTLASS side (defined by MXMOE_TILE128_FWD / MXMOE_TILE128_KG in
// gemm_sm90_tile128_impl.cuh, next to fwd_run_* / kg_run_*, which now launch the GEMM only): one
// single-block kernel writing p.info (GroupInfo[G] from offs) and the CUTLASS descriptors in p.desc.
// stage_mode: 0 never stage, 1 stage groups starting off a 16-token boundary, 2 stage every group.
void fwd_info_desc_bf16(const FwdPlan& p, const int32_t* offs, int64_t offs_s);
void fwd_info_desc_f32(const FwdPlan& p, const int32_t* offs, int64_t offs_s);
void kg_info_desc_bf16(const KgPlan& p, const int32_t* offs, int64_t offs_s, int stage_mode);
void kg_info_desc_f32(const KgPlan& p, const int32_t* offs, int64_t offs_s, int stage_mode);
}  // namespace tile128
#endif

namespace {

using tile128::GroupInfo;
using tile128::kGroupUnreadable;
using tile128::kTile;

constexpr int64_t kAlign = 256;

// Staging stride: group g lands at column round_up(start, 16) + 16 g, so every group starts
// 16-byte aligned and groups never overlap; the last one ends before M + 16 G + 16.
int64_t staging_ld(int64_t m, int64_t g) { return round_up(m + 16 * g + 16, 16); }

struct DeviceProps {
  int sm_count = 0;
  int major = 0, minor = 0;
};

[[maybe_unused]] DeviceProps device_props(int device) {
  static std::mutex mu;
  static std::vector<DeviceProps> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) fail("device: expected a CUDA device ordinal, got ", device);
  if (static_cast<size_t>(device) >= cache.size()) cache.resize(device + 1);
  DeviceProps& p = cache[device];
  if (p.sm_count == 0) {
    cudaError_t e = cudaDeviceGetAttribute(&p.sm_count, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&p.major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&p.minor, cudaDevAttrComputeCapabilityMinor, device);
    if (e != cudaSuccess) {
      p = DeviceProps{};
      cudaGetLastError();
      fail_status(MXMOE_ERR_CUDA, "device ", device, ": ", cudaGetErrorString(e));
    }
  }
  return p;
}

// The FP8 tensor-core path needs Hopper (sm_90a code) and CUTLASS at build time.
DeviceProps require_hopper(int device, const char* what) {
#if !defined(MXMOE_HAVE_CUTLASS)
  (void)device;
  fail_status(MXMOE_ERR_UNSUPPORTED, what,
              ": this libmxmoe was built without CUTLASS (set MXMOE_CUTLASS_INCLUDE or install the "
              "nvidia-cutlass wheel and rebuild), so the tile128 FP8 GEMMs are not available");
#else
  const DeviceProps p = device_props(device);
  if (p.major != 9 || p.minor != 0)
    fail_status(MXMOE_ERR_UNSUPPORTED, what, ": needs a Hopper GPU (compute capability 9.0, sm_90a), got ",
                p.major, ".", p.minor, " on cuda:", device);
  return p;
#endif
}

struct DeviceGuard {
  int prev = -1;
  DeviceGuard(int device, const char* what) {
    cudaGetDevice(&prev);
    if (prev == device) return;
    const cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, what, ": cudaSetDevice(", device, "): ", cudaGetErrorString(e));
  }
  ~DeviceGuard() {
    int cur = -1;
    if (prev >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev) cudaSetDevice(prev);
  }
};

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, what, ": kernel launch failed: ", cudaGetErrorString(e));
}

// Sequential bump allocator over the workspace (base rounded up to kAlign).
struct Carver {
  char* base;
  int64_t off = 0;
  explicit Carver(void* p) : base(static_cast<char*>(p)) {
    if (base) {
      const auto u = reinterpret_cast<uintptr_t>(base);
      base += (kAlign - u % kAlign) % kAlign;
    }
  }
  template <typename T>
  T* take(int64_t count) {
    const int64_t at = off;
    off += round_up(count * static_cast<int64_t>(sizeof(T)), kAlign);
    return base ? reinterpret_cast<T*>(base + at) : nullptr;
  }
  int64_t bytes() const { return off + kAlign; }  // + slack for the base alignment
};

// ---- kernels --------------------------------------------------------------------------------------

// Largest g with key(info[g]) <= x (info sorted by the key); -1 if none.
template <typename Key>
__device__ int upper_group(const GroupInfo* info, int groups, int64_t x, Key key) {
  int lo = 0, hi = groups;  // first g with key > x
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (key(info[mid]) <= x) lo = mid + 1; else hi = mid;
  }
  return lo - 1;
}

// The GroupInfo array is written by the single-block info kernel (group_info_block in
// gemm_sm90_tile128_impl.cuh, together with the CUTLASS descriptors); everything below runs after
// it in one fused grid kernel per call. The jobs of a fused kernel are independent (each reads only
// GroupInfo and the inputs, and writes its own outputs), so they split the grid by blockIdx ranges;
// `blk` / `nblk` below stand for the job's own blockIdx.x / gridDim.x, with the index math of the
// former separate kernels.

// Forward/dgrad A scales: row m of group g, 128-block kb -> sfa[kb_tot * start_g + kb * len_g + (m - start_g)]
// from the byte of the block's first 32-run, a_scale[m][4 kb]. One thread per row.
__device__ void fwd_sfa(const GroupInfo* info, int groups, const uint8_t* as, int64_t as_s0, int64_t kb_tot,
                        float* sfa, int64_t blk) {
  const int64_t m = blk * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (groups == 0) return;
  const GroupInfo last = info[groups - 1];
  if (m >= last.start + last.len) return;
  const int g = upper_group(info, groups, m, [](const GroupInfo& gi) { return gi.start; });
  // Empty groups share their start with the next group; the largest index with start <= m is the
  // (non-empty) group holding m.
  const GroupInfo gi = info[g];
  float* dst = sfa + kb_tot * gi.start + (m - gi.start);
  const uint8_t* src = as + m * as_s0;
  for (int64_t kb = 0; kb < kb_tot; ++kb) dst[kb * gi.len] = e8m0_to_f32(src[4 * kb]);
}

// Forward/dgrad B scales (G, nb, kb), M-major per expert: sfb[(g * kb_tot + kb) * nb + ib] from
// b_scale[g][128 ib][4 kb]; bias (G, N) -> fp32. Grid-stride over both.
__device__ void fwd_sfb_bias(int groups, int64_t n, int64_t nb, int64_t kb_tot, const uint8_t* bs, int64_t bs_s0,
                             int64_t bs_s1, float* sfb, const void* bias, int bias_bf16, int64_t bias_s0,
                             int64_t bias_s1, float* bias_f32, int64_t blk, int64_t nblk) {
  const int64_t n_sfb = groups * nb * kb_tot;
  const int64_t n_bias = bias ? groups * n : 0;
  for (int64_t i = blk * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_sfb + n_bias;
       i += nblk * blockDim.x) {
    if (i < n_sfb) {
      const int64_t ib = i % nb, kb = (i / nb) % kb_tot, g = i / (nb * kb_tot);
      sfb[i] = e8m0_to_f32(bs[g * bs_s0 + ib * kTile * bs_s1 + 4 * kb]);
    } else {
      const int64_t j = i - n_sfb, g = j / n, c = j % n;
      const int64_t o = g * bias_s0 + c * bias_s1;
      bias_f32[j] = bias_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(bias)[o]) : static_cast<const float*>(bias)[o];
    }
  }
}

// Forward: zero rows [end of the last group, M) of out (M, N); N * elem_bytes is a multiple of 16.
__device__ void fwd_zero_tail(const GroupInfo* info, int groups, int64_t m, int64_t n, int elem_bytes, void* out,
                              int64_t blk, int64_t nblk) {
  const int64_t end = groups ? info[groups - 1].start + info[groups - 1].len : 0;
  const int64_t per = 16 / elem_bytes;
  const int64_t lo = end * n / per, hi = m * n / per;
  uint4* o = static_cast<uint4*>(out);
  for (int64_t i = lo + blk * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < hi; i += nblk * blockDim.x)
    o[i] = make_uint4(0, 0, 0, 0);
}

constexpr int kThreads = 256;  // block size of the fused prologue kernels

// Forward/dgrad prologue, one launch: blocks [0, sfa_blocks) A scales, then sfb_blocks of B scales
// + bias, then zero_blocks of tail zero fill.
struct FwdPrologue {
  const GroupInfo* info;
  int groups;
  int64_t m, n, nb, kb;
  const uint8_t* as;
  int64_t as_s0;
  float* sfa;
  const uint8_t* bs;
  int64_t bs_s0, bs_s1;
  float* sfb;
  const void* bias;
  int bias_bf16;
  int64_t bias_s0, bias_s1;
  float* bias_f32;
  int elem_bytes;
  void* out;
  int64_t sfa_blocks, sfb_blocks, zero_blocks;
};

__global__ void __launch_bounds__(kThreads) fwd_prologue_kernel(FwdPrologue p) {
  int64_t blk = blockIdx.x;
  if (blk < p.sfa_blocks) {
    fwd_sfa(p.info, p.groups, p.as, p.as_s0, p.kb, p.sfa, blk);
    return;
  }
  blk -= p.sfa_blocks;
  if (blk < p.sfb_blocks) {
    fwd_sfb_bias(p.groups, p.n, p.nb, p.kb, p.bs, p.bs_s0, p.bs_s1, p.sfb, p.bias, p.bias_bf16, p.bias_s0, p.bias_s1,
                 p.bias_f32, blk, p.sfb_blocks);
    return;
  }
  blk -= p.sfb_blocks;
  if (blk < p.zero_blocks) fwd_zero_tail(p.info, p.groups, p.m, p.n, p.elem_bytes, p.out, blk, p.zero_blocks);
}

// Wgrad scales: global 128-block slot j (group g, block j - kb_off_g), row r ->
// sf[j * rows + r] from scale[r][blk_off_g + 4 (j - kb_off_g)]. (bx, by, bz): the former 3D grid
// (rows / 256, slots, 2); bz: 0 = A (rows N), 1 = B (rows K).
__device__ void kg_scale(const GroupInfo* info, int groups, const uint8_t* as, int64_t as_s0, int64_t n, float* sfa,
                         const uint8_t* bs, int64_t bs_s0, int64_t k, float* sfb, int64_t bx, int64_t by, int64_t bz) {
  const bool is_b = bz == 1;
  const int64_t rows = is_b ? k : n;
  const int64_t r = bx * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t j = by;
  if (r >= rows || groups == 0) return;
  const int g = upper_group(info, groups, j, [](const GroupInfo& gi) { return gi.kb_off; });
  if (g < 0) return;
  const GroupInfo gi = info[g];
  const int64_t kb = j - gi.kb_off;
  if (kb >= (gi.len + kTile - 1) / kTile) return;  // past the last block
  const uint8_t* src = is_b ? bs + r * bs_s0 : as + r * as_s0;
  (is_b ? sfb : sfa)[j * rows + r] = e8m0_to_f32(src[gi.blk_off + 4 * kb]);
}

// Wgrad staging: group g's token columns of A (N, M) and B (K, M) copied to stage_col in a buffer with a
// 16-byte aligned row stride. Each thread writes one aligned 16-byte chunk (bytes past the group: 0).
// (bx, by, bz): the former 3D grid (G, rows / 8, 2): group, block of 8 rows, 0 = A / 1 = B.
__device__ void kg_stage(const GroupInfo* info, const uint8_t* a, int64_t lda, int64_t n, const uint8_t* b,
                         int64_t ldb, int64_t k, uint8_t* a_stage, uint8_t* b_stage, int64_t lds, int64_t bx,
                         int64_t by, int64_t bz) {
  const GroupInfo gi = info[bx];
  if (gi.stage_col < 0) return;
  const bool is_b = bz == 1;
  const int64_t rows = is_b ? k : n, ld = is_b ? ldb : lda;
  const uint8_t* src = is_b ? b : a;
  uint8_t* dst = is_b ? b_stage : a_stage;
  const int64_t chunks = (gi.len + 15) / 16;
  for (int64_t rr = 0; rr < 8; ++rr) {
    const int64_t r = by * 8 + rr;
    if (r >= rows) return;
    const uint8_t* s = src + r * ld + gi.start;
    uint4* d = reinterpret_cast<uint4*>(dst + r * lds + gi.stage_col);
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t v = 0;
#pragma unroll
        for (int byte = 0; byte < 4; ++byte) {
          const int64_t t = c * 16 + q * 4 + byte;
          if (t < gi.len) v |= static_cast<uint32_t>(s[t]) << (8 * byte);
        }
        w[q] = v;
      }
      d[c] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// Wgrad: empty groups' outputs out[g] (N, K) are zero, unreadable ones' (an in-place call's group off a
// 16-token boundary) NaN; N * K * elem_bytes is a multiple of 16.
__device__ void kg_zero_empty(const GroupInfo* info, int groups, int64_t nk, int elem_bytes, void* out, int64_t blk,
                              int64_t nblk) {
  const int64_t per16 = nk * elem_bytes / 16;
  const uint32_t nan = elem_bytes == 2 ? 0x7FC07FC0u : 0x7FC00000u;
  for (int g = 0; g < groups; ++g) {
    const GroupInfo gi = info[g];
    if (gi.len != 0 && gi.stage_col != kGroupUnreadable) continue;
    const uint32_t v = gi.len == 0 ? 0u : nan;
    uint4* o = reinterpret_cast<uint4*>(static_cast<char*>(out) + g * nk * elem_bytes);
    for (int64_t i = blk * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < per16; i += nblk * blockDim.x)
      o[i] = make_uint4(v, v, v, v);
  }
}

// Wgrad prologue, one launch: blocks [0, scale_x * scale_y * 2) scales (x fastest, as the former 3D
// grid), then groups * stage_y * 2 staging blocks (stage_y = 0: no staging job), then zero_blocks of
// empty-group zero fill.
struct KgPrologue {
  const GroupInfo* info;
  int groups;
  const uint8_t* as;
  int64_t as_s0;
  const uint8_t* bs;
  int64_t bs_s0;
  int64_t n, k;
  float *sfa, *sfb;
  const uint8_t* a;
  const uint8_t* b;
  int64_t lda, ldb;
  uint8_t *a_stage, *b_stage;
  int64_t lds;
  int elem_bytes;
  void* out;
  int64_t scale_x, scale_y, stage_y, zero_blocks;
};

__global__ void __launch_bounds__(kThreads) kg_prologue_kernel(KgPrologue p) {
  int64_t blk = blockIdx.x;
  const int64_t scale_blocks = p.scale_x * p.scale_y * 2;
  if (blk < scale_blocks) {
    kg_scale(p.info, p.groups, p.as, p.as_s0, p.n, p.sfa, p.bs, p.bs_s0, p.k, p.sfb, blk % p.scale_x,
             (blk / p.scale_x) % p.scale_y, blk / (p.scale_x * p.scale_y));
    return;
  }
  blk -= scale_blocks;
  const int64_t stage_blocks = static_cast<int64_t>(p.groups) * p.stage_y * 2;
  if (blk < stage_blocks) {
    kg_stage(p.info, p.a, p.lda, p.n, p.b, p.ldb, p.k, p.a_stage, p.b_stage, p.lds, blk % p.groups,
             (blk / p.groups) % p.stage_y, blk / (static_cast<int64_t>(p.groups) * p.stage_y));
    return;
  }
  blk -= stage_blocks;
  if (blk < p.zero_blocks) kg_zero_empty(p.info, p.groups, p.n * p.k, p.elem_bytes, p.out, blk, p.zero_blocks);
}

// ---- workspace plans ------------------------------------------------------------------------------

struct FwdLayout {
  GroupInfo* info;
  float *sfa, *sfb, *bias;
  void* desc;
  int64_t bytes;
};

FwdLayout fwd_layout(void* ws, int64_t m, int64_t n, int64_t k, int64_t g, int sm_count) {
  Carver c(ws);
  FwdLayout l{};
  const int64_t kb = cdiv(k, kTile), nb = cdiv(n, kTile);
  l.info = c.take<GroupInfo>(g);
  l.sfa = c.take<float>(m * kb);
  l.sfb = c.take<float>(g * nb * kb);
  l.bias = c.take<float>(g * n);
#if defined(MXMOE_HAVE_CUTLASS)
  const int64_t desc = static_cast<int64_t>(std::max(tile128::fwd_desc_bytes_bf16(static_cast<int>(g), sm_count),
                                                     tile128::fwd_desc_bytes_f32(static_cast<int>(g), sm_count)));
#else
  (void)sm_count;
  const int64_t desc = 0;
#endif
  l.desc = c.take<char>(desc);
  l.bytes = c.bytes();
  return l;
}

struct KgLayout {
  GroupInfo* info;
  float *sfa, *sfb;
  uint8_t *a_stage, *b_stage;
  int64_t lds;
  void* desc;
  int64_t bytes;
};

// in_place: no staging buffers (mxmoe_grouped_mm_tile128_kgroups_in_place).
KgLayout kg_layout(void* ws, int64_t m, int64_t n, int64_t k, int64_t g, int sm_count, bool in_place = false) {
  Carver c(ws);
  KgLayout l{};
  const int64_t cap = cdiv(m, kTile) + g;
  l.lds = in_place ? 0 : staging_ld(m, g);
  l.info = c.take<GroupInfo>(g);
  l.sfa = c.take<float>(n * cap);
  l.sfb = c.take<float>(k * cap);
  l.a_stage = c.take<uint8_t>(n * l.lds);
  l.b_stage = c.take<uint8_t>(k * l.lds);
#if defined(MXMOE_HAVE_CUTLASS)
  const int64_t desc = static_cast<int64_t>(std::max(tile128::kg_desc_bytes_bf16(static_cast<int>(g), sm_count),
                                                     tile128::kg_desc_bytes_f32(static_cast<int>(g), sm_count)));
#else
  (void)sm_count;
  const int64_t desc = 0;
#endif
  l.desc = c.take<char>(desc);
  l.bytes = c.bytes();
#if defined(MXMOE_HAVE_CUTLASS)
  Carver own(nullptr);
  own.take<char>(gemm::sm90_grouped_k_workspace_size(m, n, k, g));
  l.bytes = std::max(l.bytes, own.bytes());
#endif
  return l;
}

void check_workspace(int64_t have, int64_t need, const char* what) {
  if (have < need)
    fail(what, ": workspace: expected at least ", need, " bytes (the workspace size query), got ", have);
}

int grid_for(int64_t work, int threads, int64_t cap) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(cap, cdiv(work, threads))));
}

}  // namespace

int64_t grouped_mm_tile128_workspace_size(int64_t m, int64_t n, int64_t k, int64_t g, int32_t device) {
  const DeviceProps p = require_hopper(device, "grouped_mm_tile128");
  return fwd_layout(nullptr, m, n, k, g, p.sm_count).bytes;
}

int64_t grouped_mm_tile128_kgroups_workspace_size(int64_t m, int64_t n, int64_t k, int64_t g, int32_t device) {
  const DeviceProps p = require_hopper(device, "grouped_mm_tile128_kgroups");
  return kg_layout(nullptr, m, n, k, g, p.sm_count).bytes;
}

#if defined(MXMOE_HAVE_CUTLASS)
namespace {
// The own M-grouped kernel's call from the validated arguments; M: the output's rows (a's, or the
// gather variant's routed rows).
void fill_grouped_m_run(const GroupedMMArgs& a, int64_t M, int sm_count, cudaStream_t stream, gemm::GroupedMRun& r) {
  const bool bias = a.bias.present;
  r.m = M;
  r.n = a.b.shape[1];
  r.k = a.a.shape[1];
  r.groups = static_cast<int>(a.offs.shape[0]);
  r.a = static_cast<const uint8_t*>(a.a.data);
  r.a_scale = static_cast<const uint8_t*>(a.a_scale.data);
  r.as_s0 = a.a_scale.strides[0];
  r.b = static_cast<const uint8_t*>(a.b.data);
  r.b_scale = static_cast<const uint8_t*>(a.b_scale.data);
  r.bs_s0 = a.b_scale.strides[0];
  r.bs_s1 = a.b_scale.strides[1];
  r.offs = static_cast<const int32_t*>(a.offs.data);
  r.offs_s = a.offs.strides[0];
  r.bias = bias ? a.bias.t.data : nullptr;
  r.bias_bf16 = bias && a.bias.t.dtype == MXMOE_DTYPE_BF16;
  r.bias_s0 = bias ? a.bias.t.strides[0] : 0;
  r.bias_s1 = bias ? a.bias.t.strides[1] : 0;
  r.out = a.out.data;
  r.out_bf16 = a.out.dtype == MXMOE_DTYPE_BF16;
  r.sm_count = sm_count;
  r.device = a.a.device;
  r.stream = stream;
}

// The gather variants' run: the GEMM's fields, then the routed rows of the per-token operand.
void fill_gather_run(const GroupedMMGatherArgs& ga, int sm_count, gemm::GroupedMGatherRun& r) {
  const GroupedMMArgs& a = ga.mm;
  fill_grouped_m_run(a, a.out.shape[0], sm_count, static_cast<cudaStream_t>(a.stream), r);
  r.gather = static_cast<const int32_t*>(ga.gather.data);
  r.fanout = ga.fanout;
  r.a_rows = a.a.shape[0];
  r.lda = a.a.strides[0];
  r.row_scale = ga.row_scale.present ? static_cast<const float*>(ga.row_scale.t.data) : nullptr;
}

// The bf16 gather kernels' run: K and A's row stride in bytes (the kernel's k-blocks are 128 bytes).
void fill_bf16_gather_run(const Bf16GatherMMArgs& x, int sm_count, gemm::GroupedMGatherRun& r) {
  r.m = x.out.shape[0];
  r.n = x.out.shape[1];
  r.k = 2 * x.a.shape[1];
  r.groups = static_cast<int>(x.offs.shape[0]);
  r.a = static_cast<const uint8_t*>(x.a.data);
  r.b = static_cast<const uint8_t*>(x.b.data);
  r.offs = static_cast<const int32_t*>(x.offs.data);
  r.offs_s = x.offs.strides[0];
  r.out = x.out.data;
  r.out_bf16 = true;
  r.sm_count = sm_count;
  r.device = x.a.device;
  r.stream = static_cast<cudaStream_t>(x.stream);
  r.gather = static_cast<const int32_t*>(x.gather.data);
  r.fanout = x.fanout;
  r.a_rows = x.a.shape[0];
  r.lda = r.k;
}
}  // namespace
#endif

void grouped_mm_tile128(const GroupedMMArgs& a, void* workspace, int64_t workspace_bytes) {
  const char* what = "grouped_mm_tile128";
  const int64_t M = a.a.shape[0], K = a.a.shape[1], N = a.b.shape[1];
  const int G = static_cast<int>(a.offs.shape[0]);
  const DeviceProps props = require_hopper(a.a.device, what);
  DeviceGuard guard(a.a.device, what);
  const FwdLayout l = fwd_layout(workspace, M, N, K, G, props.sm_count);
  check_workspace(workspace_bytes, l.bytes, what);
  auto stream = static_cast<cudaStream_t>(a.stream);
  const int64_t kb = cdiv(K, kTile), nb = cdiv(N, kTile);
  const int elem = a.out.dtype == MXMOE_DTYPE_BF16 ? 2 : 4;
  if (M == 0 || N == 0) return;
  if (G == 0) {
    cudaMemsetAsync(a.out.data, 0, static_cast<size_t>(M * N * elem), stream);
    check_launch(what);
    return;
  }
  const bool bias = a.bias.present;
  const bool bias_bf16 = bias && a.bias.t.dtype == MXMOE_DTYPE_BF16;
  // The launch's configuration (sm90/sm90_config.hpp): the own sm_90a kernel (sm90/: one launch, E8M0
  // scales read in the mainloop, group table built on the device) or the CUTLASS path below.
  gemm::Sm90GemmConfig cfg =
      gemm::select_sm90_config(gemm::Sm90Pass::kGroupedM, M, N, K, G, a.out.dtype == MXMOE_DTYPE_BF16);
#if defined(MXMOE_HAVE_CUTLASS)
  if (cfg.impl == gemm::Sm90Impl::kOwn) {
    gemm::GroupedMRun r;
    fill_grouped_m_run(a, M, props.sm_count, stream, r);
    if (gemm::sm90_grouped_m(r, cfg)) {
      gemm::note_config(cfg);
      return;
    }
    if (cfg.own_only)
      fail(what, ": MXMOE_GEMM_SM90=mxmoe-only, but the sm90 kernel does not take this call (K = ", K, ", G = ", G,
           ", 16-byte aligned a and b required)");
    cfg.use_cutlass();
    cfg.declined = true;
  }
#endif
  gemm::note_config(cfg);
  tile128::FwdPlan p;
  p.groups = G;
  p.m = M;
  p.n = N;
  p.k = K;
  p.info = l.info;
  p.a = static_cast<const uint8_t*>(a.a.data);
  p.b = static_cast<const uint8_t*>(a.b.data);
  p.out = a.out.data;
  p.sfa = l.sfa;
  p.sfb = l.sfb;
  p.bias = bias ? l.bias : nullptr;
  p.desc = l.desc;
  p.sm_count = props.sm_count;
  p.stream = stream;
  // 1. GroupInfo + CUTLASS descriptors (one block).
#if defined(MXMOE_HAVE_CUTLASS)
  if (a.out.dtype == MXMOE_DTYPE_BF16)
    tile128::fwd_info_desc_bf16(p, static_cast<const int32_t*>(a.offs.data), a.offs.strides[0]);
  else
    tile128::fwd_info_desc_f32(p, static_cast<const int32_t*>(a.offs.data), a.offs.strides[0]);
#endif
  // 2. A scales (one thread per row), B scales + bias (grid-stride), tail zero fill (grid-stride):
  // the grids of the former separate kernels, back to back in one launch.
  FwdPrologue f{};
  f.info = l.info;
  f.groups = G;
  f.m = M;
  f.n = N;
  f.nb = nb;
  f.kb = kb;
  f.as = static_cast<const uint8_t*>(a.a_scale.data);
  f.as_s0 = a.a_scale.strides[0];
  f.sfa = l.sfa;
  f.bs = static_cast<const uint8_t*>(a.b_scale.data);
  f.bs_s0 = a.b_scale.strides[0];
  f.bs_s1 = a.b_scale.strides[1];
  f.sfb = l.sfb;
  f.bias = bias ? a.bias.t.data : nullptr;
  f.bias_bf16 = bias_bf16 ? 1 : 0;
  f.bias_s0 = bias ? a.bias.t.strides[0] : 0;
  f.bias_s1 = bias ? a.bias.t.strides[1] : 0;
  f.bias_f32 = l.bias;
  f.elem_bytes = elem;
  f.out = a.out.data;
  f.sfa_blocks = cdiv(M, kThreads);
  f.sfb_blocks = grid_for(G * nb * kb + (bias ? G * N : 0), kThreads, 1024);
  f.zero_blocks = 2 * props.sm_count;
  const int64_t blocks = f.sfa_blocks + f.sfb_blocks + f.zero_blocks;
  if (blocks > INT32_MAX) fail_status(MXMOE_ERR_UNSUPPORTED, what, ": ", M, " rows exceed the prologue kernel's grid");
  fwd_prologue_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(f);
  check_launch(what);
  // 3. The CUTLASS GEMM.
#if defined(MXMOE_HAVE_CUTLASS)
  const tile128::Schedule sched{cfg.raster_n, cfg.swizzle};
  if (a.out.dtype == MXMOE_DTYPE_BF16)
    tile128::fwd_run_bf16(p, sched);
  else
    tile128::fwd_run_f32(p, sched);
#endif
}

#if defined(MXMOE_HAVE_CUTLASS)
namespace {
// The own K-grouped kernel's call from the validated arguments (no workspace yet).
gemm::GroupedKRun own_kgroups_run(const GroupedMMKArgs& a, int sm_count) {
  gemm::GroupedKRun r;
  r.m = a.a.shape[1];
  r.n = a.a.shape[0];
  r.k = a.b.shape[0];
  r.groups = static_cast<int>(a.offs.shape[0]);
  r.a = static_cast<const uint8_t*>(a.a.data);
  r.lda = a.a.strides[0];
  r.a_scale = static_cast<const uint8_t*>(a.a_scale.data);
  r.as_s0 = a.a_scale.strides[0];
  r.b = static_cast<const uint8_t*>(a.b.data);
  r.ldb = a.b.strides[0];
  r.b_scale = static_cast<const uint8_t*>(a.b_scale.data);
  r.bs_s0 = a.b_scale.strides[0];
  r.offs = static_cast<const int32_t*>(a.offs.data);
  r.offs_s = a.offs.strides[0];
  r.out = a.out.data;
  r.out_bf16 = a.out.dtype == MXMOE_DTYPE_BF16;
  r.sm_count = sm_count;
  r.device = a.a.device;
  r.stream = static_cast<cudaStream_t>(a.stream);
  return r;
}
}  // namespace
#endif

// The CUTLASS path reserves staging copies of both operands (about their size) for groups it cannot
// read in place; the own kernel needs only its prepared scales. Sized for the path these operands
// take, the workspace is the scales' bytes where the own kernel runs (the MoE layer's wgrads): at
// Qwen3-30B-A3B 16K that is 16 MiB instead of 478 MiB at the layer's peak.
int64_t grouped_mm_tile128_kgroups_workspace_for(const GroupedMMKArgs& a, bool in_place) {
  const char* what = "grouped_mm_tile128_kgroups";
  const int64_t N = a.a.shape[0], M = a.a.shape[1], K = a.b.shape[0];
  const int G = static_cast<int>(a.offs.shape[0]);
  const DeviceProps props = require_hopper(a.a.device, what);
  DeviceGuard guard(a.a.device, what);
#if defined(MXMOE_HAVE_CUTLASS)
  const gemm::Sm90GemmConfig cfg =
      gemm::select_sm90_config(gemm::Sm90Pass::kGroupedK, M, N, K, G, a.out.dtype == MXMOE_DTYPE_BF16);
  if (cfg.impl == gemm::Sm90Impl::kOwn && G > 0 && N > 0 && K > 0 &&
      gemm::sm90_grouped_k_takes(own_kgroups_run(a, props.sm_count), cfg))
    return gemm::sm90_grouped_k_workspace_size(M, N, K, G);
#endif
  return kg_layout(nullptr, M, N, K, G, props.sm_count, in_place).bytes;
}

void grouped_mm_tile128_kgroups(const GroupedMMKArgs& a, void* workspace, int64_t workspace_bytes, bool in_place) {
  const char* what = "grouped_mm_tile128_kgroups";
  const int64_t N = a.a.shape[0], M = a.a.shape[1], K = a.b.shape[0];
  const int G = static_cast<int>(a.offs.shape[0]);
  const DeviceProps props = require_hopper(a.a.device, what);
  DeviceGuard guard(a.a.device, what);
  auto stream = static_cast<cudaStream_t>(a.stream);
  const int elem = a.out.dtype == MXMOE_DTYPE_BF16 ? 2 : 4;
  const auto* A = static_cast<const uint8_t*>(a.a.data);
  const auto* B = static_cast<const uint8_t*>(a.b.data);
  // The launch's configuration (sm90/sm90_config.hpp): the own sm_90a K-grouped kernel (sm90/: one
  // launch, no staging, E8M0 scales read in the kernel, group tables built on the device) or CUTLASS.
  gemm::Sm90GemmConfig cfg =
      gemm::select_sm90_config(gemm::Sm90Pass::kGroupedK, M, N, K, G, a.out.dtype == MXMOE_DTYPE_BF16);
#if defined(MXMOE_HAVE_CUTLASS)
  if (cfg.impl == gemm::Sm90Impl::kOwn && G > 0 && N > 0 && K > 0) {
    gemm::GroupedKRun r = own_kgroups_run(a, props.sm_count);
    r.workspace_bytes = gemm::sm90_grouped_k_workspace_size(M, N, K, G);
    check_workspace(workspace_bytes, r.workspace_bytes, what);
    r.workspace = workspace;
    if (gemm::sm90_grouped_k(r, cfg)) {
      gemm::note_config(cfg);
      return;
    }
    if (cfg.own_only)
      fail(what, ": MXMOE_GEMM_SM90=mxmoe-only, but the sm90 wgrad kernel does not take this call (M = ", M,
           ", K = ", K, ", G = ", G, ", 16-byte aligned a, b and row strides required)");
    cfg.use_cutlass();
    cfg.declined = true;
  }
#endif
  // CUTLASS (or no work): the workspace with the staging copies, or without them in place.
  const KgLayout l = kg_layout(workspace, M, N, K, G, props.sm_count, in_place);
  check_workspace(workspace_bytes, l.bytes, what);
  if (G == 0 || N == 0 || K == 0) return;
  gemm::note_config(cfg);
  // Groups are read in place when TMA can address them: 16-byte aligned base and row stride, and a
  // first token at a multiple of 16. Otherwise their columns are staged (one extra read + write of
  // those columns of both operands); in place, such a group's output is NaN (kGroupUnreadable).
  const bool stage_all = M % 16 != 0 || reinterpret_cast<uintptr_t>(A) % 16 != 0 || reinterpret_cast<uintptr_t>(B) % 16 != 0;
  if (in_place && stage_all)
    fail(what, ": in place: expected M (tokens) a multiple of 16 and 16-byte aligned a and b, got M = ", M,
         ", a % 16 = ", reinterpret_cast<uintptr_t>(A) % 16, ", b % 16 = ", reinterpret_cast<uintptr_t>(B) % 16,
         " (mxmoe_grouped_mm_tile128_kgroups stages them)");
  const int64_t cap = cdiv(M, kTile) + G;
  // The scale job's slots were gridDim.y of a separate kernel (<= 65535). The fused 1D grid below
  // would take more; the limit is kept so the set of accepted inputs does not change.
  if (cap > 65535) fail_status(MXMOE_ERR_UNSUPPORTED, what, ": ", M, " tokens in ", G, " groups exceed the scale kernel's grid");
  tile128::KgPlan p;
  p.groups = G;
  p.m = M;
  p.n = N;
  p.k = K;
  p.info = l.info;
  p.a = A;
  p.b = B;
  p.lda = a.a.strides[0];
  p.ldb = a.b.strides[0];
  p.a_stage = l.a_stage;
  p.b_stage = l.b_stage;
  p.ld_stage = l.lds;
  p.out = a.out.data;
  p.sfa = l.sfa;
  p.sfb = l.sfb;
  p.desc = l.desc;
  p.sm_count = props.sm_count;
  p.stream = stream;
  // 1. GroupInfo + CUTLASS descriptors (one block).
#if defined(MXMOE_HAVE_CUTLASS)
  const int stage_mode = in_place ? 3 : stage_all ? 2 : 1;
  if (a.out.dtype == MXMOE_DTYPE_BF16)
    tile128::kg_info_desc_bf16(p, static_cast<const int32_t*>(a.offs.data), a.offs.strides[0], stage_mode);
  else
    tile128::kg_info_desc_f32(p, static_cast<const int32_t*>(a.offs.data), a.offs.strides[0], stage_mode);
#else
  (void)stage_all;
#endif
  // 2. Scales (the former grid (rows / 256, cap, 2)), staging when M > 0 (the former grid
  // (G, rows / 8, 2)), empty-group zero fill (grid-stride): one launch. All three read only GroupInfo
  // and the inputs; the GEMM, stream-ordered after this launch, reads the staged copies.
  KgPrologue f{};
  f.info = l.info;
  f.groups = G;
  f.as = static_cast<const uint8_t*>(a.a_scale.data);
  f.as_s0 = a.a_scale.strides[0];
  f.bs = static_cast<const uint8_t*>(a.b_scale.data);
  f.bs_s0 = a.b_scale.strides[0];
  f.n = N;
  f.k = K;
  f.sfa = l.sfa;
  f.sfb = l.sfb;
  f.a = A;
  f.b = B;
  f.lda = a.a.strides[0];
  f.ldb = a.b.strides[0];
  f.a_stage = l.a_stage;
  f.b_stage = l.b_stage;
  f.lds = l.lds;
  f.elem_bytes = elem;
  f.out = a.out.data;
  f.scale_x = cdiv(std::max(N, K), kThreads);
  f.scale_y = cap;
  f.stage_y = M > 0 && !in_place ? cdiv(std::max(N, K), 8) : 0;
  f.zero_blocks = 2 * props.sm_count;
  const int64_t blocks = f.scale_x * f.scale_y * 2 + static_cast<int64_t>(G) * f.stage_y * 2 + f.zero_blocks;
  if (blocks > INT32_MAX)
    fail_status(MXMOE_ERR_UNSUPPORTED, what, ": ", N, " x ", K, " outputs over ", M, " tokens in ", G,
                " groups exceed the prologue kernel's grid");
  kg_prologue_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(f);
  check_launch(what);
  // 3. The CUTLASS GEMM.
#if defined(MXMOE_HAVE_CUTLASS)
  const tile128::Schedule sched{cfg.raster_n, cfg.swizzle};
  if (a.out.dtype == MXMOE_DTYPE_BF16)
    tile128::kg_run_bf16(p, sched);
  else
    tile128::kg_run_f32(p, sched);
#endif
}

bool grouped_mm_tile128_gather_available(int64_t m, int64_t n, int64_t k, int64_t g, int64_t a_rows,
                                         int64_t fanout, int32_t device) {
#if defined(MXMOE_HAVE_CUTLASS)
  // K rows of A are read in place with 16-byte copies: lda = K.
  return gemm::sm90_grouped_m_gather_takes(m, n, k, g, a_rows, k, fanout, true, device);
#else
  (void)m, (void)n, (void)k, (void)g, (void)a_rows, (void)fanout, (void)device;
  return false;
#endif
}

void grouped_mm_tile128_gather(const GroupedMMGatherArgs& ga) {
  const char* what = "grouped_mm_tile128_gather";
  const GroupedMMArgs& a = ga.mm;
  const int64_t T = a.a.shape[0], K = a.a.shape[1], M = a.out.shape[0], N = a.b.shape[1];
  const int G = static_cast<int>(a.offs.shape[0]);
  const DeviceProps props = require_hopper(a.a.device, what);
  DeviceGuard guard(a.a.device, what);
  if (a.out.dtype != MXMOE_DTYPE_BF16)
    fail_status(MXMOE_ERR_UNSUPPORTED, what, ": out: the gather kernel writes bfloat16 only, got float32");
#if defined(MXMOE_HAVE_CUTLASS)
  gemm::GroupedMGatherRun r;
  fill_gather_run(ga, props.sm_count, r);
  if (G == 0) {
    if (M * N > 0) cudaMemsetAsync(a.out.data, 0, static_cast<size_t>(M * N * 2), r.stream);
    check_launch(what);
    return;
  }
  if (gemm::sm90_grouped_m_gather(r)) return;
#endif
  fail_status(MXMOE_ERR_UNSUPPORTED, what, ": the sm_90a gather kernel does not take M = ", M, ", N = ", N,
              ", K = ", K, ", G = ", G, ", T = ", T, ", fanout = ", ga.fanout,
              " (mxmoe_grouped_mm_tile128_gather_available says which calls it takes)");
}

// The bf16 MoE layer's gather GEMM: the same sm_90a kernel in its bf16 form (no scales, no CUTLASS
// path). K and A's row stride count bytes in the kernel's run.
bool grouped_mm_bf16_gather_available(int64_t m, int64_t n, int64_t k, int64_t g, int64_t a_rows, int64_t fanout,
                                      bool b_kn, int32_t device) {
#if defined(MXMOE_HAVE_CUTLASS)
  return gemm::sm90_grouped_m_gather_bf16_takes(m, n, k, g, a_rows, fanout, b_kn, device);
#else
  (void)m, (void)n, (void)k, (void)g, (void)a_rows, (void)fanout, (void)b_kn, (void)device;
  return false;
#endif
}

void grouped_mm_bf16_gather(const Bf16GatherMMArgs& x) {
  const char* what = "grouped_mm_bf16_gather";
  const int64_t T = x.a.shape[0], K = x.a.shape[1], M = x.out.shape[0], N = x.out.shape[1];
  const int G = static_cast<int>(x.offs.shape[0]);
  const DeviceProps props = require_hopper(x.a.device, what);
  DeviceGuard guard(x.a.device, what);
#if defined(MXMOE_HAVE_CUTLASS)
  const auto stream = static_cast<cudaStream_t>(x.stream);
  if (G == 0 || M == 0) {
    if (M * N > 0) cudaMemsetAsync(x.out.data, 0, static_cast<size_t>(M * N * 2), stream);
    check_launch(what);
    return;
  }
  gemm::GroupedMGatherRun r;
  fill_bf16_gather_run(x, props.sm_count, r);
  if (gemm::sm90_grouped_m_gather_bf16(r, x.b_kn)) return;
#endif
  fail_status(MXMOE_ERR_UNSUPPORTED, what, ": the sm_90a gather kernel does not take M = ", M, ", N = ", N,
              ", K = ", K, ", G = ", G, ", T = ", T, ", fanout = ", x.fanout, ", b_kn = ", x.b_kn ? 1 : 0,
              " (mxmoe_grouped_mm_bf16_gather_available says which calls it takes)");
}

bool grouped_mm_bf16_gather_swiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t t, int64_t fanout,
                                             int32_t layout, int32_t device) {
#if defined(MXMOE_HAVE_CUTLASS)
  return g > 0 && gemm::sm90_grouped_m_gather_swiglu_bf16_takes(m, 2 * i, k, g, t, fanout, layout, device);
#else
  (void)m, (void)i, (void)k, (void)g, (void)t, (void)fanout, (void)layout, (void)device;
  return false;
#endif
}

void grouped_mm_bf16_gather_swiglu(const Bf16GatherSwigluArgs& x) {
  const char* what = "grouped_mm_bf16_gather_swiglu";
  const int64_t T = x.g.a.shape[0], K = x.g.a.shape[1], M = x.g.out.shape[0], N = x.g.out.shape[1];
  const int G = static_cast<int>(x.g.offs.shape[0]);
  const DeviceProps props = require_hopper(x.g.a.device, what);
  DeviceGuard guard(x.g.a.device, what);
#if defined(MXMOE_HAVE_CUTLASS)
  const auto stream = static_cast<cudaStream_t>(x.g.stream);
  if (G == 0 || M == 0) {  // no group: every row is past the last one; no rows: nothing to write
    if (M > 0) {
      cudaMemsetAsync(x.g.out.data, 0, static_cast<size_t>(M * N * 2), stream);
      cudaMemsetAsync(x.act.data, 0, static_cast<size_t>(M * N), stream);
    }
    check_launch(what);
    return;
  }
  gemm::GroupedMGatherSwigluBf16Run r;
  fill_bf16_gather_run(x.g, props.sm_count, r);
  if (x.bias.present) {
    r.bias = x.bias.t.data;
    r.bias_bf16 = x.bias.t.dtype == MXMOE_DTYPE_BF16;
    r.bias_s0 = x.bias.t.strides[0];
    r.bias_s1 = x.bias.t.strides[1];
  }
  r.layout = x.layout;
  r.alpha = x.alpha;
  r.limit = x.limit;
  r.up_offset = x.up_offset;
  r.act = static_cast<uint16_t*>(x.act.data);
  if (gemm::sm90_grouped_m_gather_swiglu_bf16(r)) return;
#endif
  fail_status(MXMOE_ERR_UNSUPPORTED, what, ": the sm_90a kernel does not take M = ", M, ", 2I = ", N, ", K = ", K,
              ", G = ", G, ", T = ", T, ", fanout = ", x.g.fanout,
              " (mxmoe_grouped_mm_bf16_gather_swiglu_available says which calls it takes)");
}

bool grouped_mm_bf16_gather_dswiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t t, int64_t fanout,
                                              int32_t device) {
#if defined(MXMOE_HAVE_CUTLASS)
  return g > 0 && gemm::sm90_grouped_m_gather_dswiglu_bf16_takes(m, i, k, g, t, fanout, device);
#else
  (void)m, (void)i, (void)k, (void)g, (void)t, (void)fanout, (void)device;
  return false;
#endif
}

void grouped_mm_bf16_gather_dswiglu(const Bf16GatherDSwigluArgs& x) {
  const char* what = "grouped_mm_bf16_gather_dswiglu";
  const int64_t T = x.g.a.shape[0], K = x.g.a.shape[1], M = x.g.out.shape[0], I = x.g.out.shape[1];
  const int G = static_cast<int>(x.g.offs.shape[0]);
  const DeviceProps props = require_hopper(x.g.a.device, what);
  DeviceGuard guard(x.g.a.device, what);
#if defined(MXMOE_HAVE_CUTLASS)
  const auto stream = static_cast<cudaStream_t>(x.g.stream);
  if (G == 0 || M == 0) {  // no group: every row is past the last one; no rows: nothing to write
    if (M > 0) {
      cudaMemsetAsync(x.dh.data, 0, static_cast<size_t>(M * 2 * I * 2), stream);
      cudaMemsetAsync(x.tw_part.data, 0, static_cast<size_t>(M * ((I + 127) / 128) * 4), stream);
      if (x.act.present) cudaMemsetAsync(x.act.t.data, 0, static_cast<size_t>(M * I * 2), stream);
    }
    check_launch(what);
    return;
  }
  gemm::GroupedMGatherDSwigluBf16Run r;
  fill_bf16_gather_run(x.g, props.sm_count, r);
  r.out = nullptr;  // dY' is never stored
  r.row_scale = x.row_scale.present ? static_cast<const float*>(x.row_scale.t.data) : nullptr;
  r.h = static_cast<const uint16_t*>(x.h.data);
  r.layout = x.layout;
  r.alpha = x.alpha;
  r.limit = x.limit;
  r.up_offset = x.up_offset;
  r.dh = static_cast<uint16_t*>(x.dh.data);
  r.tw_part = static_cast<float*>(x.tw_part.data);
  r.act = x.act.present ? static_cast<uint16_t*>(x.act.t.data) : nullptr;
  if (gemm::sm90_grouped_m_gather_dswiglu_bf16(r)) return;
#endif
  fail_status(MXMOE_ERR_UNSUPPORTED, what, ": the sm_90a kernel does not take M = ", M, ", I = ", I, ", K = ", K,
              ", G = ", G, ", T = ", T, ", fanout = ", x.g.fanout,
              " (mxmoe_grouped_mm_bf16_gather_dswiglu_available says which calls it takes)");
}

// The bf16 MoE layer's wgrad on routed rows (the sm_90a K-grouped gather kernel; no CUTLASS path).
bool grouped_mm_bf16_kgather_available(int64_t r, int64_t m, int64_t n, int64_t g, int64_t t, int64_t fanout,
                                       int32_t device) {
#if defined(MXMOE_HAVE_CUTLASS)
  return gemm::sm90_grouped_k_gather_bf16_takes(r, m, n, g, t, fanout, device);
#else
  (void)r, (void)m, (void)n, (void)g, (void)t, (void)fanout, (void)device;
  return false;
#endif
}

void grouped_mm_bf16_kgather(const Bf16KGatherMMArgs& x) {
  const char* what = "grouped_mm_bf16_kgather";
  const int64_t G = x.out.shape[0], M = x.out.shape[1], N = x.out.shape[2], R = x.gather.shape[0];
  const int64_t T = (x.gather_b ? x.b : x.a).shape[0];
  const DeviceProps props = require_hopper(x.a.device, what);
  DeviceGuard guard(x.a.device, what);
#if defined(MXMOE_HAVE_CUTLASS)
  const auto stream = static_cast<cudaStream_t>(x.stream);
  if (G * M * N == 0) return;
  if (R == 0) {  // no routed rows: every group's sum is empty
    cudaMemsetAsync(x.out.data, 0, static_cast<size_t>(G * M * N * 2), stream);
    check_launch(what);
    return;
  }
  gemm::GroupedKGatherRun r;
  r.rows = R;
  r.m = M;
  r.n = N;
  r.groups = static_cast<int>(G);
  r.a = static_cast<const uint8_t*>(x.a.data);
  r.lda = 2 * M;
  r.b = static_cast<const uint8_t*>(x.b.data);
  r.ldb = 2 * N;
  r.gather = static_cast<const int32_t*>(x.gather.data);
  r.fanout = x.fanout;
  r.t_rows = T;
  r.gather_b = x.gather_b;
  r.offs = static_cast<const int32_t*>(x.offs.data);
  r.offs_s = x.offs.strides[0];
  r.out = x.out.data;
  r.sm_count = props.sm_count;
  r.device = x.a.device;
  r.stream = stream;
  if (gemm::sm90_grouped_k_gather_bf16(r)) return;
#endif
  fail_status(MXMOE_ERR_UNSUPPORTED, what, ": the sm_90a kernel does not take R = ", R, ", M = ", M, ", N = ", N,
              ", G = ", G, ", T = ", T, ", fanout = ", x.fanout,
              " (mxmoe_grouped_mm_bf16_kgather_available says which calls it takes)");
}

bool grouped_mm_tile128_gather_dswiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t a_rows,
                                                 int64_t fanout, int32_t layout, int32_t device) {
#if defined(MXMOE_HAVE_CUTLASS)
  return g > 0 && gemm::sm90_grouped_m_gather_dswiglu_takes(m, i, k, g, a_rows, k, fanout, layout, device);
#else
  (void)m, (void)i, (void)k, (void)g, (void)a_rows, (void)fanout, (void)layout, (void)device;
  return false;
#endif
}

void grouped_mm_tile128_gather_dswiglu(const GatherDSwigluArgs& x) {
  const char* what = "grouped_mm_tile128_gather_dswiglu";
  const GroupedMMArgs& a = x.g.mm;
  const int64_t T = a.a.shape[0], K = a.a.shape[1], M = a.out.shape[0], N = a.b.shape[1];
  const int G = static_cast<int>(a.offs.shape[0]);
  const DeviceProps props = require_hopper(a.a.device, what);
  DeviceGuard guard(a.a.device, what);
#if defined(MXMOE_HAVE_CUTLASS)
  gemm::GroupedMGatherDSwigluRun r;
  fill_gather_run(x.g, props.sm_count, r);
  r.out = nullptr;
  r.h = static_cast<const uint16_t*>(x.h.data);
  r.alpha = x.alpha;
  r.limit = x.limit;
  r.up_offset = x.up_offset;
  r.mode = static_cast<int>(x.mode);
  r.dh_q = static_cast<uint8_t*>(x.dh_q.data);
  r.dh_scale = static_cast<uint8_t*>(x.dh_scale.data);
  r.dh_qt = static_cast<uint8_t*>(x.dh_qt.data);
  r.dh_scale_t = static_cast<uint8_t*>(x.dh_scale_t.data);
  r.n_r = x.dh_scale_t.shape[1];
  r.tw_part = static_cast<float*>(x.tw_part.data);
  if (G > 0 && gemm::sm90_grouped_m_gather_dswiglu(r)) return;
#endif
  fail_status(MXMOE_ERR_UNSUPPORTED, what, ": the sm_90a kernel does not take M = ", M, ", I = ", N, ", K = ", K,
              ", G = ", G, ", T = ", T, ", fanout = ", x.g.fanout,
              " (mxmoe_grouped_mm_tile128_gather_dswiglu_available says which calls it takes)");
}

bool grouped_mm_tile128_gather_swiglu_available(int64_t m, int64_t i, int64_t k, int64_t g, int64_t a_rows,
                                                int64_t fanout, int32_t layout, int32_t device) {
#if defined(MXMOE_HAVE_CUTLASS)
  return g > 0 && gemm::sm90_grouped_m_gather_swiglu_takes(m, 2 * i, k, g, a_rows, k, fanout, layout, device);
#else
  (void)m, (void)i, (void)k, (void)g, (void)a_rows, (void)fanout, (void)layout, (void)device;
  return false;
#endif
}

void grouped_mm_tile128_gather_swiglu(const GatherSwigluArgs& x) {
  const char* what = "grouped_mm_tile128_gather_swiglu";
  const GroupedMMArgs& a = x.g.mm;
  const int64_t T = a.a.shape[0], K = a.a.shape[1], M = a.out.shape[0], N = a.b.shape[1];
  const int G = static_cast<int>(a.offs.shape[0]);
  const DeviceProps props = require_hopper(a.a.device, what);
  DeviceGuard guard(a.a.device, what);
#if defined(MXMOE_HAVE_CUTLASS)
  gemm::GroupedMGatherSwigluRun r;
  fill_gather_run(x.g, props.sm_count, r);
  r.layout = x.layout;
  r.alpha = x.alpha;
  r.limit = x.limit;
  r.up_offset = x.up_offset;
  r.mode = static_cast<int>(x.mode);
  r.q = static_cast<uint8_t*>(x.q.data);
  r.scale = static_cast<uint8_t*>(x.scale.data);
  r.qt = x.qt.present ? static_cast<uint8_t*>(x.qt.t.data) : nullptr;
  r.scale_t = x.scale_t.present ? static_cast<uint8_t*>(x.scale_t.t.data) : nullptr;
  r.n_r = x.scale_t.present ? x.scale_t.t.shape[1] : 0;
  if (G > 0 && gemm::sm90_grouped_m_gather_swiglu(r)) return;
#endif
  fail_status(MXMOE_ERR_UNSUPPORTED, what, ": the sm_90a kernel does not take M = ", M, ", 2I = ", N, ", K = ", K,
              ", G = ", G, ", T = ", T, ", fanout = ", x.g.fanout,
              " (mxmoe_grouped_mm_tile128_gather_swiglu_available says which calls it takes)");
}

}  // namespace cuda
}  // namespace mxmoe
