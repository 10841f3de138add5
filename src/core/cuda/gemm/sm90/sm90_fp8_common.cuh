// Device building blocks shared by the sm_90a FP8 GEMM kernels of this folder: tile-decode
// divisions, TMA loads, wgmma descriptors and calls, E8M0 decode, paired output stores.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include <cub/block/block_scan.cuh>

#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
// The N = 160 wgmma shapes (BlockN 160) are in CuTe's extended set, which mma_sm90_gmma.hpp includes
// only under CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED; included directly, for this folder's kernels alone.
#include "cute/arch/mma_sm90_gmma_ext.hpp"
#include "cuda/common/fast_div.cuh"

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace sm90 {

// Tile decode divisions: cuda/common/fast_div.cuh (FastDiv, make_fast_div, fast_div).
using cuda::FastDiv;
using cuda::fast_div;
using cuda::make_fast_div;

// x / d for d in [1, 8] and x < 2^28 without a division: umulhi(2x, ceil(2^31 / d)). With
// ceil(2^31 / d) d = 2^31 + e, e < d, the error x e / (d 2^31) stays below 1 / d as x e < 2^31.
__device__ __forceinline__ uint32_t div_small(uint32_t x, uint32_t d) {
  uint32_t m = 0x80000000u;  // d = 1
#pragma unroll
  for (uint32_t k = 2; k <= 8; ++k) m = d == k ? (0x80000000u + k - 1) / k : m;
  return __umulhi(x << 1, m);
}

template <int BlockN>
struct WgmmaOp;
template <>
struct WgmmaOp<128> {
  using Op = cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>;
};
template <>
struct WgmmaOp<160> {
  using Op = cute::SM90::GMMA::MMA_64x160x32_F32E4M3E4M3_SS_TN<>;
};
template <>
struct WgmmaOp<192> {
  using Op = cute::SM90::GMMA::MMA_64x192x32_F32E4M3E4M3_SS_TN<>;
};

// The bf16 gather variant's wgmma (BlockN 128, k16 steps of 32 bytes): A K-major, B K-major or MN-major.
template <bool BMajorMN>
struct WgmmaOpBf16 {
  using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<
      cute::SM90::GMMA::Major::K, BMajorMN ? cute::SM90::GMMA::Major::MN : cute::SM90::GMMA::Major::K>;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// wgmma shared-memory descriptor of a K-major tile written by TMA with 128-byte swizzle: rows of
// 128 bytes, 8-row core groups 1024 bytes apart (SBO), swizzle mode 1 (128B) in bits 62-63. The
// k32 steps inside the 128-byte row advance the start address by 32 bytes (the swizzle is applied
// to the final address, so this matches TMA's layout as long as stages are 1024-byte aligned).
__device__ __forceinline__ uint64_t kmajor_sw128_desc(const void* p) {
  const uint32_t a = smem_u32(p);
  uint64_t d = static_cast<uint64_t>((a & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1024 >> 4) << 32;
  d |= 1ull << 62;
  return d;
}

// wgmma shared-memory descriptor of an MN-major 16-bit tile written by TMA with 128-byte swizzle as
// boxes of 64 MN elements (128 bytes) x K rows: row k of a box is K index k, 8-row core groups 1024
// bytes apart (SBO), the next 64 MN elements `lbo` bytes on (LBO: the next box). A k16 step advances
// the start address by 16 rows (2048 bytes).
__device__ __forceinline__ uint64_t mnmajor_sw128_desc(const void* p, uint32_t lbo) {
  uint64_t d = kmajor_sw128_desc(p);
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16;
  return d;
}

__device__ __forceinline__ void tma_load_2d(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      :
      : "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}

// The same box into the same shared-memory offset of every CTA in `mask` (the cluster), each
// CTA's barrier at that offset counting the bytes.
__device__ __forceinline__ void tma_load_2d_multicast(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;"
      :
      : "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(mask)
      : "memory");
}

// A contiguous global range of `bytes` (a multiple of 16, both addresses 16-byte aligned) into this
// CTA's shared memory, counted on bar like a TMA box.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :
               : "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// TMA store of a staged shared-memory box to the tensor at (c0, c1), in this thread's bulk group;
// elements outside the tensor are not written.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
               :
               : "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(src))
               : "memory");
}
// Prefetch of `bytes` (a multiple of 16, 16-byte aligned) from global memory into L2.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// This thread's bulk stores have read their shared-memory sources (the buffer may be rewritten).
__device__ __forceinline__ void bulk_wait_group_read0() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// This thread's bulk stores are complete.
__device__ __forceinline__ void bulk_wait_group0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Shared memory written by ordinary stores, read next by the async proxy (TMA store, wgmma).
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

template <class Op, int N, size_t... I>
__device__ __forceinline__ void wgmma(uint64_t da, uint64_t db, float (&d)[N], bool accumulate,
                                      std::index_sequence<I...>) {
  Op::fma(da, db, d[I]..., accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

// e8m0_to_f32 without branches (selects): 2^(e-127), e = 0 the subnormal 2^-127, e = 255 NaN.
__device__ __forceinline__ float e8m0_f32(uint32_t e) {
  uint32_t b = e << 23;
  b = e == 0 ? 0x00400000u : b;
  b = e == 255 ? 0x7FC00000u : b;
  return __uint_as_float(b);
}

struct MaxOp {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

// Chunk [base, base + NT) of the groups' rows, by the rule of groups_from_offsets: end_g = min(M,
// max(end_{g-1}, offs[g])), offs[g] < 0 read as 0. Thread tid holds group g = base + tid (len 0 past
// the last group); carry_end holds the end before the chunk and is moved past it. The scan storage is
// free again when it returns.
template <int NT>
__device__ __forceinline__ void group_rows_chunk(const int32_t* offs, int64_t offs_s, int groups, int m, int g,
                                                 typename cub::BlockScan<int, NT>::TempStorage& tmp, int& carry_end,
                                                 int& start, int& len) {
  int e = 0;
  if (g < groups) {
    const int o = offs[g * offs_s];
    e = o < 0 ? 0 : (o > m ? m : o);
  }
  int prev, agg;
  cub::BlockScan<int, NT>(tmp).ExclusiveScan(e, prev, carry_end, MaxOp(), agg);
  __syncthreads();
  start = prev;
  len = g < groups ? max(prev, e) - prev : 0;
  carry_end = max(carry_end, agg);
}

template <class Out>
__device__ __forceinline__ void store2(Out* p, float x, float y);
template <>
__device__ __forceinline__ void store2<float>(float* p, float x, float y) {
  *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
template <>
__device__ __forceinline__ void store2<__nv_bfloat16>(__nv_bfloat16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
