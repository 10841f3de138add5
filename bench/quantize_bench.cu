// Bandwidth benchmark of the CUDA quantization kernels (through the public C API), against a
// cudaMemcpyDeviceToDevice of the same bytes measured in the same run (BENCH.md method: CUDA
// events, median of many timed batches after warm-up, inputs rotated so that each timed call
// reads and writes more than the 60 MB L2, random data).
//
//   quantize_bench [--json PATH] [--quick] [--filter SUBSTR]
//
// Each row: kernel, shape, median microseconds per call, achieved GB/s (bytes read + written, the
// fewest a kernel must move), and copy_ratio = (time of a device-to-device copy moving the same
// bytes) / (kernel time). Also checks, exhaustively over all 2^32 fp32 bit patterns, that the
// hardware e4m3 conversion the kernels use equals mx_format.hpp's integer codec.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mxmoe/mx_format.hpp"
#include "mxmoe/mxmoe.h"

#define CK(x)                                                                                         \
  do {                                                                                                \
    cudaError_t e_ = (x);                                                                             \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)
#define MK(x)                                                                                         \
  do {                                                                                                \
    mxmoe_status s_ = (x);                                                                            \
    if (s_ != MXMOE_OK) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, mxmoe_last_error());            \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace {

// ---- exhaustive check of the hardware e4m3 conversion ------------------------------------------------
__global__ void cvt_check_kernel(unsigned long long* mismatches, unsigned* first) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32); i += stride) {
    const uint32_t u = static_cast<uint32_t>(i);
    if (mxmoe::f32_is_nan(u)) continue;
    const float f = __uint_as_float(u);
    uint16_t hw;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hw) : "f"(0.0f), "f"(f));
    const uint8_t sw = mxmoe::e4m3_from_f32(f);
    if ((hw & 0xFF) != sw) {
      ++bad;
      atomicMin(first, u);
    }
    // bf16 round trip outputs: hardware RNE pack against the integer rounding.
    uint32_t hb;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hb) : "f"(0.0f), "f"(f));
    if ((hb & 0xFFFFu) != mxmoe::f32_to_bf16(f)) {
      ++bad;
      atomicMin(first, u);
    }
  }
  // Decode: every code except NaN, e4m3x2 -> f16x2 -> f32 against the integer decoder.
  if (blockIdx.x == 0 && threadIdx.x < 256) {
    const uint32_t code = threadIdx.x;
    if ((code & 0x7F) != 0x7F) {
      uint32_t h2;
      const uint16_t in = static_cast<uint16_t>(code);
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
      float lo;
      asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %1;\n\tcvt.f32.f16 %0, a;\n\t}" : "=f"(lo) : "r"(h2));
      if (__float_as_uint(lo) != __float_as_uint(mxmoe::e4m3_to_f32(static_cast<uint8_t>(code)))) {
        ++bad;
        atomicMin(first, 0xFFFFFF00u | code);
      }
    }
  }
  if (bad) atomicAdd(mismatches, bad);
}

// ---- random inputs -------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// bf16 values: uniform mantissa, exponents spread over 2^-8..2^7, random sign.
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(i * 0x9E3779B97F4A7C15ULL + seed);
    const uint32_t e = 119 + (h >> 28);                // 2^-8 .. 2^7
    p[i] = static_cast<uint16_t>(((h & 0x8000u) | (e << 7) | (h & 0x7Fu)));
  }
}

// bf16 values like a layer's pre-activations: normal with standard deviation 3 (Box-Muller on two
// hashes), for the SwiGLU sources (fill_bf16's exponents up to 2^7 make exp(-g) overflow for ~5 % of
// the gates, a path real activations rarely take).
__global__ void fill_bf16_normal(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h1 = hash32(i * 0x9E3779B97F4A7C15ULL + seed), h2 = hash32(i * 0xC2B2AE3D27D4EB4FULL + seed + 1);
    const float u1 = (static_cast<float>(h1 >> 8) + 1.0f) * (1.0f / 16777216.0f), u2 = static_cast<float>(h2 >> 8) * (1.0f / 16777216.0f);
    const float v = 3.0f * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    p[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
  }
}

// e4m3 codes without NaN, or scale bytes in 110..139.
__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed, int scales) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(i * 0x9E3779B97F4A7C15ULL + seed);
    uint8_t v = static_cast<uint8_t>(h);
    if (scales) v = static_cast<uint8_t>(110 + h % 30);
    else if ((v & 0x7F) == 0x7F) v ^= 1;
    p[i] = v;
  }
}

