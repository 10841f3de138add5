// CUDA quantization kernels against the CPU core, byte for byte, through the public C API:
// quantize (every block shape, 2D/3D, token groups: jagged, empty, partial, garbage offsets, G up
// to 700), dequantize, blocked scale layouts (both ways, all kinds), the fused entry point, and
// check_offsets. Every GPU output is poisoned first (two different poisons, so an unwritten byte
// cannot match by chance) and surrounded by guard bytes that must survive; misaligned views take
// the kernels' scalar paths. Skips when no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"

using mxtest::Buffer;

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}

constexpr size_t kGuard = 256;
constexpr uint8_t kGuardByte = 0xC3;

// A device tensor with guard bytes on both sides; data may start `shift` bytes past an aligned
// address (misaligned views).
struct DevBuf {
  std::vector<int64_t> shape;
  mxmoe_dtype dtype = MXMOE_DTYPE_F32;
  size_t nbytes = 0, shift = 0;
  uint8_t* base = nullptr;

  DevBuf(std::vector<int64_t> s, mxmoe_dtype d, size_t misalign) : shape(std::move(s)), dtype(d), shift(misalign) {
    nbytes = static_cast<size_t>(numel(shape)) * mxtest::elem_size(d);
    EXPECT_EQ(cudaMalloc(&base, total()), cudaSuccess);
  }
  ~DevBuf() {
    if (base) cudaFree(base);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  size_t total() const { return nbytes + 2 * kGuard + 64; }
  uint8_t* data() const { return base + kGuard + shift; }
  void fill(uint8_t inner) {
    EXPECT_EQ(cudaMemset(base, kGuardByte, total()), cudaSuccess);
    if (nbytes) {
      EXPECT_EQ(cudaMemset(data(), inner, nbytes), cudaSuccess);
    }
  }
  void upload(const Buffer& h) {
    EXPECT_EQ(cudaMemset(base, kGuardByte, total()), cudaSuccess);
    if (nbytes) {
      EXPECT_EQ(cudaMemcpy(data(), h.bytes.data(), nbytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  Buffer download() const {
    Buffer h(shape, dtype);
    if (nbytes) {
      EXPECT_EQ(cudaMemcpy(h.bytes.data(), data(), nbytes, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return h;
  }
  // Index of the first guard byte that changed, or -1.
  int64_t guard_damage() const {
    std::vector<uint8_t> all(total());
    EXPECT_EQ(cudaMemcpy(all.data(), base, total(), cudaMemcpyDeviceToHost), cudaSuccess);
    const size_t lo = kGuard + shift, hi = lo + nbytes;
    for (size_t i = 0; i < all.size(); ++i)
      if ((i < lo || i >= hi) && all[i] != kGuardByte) return static_cast<int64_t>(i);
    return -1;
  }
  mxmoe_tensor view() const {
    mxmoe_tensor t{};
    t.data = data();
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(shape.size());
    int64_t st = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.shape[i] = shape[i];
      t.strides[i] = st;
      st *= shape[i];
    }
    t.device = 0;
    return t;
  }
};

struct OutSpec {
  std::vector<int64_t> shape;
  mxmoe_dtype dtype;
  size_t misalign = 0;
  bool present = true;
};

using Call = std::function<mxmoe_status(const std::vector<mxmoe_tensor*>& in, const std::vector<mxmoe_tensor*>& out,
                                        void* stream)>;

// Runs `call` on host buffers (the CPU core, the reference) and on the GPU with two poisons;
// every output byte must equal the CPU's, no guard byte may change, inputs stay intact.
void compare_op(const std::string& what, std::vector<const Buffer*> inputs, std::vector<size_t> in_misalign,
                const std::vector<OutSpec>& outs, const Call& call) {
  SCOPED_TRACE(what);
  in_misalign.resize(inputs.size(), 0);
  // CPU.
  std::vector<Buffer> hin;
  for (auto* b : inputs) hin.push_back(b ? *b : Buffer());
  std::vector<mxmoe_tensor> hin_v(inputs.size()), hout_v(outs.size());
  std::vector<mxmoe_tensor*> hin_p(inputs.size(), nullptr), hout_p(outs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i]) {
      hin_v[i] = hin[i].view();
      hin_p[i] = &hin_v[i];
    }
  std::vector<Buffer> hout;
  for (auto& o : outs) hout.emplace_back(o.shape, o.dtype, 0x00);
  for (size_t i = 0; i < outs.size(); ++i)
    if (outs[i].present) {
      hout_v[i] = hout[i].view();
      hout_p[i] = &hout_v[i];
    }
  ASSERT_EQ(call(hin_p, hout_p, nullptr), MXMOE_OK) << "cpu: " << mxmoe_last_error();
  // GPU.
  std::vector<std::unique_ptr<DevBuf>> din, dout;
  for (size_t i = 0; i < inputs.size(); ++i)
    din.emplace_back(inputs[i] ? new DevBuf(inputs[i]->shape, inputs[i]->dtype, in_misalign[i]) : nullptr);
  for (auto& o : outs) dout.emplace_back(o.present ? new DevBuf(o.shape, o.dtype, o.misalign) : nullptr);
  for (uint8_t poison : {uint8_t{0xA5}, uint8_t{0x5A}}) {
    std::vector<mxmoe_tensor> din_v(inputs.size()), dout_v(outs.size());
    std::vector<mxmoe_tensor*> din_p(inputs.size(), nullptr), dout_p(outs.size(), nullptr);
    for (size_t i = 0; i < inputs.size(); ++i)
      if (din[i]) {
        din[i]->upload(*inputs[i]);
        din_v[i] = din[i]->view();
        din_p[i] = &din_v[i];
      }
    for (size_t i = 0; i < outs.size(); ++i)
      if (dout[i]) {
        dout[i]->fill(poison);
        dout_v[i] = dout[i]->view();
        dout_p[i] = &dout_v[i];
      }
    ASSERT_EQ(call(din_p, dout_p, nullptr), MXMOE_OK) << "cuda: " << mxmoe_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!dout[i]) continue;
      const Buffer got = dout[i]->download();
      const Buffer& want = hout[i];
      size_t bad = 0, first = 0;
      for (size_t k = 0; k < got.bytes.size(); ++k)
        if (got.bytes[k] != want.bytes[k] && bad++ == 0) first = k;
      ASSERT_EQ(bad, 0u) << "output " << i << ": " << bad << " of " << got.bytes.size()
                         << " bytes differ from the CPU, first at byte " << first << " (gpu "
                         << int(got.bytes[first]) << ", cpu " << int(want.bytes[first]) << ", poison "
                         << int(poison) << ")";
      ASSERT_EQ(dout[i]->guard_damage(), -1) << "output " << i << ": write outside the tensor";
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!din[i]) continue;
      ASSERT_EQ(din[i]->guard_damage(), -1) << "input " << i << ": guard changed";
      ASSERT_TRUE(din[i]->download().bytes == inputs[i]->bytes) << "input " << i << " changed";
    }
  }
}

const mxmoe_scale_mode kAllModes[] = {MXMOE_SCALE_RCEIL, MXMOE_SCALE_FLOOR, MXMOE_SCALE_CEIL, MXMOE_SCALE_EVEN};

std::string mode_str(mxmoe_scale_mode m) {
  const char* n[] = {"RCEIL", "FLOOR", "CEIL", "EVEN"};
  return n[m];
}
std::string dt_str(mxmoe_dtype d) { return d == MXMOE_DTYPE_BF16 ? "bf16" : "f32"; }
std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + ")";
}

// MX_SPEC special values, sprinkled: whole rows, whole columns and single elements.
void add_specials(Buffer& x, uint32_t seed) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> sv = {0.0f, -0.0f, std::ldexp(1.0f, -126), std::nanf(""), inf, -inf, 448.0f, -448.0f,
                                 480.0f, -480.0f, mxtest::float_of(0x7F7FFFFF), mxtest::float_of(0x7F7F0000),
                                 mxtest::float_of(0x00010000), mxtest::float_of(0x00000001),
                                 -mxtest::float_of(0x00000001), mxtest::float_of(0x40600001),
                                 mxtest::float_of(0x43FFFFFF), 1.0f};
  const int64_t C = x.shape.back(), rows = x.numel() / C;
  std::mt19937 rng(seed);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = r * C + c;
      if (r % 13 == 5) x.set(i, sv[(r / 13) % sv.size()] * ((c % 2) ? -1.f : 1.f));
      else if (c % 17 == 3) x.set(i, sv[(c / 17 + r / 32) % sv.size()]);
      else if (rng() % 1500 == 0) x.set(i, sv[rng() % sv.size()]);
    }
}

