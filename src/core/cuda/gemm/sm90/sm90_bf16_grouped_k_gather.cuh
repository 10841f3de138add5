// sm_90a bf16 grouped GEMM with token groups along the reduction, one operand's rows read through an
// index: the bf16 MoE layer's wgrads without a gathered copy (dW13 = dH^T gather(x), dW2 =
// gather(dout)^T (w act(h))).
//   out[g] (M, N) = sum over the routed rows r of group g of A_r^T B_r, A_r / B_r rows of A (., M) and
//   B (., N) bf16 (tokens are rows: both operands MN-major); the plain operand's row r is its row r,
//   the gathered one's is row gather[r] / fanout (clamped into [0, T fanout); negative: a zero row).
//   fp32 accumulation in the tensor cores' order, rounded once to bf16.
//
// Structure (the skeleton of the M-grouped kernel, sm90_fp8_grouped_m_1x128_128x128.cuh): a persistent
// CTA per SM; warpgroup 0 the producer, warpgroups 1 and 2 the math (64 output rows each of a 128 x 128
// tile). A k-block is 64 tokens: the producer's 128 threads copy both operands' 64 rows x 256 bytes
// (the tile's 128 columns) with cp.async into two 128-byte swizzled boxes of 64 columns each (thread t:
// box t / 8 % 2, chunk t % 8 of rows t / 16 + 8 i), token rows past the group and columns past M / N as
// zeros, and arrive on the stage's barrier when they land. Each row's source is resolved once per
// k-block, thread t taking row t % 64 of operand t / 64 (the index clamp, the division by the fanout,
// the 64-bit address) into a shared row table (two slots, one named barrier a k-block); a copy is then
// a 16-byte table read, an add and the cp.async. Resolving the rows per copy took ~400 instructions a
// k-block per producer warp, which left the math warps waiting on the full barriers ~2/3 of the time
// (ncu, docs/design/gemm-sm90.md); the math warpgroups issue m64n128k16 wgmmas
// with both operands MN-major (warpgroup w reads A's box w) and accumulate every k-block in place.
// Tiles run group-major (a group's tiles share its token rows in L2); a group without tokens stores zeros.
// The epilogue stages each warpgroup's 64 x 128 bf16 as the M-grouped kernel does and stores it with a
// 3D TMA map (G, M, N), which clips rows past M and columns past N.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include <cub/block/block_scan.cuh>

#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cuda/gemm/sm90/sm90_fp8_common.cuh"
#include "cuda/gemm/sm90/sm90_fp8_grouped_m_1x128_128x128.cuh"  // RingPos, cp.async, the epilogue's swizzle

