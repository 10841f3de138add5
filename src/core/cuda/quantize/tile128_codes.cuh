// Device helpers shared by the tile128 recipe's bf16 quantize kernels (tile128_bf16.cu, the pass
// kernel; sm90_bf16_quantize_128x128.cu, the weights' TMA kernel): |x| of packed bf16 and the codes
// of 8 bf16 values under one scale byte, so both write the same bits.
#pragma once

#include <cstdint>

#include "cuda/quantize/common.cuh"

namespace mxmoe {
namespace cuda {
namespace qk {

constexpr uint32_t kAbs2 = 0x7FFF7FFFu;  // |x| of a packed bf16 pair

__device__ __forceinline__ uint4 abs8(const uint4 v) {
  return make_uint4(v.x & kAbs2, v.y & kAbs2, v.z & kAbs2, v.w & kAbs2);
}

// 8 codes of a chunk with one scale byte (the NaN scale gives NaN codes). Branch-free, so that the
// compiler can interleave a thread's chunks.
__device__ __forceinline__ uint2 codes8(const uint4 v, uint32_t s) {
  const float rc = e8m0_recip(s);
  const uint32_t a[4] = {v.x, v.y, v.z, v.w};
  uint32_t o[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t lo = cvt_e4m3x2(__fmul_rn(__uint_as_float(a[2 * k] << 16), rc),
                                   __fmul_rn(__uint_as_float(a[2 * k] & 0xFFFF0000u), rc));
    const uint32_t hi = cvt_e4m3x2(__fmul_rn(__uint_as_float(a[2 * k + 1] << 16), rc),
                                   __fmul_rn(__uint_as_float(a[2 * k + 1] & 0xFFFF0000u), rc));
    o[k] = s == kE8M0Nan ? 0x7F7F7F7Fu : lo | (hi << 16);
  }
  return make_uint2(o[0], o[1]);
}

}  // namespace qk
}  // namespace cuda
}  // namespace mxmoe
