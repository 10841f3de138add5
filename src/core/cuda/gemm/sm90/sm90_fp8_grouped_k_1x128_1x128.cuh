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
// 128 x 128 output tile, one wgmma accumulator set and the promoted fp32 sum). What the
// reduction-grouped pass adds:
//   - one TMA map per operand over the whole (R, M) tensor, no group staged: a group's boxes of 128
//     tokens start at 16-aligned coordinates a0 + 128 j (a0 = start - start % 16; a box starting off
//     a 16-byte boundary is an illegal instruction), and warps 1-3 of the producer warpgroup (the
//     "helpers") patch box kb in shared memory into block kb's tokens once it and the next box have
//     landed (patch_rows: the first start % 16 slots take the next box's first tokens, tokens past the
//     group are zeroed; tokens past M are zero from TMA), fence them for the async proxy and release
//     the stage on a second barrier;
//   - the per-row (A) and per-column (B) scales of a k-block differ across the tile, so the helpers
//     also convert the k-block's 128 + 128 E8M0 bytes to fp32 into a per-stage scale slot; the math
//     threads read them there before issuing the k-block's wgmmas and release the stage after the wait;
//   - optional clusters of 2 CTAs on neighbouring m-tiles of one group and n-tile: each loads half of
//     the B box and multicasts it to both (24 KB per k-block per CTA instead of 32 KB; the large
//     shapes are bound by L2 -> SM bytes), every box released to both producers.
// Offsets are read on the device (no host sync): every CTA scans offs into shared tables (group
// ends, scale-column offsets, the list of non-empty groups); a slot's tile is decoded without
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
  const uint8_t* a_scale;   // (N, cap) E8M0, row stride as_s0
  int64_t as_s0;
  const uint8_t* b_scale;   // (K, cap) E8M0, row stride bs_s0
  int64_t bs_s0;
  void* out;                // (G, N, K) contiguous, bf16 or f32
  int group_tiles;          // tile slots per group: ceil(N / 128) ceil(K / 128), rounded up to the cluster size
  FastDiv group_div;        // division by group_tiles
  FastDiv band_div;         // division by the tiles of a full band, kBand ceil(K / 128)
};

template <int Stages_, class Out_, int Cluster_ = 1, bool WarpProducer_ = false>
struct GroupedK {
  using Out = Out_;
  // Warp producer (the M-grouped kernel's v7d technique): all of warp 0 runs the TMA loop with the tile
  // fields broadcast from lane 0 and one elected lane issuing, so the TMA operands sit in uniform
  // registers instead of an ELECT / R2UR / BRA.U.ANY loop around each TMA of thread 0 alone. Forced
  // only (MXMOE_GEMM_PRODUCER=warp): 0.95-1.04x the thread producer (docs/design/gemm-sm90.md).
  static constexpr bool kWarpProducer = WarpProducer_;
  // CTAs per cluster: 2 = pairs of CTAs on neighbouring m-tiles (A rows) of one group and the same
  // n-tile share the B box, each loading half of it and multicasting it to both.
  static constexpr int kCluster = Cluster_;
  static_assert(kCluster == 1 || kCluster == 2, "cluster of 1 or 2 CTAs");
  static constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 128;  // out rows (N), out cols (K), tokens
  static constexpr int kStages = Stages_;
  static constexpr int kThreads = 384;  // producer warpgroup (TMA thread + 3 helper warps) + two math warpgroups
  static constexpr int kABytes = kBlockM * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // A k-block's fp32 scales: A's 128 rows, then B's 128 columns in math-thread order (kColScale).
  static constexpr int kColGroup = 36;  // floats per lane%4 group of columns: 32 + 4 of bank padding
  static constexpr int kScaleFloats = kBlockM + 4 * kColGroup;
  static constexpr int kAcc = kBlockN / 2;                // fp32 accumulators per math thread
  static constexpr int kBand = 8;                         // m-tiles per band of the tile order
  static constexpr int kHelpers = 96;                     // warps 1-3 of the producer warpgroup
  static_assert(kStageBytes % 1024 == 0, "stages must keep the 1024-byte swizzle alignment");
  static constexpr int kEpiRowBytes = kBlockN * static_cast<int>(sizeof(Out)) + (sizeof(Out) == 2 ? 16 : 32);
  static constexpr int kEpiBytes = 2 * 64 * kEpiRowBytes;
  static_assert(kEpiBytes % 1024 == 0, "the epilogue buffer keeps the stages 1024-byte aligned");