namespace mxmoe {
namespace cuda {
namespace gemm {
namespace sm90 {

struct GroupedKGatherParams {
  const int32_t* offs;  // (G,) group ends along the routed rows (clamped like groups_from_offsets)
  int64_t offs_s;
  int groups;
  int rows;  // routed rows: the plain operand's rows, gather's length
  int m, n;  // out[g] is (m, n)
  const uint8_t* a;
  int64_t lda;  // bytes
  const uint8_t* b;
  int64_t ldb;
  const int32_t* gather;
  int max_index;  // T fanout - 1
  FastDiv fanout_div;
  int gather_b;  // 1: B's rows are read through gather, 0: A's
  int mt, nt;    // tiles along M and N
  FastDiv group_div, nt_div;  // division by mt nt, by nt
};

template <int Stages_>
struct GroupedKGatherBf16 {
  static constexpr int kStages = Stages_;
  static constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 64;  // kBlockK: tokens per k-block
  static constexpr int kThreads = 384;
  // The producer computes two row addresses per copy (an index load and a division for the gathered
  // one): 56 registers; the math side holds one accumulator set (no promotion). 56 + 2 x 224 = 504, the
  // pool setmaxnreg may share at 384 threads (docs/development.md).
  static constexpr int kProducerRegs = 56, kMathRegs = 224;
  static_assert(kProducerRegs + 2 * kMathRegs <= 504, "setmaxnreg budgets past the launch's pool never return");
  static constexpr int kBoxBytes = 64 * 128;  // 64 token rows x 64 bf16 columns
  static constexpr int kABytes = 2 * kBoxBytes, kBBytes = 2 * kBoxBytes, kStageBytes = kABytes + kBBytes;
  static constexpr int kAcc = 64;  // fp32 accumulators per math thread (64 x 128 / 128)
  // The epilogue staging of GroupedM<128, ., bf16> (epi_offset / epi_swizzle read these).
  static constexpr int kRowBytes = 256, kEpiBoxBytes = 128, kEpiBoxes = 2, kEpiBoxCols = 64;
  static constexpr int kEpiWgBytes = 64 * kRowBytes, kEpiBytes = 2 * kEpiWgBytes;
  // The producer's row table: two slots of 64 rows x (A's, B's source row address).
  static constexpr int kRowTableBytes = 2 * kBlockK * 2 * sizeof(uint64_t);
  // 1024 alignment slack | stages | epilogue | full / empty barriers | row table | group starts and lengths.
  static constexpr size_t smem_bytes(int groups) {
    return 1024 + static_cast<size_t>(kStages) * kStageBytes + kEpiBytes + 2 * kStages * sizeof(uint64_t) +
           kRowTableBytes + 2 * static_cast<size_t>(groups) * sizeof(int);
  }
};

// TMA store of a staged box to the 3D tensor at (c0, c1, c2), in this thread's bulk group.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];"
               :
               : "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(src))
               : "memory");
}

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1)
    grouped_k_gather_bf16_kernel(const __grid_constant__ CUtensorMap tma_out, const GroupedKGatherParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::MN, cute::SM90::GMMA::Major::MN>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((0u - smem_u32(smem_raw)) & 1023u);
  uint8_t* smem_a = smem;
  uint8_t* smem_b = smem + K::kStages * K::kABytes;
  uint8_t* smem_epi = smem + K::kStages * K::kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_epi + K::kEpiBytes);
  uint64_t* empty = full + K::kStages;
  uint64_t* row_table = empty + K::kStages;  // 16-byte aligned: 2 kStages barriers after a 1024-byte boundary
  static_assert(2 * K::kStages * sizeof(uint64_t) % 16 == 0, "the row table's entries are read as 16 bytes");
  int* s_start = reinterpret_cast<int*>(row_table + K::kRowTableBytes / sizeof(uint64_t));
  int* s_len = s_start + p.groups;

  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (tid == 0) {
    for (int s = 0; s < K::kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 128);  // one cp.async arrival per producer thread
      cutlass::arch::ClusterBarrier::init(&empty[s], 8);   // lane 0 of each math warp
    }
    cutlass::arch::fence_barrier_init();
  }
  // Group table: start and length of each group's routed rows (groups_from_offsets' clamping).
  {
    using Scan = cub::BlockScan<int, K::kThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    int carry_end = 0;
    for (int base = 0; base < p.groups; base += K::kThreads) {
      const int g = base + tid;
      int start, len;
      group_rows_chunk<K::kThreads>(p.offs, p.offs_s, p.groups, p.rows, g, scan_tmp, carry_end, start, len);
      if (g < p.groups) {
        s_start[g] = start;
        s_len[g] = len;
      }
    }
  }
  __syncthreads();

  const int total = p.groups * p.mt * p.nt;
  auto decode = [&](int t, int& g, int& m0, int& n0) {
    g = static_cast<int>(fast_div(static_cast<uint32_t>(t), p.group_div));
    const int rem = t - g * p.mt * p.nt;
    const int mi = static_cast<int>(fast_div(static_cast<uint32_t>(rem), p.nt_div));
    m0 = mi * K::kBlockM;
    n0 = (rem - mi * p.nt) * K::kBlockN;
  };

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<K::kProducerRegs>();
    const int box = (tid >> 3) & 1, chunk = tid & 7, r_lo = tid >> 4;  // rows r_lo + 8 i, i < 8
    const int dst = box * K::kBoxBytes + r_lo * 128 + ((chunk ^ (r_lo & 7)) << 4);
    // The row this thread resolves for the table: row tr of operand B (tid >= 64) or A.
    const int tr = tid & (K::kBlockK - 1);
    const bool t_b = tid >= K::kBlockK, t_gathered = t_b == (p.gather_b != 0);
    const uint8_t* t_base = t_b ? p.b : p.a;
    const int64_t t_ld = t_b ? p.ldb : p.lda;
    RingPos<K::kStages> rp;
    uint32_t slot = 0;  // the row table's slot of the next k-block
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
      int g, m0, n0;
      decode(t, g, m0, n0);
      const int start = s_start[g], len = s_len[g];
      const int ca = m0 + 64 * box + 8 * chunk, cb = n0 + 64 * box + 8 * chunk;  // this thread's columns
      const bool a_col = ca < p.m, b_col = cb < p.n;
      // The gather index of the thread's table row is loaded one k-block ahead, so its latency is not
      // paid per k-block.
      auto load_index = [&](int k0) {
        const int tok = k0 + tr;
        return t_gathered && tok < len ? __ldg(p.gather + start + tok) : -1;
      };
      int cur = len > 0 ? load_index(0) : -1;
      for (int k0 = 0; k0 < len; k0 += K::kBlockK, rp.advance(), slot ^= 1u) {
        const int nxt = k0 + K::kBlockK < len ? load_index(k0 + K::kBlockK) : -1;
        // The table row: the plain operand's row start + tok, the gathered one's gather[.] / fanout
        // (clamped into [0, T fanout); negative: none); none past the group. Null: a zero row.
        const int tok = k0 + tr;
        int row = -1;
        if (tok < len) {
          const int idx = min(cur, p.max_index);
          row = !t_gathered ? start + tok
                            : (idx >= 0 ? static_cast<int>(fast_div(static_cast<uint32_t>(idx), p.fanout_div)) : -1);
        }
        uint64_t* tab = row_table + slot * (2 * K::kBlockK);
        tab[2 * tr + (t_b ? 1 : 0)] =
            row >= 0 ? reinterpret_cast<uint64_t>(t_base + static_cast<int64_t>(row) * t_ld) : 0ull;
        // The table's writes are seen by every producer thread; the slot written next was last read
        // before this barrier.
        asm volatile("bar.sync 3, 128;" ::: "memory");
        const int s = rp.s;
        cutlass::arch::ClusterBarrier::wait(&empty[s], rp.ph ^ 1);
        uint8_t* sa = smem_a + s * K::kABytes + dst;
        uint8_t* sb = smem_b + s * K::kBBytes + dst;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const ulonglong2 e = *reinterpret_cast<const ulonglong2*>(tab + 2 * (r_lo + 8 * i));
          const bool on_a = a_col && e.x != 0, on_b = b_col && e.y != 0;
          cp_async_16(sa + i * 8 * 128, on_a ? reinterpret_cast<const uint8_t*>(e.x) + 2 * ca : p.a, on_a ? 16 : 0);
          cp_async_16(sb + i * 8 * 128, on_b ? reinterpret_cast<const uint8_t*>(e.y) + 2 * cb : p.b, on_b ? 16 : 0);
        }
        cp_async_arrive_noinc(&full[s]);
        cur = nxt;
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<K::kMathRegs>();
    const int mw = wg - 1;
    const int lt = tid - 128 * wg, warp = lt / 32, lane = lt % 32;
    // Warpgroup mw's 64 output rows are A's columns m0 + 64 mw ..: box mw of the stage's A. A k16 step is
    // 16 token rows of 128 bytes (2048 bytes, 128 descriptor units); B's two boxes are LBO apart.
    const uint64_t da0 = mnmajor_sw128_desc(smem_a + mw * K::kBoxBytes, K::kBoxBytes);
    const uint64_t db0 = mnmajor_sw128_desc(smem_b, K::kBoxBytes);
    RingPos<K::kStages> ri, rr;
    float fin[K::kAcc];
    auto release = [&] {
      const int s = rr.s;
      rr.advance();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&empty[s]);
    };
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
      int g, m0, n0;
      decode(t, g, m0, n0);
      const int kblocks = (s_len[g] + K::kBlockK - 1) / K::kBlockK;
