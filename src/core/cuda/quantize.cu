// CUDA MX quantization: one tile kernel serves mxmoe_quantize (1x32, 1x128, 32x1, 128x1, 128x128;
// 2D with token groups or 3D per expert) and mxmoe_quantize_fused (rowwise + columnwise sides from
// one read of x, MX round trip to bf16/f32 in both orientations, scales straight into the blocked
// layout).
//
// Work decomposition (as the CPU core's): a CTA owns one tile of at most 128 rows ("panel") by 128
// columns. Without groups, panels start at multiples of 128. With groups (offs), panels start at
// each group's start and never cross its end, then rows past the last group form "tail" panels;
// the panel of a CTA is found by a block scan of offs on the device (no host sync; offs is
// clamped exactly like groups_from_offsets, so nothing is ever read or written out of bounds).
// Every 32x1/128x1/128x128 block then lies inside one tile, and each 128-row panel x 128-column
// tile maps to exactly one 512-byte block of every blocked scale layout.
//
// Thread layout (512 threads): thread t owns columns 8*(t%16) .. +7 of rows 4*(t/16) .. +3, loaded
// as 16-byte vectors. Rowwise amaxes reduce across 4 (1x32) or 16 (1x128) lanes with shuffles;
// columnwise amaxes reduce over the thread's 4 rows, then across the warp (xor 16) and across warps
// through shared memory. Codes go out as 8-byte stores in x's orientation; transposed outputs are
// staged in a swizzled shared tile and leave as full 4-byte words per lane (128 B per warp).
#include <algorithm>
#include <cstdlib>

#include "common/moe_activation.hpp"
#include "cuda/launch_cache.cuh"
#include "cuda/quant_common.cuh"
#include "cuda/quantize/source.cuh"
#include "cuda/quantize/tile128_bf16.cuh"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {
namespace {

using namespace qk;

constexpr int NT = 512;

struct SideP {
  uint8_t* q = nullptr;
  uint8_t* qt = nullptr;
  uint8_t* scale = nullptr;
  uint8_t* blocked = nullptr;
  void* dq = nullptr;
  void* dqt = nullptr;
  bool dq_f32 = false, dqt_f32 = false;
  int kind = MXMOE_BLOCKED_WHOLE;
  long long blocked_size = 0;
  bool q_vec = false;   // 8-byte stores of q rows
  bool dq_vec = false;  // 16-byte stores of dq rows
  bool sc_vec = false;  // 4-byte stores of scale_c rows (rowwise side)
};

struct Params {
  const void* x = nullptr;
  const int32_t* offs = nullptr;
  long long offs_stride = 1;
  int G = 0;
  int B = 1;
  int R = 0, C = 0;
  int mode = 0;
  int row_block = 0;  // rowwise quantization 1 x row_block (0: none)
  int col_block = 0;  // columnwise quantization col_block x 1 (0: none)
  bool tile = false;  // one 128x128 quantization for both sides
  bool grouped = false;
  bool table = false;  // group table in shared memory (grouped and G <= kMaxTable)
  bool row_on = false, col_on = false;
  SideP row, col;
  long long n_r = 0;
  int P = 0;  // panel slots per batch entry
  int ctiles = 0;
  long long tiles = 0;  // B * P * ctiles
  bool x_vec = false;
  int order = 1;         // tile order: 0 row-major (column tiles fastest), 1 in 8x8 super-tiles
  int stages = 2;        // x tiles in flight per CTA (cp.async pipeline depth)
  int stage_bytes = 0;   // one x tile in shared memory
  int tr_bytes = 0;      // transpose / column-partials region
  // A computed input (mxmoe_quantize_fused_source; tile kernel, direct loads only). x is then the
  // tensor read (gather rows / h), of row stride C (GATHER, SWIGLU_BACKWARD) or 2C (SWIGLU).
  SourceP src{};
};

constexpr int kMaxTable = 512;  // groups whose table fits in shared memory (else a scan per tile)

struct Smem {
  ScanSmem scan;
  long long covered, tot_panels;
  long long g_start, g_end, g_p0, g_b0, g_np;
  int found;
  uint8_t tile_byte;
  uint32_t red[16];
  uint32_t srow[128];  // rowwise scale bytes of the tile: 4 per row (one per 32 columns)
  uint32_t scol[128];  // columnwise scale bytes: 4 per column (one per 32-row run)
};

// One tile: rows [r0, r1) of batch entry b, columns [128 ct, +128).
struct TileInfo {
  int b, p, ct;
  int r0, r1;
  int run0, gp0, gnp;  // first scale_r run of the panel; its group's first panel and panel count
  bool in_group, valid;
};

// ---- element access ----------------------------------------------------------------------------
template <typename In>
struct Frag;

// bf16: 8 values of a row chunk as 4 packed words.
template <>
struct Frag<uint16_t> {
  uint4 w[4];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ void load(int i, const uint16_t* p, int valid, bool vec) {
    if (vec) {
      if (valid >= 8) w[i] = __ldg(reinterpret_cast<const uint4*>(p));
    } else {
      uint32_t h[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) h[e] = e < valid ? static_cast<uint32_t>(__ldg(p + e)) : 0u;
      w[i] = make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16));
    }
  }
  // Row i's chunk from 8 fp32 values, each rounded once to bf16 (f32_to_bf16: the CPU's rounding).
  __device__ __forceinline__ void set(int i, const float (&v)[8]) {
    uint32_t a[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      a[k] = static_cast<uint32_t>(f32_to_bf16(v[2 * k])) | (static_cast<uint32_t>(f32_to_bf16(v[2 * k + 1])) << 16);
    w[i] = make_uint4(a[0], a[1], a[2], a[3]);
  }
  static constexpr int kChunks = 4;  // 16-byte chunks per thread per tile
  __device__ __forceinline__ void load16(int i, int, const uint16_t* p) { w[i] = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void from_smem(const uint8_t* slot) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = reinterpret_cast<const uint4*>(slot)[i * NT + threadIdx.x];
  }
  __device__ __forceinline__ void values(int i, float (&v)[8]) const {
    const uint32_t a[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = __uint_as_float(a[k] << 16);
      v[2 * k + 1] = __uint_as_float(a[k] & 0xFFFF0000u);
    }
  }
  // |x| max of row i's chunk, as fp32 bits (NaN patterns order above everything else).
  __device__ __forceinline__ uint32_t row_amax(int i) const {
    uint32_t m = __vmaxu2(__vmaxu2(w[i].x & 0x7FFF7FFFu, w[i].y & 0x7FFF7FFFu),
                          __vmaxu2(w[i].z & 0x7FFF7FFFu, w[i].w & 0x7FFF7FFFu));
    return max(m << 16, m & 0xFFFF0000u);
  }
  // Per-column |x| max over the 4 rows, fp32 bits, columns 0..7.
  __device__ __forceinline__ void col_amax(uint32_t (&m)[8]) const {
    uint32_t p[4];
    p[0] = p[1] = p[2] = p[3] = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p[0] = __vmaxu2(p[0], w[i].x & 0x7FFF7FFFu);
      p[1] = __vmaxu2(p[1], w[i].y & 0x7FFF7FFFu);
      p[2] = __vmaxu2(p[2], w[i].z & 0x7FFF7FFFu);
      p[3] = __vmaxu2(p[3], w[i].w & 0x7FFF7FFFu);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      m[2 * k] = p[k] << 16;
      m[2 * k + 1] = p[k] & 0xFFFF0000u;
    }
  }
};

template <>
struct Frag<float> {
  float4 w[4][2];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i][0] = w[i][1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __device__ __forceinline__ void load(int i, const float* p, int valid, bool vec) {
    if (vec) {
      if (valid >= 4) w[i][0] = __ldg(reinterpret_cast<const float4*>(p));
      if (valid >= 8) w[i][1] = __ldg(reinterpret_cast<const float4*>(p + 4));
    } else {
      float h[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) h[e] = e < valid ? __ldg(p + e) : 0.f;
      w[i][0] = make_float4(h[0], h[1], h[2], h[3]);
      w[i][1] = make_float4(h[4], h[5], h[6], h[7]);
    }
  }
  __device__ __forceinline__ void set(int i, const float (&v)[8]) {
    w[i][0] = make_float4(v[0], v[1], v[2], v[3]);
    w[i][1] = make_float4(v[4], v[5], v[6], v[7]);
  }
  static constexpr int kChunks = 8;
  __device__ __forceinline__ void load16(int i, int h, const float* p) { w[i][h] = __ldg(reinterpret_cast<const float4*>(p)); }
  __device__ __forceinline__ void from_smem(const uint8_t* slot) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i][0] = reinterpret_cast<const float4*>(slot)[(2 * i) * NT + threadIdx.x];
      w[i][1] = reinterpret_cast<const float4*>(slot)[(2 * i + 1) * NT + threadIdx.x];
    }
  }
  __device__ __forceinline__ void values(int i, float (&v)[8]) const {
    v[0] = w[i][0].x; v[1] = w[i][0].y; v[2] = w[i][0].z; v[3] = w[i][0].w;
    v[4] = w[i][1].x; v[5] = w[i][1].y; v[6] = w[i][1].z; v[7] = w[i][1].w;
  }
  __device__ __forceinline__ uint32_t row_amax(int i) const {
    float v[8];
    values(i, v);
    uint32_t m = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) m = max(m, __float_as_uint(v[e]) & 0x7FFFFFFFu);
    return m;
  }
  __device__ __forceinline__ void col_amax(uint32_t (&m)[8]) const {
#pragma unroll
    for (int e = 0; e < 8; ++e) m[e] = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v[8];
      values(i, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) m[e] = max(m[e], __float_as_uint(v[e]) & 0x7FFFFFFFu);
    }
  }
};

// ---- stores ----------------------------------------------------------------------------------------
// 8 codes of one row chunk in x's orientation.
__device__ __forceinline__ void store_q8(uint8_t* p, uint2 q, int valid, bool vec) {
  if (valid <= 0) return;
  if (vec) {
    *reinterpret_cast<uint2*>(p) = q;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (e < valid) p[e] = static_cast<uint8_t>(((e < 4 ? q.x : q.y) >> (8 * (e & 3))) & 0xFFu);
  }
}

// 8 values of one row chunk as bf16 or f32.
__device__ __forceinline__ void store_f8(void* base, long long off, const float (&f)[8], int valid, bool f32,
                                         bool vec) {
  if (valid <= 0) return;
  if (f32) {
    float* p = static_cast<float*>(base) + off;
    float g[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] = canon_f32(f[e]);
    if (vec) {
      if (valid >= 4) *reinterpret_cast<float4*>(p) = make_float4(g[0], g[1], g[2], g[3]);
      if (valid >= 8) *reinterpret_cast<float4*>(p + 4) = make_float4(g[4], g[5], g[6], g[7]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < valid) p[e] = g[e];
    }
  } else {
    uint16_t* p = static_cast<uint16_t*>(base) + off;
    const uint4 h = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                               pack_bf16x2(f[6], f[7]));
    if (vec) {
      *reinterpret_cast<uint4*>(p) = h;
    } else {
      const uint32_t hw[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < valid) p[e] = static_cast<uint16_t>(hw[e >> 1] >> (16 * (e & 1)));
    }
  }
}

// Transposed store of the tile through shared memory. Thread (rs, cc) gives, for each of its 8
// columns j, its 4 rows' elements of E bytes packed into E words w[j][0..E). Destination element
// (c, r) of the tile (c < cols, r < rows) is at dst + (c * ld + r) * E bytes. Shared rows hold 32
// units of 4*E bytes (one unit per thread row group), XOR-swizzled so that both the scattered
// writes and the row-wise reads are free of bank conflicts. Each warp then writes whole rows as
// 4-byte words (funnel-shifted when the destination row is not 4-byte aligned; edge bytes alone).
template <int E>
__device__ __forceinline__ void transpose_store(uint32_t* sm, uint8_t* dst, long long ld, int rows, int cols,
                                                const uint32_t (&w)[8][E]) {
  constexpr int RW = 32 * E;  // words per shared row
  constexpr int SW = E == 1 ? 2 : 1;
  const int tid = threadIdx.x, cc = tid & 15, rs = tid >> 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t* p = sm + (8 * cc + j) * RW + ((rs ^ (SW * cc)) * E);
    if (E == 1) {
      p[0] = w[j][0];
    } else if (E == 2) {
      *reinterpret_cast<uint2*>(p) = make_uint2(w[j][0], w[j][E > 1 ? 1 : 0]);
    } else {
      *reinterpret_cast<uint4*>(p) = make_uint4(w[j][0], w[j][E > 1 ? 1 : 0], w[j][E > 2 ? 2 : 0], w[j][E > 3 ? 3 : 0]);
    }
  }
  __syncthreads();
  const int warp = tid >> 5, lane = tid & 31;
  const int nbytes = rows * E;
  for (int c = warp; c < cols; c += NT / 32) {
    uint8_t* rowp = dst + static_cast<long long>(c) * ld * E;
    const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(rowp) & 3u);
    uint8_t* al = rowp - shift;
    const int nw = (shift + nbytes + 3) >> 2;
    const uint32_t* srow = sm + c * RW;
    const int swz = SW * ((c >> 3) & 15);
    for (int wi = lane; wi < nw; wi += 32) {
      auto rd = [&](int w) -> uint32_t { return srow[(((w / E) ^ swz) * E) + (w % E)]; };
      uint32_t val;
      if (shift == 0) {
        val = rd(wi);
      } else {
        const uint32_t lo = wi > 0 ? rd(wi - 1) : 0u;
        const uint32_t hi = wi < RW ? rd(wi) : 0u;
        val = __funnelshift_r(lo, hi, 8 * (4 - shift));
      }
      const int k0 = 4 * wi - shift;
      if (k0 >= 0 && k0 + 4 <= nbytes) {
        *reinterpret_cast<uint32_t*>(al + 4 * wi) = val;
      } else {
#pragma unroll
        for (int m = 0; m < 4; ++m)
          if (k0 + m >= 0 && k0 + m < nbytes) al[4 * wi + m] = static_cast<uint8_t>(val >> (8 * m));
      }
    }
  }
  __syncthreads();
}

