// Grouped MX GEMMs against the exact reference: operands dequantized with the scalar reference
// (ref::dequantize), products summed in fp64. MX operands are built directly from random bytes
// (e4m3 codes without the NaN codes, scale bytes 110..140), so nothing here depends on quantize.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "scalar_reference.hpp"
#include "test_util.hpp"

using mxtest::Buffer;

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

Buffer random_e4m3(std::vector<int64_t> shape, std::mt19937& rng) {
  Buffer b(std::move(shape), MXMOE_DTYPE_E4M3);
  for (auto& v : b.bytes) {
    do {
      v = static_cast<uint8_t>(rng());
    } while ((v & 0x7F) == 0x7F);
  }
  return b;
}

Buffer random_e8m0(std::vector<int64_t> shape, std::mt19937& rng) {
  Buffer b(std::move(shape), MXMOE_DTYPE_E8M0);
  for (auto& v : b.bytes) v = static_cast<uint8_t>(110 + rng() % 31);
  return b;
}

// A view of `buf` with explicit shape and strides (elements).
mxmoe_tensor strided(Buffer& buf, std::vector<int64_t> shape, std::vector<int64_t> strides) {
  mxmoe_tensor t = buf.view();
  t.ndim = static_cast<int32_t>(shape.size());
  for (int i = 0; i < t.ndim; ++i) {
    t.shape[i] = shape[i];
    t.strides[i] = strides[i];
  }
  return t;
}

uint8_t byte_at(const mxmoe_tensor& t, int64_t i, int64_t j, int64_t k = -1) {
  const int64_t o = k < 0 ? i * t.strides[0] + j * t.strides[1]
                          : i * t.strides[0] + j * t.strides[1] + k * t.strides[2];
  return static_cast<const uint8_t*>(t.data)[o];
}

// Dense row-major copy of a dequantized (rows, len) matrix (matrix `e` of a 3-D view if e >= 0);
// scale_col(r, l) gives the scale column of element (r, l).
template <typename ScaleCol>
std::vector<double> dequantized(const mxmoe_tensor& q, const mxmoe_tensor& s, int64_t e, int64_t rows,
                                int64_t len, ScaleCol scale_col) {
  std::vector<double> d(static_cast<size_t>(rows * len));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < len; ++l) {
      const uint8_t qb = e < 0 ? byte_at(q, r, l) : byte_at(q, e, r, l);
      const int64_t c = scale_col(r, l);
      const uint8_t sb = e < 0 ? byte_at(s, r, c) : byte_at(s, e, r, c);
      d[r * len + l] = ref::dequantize(qb, sb);
    }
  return d;
}

// Clamped groups, the rule of the C API: end_g = min(m, max(end_{g-1}, offs[g])).
struct Groups {
  std::vector<int64_t> start, end, block_start;
};
Groups groups_of(const std::vector<int32_t>& offs, int64_t m) {
  Groups g;
  int64_t prev = 0, blocks = 0;
  for (int32_t o : offs) {
    const int64_t e = std::min<int64_t>(m, std::max<int64_t>(prev, o));
    g.start.push_back(prev);
    g.end.push_back(e);
    g.block_start.push_back(blocks);
    blocks += cdiv(e - prev, 32);
    prev = e;
  }
  return g;
}

std::vector<int32_t> jagged_ends(int64_t m, int groups, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ends(groups);
  for (auto& e : ends) e = static_cast<int32_t>(rng() % (m + 1));
  std::sort(ends.begin(), ends.end());
  if (groups > 2) ends[1] = ends[0];
  return ends;
}

// The exact result of each output element and the sum of the magnitudes of its terms.
struct Reference {
  std::vector<double> val, mag;
  int64_t len = 0;  // terms per sum
  explicit Reference(size_t n, int64_t terms) : val(n, 0.0), mag(n, 0.0), len(terms) {}
};