#pragma unroll
      for (int q = 0; q < K::kAcc; ++q) fin[q] = 0.f;
      for (int kb = 0; kb < kblocks; ++kb) {
        const int s = ri.s;
        cutlass::arch::ClusterBarrier::wait(&full[s], ri.ph);
        ri.advance();
        fence_async_shared();  // cp.async wrote the stage through the generic proxy
#pragma unroll
        for (int q = 0; q < K::kAcc; ++q) cute::warpgroup_fence_operand(fin[q]);
        cute::warpgroup_arrive();
        const uint64_t da = da0 + static_cast<uint32_t>(s * (K::kABytes / 16));
        const uint64_t db = db0 + static_cast<uint32_t>(s * (K::kBBytes / 16));
#pragma unroll
        for (int j = 0; j < K::kBlockK / 16; ++j)
          wgmma<Op>(da + 128 * j, db + 128 * j, fin, kb > 0 || j > 0, std::make_index_sequence<K::kAcc>{});
        cute::warpgroup_commit_batch();
        if (kb > 0) {
          cute::warpgroup_wait<1>();
          release();
        }
      }
      cute::warpgroup_wait<0>();  // unconditional: ptxas then knows no wgmma writes fin past here
      if (kblocks > 0) release();
#pragma unroll
      for (int q = 0; q < K::kAcc; ++q) cute::warpgroup_fence_operand(fin[q]);
      // Epilogue: rounded to bf16 into this warpgroup's staged boxes (accumulator layout, the TMA
      // swizzle), then two 64-row x 64-column boxes by TMA; rows past M and columns past N are clipped.
      uint8_t* epi = smem_epi + mw * K::kEpiWgBytes;
      if (lt == 0) bulk_wait_group_read0();  // the previous tile's boxes have been read out
      asm volatile("bar.sync %0, 128;" ::"r"(1 + mw) : "memory");
      int tr;
      {
        const int lr = warp * 16 + lane / 4;
        const int b0 = 4 * (lane % 4);  // byte of the pair in column 8 j's 16-byte chunk
        const int v = lr * K::kEpiBoxBytes + 16 * ((b0 / 16) ^ epi_swizzle<K>(lr)) + b0 % 16;
        asm volatile("mov.b32 %0, %1;" : "=r"(tr) : "r"(v));
      }
