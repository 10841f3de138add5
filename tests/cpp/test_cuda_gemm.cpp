// GPU grouped GEMMs against the CPU core reference (the C API on host copies):
//  - the generic 1x32 kernels (mxmoe_grouped_mm_mx / _kgroups on CUDA): bit for bit;
//  - the tile128 Hopper FP8 kernels (mxmoe_grouped_mm_tile128 / _kgroups), f32 output:
//      * on operands whose 128-long partial sums the FP8 tensor cores hold exactly (e4m3 values
//        +-1, +-1.5, scales within 2^+-2): relative Frobenius error <= 1e-6 (in practice 0: equal
//        to the CPU reference bit for bit), which pins indexing, scales, groups, tails and bias;
//      * on random e4m3 bytes over the whole range, and on e4m3 of normal data: <= 5e-4. Hopper's
//        FP8 wgmma adds the products of each instruction with a limited-precision aligned sum
//        (about 14 bits kept, DeepSeek-V3 report sec. 3.3.2) before the fp32 promotion every 128 of
//        K, so the fp32-accumulation bar of 1e-5 is out of reach of any FP8-tensor-core kernel here
//        (measured 1.7-2.2e-4 with full-range random bytes; see docs/perf/gemm.md);
//    bf16 output within bf16 rounding of the f32 reference.
// Operands are built directly as coarse MX tensors: random e4m3 bytes (no NaN codes) and random
// scale bytes constant over each coarse block (1x128 along the reduction, 128x128 weight tiles).
// Skips without a CUDA device; the tile128 tests skip where the call reports UNSUPPORTED (no
// Hopper GPU or no CUTLASS in the build).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/moe_activation.hpp"
#include "mxmoe/mxmoe.h"
#include "test_util.hpp"

using mxtest::Buffer;

namespace {

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// A device copy of a host buffer (or an uninitialized one of the same shape).
struct DevBuf {
  Buffer host;  // shape/dtype holder (and the bytes that were copied up)
  void* ptr = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(const Buffer& h, bool copy = true) : host(h) {
    bytes = h.bytes.size();
    if (cudaMalloc(&ptr, std::max<size_t>(bytes, 16)) != cudaSuccess) ptr = nullptr;
    if (copy && bytes) cudaMemcpy(ptr, h.bytes.data(), bytes, cudaMemcpyHostToDevice);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (ptr) cudaFree(ptr);
  }
  mxmoe_tensor view() {
    mxmoe_tensor t = host.view();
    t.data = ptr;
    t.device = 0;
    return t;
  }
  Buffer download() const {
    Buffer h = host;
    if (bytes) cudaMemcpy(h.bytes.data(), ptr, bytes, cudaMemcpyDeviceToHost);
    return h;
  }
  void poison() {
    if (bytes) cudaMemset(ptr, 0xFF, bytes);  // NaN in bf16 and f32: every element must be written
  }
};

struct Workspace {
  void* ptr = nullptr;
  int64_t bytes = 0;
  explicit Workspace(int64_t n) : bytes(n) {
    if (n > 0 && cudaMalloc(&ptr, static_cast<size_t>(n)) != cudaSuccess) ptr = nullptr;
  }
  ~Workspace() {
    if (ptr) cudaFree(ptr);
  }
  mxmoe_tensor view() const {
    mxmoe_tensor t{};
    t.data = ptr;
    t.dtype = MXMOE_DTYPE_E4M3;  // any 1-byte dtype
    t.ndim = 1;
    t.shape[0] = bytes;
    t.strides[0] = 1;
    t.device = 0;
    return t;
  }
};

// Operand data: full-range random bytes, an exactly-summable grid, or e4m3 of normal samples.
enum class Data { kFullRange, kExactGrid, kNormal };
Data g_data = Data::kFullRange;  // set per case by the runners below

uint8_t random_e4m3(std::mt19937& rng) {
  if (g_data == Data::kExactGrid)  // +-1 or +-1.5: 128-long partials are exact in the FP8 MMA
    return static_cast<uint8_t>((rng() & 0x80) | 0x38 | ((rng() & 1) ? 4 : 0));
  if (g_data == Data::kNormal) {
    std::normal_distribution<float> nd(0.f, 64.f);
    for (;;) {
      const uint8_t b = mxmoe_e4m3_from_float(nd(rng));
      if ((b & 0x7F) != 0x7F) return b;
    }
  }
  for (;;) {
    const uint8_t b = static_cast<uint8_t>(rng() & 0xFF);
    if ((b & 0x7F) != 0x7F) return b;
  }
}

uint8_t random_scale(std::mt19937& rng) {
  if (g_data == Data::kExactGrid) return static_cast<uint8_t>(125 + rng() % 5);  // 2^-2 .. 2^2
  return static_cast<uint8_t>(118 + rng() % 19);                                  // 2^-9 .. 2^9
}

Buffer random_e4m3_buffer(std::vector<int64_t> shape, std::mt19937& rng) {
  Buffer b(std::move(shape), MXMOE_DTYPE_E4M3);
  for (auto& v : b.bytes) v = random_e4m3(rng);
  return b;
}

const char* data_name() {
  return g_data == Data::kExactGrid ? " exact-grid" : (g_data == Data::kNormal ? " normal" : " full-range");
}

double tolerance(mxmoe_dtype out) {
  if (out == MXMOE_DTYPE_BF16) return 4e-3;         // bf16 rounding of the result
  return g_data == Data::kExactGrid ? 1e-6 : 5e-4;  // see the header comment
}

// (R, C/32) scales, 1x128 blocks along C: the byte of block c/128 repeated over its 32-runs.
Buffer rowwise_scales_1x128(int64_t rows, int64_t cols, std::mt19937& rng) {
  Buffer s({rows, cols / 32}, MXMOE_DTYPE_E8M0);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t v = 0;
    for (int64_t j = 0; j < cols / 32; ++j) {
      if (j % 4 == 0) v = random_scale(rng);
      s.bytes[r * (cols / 32) + j] = v;
    }
  }
  return s;
}

// (G, R, C/32) scales, 128x128 tiles: one byte per (g, r/128, c/128).
Buffer tile_scales_128x128(int64_t g, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t nc = cols / 32, tr = (rows + 127) / 128, tc = (cols + 127) / 128;
  std::vector<uint8_t> tiles(static_cast<size_t>(g * tr * tc));
  for (auto& v : tiles) v = random_scale(rng);
  Buffer s({g, rows, nc}, MXMOE_DTYPE_E8M0);
  for (int64_t e = 0; e < g; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < nc; ++j)
        s.bytes[(e * rows + r) * nc + j] = tiles[(e * tr + r / 128) * tc + j / 4];
  return s;
}

// (R, cap) grouped compact scales along tokens, 1x128 blocks starting at each group's first token.
Buffer grouped_token_scales_1x128(int64_t rows, const std::vector<int32_t>& sizes, int64_t m, std::mt19937& rng) {
  const int64_t cap = mxmoe_grouped_scale_capacity(m, static_cast<int64_t>(sizes.size()));
  Buffer s({rows, cap}, MXMOE_DTYPE_E8M0, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t blk = 0;
    for (int32_t len : sizes) {
      const int64_t runs = (len + 31) / 32;
      uint8_t v = 0;
      for (int64_t j = 0; j < runs; ++j) {
        if (j % 4 == 0) v = random_scale(rng);
        s.bytes[r * cap + blk + j] = v;
      }
      blk += runs;
    }
  }
  return s;
}

std::vector<int32_t> ends_of(const std::vector<int32_t>& sizes) {
  std::vector<int32_t> e(sizes.size());
  int32_t acc = 0;
  for (size_t i = 0; i < sizes.size(); ++i) e[i] = acc += sizes[i];
  return e;
}

