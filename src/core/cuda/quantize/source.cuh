// Computed inputs of mxmoe_quantize_fused_source on the device: the values the CPU reference
// materializes (cpu/fused.cpp), bit for bit. Shared by the quantize kernels that read a computed
// input (the tile kernel, quant_tile.cu, and tile128_bf16.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/moe_activation.hpp"
#include "mxmoe/mxmoe.h"

namespace mxmoe {
namespace cuda {
namespace qk {

// A computed input's parameters (the tensor read, x, and its logical row width C stay with the
// kernel's own parameters).
struct SourceP {
  int kind = 0;                      // mxmoe_source_kind, 0: x itself
  const uint16_t* dy = nullptr;      // SWIGLU_BACKWARD: dy (R, C/2) bf16
  const int32_t* perm = nullptr;     // GATHER (SWIGLU_BACKWARD with row_scale): row -> flat entry t*k+j
  const float* row_scale = nullptr;  // GATHER, SWIGLU_BACKWARD, optional: (T, k) f32
  long long k = 1, perm_n = 1;       // GATHER: entries per row of x; rows of x * k (0: all rows zero)
  SwigluParams act{};
};

#if defined(__CUDACC__)

// GATHER: the flat entry row r reads (clamped into [0, perm_n)), or -1 for a padding row (or
// nothing to gather): a row of zeros. The row of x is entry / k.
__device__ __forceinline__ long long gather_entry(const SourceP& s, long long r) {
  const int32_t pr = __ldg(s.perm + r);
  if (pr < 0 || s.perm_n == 0) return -1;
  return min(static_cast<long long>(pr), s.perm_n - 1);
}

// 8 bf16 values of one 16-byte word group as fp32.
__device__ __forceinline__ void unpack8(const uint4 w, float (&v)[8]) {
  const uint32_t a[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __uint_as_float(a[k] << 16);
    v[2 * k + 1] = __uint_as_float(a[k] & 0xFFFF0000u);
  }
}

// SWIGLU_BACKWARD with row_scale: the factor of dy's row r (0 for a padding row).
__device__ __forceinline__ float dy_row_factor(const SourceP& s, long long r) {
  const long long e = gather_entry(s, r);
  return e < 0 ? 0.f : __ldg(s.row_scale + e);
}

// SWIGLU_BACKWARD, concatenated halves: gate g, up u and dy of logical row r at half-column i0 .. i0+7
// (h (R, C), dy (R, C/2)); dy times its row factor when the source has row_scale.
__device__ __forceinline__ void swiglu_bwd_inputs8(const uint16_t* h, long long C, const SourceP& s, long long r,
                                                   long long i0, float (&g)[8], float (&u)[8], float (&dy)[8]) {
  const long long I = C / 2;
  unpack8(__ldg(reinterpret_cast<const uint4*>(h + r * C + i0)), g);
  unpack8(__ldg(reinterpret_cast<const uint4*>(h + r * C + I + i0)), u);
  unpack8(__ldg(reinterpret_cast<const uint4*>(s.dy + r * I + i0)), dy);
  if (s.row_scale != nullptr) {
    const float f = dy_row_factor(s, r);
#pragma unroll
    for (int q = 0; q < 8; ++q) dy[q] = __fmul_rn(dy[q], f);
  }
}

// SWIGLU / SWIGLU_BACKWARD (bf16 only, C % 8 == 0, checked on the host): the fp32 values of logical
// row r, columns c .. c+7, before their rounding to bf16.
//   SWIGLU:          x = swiglu(h), h (R, 2C): gate and up halves concatenated or interleaved.
//   SWIGLU_BACKWARD: x = dh (R, C) from h (R, C) and s.dy (R, C/2).
// PLAIN: the activation is plain SiLU x up (swiglu_is_plain, checked by the caller; the same values).
template <bool PLAIN = false>
__device__ __forceinline__ void swiglu_source8(const uint16_t* h, long long C, const SourceP& s, long long r,
                                               long long c, float (&v)[8]) {
  float g[8], u[8];
  if (s.kind == MXMOE_SOURCE_SWIGLU) {
    const uint16_t* hr = h + r * 2 * C;
    if (s.act.layout == 0) {
      unpack8(__ldg(reinterpret_cast<const uint4*>(hr + c)), g);
      unpack8(__ldg(reinterpret_cast<const uint4*>(hr + C + c)), u);
    } else {
      float a0[8], a1[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(hr + 2 * c)), a0);
      unpack8(__ldg(reinterpret_cast<const uint4*>(hr + 2 * c + 8)), a1);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        g[q] = a0[2 * q], u[q] = a0[2 * q + 1];
        g[q + 4] = a1[2 * q], u[q + 4] = a1[2 * q + 1];
      }
    }
    if (PLAIN && sigmoid_moderate8(g)) {
#pragma unroll
      for (int q = 0; q < 8; ++q) v[q] = swiglu_value<PLAIN, PLAIN>(g[q], u[q], s.act);
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) v[q] = swiglu_value<PLAIN>(g[q], u[q], s.act);
    }
    return;
  }
  const long long I = C / 2;
  if (s.act.layout == 0) {
    const bool gate = c < I;
    float dy[8];
    swiglu_bwd_inputs8(h, C, s, r, gate ? c : c - I, g, u, dy);
    // Only this half's gradient is evaluated (the other one's math was computed and dropped).
    auto grads = [&](auto moderate) {
      constexpr bool kModerate = decltype(moderate)::value;
      if (gate) {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          float dg, du;
          swiglu_grad<PLAIN, kModerate>(g[q], u[q], dy[q], s.act, &dg, &du);
          v[q] = dg;
        }
      } else {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          float dg, du;
          swiglu_grad<PLAIN, kModerate>(g[q], u[q], dy[q], s.act, &dg, &du);
          v[q] = du;
        }
      }
    };
    if (PLAIN && sigmoid_moderate8(g)) {
      grads(std::integral_constant<bool, PLAIN>{});
    } else {
      grads(std::false_type{});
    }
  } else {
    float a0[8];
    unpack8(__ldg(reinterpret_cast<const uint4*>(h + r * C + c)), a0);
    const uint2 d = __ldg(reinterpret_cast<const uint2*>(s.dy + r * I + c / 2));
    float dy[4] = {__uint_as_float(d.x << 16), __uint_as_float(d.x & 0xFFFF0000u), __uint_as_float(d.y << 16),
                   __uint_as_float(d.y & 0xFFFF0000u)};
    if (s.row_scale != nullptr) {
      const float f = dy_row_factor(s, r);
#pragma unroll
      for (int q = 0; q < 4; ++q) dy[q] = __fmul_rn(dy[q], f);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) swiglu_grad<PLAIN>(a0[2 * q], a0[2 * q + 1], dy[q], s.act, &v[2 * q], &v[2 * q + 1]);
  }
}

#endif  // __CUDACC__

}  // namespace qk
}  // namespace cuda
}  // namespace mxmoe