  // Dynamic shared memory: 1024 alignment slack | stages | epilogue | scale slots | full / ready /
  // empty barriers | group tables (ends, scale columns, non-empty list).
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
  int g, start, len, blk, row0, col0;
  int d, blocks, boxes;
  bool store;  // false: a ghost slot (a group's tile count is odd at cluster 2), its peer's tile re-run
};

// Tile slot t: the non-empty groups in order, each with the same ceil(N / 128) x ceil(K / 128) tiles,
// inside a group bands of kBand m-tiles swept along K (as the M-grouped order). At cluster 2 each
// group has an even number of slots (p.group_tiles), so the two CTAs of a cluster always work on one
// group (the same k-blocks, in step) and, inside a band of even height, on the same n-tile; an odd
// group's last slot is a ghost that re-runs the tile before it without storing.
template <class K>
__device__ __forceinline__ KTile ktile(int t, const GroupedKParams& p, int mt, int nt, const int* s_end,
                                       const int* s_blk, const int* s_ne) {
  static_assert(K::kBand <= 8, "div_small divides by at most 8");
  const int q = static_cast<int>(fast_div(static_cast<uint32_t>(t), p.group_div));
  int local = t - q * p.group_tiles;
  const bool store = local < mt * nt;
  if (!store) local -= 1;
  const int band = static_cast<int>(fast_div(static_cast<uint32_t>(local), p.band_div));
  const int rem = local - band * K::kBand * nt;
  const int band_rows = min(K::kBand, mt - band * K::kBand);
  const int n_idx = static_cast<int>(div_small(static_cast<uint32_t>(rem), static_cast<uint32_t>(band_rows)));
  const int m_idx = band * K::kBand + (rem - n_idx * band_rows);
  KTile c;
  c.g = s_ne[q];
  c.start = c.g ? s_end[c.g - 1] : 0;
  c.len = s_end[c.g] - c.start;
  c.blk = s_blk[c.g];
  c.row0 = m_idx * K::kBlockM;
  c.col0 = n_idx * K::kBlockN;
  c.d = c.start & 15;
  c.blocks = (c.len + K::kBlockK - 1) / K::kBlockK;
  c.boxes = c.blocks + (c.len - (c.blocks - 1) * K::kBlockK > K::kBlockK - c.d ? 1 : 0);
  c.store = store;
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

// Where column c (0..127) of B's scales sits in a k-block's scale slot, after A's 128 rows: math thread
// lane holds columns 8 j + 2 (lane % 4) + e (j < 16, e < 2), so those 32 are made contiguous (eight
// 16-byte loads instead of sixteen 8-byte ones) and the four lane % 4 groups sit kColGroup floats
// apart, which puts them in different banks.
template <class K>
__device__ __forceinline__ int col_scale_slot(int c) {
  return K::kBlockM + K::kColGroup * ((c & 7) >> 1) + 2 * (c >> 3) + (c & 1);
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

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1)
    grouped_k_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                     const GroupedKParams p) {
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
  int* s_blk = s_end + p.groups;                            // [G] first scale column (32-runs before g)
  int* s_ne = s_blk + p.groups;                             // [G] the non-empty groups, in order

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  // Cluster rank and tile slots: CTA r of cluster c takes slot kCluster * P + r for P = c, c + clusters, ...
  const int rank = K::kCluster > 1 ? static_cast<int>(cute::block_rank_in_cluster()) : 0;
  const int peer = 1 - rank;
  const int cluster = blockIdx.x / K::kCluster, clusters = gridDim.x / K::kCluster;
  if (tid == 0) {
    for (int s = 0; s < K::kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 1);    // the TMA thread's expect-tx
      cutlass::arch::ClusterBarrier::init(&ready[s], kHelpers);  // every helper thread (scales, patch)
      // lane 0 of each math warp of every CTA of the cluster: every box is released to both
      // producers (shared or not), so the two rings stay in step
      cutlass::arch::ClusterBarrier::init(&empty[s], 8 * K::kCluster);
    }
    cutlass::arch::fence_barrier_init();
  }

  // Group tables: end_g = min(M, max(end_{g-1}, offs[g])), blk_g = sum_{h<g} ceil(len_h / 32), and
  // the non-empty groups compacted in order.
  __shared__ int s_nonempty;
  {
    using Scan = cub::BlockScan<int, K::kThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    int carry_end = 0, carry_blk = 0, carry_ne = 0;
    for (int base = 0; base < p.groups; base += K::kThreads) {
      const int g = base + tid;
      int e = 0;
      if (g < p.groups) {
        const int o = p.offs[g * p.offs_s];
        e = o < 0 ? 0 : (o > p.m ? p.m : o);
      }
      int prev, agg;
      Scan(scan_tmp).ExclusiveScan(e, prev, carry_end, MaxOp(), agg);
      __syncthreads();
      const int end = max(prev, e);
      const int len = g < p.groups ? end - prev : 0;
      int blk_before, blk_total;
      Scan(scan_tmp).ExclusiveSum((len + 31) / 32, blk_before, blk_total);
      __syncthreads();
      int ne_before, ne_total;
      Scan(scan_tmp).ExclusiveSum(len > 0 ? 1 : 0, ne_before, ne_total);
      __syncthreads();
      if (g < p.groups) {
        s_end[g] = end;
        s_blk[g] = carry_blk + blk_before;
        if (len > 0) s_ne[carry_ne + ne_before] = g;
      }
      carry_end = max(carry_end, agg);
      carry_blk += blk_total;
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
  // Releases stage s to this CTA's producer and, at cluster 2, to the peer's.
  auto release = [&](int s) {
    cutlass::arch::ClusterBarrier::arrive(&empty[s]);
    if constexpr (K::kCluster > 1) cutlass::arch::ClusterBarrier::arrive(&empty[s], static_cast<uint32_t>(peer), 1u);
  };

  if (wg == 0) {
    // 104 registers for the helper threads (tile decode, three k-blocks' scale bytes, the patch's batched
    // loads: 72 and 88 spilled) and 200 for the math (one accumulator set, the promoted sum, 32 column
    // scales): 104 + 2 x 200 <= 3 x 168, the launch's share (setmaxnreg moves registers within it).
    cutlass::arch::warpgroup_reg_dealloc<104>();
    const int warp = tid / 32;
    if (K::kWarpProducer ? warp == 0 : tid == 0) {
      constexpr int kHalfB = K::kBBytes / 2;  // the B box is loaded as two halves of 64 rows
      if constexpr (K::kWarpProducer) {
        // Warp 0: every tile's k-blocks through the stage ring, the tile fields taken from lane 0
        // (known warp-uniform to the compiler), one elected lane issuing.
        auto uniform = [](int v) { return __shfl_sync(0xffffffffu, v, 0); };
        const bool leader = cute::elect_one_sync();
        uint32_t it = 0;
        for (int P = cluster; K::kCluster * P < total; P += clusters) {
          const KTile c = ktile<K>(K::kCluster * P + rank, p, mt, nt, s_end, s_blk, s_ne);
          // Both CTAs of a cluster decode both slots, so they agree on every multicast.
          const bool shared = uniform(
              K::kCluster > 1 && ktile<K>(K::kCluster * P + peer, p, mt, nt, s_end, s_blk, s_ne).col0 == c.col0);
          const int a0 = uniform(c.start - c.d), row0 = uniform(c.row0), col0 = uniform(c.col0);
          const int boxes = uniform(c.boxes);
          for (int j = 0; j < boxes; ++j, ++it) {
            const int s = it % K::kStages;
            const uint32_t ph = (it / K::kStages) & 1;
            cutlass::arch::ClusterBarrier::wait(&empty[s], ph ^ 1);
            if (leader) {
              cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[s], K::kStageBytes);
              const int t0 = a0 + j * K::kBlockK;
              tma_load_2d(&tma_a, &full[s], smem_a + s * K::kABytes, t0, row0);
              uint8_t* b = smem_b + s * K::kBBytes;
              if (K::kCluster > 1 && shared) {
                tma_load_2d_multicast(&tma_b, &full[s], b + rank * kHalfB, t0, col0 + rank * (K::kBlockN / 2),
                                      static_cast<uint16_t>((1u << K::kCluster) - 1));
              } else {
                tma_load_2d(&tma_b, &full[s], b, t0, col0);
                tma_load_2d(&tma_b, &full[s], b + kHalfB, t0, col0 + K::kBlockN / 2);
              }
            }
            __syncwarp();
          }
        }
      } else {
        // TMA thread: every tile's k-blocks through the stage ring.
        uint32_t it = 0;
        for (int P = cluster; K::kCluster * P < total; P += clusters) {
          const KTile c = ktile<K>(K::kCluster * P + rank, p, mt, nt, s_end, s_blk, s_ne);
          // Both CTAs of a cluster decode both slots, so they agree on every multicast.
          const bool shared =
              K::kCluster > 1 && ktile<K>(K::kCluster * P + peer, p, mt, nt, s_end, s_blk, s_ne).col0 == c.col0;
          for (int j = 0; j < c.boxes; ++j, ++it) {
            const int s = it % K::kStages;
            const uint32_t ph = (it / K::kStages) & 1;
            cutlass::arch::ClusterBarrier::wait(&empty[s], ph ^ 1);
            cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[s], K::kStageBytes);
            const int t0 = c.start - c.d + j * K::kBlockK;
            tma_load_2d(&tma_a, &full[s], smem_a + s * K::kABytes, t0, c.row0);
            uint8_t* b = smem_b + s * K::kBBytes;
            if (K::kCluster > 1 && shared) {
              tma_load_2d_multicast(&tma_b, &full[s], b + rank * kHalfB, t0, c.col0 + rank * (K::kBlockN / 2),
                                    static_cast<uint16_t>((1u << K::kCluster) - 1));
            } else {
              tma_load_2d(&tma_b, &full[s], b, t0, c.col0);
              tma_load_2d(&tma_b, &full[s], b + kHalfB, t0, c.col0 + K::kBlockN / 2);
            }
          }
        }
      }
    } else if (warp >= 1) {
      // Helper threads (warps 1-3, 96 threads, all on every k-block): the k-block's scales into the
      // stage's slot; the box patched into the block's tokens once it (and, for an unaligned group,
      // the next box) has landed; then the stage is ready for the math. A tile's extra box (used only
      // for its first tokens) is released here. The scale bytes (256 rows, one row stride apart, 3
      // per thread) are loaded two k-blocks ahead: one warp loading 8 bytes each, one after another
      // (v1a) or one k-block ahead (v1b), bounded the kernel (~6.6k / ~2.1k cycles per k-block).
      const int ht = tid - 32;
      constexpr int kScaleRows = K::kBlockM + K::kBlockN;
      constexpr int kPer = (kScaleRows + kHelpers - 1) / kHelpers;
      static_assert(K::kBlockM == 128 && K::kBlockN == 128 && kScaleRows == 256, "patch_rows: 2 x 128 rows");
      auto load_scale_bytes = [&](const KTile& c, int kb, uint32_t(&e)[kPer]) {
        const int col = c.blk + 4 * kb;
#pragma unroll
        for (int q = 0; q < kPer; ++q) {
          const int r = ht + kHelpers * q;
          const bool is_a = r < K::kBlockM;
          const int row = is_a ? c.row0 + r : c.col0 + r - K::kBlockM;
          const uint8_t* base = is_a ? p.a_scale : p.b_scale;
          const int64_t stride = is_a ? p.as_s0 : p.bs_s0;
          e[q] = r < kScaleRows && row < (is_a ? p.n : p.k)
                     ? static_cast<uint32_t>(__ldg(base + static_cast<int64_t>(row) * stride + col))
                     : 0x100u;  // a row past N / K: scale 0
        }
      };
      uint32_t it = 0;
      for (int P = cluster; K::kCluster * P < total; P += clusters) {
        const KTile c = ktile<K>(K::kCluster * P + rank, p, mt, nt, s_end, s_blk, s_ne);
        uint32_t n1[kPer], n2[kPer];
        load_scale_bytes(c, 0, n1);
        if (c.blocks > 1) load_scale_bytes(c, 1, n2);
        for (int kb = 0; kb < c.blocks; ++kb) {
          const uint32_t i = it + kb;
          const int s = i % K::kStages;
          const uint32_t ph = (i / K::kStages) & 1;
          uint32_t e[kPer];
#pragma unroll
          for (int q = 0; q < kPer; ++q) {
            e[q] = n1[q];
            n1[q] = n2[q];
          }
          if (kb + 2 < c.blocks) load_scale_bytes(c, kb + 2, n2);
          cutlass::arch::ClusterBarrier::wait(&empty[s], ph ^ 1);
          float* sf = smem_sf + s * K::kScaleFloats;
#pragma unroll
          for (int q = 0; q < kPer; ++q) {
            const int r = ht + kHelpers * q;
            if (r < kScaleRows)  // A rows, then B columns in the math threads' order
              sf[r < K::kBlockM ? r : col_scale_slot<K>(r - K::kBlockM)] = e[q] == 0x100u ? 0.f : e8m0_f32(e[q]);
          }
          const int keep = c.len - kb * K::kBlockK;
          if (c.d > 0 || keep < K::kBlockK) {
            cutlass::arch::ClusterBarrier::wait(&full[s], ph);
            const int sn = (i + 1) % K::kStages;
            if (keep > K::kBlockK - c.d) cutlass::arch::ClusterBarrier::wait(&full[sn], ((i + 1) / K::kStages) & 1);
            patch_rows<kPer>(smem_a + s * K::kABytes, smem_a + sn * K::kABytes, smem_b + s * K::kBBytes,
                             smem_b + sn * K::kBBytes, c.d, keep, ht, kHelpers);
            cutlass::arch::fence_view_async_shared();  // the wgmmas read through the async proxy
          }
          cutlass::arch::ClusterBarrier::arrive(&ready[s]);
        }
        if (c.boxes > c.blocks) {  // landed (waited above); keep every barrier of the stage in phase
          const int s = (it + c.blocks) % K::kStages;
          cutlass::arch::ClusterBarrier::arrive(&ready[s]);
          if (ht < 8) release(s);  // as the 8 math warps would
        }
        it += c.boxes;
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<200>();
    const int mw = wg - 1;
    const int lt = tid - 128 * wg, warp = lt / 32, lane = lt % 32;
    const int r0 = mw * 64 + warp * 16 + lane / 4;  // this thread's tile rows: r0, r0 + 8
    const int c0 = 2 * (lane % 4);                  // and columns 8 j + c0, 8 j + c0 + 1
    float acc[K::kAcc], fin[K::kAcc];
    uint32_t it = 0;
    for (int P = cluster; K::kCluster * P < total; P += clusters) {
      const KTile c = ktile<K>(K::kCluster * P + rank, p, mt, nt, s_end, s_blk, s_ne);
      const int kblocks = c.blocks;
#pragma unroll
      for (int i = 0; i < K::kAcc; ++i) fin[i] = 0.f;
      // Per k-block: wait for the stage (TMA landed, scales and tail ready), read the k-block's row and
      // column scales from the stage's slot (before the wgmmas start reading the stage: issued after
      // them, at v1, the 17 loads queued behind the wgmmas' shared-memory reads and the promotion
      // waited on them), issue the 4 wgmmas, wait, promote with the scales' outer product, release the
      // stage. One accumulator set: the promotion overlapping the next k-block's wgmmas needs a second
      // 64-register set, which beside the column scales and the promoted sum does not fit (nor do the
      // 64 products formed ahead: 92-128 bytes spilled); the other math warpgroup's wgmmas fill the
      // tensor cores meanwhile.
#pragma unroll 1
      for (int kb = 0; kb < kblocks; ++kb) {
        const uint32_t i = it + kb;
        const int s = i % K::kStages;
        const uint32_t ph = (i / K::kStages) & 1;
        cutlass::arch::ClusterBarrier::wait(&full[s], ph);
        cutlass::arch::ClusterBarrier::wait(&ready[s], ph);
        const float* sf = smem_sf + s * K::kScaleFloats;
        const float sa0 = sf[r0], sa1 = sf[r0 + 8];
        float4 sb[K::kAcc / 8];  // columns 8 j + c0 + e at sb[j / 2], component 2 (j % 2) + e
#pragma unroll
        for (int q = 0; q < K::kAcc / 8; ++q)
          sb[q] = *reinterpret_cast<const float4*>(sf + K::kBlockM + K::kColGroup * (lane % 4) + 4 * q);
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
        cute::warpgroup_wait<0>();
#pragma unroll
        for (int q = 0; q < K::kAcc; ++q) cute::warpgroup_fence_operand(acc[q]);
        __syncwarp();
        if (lane == 0) release(s);  // tiles and scale slot read
#pragma unroll
        for (int j = 0; j < K::kAcc / 4; ++j) {
          const float bx = (j & 1) ? sb[j / 2].z : sb[j / 2].x, by = (j & 1) ? sb[j / 2].w : sb[j / 2].y;
          fin[4 * j + 0] = fmaf(acc[4 * j + 0], sa0 * bx, fin[4 * j + 0]);
          fin[4 * j + 1] = fmaf(acc[4 * j + 1], sa0 * by, fin[4 * j + 1]);
          fin[4 * j + 2] = fmaf(acc[4 * j + 2], sa1 * bx, fin[4 * j + 2]);
          fin[4 * j + 3] = fmaf(acc[4 * j + 3], sa1 * by, fin[4 * j + 3]);
        }
      }
      it += c.boxes;  // the extra box, if any, was released by the helper
      if (!c.store) continue;  // a ghost slot: its k-blocks ran only to keep the cluster in step
      // Epilogue, staged through shared memory as in the M-grouped kernel: rows past N and columns
      // past K are masked (K % 8 == 0, so a 16-byte chunk is all in or all out).
      uint8_t* epi = smem_epi + mw * 64 * K::kEpiRowBytes;
      asm volatile("bar.sync %0, 128;" ::"r"(1 + mw) : "memory");  // the previous tile's read-out is done
#pragma unroll
      for (int j = 0; j < K::kAcc / 4; ++j) {
        const int cl = 8 * j + c0;
        const int lr = warp * 16 + lane / 4;
        store2(reinterpret_cast<Out*>(epi + lr * K::kEpiRowBytes) + cl, fin[4 * j + 0], fin[4 * j + 1]);
        store2(reinterpret_cast<Out*>(epi + (lr + 8) * K::kEpiRowBytes) + cl, fin[4 * j + 2], fin[4 * j + 3]);
      }
      asm volatile("bar.sync %0, 128;" ::"r"(1 + mw) : "memory");
      {
        constexpr int kChunksPerRow = K::kBlockN * static_cast<int>(sizeof(Out)) / 16;
        constexpr int kChunks = 64 * kChunksPerRow / 128;
        constexpr int kBatch = kChunks <= 8 ? kChunks : 8;
        static_assert(kChunks % kBatch == 0, "copy-out chunks per thread");
        const int rows_here = p.n - c.row0 - mw * 64;
        const int cols_left = p.k - c.col0;
        Out* og = static_cast<Out*>(p.out) + static_cast<int64_t>(c.g) * p.n * p.k;
#pragma unroll
        for (int i0 = 0; i0 < kChunks; i0 += kBatch) {
          uint4 v[kBatch];
#pragma unroll
          for (int i = 0; i < kBatch; ++i) {
            const int q = lt + 128 * (i0 + i);
            const int lr = q / kChunksPerRow, ch = q - lr * kChunksPerRow;
            v[i] = *reinterpret_cast<const uint4*>(epi + lr * K::kEpiRowBytes + 16 * ch);
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
