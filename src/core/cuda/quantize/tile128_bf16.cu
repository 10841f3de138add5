// The tile128 recipe's quantize passes on bf16 input (see tile128_bf16.cuh): rowwise 1x128 plus
// columnwise 128x1 per token group (activations, x or a computed input), or one 128x128
// quantization for both orientations (weights). Design and measurements: docs/design/quantize.md
// "Version 9".
//
// A persistent CTA of 256 threads walks 128-row panels x 128-column tiles (panels start at group
// starts, as the general tile kernel's). Per tile:
//   load:    thread (warp w, half h, chunk j) holds rows 16 i + 2 w + h (i < 8), columns 8 j .. +7
//            (eight 16-byte loads; a half-warp reads one whole 256-byte row) and stores them into a
//            shared bf16 tile. Its packed |x| maxima over those 8 rows, combined with the other half
//            (one shuffle), give each warp's column maxima (weights: the tile's, one warp reduction).
//            Rowwise 1x128 blocks are complete in a half-warp: the 8 row maxima are reduce-scattered
//            over its 16 lanes (8 shuffles, one scale per lane), the scales shuffled back, and the row
//            side coded from registers (8-byte code stores).
//   barrier: the tile and its maxima are visible (maxima and tile scales double-buffered).
//   column:  lane l of warp w takes the bf16 pair (column word) 32 (w & 1) + l of rows 32 (w >> 1)
//            .. +31: the 8 warps' maxima give its two columns' scales; one conflict-free 4-byte shared
//            load per row (a warp reads one 128-byte row run); 4 rows per cvt pair. The transposed
//            codes are staged in shared memory (x itself: the tile's own buffer, after a barrier;
//            computed inputs: a free buffer) and, after one more barrier, written by whole warps: 128
//            contiguous bytes of a transposed row per store instruction (4 rows of 16-byte stores
//            when aligned, funnel-shifted words otherwise); the column scales of a panel's 4 runs
//            leave as one 4-byte store per column. Weights: the row side is coded from the tile here.
// Loads run ahead of the work: x itself and both gathers go through cp.async, two tiles ahead in
// three tile buffers (no registers held; the scaled gather's rows are scaled in place when they
// land); SwiGLU and its backward are loaded and computed into registers one tile ahead. Templated on the input (x or a computed source) and on
// weights vs activations, so each instance carries only its own path. Tiles are decoded once each,
// in increasing order (host magic divisors, a forward-only group cursor: v13). Design history and
// measurements: docs/design/quantize.md.
#include "cuda/quantize/tile128_bf16.cuh"

#include <algorithm>

