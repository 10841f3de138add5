// Blocked ("swizzled") scale layouts against MX_SPEC.md's formula, written out here on its own:
// hand-computed byte positions, every byte of the buffer (padding must be 0 even when the buffer
// starts as 0xFF), and round trips for all four kinds on ragged shapes and jagged groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>

#include "test_util.hpp"

using mxtest::Buffer;

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t rup(int64_t a, int64_t b) { return cdiv(a, b) * b; }

// MX_SPEC.md: S[i][j] -> ((i/128) * (Wp/4) + j/4) * 512 + (i%32) * 16 + ((i%128)/32) * 4 + j%4.
int64_t blocked_index(int64_t i, int64_t j, int64_t w) {
  return ((i / 128) * (rup(w, 4) / 4) + j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + j % 4;
}

// Random scale bytes, never 0 (so a value left at 0 is distinguishable from a copied one).
Buffer random_scales(std::vector<int64_t> shape, uint32_t seed) {
  Buffer b(std::move(shape), MXMOE_DTYPE_E8M0);
  std::mt19937 rng(seed);
  for (auto& v : b.bytes) v = static_cast<uint8_t>(1 + rng() % 254);
  return b;
}

struct GroupInfo {
  std::vector<int64_t> start, size;
};
// Groups from well-formed cumulative ends.
GroupInfo groups_of(const std::vector<int32_t>& ends) {
  GroupInfo g;
  int64_t prev = 0;
  for (int32_t e : ends) {
    g.start.push_back(prev);
    g.size.push_back(e - prev);
    prev = e;
  }
  return g;
}

// Random jagged cumulative ends over m rows: empty groups, sizes not multiples of 32, last < m.
std::vector<int32_t> jagged_ends(int64_t m, int groups, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ends(groups);
  for (auto& e : ends) e = static_cast<int32_t>(rng() % (m + 1));
  std::sort(ends.begin(), ends.end());
  if (groups > 2) ends[1] = ends[0];  // an empty group for sure
  return ends;
}

mxmoe_status to_blocked(Buffer& scale, mxmoe_blocked_kind kind, Buffer* offs, Buffer& blocked) {
  mxmoe_tensor s = scale.view(), b = blocked.view();
  mxmoe_tensor o{};
  if (offs) o = offs->view();
  return mxmoe_scales_to_blocked(&s, kind, offs ? &o : nullptr, &b, nullptr);
}
mxmoe_status from_blocked(Buffer& blocked, mxmoe_blocked_kind kind, Buffer* offs, Buffer& scale) {
  mxmoe_tensor s = scale.view(), b = blocked.view();
  mxmoe_tensor o{};
  if (offs) o = offs->view();
  return mxmoe_scales_from_blocked(&b, kind, offs ? &o : nullptr, &s, nullptr);
}

// Runs to_blocked on a 0xFF-filled buffer and compares all of it with `expected`; then
// from_blocked into a 0xAB-filled scale tensor and compares with `expected_back`.
void check_both_ways(Buffer& scale, mxmoe_blocked_kind kind, Buffer* offs,
                     const std::vector<uint8_t>& expected, const std::vector<uint8_t>& expected_back) {
  Buffer blocked({static_cast<int64_t>(expected.size())}, MXMOE_DTYPE_E8M0, 0xFF);
  ASSERT_EQ(to_blocked(scale, kind, offs, blocked), MXMOE_OK) << mxmoe_last_error();
  for (size_t k = 0; k < expected.size(); ++k)
    ASSERT_EQ(blocked.bytes[k], expected[k]) << "blocked byte " << k;
  Buffer back(scale.shape, MXMOE_DTYPE_E8M0, 0xAB);
  ASSERT_EQ(from_blocked(blocked, kind, offs, back), MXMOE_OK) << mxmoe_last_error();
  for (size_t k = 0; k < expected_back.size(); ++k)
    ASSERT_EQ(back.bytes[k], expected_back[k]) << "scale byte " << k;
}

// Expected WHOLE image of an (h, w) matrix given by get(i, j), written at `base` of `out`.
template <typename Get>
void place_whole(std::vector<uint8_t>& out, int64_t base, int64_t h, int64_t w, Get get) {
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < w; ++j) out[base + blocked_index(i, j, w)] = get(i, j);
}

}  // namespace

TEST(BlockedLayout, SizesMatchSpec) {
  EXPECT_EQ(mxmoe_blocked_size(MXMOE_BLOCKED_WHOLE, 130, 5, 0), 256 * 8);
  EXPECT_EQ(mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_M, 300, 6, 3), (300 + 384) * 8);
  EXPECT_EQ(mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_K, 150, 333, 3), 256 * (11 + 12));
  EXPECT_EQ(mxmoe_blocked_size(MXMOE_BLOCKED_PER_EXPERT, 130, 6, 3), 3 * 256 * 8);
}

