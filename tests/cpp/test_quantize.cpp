// mxmoe_quantize / mxmoe_dequantize against a deliberately simple model written here: blocks and
// groups enumerated with plain loops (groups with their own copy of the clamping rule), every byte
// from scalar_reference.hpp (ref::scale_byte, ref::quantize, ref::dequantize). No library
// internals are used on the expected side.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <time.h>

#include "scalar_reference.hpp"
#include "test_util.hpp"

using mxtest::Buffer;

namespace {

const mxmoe_scale_mode kModes[] = {MXMOE_SCALE_RCEIL, MXMOE_SCALE_FLOOR, MXMOE_SCALE_CEIL,
                                   MXMOE_SCALE_EVEN};
const mxmoe_dtype kInputDtypes[] = {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32};
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

struct Block {
  int r, c;
  bool along_c() const { return c > 1; }
  bool along_r() const { return r > 1; }
};
const Block kBlocks[] = {{1, 32}, {1, 128}, {32, 1}, {128, 1}, {128, 128}};

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

const char* mode_name(mxmoe_scale_mode m) {
  switch (m) {
    case MXMOE_SCALE_RCEIL: return "RCEIL";
    case MXMOE_SCALE_FLOOR: return "FLOOR";
    case MXMOE_SCALE_CEIL: return "CEIL";
    case MXMOE_SCALE_EVEN: return "EVEN";
    default: break;  // invalid codes fall through to the caller's rejection
  }
  return "?";
}

std::string describe(Block blk, mxmoe_scale_mode mode, mxmoe_dtype dtype) {
  return "block " + std::to_string(blk.r) + "x" + std::to_string(blk.c) + " " + mode_name(mode) +
         (dtype == MXMOE_DTYPE_BF16 ? " bf16" : " f32");
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

// A (B, I, J) view (2D views have B = 1) over storage it owns, with any strides.
struct View {
  Buffer storage;
  mxmoe_tensor view{};
  int64_t B = 1, I = 0, J = 0;
  int64_t sb = 0, si = 0, sj = 0;

  int64_t offset(int64_t b, int64_t i, int64_t j) const { return b * sb + i * si + j * sj; }
  float value(int64_t b, int64_t i, int64_t j) const { return storage.get(offset(b, i, j)); }
  uint8_t byte(int64_t b, int64_t i, int64_t j) const { return storage.u8(offset(b, i, j)); }
};

View make_view(Buffer storage, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  View v;
  v.storage = std::move(storage);
  v.view = v.storage.view();
  const int nd = static_cast<int>(shape.size());
  v.view.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    v.view.shape[d] = shape[d];
    v.view.strides[d] = strides[d];
  }
  v.B = nd == 3 ? shape[0] : 1;
  v.I = shape[nd - 2];
  v.J = shape[nd - 1];
  v.sb = nd == 3 ? strides[0] : 0;
  v.si = strides[nd - 2];
  v.sj = strides[nd - 1];
  return v;
}

View contiguous(Buffer b) {
  const std::vector<int64_t> shape = b.shape;
  return make_view(std::move(b), shape, contiguous_strides(shape));
}

View random_x(const std::vector<int64_t>& shape, mxmoe_dtype dtype, uint32_t seed, float spread_log2 = 20.f) {
  return contiguous(mxtest::random_input(shape, dtype, seed, spread_log2));
}

// x as a transposed view: storage (.., C, R), view (.., R, C).
View transposed_x(int64_t B, int64_t R, int64_t C, bool batched, mxmoe_dtype dtype, uint32_t seed) {
  std::vector<int64_t> storage_shape = {C, R}, shape = {R, C}, strides = {1, R};
  if (batched) {
    storage_shape.insert(storage_shape.begin(), B);
    shape.insert(shape.begin(), B);
    strides.insert(strides.begin(), R * C);
  }
  return make_view(mxtest::random_input(storage_shape, dtype, seed), shape, strides);
}

// ---- The model -----------------------------------------------------------------------------

// A group of rows [start, end) whose 32-runs start at scale index first_run.
struct RefGroup {
  int64_t start, end, first_run;
};

// mxmoe.h's groups: end_g = min(n, max(end_{g-1}, offs[g])) (bad offsets become empty groups or
// are cut at n); group g's runs start after ceil(size_h/32) runs of every earlier group h.
// Without offs: a single group of everything.
std::vector<RefGroup> ref_groups(const std::vector<int32_t>* offs, int64_t n) {
  if (offs == nullptr) return {{0, n, 0}};
  std::vector<RefGroup> groups;
  int64_t prev = 0, runs = 0;
  for (int32_t o : *offs) {
    int64_t end = o < prev ? prev : o;
    if (end > n) end = n;
    groups.push_back({prev, end, runs});
    runs += cdiv(end - prev, 32);
    prev = end;
  }
  return groups;
}

struct Expected {
  std::vector<uint8_t> q;        // (B, R, C)
  std::vector<uint8_t> scale_c;  // (B, R, C/32), blocks along C only
  std::vector<uint8_t> scale_r;  // (B, C, n_r), blocks along R only
  int64_t n_r = 0;
};

// Everything starts at 0 (rows outside groups, unused scale entries); each block then writes its
// elements and the scale entries of the 32-runs it covers.
Expected ref_quantize(const View& x, Block blk, mxmoe_scale_mode mode, const std::vector<int32_t>* offs) {
  const int64_t B = x.B, R = x.I, C = x.J;
  Expected e;
  // Blocks along C ignore offs: every row is quantized.
  const std::vector<RefGroup> groups = ref_groups(blk.along_r() ? offs : nullptr, R);
  // scale_r exists only with whole 32-runs along R or with groups (128x128 through scale_c alone
  // allows any R).
  const bool with_scale_r = blk.along_r() && (offs || R % 32 == 0);
  if (with_scale_r) e.n_r = offs ? cdiv(R, 32) + static_cast<int64_t>(offs->size()) : R / 32;
  e.q.assign(B * R * C, 0);
  if (blk.along_c()) e.scale_c.assign(B * R * (C / 32), 0);
  if (with_scale_r) e.scale_r.assign(B * C * e.n_r, 0);
  for (int64_t b = 0; b < B; ++b)
    for (const RefGroup& g : groups)
      for (int64_t r0 = g.start; r0 < g.end; r0 += blk.r) {
        const int64_t r1 = std::min<int64_t>(r0 + blk.r, g.end);
        for (int64_t c0 = 0; c0 < C; c0 += blk.c) {
          const int64_t c1 = std::min<int64_t>(c0 + blk.c, C);
          float amax = 0.f;
          bool nan = false;
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c) {
              const float v = x.value(b, r, c);
              if (std::isnan(v)) nan = true;
              else amax = std::max(amax, std::fabs(v));
            }
          const uint8_t s = ref::scale_byte(nan ? kNan : amax, mode);
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c) e.q[(b * R + r) * C + c] = ref::quantize(x.value(b, r, c), s);
          if (blk.along_c())
            for (int64_t r = r0; r < r1; ++r)
              for (int64_t j = c0 / 32; j < cdiv(c1, 32); ++j) e.scale_c[(b * R + r) * (C / 32) + j] = s;
          if (with_scale_r)
            for (int64_t c = c0; c < c1; ++c)
              for (int64_t i = (r0 - g.start) / 32; i < cdiv(r1 - g.start, 32); ++i)
                e.scale_r[(b * C + c) * e.n_r + g.first_run + i] = s;
        }
      }
  return e;
}

