// The MoE kernel family through the C API: routing (vs std::stable_sort), gather, combine, combine
// weight grad, group sum, SwiGLU forward/backward (both layouts, gpt-oss parameters, clamps, NaN),
// each against scalar loops written here independently of the library; bad input (messages name
// the argument, outputs untouched). CUDA: the device kernels equal the CPU reference bit for bit
// (routing, gather, combine, weight grad, group sum; aligned and misaligned views, outputs poisoned
// first), SwiGLU within one bf16 ulp; skipped without a GPU (or in a build without CUDA).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"

#if defined(MXMOE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

using mxtest::Buffer;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr uint8_t kPoison = 0xA5;

// ---- data ---------------------------------------------------------------------------------------------

Buffer ids_i32(int64_t t, int64_t k, const std::vector<int64_t>& v) {
  Buffer b({t, k}, MXMOE_DTYPE_I32);
  for (int64_t i = 0; i < t * k; ++i) b.data<int32_t>()[i] = static_cast<int32_t>(v[i]);
  return b;
}
Buffer ids_i64(int64_t t, int64_t k, const std::vector<int64_t>& v) {
  Buffer b({t, k}, MXMOE_DTYPE_I64);
  for (int64_t i = 0; i < t * k; ++i) b.data<int64_t>()[i] = v[i];
  return b;
}
Buffer i32_vec(const std::vector<int32_t>& v, std::vector<int64_t> shape) {
  Buffer b(std::move(shape), MXMOE_DTYPE_I32);
  if (!v.empty()) std::memcpy(b.bytes.data(), v.data(), v.size() * 4);
  return b;
}
Buffer randn(std::vector<int64_t> shape, mxmoe_dtype d, uint32_t seed, float scale = 1.f) {
  Buffer b(std::move(shape), d);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, scale);
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, n(rng));
  return b;
}
Buffer poisoned(std::vector<int64_t> shape, mxmoe_dtype d) { return Buffer(std::move(shape), d, kPoison); }

// Stored value i of a bf16/f32 buffer as fp32, and rounding an fp32 value to d's precision.
float round_to(mxmoe_dtype d, float v) { return d == MXMOE_DTYPE_BF16 ? mxtest::from_bf16(mxtest::to_bf16(v)) : v; }

// Bitwise equality of two buffers' bytes with a message naming the first difference.
::testing::AssertionResult same_bytes(const Buffer& a, const Buffer& b) {
  if (a.bytes.size() != b.bytes.size()) return ::testing::AssertionFailure() << "sizes differ";
  const size_t es = mxtest::elem_size(a.dtype);
  for (size_t i = 0; i < a.bytes.size(); ++i)
    if (a.bytes[i] != b.bytes[i]) {
      const int64_t e = static_cast<int64_t>(i / es);
      auto f = ::testing::AssertionFailure() << "first difference at element " << e;
      if (a.dtype == MXMOE_DTYPE_BF16 || a.dtype == MXMOE_DTYPE_F32) f << ": " << a.get(e) << " vs " << b.get(e);
      if (a.dtype == MXMOE_DTYPE_I32) f << ": " << a.data<int32_t>()[e] << " vs " << b.data<int32_t>()[e];
      return f;
    }
  return ::testing::AssertionSuccess();
}

// Expected values (fp32, already rounded to the output dtype) vs a buffer; NaN matches NaN.
::testing::AssertionResult equals(const Buffer& got, const std::vector<float>& want) {
  if (got.numel() != static_cast<int64_t>(want.size())) return ::testing::AssertionFailure() << "sizes differ";
  for (int64_t i = 0; i < got.numel(); ++i) {
    const float g = got.get(i), w = want[i];
    const bool ok = (std::isnan(g) && std::isnan(w)) || mxtest::bits_of(g) == mxtest::bits_of(w);
    if (!ok) return ::testing::AssertionFailure() << "element " << i << ": got " << g << ", want " << w;
  }
  return ::testing::AssertionSuccess();
}

int64_t clampi(int64_t v, int64_t n) { return std::min(std::max<int64_t>(v, 0), n - 1); }

// ---- independent references ---------------------------------------------------------------------

struct Routing {
  std::vector<int32_t> offs, perm, inv;
};
Routing ref_routing(const std::vector<int64_t>& ids, int64_t e) {
  const int64_t n = static_cast<int64_t>(ids.size());
  auto key = [&](int64_t i) { return ids[i] >= 0 && ids[i] < e ? ids[i] : e; };
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
  Routing r;
  r.perm.assign(order.begin(), order.end());
  r.inv.assign(n, -1);
  for (int64_t p = 0; p < n; ++p) r.inv[order[p]] = static_cast<int32_t>(p);
  for (int64_t x = 0; x < e; ++x)
    r.offs.push_back(static_cast<int32_t>(std::count_if(order.begin(), order.end(), [&](int64_t i) { return key(i) <= x; })));
  return r;
}

// Sum of the products/values in the documented fixed order: element h goes to lane (h / chunk) % lanes,
// lanes summed in increasing h, then the halving tree.
float tree_sum(const std::vector<float>& terms, int lanes, int chunk) {
  std::vector<float> lane(lanes, 0.0f);
  for (size_t h = 0; h < terms.size(); ++h) {
    float& l = lane[(h / chunk) % lanes];
    l = l + terms[h];
  }
  for (int off = lanes / 2; off >= 1; off /= 2)
    for (int i = 0; i < off; ++i) lane[i] = lane[i] + lane[i + off];
  return lane[0];
}

struct Swiglu {
  int layout;
  float alpha, limit, up_offset;
};
constexpr Swiglu kStandard{0, 1.0f, kInf, 0.0f};
constexpr Swiglu kGptOss{1, 1.702f, 7.0f, 1.0f};

float ref_sigmoid(float z) {
  const float e = std::exp(-z);
  const float d = 1.0f + e;
  return 1.0f / d;
}
float ref_swiglu(float g, float u, const Swiglu& p) {
  float gc = g, uc = u;
  if (g > p.limit) gc = p.limit;
  if (u > p.limit) uc = p.limit;
  if (u < -p.limit) uc = -p.limit;
  const float za = p.alpha * gc;
  const float s = ref_sigmoid(za);
  const float silu = gc * s;
  const float up = uc + p.up_offset;
  return silu * up;
}
void ref_swiglu_grad(float g, float u, float dy, const Swiglu& p, float& dg, float& du) {
  float gc = g, uc = u;
  if (g > p.limit) gc = p.limit;
  if (u > p.limit) uc = p.limit;
  if (u < -p.limit) uc = -p.limit;
  const float z = p.alpha * gc;
  const float s = ref_sigmoid(z);
  const float one_minus = 1.0f - s;
  const float zs = z * s;
  const float slope = s + zs * one_minus;
  const float up = uc + p.up_offset;
  const float dyu = dy * up;
  dg = (g > p.limit) ? 0.0f : dyu * slope;
  const float silu = gc * s;
  du = (u > p.limit || u < -p.limit) ? 0.0f : dy * silu;
}
// Element offsets of gate i / up i in a row of 2I values.
int64_t gate_at(int layout, int64_t i, int64_t) { return layout == 1 ? 2 * i : i; }
int64_t up_at(int layout, int64_t i, int64_t I) { return layout == 1 ? 2 * i + 1 : I + i; }

// ---- bad-input harness ----------------------------------------------------------------------------

bool names_arg(const std::string& msg, const std::string& arg) {
  if (msg.compare(0, arg.size(), arg) != 0 || msg.size() == arg.size()) return false;
  const char next = msg[arg.size()];
  return next == ':' || next == ' ' || next == ',';
}

// `call` must fail naming `arg` with "expected ... got", and leave the output bytes as they were.
void expect_rejected(const std::function<mxmoe_status()>& call, const std::string& arg,
                     std::vector<Buffer*> outputs, const char* what) {
  SCOPED_TRACE(what);
  std::vector<std::vector<uint8_t>> before;
  for (auto* o : outputs) before.push_back(o->bytes);
  const mxmoe_status st = call();
  const std::string msg = mxmoe_last_error();
  EXPECT_EQ(st, MXMOE_ERR_INVALID_ARGUMENT) << msg;
  EXPECT_TRUE(names_arg(msg, arg)) << "message should name '" << arg << "': " << msg;
  EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got"), std::string::npos) << msg;
  for (size_t i = 0; i < outputs.size(); ++i) EXPECT_EQ(outputs[i]->bytes, before[i]) << "an output was written";
}

// ---- routing --------------------------------------------------------------------------------------

void check_routing(int64_t t, int64_t k, int64_t e, const std::vector<int64_t>& ids, bool i64) {
  SCOPED_TRACE("T=" + std::to_string(t) + " k=" + std::to_string(k) + " E=" + std::to_string(e) + (i64 ? " int64" : ""));
  Buffer idx = i64 ? ids_i64(t, k, ids) : ids_i32(t, k, ids);
  Buffer offs = poisoned({e}, MXMOE_DTYPE_I32), perm = poisoned({t * k}, MXMOE_DTYPE_I32),
         inv = poisoned({t, k}, MXMOE_DTYPE_I32);
  mxmoe_tensor iv = idx.view(), ov = offs.view(), pv = perm.view(), invv = inv.view();
  EXPECT_EQ(mxmoe_moe_routing_workspace_size(t * k, e, -1), 0);
  ASSERT_EQ(mxmoe_moe_routing(&iv, e, &ov, &pv, &invv, nullptr, nullptr), MXMOE_OK) << mxmoe_last_error();
  const Routing want = ref_routing(ids, e);
  EXPECT_TRUE(same_bytes(offs, i32_vec(want.offs, {e})));
  EXPECT_TRUE(same_bytes(perm, i32_vec(want.perm, {t * k})));
  EXPECT_TRUE(same_bytes(inv, i32_vec(want.inv, {t, k})));
}