// Positions worked out by hand from the formula for a (130, 5) matrix (Hp = 256, Wp = 8).
TEST(BlockedLayout, KnownPositionsWhole) {
  const struct {
    int i, j, byte;
  } known[] = {
      {0, 0, 0},       // first tile, first word
      {0, 3, 3},       // same 32-bit word: four consecutive columns
      {0, 4, 512},     // next column quad -> next 512-byte tile
      {1, 0, 16},      // rows step 16 bytes inside a 32-row slab
      {32, 0, 4},      // row 32 is the second word of row 0's 16-byte line
      {33, 2, 22},     // 16 + 4 + 2
      {127, 3, 511},   // 31*16 + 3*4 + 3: last byte of the tile
      {128, 0, 1024},  // second 128-row band starts after Wp/4 = 2 tiles
      {129, 4, 1552},  // (1*2 + 1)*512 + 16
  };
  Buffer s({130, 5}, MXMOE_DTYPE_E8M0);
  for (int64_t k = 0; k < s.numel(); ++k) s.bytes[k] = static_cast<uint8_t>(1 + k % 251);
  Buffer b({256 * 8}, MXMOE_DTYPE_E8M0, 0xFF);
  ASSERT_EQ(to_blocked(s, MXMOE_BLOCKED_WHOLE, nullptr, b), MXMOE_OK) << mxmoe_last_error();
  for (auto& k : known) {
    EXPECT_EQ(blocked_index(k.i, k.j, 5), k.byte) << k.i << "," << k.j;
    EXPECT_EQ(b.bytes[k.byte], s.bytes[k.i * 5 + k.j]) << k.i << "," << k.j;
  }
  // Padding: column 5..7 of any row, rows 130..255.
  EXPECT_EQ(b.bytes[512 + 1], 0);                    // (0, 5)
  EXPECT_EQ(b.bytes[1024 + 2 * 16], 0);              // (130, 0)
  EXPECT_EQ(b.bytes[1024 + 512 + 31 * 16 + 15], 0);  // (255, 7)
}

TEST(BlockedLayout, WholeEveryByteAndRoundTrip) {
  for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {130, 5}, {200, 7}, {128, 4}, {257, 33}}) {
    SCOPED_TRACE(testing::Message() << h << "x" << w);
    Buffer s = random_scales({h, w}, static_cast<uint32_t>(h * 1000 + w));
    std::vector<uint8_t> exp(static_cast<size_t>(rup(h, 128) * rup(w, 4)), 0);
    place_whole(exp, 0, h, w, [&](int64_t i, int64_t j) { return s.bytes[i * w + j]; });
    check_both_ways(s, MXMOE_BLOCKED_WHOLE, nullptr, exp, s.bytes);
  }
}

// Large enough to be split across threads.
TEST(BlockedLayout, WholeLargeRoundTrip) {
  const int64_t h = 4100, w = 130;
  Buffer s = random_scales({h, w}, 7);
  std::vector<uint8_t> exp(static_cast<size_t>(rup(h, 128) * rup(w, 4)), 0);
  place_whole(exp, 0, h, w, [&](int64_t i, int64_t j) { return s.bytes[i * w + j]; });
  check_both_ways(s, MXMOE_BLOCKED_WHOLE, nullptr, exp, s.bytes);
}

namespace {
// GROUPS_M expectation: group g's rows blocked on their own from row sum_{h<g} rup(size_h, 128).
void check_groups_m(int64_t m, int64_t w, const std::vector<int32_t>& ends, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "M=" << m << " W=" << w << " G=" << ends.size());
  const int64_t G = static_cast<int64_t>(ends.size()), wp = rup(w, 4);
  Buffer s = random_scales({m, w}, seed);
  Buffer offs = mxtest::offsets(ends);
  const GroupInfo g = groups_of(ends);
  std::vector<uint8_t> exp(static_cast<size_t>((m + 128 * G) * wp), 0);
  ASSERT_EQ(static_cast<int64_t>(exp.size()), mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_M, m, w, G));
  int64_t row = 0;
  for (int64_t k = 0; k < G; ++k) {
    place_whole(exp, row * wp, g.size[k], w,
                [&](int64_t i, int64_t j) { return s.bytes[(g.start[k] + i) * w + j]; });
    row += rup(g.size[k], 128);
  }
  // Rows after the last group are in no group: they come back as 0.
  std::vector<uint8_t> back = s.bytes;
  const int64_t last = G ? ends.back() : 0;
  std::fill(back.begin() + last * w, back.end(), 0);
  check_both_ways(s, MXMOE_BLOCKED_GROUPS_M, &offs, exp, back);
}
}  // namespace

TEST(BlockedLayout, GroupsMJagged) {
  check_groups_m(300, 6, {0, 50, 50, 178, 290}, 1);  // empty first/middle groups, last < M
  check_groups_m(300, 6, {300}, 2);                   // G = 1
  check_groups_m(256, 4, {128, 256}, 3);              // aligned groups: no gaps at all
  check_groups_m(1000, 5, jagged_ends(1000, 40, 4), 4);  // G > 32
  check_groups_m(70, 3, {0, 0, 0}, 5);                // every group empty: all padding
}