// 4 rows x 8 codes (one uint2 per row) -> per column j a word of the 4 rows' bytes.
__device__ __forceinline__ void codes_by_column(const uint2 (&q)[4], uint32_t (&w)[8][1]) {
  const uint32_t a01 = __byte_perm(q[0].x, q[1].x, 0x5140), b01 = __byte_perm(q[0].x, q[1].x, 0x7362);
  const uint32_t a23 = __byte_perm(q[2].x, q[3].x, 0x5140), b23 = __byte_perm(q[2].x, q[3].x, 0x7362);
  const uint32_t c01 = __byte_perm(q[0].y, q[1].y, 0x5140), d01 = __byte_perm(q[0].y, q[1].y, 0x7362);
  const uint32_t c23 = __byte_perm(q[2].y, q[3].y, 0x5140), d23 = __byte_perm(q[2].y, q[3].y, 0x7362);
  w[0][0] = __byte_perm(a01, a23, 0x5410);
  w[1][0] = __byte_perm(a01, a23, 0x7632);
  w[2][0] = __byte_perm(b01, b23, 0x5410);
  w[3][0] = __byte_perm(b01, b23, 0x7632);
  w[4][0] = __byte_perm(c01, c23, 0x5410);
  w[5][0] = __byte_perm(c01, c23, 0x7632);
  w[6][0] = __byte_perm(d01, d23, 0x5410);
  w[7][0] = __byte_perm(d01, d23, 0x7632);
}

// ---- tiles -------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait(int pending) {
  if (pending >= 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  else asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Tile index -> rows. Uniform over the CTA; without a shared group table it scans offs (syncs).
__device__ __forceinline__ TileInfo resolve(const Params& P, Smem& sm, const int* table, long long tile) {
  TileInfo t{};
  t.valid = false;
  if (tile >= P.tiles) return t;
  {
    // 32-bit index math (the host guarantees tiles < 2^31).
    const int ti = static_cast<int>(tile), per_b = P.P * P.ctiles;
    t.b = ti / per_b;
    const int u = ti - t.b * per_b;
    if (P.order == 0) {
      t.p = u / P.ctiles;
      t.ct = u - t.p * P.ctiles;
    } else {
      // 8 panels x 8 column tiles per super-tile: x rows are read in 2 KB runs (8 tiles of 256 B)
      // and transposed outputs written in 1 KB runs per row, both DRAM-page friendly.
      const int sp = u / (8 * P.ctiles);
      const int v = u - sp * 8 * P.ctiles;
      const int h = min(8, P.P - 8 * sp);
      const int sc = v / (8 * h);
      const int y = v - sc * 8 * h;
      const int w = min(8, P.ctiles - 8 * sc);
      const int py = y / w;
      t.p = 8 * sp + py;
      t.ct = 8 * sc + (y - py * w);
    }
  }
  if (!P.grouped) {
    t.r0 = 128 * t.p;
    t.r1 = min(P.R, t.r0 + 128);
    t.run0 = t.r0 / 32;
    t.gp0 = 0;
    t.gnp = P.P;
    t.in_group = true;
  } else {
    long long start = 0, end = 0, p0 = 0, b0 = 0, np = 0;
    bool found = false;
    if (P.table) {
      if (t.p < sm.tot_panels) {
        const int* tstart = table;
        const int* tp0 = table + kMaxTable;
        const int* tb0 = table + 2 * kMaxTable;
        const int lo = table_group(tp0, P.G, t.p);
        start = tstart[lo];
        end = lo + 1 < P.G ? tstart[lo + 1] : sm.covered;
        p0 = tp0[lo];
        b0 = tb0[lo];
        np = (lo + 1 < P.G ? tp0[lo + 1] : sm.tot_panels) - p0;
        found = true;
      }
    } else {
      __syncthreads();
      if (threadIdx.x == 0) sm.found = 0;
      const int p = t.p;
      scan_groups<NT>(P.offs, P.offs_stride, P.G, P.R, 0, sm.scan, [&](const GroupInfo& gi) {
        if (p >= gi.p0 && p < gi.p0 + gi.panels) {
          sm.found = 1;
          sm.g_start = gi.start;
          sm.g_end = gi.end;
          sm.g_p0 = gi.p0;
          sm.g_b0 = gi.b0;
          sm.g_np = gi.panels;
        }
      });
      found = sm.found != 0;
      start = sm.g_start;
      end = sm.g_end;
      p0 = sm.g_p0;
      b0 = sm.g_b0;
      np = sm.g_np;
    }
    if (found) {
      t.r0 = static_cast<int>(start + 128 * (t.p - p0));
      t.r1 = static_cast<int>(min(end, static_cast<long long>(t.r0) + 128));
      t.run0 = static_cast<int>(b0 + 4 * (t.p - p0));
      t.gp0 = static_cast<int>(p0);
      t.gnp = static_cast<int>(np);
      t.in_group = true;
    } else {
      const long long r0 = sm.covered + 128 * (t.p - sm.tot_panels);
      t.r0 = static_cast<int>(min(r0, static_cast<long long>(P.R)));
      t.r1 = static_cast<int>(min(static_cast<long long>(P.R), r0 + 128));
      t.in_group = false;
    }
  }
  t.valid = t.r0 < t.r1 && P.C - 128 * t.ct > 0;
  return t;
}

__device__ __forceinline__ bool needs_x(const Params& P, const TileInfo& t) {
  return t.valid && (P.row_block > 0 || ((P.tile || P.col_block > 0) && t.in_group));
}

// Issue this thread's 16-byte copies of tile t into its private slots (zero-filled past the edges).
template <typename In>
__device__ __forceinline__ void prefetch(const Params& P, const TileInfo& t, uint8_t* slot) {
  if (!P.x_vec || !needs_x(P, t)) return;
  const int tid = threadIdx.x, lr0 = 4 * (tid >> 4), lc = 8 * (tid & 15);
  const int rows = t.r1 - t.r0, cvalid = min(128, P.C - 128 * t.ct) - lc;
  const In* xb = static_cast<const In*>(P.x) +
                 ((static_cast<long long>(t.b) * P.R + t.r0) * P.C + 128LL * t.ct + lc);
  constexpr int kPer = 16 / static_cast<int>(sizeof(In));  // elements per 16-byte chunk
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool rok = lr0 + i < rows;
    const In* src = xb + static_cast<long long>(lr0 + i) * P.C;
#pragma unroll
    for (int h = 0; h < 8 / kPer; ++h) {
      const bool ok = rok && cvalid >= kPer * (h + 1);
      cp_async16(slot + ((i * (8 / kPer) + h) * NT + tid) * 16, ok ? static_cast<const void*>(src + kPer * h) : P.x,
                 ok ? 16 : 0);
    }
  }
}

// ---- computed inputs (mxmoe_quantize_fused_source; the SwiGLU values come from quantize/source.cuh) ----
// The thread's chunk (row r, logical columns c .. c+7, cvalid of them valid) of the computed input
// into row i of f: the values the CPU reference materializes (cpu/fused.cpp), bit for bit.
template <typename In>
__device__ __forceinline__ void load_source_row(const Params& P, Frag<In>& f, int i, long long r, long long c,
                                                int cvalid) {
  if (P.src.kind == MXMOE_SOURCE_GATHER) {
    const long long e = gather_entry(P.src, r);
    if (e < 0) return;  // a padding row (or nothing to gather): f's row stays zero
    f.load(i, static_cast<const In*>(P.x) + (e / P.src.k) * P.C + c, cvalid, P.x_vec);
    if (P.src.row_scale != nullptr) {
      const float sc = __ldg(P.src.row_scale + e);
      float v[8];
      f.values(i, v);
#pragma unroll
      for (int q = 0; q < 8; ++q) v[q] = mul_rn(v[q], sc);
      f.set(i, v);
    }
    return;
  }
  // SWIGLU / SWIGLU_BACKWARD: bf16 only, C % 8 == 0 (checked on the host), so cvalid >= 8 here.
  float v[8];
  swiglu_source8(static_cast<const uint16_t*>(P.x), P.C, P.src, r, c, v);
  f.set(i, v);
}

