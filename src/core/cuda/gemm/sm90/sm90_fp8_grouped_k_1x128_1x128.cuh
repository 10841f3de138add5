// sm_90a FP8 grouped GEMM with token groups along the reduction: the wgrad pass of the tile128
// recipe.  out[g] (N, K) = A[:, tokens of g] (N, len_g) . B[:, tokens of g] (K, len_g)^T.
//   A  e4m3 (N, M), tokens contiguous (row stride lda); B e4m3 (K, M) (row stride ldb)
//   scales: the recipe's grouped compact E8M0 layout (R, cap): group g's 32-runs start at column
//      blk_g = sum_{h<g} ceil(len_h / 32); its 128-block kb reads byte blk_g + 4 kb (1x128 blocks
//      along the tokens, starting at the group's first token, on both operands)
//   fp32 accumulation: each 128-token k-block's wgmma partial is promoted once into the fp32 sum
//      with the outer product of its row scales (A) and column scales (B)
//
// Structure (same skeleton as the M-grouped kernel, sm90_fp8_grouped_m_1x128_128x128.cuh): a
// persistent CTA per SM, warpgroup 0 the producer, warpgroups 1 and 2 the math (64 rows each of the
// 128 x 128 output tile; two wgmma accumulator sets, k-block kb + 1's wgmmas issued before kb is
// promoted, and the promoted fp32 sum). What the reduction-grouped pass adds:
//   - one TMA map per operand over the whole (R, M) tensor, no group staged: a group's boxes of 128
//     tokens start at 16-aligned coordinates a0 + 128 j (a0 = start - start % 16; a box starting off
//     a 16-byte boundary is an illegal instruction), and warps 1-3 of the producer warpgroup (the
//     "helpers") patch box kb in shared memory into block kb's tokens once it and the next box have
//     landed (patch_rows: the first start % 16 slots take the next box's first tokens, tokens past the
//     group are zeroed; tokens past M are zero from TMA), fence them for the async proxy and release
//     the stage on a second barrier;
//   - the per-row (A) and per-column (B) scales of a k-block differ across the tile: a first kernel
//     (grouped_k_prepare_scales) writes them as fp32 in k-block-major order, so the producer loads a
//     k-block's 128 + 128 scales with two bulk copies into the stage's scale slot, on the stage's
//     barrier; the math threads read them there as they promote the k-block and then release the
//     stage. (Read as E8M0 bytes by the helpers, 256 rows one row stride apart per
//     k-block, the scales kept the helpers busy on every k-block and the math waited on them 40% of
//     its time, ncu on Qwen3-30B-A3B's down projection.) The helpers now only patch;
//   - clusters on a block of tiles of one group: 2 x 1 (neighbouring m-tiles share the B box: 24 KB
//     per k-block per CTA instead of 32; the kernel is bound by L2 -> SM bytes) or 2 x 2 (A shared
//     too, 16 KB); each CTA loads half of a shared box and multicasts it, and every stage is
//     released to every producer of the cluster.
// Offsets are read on the device (no host sync): every CTA scans offs into shared tables (group
// ends, first k-blocks, the list of non-empty groups); a slot's tile is decoded without
// integer division. Empty groups' outputs are zero-filled by the math threads after the tile loop.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include <cub/block/block_scan.cuh>

#include "cute/arch/cluster_sm90.hpp"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cuda/gemm/sm90/sm90_fp8_common.cuh"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace sm90 {

// Device-side arguments (pointers are device memory; shapes fit int32, checked by the launcher).
struct GroupedKParams {
  const int32_t* offs;  // (G,) group ends along the tokens (clamped like groups_from_offsets)
  int64_t offs_s;
  int groups;
  int m, n, k;              // m tokens; out[g] is (n, k)
  const float* sf_a;        // prepared scales (GroupedKScales): [k-block][ceil(N / 128) 128]
  const float* sf_b;        // [k-block][ceil(K / 128)][kColSlot] in the math threads' column order
  void* out;                // (G, N, K) contiguous, bf16 or f32
  int group_tiles;          // tile slots per group: ceil(N / 128) ceil(K / 128), rounded up to the cluster size
  FastDiv group_div;        // division by group_tiles
  FastDiv band_div;         // division by the tiles of a full band, kBand ceil(K / 128)
};

// The prepared scales (grouped_k_prepare_scales): k-block j of the whole call is block kb of group g
// with j = sum_{h<g} ceil(len_h / 128) + kb (fewer than ceil(M / 128) + G of them). Row n of A in
// k-block j: sf_a[j na + n] (na = ceil(N / 128) 128, rows past N 0); column c of B: sf_b[(j kc + c / 128)
// kColSlot + col_slot(c % 128)] (kc = ceil(K / 128), columns past K 0).
struct GroupedKScales {
  const int32_t* offs;
  int64_t offs_s;
  int groups;
  int m, n, k;
  const uint8_t* a_scale;  // (N, cap) E8M0, row stride as_s0: the recipe's grouped compact layout
  int64_t as_s0;
  const uint8_t* b_scale;  // (K, cap) E8M0, row stride bs_s0
  int64_t bs_s0;
  float* sf_a;
  float* sf_b;
  static constexpr int kColGroup = 36;           // floats per lane%4 group of columns: 32 + 4 of bank padding
  static constexpr int kColSlot = 4 * kColGroup;  // one 128-column chunk's slot
  static int64_t kblocks_bound(int64_t m, int64_t g) { return (m + 127) / 128 + g; }
  static int64_t a_floats(int64_t m, int64_t n, int64_t g) { return kblocks_bound(m, g) * ((n + 127) / 128 * 128); }
  static int64_t b_floats(int64_t m, int64_t k, int64_t g) { return kblocks_bound(m, g) * ((k + 127) / 128 * kColSlot); }
};