#include "cuda/common/fast_div.cuh"
#include "cuda/common/launch_cache.cuh"
#include "cuda/quantize/common.cuh"
#include "cuda/quantize/source.cuh"
#include "cuda/quantize/tile128_codes.cuh"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace cuda {
namespace {

using namespace qk;

constexpr int kThreads = 256;
constexpr int kTileBytes = 128 * 256;  // one 128 x 128 bf16 tile
constexpr int kPartBytes = 8 * 64 * 4;  // column maxima: 8 warps x 64 packed column pairs
constexpr int kTable = 512;  // groups whose table fits in shared memory
constexpr int kSourceGatherRaw = 100;  // the kernel's instance for GATHER without row_scale (cp.async)
// GATHER with row_scale on the same cp.async path: the rows and their scales land in shared memory
// two tiles ahead, and each thread scales its own chunks in place after they land (the MoE layer's
// w * dout wgrad operand; docs/design/quantize.md).
constexpr int kSourceGatherScaled = 104;
// The instance for SWIGLU_BACKWARD with concatenated halves and I % 128 == 0: each CTA takes a gate
// column tile and then its up tile (I columns further), both from one read of (g, u, dy) (load_pair).
constexpr int kSourceSwigluBwdPaired = 101;
// SWIGLU and the paired backward with a plain activation (swiglu_is_plain: no clamps, alpha 1, the
// Qwen3 / Mixtral / DeepSeek SwiGLU): the same values without the clamp and alpha operations.
constexpr int kSourceSwigluPlain = 102;
constexpr int kSourceSwigluBwdPairedPlain = 103;
__host__ __device__ constexpr bool paired_source(int src) {
  return src == kSourceSwigluBwdPaired || src == kSourceSwigluBwdPairedPlain;
}
__host__ __device__ constexpr bool plain_source(int src) {
  return src == kSourceSwigluPlain || src == kSourceSwigluBwdPairedPlain;
}
// x itself and the gathers (cp.async): three tile buffers, two tiles in flight, 2 CTAs per SM
// with 128 registers. Computed inputs (register prefetch): two buffers, 3 CTAs per SM (their
// latency-bound math wants the warps; measured 3-8 % faster than 2 CTAs).
__host__ __device__ constexpr bool async_source(int src) {
  return src == 0 || src == kSourceGatherRaw || src == kSourceGatherScaled;
}
__host__ __device__ constexpr int tile_buffers(int src) { return async_source(src) ? 3 : 2; }
// The scaled async gather's row scales: one fp32 per tile row per buffer, after the column maxima.
__host__ __device__ constexpr int row_scale_bytes(int src) {
  return src == kSourceGatherScaled ? tile_buffers(src) * 128 * 4 : 0;
}
// The paired SwiGLU backward holds its up tile's chunks (32 registers) from the gate tile's load to
// its own turn: 2 CTAs per SM.
__host__ __device__ constexpr int min_ctas(int src) {
  return async_source(src) || paired_source(src) ? 2 : 3;
}

struct KParams {
  Tile128Pass a;
  bool grouped = false;
  bool row_on = false;  // activations: the rowwise side is wanted
  int P = 0;            // panel slots per batch entry
  int ctiles = 0;
  long long tiles = 0;
  int pair_ct = 0;      // kSourceSwigluBwdPaired: I / 128 (column tiles per half)
  // Tile decode without hardware divisions (v13): by P * ctiles, ctiles and pair_ct.
  FastDiv div_per_b{}, div_ctiles{}, div_pair{};
};

struct Tile {
  int b, ct, r0, rows, run0;
  bool in_group, valid;
};

// The group of panel p: the largest g >= lo with tp0[g] <= p (tp0[lo] <= p; tp0 is non-decreasing, so
// the lanes' tests tp0[lo + 1 + lane] <= p hold on a prefix of the lanes). A CTA resolves its tiles in
// increasing order, so lo only moves forward: one shared load per 32 groups passed instead of a binary
// search per tile (v13). Called by all lanes of the warp.
__device__ __forceinline__ int advance_group(const int* tp0, int G, int lo, int p) {
  const int lane = threadIdx.x & 31;
  for (;;) {
    const int g = lo + 1 + lane;
    const unsigned b = __ballot_sync(kFull, g < G && tp0[g] <= p);
    lo += __popc(b);
    if (b != kFull) return lo;
  }
}

// Tile `tile` of the launch. `lo` is the thread's group cursor (see advance_group): every thread
// resolves the same tiles in increasing order, uniformly over the warp.
__device__ __forceinline__ Tile resolve(const KParams& K, const int* table, int covered, int tot_panels,
                                        long long tile, int& lo) {
  Tile t{};
  t.valid = false;
  if (tile >= K.tiles) return t;
  const uint32_t ti = static_cast<uint32_t>(tile);
  t.b = static_cast<int>(fast_div(ti, K.div_per_b));
  const uint32_t u = ti - static_cast<uint32_t>(t.b) * static_cast<uint32_t>(K.P * K.ctiles);
  const int p = static_cast<int>(fast_div(u, K.div_ctiles));
  t.ct = static_cast<int>(u) - p * K.ctiles;
  const int R = K.a.R;
  if (!K.grouped) {
    t.r0 = 128 * p;
    t.rows = min(R - t.r0, 128);
    t.run0 = t.r0 / 32;
    t.in_group = true;
  } else if (p < tot_panels) {
    const int* tstart = table;
    const int* tp0 = table + kTable;
    const int* tb0 = table + 2 * kTable;
    lo = advance_group(tp0, K.a.G, lo, p);
    const int end = lo + 1 < K.a.G ? tstart[lo + 1] : covered;
    t.r0 = tstart[lo] + 128 * (p - tp0[lo]);
    t.rows = min(end - t.r0, 128);
    t.run0 = tb0[lo] + 4 * (p - tp0[lo]);
    t.in_group = true;
  } else {
    // Rows past the last group, in 128-row panels from its end.
    const long long r0 = static_cast<long long>(covered) + 128LL * (p - tot_panels);
    t.r0 = static_cast<int>(min(r0, static_cast<long long>(R)));
    t.rows = static_cast<int>(min(static_cast<long long>(R), r0 + 128) - t.r0);
    t.run0 = 0;
    t.in_group = false;
  }
  t.valid = t.rows > 0 && K.a.C - 128 * t.ct > 0;
  return t;
}

// Values 2k, 2k + 1 of v as bf16x2. Every caller quantizes them next, so the hardware's NaN will do
// (cvt_bf16x2; the rounding is f32_to_bf16's).
__device__ __forceinline__ uint32_t pack_bf16_8(const float (&v)[8], int k) { return cvt_bf16x2(v[2 * k], v[2 * k + 1]); }

// Whether this thread reads anything of tile t (nothing past the tensor's columns, C % 8 == 0, and
// nowhere no output reads it: rows past the last group of a column-only request).
__device__ __forceinline__ bool reads_tile(const KParams& K, const Tile& t) {
  const int j = threadIdx.x & 15;
  return t.valid && (t.in_group || K.row_on) && 8 * j < K.a.C - 128 * t.ct;
}

// GATHER: the perm entries of this thread's 8 rows of tile t, all 8 loads issued before any is used
// (through gather_entry, one at a time, the cp.async gather measured 0.41 of copy instead of 0.53);
// -1 for no row, a padding row or nothing to gather. A row reads entry min(pr, perm_n - 1), as
// gather_entry.
__device__ __forceinline__ void tile_perms(const KParams& K, const Tile& t, bool any, int32_t (&pr)[8]) {
  const int w = threadIdx.x >> 5, h = (threadIdx.x & 31) >> 4;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = 16 * i + 2 * w + h;
    pr[i] = any && r < t.rows && K.a.src.perm_n > 0 ? __ldg(K.a.src.perm + t.r0 + r) : -1;
  }
}

// SwiGLU / SwiGLU backward: this thread's 8 chunks of tile t as bf16 (zeros past the panel's rows and
// where nothing reads them).
template <int SRC>
__device__ __forceinline__ void load_tile(const KParams& K, const Tile& t, uint4 (&X)[8]) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, h = lane >> 4, j = lane & 15;
#pragma unroll
  for (int i = 0; i < 8; ++i) X[i] = make_uint4(0, 0, 0, 0);
  if (!reads_tile(K, t)) return;
  const long long c = 128LL * t.ct + 8 * j;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = 16 * i + 2 * w + h;
    if (r < t.rows) {
      float v[8];
      swiglu_source8<plain_source(SRC)>(static_cast<const uint16_t*>(K.a.x), K.a.C, K.a.src, t.r0 + r, c, v);
      X[i] = make_uint4(pack_bf16_8(v, 0), pack_bf16_8(v, 1), pack_bf16_8(v, 2), pack_bf16_8(v, 3));
    }
  }
}