// f32: relative Frobenius error <= 1e-5 (MX_SPEC.md), and every element within the worst-case bound
// of a sequential fp32 sum, (len+1) * 2^-24 * sum|terms| (catches a wrong term however small the
// element is next to the others). bf16: the same plus half a bf16 ulp, and almost every element
// equals the fp64 result rounded to bf16 (a few may sit across a rounding boundary).
void expect_close(const Buffer& got, const Reference& want) {
  ASSERT_EQ(static_cast<size_t>(got.numel()), want.val.size());
  const bool bf16 = got.dtype == MXMOE_DTYPE_BF16;
  double num = 0, den = 0;
  int64_t same = 0, bad = 0;
  for (size_t i = 0; i < want.val.size(); ++i) {
    const double g = got.get(static_cast<int64_t>(i)), w = want.val[i];
    num += (g - w) * (g - w);
    den += w * w;
    double tol = static_cast<double>(want.len + 1) * std::ldexp(want.mag[i], -24);
    if (bf16) tol += std::ldexp(std::fabs(w), -8);
    if (!(std::fabs(g - w) <= tol) && bad++ < 5)
      ADD_FAILURE() << "element " << i << ": got " << g << ", want " << w << " +- " << tol;
    if (bf16) same += got.data<uint16_t>()[i] == mxtest::to_bf16(static_cast<float>(w));
  }
  EXPECT_EQ(bad, 0);
  const double err = std::sqrt(num / den);
  EXPECT_LE(err, bf16 ? std::ldexp(1.0, -8) : 1e-5);
  if (bf16) {
    EXPECT_GE(static_cast<double>(same), 0.99 * static_cast<double>(want.val.size()));
  }
}

// ---- grouped_mm ---------------------------------------------------------------------------------

struct MMCase {
  int64_t M, K, N;
  std::vector<int32_t> offs;
  mxmoe_dtype out_dtype = MXMOE_DTYPE_F32;
  bool bias = false;
  mxmoe_dtype bias_dtype = MXMOE_DTYPE_F32;
  bool dgrad_b = false;   // B stored (G, K, N) and viewed (G, N, K) through strides
  bool strided_a = false; // A rows padded in memory (row stride K + 64)
  uint32_t seed = 1;
};

struct MMProblem {
  Buffer a, as, b, bs, offs, bias, out;
  mxmoe_tensor av, asv, bv, bsv, offv, biasv, outv;
  bool has_bias = false;
};

MMProblem make_mm(const MMCase& c) {
  std::mt19937 rng(c.seed);
  const int64_t G = static_cast<int64_t>(c.offs.size()), kb = c.K / 32;
  MMProblem p;
  const int64_t lda = c.strided_a ? c.K + 64 : c.K;
  p.a = random_e4m3({c.M, lda}, rng);
  p.as = random_e8m0({c.M, kb}, rng);
  p.av = strided(p.a, {c.M, c.K}, {lda, 1});
  p.asv = p.as.view();
  if (c.dgrad_b) {
    p.b = random_e4m3({G, c.K, c.N}, rng);
    p.bs = random_e8m0({G, kb, c.N}, rng);
    p.bv = strided(p.b, {G, c.N, c.K}, {c.K * c.N, 1, c.N});
    p.bsv = strided(p.bs, {G, c.N, kb}, {kb * c.N, 1, c.N});
  } else {
    p.b = random_e4m3({G, c.N, c.K}, rng);
    p.bs = random_e8m0({G, c.N, kb}, rng);
    p.bv = p.b.view();
    p.bsv = p.bs.view();
  }
  p.offs = mxtest::offsets(c.offs);
  p.offv = p.offs.view();
  if (c.bias) {
    p.has_bias = true;
    p.bias = Buffer({G, c.N}, c.bias_dtype);
    // Elements reach |448 * 2^13|, so sums of products are ~2^40: a bias that size is visible.
    std::normal_distribution<float> n(0.f, 1.f);
    for (int64_t i = 0; i < p.bias.numel(); ++i) p.bias.set(i, std::ldexp(n(rng), 40));
    p.biasv = p.bias.view();
  }
  p.out = Buffer({c.M, c.N}, c.out_dtype, 0xFF);  // NaN everywhere until written
  p.outv = p.out.view();
  return p;
}

mxmoe_status run_mm(MMProblem& p) {
  return mxmoe_grouped_mm_mx(&p.av, &p.asv, &p.bv, &p.bsv, &p.offv, p.has_bias ? &p.biasv : nullptr,
                             &p.outv, nullptr);
}

