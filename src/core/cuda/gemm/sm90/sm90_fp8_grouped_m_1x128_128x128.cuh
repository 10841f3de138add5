// sm_90a FP8 grouped GEMM with token groups along M: the forward and dgrad passes of the tile128
// recipe.  out (M, N) = A (M, K) . B[g] (N, K)^T (+ bias[g]) over the rows of each group g.
//   A  e4m3, K contiguous; one E8M0 scale per row and 128 of K (1x128), read from the recipe's
//      1x32 scale rows directly (byte 4 kb of the row; no conversion kernel)
//   B  e4m3 (G, N, K); one E8M0 scale per 128x128 tile (byte 4 kb of the tile's first row)
//   fp32 accumulation: each 128-deep k-block's wgmma partial is promoted once into the fp32 sum
//   with the product of its two scales (the recipe's contract, as the CUTLASS path)
//
// Structure (DeepGEMM's technique, our code): a persistent CTA per SM with three warpgroups.
// Warpgroup 0 is the producer (one thread, or at K >= 4096 all of warp 0 with one elected lane, issues
// the TMA loads of A and B tiles into a ring of shared-memory stages; 40 registers), warpgroups 1 and
// 2 each own 64 of the tile's 128 rows and issue m64 x BlockN x k32 wgmmas from the staged tiles (232 registers). At BlockN 128 a math
// thread holds two in-flight fp32 sets and the promoted sum, so k-block i is promoted while the
// wgmmas of k-block i + 1 run; at BlockN 160 / 192 (10% / 13% less shared-memory traffic per FLOP;
// a tile straddles two weight-scale tiles, handled per 8-column chunk) one in-flight set, the two
// math warpgroups' wgmmas and promotions interleaving on the tensor cores instead. Optional clusters of 2
// CTAs whose neighbouring m-tiles share a B tile load half of it each and multicast it. Group
// boundaries cost nothing in the mainloop: a tile's TMA box starts at its group's row (any row, no
// 128-alignment), rows of the next group or past M load as data or zeros and are masked when the
// epilogue (staged through shared memory, 16-byte row stores) writes the tile. Offsets are read on
// the device (no host sync): every CTA scans offs into a shared table of group ends and m-tile
// prefixes before its tile loop; a slot's tile is decoded from it without integer division
// (multiply-high by a host-computed magic number). Measurements per version: docs/design/gemm-sm90.md.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include <cub/block/block_scan.cuh>

#include "cute/arch/cluster_sm90.hpp"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cuda/gemm/sm90/sm90_fp8_common.cuh"
#include "common/moe_activation.hpp"
#include "cuda/gemm/sm90/sm90_grouped_m.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace sm90 {

// Device-side arguments (pointers are device memory; shapes fit int32, checked by the launcher).
struct GroupedMParams {
  const int32_t* offs;  // (G,) group ends, int32, any values (clamped like groups_from_offsets)
  int64_t offs_s;
  int groups;
  int m, n, k;
  const uint8_t* a_scale;  // (M, K/32) E8M0, row stride as_s0
  int64_t as_s0;
  const uint8_t* b_scale;  // (G, N, K/32) E8M0
  int64_t bs_s0, bs_s1;
  const void* bias;  // (G, N) bf16 or f32, or null
  int bias_bf16;
  int64_t bias_s0, bias_s1;
  void* out;  // (M, N) contiguous, bf16 or f32
  FastDiv band_div;  // division by the tiles of a full band, kBand * ceil(N / BlockN) (host-computed)
  // The gather variant only (GroupedMGather; appended so the other kernels' parameters keep their
  // offsets). GEMM row r reads row gather[r] / fanout of `a` (a_rows rows of K bytes, row stride lda)
  // through cp.async, the index clamped to max_index = a_rows * fanout - 1; a negative index reads a
  // zero row with scale 1 (routing padding). row_scale (optional): out row r = row_scale[index] *
  // (A B^T)[r] (+ bias) in fp32, 0 for a zero row (the routing weight applied after the GEMM).
  const int32_t* gather;
  const uint8_t* a;
  int64_t lda;
  int max_index;
  FastDiv fanout_div;
  const float* row_scale;
  // The fused epilogues only (kFusedEpilogue), which write tile128 operands instead of `out`:
  //  - dSwiGLU (GroupedMGatherDSwiglu, sm90_fp8_grouped_m_gather_dswiglu_1x128.cuh): the GEMM's rows
  //    are dY' (M, I = n), never stored; the epilogue reads h (M, 2I) bf16 (gate | up) and writes
  //    dH = act'(h, row_scale * dY') (M, 2I): q_row + scale_row (M, 2I/32) rowwise 1x128, q_col (2I, M)
  //    + scale_col (2I, n_r) 128x1 per group, and tw_part (M, I/128), the per-128-column partials of
  //    <dY', act(h)>.
  //  - SwiGLU (GroupedMGatherSwiglu, sm90_fp8_grouped_m_gather_swiglu_1x128.cuh): the GEMM's rows are
  //    h (M, n = 2I), stored into `out`; the epilogue writes act(h) (M, I): q_row + scale_row (M, I/32)
  //    and, when q_col is set, q_col (I, M) + scale_col (I, n_r).
  const uint16_t* h;
  SwigluParams act;
  int plain;  // swiglu_is_plain(act)
  int mode;   // mxmoe_scale_mode
  uint8_t* q_row;
  uint8_t* scale_row;
  uint8_t* q_col;
  uint8_t* scale_col;
  int64_t n_r;
  float* tw_part;
  // The bf16 dSwiGLU epilogue only (GroupedMGatherDSwigluBf16, sm90_bf16_grouped_m_gather_dswiglu.cuh):
  // dH (M, 2I) bf16 instead of its FP8 forms; h, act, plain, row_scale and tw_part as above.
  uint16_t* dh_bf16;
  // The bf16 SwiGLU epilogue only (GroupedMGatherSwigluBf16): act(h) (M, n / 2) bf16 beside h in `out`.
  uint16_t* act_bf16;
};

// The device arguments of a call (host; band_div and the gather fields are the launcher's).
inline GroupedMParams grouped_m_params(const GroupedMRun& r) {
  GroupedMParams p{};
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
  p.bs_s1 = r.bs_s1;
  p.bias = r.bias;
  p.bias_bf16 = r.bias_bf16 ? 1 : 0;
  p.bias_s0 = r.bias_s0;
  p.bias_s1 = r.bias_s1;
  p.out = r.out;
  return p;
}

