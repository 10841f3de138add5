// Bad input at the C API: every entry point, starting from a call that succeeds, with one thing
// broken at a time. Each must return a non-OK status, name the argument first in
// mxmoe_last_error() with expected vs actual ("expected ..., got ..."), and leave every output
// byte as it was. Then out-of-range offsets, which only checked mode rejects: kernels clamp them
// and never write outside their outputs (guard bytes around every output stay intact).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>

#include "test_util.hpp"

using mxtest::Buffer;

namespace {

constexpr uint8_t kSentinel = 0x5A;
constexpr int64_t kGuard = 64;  // bytes on each side of a guarded output

// An output whose view sits between guard bytes, everything filled with kSentinel.
struct Guarded {
  std::vector<int64_t> shape;
  mxmoe_dtype dtype;
  std::vector<uint8_t> bytes;
  Guarded(std::vector<int64_t> s, mxmoe_dtype d) : shape(std::move(s)), dtype(d) {
    Buffer b(shape, d);
    bytes.assign(b.bytes.size() + 2 * kGuard, kSentinel);
  }
  mxmoe_tensor view() {
    Buffer b(shape, dtype);
    mxmoe_tensor t = b.view();
    t.data = bytes.data() + kGuard;
    return t;
  }
  uint8_t* body() { return bytes.data() + kGuard; }
  size_t body_size() const { return bytes.size() - 2 * kGuard; }
  bool guards_intact() const {
    for (int64_t i = 0; i < kGuard; ++i)
      if (bytes[i] != kSentinel || bytes[bytes.size() - 1 - i] != kSentinel) return false;
    return true;
  }
  bool untouched() const {
    for (auto v : bytes)
      if (v != kSentinel) return false;
    return true;
  }
};

Buffer random_bytes(std::vector<int64_t> shape, mxmoe_dtype d, uint32_t seed, uint8_t lo, uint8_t hi) {
  Buffer b(std::move(shape), d);
  std::mt19937 rng(seed);
  for (auto& v : b.bytes) v = static_cast<uint8_t>(lo + rng() % (hi - lo + 1));
  return b;
}

bool starts_with_arg(const std::string& msg, const std::string& arg) {
  if (msg.compare(0, arg.size(), arg) != 0 || msg.size() == arg.size()) return false;
  const char next = msg[arg.size()];
  return next == ':' || next == ' ' || next == ',';
}

// One broken call: `mutate` breaks the fixture, `arg` must open the message. Moving the first
// tensor to cuda:0 is refused by a CPU-only build; a CUDA build accepts it and names the next
// tensor left on the host instead (`cuda_arg`, "" when such a call is not a validation error there).
template <typename Fixture>
struct Case {
  Case(const char* w, std::function<void(Fixture&)> m, std::string a, std::optional<std::string> ca = {})
      : what(w), mutate(std::move(m)), arg(std::move(a)), cuda_arg(std::move(ca)) {}
  const char* what;
  std::function<void(Fixture&)> mutate;
  std::string arg;
  std::optional<std::string> cuda_arg;
};

template <typename Fixture>
void expect_all_rejected(const std::vector<Case<Fixture>>& cases) {
  {
    Fixture ok;  // the baseline must pass, or every case below would pass for the wrong reason
    ASSERT_EQ(ok.call(), MXMOE_OK) << mxmoe_last_error();
  }
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string arg = mxmoe_has_cuda() && c.cuda_arg ? *c.cuda_arg : c.arg;
    if (arg.empty()) continue;
    Fixture f;
    c.mutate(f);
    const mxmoe_status st = f.call();
    const std::string msg = mxmoe_last_error();
    EXPECT_NE(st, MXMOE_OK);
    EXPECT_TRUE(st == MXMOE_ERR_INVALID_ARGUMENT || st == MXMOE_ERR_UNSUPPORTED) << st;
    EXPECT_TRUE(starts_with_arg(msg, arg)) << "message should name '" << arg << "': " << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got"), std::string::npos) << msg;
    for (Guarded* g : f.outputs()) EXPECT_TRUE(g->untouched()) << "an output was written: " << msg;
  }
}

// Helpers that change a view in place.
void set_shape(mxmoe_tensor& t, std::vector<int64_t> shape) {
  t.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
}
// Same elements, a gap of one element after each row: no longer contiguous.
void make_non_contiguous(mxmoe_tensor& t) { t.strides[0] = t.shape[1] * (t.ndim == 2 ? 1 : t.shape[2]) + 1; }

// ---- fixtures: a valid call each -----------------------------------------------------------------

struct QuantizeFix {
  Buffer x = mxtest::random_input({64, 64}, MXMOE_DTYPE_F32, 1);
  Buffer offs_buf = mxtest::offsets({10, 64});
  Guarded q{{64, 64}, MXMOE_DTYPE_E4M3}, qt{{64, 64}, MXMOE_DTYPE_E4M3};
  Guarded sc{{64, 2}, MXMOE_DTYPE_E8M0}, sr{{64, 2 + 2}, MXMOE_DTYPE_E8M0};
  mxmoe_tensor xv = x.view(), ov = offs_buf.view(), qv = q.view(), qtv = qt.view(), scv = sc.view(), srv = sr.view();
  mxmoe_tensor *px = &xv, *poffs = nullptr, *pq = &qv, *pqt = nullptr, *psc = &scv, *psr = nullptr;
  mxmoe_quant_config cfg{1, 32, MXMOE_SCALE_RCEIL};
  mxmoe_status call() { return mxmoe_quantize(px, poffs, cfg, pq, pqt, psc, psr, nullptr); }
  std::vector<Guarded*> outputs() { return {&q, &qt, &sc, &sr}; }
};

