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

#include "cuda/quant_common.cuh"
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
  long long R = 0, C = 0;
  int mode = 0;
  int row_block = 0;  // rowwise quantization 1 x row_block (0: none)
  int col_block = 0;  // columnwise quantization col_block x 1 (0: none)
  bool tile = false;  // one 128x128 quantization for both sides
  bool grouped = false;
  bool row_on = false, col_on = false;
  SideP row, col;
  long long n_r = 0;
  long long P = 0;  // panel slots per batch entry
  long long ctiles = 0;
  bool x_vec = false;
};

struct Smem {
  ScanSmem scan;
  long long g_start, g_end, g_p0, g_b0, g_np;
  int found;
  uint8_t tile_byte;
  uint32_t red[16];
  uint32_t srow[128];  // rowwise scale bytes of the tile: 4 per row (one per 32 columns)
  uint32_t scol[128];  // columnwise scale bytes: 4 per column (one per 32-row run)
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
    if (vec) {
      if (valid >= 4) *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
      if (valid >= 8) *reinterpret_cast<float4*>(p + 4) = make_float4(f[4], f[5], f[6], f[7]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < valid) p[e] = f[e];
    }
  } else {
    uint16_t* p = static_cast<uint16_t*>(base) + off;
    uint32_t h[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = out_bf16(f[e]);
    if (vec) {
      *reinterpret_cast<uint4*>(p) =
          make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16));
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < valid) p[e] = static_cast<uint16_t>(h[e]);
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