// Random group sizes summing to `used` (some empty when `empties`).
std::vector<int32_t> random_sizes(int g, int32_t used, std::mt19937& rng, bool empties) {
  std::vector<int32_t> cuts(g - 1);
  for (auto& c : cuts) c = static_cast<int32_t>(rng() % (used + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int32_t> sizes(g);
  int32_t prev = 0;
  for (int i = 0; i < g - 1; ++i) {
    sizes[i] = cuts[i] - prev;
    prev = cuts[i];
  }
  sizes[g - 1] = used - prev;
  if (empties && g >= 3) {  // force a couple of empty groups
    sizes[1] += sizes[0];
    sizes[0] = 0;
    sizes[g - 1] += sizes[g - 2];
    sizes[g - 2] = 0;
  }
  return sizes;
}

double rel_frobenius(const Buffer& got, const Buffer& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.get(i), d = got.get(i) - r;
    num += d * d;
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

int64_t count_nonfinite(const Buffer& b) {
  int64_t n = 0;
  for (int64_t i = 0; i < b.numel(); ++i) n += !std::isfinite(b.get(i));
  return n;
}

// ---- the tile128 forward/dgrad case ---------------------------------------------------------------
struct FwdCase {
  int64_t m, n, k;
  std::vector<int32_t> sizes;  // group sizes (sum <= m; the rest are tail rows)
  mxmoe_dtype out;
  bool bias;
};

std::string describe(const FwdCase& c) {
  return "M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
         " G=" + std::to_string(c.sizes.size()) + (c.out == MXMOE_DTYPE_BF16 ? " bf16" : " f32") +
         (c.bias ? " bias" : "") + data_name();
}

// Returns false (after GTEST_SKIP-worthy message) when the device path is unsupported.
void run_fwd_case(const FwdCase& c, uint32_t seed, bool* unsupported) {
  std::mt19937 rng(seed);
  const int64_t G = static_cast<int64_t>(c.sizes.size());
  Buffer a = random_e4m3_buffer({c.m, c.k}, rng);
  Buffer as = rowwise_scales_1x128(c.m, c.k, rng);
  Buffer b = random_e4m3_buffer({G, c.n, c.k}, rng);
  Buffer bs = tile_scales_128x128(G, c.n, c.k, rng);
  Buffer offs = mxtest::offsets(ends_of(c.sizes));
  Buffer bias({G, c.n}, MXMOE_DTYPE_BF16);
  std::normal_distribution<float> nd(0.f, 4.f);
  for (int64_t i = 0; i < bias.numel(); ++i)
    bias.set(i, g_data == Data::kExactGrid ? static_cast<float>(static_cast<int>(rng() % 64) - 32) / 4 : nd(rng));

  // CPU reference, f32 output.
  Buffer ref({c.m, c.n}, MXMOE_DTYPE_F32);
  {
    auto va = a.view(), vas = as.view(), vb = b.view(), vbs = bs.view(), vo = offs.view(), vbias = bias.view(),
         vr = ref.view();
    ASSERT_EQ(mxmoe_grouped_mm_tile128(&va, &vas, &vb, &vbs, &vo, c.bias ? &vbias : nullptr, &vr, nullptr, nullptr),
              MXMOE_OK)
        << mxmoe_last_error();
  }
  DevBuf da(a), das(as), db(b), dbs(bs), doffs(offs), dbias(bias);
  DevBuf dout(Buffer({c.m, c.n}, c.out), false);
  dout.poison();
  const int64_t need = mxmoe_grouped_mm_tile128_workspace_size(c.m, c.n, c.k, G, 0);
  if (need < 0) {
    *unsupported = true;
    return;
  }
  Workspace ws(need);
  auto va = da.view(), vas = das.view(), vb = db.view(), vbs = dbs.view(), vo = doffs.view(), vbias = dbias.view(),
       vout = dout.view(), vws = ws.view();
  const mxmoe_status st = mxmoe_grouped_mm_tile128(&va, &vas, &vb, &vbs, &vo, c.bias ? &vbias : nullptr, &vout, &vws,
                                                   nullptr);
  if (st == MXMOE_ERR_UNSUPPORTED) {
    *unsupported = true;
    return;
  }
  ASSERT_EQ(st, MXMOE_OK) << mxmoe_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Buffer got = dout.download();
  ASSERT_EQ(count_nonfinite(got), 0) << describe(c);
  const int64_t used = std::accumulate(c.sizes.begin(), c.sizes.end(), int64_t{0});
  for (int64_t i = used * c.n; i < c.m * c.n; ++i) ASSERT_EQ(got.get(i), 0.0f) << "tail row element " << i;
  const double err = rel_frobenius(got, ref);
  EXPECT_LE(err, tolerance(c.out)) << describe(c);
  std::printf("  [tile128 fwd] %s: rel Frobenius error %.3g\n", describe(c).c_str(), err);
}

struct KgCase {
  int64_t n, k;
  std::vector<int32_t> sizes;  // sum = M
  mxmoe_dtype out;
  int64_t m_extra = 0;  // tokens past the last group
};

std::string describe(const KgCase& c) {
  const int64_t m = std::accumulate(c.sizes.begin(), c.sizes.end(), int64_t{0}) + c.m_extra;
  return "M=" + std::to_string(m) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
         " G=" + std::to_string(c.sizes.size()) + (c.out == MXMOE_DTYPE_BF16 ? " bf16" : " f32") + data_name();
}

void run_kg_case(const KgCase& c, uint32_t seed, bool* unsupported) {
  std::mt19937 rng(seed);
  const int64_t G = static_cast<int64_t>(c.sizes.size());
  const int64_t M = std::accumulate(c.sizes.begin(), c.sizes.end(), int64_t{0}) + c.m_extra;
  Buffer a = random_e4m3_buffer({c.n, M}, rng);
  Buffer as = grouped_token_scales_1x128(c.n, c.sizes, M, rng);
  Buffer b = random_e4m3_buffer({c.k, M}, rng);
  Buffer bs = grouped_token_scales_1x128(c.k, c.sizes, M, rng);
  Buffer offs = mxtest::offsets(ends_of(c.sizes));
  Buffer ref({G, c.n, c.k}, MXMOE_DTYPE_F32);
  {
    auto va = a.view(), vas = as.view(), vb = b.view(), vbs = bs.view(), vo = offs.view(), vr = ref.view();
    ASSERT_EQ(mxmoe_grouped_mm_tile128_kgroups(&va, &vas, &vb, &vbs, &vo, &vr, nullptr, nullptr), MXMOE_OK)
        << mxmoe_last_error();
  }
  DevBuf da(a), das(as), db(b), dbs(bs), doffs(offs);
  DevBuf dout(Buffer({G, c.n, c.k}, c.out), false);
  dout.poison();
  const int64_t need = mxmoe_grouped_mm_tile128_kgroups_workspace_size(M, c.n, c.k, G, 0);
  if (need < 0) {
    *unsupported = true;
    return;
  }
  Workspace ws(need);
  auto va = da.view(), vas = das.view(), vb = db.view(), vbs = dbs.view(), vo = doffs.view(), vout = dout.view(),
       vws = ws.view();
  const mxmoe_status st = mxmoe_grouped_mm_tile128_kgroups(&va, &vas, &vb, &vbs, &vo, &vout, &vws, nullptr);
  if (st == MXMOE_ERR_UNSUPPORTED) {
    *unsupported = true;
    return;
  }
  ASSERT_EQ(st, MXMOE_OK) << mxmoe_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Buffer got = dout.download();
  ASSERT_EQ(count_nonfinite(got), 0) << describe(c);
  {
    // The operand-based query: at most the shape-only size, and enough: the same path, the same bits.
    const int64_t need_for =
        mxmoe_grouped_mm_tile128_kgroups_workspace_size_for(&va, &vas, &vb, &vbs, &vo, &vout, 0);
    ASSERT_GE(need_for, 0) << mxmoe_last_error();
    EXPECT_LE(need_for, need) << describe(c);
    DevBuf dout2(Buffer({G, c.n, c.k}, c.out), false);
    dout2.poison();
    Workspace ws2(std::max<int64_t>(need_for, 1));
    auto vout2 = dout2.view(), vws2 = ws2.view();
    vws2.shape[0] = need_for;  // exactly the queried bytes
    ASSERT_EQ(mxmoe_grouped_mm_tile128_kgroups(&va, &vas, &vb, &vbs, &vo, &vout2, &vws2, nullptr), MXMOE_OK)
        << mxmoe_last_error() << " " << describe(c);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dout2.download().bytes == got.bytes) << "workspace_size_for's size: " << describe(c);
  }
  {
    // In place (no staging copies): M % 16 != 0 is refused; else groups at multiples of 16 tokens give
    // the staged call's bits, and one starting elsewhere the same bits where the own kernel runs and
    // NaN where CUTLASS runs (it cannot read that group where it lies).
    const int64_t need_ip =
        mxmoe_grouped_mm_tile128_kgroups_workspace_size_for(&va, &vas, &vb, &vbs, &vo, &vout, 1);
    if (M % 16 != 0) {
      EXPECT_EQ(need_ip, -1) << describe(c);
      EXPECT_NE(std::string(mxmoe_last_error()).find("multiple of 16"), std::string::npos) << mxmoe_last_error();
    } else {
      ASSERT_GE(need_ip, 0) << mxmoe_last_error();
      DevBuf dout3(Buffer({G, c.n, c.k}, c.out), false);
      dout3.poison();
      Workspace ws3(std::max<int64_t>(need_ip, 1));
      auto vout3 = dout3.view(), vws3 = ws3.view();
      vws3.shape[0] = need_ip;
      ASSERT_EQ(mxmoe_grouped_mm_tile128_kgroups_in_place(&va, &vas, &vb, &vbs, &vo, &vout3, &vws3, nullptr),
                MXMOE_OK)
          << mxmoe_last_error() << " " << describe(c);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      char cfg[MXMOE_CONFIG_TEXT_MAX];
      ASSERT_EQ(mxmoe_sm90_gemm_config(MXMOE_GEMM_GROUPED_K, M, c.n, c.k, G, c.out, cfg, sizeof cfg), MXMOE_OK);
      const bool own = std::string(cfg).find("impl=own") != std::string::npos;
      const Buffer got3 = dout3.download();
      const int64_t per = c.n * c.k, esz = c.out == MXMOE_DTYPE_BF16 ? 2 : 4;
      int64_t start = 0;
      for (int64_t g = 0; g < G; ++g) {
        const bool unreadable = !own && c.sizes[g] > 0 && start % 16 != 0;
        if (unreadable) {
          for (int64_t i = 0; i < per; ++i)
            ASSERT_TRUE(std::isnan(got3.get(g * per + i))) << "group " << g << " in place: " << describe(c);
        } else {
          EXPECT_EQ(std::memcmp(got3.bytes.data() + g * per * esz, got.bytes.data() + g * per * esz,
                                static_cast<size_t>(per * esz)),
                    0)
              << "group " << g << " in place (" << cfg << "): " << describe(c);
        }
        start += c.sizes[g];
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    if (c.sizes[g] != 0) continue;
    for (int64_t i = 0; i < c.n * c.k; ++i) ASSERT_EQ(got.get(g * c.n * c.k + i), 0.0f) << "empty group " << g;
  }
  const double err = rel_frobenius(got, ref);
  EXPECT_LE(err, tolerance(c.out)) << describe(c);
  std::printf("  [tile128 wgrad] %s: rel Frobenius error %.3g\n", describe(c).c_str(), err);
}

}  // namespace

// ---- generic 1x32 kernels: bit-exact against the CPU reference -----------------------------------

TEST(CudaGemm, GenericGroupedMmMatchesCpuBitwise) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(11);
  const int64_t M = 300, N = 96, K = 160, G = 5;
  const std::vector<int32_t> sizes = {0, 70, 1, 130, 0};  // 99 tail rows
  Buffer a = random_e4m3_buffer({M, K}, rng), b = random_e4m3_buffer({G, N, K}, rng);
  Buffer as({M, K / 32}, MXMOE_DTYPE_E8M0), bs({G, N, K / 32}, MXMOE_DTYPE_E8M0);
  for (auto& v : as.bytes) v = random_scale(rng);
  for (auto& v : bs.bytes) v = random_scale(rng);
  Buffer offs = mxtest::offsets(ends_of(sizes));
  Buffer bias({G, N}, MXMOE_DTYPE_F32);
  for (int64_t i = 0; i < bias.numel(); ++i) bias.set(i, static_cast<float>(rng() % 100) - 50.f);
  for (mxmoe_dtype dt : {MXMOE_DTYPE_F32, MXMOE_DTYPE_BF16}) {
    Buffer ref({M, N}, dt);
    auto va = a.view(), vas = as.view(), vb = b.view(), vbs = bs.view(), vo = offs.view(), vbias = bias.view(),
         vr = ref.view();
    ASSERT_EQ(mxmoe_grouped_mm_mx(&va, &vas, &vb, &vbs, &vo, &vbias, &vr, nullptr), MXMOE_OK) << mxmoe_last_error();
    DevBuf da(a), das(as), db(b), dbs(bs), doffs(offs), dbias(bias), dout(Buffer({M, N}, dt), false);
    dout.poison();
    auto wa = da.view(), was = das.view(), wb = db.view(), wbs = dbs.view(), wo = doffs.view(), wbias = dbias.view(),
         wout = dout.view();
    ASSERT_EQ(mxmoe_grouped_mm_mx(&wa, &was, &wb, &wbs, &wo, &wbias, &wout, nullptr), MXMOE_OK) << mxmoe_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Buffer got = dout.download();
    EXPECT_EQ(got.bytes, ref.bytes);
  }
}

TEST(CudaGemm, GenericKgroupsMatchesCpuBitwise) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(12);
  const std::vector<int32_t> sizes = {37, 0, 100, 1, 64};
  const int64_t M = 202, N = 80, K = 72, G = 5;
  const int64_t cap = mxmoe_grouped_scale_capacity(M, G);
  Buffer a = random_e4m3_buffer({N, M}, rng), b = random_e4m3_buffer({K, M}, rng);
  Buffer as({N, cap}, MXMOE_DTYPE_E8M0), bs({K, cap}, MXMOE_DTYPE_E8M0);
  for (auto& v : as.bytes) v = random_scale(rng);
  for (auto& v : bs.bytes) v = random_scale(rng);
  Buffer offs = mxtest::offsets(ends_of(sizes));
  for (mxmoe_dtype dt : {MXMOE_DTYPE_F32, MXMOE_DTYPE_BF16}) {
    Buffer ref({G, N, K}, dt);
    auto va = a.view(), vas = as.view(), vb = b.view(), vbs = bs.view(), vo = offs.view(), vr = ref.view();
    ASSERT_EQ(mxmoe_grouped_mm_mx_kgroups(&va, &vas, &vb, &vbs, &vo, &vr, nullptr), MXMOE_OK) << mxmoe_last_error();
    DevBuf da(a), das(as), db(b), dbs(bs), doffs(offs), dout(Buffer({G, N, K}, dt), false);
    dout.poison();
    auto wa = da.view(), was = das.view(), wb = db.view(), wbs = dbs.view(), wo = doffs.view(), wout = dout.view();
    ASSERT_EQ(mxmoe_grouped_mm_mx_kgroups(&wa, &was, &wb, &wbs, &wo, &wout, nullptr), MXMOE_OK) << mxmoe_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dout.download().bytes, ref.bytes);
  }
}