// kSourceSwigluBwdPaired: gate column tile t and its up tile (pair_ct tiles further) from one read of
// (g, u, dy) per chunk: dg into X (tile t), du into Y (the CTA's next tile, see the kernel's ahead).
// swiglu_grad gives both halves' values from one evaluation of the sigmoid, bit for bit those of
// swiglu_source8 for either half.
template <bool PLAIN>
__device__ __forceinline__ void load_pair(const KParams& K, const Tile& t, uint4 (&X)[8], uint4 (&Y)[8]) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, h = lane >> 4, j = lane & 15;
#pragma unroll
  for (int i = 0; i < 8; ++i) X[i] = Y[i] = make_uint4(0, 0, 0, 0);
  if (!reads_tile(K, t)) return;
  const SourceP& s = K.a.src;
  const long long c = 128LL * t.ct + 8 * j;  // < I: the gate half
  const uint16_t* hx = static_cast<const uint16_t*>(K.a.x);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = 16 * i + 2 * w + h;
    if (r < t.rows) {
      float g[8], u[8], dy[8], dg[8], du[8];
      swiglu_bwd_inputs8(hx, K.a.C, s, t.r0 + r, c, g, u, dy);
      if (PLAIN && sigmoid_moderate8(g)) {
#pragma unroll
        for (int q = 0; q < 8; ++q) swiglu_grad<PLAIN, PLAIN>(g[q], u[q], dy[q], s.act, &dg[q], &du[q]);
      } else {
#pragma unroll
        for (int q = 0; q < 8; ++q) swiglu_grad<PLAIN>(g[q], u[q], dy[q], s.act, &dg[q], &du[q]);
      }
      X[i] = make_uint4(pack_bf16_8(dg, 0), pack_bf16_8(dg, 1), pack_bf16_8(dg, 2), pack_bf16_8(dg, 3));
      Y[i] = make_uint4(pack_bf16_8(du, 0), pack_bf16_8(du, 1), pack_bf16_8(du, 2), pack_bf16_8(du, 3));
    }
  }
}

// x itself, or rows of x gathered by perm (GATHER; SCALED: also each row's scale into rs, by the
// row's first lane, for the in-place scaling when the tile lands): the thread's 8 chunks of tile t copied
// straight into its slots of the shared tile (cp.async, zero-filled past the panel's rows, the
// tensor's columns and for padding rows), so the next tile's bytes are in flight without holding
// registers.
template <bool GATHER, bool SCALED = false>
__device__ __forceinline__ void copy_tile_async(const KParams& K, const Tile& t, uint8_t* buf, float* rs = nullptr) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, h = lane >> 4, j = lane & 15;
  const Tile128Pass& A = K.a;
  const bool any = reads_tile(K, t);
  const uint16_t* x = static_cast<const uint16_t*>(A.x);
  const long long c = 128LL * t.ct + 8 * j;
  // x itself: the thread's first row, then 16 rows per chunk (no per-chunk 64-bit row products).
  const uint16_t* row0 = x + (static_cast<long long>(t.b) * A.R + t.r0 + 2 * w + h) * A.C + c;
  const long long step16 = 16LL * A.C;
  int32_t pr[8];
  if constexpr (GATHER) tile_perms(K, t, any, pr);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = 16 * i + 2 * w + h;
    bool ok = any && r < t.rows;
    const uint16_t* src = x;
    const float* scale = A.src.row_scale;  // SCALED: the row's scale (any valid address when not read)
    if constexpr (GATHER) {
      ok = ok && pr[i] >= 0;  // a padding row: zero-filled
      const long long e = min(static_cast<long long>(pr[i]), A.src.perm_n - 1);
      if (ok) src = x + (e / A.src.k) * A.C + c;
      if (SCALED && ok) scale += e;
    } else {
      if (ok) src = row0 + i * step16;
    }
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(buf + ((16 * i + 2 * w + h) * 16 + j) * 16));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0) : "memory");
    if constexpr (SCALED) {
      // The row's scale, by the row's first lane (0.0 where the row is zero-filled: 0 * 0 = +0 then).
      if (j == 0) {
        const uint32_t ds = static_cast<uint32_t>(__cvta_generic_to_shared(rs + r));
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(ds), "l"(scale), "r"(ok ? 4 : 0) : "memory");
      }
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ uint4 vmax4(const uint4 a, const uint4 b) {
  return make_uint4(__vmaxu2(a.x, b.x), __vmaxu2(a.y, b.y), __vmaxu2(a.z, b.z), __vmaxu2(a.w, b.w));
}
// max of a packed pair of |bf16| as fp32 bits (NaN patterns order above everything else).
__device__ __forceinline__ uint32_t pair_max(uint32_t m) { return max(m << 16, m & 0xFFFF0000u); }


// The row's scale entries of this column tile (compact layout (B*R, C/32): one byte per 32
// columns, a 1x128 block's byte repeated 4 times).
__device__ __forceinline__ void store_scale_c(uint8_t* d, uint32_t s, int nj) {
  if (nj <= 0) return;
  if (nj == 4 && aligned(d, 4)) {
    *reinterpret_cast<uint32_t*>(d) = s * 0x01010101u;
  } else {
    for (int e = 0; e < nj; ++e) d[e] = static_cast<uint8_t>(s);
  }
}