std::vector<uint8_t> transpose(const std::vector<uint8_t>& a, int64_t B, int64_t I, int64_t J) {
  std::vector<uint8_t> t(a.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < I; ++i)
      for (int64_t j = 0; j < J; ++j) t[(b * J + j) * I + i] = a[(b * I + i) * J + j];
  return t;
}

// ---- Running the library -------------------------------------------------------------------

// A contiguous output inside a larger allocation: the guard bytes on both sides catch writes out
// of bounds.
struct Guarded {
  static constexpr int64_t kGuard = 64;
  std::vector<int64_t> shape;
  mxmoe_dtype dtype;
  uint8_t fill;
  std::vector<uint8_t> bytes;

  Guarded(std::vector<int64_t> s, mxmoe_dtype d, uint8_t f) : shape(std::move(s)), dtype(d), fill(f) {
    int64_t n = 1;
    for (auto v : shape) n *= v;
    bytes.assign(static_cast<size_t>(n) * mxtest::elem_size(d) + 2 * kGuard, f);
  }
  mxmoe_tensor view() {
    mxmoe_tensor t{};
    t.data = bytes.data() + kGuard;
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(shape.size());
    const auto strides = contiguous_strides(shape);
    for (int d = 0; d < t.ndim; ++d) {
      t.shape[d] = shape[d];
      t.strides[d] = strides[d];
    }
    t.device = -1;
    return t;
  }
  std::vector<uint8_t> contents() const { return {bytes.begin() + kGuard, bytes.end() - kGuard}; }
  bool guards_intact() const {
    for (int64_t i = 0; i < kGuard; ++i)
      if (bytes[i] != fill || bytes[bytes.size() - 1 - i] != fill) return false;
    return true;
  }
};

struct Request {
  bool q = true, qt = true, scale_c = true, scale_r = true;  // scale_* only where the block allows
};

struct Got {
  std::vector<uint8_t> q, qt, scale_c, scale_r;
};

std::vector<int64_t> batched(const View& x, std::vector<int64_t> tail) {
  if (x.view.ndim == 3) tail.insert(tail.begin(), x.B);
  return tail;
}

// Runs mxmoe_quantize with every output pre-filled with `fill`.
Got quantize_once(const View& x, Block blk, mxmoe_scale_mode mode, const std::vector<int32_t>* offs,
                  Request want, int64_t n_r, uint8_t fill) {
  const int64_t R = x.I, C = x.J;
  Guarded q(batched(x, {R, C}), MXMOE_DTYPE_E4M3, fill), qt(batched(x, {C, R}), MXMOE_DTYPE_E4M3, fill),
      sc(batched(x, {R, C / 32}), MXMOE_DTYPE_E8M0, fill), sr(batched(x, {C, n_r}), MXMOE_DTYPE_E8M0, fill);
  mxmoe_tensor qv = q.view(), qtv = qt.view(), scv = sc.view(), srv = sr.view();
  Buffer offs_buf;
  mxmoe_tensor offs_view{};
  if (offs) {
    offs_buf = mxtest::offsets(*offs);
    offs_view = offs_buf.view();
  }
  const bool want_sc = want.scale_c && blk.along_c(), want_sr = want.scale_r && blk.along_r();
  const mxmoe_status st = mxmoe_quantize(&x.view, offs ? &offs_view : nullptr, {blk.r, blk.c, mode},
                                         want.q ? &qv : nullptr, want.qt ? &qtv : nullptr,
                                         want_sc ? &scv : nullptr, want_sr ? &srv : nullptr, nullptr);
  EXPECT_EQ(st, MXMOE_OK) << mxmoe_last_error();
  EXPECT_TRUE(q.guards_intact() && qt.guards_intact() && sc.guards_intact() && sr.guards_intact())
      << "a write out of bounds";
  Got g;
  if (want.q) g.q = q.contents();
  if (want.qt) g.qt = qt.contents();
  if (want_sc) g.scale_c = sc.contents();
  if (want_sr) g.scale_r = sr.contents();
  return g;
}

// Two runs with different fills, so a byte the library never writes cannot match by luck.
Got quantize(const View& x, Block blk, mxmoe_scale_mode mode, const std::vector<int32_t>* offs,
             Request want, int64_t n_r) {
  Got a = quantize_once(x, blk, mode, offs, want, n_r, 0x5A);
  Got b = quantize_once(x, blk, mode, offs, want, n_r, 0xA5);
  EXPECT_TRUE(a.q == b.q && a.qt == b.qt && a.scale_c == b.scale_c && a.scale_r == b.scale_r)
      << "some output bytes are left unwritten";
  return a;
}

int64_t n_r_for(const View& x, Block blk, const std::vector<int32_t>* offs) {
  if (!blk.along_r()) return 0;
  return offs ? cdiv(x.I, 32) + static_cast<int64_t>(offs->size()) : x.I / 32;
}

Got quantize(const View& x, Block blk, mxmoe_scale_mode mode, const std::vector<int32_t>* offs = nullptr,
             Request want = {}) {
  return quantize(x, blk, mode, offs, want, n_r_for(x, blk, offs));
}