struct DequantizeFix {
  Buffer q = random_bytes({64, 64}, MXMOE_DTYPE_E4M3, 2, 0, 0x7E);
  Buffer s = random_bytes({64, 2}, MXMOE_DTYPE_E8M0, 3, 110, 140);
  Buffer offs_buf = mxtest::offsets({10, 64});
  Guarded out{{64, 64}, MXMOE_DTYPE_F32};
  mxmoe_tensor qv = q.view(), sv = s.view(), ov = offs_buf.view(), outv = out.view();
  mxmoe_tensor *pq = &qv, *ps = &sv, *poffs = nullptr, *pout = &outv;
  int32_t axis = 1;
  mxmoe_status call() { return mxmoe_dequantize(pq, ps, axis, poffs, pout, nullptr); }
  std::vector<Guarded*> outputs() { return {&out}; }
};

// scales_to_blocked (to = true) or scales_from_blocked, WHOLE over a (100, 6) scale.
template <bool To>
struct BlockedFix {
  Buffer in_scale = random_bytes({100, 6}, MXMOE_DTYPE_E8M0, 4, 1, 254);
  Buffer in_blocked = random_bytes({128 * 8}, MXMOE_DTYPE_E8M0, 5, 1, 254);
  Guarded out_scale{{100, 6}, MXMOE_DTYPE_E8M0}, out_blocked{{128 * 8}, MXMOE_DTYPE_E8M0};
  Buffer offs_buf = mxtest::offsets({40, 100});
  mxmoe_tensor sv = To ? in_scale.view() : out_scale.view();
  mxmoe_tensor bv = To ? out_blocked.view() : in_blocked.view();
  mxmoe_tensor ov = offs_buf.view();
  mxmoe_tensor *ps = &sv, *pb = &bv, *poffs = nullptr;
  mxmoe_blocked_kind kind = MXMOE_BLOCKED_WHOLE;
  mxmoe_status call() {
    return To ? mxmoe_scales_to_blocked(ps, kind, poffs, pb, nullptr)
              : mxmoe_scales_from_blocked(pb, kind, poffs, ps, nullptr);
  }
  std::vector<Guarded*> outputs() { return {&out_scale, &out_blocked}; }
};

// out (64, 32) = a (64, 64) . b[g] (32, 64)^T over two groups; through mxmoe_grouped_mm_mx or the
// tile128 entry point (host tensors: the same operand checks, no workspace).
template <bool Tile128>
struct GemmFixT {
  Buffer a = random_bytes({64, 64}, MXMOE_DTYPE_E4M3, 6, 0, 0x7E);
  Buffer as = random_bytes({64, 2}, MXMOE_DTYPE_E8M0, 7, 110, 140);
  Buffer b = random_bytes({2, 32, 64}, MXMOE_DTYPE_E4M3, 8, 0, 0x7E);
  Buffer bs = random_bytes({2, 32, 2}, MXMOE_DTYPE_E8M0, 9, 110, 140);
  Buffer offs_buf = mxtest::offsets({20, 64});
  Buffer bias = mxtest::random_input({2, 32}, MXMOE_DTYPE_F32, 10);
  Guarded out{{64, 32}, MXMOE_DTYPE_F32};
  mxmoe_tensor av = a.view(), asv = as.view(), bv = b.view(), bsv = bs.view(), ov = offs_buf.view(),
               biasv = bias.view(), outv = out.view();
  mxmoe_tensor *pa = &av, *pas = &asv, *pb = &bv, *pbs = &bsv, *poffs = &ov, *pbias = &biasv, *pout = &outv;
  mxmoe_status call() {
    return Tile128 ? mxmoe_grouped_mm_tile128(pa, pas, pb, pbs, poffs, pbias, pout, nullptr, nullptr)
                   : mxmoe_grouped_mm_mx(pa, pas, pb, pbs, poffs, pbias, pout, nullptr);
  }
  std::vector<Guarded*> outputs() { return {&out}; }
};
using GemmFix = GemmFixT<false>;

// out (2, 32, 16) = per group of the 64 tokens, a (32, 64) . b (16, 64)^T; cap = 2 + 2; through
// mxmoe_grouped_mm_mx_kgroups or the tile128 entry point.
template <bool Tile128>
struct KGemmFixT {
  Buffer a = random_bytes({32, 64}, MXMOE_DTYPE_E4M3, 11, 0, 0x7E);
  Buffer as = random_bytes({32, 4}, MXMOE_DTYPE_E8M0, 12, 110, 140);
  Buffer b = random_bytes({16, 64}, MXMOE_DTYPE_E4M3, 13, 0, 0x7E);
  Buffer bs = random_bytes({16, 4}, MXMOE_DTYPE_E8M0, 14, 110, 140);
  Buffer offs_buf = mxtest::offsets({20, 64});
  Guarded out{{2, 32, 16}, MXMOE_DTYPE_F32};
  mxmoe_tensor av = a.view(), asv = as.view(), bv = b.view(), bsv = bs.view(), ov = offs_buf.view(), outv = out.view();
  mxmoe_tensor *pa = &av, *pas = &asv, *pb = &bv, *pbs = &bsv, *poffs = &ov, *pout = &outv;
  mxmoe_status call() {
    return Tile128 ? mxmoe_grouped_mm_tile128_kgroups(pa, pas, pb, pbs, poffs, pout, nullptr, nullptr)
                   : mxmoe_grouped_mm_mx_kgroups(pa, pas, pb, pbs, poffs, pout, nullptr);
  }
  std::vector<Guarded*> outputs() { return {&out}; }
};
using KGemmFix = KGemmFixT<false>;

