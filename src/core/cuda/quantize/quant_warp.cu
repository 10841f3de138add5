// The warp-tile kernels: columnwise 32x1 quantization (with or without 1x32 rowwise) and the
// dequantization along R, one 32-row tile per warp.
#include "common/env.hpp"
#include "cuda/quantize/kernels.cuh"

namespace mxmoe {
namespace cuda {
namespace {

// ---- columnwise 32x1 (with or without 1x32 rowwise): the warp-tile kernel --------------------------
// Version 6 (docs/design/quantize.md). The slab kernel above is issue-bound: CTA-wide barriers, the
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
// latency-bound, docs/design/quantize.md).
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

}  // namespace

namespace quant {

void launch_warp(Params& p, int budget, int device, cudaStream_t stream) {
  p.P = static_cast<int>(cdiv(p.R, 32) + (p.grouped ? p.G + 1 : 0));
  p.ctiles = static_cast<int>(cdiv(p.C, 64));
  p.tiles = static_cast<long long>(p.B) * p.P * p.ctiles;
  if (p.tiles <= 0) return;
  if (p.tiles > 0x7FFFFFFFLL) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: too many tiles for one launch");
  // budget 0: the cp.async ring; else direct register loads with that CTAs-per-SM register budget.
  const bool pipe = budget == 0;
  const int smem = (p.table ? 3 * kMaxTable * 4 : 0) + (pipe ? (NW / 32) * 2 * kWarpTileBytes : 0);
  auto go = [&](auto kernel) {
    const int blocks = occupancy(kernel, device, NW, smem), sms = sm_count(device);
    if (blocks < 1) fail_status(MXMOE_ERR_UNSUPPORTED, "quantize: kernel does not fit on the device");
    const long long grid = std::min<long long>(cdiv(p.tiles, NW / 32), static_cast<long long>(blocks) * sms);
    kernel<<<static_cast<unsigned>(grid), NW, smem, stream>>>(p);
    cuda_check(cudaGetLastError(), "quantize: kernel launch");
  };
  if (pipe) go(quant_warp_kernel<2, true>);
  else if (budget == 3) go(quant_warp_kernel<3, false>);
  else if (budget == 4) go(quant_warp_kernel<4, false>);
  else go(quant_warp_kernel<2, false>);
}

}  // namespace quant

// Dequantize along R to bf16 with warp tiles (see dequant_warp_kernel); false when the request is
// not one it takes (the caller then runs the 128x128-tile kernel). MXMOE_DEQUANT_WARP=0 disables it
// (A/B measurements).
bool dequantize_along_r_warp(const DequantizeArgs& a) {
  const bool enabled = env::settings().dequant_warp;
  const int64_t B = a.q.shape[0], R = a.q.shape[1], C = a.q.shape[2];
  const bool grouped = a.offs.present;
  if (!enabled || a.axis != 0 || a.out.dtype != MXMOE_DTYPE_BF16 || C % 8 != 0 || !aligned(a.q.data, 8) ||
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

}  // namespace cuda
}  // namespace mxmoe
