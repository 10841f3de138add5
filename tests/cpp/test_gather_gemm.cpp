// The gather variant of the tile128 grouped GEMM (mxmoe_grouped_mm_tile128_gather) on the host: the
// same bits as mxmoe_grouped_mm_tile128 on the routed copy of the operand (test_util.hpp's
// routed_copy writes the contract out: clamped indices, zero rows for negative ones), with the row
// scale applied to the f32 product; and its argument checks. The device kernel is held to the same
// contract in test_cuda_gemm.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/moe_activation.hpp"
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

// The dSwiGLU epilogue variant on the host (mxmoe_grouped_mm_tile128_gather_dswiglu): the routing
// weights' partials in the documented order from the gather GEMM's dY' and h, the rows past the last
// group as a zero dY', and the argument checks. (The codes are the quantize pass's by construction on
// the host; test_cuda_gemm.cpp holds the device kernel to them.)
struct DSwiglu {
  Operands o;
  int64_t I, M;
  Buffer h, q, sc, qt, st, tw;
};

DSwiglu make_dswiglu(uint32_t seed) {
  DSwiglu d{make(40, 128, 256, 4, {33, 17, 0, 64}, seed), 256, 0, {}, {}, {}, {}, {}, {}};
  d.M = static_cast<int64_t>(d.o.gather.size());
  const int64_t G = static_cast<int64_t>(d.o.ends.size());
  d.h = mxtest::random_input({d.M, 2 * d.I}, MXMOE_DTYPE_BF16, seed + 1, 3.f);
  d.q = Buffer({d.M, 2 * d.I}, MXMOE_DTYPE_E4M3, 0xEE);
  d.sc = Buffer({d.M, 2 * d.I / 32}, MXMOE_DTYPE_E8M0, 0xEE);
  d.qt = Buffer({2 * d.I, d.M}, MXMOE_DTYPE_E4M3, 0xEE);
  d.st = Buffer({2 * d.I, mxmoe_grouped_scale_capacity(d.M, G)}, MXMOE_DTYPE_E8M0, 0xEE);
  d.tw = Buffer({d.M, d.I / 128}, MXMOE_DTYPE_F32, 0xEE);
  return d;
}

mxmoe_status run_dswiglu(DSwiglu& d, int32_t layout = 0, mxmoe_tensor* q_override = nullptr) {
  Buffer gi = gather_buf(d.o.gather);
  auto va = d.o.a.view(), vas = d.o.as.view(), vg = gi.view(), vrs = d.o.row_scale.view(), vb = d.o.b.view(),
       vbs = d.o.bs.view(), vo = d.o.offs.view(), vh = d.h.view(), vq = d.q.view(), vs = d.sc.view(),
       vqt = d.qt.view(), vst = d.st.view(), vtw = d.tw.view();
  return mxmoe_grouped_mm_tile128_gather_dswiglu(&va, &vas, &vg, d.o.fanout, &vrs, &vb, &vbs, &vo, &vh, layout, 1.f,
                                                 std::numeric_limits<float>::infinity(), 0.f, MXMOE_SCALE_RCEIL,
                                                 q_override ? q_override : &vq, &vs, &vqt, &vst, &vtw, nullptr);
}

TEST(GatherDSwiglu, WeightPartialsAndTail) {
  // b (G, I, K): the down projection's dgrad form; the operands' N is I here.
  DSwiglu d = make_dswiglu(21);
  ASSERT_EQ(run_dswiglu(d), MXMOE_OK) << mxmoe_last_error();
  Buffer dy({d.M, d.I}, MXMOE_DTYPE_BF16);
  ASSERT_EQ(run_gather(d.o, false, false, dy), MXMOE_OK) << mxmoe_last_error();
  const int64_t end = d.o.ends.back(), nt = d.I / 128;
  const mxmoe::SwigluParams p{0, 1.f, std::numeric_limits<float>::infinity(), 0.f};
  for (int64_t r = 0; r < d.M; ++r)
    for (int64_t t = 0; t < nt; ++t) {
      float s4[4] = {0.f, 0.f, 0.f, 0.f};
      for (int q4 = 0; r < end && q4 < 4; ++q4)
        for (int j = 0; j < 16; ++j)
          for (int e = 0; e < 2; ++e) {
            const int64_t c = 128 * t + 8 * j + 2 * q4 + e;
            const float y = mxmoe::swiglu_value(d.h.get(r * 2 * d.I + c), d.h.get(r * 2 * d.I + d.I + c), p);
            s4[q4] = mxmoe::add_rn(s4[q4], mxmoe::mul_rn(dy.get(r * d.I + c), y));
          }
      const float want = mxmoe::add_rn(mxmoe::add_rn(s4[0], s4[1]), mxmoe::add_rn(s4[2], s4[3]));
      ASSERT_EQ(mxtest::bits_of(d.tw.data<float>()[r * nt + t]), mxtest::bits_of(want)) << "row " << r << " tile " << t;
    }
  const uint8_t zero_scale = mxmoe_e8m0_from_amax(0.f, MXMOE_SCALE_RCEIL);
  for (int64_t r = end; r < d.M; ++r) {
    for (int64_t c = 0; c < 2 * d.I; ++c) ASSERT_EQ(d.q.u8(r * 2 * d.I + c), 0) << "row " << r;
    for (int64_t c = 0; c < 2 * d.I / 32; ++c) ASSERT_EQ(d.sc.u8(r * (2 * d.I / 32) + c), zero_scale) << "row " << r;
    for (int64_t c = 0; c < 2 * d.I; ++c) ASSERT_EQ(d.qt.u8(c * d.M + r), 0) << "row " << r;
  }
  // Some in-group codes are nonzero (the rows carry dH).
  int64_t nonzero = 0;
  for (int64_t i = 0; i < end * 2 * d.I; ++i) nonzero += d.q.u8(i) != 0;
  EXPECT_GT(nonzero, end * d.I);
}