struct CheckOffsetsFix {
  Buffer offs_buf = mxtest::offsets({0, 10, 10, 64});
  mxmoe_tensor ov = offs_buf.view();
  mxmoe_tensor* poffs = &ov;
  int64_t m = 64;
  mxmoe_status call() { return mxmoe_check_offsets(poffs, m, nullptr); }
  std::vector<Guarded*> outputs() { return {}; }
};

void set_offs(Buffer& b, mxmoe_tensor& v, const std::vector<int32_t>& ends) {
  b = mxtest::offsets(ends);
  v = b.view();
}

}  // namespace

TEST(Validation, Quantize) {
  using F = QuantizeFix;
  expect_all_rejected<F>({
      {"x NULL", [](F& f) { f.px = nullptr; }, "x"},
      {"x e4m3", [](F& f) { f.xv.dtype = MXMOE_DTYPE_E4M3; }, "x"},
      {"x 1-D", [](F& f) { set_shape(f.xv, {64 * 64}); }, "x"},
      {"x 4-D", [](F& f) { set_shape(f.xv, {1, 1, 64, 64}); }, "x"},
      {"x on cuda:0", [](F& f) { f.xv.device = 0; }, "x", "q"},
      {"x bad device code", [](F& f) { f.xv.device = -2; }, "x"},
      {"x last dim 48", [](F& f) { set_shape(f.xv, {64, 48}); }, "x"},
      {"x negative stride", [](F& f) { f.xv.strides[0] = -64; }, "x"},
      {"x data NULL", [](F& f) { f.xv.data = nullptr; }, "x"},
      {"x dtype code 99", [](F& f) { f.xv.dtype = static_cast<mxmoe_dtype>(99); }, "x"},
      {"x 5 dims", [](F& f) { f.xv.ndim = 5; }, "x"},
      {"x rows 48 with 32x1", [](F& f) {
         set_shape(f.xv, {48, 64});
         f.cfg = {32, 1, MXMOE_SCALE_RCEIL};
         f.psc = nullptr;
         set_shape(f.srv, {64, 1});
         f.psr = &f.srv;
       }, "x"},
      {"no data output", [](F& f) { f.pq = nullptr; }, "q"},
      {"no scale output", [](F& f) { f.psc = nullptr; }, "scale_c"},
      {"q bf16", [](F& f) { f.qv.dtype = MXMOE_DTYPE_BF16; }, "q"},
      {"q wrong shape", [](F& f) { set_shape(f.qv, {64, 32}); }, "q"},
      {"q 3-D", [](F& f) { set_shape(f.qv, {1, 64, 64}); }, "q"},
      {"q on cuda:0", [](F& f) { f.qv.device = 0; }, "q"},
      {"q not contiguous", [](F& f) { make_non_contiguous(f.qv); }, "q"},
      {"qt wrong shape", [](F& f) { set_shape(f.qtv, {32, 64}); f.pqt = &f.qtv; }, "qt"},
      {"scale_c e4m3", [](F& f) { f.scv.dtype = MXMOE_DTYPE_E4M3; }, "scale_c"},
      {"scale_c wrong shape", [](F& f) { set_shape(f.scv, {64, 3}); }, "scale_c"},
      {"scale_r with 1x32 blocks", [](F& f) { f.psr = &f.srv; }, "scale_r"},
      {"block 1x16", [](F& f) { f.cfg.block_c = 16; }, "block"},
      {"block 32x32", [](F& f) { f.cfg = {32, 32, MXMOE_SCALE_RCEIL}; }, "block"},
      {"mode 9", [](F& f) { f.cfg.mode = static_cast<mxmoe_scale_mode>(9); }, "mode"},
      {"q overlaps x", [](F& f) { f.xv.data = f.q.body(); f.xv.dtype = MXMOE_DTYPE_BF16; set_shape(f.xv, {32, 64}); set_shape(f.qv, {32, 64}); set_shape(f.scv, {32, 2}); }, "q"},
      {"qt overlaps q", [](F& f) { f.qtv.data = f.q.body(); f.pqt = &f.qtv; }, "qt"},
      {"scale_c overlaps q", [](F& f) { f.scv.data = f.q.body() + 100; }, "scale_c"},
      {"offs f32", [](F& f) { f.ov.dtype = MXMOE_DTYPE_F32; f.poffs = &f.ov; }, "offs"},
      {"offs 2-D", [](F& f) { set_shape(f.ov, {1, 2}); f.poffs = &f.ov; }, "offs"},
      {"offs with 3-D x", [](F& f) {
         set_shape(f.xv, {1, 64, 64});
         set_shape(f.qv, {1, 64, 64});
         set_shape(f.scv, {1, 64, 2});
         f.poffs = &f.ov;
       }, "offs"},
      {"offs on cuda:0", [](F& f) { f.ov.device = 0; f.poffs = &f.ov; }, "offs"},
      {"scale_r wrong capacity", [](F& f) {
         f.cfg = {32, 1, MXMOE_SCALE_RCEIL};
         f.psc = nullptr;
         f.poffs = &f.ov;
         set_shape(f.srv, {64, 2});  // ceil(64/32) + G = 4 with offs
         f.psr = &f.srv;
       }, "scale_r"},
      {"q overlaps offs", [](F& f) { f.poffs = &f.ov; f.ov.data = f.q.body(); }, "q"},
  });
}

