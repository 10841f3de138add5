// Scalar codecs against MX_SPEC.md's tables and the independent scalar reference.
#include <gtest/gtest.h>

#include <random>

#include "mxmoe/mx_format.hpp"
#include "scalar_reference.hpp"

using mxtest::bits_of;
using mxtest::float_of;

namespace {
const mxmoe_scale_mode kModes[] = {MXMOE_SCALE_RCEIL, MXMOE_SCALE_FLOOR, MXMOE_SCALE_CEIL,
                                   MXMOE_SCALE_EVEN};
}

TEST(Codecs, RceilRoundingTable) {
  const std::pair<uint32_t, int> rows[] = {
      {0x0, 0},          {0x1, 0},          {0x00400000, 0},   {0x00400001, 1},
      {0x007FFFFF, 1},   {0x00800000, 1},   {0x1F800000, 63},  {0x1F800001, 64},
      {0x3F7FFFFF, 127}, {0x3F800000, 127}, {0x3F800001, 128}, {0x5F800000, 191},
      {0x5F800001, 192}, {0x7F000000, 254}, {0x7F000001, 255}, {0x7F7FFFFF, 255},
      {0x7F800000, 255}, {0x7FC00000, 255}};
  for (auto [d, byte] : rows)
    EXPECT_EQ(mxmoe::e8m0_rceil_from_d_bits(d), byte) << std::hex << "d bits 0x" << d;
}

TEST(Codecs, Inv448ConstantIsFp32OfOneOver448) {
  EXPECT_EQ(bits_of(1.0f / 448.0f), mxmoe::kInv448Bits);
}