// Where column c (0..127) of a chunk sits in its slot: math thread lane holds columns 8 j + 2 (lane % 4)
// + e (j < 16, e < 2), so those 32 are made contiguous (eight 16-byte loads instead of sixteen 8-byte
// ones) and the four lane % 4 groups sit kColGroup floats apart, which puts them in different banks.
__device__ __forceinline__ int col_slot(int c) {
  return GroupedKScales::kColGroup * ((c & 7) >> 1) + 2 * (c >> 3) + (c & 1);
}

// Block (x, g): 128 rows of A (x < ceil(N / 128)) or columns of B (the rest), every k-block of group g.
// The group's start, length and scale column come from a block scan of offs (as the GEMM's tables).
__global__ void __launch_bounds__(128) grouped_k_prepare_scales(const GroupedKScales p) {
  using Scan = cub::BlockScan<int, 128>;
  __shared__ typename Scan::TempStorage scan_tmp;
  const int g = blockIdx.y, tid = threadIdx.x;
  // Over groups h <= g: end_h = min(M, max(end_{h-1}, offs[h])); carried: end_{g-1}, the 32-runs and
  // the 128-blocks of the groups before g.
  int carry_end = 0, carry_blk = 0, carry_kb = 0, start = 0, end = 0;
  for (int base = 0; base <= g; base += 128) {
    const int h = base + tid;
    int hstart, hlen;
    group_rows_chunk<128>(p.offs, p.offs_s, g + 1, p.m, h, scan_tmp, carry_end, hstart, hlen);
    const int len = h < g ? hlen : 0;
    int blk_before, blk_total, kb_before, kb_total;
    Scan(scan_tmp).ExclusiveSum((len + 31) / 32, blk_before, blk_total);
    __syncthreads();
    Scan(scan_tmp).ExclusiveSum((len + 127) / 128, kb_before, kb_total);
    __syncthreads();
    (void)blk_before;
    (void)kb_before;
    if (h == g) {  // this thread holds group g: broadcast below
      start = hstart;
      end = hstart + hlen;
    }
    carry_blk += blk_total;
    carry_kb += kb_total;
  }
  __shared__ int s_start, s_end;
  if (tid == (g & 127)) {
    s_start = start;
    s_end = end;
  }
  __syncthreads();
  const int len = s_end - s_start;
  const int blocks = (len + 127) / 128;
  const int na = (p.n + 127) / 128, kc = (p.k + 127) / 128;
  const bool is_a = static_cast<int>(blockIdx.x) < na;
  const int chunk = is_a ? blockIdx.x : blockIdx.x - na;
  const int row = chunk * 128 + tid;
  const bool inside = row < (is_a ? p.n : p.k);
  const uint8_t* src = (is_a ? p.a_scale + static_cast<int64_t>(row) * p.as_s0 : p.b_scale + static_cast<int64_t>(row) * p.bs_s0) + carry_blk;
  for (int kb = 0; kb < blocks; ++kb) {
    const int64_t j = carry_kb + kb;
    const float v = inside ? e8m0_f32(__ldg(src + 4 * kb)) : 0.f;
    if (is_a) {
      p.sf_a[j * na * 128 + row] = v;
    } else {
      float* slot = p.sf_b + (j * kc + chunk) * GroupedKScales::kColSlot;
      slot[col_slot(tid)] = v;
      if (tid < 16) slot[GroupedKScales::kColGroup * (tid >> 2) + 32 + (tid & 3)] = 0.f;  // bank padding
    }
  }
}