TEST(GatherDSwiglu, Validation) {
  DSwiglu d = make_dswiglu(22);
  auto expect_error = [&](mxmoe_status st, const std::string& what) {
    EXPECT_EQ(st, MXMOE_ERR_INVALID_ARGUMENT) << what;
    EXPECT_NE(std::string(mxmoe_last_error()).find(what), std::string::npos) << mxmoe_last_error();
  };
  expect_error(run_dswiglu(d, 1), "layout");
  Buffer q_bad({d.M, 2 * d.I - 32}, MXMOE_DTYPE_E4M3);
  auto vq_bad = q_bad.view();
  expect_error(run_dswiglu(d, 0, &vq_bad), "dh_q");
  d.h = Buffer({d.M, 2 * d.I}, MXMOE_DTYPE_F32);
  expect_error(run_dswiglu(d), "h");
  // Nothing was written by the failed calls.
  for (uint8_t v : d.tw.bytes) ASSERT_EQ(v, 0xEE);
  DSwiglu narrow{make(20, 128, 96, 2, {10, 12}, 23), 96, 0, {}, {}, {}, {}, {}, {}};
  narrow.M = static_cast<int64_t>(narrow.o.gather.size());
  narrow.h = Buffer({narrow.M, 192}, MXMOE_DTYPE_BF16);
  narrow.q = Buffer({narrow.M, 192}, MXMOE_DTYPE_E4M3);
  narrow.sc = Buffer({narrow.M, 6}, MXMOE_DTYPE_E8M0);
  narrow.qt = Buffer({192, narrow.M}, MXMOE_DTYPE_E4M3);
  narrow.st = Buffer({192, mxmoe_grouped_scale_capacity(narrow.M, 2)}, MXMOE_DTYPE_E8M0);
  narrow.tw = Buffer({narrow.M, 1}, MXMOE_DTYPE_F32);
  expect_error(run_dswiglu(narrow), "multiple of 128");
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_dswiglu_available(10, 256, 128, 2, 20, 2, 0, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_dswiglu_available(10, 96, 128, 2, 20, 2, 0, -1), 0);
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_dswiglu_available(10, 256, 128, 2, 20, 2, 1, -1), 0);
}

// The SwiGLU epilogue variant on the host (mxmoe_grouped_mm_tile128_gather_swiglu): h is the gather
// GEMM's output and act(h)'s forms are the quantize pass's over the SWIGLU source (the composition the
// host runs; test_cuda_gemm.cpp holds the device kernel to the same bytes), with and without the
// columnwise form; and the argument checks.
struct Swiglu {
  Operands o;
  int64_t I, M;
  Buffer h, q, sc, qt, st;
};

Swiglu make_swiglu(uint32_t seed, int64_t I = 256) {
  Swiglu d{make(40, 128, 2 * I, 4, {33, 17, 0, 64}, seed), I, 0, {}, {}, {}, {}, {}};
  d.M = static_cast<int64_t>(d.o.gather.size());
  const int64_t G = static_cast<int64_t>(d.o.ends.size());
  d.h = Buffer({d.M, 2 * d.I}, MXMOE_DTYPE_BF16, 0xEE);
  d.q = Buffer({d.M, d.I}, MXMOE_DTYPE_E4M3, 0xEE);
  d.sc = Buffer({d.M, d.I / 32}, MXMOE_DTYPE_E8M0, 0xEE);
  d.qt = Buffer({d.I, d.M}, MXMOE_DTYPE_E4M3, 0xEE);
  d.st = Buffer({d.I, mxmoe_grouped_scale_capacity(d.M, G)}, MXMOE_DTYPE_E8M0, 0xEE);
  return d;
}

