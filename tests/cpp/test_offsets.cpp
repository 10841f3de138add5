// mxmoe_clamp_offsets on the host: the clamped group ends min(m, max(0, offs[0..i])), written out
// by hand for each case, and its argument checks (nothing written on error).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mxmoe/mxmoe.h"

namespace {

mxmoe_tensor vec_i32(std::vector<int32_t>& v) {
  mxmoe_tensor t{};
  t.data = v.data();
  t.dtype = MXMOE_DTYPE_I32;
  t.ndim = 1;
  t.shape[0] = static_cast<int64_t>(v.size());
  t.strides[0] = 1;
  t.device = -1;
  return t;
}

}  // namespace

TEST(ClampOffsets, HandWrittenCases) {
  struct Case {
    std::vector<int32_t> offs;
    int64_t m;
    std::vector<int32_t> want;
  };
  const std::vector<Case> cases = {
      {{3, 0, 5}, 8, {3, 3, 5}},            // decreasing end: empty group
      {{-4, 2, 1, 9}, 6, {0, 2, 2, 6}},     // negative start, past m
      {{7, 7, 7}, 7, {7, 7, 7}},            // all rows in the first group
      {{100}, 0, {0}},                      // m = 0
  };
  for (const auto& c : cases) {
    std::vector<int32_t> offs = c.offs, out(c.offs.size(), -99);
    mxmoe_tensor o = vec_i32(offs), r = vec_i32(out);
    ASSERT_EQ(mxmoe_clamp_offsets(&o, c.m, &r, nullptr), MXMOE_OK) << mxmoe_last_error();
    EXPECT_EQ(out, c.want);
  }
}

TEST(ClampOffsets, RejectsBadArgumentsWithoutWriting) {
  std::vector<int32_t> offs = {1, 2, 3}, out = {-7, -7, -7}, short_out = {-7, -7};
  mxmoe_tensor o = vec_i32(offs), r = vec_i32(out), s = vec_i32(short_out);
  EXPECT_EQ(mxmoe_clamp_offsets(&o, -1, &r, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("m: expected >= 0"), std::string::npos);
  EXPECT_EQ(mxmoe_clamp_offsets(&o, 4, &s, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("out"), std::string::npos);
  EXPECT_EQ(mxmoe_clamp_offsets(&o, 4, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  mxmoe_tensor same = vec_i32(offs);
  EXPECT_EQ(mxmoe_clamp_offsets(&o, 4, &same, nullptr), MXMOE_ERR_INVALID_ARGUMENT);  // in place: overlap
  r.dtype = MXMOE_DTYPE_F32;
  EXPECT_EQ(mxmoe_clamp_offsets(&o, 4, &r, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out, std::vector<int32_t>({-7, -7, -7}));
  EXPECT_EQ(short_out, std::vector<int32_t>({-7, -7}));
}

// Size formulas on arguments whose results do not fit int64: -1, never an overflowed value
// (found by the fuzz harness, tests/fuzz/regressions/).
TEST(SizeFormulas, OverflowAndNegativeGiveMinusOne) {
  const int64_t big = INT64_MAX;
  EXPECT_EQ(mxmoe_grouped_scale_capacity(big, 0), big / 32 + 1);  // ceil(m/32) itself fits
  EXPECT_EQ(mxmoe_grouped_scale_capacity(3961, big), -1);
  EXPECT_EQ(mxmoe_grouped_scale_capacity(-1, 2), -1);
  EXPECT_EQ(mxmoe_blocked_size(MXMOE_BLOCKED_WHOLE, -(int64_t{1} << 62), 22, 0), -1);
  EXPECT_EQ(mxmoe_blocked_size(MXMOE_BLOCKED_WHOLE, int64_t{1} << 40, int64_t{1} << 40, 0), -1);
  EXPECT_EQ(mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_M, 1, 4, big / 64), -1);
  EXPECT_EQ(mxmoe_blocked_size(MXMOE_BLOCKED_WHOLE, 130, 5, 0), 256 * 8);
  EXPECT_EQ(mxmoe_blocked_size(MXMOE_BLOCKED_PER_EXPERT, 7, 300, 9), 9 * 128 * 300);
}

// Views whose sizes would overflow the kernels' arithmetic are refused with a message naming the
// argument; an empty tensor with torch's arbitrary strides is accepted as contiguous.
TEST(Views, HugeDimsRefusedEmptyStridesAccepted) {
  std::vector<int32_t> offs = {0};
  mxmoe_tensor o = vec_i32(offs);
  mxmoe_tensor x{};
  x.dtype = MXMOE_DTYPE_BF16;
  x.ndim = 2;
  x.shape[0] = 0;
  x.shape[1] = INT64_MAX;
  x.strides[0] = 1;
  x.strides[1] = 1;
  x.device = -1;
  EXPECT_EQ(mxmoe_zero_rows_past_groups(&x, &o, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("x: expected sizes <= 2^40"), std::string::npos);
  x.shape[1] = 64;  // (0, 64) with strides (1, 1), as torch reports for an empty tensor
  EXPECT_EQ(mxmoe_zero_rows_past_groups(&x, &o, nullptr), MXMOE_OK) << mxmoe_last_error();
}