// ---- one tile ---------------------------------------------------------------------------------------
template <typename In>
__device__ __forceinline__ void process_tile(const Params& P, Smem& sm, uint32_t* dsm, const TileInfo& t,
                                             const Frag<In>& f) {
  const int tid = threadIdx.x, cc = tid & 15, rs = tid >> 4, lane = tid & 31, warp = tid >> 5;
  const int b = t.b;
  const long long p = t.p, ct = t.ct;
  const long long c0 = 128 * ct;
  const int r0 = t.r0;
  const int cols = static_cast<int>(min(128LL, P.C - c0));
  const int rows = t.r1 - t.r0;
  const bool in_group = t.in_group;
  const int lr0 = 4 * rs;        // first local row of this thread
  const int lc = 8 * cc;         // first local column
  const int cvalid = cols - lc;  // valid columns of this thread's chunk (<= 0: none)
  const bool col_q = P.tile || P.col_block > 0;
  const bool row_q = P.row_block > 0;

  // ---- rowwise quantization (1 x row_block) ----
  uint2 rq[4];
  uint32_t rsb = 0;  // scale byte of each of the thread's 4 rows (byte i)
  if (row_q) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t m = f.row_amax(i);
      m = max(m, __shfl_xor_sync(kFull, m, 1));
      m = max(m, __shfl_xor_sync(kFull, m, 2));
      if (P.row_block == 128) {
        m = max(m, __shfl_xor_sync(kFull, m, 4));
        m = max(m, __shfl_xor_sync(kFull, m, 8));
      }
      const uint8_t s = e8m0_from_amax_bits(m, static_cast<mxmoe_scale_mode>(P.mode));
      rsb |= static_cast<uint32_t>(s) << (8 * i);
      if (s == kE8M0Nan) {
        rq[i] = make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu);
      } else {
        float v[8], r[8];
        f.values(i, v);
        const float rc = e8m0_reciprocal_f32(s);
#pragma unroll
        for (int e = 0; e < 8; ++e) r[e] = rc;
        rq[i] = quant8(v, r);
      }
    }
  }

  // ---- columnwise / tile quantization ----
  uint2 cq[4];
  uint32_t csb[2] = {0, 0};  // scale byte of each of the thread's 8 columns (byte j&3 of word j>>2)
  if (col_q) {
    if (in_group) {
      uint32_t m[8];
      f.col_amax(m);
#pragma unroll
      for (int e = 0; e < 8; ++e) m[e] = max(m[e], __shfl_xor_sync(kFull, m[e], 16));
      uint32_t* colpart = dsm;  // [16 warps][128 columns]
      if (lane < 16) {
        *reinterpret_cast<uint4*>(colpart + warp * 128 + lc) = make_uint4(m[0], m[1], m[2], m[3]);
        *reinterpret_cast<uint4*>(colpart + warp * 128 + lc + 4) = make_uint4(m[4], m[5], m[6], m[7]);
      }
      __syncthreads();
      uint8_t* scolb = reinterpret_cast<uint8_t*>(sm.scol);
      const mxmoe_scale_mode mode = static_cast<mxmoe_scale_mode>(P.mode);
      if (P.tile) {
        if (tid < 128) {
          uint32_t a = 0;
#pragma unroll
          for (int w = 0; w < 16; ++w) a = max(a, colpart[w * 128 + tid]);
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) a = max(a, __shfl_xor_sync(kFull, a, o));
          if (lane == 0) sm.red[warp] = a;
        }
        __syncthreads();
        const uint8_t s = e8m0_from_amax_bits(max(max(sm.red[0], sm.red[1]), max(sm.red[2], sm.red[3])), mode);
        if (tid == 0) sm.tile_byte = s;
        if (tid < 128) sm.scol[tid] = s * 0x01010101u;
        csb[0] = csb[1] = s * 0x01010101u;
      } else {
        if (P.col_block == 32) {
          const int k = tid >> 7, c = tid & 127;
          const uint32_t a = max(max(colpart[(4 * k) * 128 + c], colpart[(4 * k + 1) * 128 + c]),
                                 max(colpart[(4 * k + 2) * 128 + c], colpart[(4 * k + 3) * 128 + c]));
          scolb[c * 4 + k] = e8m0_from_amax_bits(a, mode);
        } else if (tid < 128) {
          uint32_t a = 0;
#pragma unroll
          for (int w = 0; w < 16; ++w) a = max(a, colpart[w * 128 + tid]);
          sm.scol[tid] = e8m0_from_amax_bits(a, mode) * 0x01010101u;
        }
        __syncthreads();
        // Byte k of the 8 column words (lc..lc+7): the scale of this thread's 32-run.
        const int k = rs >> 3;
        const uint4 a = *reinterpret_cast<const uint4*>(sm.scol + lc);
        const uint4 c = *reinterpret_cast<const uint4*>(sm.scol + lc + 4);
        const uint32_t sel = static_cast<uint32_t>(k | ((k + 4) << 4));  // byte k of x, byte k of y
        csb[0] = __byte_perm(__byte_perm(a.x, a.y, sel), __byte_perm(a.z, a.w, sel), 0x5410);
        csb[1] = __byte_perm(__byte_perm(c.x, c.y, sel), __byte_perm(c.z, c.w, sel), 0x5410);
      }
      // NaN scale bytes (0xFF) -> those columns' codes are 0x7F.
      uint32_t mk[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t z = ~csb[h];  // 0x00 bytes where the scale byte is 0xFF
        mk[h] = __vcmpeq4(z, 0u);
      }
      float r[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) r[j] = e8m0_reciprocal_f32(static_cast<uint8_t>(csb[j >> 2] >> (8 * (j & 3))));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v[8];
        f.values(i, v);
        cq[i] = quant8(v, r);
        cq[i].x = (cq[i].x & ~mk[0]) | (0x7F7F7F7Fu & mk[0]);
        cq[i].y = (cq[i].y & ~mk[1]) | (0x7F7F7F7Fu & mk[1]);
      }
    } else {
      // Rows past the last group: zeros (scale byte 0 dequantizes them to +0).
#pragma unroll
      for (int i = 0; i < 4; ++i) cq[i] = make_uint2(0, 0);
      if (tid < 128) sm.scol[tid] = 0;
      if (P.tile && tid == 0) sm.tile_byte = 0;
    }
    __syncthreads();  // scol / tile_byte visible to every thread
  }

  // ---- outputs of one side ----
  // is_row: rowwise side (scale_c, blocked by rows); else columnwise side (scale_r).
  auto emit = [&](const SideP& S, bool is_row, const uint2(&qd)[4], bool per_row_scale) {
    auto scale_of = [&](int i, int j) -> uint8_t {
      return static_cast<uint8_t>(per_row_scale ? (rsb >> (8 * i)) : (csb[j >> 2] >> (8 * (j & 3))));
    };
    const long long xrow0 = static_cast<long long>(b) * P.R + r0;  // (b, r0) row index in (B*R)
    if (S.q) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (lr0 + i < rows) store_q8(S.q + (xrow0 + lr0 + i) * P.C + c0 + lc, qd[i], cvalid, S.q_vec);
    }
    if (S.dq) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (lr0 + i < rows) {
          uint8_t s8[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) s8[j] = scale_of(i, j);
          float v[8];
          dequant8(qd[i], s8, v);
          store_f8(S.dq, (xrow0 + lr0 + i) * P.C + c0 + lc, v, cvalid, S.dq_f32, S.dq_vec);
        }
      }
    }
    const long long xcol0 = static_cast<long long>(b) * P.C + c0;  // (b, c0) row index in (B*C)
    if (S.qt) {
      uint32_t w[8][1];
      codes_by_column(qd, w);
      transpose_store<1>(dsm, S.qt + xcol0 * P.R + r0, P.R, rows, cols, w);
    }
    if (S.dqt) {
      float v[4][8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint8_t s8[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) s8[j] = scale_of(i, j);
        dequant8(qd[i], s8, v[i]);
      }
      if (S.dqt_f32) {
        uint32_t w[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) w[j][i] = __float_as_uint(canon_f32(v[i][j]));
        transpose_store<4>(dsm, static_cast<uint8_t*>(S.dqt) + (xcol0 * P.R + r0) * 4, P.R, rows, cols, w);
      } else {
        uint32_t w[8][2];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          w[j][0] = pack_bf16x2(v[0][j], v[1][j]);
          w[j][1] = pack_bf16x2(v[2][j], v[3][j]);
        }
        transpose_store<2>(dsm, static_cast<uint8_t*>(S.dqt) + (xcol0 * P.R + r0) * 2, P.R, rows, cols, w);
      }
    }
    if (is_row && (S.scale || S.blocked)) {
      // srow: byte j of row i = scale of columns 32j..32j+31 of the tile.
      if (P.tile) {
        if (tid < 128) sm.srow[tid] = sm.tile_byte * 0x01010101u;
      } else if ((cc & 3) == 0) {
        uint8_t* srowb = reinterpret_cast<uint8_t*>(sm.srow);
#pragma unroll
        for (int i = 0; i < 4; ++i) srowb[(lr0 + i) * 4 + (cc >> 2)] = static_cast<uint8_t>(rsb >> (8 * i));
      }
      __syncthreads();
      const long long W = P.C / 32;
      const int nj = static_cast<int>(min(4LL, W - c0 / 32));
      const uint32_t jmask = nj >= 4 ? 0xFFFFFFFFu : ((1u << (8 * nj)) - 1u);
      if (S.scale && tid < rows) {
        uint8_t* d = S.scale + (xrow0 + tid) * W + c0 / 32;
        const uint32_t val = sm.srow[tid];
        if (S.sc_vec && nj == 4) {
          *reinterpret_cast<uint32_t*>(d) = val;
        } else {
          for (int j = 0; j < nj; ++j) d[j] = static_cast<uint8_t>(val >> (8 * j));
        }
      }
      if (S.blocked && in_group && tid < 128) {
        long long blk;
        if (S.kind == MXMOE_BLOCKED_GROUPS_M) blk = p * P.ctiles + ct;
        else blk = (static_cast<long long>(b) * P.P + p) * P.ctiles + ct;
        const int i = (tid & 3) * 32 + (tid >> 2);
        const uint32_t val = i < rows ? (sm.srow[i] & jmask) : 0u;
        uint8_t* d = S.blocked + blk * 512 + 4 * tid;
        if ((reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
          *reinterpret_cast<uint32_t*>(d) = val;
        } else {
          for (int k = 0; k < 4; ++k) d[k] = static_cast<uint8_t>(val >> (8 * k));
        }
      }
    }
    if (!is_row && in_group && (S.scale || S.blocked)) {
      // scol: byte k of column c = scale of rows 32k..32k+31 of the panel.
      const int nruns = (rows + 31) / 32;
      const uint32_t kmask = nruns >= 4 ? 0xFFFFFFFFu : ((1u << (8 * nruns)) - 1u);
      if (S.scale && tid < cols) {
        uint8_t* d = S.scale + (xcol0 + tid) * P.n_r + t.run0;
        const uint32_t val = sm.scol[tid];
        if (nruns == 4 && (reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
          *reinterpret_cast<uint32_t*>(d) = val;
        } else {
          for (int k = 0; k < nruns; ++k) d[k] = static_cast<uint8_t>(val >> (8 * k));
        }
      }
      if (S.blocked && tid < 128) {
        long long blk;
        if (S.kind == MXMOE_BLOCKED_GROUPS_K) blk = static_cast<long long>(t.gp0) * P.ctiles + ct * t.gnp + (p - t.gp0);
        else blk = (static_cast<long long>(b) * P.ctiles + ct) * P.P + p;
        const int i = (tid & 3) * 32 + (tid >> 2);
        const uint32_t val = i < cols ? (sm.scol[i] & kmask) : 0u;
        uint8_t* d = S.blocked + blk * 512 + 4 * tid;
        if ((reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
          *reinterpret_cast<uint32_t*>(d) = val;
        } else {
          for (int k = 0; k < 4; ++k) d[k] = static_cast<uint8_t>(val >> (8 * k));
        }
      }
    }
  };

  if (P.row_on) {
    if (P.tile) emit(P.row, true, cq, false);  // the rowwise view of the tile quantization
    else emit(P.row, true, rq, true);
  }
  if (P.col_on) emit(P.col, false, cq, false);
}

// ---- the kernel: persistent CTAs, x tiles prefetched with cp.async ----------------------------------
template <typename In, int S>
__global__ void __launch_bounds__(NT, 2) quant_tile_kernel(const __grid_constant__ Params P) {
  extern __shared__ uint4 dyn_smem_[];
  constexpr int kStage = 16 * Frag<In>::kChunks * NT;  // bytes of one x tile
  uint8_t* stage_base = reinterpret_cast<uint8_t*>(dyn_smem_);
  uint32_t* dsm = reinterpret_cast<uint32_t*>(stage_base + S * kStage);
  int* table = reinterpret_cast<int*>(stage_base + S * kStage + P.tr_bytes);
  __shared__ Smem sm;
  const int tid = threadIdx.x;

  // ---- setup: groups (once per CTA), then what no tile writes ----
  if (P.grouped) {
    const ScanTotals tot = scan_groups<NT>(P.offs, P.offs_stride, P.G, P.R, 0, sm.scan, [&](const GroupInfo& gi) {
      if (P.table) {
        table[gi.g] = static_cast<int>(gi.start);
        table[kMaxTable + gi.g] = static_cast<int>(gi.p0);
        table[2 * kMaxTable + gi.g] = static_cast<int>(gi.b0);
      }
    });
    if (tid == 0) {
      sm.covered = tot.covered;
      sm.tot_panels = tot.panels;
    }
    // Unused grouped scale_r entries and the blocked tails, split over all CTAs (2D only).
    if (P.col_on && P.col.scale != nullptr && P.n_r > tot.blocks) {
      long long lo, hi;
      grid_share(P.C, lo, hi);
      for (long long c = lo; c < hi; ++c) zero_bytes_cta<NT>(P.col.scale + c * P.n_r, tot.blocks, P.n_r);
    }
    const long long from = tot.panels * 512 * P.ctiles;
    if (P.row_on && P.row.blocked != nullptr) {
      long long lo, hi;
      grid_share(max(0LL, P.row.blocked_size - from), lo, hi, 16);
      zero_bytes_cta<NT>(P.row.blocked, from + lo, from + hi);
    }
    if (P.col_on && P.col.blocked != nullptr) {
      long long lo, hi;
      grid_share(max(0LL, P.col.blocked_size - from), lo, hi, 16);
      zero_bytes_cta<NT>(P.col.blocked, from + lo, from + hi);
    }
    __syncthreads();
  }

  if (S == 0) {
    // Direct: each tile's x chunks are loaded into registers (16-byte __ldg, all issued first).
    for (long long tile = blockIdx.x; tile < P.tiles; tile += gridDim.x) {
      const TileInfo t = resolve(P, sm, table, tile);
      if (!t.valid) continue;  // uniform
      Frag<In> f;
      f.zero();
      if (needs_x(P, t)) {
        const int lr0 = 4 * (tid >> 4), lc = 8 * (tid & 15);
        const int rows = t.r1 - t.r0, cvalid = min(128, P.C - 128 * t.ct) - lc;
        if (P.src.kind != 0) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (lr0 + i < rows && cvalid > 0) load_source_row<In>(P, f, i, t.r0 + lr0 + i, 128LL * t.ct + lc, cvalid);
        } else {
          const In* xb = static_cast<const In*>(P.x) +
                         ((static_cast<long long>(t.b) * P.R + t.r0) * P.C + 128LL * t.ct + lc);
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (lr0 + i < rows && cvalid > 0) f.load(i, xb + static_cast<long long>(lr0 + i) * P.C, cvalid, P.x_vec);
        }
      }
      process_tile<In>(P, sm, dsm, t, f);
      __syncthreads();  // shared scratch (scales, partials, transposes) is reused by the next tile
    }
    return;
  }
  // ---- pipeline: S-1 tiles in flight ahead of the one being processed (cp.async) ----
  constexpr int SS = S > 1 ? S : 2;
  const long long step = gridDim.x;
#pragma unroll
  for (int s = 0; s < SS - 1; ++s) {
    const TileInfo tn = resolve(P, sm, table, blockIdx.x + s * step);
    prefetch<In>(P, tn, stage_base + s * kStage);
    cp_async_commit();
  }
  int slot = 0;
  for (long long tile = blockIdx.x; tile < P.tiles; tile += step) {
    const TileInfo t = resolve(P, sm, table, tile);
    cp_async_wait(SS - 2);
    Frag<In> f;
    f.zero();
    if (needs_x(P, t)) {
      if (P.x_vec) {
        f.from_smem(stage_base + slot * kStage);
      } else {
        const int lr0 = 4 * (tid >> 4), lc = 8 * (tid & 15);
        const int rows = t.r1 - t.r0, cvalid = min(128, P.C - 128 * t.ct) - lc;
        const In* xb = static_cast<const In*>(P.x) +
                       ((static_cast<long long>(t.b) * P.R + t.r0) * P.C + 128LL * t.ct + lc);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (lr0 + i < rows && cvalid > 0) f.load(i, xb + static_cast<long long>(lr0 + i) * P.C, cvalid, false);
      }
    }
    {
      const int nslot = slot + SS - 1 >= SS ? slot - 1 : slot + SS - 1;  // (slot + S - 1) % S
      const TileInfo tn = resolve(P, sm, table, tile + (SS - 1) * step);
      prefetch<In>(P, tn, stage_base + nslot * kStage);
      cp_async_commit();
    }
    if (t.valid) process_tile<In>(P, sm, dsm, t, f);
    slot = slot + 1 == SS ? 0 : slot + 1;
    __syncthreads();  // shared scratch (scales, partials, transposes) is reused by the next tile
  }
  cp_async_wait(0);
}