Reference reference_mm(const MMProblem& p, const MMCase& c) {
  Reference out(static_cast<size_t>(c.M * c.N), c.K + 1);
  const Groups g = groups_of(c.offs, c.M);
  auto block = [](int64_t, int64_t l) { return l / 32; };
  const std::vector<double> a = dequantized(p.av, p.asv, -1, c.M, c.K, block);
  for (size_t k = 0; k < g.start.size(); ++k) {
    const int64_t e = static_cast<int64_t>(k);
    if (g.end[k] == g.start[k]) continue;
    const std::vector<double> b = dequantized(p.bv, p.bsv, e, c.N, c.K, block);
    for (int64_t m = g.start[k]; m < g.end[k]; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        double acc = 0, mag = 0;
        for (int64_t j = 0; j < c.K; ++j) {
          const double t = a[m * c.K + j] * b[n * c.K + j];
          acc += t;
          mag += std::fabs(t);
        }
        if (p.has_bias) {
          acc += p.bias.get(e * c.N + n);
          mag += std::fabs(p.bias.get(e * c.N + n));
        }
        out.val[m * c.N + n] = acc;
        out.mag[m * c.N + n] = mag;
      }
  }
  return out;
}

void check_mm(const MMCase& c) {
  SCOPED_TRACE(testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N << " G=" << c.offs.size()
                                  << " out=" << (c.out_dtype == MXMOE_DTYPE_BF16 ? "bf16" : "f32")
                                  << " bias=" << c.bias << " dgrad_b=" << c.dgrad_b);
  MMProblem p = make_mm(c);
  ASSERT_EQ(run_mm(p), MXMOE_OK) << mxmoe_last_error();
  expect_close(p.out, reference_mm(p, c));
}

}  // namespace

TEST(GroupedMM, JaggedGroupsF32) {
  // Empty first and middle groups, sizes not multiples of 32, offs[G-1] < M.
  check_mm({160, 96, 40, {0, 37, 37, 100, 150}});
}

TEST(GroupedMM, JaggedGroupsBf16) {
  MMCase c{160, 96, 40, {0, 37, 37, 100, 150}};
  c.out_dtype = MXMOE_DTYPE_BF16;
  check_mm(c);
}

TEST(GroupedMM, SingleGroup) { check_mm({70, 64, 33, {70}, MXMOE_DTYPE_F32, false, MXMOE_DTYPE_F32, false, false, 3}); }

TEST(GroupedMM, ManyGroups) {
  check_mm({600, 64, 24, jagged_ends(600, 40, 5), MXMOE_DTYPE_F32, false, MXMOE_DTYPE_F32, false, false, 5});
}

TEST(GroupedMM, BiasBothDtypes) {
  for (auto od : {MXMOE_DTYPE_F32, MXMOE_DTYPE_BF16})
    for (auto bd : {MXMOE_DTYPE_F32, MXMOE_DTYPE_BF16})
      check_mm({100, 64, 20, {30, 30, 90}, od, true, bd, false, false, 7});
}

// dgrad: W (G, K, N) quantized along N, used as B (G, N, K) through strides; strided A too.
TEST(GroupedMM, StridedViewsDgrad) {
  for (auto od : {MXMOE_DTYPE_F32, MXMOE_DTYPE_BF16})
    check_mm({130, 128, 48, {10, 64, 129}, od, true, MXMOE_DTYPE_F32, true, true, 9});
}

// Several row, column and reduction tiles, ragged edges everywhere.
TEST(GroupedMM, MultiTileShapes) {
  check_mm({300, 544, 300, {0, 150, 290}, MXMOE_DTYPE_F32, true, MXMOE_DTYPE_F32, false, false, 11});
}

TEST(GroupedMM, RowsOutsideGroupsAreZero) {
  MMCase c{100, 32, 17, {10, 60}};
  MMProblem p = make_mm(c);
  ASSERT_EQ(run_mm(p), MXMOE_OK) << mxmoe_last_error();
  for (int64_t m = 60; m < 100; ++m)
    for (int64_t n = 0; n < 17; ++n) ASSERT_EQ(mxtest::bits_of(p.out.get(m * 17 + n)), 0u) << m;
  // No groups at all: everything is zero.
  MMCase e{40, 32, 8, {}};
  MMProblem q = make_mm(e);
  ASSERT_EQ(run_mm(q), MXMOE_OK) << mxmoe_last_error();
  for (int64_t i = 0; i < q.out.numel(); ++i) ASSERT_EQ(q.out.get(i), 0.0f) << i;
}