// ---- tile128 FP8 kernels -------------------------------------------------------------------------

// Library variables for one scope: the library reads the environment once per process, so each
// change is followed by mxmoe_reload_env.
struct EnvGuard {
  std::vector<std::pair<std::string, std::string>> saved;
  std::vector<std::string> unset_names;
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    if (old) saved.emplace_back(name, old); else unset_names.emplace_back(name);
    setenv(name, value, 1);
    EXPECT_EQ(mxmoe_reload_env(), MXMOE_OK) << mxmoe_last_error();
  }
  ~EnvGuard() {
    for (auto& kv : saved) setenv(kv.first.c_str(), kv.second.c_str(), 1);
    for (auto& n : unset_names) unsetenv(n.c_str());
    EXPECT_EQ(mxmoe_reload_env(), MXMOE_OK) << mxmoe_last_error();
  }
};

TEST(CudaGemmTile128, SmallForwardAndWgrad) {  // the compute-sanitizer case
  SKIP_WITHOUT_CUDA();
  g_data = Data::kExactGrid;  // exact: any indexing or scale slip shows
  bool unsupported = false;
  run_fwd_case({200, 96, 160, {0, 70, 81, 0}, MXMOE_DTYPE_F32, true}, 1, &unsupported);
  if (unsupported) GTEST_SKIP() << "tile128 GEMMs unsupported here: " << mxmoe_last_error();
  for (const char* block_n : {"160", "192"}) {  // the own forward kernel's wider tiles: scale tiles straddled,
    EnvGuard env;                                 // 64-byte TMA-store boxes (160, bf16), partial and whole
    env.set("MXMOE_GEMM_SM90", "mxmoe-only");     // warpgroup halves, tail rows, CTA pairs
    env.set("MXMOE_GEMM_BLOCK_N", block_n);
    env.set("MXMOE_GEMM_CLUSTER", "2");
    run_fwd_case({400, 352, 256, {130, 0, 200}, MXMOE_DTYPE_BF16, true}, 5, &unsupported);
  }
  for (const char* producer : {"thread", "warp"}) {
    EnvGuard env;  // BlockN 128 with one more stage (the lean layout: scan storage in the epilogue buffer),
    env.set("MXMOE_GEMM_SM90", "mxmoe-only");  // with either producer
    env.set("MXMOE_GEMM_EXTRA_STAGE", "1");
    env.set("MXMOE_GEMM_PRODUCER", producer);
    env.set("MXMOE_GEMM_CLUSTER", "2");
    run_fwd_case({400, 352, 256, {130, 0, 200}, MXMOE_DTYPE_BF16, true}, 6, &unsupported);
  }
  run_kg_case({96, 160, {37, 0, 130, 5}, MXMOE_DTYPE_F32, 3}, 2, &unsupported);  // M % 16 != 0: CUTLASS
  for (const char* producer : {"thread", "warp"}) {
    for (const char* cluster : {"1", "2", "4"}) {
      EnvGuard env;  // the own wgrad kernel: unaligned group starts, tails, an empty group; at cluster 2
      env.set("MXMOE_GEMM_SM90", "mxmoe-only");  // 1 x 2 tiles per group: a ghost re-runs the edge tile
      env.set("MXMOE_GEMM_CLUSTER", cluster);
      env.set("MXMOE_GEMM_PRODUCER", producer);  // thread (default) or warp 0 with an elected lane
      run_kg_case({96, 160, {37, 0, 130, 5}, MXMOE_DTYPE_F32, 4}, 3, &unsupported);
      run_kg_case({200, 96, {37, 0, 130, 5}, MXMOE_DTYPE_BF16, 4}, 4, &unsupported);  // shared B, multicast
    }
  }
  g_data = Data::kFullRange;
}

// Forward / dgrad through the CUTLASS kernel (the default picks the own kernel, which OwnSm90Kernel
// covers).
TEST(CudaGemmTile128, Forward) {
  SKIP_WITHOUT_CUDA();
  EnvGuard env;
  env.set("MXMOE_GEMM_SM90", "cutlass");
  std::mt19937 rng(5);
  std::vector<FwdCase> cases = {
      {300, 160, 224, {300}, MXMOE_DTYPE_F32, false},                  // G = 1, N and K not multiples of 128
      {300, 160, 224, {257}, MXMOE_DTYPE_BF16, true},                  // tail rows
      {1000, 256, 384, {0, 129, 500, 0, 300}, MXMOE_DTYPE_F32, true},  // empty groups, M tails
      {1000, 256, 384, {0, 129, 500, 0, 300}, MXMOE_DTYPE_BF16, false},
      {2048, 512, 1024, random_sizes(8, 2000, rng, false), MXMOE_DTYPE_F32, false},
      {1500, 96, 288, random_sizes(64, 1400, rng, true), MXMOE_DTYPE_F32, true},  // G = 64
      {1500, 96, 288, random_sizes(64, 1500, rng, true), MXMOE_DTYPE_BF16, true},
      {256, 128, 128, {0, 0, 0}, MXMOE_DTYPE_F32, true},  // every group empty: all rows are tail
  };
  uint32_t seed = 100;
  for (Data d : {Data::kExactGrid, Data::kFullRange, Data::kNormal}) {
    g_data = d;
    for (const auto& c : cases) {
      bool unsupported = false;
      run_fwd_case(c, seed++, &unsupported);
      if (unsupported) GTEST_SKIP() << "tile128 GEMMs unsupported here: " << mxmoe_last_error();
    }
  }
  g_data = Data::kFullRange;
}

// Dgrad is the same kernel with A = dY (M, N_model) in 1x128 blocks along N_model and B = the
// transposed weight copy (G, K_model, N_model) whose 128x128 tiles are the forward tiles transposed.
TEST(CudaGemmTile128, DgradShapes) {
  SKIP_WITHOUT_CUDA();
  EnvGuard env;
  env.set("MXMOE_GEMM_SM90", "cutlass");
  std::mt19937 rng(6);
  std::vector<FwdCase> cases = {
      {777, 352, 416, random_sizes(4, 700, rng, true), MXMOE_DTYPE_F32, false},
      {777, 352, 416, random_sizes(16, 777, rng, false), MXMOE_DTYPE_BF16, false},
  };
  uint32_t seed = 200;
  for (Data d : {Data::kExactGrid, Data::kFullRange}) {
    g_data = d;
    for (const auto& c : cases) {
      bool unsupported = false;
      run_fwd_case(c, seed++, &unsupported);
      if (unsupported) GTEST_SKIP() << "tile128 GEMMs unsupported here: " << mxmoe_last_error();
    }
  }
  g_data = Data::kFullRange;
}

// The own sm_90a M-grouped kernel (src/core/cuda/gemm/sm90/) forced through MXMOE_GEMM_SM90: the same
// forward and dgrad cases, with "mxmoe-only" so a call the kernel does not take fails instead of
// falling back to CUTLASS, at both cluster sizes (B multicast on / off) and both tile widths.
TEST(CudaGemmTile128, OwnSm90Kernel) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(8);
  std::vector<FwdCase> cases = {
      {300, 160, 224, {257}, MXMOE_DTYPE_BF16, true},                  // tail rows, N, K not multiples of 128
      {1000, 256, 384, {0, 129, 500, 0, 300}, MXMOE_DTYPE_F32, true},  // empty groups, odd m-tile counts
      {2048, 512, 1024, random_sizes(8, 2000, rng, false), MXMOE_DTYPE_F32, false},
      {1500, 96, 288, random_sizes(64, 1400, rng, true), MXMOE_DTYPE_BF16, true},  // G = 64, N < 128
      {777, 352, 416, random_sizes(16, 777, rng, false), MXMOE_DTYPE_F32, false},  // dgrad-like shape
      {256, 128, 128, {0, 0, 0}, MXMOE_DTYPE_F32, true},                            // all rows are tail
      {100, 576, 256, {100}, MXMOE_DTYPE_F32, false},  // 5 (BlockN 128), 4 (160: tile starts 0/32/64/96 mod 128) or 3 (192) tiles
      {3000, 256, 256, {2500, 3000}, MXMOE_DTYPE_BF16, true},  // groups of > 1024 rows: several bands, a short last one
  };
  uint32_t seed = 300;
  // BlockN 128 / 160 / 192, and 128 with one more stage (the lean shared-memory layout) and / or the
  // warp producer: {BlockN, MXMOE_GEMM_EXTRA_STAGE, MXMOE_GEMM_PRODUCER}.
  struct Tile {
    const char *block_n, *extra_stage, *producer;
  };
  const Tile tiles[] = {{"128", "0", "thread"}, {"160", "0", "thread"}, {"192", "0", "thread"},
                        {"128", "1", "thread"}, {"128", "0", "warp"},   {"128", "1", "warp"}};
  for (const char* cluster : {"2", "1"}) {
    for (const auto& [block_n, extra_stage, producer] : tiles) {
      EnvGuard env;
      env.set("MXMOE_GEMM_SM90", "mxmoe-only");
      env.set("MXMOE_GEMM_CLUSTER", cluster);
      env.set("MXMOE_GEMM_BLOCK_N", block_n);
      env.set("MXMOE_GEMM_EXTRA_STAGE", extra_stage);
      env.set("MXMOE_GEMM_PRODUCER", producer);
      for (Data d : {Data::kExactGrid, Data::kFullRange}) {
        g_data = d;
        for (const auto& c : cases) {
          SCOPED_TRACE(std::string("cluster ") + cluster + ", BlockN " + block_n + ", extra stage " + extra_stage +
                       ", producer " + producer);
          bool unsupported = false;
          run_fwd_case(c, seed++, &unsupported);
          if (unsupported) GTEST_SKIP() << "tile128 GEMMs unsupported here: " << mxmoe_last_error();
        }
      }
    }
  }
  g_data = Data::kFullRange;
}