// ---- 32-row slabs: 128-thread CTAs for every blocking whose blocks span at most 32 rows ---------
// (rowwise 1x32 / 1x128 with transposed or blocked outputs, columnwise 32x1, both sides fused).
// Same thread layout as the tile kernel (4 rows x 8 columns per thread) on a 32 x 128 tile, so a
// CTA is 4 warps: its barriers stall 4 warps, and ~8 CTAs per SM overlap each other's barrier
// phases and loads. A slab is one 32-row run: slabs start at group starts (one scale_r run each).
// Blocked scales: a slab fills one quarter (q) of a 128-row band's 512-byte blocks; the last slab of
// a band segment zero-fills the quarters after it.
constexpr int NS = 128;  // threads per slab CTA

struct SlabInfo {
  int b, p, ct;
  int r0, r1;
  int run;       // scale_r run of the slab (global, grouped compact index)
  int band, q;   // 128-row band of the slab within its segment, quarter 0..3
  int gp0, gnp;  // segment's first 128-row panel (blocked base) and its panel count
  bool last;     // last slab of its segment (zero-fills the band's later quarters)
  bool in_group, valid;
};

struct SlabSmem {
  ScanSmem scan;
  long long covered, tot_panels, tot_runs;
  uint32_t srow[32];   // rowwise scale bytes: 4 per row
  uint8_t scol[128];   // columnwise scale byte per column
};

// tile_cols: width of the column tiles P.ctiles counts (128 for the slab kernel, 64 for warp tiles).
template <typename PT>
__device__ __forceinline__ SlabInfo resolve_slab(const PT& P, SlabSmem& sm, const int* table, long long tile,
                                                 int tile_cols = 128) {
  SlabInfo t{};
  t.valid = false;
  if (tile >= P.tiles) return t;
  {
    // Row-major over (batch, slab, column tile): 32-bit math, the host keeps tiles < 2^31.
    const int ti = static_cast<int>(tile);
    const int pc = ti / P.ctiles;
    t.ct = ti - pc * P.ctiles;
    t.b = pc / P.P;
    t.p = pc - t.b * P.P;
  }
  if (!P.grouped) {
    t.r0 = 32 * t.p;
    t.r1 = min(P.R, t.r0 + 32);
    t.run = t.p;
    t.band = t.p >> 2;
    t.q = t.p & 3;
    t.gp0 = 0;
    t.gnp = (P.R + 127) / 128;
    t.last = t.r1 == P.R;
    t.in_group = true;
  } else if (t.p < sm.tot_runs) {
    const int* tstart = table;
    const int* tp0 = table + kMaxTable;
    const int* tb0 = table + 2 * kMaxTable;
    const int lo = table_group(tb0, P.G, t.p);  // groups by their first 32-row run
    const long long start = tstart[lo];
    const long long end = lo + 1 < P.G ? tstart[lo + 1] : sm.covered;
    const int j = t.p - tb0[lo];
    const int nruns = (lo + 1 < P.G ? tb0[lo + 1] : static_cast<int>(sm.tot_runs)) - tb0[lo];
    t.r0 = static_cast<int>(start + 32LL * j);
    t.r1 = static_cast<int>(min(end, static_cast<long long>(t.r0) + 32));
    t.run = t.p;
    t.band = j >> 2;
    t.q = j & 3;
    t.last = j == nruns - 1;
    t.gp0 = tp0[lo];
    t.gnp = (lo + 1 < P.G ? tp0[lo + 1] : static_cast<int>(sm.tot_panels)) - tp0[lo];
    t.in_group = true;
  } else {
    const long long r0 = sm.covered + 32LL * (t.p - sm.tot_runs);
    t.r0 = static_cast<int>(min(r0, static_cast<long long>(P.R)));
    t.r1 = static_cast<int>(min(static_cast<long long>(P.R), r0 + 32));
    t.in_group = false;
  }
  t.valid = t.r0 < t.r1 && P.C - static_cast<long long>(tile_cols) * t.ct > 0;
  return t;
}

// Transposed store of a 32 x 128 slab: shared row c holds the slab's 32 elements of column c
// (E bytes each, rows in order, rows padded to an odd word count); the CTA then writes each
// destination row as 4-byte words (funnel-shifted when the row start is not 4-byte aligned).
template <int E>
__device__ __forceinline__ void transpose_slab(uint32_t* sm, uint8_t* dst, long long ld, int rows, int cols,
                                               const uint32_t (&w)[8][E]) {
  constexpr int RWS = 8 * E + 1;  // shared words per row
  constexpr int NWM = 8 * E + 1;  // destination words per row at most (a shifted start adds one)
  const int tid = threadIdx.x, cc = tid & 15, rs = tid >> 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t* p = sm + (8 * cc + j) * RWS + rs * E;
#pragma unroll
    for (int e = 0; e < E; ++e) p[e] = w[j][e];
  }
  __syncthreads();
  const int nbytes = rows * E;
  if ((reinterpret_cast<uintptr_t>(dst) & 3u) == 0 && ((ld * E) & 3) == 0) {
    // Every destination row starts 4-byte aligned: thread t writes word t % (8E) of rows
    // t / (8E) + k * (NS / 8E), whole words except a partial last one.
    constexpr int WPR = 8 * E, RPS = NS / WPR;
    const int wi = tid % WPR;
    const int k0 = 4 * wi;
    for (int c = tid / WPR; c < cols; c += RPS) {
      if (k0 >= nbytes) continue;
      uint8_t* d = dst + static_cast<long long>(c) * ld * E + k0;
      const uint32_t val = sm[c * RWS + wi];
      if (k0 + 4 <= nbytes) {
        *reinterpret_cast<uint32_t*>(d) = val;
      } else {
        for (int m = 0; k0 + m < nbytes; ++m) d[m] = static_cast<uint8_t>(val >> (8 * m));
      }
    }
    __syncthreads();
    return;
  }
  for (int idx = tid; idx < cols * NWM; idx += NS) {
    const int c = idx / NWM, wi = idx - c * NWM;
    uint8_t* rowp = dst + static_cast<long long>(c) * ld * E;
    const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(rowp) & 3u);
    const int nw = (shift + nbytes + 3) >> 2;
    if (wi >= nw) continue;
    uint8_t* al = rowp - shift;
    const uint32_t* srow = sm + c * RWS;
    uint32_t val;
    if (shift == 0) {
      val = srow[wi];
    } else {
      const uint32_t lo = wi > 0 ? srow[wi - 1] : 0u;
      const uint32_t hi = wi < 8 * E ? srow[wi] : 0u;
      val = __funnelshift_r(lo, hi, 8 * (4 - shift));
    }
    const int k0 = 4 * wi - shift;
    if (k0 >= 0 && k0 + 4 <= nbytes) {
      *reinterpret_cast<uint32_t*>(al + 4 * wi) = val;
    } else {
#pragma unroll
      for (int m = 0; m < 4; ++m)
        if (k0 + m >= 0 && k0 + m < nbytes) al[4 * wi + m] = static_cast<uint8_t>(val >> (8 * m));
    }
  }
  __syncthreads();
}

template <typename In>
__device__ __forceinline__ void process_slab(const Params& P, SlabSmem& sm, uint32_t* dsm, const SlabInfo& t,
                                             const Frag<In>& f) {
  const int tid = threadIdx.x, cc = tid & 15, rs = tid >> 4, lane = tid & 31, warp = tid >> 5;
  const int b = t.b;
  const long long ct = t.ct, c0 = 128 * ct;
  const int r0 = t.r0, rows = t.r1 - t.r0;
  const int cols = static_cast<int>(min(128LL, P.C - c0));
  const bool in_group = t.in_group;
  const int lr0 = 4 * rs, lc = 8 * cc, cvalid = cols - lc;
  const bool row_q = P.row_block > 0, col_q = P.col_block > 0;
  const mxmoe_scale_mode mode = static_cast<mxmoe_scale_mode>(P.mode);

  uint2 rq[4];
  uint32_t rsb = 0;
  if (row_q) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t m = f.row_amax(i);
      m = max(m, __shfl_xor_sync(kFull, m, 1));
      m = max(m, __shfl_xor_sync(kFull, m, 2));
      if (P.row_block == 128) {
        m = max(m, __shfl_xor_sync(kFull, m, 4));
        m = max(m, __shfl_xor_sync(kFull, m, 8));
      }
      const uint8_t s = e8m0_from_amax_bits(m, mode);
      rsb |= static_cast<uint32_t>(s) << (8 * i);
      if (s == kE8M0Nan) {
        rq[i] = make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu);
      } else {
        float v[8], r[8];
        f.values(i, v);
        const float rc = e8m0_reciprocal_f32(s);
#pragma unroll
        for (int e = 0; e < 8; ++e) r[e] = rc;
        rq[i] = quant8(v, r);
      }
    }
  }

  uint2 cq[4];
  uint32_t csb[2] = {0, 0};
  if (col_q) {
    if (in_group) {
      uint32_t m[8];
      f.col_amax(m);
#pragma unroll
      for (int e = 0; e < 8; ++e) m[e] = max(m[e], __shfl_xor_sync(kFull, m[e], 16));
      uint32_t* colpart = dsm;  // [4 warps][128 columns]
      if (lane < 16) {
        *reinterpret_cast<uint4*>(colpart + warp * 128 + lc) = make_uint4(m[0], m[1], m[2], m[3]);
        *reinterpret_cast<uint4*>(colpart + warp * 128 + lc + 4) = make_uint4(m[4], m[5], m[6], m[7]);
      }
      __syncthreads();
      {
        const uint32_t a = max(max(colpart[tid], colpart[128 + tid]), max(colpart[256 + tid], colpart[384 + tid]));
        sm.scol[tid] = e8m0_from_amax_bits(a, mode);
      }
      __syncthreads();
      const uint2 cw = *reinterpret_cast<const uint2*>(sm.scol + lc);
      csb[0] = cw.x;
      csb[1] = cw.y;
      uint32_t mk[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) mk[h] = __vcmpeq4(~csb[h], 0u);
      float r[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) r[j] = e8m0_reciprocal_f32(static_cast<uint8_t>(csb[j >> 2] >> (8 * (j & 3))));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v[8];
        f.values(i, v);
        cq[i] = quant8(v, r);
        cq[i].x = (cq[i].x & ~mk[0]) | (0x7F7F7F7Fu & mk[0]);
        cq[i].y = (cq[i].y & ~mk[1]) | (0x7F7F7F7Fu & mk[1]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) cq[i] = make_uint2(0, 0);
    }
  }

  auto emit = [&](const SideP& S, bool is_row, const uint2(&qd)[4]) {
    // Decoded scales: per row (rowwise) or per column (columnwise).
    auto scales_of = [&](int i, float (&sf)[8]) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        sf[j] = e8m0_to_f32(static_cast<uint8_t>(is_row ? (rsb >> (8 * i)) : (csb[j >> 2] >> (8 * (j & 3)))));
    };
    const long long xrow0 = static_cast<long long>(b) * P.R + r0;
    if (S.q) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (lr0 + i < rows) store_q8(S.q + (xrow0 + lr0 + i) * P.C + c0 + lc, qd[i], cvalid, S.q_vec);
    }
    if (S.dq) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (lr0 + i < rows) {
          float sf[8], v[8];
          scales_of(i, sf);
          dequant8f(qd[i], sf, v);
          store_f8(S.dq, (xrow0 + lr0 + i) * P.C + c0 + lc, v, cvalid, S.dq_f32, S.dq_vec);
        }
      }
    }
    const long long xcol0 = static_cast<long long>(b) * P.C + c0;
    if (S.qt) {
      uint32_t w[8][1];
      codes_by_column(qd, w);
      transpose_slab<1>(dsm, S.qt + xcol0 * P.R + r0, P.R, rows, cols, w);
    }
    if (S.dqt) {
      float v[4][8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sf[8];
        scales_of(i, sf);
        dequant8f(qd[i], sf, v[i]);
      }
      if (S.dqt_f32) {
        uint32_t w[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) w[j][i] = __float_as_uint(canon_f32(v[i][j]));
        transpose_slab<4>(dsm, static_cast<uint8_t*>(S.dqt) + (xcol0 * P.R + r0) * 4, P.R, rows, cols, w);
      } else {
        uint32_t w[8][2];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          w[j][0] = pack_bf16x2(v[0][j], v[1][j]);
          w[j][1] = pack_bf16x2(v[2][j], v[3][j]);
        }
        transpose_slab<2>(dsm, static_cast<uint8_t*>(S.dqt) + (xcol0 * P.R + r0) * 2, P.R, rows, cols, w);
      }
    }
    if (is_row && (S.scale || S.blocked)) {
      if ((cc & 3) == 0) {
        uint8_t* srowb = reinterpret_cast<uint8_t*>(sm.srow);
#pragma unroll
        for (int i = 0; i < 4; ++i) srowb[(lr0 + i) * 4 + (cc >> 2)] = static_cast<uint8_t>(rsb >> (8 * i));
      }
      __syncthreads();
      const long long W = P.C / 32;
      const int nj = static_cast<int>(min(4LL, W - c0 / 32));
      const uint32_t jmask = nj >= 4 ? 0xFFFFFFFFu : ((1u << (8 * nj)) - 1u);
      if (S.scale && tid < rows) {
        uint8_t* d = S.scale + (xrow0 + tid) * W + c0 / 32;
        const uint32_t val = sm.srow[tid];
        if (S.sc_vec && nj == 4) *reinterpret_cast<uint32_t*>(d) = val;
        else
          for (int j = 0; j < nj; ++j) d[j] = static_cast<uint8_t>(val >> (8 * j));
      }
      if (S.blocked && in_group && tid < 32) {
        // Word 4r + q of the band's block holds row 32q + r (4 scale bytes); later quarters of the
        // last slab's band are padding.
        long long blk;
        if (S.kind == MXMOE_BLOCKED_GROUPS_M) blk = static_cast<long long>(t.gp0 + t.band) * P.ctiles + ct;
        else blk = (static_cast<long long>(b) * ((P.R + 127) / 128) + t.band) * P.ctiles + ct;
        uint8_t* base = S.blocked + blk * 512;
        const uint32_t val = tid < rows ? (sm.srow[tid] & jmask) : 0u;
        for (int qq = t.q; qq < (t.last ? 4 : t.q + 1); ++qq) {
          uint8_t* d = base + 4 * (4 * tid + qq);
          const uint32_t vv = qq == t.q ? val : 0u;
          if ((reinterpret_cast<uintptr_t>(d) & 3u) == 0) *reinterpret_cast<uint32_t*>(d) = vv;
          else
            for (int k = 0; k < 4; ++k) d[k] = static_cast<uint8_t>(vv >> (8 * k));
        }
      }
      __syncthreads();
    }
    if (!is_row && in_group && (S.scale || S.blocked)) {
      if (S.scale && tid < cols) S.scale[(xcol0 + tid) * P.n_r + t.run] = sm.scol[tid];
      if (S.blocked) {
        // Byte q of word t holds column (t & 3) * 32 + (t >> 2) of the band's run q.
        long long blk;
        if (S.kind == MXMOE_BLOCKED_GROUPS_K) blk = static_cast<long long>(t.gp0) * P.ctiles + ct * t.gnp + t.band;
        else blk = (static_cast<long long>(b) * P.ctiles + ct) * ((P.R + 127) / 128) + t.band;
        const int i = (tid & 3) * 32 + (tid >> 2);
        uint8_t* d = S.blocked + blk * 512 + 4 * tid;
        d[t.q] = i < cols ? sm.scol[i] : 0;
        if (t.last)
          for (int qq = t.q + 1; qq < 4; ++qq) d[qq] = 0;
      }
    }
  };

  if (P.row_on) emit(P.row, true, rq);
  if (P.col_on) emit(P.col, false, cq);
}

