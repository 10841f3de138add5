// Shared device helpers of the CUDA quantization kernels (cuda/quantize/, cuda/scale_layout/): error checks, the hardware
// e4m3 conversions (bit-exact with mx_format.hpp's codecs, checked exhaustively by
// bench/quantize_bench.cu and by the GPU tests on targeted patterns), block scans of `offs` that
// reproduce groups_from_offsets() on the device, and byte-range helpers.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/error.hpp"
#include "common/int_math.hpp"
#include "cuda/common/bf16_pack.cuh"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/mxmoe.h"

namespace mxmoe {
struct DequantizeArgs;
namespace cuda {
// dequantize's fast path along R (quant_warp.cu, used by quant_dequant.cu); false where it
// does not apply.
bool dequantize_along_r_warp(const DequantizeArgs& args);

namespace qk {

// ---- host side ----------------------------------------------------------------------------------
inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_status(MXMOE_ERR_CUDA, what, ": ", cudaGetErrorString(e));
}

// Launch on the tensors' device; restores the caller's current device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) cuda_check(cudaSetDevice(device), "cudaSetDevice");
    else prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

MXMOE_HD bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) % n) == 0; }

// ---- device side ---------------------------------------------------------------------------------
#if defined(__CUDACC__)

constexpr unsigned kFull = 0xFFFFFFFFu;

// Two fp32 -> packed e4m3x2 (lo in bits 0-7), round to nearest even, saturating to +-448
// (+-Inf included), NaN -> NaN. Same bytes as e4m3_from_f32 on every non-NaN input.
__device__ __forceinline__ uint32_t cvt_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// Packed e4m3x2 (16 bits) -> two exact fp32 values (NaN codes are handled by the callers).
__device__ __forceinline__ void e4m3x2_to_f32(uint32_t two, float& lo, float& hi) {
  uint32_t h2;
  const uint16_t in = static_cast<uint16_t>(two);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
  asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\t}"
      : "=f"(lo), "=f"(hi)
      : "r"(h2));
}

// fp32 -> bf16 bits, round to nearest even (the NaN case is handled by the callers).
__device__ __forceinline__ uint32_t bf16_bits_rne(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// 2^(127-s) for a scale byte s < 255 (e8m0_reciprocal_f32 without its NaN case): the multiplier
// that codes a value of a block with scale s.
__device__ __forceinline__ float e8m0_recip(uint32_t s) {
  return __uint_as_float(s == 254u ? 0x00400000u : (254u - s) << 23);
}

// Quantize 8 values with the reciprocal r (of a non-NaN scale byte) into 8 e4m3 bytes.
__device__ __forceinline__ uint2 quant8(const float (&v)[8], const float (&r)[8]) {
  uint2 o;
  o.x = cvt_e4m3x2(__fmul_rn(v[0], r[0]), __fmul_rn(v[1], r[1])) |
        (cvt_e4m3x2(__fmul_rn(v[2], r[2]), __fmul_rn(v[3], r[3])) << 16);
  o.y = cvt_e4m3x2(__fmul_rn(v[4], r[4]), __fmul_rn(v[5], r[5])) |
        (cvt_e4m3x2(__fmul_rn(v[6], r[6]), __fmul_rn(v[7], r[7])) << 16);
  return o;
}

// Dequantized values of 8 codes with per-element scale bytes: e4m3 * 2^(s-127) in fp32 (exact
// decode in hardware, one IEEE multiply). Where the code or the scale is NaN the product is a NaN
// of unspecified payload: outputs go through canon_f32 / pack_bf16x2, which write the canonical
// NaN of dequantize_element.
__device__ __forceinline__ void dequant8(uint2 q, const uint8_t (&s)[8], float (&out)[8]) {
  e4m3x2_to_f32(q.x & 0xFFFFu, out[0], out[1]);
  e4m3x2_to_f32(q.x >> 16, out[2], out[3]);
  e4m3x2_to_f32(q.y & 0xFFFFu, out[4], out[5]);
  e4m3x2_to_f32(q.y >> 16, out[6], out[7]);
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = __fmul_rn(out[e], e8m0_to_f32(s[e]));
}

// As dequant8, with the scales already decoded (e8m0_to_f32).
__device__ __forceinline__ void dequant8f(uint2 q, const float (&sf)[8], float (&out)[8]) {
  e4m3x2_to_f32(q.x & 0xFFFFu, out[0], out[1]);
  e4m3x2_to_f32(q.x >> 16, out[2], out[3]);
  e4m3x2_to_f32(q.y & 0xFFFFu, out[4], out[5]);
  e4m3x2_to_f32(q.y >> 16, out[6], out[7]);
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = __fmul_rn(out[e], sf[e]);
}

__device__ __forceinline__ float canon_f32(float f) {
  return (__float_as_uint(f) & 0x7FFFFFFFu) > 0x7F800000u ? __uint_as_float(0x7FC00000u) : f;
}

using cuda::cvt_bf16x2;   // cuda/common/bf16_pack.cuh
using cuda::pack_bf16x2;

// Store/convert helpers for bf16 (uint16 bits) or f32 outputs.
__device__ __forceinline__ uint32_t out_bf16(float f) {
  return (__float_as_uint(f) & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : bf16_bits_rne(f);
}

// Block-wide inclusive scans over NT threads (NT/32 <= 32 warps). `sm` holds NT/32 ints; the
// functions synchronize before returning, so sm may be reused right away.
template <int NT>
__device__ __forceinline__ int block_incl_max(int v, int* sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v = max(v, n);
  }
  if (lane == 31) sm[warp] = v;
  __syncthreads();
  int pre = INT_MIN;
  for (int w = 0; w < warp; ++w) pre = max(pre, sm[w]);
  __syncthreads();
  return max(v, pre);
}

template <int NT>
__device__ __forceinline__ long long block_incl_sum(long long v, long long* sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const long long n = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) sm[warp] = v;
  __syncthreads();
  long long pre = 0;
  for (int w = 0; w < warp; ++w) pre += sm[w];
  __syncthreads();
  return v + pre;
}

