// The gather variant of the tile128 grouped GEMM (mxmoe_grouped_mm_tile128_gather) on the host: the
// same bits as mxmoe_grouped_mm_tile128 on the routed copy of the operand (test_util.hpp's
// routed_copy writes the contract out: clamped indices, zero rows for negative ones), with the row
// scale applied to the f32 product; and its argument checks. The device kernel is held to the same
// contract in test_cuda_gemm.cpp.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"

using mxtest::Buffer;

namespace {

struct Operands {
  int64_t T, K, N, fanout;
  std::vector<int32_t> ends, gather;
  Buffer a, as, b, bs, offs, bias, row_scale;
};

// Per-token operand (T, K) with 1x128 scales, G experts' (N, K) weights with 128x128 tile scales, a
// routed index list in expert order with padding rows (-1), one index past T * fanout (clamped) and
// tail rows past the last group.
Operands make(int64_t T, int64_t K, int64_t N, int64_t fanout, std::vector<int32_t> sizes, uint32_t seed) {
  std::mt19937 rng(seed);
  Operands o{T, K, N, fanout, {}, {}, Buffer({T, K}, MXMOE_DTYPE_E4M3), Buffer({T, K / 32}, MXMOE_DTYPE_E8M0),
             Buffer({static_cast<int64_t>(sizes.size()), N, K}, MXMOE_DTYPE_E4M3),
             Buffer({static_cast<int64_t>(sizes.size()), N, K / 32}, MXMOE_DTYPE_E8M0), Buffer(), Buffer(), Buffer()};
  auto code = [&] {
    for (;;) {
      const uint8_t v = static_cast<uint8_t>(rng() & 0xFF);
      if ((v & 0x7F) != 0x7F) return v;  // no NaN codes
    }
  };
  for (auto& v : o.a.bytes) v = code();
  for (auto& v : o.b.bytes) v = code();
  for (int64_t r = 0; r < T; ++r)
    for (int64_t j = 0; j < K / 32; j += 4) {
      const uint8_t s = static_cast<uint8_t>(120 + rng() % 15);
      for (int64_t q = j; q < std::min<int64_t>(j + 4, K / 32); ++q) o.as.bytes[r * (K / 32) + q] = s;
    }
  const int64_t G = static_cast<int64_t>(sizes.size());
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; n += 128)
      for (int64_t j = 0; j < K / 32; j += 4) {
        const uint8_t s = static_cast<uint8_t>(120 + rng() % 15);
        for (int64_t nn = n; nn < std::min<int64_t>(n + 128, N); ++nn)
          for (int64_t q = j; q < std::min<int64_t>(j + 4, K / 32); ++q) o.bs.bytes[(g * N + nn) * (K / 32) + q] = s;
      }
  int32_t end = 0;
  for (int32_t s : sizes) {
    for (int32_t i = 0; i < s; ++i) {
      const uint32_t u = rng() % 16;
      o.gather.push_back(u == 0 ? -1 : (u == 1 ? static_cast<int32_t>(T * fanout + 5)
                                               : static_cast<int32_t>(rng() % (T * fanout))));
    }
    o.ends.push_back(end += s);
  }
  for (int i = 0; i < 7; ++i) o.gather.push_back(static_cast<int32_t>(rng() % (T * fanout)));  // tail rows
  o.offs = mxtest::offsets(o.ends);
  o.bias = Buffer({G, N}, MXMOE_DTYPE_BF16);
  o.row_scale = Buffer({T, fanout}, MXMOE_DTYPE_F32);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int64_t i = 0; i < o.bias.numel(); ++i) o.bias.set(i, nd(rng));
  for (int64_t i = 0; i < o.row_scale.numel(); ++i) o.row_scale.set(i, nd(rng));
  return o;
}

Buffer gather_buf(const std::vector<int32_t>& g) {
  Buffer b({static_cast<int64_t>(g.size())}, MXMOE_DTYPE_I32);
  std::memcpy(b.bytes.data(), g.data(), g.size() * 4);
  return b;
}

mxmoe_status run_gather(Operands& o, bool bias, bool row_scale, Buffer& out) {
  Buffer gi = gather_buf(o.gather);
  auto va = o.a.view(), vas = o.as.view(), vg = gi.view(), vrs = o.row_scale.view(), vb = o.b.view(),
       vbs = o.bs.view(), vo = o.offs.view(), vbias = o.bias.view(), vout = out.view();
  return mxmoe_grouped_mm_tile128_gather(&va, &vas, &vg, o.fanout, row_scale ? &vrs : nullptr, &vb, &vbs, &vo,
                                         bias ? &vbias : nullptr, &vout, nullptr);
}