mxmoe_status run_swiglu(Swiglu& d, bool with_col = true, int32_t layout = 0, bool scale_t = true,
                        mxmoe_tensor* q_override = nullptr, bool bias = false) {
  Buffer gi = gather_buf(d.o.gather);
  auto va = d.o.a.view(), vas = d.o.as.view(), vg = gi.view(), vb = d.o.b.view(), vbs = d.o.bs.view(),
       vo = d.o.offs.view(), vh = d.h.view(), vq = d.q.view(), vs = d.sc.view(), vqt = d.qt.view(), vst = d.st.view(),
       vbias = d.o.bias.view();
  return mxmoe_grouped_mm_tile128_gather_swiglu(&va, &vas, &vg, d.o.fanout, &vb, &vbs, &vo, bias ? &vbias : nullptr,
                                                layout, 1.702f, 7.f, 1.f, MXMOE_SCALE_RCEIL, &vh,
                                                q_override ? q_override : &vq, &vs, with_col ? &vqt : nullptr,
                                                with_col && scale_t ? &vst : nullptr, nullptr);
}

// act(h)'s forms as the quantize pass writes them from h (the SWIGLU source, gpt-oss's activation).
void quantize_act(Buffer& h, Buffer& offs, int32_t layout, Swiglu& w) {
  auto vh = h.view(), vq = w.q.view(), vs = w.sc.view(), vqt = w.qt.view(), vst = w.st.view(), vo = offs.view();
  mxmoe_fused_source src{};
  src.kind = MXMOE_SOURCE_SWIGLU;
  src.a = &vh;
  src.layout = layout;
  src.alpha = 1.702f;
  src.limit = 7.f;
  src.up_offset = 1.f;
  mxmoe_fused_side row{}, col{};
  row.q = &vq;
  row.scale = &vs;
  col.qt = &vqt;
  col.scale = &vst;
  ASSERT_EQ(mxmoe_quantize_fused_source(&src, &vo, mxmoe_fused_config{128, 128, 0, MXMOE_SCALE_RCEIL}, &row, &col,
                                        nullptr),
            MXMOE_OK)
      << mxmoe_last_error();
}

TEST(GatherSwiglu, GemmThenQuantize) {
  Swiglu d = make_swiglu(31);
  ASSERT_EQ(run_swiglu(d), MXMOE_OK) << mxmoe_last_error();
  Buffer h({d.M, 2 * d.I}, MXMOE_DTYPE_BF16);
  ASSERT_EQ(run_gather(d.o, false, false, h), MXMOE_OK) << mxmoe_last_error();
  EXPECT_EQ(d.h.bytes, h.bytes);
  Swiglu w = make_swiglu(31);
  ASSERT_NO_FATAL_FAILURE(quantize_act(h, d.o.offs, 0, w));
  EXPECT_EQ(d.q.bytes, w.q.bytes);
  EXPECT_EQ(d.sc.bytes, w.sc.bytes);
  EXPECT_EQ(d.qt.bytes, w.qt.bytes);
  EXPECT_EQ(d.st.bytes, w.st.bytes);
  // The rows carry act: most in-group codes are nonzero.
  int64_t nonzero = 0;
  for (int64_t i = 0; i < d.o.ends.back() * d.I; ++i) nonzero += d.q.u8(i) != 0;
  EXPECT_GT(nonzero, d.o.ends.back() * d.I / 2);
  // Without the columnwise form: the same h and rowwise bytes, qt untouched.
  Swiglu n = make_swiglu(31);
  ASSERT_EQ(run_swiglu(n, false), MXMOE_OK) << mxmoe_last_error();
  EXPECT_EQ(n.h.bytes, h.bytes);
  EXPECT_EQ(n.q.bytes, w.q.bytes);
  EXPECT_EQ(n.sc.bytes, w.sc.bytes);
  for (uint8_t v : n.qt.bytes) ASSERT_EQ(v, 0xEE);
}