template <int BlockN_, int Stages_, class Out_, int Cluster_ = 1, bool Lean_ = false, bool WarpProducer_ = false>
struct GroupedM {
  using Out = Out_;
  static constexpr int kBlockN = BlockN_;
  static constexpr int kStages = Stages_;
  // CTAs per cluster along the tile order: 2 = pairs of CTAs whose tiles share a B tile (same
  // expert and columns, neighbouring m-tiles) each load half of it and multicast it to both.
  static constexpr int kCluster = Cluster_;
  // Lean: no static shared memory (CUB's scan storage lives in the epilogue buffer, free before the
  // first tile) and no alignment slack (the dynamic array is declared 1024-aligned instead): the
  // ~3.7 KB one more stage needs at BlockN 128 (the default at K >= 4096 with the warp producer:
  // sm90_config.hpp; docs/design/gemm-sm90.md "Kernel choice").
  static constexpr bool kLean = Lean_;
  // Warp producer: all of warp 0 runs the producer loop, its coordinates broadcast from lane 0 (warp-
  // uniform for the compiler), and one lane chosen by elect.sync issues, so the TMA operands sit in
  // uniform registers as in CUTLASS's producer, instead of an ELECT / R2UR / BRA.U.ANY loop around each
  // TMA (thread 0 alone). The v7c warp-stall table has the single producer thread busy ~90% of the
  // kernel on the large shapes; with this one tensor busy went 68% -> 80% there (docs/design/gemm-sm90.md,
  // "Kernel choice"). The default at K >= 4096; at K <= 1536 it measured 1-3% slower than the thread producer.
  static constexpr bool kWarpProducer = WarpProducer_;
  static_assert(kCluster == 1 || kCluster == 2, "cluster of 1 or 2 CTAs");
  // A rows read through an index by the producer warpgroup (GroupedMGather), not by TMA.
  static constexpr bool kGather = false;
  // bf16 operands (GroupedMGather's bf16 form, the bf16 MoE layer): a k-block is 128 bytes of K as
  // here (64 elements: 4 k16 wgmmas), p.k and A's row stride count bytes, no scales; the wgmmas
  // accumulate every k-block in place (no promotion). B MN-major (kBMajorMN): B[g] is (K, N), loaded
  // as two boxes of 64 K rows x 64 columns per stage.
  static constexpr bool kBf16 = false;
  static constexpr bool kBMajorMN = false;
  using Mma = typename WgmmaOp<BlockN_>::Op;
  // A fused epilogue (GroupedMGatherDSwiglu, GroupedMGatherSwiglu: K::handoff, K::epilogue_tile,
  // K::prefetch_tile, K::tail) instead of the stored output, with its shared memory after the epilogue
  // buffer and a third group table (32-row runs before each group).
  static constexpr bool kFusedEpilogue = false;
  // Tiles in pairs (GroupedMGatherSwiglu): one CTA takes tile (m, n0) and then (m, n / 2 + n0), the
  // gate and up columns of one act block; the order runs over the pairs. pair_n0: the columns of a
  // pair's first (second = 0) or second tile from the pair's index times BlockN; load_n0: the
  // columns a tile's B and its weight scales are read at (a variant with an odd tile count gives its
  // last pair a ghost second tile past N, which loads and computes its first tile again).
  static constexpr bool kPairs = false;
  static __device__ __forceinline__ int pair_n0(int n0, int second, int n) { return second ? n0 + n / 2 : n0; }
  static __device__ __forceinline__ int load_n0(int n0, int) { return n0; }
  // The B row of a tile's second half-box, after its first one's row (GroupedMGatherSwigluBf16's
  // halves: the up rows, N / 2 further than the gate rows).
  static __device__ __forceinline__ int b_second_half(int) { return kBlockN / 2; }
  static constexpr int kEpiExtraBytes = 0;
  // What a fused epilogue's math side keeps from one tile to the next (K::handoff's last argument):
  // nothing here; GroupedMGatherSwiglu holds the gate tile of a pair.
  struct HandoffState {};
  // A fourth warpgroup that runs most of tile i's epilogue while the math warpgroups run tile i + 1's
  // mainloop (GroupedMGatherDSwiglu): the math warpgroups hand the tile over through shared memory.
  static constexpr bool kEpiWarpgroup = false;
  // setmaxnreg budgets per thread (multiples of 8; the warpgroups' sum times 128 fits the 64K registers).
  static constexpr int kProducerRegs = 40, kMathRegs = 232;
  static constexpr int kBlockM = 128, kBlockK = 128;
  static constexpr int kThreads = 384;  // producer warpgroup + two math warpgroups
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kAcc = kBlockN / 2;  // fp32 accumulators per math thread (64 x BlockN / 128)
  static constexpr int kBand = 8;           // m-tiles per band of the tile order (L2 reuse of A and B)
  // Promotion of k-block i overlapped with the wgmmas of k-block i + 1 needs a second accumulator
  // set: 3 x 64 fp32 registers at BlockN 128 fit the 232 of a math thread, 3 x 96 at 192 do not.
  // (One set at BlockN 128, each k-block promoted after its own wgmmas as DeepGEMM does, measured
  // 0.93-1.01x of the overlap at v7b: docs/design/gemm-sm90.md.)
  static constexpr bool kOverlap = kBlockN <= 128;
  // BlockN 128, 160 or 192: a tile meets at most two 128-wide weight-scale tiles, and its 8-column
  // chunks never straddle one (tile starts are multiples of 32).
  static_assert(kBlockN == 128 || kBlockN == 160 || kBlockN == 192, "BlockN: 128, 160 or 192");
  static_assert(kStageBytes % 1024 == 0, "stages must keep the 1024-byte swizzle alignment");
  static_assert(kBlockN / 2 * kBlockK % 1024 == 0, "a half B tile must keep the swizzle alignment");

  // Epilogue staging: each math warpgroup's 64 x BlockN outputs in shared memory as the boxes of a TMA
  // store: kEpiBoxes boxes of 64 rows x kEpiBoxBytes, each swizzled as the tensor map says (128-byte
  // rows: 16-byte chunk c of row r at c ^ (r % 8); 64-byte rows: c ^ (r / 2 % 4)), which also keeps
  // the accumulator-layout writes free of bank conflicts (bf16). 64-byte boxes where a row is not a
  // whole number of 128-byte lines (BlockN 160 bf16).
  static constexpr int kRowBytes = kBlockN * static_cast<int>(sizeof(Out));
  static constexpr int kEpiBoxBytes = kRowBytes % 128 == 0 ? 128 : 64;
  static constexpr int kEpiBoxes = kRowBytes / kEpiBoxBytes;
  static constexpr int kEpiBoxCols = kEpiBoxBytes / static_cast<int>(sizeof(Out));
  static constexpr int kEpiWgBytes = 64 * kRowBytes;
  static constexpr int kEpiBytes = 2 * kEpiWgBytes;
  static_assert(kRowBytes % kEpiBoxBytes == 0, "a staged row is a whole number of boxes");
  static_assert(kEpiWgBytes % 1024 == 0, "the epilogue buffers keep the stages and the swizzle 1024-byte aligned");

  // Dynamic shared memory: 1024 alignment slack (not when lean) | stages | epilogue | full/empty
  // barriers | group tables.
  static constexpr size_t smem_bytes(int groups) {
    return (kLean ? 0 : 1024) + static_cast<size_t>(kStages) * kStageBytes + kEpiBytes +
           2 * kStages * sizeof(uint64_t) + (2 * static_cast<size_t>(groups) + 1) * sizeof(int);
  }
};