// Staged transposed codes: local column cl's rows 16 u .. +15 at cl * 128 + 16 (u ^ (cl & 7)) of the
// buffer (the XOR spreads a warp's 16-byte stores over all banks).
__device__ __forceinline__ void stage_codes(uint8_t* cbuf, int cp, int q4, const uint32_t (&olo)[8],
                                            const uint32_t (&ohi)[8]) {
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int cl = 2 * cp + e;
    const uint32_t(&o)[8] = e ? ohi : olo;
#pragma unroll
    for (int u = 0; u < 2; ++u)
      reinterpret_cast<uint4*>(cbuf)[cl * 8 + ((2 * q4 + u) ^ (cl & 7))] = make_uint4(o[4 * u], o[4 * u + 1], o[4 * u + 2], o[4 * u + 3]);
  }
}

// Bytes [0, n) of one transposed row at dst, written by a whole warp: lane l holds bytes 4 l .. +3 in
// `word`, prev is lane l - 1's word. Each store instruction covers one 128-byte run of the row; an
// unaligned dst takes funnel-shifted words, with the partial words at both ends as single bytes.
__device__ __forceinline__ void store_row_words(uint8_t* dst, uint32_t word, uint32_t prev, int n, int lane) {
  const int a = static_cast<int>(reinterpret_cast<uintptr_t>(dst) & 3u);
  uint8_t* base = dst - a;
  // Destination word `lane` covers row bytes 4 lane - a .. 4 lane - a + 3.
  const uint32_t v = a == 0 ? word : __funnelshift_r(prev, word, 32 - 8 * a);
  const int t0 = 4 * lane - a;
  if (t0 >= 0 && t0 + 4 <= n) {
    *reinterpret_cast<uint32_t*>(base + 4 * lane) = v;
  } else {
    for (int e = 0; e < 4; ++e)
      if (t0 + e >= 0 && t0 + e < n) base[4 * lane + e] = static_cast<uint8_t>(v >> (8 * e));
  }
  // The word after the last lane's (a != 0): row bytes 128 - a .. 127 from lane 31's word.
  if (lane == 31 && a != 0)
    for (int e = 0; e < a; ++e)
      if (128 - a + e < n) base[128 + e] = static_cast<uint8_t>(word >> (8 * (4 - a + e)));
}