// One token group as groups_from_offsets() defines it, plus prefix counts:
//   end = min(m, max(0, offs[0..g])), start = previous end,
//   panels = ceil(size/128) (128-row panels from the group start), blocks = ceil(size/32),
//   units = ceil(panels/units_per) (a coarser grouping of panels, 0 when units_per == 0),
//   p0, b0, u0: the exclusive prefix sums of panels, blocks, units over the groups before g.
struct GroupInfo {
  int g;
  long long start, end;
  long long panels, blocks, units;
  long long p0, b0, u0;
};

struct ScanTotals {
  long long covered;  // end of the last group (0 without groups)
  long long panels, blocks, units;
};

struct ScanSmem {
  int imax[32];
  long long isum[32];
  long long carry[4];  // end, panels, blocks, units
  int ends[1024];
};

// Scans offs (G int32 on the device, element stride ostride) with all NT threads of the CTA; calls fn(GroupInfo) once for
// every group (from the thread that owns it in its chunk) and returns the totals to every thread.
// Reads offs[0..G) only; any content is clamped, so every range it yields lies in [0, m].
template <int NT, typename Fn>
__device__ ScanTotals scan_groups(const int32_t* __restrict__ offs, long long ostride, int G, long long m,
                                  int units_per, ScanSmem& sm, Fn fn) {
  static_assert(NT <= 1024, "scan chunk");
  const int tid = threadIdx.x;
  if (tid == 0) {
    sm.carry[0] = 0;
    sm.carry[1] = 0;
    sm.carry[2] = 0;
    sm.carry[3] = 0;
  }
  __syncthreads();
  for (int base = 0; base < G; base += NT) {
    const int g = base + tid;
    const long long cend = sm.carry[0], cp = sm.carry[1], cb = sm.carry[2], cu = sm.carry[3];
    const int o = g < G ? __ldg(offs + g * ostride) : INT_MIN;
    const int mo = block_incl_max<NT>(o, sm.imax);
    const long long end = min(m, max(cend, static_cast<long long>(mo)));
    sm.ends[tid] = static_cast<int>(end);
    __syncthreads();
    const long long start = tid == 0 ? cend : static_cast<long long>(sm.ends[tid - 1]);
    const long long size = g < G ? end - start : 0;
    const long long np = (size + 127) / 128, nb = (size + 31) / 32;
    const long long nu = units_per > 0 ? (np + units_per - 1) / units_per : 0;
    const long long ip = block_incl_sum<NT>(np, sm.isum);
    const long long ib = block_incl_sum<NT>(nb, sm.isum);
    const long long iu = block_incl_sum<NT>(nu, sm.isum);
    if (g < G) fn(GroupInfo{g, start, end, np, nb, nu, cp + ip - np, cb + ib - nb, cu + iu - nu});
    if (tid == NT - 1) {
      sm.carry[0] = end;
      sm.carry[1] = cp + ip;
      sm.carry[2] = cb + ib;
      sm.carry[3] = cu + iu;
    }
    __syncthreads();
  }
  ScanTotals t{sm.carry[0], sm.carry[1], sm.carry[2], sm.carry[3]};
  __syncthreads();
  return t;
}

// Zero bytes [lo, hi) of p with the CTA's NT threads (16-byte stores where aligned).
template <int NT>
__device__ __forceinline__ void zero_bytes_cta(uint8_t* p, long long lo, long long hi) {
  if (lo >= hi) return;
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(p + lo), a1 = reinterpret_cast<uintptr_t>(p + hi);
  for (uintptr_t c = (a0 & ~uintptr_t(15)) + 16 * uintptr_t(threadIdx.x); c < a1; c += 16 * NT) {
    if (c >= a0 && c + 16 <= a1) {
      *reinterpret_cast<uint4*>(c) = make_uint4(0, 0, 0, 0);
    } else {
      const uintptr_t b0 = c < a0 ? a0 : c, b1 = c + 16 < a1 ? c + 16 : a1;
      for (uintptr_t b = b0; b < b1; ++b) *reinterpret_cast<uint8_t*>(b) = 0;
    }
  }
}

// The group a panel (or 32-row run) index p falls in, from a shared group table of first indices
// firsts[0..n) (non-decreasing, firsts[0] = 0): the last g with firsts[g] <= p, so empty groups are
// skipped. Callers check p against the table's total first.
__device__ __forceinline__ int table_group(const int* firsts, int n, long long p) {
  int lo = 0, hi = n;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (firsts[mid] <= p) lo = mid;
    else hi = mid;
  }
  return lo;
}

// This CTA's share [lo, hi) of n items split evenly over the grid (1-D grid).
__device__ __forceinline__ void grid_share(long long n, long long& lo, long long& hi, long long align = 1) {
  const long long ctas = gridDim.x;
  long long chunk = (n + ctas - 1) / ctas;
  chunk = (chunk + align - 1) / align * align;
  lo = min(n, chunk * static_cast<long long>(blockIdx.x));
  hi = min(n, lo + chunk);
}

#endif  // __CUDACC__

}  // namespace qk
}  // namespace cuda
}  // namespace mxmoe