std::vector<int64_t> random_ids(int64_t n, int64_t lo, int64_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> d(lo, hi);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(MoeRouting, MatchesStableSort) {
  struct C {
    int64_t t, k, e, lo, hi;
  };
  for (const C& c : {C{50, 1, 4, 0, 3}, C{33, 8, 16, -3, 19}, C{100, 2, 8, -1, 8}, C{7, 3, 1, 0, 0},
                     C{64, 4, 1000, 0, 999}, C{20, 6, 1 << 20, -5, (1 << 20) + 5}, C{1, 1, 3, 5, 5}}) {
    const auto ids = random_ids(c.t * c.k, c.lo, c.hi, static_cast<uint32_t>(c.t * 31 + c.k));
    check_routing(c.t, c.k, c.e, ids, false);
    check_routing(c.t, c.k, c.e, ids, true);
  }
}

TEST(MoeRouting, EdgeCases) {
  // All tokens on one expert; empty experts around it.
  check_routing(40, 2, 8, std::vector<int64_t>(80, 5), false);
  // Only experts 0 and 7 used.
  std::vector<int64_t> two(60);
  for (size_t i = 0; i < two.size(); ++i) two[i] = (i * 7) % 3 == 0 ? 7 : 0;
  check_routing(30, 2, 8, two, false);
  // Everything dropped (negative, == E, huge).
  check_routing(5, 2, 4, {-1, 4, 9, -100, 4, 4, -1, 5, 6, 7}, false);
  check_routing(3, 2, 4, {int64_t(1) << 40, -(int64_t(1) << 40), 3, 4, INT64_MIN, INT64_MAX}, true);
  // T = 0: offs all zero, nothing else to write.
  check_routing(0, 4, 5, {}, false);
  check_routing(0, 4, 5, {}, true);
  // k = 0.
  check_routing(6, 0, 3, {}, false);
  // k = 8, many tokens.
  check_routing(500, 8, 64, random_ids(4000, -2, 65, 11), false);
}

TEST(MoeRouting, BadInput) {
  Buffer idx = ids_i32(4, 2, {0, 1, 2, 3, 0, 1, 2, 3});
  Buffer offs({4}, MXMOE_DTYPE_I32, 7), perm({8}, MXMOE_DTYPE_I32, 7), inv({4, 2}, MXMOE_DTYPE_I32, 7);
  std::vector<Buffer*> outs{&offs, &perm, &inv};
  auto call = [&](std::function<void(mxmoe_tensor&, int64_t&, mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&)> mut) {
    return [&, mut]() {
      mxmoe_tensor iv = idx.view(), ov = offs.view(), pv = perm.view(), invv = inv.view();
      int64_t e = 4;
      mut(iv, e, ov, pv, invv);
      return mxmoe_moe_routing(&iv, e, &ov, &pv, &invv, nullptr, nullptr);
    };
  };
  ASSERT_EQ(call([](auto&...) {})(), MXMOE_OK) << mxmoe_last_error();
  expect_rejected(call([](mxmoe_tensor& i, int64_t&, auto&...) { i.dtype = MXMOE_DTYPE_F32; }), "topk_idx", outs, "idx f32");
  expect_rejected(call([](mxmoe_tensor& i, int64_t&, auto&...) { i.ndim = 1; i.shape[0] = 8; i.strides[0] = 1; }),
                  "topk_idx", outs, "idx 1-D");
  expect_rejected(call([](mxmoe_tensor& i, int64_t&, auto&...) { i.strides[0] = 3; i.shape[0] = 2; }), "topk_idx",
                  outs, "idx strided");
  expect_rejected(call([](mxmoe_tensor&, int64_t& e, auto&...) { e = 0; }), "num_experts", outs, "E = 0");
  expect_rejected(call([](mxmoe_tensor&, int64_t& e, auto&...) { e = (1 << 20) + 1; }), "num_experts", outs, "E big");
  expect_rejected(call([](mxmoe_tensor&, int64_t&, mxmoe_tensor& o, auto&...) { o.shape[0] = 3; }), "offs", outs,
                  "offs shape");
  expect_rejected(call([](mxmoe_tensor&, int64_t&, mxmoe_tensor&, mxmoe_tensor& p, mxmoe_tensor&) {
                    p.dtype = MXMOE_DTYPE_F32;
                  }),
                  "perm", outs, "perm dtype");
  expect_rejected(call([](mxmoe_tensor&, int64_t&, mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor& v) {
                    v.shape[1] = 1;
                    v.shape[0] = 8;
                  }),
                  "inv", outs, "inv shape");
  expect_rejected(call([&](mxmoe_tensor&, int64_t&, mxmoe_tensor&, mxmoe_tensor& p, mxmoe_tensor& v) {
                    v.data = p.data;
                  }),
                  "inv", outs, "inv overlaps perm");
  // The exact message of a shape mismatch.
  mxmoe_tensor iv = idx.view(), ov = offs.view(), pv = perm.view(), invv = inv.view();
  pv.shape[0] = 6;
  ASSERT_NE(mxmoe_moe_routing(&iv, 4, &ov, &pv, &invv, nullptr, nullptr), MXMOE_OK);
  EXPECT_STREQ(mxmoe_last_error(), "perm: expected shape (8,), got (6,)");
  // Workspace size queries.
  EXPECT_EQ(mxmoe_moe_routing_workspace_size(-1, 4, -1), -1);
  EXPECT_EQ(mxmoe_moe_routing_workspace_size(8, 0, -1), -1);
  EXPECT_TRUE(names_arg(mxmoe_last_error(), "num_experts")) << mxmoe_last_error();
  EXPECT_EQ(mxmoe_moe_routing_workspace_size(8, 4, -2), -1);
}

// ---- gather ---------------------------------------------------------------------------------------

TEST(MoeGather, MatchesScalarLoop) {
  const int64_t T = 7, K = 3, N = T * K;
  for (int64_t H : {40, 13, 1}) {
    for (mxmoe_dtype xd : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (mxmoe_dtype od : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
        for (int sk : {-1, int(MXMOE_DTYPE_F32), int(MXMOE_DTYPE_BF16)}) {
          SCOPED_TRACE("H=" + std::to_string(H) + " x=" + std::to_string(xd) + " out=" + std::to_string(od) +
                       " scale=" + std::to_string(sk));
          Buffer x = randn({T, H}, xd, 1, 3.f);
          // A permutation with padding rows (negative: zeros) and an out-of-range entry (clamped into
          // [0, N)), longer than T*k as the tile128 layer's 16-aligned routing is.
          const int64_t R = N + 5;
          std::vector<int32_t> pv(R, -1);
          std::iota(pv.begin(), pv.begin() + N, 0);
          std::shuffle(pv.begin(), pv.end(), std::mt19937(5));
          pv[2] = -7;
          pv[R - 1] = 1000;
          Buffer perm = i32_vec(pv, {R});
          Buffer scale = sk < 0 ? Buffer() : randn({T, K}, static_cast<mxmoe_dtype>(sk), 2);
          Buffer out = poisoned({R, H}, od);
          mxmoe_tensor xv = x.view(), permv = perm.view(), sv = scale.view(), outv = out.view();
          ASSERT_EQ(mxmoe_moe_gather(&xv, &permv, K, sk < 0 ? nullptr : &sv, &outv, nullptr), MXMOE_OK)
              << mxmoe_last_error();
          std::vector<float> want(R * H, 0.0f);
          for (int64_t r = 0; r < R; ++r) {
            if (pv[r] < 0) continue;  // a padding row: zeros
            const int64_t src = clampi(pv[r], N);
            for (int64_t h = 0; h < H; ++h) {
              float v = x.get((src / K) * H + h);
              if (sk >= 0) v = v * scale.get(src);
              want[r * H + h] = round_to(od, v);
            }
          }
          EXPECT_TRUE(equals(out, want));
        }
  }
}

TEST(MoeGather, SameDtypeCopiesBits) {
  // A signaling-NaN bf16 payload survives a plain gather (no conversion).
  Buffer x({2, 8}, MXMOE_DTYPE_BF16);
  for (int i = 0; i < 16; ++i) x.data<uint16_t>()[i] = static_cast<uint16_t>(0x7F81 + i);
  Buffer perm = i32_vec({3, 0, 1, 2}, {4});
  Buffer out = poisoned({4, 8}, MXMOE_DTYPE_BF16);
  mxmoe_tensor xv = x.view(), pv = perm.view(), ov = out.view();
  ASSERT_EQ(mxmoe_moe_gather(&xv, &pv, 2, nullptr, &ov, nullptr), MXMOE_OK) << mxmoe_last_error();
  for (int r = 0; r < 4; ++r)
    for (int h = 0; h < 8; ++h)
      EXPECT_EQ(out.data<uint16_t>()[r * 8 + h], x.data<uint16_t>()[(perm.data<int32_t>()[r] / 2) * 8 + h]);
}

TEST(MoeGather, EmptyAndBadInput) {
  {  // T = 0 and H = 0 and k = 0
    Buffer x({0, 16}, MXMOE_DTYPE_F32), perm({0}, MXMOE_DTYPE_I32), out({0, 16}, MXMOE_DTYPE_BF16);
    mxmoe_tensor xv = x.view(), pv = perm.view(), ov = out.view();
    EXPECT_EQ(mxmoe_moe_gather(&xv, &pv, 4, nullptr, &ov, nullptr), MXMOE_OK) << mxmoe_last_error();
    Buffer x2({3, 0}, MXMOE_DTYPE_F32), perm2 = i32_vec({0, 1, 2, 3, 4, 5}, {6}), out2({6, 0}, MXMOE_DTYPE_F32);
    mxmoe_tensor xv2 = x2.view(), pv2 = perm2.view(), ov2 = out2.view();
    EXPECT_EQ(mxmoe_moe_gather(&xv2, &pv2, 2, nullptr, &ov2, nullptr), MXMOE_OK) << mxmoe_last_error();
    Buffer perm3({0}, MXMOE_DTYPE_I32), out3({0, 0}, MXMOE_DTYPE_F32);
    mxmoe_tensor pv3 = perm3.view(), ov3 = out3.view();
    EXPECT_EQ(mxmoe_moe_gather(&xv2, &pv3, 0, nullptr, &ov3, nullptr), MXMOE_OK) << mxmoe_last_error();
  }
  Buffer x = randn({4, 8}, MXMOE_DTYPE_F32, 3), perm = i32_vec({0, 1, 2, 3, 4, 5, 6, 7}, {8});
  Buffer scale = randn({4, 2}, MXMOE_DTYPE_F32, 4), out({8, 8}, MXMOE_DTYPE_BF16, 9);
  std::vector<Buffer*> outs{&out};
  using M = std::function<void(mxmoe_tensor&, mxmoe_tensor&, int64_t&, mxmoe_tensor&, mxmoe_tensor&)>;
  auto call = [&](M mut) {
    return [&, mut]() {
      mxmoe_tensor xv = x.view(), pv = perm.view(), sv = scale.view(), ov = out.view();
      int64_t k = 2;
      mut(xv, pv, k, sv, ov);
      return mxmoe_moe_gather(&xv, &pv, k, &sv, &ov, nullptr);
    };
  };
  ASSERT_EQ(call([](auto&...) {})(), MXMOE_OK) << mxmoe_last_error();
  expect_rejected(call([](mxmoe_tensor& x, auto&...) { x.dtype = MXMOE_DTYPE_I32; }), "x", outs, "x dtype");
  expect_rejected(call([](mxmoe_tensor& x, auto&...) { x.strides[0] = 9; x.shape[0] = 3; }), "x", outs, "x strided");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor& p, auto&...) { p.dtype = MXMOE_DTYPE_F32; }), "perm", outs,
                  "perm dtype");
  // perm may have any number of rows (padded routing); out must have as many.
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor& p, auto&...) { p.shape[0] = 6; }), "out", outs,
                  "out rows != perm rows");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, int64_t& k, auto&...) { k = -1; }), "k", outs, "k < 0");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, int64_t& k, auto&...) { k = int64_t(1) << 40; }), "k", outs,
                  "T*k overflow");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, int64_t&, mxmoe_tensor& s, mxmoe_tensor&) { s.shape[1] = 1; }),
                  "row_scale", outs, "row_scale shape");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, int64_t&, mxmoe_tensor&, mxmoe_tensor& o) { o.shape[1] = 7; }),
                  "out", outs, "out shape");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, int64_t&, mxmoe_tensor&, mxmoe_tensor& o) {
                    o.dtype = MXMOE_DTYPE_E4M3;
                  }),
                  "out", outs, "out dtype");
  expect_rejected(call([](mxmoe_tensor& x, mxmoe_tensor&, int64_t&, mxmoe_tensor&, mxmoe_tensor& o) {
                    o.data = x.data;
                    o.dtype = MXMOE_DTYPE_F32;
                  }),
                  "out", outs, "out overlaps x");
}