TEST(Codecs, E4M3DecodeEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float got = mxmoe_e4m3_to_float(static_cast<uint8_t>(c));
    const double want = ref::e4m3_value(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;  // signed zero kept
    }
  }
  EXPECT_EQ(mxmoe_e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(mxmoe_e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(mxmoe_e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(Codecs, E4M3EncodeRoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(mxmoe_e4m3_from_float(mxmoe_e4m3_to_float(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(Codecs, E4M3EncodeSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(mxmoe_e4m3_from_float(inf), 0x7E);
  EXPECT_EQ(mxmoe_e4m3_from_float(-inf), 0xFE);
  EXPECT_EQ(mxmoe_e4m3_from_float(480.0f), 0x7E);
  EXPECT_EQ(mxmoe_e4m3_from_float(1e30f), 0x7E);
  EXPECT_EQ(mxmoe_e4m3_from_float(std::nanf("")) & 0x7F, 0x7F);
  EXPECT_EQ(mxmoe_e4m3_from_float(-0.0f), 0x80);
  EXPECT_EQ(mxmoe_e4m3_from_float(0.0f), 0x00);
  // Midpoints: ties go to the even code.
  EXPECT_EQ(mxmoe_e4m3_from_float(std::ldexp(1.0f, -10)), 0x00);       // half of 2^-9 -> 0
  EXPECT_EQ(mxmoe_e4m3_from_float(3 * std::ldexp(1.0f, -10)), 0x02);   // 1.5 * 2^-9 -> 2 * 2^-9
  EXPECT_EQ(mxmoe_e4m3_from_float(1.0625f), 0x38);                     // between 1 and 1.125
  EXPECT_EQ(mxmoe_e4m3_from_float(1.1875f), 0x3A);                     // between 1.125 and 1.25
  EXPECT_EQ(mxmoe_e4m3_from_float(464.0f), 0x7E);                      // would round to 512: saturates
  EXPECT_EQ(mxmoe_e4m3_from_float(15 * std::ldexp(1.0f, -10)), 0x08);  // 7.5 * 2^-9 -> min normal
}

TEST(Codecs, E4M3EncodeMatchesReferenceOnRandomFloats) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> exp_u(-16.f, 10.f);
  std::normal_distribution<float> n;
  for (int i = 0; i < 200000; ++i) {
    float y = (i % 2) ? n(rng) * std::ldexp(1.0f, static_cast<int>(exp_u(rng)))
                      : float_of(any_bits(rng));
    if (std::isnan(y)) continue;
    ASSERT_EQ(mxmoe_e4m3_from_float(y), ref::e4m3_encode(y)) << std::hexfloat << y;
  }
}

TEST(Codecs, E8M0DecodeEveryByte) {
  for (int s = 0; s < 255; ++s)
    EXPECT_EQ(mxmoe_e8m0_to_float(static_cast<uint8_t>(s)), std::ldexp(1.0f, s - 127)) << s;
  EXPECT_TRUE(std::isnan(mxmoe_e8m0_to_float(255)));
  EXPECT_EQ(bits_of(mxmoe_e8m0_to_float(0)), 0x00400000u);  // 2^-127, not zero
}

TEST(Codecs, ScaleByteMatchesReferenceForEveryMode) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> any_bits(0, 0x7F800000u);  // non-negative, inf included
  std::vector<float> amaxes = {0.0f, 1.0f, 448.0f, 480.0f, float_of(0x40600001), float_of(0x43FFFFFF),
                               float_of(0x7F7FFFFF), float_of(0x00000001), float_of(0x00800000),
                               std::numeric_limits<float>::infinity(), 1.9375f, 1.93749988f,
                               float_of(0x7F780000), float_of(0x7F77FFFF)};
  for (int i = 0; i < 100000; ++i) amaxes.push_back(float_of(any_bits(rng)));
  for (auto mode : kModes)
    for (float a : amaxes)
      ASSERT_EQ(mxmoe_e8m0_from_amax(a, mode), ref::scale_byte(a, mode))
          << "mode " << mode << " amax bits 0x" << std::hex << bits_of(a);
  for (auto mode : kModes) EXPECT_EQ(mxmoe_e8m0_from_amax(std::nanf(""), mode), 255);
}

TEST(Codecs, ScaleByteEdgeCases) {
  // FLOOR clamps: amax of zero or fp32 subnormal -> -127 - 8 -> clamp -> byte 0.
  EXPECT_EQ(mxmoe_e8m0_from_amax(0.0f, MXMOE_SCALE_FLOOR), 0);
  EXPECT_EQ(mxmoe_e8m0_from_amax(float_of(0x7F7FFFFF), MXMOE_SCALE_FLOOR), 246);
  EXPECT_EQ(mxmoe_e8m0_from_amax(float_of(0x7F7FFFFF), MXMOE_SCALE_RCEIL), 247);
  EXPECT_EQ(mxmoe_e8m0_from_amax(float_of(0x7F7FFFFF), MXMOE_SCALE_CEIL), 247);
  EXPECT_EQ(mxmoe_e8m0_from_amax(256.0f, MXMOE_SCALE_CEIL), 127);
  EXPECT_EQ(mxmoe_e8m0_from_amax(257.0f, MXMOE_SCALE_CEIL), 128);
  EXPECT_EQ(mxmoe_e8m0_from_amax(1.9375f, MXMOE_SCALE_EVEN), 120);   // rounds up to 2^1
  EXPECT_EQ(mxmoe_e8m0_from_amax(1.875f, MXMOE_SCALE_EVEN), 119);
  // Near the dtype's max the rounding carries to p = 128: scale 247, not the NaN scale (MX_SPEC).
  EXPECT_EQ(mxmoe_e8m0_from_amax(mxtest::float_of(0x7F7FFFFFu), MXMOE_SCALE_EVEN), 247);
  EXPECT_EQ(mxmoe_e8m0_from_amax(mxtest::float_of(0x7F7F0000u), MXMOE_SCALE_EVEN), 247);
  EXPECT_EQ(mxmoe_e8m0_from_amax(mxtest::float_of(0x7F700000u), MXMOE_SCALE_EVEN), 246);
}