// ---- tensors ---------------------------------------------------------------------------------------------
mxmoe_tensor view(void* p, mxmoe_dtype dt, std::vector<int64_t> shape) {
  mxmoe_tensor t{};
  t.data = p;
  t.dtype = dt;
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

size_t dsize(mxmoe_dtype d) { return d == MXMOE_DTYPE_BF16 ? 2 : (d == MXMOE_DTYPE_F32 || d == MXMOE_DTYPE_I32) ? 4 : 1; }

struct Spec {
  std::vector<int64_t> shape;
  mxmoe_dtype dtype;
  enum Init { kOut, kBf16, kCodes, kScales, kOffs, kBf16Normal } init;
  std::vector<int32_t> offs;  // kOffs
  size_t bytes() const {
    size_t n = 1;
    for (auto v : shape) n *= static_cast<size_t>(v);
    return n * dsize(dtype);
  }
};

// One benchmark row: tensors (inputs first, then outputs) and the call on them.
struct Case {
  std::string kernel, shape;
  std::vector<Spec> tensors;
  std::function<void(std::vector<mxmoe_tensor>& t, cudaStream_t s)> call;
};

struct Row {
  std::string kernel, shape;
  double us, gbps, copy_us, ratio;
  double bytes;
};

constexpr double kL2Rotate = 200e6;  // bytes touched per rotation cycle, several times the 60 MB L2

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median microseconds per call of fn(set), rotating over nsets, batched so that one timed batch
// lasts >= ~300 us.
double time_calls(const std::function<void(int)>& fn, int nsets, cudaStream_t s) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3 * nsets; ++i) fn(i % nsets);
  CK(cudaStreamSynchronize(s));
  CK(cudaEventRecord(a, s));
  fn(0);
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float one = 0;
  CK(cudaEventElapsedTime(&one, a, b));
  const int batch = std::max(1, std::min(1000, static_cast<int>(300.0 / std::max(1e-3, one * 1000.0))));
  std::vector<float> t;
  int k = 0;
  for (int rep = 0; rep < 15; ++rep) {
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < batch; ++i) fn(k++ % nsets);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f / batch);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(t);
}

struct Runner {
  cudaStream_t stream;
  uint8_t* copy_src = nullptr;
  uint8_t* copy_dst = nullptr;
  size_t copy_cap = 0;
  std::vector<Row> rows;
  std::string filter;

  void ensure_copy(size_t n) {
    if (n <= copy_cap) return;
    if (copy_src) CK(cudaFree(copy_src));
    if (copy_dst) CK(cudaFree(copy_dst));
    copy_cap = n;
    CK(cudaMalloc(&copy_src, n));
    CK(cudaMalloc(&copy_dst, n));
    CK(cudaMemset(copy_src, 1, n));
  }

  void run(const Case& c) {
    if (!filter.empty() && (c.kernel + " " + c.shape).find(filter) == std::string::npos) return;
    double rd = 0, wr = 0;
    for (auto& sp : c.tensors) (sp.init == Spec::kOut ? wr : rd) += static_cast<double>(sp.bytes());
    const double total = rd + wr;
    const int nsets = std::max(1, std::min(8, static_cast<int>(std::ceil(kL2Rotate / total))));
    std::vector<std::vector<mxmoe_tensor>> sets(nsets);
    std::vector<void*> allocs;
    uint32_t seed = 1;
    for (int k = 0; k < nsets; ++k) {
      for (auto& sp : c.tensors) {
        void* p = nullptr;
        const size_t nb = std::max<size_t>(sp.bytes(), 16);
        CK(cudaMalloc(&p, nb));
        allocs.push_back(p);
        switch (sp.init) {
          case Spec::kOut: CK(cudaMemsetAsync(p, 0xA5, nb, stream)); break;
          case Spec::kBf16: fill_bf16<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(p), sp.bytes() / 2, seed++); break;
          case Spec::kBf16Normal:
            fill_bf16_normal<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(p), sp.bytes() / 2, seed++);
            break;
          case Spec::kCodes: fill_bytes<<<1024, 256, 0, stream>>>(static_cast<uint8_t*>(p), sp.bytes(), seed++, 0); break;
          case Spec::kScales: fill_bytes<<<1024, 256, 0, stream>>>(static_cast<uint8_t*>(p), sp.bytes(), seed++, 1); break;
          case Spec::kOffs:
            CK(cudaMemcpy(p, sp.offs.data(), sp.offs.size() * 4, cudaMemcpyHostToDevice));
            break;
        }
        CK(cudaGetLastError());
        sets[k].push_back(view(p, sp.dtype, sp.shape));
      }
    }
    CK(cudaStreamSynchronize(stream));
    const double us = time_calls([&](int k) { c.call(sets[k], stream); }, nsets, stream);
    CK(cudaGetLastError());
    for (void* p : allocs) CK(cudaFree(p));
    // The same bytes through a device-to-device copy: n read + n written with n = total / 2.
    const size_t n = static_cast<size_t>(total / 2);
    const int csets = std::max(1, std::min(8, static_cast<int>(std::ceil(kL2Rotate / total))));
    ensure_copy(n * csets);
    const double copy_us = time_calls(
        [&](int k) { CK(cudaMemcpyAsync(copy_dst + k * n, copy_src + k * n, n, cudaMemcpyDeviceToDevice, stream)); },
        csets, stream);
    Row r{c.kernel, c.shape, us, total / us / 1e3, copy_us, copy_us / us, total};
    rows.push_back(r);
    std::printf("%-22s %-26s %10.1f %9.0f %10.1f %7.3f\n", r.kernel.c_str(), r.shape.c_str(), r.us, r.gbps, r.copy_us,
                r.ratio);
    std::fflush(stdout);
  }
};

