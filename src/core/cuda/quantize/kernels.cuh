// Internal to the CUDA quantizers (quantize.cu and the kernel families quant_*.cu): the request
// parameters every family shares, the family launchers quantize.cu dispatches to, and the device
// helpers more than one family uses (element access, code / value stores, the slab resolver).
//
// Families (one file each; docs/design/quantize.md describes them):
//   tile/  quant_tile_kernel   128-row panels x 128 columns, every blocking, both sides, 128x128
//   slab/  quant_slab_kernel   32-row slabs: blockings whose blocks span at most 32 rows
//   warp/  quant_warp_kernel   columnwise 32x1 (+ rowwise 1x32) warp tiles; dequant_warp_kernel
//   rows/  quant_rows_kernel   rowwise-only streaming
// (the tile128 recipe's passes have their own kernel, tile128_bf16.cu.)
#pragma once

#include <algorithm>
#include <cstdlib>

#include "common/moe_activation.hpp"
#include "cuda/common/launch_cache.cuh"
#include "cuda/quantize/common.cuh"
#include "cuda/quantize/source.cuh"
#include "ops.hpp"

namespace mxmoe {
namespace cuda {
namespace quant {

using namespace qk;

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

// Rowwise-only streaming requests (rows/).
struct RowParams {
  const void* x;
  uint8_t* q;
  uint8_t* scale;
  void* dq;
  bool dq_f32;
  long long nchunks;
  int mode;
};

// Family launchers: each takes a request its family serves (quantize.cu's routing, with the route's
// settings: quantize_route.hpp) and launches it on `stream` (nothing when there is no work). Throw
// mxmoe::Error. launch_tile: p.stages as routed (0 direct loads, 2 or 3; 3 -> 2 where it does not
// fit). launch_warp: budget 0 the cp.async-ring kernel, else the direct-load kernel's CTAs per SM
// (2, 3, 4).
void launch_tile(Params& p, bool bf16, int device, cudaStream_t stream);
void launch_slab(Params& p, bool bf16, int device, cudaStream_t stream);
void launch_warp(Params& p, int budget, int device, cudaStream_t stream);
void launch_rows(const RowParams& rp, bool bf16, int row_block, bool pf, int device, cudaStream_t stream);

}  // namespace quant

namespace {

using namespace qk;
using namespace quant;

constexpr int NT = 512;  // threads of the tile kernel (its thread layout is what Frag and the stores index)

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
  // Row i's chunk from 8 fp32 values, each rounded once to bf16 (the CPU's f32_to_bf16 rounding; the
  // hardware's NaN: the chunk is only quantized afterwards).
  __device__ __forceinline__ void set(int i, const float (&v)[8]) {
    uint32_t a[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) a[k] = cvt_bf16x2(v[2 * k], v[2 * k + 1]);
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

}  // namespace
}  // namespace cuda
}  // namespace mxmoe