TEST(GatherSwiglu, Validation) {
  Swiglu d = make_swiglu(32);
  auto expect_error = [&](mxmoe_status st, const std::string& what) {
    EXPECT_EQ(st, MXMOE_ERR_INVALID_ARGUMENT) << what;
    EXPECT_NE(std::string(mxmoe_last_error()).find(what), std::string::npos) << mxmoe_last_error();
  };
  expect_error(run_swiglu(d, true, 2), "layout");
  expect_error(run_swiglu(d, true, 0, false), "act_qt, act_scale_t");
  Buffer bias_bad({static_cast<int64_t>(d.o.ends.size()), 2 * d.I - 32}, MXMOE_DTYPE_BF16);
  std::swap(d.o.bias, bias_bad);
  expect_error(run_swiglu(d, true, 0, true, nullptr, true), "bias");
  std::swap(d.o.bias, bias_bad);
  Buffer q_bad({d.M, d.I - 32}, MXMOE_DTYPE_E4M3);
  auto vq_bad = q_bad.view();
  expect_error(run_swiglu(d, true, 0, true, &vq_bad), "act_q");
  Buffer h_ok = d.h;
  d.h = Buffer({d.M, 2 * d.I}, MXMOE_DTYPE_F32);
  expect_error(run_swiglu(d), "h");
  d.h = h_ok;
  // Nothing was written by the failed calls.
  for (const Buffer* b : {&d.h, &d.q, &d.sc, &d.qt, &d.st})
    for (uint8_t v : b->bytes) ASSERT_EQ(v, 0xEE);
  // 2I = 384: halves of 192, not a multiple of 128.
  Swiglu narrow{make(20, 128, 384, 2, {10, 12}, 33), 192, 0, {}, {}, {}, {}, {}};
  narrow.M = static_cast<int64_t>(narrow.o.gather.size());
  narrow.h = Buffer({narrow.M, 384}, MXMOE_DTYPE_BF16);
  narrow.q = Buffer({narrow.M, 192}, MXMOE_DTYPE_E4M3);
  narrow.sc = Buffer({narrow.M, 6}, MXMOE_DTYPE_E8M0);
  narrow.qt = Buffer({192, narrow.M}, MXMOE_DTYPE_E4M3);
  narrow.st = Buffer({192, mxmoe_grouped_scale_capacity(narrow.M, 2)}, MXMOE_DTYPE_E8M0);
  expect_error(run_swiglu(narrow), "multiple of 256");
  // Interleaved halves take 2I a multiple of 128 (halves of 96 are not).
  Swiglu odd{make(20, 128, 192, 2, {10, 12}, 34), 96, 0, {}, {}, {}, {}, {}};
  odd.M = static_cast<int64_t>(odd.o.gather.size());
  odd.h = Buffer({odd.M, 192}, MXMOE_DTYPE_BF16);
  odd.q = Buffer({odd.M, 96}, MXMOE_DTYPE_E4M3);
  odd.sc = Buffer({odd.M, 3}, MXMOE_DTYPE_E8M0);
  odd.qt = Buffer({96, odd.M}, MXMOE_DTYPE_E4M3);
  odd.st = Buffer({96, mxmoe_grouped_scale_capacity(odd.M, 2)}, MXMOE_DTYPE_E8M0);
  expect_error(run_swiglu(odd, true, 1), "multiple of 128");
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_swiglu_available(10, 256, 128, 2, 20, 2, 0, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_swiglu_available(10, 192, 128, 2, 20, 2, 0, -1), 0);
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_swiglu_available(10, 256, 128, 2, 20, 2, 1, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_swiglu_available(10, 192, 128, 2, 20, 2, 1, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_swiglu_available(10, 96, 128, 2, 20, 2, 1, -1), 0);
  EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_swiglu_available(10, 256, 128, 2, 20, 2, 2, -1), 0);
}

// gpt-oss's up projection: interleaved halves, the expert biases b13 (added before h's rounding, as the
// gather GEMM adds a bias) and I % 128 == 64 (I = 192: the last act block has 64 columns).
TEST(GatherSwiglu, InterleavedWithBias) {
  for (int64_t I : {int64_t{192}, int64_t{256}}) {
    Swiglu d = make_swiglu(35, I);
    ASSERT_EQ(run_swiglu(d, true, 1, true, nullptr, true), MXMOE_OK) << mxmoe_last_error();
    Buffer h({d.M, 2 * d.I}, MXMOE_DTYPE_BF16);
    ASSERT_EQ(run_gather(d.o, true, false, h), MXMOE_OK) << mxmoe_last_error();
    EXPECT_EQ(d.h.bytes, h.bytes) << "I " << I;
    Swiglu w = make_swiglu(35, I);
    ASSERT_NO_FATAL_FAILURE(quantize_act(h, d.o.offs, 1, w));
    EXPECT_EQ(d.q.bytes, w.q.bytes) << "I " << I;
    EXPECT_EQ(d.sc.bytes, w.sc.bytes) << "I " << I;
    EXPECT_EQ(d.qt.bytes, w.qt.bytes) << "I " << I;
    EXPECT_EQ(d.st.bytes, w.st.bytes) << "I " << I;
    // The bias reached h: without it the bytes differ.
    Buffer h0({d.M, 2 * d.I}, MXMOE_DTYPE_BF16);
    ASSERT_EQ(run_gather(d.o, false, false, h0), MXMOE_OK) << mxmoe_last_error();
    EXPECT_NE(h0.bytes, h.bytes);
  }
}

// The bf16 gather GEMM on the host (mxmoe_grouped_mm_bf16_gather): the contract in double, both B
// layouts, empty groups, padding, clamped and tail rows; and its argument checks (nothing written).
TEST(Bf16GatherGemm, HostMatchesTheContract) {
  for (bool b_kn : {false, true}) {
    mxtest::Bf16Gather c = mxtest::bf16_gather_case(30, 96, 48, 4, {20, 0, 37, 9}, b_kn, 51);
    Buffer out({static_cast<int64_t>(c.gather.size()), c.N}, MXMOE_DTYPE_BF16, 0xEE);
    auto va = c.a.view(), vg = c.index.view(), vb = c.b.view(), vo = c.offs.view(), vout = out.view();
    ASSERT_EQ(mxmoe_grouped_mm_bf16_gather(&va, &vg, c.fanout, &vb, b_kn ? 1 : 0, &vo, &vout, nullptr), MXMOE_OK)
        << mxmoe_last_error();
    EXPECT_EQ(out.bytes, mxtest::bf16_gather_expected(c).bytes) << "b_kn " << b_kn;
  }
}