template <typename In>
__global__ void __launch_bounds__(NS, 6) quant_slab_kernel(const __grid_constant__ Params P) {
  extern __shared__ uint4 dyn_smem_[];
  uint32_t* dsm = reinterpret_cast<uint32_t*>(dyn_smem_);
  int* table = reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(dyn_smem_) + P.tr_bytes);
  __shared__ SlabSmem sm;
  const int tid = threadIdx.x;
  if (P.grouped) {
    const ScanTotals tot = scan_groups<NS>(P.offs, P.offs_stride, P.G, P.R, 0, sm.scan, [&](const GroupInfo& gi) {
      table[gi.g] = static_cast<int>(gi.start);
      table[kMaxTable + gi.g] = static_cast<int>(gi.p0);
      table[2 * kMaxTable + gi.g] = static_cast<int>(gi.b0);
    });
    if (tid == 0) {
      sm.covered = tot.covered;
      sm.tot_panels = tot.panels;
      sm.tot_runs = tot.blocks;
    }
    if (P.col_on && P.col.scale != nullptr && P.n_r > tot.blocks) {
      long long lo, hi;
      grid_share(P.C, lo, hi);
      for (long long c = lo; c < hi; ++c) zero_bytes_cta<NS>(P.col.scale + c * P.n_r, tot.blocks, P.n_r);
    }
    const long long from = tot.panels * 512 * P.ctiles;
    if (P.row_on && P.row.blocked != nullptr) {
      long long lo, hi;
      grid_share(max(0LL, P.row.blocked_size - from), lo, hi, 16);
      zero_bytes_cta<NS>(P.row.blocked, from + lo, from + hi);
    }
    if (P.col_on && P.col.blocked != nullptr) {
      long long lo, hi;
      grid_share(max(0LL, P.col.blocked_size - from), lo, hi, 16);
      zero_bytes_cta<NS>(P.col.blocked, from + lo, from + hi);
    }
    __syncthreads();
  }
  for (long long tile = blockIdx.x; tile < P.tiles; tile += gridDim.x) {
    const SlabInfo t = resolve_slab(P, sm, table, tile);
    if (!t.valid) continue;  // uniform
    Frag<In> f;
    f.zero();
    if (P.row_block > 0 || (P.col_block > 0 && t.in_group)) {
      const int lr0 = 4 * (tid >> 4), lc = 8 * (tid & 15);
      const int rows = t.r1 - t.r0, cvalid = min(128, P.C - 128 * t.ct) - lc;
      const In* xb = static_cast<const In*>(P.x) + ((static_cast<long long>(t.b) * P.R + t.r0) * P.C + 128LL * t.ct + lc);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (lr0 + i < rows && cvalid > 0) f.load(i, xb + static_cast<long long>(lr0 + i) * P.C, cvalid, P.x_vec);
    }
    process_slab<In>(P, sm, dsm, t, f);
    __syncthreads();
  }
}

// ---- columnwise 32x1 (with or without 1x32 rowwise): the warp-tile kernel --------------------------
// Version 6 (docs/perf/quantize.md). The slab kernel above is issue-bound: CTA-wide barriers, the
// scale bookkeeping in shared memory and a shared transpose cost ~40 instructions per element. Here
// a warp owns a 32-row x 64-column tile outright: lane (rh = lane / 16, cq = lane % 16) holds rows
// 16 rh .. +15, columns 4 cq .. +3 (16 x 8-byte loads, all issued first). A column's 32-row amax is
// the lane's own 16 rows plus one xor-16 shuffle; a row's 1x32 amax is 8 lanes (3 shuffles, two rows
// per packed word). Codes and round-trip values in x's orientation leave as 4 / 8-byte stores per
// row; transposed outputs leave from registers (each lane holds 16 consecutive rows of its columns:
// one 16-byte store per column when aligned, funnel-shifted 4-byte words otherwise). No shared
// memory besides the group table, no barriers after the CTA's one-time offs scan.
constexpr int NW = 256;  // threads per warp-tile CTA (8 independent warps)

// 4 bf16 values (2 packed words) of one row, column j of the lane's 4.
__device__ __forceinline__ float wt_val(uint2 w, int j) {
  const uint32_t a = j < 2 ? w.x : w.y;
  return __uint_as_float((j & 1) ? (a & 0xFFFF0000u) : (a << 16));
}

// |x| max of the row's 4 values per half: (max(c0, c2), max(c1, c3)) as bf16 bits.
__device__ __forceinline__ uint32_t wt_absmax2(uint2 w) { return __vmaxu2(w.x & 0x7FFF7FFFu, w.y & 0x7FFF7FFFu); }

// Codes of 4 values with per-value reciprocals.
__device__ __forceinline__ uint32_t wt_quant4(uint2 w, const float (&r)[4]) {
  return cvt_e4m3x2(__fmul_rn(wt_val(w, 0), r[0]), __fmul_rn(wt_val(w, 1), r[1])) |
         (cvt_e4m3x2(__fmul_rn(wt_val(w, 2), r[2]), __fmul_rn(wt_val(w, 3), r[3])) << 16);
}

// bf16 round-trip values (2 packed words) of 4 codes with decoded scales.
__device__ __forceinline__ uint2 wt_dequant4(uint32_t q, const float (&sf)[4]) {
  float v0, v1, v2, v3;
  e4m3x2_to_f32(q & 0xFFFFu, v0, v1);
  e4m3x2_to_f32(q >> 16, v2, v3);
  return make_uint2(pack_bf16x2(__fmul_rn(v0, sf[0]), __fmul_rn(v1, sf[1])),
                    pack_bf16x2(__fmul_rn(v2, sf[2]), __fmul_rn(v3, sf[3])));
}

// Writes one column's transposed segment: nbytes (<= 32 E) bytes at seg, of which this lane holds
// bytes [16 E rh, 16 E rh + 16 E) as 4E little-endian words u; partner_last is the rh = 0 lane's
// last word (the rh = 1 lane needs it when seg is not 4-byte aligned). Bytes past nbytes belong to
// the next slab (or group) and are never touched.
template <int E>
__device__ __forceinline__ void wt_store_segment(uint8_t* seg, int nbytes, int rh, const uint32_t (&u)[4 * E],
                                                 uint32_t partner_last) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(seg);
  if ((addr & 15u) == 0 && nbytes == 32 * E) {
    uint4* d = reinterpret_cast<uint4*>(seg + 16 * E * rh);
#pragma unroll
    for (int e = 0; e < E; ++e) d[e] = make_uint4(u[4 * e], u[4 * e + 1], u[4 * e + 2], u[4 * e + 3]);
    return;
  }
  const int s = static_cast<int>(addr & 3u);
  uint8_t* al = seg - s;
  const int k0 = rh ? 4 * E : 0;
  // Aligned word k of the cover holds segment bytes [4k - s, 4k - s + 4): bytes 4-s..3 of source
  // word k-1 and bytes 0..3-s of source word k. The rh = 1 lane also writes the cover's last word.
#pragma unroll
  for (int kk = 0; kk <= 4 * E; ++kk) {
    if (kk == 4 * E && rh == 0) break;
    const uint32_t lo = kk == 0 ? (rh ? partner_last : 0u) : u[kk - 1];
    const uint32_t hi = kk < 4 * E ? u[kk] : 0u;
    const uint32_t val = s == 0 ? hi : __funnelshift_r(lo, hi, 8 * (4 - s));
    const int k = k0 + kk, o = 4 * k - s;
    if (o >= 0 && o + 4 <= nbytes) {
      *reinterpret_cast<uint32_t*>(al + 4 * k) = val;
    } else {
#pragma unroll
      for (int m = 0; m < 4; ++m)
        if (o + m >= 0 && o + m < nbytes) al[4 * k + m] = static_cast<uint8_t>(val >> (8 * m));
    }
  }
}

// MINB: CTAs per SM the register budget is cut for (2: 128 registers, 3: 85, 4: 64; the kernel is
// latency-bound, docs/perf/quantize.md version 6).
// 8-byte asynchronous copy global -> shared (src_bytes 0: zero-fill, nothing read).
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, int src_bytes) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(gmem), "r"(src_bytes) : "memory");
}
constexpr int kWarpTileBytes = 32 * 64 * 2;  // one bf16 32 x 64 tile

