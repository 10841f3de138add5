// MX_SPEC.md's byte table, row by row, through mxmoe_quantize (1x32 blocks), FLOOR and RCEIL,
// bf16 and fp32 inputs, and the same rows through every coarse block shape (a uniform block gives
// the same bytes whatever the block's extent).
#include <gtest/gtest.h>

#include <functional>

#include "test_util.hpp"

using mxtest::Buffer;
using mxtest::float_of;

namespace {

struct Quantized {
  std::vector<uint8_t> q;
  std::vector<uint8_t> scale;
};

// Quantizes a (rows, 32 * k) tensor whose element (r, c) is value(c) along the last dim with the
// given block; returns q and scale_c.
Quantized run(mxmoe_dtype dtype, mxmoe_scale_mode mode, int block_r, int block_c, int64_t rows,
              int64_t cols, const std::function<float(int64_t)>& value) {
  Buffer x({rows, cols}, dtype);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x.set(r * cols + c, value(c));
  Buffer q({rows, cols}, MXMOE_DTYPE_E4M3, 0xAB), s({rows, cols / 32}, MXMOE_DTYPE_E8M0, 0xAB);
  mxmoe_tensor xv = x.view(), qv = q.view(), sv = s.view();
  mxmoe_quant_config cfg{block_r, block_c, mode};
  EXPECT_EQ(mxmoe_quantize(&xv, nullptr, cfg, &qv, nullptr, &sv, nullptr, nullptr), MXMOE_OK)
      << mxmoe_last_error();
  return {q.bytes, s.bytes};
}

struct Row {
  const char* name;
  std::function<float(int64_t)> value;  // element at column c
  bool fp32_only;
  int floor_scale, rceil_scale;
  std::function<uint8_t(int64_t, bool /*rceil*/, bool /*bf16*/)> data;
};

const float kInf = std::numeric_limits<float>::infinity();

std::vector<Row> rows() {
  auto alt = [](float v) { return [v](int64_t c) { return (c % 2) ? -v : v; }; };
  auto alt_code = [](uint8_t pos) {
    return [pos](int64_t c, bool, bool) { return static_cast<uint8_t>((c % 2) ? (pos | 0x80) : pos); };
  };
  return {
      {"all zeros", [](int64_t) { return 0.0f; }, false, 0, 0, [](int64_t, bool, bool) { return uint8_t{0}; }},
      {"all 2^-126", [](int64_t) { return std::ldexp(1.0f, -126); }, false, 0, 0,
       [](int64_t, bool, bool) { return uint8_t{0x40}; }},
      {"1.0 and one +Inf", [](int64_t c) { return c == 5 ? kInf : 1.0f; }, false, 255, 255,
       [](int64_t, bool, bool) { return uint8_t{0x7F}; }},
      {"1.0 and one NaN", [](int64_t c) { return c == 7 ? std::nanf("") : 1.0f; }, false, 255, 255,
       [](int64_t, bool, bool) { return uint8_t{0x7F}; }},
      {"all NaN", [](int64_t) { return std::nanf(""); }, false, 255, 255,
       [](int64_t, bool, bool) { return uint8_t{0x7F}; }},
      {"all +-448", alt(448.0f), false, 127, 127, alt_code(0x7E)},
      {"all +-bf16 max", alt(float_of(0x7F7F0000)), false, 246, 247,
       [](int64_t c, bool rceil, bool) {
         const uint8_t p = rceil ? 0x78 : 0x7E;
         return static_cast<uint8_t>((c % 2) ? (p | 0x80) : p);
       }},
      {"all +-fp32 max", alt(float_of(0x7F7FFFFF)), true, 246, 247,
       [](int64_t c, bool rceil, bool) {
         const uint8_t p = rceil ? 0x78 : 0x7E;
         return static_cast<uint8_t>((c % 2) ? (p | 0x80) : p);
       }},
      {"all +-bf16 smallest subnormal", alt(float_of(0x00010000)), false, 0, 0,
       [](int64_t c, bool, bool) { return static_cast<uint8_t>((c % 2) ? 0x88 : 0x08); }},
      {"all +-fp32 smallest subnormal", alt(float_of(0x00000001)), true, 0, 0,
       [](int64_t c, bool, bool) { return static_cast<uint8_t>((c % 2) ? 0x80 : 0x00); }},
      {"1.0 and one +-subnormal (bf16)",
       [](int64_t c) { return c == 3 ? float_of(0x00010000) : (c == 4 ? -float_of(0x00010000) : 1.0f); },
       false, 119, 119,
       [](int64_t c, bool, bool) { return uint8_t(c == 3 ? 0x00 : (c == 4 ? 0x80 : 0x78)); }},
      {"1.0 and one +-subnormal (fp32)",
       [](int64_t c) { return c == 3 ? float_of(0x00000001) : (c == 4 ? -float_of(0x00000001) : 1.0f); },
       true, 119, 119,
       [](int64_t c, bool, bool) { return uint8_t(c == 3 ? 0x00 : (c == 4 ? 0x80 : 0x78)); }},
      {"all 0x40600001", [](int64_t) { return float_of(0x40600001); }, true, 120, 121,
       [](int64_t, bool rceil, bool) { return uint8_t(rceil ? 0x76 : 0x7E); }},
      {"all 0x43FFFFFF", [](int64_t) { return float_of(0x43FFFFFF); }, true, 127, 128,
       [](int64_t, bool rceil, bool) { return uint8_t(rceil ? 0x78 : 0x7E); }},
      {"all +-480", alt(480.0f), false, 127, 128,
       [](int64_t c, bool rceil, bool) {
         const uint8_t p = rceil ? 0x77 : 0x7E;
         return static_cast<uint8_t>((c % 2) ? (p | 0x80) : p);
       }},
  };
}

void check_rows(int block_r, int block_c, int64_t rows_n, int64_t cols) {
  for (const Row& row : rows()) {
    for (mxmoe_dtype dtype : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}) {
      if (row.fp32_only && dtype == MXMOE_DTYPE_BF16) continue;
      for (mxmoe_scale_mode mode : {MXMOE_SCALE_FLOOR, MXMOE_SCALE_RCEIL}) {
        const bool rceil = mode == MXMOE_SCALE_RCEIL;
        SCOPED_TRACE(std::string(row.name) + (dtype == MXMOE_DTYPE_BF16 ? " bf16" : " fp32") +
                     (rceil ? " RCEIL" : " FLOOR") + " block " + std::to_string(block_r) + "x" +
                     std::to_string(block_c));
        // Every row of the tensor repeats the pattern of a 32-block (value(c % 32)).
        auto v = [&](int64_t c) { return row.value(c % 32); };
        Quantized got = run(dtype, mode, block_r, block_c, rows_n, cols, v);
        const int want_scale = rceil ? row.rceil_scale : row.floor_scale;
        for (size_t i = 0; i < got.scale.size(); ++i) ASSERT_EQ(got.scale[i], want_scale) << "scale " << i;
        for (size_t i = 0; i < got.q.size(); ++i)
          ASSERT_EQ(got.q[i], row.data(static_cast<int64_t>(i % cols) % 32, rceil, dtype == MXMOE_DTYPE_BF16))
              << "element " << i;
      }
    }
  }
}

}  // namespace