// Byte arrays (B, I, J) equal; on failure names the first differing index and the count.
testing::AssertionResult same_bytes(const char* what, const std::vector<uint8_t>& got,
                                    const std::vector<uint8_t>& want, int64_t I, int64_t J) {
  if (got.size() != want.size())
    return testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  int64_t bad = 0, first = -1;
  for (size_t k = 0; k < got.size(); ++k)
    if (got[k] != want[k]) {
      if (first < 0) first = static_cast<int64_t>(k);
      ++bad;
    }
  if (bad == 0) return testing::AssertionSuccess();
  const int64_t b = first / (I * J), i = first / J % I, j = first % J;
  return testing::AssertionFailure() << what << ": " << bad << " bytes differ, first at [" << b << ", " << i
                                     << ", " << j << "]: got " << int(got[first]) << ", want "
                                     << int(want[first]);
}

// The library's outputs against the model, byte for byte (qt against the model's q transposed).
void check_quantize(const View& x, Block blk, mxmoe_scale_mode mode,
                    const std::vector<int32_t>* offs = nullptr, Request want = {}) {
  const Expected e = ref_quantize(x, blk, mode, offs);
  const Got got = quantize(x, blk, mode, offs, want, e.n_r);
  const int64_t B = x.B, R = x.I, C = x.J;
  if (want.q) {
    EXPECT_TRUE(same_bytes("q", got.q, e.q, R, C));
  }
  if (want.qt) {
    EXPECT_TRUE(same_bytes("qt", got.qt, transpose(e.q, B, R, C), C, R));
  }
  if (want.scale_c && blk.along_c()) {
    EXPECT_TRUE(same_bytes("scale_c", got.scale_c, e.scale_c, R, C / 32));
  }
  if (want.scale_r && blk.along_r()) {
    EXPECT_TRUE(same_bytes("scale_r", got.scale_r, e.scale_r, C, e.n_r));
  }
}

}  // namespace

// ---- Quantize: random inputs against the model ------------------------------------------------

// R = 160 and C = 288 leave a partial 128-block at both edges (1x128, 128x1 and 128x128).
TEST(QuantizeRandom, EveryBlockModeAndDtype) {
  for (mxmoe_dtype dtype : kInputDtypes) {
    const View x = random_x({160, 288}, dtype, dtype == MXMOE_DTYPE_BF16 ? 1 : 2);
    for (Block blk : kBlocks)
      for (mxmoe_scale_mode mode : kModes) {
        SCOPED_TRACE(describe(blk, mode, dtype));
        check_quantize(x, blk, mode);
      }
  }
}

// Magnitudes over about 250 binades: subnormal inputs, clamped scale bytes, huge blocks.
TEST(QuantizeRandom, WideExponentRange) {
  for (mxmoe_dtype dtype : kInputDtypes) {
    const View x = random_x({64, 160}, dtype, 7, 125.f);
    for (Block blk : kBlocks)
      for (mxmoe_scale_mode mode : kModes) {
        SCOPED_TRACE(describe(blk, mode, dtype));
        check_quantize(x, blk, mode);
      }
  }
}

// Any output may be absent; the present ones are the same bytes.
TEST(QuantizeRandom, SubsetsOfOutputs) {
  const View x = random_x({96, 160}, MXMOE_DTYPE_BF16, 3);
  const Request subsets[] = {{true, false, true, true}, {false, true, true, true},
                             {true, false, true, false}, {false, true, false, true}};
  for (Block blk : kBlocks)
    for (const Request& want : subsets) {
      if ((blk.along_c() && !blk.along_r() && !want.scale_c) || (blk.along_r() && !blk.along_c() && !want.scale_r))
        continue;  // no scale output left for this block
      SCOPED_TRACE(describe(blk, MXMOE_SCALE_RCEIL, MXMOE_DTYPE_BF16) + " q " + std::to_string(want.q) +
                   " qt " + std::to_string(want.qt) + " scale_c " + std::to_string(want.scale_c) +
                   " scale_r " + std::to_string(want.scale_r));
      check_quantize(x, blk, MXMOE_SCALE_RCEIL, nullptr, want);
    }
}

// 128x128 with only scale_c accepts R that is not a multiple of 32 (partial edge tiles).
TEST(QuantizeRandom, SquareTilesWithRaggedRowsThroughScaleC) {
  const View x = random_x({2, 130, 160}, MXMOE_DTYPE_F32, 4);
  for (mxmoe_scale_mode mode : {MXMOE_SCALE_RCEIL, MXMOE_SCALE_FLOOR}) {
    SCOPED_TRACE(mode_name(mode));
    check_quantize(x, {128, 128}, mode, nullptr, {true, true, true, false});
  }
}

// ---- Quantize: 3D weights (G, N, K) --------------------------------------------------------

TEST(QuantizeWeights3D, AlongK) {
  for (mxmoe_dtype dtype : kInputDtypes) {
    const View w = random_x({3, 160, 160}, dtype, 11);
    for (Block blk : {Block{1, 32}, Block{1, 128}, Block{128, 128}})
      for (mxmoe_scale_mode mode : {MXMOE_SCALE_RCEIL, MXMOE_SCALE_FLOOR}) {
        SCOPED_TRACE(describe(blk, mode, dtype));
        check_quantize(w, blk, mode, nullptr, {true, false, true, false});
      }
  }
}

// Along N: qt (G, K, N) with scale_r (G, K, N/32) is the dgrad operand.
TEST(QuantizeWeights3D, AlongN) {
  for (mxmoe_dtype dtype : kInputDtypes) {
    const View w = random_x({3, 160, 96}, dtype, 12);
    for (Block blk : {Block{32, 1}, Block{128, 1}, Block{128, 128}})
      for (mxmoe_scale_mode mode : {MXMOE_SCALE_RCEIL, MXMOE_SCALE_FLOOR}) {
        SCOPED_TRACE(describe(blk, mode, dtype));
        check_quantize(w, blk, mode, nullptr, {false, true, false, true});
      }
  }
}

// One 128x128 quantization of W serves both directions: its scale_c and scale_r describe the same
// tile bytes, and q / qt are transposes.
TEST(QuantizeWeights3D, SquareTilesServeBothDirections) {
  const View w = random_x({2, 256, 160}, MXMOE_DTYPE_BF16, 13);
  const Got g = quantize(w, {128, 128}, MXMOE_SCALE_RCEIL);
  const int64_t G = 2, N = 256, K = 160;
  EXPECT_TRUE(same_bytes("qt vs q", g.qt, transpose(g.q, G, N, K), K, N));
  for (int64_t e = 0; e < G; ++e)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(g.scale_c[(e * N + n) * (K / 32) + k / 32], g.scale_r[(e * K + k) * (N / 32) + n / 32])
            << e << " " << n << " " << k;
}

