// MX format codecs shared by the CPU core and the CUDA kernels: one definition of the numerics of
// docs/design/mx-format.md, bit for bit. Everything is integer bit manipulation or a single IEEE fp32 multiply,
// so host and device give identical bytes (compile without fast-math / flush-to-zero).
#pragma once

#include <cstdint>
#include <cstring>

#include "mxmoe/mxmoe.h"

#if defined(__CUDACC__)
#define MXMOE_HD __host__ __device__ __forceinline__
#else
#define MXMOE_HD inline
#endif

namespace mxmoe {

constexpr int kBlock = 32;                   // elements per MX block
constexpr uint32_t kInv448Bits = 0x3B124925u;  // fp32(1/448), RCEIL multiplies by it
constexpr uint8_t kE8M0Nan = 0xFF;
constexpr uint8_t kE4M3MaxPos = 0x7E;        // 448
constexpr uint8_t kE4M3Nan = 0x7F;

MXMOE_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MXMOE_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// fp32 multiply with IEEE round-to-nearest-even and no flush-to-zero on both host and device.
MXMOE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MXMOE_HD bool f32_is_nan(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }
MXMOE_HD bool f32_is_nan_or_inf(uint32_t u) { return (u & 0x7F800000u) == 0x7F800000u; }

// bf16 <-> fp32. bf16 -> fp32 is exact; fp32 -> bf16 rounds to nearest even and keeps NaN quiet.
MXMOE_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
MXMOE_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if (f32_is_nan(u)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Block amax fold: |x| max in fp32, NaN is sticky (plain fmax would drop it).
MXMOE_HD uint32_t amax_fold(uint32_t amax_bits, float x) {
  const uint32_t a = f32_bits(x) & 0x7FFFFFFFu;
  if (f32_is_nan(amax_bits)) return amax_bits;
  if (f32_is_nan(a)) return a;
  // Non-negative finite/inf floats order like their bit patterns.
  return a > amax_bits ? a : amax_bits;
}

// RCEIL: round d = amax * fp32(1/448) up to a power of two (the spec's rounding table).
MXMOE_HD uint8_t e8m0_rceil_from_d_bits(uint32_t d) {
  if (f32_is_nan_or_inf(d)) return kE8M0Nan;
  const uint32_t e = (d >> 23) & 0xFFu;
  const uint32_t m = d & 0x7FFFFFu;
  const uint32_t up = (e == 0) ? (m > 0x400000u ? 1u : 0u) : (m != 0 ? 1u : 0u);
  return static_cast<uint8_t>(e + up);  // e <= 254 here, so e + up <= 255
}

// E8M0 scale byte of a block from its amax, per docs/design/mx-format.md.
MXMOE_HD uint8_t e8m0_from_amax_bits(uint32_t amax_bits, mxmoe_scale_mode mode) {
  amax_bits &= 0x7FFFFFFFu;
  if (mode == MXMOE_SCALE_RCEIL)
    return e8m0_rceil_from_d_bits(f32_bits(mul_rn(bits_f32(amax_bits), bits_f32(kInv448Bits))));
  if (f32_is_nan_or_inf(amax_bits)) return kE8M0Nan;
  if (mode == MXMOE_SCALE_EVEN) {
    amax_bits = (amax_bits + (1u << 19)) & 0xFF800000u;
    // A finite amax rounded up past the largest exponent (near the dtype's max): p = 128, so
    // s = 247 as torchao; a finite block never gets the NaN scale (docs/design/mx-format.md).
    if (f32_is_nan_or_inf(amax_bits)) return static_cast<uint8_t>(128 - 8 + 127);
  }
  const int32_t e = static_cast<int32_t>((amax_bits >> 23) & 0xFFu);
  int32_t p = (e == 0) ? -127 : e - 127;
  if (mode == MXMOE_SCALE_CEIL && e != 0 && (amax_bits & 0x7FFFFFu) != 0) p += 1;
  int32_t s = p - 8;
  s = s < -127 ? -127 : (s > 128 ? 128 : s);
  return static_cast<uint8_t>(s + 127);
}

// 2^(s-127) as fp32 (byte 0 gives the subnormal 2^-127; 255 gives NaN).
MXMOE_HD float e8m0_to_f32(uint8_t s) {
  if (s == kE8M0Nan) return bits_f32(0x7FC00000u);
  if (s == 0) return bits_f32(0x00400000u);
  return bits_f32(static_cast<uint32_t>(s) << 23);
}

// Reciprocal used when quantizing: 2^(127-s) as fp32 (s = 254 gives the subnormal 2^-127).
MXMOE_HD float e8m0_reciprocal_f32(uint8_t s) {
  if (s == kE8M0Nan) return bits_f32(0x7FC00000u);
  if (s == 254) return bits_f32(0x00400000u);
  return bits_f32(static_cast<uint32_t>(254 - s) << 23);
}

// fp32 -> e4m3fn, round to nearest even, saturating to +-448, NaN -> 0x7F with sign, zero sign kept.
MXMOE_HD uint8_t e4m3_from_f32(float y) {
  const uint32_t u = f32_bits(y);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | kE4M3Nan);
  if (a >= 0x43E00000u) return static_cast<uint8_t>(sign | kE4M3MaxPos);  // >= 448, inf included
  if (a < 0x3C800000u) {
    // Below 2^-6: subnormal grid m * 2^-9. Scaling by 2^9 is exact; round the integer m (0..8) RNE;
    // m == 8 lands on the smallest normal, whose bits are 0x08 as well.
    const float t = mul_rn(bits_f32(a), 512.0f);
    const uint32_t tb = f32_bits(t);
    // t < 8: integer part and fraction from the bits.
    uint32_t m;
    if (tb < 0x3F000000u) {  // t < 0.5 -> 0
      m = 0;
    } else {
      const uint32_t e = (tb >> 23) & 0xFFu;                 // 126 (t in [0.5,1)) .. 129
      const uint32_t mant = (tb & 0x7FFFFFu) | 0x800000u;    // 1.f * 2^23
      const uint32_t shift = 150u - e;                        // bits below the integer point
      const uint32_t ip = mant >> shift;
      const uint32_t rem = mant & ((1u << shift) - 1u);
      const uint32_t half = 1u << (shift - 1u);
      m = ip + ((rem > half || (rem == half && (ip & 1u))) ? 1u : 0u);
    }
    return static_cast<uint8_t>(sign | m);
  }
  // Normal range [2^-6, 448): keep 3 mantissa bits, round to nearest even (carry may bump the
  // exponent, at most to 448 since a < 0x43E00000 = 448 and 464 is the first value rounding higher).
  const uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1u);
  const uint32_t exp = (r >> 23) - 120u;  // e4m3 bias 7: 127 - 7
  uint32_t bits = (exp << 3) | ((r >> 20) & 7u);
  if (bits > kE4M3MaxPos) bits = kE4M3MaxPos;
  return static_cast<uint8_t>(sign | bits);
}

