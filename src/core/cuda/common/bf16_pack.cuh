// fp32 pairs to bf16x2 in one hardware conversion (cvt.rn.bf16x2.f32: round to nearest even,
// subnormals kept), instead of f32_to_bf16's ~7 integer instructions per value. Two NaN policies:
// pack_bf16x2 writes any NaN as 0x7FC0 (f32_to_bf16 of the canonical NaN: the CPU reference's bf16
// outputs); cvt_bf16x2 leaves the hardware's NaN (0x7FFF), for values that are only quantized
// afterwards, where any NaN gives the NaN block (scale and codes) whatever its payload.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mxmoe {
namespace cuda {

__device__ __forceinline__ uint32_t cvt_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const uint32_t r = cvt_bf16x2(lo, hi);
  const uint32_t nan = __vcmpgtu2(r & 0x7FFF7FFFu, 0x7F807F80u);  // 0xFFFF halves where NaN
  return (r & ~nan) | (0x7FC07FC0u & nan);
}

}  // namespace cuda
}  // namespace mxmoe