// ---- Quantize: strided inputs --------------------------------------------------------------

TEST(QuantizeStrided, TransposedView) {
  for (mxmoe_dtype dtype : kInputDtypes) {
    const View x = transposed_x(1, 160, 288, false, dtype, 21);
    for (Block blk : kBlocks) {
      SCOPED_TRACE(describe(blk, MXMOE_SCALE_RCEIL, dtype));
      check_quantize(x, blk, MXMOE_SCALE_RCEIL);
    }
  }
}

TEST(QuantizeStrided, Transposed3DAndPaddedViews) {
  // (G, N, K) read from a (G, K, N) buffer: the dgrad situation.
  const View w = transposed_x(2, 96, 160, true, MXMOE_DTYPE_BF16, 22);
  // Every other column of a padded buffer: column stride 2, row stride 2 * 160 + 6.
  const View padded = make_view(mxtest::random_input({96, 2 * 160 + 6}, MXMOE_DTYPE_F32, 23), {96, 160},
                                {2 * 160 + 6, 2});
  for (const View* x : {&w, &padded})
    for (Block blk : kBlocks) {
      SCOPED_TRACE(describe(blk, MXMOE_SCALE_FLOOR, x->storage.dtype) + (x == &w ? " 3D" : " padded"));
      check_quantize(*x, blk, MXMOE_SCALE_FLOOR);
    }
}

// ---- Quantize: token groups (offs) ---------------------------------------------------------

namespace {

// Jagged groups over 250 rows: empty groups (first, middle, last), sizes that are not multiples
// of 32, G = 0, G = 1, G > 32, ends before R, and offsets that the clamping rule has to fix.
std::vector<std::vector<int32_t>> jagged_offsets() {
  std::vector<std::vector<int32_t>> cases = {
      {0, 5, 5, 70, 200, 200},  // rows 200.. are in no group
      {250},                    // G = 1, every row
      {77},                     // G = 1, ends early
      {},                       // G = 0, no row in a group
      {50, 30, 300},            // decreasing, then past R: groups [0,50) [50,50) [50,250)
      {-5, 40, 40, 161},        // negative: an empty first group
  };
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> size(1, 11);
  std::vector<int32_t> many;  // G = 40, sizes 0..11, ending near row 200
  int32_t end = 0;
  for (int g = 0; g < 40; ++g) many.push_back(end += g % 9 == 0 ? 0 : size(rng));
  cases.push_back(many);
  return cases;
}

std::string offs_str(const std::vector<int32_t>& offs) {
  std::string s = "offs {";
  for (size_t i = 0; i < offs.size() && i < 8; ++i) s += std::to_string(offs[i]) + ",";
  if (offs.size() > 8) s += "... (" + std::to_string(offs.size()) + " groups)";
  return s + "}";
}

}  // namespace

TEST(QuantizeGrouped, JaggedGroupsAlongR) {
  for (mxmoe_dtype dtype : kInputDtypes) {
    const View x = random_x({250, 96}, dtype, 31);
    for (const auto& offs : jagged_offsets())
      for (Block blk : {Block{32, 1}, Block{128, 1}, Block{128, 128}})
        for (mxmoe_scale_mode mode : {MXMOE_SCALE_RCEIL, MXMOE_SCALE_FLOOR}) {
          SCOPED_TRACE(describe(blk, mode, dtype) + " " + offs_str(offs));
          check_quantize(x, blk, mode, &offs);
        }
  }
}

// The layout rules spelled out on one case, independently of the model: rows outside groups are
// 0, unused scale entries are 0, a partial block's amax ignores the next group's rows.
TEST(QuantizeGrouped, BlocksStopAtGroupEnds) {
  Buffer xb({100, 32}, MXMOE_DTYPE_F32);
  for (int64_t i = 0; i < xb.numel(); ++i) xb.set(i, 1.0f);
  xb.set(45 * 32 + 3, 1000.0f);  // in group 1 = rows [40, 90), its first 32-run
  const View x = contiguous(std::move(xb));
  const std::vector<int32_t> offs = {40, 90};  // rows 90..99 in no group
  const Got g = quantize(x, {32, 1}, MXMOE_SCALE_RCEIL, &offs);
  const int64_t n_r = cdiv(100, 32) + 2;  // 6; used: group 0 -> 2 runs, group 1 -> 2 runs
  const uint8_t one = ref::scale_byte(1.0f, MXMOE_SCALE_RCEIL), big = ref::scale_byte(1000.0f, MXMOE_SCALE_RCEIL);
  ASSERT_NE(one, big);
  for (int64_t c = 0; c < 32; ++c) {
    const uint8_t* s = &g.scale_r[c * n_r];
    EXPECT_EQ(s[0], one) << c;
    EXPECT_EQ(s[1], one) << c;  // rows 32..39: partial, not touched by row 45
    EXPECT_EQ(s[2], c == 3 ? big : one) << c;  // rows 40..71
    EXPECT_EQ(s[3], one) << c;  // rows 72..89, partial
    EXPECT_EQ(s[4], 0) << c;
    EXPECT_EQ(s[5], 0) << c;
  }
  for (int64_t r = 0; r < 100; ++r)
    for (int64_t c = 0; c < 32; ++c) {
      const uint8_t want = r >= 90 ? 0x00 : ref::quantize(x.value(0, r, c), (c == 3 && r >= 40 && r < 72) ? big : one);
      ASSERT_EQ(g.q[r * 32 + c], want) << r << " " << c;
      ASSERT_EQ(g.qt[c * 100 + r], want) << r << " " << c;
    }
}