// x itself and the gathers (cp.async, three tile buffers): 2 CTAs per SM, 128 registers, no spills
// (the 3-CTA, 80-register budget spilled and measured 3-8 % slower); SwiGLU sources: two buffers,
// 3 CTAs per SM (see min_ctas).
template <int SRC, bool TILE>
__global__ void __launch_bounds__(kThreads, min_ctas(SRC)) tile128_pass_kernel(const __grid_constant__ KParams K) {
  constexpr int kBufs = tile_buffers(SRC);
  extern __shared__ uint4 dyn_smem_[];
  uint8_t* bufs = reinterpret_cast<uint8_t*>(dyn_smem_);
  // Per buffer: the column maxima of each warp's 16 rows, [8 warps][64 packed column pairs].
  uint32_t* parts = reinterpret_cast<uint32_t*>(bufs + kBufs * kTileBytes);
  float* row_scales = reinterpret_cast<float*>(bufs + kBufs * kTileBytes + 2 * kPartBytes);  // scaled gather
  int* table = reinterpret_cast<int*>(bufs + kBufs * kTileBytes + 2 * kPartBytes + row_scale_bytes(SRC));
  __shared__ uint32_t s_red[2][8];
  __shared__ uint32_t s_sc[128];  // column scales of the tile: byte q of column cl = run q's
  __shared__ int s_covered, s_tot;
  const Tile128Pass& A = K.a;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, h = lane >> 4, j = lane & 15;
  const mxmoe_scale_mode mode = static_cast<mxmoe_scale_mode>(A.mode);

  if (K.grouped) {
    // The group table, once per CTA (the scan's scratch lives in the tile buffers until the first tile).
    ScanSmem& scan = *reinterpret_cast<ScanSmem*>(bufs);
    const ScanTotals tot = scan_groups<kThreads>(A.offs, A.offs_stride, A.G, A.R, 0, scan, [&](const GroupInfo& gi) {
      table[gi.g] = static_cast<int>(gi.start);
      table[kTable + gi.g] = static_cast<int>(gi.p0);
      table[2 * kTable + gi.g] = static_cast<int>(gi.b0);
    });
    if (tid == 0) {
      s_covered = static_cast<int>(tot.covered);
      s_tot = static_cast<int>(tot.panels);
    }
    // scale_r entries past the groups' runs are zero (split over all CTAs).
    if (A.scale_r != nullptr && A.n_r > tot.blocks) {
      long long lo, hi;
      grid_share(A.C, lo, hi);
      for (long long c = lo; c < hi; ++c) zero_bytes_cta<kThreads>(A.scale_r + c * A.n_r, tot.blocks, A.n_r);
    }
  } else if (tid == 0) {
    s_covered = 0;
    s_tot = 0;
  }
  __syncthreads();
  const int covered = s_covered, tot_panels = s_tot;

  const long long step = gridDim.x;
  // x itself and the gathers go through cp.async into the tile buffers; SwiGLU sources are loaded and
  // computed into registers a tile ahead.
  constexpr bool kGatherAsync = SRC == kSourceGatherRaw || SRC == kSourceGatherScaled;
  constexpr bool kScaled = SRC == kSourceGatherScaled;
  constexpr bool kAsync = SRC == 0 || kGatherAsync;
  constexpr bool kPaired = paired_source(SRC);
  // The row side's chunk maxima from the same |x| as the column maxima (one abs per word) where the
  // register budget allows (128 registers); the 80-register instances spill with both live, so they
  // take |x| again just before the row reduction.
  constexpr bool kEarlyRowMax = min_ctas(SRC) == 2;
  // The tile d places after tile `tile`, the it-th of this CTA: every gridDim.x-th tile; paired,
  // every gridDim.x-th (gate, up) pair, the gate tile first (K.tiles: past the end).
  auto ahead = [&](long long tile, int it, int d) -> long long {
    if constexpr (kPaired) {
      const long long k = it + d, q = blockIdx.x + (k >> 1) * step;
      if (q >= K.tiles / 2) return K.tiles;
      const long long bp = fast_div(static_cast<uint32_t>(q), K.div_pair);
      return bp * K.ctiles + (q - bp * K.pair_ct) + (k & 1) * K.pair_ct;
    } else {
      return tile + d * step;
    }
  };
  const long long first = kPaired ? ahead(0, 0, 0) : blockIdx.x;
  uint4 X[8];
  Tile tnn{};     // x itself: the tile two ahead (its copies in flight)
  uint4 Y[8];     // the paired SwiGLU backward only: the up tile's chunks, computed with its gate tile's
  int lo = 0;  // the group cursor of resolve (its tiles come in increasing order)
  Tile t = resolve(K, table, covered, tot_panels, first, lo);
  // x itself keeps two tiles in flight (three buffers: the tile being worked on, the next two landing).
  Tile tn = resolve(K, table, covered, tot_panels, ahead(first, 0, 1), lo);
  if constexpr (kAsync) {
    copy_tile_async<kGatherAsync, kScaled>(K, t, bufs, row_scales);
    copy_tile_async<kGatherAsync, kScaled>(K, tn, bufs + kTileBytes, row_scales + 128);
  } else if constexpr (kPaired) {
    load_pair<plain_source(SRC)>(K, t, X, Y);
  } else {
    load_tile<SRC>(K, t, X);
  }
  const int cp = 32 * (w & 1) + lane;  // column word of the column phase: columns 2 cp, 2 cp + 1
  const int q4 = w >> 1;               // its row quarter: rows 32 q4 .. +31
  // Row side: after the reduce-scatter below, lane j holds the complete max of round rho's row.
  const int rho = 4 * ((j >> 3) & 1) + 2 * ((j >> 2) & 1) + ((j >> 1) & 1);
  const int W = A.C / 32;  // scale_c entries per row
  int it = 0, slot = 0;  // slot = it % kBufs
  for (long long tile = first; tile < K.tiles; tile = ahead(tile, it, 1), ++it) {
    const int slot2 = slot >= kBufs - 2 ? slot + 2 - kBufs : slot + 2;  // (it + 2) % kBufs (async)
    const int slot1 = slot + 1 == kBufs ? 0 : slot + 1;                 // (it + 1) % kBufs
    uint8_t* buf = bufs + slot * kTileBytes;
    uint32_t* part = parts + (it & 1) * (kPartBytes / 4);
    const uint32_t* bw = reinterpret_cast<const uint32_t*>(buf);
    const int cols = min(128, A.C - 128 * t.ct);
    const int nj = min(4, W - 4 * t.ct);
    const bool cok = 8 * j < cols;

    // ---- load phase: the tile and its column maxima into shared memory; activations' row side ----
    uint32_t m[8];
    uint4 cm;
    if constexpr (kScaled) {
      // Rows times their scales, rounded to bf16 (x * w, +0 for padding rows: both were zero-filled),
      // in place in the thread's own slots, with their maxima; no chunk stays in registers (the row
      // side re-reads them). The scales were copied by each row's first lane, which waited too.
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      __syncwarp();
      const float* rs = row_scales + 128 * slot;
      cm = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        uint4* slot_i = reinterpret_cast<uint4*>(buf) + (16 * i + 2 * w + h) * 16 + j;
        const float sc = rs[16 * i + 2 * w + h];
        float v[8];
        unpack8(*slot_i, v);
#pragma unroll
        for (int q = 0; q < 8; ++q) v[q] = mul_rn(v[q], sc);
        const uint4 y = make_uint4(pack_bf16_8(v, 0), pack_bf16_8(v, 1), pack_bf16_8(v, 2), pack_bf16_8(v, 3));
        *slot_i = y;
        const uint4 ay = abs8(y);
        m[i] = pair_max(__vmaxu2(__vmaxu2(ay.x, ay.y), __vmaxu2(ay.z, ay.w)));
        cm = vmax4(cm, ay);
      }
    } else if constexpr (kAsync) {
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // this thread's copies of tile t landed
#pragma unroll
      for (int i = 0; i < 8; ++i) X[i] = reinterpret_cast<const uint4*>(buf)[(16 * i + 2 * w + h) * 16 + j];
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) reinterpret_cast<uint4*>(buf)[(16 * i + 2 * w + h) * 16 + j] = X[i];
    }
    if (!kScaled && t.valid) {
      // |x| once for both sides: the column maxima (cm) and the row side's chunk maxima (m).
      cm = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint4 a = abs8(X[i]);
        cm = vmax4(cm, a);
        if constexpr (!TILE && kEarlyRowMax) m[i] = pair_max(__vmaxu2(__vmaxu2(a.x, a.y), __vmaxu2(a.z, a.w)));
      }
    }
    if (t.valid && t.in_group) {
      if constexpr (TILE) {
        uint32_t a = max(max(pair_max(cm.x), pair_max(cm.y)), max(pair_max(cm.z), pair_max(cm.w)));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) a = max(a, __shfl_xor_sync(kFull, a, o));
        if (lane == 0) s_red[it & 1][w] = a;
      } else {
        cm.x = __vmaxu2(cm.x, __shfl_xor_sync(kFull, cm.x, 16));
        cm.y = __vmaxu2(cm.y, __shfl_xor_sync(kFull, cm.y, 16));
        cm.z = __vmaxu2(cm.z, __shfl_xor_sync(kFull, cm.z, 16));
        cm.w = __vmaxu2(cm.w, __shfl_xor_sync(kFull, cm.w, 16));
        if (h == 0) reinterpret_cast<uint4*>(part)[w * 16 + j] = cm;
      }
    }
    if constexpr (!TILE) {
      if (t.valid && K.row_on) {
        // Row maxima: each lane's 8 chunk maxima, reduce-scattered over the 16 lanes of its row
        // (xor 8, 4, 2 halve the rows held, xor 1 completes): 8 shuffles and one scale per lane.
        if constexpr (!kEarlyRowMax) {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const uint4 v = abs8(X[i]);
            m[i] = pair_max(__vmaxu2(__vmaxu2(v.x, v.y), __vmaxu2(v.z, v.w)));
          }
        }
        const bool b3 = (j >> 3) & 1, b2 = (j >> 2) & 1, b1 = (j >> 1) & 1;
        uint32_t t1[4], t2[2];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t keep = b3 ? m[k + 4] : m[k], send = b3 ? m[k] : m[k + 4];
          t1[k] = max(keep, __shfl_xor_sync(kFull, send, 8));
        }
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const uint32_t keep = b2 ? t1[k + 2] : t1[k], send = b2 ? t1[k] : t1[k + 2];
          t2[k] = max(keep, __shfl_xor_sync(kFull, send, 4));
        }
        uint32_t t3;
        {
          const uint32_t keep = b1 ? t2[1] : t2[0], send = b1 ? t2[0] : t2[1];
          t3 = max(keep, __shfl_xor_sync(kFull, send, 2));
        }
        t3 = max(t3, __shfl_xor_sync(kFull, t3, 1));
        const uint32_t s_mine = e8m0_from_amax_bits(t3, mode);
        const int rr = 16 * rho + 2 * w + h;  // the row whose scale this lane holds
        if (A.scale_c != nullptr && (j & 1) == 0 && rr < t.rows)
          store_scale_c(A.scale_c + (static_cast<long long>(t.b) * A.R + t.r0 + rr) * W + 4 * t.ct, s_mine, nj);
        // The thread's first row's codes; chunk i is 16 i rows further.
        uint8_t* qrow = A.q == nullptr ? nullptr
                                       : A.q + (static_cast<long long>(t.b) * A.R + t.r0 + 2 * w + h) * A.C + 128LL * t.ct + 8 * j;
        // The 8 chunks are independent and coded branch-free (predicated stores), so they interleave.
        const bool qok = qrow != nullptr && cok;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int src = (lane & 16) | (((i >> 2) & 1) << 3) | (((i >> 1) & 1) << 2) | ((i & 1) << 1);
          const uint4 xi = kScaled ? reinterpret_cast<const uint4*>(buf)[(16 * i + 2 * w + h) * 16 + j] : X[i];
          const uint2 qc = codes8(xi, __shfl_sync(kFull, s_mine, src));
          if (qok && 16 * i + 2 * w + h < t.rows) *reinterpret_cast<uint2*>(qrow + i * (16LL * A.C)) = qc;
        }
      }
    }
    __syncthreads();  // the tile and its maxima are in shared memory (one barrier per tile: three buffers)

    // x itself: tile it + 2's copies into the buffer of tile it - 1, whose last reader (its staged store
    // phase) every thread finished before the barrier. Computed inputs: the next tile into registers.
    if constexpr (kAsync) {
      // Each tile is resolved once, here, two ahead (tnn), and handed down through tn and t.
      tnn = resolve(K, table, covered, tot_panels, ahead(tile, it, 2), lo);
      copy_tile_async<kGatherAsync, kScaled>(K, tnn, bufs + slot2 * kTileBytes, row_scales + 128 * slot2);
    } else if constexpr (kPaired) {
      tn = resolve(K, table, covered, tot_panels, ahead(tile, it, 1), lo);
      if (it & 1) {
        load_pair<plain_source(SRC)>(K, tn, X, Y);  // the next pair's gate tile
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) X[i] = Y[i];  // this pair's up tile
      }
    } else {
      tn = resolve(K, table, covered, tot_panels, ahead(tile, it, 1), lo);
      load_tile<SRC>(K, tn, X);
    }

    // ---- column phase: scales, transposed codes; weights: also the row side ----
    if (t.valid && (TILE || A.col_codes)) {
      uint32_t s_lo = 0, s_hi = 0;
      if (t.in_group) {
        if constexpr (TILE) {
          uint32_t a = s_red[it & 1][0];
#pragma unroll
          for (int k = 1; k < 8; ++k) a = max(a, s_red[it & 1][k]);
          s_lo = s_hi = e8m0_from_amax_bits(a, mode);
        } else {
          uint32_t a2 = part[cp];
#pragma unroll
          for (int k = 1; k < 8; ++k) a2 = __vmaxu2(a2, part[k * 64 + cp]);
          s_lo = e8m0_from_amax_bits(a2 << 16, mode);
          s_hi = e8m0_from_amax_bits(a2 & 0xFFFF0000u, mode);
        }
      }
      if constexpr (TILE) {
        if (A.q != nullptr || A.scale_c != nullptr) {
          // The row side of the one 128x128 quantization: same codes, in x's orientation (read before
          // a staged column store below reuses the buffer).
          const long long row0 = static_cast<long long>(t.b) * A.R + t.r0;
          const int rr = 16 * rho + 2 * w + h;
          if (A.scale_c != nullptr && (j & 1) == 0 && rr < t.rows)
            store_scale_c(A.scale_c + (row0 + rr) * W + 4 * t.ct, s_lo, nj);
          if (A.q != nullptr && cok) {
            uint8_t* qrow = A.q + (row0 + 2 * w + h) * A.C + 128LL * t.ct + 8 * j;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const uint2 qc = codes8(reinterpret_cast<const uint4*>(buf)[(16 * i + 2 * w + h) * 16 + j], s_lo);
              if (16 * i + 2 * w + h < t.rows) *reinterpret_cast<uint2*>(qrow + i * (16LL * A.C)) = qc;
            }
          }
        }
      }
      const int seg = 32 * q4, n = min(32, t.rows - seg);
      const bool mine = n > 0 && 2 * cp < cols;
      // Transposed codes are staged through shared memory and written by whole warps, 128 contiguous
      // bytes per store instruction (v9d: 1.2-1.4x faster than 16-byte stores from each lane, which
      // touch 32 rows per instruction; docs/design/quantize.md).
      const bool has_qt = A.qt != nullptr;  // uniform over the CTA
      // Where staged codes go: x itself (cp.async) has the next tile landing in the other buffer, so
      // this tile's, after a barrier; computed inputs have the other buffer free until the next tile.
      uint8_t* cbuf = kAsync ? buf : bufs + slot1 * kTileBytes;
      uint32_t olo[8], ohi[8];
      if (has_qt && mine) {
        if (t.in_group) {
          const float r_lo = e8m0_recip(s_lo), r_hi = e8m0_recip(s_hi);
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            uint32_t v[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = bw[(seg + 4 * k + e) * 64 + cp];
            olo[k] = cvt_e4m3x2(__fmul_rn(__uint_as_float(v[0] << 16), r_lo), __fmul_rn(__uint_as_float(v[1] << 16), r_lo)) |
                     (cvt_e4m3x2(__fmul_rn(__uint_as_float(v[2] << 16), r_lo), __fmul_rn(__uint_as_float(v[3] << 16), r_lo)) << 16);
            ohi[k] = cvt_e4m3x2(__fmul_rn(__uint_as_float(v[0] & 0xFFFF0000u), r_hi),
                                __fmul_rn(__uint_as_float(v[1] & 0xFFFF0000u), r_hi)) |
                     (cvt_e4m3x2(__fmul_rn(__uint_as_float(v[2] & 0xFFFF0000u), r_hi),
                                 __fmul_rn(__uint_as_float(v[3] & 0xFFFF0000u), r_hi)) << 16);
            olo[k] = s_lo == kE8M0Nan ? 0x7F7F7F7Fu : olo[k];
            ohi[k] = s_hi == kE8M0Nan ? 0x7F7F7F7Fu : ohi[k];
          }
        } else {
          // Rows past the last group: zero codes (their scales are not written; scale 0 elsewhere).
#pragma unroll
          for (int k = 0; k < 8; ++k) olo[k] = ohi[k] = 0;
        }
        if constexpr (!kAsync) stage_codes(cbuf, cp, q4, olo, ohi);  // the free buffer: no barrier first
      }
      // Column scales: each row quarter's byte into s_sc (column cl's 4 runs as one word), written out
      // below by one lane per column.
      if (mine && A.scale_r != nullptr && t.in_group) {
        reinterpret_cast<uint8_t*>(s_sc)[(2 * cp) * 4 + q4] = static_cast<uint8_t>(s_lo);
        reinterpret_cast<uint8_t*>(s_sc)[(2 * cp + 1) * 4 + q4] = static_cast<uint8_t>(s_hi);
      }
      if (has_qt) {
        if constexpr (kAsync) {
          __syncthreads();  // every warp is done with the bf16 tile: its buffer now holds the codes
          if (mine) stage_codes(cbuf, cp, q4, olo, ohi);
        }
        __syncthreads();
        // Each warp writes 16 whole transposed rows. Aligned full panels: 4 rows per store instruction,
        // 16 bytes per lane; otherwise lane l holds bytes 4 l .. 4 l + 3 of a row.
        uint8_t* qt0 = A.qt + (static_cast<long long>(t.b) * A.C + 128LL * t.ct) * A.R + t.r0;
        if (t.rows == 128 && (A.R & 15) == 0 && aligned(qt0, 16)) {
#pragma unroll
          for (int cc = 0; cc < 4; ++cc) {
            const int cl = 16 * w + 4 * cc + (lane >> 3), u = lane & 7;
            if (cl < cols)
              *reinterpret_cast<uint4*>(qt0 + static_cast<long long>(cl) * A.R + 16 * u) =
                  reinterpret_cast<const uint4*>(cbuf)[cl * 8 + (u ^ (cl & 7))];
          }
        } else {
        for (int cc = 0; cc < 16; ++cc) {
          const int cl = 16 * w + cc;
          if (cl >= cols) break;  // uniform over the warp
          const uint32_t word = reinterpret_cast<const uint32_t*>(cbuf)[cl * 32 + (((lane >> 2) ^ (cl & 7)) << 2) + (lane & 3)];
          const uint32_t prev = __shfl_up_sync(kFull, word, 1);
          uint8_t* dst = A.qt + (static_cast<long long>(t.b) * A.C + 128LL * t.ct + cl) * A.R + t.r0;
          store_row_words(dst, word, prev, t.rows, lane);
        }
        }
      }
      if (A.scale_r != nullptr && t.in_group) {
        if (!has_qt) __syncthreads();  // s_sc complete (else: the staging barrier above)
        const int cl = 32 * w + lane;
        const int nruns = min((t.rows + 31) / 32, static_cast<int>(min(4LL, A.n_r - t.run0)));
        if (w < 4 && cl < cols && nruns > 0) {
          uint8_t* d = A.scale_r + (static_cast<long long>(t.b) * A.C + 128LL * t.ct + cl) * A.n_r + t.run0;
          const uint32_t v = s_sc[cl];
          if (nruns == 4 && aligned(d, 4)) {
            *reinterpret_cast<uint32_t*>(d) = v;
          } else {
            for (int e = 0; e < nruns; ++e) d[e] = static_cast<uint8_t>(v >> (8 * e));
          }
        }
        if (!has_qt) __syncthreads();  // s_sc is rewritten by the next tile
      }
      if constexpr (!kAsync) {
        if (has_qt) __syncthreads();  // cbuf is the next tile's buffer
      }
    }
    t = tn;
    if constexpr (kAsync) tn = tnn;
    slot = slot + 1 == kBufs ? 0 : slot + 1;
  }
  if constexpr (kAsync) asm volatile("cp.async.wait_all;\n" ::: "memory");
}

}  // namespace