struct QOut {
  bool q = true, qt = true, sc = true, sr = true;
};

// mxmoe_quantize, CPU vs GPU. dims: {R, C} or {B, R, C}.
void check_quantize(std::vector<int64_t> dims, mxmoe_dtype dtype, mxmoe_quant_config cfg,
                    const std::vector<int32_t>* offs_v, QOut want, uint32_t seed, bool specials = false,
                    size_t misalign = 0) {
  const int64_t G = offs_v ? static_cast<int64_t>(offs_v->size()) : 0;
  const bool three = dims.size() == 3;
  const int64_t R = dims[dims.size() - 2], C = dims.back();
  auto bat = [&](std::vector<int64_t> t) {
    if (three) t.insert(t.begin(), dims[0]);
    return t;
  };
  Buffer x = mxtest::random_input(dims, dtype, seed);
  if (specials) add_specials(x, seed);
  const bool along_c = cfg.block_c > 1, along_r = cfg.block_r > 1;
  const bool has_offs = offs_v != nullptr;
  Buffer offs = has_offs ? mxtest::offsets(*offs_v) : Buffer();
  const int64_t n_r = has_offs ? cdiv(R, 32) + G : R / 32;
  std::vector<OutSpec> outs = {
      {bat({R, C}), MXMOE_DTYPE_E4M3, misalign ? 1u : 0u, want.q},
      {bat({C, R}), MXMOE_DTYPE_E4M3, misalign ? 3u : 0u, want.qt},
      {bat({R, C / 32}), MXMOE_DTYPE_E8M0, misalign ? 2u : 0u, want.sc && along_c},
      {bat({C, n_r}), MXMOE_DTYPE_E8M0, misalign ? 1u : 0u, want.sr && along_r},
  };
  const std::string what = "quantize " + shape_str(dims) + " " + dt_str(dtype) + " " + std::to_string(cfg.block_r) +
                           "x" + std::to_string(cfg.block_c) + " " + mode_str(cfg.mode) + " G=" +
                           (has_offs ? std::to_string(G) : "none") + (misalign ? " misaligned" : "");
  compare_op(what, {&x, has_offs ? &offs : nullptr}, {misalign ? mxtest::elem_size(dtype) : 0, 0}, outs,
             [&](const std::vector<mxmoe_tensor*>& in, const std::vector<mxmoe_tensor*>& o, void* s) {
               return mxmoe_quantize(in[0], in[1], cfg, o[0], o[1], o[2], o[3], s);
             });
}

std::vector<int32_t> jagged_offsets(int64_t M, int G, uint32_t seed, bool cover_all = true) {
  std::mt19937 rng(seed);
  std::vector<int32_t> cuts;
  for (int g = 0; g < G - 1; ++g) cuts.push_back(static_cast<int32_t>(rng() % (M + 1)));
  // A few empty groups (repeated cuts) on purpose.
  if (G > 4) cuts[1] = cuts[2];
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(static_cast<int32_t>(cover_all ? M : M - M / 7));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

}  // namespace

// The hardware e4m3 conversion the kernels use against the CPU's integer codec: blocks whose
// scale byte is 127 (FLOOR, amax 448: reciprocal 1), so each element is e4m3(x) directly, over
// every fp32 exponent below 2^9 and mantissas around every rounding boundary.
TEST(CudaQuantize, HwConversionPatterns) {
  REQUIRE_GPU();
  std::vector<float> vals;
  std::mt19937 rng(5);
  for (uint32_t E = 0; E <= 135; ++E) {
    std::vector<uint32_t> mants = {0, 1, 0x7FFFFF, 0x400000, 0x400001, 0x3FFFFF};
    for (uint32_t t = 0; t < 8; ++t)
      for (uint32_t lo : {0u, 1u, 0x7FFFFu, 0x80000u, 0x80001u, 0xFFFFFu})
        mants.push_back((t << 20) | lo);
    for (int k = 0; k < 32; ++k) mants.push_back(rng() & 0x7FFFFF);
    if (E >= 110)  // dense: every top-16-bit mantissa (random low bits) for the e4m3 range
      for (uint32_t k = 0; k < 65536; k += (E >= 118 ? 1 : 7)) mants.push_back((k << 7) | (rng() & 0x7F));
    for (uint32_t m : mants)
      for (uint32_t sign : {0u, 0x80000000u}) {
        const float v = mxtest::float_of(sign | (E << 23) | m);
        if (std::fabs(v) <= 448.0f) vals.push_back(v);
      }
  }
  const int64_t blocks = cdiv(static_cast<int64_t>(vals.size()), 31);
  const int64_t C = 32 * 64, R = cdiv(blocks, 64);
  Buffer x({R, C}, MXMOE_DTYPE_F32);
  size_t k = 0;
  for (int64_t i = 0; i < R * C; ++i) x.data<float>()[i] = (i % 32 == 0) ? 448.0f : (k < vals.size() ? vals[k++] : 1.0f);
  mxmoe_quant_config cfg{1, 32, MXMOE_SCALE_FLOOR};
  compare_op("e4m3 patterns", {&x}, {0}, {{{R, C}, MXMOE_DTYPE_E4M3}, {{R, C / 32}, MXMOE_DTYPE_E8M0}},
             [&](const std::vector<mxmoe_tensor*>& in, const std::vector<mxmoe_tensor*>& o, void* s) {
               return mxmoe_quantize(in[0], nullptr, cfg, o[0], nullptr, o[1], nullptr, s);
             });
}