// 128x128 with offs: tiles start at each group's start; rows outside groups get scale_c = 0.
TEST(QuantizeGrouped, SquareTilesAreGroupAligned) {
  const View x = random_x({300, 160}, MXMOE_DTYPE_BF16, 32);
  const std::vector<int32_t> offs = {10, 150, 150, 281};
  check_quantize(x, {128, 128}, MXMOE_SCALE_RCEIL, &offs);
  const Got g = quantize(x, {128, 128}, MXMOE_SCALE_RCEIL, &offs, {true, true, true, false});
  for (int64_t r = 281; r < 300; ++r)
    for (int64_t j = 0; j < 5; ++j) ASSERT_EQ(g.scale_c[r * 5 + j], 0) << r;
  // Rows 10..137 form one tile of group 1, so their bytes agree; row 138 starts the next tile.
  for (int64_t r = 10; r < 138; ++r) ASSERT_EQ(g.scale_c[r * 5], g.scale_c[10 * 5]) << r;
}

// Blocks along C ignore offs: every row is quantized, including rows past the last group.
TEST(QuantizeGrouped, BlocksAlongCIgnoreOffs) {
  const View x = random_x({250, 160}, MXMOE_DTYPE_BF16, 33);
  for (Block blk : {Block{1, 32}, Block{1, 128}})
    for (const auto& offs : jagged_offsets()) {
      SCOPED_TRACE(describe(blk, MXMOE_SCALE_RCEIL, MXMOE_DTYPE_BF16) + " " + offs_str(offs));
      const Got with = quantize(x, blk, MXMOE_SCALE_RCEIL, &offs), without = quantize(x, blk, MXMOE_SCALE_RCEIL);
      EXPECT_TRUE(same_bytes("q", with.q, without.q, 250, 160));
      EXPECT_TRUE(same_bytes("qt", with.qt, without.qt, 160, 250));
      EXPECT_TRUE(same_bytes("scale_c", with.scale_c, without.scale_c, 250, 5));
    }
  check_quantize(x, {1, 128}, MXMOE_SCALE_RCEIL, &jagged_offsets()[0]);
}

// ---- Quantize: coarse blocks ---------------------------------------------------------------

namespace {

// Random values below M in magnitude, plus +-M once in every 32-run along both axes (where
// (r - c) % 32 == 0, and along each group's last row for its partial last runs), so every 1x32
// and 32x1 block has amax M. M is constant over each 128x128
// tile (relative to the group starts) and varies between tiles, groups and columns.
View coarse_friendly_x(int64_t R, int64_t C, mxmoe_dtype dtype, const std::vector<int32_t>* offs, uint32_t seed) {
  const std::vector<RefGroup> groups = ref_groups(offs, R);
  Buffer b({R, C}, dtype);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.99f, 0.99f);
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (int64_t r = groups[gi].start; r < groups[gi].end; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t tile_r = (r - groups[gi].start) / 128, tile_c = c / 128;
        const float M = std::ldexp(1.37f, static_cast<int>((gi * 7 + tile_r * 5 + tile_c * 3) % 23) - 11);
        const bool peak = (r - groups[gi].start - c) % 32 == 0 || r == groups[gi].end - 1;
        b.set(r * C + c, peak ? ((r + c) % 3 ? M : -M) : u(rng) * M);
      }
  return contiguous(std::move(b));
}

}  // namespace

// MX_SPEC.md: coarse == 1x32 when every 32-element piece would get the coarse byte anyway.
TEST(QuantizeCoarse, EqualsFineWhenEveryRunHasTheBlockAmax) {
  const std::vector<int32_t> offs = {100, 100, 300, 333};
  for (mxmoe_dtype dtype : kInputDtypes)
    for (mxmoe_scale_mode mode : kModes)
      for (const std::vector<int32_t>* o : {static_cast<const std::vector<int32_t>*>(nullptr), &offs}) {
        SCOPED_TRACE(std::string(mode_name(mode)) + (dtype == MXMOE_DTYPE_BF16 ? " bf16" : " f32") +
                     (o ? " grouped" : ""));
        const int64_t R = o ? 350 : 288, C = 288;
        const View x = coarse_friendly_x(R, C, dtype, o, 41);
        if (!o) {  // blocks along C ignore groups, so only the ungrouped case is meaningful
          const Got fine_c = quantize(x, {1, 32}, mode);
          for (Block coarse : {Block{1, 128}, Block{128, 128}}) {
            const Got g = quantize(x, coarse, mode);
            EXPECT_TRUE(same_bytes("q", g.q, fine_c.q, R, C)) << coarse.r << "x" << coarse.c;
            EXPECT_TRUE(same_bytes("scale_c", g.scale_c, fine_c.scale_c, R, C / 32)) << coarse.r << "x" << coarse.c;
          }
        }
        const Got fine_r = quantize(x, {32, 1}, mode, o);
        for (Block coarse : {Block{128, 1}, Block{128, 128}}) {
          const Got g = quantize(x, coarse, mode, o);
          const int64_t n_r = n_r_for(x, coarse, o);
          EXPECT_TRUE(same_bytes("qt", g.qt, fine_r.qt, C, R)) << coarse.r << "x" << coarse.c;
          EXPECT_TRUE(same_bytes("scale_r", g.scale_r, fine_r.scale_r, C, n_r)) << coarse.r << "x" << coarse.c;
        }
      }
}

// A coarse byte is repeated over its 32-runs, and one large element moves every run of its block
// (but none outside); edge blocks are partial.
TEST(QuantizeCoarse, RepeatedScalesAndPartialEdges) {
  const int64_t R = 160, C = 288;
  Buffer xb({R, C}, MXMOE_DTYPE_BF16);
  for (int64_t i = 0; i < xb.numel(); ++i) xb.set(i, 1.0f);
  xb.set(5 * C + 100, 1000.0f);  // row 5, 32-run 3 (1x128 block 0), tile (0, 0)
  xb.set(150 * C + 270, -4000.0f);  // row 150, run 8 (partial 1x128 block 2), tile (1, 2)
  const View x = contiguous(std::move(xb));
  const mxmoe_scale_mode mode = MXMOE_SCALE_RCEIL;
  const uint8_t one = ref::scale_byte(1.f, mode), big = ref::scale_byte(1000.f, mode),
                huge = ref::scale_byte(4000.f, mode);
  ASSERT_EQ(one, 119);  // 1/448 rounds up to 2^-8
  ASSERT_EQ(big, 129);
  ASSERT_EQ(huge, 131);

  const Got fine = quantize(x, {1, 32}, mode);
  EXPECT_EQ(fine.scale_c[5 * 9 + 2], one);
  EXPECT_EQ(fine.scale_c[5 * 9 + 3], big);

  const Got row = quantize(x, {1, 128}, mode);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < 9; ++j) {
      const uint8_t want = (r == 5 && j < 4) ? big : (r == 150 && j == 8) ? huge : one;
      ASSERT_EQ(row.scale_c[r * 9 + j], want) << r << " " << j;
    }
  EXPECT_EQ(row.q[5 * C + 0], 0x28);  // 1.0 under scale 2^2 is 0.25
  EXPECT_EQ(row.q[5 * C + 200], 0x78);  // 1.0 under its own scale 2^-8 is 256
  EXPECT_EQ(row.q[5 * C + 100], ref::quantize(1000.f, big));

  const Got tile = quantize(x, {128, 128}, mode);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < 9; ++j) {
      const bool t00 = r < 128 && j < 4, t12 = r >= 128 && j >= 8;
      ASSERT_EQ(tile.scale_c[r * 9 + j], t00 ? big : t12 ? huge : one) << r << " " << j;
    }
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < 5; ++i) {
      const bool t00 = c < 128 && i < 4, t12 = c >= 256 && i >= 4;
      ASSERT_EQ(tile.scale_r[c * 5 + i], t00 ? big : t12 ? huge : one) << c << " " << i;
    }
}