TEST(Validation, Dequantize) {
  using F = DequantizeFix;
  expect_all_rejected<F>({
      {"q NULL", [](F& f) { f.pq = nullptr; }, "q"},
      {"q f32", [](F& f) { f.qv.dtype = MXMOE_DTYPE_F32; }, "q"},
      {"q 1-D", [](F& f) { set_shape(f.qv, {4096}); }, "q"},
      {"q on cuda:0", [](F& f) { f.qv.device = 0; }, "q", "scale"},
      {"q last dim 48", [](F& f) { set_shape(f.qv, {64, 48}); }, "q"},
      {"axis 2", [](F& f) { f.axis = 2; }, "axis"},
      {"scale NULL", [](F& f) { f.ps = nullptr; }, "scale"},
      {"scale e4m3", [](F& f) { f.sv.dtype = MXMOE_DTYPE_E4M3; }, "scale"},
      {"scale wrong shape", [](F& f) { set_shape(f.sv, {64, 3}); }, "scale"},
      {"scale for the other axis", [](F& f) { f.axis = 0; set_shape(f.qv, {64, 32}); set_shape(f.outv, {64, 32}); }, "scale"},
      {"scale on cuda:0", [](F& f) { f.sv.device = 0; }, "scale"},
      {"out NULL", [](F& f) { f.pout = nullptr; }, "out"},
      {"out e4m3", [](F& f) { f.outv.dtype = MXMOE_DTYPE_E4M3; }, "out"},
      {"out wrong shape", [](F& f) { set_shape(f.outv, {32, 64}); }, "out"},
      {"out on cuda:0", [](F& f) { f.outv.device = 0; }, "out"},
      {"out not contiguous", [](F& f) { make_non_contiguous(f.outv); }, "out"},
      {"out overlaps q", [](F& f) { f.qv.data = f.out.body(); }, "out"},
      {"out overlaps scale", [](F& f) { f.sv.data = f.out.body() + 1000; }, "out"},
      {"offs i32 2-D", [](F& f) { set_shape(f.ov, {2, 1}); f.poffs = &f.ov; }, "offs"},
      {"offs f32", [](F& f) { f.ov.dtype = MXMOE_DTYPE_F32; f.poffs = &f.ov; }, "offs"},
      {"scale without offs capacity", [](F& f) { f.poffs = &f.ov; }, "scale"},  // needs 2 + G columns
      {"out overlaps offs", [](F& f) {
         f.poffs = &f.ov;
         f.s = random_bytes({64, 4}, MXMOE_DTYPE_E8M0, 3, 110, 140);  // capacity 2 + G
         f.sv = f.s.view();
         f.ov.data = f.out.body();
       }, "out"},
  });
}

namespace {
template <bool To>
std::vector<Case<BlockedFix<To>>> blocked_cases() {
  using F = BlockedFix<To>;
  const char* out = To ? "blocked" : "scale";
  return {
      {"scale NULL", [](F& f) { f.ps = nullptr; }, "scale"},
      {"scale e4m3", [](F& f) { f.sv.dtype = MXMOE_DTYPE_E4M3; }, "scale"},
      {"scale 3-D for WHOLE", [](F& f) { set_shape(f.sv, {1, 100, 6}); }, "scale"},
      {"scale 2-D for PER_EXPERT", [](F& f) { f.kind = MXMOE_BLOCKED_PER_EXPERT; }, "scale"},
      {"scale on cuda:0", [](F& f) { f.sv.device = 0; }, "scale", "blocked"},
      {"scale not contiguous", [](F& f) { set_shape(f.sv, {50, 6}); make_non_contiguous(f.sv); }, "scale"},
      {"kind 9", [](F& f) { f.kind = static_cast<mxmoe_blocked_kind>(9); }, "kind"},
      {"GROUPS_M without offs", [](F& f) { f.kind = MXMOE_BLOCKED_GROUPS_M; }, "offs"},
      {"offs f32", [](F& f) { f.kind = MXMOE_BLOCKED_GROUPS_M; f.ov.dtype = MXMOE_DTYPE_F32; f.poffs = &f.ov; }, "offs"},
      {"offs 2-D", [](F& f) { f.kind = MXMOE_BLOCKED_GROUPS_M; set_shape(f.ov, {1, 2}); f.poffs = &f.ov; }, "offs"},
      {"GROUPS_K scale narrower than G", [](F& f) {
         f.kind = MXMOE_BLOCKED_GROUPS_K;
         set_offs(f.offs_buf, f.ov, std::vector<int32_t>(7, 0));
         f.poffs = &f.ov;
       }, "scale"},
      {"blocked NULL", [](F& f) { f.pb = nullptr; }, "blocked"},
      {"blocked wrong size", [](F& f) { set_shape(f.bv, {100 * 8}); }, "blocked"},
      {"blocked 2-D", [](F& f) { set_shape(f.bv, {128, 8}); }, "blocked"},
      {"blocked u8 as e4m3", [](F& f) { f.bv.dtype = MXMOE_DTYPE_E4M3; }, "blocked"},
      {"blocked on cuda:0", [](F& f) { f.bv.device = 0; }, "blocked"},
      {"blocked not contiguous", [](F& f) {
         // Every other byte of a buffer twice the size.
         if (To) {
           f.out_blocked = Guarded({2 * 128 * 8}, MXMOE_DTYPE_E8M0);
           f.bv = f.out_blocked.view();
         } else {
           f.in_blocked = random_bytes({2 * 128 * 8}, MXMOE_DTYPE_E8M0, 5, 1, 254);
           f.bv = f.in_blocked.view();
         }
         f.bv.shape[0] = 128 * 8;
         f.bv.strides[0] = 2;
       }, "blocked"},
      {"GROUPS_M size for G", [](F& f) { f.kind = MXMOE_BLOCKED_GROUPS_M; f.poffs = &f.ov; }, "blocked"},
      {"output overlaps the input", [](F& f) {
         if (To) {
           f.sv.data = f.out_blocked.body();
         } else {
           f.sv.data = f.in_blocked.bytes.data();
         }
       }, "blocked"},
      {"output overlaps offs", [](F& f) {
         f.kind = MXMOE_BLOCKED_GROUPS_M;
         f.poffs = &f.ov;
         if (To) {
           f.out_blocked = Guarded({(100 + 256) * 8}, MXMOE_DTYPE_E8M0);
           f.bv = f.out_blocked.view();
           f.ov.data = f.out_blocked.body();
         } else {
           f.in_blocked = random_bytes({(100 + 256) * 8}, MXMOE_DTYPE_E8M0, 5, 1, 254);
           f.bv = f.in_blocked.view();
           f.ov.data = f.out_scale.body();
         }
       }, out},
  };
}
}  // namespace