template <int Stages_, class Out_, int Cluster_ = 1, bool WarpProducer_ = false>
struct GroupedK {
  using Out = Out_;
  // Warp producer (the M-grouped kernel's v7d technique): all of warp 0 runs the TMA loop with the tile
  // fields broadcast from lane 0 and one elected lane issuing, so the TMA operands sit in uniform
  // registers instead of an ELECT / R2UR / BRA.U.ANY loop around each TMA of thread 0 alone. Forced
  // only (MXMOE_GEMM_PRODUCER=warp): 0.95-1.04x the thread producer (docs/design/gemm-sm90.md).
  static constexpr bool kWarpProducer = WarpProducer_;
  // CTAs per cluster, a block of kClusterM x kClusterN tiles of one group: CTAs on the same n-tile
  // share its B box, CTAs on the same m-tile its A box, each loading half of a shared box and
  // multicasting it to both. 2 = 2 x 1 (B shared), 4 = 2 x 2 (both shared: 16 KB loaded a k-block
  // instead of 24 or 32; the kernel is bound by those L2 -> SM bytes, docs/design/gemm-sm90.md).
  static constexpr int kCluster = Cluster_;
  static_assert(kCluster == 1 || kCluster == 2 || kCluster == 4, "cluster of 1, 2 or 4 CTAs");
  static constexpr int kClusterM = kCluster >= 2 ? 2 : 1;
  static constexpr int kClusterN = kCluster / kClusterM;
  static constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 128;  // out rows (N), out cols (K), tokens
  static constexpr int kStages = Stages_;
  static constexpr int kThreads = 384;  // producer warpgroup (TMA thread + 3 helper warps) + two math warpgroups
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // A k-block's fp32 scales: A's 128 rows, then B's 128 columns in math-thread order (kColScale).
  static constexpr int kColGroup = GroupedKScales::kColGroup;
  static constexpr int kScaleFloats = kBlockM + GroupedKScales::kColSlot;
  static constexpr uint32_t kScaleBytes = kScaleFloats * sizeof(float);  // a k-block's two bulk copies
  static constexpr int kAcc = kBlockN / 2;                // fp32 accumulators per math thread
  static constexpr int kBand = 8;                         // m-tiles per band of the tile order
  static constexpr int kBandBlocks = kBand / kClusterM;   // the band in cluster blocks
  static constexpr int kHelpers = 96;                     // warps 1-3 of the producer warpgroup
  static_assert(kStageBytes % 1024 == 0, "stages must keep the 1024-byte swizzle alignment");
  // Epilogue staging: each math warpgroup's 64 x 128 outputs as the boxes of a TMA store, 64 rows x
  // 128 bytes each, 128-byte swizzled (16-byte chunk c of row r at c ^ (r % 8)), which also keeps the
  // accumulator-layout writes free of bank conflicts (as the M-grouped kernel's).
  static constexpr int kRowBytes = kBlockN * static_cast<int>(sizeof(Out));
  static constexpr int kEpiBoxBytes = 128;
  static constexpr int kEpiBoxes = kRowBytes / kEpiBoxBytes;
  static constexpr int kEpiBoxCols = kEpiBoxBytes / static_cast<int>(sizeof(Out));
  static constexpr int kEpiWgBytes = 64 * kRowBytes;
  static constexpr int kEpiBytes = 2 * kEpiWgBytes;
  static_assert(kEpiBytes % 1024 == 0, "the epilogue buffer keeps the stages 1024-byte aligned");

  // Dynamic shared memory: 1024 alignment slack | stages | epilogue | scale slots | full / ready /
  // empty barriers | group tables (ends, first k-blocks, non-empty list).
  static constexpr size_t smem_bytes(int groups) {
    return 1024 + static_cast<size_t>(kStages) * kStageBytes + kEpiBytes +
           static_cast<size_t>(kStages) * kScaleFloats * sizeof(float) + 3 * kStages * sizeof(uint64_t) +
           3 * static_cast<size_t>(groups) * sizeof(int);
  }
};

// A tile's group: tokens [start, start + len), k-blocks of 128 from start. TMA reads boxes of 128
// tokens at 16-aligned coordinates a0 + 128 j, a0 = start - d, d = start % 16 (a TMA box may not start
// off a 16-byte boundary: an illegal instruction). Box kb is patched into block kb (patch_rows), which
// for d > 0 needs the first d tokens of box kb + 1: the last block may need one box more (boxes).
struct KTile {
  int g, start, len, kb0, row0, col0;  // kb0: the group's first k-block among the call's (prepared scales)
  int d, blocks, boxes;
  bool store;  // false: a ghost slot (its block sticks out of the group's tiles), a neighbour's tile re-run
};

// Tile slot t: the non-empty groups in order, each with the same ceil(N / 128) x ceil(K / 128) tiles
// in blocks of kClusterM x kClusterN (p.group_tiles slots a group: the blocks times kCluster), the
// blocks in bands of kBandBlocks block rows (kBand m-tiles) swept along K (as the M-grouped order).
// Slot kCluster b + r is tile (kClusterM bm + r % kClusterM, kClusterN bn + r / kClusterM) of block b,
// so the CTAs of a cluster always work on one group (the same k-blocks, in step), rank r and r ^ 1 on
// one n-tile, r and r ^ kClusterM on one m-tile. A tile past the group's edge is a ghost: it re-runs
// the edge tile (the shared boxes stay shared) without storing.
template <class K>
__device__ __forceinline__ KTile ktile(int t, const GroupedKParams& p, int mt, int nt, const int* s_end,
                                       const int* s_kb, const int* s_ne) {
  static_assert(K::kBandBlocks <= 8, "div_small divides by at most 8");
  const int q = static_cast<int>(fast_div(static_cast<uint32_t>(t), p.group_div));
  const int local = t - q * p.group_tiles;
  const int blk = local / K::kCluster, r = local % K::kCluster;  // r: the CTA's rank
  const int mb = (mt + K::kClusterM - 1) / K::kClusterM, nb = (nt + K::kClusterN - 1) / K::kClusterN;
  const int band = static_cast<int>(fast_div(static_cast<uint32_t>(blk), p.band_div));
  const int rem = blk - band * K::kBandBlocks * nb;
  const int band_rows = min(K::kBandBlocks, mb - band * K::kBandBlocks);
  const int bn = static_cast<int>(div_small(static_cast<uint32_t>(rem), static_cast<uint32_t>(band_rows)));
  const int bm = band * K::kBandBlocks + (rem - bn * band_rows);
  const int m_idx = K::kClusterM * bm + r % K::kClusterM, n_idx = K::kClusterN * bn + r / K::kClusterM;
  KTile c;
  c.g = s_ne[q];
  c.start = c.g ? s_end[c.g - 1] : 0;
  c.len = s_end[c.g] - c.start;
  c.kb0 = s_kb[c.g];
  c.row0 = min(m_idx, mt - 1) * K::kBlockM;
  c.col0 = min(n_idx, nt - 1) * K::kBlockN;
  c.d = c.start & 15;
  c.blocks = (c.len + K::kBlockK - 1) / K::kBlockK;
  c.boxes = c.blocks + (c.len - (c.blocks - 1) * K::kBlockK > K::kBlockK - c.d ? 1 : 0);
  c.store = m_idx < mt && n_idx < nt;
  return c;
}