// ---- Quantize: special values --------------------------------------------------------------

// A NaN or an Inf anywhere in a block makes the whole block NaN: scale 255, every code 0x7F,
// whatever the sign of the special value, in every mode. Neighbouring blocks are untouched.
TEST(QuantizeSpecial, NanAndInfPoisonTheWholeBlock) {
  for (mxmoe_dtype dtype : kInputDtypes) {
    const int64_t R = 160, C = 160;  // partial 1x128 / 128x1 / 128x128 blocks at both edges
    View x = random_x({R, C}, dtype, 51);
    const struct {
      int64_t r, c;
      float v;
    } specials[] = {{3, 5, kNan}, {70, 140, -kInf}, {140, 40, kInf}, {159, 159, -kNan}};
    for (const auto& s : specials) x.storage.set(s.r * C + s.c, s.v);
    for (Block blk : kBlocks)
      for (mxmoe_scale_mode mode : kModes) {
        SCOPED_TRACE(describe(blk, mode, dtype));
        check_quantize(x, blk, mode);
        const Got g = quantize(x, blk, mode);
        // Every special value's block: 0x7F codes over its full extent.
        for (const auto& s : specials) {
          const int64_t r0 = s.r / blk.r * blk.r, c0 = s.c / blk.c * blk.c;
          for (int64_t r = r0; r < std::min<int64_t>(r0 + blk.r, R); ++r)
            for (int64_t c = c0; c < std::min<int64_t>(c0 + blk.c, C); ++c)
              ASSERT_EQ(g.q[r * C + c], 0x7F) << r << " " << c;
        }
        const auto& scales = blk.along_c() ? g.scale_c : g.scale_r;
        int64_t nan_scales = 0;
        for (uint8_t s : scales) nan_scales += s == 255;
        // 4 blocks, each covering (rows x runs) scale entries; all four are in distinct blocks.
        int64_t want = 0;
        for (const auto& s : specials) {
          const int64_t r0 = s.r / blk.r * blk.r, c0 = s.c / blk.c * blk.c;
          const int64_t rows = std::min<int64_t>(r0 + blk.r, R) - r0, cols = std::min<int64_t>(c0 + blk.c, C) - c0;
          want += blk.along_c() ? rows * cdiv(cols, 32) : cols * cdiv(rows, 32);
        }
        EXPECT_EQ(nan_scales, want);
      }
  }
}

// A NaN in one group's partial last block does not reach the next group's first block.
TEST(QuantizeSpecial, NanStaysInsideItsGroup) {
  View x = random_x({120, 64}, MXMOE_DTYPE_BF16, 52);
  x.storage.set(49 * 64 + 10, kNan);  // last row of group 0 = [0, 50)
  const std::vector<int32_t> offs = {50, 120};
  for (Block blk : {Block{32, 1}, Block{128, 1}, Block{128, 128}}) {
    SCOPED_TRACE(describe(blk, MXMOE_SCALE_RCEIL, MXMOE_DTYPE_BF16));
    check_quantize(x, blk, MXMOE_SCALE_RCEIL, &offs);
    const Got g = quantize(x, blk, MXMOE_SCALE_RCEIL, &offs);
    EXPECT_EQ(g.q[49 * 64 + 10], 0x7F);
    for (int64_t c = 0; c < 64; ++c) EXPECT_NE(g.q[50 * 64 + c], 0x7F) << c;
  }
}

// ---- Quantize: speed -----------------------------------------------------------------------