TEST(Validation, ScalesToBlocked) { expect_all_rejected<BlockedFix<true>>(blocked_cases<true>()); }
TEST(Validation, ScalesFromBlocked) { expect_all_rejected<BlockedFix<false>>(blocked_cases<false>()); }

template <typename F>
std::vector<Case<F>> gemm_cases() {
  return {
      {"a NULL", [](F& f) { f.pa = nullptr; }, "a"},
      {"a bf16", [](F& f) { f.av.dtype = MXMOE_DTYPE_BF16; }, "a"},
      {"a 3-D", [](F& f) { set_shape(f.av, {1, 64, 64}); }, "a"},
      {"a on cuda:0", [](F& f) { f.av.device = 0; }, "a", "b"},
      {"a K = 48", [](F& f) { set_shape(f.av, {64, 48}); }, "a"},
      {"a negative size", [](F& f) { f.av.shape[0] = -64; }, "a"},
      {"a bad device code", [](F& f) { f.av.device = -3; }, "a"},
      {"b NULL", [](F& f) { f.pb = nullptr; }, "b"},
      {"b e8m0", [](F& f) { f.bv.dtype = MXMOE_DTYPE_E8M0; }, "b"},
      {"b 2-D", [](F& f) { set_shape(f.bv, {64, 64}); }, "b"},
      {"b K mismatch", [](F& f) { set_shape(f.bv, {2, 64, 32}); }, "b"},
      {"b on cuda:0", [](F& f) { f.bv.device = 0; }, "b"},
      {"a_scale NULL", [](F& f) { f.pas = nullptr; }, "a_scale"},
      {"a_scale e4m3", [](F& f) { f.asv.dtype = MXMOE_DTYPE_E4M3; }, "a_scale"},
      {"a_scale wrong shape", [](F& f) { set_shape(f.asv, {64, 1}); }, "a_scale"},
      {"a_scale on cuda:0", [](F& f) { f.asv.device = 0; }, "a_scale"},
      {"b_scale NULL", [](F& f) { f.pbs = nullptr; }, "b_scale"},
      {"b_scale wrong shape", [](F& f) { set_shape(f.bsv, {2, 32, 1}); }, "b_scale"},
      {"b_scale i32", [](F& f) { f.bsv.dtype = MXMOE_DTYPE_I32; }, "b_scale"},
      {"offs NULL", [](F& f) { f.poffs = nullptr; }, "offs"},
      {"offs f64", [](F& f) { f.ov.dtype = MXMOE_DTYPE_F64; }, "offs"},
      {"offs G mismatch", [](F& f) { set_offs(f.offs_buf, f.ov, {10, 20, 64}); }, "offs"},
      {"offs 2-D", [](F& f) { set_shape(f.ov, {2, 1}); }, "offs"},
      {"bias e4m3", [](F& f) { f.biasv.dtype = MXMOE_DTYPE_E4M3; }, "bias"},
      {"bias wrong shape", [](F& f) { set_shape(f.biasv, {32, 2}); }, "bias"},
      {"bias on cuda:0", [](F& f) { f.biasv.device = 0; }, "bias"},
      {"out NULL", [](F& f) { f.pout = nullptr; }, "out"},
      {"out e4m3", [](F& f) { f.outv.dtype = MXMOE_DTYPE_E4M3; }, "out"},
      {"out wrong shape", [](F& f) { set_shape(f.outv, {32, 32}); }, "out"},
      {"out not contiguous", [](F& f) { set_shape(f.outv, {32, 32}); make_non_contiguous(f.outv); set_shape(f.av, {32, 64}); set_shape(f.asv, {32, 2}); }, "out"},
      {"out on cuda:0", [](F& f) { f.outv.device = 0; }, "out"},
      {"out overlaps a", [](F& f) { f.av.data = f.out.body(); }, "out"},
      {"out overlaps b_scale", [](F& f) { f.bsv.data = f.out.body() + 4000; }, "out"},
      {"out overlaps offs", [](F& f) { f.ov.data = f.out.body() + 8; }, "out"},
      {"out overlaps bias", [](F& f) { f.biasv.data = f.out.body(); }, "out"},
  };
}

TEST(Validation, GroupedMM) { expect_all_rejected<GemmFixT<false>>(gemm_cases<GemmFixT<false>>()); }
TEST(Validation, GroupedMMTile128) { expect_all_rejected<GemmFixT<true>>(gemm_cases<GemmFixT<true>>()); }