// PIPE: each warp copies its next tile into a 2-stage shared ring (cp.async) while it computes the
// current one, so its loads stay in flight during the compute phase (version 7).
template <int MINB, bool PIPE>
__global__ void __launch_bounds__(NW, MINB) quant_warp_kernel(const __grid_constant__ Params P) {
  extern __shared__ uint4 dyn_smem_[];
  int* table = reinterpret_cast<int*>(dyn_smem_);
  uint8_t* ring = reinterpret_cast<uint8_t*>(dyn_smem_) + (P.grouped ? 3 * kMaxTable * 4 : 0) +
                  (threadIdx.x >> 5) * 2 * kWarpTileBytes;
  __shared__ SlabSmem sm;
  const int tid = threadIdx.x;
  if (P.grouped) {
    const ScanTotals tot = scan_groups<NW>(P.offs, P.offs_stride, P.G, P.R, 0, sm.scan, [&](const GroupInfo& gi) {
      table[gi.g] = static_cast<int>(gi.start);
      table[kMaxTable + gi.g] = static_cast<int>(gi.p0);
      table[2 * kMaxTable + gi.g] = static_cast<int>(gi.b0);
    });
    if (tid == 0) {
      sm.covered = tot.covered;
      sm.tot_panels = tot.panels;
      sm.tot_runs = tot.blocks;
    }
    if (P.col_on && P.col.scale != nullptr && P.n_r > tot.blocks) {
      long long lo, hi;
      grid_share(P.C, lo, hi);
      for (long long c = lo; c < hi; ++c) zero_bytes_cta<NW>(P.col.scale + c * P.n_r, tot.blocks, P.n_r);
    }
    __syncthreads();
  }
  const int lane = tid & 31, rh = lane >> 4, cq = lane & 15;
  const mxmoe_scale_mode mode = static_cast<mxmoe_scale_mode>(P.mode);
  const long long warps = static_cast<long long>(gridDim.x) * (NW / 32);
  // The warp's tiles: every warps-th from its first, invalid ones (uniform per warp) skipped.
  auto next_valid = [&](long long& tl) {
    SlabInfo s{};
    for (; tl < P.tiles; tl += warps) {
      s = resolve_slab(P, sm, table, tl, 64);
      if (s.valid) return s;
    }
    s.valid = false;
    return s;
  };
  // Lane (rh, cq) copies / reads rows 16 rh .. +15, bytes 8 cq .. +7 of each 128-byte tile row.
  auto issue = [&](const SlabInfo& s, int stage) {
    const int rows = s.r1 - s.r0, c = 64 * s.ct + 4 * cq, lr = 16 * rh;
    const bool live = (P.row_on || (P.col_on && s.in_group)) && c < P.C;
    const uint16_t* xb = static_cast<const uint16_t*>(P.x) + ((static_cast<long long>(s.b) * P.R + s.r0 + lr) * P.C + c);
    uint8_t* dst = ring + stage * kWarpTileBytes + lr * 128 + 8 * cq;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const bool v = live && lr + i < rows;
      cp_async8(dst + i * 128, v ? static_cast<const void*>(xb + i * static_cast<long long>(P.C)) : P.x, v ? 8 : 0);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  long long tile = static_cast<long long>(blockIdx.x) * (NW / 32) + (tid >> 5);
  SlabInfo t = next_valid(tile);
  int stage = 0;
  if (PIPE && t.valid) issue(t, 0);
  while (t.valid) {
    long long tile_n = tile + warps;
    const SlabInfo tn = next_valid(tile_n);
    const int rows = t.r1 - t.r0;
    const int c = 64 * t.ct + 4 * cq;  // the lane's first column
    const bool cvalid = c < P.C;       // C % 8 == 0: a lane's 4 columns are all valid or none
    const int lr = 16 * rh;            // the lane's first row in the slab
    const long long xrow0 = static_cast<long long>(t.b) * P.R + t.r0;
    const bool col_live = P.col_on && t.in_group;
    uint2 w[16];
    if (PIPE) {
      if (tn.valid) issue(tn, stage ^ 1);
      else asm volatile("cp.async.commit_group;\n" ::: "memory");  // keep one group per iteration
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");     // t's copies (this lane's own) landed
      const uint8_t* src = ring + stage * kWarpTileBytes + lr * 128 + 8 * cq;
#pragma unroll
      for (int i = 0; i < 16; ++i) w[i] = *reinterpret_cast<const uint2*>(src + i * 128);
    } else {
      const bool need_x = P.row_on || col_live;
      const uint16_t* xb = static_cast<const uint16_t*>(P.x) + (xrow0 + lr) * P.C + c;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        w[i] = (need_x && cvalid && lr + i < rows) ? __ldg(reinterpret_cast<const uint2*>(xb + i * static_cast<long long>(P.C)))
                                                     : make_uint2(0u, 0u);
    }

    // Column side: scales of the lane's 4 columns over the slab's 32 rows.
    uint8_t cs[4] = {0, 0, 0, 0};
    float crc[4], csf[4];
    uint32_t cnan = 0;  // 0xFF bytes where a column's scale is NaN
    if (P.col_on) {
      uint32_t ax = 0, ay = 0;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        ax = __vmaxu2(ax, w[i].x & 0x7FFF7FFFu);
        ay = __vmaxu2(ay, w[i].y & 0x7FFF7FFFu);
      }
      ax = __vmaxu2(ax, __shfl_xor_sync(kFull, ax, 16));
      ay = __vmaxu2(ay, __shfl_xor_sync(kFull, ay, 16));
      const uint32_t m[4] = {ax << 16, ax & 0xFFFF0000u, ay << 16, ay & 0xFFFF0000u};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        cs[j] = col_live ? e8m0_from_amax_bits(m[j], mode) : 0;
        crc[j] = e8m0_reciprocal_f32(cs[j]);
        csf[j] = e8m0_to_f32(cs[j]);
        if (cs[j] == kE8M0Nan) cnan |= 0xFFu << (8 * j);
      }
    }

    // Row side state: the scale bytes of rows 2k, 2k+1 (k = cq % 8), written by this lane.
    uint32_t my_rs = 0;
    const int k8 = cq & 7;
    const SideP& RS = P.row;
    const SideP& CS = P.col;
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const long long xr = xrow0 + lr + i;  // x row of w[i]
      if (P.row_on) {
        const uint32_t t0 = wt_absmax2(w[i]), t1 = wt_absmax2(w[i + 1]);
        uint32_t m = __vmaxu2(__byte_perm(t0, t1, 0x5410), __byte_perm(t0, t1, 0x7632));
        m = __vmaxu2(m, __shfl_xor_sync(kFull, m, 1));
        m = __vmaxu2(m, __shfl_xor_sync(kFull, m, 2));
        m = __vmaxu2(m, __shfl_xor_sync(kFull, m, 4));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint8_t s = e8m0_from_amax_bits(h ? (m & 0xFFFF0000u) : (m << 16), mode);
          if ((i >> 1) == k8) my_rs |= static_cast<uint32_t>(s) << (8 * h);
          if (!cvalid || lr + i + h >= rows) continue;
          const float rc = e8m0_reciprocal_f32(s);
          const float r4[4] = {rc, rc, rc, rc};
          const uint32_t q = s == kE8M0Nan ? 0x7F7F7F7Fu : wt_quant4(w[i + h], r4);
          if (RS.q) *reinterpret_cast<uint32_t*>(RS.q + (xr + h) * P.C + c) = q;
          if (RS.dq) {
            const float sf = e8m0_to_f32(s);
            const float s4[4] = {sf, sf, sf, sf};
            *reinterpret_cast<uint2*>(static_cast<uint16_t*>(RS.dq) + (xr + h) * P.C + c) = wt_dequant4(q, s4);
          }
        }
      }
      if (P.col_on && (CS.q || CS.dq)) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!cvalid || lr + i + h >= rows) continue;
          uint32_t q = 0;
          uint2 dq = make_uint2(0u, 0u);
          if (col_live) {
            q = wt_quant4(w[i + h], crc);
            q = (q & ~cnan) | (0x7F7F7F7Fu & cnan);
            if (CS.dq) dq = wt_dequant4(q, csf);
          }
          if (CS.q) *reinterpret_cast<uint32_t*>(CS.q + (xr + h) * P.C + c) = q;
          if (CS.dq) *reinterpret_cast<uint2*>(static_cast<uint16_t*>(CS.dq) + (xr + h) * P.C + c) = dq;
        }
      }
    }
    if (P.row_on && RS.scale && cvalid) {
      // Lane k of each 8-lane group writes its block's scale for rows 2k, 2k+1 of its half.
      const long long W = P.C / 32;
      const int r = lr + 2 * k8;
      uint8_t* d = RS.scale + (xrow0 + r) * W + c / 32;
      if (r < rows) d[0] = static_cast<uint8_t>(my_rs);
      if (r + 1 < rows) d[W] = static_cast<uint8_t>(my_rs >> 8);
    }

    if (P.col_on) {
      const long long xcol0 = static_cast<long long>(t.b) * P.C + c;  // the lane's first column in qt rows
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (CS.qt) {
          uint32_t u[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            uint32_t v = cvt_e4m3x2(__fmul_rn(wt_val(w[4 * k], j), crc[j]), __fmul_rn(wt_val(w[4 * k + 1], j), crc[j])) |
                         (cvt_e4m3x2(__fmul_rn(wt_val(w[4 * k + 2], j), crc[j]), __fmul_rn(wt_val(w[4 * k + 3], j), crc[j])) << 16);
            if ((cnan >> (8 * j)) & 1u) v = 0x7F7F7F7Fu;
            u[k] = col_live ? v : 0u;
          }
          const uint32_t pl = __shfl_xor_sync(kFull, u[3], 16);
          if (cvalid) wt_store_segment<1>(CS.qt + (xcol0 + j) * P.R + t.r0, rows, rh, u, pl);
        }
        if (CS.dqt) {
          uint32_t u[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            uint32_t q2 = cvt_e4m3x2(__fmul_rn(wt_val(w[2 * k], j), crc[j]), __fmul_rn(wt_val(w[2 * k + 1], j), crc[j]));
            if ((cnan >> (8 * j)) & 1u) q2 = 0x7F7Fu;
            float v0, v1;
            e4m3x2_to_f32(q2, v0, v1);
            u[k] = col_live ? pack_bf16x2(__fmul_rn(v0, csf[j]), __fmul_rn(v1, csf[j])) : 0u;
          }
          const uint32_t pl = __shfl_xor_sync(kFull, u[7], 16);
          if (cvalid)
            wt_store_segment<2>(static_cast<uint8_t*>(CS.dqt) + ((xcol0 + j) * P.R + t.r0) * 2, 2 * rows, rh, u, pl);
        }
      }
      if (CS.scale && col_live && cvalid) {
        // rh = 0 writes columns 0, 1 of the lane's 4, rh = 1 columns 2, 3.
        CS.scale[(xcol0 + 2 * rh) * P.n_r + t.run] = rh ? cs[2] : cs[0];
        CS.scale[(xcol0 + 2 * rh + 1) * P.n_r + t.run] = rh ? cs[3] : cs[1];
      }
    }
    tile = tile_n;
    t = tn;
    stage ^= 1;
  }
}

// ---- dequantize along R (32x1 blocks, compact scales, bf16 out): warp tiles ------------------------
// The exact recipe's backward dequantizes W along N and A along M per token group (sm90.py). The
// 128x128-tile dequant kernel (quant_dequant.cu) reads 16 scattered scale bytes per thread and, with
// groups, scans offs in every CTA: 0.2-0.4 of copy in the e2e profile. Here, as in the warp-tile
// quantizer: persistent CTAs scan offs once; a warp owns a 32-row slab x 128 columns; lane
// (rh, cq) holds rows 16 rh .. +15 of columns 8 cq .. +7 (8-byte code loads, 16-byte bf16 stores)
// and its 8 columns' scale bytes of the slab's run. Positions outside every group are written 0.
struct DqWarpParams {
  const uint8_t* q = nullptr;
  const uint8_t* scale = nullptr;
  uint16_t* out = nullptr;
  const int32_t* offs = nullptr;
  long long offs_stride = 1;
  int G = 0, B = 1, R = 0, C = 0;
  long long n_r = 0;  // scale's last dim
  bool grouped = false;
  int P = 0, ctiles = 0;
  long long tiles = 0;
};

template <int MINB>
__global__ void __launch_bounds__(NW, MINB) dequant_warp_kernel(const __grid_constant__ DqWarpParams P) {
  extern __shared__ uint4 dyn_smem_[];
  int* table = reinterpret_cast<int*>(dyn_smem_);
  __shared__ SlabSmem sm;
  const int tid = threadIdx.x;
  if (P.grouped) {
    const ScanTotals tot = scan_groups<NW>(P.offs, P.offs_stride, P.G, P.R, 0, sm.scan, [&](const GroupInfo& gi) {
      table[gi.g] = static_cast<int>(gi.start);
      table[kMaxTable + gi.g] = static_cast<int>(gi.p0);
      table[2 * kMaxTable + gi.g] = static_cast<int>(gi.b0);
    });
    if (tid == 0) {
      sm.covered = tot.covered;
      sm.tot_panels = tot.panels;
      sm.tot_runs = tot.blocks;
    }
    __syncthreads();
  }
  const int lane = tid & 31, rh = lane >> 4, cq = lane & 15;
  const long long warps = static_cast<long long>(gridDim.x) * (NW / 32);
  for (long long tile = static_cast<long long>(blockIdx.x) * (NW / 32) + (tid >> 5); tile < P.tiles; tile += warps) {
    const SlabInfo t = resolve_slab(P, sm, table, tile, 128);
    if (!t.valid) continue;  // warp-uniform
    const int rows = t.r1 - t.r0, lr = 16 * rh;
    const int c = 128 * t.ct + 8 * cq;
    if (c >= P.C) continue;  // C % 8 == 0: the lane's 8 columns are all valid or none
    const long long xrow0 = static_cast<long long>(t.b) * P.R + t.r0 + lr;
    uint16_t* out = P.out + xrow0 * P.C + c;
    if (!t.in_group) {
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if (lr + i < rows) *reinterpret_cast<uint4*>(out + i * static_cast<long long>(P.C)) = make_uint4(0, 0, 0, 0);
      continue;
    }
    uint2 qv[16];
    const uint8_t* qp = P.q + xrow0 * P.C + c;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      qv[i] = lr + i < rows ? __ldg(reinterpret_cast<const uint2*>(qp + i * static_cast<long long>(P.C))) : make_uint2(0, 0);
    float sf[8];
    {
      const uint8_t* sp = P.scale + (static_cast<long long>(t.b) * P.C + c) * P.n_r + t.run;
#pragma unroll
      for (int j = 0; j < 8; ++j) sf[j] = e8m0_to_f32(__ldg(sp + j * P.n_r));
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (lr + i >= rows) continue;
      float v[8];
      dequant8f(qv[i], sf, v);
      *reinterpret_cast<uint4*>(out + i * static_cast<long long>(P.C)) =
          make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
    }
  }
}