// 4096 x 4096 bf16 on one thread: a coarse guard on the thread's CPU time (the goal is well
// under 0.2 s; CPU time rather than wall time, so other load on the machine does not count); the
// times are printed. Spot-checks rows against the model so the run cannot be a no-op.
TEST(QuantizePerf, Bf16Square4096OneThread) {
  const int64_t N = 4096;
  const View x = random_x({N, N}, MXMOE_DTYPE_BF16, 61);
  Buffer q({N, N}, MXMOE_DTYPE_E4M3), s({N, N / 32}, MXMOE_DTYPE_E8M0);
  mxmoe_tensor qv = q.view(), sv = s.view();
  const char* old = std::getenv("MXMOE_NUM_THREADS");
  const std::string saved = old ? old : "";
  setenv("MXMOE_NUM_THREADS", "1", 1);  // one worker: the loop runs on this thread
  ASSERT_EQ(mxmoe_reload_env(), MXMOE_OK) << mxmoe_last_error();  // the library reads it once per process
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  double best_cpu = 1e9, best_wall = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    ASSERT_EQ(mxmoe_quantize(&x.view, nullptr, {1, 32, MXMOE_SCALE_RCEIL}, &qv, nullptr, &sv, nullptr, nullptr),
              MXMOE_OK);
    best_cpu = std::min(best_cpu, cpu_now() - c0);
    best_wall = std::min(best_wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (old) setenv("MXMOE_NUM_THREADS", saved.c_str(), 1);
  else unsetenv("MXMOE_NUM_THREADS");
  ASSERT_EQ(mxmoe_reload_env(), MXMOE_OK) << mxmoe_last_error();
  std::cout << "[ timing ] quantize 4096x4096 bf16 1x32, 1 thread: " << best_cpu * 1e3 << " ms CPU, "
            << best_wall * 1e3 << " ms wall\n";
  RecordProperty("quantize_4096_cpu_ms", std::to_string(best_cpu * 1e3));
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(best_cpu, 0.2);  // only meaningful in an optimized, uninstrumented build
#endif
  for (int64_t r : {int64_t{0}, int64_t{1777}, N - 1})
    for (int64_t j = 0; j < N / 32; ++j) {
      float amax = 0.f;
      for (int64_t c = 32 * j; c < 32 * j + 32; ++c) amax = std::max(amax, std::fabs(x.value(0, r, c)));
      const uint8_t byte = ref::scale_byte(amax, MXMOE_SCALE_RCEIL);
      ASSERT_EQ(s.u8(r * (N / 32) + j), byte);
      for (int64_t c = 32 * j; c < 32 * j + 32; ++c) ASSERT_EQ(q.u8(r * N + c), ref::quantize(x.value(0, r, c), byte));
    }
}

// ---- Dequantize ----------------------------------------------------------------------------

namespace {

// Expected dequantized values: scale index of blocked position i (grouped compact layout with
// offs, i / 32 without), elements outside every group are +0.
std::vector<float> ref_dequantize(const View& q, const View& scale, int axis, const std::vector<int32_t>* offs) {
  const int64_t B = q.B, R = q.I, C = q.J;
  const int64_t len = axis == 1 ? C : R;
  std::vector<int64_t> idx(len, -1);
  for (const RefGroup& g : ref_groups(offs, len))
    for (int64_t i = g.start; i < g.end; ++i) idx[i] = g.first_run + (i - g.start) / 32;
  std::vector<float> out(B * R * C);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = idx[axis == 1 ? c : r];
        float v = 0.f;
        if (i >= 0) v = ref::dequantize(q.byte(b, r, c), axis == 1 ? scale.byte(b, r, i) : scale.byte(b, c, i));
        out[(b * R + r) * C + c] = v;
      }
  return out;
}

// Runs mxmoe_dequantize into a guarded output; returns its bytes.
std::vector<uint8_t> dequantize_once(const View& q, const View& scale, int axis, const std::vector<int32_t>* offs,
                                     mxmoe_dtype out_dtype, uint8_t fill) {
  Guarded out(batched(q, {q.I, q.J}), out_dtype, fill);
  mxmoe_tensor ov = out.view();
  Buffer offs_buf;
  mxmoe_tensor offs_view{};
  if (offs) {
    offs_buf = mxtest::offsets(*offs);
    offs_view = offs_buf.view();
  }
  EXPECT_EQ(mxmoe_dequantize(&q.view, &scale.view, axis, offs ? &offs_view : nullptr, &ov, nullptr), MXMOE_OK)
      << mxmoe_last_error();
  EXPECT_TRUE(out.guards_intact()) << "a write out of bounds";
  return out.contents();
}

// The library against the model: the same bits (f32: the fp32 value; bf16: its RNE rounding);
// NaN matches any NaN.
void check_dequantize(const View& q, const View& scale, int axis, const std::vector<int32_t>* offs = nullptr) {
  const std::vector<float> want = ref_dequantize(q, scale, axis, offs);
  for (mxmoe_dtype dt : {MXMOE_DTYPE_F32, MXMOE_DTYPE_BF16}) {
    SCOPED_TRACE(dt == MXMOE_DTYPE_F32 ? "out f32" : "out bf16");
    const std::vector<uint8_t> got = dequantize_once(q, scale, axis, offs, dt, 0x5A);
    EXPECT_TRUE(got == dequantize_once(q, scale, axis, offs, dt, 0xA5)) << "some output bytes are left unwritten";
    int64_t bad = 0, first = -1;
    for (size_t k = 0; k < want.size(); ++k) {
      bool ok;
      if (dt == MXMOE_DTYPE_F32) {
        float g;
        std::memcpy(&g, &got[4 * k], 4);
        ok = std::isnan(want[k]) ? std::isnan(g) : mxtest::bits_of(g) == mxtest::bits_of(want[k]);
      } else {
        uint16_t g;
        std::memcpy(&g, &got[2 * k], 2);
        ok = std::isnan(want[k]) ? std::isnan(mxtest::from_bf16(g)) : g == mxtest::to_bf16(want[k]);
      }
      if (!ok && bad++ == 0) first = static_cast<int64_t>(k);
    }
    EXPECT_EQ(bad, 0) << "first at flat index " << first << " (row " << first / q.J << ", col " << first % q.J
                      << "), want " << (first >= 0 ? want[first] : 0.f);
  }
}

View as_bytes(const std::vector<uint8_t>& bytes, std::vector<int64_t> shape, mxmoe_dtype dtype) {
  Buffer b(shape, dtype);
  b.bytes = bytes;
  return contiguous(std::move(b));
}

// Random bytes, every code and every scale byte (255 and 0 included) equally likely.
View random_bytes(const std::vector<int64_t>& shape, mxmoe_dtype dtype, uint32_t seed) {
  Buffer b(shape, dtype);
  std::mt19937 rng(seed);
  for (auto& v : b.bytes) v = static_cast<uint8_t>(rng());
  return contiguous(std::move(b));
}

}  // namespace

// dequantize(quantize(x)) for both axes, every block shape; q with scale_c (axis 1) and q with
// scale_r (axis 0); qt with scale_c is the same data read along dim -2 (axis 0).
TEST(DequantizeRoundTrip, BothAxesEveryBlock) {
  for (mxmoe_dtype dtype : kInputDtypes) {
    const View x = random_x({160, 288}, dtype, 71, 60.f);
    for (Block blk : kBlocks) {
      SCOPED_TRACE(describe(blk, MXMOE_SCALE_RCEIL, dtype));
      const Got g = quantize(x, blk, MXMOE_SCALE_RCEIL);
      const View q = as_bytes(g.q, {160, 288}, MXMOE_DTYPE_E4M3), qt = as_bytes(g.qt, {288, 160}, MXMOE_DTYPE_E4M3);
      if (blk.along_c()) {
        const View sc = as_bytes(g.scale_c, {160, 9}, MXMOE_DTYPE_E8M0);
        check_dequantize(q, sc, 1);
        check_dequantize(qt, sc, 0);
      }
      if (blk.along_r()) {
        const View sr = as_bytes(g.scale_r, {288, 5}, MXMOE_DTYPE_E8M0);
        check_dequantize(q, sr, 0);
        check_dequantize(qt, sr, 1);
      }
    }
  }
}

