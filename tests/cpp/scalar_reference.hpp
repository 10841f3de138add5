// A deliberately simple scalar implementation of MX_SPEC.md, separate from the library's bit-level
// codecs: decoding from the formula, encoding by nearest-value search over the 256 e4m3 codes,
// scale exponents from frexp. The library must agree with it bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "mxmoe/mxmoe.h"
#include "test_util.hpp"

namespace ref {

inline double e4m3_value(uint8_t code) {
  const int sign = (code & 0x80) ? -1 : 1;
  const int e = (code >> 3) & 0xF, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * (m / 8.0) * std::ldexp(1.0, -6);
  return sign * (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
}

// Nearest e4m3 code by exhaustive search, ties to the even code, saturating at 448.
inline uint8_t e4m3_encode(float y) {
  if (std::isnan(y)) return 0x7F;
  const bool neg = std::signbit(y);
  const double a = std::fabs(static_cast<double>(y));
  if (a >= 448.0) return neg ? 0xFE : 0x7E;
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double err = std::fabs(e4m3_value(static_cast<uint8_t>(c)) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | (neg ? 0x80 : 0));
}

// floor(log2(a)) for a normal fp32 a; -127 for zero and fp32 subnormals.
inline int floor_log2(float a) {
  if (a < std::ldexp(1.0f, -126)) return -127;
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  return e - 1;
}

inline bool is_pow2(float a) {
  int e;
  return std::frexp(a, &e) == 0.5f;
}

inline uint8_t scale_byte(float amax, mxmoe_scale_mode mode) {
  if (std::isnan(amax)) return 255;
  if (mode == MXMOE_SCALE_RCEIL) {
    const float d = amax * mxtest::float_of(0x3B124925u);
    if (!std::isfinite(d)) return 255;
    // Smallest power of two >= d, but never below 2^-127 (byte 0).
    if (d <= std::ldexp(1.0f, -127)) return 0;
    int e;
    const float f = std::frexp(d, &e);  // d = f * 2^e
    const int p = (f == 0.5f) ? e - 1 : e;
    return static_cast<uint8_t>(p + 127 > 255 ? 255 : p + 127);
  }
  if (std::isinf(amax)) return 255;
  int p = floor_log2(amax);
  if (mode == MXMOE_SCALE_CEIL && p > -127 && !is_pow2(amax)) p += 1;
  if (mode == MXMOE_SCALE_EVEN && p > -127) {
    // Round up to the next power of two when the significand is >= 1 + 15/16 (MX_SPEC's bit rule).
    const double sig = std::ldexp(static_cast<double>(amax), -p);  // in [1, 2)
    if (sig >= 1.9375) p += 1;  // may reach 128 for amax near the dtype's max: s = 247, never 255
  }
  int s = p - 8;
  if (s < -127) s = -127;
  if (s > 128) s = 128;
  return static_cast<uint8_t>(s + 127);
}

inline float scale_value(uint8_t s) {
  if (s == 255) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(s) - 127);
}

inline uint8_t quantize(float x, uint8_t s) {
  if (s == 255) return 0x7F;
  const float r = std::ldexp(1.0f, 127 - static_cast<int>(s));
  return e4m3_encode(x * r);
}

inline float dequantize(uint8_t q, uint8_t s) {
  return static_cast<float>(e4m3_value(q)) * scale_value(s);
}

}  // namespace ref
