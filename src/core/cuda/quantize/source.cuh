// Computed inputs of mxmoe_quantize_fused_source on the device: the values the CPU reference
// materializes (cpu/fused.cpp), bit for bit. Shared by the quantize kernels that read a computed
// input (quantize.cu's tile kernel, quantize/tile128_bf16.cu). PT is any parameter struct with the
// fields below (x: the tensor read, C: the logical row width, src, src_dy, act).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/moe_activation.hpp"
#include "mxmoe/mxmoe.h"

namespace mxmoe {
namespace cuda {
namespace qk {

#if defined(__CUDACC__)

// 8 bf16 values of one 16-byte word group as fp32.
__device__ __forceinline__ void unpack8(const uint4 w, float (&v)[8]) {
  const uint32_t a[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __uint_as_float(a[k] << 16);
    v[2 * k + 1] = __uint_as_float(a[k] & 0xFFFF0000u);
  }
}

// SWIGLU / SWIGLU_BACKWARD (bf16 only, C % 8 == 0, checked on the host): the fp32 values of logical
// row r, columns c .. c+7, before their rounding to bf16.
//   SWIGLU:          x = swiglu(h), h (R, 2C): gate and up halves concatenated or interleaved.
//   SWIGLU_BACKWARD: x = dh (R, C) from h (R, C) and dy = src_dy (R, C/2).
template <typename PT>
__device__ __forceinline__ void swiglu_source8(const PT& P, long long r, long long c, float (&v)[8]) {
  const uint16_t* h = static_cast<const uint16_t*>(P.x);
  float g[8], u[8];
  if (P.src == MXMOE_SOURCE_SWIGLU) {
    const uint16_t* hr = h + r * 2 * P.C;
    if (P.act.layout == 0) {
      unpack8(__ldg(reinterpret_cast<const uint4*>(hr + c)), g);
      unpack8(__ldg(reinterpret_cast<const uint4*>(hr + P.C + c)), u);
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
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = swiglu_value(g[q], u[q], P.act);
    return;
  }
  const long long I = P.C / 2;
  const uint16_t* hr = h + r * P.C;
  const uint16_t* dyr = P.src_dy + r * I;
  if (P.act.layout == 0) {
    const bool gate = c < I;
    const long long i0 = gate ? c : c - I;
    float dy[8];
    unpack8(__ldg(reinterpret_cast<const uint4*>(hr + i0)), g);
    unpack8(__ldg(reinterpret_cast<const uint4*>(hr + I + i0)), u);
    unpack8(__ldg(reinterpret_cast<const uint4*>(dyr + i0)), dy);
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      float dg, du;
      swiglu_grad(g[q], u[q], dy[q], P.act, &dg, &du);
      v[q] = gate ? dg : du;
    }
  } else {
    float a0[8];
    unpack8(__ldg(reinterpret_cast<const uint4*>(hr + c)), a0);
    const uint2 d = __ldg(reinterpret_cast<const uint2*>(dyr + c / 2));
    const float dy[4] = {__uint_as_float(d.x << 16), __uint_as_float(d.x & 0xFFFF0000u), __uint_as_float(d.y << 16),
                         __uint_as_float(d.y & 0xFFFF0000u)};
#pragma unroll
    for (int q = 0; q < 4; ++q) swiglu_grad(a0[2 * q], a0[2 * q + 1], dy[q], P.act, &v[2 * q], &v[2 * q + 1]);
  }
}

#endif  // __CUDACC__

}  // namespace qk
}  // namespace cuda
}  // namespace mxmoe