MXMOE_HD float e4m3_to_f32(uint8_t q) {
  const uint32_t sign = static_cast<uint32_t>(q & 0x80u) << 24;
  const uint32_t e = (q >> 3) & 0xFu;
  const uint32_t m = q & 7u;
  if (e == 0xF && m == 7) return bits_f32(sign | 0x7FC00000u);
  if (e == 0) {
    // m * 2^-9, exact in fp32
    return bits_f32(sign | f32_bits(static_cast<float>(m) * (1.0f / 512.0f)));
  }
  return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

// Quantize one element with its block's scale byte. A NaN scale makes every element the positive
// NaN code, so host and device agree on the bits (NaN signs differ between CPU and GPU multiplies).
MXMOE_HD uint8_t quantize_element(float x, uint8_t scale) {
  if (scale == kE8M0Nan) return kE4M3Nan;
  return e4m3_from_f32(mul_rn(x, e8m0_reciprocal_f32(scale)));
}

// Dequantize one element: e4m3 value * 2^(s-127) in fp32; NaN (either part) is canonical.
MXMOE_HD float dequantize_element(uint8_t q, uint8_t scale) {
  if (scale == kE8M0Nan || (q & 0x7Fu) == kE4M3Nan) return bits_f32(0x7FC00000u);
  return mul_rn(e4m3_to_f32(q), e8m0_to_f32(scale));
}

}  // namespace mxmoe
