// Division by a per-launch constant without the hardware-division sequence (~20 instructions: I2F,
// MUFU.RCP, F2I and fix-ups), for the persistent kernels' tile decode: the divisor's magic numbers are
// computed on the host once per launch, the device does one umulhi, one add and one shift.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mxmoe {
namespace cuda {

// q = (umulhi(x, mul) + x) >> shift for dividends in [0, 2^31), with shift = ceil(log2 d) and
// mul = floor(2^32 (2^shift - d) / d) + 1, i.e. the multiplier floor(2^(32+shift) / d) + 1 less 2^32
// (Granlund & Montgomery 1994, Thm 4.2: exact for x < 2^32; x < 2^31 keeps umulhi(x, mul) + x < 2^32).
struct FastDiv {
  uint32_t mul, shift;
};

inline FastDiv make_fast_div(uint32_t d) {  // host; 1 <= d <= 2^31
  uint32_t l = 0;
  while ((uint64_t{1} << l) < d) ++l;
  FastDiv f;
  f.mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1);
  f.shift = l;
  return f;
}

__device__ __forceinline__ uint32_t fast_div(uint32_t x, FastDiv f) { return (__umulhi(x, f.mul) + x) >> f.shift; }

}  // namespace cuda
}  // namespace mxmoe