namespace {
// GROUPS_K expectation: group g's compact columns [bs_g, bs_g + cols_g) blocked as a whole
// (R, cols_g) matrix at start_col_g * Rp, start_col_g = sum_{h<g} rup(cols_h, 4).
void check_groups_k(int64_t r, int64_t m, const std::vector<int32_t>& ends, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "R=" << r << " M=" << m << " G=" << ends.size());
  const int64_t G = static_cast<int64_t>(ends.size()), cap = cdiv(m, 32) + G, rp = rup(r, 128);
  ASSERT_EQ(mxmoe_grouped_scale_capacity(m, G), cap);
  Buffer s = random_scales({r, cap}, seed);  // unused columns hold junk too
  Buffer offs = mxtest::offsets(ends);
  const GroupInfo g = groups_of(ends);
  std::vector<uint8_t> exp(static_cast<size_t>(mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_K, r, m, G)), 0);
  ASSERT_EQ(static_cast<int64_t>(exp.size()), rp * (cdiv(m, 32) + 4 * G));
  std::vector<uint8_t> back(s.bytes.size(), 0);
  int64_t block_start = 0, start_col = 0;
  for (int64_t k = 0; k < G; ++k) {
    const int64_t cols = cdiv(g.size[k], 32);
    place_whole(exp, start_col * rp, r, cols,
                [&](int64_t i, int64_t j) { return s.bytes[i * cap + block_start + j]; });
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < cols; ++j) back[i * cap + block_start + j] = s.bytes[i * cap + block_start + j];
    block_start += cols;
    start_col += rup(cols, 4);
  }
  check_both_ways(s, MXMOE_BLOCKED_GROUPS_K, &offs, exp, back);
}
}  // namespace

TEST(BlockedLayout, GroupsKJagged) {
  check_groups_k(150, 333, {0, 33, 33, 100, 320}, 11);  // partial blocks, empty groups, last < M
  check_groups_k(130, 96, {96}, 12);                      // G = 1
  check_groups_k(1, 64, {1, 2, 64}, 13);                  // one row; 1-token groups
  check_groups_k(200, 2000, jagged_ends(2000, 37, 14), 14);  // G > 32
}

TEST(BlockedLayout, PerExpertEveryByteAndRoundTrip) {
  for (auto [G, r, c] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{3, 130, 6}, {1, 5, 1}, {40, 33, 9}}) {
    SCOPED_TRACE(testing::Message() << G << "x" << r << "x" << c);
    Buffer s = random_scales({G, r, c}, static_cast<uint32_t>(G + r + c));
    const int64_t per = rup(r, 128) * rup(c, 4);
    std::vector<uint8_t> exp(static_cast<size_t>(G * per), 0);
    for (int64_t e = 0; e < G; ++e)
      place_whole(exp, e * per, r, c, [&](int64_t i, int64_t j) { return s.bytes[(e * r + i) * c + j]; });
    check_both_ways(s, MXMOE_BLOCKED_PER_EXPERT, nullptr, exp, s.bytes);
  }
}

// Bad offsets are clamped (groups_from_offsets' rule), never followed out of bounds: the result
// equals the one for the clamped offsets.
TEST(BlockedLayout, BadOffsetsAreClamped) {
  const int64_t m = 200, w = 5;
  Buffer s = random_scales({m, w}, 21);
  Buffer bad = mxtest::offsets({50, 20, 500, 100}), good = mxtest::offsets({50, 50, 200, 200});
  const int64_t size = mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_M, m, w, 4);
  Buffer b1({size}, MXMOE_DTYPE_E8M0, 0xFF), b2({size}, MXMOE_DTYPE_E8M0, 0xEE);
  ASSERT_EQ(to_blocked(s, MXMOE_BLOCKED_GROUPS_M, &bad, b1), MXMOE_OK) << mxmoe_last_error();
  ASSERT_EQ(to_blocked(s, MXMOE_BLOCKED_GROUPS_M, &good, b2), MXMOE_OK) << mxmoe_last_error();
  EXPECT_EQ(b1.bytes, b2.bytes);

  const int64_t r = 40, tokens = 100, G = 3, cap = cdiv(tokens, 32) + G;
  Buffer sk = random_scales({r, cap}, 22);
  Buffer badk = mxtest::offsets({-7, 300, 5}), goodk = mxtest::offsets({0, 128, 128});
  // Offsets are clamped at the token count the scale's width implies: ceil(100/32)*32 = 128.
  const int64_t sizek = mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_K, r, tokens, G);
  Buffer k1({sizek}, MXMOE_DTYPE_E8M0, 0xFF), k2({sizek}, MXMOE_DTYPE_E8M0, 0xEE);
  ASSERT_EQ(to_blocked(sk, MXMOE_BLOCKED_GROUPS_K, &badk, k1), MXMOE_OK) << mxmoe_last_error();
  ASSERT_EQ(to_blocked(sk, MXMOE_BLOCKED_GROUPS_K, &goodk, k2), MXMOE_OK) << mxmoe_last_error();
  EXPECT_EQ(k1.bytes, k2.bytes);
}