// Wgrad through the CUTLASS kernel (the default; OwnSm90Wgrad covers the own K-grouped kernel).
TEST(CudaGemmTile128, Wgrad) {
  SKIP_WITHOUT_CUDA();
  EnvGuard env;
  env.set("MXMOE_GEMM_SM90", "cutlass");
  std::mt19937 rng(7);
  std::vector<KgCase> cases = {
      {160, 224, {1000}, MXMOE_DTYPE_F32},                        // G = 1, in place (M % 16 == 0)
      {160, 224, {37, 0, 300, 1, 662}, MXMOE_DTYPE_F32},          // sizes not multiples of 32: staged
      {160, 224, {37, 0, 300, 1, 662}, MXMOE_DTYPE_BF16, 5},      // M % 16 != 0: every group staged
      {256, 128, {128, 256, 0, 512, 64}, MXMOE_DTYPE_F32},        // all starts aligned: in place
      {96, 288, random_sizes(64, 3000, rng, true), MXMOE_DTYPE_F32},  // G = 64
      {384, 512, random_sizes(8, 4096, rng, false), MXMOE_DTYPE_BF16},
      {64, 64, {0, 0}, MXMOE_DTYPE_F32, 7},                        // all empty: zeros
  };
  uint32_t seed = 300;
  for (Data d : {Data::kExactGrid, Data::kFullRange, Data::kNormal}) {
    g_data = d;
    for (const auto& c : cases) {
      bool unsupported = false;
      run_kg_case(c, seed++, &unsupported);
      if (unsupported) GTEST_SKIP() << "tile128 GEMMs unsupported here: " << mxmoe_last_error();
    }
  }
  g_data = Data::kFullRange;
}

// The own sm_90a K-grouped (wgrad) kernel forced with "mxmoe-only" (a call it does not take fails
// instead of falling back to CUTLASS), at every cluster size (2 x 2: A and B multicast; 2 x 1: B;
// none), ghost tiles where a group's tiles do not fill the cluster's blocks.
// M % 16 == 0 everywhere (its TMA row strides); group starts are anywhere, so partial k-blocks whose
// last tokens belong to the next group are the common case.
TEST(CudaGemmTile128, OwnSm90Wgrad) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(10);
  std::vector<KgCase> cases = {
      {160, 224, {1008}, MXMOE_DTYPE_F32},                       // G = 1, N, K not multiples of 128, a tail
      {160, 224, {37, 0, 300, 1, 662}, MXMOE_DTYPE_F32, 8},      // unaligned starts, empty group, tokens past
      {160, 224, {37, 0, 300, 1, 662}, MXMOE_DTYPE_BF16, 8},
      {256, 128, {128, 256, 0, 512, 64}, MXMOE_DTYPE_F32},       // aligned starts
      {96, 288, random_sizes(64, 3000, rng, true), MXMOE_DTYPE_F32, 8},  // G = 64, N < 128
      {384, 512, random_sizes(8, 4096, rng, false), MXMOE_DTYPE_BF16},
      {136, 528, {2000, 48}, MXMOE_DTYPE_BF16},                  // 16 k-blocks, partial m- and n-tiles
      {512, 1024, random_sizes(16, 8192, rng, false), MXMOE_DTYPE_F32},  // 512 tiles: several per CTA
      {64, 64, {0, 0}, MXMOE_DTYPE_F32, 16},                     // all empty: zeros
      {384, 256, {700, 333, 0, 1011}, MXMOE_DTYPE_BF16, 4},      // 3 m-tiles: ghosts at clusters 2 and 4
      {1200, 208, random_sizes(5, 3008, rng, true), MXMOE_DTYPE_F32},  // 10 x 2 tiles, bands of 8 and 2
  };
  uint32_t seed = 400;
  // The single-thread TMA producer (the default) and the warp producer (MXMOE_GEMM_PRODUCER=warp).
  for (const char* producer : {"thread", "warp"}) {
    for (const char* cluster : {"4", "2", "1"}) {
      EnvGuard env;
      env.set("MXMOE_GEMM_SM90", "mxmoe-only");
      env.set("MXMOE_GEMM_CLUSTER", cluster);
      env.set("MXMOE_GEMM_PRODUCER", producer);
      for (Data d : {Data::kExactGrid, Data::kFullRange}) {
        g_data = d;
        for (const auto& c : cases) {
          SCOPED_TRACE(std::string("cluster ") + cluster + ", producer " + producer);
          bool unsupported = false;
          run_kg_case(c, seed++, &unsupported);
          if (unsupported) GTEST_SKIP() << "tile128 GEMMs unsupported here: " << mxmoe_last_error();
        }
      }
    }
  }
  g_data = Data::kFullRange;
}

// A call is stream-ordered with no host sync: it can be captured in a CUDA graph and replayed.
TEST(CudaGemmTile128, CapturedInCudaGraph) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(8);
  const int64_t M = 512, N = 256, K = 256, G = 3;
  const std::vector<int32_t> sizes = {100, 0, 400};
  Buffer a = random_e4m3_buffer({M, K}, rng), as = rowwise_scales_1x128(M, K, rng);
  Buffer b = random_e4m3_buffer({G, N, K}, rng), bs = tile_scales_128x128(G, N, K, rng);
  Buffer offs = mxtest::offsets(ends_of(sizes));
  const int64_t need = mxmoe_grouped_mm_tile128_workspace_size(M, N, K, G, 0);
  if (need < 0) GTEST_SKIP() << mxmoe_last_error();
  DevBuf da(a), das(as), db(b), dbs(bs), doffs(offs), d1(Buffer({M, N}, MXMOE_DTYPE_F32), false),
      d2(Buffer({M, N}, MXMOE_DTYPE_F32), false);
  Workspace ws(need);
  auto va = da.view(), vas = das.view(), vb = db.view(), vbs = dbs.view(), vo = doffs.view(), v1 = d1.view(),
       v2 = d2.view(), vws = ws.view();
  const mxmoe_status st = mxmoe_grouped_mm_tile128(&va, &vas, &vb, &vbs, &vo, nullptr, &v1, &vws, nullptr);
  if (st == MXMOE_ERR_UNSUPPORTED) GTEST_SKIP() << mxmoe_last_error();
  ASSERT_EQ(st, MXMOE_OK) << mxmoe_last_error();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  d2.poison();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const mxmoe_status cst = mxmoe_grouped_mm_tile128(&va, &vas, &vb, &vbs, &vo, nullptr, &v2, &vws, s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  ASSERT_EQ(cst, MXMOE_OK) << mxmoe_last_error();
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(d1.download().bytes, d2.download().bytes);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

TEST(CudaGemmTile128, Validation) {
  SKIP_WITHOUT_CUDA();
  EXPECT_EQ(mxmoe_grouped_mm_tile128_workspace_size(10, 32, 32, 2, -1), 0);
  EXPECT_EQ(mxmoe_grouped_mm_tile128_kgroups_workspace_size(10, 32, 32, 2, -1), 0);
  EXPECT_EQ(mxmoe_grouped_mm_tile128_workspace_size(-1, 32, 32, 2, 0), -1);
  const int64_t M = 64, N = 32, K = 128, G = 2;
  const int64_t need = mxmoe_grouped_mm_tile128_workspace_size(M, N, K, G, 0);
  if (need < 0) GTEST_SKIP() << mxmoe_last_error();
  std::mt19937 rng(9);
  Buffer a = random_e4m3_buffer({M, K}, rng), as = rowwise_scales_1x128(M, K, rng);
  Buffer b = random_e4m3_buffer({G, N, K}, rng), bs = tile_scales_128x128(G, N, K, rng);
  Buffer offs = mxtest::offsets({10, 64});
  DevBuf da(a), das(as), db(b), dbs(bs), doffs(offs), dout(Buffer({M, N}, MXMOE_DTYPE_F32), false);
  auto va = da.view(), vas = das.view(), vb = db.view(), vbs = dbs.view(), vo = doffs.view(), vout = dout.view();
  // No workspace on a device.
  EXPECT_EQ(mxmoe_grouped_mm_tile128(&va, &vas, &vb, &vbs, &vo, nullptr, &vout, nullptr, nullptr),
            MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("workspace"), std::string::npos) << mxmoe_last_error();
  // Too small.
  Workspace small(need - 1);
  auto vsmall = small.view();
  EXPECT_EQ(mxmoe_grouped_mm_tile128(&va, &vas, &vb, &vbs, &vo, nullptr, &vout, &vsmall, nullptr),
            MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("at least"), std::string::npos) << mxmoe_last_error();
  // Host workspace with device operands.
  Buffer host_ws({need}, MXMOE_DTYPE_E4M3);
  auto vhw = host_ws.view();
  EXPECT_EQ(mxmoe_grouped_mm_tile128(&va, &vas, &vb, &vbs, &vo, nullptr, &vout, &vhw, nullptr),
            MXMOE_ERR_INVALID_ARGUMENT);
}

// The gather variant (mxmoe_grouped_mm_tile128_gather, the MoE layer's GEMM on routed rows): the same
// bits as the M-grouped kernel on the routed copy of the operand (test_util.hpp's routed_copy: padding
// rows, clamped indices, tail rows), and with a row scale the scaled f32 product rounded once.
TEST(CudaGemmTile128, GatherSameBitsAsRoutedCopy) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t t, k, n, fanout;
    std::vector<int32_t> sizes;
  };
  const Case cases[] = {{300, 512, 384, 8, {400, 0, 333, 700, 16, 951}},
                        {97, 160, 144, 3, {50, 128, 0, 113}},
                        {1024, 2048, 256, 8, {1000, 2000, 3000, 2192}}};
  uint32_t seed = 40;
  for (const Case& c : cases) {
    std::mt19937 rng(seed++);
    g_data = Data::kNormal;
    const int64_t G = static_cast<int64_t>(c.sizes.size());
    Buffer a = random_e4m3_buffer({c.t, c.k}, rng), as = rowwise_scales_1x128(c.t, c.k, rng);
    Buffer b = random_e4m3_buffer({G, c.n, c.k}, rng), bs = tile_scales_128x128(G, c.n, c.k, rng);
    std::vector<int32_t> gather;
    for (int32_t s : c.sizes)
      for (int32_t i = 0; i < s; ++i) {
        const uint32_t u = rng() % 32;
        gather.push_back(u == 0 ? -1 : (u == 1 ? static_cast<int32_t>(c.t * c.fanout + 3)
                                               : static_cast<int32_t>(rng() % (c.t * c.fanout))));
      }
    for (int i = 0; i < 5; ++i) gather.push_back(static_cast<int32_t>(rng() % (c.t * c.fanout)));  // tail rows
    const int64_t M = static_cast<int64_t>(gather.size());
    const std::vector<int32_t> ends = ends_of(c.sizes);
    Buffer offs = mxtest::offsets(ends), gi({M}, MXMOE_DTYPE_I32), rs({c.t, c.fanout}, MXMOE_DTYPE_F32);
    std::memcpy(gi.bytes.data(), gather.data(), gather.size() * 4);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (int64_t i = 0; i < rs.numel(); ++i) rs.set(i, u(rng));
    const mxtest::RoutedCopy copy = mxtest::routed_copy(a, as, gather, c.fanout);
    DevBuf da(a), das(as), db(b), dbs(bs), doffs(offs), dgi(gi), drs(rs), dq(copy.q), dqs(copy.scale);
    auto va = da.view(), vas = das.view(), vb = db.view(), vbs = dbs.view(), vo = doffs.view(), vg = dgi.view(),
         vrs = drs.view(), vq = dq.view(), vqs = dqs.view();
    if (!mxmoe_grouped_mm_tile128_gather_available(M, c.n, c.k, G, c.t, c.fanout, 0))
      GTEST_SKIP() << "the sm_90a gather kernel is not available here";
    // The M-grouped kernel on the routed copy, bf16 and f32.
    DevBuf ref16(Buffer({M, c.n}, MXMOE_DTYPE_BF16), false), ref32(Buffer({M, c.n}, MXMOE_DTYPE_F32), false);
    for (DevBuf* r : {&ref16, &ref32}) {
      const int64_t need = mxmoe_grouped_mm_tile128_workspace_size(M, c.n, c.k, G, 0);
      Workspace ws(need);
      auto vr = r->view(), vws = ws.view();
      ASSERT_EQ(mxmoe_grouped_mm_tile128(&vq, &vqs, &vb, &vbs, &vo, nullptr, &vr, &vws, nullptr), MXMOE_OK)
          << mxmoe_last_error();
    }
    for (bool scaled : {false, true}) {
      DevBuf dout(Buffer({M, c.n}, MXMOE_DTYPE_BF16), false);
      dout.poison();
      auto vout = dout.view();
      ASSERT_EQ(mxmoe_grouped_mm_tile128_gather(&va, &vas, &vg, c.fanout, scaled ? &vrs : nullptr, &vb, &vbs, &vo,
                                                nullptr, &vout, nullptr),
                MXMOE_OK)
          << mxmoe_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Buffer got = dout.download();
      const Buffer want = scaled ? mxtest::row_scaled(ref32.download(), copy, rs, nullptr, ends, MXMOE_DTYPE_BF16)
                                 : ref16.download();
      int64_t diff = 0;
      for (int64_t i = 0; i < got.numel(); ++i) diff += got.data<uint16_t>()[i] != want.data<uint16_t>()[i];
      EXPECT_EQ(diff, 0) << "T=" << c.t << " K=" << c.k << " N=" << c.n << " scaled=" << scaled;
    }
  }
  g_data = Data::kFullRange;
}