// Bytes [lo, hi) of 32-bit word w of a 16-byte chunk, as a mask.
__device__ __forceinline__ uint32_t byte_range_mask(int w, int lo, int hi) {
  const int a = max(lo - 4 * w, 0), b = min(hi - 4 * w, 4);
  if (b <= a) return 0u;
  const uint32_t below_b = b >= 4 ? 0xFFFFFFFFu : ((1u << (8 * b)) - 1u);
  const uint32_t below_a = (1u << (8 * a)) - 1u;  // a <= 3
  return below_b & ~below_a;
}

// Turns box kb (tokens a0 + 128 kb + q in slot q) of K-major 128-byte rows, written by TMA with 128-byte
// swizzle (16-byte chunk c of row r sits at chunk c ^ (r % 8)), into block kb's tokens: slots [d, 128)
// keep their token while it is inside the block (q < hi = d + keep, keep = tokens of the block left),
// slots [0, d) (the previous block's tokens) take the first tokens of box kb + 1 (`next`), the block's
// last d, while inside the block (q < take); every other slot is zero. The slot order of a block does
// not matter to its sum, only that A and B agree, and both are patched alike. Rows r = first + stride q
// of the 2 x 128 rows (A's, then B's). A full block (hi = 128) changes only chunk 0 of each row (when
// d > 0): its loads are issued together, then merged and stored (the per-chunk loop of v1 bounded the
// unaligned groups: the math waited on the helpers 45% of its samples, ncu); the other
// chunks change only in a tile's last block.
template <int kRowsPerThread>
__device__ __forceinline__ void patch_rows(uint8_t* a_cur, const uint8_t* a_next, uint8_t* b_cur,
                                           const uint8_t* b_next, int d, int keep, int first, int stride) {
  const int hi = min(d + keep, 128);
  const int take = min(max(keep - 128 + d, 0), d);
  int off[kRowsPerThread];
  uint4 v[kRowsPerThread], nv[kRowsPerThread];
  if (d > 0) {
#pragma unroll
    for (int q = 0; q < kRowsPerThread; ++q) {
      const int r = first + stride * q;
      off[q] = (r & 127) * 128 + ((r & 7) << 4);  // chunk 0 of row r
      if (r < 256) {
        v[q] = *reinterpret_cast<const uint4*>((r < 128 ? a_cur : b_cur) + off[q]);
        nv[q] = take > 0 ? *reinterpret_cast<const uint4*>((r < 128 ? a_next : b_next) + off[q])
                         : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int q = 0; q < kRowsPerThread; ++q) {
      const int r = first + stride * q;
      if (r >= 256) continue;
      uint4 o;
      o.x = (v[q].x & byte_range_mask(0, d, hi)) | (nv[q].x & byte_range_mask(0, 0, take));
      o.y = (v[q].y & byte_range_mask(1, d, hi)) | (nv[q].y & byte_range_mask(1, 0, take));
      o.z = (v[q].z & byte_range_mask(2, d, hi)) | (nv[q].z & byte_range_mask(2, 0, take));
      o.w = (v[q].w & byte_range_mask(3, d, hi)) | (nv[q].w & byte_range_mask(3, 0, take));
      *reinterpret_cast<uint4*>((r < 128 ? a_cur : b_cur) + off[q]) = o;
    }
  }
  if (hi == 128) return;
  // A tile's last block: chunks [hi / 16, 8) hold tokens past the group (chunk 0 was done above when d > 0).
#pragma unroll 1
  for (int q = 0; q < kRowsPerThread; ++q) {
    const int r = first + stride * q;
    if (r >= 256) break;
    uint8_t* cur = (r < 128 ? a_cur : b_cur);
#pragma unroll 1
    for (int ch = max(hi >> 4, d > 0 ? 1 : 0); ch < 8; ++ch) {
      const int lo = 16 * ch;
      uint4* p = reinterpret_cast<uint4*>(cur + (r & 127) * 128 + ((ch ^ (r & 7)) << 4));
      const uint4 x = *p;
      const int own_lo = max(d - lo, 0), own_hi = hi - lo;
      uint4 o;
      o.x = x.x & byte_range_mask(0, own_lo, own_hi);
      o.y = x.y & byte_range_mask(1, own_lo, own_hi);
      o.z = x.z & byte_range_mask(2, own_lo, own_hi);
      o.w = x.w & byte_range_mask(3, own_lo, own_hi);
      *p = o;
    }
  }
}

// Zeroes 16-byte chunks [c0, 8) (tokens 16 c0 on) of the 2 x 128 rows (A's, then B's) of a stage's
// boxes, 128-byte swizzled as patch_rows reads them: threads first, first + stride, ... of the
// (row, chunk) pairs. No loads: the block's tokens end at a 16-token boundary.
__device__ __forceinline__ void zero_chunks_from(uint8_t* a, uint8_t* b, int c0, int first, int stride) {
  const int n = 8 - c0;
#pragma unroll 1
  for (int q = first; q < 256 * n; q += stride) {
    const int r = q / n, ch = c0 + (q - r * n);
    *reinterpret_cast<uint4*>((r < 128 ? a : b) + (r & 127) * 128 + ((ch ^ (r & 7)) << 4)) = make_uint4(0, 0, 0, 0);
  }
}

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1)
    grouped_k_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                     const __grid_constant__ CUtensorMap tma_out, const GroupedKParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Op = typename WgmmaOp<K::kBlockN>::Op;
  using Out = typename K::Out;
  constexpr int kHelpers = K::kHelpers;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((0u - smem_u32(smem_raw)) & 1023u);  // see the M-grouped kernel
  uint8_t* smem_a = smem;
  uint8_t* smem_b = smem + K::kStages * K::kABytes;
  uint8_t* smem_epi = smem + K::kStages * K::kStageBytes;
  float* smem_sf = reinterpret_cast<float*>(smem_epi + K::kEpiBytes);  // [stage][128 A rows | 128 B cols]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_sf + K::kStages * K::kScaleFloats);
  uint64_t* ready = full + K::kStages;
  uint64_t* empty = ready + K::kStages;
  int* s_end = reinterpret_cast<int*>(empty + K::kStages);  // [G] clamped group ends
  int* s_kb = s_end + p.groups;                             // [G] first k-block (128-blocks before g)
  int* s_ne = s_kb + p.groups;                              // [G] the non-empty groups, in order

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  // Cluster rank and tile slots: CTA r of cluster c takes slot kCluster * P + r for P = c, c + clusters, ...
  const int rank = K::kCluster > 1 ? static_cast<int>(cute::block_rank_in_cluster()) : 0;
  const int cluster = blockIdx.x / K::kCluster, clusters = gridDim.x / K::kCluster;
  if (tid == 0) {
    for (int s = 0; s < K::kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 1);    // the TMA thread's expect-tx
      cutlass::arch::ClusterBarrier::init(&ready[s], kHelpers);  // every helper thread (patch done or none needed)
      // lane 0 of each math warp of every CTA of the cluster: every stage is released to every
      // producer, so the rings stay in step
      cutlass::arch::ClusterBarrier::init(&empty[s], 8 * K::kCluster);
    }
    cutlass::arch::fence_barrier_init();
  }

  // Group tables: end_g = min(M, max(end_{g-1}, offs[g])), kb_g = sum_{h<g} ceil(len_h / 128) (as
  // grouped_k_prepare_scales counts them), and the non-empty groups compacted in order.
  __shared__ int s_nonempty;
  {
    using Scan = cub::BlockScan<int, K::kThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    int carry_end = 0, carry_kb = 0, carry_ne = 0;
    for (int base = 0; base < p.groups; base += K::kThreads) {
      const int g = base + tid;
      int start, len;
      group_rows_chunk<K::kThreads>(p.offs, p.offs_s, p.groups, p.m, g, scan_tmp, carry_end, start, len);
      int kb_before, kb_total;
      Scan(scan_tmp).ExclusiveSum((len + 127) / 128, kb_before, kb_total);
      __syncthreads();
      int ne_before, ne_total;
      Scan(scan_tmp).ExclusiveSum(len > 0 ? 1 : 0, ne_before, ne_total);
      __syncthreads();
      if (g < p.groups) {
        s_end[g] = start + len;
        s_kb[g] = carry_kb + kb_before;
        if (len > 0) s_ne[carry_ne + ne_before] = g;
      }
      carry_kb += kb_total;
      carry_ne += ne_total;
    }
    if (tid == 0) s_nonempty = carry_ne;
  }
  // Barriers initialized and tables written in every CTA of the cluster before any CTA multicasts
  // into a peer or arrives on its barriers.
  if constexpr (K::kCluster > 1) {
    cute::cluster_sync();
  } else {
    __syncthreads();
  }

  const int mt = (p.n + K::kBlockM - 1) / K::kBlockM;
  const int nt = (p.k + K::kBlockN - 1) / K::kBlockN;
  const int total = s_nonempty * p.group_tiles;  // tile slots, a multiple of kCluster
  // Releases stage s to the producer of every CTA of the cluster (each multicasts into this one or
  // waits in step with those that do).
  auto release = [&](int s) {
    if constexpr (K::kCluster == 1) {
      cutlass::arch::ClusterBarrier::arrive(&empty[s]);
    } else {
#pragma unroll
      for (int r = 0; r < K::kCluster; ++r) cutlass::arch::ClusterBarrier::arrive(&empty[s], static_cast<uint32_t>(r), 1u);
    }
  };

  if (wg == 0) {
    // 56 registers for the producer and helper threads (tile decode, the patch's loads) and 224 for the
    // math (two accumulator sets and the promoted sum): 56 + 2 x 224 <= 3 x 168, the launch's share
    // (setmaxnreg moves registers within it).
    cutlass::arch::warpgroup_reg_dealloc<56>();
    const int warp = tid / 32;
    if (K::kWarpProducer ? warp == 0 : tid == 0) {
      // Thread 0, or all of warp 0 with the tile fields taken from lane 0 (known warp-uniform to the
      // compiler) and one elected lane issuing: every tile's k-blocks through the stage ring.
      constexpr int kHalfA = K::kABytes / 2, kHalfB = K::kBBytes / 2;  // boxes are loaded as halves of 64 rows
      const int dm = rank % K::kClusterM, dn = rank / K::kClusterM;   // this CTA's place in the block
      // The CTAs that take this CTA's half of a shared box: the one on the same n-tile (B), on the same m-tile (A).
      const uint16_t mask_b = static_cast<uint16_t>((1u << rank) | (1u << (rank ^ 1)));
      const uint16_t mask_a = static_cast<uint16_t>((1u << rank) | (1u << (rank ^ K::kClusterM)));
      // k-block j's prepared scales (this CTA's rows and columns) into stage s's slot.
      const int na = (p.n + 127) / 128 * 128, kc = (p.k + 127) / 128;
      auto load_scales = [&](int s, int j, int row0, int col0) {
        float* sf = smem_sf + s * K::kScaleFloats;
        bulk_load(sf, p.sf_a + static_cast<int64_t>(j) * na + row0, K::kBlockM * sizeof(float), &full[s]);
        bulk_load(sf + K::kBlockM, p.sf_b + (static_cast<int64_t>(j) * kc + col0 / K::kBlockN) * GroupedKScales::kColSlot,
                  GroupedKScales::kColSlot * sizeof(float), &full[s]);
      };
      auto uniform = [](int v) { return K::kWarpProducer ? __shfl_sync(0xffffffffu, v, 0) : v; };
      const bool leader = K::kWarpProducer ? cute::elect_one_sync() : true;
      uint32_t it = 0;
      for (int P = cluster; K::kCluster * P < total; P += clusters) {
        const KTile c = ktile<K>(K::kCluster * P + rank, p, mt, nt, s_end, s_kb, s_ne);
        const int a0 = uniform(c.start - c.d), row0 = uniform(c.row0), col0 = uniform(c.col0);
        const int boxes = uniform(c.boxes), blocks = uniform(c.blocks), kb0 = uniform(c.kb0);
        for (int j = 0; j < boxes; ++j, ++it) {
          const int s = it % K::kStages;
          const uint32_t ph = (it / K::kStages) & 1;
          cutlass::arch::ClusterBarrier::wait(&empty[s], ph ^ 1);
          if (leader) {
            const bool scales = j < blocks;  // a tile's extra box has no k-block of its own
            cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(
                &full[s], K::kStageBytes + (scales ? K::kScaleBytes : 0u));
            if (scales) load_scales(s, kb0 + j, row0, col0);
            const int t0 = a0 + j * K::kBlockK;
            uint8_t* a = smem_a + s * K::kABytes;
            uint8_t* b = smem_b + s * K::kBBytes;
            if constexpr (K::kClusterN > 1) {
              tma_load_2d_multicast(&tma_a, &full[s], a + dn * kHalfA, t0, row0 + dn * (K::kBlockM / 2), mask_a);
            } else {
              tma_load_2d(&tma_a, &full[s], a, t0, row0);
              tma_load_2d(&tma_a, &full[s], a + kHalfA, t0, row0 + K::kBlockM / 2);
            }
            if constexpr (K::kClusterM > 1) {
              tma_load_2d_multicast(&tma_b, &full[s], b + dm * kHalfB, t0, col0 + dm * (K::kBlockN / 2), mask_b);
            } else {
              tma_load_2d(&tma_b, &full[s], b, t0, col0);
              tma_load_2d(&tma_b, &full[s], b + kHalfB, t0, col0 + K::kBlockN / 2);
            }
          }
          if constexpr (K::kWarpProducer) __syncwarp();
        }
      }
    } else if (warp >= 1) {
      // Helper threads (warps 1-3, 96 threads, all on every k-block): once the math has released the
      // stage's previous use (which also keeps the parity waits on full[s] and ready[s] within one
      // phase), a k-block whose box holds tokens outside it (the group starts off a 16-token boundary:
      // every block; or ends inside the block: its last) is patched into the block's tokens when the
      // box (and, for an unaligned group, the next box) has landed; then the stage is ready for the
      // math. Other k-blocks are ready at once, so the helpers run up to kStages k-blocks ahead. A
      // tile's extra box (used only for its first tokens) is released here, once every helper is done
      // reading it.
      const int ht = tid - 32;
      static_assert(K::kBlockM == 128 && K::kBlockN == 128, "patch_rows: 2 x 128 rows");
      constexpr int kPer = (K::kBlockM + K::kBlockN + kHelpers - 1) / kHelpers;
      uint32_t it = 0;
      for (int P = cluster; K::kCluster * P < total; P += clusters) {
        const KTile c = ktile<K>(K::kCluster * P + rank, p, mt, nt, s_end, s_kb, s_ne);
        for (int kb = 0; kb < c.blocks; ++kb) {
          const uint32_t i = it + kb;
          const int s = i % K::kStages;
          const uint32_t ph = (i / K::kStages) & 1;
          cutlass::arch::ClusterBarrier::wait(&empty[s], ph ^ 1);
          const int keep = c.len - kb * K::kBlockK;
          if (c.d > 0 || keep < K::kBlockK) {
            cutlass::arch::ClusterBarrier::wait(&full[s], ph);
            const int sn = (i + 1) % K::kStages;
            if (keep > K::kBlockK - c.d) cutlass::arch::ClusterBarrier::wait(&full[sn], ((i + 1) / K::kStages) & 1);
            if (c.d == 0 && keep % 16 == 0)  // an aligned group's last block (the MoE layer's): zero chunks
              zero_chunks_from(smem_a + s * K::kABytes, smem_b + s * K::kBBytes, keep / 16, ht, kHelpers);
            else
              patch_rows<kPer>(smem_a + s * K::kABytes, smem_a + sn * K::kABytes, smem_b + s * K::kBBytes,
                               smem_b + sn * K::kBBytes, c.d, keep, ht, kHelpers);
            cutlass::arch::fence_view_async_shared();  // the wgmmas read through the async proxy
          }
          cutlass::arch::ClusterBarrier::arrive(&ready[s]);
        }
        if (c.boxes > c.blocks) {  // landed (waited above); keep every barrier of the stage in phase
          const int s = (it + c.blocks) % K::kStages;
          cutlass::arch::ClusterBarrier::arrive(&ready[s]);
          asm volatile("bar.sync 3, %0;" ::"r"(kHelpers) : "memory");
          if (ht < 8) release(s);  // as the 8 math warps would
        }
        it += c.boxes;
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<224>();
    const int mw = wg - 1;
    const int lt = tid - 128 * wg, warp = lt / 32, lane = lt % 32;
    const int r0 = mw * 64 + warp * 16 + lane / 4;  // this thread's tile rows: r0, r0 + 8
    const int c0 = 2 * (lane % 4);                  // and columns 8 j + c0, 8 j + c0 + 1
    float acc0[K::kAcc], acc1[K::kAcc], fin[K::kAcc];
    // k-block i's 4 wgmmas into acc, once its stage has landed (with the scales) and is ready (patched).
    auto issue = [&](float (&acc)[K::kAcc], uint32_t i) {
      const int s = i % K::kStages;
      const uint32_t ph = (i / K::kStages) & 1;
      cutlass::arch::ClusterBarrier::wait(&full[s], ph);
      cutlass::arch::ClusterBarrier::wait(&ready[s], ph);
#pragma unroll
      for (int q = 0; q < K::kAcc; ++q) cute::warpgroup_fence_operand(acc[q]);
      cute::warpgroup_arrive();
      const uint8_t* ta = smem_a + s * K::kABytes + mw * 64 * K::kBlockK;
      const uint8_t* tb = smem_b + s * K::kBBytes;
#pragma unroll
      for (int j = 0; j < K::kBlockK / 32; ++j)
        wgmma<Op>(kmajor_sw128_desc(ta + 32 * j), kmajor_sw128_desc(tb + 32 * j), acc, j > 0,
                  std::make_index_sequence<K::kAcc>{});
      cute::warpgroup_commit_batch();
#pragma unroll
      for (int q = 0; q < K::kAcc; ++q) cute::warpgroup_fence_operand(acc[q]);
    };
    // k-block i's partial (its wgmmas done) into fin with the outer product of its row and column
    // scales, read from the stage's slot as used; then the stage is released.
    auto promote = [&](float (&acc)[K::kAcc], uint32_t i) {
      const int s = i % K::kStages;
#pragma unroll
      for (int q = 0; q < K::kAcc; ++q) cute::warpgroup_fence_operand(acc[q]);
      const float* sf = smem_sf + s * K::kScaleFloats;
      const float sa0 = sf[r0], sa1 = sf[r0 + 8];
      const float* sb = sf + K::kBlockM + K::kColGroup * (lane % 4);  // columns 8 j + c0 + e at sb[2 j + e]
#pragma unroll
      for (int q = 0; q < K::kAcc / 8; ++q) {
        const float4 b4 = *reinterpret_cast<const float4*>(sb + 4 * q);  // columns of j = 2 q, 2 q + 1
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int j = 2 * q + h;
          const float bx = h ? b4.z : b4.x, by = h ? b4.w : b4.y;
          fin[4 * j + 0] = fmaf(acc[4 * j + 0], sa0 * bx, fin[4 * j + 0]);
          fin[4 * j + 1] = fmaf(acc[4 * j + 1], sa0 * by, fin[4 * j + 1]);
          fin[4 * j + 2] = fmaf(acc[4 * j + 2], sa1 * bx, fin[4 * j + 2]);
          fin[4 * j + 3] = fmaf(acc[4 * j + 3], sa1 * by, fin[4 * j + 3]);
        }
      }
      __syncwarp();
      if (lane == 0) release(s);  // tiles and scale slot read
    };
    uint32_t it = 0;
    for (int P = cluster; K::kCluster * P < total; P += clusters) {
      const KTile c = ktile<K>(K::kCluster * P + rank, p, mt, nt, s_end, s_kb, s_ne);
      const int kblocks = c.blocks;
#pragma unroll
      for (int i = 0; i < K::kAcc; ++i) fin[i] = 0.f;
      // Two accumulator sets: k-block kb + 1's wgmmas are issued before kb is promoted, so each math
      // warpgroup keeps the tensor cores fed while it promotes (with one set, issue, wait and
      // promotion ran in series and both warpgroups promoted at once).
      // The loop body is straight-line (ptxas serializes the wgmmas where it cannot tell which set a
      // read touches); the last one or two k-blocks are peeled.
      issue(acc0, it);
      int kb = 0;
#pragma unroll 1
      for (; kb + 2 < kblocks; kb += 2) {
        issue(acc1, it + kb + 1);
        cute::warpgroup_wait<1>();
        promote(acc0, it + kb);
        issue(acc0, it + kb + 2);
        cute::warpgroup_wait<1>();
        promote(acc1, it + kb + 1);
      }
      if (kb + 1 < kblocks) {
        issue(acc1, it + kb + 1);
        cute::warpgroup_wait<1>();
        promote(acc0, it + kb);
        cute::warpgroup_wait<0>();
        promote(acc1, it + kb + 1);
      } else {
        cute::warpgroup_wait<0>();
        promote(acc0, it + kb);
      }
      it += c.boxes;  // the extra box, if any, was released by the helper
      if (!c.store) continue;  // a ghost slot: its k-blocks ran only to keep the cluster in step
      // Epilogue, staged in this warpgroup's swizzled boxes, then stored: by TMA when the warpgroup's
      // 64 rows are all < N (the output as (G N, K) rows; columns past K are clipped by the tensor
      // map; one thread issues the boxes and the warpgroup goes on to the next tile while the copy
      // engine writes them: read back and stored by the threads, the epilogue took 16% of the math
      // warps' time on Qwen3-30B-A3B's down projection), else read back as rows of 16-byte chunks and
      // stored masked by N and K (rows of the next group must not be written; K % 8 == 0, so a
      // 16-byte chunk is all in or all out).
      uint8_t* epi = smem_epi + mw * K::kEpiWgBytes;
      if (lt == 0) bulk_wait_group_read0();  // the previous tile's boxes have been read out
      asm volatile("bar.sync %0, 128;" ::"r"(1 + mw) : "memory");  // (by TMA or by the threads)
      {
        constexpr int kS = static_cast<int>(sizeof(Out));
        const int lr = warp * 16 + lane / 4;  // row in this warpgroup's 64; row lr + 8 has the same swizzle
        const int b0 = c0 * kS;               // byte of the pair in column 8 j's 8 columns
        const int t = lr * K::kEpiBoxBytes + 16 * ((b0 / 16) ^ (lr & 7)) + b0 % 16;
#pragma unroll
        for (int j = 0; j < K::kAcc / 4; ++j) {
          const int chunk = j * 8 * kS / 16;  // column 8 j's 16-byte chunk in the row
          uint8_t* box = epi + chunk / 8 * 64 * K::kEpiBoxBytes;
          const int cx = 16 * (chunk % 8);
          store2(reinterpret_cast<Out*>(box + (t ^ cx)), fin[4 * j + 0], fin[4 * j + 1]);
          store2(reinterpret_cast<Out*>(box + ((t + 8 * K::kEpiBoxBytes) ^ cx)), fin[4 * j + 2], fin[4 * j + 3]);
        }
      }
      const int rows_here = p.n - c.row0 - mw * 64;
      const bool whole = rows_here >= 64;
      if (whole) fence_async_shared();  // the staged boxes, written by this thread, are read by TMA next
      asm volatile("bar.sync %0, 128;" ::"r"(1 + mw) : "memory");
      if (whole) {
        if (lt == 0) {
#pragma unroll
          for (int b = 0; b < K::kEpiBoxes; ++b)
            tma_store_2d(&tma_out, epi + b * 64 * K::kEpiBoxBytes, c.col0 + b * K::kEpiBoxCols,
                         c.g * p.n + c.row0 + mw * 64);
          bulk_commit_group();
        }
      } else if (rows_here > 0) {
        constexpr int kChunksPerRow = K::kRowBytes / 16;
        constexpr int kChunks = 64 * kChunksPerRow / 128;
        constexpr int kBatch = kChunks <= 8 ? kChunks : 8;
        static_assert(kChunks % kBatch == 0, "copy-out chunks per thread");
        const int cols_left = p.k - c.col0;
        Out* og = static_cast<Out*>(p.out) + static_cast<int64_t>(c.g) * p.n * p.k;
#pragma unroll
        for (int i0 = 0; i0 < kChunks; i0 += kBatch) {
          uint4 v[kBatch];
#pragma unroll
          for (int i = 0; i < kBatch; ++i) {
            const int q = lt + 128 * (i0 + i);
            const int lr = q / kChunksPerRow, ch = q - lr * kChunksPerRow;
            v[i] = *reinterpret_cast<const uint4*>(epi + ch / 8 * 64 * K::kEpiBoxBytes + lr * K::kEpiBoxBytes +
                                                   16 * ((ch % 8) ^ (lr & 7)));
          }
#pragma unroll
          for (int i = 0; i < kBatch; ++i) {
            const int q = lt + 128 * (i0 + i);
            const int lr = q / kChunksPerRow, ch = q - lr * kChunksPerRow;
            const int cl = ch * (16 / static_cast<int>(sizeof(Out)));
            if (lr < rows_here && cl < cols_left)
              *reinterpret_cast<uint4*>(og + static_cast<int64_t>(c.row0 + mw * 64 + lr) * p.k + c.col0 + cl) = v[i];
          }
        }
      }
    }
    if (lt == 0) bulk_wait_group0();  // the stores are done before the CTA's shared memory goes
    // Empty groups' outputs are zero (the math threads of every CTA, 16-byte stores).
    const int64_t per_group = static_cast<int64_t>(p.n) * p.k * static_cast<int64_t>(sizeof(Out)) / 16;
#pragma unroll 1
    for (int g = 0; g < p.groups; ++g) {
      if (s_end[g] != (g ? s_end[g - 1] : 0)) continue;
      uint4* o = reinterpret_cast<uint4*>(static_cast<Out*>(p.out) + static_cast<int64_t>(g) * p.n * p.k);
#pragma unroll 1
      for (int64_t i = blockIdx.x * 256 + (tid - 128); i < per_group; i += static_cast<int64_t>(gridDim.x) * 256)
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