// ---- combine --------------------------------------------------------------------------------------

TEST(MoeCombine, MatchesScalarLoop) {
  const int64_t T = 9, K = 4, N = T * K + 3;  // y may have more rows than T*k
  for (int64_t H : {24, 5}) {
    for (mxmoe_dtype yd : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (mxmoe_dtype od : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
        for (int wk : {-1, int(MXMOE_DTYPE_F32), int(MXMOE_DTYPE_BF16)}) {
          SCOPED_TRACE("H=" + std::to_string(H) + " y=" + std::to_string(yd) + " out=" + std::to_string(od) +
                       " w=" + std::to_string(wk));
          Buffer y = randn({N, H}, yd, 7, 2.f);
          std::vector<int32_t> iv(T * K);
          std::mt19937 rng(3);
          for (auto& v : iv) v = static_cast<int32_t>(static_cast<int64_t>(rng() % (N + 4)) - 2);  // some OOR
          Buffer inv = i32_vec(iv, {T, K});
          Buffer w = wk < 0 ? Buffer() : randn({T, K}, static_cast<mxmoe_dtype>(wk), 8);
          Buffer out = poisoned({T, H}, od);
          mxmoe_tensor yv = y.view(), invv = inv.view(), wv = w.view(), ov = out.view();
          ASSERT_EQ(mxmoe_moe_combine(&yv, &invv, wk < 0 ? nullptr : &wv, &ov, nullptr), MXMOE_OK)
              << mxmoe_last_error();
          std::vector<float> want(T * H);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h) {
              float acc = 0.0f;
              for (int64_t j = 0; j < K; ++j) {
                const float v = y.get(clampi(iv[t * K + j], N) * H + h);
                if (wk < 0) {
                  acc = acc + v;
                } else {
                  const float p = w.get(t * K + j) * v;  // rounded to fp32 before the add
                  acc = acc + p;
                }
              }
              want[t * H + h] = round_to(od, acc);
            }
          EXPECT_TRUE(equals(out, want));
        }
  }
}

TEST(MoeCombine, EmptyAndBadInput) {
  {  // k = 0: zeros
    Buffer y = randn({3, 8}, MXMOE_DTYPE_F32, 1), inv({4, 0}, MXMOE_DTYPE_I32), out = poisoned({4, 8}, MXMOE_DTYPE_BF16);
    mxmoe_tensor yv = y.view(), iv = inv.view(), ov = out.view();
    ASSERT_EQ(mxmoe_moe_combine(&yv, &iv, nullptr, &ov, nullptr), MXMOE_OK) << mxmoe_last_error();
    EXPECT_TRUE(equals(out, std::vector<float>(32, 0.0f)));
    // T = 0, and y without rows when there is nothing to combine
    Buffer y0({0, 8}, MXMOE_DTYPE_F32), inv0({0, 2}, MXMOE_DTYPE_I32), out0({0, 8}, MXMOE_DTYPE_F32);
    mxmoe_tensor yv0 = y0.view(), iv0 = inv0.view(), ov0 = out0.view();
    EXPECT_EQ(mxmoe_moe_combine(&yv0, &iv0, nullptr, &ov0, nullptr), MXMOE_OK) << mxmoe_last_error();
  }
  Buffer y = randn({8, 16}, MXMOE_DTYPE_BF16, 3), inv = i32_vec({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  Buffer w = randn({4, 2}, MXMOE_DTYPE_F32, 4), out({4, 16}, MXMOE_DTYPE_F32, 9);
  std::vector<Buffer*> outs{&out};
  using M = std::function<void(mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&)>;
  auto call = [&](M mut) {
    return [&, mut]() {
      mxmoe_tensor yv = y.view(), iv = inv.view(), wv = w.view(), ov = out.view();
      mut(yv, iv, wv, ov);
      return mxmoe_moe_combine(&yv, &iv, &wv, &ov, nullptr);
    };
  };
  ASSERT_EQ(call([](auto&...) {})(), MXMOE_OK) << mxmoe_last_error();
  expect_rejected(call([](mxmoe_tensor& y, auto&...) { y.ndim = 3; y.shape[2] = 1; y.strides[2] = 1; }), "y", outs,
                  "y 3-D");
  expect_rejected(call([](mxmoe_tensor& y, auto&...) { y.shape[0] = 0; }), "y", outs, "y without rows");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor& i, auto&...) { i.dtype = MXMOE_DTYPE_I64; }), "inv", outs,
                  "inv int64");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor& w, mxmoe_tensor&) { w.shape[0] = 2; }),
                  "weights", outs, "weights shape");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor& w, mxmoe_tensor&) { w.dtype = MXMOE_DTYPE_F64; }),
                  "weights", outs, "weights f64");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor& o) { o.shape[0] = 8; }), "out",
                  outs, "out shape");
  mxmoe_tensor yv = y.view(), iv = inv.view(), ov = out.view();
  ov.shape[1] = 15;
  ASSERT_NE(mxmoe_moe_combine(&yv, &iv, nullptr, &ov, nullptr), MXMOE_OK);
  EXPECT_STREQ(mxmoe_last_error(), "out: expected shape (4, 16), got (4, 15)");
}

// ---- combine weight grad ----------------------------------------------------------------------------

TEST(MoeCombineWeightGrad, MatchesFixedOrderAndDoubleDot) {
  const int64_t T = 5, K = 3, N = T * K;
  for (int64_t H : {300, 1000, 7, 0}) {
    for (mxmoe_dtype dd : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (mxmoe_dtype yd : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}) {
        SCOPED_TRACE("H=" + std::to_string(H) + " dout=" + std::to_string(dd) + " y=" + std::to_string(yd));
        Buffer dout = randn({T, H}, dd, 11), y = randn({N, H}, yd, 12);
        std::vector<int32_t> iv(T * K);
        std::mt19937 rng(4);
        for (auto& v : iv) v = static_cast<int32_t>(rng() % (N + 2)) - 1;
        Buffer inv = i32_vec(iv, {T, K}), dw = poisoned({T, K}, MXMOE_DTYPE_F32);
        mxmoe_tensor dv = dout.view(), yv = y.view(), invv = inv.view(), wv = dw.view();
        ASSERT_EQ(mxmoe_moe_combine_weight_grad(&dv, &yv, &invv, &wv, nullptr), MXMOE_OK) << mxmoe_last_error();
        std::vector<float> want(T * K);
        for (int64_t i = 0; i < T * K; ++i) {
          const int64_t t = i / K, r = clampi(iv[i], N);
          std::vector<float> terms(H);
          double exact = 0;
          for (int64_t h = 0; h < H; ++h) {
            terms[h] = dout.get(t * H + h) * y.get(r * H + h);
            exact += double(dout.get(t * H + h)) * double(y.get(r * H + h));
          }
          want[i] = tree_sum(terms, 32, 8);
          EXPECT_NEAR(dw.get(i), exact, 1e-5 * (1 + std::sqrt(double(H)) * 4));
        }
        EXPECT_TRUE(equals(dw, want));
      }
  }
}

TEST(MoeCombineWeightGrad, BadInput) {
  Buffer dout = randn({4, 8}, MXMOE_DTYPE_BF16, 1), y = randn({8, 8}, MXMOE_DTYPE_BF16, 2);
  Buffer inv = i32_vec({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}), dw({4, 2}, MXMOE_DTYPE_F32, 3);
  std::vector<Buffer*> outs{&dw};
  using M = std::function<void(mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&)>;
  auto call = [&](M mut) {
    return [&, mut]() {
      mxmoe_tensor dv = dout.view(), yv = y.view(), iv = inv.view(), wv = dw.view();
      mut(dv, yv, iv, wv);
      return mxmoe_moe_combine_weight_grad(&dv, &yv, &iv, &wv, nullptr);
    };
  };
  ASSERT_EQ(call([](auto&...) {})(), MXMOE_OK) << mxmoe_last_error();
  expect_rejected(call([](mxmoe_tensor& d, auto&...) { d.dtype = MXMOE_DTYPE_E8M0; }), "dout", outs, "dout dtype");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor& y, auto&...) { y.shape[1] = 4; }), "y", outs, "y columns");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor& i, mxmoe_tensor&) { i.shape[0] = 2; }), "inv",
                  outs, "inv rows");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor& w) { w.dtype = MXMOE_DTYPE_BF16; }),
                  "dw", outs, "dw bf16");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor& w) { w.shape[1] = 3; }), "dw", outs,
                  "dw shape");
}

// ---- group sum --------------------------------------------------------------------------------------

TEST(MoeGroupSum, MatchesFixedOrderAndDoubleSum) {
  const int64_t M = 100;
  for (int64_t C : {37, 512, 1}) {
    for (mxmoe_dtype xd : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}) {
      // Jagged, empty, decreasing, negative and past-M ends (clamped as everywhere).
      for (const std::vector<int32_t>& ends :
           {std::vector<int32_t>{10, 10, 45, 30, 99}, std::vector<int32_t>{-4, 3, 200}, std::vector<int32_t>{100},
            std::vector<int32_t>{0, 0}, std::vector<int32_t>{}}) {
        SCOPED_TRACE("C=" + std::to_string(C) + " G=" + std::to_string(ends.size()));
        const int64_t G = static_cast<int64_t>(ends.size());
        Buffer x = randn({M, C}, xd, 21), offs = mxtest::offsets(ends), out = poisoned({G, C}, MXMOE_DTYPE_F32);
        mxmoe_tensor xv = x.view(), ov = offs.view(), outv = out.view();
        ASSERT_EQ(mxmoe_moe_group_sum(&xv, &ov, &outv, nullptr), MXMOE_OK) << mxmoe_last_error();
        std::vector<float> want(G * C);
        int64_t prev = 0;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t e = std::min<int64_t>(M, std::max<int64_t>(prev, ends[g]));
          for (int64_t c = 0; c < C; ++c) {
            std::vector<float> terms;
            double exact = 0;
            for (int64_t r = prev; r < e; ++r) {
              terms.push_back(x.get(r * C + c));
              exact += x.get(r * C + c);
            }
            want[g * C + c] = tree_sum(terms, 16, 1);
            EXPECT_NEAR(out.get(g * C + c), exact, 1e-4);
          }
          prev = e;
        }
        EXPECT_TRUE(equals(out, want));
      }
    }
  }
}