template <typename F>
std::vector<Case<F>> kgemm_cases() {
  return {
      {"a NULL", [](F& f) { f.pa = nullptr; }, "a"},
      {"a f32", [](F& f) { f.av.dtype = MXMOE_DTYPE_F32; }, "a"},
      {"a 3-D", [](F& f) { set_shape(f.av, {1, 32, 64}); }, "a"},
      {"a on cuda:0", [](F& f) { f.av.device = 0; }, "a", "b"},
      {"b NULL", [](F& f) { f.pb = nullptr; }, "b"},
      {"b 3-D", [](F& f) { set_shape(f.bv, {1, 16, 64}); }, "b"},
      {"b token mismatch", [](F& f) { set_shape(f.bv, {32, 32}); }, "b"},
      {"b on cuda:0", [](F& f) { f.bv.device = 0; }, "b"},
      {"offs NULL", [](F& f) { f.poffs = nullptr; }, "offs"},
      {"offs bf16", [](F& f) { f.ov.dtype = MXMOE_DTYPE_BF16; }, "offs"},
      {"a_scale NULL", [](F& f) { f.pas = nullptr; }, "a_scale"},
      {"a_scale without group capacity", [](F& f) { set_shape(f.asv, {32, 2}); }, "a_scale"},
      {"a_scale e4m3", [](F& f) { f.asv.dtype = MXMOE_DTYPE_E4M3; }, "a_scale"},
      {"b_scale NULL", [](F& f) { f.pbs = nullptr; }, "b_scale"},
      {"b_scale wrong rows", [](F& f) { set_shape(f.bsv, {32, 4}); }, "b_scale"},
      {"b_scale capacity for another G", [](F& f) {
         set_offs(f.offs_buf, f.ov, {20, 30, 64});
         f.as = random_bytes({32, 5}, MXMOE_DTYPE_E8M0, 12, 110, 140);
         f.asv = f.as.view();
       }, "b_scale"},
      {"out NULL", [](F& f) { f.pout = nullptr; }, "out"},
      {"out e8m0", [](F& f) { f.outv.dtype = MXMOE_DTYPE_E8M0; }, "out"},
      {"out 2-D", [](F& f) { set_shape(f.outv, {32, 16}); }, "out"},
      {"out wrong G", [](F& f) { set_shape(f.outv, {1, 32, 16}); }, "out"},
      {"out on cuda:0", [](F& f) { f.outv.device = 0; }, "out"},
      {"out not contiguous", [](F& f) { make_non_contiguous(f.outv); }, "out"},
      {"out overlaps b", [](F& f) { f.bv.data = f.out.body(); }, "out"},
      {"out overlaps a_scale", [](F& f) { f.asv.data = f.out.body() + 100; }, "out"},
      {"out overlaps offs", [](F& f) { f.ov.data = f.out.body(); }, "out"},
  };
}

TEST(Validation, GroupedMMKGroups) { expect_all_rejected<KGemmFixT<false>>(kgemm_cases<KGemmFixT<false>>()); }
TEST(Validation, GroupedMMTile128KGroups) {
  expect_all_rejected<KGemmFixT<true>>(kgemm_cases<KGemmFixT<true>>());
}

// The wgrad's workspace query for given operands checks them as the call does: host operands need no
// workspace (0); each case the call rejects gives -1 with a message naming the same argument.
TEST(Validation, GroupedMMTile128KGroupsWorkspaceFor) {
  using F = KGemmFixT<true>;
  for (int32_t in_place : {0, 1}) {
    SCOPED_TRACE(in_place);
    auto query = [in_place](F& f) {
      return mxmoe_grouped_mm_tile128_kgroups_workspace_size_for(f.pa, f.pas, f.pb, f.pbs, f.poffs, f.pout,
                                                                 in_place);
    };
    {
      F ok;
      EXPECT_EQ(query(ok), 0) << mxmoe_last_error();
    }
    for (const auto& c : kgemm_cases<F>()) {
      SCOPED_TRACE(c.what);
      const std::string arg = mxmoe_has_cuda() && c.cuda_arg ? *c.cuda_arg : c.arg;
      if (arg.empty()) continue;
      F f;
      c.mutate(f);
      EXPECT_EQ(query(f), -1);
      const std::string msg = mxmoe_last_error();
      EXPECT_TRUE(starts_with_arg(msg, arg)) << "message should name '" << arg << "': " << msg;
    }
  }
  F f;
  EXPECT_EQ(mxmoe_grouped_mm_tile128_kgroups_workspace_size_for(f.pa, f.pas, f.pb, f.pbs, f.poffs, f.pout, 2), -1);
  EXPECT_TRUE(starts_with_arg(mxmoe_last_error(), "in_place")) << mxmoe_last_error();
}

// The in-place wgrad checks its arguments as the staged one does (on the host it is the same call).
struct KGemmInPlaceFix : KGemmFixT<true> {
  mxmoe_status call() {
    return mxmoe_grouped_mm_tile128_kgroups_in_place(pa, pas, pb, pbs, poffs, pout, nullptr, nullptr);
  }
};
TEST(Validation, GroupedMMTile128KGroupsInPlace) {
  expect_all_rejected<KGemmInPlaceFix>(kgemm_cases<KGemmInPlaceFix>());
}

TEST(Validation, CheckOffsets) {
  using F = CheckOffsetsFix;
  expect_all_rejected<F>({
      {"offs NULL", [](F& f) { f.poffs = nullptr; }, "offs"},
      {"offs i32 as f32", [](F& f) { f.ov.dtype = MXMOE_DTYPE_F32; }, "offs"},
      {"offs 2-D", [](F& f) { set_shape(f.ov, {2, 2}); }, "offs"},
      {"offs on cuda:0", [](F& f) { f.ov.device = 0; }, "offs", ""},
      {"decreasing", [](F& f) { set_offs(f.offs_buf, f.ov, {0, 10, 9, 64}); }, "offs"},
      {"negative first", [](F& f) { set_offs(f.offs_buf, f.ov, {-1, 10}); }, "offs"},
      {"beyond M", [](F& f) { set_offs(f.offs_buf, f.ov, {10, 65}); }, "offs"},
      {"M smaller", [](F& f) { f.m = 63; }, "offs"},
  });
  // Empty offsets and empty groups are fine.
  Buffer empty = mxtest::offsets({});
  mxmoe_tensor ev = empty.view();
  EXPECT_EQ(mxmoe_check_offsets(&ev, 0, nullptr), MXMOE_OK) << mxmoe_last_error();
}