// ---- rowwise-only requests: a streaming kernel --------------------------------------------------
// Blocks of 1x32 / 1x128 along C are runs of 32 / 128 consecutive elements of the flat tensor
// (C % 32 == 0; C % 128 == 0 for 1x128), so q, scale_c and dq need no row index at all: chunk k
// (8 elements) has codes at 8k, its 32-run's scale at k/4. Each warp takes 4 x 32 consecutive
// chunks per step (16-byte loads, all four issued first); no shared memory, no barriers.
struct RowParams {
  const void* x;
  uint8_t* q;
  uint8_t* scale;
  void* dq;
  bool dq_f32;
  long long nchunks;
  int mode;
};

template <typename In>
__device__ __forceinline__ void rows_load(const RowParams& P, long long base, Frag<In>& f) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(In));  // elements per 16-byte load
  const int lane = threadIdx.x & 31;
  f.zero();
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const long long k = base + 32 * u + lane;
    if (k < P.nchunks) {
      const In* src = static_cast<const In*>(P.x) + 8 * k;
#pragma unroll
      for (int h = 0; h < 8 / kPer; ++h) f.load16(u, h, src + kPer * h);
    }
  }
}

// PF: software pipelining, the next step's loads are issued before this step's math and stores.
template <typename In, int BLK, bool PF>
__global__ void __launch_bounds__(256, PF ? 3 : 4) quant_rows_kernel(const __grid_constant__ RowParams P) {
  constexpr int U = 4;
  const int lane = threadIdx.x & 31;
  const long long warp0 = (static_cast<long long>(blockIdx.x) * 256 + threadIdx.x) >> 5;
  const long long nwarps = static_cast<long long>(gridDim.x) * 8;
  const long long stride = nwarps * (32 * U);
  const mxmoe_scale_mode mode = static_cast<mxmoe_scale_mode>(P.mode);
  Frag<In> nxt;
  if (PF) rows_load<In>(P, warp0 * (32 * U), nxt);
  for (long long base = warp0 * (32 * U); base < P.nchunks; base += stride) {
    Frag<In> f;
    if (PF) {
      f = nxt;
      if (base + stride < P.nchunks) rows_load<In>(P, base + stride, nxt);
    } else {
      rows_load<In>(P, base, f);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = base + 32 * u + lane;
      uint32_t m = f.row_amax(u);
      m = max(m, __shfl_xor_sync(kFull, m, 1));
      m = max(m, __shfl_xor_sync(kFull, m, 2));
      if (BLK == 128) {
        m = max(m, __shfl_xor_sync(kFull, m, 4));
        m = max(m, __shfl_xor_sync(kFull, m, 8));
      }
      if (k >= P.nchunks) continue;
      const uint8_t sb = e8m0_from_amax_bits(m, mode);
      uint2 q;
      if (sb == kE8M0Nan) {
        q = make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu);
      } else {
        float v[8], r[8];
        f.values(u, v);
        const float rc = e8m0_reciprocal_f32(sb);
#pragma unroll
        for (int e = 0; e < 8; ++e) r[e] = rc;
        q = quant8(v, r);
      }
      if (P.q) *reinterpret_cast<uint2*>(P.q + 8 * k) = q;
      if (P.scale && (k & 3) == 0) P.scale[k >> 2] = sb;
      if (P.dq) {
        float sf[8], v[8];
        const float sc = e8m0_to_f32(sb);
#pragma unroll
        for (int e = 0; e < 8; ++e) sf[e] = sc;
        dequant8f(q, sf, v);
        store_f8(P.dq, 8 * k, v, 8, P.dq_f32, true);
      }
    }
  }
}

// ---- host ----------------------------------------------------------------------------------------------
void fill_side(SideP& s, const OptTensor& q, const OptTensor& qt, const OptTensor& scale,
               const OptTensor& blocked, mxmoe_blocked_kind kind, const OptTensor& dq, const OptTensor& dqt,
               int64_t C) {
  s.q = q.present ? static_cast<uint8_t*>(q.t.data) : nullptr;
  s.qt = qt.present ? static_cast<uint8_t*>(qt.t.data) : nullptr;
  s.scale = scale.present ? static_cast<uint8_t*>(scale.t.data) : nullptr;
  s.blocked = blocked.present ? static_cast<uint8_t*>(blocked.t.data) : nullptr;
  s.blocked_size = blocked.present ? blocked.t.shape[0] : 0;
  s.kind = kind;
  s.dq = dq.present ? dq.t.data : nullptr;
  s.dqt = dqt.present ? dqt.t.data : nullptr;
  s.dq_f32 = dq.present && dq.t.dtype == MXMOE_DTYPE_F32;
  s.dqt_f32 = dqt.present && dqt.t.dtype == MXMOE_DTYPE_F32;
  s.q_vec = s.q == nullptr || (aligned(s.q, 8) && C % 8 == 0);
  s.dq_vec = s.dq == nullptr || (aligned(s.dq, 16) && C % (s.dq_f32 ? 4 : 8) == 0);
  s.sc_vec = s.scale == nullptr || (aligned(s.scale, 4) && (C / 32) % 4 == 0);
}

template <typename In>
void launch_typed(Params& p, int device, cudaStream_t stream) {
  if (p.tiles <= 0) return;
  int e = 0;
  for (const SideP* s : {&p.row, &p.col}) {
    if (s->qt) e = std::max(e, 1);
    if (s->dqt) e = std::max(e, s->dqt_f32 ? 4 : 2);
  }
  p.tr_bytes = std::max(8192, e * 16384);
  p.stage_bytes = 16 * Frag<In>::kChunks * NT;
  const int table_bytes = p.table ? 3 * kMaxTable * 4 : 0;
  const int sms = sm_count(device);
  auto occupancy = [&](auto kernel, int stages) {
    return cuda::occupancy(kernel, device, NT, stages * p.stage_bytes + p.tr_bytes + table_bytes);
  };
  // Default: direct register loads (stages = 0; measured faster than the cp.async pipeline, see
  // docs/perf/quantize.md). MXMOE_QUANT_STAGES=2|3 selects the cp.async pipeline (measurements).
  static const int forced = [] {
    const char* e = std::getenv("MXMOE_QUANT_STAGES");
    return e ? std::atoi(e) : 0;
  }();
  static int max_smem_cached = -1;  // the same for every device of one machine (H200s)
  int max_smem = max_smem_cached;
  if (max_smem < 0) {
    cuda_check(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "quantize: attribute");
    max_smem_cached = max_smem;
  }
  const int fixed = p.tr_bytes + table_bytes + static_cast<int>(sizeof(Smem));
  p.stages = p.src.kind != 0 ? 0 : forced;  // computed inputs: direct loads only
  if (p.stages == 3 && 3 * p.stage_bytes + fixed > max_smem) p.stages = 2;
  if (p.stages != 0 && p.stages != 3) p.stages = 2;
  int blocks = 0;
  if (p.stages == 3) blocks = occupancy(quant_tile_kernel<In, 3>, 3);
  else if (p.stages == 2) blocks = occupancy(quant_tile_kernel<In, 2>, 2);
  else blocks = occupancy(quant_tile_kernel<In, 0>, 0);
  if (blocks < 1) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: kernel does not fit on the device");
  const int smem = p.stages * p.stage_bytes + p.tr_bytes + table_bytes;
  const long long grid = std::min<long long>(p.tiles, static_cast<long long>(blocks) * sms);
  if (p.stages == 3) quant_tile_kernel<In, 3><<<static_cast<unsigned>(grid), NT, smem, stream>>>(p);
  else if (p.stages == 2) quant_tile_kernel<In, 2><<<static_cast<unsigned>(grid), NT, smem, stream>>>(p);
  else quant_tile_kernel<In, 0><<<static_cast<unsigned>(grid), NT, smem, stream>>>(p);
  cuda_check(cudaGetLastError(), "quantize: kernel launch");
}

// The tile128 recipe's passes (quantize/tile128_bf16.cu): bf16 x (or a bf16 computed input), 16-byte
// aligned rows of C % 8 == 0 elements, at most kMaxTable groups, compact scales only; rowwise 1x128
// codes and/or columnwise 128x1 transposed codes, or the 128x128 tile quantization (codes in either
// orientation, both scale layouts). MXMOE_QUANT_TILE128=0 keeps them on the general kernels (A/B runs).
bool run_tile128_pass(const Params& p, const mxmoe_tensor& x, int device, cudaStream_t stream) {
  static const int env = [] {
    const char* e = std::getenv("MXMOE_QUANT_TILE128");
    return e ? std::atoi(e) : 1;
  }();
  if (!env || x.dtype != MXMOE_DTYPE_BF16 || !p.x_vec || (p.grouped && !p.table)) return false;
  if (!p.row_on && !p.col_on) return false;
  const SideP &r = p.row, &c = p.col;
  auto plain = [](const SideP& sd) { return !sd.blocked && !sd.dq && !sd.dqt && (!sd.q || aligned(sd.q, 8)); };
  if ((p.row_on && !plain(r)) || (p.col_on && !plain(c))) return false;
  Tile128Pass a;
  if (p.tile) {
    if (p.src.kind != 0) return false;  // weights are tensors; a computed input stays on the tile kernel
    if (p.col_on && c.q) return false;  // codes in x's orientation come from the row side only
    if (p.row_on && p.col_on && r.qt && c.qt) return false;
    a.q = p.row_on ? r.q : nullptr;
    a.qt = p.row_on && r.qt ? r.qt : (p.col_on ? c.qt : nullptr);
    a.scale_c = p.row_on ? r.scale : nullptr;
    a.scale_r = p.col_on ? c.scale : nullptr;
  } else {
    if (p.row_on && (p.row_block != 128 || r.qt)) return false;
    if (p.col_on && (p.col_block != 128 || c.q)) return false;
    a.row_codes = p.row_on;
    a.col_codes = p.col_on;
    if (p.row_on) a.q = r.q, a.scale_c = r.scale;
    if (p.col_on) a.qt = c.qt, a.scale_r = c.scale;
  }
  a.x = p.x;
  a.B = p.B;
  a.R = p.R;
  a.C = p.C;
  a.offs = p.grouped ? p.offs : nullptr;
  a.offs_stride = p.offs_stride;
  a.G = p.grouped ? p.G : 0;
  a.mode = p.mode;
  a.tile = p.tile;
  a.n_r = p.n_r;
  a.src = p.src;
  launch_tile128_pass(a, device, stream);
  return true;
}