// The gather variant (the MoE layer's GEMM on routed rows of a per-token operand): A's tile rows are
// loaded by the 128 producer threads with cp.async from the rows an index names, 16 bytes each into
// the 128-byte swizzled layout the wgmmas read (thread t: row t / 8 + 16 i, chunk t % 8), each thread's
// copies arriving on the stage's full barrier when they land (cp.async.mbarrier.arrive.noinc); B
// stays a TMA load. No T*k-row copy of the operand exists. One CTA per cluster, the thread layout of
// the other warps as in GroupedM.
//
// Bf16_: the bf16 form (kBf16 above) of the MoE layer's bf16 data flow, B K-major (B[g] (N, K), the up
// projection's w13) or, with BMajorMN_, MN-major (B[g] (K, N), the down projection's dgrad reading w2
// (E, H, I) as it is: K = H a multiple of 64, so a box never reads the next expert's rows).
template <int BlockN_, int Stages_, class Out_, bool Bf16_ = false, bool BMajorMN_ = false>
struct GroupedMGather : GroupedM<BlockN_, Stages_, Out_> {
  static constexpr bool kGather = true;
  static constexpr int kCopyThreads = 128;  // the producer warpgroup
  static constexpr bool kBf16 = Bf16_;
  static constexpr bool kBMajorMN = BMajorMN_;
  static_assert(!BMajorMN_ || Bf16_, "MN-major B: bf16 only (FP8 wgmmas read K-major operands)");
  static_assert(!Bf16_ || BlockN_ == 128, "bf16: BlockN 128");
  using Mma = std::conditional_t<Bf16_, typename WgmmaOpBf16<BMajorMN_>::Op, typename WgmmaOp<BlockN_>::Op>;
};

struct TileCoord {
  int g, row0, rows, n0;
};

// 16 bytes global -> shared by cp.async (L2 only); `bytes` 0 writes zeros without reading.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes) : "memory");
}

// Arrives on `bar` once every cp.async this thread issued before has landed (not counted at init).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// The routed index of a gather-variant GEMM row, clamped to max_index (negative: a padding row).
__device__ __forceinline__ int gather_index(const GroupedMParams& p, int r) { return min(p.gather[r], p.max_index); }

// The A row a gather-variant GEMM row reads: index / fanout, or -1 (a zero row) for a negative index.
__device__ __forceinline__ int gather_row(const GroupedMParams& p, int r) {
  const int idx = gather_index(p, r);
  return idx < 0 ? -1 : static_cast<int>(fast_div(static_cast<uint32_t>(idx), p.fanout_div));
}

// A position in the ring of shared-memory stages: stage s, in a pass of parity ph. Every side takes the
// k-blocks in order, so a position only ever advances by one (no division by the stage count).
template <int Stages>
struct RingPos {
  int s = 0;
  uint32_t ph = 0;
  __device__ __forceinline__ void advance() {
    if (++s == Stages) {
      s = 0;
      ph ^= 1u;
    }
  }
};

// The TMA swizzle of the staged epilogue's boxes: row r's 16-byte chunk c sits at chunk c ^ swizzle(r)
// (128-byte rows: r % 8; 64-byte rows: r / 2 % 4).
template <class K>
__device__ __forceinline__ int epi_swizzle(int r) {
  return K::kEpiBoxBytes == 128 ? (r & 7) : ((r >> 1) & 3);
}

// Byte offset of 16-byte chunk `ch` (of kRowBytes / 16) of row r (of 64) in a warpgroup's staged
// epilogue: box ch / (box chunks), then the swizzled chunk inside the box row.
template <class K>
__device__ __forceinline__ int epi_offset(int r, int ch) {
  constexpr int kBoxChunks = K::kEpiBoxBytes / 16;
  const int box = ch / kBoxChunks, c = ch % kBoxChunks;
  return box * 64 * K::kEpiBoxBytes + r * K::kEpiBoxBytes + 16 * (c ^ epi_swizzle<K>(r));
}

// CUB's block-scan storage for the group table: static shared memory, or (lean) the epilogue buffer,
// which nothing else uses before the first tile's epilogue.
template <class K, class Scan>
__device__ __forceinline__ typename Scan::TempStorage& scan_storage(uint8_t* smem_epi) {
  if constexpr (K::kLean) {
    return *reinterpret_cast<typename Scan::TempStorage*>(smem_epi);
  } else {
    __shared__ typename Scan::TempStorage storage;
    return storage;
  }
}