// The message names the first offending offset with expected vs actual.
TEST(Validation, CheckOffsetsMessage) {
  Buffer o = mxtest::offsets({0, 10, 7});
  mxmoe_tensor v = o.view();
  ASSERT_NE(mxmoe_check_offsets(&v, 64, nullptr), MXMOE_OK);
  const std::string msg = mxmoe_last_error();
  EXPECT_NE(msg.find("offs[2] = 7"), std::string::npos) << msg;
  Buffer big = mxtest::offsets({10, 100});
  mxmoe_tensor bv = big.view();
  ASSERT_NE(mxmoe_check_offsets(&bv, 64, nullptr), MXMOE_OK);
  const std::string msg2 = mxmoe_last_error();
  EXPECT_NE(msg2.find("64"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("offs[1] = 100"), std::string::npos) << msg2;
}

// ---- bad offsets reach the kernels: clamped, never out of bounds ---------------------------------

namespace {
// Bad offset patterns for m rows and the clamped equivalents (end_g = min(m, max(end_{g-1}, o))).
struct BadOffs {
  std::vector<int32_t> bad, clamped;
};
std::vector<BadOffs> bad_offsets(int32_t m) {
  return {
      {{40, 10, 1000}, {40, 40, m}},    // decreasing, then far beyond M
      {{-5, 20, m + 1}, {0, 20, m}},    // negative, then just beyond M
      {{m + 50, 3}, {m, m}},            // the first group takes everything
      {{-100, -1}, {0, 0}},             // nothing in any group
  };
}
}  // namespace

TEST(Validation, GroupedMMBadOffsetsClampInBounds) {
  for (const auto& o : bad_offsets(64)) {
    GemmFix bad, good;
    bad.offs_buf = mxtest::offsets(o.bad);
    bad.ov = bad.offs_buf.view();
    good.offs_buf = mxtest::offsets(o.clamped);
    good.ov = good.offs_buf.view();
    // The fixture has 2 experts; give both calls as many as there are offsets.
    for (GemmFix* f : {&bad, &good}) {
      const int64_t G = static_cast<int64_t>(o.bad.size());
      f->b = random_bytes({G, 32, 64}, MXMOE_DTYPE_E4M3, 8, 0, 0x7E);
      f->bs = random_bytes({G, 32, 2}, MXMOE_DTYPE_E8M0, 9, 110, 140);
      f->bias = mxtest::random_input({G, 32}, MXMOE_DTYPE_F32, 10);
      f->bv = f->b.view();
      f->bsv = f->bs.view();
      f->biasv = f->bias.view();
    }
    ASSERT_EQ(bad.call(), MXMOE_OK) << mxmoe_last_error();
    ASSERT_EQ(good.call(), MXMOE_OK) << mxmoe_last_error();
    EXPECT_TRUE(bad.out.guards_intact());
    EXPECT_EQ(bad.out.bytes, good.out.bytes);
  }
}

TEST(Validation, GroupedMMKGroupsBadOffsetsClampInBounds) {
  for (const auto& o : bad_offsets(64)) {
    const int64_t G = static_cast<int64_t>(o.bad.size()), cap = 2 + G;
    KGemmFix bad, good;
    for (KGemmFix* f : {&bad, &good}) {
      f->offs_buf = mxtest::offsets(f == &bad ? o.bad : o.clamped);
      f->ov = f->offs_buf.view();
      f->as = random_bytes({32, cap}, MXMOE_DTYPE_E8M0, 12, 110, 140);
      f->bs = random_bytes({16, cap}, MXMOE_DTYPE_E8M0, 14, 110, 140);
      f->asv = f->as.view();
      f->bsv = f->bs.view();
      f->out = Guarded({G, 32, 16}, MXMOE_DTYPE_F32);
      f->outv = f->out.view();
    }
    ASSERT_EQ(bad.call(), MXMOE_OK) << mxmoe_last_error();
    ASSERT_EQ(good.call(), MXMOE_OK) << mxmoe_last_error();
    EXPECT_TRUE(bad.out.guards_intact());
    EXPECT_EQ(bad.out.bytes, good.out.bytes);
  }
}

// Quantize and dequantize with groups along R: every output guarded. (Implemented elsewhere; a
// build whose quantizer is still a stub skips.)
TEST(Validation, QuantizeBadOffsetsClampInBounds) {
  for (const auto& o : bad_offsets(64)) {
    const int64_t G = static_cast<int64_t>(o.bad.size());
    QuantizeFix bad, good;
    for (QuantizeFix* f : {&bad, &good}) {
      f->offs_buf = mxtest::offsets(f == &bad ? o.bad : o.clamped);
      f->ov = f->offs_buf.view();
      f->poffs = &f->ov;
      f->cfg = {32, 1, MXMOE_SCALE_RCEIL};
      f->sr = Guarded({64, 2 + G}, MXMOE_DTYPE_E8M0);
      f->srv = f->sr.view();
      f->psr = &f->srv;
      f->psc = nullptr;
      f->pqt = &f->qtv;
    }
    const mxmoe_status st = bad.call();
    if (st == MXMOE_ERR_UNSUPPORTED) GTEST_SKIP() << mxmoe_last_error();
    ASSERT_EQ(st, MXMOE_OK) << mxmoe_last_error();
    ASSERT_EQ(good.call(), MXMOE_OK) << mxmoe_last_error();
    for (Guarded* g : {&bad.q, &bad.qt, &bad.sr}) EXPECT_TRUE(g->guards_intact());
    EXPECT_EQ(bad.q.bytes, good.q.bytes);
    EXPECT_EQ(bad.qt.bytes, good.qt.bytes);
    EXPECT_EQ(bad.sr.bytes, good.sr.bytes);

    DequantizeFix dbad, dgood;
    for (DequantizeFix* f : {&dbad, &dgood}) {
      f->offs_buf = mxtest::offsets(f == &dbad ? o.bad : o.clamped);
      f->ov = f->offs_buf.view();
      f->poffs = &f->ov;
      f->axis = 0;  // blocks along R, scale (C, 2 + G)
      f->s = random_bytes({64, 2 + G}, MXMOE_DTYPE_E8M0, 3, 110, 140);
      f->sv = f->s.view();
    }
    const mxmoe_status dst = dbad.call();
    if (dst == MXMOE_ERR_UNSUPPORTED) GTEST_SKIP() << mxmoe_last_error();
    ASSERT_EQ(dst, MXMOE_OK) << mxmoe_last_error();
    ASSERT_EQ(dgood.call(), MXMOE_OK) << mxmoe_last_error();
    EXPECT_TRUE(dbad.out.guards_intact());
    EXPECT_EQ(dbad.out.bytes, dgood.out.bytes);
  }
}

TEST(Validation, BlockedBadOffsetsClampInBounds) {
  for (const auto& o : bad_offsets(100)) {
    const int64_t G = static_cast<int64_t>(o.bad.size());
    for (bool to : {true, false}) {
      SCOPED_TRACE(to ? "to_blocked" : "from_blocked");
      Buffer scale = random_bytes({100, 6}, MXMOE_DTYPE_E8M0, 15, 1, 254);
      const int64_t size = mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_M, 100, 6, G);
      Buffer blocked = random_bytes({size}, MXMOE_DTYPE_E8M0, 16, 1, 254);
      Guarded out_bad(to ? std::vector<int64_t>{size} : std::vector<int64_t>{100, 6}, MXMOE_DTYPE_E8M0);
      Guarded out_good = out_bad;
      Buffer ob = mxtest::offsets(o.bad), og = mxtest::offsets(o.clamped);
      mxmoe_tensor sv = scale.view(), bv = blocked.view(), obv = ob.view(), ogv = og.view();
      mxmoe_tensor vb = out_bad.view(), vg = out_good.view();
      if (to) {
        ASSERT_EQ(mxmoe_scales_to_blocked(&sv, MXMOE_BLOCKED_GROUPS_M, &obv, &vb, nullptr), MXMOE_OK) << mxmoe_last_error();
        ASSERT_EQ(mxmoe_scales_to_blocked(&sv, MXMOE_BLOCKED_GROUPS_M, &ogv, &vg, nullptr), MXMOE_OK) << mxmoe_last_error();
      } else {
        ASSERT_EQ(mxmoe_scales_from_blocked(&bv, MXMOE_BLOCKED_GROUPS_M, &obv, &vb, nullptr), MXMOE_OK) << mxmoe_last_error();
        ASSERT_EQ(mxmoe_scales_from_blocked(&bv, MXMOE_BLOCKED_GROUPS_M, &ogv, &vg, nullptr), MXMOE_OK) << mxmoe_last_error();
      }
      EXPECT_TRUE(out_bad.guards_intact());
      EXPECT_EQ(out_bad.bytes, out_good.bytes);
    }
  }
}

