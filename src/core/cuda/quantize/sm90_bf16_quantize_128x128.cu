// The tile128 recipe's weights' pass on Hopper: one 128x128 quantization of bf16 x (B, R, C) into
// codes in both orientations, q (B, R, C) and qt (B, C, R), and both compact scale layouts, with
// TMA moving every tile (the general tile128 pass kernel, tile128_bf16.cu, serves the rest).
//
// Why: the weights' pass reads 2 and writes 2 bytes an element every step, and on the register
// loads of the general kernel it ran latency-bound (ncu: 2.33 TB/s, issue slots 28%, long and short
// scoreboard stalls; docs/design/quantize.md). Here one thread keeps the DRAM busy: a persistent CTA
// (one per SM) keeps its next kSlots - 2 to kSlots - 1 tiles loading by TMA into a ring of 32 KB
// slots, and each tile's codes are staged in its own slot and leave by TMA stores that nobody waits
// for until the slot is loaded again (one tile later).
//
// Per tile (256 threads; thread (warp w, lane l) owns the 8x8 block of rows 8 rb .. +7, columns
// 8 cb .. +7 with cb = l % 16, rb = 2 w + l / 16):
//   wait the slot's full barrier; load the block (8 conflict-free 16-byte shared loads); |x| max over
//   the block, the warp, then (barrier 1) the 8 warps: the tile's scale byte;
//   code the block once (the tile has one scale, so qt is q transposed byte for byte); q's 8 rows go
//   to the slot's first 16 KB, the block's 8x8 byte transpose to its second 16 KB, both in TMA's
//   128-byte swizzle (16-byte chunk ^ row % 8). A lane's transposed rows are written rotated by
//   cb % 8 (the block's bytes rotated before the transpose), so a half-warp's stores spread over the
//   banks (2-way instead of 16-way); thread 0 writes the tile's scale byte once (its seed, below);
//   barrier 2 (after the async-proxy fence); thread 0 stores q and qt by TMA (clipped at the tensor's
//   edges), waits until the previous tile's stores have read their slot and loads a new tile into it.
// Loads past the tensor's edges read zeros, as the general kernel's do, so edge tiles get the same
// scale and codes.
//
// The scales: a tile's copies in the two compact layouts are 4 bytes in each of its 128 rows of
// scale_c and 128 columns of scale_r, 256 stores to as many 32-byte sectors. Written from the coding
// loop they cost 11-21% of the pass (H100, same run against leaving them out: Qwen3-30B-A3B's w13 667
// against 595 us, gpt-oss-120b's 4457 against 3520). So the coding loop writes one byte a tile, its
// seed (scale_c at the tile's first row and 32-run; scale_r's when scale_c is not asked for), and a
// second kernel expands the seeds of 8 x 8 tiles per block into whole sectors of both layouts.
#include <cuda.h>

#include <algorithm>
#include <climits>