TEST(CudaQuantize, AlongC) {
  REQUIRE_GPU();
  uint32_t seed = 10;
  const std::vector<std::vector<int64_t>> shapes = {{1, 32}, {3, 64}, {130, 160}, {257, 96}, {3, 130, 160}, {64, 1024},
                                                    {2000, 2048}};
  for (auto& sh : shapes)
    for (mxmoe_dtype dt : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (mxmoe_scale_mode mode : kAllModes)
        for (int bc : {32, 128}) {
          check_quantize(sh, dt, {1, bc, mode}, nullptr, QOut{}, seed++);
          QOut only_q;
          only_q.qt = false;
          check_quantize(sh, dt, {1, bc, mode}, nullptr, only_q, seed++);
        }
  // Token groups do not change blocks along C (offs ignored): same bytes as without.
  const std::vector<int32_t> offs = {10, 100};
  check_quantize({130, 160}, MXMOE_DTYPE_BF16, {1, 32, MXMOE_SCALE_RCEIL}, &offs, QOut{}, seed++);
}

TEST(CudaQuantize, AlongR) {
  REQUIRE_GPU();
  uint32_t seed = 1000;
  const std::vector<std::vector<int64_t>> shapes = {{64, 40}, {160, 130}, {96, 8}, {2, 96, 72}, {256, 512}};
  for (auto& sh : shapes)
    for (mxmoe_dtype dt : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (mxmoe_scale_mode mode : kAllModes)
        for (int br : {32, 128}) check_quantize(sh, dt, {br, 1, mode}, nullptr, QOut{}, seed++);
  // Token groups: jagged, empty, partial last blocks, rows past the last group, G = 0.
  const std::vector<std::vector<int32_t>> groups = {{0, 45, 45, 130, 290}, {300}, {}, {1}, {31, 32, 33, 64, 65, 299}};
  for (auto& g : groups)
    for (mxmoe_dtype dt : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (mxmoe_scale_mode mode : kAllModes)
        for (int br : {32, 128}) {
          check_quantize({300, 136}, dt, {br, 1, mode}, &g, QOut{}, seed++);
          QOut wgrad;  // the wgrad operand: transposed codes + scales only
          wgrad.q = false;
          check_quantize({300, 136}, dt, {br, 1, mode}, &g, wgrad, seed++);
        }
}

TEST(CudaQuantize, Tiles128) {
  REQUIRE_GPU();
  uint32_t seed = 2000;
  for (mxmoe_dtype dt : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
    for (mxmoe_scale_mode mode : kAllModes) {
      QOut sc_only;
      sc_only.sr = false;
      check_quantize({130, 160}, dt, {128, 128, mode}, nullptr, sc_only, seed++);  // partial edge tiles
      check_quantize({256, 384}, dt, {128, 128, mode}, nullptr, QOut{}, seed++);
      check_quantize({3, 160, 256}, dt, {128, 128, mode}, nullptr, QOut{}, seed++);
      const std::vector<int32_t> g = {100, 100, 250};
      check_quantize({300, 160}, dt, {128, 128, mode}, &g, QOut{}, seed++);
    }
}

TEST(CudaQuantize, ManyGroups) {
  REQUIRE_GPU();
  uint32_t seed = 3000;
  for (int G : {8, 33, 64, 700}) {  // 700 > one 512-group scan chunk
    const int64_t M = G == 700 ? 5000 : 2000;
    const std::vector<int32_t> g = jagged_offsets(M, G, seed, G != 33);
    for (mxmoe_dtype dt : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
      for (int br : {32, 128}) check_quantize({M, 64}, dt, {br, 1, MXMOE_SCALE_RCEIL}, &g, QOut{}, seed++);
    check_quantize({M, 160}, MXMOE_DTYPE_BF16, {128, 128, MXMOE_SCALE_FLOOR}, &g, QOut{}, seed++);
  }
}

// Offsets that break the contract (decreasing, negative, past M) are clamped, never trusted: same
// bytes as the CPU core's clamping, and no access outside any tensor (guards).
TEST(CudaQuantize, GarbageOffsets) {
  REQUIRE_GPU();
  uint32_t seed = 4000;
  const std::vector<std::vector<int32_t>> groups = {{5, 3, 400, -2}, {-7, -1}, {1 << 30, 10}, {200, 100, 250, 9999}};
  for (auto& g : groups)
    for (int br : {32, 128}) {
      check_quantize({300, 136}, MXMOE_DTYPE_BF16, {br, 1, MXMOE_SCALE_RCEIL}, &g, QOut{}, seed++);
      check_quantize({300, 160}, MXMOE_DTYPE_F32, {128, 128, MXMOE_SCALE_RCEIL}, &g, QOut{}, seed++);
    }
}

TEST(CudaQuantize, SpecialValues) {
  REQUIRE_GPU();
  uint32_t seed = 5000;
  const std::vector<int32_t> g = {0, 45, 45, 130, 290};
  for (mxmoe_dtype dt : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
    for (mxmoe_scale_mode mode : kAllModes) {
      check_quantize({300, 256}, dt, {1, 32, mode}, nullptr, QOut{}, seed++, true);
      check_quantize({300, 256}, dt, {1, 128, mode}, nullptr, QOut{}, seed++, true);
      check_quantize({300, 136}, dt, {32, 1, mode}, &g, QOut{}, seed++, true);
      check_quantize({288, 136}, dt, {128, 1, mode}, nullptr, QOut{}, seed++, true);
      check_quantize({300, 256}, dt, {128, 128, mode}, &g, QOut{}, seed++, true);
    }
}

TEST(CudaQuantize, Misaligned) {
  REQUIRE_GPU();
  uint32_t seed = 6000;
  const std::vector<int32_t> g = {0, 45, 45, 130, 290};
  for (mxmoe_dtype dt : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}) {
    check_quantize({130, 160}, dt, {1, 32, MXMOE_SCALE_RCEIL}, nullptr, QOut{}, seed++, false, 1);
    check_quantize({130, 160}, dt, {1, 128, MXMOE_SCALE_FLOOR}, nullptr, QOut{}, seed++, false, 1);
    check_quantize({300, 136}, dt, {32, 1, MXMOE_SCALE_RCEIL}, &g, QOut{}, seed++, false, 1);
    check_quantize({96, 40}, dt, {128, 1, MXMOE_SCALE_RCEIL}, nullptr, QOut{}, seed++, false, 1);
    check_quantize({300, 160}, dt, {128, 128, MXMOE_SCALE_RCEIL}, &g, QOut{}, seed++, false, 1);
  }
  // Odd column counts (scalar loads / byte stores everywhere along R).
  check_quantize({64, 33}, MXMOE_DTYPE_BF16, {32, 1, MXMOE_SCALE_RCEIL}, nullptr, QOut{}, seed++);
  check_quantize({300, 7}, MXMOE_DTYPE_F32, {32, 1, MXMOE_SCALE_EVEN}, &g, QOut{}, seed++);
}

namespace {

Buffer random_bytes(std::vector<int64_t> shape, mxmoe_dtype dt, uint32_t seed) {
  Buffer b(std::move(shape), dt);
  std::mt19937 rng(seed);
  for (auto& v : b.bytes) v = static_cast<uint8_t>(rng());
  return b;
}

// Scale bytes in a realistic range (with some 0, 254, 255 and random bytes).
Buffer random_scales(std::vector<int64_t> shape, uint32_t seed) {
  Buffer b(std::move(shape), MXMOE_DTYPE_E8M0);
  std::mt19937 rng(seed);
  for (auto& v : b.bytes) {
    const uint32_t k = rng() % 100;
    v = static_cast<uint8_t>(k == 0 ? 0 : k == 1 ? 254 : k == 2 ? 255 : k < 10 ? rng() : 100 + rng() % 50);
  }
  return b;
}

void check_dequantize(std::vector<int64_t> dims, int axis, const std::vector<int32_t>* offs, mxmoe_dtype out,
                      uint32_t seed, size_t misalign = 0) {
  const bool three = dims.size() == 3;
  const int64_t R = dims[dims.size() - 2], C = dims.back();
  const int64_t len = axis == 1 ? C : R;
  const int64_t n = offs ? cdiv(len, 32) + static_cast<int64_t>(offs->size()) : len / 32;
  std::vector<int64_t> sshape = axis == 1 ? std::vector<int64_t>{R, n} : std::vector<int64_t>{C, n};
  if (three) sshape.insert(sshape.begin(), dims[0]);
  Buffer q = random_bytes(dims, MXMOE_DTYPE_E4M3, seed);
  Buffer s = random_scales(sshape, seed + 1);
  Buffer o = offs ? mxtest::offsets(*offs) : Buffer();
  const std::string what = "dequantize " + shape_str(dims) + " axis " + std::to_string(axis) + " -> " + dt_str(out) +
                           (offs ? " G=" + std::to_string(offs->size()) : "") + (misalign ? " misaligned" : "");
  const size_t out_shift = misalign ? mxtest::elem_size(out) : 0;
  compare_op(what, {&q, &s, offs ? &o : nullptr}, {misalign, misalign ? 3u : 0u, 0}, {{dims, out, out_shift}},
             [&](const std::vector<mxmoe_tensor*>& in, const std::vector<mxmoe_tensor*>& ot, void* st) {
               return mxmoe_dequantize(in[0], in[1], axis, in[2], ot[0], st);
             });
}

}  // namespace

TEST(CudaQuantize, Dequantize) {
  REQUIRE_GPU();
  uint32_t seed = 7000;
  const std::vector<int32_t> g = {0, 45, 45, 130, 290};
  const std::vector<int32_t> garbage = {50, 20, 400};
  for (mxmoe_dtype out : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32}) {
    for (int axis : {0, 1}) {
      check_dequantize({128, 256}, axis, nullptr, out, seed++);
      check_dequantize({160, 96}, axis, nullptr, out, seed++);
      check_dequantize({3, 96, 160}, axis, nullptr, out, seed++);
      check_dequantize({300, 300}, axis, &g, out, seed++);
      check_dequantize({300, 300}, axis, &garbage, out, seed++);
      check_dequantize({160, 96}, axis, nullptr, out, seed++, 1);
      check_dequantize({300, 137}, axis, &g, out, seed++, 1);
    }
    const std::vector<int32_t> many = jagged_offsets(3000, 64, 9);
    check_dequantize({3000, 64}, 0, &many, out, seed++);
    // Along R with C % 8 == 0: the warp-tile path for bf16 (partial column tiles, jagged, garbage).
    check_dequantize({300, 296}, 0, &g, out, seed++);
    check_dequantize({300, 296}, 0, &garbage, out, seed++);
    check_dequantize({2, 64, 392}, 0, nullptr, out, seed++);
    check_dequantize({64, 3000}, 1, &many, out, seed++);
  }
}

namespace {

void check_blocked(mxmoe_blocked_kind kind, std::vector<int64_t> sdims, const std::vector<int32_t>* offs, int64_t m_tokens,
                   uint32_t seed, size_t misalign = 0) {
  const int64_t G = offs ? static_cast<int64_t>(offs->size()) : 0;
  int64_t size;
  if (kind == MXMOE_BLOCKED_PER_EXPERT) size = mxmoe_blocked_size(kind, sdims[1], sdims[2], sdims[0]);
  else if (kind == MXMOE_BLOCKED_GROUPS_K) size = mxmoe_blocked_size(kind, sdims[0], m_tokens, G);
  else size = mxmoe_blocked_size(kind, sdims[0], sdims[1], G);
  Buffer s = random_scales(sdims, seed);
  Buffer o = offs ? mxtest::offsets(*offs) : Buffer();
  const std::string what = "blocked kind " + std::to_string(kind) + " " + shape_str(sdims) + (offs ? " G=" + std::to_string(G) : "");
  compare_op("to " + what, {&s, offs ? &o : nullptr}, {misalign, 0}, {{{size}, MXMOE_DTYPE_E8M0, misalign ? 5u : 0u}},
             [&](const std::vector<mxmoe_tensor*>& in, const std::vector<mxmoe_tensor*>& ot, void* st) {
               return mxmoe_scales_to_blocked(in[0], kind, in[1], ot[0], st);
             });
  Buffer b = random_bytes({size}, MXMOE_DTYPE_E8M0, seed + 7);
  compare_op("from " + what, {&b, offs ? &o : nullptr}, {misalign ? 5u : 0u, 0}, {{sdims, MXMOE_DTYPE_E8M0, misalign}},
             [&](const std::vector<mxmoe_tensor*>& in, const std::vector<mxmoe_tensor*>& ot, void* st) {
               return mxmoe_scales_from_blocked(in[0], kind, in[1], ot[0], st);
             });
}

}  // namespace

TEST(CudaQuantize, Blocked) {
  REQUIRE_GPU();
  uint32_t seed = 8000;
  for (size_t mis : {size_t{0}, size_t{1}}) {
    check_blocked(MXMOE_BLOCKED_WHOLE, {300, 5}, nullptr, seed++, mis);
    check_blocked(MXMOE_BLOCKED_WHOLE, {256, 160}, nullptr, seed++, mis);
    check_blocked(MXMOE_BLOCKED_WHOLE, {129, 70}, nullptr, seed++, mis);
    check_blocked(MXMOE_BLOCKED_PER_EXPERT, {3, 160, 37}, nullptr, seed++, mis);
    const std::vector<int32_t> g = {0, 45, 45, 130, 290};
    check_blocked(MXMOE_BLOCKED_GROUPS_M, {300, 70}, &g, 0, seed++, mis);
    const std::vector<int32_t> garbage = {50, 20, 400};
    check_blocked(MXMOE_BLOCKED_GROUPS_M, {300, 8}, &garbage, 0, seed++, mis);
    // GROUPS_K: scale (R, ceil(M/32) + G) of M tokens.
    check_blocked(MXMOE_BLOCKED_GROUPS_K, {136, cdiv(300, 32) + 5}, &g, 320, seed++, mis);
    const std::vector<int32_t> many = jagged_offsets(5000, 64, 11);
    check_blocked(MXMOE_BLOCKED_GROUPS_K, {200, cdiv(5000, 32) + 64}, &many, cdiv(5000, 32) * 32, seed++, mis);
    check_blocked(MXMOE_BLOCKED_GROUPS_M, {5000, 40}, &many, 0, seed++, mis);
    const std::vector<int32_t> many700 = jagged_offsets(20000, 700, 12);
    check_blocked(MXMOE_BLOCKED_GROUPS_K, {64, cdiv(20000, 32) + 700}, &many700, cdiv(20000, 32) * 32, seed++, mis);
    check_blocked(MXMOE_BLOCKED_GROUPS_M, {20000, 4}, &many700, 0, seed++, mis);
  }
}

namespace {

struct SideWant {
  bool on = false;
  bool q = true, qt = true, scale = true, blocked = true, dq = true, dqt = true;
  mxmoe_dtype dq_dt = MXMOE_DTYPE_BF16, dqt_dt = MXMOE_DTYPE_BF16;
};

void check_fused(std::vector<int64_t> dims, mxmoe_dtype dt, mxmoe_fused_config cfg, const std::vector<int32_t>* offs,
                 SideWant row, SideWant col, uint32_t seed, bool specials = false, size_t misalign = 0) {
  const bool three = dims.size() == 3;
  const int64_t B = three ? dims[0] : 1, R = dims[dims.size() - 2], C = dims.back();
  const int64_t G = offs ? static_cast<int64_t>(offs->size()) : 0;
  const int64_t n_r = offs ? cdiv(R, 32) + G : R / 32;
  auto bat = [&](std::vector<int64_t> t) {
    if (three) t.insert(t.begin(), B);
    return t;
  };
  auto bsize = [&](bool is_row) {
    if (three)
      return is_row ? mxmoe_blocked_size(MXMOE_BLOCKED_PER_EXPERT, R, C / 32, B)
                    : mxmoe_blocked_size(MXMOE_BLOCKED_PER_EXPERT, C, R / 32, B);
    if (offs)
      return is_row ? mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_M, R, C / 32, G)
                    : mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_K, C, R, G);
    return is_row ? mxmoe_blocked_size(MXMOE_BLOCKED_WHOLE, R, C / 32, 0)
                  : mxmoe_blocked_size(MXMOE_BLOCKED_WHOLE, C, R / 32, 0);
  };
  Buffer x = mxtest::random_input(dims, dt, seed);
  if (specials) add_specials(x, seed);
  Buffer o = offs ? mxtest::offsets(*offs) : Buffer();
  std::vector<OutSpec> outs;
  for (int s = 0; s < 2; ++s) {
    const SideWant& w = s == 0 ? row : col;
    const bool is_row = s == 0;
    const size_t m = misalign;
    outs.push_back({bat({R, C}), MXMOE_DTYPE_E4M3, m ? 1u : 0u, w.on && w.q});
    outs.push_back({bat({C, R}), MXMOE_DTYPE_E4M3, m ? 2u : 0u, w.on && w.qt});
    outs.push_back({bat(is_row ? std::vector<int64_t>{R, C / 32} : std::vector<int64_t>{C, n_r}), MXMOE_DTYPE_E8M0,
                    m ? 3u : 0u, w.on && w.scale});
    outs.push_back({{w.on && w.blocked ? bsize(is_row) : 0}, MXMOE_DTYPE_E8M0, m ? 1u : 0u, w.on && w.blocked});
    outs.push_back({bat({R, C}), w.dq_dt, m ? mxtest::elem_size(w.dq_dt) : 0u, w.on && w.dq});
    outs.push_back({bat({C, R}), w.dqt_dt, m ? (w.dqt_dt == MXMOE_DTYPE_F32 ? 4u : 2u) : 0u, w.on && w.dqt});
  }
  const std::string what = "fused " + shape_str(dims) + " " + dt_str(dt) + " row " +
                           (row.on ? std::to_string(cfg.row_block) : "-") + " col " +
                           (col.on ? std::to_string(cfg.col_block) : "-") + (cfg.tile128 ? " tile128" : "") + " " +
                           mode_str(cfg.mode) + (offs ? " G=" + std::to_string(G) : "") + (misalign ? " misaligned" : "");
  compare_op(what, {&x, offs ? &o : nullptr}, {misalign ? mxtest::elem_size(dt) : 0, 0}, outs,
             [&](const std::vector<mxmoe_tensor*>& in, const std::vector<mxmoe_tensor*>& ot, void* st) {
               mxmoe_fused_side sides[2];
               for (int s = 0; s < 2; ++s) {
                 sides[s] = mxmoe_fused_side{ot[6 * s], ot[6 * s + 1], ot[6 * s + 2], ot[6 * s + 3], ot[6 * s + 4], ot[6 * s + 5]};
               }
               return mxmoe_quantize_fused(in[0], in[1], cfg, row.on ? &sides[0] : nullptr, col.on ? &sides[1] : nullptr, st);
             });
}

SideWant side_all(mxmoe_dtype dq = MXMOE_DTYPE_BF16, mxmoe_dtype dqt = MXMOE_DTYPE_BF16) {
  SideWant w;
  w.on = true;
  w.dq_dt = dq;
  w.dqt_dt = dqt;
  return w;
}

}  // namespace

TEST(CudaQuantize, Fused) {
  REQUIRE_GPU();
  uint32_t seed = 9000;
  const std::vector<int32_t> g = {0, 45, 45, 130, 290};
  const std::vector<int32_t> many = jagged_offsets(2000, 64, 21);
  SideWant off;
  for (mxmoe_dtype dt : {MXMOE_DTYPE_BF16, MXMOE_DTYPE_F32})
    for (mxmoe_scale_mode mode : {MXMOE_SCALE_RCEIL, MXMOE_SCALE_FLOOR}) {
      for (int rb : {32, 128})
        for (int cb : {32, 128}) {
          mxmoe_fused_config cfg{rb, cb, 0, mode};
          check_fused({256, 160}, dt, cfg, nullptr, side_all(), side_all(MXMOE_DTYPE_F32, MXMOE_DTYPE_F32), seed++);
          check_fused({300, 96}, dt, cfg, &g, side_all(MXMOE_DTYPE_F32, MXMOE_DTYPE_BF16), side_all(), seed++);
          check_fused({2, 96, 160}, dt, cfg, nullptr, side_all(), side_all(), seed++);
        }
      mxmoe_fused_config tile{128, 128, 1, mode};
      check_fused({256, 160}, dt, tile, nullptr, side_all(), side_all(), seed++);
      check_fused({300, 160}, dt, tile, &g, side_all(), side_all(MXMOE_DTYPE_F32, MXMOE_DTYPE_F32), seed++);
      check_fused({2, 160, 288}, dt, tile, nullptr, side_all(), side_all(), seed++);
      check_fused({130, 96}, dt, tile, nullptr, side_all(), off, seed++);
      // The exact recipe's operands: round trips only.
      SideWant rt;
      rt.on = true;
      rt.q = rt.qt = rt.scale = rt.blocked = false;
      check_fused({300, 96}, dt, {32, 32, 0, mode}, &g, rt, rt, seed++);
      check_fused({2000, 64}, dt, {32, 32, 0, mode}, &many, side_all(), side_all(), seed++);
      check_fused({300, 256}, dt, {32, 32, 0, mode}, &g, side_all(), side_all(), seed++, true);
      check_fused({300, 96}, dt, {32, 128, 0, mode}, &g, side_all(), side_all(), seed++, false, 1);
    }
  mxmoe_fused_config cfg{32, 32, 0, MXMOE_SCALE_CEIL};
  check_fused({300, 96}, MXMOE_DTYPE_BF16, cfg, &g, side_all(), side_all(), seed++);
  cfg.mode = MXMOE_SCALE_EVEN;
  check_fused({300, 96}, MXMOE_DTYPE_F32, cfg, &g, side_all(), side_all(), seed++);
}

// The combinations the warp-tile kernel takes (bf16 in, 32x1 with or without 1x32, compact scales,
// bf16 round trips, no blocked scales): the sm90 backend's operands and the wgrad operand. Shapes
// with C not a multiple of 64 (partial column tiles), R not a multiple of 16 (unaligned transposed
// rows), jagged / empty / tiny groups, rows past the last group, batches, specials, misaligned
// outputs (scalar fallback on the host side).
TEST(CudaQuantize, FusedWarpTile) {
  REQUIRE_GPU();
  uint32_t seed = 9500;
  auto want = [](bool q, bool qt, bool scale, bool dq, bool dqt) {
    SideWant w;
    w.on = true;
    w.q = q;
    w.qt = qt;
    w.scale = scale;
    w.blocked = false;
    w.dq = dq;
    w.dqt = dqt;
    return w;
  };
  SideWant off;
  const SideWant row_dq = want(false, false, false, true, false), row_qs = want(true, false, true, false, false),
                 row_all = want(true, false, true, true, false);
  const SideWant col_qs = want(true, false, true, false, false), col_dq = want(false, false, false, true, false),
                 col_qts = want(false, true, true, false, false), col_dqt = want(false, false, false, false, true),
                 col_all = want(true, true, true, true, true);
  const std::vector<int32_t> g = {0, 45, 45, 130, 290};
  const std::vector<int32_t> g16 = {64, 64, 192, 256};  // 16-aligned starts: vector transposed stores
  const std::vector<int32_t> many = jagged_offsets(2000, 64, 31);
  const std::vector<std::pair<SideWant, SideWant>> combos = {
      {row_dq, col_qs}, {row_dq, col_dq}, {row_qs, col_qts}, {row_dq, col_dqt}, {row_all, col_all},
      {off, col_qts},   {off, col_all},   {off, col_dq}};
  for (mxmoe_scale_mode mode : kAllModes)
    for (const auto& rc : combos) {
      mxmoe_fused_config cfg{32, 32, 0, mode};
      check_fused({300, 96}, MXMOE_DTYPE_BF16, cfg, &g, rc.first, rc.second, seed++);
      check_fused({256, 160}, MXMOE_DTYPE_BF16, cfg, &g16, rc.first, rc.second, seed++);
      check_fused({256, 128}, MXMOE_DTYPE_BF16, cfg, nullptr, rc.first, rc.second, seed++);
      check_fused({2, 96, 160}, MXMOE_DTYPE_BF16, cfg, nullptr, rc.first, rc.second, seed++);
      check_fused({300, 256}, MXMOE_DTYPE_BF16, cfg, &g, rc.first, rc.second, seed++, true);
    }
  for (const auto& rc : combos) {
    mxmoe_fused_config cfg{32, 32, 0, MXMOE_SCALE_RCEIL};
    check_fused({2000, 64}, MXMOE_DTYPE_BF16, cfg, &many, rc.first, rc.second, seed++);
    check_fused({300, 96}, MXMOE_DTYPE_BF16, cfg, &g, rc.first, rc.second, seed++, false, 1);
    const std::vector<int32_t> g37 = {20, 33};  // partial blocks, rows 33..36 past the groups
    check_fused({37, 40}, MXMOE_DTYPE_BF16, {32, 32, 0, MXMOE_SCALE_FLOOR}, &g37, off, rc.second, seed++);
  }
}

// The combinations the tile128 pass kernel takes (cuda/quantize/tile128_bf16.cu: bf16 in, compact scales,
// rowwise 1x128 codes + columnwise 128x1 transposed codes, or the 128x128 tile in both orientations):
// the tile128 recipe's activation and weight passes. Groups jagged / empty / 16-aligned / many, rows
// past the last group, partial panels and column tiles (C = 64, 96, 160, 416), batches, specials,
// unaligned transposed rows (R = 37, 300), misaligned outputs, and requests it leaves to the general
// kernels (more than 512 groups, misaligned codes) for the routing around it.
namespace {
// A side of the tile128 pass: codes in x's orientation (q), transposed (qt), compact scales.
SideWant codes_side(bool q, bool qt, bool scale) {
  SideWant w;
  w.on = true;
  w.q = q;
  w.qt = qt;
  w.scale = scale;
  w.blocked = w.dq = w.dqt = false;
  return w;
}
}  // namespace

TEST(CudaQuantize, FusedTile128Pass) {
  REQUIRE_GPU();
  uint32_t seed = 9700;
  const auto want = codes_side;
  SideWant off;
  const SideWant row_qs = want(true, false, true), row_q = want(true, false, false), row_s = want(false, false, true),
                 row_all = want(true, true, true);
  const SideWant col_qts = want(false, true, true), col_qt = want(false, true, false), col_s = want(false, false, true);
  const std::vector<std::pair<SideWant, SideWant>> act = {
      {row_qs, col_qts}, {off, col_qts}, {row_q, col_qt}, {row_s, col_s}, {row_qs, col_qt}};
  const std::vector<std::pair<SideWant, SideWant>> tile = {
      {row_qs, col_qts}, {row_all, col_s}, {row_qs, off}, {off, col_qts}, {row_q, col_qt}};
  const std::vector<int32_t> g = {0, 45, 45, 130, 290};
  const std::vector<int32_t> g16 = {64, 64, 192, 256};
  const std::vector<int32_t> g37 = {20, 33};
  const std::vector<int32_t> many = jagged_offsets(2000, 64, 41);
  const std::vector<int32_t> too_many = jagged_offsets(2000, 600, 42);
  for (mxmoe_scale_mode mode : kAllModes)
    for (int t = 0; t < 2; ++t)
      for (const auto& rc : t ? tile : act) {
        const mxmoe_fused_config cfg{128, 128, t, mode};
        check_fused({256, 160}, MXMOE_DTYPE_BF16, cfg, nullptr, rc.first, rc.second, seed++);
        check_fused({224, 416}, MXMOE_DTYPE_BF16, cfg, nullptr, rc.first, rc.second, seed++);
        check_fused({2, 160, 288}, MXMOE_DTYPE_BF16, cfg, nullptr, rc.first, rc.second, seed++);
        check_fused({300, 96}, MXMOE_DTYPE_BF16, cfg, &g, rc.first, rc.second, seed++);
        check_fused({256, 160}, MXMOE_DTYPE_BF16, cfg, &g16, rc.first, rc.second, seed++);
        check_fused({37, 96}, MXMOE_DTYPE_BF16, cfg, &g37, rc.first, rc.second, seed++);
        check_fused({2000, 64}, MXMOE_DTYPE_BF16, cfg, &many, rc.first, rc.second, seed++);
        check_fused({300, 256}, MXMOE_DTYPE_BF16, cfg, &g, rc.first, rc.second, seed++, true);
      }
  for (int t = 0; t < 2; ++t) {
    const mxmoe_fused_config cfg{128, 128, t, MXMOE_SCALE_RCEIL};
    check_fused({300, 96}, MXMOE_DTYPE_BF16, cfg, &g, row_qs, col_qts, seed++, false, 1);
    check_fused({300, 96}, MXMOE_DTYPE_BF16, cfg, &g, off, col_qts, seed++, false, 1);
    check_fused({2000, 64}, MXMOE_DTYPE_BF16, cfg, &too_many, row_qs, col_qts, seed++);
  }
}

// Shapes with many tiles per CTA (the persistent grid is ~2-3 CTAs per SM): the tile128 pass kernel
// resolves its tiles in increasing order with a forward-only group cursor (advance_group), which only
// a CTA walking several panels and groups exercises; with 500 groups one step passes more than 32
// groups (several ballot rounds). Jagged, 16-aligned and empty groups, rows past the last group.
TEST(CudaQuantize, FusedTile128PassManyTiles) {
  REQUIRE_GPU();
  uint32_t seed = 9900;
  const SideWant qs = codes_side(true, false, true), qts = codes_side(false, true, true), off;
  const std::vector<int32_t> g64 = jagged_offsets(40000, 64, 43, false);  // rows past the last group
  std::vector<int32_t> g64a(64);
  for (int g = 0; g < 64; ++g) g64a[g] = 16 * ((40000 / 16) * (g + 1) / 64);
  g64a[5] = g64a[4];  // an empty group
  const std::vector<int32_t> g500 = jagged_offsets(20000, 500, 44);
  for (int t = 0; t < 2; ++t) {
    const mxmoe_fused_config cfg{128, 128, t, MXMOE_SCALE_RCEIL};
    check_fused({40000, 1024}, MXMOE_DTYPE_BF16, cfg, &g64, qs, qts, seed++);
    check_fused({40000, 1024}, MXMOE_DTYPE_BF16, cfg, &g64a, qs, qts, seed++);
    check_fused({20000, 256}, MXMOE_DTYPE_BF16, cfg, &g500, qs, qts, seed++);
    check_fused({20000, 256}, MXMOE_DTYPE_BF16, cfg, &g500, off, qts, seed++);
    check_fused({40000, 1024}, MXMOE_DTYPE_BF16, cfg, nullptr, qs, qts, seed++);
  }
}

// The weights' request (128x128 tiles, no groups, bf16 x itself) on Hopper runs by TMA
// (cuda/quantize/sm90_bf16_quantize_128x128.cu): 3D and 2D, partial row and column tiles (R = 736,
// 224, 200; C = 2880, 160), enough tiles for several turns of each CTA's slot ring and of its tile
// order's row bands, each output alone or with others, specials, every mode; and the requests it
// leaves to the general kernel (qt wanted with R % 16 != 0, misaligned outputs).
TEST(CudaQuantize, FusedTile128Weights) {
  REQUIRE_GPU();
  uint32_t seed = 9950;
  const auto want = codes_side;
  SideWant off;
  const SideWant row_qs = want(true, false, true), row_q = want(true, false, false), row_s = want(false, false, true),
                 row_all = want(true, true, true);
  const SideWant col_qts = want(false, true, true), col_qt = want(false, true, false), col_s = want(false, false, true);
  const std::vector<std::pair<SideWant, SideWant>> sides = {{row_qs, col_qts}, {row_all, col_s}, {row_qs, off},
                                                            {off, col_qts},    {row_q, col_qt},  {row_s, col_s}};
  for (mxmoe_scale_mode mode : kAllModes)
    for (const auto& rc : sides) {
      const mxmoe_fused_config cfg{128, 128, 1, mode};
      check_fused({4, 736, 2880}, MXMOE_DTYPE_BF16, cfg, nullptr, rc.first, rc.second, seed++);
      check_fused({2, 224, 160}, MXMOE_DTYPE_BF16, cfg, nullptr, rc.first, rc.second, seed++, true);
      check_fused({384, 256}, MXMOE_DTYPE_BF16, cfg, nullptr, rc.first, rc.second, seed++);
    }
  for (mxmoe_scale_mode mode : kAllModes) {
    // R = 200: the rowwise side only (the columnwise scales need R % 32 == 0); with qt, R % 16 != 0
    // leaves it to the general kernel.
    const mxmoe_fused_config cfg{128, 128, 1, mode};
    check_fused({2, 200, 160}, MXMOE_DTYPE_BF16, cfg, nullptr, row_qs, off, seed++);
    check_fused({2, 200, 160}, MXMOE_DTYPE_BF16, cfg, nullptr, row_all, off, seed++);
  }
  const mxmoe_fused_config cfg{128, 128, 1, MXMOE_SCALE_RCEIL};
  check_fused({32, 768, 1024}, MXMOE_DTYPE_BF16, cfg, nullptr, row_qs, col_qts, seed++, true);
  check_fused({9, 1536, 640}, MXMOE_DTYPE_BF16, cfg, nullptr, row_qs, col_qt, seed++);
  check_fused({4, 736, 2880}, MXMOE_DTYPE_BF16, cfg, nullptr, row_qs, col_qts, seed++, false, 1);
  check_fused({3, 2432, 256}, MXMOE_DTYPE_BF16, cfg, nullptr, row_qs, col_qts, seed++);  // 19 row tiles: 3 bands
}

TEST(CudaQuantize, CheckOffsets) {
  REQUIRE_GPU();
  auto run = [](const std::vector<int32_t>& v, int64_t m) {
    Buffer h = mxtest::offsets(v);
    DevBuf d(h.shape, MXMOE_DTYPE_I32, 0);
    d.upload(h);
    mxmoe_tensor t = d.view();
    return mxmoe_check_offsets(&t, m, nullptr);
  };
  EXPECT_EQ(run({0, 10, 10, 64}, 64), MXMOE_OK) << mxmoe_last_error();
  EXPECT_EQ(run({}, 64), MXMOE_OK) << mxmoe_last_error();
  EXPECT_EQ(run({0, 10, 5}, 64), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("offs[2]"), std::string::npos) << mxmoe_last_error();
  EXPECT_EQ(run({-1}, 64), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(run({10, 65}, 64), MXMOE_ERR_INVALID_ARGUMENT);
}

// Kernels run on the caller's stream: work queued behind a long operation on a non-default stream
// completes in order, and the result matches the default-stream run.
TEST(CudaQuantize, RunsOnGivenStream) {
  REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  Buffer x = mxtest::random_input({256, 256}, MXMOE_DTYPE_BF16, 77);
  DevBuf dx(x.shape, x.dtype, 0), dq({256, 256}, MXMOE_DTYPE_E4M3, 0), ds({256, 8}, MXMOE_DTYPE_E8M0, 0);
  dx.upload(x);
  dq.fill(0xA5);
  ds.fill(0xA5);
  mxmoe_tensor xv = dx.view(), qv = dq.view(), sv = ds.view();
  mxmoe_quant_config cfg{1, 32, MXMOE_SCALE_RCEIL};
  ASSERT_EQ(mxmoe_quantize(&xv, nullptr, cfg, &qv, nullptr, &sv, nullptr, s), MXMOE_OK) << mxmoe_last_error();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  Buffer hq({256, 256}, MXMOE_DTYPE_E4M3), hs({256, 8}, MXMOE_DTYPE_E8M0);
  mxmoe_tensor hxv = x.view(), hqv = hq.view(), hsv = hs.view();
  ASSERT_EQ(mxmoe_quantize(&hxv, nullptr, cfg, &hqv, nullptr, &hsv, nullptr, nullptr), MXMOE_OK);
  EXPECT_TRUE(dq.download().bytes == hq.bytes);
  EXPECT_TRUE(ds.download().bytes == hs.bytes);
  cudaStreamDestroy(s);
}

// A small run of every kernel, for compute-sanitizer (memcheck) in the device step.
TEST(CudaQuantize, SmallSanitizer) {
  REQUIRE_GPU();
  const std::vector<int32_t> g = {0, 45, 45, 130, 290};
  const std::vector<int32_t> garbage = {5, 3, 400, -2};
  check_quantize({130, 160}, MXMOE_DTYPE_BF16, {1, 32, MXMOE_SCALE_RCEIL}, nullptr, QOut{}, 1);
  // Enough tiles that persistent CTAs walk several (pipelined prefetch across tiles).
  const std::vector<int32_t> g8 = jagged_offsets(8192, 8, 3);
  check_quantize({4096, 2048}, MXMOE_DTYPE_BF16, {1, 32, MXMOE_SCALE_RCEIL}, nullptr, QOut{}, 11);
  check_quantize({8192, 1024}, MXMOE_DTYPE_BF16, {32, 1, MXMOE_SCALE_RCEIL}, &g8, QOut{}, 12);
  check_fused({8192, 1024}, MXMOE_DTYPE_F32, {32, 32, 0, MXMOE_SCALE_RCEIL}, &g8, side_all(), side_all(), 13);
  check_quantize({300, 136}, MXMOE_DTYPE_F32, {32, 1, MXMOE_SCALE_FLOOR}, &g, QOut{}, 2, false, 1);
  check_quantize({300, 160}, MXMOE_DTYPE_BF16, {128, 128, MXMOE_SCALE_RCEIL}, &garbage, QOut{}, 3);
  check_dequantize({300, 137}, 0, &g, MXMOE_DTYPE_BF16, 4, 1);
  check_dequantize({137, 300}, 1, &g, MXMOE_DTYPE_F32, 5);
  check_dequantize({300, 296}, 0, &g, MXMOE_DTYPE_BF16, 16);  // warp-tile dequantize
  check_blocked(MXMOE_BLOCKED_GROUPS_K, {136, cdiv(300, 32) + 5}, &g, 320, 6);
  check_blocked(MXMOE_BLOCKED_GROUPS_M, {300, 70}, &g, 0, 7, 1);
  check_fused({300, 96}, MXMOE_DTYPE_BF16, {32, 32, 0, MXMOE_SCALE_RCEIL}, &g, side_all(), side_all(MXMOE_DTYPE_F32, MXMOE_DTYPE_F32), 8);
  check_fused({2, 160, 288}, MXMOE_DTYPE_F32, {128, 128, 1, MXMOE_SCALE_RCEIL}, nullptr, side_all(), side_all(), 9, false, 1);
  // The warp-tile kernel: unaligned transposed rows (R = 300), partial column tiles, all outputs.
  SideWant row = side_all(), col = side_all();
  row.qt = row.dqt = row.blocked = col.blocked = false;
  check_fused({300, 96}, MXMOE_DTYPE_BF16, {32, 32, 0, MXMOE_SCALE_RCEIL}, &g, row, col, 14);
  check_quantize({300, 136}, MXMOE_DTYPE_BF16, {32, 1, MXMOE_SCALE_RCEIL}, &garbage, QOut{}, 15);
  // The tile128 pass kernel: activations (1x128 + 128x1 per group) over garbage offsets, unaligned
  // transposed rows and enough tiles that CTAs walk several (prefetch of the next tile); weights.
  SideWant rq = side_all(), cq = side_all();
  rq.qt = rq.dq = rq.dqt = rq.blocked = cq.q = cq.dq = cq.dqt = cq.blocked = false;
  check_fused({300, 160}, MXMOE_DTYPE_BF16, {128, 128, 0, MXMOE_SCALE_RCEIL}, &garbage, rq, cq, 17);
  check_fused({300, 96}, MXMOE_DTYPE_BF16, {128, 128, 0, MXMOE_SCALE_FLOOR}, &g, rq, cq, 18);
  check_fused({8192, 1024}, MXMOE_DTYPE_BF16, {128, 128, 0, MXMOE_SCALE_RCEIL}, &g8, rq, cq, 19);
  check_fused({3, 256, 640}, MXMOE_DTYPE_BF16, {128, 128, 1, MXMOE_SCALE_RCEIL}, nullptr, rq, cq, 20);
  // The weights' TMA kernel: partial row and column tiles (clipped stores), several tiles per CTA.
  check_fused({2, 224, 160}, MXMOE_DTYPE_BF16, {128, 128, 1, MXMOE_SCALE_RCEIL}, nullptr, rq, cq, 21);
  check_fused({12, 736, 2880}, MXMOE_DTYPE_BF16, {128, 128, 1, MXMOE_SCALE_RCEIL}, nullptr, rq, cq, 22);
}

// mxmoe_quantize_fused_if / mxmoe_capture_id (the weight cache under CUDA graphs): recorded under a
// conditional node, a replay recomputes the outputs exactly when the flag is set, then clears it;
// with the flag clear the outputs keep whatever they hold (poisoned here, so a run would show).
TEST(CudaQuantize, FusedIfUnderCapture) {
  REQUIRE_GPU();
  const int64_t R = 256, C = 192;
  Buffer xh = mxtest::random_input({R, C}, MXMOE_DTYPE_BF16, 77);
  DevBuf x({R, C}, MXMOE_DTYPE_BF16, 0), q({R, C}, MXMOE_DTYPE_E4M3, 0), s({R, C / 32}, MXMOE_DTYPE_E8M0, 0);
  DevBuf qref({R, C}, MXMOE_DTYPE_E4M3, 0), sref({R, C / 32}, MXMOE_DTYPE_E8M0, 0), flag({1}, MXMOE_DTYPE_I32, 0);
  x.upload(xh);
  mxmoe_tensor xv = x.view(), qv = q.view(), sv = s.view(), qrv = qref.view(), srv = sref.view(), fv = flag.view();
  const mxmoe_fused_config cfg{32, 0, 0, MXMOE_SCALE_RCEIL};
  mxmoe_fused_side side{&qv, nullptr, &sv, nullptr, nullptr, nullptr};
  mxmoe_fused_side ref{&qrv, nullptr, &srv, nullptr, nullptr, nullptr};
  ASSERT_EQ(mxmoe_quantize_fused(&xv, nullptr, cfg, &ref, nullptr, nullptr), MXMOE_OK) << mxmoe_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  uint64_t id = 123;
  ASSERT_EQ(mxmoe_capture_id(st, &id), MXMOE_OK);
  EXPECT_EQ(id, 0u);
  // Not capturing: refused, nothing launched.
  EXPECT_EQ(mxmoe_quantize_fused_if(&fv, &xv, nullptr, cfg, &side, nullptr, st), MXMOE_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mxmoe_last_error()).find("capturing"), std::string::npos) << mxmoe_last_error();
  // Bad flags: named, expected vs actual.
  DevBuf fbad({1}, MXMOE_DTYPE_F32, 0), f2({2}, MXMOE_DTYPE_I32, 0);
  mxmoe_tensor fbv = fbad.view(), f2v = f2.view();
  EXPECT_EQ(mxmoe_quantize_fused_if(&fbv, &xv, nullptr, cfg, &side, nullptr, st), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("flag"), std::string::npos) << mxmoe_last_error();
  EXPECT_EQ(mxmoe_quantize_fused_if(&f2v, &xv, nullptr, cfg, &side, nullptr, st), MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mxmoe_last_error()).find("flag: expected one element"), std::string::npos) << mxmoe_last_error();

  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(mxmoe_capture_id(st, &id), MXMOE_OK);
  EXPECT_NE(id, 0u);
  const mxmoe_status rec = mxmoe_quantize_fused_if(&fv, &xv, nullptr, cfg, &side, nullptr, st);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_EQ(rec, MXMOE_OK) << mxmoe_last_error();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  auto replay_with_flag = [&](int32_t value) {
    q.fill(0xA5);
    s.fill(0x5A);
    EXPECT_EQ(cudaMemcpy(flag.data(), &value, 4, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    int32_t after = -1;
    EXPECT_EQ(cudaMemcpy(&after, flag.data(), 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(after, 0) << "the flag is clear after a replay";
    EXPECT_EQ(q.guard_damage(), -1);
    EXPECT_EQ(s.guard_damage(), -1);
  };
  replay_with_flag(1);
  EXPECT_EQ(q.download().bytes, qref.download().bytes);
  EXPECT_EQ(s.download().bytes, sref.download().bytes);
  replay_with_flag(0);  // flag clear: the outputs keep the poison
  EXPECT_EQ(q.download().bytes, std::vector<uint8_t>(static_cast<size_t>(R * C), 0xA5));
  EXPECT_EQ(s.download().bytes, std::vector<uint8_t>(static_cast<size_t>(R * C / 32), 0x5A));
  replay_with_flag(7);  // any nonzero value
  EXPECT_EQ(q.download().bytes, qref.download().bytes);
  EXPECT_EQ(s.download().bytes, sref.download().bytes);
  ASSERT_EQ(mxmoe_capture_id(st, &id), MXMOE_OK);
  EXPECT_EQ(id, 0u);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}