TEST(MoeGroupSum, BadInput) {
  Buffer x = randn({8, 4}, MXMOE_DTYPE_F32, 1), offs = mxtest::offsets({3, 8}), out({2, 4}, MXMOE_DTYPE_F32, 5);
  std::vector<Buffer*> outs{&out};
  using M = std::function<void(mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&)>;
  auto call = [&](M mut) {
    return [&, mut]() {
      mxmoe_tensor xv = x.view(), ov = offs.view(), outv = out.view();
      mut(xv, ov, outv);
      return mxmoe_moe_group_sum(&xv, &ov, &outv, nullptr);
    };
  };
  ASSERT_EQ(call([](auto&...) {})(), MXMOE_OK) << mxmoe_last_error();
  expect_rejected(call([](mxmoe_tensor& x, auto&...) { x.ndim = 1; }), "x", outs, "x 1-D");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor& o, mxmoe_tensor&) { o.dtype = MXMOE_DTYPE_F32; }), "offs", outs,
                  "offs f32");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor& o) { o.shape[0] = 3; }), "out", outs, "out G");
  expect_rejected(call([](mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor& o) { o.dtype = MXMOE_DTYPE_BF16; }), "out", outs,
                  "out bf16");
}

// ---- SwiGLU -----------------------------------------------------------------------------------------

// h (N, 2I) with values that hit the clamps (exactly +-limit too), zeros, inf and NaN.
Buffer swiglu_input(int64_t n, int64_t i2, mxmoe_dtype d, uint32_t seed, float limit) {
  Buffer h = randn({n, i2}, d, seed, 4.f);
  if (std::isfinite(limit)) {
    h.set(0, limit);
    h.set(1, -limit);
    h.set(2, limit * 1.5f);
    h.set(3, -limit * 1.5f);
  }
  h.set(4, 0.0f);
  h.set(5, -0.0f);
  h.set(6, std::nanf(""));
  h.set(7 % h.numel(), kInf);
  if (h.numel() > 9) {
    h.set(8, -kInf);
    h.set(9, 30.f);
  }
  return h;
}