// The bf16 gather GEMM (mxmoe_grouped_mm_bf16_gather, the bf16 MoE layer's up projection and down
// projection dgrad): the contract's bits (exact operands: test_util.hpp's bf16_gather_case) with both B
// layouts, K tails inside a k-block (K-major B), a half column tile, empty groups, padding, clamped and
// tail rows; the shapes of the MoE layer among them.
TEST(CudaGemm, Bf16GatherMatchesTheContract) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t t, k, n, fanout;
    std::vector<int32_t> sizes;
    bool b_kn;
  };
  const Case cases[] = {{300, 520, 384, 8, {400, 0, 333, 700, 16, 951}, false},
                        {97, 160, 144, 3, {50, 128, 0, 113}, false},
                        {200, 512, 320, 8, {300, 0, 129, 700, 471}, true},
                        {1024, 2048, 1536, 8, {1000, 2000, 3000, 2192}, false},
                        {1024, 2048, 768, 8, {1000, 2000, 0, 3000, 2192}, true}};
  uint32_t seed = 60;
  for (const Case& c : cases) {
    mxtest::Bf16Gather g = mxtest::bf16_gather_case(c.t, c.k, c.n, c.fanout, c.sizes, c.b_kn, seed++);
    const int64_t M = static_cast<int64_t>(g.gather.size()), G = static_cast<int64_t>(c.sizes.size());
    if (!mxmoe_grouped_mm_bf16_gather_available(M, c.n, c.k, G, c.t, c.fanout, c.b_kn ? 1 : 0, 0))
      GTEST_SKIP() << "the sm_90a bf16 gather kernel is not available here";
    DevBuf da(g.a), db(g.b), doffs(g.offs), dgi(g.index), dout(Buffer({M, c.n}, MXMOE_DTYPE_BF16), false);
    dout.poison();
    auto va = da.view(), vb = db.view(), vo = doffs.view(), vg = dgi.view(), vout = dout.view();
    ASSERT_EQ(mxmoe_grouped_mm_bf16_gather(&va, &vg, c.fanout, &vb, c.b_kn ? 1 : 0, &vo, &vout, nullptr), MXMOE_OK)
        << mxmoe_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Buffer got = dout.download(), want = mxtest::bf16_gather_expected(g);
    int64_t diff = 0, first = -1;
    for (int64_t i = 0; i < got.numel(); ++i)
      if (got.data<uint16_t>()[i] != want.data<uint16_t>()[i] && diff++ == 0) first = i;
    EXPECT_EQ(diff, 0) << "T=" << c.t << " K=" << c.k << " N=" << c.n << " b_kn=" << c.b_kn << " first at row "
                       << (first < 0 ? -1 : first / c.n) << " col " << (first < 0 ? -1 : first % c.n) << ": got "
                       << (first < 0 ? 0.f : got.get(first)) << " want " << (first < 0 ? 0.f : want.get(first));
  }
}

// The bf16 K-grouped gather GEMM (mxmoe_grouped_mm_bf16_kgather, the bf16 MoE layer's wgrads): the
// contract's bits on exact operands with either operand gathered, groups of every length mod 64 (token
// tails inside a k-block), an empty group (zeros), partial tiles along M and N, padding, clamped and
// tail rows; Qwen3-30B-A3B's dW13 and dW2 shapes among them.
TEST(CudaGemm, Bf16KGatherMatchesTheContract) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t t, m, n, fanout;
    std::vector<int32_t> sizes;
    bool gather_b;
  };
  const Case cases[] = {{300, 200, 136, 8, {400, 0, 333, 700, 16, 951}, true},
                        {97, 64, 328, 3, {50, 128, 0, 113, 1}, false},
                        {512, 1536, 2048, 8, {1000, 0, 1500, 1596}, true},
                        {512, 2048, 768, 8, {1000, 0, 1500, 1596}, false}};
  uint32_t seed = 70;
  for (const Case& c : cases) {
    mxtest::Bf16KGather g = mxtest::bf16_kgather_case(c.t, c.m, c.n, c.fanout, c.sizes, c.gather_b, seed++);
    const int64_t R = static_cast<int64_t>(g.gather.size()), G = static_cast<int64_t>(c.sizes.size());
    if (!mxmoe_grouped_mm_bf16_kgather_available(R, c.m, c.n, G, c.t, c.fanout, 0))
      GTEST_SKIP() << "the sm_90a bf16 K-grouped gather kernel is not available here";
    DevBuf da(g.a), db(g.b), doffs(g.offs), dgi(g.index), dout(Buffer({G, c.m, c.n}, MXMOE_DTYPE_BF16), false);
    dout.poison();
    auto va = da.view(), vb = db.view(), vo = doffs.view(), vg = dgi.view(), vout = dout.view();
    ASSERT_EQ(mxmoe_grouped_mm_bf16_kgather(&va, &vb, &vg, c.fanout, c.gather_b ? 1 : 0, &vo, &vout, nullptr),
              MXMOE_OK)
        << mxmoe_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Buffer got = dout.download(), want = mxtest::bf16_kgather_expected(g);
    int64_t diff = 0, first = -1;
    for (int64_t i = 0; i < got.numel(); ++i)
      if (got.data<uint16_t>()[i] != want.data<uint16_t>()[i] && diff++ == 0) first = i;
    const int64_t mn = c.m * c.n;
    EXPECT_EQ(diff, 0) << "M=" << c.m << " N=" << c.n << " gather_b=" << c.gather_b << " first at group "
                       << (first < 0 ? -1 : first / mn) << " row " << (first < 0 ? -1 : first % mn / c.n) << " col "
                       << (first < 0 ? -1 : first % c.n) << ": got " << (first < 0 ? 0.f : got.get(first))
                       << " want " << (first < 0 ? 0.f : want.get(first));
  }
}