TEST(SpecTable, Blocks1x32) { check_rows(1, 32, 3, 64); }

// The EVEN row: all +-(dtype max) rounds amax up past the largest exponent; MX_SPEC gives p = 128,
// scale 247 and the data bytes of RCEIL (0x78, sign bit for negatives), never the NaN scale.
TEST(SpecTable, EvenAtDtypeMax) {
  for (const bool fp32 : {false, true}) {
    const float v = float_of(fp32 ? 0x7F7FFFFFu : 0x7F7F0000u);
    for (const auto& blk : {std::pair<int, int>{1, 32}, {1, 128}, {128, 128}}) {
      const int64_t rows = blk.first == 128 ? 130 : 3, cols = 160;
      const Quantized got = run(fp32 ? MXMOE_DTYPE_F32 : MXMOE_DTYPE_BF16, MXMOE_SCALE_EVEN, blk.first, blk.second,
                                rows, cols, [v](int64_t c) { return (c % 2) ? -v : v; });
      for (size_t i = 0; i < got.scale.size(); ++i) ASSERT_EQ(got.scale[i], 247) << i;
      for (size_t i = 0; i < got.q.size(); ++i)
        ASSERT_EQ(got.q[i], static_cast<uint8_t>(((i % cols) % 2) ? 0xF8 : 0x78)) << i;
    }
  }
}
TEST(SpecTable, Blocks1x128) { check_rows(1, 128, 2, 160); }  // one full and one partial block
TEST(SpecTable, Blocks128x128) { check_rows(128, 128, 130, 160); }  // partial edge tiles both ways