TEST(MoeSwiglu, ForwardMatchesScalarFormula) {
  for (const Swiglu& p : {kStandard, kGptOss, Swiglu{0, 1.702f, 7.0f, 1.0f}, Swiglu{1, 1.0f, kInf, 0.0f},
                          Swiglu{0, 0.5f, 0.5f, 0.0f}, Swiglu{1, 1.0f, 0.0f, 1.0f}}) {
    for (mxmoe_dtype d : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (int64_t I : {24, 5}) {
        SCOPED_TRACE("layout=" + std::to_string(p.layout) + " alpha=" + std::to_string(p.alpha) + " limit=" +
                     std::to_string(p.limit) + " I=" + std::to_string(I));
        const int64_t N = 6;
        Buffer h = swiglu_input(N, 2 * I, d, 31, p.limit), y = poisoned({N, I}, d);
        mxmoe_tensor hv = h.view(), yv = y.view();
        ASSERT_EQ(mxmoe_swiglu(&hv, p.layout, p.alpha, p.limit, p.up_offset, &yv, nullptr), MXMOE_OK)
            << mxmoe_last_error();
        std::vector<float> want(N * I);
        for (int64_t r = 0; r < N; ++r)
          for (int64_t i = 0; i < I; ++i)
            want[r * I + i] = round_to(d, ref_swiglu(h.get(r * 2 * I + gate_at(p.layout, i, I)),
                                                     h.get(r * 2 * I + up_at(p.layout, i, I)), p));
        EXPECT_TRUE(equals(y, want));
      }
  }
}

TEST(MoeSwiglu, StandardIsSiluTimesUp) {
  // limit +inf, alpha 1, up_offset 0: y = silu(g) * u (within fp32 rounding of the two formulas).
  const int64_t N = 4, I = 16;
  Buffer h = randn({N, 2 * I}, MXMOE_DTYPE_F32, 3, 3.f), y({N, I}, MXMOE_DTYPE_F32);
  mxmoe_tensor hv = h.view(), yv = y.view();
  ASSERT_EQ(mxmoe_swiglu(&hv, MXMOE_SWIGLU_CONCAT, 1.0f, kInf, 0.0f, &yv, nullptr), MXMOE_OK) << mxmoe_last_error();
  for (int64_t r = 0; r < N; ++r)
    for (int64_t i = 0; i < I; ++i) {
      const double g = h.get(r * 2 * I + i), u = h.get(r * 2 * I + I + i);
      EXPECT_NEAR(y.get(r * I + i), g / (1 + std::exp(-g)) * u, 1e-5 * (1 + std::fabs(g * u)));
    }
}

TEST(MoeSwiglu, BackwardMatchesAnalyticAndFiniteDifferences) {
  for (const Swiglu& p : {kStandard, kGptOss, Swiglu{0, 1.702f, 7.0f, 1.0f}, Swiglu{1, 0.5f, 0.5f, 0.0f}}) {
    for (mxmoe_dtype d : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (mxmoe_dtype dyd : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
        for (int64_t I : {16, 3}) {
          SCOPED_TRACE("layout=" + std::to_string(p.layout) + " limit=" + std::to_string(p.limit) +
                       " I=" + std::to_string(I) + " h=" + std::to_string(d) + " dy=" + std::to_string(dyd));
          const int64_t N = 5;
          Buffer h = swiglu_input(N, 2 * I, d, 41, p.limit), dy = randn({N, I}, dyd, 42), dh = poisoned({N, 2 * I}, d);
          mxmoe_tensor hv = h.view(), dyv = dy.view(), dhv = dh.view();
          ASSERT_EQ(mxmoe_swiglu_backward(&dyv, &hv, p.layout, p.alpha, p.limit, p.up_offset, &dhv, nullptr), MXMOE_OK)
              << mxmoe_last_error();
          std::vector<float> want(N * 2 * I);
          for (int64_t r = 0; r < N; ++r)
            for (int64_t i = 0; i < I; ++i) {
              const int64_t gi = r * 2 * I + gate_at(p.layout, i, I), ui = r * 2 * I + up_at(p.layout, i, I);
              const float g = h.get(gi), u = h.get(ui), dyv1 = dy.get(r * I + i);
              float dg, du;
              ref_swiglu_grad(g, u, dyv1, p, dg, du);
              want[gi] = round_to(d, dg);
              want[ui] = round_to(d, du);
              // Central differences in double away from the clamp kinks and non-finite values.
              auto f = [&](double gg, double uu) {
                const double gc = std::min(gg, double(p.limit));
                const double uc = std::min(std::max(uu, -double(p.limit)), double(p.limit));
                return gc / (1 + std::exp(-double(p.alpha) * gc)) * (uc + p.up_offset);
              };
              const double eps = 1e-3;
              const bool smooth = std::isfinite(g) && std::isfinite(u) && std::fabs(g) < 20 &&
                                  std::fabs(std::fabs(g) - p.limit) > 2 * eps && std::fabs(std::fabs(u) - p.limit) > 2 * eps;
              if (!smooth) continue;
              const double fd_g = dyv1 * (f(g + eps, u) - f(g - eps, u)) / (2 * eps);
              const double fd_u = dyv1 * (f(g, u + eps) - f(g, u - eps)) / (2 * eps);
              const double tol_g = 1e-3 * (1 + std::fabs(fd_g)) + (d == MXMOE_DTYPE_BF16 ? std::fabs(fd_g) / 128 : 0);
              const double tol_u = 1e-3 * (1 + std::fabs(fd_u)) + (d == MXMOE_DTYPE_BF16 ? std::fabs(fd_u) / 128 : 0);
              EXPECT_NEAR(dh.get(gi), fd_g, tol_g) << "dg at g=" << g << " u=" << u;
              EXPECT_NEAR(dh.get(ui), fd_u, tol_u) << "du at g=" << g << " u=" << u;
            }
          EXPECT_TRUE(equals(dh, want));
        }
  }
}

TEST(MoeSwiglu, ClampGradientsPassAtTheBounds) {
  // gpt-oss: limit 7. g == 7 and u == +-7 pass the gradient (torch.clamp's inclusive rule); beyond, 0.
  Buffer h({1, 8}, MXMOE_DTYPE_F32), dy({1, 4}, MXMOE_DTYPE_F32), dh({1, 8}, MXMOE_DTYPE_F32);
  const float vals[8] = {7.f, 7.f, 7.5f, -7.f, 1.f, 7.5f, -8.f, -7.5f};  // interleaved (g, u) pairs
  for (int i = 0; i < 8; ++i) h.set(i, vals[i]);
  for (int i = 0; i < 4; ++i) dy.set(i, 1.f);
  mxmoe_tensor hv = h.view(), dyv = dy.view(), dhv = dh.view();
  ASSERT_EQ(mxmoe_swiglu_backward(&dyv, &hv, MXMOE_SWIGLU_INTERLEAVED, 1.702f, 7.f, 1.f, &dhv, nullptr), MXMOE_OK)
      << mxmoe_last_error();
  EXPECT_NE(dh.get(0), 0.f);  // g = 7 passes
  EXPECT_NE(dh.get(1), 0.f);  // u = 7 passes
  EXPECT_EQ(dh.get(2), 0.f);  // g = 7.5 clamped
  EXPECT_NE(dh.get(3), 0.f);  // u = -7 passes
  EXPECT_NE(dh.get(4), 0.f);
  EXPECT_EQ(dh.get(5), 0.f);  // u = 7.5 clamped
  EXPECT_NE(dh.get(6), 0.f);  // g = -8: the gate has no lower clamp (u clamped to -7: u + 1 = -6)
  EXPECT_EQ(dh.get(7), 0.f);  // u = -7.5 clamped
}

TEST(MoeSwiglu, NanStaysVisible) {
  Buffer h({1, 4}, MXMOE_DTYPE_BF16), y({1, 2}, MXMOE_DTYPE_BF16), dy({1, 2}, MXMOE_DTYPE_BF16), dh({1, 4}, MXMOE_DTYPE_BF16);
  h.set(0, std::nanf(""));  // gate 0 (concat)
  h.set(1, 1.f);
  h.set(2, 2.f);
  h.set(3, std::nanf(""));  // up 1
  dy.set(0, 1.f);
  dy.set(1, 1.f);
  mxmoe_tensor hv = h.view(), yv = y.view(), dyv = dy.view(), dhv = dh.view();
  ASSERT_EQ(mxmoe_swiglu(&hv, 0, 1.702f, 7.f, 1.f, &yv, nullptr), MXMOE_OK) << mxmoe_last_error();
  EXPECT_TRUE(std::isnan(y.get(0)));
  EXPECT_TRUE(std::isnan(y.get(1)));
  ASSERT_EQ(mxmoe_swiglu_backward(&dyv, &hv, 0, 1.702f, 7.f, 1.f, &dhv, nullptr), MXMOE_OK) << mxmoe_last_error();
  EXPECT_TRUE(std::isnan(dh.get(0)));  // dg at g = NaN
  EXPECT_TRUE(std::isnan(dh.get(1)));  // dg at u = NaN (through u + up_offset)
  EXPECT_TRUE(std::isnan(dh.get(2)));  // du at g = NaN (through silu(g))
  EXPECT_FALSE(std::isnan(dh.get(3)));  // du = dy * silu(1): does not depend on u
  EXPECT_EQ(dh.data<uint16_t>()[0], 0x7FC0);  // the canonical NaN
}

TEST(MoeSwiglu, BadInput) {
  Buffer h = randn({4, 8}, MXMOE_DTYPE_BF16, 1), y({4, 4}, MXMOE_DTYPE_BF16, 3);
  Buffer dy = randn({4, 4}, MXMOE_DTYPE_F32, 2), dh({4, 8}, MXMOE_DTYPE_BF16, 3);
  struct P {
    int32_t layout = 0;
    float alpha = 1.f, limit = kInf, up = 0.f;
  };
  std::vector<Buffer*> youts{&y}, douts{&dh};
  using M = std::function<void(mxmoe_tensor&, mxmoe_tensor&, P&)>;
  auto fwd = [&](M mut) {
    return [&, mut]() {
      mxmoe_tensor hv = h.view(), yv = y.view();
      P p;
      mut(hv, yv, p);
      return mxmoe_swiglu(&hv, p.layout, p.alpha, p.limit, p.up, &yv, nullptr);
    };
  };
  ASSERT_EQ(fwd([](auto&...) {})(), MXMOE_OK) << mxmoe_last_error();
  expect_rejected(fwd([](mxmoe_tensor& h, mxmoe_tensor& y, P&) { h.shape[1] = 7; h.strides[0] = 7; y.shape[1] = 3; y.strides[0] = 3; }), "h",
                  youts, "odd 2I");
  expect_rejected(fwd([](mxmoe_tensor&, mxmoe_tensor&, P& p) { p.layout = 2; }), "layout", youts, "layout 2");
  expect_rejected(fwd([](mxmoe_tensor&, mxmoe_tensor&, P& p) { p.alpha = std::nanf(""); }), "alpha", youts, "alpha NaN");
  expect_rejected(fwd([](mxmoe_tensor&, mxmoe_tensor&, P& p) { p.limit = -1.f; }), "limit", youts, "limit < 0");
  expect_rejected(fwd([](mxmoe_tensor&, mxmoe_tensor&, P& p) { p.limit = std::nanf(""); }), "limit", youts, "limit NaN");
  expect_rejected(fwd([](mxmoe_tensor&, mxmoe_tensor&, P& p) { p.up = kInf; }), "up_offset", youts, "up_offset inf");
  expect_rejected(fwd([](mxmoe_tensor&, mxmoe_tensor& y, P&) { y.dtype = MXMOE_DTYPE_F32; }), "y", youts, "y dtype");
  expect_rejected(fwd([](mxmoe_tensor&, mxmoe_tensor& y, P&) { y.shape[1] = 8; }), "y", youts, "y shape");
  using MB = std::function<void(mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&)>;
  auto bwd = [&](MB mut) {
    return [&, mut]() {
      mxmoe_tensor dyv = dy.view(), hv = h.view(), dhv = dh.view();
      mut(dyv, hv, dhv);
      return mxmoe_swiglu_backward(&dyv, &hv, 1, 1.702f, 7.f, 1.f, &dhv, nullptr);
    };
  };
  ASSERT_EQ(bwd([](auto&...) {})(), MXMOE_OK) << mxmoe_last_error();
  expect_rejected(bwd([](mxmoe_tensor& d, auto&...) { d.shape[1] = 8; }), "dy", douts, "dy shape");
  expect_rejected(bwd([](mxmoe_tensor& d, auto&...) { d.dtype = MXMOE_DTYPE_I32; }), "dy", douts, "dy dtype");
  expect_rejected(bwd([](mxmoe_tensor&, mxmoe_tensor& h, mxmoe_tensor&) { h.data = nullptr; }), "h", douts, "h NULL data");
  expect_rejected(bwd([](mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor& o) { o.dtype = MXMOE_DTYPE_F32; }), "dh", douts,
                  "dh dtype");
  expect_rejected(bwd([](mxmoe_tensor&, mxmoe_tensor& h, mxmoe_tensor& o) { o.data = h.data; }), "dh", douts,
                  "dh overlaps h");
  {  // empty rows / I = 0
    Buffer h0({0, 8}, MXMOE_DTYPE_F32), y0({0, 4}, MXMOE_DTYPE_F32), h1({3, 0}, MXMOE_DTYPE_F32), y1({3, 0}, MXMOE_DTYPE_F32);
    mxmoe_tensor a = h0.view(), b = y0.view(), c = h1.view(), e = y1.view();
    EXPECT_EQ(mxmoe_swiglu(&a, 0, 1.f, kInf, 0.f, &b, nullptr), MXMOE_OK) << mxmoe_last_error();
    EXPECT_EQ(mxmoe_swiglu(&c, 1, 1.f, kInf, 0.f, &e, nullptr), MXMOE_OK) << mxmoe_last_error();
  }
}

// ---- SwiGLU weight grad -------------------------------------------------------------------------------

// dw[e] = sum_i dy[r, i] * act_i with r = clamp(inv[e]), in the documented fixed order (tree_sum),
// from act (N, I) fp32 values: the test's own SwiGLU (ref_swiglu) or a device's mxmoe_swiglu.
std::vector<float> ref_swiglu_weight_grad(const Buffer& dy, const std::vector<float>& act, const std::vector<int32_t>& iv,
                                          int64_t N, int64_t I) {
  std::vector<float> want(iv.size());
  for (size_t e = 0; e < iv.size(); ++e) {
    const int64_t r = clampi(iv[e], N);
    std::vector<float> terms(I);
    for (int64_t i = 0; i < I; ++i) terms[i] = dy.get(r * I + i) * act[r * I + i];
    want[e] = tree_sum(terms, 32, 8);
  }
  return want;
}

// act (N, I) of h (N, 2I) by the test's scalar formula.
std::vector<float> ref_act(const Buffer& h, int64_t N, int64_t I, const Swiglu& p) {
  std::vector<float> act(N * I);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t i = 0; i < I; ++i)
      act[r * I + i] = ref_swiglu(h.get(r * 2 * I + gate_at(p.layout, i, I)), h.get(r * 2 * I + up_at(p.layout, i, I)), p);
  return act;
}

// Non-plain parameters: alpha != 1, a finite limit, up_offset != 0 (negative too).
const Swiglu kSwigluWgradParams[] = {kStandard, kGptOss, Swiglu{0, 1.702f, 7.0f, 1.0f}, Swiglu{1, 0.5f, 0.75f, -0.25f}};

TEST(MoeSwigluWeightGrad, MatchesFixedOrderAndDoubleDot) {
  const int64_t T = 5, K = 3, N = T * K + 2;  // two rows no entry points at
  for (const Swiglu& p : kSwigluWgradParams)
    for (int64_t I : {300, 24, 7, 0})
      for (mxmoe_dtype dd : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}) {
        SCOPED_TRACE("layout=" + std::to_string(p.layout) + " alpha=" + std::to_string(p.alpha) + " limit=" +
                     std::to_string(p.limit) + " I=" + std::to_string(I) + " dy=" + std::to_string(dd));
        // h: values at and past the clamps; row 0 also holds a NaN and an inf (dw NaN / inf-driven there).
        Buffer h = I ? swiglu_input(N, 2 * I, MXMOE_DTYPE_BF16, 61, p.limit) : Buffer({N, 0}, MXMOE_DTYPE_BF16);
        Buffer dy = randn({N, I}, dd, 62);
        std::vector<int32_t> iv(T * K);
        std::mt19937 rng(5);
        for (auto& v : iv) v = static_cast<int32_t>(rng() % (N + 4)) - 2;  // clamped: -2, -1, N, N + 1
        iv[1] = -7;
        iv[2] = N + 100;
        Buffer inv = i32_vec(iv, {T, K}), dw = poisoned({T, K}, MXMOE_DTYPE_F32);
        mxmoe_tensor dv = dy.view(), hv = h.view(), invv = inv.view(), wv = dw.view();
        ASSERT_EQ(mxmoe_moe_swiglu_weight_grad(&dv, &hv, &invv, p.layout, p.alpha, p.limit, p.up_offset, &wv, nullptr),
                  MXMOE_OK)
            << mxmoe_last_error();
        const std::vector<float> act = ref_act(h, N, I, p);
        const std::vector<float> want = ref_swiglu_weight_grad(dy, act, iv, N, I);
        EXPECT_TRUE(equals(dw, want));
        for (int64_t e = 0; e < T * K; ++e) {
          if (std::isnan(dw.get(e))) {
            EXPECT_EQ(mxtest::bits_of(dw.get(e)), 0x7FC00000u) << "canonical NaN";
          }
          if (!std::isfinite(want[e])) continue;
          const int64_t r = clampi(iv[e], N);
          double exact = 0, mag = 0;
          for (int64_t i = 0; i < I; ++i) {
            exact += double(dy.get(r * I + i)) * double(act[r * I + i]);
            mag += std::fabs(double(dy.get(r * I + i)) * double(act[r * I + i]));
          }
          EXPECT_NEAR(dw.get(e), exact, 2e-6 * (1 + mag));
        }
        if (I == 0) {
          for (int64_t e = 0; e < T * K; ++e) EXPECT_EQ(mxtest::bits_of(dw.get(e)), 0u) << "+0 where nothing is summed";
        }
      }
}

TEST(MoeSwigluWeightGrad, IsTheDotWithSwigluOutput) {
  // Against the library's own SwiGLU: dw[t, j] = <dy[r], swiglu(h[r])> with swiglu computed in f32
  // (a bf16 h converted exactly) by mxmoe_swiglu, then the fixed-order dot.
  const int64_t T = 40, K = 2, N = T * K, I = 72;
  for (const Swiglu& p : kSwigluWgradParams) {
    SCOPED_TRACE("layout=" + std::to_string(p.layout) + " limit=" + std::to_string(p.limit));
    Buffer h = randn({N, 2 * I}, MXMOE_DTYPE_BF16, 71, 3.f), hf({N, 2 * I}, MXMOE_DTYPE_F32), y({N, I}, MXMOE_DTYPE_F32);
    for (int64_t i = 0; i < h.numel(); ++i) hf.set(i, h.get(i));
    Buffer dy = randn({N, I}, MXMOE_DTYPE_F32, 72);
    std::vector<int32_t> iv(T * K);
    std::iota(iv.begin(), iv.end(), 0);
    std::shuffle(iv.begin(), iv.end(), std::mt19937(3));
    Buffer inv = i32_vec(iv, {T, K}), dw = poisoned({T, K}, MXMOE_DTYPE_F32);
    mxmoe_tensor hfv = hf.view(), yv = y.view(), dv = dy.view(), hv = h.view(), invv = inv.view(), wv = dw.view();
    ASSERT_EQ(mxmoe_swiglu(&hfv, p.layout, p.alpha, p.limit, p.up_offset, &yv, nullptr), MXMOE_OK) << mxmoe_last_error();
    ASSERT_EQ(mxmoe_moe_swiglu_weight_grad(&dv, &hv, &invv, p.layout, p.alpha, p.limit, p.up_offset, &wv, nullptr),
              MXMOE_OK)
        << mxmoe_last_error();
    std::vector<float> act(N * I);
    for (int64_t i = 0; i < N * I; ++i) act[i] = y.get(i);
    EXPECT_TRUE(equals(dw, ref_swiglu_weight_grad(dy, act, iv, N, I)));
  }
}

TEST(MoeSwigluWeightGrad, NanStaysVisible) {
  // Rows: gate NaN; up NaN under a finite clamp; dy NaN; plain. inv points at each row once.
  const int64_t N = 4, I = 8;
  Buffer h = randn({N, 2 * I}, MXMOE_DTYPE_BF16, 81), dy = randn({N, I}, MXMOE_DTYPE_BF16, 82);
  h.set(0 * 2 * I + 3, std::nanf(""));      // gate 3 of row 0 (concat)
  h.set(1 * 2 * I + I + 5, std::nanf(""));  // up 5 of row 1
  dy.set(2 * I + 7, std::nanf(""));
  Buffer inv = i32_vec({3, 2, 1, 0}, {2, 2}), dw = poisoned({2, 2}, MXMOE_DTYPE_F32);
  mxmoe_tensor dv = dy.view(), hv = h.view(), invv = inv.view(), wv = dw.view();
  ASSERT_EQ(mxmoe_moe_swiglu_weight_grad(&dv, &hv, &invv, 0, 1.702f, 7.f, 1.f, &wv, nullptr), MXMOE_OK)
      << mxmoe_last_error();
  EXPECT_FALSE(std::isnan(dw.get(0)));
  for (int64_t e = 1; e < 4; ++e) EXPECT_EQ(mxtest::bits_of(dw.get(e)), 0x7FC00000u) << "entry " << e;
}

TEST(MoeSwigluWeightGrad, EmptySizes) {
  for (const std::vector<int64_t>& s : {std::vector<int64_t>{0, 3, 0}, std::vector<int64_t>{4, 0, 5},
                                        std::vector<int64_t>{0, 0, 8}, std::vector<int64_t>{3, 2, 0}}) {
    const int64_t T = s[0], K = s[1], I = s[2], N = T * K;
    SCOPED_TRACE("T=" + std::to_string(T) + " k=" + std::to_string(K) + " I=" + std::to_string(I));
    Buffer dy({N, I}, MXMOE_DTYPE_F32), h({N, 2 * I}, MXMOE_DTYPE_BF16), dw = poisoned({T, K}, MXMOE_DTYPE_F32);
    std::vector<int32_t> iv(N);
    std::iota(iv.begin(), iv.end(), 0);
    Buffer inv = i32_vec(iv, {T, K});
    mxmoe_tensor dv = dy.view(), hv = h.view(), invv = inv.view(), wv = dw.view();
    ASSERT_EQ(mxmoe_moe_swiglu_weight_grad(&dv, &hv, &invv, 1, 1.f, kInf, 0.f, &wv, nullptr), MXMOE_OK)
        << mxmoe_last_error();
    for (int64_t e = 0; e < T * K; ++e) EXPECT_EQ(mxtest::bits_of(dw.get(e)), 0u);
  }
}

TEST(MoeSwigluWeightGrad, BadInput) {
  Buffer dy = randn({8, 4}, MXMOE_DTYPE_F32, 1), h = randn({8, 8}, MXMOE_DTYPE_BF16, 2);
  Buffer inv = i32_vec({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}), dw({4, 2}, MXMOE_DTYPE_F32, 3);
  std::vector<Buffer*> outs{&dw};
  struct P {
    int32_t layout = 1;
    float alpha = 1.702f, limit = 7.f, up = 1.f;
  };
  using M = std::function<void(mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&, mxmoe_tensor&, P&)>;
  auto call = [&](M mut) {
    return [&, mut]() {
      mxmoe_tensor dv = dy.view(), hv = h.view(), iv = inv.view(), wv = dw.view();
      P p;
      mut(dv, hv, iv, wv, p);
      return mxmoe_moe_swiglu_weight_grad(&dv, &hv, &iv, p.layout, p.alpha, p.limit, p.up, &wv, nullptr);
    };
  };
  using T = mxmoe_tensor;
  ASSERT_EQ(call([](auto&...) {})(), MXMOE_OK) << mxmoe_last_error();
  expect_rejected(call([](T& d, auto&...) { d.dtype = MXMOE_DTYPE_E8M0; }), "dy", outs, "dy dtype");
  expect_rejected(call([](T& d, auto&...) { d.ndim = 1; }), "dy", outs, "dy 1-D");
  expect_rejected(call([](T& d, auto&...) { d.strides[0] = 5; }), "dy", outs, "dy not contiguous");
  expect_rejected(call([](T&, T& h, auto&...) { h.dtype = MXMOE_DTYPE_F32; }), "h", outs, "h f32");
  expect_rejected(call([](T&, T& h, auto&...) { h.shape[1] = 7; h.strides[0] = 7; }), "h", outs, "h != 2I columns");
  expect_rejected(call([](T&, T& h, auto&...) { h.shape[1] = 4; h.strides[0] = 4; }), "h", outs, "h I columns");
  expect_rejected(call([](T&, T& h, auto&...) { h.shape[0] = 7; }), "h", outs, "h rows");
  expect_rejected(call([](T&, T& h, auto&...) { h.ndim = 3; }), "h", outs, "h 3-D");
  expect_rejected(call([](T&, T& h, auto&...) { h.strides[0] = 9; }), "h", outs, "h not contiguous");
  expect_rejected(call([](T&, T& h, auto&...) { h.data = nullptr; }), "h", outs, "h NULL data");
  expect_rejected(call([](T&, T&, T& i, auto&...) { i.dtype = MXMOE_DTYPE_I64; }), "inv", outs, "inv int64");
  expect_rejected(call([](T&, T&, T& i, auto&...) { i.ndim = 1; i.shape[0] = 8; i.strides[0] = 1; }), "inv", outs,
                  "inv 1-D");
  expect_rejected(call([](T&, T&, T&, T&, P& p) { p.layout = 2; }), "layout", outs, "layout 2");
  expect_rejected(call([](T&, T&, T&, T&, P& p) { p.layout = -1; }), "layout", outs, "layout -1");
  expect_rejected(call([](T&, T&, T&, T&, P& p) { p.alpha = std::nanf(""); }), "alpha", outs, "alpha NaN");
  expect_rejected(call([](T&, T&, T&, T&, P& p) { p.limit = std::nanf(""); }), "limit", outs, "limit NaN");
  expect_rejected(call([](T&, T&, T&, T&, P& p) { p.limit = -1.f; }), "limit", outs, "limit < 0");
  expect_rejected(call([](T&, T&, T&, T&, P& p) { p.up = std::nanf(""); }), "up_offset", outs, "up_offset NaN");
  expect_rejected(call([](T&, T&, T&, T& w, P&) { w.dtype = MXMOE_DTYPE_BF16; }), "dw", outs, "dw bf16");
  expect_rejected(call([](T&, T&, T&, T& w, P&) { w.shape[1] = 3; }), "dw", outs, "dw shape");
  expect_rejected(call([](T&, T&, T&, T& w, P&) { w.strides[0] = 4; }), "dw", outs, "dw not contiguous");
  expect_rejected(call([](T& d, T&, T&, T& w, P&) { w.data = d.data; }), "dw", outs, "dw overlaps dy");
  expect_rejected(call([](T&, T& h, T&, T& w, P&) { w.data = h.data; }), "dw", outs, "dw overlaps h");
  expect_rejected(call([](T&, T&, T& i, T& w, P&) { w.data = i.data; }), "dw", outs, "dw overlaps inv");
  {  // entries but no rows to read
    Buffer d0({0, 4}, MXMOE_DTYPE_F32), h0({0, 8}, MXMOE_DTYPE_BF16);
    expect_rejected(
        [&]() {
          mxmoe_tensor dv = d0.view(), hv = h0.view(), iv = inv.view(), wv = dw.view();
          return mxmoe_moe_swiglu_weight_grad(&dv, &hv, &iv, 0, 1.f, kInf, 0.f, &wv, nullptr);
        },
        "dy", outs, "no rows");
  }
}

// ==== CUDA == CPU =====================================================================================
#if defined(MXMOE_WITH_CUDA)

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

// A device copy of a host buffer (or a poisoned output), data `shift` bytes past a 256-aligned address
// (shift 2 or 4: misaligned views take the kernels' scalar paths).
struct Dev {
  std::vector<int64_t> shape;
  mxmoe_dtype dtype;
  size_t nbytes = 0, shift = 0;
  uint8_t* base = nullptr;
  Dev(const Buffer& h, size_t shift_ = 0) : shape(h.shape), dtype(h.dtype), nbytes(h.bytes.size()), shift(shift_) {
    EXPECT_EQ(cudaMalloc(&base, nbytes + 512), cudaSuccess);
    EXPECT_EQ(cudaMemset(base, 0x5C, nbytes + 512), cudaSuccess);
    if (nbytes) {
      EXPECT_EQ(cudaMemcpy(data(), h.bytes.data(), nbytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~Dev() { cudaFree(base); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  uint8_t* data() const { return base + 256 + shift; }
  mxmoe_tensor view() const {
    Buffer b(shape, dtype);
    mxmoe_tensor t = b.view();
    t.data = nbytes ? data() : nullptr;
    t.device = 0;
    return t;
  }
  Buffer download() const {
    Buffer h(shape, dtype);
    if (nbytes) {
      EXPECT_EQ(cudaMemcpy(h.bytes.data(), data(), nbytes, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return h;
  }
  bool guards_intact() const {
    std::vector<uint8_t> all(nbytes + 512);
    EXPECT_EQ(cudaMemcpy(all.data(), base, all.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < 256 + shift; ++i)
      if (all[i] != 0x5C) return false;
    for (size_t i = 256 + shift + nbytes; i < all.size(); ++i)
      if (all[i] != 0x5C) return false;
    return true;
  }
};

void sync() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

TEST(CudaMoe, RoutingMatchesCpu) {
  REQUIRE_GPU();
  struct C {
    int64_t t, k, e, lo, hi;
  };
  for (const C& c : {C{0, 4, 8, 0, 7}, C{1, 1, 1, 0, 0}, C{50, 1, 4, -2, 5}, C{33, 8, 16, -3, 19},
                     C{4096, 8, 128, -1, 128}, C{3000, 2, 1 << 20, -5, (1 << 20) + 5}, C{40, 2, 8, 5, 5},
                     C{20000, 4, 7, 0, 6}}) {
    for (bool i64 : {false, true}) {
      SCOPED_TRACE("T=" + std::to_string(c.t) + " k=" + std::to_string(c.k) + " E=" + std::to_string(c.e));
      const int64_t n = c.t * c.k;
      const auto ids = random_ids(n, c.lo, c.hi, static_cast<uint32_t>(c.t + c.e));
      Buffer idx = i64 ? ids_i64(c.t, c.k, ids) : ids_i32(c.t, c.k, ids);
      Buffer offs = poisoned({c.e}, MXMOE_DTYPE_I32), perm = poisoned({n}, MXMOE_DTYPE_I32),
             inv = poisoned({c.t, c.k}, MXMOE_DTYPE_I32);
      mxmoe_tensor iv = idx.view(), ov = offs.view(), pv = perm.view(), invv = inv.view();
      ASSERT_EQ(mxmoe_moe_routing(&iv, c.e, &ov, &pv, &invv, nullptr, nullptr), MXMOE_OK) << mxmoe_last_error();
      const int64_t ws_bytes = mxmoe_moe_routing_workspace_size(n, c.e, 0);
      ASSERT_GE(ws_bytes, 0) << mxmoe_last_error();
      Dev di(idx), dof(poisoned({c.e}, MXMOE_DTYPE_I32)), dp(poisoned({n}, MXMOE_DTYPE_I32)),
          dinv(poisoned({c.t, c.k}, MXMOE_DTYPE_I32)), dws(Buffer({std::max<int64_t>(ws_bytes, 1)}, MXMOE_DTYPE_E4M3, 0x77));
      mxmoe_tensor a = di.view(), b = dof.view(), p = dp.view(), q = dinv.view(), w = dws.view();
      if (ws_bytes > 0) {  // too small a workspace is rejected
        mxmoe_tensor small = w;
        small.shape[0] = ws_bytes - 1;
        EXPECT_EQ(mxmoe_moe_routing(&a, c.e, &b, &p, &q, &small, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
        EXPECT_TRUE(names_arg(mxmoe_last_error(), "workspace")) << mxmoe_last_error();
      }
      ASSERT_EQ(mxmoe_moe_routing(&a, c.e, &b, &p, &q, ws_bytes > 0 ? &w : nullptr, nullptr), MXMOE_OK)
          << mxmoe_last_error();
      sync();
      EXPECT_TRUE(same_bytes(dof.download(), offs));
      EXPECT_TRUE(same_bytes(dp.download(), perm));
      EXPECT_TRUE(same_bytes(dinv.download(), inv));
      EXPECT_TRUE(dof.guards_intact() && dp.guards_intact() && dinv.guards_intact());
    }
  }
}

TEST(CudaMoe, GatherCombineMatchCpu) {
  REQUIRE_GPU();
  for (int64_t H : {256, 40, 13}) {
    const int64_t T = 300, K = 4, N = T * K;
    for (mxmoe_dtype in : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (mxmoe_dtype od : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
        for (int fk : {-1, int(MXMOE_DTYPE_F32), int(MXMOE_DTYPE_BF16)})
          for (size_t shift : {size_t(0), size_t(4)}) {
            SCOPED_TRACE("H=" + std::to_string(H) + " in=" + std::to_string(in) + " out=" + std::to_string(od) +
                         " factor=" + std::to_string(fk) + " shift=" + std::to_string(shift));
            Buffer x = randn({T, H}, in, 1, 3.f);
            x.set(5, std::nanf(""));
            std::vector<int32_t> pv(N);
            std::iota(pv.begin(), pv.end(), 0);
            std::shuffle(pv.begin(), pv.end(), std::mt19937(9));
            pv[0] = -3;
            pv[7] = N + 10;
            Buffer perm = i32_vec(pv, {N});
            Buffer f = fk < 0 ? Buffer() : randn({T, K}, static_cast<mxmoe_dtype>(fk), 2);
            // gather
            Buffer g = poisoned({N, H}, od);
            mxmoe_tensor xv = x.view(), permv = perm.view(), fv = f.view(), gv = g.view();
            ASSERT_EQ(mxmoe_moe_gather(&xv, &permv, K, fk < 0 ? nullptr : &fv, &gv, nullptr), MXMOE_OK);
            Dev dx(x, shift), dperm(perm), df(f.bytes.empty() ? Buffer({T, K}, MXMOE_DTYPE_F32) : f),
                dg(poisoned({N, H}, od), shift);
            mxmoe_tensor a = dx.view(), b = dperm.view(), c = df.view(), d = dg.view();
            if (fk < 0) c = mxmoe_tensor{};
            ASSERT_EQ(mxmoe_moe_gather(&a, &b, K, fk < 0 ? nullptr : &c, &d, nullptr), MXMOE_OK) << mxmoe_last_error();
            sync();
            EXPECT_TRUE(same_bytes(dg.download(), g));
            EXPECT_TRUE(dg.guards_intact());
            // combine of the gathered rows through a routing's inv (clamped garbage included)
            std::vector<int32_t> iv(T * K);
            for (int64_t i = 0; i < T * K; ++i) iv[i] = static_cast<int32_t>((i * 7919) % (N + 6)) - 3;
            Buffer inv = i32_vec(iv, {T, K});
            Buffer o = poisoned({T, H}, od);
            mxmoe_tensor yv = g.view(), invv = inv.view(), ov = o.view();
            ASSERT_EQ(mxmoe_moe_combine(&yv, &invv, fk < 0 ? nullptr : &fv, &ov, nullptr), MXMOE_OK);
            Dev dinv(inv), dout(poisoned({T, H}, od), shift);
            mxmoe_tensor e = dg.view(), q = dinv.view(), r = dout.view();
            ASSERT_EQ(mxmoe_moe_combine(&e, &q, fk < 0 ? nullptr : &c, &r, nullptr), MXMOE_OK) << mxmoe_last_error();
            sync();
            EXPECT_TRUE(same_bytes(dout.download(), o));
            EXPECT_TRUE(dout.guards_intact());
          }
  }
}

TEST(CudaMoe, WeightGradAndGroupSumMatchCpu) {
  REQUIRE_GPU();
  for (int64_t H : {2048, 300, 13, 0}) {
    for (mxmoe_dtype dd : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (mxmoe_dtype yd : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
        for (size_t shift : {size_t(0), size_t(4)}) {
          SCOPED_TRACE("H=" + std::to_string(H) + " shift=" + std::to_string(shift));
          const int64_t T = 257, K = 3, N = T * K;
          Buffer dout = randn({T, H}, dd, 3), y = randn({N, H}, yd, 4);
          std::vector<int32_t> iv(T * K);
          for (int64_t i = 0; i < T * K; ++i) iv[i] = static_cast<int32_t>((i * 104729) % (N + 4)) - 2;
          Buffer inv = i32_vec(iv, {T, K}), dw = poisoned({T, K}, MXMOE_DTYPE_F32);
          mxmoe_tensor a = dout.view(), b = y.view(), c = inv.view(), d = dw.view();
          ASSERT_EQ(mxmoe_moe_combine_weight_grad(&a, &b, &c, &d, nullptr), MXMOE_OK) << mxmoe_last_error();
          Dev ddout(dout, shift), dy(y, shift), dinv(inv), ddw(poisoned({T, K}, MXMOE_DTYPE_F32));
          mxmoe_tensor e = ddout.view(), f = dy.view(), g = dinv.view(), h = ddw.view();
          ASSERT_EQ(mxmoe_moe_combine_weight_grad(&e, &f, &g, &h, nullptr), MXMOE_OK) << mxmoe_last_error();
          sync();
          EXPECT_TRUE(same_bytes(ddw.download(), dw));
          // group sums of y's rows
          for (const std::vector<int32_t>& ends :
               {std::vector<int32_t>{100, 100, 400, 300, 770}, std::vector<int32_t>{-1, int32_t(N) + 5},
                std::vector<int32_t>(100, 0)}) {
            std::vector<int32_t> e2 = ends;
            if (e2.size() == 100)
              for (size_t i = 0; i < e2.size(); ++i) e2[i] = static_cast<int32_t>(i * 7);
            const int64_t G = static_cast<int64_t>(e2.size());
            Buffer offs = mxtest::offsets(e2), gs = poisoned({G, H}, MXMOE_DTYPE_F32);
            mxmoe_tensor xv = y.view(), ov = offs.view(), gv = gs.view();
            ASSERT_EQ(mxmoe_moe_group_sum(&xv, &ov, &gv, nullptr), MXMOE_OK) << mxmoe_last_error();
            Dev doffs(offs), dgs(poisoned({G, H}, MXMOE_DTYPE_F32), shift);
            mxmoe_tensor p = dy.view(), q = doffs.view(), r = dgs.view();
            ASSERT_EQ(mxmoe_moe_group_sum(&p, &q, &r, nullptr), MXMOE_OK) << mxmoe_last_error();
            sync();
            EXPECT_TRUE(same_bytes(dgs.download(), gs)) << "G = " << G;
            EXPECT_TRUE(dgs.guards_intact());
          }
        }
  }
}

TEST(CudaMoe, SwigluWeightGradMatchesCpu) {
  REQUIRE_GPU();
  // The device result equals the fixed-order dot with the device's own SwiGLU values (mxmoe_swiglu of
  // the exactly converted f32 h: the same swiglu_value code) bit for bit, and the CPU result within
  // the rounding of act terms whose host and device expf differ (see moe.h); bit for bit where the
  // rows' act values agree. Aligned (vector) and shifted (scalar) views, I not a multiple of 8, NaN.
  struct C {
    int64_t t, k, i;
  };
  for (const Swiglu& p : kSwigluWgradParams)
    for (const C& c : {C{257, 3, 512}, C{257, 3, 300}, C{100, 2, 24}, C{100, 2, 13}, C{31, 4, 0}, C{5000, 8, 64}})
      for (mxmoe_dtype dd : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
        for (size_t shift : {size_t(0), size_t(4)}) {
          if (c.t == 5000 && (shift || dd == MXMOE_DTYPE_BF16)) continue;  // the grid-stride case once per params
          const int64_t T = c.t, K = c.k, I = c.i, N = T * K + 3;
          SCOPED_TRACE("layout=" + std::to_string(p.layout) + " limit=" + std::to_string(p.limit) + " T=" +
                       std::to_string(T) + " I=" + std::to_string(I) + " dy=" + std::to_string(dd) +
                       " shift=" + std::to_string(shift));
          Buffer h = I ? swiglu_input(N, 2 * I, MXMOE_DTYPE_BF16, 91, p.limit) : Buffer({N, 0}, MXMOE_DTYPE_BF16);
          Buffer dy = randn({N, I}, dd, 92);
          if (I) dy.set(5 * I + I / 2, std::nanf(""));  // row 5: dw NaN
          std::vector<int32_t> iv(T * K);
          for (int64_t e = 0; e < T * K; ++e) iv[e] = static_cast<int32_t>((e * 104729) % (N + 4)) - 2;
          iv[0] = 5;
          Buffer inv = i32_vec(iv, {T, K}), dw = poisoned({T, K}, MXMOE_DTYPE_F32);
          mxmoe_tensor a = dy.view(), b = h.view(), q = inv.view(), w = dw.view();
          ASSERT_EQ(mxmoe_moe_swiglu_weight_grad(&a, &b, &q, p.layout, p.alpha, p.limit, p.up_offset, &w, nullptr),
                    MXMOE_OK)
              << mxmoe_last_error();
          Dev ddy(dy, shift), dh(h, shift), dinv(inv), ddw(poisoned({T, K}, MXMOE_DTYPE_F32));
          mxmoe_tensor e = ddy.view(), f = dh.view(), g = dinv.view(), o = ddw.view();
          ASSERT_EQ(mxmoe_moe_swiglu_weight_grad(&e, &f, &g, p.layout, p.alpha, p.limit, p.up_offset, &o, nullptr),
                    MXMOE_OK)
              << mxmoe_last_error();
          sync();
          const Buffer got = ddw.download();
          EXPECT_TRUE(ddw.guards_intact());
          // The SwiGLU values on each side, in f32 (bf16 -> f32 is exact).
          Buffer hf({N, 2 * I}, MXMOE_DTYPE_F32), act_h({N, I}, MXMOE_DTYPE_F32);
          for (int64_t i = 0; i < h.numel(); ++i) hf.set(i, h.get(i));
          mxmoe_tensor hfv = hf.view(), ahv = act_h.view();
          ASSERT_EQ(mxmoe_swiglu(&hfv, p.layout, p.alpha, p.limit, p.up_offset, &ahv, nullptr), MXMOE_OK);
          Dev dhf(hf), dact(poisoned({N, I}, MXMOE_DTYPE_F32));
          mxmoe_tensor x = dhf.view(), y = dact.view();
          ASSERT_EQ(mxmoe_swiglu(&x, p.layout, p.alpha, p.limit, p.up_offset, &y, nullptr), MXMOE_OK)
              << mxmoe_last_error();
          sync();
          const Buffer act_d = dact.download();
          std::vector<float> vh(N * I), vd(N * I);
          for (int64_t i = 0; i < N * I; ++i) vh[i] = act_h.get(i), vd[i] = act_d.get(i);
          EXPECT_TRUE(equals(dw, ref_swiglu_weight_grad(dy, vh, iv, N, I)));   // host == its own act
          EXPECT_TRUE(equals(got, ref_swiglu_weight_grad(dy, vd, iv, N, I)));  // device == its own act
          for (int64_t en = 0; en < T * K; ++en) {
            const float gd = got.get(en), gh = dw.get(en);
            if (std::isnan(gd)) {
              EXPECT_EQ(mxtest::bits_of(gd), 0x7FC00000u) << "canonical NaN at " << en;
            }
            const int64_t r = clampi(iv[en], N);
            bool same_act = true;
            double mag = 0;
            for (int64_t i = 0; i < I; ++i) {
              same_act = same_act && mxtest::bits_of(vh[r * I + i]) == mxtest::bits_of(vd[r * I + i]);
              mag += std::fabs(double(dy.get(r * I + i)) * double(vh[r * I + i]));
            }
            if (same_act) {
              ASSERT_TRUE((std::isnan(gd) && std::isnan(gh)) || mxtest::bits_of(gd) == mxtest::bits_of(gh))
                  << "entry " << en << ": " << gd << " vs " << gh;
            } else {  // rounding differences only (a few fp32 ulps of the sum of |terms|)
              ASSERT_EQ(std::isnan(gd), std::isnan(gh)) << "entry " << en;
              if (std::isfinite(gd) || std::isfinite(gh)) {
                ASSERT_NEAR(gd, gh, 4e-6 * (1 + mag)) << "entry " << en;
              } else if (!std::isnan(gd)) {
                ASSERT_EQ(gd, gh) << "entry " << en;
              }
            }
          }
          EXPECT_TRUE(std::isnan(got.get(0)) || I == 0);  // iv[0] = 5: the NaN row
        }
}

// |a - b| in units in the last place of dtype d at the larger magnitude (NaN == NaN).
double ulps(float a, float b, mxmoe_dtype d) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : 1e9;
  if (a == b) return 0;
  const double m = std::max(std::fabs(a), std::fabs(b));
  const int e = std::max(std::ilogb(m), -126);
  return std::fabs(double(a) - double(b)) / std::ldexp(1.0, e - (d == MXMOE_DTYPE_BF16 ? 7 : 23));
}

TEST(CudaMoe, SwigluWithinOneUlpOfCpu) {
  REQUIRE_GPU();
  for (const Swiglu& p : {kStandard, kGptOss, Swiglu{1, 1.0f, kInf, 0.0f}, Swiglu{0, 1.702f, 7.0f, 1.0f}})
    for (mxmoe_dtype d : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (int64_t I : {512, 24, 5})
        for (size_t shift : {size_t(0), size_t(4)}) {
          SCOPED_TRACE("layout=" + std::to_string(p.layout) + " I=" + std::to_string(I) + " d=" + std::to_string(d) +
                       " shift=" + std::to_string(shift));
          const int64_t N = 200;
          Buffer h = swiglu_input(N, 2 * I, d, 51, p.limit), dy = randn({N, I}, d, 52), y = poisoned({N, I}, d),
                 dh = poisoned({N, 2 * I}, d);
          mxmoe_tensor hv = h.view(), yv = y.view(), dyv = dy.view(), dhv = dh.view();
          ASSERT_EQ(mxmoe_swiglu(&hv, p.layout, p.alpha, p.limit, p.up_offset, &yv, nullptr), MXMOE_OK);
          ASSERT_EQ(mxmoe_swiglu_backward(&dyv, &hv, p.layout, p.alpha, p.limit, p.up_offset, &dhv, nullptr), MXMOE_OK);
          Dev dh_(h, shift), dy_(dy, shift), dyo(poisoned({N, I}, d), shift), ddh(poisoned({N, 2 * I}, d), shift);
          mxmoe_tensor a = dh_.view(), b = dyo.view(), c = dy_.view(), e = ddh.view();
          ASSERT_EQ(mxmoe_swiglu(&a, p.layout, p.alpha, p.limit, p.up_offset, &b, nullptr), MXMOE_OK) << mxmoe_last_error();
          ASSERT_EQ(mxmoe_swiglu_backward(&c, &a, p.layout, p.alpha, p.limit, p.up_offset, &e, nullptr), MXMOE_OK)
              << mxmoe_last_error();
          sync();
          const Buffer gy = dyo.download(), gdh = ddh.download();
          // expf may differ by an fp32 ulp between host and device: at most one ulp of bf16 outputs (a
          // few of f32 ones), except where dg's s + z*s*(1-s) cancels, bounded in absolute terms there.
          const double bound = d == MXMOE_DTYPE_BF16 ? 1 : 8;
          for (int64_t i = 0; i < N * I; ++i) ASSERT_LE(ulps(gy.get(i), y.get(i), d), bound) << "y[" << i << "]";
          for (int64_t r = 0; r < N; ++r)
            for (int64_t i = 0; i < I; ++i)
              for (int64_t at : {gate_at(p.layout, i, I), up_at(p.layout, i, I)}) {
                const int64_t q = r * 2 * I + at;
                const float a1 = gdh.get(q), b1 = dh.get(q);
                const double scale = std::fabs(dy.get(r * I + i)) * (std::fabs(h.get(r * 2 * I + up_at(p.layout, i, I))) + 1) *
                                     (1 + std::fabs(p.alpha * h.get(r * 2 * I + gate_at(p.layout, i, I))));
                const bool close = ulps(a1, b1, d) <= bound || std::fabs(double(a1) - double(b1)) <= 1e-6 * scale;
                ASSERT_TRUE(close) << "dh[" << q << "]: " << a1 << " vs " << b1;
              }
          EXPECT_TRUE(dyo.guards_intact() && ddh.guards_intact());
        }
}

TEST(CudaMoe, BadInputOnDevice) {
  REQUIRE_GPU();
  // Mixed devices and a missing workspace are rejected before anything runs.
  Buffer x = randn({4, 8}, MXMOE_DTYPE_F32, 1), perm = i32_vec({0, 1, 2, 3, 4, 5, 6, 7}, {8});
  Dev dx(x), dout(poisoned({8, 8}, MXMOE_DTYPE_F32));
  mxmoe_tensor a = dx.view(), p = perm.view(), o = dout.view();
  EXPECT_EQ(mxmoe_moe_gather(&a, &p, 2, nullptr, &o, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(names_arg(mxmoe_last_error(), "perm")) << mxmoe_last_error();
  Buffer idx = ids_i32(4, 2, {0, 1, 2, 3, 0, 1, 2, 3});
  Dev di(idx), dof(poisoned({4}, MXMOE_DTYPE_I32)), dp(poisoned({8}, MXMOE_DTYPE_I32)), dinv(poisoned({4, 2}, MXMOE_DTYPE_I32));
  mxmoe_tensor i = di.view(), of = dof.view(), pp = dp.view(), iv = dinv.view();
  EXPECT_EQ(mxmoe_moe_routing(&i, 4, &of, &pp, &iv, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(names_arg(mxmoe_last_error(), "workspace")) << mxmoe_last_error();
}

#endif  // MXMOE_WITH_CUDA

}  // namespace