// Tile t of the persistent order: groups in order, inside a group bands of kBand m-tiles swept
// along N (consecutive CTAs share B tiles of one expert and A tiles of one band). g is advanced
// monotonically (t only grows per CTA). No hardware division: local / (kBand nt) by the launch's
// FastDiv, rem / band_rows (1..kBand) by div_small; local < total < 2^31 and rem < kBand nt < 2^27.
template <class K>
__device__ __forceinline__ TileCoord tile_coord(int t, int& g, int nt, FastDiv band_div, const int* s_end,
                                                const int* s_tiles) {
  static_assert(K::kBand <= 8, "div_small divides by at most 8");
  while (s_tiles[g + 1] * nt <= t) ++g;
  const int first = s_tiles[g];
  const int local = t - first * nt;
  const int mt = s_tiles[g + 1] - first;
  const int band = static_cast<int>(fast_div(static_cast<uint32_t>(local), band_div));
  const int rem = local - band * K::kBand * nt;
  const int band_rows = min(K::kBand, mt - band * K::kBand);
  const int n_idx = static_cast<int>(div_small(static_cast<uint32_t>(rem), static_cast<uint32_t>(band_rows)));
  const int m_idx = band * K::kBand + (rem - n_idx * band_rows);
  const int start = g ? s_end[g - 1] : 0;
  TileCoord c;
  c.g = g;
  c.row0 = start + m_idx * K::kBlockM;
  c.rows = min(K::kBlockM, s_end[g] - c.row0);
  c.n0 = n_idx * K::kBlockN;
  return c;
}

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1)
    grouped_m_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                     const __grid_constant__ CUtensorMap tma_out, const GroupedMParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Op = typename K::Mma;
  using Out = typename K::Out;
  constexpr int kHalfB = K::kBBytes / 2;  // the B box is loaded as two halves of kBlockN / 2 rows
  // 128-byte swizzled TMA tiles need 1024-byte aligned bases; the dynamic base is not guaranteed to
  // be, so the first 1024-aligned byte is used (smem_bytes has the slack). The offset is added to the
  // shared array itself, not computed through a generic uintptr_t, so the compiler keeps the shared
  // address space for every access below (STS / LDS instead of generic ST / LD).
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem;
  if constexpr (K::kLean) {
    // No slack to align with: the array is declared 1024-aligned (the toolchain places it so), and
    // checked, since the whole layout depends on it.
    extern __shared__ __align__(1024) uint8_t smem_aligned[];
    smem = smem_aligned;
    if (smem_u32(smem) & 1023u) __trap();
  } else {
    smem = smem_raw + ((0u - smem_u32(smem_raw)) & 1023u);
  }
  uint8_t* smem_a = smem;
  uint8_t* smem_b = smem + K::kStages * K::kABytes;
  uint8_t* smem_epi = smem + K::kStages * K::kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_epi + K::kEpiBytes + K::kEpiExtraBytes);
  uint64_t* empty = full + K::kStages;
  int* s_end = reinterpret_cast<int*>(empty + K::kStages);  // [G] clamped group ends
  int* s_tiles = s_end + p.groups;                          // [G + 1] m-tile prefix
  int* s_runs = s_tiles + p.groups + 1;                     // dSwiGLU: [G + 1] 32-row-run prefix

  const int tid = threadIdx.x;
  // Warp-uniform by construction; taken through a shuffle so the compiler knows it (it then keeps the
  // values derived from it, the math warpgroup's tile addresses and wgmma descriptors, in uniform
  // registers instead of moving them there before every wgmma).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  // Cluster rank and tile slot: CTA r of cluster c takes tile kCluster * P + r for P = c, c + clusters, ...
  const int rank = K::kCluster > 1 ? static_cast<int>(cute::block_rank_in_cluster()) : 0;
  const int cluster = blockIdx.x / K::kCluster, clusters = gridDim.x / K::kCluster;
  if (tid == 0) {
    for (int s = 0; s < K::kStages; ++s) {
      if constexpr (K::kGather) {
        // the B load's expect-tx arrival and one cp.async arrival per producer thread
        cutlass::arch::ClusterBarrier::init(&full[s], 1 + K::kCopyThreads);
      } else {
        cutlass::arch::ClusterBarrier::init(&full[s], 1);
      }
      // lane 0 of each of the 8 math warps of every CTA of the cluster: every k-block is released
      // to both producers, shared or not, so the CTAs of a cluster stay within one ring of each
      // other and no arrival can land in a later phase
      cutlass::arch::ClusterBarrier::init(&empty[s], 8 * K::kCluster);
    }
    if constexpr (K::kEpiWarpgroup) K::init_handoff(smem_epi);
    cutlass::arch::fence_barrier_init();
  }

  // Group table: end_g = min(M, max(end_{g-1}, offs[g])), m-tiles_g = ceil(len_g / 128).
  {
    using Scan = cub::BlockScan<int, K::kThreads>;
    typename Scan::TempStorage& scan_tmp = scan_storage<K, Scan>(smem_epi);
    int carry_end = 0, carry_tiles = 0;
    [[maybe_unused]] int carry_runs = 0;
    for (int base = 0; base < p.groups; base += K::kThreads) {
      const int g = base + tid;
      int start, len;
      group_rows_chunk<K::kThreads>(p.offs, p.offs_s, p.groups, p.m, g, scan_tmp, carry_end, start, len);
      const int mt = (len + K::kBlockM - 1) / K::kBlockM;
      int before, tiles;
      Scan(scan_tmp).ExclusiveSum(mt, before, tiles);
      __syncthreads();
      if (g < p.groups) {
        s_end[g] = start + len;
        s_tiles[g] = carry_tiles + before;
      }
      carry_tiles += tiles;
      if constexpr (K::kFusedEpilogue) {
        int rb, runs;
        Scan(scan_tmp).ExclusiveSum((len + 31) / 32, rb, runs);
        __syncthreads();
        if (g < p.groups) s_runs[g] = carry_runs + rb;
        carry_runs += runs;
      }
    }
    if (tid == 0) {
      s_tiles[p.groups] = carry_tiles;
      if constexpr (K::kFusedEpilogue) s_runs[p.groups] = carry_runs;
    }
  }
  // Barriers initialized and the group table written in every CTA of the cluster before any CTA
  // multicasts into a peer or arrives on its barriers.
  if constexpr (K::kCluster > 1) {
    cute::cluster_sync();
  } else {
    __syncthreads();
  }

  const int nt = (p.n + K::kBlockN - 1) / K::kBlockN;
  const int np = (nt + 1) / 2;  // in pairs: pairs of tiles per m-tile (an odd nt: the last one's second a ghost)
  const int kblocks = (p.k + K::kBlockK - 1) / K::kBlockK;
  const int total = s_tiles[p.groups] * (K::kPairs ? 2 * np : nt);
  // The slots a CTA takes: cluster, cluster + clusters, ...; in pairs, 2 cluster and 2 cluster + 1, then
  // the pair clusters further (total is even).
  static_assert(!K::kPairs || (K::kGather && K::kCluster == 1), "pairs: the gather variant, no cluster");
  const int first_slot = K::kPairs ? 2 * cluster : cluster;
  auto next_slot = [&](int P) { return !K::kPairs ? P + clusters : (P & 1) ? P - 1 + 2 * clusters : P + 1; };
  // Tiles of one slot: this CTA's and its peer's; shared = both have the same B tile. Both CTAs of a
  // cluster compute the same answer, so they agree on every multicast. A slot past the last tile
  // (only the last slot, when the tile count is odd) is a ghost: it runs the peer's tile without
  // storing, so both CTAs still take every k-block of every slot in step.
  struct Slot {
    TileCoord c;
    bool store, shared;
  };
  auto slot = [&](int P, int& g_mine, int& g_peer) {
    Slot sl;
    const int t = K::kCluster * P + rank;
    sl.store = t < total;
    sl.shared = false;
    if constexpr (K::kCluster > 1) {
      const int tp = K::kCluster * P + (1 - rank);
      TileCoord pc{};
      if (tp < total) pc = tile_coord<K>(tp, g_peer, nt, p.band_div, s_end, s_tiles);
      if (sl.store) {
        sl.c = tile_coord<K>(t, g_mine, nt, p.band_div, s_end, s_tiles);
        sl.shared = tp < total && pc.g == sl.c.g && pc.n0 == sl.c.n0;
      } else {
        sl.c = pc;
      }
    } else if constexpr (K::kPairs) {
      if (sl.store) {
        sl.c = tile_coord<K>(t >> 1, g_mine, np, p.band_div, s_end, s_tiles);
        sl.c.n0 = K::pair_n0(sl.c.n0, t & 1, p.n);
      }
    } else {
      if (sl.store) sl.c = tile_coord<K>(t, g_mine, nt, p.band_div, s_end, s_tiles);
    }
    return sl;
  };
  const int slots = (total + K::kCluster - 1) / K::kCluster;

  if (wg == 0) {
    // Producer: one thread streams every tile's k-blocks through the stage ring.
    cutlass::arch::warpgroup_reg_dealloc<K::kProducerRegs>();
    if constexpr (K::kGather) {
      // Thread t copies chunk t % 8 of tile rows t / 8 + 16 i (i < 8); thread 0 also loads B by TMA.
      // Row r's chunk c sits at chunk c ^ (r % 8) of its 128-byte row (the TMA swizzle), and r % 8 is
      // the same for all 8 rows of a thread. Rows past the group, padding rows and columns past K are
      // written as zeros (src-size 0).
      static_assert(K::kCluster == 1 && K::kBlockM == 128 && K::kBlockK == 128, "gather: 128 x 128 A tiles, no cluster");
      const int row_lo = tid / 8, chunk = tid % 8;
      const int dst_off = row_lo * K::kBlockK + ((chunk ^ (row_lo & 7)) << 4);
      RingPos<K::kStages> rp;
      int g_mine = 0, g_peer = 0;
      for (int P = first_slot; P < slots; P = next_slot(P)) {
        const Slot sl = slot(P, g_mine, g_peer);
        if (!sl.store) break;
        const int brow = sl.c.g * p.n + K::load_n0(sl.c.n0, p.n);
        if constexpr (K::kFusedEpilogue) K::prefetch_tile(p, sl.c, tid);
        uint32_t src_off[8];  // byte offsets of this thread's rows in a (a_rows * lda < 2^32, checked)
        uint32_t live = 0;    // bit i: row i reads data
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int lr = row_lo + 16 * i;
          const int src = lr < sl.c.rows ? gather_row(p, sl.c.row0 + lr) : -1;
          src_off[i] = src >= 0 ? static_cast<uint32_t>(src) * static_cast<uint32_t>(p.lda) + 16u * chunk : 0u;
          live |= src >= 0 ? (1u << i) : 0u;
        }
        for (int kb = 0; kb < kblocks; ++kb, rp.advance()) {
          const int s = rp.s;
          cutlass::arch::ClusterBarrier::wait(&empty[s], rp.ph ^ 1);
          const int k0 = kb * K::kBlockK;
          if (tid == 0) {
            cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[s], K::kBBytes);
            uint8_t* b = smem_b + s * K::kBBytes;
            if constexpr (K::kBMajorMN) {
              // B[g] (K, N) bf16: K rows g K + k0 / 2 .. + 63, columns n0 .. n0 + 63 and n0 + 64 .. (bytes)
              const int krow = sl.c.g * (p.k / 2) + k0 / 2;
              tma_load_2d(&tma_b, &full[s], b, 2 * sl.c.n0, krow);
              tma_load_2d(&tma_b, &full[s], b + kHalfB, 2 * sl.c.n0 + 128, krow);
            } else {
              tma_load_2d(&tma_b, &full[s], b, k0, brow);
              tma_load_2d(&tma_b, &full[s], b + kHalfB, k0, brow + K::b_second_half(p.n));
            }
          }
          const bool col_in = k0 + 16 * chunk < p.k;
          uint8_t* a_dst = smem_a + s * K::kABytes + dst_off;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const bool on = col_in && ((live >> i) & 1u);
            cp_async_16(a_dst + 16 * i * K::kBlockK, p.a + src_off[i] + (on ? k0 : 0), on ? 16 : 0);
          }
          cp_async_arrive_noinc(&full[s]);
        }
      }
    } else if constexpr (K::kWarpProducer) {
      if (tid < 32) {
        auto uniform = [](int v) { return __shfl_sync(0xffffffffu, v, 0); };
        const bool leader = cute::elect_one_sync();
        RingPos<K::kStages> rp;
        int g_mine = 0, g_peer = 0;
        for (int P = cluster; P < slots; P += clusters) {
          const Slot sl = slot(P, g_mine, g_peer);
          if (K::kCluster == 1 && !uniform(sl.store)) break;
          const int row0 = uniform(sl.c.row0), brow = uniform(sl.c.g * p.n + sl.c.n0);
          const bool shared = uniform(sl.shared);
          for (int kb = 0; kb < kblocks; ++kb, rp.advance()) {
            const int s = rp.s;
            cutlass::arch::ClusterBarrier::wait(&empty[s], rp.ph ^ 1);
            if (leader) {
              cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[s], K::kStageBytes);
              const int k0 = kb * K::kBlockK;
              tma_load_2d(&tma_a, &full[s], smem_a + s * K::kABytes, k0, row0);
              uint8_t* b = smem_b + s * K::kBBytes;
              if (K::kCluster > 1 && shared) {
                tma_load_2d_multicast(&tma_b, &full[s], b + rank * kHalfB, k0, brow + rank * (K::kBlockN / 2),
                                      static_cast<uint16_t>((1u << K::kCluster) - 1));
              } else {
                tma_load_2d(&tma_b, &full[s], b, k0, brow);
                tma_load_2d(&tma_b, &full[s], b + kHalfB, k0, brow + K::kBlockN / 2);
              }
            }
            __syncwarp();
          }
        }
      }
    } else if (tid == 0) {
      RingPos<K::kStages> rp;
      int g_mine = 0, g_peer = 0;
      for (int P = cluster; P < slots; P += clusters) {
        const Slot sl = slot(P, g_mine, g_peer);
        if (K::kCluster == 1 && !sl.store) break;
        const int brow = sl.c.g * p.n + sl.c.n0;
        for (int kb = 0; kb < kblocks; ++kb, rp.advance()) {
          const int s = rp.s;
          const uint32_t ph = rp.ph;
          cutlass::arch::ClusterBarrier::wait(&empty[s], ph ^ 1);
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[s], K::kStageBytes);
          const int k0 = kb * K::kBlockK;
          tma_load_2d(&tma_a, &full[s], smem_a + s * K::kABytes, k0, sl.c.row0);
          uint8_t* b = smem_b + s * K::kBBytes;
          if (K::kCluster > 1 && sl.shared) {
            tma_load_2d_multicast(&tma_b, &full[s], b + rank * kHalfB, k0, brow + rank * (K::kBlockN / 2),
                                  static_cast<uint16_t>((1u << K::kCluster) - 1));
          } else {
            tma_load_2d(&tma_b, &full[s], b, k0, brow);
            tma_load_2d(&tma_b, &full[s], b + kHalfB, k0, brow + K::kBlockN / 2);
          }
        }
      }
    }
  } else if (K::kEpiWarpgroup && wg == 3) {
    if constexpr (K::kEpiWarpgroup) {
      // The epilogue warpgroup: every tile of this CTA, one behind the math warpgroups.
      // setmaxnreg may only lower a count with .dec and raise it with .inc (from the launch's 64K / 512).
      if constexpr (K::kEpiRegs > 65536 / K::kThreads)
        cutlass::arch::warpgroup_reg_alloc<K::kEpiRegs>();
      else
        cutlass::arch::warpgroup_reg_dealloc<K::kEpiRegs>();
      uint32_t ph = 0;
      int g_mine = 0, g_peer = 0;
      for (int P = first_slot; P < slots; P = next_slot(P)) {
        const Slot sl = slot(P, g_mine, g_peer);
        if (!sl.store) break;
        if (p.plain)
          K::template epilogue_tile<true>(p, sl.c, tid - 384, smem_epi, s_end, s_runs, nt, ph);
        else
          K::template epilogue_tile<false>(p, sl.c, tid - 384, smem_epi, s_end, s_runs, nt, ph);
        if (!K::kPairs || (P & 1)) ph ^= 1u;  // in pairs: one hand-over phase per pair
      }
    }
  } else {
    // Math warpgroups.
    cutlass::arch::warpgroup_reg_alloc<K::kMathRegs>();
    const int mw = wg - 1;
    const int lt = tid - 128 * wg, warp = lt / 32, lane = lt % 32;
    const int r0 = mw * 64 + warp * 16 + lane / 4;  // this thread's rows in the tile: r0, r0 + 8
    const int nb = (p.n + 127) / 128;
    float acc[K::kAcc], fin[K::kAcc];
    float acc2[K::kOverlap ? K::kAcc : 1];  // the second in-flight set (overlapped promotion only)
    RingPos<K::kStages> ri, rr;  // the next k-block to issue and the next to retire
    [[maybe_unused]] uint32_t hph = 0;  // the epilogue warpgroup's hand-over phase
    [[maybe_unused]] typename K::HandoffState hs{};
    int g_mine = 0, g_peer = 0;
    for (int P = first_slot; P < slots; P = next_slot(P)) {
      const Slot sl = slot(P, g_mine, g_peer);
      if (K::kCluster == 1 && !sl.store) break;
      const TileCoord& c = sl.c;
#pragma unroll
      for (int i = 0; i < K::kAcc; ++i) fin[i] = 0.f;
      int ar0 = min(c.row0 + r0, p.m - 1), ar1 = min(c.row0 + r0 + 8, p.m - 1);
      // Gather: the rows' A rows (-1: a zero row, whose scale byte is taken as 127 = 1.0 so that a NaN
      // scale elsewhere cannot reach it).
      int src0 = 0, src1 = 0;
      if constexpr (K::kGather) {
        src0 = r0 < c.rows ? gather_row(p, c.row0 + r0) : -1;
        src1 = r0 + 8 < c.rows ? gather_row(p, c.row0 + r0 + 8) : -1;
        ar0 = max(src0, 0);
        ar1 = max(src1, 0);
      }
      if constexpr (K::kBf16) {
        // bf16: the k-blocks' wgmmas accumulate into fin in place; k-block kb + 1 is issued before
        // k-block kb's stage is released (wait<1>), so the tensor cores always have one queued.
        const uint64_t da0 = kmajor_sw128_desc(smem_a + mw * 64 * K::kBlockK);
        const uint64_t db0 = K::kBMajorMN ? mnmajor_sw128_desc(smem_b, kHalfB) : kmajor_sw128_desc(smem_b);
        // A k16 step: 32 bytes along a K-major row; 16 rows of 128 bytes in an MN-major box (16-byte units).
        constexpr uint32_t kBStep = K::kBMajorMN ? 2048 / 16 : 2;
        auto release = [&] {
          const int s = rr.s;
          rr.advance();
          if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&empty[s]);
        };
        for (int kb = 0; kb < kblocks; ++kb) {
          const int s = ri.s;
          cutlass::arch::ClusterBarrier::wait(&full[s], ri.ph);
          ri.advance();
          fence_async_shared();  // cp.async wrote A through the generic proxy
#pragma unroll
          for (int q = 0; q < K::kAcc; ++q) cute::warpgroup_fence_operand(fin[q]);
          cute::warpgroup_arrive();
          const uint64_t da = da0 + static_cast<uint32_t>(s * (K::kABytes / 16));
          const uint64_t db = db0 + static_cast<uint32_t>(s * (K::kBBytes / 16));
#pragma unroll
          for (int j = 0; j < K::kBlockK / 32; ++j)
            wgmma<Op>(da + 2 * j, db + kBStep * j, fin, kb > 0 || j > 0, std::make_index_sequence<K::kAcc>{});
          cute::warpgroup_commit_batch();
          if (kb > 0) {
            cute::warpgroup_wait<1>();
            release();
          }
        }
        cute::warpgroup_wait<0>();
        release();
#pragma unroll
        for (int q = 0; q < K::kAcc; ++q) cute::warpgroup_fence_operand(fin[q]);
      } else {
        const uint8_t* sa0 = p.a_scale + static_cast<int64_t>(ar0) * p.as_s0;
        const uint8_t* sa1 = p.a_scale + static_cast<int64_t>(ar1) * p.as_s0;
        const int ib0 = K::load_n0(c.n0, p.n) / 128, ib1 = min(ib0 + 1, nb - 1);
        const uint8_t* sb0 = p.b_scale + c.g * p.bs_s0 + static_cast<int64_t>(ib0) * 128 * p.bs_s1;
        const uint8_t* sb1 = p.b_scale + c.g * p.bs_s0 + static_cast<int64_t>(ib1) * 128 * p.bs_s1;
        const int jb = (128 - c.n0 % 128) / 8;  // 8-column chunks [0, jb) are in weight tile ib0
        // Scales, 4 k-blocks per load: lane q of each quad (the 4 lanes holding the same rows) loads the
        // scale bytes of k-block kb4 + q, and a k-block's scale products reach the quad by shuffle. One
        // row's bytes of 4 k-blocks sit in one 16-byte span, so a warp's load touches 8 cache lines per 4
        // k-blocks instead of per k-block, and a math thread issues 3 byte loads and decodes per 4
        // k-blocks instead of per k-block (a shorter per-k-block instruction stream: docs/design/gemm-sm90.md).
        struct ScaleBytes {
          uint32_t a0, a1, b0, b1;
        };
        struct ScaleProducts {
          float s00, s10, s01, s11;  // (row r0 / r0 + 8) x (weight tile ib0 / ib1)
        };
        auto load_scales = [&](int kb4) {
          const int kb = min(kb4 + (lane & 3), kblocks - 1);  // past the last k-block: a harmless reload
          ScaleBytes e;
          e.a0 = __ldg(sa0 + 4 * kb);
          e.a1 = __ldg(sa1 + 4 * kb);
          if constexpr (K::kGather) {
            if (src0 < 0) e.a0 = 127u;
            if (src1 < 0) e.a1 = 127u;
          }
          e.b0 = __ldg(sb0 + 4 * kb);
          e.b1 = K::kBlockN > 128 ? __ldg(sb1 + 4 * kb) : 0u;
          return e;
        };
        auto products = [&](const ScaleBytes& e) {
          const float a0 = e8m0_f32(e.a0), a1 = e8m0_f32(e.a1), b0 = e8m0_f32(e.b0);
          const float b1 = K::kBlockN > 128 ? e8m0_f32(e.b1) : b0;
          return ScaleProducts{a0 * b0, a1 * b0, a0 * b1, a1 * b1};
        };
        // This lane's products of its quad's k-block group (cur) and the bytes of the next group (raw,
        // loaded 4 k-blocks before they are used).
        ScaleBytes raw = load_scales(0);
        ScaleProducts cur{};
        // The products of k-block kb, taken from lane kb % 4 of this quad; at a group's first k-block the
        // group's products are formed and the next group's bytes are loaded.
        auto scales_of = [&](int kb) {
          if ((kb & 3) == 0) {
            cur = products(raw);
            raw = load_scales(kb + 4);
          }
          const int src = (lane & ~3) | (kb & 3);
          ScaleProducts t;
          t.s00 = __shfl_sync(0xffffffffu, cur.s00, src);
          t.s10 = __shfl_sync(0xffffffffu, cur.s10, src);
          t.s01 = K::kBlockN > 128 ? __shfl_sync(0xffffffffu, cur.s01, src) : t.s00;
          t.s11 = K::kBlockN > 128 ? __shfl_sync(0xffffffffu, cur.s11, src) : t.s10;
          return t;
        };
        // Per k-block: wait for its stage, issue its 4 wgmmas into `a` (async), later wait, release the
        // stage to both producers and promote `a` into fin with the block's scale products (taken
        // before the wait). The wgmma descriptors are the stage-0 ones plus the stage's and the k32
        // step's offsets (16-byte units).
        const uint64_t da0 = kmajor_sw128_desc(smem_a + mw * 64 * K::kBlockK), db0 = kmajor_sw128_desc(smem_b);
        auto issue = [&](float(&a)[K::kAcc]) {
          const int s = ri.s;
          cutlass::arch::ClusterBarrier::wait(&full[s], ri.ph);
          ri.advance();
          // cp.async wrote A through the generic proxy; the wgmmas read it through the async proxy.
          if constexpr (K::kGather) fence_async_shared();
#pragma unroll
          for (int q = 0; q < K::kAcc; ++q) cute::warpgroup_fence_operand(a[q]);
          cute::warpgroup_arrive();
          const uint64_t da = da0 + static_cast<uint32_t>(s * (K::kABytes / 16));
          const uint64_t db = db0 + static_cast<uint32_t>(s * (K::kBBytes / 16));
#pragma unroll
          for (int j = 0; j < K::kBlockK / 32; ++j)
            wgmma<Op>(da + 2 * j, db + 2 * j, a, j > 0, std::make_index_sequence<K::kAcc>{});
          cute::warpgroup_commit_batch();
        };
        auto retire = [&](float(&a)[K::kAcc], const ScaleProducts& e) {
#pragma unroll
          for (int q = 0; q < K::kAcc; ++q) cute::warpgroup_fence_operand(a[q]);
          const int s = rr.s;
          rr.advance();
          if (lane == 0) {
            cutlass::arch::ClusterBarrier::arrive(&empty[s]);
            if constexpr (K::kCluster > 1)
              cutlass::arch::ClusterBarrier::arrive(&empty[s], static_cast<uint32_t>(1 - rank), 1u);
          }
#pragma unroll
          for (int j = 0; j < K::kAcc / 4; ++j) {
            const bool first = K::kBlockN == 128 || j < jb;
            const float t0 = first ? e.s00 : e.s01, t1 = first ? e.s10 : e.s11;
            fin[4 * j + 0] = fmaf(a[4 * j + 0], t0, fin[4 * j + 0]);
            fin[4 * j + 1] = fmaf(a[4 * j + 1], t0, fin[4 * j + 1]);
            fin[4 * j + 2] = fmaf(a[4 * j + 2], t1, fin[4 * j + 2]);
            fin[4 * j + 3] = fmaf(a[4 * j + 3], t1, fin[4 * j + 3]);
          }
        };
        if constexpr (K::kOverlap) {
          // Two wgmma accumulator sets: k-block kb + 1 is issued before k-block kb is promoted, so the
          // tensor cores have work queued while the FFMAs run (wait<1>: only the older group done).
          issue(acc);
          int kb = 0;
          for (; kb + 2 < kblocks; kb += 2) {  // k-blocks kb + 1 and kb + 2 exist
            issue(acc2);
            const ScaleProducts e0 = scales_of(kb);
            cute::warpgroup_wait<1>();
            retire(acc, e0);
            issue(acc);
            const ScaleProducts e1 = scales_of(kb + 1);
            cute::warpgroup_wait<1>();
            retire(acc2, e1);
          }
          if (kb + 1 < kblocks) {  // two k-blocks left: kb (in flight in acc) and kb + 1
            issue(acc2);
            const ScaleProducts e0 = scales_of(kb);
            cute::warpgroup_wait<1>();
            retire(acc, e0);
            const ScaleProducts e1 = scales_of(kb + 1);
            cute::warpgroup_wait<0>();
            retire(acc2, e1);
          } else {
            const ScaleProducts e0 = scales_of(kb);
            cute::warpgroup_wait<0>();
            retire(acc, e0);
          }
        } else {
          for (int kb = 0; kb < kblocks; ++kb) {
            issue(acc);
            const ScaleProducts e = scales_of(kb);
            cute::warpgroup_wait<0>();
            retire(acc, e);
          }
        }
      }
      if constexpr (K::kFusedEpilogue) {
        // The tile to the epilogue warpgroup, which turns it into its operands (dY' into dH's:
        // sm90_fp8_grouped_m_gather_dswiglu_1x128.cuh; h into act(h)'s: ..._swiglu_1x128.cuh) while
        // this one runs the next tile.
        if (p.plain)
          K::template handoff<true>(p, c, fin, smem_epi, hph, mw, warp, lane, src0, src1, hs);
        else
          K::template handoff<false>(p, c, fin, smem_epi, hph, mw, warp, lane, src0, src1, hs);
        if (!K::kPairs || (P & 1)) hph ^= 1u;
      } else {
        // Epilogue: + bias, rounded to Out into this warpgroup's staged boxes (accumulator layout), then
        // stored: by TMA when the warpgroup's 64 rows all belong to the group (columns past N are
        // clipped by the tensor map; one thread issues the boxes and the warpgroup goes on to the next
        // tile's wgmmas while the copy engine writes them), else read back as rows of 16-byte chunks
        // and stored masked by the group's rows and N (rows of the next group must not be written;
        // N % 16 == 0, so a 16-byte chunk is all in or all out).
        uint8_t* epi = smem_epi + mw * K::kEpiWgBytes;
        // The previous tile's boxes have been read out of this buffer (TMA store or copy-out).
        if (lt == 0) bulk_wait_group_read0();
        asm volatile("bar.sync %0, 128;" ::"r"(1 + mw) : "memory");
        // Byte offset of this thread's pair (row lr, columns 8 j + 2 (lane % 4) + {0, 1}) in the staged
        // boxes: box_j * 64 * box bytes + (t ^ 16 c_j), with t this thread's row, swizzle and byte in its
        // 16-byte chunk, and box_j, c_j (the chunk of column 8 j inside its box) known per unrolled j.
        // Row lr + 8 has the same swizzle (t + 8 box bytes). t is taken through an opaque copy so the
        // compiler keeps one register instead of hoisting (and spilling) the 2 x kAcc / 4 addresses.
        int t;
        {
          constexpr int kS = static_cast<int>(sizeof(Out));
          const int lr = warp * 16 + lane / 4;  // row in this warpgroup's 64
          const int b0 = 2 * (lane % 4) * kS;   // byte of the pair in column 8 j's 8 columns
          const int v = lr * K::kEpiBoxBytes + 16 * ((b0 / 16) ^ epi_swizzle<K>(lr)) + b0 % 16;
          asm volatile("mov.b32 %0, %1;" : "=r"(t) : "r"(v));
        }
        if constexpr (K::kGather) {
          // out row = row_scale[gather[row]] * acc (+ bias): the routing weight after the GEMM.
          if (p.row_scale) {
            const float rs0 = src0 >= 0 ? p.row_scale[gather_index(p, c.row0 + r0)] : 0.f;
            const float rs1 = src1 >= 0 ? p.row_scale[gather_index(p, c.row0 + r0 + 8)] : 0.f;
#pragma unroll
            for (int j = 0; j < K::kAcc / 4; ++j) {
              fin[4 * j + 0] = __fmul_rn(fin[4 * j + 0], rs0);
              fin[4 * j + 1] = __fmul_rn(fin[4 * j + 1], rs0);
              fin[4 * j + 2] = __fmul_rn(fin[4 * j + 2], rs1);
              fin[4 * j + 3] = __fmul_rn(fin[4 * j + 3], rs1);
            }
          }
        }
#pragma unroll
        for (int j = 0; j < K::kAcc / 4; ++j) {
          const int cl = 8 * j + 2 * (lane % 4);
          const int col = c.n0 + cl;
          float bx = 0.f, by = 0.f;
          if (p.bias && col < p.n) {
            const int64_t o = c.g * p.bias_s0 + col * p.bias_s1;
            if (p.bias_bf16) {
              const auto* bb = static_cast<const uint16_t*>(p.bias);
              bx = bf16_to_f32(bb[o]);
              by = bf16_to_f32(bb[o + p.bias_s1]);
            } else {
              const auto* bf = static_cast<const float*>(p.bias);
              bx = bf[o];
              by = bf[o + p.bias_s1];
            }
          }
          constexpr int kBoxChunks = K::kEpiBoxBytes / 16;
          const int chunk = j * 8 * static_cast<int>(sizeof(Out)) / 16;  // column 8 j's 16-byte chunk in the row
          uint8_t* box = epi + chunk / kBoxChunks * 64 * K::kEpiBoxBytes;
          const int cx = 16 * (chunk % kBoxChunks);
          store2(reinterpret_cast<Out*>(box + (t ^ cx)), fin[4 * j + 0] + bx, fin[4 * j + 1] + by);
          store2(reinterpret_cast<Out*>(box + ((t + 8 * K::kEpiBoxBytes) ^ cx)), fin[4 * j + 2] + bx, fin[4 * j + 3] + by);
        }
        const int rows_here = c.rows - mw * 64;  // rows of this warpgroup's 64 inside the group
        const bool whole = sl.store && rows_here >= 64;
        if (whole) fence_async_shared();  // the staged boxes, written by this thread, are read by TMA next
        asm volatile("bar.sync %0, 128;" ::"r"(1 + mw) : "memory");
        if (whole) {
          if (lt == 0) {
#pragma unroll
            for (int b = 0; b < K::kEpiBoxes; ++b)
              tma_store_2d(&tma_out, epi + b * 64 * K::kEpiBoxBytes, c.n0 + b * K::kEpiBoxCols, c.row0 + mw * 64);
            bulk_commit_group();
          }
        } else if (sl.store && rows_here > 0) {
          constexpr int kChunksPerRow = K::kRowBytes / 16;
          const int cols_left = p.n - c.n0;  // columns < N in this tile
          // Chunk lt + 128 i of the warpgroup's 64 x kChunksPerRow, i < kChunks; unrolled, the shared reads
          // of a batch are issued together and the global stores masked after them.
          constexpr int kChunks = 64 * kChunksPerRow / 128;
          constexpr int kBatch = kChunks <= 8        ? kChunks
                                 : kChunks % 8 == 0 ? 8
                                 : kChunks % 6 == 0 ? 6
                                                    : 5;  // 8, 16, 12, 24 (BlockN 128 / 192) or 10, 20 (160) chunks
          static_assert(64 * kChunksPerRow % 128 == 0 && kChunks % kBatch == 0, "copy-out chunks per thread");
          // The chunk offsets depend on lt alone; computed here (an opaque copy of lt) rather than hoisted
          // out of the tile loop by the compiler, where they would be held (spilled) through the mainloop.
          int lt_here;
          asm volatile("mov.b32 %0, %1;" : "=r"(lt_here) : "r"(lt));
#pragma unroll
          for (int i0 = 0; i0 < kChunks; i0 += kBatch) {
            uint4 v[kBatch];
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
              const int q = lt_here + 128 * (i0 + i);
              const int lr = q / kChunksPerRow, ch = q - lr * kChunksPerRow;
              v[i] = *reinterpret_cast<const uint4*>(epi + epi_offset<K>(lr, ch));
            }
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
              const int q = lt_here + 128 * (i0 + i);
              const int lr = q / kChunksPerRow, ch = q - lr * kChunksPerRow;
              const int cl = ch * (16 / static_cast<int>(sizeof(Out)));
              if (lr < rows_here && cl < cols_left)
                *reinterpret_cast<uint4*>(static_cast<Out*>(p.out) + static_cast<int64_t>(c.row0 + mw * 64 + lr) * p.n +
                                          c.n0 + cl) = v[i];
            }
          }
        }
      }
    }
    // The last boxes are written before the CTA leaves (its shared memory is their source).
    if (lt == 0) bulk_wait_group0();
    const int64_t end = p.groups ? s_end[p.groups - 1] : 0;
    if constexpr (K::kFusedEpilogue) {
      K::tail(p, end, p.groups ? s_runs[p.groups] : 0, tid - 128);  // the outputs' rows past the groups
    } else {
      // Rows past the last group are zero (the math threads of every CTA, 16-byte stores; N * sizeof(Out)
      // is a multiple of 16).
      const int64_t per = 16 / sizeof(Out);
      uint4* o = static_cast<uint4*>(p.out);
#pragma unroll 1  // not unrolled: no 64-bit division for a trip count on every thread's way out
      for (int64_t i = end * p.n / per + blockIdx.x * 256 + (tid - 128); i < static_cast<int64_t>(p.m) * p.n / per;
           i += static_cast<int64_t>(gridDim.x) * 256)
        o[i] = make_uint4(0, 0, 0, 0);
    }
  }
  // No CTA leaves while its peer may still arrive on its barriers or multicast into it.
  if constexpr (K::kCluster > 1) cute::cluster_sync();
#endif
}

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