// The bf16 dSwiGLU gather GEMM (mxmoe_grouped_mm_bf16_gather_dswiglu, the bf16 MoE layer's
// down-projection dgrad) against its contract (mxtest::bf16_dswiglu_expected) on the device's own
// pieces: dY' from the device gather GEMM (CudaGemm.Bf16GatherMatchesTheContract checks its bits) and the
// SwiGLU gradient and value from the device's mxmoe_swiglu_backward / mxmoe_swiglu on fp32 operands (the
// exact fp32 dg, du and y: host libm's expf may differ from CUDA's by an ulp, so the host's would not
// do; the optional act output is that y rounded to bf16); with and without row weights, partial column tiles, empty groups, padding, clamped and tail rows,
// gpt-oss' interleaved clamped SwiGLU; Qwen3-30B-A3B's shape among them.
TEST(CudaGemm, Bf16GatherDSwigluMatchesTheContract) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t t, k, i, fanout;
    std::vector<int32_t> sizes;
  };
  const Case cases[] = {{200, 512, 320, 8, {300, 0, 129, 700, 471}}, {1024, 2048, 768, 8, {1000, 2000, 0, 3000, 2192}}};
  uint32_t seed = 80;
  for (const Case& c : cases) {
    mxtest::Bf16Gather g = mxtest::bf16_gather_case(c.t, c.k, c.i, c.fanout, c.sizes, true, seed++);
    const int64_t M = static_cast<int64_t>(g.gather.size()), G = static_cast<int64_t>(c.sizes.size()), I = c.i;
    const int64_t ntw = (I + 127) / 128, end = g.ends.back();
    DevBuf da(g.a), db(g.b), doffs(g.offs), dgi(g.index), ddy(Buffer({M, I}, MXMOE_DTYPE_BF16), false);
    auto va = da.view(), vb = db.view(), vo = doffs.view(), vg = dgi.view(), vdy = ddy.view();
    ASSERT_EQ(mxmoe_grouped_mm_bf16_gather(&va, &vg, c.fanout, &vb, 1, &vo, &vdy, nullptr), MXMOE_OK)
        << mxmoe_last_error();
    const Buffer dy = ddy.download();
    for (int variant = 0; variant < 3; ++variant) {
      const bool weighted = variant != 1, inter = variant == 2;  // the third: gpt-oss' interleaved, clamped SwiGLU
      const mxmoe::SwigluParams p = inter ? mxmoe::SwigluParams{1, 1.702f, 7.f, 1.f}
                                          : mxmoe::SwigluParams{0, 1.f, std::numeric_limits<float>::infinity(), 0.f};
      if (!mxmoe_grouped_mm_bf16_gather_dswiglu_available(M, I, c.k, G, c.t, c.fanout, p.layout, 0))
        GTEST_SKIP() << "the sm_90a bf16 dSwiGLU gather kernel is not available here";
      Buffer h = mxtest::random_input({M, 2 * I}, MXMOE_DTYPE_BF16, seed++, 3.f);
      if (variant == 0) {
        // Gate values below -87 in a few rows (where 1 + exp(-g) nears the reciprocal's subnormal
        // range): the contract's bits there too.
        const int64_t rows[] = {5, 37, 130, end - 1};
        for (int64_t q = 0; q < 4; ++q) {
          h.set(rows[q] * 2 * I + (17 * q) % I, -100.f);
          h.set(rows[q] * 2 * I + (17 * q + 40) % I, -3e38f);
        }
      }
      Buffer rs({c.t, c.fanout}, MXMOE_DTYPE_F32);
      std::mt19937 rng(seed++);
      std::uniform_real_distribution<float> u(0.f, 1.f);
      for (int64_t i = 0; i < rs.numel(); ++i) rs.set(i, u(rng));
      auto w_of = [&](int64_t r) {
        if (!weighted) return 1.f;
        const int64_t i = std::min<int64_t>(g.gather[r], g.T * g.fanout - 1);
        return i < 0 ? 0.f : rs.get(i);
      };
      // the device's fp32 SwiGLU value and gradient at every (row, column), for the weighted bf16 dY'
      Buffer hf({M, 2 * I}, MXMOE_DTYPE_F32), dyw({M, I}, MXMOE_DTYPE_F32);
      for (int64_t i = 0; i < hf.numel(); ++i) hf.set(i, h.get(i));
      for (int64_t r = 0; r < end; ++r)
        for (int64_t j = 0; j < I; ++j) {
          volatile float dw = dy.get(r * I + j) * w_of(r);
          dyw.set(r * I + j, mxtest::from_bf16(mxtest::to_bf16(dw)));
        }
      DevBuf dhf(hf), ddyw(dyw), dyf(Buffer({M, I}, MXMOE_DTYPE_F32), false),
          ddhf(Buffer({M, 2 * I}, MXMOE_DTYPE_F32), false);
      {
        auto vhf = dhf.view(), vdyw = ddyw.view(), vyf = dyf.view(), vdhf = ddhf.view();
        ASSERT_EQ(mxmoe_swiglu(&vhf, p.layout, p.alpha, p.limit, p.up_offset, &vyf, nullptr), MXMOE_OK)
            << mxmoe_last_error();
        ASSERT_EQ(mxmoe_swiglu_backward(&vdyw, &vhf, p.layout, p.alpha, p.limit, p.up_offset, &vdhf, nullptr), MXMOE_OK)
            << mxmoe_last_error();
      }
      const Buffer yv = dyf.download(), dhv = ddhf.download();
      auto act_grad = [&](int64_t r, int64_t col, float, float, float, float* dg, float* du, float* y) {
        *dg = dhv.get(r * 2 * I + (inter ? 2 * col : col));
        *du = dhv.get(r * 2 * I + (inter ? 2 * col + 1 : I + col));
        *y = yv.get(r * I + col);
      };
      const auto [want_dh, want_tw] = mxtest::bf16_dswiglu_expected(g, dy, h, act_grad, w_of, inter);
      // act (variants 0 and 2; variant 1 leaves it out): the device SwiGLU's value rounded to bf16, rows
      // past the last group zero
      const bool with_act = variant != 1;
      Buffer want_act({M, I}, MXMOE_DTYPE_BF16, 0);
      for (int64_t i = 0; i < end * I; ++i) want_act.set(i, yv.get(i));

      DevBuf drs(rs), dh_in(h), ddh(Buffer({M, 2 * I}, MXMOE_DTYPE_BF16), false),
          dtw(Buffer({M, ntw}, MXMOE_DTYPE_F32), false), dact(Buffer({M, I}, MXMOE_DTYPE_BF16), false);
      ddh.poison();
      dtw.poison();
      dact.poison();
      auto vrs = drs.view(), vh = dh_in.view(), vdh = ddh.view(), vtw = dtw.view(), vact = dact.view();
      ASSERT_EQ(mxmoe_grouped_mm_bf16_gather_dswiglu(&va, &vg, c.fanout, weighted ? &vrs : nullptr, &vb, &vo, &vh,
                                                     p.layout, p.alpha, p.limit, p.up_offset, &vdh, &vtw,
                                                     with_act ? &vact : nullptr, nullptr),
                MXMOE_OK)
          << mxmoe_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Buffer got_dh = ddh.download(), got_tw = dtw.download();
      if (with_act) {
        const Buffer got_act = dact.download();
        int64_t diff = 0, first = -1;
        for (int64_t i = 0; i < got_act.numel(); ++i)
          if (got_act.data<uint16_t>()[i] != want_act.data<uint16_t>()[i] && diff++ == 0) first = i;
        EXPECT_EQ(diff, 0) << "act, I=" << I << " variant=" << variant << " first at row "
                           << (first < 0 ? -1 : first / I) << " col " << (first < 0 ? -1 : first % I);
      }
      int64_t diff_dh = 0, diff_tw = 0, first_dh = -1, first_tw = -1;
      for (int64_t i = 0; i < got_dh.numel(); ++i)
        if (got_dh.data<uint16_t>()[i] != want_dh.data<uint16_t>()[i] && diff_dh++ == 0) first_dh = i;
      for (int64_t i = 0; i < got_tw.numel(); ++i)
        if (got_tw.data<uint32_t>()[i] != want_tw.data<uint32_t>()[i] && diff_tw++ == 0) first_tw = i;
      EXPECT_EQ(diff_dh, 0) << "dh, I=" << I << " variant=" << variant << " first at row "
                            << (first_dh < 0 ? -1 : first_dh / (2 * I)) << " col "
                            << (first_dh < 0 ? -1 : first_dh % (2 * I));
      EXPECT_EQ(diff_tw, 0) << "tw_part, I=" << I << " variant=" << variant << " first at row "
                            << (first_tw < 0 ? -1 : first_tw / ntw) << " tile "
                            << (first_tw < 0 ? -1 : first_tw % ntw) << ": got "
                            << (first_tw < 0 ? 0.f : got_tw.get(first_tw)) << " want "
                            << (first_tw < 0 ? 0.f : want_tw.get(first_tw));
    }
  }
}