// The wgrad operand: grouped 32x1 / 128x1 quantization along tokens, dequantized with the same offs.
TEST(DequantizeRoundTrip, GroupedAlongR) {
  const View x = random_x({250, 96}, MXMOE_DTYPE_F32, 72);
  for (const auto& offs : jagged_offsets())
    for (Block blk : {Block{32, 1}, Block{128, 1}, Block{128, 128}}) {
      SCOPED_TRACE(describe(blk, MXMOE_SCALE_RCEIL, MXMOE_DTYPE_F32) + " " + offs_str(offs));
      const Got g = quantize(x, blk, MXMOE_SCALE_RCEIL, &offs);
      const int64_t n_r = n_r_for(x, blk, &offs);
      const View q = as_bytes(g.q, {250, 96}, MXMOE_DTYPE_E4M3), qt = as_bytes(g.qt, {96, 250}, MXMOE_DTYPE_E4M3);
      const View sr = as_bytes(g.scale_r, {96, n_r}, MXMOE_DTYPE_E8M0);
      check_dequantize(q, sr, 0, &offs);
      check_dequantize(qt, sr, 1, &offs);
    }
}

// Arbitrary bytes (NaN codes, scale 255, scale 0) with groups along C, C not a multiple of 32.
TEST(DequantizeRandomBytes, GroupedAlongC) {
  const int64_t R = 40, C = 250;
  const View q = random_bytes({R, C}, MXMOE_DTYPE_E4M3, 81);
  for (const auto& offs : jagged_offsets()) {
    SCOPED_TRACE(offs_str(offs));
    const View scale = random_bytes({R, cdiv(C, 32) + static_cast<int64_t>(offs.size())}, MXMOE_DTYPE_E8M0, 82);
    check_dequantize(q, scale, 1, &offs);
  }
}

TEST(DequantizeRandomBytes, UngroupedBothAxes) {
  const View q = random_bytes({96, 160}, MXMOE_DTYPE_E4M3, 83);
  check_dequantize(q, random_bytes({96, 5}, MXMOE_DTYPE_E8M0, 84), 1);
  check_dequantize(q, random_bytes({160, 3}, MXMOE_DTYPE_E8M0, 85), 0);
}

// 3D, with q and scale as transposed (non-contiguous) views.
TEST(DequantizeRandomBytes, Strided3D) {
  const int64_t G = 3, R = 64, C = 96;
  auto transposed = [](int64_t b, int64_t i, int64_t j, mxmoe_dtype dt, uint32_t seed) {
    View storage = random_bytes({b, j, i}, dt, seed);
    return make_view(std::move(storage.storage), {b, i, j}, {i * j, 1, i});
  };
  const View q = transposed(G, R, C, MXMOE_DTYPE_E4M3, 86);
  check_dequantize(q, transposed(G, R, C / 32, MXMOE_DTYPE_E8M0, 87), 1);
  check_dequantize(q, transposed(G, C, R / 32, MXMOE_DTYPE_E8M0, 88), 0);
}

// All 64K (scale byte, code) pairs: row s holds every code twice (C = 512), scale s everywhere.
TEST(DequantizeSpecial, EveryScaleAndCodePair) {
  std::vector<uint8_t> q(256 * 512), s(256 * 16);
  for (int64_t r = 0; r < 256; ++r) {
    for (int64_t c = 0; c < 512; ++c) q[r * 512 + c] = static_cast<uint8_t>(c);
    for (int64_t j = 0; j < 16; ++j) s[r * 16 + j] = static_cast<uint8_t>(r);
  }
  check_dequantize(as_bytes(q, {256, 512}, MXMOE_DTYPE_E4M3), as_bytes(s, {256, 16}, MXMOE_DTYPE_E8M0), 1);
}

// Pinned values: NaN from either part, the subnormal scale 2^-127, overflow of 448 * 2^127.
TEST(DequantizeSpecial, PinnedValues) {
  const std::vector<uint8_t> codes = {0x7F, 0xFF, 0x38, 0x01, 0x7E, 0x80, 0x38};
  const std::vector<uint8_t> scales = {127, 127, 255, 0, 254, 127, 0};
  const int64_t n = static_cast<int64_t>(codes.size());
  std::vector<uint8_t> q(n * 32), s(n);
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t i = 0; i < 32; ++i) q[k * 32 + i] = codes[k];
    s[k] = scales[k];
  }
  const View qv = as_bytes(q, {1, n * 32}, MXMOE_DTYPE_E4M3), sv = as_bytes(s, {1, n}, MXMOE_DTYPE_E8M0);
  const std::vector<uint8_t> f = dequantize_once(qv, sv, 1, nullptr, MXMOE_DTYPE_F32, 0);
  const std::vector<uint8_t> h = dequantize_once(qv, sv, 1, nullptr, MXMOE_DTYPE_BF16, 0);
  auto f32_at = [&](int64_t k) {
    uint32_t u;
    std::memcpy(&u, &f[4 * 32 * k], 4);
    return u;
  };
  auto bf16_at = [&](int64_t k) {
    uint16_t u;
    std::memcpy(&u, &h[2 * 32 * k], 2);
    return u;
  };
  for (int64_t k : {0, 1, 2}) {
    EXPECT_TRUE(std::isnan(mxtest::float_of(f32_at(k)))) << k;
    EXPECT_TRUE(std::isnan(mxtest::from_bf16(bf16_at(k)))) << k;
  }
  EXPECT_EQ(f32_at(3), mxtest::bits_of(std::ldexp(1.0f, -136)));  // 2^-9 * 2^-127, an fp32 subnormal
  EXPECT_EQ(bf16_at(3), 0x0000);                                    // below bf16's 2^-133
  EXPECT_EQ(f32_at(4), 0x7F800000u);                                // 448 * 2^127 overflows
  EXPECT_EQ(bf16_at(4), 0x7F80);
  EXPECT_EQ(f32_at(5), 0x80000000u);  // -0 kept
  EXPECT_EQ(bf16_at(5), 0x8000);
  EXPECT_EQ(f32_at(6), 0x00400000u);  // 1.0 * 2^-127
  EXPECT_EQ(bf16_at(6), 0x0040);
}