// The plain GEMM on the routed copy.
Buffer run_routed(Operands& o, const mxtest::RoutedCopy& c, bool bias, mxmoe_dtype dtype) {
  Buffer out({static_cast<int64_t>(o.gather.size()), o.N}, dtype);
  Buffer q = c.q, s = c.scale;
  auto va = q.view(), vas = s.view(), vb = o.b.view(), vbs = o.bs.view(), vo = o.offs.view(), vbias = o.bias.view(),
       vout = out.view();
  EXPECT_EQ(mxmoe_grouped_mm_tile128(&va, &vas, &vb, &vbs, &vo, bias ? &vbias : nullptr, &vout, nullptr, nullptr),
            MXMOE_OK)
      << mxmoe_last_error();
  return out;
}

TEST(GatherGemm, SameBitsAsTheRoutedCopy) {
  for (auto dtype : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}) {
    for (bool bias : {false, true}) {
      Operands o = make(50, 160, 144, 3, {20, 0, 37, 16}, 11);
      const auto c = mxtest::routed_copy(o.a, o.as, o.gather, o.fanout);
      Buffer out({static_cast<int64_t>(o.gather.size()), o.N}, dtype, 0xFF);
      ASSERT_EQ(run_gather(o, bias, false, out), MXMOE_OK) << mxmoe_last_error();
      const Buffer ref = run_routed(o, c, bias, dtype);
      ASSERT_EQ(out.bytes, ref.bytes) << "dtype " << dtype << " bias " << bias;
    }
  }
}

TEST(GatherGemm, RowScaleAfterTheProduct) {
  for (bool bias : {false, true}) {
    Operands o = make(40, 128, 128, 8, {33, 17, 0, 60}, 12);
    const auto c = mxtest::routed_copy(o.a, o.as, o.gather, o.fanout);
    Buffer out({static_cast<int64_t>(o.gather.size()), o.N}, MXMOE_DTYPE_BF16, 0xFF);
    ASSERT_EQ(run_gather(o, bias, true, out), MXMOE_OK) << mxmoe_last_error();
    const Buffer y = run_routed(o, c, false, MXMOE_DTYPE_F32);
    const Buffer ref = mxtest::row_scaled(y, c, o.row_scale, bias ? &o.bias : nullptr, o.ends, MXMOE_DTYPE_BF16);
    ASSERT_EQ(out.bytes, ref.bytes) << "bias " << bias;
    // a padding row is zero, and the scale moved it away from the unscaled product
    const Buffer plain = run_routed(o, c, bias, MXMOE_DTYPE_BF16);
    EXPECT_NE(out.bytes, plain.bytes);
  }
}

TEST(GatherGemm, Validation) {
  Operands o = make(20, 64, 32, 2, {10, 12}, 13);
  Buffer out({static_cast<int64_t>(o.gather.size()), o.N}, MXMOE_DTYPE_BF16);
  Buffer gi = gather_buf(o.gather);
  auto va = o.a.view(), vas = o.as.view(), vg = gi.view(), vrs = o.row_scale.view(), vb = o.b.view(),
       vbs = o.bs.view(), vo = o.offs.view(), vout = out.view();
  auto expect_error = [&](mxmoe_status st, const std::string& what) {
    EXPECT_EQ(st, MXMOE_ERR_INVALID_ARGUMENT) << what;
    EXPECT_NE(std::string(mxmoe_last_error()).find(what), std::string::npos) << mxmoe_last_error();
  };
  expect_error(mxmoe_grouped_mm_tile128_gather(&va, &vas, &vg, 0, nullptr, &vb, &vbs, &vo, nullptr, &vout, nullptr),
               "fanout");
  expect_error(mxmoe_grouped_mm_tile128_gather(&va, &vas, nullptr, 2, nullptr, &vb, &vbs, &vo, nullptr, &vout, nullptr),
               "gather");
  Buffer g64({static_cast<int64_t>(o.gather.size())}, MXMOE_DTYPE_F32);
  auto vg64 = g64.view();
  expect_error(mxmoe_grouped_mm_tile128_gather(&va, &vas, &vg64, 2, nullptr, &vb, &vbs, &vo, nullptr, &vout, nullptr),
               "gather");
  Buffer rs_bad({o.T, 3}, MXMOE_DTYPE_F32);
  auto vrs_bad = rs_bad.view();
  expect_error(mxmoe_grouped_mm_tile128_gather(&va, &vas, &vg, 2, &vrs_bad, &vb, &vbs, &vo, nullptr, &vout, nullptr),
               "row_scale");
  Buffer short_out({static_cast<int64_t>(o.gather.size()) - 1, o.N}, MXMOE_DTYPE_BF16);
  auto vshort = short_out.view();
  expect_error(mxmoe_grouped_mm_tile128_gather(&va, &vas, &vg, 2, &vrs, &vb, &vbs, &vo, nullptr, &vshort, nullptr),
               "out");
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_available(10, 32, 64, 2, 20, 2, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_available(10, 32, 64, 2, 20, 0, -1), 0);
}

}  // namespace