TEST(Bf16GatherGemm, Validation) {
  mxtest::Bf16Gather c = mxtest::bf16_gather_case(20, 64, 32, 2, {10, 12}, false, 52);
  const int64_t M = static_cast<int64_t>(c.gather.size());
  Buffer out({M, c.N}, MXMOE_DTYPE_BF16, 0xEE);
  auto va = c.a.view(), vg = c.index.view(), vb = c.b.view(), vo = c.offs.view(), vout = out.view();
  auto expect_error = [&](mxmoe_status st, const std::string& what) {
    EXPECT_EQ(st, MXMOE_ERR_INVALID_ARGUMENT) << what;
    EXPECT_NE(std::string(mxmoe_last_error()).find(what), std::string::npos) << mxmoe_last_error();
  };
  expect_error(mxmoe_grouped_mm_bf16_gather(&va, &vg, 0, &vb, 0, &vo, &vout, nullptr), "fanout");
  expect_error(mxmoe_grouped_mm_bf16_gather(&va, &vg, 2, &vb, 2, &vo, &vout, nullptr), "b_kn");
  // b read as (G, K, N): its dim 1 (32) is not a's K (64)
  expect_error(mxmoe_grouped_mm_bf16_gather(&va, &vg, 2, &vb, 1, &vo, &vout, nullptr), "b: expected the contraction");
  Buffer a32({c.T, c.K}, MXMOE_DTYPE_F32);
  auto va32 = a32.view();
  expect_error(mxmoe_grouped_mm_bf16_gather(&va32, &vg, 2, &vb, 0, &vo, &vout, nullptr), "a");
  Buffer short_out({M - 1, c.N}, MXMOE_DTYPE_BF16);
  auto vshort = short_out.view();
  expect_error(mxmoe_grouped_mm_bf16_gather(&va, &vg, 2, &vb, 0, &vo, &vshort, nullptr), "out");
  Buffer offs3({3}, MXMOE_DTYPE_I32);
  auto vo3 = offs3.view();
  expect_error(mxmoe_grouped_mm_bf16_gather(&va, &vg, 2, &vb, 0, &vo3, &vout, nullptr), "offs");
  expect_error(mxmoe_grouped_mm_bf16_gather(&va, nullptr, 2, &vb, 0, &vo, &vout, nullptr), "gather");
  for (uint8_t v : out.bytes) ASSERT_EQ(v, 0xEE);  // nothing written by the failed calls
  EXPECT_EQ(mxmoe_grouped_mm_bf16_gather_available(10, 32, 64, 2, 20, 2, 0, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_bf16_gather_available(10, 32, 64, 2, 20, 2, 2, -1), 0);
  EXPECT_EQ(mxmoe_grouped_mm_bf16_gather_available(10, 32, 64, 2, 20, 0, 0, -1), 0);
}

// The bf16 K-grouped gather GEMM on the host (mxmoe_grouped_mm_bf16_kgather): the contract in double with
// either operand gathered (an empty group gets zeros), and its argument checks (nothing written).
TEST(Bf16KGatherGemm, HostMatchesTheContract) {
  for (bool gather_b : {true, false}) {
    mxtest::Bf16KGather c = mxtest::bf16_kgather_case(30, 40, 24, 4, {20, 0, 37, 9}, gather_b, 53);
    Buffer out({4, c.M, c.N}, MXMOE_DTYPE_BF16, 0xEE);
    auto va = c.a.view(), vb = c.b.view(), vg = c.index.view(), vo = c.offs.view(), vout = out.view();
    ASSERT_EQ(mxmoe_grouped_mm_bf16_kgather(&va, &vb, &vg, c.fanout, gather_b ? 1 : 0, &vo, &vout, nullptr), MXMOE_OK)
        << mxmoe_last_error();
    EXPECT_EQ(out.bytes, mxtest::bf16_kgather_expected(c).bytes) << "gather_b " << gather_b;
  }
}

TEST(Bf16KGatherGemm, Validation) {
  mxtest::Bf16KGather c = mxtest::bf16_kgather_case(20, 16, 24, 2, {10, 12}, true, 54);
  Buffer out({2, c.M, c.N}, MXMOE_DTYPE_BF16, 0xEE);
  auto va = c.a.view(), vb = c.b.view(), vg = c.index.view(), vo = c.offs.view(), vout = out.view();
  auto expect_error = [&](mxmoe_status st, const std::string& what) {
    EXPECT_EQ(st, MXMOE_ERR_INVALID_ARGUMENT) << what;
    EXPECT_NE(std::string(mxmoe_last_error()).find(what), std::string::npos) << mxmoe_last_error();
  };
  expect_error(mxmoe_grouped_mm_bf16_kgather(&va, &vb, &vg, 0, 1, &vo, &vout, nullptr), "fanout");
  expect_error(mxmoe_grouped_mm_bf16_kgather(&va, &vb, &vg, 2, 2, &vo, &vout, nullptr), "gather_b");
  // gather reading a's rows: b must then have one row per routed row
  expect_error(mxmoe_grouped_mm_bf16_kgather(&va, &vb, &vg, 2, 0, &vo, &vout, nullptr), "b: expected");
  Buffer bad_out({2, c.N, c.M}, MXMOE_DTYPE_BF16);
  auto vbad = bad_out.view();
  expect_error(mxmoe_grouped_mm_bf16_kgather(&va, &vb, &vg, 2, 1, &vo, &vbad, nullptr), "out");
  Buffer b32({c.T, c.N}, MXMOE_DTYPE_F32);
  auto vb32 = b32.view();
  expect_error(mxmoe_grouped_mm_bf16_kgather(&va, &vb32, &vg, 2, 1, &vo, &vout, nullptr), "b");
  for (uint8_t v : out.bytes) ASSERT_EQ(v, 0xEE);  // nothing written by the failed calls
  EXPECT_EQ(mxmoe_grouped_mm_bf16_kgather_available(10, 16, 24, 2, 20, 2, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_bf16_kgather_available(10, 16, 24, 2, 20, 0, -1), 0);
}

// The bf16 dSwiGLU gather GEMM on the host (mxmoe_grouped_mm_bf16_gather_dswiglu): the contract written
// out from the gather GEMM's dY', with and without row weights (a padding row's weight is 0), I not a
// multiple of 128 (a partial tile of the weights' partials); and its checks (nothing written).
TEST(Bf16GatherDSwiglu, HostMatchesTheContract) {
  for (int variant = 0; variant < 3; ++variant) {
    const bool weighted = variant != 1, inter = variant == 2;  // the third: gpt-oss' interleaved, clamped SwiGLU
    mxtest::Bf16Gather c = mxtest::bf16_gather_case(30, 64, 192, 4, {20, 0, 37, 9}, true, 55);
    const int64_t M = static_cast<int64_t>(c.gather.size()), I = c.N;
    Buffer h = mxtest::random_input({M, 2 * I}, MXMOE_DTYPE_BF16, 56, 3.f);
    Buffer rs({c.T, c.fanout}, MXMOE_DTYPE_F32);
    std::mt19937 rng(57);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (int64_t i = 0; i < rs.numel(); ++i) rs.set(i, u(rng));
    Buffer dh({M, 2 * I}, MXMOE_DTYPE_BF16, 0xEE), tw({M, 2}, MXMOE_DTYPE_F32, 0xEE),
        act({M, I}, MXMOE_DTYPE_BF16, 0xEE);
    auto va = c.a.view(), vg = c.index.view(), vrs = rs.view(), vb = c.b.view(), vo = c.offs.view(), vh = h.view(),
         vdh = dh.view(), vtw = tw.view(), vact = act.view();
    const mxmoe::SwigluParams p = inter ? mxmoe::SwigluParams{1, 1.702f, 7.f, 1.f}
                                        : mxmoe::SwigluParams{0, 1.f, std::numeric_limits<float>::infinity(), 0.f};
    const bool with_act = variant != 1;  // the optional act output: mxmoe_swiglu's, rows past the groups zero
    ASSERT_EQ(mxmoe_grouped_mm_bf16_gather_dswiglu(&va, &vg, c.fanout, weighted ? &vrs : nullptr, &vb, &vo, &vh,
                                                   p.layout, p.alpha, p.limit, p.up_offset, &vdh, &vtw,
                                                   with_act ? &vact : nullptr, nullptr),
              MXMOE_OK)
        << mxmoe_last_error();
    if (with_act) {
      Buffer want_act({M, I}, MXMOE_DTYPE_BF16);
      auto vwant = want_act.view();
      ASSERT_EQ(mxmoe_swiglu(&vh, p.layout, p.alpha, p.limit, p.up_offset, &vwant, nullptr), MXMOE_OK);
      for (int64_t i = c.ends.back() * I; i < M * I; ++i) want_act.set(i, 0.f);
      EXPECT_EQ(act.bytes, want_act.bytes) << "variant " << variant;
    } else {
      for (uint8_t v : act.bytes) ASSERT_EQ(v, 0xEE);
    }
    auto act_grad = [&](int64_t, int64_t, float g, float uu, float d, float* dg, float* du, float* y) {
      mxmoe::swiglu_grad_value(g, uu, d, p, dg, du, y);
    };
    auto w_of = [&](int64_t r) {
      if (!weighted) return 1.f;
      const int64_t i = std::min<int64_t>(c.gather[r], c.T * c.fanout - 1);
      return i < 0 ? 0.f : rs.get(i);
    };
    const auto [want_dh, want_tw] =
        mxtest::bf16_dswiglu_expected(c, mxtest::bf16_gather_expected(c), h, act_grad, w_of, inter);
    EXPECT_EQ(dh.bytes, want_dh.bytes) << "variant " << variant;
    EXPECT_EQ(tw.bytes, want_tw.bytes) << "variant " << variant;
  }
}

TEST(Bf16GatherDSwiglu, Validation) {
  mxtest::Bf16Gather c = mxtest::bf16_gather_case(20, 64, 64, 2, {10, 12}, true, 58);
  const int64_t M = static_cast<int64_t>(c.gather.size()), I = c.N;
  Buffer h({M, 2 * I}, MXMOE_DTYPE_BF16), dh({M, 2 * I}, MXMOE_DTYPE_BF16, 0xEE), tw({M, 1}, MXMOE_DTYPE_F32, 0xEE);
  auto va = c.a.view(), vg = c.index.view(), vb = c.b.view(), vo = c.offs.view(), vh = h.view(), vdh = dh.view(),
       vtw = tw.view();
  const float inf = std::numeric_limits<float>::infinity();
  auto expect_error = [&](mxmoe_status st, const std::string& what) {
    EXPECT_EQ(st, MXMOE_ERR_INVALID_ARGUMENT) << what;
    EXPECT_NE(std::string(mxmoe_last_error()).find(what), std::string::npos) << mxmoe_last_error();
  };
  expect_error(mxmoe_grouped_mm_bf16_gather_dswiglu(&va, &vg, 2, nullptr, &vb, &vo, &vh, 2, 1.f, inf, 0.f, &vdh, &vtw,
                                                    nullptr, nullptr),
               "layout");
  expect_error(mxmoe_grouped_mm_bf16_gather_dswiglu(&va, &vg, 2, nullptr, &vb, &vo, &vh, 0, 1.f, -1.f, 0.f, &vdh, &vtw,
                                                    nullptr, nullptr),
               "limit");
  Buffer h_bad({M, I}, MXMOE_DTYPE_BF16);
  auto vh_bad = h_bad.view();
  expect_error(mxmoe_grouped_mm_bf16_gather_dswiglu(&va, &vg, 2, nullptr, &vb, &vo, &vh_bad, 0, 1.f, inf, 0.f, &vdh,
                                                    &vtw, nullptr, nullptr),
               "h");
  Buffer tw_bad({M, 2}, MXMOE_DTYPE_F32);
  auto vtw_bad = tw_bad.view();
  expect_error(mxmoe_grouped_mm_bf16_gather_dswiglu(&va, &vg, 2, nullptr, &vb, &vo, &vh, 0, 1.f, inf, 0.f, &vdh,
                                                    &vtw_bad, nullptr, nullptr),
               "tw_part");
  Buffer act_bad({M, 2 * I}, MXMOE_DTYPE_BF16, 0xEE), act_f32({M, I}, MXMOE_DTYPE_F32, 0xEE);
  auto vact_bad = act_bad.view(), vact_f32 = act_f32.view();
  expect_error(mxmoe_grouped_mm_bf16_gather_dswiglu(&va, &vg, 2, nullptr, &vb, &vo, &vh, 0, 1.f, inf, 0.f, &vdh, &vtw,
                                                    &vact_bad, nullptr),
               "act");
  expect_error(mxmoe_grouped_mm_bf16_gather_dswiglu(&va, &vg, 2, nullptr, &vb, &vo, &vh, 0, 1.f, inf, 0.f, &vdh, &vtw,
                                                    &vact_f32, nullptr),
               "act");
  for (const Buffer* b : {&dh, &tw, &act_bad, &act_f32})
    for (uint8_t v : b->bytes) ASSERT_EQ(v, 0xEE);  // nothing written by the failed calls
  EXPECT_EQ(mxmoe_grouped_mm_bf16_gather_dswiglu_available(10, 64, 64, 2, 20, 2, 0, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_bf16_gather_dswiglu_available(10, 64, 64, 2, 20, 2, 1, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_bf16_gather_dswiglu_available(10, 64, 64, 2, 20, 2, 2, -1), 0);
}

// The bf16 SwiGLU gather GEMM on the host (mxmoe_grouped_mm_bf16_gather_swiglu): h is the gather GEMM's
// (the contract in double) plus the bias in fp32 rounded again, act its SwiGLU: concatenated halves and
// gpt-oss's interleaved, clamped form with bf16 and f32 biases; and its checks.
TEST(Bf16GatherSwiglu, HostMatchesTheContract) {
  const float inf = std::numeric_limits<float>::infinity();
  const mxmoe::SwigluParams plain{0, 1.f, inf, 0.f}, gpt{1, 1.702f, 7.f, 1.f};
  const struct {
    mxmoe::SwigluParams p;
    int bias;  // 0 none, 1 bf16, 2 f32
  } variants[] = {{plain, 0}, {plain, 1}, {gpt, 2}, {gpt, 0}};
  for (const auto& v : variants) {
    const mxmoe::SwigluParams p = v.p;
    mxtest::Bf16Gather c = mxtest::bf16_gather_case(30, 64, 256, 4, {20, 0, 37, 9}, false, 59);
    const int64_t M = static_cast<int64_t>(c.gather.size()), I = c.N / 2, G = 4;
    Buffer bias = mxtest::random_input({G, 2 * I}, v.bias == 2 ? MXMOE_DTYPE_F32 : MXMOE_DTYPE_BF16, 61, 2.f);
    Buffer h({M, 2 * I}, MXMOE_DTYPE_BF16, 0xEE), act({M, I}, MXMOE_DTYPE_BF16, 0xEE);
    auto va = c.a.view(), vg = c.index.view(), vb = c.b.view(), vo = c.offs.view(), vbias = bias.view(), vh = h.view(),
         vact = act.view();
    ASSERT_EQ(mxmoe_grouped_mm_bf16_gather_swiglu(&va, &vg, c.fanout, &vb, &vo, v.bias ? &vbias : nullptr, p.layout,
                                                  p.alpha, p.limit, p.up_offset, &vh, &vact, nullptr),
              MXMOE_OK)
        << mxmoe_last_error();
    Buffer want_h = mxtest::bf16_gather_expected(c);
    int64_t g = 0;
    for (int64_t r = 0; v.bias && r < c.ends.back(); ++r) {
      while (r >= c.ends[g]) ++g;
      for (int64_t j = 0; j < 2 * I; ++j) {
        volatile float sum = want_h.get(r * 2 * I + j) + bias.get(g * 2 * I + j);
        want_h.set(r * 2 * I + j, sum);
      }
    }
    EXPECT_EQ(h.bytes, want_h.bytes) << "layout " << p.layout << " bias " << v.bias;
    Buffer want_act({M, I}, MXMOE_DTYPE_BF16);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < I; ++j) {
        const int64_t gc = p.layout ? 2 * j : j, uc = p.layout ? 2 * j + 1 : I + j;
        want_act.set(r * I + j, mxmoe::swiglu_value(want_h.get(r * 2 * I + gc), want_h.get(r * 2 * I + uc), p));
      }
    EXPECT_EQ(act.bytes, want_act.bytes) << "layout " << p.layout << " bias " << v.bias;
  }
}

TEST(Bf16GatherSwiglu, Validation) {
  mxtest::Bf16Gather c = mxtest::bf16_gather_case(20, 64, 256, 2, {10, 12}, false, 60);
  const int64_t M = static_cast<int64_t>(c.gather.size()), I = c.N / 2;
  Buffer h({M, 2 * I}, MXMOE_DTYPE_BF16, 0xEE), act({M, I}, MXMOE_DTYPE_BF16, 0xEE);
  auto va = c.a.view(), vg = c.index.view(), vb = c.b.view(), vo = c.offs.view(), vh = h.view(), vact = act.view();
  const float inf = std::numeric_limits<float>::infinity();
  auto expect_error = [&](mxmoe_status st, const std::string& what) {
    EXPECT_EQ(st, MXMOE_ERR_INVALID_ARGUMENT) << what;
    EXPECT_NE(std::string(mxmoe_last_error()).find(what), std::string::npos) << mxmoe_last_error();
  };
  expect_error(mxmoe_grouped_mm_bf16_gather_swiglu(&va, &vg, 2, &vb, &vo, nullptr, 2, 1.f, inf, 0.f, &vh, &vact,
                                                   nullptr),
               "layout");
  Buffer bias_bad({2, I}, MXMOE_DTYPE_BF16);
  auto vbias_bad = bias_bad.view();
  expect_error(mxmoe_grouped_mm_bf16_gather_swiglu(&va, &vg, 2, &vb, &vo, &vbias_bad, 0, 1.f, inf, 0.f, &vh, &vact,
                                                   nullptr),
               "bias");
  Buffer act_bad({M, 2 * I}, MXMOE_DTYPE_BF16);
  auto vact_bad = act_bad.view();
  expect_error(mxmoe_grouped_mm_bf16_gather_swiglu(&va, &vg, 2, &vb, &vo, nullptr, 0, 1.f, inf, 0.f, &vh, &vact_bad,
                                                   nullptr),
               "act");
  expect_error(mxmoe_grouped_mm_bf16_gather_swiglu(&va, &vg, 2, &vb, &vo, nullptr, 0, 1.f, inf, 0.f, &vh, &vh, nullptr),
               "act");
  for (const Buffer* b : {&h, &act})
    for (uint8_t v : b->bytes) ASSERT_EQ(v, 0xEE);  // nothing written by the failed calls
  EXPECT_EQ(mxmoe_grouped_mm_bf16_gather_swiglu_available(10, 128, 64, 2, 20, 2, 0, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_bf16_gather_swiglu_available(10, 128, 64, 2, 20, 2, 1, -1), 1);
  EXPECT_EQ(mxmoe_grouped_mm_bf16_gather_swiglu_available(10, 128, 64, 2, 20, 2, 2, -1), 0);
}

}  // namespace