// ---- the tile kernel --------------------------------------------------------------------------------
template <typename In>
__global__ void __launch_bounds__(NT, 2) quant_tile_kernel(const __grid_constant__ Params P) {
  extern __shared__ uint4 dyn_smem_[];
  uint32_t* dsm = reinterpret_cast<uint32_t*>(dyn_smem_);
  __shared__ Smem sm;

  const int tid = threadIdx.x, cc = tid & 15, rs = tid >> 4, lane = tid & 31, warp = tid >> 5;
  const long long cta = blockIdx.x;
  const long long ct = cta % P.ctiles;
  const long long rest = cta / P.ctiles;
  const long long p = rest % P.P;
  const int b = static_cast<int>(rest / P.P);
  const long long c0 = ct * 128;
  const int cols = static_cast<int>(min(128LL, P.C - c0));

  // ---- which rows: panel of a group, tail panel, or plain 128-row panel ----
  long long r0, r1, run0 = 0, gp0 = 0, gnp = 0;
  bool in_group = true;
  if (P.grouped) {
    if (tid == 0) sm.found = 0;
    const ScanTotals tot = scan_groups<NT>(P.offs, P.offs_stride, P.G, P.R, 0, sm.scan, [&](const GroupInfo& gi) {
      if (p >= gi.p0 && p < gi.p0 + gi.panels) {
        sm.found = 1;
        sm.g_start = gi.start;
        sm.g_end = gi.end;
        sm.g_p0 = gi.p0;
        sm.g_b0 = gi.b0;
        sm.g_np = gi.panels;
      }
    });
    // Zero-fill what no tile writes (2D only): unused grouped scale_r entries, blocked tails.
    if (P.col_on && P.col.scale != nullptr && P.n_r > tot.blocks) {
      long long lo, hi;
      grid_share(P.C, lo, hi);
      for (long long c = lo; c < hi; ++c)
        zero_bytes_cta<NT>(P.col.scale + c * P.n_r, tot.blocks, P.n_r);
    }
    if (P.row_on && P.row.blocked != nullptr) {
      long long lo, hi;
      const long long from = tot.panels * 512 * P.ctiles;
      grid_share(max(0LL, P.row.blocked_size - from), lo, hi, 16);
      zero_bytes_cta<NT>(P.row.blocked, from + lo, from + hi);
    }
    if (P.col_on && P.col.blocked != nullptr) {
      long long lo, hi;
      const long long from = tot.panels * 512 * P.ctiles;
      grid_share(max(0LL, P.col.blocked_size - from), lo, hi, 16);
      zero_bytes_cta<NT>(P.col.blocked, from + lo, from + hi);
    }
    if (sm.found) {
      gp0 = sm.g_p0;
      gnp = sm.g_np;
      r0 = sm.g_start + 128 * (p - gp0);
      r1 = min(sm.g_end, r0 + 128);
      run0 = sm.g_b0 + 4 * (p - gp0);
    } else {
      r0 = tot.covered + 128 * (p - tot.panels);
      r1 = min(P.R, r0 + 128);
      in_group = false;
    }
  } else {
    r0 = 128 * p;
    r1 = min(P.R, r0 + 128);
    run0 = r0 / 32;
    gnp = P.P;
  }
  if (r0 >= r1 || cols <= 0) return;  // uniform per CTA
  const int rows = static_cast<int>(r1 - r0);
  const int lr0 = 4 * rs;          // first local row of this thread
  const int lc = 8 * cc;           // first local column
  const int cvalid = cols - lc;    // valid columns of this thread's chunk (<= 0: none)
  const bool col_q = P.tile || P.col_block > 0;
  const bool row_q = P.row_block > 0;

  // ---- load ----
  Frag<In> f;
  f.zero();
  if (row_q || (col_q && in_group)) {
    const In* xb = static_cast<const In*>(P.x) + ((static_cast<long long>(b) * P.R + r0) * P.C + c0 + lc);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (lr0 + i < rows && cvalid > 0) f.load(i, xb + static_cast<long long>(lr0 + i) * P.C, cvalid, P.x_vec);
  }

  // ---- rowwise quantization (1 x row_block) ----
  uint2 rq[4];
  uint8_t rsb[4];
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
      rsb[i] = s;
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
  uint8_t csb[8];  // scale byte of each of the thread's 8 columns (its rows lie in one 32-run)
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
        if (tid == 0) sm.tile_byte = e8m0_from_amax_bits(max(max(sm.red[0], sm.red[1]), max(sm.red[2], sm.red[3])), mode);
        __syncthreads();
        const uint8_t s = sm.tile_byte;
        if (tid < 128) sm.scol[tid] = s * 0x01010101u;
#pragma unroll
        for (int j = 0; j < 8; ++j) csb[j] = s;
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
        const int k = rs >> 3;
#pragma unroll
        for (int j = 0; j < 8; ++j) csb[j] = scolb[(lc + j) * 4 + k];
      }
      float r[8];
      bool anynan = false;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        r[j] = e8m0_reciprocal_f32(csb[j]);
        anynan |= csb[j] == kE8M0Nan;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v[8];
        f.values(i, v);
        cq[i] = quant8(v, r);
        if (anynan) {
          uint32_t mk[2] = {0, 0};
#pragma unroll
          for (int j = 0; j < 8; ++j)
            if (csb[j] == kE8M0Nan) mk[j >> 2] |= 0xFFu << (8 * (j & 3));
          cq[i].x = (cq[i].x & ~mk[0]) | (0x7F7F7F7Fu & mk[0]);
          cq[i].y = (cq[i].y & ~mk[1]) | (0x7F7F7F7Fu & mk[1]);
        }
      }
    } else {
      // Rows past the last group: zeros (scale byte 0 dequantizes them to +0).
#pragma unroll
      for (int i = 0; i < 4; ++i) cq[i] = make_uint2(0, 0);
#pragma unroll
      for (int j = 0; j < 8; ++j) csb[j] = 0;
      if (tid < 128) sm.scol[tid] = 0;
      if (P.tile && tid == 0) sm.tile_byte = 0;
    }
    __syncthreads();  // scol / tile_byte visible to every thread
  }

  // ---- outputs of one side ----
  // is_row: rowwise side (scale_c, blocked by rows); else columnwise side (scale_r).
  auto emit = [&](const SideP& S, bool is_row, const uint2 (&qd)[4], bool per_row_scale) {
    auto scale_of = [&](int i, int j) -> uint8_t { return per_row_scale ? rsb[i] : csb[j]; };
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
          for (int i = 0; i < 4; ++i) w[j][i] = __float_as_uint(v[i][j]);
        transpose_store<4>(dsm, static_cast<uint8_t*>(S.dqt) + (xcol0 * P.R + r0) * 4, P.R, rows, cols, w);
      } else {
        uint32_t w[8][2];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          w[j][0] = out_bf16(v[0][j]) | (out_bf16(v[1][j]) << 16);
          w[j][1] = out_bf16(v[2][j]) | (out_bf16(v[3][j]) << 16);
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
        for (int i = 0; i < 4; ++i) srowb[(lr0 + i) * 4 + (cc >> 2)] = rsb[i];
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
      __syncthreads();
    }
    if (!is_row && in_group && (S.scale || S.blocked)) {
      // scol: byte k of column c = scale of rows 32k..32k+31 of the panel.
      const int nruns = (rows + 31) / 32;
      const uint32_t kmask = nruns >= 4 ? 0xFFFFFFFFu : ((1u << (8 * nruns)) - 1u);
      if (S.scale && tid < cols) {
        uint8_t* d = S.scale + (xcol0 + tid) * P.n_r + run0;
        const uint32_t val = sm.scol[tid];
        if (nruns == 4 && (reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
          *reinterpret_cast<uint32_t*>(d) = val;
        } else {
          for (int k = 0; k < nruns; ++k) d[k] = static_cast<uint8_t>(val >> (8 * k));
        }
      }
      if (S.blocked && tid < 128) {
        long long blk;
        if (S.kind == MXMOE_BLOCKED_GROUPS_K) blk = gp0 * P.ctiles + ct * gnp + (p - gp0);
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
    if (P.tile) {
      // Tile mode: the rowwise side views the tile quantization (zeros past the last group).
      emit(P.row, true, cq, false);
    } else {
      emit(P.row, true, rq, true);
    }
  }
  if (P.col_on) emit(P.col, false, cq, false);
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

int dyn_smem_bytes(const Params& p) {
  int e = 0;
  for (const SideP* s : {&p.row, &p.col}) {
    if (s->qt) e = std::max(e, 1);
    if (s->dqt) e = std::max(e, s->dqt_f32 ? 4 : 2);
  }
  return std::max(8192, e * 16384);
}

template <typename In>
void launch_typed(const Params& p, cudaStream_t stream) {
  const long long grid = static_cast<long long>(p.B) * p.P * p.ctiles;
  if (grid <= 0) return;
  if (grid > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: tensor too large for one launch (", grid, " tiles)");
  const int smem = dyn_smem_bytes(p);
  cuda_check(cudaFuncSetAttribute(quant_tile_kernel<In>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "quantize: cudaFuncSetAttribute");
  quant_tile_kernel<In><<<static_cast<unsigned>(grid), NT, smem, stream>>>(p);
  cuda_check(cudaGetLastError(), "quantize: kernel launch");
}

void launch(Params& p, const mxmoe_tensor& x, const OptTensor& offs, void* stream) {
  p.x = x.data;
  p.B = static_cast<int>(x.shape[0]);
  p.R = x.shape[1];
  p.C = x.shape[2];
  p.offs = offs.present ? static_cast<const int32_t*>(offs.t.data) : nullptr;
  p.G = offs.present ? static_cast<int>(offs.t.shape[0]) : 0;
  p.offs_stride = offs.present ? offs.t.strides[0] : 1;
  if (!p.grouped) p.offs = nullptr;
  p.P = cdiv(p.R, 128) + (p.grouped ? p.G + 1 : 0);
  p.ctiles = cdiv(p.C, 128);
  const bool bf16 = x.dtype == MXMOE_DTYPE_BF16;
  p.x_vec = aligned(x.data, 16) && p.C % (bf16 ? 8 : 4) == 0;
  DeviceGuard guard(x.device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (bf16) launch_typed<uint16_t>(p, s);
  else launch_typed<float>(p, s);
}

}  // namespace

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
  launch(p, a.x, a.offs, a.stream);
}

}  // namespace cuda
}  // namespace mxmoe