void launch_tile128_pass(const Tile128Pass& a, int device, cudaStream_t stream) {
  if (a.tma && launch_tile128_weights_sm90(a, device, stream)) return;
  KParams K;
  K.a = a;
  K.grouped = a.offs != nullptr;
  K.row_on = !a.tile && a.row_codes;
  K.P = static_cast<int>(cdiv(a.R, 128) + (K.grouped ? a.G + 1 : 0));
  K.ctiles = static_cast<int>(cdiv(a.C, 128));
  K.tiles = static_cast<long long>(a.B) * K.P * K.ctiles;
  if (K.tiles <= 0) return;
  if (K.tiles > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: too many tiles for one launch");
  // The group cursor of resolve assumes one batch entry (token groups come with a 2D x, api_fused.cpp).
  if (K.grouped && a.B != 1) fail_status(MXMOE_ERR_INVALID_ARGUMENT, "quantize: token groups need B = 1, got ", a.B);
  K.div_per_b = make_fast_div(static_cast<uint32_t>(K.P * K.ctiles));
  K.div_ctiles = make_fast_div(static_cast<uint32_t>(K.ctiles));
  // The kernel instance: weights are tensors; the gathers have their own (cp.async) instances.
  int src = a.tile ? 0 : a.src.kind;
  if (src == MXMOE_SOURCE_GATHER) src = a.src.row_scale == nullptr ? kSourceGatherRaw : kSourceGatherScaled;
  const bool plain = swiglu_is_plain(a.src.act);
  if (src == MXMOE_SOURCE_SWIGLU_BACKWARD && a.src.act.layout == 0 && (a.C / 2) % 128 == 0) {
    src = plain ? kSourceSwigluBwdPairedPlain : kSourceSwigluBwdPaired;
    K.pair_ct = static_cast<int>(a.C / 2 / 128);
    K.div_pair = make_fast_div(static_cast<uint32_t>(K.pair_ct));
  } else if (src == MXMOE_SOURCE_SWIGLU && plain) {
    src = kSourceSwigluPlain;
  }
  const int smem =
      tile_buffers(src) * kTileBytes + 2 * kPartBytes + row_scale_bytes(src) + (K.grouped ? 3 * kTable * 4 : 0);
  static_assert(sizeof(ScanSmem) <= kTileBytes, "the scan scratch lives in the tile buffers");
  auto go = [&](auto kernel) {
    const int blocks = occupancy(kernel, device, kThreads, smem), sms = sm_count(device);
    if (blocks < 1) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: kernel does not fit on the device");
    const long long work = paired_source(src) ? K.tiles / 2 : K.tiles;  // tiles, or (gate, up) pairs
    const long long grid = std::min<long long>(work, static_cast<long long>(blocks) * sms);
    kernel<<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(K);
  };
  switch (src) {
    case 0: a.tile ? go(tile128_pass_kernel<0, true>) : go(tile128_pass_kernel<0, false>); break;
    case kSourceGatherRaw: go(tile128_pass_kernel<kSourceGatherRaw, false>); break;
    case kSourceGatherScaled: go(tile128_pass_kernel<kSourceGatherScaled, false>); break;
    case MXMOE_SOURCE_SWIGLU: go(tile128_pass_kernel<MXMOE_SOURCE_SWIGLU, false>); break;
    case MXMOE_SOURCE_SWIGLU_BACKWARD: go(tile128_pass_kernel<MXMOE_SOURCE_SWIGLU_BACKWARD, false>); break;
    case kSourceSwigluBwdPaired: go(tile128_pass_kernel<kSourceSwigluBwdPaired, false>); break;
    case kSourceSwigluPlain: go(tile128_pass_kernel<kSourceSwigluPlain, false>); break;
    case kSourceSwigluBwdPairedPlain: go(tile128_pass_kernel<kSourceSwigluBwdPairedPlain, false>); break;
    default: fail_status(MXMOE_ERR_INVALID_ARGUMENT, "quantize: unknown source kind ", a.src.kind);
  }
  cuda_check(cudaGetLastError(), "quantize: kernel launch");
}

}  // namespace cuda
}  // namespace mxmoe