void launch(Params& p, const mxmoe_tensor& x, const OptTensor& offs, void* stream) {
  if (x.shape[1] >= (int64_t{1} << 31) - 256 || x.shape[2] >= (int64_t{1} << 31) - 256)
    fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: dims of 2^31 elements and more are not supported on CUDA");
  p.x = x.data;
  p.B = static_cast<int>(x.shape[0]);
  p.R = static_cast<int>(x.shape[1]);
  p.C = static_cast<int>(x.shape[2]);
  p.offs = offs.present ? static_cast<const int32_t*>(offs.t.data) : nullptr;
  p.G = offs.present ? static_cast<int>(offs.t.shape[0]) : 0;
  p.offs_stride = offs.present ? offs.t.strides[0] : 1;
  if (!p.grouped) {
    p.offs = nullptr;
    p.G = 0;
  }
  p.table = p.grouped && p.G <= kMaxTable;
  p.P = static_cast<int>(cdiv(p.R, 128) + (p.grouped ? p.G + 1 : 0));
  p.ctiles = static_cast<int>(cdiv(p.C, 128));
  p.tiles = static_cast<long long>(p.B) * p.P * p.ctiles;
  const bool bf16 = x.dtype == MXMOE_DTYPE_BF16;
  p.x_vec = aligned(x.data, 16) && p.C % (bf16 ? 8 : 4) == 0;
  DeviceGuard guard(x.device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  static const int stream_env = [] {
    const char* e = std::getenv("MXMOE_QUANT_STREAM");
    return e ? std::atoi(e) : 1;
  }();
  static const int order_env = [] {
    const char* e = std::getenv("MXMOE_QUANT_ORDER");
    return e ? std::atoi(e) : 1;
  }();
  p.order = order_env;
  if (p.src.kind != 0) {
    // Computed inputs: the tile128 pass kernel where it takes the request, else the tile kernel
    // (every blocking, both sides, one pass).
    if (run_tile128_pass(p, x, x.device, s)) return;
    if (p.tiles > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: too many tiles for one launch");
    if (bf16) launch_typed<uint16_t>(p, x.device, s);
    else launch_typed<float>(p, x.device, s);
    return;
  }
  // Rowwise only, outputs in x's orientation, aligned: the streaming kernel.
  const SideP& r = p.row;
  if (stream_env && p.row_on && !p.col_on && !p.tile && p.row_block > 0 && !r.qt && !r.dqt && !r.blocked &&
      p.x_vec && (p.row_block == 32 || p.C % 128 == 0) && (!r.q || aligned(r.q, 8)) && (!r.dq || aligned(r.dq, 16))) {
    RowParams rp{x.data, r.q, r.scale, r.dq, r.dq_f32, static_cast<long long>(p.B) * p.R * (p.C / 8), p.mode};
    if (rp.nchunks == 0) return;
    auto go = [&](auto kernel) {
      const int blocks = occupancy(kernel, x.device, 256, 0), sms = sm_count(x.device);
      const long long need = cdiv(rp.nchunks, 8 * 32 * 4);
      const long long grid = std::max(1LL, std::min(need, static_cast<long long>(std::max(1, blocks)) * sms));
      kernel<<<static_cast<unsigned>(grid), 256, 0, s>>>(rp);
      cuda_check(cudaGetLastError(), "quantize: kernel launch");
    };
    const bool pf = stream_env != 2;  // MXMOE_QUANT_STREAM=2: no software pipelining (measurements)
    if (bf16) {
      if (p.row_block == 32) pf ? go(quant_rows_kernel<uint16_t, 32, true>) : go(quant_rows_kernel<uint16_t, 32, false>);
      else pf ? go(quant_rows_kernel<uint16_t, 128, true>) : go(quant_rows_kernel<uint16_t, 128, false>);
    } else {
      if (p.row_block == 32) pf ? go(quant_rows_kernel<float, 32, true>) : go(quant_rows_kernel<float, 32, false>);
      else pf ? go(quant_rows_kernel<float, 128, true>) : go(quant_rows_kernel<float, 128, false>);
    }
    return;
  }
  if (run_tile128_pass(p, x, x.device, s)) return;
  static const int warp_env = [] {
    const char* e = std::getenv("MXMOE_QUANT_WARP");
    return e ? std::atoi(e) : 1;
  }();
  // 32x1 columnwise (optionally with 1x32 rowwise in x's orientation), bf16 in, compact scales: the
  // warp-tile kernel. Transposed outputs may have any alignment (handled on the device).
  auto warp_side_ok = [](const SideP& sd, bool row_side) {
    if (sd.blocked || sd.dq_f32 || sd.dqt_f32) return false;
    if (row_side && (sd.qt || sd.dqt)) return false;
    return (!sd.q || aligned(sd.q, 4)) && (!sd.dq || aligned(sd.dq, 8));
  };
  // Default route (measured, docs/perf/quantize.md version 6): only requests whose column side is
  // round trips in x's orientation (the sm90 exact recipe's dY pass), where the warp-tile kernel
  // beat the slab kernel on every shape; codes and transposed outputs stay on the slab kernel
  // (equal or better there, 2x better with jagged groups). MXMOE_QUANT_WARP=2|3|4 sends every
  // eligible request here (A/B runs), 0 none.
  const bool warp_default = !p.col.q && !p.col.qt && !p.col.dqt;
  if (warp_env && (warp_env >= 2 || warp_default) && bf16 && aligned(x.data, 8) && p.C % 8 == 0 && !p.tile &&
      p.col_on && p.col_block == 32 &&
      warp_side_ok(p.col, false) &&
      (!p.row_on || (p.row_block == 32 && p.C % 32 == 0 && warp_side_ok(p.row, true))) && (!p.grouped || p.table)) {
    p.P = static_cast<int>(cdiv(p.R, 32) + (p.grouped ? p.G + 1 : 0));
    p.ctiles = static_cast<int>(cdiv(p.C, 64));
    p.tiles = static_cast<long long>(p.B) * p.P * p.ctiles;
    if (p.tiles <= 0) return;
    if (p.tiles > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: too many tiles for one launch");
    // MXMOE_QUANT_WARP_PIPE=0: direct register loads instead of the cp.async ring (measurements).
    static const int pipe_env = [] {
      const char* e = std::getenv("MXMOE_QUANT_WARP_PIPE");
      return e ? std::atoi(e) : 1;
    }();
    const bool pipe = pipe_env != 0;
    const int smem = (p.table ? 3 * kMaxTable * 4 : 0) + (pipe ? (NW / 32) * 2 * kWarpTileBytes : 0);
    auto go = [&](auto kernel) {
      const int blocks = occupancy(kernel, x.device, NW, smem), sms = sm_count(x.device);
      if (blocks < 1) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: kernel does not fit on the device");
      const long long grid = std::min<long long>(cdiv(p.tiles, NW / 32), static_cast<long long>(blocks) * sms);
      kernel<<<static_cast<unsigned>(grid), NW, smem, s>>>(p);
      cuda_check(cudaGetLastError(), "quantize: kernel launch");
    };
    // CTAs-per-SM register budget: 2 by default (3 measured equal, 4 spills and is slower).
    if (pipe) go(quant_warp_kernel<2, true>);
    else if (warp_env == 3) go(quant_warp_kernel<3, false>);
    else if (warp_env == 4) go(quant_warp_kernel<4, false>);
    else go(quant_warp_kernel<2, false>);
    return;
  }
  static const int slab_env = [] {
    const char* e = std::getenv("MXMOE_QUANT_SLAB");
    return e ? std::atoi(e) : 1;
  }();
  // Blocks of at most 32 rows (no 128x1, no 128x128) and a group table that fits: 32-row slabs.
  if (slab_env && !p.tile && p.col_block != 128 && (!p.grouped || p.table)) {
    p.P = static_cast<int>(cdiv(p.R, 32) + (p.grouped ? p.G + 1 : 0));
    p.tiles = static_cast<long long>(p.B) * p.P * p.ctiles;
    if (p.tiles <= 0) return;
    if (p.tiles > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: too many tiles for one launch");
    int e = 0;
    for (const SideP* sd : {&p.row, &p.col}) {
      if (sd->qt) e = std::max(e, 1);
      if (sd->dqt) e = std::max(e, sd->dqt_f32 ? 4 : 2);
    }
    p.tr_bytes = std::max(2048, e == 0 ? 0 : 128 * (8 * e + 1) * 4);
    const int smem = p.tr_bytes + (p.table ? 3 * kMaxTable * 4 : 0);
    auto go = [&](auto kernel) {
      const int blocks = occupancy(kernel, x.device, NS, smem), sms = sm_count(x.device);
      if (blocks < 1) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: kernel does not fit on the device");
      const long long grid = std::min<long long>(p.tiles, static_cast<long long>(blocks) * sms);
      kernel<<<static_cast<unsigned>(grid), NS, smem, s>>>(p);
      cuda_check(cudaGetLastError(), "quantize: kernel launch");
    };
    if (bf16) go(quant_slab_kernel<uint16_t>);
    else go(quant_slab_kernel<float>);
    return;
  }
  if (p.tiles > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: too many tiles for one launch");
  if (bf16) launch_typed<uint16_t>(p, x.device, s);
  else launch_typed<float>(p, x.device, s);
}

}  // namespace

// Dequantize along R to bf16 with warp tiles (see dequant_warp_kernel); false when the request is
// not one it takes (the caller then runs the 128x128-tile kernel). MXMOE_DEQUANT_WARP=0 disables it
// (A/B measurements).
bool dequantize_along_r_warp(const DequantizeArgs& a) {
  static const int env = [] {
    const char* e = std::getenv("MXMOE_DEQUANT_WARP");
    return e ? std::atoi(e) : 1;
  }();
  const int64_t B = a.q.shape[0], R = a.q.shape[1], C = a.q.shape[2];
  const bool grouped = a.offs.present;
  if (!env || a.axis != 0 || a.out.dtype != MXMOE_DTYPE_BF16 || C % 8 != 0 || !aligned(a.q.data, 8) ||
      !aligned(a.out.data, 16) || (grouped && a.offs.t.shape[0] > kMaxTable) || R >= (int64_t{1} << 31) - 256 ||
      C >= (int64_t{1} << 31) - 256)
    return false;
  DqWarpParams p;
  p.q = static_cast<const uint8_t*>(a.q.data);
  p.scale = static_cast<const uint8_t*>(a.scale.data);
  p.out = static_cast<uint16_t*>(a.out.data);
  p.grouped = grouped;
  p.offs = grouped ? static_cast<const int32_t*>(a.offs.t.data) : nullptr;
  p.offs_stride = grouped ? a.offs.t.strides[0] : 1;
  p.G = grouped ? static_cast<int>(a.offs.t.shape[0]) : 0;
  p.B = static_cast<int>(B);
  p.R = static_cast<int>(R);
  p.C = static_cast<int>(C);
  p.n_r = a.scale.shape[2];
  p.P = static_cast<int>(cdiv(R, 32) + (grouped ? p.G + 1 : 0));
  p.ctiles = static_cast<int>(cdiv(C, 128));
  p.tiles = B * p.P * p.ctiles;
  if (p.tiles <= 0) return true;
  if (p.tiles > 0x7FFFFFFFLL) return false;
  DeviceGuard guard(a.q.device);
  const int smem = grouped ? 3 * kMaxTable * 4 : 0;
  const int blocks = occupancy(dequant_warp_kernel<3>, a.q.device, NW, smem), sms = sm_count(a.q.device);
  if (blocks < 1) return false;
  const long long grid = std::min<long long>(cdiv(p.tiles, NW / 32), static_cast<long long>(blocks) * sms);
  dequant_warp_kernel<3><<<static_cast<unsigned>(grid), NW, smem, static_cast<cudaStream_t>(a.stream)>>>(p);
  cuda_check(cudaGetLastError(), "dequantize: kernel launch");
  return true;
}

void quantize(const QuantizeArgs& a) {
  Params p;
  p.mode = a.cfg.mode;
  p.n_r = a.n_r;
  const OptTensor none;
  const int64_t C = a.x.shape[2];
  if (a.cfg.block_r == 1) {
    // Blocks along C: rows are independent, offs does not matter.
    p.row_block = a.cfg.block_c;
    p.row_on = true;
    fill_side(p.row, a.q, a.qt, a.scale_c, none, MXMOE_BLOCKED_WHOLE, none, none, C);
  } else if (a.cfg.block_c == 1) {
    p.col_block = a.cfg.block_r;
    p.col_on = true;
    p.grouped = a.offs.present;
    fill_side(p.col, a.q, a.qt, a.scale_r, none, MXMOE_BLOCKED_WHOLE, none, none, C);
  } else {
    p.tile = true;
    p.grouped = a.offs.present;
    p.row_on = true;
    fill_side(p.row, a.q, a.qt, a.scale_c, none, MXMOE_BLOCKED_WHOLE, none, none, C);
    if (a.scale_r.present) {
      p.col_on = true;
      fill_side(p.col, none, none, a.scale_r, none, MXMOE_BLOCKED_WHOLE, none, none, C);
    }
  }
  launch(p, a.x, a.offs, a.stream);
}

void quantize_fused(const FusedArgs& a) {
  Params p;
  p.mode = a.mode;
  p.n_r = a.n_r;
  p.tile = a.tile128;
  const int64_t C = a.x.shape[2];
  if (a.row.active) {
    p.row_on = true;
    if (!a.tile128) p.row_block = a.row.block;
    fill_side(p.row, a.row.q, a.row.qt, a.row.scale, a.row.scale_blocked, a.row.blocked_kind, a.row.dq, a.row.dqt, C);
  }
  if (a.col.active) {
    p.col_on = true;
    if (!a.tile128) p.col_block = a.col.block;
    fill_side(p.col, a.col.q, a.col.qt, a.col.scale, a.col.scale_blocked, a.col.blocked_kind, a.col.dq, a.col.dqt, C);
  }
  p.grouped = a.offs.present && (a.col.active || a.tile128 || a.row.scale_blocked.present);
  if (a.src.kind == 0) {
    launch(p, a.x, a.offs, a.stream);
    return;
  }
  // A computed input: x below is its logical (1, R, C) view over the tensor the kernel reads.
  const FusedSource& s = a.src;
  const int64_t R = a.x.shape[1];
  if (a.x.shape[2] % 8 != 0 && s.kind != MXMOE_SOURCE_GATHER)
    fail_status(MXMOE_ERR_UNSUPPORTED, "quantize_fused_source: CUDA SwiGLU sources need C % 8 == 0, got C = ", C);
  if (s.kind == MXMOE_SOURCE_SWIGLU_BACKWARD && s.layout == 0 && C % 16 != 0)
    fail_status(MXMOE_ERR_UNSUPPORTED, "quantize_fused_source: CUDA concatenated SWIGLU_BACKWARD needs C % 16 == 0, got ", C);
  if (s.kind != MXMOE_SOURCE_GATHER && (!aligned(s.a.data, 16) || (s.b.data && !aligned(s.b.data, 16))))
    fail_status(MXMOE_ERR_UNSUPPORTED, "quantize_fused_source: CUDA SwiGLU sources need 16-byte aligned src.a, src.b");
  p.src.kind = s.kind;
  p.src.dy = static_cast<const uint16_t*>(s.b.data);
  p.src.perm = s.perm.present ? static_cast<const int32_t*>(s.perm.t.data) : nullptr;
  p.src.row_scale = s.row_scale.present ? static_cast<const float*>(s.row_scale.t.data) : nullptr;
  p.src.k = s.k;
  p.src.perm_n = s.kind == MXMOE_SOURCE_GATHER ? s.a.shape[0] * s.k : 1;
  p.src.act = SwigluParams{s.layout, s.alpha, s.limit, s.up_offset};
  mxmoe_tensor x = a.x;
  x.data = s.a.data;  // launch() reads the pointer, dtype and (logical) shape
  launch(p, x, a.offs, a.stream);
  (void)R;
}

}  // namespace cuda
}  // namespace mxmoe