#pragma unroll
      for (int j = 0; j < K::kAcc / 4; ++j) {
        const int chunk = j;  // column 8 j's 16-byte chunk in the 256-byte row
        uint8_t* bx = epi + chunk / 8 * 64 * K::kEpiBoxBytes;
        const int cx = 16 * (chunk % 8);
        // + 0: a sum of -0 products is stored as +0, as the host's fp32 sums from +0 give it
        store2(reinterpret_cast<__nv_bfloat16*>(bx + (tr ^ cx)), __fadd_rn(fin[4 * j + 0], 0.f),
               __fadd_rn(fin[4 * j + 1], 0.f));
        store2(reinterpret_cast<__nv_bfloat16*>(bx + ((tr + 8 * K::kEpiBoxBytes) ^ cx)), __fadd_rn(fin[4 * j + 2], 0.f),
               __fadd_rn(fin[4 * j + 3], 0.f));
      }
      fence_async_shared();  // the staged boxes are read by TMA next
      asm volatile("bar.sync %0, 128;" ::"r"(1 + mw) : "memory");
      if (lt == 0 && m0 + 64 * mw < p.m) {
#pragma unroll
        for (int b = 0; b < K::kEpiBoxes; ++b)
          tma_store_3d(&tma_out, epi + b * 64 * K::kEpiBoxBytes, n0 + b * K::kEpiBoxCols, m0 + 64 * mw, g);
        bulk_commit_group();
      }
    }
    if (lt == 0) bulk_wait_group0();  // the last boxes are written before the CTA leaves
  }
#endif
}

}  // namespace sm90
}  // namespace gemm
}  // namespace cuda
}  // namespace mxmoe