// The bf16 SwiGLU gather GEMM (mxmoe_grouped_mm_bf16_gather_swiglu, the bf16 MoE layer's up projection):
// h the contract's bits on exact operands, act(h) the device mxmoe_swiglu's of that h (the unfused
// layer's act); both halves in one tile (I % 128 == 64: an odd tile count; a bias, whose gate and up
// columns the halves place), empty groups, padding, clamped and tail rows; Qwen3-30B-A3B's shape and
// gpt-oss's clamped activation among them.
TEST(CudaGemm, Bf16GatherSwigluMatchesTheContract) {
  SKIP_WITHOUT_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    int64_t t, k, i, fanout;
    std::vector<int32_t> sizes;
    mxmoe::SwigluParams act;
    bool bias;
  };
  const Case cases[] = {{300, 520, 256, 8, {400, 0, 333, 700, 16, 951}, {0, 1.702f, 7.f, 1.f}, false},
                        {300, 520, 320, 8, {400, 0, 333, 700, 16, 951}, {0, 1.702f, 7.f, 1.f}, true},
                        {1024, 2048, 768, 8, {1000, 2000, 3000, 2192}, {0, 1.f, inf, 0.f}, false},
                        {300, 520, 200, 8, {400, 0, 333, 700, 16, 951}, {1, 1.702f, 7.f, 1.f}, true}};  // gpt-oss
  uint32_t seed = 90;
  for (const Case& c : cases) {
    mxtest::Bf16Gather g = mxtest::bf16_gather_case(c.t, c.k, 2 * c.i, c.fanout, c.sizes, false, seed++);
    const int64_t M = static_cast<int64_t>(g.gather.size()), G = static_cast<int64_t>(c.sizes.size());
    if (!mxmoe_grouped_mm_bf16_gather_swiglu_available(M, c.i, c.k, G, c.t, c.fanout, c.act.layout, 0))
      GTEST_SKIP() << "the sm_90a bf16 SwiGLU gather kernel is not available here";
    DevBuf da(g.a), db(g.b), doffs(g.offs), dgi(g.index);
    DevBuf dh(Buffer({M, 2 * c.i}, MXMOE_DTYPE_BF16), false), dact(Buffer({M, c.i}, MXMOE_DTYPE_BF16), false);
    dh.poison();
    dact.poison();
    auto va = da.view(), vb = db.view(), vo = doffs.view(), vg = dgi.view(), vh = dh.view(), vact = dact.view();
    // a bf16 bias (added to h in fp32 and rounded again)
    Buffer bias = mxtest::random_input({G, 2 * c.i}, MXMOE_DTYPE_BF16, seed + 50, 2.f);
    DevBuf dbias(bias);
    auto vbias = dbias.view();
    const bool with_bias = c.bias;
    ASSERT_EQ(mxmoe_grouped_mm_bf16_gather_swiglu(&va, &vg, c.fanout, &vb, &vo, with_bias ? &vbias : nullptr,
                                                  c.act.layout, c.act.alpha, c.act.limit, c.act.up_offset, &vh, &vact,
                                                  nullptr),
              MXMOE_OK)
        << mxmoe_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Buffer got_h = dh.download(), got_act = dact.download();
    Buffer want_h = mxtest::bf16_gather_expected(g);
    int64_t grp = 0;
    for (int64_t r = 0; with_bias && r < g.ends.back(); ++r) {
      while (r >= g.ends[grp]) ++grp;
      for (int64_t j = 0; j < 2 * c.i; ++j) {
        volatile float sum = want_h.get(r * 2 * c.i + j) + bias.get(grp * 2 * c.i + j);
        want_h.set(r * 2 * c.i + j, sum);
      }
    }
    // act: the device's mxmoe_swiglu of the contract's h (host libm's expf may differ from CUDA's by an ulp)
    DevBuf dwant_h(want_h), dwant_act(Buffer({M, c.i}, MXMOE_DTYPE_BF16), false);
    auto vwh = dwant_h.view(), vwa = dwant_act.view();
    ASSERT_EQ(mxmoe_swiglu(&vwh, c.act.layout, c.act.alpha, c.act.limit, c.act.up_offset, &vwa, nullptr), MXMOE_OK)
        << mxmoe_last_error();
    const Buffer want_act = dwant_act.download();
    int64_t diff_h = 0, diff_act = 0;
    for (int64_t i = 0; i < got_h.numel(); ++i) diff_h += got_h.data<uint16_t>()[i] != want_h.data<uint16_t>()[i];
    for (int64_t i = 0; i < got_act.numel(); ++i)
      diff_act += got_act.data<uint16_t>()[i] != want_act.data<uint16_t>()[i];
    EXPECT_EQ(diff_h, 0) << "h, I=" << c.i;
    EXPECT_EQ(diff_act, 0) << "act, I=" << c.i;
  }
}

// The gather GEMM with the dSwiGLU epilogue (mxmoe_grouped_mm_tile128_gather_dswiglu, the MoE layer's
// down-projection dgrad): the same bytes as the gather GEMM writing dY' and the tile128 quantize pass
// over the SWIGLU_BACKWARD source (both on the device), rows past the last group as a zero dY', and
// the routing weights' partials as the documented sums over the stored dY' (host loop; expf may
// differ by an ulp between host and device, hence the relative bound there).
TEST(CudaGemmTile128, GatherDSwigluSameBytesAsGemmThenQuantize) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t t, k, i, fanout;
    std::vector<int32_t> sizes;
    float alpha, limit, up_offset;
    int tail;  // rows past the last group
  };
  const float inf = std::numeric_limits<float>::infinity();
  // Column runs leave as 16-byte stores where the tile starts 16-aligned and M % 16 == 0 (the first
  // case), else byte by byte (the second: groups at any row; the third: M % 16 != 0).
  const Case cases[] = {{300, 512, 256, 8, {400, 0, 336, 704, 16, 944}, 1.f, inf, 0.f, 16},  // groups % 16 == 0
                        {97, 256, 128, 3, {50, 128, 0, 113}, 1.f, inf, 0.f, 13},            // any group sizes
                        {256, 2048, 768, 8, {512, 1024, 0, 496}, 1.702f, 7.f, 1.f, 9}};     // clamped SwiGLU
  uint32_t seed = 70;
  for (const Case& c : cases) {
    std::mt19937 rng(seed++);
    g_data = Data::kNormal;
    const int64_t G = static_cast<int64_t>(c.sizes.size()), I = c.i;
    Buffer a = random_e4m3_buffer({c.t, c.k}, rng), as = rowwise_scales_1x128(c.t, c.k, rng);
    Buffer b = random_e4m3_buffer({G, I, c.k}, rng), bs = tile_scales_128x128(G, I, c.k, rng);
    std::vector<int32_t> gather;
    for (int32_t s : c.sizes)
      for (int32_t r = 0; r < s; ++r) {
        const uint32_t u = rng() % 32;
        gather.push_back(u == 0 ? -1 : (u == 1 ? static_cast<int32_t>(c.t * c.fanout + 3)
                                               : static_cast<int32_t>(rng() % (c.t * c.fanout))));
      }
    for (int r = 0; r < c.tail; ++r) gather.push_back(static_cast<int32_t>(rng() % (c.t * c.fanout)));  // tail rows
    const int64_t M = static_cast<int64_t>(gather.size());
    const std::vector<int32_t> ends = ends_of(c.sizes);
    const int64_t end = ends.back(), n_r = mxmoe_grouped_scale_capacity(M, G);
    Buffer offs = mxtest::offsets(ends), gi({M}, MXMOE_DTYPE_I32), rs({c.t, c.fanout}, MXMOE_DTYPE_F32);
    std::memcpy(gi.bytes.data(), gather.data(), gather.size() * 4);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int64_t e = 0; e < rs.numel(); ++e) rs.set(e, nd(rng));  // signed weights
    Buffer h = mxtest::random_input({M, 2 * I}, MXMOE_DTYPE_BF16, seed + 100, 4.f);
    h.set(5 * 2 * I + 7, std::numeric_limits<float>::quiet_NaN());  // a NaN stays visible
    // Gate values below -87 in two rows (their warps take the full sigmoid, the others the moderate one).
    h.set(40 * 2 * I + 3, -100.f);
    h.set(77 * 2 * I + I - 1, -inf);
    if (!mxmoe_grouped_mm_tile128_gather_dswiglu_available(M, I, c.k, G, c.t, c.fanout, 0, 0))
      GTEST_SKIP() << "the sm_90a dSwiGLU gather kernel is not available here";
    DevBuf da(a), das(as), db(b), dbs(bs), doffs(offs), dgi(gi), drs(rs), dh(h);
    auto va = da.view(), vas = das.view(), vb = db.view(), vbs = dbs.view(), vo = doffs.view(), vg = dgi.view(),
         vrs = drs.view(), vh = dh.view();
    // The reference: dY' (bf16) by the gather GEMM, then the quantize pass over the computed dH.
    DevBuf ddy(Buffer({M, I}, MXMOE_DTYPE_BF16), false);
    auto vdy = ddy.view();
    ASSERT_EQ(mxmoe_grouped_mm_tile128_gather(&va, &vas, &vg, c.fanout, nullptr, &vb, &vbs, &vo, nullptr, &vdy, nullptr),
              MXMOE_OK)
        << mxmoe_last_error();
    DevBuf rq(Buffer({M, 2 * I}, MXMOE_DTYPE_E4M3), false), rsc(Buffer({M, 2 * I / 32}, MXMOE_DTYPE_E8M0), false),
        rqt(Buffer({2 * I, M}, MXMOE_DTYPE_E4M3), false), rst(Buffer({2 * I, n_r}, MXMOE_DTYPE_E8M0), false);
    {
      auto vq = rq.view(), vs = rsc.view(), vqt = rqt.view(), vst = rst.view();
      mxmoe_fused_source src{};
      src.kind = MXMOE_SOURCE_SWIGLU_BACKWARD;
      src.a = &vh;
      src.b = &vdy;
      src.perm = &vg;
      src.row_scale = &vrs;
      src.k = c.fanout;
      src.layout = 0;
      src.alpha = c.alpha;
      src.limit = c.limit;
      src.up_offset = c.up_offset;
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
    DevBuf q(Buffer({M, 2 * I}, MXMOE_DTYPE_E4M3), false), sc(Buffer({M, 2 * I / 32}, MXMOE_DTYPE_E8M0), false),
        qt(Buffer({2 * I, M}, MXMOE_DTYPE_E4M3), false), st(Buffer({2 * I, n_r}, MXMOE_DTYPE_E8M0), false),
        tw(Buffer({M, I / 128}, MXMOE_DTYPE_F32), false);
    for (DevBuf* d : {&q, &sc, &qt, &st, &tw}) d->poison();  // every byte must be written
    auto vq = q.view(), vs = sc.view(), vqt = qt.view(), vst = st.view(), vtw = tw.view();
    ASSERT_EQ(mxmoe_grouped_mm_tile128_gather_dswiglu(&va, &vas, &vg, c.fanout, &vrs, &vb, &vbs, &vo, &vh, 0, c.alpha,
                                                      c.limit, c.up_offset, MXMOE_SCALE_RCEIL, &vq, &vs, &vqt, &vst,
                                                      &vtw, nullptr),
              MXMOE_OK)
        << mxmoe_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::string where = "T=" + std::to_string(c.t) + " K=" + std::to_string(c.k) + " I=" + std::to_string(I);
    // Rows of the groups: the reference's bytes; rows past the last group: zero codes, the zero block's scale.
    const Buffer gq = q.download(), wq = rq.download(), gs = sc.download(), ws = rsc.download();
    int64_t diff_q = 0, diff_s = 0;
    const uint8_t zero_scale = mxmoe_e8m0_from_amax(0.f, MXMOE_SCALE_RCEIL);
    for (int64_t r = 0; r < M; ++r) {
      for (int64_t col = 0; col < 2 * I; ++col)
        diff_q += gq.u8(r * 2 * I + col) != (r < end ? wq.u8(r * 2 * I + col) : 0);
      for (int64_t col = 0; col < 2 * I / 32; ++col)
        diff_s += gs.u8(r * (2 * I / 32) + col) != (r < end ? ws.u8(r * (2 * I / 32) + col) : zero_scale);
    }
    EXPECT_EQ(diff_q, 0) << where;
    EXPECT_EQ(diff_s, 0) << where;
    EXPECT_EQ(qt.download().bytes, rqt.download().bytes) << where;
    EXPECT_EQ(st.download().bytes, rst.download().bytes) << where;
    // The partials from the stored dY' and h, in the documented order.
    const Buffer dy = ddy.download(), got = tw.download();
    const mxmoe::SwigluParams p{0, c.alpha, c.limit, c.up_offset};
    int64_t bad = 0, nan_rows = 0;
    for (int64_t r = 0; r < M; ++r)
      for (int64_t t = 0; t < I / 128; ++t) {
        float s4[4] = {0.f, 0.f, 0.f, 0.f};
        double mag = 0.0;
        for (int q4 = 0; r < end && q4 < 4; ++q4)
          for (int j = 0; j < 16; ++j)
            for (int e = 0; e < 2; ++e) {
              const int64_t col = 128 * t + 8 * j + 2 * q4 + e;
              const float y = mxmoe::swiglu_value(h.get(r * 2 * I + col), h.get(r * 2 * I + I + col), p);
              s4[q4] = mxmoe::add_rn(s4[q4], mxmoe::mul_rn(dy.get(r * I + col), y));
              mag += std::fabs(static_cast<double>(dy.get(r * I + col)) * y);
            }
        const float want = mxmoe::add_rn(mxmoe::add_rn(s4[0], s4[1]), mxmoe::add_rn(s4[2], s4[3]));
        const float g = got.data<float>()[r * (I / 128) + t];
        if (std::isnan(want)) {
          nan_rows += std::isnan(g) ? 1 : 0;
          bad += std::isnan(g) ? 0 : 1;
        } else {
          bad += std::fabs(static_cast<double>(g) - want) > 1e-5 * mag + 1e-30;
        }
      }
    EXPECT_EQ(bad, 0) << where;
    EXPECT_GE(nan_rows, 1) << where << ": the NaN in h reaches its row's partial";
  }
  g_data = Data::kFullRange;
}