// K = 0: the operands have no elements and may have no storage (null data, as the fuzzer passes them):
// every row in a group is its bias, the rest zero, with no pointer arithmetic on the null bases
// (UBSan caught A + offset on null in the tile128 entry, 2026-12-02).
TEST(GroupedMM, EmptyReductionWithoutStorage) {
  for (int tile128 = 0; tile128 < 2; ++tile128) {
    MMCase c{50, 0, 8, {20, 40}};
    c.bias = true;
    MMProblem p = make_mm(c);
    p.av.data = p.asv.data = p.bv.data = p.bsv.data = nullptr;
    p.av.strides[0] = p.asv.strides[0] = 16;  // any strides of a view without elements
    p.bv.strides[0] = p.bsv.strides[0] = 64;
    const mxmoe_status st =
        tile128 ? mxmoe_grouped_mm_tile128(&p.av, &p.asv, &p.bv, &p.bsv, &p.offv, &p.biasv, &p.outv, nullptr, nullptr)
                : run_mm(p);
    ASSERT_EQ(st, MXMOE_OK) << mxmoe_last_error();
    for (int64_t m = 0; m < 50; ++m)
      for (int64_t n = 0; n < 8; ++n) {
        const float want = m < 20 ? p.bias.get(n) : m < 40 ? p.bias.get(8 + n) : 0.0f;
        ASSERT_EQ(p.out.get(m * 8 + n), want) << "tile128=" << tile128 << " m=" << m << " n=" << n;
      }
  }
}

// A NaN scale makes exactly the products it touches NaN.
TEST(GroupedMM, NanScalePropagates) {
  MMCase c{64, 64, 16, {32, 64}};
  MMProblem p = make_mm(c);
  p.as.bytes[5 * 2 + 1] = 0xFF;      // row 5, second K block
  p.bs.bytes[(1 * 16 + 3) * 2] = 0xFF;  // expert 1, column 3, first K block
  ASSERT_EQ(run_mm(p), MXMOE_OK) << mxmoe_last_error();
  for (int64_t m = 0; m < 64; ++m)
    for (int64_t n = 0; n < 16; ++n) {
      const bool nan = m == 5 || (m >= 32 && n == 3);
      EXPECT_EQ(std::isnan(p.out.get(m * 16 + n)), nan) << m << "," << n;
    }
}

// The tiling does not depend on the thread count, so neither do the bits. (The library reads
// MXMOE_NUM_THREADS once per process; mxmoe_reload_env re-reads it.)
TEST(GroupedMM, DeterministicAcrossThreadCounts) {
  MMCase c{300, 288, 100, {0, 140, 300}};
  const char* old = std::getenv("MXMOE_NUM_THREADS");
  const std::string saved = old ? old : "";
  setenv("MXMOE_NUM_THREADS", "1", 1);
  ASSERT_EQ(mxmoe_reload_env(), MXMOE_OK) << mxmoe_last_error();
  MMProblem p1 = make_mm(c);
  ASSERT_EQ(run_mm(p1), MXMOE_OK) << mxmoe_last_error();
  setenv("MXMOE_NUM_THREADS", "3", 1);
  ASSERT_EQ(mxmoe_reload_env(), MXMOE_OK) << mxmoe_last_error();
  MMProblem p3 = make_mm(c);
  ASSERT_EQ(run_mm(p3), MXMOE_OK) << mxmoe_last_error();
  if (old) {
    setenv("MXMOE_NUM_THREADS", saved.c_str(), 1);
  } else {
    unsetenv("MXMOE_NUM_THREADS");
  }
  ASSERT_EQ(mxmoe_reload_env(), MXMOE_OK) << mxmoe_last_error();
  EXPECT_EQ(p1.out.bytes, p3.out.bytes);
}

// ---- grouped_mm_kgroups (wgrad) -----------------------------------------------------------------