std::string shp(std::initializer_list<int64_t> d) {
  std::string s;
  for (auto v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

std::vector<int32_t> equal_groups(int64_t M, int G) {
  std::vector<int32_t> o;
  for (int g = 1; g <= G; ++g) o.push_back(static_cast<int32_t>(M * g / G));
  return o;
}

// Random group sizes, a few empty, most not multiples of 32, covering all M rows.
std::vector<int32_t> jagged_groups(int64_t M, int G, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> cuts;
  for (int g = 0; g < G - 1; ++g) cuts.push_back(static_cast<int32_t>(rng() % (M + 1)));
  cuts[0] = cuts[1];  // an empty group
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(static_cast<int32_t>(M));
  return cuts;
}

Spec out(std::vector<int64_t> s, mxmoe_dtype d = MXMOE_DTYPE_E4M3) { return {std::move(s), d, Spec::kOut, {}}; }
Spec in_bf16(std::vector<int64_t> s) { return {std::move(s), MXMOE_DTYPE_BF16, Spec::kBf16, {}}; }
Spec in_bf16_normal(std::vector<int64_t> s) { return {std::move(s), MXMOE_DTYPE_BF16, Spec::kBf16Normal, {}}; }
Spec in_offs(std::vector<int32_t> o) {
  const int64_t g = static_cast<int64_t>(o.size());
  return {{g}, MXMOE_DTYPE_I32, Spec::kOffs, std::move(o)};
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- the cases ---------------------------------------------------------------------------------------------
// t[0] = x; offs (when any) at t[1]; outputs follow.
void quantize_cases(Runner& R, const std::string& tag, int64_t M, int64_t K, int G, bool jagged, bool full) {
  const std::vector<int32_t> offs = jagged ? jagged_groups(M, G, static_cast<uint32_t>(M + G)) : equal_groups(M, G);
  const std::string s = tag + shp({M, K}) + (G ? "/G" + std::to_string(G) : "");
  const int64_t cap = cdiv(M, 32) + G;
  const mxmoe_scale_mode mode = MXMOE_SCALE_RCEIL;
  if (!jagged) {
    for (int bc : {32, 128}) {
      if (bc == 128 && !full) continue;
      R.run({"quant_1x" + std::to_string(bc), s, {in_bf16({M, K}), out({M, K}), out({M, K / 32}, MXMOE_DTYPE_E8M0)},
             [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
               MK(mxmoe_quantize(&t[0], nullptr, {1, bc, mode}, &t[1], nullptr, &t[2], nullptr, st));
             }});
    }
  }
  R.run({"quant_32x1_t", s, {in_bf16({M, K}), in_offs(offs), out({K, M}), out({K, cap}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           MK(mxmoe_quantize(&t[0], &t[1], {32, 1, mode}, nullptr, &t[2], nullptr, &t[3], st));
         }});
  // Rowwise (q, scale_c) + columnwise per group (qt, scale_r) from one read.
  R.run({"fused_1x32+32x1", s,
         {in_bf16({M, K}), in_offs(offs), out({M, K}), out({M, K / 32}, MXMOE_DTYPE_E8M0), out({K, M}),
          out({K, cap}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{&t[2], nullptr, &t[3], nullptr, nullptr, nullptr};
           mxmoe_fused_side col{nullptr, &t[4], &t[5], nullptr, nullptr, nullptr};
           MK(mxmoe_quantize_fused(&t[0], &t[1], {32, 32, 0, mode}, &row, &col, st));
         }});
  // Exact recipe on Hopper: both round trips (rowwise dq for fwd/dgrad, columnwise dqt for wgrad).
  R.run({"fused_rt_1x32+32x1t", s, {in_bf16({M, K}), in_offs(offs), out({M, K}, MXMOE_DTYPE_BF16), out({K, M}, MXMOE_DTYPE_BF16)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{nullptr, nullptr, nullptr, nullptr, &t[2], nullptr};
           mxmoe_fused_side col{nullptr, nullptr, nullptr, nullptr, nullptr, &t[3]};
           MK(mxmoe_quantize_fused(&t[0], &t[1], {32, 32, 0, mode}, &row, &col, st));
         }});
  // The sm90 backend's exact-recipe passes (python/mxmoe/backends/sm90.py), outputs in x's orientation:
  // A: rowwise round trip (forward operand) + columnwise codes/scales per group (saved for wgrad);
  // dY: rowwise round trip (dgrad) + columnwise round trip per group (wgrad).
  R.run({"fused_rt_1x32+q_32x1", s,
         {in_bf16({M, K}), in_offs(offs), out({M, K}, MXMOE_DTYPE_BF16), out({M, K}), out({K, cap}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{nullptr, nullptr, nullptr, nullptr, &t[2], nullptr};
           mxmoe_fused_side col{&t[3], nullptr, &t[4], nullptr, nullptr, nullptr};
           MK(mxmoe_quantize_fused(&t[0], &t[1], {32, 32, 0, mode}, &row, &col, st));
         }});
  R.run({"fused_rt_1x32+rt_32x1", s,
         {in_bf16({M, K}), in_offs(offs), out({M, K}, MXMOE_DTYPE_BF16), out({M, K}, MXMOE_DTYPE_BF16)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{nullptr, nullptr, nullptr, nullptr, &t[2], nullptr};
           mxmoe_fused_side col{nullptr, nullptr, nullptr, nullptr, &t[3], nullptr};
           MK(mxmoe_quantize_fused(&t[0], &t[1], {32, 32, 0, mode}, &row, &col, st));
         }});
  // The exact recipe's backward: A's saved codes along M per group back to bf16.
  R.run({"dequant_32x1", s,
         {{{M, K}, MXMOE_DTYPE_E4M3, Spec::kCodes, {}}, {{K, cap}, MXMOE_DTYPE_E8M0, Spec::kScales, {}}, in_offs(offs),
          out({M, K}, MXMOE_DTYPE_BF16)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           MK(mxmoe_dequantize(&t[0], &t[1], 0, &t[2], &t[3], st));
         }});
  if (jagged || !full) return;
  R.run({"fused_rt_1x32", s, {in_bf16({M, K}), out({M, K}, MXMOE_DTYPE_BF16)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{nullptr, nullptr, nullptr, nullptr, &t[1], nullptr};
           MK(mxmoe_quantize_fused(&t[0], nullptr, {32, 0, 0, mode}, &row, nullptr, st));
         }});
  R.run({"fused_rt_32x1t", s, {in_bf16({M, K}), in_offs(offs), out({K, M}, MXMOE_DTYPE_BF16)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side col{nullptr, nullptr, nullptr, nullptr, nullptr, &t[2]};
           MK(mxmoe_quantize_fused(&t[0], &t[1], {0, 32, 0, mode}, nullptr, &col, st));
         }});
  const int64_t bsz = mxmoe_blocked_size(MXMOE_BLOCKED_GROUPS_M, M, K / 32, G);
  R.run({"fused_1x32_blockedM", s, {in_bf16({M, K}), in_offs(offs), out({M, K}), out({bsz}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{&t[2], nullptr, nullptr, &t[3], nullptr, nullptr};
           MK(mxmoe_quantize_fused(&t[0], &t[1], {32, 0, 0, mode}, &row, nullptr, st));
         }});
  R.run({"dequant_1x32", s,
         {{{M, K}, MXMOE_DTYPE_E4M3, Spec::kCodes, {}}, {{M, K / 32}, MXMOE_DTYPE_E8M0, Spec::kScales, {}},
          out({M, K}, MXMOE_DTYPE_BF16)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           MK(mxmoe_dequantize(&t[0], &t[1], 1, nullptr, &t[2], st));
         }});
  const int64_t wsz = mxmoe_blocked_size(MXMOE_BLOCKED_WHOLE, M, K / 32, 0);
  R.run({"to_blocked", s, {{{M, K / 32}, MXMOE_DTYPE_E8M0, Spec::kScales, {}}, out({wsz}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           MK(mxmoe_scales_to_blocked(&t[0], MXMOE_BLOCKED_WHOLE, nullptr, &t[1], st));
         }});
  R.run({"from_blocked", s, {{{wsz}, MXMOE_DTYPE_E8M0, Spec::kScales, {}}, out({M, K / 32}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           MK(mxmoe_scales_from_blocked(&t[0], MXMOE_BLOCKED_WHOLE, nullptr, &t[1], st));
         }});
}

// The tile128 recipe's activation pass (cuda/quantize/tile128_bf16.cu): rowwise 1x128 (q, scale_c) and
// columnwise 128x1 per group (qt, scale_r) from one read. align16: group starts rounded to multiples of
// 16, the fused MoE layer's layout (moe.py align_routing); otherwise jagged at any row.
void tile128_cases(Runner& R, const std::string& tag, int64_t M, int64_t K, int G, bool jagged, bool align16) {
  std::vector<int32_t> offs = jagged ? jagged_groups(M, G, static_cast<uint32_t>(M + G + K)) : equal_groups(M, G);
  if (align16)
    for (auto& o : offs) o = static_cast<int32_t>(std::min<int64_t>(M, (o + 15) / 16 * 16));
  const std::string s = tag + shp({M, K}) + "/G" + std::to_string(G) + (align16 ? "a16" : "");
  const int64_t cap = cdiv(M, 32) + G;
  R.run({"fused_1x128+128x1", s,
         {in_bf16({M, K}), in_offs(offs), out({M, K}), out({M, K / 32}, MXMOE_DTYPE_E8M0), out({K, M}),
          out({K, cap}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{&t[2], nullptr, &t[3], nullptr, nullptr, nullptr};
           mxmoe_fused_side col{nullptr, &t[4], &t[5], nullptr, nullptr, nullptr};
           MK(mxmoe_quantize_fused(&t[0], &t[1], {128, 128, 0, MXMOE_SCALE_RCEIL}, &row, &col, st));
         }});
}

// The fused MoE layer's computed inputs through the tile128 activation pass (quantize_fused_source):
// the dispatch gather (with / without the routing weights), SwiGLU, SwiGLU backward, at a Qwen3-style
// shape (M = 16K tokens x top-8 rows, 64 experts, 16-aligned groups, ~3% padding rows). Bytes: the
// gathered rows are read once each (an unused input tensor makes up the difference to a's size).
void source_cases(Runner& R, int64_t M, int64_t H, int64_t I, int G) {
  const int64_t k = 8, T = M / k, cap = cdiv(M, 32) + G;
  std::vector<int32_t> offs = jagged_groups(M, G, static_cast<uint32_t>(M + G));
  for (auto& o : offs) o = static_cast<int32_t>(std::min<int64_t>(M, (o + 15) / 16 * 16));
  std::vector<int32_t> perm(static_cast<size_t>(M));
  std::mt19937 rng(7);
  for (int64_t r = 0; r < M; ++r) perm[r] = rng() % 32 == 0 ? -1 : static_cast<int32_t>(rng() % (T * k));
  std::vector<int32_t> rs(static_cast<size_t>(T * k));
  for (auto& v : rs) {
    const float f = 0.125f + static_cast<float>(rng() % 1000) / 1000.0f;
    std::memcpy(&v, &f, 4);
  }
  const std::string s = "moe " + shp({M, H}) + "/G" + std::to_string(G) + "a16";
  const mxmoe_fused_config cfg{128, 128, 0, MXMOE_SCALE_RCEIL};
  auto sides = [](std::vector<mxmoe_tensor>& t, int o, mxmoe_fused_side& row, mxmoe_fused_side& col) {
    row = mxmoe_fused_side{&t[o], nullptr, &t[o + 1], nullptr, nullptr, nullptr};
    col = mxmoe_fused_side{nullptr, &t[o + 2], &t[o + 3], nullptr, nullptr, nullptr};
  };
  for (int scaled = 0; scaled < 2; ++scaled) {
    std::vector<Spec> ts = {in_bf16({T, H}), in_offs(offs), {{M}, MXMOE_DTYPE_I32, Spec::kOffs, perm},
                            {{T * k}, MXMOE_DTYPE_F32, Spec::kOffs, rs}, in_bf16({M - T, H}),
                            out({M, H}), out({M, H / 32}, MXMOE_DTYPE_E8M0), out({H, M}), out({H, cap}, MXMOE_DTYPE_E8M0)};
    R.run({scaled ? "src_gather_rs_1x128+128x1" : "src_gather_1x128+128x1", s, ts,
           [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
             mxmoe_tensor rsv = t[3];
             rsv.ndim = 2;
             rsv.shape[0] = T;
             rsv.shape[1] = k;
             rsv.strides[0] = k;
             rsv.strides[1] = 1;
             mxmoe_fused_source src{MXMOE_SOURCE_GATHER, &t[0], nullptr, &t[2], scaled ? &rsv : nullptr, k, 0, 1.f, 0.f, 0.f};
             mxmoe_fused_side row, col;
             sides(t, 5, row, col);
             MK(mxmoe_quantize_fused_source(&src, &t[1], cfg, &row, &col, st));
           }});
  }
  // Both SwiGLU sources on the wide-exponent data of every row, and on pre-activation-like data
  // (normal, sigma 3: the inputs a layer gives them; shape tag "N(0,3)").
  for (int normal = 0; normal < 2; ++normal) {
    auto in = [&](std::vector<int64_t> sh) { return normal ? in_bf16_normal(std::move(sh)) : in_bf16(std::move(sh)); };
    const std::string tag = normal ? " N(0,3)" : "";
    const std::string si = "moe " + shp({M, I}) + "/G" + std::to_string(G) + "a16" + tag;
    R.run({"src_swiglu_1x128+128x1", si,
           {in({M, 2 * I}), in_offs(offs), out({M, I}), out({M, I / 32}, MXMOE_DTYPE_E8M0), out({I, M}),
            out({I, cap}, MXMOE_DTYPE_E8M0)},
           [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
             mxmoe_fused_source src{MXMOE_SOURCE_SWIGLU, &t[0], nullptr, nullptr, nullptr, 1, 0, 1.f, INFINITY, 0.f};
             mxmoe_fused_side row, col;
             sides(t, 2, row, col);
             MK(mxmoe_quantize_fused_source(&src, &t[1], cfg, &row, &col, st));
           }});
    const std::string sb = "moe " + shp({M, 2 * I}) + "/G" + std::to_string(G) + "a16" + tag;
    R.run({"src_swiglu_bwd_1x128+128x1", sb,
           {in({M, 2 * I}), in({M, I}), in_offs(offs), out({M, 2 * I}), out({M, 2 * I / 32}, MXMOE_DTYPE_E8M0),
            out({2 * I, M}), out({2 * I, cap}, MXMOE_DTYPE_E8M0)},
           [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
             mxmoe_fused_source src{MXMOE_SOURCE_SWIGLU_BACKWARD, &t[0], &t[1], nullptr, nullptr, 1, 0, 1.f, INFINITY, 0.f};
             mxmoe_fused_side row, col;
             sides(t, 3, row, col);
             MK(mxmoe_quantize_fused_source(&src, &t[2], cfg, &row, &col, st));
           }});
  }
}

// The weight cache's request (fused_w_128x128 below) at the MoE configs' expert weights (BENCH.md):
// the weights' pass of every tile128 step when weights are written every step.
void model_weight_case(Runner& R, const char* model, int64_t G, int64_t N, int64_t K) {
  R.run({"fused_w_128x128", std::string(model) + " " + shp({G, N, K}),
         {in_bf16({G, N, K}), out({G, N, K}), out({G, K, N}), out({G, N, K / 32}, MXMOE_DTYPE_E8M0),
          out({G, K, N / 32}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{&t[1], nullptr, &t[3], nullptr, nullptr, nullptr};
           mxmoe_fused_side col{nullptr, &t[2], &t[4], nullptr, nullptr, nullptr};
           MK(mxmoe_quantize_fused(&t[0], nullptr, {128, 128, 1, MXMOE_SCALE_RCEIL}, &row, &col, st));
         }});
}

void weight_cases(Runner& R, int64_t G, int64_t N, int64_t K) {
  const std::string s = "W " + shp({G, N, K});
  const mxmoe_scale_mode mode = MXMOE_SCALE_RCEIL;
  // tile128 recipe: one 128x128 quantization serving forward (q, scale_c) and dgrad (qt, scale_r).
  R.run({"quant_128x128", s,
         {in_bf16({G, N, K}), out({G, N, K}), out({G, K, N}), out({G, N, K / 32}, MXMOE_DTYPE_E8M0),
          out({G, K, N / 32}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           MK(mxmoe_quantize(&t[0], nullptr, {128, 128, mode}, &t[1], &t[2], &t[3], &t[4], st));
         }});
  // The same through quantize_fused, as the sm90 backend's weight op asks for it (row q + scale,
  // col qt + scale).
  R.run({"fused_w_128x128", s,
         {in_bf16({G, N, K}), out({G, N, K}), out({G, K, N}), out({G, N, K / 32}, MXMOE_DTYPE_E8M0),
          out({G, K, N / 32}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{&t[1], nullptr, &t[3], nullptr, nullptr, nullptr};
           mxmoe_fused_side col{nullptr, &t[2], &t[4], nullptr, nullptr, nullptr};
           MK(mxmoe_quantize_fused(&t[0], nullptr, {128, 128, 1, mode}, &row, &col, st));
         }});
  R.run({"quant_1x32", s, {in_bf16({G, N, K}), out({G, N, K}), out({G, N, K / 32}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           MK(mxmoe_quantize(&t[0], nullptr, {1, 32, mode}, &t[1], nullptr, &t[2], nullptr, st));
         }});
  // Exact recipe: W rounded along K (forward) and along N (dgrad), both in W's orientation.
  R.run({"fused_rt_1x32+32x1", s, {in_bf16({G, N, K}), out({G, N, K}, MXMOE_DTYPE_BF16), out({G, N, K}, MXMOE_DTYPE_BF16)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{nullptr, nullptr, nullptr, nullptr, &t[1], nullptr};
           mxmoe_fused_side col{nullptr, nullptr, nullptr, nullptr, &t[2], nullptr};
           MK(mxmoe_quantize_fused(&t[0], nullptr, {32, 32, 0, mode}, &row, &col, st));
         }});
  // The exact recipe's backward: W's saved codes along N back to bf16.
  R.run({"dequant_32x1", s,
         {{{G, N, K}, MXMOE_DTYPE_E4M3, Spec::kCodes, {}}, {{G, K, N / 32}, MXMOE_DTYPE_E8M0, Spec::kScales, {}},
          out({G, N, K}, MXMOE_DTYPE_BF16)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           MK(mxmoe_dequantize(&t[0], &t[1], 0, nullptr, &t[2], st));
         }});
  // The sm90 backend's exact-recipe W pass: round trip along K (forward) + codes/scales along N (saved for dgrad).
  R.run({"fused_rt_1x32+q_32x1", s,
         {in_bf16({G, N, K}), out({G, N, K}, MXMOE_DTYPE_BF16), out({G, N, K}), out({G, K, N / 32}, MXMOE_DTYPE_E8M0)},
         [=](std::vector<mxmoe_tensor>& t, cudaStream_t st) {
           mxmoe_fused_side row{nullptr, nullptr, nullptr, nullptr, &t[1], nullptr};
           mxmoe_fused_side col{&t[2], nullptr, &t[3], nullptr, nullptr, nullptr};
           MK(mxmoe_quantize_fused(&t[0], nullptr, {32, 32, 0, mode}, &row, &col, st));
         }});
}

std::string json_escape(const std::string& s) {
  std::string r;
  for (char c : s) r += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  Runner R;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--quick") quick = true;
    else if (a == "--filter" && i + 1 < argc) R.filter = argv[++i];
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  CK(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
  const char* commit_env = std::getenv("MXMOE_COMMIT");
  const std::string commit = commit_env ? commit_env : "unknown";
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  std::printf("device %s, %d SMs, L2 %d MB, commit %s, %s\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, commit.c_str(), date);

  {  // Hardware conversion == integer codec, all 2^32 inputs.
    unsigned long long* bad;
    unsigned* first;
    CK(cudaMalloc(&bad, 8));
    CK(cudaMalloc(&first, 4));
    CK(cudaMemset(bad, 0, 8));
    CK(cudaMemset(first, 0xFF, 4));
    cvt_check_kernel<<<prop.multiProcessorCount * 8, 256>>>(bad, first);
    CK(cudaGetLastError());
    unsigned long long hb = 0;
    unsigned hf = 0;
    CK(cudaMemcpy(&hb, bad, 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hf, first, 4, cudaMemcpyDeviceToHost));
    std::printf("hardware e4m3 / bf16 conversions vs integer codecs, all 2^32 fp32 inputs + 254 decodes: %llu mismatches (first 0x%08x)\n",
                hb, hb ? hf : 0u);
    CK(cudaFree(bad));
    CK(cudaFree(first));
  }

  std::printf("%-22s %-26s %10s %9s %10s %7s\n", "kernel", "shape", "us", "GB/s", "copy_us", "copy_x");
  // Activations A (M, K) and output grads dY (M, N): the BENCH.md shapes; groups of 8 (equal).
  for (int64_t M : {16640, 128000})
    for (int64_t K : {5120, 7168}) quantize_cases(R, "A ", M, K, 8, false, true);
  if (!quick) {
    for (int64_t M : {16640, 128000})
      for (int64_t N : {8192, 2048}) quantize_cases(R, "dY ", M, N, 8, false, false);
    for (int64_t G : {1, 8, 64}) weight_cases(R, G, 8192, 5120);
    weight_cases(R, 8, 2048, 7168);
    for (int64_t N : {4096, 2048})
      for (int G : {8, 32}) quantize_cases(R, "jag ", 16384, N, G, true, false);
  }
  // The tile128 activation pass: BENCH.md A shapes (8 equal groups), jagged groups, and the fine-grained
  // MoE shapes (Qwen3-style: 16K tokens x top-8 over 64 experts, H 1024 / I 768, 16-aligned groups).
  for (int64_t M : {16640, 128000})
    for (int64_t K : {5120, 7168}) tile128_cases(R, "A ", M, K, 8, false, false);
  if (!quick) {
    for (int64_t N : {4096, 2048}) tile128_cases(R, "jag ", 16384, N, 32, true, false);
    for (int64_t K : {1024, 768, 2048}) {
      tile128_cases(R, "moe ", 131072, K, 64, true, true);
      tile128_cases(R, "moe ", 131072, K, 64, true, false);
    }
    source_cases(R, 131072, 1024, 768, 64);
    weight_cases(R, 64, 1536, 1024);  // Qwen3-style fine-grained experts: gate_up (2I x H)
    weight_cases(R, 64, 1024, 768);   // down (H x I)
  }
  // The MoE configs' weights (gate_up 2I x H, down H x I per expert).
  model_weight_case(R, "qwen3-w13", 128, 1536, 2048);
  model_weight_case(R, "qwen3-w2", 128, 2048, 768);
  model_weight_case(R, "scout-w13", 16, 16384, 5120);
  model_weight_case(R, "scout-w2", 16, 5120, 8192);
  model_weight_case(R, "gptoss-w13", 128, 5760, 2880);
  model_weight_case(R, "gptoss-w2", 128, 2880, 2880);

  double worst = 1e9;
  std::string worst_name;
  for (auto& r : R.rows)
    if (r.ratio < worst) {
      worst = r.ratio;
      worst_name = r.kernel + " " + r.shape;
    }
  std::printf("rows %zu, lowest copy ratio %.3f (%s)\n", R.rows.size(), worst, worst_name.c_str());
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) {
      std::perror(json_path.c_str());
      return 1;
    }
    std::fprintf(f, "[\n");
    for (size_t i = 0; i < R.rows.size(); ++i) {
      const Row& r = R.rows[i];
      std::fprintf(f,
                   "  {\"kernel\": \"%s\", \"shape\": \"%s\", \"us\": %.2f, \"gbps\": %.1f, \"copy_us\": %.2f, "
                   "\"copy_ratio\": %.4f, \"bytes\": %.0f, \"date\": \"%s\", \"commit\": \"%s\", \"device\": \"%s\"}%s\n",
                   json_escape(r.kernel).c_str(), json_escape(r.shape).c_str(), r.us, r.gbps, r.copy_us, r.ratio,
                   r.bytes, date, json_escape(commit).c_str(), json_escape(prop.name).c_str(),
                   i + 1 < R.rows.size() ? "," : "");
    }
    std::fprintf(f, "]\n");
    std::fclose(f);
  }
  return 0;
}