// The gather GEMM with the SwiGLU epilogue (mxmoe_grouped_mm_tile128_gather_swiglu, the MoE layer's up
// projection): h the same bytes as the gather GEMM's, act(h)'s rowwise and columnwise operands the same
// bytes as the tile128 quantize pass over the SWIGLU source read from that h (both on the device), every
// output byte written (poisoned first), also rows past the last group; and without the columnwise form.
// Concatenated and interleaved halves, with and without the expert biases b13.
TEST(CudaGemmTile128, GatherSwigluSameBytesAsGemmThenQuantize) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t t, k, i, fanout;
    std::vector<int32_t> sizes;
    float alpha, limit, up_offset;
    int tail;  // rows past the last group
    int32_t layout;
    bool bias;
  };
  const float inf = std::numeric_limits<float>::infinity();
  // As the dSwiGLU test: 16-byte column runs (the first case), byte runs (the others); an odd count of
  // act blocks per row (I = 768: 6 pairs) and the clamped SwiGLU in the third. Then gpt-oss's layer:
  // interleaved halves with b13 (f32 in the fourth case, bf16 in the fifth), I % 128 == 64 (a ghost
  // second tile in each row's last pair: 2I = 640, 5 tiles) and I % 128 == 0; a plain interleaved
  // SwiGLU; concatenated halves with b13, which the kernel declines (INVALID_ARGUMENT, nothing written).
  const Case cases[] = {{300, 512, 256, 8, {400, 0, 336, 704, 16, 944}, 1.f, inf, 0.f, 16, 0, false},
                        {97, 256, 128, 3, {50, 128, 0, 113}, 1.f, inf, 0.f, 13, 0, false},
                        {256, 2048, 768, 8, {512, 1024, 0, 496}, 1.702f, 7.f, 1.f, 9, 0, false},
                        {200, 384, 320, 4, {300, 0, 129, 250, 64}, 1.702f, 7.f, 1.f, 5, 1, true},
                        {150, 256, 256, 4, {200, 77, 0, 300}, 1.702f, 7.f, 1.f, 3, 1, true},
                        {97, 256, 192, 3, {50, 128, 0, 113}, 1.f, inf, 0.f, 13, 1, false},
                        {97, 256, 128, 3, {50, 128, 0, 113}, 1.f, inf, 0.f, 0, 0, true}};
  uint32_t seed = 90;
  for (const Case& c : cases) {
    std::mt19937 rng(seed++);
    g_data = Data::kNormal;
    const int64_t G = static_cast<int64_t>(c.sizes.size()), I = c.i;
    Buffer a = random_e4m3_buffer({c.t, c.k}, rng), as = rowwise_scales_1x128(c.t, c.k, rng);
    as.bytes[3 * (c.k / 32)] = 0xFF;  // token 3's first block: a NaN scale, its rows' h and act NaN
    Buffer b = random_e4m3_buffer({G, 2 * I, c.k}, rng), bs = tile_scales_128x128(G, 2 * I, c.k, rng);
    std::vector<int32_t> gather;
    for (int32_t s : c.sizes)
      for (int32_t r = 0; r < s; ++r) {
        const uint32_t u = rng() % 32;
        gather.push_back(u == 0 ? -1 : (u == 1 ? static_cast<int32_t>(c.t * c.fanout + 3)
                                               : static_cast<int32_t>(rng() % (c.t * c.fanout))));
      }
    gather[7] = 3 * static_cast<int32_t>(c.fanout);  // a row of token 3
    for (int r = 0; r < c.tail; ++r) gather.push_back(static_cast<int32_t>(rng() % (c.t * c.fanout)));  // tail rows
    const int64_t M = static_cast<int64_t>(gather.size());
    const std::vector<int32_t> ends = ends_of(c.sizes);
    const int64_t n_r = mxmoe_grouped_scale_capacity(M, G);
    Buffer offs = mxtest::offsets(ends), gi({M}, MXMOE_DTYPE_I32);
    std::memcpy(gi.bytes.data(), gather.data(), gather.size() * 4);
    if (!mxmoe_grouped_mm_tile128_gather_swiglu_available(M, I, c.k, G, c.t, c.fanout, c.layout, 0))
      GTEST_SKIP() << "the sm_90a SwiGLU gather kernel is not available here";
    // b13: f32 where the groups are 5 (the gpt-oss case), else bf16.
    Buffer bias({G, 2 * I}, G == 5 ? MXMOE_DTYPE_F32 : MXMOE_DTYPE_BF16);
    std::normal_distribution<float> bnd(0.f, 2.f);
    for (int64_t i = 0; i < bias.numel(); ++i) bias.set(i, bnd(rng));
    DevBuf da(a), das(as), db(b), dbs(bs), doffs(offs), dgi(gi), dbias(bias);
    auto va = da.view(), vas = das.view(), vb = db.view(), vbs = dbs.view(), vo = doffs.view(), vg = dgi.view(),
         vbias = dbias.view();
    mxmoe_tensor* pbias = c.bias ? &vbias : nullptr;
    // The reference: h by the gather GEMM, then the quantize pass over act(h).
    DevBuf rh(Buffer({M, 2 * I}, MXMOE_DTYPE_BF16), false);
    auto vrh = rh.view();
    ASSERT_EQ(mxmoe_grouped_mm_tile128_gather(&va, &vas, &vg, c.fanout, nullptr, &vb, &vbs, &vo, pbias, &vrh, nullptr),
              MXMOE_OK)
        << mxmoe_last_error();
    DevBuf rq(Buffer({M, I}, MXMOE_DTYPE_E4M3), false), rsc(Buffer({M, I / 32}, MXMOE_DTYPE_E8M0), false),
        rqt(Buffer({I, M}, MXMOE_DTYPE_E4M3), false), rst(Buffer({I, n_r}, MXMOE_DTYPE_E8M0), false);
    {
      auto vq = rq.view(), vs = rsc.view(), vqt = rqt.view(), vst = rst.view();
      mxmoe_fused_source src{};
      src.kind = MXMOE_SOURCE_SWIGLU;
      src.a = &vrh;
      src.layout = c.layout;
      src.alpha = c.alpha;
      src.limit = c.limit;
      src.up_offset = c.up_offset;
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
    const std::string where = "T=" + std::to_string(c.t) + " K=" + std::to_string(c.k) + " I=" + std::to_string(I) +
                              " layout " + std::to_string(c.layout) + (c.bias ? " b13" : "");
    for (bool with_col : {true, false}) {
      DevBuf h(Buffer({M, 2 * I}, MXMOE_DTYPE_BF16), false), q(Buffer({M, I}, MXMOE_DTYPE_E4M3), false),
          sc(Buffer({M, I / 32}, MXMOE_DTYPE_E8M0), false), qt(Buffer({I, M}, MXMOE_DTYPE_E4M3), false),
          st(Buffer({I, n_r}, MXMOE_DTYPE_E8M0), false);
      for (DevBuf* d : {&h, &q, &sc, &qt, &st}) d->poison();  // every byte must be written
      if (c.layout == 0 && c.bias) {
        auto vh = h.view(), vq = q.view(), vs = sc.view();
        EXPECT_EQ(mxmoe_grouped_mm_tile128_gather_swiglu(&va, &vas, &vg, c.fanout, &vb, &vbs, &vo, pbias, 0, c.alpha,
                                                         c.limit, c.up_offset, MXMOE_SCALE_RCEIL, &vh, &vq, &vs,
                                                         nullptr, nullptr, nullptr),
                  MXMOE_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(mxmoe_last_error()).find("bias"), std::string::npos) << mxmoe_last_error();
        const Buffer gq = q.download();
        for (int64_t i = 0; i < gq.numel(); ++i) ASSERT_EQ(gq.u8(i), 0xFF) << "nothing written";
        break;
      }
      auto vh = h.view(), vq = q.view(), vs = sc.view(), vqt = qt.view(), vst = st.view();
      ASSERT_EQ(mxmoe_grouped_mm_tile128_gather_swiglu(&va, &vas, &vg, c.fanout, &vb, &vbs, &vo, pbias, c.layout,
                                                       c.alpha, c.limit, c.up_offset, MXMOE_SCALE_RCEIL, &vh, &vq, &vs,
                                                       with_col ? &vqt : nullptr, with_col ? &vst : nullptr, nullptr),
                MXMOE_OK)
          << mxmoe_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::string w = where + (with_col ? "" : " (no columnwise form)");
      const Buffer gh = h.download(), wh = rh.download();
      EXPECT_EQ(gh.bytes, wh.bytes) << w;
      EXPECT_EQ(q.download().bytes, rq.download().bytes) << w;
      EXPECT_EQ(sc.download().bytes, rsc.download().bytes) << w;
      if (with_col) {
        EXPECT_EQ(qt.download().bytes, rqt.download().bytes) << w;
        EXPECT_EQ(st.download().bytes, rst.download().bytes) << w;
      }
      // The NaN scale reached its row (h NaN; the act block's scale NaN) and the reference agrees.
      EXPECT_TRUE(std::isnan(gh.get(7 * 2 * I))) << w;
      EXPECT_EQ(sc.download().u8(7 * (I / 32)), 0xFF) << w;
    }
  }
  g_data = Data::kFullRange;
}