// The CUDA-graph entry points' argument checks (the GPU behaviour: CudaQuantize.FusedIfUnderCapture).
TEST(Validation, CaptureEntryPoints) {
  EXPECT_EQ(mxmoe_capture_id(nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("id: expected a pointer, got NULL"), std::string::npos)
      << mxmoe_last_error();
  Buffer x({64, 64}, MXMOE_DTYPE_BF16), q({64, 64}, MXMOE_DTYPE_E4M3), s({64, 2}, MXMOE_DTYPE_E8M0);
  Buffer flag({1}, MXMOE_DTYPE_I32), fbad({1}, MXMOE_DTYPE_F32);
  mxmoe_tensor xv = x.view(), qv = q.view(), sv = s.view(), fv = flag.view(), fb = fbad.view();
  const mxmoe_fused_config cfg{32, 0, 0, MXMOE_SCALE_RCEIL};
  mxmoe_fused_side side{&qv, nullptr, &sv, nullptr, nullptr, nullptr};
  EXPECT_EQ(mxmoe_quantize_fused_if(nullptr, &xv, nullptr, cfg, &side, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("flag"), std::string::npos) << mxmoe_last_error();
  EXPECT_EQ(mxmoe_quantize_fused_if(&fb, &xv, nullptr, cfg, &side, nullptr, nullptr), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("flag"), std::string::npos) << mxmoe_last_error();
  // A CPU x: there is no graph to record into.
  EXPECT_EQ(mxmoe_quantize_fused_if(&fv, &xv, nullptr, cfg, &side, nullptr, nullptr), MXMOE_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mxmoe_last_error()).find("x: expected a CUDA tensor"), std::string::npos)
      << mxmoe_last_error();
  EXPECT_EQ(std::vector<uint8_t>(q.bytes), std::vector<uint8_t>(64 * 64, 0));  // nothing written
}