namespace {

struct KGCase {
  int64_t N, M, K;
  std::vector<int32_t> offs;
  mxmoe_dtype out_dtype = MXMOE_DTYPE_F32;
  bool strided_a = false;  // A (N, M) viewed from (M, N) storage, as dY^T
  uint32_t seed = 1;
};

void check_kgroups(const KGCase& c) {
  SCOPED_TRACE(testing::Message() << "N=" << c.N << " M=" << c.M << " K=" << c.K << " G=" << c.offs.size());
  std::mt19937 rng(c.seed);
  const int64_t G = static_cast<int64_t>(c.offs.size()), cap = cdiv(c.M, 32) + G;
  Buffer a = random_e4m3({c.N, c.M}, rng), b = random_e4m3({c.K, c.M}, rng);
  Buffer as = random_e8m0({c.N, cap}, rng), bs = random_e8m0({c.K, cap}, rng);
  mxmoe_tensor av = c.strided_a ? strided(a, {c.N, c.M}, {1, c.N}) : a.view();
  mxmoe_tensor bv = b.view(), asv = as.view(), bsv = bs.view();
  Buffer offs = mxtest::offsets(c.offs);
  mxmoe_tensor ov = offs.view();
  Buffer out({G, c.N, c.K}, c.out_dtype, 0xFF);
  mxmoe_tensor outv = out.view();
  ASSERT_EQ(mxmoe_grouped_mm_mx_kgroups(&av, &asv, &bv, &bsv, &ov, &outv, nullptr), MXMOE_OK)
      << mxmoe_last_error();

  const Groups g = groups_of(c.offs, c.M);
  // Token m of group g has scale column block_start[g] + (m - start[g]) / 32; tokens outside every
  // group are never used (their scale column is irrelevant).
  std::vector<int64_t> col_of(static_cast<size_t>(c.M), 0);
  for (int64_t e = 0; e < G; ++e)
    for (int64_t m = g.start[e]; m < g.end[e]; ++m) col_of[m] = g.block_start[e] + (m - g.start[e]) / 32;
  auto col = [&](int64_t, int64_t m) { return col_of[m]; };
  const std::vector<double> ad = dequantized(av, asv, -1, c.N, c.M, col);
  const std::vector<double> bd = dequantized(bv, bsv, -1, c.K, c.M, col);
  Reference want(static_cast<size_t>(G * c.N * c.K), c.M);
  for (int64_t e = 0; e < G; ++e)
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t k = 0; k < c.K; ++k) {
        double acc = 0, mag = 0;
        for (int64_t m = g.start[e]; m < g.end[e]; ++m) {
          const double t = ad[n * c.M + m] * bd[k * c.M + m];
          acc += t;
          mag += std::fabs(t);
        }
        want.val[(e * c.N + n) * c.K + k] = acc;
        want.mag[(e * c.N + n) * c.K + k] = mag;
      }
  expect_close(out, want);
  // Empty groups are exactly zero, not just small.
  for (int64_t e = 0; e < G; ++e) {
    if (g.end[e] != g.start[e]) continue;
    for (int64_t i = 0; i < c.N * c.K; ++i) ASSERT_EQ(mxtest::bits_of(out.get(e * c.N * c.K + i)), 0u) << e;
  }
}

}  // namespace

TEST(GroupedMMKGroups, PartialBlocksF32) {
  // Group sizes 0, 45, 0, 33, 7: partial last blocks; offs[G-1] = 85 < M.
  check_kgroups({40, 100, 24, {0, 45, 45, 78, 85}});
}

TEST(GroupedMMKGroups, PartialBlocksBf16) {
  check_kgroups({40, 100, 24, {0, 45, 45, 78, 85}, MXMOE_DTYPE_BF16});
}

TEST(GroupedMMKGroups, SingleGroupAndManyGroups) {
  check_kgroups({17, 64, 20, {64}, MXMOE_DTYPE_F32, false, 2});
  check_kgroups({12, 700, 9, jagged_ends(700, 36, 3), MXMOE_DTYPE_F32, false, 3});
}

TEST(GroupedMMKGroups, StridedAAndMultiTile) {
  check_kgroups({270, 600, 280, {300, 301, 590}, MXMOE_DTYPE_F32, true, 4});
}

TEST(GroupedMMKGroups, NanScalePropagates) {
  std::mt19937 rng(5);
  const int64_t N = 8, M = 64, K = 8, G = 2, cap = 2 + G;
  Buffer a = random_e4m3({N, M}, rng), b = random_e4m3({K, M}, rng);
  Buffer as = random_e8m0({N, cap}, rng), bs = random_e8m0({K, cap}, rng);
  as.bytes[3 * cap + 1] = 0xFF;  // row 3, group 1's block (groups of 32: block_start = {0, 1})
  Buffer offs = mxtest::offsets({32, 64}), out({G, N, K}, MXMOE_DTYPE_F32, 0xFF);
  mxmoe_tensor av = a.view(), bv = b.view(), asv = as.view(), bsv = bs.view(), ov = offs.view(), outv = out.view();
  ASSERT_EQ(mxmoe_grouped_mm_mx_kgroups(&av, &asv, &bv, &bsv, &ov, &outv, nullptr), MXMOE_OK) << mxmoe_last_error();
  for (int64_t e = 0; e < G; ++e)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        EXPECT_EQ(std::isnan(out.get((e * N + n) * K + k)), e == 1 && n == 3) << e << n << k;
}