#include "cuda/common/fast_div.cuh"
#include "cuda/common/launch_cache.cuh"
#include "cuda/common/tensor_map.hpp"
#include "cuda/quantize/common.cuh"
#include "cuda/quantize/tile128_bf16.cuh"
#include "cuda/quantize/tile128_codes.cuh"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace cuda {
namespace {

using namespace qk;

constexpr int kThreads = 256;
constexpr int kSlotBytes = 128 * 256;   // a bf16 tile, then its codes: q [0, 16 KB), qt [16 KB, 32 KB)
constexpr int kCodeBytes = 128 * 128;
// Tiles in shared memory: being coded, being stored, loading. One CTA per SM: two CTAs of 3 slots
// each measured 1-20% slower (H100, same run; gpt-oss-120b's w13 most), 4 slots up to 1% slower.
constexpr int kSlots = 6;
constexpr int kSmem = kSlots * kSlotBytes + 1024;  // + the 128-byte swizzle's 1024-byte alignment
// Tile order: the ~132 tiles in flight at once (one CTA per SM) cover kBand row tiles x ~16 column
// tiles, so each of the three tensors is touched in runs of >= 1 KB per row (x 4 KB, q 2 KB, qt
// 1 KB) rather than qt in 128-byte pieces per row (column tiles fastest). H200, same run against
// column tiles fastest: 1-5% faster on the larger weights (gpt-oss-120b, 64 x 8192 x 5120), 1%
// slower on Qwen3-30B-A3B's w13; 4 and 16 row tiles a band measured between.
constexpr int kBand = 8;

constexpr int kExpand = 8;  // tiles a side of an expansion block: 8 tiles x 4 bytes = one 32-byte sector

struct WeightParams {
  CUtensorMap x_map;   // bf16 (C, R, B), boxes 128 x 128 x 1, no swizzle
  CUtensorMap q_map;   // uint8 (C, R, B), boxes 128 x 128 x 1, 128-byte swizzle
  CUtensorMap qt_map;  // uint8 (R, C, B), boxes 128 x 128 x 1, 128-byte swizzle
  uint8_t* scale_c = nullptr;  // (B R, C / 32)
  uint8_t* scale_r = nullptr;  // (B C, n_r)
  long long n_r = 0;
  int R = 0, C = 0, rtiles = 0, ctiles = 0, per_b = 0, tiles = 0, mode = 0;
  bool q = false, qt = false;
  FastDiv div_band{}, div_per_b{};  // by kBand * ctiles, rtiles * ctiles
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t su32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(su32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(su32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tWAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT;\n\t}\n" ::"r"(su32(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
          su32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(su32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(su32(src))
               : "memory");
}



// 4x4 byte transpose: byte i of b[j] = byte j of a[i].
__device__ __forceinline__ void transpose4(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t (&b)[4]) {
  const uint32_t t0 = __byte_perm(a0, a1, 0x5140), t1 = __byte_perm(a0, a1, 0x7362);
  const uint32_t t2 = __byte_perm(a2, a3, 0x5140), t3 = __byte_perm(a2, a3, 0x7362);
  b[0] = __byte_perm(t0, t2, 0x5410);
  b[1] = __byte_perm(t0, t2, 0x7632);
  b[2] = __byte_perm(t1, t3, 0x5410);
  b[3] = __byte_perm(t1, t3, 0x7632);
}
#endif

__global__ void __launch_bounds__(kThreads, 1) sm90_bf16_quantize_128x128_kernel(const __grid_constant__ WeightParams P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint8_t smem_raw[];
  uint8_t* slots = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  __shared__ uint64_t full[kSlots];
  __shared__ uint32_t s_red[8];
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int cb = lane & 15, rb = 2 * w + (lane >> 4), rot = cb & 7;
  const int n = (P.tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  // Tile i of this CTA: (b, row tile, column tile) in bands of kBand row tiles, each band walked
  // column tile by column tile (its kBand row tiles fastest).
  auto coords = [&](int i, int& b, int& rt, int& ct) {
    const uint32_t t = blockIdx.x + static_cast<uint32_t>(i) * gridDim.x;
    b = static_cast<int>(fast_div(t, P.div_per_b));
    const uint32_t u = t - static_cast<uint32_t>(b) * static_cast<uint32_t>(P.per_b);
    const int band = static_cast<int>(fast_div(u, P.div_band));
    const int v = static_cast<int>(u) - band * kBand * P.ctiles;
    const int rows = min(kBand, P.rtiles - kBand * band);  // row tiles in this band
    ct = v / rows;
    rt = kBand * band + v - ct * rows;
  };
  auto load = [&](int i) {  // thread 0
    int b, rt, ct;
    coords(i, b, rt, ct);
    const int s = i % kSlots;
    mbar_expect_tx(&full[s], kSlotBytes);
    tma_load_3d(&P.x_map, &full[s], slots + s * kSlotBytes, 128 * ct, 128 * rt, b);
  };
  if (tid == 0) {
    for (int s = 0; s < kSlots; ++s) mbar_init(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (tid == 0)
    for (int i = 0; i < n && i < kSlots - 1; ++i) load(i);
  const int W = P.C / 32;  // scale_c entries per row

  for (int i = 0; i < n; ++i) {
    const int s = i % kSlots;
    uint8_t* slot = slots + s * kSlotBytes;
    mbar_wait(&full[s], static_cast<uint32_t>(i / kSlots) & 1u);
    uint4 X[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) X[k] = reinterpret_cast<const uint4*>(slot)[(8 * rb + k) * 16 + cb];
    uint32_t a = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint4 v = abs8(X[k]);
      a = __vmaxu2(a, __vmaxu2(__vmaxu2(v.x, v.y), __vmaxu2(v.z, v.w)));
    }
    a = max(a << 16, a & 0xFFFF0000u);  // |x| max as fp32 bits (NaN patterns order above the rest)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = max(a, __shfl_xor_sync(kFull, a, o));
    if (lane == 0) s_red[w] = a;
    __syncthreads();  // barrier 1: the tile was read; the warps' maxima are in
    uint32_t amax = s_red[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) amax = max(amax, s_red[k]);
    const uint32_t sc = e8m0_from_amax_bits(amax, static_cast<mxmoe_scale_mode>(P.mode));
    uint2 Q[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) Q[k] = codes8(X[k], sc);
    if (P.q) {
#pragma unroll
      for (int k = 0; k < 8; ++k)  // row 8 rb + k (row % 8 = k), bytes 8 cb .. +7
        *reinterpret_cast<uint2*>(slot + (8 * rb + k) * 128 + (((cb >> 1) ^ k) << 4) + ((cb & 1) << 3)) = Q[k];
    }
    if (P.qt) {
      // Rotate each row's 8 bytes by rot (byte c <- byte (c + rot) % 8), then transpose: T[c] is the
      // block's column (c + rot) % 8, i.e. qt row 8 cb + (c + rot) % 8, bytes 8 rb .. +7.
      uint32_t lo[8], hi[8];
      const int sh = 8 * (rot & 3);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t x = rot & 4 ? Q[k].y : Q[k].x, y = rot & 4 ? Q[k].x : Q[k].y;
        lo[k] = __funnelshift_r(x, y, sh);
        hi[k] = __funnelshift_r(y, x, sh);
      }
      uint32_t t00[4], t01[4], t10[4], t11[4];
      transpose4(lo[0], lo[1], lo[2], lo[3], t00);  // columns 0-3 of the rotated rows 0-3
      transpose4(lo[4], lo[5], lo[6], lo[7], t01);  // columns 0-3, rows 4-7
      transpose4(hi[0], hi[1], hi[2], hi[3], t10);  // columns 4-7, rows 0-3
      transpose4(hi[4], hi[5], hi[6], hi[7], t11);
      uint8_t* qts = slot + kCodeBytes;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int r = (c + rot) & 7;  // qt row 8 cb + r: row % 8 = r
        const uint2 v = c < 4 ? make_uint2(t00[c], t01[c]) : make_uint2(t10[c - 4], t11[c - 4]);
        *reinterpret_cast<uint2*>(qts + (8 * cb + r) * 128 + (((rb >> 1) ^ r) << 4) + ((rb & 1) << 3)) = v;
      }
    }
    int b, rt, ct;
    coords(i, b, rt, ct);
    const int r0 = 128 * rt, c0 = 128 * ct;
    if (tid == 0) {  // the seed (C % 32 == 0, and R % 32 == 0 where scale_r is asked for: 4 ct < W, 4 rt < n_r)
      if (P.scale_c != nullptr)
        P.scale_c[(static_cast<long long>(b) * P.R + r0) * W + 4 * ct] = static_cast<uint8_t>(sc);
      else if (P.scale_r != nullptr)
        P.scale_r[(static_cast<long long>(b) * P.C + c0) * P.n_r + r0 / 32] = static_cast<uint8_t>(sc);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the staged codes, for the TMA stores
    __syncthreads();  // barrier 2: the codes are staged; s_red may be rewritten
    if (tid == 0) {
      if (P.q) tma_store_3d(&P.q_map, slot, c0, r0, b);
      if (P.qt) tma_store_3d(&P.qt_map, slot + kCodeBytes, r0, c0, b);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      if (i + kSlots - 1 < n) {
        // Tile i - 1's stores have read their slot: it takes tile i + kSlots - 1.
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        load(i + kSlots - 1);
      }
    }
  }
  if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

// n rows of nb bytes (row stride `stride`) at d, byte (row, j) = 4 copies of v(row, j / 4)'s byte:
// 4-byte stores where every row's run is whole words, else bytes; consecutive threads take consecutive
// words (bytes) of a row, so a warp writes whole sectors.
template <class V>
__device__ __forceinline__ void expand_rows(uint8_t* d, long long stride, int n, int nb, const V& v) {
  const int tid = threadIdx.x;
  if (nb % 4 == 0 && stride % 4 == 0 && aligned(d, 4)) {
    const int words = nb / 4;
    for (int q = tid; q < n * words; q += blockDim.x) {
      const int r = q / words, j = q - r * words;
      *reinterpret_cast<uint32_t*>(d + r * stride + 4 * j) = v(r, j) * 0x01010101u;
    }
  } else {
    for (int q = tid; q < n * nb; q += blockDim.x) {
      const int r = q / nb, j = q - r * nb;
      d[r * stride + j] = static_cast<uint8_t>(v(r, j / 4));
    }
  }
}

// Block (b, RB, CB): the seeds of tiles [8 RB, 8 RB + 8) x [8 CB, 8 CB + 8) of matrix b, read before
// any copy is written (the block's own rows hold them), then scale_c's rows [1024 RB, +1024) bytes
// [32 CB, +32) and scale_r's rows (x's columns) [1024 CB, +1024) bytes [32 RB, +32), clipped as the
// layouts are (W = C / 32 bytes a row of scale_c; min(ceil(R / 32), n_r) runs a row of scale_r).
__global__ void __launch_bounds__(256) sm90_weights_scale_expand_kernel(const __grid_constant__ WeightParams P) {
  __shared__ uint32_t seed[kExpand][kExpand];
  const int rblocks = (P.rtiles + kExpand - 1) / kExpand, cblocks = (P.ctiles + kExpand - 1) / kExpand;
  const int per_b = rblocks * cblocks;
  const int b = static_cast<int>(blockIdx.x) / per_b, rem = static_cast<int>(blockIdx.x) - b * per_b;
  const int RB = rem / cblocks, CB = rem - RB * cblocks;
  const long long W = P.C / 32;
  if (threadIdx.x < kExpand * kExpand) {
    const int i = threadIdx.x / kExpand, j = threadIdx.x % kExpand;
    const int rt = kExpand * RB + i, ct = kExpand * CB + j;
    if (rt < P.rtiles && ct < P.ctiles)
      seed[i][j] = P.scale_c != nullptr ? P.scale_c[(static_cast<long long>(b) * P.R + 128 * rt) * W + 4 * ct]
                                        : P.scale_r[(static_cast<long long>(b) * P.C + 128 * ct) * P.n_r + 4 * rt];
  }
  __syncthreads();
  constexpr int kSpan = 128 * kExpand;  // rows (columns) of x a block covers
  if (P.scale_c != nullptr) {
    const int r0 = kSpan * RB, j0 = 32 * CB;
    expand_rows(P.scale_c + (static_cast<long long>(b) * P.R + r0) * W + j0, W, min(kSpan, P.R - r0),
                static_cast<int>(min(32LL, W - j0)), [&](int r, int j) { return seed[r >> 7][j]; });
  }
  if (P.scale_r != nullptr) {
    const int c0 = kSpan * CB, u0 = 32 * RB;
    const long long runs = min(static_cast<long long>((P.R + 31) / 32), P.n_r);
    if (runs > u0)
      expand_rows(P.scale_r + (static_cast<long long>(b) * P.C + c0) * P.n_r + u0, P.n_r, min(kSpan, P.C - c0),
                  static_cast<int>(min(32LL, runs - u0)), [&](int c, int j) { return seed[j][c >> 7]; });
  }
}

}  // namespace

bool launch_tile128_weights_sm90(const Tile128Pass& a, int device, cudaStream_t stream) {
  // The route checked the request (quantize_route.cpp, weights_tma_takes: no groups, x itself, TMA's
  // 16-byte strides and bases); the architecture is known here.
  if (cc_major(device) != 9) return false;  // TMA as measured on Hopper; elsewhere the general kernel
  const long long rtiles = cdiv(a.R, 128), ctiles = cdiv(a.C, 128);
  const long long tiles = static_cast<long long>(a.B) * rtiles * ctiles;
  if (tiles <= 0) return true;
  if (tiles > INT_MAX) return false;
  WeightParams P;
  const uint64_t B = static_cast<uint64_t>(a.B), R = static_cast<uint64_t>(a.R), C = static_cast<uint64_t>(a.C);
  const uint32_t box[3] = {128, 128, 1};
  {
    const uint64_t dims[3] = {C, R, B}, strides[2] = {2 * C, 2 * C * R};
    P.x_map = tiled_map("quantize (weights)", CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, a.x, dims, strides, box,
                        CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  }
  if (a.q != nullptr) {
    const uint64_t dims[3] = {C, R, B}, strides[2] = {C, C * R};
    P.q_map = tiled_map("quantize (weights' codes)", CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, a.q, dims, strides, box,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE);
  }
  if (a.qt != nullptr) {
    const uint64_t dims[3] = {R, C, B}, strides[2] = {R, C * R};
    P.qt_map = tiled_map("quantize (weights' transposed codes)", CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, a.qt, dims, strides,
                         box, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE);
  }
  P.scale_c = a.scale_c;
  P.scale_r = a.scale_r;
  P.n_r = a.n_r;
  P.R = a.R;
  P.C = a.C;
  P.ctiles = static_cast<int>(ctiles);
  P.per_b = static_cast<int>(rtiles * ctiles);
  P.tiles = static_cast<int>(tiles);
  P.mode = a.mode;
  P.q = a.q != nullptr;
  P.qt = a.qt != nullptr;
  P.rtiles = static_cast<int>(rtiles);
  P.div_band = make_fast_div(static_cast<uint32_t>(kBand * ctiles));
  P.div_per_b = make_fast_div(static_cast<uint32_t>(rtiles * ctiles));
  const int blocks = occupancy(sm90_bf16_quantize_128x128_kernel, device, kThreads, kSmem);
  if (blocks < 1) return false;
  const long long grid = std::min<long long>(tiles, static_cast<long long>(blocks) * sm_count(device));
  sm90_bf16_quantize_128x128_kernel<<<static_cast<unsigned>(grid), kThreads, kSmem, stream>>>(P);
  cuda_check(cudaGetLastError(), "quantize (weights): kernel launch");
  if (a.scale_c != nullptr || a.scale_r != nullptr) {  // the coding kernel's parameters: the seeds and layouts
    const long long blocks_e = static_cast<long long>(a.B) * cdiv(rtiles, kExpand) * cdiv(ctiles, kExpand);  // <= tiles
    sm90_weights_scale_expand_kernel<<<static_cast<unsigned>(blocks_e), 256, 0, stream>>>(P);
    cuda_check(cudaGetLastError(), "quantize (weights' scales): kernel launch");
  }
  return true;
}

}  // namespace cuda
}  // namespace mxmoe
